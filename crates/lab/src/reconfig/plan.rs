//! The settings of `lab reconfig`: its flags ([`ReconfigArgs`]), the constants of the
//! tier it builds, the scenarios' allocations and burst schedules, the checked plan of
//! a run and the keys of its points.

use crate::fabric::flags::SweepFlags;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::fabric::flags::Hosts;

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
/// Longest wait for a process to listen, or for the proxies to see an allocation.
pub(super) const READY_MAX: Duration = Duration::from_secs(20);
/// Poll period while waiting for an allocation to be served.
pub(super) const POLL: Duration = Duration::from_millis(20);
/// Longest one burst may run (loadgen's duration bound; a burst still running then has
/// a stuck tier, and its point reports what was served by then).
pub(super) const BURST_TIME_MAX_S: f64 = 900.0;
/// Timeout of the lab's own remote ops (overprovisioned set-up), per op.
pub(super) const RMEM_TIMEOUT: Duration = Duration::from_millis(500);
/// Attempts at one CAS of the lab's (a concurrent agent write only changes the version).
pub(super) const CAS_ATTEMPTS: usize = 5;
/// Fixed ports of the netns tier (each node has its own IP).
pub(super) const WEB_PORT: u16 = 80;
pub(super) const REGION_UDP_PORT: u16 = 7002;
pub(super) const REGION_TCP_PORT: u16 = 7001;
pub(super) const GATHERD_METRICS_PORT: u16 = 9200;
pub(super) const PROXY_PORT: u16 = 8080;
pub(super) const ADMIN_PORT: u16 = 9100;
/// Each proxy's own balancer region (rmem tcp server of `[reconf]`).
pub(super) const BALANCER_PORT: u16 = 7100;
/// gatherd's sampling period, µs: one CFS period of the nodes' quota, so each
/// utilisation sample averages a whole period (a 1 ms sample of a throttled node reads
/// either full or idle, and a site would never look overloaded for T in a row).
pub(super) const GATHERD_PERIOD_US: u64 = crate::fabric::netns::CPU_PERIOD_US;
/// The proxies' `admission.stale_after_ms` (admission stays off; routing still
/// distrusts a region that stops advancing): several gatherd periods.
pub(super) const STALE_AFTER_MS: u64 = 5 * GATHERD_PERIOD_US / 1000;
/// Bits of a role word's version (`site << 48 | version`, docs/reconf.md).
pub(super) const ROLE_VERSION_BITS: u32 = 48;
/// --history-ms's default T, ms (the balancer's default).
pub(super) const DEFAULT_HISTORY_MS: u64 = 500;
/// Most runs of one point (`--repeat`): a full run's longest point lasts minutes, and
/// the spread of a handful of runs is what the tables need.
pub const REPEAT_MAX: u32 = 20;

/// `farside lab reconfig`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReconfigArgs {
    /// Output directory (summary.json, points.jsonl, table.txt, reconfig.csv, series
    /// CSVs, configs/, logs/).
    #[arg(long, default_value = "out/reconfig")]
    pub out: PathBuf,
    #[command(flatten)]
    pub sweep: SweepFlags,
    /// Where the nodes run: netns (root: one namespace and cgroup per node, so each
    /// node's CPU and load are its own) or loopback (processes on 127.0.0.1; as root each
    /// node a cgroup with a CPU quota, otherwise no quota: capacity from
    /// --backend-workers x --cpu-us-per-request only, and every node publishes the
    /// host's load; stated in the output).
    #[arg(long, value_enum, default_value_t = Hosts::Netns)]
    pub hosts: Hosts,
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
    /// S: the balancers' period, ms. Default 250, the balancer's, by the rule: at least
    /// 4 × (a move's settling: the node switch time p99, CAS to first request in the new
    /// role, plus one load sample period), rounded up to 50 ms, so a round never reads a
    /// site with a move still settling (here 4 × (50 + 10) = 240 → 250; docs/reconf.md,
    /// "Choosing S and T").
    #[arg(long, default_value_t = 250)]
    pub sensitivity_ms: u64,
    /// T: how long a site stays overloaded before it gets a node, ms. Default 500, the
    /// balancer's, by the rule: the smallest multiple of S, at least 2 S (one overloaded
    /// reading never moves a node), whose worst TPS ratio to rigid over the choosing
    /// workloads is within the rigid runs' spread (13%) of the best T's; smaller T serves
    /// long bursts sooner (docs/reconf.md, "Choosing S and T", with the held-out check).
    /// Several values (comma-separated) sweep T like --sweep-t.
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
    /// Run every point this many times, each from fresh processes (one after another);
    /// the tables then give each point's TPS as served / summed wall time over the runs
    /// with the runs' standard deviation and range (`tps_sd`, `tps_min`, `tps_max`).
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
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

/// The checked settings of a run.
pub(super) struct Plan {
    pub(super) systems: Vec<String>,
    pub(super) scenarios: Vec<(String, Vec<usize>)>,
    pub(super) bursts: Vec<u64>,
    pub(super) transport: Transport,
    /// Nodes on 127.0.0.1 (`--hosts loopback`) rather than in namespaces.
    pub(super) loopback: bool,
    /// T values for `reconf` (--sweep-t, else --history-ms).
    pub(super) history_ms: Vec<u64>,
}

pub(super) fn check_args(a: &ReconfigArgs) -> io::Result<Plan> {
    let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    let loopback = a.hosts == Hosts::Loopback;
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
    } else if a.sweep.quick {
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
    } else if a.sweep.quick {
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
    if !(1..=REPEAT_MAX).contains(&a.repeat) {
        return Err(bad(format!("--repeat {}: 1..={REPEAT_MAX}", a.repeat)));
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

pub(super) fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// One point's key.
#[derive(Serialize, Debug, Clone)]
pub(super) struct Key {
    pub(super) scenario: String,
    pub(super) burst: u64,
    pub(super) system: String,
    /// T of a `reconf` point.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) history_ms: Option<u64>,
}

/// The points of a run, scenario by scenario, burst by burst: every system once, and
/// `reconf` once per T.
pub(super) fn point_keys(plan: &Plan, history_ms: &[u64]) -> Vec<Key> {
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

/// The back-ends' region transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transport {
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
    pub(super) fn name(self) -> &'static str {
        match self {
            Transport::Xdp => "xdp",
            Transport::Tcp => "tcp",
            Transport::Shm => "shm",
            Transport::Udp => "udp",
        }
    }
}
