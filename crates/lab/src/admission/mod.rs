//! `farside lab admission`: the admission-control experiment of seed 000 (Fig. 5, 9, 10),
//! with HAProxy as the anchor and the scenarios the design is for.
//!
//! For each system the lab starts the back-end tier (K web servers, each with a gatherer
//! beside it), the proxy tier (one proxy, or several with `multi-proxy`), and then drives
//! it with clients for every trace and load of the sweep. The farside systems differ
//! only in the proxy's admission control; `haproxy` is HAProxy 2.6 as it is usually
//! deployed to protect back-ends ([`crate::haproxy`]):
//!
//! | system | admission | load data from |
//! |---|---|---|
//! | `no-ac` | off | (balancing by the proxy's own in-flight counts) |
//! | `tcp-ac` | on | gatherer answers over TCP (two-sided, the paper's TCP/IP) |
//! | `onesided-ac` | on, a static limit | the region read one-sidedly (`shm` here; XDP with `--hosts netns`) |
//! | `onesided-delay` | on, objective-driven: `--metric delay` keeps each back-end's published queueing delay under a target | as `onesided-ac` |
//! | `haproxy` | per-server `maxconn` = the back-end's workers, `timeout queue` short (503 after it) | its own connection counts only |
//!
//! Every system gets the same operator objective, `--queue-ms` (no request should wait
//! longer before a back-end starts on it), turned into its bounds by one rule
//! ([`LIMIT_RULE`], [`Objective`]): HAProxy's `timeout queue`, every farside proxy's
//! `--queue-timeout-ms`, the backlog limit that drains within it, the delay target.
//! Per point the lab also records where served time went: the proxy's queue and time
//! (HAProxy's stats, the farside proxy's request-duration histogram) and the
//! back-ends' published queueing delay, read from their regions for every system.
//!
//! # Scenarios (`--scenario`, comma-separated; default `single`)
//!
//! Each scenario runs every system in both load models; see [`crate::scenario`] for how
//! each is built:
//!
//! - `single`: one proxy, homogeneous back-ends (the paper's case);
//! - `multi-proxy`: `--proxies` (2-4) proxies share the back-ends, clients spread
//!   unevenly; one-sided and TCP proxies all read the same regions (each sees the load
//!   the others sent), each HAProxy only knows its own connections;
//! - `tenant-load`: back-ends also carry busy processes that come and go (co-hosted
//!   services), load the proxy did not send;
//! - `mixed-cost`: some requests cost 100x the others (a dynamic endpoint beside static
//!   files), so connection counts misstate load;
//! - `capacity-change`: back-end b0 runs at half speed in the middle third of every
//!   point and recovers.
//!
//! # Load models (`--load closed|open|both`, default both)
//!
//! - **closed**: `--clients` users, each sends a request, waits for the answer and
//!   repeats; after a 503 it follows `--on-reject` (the loadgen's default `backoff`:
//!   full-jitter exponential back-off honouring `Retry-After`; `retry`; `leave`).
//! - **open**: users arrive as a Poisson process at `--rates` × the back-end tier's
//!   capacity (a rule, see `--help`; `params.capacity_rps`), each sends one request on a
//!   connection of its own and leaves; a rejected user leaves. Arrivals do not slow down
//!   when the servers do, so overload is real overload.
//!
//! Each point keeps the loadgen's own summary (histograms included) in `points.jsonl`;
//! repeats combine with `farside_loadgen::Summary::merge`, so a repeated point's p99 is
//! the p99 of all its requests, not a mean of p99s. Points carry `load_model`,
//! `offered_rps`, `goodput`, `drop_rate`, `reject_p99_ms` and `inflight_at_end`.
//!
//! The experiment is a set-up (back-end tier, proxy, clients) and a point function on
//! the shared runner ([`crate::sweep`]): repeats, progress, `points.jsonl`, `--resume` and
//! `farside lab report DIR` come from there. Keys are (scenario, system, limit, trace,
//! load model, clients or rate); one tier runs per (scenario, system, limit).
//!
//! Defaults are chosen by rules, never by which value gave the best result:
//!
//! - **Limit**: derived from `--queue-ms` and the back-end's capacity by [`LIMIT_RULE`]
//!   (printed by `--help`): `backlog`/`pending` limit = L_Q, the accept queue one
//!   back-end drains within `--queue-ms`, `conns` limit = C + L_Q, C the back-end's
//!   connection capacity (workers; nginx's worker_processes × worker_connections).
//!   `--limits a,b,c` sweeps it instead.
//! - **Proxy**: the product's defaults (upstream pooling on); `--proxy-arg ARG` is the
//!   explicit, recorded opt-out.
//! - **Time**: 60 s points after 10 s of warm-up; `--quick` (6 s after 1 s) is for demos
//!   and the summary says so.
//! - **Privileges**: settings that need them (`--control-nice` below 0, background load,
//!   pinning, netns isolation) are recorded in `settings` as applied or not, with a
//!   warning when not ([`privileged_settings`]).

use crate::fabric::procs::Child;
use crate::nginx::{self, Nginx, NginxConfig};
use crate::scenario::Scenario;
use crate::summary::{Setting, Summary};
use crate::sweep::Sweep;

pub mod point;
pub mod report;

pub use point::{Point, SecondPoint};

/// `lab admission` as the sweep runner and the report shell see it.
pub struct Admission;

impl crate::experiment::Experiment for Admission {
    const NAME: &'static str = "admission";
    type Args = AdmissionArgs;
    type Point = Point;

    fn run(args: AdmissionArgs) -> io::Result<()> {
        run(args)
    }

    fn table(s: &Summary<Point>) -> String {
        report::table(s)
    }

    fn files(s: &Summary<Point>) -> io::Result<Vec<(String, String)>> {
        report::files(s)
    }

    fn figures(s: &Summary<Point>) -> Vec<crate::experiment::Figure> {
        report::figures(s)
    }

    fn html(s: &Summary<Point>) -> String {
        report::html(s)
    }
}
use farside_loadgen::{LoadgenArgs, OnReject, PathMode, TraceKind};
use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Instant;

/// The systems `--systems` may name: the farside proxy without and with admission
/// control (two-sided and one-sided load reads), and HAProxy ([`crate::haproxy`]).
pub const SYSTEMS: [&str; 5] = [
    "no-ac",
    "tcp-ac",
    "onesided-ac",
    "onesided-delay",
    "haproxy",
];
pub const TRACES: [&str; 3] = ["single", "worldcup", "zipf"];
const CLIENTS_FULL: &str = "16,64,128,192,256,320,400,520";
/// Accept backlog of the lab's back-ends (and nginx's `listen backlog=`): deep enough
/// that the largest sweep queues instead of dropping SYNs, as a tuned Apache would.
const BACKEND_BACKLOG: u32 = 2048;
const CLIENTS_QUICK: &str = "32,160,400";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendServer {
    /// farside's own test server (bounded workers, per-request CPU cost).
    Farside,
    /// Real nginx from the system.
    Nginx,
}

/// Load models of a sweep (`--load`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadModels {
    /// Closed loop only: `--clients` users.
    Closed,
    /// Open loop only: Poisson arrivals at `--rates` x capacity.
    Open,
    /// Both, closed loop first.
    Both,
}

impl LoadModels {
    /// The models measured, in sweep order.
    pub fn models(self) -> &'static [&'static str] {
        match self {
            LoadModels::Closed => &["closed"],
            LoadModels::Open => &["open"],
            LoadModels::Both => &["closed", "open"],
        }
    }
}

/// Open-loop rates of a full sweep, as multiples of the capacity: below it, near it,
/// and well past it (where admission control has to shed).
const RATES_FULL: &str = "0.5,0.9,1.5,3";
/// Open-loop rates of a `--quick` sweep.
const RATES_QUICK: &str = "0.5,1.5,3";
/// Highest `--rates` multiple: past 10x capacity every system only sheds, and the
/// clients' own sockets become the bottleneck.
const RATE_X_MAX: f64 = 10.0;
/// Most open-loop users active at once: each holds a socket on the client and one or two
/// on the proxy; arrivals beyond are shed by the client and counted (`shed_by_client`),
/// never silently lost.
const OPEN_USERS_MAX: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hosts {
    /// Processes on 127.0.0.1 ports; no privileges needed.
    Loopback,
    /// One network namespace per node (root).
    Netns,
}

/// Seconds measured per point of a full (not `--quick`) sweep: the paper's scale of time.
pub const DURATION_S_FULL: f64 = 60.0;
/// Warm-up seconds per point of a full sweep, not measured.
pub const WARMUP_S_FULL: f64 = 10.0;
/// Seconds per point of a `--quick` demo sweep: enough to see the shape, not to compare.
pub const DURATION_S_QUICK: f64 = 6.0;
/// Warm-up seconds per point of a `--quick` sweep.
pub const WARMUP_S_QUICK: f64 = 1.0;
/// Most per-request samples kept per point for Fig. 6's scatter: an SVG stays < 1 MB
/// with three systems and the thinned cloud still shows the distribution's shape.
pub const REQUEST_SAMPLES_MAX: usize = 1500;

#[derive(Debug, Clone, clap::Args, serde::Serialize)]
#[command(after_long_help = LIMIT_RULE)]
pub struct AdmissionArgs {
    /// Where the nodes run.
    #[arg(long, value_enum, default_value_t = Hosts::Loopback)]
    pub hosts: Hosts,
    /// Reduced sweep for demos and CI (3 client counts, 6 s points after 1 s of warm-up;
    /// a few minutes). Its numbers are not for comparison; summary.json says `quick`.
    #[arg(long)]
    pub quick: bool,
    /// Output directory for summary.json, points.jsonl, CSV, plots and report.html.
    #[arg(long, default_value = "out/admission")]
    #[serde(skip)]
    pub out: PathBuf,
    /// Continue the broken sweep kept in DIR (its output directory): finished runs are
    /// skipped. Refused when the settings differ from the kept run's.
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    #[serde(skip)]
    pub resume: Option<PathBuf>,
    /// Systems to compare, comma-separated: no-ac, tcp-ac, onesided-ac (the farside
    /// proxy with a static limit), onesided-delay (the farside proxy's objective mode,
    /// `--metric delay` with a target derived from --queue-ms) and haproxy (HAProxy with
    /// per-server maxconn = the back-end's workers and `timeout queue` --queue-ms; its
    /// configuration is in summary.json and the report).
    #[arg(
        long,
        default_value = "no-ac,tcp-ac,onesided-ac",
        value_delimiter = ','
    )]
    pub systems: Vec<String>,
    /// Scenarios, comma-separated; each runs every system in every load model. What each
    /// models and how the lab builds it (also in docs/lab.md):
    #[arg(long, value_enum, default_value = "single", value_delimiter = ',')]
    pub scenario: Vec<Scenario>,
    /// multi-proxy: number of proxies (2-4).
    #[arg(long, default_value_t = 3)]
    pub proxies: usize,
    /// tenant-load: busy processes per back-end node, each running and pausing for
    /// exponential times (mean a tenth of the point, 0.25-5 s).
    #[arg(long, default_value_t = 2)]
    pub tenant_procs: usize,
    /// The operator's bound on queueing, ms: the longest a request should wait before a
    /// back-end starts on it. Every system gets it, by the rule printed below (`--help`)
    /// and recorded in summary.json (`params.objective_rule`): HAProxy's `timeout
    /// queue`, the farside proxy's `--queue-timeout-ms`, the backlog limit of
    /// onesided-ac/tcp-ac (the accept queue that drains within it) and the target delay
    /// of onesided-delay. Default 50, a short HAProxy `timeout queue`.
    #[arg(
        long,
        alias = "haproxy-timeout-queue-ms",
        default_value_t = crate::haproxy::TIMEOUT_QUEUE_MS_DEFAULT
    )]
    pub queue_ms: u64,
    /// Traces, comma-separated: single, worldcup, zipf.
    #[arg(long, default_value = "single,worldcup,zipf", value_delimiter = ',')]
    pub traces: Vec<String>,
    /// Client counts of the sweep, comma-separated. Default: 16..520 (quick: 32,160,400).
    #[arg(long, value_delimiter = ',')]
    pub clients: Vec<u64>,
    /// Measured seconds per point (default 60, the paper's scale; quick: 6).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Warm-up seconds per point, not measured (default 10; quick: 1).
    #[arg(long)]
    pub warmup_s: Option<f64>,
    /// Number of back-end web servers.
    #[arg(long, default_value_t = 2)]
    pub backends: usize,
    /// Back-end web server.
    #[arg(long, value_enum, default_value_t = BackendServer::Farside)]
    pub backend_server: BackendServer,
    /// Worker threads per farside back-end (Apache's MaxClients).
    #[arg(long, default_value_t = 16)]
    pub backend_workers: usize,
    /// CPU time each request costs a farside back-end, µs (emulates request processing so
    /// the back-end tier, not the proxy, is the bottleneck).
    #[arg(long, default_value_t = 1500)]
    pub backend_cpu_us: u64,
    /// CPU time each body byte costs a farside back-end, ns (`farside backend
    /// --cpu-ns-per-byte`), so that a request's cost follows what it serves and the traces
    /// differ as real workloads do. Default 29: with --backend-cpu-us 1500 this is the
    /// back-end's scaling recipe for a server 90x as costly as nginx per request and per
    /// byte (`crates/backend/calibrate.sh`): 16 KiB cost ~2.0 ms, 1 MiB ~32 ms.
    #[arg(long, default_value_t = 29.0)]
    pub backend_cpu_ns_per_byte: f64,
    /// Admission metric (backlog, conns, pending, cpu, pressure, runnable). Default
    /// backlog: fresh every 1 ms sample on any host (conns walks the host's whole TCP hash
    /// and is sampled less often outside the netns lab).
    #[arg(long, default_value = "backlog")]
    pub metric: String,
    /// Load limit per back-end in the metric's unit. Default: derived from the back-end's
    /// capacity by the rule below (`--help`), never from results.
    #[arg(long, conflicts_with = "limits")]
    pub limit: Option<u64>,
    /// Sweep the admission limit: comma-separated limits, each measured for every
    /// admission-controlled system, trace and client count (no-ac once); the report plots
    /// response time against goodput across them.
    #[arg(long, value_delimiter = ',')]
    pub limits: Vec<u64>,
    /// Monitor poll period G, µs.
    #[arg(long, default_value_t = 1000)]
    pub monitor_period_us: u64,
    /// Gatherer sampling period, µs.
    #[arg(long, default_value_t = 1000)]
    pub gather_period_us: u64,
    /// Nice value of each gatherer's sampling thread and of the proxy's monitor threads
    /// (`gatherd --sampler-nice`, `proxy --monitor-nice`). Both are periodic threads on
    /// busy CPUs (the back-end's web workers; the proxy and clients): at nice 0 each waits
    /// its turn and the proxy's view goes stale for tens of ms whatever the transport.
    /// Default -20, so that the transports alone differ; 0 leaves both at normal priority.
    /// A negative value needs root (or CAP_SYS_NICE / RLIMIT_NICE): without it the run
    /// warns and summary.json records `settings.control_nice.applied = false`.
    #[arg(long, default_value_t = -20, allow_negative_numbers = true)]
    pub control_nice: i32,
    /// Proxy worker threads.
    #[arg(long, default_value_t = 1)]
    pub proxy_workers: usize,
    /// Extra argument for every farside proxy the lab starts (not HAProxy), after the
    /// lab's own (repeatable;
    /// e.g. `--proxy-arg=--pool-idle=0` turns upstream pooling off). Default none: the
    /// proxy runs with its product defaults. Flags the lab sets itself (listen address,
    /// workers, monitor, back-ends, admission, metric, limit) are refused: use the lab's
    /// own flags for them. Recorded in summary.json (`params.proxy_args`).
    #[arg(long = "proxy-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub proxy_args: Vec<String>,
    /// Client think time between requests, ms.
    #[arg(long, default_value_t = 0)]
    pub think_ms: u64,
    /// Load models measured, closed, open or both. closed: `--clients` users each send,
    /// wait and repeat; after a 503 they follow `--on-reject`. open: users arrive at
    /// `--rates` × the capacity (Poisson), send one request on a connection of their own
    /// and leave; a rejected user leaves. Default both: an admission comparison is
    /// reported in both models (a closed loop slows its own arrivals when the servers
    /// slow down; an open loop does not).
    #[arg(long, value_enum, default_value_t = LoadModels::Both)]
    pub load: LoadModels,
    /// Closed loop, what a client does after a 503: backoff (full-jitter exponential
    /// back-off honouring Retry-After, the loadgen's default), retry (at once) or leave
    /// (a new user on a new connection takes its place).
    #[arg(long, value_enum, default_value_t = OnReject::Backoff)]
    pub on_reject: OnReject,
    /// Open loop: arrival rates as multiples of the capacity (`params.capacity_rps`, by
    /// the rule below or `--capacity-rps`), comma-separated, from below it to ~3x.
    /// Default 0.5,0.9,1.5,3 (quick: 0.5,1.5,3).
    #[arg(long, value_delimiter = ',')]
    pub rates: Vec<f64>,
    /// Open loop: the capacity (requests/s of the back-end tier) the `--rates` multiply.
    /// Default: the rule below (back-end CPUs / CPU cost of a request); needed with
    /// `--backend-server nginx`, whose cost per request the lab does not set.
    #[arg(long)]
    pub capacity_rps: Option<f64>,
    /// --hosts netns: CPU quota of every back-end node, percent of one CPU (50 = half a
    /// CPU), in a short CFS period (10 ms, longer only where the quota would be under the
    /// kernel's 1 ms minimum). The quota holds the node's whole cgroup: web server and
    /// gatherer (the gatherer's share is measured and recorded). Default with
    /// --backend-server nginx: the rule below (`--help`), 20 / --backends; with farside's
    /// server: no quota (its cost per request sets its capacity). Recorded in summary.json
    /// (`params.backend_quota`).
    #[arg(long, value_name = "P")]
    pub backend_cpu_quota_pct: Option<u32>,
    /// Response time above which a served request counts as slow (QoS), ms.
    #[arg(long, default_value_t = 1000)]
    pub qos_ms: u64,
    /// Client request timeout, ms (a timeout counts as a failure).
    #[arg(long, default_value_t = 10000)]
    pub timeout_ms: u64,
    /// Seed of the clients' workload samplers; repeat r of a point uses seed + r.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Do not pin tiers to CPUs. By default, with 2+ CPUs, back-end nodes (web server and
    /// gatherer) run on all CPUs but the first and the proxy and clients on the first, so
    /// the back-end tier can be saturated while the front-end is not, as on separate
    /// machines.
    #[arg(long)]
    pub no_pin: bool,
    /// Run every point this many times; summary.json has means and standard deviations
    /// (`runs`, `avg_ms_sd`, `tps_sd`) and the plots error bars (± 1 sd).
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Busy-looping processes per back-end node (the papers' emulated background load;
    /// --hosts netns only, where they run in the node's cgroup).
    #[arg(long, default_value_t = 0)]
    pub background_load: usize,
    /// Clients open one connection per request (as the paper's clients did) instead of
    /// keep-alive.
    #[arg(long)]
    pub no_keepalive: bool,
    /// Serve the farside proxy's live dashboard on ADDR during the run (the first proxy
    /// of each farside system binds its admin listener there, one system after another):
    /// open http://ADDR/ to watch the experiment. --hosts loopback only.
    #[arg(long, value_name = "ADDR")]
    #[serde(skip)]
    pub dashboard: Option<SocketAddr>,
}

/// Refuse scenario settings that cannot be built, naming the flag to change.
pub fn check_scenarios(a: &AdmissionArgs) -> io::Result<()> {
    let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
    if a.scenario.is_empty() {
        return bad("--scenario: name at least one scenario".into());
    }
    if a.scenario.contains(&Scenario::MultiProxy)
        && !(crate::scenario::PROXIES_MIN..=crate::scenario::PROXIES_MAX).contains(&a.proxies)
    {
        return bad(format!(
            "--proxies {}: multi-proxy runs {}..={} proxies",
            a.proxies,
            crate::scenario::PROXIES_MIN,
            crate::scenario::PROXIES_MAX
        ));
    }
    if a.tenant_procs > TENANT_PROCS_MAX {
        return bad(format!(
            "--tenant-procs {}: at most {TENANT_PROCS_MAX} per back-end",
            a.tenant_procs
        ));
    }
    for sc in [Scenario::MixedCost, Scenario::CapacityChange] {
        if a.scenario.contains(&sc) && a.backend_server != BackendServer::Farside {
            return bad(format!(
                "--scenario {}: needs --backend-server farside (its /cgi/work endpoint and \
                 process are what the scenario drives)",
                sc.name()
            ));
        }
    }
    if a.queue_ms == 0 || a.queue_ms > QUEUE_MS_MAX {
        return bad(format!(
            "--queue-ms {}: must be 1..={QUEUE_MS_MAX} (0 would queue without limit in \
             HAProxy)",
            a.queue_ms
        ));
    }
    Ok(())
}

/// Most `--tenant-procs` per back-end: each is a busy loop on the back-end CPUs; beyond
/// this the tenants, not the requests, are the experiment.
pub const TENANT_PROCS_MAX: usize = 16;

/// Largest `--queue-ms`: the farside proxy's `--target-delay-ms` stops at 10 s, and a
/// queueing bound of seconds is no admission control.
pub const QUEUE_MS_MAX: u64 = 10_000;

/// Proxy flags the lab sets itself, with the lab flag that controls each (`--proxy-arg`
/// may not repeat them: the proxy refuses a flag given twice).
const LAB_PROXY_FLAGS: [(&str, &str); 11] = [
    ("--listen", "(chosen by the lab)"),
    ("--workers", "--proxy-workers"),
    ("--monitor-period-us", "--monitor-period-us"),
    ("--monitor-nice", "--control-nice"),
    ("--backend", "--backends, --backend-server"),
    ("--admin-listen", "(chosen by the lab)"),
    ("--admission", "--systems"),
    ("--metric", "--metric"),
    ("--limit", "--limit, --limits"),
    ("--queue-timeout-ms", "--queue-ms"),
    ("--target-delay-ms", "--queue-ms"),
];

/// Refuse `--proxy-arg`s that repeat a flag the lab sets, naming the lab's own flag.
pub fn check_proxy_args(args: &[String]) -> io::Result<()> {
    for a in args {
        let name = a.split('=').next().unwrap_or(a);
        if let Some((_, lab)) = LAB_PROXY_FLAGS.iter().find(|(f, _)| *f == name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--proxy-arg {a}: the lab sets {name} itself; use {lab}"),
            ));
        }
    }
    Ok(())
}

/// Measured and warm-up seconds of each point: the flags, else the full (60 s after 10 s)
/// or quick defaults.
pub fn point_time(a: &AdmissionArgs) -> (f64, f64) {
    let (d, w) = if a.quick {
        (DURATION_S_QUICK, WARMUP_S_QUICK)
    } else {
        (DURATION_S_FULL, WARMUP_S_FULL)
    };
    (a.duration_s.unwrap_or(d), a.warmup_s.unwrap_or(w))
}

/// The rule that sets every system's bounds from `--queue-ms`, and the default
/// `--limit`, as `--help` prints it.
pub const LIMIT_RULE: &str = "\
One operator objective for every system (a rule on --queue-ms Q and the back-end's
capacity, not a tuned value): no request should wait more than Q ms before a back-end
starts on it.
  C   = the back-end's connection capacity: --backend-workers for farside's server
        (Apache's MaxClients), worker_processes x worker_connections for nginx (1 x 1024).
  R_b = one back-end's service rate, requests/s: capacity_rps (below, at the 16 KiB
        reference request) / --backends.
  L_Q = max(1, floor(Q / 1000 x R_b)): the accept queue one back-end drains within Q ms.
  haproxy:          server maxconn = C, timeout queue = Q ms (503 after it).
  every farside proxy: --queue-timeout-ms Q (a request waiting for an upstream
        connection slot gets 503 after Q ms; the proxy's other defaults are kept).
  onesided-ac, tcp-ac:  backlog, pending: limit = L_Q  (at most Q ms of queue at the
        back-end); conns: limit = C + L_Q; cpu, pressure, runnable: no rule, give
        --limit or --limits.
  onesided-delay:   --metric delay, --target-delay-ms = max(1, Q / 2) (the AIMD budget
        oscillates about its target; half the bound leaves room for the overshoot),
        budget cap --limit = C + L_Q.
  Without a capacity rule (nginx without --capacity-rps, or --backend-cpu-us 0):
        L_Q = C, the older rule (one request waiting per worker).
The values used are in summary.json (`params.limits`, `params.limit_rule`,
`params.objective`, `params.objective_rule`, `params.proxy_args_by_system`).

Open-loop capacity (what --rates multiply; a rule, not a measurement):
  capacity_rps = min(back-end CPUs, backends x workers) x 1e6 / cost_us
      back-end CPUs: the CPUs the back-end tier may use (all but the first when
      pinned); cost_us: --backend-cpu-us (mixed-cost: the scenario's mean cost) plus
      --backend-cpu-ns-per-byte x 16,384 bytes (the single trace's object: zipf and
      worldcup requests are smaller or larger on average, so the same rates load them
      differently, which is what the traces are there to show).
  nginx back-ends (the lab does not set nginx's cost per request): calibrated at the
      start of the sweep instead, the back-end tier's saturated throughput for the
      16 KiB reference object: closed loop, 32 clients per back-end sent straight to
      the back-ends (no proxy, no admission) for 2 s after 0.5 s of warm-up
      (`params.calibration`; a resumed sweep keeps the kept run's value). The limit
      rule's R_b above is this value / --backends.
  --capacity-rps R sets it instead (no calibration then).
  The value used is in summary.json (`params.capacity_rps`, `params.capacity_rule`).

Back-end CPU quota (--hosts netns; `params.backend_quota`):
  nginx: each back-end node's cgroup (nginx and its gatherer) gets
      --backend-cpu-quota-pct P = max(1, floor(20 / backends)) % of one CPU by default:
      the whole tier a fifth of a CPU, while the proxy and the clients share the first
      CPU and each does at least a static server's work per request, so nginx inside its
      quota, not the front end, is the bottleneck. The CFS period is 10 ms so a
      throttled node waits ms, not the kernel's 100 ms chunks. The calibration records
      each node's throttling (`params.calibration.nodes`) and warns if the quota never
      bound.
  farside's server: no quota unless --backend-cpu-quota-pct is given; the capacity rule
      above then uses min(back-end CPUs, backends x P / 100) CPUs.";

/// The bounds every system gets from `--queue-ms` ([`LIMIT_RULE`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Objective {
    /// `--queue-ms`: the longest a request should wait before a back-end starts on it.
    pub queue_ms: u64,
    /// L_Q: the accept-queue length one back-end drains within `queue_ms`.
    pub queue_len: u64,
    /// onesided-delay's `--target-delay-ms`.
    pub target_delay_ms: u64,
    /// onesided-delay's budget cap (`--limit`): C + L_Q.
    pub delay_budget_max: u64,
}

impl Objective {
    /// The objective of `a`: `rate_b` is one back-end's service rate (requests/s), `None`
    /// without a capacity rule. Returns it with its derivation as text.
    pub fn derive(a: &AdmissionArgs, rate_b: Option<f64>) -> (Objective, String) {
        let c = capacity_conns(a);
        let q = a.queue_ms;
        let (queue_len, how) = match rate_b {
            Some(r) => {
                let l = ((q as f64 / 1000.0 * r).floor() as u64).max(1);
                (
                    l,
                    format!("L_Q = max(1, floor({q} ms x {r:.1} req/s per back-end)) = {l}"),
                )
            }
            None => (c, format!("L_Q = C = {c} (no capacity rule)")),
        };
        let target = (q / 2).max(1);
        let o = Objective {
            queue_ms: q,
            queue_len,
            target_delay_ms: target,
            delay_budget_max: c + queue_len,
        };
        let rule = format!(
            "Q = --queue-ms {q}; {how}; haproxy: maxconn {c}, timeout queue {q} ms; farside \
             proxies: --queue-timeout-ms {q}; onesided-delay: --target-delay-ms \
             max(1, Q/2) = {target}, --limit C + L_Q = {}",
            o.delay_budget_max
        );
        (o, rule)
    }
}

/// Body bytes of the request the open-loop capacity rule prices: the single trace's 16 KiB
/// object, the paper's reference request.
pub const CAPACITY_REFERENCE_BYTES: u64 = 16_384;

/// The mean CPU cost of a request of `scenario` at the reference object
/// ([`CAPACITY_REFERENCE_BYTES`]), µs: what the capacity rule divides by.
pub fn reference_cost_us(a: &AdmissionArgs, scenario: Scenario) -> f64 {
    crate::scenario::mean_cost_us(scenario, a.backend_cpu_us)
        + a.backend_cpu_ns_per_byte * CAPACITY_REFERENCE_BYTES as f64 / 1000.0
}

/// Share of one CPU the whole back-end tier gets by default with nginx in `--hosts
/// netns`, percent ([`LIMIT_RULE`]): the proxy and the clients share the first CPU and
/// each does at least a static server's work per request, so a tier of a fifth of a CPU
/// stays below what the front end can drive, with room for the proxy's extra copies.
pub const NGINX_TIER_CPU_PCT: u32 = 20;
/// Largest `--backend-cpu-quota-pct`: ten CPUs per node, more than any host this lab runs
/// on has (a larger value is a typo, not a limit).
pub const BACKEND_CPU_QUOTA_PCT_MAX: u32 = 1000;

/// The CPU quota of every back-end node ([`backend_quota`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BackendQuota {
    /// Percent of one CPU per node.
    pub pct: u32,
    /// CFS quota per period, µs.
    pub quota_us: u64,
    /// CFS period, µs ([`crate::fabric::netns::CPU_PERIOD_US`] unless the quota needs longer).
    pub period_us: u64,
    /// What the node's cgroup holds.
    pub covers: String,
    /// How `pct` was chosen.
    pub rule: String,
}

/// The back-end nodes' CPU quota: `--backend-cpu-quota-pct`, else with nginx in
/// `--hosts netns` the default of [`LIMIT_RULE`], else none. Errors: a quota outside
/// 1..=[`BACKEND_CPU_QUOTA_PCT_MAX`], or asked for without `--hosts netns` (loopback has
/// no per-node cgroup: the run would be silently unlimited).
pub fn backend_quota(a: &AdmissionArgs) -> io::Result<Option<BackendQuota>> {
    let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
    let (pct, rule) = match a.backend_cpu_quota_pct {
        Some(p) => {
            if p == 0 || p > BACKEND_CPU_QUOTA_PCT_MAX {
                return bad(format!(
                    "--backend-cpu-quota-pct {p}: must be 1..={BACKEND_CPU_QUOTA_PCT_MAX} (percent of one \
                    CPU per back-end node)"
                ));
            }
            if a.hosts != Hosts::Netns {
                return bad(format!(
                    "--backend-cpu-quota-pct {p}: needs --hosts netns (a per-node cgroup); loopback has \
                    none, so the quota could not be applied"
                ));
            }
            (p, format!("--backend-cpu-quota-pct {p}"))
        }
        None if a.hosts == Hosts::Netns && a.backend_server == BackendServer::Nginx => {
            let p = (NGINX_TIER_CPU_PCT / a.backends.max(1) as u32).max(1);
            (
                p,
                format!(
                    "default for nginx: max(1, floor({NGINX_TIER_CPU_PCT} / {} backends)) = {p} % of one CPU \
                    per node (the tier a fifth of a CPU, below what the proxy and clients on the first CPU \
                    can drive)",
                    a.backends
                ),
            )
        }
        None => return Ok(None),
    };
    let (quota_us, period_us) = crate::fabric::netns::cpu_quota_period(pct);
    Ok(Some(BackendQuota {
        pct,
        quota_us,
        period_us,
        covers: "the back-end node's cgroup: the web server and its gatherer".into(),
        rule,
    }))
}

/// Measured seconds of the calibration run that prices an nginx tier: the tier saturates
/// within ms, and 2 s of 16 KiB requests is thousands of them.
pub const CALIBRATION_S: f64 = 2.0;
/// Warm-up of the calibration run, not measured: connections open, page cache warm.
pub const CALIBRATION_WARMUP_S: f64 = 0.5;
/// Calibration clients per back-end: well above an event-driven nginx's saturation (a
/// few connections keep its worker busy) and far below its 1024 connections.
pub const CALIBRATION_CLIENTS_PER_BACKEND: usize = 32;

/// One back-end node during the calibration run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeCalibration {
    /// `b0`, `b1`, ...
    pub node: String,
    /// The node cgroup's quota as the kernel had it and its throttling during the run
    /// (warm-up included, as the CPU times below).
    pub cpu: crate::fabric::netns::CpuStat,
    /// CPU seconds the web server's processes used during the run.
    pub web_cpu_s: f64,
    /// CPU seconds the gatherer used during the run (inside the same quota).
    pub gatherd_cpu_s: f64,
}

/// The calibration run of an nginx tier ([`LIMIT_RULE`]): `params.calibration`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Calibration {
    /// Requests/s the tier served: the capacity the open loop's `--rates` multiply.
    pub capacity_rps: f64,
    /// The rule as text (`params.capacity_rule`).
    pub rule: String,
    /// Measured seconds.
    pub duration_s: f64,
    /// Warm-up seconds.
    pub warmup_s: f64,
    /// Closed-loop clients in all.
    pub clients: usize,
    /// Body bytes of the object asked for.
    pub object_bytes: u64,
    /// Mean and p99 response time during the run, ms.
    pub avg_ms: f64,
    pub p99_ms: f64,
    /// Per back-end node (netns only).
    pub nodes: Vec<NodeCalibration>,
}

impl Calibration {
    /// Warnings for nodes under a quota that was never hit: then something other than
    /// the quota (the clients' CPU) bounded the tier.
    pub fn warnings(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| !n.cpu.cpu_max.starts_with("max") && n.cpu.nr_throttled == 0)
            .map(|n| {
                format!(
                    "calibration: node {} was never throttled by its CPU quota ({}): the calibrated capacity \
                    may be the clients' limit, not nginx's",
                    n.node, n.cpu.cpu_max
                )
            })
            .collect()
    }
}

/// The back-end's connection capacity C of [`LIMIT_RULE`].
pub fn capacity_conns(a: &AdmissionArgs) -> u64 {
    match a.backend_server {
        BackendServer::Farside => a.backend_workers as u64,
        BackendServer::Nginx => {
            let c = NginxConfig::new(SocketAddr::new(LOCALHOST, 0), "/");
            u64::from(c.worker_processes) * u64::from(c.worker_connections)
        }
    }
}

/// The default limit of [`LIMIT_RULE`] for `metric`, capacity `c` and the queue `L_Q`
/// that drains within `--queue-ms` (`queue_len`), with the rule as text; an error for
/// metrics the rule does not cover.
pub fn default_limit(metric: &str, c: u64, queue_len: u64) -> io::Result<(u64, String)> {
    match metric {
        "backlog" | "pending" => Ok((queue_len, format!("{metric}: limit = L_Q = {queue_len}"))),
        "conns" => Ok((
            c + queue_len,
            format!(
                "conns: limit = C + L_Q = {c} + {queue_len} = {}",
                c + queue_len
            ),
        )),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "--metric {metric}: no default limit (it is not a connection count, so the \
                 capacity rule does not apply); give --limit N or --limits a,b,c"
            ),
        )),
    }
}

/// The open-loop capacity of [`LIMIT_RULE`] in requests/s, with the rule as text:
/// `--capacity-rps`, else the calibrated value and its rule (`calibrated`, nginx), else
/// back-end CPUs (`back_cpus`, at most the quota's) over the mean CPU cost of a request
/// (`cost_us`).
pub fn capacity_rps(
    a: &AdmissionArgs,
    back_cpus: usize,
    cost_us: f64,
    calibrated: Option<&(f64, String)>,
) -> io::Result<(f64, String)> {
    if let Some(r) = a.capacity_rps {
        if !(r.is_finite() && r > 0.0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--capacity-rps {r}: must be a positive number of requests/s"),
            ));
        }
        return Ok((r, format!("--capacity-rps {r}")));
    }
    if let Some((r, rule)) = calibrated {
        return Ok((*r, rule.clone()));
    }
    if a.backend_server == BackendServer::Nginx {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "open loop with --backend-server nginx: the lab does not set nginx's cost per \
             request and no calibration ran; give --capacity-rps R (or --load closed)",
        ));
    }
    if cost_us <= 0.0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "open loop with --backend-cpu-us 0: requests cost no CPU, so there is no capacity \
             rule; give --capacity-rps R (or --load closed)",
        ));
    }
    let cpus = back_cpus.min(a.backends * a.backend_workers).max(1);
    if let Some(q) = backend_quota(a)? {
        let quota_cpus = a.backends as f64 * f64::from(q.pct) / 100.0;
        let c = (cpus as f64).min(quota_cpus);
        let r = c * 1e6 / cost_us;
        return Ok((
            r,
            format!(
                "capacity_rps = min({back_cpus} CPUs, {} workers, {} backends x {} % quota) x \
                 1e6 / {cost_us} us = {r:.0}",
                a.backends * a.backend_workers,
                a.backends,
                q.pct
            ),
        ));
    }
    let r = cpus as f64 * 1e6 / cost_us;
    Ok((
        r,
        format!(
            "capacity_rps = min({back_cpus} CPUs, {} workers) x 1e6 / {cost_us} us = {r:.0}",
            a.backends * a.backend_workers
        ),
    ))
}

/// The lowest nice an unprivileged thread may set: `20 - RLIMIT_NICE` (0 by default).
pub fn nice_floor() -> i32 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut r) } != 0 {
        return 0;
    }
    (20 - r.rlim_cur.min(40) as i32).min(0)
}

/// Whether `--control-nice` takes effect: a negative nice needs root, or an
/// `RLIMIT_NICE` that allows it (`floor` from [`nice_floor`]).
pub fn control_nice_setting(requested: i32, is_root: bool, floor: i32) -> Setting {
    if requested >= 0 || is_root || requested >= floor {
        Setting::applied(requested)
    } else {
        Setting::not_applied(
            requested,
            &format!(
                "nice {requested} needs root or CAP_SYS_NICE (RLIMIT_NICE allows down to {floor}); \
                 the gatherers' samplers and the proxy's monitor run at nice 0"
            ),
        )
    }
}

/// The settings of this run that need privileges or a particular host, as asked for and
/// as they will be applied (`is_root` is a parameter so the unprivileged branch is
/// testable as root).
pub fn privileged_settings(
    a: &AdmissionArgs,
    is_root: bool,
    nice_floor: i32,
    cpus: usize,
) -> BTreeMap<String, Setting> {
    let mut m = BTreeMap::new();
    m.insert(
        "control_nice".into(),
        control_nice_setting(a.control_nice, is_root, nice_floor),
    );
    let netns = a.hosts == Hosts::Netns;
    if a.background_load > 0 {
        m.insert(
            "background_load".into(),
            if netns {
                Setting::applied(a.background_load)
            } else {
                Setting::not_applied(
                    a.background_load,
                    "busy processes run in the back-end nodes' cgroups: --hosts netns only",
                )
            },
        );
    }
    if netns {
        m.insert(
            "cgroups".into(),
            match backend_quota(a).ok().flatten() {
                Some(q) => Setting::applied(format!(
                    "per-node cgroup with a cpuset; back-end nodes (web server and gatherer) \
                     in a CPU quota of {} % of one CPU ({} us every {} us)",
                    q.pct, q.quota_us, q.period_us
                )),
                None => Setting::applied("per-node cgroup with a cpuset (no CPU quota: the back-ends' cost per request and their CPUs set their capacity)"),
            },
        );
        m.insert(
            "rps".into(),
            Setting::applied("receive softirq on each node's CPUs"),
        );
    }
    if a.scenario.contains(&Scenario::TenantLoad) {
        m.insert(
            "tenant_load".into(),
            Setting {
                requested: serde_json::json!(a.tenant_procs),
                applied: true,
                reason: Some(format!(
                    "{} busy process(es) per back-end node ({}), each running and paused \
                     (SIGSTOP/SIGCONT) for exponential times of mean a tenth of the point",
                    a.tenant_procs,
                    if netns {
                        "in the node's cgroup"
                    } else {
                        "on the back-end CPUs"
                    }
                )),
            },
        );
    }
    if a.scenario.contains(&Scenario::CapacityChange) {
        m.insert(
            "capacity_change".into(),
            Setting {
                requested: "b0 at half capacity in the middle third of each point".into(),
                applied: true,
                reason: Some(format!(
                    "SIGSTOP/SIGCONT duty cycle of b0's web server: runs {}% of every {} ms \
                     (no cgroup CPU quota is used, on loopback or netns)",
                    (crate::scenario::DUTY_RUN_FRACTION * 100.0) as u32,
                    crate::scenario::DUTY_PERIOD.as_millis()
                )),
            },
        );
        // The issue's capacity change is a CPU quota that halves; the lab emulates it
        // with the duty cycle above on both hosts, so the quota itself is recorded as
        // not applied (the back-ends share their CPUs, so a quota would have to halve a
        // share that other nodes' load moves: the duty cycle halves it whatever it is).
        m.insert(
            "capacity_change_cpu_quota".into(),
            Setting::not_applied(
                "b0's cgroup CPU quota halved",
                "no cgroup CPU quota is changed (loopback has no per-node cgroup; in netns \
                 the back-ends share a cpuset, so their share is not a fixed quota): the \
                 halving is the SIGSTOP/SIGCONT duty cycle of settings.capacity_change",
            ),
        );
    }
    if !a.no_pin {
        m.insert(
            "pin".into(),
            if cpus >= 2 {
                Setting::applied("proxy and clients on the first CPU, back-ends on the rest")
            } else {
                Setting::not_applied(true, "one CPU: the tiers share it")
            },
        );
    }
    m
}

struct Run {
    logs: PathBuf,
    shm: PathBuf,
    docroot: PathBuf,
}

/// One proxy of a tier (farside's or HAProxy).
struct ProxyProc {
    child: Child,
    addr: SocketAddr,
    /// The farside proxy's admin listener (metrics).
    admin_addr: Option<SocketAddr>,
    /// HAProxy's stats listener (`/stats;csv`).
    stats_addr: Option<SocketAddr>,
}

/// The back-end tier and proxies of one system in one scenario.
struct Tier {
    // Tenants first: they are dropped (killed) before the back-ends they load.
    _tenants: Vec<Child>,
    _tenant_handles: Vec<crate::fabric::netns::LoadHandle>,
    /// Pids of the tenant processes (`tenant-load`), paused and continued per point.
    tenant_pids: Vec<u32>,
    backends: Vec<Child>,
    _nginx: Vec<Nginx>,
    _gatherers: Vec<Child>,
    /// One proxy, or `--proxies` of them (`multi-proxy`).
    proxies: Vec<ProxyProc>,
    /// The back-ends' regions as their gatherers write them (shm files), read by the
    /// lab itself for the back-end queueing delay of every system ([`QueueSampler`]).
    regions: Vec<PathBuf>,
    /// The back-end web servers' addresses (the calibration run's clients go straight
    /// to them).
    backend_addrs: Vec<SocketAddr>,
}

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// CPUs of the front-end tier (proxy, clients) and of the back-end tier.
#[derive(Clone)]
struct Placement {
    front: Option<Vec<usize>>,
    back: Option<Vec<usize>>,
}

fn placement(a: &AdmissionArgs) -> Placement {
    match crate::fabric::procs::Tiers::of(&crate::fabric::procs::allowed_cpus())
        .filter(|_| !a.no_pin)
    {
        Some(t) => Placement {
            front: Some(t.front),
            back: Some(t.back),
        },
        None => Placement {
            front: None,
            back: None,
        },
    }
}

/// Fixed ports of the netns lab (every node has its own address).
const NETNS_WEB_PORT: u16 = 80;
const NETNS_TCP_PORT: u16 = 7001;
const NETNS_UDP_PORT: u16 = 7002;
const NETNS_PROXY_PORT: u16 = 8080;
const NETNS_ADMIN_PORT: u16 = 9100;

/// Where the lab's nodes run.
enum Fabric {
    /// Processes on 127.0.0.1 with free ports, optionally pinned to CPUs.
    Loopback(Placement),
    /// One namespace + cgroup per node (`b0..`, `proxy`, `client`).
    Netns(crate::fabric::netns::VirtualDc),
}

#[derive(Clone, Copy)]
enum Role {
    Backend(usize),
    Proxy,
}

impl Fabric {
    fn node(role: Role) -> String {
        match role {
            Role::Backend(i) => format!("b{i}"),
            Role::Proxy => "proxy".into(),
        }
    }

    /// An address for a server of `role` (a free loopback port, or the node's IP and a
    /// fixed port).
    fn addr(&self, role: Role, netns_port: u16) -> io::Result<SocketAddr> {
        match self {
            Fabric::Loopback(_) => Ok(SocketAddr::new(LOCALHOST, nginx::free_port(LOCALHOST)?)),
            Fabric::Netns(dc) => Ok(SocketAddr::new(
                IpAddr::V4(dc.node_ip(&Self::node(role))),
                netns_port,
            )),
        }
    }

    fn spawn(
        &self,
        role: Role,
        name: &str,
        args: &[String],
        logs: &std::path::Path,
    ) -> io::Result<Child> {
        self.spawn_program(role, name, &std::env::current_exe()?, args, logs)
    }

    /// Start `program args` as the node of `role` (its CPUs, or its namespace).
    fn spawn_program(
        &self,
        role: Role,
        name: &str,
        program: &std::path::Path,
        args: &[String],
        logs: &std::path::Path,
    ) -> io::Result<Child> {
        match self {
            Fabric::Loopback(pl) => {
                let cpus = match role {
                    Role::Backend(_) => pl.back.as_deref(),
                    Role::Proxy => pl.front.as_deref(),
                };
                Child::spawn_pinned(name, program, args, logs, cpus)
            }
            Fabric::Netns(dc) => {
                let log = logs.join(format!("{name}.log"));
                let c = dc.spawn_in(&Self::node(role), program, args, &log)?;
                Ok(Child::adopt(name, c, log))
            }
        }
    }

    /// Wait until `addr` accepts TCP connections, seen from where clients run.
    fn wait_port(&self, child: &mut Child, addr: SocketAddr) -> io::Result<()> {
        match self {
            Fabric::Loopback(_) => child.wait_port(addr),
            Fabric::Netns(dc) => crate::fabric::wait_port(
                child,
                addr,
                crate::fabric::Vantage::Node(dc, "client"),
                crate::fabric::procs::READY_TIMEOUT,
                std::time::Duration::from_millis(20),
            ),
        }
    }

    /// The proxy's metrics, fetched from where clients run.
    fn scrape(&self, admin: SocketAddr) -> io::Result<String> {
        match self {
            Fabric::Loopback(_) => crate::promtext::scrape(admin),
            Fabric::Netns(dc) => dc.run_in_ns("client", || crate::promtext::scrape(admin)),
        }
    }

    /// HAProxy's own timings, fetched from where clients run.
    fn haproxy_times(&self, stats: SocketAddr) -> io::Result<crate::haproxy::Times> {
        match self {
            Fabric::Loopback(_) => crate::haproxy::fetch_times(stats),
            Fabric::Netns(dc) => dc.run_in_ns("client", || crate::haproxy::fetch_times(stats)),
        }
    }

    /// Run the clients (in the client node's namespace for netns, on the front CPUs).
    fn run_clients(
        &self,
        l: &LoadgenArgs,
        cpus: Option<&[usize]>,
    ) -> io::Result<farside_loadgen::Summary> {
        let run = || farside_loadgen::run(l).map_err(|e| io::Error::other(format!("loadgen: {e}")));
        match self {
            Fabric::Loopback(_) => run(),
            Fabric::Netns(dc) => dc.run_in_ns("client", || {
                if let Some(c) = cpus {
                    crate::fabric::procs::pin_current_thread(c)?;
                }
                run()
            }),
        }
    }
}

fn start_tier(
    a: &AdmissionArgs,
    run: &Run,
    scenario: Scenario,
    system: &str,
    limit: Option<u64>,
    objective: &Objective,
    fabric: &Fabric,
) -> io::Result<Tier> {
    let mut backends = Vec::new();
    let mut nginxes = Vec::new();
    let mut gatherers = Vec::new();
    let mut specs = Vec::new();
    let mut addrs = Vec::new();
    let mut regions = Vec::new();
    let netns = matches!(fabric, Fabric::Netns(_));
    for i in 0..a.backends {
        let role = Role::Backend(i);
        let addr = fabric.addr(role, NETNS_WEB_PORT)?;
        match (a.backend_server, fabric) {
            (BackendServer::Farside, _) => {
                let args: Vec<String> = vec![
                    "backend".into(),
                    "--listen".into(),
                    addr.to_string(),
                    "--root".into(),
                    run.docroot.display().to_string(),
                    "--workers".into(),
                    a.backend_workers.to_string(),
                    "--cpu-us-per-request".into(),
                    a.backend_cpu_us.to_string(),
                    "--cpu-ns-per-byte".into(),
                    a.backend_cpu_ns_per_byte.to_string(),
                    "--backlog".into(),
                    BACKEND_BACKLOG.to_string(),
                ];
                let mut c =
                    fabric.spawn(role, &format!("{system}-backend{i}"), &args, &run.logs)?;
                fabric.wait_port(&mut c, addr)?;
                backends.push(c);
            }
            (BackendServer::Nginx, Fabric::Loopback(pl)) => {
                let mut cfg = NginxConfig::new(addr, &run.docroot);
                cfg.backlog = BACKEND_BACKLOG;
                cfg.cpus = pl.back.clone();
                nginxes.push(Nginx::start(&cfg)?);
            }
            (BackendServer::Nginx, Fabric::Netns(dc)) => {
                let mut cfg = NginxConfig::new(addr, &run.docroot);
                cfg.backlog = BACKEND_BACKLOG;
                let node = Fabric::node(role);
                let probe = |a: SocketAddr| {
                    dc.run_in_ns("client", || {
                        Ok(std::net::TcpStream::connect_timeout(
                            &a,
                            std::time::Duration::from_millis(100),
                        )
                        .is_ok())
                    })
                    .unwrap_or(false)
                };
                nginxes.push(Nginx::start_with(
                    &cfg,
                    |cmd| dc.prepare_command(&node, cmd),
                    probe,
                )?);
            }
        }
        let tcp = fabric.addr(role, NETNS_TCP_PORT)?;
        let shm = run.shm.join(format!("{system}-node{i}.region"));
        let mut args: Vec<String> = vec![
            "gatherd".into(),
            "--node-id".into(),
            i.to_string(),
            "--period-us".into(),
            a.gather_period_us.to_string(),
            "--sampler-nice".into(),
            a.control_nice.to_string(),
            "--watch-port".into(),
            addr.port().to_string(),
            "--shm".into(),
            shm.display().to_string(),
            "--tcp-listen".into(),
            tcp.to_string(),
        ];
        let udp = fabric.addr(role, NETNS_UDP_PORT)?;
        if netns {
            // One-sided across hosts: the XDP responder in the back-end node's kernel, in
            // generic mode so RPS steers it onto the node's own CPU (an honest comparison).
            args.extend([
                "--udp-listen".into(),
                udp.to_string(),
                "--xdp-iface".into(),
                crate::fabric::netns::VETH_IN_NS.into(),
            ]);
            args.extend(["--xdp-mode".into(), "generic".into()]);
            // With XDP gatherd's default is the kernel sampler, whose record has backlog,
            // conns, the accept queue's delay and a tick-sampled cpu but no pressure or
            // pending: other metrics keep the user-space sampler.
            if !matches!(system_metric(a, system), "backlog" | "conns" | "delay") {
                args.extend(["--sampler".into(), "user".into()]);
            }
        }
        let mut g = fabric.spawn(role, &format!("{system}-gatherd{i}"), &args, &run.logs)?;
        fabric.wait_port(&mut g, tcp)?;
        g.wait_file(&shm)?;
        gatherers.push(g);
        regions.push(shm.clone());
        let spec = match (system, netns) {
            ("tcp-ac", _) => format!("{addr},region=tcp:{tcp}"),
            ("onesided-ac" | "onesided-delay", false) => {
                format!("{addr},region=shm:{}", shm.display())
            }
            ("onesided-ac" | "onesided-delay", true) => format!("{addr},region=udp:{udp}"),
            _ => addr.to_string(),
        };
        specs.push(spec);
        addrs.push(addr);
    }
    let n_proxies = if scenario == Scenario::MultiProxy {
        a.proxies
    } else {
        1
    };
    let mut proxies = Vec::new();
    for p in 0..n_proxies {
        let name = if n_proxies > 1 {
            format!("{system}-proxy{p}")
        } else {
            format!("{system}-proxy")
        };
        let port_step = p as u16;
        let proxy = if system == "haproxy" {
            start_haproxy(a, run, fabric, &addrs, &name, port_step)?
        } else {
            start_farside_proxy(
                a, run, fabric, system, limit, objective, &specs, &name, port_step,
            )?
        };
        proxies.push(proxy);
    }
    let mut tenants = Vec::new();
    let mut tenant_handles = Vec::new();
    if scenario == Scenario::TenantLoad && a.tenant_procs > 0 {
        for i in 0..a.backends {
            match fabric {
                Fabric::Loopback(pl) => {
                    for t in 0..a.tenant_procs {
                        tenants.push(Child::spawn_pinned(
                            &format!("tenant-b{i}-{t}"),
                            std::path::Path::new("/bin/sh"),
                            &["-c".into(), "while :; do :; done".into()],
                            &run.logs,
                            pl.back.as_deref(),
                        )?);
                    }
                }
                Fabric::Netns(dc) => {
                    tenant_handles.push(dc.start_cpu_load(&format!("b{i}"), a.tenant_procs)?)
                }
            }
        }
    }
    let tenant_pids = tenants
        .iter()
        .map(|c| c.pid())
        .chain(tenant_handles.iter().flat_map(|h| h.pids()))
        .collect();
    Ok(Tier {
        backends,
        _nginx: nginxes,
        _gatherers: gatherers,
        proxies,
        _tenants: tenants,
        _tenant_handles: tenant_handles,
        tenant_pids,
        regions,
        backend_addrs: addrs,
    })
}

/// The calibration run of [`LIMIT_RULE`]: a no-ac tier (back-ends and gatherers as in the
/// sweep, inside their quota), [`CALIBRATION_CLIENTS_PER_BACKEND`] closed-loop clients per
/// back-end sent straight to it (no proxy, no admission) for [`CALIBRATION_S`] after
/// [`CALIBRATION_WARMUP_S`], asking the single trace's 16 KiB object. The capacity is the
/// requests/s served; per node it records the quota's throttling and the CPU time of the
/// web server and of the gatherer.
fn calibrate(
    a: &AdmissionArgs,
    run: &Run,
    fabric: &Fabric,
    front: Option<&[usize]>,
) -> io::Result<Calibration> {
    let (objective, _) = Objective::derive(a, None);
    let tier = start_tier(a, run, Scenario::Single, "no-ac", None, &objective, fabric)?;
    let nodes: Vec<String> = (0..a.backends).map(|i| format!("b{i}")).collect();
    let gatherd_pids: Vec<u32> = tier._gatherers.iter().map(|g| g.pid()).collect();
    type Snap = Vec<(
        crate::fabric::netns::CpuStat,
        Vec<crate::fabric::netns::ProcCpu>,
    )>;
    let snap = || -> io::Result<Snap> {
        match fabric {
            Fabric::Netns(dc) => nodes
                .iter()
                .map(|n| Ok((dc.cpu_stat(n)?, dc.node_procs_cpu(n)?)))
                .collect(),
            Fabric::Loopback(_) => Ok(Vec::new()),
        }
    };
    let mut ls = Vec::new();
    for (i, addr) in tier.backend_addrs.iter().enumerate() {
        let mut l = loadgen_args(
            a,
            *addr,
            "single",
            CALIBRATION_CLIENTS_PER_BACKEND as u64,
            CALIBRATION_S,
            CALIBRATION_WARMUP_S,
        )?;
        // Saturation: no think time, whatever the sweep's.
        l.think_ms = 0;
        l.seed = a
            .seed
            .wrapping_add(GROUP_SEED_STRIDE.wrapping_mul(i as u64));
        ls.push(l);
    }
    let before = snap()?;
    let parts = std::thread::scope(|sc| {
        let handles: Vec<_> = ls
            .iter()
            .map(|l| sc.spawn(|| fabric.run_clients(l, front)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("a calibration client panicked")))
            })
            .collect::<io::Result<Vec<_>>>()
    })?;
    let after = snap()?;
    drop(tier);
    let s = crate::scenario::merge_concurrent(&parts)?;
    let capacity: f64 = parts.iter().map(|p| p.goodput_rps).sum();
    if capacity.is_nan() || capacity <= 0.0 {
        return Err(io::Error::other(format!(
            "calibration: the back-end tier served nothing in {CALIBRATION_S} s ({} failures); see \
            the logs in {}",
            s.failures,
            run.logs.display()
        )));
    }
    let node_cal = nodes
        .iter()
        .zip(before.iter().zip(after.iter()))
        .map(|(n, ((c0, p0), (c1, p1)))| {
            let (mut web, mut gatherd) = (0u64, 0u64);
            for p in p1 {
                let was = p0.iter().find(|q| q.pid == p.pid).map_or(0, |q| q.cpu_us);
                let used = p.cpu_us.saturating_sub(was);
                if gatherd_pids.contains(&p.pid) {
                    gatherd += used;
                } else {
                    web += used;
                }
            }
            NodeCalibration {
                node: n.clone(),
                cpu: c1.since(c0),
                web_cpu_s: web as f64 / 1e6,
                gatherd_cpu_s: gatherd as f64 / 1e6,
            }
        })
        .collect();
    let clients = CALIBRATION_CLIENTS_PER_BACKEND * a.backends;
    Ok(Calibration {
        capacity_rps: capacity,
        rule: format!(
            "calibrated: the back-end tier's saturated throughput for the \
            {CAPACITY_REFERENCE_BYTES}-byte reference object, closed loop, {clients} clients \
            straight to the back-ends (no proxy, no admission) for {CALIBRATION_S} s after \
            {CALIBRATION_WARMUP_S} s = {capacity:.0} req/s"
        ),
        duration_s: CALIBRATION_S,
        warmup_s: CALIBRATION_WARMUP_S,
        clients,
        object_bytes: CAPACITY_REFERENCE_BYTES,
        avg_ms: s.avg_ms,
        p99_ms: s.p99_ms,
        nodes: node_cal,
    })
}

/// Start one HAProxy instance in front of `backends` (see [`crate::haproxy`]).
fn start_haproxy(
    a: &AdmissionArgs,
    run: &Run,
    fabric: &Fabric,
    backends: &[SocketAddr],
    name: &str,
    port_step: u16,
) -> io::Result<ProxyProc> {
    let addr = fabric.addr(Role::Proxy, NETNS_PROXY_PORT + port_step)?;
    let stats = fabric.addr(Role::Proxy, NETNS_ADMIN_PORT + port_step)?;
    let mut cfg = haproxy_config(a, addr, backends);
    cfg.stats_listen = Some(stats.to_string());
    let bin = crate::haproxy::find_binary()?;
    let (_, args) = crate::haproxy::prepare(&bin, &cfg, &run.logs, name)?;
    let mut child = fabric.spawn_program(Role::Proxy, name, &bin, &args, &run.logs)?;
    fabric.wait_port(&mut child, addr)?;
    Ok(ProxyProc {
        child,
        addr,
        admin_addr: None,
        stats_addr: Some(stats),
    })
}

/// The HAProxy configuration of the `haproxy` system: per-server `maxconn` = the
/// back-end's connection capacity C, `--haproxy-timeout-queue-ms`, the proxy's workers.
pub fn haproxy_config(
    a: &AdmissionArgs,
    listen: SocketAddr,
    backends: &[SocketAddr],
) -> crate::haproxy::HaproxyConfig {
    let mut cfg = crate::haproxy::HaproxyConfig::new(listen, backends);
    cfg.maxconn_per_server = capacity_conns(a);
    cfg.timeout_queue_ms = a.queue_ms;
    cfg.timeout_ms = a.timeout_ms;
    cfg.threads = a.proxy_workers;
    cfg
}

/// The admission and queueing flags the lab gives a farside proxy of `system` (after its
/// addresses, workers and monitor flags): what `params.proxy_args_by_system` records.
/// Everything not here (or in `--proxy-arg`) is the proxy's product default.
pub fn objective_proxy_args(
    a: &AdmissionArgs,
    system: &str,
    limit: Option<u64>,
    objective: &Objective,
) -> Vec<String> {
    let mut args = vec!["--queue-timeout-ms".to_string(), a.queue_ms.to_string()];
    match (system, limit) {
        ("onesided-delay", _) => args.extend([
            "--admission".into(),
            "--metric".into(),
            "delay".into(),
            "--target-delay-ms".into(),
            objective.target_delay_ms.to_string(),
            "--limit".into(),
            limit.unwrap_or(objective.delay_budget_max).to_string(),
        ]),
        ("no-ac", _) | (_, None) => {}
        (_, Some(l)) => args.extend([
            "--admission".into(),
            "--metric".into(),
            a.metric.clone(),
            "--limit".into(),
            l.to_string(),
        ]),
    }
    args
}

/// The admission metric the gatherers of `system` serve (`onesided-delay`: the queueing
/// delay, which the netns lab's kernel sampler publishes every tick).
fn system_metric<'a>(a: &'a AdmissionArgs, system: &str) -> &'a str {
    if system == "onesided-delay" {
        "delay"
    } else {
        &a.metric
    }
}

/// Start one farside proxy of `system` in front of the back-ends `specs`.
#[allow(clippy::too_many_arguments)]
fn start_farside_proxy(
    a: &AdmissionArgs,
    run: &Run,
    fabric: &Fabric,
    system: &str,
    limit: Option<u64>,
    objective: &Objective,
    specs: &[String],
    name: &str,
    port_step: u16,
) -> io::Result<ProxyProc> {
    let proxy_addr = fabric.addr(Role::Proxy, NETNS_PROXY_PORT + port_step)?;
    let mut args: Vec<String> = vec![
        "proxy".into(),
        "--listen".into(),
        proxy_addr.to_string(),
        "--workers".into(),
        a.proxy_workers.to_string(),
        "--monitor-period-us".into(),
        a.monitor_period_us.to_string(),
        "--monitor-nice".into(),
        a.control_nice.to_string(),
    ];
    for s in specs {
        args.push("--backend".into());
        args.push(s.clone());
    }
    // The admin listener is not subject to admission: the lab reads the monitor's
    // histograms and the request-duration histogram there while the data port rejects.
    let admin = match a.dashboard {
        // `--dashboard`: the first proxy's admin listener is the one the user watches.
        Some(d) if port_step == 0 => d,
        _ => fabric.addr(Role::Proxy, NETNS_ADMIN_PORT + port_step)?,
    };
    args.extend(["--admin-listen".into(), admin.to_string()]);
    let admin_addr = Some(admin);
    args.extend(objective_proxy_args(a, system, limit, objective));
    // The user's own proxy arguments come last, so they override the lab's.
    args.extend(a.proxy_args.iter().cloned());
    let mut proxy = fabric.spawn(Role::Proxy, name, &args, &run.logs)?;
    fabric.wait_port(&mut proxy, proxy_addr)?;
    if a.dashboard.is_some() && port_step == 0 {
        eprintln!("lab admission: dashboard of {system} ({name}): http://{admin}/");
    }
    Ok(ProxyProc {
        child: proxy,
        addr: proxy_addr,
        admin_addr,
        stats_addr: None,
    })
}

/// Histograms of the proxy's monitor at one moment; two of them bracket a point.
struct MonitorScrape {
    read: crate::promtext::Buckets,
    gap: crate::promtext::Buckets,
    /// `farside_proxy_request_duration_seconds` `_sum` and `_count`.
    duration_sum_s: f64,
    duration_count: f64,
    /// `farside_proxy_upstream_wait_microseconds_total` and `_checkouts_total`.
    wait_us: f64,
    checkouts: f64,
}

/// The value of the unlabelled sample `name` in Prometheus text, 0 when absent.
fn sample_value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

impl MonitorScrape {
    /// `None` (with a warning) when the proxy has no admin listener or does not answer:
    /// the point is still measured, only without the monitor's figures.
    fn take(fabric: &Fabric, tier: &Tier) -> Option<MonitorScrape> {
        // The first proxy's monitor (with `multi-proxy`, the one with the most clients).
        let admin = tier.proxies.first()?.admin_addr?;
        match fabric.scrape(admin) {
            Ok(text) => Some(MonitorScrape {
                read: crate::promtext::buckets(&text, "farside_monitor_read_seconds"),
                gap: crate::promtext::buckets(&text, "farside_monitor_update_gap_seconds"),
                duration_sum_s: sample_value(&text, "farside_proxy_request_duration_seconds_sum"),
                duration_count: sample_value(&text, "farside_proxy_request_duration_seconds_count"),
                wait_us: sample_value(&text, "farside_proxy_upstream_wait_microseconds_total"),
                checkouts: sample_value(&text, "farside_proxy_upstream_checkouts_total"),
            }),
            Err(e) => {
                eprintln!("lab admission: warning: no monitor figures for this point: {e}");
                None
            }
        }
    }

    /// Fill `p`'s monitor figures from the window `before..self`.
    fn fill(&self, before: &MonitorScrape, p: &mut Point) {
        use crate::promtext::{delta, quantile};
        let read = delta(&self.read, &before.read);
        let gap = delta(&self.gap, &before.gap);
        p.monitor_read_p50_us = quantile(&read, 0.50).map(|s| s * 1e6);
        p.monitor_read_p99_us = quantile(&read, 0.99).map(|s| s * 1e6);
        p.update_gap_p99_ms = quantile(&gap, 0.99).map(|s| s * 1e3);
        let checkouts = self.checkouts - before.checkouts;
        if checkouts > 0.0 {
            // Mean wait for an upstream connection slot per request that asked for one.
            p.proxy_queue_ms = Some((self.wait_us - before.wait_us) / checkouts / 1e3);
        }
        let n = self.duration_count - before.duration_count;
        if n > 0.0 {
            p.proxy_time_ms = Some((self.duration_sum_s - before.duration_sum_s) / n * 1e3);
        } else {
            eprintln!(
                "lab admission: warning: the first proxy's request-duration count did not \
                 move during the point: no proxy_time_ms"
            );
        }
    }
}

/// Period of [`QueueSampler`]'s reads: a few per gatherer connection count (every few ms
/// to tens of ms), at a negligible cost (one shm read per back-end).
const QUEUE_SAMPLE_PERIOD: std::time::Duration = std::time::Duration::from_millis(5);
/// Most readings a [`QueueSampler`] keeps: a 60 s point at one new reading per ms from
/// each of 4 back-ends; later readings are dropped (and the figures come from the rest).
const QUEUE_READINGS_MAX: usize = 240_000;

/// Reads the back-ends' published queueing delay (`queue_delay_us`) from their regions
/// while a point runs, keeping each new reading (a new connection count): where served
/// time went at the back-ends, the same measurement whichever proxy runs.
struct QueueSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<u64>>>,
}

impl QueueSampler {
    /// Start reading `regions`, from `skip` (the warm-up) on.
    fn start(regions: &[PathBuf], skip: std::time::Duration) -> QueueSampler {
        use farside_region::layout::{FLAG_QUEUE_DELAY, REGION_WORDS};
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let paths = regions.to_vec();
        let thread = std::thread::spawn(move || {
            let maps: Vec<_> = paths
                .iter()
                // A region file, or gatherd's socket handing out the XDP region map.
                .filter_map(|p| farside_rmem::map_region(p, REGION_WORDS).ok())
                .collect();
            let mut last = vec![0u64; maps.len()];
            let mut out = Vec::new();
            let measure_from = Instant::now() + skip;
            while Instant::now() < measure_from && !s.load(Ordering::Relaxed) {
                std::thread::sleep(QUEUE_SAMPLE_PERIOD);
            }
            while !s.load(Ordering::Relaxed) {
                for (m, l) in maps.iter().zip(&mut last) {
                    let Ok(snap) = farside_region::Snapshot::read_local(m, 4) else {
                        continue;
                    };
                    let r = snap.load;
                    if r.flags & FLAG_QUEUE_DELAY == 0 || r.conns_sampled_mono_ns == *l {
                        continue;
                    }
                    *l = r.conns_sampled_mono_ns;
                    if out.len() < QUEUE_READINGS_MAX {
                        out.push(r.queue_delay_us);
                    }
                }
                std::thread::sleep(QUEUE_SAMPLE_PERIOD);
            }
            out
        });
        QueueSampler {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop and fill `p`'s back-end queueing figures (left empty without readings).
    fn finish(mut self, p: &mut Point) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut v = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        if v.is_empty() {
            return;
        }
        v.sort_unstable();
        let mean = v.iter().sum::<u64>() as f64 / v.len() as f64;
        let i = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
        p.backend_queue_ms = Some(mean / 1e3);
        p.backend_queue_p99_ms = Some(v[i] as f64 / 1e3);
    }
}

impl Drop for QueueSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn trace_kind(t: &str) -> io::Result<TraceKind> {
    Ok(match t {
        "single" => TraceKind::Single,
        "worldcup" => TraceKind::Worldcup,
        "zipf" => TraceKind::Zipf,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--traces: unknown trace `{t}` (single, worldcup, zipf)"),
            ))
        }
    })
}

fn loadgen_args(
    a: &AdmissionArgs,
    target: SocketAddr,
    trace: &str,
    clients: u64,
    duration_s: f64,
    warmup_s: f64,
) -> io::Result<LoadgenArgs> {
    let mut l = LoadgenArgs::new(target.to_string());
    l.trace = trace_kind(trace)?;
    l.paths = PathMode::Docroot;
    l.clients = clients as usize;
    l.duration_s = duration_s;
    l.warmup_s = warmup_s;
    l.think_ms = a.think_ms;
    l.on_reject = Some(a.on_reject);
    l.qos_ms = a.qos_ms;
    l.timeout_ms = a.timeout_ms;
    l.no_keepalive = a.no_keepalive;
    l.keepalive = !a.no_keepalive;
    l.quiet = true;
    Ok(l)
}

fn point(k: &Key, transport: &str, s: &farside_loadgen::Summary) -> Point {
    let mut p = Point {
        system: k.system.clone(),
        trace: k.trace.clone(),
        clients: k.clients.unwrap_or(0),
        limit: k.limit,
        transport: transport.into(),
        runs: 1,
        scenario: k.scenario.name().into(),
        load_model: k.load_model.clone(),
        rate_x: k.rate_x,
        rate_rps: k.rate_x.and(s.rate),
        series: s
            .series
            .iter()
            .map(|x| SecondPoint {
                t_s: x.t_s,
                served: x.served,
                dropped: x.dropped_503 + x.failures,
                avg_ms: x.avg_ms,
            })
            .collect(),
        ..Point::default()
    };
    p.fill_from_loadgen(s);
    p
}

/// Served requests of a loadgen `--out` file as `(start s, response time ms)`, thinned
/// evenly to at most `max` (every k-th served request).
pub fn request_samples(path: &std::path::Path, max: usize) -> io::Result<Vec<(f64, f64)>> {
    let mut r = csv::Reader::from_path(path).map_err(io::Error::other)?;
    let head = r.headers().map_err(io::Error::other)?.clone();
    let col = |name: &str| {
        head.iter().position(|h| h == name).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: no `{name}` column", path.display()),
            )
        })
    };
    let (start, lat, outcome) = (col("start_us")?, col("latency_us")?, col("outcome")?);
    let mut all = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(io::Error::other)?;
        if rec.get(outcome) != Some("served") {
            continue;
        }
        let num = |i: usize| rec.get(i).and_then(|v| v.parse::<f64>().ok());
        if let (Some(s), Some(l)) = (num(start), num(lat)) {
            all.push((s / 1e6, l / 1e3));
        }
    }
    let step = all.len().div_ceil(max.max(1)).max(1);
    Ok(all.into_iter().step_by(step).collect())
}

fn transport_of(system: &str, netns: bool) -> &'static str {
    match (system, netns) {
        ("tcp-ac", _) => "tcp",
        ("onesided-ac" | "onesided-delay", false) => "shm",
        ("onesided-ac" | "onesided-delay", true) => "udp-xdp",
        _ => "none",
    }
}

/// The tier serving (scenario, system, limit) and the back-ends' background load.
type Running = (
    (Scenario, String, Option<u64>),
    Tier,
    Vec<crate::fabric::netns::LoadHandle>,
);

/// Distance between the seeds of a point's client groups (proxies, cost classes), so
/// that no two groups draw the same workload or arrivals, even across repeats.
const GROUP_SEED_STRIDE: u64 = 1_000_003;

/// One point of the sweep: its key in `points.jsonl`.
#[derive(Debug, Clone, serde::Serialize)]
struct Key {
    scenario: Scenario,
    system: String,
    trace: String,
    /// `None` for no-ac.
    limit: Option<u64>,
    /// `closed` or `open`.
    load_model: String,
    /// Closed loop: the number of clients.
    #[serde(skip_serializing_if = "Option::is_none")]
    clients: Option<u64>,
    /// Open loop: the arrival rate as a multiple of the capacity.
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_x: Option<f64>,
}

/// The sweep's keys: per system (and per limit for the admission-controlled ones),
/// per trace, per load model, per client count (closed) or rate (open); one tier is
/// started per (system, limit).
fn keys(
    a: &AdmissionArgs,
    limits: &[u64],
    delay_cap: u64,
    clients: &[u64],
    rates: &[f64],
) -> Vec<Key> {
    let mut out = Vec::new();
    for &scenario in &a.scenario {
        for system in &a.systems {
            let ls: Vec<Option<u64>> = if system == "no-ac" || system == "haproxy" {
                vec![None]
            } else if system == "onesided-delay" {
                // Its budget cap is derived from the objective, never swept.
                vec![Some(delay_cap)]
            } else {
                limits.iter().map(|&l| Some(l)).collect()
            };
            for limit in ls {
                for trace in &a.traces {
                    for model in a.load.models() {
                        let key = |clients, rate_x| Key {
                            scenario,
                            system: system.clone(),
                            trace: trace.clone(),
                            limit,
                            load_model: model.to_string(),
                            clients,
                            rate_x,
                        };
                        if *model == "closed" {
                            out.extend(clients.iter().map(|&c| key(Some(c), None)));
                        } else {
                            out.extend(rates.iter().map(|&r| key(None, Some(r))));
                        }
                    }
                }
            }
        }
    }
    out
}

/// The effective settings of a run: every flag after defaults (what `--resume` compares).
fn effective(
    a: &AdmissionArgs,
    clients: &[u64],
    limits: &[u64],
    rule: &str,
    duration_s: f64,
    warmup_s: f64,
) -> io::Result<serde_json::Value> {
    let mut e = a.clone();
    e.clients = clients.to_vec();
    e.duration_s = Some(duration_s);
    e.warmup_s = Some(warmup_s);
    e.limits = limits.to_vec();
    e.limit = None;
    let mut v = serde_json::to_value(&e).map_err(io::Error::other)?;
    if let Some(m) = v.as_object_mut() {
        m.remove("limit");
        m.insert("limit_rule".into(), rule.into());
        m.insert("capacity_conns".into(), capacity_conns(a).into());
        m.insert("backlog".into(), BACKEND_BACKLOG.into());
        m.insert("keepalive".into(), (!a.no_keepalive).into());
    }
    Ok(v)
}

pub fn run(mut a: AdmissionArgs) -> io::Result<()> {
    let euid = unsafe_euid();
    if a.hosts == Hosts::Netns {
        if a.dashboard.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--dashboard is not supported with --hosts netns yet: the proxy's admin \
                 listener is inside the proxy's namespace (open it from there, e.g. \
                 `ip netns exec NS curl -N http://ADMIN/events`)",
            ));
        }
        crate::fabric::netns::check_root(euid)?;
    }
    if let Some(d) = a.dashboard {
        eprintln!("lab admission: live dashboard at http://{d}/ (while a farside system runs)");
    }
    for s in &a.systems {
        if !SYSTEMS.contains(&s.as_str()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--systems: unknown system `{s}` ({})", SYSTEMS.join(", ")),
            ));
        }
    }
    if a.systems.iter().any(|s| s == "haproxy") {
        crate::haproxy::find_binary()?;
    }
    check_scenarios(&a)?;
    for t in &a.traces {
        trace_kind(t)?;
    }
    check_proxy_args(&a.proxy_args)?;
    let clients: Vec<u64> = if a.clients.is_empty() {
        let list = if a.quick { CLIENTS_QUICK } else { CLIENTS_FULL };
        list.split(',')
            .map(|c| c.parse().expect("literal list"))
            .collect()
    } else {
        a.clients.clone()
    };
    if clients.iter().any(|&c| c == 0 || c > 10_000) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--clients: each count must be 1..=10000",
        ));
    }
    let pl = placement(&a);
    let back_cpus = pl
        .back
        .as_ref()
        .map_or_else(|| crate::fabric::procs::allowed_cpus().len(), |b| b.len());
    let quota = backend_quota(&a)?;
    if a.limit == Some(0) || a.limits.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--limit/--limits: a limit of 0 admits nothing; use 1 or more",
        ));
    }
    let any_ac = a
        .systems
        .iter()
        .any(|s| s == "tcp-ac" || s == "onesided-ac");
    if any_ac && a.limit.is_none() && a.limits.is_empty() {
        // A metric without a default limit fails here, before namespaces and calibration.
        default_limit(&a.metric, 1, 1)?;
    }
    let rates: Vec<f64> = if a.rates.is_empty() {
        let list = if a.quick { RATES_QUICK } else { RATES_FULL };
        list.split(',')
            .map(|r| r.parse().expect("literal list"))
            .collect()
    } else {
        a.rates.clone()
    };
    if rates.iter().any(|&r| !(r > 0.0 && r <= RATE_X_MAX)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--rates: each multiple of the capacity must be in (0, {RATE_X_MAX}]"),
        ));
    }
    let (duration_s, warmup_s) = point_time(&a);
    let dir = a.resume.clone().unwrap_or_else(|| a.out.clone());
    let netns = a.hosts == Hosts::Netns;
    let run = Run {
        logs: dir.join("logs"),
        shm: PathBuf::from(format!("/dev/shm/farside-lab-{}", std::process::id())),
        docroot: std::env::temp_dir().join(format!("farside-lab-docroot-{}", std::process::id())),
    };
    std::fs::create_dir_all(&run.logs)?;
    std::fs::create_dir_all(&run.shm)?;
    let _cleanup = Cleanup(vec![run.shm.clone(), run.docroot.clone()]);
    {
        let dirs = vec![run.shm.clone(), run.docroot.clone()];
        crate::fabric::procs::on_interrupt(move || {
            for d in &dirs {
                let _ = std::fs::remove_dir_all(d);
            }
        });
    }
    for t in &a.traces {
        let l = loadgen_args(&a, "127.0.0.1:1".parse().expect("literal"), t, 1, 1.0, 0.0)?;
        let trace = l
            .build_trace()
            .map_err(|e| io::Error::other(e.to_string()))?;
        farside_loadgen::write_docroot(&trace, &run.docroot)?;
    }

    if let (Some(f), Some(b)) = (&pl.front, &pl.back) {
        eprintln!("lab admission: proxy and clients on CPU {f:?}, back-end nodes on CPUs {b:?} (--no-pin to share)");
    }
    let fabric = if netns {
        use crate::fabric::netns::{NodeSpec, VirtualDc};
        let node = |name: &str, c: &Option<Vec<usize>>| NodeSpec::new(name).pinned(c.as_deref());
        let mut nodes: Vec<NodeSpec> = (0..a.backends)
            .map(|i| {
                let n = node(&format!("b{i}"), &pl.back);
                match &quota {
                    Some(q) => n.cpu_quota_pct(q.pct),
                    None => n,
                }
            })
            .collect();
        nodes.push(node("proxy", &pl.front));
        nodes.push(node("client", &pl.front));
        let dc = VirtualDc::create(&format!("a{}", std::process::id() % 100_000), &nodes)?;
        let id = dc.run_id().to_string();
        crate::fabric::procs::on_interrupt(move || {
            if let Ok(r) = crate::fabric::netns::clean_run_id(&id) {
                eprint!("{r}");
            }
        });
        eprintln!(
            "lab admission: {} nodes in network namespaces on 10.77.0.0/24",
            nodes.len()
        );
        Fabric::Netns(dc)
    } else {
        if let Some(f) = &pl.front {
            // Clients run in this process: pin it (threads created from now on inherit it).
            crate::fabric::procs::pin_current_thread(f)?;
        }
        Fabric::Loopback(pl.clone())
    };

    if let Some(q) = &quota {
        eprintln!(
            "lab admission: back-end nodes in a CPU quota of {} % of one CPU each ({} us every \
             {} us; {})",
            q.pct, q.quota_us, q.period_us, q.rule
        );
    }
    // nginx's capacity is measured, not ruled: the calibration run (or the kept run's
    // value when resuming, so that the settings still match).
    let mut calibration: Option<serde_json::Value> = None;
    let mut calibration_notes = Vec::new();
    if a.backend_server == BackendServer::Nginx && a.capacity_rps.is_none() {
        if a.resume.is_some() {
            let kept: Summary<Point> = crate::sweep::read_summary(&dir)?;
            calibration = kept.params.get("calibration").cloned();
        } else {
            eprintln!(
                "lab admission: calibrating the nginx tier's capacity ({} clients, {CALIBRATION_S} s)",
                CALIBRATION_CLIENTS_PER_BACKEND * a.backends
            );
            let c = calibrate(&a, &run, &fabric, pl.front.as_deref())?;
            eprintln!("lab admission: {}", c.rule);
            for w in c.warnings() {
                eprintln!("lab admission: warning: {w}");
                calibration_notes.push(w);
            }
            calibration = Some(serde_json::to_value(&c).map_err(io::Error::other)?);
        }
    }
    let calibrated: Option<(f64, String)> = calibration.as_ref().and_then(|c| {
        Some((
            c.get("capacity_rps")?.as_f64()?,
            c.get("rule")?.as_str()?.to_string(),
        ))
    });
    // The operator's objective, from --queue-ms and one back-end's service rate at the
    // reference request (the same for every scenario: an operator sets it once).
    let rate_b = capacity_rps(
        &a,
        back_cpus,
        reference_cost_us(&a, Scenario::Single),
        calibrated.as_ref(),
    )
    .ok()
    .map(|(r, _)| r / a.backends.max(1) as f64);
    let (objective, objective_rule) = Objective::derive(&a, rate_b);
    let (limits, rule) = if !a.limits.is_empty() {
        (a.limits.clone(), "--limits".to_string())
    } else if let Some(l) = a.limit {
        (vec![l], "--limit".to_string())
    } else if any_ac {
        let (l, rule) = default_limit(&a.metric, capacity_conns(&a), objective.queue_len)?;
        (vec![l], format!("default: {rule}"))
    } else {
        (
            Vec::new(),
            "none (no limit-driven admission control)".to_string(),
        )
    };
    let open = a.load != LoadModels::Closed;
    // The open loop's capacity per scenario (mixed-cost's requests cost more on average).
    let mut capacities: BTreeMap<&'static str, (f64, String)> = BTreeMap::new();
    let mut open_skipped = None;
    if open {
        for sc in a.scenario.clone() {
            match capacity_rps(
                &a,
                back_cpus,
                reference_cost_us(&a, sc),
                calibrated.as_ref(),
            ) {
                Ok(c) => {
                    capacities.insert(sc.name(), c);
                }
                // The default `--load both` without a capacity rule (nginx, or no CPU
                // cost): the closed loop still runs, and the summary says why the open
                // loop did not. An explicit `--load open` is an error.
                Err(e) if a.load == LoadModels::Both => {
                    open_skipped = Some(e.to_string());
                    capacities.clear();
                    a.load = LoadModels::Closed;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
    }
    let open = a.load != LoadModels::Closed;
    let mut meta = Summary::new(
        "admission",
        if netns { "netns" } else { "loopback" },
        a.quick,
    );
    crate::sweep::fill_host_metadata(&mut meta);
    meta.seed = Some(a.seed);
    meta.params = effective(&a, &clients, &limits, &rule, duration_s, warmup_s)?;
    if let Some(m) = meta.params.as_object_mut() {
        m.insert(
            "rates".into(),
            serde_json::json!(if open { rates.clone() } else { Vec::new() }),
        );
        m.insert("load_models".into(), serde_json::json!(a.load.models()));
        // nginx's calibrated capacity is recorded in closed-loop runs too: the limit rule's
        // R_b comes from it.
        if let Some((r, rule)) = capacities.values().next().or(calibrated.as_ref()) {
            m.insert("capacity_rps".into(), serde_json::json!(r));
            m.insert("capacity_rule".into(), rule.clone().into());
        }
        if capacities.len() > 1 {
            let by: serde_json::Map<String, serde_json::Value> = capacities
                .iter()
                .map(|(k, (r, _))| (k.to_string(), serde_json::json!(r)))
                .collect();
            m.insert("capacity_rps_by_scenario".into(), by.into());
        }
        m.insert(
            "backend_quota".into(),
            serde_json::to_value(&quota).map_err(io::Error::other)?,
        );
        if let Some(c) = &calibration {
            m.insert("calibration".into(), c.clone());
        }
        m.insert(
            "objective".into(),
            serde_json::to_value(&objective).map_err(io::Error::other)?,
        );
        m.insert("objective_rule".into(), objective_rule.clone().into());
        // What the lab passes each farside proxy beyond addresses, workers and monitor
        // flags (the rest is the product's defaults, or --proxy-arg, appended after).
        let by: serde_json::Map<String, serde_json::Value> = a
            .systems
            .iter()
            .filter(|s| *s != "haproxy")
            .map(|s| {
                let limit = match s.as_str() {
                    "no-ac" => None,
                    "onesided-delay" => Some(objective.delay_budget_max),
                    _ => limits.first().copied(),
                };
                let mut v = objective_proxy_args(&a, s, limit, &objective);
                v.extend(a.proxy_args.iter().cloned());
                (s.clone(), serde_json::json!(v))
            })
            .collect();
        m.insert("proxy_args_by_system".into(), by.into());
        if a.systems.iter().any(|s| s == "haproxy") {
            let cfg = haproxy_config(
                &a,
                SocketAddr::new(LOCALHOST, 0),
                &vec![SocketAddr::new(LOCALHOST, 0); a.backends],
            );
            m.insert("haproxy_config".into(), cfg.symbolic().render().into());
        }
    }
    meta.settings = privileged_settings(
        &a,
        euid == 0,
        nice_floor(),
        crate::fabric::procs::allowed_cpus().len(),
    );
    if let Some(why) = open_skipped {
        meta.settings
            .insert("open_loop".into(), Setting::not_applied("both", &why));
    }
    meta.notes.extend(calibration_notes);
    if a.quick {
        meta.notes.push(format!(
            "quick run: {duration_s} s points after {warmup_s} s of warm-up, for demos; not for comparison"
        ));
    }
    let mut sweep = Sweep::<Admission>::start(&dir, meta, a.resume.is_some())?;

    let keys = keys(&a, &limits, objective.delay_budget_max, &clients, &rates);
    let heaviest = clients.iter().copied().max().unwrap_or(0);
    // The running tier and its background load, for the (system, limit) it serves.
    let mut current: Option<Running> = None;
    sweep.run(
        &keys,
        a.repeat,
        duration_s + warmup_s + 0.5,
        |k| {
            let limit = k.limit.map(|l| format!(" limit={l}")).unwrap_or_default();
            let load = match (k.clients, k.rate_x) {
                (Some(c), _) => format!("clients={c:<4}"),
                (_, Some(x)) => format!("rate={x}x"),
                _ => String::new(),
            };
            format!("{:<12} {:<8}{limit} {load}", k.system, k.trace)
        },
        |k, r| {
            let want = (k.scenario, k.system.clone(), k.limit);
            if current.as_ref().map(|c| &c.0) != Some(&want) {
                // One tier at a time: the old one stops before the new one starts.
                current = None;
                let tier = start_tier(
                    &a, &run, k.scenario, &k.system, k.limit, &objective, &fabric,
                )?;
                let busy = match &fabric {
                    Fabric::Netns(dc) if a.background_load > 0 => (0..a.backends)
                        .map(|i| dc.start_cpu_load(&format!("b{i}"), a.background_load))
                        .collect::<io::Result<Vec<_>>>()?,
                    _ => Vec::new(),
                };
                current = Some((want, tier, busy));
            }
            let (_, tier, _) = current.as_mut().expect("tier started above");
            let seed = a.seed.wrapping_add(u64::from(r));
            let rate = match (k.rate_x, capacities.get(k.scenario.name())) {
                (Some(x), Some((cap, _))) => Some(x * cap),
                _ => None,
            };
            let groups = crate::scenario::client_groups(
                k.scenario,
                tier.proxies.len(),
                k.clients.unwrap_or(0),
                rate,
            );
            // Per-request records only at the heaviest load: Fig. 6 shows that one, and a
            // 60 s point at every load would keep megabytes per point.
            let keep_requests = k.clients == Some(heaviest)
                || (k.rate_x.is_some() && k.rate_x == rates.iter().copied().reduce(f64::max));
            let mut ls = Vec::new();
            for (i, g) in groups.iter().enumerate() {
                let mut l = loadgen_args(
                    &a,
                    tier.proxies[g.proxy].addr,
                    &k.trace,
                    g.clients.max(1),
                    duration_s,
                    warmup_s,
                )?;
                // Each group draws its own workload and arrivals.
                l.seed = seed.wrapping_add(GROUP_SEED_STRIDE.wrapping_mul(i as u64));
                if g.dynamic {
                    l.trace = TraceKind::Single;
                    l.file_path = format!(
                        "/cgi/work?us={}",
                        a.backend_cpu_us * crate::scenario::MIXED_COST_FACTOR
                    );
                }
                if rate.is_some() {
                    l.rate = Some(g.rate);
                    l.open_users_max = OPEN_USERS_MAX;
                }
                l.out = keep_requests.then(|| run.logs.join(format!("requests-{i}.csv")));
                ls.push(l);
            }
            let before = MonitorScrape::take(&fabric, tier);
            let queues =
                QueueSampler::start(&tier.regions, std::time::Duration::from_secs_f64(warmup_s));
            // The scenario's disturbance runs beside the clients, and stops (continuing
            // every process it paused) when the point ends, however it ends.
            let disturbance = match k.scenario {
                Scenario::TenantLoad if !tier.tenant_pids.is_empty() => {
                    Some(crate::scenario::Disturbance::tenants(
                        tier.tenant_pids.clone(),
                        crate::scenario::tenant_mean_s(duration_s),
                        seed,
                    ))
                }
                Scenario::CapacityChange => {
                    let pid = tier.backends.first().map(|b| b.pid()).ok_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "--scenario capacity-change needs --backend-server farside",
                        )
                    })?;
                    Some(crate::scenario::Disturbance::half_speed(
                        pid,
                        std::time::Duration::from_secs_f64(warmup_s + duration_s / 3.0),
                        std::time::Duration::from_secs_f64(duration_s / 3.0),
                    ))
                }
                _ => None,
            };
            let parts = std::thread::scope(|sc| {
                let handles: Vec<_> = ls
                    .iter()
                    .map(|l| sc.spawn(|| fabric.run_clients(l, pl.front.as_deref())))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(io::Error::other("a client group panicked")))
                    })
                    .collect::<io::Result<Vec<_>>>()
            })?;
            drop(disturbance);
            let s = crate::scenario::merge_concurrent(&parts)?;
            for p in &mut tier.proxies {
                p.child.check_alive()?;
            }
            let mut p = point(k, transport_of(&k.system, netns), &s);
            if let (Some(b), Some(after)) = (before, MonitorScrape::take(&fabric, tier)) {
                after.fill(&b, &mut p);
            }
            queues.finish(&mut p);
            if let Some(st) = tier.proxies.first().and_then(|p| p.stats_addr) {
                match fabric.haproxy_times(st) {
                    Ok(t) => {
                        p.proxy_queue_ms = Some(t.queue_ms);
                        p.proxy_time_ms = Some(t.queue_ms + t.connect_ms + t.response_ms);
                    }
                    Err(e) => eprintln!("lab admission: warning: no HAProxy timings: {e}"),
                }
            }
            let mut samples = Vec::new();
            for l in &ls {
                let Some(path) = &l.out else { continue };
                match request_samples(path, REQUEST_SAMPLES_MAX / ls.len().max(1)) {
                    Ok(v) => samples.extend(v),
                    Err(e) => eprintln!("lab admission: warning: no per-request samples: {e}"),
                }
                let _ = std::fs::remove_file(path);
            }
            samples.sort_by(|a, b| a.0.total_cmp(&b.0));
            p.requests = samples;
            Ok(p)
        },
    )?;
    drop(current);
    sweep.finish()?;
    Ok(())
}

/// Removes the run's temporary directories when the run ends, however it ends.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

fn unsafe_euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: AdmissionArgs,
    }

    fn args(line: &str) -> AdmissionArgs {
        Cli::try_parse_from(std::iter::once("lab").chain(line.split_whitespace()))
            .unwrap()
            .a
    }

    #[test]
    fn dashboard_flag_parses_and_netns_is_refused_clearly() {
        assert_eq!(args("").dashboard, None);
        let a = args("--dashboard 127.0.0.1:9101");
        assert_eq!(a.dashboard, Some("127.0.0.1:9101".parse().unwrap()));
        assert!(Cli::try_parse_from(["lab", "--dashboard", "nowhere"]).is_err());
        // Refused before anything starts (and before the root check).
        let e = run(args("--hosts netns --dashboard 127.0.0.1:9101")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(
            e.to_string()
                .contains("--dashboard is not supported with --hosts netns"),
            "{e}"
        );
    }

    #[test]
    fn default_limit_follows_the_capacity_rule() {
        // farside's server: C = workers.
        let a = args("");
        assert_eq!(capacity_conns(&a), 16);
        assert_eq!(default_limit("backlog", 16, 12).unwrap().0, 12);
        assert_eq!(default_limit("pending", 16, 12).unwrap().0, 12);
        assert_eq!(default_limit("conns", 16, 12).unwrap().0, 28);
        assert_eq!(capacity_conns(&args("--backend-workers 40")), 40);
        // nginx: worker_processes x worker_connections.
        assert_eq!(capacity_conns(&args("--backend-server nginx")), 1024);
        // Metrics that are not connection counts have no default: a clear error.
        let e = default_limit("cpu", 16, 12).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("give --limit N or --limits"), "{e}");
        // The rule is in --help.
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("backlog, pending: limit = L_Q"), "{help}");
        assert!(help.contains("--queue-ms"), "{help}");
    }

    #[test]
    fn one_queue_bound_sets_every_systems_limits() {
        // 50 ms at 253 requests/s per back-end: 12 requests drain within the bound.
        let a = args("");
        assert_eq!(a.queue_ms, 50);
        let (o, rule) = Objective::derive(&a, Some(253.2));
        assert_eq!(
            o,
            Objective {
                queue_ms: 50,
                queue_len: 12,
                target_delay_ms: 25,
                delay_budget_max: 28
            }
        );
        assert!(
            rule.contains("timeout queue 50 ms") && rule.contains("= 12"),
            "{rule}"
        );
        // A tight bound still admits one waiting request; no capacity rule: L_Q = C.
        let (o, _) = Objective::derive(&args("--queue-ms 1"), Some(253.2));
        assert_eq!((o.queue_len, o.target_delay_ms), (1, 1));
        assert_eq!(Objective::derive(&a, None).0.queue_len, 16);
        // The same Q reaches HAProxy and every farside proxy; the old flag still works.
        let a = args("--haproxy-timeout-queue-ms 20");
        assert_eq!(a.queue_ms, 20);
        let (o, _) = Objective::derive(&a, Some(500.0));
        let cfg = haproxy_config(&a, "127.0.0.1:1".parse().unwrap(), &[]);
        assert_eq!(cfg.timeout_queue_ms, 20);
        let v = objective_proxy_args(&a, "no-ac", None, &o);
        assert_eq!(v, ["--queue-timeout-ms", "20"]);
        let v = objective_proxy_args(&a, "onesided-ac", Some(o.queue_len), &o);
        assert_eq!(
            v.join(" "),
            "--queue-timeout-ms 20 --admission --metric backlog --limit 10"
        );
        let v = objective_proxy_args(&a, "onesided-delay", Some(o.delay_budget_max), &o);
        assert_eq!(
            v.join(" "),
            "--queue-timeout-ms 20 --admission --metric delay --target-delay-ms 10 --limit 26"
        );
        // The lab's own flags cannot be given again through --proxy-arg.
        assert!(check_proxy_args(&["--queue-timeout-ms=5".into()]).is_err());
        assert!(check_scenarios(&args("--queue-ms 0")).is_err());
    }

    #[test]
    fn negative_nice_without_root_is_recorded_not_applied() {
        let a = args("");
        assert_eq!(a.control_nice, -20);
        // Forced "not root" branch, default RLIMIT_NICE (floor 0).
        let m = privileged_settings(&a, false, 0, 4);
        let s = &m["control_nice"];
        assert!(!s.applied);
        assert_eq!(s.requested, serde_json::json!(-20));
        assert!(s.reason.as_deref().unwrap().contains("needs root"), "{s:?}");
        // Root, or an RLIMIT_NICE that allows it: applied.
        assert!(privileged_settings(&a, true, 0, 4)["control_nice"].applied);
        assert!(control_nice_setting(-20, false, -20).applied);
        assert!(!control_nice_setting(-20, false, -10).applied);
        assert!(control_nice_setting(0, false, 0).applied);
        // Background load asked for on loopback is not applied either; one CPU: no pinning.
        let m = privileged_settings(&args("--background-load 2"), true, 0, 1);
        assert!(!m["background_load"].applied);
        assert!(!m["pin"].applied);
        // netns records its isolation as applied.
        let m = privileged_settings(&args("--hosts netns"), true, 0, 4);
        assert!(m["cgroups"].applied && m["rps"].applied && m["pin"].applied);
    }

    #[test]
    fn effective_settings_hold_every_flag_after_defaults() {
        let a = args("--quick --proxy-arg=--pool-idle=0 --proxy-arg --stale-after-ms=50");
        assert_eq!(a.proxy_args, ["--pool-idle=0", "--stale-after-ms=50"]);
        check_proxy_args(&a.proxy_args).unwrap();
        let e = check_proxy_args(&["--workers=2".to_string()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--proxy-arg --workers=2: the lab sets --workers itself; use --proxy-workers"
        );
        let v = effective(
            &a,
            &[4],
            &[16],
            "default: backlog: limit = C = 16",
            6.0,
            1.0,
        )
        .unwrap();
        for k in [
            "hosts",
            "quick",
            "systems",
            "traces",
            "clients",
            "duration_s",
            "warmup_s",
            "limits",
            "limit_rule",
            "metric",
            "control_nice",
            "proxy_args",
            "seed",
            "repeat",
            "capacity_conns",
        ] {
            assert!(v.get(k).is_some(), "missing {k}: {v}");
        }
        // The output directory is not a setting: resuming in another place is fine.
        assert!(v.get("out").is_none() && v.get("resume").is_none());
        assert_eq!(
            v["proxy_args"],
            serde_json::json!(["--pool-idle=0", "--stale-after-ms=50"])
        );
        assert_eq!(v["backend_server"], "farside");
        // --resume names the directory: an --out beside it would be ambiguous.
        assert!(Cli::try_parse_from(["lab", "--resume", "a", "--out", "b"]).is_err());
    }

    #[test]
    fn full_points_are_the_papers_scale_and_quick_is_short() {
        assert_eq!(point_time(&args("")), (60.0, 10.0));
        assert_eq!(point_time(&args("--quick")), (6.0, 1.0));
        assert_eq!(point_time(&args("--quick --duration-s 3")), (3.0, 1.0));
        // no-ac once, each admission system once per limit.
        let a = args("--systems no-ac,tcp-ac,onesided-delay --traces single --load closed");
        let k = keys(&a, &[2, 8], 30, &[4], &[1.0]);
        let names: Vec<(String, Option<u64>)> =
            k.iter().map(|k| (k.system.clone(), k.limit)).collect();
        assert_eq!(
            names,
            vec![
                ("no-ac".into(), None),
                ("tcp-ac".into(), Some(2)),
                ("tcp-ac".into(), Some(8)),
                ("onesided-delay".into(), Some(30))
            ]
        );
    }

    #[test]
    fn nginx_in_netns_gets_a_quota_by_rule_and_the_flag_needs_netns() {
        // The default: the tier a fifth of a CPU, split over the back-ends, short period.
        let q = backend_quota(&args("--hosts netns --backend-server nginx"))
            .unwrap()
            .unwrap();
        assert_eq!((q.pct, q.quota_us, q.period_us), (10, 1_000, 10_000));
        assert!(q.rule.starts_with("default for nginx"), "{}", q.rule);
        let q = backend_quota(&args("--hosts netns --backend-server nginx --backends 4"))
            .unwrap()
            .unwrap();
        assert_eq!((q.pct, q.quota_us, q.period_us), (5, 1_000, 20_000));
        let q = backend_quota(&args("--hosts netns --backend-server nginx --backends 40"))
            .unwrap()
            .unwrap();
        assert_eq!(q.pct, 1);
        // The flag overrides, also for farside's server; without it farside has none.
        let q = backend_quota(&args("--hosts netns --backend-cpu-quota-pct 30"))
            .unwrap()
            .unwrap();
        assert_eq!((q.pct, q.quota_us, q.period_us), (30, 3_000, 10_000));
        assert_eq!(backend_quota(&args("--hosts netns")).unwrap(), None);
        assert_eq!(
            backend_quota(&args("--backend-server nginx")).unwrap(),
            None
        );
        // Never a silent unlimited run: loopback has no per-node cgroup.
        let e = backend_quota(&args("--backend-cpu-quota-pct 30")).unwrap_err();
        assert!(e.to_string().contains("needs --hosts netns"), "{e}");
        let e = backend_quota(&args("--hosts netns --backend-cpu-quota-pct 0")).unwrap_err();
        assert!(e.to_string().contains("1..="), "{e}");
        // The settings say so.
        let s = privileged_settings(&args("--hosts netns --backend-server nginx"), true, 0, 2);
        let text = s["cgroups"].requested.to_string();
        assert!(
            text.contains("10 % of one CPU (1000 us every 10000 us)"),
            "{text}"
        );
    }

    #[test]
    fn calibration_warns_when_the_quota_never_bound() {
        let node = |name: &str, cpu_max: &str, throttled| NodeCalibration {
            node: name.into(),
            cpu: crate::fabric::netns::CpuStat {
                cpu_max: cpu_max.into(),
                nr_periods: 200,
                nr_throttled: throttled,
                throttled_us: 0,
            },
            web_cpu_s: 0.2,
            gatherd_cpu_s: 0.01,
        };
        let mut c = Calibration {
            capacity_rps: 1000.0,
            rule: String::new(),
            duration_s: CALIBRATION_S,
            warmup_s: CALIBRATION_WARMUP_S,
            clients: 64,
            object_bytes: CAPACITY_REFERENCE_BYTES,
            avg_ms: 1.0,
            p99_ms: 2.0,
            nodes: vec![node("b0", "1000 10000", 150), node("b1", "max 10000", 0)],
        };
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
        c.nodes.push(node("b2", "1000 10000", 0));
        let w = c.warnings();
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("node b2 was never throttled"), "{w:?}");
    }

    #[test]
    fn both_load_models_are_swept_by_default_with_rates_of_the_capacity() {
        let a = args("--systems no-ac --traces single");
        assert_eq!(a.load, LoadModels::Both);
        assert_eq!(a.on_reject, OnReject::Backoff);
        let k = keys(&a, &[16], 30, &[4, 8], &[0.5, 3.0]);
        let got: Vec<(String, Option<u64>, Option<f64>)> = k
            .iter()
            .map(|k| (k.load_model.clone(), k.clients, k.rate_x))
            .collect();
        assert_eq!(
            got,
            vec![
                ("closed".into(), Some(4), None),
                ("closed".into(), Some(8), None),
                ("open".into(), None, Some(0.5)),
                ("open".into(), None, Some(3.0)),
            ]
        );
        // The capacity rule: back-end CPUs (at most one per worker) over the CPU cost.
        let (r, rule) = capacity_rps(&args(""), 3, 1500.0, None).unwrap();
        assert!((r - 2000.0).abs() < 1e-9, "{r}");
        assert!(rule.contains("1e6 / 1500"), "{rule}");
        let (r, _) =
            capacity_rps(&args("--backends 1 --backend-workers 2"), 8, 1000.0, None).unwrap();
        assert!((r - 2000.0).abs() < 1e-9, "two workers cap it: {r}");
        assert_eq!(
            capacity_rps(&args("--capacity-rps 300"), 3, 1.0, None)
                .unwrap()
                .0,
            300.0
        );
        let e = capacity_rps(&args("--backend-server nginx"), 3, 1500.0, None).unwrap_err();
        assert!(e.to_string().contains("--capacity-rps"), "{e}");
        // nginx: the calibrated capacity, unless --capacity-rps overrides it.
        let cal = (1234.0, "calibrated: ...".to_string());
        let n = args("--backend-server nginx");
        assert_eq!(capacity_rps(&n, 3, 1500.0, Some(&cal)).unwrap(), cal);
        let n = args("--backend-server nginx --capacity-rps 300");
        assert_eq!(capacity_rps(&n, 3, 1500.0, Some(&cal)).unwrap().0, 300.0);
        // farside's server under a quota: the quota's CPUs bound the rule's.
        let q = args("--hosts netns --backends 2 --backend-cpu-quota-pct 25");
        let (r, rule) = capacity_rps(&q, 3, 1000.0, None).unwrap();
        assert!((r - 500.0).abs() < 1e-9, "2 x 25 % of a CPU at 1 ms: {r}");
        assert!(rule.contains("25 % quota"), "{rule}");
        // The closed loop follows --on-reject; the deprecated fixed pause is gone.
        let l = loadgen_args(
            &args("--on-reject leave"),
            "127.0.0.1:1".parse().unwrap(),
            "single",
            4,
            1.0,
            0.0,
        )
        .unwrap();
        assert_eq!(l.effective_on_reject(), OnReject::Leave);
        assert_eq!(l.reject_think_ms, None);
        let l = loadgen_args(&a, "127.0.0.1:1".parse().unwrap(), "single", 4, 1.0, 0.0).unwrap();
        assert_eq!(l.effective_on_reject(), OnReject::Backoff);
    }

    #[test]
    fn request_samples_keep_served_requests_thinned() {
        let dir = std::env::temp_dir().join(format!("farside-req-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.csv");
        let mut text = String::from("start_us,latency_us,status,bytes,outcome\n");
        for i in 0..100u64 {
            let outcome = if i % 10 == 0 { "dropped" } else { "served" };
            text += &format!("{},{},200,10,{outcome}\n", i * 1000, 2000 + i);
        }
        std::fs::write(&path, text).unwrap();
        let v = request_samples(&path, 30).unwrap();
        assert!(v.len() <= 30 && v.len() >= 20, "{}", v.len());
        assert_eq!(v[0], (0.001, 2.001));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
