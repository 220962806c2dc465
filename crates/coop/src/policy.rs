//! Where a request is served and where its body comes from: the policies compared, each a
//! pure state machine `(state, request, view, now) -> decision` with no I/O, so the
//! simulator and (later) the data path drive the same code.
//!
//! ```text
//!                 request (initial node chosen by round-robin DNS, or none)
//!                    │
//!   PRESS            │ at the initial node n:
//!     cached at n? ──┴─ yes ─► Local
//!     peers whose directory hint says yes? none ─► Disk (then n caches it)
//!     least-loaded such peer p; p overloaded and n not? ─► Disk (replicate at n)
//!     otherwise ─► Peer(p) (one-sided READ of p's arena; objects too large for the
//!                  arena are forwarded) or Forward(p) (PRESS as published)
//!
//!   LARD, bounded-load hashing, round-robin: the front-end picks node n, then
//!     cached at n? ─► Local, else ─► Disk (n caches it; no cooperation)
//! ```
//!
//! A hint is only a hint: the simulator (and the arena reader) check at the time the body
//! is taken that the node really holds the object, and fall back to disk otherwise.

use farside_arena::layout::OBJECT_BYTES_MAX;
use std::collections::HashMap;

/// Node index.
pub type NodeId = usize;

/// Nodes a policy handles at most: the front-end keeps per-node state in arrays and
/// PRESS scans every peer's hint per miss; 64 covers the experiments' extrapolations.
pub const NODES_MAX: usize = 64;

/// Targets LARD remembers (its `server[target]` table). Rule: ten times the World Cup
/// sample's 2,730 urls; when full the table is cleared and relearnt, which costs a
/// moment of worse locality, never correctness.
pub const LARD_TARGETS_MAX: usize = 32_768;

/// Points each node has on the consistent-hash ring. Rule: with 100 points per node the
/// share of the ring of each node stays within about 10 % of the mean (standard
/// deviation about 1/sqrt(100)); the bounded load does the rest.
pub const RING_POINTS_PER_NODE: usize = 100;

/// One request as a policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub object: u64,
    pub bytes: u64,
    /// The node the client reached (round-robin DNS). Front-end policies ignore it.
    pub initial: NodeId,
}

/// Where the body of the reply comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The answering node's own cache.
    Local,
    /// A peer's cache, read one-sidedly by the answering node.
    Peer(NodeId),
    /// A peer's cache, the request forwarded to it and the body returned (PRESS as
    /// published: the peer's process handles it).
    Forward(NodeId),
    /// The answering node's disk (it caches the object afterwards).
    Disk,
}

/// A policy's decision: which node answers the client, and from where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub node: NodeId,
    pub source: Source,
}

/// What a policy may know of the cluster when it decides.
pub trait ClusterView {
    /// Nodes in the cluster.
    fn nodes(&self) -> usize;
    /// Whether `node` caches `object` (a node knows its own cache exactly).
    fn cached(&self, node: NodeId, object: u64) -> bool;
    /// Whether `peer`'s published directory, as `node` last read it, says it caches
    /// `object` (may be stale or a false positive).
    fn hint(&self, node: NodeId, peer: NodeId, object: u64) -> bool;
    /// `node`'s load (requests in flight) as the monitor last read it (1 ms period),
    /// plus what the deciding front-end sent it since.
    fn load(&self, node: NodeId) -> u64;
    /// Whether the front-end may send `node` a request now (a proxy's view says no for a
    /// back-end marked down or refused by admission). The front-end policies (LARD,
    /// bounded-load hashing) route only to usable nodes while there is one; when none
    /// is, they decide as if all were (the caller refuses before asking them). Default:
    /// every node is usable (the simulator's nodes always are).
    fn usable(&self, _node: NodeId) -> bool {
        true
    }
}

fn least_loaded(view: &impl ClusterView, among: impl Iterator<Item = NodeId>) -> Option<NodeId> {
    among.min_by_key(|&n| (view.load(n), n))
}

/// The usable nodes, or every node when none is (see [`ClusterView::usable`]).
fn usable_nodes(view: &impl ClusterView) -> impl Iterator<Item = NodeId> + '_ {
    let any = (0..view.nodes()).any(|n| view.usable(n));
    (0..view.nodes()).filter(move |&n| !any || view.usable(n))
}

/// How PRESS obtains a body from a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteMode {
    /// Read it from the peer's arena (no process on the peer is scheduled).
    OneSided,
    /// Forward the request; the peer's server returns the body (PRESS as published).
    Forward,
}

/// PRESS (Carrera, Rao, Iftode, Bianchini; Bianchini's PRESS server).
#[derive(Debug, Clone, PartialEq)]
pub struct Press {
    pub remote: RemoteMode,
    /// A peer with at least this load is overloaded: the initial node then reads the
    /// object from disk itself (replicating it) if it is not overloaded too. Default 65,
    /// LARD's T_high, so both policies call the same load too high.
    pub overload_load: u64,
    /// Largest body read one-sidedly; larger objects are forwarded to the holder's
    /// server. Default the arena's `OBJECT_BYTES_MAX`: larger objects are not in the
    /// arena.
    pub one_sided_bytes_max: u64,
}

impl Press {
    pub fn new(remote: RemoteMode) -> Press {
        Press {
            remote,
            overload_load: 65,
            one_sided_bytes_max: OBJECT_BYTES_MAX as u64,
        }
    }

    pub fn decide(&mut self, req: &Request, view: &impl ClusterView) -> Decision {
        let n = req.initial;
        if view.cached(n, req.object) {
            return Decision {
                node: n,
                source: Source::Local,
            };
        }
        let holders = (0..view.nodes()).filter(|&p| p != n && view.hint(n, p, req.object));
        let source = match least_loaded(view, holders) {
            None => Source::Disk,
            Some(p) if view.load(p) >= self.overload_load && view.load(n) < self.overload_load => {
                Source::Disk
            }
            Some(p) => match self.remote {
                RemoteMode::OneSided if req.bytes <= self.one_sided_bytes_max => Source::Peer(p),
                RemoteMode::OneSided | RemoteMode::Forward => Source::Forward(p),
            },
        };
        Decision { node: n, source }
    }
}

/// Basic LARD (Pai et al., ASPLOS 1998) at a front-end: a target stays on its node
/// unless that node is above T_high while another is below T_low, or at 2 T_high.
/// A target (re)assigned goes to the least-loaded node; ties go round-robin (from the
/// node after the last one assigned), so an idle cluster's new targets spread instead
/// of all landing on node 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Lard {
    /// T_low, connections: a node below it is underused. Default 25 (the paper's).
    pub t_low: u64,
    /// T_high, connections: a node above it is loaded. Default 65 (the paper's).
    pub t_high: u64,
    server: HashMap<u64, NodeId>,
    /// Where the tie-break among equally loaded nodes starts.
    rotation: NodeId,
}

impl Default for Lard {
    fn default() -> Self {
        Lard {
            t_low: 25,
            t_high: 65,
            server: HashMap::new(),
            rotation: 0,
        }
    }
}

impl Lard {
    pub fn new(t_low: u64, t_high: u64) -> Lard {
        Lard {
            t_low,
            t_high,
            server: HashMap::new(),
            rotation: 0,
        }
    }

    /// The node `object` is assigned to, if any.
    pub fn assigned(&self, object: u64) -> Option<NodeId> {
        self.server.get(&object).copied()
    }

    pub fn decide(&mut self, req: &Request, view: &impl ClusterView) -> Decision {
        let all = || usable_nodes(view);
        let node = match self.server.get(&req.object) {
            Some(&n)
                if n < view.nodes()
                    && all().any(|m| m == n)
                    && !((view.load(n) > self.t_high
                        && all().any(|m| view.load(m) < self.t_low))
                        || view.load(n) >= 2 * self.t_high) =>
            {
                n
            }
            _ => {
                let nodes = view.nodes().max(1);
                let from = self.rotation % nodes;
                let n = all()
                    .min_by_key(|&m| (view.load(m), (m + nodes - from) % nodes))
                    .expect("at least one node");
                self.rotation = n + 1;
                if self.server.len() >= LARD_TARGETS_MAX {
                    self.server.clear();
                }
                self.server.insert(req.object, n);
                n
            }
        };
        local_or_disk(node, req, view)
    }
}

fn local_or_disk(node: NodeId, req: &Request, view: &impl ClusterView) -> Decision {
    let source = if view.cached(node, req.object) {
        Source::Local
    } else {
        Source::Disk
    };
    Decision { node, source }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam), as HAProxy's
/// `balance uri` + `hash-type consistent` + `hash-balance-factor`: walk the ring from the
/// object's point to the first node whose load stays within `factor` of the mean.
#[derive(Debug, Clone, PartialEq)]
pub struct BoundedHash {
    /// HAProxy's `hash-balance-factor` in percent (a node takes a request only if its
    /// load + 1 is at most `ceil((total + 1) * factor / 100 / nodes)`). Default 125, the
    /// value HAProxy's documentation suggests; 0 turns the bound off.
    pub balance_factor_pct: u64,
    ring: Vec<(u64, NodeId)>,
}

impl BoundedHash {
    pub fn new(nodes: usize, balance_factor_pct: u64) -> BoundedHash {
        assert!((1..=NODES_MAX).contains(&nodes));
        let mut ring: Vec<(u64, NodeId)> = (0..nodes)
            .flat_map(|n| {
                (0..RING_POINTS_PER_NODE).map(move |i| (mix(((n as u64) << 32) | i as u64), n))
            })
            .collect();
        ring.sort_unstable();
        BoundedHash {
            balance_factor_pct,
            ring,
        }
    }

    /// Takes `&self`: the ring never changes, so many threads may decide at once. Load
    /// and mean are over the usable nodes ([`ClusterView::usable`]); the walk skips the
    /// others.
    pub fn decide(&self, req: &Request, view: &impl ClusterView) -> Decision {
        let point = mix(req.object ^ 0xA076_1D64_78BD_642F);
        let start = self.ring.partition_point(|&(p, _)| p < point);
        let any = (0..view.nodes()).any(|n| view.usable(n));
        let usable = |n: NodeId| n < view.nodes() && (!any || view.usable(n));
        let nodes = usable_nodes(view).count().max(1) as u64;
        let total: u64 = usable_nodes(view)
            .map(|n| view.load(n))
            .fold(0, u64::saturating_add);
        let limit = total
            .saturating_add(1)
            .saturating_mul(self.balance_factor_pct)
            .div_ceil(100 * nodes);
        let len = self.ring.len();
        let walk = || {
            (0..len)
                .map(move |i| self.ring[(start + i) % len].1)
                .filter(|&n| usable(n))
        };
        let first = walk().next().unwrap_or(self.ring[start % len].1);
        let node = if self.balance_factor_pct == 0 {
            first
        } else {
            walk().find(|&n| view.load(n) < limit).unwrap_or(first)
        };
        local_or_disk(node, req, view)
    }
}

/// Round-robin over the nodes, each serving from its own cache or disk: the baseline
/// without locality or cooperation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundRobin {
    next: usize,
}

impl RoundRobin {
    pub fn decide(&mut self, req: &Request, view: &impl ClusterView) -> Decision {
        let node = self.next % view.nodes();
        self.next = (self.next + 1) % view.nodes();
        local_or_disk(node, req, view)
    }
}

/// Every node serves the requests that reach it ([`Request::initial`]) from its own
/// cache or disk: round-robin DNS in front of nodes that do not cooperate, as
/// `farside backend --coop --coop-policy rr` does in `farside lab coop`'s `rr` system
/// (each client's connection stays on the node its name resolved to). Unlike
/// [`RoundRobin`], which spreads each request anew, a client's requests (a user's page
/// and its images) meet the node's cache together.
pub fn independent(req: &Request, view: &impl ClusterView) -> Decision {
    local_or_disk(req.initial, req, view)
}

/// The policies compared.
#[derive(Debug, Clone, PartialEq)]
pub enum Policy {
    Press(Press),
    Lard(Lard),
    BoundedHash(BoundedHash),
    RoundRobin(RoundRobin),
    /// [`independent`].
    Independent,
}

impl Policy {
    /// Name used in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Press(p) if p.remote == RemoteMode::Forward => "press-forward",
            Policy::Press(_) => "press",
            Policy::Lard(_) => "lard",
            Policy::BoundedHash(_) => "bounded-hash",
            Policy::RoundRobin(_) => "round-robin",
            Policy::Independent => "independent",
        }
    }

    /// The decision for one request. `_now_ns` is part of the contract (policies with
    /// timers, e.g. a LARD that expires assignments, need it) though none uses it yet.
    pub fn decide(&mut self, req: &Request, view: &impl ClusterView, _now_ns: u64) -> Decision {
        match self {
            Policy::Press(p) => p.decide(req, view),
            Policy::Lard(p) => p.decide(req, view),
            Policy::BoundedHash(p) => p.decide(req, view),
            Policy::RoundRobin(p) => p.decide(req, view),
            Policy::Independent => independent(req, view),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A view set by hand.
    struct View {
        cached: Vec<Vec<u64>>,
        hints: Vec<Vec<u64>>,
        load: Vec<u64>,
    }

    impl ClusterView for View {
        fn nodes(&self) -> usize {
            self.load.len()
        }
        fn cached(&self, node: NodeId, object: u64) -> bool {
            self.cached[node].contains(&object)
        }
        fn hint(&self, _node: NodeId, peer: NodeId, object: u64) -> bool {
            self.hints[peer].contains(&object)
        }
        fn load(&self, node: NodeId) -> u64 {
            self.load[node]
        }
    }

    fn view(n: usize) -> View {
        View {
            cached: vec![vec![]; n],
            hints: vec![vec![]; n],
            load: vec![0; n],
        }
    }

    fn req(object: u64, initial: NodeId) -> Request {
        Request {
            object,
            bytes: 1000,
            initial,
        }
    }

    #[test]
    fn press_serves_own_hits_fetches_from_the_least_loaded_holder_else_disk() {
        let mut v = view(3);
        let mut p = Press::new(RemoteMode::OneSided);
        v.cached[0].push(7);
        assert_eq!(p.decide(&req(7, 0), &v).source, Source::Local);
        assert_eq!(p.decide(&req(8, 0), &v).source, Source::Disk);
        v.hints[1].push(8);
        v.hints[2].push(8);
        v.load = vec![0, 10, 5];
        assert_eq!(
            p.decide(&req(8, 0), &v),
            Decision {
                node: 0,
                source: Source::Peer(2)
            }
        );
        let big = Request {
            bytes: OBJECT_BYTES_MAX as u64 + 1,
            ..req(8, 0)
        };
        assert_eq!(
            p.decide(&big, &v).source,
            Source::Forward(2),
            "not in the arena"
        );
        p.remote = RemoteMode::Forward;
        assert_eq!(p.decide(&req(8, 0), &v).source, Source::Forward(2));
    }

    #[test]
    fn press_replicates_when_every_holder_is_overloaded() {
        let mut v = view(2);
        let mut p = Press::new(RemoteMode::OneSided);
        v.hints[1].push(8);
        v.load = vec![3, 65];
        assert_eq!(p.decide(&req(8, 0), &v).source, Source::Disk);
        v.load = vec![70, 65];
        assert_eq!(
            p.decide(&req(8, 0), &v).source,
            Source::Peer(1),
            "both overloaded"
        );
    }

    #[test]
    fn lard_keeps_a_target_on_its_node_until_the_thresholds_say_move() {
        let mut v = view(3);
        let mut l = Lard::default();
        v.load = vec![5, 0, 9];
        assert_eq!(
            l.decide(&req(1, 0), &v).node,
            1,
            "first assignment: least loaded"
        );
        v.load = vec![5, 60, 9];
        assert_eq!(l.decide(&req(1, 0), &v).node, 1, "below T_high: stays");
        v.load = vec![30, 66, 40];
        assert_eq!(
            l.decide(&req(1, 0), &v).node,
            1,
            "above T_high but nobody below T_low"
        );
        v.load = vec![24, 66, 40];
        assert_eq!(
            l.decide(&req(1, 0), &v).node,
            0,
            "above T_high and node 0 below T_low"
        );
        v.load = vec![130, 100, 120];
        assert_eq!(
            l.decide(&req(1, 0), &v).node,
            1,
            "node 0 at 2 T_high: least loaded"
        );
        assert_eq!(l.assigned(1), Some(1));
        let idle = view(3);
        let mut l = Lard::default();
        let spread: Vec<NodeId> = (10..13).map(|o| l.decide(&req(o, 0), &idle).node).collect();
        assert_eq!(spread, vec![0, 1, 2], "ties go round-robin");
    }

    #[test]
    fn bounded_hash_is_sticky_and_spills_past_the_bound() {
        let mut v = view(4);
        let mut h = BoundedHash::new(4, 125);
        let home = h.decide(&req(42, 0), &v).node;
        assert_eq!(
            h.decide(&req(42, 0), &v).node,
            home,
            "same object, same node"
        );
        // The home node carries all the load: the bound (ceil(41*1.25/4) = 13) sends it on.
        v.load[home] = 40;
        let spill = h.decide(&req(42, 0), &v).node;
        assert_ne!(spill, home);
        h.balance_factor_pct = 0;
        assert_eq!(
            h.decide(&req(42, 0), &v).node,
            home,
            "no bound: always home"
        );
    }

    /// A view where some nodes are not usable.
    struct Partly(View, Vec<bool>);

    impl ClusterView for Partly {
        fn nodes(&self) -> usize {
            self.0.nodes()
        }
        fn cached(&self, node: NodeId, object: u64) -> bool {
            self.0.cached(node, object)
        }
        fn hint(&self, node: NodeId, peer: NodeId, object: u64) -> bool {
            self.0.hint(node, peer, object)
        }
        fn load(&self, node: NodeId) -> u64 {
            self.0.load(node)
        }
        fn usable(&self, node: NodeId) -> bool {
            self.1[node]
        }
    }

    #[test]
    fn front_end_policies_route_only_to_usable_nodes_while_one_is() {
        let mut l = Lard::default();
        let mut v = Partly(view(3), vec![true; 3]);
        v.0.load = vec![5, 0, 9];
        assert_eq!(l.decide(&req(1, 0), &v).node, 1);
        v.1[1] = false;
        assert_eq!(l.decide(&req(1, 0), &v).node, 0, "its node unusable: moved");
        v.1[1] = true;
        assert_eq!(l.decide(&req(1, 0), &v).node, 0, "and stays moved");
        let h = BoundedHash::new(3, 125);
        let home = h.decide(&req(42, 0), &v).node;
        v.1[home] = false;
        let other = h.decide(&req(42, 0), &v).node;
        assert_ne!(other, home);
        v.1 = vec![false; 3];
        assert_eq!(
            h.decide(&req(42, 0), &v).node,
            home,
            "none usable: as if all"
        );
        v.0.load = vec![u64::MAX; 3];
        h.decide(&req(42, 0), &v);
    }

    #[test]
    fn bounded_hash_spreads_objects_over_all_nodes() {
        let v = view(8);
        let h = BoundedHash::new(8, 125);
        let mut per = [0u32; 8];
        for o in 0..8000 {
            per[h.decide(&req(o, 0), &v).node] += 1;
        }
        assert!(per.iter().all(|&c| (700..1300).contains(&c)), "{per:?}");
    }

    #[test]
    fn independent_nodes_serve_what_reaches_them() {
        let mut v = view(3);
        v.cached[1].push(5);
        v.hints[2].push(6);
        let at = |object, initial| independent(&req(object, initial), &v);
        assert_eq!(
            at(5, 1),
            Decision {
                node: 1,
                source: Source::Local
            }
        );
        assert_eq!(
            at(5, 0),
            Decision {
                node: 0,
                source: Source::Disk
            },
            "no cooperation"
        );
        assert_eq!(
            at(6, 0),
            Decision {
                node: 0,
                source: Source::Disk
            }
        );
        assert_eq!(at(6, 2).node, 2, "the node the client reached, every time");
    }

    #[test]
    fn round_robin_ignores_content() {
        let mut v = view(3);
        v.cached[1].push(5);
        let mut r = RoundRobin::default();
        let d: Vec<Decision> = (0..3).map(|_| r.decide(&req(5, 0), &v)).collect();
        assert_eq!(d.iter().map(|d| d.node).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(d[1].source, Source::Local);
        assert_eq!(d[2].source, Source::Disk);
    }
}
