//! Behaviour of the HTTP data path against in-test back-ends, on port 0, each test
//! bounded by a timeout so that a hang is a failure, not a stuck run.

use farside_proxy::config::{BackendConfig, ProxyConfig};
use farside_proxy::gate::{Gate, InflightGuard, Reject, Route};
use farside_proxy::server::{self, Running};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Every test finishes well within this, or fails.
const TEST_TIMEOUT: Duration = Duration::from_secs(10);

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("test timed out")
}

/// Round-robin over fixed addresses, with switches to reject.
struct TestGate {
    addrs: Vec<SocketAddr>,
    next: AtomicUsize,
    inflight: Arc<AtomicU64>,
    reject_accept: AtomicBool,
    reject_route: AtomicBool,
    failures: AtomicU64,
}

impl TestGate {
    fn new(addrs: Vec<SocketAddr>) -> Arc<Self> {
        Arc::new(TestGate {
            addrs,
            next: AtomicUsize::new(0),
            inflight: Arc::new(AtomicU64::new(0)),
            reject_accept: AtomicBool::new(false),
            reject_route: AtomicBool::new(false),
            failures: AtomicU64::new(0),
        })
    }
}

impl Gate for TestGate {
    fn on_accept(&self, _peer: SocketAddr) -> Result<(), Reject> {
        if self.reject_accept.load(SeqCst) {
            return Err(Reject::Overloaded);
        }
        Ok(())
    }

    fn route(&self, _host: Option<&str>) -> Result<Route, Reject> {
        if self.reject_route.load(SeqCst) {
            return Err(Reject::Overloaded);
        }
        let i = self.next.fetch_add(1, SeqCst) % self.addrs.len();
        Ok(Route {
            backend: i,
            addr: self.addrs[i],
            guard: InflightGuard::new(self.inflight.clone()),
            reuse_only: false,
        })
    }

    fn retry_after_s(&self) -> u32 {
        7
    }

    fn report_failure(&self, _backend: usize) {
        self.failures.fetch_add(1, SeqCst);
    }

    fn render_metrics(&self, enc: &mut farside_admin::Encoder) {
        enc.gauge("test_gate_inflight", "Test gate.", &[], 0u64);
    }
}

fn config(backends: &[SocketAddr]) -> ProxyConfig {
    let backends = backends
        .iter()
        .map(|&addr| BackendConfig {
            addr,
            site: String::new(),
            region: None,
            limit: None,
            maxconn: None,
        })
        .collect();
    ProxyConfig::simple("127.0.0.1:0".parse().unwrap(), backends)
}

async fn start(cfg: ProxyConfig, gate: Arc<TestGate>) -> Running {
    server::start(cfg, gate).await.expect("proxy starts")
}

/// What an in-test back-end does with each request.
#[derive(Clone)]
enum Behaviour {
    /// Answer with these bytes and keep the connection.
    Respond(Vec<u8>),
    /// Answer with these bytes, then close without saying so (a stale pooled connection).
    RespondThenClose(Vec<u8>),
    /// Chunked: head and first chunk, wait for the notify, then the rest.
    ChunkedInTwoParts(Arc<Notify>),
    /// Head promising this many bytes, 1000 of them, then a reset.
    ResetMidBody(usize),
    /// Read requests, never answer.
    Silent,
}

/// A tiny back-end: records every request head it receives and how many connections
/// it accepted.
struct Upstream {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    accepted: Arc<AtomicUsize>,
    /// Connections the proxy closed.
    closed: Arc<AtomicUsize>,
}

async fn upstream(behaviour: Behaviour) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let accepted = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicUsize::new(0));
    let (h, a, cl) = (heads.clone(), accepted.clone(), closed.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            a.fetch_add(1, SeqCst);
            let (h, b, cl) = (h.clone(), behaviour.clone(), cl.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let _count_close = CountOnDrop(cl);
                while let Some(head) = read_head(&mut s, &mut buf).await {
                    h.lock().unwrap().push(head);
                    match &b {
                        Behaviour::Respond(r) => {
                            if s.write_all(r).await.is_err() {
                                return;
                            }
                        }
                        Behaviour::RespondThenClose(r) => {
                            let _ = s.write_all(r).await;
                            return;
                        }
                        Behaviour::ChunkedInTwoParts(go) => {
                            let first = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
                            if s.write_all(first).await.is_err() {
                                return;
                            }
                            go.notified().await;
                            let rest = b"6\r\n world\r\n0\r\n\r\n";
                            if s.write_all(rest).await.is_err() {
                                return;
                            }
                        }
                        Behaviour::Silent => {}
                        Behaviour::ResetMidBody(len) => {
                            let mut r = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n")
                                .into_bytes();
                            r.extend_from_slice(&[b'x'; 1000]);
                            let _ = s.write_all(&r).await;
                            // Linger 0: close sends RST.
                            let _ = s.set_zero_linger();
                            return;
                        }
                    }
                }
            });
        }
    });
    Upstream {
        addr,
        heads,
        accepted,
        closed,
    }
}

struct CountOnDrop(Arc<AtomicUsize>);

impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Wait (within the test's timeout) until `cond` holds.
async fn until(cond: impl Fn() -> bool) {
    while !cond() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Read one head (requests in tests carry no body); `None` at EOF.
async fn read_head(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
            buf.drain(..end + 4);
            return Some(head);
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn ok_response(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: X-Up\r\nX-Up: 1\r\nKeep-Alive: timeout=5\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[derive(Debug)]
struct Resp {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// A test client on one connection, keeping unread bytes between responses.
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        Client {
            s: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, req: &str) {
        self.s.write_all(req.as_bytes()).await.unwrap();
    }

    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        match self.s.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    async fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill().await {
                return None;
            }
        }
        Some(self.buf.drain(..n).collect())
    }

    async fn line(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                return Some(line);
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// One response; the body by Content-Length, chunked, or until close.
    async fn response(&mut self) -> Option<Resp> {
        let head = read_head(&mut self.s, &mut self.buf).await?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        let mut r = Resp {
            status,
            head,
            body: Vec::new(),
        };
        if let Some(n) = r.header("content-length") {
            r.body = self.take(n.parse().ok()?).await?;
        } else if r.header("transfer-encoding") == Some("chunked") {
            r.body = self.chunked_body().await?;
        } else {
            while self.fill().await {}
            r.body = std::mem::take(&mut self.buf);
        }
        Some(r)
    }

    async fn chunked_body(&mut self) -> Option<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let size = usize::from_str_radix(self.line().await?.trim(), 16).ok()?;
            if size == 0 {
                self.line().await?;
                return Some(body);
            }
            body.extend(self.take(size).await?);
            self.line().await?;
        }
    }

    /// True once the server has closed (EOF or reset) with nothing more to read.
    async fn closed(&mut self) -> bool {
        self.buf.is_empty() && !self.fill().await
    }
}

const GET: &str = "GET /f HTTP/1.1\r\nHost: site.example\r\n\r\n";

#[tokio::test]
async fn proxies_get_with_keepalive_both_sides() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("hello"))).await;
        let gate = TestGate::new(vec![up.addr]);
        let p = start(config(&[up.addr]), gate.clone()).await;
        let mut c = Client::connect(p.addr).await;
        for _ in 0..3 {
            c.send(GET).await;
            let r = c.response().await.unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.body, b"hello");
            assert_eq!(
                r.header("connection"),
                None,
                "keep-alive is the 1.1 default"
            );
        }
        assert_eq!(
            up.accepted.load(SeqCst),
            1,
            "one upstream connection reused"
        );
        assert_eq!(up.heads.lock().unwrap().len(), 3);
        assert_eq!(gate.inflight.load(SeqCst), 0, "route guards dropped");
        // Pipelined requests are answered in order.
        c.send(&format!("{GET}{GET}")).await;
        assert_eq!(c.response().await.unwrap().body, b"hello");
        assert_eq!(c.response().await.unwrap().body, b"hello");
        // HTTP/1.0 without keep-alive: answered, then closed.
        c.send("GET /f HTTP/1.0\r\n\r\n").await;
        let r = c.response().await.unwrap();
        assert_eq!(r.body, b"hello");
        assert_eq!(r.header("connection"), Some("close"));
        assert!(c.closed().await);
    })
    .await
}

#[tokio::test]
async fn streams_chunked_response() {
    within(async {
        let go = Arc::new(Notify::new());
        let up = upstream(Behaviour::ChunkedInTwoParts(go.clone())).await;
        let p = start(config(&[up.addr]), TestGate::new(vec![up.addr])).await;
        let mut c = Client::connect(p.addr).await;
        c.send(GET).await;
        // The head and first chunk arrive while the back-end still holds the rest back:
        // the proxy streams rather than buffering the whole body.
        let head = read_head(&mut c.s, &mut c.buf).await.unwrap();
        assert!(head.contains("Transfer-Encoding: chunked"), "{head}");
        assert_eq!(c.line().await.unwrap(), "5");
        assert_eq!(c.take(7).await.unwrap(), b"hello\r\n");
        go.notify_one();
        assert_eq!(c.chunked_body().await.unwrap(), b" world");
        // The connection is still usable after the chunked body's end.
        c.send(GET).await;
        let head = read_head(&mut c.s, &mut c.buf).await.unwrap();
        assert!(head.starts_with("HTTP/1.1 200"));
        go.notify_one();
        assert_eq!(c.chunked_body().await.unwrap(), b"hello world");
    })
    .await
}

/// curl through the proxy: with or without an `RDMA:` header the client gets its body,
/// and the header reaches the back-end only when `http.pass_rdma_header` is set.
#[tokio::test]
async fn rdma_header_is_stripped_unless_configured_and_curl_gets_its_body() {
    if !farside_testkit::tool_or_skip(
        "rdma_header_is_stripped_unless_configured_and_curl_gets_its_body",
        "curl",
        "--version",
        "curl",
    ) {
        return;
    }
    within(async {
        for pass in [false, true] {
            let up = upstream(Behaviour::Respond(ok_response("body"))).await;
            let mut cfg = config(&[up.addr]);
            cfg.http.pass_rdma_header = pass;
            let p = start(cfg, TestGate::new(vec![up.addr])).await;
            for field in [
                None,
                Some("server-writes, ip=127.0.0.1, port=9, stag=256, maxlen=99"),
            ] {
                let url = format!("http://{}/f", p.addr);
                let out = tokio::task::spawn_blocking(move || {
                    let mut cmd = std::process::Command::new("curl");
                    cmd.args(["-s", "--max-time", "5", &url]);
                    if let Some(f) = field {
                        cmd.args(["-H", &format!("RDMA: {f}")]);
                    }
                    cmd.output().unwrap()
                })
                .await
                .unwrap();
                assert!(out.status.success(), "curl {field:?}: {out:?}");
                assert_eq!(out.stdout, b"body", "curl {field:?}");
                let head = up
                    .heads
                    .lock()
                    .unwrap()
                    .last()
                    .unwrap()
                    .to_ascii_lowercase();
                assert_eq!(
                    head.contains("\r\nrdma: server-writes"),
                    pass && field.is_some(),
                    "pass {pass}: {head}"
                );
            }
            p.stop().await;
        }
    })
    .await
}

#[tokio::test]
async fn strips_hop_by_hop_and_adds_xff() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("x"))).await;
        let p = start(config(&[up.addr]), TestGate::new(vec![up.addr])).await;
        let mut c = Client::connect(p.addr).await;
        c.send(
            "GET /a?b HTTP/1.1\r\nHost: site.example:8080\r\nConnection: keep-alive, X-Hop\r\n\
             X-Hop: secret\r\nKeep-Alive: timeout=9\r\nTE: trailers\r\nUpgrade: websocket\r\n\
             Proxy-Connection: keep-alive\r\nX-Forwarded-For: 192.0.2.7\r\n\
             X-Forwarded-Proto: https\r\nProxy-Authorization: Basic Zm9v\r\nX-End: 1\r\n\r\n",
        )
        .await;
        let r = c.response().await.unwrap();
        assert_eq!(r.status, 200);
        for h in ["x-up", "keep-alive", "connection"] {
            assert_eq!(r.header(h), None, "response header {h} must be stripped");
        }
        let head = up.heads.lock().unwrap()[0].to_ascii_lowercase();
        assert!(head.starts_with("get /a?b http/1.1\r\n"), "{head}");
        for h in [
            "connection:",
            "x-hop:",
            "keep-alive:",
            "te:",
            "upgrade:",
            "proxy-connection:",
        ] {
            assert!(!head.contains(&format!("\r\n{h}")), "{h} forwarded: {head}");
        }
        assert!(head.contains("\r\nhost: site.example:8080\r\n"), "{head}");
        assert!(
            head.contains("\r\nproxy-authorization: basic zm9v\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nx-end: 1\r\n"), "{head}");
        assert!(
            head.contains("\r\nx-forwarded-for: 192.0.2.7, 127.0.0.1\r\n"),
            "{head}"
        );
        assert_eq!(head.matches("x-forwarded-proto").count(), 1, "{head}");
        assert!(head.contains("\r\nx-forwarded-proto: http\r\n"), "{head}");
    })
    .await
}

#[tokio::test]
async fn malformed_request_gets_400() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("x"))).await;
        let p = start(config(&[up.addr]), TestGate::new(vec![up.addr])).await;
        for bad in [
            "GET / HTTP/1.1\r\nHost: a\r\nNo colon here\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
            "G\x00T / HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            let mut c = Client::connect(p.addr).await;
            c.send(bad).await;
            let r = c.response().await.unwrap();
            assert_eq!(r.status, 400, "{bad:?}");
            assert_eq!(r.header("connection"), Some("close"));
            assert!(c.closed().await);
        }
        let mut c = Client::connect(p.addr).await;
        // A coding we cannot decode, chunked last (else 400: RFC 9112 §6.3).
        c.send("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
            .await;
        assert_eq!(c.response().await.unwrap().status, 501);
        assert_eq!(up.accepted.load(SeqCst), 0, "nothing reached the back-end");
    })
    .await
}

#[tokio::test]
async fn oversized_headers_get_431() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("x"))).await;
        let mut cfg = config(&[up.addr]);
        cfg.http.max_header_bytes = 1024;
        cfg.http.max_headers = 8;
        let p = start(cfg, TestGate::new(vec![up.addr])).await;

        let mut c = Client::connect(p.addr).await;
        c.send(&format!(
            "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
            "b".repeat(2000)
        ))
        .await;
        let r = c.response().await.unwrap();
        assert_eq!(r.status, 431);
        assert!(c.closed().await);

        let mut c = Client::connect(p.addr).await;
        let many: String = (0..20).map(|i| format!("X-H{i}: v\r\n")).collect();
        c.send(&format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n"))
            .await;
        assert_eq!(c.response().await.unwrap().status, 431);

        // Within the limits, all is well.
        let mut c = Client::connect(p.addr).await;
        c.send(GET).await;
        assert_eq!(c.response().await.unwrap().status, 200);
    })
    .await
}

#[tokio::test]
async fn slow_header_client_is_closed_and_others_are_served() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("fast"))).await;
        let mut cfg = config(&[up.addr]);
        cfg.http.header_timeout_ms = 300;
        let p = start(cfg, TestGate::new(vec![up.addr])).await;

        let started = tokio::time::Instant::now();
        let mut slow = Client::connect(p.addr).await;
        slow.send("GET /f HTTP/1.1\r\nHost: a\r\n").await;
        // While the slow client dawdles, another is served, repeatedly.
        let mut fast = Client::connect(p.addr).await;
        for _ in 0..5 {
            fast.send(GET).await;
            assert_eq!(fast.response().await.unwrap().body, b"fast");
        }
        let r = slow.response().await.unwrap();
        assert_eq!(r.status, 408);
        assert!(slow.closed().await);
        assert!(started.elapsed() >= Duration::from_millis(300));
    })
    .await
}

/// An address on which nothing listens.
async fn dead_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn backend_down_gets_502_without_hanging() {
    within(async {
        let dead = dead_addr().await;
        let gate = TestGate::new(vec![dead]);
        let p = start(config(&[dead]), gate.clone()).await;
        let mut c = Client::connect(p.addr).await;
        for _ in 0..2 {
            c.send(GET).await;
            let r = c.response().await.unwrap();
            assert_eq!(r.status, 502);
        }
        assert_eq!(
            gate.failures.load(SeqCst),
            2,
            "failures reported to the gate"
        );
        assert_eq!(gate.inflight.load(SeqCst), 0);
        assert_eq!(
            p.metrics
                .upstream_errors_for(farside_proxy::metrics::UpstreamError::Connect),
            2
        );
    })
    .await
}

#[tokio::test]
async fn backend_reset_mid_response_closes_client_connection() {
    within(async {
        let up = upstream(Behaviour::ResetMidBody(100_000)).await;
        let gate = TestGate::new(vec![up.addr]);
        let p = start(config(&[up.addr]), gate.clone()).await;
        let mut c = Client::connect(p.addr).await;
        c.send(GET).await;
        let head = read_head(&mut c.s, &mut c.buf).await.unwrap();
        assert!(head.contains("Content-Length: 100000"), "{head}");
        // The client gets what there was, then a close: it can tell the body is short.
        while c.fill().await {}
        assert!(c.buf.len() < 100_000, "got {}", c.buf.len());
        assert_eq!(gate.inflight.load(SeqCst), 0);
        // Other clients are unaffected.
        let mut other = Client::connect(p.addr).await;
        other.send(GET).await;
        let head = read_head(&mut other.s, &mut other.buf).await.unwrap();
        assert!(head.starts_with("HTTP/1.1 200"));
    })
    .await
}

#[tokio::test]
async fn backend_reset_in_a_short_body_gets_502() {
    within(async {
        // A short body is held back until complete, so head and body go out in one
        // write: when the back-end fails first, the client has had nothing and gets a 502.
        let up = upstream(Behaviour::ResetMidBody(10_000)).await;
        let gate = TestGate::new(vec![up.addr]);
        let p = start(config(&[up.addr]), gate.clone()).await;
        let mut c = Client::connect(p.addr).await;
        c.send(GET).await;
        let r = c.response().await.unwrap();
        assert_eq!(r.status, 502);
        assert!(c.closed().await);
        assert_eq!(gate.inflight.load(SeqCst), 0);
        assert_eq!(
            p.metrics
                .upstream_errors_for(farside_proxy::metrics::UpstreamError::MidBody),
            1
        );
    })
    .await
}

#[tokio::test]
async fn reject_at_accept_sends_503_with_retry_after_before_reading() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("x"))).await;
        let gate = TestGate::new(vec![up.addr]);
        gate.reject_accept.store(true, SeqCst);
        let p = start(config(&[up.addr]), gate.clone()).await;
        // The client sends nothing: the answer cannot depend on reading a request.
        let mut c = Client::connect(p.addr).await;
        let r = c.response().await.unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.header("retry-after"), Some("7"));
        assert_eq!(r.header("connection"), Some("close"));
        assert_eq!(r.body, b"overloaded");
        assert!(c.closed().await);
        assert_eq!(p.metrics.total(|s| &s.conns_rejected_at_accept), 1);
        assert_eq!(up.accepted.load(SeqCst), 0);
    })
    .await
}

#[tokio::test]
async fn reject_per_request_keeps_connection() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("ok"))).await;
        let gate = TestGate::new(vec![up.addr]);
        let p = start(config(&[up.addr]), gate.clone()).await;
        let mut c = Client::connect(p.addr).await;
        gate.reject_route.store(true, SeqCst);
        c.send(GET).await;
        let r = c.response().await.unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.header("retry-after"), Some("7"));
        assert_eq!(r.header("connection"), None);
        // A rejected request with a fully received body also keeps the connection.
        c.send("POST /f HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
            .await;
        assert_eq!(c.response().await.unwrap().status, 503);
        gate.reject_route.store(false, SeqCst);
        c.send(GET).await;
        let r = c.response().await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"ok");
        assert_eq!(p.metrics.rejects_for(Reject::Overloaded), 2);
    })
    .await
}

#[tokio::test]
async fn metrics_endpoint_renders_prometheus_text() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("ok"))).await;
        let mut cfg = config(&[up.addr]);
        cfg.admin_listen = Some("127.0.0.1:0".parse().unwrap());
        cfg.data_port_metrics = true;
        let p = start(cfg, TestGate::new(vec![up.addr])).await;
        let mut c = Client::connect(p.addr).await;
        c.send(GET).await;
        assert_eq!(c.response().await.unwrap().status, 200);
        c.send("GET /farside/metrics HTTP/1.1\r\nHost: a\r\n\r\n")
            .await;
        let r = c.response().await.unwrap();
        assert_eq!(r.status, 200);
        let text = String::from_utf8(r.body).unwrap();
        assert!(text.contains("# TYPE farside_proxy_responses_total counter\n"));
        assert!(
            text.contains("farside_proxy_responses_total{class=\"2xx\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("farside_proxy_request_duration_seconds_bucket{le=\"+Inf\"} 1\n"));
        assert!(
            text.contains("farside_proxy_connections_active 1\n"),
            "{text}"
        );
        assert!(
            text.contains("test_gate_inflight 0\n"),
            "gate metrics appended"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.rsplit_once(' ').unwrap();
            assert!(name.starts_with("farside_proxy_") || name.starts_with("test_gate_"));
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }

        let mut admin = Client::connect(p.admin_addr.unwrap()).await;
        admin.send("GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n").await;
        let r = admin.response().await.unwrap();
        assert_eq!(r.status, 200);
        assert!(String::from_utf8(r.body)
            .unwrap()
            .contains("farside_proxy_connections_accepted_total"));
        // The admin server answers one request per connection.
        let mut admin = Client::connect(p.admin_addr.unwrap()).await;
        admin.send(GET).await;
        assert_eq!(
            admin.response().await.unwrap().status,
            404,
            "admin only serves metrics"
        );
    })
    .await
}

/// By default the public data port does not answer `/farside/metrics` (they name the
/// back-ends, their loads and roles): the path goes to the back-end like any other,
/// and the admin listener still serves the metrics.
#[tokio::test]
async fn data_port_metrics_are_off_by_default() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("ok"))).await;
        let mut cfg = config(&[up.addr]);
        cfg.admin_listen = Some("127.0.0.1:0".parse().unwrap());
        let p = start(cfg, TestGate::new(vec![up.addr])).await;
        let mut c = Client::connect(p.addr).await;
        c.send("GET /farside/metrics HTTP/1.1\r\nHost: a\r\n\r\n")
            .await;
        let r = c.response().await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"ok", "forwarded to the back-end, not answered");
        assert!(up.heads.lock().unwrap()[0].starts_with("GET /farside/metrics "));
        let mut admin = Client::connect(p.admin_addr.unwrap()).await;
        admin.send("GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n").await;
        let r = admin.response().await.unwrap();
        assert_eq!(r.status, 200);
        assert!(String::from_utf8(r.body)
            .unwrap()
            .contains("farside_proxy_responses_total{class=\"2xx\"} 1\n"));
    })
    .await
}

#[tokio::test]
async fn idle_keep_alive_connections_hold_no_buffers() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("ok"))).await;
        let p = start(config(&[up.addr]), TestGate::new(vec![up.addr])).await;
        let bytes = || p.metrics.total(|s| &s.conn_buffer_bytes);
        let idle = || async {
            while bytes() != 0 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        };
        let mut clients = Vec::new();
        for _ in 0..10 {
            let mut c = Client::connect(p.addr).await;
            c.send(GET).await;
            assert_eq!(c.response().await.unwrap().body, b"ok");
            clients.push(c);
        }
        // Ten kept-alive connections between requests: no read buffer allocated (the old
        // code held 8 KiB + 32 KiB each).
        idle().await;
        // They are still open and served, and release again afterwards.
        for c in &mut clients {
            c.send(GET).await;
            assert_eq!(c.response().await.unwrap().body, b"ok");
        }
        idle().await;
        assert_eq!(
            up.accepted.load(SeqCst),
            1,
            "one pooled upstream connection"
        );
    })
    .await
}

#[tokio::test]
async fn pooled_connection_is_reused() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("ok"))).await;
        let p = start(config(&[up.addr]), TestGate::new(vec![up.addr])).await;
        for _ in 0..3 {
            // A new client connection each time: only the upstream side is kept alive.
            let mut c = Client::connect(p.addr).await;
            c.send(GET).await;
            assert_eq!(c.response().await.unwrap().body, b"ok");
        }
        assert_eq!(up.accepted.load(SeqCst), 1);
        let reused = p.metrics.total(|s| &s.upstream_reused);
        assert_eq!(reused, 2);
    })
    .await
}

#[tokio::test]
async fn stale_pooled_connection_is_replaced_transparently() {
    within(async {
        // The back-end closes after every response without announcing it, so each
        // pooled connection is dead by the time it is reused.
        let up = upstream(Behaviour::RespondThenClose(ok_response("ok"))).await;
        let p = start(config(&[up.addr]), TestGate::new(vec![up.addr])).await;
        let mut c = Client::connect(p.addr).await;
        for _ in 0..4 {
            c.send(GET).await;
            let r = c.response().await.unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.body, b"ok");
        }
        assert_eq!(up.accepted.load(SeqCst), 4);
    })
    .await
}

#[tokio::test]
async fn request_body_is_forwarded_with_expect_continue() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("ok"))).await;
        let p = start(config(&[up.addr]), TestGate::new(vec![up.addr])).await;
        let mut c = Client::connect(p.addr).await;
        c.send("PUT /f HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
            .await;
        assert_eq!(c.line().await.unwrap(), "HTTP/1.1 100 Continue");
        assert_eq!(c.line().await.unwrap(), "");
        c.send("hello").await;
        assert_eq!(c.response().await.unwrap().status, 200);
        let head = up.heads.lock().unwrap()[0].to_ascii_lowercase();
        assert!(head.contains("content-length: 5\r\n") && !head.contains("expect"));
    })
    .await
}

#[tokio::test]
async fn idle_pooled_connections_expire() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("ok"))).await;
        let mut cfg = config(&[up.addr]);
        cfg.http.pool_idle_timeout_ms = 200;
        let p = start(cfg, TestGate::new(vec![up.addr])).await;
        let mut c = Client::connect(p.addr).await;
        c.send(GET).await;
        assert_eq!(c.response().await.unwrap().status, 200);
        // The idle upstream connection is closed by the proxy, not left to the back-end.
        until(|| up.closed.load(SeqCst) == 1).await;
        c.send(GET).await;
        assert_eq!(c.response().await.unwrap().status, 200);
        assert_eq!(up.accepted.load(SeqCst), 2);
    })
    .await
}

#[tokio::test]
async fn http10_client_gets_chunked_response_decoded_then_close() {
    within(async {
        let go = Arc::new(Notify::new());
        go.notify_one();
        let up = upstream(Behaviour::ChunkedInTwoParts(go)).await;
        let p = start(config(&[up.addr]), TestGate::new(vec![up.addr])).await;
        let mut c = Client::connect(p.addr).await;
        c.send("GET /f HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .await;
        let r = c.response().await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("transfer-encoding"), None);
        assert_eq!(r.header("connection"), Some("close"));
        assert_eq!(r.body, b"hello world");
    })
    .await
}

#[tokio::test]
async fn silent_backend_gets_504_after_response_timeout() {
    within(async {
        let up = upstream(Behaviour::Silent).await;
        let mut cfg = config(&[up.addr]);
        cfg.http.response_timeout_ms = 200;
        let gate = TestGate::new(vec![up.addr]);
        let p = start(cfg, gate.clone()).await;
        let mut c = Client::connect(p.addr).await;
        let started = tokio::time::Instant::now();
        c.send(GET).await;
        let r = c.response().await.unwrap();
        assert_eq!(r.status, 504);
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(gate.inflight.load(SeqCst), 0);
        // The client connection survives an upstream timeout.
        c.send(GET).await;
        assert_eq!(c.response().await.unwrap().status, 504);
    })
    .await
}

#[tokio::test]
async fn idle_keepalive_client_is_closed_after_idle_timeout() {
    within(async {
        let up = upstream(Behaviour::Respond(ok_response("ok"))).await;
        let mut cfg = config(&[up.addr]);
        cfg.http.idle_timeout_ms = 200;
        let p = start(cfg, TestGate::new(vec![up.addr])).await;
        let mut c = Client::connect(p.addr).await;
        c.send(GET).await;
        assert_eq!(c.response().await.unwrap().status, 200);
        let idle_from = tokio::time::Instant::now();
        assert!(c.closed().await, "closed without a response");
        assert!(idle_from.elapsed() >= Duration::from_millis(190));
    })
    .await
}

#[test]
fn spawned_proxy_serves_on_its_own_thread_and_stops() {
    use std::io::{Read, Write};
    // Nothing listens on the back-end: the answer is a quick 502.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let gate = TestGate::new(vec![dead]);
    let p = server::spawn(config(&[dead]), gate).unwrap();
    let mut s = std::net::TcpStream::connect(p.addr).unwrap();
    s.set_read_timeout(Some(TEST_TIMEOUT)).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    assert!(got.starts_with("HTTP/1.1 502 "), "{got}");
    let addr = p.addr;
    p.stop();
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "listener closed"
    );
}
