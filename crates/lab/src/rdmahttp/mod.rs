//! `farside lab rdma-http`: seed 004 (Dalessandro and Wyckoff, "Accelerating Web
//! Protocols Using RDMA", NCA 2007) on the shared fabric: Table 1 (registration cost),
//! Fig. 3 (one client, retrieval time vs size) and Fig. 4 (1 to 15 clients fetching
//! five 1 MB files), each idle and loaded.
//!
//! Topology (`--hosts netns`, root): namespaces `client` and `srv` on one bridge. `srv`
//! is pinned (cpuset, and its receive softirq by RPS) to one CPU and runs
//! `farside backend` (`--rdma --rdma-registration static|dynamic|cache` for the
//! software-iWARP systems, without `--rdma` for `tcp`), a fresh one per point. The
//! clients (`farside loadgen --rdma`, in this process, [`farside_loadgen::rdma`]) run
//! in `client`, pinned to another CPU. "Loaded" is the paper's: two busy processes on
//! the server's CPU, in its cgroup beside the server's threads, at `--hog-nice` (default -20, [`HOG_RULE`]:
//! the paper's hogs "consume nearly 100 % of the CPU at all times"; every loaded point
//! records the share they actually took, `hog_cpu_frac`).
//!
//! - **Table 1** (`table1`): what one registration step costs the server, per strategy
//!   and size ([`farside_rdmahttp::regbench`]), measured in a process of `srv` (its
//!   cgroup and CPU, nice 0 as the server) with each step's wall time and thread CPU
//!   time: wall − CPU is time spent waiting for the CPU.
//! - **Fig. 3** (`fig3`): one client, one file of each size, server-writes, requested
//!   for `--point-s` after one warm-up request.
//! - **Fig. 4** (`fig4`): 1 to 15 clients, each fetching five 1 MB files in turn
//!   (`--fig4-rounds` times), on one kept HTTP and RDMA connection.
//!
//! Every point records the server's CPU per byte delivered, split into user and system
//! time of the back-end process (`/proc/PID/stat`, all its threads, 10 ms clock ticks)
//! and softirq time of its CPU (`/proc/stat`, clock ticks), the RDMA connection set-up time
//! (`connect_us`, from the clients), and `wrong_bodies` (every body is checked against
//! its file).
//!
//! **What software iWARP can show.** Without an RNIC the "RDMA" transfer is the
//! server's own threads framing MPA/DDP/RDMAP over a kernel TCP socket: the server
//! CPU is spent exactly as for TCP, plus framing, CRC32c and copies. It is the
//! negative control: it cannot offload anything, so under load it must degrade like
//! TCP (or worse); a gain would mean a measurement error. What it does show: the
//! protocol works end to end (bodies checked), the registration strategies' costs, and
//! the RDMA connection set-up. A run on real hardware would need an RNIC (or siw/rxe
//! in a kernel with CONFIG_INFINIBAND), the verbs transport, and the server's CPU
//! accounting extended to the RNIC driver's interrupts.
//!
//! **xdp-reads** is our stand-in for the RNIC's offload: the back-end
//! (`--rdma-arena-iface eth0`) loads the rmem XDP responder with an object arena map on
//! its node's veth (generic XDP), puts each file's body there once (seqlock and CRC32c),
//! and answers `RDMA: arena-reads` with where the body is; the client reads it with
//! authenticated one-sided READs (1,400 B each, pipelined) that the kernel answers in
//! the receive softirq, so no server process is scheduled for the body. The server's
//! CPU per byte then is the softirq of its CPU (where RPS steers its receive path).

mod lab;
mod point;
mod report;

pub use lab::*;
pub use point::*;
pub use report::*;

use crate::fabric::flags::{Hosts, SweepFlags};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::PathBuf;

/// The systems measured.
pub const SYSTEMS: [&str; 6] = [
    "tcp",
    "iwarp-static",
    "iwarp-dynamic",
    "iwarp-cached",
    SYSTEM_XDP_READS,
    SYSTEM_XDP_DIRECT,
];
/// Bodies read one-sidedly from the back-end's object arena, answered by its XDP
/// responder in the kernel (`farside backend --rdma-arena-iface`, `farside loadgen
/// --rdma xdp-reads`).
pub const SYSTEM_XDP_READS: &str = "xdp-reads";
/// As xdp-reads, with grants: after one HTTP answer a client resolves each path with
/// one-sided READs of the arena's index, so a body needs no server process at all
/// (`farside backend --rdma-arena-direct`, `farside loadgen --rdma xdp-direct`).
pub const SYSTEM_XDP_DIRECT: &str = "xdp-direct";

/// Whether `system` reads bodies from the back-end's kernel-answered arena.
pub fn is_arena_system(system: &str) -> bool {
    system == SYSTEM_XDP_READS || system == SYSTEM_XDP_DIRECT
}
/// Runs kept before xdp-reads was built list it as not built; their reports say so.
pub const SYSTEM_NOT_BUILT: &str = SYSTEM_XDP_READS;
/// The experiments.
pub const EXPERIMENTS: [&str; 3] = ["table1", "fig3", "fig4"];
/// The paper's Table 1 sizes (2 kB, 4 kB, 500 kB, 1 MB, 8 MB), in KiB and MiB.
pub const TABLE1_SIZES: [u64; 5] = [2_048, 4_096, 512_000, 1 << 20, 8 << 20];
/// Table 1 sizes of `--quick`.
pub const TABLE1_SIZES_QUICK: [u64; 2] = [4_096, 1 << 20];
/// Fig. 3 sizes, 1 kB to 8 MB.
pub const FIG3_SIZES: [u64; 7] = [1_024, 4_096, 32_768, 131_072, 512_000, 1 << 20, 8 << 20];
/// Fig. 3 sizes of `--quick`.
pub const FIG3_SIZES_QUICK: [u64; 2] = [4_096, 1 << 20];
/// Fig. 4 clients, 1 to 15 (the paper's range).
pub const FIG4_CLIENTS: [u32; 6] = [1, 3, 6, 9, 12, 15];
/// Fig. 4 clients of `--quick`.
pub const FIG4_CLIENTS_QUICK: [u32; 2] = [1, 3];
/// The paper's Fig. 4 workload: five files of 1 MB per client.
pub const FIG4_FILES: usize = 5;
/// Size of each Fig. 4 file.
pub const FIG4_FILE_BYTES: u64 = 1 << 20;
/// Default nice value of the two CPU hogs of a loaded point (`--hog-nice`), by
/// [`HOG_RULE`]: -20, the strongest. Each hog then weighs 88,761 against a nice-0
/// thread's 1,024, so with all 15 back-end threads of Fig. 4's largest point runnable
/// the hogs' weight is 92 % of the CPU's (-19: 90.3 %; -10, the former default: 55 % by
/// weight, 61-64 % measured, far from the paper's condition). The share actually taken is
/// measured at every loaded point (`hog_cpu_frac`).
pub const HOG_NICE_DEFAULT: i32 = -20;
/// The rule that sets [`HOG_NICE_DEFAULT`] (recorded in every run's summary).
pub const HOG_RULE: &str = "the paper's two CPU-bound background processes on the server's \
one CPU, their nice value set so that \"they consume nearly 100% of the CPU at all times\": \
the hogs must hold at least 90% of the server's CPU at the most demanding point (Fig. 4, 15 \
busy back-end threads at nice 0), so -20, the strongest nice (2 x 88,761 against 15 x 1,024: \
92% by weight); each loaded point records the share they took (hog_cpu_frac). Until this rule \
the default was -10, at which 15 back-end threads kept 36-39% of the CPU";
/// The paper's number of CPU hogs.
pub const HOGS: usize = 2;
/// Largest file, bytes: the RDMA transfer cap of every back-end
/// (`--rdma-transfer-bytes-max`).
pub const FILE_BYTES_MAX: u64 = 8 << 20;
/// Most clients of a point ([`farside_loadgen::rdma::RDMA_CLIENTS_MAX`] allows more;
/// each back-end worker serves one kept-alive client).
pub const CLIENTS_MAX: u32 = 32;
/// Most `--probe-gap-ms`.
pub const PROBE_GAP_MS_MAX: u64 = 1000;
/// Most `--repeat`.
pub const REPEAT_MAX: u32 = 10;

/// `farside lab rdma-http`.
#[derive(Debug, Clone, clap::Args)]
pub struct RdmaHttpArgs {
    /// Output directory (summary.json, points.jsonl, table.txt, rdma-http.csv,
    /// report.html, logs/).
    #[arg(long, default_value = "out/rdma-http")]
    pub out: PathBuf,
    #[command(flatten)]
    pub sweep: SweepFlags,
    /// Where the nodes run: netns only (root: the server's namespace pinned to one CPU
    /// with its receive softirq, the hogs in its cgroup).
    #[arg(long, value_enum, default_value_t = Hosts::Netns)]
    pub hosts: Hosts,
    /// Experiments (comma-separated): table1 (registration cost), fig3 (one client,
    /// time vs size), fig4 (1 to 15 clients, five 1 MB files each).
    #[arg(long, value_delimiter = ',', default_value = "table1,fig3,fig4")]
    pub experiment: Vec<String>,
    /// Systems of fig3 and fig4 (comma-separated): tcp, iwarp-static, iwarp-dynamic,
    /// iwarp-cached, xdp-reads (bodies read one-sidedly from the back-end's object
    /// arena, answered in the kernel by XDP, one HTTP request per body), xdp-direct (the
    /// same with grants: paths resolved by one-sided index READs, no HTTP request per
    /// body; table1 measures the three registration strategies).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tcp,iwarp-static,iwarp-dynamic,iwarp-cached,xdp-reads,xdp-direct"
    )]
    pub systems: Vec<String>,
    /// Loads (comma-separated): idle, loaded (two CPU hogs on the server's CPU at
    /// --hog-nice).
    #[arg(long, value_delimiter = ',', default_value = "idle,loaded")]
    pub loads: Vec<String>,
    /// Nice value of the two CPU hogs of a loaded point (-20..=19; the server and the
    /// registration probe run at 0). Default: -20, so that the hogs hold >= 90 % of the
    /// server's CPU even against Fig. 4's 15 busy threads, the paper's "nearly 100 %"
    /// (each loaded point records their share, hog_cpu_frac).
    #[arg(long, default_value_t = HOG_NICE_DEFAULT, allow_hyphen_values = true)]
    pub hog_nice: i32,
    /// Table 1: sleep before each registration step, ms: 0 (back to back, a server
    /// busy serving) or more (each step just after a wake-up, as a worker that was
    /// idle until its request). Default: 0.
    #[arg(long, default_value_t = 0)]
    pub probe_gap_ms: u64,
    /// Table 1 sizes, bytes (comma-separated). Default: 2048, 4096, 512000, 1 MiB,
    /// 8 MiB (--quick: 4096, 1 MiB).
    #[arg(long, value_delimiter = ',')]
    pub table1_sizes: Vec<u64>,
    /// Registration steps timed per Table 1 point. Default: 40 (--quick: 5).
    #[arg(long)]
    pub table1_samples: Option<usize>,
    /// Fig. 3 sizes, bytes (comma-separated). Default: 1 KiB to 8 MiB, 7 sizes
    /// (--quick: 4096, 1 MiB).
    #[arg(long, value_delimiter = ',')]
    pub fig3_sizes: Vec<u64>,
    /// Fig. 4 clients (comma-separated). Default: 1, 3, 6, 9, 12, 15 (--quick: 1, 3).
    #[arg(long, value_delimiter = ',')]
    pub fig4_clients: Vec<u32>,
    /// Fig. 4: times each client fetches its five 1 MB files (the paper: once).
    /// Default: 1.
    #[arg(long, default_value_t = 1)]
    pub fig4_rounds: u32,
    /// Measured time of one fig3 point, s: one client requests its file for this long
    /// (after one warm-up request). Default: 2 (--quick: 0.5).
    #[arg(long)]
    pub point_s: Option<f64>,
    /// Run every point this many times (1..=10); runs are combined (means; counts
    /// summed).
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// MTU of every link (both nodes' eth0, their bridge ports, the bridge), bytes,
    /// 1,500..=9,000: it sets how many chunks an xdp-reads bulk READ spans (six at
    /// 9,000) and TCP's segment size, for both systems. Default: 9000.
    #[arg(long, default_value_t = LINK_MTU)]
    pub link_mtu: u32,
    /// How xdp-reads' back-end attaches its arena responder: generic, or native (in the
    /// veth driver; the lab then turns GRO on on the server's bridge port, so that it
    /// takes the XDP_TX replies, and steers the client's bridge port's receive path to
    /// the server's CPU by RPS, so the server's veth NAPI, hence the responder, runs on
    /// the server's CPU; a veth takes native XDP only at an MTU of at most 3,520 B, see
    /// --link-mtu). Default: generic.
    #[arg(long, default_value = "generic", value_parser = ["generic", "native"])]
    pub xdp_mode: String,
    /// Internal: measure registration steps (STRATEGY:SIZE:SAMPLES) and write them as
    /// JSON to --probe-out; what a table1 point runs inside the server's node.
    #[arg(long, hide = true)]
    pub probe: Option<String>,
    /// Internal: where --probe writes.
    #[arg(long, hide = true)]
    pub probe_out: Option<PathBuf>,
}

/// One point's key.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Key {
    pub experiment: String,
    pub system: String,
    pub load: String,
    pub size_bytes: u64,
    pub clients: u32,
}

/// The checked settings of a run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub experiments: Vec<String>,
    pub systems: Vec<String>,
    pub loads: Vec<String>,
    pub table1_sizes: Vec<u64>,
    pub table1_samples: usize,
    pub probe_gap_ms: u64,
    pub fig3_sizes: Vec<u64>,
    pub fig4_clients: Vec<u32>,
    pub fig4_rounds: u32,
    pub point_s: f64,
    /// The client's and the server's CPU.
    pub client_cpu: usize,
    pub server_cpu: usize,
    /// The links' MTU and xdp-reads' XDP attach mode (`generic`, `native`).
    pub link_mtu: u32,
    pub xdp_mode: String,
}

/// Bounds of `--link-mtu`: Ethernet's 1,500 to the jumbo 9,000.
pub const LINK_MTU_RANGE: std::ops::RangeInclusive<u32> = 1500..=9000;

fn bad(m: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, m)
}

fn pick<T: Clone>(given: &[T], full: &[T], quick: &[T], q: bool) -> Vec<T> {
    if !given.is_empty() {
        given.to_vec()
    } else if q {
        quick.to_vec()
    } else {
        full.to_vec()
    }
}

/// The registration strategy of a system (`iwarp-cached` → `cache`).
pub fn registration_of(system: &str) -> Option<&'static str> {
    match system {
        "iwarp-static" => Some("static"),
        "iwarp-dynamic" => Some("dynamic"),
        "iwarp-cached" => Some("cache"),
        _ => None,
    }
}

/// Check the flags and derive the plan.
pub fn check_args(a: &RdmaHttpArgs) -> io::Result<Plan> {
    if a.hosts != Hosts::Netns {
        return Err(bad(format!(
            "--hosts {}: lab rdma-http runs on netns only (the server's node is pinned to \
             one CPU with its softirq, and loaded by hogs in its cgroup)",
            a.hosts.as_str()
        )));
    }
    for e in &a.experiment {
        if !EXPERIMENTS.contains(&e.as_str()) {
            return Err(bad(format!(
                "--experiment: unknown `{e}` ({})",
                EXPERIMENTS.join(", ")
            )));
        }
    }
    for s in &a.systems {
        if !SYSTEMS.contains(&s.as_str()) {
            return Err(bad(format!(
                "--systems: unknown `{s}` ({})",
                SYSTEMS.join(", ")
            )));
        }
    }
    for l in &a.loads {
        if l != "idle" && l != "loaded" {
            return Err(bad(format!("--loads: unknown `{l}` (idle, loaded)")));
        }
    }
    if a.experiment.is_empty() || a.systems.is_empty() || a.loads.is_empty() {
        return Err(bad(
            "--experiment, --systems, --loads: at least one each".into()
        ));
    }
    if !(-20..=19).contains(&a.hog_nice) {
        return Err(bad(format!("--hog-nice {}: -20..=19", a.hog_nice)));
    }
    if !LINK_MTU_RANGE.contains(&a.link_mtu) {
        return Err(bad(format!(
            "--link-mtu {}: {}..={}",
            a.link_mtu,
            LINK_MTU_RANGE.start(),
            LINK_MTU_RANGE.end()
        )));
    }
    if a.repeat == 0 || a.repeat > REPEAT_MAX {
        return Err(bad(format!("--repeat {}: 1..={REPEAT_MAX}", a.repeat)));
    }
    let q = a.sweep.quick;
    let table1_sizes = pick(&a.table1_sizes, &TABLE1_SIZES, &TABLE1_SIZES_QUICK, q);
    let fig3_sizes = pick(&a.fig3_sizes, &FIG3_SIZES, &FIG3_SIZES_QUICK, q);
    for &s in table1_sizes.iter().chain(&fig3_sizes) {
        if s == 0 || s > FILE_BYTES_MAX {
            return Err(bad(format!(
                "size {s}: every size in 1..={FILE_BYTES_MAX} bytes"
            )));
        }
    }
    let fig4_clients = pick(&a.fig4_clients, &FIG4_CLIENTS, &FIG4_CLIENTS_QUICK, q);
    if fig4_clients.iter().any(|&c| c == 0 || c > CLIENTS_MAX) {
        return Err(bad(format!("--fig4-clients: each in 1..={CLIENTS_MAX}")));
    }
    let table1_samples = a.table1_samples.unwrap_or(if q { 5 } else { 40 });
    if table1_samples == 0 || table1_samples > farside_rdmahttp::regbench::SAMPLES_MAX {
        return Err(bad(format!(
            "--table1-samples: 1..={}",
            farside_rdmahttp::regbench::SAMPLES_MAX
        )));
    }
    let fig4_rounds = a.fig4_rounds;
    if fig4_rounds == 0 || fig4_rounds > 100 {
        return Err(bad("--fig4-rounds: 1..=100".into()));
    }
    let point_s = a.point_s.unwrap_or(if q { 0.5 } else { 2.0 });
    if !(point_s.is_finite() && point_s > 0.0 && point_s <= 600.0) {
        return Err(bad("--point-s: in (0, 600]".into()));
    }
    let cpus = crate::fabric::procs::allowed_cpus();
    let tiers = crate::fabric::procs::Tiers::of(&cpus).ok_or_else(|| {
        bad("lab rdma-http needs two CPUs: the server's (loaded) and the clients'".into())
    })?;
    Ok(Plan {
        experiments: a.experiment.clone(),
        systems: a.systems.clone(),
        loads: a.loads.clone(),
        table1_sizes,
        table1_samples,
        probe_gap_ms: a.probe_gap_ms.min(PROBE_GAP_MS_MAX),
        fig3_sizes,
        fig4_clients,
        fig4_rounds,
        point_s,
        client_cpu: tiers.front[0],
        server_cpu: tiers.back[0],
        link_mtu: a.link_mtu,
        xdp_mode: a.xdp_mode.clone(),
    })
}

/// Every point's key, loads outermost within each experiment.
pub fn point_keys(plan: &Plan) -> Vec<Key> {
    let mut keys = Vec::new();
    let key = |e: &str, s: &str, l: &str, size: u64, c: u32| Key {
        experiment: e.into(),
        system: s.into(),
        load: l.into(),
        size_bytes: size,
        clients: c,
    };
    for e in &plan.experiments {
        for l in &plan.loads {
            match e.as_str() {
                "table1" => {
                    for s in ["iwarp-static", "iwarp-dynamic", "iwarp-cached"] {
                        for &size in &plan.table1_sizes {
                            keys.push(key(e, s, l, size, 1));
                        }
                    }
                }
                "fig3" => {
                    for &size in &plan.fig3_sizes {
                        for s in &plan.systems {
                            keys.push(key(e, s, l, size, 1));
                        }
                    }
                }
                _ => {
                    for &c in &plan.fig4_clients {
                        for s in &plan.systems {
                            keys.push(key(e, s, l, FIG4_FILE_BYTES, c));
                        }
                    }
                }
            }
        }
    }
    keys
}

/// `lab rdma-http` as the sweep runner and the report shell see it.
pub struct RdmaHttp;

impl crate::experiment::Experiment for RdmaHttp {
    const NAME: &'static str = "rdma-http";
    type Args = RdmaHttpArgs;
    type Point = RdmaPoint;

    fn run(args: RdmaHttpArgs) -> io::Result<()> {
        run(args)
    }

    fn table(s: &crate::summary::Summary<RdmaPoint>) -> String {
        if s.points.is_empty() {
            return String::new();
        }
        tables(&s.points) + "\n"
    }

    fn files(s: &crate::summary::Summary<RdmaPoint>) -> io::Result<Vec<(String, String)>> {
        if s.points.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![
            ("rdma-http.csv".to_string(), csv(&s.points)?),
            (
                "table.txt".to_string(),
                crate::report::table_text::<RdmaHttp>(s),
            ),
        ])
    }

    fn figures(_: &crate::summary::Summary<RdmaPoint>) -> Vec<crate::experiment::Figure> {
        Vec::new()
    }

    fn html(s: &crate::summary::Summary<RdmaPoint>) -> String {
        if s.points.is_empty() {
            return String::new();
        }
        format!(
            "<h2>RDMA over HTTP</h2>\n<pre>{}</pre>\n",
            crate::svg::escape(&tables(&s.points))
        )
    }
}
