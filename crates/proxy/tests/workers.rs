//! Several workers: one `SO_REUSEPORT` listener each on the same port (port 0 too), the
//! kernel spreading connections over them, per-worker counters summed at scrape time, a
//! bind that stays exclusive without `reuse_port`, and the successor hand-over and drain
//! across every worker's listener. Port 0, each test bounded by a timeout.

use farside_proxy::config::{BackendConfig, ProxyConfig};
use farside_proxy::gate::{Gate, InflightGuard, Reject, Route};
use farside_proxy::lifecycle::DrainOutcome;
use farside_proxy::server::{self, Running};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every test finishes well within this, or fails.
const TEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Client connections a spread test opens: the chance that the kernel's hash puts all
/// of them on one of two listeners is 2^-(N-1).
const CONNS: usize = 32;

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("test timed out")
}

/// Every request to the one back-end.
struct One(SocketAddr, Arc<AtomicU64>);

impl Gate for One {
    fn on_accept(&self, _peer: SocketAddr) -> Result<(), Reject> {
        Ok(())
    }
    fn route(&self, _host: Option<&str>) -> Result<Route, Reject> {
        Ok(Route {
            backend: 0,
            addr: self.0,
            guard: InflightGuard::new(self.1.clone()),
            reuse_only: false,
        })
    }
}

/// A keep-alive back-end on its own threads (independent of the runtimes under test):
/// answers every request head with `200 ok`.
fn upstream() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..i + 4);
                        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if s.write_all(r).is_err() {
                            return;
                        }
                    }
                    match s.read(&mut chunk) {
                        Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                }
            });
        }
    });
    addr
}

fn config(listen: SocketAddr, up: SocketAddr, workers: usize, reuse_port: bool) -> ProxyConfig {
    let mut cfg = ProxyConfig::simple(
        listen,
        vec![BackendConfig {
            addr: up,
            site: String::new(),
            region: None,
            limit: None,
            maxconn: None,
        }],
    );
    cfg.workers = workers;
    cfg.reuse_port = reuse_port;
    cfg
}

async fn start(cfg: ProxyConfig, up: SocketAddr) -> Running {
    server::start(cfg, Arc::new(One(up, Arc::default())))
        .await
        .expect("proxy starts")
}

/// One keep-alive exchange on `c`: the status, or `None` if the connection closed.
async fn get(c: &mut TcpStream) -> Option<u16> {
    c.write_all(b"GET /f HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= i + 4 + len {
                return head.get(9..12)?.parse().ok();
            }
        }
        match c.read(&mut chunk).await {
            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

/// `CONNS` connections to `addr`, each after one answered request, kept open.
async fn open_conns(addr: SocketAddr) -> Vec<TcpStream> {
    let mut conns = Vec::new();
    for _ in 0..CONNS {
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert_eq!(get(&mut c).await, Some(200));
        conns.push(c);
    }
    conns
}

fn scrape(p: &Running) -> String {
    farside_admin::scrape_text(&|e: &mut farside_admin::Encoder| p.metrics.render(e))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_the_port_and_each_serves_its_share() {
    within(async {
        let up = upstream();
        let p = start(config("127.0.0.1:0".parse().unwrap(), up, 2, false), up).await;
        assert_ne!(p.addr.port(), 0, "port 0 resolved once for both listeners");
        let mut conns = open_conns(p.addr).await;
        // A second request on each: the pooled upstream connections move between workers.
        for c in &mut conns {
            assert_eq!(get(c).await, Some(200));
        }
        let m = &p.metrics;
        assert_eq!(m.workers(), 2);
        let (w0, w1) = (m.worker(0), m.worker(1));
        let accepted = |s: &farside_proxy::metrics::Shard| {
            s.conns_accepted.load(std::sync::atomic::Ordering::Relaxed)
        };
        assert_eq!(accepted(w0) + accepted(w1), CONNS as u64);
        assert!(
            accepted(w0) > 0 && accepted(w1) > 0,
            "the kernel spreads connections over both listeners: {} / {}",
            accepted(w0),
            accepted(w1)
        );
        // A response is counted after its last byte is written, so the client can read it
        // a moment before the count moves: await it (bounded) rather than race it.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while w0.responses() + w1.responses() < 2 * CONNS as u64
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(w0.responses() + w1.responses(), 2 * CONNS as u64);
        assert_eq!(m.total(|s| &s.conns_active), CONNS as u64);
        let text = scrape(&p);
        let n = 2 * CONNS;
        assert!(
            text.contains(&format!(
                "farside_proxy_responses_total{{class=\"2xx\"}} {n}\n"
            )),
            "totals sum the workers:\n{text}"
        );
        for w in 0..2 {
            let line = format!(
                "farside_proxy_worker_requests_total{{worker=\"{w}\"}} {}\n",
                m.worker(w).responses()
            );
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        drop(conns);
        p.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reuse_port_a_second_proxy_cannot_take_a_multi_worker_port() {
    within(async {
        let up = upstream();
        let p = start(config("127.0.0.1:0".parse().unwrap(), up, 2, false), up).await;
        for workers in [1, 2] {
            let second = server::start(
                config(p.addr, up, workers, false),
                Arc::new(One(up, Arc::default())),
            )
            .await;
            let e = second.err().expect("the port is taken");
            assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        }
        // The first still serves on both listeners.
        let conns = open_conns(p.addr).await;
        assert_eq!(p.metrics.total(|s| &s.conns_accepted), CONNS as u64);
        drop(conns);
        p.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_takes_over_while_every_worker_of_the_old_proxy_drains() {
    within(async {
        let up = upstream();
        let old = start(config("127.0.0.1:0".parse().unwrap(), up, 2, true), up).await;
        let new = start(config(old.addr, up, 2, true), up).await;
        assert_eq!(new.addr, old.addr);
        // Idle keep-alive connections spread over the four listeners of both proxies.
        let mut conns = open_conns(old.addr).await;
        let on_old = old.metrics.total(|s| &s.conns_accepted);
        assert!(on_old > 0, "the old proxy got some connections");
        let old_m = old.metrics.clone();
        // The drain closes both of the old proxy's listeners and its idle connections on
        // both workers, then ends.
        let outcome = old.drain(std::future::pending()).await;
        assert_eq!(outcome, DrainOutcome::Drained);
        let mut closed = 0;
        for c in &mut conns {
            match get(c).await {
                None => closed += 1,
                Some(s) => assert_eq!(s, 200),
            }
        }
        assert_eq!(closed, on_old, "exactly the old proxy's connections closed");
        // Every new connection reaches the successor.
        let fresh = open_conns(new.addr).await;
        assert_eq!(old_m.total(|s| &s.conns_accepted), on_old);
        assert_eq!(
            new.metrics.total(|s| &s.conns_accepted),
            2 * CONNS as u64 - on_old
        );
        drop((conns, fresh));
        new.stop().await;
    })
    .await
}

#[test]
fn spawned_proxy_with_workers_serves_and_stops() {
    let up = upstream();
    let p = server::spawn(
        config("127.0.0.1:0".parse().unwrap(), up, 3, false),
        Arc::new(One(up, Arc::default())),
    )
    .unwrap();
    for _ in 0..CONNS {
        let mut c = std::net::TcpStream::connect(p.addr).unwrap();
        c.set_read_timeout(Some(TEST_TIMEOUT)).unwrap();
        c.write_all(b"GET /f HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut r = String::new();
        c.read_to_string(&mut r).unwrap();
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
    assert_eq!(p.metrics.workers(), 3);
    assert_eq!(p.metrics.total(|s| &s.conns_accepted), CONNS as u64);
    p.stop();
}
