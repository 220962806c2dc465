//! The run of `lab coop`: the namespaces, the files, a fresh set of processes per point
//! (the system's nodes, the anchor's front-end), the links' shaping, the load
//! generator's instances in the client node, and the nodes' counters and CPU.

use super::client::stat;
use super::crash::{
    crash_and_restart, crash_figures, NodeSpawn, Running, CLIENT, READY_POLL, READY_WITHIN,
};
use super::usage::{dir_bytes, sample_held, sample_queues, snapshot, DirBytes};
use super::*;
use crate::fabric::netns::{NodeSpec, VirtualDc};
use crate::fabric::procs::Child;
use farside_backend::coop::CoopDirectory;
use farside_loadgen::{LoadgenArgs, PathMode, TraceKind};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::Duration;

/// The HTTP port of every node (and of the anchor's front-end).
const HTTP_PORT: u16 = 80;
/// The coop peer port (TCP fetches, UDP directory updates) of every node.
const PEER_PORT: u16 = 7000;
/// The udp port of every node's arena responder (press-xdp).
const ARENA_PORT: u16 = farside_backend::coop::COOP_ARENA_PORT_DEFAULT;
/// The key id of the lab's arena-reader key (press-xdp).
const ARENA_KEY_ID: u32 = 1;
/// The anchor's origin (`farside backend --coop`, caching nothing) in each node.
const ORIGIN_PORT: u16 = 8080;
/// Every node's (or origin's) `--coop-stats-listen` port: the lab reads `/coop/stats`
/// there, on a listener of its own, so an overloaded node's counters are read on time.
const STATS_PORT: u16 = 9180;
/// Back-end workers (threads, one per kept-alive connection) of a cooperating node or
/// origin: the open loop opens one connection per request, and the anchor's nginx keeps
/// up to 16 to its origin; 64 leaves room for both.
const WORKERS: usize = 64;
/// Worker threads of the front-end on `lb` (`farside proxy`, and HAProxy's `nbthread`):
/// the machine's two CPUs.
const LB_WORKERS: usize = 2;
/// Request timeout of the clients, ms: far above a loaded node's latency.
const CLIENT_TIMEOUT_MS: u64 = 10_000;
/// tc tbf `latency`: the longest a packet may wait for tokens, ms (beyond it the
/// qdisc drops, as a switch port's buffer would).
const TBF_LATENCY_MS: u64 = 20;
/// tc tbf `burst`: this many ms of the link's rate (and at least 64 KiB, one GSO
/// packet), so the token bucket does not cap the rate below the one set.
const TBF_BURST_MS: f64 = 4.0;
/// The load generator instances start their clocks after loading the trace: the
/// counters are read (and a crash scheduled) this long after they were started.
const LOADGEN_START: Duration = Duration::from_millis(300);

fn bad(m: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, m)
}

/// The effective durations: (warm-up, measured) seconds.
fn durations(a: &CoopLabArgs) -> (u64, u64) {
    let q = a.sweep.quick;
    (
        a.warmup_s.unwrap_or(if q { 2 } else { 8 }),
        a.duration_s.unwrap_or(if q { 3 } else { 15 }),
    )
}

fn check_args(a: &CoopLabArgs) -> io::Result<()> {
    if a.nodes.is_empty() || a.nodes.iter().any(|n| !NODES_RANGE.contains(n)) {
        return Err(bad(format!("--nodes: each in {NODES_RANGE:?}")));
    }
    if a.clients_per_node == 0 || a.clients_per_node > CLIENTS_PER_NODE_MAX {
        return Err(bad(format!(
            "--clients-per-node must be in 1..={CLIENTS_PER_NODE_MAX}"
        )));
    }
    if a.rates.iter().any(|r| !(*r > 0.0 && *r <= RATE_MAX)) {
        return Err(bad(format!("--rates: each in (0, {RATE_MAX}]")));
    }
    if a.links.iter().any(|g| !(*g >= 0.0 && *g <= 100.0)) {
        return Err(bad("--links: each in [0, 100] Gbit/s".into()));
    }
    let ovh_max = farside_backend::coop::overhead::COOP_MESSAGE_OVERHEAD_US_MAX;
    if a.message_overhead_us.is_empty() || a.message_overhead_us.iter().any(|&u| u > ovh_max) {
        return Err(bad(format!(
            "--message-overhead-us: each in 0..={ovh_max} µs"
        )));
    }
    for s in &a.systems {
        if !SYSTEMS.contains(&s.as_str()) {
            return Err(bad(format!(
                "--systems: unknown system {s:?} (built: {})",
                SYSTEMS.join(", ")
            )));
        }
    }
    let one_sided: &[&str] = match a.directory {
        CoopDirectory::Datagram => &[],
        CoopDirectory::Read => &DIRECTORY_READ_SYSTEMS,
        CoopDirectory::Write => &DIRECTORY_WRITE_SYSTEMS,
    };
    if a.directory != CoopDirectory::Datagram {
        if let Some(s) = a.systems.iter().find(|s| !one_sided.contains(&s.as_str())) {
            return Err(bad(format!(
                "--directory {}: system {s} cannot move directories one-sidedly (only {}: \
                 the records live in the nodes' object arenas)",
                a.directory.name(),
                one_sided.join(", ")
            )));
        }
    }
    if a.repeat == 0 || a.repeat > REPEAT_MAX {
        return Err(bad(format!("--repeat must be in 1..={REPEAT_MAX}")));
    }
    if durations(a).1 == 0 {
        return Err(bad("--duration-s must be at least 1".into()));
    }
    if let Some(n) = a.crash_node {
        if a.nodes.iter().any(|&nodes| n >= nodes) {
            return Err(bad(format!(
                "--crash-node {n}: every --nodes count must have a node {n} (0-based)"
            )));
        }
        if let Some(s) = a
            .systems
            .iter()
            .find(|s| !CRASH_SYSTEMS.contains(&s.as_str()))
        {
            return Err(bad(format!(
                "--crash-node: system {s} cannot crash a node here (only {})",
                CRASH_SYSTEMS.join(", ")
            )));
        }
        let at = crash_at_s(a);
        if at == 0 || at >= durations(a).1 {
            return Err(bad(format!(
                "--crash-at-s {at}: the measured window ({} s) needs a second before and \
                 after the crash",
                durations(a).1
            )));
        }
        if a.crash_down_ms > CRASH_DOWN_MS_MAX {
            return Err(bad(format!("--crash-down-ms: at most {CRASH_DOWN_MS_MAX}")));
        }
    } else if a.crash_at_s.is_some() {
        return Err(bad("--crash-at-s needs --crash-node".into()));
    }
    Ok(())
}

/// Seconds into the measured window at which crash mode kills its node.
fn crash_at_s(a: &CoopLabArgs) -> u64 {
    a.crash_at_s.unwrap_or(durations(a).1 / 3)
}

/// The points in sweep order: node count, link, per-message overhead (in the order
/// given), load model, system innermost (so the systems of one configuration are
/// measured close together in time).
pub fn point_keys(a: &CoopLabArgs) -> Vec<Key> {
    let mut keys = Vec::new();
    for &nodes in &a.nodes {
        for &link_gbit in &a.links {
            for &message_overhead_us in &a.message_overhead_us {
                for model in a.load.models() {
                    let loads: Vec<(usize, f64)> = if *model == "closed" {
                        vec![(nodes * a.clients_per_node, 0.0)]
                    } else {
                        a.rates.iter().map(|&r| (0, r)).collect()
                    };
                    for (clients, rate) in loads {
                        for system in &a.systems {
                            keys.push(Key {
                                system: system.clone(),
                                nodes,
                                link_gbit,
                                message_overhead_us,
                                load_model: model.to_string(),
                                clients,
                                rate,
                            });
                        }
                    }
                }
            }
        }
    }
    keys
}

/// ` +N us` for a point with a per-message overhead, nothing without.
fn overhead_label(us: u64) -> String {
    if us > 0 {
        format!(" +{us}us")
    } else {
        String::new()
    }
}

/// The namespaces of one node count, and the run's files.
struct Lab {
    dc: VirtualDc,
    nodes: usize,
}

/// What every point shares.
struct Shared {
    root: PathBuf,
    logs: PathBuf,
    trace_file: PathBuf,
    keys: crate::fabric::keys::LabKeys,
    coop_trace: farside_coop::trace::Trace,
    /// press-shm: the directory of the nodes' arena files (mode 0700).
    shm_dir: PathBuf,
}

/// Run `farside lab coop`.
pub fn run(a: CoopLabArgs) -> io::Result<()> {
    check_args(&a)?;
    // SAFETY: geteuid has no preconditions.
    crate::fabric::netns::check_root(unsafe { libc::geteuid() }).map_err(|_| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "lab coop needs root: a network namespace and cgroup per node, tc on their links",
        )
    })?;
    let dir = a.sweep.dir(&a.out);
    let (warmup_s, duration_s) = durations(&a);
    let trace_file = a
        .trace
        .clone()
        .unwrap_or_else(farside_coop::trace::world_cup_sample_path);
    let coop_trace = farside_coop::trace::Trace::read_world_cup(&trace_file)?;
    let label = farside_coop::synth::trace_label(&trace_file)?;
    let mut meta = crate::summary::Summary::new("coop", a.hosts.as_str(), a.sweep.quick);
    crate::sweep::fill_host_metadata(&mut meta);
    meta.params = params(&a, &coop_trace, warmup_s, duration_s);
    super::labels::trace_params(&mut meta.params, &label);
    super::labels::slice_params(&mut meta.params, a.cpu_quota_pct);
    let mut sweep = crate::sweep::Sweep::<Coop>::start(&dir, meta, a.sweep.resume.is_some())?;
    if let Some(d) = &label.description {
        std::fs::write(
            dir.join("trace.synth.json"),
            serde_json::to_string_pretty(d).map_err(io::Error::other)? + "\n",
        )?;
    }
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let work = std::env::temp_dir().join(format!("farside-lab-coop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let root = work.join("root");
    let lg_trace = loadgen_args("127.0.0.1:1", &root, &trace_file)
        .build_trace()
        .map_err(|e| io::Error::other(e.to_string()))?;
    let (files, bytes, skipped) = write_objects(&lg_trace, &root)?;
    let shm_dir = work.join("arenas");
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&shm_dir)?;
    }
    eprintln!("lab coop: wrote {files} files ({bytes} bytes), {skipped} paths skipped");
    let shared = Shared {
        root,
        logs,
        trace_file,
        keys: crate::fabric::keys::LabKeys::generate(&["coop", "coop-arena"])?,
        coop_trace,
        shm_dir,
    };
    let keys = point_keys(&a);
    let mut lab: Option<Lab> = None;
    let est = (warmup_s + duration_s) as f64 + 4.0;
    let result = sweep.run(
        &keys,
        a.repeat,
        est,
        |k: &Key| {
            format!(
                "{} n{} link {}{} {} {}",
                k.system,
                k.nodes,
                link_label(k.link_gbit),
                overhead_label(k.message_overhead_us),
                k.load_model,
                load_label(&k.load_model, k.rate, k.clients)
            )
        },
        |k, run| {
            if lab.as_ref().is_some_and(|l| l.nodes != k.nodes) {
                if let Some(l) = lab.take() {
                    let _ = l.dc.destroy();
                }
            }
            if lab.is_none() {
                lab = Some(start_lab(&a, k.nodes)?);
            }
            let l = lab.as_ref().expect("started above");
            measure(&a, l, &shared, k, run, warmup_s, duration_s)
        },
    );
    if let Some(l) = lab.take() {
        let _ = l.dc.destroy();
    }
    let _ = std::fs::remove_dir_all(&work);
    sweep.note(NOT_BUILT.to_string())?;
    sweep.note(format!(
        "files: {files} written ({bytes} bytes), {skipped} trace paths skipped (paths that \
         cannot be files); requests for them are answered 4xx, which the load generator \
         counts as served (its rule: any answer below 500)"
    ))?;
    result?;
    sweep.finish()?;
    Ok(())
}

fn start_lab(a: &CoopLabArgs, nodes: usize) -> io::Result<Lab> {
    let mut specs: Vec<NodeSpec> = (0..nodes)
        .map(|i| NodeSpec::new(&node_name(i)).cpu_quota_pct(a.cpu_quota_pct))
        .collect();
    specs.push(NodeSpec::new(LB));
    specs.push(NodeSpec::new(CLIENT));
    let dc = VirtualDc::create(&format!("c{}", std::process::id() % 100_000), &specs)?;
    let id = dc.run_id().to_string();
    crate::fabric::procs::on_interrupt(move || {
        if let Ok(r) = crate::fabric::netns::clean_run_id(&id) {
            eprint!("{r}");
        }
    });
    Ok(Lab { dc, nodes })
}

/// The load generator's settings every instance shares.
fn loadgen_args(target: &str, root: &Path, trace_file: &Path) -> LoadgenArgs {
    let mut lg = LoadgenArgs::new(target);
    lg.trace = TraceKind::Worldcup;
    lg.paths = PathMode::Docroot;
    lg.trace_file = Some(trace_file.to_path_buf());
    lg.check_root = Some(root.to_path_buf());
    lg.timeout_ms = CLIENT_TIMEOUT_MS;
    lg.quiet = true;
    lg
}

fn params(
    a: &CoopLabArgs,
    t: &farside_coop::trace::Trace,
    warmup_s: u64,
    duration_s: u64,
) -> serde_json::Value {
    serde_json::json!({
        "nodes": a.nodes,
        "systems": a.systems,
        "load": a.load.models(),
        "clients_per_node": a.clients_per_node,
        "rates": a.rates,
        "links_gbit": a.links,
        "message_overhead_us": a.message_overhead_us,
        "message_overhead": "every peer message (directory update sent / received, fetch request and reply sent / received, each one-sided READ or mapped read the initial node makes) first spins that many µs of CPU on the node's thread that handles it (farside backend --coop-message-overhead-us, a busy loop on the monotonic clock); overhead_spins: the messages that paid it over the measured window, all nodes",
        "warmup_s": warmup_s,
        "duration_s": duration_s,
        "cpu_quota_pct": a.cpu_quota_pct,
        "disk_latency_us": a.disk_latency_us,
        "disk_queue_max": a.disk_queue_max,
        "disk_bytes_per_s": farside_backend::coop::disk::DISK_BYTES_PER_S_DEFAULT,
        "cache_bytes": a.cache_bytes,
        "anchor_max_size_bytes": a.anchor_max_size_bytes,
        "cache_held_sampled": format!("cache_held_mean_bytes / cache_held_max_bytes: the same bytes sampled every {} ms over the measured window, mean and largest", HELD_SAMPLE_INTERVAL.as_millis()),
        "cpu": "cpu_us_per_req: the back-end nodes' cgroups' CPU (cpuacct) per served request; the anchor: nginx_cpu_us_per_req the nginx processes' share of it (/proc/<pid>/stat utime + stime), the rest its origins'; lb_cpu_us_per_req the front-end's",
        "cache_rule": format!("ceil(W{:.0} / nodes): the bytes of the most popular objects receiving {:.0} % of the requests ({} B), split over the nodes; the anchor's nginx caches get the same bytes each", CACHE_RULE_FRACTION * 100.0, CACHE_RULE_FRACTION * 100.0, t.working_set_bytes(CACHE_RULE_FRACTION)),
        "trace": "World Cup 1998 sample (data/wc98-day6-sample.csv.gz), files at their logged paths and sizes with content of their own",
        "client": "farside loadgen, one instance per back-end node with its share of the clients (closed: kept-alive, World Cup sessions) or of the rate (open: the log's timing compressed to the rate, one connection per request), all in the client node; every 200's body checked against its file (--check-root)",
        "lard": format!("farside proxy --balance lard on node lb (farside_coop::policy::Lard, T_low 25, T_high 65, the paper's; load = the proxy's requests in service per node; --workers {LB_WORKERS} --maxconn {WORKERS}) over farside backend --coop --coop-policy rr nodes"),
        "bounded_hash": format!("farside proxy --balance bounded-hash on node lb (farside_coop::policy::BoundedHash, 100 ring points per node, --hash-balance-factor {}; the same load, workers and maxconn)", crate::haproxy::HASH_BALANCE_FACTOR),
        "haproxy": format!("HAProxy on node lb: balance uri, hash-type consistent, hash-balance-factor {}, over nginx proxy_cache on every node ({}), each nginx's upstream a farside backend --coop --coop-cache-bytes 1 in the same node (the same emulated disk, nothing cached); lb has no CPU quota (a front-end box PRESS does not need)", crate::haproxy::HASH_BALANCE_FACTOR, crate::nginx::PROXY_CACHE_BOUND_RULE),
        "cache_held": "cache_held_bytes: body bytes the nodes' caches held at the end of each point, summed over the nodes (farside: each node's cache_used_bytes counter; nginx: the apparent bytes of its cache files, which also carry nginx's per-file header); cache_disk_bytes: nginx's cache files' allocated blocks (what nginx's max_size counts)",
        "links": "tc tbf on both ends of every back-end node's veth (client and peer traffic share it); 0 = not shaped",
        "repeat": a.repeat,
        "directory": a.directory.name(),
        "directory_mode": match a.directory {
            CoopDirectory::Datagram => "the PRESS nodes push their directory (Bloom filter, epoch, load) as sealed UDP datagrams to every peer, on change, at most once per 20 ms, heartbeat 500 ms",
            CoopDirectory::Write => "each PRESS node WRITEs its directory record (Bloom filter, epoch, load) one-sidedly into its own slot of every peer's object arena (sequence odd, length + CRC32c + record, sequence even: acknowledged WRITEs answered by the peer's XDP program under a per-peer key that may write that slot only), on change, at most once per 20 ms, heartbeat 500 ms; every node reads its slots locally once per 20 ms; no datagram",
            CoopDirectory::Read => "each PRESS node writes its directory record (Bloom filter, epoch, load) into its own object arena (seqlock, CRC32c), on change, at most once per 20 ms, heartbeat 500 ms; every peer pulls it one-sidedly once per 20 ms (press-xdp: READs answered by the owner's XDP program; press-shm: the mapped arena file); no datagram",
        },
        "crash": a.crash_node.map(|n| format!("node n{n} killed with SIGKILL {} s into every point's measured window, down {} ms, then started again with the same arguments (empty cache, new arena); recovery: the first whole second after the crash's serving at least {:.0} % of the mean rate before it with no failure", crash_at_s(a), a.crash_down_ms, RECOVERED_FRACTION * 100.0)),
    })
}

/// Shape (or unshape, `gbit` 0) both ends of every back-end node's link.
fn shape_links(dc: &VirtualDc, nodes: usize, gbit: f64) -> io::Result<()> {
    let bridge = crate::fabric::netns::bridge_netns_name(dc.run_id());
    for i in 0..nodes {
        let name = node_name(i);
        for (ns, dev) in [
            (dc.netns_name(&name), dc.veth_in_ns(&name)),
            (bridge.clone(), dc.veth_peer(&name)),
        ] {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &ns, "tc", "qdisc"]);
            if gbit <= 0.0 {
                cmd.args(["del", "dev", &dev, "root"]);
                // Nothing to delete is fine: the link is unshaped already.
                let _ = cmd.output();
                continue;
            }
            let bytes_per_s = gbit * 1e9 / 8.0;
            let burst = ((bytes_per_s * TBF_BURST_MS / 1000.0) as u64).max(64 * 1024);
            cmd.args([
                "replace",
                "dev",
                &dev,
                "root",
                "tbf",
                "rate",
                &format!("{}mbit", (gbit * 1000.0).round() as u64),
                "burst",
                &burst.to_string(),
                "latency",
                &format!("{TBF_LATENCY_MS}ms"),
            ]);
            let out = cmd.output()?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "tc tbf on {dev} in {ns}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
    }
    Ok(())
}

/// A cooperating node (or, `origin`, the anchor's origin that caches nothing); `peer`:
/// the press transport (`tcp`, `udp`, `xdp`, `shm`).
#[allow(clippy::too_many_arguments)]
fn backend_args(
    a: &CoopLabArgs,
    sh: &Shared,
    listen: SocketAddr,
    policy: &str,
    peer: &str,
    cache_bytes: u64,
    index: usize,
    peers: &[String],
    message_overhead_us: u64,
) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "backend".into(),
        "--listen".into(),
        listen.to_string(),
        "--root".into(),
        sh.root.display().to_string(),
        "--workers".into(),
        WORKERS.to_string(),
        "--coop".into(),
        "--coop-cache-bytes".into(),
        cache_bytes.to_string(),
        "--coop-disk-latency-us".into(),
        a.disk_latency_us.to_string(),
        "--coop-disk-queue-max".into(),
        a.disk_queue_max.to_string(),
        "--coop-policy".into(),
        policy.into(),
        "--coop-stats-listen".into(),
        SocketAddr::new(listen.ip(), STATS_PORT).to_string(),
    ];
    if policy == "press" {
        args.extend([
            "--coop-index".into(),
            index.to_string(),
            "--coop-peers".into(),
            peers.join(","),
            "--coop-key-file".into(),
            sh.keys.path("coop").display().to_string(),
            "--coop-peer".into(),
            peer.into(),
        ]);
        match peer {
            "xdp" => args.extend([
                "--coop-arena-iface".into(),
                crate::fabric::netns::VETH_IN_NS.into(),
                "--coop-arena-port".into(),
                ARENA_PORT.to_string(),
                "--coop-arena-key".into(),
                format!("{ARENA_KEY_ID}:{}", sh.keys.path("coop-arena").display()),
            ]),
            "shm" => args.extend(["--coop-shm-dir".into(), sh.shm_dir.display().to_string()]),
            _ => {}
        }
        if a.directory != CoopDirectory::Datagram {
            args.extend(["--coop-directory".into(), a.directory.name().into()]);
        }
    }
    if message_overhead_us > 0 {
        args.extend([
            "--coop-message-overhead-us".into(),
            message_overhead_us.to_string(),
        ]);
    }
    args
}

fn start_system(
    a: &CoopLabArgs,
    l: &Lab,
    sh: &Shared,
    k: &Key,
    cache_bytes: u64,
    tag: &str,
) -> io::Result<Running> {
    let dc = &l.dc;
    let exe = std::env::current_exe()?;
    let ips: Vec<Ipv4Addr> = (0..k.nodes).map(|i| dc.node_ip(&node_name(i))).collect();
    let peers: Vec<String> = ips.iter().map(|ip| format!("{ip}:{PEER_PORT}")).collect();
    let mut r = Running {
        children: Vec::new(),
        spawns: Vec::new(),
        _keepers: Vec::new(),
        stats_at: Vec::new(),
        targets: Vec::new(),
        prefixes: Vec::new(),
        cache_dirs: Vec::new(),
    };
    let mut waits: Vec<(usize, SocketAddr)> = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let name = node_name(i);
        let http = SocketAddr::from((*ip, HTTP_PORT));
        match k.system.as_str() {
            "rr" | "press-tcp" | "press-udp" | "press-xdp" | "press-shm" | "lard"
            | "bounded-hash" => {
                let (policy, peer) = match k.system.strip_prefix("press-") {
                    Some(t) => ("press", t),
                    None => ("rr", "tcp"),
                };
                let args = backend_args(
                    a,
                    sh,
                    http,
                    policy,
                    peer,
                    cache_bytes,
                    i,
                    &peers,
                    k.message_overhead_us,
                );
                let log = sh.logs.join(format!("{tag}-{name}.log"));
                let c = dc.spawn_in(&name, &exe, &args, &log)?;
                r.children.push(Child::adopt(&name, c, log.clone()));
                r.spawns.push(Some(NodeSpawn {
                    child: r.children.len() - 1,
                    name: name.clone(),
                    args,
                    log,
                    http,
                }));
                waits.push((r.children.len() - 1, http));
                r.stats_at.push(SocketAddr::from((*ip, STATS_PORT)));
                r.targets.push(http);
            }
            "haproxy" => {
                r.spawns.push(None);
                let origin = SocketAddr::from((*ip, ORIGIN_PORT));
                let mut args = backend_args(a, sh, origin, "rr", "tcp", 1, i, &peers, 0);
                // The origin is the anchor's disk, nothing more: no shedding of its own
                // (nginx queues for it; the farside nodes' bound is PRESS's, not nginx's).
                if let Some(i) = args.iter().position(|x| x == "--coop-disk-queue-max") {
                    args[i + 1] = "0".into();
                }
                let log = sh.logs.join(format!("{tag}-{name}-origin.log"));
                let c = dc.spawn_in(&name, &exe, &args, &log)?;
                r.children
                    .push(Child::adopt(&format!("{name}-origin"), c, log));
                waits.push((r.children.len() - 1, origin));
                r.stats_at.push(SocketAddr::from((*ip, STATS_PORT)));
                let prefix = std::env::temp_dir().join(format!(
                    "farside-coop-nginx-{}-{tag}-{name}",
                    std::process::id()
                ));
                let _ = std::fs::remove_dir_all(&prefix);
                for d in ["tmp", "cache"] {
                    std::fs::create_dir_all(prefix.join(d))?;
                }
                r.prefixes.push(prefix.clone());
                r.cache_dirs.push(prefix.join("cache"));
                let bin = crate::nginx::find_binary()?;
                let conf = crate::nginx::proxy_cache_conf(
                    &prefix,
                    http,
                    origin,
                    cache_bytes,
                    true,
                    &crate::nginx::Modules::detect(&bin),
                );
                let conf_path = prefix.join("nginx.conf");
                std::fs::write(&conf_path, &conf)?;
                std::fs::write(sh.logs.join("nginx-proxy-cache.conf"), &conf)?;
                let args: Vec<String> = vec![
                    "-p".into(),
                    prefix.display().to_string(),
                    "-c".into(),
                    conf_path.display().to_string(),
                    "-e".into(),
                    prefix.join("error.log").display().to_string(),
                    "-g".into(),
                    "daemon off;".into(),
                ];
                let log = sh.logs.join(format!("{tag}-{name}-nginx.log"));
                let c = dc.spawn_in(&name, &bin, &args, &log)?;
                r.children
                    .push(Child::adopt(&format!("{name}-nginx"), c, log));
                waits.push((r.children.len() - 1, http));
            }
            other => return Err(bad(format!("unknown system {other}"))),
        }
    }
    if k.system == "lard" || k.system == "bounded-hash" {
        let lb = SocketAddr::from((dc.node_ip(LB), HTTP_PORT));
        let mut args: Vec<String> = vec![
            "proxy".into(),
            "--listen".into(),
            lb.to_string(),
            "--balance".into(),
            k.system.clone(),
            "--hash-balance-factor".into(),
            crate::haproxy::HASH_BALANCE_FACTOR.to_string(),
            "--workers".into(),
            LB_WORKERS.to_string(),
            "--maxconn".into(),
            WORKERS.to_string(),
        ];
        for ip in &ips {
            args.extend([
                "--backend".into(),
                SocketAddr::from((*ip, HTTP_PORT)).to_string(),
            ]);
        }
        let log = sh.logs.join(format!("{tag}-proxy.log"));
        let c = dc.spawn_in(LB, &exe, &args, &log)?;
        r.children.push(Child::adopt("proxy", c, log));
        waits.push((r.children.len() - 1, lb));
        r.targets = vec![lb; k.nodes];
    }
    if k.system == "haproxy" {
        let lb = SocketAddr::from((dc.node_ip(LB), HTTP_PORT));
        let servers: Vec<SocketAddr> = ips
            .iter()
            .map(|ip| SocketAddr::from((*ip, HTTP_PORT)))
            .collect();
        let mut cfg = crate::haproxy::HaproxyConfig::new(lb, &servers);
        cfg.balance = crate::haproxy::url_hash_balance(crate::haproxy::HASH_BALANCE_FACTOR);
        // No admission here: each server may hold as many requests as nginx takes.
        cfg.maxconn_per_server = 1000;
        cfg.timeout_ms = CLIENT_TIMEOUT_MS;
        cfg.retry_after_s = None;
        cfg.threads = LB_WORKERS;
        let bin = crate::haproxy::find_binary()?;
        let (_, args) = crate::haproxy::prepare(&bin, &cfg, &sh.logs, &format!("{tag}-haproxy"))?;
        let log = sh.logs.join(format!("{tag}-haproxy.log"));
        let c = dc.spawn_in(LB, &bin, &args, &log)?;
        r.children.push(Child::adopt("haproxy", c, log));
        waits.push((r.children.len() - 1, lb));
        r.targets = vec![lb; k.nodes];
    }
    for (i, addr) in waits {
        crate::fabric::wait_port(
            &mut r.children[i],
            addr,
            crate::fabric::Vantage::Node(dc, CLIENT),
            READY_WITHIN,
            READY_POLL,
        )?;
    }
    Ok(r)
}

fn measure(
    a: &CoopLabArgs,
    l: &Lab,
    sh: &Shared,
    k: &Key,
    run: u32,
    warmup_s: u64,
    duration_s: u64,
) -> io::Result<CoopPoint> {
    let rule_bytes = a
        .cache_bytes
        .unwrap_or_else(|| cache_rule(&sh.coop_trace, k.nodes));
    // The anchor's nginx may be given another max_size (docs/coop.md "Same memory").
    let cache_bytes = match a.anchor_max_size_bytes {
        Some(b) if k.system == "haproxy" => b,
        _ => rule_bytes,
    };
    let tag = format!(
        "{}-n{}-{}{}-{}-{}-r{run}",
        k.system,
        k.nodes,
        link_label(k.link_gbit),
        if k.message_overhead_us > 0 {
            format!("-ovh{}", k.message_overhead_us)
        } else {
            String::new()
        },
        k.load_model,
        if k.load_model == "open" {
            format!("{:.0}", k.rate)
        } else {
            k.clients.to_string()
        }
    );
    // The host's speed before the point, nothing of it running yet, and after it (the
    // model scales its calibrated costs by their mean).
    let host_ref_before = crate::fabric::hostspeed::reading(&format!("lab coop: {tag}"));
    shape_links(&l.dc, k.nodes, k.link_gbit)?;
    let mut sys = start_system(a, l, sh, k, cache_bytes, &tag)?;
    let per_node: Vec<LoadgenArgs> = sys
        .targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut lg = loadgen_args(&t.to_string(), &sh.root, &sh.trace_file);
            lg.warmup_s = warmup_s as f64;
            lg.duration_s = duration_s as f64;
            // The model replays the same sessions (farside_coop::validate::predict).
            lg.seed = farside_coop::validate::lab_loadgen_seed(run, i);
            if k.load_model == "open" {
                lg.rate = Some(k.rate / k.nodes as f64);
                lg.no_keepalive = true;
            } else {
                lg.clients = a.clients_per_node;
            }
            lg
        })
        .collect();
    let dc = &l.dc;
    let stats_at = sys.stats_at.clone();
    let cache_dirs = sys.cache_dirs.clone();
    let nginx = !cache_dirs.is_empty();
    let nodes = k.nodes;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let crash = a.crash_node.map(|node| (node, crash_at_s(a)));
    let sys_ref = &mut sys;
    let (summaries, before, after, held, queues, crashed) = dc.run_in_ns(CLIENT, || {
        std::thread::scope(|s| {
            let handles: Vec<_> = per_node
                .iter()
                .map(|lg| s.spawn(move || farside_loadgen::run(lg)))
                .collect();
            let crasher = crash.map(|(node, at_s)| {
                let down = Duration::from_millis(a.crash_down_ms);
                let at = Duration::from_secs(warmup_s + at_s) + LOADGEN_START;
                s.spawn(move || crash_and_restart(dc, sys_ref, node, at, down))
            });
            // The counters are read at the end of the loadgen instances' warm-up.
            std::thread::sleep(Duration::from_secs(warmup_s) + LOADGEN_START);
            let before = snapshot(dc, nodes, &stats_at, nginx);
            let sampler = s.spawn(|| sample_held(&cache_dirs, &stats_at, &stop));
            let queue_sampler = s.spawn(|| sample_queues(&stats_at, &stop));
            let mut out = Vec::new();
            let mut failed = None;
            for h in handles {
                match h.join() {
                    Ok(Ok(sm)) => out.push(sm),
                    Ok(Err(e)) => failed = Some(io::Error::other(format!("loadgen: {e}"))),
                    Err(_) => failed = Some(io::Error::other("a loadgen thread panicked")),
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let held = sampler.join().unwrap_or_default();
            let queues = queue_sampler.join().unwrap_or_default();
            let crashed = match crasher.map(|h| h.join()) {
                None => None,
                Some(Ok(r)) => Some(r?),
                Some(Err(_)) => return Err(io::Error::other("the crash thread panicked")),
            };
            if let Some(e) = failed {
                return Err(e);
            }
            let after = snapshot(dc, nodes, &stats_at, nginx);
            Ok((out, before, after, held, queues, crashed))
        })
    })?;
    for c in &mut sys.children {
        c.check_alive()?;
    }
    let host_ref = match (
        host_ref_before,
        crate::fabric::hostspeed::reading(&format!("lab coop: {tag}")),
    ) {
        (Some(a), Some(b)) => (a + b) / 2.0,
        (a, b) => a.or(b).unwrap_or(0.0),
    };
    // What the caches hold at the end of the point.
    let (cache_held_bytes, cache_disk_bytes) = if sys.cache_dirs.is_empty() {
        let held = after
            .stats
            .iter()
            .map(|t| stat(t, "cache_used_bytes"))
            .sum();
        (held, 0)
    } else {
        let b = sys
            .cache_dirs
            .iter()
            .map(|d| dir_bytes(d))
            .fold(DirBytes::default(), |a, x| DirBytes {
                files: a.files + x.files,
                apparent: a.apparent + x.apparent,
                allocated: a.allocated + x.allocated,
                dirs: a.dirs + x.dirs,
                dirs_allocated: a.dirs_allocated + x.dirs_allocated,
            });
        // What `du` of the cache directories would add: nginx's level directories.
        eprintln!(
            "lab coop: {tag}: nginx caches hold {} files, {} B apparent, {} B allocated; \
             their {} directories take {} B more",
            b.files, b.apparent, b.allocated, b.dirs, b.dirs_allocated
        );
        (b.apparent, b.allocated)
    };
    drop(sys);
    let m =
        farside_loadgen::Summary::merge(&summaries).map_err(|e| io::Error::other(e.to_string()))?;
    // The crashed node's counters: up to the kill, then its new process's from zero.
    let d = |key: &str| -> u64 {
        after
            .stats
            .iter()
            .zip(&before.stats)
            .enumerate()
            .map(|(i, (x, y))| match &crashed {
                Some(c) if c.node == i => {
                    stat(&c.stats_before_kill, key).saturating_sub(stat(y, key)) + stat(x, key)
                }
                _ => stat(x, key).saturating_sub(stat(y, key)),
            })
            .sum()
    };
    let (crash_failures, recovery_s, pre_crash_tps, crash_min_tps) = match (&crashed, crash) {
        (Some(_), Some((_, at_s))) => {
            let series: Vec<Vec<(u64, u64, u64)>> = summaries
                .iter()
                .map(|sm| {
                    sm.series
                        .iter()
                        .map(|x| (x.t_s, x.served, x.failures))
                        .collect()
                })
                .collect();
            crash_figures(&series, at_s).unwrap_or((0, -1.0, 0.0, 0.0))
        }
        _ => (0, 0.0, 0.0, 0.0),
    };
    let window = duration_s as f64;
    let served = m.served;
    let per_req = |v: u64| {
        if served == 0 {
            0.0
        } else {
            v as f64 / served as f64
        }
    };
    let (local, remote, miss) = (d("local_hits"), d("remote_hits"), d("misses"));
    let (local_frac, remote_frac, miss_frac) = if k.system == "haproxy" {
        // nginx answers what it caches; every origin read is a miss.
        let all = served.max(1) as f64;
        let miss_frac = (miss as f64 / all).min(1.0);
        (1.0 - miss_frac, 0.0, miss_frac)
    } else {
        let all = (local + remote + miss).max(1) as f64;
        (local as f64 / all, remote as f64 / all, miss as f64 / all)
    };
    let wrong = m.failure_kinds.wrong_bodies;
    // Where the time goes, per point (stderr: the run's log): the disks' utilisation and
    // queue, the nodes' requests in service, the stats reads' own latency.
    {
        let n = nodes.max(1) as f64;
        let reads = d("disk_reads");
        let mean = |f: &dyn Fn(&(u64, u64, f64)) -> f64| {
            queues.iter().map(f).sum::<f64>() / queues.len().max(1) as f64
        };
        let max_of = |key: &str| after.stats.iter().map(|t| stat(t, key)).max().unwrap_or(0);
        eprintln!(
            "lab coop: {tag}: window {window:.0} s: disk reads {:.1}/s per node, disk busy {:.3}, \
             mean disk wait {:.1} ms, disk queue mean {:.1} (max {} on a node), requests in a \
             node mean {:.1} (max {} of {WORKERS} workers), {} queue samples (stats read mean \
             {:.1} ms, max {:.1} ms), wasted fetches {} (udp resends {}), peer fetch mean {:.0} µs, misses \
             {miss} (fill followers {}, refused at the disk queue bound {}), served {served}",
            reads as f64 / window / n,
            d("disk_busy_us") as f64 / 1e6 / window / n,
            d("disk_wait_us") as f64 / 1e3 / reads.max(1) as f64,
            mean(&|q| q.1 as f64) / n,
            max_of("disk_queue_max"),
            mean(&|q| q.0 as f64) / n,
            max_of("inflight_max"),
            queues.len(),
            mean(&|q| q.2),
            queues.iter().map(|q| q.2).fold(0.0, f64::max),
            d("wasted_fetches"),
            d("peer_resends"),
            if remote == 0 {
                0.0
            } else {
                d("remote_fetch_us") as f64 / remote as f64
            },
            d("fill_followed"),
            d("disk_shed"),
        );
    }
    // The nodes' throttling and the host's busy time over the window, each taken once.
    let throttle = after.throttle.since(&before.throttle);
    let host_busy_ns = after.host_busy_ns.saturating_sub(before.host_busy_ns);
    Ok(CoopPoint {
        system: k.system.clone(),
        nodes: k.nodes,
        cache_bytes,
        link_gbit: k.link_gbit,
        message_overhead_us: k.message_overhead_us,
        overhead_spins: d("overhead_spins"),
        load_model: k.load_model.clone(),
        clients: k.clients,
        rate: k.rate,
        runs: 1,
        duration_s: window,
        tps: served as f64 / window,
        p50_ms: m.p50_ms,
        p99_ms: m.p99_ms,
        local_frac,
        remote_frac,
        miss_frac,
        wasted_fetches: d("wasted_fetches"),
        peer_bytes: d("peer_bytes"),
        peer_bytes_per_req: per_req(d("peer_bytes")),
        cpu_us_per_req: per_req(after.cpu_us.saturating_sub(before.cpu_us)),
        lb_cpu_us_per_req: if matches!(k.system.as_str(), "haproxy" | "lard" | "bounded-hash") {
            per_req(after.lb_cpu_us.saturating_sub(before.lb_cpu_us))
        } else {
            0.0
        },
        wrong_bodies: wrong,
        // A request a node refused (503: its disk queue at its bound) failed for its
        // client as much as one that timed out.
        failures: m.failures.saturating_sub(wrong) + m.dropped_503,
        failure_kinds: super::failures::of_run(&m.failure_kinds, m.dropped_503),
        offered_rps: m.started as f64 / window,
        directory_refused: d("directory_refused"),
        cache_held_bytes,
        cache_disk_bytes,
        peer_fetch_us: if remote == 0 {
            0.0
        } else {
            d("remote_fetch_us") as f64 / remote as f64
        },
        cache_held_mean_bytes: if held.is_empty() {
            0
        } else {
            held.iter().sum::<u64>() / held.len() as u64
        },
        cache_held_max_bytes: held.iter().copied().max().unwrap_or(0),
        nginx_cpu_us_per_req: per_req(after.nginx_cpu_us.saturating_sub(before.nginx_cpu_us)),
        throttled_period_frac: throttle.nr_throttled as f64 / throttle.nr_periods.max(1) as f64,
        host_busy_us_per_req: per_req(host_busy_ns) / 1000.0,
        host_busy_frac: host_busy_ns as f64 / 1e9 / window / crate::fabric::hostcpu::host_cpus(),
        host_ref_ns_per_op: host_ref,
        throttled_ms_per_s: throttle.throttled_us as f64 / 1000.0 / window / k.nodes.max(1) as f64,
        crash_node: crashed.as_ref().map(|c| c.node),
        crash_failures,
        restart_ms: crashed.as_ref().map_or(0.0, |c| c.restart_ms),
        recovery_s,
        pre_crash_tps,
        crash_min_tps,
        directory: a.directory.name().into(),
        directory_sent: d("directory_sent"),
        directory_sent_bytes: d("directory_sent_bytes"),
        directory_reads: d("directory_reads"),
        directory_read_ops: d("directory_read_ops"),
        directory_read_bytes: d("directory_read_bytes"),
        directory_read_failed: d("directory_read_failed"),
        directory_read_stale: d("directory_read_stale"),
        directory_writes: d("directory_writes"),
        directory_write_ops: d("directory_write_ops"),
        directory_write_bytes: d("directory_write_bytes"),
        directory_write_failed: d("directory_write_failed"),
        directory_slot_torn: d("directory_slot_torn"),
    })
}

#[cfg(test)]
#[path = "lab_tests.rs"]
mod tests;
