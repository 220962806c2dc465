//! Live migration of a real connection on loopback (needs CAP_NET_ADMIN for
//! TCP_REPAIR): run as root with `cargo test -p farside-migrate -- --include-ignored`.
//!
//! Every scenario runs the same HTTP/1.1 keep-alive session: the client sends
//! `GET /big` (a 4 MiB response), then at once a `POST` with an 8 MiB body, then
//! `GET /small`. The source server answers the GET only partly (the client's small
//! receive buffer leaves unsent and unacknowledged bytes in the send queue), waits
//! until POST bytes sit in its receive queue, and migrates while the client keeps
//! sending. Whoever ends up with the connection (target, or source after a
//! fall-back) finishes the response and serves the rest. The client checks every
//! response byte against the pattern, the server every POST byte, both compare
//! digests; no read may fail (no reset) and no read may wait longer than
//! [`STALL_MAX`].
//!
//! Same network namespace: the target's restore would collide with the source's
//! 4-tuple, so the successful path uses `Handover::CloseBeforeRestore` (source closed
//! silently after the dump, before COMMIT).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use farside_migrate::{
    freeze_and_dump, migrate, migrate_with, wire, DumpError, Fallback, Handover, MigrateConfig,
    Outcome, Target, TargetOutcome,
};

/// Longest a client read may wait once the migration is over: one retransmission
/// timeout (200 ms minimum, backed off while frozen) plus slack for this busy,
/// shared machine (builds run at idle priority next to the lead's measurements).
const STALL_MAX: Duration = Duration::from_secs(5);
/// Bound on any await in these tests (a hang is a failure, not a wait).
const AWAIT_MAX: Duration = Duration::from_secs(60);
/// Response to `GET /big`.
const BIG_BYTES: usize = 4 << 20;
/// POST body.
const POST_BYTES: usize = 8 << 20;
/// Client receive buffer: small, so the server's send queue keeps unsent bytes.
const CLIENT_RCVBUF: libc::c_int = 64 << 10;
/// The source migrates once this many request bytes wait in its receive queue.
const INQ_BEFORE_MIGRATE: usize = 64 << 10;

const SEED_RESPONSE: u64 = 1;
const SEED_POST: u64 = 2;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Byte `i` of the pattern stream `seed`.
fn pat(seed: u64, i: usize) -> u8 {
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
struct Fnv(u64);
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

fn pattern_digest(seed: u64, len: usize) -> u64 {
    let mut f = Fnv::new();
    for i in 0..len {
        f.update(&[pat(seed, i)]);
    }
    f.0
}

/// A client socket whose receive buffer is set before connecting.
fn connect_small_rcvbuf(addr: SocketAddr) -> TcpStream {
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

/// The source socket's `SO_SNDBUF` (the kernel doubles it): a quarter of the response.
const SOURCE_SNDBUF: libc::c_int = (BIG_BYTES / 8) as libc::c_int;

fn set_int_opt(s: &TcpStream, opt: libc::c_int, v: libc::c_int) {
    // SAFETY: setsockopt with an int of the length passed.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&v as *const libc::c_int).cast(),
            4,
        )
    };
    assert_eq!(r, 0, "setsockopt: {}", io::Error::last_os_error());
}

fn inq(s: &TcpStream) -> usize {
    let mut v: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut v) };
    assert_eq!(r, 0);
    v as usize
}

fn await_cond(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < AWAIT_MAX, "timed out awaiting {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Reads request headers one byte at a time (so nothing after them leaves the
/// kernel's receive queue); returns the request line and Content-Length.
fn read_head_unbuffered(s: &mut TcpStream) -> (String, usize) {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).expect("request head");
        head.push(b[0]);
    }
    parse_head(&String::from_utf8(head).expect("utf-8 head"))
}

fn parse_head(head: &str) -> (String, usize) {
    let line = head.lines().next().unwrap_or_default().to_string();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map(|v| v.trim().parse().expect("content length"))
        .unwrap_or(0);
    (line, len)
}

fn read_head(r: &mut impl BufRead) -> (String, usize) {
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

fn big_body(from: usize) -> Vec<u8> {
    (from..BIG_BYTES).map(|i| pat(SEED_RESPONSE, i)).collect()
}

/// The server's part after the move: the rest of response 1, then the POST and
/// `GET /small`, then wait for the client's close.
fn finish_serving(s: TcpStream, big_sent: usize) {
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
struct ClientReport {
    longest_read_wait: Duration,
}

/// The client: writer thread sends all requests at once; the reader starts when the
/// migration (or fall-back) is over and checks every response byte.
fn run_client(addr: SocketAddr, migrated: mpsc::Receiver<()>) -> ClientReport {
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

/// How the target behaves.
enum TargetKind {
    /// `farside_migrate::Target`, admitting everything.
    Real,
    /// `Target`, admitting everything, but the source's front-end flow update fails.
    RealFlowUpdateLost,
    /// `Target`, refusing.
    Refusing,
    /// Reads the OFFER header and part of its payload, then dies.
    DiesDuringOffer,
    /// Accepts, reads COMMIT, then dies without an answer.
    DiesAfterCommit,
}

/// Runs the session through one migration attempt; returns the source's outcome
/// (with the socket moved out) and the client's report.
fn scenario(kind: TargetKind, handover: Handover) -> (Result<(), Fallback>, ClientReport) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (to_target_server, target_server_rx) = mpsc::channel::<TcpStream>();
    let target = Target::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let target_addr = target.local_addr().unwrap();
    let flow_lost = matches!(kind, TargetKind::RealFlowUpdateLost);
    let target_thread = thread::spawn(move || match kind {
        TargetKind::Real | TargetKind::RealFlowUpdateLost => Some(
            target
                .serve_one(|_| Ok(()), |s| to_target_server.send(s).unwrap())
                .unwrap(),
        ),
        TargetKind::Refusing => Some(
            target
                .serve_one(|_| Err("window closed".into()), |_| unreachable!())
                .unwrap(),
        ),
        TargetKind::DiesDuringOffer => {
            let listener = target_listener(target);
            let (mut c, _) = listener.accept().unwrap();
            let mut part = [0u8; wire::HEADER_BYTES + 16];
            c.read_exact(&mut part).unwrap();
            drop(c); // dies mid-transfer
            None
        }
        TargetKind::DiesAfterCommit => {
            let listener = target_listener(target);
            let (mut c, _) = listener.accept().unwrap();
            assert!(matches!(
                wire::read_message(&mut c).unwrap(),
                wire::Message::Offer(_)
            ));
            wire::write_message(&mut c, &wire::Message::Accept).unwrap();
            assert_eq!(wire::read_message(&mut c).unwrap(), wire::Message::Commit);
            drop(c);
            None
        }
    });
    let (signal, migrated) = mpsc::channel();
    let client = thread::spawn(move || run_client(addr, migrated));

    let (s, big_sent) = source_prefix(&listener);

    let cfg = MigrateConfig {
        handover,
        ..MigrateConfig::default()
    };
    let outcome = migrate_with(s, target_addr, &cfg, || {
        if flow_lost {
            Err(io::Error::other("front-end map update lost"))
        } else {
            Ok(())
        }
    });
    let result = match outcome {
        Outcome::Migrated(t) => {
            eprintln!(
                "migrated: dump {:?}, total {:?}, {} queued bytes shipped",
                t.dump, t.total, t.state_bytes
            );
            signal.send(()).unwrap();
            let restored = target_server_rx.recv_timeout(AWAIT_MAX).expect("handoff");
            finish_serving(restored, big_sent);
            Ok(())
        }
        Outcome::ResumedOnSource { sock, reason } => {
            eprintln!("resumed on source: {reason:?}");
            signal.send(()).unwrap();
            finish_serving(sock, big_sent);
            Err(reason)
        }
        Outcome::Lost(e) => panic!("connection lost: {e}"),
    };
    let report = client.join().expect("client");
    let target_outcome = target_thread.join().expect("target");
    eprintln!(
        "target: {target_outcome:?}; client's longest read wait {:?}",
        report.longest_read_wait
    );
    assert!(
        report.longest_read_wait < STALL_MAX,
        "client stalled {:?}",
        report.longest_read_wait
    );
    (result, report)
}

/// The source server's part before the move: read `GET /big`, send as much of the
/// answer as the socket takes now (the rest stays with the application), and wait
/// until POST bytes sit in the receive queue. Returns the socket and the body bytes
/// sent.
fn source_prefix(listener: &TcpListener) -> (TcpStream, usize) {
    let (mut s, _) = listener.accept().unwrap();
    // A fixed send buffer well below the response: autotuning may grow it to
    // `tcp_wmem` max (4 MiB on 6.x kernels), which would take the whole response.
    set_int_opt(&s, libc::SO_SNDBUF, SOURCE_SNDBUF);
    let (line, _) = read_head_unbuffered(&mut s);
    assert!(line.starts_with("GET /big "), "{line}");
    // Answer as much as the socket takes now; the rest stays with the application.
    s.set_nonblocking(true).unwrap();
    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG_BYTES}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let body = big_body(0);
    let mut big_sent = 0;
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
        inq(&s) >= INQ_BEFORE_MIGRATE
    });
    (s, big_sent)
}

/// The raw listener inside a `Target` for the fake targets (rebinding its port).
fn target_listener(target: Target) -> TcpListener {
    let addr = target.local_addr().unwrap();
    drop(target);
    TcpListener::bind(addr).unwrap()
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn migrated_keepalive_session_with_large_post_arrives_once_in_order() {
    assert!(is_root(), "needs root");
    let (r, _) = scenario(TargetKind::Real, Handover::CloseBeforeRestore);
    assert!(r.is_ok(), "expected a migration, got {r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn refused_migration_completes_on_source() {
    assert!(is_root(), "needs root");
    let (r, _) = scenario(TargetKind::Refusing, Handover::CloseBeforeRestore);
    assert!(
        matches!(r, Err(Fallback::Refused(ref s)) if s == "window closed"),
        "{r:?}"
    );
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn lost_flow_update_completes_on_source() {
    assert!(is_root(), "needs root");
    // The target restored (frozen), the flow could not be moved: ABORT, the target
    // discards its copy, the source restores its dump (it had closed before COMMIT).
    let (r, _) = scenario(TargetKind::RealFlowUpdateLost, Handover::CloseBeforeRestore);
    assert!(matches!(r, Err(Fallback::FlowNotMoved(_))), "{r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn target_dead_during_offer_completes_on_source() {
    assert!(is_root(), "needs root");
    let (r, _) = scenario(TargetKind::DiesDuringOffer, Handover::CloseAfterRestore);
    assert!(matches!(r, Err(Fallback::TargetGone(_))), "{r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn target_dead_after_commit_completes_on_source_from_the_dump() {
    assert!(is_root(), "needs root");
    // The source closed its socket before COMMIT: the fall-back restores the dump.
    let (r, _) = scenario(TargetKind::DiesAfterCommit, Handover::CloseBeforeRestore);
    assert!(matches!(r, Err(Fallback::TargetGone(_))), "{r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn failed_restore_on_target_completes_on_source() {
    assert!(is_root(), "needs root");
    // CloseAfterRestore in one namespace: the source still holds the 4-tuple, so the
    // target's restore fails (address in use) and reports FAILED.
    let (r, _) = scenario(TargetKind::Real, Handover::CloseAfterRestore);
    assert!(matches!(r, Err(Fallback::RestoreFailed(_))), "{r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn unreachable_target_completes_on_source() {
    assert!(is_root(), "needs root");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let mut c = TcpStream::connect(addr).unwrap();
    let (s, _) = listener.accept().unwrap();
    c.write_all(b"hello").unwrap();
    await_cond("request bytes", || inq(&s) == 5);
    let Outcome::ResumedOnSource { mut sock, reason } =
        migrate(s, dead_addr, &MigrateConfig::default())
    else {
        panic!("expected a fall-back");
    };
    assert!(
        matches!(reason, Fallback::TargetUnreachable(_)),
        "{reason:?}"
    );
    assert_resumed_socket_works(&mut sock, &mut c, b"hello");
}

/// After a refusal or fall-back the socket still carries data both ways: the
/// queued bytes `queued` are still there and nothing is duplicated.
fn assert_resumed_socket_works(server: &mut TcpStream, client: &mut TcpStream, queued: &[u8]) {
    server.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    client.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    let mut got = vec![0u8; queued.len()];
    server.read_exact(&mut got).unwrap();
    assert_eq!(got, queued);
    client.write_all(b"more").unwrap();
    let mut more = [0u8; 4];
    server.read_exact(&mut more).unwrap();
    assert_eq!(&more, b"more");
    server.write_all(b"reply").unwrap();
    let mut reply = [0u8; 5];
    client.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"reply");
}

fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (s, _) = listener.accept().unwrap();
    (c, s)
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn socket_not_established_is_refused_and_keeps_working() {
    assert!(is_root(), "needs root");
    let (mut c, mut s) = pair();
    c.write_all(b"last words").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    await_cond("the FIN (CLOSE_WAIT)", || {
        matches!(freeze_and_dump(&s), Err(DumpError::NotEstablished(8)))
    });
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    assert_eq!(all, b"last words");
    s.write_all(b"bye").unwrap();
    let mut bye = [0u8; 3];
    c.read_exact(&mut bye).unwrap();
    assert_eq!(&bye, b"bye");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn urgent_data_is_refused_and_socket_keeps_working() {
    assert!(is_root(), "needs root");
    let (mut c, mut s) = pair();
    c.write_all(b"ab").unwrap();
    // SAFETY: send one byte as urgent data.
    let r = unsafe { libc::send(c.as_raw_fd(), b"u".as_ptr().cast(), 1, libc::MSG_OOB) };
    assert_eq!(r, 1);
    await_cond("the urgent byte", || {
        let mut b = [0u8; 1];
        // SAFETY: peek one urgent byte into a live buffer.
        let r = unsafe {
            libc::recv(
                s.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_OOB | libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        r == 1
    });
    assert!(matches!(freeze_and_dump(&s), Err(DumpError::UrgentData)));
    assert_resumed_socket_works(&mut s, &mut c, b"ab");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn listening_and_udp_sockets_are_refused() {
    assert!(is_root(), "needs root");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    // SAFETY: the duplicate is owned by the TcpStream (a listener viewed as a stream).
    let l = unsafe { TcpStream::from_raw_fd(libc::dup(listener.as_raw_fd())) };
    assert!(matches!(
        freeze_and_dump(&l),
        Err(DumpError::NotEstablished(10))
    ));
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // SAFETY: as above, for a UDP socket.
    let u = unsafe { TcpStream::from_raw_fd(libc::dup(udp.as_raw_fd())) };
    assert!(matches!(freeze_and_dump(&u), Err(DumpError::NotTcp)));
}

/// Three network namespaces for the real move, deleted on drop: client `c`, source
/// back-end `a`, target back-end `b`. The VIP is on both back-ends' loopback; the
/// client reaches it through veth `c-a` until the flow is moved to veth `c-b` (the
/// front-end's flow entry, here a /32 route in the client namespace); `a` and `b`
/// talk over their own veth (the cluster network).
struct Netns {
    r: NsRef,
}

/// The namespaces' names, for the threads; the owning [`Netns`] stays with the test
/// function so its `Drop` runs even when a thread panics and never finishes.
#[derive(Clone)]
struct NsRef {
    tag: String,
}

const VIP: &str = "10.77.0.100";
const CLIENT_IP: &str = "10.77.9.1";
const VIP_PORT: u16 = 8080;

impl NsRef {
    fn ns(&self, which: &str) -> String {
        format!("{}{which}", self.tag)
    }

    fn ip(&self, which: &str, args: &str) {
        let ns = self.ns(which);
        let mut cmd = std::process::Command::new("ip");
        cmd.args(["-n", &ns]).args(args.split_whitespace());
        let st = cmd.status().expect("ip");
        assert!(st.success(), "ip -n {ns} {args}");
    }

    /// Moves the calling thread into namespace `which` (sockets it creates live there).
    fn enter(&self, which: &str) {
        let f = std::fs::File::open(format!("/run/netns/{}", self.ns(which))).expect("netns");
        // SAFETY: setns on an open netns fd; affects only this thread.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", io::Error::last_os_error());
    }
}

impl Netns {
    fn setup() -> Self {
        // Not the lab's `fs…` names; the pid keeps parallel runs apart.
        let guard = Self {
            r: NsRef {
                tag: format!("mg{}", std::process::id() % 100_000),
            },
        };
        let n = guard.r.clone();
        let t = n.tag.clone();
        for w in ["c", "a", "b"] {
            let st = std::process::Command::new("ip")
                .args(["netns", "add", &n.ns(w)])
                .status()
                .expect("ip netns add");
            assert!(st.success());
        }
        let run = |args: String| {
            let st = std::process::Command::new("ip")
                .args(args.split_whitespace())
                .status()
                .expect("ip link add");
            assert!(st.success(), "ip {args}");
        };
        run(format!(
            "link add {t}ca netns {t}c type veth peer name {t}ac netns {t}a"
        ));
        run(format!(
            "link add {t}cb netns {t}c type veth peer name {t}bc netns {t}b"
        ));
        run(format!(
            "link add {t}ab netns {t}a type veth peer name {t}ba netns {t}b"
        ));
        n.ip("c", "link set lo up");
        n.ip("c", &format!("addr add {CLIENT_IP}/32 dev lo"));
        n.ip("c", &format!("link set {t}ca up"));
        n.ip("c", &format!("link set {t}cb up"));
        n.ip(
            "c",
            &format!("route add {VIP}/32 dev {t}ca src {CLIENT_IP}"),
        );
        for (w, to_client, cluster, ip) in [
            ("a", "ac", "ab", "10.77.2.1"),
            ("b", "bc", "ba", "10.77.2.2"),
        ] {
            n.ip(w, "link set lo up");
            n.ip(w, &format!("addr add {VIP}/32 dev lo"));
            n.ip(w, &format!("link set {t}{to_client} up"));
            n.ip(w, &format!("route add {CLIENT_IP}/32 dev {t}{to_client}"));
            n.ip(w, &format!("addr add {ip}/24 dev {t}{cluster}"));
            n.ip(w, &format!("link set {t}{cluster} up"));
        }
        guard
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for w in ["c", "a", "b"] {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.r.ns(w)])
                .status();
        }
    }
}

#[test]
#[ignore = "needs root (netns, TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root under flock /tmp/farside-root.lock"]
fn migrated_across_namespaces_with_flow_moved_after_restore() {
    assert!(is_root(), "needs root");
    let guard = Netns::setup();
    let ns = guard.r.clone();
    let vip: SocketAddr = format!("{VIP}:{VIP_PORT}").parse().unwrap();

    // Target back-end `b`: control listener on the cluster network; the restored
    // connection finishes the session there.
    let (target_addr_tx, target_addr_rx) = mpsc::channel();
    let (big_sent_tx, big_sent_rx) = mpsc::channel::<usize>();
    let nsb = ns.clone();
    let target_thread = thread::spawn(move || {
        nsb.enter("b");
        let target = Target::bind("10.77.2.2:0".parse().unwrap()).unwrap();
        target_addr_tx.send(target.local_addr().unwrap()).unwrap();
        let mut restored = None;
        let outcome = target
            .serve_one(|_| Ok(()), |s| restored = Some(s))
            .unwrap();
        let s = restored.unwrap_or_else(|| panic!("not handed over: {outcome:?}"));
        finish_serving(s, big_sent_rx.recv_timeout(AWAIT_MAX).unwrap());
        outcome
    });
    let target_addr = target_addr_rx.recv_timeout(AWAIT_MAX).unwrap();

    // Source back-end `a`: the service on the VIP.
    let (ready_tx, ready_rx) = mpsc::channel();
    let (signal, migrated) = mpsc::channel();
    let nsa = ns.clone();
    let source_thread = thread::spawn(move || {
        nsa.enter("a");
        let listener = TcpListener::bind(vip).unwrap();
        ready_tx.send(()).unwrap();
        let (s, big_sent) = source_prefix(&listener);
        let cfg = MigrateConfig::default(); // CloseAfterRestore: the deployment's order
        let outcome = migrate_with(s, target_addr, &cfg, || {
            // The front-end flip, after the restore and before the source closes.
            nsa.ip(
                "c",
                &format!("route replace {VIP}/32 dev {}cb src {CLIENT_IP}", nsa.tag),
            );
            Ok(())
        });
        let Outcome::Migrated(t) = outcome else {
            panic!("expected a migration, got {outcome:?}");
        };
        eprintln!(
            "migrated across namespaces: dump {:?}, total {:?}, {} queued bytes",
            t.dump, t.total, t.state_bytes
        );
        big_sent_tx.send(big_sent).unwrap();
        signal.send(()).unwrap();
        // The source's service stays up (its listener still answers on the VIP).
        drop(listener);
    });

    ready_rx.recv_timeout(AWAIT_MAX).unwrap();
    let nsc = ns.clone();
    let client = thread::spawn(move || {
        nsc.enter("c");
        run_client(vip, migrated)
    });
    let report = client.join().expect("client");
    source_thread.join().expect("source");
    let outcome = target_thread.join().expect("target");
    assert!(
        matches!(outcome, TargetOutcome::Restored { .. }),
        "{outcome:?}"
    );
    eprintln!("client's longest read wait {:?}", report.longest_read_wait);
    assert!(report.longest_read_wait < STALL_MAX);
}
