//! The source side's window driven by real refusals and notifications (needs
//! CAP_NET_ADMIN for TCP_REPAIR): `cargo test -p farside-specd -- --include-ignored` as
//! root under `flock /tmp/farside-root.lock`.
//!
//! One namespace, no steering: the "server" is a listener whose accept queue the test
//! fills to Q, so every connection reaching the admission listener is migratory; the
//! peer is a [`TargetDaemon`] that refuses everything. The refusal closes the window,
//! the connection falls back to the local server (a relay to a sink), and a
//! notification datagram from the peer reopens the window; one from a stranger does
//! not.
//!
//! `in_kernel_mode_syns_are_diverted_with_no_poller_running`: in a namespace with the
//! sk_lookup program and the server's listener in its map, the program diverts the SYN
//! that finds the server's queue at Q while the poller thread does not wake (counted by
//! its context switches), the poller runs only while the window is closed, the SYN
//! after the queue drained goes to the server, and a closed listener turns the daemon
//! to the poll mode until a server listens again.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use farside_migrate::Handover;
use farside_specd::handoff::{HandOff, Handoff};
use farside_specd::notify;
use farside_specd::source::{Peer, SourceConfig, SourceDaemon};
use farside_specd::steer::NoSteer;
use farside_specd::target::{OfferRules, TargetConfig, TargetDaemon};
use farside_specd::window::WindowConfig;

const AWAIT_MAX: Duration = Duration::from_secs(30);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn await_cond(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < AWAIT_MAX, "timed out awaiting {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
#[ignore = "needs root (TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn refusal_closes_the_window_and_only_a_peers_notification_reopens_it() {
    assert!(is_root(), "needs root");
    // The local server: queue held at Q = 2.
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let _queued: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(server.local_addr().unwrap()).unwrap())
        .collect();
    // Where fallen-back connections go: an echo server behind the relay.
    let sink = TcpListener::bind("127.0.0.1:0").unwrap();
    let sink_addr = sink.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = sink.accept() {
            let mut b = [0u8; 5];
            if s.read_exact(&mut b).is_ok() {
                let _ = s.write_all(&b);
            }
        }
    });
    let peer = TargetDaemon::start(TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        server_port: server.local_addr().unwrap().port(),
        admit_queue_max: 0,
        handoff: Handoff::Relay(sink_addr),
        threads: 1,
        peers: Vec::new(),
        allow: vec![Ipv4Addr::LOCALHOST.into()],
        auth: None,
        offers: OfferRules {
            service_ip: None,
            service_port: server.local_addr().unwrap().port(),
            cluster: Vec::new(),
            loopback: true,
        },
    })
    .unwrap();
    let notify_addr = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let source = SourceDaemon::start(
        SourceConfig {
            accept: "127.0.0.1:0".parse().unwrap(),
            notify: notify_addr,
            window: WindowConfig::new(2, 4),
            server_port: server.local_addr().unwrap().port(),
            steer: None,
            peers: vec![Peer::parse(&format!("daemon={}", peer.addr())).unwrap()],
            migrators: 2,
            poll: Duration::from_millis(1),
            poll_steer: false,
            no_room: Default::default(),
            peer_poll: Duration::from_millis(5),
            handover: Handover::CloseBeforeRestore,
            affinity: None,
            gate_on_peer_load: false,
            auth: None,
            own_backend: None,
        },
        HandOff::new(Handoff::Relay(sink_addr)).unwrap(),
        Box::new(NoSteer),
    )
    .unwrap();
    assert!(source.window().is_open());
    let mut c = TcpStream::connect(source.accept_addr()).unwrap();
    c.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    // Refused by the peer, served here through the fall-back: the echo answers.
    c.write_all(b"hello").unwrap();
    let mut b = [0u8; 5];
    c.read_exact(&mut b)
        .expect("served on the source after the refusal");
    assert_eq!(&b, b"hello");
    await_cond("the window to close", || !source.window().is_open());
    let w = source.window();
    assert_eq!(w.stats().target_refusals, 1);
    assert_eq!(w.stats().closures, 1);
    // A stranger's notification (wrong source address) is ignored.
    let stranger = UdpSocket::bind("127.0.0.2:0").unwrap();
    stranger.send_to(&notify::encode(), notify_addr).unwrap();
    // A malformed one from the peer's address too.
    let from_peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    from_peer.send_to(b"FSNT\x09\x01", notify_addr).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(!source.window().is_open(), "reopened by a bad notification");
    // The peer's notification reopens it.
    notify::send(&from_peer, notify_addr).unwrap();
    await_cond("the window to reopen", || source.window().is_open());
    assert_eq!(source.window().stats().reopened_by_notification, 1);
    assert_eq!(
        source
            .stats()
            .notifications
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let summary = source.summary_json();
    eprintln!("source: {summary}");
    assert!(
        summary.contains("\"close\"]") && summary.contains("\"open_notify\"]"),
        "window transitions over time in the summary"
    );
    // Every key holds what its name says (the format's arguments are positional).
    let v: serde_json::Value = serde_json::from_str(&summary).expect("summary is JSON");
    for k in [
        "migration_us",
        "dump_us",
        "cpu_us",
        "queue_wait_us",
        "offer_us",
        "restore_us",
        "flow_us",
        "admit_to_done_us",
    ] {
        assert!(v[k]["count"].is_u64(), "{k} is a sample set: {}", v[k]);
    }
    for k in [
        "accepted",
        "stale_local",
        "migrated",
        "fell_back",
        "lost",
        "local_handoff_failed",
        "no_peer_room",
        "affinity_hashed",
    ] {
        assert!(v[k].is_u64(), "{k} is a count: {}", v[k]);
    }
    assert!(v["fallbacks"]["refused"].is_u64(), "{}", v["fallbacks"]);
    for k in [
        "closures",
        "reopened_by_notification",
        "reopened_by_service",
        "reopened_by_peer_load",
    ] {
        assert!(v["window"][k].is_u64(), "window.{k}: {}", v["window"]);
    }
    assert!(v["peers"].is_array(), "{}", v["peers"]);
    assert_eq!(v["steer_mode"], "none", "no sk_lookup program");
    // The refused connection went to the local server (relay: never queued).
    let h = &v["local_handoff"];
    assert!(h["handed"].as_u64() >= Some(1), "{h}");
    assert_eq!(v["local_handoff_failed"], 0, "{h}");
    assert!(h["wait_us"]["count"].is_u64(), "{h}");
    source.stop();
    peer.stop();
}

/// Voluntary plus involuntary context switches of the daemon's poller thread in the
/// network namespace `netns` (its `/proc/self/task/*/ns/net` link): each wake-up is one.
/// Awaits the thread's name (a new thread carries its creator's until it runs).
fn poller_switches(netns: &std::path::Path) -> u64 {
    let t0 = Instant::now();
    loop {
        match try_poller_switches(netns) {
            Ok(n) => return n,
            Err(e) if t0.elapsed() > AWAIT_MAX => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

fn try_poller_switches(netns: &std::path::Path) -> Result<u64, String> {
    let want = std::fs::read_link(netns).unwrap();
    let mut found = None;
    let mut seen = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        seen.push(format!(
            "{} {:?}",
            comm.trim(),
            std::fs::read_link(t.path().join("ns/net"))
        ));
        if comm.trim() != "specd-poll"
            || std::fs::read_link(t.path().join("ns/net")).ok().as_ref() != Some(&want)
        {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).unwrap();
        let n: u64 = status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
            .sum();
        assert!(found.is_none(), "one poller in the namespace");
        found = Some(n);
    }
    found.ok_or_else(|| format!("no poller thread in {want:?} among {seen:?}"))
}

struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

#[test]
#[ignore = "needs root (netns, BPF, TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn in_kernel_mode_syns_are_diverted_with_no_poller_running() {
    use std::os::fd::AsRawFd;
    assert!(is_root(), "needs root");
    let ns = Ns(format!("ks{}", std::process::id() % 100_000));
    for args in [
        vec!["netns", "add", &ns.0],
        vec!["-n", &ns.0, "link", "set", "lo", "up"],
        vec!["-n", &ns.0, "addr", "add", "10.79.1.100/32", "dev", "lo"],
    ] {
        let st = std::process::Command::new("ip")
            .args(&args)
            .status()
            .unwrap();
        assert!(st.success(), "ip {args:?}");
    }
    let f = std::fs::File::open(format!("/run/netns/{}", ns.0)).unwrap();
    let th = std::thread::spawn(move || {
        // SAFETY: setns on an open netns fd; affects only this thread (and the
        // daemon's threads it starts).
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
        let netns = std::path::PathBuf::from("/proc/thread-self/ns/net");
        const VIP: &str = "10.79.1.100:8080";
        let server = TcpListener::bind(VIP).unwrap();
        let mut queue = farside_specd::load::ServerQueue::new(8080).unwrap();
        let sink = TcpListener::bind("127.0.0.1:0").unwrap();
        let sink_addr = sink.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = sink.accept() {
                let mut b = [0u8; 5];
                if s.read_exact(&mut b).is_ok() {
                    let _ = s.write_all(&b);
                }
            }
        });
        // A peer that refuses every offer: the diverted connection falls back here.
        let peer = TargetDaemon::start(TargetConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            server_port: 8080,
            admit_queue_max: 0,
            handoff: Handoff::Relay(sink_addr),
            threads: 1,
            peers: Vec::new(),
            allow: vec![Ipv4Addr::LOCALHOST.into()],
            auth: None,
            offers: OfferRules {
                service_ip: None,
                service_port: 8080,
                cluster: Vec::new(),
                loopback: true,
            },
        })
        .unwrap();
        let notify_addr = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let source = SourceDaemon::start(
            SourceConfig {
                accept: "127.0.0.1:0".parse().unwrap(),
                notify: notify_addr,
                window: WindowConfig::new(2, 4),
                server_port: 8080,
                steer: Some((Some("10.79.1.100".parse().unwrap()), 8080)),
                peers: vec![Peer::parse(&format!("daemon={}", peer.addr())).unwrap()],
                migrators: 2,
                // 1 ms polls: a poller that ran would wake ~100 times below.
                poll: Duration::from_millis(1),
                poll_steer: false,
                no_room: Default::default(),
                peer_poll: Duration::from_millis(5),
                handover: Handover::CloseBeforeRestore,
                affinity: None,
                gate_on_peer_load: false,
                auth: None,
                own_backend: None,
            },
            HandOff::new(Handoff::Relay(sink_addr)).unwrap(),
            Box::new(NoSteer),
        )
        .unwrap();
        let summary = || -> serde_json::Value {
            serde_json::from_str(&source.summary_json()).expect("summary is JSON")
        };
        assert_eq!(summary()["steer_mode"], "kernel");
        // The server's queue fills to Q while the window is open: the poller sleeps.
        let (s0, t0) = (poller_switches(&netns), Instant::now());
        let held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(VIP).unwrap()).collect();
        await_cond("the server's queue at Q", || queue.read().unwrap() == 2);
        std::thread::sleep(Duration::from_millis(100));
        let woke = poller_switches(&netns) - s0;
        // Only the listener check (every second) wakes it; a 1 ms poll would have
        // woken it 100 times.
        let checks = t0.elapsed().as_secs() + 1;
        assert!(
            woke <= checks,
            "the poller woke {woke} times with the window open ({checks} checks)"
        );
        // At Q: the program diverts; the peer refuses; the connection is served here.
        let mut c = TcpStream::connect(VIP).unwrap();
        c.set_read_timeout(Some(AWAIT_MAX)).unwrap();
        c.write_all(b"hello").unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).expect("served after the refusal");
        assert_eq!(&b, b"hello");
        let v = summary();
        assert_eq!(v["steer"]["daemon"], 1, "{v}");
        assert_eq!(v["steer"]["server"], 2, "{v}");
        // The window closed: now the poller counts locally served requests.
        await_cond("the window to close", || !source.window().is_open());
        let s1 = poller_switches(&netns);
        await_cond("the poller to run", || poller_switches(&netns) > s1 + 5);
        notify::send(&UdpSocket::bind("127.0.0.1:0").unwrap(), notify_addr).unwrap();
        await_cond("the window to reopen", || source.window().is_open());
        // The server drains its queue: the next SYN is its own.
        drop(held);
        server.set_nonblocking(true).unwrap();
        let mut n = 0;
        await_cond("the queue drained", || {
            if server.accept().is_ok() {
                n += 1;
            }
            n == 2
        });
        let _d = TcpStream::connect(VIP).unwrap();
        await_cond("the server's SYN", || server.accept().is_ok());
        let v = summary();
        assert_eq!(v["steer"]["server"], 3, "{v}");
        assert_eq!(v["steer"]["daemon"], 1, "{v}");
        // The server closes its listener: the daemon falls back to polling within the
        // listener check, and takes the new listener of a restarted server.
        drop(server);
        await_cond("the poll mode", || summary()["steer_mode"] == "poll");
        let server = TcpListener::bind(VIP).unwrap();
        await_cond("the kernel mode again", || {
            summary()["steer_mode"] == "kernel"
        });
        drop(server);
        source.stop();
        peer.stop();
    });
    th.join().expect("kernel-mode source");
}
