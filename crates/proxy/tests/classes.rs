//! Class-aware admission through the real data path and control layer: requests are
//! classified by their target's path, a lower-priority class is shed first as the
//! back-end's budget fills, the default class still gets through, and the decisions show
//! in the proxy's metrics.

use farside_proxy::config::{classes::parse_class, BackendConfig, Metric, ProxyConfig};
use farside_proxy::control::Control;
use farside_proxy::server;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Longest the test waits for a condition (a busy CI host, not a measured bound).
const WAIT: Duration = Duration::from_secs(10);

/// A back-end answering `/cgi/...` only once `release` gives a permit (counting the
/// requests it holds in `held`), everything else at once.
async fn backend() -> (SocketAddr, Arc<AtomicUsize>, Arc<Semaphore>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let held = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(Semaphore::new(0));
    let (h, r) = (held.clone(), release.clone());
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let (h, r) = (h.clone(), r.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    }
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let costly = buf.starts_with(b"GET /cgi/");
                        buf.drain(..end + 4);
                        if costly {
                            h.fetch_add(1, SeqCst);
                            r.acquire().await.unwrap().forget();
                        }
                        let resp = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if s.write_all(resp).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, held, release)
}

/// One request for `path` on a new connection: status and the whole answer.
async fn get(proxy: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    (status, out)
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Metric `inflight`, limit 3 (reserve 1), class `costly` of priority 1: two costly
/// requests in flight fill the lower classes' share (3 − 1); a third costly one is
/// refused (503) while a default-class request is served; released, the costly ones
/// complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_priority_class_is_shed_first_through_the_data_path() {
    let (be, held, release) = backend().await;
    let mut cfg = ProxyConfig::simple(
        "127.0.0.1:0".parse().unwrap(),
        vec![BackendConfig {
            addr: be,
            site: String::new(),
            region: None,
            limit: None,
            maxconn: None,
        }],
    );
    cfg.admission.enabled = true;
    cfg.admission.metric = Metric::Inflight;
    cfg.admission.limit = Some(3);
    cfg.classes = vec![parse_class("costly,prefix=/cgi/,priority=1").unwrap()];
    // The counters are read from the data port below (off by default there).
    cfg.data_port_metrics = true;
    cfg.validate().unwrap();
    let ctl = Control::new(&cfg).unwrap();
    let p = server::start(cfg, Arc::new(ctl)).await.unwrap();
    let addr = p.addr;
    let first = tokio::spawn(get(addr, "/cgi/work?us=1"));
    until("the first costly request at the back-end", || {
        held.load(SeqCst) == 1
    })
    .await;
    let second = tokio::spawn(get(addr, "/cgi/work?us=2"));
    until("the second costly request at the back-end", || {
        held.load(SeqCst) == 2
    })
    .await;
    let (status, body) = get(addr, "/cgi/work?us=3").await;
    assert_eq!(status, 503, "the lower class is shed first: {body}");
    let (status, body) = get(addr, "/index.html").await;
    assert_eq!(status, 200, "the default class keeps the reserve: {body}");
    release.add_permits(2);
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(second.await.unwrap().0, 200);
    let (_, metrics) = get(addr, "/farside/metrics").await;
    for want in [
        "farside_class_admitted_total{class=\"costly\"} 2",
        "farside_class_rejected_total{class=\"costly\"} 1",
        "farside_class_admitted_total{class=\"default\"} 1",
        "farside_class_checks_total{verdict=\"reserved\"} 1",
    ] {
        assert!(metrics.contains(want), "{want} in {metrics}");
    }
    p.stop().await;
}
