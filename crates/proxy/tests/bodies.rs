//! Request and response bodies through the proxy, against a recording back-end that
//! keeps exactly the bytes the proxy sent it: bodies arrive intact (Content-Length,
//! chunked, pipelined), framing the next hop could read differently never reaches it
//! (request smuggling), and slow bodies are cut off by their deadlines. One test puts a
//! real nginx behind the proxy when it is installed.
//!
//! Every test binds port 0, runs the product's own gate (`Control`, admission off) and
//! is bounded by a timeout so that a hang is a failure.

use farside_proxy::config::ProxyConfig;
use farside_proxy::control::Control;
use farside_proxy::server::{self, Running};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Every test finishes well within this, or fails.
const TEST_TIMEOUT: Duration = Duration::from_secs(20);

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("test timed out")
}

/// Defaults of the product, one back-end at `backend`.
fn config(backend: SocketAddr) -> ProxyConfig {
    ProxyConfig::from_toml_str(&format!(
        "listen = \"127.0.0.1:0\"\n[[backend]]\naddr = \"{backend}\"\n"
    ))
    .expect("valid config")
}

async fn start(cfg: ProxyConfig) -> Running {
    let gate = Arc::new(Control::new(&cfg).expect("control starts"));
    server::start(cfg, gate).await.expect("proxy starts")
}

/// One request as the back-end received it.
#[derive(Debug, Clone)]
struct Seen {
    head: String,
    /// The body bytes exactly as they arrived (chunk framing included).
    raw_body: Vec<u8>,
    /// The payload.
    body: Vec<u8>,
}

#[derive(Default)]
struct Record {
    requests: Vec<Seen>,
    accepted: usize,
    /// Connections that ended (EOF or error) on the back-end's side.
    closed: usize,
    /// Bytes received on connections that ended, in order of ending.
    raw: Vec<Vec<u8>>,
}

/// A back-end that records every request and answers each with its payload echoed
/// (`Content-Length` framing). It decodes chunked bodies with its own minimal decoder
/// (independent of the proxy's), as a lenient back-end would.
struct Recorder {
    addr: SocketAddr,
    rec: Arc<Mutex<Record>>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let rec = Arc::new(Mutex::new(Record::default()));
        let r = rec.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                r.lock().unwrap().accepted += 1;
                tokio::spawn(record_conn(s, r.clone()));
            }
        });
        Recorder { addr, rec }
    }

    fn requests(&self) -> Vec<Seen> {
        self.rec.lock().unwrap().requests.clone()
    }

    fn accepted(&self) -> usize {
        self.rec.lock().unwrap().accepted
    }

    fn closed(&self) -> usize {
        self.rec.lock().unwrap().closed
    }

    /// Everything any connection received, concatenated (ended connections only).
    fn raw(&self) -> Vec<u8> {
        self.rec.lock().unwrap().raw.concat()
    }
}

async fn record_conn(mut s: TcpStream, rec: Arc<Mutex<Record>>) {
    let mut buf = Vec::new();
    let mut all = Vec::new();
    let mut scratch = vec![0u8; 64 * 1024];
    'conn: loop {
        while let Some((used, seen)) = parse_one(&buf) {
            buf.drain(..used);
            let mut resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Seq: {}\r\n\r\n",
                seen.body.len(),
                rec.lock().unwrap().requests.len()
            )
            .into_bytes();
            resp.extend_from_slice(&seen.body);
            rec.lock().unwrap().requests.push(seen);
            if s.write_all(&resp).await.is_err() {
                break 'conn;
            }
        }
        match s.read(&mut scratch).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf.extend_from_slice(&scratch[..n]);
                all.extend_from_slice(&scratch[..n]);
            }
        }
    }
    let mut r = rec.lock().unwrap();
    r.closed += 1;
    r.raw.push(all);
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One complete request at the start of `buf`: bytes used and what was seen.
fn parse_one(buf: &[u8]) -> Option<(usize, Seen)> {
    let head_end = find(buf, b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let lower = head.to_ascii_lowercase();
    let rest = &buf[head_end..];
    let (n, body) = if lower.contains("\r\ntransfer-encoding: chunked\r\n") {
        dechunk(rest)?
    } else if let Some(i) = lower.find("\r\ncontent-length: ") {
        let v = &lower[i + 18..];
        let len: usize = v[..v.find('\r').unwrap()].trim().parse().ok()?;
        if rest.len() < len {
            return None;
        }
        (len, rest[..len].to_vec())
    } else {
        (0, Vec::new())
    };
    Some((
        head_end + n,
        Seen {
            head,
            raw_body: rest[..n].to_vec(),
            body,
        },
    ))
}

/// A back-end's chunked decoder: size up to `;` or CR, lines end at CRLF.
fn dechunk(b: &[u8]) -> Option<(usize, Vec<u8>)> {
    let mut pos = 0;
    let mut out = Vec::new();
    loop {
        let eol = pos + find(&b[pos..], b"\r\n")?;
        let line = std::str::from_utf8(&b[pos..eol]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        pos = eol + 2;
        if size == 0 {
            loop {
                let eol = pos + find(&b[pos..], b"\r\n")?;
                let empty = eol == pos;
                pos = eol + 2;
                if empty {
                    return Some((pos, out));
                }
            }
        }
        if b.len() < pos + size + 2 {
            return None;
        }
        out.extend_from_slice(&b[pos..pos + size]);
        pos += size + 2;
    }
}

/// A parsed response as the client got it.
#[derive(Debug)]
struct Resp {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// A client connection that reads responses (Content-Length, chunked or until close).
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

    async fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).await.unwrap();
    }

    /// Read more; false at EOF or error.
    async fn fill(&mut self) -> bool {
        let mut tmp = [0u8; 64 * 1024];
        match self.s.read(&mut tmp).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                true
            }
        }
    }

    async fn response(&mut self) -> Option<Resp> {
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            if !self.fill().await {
                return None;
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        self.buf.drain(..head_end);
        let status = head.get(9..12)?.parse().ok()?;
        let mut r = Resp {
            status,
            head,
            body: Vec::new(),
        };
        if status < 200 {
            return Some(r);
        }
        let te = r.header("transfer-encoding");
        if te.as_deref().is_some_and(|t| t.ends_with("chunked")) {
            let (n, body) = loop {
                if let Some(x) = dechunk(&self.buf) {
                    break x;
                }
                if !self.fill().await {
                    return None;
                }
            };
            self.buf.drain(..n);
            r.body = body;
        } else if let Some(len) = r.header("content-length") {
            let len: usize = len.parse().ok()?;
            while self.buf.len() < len {
                if !self.fill().await {
                    return None;
                }
            }
            r.body = self.buf.drain(..len).collect();
        } else {
            while self.fill().await {}
            r.body = std::mem::take(&mut self.buf);
        }
        Some(r)
    }

    /// Send `piece` every `period` until the proxy starts answering; that response.
    async fn trickle_until_response(&mut self, piece: &[u8], period: Duration) -> Option<Resp> {
        loop {
            // A read cancelled by the timeout loses nothing (cancel-safe).
            match tokio::time::timeout(period, self.fill()).await {
                Ok(true) => return self.response().await,
                Ok(false) => return None,
                Err(_) => {
                    if self.s.write_all(piece).await.is_err() {
                        return self.response().await;
                    }
                }
            }
        }
    }

    /// The proxy closed the connection (EOF or reset) with nothing more to read.
    async fn closed(&mut self) -> bool {
        !self.fill().await && self.buf.is_empty()
    }
}

/// Bytes 0..=255 repeated: every byte value, easy to tell apart when misplaced.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// `payload` as chunks of `size` bytes, with an extension on each and a trailer.
fn chunked(payload: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, c) in payload.chunks(size).enumerate() {
        out.extend_from_slice(format!("{:x};n={i};q=\"a;b\"\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\nX-Checksum: 42\r\n\r\n");
    out
}

/// Wait (within the test's timeout) until `cond` holds.
async fn until(cond: impl Fn() -> bool) {
    while !cond() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn content_length_body_reaches_backend_intact() {
    within(async {
        let up = Recorder::start().await;
        let p = start(config(up.addr)).await;
        let body = pattern(300_000);
        let mut c = Client::connect(p.addr).await;
        c.send(
            format!(
                "PUT /f HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .await;
        // In uneven pieces, so the proxy relays it over many reads.
        for piece in body.chunks(40_000) {
            c.send(piece).await;
            tokio::task::yield_now().await;
        }
        let r = c.response().await.expect("response");
        assert_eq!(r.status, 200);
        assert!(r.body == body, "echoed body differs");
        let seen = up.requests();
        assert_eq!(seen.len(), 1);
        assert!(seen[0].raw_body == body, "body at the back-end differs");
        assert!(
            seen[0].head.contains("\r\nContent-Length: 300000\r\n"),
            "{}",
            seen[0].head
        );
    })
    .await
}

#[tokio::test]
async fn chunked_body_reaches_backend_byte_for_byte() {
    within(async {
        let up = Recorder::start().await;
        let p = start(config(up.addr)).await;
        let payload = pattern(100_000);
        let wire = chunked(&payload, 7_000);
        let mut c = Client::connect(p.addr).await;
        c.send(b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
            .await;
        // Split inside size lines, extensions, CRLFs and the trailer.
        let mut at = 0;
        for step in [1usize, 2, 3, 5, 8, 13, 4096, 9000].iter().cycle() {
            if at >= wire.len() {
                break;
            }
            let end = (at + step).min(wire.len());
            c.send(&wire[at..end]).await;
            at = end;
        }
        let r = c.response().await.expect("response");
        assert_eq!(r.status, 200);
        assert!(r.body == payload, "echoed payload differs");
        let seen = up.requests();
        assert_eq!(seen.len(), 1);
        assert!(
            seen[0].raw_body == wire,
            "chunked framing was not relayed verbatim"
        );
        assert!(seen[0].head.contains("\r\nTransfer-Encoding: chunked\r\n"));
    })
    .await
}

#[tokio::test]
async fn pipelined_requests_with_bodies_arrive_separately_and_in_order() {
    within(async {
        let up = Recorder::start().await;
        let p = start(config(up.addr)).await;
        let mut all = Vec::new();
        all.extend_from_slice(b"POST /1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nfirst");
        all.extend_from_slice(b"POST /2 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
        all.extend_from_slice(&chunked(b"second body", 4));
        all.extend_from_slice(b"GET /3 HTTP/1.1\r\nHost: a\r\n\r\n");
        all.extend_from_slice(b"PUT /4 HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\nfourth");
        let mut c = Client::connect(p.addr).await;
        c.send(&all).await;
        let want: [&[u8]; 4] = [b"first", b"second body", b"", b"fourth"];
        for (i, w) in want.iter().enumerate() {
            let r = c.response().await.expect("response");
            assert_eq!((r.status, &r.body[..]), (200, *w), "response {i}");
        }
        let seen = up.requests();
        let got: Vec<(String, Vec<u8>)> = seen
            .iter()
            .map(|s| (s.head.lines().next().unwrap().to_string(), s.body.clone()))
            .collect();
        let expect: Vec<(String, Vec<u8>)> = ["POST /1", "POST /2", "GET /3", "PUT /4"]
            .iter()
            .zip(want)
            .map(|(l, b)| (format!("{l} HTTP/1.1"), b.to_vec()))
            .collect();
        assert_eq!(got, expect);
    })
    .await
}

/// Each request carries a second request hidden in framing some parser might read
/// differently. The proxy must refuse it, and no back-end may ever see `/smuggled`.
#[tokio::test]
async fn smuggling_shapes_are_refused_and_nothing_reaches_the_backend() {
    within(async {
        let up = Recorder::start().await;
        let p = start(config(up.addr)).await;
        const S: &str = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n";
        let h = "POST / HTTP/1.1\r\nHost: a\r\n";
        let huge_ext = format!("1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(20_000));
        let huge_trailer = format!("0\r\nX-T: {}\r\n\r\n", "v".repeat(20_000));
        let cases: Vec<(&str, String, u16)> = vec![
            (
                "CL.TE",
                format!("{h}Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{S}"),
                400,
            ),
            (
                "TE.CL",
                format!("{h}Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\n{S}"),
                400,
            ),
            (
                "duplicate CL",
                format!("{h}Content-Length: 0\r\nContent-Length: 39\r\n\r\n{S}"),
                400,
            ),
            (
                "CL with sign",
                format!("{h}Content-Length: +0\r\n\r\n{S}"),
                400,
            ),
            (
                "CL non-digit",
                format!("{h}Content-Length: 0x0\r\n\r\n{S}"),
                400,
            ),
            (
                "obs-fold",
                format!("{h}X-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n{S}"),
                400,
            ),
            (
                "space before colon",
                format!("{h}Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n{S}"),
                400,
            ),
            (
                "chunked, identity",
                format!("{h}Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n{S}"),
                400,
            ),
            (
                "TE on HTTP/1.0",
                format!("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{S}"),
                400,
            ),
            (
                "bare LF chunks",
                format!("{h}Transfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n{S}"),
                400,
            ),
            (
                "bare CR in extension",
                format!("{h}Transfer-Encoding: chunked\r\n\r\n3;a\rb\r\nabc\r\n0\r\n\r\n{S}"),
                400,
            ),
            (
                "chunk-size overflow",
                format!("{h}Transfer-Encoding: chunked\r\n\r\n10000000000000000\r\n{S}"),
                400,
            ),
            (
                "huge extension",
                format!("{h}Transfer-Encoding: chunked\r\n\r\n{huge_ext}{S}"),
                400,
            ),
            (
                "huge trailers",
                format!("{h}Transfer-Encoding: chunked\r\n\r\n{huge_trailer}{S}"),
                400,
            ),
            (
                "TE with underscore",
                format!("{h}Transfer_Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n{S}"),
                400,
            ),
            (
                "bad trailer",
                format!("{h}Transfer-Encoding: chunked\r\n\r\n0\r\nX-A : 1\r\n\r\n{S}"),
                400,
            ),
        ];
        for (what, req, status) in &cases {
            let mut c = Client::connect(p.addr).await;
            c.send(req.as_bytes()).await;
            let r = c
                .response()
                .await
                .unwrap_or_else(|| panic!("{what}: no response"));
            assert_eq!(r.status, *status, "{what}");
            assert_eq!(r.header("connection").as_deref(), Some("close"), "{what}");
            assert!(c.closed().await, "{what}: connection stays open");
        }
        // Whatever reached the back-end (heads of chunked requests refused mid-body) was
        // never a complete request, its connection was closed, and `/smuggled` is nowhere.
        assert!(up.requests().is_empty(), "{:?}", up.requests());
        until(|| up.closed() == up.accepted()).await;
        assert!(find(&up.raw(), b"/smuggled").is_none());
    })
    .await
}

/// A malformed chunk that arrives after the head went upstream: the half-sent request
/// dies with its upstream connection, and the client still learns why.
#[tokio::test]
async fn bare_lf_chunk_after_the_head_was_relayed_gets_400_and_upstream_closes() {
    within(async {
        let up = Recorder::start().await;
        let p = start(config(up.addr)).await;
        let mut c = Client::connect(p.addr).await;
        c.send(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            .await;
        until(|| up.accepted() == 1).await;
        c.send(b"3\nxyz\n0\n\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n")
            .await;
        let r = c.response().await.expect("response");
        assert_eq!(
            (r.status, &r.body[..]),
            (400, &b"malformed_chunked_body"[..])
        );
        until(|| up.closed() == 1).await;
        assert!(up.requests().is_empty());
        let raw = up.raw();
        assert!(
            raw.ends_with(b"3\r\nabc\r\n"),
            "{:?}",
            String::from_utf8_lossy(&raw)
        );
    })
    .await
}

#[tokio::test]
async fn slow_request_body_gets_408_at_its_total_deadline() {
    within(async {
        let up = Recorder::start().await;
        let mut cfg = config(up.addr);
        cfg.http.request_body_timeout_ms = 400;
        cfg.http.body_min_rate_bytes_per_s = 0;
        let p = start(cfg).await;
        let mut c = Client::connect(p.addr).await;
        c.send(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789")
            .await;
        let t0 = Instant::now();
        // A byte every 50 ms: never idle for long, never finishing.
        let r = c
            .trickle_until_response(b"x", Duration::from_millis(50))
            .await
            .expect("response");
        let took = t0.elapsed();
        assert_eq!((r.status, &r.body[..]), (408, &b"request_body_timeout"[..]));
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        until(|| up.closed() == 1).await;
        assert!(
            up.requests().is_empty(),
            "the partial request was not completed"
        );
        assert_eq!(p.metrics.total(|s| &s.request_body_timeouts), 1);
    })
    .await
}

#[tokio::test]
async fn request_body_below_minimum_rate_gets_408_and_a_fast_one_passes() {
    within(async {
        let up = Recorder::start().await;
        let mut cfg = config(up.addr);
        cfg.http.body_rate_grace_ms = 200;
        cfg.http.body_min_rate_bytes_per_s = 10_000;
        let p = start(cfg).await;

        // 20 kB in 10 pieces 20 ms apart: ~100 kB/s, passes.
        let body = pattern(20_000);
        let mut c = Client::connect(p.addr).await;
        c.send(b"POST /fast HTTP/1.1\r\nHost: a\r\nContent-Length: 20000\r\n\r\n")
            .await;
        for piece in body.chunks(2_000) {
            c.send(piece).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let r = c.response().await.expect("response");
        assert_eq!(r.status, 200);
        assert!(r.body == body);

        // 10 bytes every 20 ms: 500 B/s, far below 10 kB/s once the grace is over.
        let mut c = Client::connect(p.addr).await;
        c.send(b"POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
            .await;
        let t0 = Instant::now();
        let r = c
            .trickle_until_response(&[b'x'; 10], Duration::from_millis(20))
            .await
            .expect("response");
        let took = t0.elapsed();
        assert_eq!(r.status, 408);
        assert!(
            took < Duration::from_secs(5),
            "{took:?}, total deadline is 60 s"
        );
        assert_eq!(up.requests().len(), 1, "only the fast request completed");
    })
    .await
}

/// Reads (and discards) one request head from a test back-end's connection: until the
/// blank line, the peer's close, or an error.
async fn read_head(s: &mut TcpStream) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    while find(&buf, b"\r\n\r\n").is_none() {
        match s.read(&mut tmp).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
}

/// A back-end that answers every request with a `len`-byte body (written until the
/// proxy stops reading) and reports when its connection ends.
async fn big_response_upstream(len: usize) -> (SocketAddr, Arc<Mutex<Option<Instant>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ended = Arc::new(Mutex::new(None));
    let e = ended.clone();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        read_head(&mut s).await;
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
        let _ = s.write_all(head.as_bytes()).await;
        let block = vec![b'b'; 64 * 1024];
        let mut sent = 0;
        while sent < len {
            let n = block.len().min(len - sent);
            if s.write_all(&block[..n]).await.is_err() {
                break;
            }
            sent += n;
        }
        // Wait for the proxy to drop the connection (if it has not already).
        let _ = s.read(&mut [0u8; 4096]).await;
        *e.lock().unwrap() = Some(Instant::now());
    });
    (addr, ended)
}

#[tokio::test]
async fn client_that_stops_reading_is_cut_off_at_the_response_body_deadline() {
    within(async {
        // Far more than loopback socket buffers hold, so the proxy's writes block.
        let len = 256 << 20;
        let (addr, ended) = big_response_upstream(len).await;
        let mut cfg = config(addr);
        cfg.http.response_body_timeout_ms = 500;
        let p = start(cfg).await;
        let mut c = Client::connect(p.addr).await;
        c.send(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n").await;
        let t0 = Instant::now();
        // The client reads nothing; the back-end connection must end within the deadline
        // (plus scheduling slack), long before the 60 s idle write timeout.
        until(|| ended.lock().unwrap().is_some()).await;
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert_eq!(p.metrics.total(|s| &s.response_body_timeouts), 1);
        // The client gets a truncated body, then the close.
        let mut got = 0usize;
        while c.fill().await {
            got += c.buf.len();
            c.buf.clear();
        }
        assert!(got < len, "the whole body arrived");
    })
    .await
}

#[tokio::test]
async fn http10_client_is_never_sent_100_continue() {
    within(async {
        let up = Recorder::start().await;
        let p = start(config(up.addr)).await;
        let mut c = Client::connect(p.addr).await;
        c.send(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello")
            .await;
        let r = c.response().await.expect("response");
        assert_eq!((r.status, &r.body[..]), (200, &b"hello"[..]));
        // HTTP/1.1 still gets its interim response.
        let mut c = Client::connect(p.addr).await;
        c.send(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
            .await;
        assert_eq!(c.response().await.expect("interim").status, 100);
        c.send(b"hello").await;
        assert_eq!(c.response().await.expect("final").body, b"hello");
    })
    .await
}

/// A back-end that answers one request with `resp` and closes.
async fn fixed_upstream(resp: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            read_head(&mut s).await;
            let _ = s.write_all(resp).await;
        }
    });
    addr
}

#[tokio::test]
async fn response_coding_other_than_chunked_is_passed_with_its_header() {
    within(async {
        let addr =
            fixed_upstream(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n\x1f\x8bGZ").await;
        let p = start(config(addr)).await;
        let mut c = Client::connect(p.addr).await;
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
        let r = c.response().await.expect("response");
        assert_eq!(
            r.header("transfer-encoding").as_deref(),
            Some("gzip"),
            "{}",
            r.head
        );
        assert_eq!(r.header("connection").as_deref(), Some("close"));
        assert_eq!(r.body, b"\x1f\x8bGZ");

        // The same to an HTTP/1.0 client, which cannot be sent a transfer coding: 502.
        let mut c = Client::connect(p.addr).await;
        c.send(b"GET / HTTP/1.0\r\n\r\n").await;
        assert_eq!(c.response().await.expect("response").status, 502);
    })
    .await
}

/// A port free a moment ago (nginx cannot report a port-0 bind back to us).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A skip notice that shows even though libtest captures test output (`eprintln!` is
/// captured; a direct write to the stderr handle is not).
fn skip_notice(msg: &str) {
    let (test, why) = msg.split_once(": ").unwrap_or((msg, "cannot run here"));
    farside_testkit::skip(test, why);
}

/// Attempts at starting nginx, each on a port free a moment before (another process
/// may take it in between).
const NGINX_START_ATTEMPTS: usize = 3;

/// nginx serving `dir/root` with WebDAV PUT, as one process of the invoking user that
/// writes only under `dir`; its address once it accepts connections.
async fn start_nginx(nginx: &str, dir: &std::path::Path) -> (std::process::Child, SocketAddr) {
    let d = dir.display();
    let mut why = String::new();
    for _ in 0..NGINX_START_ATTEMPTS {
        let port = free_port();
        let conf = format!(
            "daemon off;\nmaster_process off;\nerror_log {d}/error.log;\npid {d}/nginx.pid;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n access_log off;\n client_body_temp_path {d}/tmp;\n\
             proxy_temp_path {d}/tmp;\n fastcgi_temp_path {d}/tmp;\n uwsgi_temp_path {d}/tmp;\n\
             scgi_temp_path {d}/tmp;\n\
             server {{\n  listen 127.0.0.1:{port};\n  root {d}/root;\n  client_max_body_size 16m;\n\
             dav_methods PUT;\n }}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let mut child = std::process::Command::new(nginx)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nginx runs");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if TcpStream::connect(addr).await.is_ok() {
                return (child, addr);
            }
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        why = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
    }
    panic!("nginx did not start: {why}");
}

#[tokio::test]
async fn bodies_reach_a_real_nginx_intact() {
    const NGINX: &str = "/usr/sbin/nginx";
    if !std::path::Path::new(NGINX).exists() {
        skip_notice(&format!(
            "bodies_reach_a_real_nginx_intact: {NGINX} is not installed"
        ));
        return;
    }
    let dir = std::env::temp_dir().join(format!("farside-nginx-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("root")).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let (mut nginx, addr) = within(start_nginx(NGINX, &dir)).await;
    let result = tokio::time::timeout(TEST_TIMEOUT, async {
        let p = start(config(addr)).await;
        let length_body = pattern(1_000_000);
        let chunked_payload = pattern(777_777);
        let mut c = Client::connect(p.addr).await;
        c.send(
            format!(
                "PUT /cl.bin HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
                length_body.len()
            )
            .as_bytes(),
        )
        .await;
        c.send(&length_body).await;
        let r = c.response().await.expect("response to PUT");
        assert!(r.status == 201 || r.status == 204, "{}", r.head);
        c.send(b"PUT /te.bin HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
            .await;
        c.send(&chunked(&chunked_payload, 10_000)).await;
        let r = c.response().await.expect("response to chunked PUT");
        assert!(r.status == 201 || r.status == 204, "{}", r.head);
        for (path, want) in [("/cl.bin", &length_body), ("/te.bin", &chunked_payload)] {
            c.send(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
                .await;
            let r = c.response().await.expect("response to GET");
            assert_eq!(r.status, 200, "{path}");
            assert!(r.body == **want, "{path}: body differs through nginx");
        }
        assert!(std::fs::read(dir.join("root/te.bin")).unwrap() == chunked_payload);
        // HTTP/1.0 may omit Host; the HTTP/1.1 request sent upstream may not.
        let mut c = Client::connect(p.addr).await;
        c.send(b"GET /cl.bin HTTP/1.0\r\n\r\n").await;
        let r = c.response().await.expect("response to HTTP/1.0 GET");
        assert_eq!(r.status, 200, "{}", r.head);
        assert!(r.body == length_body);
    })
    .await;
    let _ = nginx.kill();
    let _ = nginx.wait();
    let _ = std::fs::remove_dir_all(&dir);
    result.expect("test timed out");
}

/// Strictness holds for back-ends too: a response whose chunked framing a client could
/// read differently is never relayed.
#[tokio::test]
async fn response_with_bare_lf_chunks_gets_502() {
    within(async {
        let addr = fixed_upstream(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\nHTTP/1.1 200 OK\r\n",
        )
        .await;
        let p = start(config(addr)).await;
        let mut c = Client::connect(p.addr).await;
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
        let r = c.response().await.expect("response");
        assert_eq!((r.status, &r.body[..]), (502, &b"bad_upstream_body"[..]));
        assert!(c.closed().await);
    })
    .await
}

#[tokio::test]
async fn client_reading_below_minimum_rate_is_cut_off_long_before_the_total_deadline() {
    within(async {
        let len = 256 << 20;
        let (addr, ended) = big_response_upstream(len).await;
        let mut cfg = config(addr);
        // Total deadline left at its default (300 s); the rate is what cuts.
        cfg.http.body_rate_grace_ms = 200;
        cfg.http.body_min_rate_bytes_per_s = 100_000_000;
        let p = start(cfg).await;
        let mut c = Client::connect(p.addr).await;
        c.send(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n").await;
        let t0 = Instant::now();
        until(|| ended.lock().unwrap().is_some()).await;
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    })
    .await
}

#[tokio::test]
async fn http10_request_without_host_goes_upstream_with_one() {
    within(async {
        let up = Recorder::start().await;
        let p = start(config(up.addr)).await;
        let mut c = Client::connect(p.addr).await;
        c.send(b"POST /old HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc")
            .await;
        let r = c.response().await.expect("response");
        assert_eq!((r.status, &r.body[..]), (200, &b"abc"[..]));
        let seen = up.requests();
        let head = &seen[0].head;
        assert!(head.starts_with("POST /old HTTP/1.1\r\n"), "{head}");
        assert!(
            head.contains(&format!("\r\nHost: {}\r\n", up.addr)),
            "{head}"
        );
        assert!(head.ends_with("\r\n\r\n"));
        assert_eq!(seen[0].body, b"abc");
    })
    .await
}

/// A back-end that sends a head promising `len` bytes, then one byte every 50 ms: never
/// idle for the 30 s response timeout, never finishing. Reports when the proxy hung up.
async fn trickling_upstream(len: usize) -> (SocketAddr, Arc<Mutex<Option<Instant>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ended = Arc::new(Mutex::new(None));
    let e = ended.clone();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        read_head(&mut s).await;
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
        let _ = s.write_all(head.as_bytes()).await;
        // The proxy hanging up shows as a failed write soon after.
        while s.write_all(b"x").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        *e.lock().unwrap() = Some(Instant::now());
    });
    (addr, ended)
}

#[tokio::test]
async fn trickling_backend_response_is_cut_off_at_the_response_body_deadline() {
    within(async {
        // Short enough to be held back with the head (502), then long enough to stream
        // (truncated, then closed).
        for (len, held_back) in [(1_000, true), (1_000_000, false)] {
            let (addr, ended) = trickling_upstream(len).await;
            let mut cfg = config(addr);
            cfg.http.response_body_timeout_ms = 400;
            let p = start(cfg).await;
            let mut c = Client::connect(p.addr).await;
            c.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n").await;
            let t0 = Instant::now();
            let r = c.response().await;
            let took = t0.elapsed();
            if held_back {
                let r = r.expect("a 502");
                assert_eq!((r.status, &r.body[..]), (502, &b"bad_upstream_body"[..]));
            } else {
                assert!(r.is_none(), "a complete response arrived");
            }
            assert!(took >= Duration::from_millis(300), "{len}: {took:?}");
            assert!(took < Duration::from_secs(5), "{len}: {took:?}");
            assert_eq!(p.metrics.total(|s| &s.response_body_timeouts), 1);
            until(|| ended.lock().unwrap().is_some()).await;
        }
    })
    .await
}
