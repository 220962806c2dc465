//! `farside lab speculative`: seed 002's speculative connection admission experiment:
//! the baselines and the speculative systems.
//!
//! Topology (`--hosts netns`, root): namespaces `client`, `fe` and the back-ends `b0`
//! (and `b1` for the `split` experiment) on one bridge. `fe` runs `farside frontend`
//! (the blind eBPF front-end, L2 direct server return, docs/frontend.md) on its `eth0`;
//! the service's VIP ([`VIP`]) is on every back-end's `lo` (arp_ignore=1,
//! arp_announce=2) and the client routes it to `fe`. Every back-end node is a cgroup
//! with a CPU quota (`--node-cpu-pct`) running `farside backend` with the point's
//! accept queue (`--backlog`) and an emulated CPU cost per request
//! (`--cpu-us-per-request`), so that one node's capacity is well below what the client
//! can offer. Capacity per node: [`capacity_rps`] (a formula), and measured once per run
//! (closed loop straight at `b0`, stated in `notes`).
//!
//! Load (`--load open|closed|both`, default both): S-Clients-like open loop,
//! `farside loadgen` with Poisson arrivals at each `--rates` value, and a closed loop of
//! `--clients` users, each starting its next connection when the last one ended. Every
//! connection carries one `GET` of a 4 KB file (`Connection: close`). The open loop's
//! clients are S-Clients (`--timeout-ms`, connect included, and the connect timeout
//! `--connect-timeout-ms`, 500 ms: a SYN a full queue dropped is never retried); the
//! closed loop's users are clients of real hosts (`--closed-timeout-ms`, 20 s, and no
//! connect timeout by default: the user's kernel retransmits a dropped SYN on the same
//! 4-tuple, as a browser's or curl's does). A connection refused, reset or timed out
//! counts as failed.
//!
//! Experiments: `single` (one server, accept queues `--accept-queues` 64/96/128, systems
//! `acc64`, `acc96`, `acc128`: Fig. 1) and `split` (two servers behind the front-end at
//! `--splits` 67/33 and 75/25, `--systems` `acc64`: normal processing, `spec32` /
//! `spec50`: speculative admission, Fig. 2/3; default `acc64,spec32`, the comparison).
//! For a `specN` point every back-end runs
//! `farside backend --adopt-socket` and `farside specd` (source and target: admission
//! window N on the base accept queue 64, the other back-end as its one peer, migrated
//! flows moved at the front-end's control port); [`specd_args`] builds its command
//! line, and its exit summary fills the point's migration figures ([`SpecdFigures`]).

use crate::fabric::flags::Hosts;
use crate::fabric::flags::SweepFlags;
use crate::fabric::netns::{NodeSpec, VirtualDc};
use crate::fabric::procs::Child;
use crate::svg::Chart;
use farside_loadgen::LoadgenArgs;

mod lab;
mod point;
mod report;
#[cfg(test)]
mod tests;

pub use lab::*;
pub use point::*;
pub use report::*;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The experiments.
pub const EXPERIMENTS: [&str; 2] = ["single", "split"];
/// The speculative systems (admission window 32 and 50 on a base accept queue of 64),
/// run by `farside specd` on every back-end.
pub const SPEC_SYSTEMS: [&str; 2] = ["spec32", "spec50"];
/// The paper's accept queues of Fig. 1.
pub const ACCEPT_QUEUES: [u32; 3] = [64, 96, 128];
/// The default `--systems` of the split experiment: the baseline (normal processing on
/// the base accept queue) and the proposed system (speculative admission, the paper's
/// window 32 on the same queue), so that a default run is the comparison.
pub const DEFAULT_SYSTEMS: &str = "acc64,spec32";
/// The paper's base accept queue (normal processing `acc64`).
pub const BASE_ACCEPT_QUEUE: u32 = 64;
/// The paper's routing splits (Fig. 2: 67/33, Fig. 3: 75/25).
pub const SPLITS: [&str; 2] = ["67/33", "75/25"];
/// The `split` value of the single-server experiment (every flow to `b0`).
pub const SPLIT_SINGLE: &str = "100";
/// Offered rates of a full run, as multiples of one node's capacity.
pub const RATE_MULTIPLES_FULL: [f64; 6] = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0];
/// Offered rates of `--quick`, as multiples of one node's capacity.
pub const RATE_MULTIPLES_QUICK: [f64; 3] = [0.5, 1.5, 3.0];
/// Closed-loop users of a full run (`--clients`), as multiples of the base accept queue
/// ([`BASE_ACCEPT_QUEUE`], 64): at 1x the single server's queue holds every user; at 4x
/// (256) users outnumber what both nodes of a pair hold (two queues of 64 and two
/// admission windows of at most 50, plus 16 workers), so some always wait on a SYN.
pub const CLIENT_MULTIPLES_FULL: [u32; 3] = [1, 2, 4];
/// Closed-loop users of `--quick`, as multiples of the base accept queue: the middle
/// of the full run's, where b0's queue and window are full and b1 is not (the count at
/// which normal processing and speculative admission were measured to differ most). `--quick`
/// with the defaults: 28 points (12 single, 16 split); its 20 without spec32 took 2 min
/// 7 s here.
pub const CLIENT_MULTIPLES_QUICK: [u32; 1] = [2];
/// Most closed-loop users of one point (`farside loadgen --clients` allows more; the
/// client namespace shares the machine with the nodes it loads).
pub const CLIENTS_MAX: u32 = 4096;
/// Highest offered rate, connections/s: the client namespace shares the machine with
/// everything else, and far past that it measures itself, not the servers.
pub const RATE_MAX: f64 = 20_000.0;
/// Default CPU quota of each back-end node, percent of one CPU: two nodes take 40 % of
/// one CPU, leaving the rest of the machine to the client, the front-end and the lab, so
/// the clients can offer 3× one node's capacity without being the bottleneck.
pub const NODE_CPU_PCT_DEFAULT: u32 = 20;
/// The back-end's own CPU per small-file request, µs, on top of
/// `--cpu-us-per-request` (`farside backend --help`: 28–33 µs measured here).
pub const BACKEND_OWN_US: f64 = 30.0;
/// Size of the file every connection asks for (S-Clients' index.html, ~4 KB).
pub const FILE_BYTES: usize = 4096;
/// The path every request asks for.
pub const FILE_PATH: &str = "/index.html";
/// The service's virtual address (outside the lab's subnet; routed to `fe`).
pub const VIP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 77, 1, 100), 80);
/// The front-end's control port (used here to know it is up, and by `farside specd
/// --frontend` to move migrated flows).
const FE_CONTROL_PORT: u16 = 7400;
/// `farside specd --listen` port on every back-end's cluster address (migration offers
/// over TCP, notifications over UDP).
pub const SPECD_PORT: u16 = 7000;
/// Each `specN` back-end's gatherd: its region over udp, answered by XDP in the node's
/// kernel (the peers' one-sided load reads), and a tcp port the lab waits on.
pub const REGION_UDP_PORT: u16 = 7471;
const GATHERD_TCP_PORT: u16 = 7472;
/// Largest admission window of a `specN` system (`farside specd --window` bound).
pub const SPEC_WINDOW_MAX: u32 = 4096;
/// What `farside specd` logs once its listeners are up (and steering attached).
const SPECD_READY: &str = "specd: migrations on";
/// Longest wait for a process to listen, or for the VIP to answer through the front-end.
const READY_MAX: Duration = Duration::from_secs(20);
/// Poll period while waiting.
const POLL: Duration = Duration::from_millis(20);
/// Warm-up of the calibration run before it is measured (first flows, first
/// throttling).
const WARMUP_S: f64 = 1.0;
/// Default warm-up of every point before it is measured (`--warmup-s`), s. Rule: twice
/// the time the busiest node's accept queue takes to fill at the split experiment's
/// knee, rounded up: `b0` at 75/25 and ~172 conn/s offered takes 0.75 x 172 and serves
/// ~88, so its queue of 64 fills in 64 / (129 - 88) = 1.6 s, and until then `b1` gets
/// no migrated connections. Measured: with 1 s of warm-up the first measured
/// second of a 75/25 point served 131-150 connections, the next 19 seconds 165-172 on
/// average; the single server's first second was within the spread of its others
/// (docs/results/speculative/s23/ct1s).
pub const POINT_WARMUP_S_DEFAULT: f64 = 3.0;
/// Longest `--warmup-s`.
const POINT_WARMUP_S_MAX: f64 = 60.0;
/// The clients' connection establishment timeout, ms (`--connect-timeout-ms`): the
/// paper's S-Clients abandon a connection not established within T = 500 ms (Banga
/// and Druschel, "Measuring the Capacity of a Web Server", USITS '97, §5), so that TCP's
/// SYN retransmission never feeds a server's drops back into the offered load.
pub const S_CLIENT_CONNECT_TIMEOUT_MS: u64 = 500;
// Below the kernel's first SYN retransmission (TCP_TIMEOUT_INIT, 1 s), or a dropped SYN
// would be sent again before the client gives up.
const _: () = assert!(S_CLIENT_CONNECT_TIMEOUT_MS < 1000);
/// Default client timeout of the closed loop, ms (`--closed-timeout-ms`). Rule: a
/// closed loop's users are the clients of real hosts, not S-Clients; their kernels
/// retransmit a dropped SYN on the same 4-tuple at 1, 3, 7 and 15 s (TCP_TIMEOUT_INIT
/// doubling, RFC 6298), so 20 s lets a user's fifth SYN and its answer in before it
/// gives up (Linux itself gives up at 127 s). S-Clients' 500 ms abandon exists to keep an
/// open loop's offered rate independent of the servers (Banga and Druschel); in a
/// closed loop it makes each abandoned user start again from a new port, which the
/// front-end hashes anew, so a blind split rebalances itself through its failures
/// (measured: normal processing +15 % at 4 x the queue's users).
pub const CLOSED_TIMEOUT_MS_DEFAULT: u64 = 20_000;
/// Longest client timeout (`--timeout-ms`, `--closed-timeout-ms`), ms: past the point
/// where Linux gives a connect up at its default SYN retries (tcp_syn_retries 6: 127 s).
pub const TIMEOUT_MS_MAX: u64 = 130_000;
/// Calibration of one node's capacity: closed loop straight at `b0` for this long
/// (after [`WARMUP_S`]), with [`CALIBRATION_CLIENTS`] clients (enough to keep its
/// workers busy and its accept queue non-empty).
const CALIBRATION_S: f64 = 2.0;
const CALIBRATION_CLIENTS: usize = 16;

/// `farside lab speculative`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Capacity of one back-end node (what the default --rates multiply; \
a formula, not a measurement):
  capacity_rps = node_cpu_pct / 100 x 1e6 / (cpu_us_per_request + 30)
  (30 µs: farside backend's own work per small file). The run also measures it once,
  closed loop straight at b0 for 2 s, and states both in summary.json `notes`."
)]
pub struct SpeculativeArgs {
    /// Output directory (summary.json, points.jsonl, table.txt, speculative.csv, SVG
    /// figures, logs/).
    #[arg(long, default_value = "out/speculative")]
    pub out: PathBuf,
    #[command(flatten)]
    pub sweep: SweepFlags,
    /// Where the nodes run: netns only (root: one namespace per node, a cgroup with a
    /// CPU quota per back-end, the eBPF front-end on its own node).
    #[arg(long, value_enum, default_value_t = Hosts::Netns)]
    pub hosts: Hosts,
    /// Experiments (comma-separated): single (one server, accept queues
    /// --accept-queues: Fig. 1), split (two servers at --splits: Fig. 2/3).
    #[arg(long, value_delimiter = ',', default_value = "single,split")]
    pub experiment: Vec<String>,
    /// Systems of the split experiment (comma-separated): accN (normal processing, accept
    /// queue N), specW (speculative admission, window W on accept queue 64: spec32 and
    /// spec50 are the paper's; `farside specd` on every back-end), specWg (the same
    /// with `specd --gate-peer-load`: the peer's load read one-sidedly before offering).
    /// Default acc64,spec32: the paper's comparison, normal processing against
    /// speculative admission on the same base accept queue of 64.
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_SYSTEMS)]
    pub systems: Vec<String>,
    /// Accept queues of the single experiment (systems accN).
    #[arg(long, value_delimiter = ',', default_value = "64,96,128")]
    pub accept_queues: Vec<u32>,
    /// Routing splits of the split experiment, percent of new flows to b0/b1.
    #[arg(long, value_delimiter = ',', default_value = "67/33,75/25")]
    pub splits: Vec<String>,
    /// Offered connection rates, connections/s (comma-separated). Default: 0.5, 1, 1.5,
    /// 2, 2.5, 3 × one node's capacity (--quick: 0.5, 1.5, 3).
    #[arg(long, value_delimiter = ',')]
    pub rates: Vec<f64>,
    /// Load models measured: open (S-Clients-like arrivals at --rates, the paper's
    /// load), closed (--clients users, each waiting for its answer before its next
    /// connection) or both (closed first). Default both: every comparison is shown in
    /// both models (a closed loop slows its own arrivals when the servers slow down).
    #[arg(long, value_enum, default_value_t = crate::fabric::flags::LoadModels::Both)]
    pub load: crate::fabric::flags::LoadModels,
    /// Closed-loop users per point (comma-separated). Default: 64, 128, 256 (1, 2 and 4
    /// × the base accept queue; --quick: 128).
    #[arg(long, value_delimiter = ',')]
    pub clients: Vec<u32>,
    /// Measured time per point, s (after the warm-up). Default 20 (--quick: 3).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Warm-up of every point before it is measured, s: long enough for the split's
    /// busiest node to fill its accept queue, so the window sees the steady state
    /// (rule: `POINT_WARMUP_S_DEFAULT` in the source). Default 3.
    #[arg(long, default_value_t = POINT_WARMUP_S_DEFAULT)]
    pub warmup_s: f64,
    /// Open loop: client timeout per connection (connect, request and response), ms: a
    /// connection not answered by then counts as failed (at most 130000).
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
    /// Open loop: clients abandon a connection attempt not established within this many
    /// ms (`connect_timeouts`), as the paper's S-Clients do (Banga and Druschel, USITS
    /// '97: T = 500 ms). Below the kernel's first SYN retransmission (1 s), a SYN that a
    /// full accept queue dropped is never sent again, so the offered rate is the rate
    /// set, whatever the servers drop. 0: off (a dropped SYN is retried after 1 s,
    /// within --timeout-ms).
    #[arg(long, default_value_t = S_CLIENT_CONNECT_TIMEOUT_MS)]
    pub connect_timeout_ms: u64,
    /// Closed loop: client timeout per connection, ms (at most 130000). Default 20000:
    /// a user's kernel sends its fifth SYN at 15 s (rule: CLOSED_TIMEOUT_MS_DEFAULT in
    /// the source).
    #[arg(long, default_value_t = CLOSED_TIMEOUT_MS_DEFAULT)]
    pub closed_timeout_ms: u64,
    /// Closed loop: users abandon a connection attempt not established within this many
    /// ms and start again from a new port. Default 0 (off): the user's kernel
    /// retransmits a dropped SYN on the same 4-tuple, as a browser's or curl's does;
    /// 500 gives S-Clients users (a fresh port per attempt).
    #[arg(long, default_value_t = 0)]
    pub closed_connect_timeout_ms: u64,
    /// Source port of each client connection (`farside loadgen --source-ports`):
    /// `random` (the default) draws it uniformly, as connections from many client
    /// hosts would come, so the front-end's split of new flows does not depend on one
    /// host's port allocator; `kernel` lets the client namespace's kernel choose (it
    /// reuses ports within a run: ~10 % of SYNs at 3x found their 4-tuple in the flow
    /// table, and one host's allocator split 80 / 20 at 75 / 25 where `random` splits
    /// 75 / 25).
    #[arg(long, value_enum, default_value_t = farside_loadgen::SourcePorts::Random)]
    pub source_ports: farside_loadgen::SourcePorts,
    /// CPU quota of each back-end node, percent of one CPU. Default: 20 (see
    /// NODE_CPU_PCT_DEFAULT: two nodes take 40 % of a CPU, the clients the rest).
    #[arg(long)]
    pub node_cpu_pct: Option<u32>,
    /// Emulated CPU per request on the back-ends, µs (`farside backend
    /// --cpu-us-per-request`): sets, with the quota, one node's capacity.
    #[arg(long, default_value_t = 2000)]
    pub cpu_us_per_request: u64,
    /// Worker threads of each back-end (connections served at once; the rest wait in
    /// the accept queue).
    #[arg(long, default_value_t = 8)]
    pub backend_workers: usize,
    /// Seed of the Poisson arrivals; run r of a point (`--repeat`) uses seed + r.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Do not pin the tiers to CPUs. By default, with 2+ CPUs, the back-end nodes (and
    /// their receive softirq, by RPS) run on all CPUs but the first and the client and
    /// front-end on the first, as in lab admission: the back-end tier can be saturated
    /// while the front is not, as on separate machines, and where the scheduler puts a
    /// node's threads from run to run no longer decides what a migration costs.
    #[arg(long)]
    pub no_pin: bool,
    /// Run every point this many times (1..=REPEAT_MAX): a point's conn/s is then
    /// served over measured time of all its runs, counts are summed (`runs` in each
    /// point), and a single run's noise (1-4 % here) no longer decides a peak.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
}

/// Most runs per point (`--repeat`): ten 20 s runs of each of the full run's 42 points
/// already take over two hours.
pub const REPEAT_MAX: u32 = 10;

/// One node's capacity, connections/s: its CPU quota over the CPU one request costs
/// (`--cpu-us-per-request` plus [`BACKEND_OWN_US`]).
pub fn capacity_rps(node_cpu_pct: u32, cpu_us_per_request: u64) -> f64 {
    node_cpu_pct as f64 / 100.0 * 1e6 / (cpu_us_per_request as f64 + BACKEND_OWN_US)
}

/// Parse a split `a/b` (percent of new flows to b0 and b1, each ≥ 1).
pub fn parse_split(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("--splits {s}: expected two shares like 75/25, each at least 1");
    let (a, b) = s.split_once('/').ok_or_else(bad)?;
    let a: u32 = a.trim().parse().map_err(|_| bad())?;
    let b: u32 = b.trim().parse().map_err(|_| bad())?;
    if a == 0 || b == 0 {
        return Err(bad());
    }
    Ok((a, b))
}

/// A system's accept queue (`accN` → N) and admission window (`spec32`, `spec50` → the
/// base queue 64 and that window).
pub fn parse_system(s: &str) -> Result<(u32, Option<u32>), String> {
    if let Some(n) = s.strip_prefix("acc") {
        return match n.parse::<u32>() {
            Ok(q) if q >= 1 => Ok((q, None)),
            _ => Err(format!(
                "--systems: `{s}`: accN needs an accept queue N ≥ 1"
            )),
        };
    }
    if let Some(w) = s.strip_prefix("spec") {
        let w = w.strip_suffix('g').unwrap_or(w);
        if let Ok(w) = w.parse::<u32>() {
            if (1..=SPEC_WINDOW_MAX).contains(&w) {
                return Ok((BASE_ACCEPT_QUEUE, Some(w)));
            }
            return Err(format!(
                "--systems: `{s}`: specW needs an admission window W in 1..={SPEC_WINDOW_MAX}"
            ));
        }
    }
    Err(format!(
        "--systems: unknown system `{s}` (accN, {})",
        SPEC_SYSTEMS.join(", ")
    ))
}

/// Whether system `s` is a gated speculative one (`specWg`: `farside specd
/// --gate-peer-load`, the peer's load read one-sidedly before every offer).
pub fn system_gated(s: &str) -> bool {
    s.starts_with("spec") && s.ends_with('g')
}

/// The checked settings of a run.
struct Plan {
    /// Open-loop rates; empty without the open loop.
    rates: Vec<f64>,
    /// Closed-loop users per point; empty without the closed loop.
    clients: Vec<u32>,
    duration_s: f64,
    warmup_s: f64,
    quota: u32,
    capacity: f64,
    nodes: usize,
    /// The tiers' CPUs (`None`: `--no-pin`, or one CPU).
    tiers: Option<crate::fabric::procs::Tiers>,
}

/// `--{prefix}timeout-ms` in 1..=[`TIMEOUT_MS_MAX`] and `--{prefix}connect-timeout-ms`
/// off (0) or below it.
fn check_timeouts(prefix: &str, timeout_ms: u64, connect_timeout_ms: u64) -> io::Result<()> {
    let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    if !(1..=TIMEOUT_MS_MAX).contains(&timeout_ms) {
        return Err(bad(format!(
            "--{prefix}timeout-ms {timeout_ms}: must be in 1..={TIMEOUT_MS_MAX}"
        )));
    }
    if connect_timeout_ms >= timeout_ms {
        return Err(bad(format!(
            "--{prefix}connect-timeout-ms {connect_timeout_ms}: below --{prefix}timeout-ms \
             ({timeout_ms}), or 0 (off)"
        )));
    }
    Ok(())
}

fn check_args(a: &SpeculativeArgs) -> io::Result<Plan> {
    let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    if a.hosts != Hosts::Netns {
        return Err(bad(format!(
            "--hosts {}: lab speculative runs on netns only (the eBPF front-end routes by \
             MAC on a LAN of namespaces, and each back-end needs its own CPU quota)",
            a.hosts.as_str()
        )));
    }
    if a.repeat == 0 || a.repeat > REPEAT_MAX {
        return Err(bad(format!("--repeat {}: 1..={REPEAT_MAX}", a.repeat)));
    }
    if a.experiment.is_empty() {
        return Err(bad("--experiment: at least one (single, split)".into()));
    }
    for e in &a.experiment {
        if !EXPERIMENTS.contains(&e.as_str()) {
            return Err(bad(format!(
                "--experiment: unknown experiment `{e}` ({})",
                EXPERIMENTS.join(", ")
            )));
        }
    }
    let split = a.experiment.iter().any(|e| e == "split");
    if split {
        if a.systems.is_empty() {
            return Err(bad("--systems: at least one".into()));
        }
        for s in &a.systems {
            parse_system(s).map_err(bad)?;
        }
        if a.splits.is_empty() {
            return Err(bad("--splits: at least one".into()));
        }
        for s in &a.splits {
            parse_split(s).map_err(bad)?;
        }
    }
    if a.experiment.iter().any(|e| e == "single")
        && (a.accept_queues.is_empty() || a.accept_queues.contains(&0))
    {
        return Err(bad("--accept-queues: at least one, each ≥ 1".into()));
    }
    let quota = a.node_cpu_pct.unwrap_or(NODE_CPU_PCT_DEFAULT);
    if quota == 0 || quota > 100 {
        return Err(bad(format!("--node-cpu-pct {quota}: 1..=100")));
    }
    let capacity = capacity_rps(quota, a.cpu_us_per_request);
    let rates: Vec<f64> = if !a.rates.is_empty() {
        a.rates.clone()
    } else if a.sweep.quick {
        RATE_MULTIPLES_QUICK.iter().map(|m| m * capacity).collect()
    } else {
        RATE_MULTIPLES_FULL.iter().map(|m| m * capacity).collect()
    };
    if rates
        .iter()
        .any(|&r| !(r.is_finite() && r > 0.0 && r <= RATE_MAX))
    {
        return Err(bad(format!(
            "--rates: every rate in (0, {RATE_MAX}] connections/s (default rates: \
             lower --cpu-us-per-request or --node-cpu-pct)"
        )));
    }
    let models = a.load.models();
    let rates = if models.contains(&"open") {
        rates
    } else {
        Vec::new()
    };
    let clients: Vec<u32> = if !models.contains(&"closed") {
        Vec::new()
    } else if !a.clients.is_empty() {
        a.clients.clone()
    } else if a.sweep.quick {
        CLIENT_MULTIPLES_QUICK
            .iter()
            .map(|m| m * BASE_ACCEPT_QUEUE)
            .collect()
    } else {
        CLIENT_MULTIPLES_FULL
            .iter()
            .map(|m| m * BASE_ACCEPT_QUEUE)
            .collect()
    };
    if clients.iter().any(|&c| c == 0 || c > CLIENTS_MAX) {
        return Err(bad(format!("--clients: every count in 1..={CLIENTS_MAX}")));
    }
    let duration_s = a
        .duration_s
        .unwrap_or(if a.sweep.quick { 3.0 } else { 20.0 });
    if !(duration_s.is_finite() && duration_s > 0.0) {
        return Err(bad(format!("--duration-s {duration_s}: must be positive")));
    }
    check_timeouts("", a.timeout_ms, a.connect_timeout_ms)?;
    check_timeouts("closed-", a.closed_timeout_ms, a.closed_connect_timeout_ms)?;
    if a.backend_workers == 0 {
        return Err(bad("--backend-workers: at least 1".into()));
    }
    if !(a.warmup_s.is_finite() && (0.0..=POINT_WARMUP_S_MAX).contains(&a.warmup_s)) {
        return Err(bad(format!(
            "--warmup-s {}: must be in 0..={POINT_WARMUP_S_MAX}",
            a.warmup_s
        )));
    }
    Ok(Plan {
        rates,
        clients,
        duration_s,
        warmup_s: a.warmup_s,
        quota,
        capacity,
        nodes: if split { 2 } else { 1 },
        tiers: crate::fabric::procs::Tiers::of(&crate::fabric::procs::allowed_cpus())
            .filter(|_| !a.no_pin),
    })
}

/// One point's key.
#[derive(Serialize, Debug, Clone)]
struct Key {
    experiment: String,
    system: String,
    split: String,
    /// Open loop: the offered rate; 0 in the closed loop.
    rate: f64,
    /// Closed loop: the users (`None`: open loop; absent from the keys of runs before
    /// the closed loop, which `--resume` still matches).
    #[serde(skip_serializing_if = "Option::is_none")]
    clients: Option<u32>,
}

/// What a run's clients offer: Poisson arrivals at a rate (open loop), or users each
/// waiting for its answer before its next connection (closed loop).
#[derive(Clone, Copy, Debug)]
enum Offer {
    Rate(f64),
    Clients(usize),
}

impl Key {
    fn offer(&self) -> Offer {
        match self.clients {
            Some(c) => Offer::Clients(c as usize),
            None => Offer::Rate(self.rate),
        }
    }

    /// The progress label's load: `clients=64` or `rate=172.4`.
    fn load_label(&self) -> String {
        match self.clients {
            Some(c) => format!("clients={c}"),
            None => format!("rate={:.1}", self.rate),
        }
    }
}

fn point_keys(a: &SpeculativeArgs, plan: &Plan) -> Vec<Key> {
    let mut keys = Vec::new();
    for e in &a.experiment {
        let lines: Vec<(String, String)> = if e == "single" {
            a.accept_queues
                .iter()
                .map(|q| (format!("acc{q}"), SPLIT_SINGLE.to_string()))
                .collect()
        } else {
            a.splits
                .iter()
                .flat_map(|sp| a.systems.iter().map(move |s| (s.clone(), sp.clone())))
                .collect()
        };
        for (system, split) in lines {
            // Closed loop first, as lab admission does.
            for &c in &plan.clients {
                keys.push(Key {
                    experiment: e.clone(),
                    system: system.clone(),
                    split: split.clone(),
                    rate: 0.0,
                    clients: Some(c),
                });
            }
            for &rate in &plan.rates {
                keys.push(Key {
                    experiment: e.clone(),
                    system: system.clone(),
                    split: split.clone(),
                    rate,
                    clients: None,
                });
            }
        }
    }
    keys
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Run `farside lab speculative`.
pub fn run(a: SpeculativeArgs) -> io::Result<()> {
    let plan = check_args(&a)?;
    // SAFETY: geteuid has no preconditions.
    crate::fabric::netns::check_root(unsafe { libc::geteuid() }).map_err(|_| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "lab speculative needs root: it builds a network namespace per node, a cgroup \
             with a CPU quota per back-end, and attaches the eBPF front-end (--hosts netns)",
        )
    })?;
    let dir = a.sweep.dir(&a.out);
    let mut meta = crate::summary::Summary::new("speculative", a.hosts.as_str(), a.sweep.quick);
    crate::sweep::fill_host_metadata(&mut meta);
    meta.seed = Some(a.seed);
    meta.params = serde_json::json!({
        "experiments": a.experiment,
        "systems": a.systems,
        "accept_queues": a.accept_queues,
        "splits": a.splits,
        "load_models": a.load.models(),
        "rates": plan.rates,
        "clients": plan.clients,
        "clients_rule": if a.clients.is_empty() {
            "1, 2 and 4 x the base accept queue (64; --quick: 2): from every user held by one node's queue to more users than a pair's queues and windows hold"
        } else {
            "--clients"
        },
        "duration_s": plan.duration_s,
        "warmup_s": plan.warmup_s,
        "timeout_ms": a.timeout_ms,
        "connect_timeout_ms": a.connect_timeout_ms,
        "connect_timeout_rule": "open loop: S-Clients' connection establishment timeout T (Banga and Druschel, USITS '97: 500 ms), below the kernel's 1 s SYN retransmission",
        "closed_timeout_ms": a.closed_timeout_ms,
        "closed_connect_timeout_ms": a.closed_connect_timeout_ms,
        "closed_timeout_rule": "closed loop: users of real hosts, whose kernels retransmit a dropped SYN on the same 4-tuple at 1, 3, 7, 15 s; 20 s lets the fifth SYN and its answer in (0: no connect timeout)",
        "source_ports": a.source_ports.as_str(),
        "source_ports_rule": "random: each connection as from a client host of its own, so the front-end's 4-tuple hash splits new flows by the weights; with one host's kernel choosing, the split depends on its port allocator (stop 23's host: 80/20 of 75/25 at 3x overload)",
        "node_cpu_pct": plan.quota,
        "node_cpu_pct_rule": if a.node_cpu_pct.is_some() {
            "--node-cpu-pct".to_string()
        } else {
            format!("default {NODE_CPU_PCT_DEFAULT}% of one CPU per back-end node")
        },
        "cpu_us_per_request": a.cpu_us_per_request,
        "backend_workers": a.backend_workers,
        "pin": match &plan.tiers {
            Some(t) => format!(
                "client and front-end on CPU {}, back-end nodes (and their receive softirq, RPS) on CPUs {}",
                crate::fabric::procs::cpu_list(&t.front),
                crate::fabric::procs::cpu_list(&t.back)
            ),
            None if a.no_pin => "--no-pin: every node on every CPU".to_string(),
            None => "one CPU: every node on it".to_string(),
        },
        "pin_rule": "as lab admission: the back-end tier can be saturated while the front is not, as on separate machines; unpinned, where the scheduler put the nodes' threads moved a migration's CPU between 100 and 220 µs from run to run (stop 25)",
        "capacity_rps": plan.capacity,
        "capacity_rule": format!(
            "node_cpu_pct / 100 x 1e6 / (cpu_us_per_request + {BACKEND_OWN_US})"
        ),
        "file_bytes": FILE_BYTES,
        "vip": VIP.to_string(),
        "load": "open loop: Poisson arrivals at each rate; closed loop: each user starts its next connection when its last one ended; both: one connection per request (Connection: close), the same client timeouts",
        "conn_per_s": "connections completed (response received) / measured time",
    });
    let mut sweep =
        crate::sweep::Sweep::<Speculative>::start(&dir, meta, a.sweep.resume.is_some())?;
    let keys = point_keys(&a, &plan);
    let mut lab: Option<Lab> = None;
    let mut notes = Vec::new();
    let est_run_s = plan.duration_s + plan.warmup_s + 3.0;
    let result = sweep.run(
        &keys,
        a.repeat,
        est_run_s,
        |k: &Key| {
            format!(
                "{} {} {} {}",
                k.experiment,
                k.system,
                k.split,
                k.load_label()
            )
        },
        |k, run| {
            if lab.is_none() {
                let l = start_lab(&dir, &plan)?;
                let measured = calibrate(&l, &a)?;
                notes.push(format!(
                    "one back-end node: {}% of one CPU, {} µs per request: capacity by \
                     the formula {:.1} conn/s, measured {measured:.1} conn/s (closed loop, \
                     {CALIBRATION_CLIENTS} clients straight at b0, {CALIBRATION_S} s)",
                    plan.quota, a.cpu_us_per_request, plan.capacity
                ));
                lab = Some(l);
            }
            let l = lab.as_ref().expect("started above");
            measure(l, &a, &plan, k, run)
        },
    );
    drop(lab);
    for n in notes {
        sweep.note(n)?;
    }
    if a.systems.iter().any(|s| s.starts_with("spec")) {
        sweep.note(format!(
            "specN: on each back-end `farside specd` (source and target) with accept queue \
             {BASE_ACCEPT_QUEUE} and window N, the other back-end its one peer, whose load is read one-sidedly (its gatherd \
             region, kernel sampler, over udp answered by XDP; specWg: also --gate-peer-load, the offer gated on that read) and \
             which admits by its own accept queue (--admit-queue-max {BASE_ACCEPT_QUEUE}), hand-off by fd passing to \
             `farside backend --adopt-socket`, flows moved at the front-end's control port; \
             specd runs inside the back-end's CPU quota (specd_cpu_ms_per_s: its process CPU \
             per second, mean per back-end); steer_mode: how its sk_lookup program decided \
             (kernel: per SYN from the server's accept queue). migration_p50_us: count-weighted \
             mean of the sources' p50; migration_p99_us: the worst source's p99; \
             migration_cpu_*_us: means per migration"
        ))?;
    }
    result?;
    sweep.finish()?;
    Ok(())
}

/// `lab speculative` as the sweep runner and the report shell see it.
pub struct Speculative;

impl crate::experiment::Experiment for Speculative {
    const NAME: &'static str = "speculative";
    type Args = SpeculativeArgs;
    type Point = SpecPoint;

    fn run(args: SpeculativeArgs) -> io::Result<()> {
        run(args)
    }

    fn table(s: &crate::summary::Summary<SpecPoint>) -> String {
        let points: Vec<&SpecPoint> = s.points.iter().collect();
        if points.is_empty() {
            return String::new();
        }
        table(&points) + "\n"
    }

    fn files(s: &crate::summary::Summary<SpecPoint>) -> io::Result<Vec<(String, String)>> {
        let points: Vec<&SpecPoint> = s.points.iter().collect();
        if points.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![
            ("speculative.csv".to_string(), csv(&points)),
            (
                "table.txt".to_string(),
                crate::report::table_text::<Speculative>(s),
            ),
        ])
    }

    fn figures(s: &crate::summary::Summary<SpecPoint>) -> Vec<crate::experiment::Figure> {
        let points: Vec<&SpecPoint> = s.points.iter().collect();
        figures(&points)
    }

    fn html(s: &crate::summary::Summary<SpecPoint>) -> String {
        let points: Vec<&SpecPoint> = s.points.iter().collect();
        if points.is_empty() {
            return String::new();
        }
        format!(
            "<h2>Speculative admission</h2>\n<pre>{}</pre>\n",
            crate::svg::escape(&table(&points))
        )
    }
}
