//! `farside model coop --calibrate`: the costs the cooperative-caching model needs,
//! measured on this host with the real code paths of `farside backend --coop`.
//!
//! Every node is this binary's `backend --coop` in a child process on loopback, in its
//! own `cpuacct` cgroup (v1) when it can make one, so its CPU time counts every thread
//! to the nanosecond; else from `/proc/<pid>/stat` (10 ms ticks, hence the number of
//! requests per phase). Closed-loop clients in this process send keep-alive GETs and
//! check every body's CRC32c, as the lab's clients do; their own CPU is read per thread
//! (`RUSAGE_THREAD`). Phases, each at body sizes [`SIZES`]:
//! - `local`: a node with a large cache, every object cached: CPU per request = parse +
//!   serve a cached body over TCP;
//! - `miss`: a node whose cache holds nothing (1 byte), disk emulation at 0: the extra
//!   CPU of reading and checksumming a file;
//! - `forward-initial` / `forward-service`: two `--coop-policy press` nodes, every
//!   object cached at the second only: the first's extra CPU for the sealed TCP fetch,
//!   the second's CPU to answer it;
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
    CostsFile, DiskEmulation, Provenance, Sample, TransportCosts, COSTS_FORMAT,
};
use farside_lab::fabric::keys::LabKeys;
use farside_lab::fabric::netns::{NodeSpec, VirtualDc};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Body sizes measured, bytes: from a small page to the World Cup sample's larger
/// images (its mean request is about 5 KB).
pub const SIZES: [u64; 4] = [512, 4096, 16_384, 65_536];
/// Objects per size: enough that the nodes' caches and the clients' keep-alive
/// connections see distinct objects.
const OBJECTS_PER_SIZE: usize = 32;
/// Client threads per phase: two keep the node busy on a 2-CPU host without the
/// clients taking the node's CPU.
const CLIENT_THREADS: usize = 2;
/// Time a node may take to listen.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// Time for one client read or write.
const CLIENT_IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response head a client accepts.
const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Time for a press node's directory to reach its peer: many publication periods
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
/// Requests per phase at least, at most.
pub const CALIBRATE_REQUESTS_RANGE: std::ops::RangeInclusive<u64> = 100..=1_000_000;

fn err(what: impl std::fmt::Display) -> String {
    format!("calibrate: {what}")
}

/// CPU time of one thread of this process, ns.
fn thread_cpu_ns() -> u64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD is the calling thread.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(ru.ru_utime) + us(ru.ru_stime)) * 1000
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(err)?;
    Ok(l.local_addr().map_err(err)?.port())
}

/// A backend node in a child process.
struct NodeProc {
    child: Child,
    addr: SocketAddr,
    cgroup: Option<PathBuf>,
}

/// The cpuacct hierarchy (cgroup v1) if this host has one we may write.
fn cpuacct_root() -> Option<PathBuf> {
    let p = PathBuf::from("/sys/fs/cgroup/cpuacct");
    p.join("cpuacct.usage").exists().then_some(p)
}

impl NodeProc {
    fn start(name: &str, root: &Path, extra: &[String]) -> Result<NodeProc, String> {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let exe = std::env::current_exe().map_err(err)?;
        let mut args: Vec<String> = vec![
            "backend".into(),
            "--listen".into(),
            addr.to_string(),
            "--root".into(),
            root.display().to_string(),
            "--workers".into(),
            "8".into(),
            "--coop".into(),
        ];
        args.extend_from_slice(extra);
        let child = Command::new(exe)
            .args(&args)
            .env("FARSIDE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(err)?;
        let cgroup = cpuacct_root().and_then(|r| {
            let dir = r.join(format!("farside-calib-{}-{name}", std::process::id()));
            std::fs::create_dir(&dir).ok()?;
            match std::fs::write(dir.join("cgroup.procs"), child.id().to_string()) {
                Ok(()) => Some(dir),
                Err(_) => {
                    let _ = std::fs::remove_dir(&dir);
                    None
                }
            }
        });
        let mut node = NodeProc {
            child,
            addr,
            cgroup,
        };
        let until = Instant::now() + READY_WITHIN;
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(st)) = node.child.try_wait() {
                return Err(err(format!("node {name} exited: {st}")));
            }
            if Instant::now() > until {
                return Err(err(format!("node {name} did not listen on {addr}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(node)
    }

    /// CPU time of every thread of the node so far, ns.
    fn cpu_ns(&self) -> u64 {
        if let Some(cg) = &self.cgroup {
            if let Ok(s) = std::fs::read_to_string(cg.join("cpuacct.usage")) {
                if let Ok(v) = s.trim().parse() {
                    return v;
                }
            }
        }
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command's closing parenthesis; utime and stime are 14 and 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        // SAFETY: sysconf reads a constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        f.get(11)
            .zip(f.get(12))
            .map_or(0, |(u, s)| (u + s) * 1_000_000_000 / hz)
    }

    fn stat(&self, key: &str) -> u64 {
        let text = Conn::open(self.addr)
            .and_then(|mut c| c.get("/coop/stats"))
            .map(|(_, b)| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        text.lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(cg) = &self.cgroup {
            let _ = std::fs::remove_dir(cg);
        }
    }
}

struct Conn {
    r: BufReader<TcpStream>,
    /// The node said `Connection: close`.
    closed: bool,
}

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Conn> {
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
    fn get(&mut self, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
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

/// The calibration's objects: `o/<size>-<i>`, distinct content, and each one's CRC32c.
struct Objects {
    dir: PathBuf,
    by_size: Vec<Vec<(String, u32)>>,
}

impl Objects {
    fn write() -> Result<Objects, String> {
        let dir = std::env::temp_dir().join(format!("farside-calib-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("o")).map_err(err)?;
        let mut by_size = Vec::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for &size in &SIZES {
            let mut v = Vec::new();
            for i in 0..OBJECTS_PER_SIZE {
                let body: Vec<u8> = (0..size)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                let name = format!("/o/{size}-{i}");
                std::fs::write(dir.join(&name[1..]), &body).map_err(err)?;
                v.push((name, crc32c::crc32c(&body)));
            }
            by_size.push(v);
        }
        Ok(Objects { dir, by_size })
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `requests` GETs of `objects` (round-robin) at `node` from [`CLIENT_THREADS`]
/// keep-alive clients; every body checked. Returns the clients' CPU per request, ns.
fn drive(addr: SocketAddr, objects: &[(String, u32)], requests: u64) -> Result<f64, String> {
    let per = requests.div_ceil(CLIENT_THREADS as u64);
    let results: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..CLIENT_THREADS)
            .map(|t| {
                s.spawn(move || -> Result<u64, String> {
                    let mut c = Conn::open(addr).map_err(err)?;
                    let cpu0 = thread_cpu_ns();
                    for i in 0..per {
                        let (name, crc) = &objects[(i as usize + t * 7) % objects.len()];
                        let (status, body) = c.get(name).map_err(err)?;
                        if status != 200 || crc32c::crc32c(&body) != *crc {
                            return Err(err(format!("{name}: status {status} or wrong body")));
                        }
                    }
                    Ok(thread_cpu_ns() - cpu0)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(err("client panicked"))))
            .collect()
    });
    let mut cpu = 0;
    for r in results {
        cpu += r?;
    }
    Ok(cpu as f64 / (per * CLIENT_THREADS as u64) as f64)
}

/// Warms `node` with one request per object.
fn warm(addr: SocketAddr, objects: &Objects) -> Result<(), String> {
    let mut c = Conn::open(addr).map_err(err)?;
    for (name, _) in objects.by_size.iter().flatten() {
        let (st, _) = c.get(name).map_err(err)?;
        if st != 200 {
            return Err(err(format!("{name}: status {st}")));
        }
    }
    Ok(())
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

fn kb(bytes: u64) -> f64 {
    bytes as f64 / 1024.0
}

fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0.0)
}

fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d, hh, mm, ss) = farside_rt::clock::utc(secs);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

fn git(args: &[&str]) -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    Command::new("git")
        .arg("-C")
        .arg(&repo)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Measures the costs (see the module doc); `requests` per phase and size.
pub fn calibrate(requests: u64) -> Result<CostsFile, String> {
    if !CALIBRATE_REQUESTS_RANGE.contains(&requests) {
        return Err(err(format!(
            "--calibrate-requests must be in {CALIBRATE_REQUESTS_RANGE:?}"
        )));
    }
    let load0 = load_avg();
    let objects = Objects::write()?;
    let mut samples = Vec::new();
    let mut sample = |phase: &str, bytes: u64, ns: f64| {
        eprintln!("calibrate: {phase:<16} {bytes:>6} B  {:>9.1} us", ns / 1e3);
        samples.push(Sample {
            phase: phase.into(),
            body_bytes: bytes,
            requests,
            ns_per_request: ns,
        });
        (kb(bytes), ns)
    };
    let zero_disk = |extra: &mut Vec<String>| {
        extra.extend([
            "--coop-disk-latency-us".into(),
            "0".into(),
            "--coop-disk-bytes-per-s".into(),
            "1000000000000".into(),
        ]);
    };
    let big = (256u64 << 20).to_string();
    // Local hits.
    let mut extra: Vec<String> = vec![
        "--coop-policy".into(),
        "rr".into(),
        "--coop-cache-bytes".into(),
        big.clone(),
    ];
    zero_disk(&mut extra);
    let a = NodeProc::start("local", &objects.dir, &extra)?;
    let method = if a.cgroup.is_some() {
        "node CPU from a cpuacct cgroup per node (ns)"
    } else {
        "node CPU from /proc/<pid>/stat (clock ticks)"
    };
    warm(a.addr, &objects)?;
    let (mut local, mut client) = (Vec::new(), Vec::new());
    for (i, &size) in SIZES.iter().enumerate() {
        let c0 = a.cpu_ns();
        let cl = drive(a.addr, &objects.by_size[i], requests)?;
        let ns = (a.cpu_ns() - c0) as f64 / requests as f64;
        local.push(sample("local", size, ns));
        client.push(sample("client", size, cl));
    }
    if a.stat("misses") != (SIZES.len() * OBJECTS_PER_SIZE) as u64 {
        return Err(err("the local phase missed after warming"));
    }
    drop(a);
    // Misses: a cache of one byte holds nothing.
    let mut extra: Vec<String> = vec![
        "--coop-policy".into(),
        "rr".into(),
        "--coop-cache-bytes".into(),
        "1".into(),
    ];
    zero_disk(&mut extra);
    let b = NodeProc::start("miss", &objects.dir, &extra)?;
    let mut miss = Vec::new();
    for (i, &size) in SIZES.iter().enumerate() {
        let c0 = b.cpu_ns();
        drive(b.addr, &objects.by_size[i], requests)?;
        let ns = (b.cpu_ns() - c0) as f64 / requests as f64;
        let extra = (ns - local[i].1).max(0.0);
        sample("miss", size, ns);
        miss.push((kb(size), extra));
    }
    drop(b);
    // Peer fetches over every transport, in namespaces as the lab runs them.
    let transports = transport_phases(&objects, requests, &mut sample)?;
    let tcp = transports
        .iter()
        .find(|t| t.transport == "tcp")
        .ok_or_else(|| err("no tcp phase"))?
        .clone();
    // The emulated disk, as the lab configures it.
    let disk = Disk::new(LAB_DISK_LATENCY_US, LAB_DISK_BYTES_PER_S);
    let mut disk_pts = Vec::new();
    for (i, &size) in SIZES.iter().enumerate() {
        let path = objects.dir.join(&objects.by_size[i][0].0[1..]);
        let t0 = Instant::now();
        for _ in 0..DISK_READS {
            disk.read(&path).map_err(err)?;
        }
        let ns = t0.elapsed().as_nanos() as f64 / DISK_READS as f64;
        disk_pts.push(sample("disk", size, ns));
    }
    let (d_access, d_kb) = fit(&disk_pts);
    // Directory updates: build + encode + seal + send to one peer; receive + decode.
    let (build_ns, send_ns, apply_ns) = directory_costs()?;
    sample("directory-build", 0, build_ns);
    sample("directory-send", 0, send_ns);
    sample("directory-apply", 0, apply_ns);
    let (l_a, l_b) = fit(&local);
    let (m_a, m_b) = fit(&miss);
    let (c_a, c_b) = fit(&client);
    let r = |x: f64| x.round() as u64;
    let defaults = Costs::default();
    let costs = Costs {
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
    };
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]);
    Ok(CostsFile {
        format: COSTS_FORMAT.into(),
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
                "farside model coop --calibrate: {method}; {requests} requests per phase and size \
                 from {CLIENT_THREADS} keep-alive clients over loopback; client CPU by RUSAGE_THREAD; \
                 disk: wall time of coop::disk::Disk reads; directory: CPU of {DIRECTORY_UPDATES} \
                 updates of {DIRECTORY_OBJECTS} objects; peer fetch per transport (tcp, udp, xdp, shm) \
                 between two nodes in network namespaces on a bridge as the lab's (no CPU quota, \
                 no RPS: softirq runs on the sender's CPU and counts in its cgroup), node CPU \
                 from each node's cgroup, host softirq from /proc/stat (ticks); \
                 NIC 0 (veth without a rate limit)"
            ),
        },
        costs,
        disk: DiskEmulation {
            configured_latency_us: LAB_DISK_LATENCY_US,
            configured_bytes_per_s: LAB_DISK_BYTES_PER_S,
            measured_access_ns: d_access,
            measured_per_kb_ns: d_kb,
        },
        client_request_ns: c_a,
        client_per_kb_ns: c_b,
        transports,
        samples,
    })
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

/// Transports measured, in order (`farside backend --coop-peer`).
pub const TRANSPORTS: [&str; 4] = ["tcp", "udp", "xdp", "shm"];
/// Nodes of the transport phases: the clients, the node that takes the requests and the
/// node that caches every object.
const CLIENT: &str = "client";
const INITIAL: &str = "initial";
const SERVICE: &str = "service";
/// Ports inside the namespaces (fresh, so fixed): HTTP and peer; each transport adds
/// its index so a previous phase's sockets never collide.
const HTTP_PORT: u16 = 8080;
const PEER_PORT: u16 = 7100;
/// The arena responders' port and reader key id (as the lab's).
const ARENA_PORT: u16 = farside_backend::coop::COOP_ARENA_PORT_DEFAULT;
const ARENA_KEY_ID: u32 = 1;

/// CPU time of a node's cgroup so far, ns (v1 `cpuacct.usage`, else v2 `usage_usec`).
fn cgroup_cpu_ns(dc: &VirtualDc, node: &str) -> u64 {
    for d in dc.cgroup_dirs(node) {
        if let Ok(t) = std::fs::read_to_string(d.join("cpuacct.usage")) {
            if let Ok(ns) = t.trim().parse::<u64>() {
                return ns;
            }
        }
        if let Ok(t) = std::fs::read_to_string(d.join("cpu.stat")) {
            let us = t
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<u64>().ok());
            if let Some(us) = us {
                return us * 1000;
            }
        }
    }
    0
}

/// The host's softirq time so far over all CPUs, ns (`/proc/stat`, clock ticks).
fn host_softirq_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    stat.lines()
        .find(|l| l.starts_with("cpu "))
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |t| t * 1_000_000_000 / hz)
}

/// The children of one phase, killed on drop.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One counter of a node's `/coop/stats`, read from the client's namespace.
fn stat_at(dc: &VirtualDc, addr: SocketAddr, key: &str) -> u64 {
    let text = dc
        .run_in_ns(CLIENT, || {
            Ok(Conn::open(addr)
                .and_then(|mut c| c.get("/coop/stats"))
                .map(|(_, b)| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default())
        })
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until `addr` takes connections from the client's namespace.
fn ready(dc: &VirtualDc, addr: SocketAddr, children: &mut Children) -> Result<(), String> {
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

/// Peer fetch over every transport ([`TRANSPORTS`]): two `--coop-policy press` nodes
/// (`initial`, `service`) and the clients (`client`), each a network namespace on the
/// lab's bridge (`farside_lab::fabric::netns`, tx checksum offload off, no CPU quota,
/// no RPS, as `farside lab coop` runs them); every object cached at the service node
/// only, so every request to the initial node is a peer fetch. Per size: the initial
/// node's CPU over its local-hit CPU (the service node driven directly, the same path
/// over the same veths), the service node's CPU, the host's softirq.
fn transport_phases(
    objects: &Objects,
    requests: u64,
    sample: &mut dyn FnMut(&str, u64, f64) -> Point,
) -> Result<Vec<TransportCosts>, String> {
    if !farside_lab::fabric::netns::is_root() {
        return Err(err(
            "the transport phases make network namespaces: run as root",
        ));
    }
    let run_id = format!("calib{}", std::process::id());
    let dc = VirtualDc::create(
        &run_id,
        &[
            NodeSpec::new(CLIENT),
            NodeSpec::new(INITIAL),
            NodeSpec::new(SERVICE),
        ],
    )
    .map_err(err)?;
    let keys = LabKeys::generate(&["coop", "coop-arena"]).map_err(err)?;
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
    let exe = std::env::current_exe().map_err(err)?;
    let ip = |n: &str| std::net::IpAddr::V4(dc.node_ip(n));
    let big = (256u64 << 20).to_string();
    let mut local: Option<Vec<Point>> = None;
    let mut out = Vec::new();
    let result = (|| -> Result<(), String> {
        for (t, transport) in TRANSPORTS.iter().enumerate() {
            let http = |n: &str| SocketAddr::new(ip(n), HTTP_PORT + t as u16);
            let peers = [INITIAL, SERVICE]
                .map(|n| SocketAddr::new(ip(n), PEER_PORT + t as u16).to_string())
                .join(",");
            let args = |n: &str, index: usize| {
                let mut a: Vec<String> = vec![
                    "backend".into(),
                    "--listen".into(),
                    http(n).to_string(),
                    "--root".into(),
                    objects.dir.display().to_string(),
                    "--workers".into(),
                    "8".into(),
                    "--coop".into(),
                    "--coop-cache-bytes".into(),
                    big.clone(),
                    "--coop-disk-latency-us".into(),
                    "0".into(),
                    "--coop-disk-bytes-per-s".into(),
                    "1000000000000".into(),
                    "--coop-policy".into(),
                    "press".into(),
                    "--coop-index".into(),
                    index.to_string(),
                    "--coop-peers".into(),
                    peers.clone(),
                    "--coop-key-file".into(),
                    keys.path("coop").display().to_string(),
                    "--coop-peer".into(),
                    transport.to_string(),
                ];
                match *transport {
                    "xdp" => a.extend([
                        "--coop-arena-iface".into(),
                        dc.veth_in_ns(n),
                        "--coop-arena-port".into(),
                        ARENA_PORT.to_string(),
                        "--coop-arena-key".into(),
                        format!("{ARENA_KEY_ID}:{}", keys.path("coop-arena").display()),
                    ]),
                    "shm" => a.extend(["--coop-shm-dir".into(), shm_dir.display().to_string()]),
                    _ => {}
                }
                a
            };
            let mut children = Children(Vec::new());
            for (i, n) in [INITIAL, SERVICE].into_iter().enumerate() {
                let log = work.join(format!("{transport}-{n}.log"));
                children
                    .0
                    .push(dc.spawn_in(n, &exe, &args(n, i), &log).map_err(err)?);
            }
            for n in [INITIAL, SERVICE] {
                ready(&dc, http(n), &mut children)?;
            }
            let (ini, srv) = (http(INITIAL), http(SERVICE));
            dc.run_in_ns(CLIENT, || Ok(warm(srv, objects)))
                .map_err(err)??;
            std::thread::sleep(DIRECTORY_SETTLE);
            if local.is_none() {
                // The local-hit reference: the service node, every object cached.
                let mut pts = Vec::new();
                for (i, &size) in SIZES.iter().enumerate() {
                    let c0 = cgroup_cpu_ns(&dc, SERVICE);
                    dc.run_in_ns(CLIENT, || Ok(drive(srv, &objects.by_size[i], requests)))
                        .map_err(err)??;
                    let ns = (cgroup_cpu_ns(&dc, SERVICE) - c0) as f64 / requests as f64;
                    pts.push(sample("local-netns", size, ns));
                }
                local = Some(pts);
            }
            let local = local.as_ref().expect("measured above");
            let (mut pi, mut ps, mut pq) = (Vec::new(), Vec::new(), Vec::new());
            for (i, &size) in SIZES.iter().enumerate() {
                let r0 = stat_at(&dc, ini, "remote_hits");
                let (c0, s0, q0) = (
                    cgroup_cpu_ns(&dc, INITIAL),
                    cgroup_cpu_ns(&dc, SERVICE),
                    host_softirq_ns(),
                );
                dc.run_in_ns(CLIENT, || Ok(drive(ini, &objects.by_size[i], requests)))
                    .map_err(err)??;
                let n = requests as f64;
                let i_ns = (cgroup_cpu_ns(&dc, INITIAL) - c0) as f64 / n;
                let s_ns = (cgroup_cpu_ns(&dc, SERVICE) - s0) as f64 / n;
                let q_ns = host_softirq_ns().saturating_sub(q0) as f64 / n;
                let remote = stat_at(&dc, ini, "remote_hits") - r0;
                if remote < requests * 9 / 10 {
                    return Err(err(format!(
                        "{transport} phase at {size} B: {remote} of {requests} requests fetched \\
                         from the peer (the directory did not arrive)"
                    )));
                }
                sample(&format!("fetch-{transport}-initial"), size, i_ns);
                pi.push((kb(size), (i_ns - local[i].1).max(0.0)));
                ps.push(sample(&format!("fetch-{transport}-service"), size, s_ns));
                pq.push(sample(&format!("fetch-{transport}-softirq"), size, q_ns));
            }
            let (ia, ib) = fit(&pi);
            let (sa, sb) = fit(&ps);
            let (qa, qb) = fit(&pq);
            out.push(TransportCosts {
                transport: transport.to_string(),
                initial_ns: ia,
                initial_per_kb_ns: ib,
                service_ns: sa,
                service_per_kb_ns: sb,
                softirq_ns: qa,
                softirq_per_kb_ns: qb,
            });
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&work);
    result.map(|()| out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_line_and_never_goes_negative() {
        let (a, b) = fit(&[(0.5, 110.0), (4.0, 145.0), (16.0, 265.0), (64.0, 745.0)]);
        assert!(
            (a - 105.0).abs() < 1e-6 && (b - 10.0).abs() < 1e-6,
            "{a} {b}"
        );
        let (a, b) = fit(&[(1.0, 10.0), (2.0, 5.0)]);
        assert_eq!((a, b), (7.5, 0.0));
    }

    #[test]
    fn utc_dates_are_civil() {
        let s = utc_now();
        assert_eq!(s.len(), 20);
        assert!(s.starts_with("20") && s.ends_with('Z'));
    }
}
