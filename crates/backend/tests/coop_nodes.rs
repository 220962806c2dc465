//! Cooperating back-ends (`--coop`) on loopback: a remote hit served from the peer's
//! cache, a stale directory hint that costs one wasted fetch and then gives the right
//! body from disk, forged or replayed directory updates refused, a body peers read
//! one-sidedly (shm) kept by its owner's cache as recently used, the per-message
//! overhead knob spinning per peer message (and nothing at 0), and directories read
//! from the peers' arenas (`--coop-directory read`) instead of sent; what
//! `--coop-directory write` needs.

use farside_backend::coop::seal::{Sealer, COOP_KEY_ID};
use farside_backend::coop::wire::{object_id, DirectoryUpdate};
use farside_backend::coop::{CoopArgs, CoopDirectory, CoopPeer, CoopPolicy};
use farside_backend::{spawn, BackendArgs, Handle};
use farside_coop::directory::BloomFilter;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn body_of(n: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ n.wrapping_mul(131)) as u8)
        .collect()
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn random_key() -> [u8; 16] {
    let mut k = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut k)
        .unwrap();
    k
}

fn write_key(dir: &Path, key: &[u8; 16]) -> std::path::PathBuf {
    let path = dir.join("coop.key");
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap()
        .write_all(format!("{hex}\n").as_bytes())
        .unwrap();
    path
}

fn get(addr: SocketAddr, path: &str) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let end = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let status = std::str::from_utf8(&all[9..12]).unwrap().parse().unwrap();
    (status, all[end..].to_vec())
}

fn counter(h: &Handle, f: impl Fn(&farside_backend::coop::Counters) -> u64) -> u64 {
    f(&h.coop().unwrap().0.counters)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "waited for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct Cluster {
    _dir: tempdir::Dir,
    nodes: Vec<Handle>,
    key: [u8; 16],
}

mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn cluster(n: usize, files: usize) -> Cluster {
    cluster_with(n, files, |_, _| {})
}

/// A cluster whose nodes' coop settings `tune` adjusts (with the test's directory).
fn cluster_with(n: usize, files: usize, tune: impl Fn(&mut CoopArgs, &Path)) -> Cluster {
    let dir = std::env::temp_dir().join(format!(
        "farside-coop-test-{}-{}",
        std::process::id(),
        free_port().port()
    ));
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("o")).unwrap();
    for i in 0..files as u64 {
        std::fs::write(
            root.join(format!("o/{i}")),
            body_of(i, 3000 + i as usize * 7),
        )
        .unwrap();
    }
    let key = random_key();
    let key_file = write_key(&dir, &key);
    let peers: Vec<SocketAddr> = (0..n).map(|_| free_port()).collect();
    let nodes = (0..n)
        .map(|i| {
            let mut args = BackendArgs {
                listen: "127.0.0.1:0".parse().unwrap(),
                root: Some(root.clone()),
                workers: 4,
                coop: CoopArgs {
                    coop: true,
                    policy: CoopPolicy::Press,
                    index: i,
                    peers: peers.clone(),
                    key_file: Some(key_file.clone()),
                    disk_latency_us: 500,
                    // Publications once a second: a test's steps fit between two.
                    publish_ms: 1000,
                    ..CoopArgs::default()
                },
                ..BackendArgs::default()
            };
            tune(&mut args.coop, &dir);
            spawn(args).unwrap().1
        })
        .collect();
    Cluster {
        _dir: tempdir::Dir(dir),
        nodes,
        key,
    }
}

#[test]
fn a_peer_serves_what_it_caches_and_a_stale_hint_falls_back_to_disk() {
    let c = cluster(3, 8);
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    // Object 1 is read from disk at b.
    assert_eq!(get(b.addr(), "/o/1"), (200, body_of(1, 3007)));
    assert_eq!(counter(b, |k| k.misses.load(Ordering::Relaxed)), 1);
    // Once a's view of b says so, a asks b for it: a remote hit with b's bytes.
    let seen = counter(a, |k| k.directory_received.load(Ordering::Relaxed));
    wait_for("b's directory at a", || {
        counter(a, |k| k.directory_received.load(Ordering::Relaxed)) >= seen + 4
    });
    assert_eq!(get(a.addr(), "/o/1"), (200, body_of(1, 3007)));
    assert_eq!(counter(a, |k| k.remote_hits.load(Ordering::Relaxed)), 1);
    assert_eq!(counter(a, |k| k.misses.load(Ordering::Relaxed)), 0);
    assert_eq!(counter(b, |k| k.peer_served.load(Ordering::Relaxed)), 1);
    assert_eq!(
        counter(a, |k| k.peer_bytes.load(Ordering::Relaxed)),
        3007,
        "the body came from the peer"
    );

    // A stale hint: b drops object 2 right after publishing it; a's next request for it
    // costs one wasted fetch, then the right body from a's disk. A publication between
    // the eviction and the request would make the hint fresh again: retried then.
    let mut stale_seen = false;
    for attempt in 0..3u64 {
        let path = format!("/o/{}", 2 + attempt);
        let len = 3000 + (2 + attempt as usize) * 7;
        assert_eq!(get(b.addr(), &path), (200, body_of(2 + attempt, len)));
        let seen = counter(a, |k| k.directory_received.load(Ordering::Relaxed));
        wait_for("a publication at a", || {
            counter(a, |k| k.directory_received.load(Ordering::Relaxed)) >= seen + 4
        });
        assert!(b.coop().unwrap().0.evict(object_id(&path)));
        let wasted = counter(a, |k| k.wasted_fetches.load(Ordering::Relaxed));
        let misses = counter(a, |k| k.misses.load(Ordering::Relaxed));
        assert_eq!(
            get(a.addr(), &path),
            (200, body_of(2 + attempt, len)),
            "never a wrong body"
        );
        assert_eq!(counter(a, |k| k.misses.load(Ordering::Relaxed)), misses + 1);
        if counter(a, |k| k.wasted_fetches.load(Ordering::Relaxed)) == wasted + 1 {
            stale_seen = true;
            break;
        }
    }
    assert!(stale_seen, "a stale hint was never exercised in 3 attempts");
    assert_eq!(counter(a, |k| k.peer_errors.load(Ordering::Relaxed)), 0);
}

#[test]
fn forged_replayed_and_misattributed_directory_updates_are_refused() {
    let c = cluster(2, 1);
    let a = &c.nodes[0];
    let a_peer = a.coop().unwrap().1.unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut filter = BloomFilter::for_objects(10, 0.01);
    filter.insert(object_id("/o/0"));
    let update = DirectoryUpdate {
        node: 1,
        load: 0,
        epoch: 1_000_000,
        filter,
    };
    let refused = || counter(a, |k| k.directory_refused.load(Ordering::Relaxed));
    let received = || counter(a, |k| k.directory_received.load(Ordering::Relaxed));

    // Sealed with another key: refused.
    let forger = Sealer::new(farside_auth::siphash::SipKey::from_bytes(random_key()), 1).unwrap();
    let before = refused();
    udp.send_to(&forger.seal(&update.encode()).0, a_peer)
        .unwrap();
    wait_for("the forged update refused", || refused() == before + 1);

    // Sealed with the cluster key: accepted once, its replay refused.
    let sealer = Sealer::new(farside_auth::siphash::SipKey::from_bytes(c.key), 1).unwrap();
    let (genuine, _) = sealer.seal(&update.encode());
    let got = received();
    udp.send_to(&genuine, a_peer).unwrap();
    wait_for("the genuine update accepted", || received() > got);
    let before = refused();
    udp.send_to(&genuine, a_peer).unwrap();
    wait_for("the replayed update refused", || refused() == before + 1);

    // An authentic update about another node than its sender: refused.
    let liar = Sealer::new(farside_auth::siphash::SipKey::from_bytes(c.key), 1).unwrap();
    let about_a = DirectoryUpdate { node: 0, ..update };
    let before = refused();
    udp.send_to(&liar.seal(&about_a.encode()).0, a_peer)
        .unwrap();
    wait_for("the misattributed update refused", || {
        refused() == before + 1
    });
    assert_eq!(COOP_KEY_ID.0, 1);
}

/// Node b caches two bodies, 0 then 1; a reads 0 from b's arena one-sidedly (shm: no
/// process of b runs for it); then b takes body 2 and must evict one. Without the read
/// stamp b's LRU would evict 0 (b itself last used it before 1); with it, 0 counts as
/// recently used and 1 goes.
#[test]
fn a_body_read_one_sidedly_survives_eviction_over_one_not_read() {
    let c = cluster_with(2, 3, |coop, dir| {
        let shm = dir.join("arenas");
        std::fs::create_dir_all(&shm).unwrap();
        coop.peer = CoopPeer::Shm;
        coop.shm_dir = Some(shm);
        // Bodies 0 and 1 (3,000 and 3,007 B) fit, a third (3,014 B) does not.
        coop.cache_bytes = 6_100;
        coop.publish_ms = 10;
    });
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let local = |h| counter(h, |k| k.local_hits.load(Ordering::Relaxed));
    let misses = |h| counter(h, |k| k.misses.load(Ordering::Relaxed));
    assert_eq!(get(b.addr(), "/o/0"), (200, body_of(0, 3000)));
    assert_eq!(get(b.addr(), "/o/1"), (200, body_of(1, 3007)));
    assert_eq!(misses(b), 2);
    // a's view of b must have both: two publications of b after the second insert.
    let seen = counter(a, |k| k.directory_received.load(Ordering::Relaxed));
    wait_for("b's directory at a", || {
        counter(a, |k| k.directory_received.load(Ordering::Relaxed)) >= seen + 2
    });
    let b_local = local(b);
    assert_eq!(get(a.addr(), "/o/0"), (200, body_of(0, 3000)));
    assert_eq!(
        counter(a, |k| k.remote_hits.load(Ordering::Relaxed)),
        1,
        "a read body 0 from b's arena"
    );
    assert_eq!(local(b), b_local, "b's process served nothing for it");
    assert_eq!(counter(b, |k| k.peer_served.load(Ordering::Relaxed)), 0);
    // b takes body 2: one of 0 and 1 must go.
    assert_eq!(get(b.addr(), "/o/2"), (200, body_of(2, 3014)));
    assert_eq!(misses(b), 3);
    assert_eq!(get(b.addr(), "/o/0"), (200, body_of(0, 3000)));
    assert_eq!(
        (local(b), misses(b)),
        (b_local + 1, 3),
        "body 0, read only by a peer, is still cached at b"
    );
    assert_eq!(get(b.addr(), "/o/1"), (200, body_of(1, 3007)));
    assert_eq!(misses(b), 4, "body 1 was evicted");
}

/// The per-message overhead ablation (`--coop-message-overhead-us`): a remote hit over
/// tcp spins at the initial node for its fetch sent and its reply received, at the
/// service node for the fetch received and the reply sent, so the fetch lasts at least
/// those four spins; every directory update sent or received spins too. At 0 nothing is
/// spun on any message.
#[test]
fn the_message_overhead_spins_per_peer_message_and_zero_spins_nothing() {
    const OVERHEAD_US: u64 = 300;
    for us in [OVERHEAD_US, 0] {
        let c = cluster_with(2, 2, |coop, _| coop.message_overhead_us = us);
        let (a, b) = (&c.nodes[0], &c.nodes[1]);
        let spins = |h| counter(h, |k| k.overhead.spins());
        let received = |h| counter(h, |k| k.directory_received.load(Ordering::Relaxed));
        let sent = |h| counter(h, |k| k.directory_sent.load(Ordering::Relaxed));
        assert_eq!(get(b.addr(), "/o/1"), (200, body_of(1, 3007)));
        let seen = received(a);
        wait_for("b's directory at a", || received(a) >= seen + 2);
        // Each message's spin is counted before the message is acted on.
        let messages = received(a) + sent(a);
        let (a0, b0) = (spins(a), spins(b));
        let fetch_us = counter(a, |k| k.remote_fetch_us.load(Ordering::Relaxed));
        assert_eq!(get(a.addr(), "/o/1"), (200, body_of(1, 3007)));
        assert_eq!(counter(a, |k| k.remote_hits.load(Ordering::Relaxed)), 1);
        let fetch_us = counter(a, |k| k.remote_fetch_us.load(Ordering::Relaxed)) - fetch_us;
        let (_, stats) = get(a.addr(), "/coop/stats");
        let stats = String::from_utf8(stats).unwrap();
        if us == 0 {
            assert_eq!((spins(a), spins(b)), (0, 0), "0 spins nothing");
            assert!(stats.contains("overhead_spins 0\n"), "{stats}");
            continue;
        }
        assert!(
            a0 >= messages,
            "{a0} spins for {messages} directory messages"
        );
        assert!(spins(a) >= a0 + 2, "fetch sent, reply received");
        assert!(spins(b) >= b0 + 2, "fetch received, reply sent");
        assert!(
            fetch_us >= 4 * OVERHEAD_US,
            "the fetch took {fetch_us} µs, less than its four spins"
        );
        assert!(!stats.contains("overhead_spins 0\n"), "{stats}");
        assert!(stats.contains("overhead_spins "), "{stats}");
    }
}

/// `--coop-directory read` (shm): each node writes its directory record into its own
/// arena and its peer reads it from there; a learns what b caches and serves a remote hit
/// with no directory datagram sent by either node, and even a genuine, sealed directory
/// datagram is not applied in this mode.
#[test]
fn directories_read_from_the_peers_arenas_give_remote_hits_with_no_datagram() {
    let c = cluster_with(2, 4, |coop, dir| {
        let shm = dir.join("arenas");
        std::fs::create_dir_all(&shm).unwrap();
        coop.peer = CoopPeer::Shm;
        coop.shm_dir = Some(shm);
        coop.directory = CoopDirectory::Read;
        coop.publish_ms = 10;
    });
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let k = |h, f: fn(&farside_backend::coop::Counters) -> &std::sync::atomic::AtomicU64| {
        counter(h, |c| f(c).load(Ordering::Relaxed))
    };
    assert_eq!(get(b.addr(), "/o/1"), (200, body_of(1, 3007)));
    // Two records of b applied at a after the insert: a's view holds object 1.
    let seen = k(a, |c| &c.directory_received);
    wait_for("b's records read at a", || {
        k(a, |c| &c.directory_received) >= seen + 2
    });
    assert_eq!(get(a.addr(), "/o/1"), (200, body_of(1, 3007)));
    assert_eq!(k(a, |c| &c.remote_hits), 1, "a read body 1 from b's arena");
    assert_eq!(k(a, |c| &c.misses), 0);
    assert_eq!(k(b, |c| &c.peer_served), 0, "b's process served nothing");
    for h in [a, b] {
        assert_eq!(k(h, |c| &c.directory_sent), 0, "no directory datagram");
        assert!(k(h, |c| &c.directory_put) > 0);
        assert!(k(h, |c| &c.directory_reads) > 0);
        assert!(k(h, |c| &c.directory_read_bytes) > 0);
    }

    // A sealed datagram (the cluster key) claiming b caches object 3: not applied.
    let mut filter = BloomFilter::for_objects(10, 0.01);
    filter.insert(object_id("/o/3"));
    let update = DirectoryUpdate {
        node: 1,
        load: 0,
        epoch: u64::MAX - 1,
        filter,
    };
    let sealer = Sealer::new(farside_auth::siphash::SipKey::from_bytes(c.key), 1).unwrap();
    let refused = k(a, |c| &c.directory_refused);
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(
            &sealer.seal(&update.encode()).0,
            a.coop().unwrap().1.unwrap(),
        )
        .unwrap();
    wait_for("the datagram refused", || {
        k(a, |c| &c.directory_refused) == refused + 1
    });
    let wasted = k(a, |c| &c.wasted_fetches);
    assert_eq!(get(a.addr(), "/o/3"), (200, body_of(3, 3021)));
    assert_eq!(k(a, |c| &c.wasted_fetches), wasted, "no fetch on its word");
}

/// `--coop-directory write` needs `--coop-peer xdp` (the peer's XDP program answers the
/// WRITEs; a shm peer's arena is mapped read-only) and an arena key id outside the
/// directory writers' ids; the message names the flag.
#[test]
fn directory_write_needs_xdp_and_a_reader_key_id_of_its_own() {
    let mut a = CoopArgs {
        coop: true,
        peers: vec![free_port(), free_port()],
        key_file: Some("/nonexistent".into()),
        directory: CoopDirectory::Write,
        ..CoopArgs::default()
    };
    for (peer, shm) in [(CoopPeer::Tcp, None), (CoopPeer::Shm, Some("/tmp".into()))] {
        a.peer = peer;
        a.shm_dir = shm;
        let e = a.validate(true).unwrap_err();
        assert!(
            e.contains("--coop-directory write needs --coop-peer xdp"),
            "{e}"
        );
    }
    a.peer = CoopPeer::Xdp;
    a.shm_dir = None;
    a.coop_arena_iface = Some("veth0".into());
    a.coop_arena_key = Some("1:/k".into());
    a.validate(true).unwrap();
    let base = farside_backend::coop::dirwrite::DIRECTORY_WRITE_KEY_BASE;
    a.coop_arena_key = Some(format!("{}:/k", base + 3));
    assert!(a.validate(true).unwrap_err().contains("--coop-arena-key"));
    a.policy = CoopPolicy::Rr;
    assert!(a
        .validate(true)
        .unwrap_err()
        .contains("needs --coop-policy press"));
}
