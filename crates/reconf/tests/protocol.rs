//! Protocol tests: directed scenarios on a hand-driven memory (ops applied at once, or
//! held back to model a message still in flight), and bounded simulator runs.

use farside_reconf::sim::{self, Rng, SimConfig};
use farside_reconf::words::{W_ROLE_SERVED, W_ROLE_WANTED, W_SHARED_COUNTER, W_SITE_LOCK};
use farside_reconf::{
    Balancer, BalancerConfig, Completion, Ctx, Issue, Lock, Op, Role, Target, Topology,
};
use std::collections::{HashMap, VecDeque};

const S_NS: u64 = 1_000_000_000;
const LEASE_NS: u64 = 3_000_000_000;
const LOAD_WORD: usize = farside_region::layout::W_CPU_UTIL_PPM;

/// Region words of every node and balancer; ops apply atomically and at once.
#[derive(Default)]
struct World {
    mem: HashMap<(Target, usize), u64>,
}

impl World {
    fn get(&self, t: Target, w: usize) -> u64 {
        *self.mem.get(&(t, w)).unwrap_or(&0)
    }
    fn set(&mut self, t: Target, w: usize, v: u64) {
        self.mem.insert((t, w), v);
    }
    fn apply(&mut self, op: &Op) -> Completion {
        match *op {
            Op::Read { target, word, len } => {
                Completion::Read((word..word + len).map(|w| self.get(target, w)).collect())
            }
            Op::Write {
                target,
                word,
                value,
            } => {
                self.set(target, word, value);
                Completion::Written
            }
            Op::Cas {
                target,
                word,
                expect,
                new,
            } => {
                let prev = self.get(target, word);
                if prev == expect {
                    self.set(target, word, new);
                }
                Completion::Cas(prev)
            }
            Op::Fadd {
                target,
                word,
                delta,
            } => {
                let prev = self.get(target, word);
                self.set(target, word, prev.wrapping_add(delta));
                Completion::Fadd(prev)
            }
        }
    }
    fn node_role(&self, n: u32) -> Role {
        Role(self.get(Target::Node(n), W_ROLE_WANTED))
    }
    /// A node settled in `site` with `load_ppm`.
    fn place(&mut self, n: u32, site: u16, load_ppm: u64) {
        let r = Role::new(site, 1);
        self.set(Target::Node(n), W_ROLE_WANTED, r.0);
        self.set(Target::Node(n), W_ROLE_SERVED, r.0);
        self.set(Target::Node(n), LOAD_WORD, load_ppm);
    }
}

fn ctx(w: &World, b: u32, now: u64) -> Ctx {
    Ctx {
        now_ns: now,
        shared_counter: w.get(Target::Balancer(b), W_SHARED_COUNTER),
    }
}

/// One round of `b` at `now`: tick, then complete every op at once, except those
/// `hold` picks, which are returned still in flight (their sender never hears back).
fn round(
    b: &mut Balancer,
    w: &mut World,
    now: u64,
    hold: &mut dyn FnMut(&Op) -> bool,
) -> Vec<Issue> {
    let mut out = Vec::new();
    b.on_tick(ctx(w, b.id(), now), &mut out);
    let mut q: VecDeque<Issue> = out.drain(..).collect();
    let mut held = Vec::new();
    while let Some(i) = q.pop_front() {
        if hold(&i.op) {
            held.push(i);
            continue;
        }
        let c = w.apply(&i.op);
        b.on_completion(ctx(w, b.id(), now), i.id, c, &mut out);
        q.extend(out.drain(..));
    }
    held
}

fn is_move(op: &Op) -> bool {
    matches!(op, Op::Cas { word, .. } if *word == W_ROLE_WANTED)
}

fn cfg(fence: bool) -> BalancerConfig {
    BalancerConfig {
        sensitivity_ns: S_NS,
        history_ns: 0,
        lease_ns: LEASE_NS,
        fence_on_takeover: fence,
        ..BalancerConfig::default()
    }
}

/// Site 1 (nodes 1, 5) overloaded; site 0 (anchor 0, nodes 2, 3, 4) can spare one.
fn two_sites(balancers: u32, fence: bool) -> (World, Vec<Balancer>) {
    let mut w = World::default();
    for (n, site, load) in [
        (0, 0, 100_000),
        (1, 1, 950_000),
        (2, 0, 100_000),
        (3, 0, 200_000),
        (4, 0, 300_000),
        (5, 1, 950_000),
    ] {
        w.place(n, site, load);
    }
    let topo = Topology {
        nodes: 6,
        anchors: vec![0, 1],
        balancers,
    };
    let bals = (0..balancers)
        .map(|b| Balancer::new(b, cfg(fence), topo.clone()).unwrap())
        .collect();
    (w, bals)
}

/// Balancer 0 announces node 2 and sends its move CAS, which stays in flight while
/// balancer 0 dies; balancer 1 takes the expired lock over and moves node 3; then the
/// stale CAS lands. Returns (stale CAS applied?, node 2's wanted site, balancer 1 moves).
fn stale_move_after_takeover(fence: bool) -> (bool, u16, u64) {
    let (mut w, mut bals) = two_sites(2, fence);
    let mut b1 = bals.pop().unwrap();
    let mut b0 = bals.pop().unwrap();
    let held = round(&mut b0, &mut w, 0, &mut |op| is_move(op));
    assert_eq!(held.len(), 1, "balancer 0's move CAS is in flight");
    assert_eq!(
        Lock::decode(w.get(Target::Node(1), W_SITE_LOCK)).intent_node(),
        Some(2),
        "node 2 announced in site 1's lock"
    );
    drop(b0); // crashed (or partitioned) with its CAS still in the network
              // Node 2 got busy meanwhile, so balancer 1 will pick node 3.
    w.set(Target::Node(2), LOAD_WORD, 500_000);
    let mut t = S_NS / 2;
    while b1.stats().moves == 0 {
        assert!(t < 10 * S_NS, "balancer 1 never moved a node");
        round(&mut b1, &mut w, t, &mut |_| false);
        t += S_NS;
    }
    assert_eq!(b1.stats().takeovers, 1);
    assert_eq!(w.node_role(3).site(), 1, "balancer 1 moved node 3");
    let stale = &held[0].op;
    let applied = match w.apply(stale) {
        Completion::Cas(prev) => matches!(stale, Op::Cas { expect, .. } if *expect == prev),
        c => panic!("{c:?}"),
    };
    (applied, w.node_role(2).site(), b1.stats().moves)
}

#[test]
fn fencing_stops_a_dead_holders_late_move() {
    let (applied, site, moves) = stale_move_after_takeover(true);
    assert!(
        !applied,
        "the stale move CAS must fail after the takeover's fence"
    );
    assert_eq!(site, 0, "node 2 stays with site 0");
    assert_eq!(moves, 1);
}

#[test]
fn without_fencing_the_late_move_takes_effect() {
    // The variant without the takeover fence: the dead holder's CAS lands after the new
    // holder acted, and site 1 gets a second node nobody decided on.
    let (applied, site, _) = stale_move_after_takeover(false);
    assert!(
        applied && site == 1,
        "expected the unfenced stale move to apply"
    );
}

#[test]
fn killed_lock_holder_others_move_within_lease_plus_s() {
    let (mut w, mut bals) = two_sites(3, true);
    // Balancer 0 holds site 1's lock and dies before its move.
    let held = round(&mut bals[0], &mut w, 0, &mut |op| is_move(op));
    assert_eq!(held.len(), 1);
    let kill_ns = 1;
    assert!(!Lock::decode(w.get(Target::Node(1), W_SITE_LOCK)).is_free());
    let (mut b1, mut b2) = (bals.remove(1), bals.remove(1));
    // The survivors tick every S at their own phases.
    let mut moved_at = None;
    for k in 0..20u64 {
        for (b, phase) in [(&mut b1, S_NS / 3), (&mut b2, 2 * S_NS / 3)] {
            let t = k * S_NS + phase;
            round(b, &mut w, t, &mut |_| false);
            if b.stats().moves > 0 && moved_at.is_none() {
                moved_at = Some(t);
            }
        }
        if moved_at.is_some() {
            break;
        }
    }
    let at = moved_at.expect("a survivor moved a node");
    assert!(
        at - kill_ns <= LEASE_NS + S_NS,
        "moved {} ms after the kill, bound {} ms",
        (at - kill_ns) / 1_000_000,
        (LEASE_NS + S_NS) / 1_000_000
    );
    assert_eq!(b1.stats().takeovers + b2.stats().takeovers, 1);
    assert_eq!(
        b1.stats().fences + b2.stats().fences,
        1,
        "the dead holder's node was fenced"
    );
    // Site 0 kept its anchor and at least one node; site 1 got exactly one.
    let site1 = (0..6).filter(|&n| w.node_role(n).site() == 1).count();
    assert_eq!(site1, 3);
}

#[test]
fn lagging_shared_counter_skips_the_round_and_catches_up() {
    let (mut w, mut bals) = two_sites(2, true);
    // A peer moved a node: our shared counter is ahead of the local one.
    w.set(Target::Balancer(0), W_SHARED_COUNTER, 1);
    round(&mut bals[0], &mut w, 0, &mut |_| false);
    assert_eq!(bals[0].stats().skipped_rounds, 1);
    assert_eq!(bals[0].stats().moves, 0);
    assert_eq!(bals[0].local_counter(), 1);
    assert!(Lock::decode(w.get(Target::Node(1), W_SITE_LOCK)).is_free());
    // Next round it moves, and bumps the peer's shared counter, not its own.
    round(&mut bals[0], &mut w, S_NS, &mut |_| false);
    assert_eq!(bals[0].stats().moves, 1);
    assert_eq!(w.get(Target::Balancer(1), W_SHARED_COUNTER), 1);
    assert_eq!(w.get(Target::Balancer(0), W_SHARED_COUNTER), 1);
    // The lock was released, token kept.
    let lock = Lock::decode(w.get(Target::Node(1), W_SITE_LOCK));
    assert!(lock.is_free() && lock.token == 1 && lock.intent_node().is_none());
}

#[test]
fn history_window_waits_t_before_moving() {
    let (mut w, _) = two_sites(1, true);
    let mut b = Balancer::new(
        0,
        BalancerConfig {
            history_ns: 3 * S_NS,
            ..cfg(true)
        },
        Topology {
            nodes: 6,
            anchors: vec![0, 1],
            balancers: 1,
        },
    )
    .unwrap();
    for k in 0..3 {
        round(&mut b, &mut w, k * S_NS, &mut |_| false);
        assert_eq!(b.stats().moves, 0, "moved before T at round {k}");
    }
    round(&mut b, &mut w, 3 * S_NS, &mut |_| false);
    assert_eq!(b.stats().moves, 1);
    let log = b.drain_log();
    assert_eq!((log[0].node, log[0].from_site, log[0].to_site), (2, 0, 1));
    assert_eq!(log[0].overloaded_ns, 3 * S_NS);
}

#[test]
fn a_site_never_gives_its_anchor_or_last_node() {
    let mut w = World::default();
    // Site 0 has only its anchor, idle; site 1 is on fire.
    w.place(0, 0, 0);
    w.place(1, 1, 1_000_000);
    w.place(2, 1, 1_000_000);
    let mut b = Balancer::new(
        0,
        cfg(true),
        Topology {
            nodes: 3,
            anchors: vec![0, 1],
            balancers: 1,
        },
    )
    .unwrap();
    for k in 0..5 {
        round(&mut b, &mut w, k * S_NS, &mut |_| false);
    }
    assert_eq!(b.stats().moves, 0);
    assert_eq!(b.stats().no_donor, 5);
}

#[test]
fn config_rejects_a_lease_shorter_than_a_hold() {
    let c = BalancerConfig {
        lease_ns: 100_000_000,
        ..BalancerConfig::default()
    };
    let topo = Topology {
        nodes: 2,
        anchors: vec![0, 1],
        balancers: 1,
    };
    let e = Balancer::new(0, c, topo.clone()).unwrap_err();
    assert!(e.to_string().contains("lease"), "{e}");
    let bad = Topology {
        anchors: vec![0, 0],
        ..topo
    };
    assert!(Balancer::new(0, BalancerConfig::default(), bad).is_err());
}

/// Small, contended, very faulty: many balancers racing for few nodes.
fn racing(seed: u64, dedup: bool) -> SimConfig {
    let mut c = SimConfig::new(seed, 12, 3, 4, 20 * 60 * S_NS);
    c.balancer.sensitivity_ns = 200_000_000;
    c.balancer.history_ns = 400_000_000;
    c.balancer.lease_ns = 1_000_000_000;
    c.net.request_loss_ppm = 50_000;
    c.net.reply_loss_ppm = 50_000;
    c.net.dup_ppm = 50_000;
    c.net.tail_ppm = 20_000;
    c.net.delay_tail_ns = 3_000_000_000;
    c.net.dedup = dedup;
    c.faults.crash_every_ns = 20 * S_NS;
    c.faults.crash_down_ns = 5 * S_NS;
    c.faults.partition_every_ns = 15 * S_NS;
    c.faults.partition_len_ns = 4 * S_NS;
    c.faults.apply_fail_ppm = 50_000;
    // Load moves on often and nodes switch slowly, so moves overlap switches.
    c.phase_ns = (2 * S_NS, 20 * S_NS);
    c.apply_ns = (200_000_000, 3_000_000_000);
    c
}

#[test]
fn racing_balancers_with_loss_and_reordering_keep_every_invariant() {
    let mut total = farside_reconf::BalancerStats::default();
    let mut faults = 0;
    for seed in 1..=6 {
        for dedup in [false, true] {
            let r = sim::run(racing(seed, dedup)).unwrap();
            assert_eq!(
                r.violations, 0,
                "seed {seed} dedup {dedup}: {:#?}",
                r.violation_log
            );
            faults += r.faults.total();
            total.moves += r.stats.moves;
            total.node_races += r.stats.node_races;
            total.lock_busy += r.stats.lock_busy;
            total.takeovers += r.stats.takeovers;
            total.fences += r.stats.fences;
            total.fenced_out += r.stats.fenced_out;
            total.unknown_outcomes += r.stats.unknown_outcomes;
        }
    }
    // The runs did exercise the races and failures they claim to survive.
    assert!(total.moves > 100, "{total:?}");
    assert!(total.node_races > 0 && total.lock_busy > 0, "{total:?}");
    assert!(
        total.takeovers > 0 && total.fences > 0 && total.fenced_out > 0,
        "{total:?}"
    );
    assert!(total.unknown_outcomes > 0 && faults > 0, "{total:?}");
}

#[test]
fn same_seed_replays_exactly() {
    let a = sim::run(racing(7, false)).unwrap();
    let b = sim::run(racing(7, false)).unwrap();
    assert_eq!(
        (
            a.events,
            a.ops,
            a.mutations_applied,
            a.stats.clone(),
            a.switch_ns.clone()
        ),
        (
            b.events,
            b.ops,
            b.mutations_applied,
            b.stats.clone(),
            b.switch_ns.clone()
        )
    );
    assert_eq!(a.faults, b.faults);
    let c = sim::run(racing(8, false)).unwrap();
    assert_ne!(
        (a.events, a.ops),
        (c.events, c.ops),
        "another seed, another run"
    );
}

#[test]
fn bounded_run_at_scale() {
    // 1,000 nodes, 10 sites, 10 balancers, two simulated minutes (a few seconds here).
    let mut c = SimConfig::new(11, 1000, 10, 10, 120 * S_NS);
    c.phase_ns = (20 * S_NS, 40 * S_NS);
    let r = sim::run(c).unwrap();
    assert_eq!(r.violations, 0, "{:#?}", r.violation_log);
    assert!(r.stats.moves > 0 && r.switches > 0, "{:?}", r.stats);
    assert!(r.nodes_per_site.iter().all(|&n| n >= 1));
}

#[test]
fn role_and_lock_words_round_trip_for_random_values() {
    let mut rng = Rng::new(42);
    for _ in 0..10_000 {
        let (site, ver) = (rng.next_u64() as u16, rng.next_u64() >> 16);
        let r = Role::new(site, ver);
        assert_eq!((r.site(), r.version()), (site, ver));
        let l = Lock::decode(rng.next_u64());
        assert_eq!(Lock::decode(l.encode()), l);
        // Every holder transition changes the word (so leases see progress).
        if let Some(h) = l.holder() {
            assert_ne!(l.with_intent(l.intent_node()).encode(), l.encode());
            assert_ne!(l.released().encode(), l.encode());
            assert_ne!(l.acquired_by(h).encode(), l.encode());
        }
    }
}

/// Hostile: many long delays and frequent partitions, so a holder is often cut off
/// with its move CAS still in flight.
fn hostile(seed: u64, fence: bool) -> SimConfig {
    let mut c = racing(seed, false);
    c.net.tail_ppm = 300_000;
    c.net.delay_tail_ns = 4_000_000_000;
    c.faults.partition_every_ns = S_NS;
    c.faults.partition_len_ns = 2 * S_NS;
    c.balancer.fence_on_takeover = fence;
    c
}

#[test]
fn hostile_network_keeps_every_invariant() {
    let mut takeovers = 0;
    for seed in 1..=4 {
        let r = sim::run(hostile(seed, true)).unwrap();
        assert_eq!(r.violations, 0, "seed {seed}: {:#?}", r.violation_log);
        takeovers += r.stats.takeovers;
    }
    assert!(takeovers > 0);
}
