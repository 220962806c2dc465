//! The shared data-center of `lab reconfig` and one point's measurement: sites of
//! back-end nodes with their gatherds and balancers, the proxies, the clients' bursts,
//! on loopback ports or in namespaces ([`Fabric`]).

use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use farside_loadgen::LoadgenArgs;

use super::plan::{
    anchors, burst_schedule, default_node_cpu_pct, initial_allocation, overprovisioned_allocation,
    plain_value, quota_share_ppm, site_backends, split, strings, Key, Plan, ReconfigArgs,
    Transport, ADMIN_PORT, BALANCER_PORT, BURST_TIME_MAX_S, CAS_ATTEMPTS, DEFAULT_HISTORY_MS,
    FILE_BYTES, FILE_PATH, GATHERD_METRICS_PORT, GATHERD_PERIOD_US, POLL, PROXY_PORT, READY_MAX,
    REGION_TCP_PORT, REGION_UDP_PORT, RMEM_TIMEOUT, ROLE_VERSION_BITS, SERIES_EVERY,
    STALE_AFTER_MS, WEB_PORT,
};
use super::point::{label, timing_quantiles, NodesSample, ReconfigPoint};
use super::{loopback, timing};
use crate::error::LabError;
use crate::fabric::netns::{NodeSpec, VirtualDc};
use crate::fabric::procs::Child;

pub(super) fn site_name(i: usize) -> String {
    format!("s{i}")
}

pub(super) fn site_host(i: usize) -> String {
    format!("s{i}.example")
}

/// Where the nodes run.
pub(super) enum Fabric {
    Netns(VirtualDc),
    Loopback(loopback::LoopbackHosts),
}

impl Fabric {
    /// Run `f` where the clients are (the `client` namespace, or here).
    pub(super) fn in_client<T: Send>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send,
    ) -> io::Result<T> {
        match self {
            Fabric::Netns(dc) => dc.run_in_ns("client", f),
            Fabric::Loopback(_) => f(),
        }
    }

    /// Where readiness checks connect from: the clients' node.
    pub(super) fn client(&self) -> crate::fabric::Vantage<'_> {
        match self {
            Fabric::Netns(dc) => crate::fabric::Vantage::Node(dc, "client"),
            Fabric::Loopback(_) => crate::fabric::Vantage::Here,
        }
    }

    pub(super) fn addr(&self, node: &str, port: u16) -> io::Result<SocketAddr> {
        match self {
            Fabric::Netns(dc) => Ok(SocketAddr::new(dc.node_ip(node).into(), port)),
            Fabric::Loopback(h) => h.addr(node, port),
        }
    }

    /// The node's cgroup for gatherd `--cgroup` (`None`: loopback without root).
    pub(super) fn cgroup_dir(&self, node: &str) -> Option<PathBuf> {
        match self {
            Fabric::Netns(dc) => Some(dc.cgroup_dir(node)),
            Fabric::Loopback(h) => h.cgroup_dir(node),
        }
    }

    pub(super) fn spawn(
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

/// The run's shared state: the namespaces (built for the largest scenario) and the
/// directories.
pub(super) struct Lab {
    pub(super) fabric: Fabric,
    /// Back-end node names `b0..`.
    pub(super) nodes: Vec<String>,
    pub(super) proxies: Vec<String>,
    pub(super) logs: PathBuf,
    pub(super) configs: PathBuf,
    pub(super) sites_root: PathBuf,
    /// Short directory for the back-ends' control sockets (a Unix socket path is at most
    /// 107 bytes; the output directory may be long).
    pub(super) sockets: PathBuf,
    pub(super) high_ppm: u64,
    pub(super) spare_ppm: u64,
    /// The run's rmem keys: every gatherd holds them; the proxies' monitors, the
    /// balancers and the lab's own moves use the balancer key (it may READ too).
    pub(super) rkeys: crate::fabric::keys::RmemLabKeys,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.sockets);
    }
}

/// A running tier (one point's processes); stopped on drop, before the namespaces.
pub(super) struct Tier {
    /// (name, web, region string, gatherd metrics), per back-end node.
    pub(super) nodes: Vec<(String, SocketAddr, String, SocketAddr)>,
    /// (listen, admin) per proxy.
    pub(super) proxies: Vec<(SocketAddr, SocketAddr)>,
    pub(super) _children: Vec<Child>,
}

impl Lab {
    pub(super) fn spawn(&self, node: &str, name: &str, args: &[String]) -> io::Result<Child> {
        let log = self.logs.join(format!("{name}.log"));
        let c = self
            .fabric
            .spawn(node, &std::env::current_exe()?, args, &log)?;
        Ok(Child::adopt(name, c, log))
    }

    /// Wait until `addr` accepts connections, seen from the client node.
    pub(super) fn wait_port(&self, c: &mut Child, addr: SocketAddr) -> io::Result<()> {
        crate::fabric::wait_port(c, addr, self.fabric.client(), READY_MAX, POLL)
    }

    pub(super) fn scrape(&self, addr: SocketAddr) -> io::Result<String> {
        self.fabric.in_client(|| crate::promtext::scrape(addr))
    }

    pub(super) fn addr(&self, node: &str, port: u16) -> io::Result<SocketAddr> {
        self.fabric.addr(node, port)
    }

    /// Start the back-ends, their gatherds and the proxies of one point, and wait until
    /// every proxy routes by the scenario's static allocation.
    pub(super) fn start_tier(
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
            let state = self.sockets.join(format!("{node}.state"));
            let _ = std::fs::remove_file(&state);
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
                "--sampler",
                "user",
                "--role-backend-control",
                &control.display().to_string(),
                "--role-sites",
                &sites.join(","),
                "--role-initial",
                &site.to_string(),
                // A first start at every point: a fresh state file (--role-initial).
                "--role-state",
                &state.display().to_string(),
            ]);
            args.extend(self.rkeys.gatherd_args());
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
                // Read (monitor) and moved (balancer) with the balancer key.
                let region = if region.starts_with("shm:") {
                    region.clone()
                } else {
                    format!("{region}?key={}", self.rkeys.balancer_spec())
                };
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
                     region_listen = \"{}\"\nkey = \"{}\"\nsensitivity_ms = {}\n\
                     history_ms = {}\nlease_ms = {}\nhigh_ppm = {}\nspare_ppm = {}\n",
                    balancers.join(", "),
                    self.addr(p, BALANCER_PORT)?,
                    self.rkeys.balancer_spec(),
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
    pub(super) fn wait_served(&self, t: &Tier, ratio: &[usize], alloc: &[usize]) -> io::Result<()> {
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
                return Err(LabError::NotReady(format!(
                    "the proxies did not route by the allocation {alloc:?} within \
                     {READY_MAX:?}; see logs/"
                ))
                .into());
            }
            std::thread::sleep(POLL);
        }
    }

    /// Move nodes to `alloc` by remote CAS on their `ROLE_WANTED` (from the client
    /// node, with the read-write key) and wait until the proxies route by it. Returns
    /// the nodes moved.
    pub(super) fn set_allocation(
        &self,
        t: &Tier,
        ratio: &[usize],
        alloc: &[usize],
    ) -> io::Result<u64> {
        let regions: Vec<String> = t.nodes.iter().map(|n| n.2.clone()).collect();
        let alloc_v = alloc.to_vec();
        let key = self.rkeys.balancer()?;
        let moved = self.fabric.in_client(move || {
            let opts = farside_rmem::ClientOptions {
                key: Some(key),
                timeout: RMEM_TIMEOUT,
                ..Default::default()
            };
            let off = farside_region::layout::W_ROLE_WANTED * 8;
            let mut moved = 0u64;
            for (region, &site) in regions.iter().zip(&alloc_v) {
                let ep = farside_rmem::Endpoint::parse(region).map_err(io::Error::other)?;
                let mut m = farside_rmem::connect(&ep, &opts).map_err(|error| LabError::Rmem {
                    at: region.to_string(),
                    error,
                })?;
                let mut done = false;
                for _ in 0..CAS_ATTEMPTS {
                    let mut b = [0u8; 8];
                    m.read(off, &mut b).map_err(|error| LabError::Rmem {
                        at: format!("{region}: read"),
                        error,
                    })?;
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
                        Err(error) => {
                            return Err(LabError::Rmem {
                                at: format!("{region}: CAS"),
                                error,
                            }
                            .into())
                        }
                    }
                }
                if !done {
                    return Err(LabError::NotReady(format!(
                        "{region}: role CAS lost {CAS_ATTEMPTS} times"
                    ))
                    .into());
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
    pub(super) fn move_timings(
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
pub(super) fn switch_buckets(lab: &Lab, t: &Tier) -> crate::promtext::Buckets {
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
pub(super) fn measure(
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
                                    farside_loadgen::run(&lg).map_err(|e| {
                                        io::Error::from(crate::error::LabError::Loadgen(e))
                                    })
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
        run_tps: Vec::new(),
    })
}

/// Build the namespaces (or the loopback nodes), the sites' files and the thresholds.
pub(super) fn start_lab(
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
        rkeys: crate::fabric::keys::RmemLabKeys::generate()?,
    })
}
