//! `farside lab speculative`: seed 002's speculative connection admission experiment
//! (issue 12 item 5): the baselines and the speculative systems.
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
//! `spec50`: speculative admission, Fig. 2/3). For a `specN` point every back-end runs
//! `farside backend --adopt-socket` and `farside specd` (source and target: admission
//! window N on the base accept queue 64, the other back-end as its one peer, migrated
//! flows moved at the front-end's control port); [`specd_args`] builds its command
//! line, and its exit summary fills the point's migration figures ([`SpecdFigures`]).

use crate::fabric::netns::{NodeSpec, VirtualDc};
use crate::fabric::procs::Child;
use crate::svg::Chart;
use farside_loadgen::LoadgenArgs;
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
/// of the full run's, where b0's queue and window are full and b1 is not (stop 25: the
/// count at which normal processing and speculative admission differ most). `--quick`
/// with the defaults: 20 points, 2 min 7 s here.
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
/// no migrated connections. Measured (stop 23): with 1 s of warm-up the first measured
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
/// (stop 25: normal processing +15 % at 4 x the queue's users).
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
    /// Continue the broken run kept in DIR: points already measured are skipped.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// 3 rates (0.5, 1.5, 3 × one node's capacity) of 3 s each, for CI (< 5 min).
    #[arg(long)]
    pub quick: bool,
    /// Where the nodes run: netns only (root: one namespace per node, a cgroup with a
    /// CPU quota per back-end, the eBPF front-end on its own node).
    #[arg(long, default_value = "netns")]
    pub hosts: String,
    /// Experiments (comma-separated): single (one server, accept queues
    /// --accept-queues: Fig. 1), split (two servers at --splits: Fig. 2/3).
    #[arg(long, value_delimiter = ',', default_value = "single,split")]
    pub experiment: Vec<String>,
    /// Systems of the split experiment (comma-separated): accN (normal processing, accept
    /// queue N), specW (speculative admission, window W on accept queue 64: spec32 and
    /// spec50 are the paper's; `farside specd` on every back-end), specWg (the same
    /// with `specd --gate-peer-load`: the peer's load read one-sidedly before offering).
    #[arg(long, value_delimiter = ',', default_value = "acc64")]
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
    #[arg(long, value_enum, default_value_t = crate::admission::LoadModels::Both)]
    pub load: crate::admission::LoadModels,
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
    /// 500 gives stop 25's S-Clients users.
    #[arg(long, default_value_t = 0)]
    pub closed_connect_timeout_ms: u64,
    /// Source port of each client connection (`farside loadgen --source-ports`):
    /// `random` (the default) draws it uniformly, as connections from many client
    /// hosts would come, so the front-end's split of new flows does not depend on one
    /// host's port allocator; `kernel` lets the client namespace's kernel choose (it
    /// reuses ports within a run: ~10 % of SYNs at 3x found their 4-tuple in the flow
    /// table; stop 23's host then split 80 / 20 at 75 / 25, this stop's 75 / 25).
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

/// One point of `lab speculative`: one experiment, system, split and offered rate.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SpecPoint {
    /// `single` or `split`.
    pub experiment: String,
    /// `accN` (normal processing, accept queue N) or `specN` (speculative).
    pub system: String,
    /// Percent of new flows per back-end, `67/33`; `100` for the single server.
    pub split: String,
    /// Accept queue of every back-end (listen backlog).
    pub accept_queue: u32,
    /// Admission window of every back-end (`specN`); `None` for normal processing.
    pub admission_window: Option<u32>,
    /// `open` (arrivals at `rate`) or `closed` (`clients` users).
    #[serde(default = "open_load")]
    pub load: String,
    /// Closed loop: the users (the x axis); `None` in the open loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<u32>,
    /// Offered connection rate, connections/s: the open loop's x axis (the rate set);
    /// in the closed loop the rate the users offered (measured, = `offered_per_s`).
    pub rate: f64,
    /// Connections the clients started per second of measured time.
    pub offered_per_s: f64,
    /// Connections completed (response received) per second: the paper's connection
    /// throughput (the y axis of Fig. 1-3).
    pub conn_per_s: f64,
    /// Connections completed in the measured window.
    pub served: u64,
    /// Connections refused, reset or timed out (`--timeout-ms`), or answered 5xx.
    pub failures: u64,
    /// Of `failures`: client timeouts.
    pub timeouts: u64,
    /// Of `failures`: connection attempts abandoned at `--connect-timeout-ms` (their
    /// SYN was dropped, by a full accept queue or a closed window).
    #[serde(default)]
    pub connect_timeouts: u64,
    /// Of `failures`: connects refused or failed (`ECONNREFUSED`, `ECONNRESET` during the
    /// handshake, the kernel giving up its SYN retries).
    #[serde(default)]
    pub connect_errors: u64,
    /// Of `failures`: connections reset or broken after they were established.
    #[serde(default)]
    pub io_errors: u64,
    /// Response time of completed connections (connect to last byte), ms.
    pub avg_ms: f64,
    pub p99_ms: f64,
    /// Connections migrated between back-ends (0 without speculation).
    pub migrations: u64,
    /// Migration latency p50 / p99, µs; `None` without a migration.
    pub migration_p50_us: Option<f64>,
    pub migration_p99_us: Option<f64>,
    /// Migrations refused by a target, and admission windows closed (0 without
    /// speculation).
    pub refusals: u64,
    pub window_closures: u64,
    /// Connections specd lost or could not hand to a server after taking them
    /// (summaries' `lost` + `local_handoff_failed` + target `handoff_failed`): client
    /// failures caused by migration. 0 without speculation.
    #[serde(default)]
    pub migration_lost: u64,
    /// Most connections waiting at once in one specd for its local server to take them
    /// (its adoption queue full), source or target side (`queued_max` of the
    /// summaries' `local_handoff` / `handoff`).
    #[serde(default)]
    pub handoff_queued_max: u64,
    /// Connections whose client had gone while they waited for the hand-off (not
    /// lost: closed by the client; summaries' `client_gone`).
    #[serde(default)]
    pub handoff_client_gone: u64,
    /// CPU per migrated connection on the source (migrator thread) and on the target
    /// (restore and hand-off), mean µs; `None` without a migration.
    #[serde(default)]
    pub migration_cpu_source_us: Option<f64>,
    #[serde(default)]
    pub migration_cpu_target_us: Option<f64>,
    /// specd's process CPU, ms per second per back-end (mean): its whole tax on a
    /// node's quota (`None` without speculation).
    #[serde(default)]
    pub specd_cpu_ms_per_s: Option<f64>,
    /// How the sources' sk_lookup program decided (`kernel`: per SYN from the server's
    /// accept queue; `poll`: a flag polled by specd).
    #[serde(default)]
    pub steer_mode: Option<String>,
    /// Each back-end node's CPU over the measured window (from the end of the warm-up
    /// for `duration_s`), by process: where a node's quota went while conn/s was
    /// counted. Result files before stop 25 measured it over the whole load (warm-up
    /// and drain included); empty in files from before this field.
    #[serde(default)]
    pub nodes: Vec<NodeCpu>,
    /// One node's capacity by the formula, connections/s ([`capacity_rps`]).
    pub capacity_rps: f64,
    /// Measured time, s.
    pub duration_s: f64,
    /// Runs combined in this point.
    #[serde(default = "one")]
    pub runs: u64,
    /// The lowest and highest conn/s of a single run (`--repeat`): the spread behind
    /// `conn_per_s`. `None` for one run.
    #[serde(default)]
    pub conn_per_s_min: Option<f64>,
    #[serde(default)]
    pub conn_per_s_max: Option<f64>,
    /// Connections completed in each second of the measured window (summed over
    /// runs): whether the point was in its steady state from the window's start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub served_per_s: Vec<u64>,
    /// Migrations per second over the measured window (the sources' per-second
    /// series, apportioned to the window by overlap); `None` without speculation, and in
    /// result files from before stop 26 (whose `migrations` also count the warm-up and
    /// the drain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrations_per_s: Option<f64>,
    /// Per second of the measured window, as `served_per_s` (summed over runs, 0.1
    /// resolution): migrations, target refusals and window closures, both sources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrated_per_s: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_per_s: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub closed_per_s: Vec<f64>,
}

fn one() -> u64 {
    1
}

/// Per-second series of `runs` added second by second, a shorter run's as far as it
/// goes.
fn add_by_second<T: Copy + std::iter::Sum<T>>(
    runs: &[SpecPoint],
    f: impl Fn(&SpecPoint) -> &Vec<T>,
) -> Vec<T> {
    let n = runs.iter().map(|r| f(r).len()).max().unwrap_or(0);
    (0..n)
        .map(|i| runs.iter().filter_map(|r| f(r).get(i).copied()).sum())
        .collect()
}

fn open_load() -> String {
    "open".into()
}

/// One back-end node's CPU during a point's load, ms of CPU per second of wall time
/// (`/proc/PID/stat` utime + stime of each process in the node's cgroup, 10 ms ticks:
/// ±0.5 ms/s over a 20 s point; softirq work the kernel does while one of them runs
/// counts as theirs).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct NodeCpu {
    /// The node, `b0` or `b1`.
    pub node: String,
    /// Every process of the node (the quota is `--node-cpu-pct` × 10 ms/s).
    pub cpu_ms_per_s: f64,
    /// `farside backend` (the web server).
    pub backend_ms_per_s: f64,
    /// `farside specd` (0 for normal processing).
    pub specd_ms_per_s: f64,
    /// `farside gatherd` (the load region; only with specd).
    pub gatherd_ms_per_s: f64,
    /// Time the node's tasks were throttled (quota used up), ms per second, summed over
    /// the CPUs they wait on (`cpu.stat` throttled time): above 1,000 on two CPUs.
    pub throttled_ms_per_s: f64,
}

impl NodeCpu {
    /// `runs`' nodes averaged, weighted by each run's measured time.
    fn combine(runs: &[SpecPoint]) -> Vec<NodeCpu> {
        let d: f64 = runs.iter().map(|r| r.duration_s).sum();
        let n = runs.iter().map(|r| r.nodes.len()).min().unwrap_or(0);
        if d <= 0.0 {
            return runs.first().map(|r| r.nodes.clone()).unwrap_or_default();
        }
        (0..n)
            .map(|i| {
                let avg = |f: fn(&NodeCpu) -> f64| {
                    runs.iter()
                        .map(|r| f(&r.nodes[i]) * r.duration_s)
                        .sum::<f64>()
                        / d
                };
                NodeCpu {
                    node: runs[0].nodes[i].node.clone(),
                    cpu_ms_per_s: avg(|c| c.cpu_ms_per_s),
                    backend_ms_per_s: avg(|c| c.backend_ms_per_s),
                    specd_ms_per_s: avg(|c| c.specd_ms_per_s),
                    gatherd_ms_per_s: avg(|c| c.gatherd_ms_per_s),
                    throttled_ms_per_s: avg(|c| c.throttled_ms_per_s),
                }
            })
            .collect()
    }

    /// One node for the peaks line: `b0 198 (backend 181, specd 14.0, gatherd 0.9)`.
    fn brief(&self) -> String {
        format!(
            "{} {:.0} (backend {:.0}, specd {:.1}, gatherd {:.1})",
            self.node,
            self.cpu_ms_per_s,
            self.backend_ms_per_s,
            self.specd_ms_per_s,
            self.gatherd_ms_per_s,
        )
    }
}

/// What a node's processes are, for [`NodeCpu`].
#[derive(Default)]
struct NodePids {
    backend: Option<u32>,
    specd: Option<u32>,
    gatherd: Option<u32>,
}

/// A node's counters at one instant.
struct NodeSnap {
    throttled_us: u64,
    procs: Vec<crate::fabric::netns::ProcCpu>,
}

fn node_snap(dc: &VirtualDc, node: &str) -> NodeSnap {
    NodeSnap {
        throttled_us: dc.cpu_stat(node).map_or(0, |c| c.throttled_us),
        procs: dc.node_procs_cpu(node).unwrap_or_default(),
    }
}

fn node_cpu(node: &str, pids: &NodePids, a: &NodeSnap, b: &NodeSnap, wall: Duration) -> NodeCpu {
    let secs = wall.as_secs_f64().max(1e-3);
    let used = |pid: Option<u32>| -> u64 {
        let Some(pid) = pid else { return 0 };
        let at = |s: &NodeSnap| {
            s.procs
                .iter()
                .find(|p| p.pid == pid)
                .map_or(0, |p| p.cpu_us)
        };
        at(b).saturating_sub(at(a))
    };
    let all: u64 = b.procs.iter().map(|p| used(Some(p.pid))).sum();
    let ms = |us: u64| us as f64 / 1e3 / secs;
    NodeCpu {
        node: node.to_string(),
        cpu_ms_per_s: ms(all),
        backend_ms_per_s: ms(used(pids.backend)),
        specd_ms_per_s: ms(used(pids.specd)),
        gatherd_ms_per_s: ms(used(pids.gatherd)),
        throttled_ms_per_s: ms(b.throttled_us.saturating_sub(a.throttled_us)),
    }
}

impl SpecPoint {
    /// Repeats of one point: counts summed, rates and times averaged (weighted by the
    /// measured time), migration quantiles the worst run's.
    pub fn combine(runs: &[SpecPoint]) -> SpecPoint {
        let Some(first) = runs.first() else {
            return SpecPoint::empty();
        };
        let d: f64 = runs.iter().map(|r| r.duration_s).sum();
        let served: u64 = runs.iter().map(|r| r.served).sum();
        let wavg = |f: fn(&SpecPoint) -> f64| {
            if d > 0.0 {
                runs.iter().map(|r| f(r) * r.duration_s).sum::<f64>() / d
            } else {
                f(first)
            }
        };
        let worst = |f: fn(&SpecPoint) -> Option<f64>| {
            runs.iter()
                .filter_map(f)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        };
        let offered_per_s = wavg(|r| r.offered_per_s);
        SpecPoint {
            // Closed loop: the rate is what the users offered, over all runs.
            rate: if first.clients.is_some() {
                offered_per_s
            } else {
                first.rate
            },
            offered_per_s,
            conn_per_s: if d > 0.0 { served as f64 / d } else { 0.0 },
            served,
            failures: runs.iter().map(|r| r.failures).sum(),
            timeouts: runs.iter().map(|r| r.timeouts).sum(),
            connect_timeouts: runs.iter().map(|r| r.connect_timeouts).sum(),
            connect_errors: runs.iter().map(|r| r.connect_errors).sum(),
            io_errors: runs.iter().map(|r| r.io_errors).sum(),
            avg_ms: wavg(|r| r.avg_ms),
            p99_ms: runs.iter().map(|r| r.p99_ms).fold(0.0, f64::max),
            migrations: runs.iter().map(|r| r.migrations).sum(),
            migration_p50_us: worst(|r| r.migration_p50_us),
            migration_p99_us: worst(|r| r.migration_p99_us),
            refusals: runs.iter().map(|r| r.refusals).sum(),
            window_closures: runs.iter().map(|r| r.window_closures).sum(),
            migration_lost: runs.iter().map(|r| r.migration_lost).sum(),
            handoff_queued_max: runs.iter().map(|r| r.handoff_queued_max).max().unwrap_or(0),
            handoff_client_gone: runs.iter().map(|r| r.handoff_client_gone).sum(),
            migration_cpu_source_us: worst(|r| r.migration_cpu_source_us),
            migration_cpu_target_us: worst(|r| r.migration_cpu_target_us),
            specd_cpu_ms_per_s: worst(|r| r.specd_cpu_ms_per_s),
            nodes: NodeCpu::combine(runs),
            duration_s: d,
            runs: runs.iter().map(|r| r.runs).sum(),
            conn_per_s_min: (runs.len() > 1).then(|| {
                runs.iter()
                    .map(|r| r.conn_per_s_min.unwrap_or(r.conn_per_s))
                    .fold(f64::INFINITY, f64::min)
            }),
            conn_per_s_max: (runs.len() > 1).then(|| {
                runs.iter()
                    .map(|r| r.conn_per_s_max.unwrap_or(r.conn_per_s))
                    .fold(0.0, f64::max)
            }),
            served_per_s: add_by_second(runs, |r| &r.served_per_s),
            migrations_per_s: {
                let m: Vec<(f64, f64)> = runs
                    .iter()
                    .filter_map(|r| r.migrations_per_s.map(|m| (m, r.duration_s)))
                    .collect();
                let t: f64 = m.iter().map(|x| x.1).sum();
                (!m.is_empty() && t > 0.0).then(|| m.iter().map(|(v, d)| v * d).sum::<f64>() / t)
            },
            migrated_per_s: add_by_second(runs, |r| &r.migrated_per_s),
            refused_per_s: add_by_second(runs, |r| &r.refused_per_s),
            closed_per_s: add_by_second(runs, |r| &r.closed_per_s),
            ..first.clone()
        }
    }

    fn empty() -> SpecPoint {
        SpecPoint {
            experiment: String::new(),
            system: String::new(),
            split: String::new(),
            accept_queue: 0,
            admission_window: None,
            load: open_load(),
            clients: None,
            rate: 0.0,
            offered_per_s: 0.0,
            conn_per_s: 0.0,
            served: 0,
            failures: 0,
            timeouts: 0,
            connect_timeouts: 0,
            connect_errors: 0,
            io_errors: 0,
            avg_ms: 0.0,
            p99_ms: 0.0,
            migrations: 0,
            migration_p50_us: None,
            migration_p99_us: None,
            refusals: 0,
            window_closures: 0,
            migration_lost: 0,
            handoff_queued_max: 0,
            handoff_client_gone: 0,
            migration_cpu_source_us: None,
            migration_cpu_target_us: None,
            specd_cpu_ms_per_s: None,
            steer_mode: None,
            nodes: Vec::new(),
            capacity_rps: 0.0,
            duration_s: 0.0,
            runs: 0,
            conn_per_s_min: None,
            conn_per_s_max: None,
            served_per_s: Vec::new(),
            migrations_per_s: None,
            migrated_per_s: Vec::new(),
            refused_per_s: Vec::new(),
            closed_per_s: Vec::new(),
        }
    }

    /// The point's figures on one line, for progress output.
    pub fn progress_line(&self) -> String {
        format!(
            "conn/s={:.1} offered={:.1}/s failures={} timeouts={} connect_timeouts={} \
             connect_errors={} io_errors={} avg={:.1} ms p99={:.1} ms migrations={}",
            self.conn_per_s,
            self.offered_per_s,
            self.failures,
            self.timeouts,
            self.connect_timeouts,
            self.connect_errors,
            self.io_errors,
            self.avg_ms,
            self.p99_ms,
            self.migrations
        )
    }

    /// The line this point belongs to in tables and figures: `single` or `split 75/25`,
    /// with ` closed` after it in the closed loop.
    pub fn panel(&self) -> String {
        let mut p = if self.experiment == "single" {
            "single".to_string()
        } else {
            format!("split {}", self.split)
        };
        if self.clients.is_some() {
            p.push_str(CLOSED_SUFFIX);
        }
        p
    }

    /// The point's x: users in the closed loop, the offered rate in the open loop.
    pub fn x(&self) -> f64 {
        self.clients.map_or(self.rate, f64::from)
    }
}

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

/// `farside specd` arguments for back-end `node` (cluster address `ip`) of a `specN`
/// point: source and target, admission window `window` on the base accept queue, the
/// other back-end `peer_ip` as its one peer, its load read one-sidedly from the peer's
/// gatherd region (udp, answered by XDP; with one peer it ranks nothing, and specd's
/// opt-in `--gate-peer-load` is not used); the target's own accept queue decides
/// admission; the VIP steered by
/// sk_lookup, migrated flows moved at the front-end's control port `frontend`,
/// connections handed to `farside backend --adopt-socket adopt`, summary to `summary`.
pub fn specd_args(
    ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
    window: u32,
    frontend: SocketAddr,
    adopt: &Path,
    summary: &Path,
    gate: bool,
) -> Vec<String> {
    let mut v = strings(&[
        "specd",
        "--listen",
        &SocketAddr::new(ip.into(), SPECD_PORT).to_string(),
        "--server-port",
        &VIP.port().to_string(),
        "--adopt-socket",
        &adopt.display().to_string(),
        "--accept",
        "127.0.0.1:0",
        "--queue",
        &BASE_ACCEPT_QUEUE.to_string(),
        "--window",
        &window.to_string(),
        "--vip",
        &VIP.ip().to_string(),
        "--service-port",
        &VIP.port().to_string(),
        "--peer",
        &format!("daemon={peer_ip}:{SPECD_PORT},backend={peer_ip},region=udp:{peer_ip}:{REGION_UDP_PORT}"),
        "--frontend",
        &frontend.to_string(),
        "--summary",
        &summary.display().to_string(),
    ]);
    if gate {
        v.push("--gate-peer-load".into());
    }
    v
}

/// The sources' migrations, target refusals and window closures per second of a
/// point's measured window, from each specd summary's `source.series` (per second since
/// that daemon's `source.started_unix_ms`). A daemon's second is taken as spread evenly
/// and apportioned to the window's seconds by overlap, so the lab's and the daemons'
/// clocks need not tick together (the last window second may be partial).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowSeries {
    /// Migrations per second over the whole window; `None` for an empty window.
    pub migrations_per_s: Option<f64>,
    pub migrated: Vec<f64>,
    pub refused: Vec<f64>,
    pub closed: Vec<f64>,
}

impl WindowSeries {
    /// The window from `w0_unix_ms` for `wall_ms`.
    pub fn from_summaries(
        summaries: &[serde_json::Value],
        w0_unix_ms: f64,
        wall_ms: f64,
    ) -> WindowSeries {
        // The sampler wakes a few ms after the window's end: an overrun of up to
        // WINDOW_OVERRUN_MS is cut, so a 20 s window has 20 seconds, as `served_per_s`.
        let n = ((wall_ms - WINDOW_OVERRUN_MS) / 1e3).ceil().max(0.0) as usize;
        let wall_ms = wall_ms.min(n as f64 * 1e3);
        let mut cols = [vec![0.0; n], vec![0.0; n], vec![0.0; n]];
        let w_end = w0_unix_ms + wall_ms;
        for s in summaries {
            let src = &s["source"];
            let Some(start) = src["started_unix_ms"].as_f64() else {
                continue;
            };
            let first = src["series"]["first_s"].as_f64().unwrap_or(0.0);
            for (k, name) in ["migrated", "refused", "closed"].iter().enumerate() {
                let Some(bins) = src["series"][*name].as_array() else {
                    continue;
                };
                for (i, c) in bins.iter().enumerate() {
                    let c = c.as_f64().unwrap_or(0.0);
                    let b0 = start + (first + i as f64) * 1e3;
                    let b1 = b0 + 1e3;
                    if c == 0.0 || b1 <= w0_unix_ms || b0 >= w_end {
                        continue;
                    }
                    let j0 = ((b0.max(w0_unix_ms) - w0_unix_ms) / 1e3) as usize;
                    for (j, slot) in cols[k].iter_mut().enumerate().skip(j0) {
                        let s0 = w0_unix_ms + j as f64 * 1e3;
                        let s1 = (s0 + 1e3).min(w_end);
                        if s0 >= b1 {
                            break;
                        }
                        let overlap = (s1.min(b1) - s0.max(b0)).max(0.0);
                        *slot += c * overlap / 1e3;
                    }
                }
            }
        }
        let migrated_total: f64 = cols[0].iter().sum();
        let [migrated, refused, closed] = cols.map(|v| {
            v.into_iter()
                .map(|x| (x * 10.0).round() / 10.0)
                .collect::<Vec<f64>>()
        });
        WindowSeries {
            migrations_per_s: (wall_ms > 0.0).then(|| migrated_total * 1e3 / wall_ms),
            migrated,
            refused,
            closed,
        }
    }
}

/// The most a measured window's wall time may pass a whole second and still count
/// as that many seconds ([`WindowSeries`]), ms.
const WINDOW_OVERRUN_MS: f64 = 100.0;

/// What one point takes from the back-ends' `farside specd` exit summaries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecdFigures {
    /// Connections migrated (sources' `migrated`).
    pub migrations: u64,
    /// Migration latency (freeze to DONE): p50 weighted by each source's count, p99 the
    /// worst source's; µs.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Migrations refused by a target (`window.target_refusals`).
    pub refusals: u64,
    /// Admission windows closed (`window.closures`).
    pub window_closures: u64,
    /// Connections lost by specd (`lost` + `local_handoff_failed` + target
    /// `handoff_failed`).
    pub lost: u64,
    /// Most connections waiting for a hand-off at once in one specd (`queued_max`).
    pub handoff_queued_max: u64,
    /// Hand-offs whose client had gone while waiting (`client_gone`).
    pub handoff_client_gone: u64,
    /// Mean CPU per migration on the sources and on the targets, µs.
    pub cpu_source_us: Option<f64>,
    pub cpu_target_us: Option<f64>,
    /// specd's whole process CPU (`process_cpu_ms` over `wall_s`), ms per second,
    /// mean over the back-ends: its tax on a node's quota, migrations included.
    pub cpu_ms_per_s: Option<f64>,
    /// The sources' steering modes (`source.steer_mode`), distinct, comma-separated.
    pub steer_mode: Option<String>,
}

impl SpecdFigures {
    /// Sum the summaries (one JSON object per back-end, `farside specd --summary`).
    pub fn from_summaries(summaries: &[serde_json::Value]) -> SpecdFigures {
        let u = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        let mut f = SpecdFigures::default();
        let (mut p50_w, mut src_cpu, mut src_n, mut tgt_cpu, mut tgt_n) =
            (0.0, 0.0, 0u64, 0.0, 0u64);
        for s in summaries {
            let src = &s["source"];
            let tgt = &s["target"];
            let n = u(&src["migration_us"]["count"]);
            f.migrations += u(&src["migrated"]);
            if n > 0 {
                p50_w += src["migration_us"]["p50"].as_f64().unwrap_or(0.0) * n as f64;
                let p99 = src["migration_us"]["p99"].as_f64().unwrap_or(0.0);
                f.p99_us = Some(f.p99_us.map_or(p99, |m: f64| m.max(p99)));
            }
            let c = u(&src["cpu_us"]["count"]);
            if c > 0 {
                src_cpu += src["cpu_us"]["mean"].as_f64().unwrap_or(0.0) * c as f64;
                src_n += c;
            }
            let c = u(&tgt["cpu_us"]["count"]);
            if c > 0 {
                tgt_cpu += tgt["cpu_us"]["mean"].as_f64().unwrap_or(0.0) * c as f64;
                tgt_n += c;
            }
            f.refusals += u(&src["window"]["target_refusals"]);
            f.window_closures += u(&src["window"]["closures"]);
            f.lost += u(&src["lost"]) + u(&src["local_handoff_failed"]) + u(&tgt["handoff_failed"]);
            for h in [&src["local_handoff"], &tgt["handoff"]] {
                f.handoff_queued_max = f.handoff_queued_max.max(u(&h["queued_max"]));
                f.handoff_client_gone += u(&h["client_gone"]);
            }
        }
        let counted: u64 = summaries
            .iter()
            .map(|s| u(&s["source"]["migration_us"]["count"]))
            .sum();
        if counted > 0 {
            f.p50_us = Some(p50_w / counted as f64);
        }
        f.cpu_source_us = (src_n > 0).then(|| src_cpu / src_n as f64);
        f.cpu_target_us = (tgt_n > 0).then(|| tgt_cpu / tgt_n as f64);
        let taxes: Vec<f64> = summaries
            .iter()
            .filter_map(|s| {
                let wall = s["wall_s"].as_f64()?;
                (wall > 0.0).then(|| s["process_cpu_ms"].as_f64().unwrap_or(0.0) / wall)
            })
            .collect();
        f.cpu_ms_per_s =
            (!taxes.is_empty()).then(|| taxes.iter().sum::<f64>() / taxes.len() as f64);
        let mut modes: Vec<&str> = summaries
            .iter()
            .filter_map(|s| s["source"]["steer_mode"].as_str())
            .collect();
        modes.sort_unstable();
        modes.dedup();
        f.steer_mode = (!modes.is_empty()).then(|| modes.join(","));
        f
    }
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
    if a.hosts != "netns" {
        return Err(bad(format!(
            "--hosts {}: lab speculative runs on netns only (the eBPF front-end routes by \
             MAC on a LAN of namespaces, and each back-end needs its own CPU quota)",
            a.hosts
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
    } else if a.quick {
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
    } else if a.quick {
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
    let duration_s = a.duration_s.unwrap_or(if a.quick { 3.0 } else { 20.0 });
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

/// The run's namespaces and directories.
struct Lab {
    dc: VirtualDc,
    /// Back-end nodes `b0`, `b1` with their MAC on the LAN.
    backends: Vec<(String, String)>,
    logs: PathBuf,
    docroot: PathBuf,
    /// The front tier's CPUs (the clients run in this process), when pinned.
    front: Option<Vec<usize>>,
}

const CLIENT: &str = "client";
const FE: &str = "fe";

fn ip_cmd(args: &[&str]) -> io::Result<String> {
    let out = std::process::Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The MAC address in `ip -o link show` output (`link/ether XX:..`).
pub fn mac_of(ip_link: &str) -> Option<String> {
    let mut w = ip_link.split_whitespace();
    while let Some(t) = w.next() {
        if t == "link/ether" {
            return w.next().map(str::to_string);
        }
    }
    None
}

impl Lab {
    fn spawn(&self, node: &str, name: &str, args: &[String]) -> io::Result<Child> {
        let log = self.logs.join(format!("{name}.log"));
        let c = self
            .dc
            .spawn_in(node, &std::env::current_exe()?, args, &log)?;
        Ok(Child::adopt(name, c, log))
    }

    /// Wait until `addr` accepts connections, seen from the client node.
    fn wait_port(&self, c: &mut Child, addr: SocketAddr) -> io::Result<()> {
        crate::fabric::wait_port(
            c,
            addr,
            crate::fabric::Vantage::Node(&self.dc, CLIENT),
            READY_MAX,
            POLL,
        )
    }

    /// Start `farside backend` on back-end `i` with accept queue `backlog` (and
    /// `--adopt-socket adopt` for specd's hand-offs).
    fn start_backend(
        &self,
        a: &SpeculativeArgs,
        i: usize,
        backlog: u32,
        adopt: Option<&Path>,
        tag: &str,
    ) -> io::Result<Child> {
        let node = &self.backends[i].0;
        let mut args = strings(&[
            "backend",
            "--listen",
            "0.0.0.0:80",
            "--root",
            &self.docroot.display().to_string(),
            "--workers",
            &a.backend_workers.to_string(),
            "--backlog",
            &backlog.to_string(),
            "--cpu-us-per-request",
            &a.cpu_us_per_request.to_string(),
        ]);
        if let Some(p) = adopt {
            args.push("--adopt-socket".into());
            args.push(p.display().to_string());
        }
        let mut be = self.spawn(node, &format!("{tag}-backend-{node}"), &args)?;
        let direct = SocketAddr::new(self.dc.node_ip(node).into(), 80);
        self.wait_port(&mut be, direct)?;
        Ok(be)
    }

    /// Start `farside gatherd` on back-end `i` (`specN`): the node's load in its region,
    /// read one-sidedly by the peer's specd over udp and answered by XDP (generic mode)
    /// on the node's link; the kernel sampler (XDP's default: accept backlog, conns,
    /// delay), so the node pays a few µs a period, not a user-space loop.
    fn start_gatherd(&self, i: usize, tag: &str) -> io::Result<Child> {
        let node = &self.backends[i].0;
        let ip = self.dc.node_ip(node);
        let tcp = SocketAddr::new(ip.into(), GATHERD_TCP_PORT);
        let args = strings(&[
            "gatherd",
            "--node-id",
            &i.to_string(),
            "--watch-port",
            &VIP.port().to_string(),
            "--no-shm",
            "--tcp-listen",
            &tcp.to_string(),
            "--udp-listen",
            &SocketAddr::new(ip.into(), REGION_UDP_PORT).to_string(),
            "--xdp-iface",
            crate::fabric::netns::VETH_IN_NS,
            "--xdp-mode",
            "generic",
        ]);
        let mut g = self.spawn(node, &format!("{tag}-gatherd-{node}"), &args)?;
        self.wait_port(&mut g, tcp)?;
        Ok(g)
    }

    /// Start `farside specd` on back-end `i` (the other one its peer) and wait until it
    /// logs its listeners.
    fn start_specd(
        &self,
        i: usize,
        window: u32,
        gate: bool,
        adopt: &Path,
        summary: &Path,
        tag: &str,
    ) -> io::Result<Child> {
        let node = &self.backends[i].0;
        let peer = &self.backends[1 - i].0;
        let control = SocketAddr::new(self.dc.node_ip(FE).into(), FE_CONTROL_PORT);
        let args = specd_args(
            self.dc.node_ip(node),
            self.dc.node_ip(peer),
            window,
            control,
            adopt,
            summary,
            gate,
        );
        let mut c = self.spawn(node, &format!("{tag}-specd-{node}"), &args)?;
        let t0 = Instant::now();
        loop {
            c.check_alive()?;
            let log = std::fs::read_to_string(&c.log).unwrap_or_default();
            if log.contains(SPECD_READY) {
                return Ok(c);
            }
            if t0.elapsed() > READY_MAX {
                return Err(io::Error::other(format!(
                    "{} did not log `{SPECD_READY}` within {READY_MAX:?}; see {}",
                    c.name,
                    c.log.display()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Start the front-end with `weights` (one per back-end used) and wait until the VIP
    /// answers through it.
    fn start_frontend(&self, weights: &[u32], tag: &str) -> io::Result<Child> {
        let fe_ip = self.dc.node_ip(FE);
        let control = SocketAddr::new(fe_ip.into(), FE_CONTROL_PORT);
        let mut args = strings(&[
            "frontend",
            "--iface",
            crate::fabric::netns::VETH_IN_NS,
            "--vip",
            &VIP.to_string(),
            "--control",
            &control.to_string(),
        ]);
        for (i, w) in weights.iter().enumerate() {
            let (node, mac) = &self.backends[i];
            args.push("--backend".into());
            args.push(format!("{mac}@{}={w}", self.dc.node_ip(node)));
        }
        let mut fe = self.spawn(FE, &format!("{tag}-frontend"), &args)?;
        self.wait_port(&mut fe, control)?;
        self.wait_port(&mut fe, SocketAddr::V4(VIP))?;
        Ok(fe)
    }

    /// One run of `lg` ([`loadgen_args`]) from the client node.
    fn load(&self, lg: LoadgenArgs) -> io::Result<farside_loadgen::Summary> {
        let front = self.front.clone();
        self.dc.run_in_ns(CLIENT, move || {
            if let Some(cpus) = &front {
                // The clients run on this (fresh) thread and the threads it starts.
                crate::fabric::procs::pin_current_thread(cpus)?;
            }
            farside_loadgen::run(&lg).map_err(|e| io::Error::other(format!("loadgen: {e}")))
        })
    }
}

/// The clients of one run of a point: the open loop's S-Clients at `rate`, or the
/// closed loop's users with their own timeouts (`--closed-timeout-ms`,
/// `--closed-connect-timeout-ms`).
fn loadgen_args(
    target: SocketAddr,
    offer: Offer,
    duration_s: f64,
    warmup_s: f64,
    a: &SpeculativeArgs,
    run: u32,
) -> LoadgenArgs {
    let mut lg = LoadgenArgs::new(target.to_string());
    lg.session_requests = 1;
    match offer {
        Offer::Rate(r) => {
            lg.rate = Some(r);
            lg.timeout_ms = a.timeout_ms;
            lg.connect_timeout_ms = a.connect_timeout_ms;
        }
        Offer::Clients(n) => {
            lg.clients = n;
            lg.timeout_ms = a.closed_timeout_ms;
            lg.connect_timeout_ms = a.closed_connect_timeout_ms;
        }
    }
    lg.no_keepalive = true;
    lg.duration_s = duration_s;
    lg.warmup_s = warmup_s;
    lg.file_path = FILE_PATH.to_string();
    lg.source_ports = a.source_ports;
    lg.seed = a.seed.wrapping_add(u64::from(run));
    lg.quiet = true;
    lg
}

/// Build the namespaces: client, front-end, back-ends with the VIP on their `lo`.
fn start_lab(dir: &Path, plan: &Plan) -> io::Result<Lab> {
    let backends: Vec<String> = (0..plan.nodes).map(|i| format!("b{i}")).collect();
    let node = |name: &str, cpus: Option<&[usize]>| NodeSpec::new(name).pinned(cpus);
    let front = plan.tiers.as_ref().map(|t| t.front.as_slice());
    let back = plan.tiers.as_ref().map(|t| t.back.as_slice());
    if let Some(t) = &plan.tiers {
        eprintln!(
            "lab speculative: client and front-end on CPU {:?}, back-end nodes on CPUs {:?} \
             (--no-pin to share)",
            t.front, t.back
        );
    }
    let mut specs = vec![node(CLIENT, front), node(FE, front)];
    specs.extend(
        backends
            .iter()
            .map(|n| node(n, back).cpu_quota_pct(plan.quota)),
    );
    let dc = VirtualDc::create(&format!("s{}", std::process::id() % 100_000), &specs)?;
    let id = dc.run_id().to_string();
    crate::fabric::procs::on_interrupt(move || {
        if let Ok(r) = crate::fabric::netns::clean_run_id(&id) {
            eprint!("{r}");
        }
    });
    let vip = format!("{}/32", VIP.ip());
    let mut with_mac = Vec::new();
    for n in &backends {
        let ns = dc.netns_name(n);
        ip_cmd(&["-n", &ns, "addr", "add", &vip, "dev", "lo"])?;
        dc.set_sysctl(n, "net/ipv4/conf/all/arp_ignore", "1")?;
        dc.set_sysctl(n, "net/ipv4/conf/all/arp_announce", "2")?;
        let link = ip_cmd(&[
            "-n",
            &ns,
            "-o",
            "link",
            "show",
            crate::fabric::netns::VETH_IN_NS,
        ])?;
        let mac = mac_of(&link)
            .ok_or_else(|| io::Error::other(format!("no MAC for {n}'s eth0 in: {link}")))?;
        with_mac.push((n.clone(), mac));
    }
    let fe_ip = dc.node_ip(FE).to_string();
    ip_cmd(&[
        "-n",
        &dc.netns_name(CLIENT),
        "route",
        "add",
        &vip,
        "via",
        &fe_ip,
    ])?;
    let logs = dir.join("logs");
    let docroot = dir.join("docroot");
    std::fs::create_dir_all(&logs)?;
    std::fs::create_dir_all(&docroot)?;
    let mut body = b"<html><body>farside lab speculative: a 4 KB page\n".to_vec();
    body.resize(FILE_BYTES - 15, b'.');
    body.extend_from_slice(b"\n</body></html>");
    std::fs::write(docroot.join(FILE_PATH.trim_start_matches('/')), body)?;
    Ok(Lab {
        dc,
        backends: with_mac,
        logs,
        docroot,
        front: plan.tiers.as_ref().map(|t| t.front.clone()),
    })
}

/// Measure one node's capacity: closed loop straight at `b0` (no front-end), accept
/// queue 128. Returns connections/s.
fn calibrate(lab: &Lab, a: &SpeculativeArgs) -> io::Result<f64> {
    let _be = lab.start_backend(a, 0, 128, None, "calibrate")?;
    let direct = SocketAddr::new(lab.dc.node_ip(&lab.backends[0].0).into(), 80);
    let s = lab.load(loadgen_args(
        direct,
        Offer::Clients(CALIBRATION_CLIENTS),
        CALIBRATION_S,
        WARMUP_S,
        a,
        0,
    ))?;
    Ok(s.tps)
}

/// Measure one point.
fn measure(
    lab: &Lab,
    a: &SpeculativeArgs,
    plan: &Plan,
    key: &Key,
    run: u32,
) -> io::Result<SpecPoint> {
    let (queue, window) = parse_system(&key.system).map_err(io::Error::other)?;
    let weights: Vec<u32> = if key.experiment == "single" {
        vec![1]
    } else {
        let (x, y) = parse_split(&key.split).map_err(io::Error::other)?;
        vec![x, y]
    };
    let mut tag = format!(
        "{}-{}-{}-{}",
        key.experiment,
        key.system,
        key.split.replace('/', "-"),
        match key.clients {
            Some(c) => format!("c{c}"),
            None => format!("{:.0}", key.rate),
        }
    );
    if run > 0 {
        // Logs and specd summaries of every run are kept (run 0 keeps the old names).
        tag.push_str(&format!("-r{run}"));
    }
    // specN needs both back-ends (each is the other's peer): the split experiment.
    let spec = window.filter(|_| weights.len() == 2);
    // Unix socket paths are short (108 bytes): in the temp dir, not under --out.
    let adopt: Vec<PathBuf> = (0..weights.len())
        .map(|i| {
            std::env::temp_dir().join(format!(
                "farside-{}-{}-adopt.sock",
                lab.dc.run_id(),
                lab.backends[i].0
            ))
        })
        .collect();
    let summaries: Vec<PathBuf> = (0..weights.len())
        .map(|i| {
            lab.logs
                .join(format!("{tag}-specd-{}.json", lab.backends[i].0))
        })
        .collect();
    let mut children = Vec::new();
    let mut specds = Vec::new();
    let started = (|| -> io::Result<()> {
        for (i, sock) in adopt.iter().enumerate() {
            let sock = spec.map(|_| sock.as_path());
            children.push(lab.start_backend(a, i, queue, sock, &tag)?);
        }
        children.push(lab.start_frontend(&weights, &tag)?);
        if let Some(w) = spec {
            for i in 0..weights.len() {
                children.push(lab.start_gatherd(i, &tag)?);
            }
            for (i, (sock, summary)) in adopt.iter().zip(&summaries).enumerate() {
                let _ = std::fs::remove_file(summary);
                specds.push(lab.start_specd(
                    i,
                    w,
                    system_gated(&key.system),
                    sock,
                    summary,
                    &tag,
                )?);
            }
        }
        Ok(())
    })();
    // Which process is which, for the nodes' CPU: the back-ends were started first,
    // then the front-end, then the gatherers; specd separately.
    let n = weights.len();
    let pids: Vec<NodePids> = (0..n)
        .map(|i| NodePids {
            backend: children.get(i).map(Child::pid),
            gatherd: spec.and_then(|_| children.get(n + 1 + i).map(Child::pid)),
            specd: specds.get(i).map(Child::pid),
        })
        .collect();
    let s = started.and_then(|()| {
        let nodes: Vec<&str> = lab.backends[..n].iter().map(|b| b.0.as_str()).collect();
        let snap = || -> Vec<NodeSnap> { nodes.iter().map(|nd| node_snap(&lab.dc, nd)).collect() };
        // The nodes' CPU over the measured window only, as conn/s is counted: the
        // warm-up (b1 idles while b0's queue fills) and the drain after the window
        // would dilute it. The sampler wakes at the window's two edges, or as soon as
        // the load ends: before the warm-up's end there is no window (the load
        // failed), after it the window is cut there.
        let (done, ended) = std::sync::mpsc::channel::<()>();
        let (s, window) = std::thread::scope(|sc| {
            let sampler = sc.spawn(move || {
                use std::sync::mpsc::RecvTimeoutError::Timeout;
                let warmup = Duration::from_secs_f64(plan.warmup_s);
                if ended.recv_timeout(warmup) != Err(Timeout) {
                    return None;
                }
                let before = snap();
                let t0 = Instant::now();
                let w0_unix_ms = unix_ms_now();
                let _ = ended.recv_timeout(Duration::from_secs_f64(plan.duration_s));
                Some((before, snap(), t0.elapsed(), w0_unix_ms))
            });
            let s = lab.load(loadgen_args(
                SocketAddr::V4(VIP),
                key.offer(),
                plan.duration_s,
                plan.warmup_s,
                a,
                run,
            ));
            drop(done);
            (s, sampler.join())
        });
        let s = s?;
        let window = window.map_err(|_| io::Error::other("the CPU sampler thread panicked"))?;
        let edges = window
            .as_ref()
            .map(|(_, _, wall, w0)| (*w0, wall.as_secs_f64() * 1e3));
        let cpu: Vec<NodeCpu> = match window {
            Some((before, after, wall, _)) => nodes
                .iter()
                .zip(before.iter().zip(after.iter().zip(&pids)))
                .map(|(nd, (b, (e, p)))| node_cpu(nd, p, b, e, wall))
                .collect(),
            None => Vec::new(),
        };
        Ok((s, cpu, edges))
    });
    // specd first (SIGTERM: it writes its summary), b0 (the heavier source) before b1
    // so that b0's last migrations still find b1's target; then the front-end (it
    // prints its counters to its log), then the back-ends.
    for mut c in specds.drain(..) {
        c.stop();
    }
    while let Some(mut c) = children.pop() {
        c.stop();
    }
    for p in &adopt {
        let _ = std::fs::remove_file(p);
    }
    let (s, nodes, edges) = s?;
    let (figures, over_time) = match spec {
        Some(_) => {
            let mut v = Vec::new();
            for p in &summaries {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| io::Error::other(format!("specd summary {}: {e}", p.display())))?;
                v.push(serde_json::from_str(&text).map_err(|e| {
                    io::Error::other(format!("specd summary {}: {e}", p.display()))
                })?);
            }
            let over_time =
                edges.map(|(w0, wall_ms)| WindowSeries::from_summaries(&v, w0, wall_ms));
            (SpecdFigures::from_summaries(&v), over_time)
        }
        None => (SpecdFigures::default(), None),
    };
    let over_time = over_time.unwrap_or_default();
    Ok(SpecPoint {
        experiment: key.experiment.clone(),
        system: key.system.clone(),
        split: key.split.clone(),
        accept_queue: queue,
        admission_window: window,
        load: if key.clients.is_some() {
            "closed".into()
        } else {
            open_load()
        },
        clients: key.clients,
        rate: if key.clients.is_some() {
            s.offered_rps
        } else {
            key.rate
        },
        offered_per_s: s.offered_rps,
        conn_per_s: s.tps,
        served: s.served,
        failures: s.failures + s.dropped_503,
        timeouts: s.failure_kinds.timeouts,
        connect_timeouts: s.failure_kinds.connect_timeouts,
        connect_errors: s.failure_kinds.connect_errors,
        io_errors: s.failure_kinds.io_errors,
        avg_ms: s.avg_ms,
        p99_ms: s.p99_ms,
        migrations: figures.migrations,
        migration_p50_us: figures.p50_us,
        migration_p99_us: figures.p99_us,
        refusals: figures.refusals,
        window_closures: figures.window_closures,
        migration_lost: figures.lost,
        handoff_queued_max: figures.handoff_queued_max,
        handoff_client_gone: figures.handoff_client_gone,
        migration_cpu_source_us: figures.cpu_source_us,
        migration_cpu_target_us: figures.cpu_target_us,
        specd_cpu_ms_per_s: figures.cpu_ms_per_s,
        steer_mode: figures.steer_mode,
        nodes,
        capacity_rps: plan.capacity,
        duration_s: s.duration_s,
        runs: 1,
        conn_per_s_min: None,
        conn_per_s_max: None,
        served_per_s: s.series.iter().map(|x| x.served).collect(),
        migrations_per_s: over_time.migrations_per_s,
        migrated_per_s: over_time.migrated,
        refused_per_s: over_time.refused,
        closed_per_s: over_time.closed,
    })
}

/// Now in Unix time, ms (0 if the clock is before 1970).
fn unix_ms_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// The panels in first-seen order, each with its systems in first-seen order.
fn panels(points: &[&SpecPoint]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for p in points {
        let panel = p.panel();
        let i = match out.iter().position(|(x, _)| *x == panel) {
            Some(i) => i,
            None => {
                out.push((panel, Vec::new()));
                out.len() - 1
            }
        };
        if !out[i].1.contains(&p.system) {
            out[i].1.push(p.system.clone());
        }
    }
    out
}

/// What a closed-loop panel's name ends with.
const CLOSED_SUFFIX: &str = " closed";

/// The x axis of a panel: its table column, its name in the table's title, and the
/// figures' axis label.
fn x_axis(panel: &str) -> (&'static str, &'static str, &'static str) {
    if panel.ends_with(CLOSED_SUFFIX) {
        ("clients", "closed-loop users", "closed-loop users")
    } else {
        ("rate", "offered rate", "offered connections/s")
    }
}

fn fig_of(panel: &str) -> &'static str {
    let panel = panel.strip_suffix(CLOSED_SUFFIX).unwrap_or(panel);
    if panel == "single" {
        "Fig. 1"
    } else if panel.ends_with("67/33") {
        "Fig. 2"
    } else if panel.ends_with("75/25") {
        "Fig. 3"
    } else {
        "Fig. 2/3"
    }
}

/// The speculative tables: one row per point (`clients`: the closed loop's users, `-`
/// in the open loop), and conn/s vs offered rate or users per panel (single server:
/// Fig. 1; each split: Fig. 2/3), one column per system.
pub fn table(points: &[&SpecPoint]) -> String {
    let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    let mut s = format!(
        "{:<8} {:<8} {:<6} {:>7} {:>8} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>10} {:>7} {:>8} {:>8}\n",
        "exp",
        "system",
        "split",
        "clients",
        "rate",
        "offered",
        "conn/s",
        "failures",
        "timeouts",
        "avg_ms",
        "p99_ms",
        "migrations",
        "mig/s",
        "mig_p50",
        "mig_p99"
    );
    for p in points {
        let _ = writeln!(
            s,
            "{:<8} {:<8} {:<6} {:>7} {:>8.1} {:>9.1} {:>9.1} {:>8} {:>8} {:>9.1} {:>9.1} {:>10} {:>7} {:>8} {:>8}",
            p.experiment,
            p.system,
            p.split,
            p.clients.map_or("-".to_string(), |c| c.to_string()),
            p.rate,
            p.offered_per_s,
            p.conn_per_s,
            p.failures,
            p.timeouts,
            p.avg_ms,
            p.p99_ms,
            p.migrations,
            p.migrations_per_s
                .map_or("-".to_string(), |v| format!("{v:.1}")),
            us(p.migration_p50_us),
            us(p.migration_p99_us)
        );
        if let (Some(lo), Some(hi)) = (p.conn_per_s_min, p.conn_per_s_max) {
            // Replace the line's end: the runs' conn/s range after the row.
            s.pop();
            let _ = writeln!(s, "  ({} runs: {lo:.1}-{hi:.1} conn/s)", p.runs);
        }
    }
    if let Some(c) = points.first().map(|p| p.capacity_rps) {
        let _ = writeln!(s, "one node's capacity (formula): {c:.1} conn/s");
    }
    for (panel, systems) in panels(points) {
        let (x, x_label, _) = x_axis(&panel);
        let _ = write!(
            s,
            "\nconn/s vs {x_label}, {panel} ({})\n{:<10}",
            fig_of(&panel),
            x
        );
        for sys in &systems {
            let _ = write!(s, " {sys:>10}");
        }
        s.push('\n');
        let mut xs: Vec<f64> = points
            .iter()
            .filter(|p| p.panel() == panel)
            .map(|p| p.x())
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        for r in xs {
            let digits = usize::from(x == "rate");
            let _ = write!(s, "{r:<10.digits$}");
            for sys in &systems {
                match points
                    .iter()
                    .find(|p| p.panel() == panel && p.system == *sys && p.x() == r)
                {
                    Some(p) => {
                        let _ = write!(s, " {:>10.1}", p.conn_per_s);
                    }
                    None => {
                        let _ = write!(s, " {:>10}", "-");
                    }
                }
            }
            s.push('\n');
        }
    }
    s.push_str(&peaks_and_break_even(points));
    s
}

/// The peak conn/s of each panel and system, against the single server's peak (the
/// issue's target: two speculative servers at 75/25 ≥ 1.9× one), and the break-even
/// request cost: a migration pays for the overloaded source only if the request it
/// moves would have cost the source more CPU than moving it, so the break-even request
/// cost is the source's CPU per migration (mean over every migrated connection, the
/// points weighted by their migrations); the target's CPU per migration is the extra
/// work the move adds to the cluster.
pub fn peaks_and_break_even(points: &[&SpecPoint]) -> String {
    let mut s =
        String::from("\npeak conn/s (x the single server's acc64 peak in the same load model)\n");
    let peak = |panel: &str, sys: &str| {
        points
            .iter()
            .filter(|p| p.panel() == panel && p.system == sys)
            .max_by(|a, b| a.conn_per_s.total_cmp(&b.conn_per_s))
            .copied()
    };
    let panels = panels(points);
    let width = panels
        .iter()
        .map(|(p, _)| p.len())
        .max()
        .unwrap_or(0)
        .max(12);
    for (panel, systems) in panels {
        // Against the single server in the same load model.
        let single_panel = if panel.ends_with(CLOSED_SUFFIX) {
            format!("single{CLOSED_SUFFIX}")
        } else {
            "single".to_string()
        };
        let single = peak(&single_panel, "acc64").map(|p| p.conn_per_s);
        for sys in systems {
            let Some(p) = peak(&panel, &sys) else {
                continue;
            };
            let pk = p.conn_per_s;
            let ratio = single
                .filter(|s| *s > 0.0)
                .map_or("-".to_string(), |sg| format!("{:.2}x", pk / sg));
            let _ = write!(s, "  {panel:<width$} {sys:<8} {pk:>8.1}  {ratio}");
            let at = match p.clients {
                Some(c) => format!("{c} clients"),
                None => format!("rate {:.1}", p.rate),
            };
            if let Some(tax) = p.specd_cpu_ms_per_s {
                // specd's share of this point's node quota, at the peak.
                let _ = write!(
                    s,
                    "  (at {at}; specd {tax:.1} ms/s per node, {})",
                    p.steer_mode.as_deref().unwrap_or("-")
                );
            }
            s.push('\n');
            if !p.nodes.is_empty() {
                // Where each node's quota went at the peak, ms of CPU per second.
                let nodes: Vec<String> = p.nodes.iter().map(NodeCpu::brief).collect();
                let _ = writeln!(s, "      cpu ms/s: {}", nodes.join(", "));
            }
        }
    }
    let migrated: Vec<&&SpecPoint> = points.iter().filter(|p| p.migrations > 0).collect();
    let n: u64 = migrated.iter().map(|p| p.migrations).sum();
    let mean = |f: fn(&SpecPoint) -> Option<f64>| {
        let w: f64 = migrated
            .iter()
            .filter_map(|p| f(p).map(|v| v * p.migrations as f64))
            .sum();
        (n > 0).then(|| w / n as f64)
    };
    match (
        mean(|p| p.migration_cpu_source_us),
        mean(|p| p.migration_cpu_target_us),
    ) {
        (Some(src), tgt) => {
            let _ = writeln!(
                s,
                "break-even request cost: {src:.0} µs of CPU (the source's CPU per migration, \
                 mean of {n} migrations): a request that costs its server less is cheaper to \
                 serve where it landed; each migration also costs the target {} µs",
                tgt.map_or("-".to_string(), |t| format!("{t:.0}"))
            );
        }
        (None, _) => s.push_str("break-even request cost: - (no migration)\n"),
    }
    s
}

/// `speculative.csv`: one row per point.
pub fn csv(points: &[&SpecPoint]) -> String {
    let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
    let mut s = String::from(
        "experiment,system,split,accept_queue,admission_window,rate,offered_per_s,conn_per_s,served,failures,timeouts,avg_ms,p99_ms,migrations,migration_p50_us,migration_p99_us,refusals,window_closures,migration_lost,migration_cpu_source_us,migration_cpu_target_us,capacity_rps,duration_s,load,clients,migrations_per_s\n",
    );
    for p in points {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.3},{:.3},{:.3},{},{},{},{:.3},{:.3},{},{},{},{},{},{},{},{},{:.3},{:.3},{},{},{}",
            p.experiment,
            p.system,
            p.split,
            p.accept_queue,
            p.admission_window.map_or(String::new(), |w| w.to_string()),
            p.rate,
            p.offered_per_s,
            p.conn_per_s,
            p.served,
            p.failures,
            p.timeouts,
            p.avg_ms,
            p.p99_ms,
            p.migrations,
            o(p.migration_p50_us),
            o(p.migration_p99_us),
            p.refusals,
            p.window_closures,
            p.migration_lost,
            o(p.migration_cpu_source_us),
            o(p.migration_cpu_target_us),
            p.capacity_rps,
            p.duration_s,
            p.load,
            p.clients.map_or(String::new(), |c| c.to_string()),
            o(p.migrations_per_s)
        );
    }
    s
}

/// `(file name, caption, svg)` per panel: conn/s vs offered rate and avg response time
/// vs offered rate, one line per system.
pub fn figures(points: &[&SpecPoint]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (panel, systems) in panels(points) {
        let file = panel.replace([' ', '/'], "-");
        let (_, _, x_label) = x_axis(&panel);
        let line = |sys: &str, f: fn(&SpecPoint) -> f64| {
            let mut v: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.panel() == panel && p.system == sys)
                .map(|p| (p.x(), f(p)))
                .collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v
        };
        let mut c = Chart::new(
            &format!("Connection throughput, {panel}"),
            x_label,
            "connections completed/s",
        );
        let mut rt = Chart::new(
            &format!("Response time, {panel}"),
            x_label,
            "avg response time (ms)",
        );
        for sys in &systems {
            c = c.series(sys, line(sys, |p| p.conn_per_s));
            rt = rt.series(sys, line(sys, |p| p.avg_ms));
        }
        out.push((
            format!("fig-spec-conn-{file}.svg"),
            format!(
                "Connections completed/s vs {}, {panel} ({})",
                x_axis(&panel).1,
                fig_of(&panel)
            ),
            c.to_svg(),
        ));
        out.push((
            format!("fig-spec-rt-{file}.svg"),
            format!("Average response time vs {}, {panel}", x_axis(&panel).1),
            rt.to_svg(),
        ));
        // Over time: each speculative system at its peak, per second of the window.
        for sys in &systems {
            let peak = points
                .iter()
                .filter(|p| p.panel() == panel && p.system == *sys && !p.migrated_per_s.is_empty())
                .max_by(|a, b| a.conn_per_s.total_cmp(&b.conn_per_s));
            if let Some(p) = peak {
                out.push(over_time_figure(p, &panel, &file));
            }
        }
    }
    out
}

/// One speculative point per second of its measured window (runs summed, so divided by
/// its runs): connections completed, migrations, target refusals and window closures.
fn over_time_figure(p: &SpecPoint, panel: &str, file: &str) -> (String, String, String) {
    let runs = p.runs.max(1) as f64;
    let line = |v: Vec<f64>| -> Vec<(f64, f64)> {
        v.into_iter()
            .enumerate()
            .map(|(i, y)| (i as f64 + 1.0, y / runs))
            .collect()
    };
    let served: Vec<f64> = p.served_per_s.iter().map(|&n| n as f64).collect();
    let at = match p.clients {
        Some(c) => format!("{c} users"),
        None => format!("{:.1} conn/s offered", p.rate),
    };
    let c = Chart::new(
        &format!("Over time, {} {panel} at {at}", p.system),
        "second of the measured window",
        "per second",
    )
    .series("completed", line(served))
    .series("migrated", line(p.migrated_per_s.clone()))
    .series("refused by the target", line(p.refused_per_s.clone()))
    .series("window closed", line(p.closed_per_s.clone()));
    (
        format!("fig-spec-time-{file}-{}.svg", p.system),
        format!(
            "Connections completed, migrations, refusals and window closures per second, \
             {} {panel} at its peak ({at})",
            p.system
        ),
        c.to_svg(),
    )
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
    let dir = a.resume.clone().unwrap_or_else(|| a.out.clone());
    let mut meta = crate::summary::Summary::new("speculative", &a.hosts, a.quick);
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
    let mut sweep = crate::sweep::Sweep::<Speculative>::start(&dir, meta, a.resume.is_some())?;
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

impl crate::experiment::LabPoint for SpecPoint {
    type Extra = crate::experiment::NoExtra;

    fn take_extra(&mut self) -> crate::experiment::NoExtra {
        crate::experiment::NoExtra {}
    }

    fn put_extra(&mut self, _: crate::experiment::NoExtra) {}

    fn combine(runs: &[SpecPoint]) -> SpecPoint {
        SpecPoint::combine(runs)
    }

    fn progress_line(&self) -> String {
        SpecPoint::progress_line(self)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_nodes_cpu_is_split_by_process_and_repeats_average_by_time() {
        use crate::fabric::netns::ProcCpu;
        let proc_ = |pid, cpu_us| ProcCpu {
            pid,
            comm: "farside".into(),
            cpu_us,
        };
        let pids = NodePids {
            backend: Some(10),
            specd: Some(11),
            gatherd: Some(12),
        };
        let a = NodeSnap {
            throttled_us: 1_000,
            procs: vec![proc_(10, 500_000), proc_(11, 10_000), proc_(12, 0)],
        };
        // A process that started during the load (13) counts from zero.
        let b = NodeSnap {
            throttled_us: 3_001_000,
            procs: vec![
                proc_(10, 2_500_000),
                proc_(11, 110_000),
                proc_(12, 10_000),
                proc_(13, 20_000),
            ],
        };
        let c = node_cpu("b0", &pids, &a, &b, Duration::from_secs(10));
        assert_eq!(c.backend_ms_per_s, 200.0);
        assert_eq!(c.specd_ms_per_s, 10.0);
        assert_eq!(c.gatherd_ms_per_s, 1.0);
        assert_eq!(c.cpu_ms_per_s, 213.0);
        assert_eq!(c.throttled_ms_per_s, 300.0);
        let run = |d: f64, cpu: f64| SpecPoint {
            duration_s: d,
            nodes: vec![NodeCpu {
                node: "b0".into(),
                cpu_ms_per_s: cpu,
                ..NodeCpu::default()
            }],
            ..SpecPoint::empty()
        };
        let both = SpecPoint::combine(&[run(10.0, 100.0), run(30.0, 200.0)]);
        assert_eq!(both.nodes.len(), 1);
        assert_eq!(both.nodes[0].cpu_ms_per_s, 175.0);
    }

    #[test]
    fn peaks_compare_with_the_single_server_and_break_even_weighs_by_migrations() {
        let pt = |exp: &str, sys: &str, split: &str, rate: f64, cps: f64, mig: u64, cpu: f64| {
            SpecPoint {
                experiment: exp.into(),
                system: sys.into(),
                split: split.into(),
                rate,
                conn_per_s: cps,
                migrations: mig,
                migration_cpu_source_us: (mig > 0).then_some(cpu),
                migration_cpu_target_us: (mig > 0).then_some(cpu / 2.0),
                ..SpecPoint::empty()
            }
        };
        let pts = [
            pt("single", "acc64", "100", 100.0, 90.0, 0, 0.0),
            pt("single", "acc64", "100", 200.0, 80.0, 0, 0.0),
            pt("split", "acc64", "75/25", 200.0, 140.0, 0, 0.0),
            pt("split", "spec32", "75/25", 200.0, 171.0, 100, 400.0),
            pt("split", "spec32", "75/25", 300.0, 160.0, 300, 600.0),
        ];
        let refs: Vec<&SpecPoint> = pts.iter().collect();
        let t = peaks_and_break_even(&refs);
        assert!(t.contains("single       acc64        90.0  1.00x"), "{t}");
        assert!(t.contains("split 75/25  acc64       140.0  1.56x"), "{t}");
        assert!(t.contains("split 75/25  spec32      171.0  1.90x"), "{t}");
        // (100 x 400 + 300 x 600) / 400 = 550; the target's (50 + 0.5 x ...) = 275.
        assert!(t.contains("break-even request cost: 550 µs"), "{t}");
        assert!(t.contains("costs the target 275 µs"), "{t}");
        let none = peaks_and_break_even(&refs[..3]);
        assert!(
            none.contains("break-even request cost: - (no migration)"),
            "{none}"
        );
    }

    use super::*;

    fn args() -> SpeculativeArgs {
        SpeculativeArgs {
            out: "x".into(),
            resume: None,
            quick: true,
            hosts: "netns".into(),
            experiment: vec!["single".into(), "split".into()],
            systems: vec!["acc64".into()],
            accept_queues: ACCEPT_QUEUES.to_vec(),
            splits: SPLITS.iter().map(|s| s.to_string()).collect(),
            rates: Vec::new(),
            load: crate::admission::LoadModels::Open,
            clients: Vec::new(),
            duration_s: None,
            warmup_s: POINT_WARMUP_S_DEFAULT,
            timeout_ms: 2000,
            connect_timeout_ms: S_CLIENT_CONNECT_TIMEOUT_MS,
            closed_timeout_ms: CLOSED_TIMEOUT_MS_DEFAULT,
            closed_connect_timeout_ms: 0,
            source_ports: farside_loadgen::SourcePorts::Random,
            node_cpu_pct: None,
            cpu_us_per_request: 2000,
            backend_workers: 8,
            seed: 1,
            no_pin: false,
            repeat: 1,
        }
    }

    #[test]
    fn capacity_rule_and_default_rates() {
        let c = capacity_rps(20, 2000);
        assert!((c - 0.2e6 / 2030.0).abs() < 1e-9, "{c}");
        let p = check_args(&args()).unwrap();
        assert_eq!(p.rates.len(), RATE_MULTIPLES_QUICK.len());
        assert!((p.rates[0] - 0.5 * c).abs() < 1e-9);
        assert!((p.rates[2] - 3.0 * c).abs() < 1e-9);
        assert_eq!(p.duration_s, 3.0);
        assert_eq!(p.nodes, 2);
        let full = check_args(&SpeculativeArgs {
            quick: false,
            experiment: vec!["single".into()],
            ..args()
        })
        .unwrap();
        assert_eq!(full.rates.len(), RATE_MULTIPLES_FULL.len());
        assert_eq!(full.nodes, 1);
    }

    #[test]
    fn warmup_and_connect_timeout_are_checked() {
        let p = check_args(&args()).unwrap();
        assert_eq!(p.warmup_s, POINT_WARMUP_S_DEFAULT);
        for w in [-1.0, f64::NAN, POINT_WARMUP_S_MAX + 1.0] {
            let Err(e) = check_args(&SpeculativeArgs {
                warmup_s: w,
                ..args()
            }) else {
                panic!("--warmup-s {w} accepted");
            };
            assert!(e.to_string().contains("--warmup-s"), "{e}");
        }
        for (ct, ok) in [
            (0, true),
            (500, true),
            (1999, true),
            (2000, false),
            (5000, false),
        ] {
            let r = check_args(&SpeculativeArgs {
                connect_timeout_ms: ct,
                ..args()
            });
            assert_eq!(r.is_ok(), ok, "{ct}");
            if let Err(e) = r {
                assert!(e.to_string().contains("--connect-timeout-ms"), "{e}");
            }
        }
        // The closed loop's pair is checked on its own, under its own flag names.
        for (t, ct, ok, flag) in [
            (CLOSED_TIMEOUT_MS_DEFAULT, 0, true, ""),
            (CLOSED_TIMEOUT_MS_DEFAULT, 500, true, ""),
            (2000, 2000, false, "--closed-connect-timeout-ms"),
            (0, 0, false, "--closed-timeout-ms"),
            (TIMEOUT_MS_MAX, 0, true, ""),
            (TIMEOUT_MS_MAX + 1, 0, false, "--closed-timeout-ms"),
        ] {
            let r = check_args(&SpeculativeArgs {
                closed_timeout_ms: t,
                closed_connect_timeout_ms: ct,
                ..args()
            });
            assert_eq!(r.is_ok(), ok, "{t} {ct}");
            if let Err(e) = r {
                assert!(e.to_string().contains(flag), "{e}");
            }
        }
        let Err(e) = check_args(&SpeculativeArgs {
            timeout_ms: TIMEOUT_MS_MAX + 1,
            ..args()
        }) else {
            panic!("--timeout-ms past its bound accepted");
        };
        assert!(e.to_string().starts_with("--timeout-ms"), "{e}");
    }

    #[test]
    fn the_daemons_seconds_are_apportioned_to_the_window() {
        let daemon = |start: u64, migrated: &[u32], refused: &[u32]| {
            serde_json::json!({"source": {
                "started_unix_ms": start,
                "series": {"first_s": 0, "migrated": migrated, "refused": refused,
                           "closed": [0, 1, 0], "evicted": 0},
            }})
        };
        // The window starts half-way through the daemon's first second and lasts 2 s.
        let a = daemon(10_000, &[10, 20, 30], &[0, 0, 4]);
        let w = WindowSeries::from_summaries(std::slice::from_ref(&a), 10_500.0, 2_000.0);
        assert_eq!(w.migrated, vec![15.0, 25.0]);
        assert_eq!(w.refused, vec![0.0, 2.0]);
        assert_eq!(w.closed, vec![0.5, 0.5]);
        assert_eq!(w.migrations_per_s, Some(20.0));
        // Both sources add; a summary without a series (an older specd) adds nothing;
        // a partial last second gets only what falls in it.
        let b = daemon(11_000, &[6], &[0]);
        let old = serde_json::json!({"source": {"migrated": 99}});
        let w = WindowSeries::from_summaries(&[a, b, old], 10_500.0, 1_500.0);
        assert_eq!(w.migrated, vec![18.0, 13.0]);
        let per_s = w.migrations_per_s.unwrap();
        assert!((per_s - 31.0 / 1.5).abs() < 1e-9, "{per_s}");
        // No window, no rate.
        let w = WindowSeries::from_summaries(&[], 0.0, 0.0);
        assert!(w.migrated.is_empty() && w.migrations_per_s.is_none());
    }

    #[test]
    fn each_load_model_gets_its_own_client_timeouts() {
        let a = args();
        let vip = SocketAddr::V4(VIP);
        let open = loadgen_args(vip, Offer::Rate(90.0), 20.0, 3.0, &a, 2);
        assert_eq!(open.rate, Some(90.0));
        assert_eq!((open.timeout_ms, open.connect_timeout_ms), (2000, 500));
        assert_eq!(open.seed, a.seed + 2);
        let closed = loadgen_args(vip, Offer::Clients(128), 20.0, 3.0, &a, 0);
        assert_eq!((closed.rate, closed.clients), (None, 128));
        // Users of real hosts: no connect timeout, their kernels retransmit the SYN.
        assert_eq!(
            (closed.timeout_ms, closed.connect_timeout_ms),
            (CLOSED_TIMEOUT_MS_DEFAULT, 0)
        );
        for lg in [&open, &closed] {
            assert!(lg.no_keepalive && lg.session_requests == 1);
            assert!(lg.validate().is_ok(), "{lg:?}");
        }
    }

    #[test]
    fn splits_and_systems_parse() {
        assert_eq!(parse_split("75/25").unwrap(), (75, 25));
        assert_eq!(parse_split("67/33").unwrap(), (67, 33));
        for bad in ["75", "0/100", "a/b", "75/"] {
            assert!(parse_split(bad).unwrap_err().contains("--splits"), "{bad}");
        }
        assert_eq!(parse_system("acc64").unwrap(), (64, None));
        assert_eq!(parse_system("spec32").unwrap(), (64, Some(32)));
        assert_eq!(parse_system("spec50g").unwrap(), (64, Some(50)));
        assert!(system_gated("spec50g") && !system_gated("spec50") && !system_gated("acc64"));
        assert!(parse_system("acc64g").is_err());
        assert!(parse_system("acc0").is_err());
        assert!(parse_system("cm33").unwrap_err().contains("--systems"));
    }

    #[test]
    fn speculative_systems_are_accepted_and_specd_gets_its_flags() {
        for s in SPEC_SYSTEMS {
            check_args(&SpeculativeArgs {
                systems: vec!["acc64".into(), s.into()],
                ..args()
            })
            .expect(s);
        }
        assert!(parse_system("spec0").unwrap_err().contains("window"));
        let with_gate = |gate| {
            specd_args(
                Ipv4Addr::new(10, 0, 0, 2),
                Ipv4Addr::new(10, 0, 0, 3),
                50,
                "10.0.0.9:7400".parse().unwrap(),
                Path::new("/tmp/a.sock"),
                Path::new("/tmp/s.json"),
                gate,
            )
        };
        let v = with_gate(false).join(" ");
        assert!(!v.contains("--gate-peer-load"));
        let g = with_gate(true);
        assert_eq!(g.last().map(String::as_str), Some("--gate-peer-load"));
        for want in [
            "specd --listen 10.0.0.2:7000 --server-port 80 --adopt-socket /tmp/a.sock",
            "--accept 127.0.0.1:0 --queue 64 --window 50 --vip 10.77.1.100",
            "--peer daemon=10.0.0.3:7000,backend=10.0.0.3,region=udp:10.0.0.3:7471 --frontend 10.0.0.9:7400",
            "--summary /tmp/s.json",
        ] {
            assert!(v.contains(want), "{want}: {v}");
        }
    }

    #[test]
    fn specd_summaries_fill_the_point() {
        let b0: serde_json::Value = serde_json::from_str(
            r#"{"wall_s":5.0,"process_cpu_ms":100.0,"source":{"accepted":12,"migrated":10,"lost":1,"steer_mode":"kernel",
            "local_handoff_failed":0,"local_handoff":{"queued_max":7,"client_gone":1},
            "window":{"target_refusals":2,"closures":3},
            "migration_us":{"count":10,"p50":100,"p99":900,"max":950,"mean":150.0},
            "cpu_us":{"count":10,"p50":400,"p99":800,"max":800,"mean":500.0}},
            "target":{"handoff_failed":0,"cpu_us":{"count":0,"p50":0,"p99":0,"max":0,"mean":0.0}}}"#,
        )
        .unwrap();
        let b1: serde_json::Value = serde_json::from_str(
            r#"{"wall_s":4.0,"process_cpu_ms":120.0,"source":{"migrated":30,"lost":0,"local_handoff_failed":0,"steer_mode":"kernel",
            "window":{"target_refusals":0,"closures":1},
            "migration_us":{"count":30,"p50":200,"p99":500,"max":600,"mean":210.0},
            "cpu_us":{"count":30,"p50":300,"p99":400,"max":400,"mean":300.0}},
            "target":{"handoff_failed":2,"handoff":{"queued_max":12,"client_gone":2},"cpu_us":{"count":10,"p50":250,"p99":300,"max":300,"mean":250.0}}}"#,
        )
        .unwrap();
        let f = SpecdFigures::from_summaries(&[b0, b1]);
        assert_eq!(
            (f.migrations, f.refusals, f.window_closures, f.lost),
            (40, 2, 4, 3)
        );
        assert_eq!((f.handoff_queued_max, f.handoff_client_gone), (12, 3));
        assert_eq!(f.p50_us, Some(175.0));
        assert_eq!(f.p99_us, Some(900.0));
        assert_eq!(f.cpu_source_us, Some(350.0));
        assert_eq!(f.cpu_target_us, Some(250.0));
        // 100 ms over 5 s and 120 ms over 4 s: 20 and 30 ms/s.
        assert_eq!(f.cpu_ms_per_s, Some(25.0));
        assert_eq!(f.steer_mode.as_deref(), Some("kernel"));
        let none = SpecdFigures::from_summaries(&[serde_json::json!({"source": null})]);
        assert_eq!(none, SpecdFigures::default());
    }

    #[test]
    fn arguments_are_checked_with_the_flag_named() {
        let cases: [(&str, SpeculativeArgs); 9] = [
            (
                "--repeat",
                SpeculativeArgs {
                    repeat: 0,
                    ..args()
                },
            ),
            (
                "--repeat",
                SpeculativeArgs {
                    repeat: REPEAT_MAX + 1,
                    ..args()
                },
            ),
            (
                "--hosts",
                SpeculativeArgs {
                    hosts: "loopback".into(),
                    ..args()
                },
            ),
            (
                "--experiment",
                SpeculativeArgs {
                    experiment: vec!["triple".into()],
                    ..args()
                },
            ),
            (
                "--rates",
                SpeculativeArgs {
                    rates: vec![0.0],
                    ..args()
                },
            ),
            (
                "--node-cpu-pct",
                SpeculativeArgs {
                    node_cpu_pct: Some(0),
                    ..args()
                },
            ),
            (
                "--accept-queues",
                SpeculativeArgs {
                    accept_queues: vec![0],
                    ..args()
                },
            ),
            (
                "--splits",
                SpeculativeArgs {
                    splits: vec!["100".into()],
                    ..args()
                },
            ),
            (
                "--duration-s",
                SpeculativeArgs {
                    duration_s: Some(0.0),
                    ..args()
                },
            ),
        ];
        for (flag, a) in cases {
            let e = check_args(&a).err().expect(flag).to_string();
            assert!(e.contains(flag), "{flag}: {e}");
        }
    }

    #[test]
    fn load_models_choose_rates_and_clients() {
        let both = SpeculativeArgs {
            load: crate::admission::LoadModels::Both,
            ..args()
        };
        let p = check_args(&both).unwrap();
        assert_eq!(p.rates.len(), RATE_MULTIPLES_QUICK.len());
        assert_eq!(p.clients, [128]);
        let full = check_args(&SpeculativeArgs {
            quick: false,
            ..both.clone()
        })
        .unwrap();
        assert_eq!(full.clients, [64, 128, 256]);
        let closed = check_args(&SpeculativeArgs {
            load: crate::admission::LoadModels::Closed,
            clients: vec![10, 20],
            ..args()
        })
        .unwrap();
        assert!(closed.rates.is_empty());
        assert_eq!(closed.clients, [10, 20]);
        assert!(check_args(&args()).unwrap().clients.is_empty(), "open only");
        for bad in [0, CLIENTS_MAX + 1] {
            let e = check_args(&SpeculativeArgs {
                clients: vec![8, bad],
                ..both.clone()
            })
            .err()
            .expect("bad --clients accepted")
            .to_string();
            assert!(e.contains("--clients"), "{e}");
        }
        // Each line: its closed-loop points first, then its open-loop ones.
        let a = SpeculativeArgs {
            experiment: vec!["split".into()],
            splits: vec!["75/25".into()],
            rates: vec![50.0],
            clients: vec![64],
            ..both
        };
        let p = check_args(&a).unwrap();
        let labels: Vec<String> = point_keys(&a, &p)
            .iter()
            .map(|k| format!("{} {}", k.split, k.load_label()))
            .collect();
        assert_eq!(labels, ["75/25 clients=64", "75/25 rate=50.0"]);
    }

    #[test]
    fn closed_loop_points_have_their_own_panels_and_single_server() {
        let closed = |mut p: SpecPoint, clients: u32| {
            p.load = "closed".into();
            p.clients = Some(clients);
            p
        };
        let pts = [
            point("acc64", SPLIT_SINGLE, 100.0, 90.0),
            closed(point("acc64", SPLIT_SINGLE, 95.0, 80.0), 64),
            closed(point("acc64", "75/25", 120.0, 120.0), 64),
            closed(point("spec32", "75/25", 170.0, 168.0), 256),
            point("spec32", "75/25", 200.0, 171.0),
        ];
        let refs: Vec<&SpecPoint> = pts.iter().collect();
        let t = peaks_and_break_even(&refs);
        // A peaks row with its spacing collapsed, found by its panel and system.
        let row = |panel: &str, sys: &str| {
            t.lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .find(|l| l.starts_with(&format!("{panel} {sys} ")))
                .unwrap_or_else(|| panic!("no {panel} {sys} row: {t}"))
        };
        // Closed against the closed single server (80), open against the open one (90).
        assert_eq!(
            row("split 75/25 closed", "acc64"),
            "split 75/25 closed acc64 120.0 1.50x"
        );
        assert_eq!(
            row("split 75/25 closed", "spec32"),
            "split 75/25 closed spec32 168.0 2.10x"
        );
        assert_eq!(
            row("split 75/25", "spec32"),
            "split 75/25 spec32 171.0 1.90x"
        );
        let table = table(&refs);
        assert!(
            table.contains("conn/s vs closed-loop users, split 75/25 closed (Fig. 3)"),
            "{table}"
        );
        assert!(
            table
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["256", "-", "168.0"]),
            "{table}"
        );
        let names: Vec<String> = figures(&refs).into_iter().map(|f| f.0).collect();
        assert!(
            names.contains(&"fig-spec-conn-split-75-25-closed.svg".to_string()),
            "{names:?}"
        );
        let any = pts[3].clone();
        let text = serde_json::to_string(&any).unwrap();
        assert!(
            text.contains("\"load\":\"closed\",\"clients\":256"),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<SpecPoint>(&text).unwrap(), any);
        // Repeats of a closed-loop point: its rate is what the users offered in all.
        let both = SpecPoint::combine(&[
            closed(point("spec32", "75/25", 100.0, 90.0), 64),
            closed(point("spec32", "75/25", 200.0, 95.0), 64),
        ]);
        assert_eq!((both.rate, both.offered_per_s), (150.0, 150.0));
        assert_eq!(both.clients, Some(64));
        // Points written before the closed loop read as open-loop points.
        let old = text.replace("\"load\":\"closed\",\"clients\":256,", "");
        let back: SpecPoint = serde_json::from_str(&old).unwrap();
        assert_eq!((back.load.as_str(), back.clients), ("open", None));
    }

    #[test]
    fn keys_cover_each_experiment_line_and_rate() {
        let a = SpeculativeArgs {
            rates: vec![50.0, 100.0],
            ..args()
        };
        let p = check_args(&a).unwrap();
        let names: Vec<String> = point_keys(&a, &p)
            .iter()
            .map(|k| format!("{} {} {} {}", k.experiment, k.system, k.split, k.rate))
            .collect();
        assert_eq!(names.len(), (3 + 2) * 2);
        assert_eq!(names[0], "single acc64 100 50");
        assert_eq!(names[5], "single acc128 100 100");
        assert_eq!(names[6], "split acc64 67/33 50");
        assert_eq!(names[9], "split acc64 75/25 100");
    }

    #[test]
    fn mac_is_read_from_ip_link() {
        let l = "3: eth0@if4: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue \
                 state UP mode DEFAULT group default qlen 1000\\    link/ether \
                 9a:3b:00:11:22:33 brd ff:ff:ff:ff:ff:ff link-netns fs-x";
        assert_eq!(mac_of(l).as_deref(), Some("9a:3b:00:11:22:33"));
        assert_eq!(mac_of("1: lo: <LOOPBACK>"), None);
    }

    fn point(system: &str, split: &str, rate: f64, conn: f64) -> SpecPoint {
        SpecPoint {
            experiment: if split == SPLIT_SINGLE {
                "single".into()
            } else {
                "split".into()
            },
            system: system.into(),
            split: split.into(),
            accept_queue: 64,
            rate,
            offered_per_s: rate,
            conn_per_s: conn,
            served: (conn * 10.0) as u64,
            duration_s: 10.0,
            capacity_rps: 98.5,
            runs: 1,
            ..SpecPoint::empty()
        }
    }

    #[test]
    fn repeats_combine_into_one_point_with_their_spread() {
        let a = point("spec32", "75/25", 200.0, 140.0);
        let b = point("spec32", "75/25", 200.0, 150.0);
        let c = SpecPoint::combine(&[a.clone(), b]);
        assert_eq!(c.runs, 2);
        assert!((c.conn_per_s - 145.0).abs() < 1e-9, "{}", c.conn_per_s);
        assert_eq!(c.conn_per_s_min, Some(140.0));
        assert_eq!(c.conn_per_s_max, Some(150.0));
        assert!(table(&[&c]).contains("(2 runs: 140.0-150.0 conn/s)"));
        let one = SpecPoint::combine(std::slice::from_ref(&a));
        assert_eq!((one.conn_per_s_min, one.conn_per_s_max), (None, None));
        // Per-second completions add up second by second, a shorter run's as far as
        // it goes; connect timeouts are summed.
        let s1 = SpecPoint {
            served_per_s: vec![10, 20, 30],
            connect_timeouts: 2,
            connect_errors: 1,
            io_errors: 4,
            ..a.clone()
        };
        let s2 = SpecPoint {
            served_per_s: vec![1, 2],
            connect_timeouts: 3,
            ..a
        };
        let both = SpecPoint::combine(&[s1, s2]);
        assert_eq!(both.served_per_s, vec![11, 22, 30]);
        assert_eq!(both.connect_timeouts, 5);
        assert_eq!((both.connect_errors, both.io_errors), (1, 4));
        assert!(!table(&[&one]).contains("runs:"));
    }

    #[test]
    fn points_round_trip_and_render() {
        let p = point("acc64", "75/25", 100.0, 90.0);
        let any = p.clone();
        let text = serde_json::to_string(&any).unwrap();
        for k in [
            "\"system\"",
            "\"split\"",
            "\"rate\"",
            "\"conn_per_s\"",
            "\"migrations\"",
            "\"migration_p50_us\":null",
            "\"migration_p99_us\":null",
        ] {
            assert!(text.contains(k), "{k}: {text}");
        }
        let back: SpecPoint = serde_json::from_str(&text).unwrap();
        assert_eq!(back, any);
        let pts = [
            p.clone(),
            point("acc64", SPLIT_SINGLE, 100.0, 80.0),
            point("acc96", SPLIT_SINGLE, 100.0, 85.0),
        ];
        let refs: Vec<&SpecPoint> = pts.iter().collect();
        let t = table(&refs);
        assert!(t.contains("Fig. 1") && t.contains("Fig. 3"), "{t}");
        assert!(t.contains("acc96"), "{t}");
        assert!(csv(&refs)
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("split,acc64,75/25,64,,100.000,"));
        let f = figures(&refs);
        let names: Vec<&str> = f.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "fig-spec-conn-split-75-25.svg",
                "fig-spec-rt-split-75-25.svg",
                "fig-spec-conn-single.svg",
                "fig-spec-rt-single.svg"
            ]
        );
        for (_, _, svg) in &f {
            crate::svg::check_well_formed(svg).unwrap();
        }
        let c = SpecPoint::combine(&[p.clone(), p.clone()]);
        assert_eq!((c.runs, c.served), (2, 1800));
        assert!((c.conn_per_s - 90.0).abs() < 1e-9);
    }
}
