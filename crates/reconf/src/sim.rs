//! A deterministic, seeded simulator that drives the real [`Balancer`] and
//! [`NodeAgent`] state machines over a faulty network, at a scale this machine cannot
//! host, and checks the protocol's invariants after every event.
//!
//! Model:
//! - **Memory.** Every node and every balancer has the region's 64 low words; ops apply
//!   atomically at their delivery time, as the rmem servers (and XDP) do.
//! - **Network.** Each request and reply has a uniform delay in `delay_min..delay_max`
//!   (so messages reorder), a `tail` chance of a long delay up to `delay_tail` (longer
//!   than the op timeout and the lease: late ops land after their sender gave up), a
//!   loss chance each way, and a duplication chance. `dedup` models the exactly-once
//!   transports (a duplicate request is not applied again); without it duplicates
//!   apply twice (at-least-once delivery of a datagram). A reply that does not arrive
//!   within `op_timeout` completes the op as [`Completion::Lost`].
//! - **Faults.** Balancers crash (state and region lost; requests already sent still
//!   land) and restart after a downtime; balancers are partitioned (all their traffic,
//!   both ways, dropped) for a while; node applies fail.
//! - **Clocks.** Each balancer's clock runs at its own rate (`skew_ppm`), so leases are
//!   measured without a shared clock.
//! - **Load.** Each site has a demand in node-capacities; one site at a time is hot, and
//!   the hot site changes after a random phase. A node's load is its site's demand
//!   spread over the nodes serving that site (capped at 100 %, with noise).
//!
//! Invariants (checked at every event, from the log of every applied mutation):
//! 1. a node is never assigned by two balancers at once: no move CAS succeeds on a node
//!    still switching to the site a previous move gave it;
//! 2. no site ever has zero nodes, wanted or served;
//! 3. every lock is released or expires: a live holder never holds longer than
//!    [`BalancerConfig::hold_max_ns`], and a held lock word that a contender keeps
//!    seeing unchanged for longer than the lease (plus a slack of rounds) is a violation;
//! 4. no fenced-out write takes effect: a move CAS issued under a lock token never
//!    applies after a node op under a later token of the same lock applied;
//! 5. every move a balancer reports (its move log) is a move that applied.
//!
//! The same seed gives the same run (one PRNG, events ordered by time then sequence).

use crate::agent::{AgentAction, NodeAgent};
use crate::balancer::{Balancer, BalancerConfig, BalancerStats, Ctx, Topology};
use crate::op::{Completion, Issue, Op, OpId, Target};
use crate::words::{
    Lock, Role, W_BALANCER_HEARTBEAT, W_ROLE_EPOCH, W_ROLE_ERROR, W_ROLE_SERVED, W_ROLE_WANTED,
    W_SHARED_COUNTER, W_SITE_LOCK,
};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::time::Instant;

/// Words of memory simulated per region (the header, record and control words).
pub const SIM_REGION_WORDS: usize = 64;
/// Violations kept verbatim in the report (the rest are only counted): enough to debug,
/// bounded so a broken variant cannot exhaust memory.
pub const VIOLATIONS_KEPT_MAX: usize = 32;
/// Reads of an expired lock word a contender may make before the word must have
/// changed: each read of an expired word is followed by a takeover CAS unless a message
/// is lost (about 4 % per attempt at the default loss rates, and a lost CAS costs a
/// resolving read too), so eight in a row is below 1e-9.
pub const LOCK_EXPIRY_READS_MAX: u32 = 8;

/// A small, fast, seedable PRNG (SplitMix64): deterministic across platforms.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }
    /// True with probability `ppm` / 1e6.
    pub fn chance(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.next_u64() % 1_000_000 < ppm as u64
    }
}

/// The network's behaviour.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    /// Shortest one-way delay, ns.
    pub delay_min_ns: u64,
    /// Longest ordinary one-way delay, ns.
    pub delay_max_ns: u64,
    /// Chance (ppm) that a message takes a long delay instead.
    pub tail_ppm: u32,
    /// Longest long delay, ns (longer than the op timeout and the lease).
    pub delay_tail_ns: u64,
    /// Chance (ppm) a request is lost.
    pub request_loss_ppm: u32,
    /// Chance (ppm) a reply is lost.
    pub reply_loss_ppm: u32,
    /// Chance (ppm) a request is delivered twice.
    pub dup_ppm: u32,
    /// Exactly-once servers: a duplicate request is not applied again.
    pub dedup: bool,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            delay_min_ns: 20_000,
            delay_max_ns: 2_000_000,
            tail_ppm: 1_000,
            delay_tail_ns: 5_000_000_000,
            request_loss_ppm: 10_000,
            reply_loss_ppm: 10_000,
            dup_ppm: 5_000,
            dedup: false,
        }
    }
}

/// Faults besides the network's.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    /// Mean time between crashes of some balancer, ns (0: none).
    pub crash_every_ns: u64,
    /// How long a crashed balancer stays down, ns.
    pub crash_down_ns: u64,
    /// Mean time between partitions of some balancer, ns (0: none).
    pub partition_every_ns: u64,
    /// How long a partition lasts, ns.
    pub partition_len_ns: u64,
    /// Chance (ppm) that a node's apply fails.
    pub apply_fail_ppm: u32,
    /// Each balancer's clock rate differs from true time by up to this, ppm.
    pub skew_ppm: u32,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            crash_every_ns: 120_000_000_000,
            crash_down_ns: 20_000_000_000,
            partition_every_ns: 90_000_000_000,
            partition_len_ns: 10_000_000_000,
            apply_fail_ppm: 20_000,
            skew_ppm: 200,
        }
    }
}

/// A whole simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// PRNG seed: the same seed replays the same run.
    pub seed: u64,
    /// Back-end nodes.
    pub nodes: u32,
    /// Sites (initially allocated round-robin; site s's anchor is node s).
    pub sites: u16,
    /// Balancers.
    pub balancers: u32,
    /// Simulated time, ns.
    pub duration_ns: u64,
    /// Every balancer's configuration.
    pub balancer: BalancerConfig,
    /// Network.
    pub net: NetConfig,
    /// Faults.
    pub faults: FaultConfig,
    /// Shortest and longest time a site stays hot, ns.
    pub phase_ns: (u64, u64),
    /// Demand of the hot site, as a fraction (ppm) of all nodes' capacity.
    pub hot_ppm_of_nodes: u64,
    /// Demand of the other sites, as a fraction (ppm) of their initial nodes' capacity.
    pub base_ppm: u64,
    /// Period at which nodes publish load, ns.
    pub sample_ns: u64,
    /// Period at which an agent polls its wanted word, ns.
    pub agent_poll_ns: u64,
    /// Shortest and longest web server reconfiguration, ns.
    pub apply_ns: (u64, u64),
    /// Agent's retry of a failed apply, ns.
    pub apply_retry_ns: u64,
}

impl SimConfig {
    /// Defaults for a run of `nodes`, `sites`, `balancers` for `duration_ns`.
    pub fn new(seed: u64, nodes: u32, sites: u16, balancers: u32, duration_ns: u64) -> SimConfig {
        SimConfig {
            seed,
            nodes,
            sites,
            balancers,
            duration_ns,
            balancer: BalancerConfig::default(),
            net: NetConfig::default(),
            faults: FaultConfig::default(),
            phase_ns: (30_000_000_000, 300_000_000_000),
            hot_ppm_of_nodes: 450_000,
            base_ppm: 300_000,
            sample_ns: 500_000_000,
            agent_poll_ns: 100_000_000,
            apply_ns: (50_000_000, 500_000_000),
            apply_retry_ns: 10_000_000_000,
        }
    }
}

/// Faults injected during a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Requests lost.
    pub requests_lost: u64,
    /// Replies lost (including those a partition dropped).
    pub replies_lost: u64,
    /// Requests duplicated.
    pub duplicated: u64,
    /// Messages given a long delay.
    pub long_delays: u64,
    /// Requests or replies still in flight when the op timed out.
    pub late_replies: u64,
    /// Balancer crashes.
    pub crashes: u64,
    /// Balancer partitions.
    pub partitions: u64,
    /// Node applies that failed.
    pub apply_failures: u64,
}

impl FaultCounts {
    /// All faults.
    pub fn total(&self) -> u64 {
        self.requests_lost
            + self.replies_lost
            + self.duplicated
            + self.long_delays
            + self.crashes
            + self.partitions
            + self.apply_failures
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// Seed.
    pub seed: u64,
    /// Simulated time, ns.
    pub sim_ns: u64,
    /// Events processed.
    pub events: u64,
    /// Wall time, seconds.
    pub wall_s: f64,
    /// Remote ops issued.
    pub ops: u64,
    /// Mutations applied (the op log).
    pub mutations_applied: u64,
    /// Faults.
    pub faults: FaultCounts,
    /// Balancer counters summed over all balancers and incarnations.
    pub stats: BalancerStats,
    /// Node switches completed (served = a new site).
    pub switches: u64,
    /// Switch times (move CAS applied to role served), ns, sorted.
    pub switch_ns: Vec<u64>,
    /// Nodes wanted per site at the end.
    pub nodes_per_site: Vec<u32>,
    /// Moves the balancers reported (each checked against the applied moves).
    pub moves_logged: u64,
    /// Invariant violations found (count).
    pub violations: u64,
    /// The first violations, verbatim.
    pub violation_log: Vec<String>,
    /// Longest time from a holder's last lock-word change to another balancer taking
    /// the lock over, ns.
    pub takeover_wait_max_ns: u64,
}

impl SimReport {
    /// Events per second of wall time.
    pub fn events_per_s(&self) -> f64 {
        self.events as f64 / self.wall_s.max(1e-9)
    }
    /// A percentile of the switch times, ns.
    pub fn switch_pct_ns(&self, p: f64) -> Option<u64> {
        let n = self.switch_ns.len();
        (n > 0).then(|| self.switch_ns[((n - 1) as f64 * p).round() as usize])
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpKey {
    bal: u32,
    inc: u32,
    id: OpId,
}

#[derive(Debug, Clone)]
enum Ev {
    Tick(u32, u32),
    Deliver {
        key: OpKey,
        op: Op,
        /// Lock (site, token) the sender held when it issued the op.
        under: Option<(u16, u32)>,
        /// A duplicate copy (an exactly-once server does not apply it).
        dup: bool,
        /// Somebody waits for this copy's reply (not a duplicate, not timed out).
        reply: bool,
        deadline: u64,
    },
    Reply(OpKey, Completion, u64),
    Lost(OpKey),
    AgentWake(u32),
    ApplyDone(u32, bool),
    Sample,
    Phase,
    Crash,
    Restart(u32),
    Partition,
    Heal(u32),
}

struct Bal {
    sm: Option<Balancer>,
    inc: u32,
    partitioned: bool,
    region: [u64; SIM_REGION_WORDS],
    /// Ops in flight for the current incarnation (completed exactly once).
    pending: HashSet<OpId>,
    rate_ppm: i64,
}

struct NodeSim {
    mem: [u64; SIM_REGION_WORDS],
    agent: NodeAgent,
    wake_pending: bool,
    /// A move that gave this node a site it does not serve yet: (balancer, site, at).
    assigning: Option<(u32, u16, u64)>,
}

struct LockTrack {
    word: u64,
    changed_at: u64,
    /// Per balancer: when it first read the current held word, and how many of its
    /// reads since found it expired.
    seen: HashMap<u32, (u64, u32)>,
    /// Highest token under which a guarded node op applied.
    acted_token: Option<u32>,
}

/// The simulator.
pub struct Sim {
    cfg: SimConfig,
    rng: Rng,
    now: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slots: Vec<Option<Ev>>,
    free_slots: Vec<usize>,
    topo: Topology,
    bals: Vec<Bal>,
    nodes: Vec<NodeSim>,
    locks: Vec<LockTrack>,
    wanted_count: Vec<u32>,
    served_count: Vec<u32>,
    demand_ppm: Vec<u64>,
    retired_stats: BalancerStats,
    /// Every move applied, as (node, role written): a balancer's reported move must be one.
    applied_moves: HashSet<(u32, u64)>,
    report: SimReport,
    out: Vec<Issue>,
}

fn add_stats(a: &mut BalancerStats, b: &BalancerStats) {
    a.rounds += b.rounds;
    a.overruns += b.overruns;
    a.moves += b.moves;
    a.lock_acquired += b.lock_acquired;
    a.takeovers += b.takeovers;
    a.adopted += b.adopted;
    a.lock_busy += b.lock_busy;
    a.node_races += b.node_races;
    a.skipped_rounds += b.skipped_rounds;
    a.fenced_out += b.fenced_out;
    a.fences += b.fences;
    a.unknown_outcomes += b.unknown_outcomes;
    a.abandoned += b.abandoned;
    a.no_donor += b.no_donor;
    a.log_dropped += b.log_dropped;
}

impl Sim {
    /// Build a simulation; fails on a configuration the balancers refuse.
    pub fn new(cfg: SimConfig) -> Result<Sim, crate::balancer::ConfigError> {
        let sites = cfg.sites as usize;
        if sites == 0 || cfg.nodes < cfg.sites as u32 {
            return Err(crate::balancer::ConfigError(format!(
                "need at least one node per site ({} nodes, {} sites)",
                cfg.nodes, cfg.sites
            )));
        }
        let topo = Topology {
            nodes: cfg.nodes,
            anchors: (0..cfg.sites as u32).collect(),
            balancers: cfg.balancers,
        };
        cfg.balancer.validate(&topo)?;
        let mut rng = Rng::new(cfg.seed);
        let mut nodes = Vec::with_capacity(cfg.nodes as usize);
        let mut wanted_count = vec![0; sites];
        for n in 0..cfg.nodes {
            let site = (n % cfg.sites as u32) as u16;
            let role = Role::new(site, 1);
            let mut mem = [0u64; SIM_REGION_WORDS];
            mem[W_ROLE_SERVED] = role.0;
            mem[W_ROLE_WANTED] = role.0;
            wanted_count[site as usize] += 1;
            nodes.push(NodeSim {
                mem,
                agent: NodeAgent::new(role, cfg.apply_retry_ns),
                wake_pending: false,
                assigning: None,
            });
        }
        let skew = cfg.faults.skew_ppm as i64;
        let bals = (0..cfg.balancers)
            .map(|b| Bal {
                sm: Some(Balancer::new(b, cfg.balancer.clone(), topo.clone()).expect("validated")),
                inc: 0,
                partitioned: false,
                region: [0; SIM_REGION_WORDS],
                pending: HashSet::new(),
                rate_ppm: rng.range(0, 2 * skew as u64) as i64 - skew,
            })
            .collect();
        let locks = (0..sites)
            .map(|_| LockTrack {
                word: 0,
                changed_at: 0,
                seen: HashMap::new(),
                acted_token: None,
            })
            .collect();
        let mut sim = Sim {
            report: SimReport {
                seed: cfg.seed,
                ..SimReport::default()
            },
            rng,
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            served_count: wanted_count.clone(),
            wanted_count,
            demand_ppm: vec![0; sites],
            retired_stats: BalancerStats::default(),
            applied_moves: HashSet::new(),
            out: Vec::new(),
            topo,
            bals,
            nodes,
            locks,
            cfg,
        };
        sim.set_phase(None);
        for b in 0..sim.cfg.balancers {
            let first = sim.rng.range(0, sim.cfg.balancer.sensitivity_ns);
            sim.at(first, Ev::Tick(b, 0));
        }
        sim.at(0, Ev::Sample);
        let p = sim.rng.range(sim.cfg.phase_ns.0, sim.cfg.phase_ns.1);
        sim.at(p, Ev::Phase);
        if sim.cfg.faults.crash_every_ns > 0 {
            let t = sim.rng.range(0, 2 * sim.cfg.faults.crash_every_ns);
            sim.at(t, Ev::Crash);
        }
        if sim.cfg.faults.partition_every_ns > 0 {
            let t = sim.rng.range(0, 2 * sim.cfg.faults.partition_every_ns);
            sim.at(t, Ev::Partition);
        }
        Ok(sim)
    }

    fn at(&mut self, t: u64, ev: Ev) {
        let slot = match self.free_slots.pop() {
            Some(i) => {
                self.slots[i] = Some(ev);
                i
            }
            None => {
                self.slots.push(Some(ev));
                self.slots.len() - 1
            }
        };
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, slot)));
    }

    fn clock(&self, b: u32) -> u64 {
        let r = self.bals[b as usize].rate_ppm;
        (self.now as i128 + self.now as i128 * r as i128 / 1_000_000) as u64
    }

    fn ctx(&self, b: u32) -> Ctx {
        Ctx {
            now_ns: self.clock(b),
            shared_counter: self.bals[b as usize].region[W_SHARED_COUNTER],
        }
    }

    fn violation(&mut self, msg: String) {
        self.report.violations += 1;
        if self.report.violation_log.len() < VIOLATIONS_KEPT_MAX {
            self.report.violation_log.push(format!(
                "t={:.3}s seed={} {msg}",
                self.now as f64 / 1e9,
                self.cfg.seed
            ));
        }
    }

    fn delay(&mut self) -> u64 {
        if self.rng.chance(self.cfg.net.tail_ppm) {
            self.report.faults.long_delays += 1;
            self.rng
                .range(self.cfg.net.delay_max_ns, self.cfg.net.delay_tail_ns)
        } else {
            self.rng
                .range(self.cfg.net.delay_min_ns, self.cfg.net.delay_max_ns)
        }
    }

    /// Send what balancer `b` issued.
    fn send(&mut self, b: u32) {
        let out = std::mem::take(&mut self.out);
        let under = self.bals[b as usize]
            .sm
            .as_ref()
            .and_then(|s| s.holding())
            .map(|(s, t, _)| (s, t));
        let inc = self.bals[b as usize].inc;
        let timeout = self.cfg.balancer.op_timeout_ns;
        for Issue { id, op } in out.iter().cloned() {
            self.report.ops += 1;
            let key = OpKey { bal: b, inc, id };
            self.bals[b as usize].pending.insert(id);
            let deadline = self.now + timeout;
            if self.bals[b as usize].partitioned || self.rng.chance(self.cfg.net.request_loss_ppm) {
                self.report.faults.requests_lost += 1;
                self.at(deadline, Ev::Lost(key));
                continue;
            }
            if self.rng.chance(self.cfg.net.dup_ppm) {
                self.report.faults.duplicated += 1;
                let d = self.delay();
                self.at(
                    self.now + d,
                    Ev::Deliver {
                        key,
                        op: op.clone(),
                        under,
                        dup: true,
                        reply: false,
                        deadline,
                    },
                );
            }
            let t = self.now + self.delay();
            // A request still in flight at the deadline completes as lost then, and
            // applies later with nobody waiting for its reply.
            let late = t > deadline;
            if late {
                self.report.faults.late_replies += 1;
                self.at(deadline, Ev::Lost(key));
            }
            self.at(
                t,
                Ev::Deliver {
                    key,
                    op,
                    under,
                    dup: false,
                    reply: !late,
                    deadline,
                },
            );
        }
        self.out = out;
        self.out.clear();
    }

    fn mem(&mut self, t: Target) -> Option<&mut [u64; SIM_REGION_WORDS]> {
        match t {
            Target::Node(n) => self.nodes.get_mut(n as usize).map(|n| &mut n.mem),
            Target::Balancer(b) => {
                let bal = self.bals.get_mut(b as usize)?;
                (bal.sm.is_some() && !bal.partitioned).then_some(&mut bal.region)
            }
        }
    }

    /// Apply one delivered op; returns the reply (None: the target did not answer).
    fn apply(
        &mut self,
        key: OpKey,
        op: &Op,
        under: Option<(u16, u32)>,
        dup: bool,
    ) -> Option<Completion> {
        if dup && op.is_mutation() && self.cfg.net.dedup {
            // Exactly-once server: the duplicate is recognised and not applied.
            return None;
        }
        let target = op.target();
        let mem = self.mem(target)?;
        let (word, before, reply) = match *op {
            Op::Read { word, len, .. } => {
                let v = mem[word..word + len].to_vec();
                (word, mem[word], Completion::Read(v))
            }
            Op::Write { word, value, .. } => {
                let b = mem[word];
                mem[word] = value;
                (word, b, Completion::Written)
            }
            Op::Cas {
                word, expect, new, ..
            } => {
                let b = mem[word];
                if b == expect {
                    mem[word] = new;
                }
                (word, b, Completion::Cas(b))
            }
            Op::Fadd { word, delta, .. } => {
                let b = mem[word];
                mem[word] = b.wrapping_add(delta);
                (word, b, Completion::Fadd(b))
            }
        };
        let after = mem[word];
        if op.is_mutation() {
            self.report.mutations_applied += 1;
        }
        self.check_op(key, op, under, before, after);
        Some(reply)
    }

    /// Invariants 1, 2, 4 on one applied op (from the op log), and lock tracking.
    fn check_op(
        &mut self,
        key: OpKey,
        op: &Op,
        under: Option<(u16, u32)>,
        before: u64,
        after: u64,
    ) {
        let Target::Node(n) = op.target() else { return };
        let word = match *op {
            Op::Read { word, .. }
            | Op::Write { word, .. }
            | Op::Cas { word, .. }
            | Op::Fadd { word, .. } => word,
        };
        if word == W_SITE_LOCK && (n as usize) < self.locks.len() {
            self.track_lock(key, n as usize, op, after);
            return;
        }
        if word != W_ROLE_WANTED || !op.is_mutation() {
            return;
        }
        let (rb, ra) = (Role(before), Role(after));
        if let Some((site, token)) = under {
            // Invariant 4: a guarded op under an older token after a newer one acted.
            let lt = &mut self.locks[site as usize];
            let moved = rb.site() != ra.site();
            if moved {
                if let Some(acted) = lt.acted_token {
                    if acted > token {
                        let msg = format!(
                            "fenced-out write: balancer {} moved node {n} under site {site} token {token} after token {acted} acted",
                            key.bal
                        );
                        self.violation(msg);
                    }
                }
            }
            if before != after {
                let lt = &mut self.locks[site as usize];
                lt.acted_token = Some(lt.acted_token.map_or(token, |a| a.max(token)));
            }
        }
        if rb.site() == ra.site() {
            return;
        }
        // A move applied. Invariant 1: not while a previous move is still switching.
        let node = &mut self.nodes[n as usize];
        if let Some((other, site, at)) = node.assigning {
            let msg = format!(
                "node {n} assigned by balancer {} to site {} while still switching to site {site} (balancer {other}, since t={:.3}s)",
                key.bal,
                ra.site(),
                at as f64 / 1e9
            );
            self.violation(msg);
        }
        self.nodes[n as usize].assigning = Some((key.bal, ra.site(), self.now));
        self.applied_moves.insert((n, after));
        self.wanted_count[rb.site() as usize] -= 1;
        self.wanted_count[ra.site() as usize] += 1;
        if self.wanted_count[rb.site() as usize] == 0 {
            let msg = format!(
                "site {} has no node wanted (node {n} moved away)",
                rb.site()
            );
            self.violation(msg);
        }
        self.wake_agent(n);
    }

    fn track_lock(&mut self, key: OpKey, site: usize, op: &Op, after: u64) {
        let now = self.now;
        let lease = self.cfg.balancer.lease_ns;
        let skew = self.cfg.faults.skew_ppm as u64;
        let timeout = self.cfg.balancer.op_timeout_ns;
        let lt = &mut self.locks[site];
        if after != lt.word {
            let old = Lock::decode(lt.word);
            let new = Lock::decode(after);
            if !old.is_free() && new.holder() != old.holder() && new.token != old.token {
                // A takeover: how long after the holder's last change.
                let waited = now - lt.changed_at;
                lt.word = after;
                lt.changed_at = now;
                lt.seen.clear();
                self.report.takeover_wait_max_ns = self.report.takeover_wait_max_ns.max(waited);
                if waited < lease - lease * skew / 1_000_000 * 2 - 1 {
                    let msg = format!(
                        "lock of site {site} taken from balancer {:?} {waited} ns after its last change (< lease)",
                        old.holder()
                    );
                    self.violation(msg);
                }
                return;
            }
            lt.word = after;
            lt.changed_at = now;
            lt.seen.clear();
            return;
        }
        // Invariant 3 (expiry): a contender keeps reading the same held word.
        let lock = Lock::decode(after);
        if !matches!(op, Op::Read { .. }) || lock.is_free() || lock.holder() == Some(key.bal) {
            return;
        }
        let seen = lt.seen.entry(key.bal).or_insert((now, 0));
        // The contender's watch starts when its first read's reply arrives (at most one
        // op timeout after that read applied) and runs on its own clock.
        if now - seen.0 >= lease + lease * skew / 1_000_000 * 2 + timeout {
            seen.1 += 1;
        }
        if seen.1 > LOCK_EXPIRY_READS_MAX {
            let msg = format!(
                "lock of site {site} held by balancer {:?}: balancer {} read it expired {} times and it never changed",
                lock.holder(),
                key.bal,
                seen.1
            );
            seen.1 = 0;
            self.violation(msg);
        }
    }

    fn wake_agent(&mut self, n: u32) {
        if self.nodes[n as usize].wake_pending {
            return;
        }
        self.nodes[n as usize].wake_pending = true;
        let d = self.rng.range(1, self.cfg.agent_poll_ns);
        self.at(self.now + d, Ev::AgentWake(n));
    }

    fn served_changed(&mut self, n: u32, before: Role, after: Role) {
        self.nodes[n as usize].mem[W_ROLE_SERVED] = after.0;
        if before.site() != after.site() {
            self.served_count[before.site() as usize] -= 1;
            self.served_count[after.site() as usize] += 1;
            if self.served_count[before.site() as usize] == 0 {
                let msg = format!("site {} has no node serving it", before.site());
                self.violation(msg);
            }
        }
        let node = &mut self.nodes[n as usize];
        if let Some((_, site, at)) = node.assigning {
            if site == after.site() {
                node.assigning = None;
                self.report.switches += 1;
                self.report.switch_ns.push(self.now - at);
            }
        }
    }

    fn set_phase(&mut self, hot: Option<u16>) {
        let sites = self.cfg.sites as u64;
        let per_site = self.cfg.nodes as u64 * 1_000_000 / sites;
        for s in 0..self.cfg.sites {
            self.demand_ppm[s as usize] = if Some(s) == hot {
                self.cfg.nodes as u64 * self.cfg.hot_ppm_of_nodes
            } else {
                per_site * self.cfg.base_ppm / 1_000_000
            };
        }
    }

    fn sample(&mut self) {
        for n in 0..self.nodes.len() {
            let s = Role(self.nodes[n].mem[W_ROLE_SERVED]).site() as usize;
            let base = self.demand_ppm[s] / self.served_count[s].max(1) as u64;
            let noise = self.rng.range(950, 1050);
            self.nodes[n].mem[self.cfg.balancer.load_word] = (base * noise / 1000).min(1_000_000);
        }
    }

    fn complete(&mut self, key: OpKey, c: Completion) {
        let bal = &mut self.bals[key.bal as usize];
        if bal.inc != key.inc || bal.sm.is_none() || !bal.pending.remove(&key.id) {
            return;
        }
        let ctx = self.ctx(key.bal);
        let mut out = std::mem::take(&mut self.out);
        let sm = self.bals[key.bal as usize].sm.as_mut().expect("alive");
        sm.on_completion(ctx, key.id, c, &mut out);
        let log = sm.drain_log();
        self.out = out;
        for m in log {
            self.report.moves_logged += 1;
            if !self.applied_moves.contains(&(m.node, m.wanted.0)) {
                let msg = format!(
                    "balancer {} reports moving node {} to site {} ({:#x}) but no such move applied",
                    key.bal, m.node, m.to_site, m.wanted.0
                );
                self.violation(msg);
            }
        }
        self.check_holder(key.bal);
        self.send(key.bal);
    }

    /// Invariant 3 (release): a live holder holds at most `hold_max_ns`.
    fn check_holder(&mut self, b: u32) {
        let now = self.clock(b);
        let Some(sm) = self.bals[b as usize].sm.as_ref() else {
            return;
        };
        let max = self.cfg.balancer.hold_max_ns();
        let max = max + max * self.cfg.faults.skew_ppm as u64 * 2 / 1_000_000 + 1_000;
        if let Some((site, token, since)) = sm.holding() {
            if now - since > max {
                let msg = format!(
                    "balancer {b} holds site {site}'s lock (token {token}) for {} ns > {max} (phase {})",
                    now - since,
                    sm.phase_name()
                );
                self.violation(msg);
            }
        }
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Tick(b, inc) => {
                let bal = &mut self.bals[b as usize];
                if bal.inc != inc || bal.sm.is_none() {
                    return;
                }
                bal.region[W_BALANCER_HEARTBEAT] += 1;
                let ctx = self.ctx(b);
                let mut out = std::mem::take(&mut self.out);
                self.bals[b as usize]
                    .sm
                    .as_mut()
                    .expect("alive")
                    .on_tick(ctx, &mut out);
                self.out = out;
                self.check_holder(b);
                self.send(b);
                // S by the balancer's own clock.
                let r = self.bals[b as usize].rate_ppm;
                let s = self.cfg.balancer.sensitivity_ns as i64;
                let period = (s - s * r / 1_000_000) as u64;
                self.at(self.now + period, Ev::Tick(b, inc));
            }
            Ev::Deliver {
                key,
                op,
                under,
                dup,
                reply: wanted,
                deadline,
            } => {
                let reply = self.apply(key, &op, under, dup);
                if !wanted {
                    return;
                }
                let Some(reply) = reply else {
                    self.at(deadline.max(self.now), Ev::Lost(key));
                    return;
                };
                if self.rng.chance(self.cfg.net.reply_loss_ppm) {
                    self.report.faults.replies_lost += 1;
                    self.at(deadline.max(self.now), Ev::Lost(key));
                    return;
                }
                let t = self.now + self.delay();
                if t > deadline {
                    self.report.faults.late_replies += 1;
                    self.at(deadline.max(self.now), Ev::Lost(key));
                } else {
                    self.at(t, Ev::Reply(key, reply, deadline));
                }
            }
            Ev::Reply(key, c, deadline) => {
                if self.bals[key.bal as usize].partitioned {
                    self.report.faults.replies_lost += 1;
                    self.at(deadline.max(self.now), Ev::Lost(key));
                    return;
                }
                self.complete(key, c);
            }
            Ev::Lost(key) => self.complete(key, Completion::Lost),
            Ev::AgentWake(n) => {
                let node = &mut self.nodes[n as usize];
                node.wake_pending = false;
                let before = node.agent.served();
                match node.agent.poll(self.now, Role(node.mem[W_ROLE_WANTED])) {
                    AgentAction::Idle => {}
                    AgentAction::Publish(r) => self.served_changed(n, before, r),
                    AgentAction::Apply(_) => {
                        let ok = !self.rng.chance(self.cfg.faults.apply_fail_ppm);
                        let d = self.rng.range(self.cfg.apply_ns.0, self.cfg.apply_ns.1);
                        self.at(self.now + d, Ev::ApplyDone(n, ok));
                    }
                }
            }
            Ev::ApplyDone(n, ok) => {
                let node = &mut self.nodes[n as usize];
                let before = node.agent.served();
                let res = if ok {
                    Ok(())
                } else {
                    Err("simulated reload failure".to_string())
                };
                let a = node.agent.applied(self.now, res);
                node.mem[W_ROLE_ERROR] = a.error_word;
                if a.error.is_some() {
                    self.report.faults.apply_failures += 1;
                    let t = self.now + self.cfg.apply_retry_ns;
                    self.nodes[n as usize].wake_pending = true;
                    self.at(t, Ev::AgentWake(n));
                } else {
                    node.mem[W_ROLE_EPOCH] += 1;
                    self.served_changed(n, before, a.served);
                    self.wake_agent(n);
                }
            }
            Ev::Sample => {
                self.sample();
                self.at(self.now + self.cfg.sample_ns, Ev::Sample);
            }
            Ev::Phase => {
                let pick = self.rng.range(0, self.cfg.sites as u64);
                let hot = (pick < self.cfg.sites as u64).then_some(pick as u16);
                self.set_phase(hot);
                let p = self.rng.range(self.cfg.phase_ns.0, self.cfg.phase_ns.1);
                self.at(self.now + p, Ev::Phase);
            }
            Ev::Crash => {
                let b = self.rng.range(0, self.cfg.balancers as u64 - 1) as u32;
                let bal = &mut self.bals[b as usize];
                if let Some(sm) = bal.sm.take() {
                    self.report.faults.crashes += 1;
                    add_stats(&mut self.retired_stats, sm.stats());
                    bal.pending.clear();
                    bal.region = [0; SIM_REGION_WORDS];
                    let t = self.now + self.cfg.faults.crash_down_ns;
                    self.at(t, Ev::Restart(b));
                }
                let t = self.now + self.rng.range(0, 2 * self.cfg.faults.crash_every_ns);
                self.at(t, Ev::Crash);
            }
            Ev::Restart(b) => {
                let bal = &mut self.bals[b as usize];
                bal.inc += 1;
                let inc = bal.inc;
                bal.sm = Some(
                    Balancer::new(b, self.cfg.balancer.clone(), self.topo.clone())
                        .expect("validated")
                        .with_first_op_id((inc as u64) << 40),
                );
                for lt in &mut self.locks {
                    lt.seen.remove(&b);
                }
                let first = self.rng.range(0, self.cfg.balancer.sensitivity_ns);
                self.at(self.now + first, Ev::Tick(b, inc));
            }
            Ev::Partition => {
                let b = self.rng.range(0, self.cfg.balancers as u64 - 1) as u32;
                if !self.bals[b as usize].partitioned {
                    self.report.faults.partitions += 1;
                    self.bals[b as usize].partitioned = true;
                    for lt in &mut self.locks {
                        lt.seen.remove(&b);
                    }
                    let t = self.now + self.cfg.faults.partition_len_ns;
                    self.at(t, Ev::Heal(b));
                }
                let t = self.now + self.rng.range(0, 2 * self.cfg.faults.partition_every_ns);
                self.at(t, Ev::Partition);
            }
            Ev::Heal(b) => self.bals[b as usize].partitioned = false,
        }
    }

    /// Run until the configured duration; returns the report.
    pub fn run(mut self) -> SimReport {
        let start = Instant::now();
        while let Some(Reverse((t, _, slot))) = self.heap.pop() {
            if t > self.cfg.duration_ns {
                break;
            }
            self.now = t;
            let ev = self.slots[slot].take().expect("scheduled");
            self.free_slots.push(slot);
            self.report.events += 1;
            self.step(ev);
        }
        self.report.wall_s = start.elapsed().as_secs_f64();
        self.report.sim_ns = self.now.min(self.cfg.duration_ns);
        let mut stats = self.retired_stats.clone();
        for b in &self.bals {
            if let Some(sm) = &b.sm {
                add_stats(&mut stats, sm.stats());
            }
        }
        self.report.stats = stats;
        self.report.nodes_per_site = self.wanted_count.clone();
        self.report.switch_ns.sort_unstable();
        self.report
    }
}

/// Build and run a simulation.
pub fn run(cfg: SimConfig) -> Result<SimReport, crate::balancer::ConfigError> {
    Ok(Sim::new(cfg)?.run())
}
