//! The calibration's lab: nodes of `farside backend --coop` in the lab's network
//! namespaces at their CPU quota, the client's connections and load generators, and
//! what one phase counts over its measured window (the nodes' cgroup CPU and counters,
//! this process's CPU, the host's busy time).

use super::clocks::{cgroup_cpu_ns, host_ns, process_cpu_ns};
use farside_coop::validate::{HostPhase, LightKind, DELAY_CLIENTS};
use farside_lab::fabric::keys::LabKeys;
use farside_lab::fabric::netns::VirtualDc;
use farside_loadgen::{LoadgenArgs, PathMode, TraceKind};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

fn err(what: impl std::fmt::Display) -> String {
    format!("calibrate: {what}")
}

/// HTTP workers per node (`farside lab coop`'s).
pub(super) const LAB_WORKERS: usize = 64;
/// The lab's client timeout, ms.
const LAB_CLIENT_TIMEOUT_MS: u64 = 10_000;
/// Warm-up before each phase's measured `seconds`: a third of it, at most 1 s (the
/// clients reach a steady state in well under a second), at least 0.1 s.
pub(super) fn warmup_s(seconds: f64) -> f64 {
    (seconds / 3.0).clamp(0.1, 1.0)
}
/// Time between starting the load generators and their clock's start (thread start,
/// trace load), as the lab allows.
const LOADGEN_START: Duration = Duration::from_millis(300);
/// Share of a phase's requests that must be of the phase's class (local, remote, miss):
/// the rest are the warm-up's stragglers or a stale hint.
const PHASE_CLASS_SHARE_MIN: f64 = 0.9;
/// Time a node may take to listen.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// Time for one client read or write.
const CLIENT_IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response head a client accepts.
const HEAD_BYTES_MAX: usize = 16 * 1024;
/// The nodes' emulated disk bandwidth in the lab-shaped phases (with latency 0): no
/// disk time beyond the emulation's own overhead, so a miss costs its CPU.
pub(super) const CALIBRATION_DISK_BYTES_PER_S: u64 = 1_000_000_000_000;
/// Share of a phase's host busy time its own processes (the nodes' cgroups, this
/// process, the softirq) may leave unexplained before the calibration warns that
/// another workload ran on the host: 10 %. Idle, the host's other busy time (kernel
/// threads, timers, the measurement lock's holder) is a few percent of a phase at
/// saturation; softirq counted twice (no `CONFIG_IRQ_TIME_ACCOUNTING`) only lowers it.
pub const HOST_UNATTRIBUTED_WARN: f64 = 0.10;

pub(super) struct Conn {
    pub(super) r: BufReader<TcpStream>,
    /// The node said `Connection: close`.
    pub(super) closed: bool,
}

impl Conn {
    pub(super) fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, CLIENT_IO_TIMEOUT)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(CLIENT_IO_TIMEOUT))?;
        s.set_write_timeout(Some(CLIENT_IO_TIMEOUT))?;
        Ok(Conn {
            r: BufReader::new(s),
            closed: false,
        })
    }

    /// GET `path` on the kept-alive connection: status and body (the connection is
    /// reopened first if the node closed it after the previous answer).
    pub(super) fn get(&mut self, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
        if self.closed {
            *self = Conn::open(self.r.get_ref().peer_addr()?)?;
        }
        write!(
            self.r.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: farside\r\n\r\n"
        )?;
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
        let (mut status, mut len, mut head) = (0u16, None, 0usize);
        loop {
            let mut line = String::new();
            let n = self.r.read_line(&mut line)?;
            head += n;
            if n == 0 || head > HEAD_BYTES_MAX {
                return Err(bad("closed or oversized head"));
            }
            let line = line.trim_end();
            if status == 0 {
                status = line
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad("status line"))?;
                continue;
            }
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.trim().eq_ignore_ascii_case("content-length") {
                    len = Some(v.trim().parse::<usize>().map_err(|_| bad("length"))?);
                } else if k.trim().eq_ignore_ascii_case("connection")
                    && v.trim().eq_ignore_ascii_case("close")
                {
                    self.closed = true;
                }
            }
        }
        let mut body = vec![0u8; len.ok_or_else(|| bad("no content-length"))?];
        self.r.read_exact(&mut body)?;
        Ok((status, body))
    }
}

/// Asks `addr` once for each of `paths` (from the client's namespace): what it does
/// not hold it reads from disk and caches.
pub(super) fn warm(addr: SocketAddr, paths: &[String]) -> Result<(), String> {
    let mut c = Conn::open(addr).map_err(err)?;
    for name in paths {
        let (st, _) = c.get(name).map_err(err)?;
        if st != 200 {
            return Err(err(format!("{name}: status {st}")));
        }
    }
    Ok(())
}

/// The children of one phase, killed on drop.
pub(super) struct Children(pub(super) Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until `addr` takes connections from the client's namespace.
pub(super) fn ready(
    dc: &VirtualDc,
    addr: SocketAddr,
    children: &mut Children,
) -> Result<(), String> {
    let until = Instant::now() + READY_WITHIN;
    loop {
        let up = dc
            .run_in_ns(CLIENT, || {
                Ok(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
            })
            .unwrap_or(false);
        if up {
            return Ok(());
        }
        for c in &mut children.0 {
            if let Ok(Some(st)) = c.try_wait() {
                return Err(err(format!("a node exited before {addr} listened: {st}")));
            }
        }
        if Instant::now() > until {
            return Err(err(format!("{addr} did not listen")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Transports measured, in order (`farside backend --coop-peer`).
pub const TRANSPORTS: [&str; 4] = ["tcp", "udp", "xdp", "shm"];
/// The clients' node.
pub(super) const CLIENT: &str = "client";
/// Ports inside the namespaces (fixed): HTTP and peer; each set-up adds its index so a
/// previous set-up's sockets never collide.
const HTTP_PORT: u16 = 8080;
const PEER_PORT: u16 = 7100;
/// The arena responders' port and reader key id (as the lab's).
const ARENA_PORT: u16 = farside_backend::coop::COOP_ARENA_PORT_DEFAULT;
const ARENA_KEY_ID: u32 = 1;

pub(super) fn node_name(i: usize) -> String {
    format!("n{i}")
}

/// The counters of a node's `/coop/stats` (called in the client's namespace).
pub(super) fn stats_here(addr: SocketAddr) -> std::collections::HashMap<String, u64> {
    let text = match Conn::open(addr).and_then(|mut c| c.get("/coop/stats")) {
        Ok((_, b)) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => {
            eprintln!("calibrate: warning: the counters of {addr}: {e}");
            String::new()
        }
    };
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// One light-load phase as the client measured it.
#[derive(Debug, Clone, Copy)]
pub(super) struct LightRaw {
    pub(super) kind: LightKind<'static>,
    pub(super) bytes: u64,
    /// Requests served in the client's measured window.
    pub(super) requests: u64,
    pub(super) window_ns: u64,
    pub(super) latency_mean_ns: f64,
}

impl LightRaw {
    /// The phase's name in the costs file.
    pub(super) fn phase(&self) -> String {
        light_phase_name(self.kind)
    }

    /// Measured time per request: the window over the requests (one client: its cycle).
    pub(super) fn measured_ns(&self) -> f64 {
        self.window_ns as f64 / self.requests.max(1) as f64
    }
}

pub(super) fn light_phase_name(kind: LightKind) -> String {
    match kind {
        LightKind::Local => "local".into(),
        LightKind::Miss => "miss".into(),
        LightKind::Fetch(t) => format!("fetch-{t}"),
    }
}

/// What one phase counted over its measured window.
#[derive(Debug, Clone, Default)]
pub(super) struct Counted {
    /// Per node, CPU ns.
    pub(super) cpu_ns: Vec<u64>,
    pub(super) local: u64,
    pub(super) remote: u64,
    pub(super) miss: u64,
    pub(super) client_cpu_ns: u64,
    pub(super) softirq_ns: u64,
    /// The host's busy and steal time (all CPUs), ns.
    pub(super) busy_ns: u64,
    pub(super) steal_ns: u64,
    /// Wall time of the window, ns.
    pub(super) wall_ns: u64,
    /// What the load generators measured in their own windows.
    pub(super) clients: ClientFigures,
    /// The nodes' counts from before the load generators started (warm-up included):
    /// the class check of a light phase, whose one client may finish few requests in
    /// the nodes' window.
    /// Local, remote, miss.
    pub(super) whole: [u64; 3],
}

/// The load generators' own figures of a phase, summed over them.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ClientFigures {
    /// Requests served in their measured windows.
    pub(super) served: u64,
    /// The longest measured window, ns.
    pub(super) window_ns: u64,
    /// Latency (request sent to body read) summed over the served requests, ns.
    pub(super) latency_sum_ns: f64,
}

impl Counted {
    pub(super) fn total(&self) -> u64 {
        self.local + self.remote + self.miss
    }

    /// The phase host-wide, per `requests` of its kind; warns when the host was busier
    /// than the phase's own processes explain by more than [`HOST_UNATTRIBUTED_WARN`].
    pub(super) fn host_phase(&self, phase: &str, body_bytes: u64, requests: u64) -> HostPhase {
        let h = HostPhase {
            phase: phase.into(),
            body_bytes,
            requests,
            wall_ns: self.wall_ns,
            busy_ns: self.busy_ns,
            steal_ns: self.steal_ns,
            nodes_ns: self.cpu_ns.iter().sum(),
            own_ns: self.client_cpu_ns,
            softirq_ns: self.softirq_ns,
        };
        if h.unattributed_share() > HOST_UNATTRIBUTED_WARN {
            let per_s = |ns: f64| ns / (h.wall_ns as f64).max(1.0);
            eprintln!(
                "calibrate: warning: {phase} at {body_bytes} B: the host was busy {:.2} CPUs, \
                 its own processes and softirq explain {:.2} ({:.0} % unexplained, above {:.0} %): \
                 another workload ran on the host, its costs are too high",
                per_s(h.busy_ns as f64),
                per_s(h.busy_ns as f64 - h.unattributed_ns()),
                h.unattributed_share() * 100.0,
                HOST_UNATTRIBUTED_WARN * 100.0
            );
        }
        h
    }
}

/// Running nodes of one set-up.
pub(super) struct Cluster<'a> {
    pub(super) dc: &'a VirtualDc,
    /// Measured time of each phase, s.
    pub(super) seconds: f64,
    _children: Children,
    /// Each node's HTTP address, node by node.
    pub(super) http: Vec<SocketAddr>,
}

/// Where the set-ups' nodes find their files and keys.
pub(super) struct Env<'a> {
    pub(super) dc: &'a VirtualDc,
    pub(super) root: &'a Path,
    pub(super) shm_dir: PathBuf,
    pub(super) keys: LabKeys,
    pub(super) work: PathBuf,
    pub(super) exe: PathBuf,
    pub(super) seconds: f64,
    /// Nodes of each set-up (the calibration's shape).
    pub(super) nodes: usize,
}

impl Env<'_> {
    /// Starts the shape's nodes (`policy` over `transport`, `cache_bytes` each, disk
    /// emulation at 0) as set-up `k`.
    pub(super) fn start(
        &self,
        k: usize,
        policy: &str,
        transport: &str,
        cache_bytes: u64,
    ) -> Result<Cluster<'_>, String> {
        let dc = self.dc;
        let ip = |i: usize| std::net::IpAddr::V4(dc.node_ip(&node_name(i)));
        let http: Vec<SocketAddr> = (0..self.nodes)
            .map(|i| SocketAddr::new(ip(i), HTTP_PORT + k as u16))
            .collect();
        let peers = (0..self.nodes)
            .map(|i| SocketAddr::new(ip(i), PEER_PORT + k as u16).to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut children = Children(Vec::new());
        for (i, addr) in http.iter().enumerate() {
            let name = node_name(i);
            let mut a: Vec<String> = vec![
                "backend".into(),
                "--listen".into(),
                addr.to_string(),
                "--root".into(),
                self.root.display().to_string(),
                "--workers".into(),
                LAB_WORKERS.to_string(),
                "--coop".into(),
                "--coop-cache-bytes".into(),
                cache_bytes.to_string(),
                "--coop-disk-latency-us".into(),
                "0".into(),
                "--coop-disk-bytes-per-s".into(),
                CALIBRATION_DISK_BYTES_PER_S.to_string(),
                "--coop-policy".into(),
                policy.into(),
            ];
            if policy == "press" {
                a.extend([
                    "--coop-index".into(),
                    i.to_string(),
                    "--coop-peers".into(),
                    peers.clone(),
                    "--coop-key-file".into(),
                    self.keys.path("coop").display().to_string(),
                    "--coop-peer".into(),
                    transport.into(),
                ]);
                match transport {
                    "xdp" => a.extend([
                        "--coop-arena-iface".into(),
                        dc.veth_in_ns(&name),
                        "--coop-arena-port".into(),
                        ARENA_PORT.to_string(),
                        "--coop-arena-key".into(),
                        format!("{ARENA_KEY_ID}:{}", self.keys.path("coop-arena").display()),
                    ]),
                    "shm" => {
                        a.extend(["--coop-shm-dir".into(), self.shm_dir.display().to_string()])
                    }
                    _ => {}
                }
            }
            let log = self
                .work
                .join(format!("{k}-{policy}-{transport}-{name}.log"));
            children
                .0
                .push(dc.spawn_in(&name, &self.exe, &a, &log).map_err(err)?);
        }
        for addr in &http {
            ready(dc, *addr, &mut children)?;
        }
        Ok(Cluster {
            dc,
            seconds: self.seconds,
            _children: children,
            http,
        })
    }
}

impl Cluster<'_> {
    /// Node `i` reads every object of `paths` once (caching them).
    pub(super) fn warm(&self, i: usize, paths: &[String]) -> Result<(), String> {
        let addr = self.http[i];
        self.dc
            .run_in_ns(CLIENT, || Ok(warm(addr, paths)))
            .map_err(err)?
    }

    /// One phase: a load generator instance per `(node, trace)` with the lab's clients;
    /// the nodes' CPU and counters over the measured window.
    pub(super) fn phase(
        &self,
        drive: &[(usize, &Path)],
        clients: usize,
        root: &Path,
        seed: u64,
    ) -> Result<Counted, String> {
        let lgs: Vec<LoadgenArgs> = drive
            .iter()
            .enumerate()
            .map(|(k, (node, trace))| {
                let mut lg = LoadgenArgs::new(self.http[*node].to_string());
                lg.trace = TraceKind::Worldcup;
                lg.paths = PathMode::Docroot;
                lg.trace_file = Some(trace.to_path_buf());
                lg.check_root = Some(root.to_path_buf());
                lg.timeout_ms = LAB_CLIENT_TIMEOUT_MS;
                lg.quiet = true;
                lg.warmup_s = warmup_s(self.seconds);
                lg.duration_s = self.seconds;
                lg.seed = seed * 100 + k as u64 + 1;
                lg.clients = clients;
                lg
            })
            .collect();
        let dc = self.dc;
        let http = &self.http;
        let t0 = Instant::now();
        let snap = || -> Counted {
            let host = host_ns();
            let mut c = Counted {
                cpu_ns: (0..http.len())
                    .map(|i| cgroup_cpu_ns(dc, &node_name(i)))
                    .collect(),
                client_cpu_ns: process_cpu_ns(),
                softirq_ns: host.softirq,
                busy_ns: host.busy,
                steal_ns: host.steal,
                wall_ns: t0.elapsed().as_nanos() as u64,
                ..Counted::default()
            };
            for a in http {
                let st = stats_here(*a);
                let g = |k: &str| st.get(k).copied().unwrap_or(0);
                c.local += g("local_hits");
                c.remote += g("remote_hits");
                c.miss += g("misses");
            }
            c
        };
        let (start, before, after, failed, clients_seen) = dc
            .run_in_ns(CLIENT, || {
                let start = snap();
                Ok(std::thread::scope(|s| {
                    let hs: Vec<_> = lgs
                        .iter()
                        .map(|lg| s.spawn(move || farside_loadgen::run(lg)))
                        .collect();
                    std::thread::sleep(
                        Duration::from_secs_f64(warmup_s(self.seconds)) + LOADGEN_START,
                    );
                    let before = snap();
                    let mut failed = None;
                    let mut seen = ClientFigures::default();
                    for h in hs {
                        match h.join() {
                            Ok(Ok(sm)) if sm.failure_kinds.wrong_bodies > 0 => {
                                failed =
                                    Some(format!("{} wrong bodies", sm.failure_kinds.wrong_bodies))
                            }
                            Ok(Ok(sm)) => {
                                if sm.failures > 0 {
                                    eprintln!(
                                        "calibrate: warning: the client had {} failed requests ({:?})",
                                        sm.failures, sm.failure_kinds
                                    );
                                }
                                seen.served += sm.served;
                                seen.window_ns = seen.window_ns.max((sm.duration_s * 1e9) as u64);
                                seen.latency_sum_ns += sm.avg_ms * 1e6 * sm.served as f64;
                            }
                            Ok(Err(e)) => failed = Some(format!("loadgen: {e}")),
                            Err(_) => failed = Some("a loadgen thread panicked".into()),
                        }
                    }
                    (start, before, snap(), failed, seen)
                }))
            })
            .map_err(err)?;
        if let Some(f) = failed {
            return Err(err(f));
        }
        Ok(Counted {
            cpu_ns: after
                .cpu_ns
                .iter()
                .zip(&before.cpu_ns)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            local: after.local - before.local,
            remote: after.remote - before.remote,
            miss: after.miss - before.miss,
            client_cpu_ns: after.client_cpu_ns - before.client_cpu_ns,
            softirq_ns: after.softirq_ns.saturating_sub(before.softirq_ns),
            busy_ns: after.busy_ns.saturating_sub(before.busy_ns),
            steal_ns: after.steal_ns.saturating_sub(before.steal_ns),
            wall_ns: after.wall_ns.saturating_sub(before.wall_ns),
            clients: clients_seen,
            whole: [
                after.local - start.local,
                after.remote - start.remote,
                after.miss - start.miss,
            ],
        })
    }
}

impl Cluster<'_> {
    /// A light-load phase: one closed-loop client in all ([`DELAY_CLIENTS`]) asks
    /// `drive.0` for the set of the trace `drive.1`; what it measured in its own window.
    pub(super) fn light(
        &self,
        kind: LightKind<'static>,
        size: u64,
        drive: (usize, &Path),
        root: &Path,
        seed: u64,
    ) -> Result<LightRaw, String> {
        let n = self.phase(&[drive], DELAY_CLIENTS as usize, root, seed)?;
        let name = light_phase_name(kind);
        let whole = Counted {
            local: n.whole[0],
            remote: n.whole[1],
            miss: n.whole[2],
            ..Counted::default()
        };
        let class = match kind {
            LightKind::Local => whole.local,
            LightKind::Miss => whole.miss,
            LightKind::Fetch(_) => whole.remote,
        };
        dominant(&format!("light {name}"), size, class, &whole)?;
        if n.clients.served == 0 || n.clients.window_ns == 0 {
            return Err(err(format!(
                "light {name} at {size} B: the client served nothing"
            )));
        }
        let l = LightRaw {
            kind,
            bytes: size,
            requests: n.clients.served,
            window_ns: n.clients.window_ns,
            latency_mean_ns: n.clients.latency_sum_ns / n.clients.served as f64,
        };
        eprintln!(
            "calibrate: light {name:<16} {size:>6} B  {:>9.1} us per request (latency {:.1} us; {} requests, 1 client)",
            l.measured_ns() / 1e3,
            l.latency_mean_ns / 1e3,
            l.requests
        );
        Ok(l)
    }
}

/// Checks that `class` (the phase's kind of answer) is most of what a phase counted.
pub(super) fn dominant(what: &str, size: u64, class: u64, c: &Counted) -> Result<f64, String> {
    if class == 0 || (class as f64) < PHASE_CLASS_SHARE_MIN * c.total() as f64 {
        return Err(err(format!(
            "{what} phase at {size} B: {class} of {} requests of its kind (local {}, remote {}, miss {}) \
             in the nodes' window of {:.3} s; the clients served {} in theirs of {:.3} s",
            c.total(),
            c.local,
            c.remote,
            c.miss,
            c.wall_ns as f64 / 1e9,
            c.clients.served,
            c.clients.window_ns as f64 / 1e9
        )));
    }
    Ok(class as f64)
}
