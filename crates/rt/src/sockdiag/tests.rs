//! The sock_diag client against real sockets and against crafted replies.

use super::*;
use std::io::Write;
use std::net::{TcpListener, TcpStream};

#[test]
fn counts_established_backlog_and_pending_on_the_watched_port_only() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let _noise: Vec<_> = (0..3)
        .map(|_| TcpStream::connect(other.local_addr().unwrap()).unwrap())
        .collect();
    let mut d = SockDiag::new(&[port]).unwrap();
    assert_eq!(d.count().unwrap(), ConnCounts::default());

    // Two clients, not accepted: both in the accept queue.
    let mut c1 = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let _c2 = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    assert_eq!(d.count_listen().unwrap(), 2);
    assert_eq!(
        d.count_listen_exact().unwrap(),
        2,
        "exact lookup of the listener agrees"
    );
    let c = d.count().unwrap();
    assert_eq!(c.accept_backlog, 2, "{c:?}");
    assert_eq!(
        c.established, 2,
        "server-side sockets with sport = port: {c:?}"
    );

    // Accept one and leave a request unread on it.
    c1.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let (_s1, _) = l.accept().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let c = d.count().unwrap();
        if c.pending >= 1 {
            assert_eq!(c.accept_backlog, 1);
            assert_eq!(c.established, 2);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pending never seen: {c:?}"
        );
        std::thread::yield_now();
    }
}

/// A netlink message: header (type, seq) and payload, padded to 4 bytes.
fn msg(ty: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let len = (NLMSG_HDR + payload.len()) as u32;
    let mut m = Vec::new();
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(payload);
    while m.len() % 4 != 0 {
        m.push(0);
    }
    m
}

/// An `inet_diag_msg` of `family`/`state` for port 8080 with cookie `cookie`, its
/// receive queue `rqueue`, and attributes `attrs`.
fn diag(family: u8, state: u8, cookie: u64, rqueue: u32, attrs: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; DIAG_MSG];
    p[0] = family;
    p[1] = state;
    p[4..6].copy_from_slice(&8080u16.to_be_bytes());
    p[44..52].copy_from_slice(&cookie.to_ne_bytes());
    p[56..60].copy_from_slice(&rqueue.to_ne_bytes());
    p.extend_from_slice(attrs);
    p
}

/// An INET_DIAG_INFO attribute whose tcp_info says data last arrived `ms` ago.
fn info_attr(ms: u32) -> Vec<u8> {
    let mut a = vec![0u8; 4 + 104];
    let len = a.len() as u16;
    a[0..2].copy_from_slice(&len.to_ne_bytes());
    a[2..4].copy_from_slice(&INET_DIAG_INFO.to_ne_bytes());
    let off = 4 + TCPI_LAST_DATA_RECV_OFFSET;
    a[off..off + 4].copy_from_slice(&ms.to_ne_bytes());
    a
}

const V4: u8 = libc::AF_INET as u8;

fn parse(buf: &[u8]) -> io::Result<(bool, ConnCounts, Vec<[u8; SOCKID]>)> {
    let mut c = ConnCounts::default();
    let mut found = Vec::new();
    let done = parse_dump_batch(buf, 7, V4, &mut c, &mut |id| found.push(id))?;
    Ok((done, c, found))
}

#[test]
fn a_well_formed_dump_is_counted() {
    let mut b = msg(SOCK_DIAG_BY_FAMILY, 7, &diag(V4, TCP_LISTEN, 1, 3, &[]));
    b.extend(msg(
        SOCK_DIAG_BY_FAMILY,
        7,
        &diag(V4, TCP_ESTABLISHED, 2, 0, &info_attr(0)),
    ));
    b.extend(msg(
        SOCK_DIAG_BY_FAMILY,
        7,
        &diag(V4, TCP_ESTABLISHED, 3, 10, &info_attr(40)),
    ));
    let (done, c, found) = parse(&b).unwrap();
    assert!(!done, "no NLMSG_DONE yet");
    assert_eq!(
        c,
        ConnCounts {
            established: 2,
            accept_backlog: 3,
            pending: 1,
            oldest_unread_ms: 40
        }
    );
    assert_eq!(found.len(), 1);
    let (done, _, _) = parse(&msg(NLMSG_DONE, 7, &0i32.to_ne_bytes())).unwrap();
    assert!(done);
}

#[test]
fn a_malformed_or_truncated_dump_is_an_error_never_a_count() {
    let good = msg(SOCK_DIAG_BY_FAMILY, 7, &diag(V4, TCP_LISTEN, 1, 3, &[]));
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated header", good[..10].to_vec()),
        ("truncated message", good[..good.len() - 8].to_vec()),
        (
            "message then a partial header",
            [&good[..], &good[..6]].concat(),
        ),
        (
            "another request's reply",
            msg(SOCK_DIAG_BY_FAMILY, 6, &diag(V4, TCP_LISTEN, 1, 3, &[])),
        ),
        (
            "short inet_diag_msg",
            msg(SOCK_DIAG_BY_FAMILY, 7, &[0u8; DIAG_MSG - 1]),
        ),
        (
            "another family",
            msg(
                SOCK_DIAG_BY_FAMILY,
                7,
                &diag(libc::AF_INET6 as u8, TCP_LISTEN, 1, 3, &[]),
            ),
        ),
        (
            "a state not asked for",
            msg(SOCK_DIAG_BY_FAMILY, 7, &diag(V4, 6, 1, 0, &[])),
        ),
        (
            "a netlink error",
            msg(NLMSG_ERROR, 7, &(-libc::EBUSY).to_ne_bytes()),
        ),
        ("a short error", msg(NLMSG_ERROR, 7, &[0xff, 0xff])),
        (
            "a dump that ended in an error",
            msg(NLMSG_DONE, 7, &(-libc::EINTR).to_ne_bytes()),
        ),
        ("an overrun", msg(4, 7, &[])),
        (
            "unread bytes without tcp_info",
            msg(
                SOCK_DIAG_BY_FAMILY,
                7,
                &diag(V4, TCP_ESTABLISHED, 1, 5, &[]),
            ),
        ),
        (
            "tcp_info cut short",
            msg(
                SOCK_DIAG_BY_FAMILY,
                7,
                &diag(V4, TCP_ESTABLISHED, 1, 5, &{
                    let mut a = info_attr(9)[..40].to_vec();
                    a[0..2].copy_from_slice(&40u16.to_ne_bytes());
                    a
                }),
            ),
        ),
        (
            "attribute longer than the message",
            msg(
                SOCK_DIAG_BY_FAMILY,
                7,
                &diag(V4, TCP_ESTABLISHED, 1, 5, &{
                    let mut a = info_attr(9);
                    a[0..2].copy_from_slice(&500u16.to_ne_bytes());
                    a
                }),
            ),
        ),
    ];
    // A length field below the header size.
    let mut short_len = good.clone();
    short_len[0..4].copy_from_slice(&8u32.to_ne_bytes());
    cases.push(("length below the header", short_len));
    for (what, b) in cases {
        assert!(parse(&b).is_err(), "{what}: {:?}", parse(&b));
    }
}

#[test]
fn an_exact_reply_must_name_the_socket_asked_for() {
    let id = {
        let d = diag(V4, TCP_LISTEN, 42, 0, &[]);
        let id: [u8; SOCKID] = d[4..4 + SOCKID].try_into().unwrap();
        id
    };
    let ok = msg(SOCK_DIAG_BY_FAMILY, 9, &diag(V4, TCP_LISTEN, 42, 5, &[]));
    assert_eq!(parse_exact_reply(&ok, 9, V4, &id).unwrap(), 5);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "another request",
            msg(SOCK_DIAG_BY_FAMILY, 8, &diag(V4, TCP_LISTEN, 42, 5, &[])),
        ),
        (
            "another socket",
            msg(SOCK_DIAG_BY_FAMILY, 9, &diag(V4, TCP_LISTEN, 43, 5, &[])),
        ),
        (
            "another family",
            msg(
                SOCK_DIAG_BY_FAMILY,
                9,
                &diag(libc::AF_INET6 as u8, TCP_LISTEN, 42, 5, &[]),
            ),
        ),
        (
            "not listening",
            msg(
                SOCK_DIAG_BY_FAMILY,
                9,
                &diag(V4, TCP_ESTABLISHED, 42, 5, &[]),
            ),
        ),
        (
            "listener gone",
            msg(NLMSG_ERROR, 9, &(-libc::ENOENT).to_ne_bytes()),
        ),
        (
            "an acknowledgement",
            msg(NLMSG_ERROR, 9, &0i32.to_ne_bytes()),
        ),
        ("two messages", [&ok[..], &ok[..]].concat()),
        ("truncated", ok[..ok.len() - 4].to_vec()),
        ("a dump's end", msg(NLMSG_DONE, 9, &0i32.to_ne_bytes())),
    ];
    for (what, b) in cases {
        let r = parse_exact_reply(&b, 9, V4, &id);
        assert!(r.is_err(), "{what}: {r:?}");
    }
    let gone = msg(NLMSG_ERROR, 9, &(-libc::ENOENT).to_ne_bytes());
    assert_eq!(
        parse_exact_reply(&gone, 9, V4, &id)
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOENT),
        "the kernel's error is passed on"
    );
}

/// Root (a private network namespace, so no other socket of the host is counted):
/// the per-sample exact lookups of every listener (two families on one port, a
/// SO_REUSEPORT pair on another) return the same accept backlog as the full dump,
/// with different numbers of connections queued on each; a closed listener makes
/// the lookup fail (never a smaller number) until a LISTEN dump finds the rest.
#[test]
fn exact_lookups_agree_with_the_full_dump_on_queued_connections() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let _ = writeln!(std::io::stderr(), "skipped: needs root");
        return;
    }
    std::thread::spawn(|| {
        // SAFETY: unshare affects this thread only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let up = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("ip");
        assert!(up.success());
        let v4 = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = v4.local_addr().unwrap().port();
        let v6 = TcpListener::bind(("::1", port)).unwrap();
        let (r1, port2) = reuseport_listener(0);
        let (r2, _) = reuseport_listener(port2);
        // The group spreads connections by hash: accept from either without blocking.
        r1.set_nonblocking(true).unwrap();
        r2.set_nonblocking(true).unwrap();
        let mut d = SockDiag::new(&[port, port2]).unwrap();
        let mut clients = Vec::new();
        for (addr, n) in [
            (v4.local_addr().unwrap(), 3),
            (v6.local_addr().unwrap(), 2),
            (r1.local_addr().unwrap(), 4),
        ] {
            for _ in 0..n {
                clients.push(TcpStream::connect(addr).unwrap());
            }
        }
        let dumped = d.count_listen().unwrap();
        assert_eq!(dumped, 9, "3 + 2 + 4 queued");
        assert_eq!(
            d.listeners.len(),
            4,
            "every listener reached: {:?}",
            d.listeners
        );
        let exact = d.count_listen_exact().unwrap();
        let full = d.count().unwrap();
        assert_eq!((exact, full.accept_backlog), (9, 9));
        assert_eq!(full.established, 9);
        // Accept one from each: every lookup sees its own queue shrink.
        let _a = (v4.accept().unwrap(), v6.accept().unwrap());
        let r_accepted = r1.accept().or_else(|_| r2.accept()).unwrap();
        assert_eq!(d.count_listen_exact().unwrap(), 6);
        assert_eq!(d.count().unwrap().accept_backlog, 6);
        // Closing a listener: its lookup fails, the dump finds the others.
        drop(v6);
        assert!(
            d.count_listen_exact().is_err(),
            "a closed listener is an error"
        );
        let after = d.count_listen().unwrap();
        assert_eq!(after, d.count().unwrap().accept_backlog);
        assert_eq!(d.count_listen_exact().unwrap(), after);
        assert_eq!(d.listeners.len(), 3);
        drop((r_accepted, clients));
    })
    .join()
    .unwrap();
}

/// A listener on 127.0.0.1:`port` with SO_REUSEPORT (port 0: a free one).
fn reuseport_listener(port: u16) -> (TcpListener, u16) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a fresh descriptor we own.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let one: libc::c_int = 1;
        let r = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEPORT,
            (&one as *const libc::c_int).cast(),
            4,
        );
        assert_eq!(r, 0);
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as u16;
        sa.sin_port = port.to_be();
        sa.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let r = libc::bind(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        );
        assert_eq!(r, 0, "bind: {}", io::Error::last_os_error());
        assert_eq!(libc::listen(fd, 128), 0);
        let l = TcpListener::from_raw_fd(fd);
        let port = l.local_addr().unwrap().port();
        (l, port)
    }
}

#[test]
fn the_oldest_unread_request_reports_its_age_and_none_once_read() {
    use std::io::Read;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut d = SockDiag::new(&[port]).unwrap();
    d.count_listen().unwrap();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let sent = std::time::Instant::now();
    // Waits in the accept queue, unread, for at least this long.
    std::thread::sleep(std::time::Duration::from_millis(60));
    let n = d.count().unwrap();
    let waited_ms = sent.elapsed().as_millis() as u64;
    assert_eq!(n.pending, 1, "{n:?}");
    // Kernel-tick resolution (up to 10 ms at HZ=100).
    assert!(
        n.oldest_unread_ms + 10 >= 60 && n.oldest_unread_ms <= waited_ms + 10,
        "age {n:?} after {waited_ms} ms"
    );
    let (mut s, _) = l.accept().unwrap();
    let mut buf = [0u8; 64];
    let _ = s.read(&mut buf).unwrap();
    let n = d.count().unwrap();
    assert_eq!(
        (n.pending, n.oldest_unread_ms),
        (0, 0),
        "read: nothing waits"
    );
}
