//! When thawing a frozen socket sends a window probe (`TcpExtTCPWinProbe`, counted per
//! network namespace): a restored copy with none of our bytes in flight releases
//! without one (its window is the dumped one; the lab's migrations are all of this
//! kind, and the probe and its answer cost the target node two packets); a copy with
//! sent bytes unacknowledged probes, so the client's answer tells it what the client
//! has; a source resumed after a fall-back probes. Each test runs in a network
//! namespace of its own, so no other test's probes are counted. Needs root:
//! `cargo test -p farside-migrate -- --include-ignored`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use farside_migrate::testkit::{await_within, inq, is_root, private_netns};
use farside_migrate::{close_silently, freeze_and_dump, restore, resume};

/// `TcpExtTCPWinProbe` of the calling thread's network namespace.
fn win_probes() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/net/netstat").expect("netstat");
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let i = names
            .split_whitespace()
            .position(|n| n == "TCPWinProbe")
            .expect("TCPWinProbe in TcpExt");
        return values.split_whitespace().nth(i).unwrap().parse().unwrap();
    }
    panic!("no TcpExt in netstat");
}

/// Probes counted since `before`, once `expect` of them were counted or 200 ms passed,
/// plus a short settle (the probe is sent inside the setsockopt; this catches a late
/// or an extra one).
fn probes_since(before: u64, expect: u64) -> u64 {
    await_within(Duration::from_millis(200), || {
        win_probes() - before >= expect
    });
    std::thread::sleep(Duration::from_millis(20));
    win_probes() - before
}

/// A connection whose server end holds an unread request (the lab's migrations).
fn with_request() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    c.write_all(b"GET /4k HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(await_within(Duration::from_secs(2), || inq(&s).unwrap() > 0));
    (s, c)
}

/// The client drops everything it receives, so what the server sends stays
/// unacknowledged (classic BPF: `ret 0`).
fn client_deaf(c: &TcpStream, deaf: bool) {
    let mut code = [libc::sock_filter {
        code: 0x06, // BPF_RET | BPF_K
        jt: 0,
        jf: 0,
        k: 0,
    }];
    let prog = libc::sock_fprog {
        len: 1,
        filter: code.as_mut_ptr(),
    };
    // SAFETY: a valid one-instruction program, or a detach without an argument.
    let r = unsafe {
        if deaf {
            libc::setsockopt(
                c.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&prog as *const libc::sock_fprog).cast(),
                std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        } else {
            // The value is ignored, but setsockopt wants an int's worth.
            let zero: libc::c_int = 0;
            libc::setsockopt(
                c.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_DETACH_FILTER,
                (&zero as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    assert_eq!(r, 0, "filter: {}", std::io::Error::last_os_error());
}

fn check_works(s: &mut TcpStream, c: &mut TcpStream) {
    let mut req = [0u8; 29];
    s.read_exact(&mut req).unwrap();
    assert_eq!(&req, b"GET /4k HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(b"ok").unwrap();
    let mut got = [0u8; 2];
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ok");
}

#[test]
#[ignore = "needs root (TCP_REPAIR, netns): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn a_restored_copy_with_nothing_in_flight_releases_without_a_window_probe() {
    assert!(is_root(), "needs root");
    private_netns();
    let (s, mut c) = with_request();
    let st = freeze_and_dump(&s).unwrap();
    assert!(st.sent_unacked().is_empty());
    close_silently(s).unwrap();
    let before = win_probes();
    let mut s = restore(&st).unwrap();
    assert_eq!(probes_since(before, 0), 0, "no window probe on release");
    check_works(&mut s, &mut c);
}

#[test]
#[ignore = "needs root (TCP_REPAIR, netns): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn a_restored_copy_with_sent_bytes_in_flight_probes_and_the_client_gets_them() {
    assert!(is_root(), "needs root");
    private_netns();
    let (mut s, mut c) = with_request();
    client_deaf(&c, true);
    s.write_all(b"early").unwrap();
    let st = freeze_and_dump(&s).unwrap();
    assert_eq!(st.sent_unacked(), b"early", "sent, never acknowledged");
    close_silently(s).unwrap();
    client_deaf(&c, false);
    let before = win_probes();
    let mut s = restore(&st).unwrap();
    assert_eq!(probes_since(before, 1), 1, "one window probe on release");
    // The restored retransmission timer resends what the deaf client dropped.
    let mut early = [0u8; 5];
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.read_exact(&mut early).unwrap();
    assert_eq!(&early, b"early");
    check_works(&mut s, &mut c);
}

#[test]
#[ignore = "needs root (TCP_REPAIR, netns): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn a_resumed_source_probes() {
    assert!(is_root(), "needs root");
    private_netns();
    let (mut s, mut c) = with_request();
    let st = freeze_and_dump(&s).unwrap();
    let before = win_probes();
    resume(&s, &st).unwrap();
    assert_eq!(probes_since(before, 1), 1, "one window probe on resume");
    check_works(&mut s, &mut c);
}
