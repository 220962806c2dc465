//! Speculative admission end to end across network namespaces (needs root: netns,
//! sk_lookup, TCP_REPAIR): `cargo test -p farside-specd -- --include-ignored` as root
//! under `flock /tmp/farside-root.lock`.
//!
//! Three namespaces: client `c`, back-ends `a` (the saturated source) and `b`. The
//! VIP is on both back-ends' loopback; the client reaches it through veth `c-a`, and
//! a migrated flow through `c-b` by a per-flow policy rule (the front-end's flow
//! entry; `PolicyRouteSteer`). Each back-end runs `farside backend` on VIP:8080 with
//! `--adopt-socket` and the daemon's target side; `a` also runs the source side with
//! the sk_lookup program attached to its namespace, one worker, Q = 2 and W = 4.
//! The client opens connections one after another, each uploading 256 KiB to
//! `POST /digest` and then asking for `GET /cgi/work` (CPU-costly), and checks every
//! answer.
//!
//! - `window_connections_migrate_to_the_peer_and_complete`: once a's queue is at Q
//!   the program (kernel mode: a's listener in its map) diverts SYNs to the daemon, which migrates them to `b`; every
//!   connection completes and some were served by `b`.
//! - `in_the_poll_mode_window_connections_migrate_too`: the same with `--poll-steer`
//!   (the daemon's divert flag, polled every 1 ms).
//! - `refusing_target_closes_the_window_and_connections_complete_on_the_source`:
//!   `b` refuses every offer; the first refusal closes the window, the refused
//!   connection falls back to a's server, no SYN is diverted while the window is
//!   closed, and every connection completes on `a`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use farside_backend::BackendArgs;
use farside_migrate::testkit::netns::{Netns, NetnsSpec, NsRef};
use farside_migrate::testkit::session::read_head_full;
use farside_migrate::testkit::{is_root, Fnv};
use farside_migrate::Handover;
use farside_specd::handoff::{HandOff, Handoff};
use farside_specd::source::{Peer, SourceConfig, SourceDaemon};
use farside_specd::steer::PolicyRouteSteer;
use farside_specd::target::{OfferRules, TargetConfig, TargetDaemon};
use farside_specd::window::WindowConfig;

/// Bound on any await (a hang is a failure).
const AWAIT_MAX: Duration = Duration::from_secs(60);
const VIP: &str = "10.78.0.100";
const CLIENT_IP: &str = "10.78.9.1";
const PORT: u16 = 8080;
const A_IP: &str = "10.78.2.1";
const B_IP: &str = "10.78.2.2";
/// Routing table of the client namespace that reaches `b`.
const TABLE_B: u32 = 102;
/// Connections the client opens.
const CONNS: usize = 12;
/// Gap between connection openings: the daemon polls a's queue every 1 ms.
const CONN_GAP: Duration = Duration::from_millis(15);
/// Upload per connection.
const POST_BYTES: usize = 256 << 10;
/// CPU per `GET /cgi/work`, µs: a's one worker falls behind CONN_GAP.
const WORK_US: u64 = 40_000;

/// The kit's namespaces with a table in `c` that routes the VIP to `b` (the
/// per-flow rules' target), deleted on drop (also when a thread panicked).
fn netns(suffix: &str) -> Netns {
    Netns::setup(NetnsSpec {
        // Not the lab's `fs…` names; the pid keeps parallel runs apart.
        tag: format!("sp{}{suffix}", std::process::id() % 100_000),
        vip: VIP.parse().unwrap(),
        client_ip: CLIENT_IP.parse().unwrap(),
        a_ip: A_IP.parse().unwrap(),
        b_ip: B_IP.parse().unwrap(),
        table_b: Some(TABLE_B),
    })
    .expect("namespaces")
}

fn pat(conn: usize, i: usize) -> u8 {
    ((i as u64).wrapping_mul(2_654_435_761) >> 7) as u8 ^ conn as u8
}

fn fnv(conn: usize) -> u64 {
    let mut f = Fnv::new();
    for i in 0..POST_BYTES {
        f.update(&[pat(conn, i)]);
    }
    f.0
}

fn read_response(r: &mut impl BufRead) -> (String, Vec<u8>) {
    let (status, _, len) = read_head_full(r);
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).expect("body");
    (status, body)
}

/// One client connection's session; panics on any wrong byte.
fn session(conn: usize, vip: SocketAddr) {
    let s = TcpStream::connect_timeout(&vip, AWAIT_MAX).expect("connect");
    s.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    s.set_write_timeout(Some(AWAIT_MAX)).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = thread::spawn(move || {
        write!(
            w,
            "POST /digest HTTP/1.1\r\nHost: t\r\nContent-Length: {POST_BYTES}\r\n\r\n"
        )
        .unwrap();
        let body: Vec<u8> = (0..POST_BYTES).map(|i| pat(conn, i)).collect();
        w.write_all(&body).expect("upload (reset?)");
        write!(
            w,
            "GET /cgi/work?us={WORK_US} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
    });
    let mut r = BufReader::new(s);
    let (status, body) = read_response(&mut r);
    assert!(status.starts_with("HTTP/1.1 200"), "conn {conn}: {status}");
    assert_eq!(
        String::from_utf8(body).unwrap(),
        format!("fnv1a64={:016x} bytes={POST_BYTES}\n", fnv(conn)),
        "conn {conn}: upload digest"
    );
    let (status, body) = read_response(&mut r);
    assert!(status.starts_with("HTTP/1.1 200"), "conn {conn}: {status}");
    assert!(
        String::from_utf8_lossy(&body).starts_with("burned "),
        "conn {conn}"
    );
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).expect("close");
    writer.join().expect("writer");
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("farside-specns-{}-{name}", std::process::id()))
}

/// What one back-end node reports at the end.
struct NodeReport {
    source: Option<String>,
    source_migrated: u64,
    source_fell_back: u64,
    source_closures: u64,
    target_restored: u64,
    target_refused: u64,
}

/// Runs back-end `which` in its namespace until `stop` fires: `farside backend`
/// on VIP:8080, the target side on its cluster address, and with `source` the
/// source side (steering the VIP). Sends the target's address on `ready`.
#[allow(clippy::too_many_arguments)]
fn node(
    ns: NsRef,
    which: &'static str,
    ip: &'static str,
    workers: usize,
    admit_queue_max: u32,
    // The peer's address, and whether to steer by polling (`--poll-steer`).
    source_peer: Option<(mpsc::Receiver<SocketAddr>, bool)>,
    ready: mpsc::Sender<SocketAddr>,
    stop: mpsc::Receiver<()>,
) -> NodeReport {
    ns.enter(which).unwrap();
    let adopt = temp_path(&format!("{}{which}", ns.tag));
    let (addr, backend) = farside_backend::spawn(BackendArgs {
        listen: format!("{VIP}:{PORT}").parse().unwrap(),
        workers,
        backlog: 64,
        adopt_socket: Some(adopt.clone()),
        ..BackendArgs::default()
    })
    .expect("backend");
    let target = TargetDaemon::start(TargetConfig {
        listen: format!("{ip}:0").parse().unwrap(),
        server_port: addr.port(),
        admit_queue_max,
        handoff: Handoff::Adopt(adopt.clone()),
        threads: 2,
        peers: Vec::new(),
        allow: [A_IP, B_IP].iter().map(|a| a.parse().unwrap()).collect(),
        offers: OfferRules {
            service_ip: Some(VIP.parse().unwrap()),
            service_port: PORT,
            cluster: [A_IP, B_IP].iter().map(|a| a.parse().unwrap()).collect(),
            loopback: false,
        },
        auth: None,
    })
    .expect("target");
    let source = source_peer.map(|(rx, poll_steer)| {
        let peer = rx.recv_timeout(AWAIT_MAX).expect("peer address");
        SourceDaemon::start(
            SourceConfig {
                accept: "127.0.0.1:0".parse().unwrap(),
                notify: target.addr(),
                window: WindowConfig::new(2, 4),
                server_port: PORT,
                steer: Some((Some(VIP.parse().unwrap()), PORT)),
                peers: vec![Peer {
                    daemon: peer,
                    region: None,
                    backend: B_IP.parse::<IpAddr>().unwrap(),
                }],
                migrators: 8,
                poll: Duration::from_millis(1),
                poll_steer,
                no_room: Default::default(),
                peer_poll: Duration::from_millis(5),
                handover: Handover::CloseAfterRestore,
                affinity: None,
                gate_on_peer_load: false,
                auth: None,
                own_backend: None,
            },
            HandOff::new(Handoff::Adopt(adopt.clone())).unwrap(),
            Box::new(PolicyRouteSteer {
                netns: ns.ns("c"),
                tables: vec![(B_IP.parse().unwrap(), TABLE_B)],
            }),
        )
        .expect("source daemon")
    });
    // Ready once everything, steering included, is in place.
    ready.send(target.addr()).unwrap();
    let _ = stop.recv_timeout(AWAIT_MAX * 2);
    let mut report = NodeReport {
        source: None,
        source_migrated: 0,
        source_fell_back: 0,
        source_closures: 0,
        target_restored: target
            .stats()
            .restored
            .load(std::sync::atomic::Ordering::Relaxed),
        target_refused: target
            .stats()
            .refused
            .load(std::sync::atomic::Ordering::Relaxed),
    };
    if let Some(s) = source {
        report.source = Some(s.summary_json());
        report.source_migrated = s
            .stats()
            .migrated
            .load(std::sync::atomic::Ordering::Relaxed);
        report.source_fell_back = s
            .stats()
            .fell_back
            .load(std::sync::atomic::Ordering::Relaxed);
        report.source_closures = s.window().stats().closures;
        s.stop();
    }
    eprintln!("node {which} target: {}", target.summary_json());
    target.stop();
    backend.stop();
    report
}

/// Runs the scenario; returns (a's report, b's report).
fn scenario(suffix: &str, b_admit_queue_max: u32, poll_steer: bool) -> (NodeReport, NodeReport) {
    let guard = netns(suffix);
    let ns = guard.r.clone();
    let (b_ready, b_addr) = mpsc::channel();
    let (a_ready, a_addr) = mpsc::channel();
    let (peer_tx, peer_rx) = mpsc::channel();
    let (stop_b_tx, stop_b) = mpsc::channel();
    let (stop_a_tx, stop_a) = mpsc::channel();
    let nb = ns.clone();
    let b = thread::spawn(move || node(nb, "b", B_IP, 4, b_admit_queue_max, None, b_ready, stop_b));
    let na = ns.clone();
    let a = thread::spawn(move || {
        node(
            na,
            "a",
            A_IP,
            1,
            64,
            Some((peer_rx, poll_steer)),
            a_ready,
            stop_a,
        )
    });
    peer_tx
        .send(b_addr.recv_timeout(AWAIT_MAX).expect("b ready"))
        .unwrap();
    a_addr.recv_timeout(AWAIT_MAX).expect("a ready");
    let vip: SocketAddr = format!("{VIP}:{PORT}").parse().unwrap();
    let nc = ns.clone();
    let clients = thread::spawn(move || {
        nc.enter("c").unwrap();
        let t0 = Instant::now();
        let mut sessions = Vec::new();
        for conn in 0..CONNS {
            let nc = nc.clone();
            sessions.push(thread::spawn(move || {
                nc.enter("c").unwrap();
                session(conn, vip)
            }));
            thread::sleep(CONN_GAP);
        }
        let mut failures = 0;
        for s in sessions {
            if s.join().is_err() {
                failures += 1;
            }
        }
        eprintln!("{CONNS} sessions in {:?}", t0.elapsed());
        failures
    });
    if std::env::var_os("SPEC_DEBUG").is_some() {
        thread::sleep(Duration::from_millis(120));
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.ns("a"), "ss", "-tanoi"])
            .output()
            .unwrap();
        eprintln!("{}", String::from_utf8_lossy(&out.stdout));
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.ns("a"), "nstat", "-az"])
            .output()
            .unwrap();
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            if l.split_whitespace().nth(1).is_some_and(|v| v != "0") {
                eprintln!("{l}");
            }
        }
    }
    let failures = clients.join().expect("clients");
    stop_a_tx.send(()).unwrap();
    stop_b_tx.send(()).unwrap();
    let ra = a.join().expect("node a");
    let rb = b.join().expect("node b");
    eprintln!("source a: {}", ra.source.as_deref().unwrap_or("-"));
    assert_eq!(failures, 0, "client sessions failed");
    let summary: serde_json::Value =
        serde_json::from_str(ra.source.as_deref().expect("a is a source")).unwrap();
    assert_eq!(
        summary["steer_mode"],
        if poll_steer { "poll" } else { "kernel" },
        "kernel: the program decides from a's listener (taken from the backend)"
    );
    drop(guard);
    (ra, rb)
}

#[test]
#[ignore = "needs root (netns, sk_lookup, TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn window_connections_migrate_to_the_peer_and_complete() {
    assert!(is_root(), "needs root");
    let (a, b) = scenario("m", 64, false);
    assert!(a.source_migrated > 0, "nothing migrated");
    assert_eq!(b.target_restored, a.source_migrated);
    assert_eq!(a.source_closures, 0, "b never refused");
    // Every migrated source socket drained in the control pool's reaper, none in its
    // migrator (which went back to accepting at once).
    let v: serde_json::Value = serde_json::from_str(a.source.as_deref().unwrap()).unwrap();
    let d = &v["flow_drain"];
    assert_eq!(d["deferred"].as_u64(), Some(a.source_migrated), "{d}");
    assert_eq!(d["inline"], 0, "{d}");
    let c = &v["control"];
    assert!(c["opened"].as_u64() >= Some(1), "{c}");
    assert!(
        c["opened"].as_u64().unwrap() + c["reused"].as_u64().unwrap() >= a.source_migrated,
        "a control connection per migration, opened or reused: {c}"
    );
}

#[test]
#[ignore = "needs root (netns, sk_lookup, TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn in_the_poll_mode_window_connections_migrate_too() {
    assert!(is_root(), "needs root");
    let (a, b) = scenario("p", 64, true);
    assert!(a.source_migrated > 0, "nothing migrated");
    assert_eq!(b.target_restored, a.source_migrated);
}

#[test]
#[ignore = "needs root (netns, sk_lookup, TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn refusing_target_closes_the_window_and_connections_complete_on_the_source() {
    assert!(is_root(), "needs root");
    let (a, b) = scenario("r", 0, false);
    assert_eq!(a.source_migrated, 0);
    assert_eq!(b.target_restored, 0);
    assert!(a.source_fell_back > 0, "no migration was attempted");
    assert_eq!(b.target_refused, a.source_fell_back);
    assert!(a.source_closures > 0, "the window never closed");
}
