//! The data-center of `lab speculative` and one point's measurement: the nodes (client,
//! blind front-end, back-ends with their gatherds and specd daemons) started in their
//! namespaces, the calibration run, and [`measure`].

use super::*;
use crate::error::LabError;
use crate::fabric::keys::LabKeys;

/// What a node's processes are, for [`NodeCpu`].
#[derive(Default)]
pub(super) struct NodePids {
    pub(super) backend: Option<u32>,
    pub(super) specd: Option<u32>,
    pub(super) gatherd: Option<u32>,
}

/// A node's counters at one instant.
pub(super) struct NodeSnap {
    pub(super) throttled_us: u64,
    pub(super) procs: Vec<crate::fabric::netns::ProcCpu>,
}

pub(super) fn node_snap(dc: &VirtualDc, node: &str) -> NodeSnap {
    NodeSnap {
        throttled_us: dc.cpu_stat(node).map_or(0, |c| c.throttled_us),
        procs: dc.node_procs_cpu(node).unwrap_or_default(),
    }
}

pub(super) fn node_cpu(
    node: &str,
    pids: &NodePids,
    a: &NodeSnap,
    b: &NodeSnap,
    wall: Duration,
) -> NodeCpu {
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

/// `farside specd` arguments for back-end `node` (cluster address `ip`) of a `specN`
/// point: source and target, admission window `window` on the base accept queue, the
/// other back-end `peer_ip` as its one peer, its load read one-sidedly from the peer's
/// gatherd region (udp, answered by XDP; with one peer it ranks nothing, and specd's
/// opt-in `--gate-peer-load` is not used); the target's own accept queue decides
/// admission; the VIP steered by
/// sk_lookup, migrated flows moved at the front-end's control port `frontend`,
/// connections handed to `farside backend --adopt-socket adopt`, summary to `summary`;
/// migrations authenticated with the run's key [`MIGRATION_KEY`] and one-sided MOVEs
/// sealed with the front-end's [`MOVE_KEY`] (`keys`).
pub fn specd_args(
    ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
    window: u32,
    frontend: SocketAddr,
    files: SpecdFiles,
    gate: bool,
) -> Vec<String> {
    let SpecdFiles {
        adopt,
        summary,
        keys,
        rmem,
    } = files;
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
        &format!(
            "daemon={peer_ip}:{SPECD_PORT},backend={peer_ip},region=udp:{peer_ip}:{REGION_UDP_PORT}?key={}",
            rmem.reader_spec()
        ),
        "--frontend",
        &frontend.to_string(),
        "--summary",
        &summary.display().to_string(),
        "--key-file",
        &keys.path(MIGRATION_KEY).display().to_string(),
        "--frontend-key-file",
        &keys.path(MOVE_KEY).display().to_string(),
    ]);
    if gate {
        v.push("--gate-peer-load".into());
    }
    v
}

/// The run's namespaces and directories.
pub(super) struct Lab {
    pub(super) dc: VirtualDc,
    /// Back-end nodes `b0`, `b1` with their MAC on the LAN.
    pub(super) backends: Vec<(String, String)>,
    pub(super) logs: PathBuf,
    pub(super) docroot: PathBuf,
    /// The front tier's CPUs (the clients run in this process), when pinned.
    pub(super) front: Option<Vec<usize>>,
    /// The run's cluster keys ([`MIGRATION_KEY`], [`MOVE_KEY`]).
    pub(super) keys: LabKeys,
}

/// The files a specd of the run is given: the web server's adoption socket, its
/// summary, and the run's keys.
pub struct SpecdFiles<'a> {
    pub adopt: &'a Path,
    pub summary: &'a Path,
    pub keys: &'a LabKeys,
    /// The run's rmem keys (the peer's region is read with the reader key).
    pub rmem: &'a crate::fabric::keys::RmemLabKeys,
}

/// The key file of specd's migration protocol (every specd of the run holds it).
pub const MIGRATION_KEY: &str = "specd-migration";
/// The key file the front-end verifies one-sided MOVEs with (and specd seals them).
pub const MOVE_KEY: &str = "frontend-move";

pub(super) const CLIENT: &str = "client";

pub(super) const FE: &str = "fe";

pub(super) fn ip_cmd(args: &[&str]) -> io::Result<String> {
    let out = std::process::Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(LabError::Command {
            what: format!("ip {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }
        .into());
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
    pub(super) fn spawn(&self, node: &str, name: &str, args: &[String]) -> io::Result<Child> {
        let log = self.logs.join(format!("{name}.log"));
        let c = self
            .dc
            .spawn_in(node, &std::env::current_exe()?, args, &log)?;
        Ok(Child::adopt(name, c, log))
    }

    /// Wait until `addr` accepts connections, seen from the client node.
    pub(super) fn wait_port(&self, c: &mut Child, addr: SocketAddr) -> io::Result<()> {
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
    pub(super) fn start_backend(
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
    pub(super) fn start_gatherd(&self, i: usize, tag: &str) -> io::Result<Child> {
        let node = &self.backends[i].0;
        let ip = self.dc.node_ip(node);
        let tcp = SocketAddr::new(ip.into(), GATHERD_TCP_PORT);
        let mut args = strings(&[
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
        args.extend(crate::fabric::keys::RmemLabKeys::shared()?.gatherd_args());
        let mut g = self.spawn(node, &format!("{tag}-gatherd-{node}"), &args)?;
        self.wait_port(&mut g, tcp)?;
        Ok(g)
    }

    /// Start `farside specd` on back-end `i` (the other one its peer) and wait until it
    /// logs its listeners.
    pub(super) fn start_specd(
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
            SpecdFiles {
                adopt,
                summary,
                keys: &self.keys,
                rmem: crate::fabric::keys::RmemLabKeys::shared()?,
            },
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
                return Err(LabError::NoReadyLine {
                    name: c.name.clone(),
                    line: SPECD_READY,
                    within: READY_MAX,
                    log: c.log.clone(),
                }
                .into());
            }
            std::thread::sleep(POLL);
        }
    }

    /// Start the front-end with `weights` (one per back-end used) and wait until the VIP
    /// answers through it.
    pub(super) fn start_frontend(&self, weights: &[u32], tag: &str) -> io::Result<Child> {
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
            "--key-file",
            &self.keys.path(MOVE_KEY).display().to_string(),
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
    pub(super) fn load(&self, lg: LoadgenArgs) -> io::Result<farside_loadgen::Summary> {
        let front = self.front.clone();
        self.dc.run_in_ns(CLIENT, move || {
            if let Some(cpus) = &front {
                // The clients run on this (fresh) thread and the threads it starts.
                crate::fabric::procs::pin_current_thread(cpus)?;
            }
            farside_loadgen::run(&lg)
                .map_err(|e| io::Error::from(crate::error::LabError::Loadgen(e)))
        })
    }
}

/// The clients of one run of a point: the open loop's S-Clients at `rate`, or the
/// closed loop's users with their own timeouts (`--closed-timeout-ms`,
/// `--closed-connect-timeout-ms`).
pub(super) fn loadgen_args(
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
pub(super) fn start_lab(dir: &Path, plan: &Plan) -> io::Result<Lab> {
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
        let mac = mac_of(&link).ok_or_else(|| LabError::NoMac {
            node: n.clone(),
            link: link.clone(),
        })?;
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
        keys: LabKeys::generate(&[MIGRATION_KEY, MOVE_KEY])?,
    })
}

/// Measure one node's capacity: closed loop straight at `b0` (no front-end), accept
/// queue 128. Returns connections/s.
pub(super) fn calibrate(lab: &Lab, a: &SpeculativeArgs) -> io::Result<f64> {
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
pub(super) fn measure(
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
    let tag = point_tag(key, run);
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
            let v = read_specd_summaries(&summaries)?;
            let over_time =
                edges.map(|(w0, wall_ms)| WindowSeries::from_summaries(&v, w0, wall_ms));
            (SpecdFigures::from_summaries(&v), over_time)
        }
        None => (SpecdFigures::default(), None),
    };
    Ok(point_of(
        key,
        (queue, window),
        plan.capacity,
        &s,
        nodes,
        figures,
        over_time.unwrap_or_default(),
    ))
}

/// The name of a point's logs and specd summaries: experiment, system, split and load,
/// and the run after the first.
pub(super) fn point_tag(key: &Key, run: u32) -> String {
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
    tag
}

/// The specd daemons' summaries of a point, one JSON value per back-end.
fn read_specd_summaries(paths: &[PathBuf]) -> io::Result<Vec<serde_json::Value>> {
    let mut v = Vec::new();
    for p in paths {
        let text = std::fs::read_to_string(p).map_err(|e| LabError::SpecdSummary {
            path: p.clone(),
            error: e.to_string(),
        })?;
        v.push(
            serde_json::from_str(&text).map_err(|e| LabError::SpecdSummary {
                path: p.clone(),
                error: e.to_string(),
            })?,
        );
    }
    Ok(v)
}

/// The point from what was measured, without I/O: the clients' summary `s`, the nodes'
/// CPU, the specd figures and their series over the measured window. `(queue, window)`
/// is the system's accept queue and admission window; `capacity_rps` one node's.
pub(super) fn point_of(
    key: &Key,
    (queue, window): (u32, Option<u32>),
    capacity_rps: f64,
    s: &farside_loadgen::Summary,
    nodes: Vec<NodeCpu>,
    figures: SpecdFigures,
    over_time: WindowSeries,
) -> SpecPoint {
    SpecPoint {
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
        capacity_rps,
        duration_s: s.duration_s,
        runs: 1,
        conn_per_s_min: None,
        conn_per_s_max: None,
        served_per_s: s.series.iter().map(|x| x.served).collect(),
        migrations_per_s: over_time.migrations_per_s,
        migrated_per_s: over_time.migrated,
        refused_per_s: over_time.refused,
        closed_per_s: over_time.closed,
    }
}

/// Now in Unix time, ms (0 if the clock is before 1970).
pub(super) fn unix_ms_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}
