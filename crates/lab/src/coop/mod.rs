//! `farside lab coop`: cooperative caching (seed 003, PRESS) on real nodes.
//!
//! A virtual data-center (`--hosts netns`, root): `--nodes` back-end nodes running
//! `farside backend --coop` (each in its own namespace and cgroup, `--cpu-quota-pct` of
//! a CPU) and one client node. The files are the World Cup sample's objects (object
//! `i` at `/o/<i>`, its size from the trace, deterministic content per object so a
//! wrong body cannot pass for a right one). Closed-loop clients replay the trace,
//! spread round-robin over the nodes (as round-robin DNS), and check every body's
//! length and CRC32c against the object's.
//!
//! Systems: `rr` (each node caches on its own) and `press-tcp` (a node that misses asks
//! a peer whose directory says it caches the file, over TCP). Cache rule: every node
//! caches `ceil(W90 / nodes)` bytes, W90 the bytes of the most popular objects that
//! receive 90 % of the requests (6.9 MB): together the nodes can hold the hot set once,
//! which only cooperation can exploit.
//!
//! The run writes `table.txt` and `points.json` under `--out`.

mod client;

use crate::fabric::netns::{NodeSpec, VirtualDc};
use crate::fabric::procs::Child;
use farside_coop::trace::{world_cup_sample_path, Trace};
use serde::{Deserialize, Serialize};
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Nodes a run may have: 2 (the least that can cooperate) to 8 (the 2-CPU lab machine
/// cannot give more nodes a meaningful share).
pub const NODES_RANGE: std::ops::RangeInclusive<usize> = 2..=8;
/// Closed-loop clients per node at most: each is a thread of the lab process.
pub const CLIENTS_PER_NODE_MAX: usize = 64;
/// The HTTP port of every node.
const HTTP_PORT: u16 = 80;
/// The coop peer port (TCP fetches, UDP directory updates) of every node.
const PEER_PORT: u16 = 7000;
/// Fraction of requests whose objects' bytes set the cache size (see the module doc).
pub const CACHE_RULE_FRACTION: f64 = 0.9;
/// How long a node may take to listen.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// `farside lab coop`.
#[derive(Debug, Clone, clap::Args)]
pub struct CoopLabArgs {
    /// Back-end nodes (2..=8). Default: 4.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Systems compared, comma separated: rr, press-tcp. Default: both.
    #[arg(long, value_delimiter = ',', default_value = "rr,press-tcp")]
    pub systems: Vec<String>,
    /// Closed-loop clients per node. Default: 4.
    #[arg(long = "clients-per-node", default_value_t = 4)]
    pub clients_per_node: usize,
    /// Measured seconds per point. Default: 20.
    #[arg(long = "duration-s", default_value_t = 20)]
    pub duration_s: u64,
    /// Warm-up seconds per point (caches fill, directories spread). Default: 10.
    #[arg(long = "warmup-s", default_value_t = 10)]
    pub warmup_s: u64,
    /// CPU quota of each back-end node, percent of one CPU. Default: 40.
    #[arg(long = "cpu-quota-pct", default_value_t = 40)]
    pub cpu_quota_pct: u32,
    /// Emulated disk latency per read, µs (the back-end's --coop-disk-latency-us).
    #[arg(long = "disk-latency-us", default_value_t = farside_backend::coop::disk::DISK_LATENCY_US_DEFAULT)]
    pub disk_latency_us: u64,
    /// Cache bytes per node; default by the rule of the module doc.
    #[arg(long = "cache-bytes")]
    pub cache_bytes: Option<u64>,
    /// Short run for tests: 2 s warm-up, 3 s measured, 2 clients per node.
    #[arg(long)]
    pub quick: bool,
    /// Output directory. Default: lab-out/coop-<unix seconds>.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CoopPoint {
    pub system: String,
    pub nodes: usize,
    pub cache_bytes: u64,
    pub load_model: String,
    pub clients: usize,
    pub duration_s: f64,
    pub tps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub local_frac: f64,
    pub remote_frac: f64,
    pub miss_frac: f64,
    pub wasted_fetches: u64,
    pub peer_bytes: u64,
    pub directory_refused: u64,
    pub wrong_bodies: u64,
    pub errors: u64,
}

/// What a run produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CoopRun {
    pub experiment: String,
    pub quick: bool,
    pub cpu_quota_pct: u32,
    pub disk_latency_us: u64,
    pub points: Vec<CoopPoint>,
}

/// The content of object `id`, `len` bytes: distinct per object and position.
pub fn object_body(id: u64, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes every object of `trace` under `dir/o/<id>`; returns each one's CRC32c.
pub fn write_objects(trace: &Trace, dir: &Path) -> io::Result<Vec<u32>> {
    std::fs::create_dir_all(dir.join("o"))?;
    trace
        .object_bytes
        .iter()
        .enumerate()
        .map(|(id, &len)| {
            let body = object_body(id as u64, len as usize);
            std::fs::write(dir.join(format!("o/{id}")), &body)?;
            Ok(crc32c::crc32c(&body))
        })
        .collect()
}

/// Cache bytes per node by the rule of the module doc.
pub fn cache_rule(trace: &Trace, nodes: usize) -> u64 {
    trace
        .working_set_bytes(CACHE_RULE_FRACTION)
        .div_ceil(nodes as u64)
}

fn fail(m: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, m)
}

impl CoopLabArgs {
    fn validate(&mut self) -> io::Result<()> {
        if !NODES_RANGE.contains(&self.nodes) {
            return Err(fail(format!("--nodes must be in {NODES_RANGE:?}")));
        }
        if self.quick {
            self.warmup_s = 2;
            self.duration_s = 3;
            self.clients_per_node = 2;
        }
        if self.clients_per_node == 0 || self.clients_per_node > CLIENTS_PER_NODE_MAX {
            return Err(fail(format!(
                "--clients-per-node must be in 1..={CLIENTS_PER_NODE_MAX}"
            )));
        }
        if self.duration_s == 0 {
            return Err(fail("--duration-s must be at least 1".into()));
        }
        for s in &self.systems {
            if s != "rr" && s != "press-tcp" {
                return Err(fail(format!("--systems: unknown system {s:?}")));
            }
        }
        Ok(())
    }
}

fn node_name(i: usize) -> String {
    format!("n{i}")
}

/// Runs `farside lab coop`.
pub fn run(mut a: CoopLabArgs) -> io::Result<()> {
    a.validate()?;
    if !crate::fabric::netns::is_root() {
        return Err(fail(
            "lab coop needs root (one network namespace and cgroup per node)".into(),
        ));
    }
    let out = a.out.clone().unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        PathBuf::from(format!("lab-out/coop-{t}"))
    });
    std::fs::create_dir_all(&out)?;
    let trace = Trace::read_world_cup(&world_cup_sample_path())?;
    let cache_bytes = a.cache_bytes.unwrap_or_else(|| cache_rule(&trace, a.nodes));
    let work = std::env::temp_dir().join(format!("farside-lab-coop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let root = work.join("root");
    let crcs = Arc::new(write_objects(&trace, &root)?);
    let keys = crate::fabric::keys::LabKeys::generate(&["coop"])?;
    let mut specs: Vec<NodeSpec> = (0..a.nodes)
        .map(|i| NodeSpec::new(&node_name(i)).cpu_quota_pct(a.cpu_quota_pct))
        .collect();
    specs.push(NodeSpec::new("client"));
    let dc = VirtualDc::create(&format!("c{}", std::process::id() % 100_000), &specs)?;
    let mut points = Vec::new();
    let result = (|| -> io::Result<()> {
        for system in &a.systems {
            let p = run_point(
                &a,
                &dc,
                system,
                cache_bytes,
                &root,
                &keys,
                &trace,
                &crcs,
                &out,
            )?;
            eprintln!(
                "lab coop: {} nodes={} tps={:.0} p99={:.1}ms local={:.3} remote={:.3} miss={:.3} wrong={}",
                p.system, p.nodes, p.tps, p.p99_ms, p.local_frac, p.remote_frac, p.miss_frac,
                p.wrong_bodies
            );
            points.push(p);
        }
        Ok(())
    })();
    let _ = dc.destroy();
    let _ = std::fs::remove_dir_all(&work);
    result?;
    let run = CoopRun {
        experiment: "coop".into(),
        quick: a.quick,
        cpu_quota_pct: a.cpu_quota_pct,
        disk_latency_us: a.disk_latency_us,
        points,
    };
    let table = table(&run);
    print!("{table}");
    std::fs::write(out.join("table.txt"), &table)?;
    let mut f = std::fs::File::create(out.join("points.json"))?;
    serde_json::to_writer_pretty(&mut f, &run)?;
    writeln!(f)?;
    eprintln!("lab coop: wrote {}", out.display());
    Ok(())
}

/// The text table of a run.
pub fn table(run: &CoopRun) -> String {
    let mut s = format!(
        "lab coop: World Cup sample, closed loop, cpu quota {}% per node, disk latency {} us\n",
        run.cpu_quota_pct, run.disk_latency_us
    );
    s += &format!(
        "{:<10} {:>5} {:>11} {:>7} {:>8} {:>8} {:>6} {:>6} {:>6} {:>7} {:>6} {:>6}\n",
        "system",
        "nodes",
        "cache_B",
        "clients",
        "tps",
        "p99_ms",
        "local",
        "remote",
        "miss",
        "wasted",
        "wrong",
        "errors"
    );
    for p in &run.points {
        s += &format!(
            "{:<10} {:>5} {:>11} {:>7} {:>8.1} {:>8.2} {:>6.3} {:>6.3} {:>6.3} {:>7} {:>6} {:>6}\n",
            p.system,
            p.nodes,
            p.cache_bytes,
            p.clients,
            p.tps,
            p.p99_ms,
            p.local_frac,
            p.remote_frac,
            p.miss_frac,
            p.wasted_fetches,
            p.wrong_bodies,
            p.errors
        );
    }
    s
}

#[allow(clippy::too_many_arguments)]
fn run_point(
    a: &CoopLabArgs,
    dc: &VirtualDc,
    system: &str,
    cache_bytes: u64,
    root: &Path,
    keys: &crate::fabric::keys::LabKeys,
    trace: &Trace,
    crcs: &Arc<Vec<u32>>,
    out: &Path,
) -> io::Result<CoopPoint> {
    let ips: Vec<Ipv4Addr> = (0..a.nodes).map(|i| dc.node_ip(&node_name(i))).collect();
    let peers: Vec<String> = ips.iter().map(|ip| format!("{ip}:{PEER_PORT}")).collect();
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let name = node_name(i);
        let mut args: Vec<String> = vec![
            "backend".into(),
            "--listen".into(),
            format!("{ip}:{HTTP_PORT}"),
            "--root".into(),
            root.display().to_string(),
            "--workers".into(),
            (a.clients_per_node * 2).max(8).to_string(),
            "--coop".into(),
            "--coop-cache-bytes".into(),
            cache_bytes.to_string(),
            "--coop-disk-latency-us".into(),
            a.disk_latency_us.to_string(),
        ];
        if system == "press-tcp" {
            args.extend([
                "--coop-policy".into(),
                "press".into(),
                "--coop-index".into(),
                i.to_string(),
                "--coop-peers".into(),
                peers.join(","),
                "--coop-key-file".into(),
                keys.path("coop").display().to_string(),
            ]);
        } else {
            args.extend(["--coop-policy".into(), "rr".into()]);
        }
        let log = out.join(format!("{system}-{name}.log"));
        let child = dc.spawn_in(&name, &exe, &args, &log)?;
        children.push(Child::adopt(&name, child, log));
    }
    let addrs: Vec<SocketAddr> = ips
        .iter()
        .map(|ip| SocketAddr::from((*ip, HTTP_PORT)))
        .collect();
    for (c, addr) in children.iter_mut().zip(&addrs) {
        crate::fabric::wait_port(
            c,
            *addr,
            crate::fabric::Vantage::Node(dc, "client"),
            READY_WITHIN,
            Duration::from_millis(50),
        )?;
    }
    let spec = client::Spec {
        targets: addrs.clone(),
        clients: a.nodes * a.clients_per_node,
        warmup: Duration::from_secs(a.warmup_s),
        duration: Duration::from_secs(a.duration_s),
        requests: Arc::new(trace.requests.clone()),
        crcs: Arc::clone(crcs),
    };
    let m = dc.run_in_ns("client", move || client::run(&spec))?;
    for c in &mut children {
        c.check_alive()?;
        c.stop();
    }
    let d = |k: &str| -> u64 {
        m.stats_after
            .iter()
            .zip(&m.stats_before)
            .map(|(after, before)| client::stat(after, k).saturating_sub(client::stat(before, k)))
            .sum()
    };
    let (local, remote, miss) = (d("local_hits"), d("remote_hits"), d("misses"));
    let all = (local + remote + miss).max(1) as f64;
    Ok(CoopPoint {
        system: system.to_string(),
        nodes: a.nodes,
        cache_bytes,
        load_model: "closed".into(),
        clients: a.nodes * a.clients_per_node,
        duration_s: m.window_s,
        tps: m.served as f64 / m.window_s,
        p50_ms: m.percentile_ms(0.50),
        p99_ms: m.percentile_ms(0.99),
        local_frac: local as f64 / all,
        remote_frac: remote as f64 / all,
        miss_frac: miss as f64 / all,
        wasted_fetches: d("wasted_fetches"),
        peer_bytes: d("peer_bytes"),
        directory_refused: d("directory_refused"),
        wrong_bodies: m.wrong_bodies,
        errors: m.errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_differ_and_the_cache_rule_splits_the_hot_set() {
        assert_ne!(object_body(1, 64), object_body(2, 64));
        assert_eq!(object_body(7, 100)[..50], object_body(7, 50)[..]);
        let t = Trace::read_world_cup(&world_cup_sample_path()).unwrap();
        let w = t.working_set_bytes(CACHE_RULE_FRACTION);
        assert_eq!(cache_rule(&t, 4), w.div_ceil(4));
        assert!(cache_rule(&t, 4) * 4 >= w);
    }
}
