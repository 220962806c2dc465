//! The model against the lab: costs measured on this host (a costs file), hit / remote /
//! miss fractions from the trace-driven simulation of each measured configuration,
//! throughput and response time by MVA, compared with the throughput `farside lab coop`
//! measured. Then, and only then, extrapolation.
//!
//! The rule, fixed before comparing:
//! - a configuration passes when the predicted throughput is within [`MODEL_TOLERANCE`]
//!   (15 %) of the measured one;
//! - the extrapolation is "model output" only when every modelled configuration passed;
//!   otherwise it is still printed, labelled [`UNCHECKED_LABEL`] with the count of
//!   failures, and the command fails;
//! - a configuration the model does not represent (a system other than `rr` and
//!   `press-tcp`) is listed as not modelled; it neither passes nor fails, and nothing is
//!   extrapolated for it.
//!
//! The network (see [`bound_clients_network`]): each lab client sends every request to
//! one node (client `k` to node `k % nodes`), so the clients of a node are one class;
//! a request spends its own demand at its node (CPU, emulated disk, NIC) and a forwarded
//! one also the service node's CPU. CPU costs are measured on a whole core and divided by
//! the nodes' CPU quota; the disk's service is the emulation's measured time; the lab's
//! veth links have no rate limit, so the NIC costs nothing unless the point carries
//! `link_gbit`. The clients' think time is their measured CPU per request.

use crate::model::{
    bound_clients_network, delay_demand_ns, demands_ns, host_wide_demand_ns, little_population,
    mva_classes, relative_error, transport_demands_ns, utilisation, with_delay, with_host_cpu,
    ClassesResult, Demands, HostCpu, PeerFetch, Solver, StationKind, MODEL_TOLERANCE,
};
use crate::policy::{Policy, Press, RemoteMode};
use crate::sim::{self, Arrival, Costs, DirectoryUpdate, SessionReplay, SimConfig, SimReport};
use crate::trace::Trace;
use serde::{Deserialize, Serialize};

pub use crate::model::{
    light_delay_ns, unattributed_share, DelayCosts, DelayPhase, HostFetchCosts, HostPhase,
    HostWideCosts, DELAY_CLIENTS,
};
use std::fmt::Write as _;

mod shape;
mod spread;
pub use shape::{
    pick as pick_shape, CalibrationShape, CALIBRATE_CPU_QUOTA_PCT_RANGE, CALIBRATE_NODES_RANGE,
    SHAPE_CPU_QUOTA_PCT_DEFAULT, SHAPE_NODES_DEFAULT,
};
pub use spread::{
    combine_sets, median, min_max, render_spread, within_band, CostSet, Pick, Spread,
};

/// Format tag of a costs file: version 4 measures every lab-shaped cost in repeated,
/// interleaved phases and keeps the per-cost median with its spread
/// ([`CostsFile::spread`]), besides the delay measured at light load
/// ([`CostsFile::delay`]) and the host-wide busy time per request
/// ([`CostsFile::host_wide`]).
pub const COSTS_FORMAT: &str = "farside-coop-costs/4";
/// Format tag of costs files from before the calibration repeated its phases: still
/// read; one measurement per cost, no spread (the output says so).
pub const COSTS_FORMAT_V3: &str = "farside-coop-costs/3";
/// Format tag of costs files from before the delay was measured: still read; their
/// delay is 0 (the output says so).
pub const COSTS_FORMAT_V2: &str = "farside-coop-costs/2";
/// Format tag of costs files from before the host-wide measurement: still read; their
/// host centre's demand is the sum node + client + softirq (see [`HostCpu`]).
pub const COSTS_FORMAT_V1: &str = "farside-coop-costs/1";
/// Label of extrapolated figures when every modelled configuration passed.
pub const CHECKED_LABEL: &str = "model output (extrapolated from checked configurations)";
/// Label of extrapolated figures when some configuration failed or none was checked.
pub const UNCHECKED_LABEL: &str = "model output, UNCHECKED";
/// The paper's largest modelled gain (Carrera et al., HPCA 2002): 55 %.
pub const PAPER_GAIN: f64 = 0.55;
/// Lab defaults a kept run may not record (`farside lab coop`'s): warm-up 10 s, the
/// back-end's directory publication period 20 ms, disk bandwidth 40 MB/s.
pub const LAB_WARMUP_S_DEFAULT: f64 = 10.0;
pub const LAB_PUBLISH_MS_DEFAULT: u64 = 20;
pub const LAB_DISK_BYTES_PER_S_DEFAULT: u64 = 40_000_000;
/// Points a run file may hold: a sweep of 8 systems x 7 node counts x a few cache sizes
/// is far below; the bound keeps a wrong file from costing hours of simulation.
pub const LAB_POINTS_MAX: usize = 1024;

/// Where the measured costs come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub commit: String,
    /// Whether the working tree had uncommitted changes.
    pub tree_dirty: bool,
    pub kernel: String,
    pub host: String,
    pub cpus: usize,
    /// `debug` or `release`: the lab's nodes must run the same build.
    pub build: String,
    /// UTC, `YYYY-MM-DDTHH:MM:SSZ`.
    pub measured_at: String,
    /// 1-minute load average at the start and the end of the calibration.
    pub load_avg: [f64; 2],
    /// How the costs were measured.
    pub method: String,
}

/// The emulated disk as measured: configured and observed service per read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskEmulation {
    pub configured_latency_us: u64,
    pub configured_bytes_per_s: u64,
    /// Observed time of a read of 0 bytes (fit's intercept), ns.
    pub measured_access_ns: f64,
    /// Observed time per KB (fit's slope), ns.
    pub measured_per_kb_ns: f64,
}

impl DiskEmulation {
    /// Service per read at `latency_us` and `bytes_per_s`: the configuration plus the
    /// overhead measured on this host (wake-up after the sleep).
    pub fn service(&self, latency_us: u64, bytes_per_s: u64) -> (u64, u64) {
        let overhead = (self.measured_access_ns - self.configured_latency_us as f64 * 1e3).max(0.0);
        let per_kb_over = (self.measured_per_kb_ns
            - 1024.0 * 1e9 / self.configured_bytes_per_s.max(1) as f64)
            .max(0.0);
        (
            (latency_us as f64 * 1e3 + overhead).round() as u64,
            (1024.0 * 1e9 / bytes_per_s.max(1) as f64 + per_kb_over).round() as u64,
        )
    }
}

/// One measured sample of the calibration (kept for the record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// What was measured (`local`, `miss`, `forward-initial`, `forward-service`,
    /// `client`, `disk`, ...).
    pub phase: String,
    pub body_bytes: u64,
    pub requests: u64,
    /// CPU (or, for the disk, wall) time per request, ns.
    pub ns_per_request: f64,
    /// The repeat it belongs to (format 4; absent from older files, which measured once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<usize>,
}

/// The costs file `farside model coop --calibrate` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostsFile {
    pub format: String,
    pub provenance: Provenance,
    /// The nodes and quota the costs were measured at (absent from files made before it
    /// was recorded, all of which ran the lab's defaults: 4 nodes at 40 %).
    #[serde(default)]
    pub shape: CalibrationShape,
    /// CPU costs on one whole core; disk from [`Self::disk`] at the run's settings.
    pub costs: Costs,
    pub disk: DiskEmulation,
    /// A lab client's CPU per request and per KB of body, ns (its think time).
    pub client_request_ns: f64,
    pub client_per_kb_ns: f64,
    /// Peer fetch per transport (`tcp`, `udp`, `xdp`, `shm`); empty in costs files
    /// from before they were measured (then only `rr` and `press-tcp` are modelled).
    #[serde(default)]
    pub transports: Vec<TransportCosts>,
    /// The host's busy time per request, measured host-wide in every phase (format 2;
    /// absent from format 1 files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_wide: Option<HostWideCosts>,
    /// The per-request delay measured at light load (format 3; absent from formats 1
    /// and 2, whose delay is 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<DelayCosts>,
    /// The repeated calibration's spread (format 4; absent from older formats, which
    /// measured each cost once): the costs above are the per-cost medians.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,
    pub samples: Vec<Sample>,
}

/// One peer transport's measured CPU per fetched body, whole core, each a line
/// `a + b x KB` over the calibration's sizes (ns, ns per KB).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransportCosts {
    /// `tcp`, `udp`, `xdp` or `shm` (`farside backend --coop-peer`).
    pub transport: String,
    /// The initial node's CPU per fetch on top of serving a local hit, softirq it runs
    /// included (its cgroup's time: on veth without RPS the receive softirq, XDP's
    /// included, runs on the sender's CPU in its context).
    pub initial_ns: f64,
    pub initial_per_kb_ns: f64,
    /// The service node's CPU per fetch (its process and whatever softirq runs in its
    /// context); about 0 for `xdp` and `shm`, where no process of it is scheduled.
    pub service_ns: f64,
    pub service_per_kb_ns: f64,
    /// The host's softirq time per fetch (all CPUs, `/proc/stat`, clock ticks): where
    /// the kernel's share lands, for the record; already inside the nodes' figures when
    /// it ran in their context.
    pub softirq_ns: f64,
    pub softirq_per_kb_ns: f64,
}

impl TransportCosts {
    /// The costs as the model takes them (whole core).
    pub fn peer_fetch(&self) -> PeerFetch {
        PeerFetch {
            initial_ns: self.initial_ns,
            initial_per_kb_ns: self.initial_per_kb_ns,
            service_ns: self.service_ns,
            service_per_kb_ns: self.service_per_kb_ns,
        }
    }
}

impl CostsFile {
    /// The measured costs of `transport`, if the file has them.
    pub fn transport(&self, transport: &str) -> Option<&TransportCosts> {
        self.transports.iter().find(|t| t.transport == transport)
    }
}

impl CostsFile {
    /// Reads a costs file of format 4, of format 3 (one measurement per cost, no
    /// spread), of format 2 (no delay either: the delay centre is 0) or of format 1 (no
    /// delay, no host-wide figures: the host centre then sums node, client and softirq
    /// time as it did); refuses any other, a format 4 file without its spread, a format
    /// 3 or 4 file without its delay or host-wide figures, a format 2 file without its
    /// host-wide ones, and an older file with a spread or a delay it cannot carry.
    pub fn parse(text: &str) -> Result<CostsFile, String> {
        let f: CostsFile = serde_json::from_str(text).map_err(|e| format!("costs file: {e}"))?;
        let lacks = |what: &str| {
            Err(format!(
                "costs file: format {:?} without {what:?}: calibrate again",
                f.format
            ))
        };
        match f.format.as_str() {
            COSTS_FORMAT | COSTS_FORMAT_V3 | COSTS_FORMAT_V2 if f.host_wide.is_none() => {
                lacks("host_wide")
            }
            COSTS_FORMAT | COSTS_FORMAT_V3 if f.delay.is_none() => lacks("delay"),
            COSTS_FORMAT if f.spread.is_none() => lacks("spread"),
            COSTS_FORMAT_V2 | COSTS_FORMAT_V1 if f.delay.is_some() => Err(format!(
                "costs file: format {:?} with a \"delay\" (format {COSTS_FORMAT_V3:?} and later carry it)",
                f.format
            )),
            COSTS_FORMAT_V3 | COSTS_FORMAT_V2 | COSTS_FORMAT_V1 if f.spread.is_some() => {
                Err(format!(
                    "costs file: format {:?} with a \"spread\" (format {COSTS_FORMAT:?} carries it)",
                    f.format
                ))
            }
            COSTS_FORMAT | COSTS_FORMAT_V3 | COSTS_FORMAT_V2 | COSTS_FORMAT_V1 => Ok(f),
            other => Err(format!(
                "costs file: format {other:?}, expected {COSTS_FORMAT:?} (or the older {COSTS_FORMAT_V3:?}, {COSTS_FORMAT_V2:?}, {COSTS_FORMAT_V1:?}); \
                 calibrate again with `farside model coop --calibrate`"
            )),
        }
    }
}

/// One point of a kept `lab coop` run (fields the model reads; others ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabPoint {
    pub system: String,
    pub nodes: usize,
    pub cache_bytes: u64,
    pub clients: usize,
    pub duration_s: f64,
    pub tps: f64,
    #[serde(default)]
    pub p99_ms: f64,
    /// Mean response time, if the run recorded it (then Little's law is checked).
    #[serde(default)]
    pub mean_ms: Option<f64>,
    pub local_frac: f64,
    pub remote_frac: f64,
    pub miss_frac: f64,
    #[serde(default)]
    pub link_gbit: Option<f64>,
    #[serde(default)]
    pub load_model: Option<String>,
    /// The back-end nodes' CPU per request (all nodes' cgroups, whole-core µs), if the
    /// run recorded it (then the model's CPU demand is checked against it).
    #[serde(default)]
    pub cpu_us_per_req: Option<f64>,
    /// The host's busy CPU per request (all CPUs, `/proc/stat`), µs, if the run
    /// recorded it (then the model's host demand is checked against it).
    #[serde(default)]
    pub host_busy_us_per_req: Option<f64>,
    /// The host's speed before the point, busy ns per round trip of the fixed reference
    /// workload, if the run recorded it ([`host_speedup`]).
    #[serde(default)]
    pub host_ref_ns_per_op: Option<f64>,
}

impl LabPoint {
    /// Whether the point was measured in open loop (a rate, no fixed population).
    pub fn open_loop(&self) -> bool {
        self.load_model.as_deref() == Some("open")
    }
}

/// How far above 1 a host utilisation from `/proc/stat` may read and still hold: the
/// busy time is counted in 10 ms ticks per CPU and the window is cut by wall clock, so a
/// fully busy host reads up to about one tick per CPU over (a 2 % slack on an 8 s window
/// leaves room for 8 ticks).
pub const HOST_TICK_SLACK: f64 = 0.02;

/// A kept `lab coop` run (`points.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabRun {
    pub cpu_quota_pct: u32,
    pub disk_latency_us: u64,
    #[serde(default)]
    pub disk_bytes_per_s: Option<u64>,
    #[serde(default)]
    pub warmup_s: Option<f64>,
    #[serde(default)]
    pub publish_ms: Option<u64>,
    #[serde(default)]
    pub quick: bool,
    /// `--repeat`: each point's figures are the mean of that many repeats, if the run
    /// recorded it.
    #[serde(default)]
    pub repeat: Option<u32>,
    pub points: Vec<LabPoint>,
}

/// The settings of a kept run's `summary.json` (`params`) the model reads.
#[derive(Debug, Clone, Deserialize)]
struct SummaryParams {
    cpu_quota_pct: u32,
    disk_latency_us: u64,
    #[serde(default)]
    disk_bytes_per_s: Option<u64>,
    #[serde(default)]
    warmup_s: Option<f64>,
    #[serde(default)]
    publish_ms: Option<u64>,
    #[serde(default)]
    quick: bool,
    #[serde(default)]
    repeat: Option<u32>,
}

/// A kept run's `summary.json` (`farside lab coop` on the sweep runner).
#[derive(Debug, Clone, Deserialize)]
struct Summary {
    params: SummaryParams,
    points: Vec<LabPoint>,
}

impl LabRun {
    /// A run from its `summary.json` (the sweep runner's: settings under `params`).
    pub fn parse_summary(text: &str) -> Result<LabRun, String> {
        let s: Summary = serde_json::from_str(text).map_err(|e| format!("summary.json: {e}"))?;
        let r = LabRun {
            cpu_quota_pct: s.params.cpu_quota_pct,
            disk_latency_us: s.params.disk_latency_us,
            disk_bytes_per_s: s.params.disk_bytes_per_s,
            warmup_s: s.params.warmup_s,
            publish_ms: s.params.publish_ms,
            quick: s.params.quick,
            repeat: s.params.repeat,
            points: s.points,
        };
        r.checked()
    }

    pub fn parse(text: &str) -> Result<LabRun, String> {
        let r: LabRun = serde_json::from_str(text).map_err(|e| format!("points.json: {e}"))?;
        r.checked()
    }

    fn checked(self) -> Result<LabRun, String> {
        let r = self;
        if r.points.len() > LAB_POINTS_MAX {
            return Err(format!("points.json: more than {LAB_POINTS_MAX} points"));
        }
        if !(1..=100).contains(&r.cpu_quota_pct) {
            return Err("points.json: cpu_quota_pct must be in 1..=100".into());
        }
        for p in &r.points {
            if p.nodes == 0 || p.nodes > crate::policy::NODES_MAX {
                return Err(format!("points.json: {} nodes", p.nodes));
            }
            let closed_ok = p.clients > 0 && p.clients % p.nodes == 0;
            if p.clients > sim::CLIENTS_MAX || !(closed_ok || p.open_loop() && p.clients == 0) {
                return Err(format!(
                    "points.json: {} clients on {} nodes (a whole number per node)",
                    p.clients, p.nodes
                ));
            }
            if !(p.tps.is_finite() && p.tps > 0.0) {
                return Err(format!("points.json: tps {}", p.tps));
            }
        }
        Ok(r)
    }
}

/// The policy that stands for a lab system, if the model represents it. PRESS over
/// udp, xdp and shm fetches bodies up to the arena's bound over that transport and
/// larger ones over tcp: the simulation's one-sided mode makes the same split (its
/// `remote` class, then `forwarded`).
pub fn policy_of(system: &str) -> Option<Policy> {
    match system {
        "rr" => Some(Policy::Independent),
        "press-tcp" => Some(Policy::Press(Press::new(RemoteMode::Forward))),
        "press-udp" | "press-xdp" | "press-shm" => {
            Some(Policy::Press(Press::new(RemoteMode::OneSided)))
        }
        _ => None,
    }
}

/// The peer transport of a PRESS system (`press-udp` -> `udp`), if it has one.
pub fn transport_of(system: &str) -> Option<&str> {
    system.strip_prefix("press-")
}

/// Why a lab system is not modelled (`None`: it is).
pub fn not_modelled(system: &str) -> Option<&'static str> {
    match system {
        "lard" | "bounded-hash" => Some(
            "not modelled: every request crosses the farside proxy on lb, whose CPU per \
             request is not calibrated",
        ),
        "haproxy" => Some("not modelled: the anchor (HAProxy + nginx) has no calibrated costs"),
        s if policy_of(s).is_none() => Some("not modelled"),
        _ => None,
    }
}

/// A configuration to model: the lab's settings for one point.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    pub system: String,
    pub nodes: usize,
    pub cache_bytes: u64,
    pub clients_per_node: u32,
    pub cpu_share: f64,
    pub disk_latency_us: u64,
    pub disk_bytes_per_s: u64,
    pub link_gbit: Option<f64>,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub publish_ms: u64,
    /// CPUs `speedup` times faster than the calibrated host (a checked point: the host
    /// speed reference's ratio, [`host_speedup`]; 1 when not recorded).
    pub cpu_speedup: f64,
    /// CPUs of one host that runs every node, client and softirq (the lab's: the
    /// calibration host's), modelled as a centre they share; `None`: one host per node
    /// (the paper's cluster), no shared centre.
    pub shared_host_cpus: Option<f64>,
    /// The lab's repeats of the point: the simulation replays each one's load-generator
    /// sessions ([`lab_loadgen_seed`]) and sums their counts, as the measured figures are
    /// the mean over them (at most [`LAB_REPEATS_SIMULATED_MAX`]; 1 for extrapolations).
    pub lab_repeats: u32,
}

impl Setup {
    pub fn of_point(run: &LabRun, p: &LabPoint) -> Setup {
        Setup {
            system: p.system.clone(),
            nodes: p.nodes,
            cache_bytes: p.cache_bytes,
            clients_per_node: (p.clients / p.nodes) as u32,
            cpu_share: run.cpu_quota_pct as f64 / 100.0,
            disk_latency_us: run.disk_latency_us,
            disk_bytes_per_s: run.disk_bytes_per_s.unwrap_or(LAB_DISK_BYTES_PER_S_DEFAULT),
            link_gbit: p.link_gbit,
            warmup_s: run.warmup_s.unwrap_or(LAB_WARMUP_S_DEFAULT),
            duration_s: p.duration_s,
            publish_ms: run.publish_ms.unwrap_or(LAB_PUBLISH_MS_DEFAULT),
            cpu_speedup: 1.0,
            shared_host_cpus: None,
            lab_repeats: run.repeat.unwrap_or(1).clamp(1, LAB_REPEATS_SIMULATED_MAX),
        }
    }
}

/// What the model says of one configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    pub setup: Setup,
    pub sim: SimReport,
    /// Per request at full CPU speed of the node's share (cpu already divided by it), ns.
    pub demands: Demands,
    pub think_s: f64,
    /// The shared host's CPU centre, when the setup has one (then the network's think
    /// time is 0: the clients' CPU is in it).
    pub host: Option<HostCpu>,
    /// The delay centre's demand per request, ns (`None`: the costs file measured no
    /// delay, and the network has no delay centre).
    pub delay_ns: Option<f64>,
    pub mva: ClassesResult,
    /// Requests each client replayed in the simulation.
    pub replayed_per_client: usize,
}

impl Prediction {
    pub fn throughput(&self) -> f64 {
        self.mva.total_throughput()
    }
    pub fn response_s(&self) -> f64 {
        self.mva.mean_response_s()
    }
}

/// The costs a configuration's nodes see: CPU at their share (and speed-up), the disk
/// emulation at its settings, the NIC at the link's rate (none: free).
pub fn effective_costs(f: &CostsFile, s: &Setup) -> Costs {
    let mut c = f.costs.at_cpu_share(s.cpu_share * s.cpu_speedup);
    let (access, per_kb) = f.disk.service(s.disk_latency_us, s.disk_bytes_per_s);
    c.disk_access_ns = access;
    c.disk_per_kb_ns = per_kb;
    c.nic_per_kb_ns = s
        .link_gbit
        .filter(|g| *g > 0.0)
        .map_or(0, |g| (1024.0 * 8.0 / g).round() as u64);
    c
}

/// Passes of [`predict`]'s fixed point at most: the replayed length follows the
/// predicted throughput, which follows the fractions; it settles in two or three.
pub const REPLAY_PASSES_MAX: usize = 4;
/// Requests one simulated replay holds at most (all clients): 2 million is 10 times the
/// World Cup sample and a few minutes of a debug build's simulator; a faster cluster
/// than that replays the trace several times over, which adds little.
pub const REPLAY_REQUESTS_MAX: usize = 2_000_000;
/// Relative change of the replayed length under which the fixed point is reached.
const REPLAY_SETTLED: f64 = 0.05;

/// Simulates the configuration over the lab's request stream and solves the network.
///
/// The lab's clients replay as much of the trace as the throughput allows in warm-up +
/// measured time, each its node's load generator's user sessions from that instance's
/// seeded start row; which requests those are decides the fractions. So the prediction is a fixed point: simulate the whole trace once, take
/// the predicted throughput's worth of requests per client (`X (warm-up + measured) /
/// clients`), simulate those, until the length changes by less than 5 %
/// ([`REPLAY_PASSES_MAX`] passes at most). No measured figure enters.
pub fn predict(f: &CostsFile, trace: &Trace, s: &Setup, seed: u64) -> Result<Prediction, String> {
    let clients = s.nodes * s.clients_per_node as usize;
    let mut per_client = trace.requests.len().div_ceil(clients.max(1));
    let mut last = None;
    for _ in 0..REPLAY_PASSES_MAX {
        let p = predict_replay(f, trace, s, seed, per_client)?;
        let next = ((p.throughput() * (s.warmup_s + s.duration_s) / clients as f64).ceil()
            as usize)
            .clamp(1, REPLAY_REQUESTS_MAX / clients.max(1));
        let settled = (next as f64 - per_client as f64).abs() <= REPLAY_SETTLED * per_client as f64;
        per_client = next;
        last = Some(p);
        if settled {
            break;
        }
    }
    last.ok_or_else(|| "no pass".into())
}

/// Repeats of a `lab coop` point simulated at most ([`Setup::lab_repeats`]): each is a
/// whole simulation; the kept runs have 2 or 3.
pub const LAB_REPEATS_SIMULATED_MAX: u32 = 5;

/// `--seed` of the `farside loadgen` instance that `farside lab coop` runs for node
/// `node` in repeat `run` of a point (each instance starts its replay at a row drawn
/// from it, [`Trace::loadgen_start_row`]).
pub fn lab_loadgen_seed(run: u32, node: usize) -> u64 {
    u64::from(run) * 1000 + node as u64 + 1
}

/// One pass of [`predict`]: `per_client` requests from each client's sessions.
pub fn predict_replay(
    f: &CostsFile,
    trace: &Trace,
    s: &Setup,
    seed: u64,
    per_client: usize,
) -> Result<Prediction, String> {
    if let Some(why) = not_modelled(&s.system) {
        return Err(format!("{}: {why}", s.system));
    }
    let policy = policy_of(&s.system).ok_or_else(|| format!("{}: not modelled", s.system))?;
    // Refuse a system whose transport was not calibrated before simulating it.
    fetch_of(f, s)?;
    let costs = effective_costs(f, s);
    let think_ns = think_ns(f, s, trace.mean_request_bytes());
    let mut cfg = SimConfig::new(s.nodes, s.cache_bytes);
    cfg.clients_per_node = s.clients_per_node as usize;
    cfg.think_ns = think_ns.round() as u64;
    cfg.costs = costs;
    cfg.seed = seed;
    cfg.warmup_fraction = s.warmup_s / (s.warmup_s + s.duration_s).max(f64::MIN_POSITIVE);
    cfg.directory_period_ns = s.publish_ms * 1_000_000;
    cfg.load_period_ns = s.publish_ms * 1_000_000;
    cfg.directory_update = DirectoryUpdate::Datagram;
    // The lab's stream: node i's clients are its loadgen instance's, seeded as the
    // lab seeds it in each repeat, each replaying trace clients' sessions; every
    // client's first warm-up share warms the caches as the lab's warm-up does. The
    // repeats' counts are summed, as the measured figures are their mean.
    let reports: Vec<SimReport> = (0..s.lab_repeats.max(1))
        .map(|run| {
            let mut cfg = cfg.clone();
            cfg.arrival = Arrival::Sessions(SessionReplay {
                per_client,
                start_rows: (0..s.nodes)
                    .map(|i| trace.loadgen_start_row(lab_loadgen_seed(run, i)))
                    .collect(),
            });
            sim::run(&cfg, trace, policy.clone())
        })
        .collect();
    let report = SimReport::merge(&reports);
    report
        .check()
        .map_err(|e| format!("{}: simulation: {e}", s.system))?;
    let net = network(f, s, &report, think_ns)?;
    let mva = mva_classes(&net.kinds, &net.classes);
    Ok(Prediction {
        setup: s.clone(),
        sim: report,
        demands: net.demands,
        think_s: net.think_s,
        host: net.host,
        delay_ns: net.delay_ns,
        mva,
        replayed_per_client: per_client,
    })
}

/// PRESS over udp, xdp or shm: that transport's measured fetch at the nodes' share
/// (`None` for `rr` and `press-tcp`, whose bodies forward at the tcp costs).
fn fetch_of(f: &CostsFile, s: &Setup) -> Result<Option<PeerFetch>, String> {
    match transport_of(&s.system).filter(|t| *t != "tcp") {
        Some(t) => {
            let tc = f.transport(t).ok_or_else(|| {
                format!(
                    "{}: the costs file has no {t} fetch costs (calibrate again)",
                    s.system
                )
            })?;
            Ok(Some(
                tc.peer_fetch().at_cpu_share(s.cpu_share * s.cpu_speedup),
            ))
        }
        None => Ok(None),
    }
}

/// A lab client's CPU per request (its think time) at a mean body of `mean_bytes`, ns.
fn think_ns(f: &CostsFile, s: &Setup, mean_bytes: f64) -> f64 {
    (f.client_request_ns + mean_bytes / 1024.0 * f.client_per_kb_ns) / s.cpu_speedup
}

/// The closed network of one configuration, from its simulated classes of answers.
struct Network {
    demands: Demands,
    host: Option<HostCpu>,
    delay_ns: Option<f64>,
    kinds: Vec<StationKind>,
    classes: Vec<crate::model::Class>,
    think_s: f64,
}

/// Builds the network of `s` for the answers of `report`: the nodes' quota, disk and
/// NIC stations ([`bound_clients_network`]), the shared host's CPUs when the setup has
/// them ([`with_host_cpu`]), and the delay centre when the costs file measured the delay
/// ([`with_delay`]).
fn network(f: &CostsFile, s: &Setup, report: &SimReport, think_ns: f64) -> Result<Network, String> {
    let costs = effective_costs(f, s);
    let demands = match fetch_of(f, s)? {
        Some(pf) => transport_demands_ns(&costs, report, &pf),
        None => demands_ns(&costs, report),
    };
    let think_s = think_ns / 1e9;
    let (mut kinds, mut classes) =
        bound_clients_network(s.nodes, &demands, s.clients_per_node, think_s);
    // The host-wide busy time per request, when the costs file measured it.
    let host_wide = match &f.host_wide {
        Some(h) if s.shared_host_cpus.is_some() => {
            Some(host_wide_demand_ns(&h.for_system(&s.system)?, report) / s.cpu_speedup)
        }
        _ => None,
    };
    let host = s.shared_host_cpus.map(|cpus| {
        // The nodes' CPU on a whole core (the demands are at their share), the clients'
        // (the think time), and the host softirq per peer body of the transports that
        // carried them (`press-tcp`'s bodies and the larger ones forward over tcp).
        let softirq = |t: &str, n: u64, kb: u64| {
            f.transport(t).map_or(0.0, |tc| {
                n as f64 * tc.softirq_ns + kb as f64 * tc.softirq_per_kb_ns
            })
        };
        let r = report;
        let remote_t = transport_of(&s.system).unwrap_or("tcp");
        let m = r.measured.max(1) as f64;
        let soft = (softirq(remote_t, r.remote.requests + r.wasted_fetches, r.remote.kb)
            + softirq(
                "tcp",
                r.forwarded.requests + r.wasted_forwards,
                r.forwarded.kb,
            ))
            / m;
        HostCpu {
            cpus,
            // At the share the demands are CPU time over the share (and over the speed-up);
            // on a whole core of this host they are times the share alone.
            node_ns: (demands.own[0] + demands.peer[0]) * s.cpu_share,
            client_ns: think_ns,
            softirq_ns: soft / s.cpu_speedup,
            host_wide_ns: host_wide,
        }
    });
    let think_s = match &host {
        Some(h) => {
            with_host_cpu(&mut kinds, &mut classes, h);
            0.0
        }
        None => think_s,
    };
    // The delay measured at light load: not CPU demand, so neither the CPU share nor a
    // faster CPU scales it.
    let delay_ns = match &f.delay {
        Some(d) => Some(delay_demand_ns(&d.for_system(&s.system)?, report)),
        None => None,
    };
    if let Some(d) = delay_ns {
        with_delay(&mut kinds, &mut classes, d / 1e9);
    }
    Ok(Network {
        demands,
        host,
        delay_ns,
        kinds,
        classes,
        think_s,
    })
}

/// A kind of request the calibration's light phases measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LightKind<'a> {
    /// A local hit (PRESS over tcp, each node asked for its own set).
    Local,
    /// A miss (`rr`, caches of one byte).
    Miss,
    /// A body from a peer's cache over a transport (`tcp` forwards; `udp`, `xdp`,
    /// `shm` read one-sidedly).
    Fetch(&'a str),
}

/// Requests of the one-class report [`light_cycle_ns`] solves: whole KB per body as the
/// simulator charges them, many enough that the per-request averages are exact.
const LIGHT_REPORT_REQUESTS: u64 = 1024;

/// The model's time per request for one client that asks only for `kind` bodies of
/// `body_bytes` in the setup `s` (its system, clients and cache ignored; the
/// calibration's: its nodes, quota, disk emulation, shared host): `R + Z` of the
/// network at a population of 1 (the sum of its demands), without any delay centre,
/// ns. The calibration subtracts it from the measured time per request to find the
/// delay.
pub fn light_cycle_ns(
    f: &CostsFile,
    s: &Setup,
    kind: LightKind,
    body_bytes: u64,
) -> Result<f64, String> {
    let n = LIGHT_REPORT_REQUESTS;
    let class = sim::ClassStats {
        requests: n,
        bytes: n * body_bytes,
        kb: n * body_bytes.div_ceil(1024),
        reads: 0,
    };
    let none = sim::ClassStats::default();
    let (system, policy, [local, remote, forwarded, miss]) = match kind {
        LightKind::Local => ("press-tcp".to_string(), "press", [class, none, none, none]),
        LightKind::Miss => ("rr".to_string(), "round-robin", [none, none, none, class]),
        LightKind::Fetch("tcp") => ("press-tcp".to_string(), "press", [none, none, class, none]),
        LightKind::Fetch(t) => (format!("press-{t}"), "press", [none, class, none, none]),
    };
    let s = Setup {
        system,
        clients_per_node: 1,
        ..s.clone()
    };
    let report = SimReport {
        policy,
        nodes: s.nodes,
        clients: 1,
        think_ns: 0,
        measured: n,
        local,
        remote,
        forwarded,
        miss,
        wasted_fetches: 0,
        wasted_forwards: 0,
        lost_local_hits: 0,
        window_ns: 0,
        completed_in_window: 0,
        in_flight_at_end: 0,
        mean_response_ns: 0.0,
        mean_in_system: 0.0,
        utilisation: Vec::new(),
        demand_ns: Vec::new(),
        directory_cpu: Vec::new(),
        violations: Vec::new(),
    };
    let f = CostsFile {
        delay: None,
        ..f.clone()
    };
    let mut net = network(&f, &s, &report, think_ns(&f, &s, body_bytes as f64))?;
    // One client in all: the first node's class, the others empty.
    for (i, c) in net.classes.iter_mut().enumerate() {
        c.population = u32::from(i == 0) * DELAY_CLIENTS;
    }
    let r = mva_classes(&net.kinds, &net.classes);
    let x = r.total_throughput();
    if x <= 0.0 {
        return Err(format!("{kind:?} at {body_bytes} B: no throughput"));
    }
    Ok(DELAY_CLIENTS as f64 / x * 1e9)
}

/// A law checked on numbers: what it says, the two sides, whether they agree.
#[derive(Debug, Clone, PartialEq)]
pub struct Law {
    pub what: String,
    /// `None`: the data does not allow the check (the reason is in `what`).
    pub holds: Option<bool>,
}

/// One measured point against its prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct PointCheck {
    pub run: String,
    pub point: LabPoint,
    /// `Err`: not modelled, or the simulation failed.
    pub prediction: Result<Prediction, String>,
    pub laws: Vec<Law>,
}

impl PointCheck {
    pub fn error(&self) -> Option<f64> {
        self.prediction
            .as_ref()
            .ok()
            .map(|p| relative_error(p.throughput(), self.point.tps))
    }

    /// `Some(true)` within tolerance, `Some(false)` outside, `None` not modelled.
    pub fn pass(&self) -> Option<bool> {
        self.error().map(|e| e <= MODEL_TOLERANCE)
    }
}

/// Tolerance of the laws on measured data: the same as the model's.
const LAW_TOLERANCE: f64 = MODEL_TOLERANCE;

/// The utilisation and Little's laws on one measured point, as far as its data allows.
pub fn measured_laws(p: &LabPoint, pred: Option<&Prediction>) -> Vec<Law> {
    let mut laws = Vec::new();
    let n = p.clients as f64;
    let x = p.tps;
    match p.mean_ms {
        Some(r_ms) => {
            let z = pred.map_or(0.0, |p| p.think_s);
            let xr = x * (r_ms / 1e3 + z);
            let ok = relative_error(xr, n) <= LAW_TOLERANCE;
            laws.push(Law {
                what: format!(
                    "Little: N = {n:.0} clients, X (R + Z) = {x:.1}/s x ({r_ms:.3} + {:.3}) ms = {xr:.2}",
                    z * 1e3
                ),
                holds: Some(ok),
            });
        }
        None => laws.push(Law {
            what: format!(
                "Little: not checkable (the point records no mean response time); it implies R = N/X = {:.3} ms",
                n / x * 1e3
            ),
            holds: None,
        }),
    }
    // The emulated disk's utilisation from the measured throughput and miss fraction:
    // U = X D must stay at most 1 per disk (the point records no utilisation, so this
    // checks the measured figures against the disk's configured service).
    if let Some(pred) = pred {
        let c = &pred.sim;
        let mean_miss_kb = c.miss.kb as f64 / c.miss.requests.max(1) as f64;
        let costs_disk = pred.demands.own[1] / pred.sim.fractions()[2].max(f64::MIN_POSITIVE);
        let service_ns = if pred.sim.miss.requests > 0 {
            costs_disk
        } else {
            0.0
        };
        let u = x * p.miss_frac * service_ns / 1e9 / p.nodes as f64;
        laws.push(Law {
            what: format!(
                "Utilisation: disk U = X x miss x S / nodes = {x:.1} x {:.3} x {:.3} ms / {} = {u:.3} (<= 1; S at {mean_miss_kb:.1} KB per miss)",
                p.miss_frac,
                service_ns / 1e6,
                p.nodes
            ),
            holds: Some(u <= 1.0),
        });
        let cpu_per_req = (pred.demands.own[0] + pred.demands.peer[0]) / 1e9;
        let u = utilisation(x, cpu_per_req) / p.nodes as f64;
        laws.push(Law {
            what: format!(
                "Utilisation: CPU U = X x D / nodes = {x:.1} x {:.1} us / {} = {u:.3} of the quota (<= 1)",
                cpu_per_req * 1e6,
                p.nodes
            ),
            holds: Some(u <= 1.0),
        });
        // The same law on the lab's own CPU figure: D measured = CPU used / requests, at
        // the nodes' share; the model's D against it (within the tolerance). Both are CPU
        // time of this host's cores: the quota is a share of them whatever their speed
        // (the speed-up is already inside the model's demand at the share).
        if let Some(us) = p.cpu_us_per_req.filter(|v| *v > 0.0) {
            let share = pred.setup.cpu_share;
            let model_us = cpu_per_req * 1e6 * share;
            let u = utilisation(x, us / 1e6 / share) / p.nodes as f64;
            let e = relative_error(model_us, us);
            laws.push(Law {
                what: format!(
                    "Utilisation: CPU measured U = X x D_lab / (nodes x share) = {x:.1} x {us:.1} us / ({} x {share:.2}) = {u:.3} (<= 1); \
                     model D {model_us:.1} us whole-core vs lab {us:.1} us: {:.0} % {}",
                    p.nodes,
                    e * 100.0,
                    if e <= LAW_TOLERANCE { "(within)" } else { "(outside the tolerance)" }
                ),
                holds: Some(u <= 1.0),
            });
        }
        // The host's CPUs on the measured throughput: U = X D_host / cpus, D_host the
        // model's whole-core node CPU, the client's and the softirq; and again with the
        // lab's node CPU per request in place of the model's.
        if let Some(h) = pred.host.as_ref().filter(|h| h.host_wide_ns.is_some()) {
            let u = h.utilisation(x);
            let parts = HostCpu {
                host_wide_ns: None,
                ..*h
            };
            // The same law on the lab's own host figure, and the model's D_host
            // against it (within the tolerance).
            if let Some(us) = p.host_busy_us_per_req.filter(|v| *v > 0.0) {
                let lab = HostCpu {
                    host_wide_ns: Some(us * 1e3),
                    ..*h
                };
                let e = relative_error(h.demand_ns() / 1e3, us);
                laws.push(Law {
                    what: format!(
                        "Utilisation: host CPU measured U = X x D_lab / cpus = {x:.1} x {us:.1} us / {} = {:.3} (<= 1); \
                         model D_host {:.1} us vs lab {us:.1} us: {:.0} % {}",
                        h.cpus,
                        lab.utilisation(x),
                        h.demand_ns() / 1e3,
                        e * 100.0,
                        if e <= LAW_TOLERANCE { "(within)" } else { "(outside the tolerance)" }
                    ),
                    holds: Some(lab.utilisation(x) <= 1.0 + HOST_TICK_SLACK),
                });
            }
            laws.push(Law {
                what: format!(
                    "Utilisation: host CPU U = X x D_host / cpus = {x:.1} x {:.1} us / {} = {u:.3} (<= 1; D_host the host-wide busy time per request); \
                     the sum node + client + softirq {:.1} + {:.1} + {:.1} = {:.1} us would give U {:.3}",
                    h.demand_ns() / 1e3,
                    h.cpus,
                    h.node_ns / 1e3,
                    h.client_ns / 1e3,
                    h.softirq_ns / 1e3,
                    parts.demand_ns() / 1e3,
                    parts.utilisation(x)
                ),
                holds: Some(u <= 1.0),
            });
        } else if let Some(h) = &pred.host {
            let u = h.utilisation(x);
            let lab = p
                .cpu_us_per_req
                .filter(|v| *v > 0.0)
                .map_or(String::new(), |us| {
                    let hl = HostCpu {
                        node_ns: us * 1e3,
                        ..*h
                    };
                    format!(
                        "; with the lab's node CPU {us:.1} us: D {:.1} us, U {:.3}",
                        hl.demand_ns() / 1e3,
                        hl.utilisation(x)
                    )
                });
            laws.push(Law {
                what: format!(
                    "Utilisation: host CPU U = X x D_host / cpus = {x:.1} x ({:.1} + {:.1} + {:.1}) us / {} = {u:.3} (<= 1; node + client + softirq){lab}",
                    h.node_ns / 1e3,
                    h.client_ns / 1e3,
                    h.softirq_ns / 1e3,
                    h.cpus
                ),
                holds: Some(u <= 1.0),
            });
        }
        // Little's law on the model's answer: N = X (R + Z) over the closed loop.
        let n_model = little_population(pred.throughput(), pred.response_s(), pred.think_s);
        let total: f64 = pred.mva.queue_len.iter().sum::<f64>() + pred.throughput() * pred.think_s;
        laws.push(Law {
            what: format!(
                "Little (model): X (R + Z) = {:.1}/s x ({:.3} + {:.3}) ms = {n_model:.3}, sum of queues + X Z = {total:.3}, N = {n:.0}",
                pred.throughput(),
                pred.response_s() * 1e3,
                pred.think_s * 1e3
            ),
            holds: Some(relative_error(n_model, n) < 1e-6 && relative_error(total, n) < 1e-6),
        });
    }
    laws
}

/// Bounds of [`host_speedup`]: a reading further from the calibration's than this
/// factor is another kind of host, not a drift of this one, and is not used.
pub const HOST_SPEEDUP_RANGE: (f64, f64) = (0.5, 2.0);

/// How many times faster the host ran point `p` than it ran the calibration `costs`:
/// the ratio of their readings of the fixed reference workload (busy ns per round trip,
/// the calibration's over the point's), 1 when either was not recorded or the ratio is
/// outside [`HOST_SPEEDUP_RANGE`]. The check scales every CPU cost by it (the nodes',
/// the clients', the host's; not the disk, the links or the delay centre), as the
/// extrapolation scales them for faster CPUs: a host beside other tenants drifts by
/// more than the tolerance within an hour.
pub fn host_speedup(costs: &CostsFile, p: &LabPoint) -> f64 {
    let calibrated = costs.host_wide.as_ref().and_then(|h| h.reference_ns_per_op);
    match (calibrated, p.host_ref_ns_per_op) {
        (Some(c), Some(r)) if c > 0.0 && r > 0.0 => {
            let k = c / r;
            if (HOST_SPEEDUP_RANGE.0..=HOST_SPEEDUP_RANGE.1).contains(&k) {
                k
            } else {
                1.0
            }
        }
        _ => 1.0,
    }
}

/// Checks every point of `runs` (name, run) with `costs` and `trace`.
pub fn check_runs(
    costs: &CostsFile,
    trace: &Trace,
    runs: &[(String, LabRun)],
    seed: u64,
) -> Vec<PointCheck> {
    let mut out = Vec::new();
    for (name, run) in runs {
        for p in &run.points {
            let prediction = if p.open_loop() {
                Err(format!(
                    "{}: open loop at a rate: the model is a closed network; not compared",
                    p.system
                ))
            } else {
                predict(
                    costs,
                    trace,
                    &Setup {
                        shared_host_cpus: Some(costs.provenance.cpus as f64),
                        cpu_speedup: host_speedup(costs, p),
                        ..Setup::of_point(run, p)
                    },
                    seed,
                )
            };
            let laws = measured_laws(p, prediction.as_ref().ok());
            out.push(PointCheck {
                run: name.clone(),
                point: p.clone(),
                prediction,
                laws,
            });
        }
    }
    out
}

/// The verdict over all checks: modelled, passed, failed.
pub fn verdict(checks: &[PointCheck]) -> (usize, usize, usize) {
    let modelled = checks.iter().filter(|c| c.pass().is_some()).count();
    let passed = checks.iter().filter(|c| c.pass() == Some(true)).count();
    (modelled, passed, modelled - passed)
}

/// One extrapolated configuration: every modelled system under the same setup.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtrapolatedRow {
    pub what: String,
    /// One prediction per system, in the grid's order.
    pub predictions: Vec<Prediction>,
}

impl ExtrapolatedRow {
    /// The prediction of `system`, if the row has it.
    pub fn of(&self, system: &str) -> Option<&Prediction> {
        self.predictions.iter().find(|p| p.setup.system == system)
    }

    /// Throughput of `system` over that of `over`, minus 1.
    pub fn gain(&self, system: &str, over: &str) -> Option<f64> {
        let (a, b) = (self.of(system)?, self.of(over)?);
        Some(a.throughput() / b.throughput().max(f64::MIN_POSITIVE) - 1.0)
    }
}

/// The systems the costs file lets the model represent, in report order: `rr`,
/// `press-tcp`, then `press-udp`, `press-xdp`, `press-shm` when their fetch costs
/// were measured.
pub fn modelled_systems(f: &CostsFile) -> Vec<String> {
    let mut v = vec!["rr".to_string(), "press-tcp".to_string()];
    for t in ["udp", "xdp", "shm"] {
        if f.transport(t).is_some() {
            v.push(format!("press-{t}"));
        }
    }
    v
}

/// The extrapolation grid from a checked setup `base` (its system ignored), for every
/// system of `systems`: more nodes (8, 16, 32, same cache per node), working sets 2x
/// and 4x the cluster's memory (the cache shrunk by that factor), CPUs 2x and 4x
/// faster, and all three together.
pub fn extrapolate_grid(
    costs: &CostsFile,
    trace: &Trace,
    base: &Setup,
    systems: &[String],
    seed: u64,
) -> Result<Vec<ExtrapolatedRow>, String> {
    let mut grid: Vec<(String, Setup)> = Vec::new();
    // One host per node, as in the paper's cluster: no shared host centre; CPUs at the
    // calibrated host's speed (not the checked point's reading of it).
    let base = &Setup {
        shared_host_cpus: None,
        lab_repeats: 1,
        cpu_speedup: 1.0,
        ..base.clone()
    };
    let with = |f: &dyn Fn(&mut Setup)| {
        let mut s = base.clone();
        f(&mut s);
        s
    };
    grid.push((format!("as checked, {} nodes", base.nodes), base.clone()));
    for n in [8usize, 16, 32] {
        grid.push((format!("{n} nodes"), with(&|s| s.nodes = n)));
    }
    for k in [2u64, 4] {
        grid.push((
            format!("working set {k}x memory"),
            with(&|s| s.cache_bytes = (base.cache_bytes / k).max(1)),
        ));
    }
    for k in [2.0, 4.0] {
        grid.push((format!("CPU {k}x faster"), with(&|s| s.cpu_speedup = k)));
    }
    grid.push((
        "32 nodes, working set 4x, CPU 4x".into(),
        with(&|s| {
            s.nodes = 32;
            s.cache_bytes = (base.cache_bytes / 4).max(1);
            s.cpu_speedup = 4.0;
        }),
    ));
    grid.into_iter()
        .map(|(what, s)| {
            let predictions = systems
                .iter()
                .map(|system| {
                    predict(
                        costs,
                        trace,
                        &Setup {
                            system: system.clone(),
                            ..s.clone()
                        },
                        seed,
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(ExtrapolatedRow { what, predictions })
        })
        .collect()
}

fn solver_name(s: Solver) -> &'static str {
    match s {
        Solver::Exact => "exact",
        Solver::Schweitzer => "schweitzer",
    }
}

/// Each node station's `1 / D` bound on the cluster's throughput (the busiest node's
/// share of every resource; peers' demand spread evenly as in the network).
fn node_bounds(p: &Prediction) -> Vec<f64> {
    let n = p.setup.nodes.max(1) as f64;
    let others = (n - 1.0).max(1.0);
    (0..3)
        .map(|r| {
            let per_node = p.demands.own[r] / n + p.demands.peer[r] / others * (n - 1.0) / n;
            n / (per_node * n / 1e9).max(f64::MIN_POSITIVE)
        })
        .collect()
}

/// The text of a prediction's demands and answer (one block).
pub fn render_prediction(p: &Prediction) -> String {
    let f = p.sim.fractions();
    let d = &p.demands;
    format!(
        "  simulated fractions local {:.3} remote {:.3} miss {:.3} (wasted fetches {})\n  \
         demand per request, us: own cpu {:.1} disk {:.1} nic {:.1}; at peers cpu {:.1}; think {:.1}{}\n  \
         {}{}MVA ({}): X {:.1}/s, R {:.3} ms; simulator X {:.1}/s; {} requests replayed per client\n",
        f[0],
        f[1],
        f[2],
        p.sim.wasted_fetches + p.sim.wasted_forwards,
        d.own[0] / 1e3,
        d.own[1] / 1e3,
        d.own[2] / 1e3,
        d.peer[0] / 1e3,
        p.think_s * 1e6,
        match p.setup.cpu_speedup {
            1.0 => String::new(),
            k => format!("; every CPU cost at {k:.3}x the calibrated host's speed"),
        },
        match &p.host {
            Some(h) if h.host_wide_ns.is_some() => format!(
                "host CPU, {} CPUs shared: host-wide {:.1} us per request (whole core; the sum node {:.1} + client {:.1} + softirq {:.1} would be {:.1}), bound {:.1}/s, U {:.3} at the model's X{}\n  ",
                h.cpus,
                h.demand_ns() / 1e3,
                h.node_ns / 1e3,
                h.client_ns / 1e3,
                h.softirq_ns / 1e3,
                h.parts_ns() / 1e3,
                h.capacity_per_s(),
                h.utilisation(p.throughput()),
                if h.binds(&node_bounds(p)) { " (binds)" } else { "" }
            ),
            Some(h) => format!(
                "host CPU, {} CPUs shared: node {:.1} + client {:.1} + softirq {:.1} = {:.1} us per request (whole core), bound {:.1}/s, U {:.3} at the model's X{}\n  ",
                h.cpus,
                h.node_ns / 1e3,
                h.client_ns / 1e3,
                h.softirq_ns / 1e3,
                h.demand_ns() / 1e3,
                h.capacity_per_s(),
                h.utilisation(p.throughput()),
                if h.binds(&node_bounds(p)) { " (binds)" } else { "" }
            ),
            None => String::new(),
        },
        match p.delay_ns {
            Some(d) => format!(
                "delay centre {:.1} us per request (measured at one client, less the model's own response there; adds to R, to no utilisation)\n  ",
                d / 1e3
            ),
            None => "delay centre 0: the costs file measured no delay (format 1 or 2)\n  ".into(),
        },
        solver_name(p.mva.solver),
        p.throughput(),
        p.response_s() * 1e3,
        p.sim.throughput_rps(),
        p.replayed_per_client,
    )
}

/// The text of the checks: one table line per point, then each point's details and laws.
pub fn render_checks(checks: &[PointCheck]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "predicted vs measured throughput (tolerance {:.0} %, fixed before comparing)",
        MODEL_TOLERANCE * 100.0
    );
    let _ = writeln!(
        s,
        "{:<22} {:<10} {:>5} {:>7} {:>10} {:>10} {:>7} {:>6}  {:>17}  {:>17}",
        "run",
        "system",
        "nodes",
        "clients",
        "predicted",
        "measured",
        "error",
        "",
        "sim l/r/m",
        "lab l/r/m"
    );
    for c in checks {
        let p = &c.point;
        let lab = format!(
            "{:.3}/{:.3}/{:.3}",
            p.local_frac, p.remote_frac, p.miss_frac
        );
        match &c.prediction {
            Ok(pr) => {
                let f = pr.sim.fractions();
                let e = c.error().unwrap_or(f64::NAN);
                let _ = writeln!(
                    s,
                    "{:<22} {:<10} {:>5} {:>7} {:>10.1} {:>10.1} {:>6.1}% {:>6}  {:>17}  {:>17}",
                    c.run,
                    p.system,
                    p.nodes,
                    p.clients,
                    pr.throughput(),
                    p.tps,
                    e * 100.0,
                    if c.pass() == Some(true) {
                        "PASS"
                    } else {
                        "FAIL"
                    },
                    format!("{:.3}/{:.3}/{:.3}", f[0], f[1], f[2]),
                    lab
                );
            }
            Err(why) => {
                let _ = writeln!(
                    s,
                    "{:<22} {:<10} {:>5} {:>7} {:>10} {:>10.1} {:>7} {:>6}  {:>17}  {:>17}  ({why})",
                    c.run, p.system, p.nodes, p.clients, "-", p.tps, "-", "n/a", "-", lab
                );
            }
        }
    }
    let (m, ok, bad) = verdict(checks);
    let _ = writeln!(
        s,
        "verdict: {ok} of {m} modelled configurations within tolerance, {bad} outside"
    );
    for c in checks {
        let _ = writeln!(
            s,
            "\n{} {} ({} nodes):",
            c.run, c.point.system, c.point.nodes
        );
        if let Ok(pr) = &c.prediction {
            s += &render_prediction(pr);
        }
        for l in &c.laws {
            let tag = match l.holds {
                Some(true) => "holds",
                Some(false) => "VIOLATED",
                None => "n/a",
            };
            let _ = writeln!(s, "  [{tag}] {}", l.what);
        }
    }
    s
}

/// The label of extrapolated figures under a verdict.
pub fn extrapolation_label(failed: usize, modelled: usize) -> String {
    if failed == 0 && modelled > 0 {
        CHECKED_LABEL.to_string()
    } else if modelled == 0 {
        format!("{UNCHECKED_LABEL}: no configuration was checked against the lab")
    } else {
        format!(
            "{UNCHECKED_LABEL}: {failed} of {modelled} checked configurations outside tolerance"
        )
    }
}

/// The text of the extrapolation, labelled by the verdict: throughput per system, the
/// gain of one-sided (XDP) over TCP peer fetch (the paper's comparison: user-level
/// against kernel messaging) and of cooperation (press-tcp) over none (rr).
pub fn render_extrapolation(rows: &[ExtrapolatedRow], failed: usize, modelled: usize) -> String {
    let label = extrapolation_label(failed, modelled);
    let mut s = format!("extrapolation, {label}\n");
    let Some(first) = rows.first() else {
        return s;
    };
    let systems: Vec<&str> = first
        .predictions
        .iter()
        .map(|p| p.setup.system.as_str())
        .collect();
    let _ = write!(s, "{:<34} {:>5} {:>9}", "configuration", "nodes", "cache_B");
    for sys in &systems {
        let _ = write!(s, " {:>10}", format!("{sys} X/s"));
    }
    let _ = writeln!(s, " {:>9} {:>9} {:>9}", "xdp/tcp", "tcp/rr", "xdp R ms");
    let pct = |g: Option<f64>| g.map_or("-".to_string(), |g| format!("{:+.1}%", g * 100.0));
    for r in rows {
        let p0 = &r.predictions[0].setup;
        let _ = write!(s, "{:<34} {:>5} {:>9}", r.what, p0.nodes, p0.cache_bytes);
        for p in &r.predictions {
            let _ = write!(s, " {:>10.1}", p.throughput());
        }
        let _ = writeln!(
            s,
            " {:>9} {:>9} {:>9}",
            pct(r.gain("press-xdp", "press-tcp")),
            pct(r.gain("press-tcp", "rr")),
            r.of("press-xdp")
                .map_or("-".into(), |p| format!("{:.3}", p.response_s() * 1e3))
        );
    }
    let best = |a: &str, b: &str| {
        rows.iter()
            .filter_map(|r| r.gain(a, b).map(|g| (g, r.what.as_str())))
            .max_by(|x, y| x.0.total_cmp(&y.0))
    };
    match best("press-xdp", "press-tcp") {
        Some((g, what)) => {
            let _ = writeln!(
                s,
                "largest gain of press-xdp over press-tcp: {:+.1}% ({what}), {label}; \
                 the paper's largest modelled gain of user-level over kernel communication: {:.0}%",
                g * 100.0,
                PAPER_GAIN * 100.0
            );
        }
        None => {
            let _ = writeln!(
                s,
                "press-xdp not modelled (no xdp fetch costs): no gain beside the paper's {:.0}%",
                PAPER_GAIN * 100.0
            );
        }
    }
    if let Some((g, what)) = best("press-tcp", "rr") {
        let _ = writeln!(
            s,
            "largest gain of cooperation (press-tcp over rr): {:+.1}% ({what}), {label} \
             (cooperation against none: not the paper's 55% comparison)",
            g * 100.0
        );
    }
    s
}

#[cfg(test)]
mod tests;
