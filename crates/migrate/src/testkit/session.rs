//! The HTTP/1.1 keep-alive session of the migration tests: the client sends
//! `GET /big` (a [`BIG_BYTES`] response), then at once a `POST /upload` with a
//! [`POST_BYTES`] body, then `GET /small`. The source answers the GET only partly
//! ([`source_prefix`]: the client's small receive buffer and the source's fixed send
//! buffer leave unsent bytes with the application and unacknowledged ones in the
//! send queue), waits until POST bytes sit in its receive queue, and migrates while
//! the client keeps sending. Whoever ends up with the connection finishes it
//! ([`finish_serving`]). The client ([`run_client`]) checks every response byte
//! against the pattern, the server every POST byte, both compare digests; no read
//! may fail (no reset) and the client reports its longest wait.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::{await_cond, connect_with_rcvbuf, inq, set_int_opt};
pub use super::{is_root, pat, pattern_digest, Fnv, AWAIT_MAX};

/// Longest a client read may wait once the migration is over: one retransmission
/// timeout (200 ms minimum, backed off while frozen) plus slack for this busy,
/// shared machine (builds run at idle priority next to the lead's measurements).
pub const STALL_MAX: Duration = Duration::from_secs(5);
/// Response to `GET /big`.
pub const BIG_BYTES: usize = 4 << 20;
/// POST body.
pub const POST_BYTES: usize = 8 << 20;
/// Client receive buffer: small, so the server's send queue keeps unsent bytes.
pub const CLIENT_RCVBUF: libc::c_int = 64 << 10;
/// The source migrates once this many request bytes wait in its receive queue.
pub const INQ_BEFORE_MIGRATE: usize = 64 << 10;
/// The source socket's `SO_SNDBUF` (the kernel doubles it): a quarter of the
/// response. Fixed because autotuning may grow it to `tcp_wmem` max (4 MiB on 6.x
/// kernels), which would take the whole response.
pub const SOURCE_SNDBUF: libc::c_int = (BIG_BYTES / 8) as libc::c_int;

/// Pattern stream of the `GET /big` response.
pub const SEED_RESPONSE: u64 = 1;
/// Pattern stream of the POST body.
pub const SEED_POST: u64 = 2;

/// A client socket with a [`CLIENT_RCVBUF`] receive buffer, connected to `addr`.
pub fn connect_small_rcvbuf(addr: SocketAddr) -> TcpStream {
    connect_with_rcvbuf(addr, CLIENT_RCVBUF).unwrap_or_else(|e| panic!("connect {addr}: {e}"))
}

/// Reads request headers one byte at a time (so nothing after them leaves the
/// kernel's receive queue); returns the request line and Content-Length.
pub fn read_head_unbuffered(s: &mut TcpStream) -> io::Result<(String, usize)> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b)?;
        head.push(b[0]);
        if head.len() > HEAD_BYTES_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too long"));
        }
    }
    let head = String::from_utf8(head)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "head not UTF-8"))?;
    Ok(parse_head(&head))
}

/// Longest request or response head the kit reads (its own heads are < 200 bytes).
pub const HEAD_BYTES_MAX: usize = 4096;

/// The first line and the Content-Length (0 if none) of a head.
pub fn parse_head(head: &str) -> (String, usize) {
    let line = head.lines().next().unwrap_or_default().to_string();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length").then_some(v)
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (line, len)
}

/// Reads a head from a buffered reader: (first line, headers lower-cased,
/// Content-Length); panics on EOF or a bad header (test code).
pub fn read_head_full(r: &mut impl BufRead) -> (String, Vec<(String, String)>, usize) {
    let mut first = String::new();
    r.read_line(&mut first).expect("first line (reset?)");
    assert!(!first.is_empty(), "EOF before a head");
    let mut headers = Vec::new();
    loop {
        let mut l = String::new();
        let n = r.read_line(&mut l).expect("header line");
        assert!(n > 0, "EOF inside a head");
        if l == "\r\n" {
            break;
        }
        let (k, v) = l.split_once(':').expect("header");
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    let len = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map(|(_, v)| v.parse().expect("content length"))
        .unwrap_or(0);
    (first.trim_end().to_string(), headers, len)
}

/// Reads a head from a buffered reader: (first line, Content-Length).
pub fn read_head(r: &mut impl BufRead) -> (String, usize) {
    let (line, _, len) = read_head_full(r);
    (line, len)
}

/// The `GET /big` body from byte `from` on.
pub fn big_body(from: usize) -> Vec<u8> {
    (from..BIG_BYTES).map(|i| pat(SEED_RESPONSE, i)).collect()
}

/// The server's part after the move: the rest of response 1 (from `big_sent`), then
/// the POST (answered with its digest and mismatch count) and `GET /small`, then
/// wait for the client's close.
pub fn finish_serving(s: TcpStream, big_sent: usize) {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    s.set_write_timeout(Some(AWAIT_MAX)).unwrap();
    let mut w = s.try_clone().unwrap();
    w.write_all(&big_body(big_sent))
        .expect("rest of response 1");
    let mut r = BufReader::with_capacity(64 << 10, s);
    let (line, len) = read_head(&mut r);
    assert!(line.starts_with("POST /upload "), "{line}");
    assert_eq!(len, POST_BYTES);
    let mut buf = vec![0u8; 64 << 10];
    let (mut got, mut bad, mut fnv) = (0usize, 0usize, Fnv::new());
    while got < len {
        let n = r
            .read(&mut buf[..(len - got).min(64 << 10)])
            .expect("POST body");
        assert!(n > 0, "EOF inside the POST body at {got}");
        for (k, &b) in buf[..n].iter().enumerate() {
            if b != pat(SEED_POST, got + k) {
                bad += 1;
            }
        }
        fnv.update(&buf[..n]);
        got += n;
    }
    let body = format!("{:016x} {bad}", fnv.0);
    write!(
        w,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (line, _) = read_head(&mut r);
    assert!(line.starts_with("GET /small "), "{line}");
    w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nsmall")
        .unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).expect("client close");
    assert!(rest.is_empty(), "unexpected bytes after the last request");
}

/// What the client saw.
#[derive(Clone, Copy, Debug)]
pub struct ClientReport {
    /// Longest wait between two reads after the migration signal.
    pub longest_read_wait: Duration,
}

/// Measures the longest gap between calls to [`ReadWaits::note`].
pub struct ReadWaits {
    last: Instant,
    /// The longest gap so far.
    pub longest: Duration,
}

impl Default for ReadWaits {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadWaits {
    /// Starts timing now.
    pub fn new() -> Self {
        Self {
            last: Instant::now(),
            longest: Duration::ZERO,
        }
    }
    /// A read completed.
    pub fn note(&mut self) {
        self.longest = self.longest.max(self.last.elapsed());
        self.last = Instant::now();
    }
}

/// Writes `len` bytes of pattern stream `seed` in 64 KiB chunks.
pub fn write_pattern(w: &mut impl Write, seed: u64, len: usize) -> io::Result<()> {
    let mut chunk = vec![0u8; 64 << 10];
    let mut off = 0;
    while off < len {
        let n = chunk.len().min(len - off);
        super::fill_pat(seed, off, &mut chunk[..n]);
        w.write_all(&chunk[..n])?;
        off += n;
    }
    Ok(())
}

/// Reads a `len`-byte response body from `r`, asserting that byte `i` is
/// `expected(i)` (once, in order: no reset, no early EOF); notes each read in
/// `waits`.
pub fn read_body_checked(
    r: &mut impl Read,
    len: usize,
    expected: impl Fn(usize) -> u8,
    waits: &mut ReadWaits,
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut got = 0;
    while got < len {
        let n = r
            .read(&mut buf[..(len - got).min(64 << 10)])
            .expect("response body (reset?)");
        assert!(n > 0, "EOF inside the response body at {got}");
        for (k, &b) in buf[..n].iter().enumerate() {
            assert_eq!(b, expected(got + k), "response byte {}", got + k);
        }
        got += n;
        waits.note();
    }
}

/// The client: a writer thread sends all requests at once; the reader starts when
/// `migrated` fires (the migration or fall-back is over) and checks every response
/// byte and the server's digest of the POST.
pub fn run_client(addr: SocketAddr, migrated: mpsc::Receiver<()>) -> ClientReport {
    let s = connect_small_rcvbuf(addr);
    s.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    s.set_write_timeout(Some(AWAIT_MAX)).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = thread::spawn(move || {
        w.write_all(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        write!(
            w,
            "POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: {POST_BYTES}\r\n\r\n"
        )
        .unwrap();
        write_pattern(&mut w, SEED_POST, POST_BYTES).expect("POST body write (reset?)");
        w.write_all(b"GET /small HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
    });
    migrated.recv_timeout(AWAIT_MAX).expect("migration signal");
    let mut r = BufReader::with_capacity(64 << 10, s);
    let mut waits = ReadWaits::new();
    let (line, len) = read_head(&mut r);
    waits.note();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    assert_eq!(len, BIG_BYTES);
    read_body_checked(&mut r, len, |i| pat(SEED_RESPONSE, i), &mut waits);
    let (_, len) = read_head(&mut r);
    let mut digest = vec![0u8; len];
    r.read_exact(&mut digest).expect("response 2");
    waits.note();
    let digest = String::from_utf8(digest).unwrap();
    assert_eq!(
        digest,
        format!("{:016x} 0", pattern_digest(SEED_POST, POST_BYTES)),
        "server's POST digest / mismatch count"
    );
    let (_, len) = read_head(&mut r);
    let mut small = vec![0u8; len];
    r.read_exact(&mut small).expect("response 3");
    waits.note();
    assert_eq!(small, b"small");
    writer.join().expect("client writer");
    ClientReport {
        longest_read_wait: waits.longest,
    }
}

/// The source server's part before the move: accept, read `GET /big`, send as much
/// of the answer as the socket takes now (the rest stays with the application), and
/// wait until POST bytes sit in the receive queue. Returns the socket and the body
/// bytes sent.
pub fn source_prefix(listener: &TcpListener) -> (TcpStream, usize) {
    let (mut s, _) = listener.accept().unwrap();
    set_int_opt(&s, libc::SOL_SOCKET, libc::SO_SNDBUF, SOURCE_SNDBUF).expect("SO_SNDBUF");
    let (line, _) = read_head_unbuffered(&mut s).expect("request head");
    assert!(line.starts_with("GET /big "), "{line}");
    s.set_nonblocking(true).unwrap();
    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG_BYTES}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let body = big_body(0);
    let mut big_sent = 0;
    // Bounded: each pass sends bytes or stops (WouldBlock); at most the body.
    while big_sent < body.len() {
        match s.write(&body[big_sent..]) {
            Ok(n) => big_sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("response 1: {e}"),
        }
    }
    assert!(
        big_sent < BIG_BYTES,
        "the client's small window should stop the send"
    );
    s.set_nonblocking(false).unwrap();
    await_cond("POST bytes in the source's receive queue", || {
        inq(&s).expect("FIONREAD") >= INQ_BEFORE_MIGRATE
    });
    (s, big_sent)
}
