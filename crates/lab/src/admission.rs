//! `farside lab admission`: the admission-control experiment of seed 000 (Fig. 5, 9, 10).
//!
//! For each system (`no-ac`, `tcp-ac`, `onesided-ac`) the lab starts the back-end tier
//! (K web servers, each with a gatherer beside it), one proxy, and then drives the proxy
//! with closed-loop clients for every trace and client count of the sweep. The three
//! systems differ only in the proxy's admission control:
//!
//! | system | admission | load data from |
//! |---|---|---|
//! | `no-ac` | off | (balancing by the proxy's own in-flight counts) |
//! | `tcp-ac` | on | gatherer answers over TCP (two-sided, the paper's TCP/IP) |
//! | `onesided-ac` | on | the region read one-sidedly (`shm` here; XDP with `--hosts netns`) |
//!
//! The experiment is a set-up (back-end tier, proxy, clients) and a point function on
//! the shared runner ([`crate::sweep`]): repeats, progress, `points.jsonl`, `--resume` and
//! `farside lab report DIR` come from there. Keys are (system, limit, trace, clients).
//!
//! Defaults are chosen by rules, never by which value gave the best result:
//!
//! - **Limit**: derived from the back-end's capacity by [`LIMIT_RULE`] (printed by
//!   `--help`): `backlog`/`pending` limit = C, `conns` limit = 2 C, C the back-end's
//!   connection capacity (workers; nginx's worker_processes × worker_connections).
//!   `--limits a,b,c` sweeps it instead.
//! - **Proxy**: the product's defaults (upstream pooling on); `--proxy-arg ARG` is the
//!   explicit, recorded opt-out.
//! - **Time**: 60 s points after 10 s of warm-up; `--quick` (6 s after 1 s) is for demos
//!   and the summary says so.
//! - **Privileges**: settings that need them (`--control-nice` below 0, background load,
//!   pinning, netns isolation) are recorded in `settings` as applied or not, with a
//!   warning when not ([`privileged_settings`]).

use crate::nginx::{self, Nginx, NginxConfig};
use crate::procs::Child;
use crate::summary::{AnyPoint, Point, SecondPoint, Setting, Summary};
use crate::sweep::Sweep;
use farside_loadgen::{LoadgenArgs, PathMode, TraceKind};
use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Instant;

pub const SYSTEMS: [&str; 3] = ["no-ac", "tcp-ac", "onesided-ac"];
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
    /// Systems to compare, comma-separated.
    #[arg(
        long,
        default_value = "no-ac,tcp-ac,onesided-ac",
        value_delimiter = ','
    )]
    pub systems: Vec<String>,
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
    /// Extra argument for every proxy the lab starts, after the lab's own (repeatable;
    /// e.g. `--proxy-arg=--pool-idle=0` turns upstream pooling off). Default none: the
    /// proxy runs with its product defaults. Flags the lab sets itself (listen address,
    /// workers, monitor, back-ends, admission, metric, limit) are refused: use the lab's
    /// own flags for them. Recorded in summary.json (`params.proxy_args`).
    #[arg(long = "proxy-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub proxy_args: Vec<String>,
    /// Client think time between requests, ms.
    #[arg(long, default_value_t = 0)]
    pub think_ms: u64,
    /// Think time of a client after a 503, ms: clients back off as `Retry-After` asks
    /// instead of retrying at once (0 = retry immediately, a retry storm that loads the
    /// front-end tier rather than the back-ends).
    #[arg(long, default_value_t = 1000)]
    pub reject_think_ms: u64,
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
}

/// Proxy flags the lab sets itself, with the lab flag that controls each (`--proxy-arg`
/// may not repeat them: the proxy refuses a flag given twice).
const LAB_PROXY_FLAGS: [(&str, &str); 9] = [
    ("--listen", "(chosen by the lab)"),
    ("--workers", "--proxy-workers"),
    ("--monitor-period-us", "--monitor-period-us"),
    ("--monitor-nice", "--control-nice"),
    ("--backend", "--backends, --backend-server"),
    ("--admin-listen", "(chosen by the lab)"),
    ("--admission", "--systems"),
    ("--metric", "--metric"),
    ("--limit", "--limit, --limits"),
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

/// The rule that sets the default `--limit`, as `--help` prints it.
pub const LIMIT_RULE: &str = "\
Default admission limit (a rule on the back-end's capacity, not a tuned value):
  C = the back-end's connection capacity: --backend-workers for farside's server
      (Apache's MaxClients), worker_processes x worker_connections for nginx (1 x 1024).
  backlog, pending: limit = C  (the queue in front of the workers holds at most one
      request per worker, so a request admitted at the limit waits about one service
      time before a worker takes it)
  conns: limit = 2 C  (C connections in service plus C waiting, as above)
  cpu, pressure, runnable: no capacity rule; give --limit or --limits.
The limit used is in summary.json (`params.limits`, `params.limit_rule`).";

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

/// The default limit of [`LIMIT_RULE`] for `metric` and capacity `c`, with the rule as
/// text; an error for metrics the rule does not cover.
pub fn default_limit(metric: &str, c: u64) -> io::Result<(u64, String)> {
    match metric {
        "backlog" | "pending" => Ok((c, format!("{metric}: limit = C = {c}"))),
        "conns" => Ok((2 * c, format!("conns: limit = 2 C = {}", 2 * c))),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "--metric {metric}: no default limit (it is not a connection count, so the \
                 capacity rule does not apply); give --limit N or --limits a,b,c"
            ),
        )),
    }
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
            Setting::applied("per-node cpuset + quota"),
        );
        m.insert(
            "rps".into(),
            Setting::applied("receive softirq on each node's CPUs"),
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

/// The back-end tier and proxy of one system.
struct Tier {
    _backends: Vec<Child>,
    _nginx: Vec<Nginx>,
    _gatherers: Vec<Child>,
    proxy: Child,
    proxy_addr: SocketAddr,
    /// The proxy's admin listener (metrics), when it runs a monitor.
    admin_addr: Option<SocketAddr>,
}

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// CPUs of the front-end tier (proxy, clients) and of the back-end tier.
#[derive(Clone)]
struct Placement {
    front: Option<Vec<usize>>,
    back: Option<Vec<usize>>,
}

fn placement(a: &AdmissionArgs) -> Placement {
    let cpus = crate::procs::allowed_cpus();
    if a.no_pin || cpus.len() < 2 {
        return Placement {
            front: None,
            back: None,
        };
    }
    Placement {
        front: Some(cpus[..1].to_vec()),
        back: Some(cpus[1..].to_vec()),
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
    Netns(crate::netns::VirtualDc),
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
        match self {
            Fabric::Loopback(pl) => {
                let cpus = match role {
                    Role::Backend(_) => pl.back.as_deref(),
                    Role::Proxy => pl.front.as_deref(),
                };
                Child::farside(name, args, logs, cpus)
            }
            Fabric::Netns(dc) => {
                let log = logs.join(format!("{name}.log"));
                let c = dc.spawn_in(&Self::node(role), &std::env::current_exe()?, args, &log)?;
                Ok(Child::adopt(name, c, log))
            }
        }
    }

    /// Wait until `addr` accepts TCP connections, seen from where clients run.
    fn wait_port(&self, child: &mut Child, addr: SocketAddr) -> io::Result<()> {
        match self {
            Fabric::Loopback(_) => child.wait_port(addr),
            Fabric::Netns(dc) => {
                let deadline = Instant::now() + crate::procs::READY_TIMEOUT;
                loop {
                    child.check_alive()?;
                    let up = dc.run_in_ns("client", || {
                        Ok(std::net::TcpStream::connect_timeout(
                            &addr,
                            std::time::Duration::from_millis(100),
                        )
                        .is_ok())
                    })?;
                    if up {
                        return Ok(());
                    }
                    if Instant::now() > deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("{} did not listen on {addr}", child.name),
                        ));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        }
    }

    /// The proxy's metrics, fetched from where clients run.
    fn scrape(&self, admin: SocketAddr) -> io::Result<String> {
        match self {
            Fabric::Loopback(_) => crate::promtext::scrape(admin),
            Fabric::Netns(dc) => dc.run_in_ns("client", || crate::promtext::scrape(admin)),
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
                    crate::procs::pin_current_thread(c)?;
                }
                run()
            }),
        }
    }
}

fn start_tier(
    a: &AdmissionArgs,
    run: &Run,
    system: &str,
    limit: Option<u64>,
    fabric: &Fabric,
) -> io::Result<Tier> {
    let mut backends = Vec::new();
    let mut nginxes = Vec::new();
    let mut gatherers = Vec::new();
    let mut specs = Vec::new();
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
                    "--static-cpu-us".into(),
                    a.backend_cpu_us.to_string(),
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
                crate::netns::VETH_IN_NS.into(),
            ]);
            args.extend(["--xdp-mode".into(), "generic".into()]);
            // With XDP gatherd's default is the kernel sampler, whose record has backlog,
            // conns and a tick-sampled cpu but no pressure or pending: other metrics keep
            // the user-space sampler.
            if !matches!(a.metric.as_str(), "backlog" | "conns") {
                args.extend(["--sampler".into(), "user".into()]);
            }
        }
        let mut g = fabric.spawn(role, &format!("{system}-gatherd{i}"), &args, &run.logs)?;
        fabric.wait_port(&mut g, tcp)?;
        g.wait_file(&shm)?;
        gatherers.push(g);
        let spec = match (system, netns) {
            ("tcp-ac", _) => format!("{addr},region=tcp:{tcp}"),
            ("onesided-ac", false) => format!("{addr},region=shm:{}", shm.display()),
            ("onesided-ac", true) => format!("{addr},region=udp:{udp}"),
            _ => addr.to_string(),
        };
        specs.push(spec);
    }
    let proxy_addr = fabric.addr(Role::Proxy, NETNS_PROXY_PORT)?;
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
    for s in &specs {
        args.push("--backend".into());
        args.push(s.clone());
    }
    let mut admin_addr = None;
    if let (true, Some(limit)) = (system != "no-ac", limit) {
        // The admin listener is not subject to admission: the lab reads the monitor's
        // histograms there while the data port is rejecting.
        let admin = fabric.addr(Role::Proxy, NETNS_ADMIN_PORT)?;
        args.extend(["--admin-listen".into(), admin.to_string()]);
        admin_addr = Some(admin);
        args.extend([
            "--admission".into(),
            "--metric".into(),
            a.metric.clone(),
            "--limit".into(),
            limit.to_string(),
        ]);
    }
    // The user's own proxy arguments come last, so they override the lab's.
    args.extend(a.proxy_args.iter().cloned());
    let mut proxy = fabric.spawn(Role::Proxy, &format!("{system}-proxy"), &args, &run.logs)?;
    fabric.wait_port(&mut proxy, proxy_addr)?;
    Ok(Tier {
        _backends: backends,
        _nginx: nginxes,
        _gatherers: gatherers,
        proxy,
        proxy_addr,
        admin_addr,
    })
}

/// Histograms of the proxy's monitor at one moment; two of them bracket a point.
struct MonitorScrape {
    read: crate::promtext::Buckets,
    gap: crate::promtext::Buckets,
}

impl MonitorScrape {
    /// `None` (with a warning) when the proxy has no admin listener or does not answer:
    /// the point is still measured, only without the monitor's figures.
    fn take(fabric: &Fabric, tier: &Tier) -> Option<MonitorScrape> {
        let admin = tier.admin_addr?;
        match fabric.scrape(admin) {
            Ok(text) => Some(MonitorScrape {
                read: crate::promtext::buckets(&text, "farside_monitor_read_seconds"),
                gap: crate::promtext::buckets(&text, "farside_monitor_update_gap_seconds"),
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
    l.reject_think_ms = Some(a.reject_think_ms);
    l.qos_ms = a.qos_ms;
    l.timeout_ms = a.timeout_ms;
    l.no_keepalive = a.no_keepalive;
    l.keepalive = !a.no_keepalive;
    l.quiet = true;
    Ok(l)
}

fn point(system: &str, limit: Option<u64>, transport: &str, s: &farside_loadgen::Summary) -> Point {
    Point {
        system: system.into(),
        trace: s.trace.clone(),
        clients: s.clients as u64,
        limit,
        transport: transport.into(),
        avg_ms: s.avg_ms,
        p50_ms: s.p50_ms,
        p90_ms: s.p90_ms,
        p99_ms: s.p99_ms,
        max_ms: s.max_ms,
        tps: s.tps,
        drop_rate: s.drop_rate,
        slow_rate: s.slow_rate,
        attempts: s.attempts,
        served: s.served,
        dropped: s.dropped_503,
        failures: s.failures,
        runs: 1,
        avg_ms_sd: 0.0,
        tps_sd: 0.0,
        p99_ms_sd: 0.0,
        drop_rate_sd: 0.0,
        slow_rate_sd: 0.0,
        monitor_read_p50_us: None,
        monitor_read_p99_us: None,
        update_gap_p99_ms: None,
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
        requests: Vec::new(),
    }
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
        ("onesided-ac", false) => "shm",
        ("onesided-ac", true) => "udp-xdp",
        _ => "none",
    }
}

/// The tier serving (system, limit) and the back-ends' background load.
type Running = ((String, Option<u64>), Tier, Vec<crate::netns::LoadHandle>);

/// One point of the sweep: its key in `points.jsonl`.
#[derive(Debug, Clone, serde::Serialize)]
struct Key {
    system: String,
    trace: String,
    /// `None` for no-ac.
    limit: Option<u64>,
    clients: u64,
}

/// The sweep's keys: per system (and per limit for the admission-controlled ones),
/// per trace, per client count; one tier is started per (system, limit).
fn keys(a: &AdmissionArgs, limits: &[u64], clients: &[u64]) -> Vec<Key> {
    let mut out = Vec::new();
    for system in &a.systems {
        let ls: Vec<Option<u64>> = if system == "no-ac" {
            vec![None]
        } else {
            limits.iter().map(|&l| Some(l)).collect()
        };
        for limit in ls {
            for trace in &a.traces {
                for &c in clients {
                    out.push(Key {
                        system: system.clone(),
                        trace: trace.clone(),
                        limit,
                        clients: c,
                    });
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

pub fn run(a: AdmissionArgs) -> io::Result<()> {
    let euid = unsafe_euid();
    if a.hosts == Hosts::Netns {
        crate::netns::check_root(euid)?;
    }
    for s in &a.systems {
        if !SYSTEMS.contains(&s.as_str()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--systems: unknown system `{s}` (no-ac, tcp-ac, onesided-ac)"),
            ));
        }
    }
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
    let any_ac = a.systems.iter().any(|s| s != "no-ac");
    let (limits, rule) = if !a.limits.is_empty() {
        (a.limits.clone(), "--limits".to_string())
    } else if let Some(l) = a.limit {
        (vec![l], "--limit".to_string())
    } else if any_ac {
        let (l, rule) = default_limit(&a.metric, capacity_conns(&a))?;
        (vec![l], format!("default: {rule}"))
    } else {
        (Vec::new(), "none (no admission control)".to_string())
    };
    if limits.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--limit/--limits: a limit of 0 admits nothing; use 1 or more",
        ));
    }
    let (duration_s, warmup_s) = point_time(&a);
    let dir = a.resume.clone().unwrap_or_else(|| a.out.clone());
    let netns = a.hosts == Hosts::Netns;
    let mut meta = Summary::new(
        "admission",
        if netns { "netns" } else { "loopback" },
        a.quick,
    );
    crate::sweep::fill_host_metadata(&mut meta);
    meta.seed = Some(a.seed);
    meta.params = effective(&a, &clients, &limits, &rule, duration_s, warmup_s)?;
    meta.settings = privileged_settings(
        &a,
        euid == 0,
        nice_floor(),
        crate::procs::allowed_cpus().len(),
    );
    if a.quick {
        meta.notes.push(format!(
            "quick run: {duration_s} s points after {warmup_s} s of warm-up, for demos; not for comparison"
        ));
    }
    let mut sweep = Sweep::start(&dir, meta, a.resume.is_some())?;

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
        crate::procs::on_interrupt(move || {
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

    let pl = placement(&a);
    if let (Some(f), Some(b)) = (&pl.front, &pl.back) {
        eprintln!("lab admission: proxy and clients on CPU {f:?}, back-end nodes on CPUs {b:?} (--no-pin to share)");
    }
    let fabric = if netns {
        use crate::netns::{NodeSpec, VirtualDc};
        let list = |c: &Option<Vec<usize>>| {
            c.as_ref().map(|v| {
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
        };
        let mask = |c: &Option<Vec<usize>>| {
            c.as_ref()
                .map(|v| format!("{:x}", v.iter().fold(0u64, |m, &x| m | (1 << x))))
        };
        let node = |name: &str, c: &Option<Vec<usize>>| {
            let mut n = NodeSpec::new(name);
            if let (Some(l), Some(m)) = (list(c), mask(c)) {
                n = n.cpus(&l).rps_cpus(&m);
            }
            n
        };
        let mut nodes: Vec<NodeSpec> = (0..a.backends)
            .map(|i| node(&format!("b{i}"), &pl.back))
            .collect();
        nodes.push(node("proxy", &pl.front));
        nodes.push(node("client", &pl.front));
        let dc = VirtualDc::create(&format!("a{}", std::process::id() % 100_000), &nodes)?;
        let id = dc.run_id().to_string();
        crate::procs::on_interrupt(move || {
            if let Ok(r) = crate::netns::clean_run_id(&id) {
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
            crate::procs::pin_current_thread(f)?;
        }
        Fabric::Loopback(pl.clone())
    };

    let keys = keys(&a, &limits, &clients);
    let heaviest = clients.iter().copied().max().unwrap_or(0);
    // The running tier and its background load, for the (system, limit) it serves.
    let mut current: Option<Running> = None;
    sweep.run(
        &keys,
        a.repeat,
        duration_s + warmup_s + 0.5,
        |k| {
            let limit = k.limit.map(|l| format!(" limit={l}")).unwrap_or_default();
            format!(
                "{:<12} {:<8}{limit} clients={:<4}",
                k.system, k.trace, k.clients
            )
        },
        |k, r| {
            let want = (k.system.clone(), k.limit);
            if current.as_ref().map(|c| &c.0) != Some(&want) {
                // One tier at a time: the old one stops before the new one starts.
                current = None;
                let tier = start_tier(&a, &run, &k.system, k.limit, &fabric)?;
                let busy = match &fabric {
                    Fabric::Netns(dc) if a.background_load > 0 => (0..a.backends)
                        .map(|i| dc.start_cpu_load(&format!("b{i}"), a.background_load))
                        .collect::<io::Result<Vec<_>>>()?,
                    _ => Vec::new(),
                };
                current = Some((want, tier, busy));
            }
            let (_, tier, _) = current.as_mut().expect("tier started above");
            let mut l = loadgen_args(
                &a,
                tier.proxy_addr,
                &k.trace,
                k.clients,
                duration_s,
                warmup_s,
            )?;
            l.seed = a.seed.wrapping_add(u64::from(r));
            // Per-request records only at the heaviest load: Fig. 6 shows that one, and a
            // 60 s point at every load would keep megabytes per point.
            let requests_csv = (k.clients == heaviest).then(|| run.logs.join("requests.csv"));
            l.out = requests_csv.clone();
            let before = MonitorScrape::take(&fabric, tier);
            let s = fabric.run_clients(&l, pl.front.as_deref())?;
            tier.proxy.check_alive()?;
            let mut p = point(&k.system, k.limit, transport_of(&k.system, netns), &s);
            if let (Some(b), Some(after)) = (before, MonitorScrape::take(&fabric, tier)) {
                after.fill(&b, &mut p);
            }
            if let Some(path) = requests_csv {
                match request_samples(&path, REQUEST_SAMPLES_MAX) {
                    Ok(v) => p.requests = v,
                    Err(e) => eprintln!("lab admission: warning: no per-request samples: {e}"),
                }
                let _ = std::fs::remove_file(&path);
            }
            Ok(AnyPoint::Admission(p))
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
    fn default_limit_follows_the_capacity_rule() {
        // farside's server: C = workers.
        let a = args("");
        assert_eq!(capacity_conns(&a), 16);
        assert_eq!(default_limit("backlog", 16).unwrap().0, 16);
        assert_eq!(default_limit("pending", 16).unwrap().0, 16);
        assert_eq!(default_limit("conns", 16).unwrap().0, 32);
        assert_eq!(capacity_conns(&args("--backend-workers 40")), 40);
        // nginx: worker_processes x worker_connections.
        assert_eq!(capacity_conns(&args("--backend-server nginx")), 1024);
        // Metrics that are not connection counts have no default: a clear error.
        let e = default_limit("cpu", 16).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("give --limit N or --limits"), "{e}");
        // The rule is in --help.
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("backlog, pending: limit = C"), "{help}");
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
        let a = args("--systems no-ac,tcp-ac --traces single");
        let k = keys(&a, &[2, 8], &[4]);
        let names: Vec<(String, Option<u64>)> =
            k.iter().map(|k| (k.system.clone(), k.limit)).collect();
        assert_eq!(
            names,
            vec![
                ("no-ac".into(), None),
                ("tcp-ac".into(), Some(2)),
                ("tcp-ac".into(), Some(8))
            ]
        );
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
