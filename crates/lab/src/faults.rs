//! `farside lab faults`: inject the faults a deployment meets into a loaded tier and
//! count what the clients saw.
//!
//! The tier: `backends` web servers (`farside backend`), one gatherd each serving its
//! region over udp (user space on loopback), one proxy (`farside proxy --config`,
//! admission on, `reuse_port = true`), and an open-loop loadgen (Poisson arrivals, one
//! request per connection) at `--rate` for the whole of every fault's phase. One phase
//! per fault, in this order:
//!
//! | fault | injected at `fault_at` | repaired (`time_to_fresh_ms` counts from here) |
//! |---|---|---|
//! | `gatherd-restart` | SIGKILL back-end 0's gatherd | a new gatherd started 0.5 s later serves (`repair_ms`: its start-up) |
//! | `backend-stop` | SIGSTOP back-end 0 | SIGCONT 2 s later |
//! | `backend-kill` | SIGKILL back-end 0 | a new back-end started 1 s later |
//! | `region-drop` (netns only) | an nftables rule drops 30% of region requests leaving the proxy node | the rule removed 2 s later |
//! | `proxy-restart` | a second proxy binds the port (SO_REUSEPORT), then SIGTERM to the first | the first exits (drained) |
//! | `reload` | config + spare back-end, SIGHUP | config without it, SIGHUP, 1 s later |
//!
//! Per fault a row: `answered` (responses < 500), `refused_503`, `failed` (connect and
//! I/O errors, malformed and non-503 5xx responses, by kind), `hung` (requests with no
//! response and no error within loadgen's `--timeout-ms`: its `timeouts`; must be 0),
//! `inflight_at_end` (cut by the end of the phase, not hung), and `time_to_fresh_ms`:
//! from the repair to the first scrape (every [`FRESH_POLL`]) of the proxy's admin
//! metrics in which every back-end's load is fresh (`farside_backend_load` ≥ 0); for
//! `gatherd-restart` that counts from the new gatherd serving again (`repair_ms` after
//! its spawn), and `time_to_fresh_from_repair_cmd_ms` from its spawn (polled while it
//! starts: its region answers before its start-up ends).
//! Target: `hung` = 0 for every fault; `time_to_fresh_from_repair_cmd_ms` ≤ 2 ×
//! `stale_after_ms` after the gatherd restart.
//!
//! Outputs in `--out`, through the shared runner ([`crate::sweep`]): one point per fault
//! appended to `points.jsonl` as it finishes (`--resume DIR` continues a broken run),
//! `summary.json` (commit, kernel, CPU, settings in `params`, the rows as `points`,
//! `targets_met`), `table.txt` and `faults.csv`; `farside lab report DIR` prints the
//! table again from the kept files.
//! The offered rate is `--load-share` (0.7) × the capacity measured by a short
//! closed-loop run through the proxy first, unless `--rate` sets it.
//!
//! `--hosts netns` (root) runs every node in its own network namespace
//! ([`crate::fabric::netns`]), regions over udp answered by XDP (generic mode) in the back-end
//! node's kernel, and adds `region-drop`: an nftables output rule in the proxy node's
//! namespace, `udp dport PORT numgen random mod 100 < 30 drop` (needs `nft`; this
//! kernel has no netem, prio or tc actions, and XDP's replies on the back-end side
//! bypass both qdiscs and netfilter).

use crate::fabric::procs::Child;
use farside_loadgen::{LoadgenArgs, Summary};
use serde::{Deserialize, Serialize};
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The faults, in the order they run.
pub const FAULTS: [&str; 6] = [
    "gatherd-restart",
    "backend-stop",
    "backend-kill",
    "region-drop",
    "proxy-restart",
    "reload",
];
/// Faults that need `--hosts netns` (they are skipped on loopback).
pub const FAULTS_NETNS_ONLY: [&str; 1] = ["region-drop"];
/// Share of region packets dropped in `region-drop`, percent.
pub const REGION_DROP_PCT: u32 = 30;
/// nftables table holding the `region-drop` rule (in the proxy node's namespace only).
const NFT_TABLE: &str = "farside_faults";
/// How long region packets are dropped in `region-drop`.
const REGION_DROP_FOR: Duration = Duration::from_secs(2);
/// Fixed ports of the netns tier (each node has its own IP).
const NETNS_WEB_PORT: u16 = 80;
const NETNS_UDP_PORT: u16 = 7002;
const NETNS_PROXY_PORT: u16 = 8080;
/// Admin port of the first proxy; a restarted one takes the next.
const NETNS_ADMIN_PORT: u16 = 9100;
/// gatherd's metrics port in each back-end node.
const NETNS_GATHERD_METRICS_PORT: u16 = 9200;

/// Period of the admin-metrics poll measuring `time_to_fresh_ms` (the 10 ms).
pub const FRESH_POLL: Duration = Duration::from_millis(10);
/// Longest wait for a fresh view after a repair: 100× the default `stale_after_ms`; a
/// view still stale then is reported as `null` (and fails the lab's test).
pub const FRESH_WAIT_MAX: Duration = Duration::from_secs(10);
/// How long the gatherd stays dead in `gatherd-restart`.
const GATHERD_DOWN: Duration = Duration::from_millis(500);
/// How long the back-end stays stopped in `backend-stop` (the 2 s).
const BACKEND_STOPPED: Duration = Duration::from_secs(2);
/// How long the back-end stays dead in `backend-kill`.
const BACKEND_DOWN: Duration = Duration::from_secs(1);
/// How long the spare back-end stays in the configuration in `reload`.
const RELOAD_HELD: Duration = Duration::from_secs(1);
/// Longest wait for a process to listen or exit.
const READY_MAX: Duration = Duration::from_secs(15);
/// Phase length per fault: it must hold the longest fault (2 s) plus recovery.
const PHASE_S_FULL: f64 = 10.0;
const PHASE_S_QUICK: f64 = 4.0;

/// `farside lab faults`.
#[derive(Debug, Clone, clap::Args)]
pub struct FaultsArgs {
    /// Output directory (summary.json, points.jsonl, table.txt, faults.csv, logs/).
    #[arg(long, default_value = "out/faults")]
    pub out: PathBuf,
    /// Continue the broken run kept in DIR (its output directory): faults already
    /// measured are skipped. Refused when the settings differ from the kept run's.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Short phases (4 s per fault instead of 10), for CI.
    #[arg(long)]
    pub quick: bool,
    /// Where the nodes run: loopback (unprivileged) or netns (root: one network
    /// namespace per node, regions over udp answered by XDP, and the `region-drop`
    /// fault).
    #[arg(long, default_value = "loopback")]
    pub hosts: String,
    /// Open-loop arrival rate, requests/s (one request per connection), for the whole
    /// run. Default: `--load-share` × the tier's capacity, measured first by a short
    /// closed-loop run through the proxy (`capacity_rps` in summary.json).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Share of the measured capacity offered when --rate is not given.
    #[arg(long, default_value_t = 0.7)]
    pub load_share: f64,
    /// Back-ends in the tier (≥ 2, so one can fail while the other serves).
    #[arg(long, default_value_t = 2)]
    pub backends: usize,
    /// Workers per back-end (`farside backend --workers`).
    #[arg(long, default_value_t = 8)]
    pub backend_workers: usize,
    /// The proxy's `admission.stale_after_ms`.
    #[arg(long, default_value_t = 100)]
    pub stale_after_ms: u64,
    /// The proxy's admission limit (metric backlog).
    #[arg(long, default_value_t = 4)]
    pub limit: u64,
    /// Loadgen's per-request timeout, ms: a request without response or error by then is
    /// counted hung.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    /// Run only these faults (comma-separated; default all).
    #[arg(long, value_delimiter = ',')]
    pub faults: Vec<String>,
}

/// What the clients saw during one fault's phase (a point of the shared runner).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FaultRow {
    pub fault: String,
    /// Requests started in the phase.
    pub started: u64,
    /// Responses with status < 500.
    pub answered: u64,
    /// 503 responses (admission or queue refusals).
    pub refused_503: u64,
    /// Connect errors + I/O errors + malformed + other 5xx.
    pub failed: u64,
    pub failed_connect: u64,
    pub failed_io: u64,
    pub failed_malformed: u64,
    pub failed_5xx: u64,
    /// No response and no error within the request timeout.
    pub hung: u64,
    /// In flight when the phase's load ended (neither answered nor hung).
    pub inflight_at_end: u64,
    /// From the repair to the first fully fresh view, ms; `None`: not within
    /// [`FRESH_WAIT_MAX`].
    pub time_to_fresh_ms: Option<f64>,
    /// Whether the proxy's view was stale just before the repair (the fault reached the
    /// view; expected for `gatherd-restart` only).
    pub stale_at_repair: bool,
    /// How long the repair took, ms: for `gatherd-restart`, from starting the new
    /// gatherd until it serves (its metrics listener answers; the XDP attach takes
    /// most of it in netns). `time_to_fresh_ms` counts from its end.
    pub repair_ms: Option<f64>,
    /// From the repair command (for `gatherd-restart`: the new gatherd's spawn) to the
    /// first fresh view, ms, polled while the repair runs (a restarted gatherd serves a
    /// fresh region before its start-up ends); `None` where the repair takes no time
    /// (then it equals `time_to_fresh_ms`) or no fresh view came.
    pub time_to_fresh_from_repair_cmd_ms: Option<f64>,
    /// Runs combined in this row (counts summed, times the worst run's).
    #[serde(default = "one")]
    pub runs: u64,
}

fn one() -> u64 {
    1
}

impl FaultRow {
    fn new(fault: &str, s: &Summary, (fresh, stale_at_repair, repair, cmd): Repair) -> FaultRow {
        let k = &s.failure_kinds;
        FaultRow {
            fault: fault.into(),
            started: s.started,
            answered: s.served,
            refused_503: s.dropped_503,
            failed: k.connect_errors + k.io_errors + k.malformed + k.status_5xx,
            failed_connect: k.connect_errors,
            failed_io: k.io_errors,
            failed_malformed: k.malformed,
            failed_5xx: k.status_5xx,
            hung: k.timeouts,
            inflight_at_end: s.inflight_at_end,
            time_to_fresh_ms: fresh.map(|d| d.as_secs_f64() * 1e3),
            stale_at_repair,
            repair_ms: repair.map(|d| d.as_secs_f64() * 1e3),
            time_to_fresh_from_repair_cmd_ms: cmd.map(|d| d.as_secs_f64() * 1e3),
            runs: 1,
        }
    }

    /// Repeats of one fault: counts summed; times are the worst run's (a run that never
    /// became fresh makes the combined row `None`: the target is per run).
    pub fn combine(runs: &[FaultRow]) -> FaultRow {
        let Some(first) = runs.first() else {
            return FaultRow::new("", &Summary::default(), (None, false, None, None));
        };
        let sum = |f: fn(&FaultRow) -> u64| runs.iter().map(f).sum::<u64>();
        let worst = |f: fn(&FaultRow) -> Option<f64>| {
            runs.iter()
                .map(f)
                .try_fold(0.0f64, |m, v| v.map(|v| m.max(v)))
        };
        let any_worst = |f: fn(&FaultRow) -> Option<f64>| {
            runs.iter()
                .filter_map(f)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        };
        FaultRow {
            fault: first.fault.clone(),
            started: sum(|r| r.started),
            answered: sum(|r| r.answered),
            refused_503: sum(|r| r.refused_503),
            failed: sum(|r| r.failed),
            failed_connect: sum(|r| r.failed_connect),
            failed_io: sum(|r| r.failed_io),
            failed_malformed: sum(|r| r.failed_malformed),
            failed_5xx: sum(|r| r.failed_5xx),
            hung: sum(|r| r.hung),
            inflight_at_end: sum(|r| r.inflight_at_end),
            time_to_fresh_ms: worst(|r| r.time_to_fresh_ms),
            stale_at_repair: runs.iter().any(|r| r.stale_at_repair),
            repair_ms: any_worst(|r| r.repair_ms),
            time_to_fresh_from_repair_cmd_ms: any_worst(|r| r.time_to_fresh_from_repair_cmd_ms),
            runs: runs.iter().map(|r| r.runs).sum(),
        }
    }
}

fn free_tcp() -> io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

fn free_udp() -> io::Result<SocketAddr> {
    UdpSocket::bind("127.0.0.1:0")?.local_addr()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn signal(c: &Child, sig: i32) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(c.pid() as i32, sig) };
}

/// Where the tier's processes run.
enum Fabric {
    /// Processes on 127.0.0.1 with free ports.
    Loopback,
    /// One namespace per node: `b0..` (back-ends and the spare), `proxy`, `client`.
    Netns(Box<crate::fabric::netns::VirtualDc>),
}

impl Fabric {
    fn tcp_addr(&self, node: &str, port: u16) -> io::Result<SocketAddr> {
        match self {
            Fabric::Loopback => free_tcp(),
            Fabric::Netns(dc) => Ok(SocketAddr::new(dc.node_ip(node).into(), port)),
        }
    }

    fn udp_addr(&self, node: &str, port: u16) -> io::Result<SocketAddr> {
        match self {
            Fabric::Loopback => free_udp(),
            Fabric::Netns(dc) => Ok(SocketAddr::new(dc.node_ip(node).into(), port)),
        }
    }

    fn spawn(&self, node: &str, name: &str, args: &[String], logs: &Path) -> io::Result<Child> {
        match self {
            Fabric::Loopback => Child::farside(name, args, logs, None),
            Fabric::Netns(dc) => {
                let log = logs.join(format!("{name}.log"));
                let c = dc.spawn_in(node, &std::env::current_exe()?, args, &log)?;
                Ok(Child::adopt(name, c, log))
            }
        }
    }

    /// Wait until `addr` accepts connections, seen from where the clients run.
    fn wait_port(&self, c: &mut Child, addr: SocketAddr) -> io::Result<()> {
        match self {
            Fabric::Loopback => c.wait_port(addr),
            Fabric::Netns(dc) => crate::fabric::wait_port(
                c,
                addr,
                crate::fabric::Vantage::Node(dc, "client"),
                READY_MAX,
                FRESH_POLL,
            ),
        }
    }

    /// Whether something accepts on `addr` now (one connect, from the client node).
    fn port_up(&self, addr: SocketAddr) -> io::Result<bool> {
        let up = || Ok(std::net::TcpStream::connect_timeout(&addr, FRESH_POLL * 10).is_ok());
        match self {
            Fabric::Loopback => up(),
            Fabric::Netns(dc) => dc.run_in_ns("client", up),
        }
    }

    fn scrape(&self, admin: SocketAddr) -> io::Result<String> {
        match self {
            Fabric::Loopback => crate::promtext::scrape(admin),
            Fabric::Netns(dc) => dc.run_in_ns("client", || crate::promtext::scrape(admin)),
        }
    }

    fn loadgen(&self, l: &LoadgenArgs) -> io::Result<Summary> {
        let run = || farside_loadgen::run(l).map_err(|e| io::Error::other(format!("loadgen: {e}")));
        match self {
            Fabric::Loopback => run(),
            Fabric::Netns(dc) => dc.run_in_ns("client", run),
        }
    }

    /// Run `nft ARGS` in `node`'s namespace with `stdin` as its input.
    fn nft(&self, node: &str, args: &[&str], stdin: &str) -> io::Result<()> {
        use std::process::{Command, Stdio};
        let Fabric::Netns(dc) = self else {
            return Err(io::Error::other("nft needs --hosts netns"));
        };
        let what = format!("nft {} (apt-get install nftables)", args.join(" "));
        let mut cmd = Command::new("nft");
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        dc.prepare_command(node, &mut cmd)?;
        let mut c = cmd
            .spawn()
            .map_err(|e| io::Error::other(format!("{what}: {e}")))?;
        c.stdin.take().expect("piped").write_all(stdin.as_bytes())?;
        let out = c.wait_with_output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "{what}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }
}

/// One back-end node: web server + gatherd.
struct Node {
    name: String,
    web: SocketAddr,
    udp: SocketAddr,
    /// gatherd's metrics listener: it answers once the region is served (after the
    /// XDP attach), so it tells when a restarted gatherd is ready.
    gatherd_metrics: SocketAddr,
    backend: Child,
    gatherd: Child,
}

struct Tier {
    logs: PathBuf,
    proxy_node_admin: u16,
    nodes: Vec<Node>,
    spare: Node,
    config: PathBuf,
    listen: SocketAddr,
    proxy: Child,
    admin: SocketAddr,
    workers: usize,
    /// Processes started by repairs, kept alive (and stopped) with the tier.
    generation: usize,
}

fn start_backend(
    f: &Fabric,
    node: &str,
    logs: &Path,
    web: SocketAddr,
    workers: usize,
    name: &str,
) -> io::Result<Child> {
    let mut c = f.spawn(
        node,
        name,
        &strings(&[
            "backend",
            "--listen",
            &web.to_string(),
            "--workers",
            &workers.to_string(),
        ]),
        logs,
    )?;
    f.wait_port(&mut c, web)?;
    Ok(c)
}

/// Where a node's gatherd runs and serves: node name, web port watched, region (udp)
/// and metrics addresses.
type GatherdAt<'a> = (&'a str, SocketAddr, SocketAddr, SocketAddr);

/// Start a gatherd and wait until it serves (its metrics listener answers).
fn start_gatherd(f: &Fabric, logs: &Path, at: GatherdAt, name: &str) -> io::Result<Child> {
    let mut c = spawn_gatherd(f, logs, at, name)?;
    f.wait_port(&mut c, at.3)?;
    Ok(c)
}

/// Start a gatherd without waiting for it to serve.
fn spawn_gatherd(f: &Fabric, logs: &Path, at: GatherdAt, name: &str) -> io::Result<Child> {
    let (node, web, udp, metrics) = at;
    let mut args = strings(&[
        "gatherd",
        "--watch-port",
        &web.port().to_string(),
        "--no-shm",
        "--udp-listen",
        &udp.to_string(),
        "--metrics-listen",
        &metrics.to_string(),
    ]);
    if matches!(f, Fabric::Netns(_)) {
        // One-sided across hosts: the XDP responder in the back-end node's kernel.
        args.extend(strings(&[
            "--xdp-iface",
            crate::fabric::netns::VETH_IN_NS,
            "--xdp-mode",
            "generic",
        ]));
    }
    f.spawn(node, name, &args, logs)
}

fn start_node(f: &Fabric, logs: &Path, node: &str, workers: usize) -> io::Result<Node> {
    let web = f.tcp_addr(node, NETNS_WEB_PORT)?;
    let udp = f.udp_addr(node, NETNS_UDP_PORT)?;
    let gatherd_metrics = f.tcp_addr(node, NETNS_GATHERD_METRICS_PORT)?;
    let backend = start_backend(f, node, logs, web, workers, &format!("backend-{node}"))?;
    let at = (node, web, udp, gatherd_metrics);
    let gatherd = start_gatherd(f, logs, at, &format!("gatherd-{node}"))?;
    Ok(Node {
        name: node.to_string(),
        web,
        udp,
        gatherd_metrics,
        backend,
        gatherd,
    })
}

fn write_config(
    a: &FaultsArgs,
    path: &Path,
    listen: SocketAddr,
    nodes: &[&Node],
) -> io::Result<()> {
    let mut s = format!(
        "listen = \"{listen}\"\nreuse_port = true\n\n[admission]\nenabled = true\nmetric = \"backlog\"\nlimit = {}\nstale_after_ms = {}\n",
        a.limit, a.stale_after_ms
    );
    for n in nodes {
        s.push_str(&format!(
            "\n[[backend]]\naddr = \"{}\"\nregion = \"udp:{}\"\n",
            n.web, n.udp
        ));
    }
    std::fs::write(path, s)
}

fn start_proxy(
    f: &Fabric,
    logs: &Path,
    config: &Path,
    admin: SocketAddr,
    name: &str,
) -> io::Result<Child> {
    let mut c = f.spawn(
        "proxy",
        name,
        &strings(&[
            "proxy",
            "--config",
            &config.display().to_string(),
            "--admin-listen",
            &admin.to_string(),
        ]),
        logs,
    )?;
    f.wait_port(&mut c, admin)?;
    Ok(c)
}

/// Whether every back-end's load in the scrape is fresh (`farside_backend_load` ≥ 0).
pub fn view_fresh(metrics: &str) -> bool {
    let mut any = false;
    for l in metrics
        .lines()
        .filter(|l| l.starts_with("farside_backend_load{"))
    {
        any = true;
        match l.rsplit(' ').next().and_then(|v| v.parse::<i64>().ok()) {
            Some(v) if v >= 0 => {}
            _ => return false,
        }
    }
    any
}

/// Poll the proxy's admin metrics every [`FRESH_POLL`] from now until the view is fresh.
fn time_to_fresh(f: &Fabric, admin: SocketAddr) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < FRESH_WAIT_MAX {
        if f.scrape(admin).is_ok_and(|m| view_fresh(&m)) {
            return Some(t0.elapsed());
        }
        std::thread::sleep(FRESH_POLL);
    }
    None
}

fn wait_exit(c: &mut Child) -> io::Result<()> {
    let t0 = Instant::now();
    while c.exited().is_none() {
        if t0.elapsed() > READY_MAX {
            return Err(io::Error::other(format!("{} did not exit", c.name)));
        }
        std::thread::sleep(FRESH_POLL);
    }
    Ok(())
}

/// Time from the repaired component serving again to a fresh view, whether the view
/// was stale at the repair, how long the repair took, and the time from the repair
/// command to a fresh view (where the repair takes time: the gatherd restart).
type Repair = (Option<Duration>, bool, Option<Duration>, Option<Duration>);

/// Whether the proxy at `admin` sees a stale (or unreadable) view now.
fn stale_now(f: &Fabric, admin: SocketAddr) -> bool {
    !f.scrape(admin).is_ok_and(|m| view_fresh(&m))
}

/// Inject `fault` into `t`, repair it, and measure the time from repair to a fresh view.
fn inject(a: &FaultsArgs, fab: &Fabric, t: &mut Tier, fault: &str) -> io::Result<Repair> {
    t.generation += 1;
    let g = t.generation;
    let stale;
    // Time the repair itself took (a restarted process starting up), where it matters.
    let mut repair = None;
    // From the repair command to a fresh view, measured while the repair runs.
    let mut fresh_from_cmd = None;
    match fault {
        "gatherd-restart" => {
            let n = &mut t.nodes[0];
            signal(&n.gatherd, libc::SIGKILL);
            wait_exit(&mut n.gatherd)?;
            std::thread::sleep(GATHERD_DOWN);
            stale = stale_now(fab, t.admin);
            let name = format!("gatherd-{}-{g}", n.name);
            let t_start = Instant::now();
            let at = (n.name.as_str(), n.web, n.udp, n.gatherd_metrics);
            n.gatherd = spawn_gatherd(fab, &t.logs, at, &name)?;
            // The region may answer (fresh) before the whole start-up is done (the
            // metrics listener comes last, after the XDP attach): watch both.
            loop {
                n.gatherd.check_alive()?;
                if fresh_from_cmd.is_none() && !stale_now(fab, t.admin) {
                    fresh_from_cmd = Some(t_start.elapsed());
                }
                if fab.port_up(n.gatherd_metrics)? {
                    break;
                }
                if t_start.elapsed() > READY_MAX {
                    return Err(io::Error::other(format!("{name} did not serve")));
                }
                std::thread::sleep(FRESH_POLL);
            }
            repair = Some(t_start.elapsed());
        }
        "backend-stop" => {
            let n = &t.nodes[0];
            signal(&n.backend, libc::SIGSTOP);
            std::thread::sleep(BACKEND_STOPPED);
            stale = stale_now(fab, t.admin);
            signal(&n.backend, libc::SIGCONT);
        }
        "backend-kill" => {
            let web = t.nodes[0].web;
            signal(&t.nodes[0].backend, libc::SIGKILL);
            wait_exit(&mut t.nodes[0].backend)?;
            std::thread::sleep(BACKEND_DOWN);
            stale = stale_now(fab, t.admin);
            let node = t.nodes[0].name.clone();
            let name = format!("backend-{node}-{g}");
            t.nodes[0].backend = start_backend(fab, &node, &t.logs, web, t.workers, &name)?;
        }
        "proxy-restart" => {
            let admin = fab.tcp_addr("proxy", t.proxy_node_admin + g as u16)?;
            let next = start_proxy(fab, &t.logs, &t.config, admin, &format!("proxy-{g}"))?;
            let mut old = std::mem::replace(&mut t.proxy, next);
            t.admin = admin;
            signal(&old, libc::SIGTERM);
            wait_exit(&mut old)?;
            stale = stale_now(fab, t.admin);
        }
        "region-drop" => {
            // Region requests leaving the proxy's node are dropped at random by an
            // nftables rule in its namespace (the kernel here has no netem, prio or tc
            // actions; the back-end side cannot be used: XDP's replies bypass netfilter).
            let port = t.nodes[0].udp.port();
            let rules = format!(
                "table ip {NFT_TABLE} {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n  udp dport {port} numgen random mod 100 < {REGION_DROP_PCT} counter drop\n }}\n}}\n"
            );
            fab.nft("proxy", &["-f", "-"], &rules)?;
            std::thread::sleep(REGION_DROP_FOR);
            stale = stale_now(fab, t.admin);
            fab.nft("proxy", &["delete", "table", "ip", NFT_TABLE], "")?;
        }
        "reload" => {
            let mut with: Vec<&Node> = t.nodes.iter().collect();
            with.push(&t.spare);
            write_config(a, &t.config, t.listen, &with)?;
            signal(&t.proxy, libc::SIGHUP);
            std::thread::sleep(RELOAD_HELD);
            stale = stale_now(fab, t.admin);
            let without: Vec<&Node> = t.nodes.iter().collect();
            write_config(a, &t.config, t.listen, &without)?;
            signal(&t.proxy, libc::SIGHUP);
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--faults: unknown fault `{other}` ({})", FAULTS.join(", ")),
            ))
        }
    }
    let fresh = time_to_fresh(fab, t.admin);
    let fresh_from_cmd = fresh_from_cmd.or_else(|| Some(repair? + fresh?));
    Ok((fresh, stale, repair, fresh_from_cmd))
}

/// The faults table (`table.txt`, `farside lab report`).
/// `faults.csv`: one row per fault.
pub fn csv(rows: &[&FaultRow]) -> io::Result<String> {
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    crate::report::csv_text(
        &[
            "fault",
            "runs",
            "started",
            "answered",
            "refused_503",
            "failed",
            "failed_connect",
            "failed_io",
            "failed_malformed",
            "failed_5xx",
            "hung",
            "inflight_at_end",
            "time_to_fresh_ms",
            "stale_at_repair",
            "repair_ms",
            "time_to_fresh_from_repair_cmd_ms",
        ],
        rows.iter().map(|r| {
            vec![
                r.fault.clone(),
                r.runs.to_string(),
                r.started.to_string(),
                r.answered.to_string(),
                r.refused_503.to_string(),
                r.failed.to_string(),
                r.failed_connect.to_string(),
                r.failed_io.to_string(),
                r.failed_malformed.to_string(),
                r.failed_5xx.to_string(),
                r.hung.to_string(),
                r.inflight_at_end.to_string(),
                opt(r.time_to_fresh_ms),
                r.stale_at_repair.to_string(),
                opt(r.repair_ms),
                opt(r.time_to_fresh_from_repair_cmd_ms),
            ]
        }),
    )
}

/// The fault table.
pub fn table(rows: &[&FaultRow]) -> String {
    let mut s = format!(
        "{:<16} {:>8} {:>9} {:>8} {:>7} {:>5} {:>9} {:>16} {:>9} {:>16}\n",
        "fault",
        "started",
        "answered",
        "refused",
        "failed",
        "hung",
        "inflight",
        "time_to_fresh_ms",
        "repair_ms",
        "fresh_from_cmd_ms"
    );
    for r in rows {
        let fresh = r
            .time_to_fresh_ms
            .map_or("never".to_string(), |v| format!("{v:.0}"));
        let repair = r.repair_ms.map_or("-".to_string(), |v| format!("{v:.0}"));
        let cmd = r
            .time_to_fresh_from_repair_cmd_ms
            .map_or("-".to_string(), |v| format!("{v:.0}"));
        s.push_str(&format!(
            "{:<16} {:>8} {:>9} {:>8} {:>7} {:>5} {:>9} {:>16} {:>9} {:>16}\n",
            r.fault,
            r.started,
            r.answered,
            r.refused_503,
            r.failed,
            r.hung,
            r.inflight_at_end,
            fresh,
            repair,
            cmd
        ));
    }
    s
}

/// Clients of the calibration run: enough to keep every worker of two back-ends busy.
const CALIBRATION_CLIENTS: usize = 32;

/// Served requests/s of a short closed-loop run without think time through the proxy.
fn capacity(fab: &Fabric, target: SocketAddr, quick: bool) -> io::Result<f64> {
    let mut l = LoadgenArgs::new(target.to_string());
    l.clients = CALIBRATION_CLIENTS;
    // The same shape as the open loop's requests: a new connection each.
    l.no_keepalive = true;
    l.keepalive = false;
    (l.warmup_s, l.duration_s) = if quick { (0.5, 1.5) } else { (1.0, 4.0) };
    l.quiet = true;
    let s = fab.loadgen(&l)?;
    if s.tps <= 0.0 {
        return Err(io::Error::other(
            "calibration served nothing; see logs/ (or give --rate)",
        ));
    }
    Ok(s.tps)
}

fn check_args(a: &FaultsArgs) -> io::Result<Vec<String>> {
    let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
    let netns = match a.hosts.as_str() {
        "loopback" => false,
        "netns" => true,
        h => return bad(format!("--hosts {h}: expected loopback or netns")),
    };
    if a.backends < 2 {
        return bad(format!("--backends {}: at least 2", a.backends));
    }
    if let Some(r) = a.rate {
        if !(r > 0.0 && r.is_finite()) {
            return bad(format!("--rate {r}: must be > 0"));
        }
    }
    if !(a.load_share > 0.0 && a.load_share <= 1.0) {
        return bad(format!("--load-share {}: must be in (0, 1]", a.load_share));
    }
    let faults: Vec<String> = if a.faults.is_empty() {
        FAULTS
            .iter()
            .filter(|f| netns || !FAULTS_NETNS_ONLY.contains(f))
            .map(|s| s.to_string())
            .collect()
    } else {
        a.faults.clone()
    };
    for f in &faults {
        if !FAULTS.contains(&f.as_str()) {
            return bad(format!(
                "--faults: unknown fault `{f}` ({})",
                FAULTS.join(", ")
            ));
        }
        if !netns && FAULTS_NETNS_ONLY.contains(&f.as_str()) {
            return bad(format!("--faults {f}: needs --hosts netns"));
        }
    }
    Ok(faults)
}

/// A running tier with its fabric: the tier's processes stop (drop) before the fabric
/// (namespaces, cgroups) is torn down.
struct Running {
    t: Tier,
    /// Offered open-loop rate, requests/s.
    rate: f64,
    fab: Fabric,
}

/// Whether `rows` meet the targets: no hung request in any fault, and after the
/// gatherd restart a fresh view within `fresh_bound_ms` of the restart command.
pub fn targets_met(rows: &[&FaultRow], fresh_bound_ms: f64) -> bool {
    rows.iter().all(|r| r.hung == 0)
        && rows
            .iter()
            .filter(|r| r.fault == "gatherd-restart")
            .all(|r| {
                r.time_to_fresh_from_repair_cmd_ms
                    .is_some_and(|v| v <= fresh_bound_ms)
            })
}

/// Build the tier (fabric, back-ends with their gatherds, the proxy) and calibrate the
/// offered rate. `notes` gets what the run should keep (capacity, sysctls).
fn start_tier(a: &FaultsArgs, logs: &Path, notes: &mut Vec<String>) -> io::Result<Running> {
    std::fs::create_dir_all(logs)?;
    let names: Vec<String> = (0..=a.backends).map(|i| format!("b{i}")).collect();
    let fab = if a.hosts == "netns" {
        use crate::fabric::netns::{NodeSpec, VirtualDc};
        let mut specs: Vec<NodeSpec> = names.iter().map(|n| NodeSpec::new(n)).collect();
        specs.push(NodeSpec::new("proxy"));
        specs.push(NodeSpec::new("client"));
        let dc = VirtualDc::create(&format!("f{}", std::process::id() % 100_000), &specs)?;
        // A closing listener's queued connections move to its SO_REUSEPORT successor
        // instead of being reset (Linux ≥ 5.14; per namespace).
        match dc.set_sysctl("proxy", "net/ipv4/tcp_migrate_req", "1") {
            Ok(()) => notes.push(
                "net.ipv4.tcp_migrate_req = 1 in the proxy node: proxy-restart hands \
                 queued connections to the successor"
                    .into(),
            ),
            Err(e) => {
                eprintln!("lab faults: warning: tcp_migrate_req not set: {e}");
                notes.push(format!("net.ipv4.tcp_migrate_req not set: {e}"));
            }
        }
        let id = dc.run_id().to_string();
        crate::fabric::procs::on_interrupt(move || {
            if let Ok(r) = crate::fabric::netns::clean_run_id(&id) {
                eprint!("{r}");
            }
        });
        Fabric::Netns(Box::new(dc))
    } else {
        Fabric::Loopback
    };
    let mut nodes = Vec::new();
    for n in &names {
        nodes.push(start_node(&fab, logs, n, a.backend_workers)?);
    }
    let spare = nodes.pop().expect("backends + 1 nodes");
    let listen = fab.tcp_addr("proxy", NETNS_PROXY_PORT)?;
    let admin = fab.tcp_addr("proxy", NETNS_ADMIN_PORT)?;
    let config = logs
        .parent()
        .map_or_else(|| a.out.clone(), Path::to_path_buf)
        .join("proxy.toml");
    write_config(a, &config, listen, &nodes.iter().collect::<Vec<_>>())?;
    let mut proxy = start_proxy(&fab, logs, &config, admin, "proxy")?;
    fab.wait_port(&mut proxy, listen)?;
    let t = Tier {
        logs: logs.to_path_buf(),
        proxy_node_admin: NETNS_ADMIN_PORT,
        nodes,
        spare,
        config,
        listen,
        proxy,
        admin,
        workers: a.backend_workers,
        generation: 0,
    };
    if time_to_fresh(&fab, t.admin).is_none() {
        return Err(io::Error::other(
            "the proxy's view of the back-ends never became fresh; see logs/",
        ));
    }
    let rate = match a.rate {
        Some(r) => r,
        None => {
            let c = capacity(&fab, listen, a.quick)?;
            let line = format!(
                "capacity {c:.0} requests/s (closed loop, {CALIBRATION_CLIENTS} clients); \
                 offered {:.0}/s (--load-share {})",
                c * a.load_share,
                a.load_share
            );
            eprintln!("lab faults: {line}");
            notes.push(line);
            c * a.load_share
        }
    };
    Ok(Running { t, rate, fab })
}

/// Run `farside lab faults`.
pub fn run(a: FaultsArgs) -> io::Result<()> {
    let faults = check_args(&a)?;
    let phase_s = if a.quick { PHASE_S_QUICK } else { PHASE_S_FULL };
    let fresh_bound_ms = 2 * a.stale_after_ms;
    let dir = a.resume.clone().unwrap_or_else(|| a.out.clone());
    let mut meta = crate::summary::Summary::new("faults", &a.hosts, a.quick);
    crate::sweep::fill_host_metadata(&mut meta);
    meta.params = serde_json::json!({
        "faults": faults,
        "rate": a.rate,
        "load_share": a.load_share,
        "backends": a.backends,
        "backend_workers": a.backend_workers,
        "stale_after_ms": a.stale_after_ms,
        "limit": a.limit,
        "metric": "backlog",
        "timeout_ms": a.timeout_ms,
        "phase_s": phase_s,
        "fresh_bound_ms": fresh_bound_ms,
        "fresh_poll_ms": FRESH_POLL.as_millis() as u64,
    });
    let mut sweep = crate::sweep::Sweep::<Faults>::start(&dir, meta, a.resume.is_some())?;
    let logs = dir.join("logs");
    let fault_at = Duration::from_secs_f64(phase_s / 8.0);
    let mut running: Option<Running> = None;
    let mut notes = Vec::new();
    let result = sweep.run(
        &faults,
        1,
        phase_s + 1.0,
        |f: &String| f.clone(),
        |f, _| {
            if running.is_none() {
                running = Some(start_tier(&a, &logs, &mut notes)?);
            }
            let r = running.as_mut().expect("started above");
            let mut l = LoadgenArgs::new(r.t.listen.to_string());
            l.rate = Some(r.rate);
            l.duration_s = phase_s;
            l.warmup_s = 0.0;
            l.timeout_ms = a.timeout_ms;
            l.quiet = true;
            let (fab, t) = (&r.fab, &mut r.t);
            let (summary, fresh) = std::thread::scope(|sc| {
                let load = sc.spawn(|| fab.loadgen(&l));
                std::thread::sleep(fault_at);
                let fresh = inject(&a, fab, t, f);
                let summary = load
                    .join()
                    .map_err(|_| io::Error::other("loadgen thread panicked"));
                (summary, fresh)
            });
            Ok(FaultRow::new(f, &summary??, fresh?))
        },
    );
    drop(running);
    for n in notes {
        sweep.note(n)?;
    }
    result?;
    let s = sweep.finish()?;
    let rows: Vec<&FaultRow> = s.points.iter().collect();
    if !targets_met(&rows, fresh_bound_ms as f64) {
        eprintln!(
            "lab faults: targets NOT met (hung > 0, or a slow fresh view after the gatherd restart)"
        );
    }
    Ok(())
}

/// `lab faults` as the sweep runner and the report shell see it.
pub struct Faults;

impl crate::experiment::Experiment for Faults {
    const NAME: &'static str = "faults";
    type Args = FaultsArgs;
    type Point = FaultRow;

    fn run(args: FaultsArgs) -> io::Result<()> {
        run(args)
    }

    fn table(s: &crate::summary::Summary<FaultRow>) -> String {
        let rows: Vec<&FaultRow> = s.points.iter().collect();
        if rows.is_empty() {
            return String::new();
        }
        use std::fmt::Write as _;
        let mut out = table(&rows);
        if let Some(bound) = s.params.get("fresh_bound_ms").and_then(|v| v.as_f64()) {
            let met = targets_met(&rows, bound);
            let _ = writeln!(
                out,
                "targets (no hung request; fresh view <= {bound:.0} ms after the gatherd \
                 restart command): {}",
                if met { "met" } else { "NOT met" }
            );
        }
        out.push('\n');
        out
    }

    fn files(s: &crate::summary::Summary<FaultRow>) -> io::Result<Vec<(String, String)>> {
        let rows: Vec<&FaultRow> = s.points.iter().collect();
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![
            ("faults.csv".to_string(), csv(&rows)?),
            (
                "table.txt".to_string(),
                crate::report::table_text::<Faults>(s),
            ),
        ])
    }

    fn figures(s: &crate::summary::Summary<FaultRow>) -> Vec<crate::experiment::Figure> {
        let _ = s;
        Vec::new()
    }

    fn html(s: &crate::summary::Summary<FaultRow>) -> String {
        let rows: Vec<&FaultRow> = s.points.iter().collect();
        if rows.is_empty() {
            return String::new();
        }
        format!(
            "<h2>Faults</h2>\n<pre>{}</pre>\n",
            crate::svg::escape(&table(&rows))
        )
    }
}

impl crate::experiment::LabPoint for FaultRow {
    type Extra = crate::experiment::NoExtra;

    fn take_extra(&mut self) -> crate::experiment::NoExtra {
        crate::experiment::NoExtra {}
    }

    fn put_extra(&mut self, _: crate::experiment::NoExtra) {}

    fn combine(runs: &[FaultRow]) -> FaultRow {
        FaultRow::combine(runs)
    }

    fn progress_line(&self) -> String {
        format!(
            "answered={} refused={} failed={} hung={} fresh after {}",
            self.answered,
            self.refused_503,
            self.failed,
            self.hung,
            self.time_to_fresh_ms
                .map_or("never".to_string(), |v| format!("{v:.0} ms"))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_view_needs_every_backend_fresh() {
        let m = "farside_backend_load{backend=\"a\",site=\"\",metric=\"backlog\"} 0\n\
                 farside_backend_load{backend=\"b\",site=\"\",metric=\"backlog\"} 3\n";
        assert!(view_fresh(m));
        assert!(!view_fresh(&format!(
            "{m}farside_backend_load{{backend=\"c\",site=\"\",metric=\"backlog\"}} -1\n"
        )));
        assert!(!view_fresh("farside_requests_total 3\n"));
    }

    #[test]
    fn bad_arguments_are_refused_with_the_flag_named() {
        let mut a = FaultsArgs {
            out: "x".into(),
            quick: true,
            hosts: "netns".into(),
            rate: Some(10.0),
            load_share: 0.7,
            backends: 2,
            backend_workers: 2,
            stale_after_ms: 100,
            limit: 4,
            timeout_ms: 1000,
            faults: Vec::new(),
            resume: None,
        };
        assert_eq!(check_args(&a).unwrap().len(), FAULTS.len());
        a.hosts = "moon".into();
        assert!(check_args(&a).unwrap_err().to_string().contains("--hosts"));
        a.hosts = "loopback".into();
        assert_eq!(check_args(&a).unwrap().len(), FAULTS.len() - 1);
        a.faults = vec!["region-drop".into()];
        assert!(check_args(&a).unwrap_err().to_string().contains("netns"));
        a.load_share = 0.0;
        assert!(check_args(&a)
            .unwrap_err()
            .to_string()
            .contains("--load-share"));
        a.load_share = 0.7;
        a.faults = vec!["meteor".into()];
        assert!(check_args(&a).unwrap_err().to_string().contains("meteor"));
    }

    #[test]
    fn fault_rows_render_a_table_csv_and_the_targets_line() {
        let row = |fault: &str, hung: u64, cmd: Option<f64>| FaultRow {
            fault: fault.into(),
            started: 100,
            answered: 90,
            refused_503: 10,
            failed: 0,
            failed_connect: 0,
            failed_io: 0,
            failed_malformed: 0,
            failed_5xx: 0,
            hung,
            inflight_at_end: 0,
            time_to_fresh_ms: Some(3.0),
            stale_at_repair: fault == "gatherd-restart",
            repair_ms: cmd.map(|v| v - 3.0),
            time_to_fresh_from_repair_cmd_ms: cmd,
            runs: 1,
        };
        let mut s = crate::summary::Summary::new("faults", "loopback", true);
        s.params = serde_json::json!({ "fresh_bound_ms": 200 });
        s.push(row("gatherd-restart", 0, Some(150.0)));
        s.push(row("backend-kill", 0, None));
        let text = crate::report::table_text::<Faults>(&s);
        assert!(
            text.contains("gatherd-restart") && text.contains("backend-kill"),
            "{text}"
        );
        assert!(text.contains("): met"), "{text}");
        // The rows survive the trip through JSON.
        let back: crate::summary::Summary<FaultRow> =
            crate::summary::Summary::from_json(&s.to_json_pretty()).unwrap();
        assert_eq!(back.points, s.points);
        s.push(row("gatherd-restart", 0, Some(250.0)));
        assert!(crate::report::table_text::<Faults>(&s).contains("NOT met"));
        let combined =
            FaultRow::combine(&[row("backend-stop", 1, None), row("backend-stop", 0, None)]);
        assert_eq!(
            (combined.started, combined.hung, combined.runs),
            (200, 1, 2)
        );
        let dir =
            std::env::temp_dir().join(format!("farside-report-faults-{}", std::process::id()));
        let files = crate::report::write_all::<Faults>(&s, &dir).unwrap();
        assert!(files.iter().any(|f| f.ends_with("faults.csv")));
        assert!(std::fs::read_to_string(dir.join("report.html"))
            .unwrap()
            .contains("<h2>Faults</h2>"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
