//! Content-aware migration end to end: URL affinity across two peers (needs root:
//! netns, sk_lookup, TCP_REPAIR): `cargo test -p farside-specd --test affinity_root --
//! --include-ignored` as root under `flock /tmp/farside-root.lock`.
//!
//! Four namespaces: client `c`, back-ends `a` (the saturated source), `b` and `d` (its
//! peers, in this order in the source's `--peer` list: index 0 and 1). The kit builds
//! `c`, `a`, `b`; [`PeerD`] adds `d` the same way (the VIP on its loopback, a veth to
//! the client reached by a per-flow rule into [`TABLE_D`], and its own /24 to `a`).
//! Each back-end runs `farside backend` on VIP:8080 with `--adopt-socket` and
//! `--root` (a docroot of its own whose files name the node: `/uK` holds
//! `/uK from <node>`, so every response says which node served it), plus the
//! daemon's target side; `a` also runs the source side (sk_lookup program attached,
//! one worker, Q = 2, W = 4; every file costs [`WORK_US`] of CPU, so a's queue
//! reaches Q and arrivals are diverted and migrated).
//! The client opens [`CONNS`] connections one after another, connection `i` asking for
//! `GET /u{i % 3}`, and checks every answer.
//!
//! - `with_affinity_each_url_migrates_to_its_peer`: the source's `affinity` is on.
//!   Every migrated connection was served by the peer its path hashes to
//!   (`path_hash(path) % 2`; the paths are chosen so that both peers have one), both
//!   peers took migrations, and every target choice read its path (`affinity_hashed`
//!   equals the migrated plus fallen-back connections, > 0). With `choose_peer`
//!   patched to ignore the hash, this test fails (`/u0 migrated to b`).
//! - `without_affinity_urls_do_not_follow_their_peer`: the negative control, affinity
//!   off. Least-loaded choice with unknown loads (no `region=`) takes `b` unless `b`
//!   has more migrations in flight than `d`, so whether one URL is ever seen on both
//!   peers depends on migrations overlapping (each holds ~25 ms of flow move here, so
//!   they usually do, but nothing guarantees it). The control instead checks what the
//!   first test asserts fails here: some migrated connection was served by a peer
//!   other than its path's (two of the three paths hash to `d`, and `b` is the
//!   tie-break), and nothing was hashed.

use std::collections::BTreeMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use farside_backend::BackendArgs;
use farside_migrate::testkit::is_root;
use farside_migrate::testkit::netns::{Netns, NetnsSpec, NsRef};
use farside_migrate::testkit::session::read_head_full;
use farside_migrate::Handover;
use farside_specd::handoff::{HandOff, Handoff};
use farside_specd::source::{path_hash, Affinity, Peer, SourceConfig, SourceDaemon};
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
/// `a`'s address on its link to `d` (a /24 of its own).
const A_IP_D: &str = "10.78.3.1";
const D_IP: &str = "10.78.3.2";
/// Routing table of the client namespace that reaches `b`.
const TABLE_B: u32 = 102;
/// Routing table of the client namespace that reaches `d`.
const TABLE_D: u32 = 104;
/// Connections the client opens (bounded: 8 per URL).
const CONNS: usize = 24;
/// The URLs, connection `i` asks for `URLS[i % 3]`: `/u0` and `/u2` hash to the
/// second peer (`d`), `/u1` to the first (`b`) (checked at the start).
const URLS: [&str; 3] = ["/u0", "/u1", "/u2"];
/// Gap between connection openings: the daemon polls a's queue every 1 ms.
const CONN_GAP: Duration = Duration::from_millis(15);
/// CPU per file request, µs: a's one worker falls behind CONN_GAP.
const WORK_US: u64 = 40_000;
/// How long a migrator waits for the request line: the client writes it right after
/// its connect returns, so this only bounds a starved scheduler (a connection chosen
/// for without its path would make the affinity assertion flaky).
const AFFINITY_WAIT: Duration = Duration::from_secs(1);
/// The peers' names in the source's peer order.
const PEERS: [&str; 2] = ["b", "d"];

/// The kit's namespaces with a table in `c` that routes the VIP to `b` (the
/// per-flow rules' target), deleted on drop (also when a thread panicked).
fn netns(suffix: &str) -> Netns {
    Netns::setup(NetnsSpec {
        // Not the lab's `fs…` names; the pid keeps parallel runs apart.
        tag: format!("af{}{suffix}", std::process::id() % 100_000),
        vip: VIP.parse().unwrap(),
        client_ip: CLIENT_IP.parse().unwrap(),
        a_ip: A_IP.parse().unwrap(),
        b_ip: B_IP.parse().unwrap(),
        table_b: Some(TABLE_B),
    })
    .expect("namespaces")
}

/// The second peer's namespace `d` beside the kit's (same tag), deleted on drop
/// (deleting it deletes its veths, whose other ends are in `c` and `a`).
struct PeerD(NsRef);

impl PeerD {
    fn setup(n: &NsRef) -> io::Result<PeerD> {
        let t = &n.tag;
        run(&format!("netns add {}", n.ns("d")))?;
        // From here on the drop deletes what was built.
        let guard = PeerD(n.clone());
        run(&format!(
            "link add {t}cd netns {t}c type veth peer name {t}dc netns {t}d"
        ))?;
        run(&format!(
            "link add {t}ad netns {t}a type veth peer name {t}da netns {t}d"
        ))?;
        n.try_ip("c", &format!("link set {t}cd up"))?;
        n.try_ip(
            "c",
            &format!("route add {VIP}/32 dev {t}cd src {CLIENT_IP} table {TABLE_D}"),
        )?;
        n.try_ip("a", &format!("addr add {A_IP_D}/24 dev {t}ad"))?;
        n.try_ip("a", &format!("link set {t}ad up"))?;
        n.try_ip("d", "link set lo up")?;
        n.try_ip("d", &format!("addr add {VIP}/32 dev lo"))?;
        n.try_ip("d", &format!("link set {t}dc up"))?;
        n.try_ip("d", &format!("route add {CLIENT_IP}/32 dev {t}dc"))?;
        n.try_ip("d", &format!("addr add {D_IP}/24 dev {t}da"))?;
        n.try_ip("d", &format!("link set {t}da up"))?;
        Ok(guard)
    }
}

impl Drop for PeerD {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.0.ns("d")])
            .output();
    }
}

fn run(args: &str) -> io::Result<()> {
    let out = Command::new("ip").args(args.split_whitespace()).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {args}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// A node's docroot (its files name the node), removed on drop.
struct Docroot(PathBuf);

impl Docroot {
    fn new(tag: &str, node: &str) -> Docroot {
        let dir = std::env::temp_dir().join(format!("farside-aff-{tag}-{node}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("docroot");
        let root = Docroot(dir);
        for url in URLS {
            std::fs::write(root.0.join(&url[1..]), body(url, node)).expect("file");
        }
        root
    }
}

impl Drop for Docroot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What node `node` serves for `url`.
fn body(url: &str, node: &str) -> String {
    format!("{url} from {node}\n")
}

/// The peer (`b` or `d`) the path of `url` hashes to (the source's rule).
fn affinity_peer(url: &str) -> &'static str {
    PEERS[(path_hash(url.as_bytes()) % PEERS.len() as u64) as usize]
}

/// One client connection: `GET url`; returns the node that served it, panics on any
/// wrong byte.
fn session(conn: usize, url: &str, vip: SocketAddr) -> String {
    let s = TcpStream::connect_timeout(&vip, AWAIT_MAX).expect("connect");
    s.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    s.set_write_timeout(Some(AWAIT_MAX)).unwrap();
    (&s).write_all(
        format!("GET {url} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .expect("request");
    let mut r = BufReader::new(s);
    let (status, _, len) = read_head_full(&mut r);
    assert!(
        status.starts_with("HTTP/1.1 200"),
        "conn {conn} {url}: {status}"
    );
    let mut b = vec![0u8; len];
    r.read_exact(&mut b).expect("body");
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).expect("close");
    assert!(rest.is_empty(), "conn {conn}: bytes after the body");
    let b = String::from_utf8(b).expect("text body");
    let node = ["a", "b", "d"]
        .into_iter()
        .find(|n| b == body(url, n))
        .unwrap_or_else(|| panic!("conn {conn} {url}: body {b:?}"));
    node.to_string()
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("farside-affns-{}-{name}", std::process::id()))
}

/// What one back-end node reports at the end.
#[derive(Debug, Default)]
struct NodeReport {
    source: Option<String>,
    source_migrated: u64,
    /// Fell back or lost: the other connections a migrator chose a target for.
    source_not_migrated: u64,
    affinity_hashed: u64,
    target_restored: u64,
}

/// The source side of node `a`: its peers' target addresses (b, d) and the affinity.
type SourceSide = (mpsc::Receiver<[SocketAddr; 2]>, Option<Affinity>);

/// Runs back-end `which` in its namespace until `stop` fires: `farside backend` on
/// VIP:8080 serving `root`, the target side on its cluster address, and with `source`
/// the source side (steering the VIP). Sends the target's address on `ready`.
#[allow(clippy::too_many_arguments)]
fn node(
    ns: NsRef,
    which: &'static str,
    ip: &'static str,
    workers: usize,
    root: PathBuf,
    source: Option<SourceSide>,
    ready: mpsc::Sender<SocketAddr>,
    stop: mpsc::Receiver<()>,
) -> NodeReport {
    ns.enter(which).unwrap();
    let adopt = temp_path(&format!("{}{which}", ns.tag));
    let (addr, backend) = farside_backend::spawn(BackendArgs {
        listen: format!("{VIP}:{PORT}").parse().unwrap(),
        root: Some(root),
        workers,
        backlog: 64,
        cpu_us_per_request: WORK_US,
        adopt_socket: Some(adopt.clone()),
        ..BackendArgs::default()
    })
    .expect("backend");
    let target = TargetDaemon::start(TargetConfig {
        listen: format!("{ip}:0").parse().unwrap(),
        server_port: addr.port(),
        admit_queue_max: 64,
        handoff: Handoff::Adopt(adopt.clone()),
        threads: 2,
        peers: Vec::new(),
        allow: [A_IP, B_IP, A_IP_D, D_IP]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect(),
        offers: OfferRules {
            service_ip: Some(VIP.parse().unwrap()),
            service_port: PORT,
            cluster: [A_IP, B_IP, A_IP_D, D_IP]
                .iter()
                .map(|a| a.parse().unwrap())
                .collect(),
            loopback: false,
        },
        auth: None,
    })
    .expect("target");
    let source = source.map(|(rx, affinity)| {
        let [b, d] = rx.recv_timeout(AWAIT_MAX).expect("peer addresses");
        SourceDaemon::start(
            SourceConfig {
                accept: "127.0.0.1:0".parse().unwrap(),
                notify: target.addr(),
                window: WindowConfig::new(2, 4),
                server_port: PORT,
                steer: Some((Some(VIP.parse().unwrap()), PORT)),
                // Index 0 and 1: the order `affinity_peer` assumes.
                peers: vec![
                    Peer {
                        daemon: b,
                        region: None,
                        backend: B_IP.parse::<IpAddr>().unwrap(),
                    },
                    Peer {
                        daemon: d,
                        region: None,
                        backend: D_IP.parse::<IpAddr>().unwrap(),
                    },
                ],
                migrators: 8,
                poll: Duration::from_millis(1),
                poll_steer: false,
                no_room: Default::default(),
                peer_poll: Duration::from_millis(5),
                handover: Handover::CloseAfterRestore,
                affinity,
                gate_on_peer_load: false,
                auth: None,
                own_backend: None,
            },
            HandOff::new(Handoff::Adopt(adopt.clone())).unwrap(),
            Box::new(PolicyRouteSteer {
                netns: ns.ns("c"),
                tables: vec![
                    (B_IP.parse().unwrap(), TABLE_B),
                    (D_IP.parse().unwrap(), TABLE_D),
                ],
            }),
        )
        .expect("source daemon")
    });
    // Ready once everything, steering included, is in place.
    ready.send(target.addr()).unwrap();
    let _ = stop.recv_timeout(AWAIT_MAX * 2);
    let mut report = NodeReport {
        target_restored: target.stats().restored.load(Ordering::Relaxed),
        ..NodeReport::default()
    };
    if let Some(s) = source {
        report.source = Some(s.summary_json());
        report.source_migrated = s.stats().migrated.load(Ordering::Relaxed);
        report.source_not_migrated =
            s.stats().fell_back.load(Ordering::Relaxed) + s.stats().lost.load(Ordering::Relaxed);
        report.affinity_hashed = s.stats().affinity_hashed.load(Ordering::Relaxed);
        s.stop();
    }
    eprintln!("node {which} target: {}", target.summary_json());
    target.stop();
    backend.stop();
    report
}

/// What a run saw.
struct Run {
    a: NodeReport,
    /// Restored by `b` and by `d`.
    restored: [u64; 2],
    /// Per URL, the nodes that served its connections (`a`, `b`, `d`), with counts.
    served: BTreeMap<&'static str, BTreeMap<String, u64>>,
    /// The source's summary's per-peer `migrated`, in peer order.
    peer_migrated: [u64; 2],
}

/// Runs the scenario with the source's `affinity`.
fn scenario(suffix: &str, affinity: Option<Affinity>) -> Run {
    let guard = netns(suffix);
    let ns = guard.r.clone();
    let peer_d = PeerD::setup(&ns).expect("namespace d");
    let roots: Vec<Docroot> = ["a", "b", "d"]
        .into_iter()
        .map(|n| Docroot::new(&ns.tag, n))
        .collect();
    let (b_ready, b_addr) = mpsc::channel();
    let (d_ready, d_addr) = mpsc::channel();
    let (a_ready, a_addr) = mpsc::channel();
    let (peer_tx, peer_rx) = mpsc::channel();
    let mut stops = Vec::new();
    let mut peers = Vec::new();
    for (which, ip, root, ready) in [
        ("b", B_IP, roots[1].0.clone(), b_ready),
        ("d", D_IP, roots[2].0.clone(), d_ready),
    ] {
        let (stop_tx, stop) = mpsc::channel();
        stops.push(stop_tx);
        let n = ns.clone();
        peers.push(thread::spawn(move || {
            node(n, which, ip, 4, root, None, ready, stop)
        }));
    }
    let (stop_a_tx, stop_a) = mpsc::channel();
    let na = ns.clone();
    let root_a = roots[0].0.clone();
    let a = thread::spawn(move || {
        node(
            na,
            "a",
            A_IP,
            1,
            root_a,
            Some((peer_rx, affinity)),
            a_ready,
            stop_a,
        )
    });
    peer_tx
        .send([
            b_addr.recv_timeout(AWAIT_MAX).expect("b ready"),
            d_addr.recv_timeout(AWAIT_MAX).expect("d ready"),
        ])
        .unwrap();
    a_addr.recv_timeout(AWAIT_MAX).expect("a ready");
    let vip: SocketAddr = format!("{VIP}:{PORT}").parse().unwrap();
    let nc = ns.clone();
    let clients = thread::spawn(move || {
        let t0 = Instant::now();
        let mut sessions = Vec::new();
        for conn in 0..CONNS {
            let nc = nc.clone();
            let url = URLS[conn % URLS.len()];
            sessions.push((
                url,
                thread::spawn(move || {
                    nc.enter("c").unwrap();
                    session(conn, url, vip)
                }),
            ));
            thread::sleep(CONN_GAP);
        }
        let mut failures = 0;
        let mut served: BTreeMap<&'static str, BTreeMap<String, u64>> = BTreeMap::new();
        for (url, s) in sessions {
            match s.join() {
                Ok(node) => *served.entry(url).or_default().entry(node).or_default() += 1,
                Err(_) => failures += 1,
            }
        }
        eprintln!("{CONNS} sessions in {:?}", t0.elapsed());
        (failures, served)
    });
    let (failures, served) = clients.join().expect("clients");
    stop_a_tx.send(()).unwrap();
    for s in stops {
        s.send(()).unwrap();
    }
    let a = a.join().expect("node a");
    let restored: Vec<u64> = peers
        .into_iter()
        .map(|p| p.join().expect("peer node").target_restored)
        .collect();
    let summary_line = a.source.clone().expect("a is a source");
    eprintln!("source a: {summary_line}");
    eprintln!("served per URL: {served:?}");
    assert_eq!(failures, 0, "client sessions failed");
    let summary: serde_json::Value = serde_json::from_str(&summary_line).unwrap();
    assert_eq!(summary["steer_mode"], "kernel");
    let peer_migrated = [0, 1].map(|i| summary["peers"][i]["migrated"].as_u64().unwrap());
    drop(roots);
    drop(peer_d);
    drop(guard);
    Run {
        a,
        restored: [restored[0], restored[1]],
        served,
        peer_migrated,
    }
}

/// Checks that hold with and without affinity: every connection was answered (by
/// `scenario`), some migrated, and what the peers served is what the source migrated
/// to them (so the bodies tell each migrated connection's peer).
fn check_common(r: &Run) {
    assert!(r.a.source_migrated > 0, "nothing migrated");
    assert_eq!(r.restored.iter().sum::<u64>(), r.a.source_migrated);
    for (i, peer) in PEERS.into_iter().enumerate() {
        let served: u64 = r.served.values().filter_map(|m| m.get(peer)).sum();
        assert_eq!(served, r.restored[i], "{peer}: served against restored");
        assert_eq!(
            served, r.peer_migrated[i],
            "{peer}: served against migrated to it"
        );
    }
}

/// The URLs cover both peers, else the affinity test could pass by chance.
fn check_urls() {
    for peer in PEERS {
        assert!(
            URLS.iter().any(|u| affinity_peer(u) == peer),
            "no URL hashes to {peer}"
        );
    }
}

#[test]
#[ignore = "needs root (netns, sk_lookup, TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn with_affinity_each_url_migrates_to_its_peer() {
    assert!(is_root(), "needs root");
    check_urls();
    let r = scenario(
        "h",
        Some(Affinity {
            wait: AFFINITY_WAIT,
            full_at: 64,
        }),
    );
    check_common(&r);
    assert!(r.a.affinity_hashed > 0, "no target chosen by path");
    // Every choice read its path (the client sends it at once; AFFINITY_WAIT).
    assert_eq!(
        r.a.affinity_hashed,
        r.a.source_migrated + r.a.source_not_migrated
    );
    for (url, nodes) in &r.served {
        for node in nodes.keys().filter(|n| *n != "a") {
            assert_eq!(
                node,
                affinity_peer(url),
                "{url} migrated to {node}: {:?}",
                r.served
            );
        }
    }
    for (i, peer) in PEERS.into_iter().enumerate() {
        assert!(r.restored[i] > 0, "no migration to {peer}: {:?}", r.served);
    }
}

#[test]
#[ignore = "needs root (netns, sk_lookup, TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn without_affinity_urls_do_not_follow_their_peer() {
    assert!(is_root(), "needs root");
    check_urls();
    let r = scenario("n", None);
    check_common(&r);
    assert_eq!(r.a.affinity_hashed, 0);
    let astray: u64 = r
        .served
        .iter()
        .flat_map(|(url, nodes)| {
            nodes
                .iter()
                .filter(move |(n, _)| *n != "a" && n.as_str() != affinity_peer(url))
                .map(|(_, c)| *c)
        })
        .sum();
    assert!(
        astray > 0,
        "every migrated connection went to its URL's peer without affinity: {:?}",
        r.served
    );
}
