//! The run of `lab rdma-http`: the two namespaces, the files, the CPU hogs, a fresh
//! back-end per point, the clients, the server's CPU counters, and the registration
//! probe a `table1` point runs inside the server's node.

use super::*;
use crate::fabric::netns::{NodeSpec, VirtualDc};
use crate::fabric::procs::Child;
use farside_loadgen::rdma::RdmaLoad;
use farside_loadgen::LoadgenArgs;
use farside_rdmahttp::registration::Registration;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The clients' node.
pub const CLIENT: &str = "client";
/// The server's node.
pub const SERVER: &str = "srv";
/// The back-end's port.
const PORT: u16 = 80;
/// Longest wait for the back-end to listen.
const READY_MAX: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(10);
/// Back-end workers: one per kept-alive client of the largest point, and one spare.
const WORKERS: u32 = CLIENTS_MAX + 1;
/// Each back-end's RDMA caps: every client of a point transferring at once
/// (`--rdma-transfers-max`), and the static strategy's region of the largest file
/// for each of them (`--rdma-registered-bytes-max`).
const TRANSFERS_MAX: u32 = CLIENTS_MAX;
const REGISTERED_BYTES_MAX: u64 = CLIENTS_MAX as u64 * FILE_BYTES_MAX + FILE_BYTES_MAX;
/// Bound of every client wait (connect, answer, RDMA completion), ms: a loaded
/// server took up to seconds per request in the paper (Table 1: 1.5 s per
/// registration).
const CLIENT_TIMEOUT_MS: u64 = 60_000;
/// Longest a fig4 point may take, s: its work is fixed (five files per client and
/// round); a loaded server moved ~10 MB/s here, so 15 clients' 75 MiB take ~8 s.
const FIG4_MAX_S: f64 = 120.0;
/// xdp-reads: the arena reader key's id and file (in a temp dir of the run).
const ARENA_KEY_ID: u32 = 5;
const ARENA_KEY_FILE: &str = "rmem-5.key";
/// xdp-reads: the back-end's arena responder port.
const ARENA_PORT: u16 = farside_rdmahttp::cli::ARENA_PORT_DEFAULT;
/// Longest a registration probe may take (40 steps of 8 MiB on a loaded CPU took
/// seconds; the paper's loaded registrations took 1.5 s each).
const PROBE_MAX: Duration = Duration::from_secs(600);
/// Time the hogs run before a loaded point is measured (they spin from their first
/// instruction; this lets the scheduler see them as the CPU's steady load).
const HOG_SETTLE: Duration = Duration::from_millis(200);

/// The run's namespaces and files.
pub struct Lab {
    pub dc: VirtualDc,
    pub logs: PathBuf,
    /// The served files (a temp dir, removed on drop: up to tens of MB).
    pub docroot: TempDir,
    pub plan: Plan,
    pub hog_nice: i32,
    /// The arena reader key of xdp-reads (back-end and clients).
    pub arena_keys: crate::fabric::keys::LabKeys,
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The path of the Fig. 3 / Table 1 file of `size` bytes.
pub fn size_path(size: u64) -> String {
    format!("/f-{size}.bin")
}

/// The paths of the five Fig. 4 files.
pub fn fig4_paths() -> Vec<String> {
    (0..FIG4_FILES)
        .map(|i| format!("/m{i}-{FIG4_FILE_BYTES}.bin"))
        .collect()
}

/// Pseudo-random bytes (xorshift32 of `seed`): a body whose every byte is checked.
pub fn content(n: u64, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Build the namespaces and write the files.
pub fn start_lab(dir: &Path, plan: &Plan, hog_nice: i32) -> io::Result<Lab> {
    let specs = [
        NodeSpec::new(CLIENT).pinned(Some(&[plan.client_cpu])),
        NodeSpec::new(SERVER).pinned(Some(&[plan.server_cpu])),
    ];
    let dc = VirtualDc::create(&format!("r{}", std::process::id() % 100_000), &specs)?;
    let id = dc.run_id().to_string();
    crate::fabric::procs::on_interrupt(move || {
        if let Ok(r) = crate::fabric::netns::clean_run_id(&id) {
            eprint!("{r}");
        }
    });
    let mtu = set_mtu(&dc, plan.link_mtu)?;
    let offload = tx_offload_on(&dc);
    eprintln!("lab rdma-http: links' MTU {mtu}; nodes' tx checksum offload: {offload}");
    if plan.xdp_mode == "native" {
        let n = native_xdp_paths(&dc, plan.server_cpu)?;
        eprintln!("lab rdma-http: native XDP: {n}");
    }
    let shield = shield_server(&dc);
    eprintln!("lab rdma-http: server node's CPU weight: {shield}");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let docroot =
        TempDir(std::env::temp_dir().join(format!("farside-rdma-http-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&docroot.0);
    std::fs::create_dir_all(&docroot.0)?;
    let mut sizes: Vec<u64> = plan.fig3_sizes.clone();
    sizes.extend(&plan.table1_sizes);
    sizes.sort_unstable();
    sizes.dedup();
    for (i, &s) in sizes.iter().enumerate() {
        let p = size_path(s);
        std::fs::write(docroot.0.join(&p[1..]), content(s, i as u32 + 1))?;
    }
    for (i, p) in fig4_paths().iter().enumerate() {
        std::fs::write(
            docroot.0.join(&p[1..]),
            content(FIG4_FILE_BYTES, 100 + i as u32),
        )?;
    }
    eprintln!(
        "lab rdma-http: server (and its receive softirq) on CPU {}, clients on CPU {}; \
         loaded = {HOGS} hogs at nice {hog_nice} on the server's CPU",
        plan.server_cpu, plan.client_cpu
    );
    Ok(Lab {
        dc,
        logs,
        docroot,
        plan: plan.clone(),
        hog_nice,
        arena_keys: crate::fabric::keys::LabKeys::generate(&[ARENA_KEY_FILE])?,
    })
}

/// MTU of the lab's links (both nodes' veths, their bridge ports and the bridge): a
/// jumbo MTU, as in a data centre's storage network. Rule: 9,000 B lets one reply of
/// `xdp-reads` carry six arena chunks (`farside_arena::layout::BULK_CHUNKS_MAX`), the
/// most a bulk READ spans; TCP's segments follow the MTU too (the same links for both).
pub const LINK_MTU: u32 = 9000;

/// Set every link of the lab to `mtu`: each node's `eth0` in its namespace, its peer in
/// the bridge's namespace, and the bridge. What was set, for the summary.
fn set_mtu(dc: &VirtualDc, mtu: u32) -> io::Result<String> {
    let m = mtu.to_string();
    let br = dc.bridge_netns_path();
    let br_name = br
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let set = |ns: &str, dev: &str| -> io::Result<()> {
        let out = std::process::Command::new("ip")
            .args(["-n", ns, "link", "set", "dev", dev, "mtu", &m])
            .output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "ip -n {ns} link set dev {dev} mtu {m}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    };
    for node in [CLIENT, SERVER] {
        set(&br_name, &dc.veth_peer(node))?;
    }
    set(&br_name, crate::fabric::netns::BRIDGE)?;
    for node in [CLIENT, SERVER] {
        set(&dc.netns_name(node), &dc.veth_in_ns(node))?;
    }
    Ok(format!("{mtu} (nodes' eth0, bridge ports, bridge)"))
}

/// For xdp-reads in native mode: GRO on the server's bridge port (a veth takes XDP
/// frames, the responder's XDP_TX replies, only while its NAPI is on: GRO or an XDP
/// program), and the client's bridge port's receive path steered by RPS to the server's
/// CPU (a veth with native XDP runs its program in its NAPI poll, scheduled on the CPU
/// that forwarded the packet to it: without this, the bridge's, i.e. the clients', CPU,
/// and the server's work would leave the loaded CPU). What was set, for the log.
fn native_xdp_paths(dc: &VirtualDc, server_cpu: usize) -> io::Result<String> {
    let br = dc.bridge_netns_path();
    let br_name = br
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let run = |args: &[&str]| -> io::Result<()> {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &br_name])
            .args(args)
            .output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "ip netns exec {br_name} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    };
    let server_port = dc.veth_peer(SERVER);
    // A veth enables its NAPI when GRO is switched on while it is up (or from its
    // open, if GRO was asked for): GRO is on by default without NAPI, so off, then on.
    run(&["ethtool", "-K", &server_port, "gro", "off"])?;
    run(&["ethtool", "-K", &server_port, "gro", "on"])?;
    let client_port = dc.veth_peer(CLIENT);
    let mask = crate::fabric::procs::cpu_mask(&[server_cpu]);
    run(&[
        "sh",
        "-c",
        &format!("echo {mask} > /sys/class/net/{client_port}/queues/rx-0/rps_cpus"),
    ])?;
    Ok(format!(
        "GRO on {server_port}; {client_port}'s receive path on CPU {server_cpu} (rps_cpus {mask})"
    ))
}

/// Turn tx checksum offload back on for both nodes' `eth0` (the fabric turns it off on
/// every veth end; the bridge-side ends keep it off): as a NIC, the sending host then
/// does not checksum in software what it sends, which for TCP means segmentation
/// offload for the server's bodies and for `xdp-reads` no checksum over each READ's
/// padding (its reply is never longer than its request). Both systems get the same
/// links. Uses `ethtool` (`ethtool -K eth0 tx on` in each node's namespace); what was
/// done, for the summary and the progress line.
fn tx_offload_on(dc: &VirtualDc) -> String {
    let mut done = Vec::new();
    for node in [CLIENT, SERVER] {
        let ns = dc.netns_name(node);
        let dev = dc.veth_in_ns(node);
        match std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "ethtool", "-K", &dev, "tx", "on"])
            .output()
        {
            Ok(o) if o.status.success() => done.push(format!("{node} on")),
            Ok(o) => done.push(format!(
                "{node} left off ({})",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => done.push(format!("{node} left off (ethtool: {e})")),
        }
    }
    done.join(", ")
}

/// CPU weight of the server node's cgroup, as a multiple of the default (v1
/// `cpu.shares` 1024, v2 `cpu.weight` 100): the machine is shared with other users'
/// processes (nice 0, each weighing the default), and without it three of them on the
/// server's CPU took three quarters of it from the node, hogs and server together,
/// with multi-second stalls in idle points. Inside the node the hogs and the server
/// compete as tasks, as in the paper.
pub const SERVER_WEIGHT_FACTOR: u64 = 10;

/// Raise the server node's cgroup CPU weight ([`SERVER_WEIGHT_FACTOR`]); what was set.
fn shield_server(dc: &VirtualDc) -> String {
    let mut done = Vec::new();
    for d in dc.cgroup_dirs(SERVER) {
        for (file, v) in [
            ("cpu.shares", 1024 * SERVER_WEIGHT_FACTOR),
            ("cpu.weight", 100 * SERVER_WEIGHT_FACTOR),
        ] {
            let p = d.join(file);
            if p.exists() {
                match std::fs::write(&p, v.to_string()) {
                    Ok(()) => done.push(format!("{}={v}", p.display())),
                    Err(e) => done.push(format!("{}: {e}", p.display())),
                }
            }
        }
    }
    if done.is_empty() {
        "not set (no cpu.shares or cpu.weight in the node's cgroups)".into()
    } else {
        done.join(", ")
    }
}

/// The CPU hogs of a loaded point: busy loops in the server's node (its cgroup and
/// CPU) at the given nice value; killed on drop.
pub struct Hogs(Vec<std::process::Child>);

impl Hogs {
    /// The hogs' run time so far, ns: the first field of `/proc/PID/schedstat` (time
    /// on the CPU, summed over the hogs; each is one thread, the shell that loops).
    pub fn run_ns(&self) -> io::Result<u64> {
        let mut sum = 0;
        for c in &self.0 {
            let text = std::fs::read_to_string(format!("/proc/{}/schedstat", c.id()))?;
            sum += schedstat_run_ns(&text)
                .ok_or_else(|| io::Error::other(format!("/proc/{}/schedstat: {text:?}", c.id())))?;
        }
        Ok(sum)
    }
}

/// Run time (ns) of a `/proc/PID/schedstat` line: its first field.
pub fn schedstat_run_ns(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// What the hogs took of the server's one CPU over a window: their run time at its
/// start, and when it started.
pub struct HogWindow {
    run_ns: u64,
    at: std::time::Instant,
}

impl HogWindow {
    /// Start a window (`None` without hogs: an idle point).
    pub fn start(hogs: Option<&Hogs>) -> io::Result<Option<HogWindow>> {
        hogs.map(|h| {
            Ok(HogWindow {
                run_ns: h.run_ns()?,
                at: std::time::Instant::now(),
            })
        })
        .transpose()
    }

    /// The hogs' share of the server's CPU since the window started: their run time
    /// over the wall time (the node has one CPU).
    pub fn share(&self, hogs: &Hogs) -> io::Result<f64> {
        let ran = hogs.run_ns()?.saturating_sub(self.run_ns);
        let wall = self.at.elapsed().as_nanos().max(1) as f64;
        Ok(ran as f64 / wall)
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

impl Lab {
    fn server_addr(&self) -> SocketAddr {
        SocketAddr::new(self.dc.node_ip(SERVER).into(), PORT)
    }

    /// Start the hogs (the paper's "two background processes which calculate a large
    /// number of trigonometric computations non stop": here shell busy loops, which
    /// touch no memory and make no system call) in the server's node: its cgroup (so
    /// its CPU), beside the server's threads as tasks of one group, as the paper's
    /// processes competed with Apache's, at `--hog-nice`.
    ///
    /// Placed outside the node's cgroup (pinned by affinity) the node's group instead
    /// weighs as one nice-0 task against them, whatever its thread count; a quick run
    /// that way had TCP 13-34x slower loaded and software iWARP (three threads per
    /// connection) 1-2.6x: the placement decides the result, so it is stated.
    pub fn start_hogs(&self) -> io::Result<Hogs> {
        let mut h = Hogs(Vec::new());
        for _ in 0..HOGS {
            let mut cmd = Command::new("/bin/sh");
            cmd.args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            self.dc.prepare_command(SERVER, &mut cmd)?;
            let nice = self.hog_nice;
            // SAFETY: setpriority is async-signal-safe; it changes only the child.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setpriority(libc::PRIO_PROCESS, 0, nice) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            h.0.push(cmd.spawn()?);
        }
        std::thread::sleep(HOG_SETTLE);
        Ok(h)
    }

    /// `ID:PATH` of the arena reader key.
    fn arena_spec(&self) -> String {
        format!(
            "{ARENA_KEY_ID}:{}",
            self.arena_keys.path(ARENA_KEY_FILE).display()
        )
    }

    /// A fresh `farside backend` for `system`.
    fn start_backend(&self, system: &str, tag: &str) -> io::Result<Child> {
        let mut args: Vec<String> = [
            "backend",
            "--listen",
            &format!("0.0.0.0:{PORT}"),
            "--root",
            &self.docroot.0.display().to_string(),
            "--workers",
            &WORKERS.to_string(),
            "--keepalive-max",
            &u32::MAX.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if is_arena_system(system) {
            for a in [
                "--rdma",
                "--rdma-transfer-bytes-max",
                &FILE_BYTES_MAX.to_string(),
                "--rdma-arena-iface",
                crate::fabric::netns::VETH_IN_NS,
                "--rdma-arena-port",
                &ARENA_PORT.to_string(),
                "--rdma-arena-key",
                &self.arena_spec(),
                "--rdma-arena-xdp-mode",
                &self.plan.xdp_mode,
            ] {
                args.push(a.to_string());
            }
            if system == SYSTEM_XDP_DIRECT {
                args.push("--rdma-arena-direct".into());
            }
        }
        if let Some(r) = registration_of(system) {
            for a in [
                "--rdma",
                "--rdma-registration",
                r,
                "--rdma-transfer-bytes-max",
                &FILE_BYTES_MAX.to_string(),
                "--rdma-transfers-max",
                &TRANSFERS_MAX.to_string(),
                "--rdma-registered-bytes-max",
                &REGISTERED_BYTES_MAX.to_string(),
                "--rdma-connect-timeout-ms",
                &CLIENT_TIMEOUT_MS.to_string(),
                "--rdma-transfer-timeout-ms",
                &CLIENT_TIMEOUT_MS.to_string(),
            ] {
                args.push(a.to_string());
            }
        }
        let log = self.logs.join(format!("{tag}-backend.log"));
        let c = self
            .dc
            .spawn_in(SERVER, &std::env::current_exe()?, &args, &log)?;
        let mut c = Child::adopt(&format!("{tag}-backend"), c, log);
        // Served, not only bound: the back-end binds its port before it loads its XDP
        // responder and its arena, which under the hogs took 45-60 s.
        crate::fabric::wait_http(
            &mut c,
            self.server_addr(),
            crate::fabric::Vantage::Node(&self.dc, CLIENT),
            READY_MAX,
            POLL,
        )?;
        Ok(c)
    }

    /// The clients of a fig3/fig4 point, from the client node, pinned to its CPU.
    fn load(&self, lg: LoadgenArgs) -> io::Result<farside_loadgen::rdma::RdmaSummary> {
        let cpu = self.plan.client_cpu;
        self.dc.run_in_ns(CLIENT, move || {
            crate::fabric::procs::pin_current_thread(&[cpu])?;
            farside_loadgen::rdma::run(&lg)
                .map_err(|e| io::Error::from(crate::error::LabError::Loadgen(e)))
        })
    }

    /// Measure one point.
    pub fn measure(&self, key: &Key, run: u32) -> io::Result<RdmaPoint> {
        let tag = format!(
            "{}-{}-{}-{}-c{}{}",
            key.experiment,
            key.system,
            key.load,
            key.size_bytes,
            key.clients,
            if run > 0 {
                format!("-r{run}")
            } else {
                String::new()
            }
        );
        if key.experiment == "table1" {
            let hogs = self.hogs_if_loaded(key)?;
            let w = HogWindow::start(hogs.as_ref())?;
            let mut p = self.probe_point(key, &tag)?;
            p.set_hog_share(w.zip(hogs.as_ref()).map(|(w, h)| w.share(h)).transpose()?);
            Ok(p)
        } else {
            self.transfer_point(key, &tag)
        }
    }

    /// The CPU hogs of a `loaded` point.
    fn hogs_if_loaded(&self, key: &Key) -> io::Result<Option<Hogs>> {
        if key.load == "loaded" {
            self.start_hogs().map(Some)
        } else {
            Ok(None)
        }
    }

    /// A fig3/fig4 point: a fresh back-end, the clients, the server's CPU over the run.
    /// The hogs start once the back-end serves: they load its transfers, not its
    /// start-up (the paper's server ran before its load began).
    fn transfer_point(&self, key: &Key, tag: &str) -> io::Result<RdmaPoint> {
        let mut be = self.start_backend(&key.system, tag)?;
        let hogs = self.hogs_if_loaded(key)?;
        let hogs = hogs.as_ref();
        let mut lg = LoadgenArgs::new(self.server_addr().to_string());
        lg.quiet = true;
        lg.clients = key.clients as usize;
        lg.timeout_ms = CLIENT_TIMEOUT_MS;
        lg.rdma.rdma = Some(if registration_of(&key.system).is_some() {
            RdmaLoad::ServerWrites
        } else if key.system == SYSTEM_XDP_READS {
            lg.rdma.arena_key = Some(self.arena_spec());
            RdmaLoad::XdpReads
        } else if key.system == SYSTEM_XDP_DIRECT {
            lg.rdma.arena_key = Some(self.arena_spec());
            RdmaLoad::XdpDirect
        } else {
            RdmaLoad::Off
        });
        lg.rdma.root = Some(self.docroot.0.clone());
        lg.rdma.warmup_requests = 1;
        if key.experiment == "fig4" {
            lg.rdma.paths = fig4_paths();
            lg.rdma.requests_per_client = Some(FIG4_FILES as u32 * self.plan.fig4_rounds);
            lg.duration_s = FIG4_MAX_S;
        } else {
            // As many requests as fit in the point's time (the CPU counters tick at
            // 10 ms: a longer point resolves the CPU per byte better).
            lg.rdma.paths = vec![size_path(key.size_bytes)];
            lg.duration_s = self.plan.point_s;
        }
        let pid = be.pid();
        let before = ServerCpu::read(pid, self.plan.server_cpu)?;
        let window = HogWindow::start(hogs)?;
        let s = self.load(lg);
        let share = window.zip(hogs).map(|(w, h)| w.share(h)).transpose();
        let after = ServerCpu::read(pid, self.plan.server_cpu);
        be.check_alive()?;
        be.stop();
        let (s, after, share) = (s?, after?, share?);
        for e in &s.errors {
            eprintln!("lab rdma-http: {tag}: {e}");
        }
        for e in &s.arena_fallback_reasons {
            eprintln!("lab rdma-http: {tag}: arena read fell back over HTTP: {e}");
        }
        let warmup_bytes = warmup_bytes(&s);
        let mut p = point_of_load(key, &s, before.since(&after), warmup_bytes);
        p.set_hog_share(share);
        Ok(p)
    }

    /// A table1 point: the registration probe in the server's node.
    fn probe_point(&self, key: &Key, tag: &str) -> io::Result<RdmaPoint> {
        let strategy = registration_of(&key.system).ok_or_else(|| {
            io::Error::other(format!("table1: {} is no registration", key.system))
        })?;
        let out = self.logs.join(format!("{tag}-probe.json"));
        let _ = std::fs::remove_file(&out);
        let args: Vec<String> = [
            "lab",
            "rdma-http",
            "--probe",
            &format!(
                "{strategy}:{}:{}:{}",
                key.size_bytes,
                self.plan.table1_samples,
                self.plan.probe_gap_ms * 1000
            ),
            "--probe-out",
            &out.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = self.logs.join(format!("{tag}-probe.log"));
        let c = self
            .dc
            .spawn_in(SERVER, &std::env::current_exe()?, &args, &log)?;
        let mut c = Child::adopt(&format!("{tag}-probe"), c, log);
        // The probe writes its file (by rename) and exits: done when the file is there.
        let t0 = std::time::Instant::now();
        while !out.exists() {
            if let Some(st) = c.exited() {
                if out.exists() {
                    break;
                }
                return Err(io::Error::other(format!(
                    "{} exited ({st}) without writing {}; log tail:\n{}",
                    c.name,
                    out.display(),
                    crate::fabric::procs::tail(&c.log, 15)
                )));
            }
            if t0.elapsed() > PROBE_MAX {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{} did not finish within {PROBE_MAX:?}", c.name),
                ));
            }
            std::thread::sleep(POLL);
        }
        let text = std::fs::read_to_string(&out)?;
        let samples: Vec<farside_rdmahttp::regbench::Sample> =
            serde_json::from_str(&text).map_err(io::Error::other)?;
        Ok(point_of_probe(key, &samples))
    }
}

/// Body bytes of the warm-up requests (each client's first `warmup_requests` paths,
/// starting at its own): they cost the server CPU in the same window.
pub fn warmup_bytes(s: &farside_loadgen::rdma::RdmaSummary) -> u64 {
    let n = s.file_bytes.len().max(1);
    (0..s.clients)
        .flat_map(|i| (0..s.warmup_requests as usize).map(move |j| (i + j) % n))
        .map(|k| s.file_bytes.get(k).copied().unwrap_or(0))
        .sum()
}

/// `--probe STRATEGY:SIZE:SAMPLES --probe-out FILE`: the registration steps, timed in
/// this process (run inside the server's node by a table1 point).
pub fn run_probe(spec: &str, out: &Path) -> io::Result<()> {
    let parts: Vec<&str> = spec.split(':').collect();
    let [strategy, size, samples, gap_us] = parts[..] else {
        return Err(bad(format!("--probe {spec}: STRATEGY:SIZE:SAMPLES:GAP_US")));
    };
    let gap_us: u64 = gap_us
        .parse()
        .map_err(|_| bad(format!("--probe: gap {gap_us}")))?;
    let strategy = match strategy {
        "static" => Registration::Static,
        "dynamic" => Registration::Dynamic,
        "cache" => Registration::Cache,
        o => return Err(bad(format!("--probe: unknown strategy {o}"))),
    };
    let size: usize = size
        .parse()
        .map_err(|_| bad(format!("--probe: size {size}")))?;
    let samples: usize = samples
        .parse()
        .map_err(|_| bad(format!("--probe: samples {samples}")))?;
    let v =
        farside_rdmahttp::regbench::measure(strategy, size, samples, Duration::from_micros(gap_us))
            .map_err(bad)?;
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_string(&v).map_err(io::Error::other)?)?;
    std::fs::rename(&tmp, out)
}

/// The server's CPU counters: the back-end process's user and system time
/// (`/proc/PID/stat`: all its threads, the exited ones included; clock ticks of 10 ms,
/// the total rounded from the scheduler's exact run time) and the softirq time of its
/// CPU (`/proc/stat`, ticks), ns.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServerCpu {
    pub user_ns: u64,
    pub sys_ns: u64,
    pub softirq_ns: u64,
}

fn tick_ns() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    1_000_000_000 / hz
}

/// utime and stime (ticks) of a `/proc/PID/stat` text (fields 14 and 15; the command
/// name may hold spaces and parentheses, so fields are counted after the last `)`).
pub fn utime_stime_of(stat: &str) -> Option<(u64, u64)> {
    let rest: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some((rest.get(11)?.parse().ok()?, rest.get(12)?.parse().ok()?))
}

/// Softirq ticks of CPU `cpu` in a `/proc/stat` text (`cpuN` line, 7th value).
pub fn softirq_of(stat: &str, cpu: usize) -> Option<u64> {
    let name = format!("cpu{cpu}");
    stat.lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))?
        .split_whitespace()
        .nth(7)?
        .parse()
        .ok()
}

impl ServerCpu {
    /// The counters now: process `pid`'s, CPU `cpu`'s softirq.
    pub fn read(pid: u32, cpu: usize) -> io::Result<ServerCpu> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let (u, s) = utime_stime_of(&stat)
            .ok_or_else(|| io::Error::other(format!("/proc/{pid}/stat: no utime/stime")))?;
        let all = std::fs::read_to_string("/proc/stat")?;
        let si = softirq_of(&all, cpu)
            .ok_or_else(|| io::Error::other(format!("/proc/stat: no cpu{cpu} softirq")))?;
        let t = tick_ns();
        Ok(ServerCpu {
            user_ns: u * t,
            sys_ns: s * t,
            softirq_ns: si * t,
        })
    }

    /// The counters from `self` to `later`.
    pub fn since(&self, later: &ServerCpu) -> ServerCpu {
        ServerCpu {
            user_ns: later.user_ns.saturating_sub(self.user_ns),
            sys_ns: later.sys_ns.saturating_sub(self.sys_ns),
            softirq_ns: later.softirq_ns.saturating_sub(self.softirq_ns),
        }
    }
}

/// Run `farside lab rdma-http`.
pub fn run(a: RdmaHttpArgs) -> io::Result<()> {
    if let Some(spec) = &a.probe {
        let out = a
            .probe_out
            .as_ref()
            .ok_or_else(|| bad("--probe needs --probe-out".into()))?;
        return run_probe(spec, out);
    }
    let plan = check_args(&a)?;
    // SAFETY: geteuid has no preconditions.
    crate::fabric::netns::check_root(unsafe { libc::geteuid() }).map_err(|_| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "lab rdma-http needs root: it builds a network namespace per node with a \
             pinned cgroup, and raises the CPU hogs' priority (--hosts netns)",
        )
    })?;
    let dir = a.sweep.dir(&a.out);
    let mut meta = crate::summary::Summary::new("rdma-http", a.hosts.as_str(), a.sweep.quick);
    crate::sweep::fill_host_metadata(&mut meta);
    meta.params = params(&a, &plan);
    meta.settings.insert(
        "hog_nice".into(),
        crate::summary::Setting::applied(a.hog_nice),
    );
    let mut sweep = crate::sweep::Sweep::<RdmaHttp>::start(&dir, meta, a.sweep.resume.is_some())?;
    let keys = point_keys(&plan);
    let mut lab: Option<Lab> = None;
    let est = plan.point_s + 0.5;
    let result = sweep.run(
        &keys,
        a.repeat,
        est,
        |k: &Key| {
            format!(
                "{} {} {} {}B c{}",
                k.experiment, k.system, k.load, k.size_bytes, k.clients
            )
        },
        |k, run| {
            if lab.is_none() {
                lab = Some(start_lab(&dir, &plan, a.hog_nice)?);
            }
            lab.as_ref().expect("started above").measure(k, run)
        },
    );
    drop(lab);
    sweep.note(CONTROL_NOTE.to_string())?;
    result?;
    sweep.finish()?;
    Ok(())
}

/// What software iWARP can and cannot show (in every run's notes and the report).
pub const CONTROL_NOTE: &str = "software iWARP is the negative control: without an RNIC the \
RDMA transfer is the server's own threads framing MPA/DDP/RDMAP (CRC32c, copies) over a \
kernel TCP socket, so its server CPU per byte is TCP's plus the framing, and under load it \
must degrade like TCP; it shows the protocol end to end (every body checked), the \
registration strategies' costs and the RDMA connection set-up, not the offload. A run on \
real hardware needs an RNIC (or siw/rxe: a kernel with CONFIG_INFINIBAND), the verbs \
transport, and the RNIC driver's interrupt time in the server's CPU";

fn params(a: &RdmaHttpArgs, plan: &Plan) -> serde_json::Value {
    serde_json::json!({
        "experiments": plan.experiments,
        "systems": plan.systems,
        "loads": plan.loads,
        "hog_nice": a.hog_nice,
        "hogs": HOGS,
        "server_weight": format!("the server node's cgroup CPU weight is {SERVER_WEIGHT_FACTOR}x the default (cpu.shares / cpu.weight), so that other users' processes of this shared machine take little of its CPU; hogs and server compete inside it"),
        "hog_placement": "in the server node's cgroup (its cpuset: the server's CPU), tasks beside the server's threads as the paper's processes beside Apache's; placed outside it (one group entity for the whole server) a quick run had tcp 13-34x slower loaded and software iWARP 1-2.6x",
        "hog_rule": HOG_RULE,
        "hog_cpu_frac": "each loaded point's hog_cpu_frac: the hogs' run time (/proc/PID/schedstat, summed over both) over the point's client window's wall time, i.e. their share of the server's one CPU while it was measured (softirq time is not counted as theirs); hog_cpu_frac_min: the least of its runs",
        "table1_sizes": plan.table1_sizes,
        "table1_samples": plan.table1_samples,
        "fig3_sizes": plan.fig3_sizes,
        "fig3_point_s": plan.point_s,
        "fig3_rule": "one client requests its file for point_s after one warm-up request (which sets up the RDMA connection): as many requests as fit",
        "fig4_clients": plan.fig4_clients,
        "fig4_files": FIG4_FILES,
        "fig4_file_bytes": FIG4_FILE_BYTES,
        "fig4_rounds": plan.fig4_rounds,
        "fig4_max_s": FIG4_MAX_S,
        "probe_gap_ms": plan.probe_gap_ms,
        "warmup_requests_per_client": 1,
        "link_mtu": format!("{} on every link (nodes' eth0, bridge ports, bridge): xdp-reads' bulk READs carry as many chunks per reply as it allows (six at 9000, two at 3000); TCP's MSS follows it", plan.link_mtu),
        "xdp_mode": if plan.xdp_mode == "native" { "native: xdp-reads' responder in the server veth's driver path (NAPI), GRO on the server's bridge port (to take XDP_TX frames), the client's bridge port's receive path on the server's CPU (RPS), so the responder runs there" } else { "generic: xdp-reads' responder in the server veth's receive path (skb), on the server's CPU by RPS" },
        "tx_offload": "tx checksum offload on for both nodes' eth0 (ethtool -K eth0 tx on; the bridge-side ends keep the fabric's off): TCP's server sends with segmentation offload, xdp-reads' client does not checksum its READs' padding in software",
        "pin": format!("server node (backend, probe, hogs) and its receive softirq (RPS) on CPU {}, clients on CPU {}", plan.server_cpu, plan.client_cpu),
        "client": "farside loadgen --rdma server-writes (iwarp-*) or off (tcp): the same clients, one kept HTTP connection and one kept RDMA connection per client, every body checked against its file",
        "backend": format!("a fresh farside backend per point, {WORKERS} workers, keep-alive unbounded; iwarp-*: --rdma --rdma-registration static|dynamic|cache, transfer cap {FILE_BYTES_MAX} B, {TRANSFERS_MAX} transfers, {REGISTERED_BYTES_MAX} B registered; xdp-reads: --rdma --rdma-arena-iface eth0 (generic XDP, arena port {ARENA_PORT}, key id {ARENA_KEY_ID}); xdp-direct: the same and --rdma-arena-direct"),
        "server_cpu": "user and system time of the back-end process (all threads, exited ones included: /proc/PID/stat, 10 ms clock ticks) and softirq time of the server's CPU (/proc/stat; bridge forwarding of its packets included) over the whole client run (warm-up included), divided by the body bytes delivered (warm-up included)",
        "connect_us": "RDMA connection set-up seen by the client: request written to MPA set-up done (the server's work to get there included); one per client, in its warm-up request",
        "table1": "one registration step per sample, in a process of the server's node at nice 0: dynamic = register + copy + deregister, static = copy into the pre-registered region, cached = cache hit + register the cached buffer without a copy + deregister; each step after a sleep of probe_gap_ms (0: back to back, a server busy serving; >0: each step just after a wake-up, as a worker idle until its request); avg_ms/p99_ms = wall time, reg_cpu_us = thread CPU time (reading the thread clock included, ~1-3 us here), wall - CPU = waiting for the CPU",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_the_run_time() {
        assert_eq!(schedstat_run_ns("123456 789 10\n"), Some(123_456));
        assert_eq!(schedstat_run_ns(""), None);
        assert_eq!(schedstat_run_ns("x 1 2"), None);
    }

    #[test]
    fn proc_fields_are_read_after_the_command_name() {
        let stat = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 77 33 0 0 20 0 5 0";
        assert_eq!(utime_stime_of(stat), Some((77, 33)));
        let all = "cpu  1 2 3 4 5 6 7 8\ncpu0 10 0 20 30 0 1 9 0\ncpu1 11 0 21 31 0 2 99 0\n";
        assert_eq!(softirq_of(all, 1), Some(99));
        assert_eq!(softirq_of(all, 0), Some(9));
        assert_eq!(softirq_of(all, 2), None);
    }

    #[test]
    fn warm_up_bytes_follow_each_clients_first_paths() {
        let s = farside_loadgen::rdma::RdmaSummary {
            clients: 3,
            warmup_requests: 1,
            file_bytes: vec![10, 20],
            ..Default::default()
        };
        assert_eq!(warmup_bytes(&s), 10 + 20 + 10);
    }
}
