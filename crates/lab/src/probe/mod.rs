//! `farside lab probe`: the papers' micro-benchmark (seed 000 Fig. 4, seed 001 Fig. 5–6).
//! Latency of reading a back-end's region through each transport while the back-end's
//! CPUs are busy with a rising number of background processes ("emulated load").
//!
//! The back-end is a `farside gatherd` process serving the region over `shm`, `tcp`
//! (two-sided: its own thread answers) and `udp` (user space; or in the kernel by XDP
//! with `--hosts netns`). The prober reads `size` bytes at offset 0 every `interval`
//! and records each read's latency.

use crate::error::LabError;
use crate::fabric::flags::Hosts;
use crate::fabric::flags::SweepFlags;
use crate::fabric::procs::Child;
use crate::summary::Summary;
use crate::sweep::Sweep;

pub mod point;

pub use point::ProbePoint;

/// `lab probe` as the sweep runner and the report shell see it.
pub struct Probe;

impl crate::experiment::Experiment for Probe {
    const NAME: &'static str = "probe";
    type Args = ProbeArgs;
    type Point = ProbePoint;

    fn run(args: ProbeArgs) -> io::Result<()> {
        run(args)
    }

    fn table(s: &Summary<ProbePoint>) -> String {
        point::table(s)
    }

    fn files(s: &Summary<ProbePoint>) -> io::Result<Vec<(String, String)>> {
        if s.points.is_empty() {
            return Ok(Vec::new());
        }
        let points: Vec<&ProbePoint> = s.points.iter().collect();
        Ok(vec![("probe.csv".to_string(), point::csv(&points)?)])
    }

    fn figures(s: &Summary<ProbePoint>) -> Vec<crate::experiment::Figure> {
        point::figures(s)
    }

    fn html(s: &Summary<ProbePoint>) -> String {
        point::html(s)
    }
}
use farside_rmem::{connect, ClientOptions, Endpoint, RemoteMemory, RmemError};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct ProbeArgs {
    /// Where the nodes run (netns: back-end in its own namespace and cgroup, XDP).
    #[arg(long, value_enum, default_value_t = Hosts::Loopback)]
    pub hosts: Hosts,
    #[command(flatten)]
    #[serde(flatten)]
    pub sweep: SweepFlags,
    /// Output directory.
    #[arg(long, default_value = "out/probe")]
    #[serde(skip)]
    pub out: PathBuf,
    /// Transports to measure: shm, tcp, udp (user space), xdp (netns only), icmp (netns
    /// only: the kernel's ICMP echo over the same path and steering, answered by the
    /// back-end node's kernel: the floor any one-sided read stands on). Default
    /// shm,tcp,udp; with --hosts netns icmp,shm,tcp,udp,xdp (the papers' central
    /// comparison, beside its floor measured in the same run).
    #[arg(long, value_delimiter = ',')]
    pub transports: Vec<String>,
    /// Background load levels: number of busy-looping processes on the back-end.
    /// Default 0,1,2,4 (quick: 0,2,4).
    #[arg(long, value_delimiter = ',')]
    pub loads: Vec<u64>,
    /// Read sizes in bytes (multiples of 8, at most 4096). Default 8,64,512,4096
    /// (quick: 8,512,4096).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<u64>,
    /// Reads per point (default 5000; quick: 1000).
    #[arg(long)]
    pub samples: Option<u64>,
    /// Pause between reads, µs (the monitor's G).
    #[arg(long, default_value_t = 200)]
    pub interval_us: u64,
    /// After the latency points, flood each udp transport (udp, xdp) for this many
    /// seconds from the front node and report the replies per second one back-end
    /// sustains (--hosts netns; 0 = skip).
    #[arg(long, default_value_t = 3.0)]
    pub flood_s: f64,
    /// Timeout of one read, ms. A timed-out read counts in `timeouts` and, as taking the
    /// whole timeout, in the percentiles (a lost read is never left out of them).
    #[arg(long, default_value_t = 200)]
    pub timeout_ms: u64,
    /// The prober polls for each reply for up to this many µs before sleeping, as an
    /// RDMA reader polls its completion queue, so that its own wake-up is not part of the
    /// round trip (every transport alike; 0 = sleep at once). Default 200.
    #[arg(long, default_value_t = 200)]
    pub spin_us: u64,
    /// Measure every point this many times; the table has means and the plots error bars
    /// (± 1 sd of p50 and p99 across runs).
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
}

/// The transports measured when `--transports` is not given.
pub fn default_transports(hosts: Hosts) -> Vec<String> {
    let list: &[&str] = match hosts {
        Hosts::Loopback => &["shm", "tcp", "udp"],
        Hosts::Netns => &["icmp", "shm", "tcp", "udp", "xdp"],
    };
    list.iter().map(|t| t.to_string()).collect()
}

/// Latency statistics of one point, µs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Latency {
    pub samples: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub timeouts: u64,
}

/// Quantile of sorted values (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

pub fn latency_of(mut lat_us: Vec<f64>, timeouts: u64) -> Latency {
    lat_us.sort_by(|a, b| a.total_cmp(b));
    Latency {
        samples: lat_us.len() as u64,
        p50_us: quantile(&lat_us, 0.50),
        p99_us: quantile(&lat_us, 0.99),
        p999_us: quantile(&lat_us, 0.999),
        max_us: lat_us.last().copied().unwrap_or(0.0),
        timeouts,
    }
}

/// Read `size` bytes `samples` times, pausing `interval` between reads. A read that times
/// out is counted in `timeouts` and enters the percentiles as `timeout`.
pub fn measure(
    c: &mut dyn RemoteMemory,
    size: usize,
    samples: u64,
    interval: Duration,
    timeout: Duration,
) -> io::Result<Latency> {
    let mut buf = vec![0u8; size];
    let transport = c.transport();
    measure_with(
        transport,
        || c.read(0, &mut buf),
        size,
        samples,
        interval,
        timeout,
    )
}

/// The loop of [`measure`] around any round trip `op` (a region read, or the kernel's
/// echo): `samples` times, paced by `interval`; a timeout counts in `timeouts` and enters
/// the percentiles as `timeout`.
pub fn measure_with(
    what: &str,
    mut op: impl FnMut() -> Result<(), RmemError>,
    size: usize,
    samples: u64,
    interval: Duration,
    timeout: Duration,
) -> io::Result<Latency> {
    let mut lat = Vec::with_capacity(samples as usize);
    let mut timeouts = 0;
    let mut pacer = farside_rt::Pacer::new(interval);
    for _ in 0..samples {
        pacer.wait();
        let t0 = Instant::now();
        match op() {
            Ok(()) => lat.push(t0.elapsed().as_nanos() as f64 / 1000.0),
            Err(RmemError::Timeout) => {
                timeouts += 1;
                lat.push(timeout.as_nanos() as f64 / 1000.0);
            }
            Err(e) => {
                return Err(LabError::Rmem {
                    at: format!("{what} read of {size} B"),
                    error: e,
                }
                .into())
            }
        }
    }
    Ok(latency_of(lat, timeouts))
}

/// Busy-looping processes that load the CPUs; stopped when dropped (the children stop
/// with their handles).
pub struct CpuLoad(#[allow(dead_code)] Vec<Child>);

impl CpuLoad {
    pub fn start(n: u64, logs: &std::path::Path) -> io::Result<CpuLoad> {
        let mut v = Vec::new();
        for i in 0..n {
            let args = vec!["-c".to_string(), "while :; do :; done".to_string()];
            v.push(Child::spawn(
                &format!("busy{i}"),
                std::path::Path::new("/bin/sh"),
                &args,
                logs,
            )?);
        }
        Ok(CpuLoad(v))
    }
}

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// One point of the probe sweep: its key in `points.jsonl`.
#[derive(Debug, Clone, serde::Serialize)]
struct Key {
    transport: String,
    background_load: u64,
    size_bytes: u64,
}

fn label(k: &Key) -> String {
    format!(
        "{:<4} load={} size={:<5}",
        k.transport, k.background_load, k.size_bytes
    )
}

fn probe_point(k: &Key, l: &Latency) -> ProbePoint {
    ProbePoint {
        transport: k.transport.clone(),
        background_load: k.background_load,
        size_bytes: k.size_bytes,
        samples: l.samples,
        p50_us: l.p50_us,
        p99_us: l.p99_us,
        p999_us: l.p999_us,
        max_us: l.max_us,
        timeouts: l.timeouts,
        runs: 1,
        p50_us_sd: 0.0,
        p99_us_sd: 0.0,
    }
}

pub fn run(mut a: ProbeArgs) -> io::Result<()> {
    let euid = {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() }
    };
    if a.hosts == Hosts::Netns {
        crate::fabric::netns::check_root(euid)?;
    }
    if a.transports.is_empty() {
        a.transports = default_transports(a.hosts);
    }
    let loads = if a.loads.is_empty() {
        if a.sweep.quick {
            vec![0, 2, 4]
        } else {
            vec![0, 1, 2, 4]
        }
    } else {
        a.loads.clone()
    };
    let sizes = if a.sizes.is_empty() {
        if a.sweep.quick {
            vec![8, 512, 4096]
        } else {
            vec![8, 64, 512, 4096]
        }
    } else {
        a.sizes.clone()
    };
    if let Some(s) = sizes
        .iter()
        .find(|&&s| s == 0 || s % 8 != 0 || s > farside_region::REGION_BYTES as u64)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--sizes: {s} is not a multiple of 8 in 8..=4096"),
        ));
    }
    for t in &a.transports {
        match t.as_str() {
            "shm" | "tcp" | "udp" => {}
            "xdp" | "icmp" if a.hosts == Hosts::Netns => {}
            "xdp" | "icmp" => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("--transports {t} needs --hosts netns (root)"),
                ))
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("--transports: unknown `{t}` (shm, tcp, udp, xdp, icmp)"),
                ))
            }
        }
    }
    let samples = a.samples.unwrap_or(if a.sweep.quick { 1000 } else { 5000 });
    let dir = a.sweep.dir(&a.out);
    let mut meta = Summary::new(
        "probe",
        match a.hosts {
            Hosts::Loopback => "loopback",
            Hosts::Netns => "netns",
        },
        a.sweep.quick,
    );
    crate::sweep::fill_host_metadata(&mut meta);
    let mut eff = a.clone();
    eff.loads = loads.clone();
    eff.sizes = sizes.clone();
    eff.samples = Some(samples);
    meta.params = serde_json::to_value(&eff).map_err(io::Error::other)?;
    if a.hosts == Hosts::Netns {
        if let Some(m) = meta.params.as_object_mut() {
            m.insert(
                "xdp_mode".into(),
                "generic (runs in the back-end's softirq after RPS)".into(),
            );
        }
    }
    let sweep = Sweep::<Probe>::start(&dir, meta, a.sweep.resume.is_some())?;
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    if a.hosts == Hosts::Netns {
        return run_netns(&a, sweep, &loads, &sizes, samples, &logs);
    }
    let shm = PathBuf::from(format!(
        "/dev/shm/farside-probe-{}.region",
        std::process::id()
    ));
    let tcp = SocketAddr::new(LOCALHOST, crate::nginx::free_port(LOCALHOST)?);
    let udp = {
        let s = std::net::UdpSocket::bind((LOCALHOST, 0))?;
        s.local_addr()?
    };
    let rkeys = crate::fabric::keys::RmemLabKeys::generate()?;
    let mut args: Vec<String> = vec![
        "gatherd".into(),
        "--shm".into(),
        shm.display().to_string(),
        "--tcp-listen".into(),
        tcp.to_string(),
        "--udp-listen".into(),
        udp.to_string(),
    ];
    args.extend(rkeys.gatherd_args());
    let mut g = Child::farside("probe-gatherd", &args, &logs, None)?;
    g.wait_port(tcp)?;
    g.wait_file(&shm)?;
    let opts = ClientOptions {
        timeout: Duration::from_millis(a.timeout_ms),
        spin: Duration::from_micros(a.spin_us),
        key: Some(rkeys.reader()?),
    };
    let mut keys = Vec::new();
    for &load in &loads {
        for t in &a.transports {
            for &size in &sizes {
                keys.push(Key {
                    transport: t.clone(),
                    background_load: load,
                    size_bytes: size,
                });
            }
        }
    }
    let mut sweep = sweep;
    let est = samples as f64 * a.interval_us as f64 / 1e6 + 0.2;
    let mut busy: Option<(u64, CpuLoad)> = None;
    sweep.run(&keys, a.repeat, est, label, |k, _| {
        if busy.as_ref().map(|b| b.0) != Some(k.background_load) {
            busy = None;
            busy = Some((k.background_load, CpuLoad::start(k.background_load, &logs)?));
        }
        let ep = match k.transport.as_str() {
            "shm" => Endpoint::Shm(shm.clone()),
            "tcp" => Endpoint::Tcp(tcp),
            _ => Endpoint::Udp(udp),
        };
        let mut c = connect(&ep, &opts).map_err(|error| LabError::Rmem {
            at: ep.to_string(),
            error,
        })?;
        let l = measure(
            &mut *c,
            k.size_bytes as usize,
            samples,
            Duration::from_micros(a.interval_us),
            opts.timeout,
        )?;
        g.check_alive()?;
        Ok(probe_point(k, &l))
    })?;
    drop(busy);
    drop(g);
    let _ = std::fs::remove_file(&shm);
    sweep.finish()?;
    Ok(())
}

/// Ports the back-end node's gatherer serves on in the netns lab.
const NETNS_TCP_PORT: u16 = 7001;
const NETNS_UDP_PORT: u16 = 7002;

/// The back-end node's addresses and the probe's client options in the netns lab.
struct NetnsBack<'a> {
    dc: &'a crate::fabric::netns::VirtualDc,
    exe: PathBuf,
    shm: PathBuf,
    tcp: SocketAddr,
    udp: SocketAddr,
    iface: String,
    opts: ClientOptions,
    /// The run's rmem keys (every gatherd holds them; `opts` has the reader's).
    rkeys: crate::fabric::keys::RmemLabKeys,
    logs: &'a std::path::Path,
}

impl NetnsBack<'_> {
    /// Start the back-end's gatherd serving transport `t` alone and wait until one read
    /// succeeds from the front node.
    fn start_gatherd(&self, t: &str) -> io::Result<(Child, Endpoint)> {
        let mut args: Vec<String> = vec!["gatherd".into()];
        args.extend(self.rkeys.gatherd_args());
        let ep = match t {
            "shm" => {
                args.extend(["--shm".into(), self.shm.display().to_string()]);
                Endpoint::Shm(self.shm.clone())
            }
            "tcp" => {
                args.extend([
                    "--no-shm".into(),
                    "--tcp-listen".into(),
                    self.tcp.to_string(),
                ]);
                Endpoint::Tcp(self.tcp)
            }
            "udp" => {
                args.extend([
                    "--no-shm".into(),
                    "--udp-listen".into(),
                    self.udp.to_string(),
                    "--xdp-mode".into(),
                    "off".into(),
                ]);
                Endpoint::Udp(self.udp)
            }
            _ => {
                args.extend([
                    "--no-shm".into(),
                    "--udp-listen".into(),
                    self.udp.to_string(),
                ]);
                args.extend([
                    "--xdp-iface".into(),
                    self.iface.clone(),
                    "--xdp-mode".into(),
                    "generic".into(),
                ]);
                Endpoint::Udp(self.udp)
            }
        };
        let log = self.logs.join(format!("probe-gatherd-{t}.log"));
        let child = self.dc.spawn_in("back", &self.exe, &args, &log)?;
        let mut g = Child::adopt(&format!("gatherd-{t}"), child, log);
        let opts = self.opts.clone();
        let ready = self.dc.run_in_ns("front", || {
            let deadline = Instant::now() + crate::fabric::procs::READY_TIMEOUT;
            loop {
                if let Ok(mut c) = connect(&ep, &opts) {
                    if c.read(0, &mut [0u8; 8]).is_ok() {
                        return Ok(());
                    }
                }
                if Instant::now() > deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("{ep}: no answer from the back-end node"),
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        if let Err(e) = ready {
            g.check_alive()?;
            return Err(e);
        }
        if t == "xdp" {
            // gatherd answers over user-space udp before XDP is attached (verifying and
            // attaching take ~150 ms here), so a successful read does not mean XDP answers:
            // wait for the attach line, or the xdp row would measure user space.
            let deadline = Instant::now() + crate::fabric::procs::READY_TIMEOUT;
            while !xdp_attached(&std::fs::read_to_string(&g.log).unwrap_or_default()) {
                g.check_alive()?;
                if Instant::now() > deadline {
                    return Err(LabError::NotReady(format!(
                        "xdp: the gatherer did not attach XDP within {:?}:\n{}",
                        crate::fabric::procs::READY_TIMEOUT,
                        crate::fabric::procs::tail(&g.log, 10)
                    ))
                    .into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok((g, ep))
    }
}

/// Whether gatherd's log says its XDP responder is attached (the kernel answers from then
/// on).
fn xdp_attached(log: &str) -> bool {
    log.contains("XDP responder on")
}

/// One line per (load, size) measured with both: each transport's p50 as a multiple of
/// the kernel echo's (`icmp`) in the same run (the target: xdp ≤ 1.3×).
fn floor_ratios(p50s: &[(Key, f64)]) -> Vec<String> {
    let mut out = Vec::new();
    for (fk, floor) in p50s.iter().filter(|(k, _)| k.transport == "icmp") {
        let same =
            |k: &Key| k.background_load == fk.background_load && k.size_bytes == fk.size_bytes;
        let rest: Vec<String> = p50s
            .iter()
            .filter(|(k, _)| k.transport != "icmp" && same(k))
            .map(|(k, p)| format!("{} {:.2}x", k.transport, p / floor.max(f64::MIN_POSITIVE)))
            .collect();
        if !rest.is_empty() {
            out.push(format!(
                "floor: load {} size {} B: icmp echo p50 {floor:.1} µs; p50 / floor: {}",
                fk.background_load,
                fk.size_bytes,
                rest.join(", ")
            ));
        }
    }
    out
}

/// The probe across hosts: back-end node (its own CPUs, RPS steered onto them so its
/// softirq and XDP run there), front node (the prober). One gatherd per transport, so
/// each is measured alone.
fn run_netns(
    a: &ProbeArgs,
    mut sweep: Sweep<Probe>,
    loads: &[u64],
    sizes: &[u64],
    samples: u64,
    logs: &std::path::Path,
) -> io::Result<()> {
    use crate::fabric::netns::{NodeSpec, VirtualDc};
    let cpus = crate::fabric::procs::allowed_cpus();
    let (front, back) = match crate::fabric::procs::Tiers::of(&cpus) {
        Some(t) => (t.front, t.back),
        None => (cpus.clone(), cpus.clone()),
    };
    let run_id = format!("p{}", std::process::id() % 100_000);
    let dc = VirtualDc::create(
        &run_id,
        &[
            NodeSpec::new("back").pinned(Some(&back)),
            NodeSpec::new("front").pinned(Some(&front)),
        ],
    )?;
    let id = dc.run_id().to_string();
    crate::fabric::procs::on_interrupt(move || {
        if let Ok(r) = crate::fabric::netns::clean_run_id(&id) {
            eprint!("{r}");
        }
    });
    let back_ip = dc.node_ip("back");
    let rkeys = crate::fabric::keys::RmemLabKeys::generate()?;
    let reader = rkeys.reader()?;
    let nb = NetnsBack {
        dc: &dc,
        exe: std::env::current_exe()?,
        shm: PathBuf::from(format!("/dev/shm/farside-probe-{run_id}.region")),
        tcp: SocketAddr::new(IpAddr::V4(back_ip), NETNS_TCP_PORT),
        udp: SocketAddr::new(IpAddr::V4(back_ip), NETNS_UDP_PORT),
        iface: dc.veth_in_ns("back"),
        opts: ClientOptions {
            timeout: Duration::from_millis(a.timeout_ms),
            spin: Duration::from_micros(a.spin_us),
            key: Some(reader),
        },
        rkeys,
        logs,
    };
    eprintln!(
        "lab probe --hosts netns: back-end node on CPUs {back:?} (RPS there too), prober on {front:?}"
    );
    let mut keys = Vec::new();
    for t in &a.transports {
        for &load in loads {
            for &size in sizes {
                keys.push(Key {
                    transport: t.clone(),
                    background_load: load,
                    size_bytes: size,
                });
            }
        }
    }
    let est = samples as f64 * a.interval_us as f64 / 1e6 + 0.2;
    let mut gatherd: Option<(String, Child, Endpoint)> = None;
    let mut busy: Option<(u64, crate::fabric::netns::LoadHandle)> = None;
    // p50 of every (transport, load, size) measured in this run, for the floor ratios.
    let mut p50s: Vec<(Key, f64)> = Vec::new();
    sweep.run(&keys, a.repeat, est, label, |k, _| {
        if busy.as_ref().map(|b| b.0) != Some(k.background_load) {
            busy = None;
            busy = Some((
                k.background_load,
                dc.start_cpu_load("back", k.background_load as usize)?,
            ));
        }
        let f = front.clone();
        let opts = nb.opts.clone();
        if k.transport == "icmp" {
            // The floor: the back-end node's kernel answers; no gatherd is involved.
            gatherd = None;
            let l = dc.run_in_ns("front", || {
                crate::fabric::procs::pin_current_thread(&f)?;
                let mut e = crate::echo::IcmpEcho::new(back_ip, opts.spin, opts.timeout)?;
                measure_with(
                    "icmp",
                    || e.echo(k.size_bytes as usize),
                    k.size_bytes as usize,
                    samples,
                    Duration::from_micros(a.interval_us),
                    opts.timeout,
                )
            })?;
            p50s.push((k.clone(), l.p50_us));
            return Ok(probe_point(k, &l));
        }
        if gatherd.as_ref().map(|g| g.0.as_str()) != Some(k.transport.as_str()) {
            gatherd = None;
            let (g, ep) = nb.start_gatherd(&k.transport)?;
            gatherd = Some((k.transport.clone(), g, ep));
        }
        let (_, g, ep) = gatherd.as_mut().expect("started above");
        let l = dc.run_in_ns("front", || {
            crate::fabric::procs::pin_current_thread(&f)?;
            let mut c = connect(ep, &opts).map_err(|error| LabError::Rmem {
                at: ep.to_string(),
                error,
            })?;
            measure(
                &mut *c,
                k.size_bytes as usize,
                samples,
                Duration::from_micros(a.interval_us),
                opts.timeout,
            )
        })?;
        g.check_alive()?;
        p50s.push((k.clone(), l.p50_us));
        Ok(probe_point(k, &l))
    })?;
    for line in floor_ratios(&p50s) {
        eprintln!("{line}");
        sweep.note(line)?;
    }
    drop(busy);
    drop(gatherd);
    if a.flood_s > 0.0 {
        for t in a.transports.iter().filter(|t| *t == "udp" || *t == "xdp") {
            let (g, _) = nb.start_gatherd(t)?;
            for load in [0u64, *loads.iter().max().unwrap_or(&0)] {
                let _busy = dc.start_cpu_load("back", load as usize)?;
                let f = front.clone();
                // The back-end's own UDP drops (the user-space responder's socket).
                let back_udp = || dc.run_in_ns("back", crate::flood::udp_counters);
                let b0 = back_udp()?;
                let r = dc.run_in_ns("front", || {
                    crate::fabric::procs::pin_current_thread(&f)?;
                    crate::flood::flood(nb.udp, reader, 64, a.flood_s)
                })?;
                let b1 = back_udp()?;
                let lost = r.sent.saturating_sub(r.replies);
                let line = format!(
                    "flood {t} (64 B READs, background load {load}): {:.0} replies/s of {:.0} sent/s ({:.1}% answered); \
                     {lost} unanswered: {} at the back-end's socket, {} in CPU input backlogs, {} at the prober's socket, \
                     {} not sent, {} elsewhere",
                    r.replies_per_s(),
                    r.sent as f64 / r.seconds,
                    100.0 * r.replies as f64 / r.sent.max(1) as f64,
                    b1.rcvbuf_errors.saturating_sub(b0.rcvbuf_errors),
                    r.backlog_drops,
                    r.prober_rcvbuf_drops,
                    r.send_errors,
                    lost.saturating_sub(
                        b1.rcvbuf_errors.saturating_sub(b0.rcvbuf_errors)
                            + r.backlog_drops
                            + r.prober_rcvbuf_drops
                    ),
                );
                eprintln!("{line}");
                sweep.note(line)?;
            }
            drop(g);
        }
    }
    let _ = std::fs::remove_file(&nb.shm);
    drop(dc);
    sweep.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netns_default_transports_include_xdp_and_its_floor() {
        assert_eq!(
            default_transports(Hosts::Netns),
            ["icmp", "shm", "tcp", "udp", "xdp"]
        );
        assert!(!default_transports(Hosts::Loopback).contains(&"xdp".to_string()));
    }

    #[test]
    fn floor_ratios_divide_by_the_echo_of_the_same_load_and_size() {
        let k = |t: &str, load, size| Key {
            transport: t.into(),
            background_load: load,
            size_bytes: size,
        };
        let lines = floor_ratios(&[
            (k("icmp", 0, 8), 20.0),
            (k("xdp", 0, 8), 26.0),
            (k("tcp", 0, 8), 60.0),
            (k("xdp", 2, 8), 90.0),
            (k("icmp", 2, 8), 30.0),
            (k("xdp", 0, 64), 99.0),
        ]);
        assert_eq!(
            lines,
            [
                "floor: load 0 size 8 B: icmp echo p50 20.0 µs; p50 / floor: xdp 1.30x, tcp 3.00x",
                "floor: load 2 size 8 B: icmp echo p50 30.0 µs; p50 / floor: xdp 3.00x",
            ]
        );
    }

    #[test]
    fn timed_out_reads_count_in_the_percentiles_as_the_timeout() {
        // A udp "back-end" that never answers: every read times out for real.
        let silent = std::net::UdpSocket::bind((LOCALHOST, 0)).unwrap();
        let timeout = Duration::from_millis(20);
        let opts = ClientOptions {
            timeout,
            key: Some(farside_rmem::LabKeyset::generate().reader),
            ..Default::default()
        };
        let mut c = connect(&Endpoint::Udp(silent.local_addr().unwrap()), &opts).unwrap();
        let l = measure(&mut *c, 8, 3, Duration::from_micros(1), timeout).unwrap();
        assert_eq!((l.samples, l.timeouts), (3, 3));
        assert_eq!(
            (l.p50_us, l.p99_us, l.max_us),
            (20_000.0, 20_000.0, 20_000.0)
        );
    }

    #[test]
    fn xdp_counts_as_attached_only_after_gatherds_attach_line() {
        // What gatherd logs while its user-space udp server already answers, and after.
        let serving = "INFO  gatherd: node 0 every 1000 µs; shm=off tcp=off udp=10.77.0.10:7002\n";
        let attached = "INFO  gatherd: XDP responder on eth0 (generic mode), udp port 7002: reads and atomics answered in the kernel\n";
        assert!(!xdp_attached(""));
        assert!(!xdp_attached(serving));
        assert!(xdp_attached(&format!("{attached}{serving}")));
    }

    #[test]
    fn quantiles_use_nearest_rank() {
        let l = latency_of((1..=1000).map(|x| x as f64).collect(), 3);
        assert_eq!(
            (l.p50_us, l.p99_us, l.p999_us, l.max_us),
            (500.0, 990.0, 999.0, 1000.0)
        );
        assert_eq!(l.timeouts, 3);
        assert_eq!(latency_of(vec![], 0).p99_us, 0.0);
    }
}
