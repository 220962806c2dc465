//! The tier of one `lab admission` point: back-ends (farside's server or nginx) with
//! their gatherds, and the proxy under test (farside's, with or without admission
//! control, or HAProxy), placed on loopback ports or in namespaces ([`Fabric`]).

pub use super::point::{SYSTEM_ENVOY_AC, SYSTEM_HAPROXY, SYSTEM_HAPROXY_DIVIDED};
use super::*;

pub(super) struct Run {
    pub(super) logs: PathBuf,
    pub(super) shm: PathBuf,
    pub(super) docroot: PathBuf,
}

/// One proxy of a tier (farside's or HAProxy).
pub(super) struct ProxyProc {
    pub(super) child: Child,
    pub(super) addr: SocketAddr,
    /// The farside proxy's admin listener (metrics).
    pub(super) admin_addr: Option<SocketAddr>,
    /// HAProxy's stats listener (`/stats;csv`).
    pub(super) stats_addr: Option<SocketAddr>,
}

/// The back-end tier and proxies of one system in one scenario.
pub(super) struct Tier {
    // Tenants first: they are dropped (killed) before the back-ends they load.
    pub(super) _tenants: Vec<Child>,
    pub(super) _tenant_handles: Vec<crate::fabric::netns::LoadHandle>,
    /// Pids of the tenant processes (`tenant-load`), paused and continued per point.
    pub(super) tenant_pids: Vec<u32>,
    pub(super) backends: Vec<Child>,
    pub(super) _nginx: Vec<Nginx>,
    pub(super) _gatherers: Vec<Child>,
    /// One proxy, or `--proxies` of them (`multi-proxy`).
    pub(super) proxies: Vec<ProxyProc>,
    /// The back-ends' regions as their gatherers write them (shm files), read by the
    /// lab itself for the back-end queueing delay of every system ([`QueueSampler`]).
    pub(super) regions: Vec<PathBuf>,
    /// The back-end web servers' addresses (the calibration run's clients go straight
    /// to them).
    pub(super) backend_addrs: Vec<SocketAddr>,
}

pub(super) const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// CPUs of the front-end tier (proxy, clients) and of the back-end tier.
#[derive(Clone)]
pub(super) struct Placement {
    pub(super) front: Option<Vec<usize>>,
    pub(super) back: Option<Vec<usize>>,
}

pub(super) fn placement(a: &AdmissionArgs) -> Placement {
    match crate::fabric::procs::Tiers::of(&crate::fabric::procs::allowed_cpus())
        .filter(|_| !a.no_pin)
    {
        Some(t) => Placement {
            front: Some(t.front),
            back: Some(t.back),
        },
        None => Placement {
            front: None,
            back: None,
        },
    }
}

/// Fixed ports of the netns lab (every node has its own address).
pub(super) const NETNS_WEB_PORT: u16 = 80;

pub(super) const NETNS_TCP_PORT: u16 = 7001;

pub(super) const NETNS_UDP_PORT: u16 = 7002;

pub(super) const NETNS_PROXY_PORT: u16 = 8080;

pub(super) const NETNS_ADMIN_PORT: u16 = 9100;

/// Where the lab's nodes run.
pub(super) enum Fabric {
    /// Processes on 127.0.0.1 with free ports, optionally pinned to CPUs.
    Loopback(Placement),
    /// One namespace + cgroup per node (`b0..`, `proxy`, `client`).
    Netns(crate::fabric::netns::VirtualDc),
}

#[derive(Clone, Copy)]
pub(super) enum Role {
    Backend(usize),
    Proxy,
}

impl Fabric {
    pub(super) fn node(role: Role) -> String {
        match role {
            Role::Backend(i) => format!("b{i}"),
            Role::Proxy => "proxy".into(),
        }
    }

    /// An address for a server of `role` (a free loopback port, or the node's IP and a
    /// fixed port).
    pub(super) fn addr(&self, role: Role, netns_port: u16) -> io::Result<SocketAddr> {
        match self {
            Fabric::Loopback(_) => Ok(SocketAddr::new(LOCALHOST, nginx::free_port(LOCALHOST)?)),
            Fabric::Netns(dc) => Ok(SocketAddr::new(
                IpAddr::V4(dc.node_ip(&Self::node(role))),
                netns_port,
            )),
        }
    }

    pub(super) fn spawn(
        &self,
        role: Role,
        name: &str,
        args: &[String],
        logs: &std::path::Path,
    ) -> io::Result<Child> {
        self.spawn_program(role, name, &std::env::current_exe()?, args, logs)
    }

    /// Start `program args` as the node of `role` (its CPUs, or its namespace).
    pub(super) fn spawn_program(
        &self,
        role: Role,
        name: &str,
        program: &std::path::Path,
        args: &[String],
        logs: &std::path::Path,
    ) -> io::Result<Child> {
        match self {
            Fabric::Loopback(pl) => {
                let cpus = match role {
                    Role::Backend(_) => pl.back.as_deref(),
                    Role::Proxy => pl.front.as_deref(),
                };
                Child::spawn_pinned(name, program, args, logs, cpus)
            }
            Fabric::Netns(dc) => {
                let log = logs.join(format!("{name}.log"));
                let c = dc.spawn_in(&Self::node(role), program, args, &log)?;
                Ok(Child::adopt(name, c, log))
            }
        }
    }

    /// Wait until `addr` accepts TCP connections, seen from where clients run.
    pub(super) fn wait_port(&self, child: &mut Child, addr: SocketAddr) -> io::Result<()> {
        match self {
            Fabric::Loopback(_) => child.wait_port(addr),
            Fabric::Netns(dc) => crate::fabric::wait_port(
                child,
                addr,
                crate::fabric::Vantage::Node(dc, "client"),
                crate::fabric::procs::READY_TIMEOUT,
                std::time::Duration::from_millis(20),
            ),
        }
    }

    /// The proxy's metrics, fetched from where clients run.
    pub(super) fn scrape(&self, admin: SocketAddr) -> io::Result<String> {
        match self {
            Fabric::Loopback(_) => crate::promtext::scrape(admin),
            Fabric::Netns(dc) => dc.run_in_ns("client", || crate::promtext::scrape(admin)),
        }
    }

    /// HAProxy's own timings, fetched from where clients run.
    pub(super) fn haproxy_times(&self, stats: SocketAddr) -> io::Result<crate::haproxy::Times> {
        match self {
            Fabric::Loopback(_) => crate::haproxy::fetch_times(stats),
            Fabric::Netns(dc) => dc.run_in_ns("client", || crate::haproxy::fetch_times(stats)),
        }
    }

    /// Run the clients (in the client node's namespace for netns, on the front CPUs).
    pub(super) fn run_clients(
        &self,
        l: &LoadgenArgs,
        cpus: Option<&[usize]>,
    ) -> io::Result<farside_loadgen::Summary> {
        let run = || {
            farside_loadgen::run(l).map_err(|e| io::Error::from(crate::error::LabError::Loadgen(e)))
        };
        match self {
            Fabric::Loopback(_) => run(),
            Fabric::Netns(dc) => dc.run_in_ns("client", || {
                if let Some(c) = cpus {
                    crate::fabric::procs::pin_current_thread(c)?;
                }
                run()
            }),
        }
    }
}

pub(super) fn start_tier(
    a: &AdmissionArgs,
    run: &Run,
    scenario: Scenario,
    system: &str,
    limit: Option<u64>,
    fabric: &Fabric,
) -> io::Result<Tier> {
    let mut backends = Vec::new();
    let mut nginxes = Vec::new();
    let mut gatherers = Vec::new();
    let mut specs = Vec::new();
    let mut addrs = Vec::new();
    let mut regions = Vec::new();
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
                    "--cpu-us-per-request".into(),
                    a.backend_cpu_us.to_string(),
                    "--cpu-ns-per-byte".into(),
                    a.backend_cpu_ns_per_byte.to_string(),
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
        let rkeys = crate::fabric::keys::RmemLabKeys::shared()?;
        args.extend(rkeys.gatherd_args());
        let udp = fabric.addr(role, NETNS_UDP_PORT)?;
        if netns {
            // One-sided across hosts: the XDP responder in the back-end node's kernel, in
            // generic mode so RPS steers it onto the node's own CPU (an honest comparison).
            args.extend([
                "--udp-listen".into(),
                udp.to_string(),
                "--xdp-iface".into(),
                crate::fabric::netns::VETH_IN_NS.into(),
            ]);
            args.extend(["--xdp-mode".into(), "generic".into()]);
        }
        // Wherever BPF is available gatherd's default is the kernel sampler, whose record
        // has backlog, conns, the accept queue's delay and a tick-sampled cpu but no
        // pressure or pending: other metrics keep the user-space sampler.
        if !matches!(system_metric(a, system), "backlog" | "conns" | "delay") {
            args.extend(["--sampler".into(), "user".into()]);
        }
        let mut g = fabric.spawn(role, &format!("{system}-gatherd{i}"), &args, &run.logs)?;
        fabric.wait_port(&mut g, tcp)?;
        g.wait_file(&shm)?;
        gatherers.push(g);
        regions.push(shm.clone());
        let spec = match (system, netns) {
            ("tcp-ac", _) => format!(
                "{addr},region={}",
                rkeys.reader_region(&format!("tcp:{tcp}"))
            ),
            ("onesided-ac" | "onesided-delay", false) => {
                format!("{addr},region=shm:{}", shm.display())
            }
            ("onesided-ac" | "onesided-delay", true) => {
                format!(
                    "{addr},region={}",
                    rkeys.reader_region(&format!("udp:{udp}"))
                )
            }
            _ => addr.to_string(),
        };
        specs.push(spec);
        addrs.push(addr);
    }
    let n_proxies = if scenario == Scenario::MultiProxy {
        a.proxies
    } else {
        1
    };
    let mut proxies = Vec::new();
    for p in 0..n_proxies {
        let name = if n_proxies > 1 {
            format!("{system}-proxy{p}")
        } else {
            format!("{system}-proxy")
        };
        let port_step = p as u16;
        let proxy = if system == SYSTEM_ENVOY_AC {
            start_envoy(a, run, fabric, &addrs, &name, port_step)?
        } else if is_haproxy(system) {
            let maxconn = haproxy_maxconn(a, system, n_proxies)[p];
            start_haproxy(a, run, fabric, &addrs, &name, port_step, maxconn)?
        } else {
            start_farside_proxy(
                a,
                run,
                fabric,
                system,
                limit,
                &specs,
                &name,
                port_step,
                &crate::scenario::class_proxy_args(scenario, system),
            )?
        };
        proxies.push(proxy);
    }
    let mut tenants = Vec::new();
    let mut tenant_handles = Vec::new();
    if scenario == Scenario::TenantLoad && a.tenant_procs > 0 {
        for i in 0..a.backends {
            match fabric {
                Fabric::Loopback(pl) => {
                    for t in 0..a.tenant_procs {
                        tenants.push(Child::spawn_pinned(
                            &format!("tenant-b{i}-{t}"),
                            std::path::Path::new("/bin/sh"),
                            &["-c".into(), "while :; do :; done".into()],
                            &run.logs,
                            pl.back.as_deref(),
                        )?);
                    }
                }
                Fabric::Netns(dc) => {
                    tenant_handles.push(dc.start_cpu_load(&format!("b{i}"), a.tenant_procs)?)
                }
            }
        }
    }
    let tenant_pids = tenants
        .iter()
        .map(|c| c.pid())
        .chain(tenant_handles.iter().flat_map(|h| h.pids()))
        .collect();
    Ok(Tier {
        backends,
        _nginx: nginxes,
        _gatherers: gatherers,
        proxies,
        _tenants: tenants,
        _tenant_handles: tenant_handles,
        tenant_pids,
        regions,
        backend_addrs: addrs,
    })
}

/// Start one HAProxy instance in front of `backends` (see [`crate::haproxy`]), with
/// `maxconn` per server.
pub(super) fn start_haproxy(
    a: &AdmissionArgs,
    run: &Run,
    fabric: &Fabric,
    backends: &[SocketAddr],
    name: &str,
    port_step: u16,
    maxconn: u64,
) -> io::Result<ProxyProc> {
    let addr = fabric.addr(Role::Proxy, NETNS_PROXY_PORT + port_step)?;
    let stats = fabric.addr(Role::Proxy, NETNS_ADMIN_PORT + port_step)?;
    let mut cfg = haproxy_config(a, addr, backends);
    cfg.maxconn_per_server = maxconn;
    cfg.stats_listen = Some(stats.to_string());
    let bin = crate::haproxy::find_binary()?;
    let (_, args) = crate::haproxy::prepare(&bin, &cfg, &run.logs, name)?;
    let mut child = fabric.spawn_program(Role::Proxy, name, &bin, &args, &run.logs)?;
    fabric.wait_port(&mut child, addr)?;
    Ok(ProxyProc {
        child,
        addr,
        admin_addr: None,
        stats_addr: Some(stats),
    })
}

/// `system` is an anchor, not a farside proxy: HAProxy or Envoy (no admission limit,
/// no farside proxy arguments).
pub fn is_anchor(system: &str) -> bool {
    is_haproxy(system) || system == SYSTEM_ENVOY_AC
}

/// The Envoy configuration of the `envoy-ac` system: Envoy's adaptive concurrency with
/// the two values it requires, the clients' timeout, Retry-After on its 503.
pub fn envoy_config(
    a: &AdmissionArgs,
    listen: SocketAddr,
    backends: &[SocketAddr],
) -> crate::envoy::EnvoyConfig {
    let mut cfg = crate::envoy::EnvoyConfig::new(listen, backends);
    cfg.timeout_ms = a.timeout_ms;
    cfg
}

/// Start one Envoy in front of `backends`, with `--proxy-workers` worker threads.
pub(super) fn start_envoy(
    a: &AdmissionArgs,
    run: &Run,
    fabric: &Fabric,
    backends: &[SocketAddr],
    name: &str,
    port_step: u16,
) -> io::Result<ProxyProc> {
    let addr = fabric.addr(Role::Proxy, NETNS_PROXY_PORT + port_step)?;
    let cfg = envoy_config(a, addr, backends);
    let bin = crate::envoy::find_binary()?;
    let args = crate::envoy::prepare(&bin, &cfg, &run.logs, name, a.proxy_workers)?;
    let mut child = fabric.spawn_program(Role::Proxy, name, &bin, &args, &run.logs)?;
    fabric.wait_port(&mut child, addr)?;
    Ok(ProxyProc {
        child,
        addr,
        admin_addr: None,
        stats_addr: None,
    })
}

/// `system` is one of the HAProxy systems.
pub fn is_haproxy(system: &str) -> bool {
    system == SYSTEM_HAPROXY || system == SYSTEM_HAPROXY_DIVIDED
}

/// The per-server `maxconn` of each of the `proxies` HAProxies of `system`: C on every
/// proxy (`haproxy`), or C divided among them (`haproxy-divided`).
pub fn haproxy_maxconn(a: &AdmissionArgs, system: &str, proxies: usize) -> Vec<u64> {
    let c = capacity_conns(a);
    if system == SYSTEM_HAPROXY_DIVIDED {
        crate::haproxy::divided_maxconn(c, proxies)
    } else {
        vec![c; proxies.max(1)]
    }
}

/// How the two HAProxy configurations set `maxconn`, as `params.haproxy_maxconn_rule`
/// records it.
pub const HAPROXY_MAXCONN_RULE: &str = "haproxy: every proxy's server lines get maxconn C (the back-end's connection capacity), so N proxies may hold N x C connections on one back-end (each proxy protects it as if alone; an over-commit some operators accept); haproxy-divided: C divided among the proxies sharing the back-ends, equal shares with the remainder to the first proxies (C=16 over 3: 6,5,5), at least 1 each, so the tier holds at most C per back-end. One proxy (every scenario but multi-proxy): the two are the same.";

/// `params.haproxy_maxconn`: per HAProxy system that runs, per scenario, the per-server
/// `maxconn` of each proxy.
pub fn haproxy_maxconn_record(a: &AdmissionArgs) -> serde_json::Value {
    let mut by_system = serde_json::Map::new();
    for sys in a.systems.iter().filter(|s| is_haproxy(s)) {
        let by_scenario: serde_json::Map<String, serde_json::Value> = a
            .scenario
            .iter()
            .map(|sc| {
                let n = if *sc == Scenario::MultiProxy {
                    a.proxies
                } else {
                    1
                };
                (
                    sc.name().to_string(),
                    serde_json::json!(haproxy_maxconn(a, sys, n)),
                )
            })
            .collect();
        by_system.insert(sys.clone(), by_scenario.into());
    }
    by_system.into()
}

/// `params.rejection_signalling`: how every system signals a rejection and how the
/// clients treat it, the same for all (HAProxy configured to match the farside proxy).
pub fn rejection_signalling(a: &AdmissionArgs) -> serde_json::Value {
    serde_json::json!({
        "status": 503,
        "retry_after_s": crate::haproxy::RETRY_AFTER_S,
        "farside": format!(
            "the proxy's default [admission] retry_after_s = {}: every 503 it answers \
             carries Retry-After",
            crate::haproxy::RETRY_AFTER_S
        ),
        "haproxy": format!(
            "http-error status 503 ... hdr Retry-After {}: HAProxy's own 503 (queue \
             timeout, no server) carries the same header",
            crate::haproxy::RETRY_AFTER_S
        ),
        "envoy": format!(
            "local_reply_config mapper: every 503 Envoy answers itself (adaptive \
             concurrency refusals, upstream failures) gets Retry-After {}",
            crate::haproxy::RETRY_AFTER_S
        ),
        "closed_loop": format!(
            "--on-reject {}: backoff waits uniform in [0, min(--backoff-cap-ms, \
             Retry-After)] (every system sends the header, so the same wait); retry and \
             leave ignore it",
            a.on_reject.as_str()
        ),
        "open_loop": "a rejected user leaves (Retry-After unused)",
    })
}

/// The HAProxy configuration of the `haproxy` system: per-server `maxconn` = the
/// back-end's connection capacity C (`haproxy-divided` lowers it per proxy:
/// [`haproxy_maxconn`]), `--queue-ms` as `timeout queue`, the proxy's workers, and
/// Retry-After on its 503 ([`crate::haproxy::RETRY_AFTER_S`]).
pub fn haproxy_config(
    a: &AdmissionArgs,
    listen: SocketAddr,
    backends: &[SocketAddr],
) -> crate::haproxy::HaproxyConfig {
    let mut cfg = crate::haproxy::HaproxyConfig::new(listen, backends);
    cfg.maxconn_per_server = capacity_conns(a);
    cfg.timeout_queue_ms = a.queue_ms;
    cfg.timeout_ms = a.timeout_ms;
    cfg.threads = a.proxy_workers;
    cfg
}

/// The admission and queueing flags the lab gives a farside proxy of `system` (after its
/// addresses, workers and monitor flags): what `params.proxy_args_by_system` records.
/// Everything not here (or in `--proxy-arg`) is the proxy's product default.
pub fn objective_proxy_args(a: &AdmissionArgs, system: &str, limit: Option<u64>) -> Vec<String> {
    let mut args = vec!["--queue-timeout-ms".to_string(), a.queue_ms.to_string()];
    match (system, limit) {
        // The product's default admission, nothing else: metric delay, its target by
        // the proxy's rule on the queue timeout above, its budget cap the proxy's own.
        ("onesided-delay", _) => args.push("--admission".into()),
        ("no-ac", _) | (_, None) => {}
        (_, Some(l)) => args.extend([
            "--admission".into(),
            "--metric".into(),
            a.metric.clone(),
            "--limit".into(),
            l.to_string(),
        ]),
    }
    args
}

/// The admission metric the gatherers of `system` serve (`onesided-delay`: the queueing
/// delay, which the netns lab's kernel sampler publishes every tick).
pub(super) fn system_metric<'a>(a: &'a AdmissionArgs, system: &str) -> &'a str {
    if system == "onesided-delay" {
        "delay"
    } else {
        &a.metric
    }
}

/// Start one farside proxy of `system` in front of the back-ends `specs`.
#[allow(clippy::too_many_arguments)]
pub(super) fn start_farside_proxy(
    a: &AdmissionArgs,
    run: &Run,
    fabric: &Fabric,
    system: &str,
    limit: Option<u64>,
    specs: &[String],
    name: &str,
    port_step: u16,
    class_args: &[String],
) -> io::Result<ProxyProc> {
    let proxy_addr = fabric.addr(Role::Proxy, NETNS_PROXY_PORT + port_step)?;
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
    for s in specs {
        args.push("--backend".into());
        args.push(s.clone());
    }
    // The admin listener is not subject to admission: the lab reads the monitor's
    // histograms and the request-duration histogram there while the data port rejects.
    let admin = match a.dashboard {
        // `--dashboard`: the first proxy's admin listener is the one the user watches.
        Some(d) if port_step == 0 => d,
        _ => fabric.addr(Role::Proxy, NETNS_ADMIN_PORT + port_step)?,
    };
    args.extend(["--admin-listen".into(), admin.to_string()]);
    let admin_addr = Some(admin);
    args.extend(objective_proxy_args(a, system, limit));
    // The scenario's request classes (`mixed-cost`: the costly endpoint).
    args.extend(class_args.iter().cloned());
    // The user's own proxy arguments come last, so they override the lab's.
    args.extend(a.proxy_args.iter().cloned());
    let mut proxy = fabric.spawn(Role::Proxy, name, &args, &run.logs)?;
    fabric.wait_port(&mut proxy, proxy_addr)?;
    if a.dashboard.is_some() && port_step == 0 {
        eprintln!("lab admission: dashboard of {system} ({name}): http://{admin}/");
    }
    Ok(ProxyProc {
        child: proxy,
        addr: proxy_addr,
        admin_addr,
        stats_addr: None,
    })
}

#[cfg(test)]
mod anchor_tests {
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
    fn haproxy_divided_shares_the_backends_capacity_and_haproxy_does_not() {
        let a = args(
            "--scenario single,multi-proxy --proxies 3 --systems onesided-delay,haproxy,haproxy-divided,envoy-ac",
        );
        assert_eq!(haproxy_maxconn(&a, SYSTEM_HAPROXY, 3), vec![16, 16, 16]);
        assert_eq!(
            haproxy_maxconn(&a, SYSTEM_HAPROXY_DIVIDED, 3),
            vec![6, 5, 5]
        );
        // One proxy: the two configurations are the same.
        assert_eq!(
            haproxy_maxconn(&a, SYSTEM_HAPROXY_DIVIDED, 1),
            haproxy_maxconn(&a, SYSTEM_HAPROXY, 1)
        );
        let rec = haproxy_maxconn_record(&a);
        assert_eq!(
            rec["haproxy-divided"]["multi-proxy"],
            serde_json::json!([6, 5, 5])
        );
        assert_eq!(
            rec["haproxy"]["multi-proxy"],
            serde_json::json!([16, 16, 16])
        );
        assert_eq!(rec["haproxy-divided"]["single"], serde_json::json!([16]));
        assert!(rec.get("envoy-ac").is_none() && rec.get("onesided-delay").is_none());
        assert!(is_anchor("envoy-ac") && is_anchor("haproxy-divided") && !is_anchor("no-ac"));
    }

    #[test]
    fn every_system_signals_rejection_with_the_same_retry_after() {
        let a = args("--on-reject backoff");
        let r = rejection_signalling(&a);
        assert_eq!(r["status"], 503);
        assert_eq!(r["retry_after_s"], crate::haproxy::RETRY_AFTER_S);
        assert!(r["closed_loop"]
            .as_str()
            .unwrap()
            .starts_with("--on-reject backoff"));
        // HAProxy's and Envoy's configurations carry the header the record names.
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let h = haproxy_config(&a, lo, &[lo]).render();
        assert!(h.contains(&format!(
            "hdr Retry-After {}",
            crate::haproxy::RETRY_AFTER_S
        )));
        let e = envoy_config(&a, lo, &[lo]).render();
        assert!(e.contains(&format!(
            "key: Retry-After, value: \"{}\"",
            crate::haproxy::RETRY_AFTER_S
        )));
    }
}
