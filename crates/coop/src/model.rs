//! The analytical model: exact mean-value analysis (MVA) of a closed queueing network,
//! fed by per-resource service demands computed from costs and the hit / remote / miss
//! fractions of a trace-driven simulation.
//!
//! Use it in this order: compute demands ([`cluster_demands_ns`]) from the costs and a
//! simulation's fractions; predict the throughput at the simulated population
//! ([`predict`]); check it against the simulated (later: measured) throughput within
//! [`MODEL_TOLERANCE`], fixed before looking; only then extrapolate ([`extrapolate`]:
//! more nodes, larger working sets, faster CPUs). Anything it returns beyond the checked
//! points is model output, and is to be labelled so.
//!
//! Two forms of the network: [`cluster_stations`] spreads the demand evenly over the
//! nodes (needed to extrapolate to other node counts); [`node_stations`] takes each
//! node's demands as the simulation found them. A policy that loads nodes unevenly (LARD
//! on few nodes) fits the second and not the first; extrapolating it with the balanced
//! form would overstate its throughput.
//!
//! MVA (Reiser and Lavenberg) for `N` customers, queueing stations with demands `D_k`
//! and think time `Z`, from `Q_k(0) = 0`:
//! `R_k(n) = D_k (1 + Q_k(n-1))`, `X(n) = n / (Z + sum R_k(n))`, `Q_k(n) = X(n) R_k(n)`.
//! Delay stations (no queueing) have `R_k = D_k`.

use crate::sim::{Costs, SimReport};
use serde::{Deserialize, Serialize};

/// Population MVA solves at most: the recursion costs population x stations steps, and
/// a cluster of 64 nodes with 64 clients each is 4,096.
pub const MVA_POPULATION_MAX: u32 = 1_000_000;

/// Relative error between the model's and the simulator's throughput accepted before
/// extrapolating: 15 %. Rule, fixed in advance: MVA assumes exponential service and
/// perfectly balanced nodes, the simulator has fixed service times and the policies'
/// real imbalance; the seed's model was validated within about 10 % of measurement, and
/// the simulator adds its own imbalance.
pub const MODEL_TOLERANCE: f64 = 0.15;

/// Whether a station queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StationKind {
    Queueing,
    Delay,
}

/// One station of the network.
#[derive(Debug, Clone, PartialEq)]
pub struct Station {
    pub name: String,
    /// Service demand per request (visits x service time), seconds.
    pub demand_s: f64,
    pub kind: StationKind,
}

impl Station {
    pub fn queueing(name: impl Into<String>, demand_s: f64) -> Station {
        Station {
            name: name.into(),
            demand_s,
            kind: StationKind::Queueing,
        }
    }
}

/// MVA's answer for one population.
#[derive(Debug, Clone, PartialEq)]
pub struct MvaResult {
    pub population: u32,
    pub throughput_per_s: f64,
    /// Response time (excluding think time), seconds.
    pub response_s: f64,
    pub residence_s: Vec<f64>,
    pub queue_len: Vec<f64>,
    pub utilisation: Vec<f64>,
}

/// Exact MVA for `population` customers with think time `think_s`.
pub fn mva(stations: &[Station], think_s: f64, population: u32) -> MvaResult {
    assert!(
        population <= MVA_POPULATION_MAX,
        "population above MVA_POPULATION_MAX"
    );
    let k = stations.len();
    let mut q = vec![0.0; k];
    let mut r = vec![0.0; k];
    let mut x = 0.0;
    for n in 1..=population {
        for i in 0..k {
            r[i] = match stations[i].kind {
                StationKind::Queueing => stations[i].demand_s * (1.0 + q[i]),
                StationKind::Delay => stations[i].demand_s,
            };
        }
        let total: f64 = r.iter().sum();
        x = n as f64 / (think_s + total);
        for i in 0..k {
            q[i] = x * r[i];
        }
    }
    MvaResult {
        population,
        throughput_per_s: x,
        response_s: r.iter().sum(),
        utilisation: stations.iter().map(|s| x * s.demand_s).collect(),
        residence_s: r,
        queue_len: q,
    }
}

/// Service demand per request, in nanoseconds, split by where it falls: at the node that
/// answers the client (`own`: cpu, disk, nic) and at the peers that give it a body
/// (`peer`: cpu, disk, nic, summed over the peers): the costs weighted by the
/// simulation's classes of answers. It mirrors the simulator's visits (`sim` module
/// doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demands {
    pub own: [f64; 3],
    pub peer: [f64; 3],
}

impl Demands {
    /// Summed over the cluster (cpu, disk, nic).
    pub fn cluster(&self) -> [f64; 3] {
        [0, 1, 2].map(|k| self.own[k] + self.peer[k])
    }
}

/// A peer transport's CPU per body fetched from a peer's cache, at the node that took
/// the request (`initial`) and at the node that holds the body (`service`): ns per
/// fetch plus ns per KB. `service` is 0 where no process of the holder runs (one-sided
/// XDP READs, whose softirq runs on the reader's CPU on veth, and shared memory).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerFetch {
    pub initial_ns: f64,
    pub initial_per_kb_ns: f64,
    pub service_ns: f64,
    pub service_per_kb_ns: f64,
}

impl PeerFetch {
    /// The costs on a CPU with `share` of one core (every cost divided by it).
    pub fn at_cpu_share(&self, share: f64) -> PeerFetch {
        assert!(share > 0.0, "a CPU share above 0");
        PeerFetch {
            initial_ns: self.initial_ns / share,
            initial_per_kb_ns: self.initial_per_kb_ns / share,
            service_ns: self.service_ns / share,
            service_per_kb_ns: self.service_per_kb_ns / share,
        }
    }
}

/// The per-request demands of a simulated run under `costs` (see [`Demands`]), a body
/// read one-sidedly costing the READs of the `sim` module's model.
pub fn demands_ns(costs: &Costs, report: &SimReport) -> Demands {
    demands_with(costs, report, None)
}

/// The per-request demands of a simulated run whose peer bodies (the simulation's
/// `remote` class: bodies within the transport's size bound) travel over a transport
/// costing `peer`; the larger ones (`forwarded`) over TCP at `costs`' forward costs.
/// A wasted fetch (a stale hint) costs one fetch's fixed part at both ends.
pub fn transport_demands_ns(costs: &Costs, report: &SimReport, peer: &PeerFetch) -> Demands {
    demands_with(costs, report, Some(peer))
}

fn demands_with(costs: &Costs, report: &SimReport, fetch: Option<&PeerFetch>) -> Demands {
    let m = report.measured.max(1) as f64;
    let c = costs;
    let per = |ns: u64| ns as f64;
    let (mut own, mut peer) = ([0.0; 3], [0.0; 3]);
    let all = [report.local, report.remote, report.forwarded, report.miss];
    // Every answer: the request at the answering node, its body copied and sent.
    for class in &all {
        own[0] +=
            class.requests as f64 * per(c.cpu_request_ns) + class.kb as f64 * per(c.cpu_per_kb_ns);
        own[2] += class.kb as f64 * per(c.nic_per_kb_ns);
    }
    // Misses: the disk, and the CPU that reads and caches the file.
    own[1] += report.miss.requests as f64 * per(c.disk_access_ns)
        + report.miss.kb as f64 * per(c.disk_per_kb_ns);
    own[0] += report.miss.requests as f64 * per(c.cpu_miss_ns)
        + report.miss.kb as f64 * per(c.cpu_miss_per_kb_ns);
    // Bodies from a peer cross the peer's NIC too.
    peer[2] += (report.remote.kb + report.forwarded.kb) as f64 * per(c.nic_per_kb_ns);
    match fetch {
        // One-sided: the reader's READs and the peer's XDP answers; a wasted fetch costs
        // the reader's READs and the peer's one index READ.
        None => {
            let reads_mean = report.remote.reads as f64 / report.remote.requests.max(1) as f64;
            own[0] += report.remote.reads as f64 * per(c.cpu_read_chunk_ns);
            peer[0] += report.remote.reads as f64 * per(c.cpu_xdp_chunk_ns);
            own[0] += report.wasted_fetches as f64 * reads_mean * per(c.cpu_read_chunk_ns);
            peer[0] += report.wasted_fetches as f64 * per(c.cpu_xdp_chunk_ns);
        }
        // A measured transport: its fetch at both ends.
        Some(f) => {
            let (n, kb) = (report.remote.requests as f64, report.remote.kb as f64);
            let wasted = report.wasted_fetches as f64;
            own[0] += n * f.initial_ns + kb * f.initial_per_kb_ns + wasted * f.initial_ns;
            peer[0] += n * f.service_ns + kb * f.service_per_kb_ns + wasted * f.service_ns;
        }
    }
    // Forwarded: the fetch at the initial node, the answer at the service node.
    let forwarded = (report.forwarded.requests + report.wasted_forwards) as f64;
    own[0] += forwarded * per(c.cpu_forward_ns)
        + report.forwarded.kb as f64 * per(c.cpu_forward_per_kb_ns);
    peer[0] += forwarded * per(c.cpu_peer_serve_ns)
        + report.forwarded.kb as f64 * per(c.cpu_peer_serve_per_kb_ns);
    Demands {
        own: own.map(|x| x / m),
        peer: peer.map(|x| x / m),
    }
}

/// Service demand per request, summed over the cluster, per resource (cpu, disk, nic), in
/// nanoseconds: the costs weighted by the simulation's classes of answers.
pub fn cluster_demands_ns(costs: &Costs, report: &SimReport) -> [f64; 3] {
    demands_ns(costs, report).cluster()
}

/// The cluster as a network: each node's CPU, disk and NIC a queueing station with an
/// equal share of the cluster's demand (the model's balance assumption).
pub fn cluster_stations(nodes: usize, demands_ns: [f64; 3]) -> Vec<Station> {
    (0..nodes)
        .flat_map(|n| {
            ["cpu", "disk", "nic"]
                .into_iter()
                .zip(demands_ns)
                .map(move |(r, d)| Station::queueing(format!("{r}{n}"), d / 1e9 / nodes as f64))
        })
        .collect()
}

/// The cluster as a network with each node's own demands (ns per request, cpu, disk,
/// nic): the shares a policy really gives each node, as the trace-driven simulation
/// found them, instead of the balance assumption.
pub fn node_stations(per_node_demands_ns: &[[f64; 3]]) -> Vec<Station> {
    per_node_demands_ns
        .iter()
        .enumerate()
        .flat_map(|(n, d)| {
            ["cpu", "disk", "nic"]
                .into_iter()
                .zip(*d)
                .map(move |(r, d)| Station::queueing(format!("{r}{n}"), d / 1e9))
        })
        .collect()
}

/// Throughput (requests/s) the model predicts for `nodes` nodes, `clients` clients with
/// think time `think_s`, and per-request cluster demands `demands_ns`.
pub fn predict(nodes: usize, demands_ns: [f64; 3], clients: u32, think_s: f64) -> MvaResult {
    mva(&cluster_stations(nodes, demands_ns), think_s, clients)
}

/// Population vectors exact multi-class MVA visits at most (times the stations, the
/// numbers it keeps): 2^22 x 8 bytes is 32 MiB. Beyond it [`mva_classes`] uses the
/// Bard-Schweitzer approximation.
pub const MVA_LATTICE_CELLS_MAX: usize = 1 << 22;
/// Iterations of the Bard-Schweitzer fixed point at most; it converges in tens.
const SCHWEITZER_ITERATIONS_MAX: usize = 100_000;
/// Largest change of a queue length at which the fixed point is taken as reached.
const SCHWEITZER_EPSILON: f64 = 1e-10;

/// One class of customers of a multi-class closed network: its population, think time
/// and demand at every station (seconds, in the stations' order).
#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    pub population: u32,
    pub think_s: f64,
    pub demand_s: Vec<f64>,
}

/// Which solution [`mva_classes`] used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Solver {
    Exact,
    Schweitzer,
}

/// Multi-class MVA's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassesResult {
    pub solver: Solver,
    /// Per class.
    pub throughput_per_s: Vec<f64>,
    /// Per class, excluding think time.
    pub response_s: Vec<f64>,
    /// Per station, all classes.
    pub queue_len: Vec<f64>,
    /// Per station, all classes.
    pub utilisation: Vec<f64>,
}

impl ClassesResult {
    pub fn total_throughput(&self) -> f64 {
        self.throughput_per_s.iter().sum()
    }

    /// Mean response time over all requests (throughput-weighted).
    pub fn mean_response_s(&self) -> f64 {
        let x = self.total_throughput();
        if x <= 0.0 {
            return 0.0;
        }
        self.throughput_per_s
            .iter()
            .zip(&self.response_s)
            .map(|(x, r)| x * r)
            .sum::<f64>()
            / x
    }
}

/// MVA of a closed network with several classes (customers of class `c` visit the
/// stations with `classes[c].demand_s`): exact (Reiser and Lavenberg, over every
/// population vector) when the lattice is within [`MVA_LATTICE_CELLS_MAX`], else the
/// Bard-Schweitzer approximation `Q_k(N - e_c) = Q_k(N) - Q_ck(N)/N_c`.
pub fn mva_classes(kinds: &[StationKind], classes: &[Class]) -> ClassesResult {
    for c in classes {
        assert_eq!(c.demand_s.len(), kinds.len(), "a demand per station");
        assert!(
            c.population <= MVA_POPULATION_MAX,
            "population above MVA_POPULATION_MAX"
        );
    }
    let lattice = classes
        .iter()
        .try_fold(1usize, |acc, c| acc.checked_mul(c.population as usize + 1));
    match lattice {
        Some(l) if l.saturating_mul(kinds.len().max(1)) <= MVA_LATTICE_CELLS_MAX => {
            mva_classes_exact(kinds, classes, l)
        }
        _ => mva_classes_schweitzer(kinds, classes),
    }
}

fn residence(kind: StationKind, demand: f64, queue: f64) -> f64 {
    match kind {
        StationKind::Queueing => demand * (1.0 + queue),
        StationKind::Delay => demand,
    }
}

fn classes_result(
    solver: Solver,
    kinds: &[StationKind],
    classes: &[Class],
    x: Vec<f64>,
    r: Vec<Vec<f64>>,
) -> ClassesResult {
    let k = kinds.len();
    let queue_len = (0..k)
        .map(|s| x.iter().zip(&r).map(|(x, r)| x * r[s]).sum())
        .collect();
    let utilisation = (0..k)
        .map(|s| x.iter().zip(classes).map(|(x, c)| x * c.demand_s[s]).sum())
        .collect();
    ClassesResult {
        solver,
        response_s: r.iter().map(|r| r.iter().sum()).collect(),
        throughput_per_s: x,
        queue_len,
        utilisation,
    }
}

fn mva_classes_exact(kinds: &[StationKind], classes: &[Class], lattice: usize) -> ClassesResult {
    let (k, nc) = (kinds.len(), classes.len());
    let mut stride = vec![1usize; nc];
    for c in 1..nc {
        stride[c] = stride[c - 1] * (classes[c - 1].population as usize + 1);
    }
    // Q_k of every population vector, by its mixed-radix index; N - e_c has a smaller
    // index than N, so one pass in index order has every term it needs.
    let mut q = vec![0.0f64; lattice * k];
    let mut x = vec![0.0; nc];
    let mut r = vec![vec![0.0; k]; nc];
    let mut n = vec![0u32; nc];
    for idx in 1..lattice {
        // Increment the mixed-radix counter.
        for c in 0..nc {
            if n[c] < classes[c].population {
                n[c] += 1;
                break;
            }
            n[c] = 0;
        }
        let mut qn = vec![0.0; k];
        for c in 0..nc {
            if n[c] == 0 {
                x[c] = 0.0;
                r[c].iter_mut().for_each(|v| *v = 0.0);
                continue;
            }
            let prev = (idx - stride[c]) * k;
            for s in 0..k {
                r[c][s] = residence(kinds[s], classes[c].demand_s[s], q[prev + s]);
            }
            x[c] = n[c] as f64 / (classes[c].think_s + r[c].iter().sum::<f64>());
            for s in 0..k {
                qn[s] += x[c] * r[c][s];
            }
        }
        q[idx * k..(idx + 1) * k].copy_from_slice(&qn);
    }
    classes_result(Solver::Exact, kinds, classes, x, r)
}

fn mva_classes_schweitzer(kinds: &[StationKind], classes: &[Class]) -> ClassesResult {
    let (k, nc) = (kinds.len(), classes.len());
    let mut qc: Vec<Vec<f64>> = classes
        .iter()
        .map(|c| vec![c.population as f64 / k.max(1) as f64; k])
        .collect();
    let mut x = vec![0.0; nc];
    let mut r = vec![vec![0.0; k]; nc];
    for _ in 0..SCHWEITZER_ITERATIONS_MAX {
        let total: Vec<f64> = (0..k).map(|s| qc.iter().map(|q| q[s]).sum()).collect();
        let mut change = 0.0f64;
        for c in 0..nc {
            let pop = classes[c].population as f64;
            if pop == 0.0 {
                continue;
            }
            for s in 0..k {
                let seen = total[s] - qc[c][s] / pop;
                r[c][s] = residence(kinds[s], classes[c].demand_s[s], seen);
            }
            x[c] = pop / (classes[c].think_s + r[c].iter().sum::<f64>());
            for s in 0..k {
                let new = x[c] * r[c][s];
                change = change.max((new - qc[c][s]).abs());
                qc[c][s] = new;
            }
        }
        if change < SCHWEITZER_EPSILON {
            break;
        }
    }
    classes_result(Solver::Schweitzer, kinds, classes, x, r)
}

/// The cluster as the lab runs it: the clients of node `n` (one class each,
/// `clients_per_node` of them, think time `think_s`) send every request to `n`, which
/// spends `own` there and `peer` spread evenly over the other nodes; every node has a
/// cpu, disk and nic station (queueing). Returns the stations' kinds and the classes.
pub fn bound_clients_network(
    nodes: usize,
    demands_ns: &Demands,
    clients_per_node: u32,
    think_s: f64,
) -> (Vec<StationKind>, Vec<Class>) {
    let kinds = vec![StationKind::Queueing; 3 * nodes];
    let others = nodes.saturating_sub(1).max(1) as f64;
    let classes = (0..nodes)
        .map(|c| Class {
            population: clients_per_node,
            think_s,
            demand_s: (0..3 * nodes)
                .map(|s| {
                    let (node, res) = (s / 3, s % 3);
                    if node == c {
                        demands_ns.own[res] / 1e9
                    } else if nodes > 1 {
                        demands_ns.peer[res] / others / 1e9
                    } else {
                        0.0
                    }
                })
                .collect(),
        })
        .collect();
    (kinds, classes)
}

/// A measured cost line: `ns` per event plus `per_kb_ns` per KB of body.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CostLine {
    pub ns: f64,
    pub per_kb_ns: f64,
}

impl CostLine {
    /// The cost of `count` events carrying `kb` KB in all, ns.
    pub fn of(&self, count: f64, kb: f64) -> f64 {
        count * self.ns + kb * self.per_kb_ns
    }
}

/// The host's busy time per request measured host-wide (every CPU's busy ticks of
/// `/proc/stat` over a calibration phase, divided by the phase's requests): each tick
/// counted once, whatever ran in it (nodes, load generator, softirq of every packet,
/// kernel threads). Whole-core ns. The same per-class lines carry the calibrated delay
/// ([`DelayCosts::for_system`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostWide {
    /// A local hit: what every answer costs the host.
    pub local: CostLine,
    /// A miss over a local hit.
    pub miss: CostLine,
    /// A body fetched from a peer's cache over the transport of the simulation's
    /// `remote` class, over a local hit.
    pub remote: CostLine,
    /// A body a peer returned for a forwarded request (tcp; the `forwarded` class), over
    /// a local hit.
    pub forward: CostLine,
}

/// The host-wide busy time per request of a simulated run (ns of one CPU), built as the
/// nodes' CPU demand is ([`demands_ns`]): every answer a local hit's cost, each miss its
/// extra, each peer body its transport's extra (a wasted fetch or forward, a stale hint,
/// its fixed part), over the measured requests.
pub fn host_wide_demand_ns(c: &HostWide, report: &SimReport) -> f64 {
    let all = [report.local, report.remote, report.forwarded, report.miss];
    let mut ns: f64 = all
        .iter()
        .map(|k| c.local.of(k.requests as f64, k.kb as f64))
        .sum();
    ns += c
        .miss
        .of(report.miss.requests as f64, report.miss.kb as f64);
    ns += c.remote.of(
        (report.remote.requests + report.wasted_fetches) as f64,
        report.remote.kb as f64,
    );
    ns += c.forward.of(
        (report.forwarded.requests + report.wasted_forwards) as f64,
        report.forwarded.kb as f64,
    );
    ns / report.measured.max(1) as f64
}

/// The host's busy time (`/proc/stat`, every CPU: user, nice, system, irq, softirq and
/// steal; idle and iowait excluded) per request of each calibration phase, whole-core
/// ns, each a line `a + b x KB` over the sizes. Each tick is counted once whatever ran
/// in it, so the load generator, the nodes, the softirq of client and peer traffic and
/// kernel threads are all inside, none twice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostWideCosts {
    /// A local hit (the `local` phase).
    pub local_ns: f64,
    pub local_per_kb_ns: f64,
    /// A miss over a local hit (the `miss` phase over `local`, size by size).
    pub miss_ns: f64,
    pub miss_per_kb_ns: f64,
    /// A peer fetch per transport over a local hit (each `fetch-<t>` phase over `local`).
    pub fetch: Vec<HostFetchCosts>,
    /// Share of the host's busy time over all lab-shaped phases that the calibration's
    /// own processes do not explain: (busy - nodes' cgroups - own rusage - softirq) /
    /// busy. Softirq that ran in a task's context is in both its task's time and the
    /// softirq figure (no `CONFIG_IRQ_TIME_ACCOUNTING`), so it can be below 0; a large
    /// positive share is another workload on the host.
    pub unattributed_share: f64,
    /// The bound above which a phase was warned about (`HOST_UNATTRIBUTED_WARN`).
    pub unattributed_warn: f64,
    /// Every phase's figures, for the record.
    pub phases: Vec<HostPhase>,
    /// The host's speed while it calibrated: the median over the repeats of the busy ns
    /// per round trip of the lab's fixed reference workload, measured before each
    /// repeat (None in files calibrated before it was recorded). A checked lab point
    /// that recorded its own reading has every CPU cost scaled by the ratio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_ns_per_op: Option<f64>,
}

/// One transport's host-wide cost per fetched body over a local hit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostFetchCosts {
    pub transport: String,
    pub ns: f64,
    pub per_kb_ns: f64,
}

/// One lab-shaped phase of the calibration, host-wide: what `/proc/stat` counted and what
/// the calibration's own processes account for, over the measured window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostPhase {
    /// `local`, `miss` or `fetch-<t>`.
    pub phase: String,
    pub body_bytes: u64,
    /// Requests of the phase's kind (the divisor of its costs).
    pub requests: u64,
    /// Wall time of the window, ns.
    pub wall_ns: u64,
    /// The host's busy time, ns (all CPUs).
    pub busy_ns: u64,
    /// Of it, steal (a virtual machine's CPU taken by the hypervisor), ns.
    pub steal_ns: u64,
    /// The nodes' cgroups, ns.
    pub nodes_ns: u64,
    /// This process (the load generators), ns.
    pub own_ns: u64,
    /// The host's softirq, ns.
    pub softirq_ns: u64,
}

impl HostPhase {
    /// Busy time the phase's own processes and the softirq do not explain, ns (below 0
    /// when softirq counted in a task's time is counted twice).
    pub fn unattributed_ns(&self) -> f64 {
        self.busy_ns as f64 - (self.nodes_ns + self.own_ns + self.softirq_ns) as f64
    }

    /// [`Self::unattributed_ns`] as a share of the busy time.
    pub fn unattributed_share(&self) -> f64 {
        self.unattributed_ns() / (self.busy_ns as f64).max(1.0)
    }

    /// Busy time per request, ns.
    pub fn busy_per_request_ns(&self) -> f64 {
        self.busy_ns as f64 / self.requests.max(1) as f64
    }
}

/// Unattributed share of the busy time over several phases (summed).
pub fn unattributed_share(phases: &[HostPhase]) -> f64 {
    let busy: u64 = phases.iter().map(|p| p.busy_ns).sum();
    let un: f64 = phases.iter().map(HostPhase::unattributed_ns).sum();
    un / (busy as f64).max(1.0)
}

impl HostWideCosts {
    /// The host-wide costs a system's requests incur: peer bodies over its transport
    /// (the `remote` class) and forwarded ones over tcp.
    pub fn for_system(&self, system: &str) -> Result<HostWide, String> {
        class_lines(
            system,
            "host-wide",
            [self.local_ns, self.local_per_kb_ns],
            [self.miss_ns, self.miss_per_kb_ns],
            &self.fetch,
        )
    }
}

/// The per-class cost lines of `system`: a local hit's for every answer, a miss's extra,
/// and the extra of a peer body over its transport (`press-<t>`'s bodies within the
/// arena's bound go over `t`, as `validate::transport_of`; forwarded ones over tcp).
fn class_lines(
    system: &str,
    what: &str,
    local: [f64; 2],
    miss: [f64; 2],
    fetch: &[HostFetchCosts],
) -> Result<HostWide, String> {
    let line = |[ns, per_kb_ns]: [f64; 2]| CostLine { ns, per_kb_ns };
    let fetch = |t: &str| {
        fetch
            .iter()
            .find(|f| f.transport == t)
            .map(|f| line([f.ns, f.per_kb_ns]))
            .ok_or_else(|| {
                format!("{system}: the costs file has no {what} {t} fetch cost (calibrate again)")
            })
    };
    let remote = match system.strip_prefix("press-").filter(|t| *t != "tcp") {
        Some(t) => fetch(t)?,
        None => CostLine::default(),
    };
    let forward = if system == "rr" {
        CostLine::default()
    } else {
        fetch("tcp")?
    };
    Ok(HostWide {
        local: line(local),
        miss: line(miss),
        remote,
        forward,
    })
}

/// Clients of the calibration's light-load phases, in total: one closed-loop client, so
/// no request ever waits for another and the phase's response time is service plus
/// delay only.
pub const DELAY_CLIENTS: u32 = 1;

/// Per-request delay that is not service at any modelled resource (thread wake-ups and
/// scheduling latency, the nodes' CPU-quota throttling, the load generator's and the
/// veth path, connection set-up of the clients' fresh sessions), measured by the
/// calibration at light load: one closed-loop client ([`DELAY_CLIENTS`]) per request
/// kind and size; the delay is the measured time per request (the client's cycle `N /
/// X` at `N` = 1) less the model's own response time for that phase at one client (the
/// sum of its demands), and each cost is a line `a + b x KB` over the sizes. The model
/// puts it in a delay (infinite-server) centre: it adds to the response time, to no
/// utilisation. Whole ns, not scaled by a CPU share or speed-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DelayCosts {
    /// A local hit's delay: every answer has it.
    pub local_ns: f64,
    pub local_per_kb_ns: f64,
    /// A miss's delay over a local hit's (size by size).
    pub miss_ns: f64,
    pub miss_per_kb_ns: f64,
    /// A peer fetch's delay over a local hit's, per transport (size by size).
    pub fetch: Vec<HostFetchCosts>,
    /// Closed-loop clients of each light phase, in total.
    pub clients: u32,
    /// Every light phase's figures, for the record.
    pub phases: Vec<DelayPhase>,
    /// Differences that came out below 0 and were clamped to 0 (phase and size), for
    /// the record; empty when none was.
    pub clamped: Vec<String>,
}

/// One light-load phase of the calibration: what the client measured, what the model
/// answers for it at one client, and the difference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DelayPhase {
    /// `local`, `miss` or `fetch-<t>`.
    pub phase: String,
    pub body_bytes: u64,
    /// Requests the client completed in its measured window.
    pub requests: u64,
    /// The client's measured window, ns.
    pub window_ns: u64,
    /// Measured time per request: the window over the requests (with one client its
    /// cycle, `N / X`: what the model's response time holds, its think time being 0
    /// and the client's CPU inside the host centre), ns.
    pub measured_ns: f64,
    /// The load generator's mean latency (request sent to body read), ns, for the
    /// record: it leaves out the client's own time between requests.
    pub latency_mean_ns: f64,
    /// The model's response time for the phase at one client, without delay, ns.
    pub model_ns: f64,
    /// `measured_ns - model_ns`, before any clamp, ns.
    pub delay_ns: f64,
}

impl DelayCosts {
    /// The delay lines a system's requests incur, per class as the host-wide costs.
    pub fn for_system(&self, system: &str) -> Result<HostWide, String> {
        class_lines(
            system,
            "delay",
            [self.local_ns, self.local_per_kb_ns],
            [self.miss_ns, self.miss_per_kb_ns],
            &self.fetch,
        )
    }
}

/// A light phase's delay: the measured time per request less the model's response
/// time there, and whether it was clamped (a negative difference is 0).
pub fn light_delay_ns(measured_ns: f64, model_ns: f64) -> (f64, bool) {
    let d = measured_ns - model_ns;
    (d.max(0.0), d < 0.0)
}

/// The delay per request of a simulated run, ns: built as the host-wide demand is
/// ([`host_wide_demand_ns`]: a local hit's delay for every answer, each miss's and each
/// peer body's extra, a stale hint's fixed part).
pub fn delay_demand_ns(c: &HostWide, report: &SimReport) -> f64 {
    host_wide_demand_ns(c, report)
}

/// Adds a delay (infinite-server) centre of `delay_s` seconds per request to every
/// class of a network: it adds to each request's response time, no customer waits at
/// it, and it bounds no throughput.
pub fn with_delay(kinds: &mut Vec<StationKind>, classes: &mut [Class], delay_s: f64) {
    kinds.push(StationKind::Delay);
    for class in classes {
        class.demand_s.push(delay_s);
    }
}

/// The host's CPUs as one centre every node, every client and the kernel's softirq
/// share (the lab runs all of them on one host): whole-core CPU per request, ns, by
/// whom, and the CPUs it has. A node's quota station still bounds the node; this centre
/// bounds their sum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostCpu {
    /// CPUs of the host (its capacity: CPU-seconds per second).
    pub cpus: f64,
    /// The nodes' CPU per request on a whole core (the request's node and its peers).
    pub node_ns: f64,
    /// The load generator's CPU per request.
    pub client_ns: f64,
    /// Softirq per request the nodes' and clients' figures do not hold.
    pub softirq_ns: f64,
    /// The host's busy time per request measured host-wide ([`host_wide_demand_ns`]);
    /// when present it is the centre's demand, and the three parts above are shown for
    /// comparison only (they count softirq that ran in a task's context twice, and miss
    /// the client traffic's softirq and kernel threads).
    pub host_wide_ns: Option<f64>,
}

impl HostCpu {
    /// The centre's demand per request, ns of one CPU: the host-wide figure when
    /// measured, else the sum of the parts.
    pub fn demand_ns(&self) -> f64 {
        self.host_wide_ns.unwrap_or_else(|| self.parts_ns())
    }

    /// The sum node + client + softirq, ns of one CPU.
    pub fn parts_ns(&self) -> f64 {
        self.node_ns + self.client_ns + self.softirq_ns
    }

    /// Largest throughput the host's CPUs allow (`cpus / D`), requests per second.
    pub fn capacity_per_s(&self) -> f64 {
        self.cpus / (self.demand_ns() / 1e9).max(f64::MIN_POSITIVE)
    }

    /// Utilisation law at `throughput_per_s`: `U = X D / cpus`.
    pub fn utilisation(&self, throughput_per_s: f64) -> f64 {
        throughput_per_s * self.demand_ns() / 1e9 / self.cpus.max(f64::MIN_POSITIVE)
    }

    /// Whether the host's CPUs, and not any of `other_bounds_per_s` (the other
    /// resources' `1 / D_max` bounds), bind the throughput: the bottleneck rule.
    pub fn binds(&self, other_bounds_per_s: &[f64]) -> bool {
        let own = self.capacity_per_s();
        other_bounds_per_s.iter().all(|b| own < *b)
    }
}

/// Adds the host's CPUs to a network of [`bound_clients_network`] as a multi-server
/// centre, in Seidmann's approximation: a queueing station of demand `D / cpus` and a
/// delay station of `D (cpus - 1) / cpus`, `D` [`HostCpu::demand_ns`] for every class.
/// The clients' CPU is inside `D`, so the classes' think time becomes 0 (it would count
/// it twice). The nodes' CPU is in their quota stations and here too: a serial
/// approximation that, at low load, adds the whole-core node time once more to `R`.
pub fn with_host_cpu(kinds: &mut Vec<StationKind>, classes: &mut [Class], host: &HostCpu) {
    let d = host.demand_ns() / 1e9;
    let c = host.cpus.max(1.0);
    kinds.push(StationKind::Queueing);
    kinds.push(StationKind::Delay);
    for class in classes {
        class.demand_s.push(d / c);
        class.demand_s.push(d * (c - 1.0) / c);
        class.think_s = 0.0;
    }
}

/// Label every extrapolated number carries in tables and files.
pub const EXTRAPOLATION_LABEL: &str = "model output (extrapolated, not measured)";

/// One extrapolated point: the inputs that differ from the checked points and the
/// model's answer, labelled.
#[derive(Debug, Clone, PartialEq)]
pub struct Extrapolation {
    pub label: &'static str,
    pub nodes: usize,
    pub clients: u32,
    /// Per-request cluster demands used (cpu, disk, nic), ns.
    pub demands_ns: [f64; 3],
    pub throughput_per_s: f64,
    pub response_s: f64,
}

/// Extrapolates with checked demands scaled per resource (`speedup` = how many times
/// faster each of cpu, disk and nic is, e.g. `[2.0, 1.0, 1.0]` for CPUs twice as fast)
/// to `nodes` nodes and `clients` clients. For other node counts or working sets the
/// fractions change: take them from a new trace-driven simulation, not from here.
pub fn extrapolate(
    demands_ns: [f64; 3],
    speedup: [f64; 3],
    nodes: usize,
    clients: u32,
    think_s: f64,
) -> Extrapolation {
    let d = [0, 1, 2].map(|k| demands_ns[k] / speedup[k]);
    let r = predict(nodes, d, clients, think_s);
    Extrapolation {
        label: EXTRAPOLATION_LABEL,
        nodes,
        clients,
        demands_ns: d,
        throughput_per_s: r.throughput_per_s,
        response_s: r.response_s,
    }
}

/// The utilisation law: a resource serving `throughput_per_s` requests of `demand_s`
/// each is busy `U = X D` of the time (at most 1 when the figures are consistent).
pub fn utilisation(throughput_per_s: f64, demand_s: f64) -> f64 {
    throughput_per_s * demand_s
}

/// Little's law over a closed loop: `N = X (R + Z)` customers for throughput `X`,
/// response time `R` and think time `Z`.
pub fn little_population(throughput_per_s: f64, response_s: f64, think_s: f64) -> f64 {
    throughput_per_s * (response_s + think_s)
}

/// Relative error of a prediction against a simulated or measured value.
pub fn relative_error(predicted: f64, observed: f64) -> f64 {
    (predicted - observed).abs() / observed.abs().max(f64::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-12)
    }

    #[test]
    fn balanced_network_matches_the_closed_form() {
        // K stations of equal demand D, no think time: X(N) = N / (D (N + K - 1))
        // (Lazowska et al., Quantitative System Performance, balanced systems).
        for (k, d, n) in [(2, 1.0, 2), (3, 0.05, 10), (5, 0.2, 40)] {
            let st: Vec<Station> = (0..k)
                .map(|i| Station::queueing(format!("s{i}"), d))
                .collect();
            let r = mva(&st, 0.0, n);
            let want = n as f64 / (d * (n + k - 1) as f64);
            assert!(
                close(r.throughput_per_s, want, 1e-9),
                "K={k} N={n}: {} vs {want}",
                r.throughput_per_s
            );
        }
        // Worked by hand: two stations of D = 1, N = 2: X = 2/3, each queue holds 1.
        let st = vec![Station::queueing("a", 1.0), Station::queueing("b", 1.0)];
        let r = mva(&st, 0.0, 2);
        assert!(close(r.throughput_per_s, 2.0 / 3.0, 1e-12));
        assert!(close(r.queue_len[0], 1.0, 1e-12));
    }

    #[test]
    fn one_station_with_think_time_matches_the_finite_source_queue() {
        // Machine-repairman model (M/M/1//N): p0 = 1 / sum_n N!/(N-n)! (S/Z)^n,
        // X = (1 - p0) / S.
        let (s, z) = (0.1, 1.0);
        for n in [1u32, 5, 10, 30] {
            let mut term = 1.0;
            let mut sum = 1.0;
            for i in 1..=n {
                term *= (n - i + 1) as f64 * s / z;
                sum += term;
            }
            let want = (1.0 - 1.0 / sum) / s;
            let r = mva(&[Station::queueing("cpu", s)], z, n);
            assert!(
                close(r.throughput_per_s, want, 1e-9),
                "N={n}: {} vs {want}",
                r.throughput_per_s
            );
        }
    }

    #[test]
    fn extrapolation_is_labelled_and_moves_the_bottleneck() {
        // CPU-bound: twice-as-fast CPUs nearly double throughput at saturation, until the
        // disk becomes the bottleneck.
        let d = [40_000.0, 10_000.0, 5_000.0];
        let base = extrapolate(d, [1.0; 3], 4, 400, 0.0);
        let fast = extrapolate(d, [2.0, 1.0, 1.0], 4, 400, 0.0);
        assert_eq!(fast.label, EXTRAPOLATION_LABEL);
        assert!(fast.throughput_per_s > 1.8 * base.throughput_per_s);
        let faster = extrapolate(d, [10.0, 1.0, 1.0], 4, 400, 0.0);
        assert!(
            faster.throughput_per_s <= 4.0 / 10_000.0 * 1e9 + 1e-6,
            "disk bound"
        );
    }

    #[test]
    fn laws_and_bounds_hold_on_mva_output() {
        let st = vec![
            Station::queueing("cpu", 0.004),
            Station::queueing("disk", 0.010),
            Station::queueing("nic", 0.002),
            Station {
                name: "net".into(),
                demand_s: 0.001,
                kind: StationKind::Delay,
            },
        ];
        let z = 0.5;
        let d: f64 = st.iter().map(|s| s.demand_s).sum();
        for n in [1, 10, 50, 200] {
            let r = mva(&st, z, n);
            // Little's law over the whole loop, and per station.
            assert!(close(
                r.throughput_per_s * (r.response_s + z),
                n as f64,
                1e-9
            ));
            for (i, station) in st.iter().enumerate() {
                assert!(close(
                    r.queue_len[i],
                    r.throughput_per_s * r.residence_s[i],
                    1e-9
                ));
                // Utilisation law.
                assert!(close(
                    r.utilisation[i],
                    r.throughput_per_s * station.demand_s,
                    1e-12
                ));
            }
            // Asymptotic bounds.
            assert!(r.throughput_per_s <= (n as f64 / (d + z)).min(1.0 / 0.010) + 1e-9);
        }
        assert!(
            close(mva(&st, z, 2000).throughput_per_s, 100.0, 1e-3),
            "bottleneck bound reached"
        );
    }
    #[test]
    fn one_class_matches_single_class_mva_and_schweitzer_is_close_to_exact() {
        let st = vec![
            Station::queueing("cpu", 0.004),
            Station::queueing("disk", 0.010),
        ];
        let kinds = vec![StationKind::Queueing; 2];
        let one = mva_classes(
            &kinds,
            &[Class {
                population: 12,
                think_s: 0.05,
                demand_s: vec![0.004, 0.010],
            }],
        );
        assert_eq!(one.solver, Solver::Exact);
        let single = mva(&st, 0.05, 12);
        assert!(close(
            one.total_throughput(),
            single.throughput_per_s,
            1e-12
        ));
        assert!(close(one.response_s[0], single.response_s, 1e-12));
        // Three asymmetric classes of 3-4 customers: the approximation within 8 % of the
        // exact answer (its error is largest at such small populations).
        let kinds = vec![StationKind::Queueing; 3];
        let classes = vec![
            Class {
                population: 4,
                think_s: 0.001,
                demand_s: vec![0.002, 0.0005, 0.0001],
            },
            Class {
                population: 4,
                think_s: 0.001,
                demand_s: vec![0.0005, 0.002, 0.0001],
            },
            Class {
                population: 3,
                think_s: 0.0,
                demand_s: vec![0.0001, 0.0001, 0.003],
            },
        ];
        let exact = mva_classes(&kinds, &classes);
        let approx = mva_classes_schweitzer(&kinds, &classes);
        assert_eq!(exact.solver, Solver::Exact);
        for c in 0..3 {
            assert!(
                close(approx.throughput_per_s[c], exact.throughput_per_s[c], 0.08),
                "class {c}: {} vs {}",
                approx.throughput_per_s[c],
                exact.throughput_per_s[c]
            );
        }
    }

    #[test]
    fn laws_hold_on_multi_class_output_and_fixed_clients_beat_the_pooled_form() {
        let d = Demands {
            own: [300_000.0, 2_000_000.0, 0.0],
            peer: [100_000.0, 0.0, 0.0],
        };
        let (kinds, classes) = bound_clients_network(4, &d, 4, 0.0001);
        let r = mva_classes(&kinds, &classes);
        assert_eq!(r.solver, Solver::Exact);
        for (c, class) in classes.iter().enumerate() {
            // Little's law per class: N_c = X_c (R_c + Z_c).
            let n = r.throughput_per_s[c] * (r.response_s[c] + class.think_s);
            assert!(close(n, class.population as f64, 1e-9), "class {c}: {n}");
        }
        for s in 0..kinds.len() {
            // Utilisation law: U_k = sum_c X_c D_ck, at most 1.
            let u: f64 = classes
                .iter()
                .zip(&r.throughput_per_s)
                .map(|(c, x)| x * c.demand_s[s])
                .sum();
            assert!(close(r.utilisation[s], u, 1e-12) && u <= 1.0 + 1e-9);
        }
        // Each node's disk is its clients' own: 4 clients keep it busier than the
        // pooled single-class form, which lets them wander to idle nodes' queues.
        let pooled = predict(4, d.cluster(), 16, 0.0001);
        assert!(r.total_throughput() > pooled.throughput_per_s);
        // Schweitzer on 32 nodes (beyond the exact lattice) stays below the bound.
        let (kinds, classes) = bound_clients_network(32, &d, 4, 0.0001);
        let big = mva_classes(&kinds, &classes);
        assert_eq!(big.solver, Solver::Schweitzer);
        assert!(big.total_throughput() <= 32.0 / 2e-3 + 1e-6);
        assert!(big.total_throughput() > 0.5 * 32.0 / 2e-3);
    }

    fn report(remote: (u64, u64), wasted: u64) -> SimReport {
        let class = |requests: u64, kb: u64| crate::sim::ClassStats {
            requests,
            bytes: kb * 1024,
            kb,
            reads: 0,
        };
        SimReport {
            policy: "press",
            nodes: 2,
            clients: 8,
            think_ns: 0,
            measured: 50 + remote.0 + 20,
            local: class(50, 100),
            remote: class(remote.0, remote.1),
            forwarded: class(0, 0),
            miss: class(20, 40),
            wasted_fetches: wasted,
            wasted_forwards: 0,
            lost_local_hits: 0,
            window_ns: 1,
            completed_in_window: 1,
            in_flight_at_end: 0,
            mean_response_ns: 0.0,
            mean_in_system: 0.0,
            utilisation: Vec::new(),
            demand_ns: Vec::new(),
            directory_cpu: Vec::new(),
            violations: Vec::new(),
        }
    }

    #[test]
    fn utilisation_and_little_laws_as_pure_functions() {
        assert!(close(utilisation(200.0, 0.004), 0.8, 1e-12));
        assert!(close(little_population(100.0, 0.05, 0.03), 8.0, 1e-12));
        // On MVA's answer: N = X (R + Z), U = X D per station.
        let st = vec![
            Station::queueing("cpu", 0.003),
            Station::queueing("disk", 0.007),
        ];
        let r = mva(&st, 0.02, 12);
        assert!(close(
            little_population(r.throughput_per_s, r.response_s, 0.02),
            12.0,
            1e-9
        ));
        for (i, s) in st.iter().enumerate() {
            assert!(close(
                utilisation(r.throughput_per_s, s.demand_s),
                r.utilisation[i],
                1e-12
            ));
        }
    }

    #[test]
    fn the_host_cpu_binds_only_when_the_summed_demand_exceeds_its_capacity() {
        let d = Demands {
            own: [100_000.0, 0.0, 0.0],
            peer: [0.0; 3],
        };
        // 4 nodes at 40 % of a CPU, 40 us whole-core each: the quotas allow
        // 4 / 100 us = 40,000/s.
        let quota_bound = 4.0 / 100e-6;
        let run = |host: &HostCpu| {
            let (mut kinds, mut classes) = bound_clients_network(4, &d, 8, 20e-6);
            with_host_cpu(&mut kinds, &mut classes, host);
            mva_classes(&kinds, &classes)
        };
        // Under capacity: 2 CPUs, 40 + 5 + 5 us per request allow 40,000/s, the quotas
        // bind (equal) -- not the host.
        let light = HostCpu {
            cpus: 2.0,
            node_ns: 40_000.0,
            client_ns: 5_000.0,
            softirq_ns: 4_000.0,
            host_wide_ns: None,
        };
        assert!(!light.binds(&[quota_bound]));
        let r = run(&light);
        assert!(r.total_throughput() <= quota_bound * (1.0 + 1e-9));
        assert!(light.utilisation(r.total_throughput()) < 1.0);
        // Over capacity: 2 CPUs at 40 + 30 + 30 us allow 20,000/s, below the quotas'
        // 40,000/s: the host binds and MVA's throughput stays under it, close to it.
        let heavy = HostCpu {
            cpus: 2.0,
            node_ns: 40_000.0,
            client_ns: 30_000.0,
            softirq_ns: 30_000.0,
            host_wide_ns: None,
        };
        assert!(heavy.binds(&[quota_bound]));
        assert!((heavy.capacity_per_s() - 20_000.0).abs() < 1e-6);
        let r = run(&heavy);
        let x = r.total_throughput();
        assert!(x <= heavy.capacity_per_s() * (1.0 + 1e-9), "{x}");
        assert!(x > 0.8 * heavy.capacity_per_s(), "{x}");
        assert!(heavy.utilisation(x) <= 1.0 + 1e-9);
        // The host centre's queueing station is the busiest (utilisation law).
        let host_u = r.utilisation[kinds_len(4)];
        assert!(r.utilisation[..kinds_len(4)].iter().all(|u| *u < host_u));
        // Without the host centre the same demands reach the quotas' bound instead.
        let (kinds, classes) = bound_clients_network(4, &d, 8, 20e-6);
        let free = mva_classes(&kinds, &classes).total_throughput();
        assert!(free > heavy.capacity_per_s());
        // Think time moved into the centre; Little's law still holds with Z = 0.
        let n = little_population(x, r.mean_response_s(), 0.0);
        assert!((n - 32.0).abs() < 1e-6, "{n}");
    }

    fn kinds_len(nodes: usize) -> usize {
        3 * nodes
    }

    #[test]
    fn a_transport_with_zero_remote_demand_loads_only_the_initial_node() {
        let costs = Costs {
            cpu_request_ns: 10_000,
            cpu_per_kb_ns: 100,
            nic_per_kb_ns: 0,
            ..Costs::default()
        };
        let rep = report((30, 60), 5);
        let one_sided = PeerFetch {
            initial_ns: 8_000.0,
            initial_per_kb_ns: 500.0,
            service_ns: 0.0,
            service_per_kb_ns: 0.0,
        };
        let two_sided = PeerFetch {
            service_ns: 20_000.0,
            service_per_kb_ns: 300.0,
            ..one_sided
        };
        let d0 = transport_demands_ns(&costs, &rep, &one_sided);
        let d2 = transport_demands_ns(&costs, &rep, &two_sided);
        assert_eq!(d0.peer, [0.0; 3], "no process of the holder runs");
        // The initial node pays the same for both; the holder pays only with tcp/udp:
        // (30 fetches + 5 wasted) x 20 us + 60 KB x 0.3 us over 100 requests.
        assert_eq!(d0.own, d2.own);
        assert!(close(
            d2.peer[0],
            (35.0 * 20_000.0 + 60.0 * 300.0) / 100.0,
            1e-12
        ));
        // The initial node's fetch: (30 + 5) x 8 us + 60 KB x 0.5 us over 100 requests,
        // on top of serving every answer and the misses' CPU.
        let base = transport_demands_ns(
            &costs,
            &rep,
            &PeerFetch {
                initial_ns: 0.0,
                initial_per_kb_ns: 0.0,
                ..one_sided
            },
        );
        assert!(close(
            d0.own[0] - base.own[0],
            (35.0 * 8_000.0 + 60.0 * 500.0) / 100.0,
            1e-12
        ));
        // In the network, node 1's CPU serves only its own clients when peer demand is 0.
        let (kinds, classes) = bound_clients_network(2, &d0, 4, 0.0001);
        let r = mva_classes(&kinds, &classes);
        assert!(close(
            r.utilisation[3],
            r.throughput_per_s[1] * d0.own[0] / 1e9,
            1e-12
        ));
        let (kinds, classes) = bound_clients_network(2, &d2, 4, 0.0001);
        let r2 = mva_classes(&kinds, &classes);
        assert!(r2.utilisation[3] > r2.throughput_per_s[1] * d2.own[0] / 1e9);
        // Same clients, less CPU per request in total: more throughput.
        assert!(r.total_throughput() > r2.total_throughput());
    }

    #[test]
    fn host_wide_demand_weights_each_class_as_the_node_demand_does() {
        let line = |ns: f64, per_kb_ns: f64| CostLine { ns, per_kb_ns };
        let c = HostWide {
            local: line(50_000.0, 1_000.0),
            miss: line(10_000.0, 200.0),
            remote: line(30_000.0, 2_000.0),
            forward: line(40_000.0, 3_000.0),
        };
        // 50 local (100 KB), 30 remote (60 KB) + 5 wasted fetches, 20 misses (40 KB).
        let mut rep = report((30, 60), 5);
        // Worked by hand: every answer a local hit, then each class's extra.
        let local = 100.0 * 50_000.0 + (100.0 + 60.0 + 40.0) * 1_000.0;
        let miss = 20.0 * 10_000.0 + 40.0 * 200.0;
        let remote = 35.0 * 30_000.0 + 60.0 * 2_000.0;
        let want = (local + miss + remote) / 100.0;
        assert!(close(host_wide_demand_ns(&c, &rep), want, 1e-12));
        // Forwarded bodies (and a wasted forward) take the forward line, not the remote one.
        rep.forwarded = rep.remote;
        rep.remote = crate::sim::ClassStats::default();
        rep.wasted_fetches = 0;
        rep.wasted_forwards = 5;
        let forward = 35.0 * 40_000.0 + 60.0 * 3_000.0;
        let want = (local + miss + forward) / 100.0;
        assert!(close(host_wide_demand_ns(&c, &rep), want, 1e-12));
        // All local hits: the local line alone.
        let only_local = SimReport {
            measured: 50,
            remote: crate::sim::ClassStats::default(),
            forwarded: crate::sim::ClassStats::default(),
            miss: crate::sim::ClassStats::default(),
            wasted_forwards: 0,
            ..rep
        };
        assert!(close(
            host_wide_demand_ns(&c, &only_local),
            50_000.0 + 2.0 * 1_000.0,
            1e-12
        ));
        // The centre takes the host-wide figure when it has one, else the parts' sum.
        let parts = HostCpu {
            cpus: 2.0,
            node_ns: 40_000.0,
            client_ns: 10_000.0,
            softirq_ns: 20_000.0,
            host_wide_ns: None,
        };
        assert_eq!(parts.demand_ns(), 70_000.0);
        let wide = HostCpu {
            host_wide_ns: Some(60_000.0),
            ..parts
        };
        assert_eq!((wide.demand_ns(), wide.parts_ns()), (60_000.0, 70_000.0));
        assert!(close(wide.capacity_per_s(), 2.0 / 60e-6, 1e-12));
    }

    #[test]
    fn unattributed_busy_time_is_what_the_phases_own_processes_leave_and_is_summed() {
        let phase = |busy: u64, explained: u64| HostPhase {
            phase: "local".into(),
            body_bytes: 512,
            requests: 100,
            wall_ns: 1_000_000_000,
            busy_ns: busy,
            steal_ns: 0,
            nodes_ns: explained / 2,
            own_ns: explained / 4,
            softirq_ns: explained / 4,
        };
        // 2,000 busy, 1,800 explained: 10 %; 1,000 busy, 1,100 explained (softirq counted
        // twice): -10 %; together (200 - 100) / 3,000.
        let (a, b) = (phase(2_000, 1_800), phase(1_000, 1_100));
        assert!((a.unattributed_share() - 0.1).abs() < 1e-12);
        assert!((b.unattributed_share() + 0.1).abs() < 1e-12);
        assert!((unattributed_share(&[a.clone(), b]) - 100.0 / 3_000.0).abs() < 1e-12);
        assert_eq!(a.busy_per_request_ns(), 20.0);
    }

    #[test]
    fn a_light_phase_delay_is_the_difference_clamped_at_zero() {
        assert_eq!(light_delay_ns(900_000.0, 600_000.0), (300_000.0, false));
        assert_eq!(light_delay_ns(500_000.0, 600_000.0), (0.0, true));
        assert_eq!(light_delay_ns(600_000.0, 600_000.0), (0.0, false));
    }

    #[test]
    fn delay_lines_pick_each_systems_transport_and_weigh_classes_as_the_host() {
        let f = |t: &str, ns: f64| HostFetchCosts {
            transport: t.into(),
            ns,
            per_kb_ns: 10.0,
        };
        let d = DelayCosts {
            local_ns: 300_000.0,
            local_per_kb_ns: 100.0,
            miss_ns: 50_000.0,
            miss_per_kb_ns: 0.0,
            fetch: vec![f("tcp", 200_000.0), f("xdp", 20_000.0)],
            clients: DELAY_CLIENTS,
            phases: Vec::new(),
            clamped: Vec::new(),
        };
        let xdp = d.for_system("press-xdp").unwrap();
        assert_eq!((xdp.remote.ns, xdp.forward.ns), (20_000.0, 200_000.0));
        let rr = d.for_system("rr").unwrap();
        assert_eq!((rr.remote.ns, rr.forward.ns), (0.0, 0.0));
        let e = d.for_system("press-shm").unwrap_err();
        assert!(e.contains("delay") && e.contains("shm"), "{e}");
        // 50 local hits of 100 KB in all, 5 remote of 10 KB, 20 misses of 40 KB.
        let rep = report((5, 10), 0);
        let want =
            (75.0 * 300_000.0 + 150.0 * 100.0 + 20.0 * 50_000.0 + 5.0 * 20_000.0 + 10.0 * 10.0)
                / 75.0;
        assert!(close(delay_demand_ns(&xdp, &rep), want, 1e-12));
    }

    #[test]
    fn a_delay_centre_adds_its_demand_to_r_like_think_time_and_no_utilisation() {
        let d = Demands {
            own: [300_000.0, 2_000_000.0, 0.0],
            peer: [100_000.0, 0.0, 0.0],
        };
        let (z, delay) = (0.0001, 0.0007);
        let (mut kinds, mut classes) = bound_clients_network(4, &d, 4, z);
        let stations = kinds.len();
        with_delay(&mut kinds, &mut classes, delay);
        assert_eq!(kinds.len(), stations + 1);
        assert_eq!(kinds[stations], StationKind::Delay);
        let r = mva_classes(&kinds, &classes);
        // A delay centre is an infinite server: the same network with the delay in the
        // think time has the same throughput, and R is longer by exactly the delay.
        let (k2, c2) = bound_clients_network(4, &d, 4, z + delay);
        let r2 = mva_classes(&k2, &c2);
        for (c, class) in classes.iter().enumerate() {
            assert!(close(r.throughput_per_s[c], r2.throughput_per_s[c], 1e-12));
            assert!(close(r.response_s[c], r2.response_s[c] + delay, 1e-12));
            // Little's law per class on the model's answer: N_c = X_c (R_c + Z_c).
            let n = r.throughput_per_s[c] * (r.response_s[c] + class.think_s);
            assert!(close(n, 4.0, 1e-9), "class {c}: {n}");
        }
        // The queueing stations' utilisation is the same as without the delay centre's
        // demand counted anywhere; the delay centre holds X D customers, none waiting.
        for s in 0..stations {
            assert!(close(r.utilisation[s], r2.utilisation[s], 1e-12));
        }
        let x = r.total_throughput();
        assert!(close(r.queue_len[stations], x * delay, 1e-12));
        // At one customer the answer is the sum of the demands plus the delay.
        let mut one = classes.clone();
        for (i, c) in one.iter_mut().enumerate() {
            c.population = u32::from(i == 0);
        }
        let r1 = mva_classes(&kinds, &one);
        let sum: f64 = one[0].demand_s.iter().sum();
        assert!(close(r1.response_s[0], sum, 1e-12));
        assert!(close(1.0 / r1.throughput_per_s[0], sum + z, 1e-12));
    }
}
