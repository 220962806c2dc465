//! The loaded tier of `lab faults` (back-ends, gatherds, one proxy, on loopback or in
//! namespaces) and the faults injected into it ([`inject`]).

use super::*;
use crate::error::LabError;

pub(super) fn free_tcp() -> io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

pub(super) fn free_udp() -> io::Result<SocketAddr> {
    UdpSocket::bind("127.0.0.1:0")?.local_addr()
}

pub(super) fn signal(c: &Child, sig: i32) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(c.pid() as i32, sig) };
}

/// Where the tier's processes run.
pub(super) enum Fabric {
    /// Processes on 127.0.0.1 with free ports.
    Loopback,
    /// One namespace per node: `b0..` (back-ends and the spare), `proxy`, `client`.
    Netns(Box<crate::fabric::netns::VirtualDc>),
}

impl Fabric {
    /// The virtual data-center (`None` on loopback).
    pub(super) fn dc(&self) -> Option<&crate::fabric::netns::VirtualDc> {
        match self {
            Fabric::Loopback => None,
            Fabric::Netns(dc) => Some(dc),
        }
    }

    pub(super) fn tcp_addr(&self, node: &str, port: u16) -> io::Result<SocketAddr> {
        match self {
            Fabric::Loopback => free_tcp(),
            Fabric::Netns(dc) => Ok(SocketAddr::new(dc.node_ip(node).into(), port)),
        }
    }

    pub(super) fn udp_addr(&self, node: &str, port: u16) -> io::Result<SocketAddr> {
        match self {
            Fabric::Loopback => free_udp(),
            Fabric::Netns(dc) => Ok(SocketAddr::new(dc.node_ip(node).into(), port)),
        }
    }

    pub(super) fn spawn(
        &self,
        node: &str,
        name: &str,
        args: &[String],
        logs: &Path,
    ) -> io::Result<Child> {
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
    pub(super) fn wait_port(&self, c: &mut Child, addr: SocketAddr) -> io::Result<()> {
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
    pub(super) fn port_up(&self, addr: SocketAddr) -> io::Result<bool> {
        let up = || Ok(std::net::TcpStream::connect_timeout(&addr, FRESH_POLL * 10).is_ok());
        match self {
            Fabric::Loopback => up(),
            Fabric::Netns(dc) => dc.run_in_ns("client", up),
        }
    }

    pub(super) fn scrape(&self, admin: SocketAddr) -> io::Result<String> {
        match self {
            Fabric::Loopback => crate::promtext::scrape(admin),
            Fabric::Netns(dc) => dc.run_in_ns("client", || crate::promtext::scrape(admin)),
        }
    }

    pub(super) fn loadgen(&self, l: &LoadgenArgs) -> io::Result<Summary> {
        let run = || {
            farside_loadgen::run(l).map_err(|e| io::Error::from(crate::error::LabError::Loadgen(e)))
        };
        match self {
            Fabric::Loopback => run(),
            Fabric::Netns(dc) => dc.run_in_ns("client", run),
        }
    }

    /// Run `nft ARGS` in `node`'s namespace with `stdin` as its input.
    pub(super) fn nft(&self, node: &str, args: &[&str], stdin: &str) -> io::Result<()> {
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
        let mut c = cmd.spawn().map_err(|e| LabError::Command {
            what: what.to_string(),
            stderr: e.to_string(),
        })?;
        c.stdin.take().expect("piped").write_all(stdin.as_bytes())?;
        let out = c.wait_with_output()?;
        if !out.status.success() {
            return Err(LabError::Command {
                what: what.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            }
            .into());
        }
        Ok(())
    }
}

/// One back-end node: web server + gatherd.
pub(super) struct Node {
    pub(super) name: String,
    pub(super) web: SocketAddr,
    pub(super) udp: SocketAddr,
    /// gatherd's metrics listener: it answers once the region is served (after the
    /// XDP attach), so it tells when a restarted gatherd is ready.
    pub(super) gatherd_metrics: SocketAddr,
    pub(super) backend: Child,
    pub(super) gatherd: Child,
}

pub(super) struct Tier {
    pub(super) logs: PathBuf,
    pub(super) proxy_node_admin: u16,
    pub(super) nodes: Vec<Node>,
    pub(super) spare: Node,
    pub(super) config: PathBuf,
    pub(super) listen: SocketAddr,
    pub(super) proxy: Child,
    pub(super) admin: SocketAddr,
    pub(super) workers: usize,
    /// Processes started by repairs, kept alive (and stopped) with the tier.
    pub(super) generation: usize,
}

pub(super) fn start_backend(
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
pub(super) type GatherdAt<'a> = (&'a str, SocketAddr, SocketAddr, SocketAddr);

/// Start a gatherd and wait until it serves (its metrics listener answers).
pub(super) fn start_gatherd(
    f: &Fabric,
    logs: &Path,
    at: GatherdAt,
    name: &str,
) -> io::Result<Child> {
    let mut c = spawn_gatherd(f, logs, at, name)?;
    f.wait_port(&mut c, at.3)?;
    Ok(c)
}

/// Start a gatherd without waiting for it to serve.
pub(super) fn spawn_gatherd(
    f: &Fabric,
    logs: &Path,
    at: GatherdAt,
    name: &str,
) -> io::Result<Child> {
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
    args.extend(crate::fabric::keys::RmemLabKeys::shared()?.gatherd_args());
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

pub(super) fn start_node(f: &Fabric, logs: &Path, node: &str, workers: usize) -> io::Result<Node> {
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

pub(super) fn write_config(
    a: &FaultsArgs,
    path: &Path,
    listen: SocketAddr,
    nodes: &[&Node],
) -> io::Result<()> {
    let mut s = format!(
        "listen = \"{listen}\"\nreuse_port = true\n\n[admission]\nenabled = true\nmetric = \"backlog\"\nlimit = {}\nstale_after_ms = {}\n",
        a.limit, a.stale_after_ms
    );
    let rkeys = crate::fabric::keys::RmemLabKeys::shared()?;
    for n in nodes {
        s.push_str(&format!(
            "\n[[backend]]\naddr = \"{}\"\nregion = \"{}\"\n",
            n.web,
            rkeys.reader_region(&format!("udp:{}", n.udp))
        ));
    }
    std::fs::write(path, s)
}

pub(super) fn start_proxy(
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
pub(super) fn time_to_fresh(f: &Fabric, admin: SocketAddr) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < FRESH_WAIT_MAX {
        if f.scrape(admin).is_ok_and(|m| view_fresh(&m)) {
            return Some(t0.elapsed());
        }
        std::thread::sleep(FRESH_POLL);
    }
    None
}

pub(super) fn wait_exit(c: &mut Child) -> io::Result<()> {
    let t0 = Instant::now();
    while c.exited().is_none() {
        if t0.elapsed() > READY_MAX {
            return Err(LabError::NotReady(format!("{} did not exit", c.name)).into());
        }
        std::thread::sleep(FRESH_POLL);
    }
    Ok(())
}

/// Time from the repaired component serving again to a fresh view, whether the view
/// was stale at the repair, how long the repair took, and the time from the repair
/// command to a fresh view (where the repair takes time: the gatherd restart).
pub(super) type Repair = (Option<Duration>, bool, Option<Duration>, Option<Duration>);

/// Whether the proxy at `admin` sees a stale (or unreadable) view now.
pub(super) fn stale_now(f: &Fabric, admin: SocketAddr) -> bool {
    !f.scrape(admin).is_ok_and(|m| view_fresh(&m))
}

/// Inject `fault` into `t`, repair it, and measure the time from repair to a fresh view.
pub(super) fn inject(
    a: &FaultsArgs,
    fab: &Fabric,
    t: &mut Tier,
    fault: &str,
) -> io::Result<Repair> {
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
                    return Err(LabError::NotReady(format!("{name} did not serve")).into());
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

/// A running tier with its fabric: the tier's processes stop (drop) before the fabric
/// (namespaces, cgroups) is torn down.
pub(super) struct Running {
    pub(super) t: Tier,
    /// Offered open-loop rate, requests/s.
    pub(super) rate: f64,
    pub(super) fab: Fabric,
}

/// Build the tier (fabric, back-ends with their gatherds, the proxy) and calibrate the
/// offered rate. `notes` gets what the run should keep (capacity, sysctls).
pub(super) fn start_tier(
    a: &FaultsArgs,
    logs: &Path,
    notes: &mut Vec<String>,
) -> io::Result<Running> {
    std::fs::create_dir_all(logs)?;
    let names: Vec<String> = (0..=a.backends).map(|i| format!("b{i}")).collect();
    let fab = if a.hosts == Hosts::Netns {
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
            let c = capacity(&fab, listen, a.sweep.quick)?;
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
