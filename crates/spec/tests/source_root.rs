//! The source side's window driven by real refusals and notifications (needs
//! CAP_NET_ADMIN for TCP_REPAIR): `cargo test -p farside-spec -- --include-ignored` as
//! root under `flock /tmp/farside-root.lock`.
//!
//! One namespace, no steering: the "server" is a listener whose accept queue the test
//! fills to Q, so every connection reaching the admission listener is migratory; the
//! peer is a [`TargetDaemon`] that refuses everything. The refusal closes the window,
//! the connection falls back to the local server (a relay to a sink), and a
//! notification datagram from the peer reopens the window; one from a stranger does
//! not.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use farside_migrate::Handover;
use farside_spec::handoff::{HandOff, Handoff};
use farside_spec::notify;
use farside_spec::source::{Peer, SourceConfig, SourceDaemon};
use farside_spec::steer::NoSteer;
use farside_spec::target::{TargetConfig, TargetDaemon};
use farside_spec::window::WindowConfig;

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
#[ignore = "needs root (TCP_REPAIR): cargo test -p farside-spec -- --include-ignored, as root under flock /tmp/farside-root.lock"]
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
            peer_poll: Duration::from_millis(5),
            handover: Handover::CloseBeforeRestore,
            affinity: None,
            gate_on_peer_load: false,
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
        "no_peer_room",
        "affinity_hashed",
    ] {
        assert!(v[k].is_u64(), "{k} is a count: {}", v[k]);
    }
    assert!(v["fallbacks"]["refused"].is_u64(), "{}", v["fallbacks"]);
    assert!(v["window"]["closures"].is_u64(), "{}", v["window"]);
    assert!(v["peers"].is_array(), "{}", v["peers"]);
    source.stop();
    peer.stop();
}
