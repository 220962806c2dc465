//! `farside model coop --calibrate`: the costs the cooperative-caching model needs,
//! measured on this host with the real code paths of `farside backend --coop`, the way
//! `farside lab coop` incurs them, over a synthetic workload that is none of the compared
//! configurations.
//!
//! The set-up is the lab's: `--calibrate-nodes` back-end nodes (default 4, the lab's;
//! this binary's `backend --coop`, the lab's 64 workers) in network namespaces on the
//! lab's bridge, each at `--calibrate-cpu-quota-pct` % of a CPU (default the lab's 40),
//! and the lab's client, `farside loadgen` (in this process, in the client's namespace),
//! one instance per node driven with [`LAB_CLIENTS_PER_NODE`] closed-loop clients that
//! replay *sessions* on fresh connections and check every body against its file, as the
//! lab's do. The shape is recorded in the costs file (`shape`): the host's cost per
//! request grows with the nodes it carries, so a configuration is best checked with costs
//! calibrated in its own shape. The trace is
//! synthetic: fixed objects of each size in [`SIZES`], split into one set per node, in
//! sessions of [`SESSION_REQUESTS`] requests (the World Cup sample's mean session).
//! Each node's CPU is its cgroup's (ns), the clients' is this process's; the requests are
//! the nodes' own counters (`/coop/stats`) over the measured window. Phases, each per size:
//! - `local`: PRESS nodes over tcp, every node's set cached at it; every client asks its
//!   node for that node's set: all local hits, CPU per request over all nodes;
//! - `miss`: `rr` nodes whose cache holds nothing (1 byte), disk emulation at 0: all
//!   misses; the extra CPU of reading and checksumming a file over a local hit;
//! - `fetch-<t>-initial|service|softirq` per peer transport `t` (tcp, udp, xdp, shm):
//!   PRESS nodes over `t`, each set cached at its node; the clients of each node of
//!   the first half ask for the set of its partner in the second half (of 4 nodes:
//!   nodes 0 and 1 for the sets of 2 and 3): all remote hits. The initial nodes' CPU over the
//!   local phase's, the service nodes' CPU, the host's softirq (`/proc/stat`);
//! - in every lab-shaped phase also the host's busy time (`/proc/stat`, every CPU:
//!   user + nice + system + irq + softirq + steal) per request of the phase's kind: a
//!   tick is counted once whatever ran in it, so the load generators, the nodes, the
//!   softirq of client and peer traffic and kernel threads are all inside and none
//!   twice. `host-local` is a local hit's, `host-miss` and `host-fetch-<t>` are taken
//!   over it size by size. The share of busy time the phase's own processes do not
//!   explain is recorded, and a phase above [`HOST_UNATTRIBUTED_WARN`] is warned about
//!   (another workload on the host);
//! - light load, for the delay (`DelayCosts`): after each size's `local`, `fetch-<t>`
//!   and `miss` phase, the same nodes driven by ONE closed-loop client in all (no request
//!   ever waits for another): its measured time per request (window over requests, its
//!   cycle `N / X` at `N` = 1, from the load generator's own window; its mean latency is
//!   recorded beside) less the model's own answer for that phase at one client
//!   (`validate::light_cycle_ns`, the sum of its demands under the costs just measured)
//!   is the delay no service demand holds; a miss's and each fetch's over a local hit's,
//!   size by size; a difference below 0 is clamped to 0 and recorded;
//! - `disk`: the emulated disk (`coop::disk::Disk`, the lab's 5 ms + size / 40 MB/s),
//!   wall time per read (the sleep's overshoot is real service time);
//! - `directory`: one directory update built, encoded, sealed and sent, and received,
//!   authenticated and decoded (`coop::wire`, `coop::seal`), CPU per update.
//!
//! Each cost is a least-squares line `a + b x KB` over the sizes.

use farside_backend::coop::disk::Disk;
use farside_backend::coop::seal::Sealer;
use farside_backend::coop::wire::DirectoryUpdate;
use farside_coop::directory::{BloomFilter, BLOOM_FP_DEFAULT};
use farside_coop::sim::Costs;
use farside_coop::validate::{
    combine_sets, light_cycle_ns, light_delay_ns, median, unattributed_share, CalibrationShape,
    CostSet, CostsFile, DelayCosts, DelayPhase, DiskEmulation, HostFetchCosts, HostPhase,
    HostWideCosts, LightKind, Pick, Provenance, Sample, Setup, Spread, TransportCosts,
    COSTS_FORMAT, DELAY_CLIENTS,
};
use farside_lab::fabric::hostspeed;
use farside_lab::fabric::keys::LabKeys;
use farside_lab::fabric::netns::{NodeSpec, VirtualDc};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod clocks;
mod cluster;
mod provenance;
use clocks::thread_cpu_ns;
use cluster::{
    dominant, light_phase_name, node_name, warmup_s, Cluster, Env, LightRaw,
    CALIBRATION_DISK_BYTES_PER_S, CLIENT, LAB_WORKERS,
};
pub use cluster::{HOST_UNATTRIBUTED_WARN, TRANSPORTS};
#[cfg(test)]
use farside_lab::fabric::hostcpu::{parse_proc_stat, HostTicks};
use provenance::{git, load_avg, read_trim, utc_now};

/// Body sizes measured, bytes: from a small page to the World Cup sample's larger
/// images (its mean request is about 5 KB).
pub const SIZES: [u64; 4] = [512, 4096, 16_384, 65_536];
/// Objects per size in each node's set: more than a node's clients ask for at once, so
/// sessions see distinct objects.
const OBJECTS_PER_SET: usize = 32;
/// The lab's closed-loop clients per node (`farside lab coop --clients-per-node`).
pub const LAB_CLIENTS_PER_NODE: usize = 4;
/// Requests per session of the synthetic trace: the World Cup sample's mean session
/// (199,999 requests from 17,505 clients: 11.4), so connections open and close as
/// often as in the lab's replay.
pub const SESSION_REQUESTS: usize = 11;
/// Sessions per node set in the synthetic trace (the load generator wraps around).
const SESSIONS_PER_SET: usize = 64;
/// Measured time of each phase and size, s (`--calibrate-seconds`): 1 s holds 2,000 to
/// 40,000 requests at the lab's quota and 150 busy ticks of the host; two calibrations
/// with 3 s windows differed by 10-50 % per phase, far beyond what a window's count
/// (under 2 %) or its ticks (under 1 %) explain: the variation is between windows, so
/// more, shorter windows ([`CALIBRATE_REPEATS_DEFAULT`]) buy more than longer ones. The
/// bounds keep a typo from taking hours.
pub const CALIBRATE_SECONDS_DEFAULT: f64 = 1.0;
pub const CALIBRATE_SECONDS_RANGE: std::ops::RangeInclusive<f64> = 0.2..=60.0;
/// Repeats of every pair of base and measured phase (`--calibrate-repeats`): 5, so the
/// median stands with up to two repeats off on either side, and the whole calibration
/// (40 lab-shaped phases per repeat, 24 light ones) stays under about 8 minutes at 1 s
/// windows. The bounds keep a typo from taking hours.
pub const CALIBRATE_REPEATS_DEFAULT: usize = 5;
pub const CALIBRATE_REPEATS_RANGE: std::ops::RangeInclusive<usize> = 1..=20;

/// Time for a press node's directory to reach its peers: many publication periods
/// (20 ms) and beyond the 500 ms heartbeat.
const DIRECTORY_SETTLE: Duration = Duration::from_millis(1200);
/// The lab's disk emulation (`farside lab coop` defaults).
const LAB_DISK_LATENCY_US: u64 = 5_000;
const LAB_DISK_BYTES_PER_S: u64 = 40_000_000;
/// Reads per size of the disk phase.
const DISK_READS: usize = 20;
/// Directory updates per directory phase, and the objects each one's filter holds (a
/// lab node's cache holds a few hundred objects).
const DIRECTORY_UPDATES: usize = 2000;
const DIRECTORY_OBJECTS: usize = 400;
/// Requests a lab-shaped phase must count at least (`--calibrate-requests`): bounds.
pub const CALIBRATE_REQUESTS_RANGE: std::ops::RangeInclusive<u64> = 100..=1_000_000;

fn err(what: impl std::fmt::Display) -> String {
    format!("calibrate: {what}")
}

/// The calibration's files (`o/<size>-<node>-<i>`, distinct content) and, per size and
/// node, that node's set and a synthetic World Cup-format trace of sessions over it.
struct Objects {
    dir: PathBuf,
    /// `sets[size][node]`: the set's paths.
    sets: Vec<Vec<Vec<String>>>,
    /// `traces[size][node]`: the trace file of sessions over that set.
    traces: Vec<Vec<PathBuf>>,
}

/// A synthetic trace in the World Cup sample's format: `sessions` trace clients, each
/// asking for [`SESSION_REQUESTS`] of `paths` in turn (every one a 200 of `bytes`).
pub fn session_trace(paths: &[String], bytes: u64, sessions: usize) -> String {
    let mut out = String::from("timestamp,client_id,url,status,size\n");
    let mut k = 0;
    for c in 0..sessions {
        for r in 0..SESSION_REQUESTS {
            let path = &paths[k % paths.len().max(1)];
            k += 1;
            out.push_str(&format!(
                "{},{c},{path},200,{bytes}\n",
                893_973_604 + c * 10 + r
            ));
        }
    }
    out
}

impl Objects {
    /// Writes the sets of `nodes` nodes.
    fn write(nodes: usize) -> Result<Objects, String> {
        let dir = std::env::temp_dir().join(format!("farside-calib-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("o")).map_err(err)?;
        std::fs::create_dir_all(dir.join("traces")).map_err(err)?;
        let (mut sets, mut traces) = (Vec::new(), Vec::new());
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for &size in &SIZES {
            let (mut s, mut t) = (Vec::new(), Vec::new());
            for node in 0..nodes {
                let mut set = Vec::new();
                for i in 0..OBJECTS_PER_SET {
                    let body: Vec<u8> = (0..size)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x as u8
                        })
                        .collect();
                    let name = format!("/o/{size}-{node}-{i}");
                    std::fs::write(dir.join(&name[1..]), &body).map_err(err)?;
                    set.push(name);
                }
                let trace = dir.join(format!("traces/{size}-{node}.csv"));
                std::fs::write(&trace, session_trace(&set, size, SESSIONS_PER_SET)).map_err(err)?;
                s.push(set);
                t.push(trace);
            }
            sets.push(s);
            traces.push(t);
        }
        Ok(Objects { dir, sets, traces })
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Least-squares line through `(kb, ns)`: `(a, b)` with `ns = a + b kb`, both at least 0.
pub fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if points.is_empty() {
        return (0.0, 0.0);
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let b = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
    ((my - b * mx).max(0.0), b)
}

/// A measured point of a fit: body KB and ns.
type Point = (f64, f64);

/// Records a sample (phase, body bytes, requests counted, ns per request, repeat) and
/// gives its point.
type SampleFn<'a> = dyn FnMut(&str, u64, u64, f64, Option<usize>) -> Point + 'a;

fn kb(bytes: u64) -> f64 {
    bytes as f64 / 1024.0
}

/// The two phases of one repeat and size in a set-up, in the order they run: the base
/// phase (local hits) and right after it the measured phase (remote hits or misses), so
/// a drift of the host over the calibration reaches both terms of their difference.
/// Repeat by repeat, size by size: `(repeat, size index, measured)` with `measured`
/// false for the base phase.
pub fn interleaved(repeats: usize, sizes: usize) -> Vec<(usize, usize, bool)> {
    let mut out = Vec::with_capacity(repeats * sizes * 2);
    for r in 0..repeats {
        for i in 0..sizes {
            out.push((r, i, false));
            out.push((r, i, true));
        }
    }
    out
}

/// What a measured phase costs over its paired base phase, per request: the difference,
/// at least 0 (a cost below the base's is noise, not a saving).
pub fn over_base(measured_ns: f64, base_ns: f64) -> f64 {
    (measured_ns - base_ns).max(0.0)
}

/// Measures the costs (see the module doc), every lab-shaped phase `repeats` times; a
/// lab-shaped phase that counts fewer than `requests` requests is reported.
pub fn calibrate(
    requests: u64,
    seconds: f64,
    repeats: usize,
    shape: CalibrationShape,
) -> Result<CostsFile, String> {
    if !CALIBRATE_REQUESTS_RANGE.contains(&requests) {
        return Err(err(format!(
            "--calibrate-requests must be in {CALIBRATE_REQUESTS_RANGE:?}"
        )));
    }
    if !CALIBRATE_SECONDS_RANGE.contains(&seconds) {
        return Err(err(format!(
            "--calibrate-seconds must be in {CALIBRATE_SECONDS_RANGE:?}"
        )));
    }
    if !CALIBRATE_REPEATS_RANGE.contains(&repeats) {
        return Err(err(format!(
            "--calibrate-repeats must be in {CALIBRATE_REPEATS_RANGE:?}"
        )));
    }
    if !farside_lab::fabric::netns::is_root() {
        return Err(err(
            "the phases run nodes in network namespaces with CPU quotas: run as root",
        ));
    }
    let load0 = load_avg();
    let started = Instant::now();
    let objects = Objects::write(shape.nodes)?;
    let mut samples = Vec::new();
    let mut sample = |phase: &str, bytes: u64, counted: u64, ns: f64, repeat: Option<usize>| {
        eprintln!(
            "calibrate: [{:>5.0} s] {phase:<22} {bytes:>6} B  {:>9.1} us  ({counted} requests{})",
            started.elapsed().as_secs_f64(),
            ns / 1e3,
            repeat.map_or(String::new(), |r| format!(", repeat {}", r + 1))
        );
        if counted < requests {
            eprintln!("calibrate: warning: {phase} at {bytes} B counted {counted} requests, fewer than {requests}");
        }
        samples.push(Sample {
            phase: phase.into(),
            body_bytes: bytes,
            requests: counted,
            ns_per_request: ns,
            repeat,
        });
        (kb(bytes), ns)
    };
    let lab = lab_phases(&objects, shape, seconds, repeats, &mut sample)?;
    let r = |x: f64| x.round() as u64;
    let defaults = Costs::default();
    let mut sets = Vec::with_capacity(repeats);
    for (k, rep) in lab.reps.iter().enumerate() {
        // The emulated disk, as the lab configures it.
        let disk = Disk::new(LAB_DISK_LATENCY_US, LAB_DISK_BYTES_PER_S);
        let mut disk_pts = Vec::new();
        for (i, &size) in SIZES.iter().enumerate() {
            let path = objects.dir.join(&objects.sets[i][0][0][1..]);
            let t0 = Instant::now();
            for _ in 0..DISK_READS {
                disk.read(&path).map_err(err)?;
            }
            let ns = t0.elapsed().as_nanos() as f64 / DISK_READS as f64;
            disk_pts.push(sample("disk", size, DISK_READS as u64 * 1000, ns, Some(k)));
        }
        let (d_access, d_kb) = fit(&disk_pts);
        // Directory updates: build + encode + seal + send to one peer; receive + decode.
        let (build_ns, send_ns, apply_ns) = directory_costs()?;
        let dn = DIRECTORY_UPDATES as u64 * 1000;
        sample("directory-build", 0, dn, build_ns, Some(k));
        sample("directory-send", 0, dn, send_ns, Some(k));
        sample("directory-apply", 0, dn, apply_ns, Some(k));
        let tcp = rep
            .transports
            .iter()
            .find(|t| t.transport == "tcp")
            .ok_or_else(|| err("no tcp phase"))?
            .clone();
        let (l_a, l_b) = fit(&rep.local);
        let (m_a, m_b) = fit(&rep.miss);
        let (c_a, c_b) = fit(&rep.client);
        let (hl_a, hl_b) = fit(&rep.host_local);
        let (hm_a, hm_b) = fit(&rep.host_miss);
        sets.push(CostSet {
            costs: Costs {
                cpu_request_ns: r(l_a),
                cpu_per_kb_ns: r(l_b),
                disk_access_ns: r(d_access),
                disk_per_kb_ns: r(d_kb),
                nic_per_kb_ns: 0,
                cpu_read_chunk_ns: defaults.cpu_read_chunk_ns,
                cpu_xdp_chunk_ns: defaults.cpu_xdp_chunk_ns,
                cpu_forward_ns: r(tcp.initial_ns),
                cpu_forward_per_kb_ns: r(tcp.initial_per_kb_ns),
                cpu_peer_serve_ns: r(tcp.service_ns),
                cpu_peer_serve_per_kb_ns: r(tcp.service_per_kb_ns),
                cpu_miss_ns: r(m_a),
                cpu_miss_per_kb_ns: r(m_b),
                cpu_directory_build_ns: r(build_ns),
                cpu_directory_send_ns: r(send_ns),
                cpu_directory_apply_ns: r(apply_ns),
            },
            client_request_ns: c_a,
            client_per_kb_ns: c_b,
            transports: rep.transports.clone(),
            host_local_ns: hl_a,
            host_local_per_kb_ns: hl_b,
            host_miss_ns: hm_a,
            host_miss_per_kb_ns: hm_b,
            host_fetch: rep.host_fetch.clone(),
            disk_access_ns: d_access,
            disk_per_kb_ns: d_kb,
        });
    }
    let med = combine_sets(&sets, Pick::Median).map_err(err)?;
    let low = combine_sets(&sets, Pick::Min).map_err(err)?;
    let high = combine_sets(&sets, Pick::Max).map_err(err)?;
    let share = unattributed_share(&lab.host_phases);
    eprintln!(
        "calibrate: host-wide busy time: {:.0} % of it not explained by the nodes, this process \
         and softirq over all phases (below 0: softirq counted in a task's time too)",
        share * 100.0
    );
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]);
    let mut file = CostsFile {
        format: COSTS_FORMAT.into(),
        shape,
        provenance: Provenance {
            commit: git(&["rev-parse", "HEAD"]),
            tree_dirty: !dirty.is_empty() && dirty != "unknown",
            kernel: read_trim("/proc/sys/kernel/osrelease"),
            host: read_trim("/proc/sys/kernel/hostname"),
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
            .into(),
            measured_at: utc_now(),
            load_avg: [load0, load_avg()],
            method: format!(
                "farside model coop --calibrate, lab-shaped: {} nodes (backend --coop, \
                 {LAB_WORKERS} workers) in network namespaces on the lab's bridge at \
                 {} % of a CPU each; farside loadgen in the client namespace, \
                 one instance per driven node, {LAB_CLIENTS_PER_NODE} closed-loop clients each \
                 replaying sessions of {SESSION_REQUESTS} requests on fresh connections, every \
                 body checked; synthetic trace: {OBJECTS_PER_SET} objects per node and size; \
                 {:.2} s warm-up + {seconds} s measured per phase; {repeats} repeats; \
                 per transport one PRESS set-up, in it per repeat and size an all-local phase \
                 (each node's set) then right after it an all-remote phase (the first half of the \
                 nodes each asked for the set of its partner in the second half), the fetch taken over that local phase; misses: \
                 two rr set-ups side by side (caches of 256 MB and of 1 byte, disk 0), per \
                 repeat and size an all-local then an all-miss phase, the miss taken over \
                 that local phase; local hit and client costs from the tcp set-up's local \
                 phases; node CPU from each node's cgroup (ns), client CPU of this process \
                 (CLOCK_PROCESS_CPUTIME_ID), requests from the nodes' counters, host softirq \
                 from /proc/stat (ticks); host-wide busy time per request in every lab-shaped \
                 phase from /proc/stat (all CPUs: user + nice + system + irq + softirq + \
                 steal, ticks), miss and fetch over their paired local phase size by size; \
                 each repeat's costs least-squares lines over the sizes, the file's costs the \
                 per-cost median over the repeats (spread: each cost's lowest and highest); \
                 delay: in the first repeat, after each lab-shaped phase pair the same nodes \
                 and objects driven by {DELAY_CLIENTS} closed-loop client in all, its time per \
                 request (its window over its requests) less the model's own answer at one \
                 client, miss and fetch over local size by size, below 0 clamped to 0; disk: \
                 wall time of coop::disk::Disk reads, once per repeat; directory: CPU \
                 (CLOCK_THREAD_CPUTIME_ID) of {DIRECTORY_UPDATES} updates of \
                 {DIRECTORY_OBJECTS} objects, once per repeat; NIC 0 (veth without a rate limit)",
                shape.nodes,
                shape.cpu_quota_pct,
                warmup_s(seconds)
            ),
        },
        costs: med.costs.clone(),
        disk: DiskEmulation {
            configured_latency_us: LAB_DISK_LATENCY_US,
            configured_bytes_per_s: LAB_DISK_BYTES_PER_S,
            measured_access_ns: med.disk_access_ns,
            measured_per_kb_ns: med.disk_per_kb_ns,
        },
        client_request_ns: med.client_request_ns,
        client_per_kb_ns: med.client_per_kb_ns,
        transports: med.transports.clone(),
        host_wide: Some(HostWideCosts {
            local_ns: med.host_local_ns,
            local_per_kb_ns: med.host_local_per_kb_ns,
            miss_ns: med.host_miss_ns,
            miss_per_kb_ns: med.host_miss_per_kb_ns,
            fetch: med.host_fetch.clone(),
            unattributed_share: share,
            unattributed_warn: HOST_UNATTRIBUTED_WARN,
            phases: lab.host_phases,
            reference_ns_per_op: median(&lab.references),
        }),
        delay: None,
        spread: Some(Spread {
            repeats,
            rule: format!(
                "{repeats} repeats; in each set-up, per repeat and size, the base phase (all \
                 local) then the measured phase (all remote, or all miss) right after it, each \
                 with its own {:.2} s warm-up and {seconds} s window; a difference is taken \
                 within one repeat and size; each repeat's costs are least-squares lines over \
                 the sizes; the file's costs are each cost's median over the repeats, low and \
                 high each cost's lowest and highest (each on its own)",
                warmup_s(seconds)
            ),
            low,
            high,
            per_repeat: sets,
        }),
        samples,
    };
    // The delay: the light phases against the model's own answer at one client, in the
    // calibration's set-up (its nodes at their quota, disk emulation at 0, this host).
    let setup = Setup {
        system: String::new(),
        nodes: shape.nodes,
        cache_bytes: 0,
        clients_per_node: DELAY_CLIENTS,
        cpu_share: shape.cpu_share(),
        disk_latency_us: 0,
        disk_bytes_per_s: CALIBRATION_DISK_BYTES_PER_S,
        link_gbit: None,
        warmup_s: warmup_s(seconds),
        duration_s: seconds,
        publish_ms: farside_coop::validate::LAB_PUBLISH_MS_DEFAULT,
        cpu_speedup: 1.0,
        shared_host_cpus: Some(file.provenance.cpus as f64),
        lab_repeats: 1,
    };
    let delay = delay_costs(&file, &setup, &lab.light)?;
    eprintln!(
        "calibrate: delay per request: local hit {:.1} us + {:.2} us/KB; miss +{:.1} us + {:.2} us/KB{}; {} clamped to 0",
        delay.local_ns / 1e3,
        delay.local_per_kb_ns / 1e3,
        delay.miss_ns / 1e3,
        delay.miss_per_kb_ns / 1e3,
        delay
            .fetch
            .iter()
            .map(|f| format!("; fetch over {} +{:.1} us + {:.2} us/KB", f.transport, f.ns / 1e3, f.per_kb_ns / 1e3))
            .collect::<String>(),
        delay.clamped.len()
    );
    file.delay = Some(delay);
    eprintln!(
        "calibrate: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(file)
}

/// CPU per directory update (ns): built and encoded once, sealed and sent per peer,
/// received, authenticated and decoded per peer.
fn directory_costs() -> Result<(f64, f64, f64), String> {
    let key = || farside_auth::siphash::SipKey::from_halves(0x0123_4567, 0x89ab_cdef);
    let owner = Sealer::new(key(), 0).map_err(err)?;
    let peer = Sealer::new(key(), 1).map_err(err)?;
    let replay = Mutex::new(farside_auth::replay::ReplayTable::new(8));
    let tx = UdpSocket::bind("127.0.0.1:0").map_err(err)?;
    let rx = UdpSocket::bind("127.0.0.1:0").map_err(err)?;
    let to = rx.local_addr().map_err(err)?;
    let mut buf = vec![0u8; 64 * 1024];
    let (mut build, mut send, mut apply) = (0u64, 0u64, 0u64);
    for e in 0..DIRECTORY_UPDATES {
        let t0 = thread_cpu_ns();
        let mut filter = BloomFilter::for_objects(DIRECTORY_OBJECTS, BLOOM_FP_DEFAULT);
        for id in 0..DIRECTORY_OBJECTS as u64 {
            filter.insert(id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ e as u64);
        }
        let update = DirectoryUpdate {
            node: 0,
            load: 3,
            epoch: 2 * (e as u64 + 1),
            filter,
        };
        let bytes = update.encode();
        let t1 = thread_cpu_ns();
        let (sealed, _) = owner.seal(&bytes);
        tx.send_to(&sealed, to).map_err(err)?;
        let t2 = thread_cpu_ns();
        let (n, _) = rx.recv_from(&mut buf).map_err(err)?;
        let (_, msg) = peer.receive(&buf[..n], &replay).map_err(err)?;
        DirectoryUpdate::decode(msg).ok_or_else(|| err("directory update did not decode"))?;
        let t3 = thread_cpu_ns();
        build += t1 - t0;
        send += t2 - t1;
        apply += t3 - t2;
    }
    let n = DIRECTORY_UPDATES as f64;
    Ok((build as f64 / n, send as f64 / n, apply as f64 / n))
}

/// One repeat's points of the lab-shaped phases, each a cost per size.
#[derive(Debug, Default)]
struct RepPoints {
    /// CPU per local hit (the tcp set-up's local phases).
    local: Vec<Point>,
    client: Vec<Point>,
    /// Extra CPU of a miss over a local hit (its paired rr local phase).
    miss: Vec<Point>,
    /// Each transport's lines, the initial node's over its paired local phase.
    transports: Vec<TransportCosts>,
    /// Host-wide busy time per local hit.
    host_local: Vec<Point>,
    /// Host-wide busy time of a miss over its paired local hit.
    host_miss: Vec<Point>,
    /// Host-wide busy time of a peer fetch over its paired local hit, per transport.
    host_fetch: Vec<HostFetchCosts>,
}

/// The costs of the lab-shaped phases.
struct LabCosts {
    /// One per repeat.
    reps: Vec<RepPoints>,
    host_phases: Vec<HostPhase>,
    /// The light-load phases (one client in all), for the delay.
    light: Vec<LightRaw>,
    /// The host speed reference before each set-up (busy ns per round trip).
    references: Vec<f64>,
}

/// The delay costs from the light phases (see [`DelayCosts`]): each phase's measured time
/// per request less the model's own answer for it at one client under the costs of `f`
/// (the calibration's set-up `s`), clamped at 0; a miss's and each fetch's over a local
/// hit's size by size, clamped at 0; lines over the sizes. Every clamp is recorded.
fn delay_costs(f: &CostsFile, s: &Setup, light: &[LightRaw]) -> Result<DelayCosts, String> {
    let mut phases = Vec::new();
    let mut clamped = Vec::new();
    let mut delays: Vec<(LightKind, u64, f64)> = Vec::new();
    for l in light {
        let model = light_cycle_ns(f, s, l.kind, l.bytes).map_err(err)?;
        let (d, below) = light_delay_ns(l.measured_ns(), model);
        let raw = l.measured_ns() - model;
        if below {
            clamped.push(format!(
                "{} at {} B: {:.1} us",
                l.phase(),
                l.bytes,
                raw / 1e3
            ));
        }
        eprintln!(
            "calibrate: delay {:<16} {:>6} B  measured {:>8.1} us - model {:>8.1} us = {:>8.1} us{}",
            l.phase(),
            l.bytes,
            l.measured_ns() / 1e3,
            model / 1e3,
            raw / 1e3,
            if below { " (below 0: clamped to 0)" } else { "" }
        );
        phases.push(DelayPhase {
            phase: l.phase(),
            body_bytes: l.bytes,
            requests: l.requests,
            window_ns: l.window_ns,
            measured_ns: l.measured_ns(),
            latency_mean_ns: l.latency_mean_ns,
            model_ns: model,
            delay_ns: raw,
        });
        delays.push((l.kind, l.bytes, d));
    }
    let of = |kind: LightKind| -> Vec<(u64, f64)> {
        delays
            .iter()
            .filter(|(k, _, _)| *k == kind)
            .map(|(_, b, d)| (*b, *d))
            .collect()
    };
    let local = of(LightKind::Local);
    // The extra of `kind` over a local hit, size by size.
    let mut over_local = |kind: LightKind| -> Result<Vec<Point>, String> {
        of(kind)
            .into_iter()
            .map(|(b, d)| {
                let l = local
                    .iter()
                    .find(|(lb, _)| *lb == b)
                    .map(|(_, d)| *d)
                    .ok_or_else(|| err(format!("no light local phase at {b} B")))?;
                if d < l {
                    clamped.push(format!(
                        "{} over local at {b} B: {:.1} us",
                        light_phase_name(kind),
                        (d - l) / 1e3
                    ));
                }
                Ok((kb(b), (d - l).max(0.0)))
            })
            .collect()
    };
    let (ma, mb) = fit(&over_local(LightKind::Miss)?);
    let mut fetch = Vec::new();
    for t in TRANSPORTS {
        let (a, b) = fit(&over_local(LightKind::Fetch(t))?);
        fetch.push(HostFetchCosts {
            transport: t.to_string(),
            ns: a,
            per_kb_ns: b,
        });
    }
    let (la, lb) = fit(&local.iter().map(|(b, d)| (kb(*b), *d)).collect::<Vec<_>>());
    Ok(DelayCosts {
        local_ns: la,
        local_per_kb_ns: lb,
        miss_ns: ma,
        miss_per_kb_ns: mb,
        fetch,
        clients: DELAY_CLIENTS,
        phases,
        clamped,
    })
}

/// The host's speed before each set-up starts and after the last ([`hostspeed`]), as the
/// lab reads it before and after each point: the check scales the costs by the median of
/// these readings over the mean of the point's.
fn reference(out: &mut LabCosts, sample: &mut SampleFn) -> Result<(), String> {
    let s = hostspeed::measure(hostspeed::REFERENCE_DEFAULT).map_err(err)?;
    sample("host-reference", 0, s.ops, s.busy_ns_per_op, None);
    out.references.push(s.busy_ns_per_op);
    Ok(())
}

/// The lab-shaped phases (see the module doc), each pair of base and measured phase
/// `repeats` times ([`interleaved`]).
fn lab_phases(
    objects: &Objects,
    shape: CalibrationShape,
    seconds: f64,
    repeats: usize,
    sample: &mut SampleFn,
) -> Result<LabCosts, String> {
    let run_id = format!("calib{}", std::process::id() % 100_000);
    let mut specs: Vec<NodeSpec> = (0..shape.nodes)
        .map(|i| NodeSpec::new(&node_name(i)).cpu_quota_pct(shape.cpu_quota_pct))
        .collect();
    specs.push(NodeSpec::new(CLIENT));
    let dc = VirtualDc::create(&run_id, &specs).map_err(err)?;
    let work = std::env::temp_dir().join(format!("farside-calib-{}-t", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(err)?;
    let shm_dir = work.join("arenas");
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&shm_dir)
            .map_err(err)?;
    }
    let env = Env {
        dc: &dc,
        root: &objects.dir,
        shm_dir,
        keys: LabKeys::generate(&["coop", "coop-arena"]).map_err(err)?,
        work: work.clone(),
        exe: std::env::current_exe().map_err(err)?,
        seconds,
        nodes: shape.nodes,
    };
    let big = 256u64 << 20;
    let result = (|| -> Result<LabCosts, String> {
        let mut out = LabCosts {
            reps: (0..repeats).map(|_| RepPoints::default()).collect(),
            host_phases: Vec::new(),
            light: Vec::new(),
            references: Vec::new(),
        };

        let mut setup = 0;
        let warm_all = |c: &Cluster| -> Result<(), String> {
            for j in 0..shape.nodes {
                let all: Vec<String> = objects.sets.iter().flat_map(|s| s[j].clone()).collect();
                c.warm(j, &all)?;
            }
            Ok(())
        };
        let every_node = |i: usize| -> Vec<(usize, &Path)> {
            (0..shape.nodes)
                .map(|j| (j, objects.traces[i][j].as_path()))
                .collect()
        };
        for transport in TRANSPORTS {
            reference(&mut out, sample)?;
            let c = env.start(setup, "press", transport, big)?;
            setup += 1;
            warm_all(&c)?;
            std::thread::sleep(DIRECTORY_SETTLE);
            let tcp = transport == "tcp";
            let local_name = if tcp {
                "local".to_string()
            } else {
                format!("local-{transport}")
            };
            // Per repeat and size: (node CPU, host busy) per local hit of the base phase.
            let mut base = vec![vec![(0.0, 0.0); SIZES.len()]; repeats];
            let mut pts: Vec<[Vec<Point>; 4]> = (0..repeats).map(|_| Default::default()).collect();
            for (rep, i, measured) in interleaved(repeats, SIZES.len()) {
                let size = SIZES[i];
                let seed = (setup as u64 * 100 + rep as u64) * 10 + i as u64;
                if !measured {
                    let n = c.phase(&every_node(i), LAB_CLIENTS_PER_NODE, &objects.dir, seed)?;
                    let hits = dominant(&local_name, size, n.local, &n)?;
                    let cpu: u64 = n.cpu_ns.iter().sum();
                    let p = sample(&local_name, size, n.local, cpu as f64 / hits, Some(rep));
                    let h = n.host_phase(&local_name, size, n.local);
                    let hp = sample(
                        &format!("host-{local_name}"),
                        size,
                        n.local,
                        h.busy_per_request_ns(),
                        Some(rep),
                    );
                    out.host_phases.push(h);
                    base[rep][i] = (p.1, hp.1);
                    if tcp {
                        out.reps[rep].local.push(p);
                        out.reps[rep].host_local.push(hp);
                        out.reps[rep].client.push(sample(
                            "client",
                            size,
                            n.total(),
                            n.client_cpu_ns as f64 / n.total() as f64,
                            Some(rep),
                        ));
                        if rep == 0 {
                            out.light.push(c.light(
                                LightKind::Local,
                                size,
                                (0, objects.traces[i][0].as_path()),
                                &objects.dir,
                                500 + i as u64,
                            )?);
                        }
                    }
                    continue;
                }
                // The clients of each node of the first half ask for the set of its
                // partner in the second half.
                let pairs = shape.fetch_pairs();
                let drive: Vec<(usize, &Path)> = pairs
                    .iter()
                    .map(|&(a, b)| (a, objects.traces[i][b].as_path()))
                    .collect();
                let n = c.phase(&drive, LAB_CLIENTS_PER_NODE, &objects.dir, seed + 5)?;
                let remote = dominant(&format!("{transport} remote"), size, n.remote, &n)?;
                let of = |side: fn(&(usize, usize)) -> usize| {
                    pairs.iter().map(|p| n.cpu_ns[side(p)]).sum::<u64>() as f64 / remote
                };
                let (ini, srv) = (of(|p| p.0), of(|p| p.1));
                let q = n.softirq_ns as f64 / remote;
                let rs = Some(rep);
                sample(
                    &format!("fetch-{transport}-initial"),
                    size,
                    n.remote,
                    ini,
                    rs,
                );
                let [pi, ps, pq, ph] = &mut pts[rep];
                pi.push((kb(size), over_base(ini, base[rep][i].0)));
                ps.push(sample(
                    &format!("fetch-{transport}-service"),
                    size,
                    n.remote,
                    srv,
                    rs,
                ));
                pq.push(sample(
                    &format!("fetch-{transport}-softirq"),
                    size,
                    n.remote,
                    q,
                    rs,
                ));
                let h = n.host_phase(&format!("fetch-{transport}"), size, n.remote);
                let busy = h.busy_per_request_ns();
                sample(&format!("host-fetch-{transport}"), size, n.remote, busy, rs);
                ph.push((kb(size), over_base(busy, base[rep][i].1)));
                out.host_phases.push(h);
                if rep == 0 {
                    // One client at the first pair's initial node asks for its
                    // partner's set: all remote, light load.
                    let (a, b) = pairs[0];
                    out.light.push(c.light(
                        LightKind::Fetch(transport),
                        size,
                        (a, objects.traces[i][b].as_path()),
                        &objects.dir,
                        600 + setup as u64 * 10 + i as u64,
                    )?);
                }
            }
            for (rep, [pi, ps, pq, ph]) in pts.iter().enumerate() {
                let (ha, hb) = fit(ph);
                out.reps[rep].host_fetch.push(HostFetchCosts {
                    transport: transport.to_string(),
                    ns: ha,
                    per_kb_ns: hb,
                });
                let (ia, ib) = fit(pi);
                let (sa, sb) = fit(ps);
                let (qa, qb) = fit(pq);
                out.reps[rep].transports.push(TransportCosts {
                    transport: transport.to_string(),
                    initial_ns: ia,
                    initial_per_kb_ns: ib,
                    service_ns: sa,
                    service_per_kb_ns: sb,
                    softirq_ns: qa,
                    softirq_per_kb_ns: qb,
                });
            }
        }
        // Misses: rr nodes whose cache of one byte holds nothing, each phase right
        // after a local phase of rr nodes that cache everything (both set-ups run side
        // by side; rr nodes publish nothing, so the idle one costs nothing).
        reference(&mut out, sample)?;
        let hit = env.start(setup, "rr", "tcp", big)?;
        warm_all(&hit)?;
        let c = env.start(setup + 1, "rr", "tcp", 1)?;
        let mut base = vec![vec![(0.0, 0.0); SIZES.len()]; repeats];
        for (rep, i, measured) in interleaved(repeats, SIZES.len()) {
            let size = SIZES[i];
            let seed = 9000 + rep as u64 * 10 + i as u64;
            let rs = Some(rep);
            if !measured {
                let n = hit.phase(&every_node(i), LAB_CLIENTS_PER_NODE, &objects.dir, seed)?;
                let hits = dominant("local-rr", size, n.local, &n)?;
                let cpu: u64 = n.cpu_ns.iter().sum();
                let p = sample("local-rr", size, n.local, cpu as f64 / hits, rs);
                let h = n.host_phase("local-rr", size, n.local);
                let hp = sample("host-local-rr", size, n.local, h.busy_per_request_ns(), rs);
                out.host_phases.push(h);
                base[rep][i] = (p.1, hp.1);
                continue;
            }
            let n = c.phase(&every_node(i), LAB_CLIENTS_PER_NODE, &objects.dir, seed + 5)?;
            let misses = dominant("miss", size, n.miss, &n)?;
            let cpu: u64 = n.cpu_ns.iter().sum();
            let ns = cpu as f64 / misses;
            sample("miss", size, n.miss, ns, rs);
            out.reps[rep]
                .miss
                .push((kb(size), over_base(ns, base[rep][i].0)));
            let h = n.host_phase("miss", size, n.miss);
            let busy = h.busy_per_request_ns();
            sample("host-miss", size, n.miss, busy, rs);
            out.reps[rep]
                .host_miss
                .push((kb(size), over_base(busy, base[rep][i].1)));
            out.host_phases.push(h);
            if rep == 0 {
                out.light.push(c.light(
                    LightKind::Miss,
                    size,
                    (0, objects.traces[i][0].as_path()),
                    &objects.dir,
                    700 + i as u64,
                )?);
            }
        }
        reference(&mut out, sample)?;
        Ok(out)
    })();
    drop(env);
    let _ = std::fs::remove_dir_all(&work);
    result
}

#[cfg(test)]
mod tests;
