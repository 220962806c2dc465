//! Content-aware balancing (`--balance lard | bounded-hash`) through the real control
//! layer and data path:
//! - a seeded simulation drives `Control` with the World Cup sample against per-back-end
//!   byte-bounded caches: routing by path multiplies the hits over least-loaded, and
//!   bounded hashing never sends a request to a back-end at its load bound while
//!   another is under it;
//! - real back-ends behind the real proxy: the same URL goes to the same back-end,
//!   URLs spread over the back-ends, and concurrent requests for one URL leave its
//!   back-end once it is at its load bound (LARD's T_high, the hash's balance factor).

use farside_coop::cache::LruCache;
use farside_coop::trace::{world_cup_sample_path, Trace};
use farside_proxy::config::{BackendConfig, BalancePolicy, ProxyConfig};
use farside_proxy::control::Control;
use farside_proxy::gate::{Gate, Route};
use farside_proxy::server;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn backends(addrs: &[SocketAddr]) -> Vec<BackendConfig> {
    addrs
        .iter()
        .map(|&addr| BackendConfig {
            addr,
            site: String::new(),
            region: None,
            limit: None,
            maxconn: None,
        })
        .collect()
}

fn config(addrs: &[SocketAddr], policy: BalancePolicy) -> ProxyConfig {
    let mut cfg = ProxyConfig::simple("127.0.0.1:0".parse().unwrap(), backends(addrs));
    cfg.balance.policy = policy;
    cfg.validate().unwrap();
    cfg
}

/// Nodes of the simulation and its closed-loop clients.
const SIM_NODES: usize = 4;
const SIM_CLIENTS: usize = 16;
/// Requests of the sample the simulation replays.
const SIM_REQUESTS: usize = 30_000;
/// Service time of a hit and of a miss, ticks.
const HIT_TICKS: u64 = 1;
const MISS_TICKS: u64 = 20;

/// Replays the sample through `Control` with `policy`: each request holds its route's
/// in-flight guard for its service time (a hit or a miss of the chosen node's LRU cache
/// of a quarter of W90, the lab's cache rule), scaled by the requests already at that
/// node (processor sharing). Returns the hit fraction; `check` sees every decision
/// with the loads just before it.
fn simulate(policy: BalancePolicy, check: &mut dyn FnMut(&[u64], usize)) -> f64 {
    let trace = Trace::read_world_cup(&world_cup_sample_path()).unwrap();
    let cache_bytes = trace.working_set_bytes(0.9).div_ceil(SIM_NODES as u64);
    let addrs: Vec<SocketAddr> = (0..SIM_NODES)
        .map(|i| format!("127.0.0.1:{}", 1000 + i).parse().unwrap())
        .collect();
    let ctl = Control::new(&config(&addrs, policy)).unwrap();
    let mut caches: Vec<LruCache> = (0..SIM_NODES).map(|_| LruCache::new(cache_bytes)).collect();
    let mut inflight = [0u64; SIM_NODES];
    let mut held: Vec<Option<Route>> = (0..SIM_CLIENTS).map(|_| None).collect();
    let mut done: BinaryHeap<Reverse<(u64, usize)>> =
        (0..SIM_CLIENTS).map(|c| Reverse((0, c))).collect();
    let (mut hits, mut evicted) = (0u64, Vec::new());
    let requests = &trace.requests[..SIM_REQUESTS.min(trace.requests.len())];
    for &object in requests {
        let Reverse((now, client)) = done.pop().expect("a client is always waiting");
        if let Some(r) = held[client].take() {
            inflight[r.backend] -= 1;
        }
        let path = format!("/o/{object}.html");
        let route = ctl.route_request(None, path.as_bytes()).expect("routed");
        let node = route.backend;
        check(&inflight, node);
        let bytes = u64::from(trace.object_bytes[object as usize]).max(1);
        let hit = caches[node].touch(u64::from(object));
        if hit {
            hits += 1;
        } else {
            caches[node].insert(u64::from(object), bytes, &mut evicted);
        }
        let ticks = if hit { HIT_TICKS } else { MISS_TICKS } * (1 + inflight[node]);
        inflight[node] += 1;
        held[client] = Some(route);
        done.push(Reverse((now + ticks, client)));
    }
    hits as f64 / requests.len() as f64
}

#[test]
fn routing_by_path_multiplies_cache_hits_and_bounded_hash_keeps_its_bound() {
    let least = simulate(BalancePolicy::LeastLoaded, &mut |_, _| {});
    let lard = simulate(BalancePolicy::Lard, &mut |_, _| {});
    let mut over_bound = 0;
    let bounded = simulate(BalancePolicy::BoundedHash, &mut |load, node| {
        let total: u64 = load.iter().sum();
        let limit = ((total + 1) * 125).div_ceil(100 * SIM_NODES as u64);
        if load[node] >= limit && load.iter().any(|&l| l < limit) {
            over_bound += 1;
        }
    });
    eprintln!("hit fractions: least-loaded {least:.3}, lard {lard:.3}, bounded-hash {bounded:.3}");
    assert_eq!(over_bound, 0, "bounded-hash sent a request past its bound");
    // Each node caches a quarter of the hot set: by path the cluster holds it once.
    assert!(lard > least + 0.1, "lard {lard} vs least-loaded {least}");
    assert!(
        bounded > least + 0.1,
        "bounded-hash {bounded} vs least-loaded {least}"
    );
}

#[test]
fn a_path_leaves_a_back_end_marked_down_and_requests_without_a_target_still_route() {
    let addrs: Vec<SocketAddr> = (0..3)
        .map(|i| format!("127.0.0.1:{}", 1000 + i).parse().unwrap())
        .collect();
    for policy in [BalancePolicy::Lard, BalancePolicy::BoundedHash] {
        let ctl = Control::new(&config(&addrs, policy)).unwrap();
        let home = ctl.choose_for(None, b"/a.gif").unwrap();
        assert_eq!(
            ctl.choose_for(None, b"/a.gif?x=1").unwrap(),
            home,
            "{policy:?}"
        );
        ctl.report_failure(home);
        let moved = ctl.choose_for(None, b"/a.gif").unwrap();
        assert_ne!(moved, home, "{policy:?}: its back-end is down");
        assert!(
            ctl.choose(None).is_ok(),
            "{policy:?}: no target: least-loaded"
        );
    }
    let mut cfg = config(&addrs, BalancePolicy::Lard);
    cfg.balance.lard_low = 70;
    assert!(cfg.validate().is_err(), "lard_low above lard_high");
    let mut cfg = config(&addrs, BalancePolicy::BoundedHash);
    cfg.balance.hash_balance_factor = 50;
    assert!(cfg.validate().is_err(), "a factor under 100 %");
    let many: Vec<SocketAddr> = (0..65)
        .map(|i| format!("127.0.0.1:{}", 1000 + i).parse().unwrap())
        .collect();
    let mut cfg = ProxyConfig::simple("127.0.0.1:0".parse().unwrap(), backends(&many));
    cfg.balance.policy = BalancePolicy::BoundedHash;
    assert!(
        cfg.validate().is_err(),
        "more back-ends than the policies hold"
    );
}

/// How long a back-end holds a request for a path under `/slow/`: long enough that
/// requests sent together overlap at the proxy.
const SLOW: Duration = Duration::from_millis(400);

/// A keep-alive back-end answering every GET with its own index as the body, after
/// [`SLOW`] for paths under `/slow/`.
async fn backend(index: usize) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    }
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        if head.split(' ').nth(1).unwrap_or("").starts_with("/slow/") {
                            tokio::time::sleep(SLOW).await;
                        }
                        let body = index.to_string();
                        let r = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if s.write_all(r.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// The index of the back-end that answered `GET path` through `proxy`.
async fn served_by(proxy: SocketAddr, path: &str) -> usize {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("");
    body.parse().unwrap_or_else(|_| panic!("{out}"))
}

async fn locality(policy: BalancePolicy) {
    let mut addrs = Vec::new();
    for i in 0..4 {
        addrs.push(backend(i).await);
    }
    let mut cfg = config(&addrs, policy);
    // LARD: a path leaves its back-end above 2 requests in service while another has
    // none (with the defaults it would take 66).
    cfg.balance.lard_low = 1;
    cfg.balance.lard_high = 2;
    let ctl = Control::new(&cfg).unwrap();
    let p = server::start(cfg, Arc::new(ctl)).await.unwrap();
    let mut used = BTreeSet::new();
    for k in 0..24 {
        let path = format!("/img/{k}.gif");
        let first = served_by(p.addr, &path).await;
        for _ in 0..3 {
            assert_eq!(served_by(p.addr, &path).await, first, "{policy:?} {path}");
        }
        used.insert(first);
    }
    assert!(used.len() >= 3, "{policy:?}: 24 paths over {used:?}");
    // One path, one at a time: its home. Then six at once: past the bound, others.
    let home = served_by(p.addr, "/slow/big.mov").await;
    assert_eq!(served_by(p.addr, "/slow/big.mov").await, home);
    let together: Vec<usize> = futures_join(p.addr, "/slow/big.mov", 6).await;
    let at_home = together.iter().filter(|&&b| b == home).count();
    assert!(at_home >= 1, "{policy:?}: {together:?} (home {home})");
    assert!(
        at_home < together.len(),
        "{policy:?}: all six at home {home}: the load bound never acted"
    );
    p.stop().await;
}

/// `n` concurrent `GET path`, the back-end of each.
async fn futures_join(proxy: SocketAddr, path: &str, n: usize) -> Vec<usize> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let path = path.to_string();
            tokio::spawn(async move { served_by(proxy, &path).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lard_keeps_each_url_on_one_back_end_until_its_thresholds() {
    locality(BalancePolicy::Lard).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_hash_keeps_each_url_on_one_back_end_until_its_bound() {
    locality(BalancePolicy::BoundedHash).await;
}
