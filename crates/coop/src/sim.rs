//! A deterministic, seeded discrete-event simulator of a cluster serving a trace under one
//! [`Policy`], checking the invariants and reporting what the analytical model needs.
//!
//! Model:
//! - **Nodes.** Each has three resources, each a FIFO queue with one server: CPU, disk
//!   and NIC (transmit). Service times come from [`Costs`] (parameters, not measurements).
//! - **Clients.** A closed population (`clients_per_node` x nodes) with think time
//!   `think_ns`; each client takes the trace's next request when its previous one is
//!   answered (the trace's timestamps are ignored: this measures throughput at
//!   saturation). The initial node (round-robin DNS) is drawn uniformly by the seeded PRNG.
//! - **A request's visits**, by the policy's [`Source`] (n answers, p is the peer):
//!   - Local: CPU(n) request + copy, NIC(n) body;
//!   - Disk: CPU(n), disk(n) access + transfer (then n caches the object), NIC(n);
//!   - Peer: CPU(n) request + copy + one READ per chunk, CPU(p) softirq per chunk (XDP),
//!     NIC(p) body, NIC(n) body;
//!   - Forward: CPU(n) request + forwarding, CPU(p) request + copy, NIC(p), NIC(n).
//! - **Knowledge.** A node knows its own cache exactly; peers' caches only from their
//!   directories (Bloom filters rebuilt every `directory_period_ns`, then pulled by every
//!   peer with one-sided READs or pushed by the owner with WRITEs into per-peer slots when
//!   changed, [`DirectoryUpdate`]; that traffic costs CPU as background work). Loads
//!   (requests in flight per node) are sampled every `load_period_ns`: a front-end (LARD,
//!   bounded hashing) knows the sample plus what it sent since; a PRESS node knows its
//!   own load exactly and its peers' as last sampled (what they published), never what
//!   other nodes were sent since (counting those as load made busy peers look overloaded
//!   and replicated every popular object).
//! - **Arrival** ([`Arrival`]): one shared stream with a uniform initial node per
//!   request, each client its own stream to one node (round-robin DNS), or the lab's
//!   load generators: each node's clients replaying user sessions from a seeded row.
//! - **Hints are checked.** When a visit takes a body from a cache (at the start of its
//!   service, after queueing), the holder must hold the object *then*. If not, a Local
//!   falls back to disk, a Peer costs a wasted index READ and falls back to the answering
//!   node's disk, a Forward costs the peer's answer "absent" and falls back to the
//!   answering node's disk (as `farside backend --coop` does; the answering node then
//!   holds a copy).
//!
//! Invariants (checked; a violation fails [`SimReport::check`]):
//! 1. every request is answered exactly once;
//! 2. no body is taken from a node that does not hold the object at that time;
//! 3. every measured request is classified exactly once (local + remote + miss).
//!
//! Measurement: requests before `warmup_fraction` of the trace warm the caches. The
//! window runs from the issue of the first measured request to the issue of the last
//! request; throughput, utilisations, the mean number in the system and the response
//! time are taken over it (requests in flight at its end are reported). Fractions count
//! every measured request (the run drains).

use crate::cache::{NodeCache, Replacement};
use crate::directory::{BloomFilter, BLOOM_FP_DEFAULT};
use crate::policy::{ClusterView, Decision, NodeId, Policy, Request, Source, NODES_MAX};
use crate::trace::Trace;
use farside_arena::layout::{CHUNK_BYTES, SLOT_HEAD_BYTES, SLOT_TAIL_BYTES};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet, VecDeque};

/// Resources of a node, in report order.
pub const RESOURCES: [&str; 3] = ["cpu", "disk", "nic"];
const CPU: usize = 0;
const DISK: usize = 1;
const NIC: usize = 2;

/// Clients in the closed population at most: the simulator keeps one job per client.
pub const CLIENTS_MAX: usize = 1 << 16;

/// Service-time parameters, nanoseconds. Defaults are assumptions of the order of a
/// current server node (stated here, not measured): to be replaced by the project's
/// micro-benchmarks before any number is called a prediction.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Costs {
    /// CPU per request at the answering node (parse, headers, syscalls): 40 us, the order
    /// of a web server doing 25,000 small static replies per second per core.
    pub cpu_request_ns: u64,
    /// CPU per KB of body at the answering node (copies, checksums): 1 us.
    pub cpu_per_kb_ns: u64,
    /// Disk time per read (seek or block-volume latency): 500 us.
    pub disk_access_ns: u64,
    /// Disk time per KB: 4 us (250 MB/s).
    pub disk_per_kb_ns: u64,
    /// NIC transmit time per KB: 0.8 us (10 Gb/s).
    pub nic_per_kb_ns: u64,
    /// CPU of the reading node per one-sided READ (send request, take reply): 5 us.
    pub cpu_read_chunk_ns: u64,
    /// CPU (softirq) of the peer per READ it answers in XDP: 2 us.
    pub cpu_xdp_chunk_ns: u64,
    /// CPU of the initial node per two-sided forward (the fetch sent, the reply taken)
    /// on top of serving the body: 20 us.
    pub cpu_forward_ns: u64,
    /// CPU of the initial node per KB of a forwarded body (reply read, authenticated,
    /// checked): 0 by default (the per-KB copy is in `cpu_per_kb_ns`).
    pub cpu_forward_per_kb_ns: u64,
    /// CPU of the service node per forwarded request it answers from its cache: 60 us
    /// (a request handled plus the forward's own cost).
    pub cpu_peer_serve_ns: u64,
    /// CPU of the service node per KB of a forwarded body: 1 us.
    pub cpu_peer_serve_per_kb_ns: u64,
    /// CPU of a node per miss on top of serving the body (file opened and read, body
    /// checksummed and cached): 0 by default.
    pub cpu_miss_ns: u64,
    /// CPU of a node per KB read from disk: 0 by default.
    pub cpu_miss_per_kb_ns: u64,
    /// CPU of the owner per directory publication (filter built and encoded), with
    /// [`DirectoryUpdate::Datagram`]: 20 us.
    pub cpu_directory_build_ns: u64,
    /// CPU of the owner per peer it sends a publication to (sealed, sent): 10 us.
    pub cpu_directory_send_ns: u64,
    /// CPU of a peer per publication it receives (authenticated, decoded, applied): 10 us.
    pub cpu_directory_apply_ns: u64,
}

impl Costs {
    /// The costs on a CPU with `share` of one core (a cgroup quota): every CPU cost
    /// divided by `share` (disk and NIC unchanged).
    pub fn at_cpu_share(&self, share: f64) -> Costs {
        assert!(share > 0.0, "a CPU share above 0");
        let s = |ns: u64| (ns as f64 / share).round() as u64;
        Costs {
            cpu_request_ns: s(self.cpu_request_ns),
            cpu_per_kb_ns: s(self.cpu_per_kb_ns),
            disk_access_ns: self.disk_access_ns,
            disk_per_kb_ns: self.disk_per_kb_ns,
            nic_per_kb_ns: self.nic_per_kb_ns,
            cpu_read_chunk_ns: s(self.cpu_read_chunk_ns),
            cpu_xdp_chunk_ns: s(self.cpu_xdp_chunk_ns),
            cpu_forward_ns: s(self.cpu_forward_ns),
            cpu_forward_per_kb_ns: s(self.cpu_forward_per_kb_ns),
            cpu_peer_serve_ns: s(self.cpu_peer_serve_ns),
            cpu_peer_serve_per_kb_ns: s(self.cpu_peer_serve_per_kb_ns),
            cpu_miss_ns: s(self.cpu_miss_ns),
            cpu_miss_per_kb_ns: s(self.cpu_miss_per_kb_ns),
            cpu_directory_build_ns: s(self.cpu_directory_build_ns),
            cpu_directory_send_ns: s(self.cpu_directory_send_ns),
            cpu_directory_apply_ns: s(self.cpu_directory_apply_ns),
        }
    }

    /// CPU speed `factor` times faster (disk and NIC unchanged).
    pub fn faster_cpu(&self, factor: f64) -> Costs {
        self.at_cpu_share(factor)
    }
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            cpu_request_ns: 40_000,
            cpu_per_kb_ns: 1_000,
            disk_access_ns: 500_000,
            disk_per_kb_ns: 4_000,
            nic_per_kb_ns: 800,
            cpu_read_chunk_ns: 5_000,
            cpu_xdp_chunk_ns: 2_000,
            cpu_forward_ns: 20_000,
            cpu_forward_per_kb_ns: 0,
            cpu_peer_serve_ns: 60_000,
            cpu_peer_serve_per_kb_ns: 1_000,
            cpu_miss_ns: 0,
            cpu_miss_per_kb_ns: 0,
            cpu_directory_build_ns: 20_000,
            cpu_directory_send_ns: 10_000,
            cpu_directory_apply_ns: 10_000,
        }
    }
}

/// One-sided READs to fetch an object of `bytes`: the index's probe window, then the
/// slot's chunks (at most one more than the data needs, for the tail word).
pub fn reads_for(bytes: u64) -> u64 {
    1 + (SLOT_HEAD_BYTES as u64 + bytes + SLOT_TAIL_BYTES as u64).div_ceil(CHUNK_BYTES as u64)
}

/// How directories travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectoryUpdate {
    /// Every node READs every peer's published filter each period (the reader pays a
    /// READ per chunk, the owner's XDP answers it).
    Pull,
    /// An owner whose filter changed WRITEs it into a slot in every peer's region (the
    /// owner pays per chunk sent, each peer's XDP applies it).
    Push,
    /// An owner whose filter changed sends it in one sealed datagram to every peer
    /// (`farside backend --coop`): the owner pays the build once and the send per peer,
    /// each peer pays the apply.
    Datagram,
}

/// A simulation's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub nodes: usize,
    pub cache_bytes_per_node: u64,
    /// Closed population per node. Default 48: between LARD's T_low and T_high, so the
    /// thresholds bind as in the paper.
    pub clients_per_node: usize,
    /// Client think time. Default 0 (saturation).
    pub think_ns: u64,
    pub costs: Costs,
    pub seed: u64,
    /// Fraction of the trace that only warms the caches. Default 0.2.
    pub warmup_fraction: f64,
    /// Period of directory publication and reading. Default 10 ms.
    pub directory_period_ns: u64,
    /// Period of the monitor's load reads. Default 1 ms.
    pub load_period_ns: u64,
    /// Whether a node caches what it fetched from a peer (replication). Default false:
    /// PRESS keeps one copy unless a holder is overloaded.
    pub cache_remote_fetches: bool,
    /// Directory false-positive rate: each publication's filter is sized for the objects
    /// its node holds then, as `farside backend --coop` sizes it. Default 1 %.
    pub bloom_fp: f64,
    /// Each node's cache replacement. Default LRU.
    pub replacement: Replacement,
    /// How requests reach the nodes. Default [`Arrival::Shared`].
    pub arrival: Arrival,
    /// How directories travel. Default pull.
    pub directory_update: DirectoryUpdate,
}

/// How the closed population's requests reach the nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// One shared stream: a client takes the trace's next request, whose initial node is
    /// drawn uniformly per request.
    Shared,
    /// Round-robin DNS as a client sees it: client `c` replays its own stream (requests
    /// `c`, `c + clients`, `c + 2 clients`, ... of the trace, the layout of
    /// [`Trace::interleaved`]) and sends every request to node `c % nodes`, the node its
    /// name resolved to.
    PinnedClients,
    /// `farside lab coop`'s closed loop: one `farside loadgen` instance per node, whose
    /// clients (client `c` is node `c % nodes`'s) replay *sessions*: all the requests
    /// of one trace client ([`Trace::sessions`]), in log order; a client whose session
    /// ends takes its instance's next session, in order of first appearance from the
    /// instance's start row. So one user's page and its images reach one node, one
    /// after the other.
    Sessions(SessionReplay),
}

/// The settings of [`Arrival::Sessions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionReplay {
    /// Requests each client issues (its first `warmup_fraction` warm the caches).
    pub per_client: usize,
    /// Row of the trace each node's instance starts from (its first session is that
    /// row's client's); one per node.
    pub start_rows: Vec<usize>,
}

impl SimConfig {
    pub fn new(nodes: usize, cache_bytes_per_node: u64) -> SimConfig {
        SimConfig {
            nodes,
            cache_bytes_per_node,
            clients_per_node: 48,
            think_ns: 0,
            costs: Costs::default(),
            seed: 1,
            warmup_fraction: 0.2,
            directory_period_ns: 10_000_000,
            load_period_ns: 1_000_000,
            cache_remote_fetches: false,
            bloom_fp: BLOOM_FP_DEFAULT,
            replacement: Replacement::Lru,
            arrival: Arrival::Shared,
            directory_update: DirectoryUpdate::Pull,
        }
    }
}

/// Requests and bytes of one kind of answer.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClassStats {
    pub requests: u64,
    pub bytes: u64,
    /// Sum of each request's body in whole KB (rounded up), as the costs are charged.
    pub kb: u64,
    /// One-sided READs issued (remote class only).
    pub reads: u64,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SimReport {
    pub policy: &'static str,
    pub nodes: usize,
    pub clients: usize,
    pub think_ns: u64,
    /// Requests measured (after warm-up), all answered.
    pub measured: u64,
    pub local: ClassStats,
    /// Bodies read one-sidedly from a peer's cache.
    pub remote: ClassStats,
    /// Bodies a peer's server returned for a forwarded request.
    pub forwarded: ClassStats,
    pub miss: ClassStats,
    /// One-sided fetches that followed a stale or false hint and found nothing.
    pub wasted_fetches: u64,
    /// Forwarded requests whose peer no longer held the object (the answering node read
    /// its disk).
    pub wasted_forwards: u64,
    /// Local decisions whose object was evicted before it was served.
    pub lost_local_hits: u64,
    pub window_ns: u64,
    pub completed_in_window: u64,
    pub in_flight_at_end: u64,
    /// Mean response time of requests completed in the window.
    pub mean_response_ns: f64,
    /// Time-averaged requests in the system (at nodes, not thinking) over the window.
    pub mean_in_system: f64,
    /// Busy fraction over the window, per node and resource.
    pub utilisation: Vec<[f64; 3]>,
    /// Service per request completed in the window, per node and resource, in ns
    /// (the service demand D of the utilisation law).
    pub demand_ns: Vec<[f64; 3]>,
    /// CPU fraction each node spent on directory traffic over the window (background
    /// work, not part of any request's demand).
    pub directory_cpu: Vec<f64>,
    pub violations: Vec<String>,
}

impl SimReport {
    pub fn throughput_rps(&self) -> f64 {
        self.completed_in_window as f64 / (self.window_ns as f64 / 1e9)
    }

    /// Fractions of measured requests answered from the answering node's cache, from a
    /// peer's cache (read one-sidedly or forwarded), and from disk.
    pub fn fractions(&self) -> [f64; 3] {
        let m = self.measured.max(1) as f64;
        [
            self.local.requests as f64 / m,
            (self.remote.requests + self.forwarded.requests) as f64 / m,
            self.miss.requests as f64 / m,
        ]
    }

    /// Several runs as one sample: counts summed, rates and means over their summed
    /// windows (or completions), violations kept. `reports` must not be empty.
    pub fn merge(reports: &[SimReport]) -> SimReport {
        let first = reports.first().expect("a report to merge");
        let add = |a: ClassStats, b: ClassStats| ClassStats {
            requests: a.requests + b.requests,
            bytes: a.bytes + b.bytes,
            kb: a.kb + b.kb,
            reads: a.reads + b.reads,
        };
        let sum = |f: &dyn Fn(&SimReport) -> u64| reports.iter().map(f).sum::<u64>();
        let window_ns = sum(&|r| r.window_ns).max(1);
        let completed = sum(&|r| r.completed_in_window);
        let by_window = |f: &dyn Fn(&SimReport) -> f64| {
            reports
                .iter()
                .map(|r| f(r) * r.window_ns as f64)
                .sum::<f64>()
                / window_ns as f64
        };
        let by_completed = |f: &dyn Fn(&SimReport) -> f64| {
            reports
                .iter()
                .map(|r| f(r) * r.completed_in_window as f64)
                .sum::<f64>()
                / completed.max(1) as f64
        };
        let nodes = first.nodes;
        SimReport {
            policy: first.policy,
            nodes,
            clients: first.clients,
            think_ns: first.think_ns,
            measured: sum(&|r| r.measured),
            local: reports
                .iter()
                .fold(ClassStats::default(), |a, r| add(a, r.local)),
            remote: reports
                .iter()
                .fold(ClassStats::default(), |a, r| add(a, r.remote)),
            forwarded: reports
                .iter()
                .fold(ClassStats::default(), |a, r| add(a, r.forwarded)),
            miss: reports
                .iter()
                .fold(ClassStats::default(), |a, r| add(a, r.miss)),
            wasted_fetches: sum(&|r| r.wasted_fetches),
            wasted_forwards: sum(&|r| r.wasted_forwards),
            lost_local_hits: sum(&|r| r.lost_local_hits),
            window_ns,
            completed_in_window: completed,
            in_flight_at_end: sum(&|r| r.in_flight_at_end),
            mean_response_ns: by_completed(&|r| r.mean_response_ns),
            mean_in_system: by_window(&|r| r.mean_in_system),
            utilisation: (0..nodes)
                .map(|n| std::array::from_fn(|k| by_window(&|r| r.utilisation[n][k])))
                .collect(),
            demand_ns: (0..nodes)
                .map(|n| std::array::from_fn(|k| by_completed(&|r| r.demand_ns[n][k])))
                .collect(),
            directory_cpu: (0..nodes)
                .map(|n| by_window(&|r| r.directory_cpu[n]))
                .collect(),
            violations: reports
                .iter()
                .flat_map(|r| r.violations.iter().cloned())
                .take(32)
                .collect(),
        }
    }

    /// The invariants; `Err` names the first violations.
    pub fn check(&self) -> Result<(), String> {
        let classified = self.local.requests
            + self.remote.requests
            + self.forwarded.requests
            + self.miss.requests;
        if classified != self.measured {
            return Err(format!(
                "classified {classified} of {} measured",
                self.measured
            ));
        }
        match self.violations.first() {
            None => Ok(()),
            Some(v) => Err(format!("{} violations, first: {v}", self.violations.len())),
        }
    }
}

/// SplitMix64.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Check {
    None,
    /// Take the body from `node`'s cache, as the source says.
    Body(NodeId),
}

#[derive(Debug, Clone, Copy)]
struct Visit {
    node: NodeId,
    res: usize,
    service_ns: u64,
    check: Check,
    /// Cache the object at this node when the visit ends (a disk read).
    insert_at: Option<NodeId>,
}

#[derive(Debug, Clone)]
struct Job {
    req: usize,
    object: u64,
    bytes: u64,
    decision: Decision,
    /// Where the body really came from (a failed check changes it).
    source: Source,
    plan: Vec<Visit>,
    step: usize,
    issued_ns: u64,
    service_ns: [u64; 3 * NODES_MAX],
}

#[derive(Debug, Default)]
struct Station {
    busy: Option<usize>,
    busy_since_ns: u64,
    busy_in_window_ns: u64,
    queue: VecDeque<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Done(usize),
    Issue(usize),
    SampleLoad,
    Publish,
}

struct View<'a> {
    caches: &'a [NodeCache],
    filters: &'a [BloomFilter],
    load_sampled: &'a [u64],
    load_sent: &'a [u64],
    in_flight: &'a [u64],
    /// PRESS: the initial node deciding. It knows its own load exactly (its requests in
    /// flight, this one included) and its peers' only as they published it; no node
    /// knows what the others were sent since. `None`: a front-end deciding, which knows
    /// the monitor's sample plus what it sent since.
    deciding: Option<NodeId>,
}

impl ClusterView for View<'_> {
    fn nodes(&self) -> usize {
        self.caches.len()
    }
    fn cached(&self, node: NodeId, object: u64) -> bool {
        self.caches[node].contains(object)
    }
    fn hint(&self, _node: NodeId, peer: NodeId, object: u64) -> bool {
        self.filters[peer].may_contain(object)
    }
    fn load(&self, node: NodeId) -> u64 {
        match self.deciding {
            Some(me) if me == node => self.in_flight[node] + 1,
            Some(_) => self.load_sampled[node],
            None => self.load_sampled[node] + self.load_sent[node],
        }
    }
}

struct Sim<'t> {
    cfg: SimConfig,
    trace: &'t Trace,
    policy: Policy,
    rng: Rng,
    caches: Vec<NodeCache>,
    filters: Vec<BloomFilter>,
    load_sampled: Vec<u64>,
    load_sent: Vec<u64>,
    in_flight: Vec<u64>,
    stations: Vec<Station>,
    jobs: Vec<Option<Job>>,
    clients: usize,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    event_seq: u64,
    next_req: usize,
    /// With [`Arrival::PinnedClients`] and [`Arrival::Sessions`]: requests each client
    /// has issued.
    issued_by: Vec<usize>,
    /// Request slots of the run (the trace's length, or clients x per-client requests).
    slots: usize,
    /// With [`Arrival::Sessions`]: the trace's sessions, each client's (session,
    /// position), and each node's instance's first session and sessions taken.
    sessions: Vec<Vec<u32>>,
    session_at: Vec<Option<(usize, usize)>>,
    session_first: Vec<usize>,
    sessions_taken: Vec<usize>,
    warmup: usize,
    answered: Vec<u8>,
    window_start_ns: Option<u64>,
    window_end_ns: Option<u64>,
    in_system: u64,
    in_system_since_ns: u64,
    in_system_area: f64,
    report: SimReport,
    response_sum_ns: f64,
    evicted: Vec<u64>,
    /// What each node holds, from the log of inserts and evictions.
    held: Vec<HashSet<u64>>,
}

/// Runs `policy` over `trace` with `cfg` and reports.
pub fn run(cfg: &SimConfig, trace: &Trace, policy: Policy) -> SimReport {
    assert!(
        (1..=NODES_MAX).contains(&cfg.nodes),
        "nodes in 1..=NODES_MAX"
    );
    let clients = cfg.clients_per_node * cfg.nodes;
    assert!(
        (1..=CLIENTS_MAX).contains(&clients),
        "clients in 1..=CLIENTS_MAX"
    );
    let expected_objects =
        (cfg.cache_bytes_per_node as f64 / trace.mean_request_bytes().max(1.0)) as usize;
    let filter = BloomFilter::for_objects(expected_objects, cfg.bloom_fp);
    let (slots, sessions, session_first) = match &cfg.arrival {
        Arrival::Sessions(r) => {
            assert_eq!(r.start_rows.len(), cfg.nodes, "one start row per node");
            let sessions = trace.sessions();
            let first = r
                .start_rows
                .iter()
                .map(|&row| match trace.clients.get(row) {
                    Some(&c) if trace.clients.len() == trace.requests.len() => c as usize,
                    _ => row,
                })
                .map(|s| s % sessions.len().max(1))
                .collect();
            (clients * r.per_client, sessions, first)
        }
        Arrival::Shared | Arrival::PinnedClients => {
            (trace.requests.len(), Vec::new(), vec![0; cfg.nodes])
        }
    };
    let warmup = (slots as f64 * cfg.warmup_fraction) as usize;
    let mut sim = Sim {
        trace,
        rng: Rng(cfg.seed),
        caches: (0..cfg.nodes)
            .map(|_| NodeCache::new(cfg.replacement, cfg.cache_bytes_per_node))
            .collect(),
        filters: vec![filter; cfg.nodes],
        load_sampled: vec![0; cfg.nodes],
        load_sent: vec![0; cfg.nodes],
        in_flight: vec![0; cfg.nodes],
        stations: (0..3 * cfg.nodes).map(|_| Station::default()).collect(),
        // One job per client, then one background job per node (directory traffic).
        jobs: vec![None; clients + cfg.nodes],
        clients,
        events: BinaryHeap::new(),
        event_seq: 0,
        next_req: 0,
        issued_by: vec![0; clients],
        slots,
        sessions,
        session_at: vec![None; clients],
        session_first,
        sessions_taken: vec![0; cfg.nodes],
        warmup,
        answered: vec![0; slots],
        window_start_ns: None,
        window_end_ns: None,
        in_system: 0,
        in_system_since_ns: 0,
        in_system_area: 0.0,
        report: SimReport {
            policy: policy.name(),
            nodes: cfg.nodes,
            clients,
            think_ns: cfg.think_ns,
            measured: 0,
            local: ClassStats::default(),
            remote: ClassStats::default(),
            forwarded: ClassStats::default(),
            miss: ClassStats::default(),
            wasted_fetches: 0,
            wasted_forwards: 0,
            lost_local_hits: 0,
            window_ns: 0,
            completed_in_window: 0,
            in_flight_at_end: 0,
            mean_response_ns: 0.0,
            mean_in_system: 0.0,
            utilisation: vec![[0.0; 3]; cfg.nodes],
            demand_ns: vec![[0.0; 3]; cfg.nodes],
            directory_cpu: vec![0.0; cfg.nodes],
            violations: Vec::new(),
        },
        response_sum_ns: 0.0,
        evicted: Vec::new(),
        held: vec![HashSet::new(); cfg.nodes],
        policy,
        cfg: cfg.clone(),
    };
    sim.run();
    sim.report
}

impl Sim<'_> {
    fn schedule(&mut self, at_ns: u64, ev: Event) {
        self.event_seq += 1;
        self.events.push(Reverse((at_ns, self.event_seq, ev)));
    }

    fn violation(&mut self, what: String) {
        // Bounded: enough to debug, never unbounded memory.
        if self.report.violations.len() < 32 {
            self.report.violations.push(what);
        }
    }

    fn run(&mut self) {
        for c in 0..self.clients {
            self.schedule(0, Event::Issue(c));
        }
        self.schedule(0, Event::SampleLoad);
        self.schedule(0, Event::Publish);
        let mut active = self.clients;
        while let Some(Reverse((now, _, ev))) = self.events.pop() {
            match ev {
                Event::Issue(c) => {
                    if !self.issue(c, now) {
                        active -= 1;
                    }
                }
                Event::Done(s) => self.done(s, now),
                Event::SampleLoad => {
                    self.load_sampled.copy_from_slice(&self.in_flight);
                    self.load_sent.iter_mut().for_each(|l| *l = 0);
                    if active > 0 {
                        self.schedule(now + self.cfg.load_period_ns, Event::SampleLoad);
                    }
                }
                Event::Publish => {
                    self.publish(now);
                    if active > 0 {
                        self.schedule(now + self.cfg.directory_period_ns, Event::Publish);
                    }
                }
            }
        }
        self.finish();
    }

    /// Rebuilds every directory and charges its transfer to the nodes' CPUs.
    fn publish(&mut self, now: u64) {
        let nodes = self.cfg.nodes as u64;
        let c = &self.cfg.costs;
        let mut cost_ns = vec![0u64; self.cfg.nodes];
        for n in 0..self.cfg.nodes {
            // Sized as the back-end sizes it: for the objects the node holds now (so a
            // full cache of small objects is no sparser a filter than one of large ones).
            let ids = self.caches[n].ids();
            let mut fresh = BloomFilter::for_objects(ids.len(), self.cfg.bloom_fp);
            for id in ids {
                fresh.insert(id);
            }
            let old = std::mem::replace(&mut self.filters[n], fresh);
            let f = &self.filters[n];
            let chunks = f.published_bytes().div_ceil(CHUNK_BYTES) as u64;
            match self.cfg.directory_update {
                DirectoryUpdate::Pull => {
                    // n reads every peer's filter, and answers every peer's read of its own.
                    cost_ns[n] += (nodes - 1) * chunks * (c.cpu_read_chunk_ns + c.cpu_xdp_chunk_ns);
                }
                DirectoryUpdate::Push if *f != old => {
                    cost_ns[n] += (nodes - 1) * chunks * c.cpu_read_chunk_ns;
                    for (p, cost) in cost_ns.iter_mut().enumerate() {
                        if p != n {
                            *cost += chunks * c.cpu_xdp_chunk_ns;
                        }
                    }
                }
                DirectoryUpdate::Datagram if *f != old => {
                    cost_ns[n] += c.cpu_directory_build_ns + (nodes - 1) * c.cpu_directory_send_ns;
                    for (p, cost) in cost_ns.iter_mut().enumerate() {
                        if p != n {
                            *cost += c.cpu_directory_apply_ns;
                        }
                    }
                }
                DirectoryUpdate::Push | DirectoryUpdate::Datagram => {}
            }
        }
        for (n, &cost) in cost_ns.iter().enumerate() {
            let b = self.clients + n;
            // A node still busy with the previous period's traffic skips this one's.
            if cost == 0 || self.jobs[b].is_some() {
                continue;
            }
            let visit = Visit {
                node: n,
                res: CPU,
                service_ns: cost,
                check: Check::None,
                insert_at: None,
            };
            self.jobs[b] = Some(Job {
                req: usize::MAX,
                object: 0,
                bytes: 0,
                decision: Decision {
                    node: n,
                    source: Source::Local,
                },
                source: Source::Local,
                plan: vec![visit],
                step: 0,
                issued_ns: now,
                service_ns: [0; 3 * NODES_MAX],
            });
            self.enqueue(b, now);
        }
    }

    fn account_in_system(&mut self, now: u64) {
        if let Some(start) = self.window_start_ns {
            let end = self.window_end_ns.unwrap_or(u64::MAX).min(now);
            let from = self.in_system_since_ns.max(start);
            if end > from {
                self.in_system_area += self.in_system as f64 * (end - from) as f64;
            }
        }
        self.in_system_since_ns = now;
    }

    /// The trace row of client `c`'s next request in its session, taking its node's
    /// instance's next session when the last one ended ([`Arrival::Sessions`]).
    fn session_row(&mut self, c: usize) -> usize {
        loop {
            if let Some((s, pos)) = self.session_at[c] {
                if let Some(&row) = self.sessions[s].get(pos) {
                    self.session_at[c] = Some((s, pos + 1));
                    return row as usize;
                }
            }
            let node = c % self.cfg.nodes;
            let k = self.sessions_taken[node];
            self.sessions_taken[node] += 1;
            let s = (self.session_first[node] + k) % self.sessions.len();
            self.session_at[c] = Some((s, 0));
        }
    }

    /// Client `c` issues the trace's next request; false if the trace is exhausted.
    fn issue(&mut self, c: usize, now: u64) -> bool {
        let len = self.slots;
        let next = match self.cfg.arrival {
            Arrival::Shared => self.next_req,
            Arrival::PinnedClients | Arrival::Sessions(_) => self.issued_by[c] * self.clients + c,
        };
        if next >= len
            || (self.sessions.is_empty() && matches!(self.cfg.arrival, Arrival::Sessions(_)))
        {
            if self.window_end_ns.is_none() {
                self.account_in_system(now);
                self.window_end_ns = Some(now);
            }
            return false;
        }
        let req = next;
        self.next_req += 1;
        self.issued_by[c] += 1;
        if req >= self.warmup && self.window_start_ns.is_none() {
            self.account_in_system(now);
            self.window_start_ns = Some(now);
        }
        let row = match self.cfg.arrival {
            Arrival::Sessions(_) => self.session_row(c),
            Arrival::Shared | Arrival::PinnedClients => req,
        };
        let object = self.trace.requests[row];
        let bytes = self.trace.object_bytes[object as usize] as u64;
        let initial = match self.cfg.arrival {
            Arrival::Shared => self.rng.below(self.cfg.nodes as u64) as usize,
            Arrival::PinnedClients | Arrival::Sessions(_) => c % self.cfg.nodes,
        };
        let request = Request {
            object: object as u64,
            bytes,
            initial,
        };
        let view = View {
            caches: &self.caches,
            filters: &self.filters,
            load_sampled: &self.load_sampled,
            load_sent: &self.load_sent,
            in_flight: &self.in_flight,
            deciding: matches!(self.policy, Policy::Press(_)).then_some(initial),
        };
        let decision = self.policy.decide(&request, &view, now);
        self.load_sent[decision.node] += 1;
        self.in_flight[decision.node] += 1;
        self.account_in_system(now);
        self.in_system += 1;
        let plan = self.plan(decision, bytes);
        self.jobs[c] = Some(Job {
            req,
            object: object as u64,
            bytes,
            decision,
            source: decision.source,
            plan,
            step: 0,
            issued_ns: now,
            service_ns: [0; 3 * NODES_MAX],
        });
        self.enqueue(c, now);
        true
    }

    fn plan(&self, d: Decision, bytes: u64) -> Vec<Visit> {
        let c = &self.cfg.costs;
        let kb = bytes.div_ceil(1024);
        let n = d.node;
        let visit = |node, res, service_ns, check, insert_at| Visit {
            node,
            res,
            service_ns,
            check,
            insert_at,
        };
        let cpu = c.cpu_request_ns + kb * c.cpu_per_kb_ns;
        let nic = kb * c.nic_per_kb_ns;
        let disk = c.disk_access_ns + kb * c.disk_per_kb_ns;
        match d.source {
            Source::Local => vec![
                visit(n, CPU, cpu, Check::Body(n), None),
                visit(n, NIC, nic, Check::None, None),
            ],
            Source::Disk => vec![
                visit(
                    n,
                    CPU,
                    cpu + c.cpu_miss_ns + kb * c.cpu_miss_per_kb_ns,
                    Check::None,
                    None,
                ),
                visit(n, DISK, disk, Check::None, Some(n)),
                visit(n, NIC, nic, Check::None, None),
            ],
            Source::Peer(p) => {
                let reads = reads_for(bytes);
                let keep = self.cfg.cache_remote_fetches.then_some(n);
                vec![
                    visit(n, CPU, cpu + reads * c.cpu_read_chunk_ns, Check::None, None),
                    visit(p, CPU, reads * c.cpu_xdp_chunk_ns, Check::Body(p), None),
                    visit(p, NIC, nic, Check::None, None),
                    visit(n, NIC, nic, Check::None, keep),
                ]
            }
            Source::Forward(p) => vec![
                visit(
                    n,
                    CPU,
                    cpu + c.cpu_forward_ns + kb * c.cpu_forward_per_kb_ns,
                    Check::None,
                    None,
                ),
                visit(
                    p,
                    CPU,
                    c.cpu_peer_serve_ns + kb * c.cpu_peer_serve_per_kb_ns,
                    Check::Body(p),
                    None,
                ),
                visit(p, NIC, nic, Check::None, None),
                visit(n, NIC, nic, Check::None, None),
            ],
        }
    }

    fn enqueue(&mut self, c: usize, now: u64) {
        let job = self.jobs[c].as_ref().expect("live job");
        let v = job.plan[job.step];
        let s = v.node * 3 + v.res;
        if self.stations[s].busy.is_some() {
            self.stations[s].queue.push_back(c);
        } else {
            self.start(s, c, now);
        }
    }

    /// Service of client `c`'s current visit begins at station `s`: the body check runs
    /// here, after queueing, when the cache is really read.
    fn start(&mut self, s: usize, c: usize, now: u64) {
        let mut job = self.jobs[c].take().expect("live job");
        let v = job.plan[job.step];
        if let Check::Body(holder) = v.check {
            if self.caches[holder].touch(job.object) {
                // Invariant 2, checked against the holdings rebuilt from the log of
                // inserts and evictions (independent of the cache's own structure).
                if !self.held[holder].contains(&job.object) {
                    self.violation(format!(
                        "request {} body from node {holder} without object",
                        job.req
                    ));
                }
            } else {
                self.fall_back(&mut job);
            }
        }
        let v = job.plan[job.step];
        job.service_ns[s] += v.service_ns;
        self.jobs[c] = Some(job);
        let st = &mut self.stations[s];
        st.busy = Some(c);
        st.busy_since_ns = now;
        self.schedule(now + v.service_ns, Event::Done(s));
    }

    /// The holder no longer has the object: replan from disk.
    fn fall_back(&mut self, job: &mut Job) {
        let c = &self.cfg.costs;
        let kb = job.bytes.div_ceil(1024);
        let n = job.decision.node;
        let disk = c.disk_access_ns + kb * c.disk_per_kb_ns;
        let nic = kb * c.nic_per_kb_ns;
        let mut rest = match job.source {
            Source::Local => {
                self.report.lost_local_hits += 1;
                vec![
                    Visit {
                        node: n,
                        res: DISK,
                        service_ns: disk,
                        check: Check::None,
                        insert_at: Some(n),
                    },
                    Visit {
                        node: n,
                        res: NIC,
                        service_ns: nic,
                        check: Check::None,
                        insert_at: None,
                    },
                ]
            }
            Source::Peer(_) => {
                // The peer's XDP answered one READ of its index: no such object.
                self.report.wasted_fetches += 1;
                job.plan[job.step].service_ns = c.cpu_xdp_chunk_ns;
                vec![
                    Visit {
                        node: n,
                        res: DISK,
                        service_ns: disk,
                        check: Check::None,
                        insert_at: Some(n),
                    },
                    Visit {
                        node: n,
                        res: NIC,
                        service_ns: nic,
                        check: Check::None,
                        insert_at: None,
                    },
                ]
            }
            Source::Forward(_) => {
                // As `farside backend --coop` does: the peer answers "absent" (its
                // server's per-request CPU, no body), and the answering node reads its
                // own disk and caches the object (a copy of its own).
                self.report.wasted_forwards += 1;
                job.plan[job.step].service_ns = c.cpu_peer_serve_ns;
                vec![
                    Visit {
                        node: n,
                        res: DISK,
                        service_ns: disk,
                        check: Check::None,
                        insert_at: Some(n),
                    },
                    Visit {
                        node: n,
                        res: NIC,
                        service_ns: nic,
                        check: Check::None,
                        insert_at: None,
                    },
                ]
            }
            Source::Disk => unreachable!("disk reads check no cache"),
        };
        job.source = Source::Disk;
        job.plan.truncate(job.step + 1);
        job.plan.append(&mut rest);
    }

    fn done(&mut self, s: usize, now: u64) {
        let c = self.stations[s]
            .busy
            .take()
            .expect("busy station completes");
        let since = self.stations[s].busy_since_ns;
        if let Some(start) = self.window_start_ns {
            let end = self.window_end_ns.unwrap_or(u64::MAX).min(now);
            let from = since.max(start);
            if end > from {
                self.stations[s].busy_in_window_ns += end - from;
            }
        }
        let mut job = self.jobs[c].take().expect("live job");
        let v = job.plan[job.step];
        if let Some(at) = v.insert_at {
            if self.caches[at].insert(job.object, job.bytes, &mut self.evicted) {
                self.held[at].insert(job.object);
            }
            for id in self.evicted.drain(..) {
                self.held[at].remove(&id);
            }
        }
        job.step += 1;
        let finished = job.step == job.plan.len();
        if c >= self.clients {
            // Background work: count its CPU in the window, answer nobody.
            if let Some(start) = self.window_start_ns {
                let end = self.window_end_ns.unwrap_or(u64::MAX).min(now);
                let from = (now - v.service_ns).max(start);
                if end > from {
                    self.report.directory_cpu[v.node] += (end - from) as f64;
                }
            }
        } else if finished {
            self.complete(job, c, now);
        } else {
            self.jobs[c] = Some(job);
            self.enqueue(c, now);
        }
        if let Some(next) = self.stations[s].queue.pop_front() {
            self.start(s, next, now);
        }
    }

    fn complete(&mut self, job: Job, c: usize, now: u64) {
        self.answered[job.req] += 1;
        self.in_flight[job.decision.node] -= 1;
        self.account_in_system(now);
        self.in_system -= 1;
        if job.req >= self.warmup {
            self.report.measured += 1;
            let class = match job.source {
                Source::Local => &mut self.report.local,
                Source::Peer(_) => &mut self.report.remote,
                Source::Forward(_) => &mut self.report.forwarded,
                Source::Disk => &mut self.report.miss,
            };
            class.requests += 1;
            class.bytes += job.bytes;
            class.kb += job.bytes.div_ceil(1024);
            if let Source::Peer(_) = job.source {
                class.reads += reads_for(job.bytes);
            }
            let in_window = self.window_end_ns.is_none_or(|end| now <= end);
            if in_window {
                self.report.completed_in_window += 1;
                self.response_sum_ns += (now - job.issued_ns) as f64;
                for (s, &ns) in job.service_ns.iter().enumerate().take(3 * self.cfg.nodes) {
                    self.report.demand_ns[s / 3][s % 3] += ns as f64;
                }
            }
        }
        self.schedule(now + self.cfg.think_ns, Event::Issue(c));
    }

    fn finish(&mut self) {
        let r = &mut self.report;
        let start = self.window_start_ns.unwrap_or(0);
        let end = self.window_end_ns.unwrap_or(start);
        r.window_ns = end.saturating_sub(start).max(1);
        // Requests issued by the window's end but answered after it.
        r.in_flight_at_end = r.measured - r.completed_in_window;
        r.mean_response_ns = self.response_sum_ns / r.completed_in_window.max(1) as f64;
        r.mean_in_system = self.in_system_area / r.window_ns as f64;
        for n in 0..self.cfg.nodes {
            for k in 0..3 {
                if k == CPU {
                    r.directory_cpu[n] /= r.window_ns as f64;
                }
                r.utilisation[n][k] =
                    self.stations[n * 3 + k].busy_in_window_ns as f64 / r.window_ns as f64;
                r.demand_ns[n][k] /= r.completed_in_window.max(1) as f64;
            }
        }
        let mut bad = Vec::new();
        for (n, cache) in self.caches.iter().enumerate() {
            let ids: HashSet<u64> = cache.ids().into_iter().collect();
            if ids != self.held[n] || cache.used_bytes() > cache.capacity_bytes() {
                bad.push(format!(
                    "node {n}: cache disagrees with its log or overflows"
                ));
            }
        }
        for (i, &a) in self.answered.iter().enumerate() {
            if a != 1 {
                bad.push(format!("request {i} answered {a} times"));
            }
        }
        for b in bad.into_iter().take(32) {
            self.violation(b);
        }
    }
}

#[cfg(test)]
mod tests;
