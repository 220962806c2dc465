//! Unit tests of the simulator.

use super::*;
use crate::policy::{BoundedHash, Lard, Press, RemoteMode, RoundRobin};

/// A small synthetic trace: Zipf-like popularity over `objects` objects.
fn synthetic(objects: u32, requests: usize, seed: u64) -> Trace {
    let mut rng = Rng(seed);
    let object_bytes = (0..objects).map(|i| 500 + (i * 7919) % 20_000).collect();
    let requests = (0..requests)
        .map(|_| {
            // Squaring a uniform number skews towards small ids.
            let u = rng.below(1 << 20) as f64 / (1 << 20) as f64;
            (u * u * u * objects as f64) as u32
        })
        .collect();
    Trace {
        object_bytes,
        requests,
        clients: Vec::new(),
    }
}

fn policies(nodes: usize) -> Vec<Policy> {
    vec![
        Policy::Press(Press::new(RemoteMode::OneSided)),
        Policy::Press(Press::new(RemoteMode::Forward)),
        Policy::Lard(Lard::default()),
        Policy::BoundedHash(BoundedHash::new(nodes, 125)),
        Policy::RoundRobin(RoundRobin::default()),
    ]
}

/// Two clients' streams in [`Trace::interleaved`]'s layout: client 0 takes `a`,
/// client 1 takes `b` (the same length).
fn two_streams(a: &[u32], b: &[u32]) -> Trace {
    Trace {
        object_bytes: vec![4096; 64],
        requests: a.iter().zip(b).flat_map(|(&x, &y)| [x, y]).collect(),
        clients: Vec::new(),
    }
}

/// Four users taking turns in the log, each asking `per_user` times for an object of
/// its own (user `u` for object `u`, 4 KB).
fn four_users(per_user: usize) -> Trace {
    Trace {
        object_bytes: vec![4096; 4],
        requests: (0..4 * per_user).map(|r| (r % 4) as u32).collect(),
        clients: (0..4 * per_user).map(|r| (r % 4) as u32).collect(),
    }
}

#[test]
fn sessions_keep_a_users_requests_on_its_node_and_take_the_instances_next_user() {
    // The lab's load generators: node 0's instance starts at user 0's first row,
    // node 1's at user 2's; each has one client, which replays a user's whole
    // session, then the next user's. A node's cache holds two objects.
    let trace = four_users(100);
    assert_eq!(
        trace.sessions()[1],
        (0..100).map(|i| 1 + 4 * i).collect::<Vec<u32>>()
    );
    let mut cfg = SimConfig::new(2, 2 * 4096);
    cfg.clients_per_node = 1;
    cfg.warmup_fraction = 0.0;
    cfg.arrival = Arrival::Sessions(SessionReplay {
        per_client: 200,
        start_rows: vec![0, 2],
    });
    let r = run(&cfg, &trace, Policy::Press(Press::new(RemoteMode::Forward)));
    r.check().unwrap();
    // Node 0 serves users 0 then 1, node 1 users 2 then 3: each user's first request
    // reads the disk, the other 99 hit the node's own cache.
    assert_eq!(r.measured, 400);
    assert_eq!(
        (r.local.requests, r.forwarded.requests, r.miss.requests),
        (396, 0, 4)
    );
    // The same rows replayed from each client's offset in the log (the simulation's
    // earlier stream) mix the four users at both nodes, whose caches then hold
    // objects the other node asks for.
    cfg.arrival = Arrival::PinnedClients;
    let r = run(
        &cfg,
        &trace.interleaved(2, 200),
        Policy::Press(Press::new(RemoteMode::Forward)),
    );
    r.check().unwrap();
    assert!(r.local.requests < 300, "{:?}", r.fractions());
}

#[test]
fn sessions_wrap_around_and_a_trace_without_users_replays_rows_in_turn() {
    // One client per node, start rows 3 (user 3) and 0 (user 0): node 0 replays
    // user 3's 5 requests, then user 0's (the sessions wrap).
    let trace = four_users(5);
    let mut cfg = SimConfig::new(2, 4 * 4096);
    cfg.clients_per_node = 1;
    cfg.warmup_fraction = 0.0;
    cfg.arrival = Arrival::Sessions(SessionReplay {
        per_client: 10,
        start_rows: vec![3, 0],
    });
    let r = run(&cfg, &trace, Policy::Independent);
    r.check().unwrap();
    // Node 0 reads objects 3 and 0, node 1 objects 0 and 1: four reads, 16 hits.
    assert_eq!((r.local.requests, r.miss.requests), (16, 4));
    // Without users each row is a session: node 0 from row 3 asks for 3, 0, 1, 2,
    // 3, ...; node 1 from row 0 for 0, 1, 2, 3, ...: each node reads all 4 once.
    let rows = Trace {
        clients: Vec::new(),
        ..trace
    };
    let r = run(&cfg, &rows, Policy::Independent);
    r.check().unwrap();
    assert_eq!((r.local.requests, r.miss.requests), (12, 8));
}

#[test]
fn a_wasted_forward_reads_the_answering_nodes_disk_which_then_holds_a_copy() {
    // As farside backend --coop: node 0 forwards object 7 on a stale hint (node 1
    // evicted it after the last publication); node 1 answers "absent", node 0 reads
    // its own disk and caches 7, so its later requests for 7 are local hits.
    //   node 1: object 7 for ~140 ms (held at the 100 ms publication), then a
    //           distinct object every ~0.56 ms (its one-object cache drops 7);
    //   node 0: distinct objects for ~180 ms, then object 7 (the 200 ms
    //           publication has not yet told it 7 is gone).
    let a: Vec<u32> = (20..340).chain(std::iter::repeat_n(7, 2980)).collect();
    let b: Vec<u32> = std::iter::repeat_n(7, 3000).chain(340..640).collect();
    let trace = Trace {
        object_bytes: vec![4096; 640],
        requests: a.iter().zip(&b).flat_map(|(&x, &y)| [x, y]).collect(),
        clients: Vec::new(),
    };
    let mut cfg = SimConfig::new(2, 4096);
    cfg.clients_per_node = 1;
    cfg.warmup_fraction = 0.0;
    cfg.directory_period_ns = 100_000_000;
    cfg.load_period_ns = 100_000_000;
    cfg.arrival = Arrival::PinnedClients;
    let r = run(&cfg, &trace, Policy::Press(Press::new(RemoteMode::Forward)));
    r.check().unwrap();
    assert_eq!(r.wasted_forwards, 1, "{:?}", r.fractions());
    assert_eq!(r.forwarded.requests, 0, "node 0 now holds 7: no forward");
    assert!(r.local.requests >= 2979 + 2999, "{:?}", r.local);
}

#[test]
fn a_published_directory_is_sized_for_the_objects_its_node_holds() {
    // Node 1 holds 200 small objects in a cache sized for far more; node 0 asks for
    // 5,000 objects nobody holds. The back-end sizes each published filter for the
    // objects held at 1 % false positives, so about 1 % of node 0's requests follow
    // a false hint to node 1 (a filter sized for the cache's capacity would be
    // sparser and almost never wrong).
    let a: Vec<u32> = (1000..6000).collect();
    let b: Vec<u32> = (0..5000).map(|i| i % 200).collect();
    let trace = Trace {
        object_bytes: vec![1000; 6000],
        requests: a.iter().zip(&b).flat_map(|(&x, &y)| [x, y]).collect(),
        clients: Vec::new(),
    };
    let mut cfg = SimConfig::new(2, 100_000_000);
    cfg.clients_per_node = 1;
    cfg.warmup_fraction = 0.0;
    cfg.arrival = Arrival::PinnedClients;
    let r = run(&cfg, &trace, Policy::Press(Press::new(RemoteMode::Forward)));
    r.check().unwrap();
    assert!(
        (25..=100).contains(&r.wasted_forwards),
        "{} wasted forwards of 5000",
        r.wasted_forwards
    );
}

#[test]
fn merged_reports_sum_the_counts_and_pool_the_rates() {
    let trace = synthetic(300, 5_000, 4);
    let cfg = SimConfig::new(2, 300_000);
    let a = run(
        &cfg,
        &trace,
        Policy::Press(Press::new(RemoteMode::OneSided)),
    );
    let b = run(
        &SimConfig { seed: 2, ..cfg },
        &trace,
        Policy::Press(Press::new(RemoteMode::OneSided)),
    );
    let m = SimReport::merge(&[a.clone(), b.clone()]);
    m.check().unwrap();
    assert_eq!(m.measured, a.measured + b.measured);
    assert_eq!(m.local.requests, a.local.requests + b.local.requests);
    let x = (a.completed_in_window + b.completed_in_window) as f64
        / ((a.window_ns + b.window_ns) as f64 / 1e9);
    assert!((m.throughput_rps() - x).abs() < 1e-6 * x);
    assert_eq!(SimReport::merge(std::slice::from_ref(&a)), a);
}

#[test]
fn pinned_clients_send_every_request_to_their_own_node() {
    // Client 0 asks only for object 0, client 1 only for object 1; a node's cache
    // holds one of them.
    let trace = two_streams(&[0; 400], &[1; 400]);
    let mut cfg = SimConfig::new(2, 4096);
    cfg.clients_per_node = 1;
    cfg.arrival = Arrival::PinnedClients;
    let r = run(&cfg, &trace, Policy::Press(Press::new(RemoteMode::Forward)));
    r.check().unwrap();
    assert_eq!(r.measured, 640);
    // Each node only ever sees its own client's object: after the first misses
    // (in the warm-up) every request is a local hit.
    assert_eq!(
        (r.local.requests, r.forwarded.requests, r.miss.requests),
        (640, 0, 0)
    );
    // Drawn per request, the same streams cross: node 0 is asked for object 1, which
    // node 1 holds.
    cfg.arrival = Arrival::Shared;
    let r = run(&cfg, &trace, Policy::Press(Press::new(RemoteMode::Forward)));
    r.check().unwrap();
    assert!(r.forwarded.requests > 100, "{:?}", r.forwarded);
}

#[test]
fn a_press_node_is_not_overloaded_by_requests_it_finished_since_the_last_sample() {
    // Client 0 (node 0) asks for object 0 all the time, so node 0 caches it and is
    // sent far more than PRESS's overload threshold (65) within one long load period.
    // Client 1 (node 1) first reads 10 other objects from disk (while node 0 serves
    // about a hundred hits), then asks for object 0: node 0 never has more than one
    // request in flight, so node 1 must fetch it from node 0 every time, never read
    // it from disk (a replica at node 1).
    let mut b: Vec<u32> = (1..=10).collect();
    b.resize(400, 0);
    let trace = two_streams(&[0; 400], &b);
    let mut cfg = SimConfig::new(2, 1 << 20);
    cfg.clients_per_node = 1;
    cfg.arrival = Arrival::PinnedClients;
    cfg.warmup_fraction = 0.0;
    cfg.load_period_ns = 1_000_000_000;
    cfg.directory_period_ns = 1_000_000;
    let r = run(&cfg, &trace, Policy::Press(Press::new(RemoteMode::Forward)));
    r.check().unwrap();
    assert_eq!(r.forwarded.requests, 390, "{:?}", r.fractions());
    assert_eq!(r.miss.requests, 11);
}

#[test]
fn every_policy_answers_every_request_once_from_a_holder() {
    let trace = synthetic(500, 20_000, 3);
    for nodes in [1, 3, 4] {
        for p in policies(nodes) {
            let cfg = SimConfig::new(nodes, 400_000);
            let r = run(&cfg, &trace, p);
            r.check()
                .unwrap_or_else(|e| panic!("{} on {nodes}: {e}", r.policy));
            assert_eq!(r.measured, 16_000);
        }
    }
}

#[test]
fn greedy_dual_size_caches_keep_the_invariants_and_hit_more_small_objects() {
    let trace = synthetic(1000, 20_000, 8);
    let mut cfg = SimConfig::new(2, 300_000);
    let lru = run(&cfg, &trace, Policy::RoundRobin(RoundRobin::default()));
    cfg.replacement = Replacement::GreedyDualSize;
    let gds = run(&cfg, &trace, Policy::RoundRobin(RoundRobin::default()));
    gds.check().unwrap();
    assert!(
        gds.miss.requests < lru.miss.requests,
        "{} vs {}",
        gds.miss.requests,
        lru.miss.requests
    );
}

#[test]
fn pushed_directories_keep_the_invariants_and_cost_no_more_than_pulled_ones() {
    let trace = synthetic(1000, 20_000, 9);
    let mut cfg = SimConfig::new(4, 500_000);
    let pull = run(
        &cfg,
        &trace,
        Policy::Press(Press::new(RemoteMode::OneSided)),
    );
    cfg.directory_update = DirectoryUpdate::Push;
    let push = run(
        &cfg,
        &trace,
        Policy::Press(Press::new(RemoteMode::OneSided)),
    );
    push.check().unwrap();
    let total = |r: &SimReport| r.directory_cpu.iter().sum::<f64>();
    assert!(total(&pull) > 0.0);
    assert!(
        total(&push) <= total(&pull),
        "push sends only changed filters"
    );
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let trace = synthetic(300, 5_000, 4);
    let cfg = SimConfig::new(3, 300_000);
    let a = run(
        &cfg,
        &trace,
        Policy::Press(Press::new(RemoteMode::OneSided)),
    );
    let b = run(
        &cfg,
        &trace,
        Policy::Press(Press::new(RemoteMode::OneSided)),
    );
    assert_eq!(a, b);
    let c = run(
        &SimConfig { seed: 2, ..cfg },
        &trace,
        Policy::Press(Press::new(RemoteMode::OneSided)),
    );
    assert_ne!(a.remote, c.remote);
}

#[test]
fn stale_directories_cost_wasted_fetches_never_wrong_bodies() {
    let trace = synthetic(2000, 20_000, 5);
    let mut cfg = SimConfig::new(4, 200_000);
    cfg.directory_period_ns = 200_000_000; // very stale hints
    let r = run(
        &cfg,
        &trace,
        Policy::Press(Press::new(RemoteMode::OneSided)),
    );
    r.check().unwrap();
    assert!(r.wasted_fetches > 0, "stale hints were exercised");
}

#[test]
fn no_cooperation_without_peers_and_all_misses_without_cache() {
    let trace = synthetic(200, 5_000, 6);
    let r = run(
        &SimConfig::new(1, 10_000_000),
        &trace,
        Policy::Press(Press::new(RemoteMode::OneSided)),
    );
    assert_eq!(r.remote.requests, 0);
    let r = run(&SimConfig::new(2, 0), &trace, Policy::Lard(Lard::default()));
    assert_eq!(r.miss.requests, r.measured);
}

#[test]
fn utilisation_law_and_littles_law_hold_on_the_output() {
    let trace = synthetic(1000, 40_000, 7);
    for think_ns in [0, 2_000_000] {
        let mut cfg = SimConfig::new(3, 2_000_000);
        cfg.think_ns = think_ns;
        let r = run(
            &cfg,
            &trace,
            Policy::Press(Press::new(RemoteMode::OneSided)),
        );
        r.check().unwrap();
        let x = r.throughput_rps();
        // Utilisation law: U = X D, for every node and resource.
        for n in 0..cfg.nodes {
            for k in 0..3 {
                let background = if k == CPU { r.directory_cpu[n] } else { 0.0 };
                let predicted = x * r.demand_ns[n][k] / 1e9 + background;
                let u = r.utilisation[n][k];
                assert!(
                    (u - predicted).abs() <= 0.02 + 0.02 * u,
                    "U {u} vs XD {predicted} ({n},{k})"
                );
            }
        }
        // Little's law: N = X R over the window.
        let little = x * r.mean_response_ns / 1e9;
        let n = r.mean_in_system;
        assert!(
            (n - little).abs() <= 0.03 * n,
            "N {n} vs XR {little} (think {think_ns})"
        );
    }
}
