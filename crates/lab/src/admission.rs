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

use crate::nginx::{self, Nginx, NginxConfig};
use crate::procs::Child;
use crate::report;
use crate::summary::{Point, SecondPoint, Summary};
use farside_loadgen::{LoadgenArgs, PathMode, TraceKind};
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendServer {
    /// farside's own test server (bounded workers, per-request CPU cost).
    Farside,
    /// Real nginx from the system.
    Nginx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Hosts {
    /// Processes on 127.0.0.1 ports; no privileges needed.
    Loopback,
    /// One network namespace per node (root).
    Netns,
}

#[derive(Debug, Clone, clap::Args)]
pub struct AdmissionArgs {
    /// Where the nodes run.
    #[arg(long, value_enum, default_value_t = Hosts::Loopback)]
    pub hosts: Hosts,
    /// Reduced sweep for demos and CI (3 client counts, short points; a few minutes).
    #[arg(long)]
    pub quick: bool,
    /// Output directory for summary.json, CSV, plots and report.html.
    #[arg(long, default_value = "out/admission")]
    pub out: PathBuf,
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
    /// Measured seconds per point (default 20; quick: 6).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Warm-up seconds per point, not measured (default 2; quick: 1).
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
    /// Load limit per back-end in the metric's unit (default: 2 connections waiting for a
    /// worker). A tight limit keeps the queue in front of the workers short, so the
    /// response time depends on how fresh the proxy's view is: measured across
    /// namespaces, limit 2 gave 92–93% below no-ac and one-sided 3–13% ahead of tcp, limit
    /// 8 gave 89% and 2–4% (docs/RESULTS.md).
    #[arg(long, default_value_t = 2)]
    pub limit: u64,
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
    #[arg(long, default_value_t = -20, allow_negative_numbers = true)]
    pub control_nice: i32,
    /// Proxy worker threads.
    #[arg(long, default_value_t = 1)]
    pub proxy_workers: usize,
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
    /// Proxy keeps idle upstream connections (default: a new upstream connection per
    /// request, as the paper's Apache proxy did, so a back-end's connection count equals
    /// the requests it holds).
    #[arg(long)]
    pub upstream_keepalive: bool,
    /// Do not pin tiers to CPUs. By default, with 2+ CPUs, back-end nodes (web server and
    /// gatherer) run on all CPUs but the first and the proxy and clients on the first, so
    /// the back-end tier can be saturated while the front-end is not, as on separate
    /// machines.
    #[arg(long)]
    pub no_pin: bool,
    /// Run every point this many times and report means and standard deviations
    /// (`runs`, `avg_ms_sd`, `tps_sd` in summary.json).
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

struct Run {
    dir: PathBuf,
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

fn start_tier(a: &AdmissionArgs, run: &Run, system: &str, fabric: &Fabric) -> io::Result<Tier> {
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
    if !a.upstream_keepalive {
        args.extend(["--pool-idle".into(), "0".into()]);
    }
    for s in &specs {
        args.push("--backend".into());
        args.push(s.clone());
    }
    let mut admin_addr = None;
    if system != "no-ac" {
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
            a.limit.to_string(),
        ]);
    }
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

fn point(system: &str, transport: &str, s: &farside_loadgen::Summary) -> Point {
    Point {
        system: system.into(),
        trace: s.trace.clone(),
        clients: s.clients as u64,
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
    }
}

fn transport_of(system: &str, netns: bool) -> &'static str {
    match (system, netns) {
        ("tcp-ac", _) => "tcp",
        ("onesided-ac", false) => "shm",
        ("onesided-ac", true) => "udp-xdp",
        _ => "none",
    }
}

pub fn run(a: AdmissionArgs) -> io::Result<()> {
    if a.hosts == Hosts::Netns {
        crate::netns::check_root(unsafe_euid())?;
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
    let duration_s = a.duration_s.unwrap_or(if a.quick { 6.0 } else { 20.0 });
    let warmup_s = a.warmup_s.unwrap_or(if a.quick { 1.0 } else { 2.0 });

    std::fs::create_dir_all(&a.out)?;
    let run = Run {
        dir: a.out.clone(),
        logs: a.out.join("logs"),
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

    let total = a.systems.len() * a.traces.len() * clients.len();
    let est = total as f64 * a.repeat.max(1) as f64 * (duration_s + warmup_s + 0.5);
    eprintln!(
        "lab admission: {} system(s) x {} trace(s) x {} client count(s) = {total} points, about {:.0} s; output in {}",
        a.systems.len(),
        a.traces.len(),
        clients.len(),
        est,
        run.dir.display()
    );
    let t0 = Instant::now();
    let netns = a.hosts == Hosts::Netns;
    let mut summary = Summary::new(
        "admission",
        if netns { "netns" } else { "loopback" },
        a.quick,
    );
    summary.params = serde_json::json!({
        "backends": a.backends,
        "backend_server": format!("{:?}", a.backend_server).to_lowercase(),
        "backend_workers": a.backend_workers,
        "backend_cpu_us": a.backend_cpu_us,
        "metric": a.metric,
        "limit": a.limit,
        "monitor_period_us": a.monitor_period_us,
        "gather_period_us": a.gather_period_us,
        "control_nice": a.control_nice,
        "proxy_workers": a.proxy_workers,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "think_ms": a.think_ms,
        "reject_think_ms": a.reject_think_ms,
        "qos_ms": a.qos_ms,
        "keepalive": !a.no_keepalive,
        "repeat": a.repeat,
        "upstream_keepalive": a.upstream_keepalive,
        "pinned": !a.no_pin,
        "background_load": a.background_load,
        "clients": clients,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    });
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
    let mut done = 0;
    for system in &a.systems {
        let mut tier = start_tier(&a, &run, system, &fabric)?;
        let _busy = match &fabric {
            Fabric::Netns(dc) if a.background_load > 0 => (0..a.backends)
                .map(|i| dc.start_cpu_load(&format!("b{i}"), a.background_load))
                .collect::<io::Result<Vec<_>>>()?,
            _ => Vec::new(),
        };
        for trace in &a.traces {
            for &n in &clients {
                let l = loadgen_args(&a, tier.proxy_addr, trace, n, duration_s, warmup_s)?;
                let mut runs = Vec::with_capacity(a.repeat as usize);
                for r in 0..a.repeat.max(1) {
                    let before = MonitorScrape::take(&fabric, &tier);
                    let s = fabric.run_clients(&l, pl.front.as_deref())?;
                    tier.proxy.check_alive()?;
                    let mut p = point(system, transport_of(system, netns), &s);
                    if let (Some(b), Some(a)) = (before, MonitorScrape::take(&fabric, &tier)) {
                        a.fill(&b, &mut p);
                    }
                    let monitor = match (p.monitor_read_p99_us, p.update_gap_p99_ms) {
                        (Some(r), Some(g)) => format!(" read-p99={r:.0}us gap-p99={g:.1}ms"),
                        _ => String::new(),
                    };
                    let rep = if a.repeat > 1 {
                        format!(" run {}/{}", r + 1, a.repeat)
                    } else {
                        String::new()
                    };
                    eprintln!(
                        "[{}/{total} {:>4.0}s] {system:<12} {trace:<8} clients={n:<4}{rep} avg={:>8.1} ms p99={:>8.1} ms tps={:>7.1} drop={:>5.1}% slow={:>5.1}%{monitor}",
                        done + 1,
                        t0.elapsed().as_secs_f64(),
                        s.avg_ms,
                        s.p99_ms,
                        s.tps,
                        100.0 * s.drop_rate,
                        100.0 * s.slow_rate
                    );
                    runs.push(p);
                }
                done += 1;
                summary.push(Point::combine(&runs));
            }
        }
        drop(tier);
    }
    summary.duration_s = t0.elapsed().as_secs_f64();
    let mut out = io::stdout();
    report::print_table(&summary, &mut out)?;
    let files = report::write_all(&summary, &run.dir)?;
    eprintln!(
        "lab admission: wrote {} files to {} (open report.html)",
        files.len(),
        run.dir.display()
    );
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
