//! `farside lab coop`: cooperative caching (seed 003, PRESS) on real nodes, on the
//! shared sweep runner.
//!
//! A virtual data-center (`--hosts netns`, root): `--nodes` back-end nodes (each in its
//! own namespace and cgroup, `--cpu-quota-pct` of a CPU), a front-end node `lb` (used by
//! the anchor only) and a client node. The files are the World Cup sample's objects at
//! their logged paths and sizes, each with content of its own (so a wrong body cannot
//! pass for a right one). The clients are the project's load generator
//! (`farside_loadgen`, closed and open loop, World Cup replay), one instance per node
//! (its `1/nodes` share of the clients or of the rate) as round-robin DNS spreads
//! clients, every 200's body checked against its file (`--check-root`).
//!
//! Systems:
//! - `rr`: `farside backend --coop --coop-policy rr` on every node: each caches alone;
//! - `press-tcp`: PRESS, a node that misses fetches from a peer whose directory says it
//!   caches the file, over TCP ([`farside_backend::coop::peer::PeerTransport`]);
//! - `press-udp`, `press-xdp`, `press-shm`: the same with `--coop-peer udp` (the peer's
//!   process answers UDP), `xdp` (one-sided READs of the peer's object arena answered by
//!   its XDP program on its `eth0`, a lab arena-reader key) or `shm` (the peer's arena
//!   file mapped read-only: a bound, the nodes being namespaces of one host);
//! - `lard`, `bounded-hash`: `farside proxy --balance lard | bounded-hash` on `lb`
//!   (content-aware balancing on `farside_coop::policy`'s LARD and bounded-load
//!   consistent hashing, load = the proxy's requests in service per node) over `rr`
//!   nodes;
//! - `haproxy`, the anchor: real HAProxy on `lb` hashing the URL with bounded load
//!   (`balance uri`, `hash-type consistent`, `hash-balance-factor 125`) over real nginx
//!   with `proxy_cache` on every node, each nginx's upstream a `farside backend --coop`
//!   origin in the same node serving the files through the same emulated disk and
//!   caching nothing (`--coop-cache-bytes 1`); nginx's cache manager wakes at least
//!   every second (`crate::nginx::PROXY_CACHE_BOUND_RULE`), and the cache runs over
//!   `max_size` by what it refills between sweeps (`--anchor-max-size-bytes` sets
//!   another `max_size`).
//!
//! Cache rule: every node caches `ceil(W90 / nodes)` bytes, W90 the bytes of the most
//! popular objects that receive 90 % of the requests (6.9 MB): together the nodes can
//! hold the hot set once, which only cooperation (or partitioning by URL) can exploit.
//! The anchor's nginx caches get the same bytes each. Every point records the bytes the
//! caches actually held at its end (`cache_held_bytes`, and nginx's allocated blocks)
//! and, sampled every [`HELD_SAMPLE_INTERVAL`] over the measured window, their mean and
//! largest (`cache_held_mean_bytes`, `cache_held_max_bytes`): the figures a comparison
//! at equal memory is set from.
//!
//! Directory (`--directory`, run-level): `datagram` (the nodes push sealed UDP
//! datagrams, PRESS's broadcast) or `read` (each node writes its directory record into
//! its own object arena and its peers read it one-sidedly, `--coop-directory read`;
//! press-xdp and press-shm only). Each point records the directory's own cost: the
//! datagrams and their bytes, or the pulls, their READs and bytes, failed and stale.
//!
//! Links (`--links`, Gbit/s; 0 = as the veth pair carries): `tc tbf` on both ends of
//! every back-end node's link, so its traffic to clients and peers shares the rate.
//!
//! Per-message overhead (`--message-overhead-us`, µs): the nodes' ablation knob
//! `--coop-message-overhead-us` (every peer message spins that much CPU first; see
//! `farside_backend::coop::overhead`); [`ablation`] prints throughput against it.
//!
//! Crash mode (`--crash-node N`, rr and press systems): node N's process is killed with
//! SIGKILL `--crash-at-s` seconds into every point's measured window, stays down
//! `--crash-down-ms`, and is started again with the same arguments (an empty cache, a
//! new arena). Every body the clients receive is still checked; the point records the
//! failures from the crash's second on, the time until the node listens again, and the
//! seconds until the cluster serves [`RECOVERED_FRACTION`] of its pre-crash rate again.

mod ablation;
mod client;
mod crash;
mod failures;
mod lab;
mod labels;
mod objects;
pub use labels::{link_label, load_label};
pub use objects::{object_body, write_objects};
mod usage;

pub use lab::run;

use crate::experiment::{LabPoint, NoExtra};
use crate::fabric::flags::{Hosts, LoadModels, SweepFlags};
use crate::summary::Summary;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

/// Nodes a run may have: 2 (the least that can cooperate) to 8 (the 2-CPU lab machine
/// cannot give more nodes a meaningful share).
pub const NODES_RANGE: std::ops::RangeInclusive<usize> = 2..=8;
/// Closed-loop clients per node at most.
pub const CLIENTS_PER_NODE_MAX: usize = 64;
/// Highest open-loop rate accepted, requests/s (all nodes): far above what eight
/// nodes of this machine serve.
pub const RATE_MAX: f64 = 100_000.0;
/// Fraction of requests whose objects' bytes set the cache size (see the module doc).
pub const CACHE_RULE_FRACTION: f64 = 0.9;
/// How often the lab samples what the caches hold during a measured window: nginx's
/// cache manager wakes at least every second (`inactive=1s`), so a sample a second
/// sees each of its fill-and-sweep cycles; one sample walks a few thousand files.
pub const HELD_SAMPLE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// Most `--repeat`.
pub const REPEAT_MAX: u32 = 10;
/// Longest `--crash-down-ms`: a node down longer than its peers' view TTL (3 s) is
/// already forgotten; 10 s leaves room for a slow restart while a point stays short.
pub const CRASH_DOWN_MS_MAX: u64 = 10_000;
/// Crash mode: the cluster has recovered in the first whole second after the crash that
/// serves at least this fraction of the mean rate of the seconds before it, with no
/// failure (a tenth below: the spread of one second's count in a steady run).
pub const RECOVERED_FRACTION: f64 = 0.9;
/// Systems crash mode can run: those whose nodes are `farside backend --coop` processes
/// that clients reach directly.
pub const CRASH_SYSTEMS: [&str; 5] = ["rr", "press-tcp", "press-udp", "press-xdp", "press-shm"];
/// Systems `--directory read` can run: the PRESS nodes with an object arena.
pub const DIRECTORY_READ_SYSTEMS: [&str; 2] = ["press-xdp", "press-shm"];
/// Systems whose directories `--directory write` can push: XDP answers the WRITEs.
pub const DIRECTORY_WRITE_SYSTEMS: [&str; 1] = ["press-xdp"];
/// The anchor's front-end node.
const LB: &str = "lb";

/// The network namespace of cooperating node `i`.
fn node_name(i: usize) -> String {
    format!("n{i}")
}

/// The systems built.
pub const SYSTEMS: [&str; 8] = [
    "rr",
    "press-tcp",
    "press-udp",
    "press-xdp",
    "press-shm",
    "lard",
    "bounded-hash",
    "haproxy",
];
/// Systems of the issue not built here, with why (in every run's notes).
pub const NOT_BUILT: &str = "press-udp, press-xdp and press-shm fetch bodies above 89,568 B \
(the arena's one-sided bound) over tcp; press-shm is a bound only possible on one host";

/// `farside lab coop`.
#[derive(Debug, Clone, clap::Args)]
pub struct CoopLabArgs {
    /// Output directory (summary.json, points.jsonl, table.txt, coop.csv, report.html,
    /// logs/).
    #[arg(long, default_value = "out/coop")]
    pub out: PathBuf,
    #[command(flatten)]
    pub sweep: SweepFlags,
    /// Where the nodes run: netns only (root: a namespace and cgroup per node).
    #[arg(long, value_enum, default_value_t = Hosts::Netns)]
    pub hosts: Hosts,
    /// Back-end node counts (comma-separated, each 2..=8). Default: 4.
    #[arg(long, value_delimiter = ',', default_value = "4")]
    pub nodes: Vec<usize>,
    /// Systems compared (comma-separated): rr, press-tcp, press-udp, press-xdp,
    /// press-shm, lard, bounded-hash, haproxy. Default: rr, press-tcp, lard,
    /// bounded-hash, haproxy.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "rr,press-tcp,lard,bounded-hash,haproxy"
    )]
    pub systems: Vec<String>,
    /// Load models: closed (clients per node), open (World Cup replay at --rates), both.
    /// Default: both.
    #[arg(long, value_enum, default_value_t = LoadModels::Both)]
    pub load: LoadModels,
    /// Closed loop: clients per node (each keeps its connection). Default: 4.
    #[arg(long = "clients-per-node", default_value_t = 4)]
    pub clients_per_node: usize,
    /// Open loop: offered rates, requests/s over all nodes (comma-separated); the World
    /// Cup log's own timing, compressed to that rate, one connection per request.
    /// Default: 1500,3000.
    #[arg(long, value_delimiter = ',', default_value = "1500,3000")]
    pub rates: Vec<f64>,
    /// Link rates of the back-end nodes, Gbit/s (comma-separated; tc tbf on both ends of
    /// each node's link; 0: not shaped). Default: 0.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub links: Vec<f64>,
    /// The per-message processor overhead ablation: µs of CPU every peer message costs
    /// the node that handles it (the back-ends' --coop-message-overhead-us, an
    /// experiment knob that adds cost), comma-separated, each at most 1,000. Default: 0.
    #[arg(
        long = "message-overhead-us",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub message_overhead_us: Vec<u64>,
    /// Measured seconds per point. Default: 15 (--quick: 3).
    #[arg(long = "duration-s")]
    pub duration_s: Option<u64>,
    /// Warm-up seconds per point (caches fill, directories spread). Default: 8
    /// (--quick: 2).
    #[arg(long = "warmup-s")]
    pub warmup_s: Option<u64>,
    /// CPU quota of each back-end node, percent of one CPU. Default: 40.
    #[arg(long = "cpu-quota-pct", default_value_t = 40)]
    pub cpu_quota_pct: u32,
    /// Emulated disk latency per read, µs (the back-end's --coop-disk-latency-us).
    #[arg(long = "disk-latency-us", default_value_t = farside_backend::coop::disk::DISK_LATENCY_US_DEFAULT)]
    pub disk_latency_us: u64,
    /// Each farside node's --coop-disk-queue-max (0: none; origins: none). Default 16.
    #[arg(long = "disk-queue-max", default_value_t = farside_backend::coop::disk::DISK_QUEUE_MAX_DEFAULT)]
    pub disk_queue_max: u64,
    /// Cache bytes per node; default by the rule of the module doc.
    #[arg(long = "cache-bytes")]
    pub cache_bytes: Option<u64>,
    /// The anchor only: nginx's `max_size` per node, bytes; default the cache bytes.
    /// nginx runs over `max_size` between its cache manager's sweeps, so matching its
    /// real footprint to the farside nodes' needs a lower `max_size` (see
    /// `cache_held_mean_bytes` in the points and docs/coop.md "Same memory").
    #[arg(long = "anchor-max-size-bytes")]
    pub anchor_max_size_bytes: Option<u64>,
    /// Run every point this many times (1..=10); runs are combined (means, counts
    /// summed).
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Trace replayed: gzip'd CSV in the World Cup sample's format
    /// (`timestamp,client_id,url,status,size`); its objects become the files, its
    /// sessions and timing the load, and the cache rule's W90 is computed from it. A
    /// synthetic trace of `farside trace synth` is labelled "synthetic, fitted to
    /// <source>" from the NAME.synth.json beside it (copied into the run directory).
    /// Default: the World Cup 1998 sample (data/wc98-day6-sample.csv.gz).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Crash mode: the back-end node (0-based index) killed with SIGKILL during every
    /// point's measured window and started again (systems rr and press-*). Default:
    /// none.
    #[arg(long = "crash-node")]
    pub crash_node: Option<usize>,
    /// Crash mode: seconds into the measured window at which --crash-node is killed (at
    /// least 1, and at least 1 before the window ends). Default: a third of the window.
    #[arg(long = "crash-at-s")]
    pub crash_at_s: Option<u64>,
    /// Crash mode: how long the killed node stays down before it is started again, ms
    /// (at most 10,000). Default: 1000.
    #[arg(long = "crash-down-ms", default_value_t = 1000)]
    pub crash_down_ms: u64,
    /// How the PRESS nodes' directories travel (the back-end's --coop-directory):
    /// `datagram` (pushed, sealed UDP), `read` (pulled one-sidedly from each node's
    /// arena; only press-xdp and press-shm) or `write` (WRITEn one-sidedly into per-peer
    /// slots of each node's arena; only press-xdp). Default: datagram.
    #[arg(long, value_enum, default_value = "datagram")]
    pub directory: farside_backend::coop::CoopDirectory,
}

/// One point's key.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Key {
    pub system: String,
    pub nodes: usize,
    pub link_gbit: f64,
    /// µs of CPU per peer message (the overhead ablation; 0: none).
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub message_overhead_us: u64,
    pub load_model: String,
    /// Closed loop: clients over all nodes (0 in the open loop).
    pub clients: usize,
    /// Open loop: offered requests/s (0 in the closed loop).
    pub rate: f64,
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct CoopPoint {
    pub system: String,
    pub nodes: usize,
    /// Cache bytes per node.
    pub cache_bytes: u64,
    /// Link rate of each back-end node, Gbit/s (0: not shaped).
    pub link_gbit: f64,
    /// µs of CPU every peer message cost the node handling it (the overhead ablation,
    /// `--coop-message-overhead-us`); 0: none, and left out of runs kept before it.
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub message_overhead_us: u64,
    /// Messages that paid it over the measured window, all nodes (`overhead_spins`).
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub overhead_spins: u64,
    pub load_model: String,
    pub clients: usize,
    /// Open loop: offered requests/s.
    pub rate: f64,
    pub runs: u32,
    pub duration_s: f64,
    /// Served (checked) responses per second.
    pub tps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Of the requests the nodes served: from the node's own cache, from a peer's, from
    /// the (emulated) disk. The anchor: nginx hits, none, origin reads.
    pub local_frac: f64,
    pub remote_frac: f64,
    pub miss_frac: f64,
    /// Peer fetches that found nothing (stale hint) or failed.
    pub wasted_fetches: u64,
    /// Body bytes moved between nodes (peer fetches).
    pub peer_bytes: u64,
    /// Intra-cluster body bytes per served request.
    pub peer_bytes_per_req: f64,
    /// Back-end nodes' CPU (their cgroups) per served request, µs.
    pub cpu_us_per_req: f64,
    /// The front-end's (`lb`) CPU per served request, µs (the anchor only).
    pub lb_cpu_us_per_req: f64,
    /// 200s whose body was not the file's.
    pub wrong_bodies: u64,
    /// Timeouts, connection errors, 5xx (503s included), shed arrivals (loadgen's
    /// failures, wrong bodies excluded).
    pub failures: u64,
    /// `failures` by kind (`failures::of_run`); absent from runs kept before.
    #[serde(default, skip_serializing_if = "failures::none")]
    pub failure_kinds: farside_loadgen::FailureCounts,
    /// Open loop: requests started per second.
    pub offered_rps: f64,
    pub directory_refused: u64,
    /// Body bytes the nodes' caches held at the end of the point, over all nodes
    /// (farside: the nodes' `cache_used_bytes`; nginx: its cache files' apparent
    /// bytes). 0 in runs kept before it was recorded.
    #[serde(default)]
    pub cache_held_bytes: u64,
    /// nginx: its cache files' allocated bytes (what its `max_size` counts); 0 for the
    /// farside systems.
    #[serde(default)]
    pub cache_disk_bytes: u64,
    /// Mean time of a peer fetch that brought a body, µs, as the initial nodes measure
    /// it (0: no remote hit).
    #[serde(default)]
    pub peer_fetch_us: f64,
    /// Body bytes the caches held over all nodes, the mean of samples taken every
    /// [`HELD_SAMPLE_INTERVAL`] over the measured window (same accounting as
    /// `cache_held_bytes`). 0 in runs kept before it was recorded.
    #[serde(default)]
    pub cache_held_mean_bytes: u64,
    /// The largest of those samples.
    #[serde(default)]
    pub cache_held_max_bytes: u64,
    /// The anchor: the CPU of the nginx processes in the back-end nodes per served
    /// request, µs (the rest of `cpu_us_per_req` is the origin's); 0 for the farside
    /// systems.
    #[serde(default)]
    pub nginx_cpu_us_per_req: f64,
    /// The nodes' CPU-quota throttling in the window (`cpu.stat`): the share of their CFS
    /// periods that used up the quota, and throttled ms per s per node (0: not recorded).
    #[serde(default, skip_serializing_if = "zero_f64")]
    pub throttled_period_frac: f64,
    #[serde(default, skip_serializing_if = "zero_f64")]
    pub throttled_ms_per_s: f64,
    /// The host's busy CPU (`/proc/stat`, all CPUs: nodes, clients, kernel) per served
    /// request, µs, and as a share of its CPUs (0: not recorded).
    #[serde(default, skip_serializing_if = "zero_f64")]
    pub host_busy_us_per_req: f64,
    #[serde(default, skip_serializing_if = "zero_f64")]
    pub host_busy_frac: f64,
    /// The host's speed before the point: busy ns per round trip of the fixed reference
    /// workload (`fabric::hostspeed`; 0: not recorded). The model scales its costs by it.
    #[serde(default, skip_serializing_if = "zero_f64")]
    pub host_ref_ns_per_op: f64,
    /// Crash mode: the node killed and restarted in the measured window (None: no
    /// crash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_node: Option<usize>,
    /// Crash mode: failures (loadgen's, wrong bodies excluded) from the crash's second
    /// to the end of the window.
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub crash_failures: u64,
    /// Crash mode: from the kill until the restarted node accepted a connection, ms
    /// (includes `--crash-down-ms`).
    #[serde(default, skip_serializing_if = "zero_f64")]
    pub restart_ms: f64,
    /// Crash mode: whole seconds from the crash's second to the first second serving
    /// [`RECOVERED_FRACTION`] of the pre-crash rate with no failure; -1 if not within
    /// the window. Combined runs: the worst.
    #[serde(default, skip_serializing_if = "zero_f64")]
    pub recovery_s: f64,
    /// Crash mode: served per second before the crash, and the fewest in a second after.
    #[serde(default, skip_serializing_if = "zero_f64")]
    pub pre_crash_tps: f64,
    #[serde(default, skip_serializing_if = "zero_f64")]
    pub crash_min_tps: f64,
    /// How the directories travelled: `datagram` or `read` (`--directory`); runs kept
    /// before it was recorded were `datagram`, and it is left out of their points.
    #[serde(default = "datagram", skip_serializing_if = "is_datagram")]
    pub directory: String,
    /// Directory datagrams the nodes sent in the window (one per peer per publication),
    /// and their bytes (sealed).
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_sent: u64,
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_sent_bytes: u64,
    /// `read`: pulls of a peer's directory record in the window, over all nodes.
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_reads: u64,
    /// `read`: the READs (press-xdp, resends included) or chunk copies (press-shm) the
    /// pulls made, and the bytes they moved.
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_read_ops: u64,
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_read_bytes: u64,
    /// `read`: pulls that gave no valid record, and records older than the last
    /// accepted: dropped, never applied.
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_read_failed: u64,
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_read_stale: u64,
    /// `write`: publications WRITEn into peers' slots, the acknowledged WRITEs and their
    /// bytes, failed publications, and slot looks found torn (never applied).
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_writes: u64,
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_write_ops: u64,
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_write_bytes: u64,
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_write_failed: u64,
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub directory_slot_torn: u64,
}

fn datagram() -> String {
    "datagram".into()
}
fn is_datagram(d: &String) -> bool {
    d == "datagram"
}

/// Crash figures are left out of points without a crash (runs kept before crash mode
/// re-render as they were).
fn zero_u64(v: &u64) -> bool {
    *v == 0
}

fn zero_f64(v: &f64) -> bool {
    *v == 0.0
}

impl LabPoint for CoopPoint {
    type Extra = NoExtra;

    fn take_extra(&mut self) -> NoExtra {
        NoExtra {}
    }

    fn put_extra(&mut self, _: NoExtra) {}

    /// Counts summed, rates, fractions and times averaged over the runs (p99: the mean
    /// of the runs' p99s).
    fn combine(runs: &[CoopPoint]) -> CoopPoint {
        let Some(first) = runs.first() else {
            return CoopPoint::default();
        };
        if runs.len() == 1 {
            return first.clone();
        }
        let n = runs.len() as f64;
        let f = |g: fn(&CoopPoint) -> f64| runs.iter().map(g).sum::<f64>() / n;
        let sum = |g: fn(&CoopPoint) -> u64| runs.iter().map(g).sum::<u64>();
        CoopPoint {
            runs: runs.iter().map(|p| p.runs).sum(),
            duration_s: f(|p| p.duration_s),
            tps: f(|p| p.tps),
            p50_ms: f(|p| p.p50_ms),
            p99_ms: f(|p| p.p99_ms),
            local_frac: f(|p| p.local_frac),
            remote_frac: f(|p| p.remote_frac),
            miss_frac: f(|p| p.miss_frac),
            wasted_fetches: sum(|p| p.wasted_fetches),
            peer_bytes: sum(|p| p.peer_bytes),
            peer_bytes_per_req: f(|p| p.peer_bytes_per_req),
            cpu_us_per_req: f(|p| p.cpu_us_per_req),
            lb_cpu_us_per_req: f(|p| p.lb_cpu_us_per_req),
            wrong_bodies: sum(|p| p.wrong_bodies),
            failures: sum(|p| p.failures),
            failure_kinds: failures::sum(runs.iter().map(|p| &p.failure_kinds)),
            offered_rps: f(|p| p.offered_rps),
            directory_refused: sum(|p| p.directory_refused),
            cache_held_bytes: sum(|p| p.cache_held_bytes) / runs.len() as u64,
            cache_disk_bytes: sum(|p| p.cache_disk_bytes) / runs.len() as u64,
            peer_fetch_us: f(|p| p.peer_fetch_us),
            cache_held_mean_bytes: sum(|p| p.cache_held_mean_bytes) / runs.len() as u64,
            cache_held_max_bytes: runs
                .iter()
                .map(|p| p.cache_held_max_bytes)
                .max()
                .unwrap_or(0),
            nginx_cpu_us_per_req: f(|p| p.nginx_cpu_us_per_req),
            throttled_period_frac: f(|p| p.throttled_period_frac),
            throttled_ms_per_s: f(|p| p.throttled_ms_per_s),
            host_busy_us_per_req: f(|p| p.host_busy_us_per_req),
            host_busy_frac: f(|p| p.host_busy_frac),
            host_ref_ns_per_op: f(|p| p.host_ref_ns_per_op),
            overhead_spins: sum(|p| p.overhead_spins),
            crash_failures: sum(|p| p.crash_failures),
            restart_ms: f(|p| p.restart_ms),
            recovery_s: if runs.iter().any(|p| p.recovery_s < 0.0) {
                -1.0
            } else {
                runs.iter().map(|p| p.recovery_s).fold(0.0, f64::max)
            },
            pre_crash_tps: f(|p| p.pre_crash_tps),
            crash_min_tps: f(|p| p.crash_min_tps),
            directory_sent: sum(|p| p.directory_sent),
            directory_sent_bytes: sum(|p| p.directory_sent_bytes),
            directory_reads: sum(|p| p.directory_reads),
            directory_read_ops: sum(|p| p.directory_read_ops),
            directory_read_bytes: sum(|p| p.directory_read_bytes),
            directory_read_failed: sum(|p| p.directory_read_failed),
            directory_read_stale: sum(|p| p.directory_read_stale),
            ..first.clone()
        }
    }

    fn progress_line(&self) -> String {
        format!(
            "tps={:.0} p99={:.1}ms local={:.3} remote={:.3} miss={:.3} wrong={} failures={}",
            self.tps,
            self.p99_ms,
            self.local_frac,
            self.remote_frac,
            self.miss_frac,
            self.wrong_bodies,
            self.failures
        )
    }
}

/// `lab coop` for the sweep runner and the report shell.
pub struct Coop;

impl crate::experiment::Experiment for Coop {
    const NAME: &'static str = "coop";
    type Args = CoopLabArgs;
    type Point = CoopPoint;

    fn run(args: CoopLabArgs) -> io::Result<()> {
        run(args)
    }

    fn table(s: &Summary<CoopPoint>) -> String {
        if s.points.is_empty() {
            return String::new();
        }
        table(&s.points) + "\n"
    }

    fn files(s: &Summary<CoopPoint>) -> io::Result<Vec<(String, String)>> {
        if s.points.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![
            ("coop.csv".to_string(), csv(&s.points)?),
            (
                "table.txt".to_string(),
                crate::report::table_text::<Coop>(s),
            ),
        ])
    }

    fn figures(s: &Summary<CoopPoint>) -> Vec<crate::experiment::Figure> {
        figures(&s.points)
    }

    fn html(s: &Summary<CoopPoint>) -> String {
        if s.points.is_empty() {
            return String::new();
        }
        format!(
            "<h2>Cooperative caching</h2>\n<pre>{}</pre>\n",
            crate::svg::escape(&table(&s.points))
        )
    }
}

/// The text table of the points.
pub fn table(points: &[CoopPoint]) -> String {
    // The overhead column only when a point has one (earlier runs render as they were).
    let ovh = with_overhead(points);
    let link = |l: String, o: String| {
        if ovh {
            format!("{l:>5} {o:>6}")
        } else {
            format!("{l:>5}")
        }
    };
    let mut s = format!(
        "{:<10} {:>5} {:>9} {} {:<6} {:>7} {:>7} {:>8} {:>8} {:>6} {:>6} {:>6} {:>7} {:>8} {:>7} {:>6} {:>6}\n",
        "system",
        "nodes",
        "cache_B",
        link("link".into(), "ovh_us".into()),
        "load",
        "clients",
        "rate",
        "tps",
        "p99_ms",
        "local",
        "remote",
        "miss",
        "us/req",
        "peerB/rq",
        "wasted",
        "wrong",
        "fail"
    );
    for p in points {
        s += &format!(
            "{:<10} {:>5} {:>9} {} {:<6} {:>7} {:>7.0} {:>8.1} {:>8.2} {:>6.3} {:>6.3} {:>6.3} {:>7.0} {:>8.0} {:>7} {:>6} {:>6}\n",
            p.system,
            p.nodes,
            p.cache_bytes,
            link(link_label(p.link_gbit), p.message_overhead_us.to_string()),
            p.load_model,
            p.clients,
            p.rate,
            p.tps,
            p.p99_ms,
            p.local_frac,
            p.remote_frac,
            p.miss_frac,
            p.cpu_us_per_req,
            p.peer_bytes_per_req,
            p.wasted_fetches,
            p.wrong_bodies,
            p.failures
        );
    }
    s += &bandwidth_lines(points);
    s += &ablation::overhead_lines(&overhead_points(points));
    s += &held_lines(points);
    s += &throttle_lines(points);
    s += &failures::lines(points.iter().map(|p| (point_label(p), &p.failure_kinds)));
    s += &crash_lines(points);
    s += &directory_lines(points);
    s
}

/// Whether any point ran with a per-message overhead (the table and csv then show it).
fn with_overhead(points: &[CoopPoint]) -> bool {
    points.iter().any(|p| p.message_overhead_us > 0)
}

/// The points as the overhead ablation reads them.
fn overhead_points(points: &[CoopPoint]) -> Vec<ablation::OverheadPoint> {
    points
        .iter()
        .map(|p| {
            let served = p.tps * p.duration_s * f64::from(p.runs.max(1));
            ablation::OverheadPoint {
                config: format!(
                    "{} {} nodes {} {} link {}",
                    p.system,
                    p.nodes,
                    p.load_model,
                    load_label(&p.load_model, p.rate, p.clients),
                    link_label(p.link_gbit)
                ),
                overhead_us: p.message_overhead_us,
                tps: p.tps,
                p99_ms: p.p99_ms,
                cpu_us_per_req: p.cpu_us_per_req,
                peer_fetch_us: p.peer_fetch_us,
                spins_per_req: if served > 0.0 {
                    p.overhead_spins as f64 / served
                } else {
                    0.0
                },
            }
        })
        .collect()
}

/// The directory's own cost per point that recorded it (none in runs kept before it
/// was): per second of the window over all nodes (summed runs: per run-second).
fn directory_lines(points: &[CoopPoint]) -> String {
    let mut out = String::new();
    for p in points
        .iter()
        .filter(|p| p.directory_sent + p.directory_reads > 0)
    {
        let secs = (p.duration_s * f64::from(p.runs.max(1))).max(1e-9);
        let per_s = |v: u64| v as f64 / secs;
        let (d, s) = (&p.directory, &p.system);
        let load = match p.load_model.as_str() {
            "open" => format!("open {:.0}/s", p.rate),
            m => format!("{m} {} clients", p.clients),
        };
        out += &match d.as_str() {
            "read" => format!(
                "directory ({d}): {s} {load}: {:.0} pulls/s ({:.0} READs/s, {:.0} B/s), {} failed, {} stale; {} datagrams\n",
                per_s(p.directory_reads),
                per_s(p.directory_read_ops),
                per_s(p.directory_read_bytes),
                p.directory_read_failed,
                p.directory_read_stale,
                p.directory_sent
            ),
            _ => format!(
                "directory ({d}): {s} {load}: {:.0} datagrams/s ({:.0} B/s)\n",
                per_s(p.directory_sent),
                per_s(p.directory_sent_bytes)
            ),
        };
    }
    out
}

/// `system load_model load`: which point a line under the table is about.
fn point_label(p: &CoopPoint) -> String {
    let load = load_label(&p.load_model, p.rate, p.clients);
    format!("{} {} {load}", p.system, p.load_model)
}

/// The nodes' throttling and the host's busy CPU of each point that recorded them.
fn throttle_lines(points: &[CoopPoint]) -> String {
    let mut out = String::new();
    for p in points.iter().filter(|p| p.throttled_period_frac > 0.0) {
        out += &format!(
            "throttled: {}: {:.1} % of the nodes' CFS periods, {:.2} ms/s per node\n",
            point_label(p),
            p.throttled_period_frac * 100.0,
            p.throttled_ms_per_s
        );
    }
    for p in points.iter().filter(|p| p.host_busy_us_per_req > 0.0) {
        let speed = match p.host_ref_ns_per_op {
            r if r > 0.0 => format!("; reference {r:.0} ns busy per round trip"),
            _ => String::new(),
        };
        out += &format!(
            "host CPU: {}: {:.1} us busy per request over all CPUs, {:.0} % of the host's CPUs busy{speed}\n",
            point_label(p),
            p.host_busy_us_per_req,
            p.host_busy_frac * 100.0
        );
    }
    out
}

/// Crash mode's figures, one line per point that crashed a node (none otherwise).
fn crash_lines(points: &[CoopPoint]) -> String {
    let mut out = String::new();
    for p in points {
        let Some(n) = p.crash_node else { continue };
        out += &format!(
            "crash: {}: node {n} killed; restarted (listening) after {:.0} ms; \
             recovered ({:.0} % of {:.0}/s, no failure) after {}; fewest {:.0}/s; \
             {} failures from the crash on; wrong bodies {}\n",
            point_label(p),
            p.restart_ms,
            RECOVERED_FRACTION * 100.0,
            p.pre_crash_tps,
            if p.recovery_s < 0.0 {
                "never in the window".to_string()
            } else {
                format!("{:.0} s", p.recovery_s)
            },
            p.crash_min_tps,
            p.crash_failures,
            p.wrong_bodies
        );
    }
    out
}

/// What the caches held at the end of each point that recorded it (runs kept before
/// it was recorded have none, and render as before).
fn held_lines(points: &[CoopPoint]) -> String {
    let mut out = String::new();
    for p in points.iter().filter(|p| p.cache_held_bytes > 0) {
        out += &format!(
            "cache held: {}: {} B over {} nodes ({:.0} B each, {:.2}x the {} B per node given){}\n",
            point_label(p),
            p.cache_held_bytes,
            p.nodes,
            p.cache_held_bytes as f64 / p.nodes.max(1) as f64,
            p.cache_held_bytes as f64 / (p.cache_bytes.max(1) * p.nodes.max(1) as u64) as f64,
            p.cache_bytes,
            if p.cache_disk_bytes > 0 {
                format!("; on disk {} B", p.cache_disk_bytes)
            } else {
                String::new()
            }
        );
        if p.cache_held_mean_bytes > 0 {
            let per_node = |b: u64| b as f64 / p.nodes.max(1) as f64;
            out += &format!(
                "  over the window: mean {:.0} B per node ({:.2}x), max {:.0} B per node{}\n",
                per_node(p.cache_held_mean_bytes),
                per_node(p.cache_held_mean_bytes) / p.cache_bytes.max(1) as f64,
                per_node(p.cache_held_max_bytes),
                if p.nginx_cpu_us_per_req > 0.0 {
                    format!(
                        "; CPU per request: nginx {:.0} us, origin {:.0} us, front-end {:.0} us",
                        p.nginx_cpu_us_per_req,
                        p.cpu_us_per_req - p.nginx_cpu_us_per_req,
                        p.lb_cpu_us_per_req
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    out
}

/// The bandwidth ablation: each system's throughput at the lowest shaped rate against
/// the highest, per load (the paper: ~6 % for PRESS from 1 to 10 Gbit/s... of its day).
fn bandwidth_lines(points: &[CoopPoint]) -> String {
    let mut out = String::new();
    for p in points.iter().filter(|p| p.link_gbit > 0.0) {
        let lower = points.iter().find(|q| {
            q.system == p.system
                && q.nodes == p.nodes
                && q.load_model == p.load_model
                && q.clients == p.clients
                && q.rate == p.rate
                && q.link_gbit > 0.0
                && q.link_gbit < p.link_gbit
        });
        if let Some(q) = lower {
            if p.tps > 0.0 {
                out += &format!(
                    "bandwidth: {} {} nodes {} {}: {} -> {}: tps {:.1} -> {:.1} ({:+.1} %)\n",
                    p.system,
                    p.nodes,
                    p.load_model,
                    load_label(&p.load_model, p.rate, p.clients),
                    link_label(p.link_gbit),
                    link_label(q.link_gbit),
                    p.tps,
                    q.tps,
                    (q.tps / p.tps - 1.0) * 100.0
                );
            }
        }
    }
    out
}

/// `coop.csv`: every point.
pub fn csv(points: &[CoopPoint]) -> io::Result<String> {
    let f = crate::report::fmt_num;
    // The overhead columns only when a point has one (earlier runs render as they were).
    let ovh = with_overhead(points);
    let mut head = vec![
        "system",
        "nodes",
        "cache_bytes",
        "link_gbit",
        "load_model",
        "clients",
        "rate",
        "runs",
        "tps",
        "p50_ms",
        "p99_ms",
        "local_frac",
        "remote_frac",
        "miss_frac",
        "wasted_fetches",
        "peer_bytes",
        "peer_bytes_per_req",
        "cpu_us_per_req",
        "lb_cpu_us_per_req",
        "wrong_bodies",
        "failures",
        "offered_rps",
    ];
    if ovh {
        head.insert(4, "message_overhead_us");
        head.push("overhead_spins");
    }
    crate::report::csv_text(
        &head,
        points.iter().map(|p| {
            let mut row = vec![
                p.system.clone(),
                p.nodes.to_string(),
                p.cache_bytes.to_string(),
                f(p.link_gbit),
                p.load_model.clone(),
                p.clients.to_string(),
                f(p.rate),
                p.runs.to_string(),
                f(p.tps),
                f(p.p50_ms),
                f(p.p99_ms),
                f(p.local_frac),
                f(p.remote_frac),
                f(p.miss_frac),
                p.wasted_fetches.to_string(),
                p.peer_bytes.to_string(),
                f(p.peer_bytes_per_req),
                f(p.cpu_us_per_req),
                f(p.lb_cpu_us_per_req),
                p.wrong_bodies.to_string(),
                p.failures.to_string(),
                f(p.offered_rps),
            ];
            if ovh {
                row.insert(4, p.message_overhead_us.to_string());
                row.push(p.overhead_spins.to_string());
            }
            row
        }),
    )
}

/// Figures: open-loop served vs offered rate per system, and the local / remote / miss
/// split of each closed-loop point.
fn figures(points: &[CoopPoint]) -> Vec<crate::experiment::Figure> {
    let mut out = Vec::new();
    let open: Vec<&CoopPoint> = points.iter().filter(|p| p.load_model == "open").collect();
    if !open.is_empty() {
        let mut chart = crate::svg::Chart::new(
            "Open loop: served vs offered",
            "offered requests/s",
            "served requests/s",
        );
        let mut names: Vec<String> = Vec::new();
        for p in &open {
            let name = series_name(p);
            if !names.contains(&name) {
                names.push(name);
            }
        }
        for name in &names {
            let pts = open
                .iter()
                .filter(|p| &series_name(p) == name)
                .map(|p| (p.rate, p.tps))
                .collect();
            chart = chart.series(name, pts);
        }
        out.push((
            "open.svg".to_string(),
            "Open loop: served (checked) responses/s against the offered rate, per system, \
             node count and link rate"
                .to_string(),
            chart.to_svg(),
        ));
    }
    let closed: Vec<&CoopPoint> = points.iter().filter(|p| p.load_model == "closed").collect();
    if !closed.is_empty() {
        let mut chart = crate::svg::Chart::new(
            "Closed loop: where requests were served",
            "point",
            "fraction of requests",
        );
        for (name, g) in [
            (
                "local",
                (|p: &CoopPoint| p.local_frac) as fn(&CoopPoint) -> f64,
            ),
            ("remote", |p: &CoopPoint| p.remote_frac),
            ("miss", |p: &CoopPoint| p.miss_frac),
        ] {
            chart = chart.scatter(
                name,
                closed
                    .iter()
                    .enumerate()
                    .map(|(i, p)| (i as f64, g(p)))
                    .collect(),
            );
        }
        let legend: Vec<String> = closed
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{i}: {}", series_name(p)))
            .collect();
        out.push((
            "split.svg".to_string(),
            format!(
                "Closed loop: local / remote / miss fractions per point ({})",
                legend.join("; ")
            ),
            chart.to_svg(),
        ));
    }
    out.extend(ablation::overhead_figure(&overhead_points(points)));
    out
}

fn series_name(p: &CoopPoint) -> String {
    let name = format!("{} n{} {}", p.system, p.nodes, link_label(p.link_gbit));
    if p.message_overhead_us > 0 {
        format!("{name} +{}us", p.message_overhead_us)
    } else {
        name
    }
}

/// Cache bytes per node by the rule of the module doc.
pub fn cache_rule(trace: &farside_coop::trace::Trace, nodes: usize) -> u64 {
    trace
        .working_set_bytes(CACHE_RULE_FRACTION)
        .div_ceil(nodes as u64)
}

#[cfg(test)]
mod tests;
