//! The sk_lookup steering program alone (needs root: netns, BPF): in a fresh network
//! namespace, SYNs for VIP:port reach the server's listener while divert is off and
//! the daemon's listener while it is on; other ports are never touched. In kernel
//! mode the program decides from the server's accept queue itself (no poll, no divert
//! flag): half-open connections count toward Q, a SYN at Q without room is dropped
//! silently (the client's retransmission gets in once there is room), half-open
//! connections alone never make it drop; and a server that closes its listener closes
//! it (the map holds no descriptor): the port refuses instead of queueing into a dead
//! listener.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use farside_specd::load::{server_listener, ServerQueue};
use farside_specd::steer::{
    Mode, NoRoom, Steering, CNT_DAEMON, CNT_DROPPED, CNT_FULL_PASSED, CNT_HALF_OPEN, CNT_NO_SERVER,
    CNT_SERVER,
};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

fn accepts(l: &TcpListener) -> bool {
    l.set_nonblocking(true).unwrap();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if l.accept().is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// A fresh network namespace with 10.79.0.100 on its loopback, deleted on drop.
fn netns(tag: &str) -> (Ns, std::fs::File) {
    let ns = Ns(format!("{tag}{}", std::process::id() % 100_000));
    let run = |args: &[&str]| {
        let st = std::process::Command::new("ip")
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "ip {args:?}");
    };
    run(&["netns", "add", &ns.0]);
    run(&["-n", &ns.0, "link", "set", "lo", "up"]);
    run(&["-n", &ns.0, "addr", "add", "10.79.0.100/32", "dev", "lo"]);
    let f = std::fs::File::open(format!("/run/netns/{}", ns.0)).unwrap();
    (ns, f)
}

fn enter(f: &std::fs::File) {
    // SAFETY: setns on an open netns fd; affects only this thread.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns: {}", io::Error::last_os_error());
}

fn await_cond(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "timed out awaiting {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
#[ignore = "needs root (netns, BPF): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn in_kernel_mode_the_program_diverts_from_the_servers_queue() {
    assert!(is_root(), "needs root");
    let (_ns, f) = netns("sk");
    let th = std::thread::spawn(move || {
        enter(&f);
        const Q: u32 = 2;
        let server = TcpListener::bind("10.79.0.100:8080").unwrap();
        let daemon = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut queue = ServerQueue::new(8080).unwrap();
        let mut st =
            Steering::attach(Some("10.79.0.100".parse().unwrap()), 8080, &daemon).expect("attach");
        {
            // Taken from its owner (this process) as specd takes nginx's; our copy is
            // closed right away: the map holds the socket, not a descriptor.
            let (fd, owner) = server_listener(8080).unwrap();
            assert_eq!(owner.pid, std::process::id());
            st.use_server_listener(std::os::fd::AsFd::as_fd(&fd), Q, NoRoom::Drop)
                .expect("the server's listener in the map");
        }
        assert_eq!(st.mode(), Mode::Kernel);
        let live = st.live();
        live.set_room(true);
        // Below Q: the server, whatever the divert flag (poll mode's) would say.
        let mut held = Vec::new();
        for i in 0..Q {
            held.push(TcpStream::connect("10.79.0.100:8080").unwrap());
            await_cond("the server's queue to grow", || {
                queue.read().unwrap() == i + 1
            });
        }
        assert_eq!(st.counters().unwrap()[CNT_SERVER], u64::from(Q));
        assert_eq!(
            live.backlog(),
            Q - 1,
            "the backlog the program saw at the last SYN"
        );
        // At Q, with room: the daemon, decided by the program alone.
        let _c = TcpStream::connect("10.79.0.100:8080").unwrap();
        assert!(accepts(&daemon), "queue at Q: the daemon");
        assert_eq!(live.backlog(), Q, "published for the acceptor");
        assert_eq!(st.counters().unwrap()[CNT_DAEMON], 1);
        // At Q without room (window closed): the SYN is dropped silently at the
        // refusal listener, not queued at the server nor reset; the client's
        // retransmission (1 s later) finds room and goes to the daemon.
        assert_eq!(st.refusal(), Ok(()), "the refusal listener in the map");
        live.set_room(false);
        let late = std::thread::spawn(|| {
            TcpStream::connect_timeout(
                &"10.79.0.100:8080".parse().unwrap(),
                Duration::from_secs(10),
            )
        });
        await_cond("the SYN to be dropped", || {
            st.counters().unwrap()[CNT_DROPPED] >= 1
        });
        assert_eq!(
            queue.read().unwrap(),
            Q,
            "nothing queued past Q at the server"
        );
        assert_eq!(st.counters().unwrap()[CNT_SERVER], u64::from(Q));
        live.set_room(true);
        let _late = late.join().unwrap().expect("the retransmitted SYN gets in");
        assert!(accepts(&daemon), "the retransmitted SYN: the daemon");
        let dropped = st.counters().unwrap()[CNT_DROPPED];
        // The server drains its queue: the next SYN goes to it again.
        server.set_nonblocking(true).unwrap();
        let mut drained = Vec::new();
        while drained.len() < Q as usize {
            if let Ok((c, _)) = server.accept() {
                drained.push(c);
            }
        }
        let _d = TcpStream::connect("10.79.0.100:8080").unwrap();
        assert!(accepts(&server), "queue drained: the server");
        let c = st.counters().unwrap();
        eprintln!("counters {c:?}, seen {}", live.seen());
        assert_eq!((c[CNT_SERVER], c[CNT_DAEMON]), (u64::from(Q) + 1, 2));
        assert_eq!(
            live.seen(),
            u64::from(Q) + 3 + dropped,
            "the backlog read at every SYN"
        );
        // The server closes its listener: nothing of ours keeps it open, the kernel
        // drops it from the map, and the port refuses rather than queueing into a
        // listener nobody accepts from.
        assert!(st.server_listener_present().unwrap());
        drop(server);
        // Awaited, not asserted at once: a child another test thread forks at this
        // moment holds a copy of the descriptor until it execs, and the socket (with
        // its map entry) goes when the last copy closes.
        await_cond("the closed listener to leave the map", || {
            !st.server_listener_present().unwrap()
        });
        let e = TcpStream::connect("10.79.0.100:8080").expect_err("nobody listens");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        assert_eq!(st.counters().unwrap()[CNT_NO_SERVER], 1);
        // A new server: back to the kernel's own lookup until the daemon takes it.
        let server2 = TcpListener::bind("10.79.0.100:8080").unwrap();
        let _e = TcpStream::connect("10.79.0.100:8080").unwrap();
        assert!(accepts(&server2), "a restarted server gets its SYNs");
        st.use_polling().unwrap();
        assert_eq!(st.mode(), Mode::Poll);
    });
    th.join().expect("kernel-mode steering");
}

#[test]
#[ignore = "needs root (netns, BPF): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn half_open_connections_count_toward_q_but_never_make_the_program_drop() {
    assert!(is_root(), "needs root");
    // nft keeps the handshakes half-open (drops the clients' final ACKs).
    if !farside_testkit::tool_or_skip(
        "half_open_connections_count_toward_q_but_never_make_the_program_drop",
        "nft",
        "--version",
        "nftables",
    ) {
        return;
    }
    let (_ns, f) = netns("ho");
    let th = std::thread::spawn(move || {
        enter(&f);
        const Q: u32 = 2;
        // The clients' final ACKs to the service never arrive: every connection stays
        // half-open at the listener it was assigned to (a request sock), as a burst's
        // are until their handshakes finish, and as a SYN flood's spoofed ones stay.
        let ruled = std::process::Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                let rules = "table inet farside_half_open {\n chain out {\n  type filter hook output priority 0;\n  tcp dport 8080 tcp flags & (syn | ack) == ack drop\n }\n}\n";
                c.stdin.take().unwrap().write_all(rules.as_bytes())?;
                c.wait()
            })
            .unwrap();
        assert!(ruled.success(), "nft rules in the test's namespace");
        let _server = TcpListener::bind("10.79.0.100:8080").unwrap();
        let daemon = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut queue = ServerQueue::new(8080).unwrap();
        let mut st =
            Steering::attach(Some("10.79.0.100".parse().unwrap()), 8080, &daemon).expect("attach");
        {
            let (fd, _) = server_listener(8080).unwrap();
            st.use_server_listener(std::os::fd::AsFd::as_fd(&fd), Q, NoRoom::Drop)
                .expect("the server's listener in the map");
        }
        let live = st.live();
        live.set_room(true);
        // Q half-open connections at the server (the client's side completes).
        let mut held = Vec::new();
        for _ in 0..Q {
            held.push(TcpStream::connect("10.79.0.100:8080").unwrap());
        }
        assert_eq!(queue.read().unwrap(), 0, "none established at the server");
        assert_eq!(st.counters().unwrap()[CNT_SERVER], u64::from(Q));
        // The next SYN: 0 established + Q half-open = Q: the daemon.
        held.push(TcpStream::connect("10.79.0.100:8080").unwrap());
        let c = st.counters().unwrap();
        assert_eq!((live.backlog(), live.half_open()), (0, Q), "{c:?}");
        assert_eq!((c[CNT_DAEMON], c[CNT_HALF_OPEN]), (1, 1), "{c:?}");
        // Without room: half-open ones alone (a SYN flood's) never make it drop; the
        // SYN goes to the server, counted as passed past Q.
        live.set_room(false);
        held.push(TcpStream::connect("10.79.0.100:8080").unwrap());
        let c = st.counters().unwrap();
        assert_eq!(
            (c[CNT_SERVER], c[CNT_DROPPED], c[CNT_FULL_PASSED]),
            (u64::from(Q) + 1, 0, 1),
            "{c:?}"
        );
        assert!(live.half_open() >= Q);
    });
    th.join().expect("half-open connections");
}

#[test]
#[ignore = "needs root (netns, BPF): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn syns_go_to_the_daemon_only_while_divert_is_on() {
    divert_flag_steers(true);
}

#[test]
#[ignore = "needs root (netns, BPF): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn the_program_without_the_kernel_mode_steers_by_the_flag() {
    divert_flag_steers(false);
}

/// The poll mode: the daemon's flag decides. `kernel_mode`: which program is
/// attached (`steer`, or `steer_poll`, which cannot take the kernel mode).
fn divert_flag_steers(kernel_mode: bool) {
    assert!(is_root(), "needs root");
    let (_ns, f) = netns(&format!("st{}", u8::from(kernel_mode)));
    let th = std::thread::spawn(move || {
        // SAFETY: setns on an open netns fd; affects only this thread.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", io::Error::last_os_error());
        let server = TcpListener::bind("10.79.0.100:8080").unwrap();
        let other = TcpListener::bind("10.79.0.100:8081").unwrap();
        let daemon = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut st = Steering::attach_with(
            Some("10.79.0.100".parse().unwrap()),
            8080,
            &daemon,
            kernel_mode,
        )
        .expect("attach");
        if !kernel_mode {
            let e = st
                .use_server_listener(std::os::fd::AsFd::as_fd(&server), 1, NoRoom::Queue)
                .expect_err("steer_poll has no kernel mode");
            assert!(e.to_string().contains("--poll-steer"), "{e}");
            assert_eq!(st.mode(), Mode::Poll);
        }
        let _c1 = TcpStream::connect("10.79.0.100:8080").unwrap();
        assert!(accepts(&server), "divert off: the server");
        st.set_divert(true).unwrap();
        let _c2 = TcpStream::connect("10.79.0.100:8080").unwrap();
        let to_daemon = accepts(&daemon);
        let _c3 = TcpStream::connect("10.79.0.100:8081").unwrap();
        assert!(accepts(&other), "other ports untouched");
        let c = st.counters().unwrap();
        eprintln!("counters {c:?}");
        assert!(to_daemon, "divert on: the daemon");
        assert_eq!((c[CNT_SERVER], c[CNT_DAEMON]), (1, 1));
        st.set_divert(false).unwrap();
        let _c4 = TcpStream::connect("10.79.0.100:8080").unwrap();
        assert!(accepts(&server), "divert off again: the server");
    });
    th.join().expect("steering");
}
