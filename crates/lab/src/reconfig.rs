//! `farside lab reconfig`: seed 001's reconfiguration experiment (issue 11 item 6).
//!
//! A shared data-center of N back-end nodes (N = the scenario's sum: `3:3:2` and
//! `2:2:2:2` are 8) hosting several sites, each node in its own network namespace (or,
//! `--hosts loopback`, as processes on 127.0.0.1: [`loopback`]) and cgroup with a CPU
//! quota (`--node-cpu-pct`; default: the back-ends together get half of
//! the machine's CPUs, each node an equal share, so nodes saturate independently). Every
//! node runs `farside backend --sites-root DIR --site S --control SOCK` (DIR holds one
//! directory per site with a 1 KiB file, the paper's 1 KB files; `--cpu-us-per-request`
//! emulates a costlier server, as Apache was on the paper's nodes) and `farside gatherd`
//! with the node agent (`--role-backend-control SOCK --role-sites s0,s1,..
//! --role-initial i --rw-key KEY`), `--cgroup` at the node's cgroup so the load it
//! publishes is the node's own, and the region served over `--transport`: `xdp` (udp
//! answered by XDP in the node's kernel: one-sided) or `tcp` (gatherd's user-space tcp
//! server: two-sided, it needs the node's CPU, which the loaded nodes are short of); on
//! loopback `shm` (one-sided on one host), `tcp` or `udp`.
//!
//! `--proxies` proxies (`p0`, `p1`, ..) share the client load; each has a `[[sites]]`
//! entry per site (hosts `s0.example`, ..; anchor: the site's first node) and, for the
//! `reconf` system, `[reconf]` with every balancer's region. Their TOML is written to
//! `configs/` in the output directory.
//!
//! Systems:
//! - `rigid`: the scenario's static allocation (sites get consecutive nodes in ratio
//!   order), no `[reconf]`.
//! - `overprovisioned`: the loaded site statically has N − (sites − 1) nodes. The
//!   loaded site changes every burst, so before each burst the lab itself moves every
//!   non-anchor node to the burst's site by remote CAS on `ROLE_WANTED` and waits until
//!   every proxy routes to them; that set-up time is not counted in the TPS (the best
//!   static case, which a real data-center pays for with that many nodes per site).
//! - `reconf`: starts as `rigid`; the proxies' balancers move nodes (`[reconf]`).
//!
//! Load: bursts of L requests to one site (the Host header), then L to the next, cycling
//! over the sites `--cycles` times (`sites × cycles` bursts per point), run as one
//! closed-loop loadgen per proxy in parallel (`--clients` split over them, L split
//! likewise). A point is (system, scenario, L); its `tps` = requests served / the summed
//! wall time of its bursts. Moves: the proxies' `farside_reconf_moves_total` (summed);
//! switching time: from a balancer's move CAS to the node's first request served in the
//! new role, and decision-to-move latency, both joined per move from the processes' logs
//! ([`timing`]); the agents' apply time: the gatherds' `farside_gatherd_role_switch_ms`
//! histogram over the point (new wanted value seen → served, drain included), p50/p99
//! interpolated. Figures: [`figures`] (Fig. 7-9). `--sweep-t` sweeps T. Every
//! [`SERIES_EVERY`] the lab reads proxy `p0`'s `farside_proxy_site_backends{site}` for
//! the loaded site: the nodes serving it over time (Fig. 8/9), kept in the point.
//! Every point starts from fresh processes (allocation, balancer history and metrics
//! reset); the namespaces are built once per run.

use crate::fabric::netns::{NodeSpec, VirtualDc};
use crate::fabric::procs::Child;
use farside_loadgen::LoadgenArgs;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub mod figures;
pub mod loopback;
pub mod timing;

/// The systems compared.
pub const SYSTEMS: [&str; 3] = ["rigid", "overprovisioned", "reconf"];
/// The paper's scenarios (3 sites 3:3:2, 4 sites 2:2:2:2 on 8 nodes).
pub const SCENARIOS: [&str; 2] = ["3:3:2", "2:2:2:2"];
/// Burst lengths of a full run (the paper spans 512..16,384).
pub const BURSTS_FULL: [u64; 4] = [512, 2048, 8192, 16384];
/// Burst lengths of `--quick`.
pub const BURSTS_QUICK: [u64; 2] = [512, 4096];
/// Most back-end nodes in a scenario: the virtual data-center holds at most
/// [`crate::fabric::netns::MAX_NODES`] nodes, and the proxies' table is scanned per request.
pub const SCENARIO_NODES_MAX: usize = 64;
/// Most sites: a site id is 16 bits in the role word, but the lab's sites are the
/// proxies' `[[sites]]` and its bursts cycle over all of them.
pub const SITES_MAX: usize = 32;
/// Lowest default node quota, percent of one CPU: below it a node's scheduling slices
/// (CFS period 100 ms) make its service bursty rather than slow.
pub const NODE_CPU_PCT_MIN: u32 = 5;
/// The size of each site's file (the paper's 1 KB files).
pub const FILE_BYTES: usize = 1024;
/// The path every request asks for.
pub const FILE_PATH: &str = "/f1k";
/// Period of the nodes-serving-the-loaded-site series (the 100 ms).
pub const SERIES_EVERY: Duration = Duration::from_millis(100);
/// Read-write key of the nodes' regions (balancers and the lab CAS with it).
pub const RW_KEY: &str = "5eed0001";
/// Longest wait for a process to listen, or for the proxies to see an allocation.
const READY_MAX: Duration = Duration::from_secs(20);
/// Poll period while waiting for an allocation to be served.
const POLL: Duration = Duration::from_millis(20);
/// Longest one burst may run (loadgen's duration bound; a burst still running then has
/// a stuck tier, and its point reports what was served by then).
const BURST_TIME_MAX_S: f64 = 900.0;
/// Timeout of the lab's own remote ops (overprovisioned set-up), per op.
const RMEM_TIMEOUT: Duration = Duration::from_millis(500);
/// Attempts at one CAS of the lab's (a concurrent agent write only changes the version).
const CAS_ATTEMPTS: usize = 5;
/// Fixed ports of the netns tier (each node has its own IP).
const WEB_PORT: u16 = 80;
const REGION_UDP_PORT: u16 = 7002;
const REGION_TCP_PORT: u16 = 7001;
const GATHERD_METRICS_PORT: u16 = 9200;
const PROXY_PORT: u16 = 8080;
const ADMIN_PORT: u16 = 9100;
/// Each proxy's own balancer region (rmem tcp server of `[reconf]`).
const BALANCER_PORT: u16 = 7100;
/// gatherd's sampling period, µs: one CFS period of the nodes' quota, so each
/// utilisation sample averages a whole period (a 1 ms sample of a throttled node reads
/// either full or idle, and a site would never look overloaded for T in a row).
const GATHERD_PERIOD_US: u64 = crate::fabric::netns::CPU_PERIOD_US;
/// The proxies' `admission.stale_after_ms` (admission stays off; routing still
/// distrusts a region that stops advancing): several gatherd periods.
const STALE_AFTER_MS: u64 = 5 * GATHERD_PERIOD_US / 1000;
/// Bits of a role word's version (`site << 48 | version`, docs/reconf.md).
const ROLE_VERSION_BITS: u32 = 48;
/// --history-ms's default T, ms (the balancer's default).
const DEFAULT_HISTORY_MS: u64 = 500;

/// `farside lab reconfig`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReconfigArgs {
    /// Output directory (summary.json, points.jsonl, table.txt, reconfig.csv, series
    /// CSVs, configs/, logs/).
    #[arg(long, default_value = "out/reconfig")]
    pub out: PathBuf,
    /// Continue the broken run kept in DIR: points already measured are skipped.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Bursts 512,4096 and the scenario 2:2:2:2 only (unless given), for CI (< 5 min).
    #[arg(long)]
    pub quick: bool,
    /// Where the nodes run: netns (root: one namespace and cgroup per node, so each
    /// node's CPU and load are its own) or loopback (processes on 127.0.0.1; as root each
    /// node a cgroup with a CPU quota, otherwise no quota: capacity from
    /// --backend-workers x --cpu-us-per-request only, and every node publishes the
    /// host's load; stated in the output).
    #[arg(long, default_value = "netns")]
    pub hosts: String,
    /// Systems to compare (comma-separated): rigid, overprovisioned, reconf.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "rigid,overprovisioned,reconf"
    )]
    pub systems: Vec<String>,
    /// Scenarios: node ratios per site, e.g. 3:3:2 (3 sites on 8 nodes). Default:
    /// 3:3:2,2:2:2:2 (--quick: 2:2:2:2).
    #[arg(long, value_delimiter = ',')]
    pub scenario: Vec<String>,
    /// Burst lengths L (requests per burst). Default 512,2048,8192,16384 (--quick:
    /// 512,4096).
    #[arg(long, value_delimiter = ',')]
    pub bursts: Vec<u64>,
    /// Rounds over the sites per point (each a burst of L to every site in turn).
    #[arg(long, default_value_t = 1)]
    pub cycles: usize,
    /// Closed-loop clients in all, split over the proxies.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Proxies sharing the client load (each a balancer under `reconf`).
    #[arg(long, default_value_t = 2)]
    pub proxies: usize,
    /// CPU quota of each back-end node, percent of one CPU. Default: half the machine's
    /// CPUs shared equally by the nodes (100 × CPUs / (2 × nodes), at least 5).
    #[arg(long)]
    pub node_cpu_pct: Option<u32>,
    /// Region transport of the back-ends, which the balancers' locks and moves and the
    /// proxies' monitor use alike. --hosts netns: xdp (udp answered by XDP, one-sided;
    /// default) or tcp (gatherd's user-space server, two-sided). --hosts loopback: shm
    /// (the region file mapped by the proxies, CAS and FETCH-ADD in place: one-sided;
    /// default), tcp or udp (gatherd's user-space servers: two-sided).
    #[arg(long)]
    pub transport: Option<String>,
    /// S: the balancers' period, ms (the balancer's default: docs/reconf.md states its
    /// rule).
    #[arg(long, default_value_t = 250)]
    pub sensitivity_ms: u64,
    /// T: how long a site stays overloaded before it gets a node, ms. Several values
    /// (comma-separated) sweep T like --sweep-t.
    #[arg(long, value_delimiter = ',', default_value = "500")]
    pub history_ms: Vec<u64>,
    /// Sweep T (the history window, ms; comma-separated, e.g. 300,1000,2000,5000): one
    /// `reconf` point per value (`reconf-T<ms>`), and a table of T vs moves vs TPS
    /// (thrashing against responsiveness, which the paper leaves unexplored). Replaces
    /// --history-ms (giving both is refused).
    #[arg(long, value_delimiter = ',', value_name = "T1,T2,..")]
    pub sweep_t: Vec<u64>,
    /// Lease of a site lock, ms.
    #[arg(long, default_value_t = 3000)]
    pub lease_ms: u64,
    /// A site is overloaded when its nodes' mean CPU use is at least this share of a
    /// node's quota, percent (converted to gatherd's ppm: `high_ppm` in params).
    #[arg(long, default_value_t = 80)]
    pub high_pct: u32,
    /// A donor's load over one node fewer must stay under this share of a node's quota,
    /// percent (`spare_ppm` in params).
    #[arg(long, default_value_t = 60)]
    pub spare_pct: u32,
    /// Worker threads of each back-end.
    #[arg(long, default_value_t = 8)]
    pub backend_workers: usize,
    /// Emulated CPU per request on the back-ends, µs (`farside backend
    /// --cpu-us-per-request`): makes a node's capacity, not the proxies', the limit.
    #[arg(long, default_value_t = 500)]
    pub cpu_us_per_request: u64,
}

/// The nodes serving the loaded site at one instant (proxy `p0`'s view).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct NodesSample {
    /// Seconds since the point's first burst started.
    pub t_s: f64,
    /// The loaded site's index.
    pub site: usize,
    /// Back-ends whose served role is that site.
    pub nodes: u64,
}

/// One point of `lab reconfig`: one system, scenario and burst length.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ReconfigPoint {
    pub system: String,
    /// Node ratio, e.g. `2:2:2:2`.
    pub scenario: String,
    /// Requests per burst (L).
    pub burst: u64,
    /// The back-ends' region transport: `xdp` or `tcp` (netns), `shm`, `tcp` or `udp`
    /// (loopback).
    pub transport: String,
    /// T (history window) of a `reconf` point, ms; `None` for the static systems.
    #[serde(default)]
    pub history_ms: Option<u64>,
    /// Requests served / summed wall time of the point's bursts, requests/s.
    pub tps: f64,
    /// Requests served (status < 500) over all bursts.
    pub served: u64,
    /// Failed or refused requests over all bursts.
    pub failures: u64,
    /// Summed wall time of the bursts, s (the overprovisioned set-up excluded).
    pub wall_s: f64,
    /// Bursts run.
    pub bursts: u64,
    /// Nodes moved by the balancers (`farside_reconf_moves_total`, all proxies).
    pub moves: u64,
    /// Nodes moved by the lab itself (the overprovisioned set-up before each burst).
    pub lab_moves: u64,
    /// Role switches the nodes completed during the point.
    pub switches: u64,
    /// Switching time p50 / p99, ms, as issue 11 defines it: from a balancer's move CAS
    /// on the node's `ROLE_WANTED` to the first request the node served in the new role
    /// (one host clock; [`timing`]). Balancer moves only (`moves_timed`); `None` without
    /// one.
    pub switch_p50_ms: Option<f64>,
    pub switch_p99_ms: Option<f64>,
    /// Moves whose node served no request for its new site within the point (the load
    /// had moved on): not in the switch quantiles.
    #[serde(default)]
    pub switch_unmatched: u64,
    /// The node agents' part, p50 / p99, ms: gatherd's `farside_gatherd_role_switch_ms`
    /// (new wanted value seen → served published, drain included), every switch of the
    /// point (the overprovisioned set-up's included).
    #[serde(default)]
    pub apply_p50_ms: Option<f64>,
    #[serde(default)]
    pub apply_p99_ms: Option<f64>,
    /// Decision-to-move latency p50 / p99, ms: from the balancer round's decision that a
    /// site is due a node to the reply of that node's role CAS (lock read, acquire,
    /// intent, move: round trips over `transport`).
    #[serde(default)]
    pub decision_p50_ms: Option<f64>,
    #[serde(default)]
    pub decision_p99_ms: Option<f64>,
    /// Every balancer move of the point with its timings (Fig. 8/9 marks, the quantiles'
    /// samples).
    #[serde(default)]
    pub moves_timed: Vec<timing::MoveTiming>,
    /// TPS of each burst in order (served / its wall time).
    pub burst_tps: Vec<f64>,
    /// Nodes serving the loaded site, every [`SERIES_EVERY`] (Fig. 8/9).
    pub series: Vec<NodesSample>,
    /// Runs combined in this point.
    #[serde(default = "one")]
    pub runs: u64,
}

fn one() -> u64 {
    1
}

impl ReconfigPoint {
    /// Repeats of one point: counts summed, `tps` recomputed from the sums, switch and
    /// decision quantiles recomputed over every run's moves, apply quantiles the worst
    /// run's, series and per-burst TPS the first run's.
    pub fn combine(runs: &[ReconfigPoint]) -> ReconfigPoint {
        let Some(first) = runs.first() else {
            return ReconfigPoint {
                system: String::new(),
                scenario: String::new(),
                burst: 0,
                transport: String::new(),
                history_ms: None,
                tps: 0.0,
                served: 0,
                failures: 0,
                wall_s: 0.0,
                bursts: 0,
                moves: 0,
                lab_moves: 0,
                switches: 0,
                switch_p50_ms: None,
                switch_p99_ms: None,
                switch_unmatched: 0,
                apply_p50_ms: None,
                apply_p99_ms: None,
                decision_p50_ms: None,
                decision_p99_ms: None,
                moves_timed: Vec::new(),
                burst_tps: Vec::new(),
                series: Vec::new(),
                runs: 0,
            };
        };
        let worst = |f: fn(&ReconfigPoint) -> Option<f64>| {
            runs.iter()
                .filter_map(f)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        };
        let served = runs.iter().map(|r| r.served).sum::<u64>();
        let wall_s = runs.iter().map(|r| r.wall_s).sum::<f64>();
        let moves_timed: Vec<timing::MoveTiming> =
            runs.iter().flat_map(|r| r.moves_timed.clone()).collect();
        let q = timing_quantiles(&moves_timed);
        ReconfigPoint {
            tps: if wall_s > 0.0 {
                served as f64 / wall_s
            } else {
                0.0
            },
            served,
            failures: runs.iter().map(|r| r.failures).sum(),
            wall_s,
            bursts: runs.iter().map(|r| r.bursts).sum(),
            moves: runs.iter().map(|r| r.moves).sum(),
            lab_moves: runs.iter().map(|r| r.lab_moves).sum(),
            switches: runs.iter().map(|r| r.switches).sum(),
            switch_p50_ms: q.switch_p50_ms,
            switch_p99_ms: q.switch_p99_ms,
            switch_unmatched: runs.iter().map(|r| r.switch_unmatched).sum(),
            apply_p50_ms: worst(|r| r.apply_p50_ms),
            apply_p99_ms: worst(|r| r.apply_p99_ms),
            decision_p50_ms: q.decision_p50_ms,
            decision_p99_ms: q.decision_p99_ms,
            moves_timed,
            runs: runs.iter().map(|r| r.runs).sum(),
            ..first.clone()
        }
    }

    /// The point's figures on one line, for progress output.
    pub fn progress_line(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
        // The decision-to-move latency is often under a millisecond.
        let ms2 = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        format!(
            "tps={:.1} served={} failures={} moves={} lab_moves={} switch p50={} p99={} ms \
             (unmatched {}) decision p50={} p99={} ms apply p50={} p99={} ms",
            self.tps,
            self.served,
            self.failures,
            self.moves,
            self.lab_moves,
            ms(self.switch_p50_ms),
            ms(self.switch_p99_ms),
            self.switch_unmatched,
            ms2(self.decision_p50_ms),
            ms2(self.decision_p99_ms),
            ms(self.apply_p50_ms),
            ms(self.apply_p99_ms)
        )
    }
}

/// Switch and decision quantiles of a set of moves.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct TimingQuantiles {
    pub switch_p50_ms: Option<f64>,
    pub switch_p99_ms: Option<f64>,
    pub decision_p50_ms: Option<f64>,
    pub decision_p99_ms: Option<f64>,
}

/// The quantiles of `moves`' switch times (matched moves only) and decision latencies.
pub fn timing_quantiles(moves: &[timing::MoveTiming]) -> TimingQuantiles {
    let sw: Vec<f64> = moves.iter().filter_map(|m| m.switch_ms).collect();
    let de: Vec<f64> = moves.iter().map(|m| m.decision_ms).collect();
    TimingQuantiles {
        switch_p50_ms: timing::quantile(&sw, 0.5),
        switch_p99_ms: timing::quantile(&sw, 0.99),
        decision_p50_ms: timing::quantile(&de, 0.5),
        decision_p99_ms: timing::quantile(&de, 0.99),
    }
}

/// Parse a scenario `a:b:c` into nodes per site (each ≥ 1, at least 2 sites, at most
/// [`SITES_MAX`] sites and [`SCENARIO_NODES_MAX`] nodes).
pub fn parse_scenario(s: &str) -> Result<Vec<usize>, String> {
    let ratio = s
        .split(':')
        .map(|p| p.trim().parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--scenario {s}: expected node counts like 3:3:2 ({e})"))?;
    if ratio.len() < 2 || ratio.len() > SITES_MAX {
        return Err(format!("--scenario {s}: 2..={SITES_MAX} sites"));
    }
    if ratio.contains(&0) {
        return Err(format!(
            "--scenario {s}: every site needs at least one node"
        ));
    }
    let n: usize = ratio.iter().sum();
    if n > SCENARIO_NODES_MAX {
        return Err(format!(
            "--scenario {s}: at most {SCENARIO_NODES_MAX} nodes"
        ));
    }
    Ok(ratio)
}

/// The static allocation of a scenario: node → site, sites taking consecutive nodes in
/// ratio order (`3:3:2` → 0,0,0,1,1,1,2,2).
pub fn initial_allocation(ratio: &[usize]) -> Vec<usize> {
    ratio
        .iter()
        .enumerate()
        .flat_map(|(site, &n)| std::iter::repeat_n(site, n))
        .collect()
}

/// Each site's anchor (never moved, holds its lock): its first node in the static
/// allocation.
pub fn anchors(ratio: &[usize]) -> Vec<usize> {
    ratio
        .iter()
        .scan(0, |next, &n| {
            let a = *next;
            *next += n;
            Some(a)
        })
        .collect()
}

/// The overprovisioned allocation while `loaded` takes the load: every site keeps its
/// anchor, every other node serves `loaded`, which so has N − (sites − 1) nodes.
pub fn overprovisioned_allocation(ratio: &[usize], loaded: usize) -> Vec<usize> {
    let anchors = anchors(ratio);
    initial_allocation(ratio)
        .into_iter()
        .enumerate()
        .map(
            |(node, site)| {
                if anchors[site] == node {
                    site
                } else {
                    loaded
                }
            },
        )
        .collect()
}

/// The bursts of one point: (site, L) for each site in turn, `cycles` times.
pub fn burst_schedule(sites: usize, burst: u64, cycles: usize) -> Vec<(usize, u64)> {
    (0..cycles.max(1))
        .flat_map(|_| (0..sites).map(move |s| (s, burst)))
        .collect()
}

/// Default CPU quota per back-end node, percent of one CPU: the back-ends together get
/// half of `cpus` (the other half runs proxies, clients and the lab), in equal shares.
pub fn default_node_cpu_pct(cpus: usize, nodes: usize) -> u32 {
    let pct = 100 * cpus / (2 * nodes.max(1));
    (pct as u32).max(NODE_CPU_PCT_MIN)
}

/// A share (`pct` percent) of a node's quota (`quota_pct` percent of one CPU) in the
/// ppm gatherd publishes, whose 1,000,000 is `ref_cpus` whole CPUs.
pub fn quota_share_ppm(pct: u32, quota_pct: u32, ref_cpus: u64) -> u64 {
    (pct as u64 * quota_pct as u64 * 100) / ref_cpus.max(1)
}

/// Split `total` into `parts` shares differing by at most one (the first ones larger).
pub fn split(total: u64, parts: usize) -> Vec<u64> {
    let parts = parts.max(1) as u64;
    (0..parts)
        .map(|i| total / parts + u64::from(i < total % parts))
        .collect()
}

/// A system's name in tables and file names: `reconf` points carry their T
/// (`reconf-T5000`).
pub fn label(system: &str, history_ms: Option<u64>) -> String {
    match history_ms {
        Some(t) => format!("{system}-T{t}"),
        None => system.to_string(),
    }
}

fn site_name(i: usize) -> String {
    format!("s{i}")
}

fn site_host(i: usize) -> String {
    format!("s{i}.example")
}

/// The value of `farside_proxy_site_backends{site="NAME"}` in a scrape.
pub fn site_backends(metrics: &str, site: &str) -> Option<u64> {
    let prefix = format!("farside_proxy_site_backends{{site=\"{site}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// The value of an unlabelled counter or gauge `name` in a scrape (0 if absent).
pub fn plain_value(metrics: &str, name: &str) -> u64 {
    let prefix = format!("{name} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The back-ends' region transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// udp answered by XDP in the node's kernel (netns).
    Xdp,
    /// gatherd's user-space tcp server.
    Tcp,
    /// The region file mapped by the proxies (loopback).
    Shm,
    /// gatherd's user-space udp server (loopback).
    Udp,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Xdp => "xdp",
            Transport::Tcp => "tcp",
            Transport::Shm => "shm",
            Transport::Udp => "udp",
        }
    }
}

/// Where the nodes run.
enum Fabric {
    Netns(VirtualDc),
    Loopback(loopback::LoopbackHosts),
}

impl Fabric {
    /// Run `f` where the clients are (the `client` namespace, or here).
    fn in_client<T: Send>(&self, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
        match self {
            Fabric::Netns(dc) => dc.run_in_ns("client", f),
            Fabric::Loopback(_) => f(),
        }
    }

    /// Where readiness checks connect from: the clients' node.
    fn client(&self) -> crate::fabric::Vantage<'_> {
        match self {
            Fabric::Netns(dc) => crate::fabric::Vantage::Node(dc, "client"),
            Fabric::Loopback(_) => crate::fabric::Vantage::Here,
        }
    }

    fn addr(&self, node: &str, port: u16) -> io::Result<SocketAddr> {
        match self {
            Fabric::Netns(dc) => Ok(SocketAddr::new(dc.node_ip(node).into(), port)),
            Fabric::Loopback(h) => h.addr(node, port),
        }
    }

    /// The node's cgroup for gatherd `--cgroup` (`None`: loopback without root).
    fn cgroup_dir(&self, node: &str) -> Option<PathBuf> {
        match self {
            Fabric::Netns(dc) => Some(dc.cgroup_dir(node)),
            Fabric::Loopback(h) => h.cgroup_dir(node),
        }
    }

    fn spawn(
        &self,
        node: &str,
        exe: &Path,
        args: &[String],
        log: &Path,
    ) -> io::Result<std::process::Child> {
        match self {
            Fabric::Netns(dc) => dc.spawn_in(node, exe, args, log),
            Fabric::Loopback(h) => h.spawn(node, exe, args, log),
        }
    }
}

/// The checked settings of a run.
struct Plan {
    systems: Vec<String>,
    scenarios: Vec<(String, Vec<usize>)>,
    bursts: Vec<u64>,
    transport: Transport,
    /// Nodes on 127.0.0.1 (`--hosts loopback`) rather than in namespaces.
    loopback: bool,
    /// T values for `reconf` (--sweep-t, else --history-ms).
    history_ms: Vec<u64>,
}

fn check_args(a: &ReconfigArgs) -> io::Result<Plan> {
    let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    let loopback = match a.hosts.as_str() {
        "netns" => false,
        "loopback" => true,
        h => return Err(bad(format!("--hosts {h}: expected netns or loopback"))),
    };
    let transport = match (a.transport.as_deref(), loopback) {
        (None | Some("xdp"), false) => Transport::Xdp,
        (None | Some("shm"), true) => Transport::Shm,
        (Some("tcp"), _) => Transport::Tcp,
        (Some("udp"), true) => Transport::Udp,
        (Some(t), false) => {
            return Err(bad(format!(
                "--transport {t}: with --hosts netns, xdp or tcp"
            )))
        }
        (Some(t), true) => {
            return Err(bad(format!(
                "--transport {t}: with --hosts loopback, shm, tcp or udp (no XDP on lo; shm \
                 is the one-sided transport on one host)"
            )))
        }
    };
    for s in &a.systems {
        if !SYSTEMS.contains(&s.as_str()) {
            return Err(bad(format!(
                "--systems: unknown system `{s}` ({})",
                SYSTEMS.join(", ")
            )));
        }
    }
    if a.systems.is_empty() {
        return Err(bad("--systems: at least one".into()));
    }
    let names: Vec<String> = if !a.scenario.is_empty() {
        a.scenario.clone()
    } else if a.quick {
        vec![SCENARIOS[1].to_string()]
    } else {
        SCENARIOS.iter().map(|s| s.to_string()).collect()
    };
    let mut scenarios = Vec::new();
    for s in names {
        let r = parse_scenario(&s).map_err(bad)?;
        scenarios.push((s, r));
    }
    let bursts = if !a.bursts.is_empty() {
        a.bursts.clone()
    } else if a.quick {
        BURSTS_QUICK.to_vec()
    } else {
        BURSTS_FULL.to_vec()
    };
    if bursts.contains(&0) {
        return Err(bad("--bursts: every burst needs at least 1 request".into()));
    }
    if a.proxies == 0 || a.proxies > 16 {
        return Err(bad(format!("--proxies {}: 1..=16", a.proxies)));
    }
    if a.clients < a.proxies {
        return Err(bad(format!(
            "--clients {}: at least one per proxy ({})",
            a.clients, a.proxies
        )));
    }
    if a.node_cpu_pct == Some(0) {
        return Err(bad("--node-cpu-pct 0: at least 1".into()));
    }
    if a.sensitivity_ms == 0 || a.history_ms.is_empty() || a.history_ms.contains(&0) {
        return Err(bad("--sensitivity-ms and --history-ms: at least 1".into()));
    }
    if a.sweep_t.contains(&0) {
        return Err(bad("--sweep-t: every T at least 1 ms".into()));
    }
    if !a.sweep_t.is_empty() && a.history_ms != [DEFAULT_HISTORY_MS] {
        return Err(bad(
            "--sweep-t and --history-ms: give the T values once (--sweep-t is the sweep's \
             name, --history-ms the older one)"
                .into(),
        ));
    }
    let history_ms = if a.sweep_t.is_empty() {
        a.history_ms.clone()
    } else {
        a.sweep_t.clone()
    };
    if !(1..=100).contains(&a.high_pct) || !(1..=100).contains(&a.spare_pct) {
        return Err(bad("--high-pct and --spare-pct: 1..=100".into()));
    }
    if a.backend_workers == 0 {
        return Err(bad("--backend-workers: at least 1".into()));
    }
    Ok(Plan {
        systems: a.systems.clone(),
        scenarios,
        bursts,
        transport,
        loopback,
        history_ms,
    })
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The run's shared state: the namespaces (built for the largest scenario) and the
/// directories.
struct Lab {
    fabric: Fabric,
    /// Back-end node names `b0..`.
    nodes: Vec<String>,
    proxies: Vec<String>,
    logs: PathBuf,
    configs: PathBuf,
    sites_root: PathBuf,
    /// Short directory for the back-ends' control sockets (a Unix socket path is at most
    /// 107 bytes; the output directory may be long).
    sockets: PathBuf,
    high_ppm: u64,
    spare_ppm: u64,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.sockets);
    }
}

/// A running tier (one point's processes); stopped on drop, before the namespaces.
struct Tier {
    /// (name, web, region string, gatherd metrics), per back-end node.
    nodes: Vec<(String, SocketAddr, String, SocketAddr)>,
    /// (listen, admin) per proxy.
    proxies: Vec<(SocketAddr, SocketAddr)>,
    _children: Vec<Child>,
}

impl Lab {
    fn spawn(&self, node: &str, name: &str, args: &[String]) -> io::Result<Child> {
        let log = self.logs.join(format!("{name}.log"));
        let c = self
            .fabric
            .spawn(node, &std::env::current_exe()?, args, &log)?;
        Ok(Child::adopt(name, c, log))
    }

    /// Wait until `addr` accepts connections, seen from the client node.
    fn wait_port(&self, c: &mut Child, addr: SocketAddr) -> io::Result<()> {
        crate::fabric::wait_port(c, addr, self.fabric.client(), READY_MAX, POLL)
    }

    fn scrape(&self, addr: SocketAddr) -> io::Result<String> {
        self.fabric.in_client(|| crate::promtext::scrape(addr))
    }

    fn addr(&self, node: &str, port: u16) -> io::Result<SocketAddr> {
        self.fabric.addr(node, port)
    }

    /// Start the back-ends, their gatherds and the proxies of one point, and wait until
    /// every proxy routes by the scenario's static allocation.
    fn start_tier(
        &self,
        a: &ReconfigArgs,
        transport: Transport,
        key: &Key,
        ratio: &[usize],
        tag: &str,
    ) -> io::Result<Tier> {
        let (system, scenario, history_ms) = (&key.system, &key.scenario, key.history_ms);
        let alloc = initial_allocation(ratio);
        let sites: Vec<String> = (0..ratio.len()).map(site_name).collect();
        let mut children = Vec::new();
        let mut nodes = Vec::new();
        for (i, &site) in alloc.iter().enumerate() {
            let node = &self.nodes[i];
            let web = self.addr(node, WEB_PORT)?;
            let control = self.sockets.join(format!("{node}.sock"));
            let mut be = self.spawn(
                node,
                &format!("{tag}-backend-{node}"),
                &strings(&[
                    "backend",
                    "--listen",
                    &web.to_string(),
                    "--workers",
                    &a.backend_workers.to_string(),
                    "--sites-root",
                    &self.sites_root.display().to_string(),
                    "--site",
                    &sites[site],
                    "--control",
                    &control.display().to_string(),
                    "--cpu-us-per-request",
                    &a.cpu_us_per_request.to_string(),
                ]),
            )?;
            self.wait_port(&mut be, web)?;
            children.push(be);
            let metrics = self.addr(node, GATHERD_METRICS_PORT)?;
            let mut args = strings(&[
                "gatherd",
                "--node-id",
                &i.to_string(),
                "--period-us",
                &GATHERD_PERIOD_US.to_string(),
                "--watch-port",
                &web.port().to_string(),
                "--metrics-listen",
                &metrics.to_string(),
                "--rw-key",
                RW_KEY,
                "--sampler",
                "user",
                "--role-backend-control",
                &control.display().to_string(),
                "--role-sites",
                &sites.join(","),
                "--role-initial",
                &site.to_string(),
            ]);
            if let Some(cg) = self.fabric.cgroup_dir(node) {
                args.extend(strings(&["--cgroup", &cg.display().to_string()]));
            }
            let shm = self.sockets.join(format!("{node}.region"));
            if transport == Transport::Shm {
                let _ = std::fs::remove_file(&shm);
                args.extend(strings(&["--shm", &shm.display().to_string()]));
            } else {
                args.push("--no-shm".into());
            }
            let region = match transport {
                Transport::Xdp => {
                    let udp = self.addr(node, REGION_UDP_PORT)?;
                    args.extend(strings(&[
                        "--udp-listen",
                        &udp.to_string(),
                        "--xdp-iface",
                        crate::fabric::netns::VETH_IN_NS,
                        "--xdp-mode",
                        "generic",
                    ]));
                    format!("udp:{udp}")
                }
                Transport::Udp => {
                    let udp = self.addr(node, REGION_UDP_PORT)?;
                    args.extend(strings(&["--udp-listen", &udp.to_string()]));
                    format!("udp:{udp}")
                }
                Transport::Tcp => {
                    let tcp = self.addr(node, REGION_TCP_PORT)?;
                    args.extend(strings(&["--tcp-listen", &tcp.to_string()]));
                    format!("tcp:{tcp}")
                }
                Transport::Shm => format!("shm:{}", shm.display()),
            };
            let mut g = self.spawn(node, &format!("{tag}-gatherd-{node}"), &args)?;
            self.wait_port(&mut g, metrics)?;
            if transport == Transport::Shm {
                g.wait_file(&shm)?;
            }
            children.push(g);
            nodes.push((node.clone(), web, region, metrics));
        }
        let balancers: Vec<String> = self
            .proxies
            .iter()
            .map(|p| Ok(format!("\"tcp:{}\"", self.addr(p, BALANCER_PORT)?)))
            .collect::<io::Result<_>>()?;
        let anchors = anchors(ratio);
        let mut proxies = Vec::new();
        for (id, p) in self.proxies.iter().enumerate() {
            let listen = self.addr(p, PROXY_PORT)?;
            let admin = self.addr(p, ADMIN_PORT)?;
            let mut s = format!(
                "listen = \"{listen}\"\n\n[admission]\nenabled = false\nstale_after_ms = {STALE_AFTER_MS}\n"
            );
            for (_, web, region, _) in &nodes {
                let _ = write!(
                    s,
                    "\n[[backend]]\naddr = \"{web}\"\nregion = \"{region}\"\n"
                );
            }
            for (k, name) in sites.iter().enumerate() {
                let _ = write!(
                    s,
                    "\n[[sites]]\nname = \"{name}\"\nhosts = [\"{}\"]\nanchor = {}\n",
                    site_host(k),
                    anchors[k]
                );
            }
            if system == "reconf" {
                let _ = write!(
                    s,
                    "\n[reconf]\nenabled = true\nbalancer_id = {id}\nbalancers = [{}]\n\
                     region_listen = \"{}\"\nkey = \"{RW_KEY}\"\nsensitivity_ms = {}\n\
                     history_ms = {}\nlease_ms = {}\nhigh_ppm = {}\nspare_ppm = {}\n",
                    balancers.join(", "),
                    self.addr(p, BALANCER_PORT)?,
                    a.sensitivity_ms,
                    history_ms.unwrap_or(DEFAULT_HISTORY_MS),
                    a.lease_ms,
                    self.high_ppm,
                    self.spare_ppm
                );
            }
            let cfg = self.configs.join(format!(
                "{}-{}-{p}.toml",
                label(system, history_ms),
                scenario.replace(':', "-")
            ));
            std::fs::write(&cfg, s)?;
            let mut c = self.spawn(
                p,
                &format!("{tag}-proxy-{p}"),
                &strings(&[
                    "proxy",
                    "--config",
                    &cfg.display().to_string(),
                    "--admin-listen",
                    &admin.to_string(),
                ]),
            )?;
            self.wait_port(&mut c, admin)?;
            self.wait_port(&mut c, listen)?;
            children.push(c);
            proxies.push((listen, admin));
        }
        let t = Tier {
            nodes,
            proxies,
            _children: children,
        };
        self.wait_served(&t, ratio, &alloc)?;
        Ok(t)
    }

    /// Wait until every proxy sees, for every site, as many serving back-ends as `alloc`
    /// gives it.
    fn wait_served(&self, t: &Tier, ratio: &[usize], alloc: &[usize]) -> io::Result<()> {
        let want: Vec<u64> = (0..ratio.len())
            .map(|s| alloc.iter().filter(|&&x| x == s).count() as u64)
            .collect();
        let t0 = Instant::now();
        loop {
            let mut ok = true;
            for &(_, admin) in &t.proxies {
                let m = self.scrape(admin).unwrap_or_default();
                ok &= want
                    .iter()
                    .enumerate()
                    .all(|(s, &n)| site_backends(&m, &site_name(s)) == Some(n));
            }
            if ok {
                return Ok(());
            }
            if t0.elapsed() > READY_MAX {
                return Err(io::Error::other(format!(
                    "the proxies did not route by the allocation {alloc:?} within \
                     {READY_MAX:?}; see logs/"
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Move nodes to `alloc` by remote CAS on their `ROLE_WANTED` (from the client
    /// node, with the read-write key) and wait until the proxies route by it. Returns
    /// the nodes moved.
    fn set_allocation(&self, t: &Tier, ratio: &[usize], alloc: &[usize]) -> io::Result<u64> {
        let regions: Vec<String> = t.nodes.iter().map(|n| n.2.clone()).collect();
        let alloc_v = alloc.to_vec();
        let moved = self.fabric.in_client(move || {
            let key = u64::from_str_radix(RW_KEY, 16).expect("hex key");
            let opts = farside_rmem::ClientOptions {
                key,
                timeout: RMEM_TIMEOUT,
                ..Default::default()
            };
            let off = farside_region::layout::W_ROLE_WANTED * 8;
            let mut moved = 0u64;
            for (region, &site) in regions.iter().zip(&alloc_v) {
                let ep = farside_rmem::Endpoint::parse(region).map_err(io::Error::other)?;
                let mut m = farside_rmem::connect(&ep, &opts)
                    .map_err(|e| io::Error::other(format!("{region}: {e}")))?;
                let mut done = false;
                for _ in 0..CAS_ATTEMPTS {
                    let mut b = [0u8; 8];
                    m.read(off, &mut b)
                        .map_err(|e| io::Error::other(format!("{region}: read: {e}")))?;
                    let w = u64::from_le_bytes(b);
                    if (w >> ROLE_VERSION_BITS) as usize == site {
                        done = true;
                        break;
                    }
                    let version = w & ((1 << ROLE_VERSION_BITS) - 1);
                    let new = ((site as u64) << ROLE_VERSION_BITS) | (version + 1);
                    match m.compare_swap(off, w, new) {
                        Ok(old) if old == w => {
                            moved += 1;
                            done = true;
                            break;
                        }
                        Ok(_) => continue,
                        Err(e) => return Err(io::Error::other(format!("{region}: CAS: {e}"))),
                    }
                }
                if !done {
                    return Err(io::Error::other(format!(
                        "{region}: role CAS lost {CAS_ATTEMPTS} times"
                    )));
                }
            }
            Ok(moved)
        })?;
        self.wait_served(t, ratio, alloc)?;
        Ok(moved)
    }
}

impl Lab {
    /// The balancers' moves of point `tag` joined with the nodes' first requests in the
    /// new role, from the processes' logs ([`timing`]); unreadable logs give no moves.
    fn move_timings(
        &self,
        tag: &str,
        proxies: usize,
        nodes: usize,
        t0_unix_us: u64,
    ) -> Vec<timing::MoveTiming> {
        let read = |name: String| std::fs::read_to_string(self.logs.join(name)).unwrap_or_default();
        let moves: Vec<timing::MoveLine> = (0..proxies)
            .flat_map(|i| timing::parse_moves(&read(format!("{tag}-proxy-p{i}.log")), i))
            .collect();
        let firsts: Vec<timing::FirstServed> = (0..nodes)
            .flat_map(|i| timing::parse_first_served(&read(format!("{tag}-backend-b{i}.log")), i))
            .collect();
        timing::join(&moves, &firsts, &site_name, t0_unix_us)
    }
}

/// Sum of the gatherds' switch-time histograms.
fn switch_buckets(lab: &Lab, t: &Tier) -> crate::promtext::Buckets {
    let mut all: crate::promtext::Buckets = Vec::new();
    for (_, _, _, metrics) in &t.nodes {
        let Ok(m) = lab.scrape(*metrics) else {
            continue;
        };
        for (le, n) in crate::promtext::buckets(&m, "farside_gatherd_role_switch_ms") {
            match all.iter_mut().find(|(b, _)| *b == le) {
                Some((_, c)) => *c += n,
                None => all.push((le, n)),
            }
        }
    }
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    all
}

/// Measure one point.
fn measure(
    lab: &Lab,
    a: &ReconfigArgs,
    transport: Transport,
    key: &Key,
    ratio: &[usize],
) -> io::Result<ReconfigPoint> {
    let tag = format!(
        "{}-{}-{}",
        label(&key.system, key.history_ms),
        key.scenario.replace(':', "-"),
        key.burst
    );
    let t = lab.start_tier(a, transport, key, ratio, &tag)?;
    let before = switch_buckets(lab, &t);
    let schedule = burst_schedule(ratio.len(), key.burst, a.cycles);
    let clients = split(a.clients as u64, t.proxies.len());
    let loaded = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let t0_unix_us = timing::unix_now_us();
    let admin0 = t.proxies[0].1;
    let (mut served, mut failures, mut wall_s, mut lab_moves) = (0u64, 0u64, 0.0f64, 0u64);
    let mut burst_tps = Vec::new();
    let (series, result) = std::thread::scope(|sc| {
        let sampler = sc.spawn(|| {
            lab.fabric.in_client(|| {
                let mut v = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let site = loaded.load(Ordering::Relaxed);
                    if let Ok(m) = crate::promtext::scrape(admin0) {
                        if let Some(n) = site_backends(&m, &site_name(site)) {
                            v.push(NodesSample {
                                t_s: t0.elapsed().as_secs_f64(),
                                site,
                                nodes: n,
                            });
                        }
                    }
                    std::thread::sleep(SERIES_EVERY);
                }
                Ok(v)
            })
        });
        let result = (|| -> io::Result<()> {
            for &(site, l) in &schedule {
                loaded.store(site, Ordering::Relaxed);
                if key.system == "overprovisioned" {
                    let alloc = overprovisioned_allocation(ratio, site);
                    lab_moves += lab.set_allocation(&t, ratio, &alloc)?;
                }
                let shares = split(l, t.proxies.len());
                let b0 = Instant::now();
                let sums = std::thread::scope(|sc2| {
                    let hs: Vec<_> = t
                        .proxies
                        .iter()
                        .zip(shares.iter().zip(&clients))
                        .filter(|(_, (&n, _))| n > 0)
                        .map(|(&(listen, _), (&n, &c))| {
                            let mut lg = LoadgenArgs::new(listen.to_string());
                            lg.host = Some(site_host(site));
                            lg.clients = (c as usize).min(n as usize).max(1);
                            lg.requests = Some(n);
                            lg.duration_s = BURST_TIME_MAX_S;
                            lg.warmup_s = 0.0;
                            lg.file_path = FILE_PATH.to_string();
                            lg.quiet = true;
                            sc2.spawn(move || {
                                lab.fabric.in_client(|| {
                                    farside_loadgen::run(&lg)
                                        .map_err(|e| io::Error::other(format!("loadgen: {e}")))
                                })
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| {
                            h.join()
                                .map_err(|_| io::Error::other("loadgen thread panicked"))?
                        })
                        .collect::<io::Result<Vec<_>>>()
                })?;
                let w = b0.elapsed().as_secs_f64();
                let s: u64 = sums.iter().map(|x| x.served).sum();
                served += s;
                failures += sums.iter().map(|x| x.failures + x.dropped_503).sum::<u64>();
                wall_s += w;
                burst_tps.push(s as f64 / w.max(1e-9));
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        let series = sampler
            .join()
            .map_err(|_| io::Error::other("series thread panicked"))
            .and_then(|r| r);
        (series, result)
    });
    result?;
    let after = switch_buckets(lab, &t);
    let d = crate::promtext::delta(&after, &before);
    let mut moves = 0;
    for (i, &(_, admin)) in t.proxies.iter().enumerate() {
        let m = lab.scrape(admin)?;
        moves += plain_value(&m, "farside_reconf_moves_total");
        // Kept for diagnosis (the balancer's rounds, skips, races, no-donor counts).
        std::fs::write(lab.logs.join(format!("{tag}-proxy-p{i}.metrics")), &m)?;
    }
    let moves_timed = lab.move_timings(&tag, t.proxies.len(), t.nodes.len(), t0_unix_us);
    let q = timing_quantiles(&moves_timed);
    Ok(ReconfigPoint {
        system: key.system.clone(),
        scenario: key.scenario.clone(),
        burst: key.burst,
        transport: transport.name().to_string(),
        history_ms: key.history_ms,
        tps: if wall_s > 0.0 {
            served as f64 / wall_s
        } else {
            0.0
        },
        served,
        failures,
        wall_s,
        bursts: schedule.len() as u64,
        moves,
        lab_moves,
        switches: d.last().map_or(0, |x| x.1),
        switch_p50_ms: q.switch_p50_ms,
        switch_p99_ms: q.switch_p99_ms,
        switch_unmatched: moves_timed.iter().filter(|m| m.switch_ms.is_none()).count() as u64,
        apply_p50_ms: crate::promtext::quantile(&d, 0.5),
        apply_p99_ms: crate::promtext::quantile(&d, 0.99),
        decision_p50_ms: q.decision_p50_ms,
        decision_p99_ms: q.decision_p99_ms,
        moves_timed,
        burst_tps,
        series: series?,
        runs: 1,
    })
}

/// One point's key.
#[derive(Serialize, Debug, Clone)]
struct Key {
    scenario: String,
    burst: u64,
    system: String,
    /// T of a `reconf` point.
    #[serde(skip_serializing_if = "Option::is_none")]
    history_ms: Option<u64>,
}

/// The points of a run, scenario by scenario, burst by burst: every system once, and
/// `reconf` once per T.
fn point_keys(plan: &Plan, history_ms: &[u64]) -> Vec<Key> {
    let mut keys = Vec::new();
    for (sc, _) in &plan.scenarios {
        for &b in &plan.bursts {
            for sys in &plan.systems {
                let ts: Vec<Option<u64>> = if sys == "reconf" {
                    history_ms.iter().map(|&t| Some(t)).collect()
                } else {
                    vec![None]
                };
                for history_ms in ts {
                    keys.push(Key {
                        scenario: sc.clone(),
                        burst: b,
                        system: sys.clone(),
                        history_ms,
                    });
                }
            }
        }
    }
    keys
}

/// Build the namespaces (or the loopback nodes), the sites' files and the thresholds.
fn start_lab(
    a: &ReconfigArgs,
    plan: &Plan,
    dir: &Path,
    nodes_n: usize,
    notes: &mut Vec<String>,
    sites_n: usize,
) -> io::Result<Lab> {
    let cpus = crate::fabric::procs::allowed_cpus().len().max(1);
    let root = crate::fabric::netns::is_root();
    // A per-node quota needs a cgroup per node: root (netns always is).
    let quota = if plan.loopback && !root {
        None
    } else {
        Some(
            a.node_cpu_pct
                .unwrap_or_else(|| default_node_cpu_pct(cpus, nodes_n)),
        )
    };
    let nodes: Vec<String> = (0..nodes_n).map(|i| format!("b{i}")).collect();
    let proxies: Vec<String> = (0..a.proxies).map(|i| format!("p{i}")).collect();
    let fabric = if plan.loopback {
        let id = format!("l{}", std::process::id() % 100_000);
        Fabric::Loopback(loopback::LoopbackHosts::create(&id, &nodes, quota)?)
    } else {
        let quota = quota.expect("netns runs as root");
        let mut specs: Vec<NodeSpec> = nodes
            .iter()
            .map(|n| NodeSpec::new(n).cpu_quota_pct(quota))
            .collect();
        specs.extend(proxies.iter().map(|p| NodeSpec::new(p)));
        specs.push(NodeSpec::new("client"));
        let dc = VirtualDc::create(&format!("r{}", std::process::id() % 100_000), &specs)?;
        let id = dc.run_id().to_string();
        crate::fabric::procs::on_interrupt(move || {
            if let Ok(r) = crate::fabric::netns::clean_run_id(&id) {
                eprint!("{r}");
            }
        });
        Fabric::Netns(dc)
    };
    // gatherd's ppm is relative to the CPUs its cgroup may use (the quota rounded up,
    // or all online CPUs where the quota is in a v1 hierarchy it does not read, or the
    // host without a cgroup).
    let ref_cpus = fabric
        .cgroup_dir(&nodes[0])
        .and_then(|d| farside_gatherd::sample::cgroup_cpus(&d))
        .unwrap_or_else(farside_gatherd::sample::online_cpus);
    let where_ = if plan.loopback {
        "processes on 127.0.0.1"
    } else {
        "network namespaces"
    };
    let (high_ppm, spare_ppm) = match quota {
        Some(quota) => {
            let high_ppm = quota_share_ppm(a.high_pct, quota, ref_cpus);
            let spare_ppm = quota_share_ppm(a.spare_pct, quota, ref_cpus);
            notes.push(format!(
                "back-end nodes: {nodes_n} ({where_}), each a cgroup with a CPU quota of \
                 {quota}% of one CPU ({}; {cpus} CPUs here); gatherd's load is relative to \
                 {ref_cpus} CPU(s), so high = {}% of a node's quota = {high_ppm} ppm, spare = \
                 {}% = {spare_ppm} ppm",
                if a.node_cpu_pct.is_some() {
                    "--node-cpu-pct"
                } else {
                    "default: half the CPUs shared by the nodes"
                },
                a.high_pct,
                a.spare_pct
            ));
            (high_ppm, spare_ppm)
        }
        None => {
            let (high_ppm, spare_ppm) = (a.high_pct as u64 * 10_000, a.spare_pct as u64 * 10_000);
            notes.push(format!(
                "back-end nodes: {nodes_n} ({where_}) WITHOUT a CPU quota (not root: no \
                 cgroup per node): a node's capacity is bounded only by its {} workers x {} us \
                 of CPU per request (at most {:.0} requests/s each if the host had the CPUs), \
                 the nodes share the host's {cpus} CPUs, and every gatherd publishes the \
                 host's CPU use, so the balancers cannot tell a loaded site from an idle one \
                 (high = {}% = {high_ppm} ppm and spare = {}% = {spare_ppm} ppm of the host); \
                 run as root for per-node quotas",
                a.backend_workers,
                a.cpu_us_per_request,
                a.backend_workers as f64 * 1e6 / a.cpu_us_per_request.max(1) as f64,
                a.high_pct,
                a.spare_pct
            ));
            (high_ppm, spare_ppm)
        }
    };
    notes.push(format!(
        "region transport: {} ({})",
        plan.transport.name(),
        match plan.transport {
            Transport::Xdp => "udp answered by XDP in each node's kernel: one-sided",
            Transport::Shm =>
                "the region file mapped by the proxies; READ, CAS and FETCH-ADD execute on \
                 the mapped words: one-sided on one host",
            Transport::Tcp => "gatherd's user-space tcp server: two-sided",
            Transport::Udp => "gatherd's user-space udp server: two-sided",
        }
    ));
    let logs = dir.join("logs");
    let configs = dir.join("configs");
    let sites_root = dir.join("sites");
    std::fs::create_dir_all(&logs)?;
    std::fs::create_dir_all(&configs)?;
    for s in 0..sites_n {
        let d = sites_root.join(site_name(s));
        std::fs::create_dir_all(&d)?;
        let mut body = format!("site {} ", site_name(s)).into_bytes();
        body.resize(FILE_BYTES, b'.');
        std::fs::write(d.join(FILE_PATH.trim_start_matches('/')), body)?;
    }
    let sockets = std::env::temp_dir().join(format!("farside-reconfig-{}", std::process::id()));
    std::fs::create_dir_all(&sockets)?;
    Ok(Lab {
        fabric,
        nodes,
        proxies,
        logs,
        configs,
        sites_root,
        sockets,
        high_ppm,
        spare_ppm,
    })
}

/// The reconfig tables: one row per point, and TPS vs burst length per system (Fig. 7).
pub fn table(points: &[&ReconfigPoint]) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let ms2 = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    let mut s = format!(
        "{:<16} {:<9} {:>7} {:>9} {:>9} {:>8} {:>6} {:>9} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "system",
        "scenario",
        "burst",
        "transport",
        "tps",
        "failures",
        "moves",
        "lab_moves",
        "switch_p50",
        "switch_p99",
        "dec_p50",
        "dec_p99",
        "apply_p50",
        "apply_p99",
        "wall_s"
    );
    for p in points {
        let _ = writeln!(
            s,
            "{:<16} {:<9} {:>7} {:>9} {:>9.1} {:>8} {:>6} {:>9} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9.1}",
            label(&p.system, p.history_ms),
            p.scenario,
            p.burst,
            p.transport,
            p.tps,
            p.failures,
            p.moves,
            p.lab_moves,
            ms(p.switch_p50_ms),
            ms(p.switch_p99_ms),
            ms2(p.decision_p50_ms),
            ms2(p.decision_p99_ms),
            ms(p.apply_p50_ms),
            ms(p.apply_p99_ms),
            p.wall_s
        );
    }
    s.push_str(
        "switch: balancer's move CAS -> the node's first request in the new role (ms; \
         balancer moves only); dec: the round's decision -> that CAS (ms); apply: the node \
         agent's wanted seen -> served (ms)\n",
    );
    let mut scenarios: Vec<&str> = Vec::new();
    for p in points {
        if !scenarios.contains(&p.scenario.as_str()) {
            scenarios.push(&p.scenario);
        }
    }
    for sc in scenarios {
        let mut systems: Vec<String> = Vec::new();
        let mut bursts: Vec<u64> = Vec::new();
        for p in points.iter().filter(|p| p.scenario == sc) {
            let l = label(&p.system, p.history_ms);
            if !systems.contains(&l) {
                systems.push(l);
            }
            if !bursts.contains(&p.burst) {
                bursts.push(p.burst);
            }
        }
        bursts.sort_unstable();
        let _ = write!(
            s,
            "\nTPS vs burst length, scenario {sc} (Fig. 7)\n{:<8}",
            "burst"
        );
        for sys in &systems {
            let _ = write!(s, " {sys:>16}");
        }
        s.push('\n');
        for b in bursts {
            let _ = write!(s, "{b:<8}");
            for sys in &systems {
                match points.iter().find(|p| {
                    p.scenario == sc && p.burst == b && label(&p.system, p.history_ms) == *sys
                }) {
                    Some(p) => {
                        let _ = write!(s, " {:>16.1}", p.tps);
                    }
                    None => {
                        let _ = write!(s, " {:>16}", "-");
                    }
                }
            }
            s.push('\n');
        }
    }
    s.push_str(&t_sweep_table(points));
    s
}

/// The T sweep (`--sweep-t`): per scenario with more than one T, one row per (T,
/// burst): moves (thrashing) against TPS (responsiveness), switch and decision p50.
/// Empty without a sweep.
pub fn t_sweep_table(points: &[&ReconfigPoint]) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let mut s = String::new();
    let mut scenarios: Vec<&str> = Vec::new();
    for p in points {
        if !scenarios.contains(&p.scenario.as_str()) {
            scenarios.push(&p.scenario);
        }
    }
    for sc in scenarios {
        let mut rows: Vec<&ReconfigPoint> = points
            .iter()
            .copied()
            .filter(|p| p.scenario == sc && p.history_ms.is_some())
            .collect();
        let mut ts: Vec<u64> = rows.iter().filter_map(|p| p.history_ms).collect();
        ts.sort_unstable();
        ts.dedup();
        if ts.len() < 2 {
            continue;
        }
        rows.sort_by_key(|p| (p.history_ms, p.burst));
        let _ = writeln!(
            s,
            "\nT sweep, scenario {sc}: moves (thrashing) vs TPS (responsiveness)\n\
             {:<8} {:>7} {:>9} {:>6} {:>9} {:>10} {:>9}",
            "T_ms", "burst", "transport", "moves", "tps", "switch_p50", "dec_p50"
        );
        for p in rows {
            let _ = writeln!(
                s,
                "{:<8} {:>7} {:>9} {:>6} {:>9.1} {:>10} {:>9}",
                p.history_ms.unwrap_or(0),
                p.burst,
                p.transport,
                p.moves,
                p.tps,
                ms(p.switch_p50_ms),
                ms(p.decision_p50_ms)
            );
        }
    }
    s
}

/// `reconfig.csv`: one row per point.
pub fn csv(points: &[&ReconfigPoint]) -> String {
    let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    let mut s = String::from(
        "system,history_ms,scenario,burst,transport,tps,served,failures,wall_s,bursts,moves,lab_moves,switches,switch_p50_ms,switch_p99_ms,switch_unmatched,decision_p50_ms,decision_p99_ms,apply_p50_ms,apply_p99_ms\n",
    );
    for p in points {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.3},{},{},{:.3},{},{},{},{},{},{},{},{},{},{},{}",
            p.system,
            p.history_ms.map_or(String::new(), |t| t.to_string()),
            p.scenario,
            p.burst,
            p.transport,
            p.tps,
            p.served,
            p.failures,
            p.wall_s,
            p.bursts,
            p.moves,
            p.lab_moves,
            p.switches,
            o(p.switch_p50_ms),
            o(p.switch_p99_ms),
            p.switch_unmatched,
            o(p.decision_p50_ms),
            o(p.decision_p99_ms),
            o(p.apply_p50_ms),
            o(p.apply_p99_ms)
        );
    }
    s
}

/// The nodes-serving series of a point as CSV (`t_s,site,nodes`) and its file name
/// (`nodes-<system>-<scenario>-<burst>.csv`, `:` written `-`).
pub fn series_csv(p: &ReconfigPoint) -> (String, String) {
    let mut s = String::from("t_s,site,nodes\n");
    for x in &p.series {
        let _ = writeln!(s, "{:.3},{},{}", x.t_s, x.site, x.nodes);
    }
    (
        format!(
            "nodes-{}-{}-{}.csv",
            label(&p.system, p.history_ms),
            p.scenario.replace(':', "-"),
            p.burst
        ),
        s,
    )
}

/// Run `farside lab reconfig`.
pub fn run(a: ReconfigArgs) -> io::Result<()> {
    let plan = check_args(&a)?;
    if !plan.loopback {
        // SAFETY: geteuid has no preconditions.
        crate::fabric::netns::check_root(unsafe { libc::geteuid() }).map_err(|_| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                "lab reconfig --hosts netns needs root: it builds a network namespace and a \
                 cgroup with a CPU quota per node, and attaches XDP (or use --hosts loopback)",
            )
        })?;
    } else if a.node_cpu_pct.is_some() && !crate::fabric::netns::is_root() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "--node-cpu-pct with --hosts loopback needs root (a cgroup per node)",
        ));
    }
    let dir = a.resume.clone().unwrap_or_else(|| a.out.clone());
    let mut meta = crate::summary::Summary::new("reconfig", &a.hosts, a.quick);
    crate::sweep::fill_host_metadata(&mut meta);
    let nodes_n = plan
        .scenarios
        .iter()
        .map(|(_, r)| r.iter().sum::<usize>())
        .max()
        .unwrap_or(0);
    let sites_n = plan
        .scenarios
        .iter()
        .map(|(_, r)| r.len())
        .max()
        .unwrap_or(0);
    meta.params = serde_json::json!({
        "systems": plan.systems,
        "scenarios": plan.scenarios.iter().map(|(s, _)| s.clone()).collect::<Vec<_>>(),
        "bursts": plan.bursts,
        "cycles": a.cycles,
        "clients": a.clients,
        "proxies": a.proxies,
        "node_cpu_pct": a.node_cpu_pct,
        "transport": plan.transport.name(),
        "hosts": a.hosts,
        "sensitivity_ms": a.sensitivity_ms,
        "history_ms": plan.history_ms,
        "sweep_t": !a.sweep_t.is_empty() || plan.history_ms.len() > 1,
        "lease_ms": a.lease_ms,
        "high_pct": a.high_pct,
        "spare_pct": a.spare_pct,
        "backend_workers": a.backend_workers,
        "cpu_us_per_request": a.cpu_us_per_request,
        "file_bytes": FILE_BYTES,
        "series_every_ms": SERIES_EVERY.as_millis() as u64,
        "tps": "requests served / summed wall time of the point's bursts",
    });
    let mut sweep = crate::sweep::Sweep::<Reconfig>::start(&dir, meta, a.resume.is_some())?;
    let keys = point_keys(&plan, &plan.history_ms);
    let mut lab: Option<Lab> = None;
    let mut notes = Vec::new();
    // A rough per-point estimate for the ETA: every site's burst at ~500 requests/s,
    // plus the tier's start.
    let est = |k: &Key| {
        let sites = k.scenario.split(':').count() as f64;
        sites * a.cycles as f64 * k.burst as f64 / 500.0 + 10.0
    };
    let est_run_s = keys.iter().map(est).sum::<f64>() / keys.len().max(1) as f64;
    let result = sweep.run(
        &keys,
        1,
        est_run_s,
        |k: &Key| {
            format!(
                "{} {} L={}",
                label(&k.system, k.history_ms),
                k.scenario,
                k.burst
            )
        },
        |k, _| {
            if lab.is_none() {
                lab = Some(start_lab(&a, &plan, &dir, nodes_n, &mut notes, sites_n)?);
            }
            let l = lab.as_ref().expect("started above");
            let ratio = plan
                .scenarios
                .iter()
                .find(|(s, _)| *s == k.scenario)
                .map(|(_, r)| r.clone())
                .expect("keys come from the plan");
            measure(l, &a, plan.transport, k, &ratio)
        },
    );
    drop(lab);
    for n in notes {
        sweep.note(n)?;
    }
    sweep.note(
        "overprovisioned: before each burst the lab moves every non-anchor node to the \
         burst's site by remote CAS and waits until the proxies route to them; that time \
         is not counted"
            .into(),
    )?;
    result?;
    sweep.finish()?;
    Ok(())
}

/// `lab reconfig` as the sweep runner and the report shell see it.
pub struct Reconfig;

impl crate::experiment::Experiment for Reconfig {
    const NAME: &'static str = "reconfig";
    type Args = ReconfigArgs;
    type Point = ReconfigPoint;

    fn run(args: ReconfigArgs) -> io::Result<()> {
        run(args)
    }

    fn table(s: &crate::summary::Summary<ReconfigPoint>) -> String {
        let points: Vec<&ReconfigPoint> = s.points.iter().collect();
        if points.is_empty() {
            return String::new();
        }
        table(&points) + "\n"
    }

    fn files(s: &crate::summary::Summary<ReconfigPoint>) -> io::Result<Vec<(String, String)>> {
        let points: Vec<&ReconfigPoint> = s.points.iter().collect();
        if points.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = vec![
            ("reconfig.csv".to_string(), csv(&points)),
            (
                "table.txt".to_string(),
                crate::report::table_text::<Reconfig>(s),
            ),
        ];
        out.extend(points.iter().map(|p| series_csv(p)));
        Ok(out)
    }

    fn figures(s: &crate::summary::Summary<ReconfigPoint>) -> Vec<crate::experiment::Figure> {
        let points: Vec<&ReconfigPoint> = s.points.iter().collect();
        figures::figures(&points)
    }

    fn html(s: &crate::summary::Summary<ReconfigPoint>) -> String {
        let points: Vec<&ReconfigPoint> = s.points.iter().collect();
        if points.is_empty() {
            return String::new();
        }
        format!(
            "<h2>Reconfiguration</h2>\n<pre>{}</pre>\n",
            crate::svg::escape(&table(&points))
        )
    }
}

impl crate::experiment::LabPoint for ReconfigPoint {
    type Extra = crate::experiment::NoExtra;

    fn take_extra(&mut self) -> crate::experiment::NoExtra {
        crate::experiment::NoExtra {}
    }

    fn put_extra(&mut self, _: crate::experiment::NoExtra) {}

    fn combine(runs: &[ReconfigPoint]) -> ReconfigPoint {
        ReconfigPoint::combine(runs)
    }

    fn progress_line(&self) -> String {
        ReconfigPoint::progress_line(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_parse_and_bad_ones_name_the_flag() {
        assert_eq!(parse_scenario("3:3:2").unwrap(), vec![3, 3, 2]);
        assert_eq!(parse_scenario("2:2:2:2").unwrap(), vec![2, 2, 2, 2]);
        for bad in ["3", "3:0:2", "a:b", "", "40:40"] {
            let e = parse_scenario(bad).unwrap_err();
            assert!(e.contains("--scenario"), "{bad}: {e}");
        }
    }

    #[test]
    fn allocations_follow_the_ratio_and_overprovisioning_keeps_anchors() {
        let r = [3, 3, 2];
        assert_eq!(initial_allocation(&r), vec![0, 0, 0, 1, 1, 1, 2, 2]);
        assert_eq!(anchors(&r), vec![0, 3, 6]);
        let o = overprovisioned_allocation(&r, 1);
        assert_eq!(o, vec![0, 1, 1, 1, 1, 1, 2, 1]);
        // The loaded site has N − (sites − 1) nodes, every other site its anchor only.
        for loaded in 0..3 {
            let o = overprovisioned_allocation(&r, loaded);
            assert_eq!(o.iter().filter(|&&s| s == loaded).count(), 8 - 2);
            for s in 0..3 {
                assert!(o.contains(&s), "site {s} kept a node");
            }
        }
        let r4 = [2, 2, 2, 2];
        let o = overprovisioned_allocation(&r4, 3);
        assert_eq!(o, vec![0, 3, 1, 3, 2, 3, 3, 3]);
    }

    #[test]
    fn bursts_cycle_over_the_sites() {
        assert_eq!(
            burst_schedule(3, 512, 1),
            vec![(0, 512), (1, 512), (2, 512)]
        );
        assert_eq!(
            burst_schedule(2, 7, 2),
            vec![(0, 7), (1, 7), (0, 7), (1, 7)]
        );
        assert_eq!(burst_schedule(2, 7, 0).len(), 2, "at least one cycle");
        assert_eq!(split(10, 3), vec![4, 3, 3]);
        assert_eq!(split(10, 3).iter().sum::<u64>(), 10);
        assert_eq!(split(1, 2), vec![1, 0]);
    }

    #[test]
    fn default_quota_gives_the_backends_half_the_cpus() {
        assert_eq!(default_node_cpu_pct(2, 8), 12);
        assert_eq!(default_node_cpu_pct(16, 8), 100);
        assert_eq!(default_node_cpu_pct(1, 64), NODE_CPU_PCT_MIN);
        // 80% of a 12% quota, in ppm of 2 CPUs: 0.8 × 0.12 / 2.
        assert_eq!(quota_share_ppm(80, 12, 2), 48_000);
        assert_eq!(quota_share_ppm(80, 100, 1), 800_000);
    }

    #[test]
    fn metrics_are_read_by_name_and_label() {
        let m = "farside_proxy_site_backends{site=\"s0\"} 3\n\
                 farside_proxy_site_backends{site=\"s1\"} 1\n\
                 farside_reconf_moves_total 4\n";
        assert_eq!(site_backends(m, "s0"), Some(3));
        assert_eq!(site_backends(m, "s1"), Some(1));
        assert_eq!(site_backends(m, "s2"), None);
        assert_eq!(plain_value(m, "farside_reconf_moves_total"), 4);
        assert_eq!(plain_value(m, "farside_reconf_rounds_total"), 0);
    }

    fn args() -> ReconfigArgs {
        ReconfigArgs {
            out: "x".into(),
            resume: None,
            quick: true,
            hosts: "netns".into(),
            systems: SYSTEMS.iter().map(|s| s.to_string()).collect(),
            scenario: Vec::new(),
            bursts: Vec::new(),
            cycles: 1,
            clients: 64,
            proxies: 2,
            node_cpu_pct: None,
            transport: None,
            sensitivity_ms: 250,
            history_ms: vec![DEFAULT_HISTORY_MS],
            sweep_t: Vec::new(),
            lease_ms: 3000,
            high_pct: 80,
            spare_pct: 60,
            backend_workers: 8,
            cpu_us_per_request: 500,
        }
    }

    #[test]
    fn arguments_are_checked_with_the_flag_named() {
        let p = check_args(&args()).unwrap();
        assert_eq!(p.bursts, BURSTS_QUICK.to_vec());
        assert_eq!(p.scenarios.len(), 1);
        let full = check_args(&ReconfigArgs {
            quick: false,
            ..args()
        })
        .unwrap();
        assert_eq!(full.bursts, BURSTS_FULL.to_vec());
        assert_eq!(full.scenarios.len(), 2);
        // Transports per host mode: xdp by default on netns, shm on loopback.
        assert_eq!(p.transport, Transport::Xdp);
        let lo = |t: Option<&str>| ReconfigArgs {
            hosts: "loopback".into(),
            transport: t.map(str::to_string),
            ..args()
        };
        let l = check_args(&lo(None)).unwrap();
        assert!(l.loopback);
        assert_eq!(l.transport, Transport::Shm);
        assert_eq!(
            check_args(&lo(Some("udp"))).unwrap().transport,
            Transport::Udp
        );
        assert_eq!(
            check_args(&lo(Some("tcp"))).unwrap().transport,
            Transport::Tcp
        );
        let cases: [(&str, ReconfigArgs); 8] = [
            (
                "--hosts",
                ReconfigArgs {
                    hosts: "cloud".into(),
                    ..args()
                },
            ),
            (
                "--transport",
                ReconfigArgs {
                    transport: Some("shm".into()),
                    ..args()
                },
            ),
            ("--transport", lo(Some("xdp"))),
            ("--transport", lo(Some("rdma"))),
            (
                "--systems",
                ReconfigArgs {
                    systems: vec!["elastic".into()],
                    ..args()
                },
            ),
            (
                "--scenario",
                ReconfigArgs {
                    scenario: vec!["8".into()],
                    ..args()
                },
            ),
            (
                "--bursts",
                ReconfigArgs {
                    bursts: vec![0],
                    ..args()
                },
            ),
            (
                "--clients",
                ReconfigArgs {
                    clients: 1,
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
    fn a_t_sweep_gives_reconf_one_point_per_t() {
        let plan = check_args(&ReconfigArgs {
            systems: vec!["rigid".into(), "reconf".into()],
            bursts: vec![512, 4096],
            ..args()
        })
        .unwrap();
        let keys = point_keys(&plan, &[300, 5000]);
        let names: Vec<String> = keys
            .iter()
            .map(|k| format!("{} {}", label(&k.system, k.history_ms), k.burst))
            .collect();
        assert_eq!(
            names,
            [
                "rigid 512",
                "reconf-T300 512",
                "reconf-T5000 512",
                "rigid 4096",
                "reconf-T300 4096",
                "reconf-T5000 4096"
            ]
        );
        let e = check_args(&ReconfigArgs {
            history_ms: vec![0],
            ..args()
        })
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("--history-ms"), "{e}");
        // --sweep-t is the sweep's documented name: same points as --history-ms.
        let plan = check_args(&ReconfigArgs {
            systems: vec!["reconf".into()],
            bursts: vec![512],
            sweep_t: vec![300, 1000, 5000],
            ..args()
        })
        .unwrap();
        assert_eq!(plan.history_ms, [300, 1000, 5000]);
        assert_eq!(point_keys(&plan, &plan.history_ms).len(), 3);
        for (bad, flag) in [
            (
                ReconfigArgs {
                    sweep_t: vec![300, 0],
                    ..args()
                },
                "--sweep-t",
            ),
            (
                ReconfigArgs {
                    sweep_t: vec![300],
                    history_ms: vec![1000],
                    ..args()
                },
                "--history-ms",
            ),
        ] {
            let e = check_args(&bad).err().unwrap().to_string();
            assert!(e.contains(flag), "{e}");
        }
    }

    #[test]
    fn the_t_sweep_table_gives_moves_and_tps_per_t() {
        let mk = |t: u64, burst: u64, moves: u64, tps: f64| {
            let mut p = ReconfigPoint::combine(&[]);
            p.system = "reconf".into();
            p.scenario = "2:2:2:2".into();
            p.transport = "xdp".into();
            p.history_ms = Some(t);
            p.burst = burst;
            p.moves = moves;
            p.tps = tps;
            p
        };
        let pts = [mk(300, 512, 9, 500.0), mk(5000, 512, 1, 420.0)];
        let refs: Vec<&ReconfigPoint> = pts.iter().collect();
        let t = t_sweep_table(&refs);
        assert!(t.contains("T sweep, scenario 2:2:2:2"), "{t}");
        let row = t.lines().find(|l| l.starts_with("300 ")).expect(&t);
        assert!(row.contains(" 9 ") && row.contains("500.0"), "{row}");
        assert!(table(&refs).contains("T sweep"), "in the main table too");
        // One T: no sweep table.
        assert!(t_sweep_table(&refs[..1]).is_empty());
    }

    #[test]
    fn points_round_trip_as_reconfig_points_and_render() {
        let p = ReconfigPoint {
            system: "reconf".into(),
            scenario: "2:2".into(),
            burst: 512,
            transport: "xdp".into(),
            history_ms: Some(300),
            tps: 100.0,
            served: 1024,
            failures: 0,
            wall_s: 10.24,
            bursts: 2,
            moves: 1,
            lab_moves: 0,
            switches: 1,
            switch_p50_ms: Some(45.0),
            switch_p99_ms: Some(45.0),
            switch_unmatched: 0,
            apply_p50_ms: Some(25.0),
            apply_p99_ms: Some(40.0),
            decision_p50_ms: Some(1.8),
            decision_p99_ms: Some(1.8),
            moves_timed: vec![timing::MoveTiming {
                balancer: 0,
                node: 1,
                to_site: 0,
                t_s: 1.5,
                decision_ms: 1.8,
                round_ms: 2.6,
                switch_ms: Some(45.0),
            }],
            burst_tps: vec![90.0, 110.0],
            series: vec![NodesSample {
                t_s: 0.1,
                site: 0,
                nodes: 2,
            }],
            runs: 1,
        };
        let text = serde_json::to_string(&p).unwrap();
        let back: ReconfigPoint = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p);
        let t = table(&[&p]);
        assert!(t.contains("reconf") && t.contains("Fig. 7"), "{t}");
        assert!(csv(&[&p])
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("reconf,300,2:2,512,xdp,"));
        assert!(t.contains("reconf-T300"), "{t}");
        let (name, body) = series_csv(&p);
        assert_eq!(name, "nodes-reconf-T300-2-2-512.csv");
        assert_eq!(body, "t_s,site,nodes\n0.100,0,2\n");
        let c = ReconfigPoint::combine(&[p.clone(), p.clone()]);
        assert_eq!((c.runs, c.moves, c.served), (2, 2, 2048));
        assert_eq!(c.moves_timed.len(), 2);
        assert_eq!(
            (c.switch_p99_ms, c.decision_p50_ms),
            (Some(45.0), Some(1.8))
        );
        // A point written before these keys existed still reads (they default).
        let mut old = serde_json::to_value(&p).unwrap();
        for k in [
            "switch_unmatched",
            "apply_p50_ms",
            "decision_p99_ms",
            "moves_timed",
        ] {
            old.as_object_mut().unwrap().remove(k);
        }
        let back: ReconfigPoint = serde_json::from_value(old).unwrap();
        assert!(back.moves_timed.is_empty() && back.decision_p99_ms.is_none());
        assert!((c.tps - 100.0).abs() < 1e-9);
    }
}
