//! The HTTP/1.1 keep-alive session of `crates/migrate/tests/migrate_root.rs` (copied:
//! test files of another crate cannot be shared without moving them): `GET /big`
//! (4 MiB, answered partly before the move), an 8 MiB `POST` written during the
//! migration, `GET /small`; every byte checked by pattern and FNV-1a digest, no read
//! may fail or wait longer than [`STALL_MAX`].
#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Longest a client read may wait once the migration is over: one retransmission
/// timeout (200 ms minimum, backed off while frozen) plus slack for this busy,
/// shared machine (builds run at idle priority next to the lead's measurements).
pub const STALL_MAX: Duration = Duration::from_secs(5);
/// Bound on any await in these tests (a hang is a failure, not a wait).
pub const AWAIT_MAX: Duration = Duration::from_secs(60);
/// Response to `GET /big`.
pub const BIG_BYTES: usize = 4 << 20;
/// POST body.
pub const POST_BYTES: usize = 8 << 20;
/// Client receive buffer: small, so the server's send queue keeps unsent bytes.
pub const CLIENT_RCVBUF: libc::c_int = 64 << 10;
/// The source migrates once this many request bytes wait in its receive queue.
pub const INQ_BEFORE_MIGRATE: usize = 64 << 10;

pub const SEED_RESPONSE: u64 = 1;
pub const SEED_POST: u64 = 2;

/// Byte `i` of the pattern stream `seed`.
pub fn pat(seed: u64, i: usize) -> u8 {
    let mut x = (i as u64 / 8).wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> ((i % 8) * 8)) as u8
}

/// FNV-1a, 64 bit: the digest both ends compare.
#[derive(Clone, Copy)]
pub struct Fnv(u64);
impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x100_0000_01b3);
        }
    }
}

pub fn pattern_digest(seed: u64, len: usize) -> u64 {
    let mut f = Fnv::new();
    for i in 0..len {
        f.update(&[pat(seed, i)]);
    }
    f.0
}

/// A client socket whose receive buffer is set before connecting.
pub fn connect_small_rcvbuf(addr: SocketAddr) -> TcpStream {
    // SAFETY: plain socket(2), owned by the TcpStream below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: fresh descriptor.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    // SAFETY: setsockopt with an int of the length passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&CLIENT_RCVBUF as *const libc::c_int).cast(),
            4,
        )
    };
    assert_eq!(r, 0);
    let SocketAddr::V4(a) = addr else {
        panic!("v4 only")
    };
    // SAFETY: zeroed sockaddr_in filled below.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = a.port().to_be();
    sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    // SAFETY: valid sockaddr_in of the length passed.
    let r = unsafe {
        libc::connect(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "connect: {}", io::Error::last_os_error());
    s
}

pub fn inq(s: &TcpStream) -> usize {
    let mut v: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut v) };
    assert_eq!(r, 0);
    v as usize
}

pub fn await_cond(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < AWAIT_MAX, "timed out awaiting {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Reads request headers one byte at a time (so nothing after them leaves the
/// kernel's receive queue); returns the request line and Content-Length.
pub fn read_head_unbuffered(s: &mut TcpStream) -> (String, usize) {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).expect("request head");
        head.push(b[0]);
    }
    parse_head(&String::from_utf8(head).expect("utf-8 head"))
}

pub fn parse_head(head: &str) -> (String, usize) {
    let line = head.lines().next().unwrap_or_default().to_string();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map(|v| v.trim().parse().expect("content length"))
        .unwrap_or(0);
    (line, len)
}

pub fn read_head(r: &mut impl BufRead) -> (String, usize) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line).expect("head line");
        assert!(n > 0, "EOF inside a head");
        head.push_str(&line);
        if line == "\r\n" {
            return parse_head(&head);
        }
    }
}

pub fn big_body(from: usize) -> Vec<u8> {
    (from..BIG_BYTES).map(|i| pat(SEED_RESPONSE, i)).collect()
}

/// The server's part after the move: the rest of response 1, then the POST and
/// `GET /small`, then wait for the client's close.
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
pub struct ClientReport {
    pub longest_read_wait: Duration,
}

/// The client: writer thread sends all requests at once; the reader starts when the
/// migration (or fall-back) is over and checks every response byte.
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
        let mut chunk = vec![0u8; 64 << 10];
        let mut off = 0;
        while off < POST_BYTES {
            let n = chunk.len().min(POST_BYTES - off);
            for (k, b) in chunk[..n].iter_mut().enumerate() {
                *b = pat(SEED_POST, off + k);
            }
            w.write_all(&chunk[..n]).expect("POST body write (reset?)");
            off += n;
        }
        w.write_all(b"GET /small HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
    });
    migrated.recv_timeout(AWAIT_MAX).expect("migration signal");
    let mut r = BufReader::with_capacity(64 << 10, s);
    let mut longest = Duration::ZERO;
    let mut last = Instant::now();
    let mut note = |last: &mut Instant| {
        longest = longest.max(last.elapsed());
        *last = Instant::now();
    };
    let (line, len) = read_head(&mut r);
    note(&mut last);
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    assert_eq!(len, BIG_BYTES);
    let mut buf = vec![0u8; 64 << 10];
    let mut got = 0;
    while got < len {
        let n = r
            .read(&mut buf[..(len - got).min(64 << 10)])
            .expect("response 1 (reset?)");
        assert!(n > 0, "EOF inside response 1 at {got}");
        for (k, &b) in buf[..n].iter().enumerate() {
            assert_eq!(b, pat(SEED_RESPONSE, got + k), "response byte {}", got + k);
        }
        got += n;
        note(&mut last);
    }
    let (_, len) = read_head(&mut r);
    let mut digest = vec![0u8; len];
    r.read_exact(&mut digest).expect("response 2");
    note(&mut last);
    let digest = String::from_utf8(digest).unwrap();
    assert_eq!(
        digest,
        format!("{:016x} 0", pattern_digest(SEED_POST, POST_BYTES)),
        "server's POST digest / mismatch count"
    );
    let (_, len) = read_head(&mut r);
    let mut small = vec![0u8; len];
    r.read_exact(&mut small).expect("response 3");
    note(&mut last);
    assert_eq!(small, b"small");
    writer.join().expect("client writer");
    ClientReport {
        longest_read_wait: longest,
    }
}

/// The source server's part before the move: read `GET /big`, send as much of the
/// answer as the socket takes now (the rest stays with the application), and wait
/// until POST bytes sit in the receive queue. Returns the socket and the body bytes
/// sent.
pub fn source_prefix(listener: &TcpListener) -> (TcpStream, usize) {
    let (mut s, _) = listener.accept().unwrap();
    let (line, _) = read_head_unbuffered(&mut s);
    assert!(line.starts_with("GET /big "), "{line}");
    // Answer as much as the socket takes now; the rest stays with the application.
    s.set_nonblocking(true).unwrap();
    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG_BYTES}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let body = big_body(0);
    let mut big_sent = 0;
    loop {
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
        inq(&s) >= INQ_BEFORE_MIGRATE
    });
    (s, big_sent)
}
