//! The balancer: the paper's load-balancer-based reconfiguration, as a state machine.
//!
//! ```text
//!  tick (every S) ──► Reading: READ roles + load of every node
//!        │ all replied or lost
//!        ▼
//!  decide: site s overloaded for >= T?  donor node n (settled, not an anchor, its site
//!        │ keeps >= 1 node and stays under `spare_ppm`)?   no ─► Idle
//!        │ shared counter > local?  yes ─► local = shared, forget history, skip ─► Idle
//!        ▼
//!  LockRead s ─ held by another and its word changed within `lease` ─► busy ─► Idle
//!        │ free, or unchanged for `lease` by our clock (expired), or ours (a ghost)
//!        ▼
//!  Acquire: CAS lock (seen → owner me, token+1, intent kept)
//!        │ previous intent n'?  ─► Fence: FETCH-ADD wanted(n') += 1
//!        ▼
//!  Intent: CAS lock (+beat, intent n)       lost the lock ─► Idle (fenced out)
//!        ▼
//!  Move: CAS wanted(n) (d|v → s|v+1)       lost reply ─► FETCH-ADD wanted(n) += 1 tells
//!        │ moved: FETCH-ADD every peer's shared counter (fire and forget)
//!        ▼
//!  Release: CAS lock (held → free, token kept) ─► Idle
//! ```
//!
//! Why it is safe:
//! - **Node-level exclusion.** A move is a CAS expecting the exact role word read (site
//!   and version); any other change to the node bumps the version, so of two balancers
//!   racing for a node at most one CAS succeeds. Only settled nodes (served == wanted)
//!   are picked, so a node still switching is never reassigned.
//! - **Sites never empty.** Each site's anchor node (its first node, which also holds the
//!   site's lock) is never moved. The paper's lock is the *loaded* site's, so two
//!   balancers relieving different sites could otherwise both take the last spare node
//!   of the same donor.
//! - **Fencing.** Every CAS on the lock word expects the holder's exact word (token,
//!   beat, intent), so a holder that lost the lock can change nothing there. Before a
//!   move the holder announces the node in the lock word (intent) and waits for that
//!   CAS to succeed; a contender that takes an expired lock over first bumps the
//!   announced node's version with FETCH-ADD. From then on the stale holder's move CAS
//!   (which expects the old version) can never succeed, even if it is still in flight.
//! - **Leases without clocks across hosts.** A contender declares a held lock expired
//!   only when the whole lock word stayed the same for `lease` by its own clock (the
//!   holder changes the beat with every CAS). A lease that expires under a live but slow
//!   holder costs nothing but that holder's move: fencing makes its late ops fail.
//! - **Unknown outcomes.** A lost reply to a lock CAS is resolved by reading the word
//!   (if the op is still in flight and lands later, the lock is held by nobody who acts
//!   on it and expires); a lost move CAS is resolved by the holder's own fence
//!   (FETCH-ADD returns the old value: the move either happened or now never will).
//!   Lost FETCH-ADDs to peers' counters are not retried: a missing bump costs at most one
//!   extra move, a duplicate one extra skipped round.

use crate::op::{Completion, Issue, Op, OpId, Target};
use crate::words::{
    Lock, Role, BALANCER_MAX, NODE_MAX, NODE_READ_FIRST, NODE_READ_WORDS, SITE_MAX, W_ROLE_WANTED,
    W_SHARED_COUNTER, W_SITE_LOCK,
};
use std::collections::VecDeque;
use std::fmt;

/// Moves kept for [`Balancer::drain_log`] between drains: a caller that drains every S
/// sees at most one move per round; the bound only matters if it never drains (the
/// oldest records are dropped, counted in [`BalancerStats::log_dropped`]).
pub const MOVE_LOG_MAX: usize = 1024;

/// Timing and thresholds of a balancer. All times are nanoseconds of the caller's
/// monotonic clock.
#[derive(Debug, Clone, PartialEq)]
pub struct BalancerConfig {
    /// S, sensitivity: period of the load checks. Default 250 ms, by the rule: S is at
    /// least 4 × a move's settling time (the node switch time p99, move CAS to the
    /// node's first request in its new role, plus one load sample period of the nodes'
    /// gatherd), rounded up to 50 ms, so a round never reads a site whose move is still
    /// settling. Measured: switch p99 50 ms, sample period 10 ms: 4 × 60 = 240 → 250 ms.
    /// The checks are one-sided reads, so a shorter S costs the back-ends nothing; the
    /// factor 4 is the margin. docs/reconf.md, "Choosing S and T".
    pub sensitivity_ns: u64,
    /// T, history window: a site must stay overloaded this long to get a node. Default
    /// 500 ms, by the rule: the smallest multiple of S, at least 2 S (overloaded at two
    /// checks in a row, so one transient reading moves nothing), whose worst-case TPS
    /// ratio to the rigid allocation over the choosing workloads (`lab reconfig`, 3:3:2
    /// and 2:2:2:2, bursts of 512..16,384 requests at 500 µs each) is within the rigid
    /// runs' own spread (13%) of the best T's worst case; among those the smallest,
    /// since the k-th node reaches a long burst only after ~k (T + S). Applied to the
    /// T sweep (S = 250 ms): worst ratios 0.87 (T = 250 ms, below 2 S), 0.91 (500),
    /// 0.97 (1 s), 0.71 (5 s): 500 ms and 1 s tie, 500 ms is the smaller. Validated on
    /// a held-out workload (2 sites, twice the request cost): docs/reconf.md.
    pub history_ns: u64,
    /// A held lock whose word did not change for this long (by our clock) is expired.
    /// Must cover a live holder's longest hold ([`BalancerConfig::hold_max_ns`]). Default 3 s.
    pub lease_ns: u64,
    /// The transport's op timeout (after which the caller completes an op as lost);
    /// bounds how long a hold can last. Default 50 ms.
    pub op_timeout_ns: u64,
    /// A site whose settled nodes' mean load is at least this is overloaded. Default 0.8.
    pub high_ppm: u64,
    /// A site can spare a node if its load spread over one node fewer stays under this.
    /// Default 0.6.
    pub spare_ppm: u64,
    /// Retries of a lost fence or release before the lock is abandoned to expire.
    /// Default 2: three lost replies in a row mean the path is down.
    pub retry_max: u32,
    /// Word of a node's region that holds its load in ppm (gatherd's CPU utilisation).
    pub load_word: usize,
    /// Fence the announced node when taking a lock over. Always true in service; false
    /// only to show (in tests) the stale move it prevents.
    pub fence_on_takeover: bool,
}

impl Default for BalancerConfig {
    fn default() -> Self {
        BalancerConfig {
            sensitivity_ns: 250_000_000,
            history_ns: 500_000_000,
            lease_ns: 3_000_000_000,
            op_timeout_ns: 50_000_000,
            high_ppm: 800_000,
            spare_ppm: 600_000,
            retry_max: 2,
            load_word: farside_region::layout::W_CPU_UTIL_PPM,
            fence_on_takeover: true,
        }
    }
}

/// Who is where: the same for every balancer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Back-end nodes, indexed 0..nodes.
    pub nodes: u32,
    /// Per site, its anchor node: never moved, holds the site's lock word.
    pub anchors: Vec<u32>,
    /// Balancers, indexed 0..balancers (each has its own region).
    pub balancers: u32,
}

impl Topology {
    /// Sites.
    pub fn sites(&self) -> usize {
        self.anchors.len()
    }
    /// Is `node` some site's anchor?
    pub fn is_anchor(&self, node: u32) -> bool {
        self.anchors.contains(&node)
    }
}

/// A configuration or topology that cannot work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reconf config: {}", self.0)
    }
}
impl std::error::Error for ConfigError {}

impl BalancerConfig {
    /// The longest a live holder keeps a lock: every op it may wait for while holding
    /// (fence and its retries, intent and its resolving read, move and its fences,
    /// release and its resolving reads), each at most one op timeout.
    pub fn hold_max_ns(&self) -> u64 {
        let tries = self.retry_max as u64 + 1;
        (tries + 2 + 1 + tries + 2 * tries) * self.op_timeout_ns
    }

    /// Check the configuration against a topology.
    pub fn validate(&self, topo: &Topology) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError(m));
        if self.sensitivity_ns == 0 || self.op_timeout_ns == 0 {
            return err("sensitivity and op timeout must be > 0".into());
        }
        if self.lease_ns < self.hold_max_ns() {
            return err(format!(
                "lease {} ns is shorter than the longest hold {} ns (op timeout x ops per hold)",
                self.lease_ns,
                self.hold_max_ns()
            ));
        }
        if self.spare_ppm > self.high_ppm {
            return err("spare_ppm above high_ppm would move nodes back and forth".into());
        }
        if self.load_word >= farside_region::layout::REGION_WORDS {
            return err(format!(
                "load word {} is outside the region",
                self.load_word
            ));
        }
        if topo.anchors.is_empty() || topo.anchors.len() > SITE_MAX {
            return err(format!("sites must be 1..={SITE_MAX}"));
        }
        if topo.nodes as usize > NODE_MAX {
            return err(format!("at most {NODE_MAX} nodes"));
        }
        if topo.balancers == 0 || topo.balancers as usize > BALANCER_MAX {
            return err(format!("balancers must be 1..={BALANCER_MAX}"));
        }
        let mut seen = std::collections::HashSet::new();
        for &a in &topo.anchors {
            if a >= topo.nodes || !seen.insert(a) {
                return err(format!("anchor {a} is not a distinct node"));
            }
        }
        Ok(())
    }
}

/// Counters a balancer keeps (the proxy exports them as metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BalancerStats {
    /// Rounds started.
    pub rounds: u64,
    /// Ticks that found the previous round still running.
    pub overruns: u64,
    /// Nodes moved by this balancer.
    pub moves: u64,
    /// Locks acquired (free or taken over).
    pub lock_acquired: u64,
    /// Of which taken over from another, expired holder.
    pub takeovers: u64,
    /// Of which found in our own name (left by an op we gave up on, or by our previous
    /// incarnation) and taken back at once.
    pub adopted: u64,
    /// Lock found held (not expired) or CAS lost to another balancer.
    pub lock_busy: u64,
    /// Node CAS lost to another balancer.
    pub node_races: u64,
    /// Rounds skipped because the shared counter was ahead (dual update counters).
    pub skipped_rounds: u64,
    /// Found the lock taken from us (our fenced CAS failed).
    pub fenced_out: u64,
    /// Fences applied (takeover or resolving a lost move).
    pub fences: u64,
    /// Mutations whose reply was lost.
    pub unknown_outcomes: u64,
    /// Locks left to expire after an unresolved op.
    pub abandoned: u64,
    /// Overloaded site for >= T with no node to spare.
    pub no_donor: u64,
    /// Move records dropped because the log was not drained ([`MOVE_LOG_MAX`]).
    pub log_dropped: u64,
}

/// One move, with its reason (for the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveRecord {
    /// When the move CAS was confirmed (its reply received).
    pub at_ns: u64,
    /// When the round's decision that the site is due a node was taken (after the
    /// round's reads): `at_ns - decided_ns` is the decision-to-move latency (lock read,
    /// acquire, fences, intent and the move CAS, one round trip each).
    pub decided_ns: u64,
    /// When the round that decided the move started (before its reads of every node).
    pub round_ns: u64,
    /// Node moved.
    pub node: u32,
    /// Site it left.
    pub from_site: u16,
    /// Site it now serves (once its agent applied it).
    pub to_site: u16,
    /// The role word written.
    pub wanted: Role,
    /// Mean load of the recipient site when decided, ppm.
    pub site_load_ppm: u64,
    /// How long the recipient had been overloaded, ns.
    pub overloaded_ns: u64,
    /// Lock token the move was made under.
    pub token: u32,
}

/// What the balancer needs from its own region at each event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ctx {
    /// Monotonic time, ns (this host's clock only).
    pub now_ns: u64,
    /// The shared update counter in its own region (peers FETCH-ADD it).
    pub shared_counter: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    site: u16,
    node: u32,
    from: Role,
    site_load_ppm: u64,
    overloaded_ns: u64,
    /// When the decision was taken.
    decided_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Idle,
    Reading {
        first: OpId,
        pending: u32,
    },
    LockRead {
        plan: Plan,
    },
    Acquire {
        plan: Plan,
        expect: Lock,
        new: Lock,
        resolving: bool,
    },
    Fence {
        plan: Plan,
        node: u32,
        tries: u32,
    },
    Intent {
        plan: Plan,
        new: Lock,
        resolving: bool,
    },
    Move {
        plan: Plan,
        fencing: bool,
        tries: u32,
    },
    Release {
        tries: u32,
        resolving: bool,
    },
}

/// One balancer. Drive it with [`Balancer::on_tick`] every S and
/// [`Balancer::on_completion`] for every op it issued.
#[derive(Debug)]
pub struct Balancer {
    id: u32,
    cfg: BalancerConfig,
    topo: Topology,
    phase: Phase,
    /// The op whose completion the current phase waits for (not used while Reading).
    cur: OpId,
    next_id: OpId,
    local_counter: u64,
    /// The lock word we hold and since when.
    held: Option<(u16, Lock, u64)>,
    /// Per site: since when it has been overloaded.
    overloaded_since: Vec<Option<u64>>,
    /// Per site: the other holder's lock word we saw and when we first saw it.
    watch: Vec<Option<(u64, u64)>>,
    roles: Vec<Option<[u64; NODE_READ_WORDS]>>,
    loads: Vec<Option<u64>>,
    stats: BalancerStats,
    log: VecDeque<MoveRecord>,
    /// When the current (or last) round started.
    round_ns: u64,
}

impl Balancer {
    /// A balancer with id `id` (0-based, < `topo.balancers`).
    pub fn new(id: u32, cfg: BalancerConfig, topo: Topology) -> Result<Balancer, ConfigError> {
        cfg.validate(&topo)?;
        if id >= topo.balancers {
            return Err(ConfigError(format!(
                "balancer id {id} >= {}",
                topo.balancers
            )));
        }
        let (n, s) = (topo.nodes as usize, topo.sites());
        Ok(Balancer {
            id,
            cfg,
            phase: Phase::Idle,
            cur: 0,
            // Ids are unique per balancer incarnation; callers key completions by
            // (balancer, id), and a restarted balancer starts a new id space at a
            // high offset so late replies to its predecessor never match.
            next_id: 1,
            local_counter: 0,
            held: None,
            overloaded_since: vec![None; s],
            watch: vec![None; s],
            roles: vec![None; n],
            loads: vec![None; n],
            stats: BalancerStats::default(),
            log: VecDeque::new(),
            round_ns: 0,
            topo,
        })
    }

    /// Start op ids at `first` (a restarted balancer's ids must not collide with the
    /// ones its predecessor still has in flight).
    pub fn with_first_op_id(mut self, first: OpId) -> Balancer {
        self.next_id = first.max(1);
        self
    }

    /// This balancer's id.
    pub fn id(&self) -> u32 {
        self.id
    }
    /// Counters.
    pub fn stats(&self) -> &BalancerStats {
        &self.stats
    }
    /// Configuration.
    pub fn config(&self) -> &BalancerConfig {
        &self.cfg
    }
    /// The lock held now: (site, token, since ns).
    pub fn holding(&self) -> Option<(u16, u32, u64)> {
        self.held.map(|(s, l, t)| (s, l.token, t))
    }
    /// The local update counter.
    pub fn local_counter(&self) -> u64 {
        self.local_counter
    }
    /// Is a round in progress?
    pub fn busy(&self) -> bool {
        self.phase != Phase::Idle
    }
    /// The current phase, for logs and violation reports.
    pub fn phase_name(&self) -> &'static str {
        match self.phase {
            Phase::Idle => "idle",
            Phase::Reading { .. } => "reading",
            Phase::LockRead { .. } => "lock-read",
            Phase::Acquire { .. } => "acquire",
            Phase::Fence { .. } => "fence",
            Phase::Intent { .. } => "intent",
            Phase::Move { .. } => "move",
            Phase::Release { .. } => "release",
        }
    }

    /// Take the moves made since the last call.
    pub fn drain_log(&mut self) -> Vec<MoveRecord> {
        self.log.drain(..).collect()
    }

    fn issue(&mut self, out: &mut Vec<Issue>, op: Op) -> OpId {
        let id = self.next_id;
        self.next_id += 1;
        out.push(Issue { id, op });
        id
    }

    fn issue_cur(&mut self, out: &mut Vec<Issue>, op: Op) {
        self.cur = self.issue(out, op);
    }

    /// Every S: start a round (read every node) unless one is running.
    pub fn on_tick(&mut self, ctx: Ctx, out: &mut Vec<Issue>) {
        if self.phase != Phase::Idle {
            self.stats.overruns += 1;
            return;
        }
        self.stats.rounds += 1;
        self.round_ns = ctx.now_ns;
        let first = self.next_id;
        for n in 0..self.topo.nodes {
            self.roles[n as usize] = None;
            self.loads[n as usize] = None;
            self.issue(
                out,
                Op::Read {
                    target: Target::Node(n),
                    word: NODE_READ_FIRST,
                    len: NODE_READ_WORDS,
                },
            );
            self.issue(
                out,
                Op::Read {
                    target: Target::Node(n),
                    word: self.cfg.load_word,
                    len: 1,
                },
            );
        }
        self.phase = Phase::Reading {
            first,
            pending: self.topo.nodes * 2,
        };
        if self.topo.nodes == 0 {
            self.phase = Phase::Idle;
        }
    }

    /// The completion of op `id`. Completions of ops the current phase no longer waits
    /// for (fire-and-forget counter bumps, replies after a restart) are ignored.
    pub fn on_completion(&mut self, ctx: Ctx, id: OpId, c: Completion, out: &mut Vec<Issue>) {
        if let Phase::Reading { first, pending } = &mut self.phase {
            let (first, nodes) = (*first, self.topo.nodes as u64);
            if id < first || id >= first + 2 * nodes {
                return;
            }
            *pending -= 1;
            let done = *pending == 0;
            let node = ((id - first) / 2) as usize;
            if let Completion::Read(w) = c {
                if (id - first) % 2 == 0 && w.len() == NODE_READ_WORDS {
                    let mut a = [0; NODE_READ_WORDS];
                    a.copy_from_slice(&w);
                    self.roles[node] = Some(a);
                } else if (id - first) % 2 == 1 && w.len() == 1 {
                    self.loads[node] = Some(w[0]);
                }
            }
            if done {
                self.phase = Phase::Idle;
                self.decide(ctx, out);
            }
            return;
        }
        if id != self.cur || self.phase == Phase::Idle {
            return;
        }
        let lost = c == Completion::Lost;
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        match phase {
            Phase::Idle | Phase::Reading { .. } => {}
            Phase::LockRead { plan } => {
                if let Completion::Read(w) = c {
                    self.on_lock_read(ctx, plan, w[0], out);
                }
            }
            Phase::Acquire {
                plan,
                expect,
                new,
                resolving,
            } => {
                let got = match (&c, resolving) {
                    (Completion::Cas(prev), false) => Some(*prev == expect.encode()),
                    (Completion::Read(w), true) => Some(w[0] == new.encode()),
                    _ => None,
                };
                match got {
                    Some(true) => {
                        self.stats.lock_acquired += 1;
                        match expect.holder() {
                            Some(h) if h == self.id => self.stats.adopted += 1,
                            Some(_) => self.stats.takeovers += 1,
                            None => {}
                        }
                        self.watch[plan.site as usize] = None;
                        self.held = Some((plan.site, new, ctx.now_ns));
                        match new.intent_node() {
                            Some(n) if self.cfg.fence_on_takeover => {
                                self.phase = Phase::Fence {
                                    plan,
                                    node: n,
                                    tries: 0,
                                };
                                self.issue_fence(n, out);
                            }
                            _ => self.proceed(ctx, plan, out),
                        }
                    }
                    Some(false) => self.stats.lock_busy += 1,
                    None if lost && !resolving => {
                        self.stats.unknown_outcomes += 1;
                        self.phase = Phase::Acquire {
                            plan,
                            expect,
                            new,
                            resolving: true,
                        };
                        self.read_lock(plan.site, out);
                    }
                    // Resolving read lost: if the CAS lands later, nobody acts under
                    // that token and the lock expires.
                    None => {}
                }
            }
            Phase::Fence {
                mut plan,
                node,
                tries,
            } => match c {
                Completion::Fadd(prev) => {
                    self.stats.fences += 1;
                    if node == plan.node && prev == plan.from.0 {
                        // We fenced the node we meant to move, which had not moved: it
                        // is still ours to move, one version later.
                        plan.from = Role(prev.wrapping_add(1));
                    }
                    self.proceed(ctx, plan, out);
                }
                _ if tries < self.cfg.retry_max => {
                    self.stats.unknown_outcomes += 1;
                    self.phase = Phase::Fence {
                        plan,
                        node,
                        tries: tries + 1,
                    };
                    self.issue_fence(node, out);
                }
                _ => self.abandon(),
            },
            Phase::Intent {
                plan,
                new,
                resolving,
            } => {
                let ok = match (&c, resolving) {
                    (Completion::Cas(prev), false) => {
                        Some(*prev == self.held.map(|h| h.1.encode()).unwrap_or(u64::MAX))
                    }
                    (Completion::Read(w), true) => Some(w[0] == new.encode()),
                    _ => None,
                };
                match ok {
                    Some(true) => {
                        if let Some(h) = &mut self.held {
                            h.1 = new;
                        }
                        self.phase = Phase::Move {
                            plan,
                            fencing: false,
                            tries: 0,
                        };
                        self.issue_cur(
                            out,
                            Op::Cas {
                                target: Target::Node(plan.node),
                                word: W_ROLE_WANTED,
                                expect: plan.from.0,
                                new: plan.from.moved_to(plan.site).0,
                            },
                        );
                    }
                    Some(false) if !resolving => {
                        self.stats.fenced_out += 1;
                        self.held = None;
                    }
                    None if !resolving => {
                        self.stats.unknown_outcomes += 1;
                        self.phase = Phase::Intent {
                            plan,
                            new,
                            resolving: true,
                        };
                        self.read_lock(plan.site, out);
                    }
                    // Our intent is not visible (or we cannot tell): leave the lock to
                    // expire rather than guess; a taker fences whatever it shows.
                    _ => self.abandon(),
                }
            }
            Phase::Move {
                plan,
                fencing,
                tries,
            } => {
                let target = plan.from.moved_to(plan.site);
                let moved = match (&c, fencing) {
                    (Completion::Cas(prev), false) => Some(*prev == plan.from.0),
                    (Completion::Fadd(prev), true) => {
                        self.stats.fences += 1;
                        Some(*prev == target.0)
                    }
                    _ => None,
                };
                match moved {
                    Some(true) => {
                        self.moved(ctx, plan, target, out);
                        self.release(out, 0);
                    }
                    Some(false) => {
                        self.stats.node_races += 1;
                        self.release(out, 0);
                    }
                    None if tries <= self.cfg.retry_max => {
                        // Lost: our own fence tells whether the move happened, and
                        // makes sure a CAS still in flight can never apply.
                        self.stats.unknown_outcomes += 1;
                        self.phase = Phase::Move {
                            plan,
                            fencing: true,
                            tries: tries + 1,
                        };
                        self.issue_fence(plan.node, out);
                    }
                    // Intent stays in the lock word: whoever takes it over fences.
                    None => self.abandon(),
                }
            }
            Phase::Release { tries, resolving } => {
                let Some((site, lock, _)) = self.held else {
                    return;
                };
                match (&c, resolving) {
                    (Completion::Cas(_), false) => self.held = None,
                    (Completion::Read(w), true) if w[0] == lock.encode() => {
                        if tries < self.cfg.retry_max {
                            self.release(out, tries + 1);
                        } else {
                            self.abandon();
                        }
                    }
                    (Completion::Read(_), true) => self.held = None,
                    (Completion::Lost, false) => {
                        self.stats.unknown_outcomes += 1;
                        self.phase = Phase::Release {
                            tries,
                            resolving: true,
                        };
                        self.read_lock(site, out);
                    }
                    _ => self.abandon(),
                }
            }
        }
    }

    fn abandon(&mut self) {
        self.stats.abandoned += 1;
        self.held = None;
        self.phase = Phase::Idle;
    }

    fn read_lock(&mut self, site: u16, out: &mut Vec<Issue>) {
        self.issue_cur(
            out,
            Op::Read {
                target: Target::Node(self.topo.anchors[site as usize]),
                word: W_SITE_LOCK,
                len: 1,
            },
        );
    }

    fn issue_fence(&mut self, node: u32, out: &mut Vec<Issue>) {
        self.issue_cur(
            out,
            Op::Fadd {
                target: Target::Node(node),
                word: W_ROLE_WANTED,
                delta: 1,
            },
        );
    }

    fn lock_cas(&mut self, site: u16, expect: Lock, new: Lock, out: &mut Vec<Issue>) {
        self.issue_cur(
            out,
            Op::Cas {
                target: Target::Node(self.topo.anchors[site as usize]),
                word: W_SITE_LOCK,
                expect: expect.encode(),
                new: new.encode(),
            },
        );
    }

    fn release(&mut self, out: &mut Vec<Issue>, tries: u32) {
        let Some((site, lock, _)) = self.held else {
            return;
        };
        self.phase = Phase::Release {
            tries,
            resolving: false,
        };
        self.lock_cas(site, lock, lock.released(), out);
    }

    fn moved(&mut self, ctx: Ctx, plan: Plan, wanted: Role, out: &mut Vec<Issue>) {
        self.stats.moves += 1;
        if self.log.len() >= MOVE_LOG_MAX {
            self.log.pop_front();
            self.stats.log_dropped += 1;
        }
        self.log.push_back(MoveRecord {
            at_ns: ctx.now_ns,
            decided_ns: plan.decided_ns,
            round_ns: self.round_ns,
            node: plan.node,
            from_site: plan.from.site(),
            to_site: plan.site,
            wanted,
            site_load_ppm: plan.site_load_ppm,
            overloaded_ns: plan.overloaded_ns,
            token: self.held.map_or(0, |h| h.1.token),
        });
        // Wait T again before judging the load the move is about to change.
        self.overloaded_since.iter_mut().for_each(|s| *s = None);
        for b in 0..self.topo.balancers {
            if b != self.id {
                // Fire and forget: completions are ignored (see module doc).
                self.issue(
                    out,
                    Op::Fadd {
                        target: Target::Balancer(b),
                        word: W_SHARED_COUNTER,
                        delta: 1,
                    },
                );
            }
        }
    }

    /// Holding the lock (fenced if needed): check counters again, then announce.
    fn proceed(&mut self, ctx: Ctx, plan: Plan, out: &mut Vec<Issue>) {
        if self.catch_up(ctx) {
            self.release(out, 0);
            return;
        }
        let Some((_, lock, _)) = self.held else {
            return;
        };
        let new = lock.with_intent(Some(plan.node));
        self.phase = Phase::Intent {
            plan,
            new,
            resolving: false,
        };
        self.lock_cas(plan.site, lock, new, out);
    }

    /// Dual update counters: if a peer moved a node since we last looked, take its
    /// count, forget our overload history and skip this round.
    fn catch_up(&mut self, ctx: Ctx) -> bool {
        if ctx.shared_counter == self.local_counter {
            return false;
        }
        self.local_counter = ctx.shared_counter;
        self.stats.skipped_rounds += 1;
        self.overloaded_since.iter_mut().for_each(|s| *s = None);
        true
    }

    fn on_lock_read(&mut self, ctx: Ctx, plan: Plan, word: u64, out: &mut Vec<Issue>) {
        let lock = Lock::decode(word);
        let site = plan.site as usize;
        let expired = match lock.holder() {
            None => true,
            // A lock in our own name is a ghost of an op we gave up on.
            Some(h) if h == self.id => true,
            Some(_) => match self.watch[site] {
                Some((w, since)) if w == word => {
                    ctx.now_ns.saturating_sub(since) >= self.cfg.lease_ns
                }
                _ => {
                    self.watch[site] = Some((word, ctx.now_ns));
                    false
                }
            },
        };
        if !expired {
            self.stats.lock_busy += 1;
            return;
        }
        let new = lock.acquired_by(self.id);
        self.phase = Phase::Acquire {
            plan,
            expect: lock,
            new,
            resolving: false,
        };
        self.lock_cas(plan.site, lock, new, out);
    }

    /// After a full read: update history, pick a recipient and a donor node, start the
    /// lock if a move is due.
    fn decide(&mut self, ctx: Ctx, out: &mut Vec<Issue>) {
        let sites = self.topo.sites();
        let mut assigned = vec![0u32; sites];
        let mut settled = vec![0u64; sites];
        let mut load_sum = vec![0u64; sites];
        for n in 0..self.topo.nodes as usize {
            let Some(r) = self.roles[n] else { continue };
            let (served, wanted) = (Role(r[0]), Role(r[2]));
            let ws = wanted.site() as usize;
            if ws < sites {
                assigned[ws] += 1;
            }
            if served == wanted && ws < sites {
                if let Some(l) = self.loads[n] {
                    settled[ws] += 1;
                    load_sum[ws] += l.min(1_000_000);
                }
            }
        }
        let mean = |s: usize| load_sum[s].checked_div(settled[s]);
        let mut best: Option<(u64, usize)> = None;
        for s in 0..sites {
            match mean(s) {
                Some(m) if m >= self.cfg.high_ppm => {
                    let since = *self.overloaded_since[s].get_or_insert(ctx.now_ns);
                    if ctx.now_ns - since >= self.cfg.history_ns && best.is_none_or(|b| m > b.0) {
                        best = Some((m, s));
                    }
                }
                Some(_) => self.overloaded_since[s] = None,
                None => {} // nothing settled to judge by: keep the history as it is
            }
        }
        let Some((site_load, s)) = best else { return };
        // Donors: other sites that keep >= 1 node and stay under spare_ppm with one
        // node fewer; the least-loaded settled non-anchor node among them.
        let can_spare: Vec<bool> = (0..sites)
            .map(|d| {
                d != s
                    && assigned[d] >= 2
                    && settled[d] >= 2
                    && load_sum[d] / (settled[d] - 1) < self.cfg.spare_ppm
            })
            .collect();
        let mut pick: Option<(u64, u32, Role)> = None;
        for n in 0..self.topo.nodes {
            let (Some(r), Some(l)) = (self.roles[n as usize], self.loads[n as usize]) else {
                continue;
            };
            let (served, wanted) = (Role(r[0]), Role(r[2]));
            let d = wanted.site() as usize;
            if served != wanted || d >= sites || !can_spare[d] || self.topo.is_anchor(n) {
                continue;
            }
            if pick.is_none_or(|p| l < p.0) {
                pick = Some((l, n, wanted));
            }
        }
        let Some((_, node, from)) = pick else {
            self.stats.no_donor += 1;
            return;
        };
        if self.catch_up(ctx) {
            return;
        }
        let plan = Plan {
            site: s as u16,
            node,
            from,
            site_load_ppm: site_load,
            overloaded_ns: ctx.now_ns - self.overloaded_since[s].unwrap_or(ctx.now_ns),
            decided_ns: ctx.now_ns,
        };
        self.phase = Phase::LockRead { plan };
        self.read_lock(plan.site, out);
    }
}
