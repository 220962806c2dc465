//! The per-back-end connection cap (`maxconn`) and the proxy-side wait queue, through the
//! real data path and control layer: a request finding the cap reached waits for a
//! connection to come back (and reuses it), or gets `503 queue_timeout` after
//! `http.queue_timeout_ms`.

use farside_proxy::config::{BackendConfig, ProxyConfig};
use farside_proxy::control::Control;
use farside_proxy::server;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Service time of the test back-end: long enough that two requests overlap.
const SERVICE: Duration = Duration::from_millis(200);

/// A keep-alive back-end answering every request after [`SERVICE`]; counts connections.
async fn backend() -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (accepted, open_max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let open = Arc::new(AtomicUsize::new(0));
    let (a, m) = (accepted.clone(), open_max.clone());
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            a.fetch_add(1, SeqCst);
            let n = open.fetch_add(1, SeqCst) + 1;
            m.fetch_max(n, SeqCst);
            let open = open.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    }
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        tokio::time::sleep(SERVICE).await;
                        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if s.write_all(r).await.is_err() {
                            break;
                        }
                    }
                }
                open.fetch_sub(1, SeqCst);
            });
        }
    });
    (addr, accepted, open_max)
}

async fn get(proxy: SocketAddr) -> (u16, String) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    (status, out)
}

async fn proxy(backend: SocketAddr, queue_timeout_ms: u64) -> server::Running {
    let mut cfg = ProxyConfig::simple(
        "127.0.0.1:0".parse().unwrap(),
        vec![BackendConfig {
            addr: backend,
            site: String::new(),
            region: None,
            limit: None,
            maxconn: Some(1),
        }],
    );
    cfg.http.queue_timeout_ms = queue_timeout_ms;
    let ctl = Control::new(&cfg).unwrap();
    server::start(cfg, Arc::new(ctl)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_at_the_cap_waits_for_the_connection_and_reuses_it() {
    let (be, accepted, open_max) = backend().await;
    let p = proxy(be, 5_000).await;
    let (a, b) = tokio::join!(get(p.addr), get(p.addr));
    assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");
    assert_eq!(open_max.load(SeqCst), 1, "never more than maxconn open");
    assert_eq!(
        accepted.load(SeqCst),
        1,
        "the waiter reused the returned connection"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_longer_than_the_queue_timeout_gets_503() {
    let (be, _accepted, open_max) = backend().await;
    let p = proxy(be, 50).await;
    let (a, b) = tokio::join!(get(p.addr), get(p.addr));
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(statuses, [200, 503], "{a:?} {b:?}");
    let refused = if a.0 == 503 { &a.1 } else { &b.1 };
    assert!(refused.contains("queue_timeout"), "{refused}");
    assert!(refused.contains("Retry-After:"), "{refused}");
    assert_eq!(open_max.load(SeqCst), 1);
    assert_eq!(
        p.metrics
            .rejects_for(farside_proxy::gate::Reject::QueueTimeout),
        1
    );
    // Both asked for an upstream connection; the refused one waited the whole timeout,
    // and the wait is exported.
    assert_eq!(p.metrics.total(|s| &s.upstream_checkouts), 2);
    assert!(p.metrics.total(|s| &s.upstream_wait_us) >= 50_000);
    let text = farside_admin::scrape_text(&|e: &mut farside_admin::Encoder| p.metrics.render(e));
    assert!(
        text.contains("farside_proxy_upstream_checkouts_total 2"),
        "{text}"
    );
    p.stop().await;
}
