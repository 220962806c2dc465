//! `--hosts netns`: a multi-host virtual data-center on one machine.
//!
//! Every node is a network namespace `fs-<run_id>-<node>` whose `eth0` (a veth) is
//! plugged into a Linux bridge `br0`. The bridge lives in a namespace of its own,
//! `fs-<run_id>`, so no interface, address or route is ever added to the root
//! namespace and nothing can leave the machine: the nodes' addresses
//! (`10.77.0.(10+i)/24`) exist only inside these namespaces and no default route is
//! added anywhere. Every node also gets a cgroup (cpuset + CPU quota) so that back-ends
//! can be overloaded while the proxy and clients are not, RPS steering of its veth's
//! receive softirq, and tx checksum offload off on both veth ends.
//!
//! # How it works (measured on kernel 6.18)
//!
//! - Namespaces, links, addresses: `ip netns add`, `ip -n NS link/addr ...` (iproute2),
//!   every failure reports the command line and its stderr.
//! - Small TCP established hash per namespace: `net.ipv4.tcp_child_ehash_entries` is
//!   set to [`CHILD_EHASH_ENTRIES`] while the namespaces are created (it is read from the
//!   creator's namespace at creation time) and restored right after; the old value is
//!   in the state file until then, so [`clean_all`] can restore it after a crash. With
//!   the default 0 a namespace shares the root's hash (262,144 buckets here) and every
//!   sock_diag dump walks all of it.
//! - Work inside a namespace from this process: a short-lived thread that calls
//!   `setns(CLONE_NEWNET)` ([`VirtualDc::run_in_ns`]). Sockets keep the namespace they
//!   were created in, so a listener made there can be used from any thread afterwards.
//! - sysfs: `/sys/class/net` shows the devices of the namespace that *mounted* sysfs,
//!   so a thread that only did setns still sees the root's devices. For the RPS write,
//!   the helper thread also does `unshare(CLONE_NEWNS)` (allowed in a multi-threaded
//!   process: it only unshares that thread's fs/mount view), makes `/` private, enters
//!   the netns and mounts a fresh sysfs on `/sys` — what `ip netns exec` does, but
//!   confined to one throw-away thread, so the process's `/sys` and bpffs stay as they are.
//! - Tx checksum offload: the `SIOCETHTOOL`/`ETHTOOL_STXCSUM` ioctl from a thread in
//!   the namespace, the same feature change as `ethtool -K DEV tx off` (TSO follows,
//!   as it depends on checksum offload) without needing the ethtool binary; it is read
//!   back with `ETHTOOL_GTXCSUM`.
//! - Processes: [`VirtualDc::spawn_in`] / [`VirtualDc::prepare_command`] add a
//!   `pre_exec` hook that sets `PR_SET_PDEATHSIG(SIGKILL)`, writes `0` (= itself) into
//!   the node's `cgroup.procs` in every hierarchy (fds opened by the parent, close-on-exec)
//!   and calls `setns` on the node's netns fd, before `exec`. The child keeps the root's
//!   mount namespace: `/sys/fs/bpf` stays visible (XDP pins) but `/sys/class/net` shows the
//!   root's devices (use `/proc/self/net/*`, which follows the netns, or `run_in_ns_sysfs`).
//!   Note PDEATHSIG fires when the *thread* that spawned the child exits: spawn
//!   from a long-lived thread.
//! - Cgroups: on a pure cgroup v2 host the node cgroup is
//!   `/sys/fs/cgroup/farside/<run_id>/<node>` with `cpuset.cpus` and `cpu.max`
//!   (`+cpu +cpuset` enabled in the parents' `cgroup.subtree_control`). On a hybrid
//!   v1/v2 host (cpu and cpuset bound to v1, as on the development VM) the node gets
//!   `farside/<run_id>/<node>` in the v2 `unified` hierarchy (membership, PSI,
//!   `cgroup.kill`), in the v1 `cpuset` hierarchy (`cpuset.cpus`, `cpuset.mems`) and in
//!   the v1 `cpu` hierarchy (`cpu.cfs_quota_us`/`cpu.cfs_period_us`).
//!   [`VirtualDc::cgroup_dir`] is the v2 (or unified) one.
//! - Cleanup: `Drop` kills everything in the node cgroups (`cgroup.kill`, then
//!   SIGKILL of whatever `cgroup.procs` still lists) and every process whose netns is
//!   one of the run's, deletes the namespaces (which destroys the veths and the bridge),
//!   removes the cgroups and the state file `/run/farside-lab/<run_id>.json`, which was
//!   written before anything was created. [`clean_all`] (`farside lab clean`) removes
//!   whatever any run left: all `fs-*` namespaces, root-namespace links named `fs-*`
//!   (none are ever created; defensive), `farside/` cgroups and state files.

use std::ffi::CString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Prefix of every namespace (and of any root-namespace link) the lab creates.
pub const NETNS_PREFIX: &str = "fs-";
/// Where the state files of runs live.
pub const STATE_DIR: &str = "/run/farside-lab";
/// Where `ip netns` keeps its namespace handles.
pub const NETNS_DIR: &str = "/run/netns";
/// Mount point of the cgroup file systems.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// Name of the lab's subtree in every cgroup hierarchy.
pub const CGROUP_SUBTREE: &str = "farside";
/// TCP established-hash buckets of every node namespace.
pub const CHILD_EHASH_ENTRIES: u32 = 4096;
/// Name of each node's veth inside its namespace.
pub const VETH_IN_NS: &str = "eth0";
/// Name of the bridge inside the bridge namespace.
pub const BRIDGE: &str = "br0";
/// The nodes' subnet: node `i` is `10.77.0.(10+i)/24`.
pub const SUBNET: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 0);
/// Prefix length of [`SUBNET`].
pub const SUBNET_PREFIX_LEN: u8 = 24;
/// First host number of the nodes.
pub const FIRST_HOST: u8 = 10;
/// Most nodes a run can have.
pub const MAX_NODES: usize = 240;
/// CFS period (µs) of a node's CPU quota (`cpu.max` / `cpu.cfs_period_us`): 10 ms, so
/// a throttled node waits at most one short period for its next share; the kernel's
/// default 100 ms would stall a node for up to ~100 ms at a time, which dominates a p99
/// of a few ms. [`cpu_quota_period`] lengthens it only where the quota would fall below
/// [`CPU_QUOTA_MIN_US`].
pub const CPU_PERIOD_US: u64 = 10_000;
/// The kernel's smallest CFS quota per period, µs (`cpu.cfs_quota_us` below 1 ms is
/// refused with EINVAL).
pub const CPU_QUOTA_MIN_US: u64 = 1_000;

/// The CFS quota and period (µs) of a CPU quota of `pct` percent of one CPU: the period
/// is [`CPU_PERIOD_US`], lengthened just enough that the quota is at least
/// [`CPU_QUOTA_MIN_US`] (below 10 %).
pub fn cpu_quota_period(pct: u32) -> (u64, u64) {
    let pct = u64::from(pct.max(1));
    let period = CPU_PERIOD_US.max((CPU_QUOTA_MIN_US * 100).div_ceil(pct));
    (pct * period / 100, period)
}

/// A node cgroup's CPU quota and throttling counters (`cpu.max`/`cpu.cfs_*` and
/// `cpu.stat`), read from the hierarchy that holds the cpu controller.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuStat {
    /// The quota as the kernel has it, `"QUOTA PERIOD"` in µs (`"max PERIOD"`: none).
    pub cpu_max: String,
    /// CFS periods in which the cgroup ran.
    pub nr_periods: u64,
    /// Periods in which it used up its quota and was throttled.
    pub nr_throttled: u64,
    /// Total time its tasks were throttled, µs.
    pub throttled_us: u64,
}

impl CpuStat {
    /// The counters of `self` minus those of `before` (the quota is `self`'s).
    pub fn since(&self, before: &CpuStat) -> CpuStat {
        CpuStat {
            cpu_max: self.cpu_max.clone(),
            nr_periods: self.nr_periods.saturating_sub(before.nr_periods),
            nr_throttled: self.nr_throttled.saturating_sub(before.nr_throttled),
            throttled_us: self.throttled_us.saturating_sub(before.throttled_us),
        }
    }
}

/// Parses a `cpu.stat` (v2: `throttled_usec`; v1: `throttled_time` in ns).
pub fn parse_cpu_stat(text: &str) -> CpuStat {
    let mut s = CpuStat::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next().and_then(|v| v.parse::<u64>().ok())) else {
            continue;
        };
        match k {
            "nr_periods" => s.nr_periods = v,
            "nr_throttled" => s.nr_throttled = v,
            "throttled_usec" => s.throttled_us = v,
            "throttled_time" => s.throttled_us = v / 1000,
            _ => {}
        }
    }
    s
}

/// CPU time of one process of a node, from `/proc/PID/stat` (all its threads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcCpu {
    pub pid: u32,
    /// The command name (`comm`), e.g. `nginx` or `farside`.
    pub comm: String,
    /// utime + stime, µs (clock-tick resolution, 10 ms at the usual 100 Hz).
    pub cpu_us: u64,
}

/// utime + stime of `pid` in µs and its `comm`, if it exists.
fn proc_cpu(pid: u32) -> Option<ProcCpu> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let comm = s[s.find('(')? + 1..s.rfind(')')?].to_string();
    let rest: Vec<&str> = s[s.rfind(')')? + 1..].split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the comm.
    let ticks: u64 = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ProcCpu {
        pid,
        comm,
        cpu_us: ticks * 1_000_000 / hz,
    })
}

const EHASH_SYSCTL: &str = "/proc/sys/net/ipv4/tcp_child_ehash_entries";
/// Lock file (in [`STATE_DIR`]) serialising the read-set-restore of [`EHASH_SYSCTL`]
/// between runs that build namespaces at the same time.
const EHASH_LOCK: &str = "ehash.lock";

/// `path` opened (created if missing) and locked exclusively with `flock`; the lock
/// lasts as long as the returned file.
fn lock_exclusive(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    // SAFETY: flock on a descriptor this function owns; it blocks until the lock is ours.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}
const NOT_ROOT: &str =
    "--hosts netns needs root (network namespaces, cgroups); run as root or use --hosts loopback";
/// How long teardown waits for killed processes to leave a cgroup.
const KILL_WAIT: Duration = Duration::from_secs(3);

/// One node (host) of the virtual data-center.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// Node name: `[A-Za-z0-9_-]`, at most 32 bytes, unique in the run.
    pub name: String,
    /// cpuset of the node's cgroup, e.g. `"1"` or `"0-1"`; `None`: all CPUs.
    pub cpus: Option<String>,
    /// CPU quota in percent of one CPU (`50` = half a CPU, `200` = two CPUs);
    /// `None`: unlimited.
    pub cpu_quota_pct: Option<u32>,
    /// RPS CPU mask (hex, as in `rps_cpus`, e.g. `"2"` = CPU 1) for the node's `eth0`:
    /// the CPU that runs the receive softirq (and XDP) of the node's packets.
    /// `None`: leave RPS off (the softirq runs on the sender's CPU).
    pub rps_cpus: Option<String>,
}

impl NodeSpec {
    /// A node without CPU restrictions.
    pub fn new(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.to_string(),
            cpus: None,
            cpu_quota_pct: None,
            rps_cpus: None,
        }
    }

    pub fn cpus(mut self, cpus: &str) -> NodeSpec {
        self.cpus = Some(cpus.to_string());
        self
    }

    pub fn cpu_quota_pct(mut self, pct: u32) -> NodeSpec {
        self.cpu_quota_pct = Some(pct);
        self
    }

    pub fn rps_cpus(mut self, mask: &str) -> NodeSpec {
        self.rps_cpus = Some(mask.to_string());
        self
    }

    /// The node's processes and its receive softirq (RPS) on `cpus`; `None` leaves
    /// the node on every CPU.
    pub fn pinned(self, cpus: Option<&[usize]>) -> NodeSpec {
        match cpus {
            Some(c) => self
                .cpus(&crate::procs::cpu_list(c))
                .rps_cpus(&crate::procs::cpu_mask(c)),
            None => self,
        }
    }
}

/// The kind of one cgroup hierarchy the lab uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CgroupKind {
    /// Pure cgroup v2 with the cpu and cpuset controllers.
    V2,
    /// The v2 `unified` hierarchy of a hybrid host: membership, PSI and `cgroup.kill` only.
    Unified,
    /// The v1 cpuset hierarchy.
    V1Cpuset,
    /// The v1 cpu hierarchy.
    V1Cpu,
}

/// One cgroup hierarchy (its mount point).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hierarchy {
    pub kind: CgroupKind,
    pub mount: PathBuf,
}

impl Hierarchy {
    fn subtree(&self) -> PathBuf {
        self.mount.join(CGROUP_SUBTREE)
    }
}

/// The cgroup hierarchies of this host, primary (v2 / unified) first.
pub fn cgroup_hierarchies() -> io::Result<Vec<Hierarchy>> {
    let root = Path::new(CGROUP_MOUNT);
    if root.join("cgroup.controllers").exists() {
        return Ok(vec![Hierarchy {
            kind: CgroupKind::V2,
            mount: root.to_path_buf(),
        }]);
    }
    let cpuset = root.join("cpuset");
    let cpu = root.join("cpu");
    if cpuset.join("cpuset.cpus").exists() && cpu.join("cpu.cfs_quota_us").exists() {
        let mut v = Vec::new();
        let unified = root.join("unified");
        if unified.join("cgroup.procs").exists() {
            v.push(Hierarchy {
                kind: CgroupKind::Unified,
                mount: unified,
            });
        }
        v.push(Hierarchy {
            kind: CgroupKind::V1Cpuset,
            mount: cpuset,
        });
        v.push(Hierarchy {
            kind: CgroupKind::V1Cpu,
            mount: cpu,
        });
        return Ok(v);
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "--hosts netns: no usable cgroup file system under {CGROUP_MOUNT} (need cgroup v2 \
             with the cpu and cpuset controllers, or v1 cpu and cpuset hierarchies)"
        ),
    ))
}

/// What a run created (or is about to create); written to `/run/farside-lab/<run_id>.json`
/// before anything is created.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunState {
    pub run_id: String,
    pub owner_pid: u32,
    /// Start time (clock ticks since boot) of the owner, against pid reuse.
    pub owner_start: u64,
    /// Namespaces (bridge namespace first).
    pub namespaces: Vec<String>,
    /// `farside/<run_id>` directory in every cgroup hierarchy.
    pub cgroup_dirs: Vec<PathBuf>,
    /// Previous `net.ipv4.tcp_child_ehash_entries` while the run has it changed.
    pub ehash_prev: Option<String>,
}

impl RunState {
    fn owner_alive(&self) -> bool {
        process_start(self.owner_pid).is_some_and(|s| s == self.owner_start)
    }
}

#[derive(Debug)]
struct Node {
    spec: NodeSpec,
    netns: String,
    ip: Ipv4Addr,
    /// Bridge-side veth name (in the bridge namespace).
    peer: String,
}

/// A virtual data-center: one network namespace per node on a bridge, with per-node
/// cgroups. Dropping it removes everything it created.
#[derive(Debug)]
pub struct VirtualDc {
    run_id: String,
    nodes: Vec<Node>,
    bridge_netns: String,
    hierarchies: Vec<Hierarchy>,
    state: RunState,
    state_path: PathBuf,
    torn_down: bool,
}

/// Is the effective user root?
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The error returned when not root (also what [`VirtualDc::create_as`] checks).
pub fn check_root(euid: u32) -> io::Result<()> {
    if euid == 0 {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::PermissionDenied, NOT_ROOT))
    }
}

fn valid_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Namespace name of a node.
pub fn netns_name(run_id: &str, node: &str) -> String {
    format!("{NETNS_PREFIX}{run_id}-{node}")
}

/// Namespace name of a run's bridge.
pub fn bridge_netns_name(run_id: &str) -> String {
    format!("{NETNS_PREFIX}{run_id}")
}

fn state_path(run_id: &str) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{run_id}.json"))
}

impl VirtualDc {
    /// Build the data-center for `run_id` (must be root). See the module docs.
    pub fn create(run_id: &str, nodes: &[NodeSpec]) -> io::Result<VirtualDc> {
        // SAFETY: geteuid has no preconditions.
        Self::create_as(unsafe { libc::geteuid() }, run_id, nodes)
    }

    /// [`VirtualDc::create`] with the effective uid given: fails with a clear error and
    /// creates nothing unless `euid == 0`.
    pub fn create_as(euid: u32, run_id: &str, nodes: &[NodeSpec]) -> io::Result<VirtualDc> {
        check_root(euid)?;
        if !valid_name(run_id, 32) {
            return Err(invalid(format!(
                "--hosts netns: bad run id {run_id:?} (1-32 of [A-Za-z0-9_-])"
            )));
        }
        if nodes.is_empty() || nodes.len() > MAX_NODES {
            return Err(invalid(format!(
                "--hosts netns: need 1..={MAX_NODES} nodes, got {}",
                nodes.len()
            )));
        }
        for (i, n) in nodes.iter().enumerate() {
            if !valid_name(&n.name, 32) {
                return Err(invalid(format!(
                    "--hosts netns: bad node name {:?} (1-32 of [A-Za-z0-9_-])",
                    n.name
                )));
            }
            if nodes[..i].iter().any(|m| m.name == n.name) {
                return Err(invalid(format!(
                    "--hosts netns: node {:?} given twice",
                    n.name
                )));
            }
            if n.cpu_quota_pct == Some(0) {
                return Err(invalid(format!(
                    "--hosts netns: node {}: CPU quota 0%",
                    n.name
                )));
            }
            if let Some(m) = &n.rps_cpus {
                if m.is_empty() || !m.bytes().all(|b| b.is_ascii_hexdigit() || b == b',') {
                    return Err(invalid(format!(
                        "--hosts netns: node {}: bad RPS mask {m:?} (hex CPU mask, e.g. \"2\")",
                        n.name
                    )));
                }
            }
            if let Some(c) = &n.cpus {
                if c.is_empty()
                    || !c
                        .bytes()
                        .all(|b| b.is_ascii_digit() || b == b',' || b == b'-')
                {
                    return Err(invalid(format!(
                        "--hosts netns: node {}: bad cpuset {c:?} (e.g. \"1\" or \"0-1\")",
                        n.name
                    )));
                }
            }
        }
        let hierarchies = cgroup_hierarchies()?;
        let bridge_netns = bridge_netns_name(run_id);
        let mut namespaces = vec![bridge_netns.clone()];
        namespaces.extend(nodes.iter().map(|n| netns_name(run_id, &n.name)));
        for ns in &namespaces {
            if Path::new(NETNS_DIR).join(ns).exists() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "--hosts netns: namespace {ns} already exists (a run with id {run_id} \
                         is active or crashed; `farside lab clean` removes leftovers)"
                    ),
                ));
            }
        }
        let cgroup_dirs: Vec<PathBuf> = hierarchies
            .iter()
            .map(|h| h.subtree().join(run_id))
            .collect();
        if let Some(d) = cgroup_dirs.iter().find(|d| d.exists()) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "--hosts netns: cgroup {} already exists (`farside lab clean` removes \
                     leftovers)",
                    d.display()
                ),
            ));
        }
        let state_path = state_path(run_id);
        if state_path.exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "--hosts netns: {} exists (a run with id {run_id} is active or crashed; \
                     `farside lab clean` removes leftovers)",
                    state_path.display()
                ),
            ));
        }
        let me = std::process::id();
        let state = RunState {
            run_id: run_id.to_string(),
            owner_pid: me,
            owner_start: process_start(me).unwrap_or(0),
            namespaces,
            cgroup_dirs,
            ehash_prev: fs::read_to_string(EHASH_SYSCTL)
                .ok()
                .map(|s| s.trim().to_string()),
        };
        let mut dc = VirtualDc {
            run_id: run_id.to_string(),
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| Node {
                    spec: n.clone(),
                    netns: netns_name(run_id, &n.name),
                    ip: node_addr(i),
                    peer: truncate_ifname(&format!("v{i}-{}", n.name)),
                })
                .collect(),
            bridge_netns,
            hierarchies,
            state,
            state_path,
            torn_down: false,
        };
        // From here on, Drop cleans up whatever was created if a step fails.
        write_state(&dc.state_path, &dc.state)?;
        let t0 = Instant::now();
        dc.build()?;
        log::info!(
            "lab: netns data-center {run_id} with {} nodes built in {:?}",
            dc.nodes.len(),
            t0.elapsed()
        );
        Ok(dc)
    }

    fn build(&mut self) -> io::Result<()> {
        // 1. Namespaces, with a small TCP established hash each. The sysctl is
        // host-wide: two runs building at once would each read the other's 4096 as the
        // value to restore and leave it set, so read, set, create and restore hold one
        // host-wide lock (an flock, released when `_ehash_lock` drops, also on a crash).
        fs::create_dir_all(STATE_DIR)?;
        let _ehash_lock = lock_exclusive(&Path::new(STATE_DIR).join(EHASH_LOCK))?;
        self.state.ehash_prev = fs::read_to_string(EHASH_SYSCTL)
            .ok()
            .map(|s| s.trim().to_string());
        write_state(&self.state_path, &self.state)?;
        let prev = self.state.ehash_prev.clone();
        if prev.is_some() {
            write_file(
                Path::new(EHASH_SYSCTL),
                &CHILD_EHASH_ENTRIES.to_string(),
                "set the namespaces' TCP hash size",
            )?;
        }
        let created = (|| {
            for ns in &self.state.namespaces {
                ip(&["netns", "add", ns])?;
            }
            Ok::<_, io::Error>(())
        })();
        if let Some(p) = &prev {
            write_file(Path::new(EHASH_SYSCTL), p, "restore")?;
            self.state.ehash_prev = None;
            write_state(&self.state_path, &self.state)?;
        }
        created?;

        // 2. The bridge, in its own namespace.
        let br = self.bridge_netns.clone();
        ip(&["-n", &br, "link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", BRIDGE, "up"])?;
        ip(&["-n", &br, "link", "set", "lo", "up"])?;

        // 3. One veth pair per node: `eth0` in the node, `v<i>-<node>` on the bridge.
        for n in &self.nodes {
            let addr = format!("{}/{SUBNET_PREFIX_LEN}", n.ip);
            ip(&[
                "-n", &br, "link", "add", &n.peer, "type", "veth", "peer", "name", VETH_IN_NS,
                "netns", &n.netns,
            ])?;
            ip(&["-n", &br, "link", "set", &n.peer, "master", BRIDGE])?;
            ip(&["-n", &br, "link", "set", &n.peer, "up"])?;
            ip(&["-n", &n.netns, "addr", "add", &addr, "dev", VETH_IN_NS])?;
            ip(&["-n", &n.netns, "link", "set", VETH_IN_NS, "up"])?;
            ip(&["-n", &n.netns, "link", "set", "lo", "up"])?;
        }

        // 4. Tx checksum offload off on both ends (veth leaves partial sums otherwise).
        let br_path = netns_path_of(&br);
        let peers: Vec<String> = self.nodes.iter().map(|n| n.peer.clone()).collect();
        in_netns(&br_path, move || {
            for p in &peers {
                tx_csum_off(p)?;
            }
            Ok(())
        })?;
        for n in &self.nodes {
            in_netns(&netns_path_of(&n.netns), || tx_csum_off(VETH_IN_NS))?;
        }

        // 5. RPS steering inside each node (needs the node's own sysfs).
        for n in &self.nodes {
            if let Some(mask) = &n.spec.rps_cpus {
                let mask = mask.clone();
                in_netns_sysfs(&netns_path_of(&n.netns), move |sys| {
                    let f = sys.join(format!("class/net/{VETH_IN_NS}/queues/rx-0/rps_cpus"));
                    write_file(&f, &mask, "set RPS CPUs")
                })?;
            }
        }

        // 6. Cgroups.
        self.build_cgroups()
    }

    fn build_cgroups(&self) -> io::Result<()> {
        let need_cpuset = self.nodes.iter().any(|n| n.spec.cpus.is_some());
        let need_cpu = self.nodes.iter().any(|n| n.spec.cpu_quota_pct.is_some());
        for h in &self.hierarchies {
            let sub = h.subtree();
            let run = sub.join(&self.run_id);
            match h.kind {
                CgroupKind::V2 => {
                    let mut ctl = Vec::new();
                    if need_cpu {
                        ctl.push("cpu");
                    }
                    if need_cpuset {
                        ctl.push("cpuset");
                    }
                    enable_controllers(&h.mount, &ctl)?;
                    mkdir_cg(&sub)?;
                    enable_controllers(&sub, &ctl)?;
                    mkdir_cg(&run)?;
                    enable_controllers(&run, &ctl)?;
                }
                CgroupKind::V1Cpuset => {
                    mkdir_cg(&sub)?;
                    inherit_cpuset(&h.mount, &sub)?;
                    mkdir_cg(&run)?;
                    inherit_cpuset(&sub, &run)?;
                }
                CgroupKind::Unified | CgroupKind::V1Cpu => {
                    mkdir_cg(&sub)?;
                    mkdir_cg(&run)?;
                }
            }
            for n in &self.nodes {
                let d = run.join(&n.spec.name);
                mkdir_cg(&d)?;
                match h.kind {
                    CgroupKind::V2 => {
                        if let Some(c) = &n.spec.cpus {
                            write_file(&d.join("cpuset.cpus"), c, "set the node's CPUs")?;
                        }
                        if let Some(p) = n.spec.cpu_quota_pct {
                            let (q, period) = cpu_quota_period(p);
                            write_file(
                                &d.join("cpu.max"),
                                &format!("{q} {period}"),
                                "set the node's CPU quota",
                            )?;
                        }
                    }
                    CgroupKind::V1Cpuset => {
                        inherit_cpuset(&run, &d)?;
                        if let Some(c) = &n.spec.cpus {
                            write_file(&d.join("cpuset.cpus"), c, "set the node's CPUs")?;
                        }
                    }
                    CgroupKind::V1Cpu => {
                        if let Some(p) = n.spec.cpu_quota_pct {
                            let (q, period) = cpu_quota_period(p);
                            write_file(
                                &d.join("cpu.cfs_period_us"),
                                &period.to_string(),
                                "set the node's CPU period",
                            )?;
                            write_file(
                                &d.join("cpu.cfs_quota_us"),
                                &q.to_string(),
                                "set the node's CPU quota",
                            )?;
                        }
                    }
                    CgroupKind::Unified => {}
                }
            }
        }
        Ok(())
    }

    fn node(&self, node: &str) -> io::Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.spec.name == node)
            .ok_or_else(|| {
                invalid(format!(
                    "--hosts netns: run {} has no node {node:?}",
                    self.run_id
                ))
            })
    }

    fn node_or_panic(&self, node: &str) -> &Node {
        match self.node(node) {
            Ok(n) => n,
            Err(e) => panic!("{e}"),
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The nodes, in creation order.
    pub fn nodes(&self) -> Vec<&NodeSpec> {
        self.nodes.iter().map(|n| &n.spec).collect()
    }

    /// The node's address (`10.77.0.(10+i)`). Panics on an unknown node.
    pub fn node_ip(&self, node: &str) -> Ipv4Addr {
        self.node_or_panic(node).ip
    }

    /// `/run/netns/fs-<run_id>-<node>`: open it and `setns` to enter the node.
    pub fn netns_path(&self, node: &str) -> PathBuf {
        netns_path_of(&netns_name(&self.run_id, node))
    }

    /// Namespace name of the node (`ip -n NAME ...`).
    pub fn netns_name(&self, node: &str) -> String {
        netns_name(&self.run_id, node)
    }

    /// The node's interface inside its namespace (for XDP attach): always `eth0`.
    pub fn veth_in_ns(&self, node: &str) -> String {
        let _ = self.node_or_panic(node);
        VETH_IN_NS.to_string()
    }

    /// The bridge-side end of the node's veth, in [`VirtualDc::bridge_netns_path`]
    /// (native XDP on veth needs a program, even a bare XDP_PASS, on this peer).
    pub fn veth_peer(&self, node: &str) -> String {
        self.node_or_panic(node).peer.clone()
    }

    /// The bridge's namespace.
    pub fn bridge_netns_path(&self) -> PathBuf {
        netns_path_of(&self.bridge_netns)
    }

    /// The node's cgroup in the v2 hierarchy (on a hybrid host: in the `unified` one,
    /// which has membership, PSI and `cgroup.kill`; cpuset/quota are in the v1 ones, see
    /// [`VirtualDc::cgroup_dirs`]).
    pub fn cgroup_dir(&self, node: &str) -> PathBuf {
        self.cgroup_dirs(node)[0].clone()
    }

    /// The node's cgroup in every hierarchy used.
    pub fn cgroup_dirs(&self, node: &str) -> Vec<PathBuf> {
        let _ = self.node_or_panic(node);
        self.hierarchies
            .iter()
            .map(|h| h.subtree().join(&self.run_id).join(node))
            .collect()
    }

    /// The node's CPU quota and throttling counters, from the hierarchy with the cpu
    /// controller (v2 `cpu.max` + `cpu.stat`; v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us` +
    /// `cpu.stat`).
    pub fn cpu_stat(&self, node: &str) -> io::Result<CpuStat> {
        self.node(node)?;
        for d in self.cgroup_dirs(node) {
            let Ok(stat) = fs::read_to_string(d.join("cpu.stat")) else {
                continue;
            };
            if !stat.contains("nr_throttled") {
                continue;
            }
            let cpu_max = match fs::read_to_string(d.join("cpu.max")) {
                Ok(m) => m.trim().to_string(),
                Err(_) => {
                    let rd = |f: &str| {
                        fs::read_to_string(d.join(f))
                            .map(|v| v.trim().to_string())
                            .map_err(|e| ctx(e, &format!("read {}", d.join(f).display())))
                    };
                    let q = rd("cpu.cfs_quota_us")?;
                    let p = rd("cpu.cfs_period_us")?;
                    format!("{} {p}", if q == "-1" { "max" } else { q.as_str() })
                }
            };
            return Ok(CpuStat {
                cpu_max,
                ..parse_cpu_stat(&stat)
            });
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("--hosts netns: node {node}: no cgroup with the cpu controller's cpu.stat"),
        ))
    }

    /// CPU time of every process in the node's cgroup (e.g. to tell the web server's
    /// share of a quota from the gatherer's).
    pub fn node_procs_cpu(&self, node: &str) -> io::Result<Vec<ProcCpu>> {
        let d = self.cgroup_dir(node);
        let procs = fs::read_to_string(d.join("cgroup.procs"))
            .map_err(|e| ctx(e, &format!("read {}", d.join("cgroup.procs").display())))?;
        Ok(procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .filter_map(proc_cpu)
            .collect())
    }

    /// The hierarchies used.
    pub fn hierarchies(&self) -> &[Hierarchy] {
        &self.hierarchies
    }

    /// Make `cmd` run inside the node's netns and cgroup, dying with the spawning
    /// thread (PR_SET_PDEATHSIG, SIGKILL). Stdio and the rest are up to the caller.
    pub fn prepare_command(&self, node: &str, cmd: &mut Command) -> io::Result<()> {
        let n = self.node(node)?;
        let nsfd: OwnedFd = open_ctx(&netns_path_of(&n.netns), false)?.into();
        let mut procs: Vec<OwnedFd> = Vec::new();
        for d in self.cgroup_dirs(node) {
            procs.push(open_ctx(&d.join("cgroup.procs"), true)?.into());
        }
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: only async-signal-safe calls (prctl, getppid, write, setns) between
        // fork and exec; the fds are owned by the closure and close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                crate::procs::reset_signal_mask();
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    // The parent died before PDEATHSIG was armed.
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                for fd in &procs {
                    // "0" = the writing process itself (v1 and v2).
                    if libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                        return Err(io::Error::last_os_error());
                    }
                }
                if libc::setns(nsfd.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(())
    }

    /// Start `program args` as a process of `node` (its netns and cgroup), stdin from
    /// /dev/null, stdout and stderr appended to `log`.
    pub fn spawn_in(
        &self,
        node: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> io::Result<Child> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| ctx(e, &format!("open log {}", log.display())))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        self.prepare_command(node, &mut cmd)?;
        let child = cmd.spawn().map_err(|e| {
            ctx(
                e,
                &format!(
                    "--hosts netns: start {} {} on node {node}",
                    program.display(),
                    args.join(" ")
                ),
            )
        })?;
        log::debug!(
            "lab: node {node}: started pid {}: {} {}",
            child.id(),
            program.display(),
            args.join(" ")
        );
        Ok(child)
    }

    /// Start `busy_procs` busy-looping processes (`/bin/sh -c 'while :; do :; done'`) in
    /// the node's cgroup (the papers' emulated background load); they are killed when the
    /// handle drops.
    pub fn start_cpu_load(&self, node: &str, busy_procs: usize) -> io::Result<LoadHandle> {
        let mut h = LoadHandle {
            children: Vec::new(),
        };
        for _ in 0..busy_procs {
            let mut cmd = Command::new("/bin/sh");
            cmd.args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            self.prepare_command(node, &mut cmd)?;
            h.children.push(
                cmd.spawn()
                    .map_err(|e| ctx(e, &format!("start CPU load on node {node}")))?,
            );
        }
        Ok(h)
    }

    /// Run `f` on a helper thread inside the node's netns (sockets created there stay
    /// in the node). The thread exits afterwards.
    pub fn run_in_ns<T: Send>(
        &self,
        node: &str,
        f: impl FnOnce() -> io::Result<T> + Send,
    ) -> io::Result<T> {
        in_netns(&netns_path_of(&self.node(node)?.netns), f)
    }

    /// Like [`VirtualDc::run_in_ns`], with a private mount namespace in which the
    /// node's own sysfs is mounted on `/sys` (passed to `f`).
    pub fn run_in_ns_sysfs<T: Send>(
        &self,
        node: &str,
        f: impl FnOnce(&Path) -> io::Result<T> + Send,
    ) -> io::Result<T> {
        in_netns_sysfs(&netns_path_of(&self.node(node)?.netns), f)
    }

    /// Set a per-namespace sysctl in the node, e.g. `("net/core/somaxconn", "4096")`.
    pub fn set_sysctl(&self, node: &str, key: &str, value: &str) -> io::Result<()> {
        let p = Path::new("/proc/sys").join(key);
        let v = value.to_string();
        self.run_in_ns(node, move || write_file(&p, &v, "set sysctl"))
    }

    /// Tear everything down now, reporting the first error (Drop does the same silently).
    pub fn destroy(mut self) -> io::Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> io::Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        let mut report = CleanReport::default();
        clean_run(&self.state, &mut report);
        if let Some(p) = &self.state.ehash_prev {
            // Only if create failed between setting and restoring it.
            if let Err(e) = write_file(Path::new(EHASH_SYSCTL), p, "restore") {
                report.errors.push(e.to_string());
            }
        }
        match fs::remove_file(&self.state_path) {
            Ok(()) => report.state_files.push(self.state_path.clone()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => report
                .errors
                .push(format!("remove {}: {e}", self.state_path.display())),
        }
        if report.errors.is_empty() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "--hosts netns: cleanup of run {}: {}",
                self.run_id,
                report.errors.join("; ")
            )))
        }
    }
}

impl Drop for VirtualDc {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            log::warn!("{e}");
        }
    }
}

/// Busy-looping processes of [`VirtualDc::start_cpu_load`]; killed on drop.
#[derive(Debug)]
pub struct LoadHandle {
    children: Vec<Child>,
}

impl LoadHandle {
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    /// Kill the load now.
    pub fn stop(self) {}
}

impl Drop for LoadHandle {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
    }
}

/// What [`clean_all`] (or a teardown) removed.
#[derive(Debug, Default, Clone, Serialize)]
pub struct CleanReport {
    pub namespaces: Vec<String>,
    pub links: Vec<String>,
    pub cgroups: Vec<PathBuf>,
    pub state_files: Vec<PathBuf>,
    pub killed_pids: Vec<u32>,
    /// `net.ipv4.tcp_child_ehash_entries` restored to this value.
    pub sysctl_restored: Option<String>,
    pub errors: Vec<String>,
}

impl CleanReport {
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.links.is_empty()
            && self.cgroups.is_empty()
            && self.state_files.is_empty()
            && self.killed_pids.is_empty()
            && self.sysctl_restored.is_none()
    }
}

impl fmt::Display for CleanReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() && self.errors.is_empty() {
            return writeln!(f, "lab clean: nothing to remove");
        }
        for p in &self.killed_pids {
            writeln!(f, "killed process {p}")?;
        }
        for n in &self.namespaces {
            writeln!(f, "removed namespace {n}")?;
        }
        for l in &self.links {
            writeln!(f, "removed link {l}")?;
        }
        for c in &self.cgroups {
            writeln!(f, "removed cgroup {}", c.display())?;
        }
        for s in &self.state_files {
            writeln!(f, "removed state file {}", s.display())?;
        }
        if let Some(v) = &self.sysctl_restored {
            writeln!(f, "restored net.ipv4.tcp_child_ehash_entries = {v}")?;
        }
        for e in &self.errors {
            writeln!(f, "error: {e}")?;
        }
        Ok(())
    }
}

/// Remove everything any `--hosts netns` run left behind (including runs that are still
/// active!): all `fs-*` namespaces and the processes in them, root-namespace links named
/// `fs-*`, the `farside/` cgroups in every hierarchy, and the state files (restoring the
/// TCP hash sysctl if a run crashed while it was changed). Idempotent.
pub fn clean_all() -> io::Result<CleanReport> {
    check_root(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
    )?;
    let mut r = CleanReport::default();
    let states = read_states(&mut r);
    if let Some(p) = states.iter().find_map(|(_, s)| s.ehash_prev.clone()) {
        match write_file(Path::new(EHASH_SYSCTL), &p, "restore") {
            Ok(()) => r.sysctl_restored = Some(p),
            Err(e) => r.errors.push(e.to_string()),
        }
    }
    for (_, s) in &states {
        clean_run(s, &mut r);
    }
    // Namespaces no state file names.
    for ns in list_netns()? {
        if ns.starts_with(NETNS_PREFIX) {
            remove_netns(&ns, &mut r);
        }
    }
    // Root-namespace links (the lab makes none; defensive).
    if let Ok(out) = ip(&["-o", "link", "show"]) {
        for l in out.lines() {
            let name = l.split(':').nth(1).map(str::trim).unwrap_or("");
            let name = name.split('@').next().unwrap_or("");
            if name.starts_with(NETNS_PREFIX) {
                match ip(&["link", "del", name]) {
                    Ok(_) => r.links.push(name.to_string()),
                    Err(e) => r.errors.push(e.to_string()),
                }
            }
        }
    }
    // Cgroups no state file names.
    if let Ok(hs) = cgroup_hierarchies() {
        for h in hs {
            let sub = h.subtree();
            if let Ok(rd) = fs::read_dir(&sub) {
                for e in rd.flatten() {
                    if e.path().is_dir() {
                        remove_run_cgroup(&e.path(), &mut r);
                    }
                }
            }
            if sub.exists() {
                match fs::remove_dir(&sub) {
                    Ok(()) => r.cgroups.push(sub),
                    Err(e) => r.errors.push(format!("rmdir {}: {e}", sub.display())),
                }
            }
        }
    }
    for (p, _) in states {
        match fs::remove_file(&p) {
            Ok(()) => r.state_files.push(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => r.errors.push(format!("remove {}: {e}", p.display())),
        }
    }
    Ok(r)
}

/// Remove what runs whose owner process is dead left behind (safe to call while other
/// runs are active, e.g. when a lab starts). Only runs with a state file are found.
pub fn clean_stale() -> io::Result<CleanReport> {
    check_root(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
    )?;
    let mut r = CleanReport::default();
    for (p, s) in read_states(&mut r) {
        if s.owner_alive() {
            continue;
        }
        if let Some(v) = &s.ehash_prev {
            match write_file(Path::new(EHASH_SYSCTL), v, "restore") {
                Ok(()) => r.sysctl_restored = Some(v.clone()),
                Err(e) => r.errors.push(e.to_string()),
            }
        }
        clean_run(&s, &mut r);
        match fs::remove_file(&p) {
            Ok(()) => r.state_files.push(p),
            Err(e) => r.errors.push(format!("remove {}: {e}", p.display())),
        }
    }
    Ok(r)
}

/// Remove what one run (by run id) created, whether or not its owner is alive: what an
/// interrupted lab calls for its own run, leaving other runs alone.
pub fn clean_run_id(run_id: &str) -> io::Result<CleanReport> {
    check_root(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
    )?;
    let mut r = CleanReport::default();
    for (p, s) in read_states(&mut r) {
        if p.file_stem().is_none_or(|x| x != run_id) {
            continue;
        }
        if let Some(v) = &s.ehash_prev {
            match write_file(Path::new(EHASH_SYSCTL), v, "restore") {
                Ok(()) => r.sysctl_restored = Some(v.clone()),
                Err(e) => r.errors.push(e.to_string()),
            }
        }
        clean_run(&s, &mut r);
        match fs::remove_file(&p) {
            Ok(()) => r.state_files.push(p),
            Err(e) => r.errors.push(format!("remove {}: {e}", p.display())),
        }
    }
    Ok(r)
}

/// The state files of all runs.
pub fn read_states(r: &mut CleanReport) -> Vec<(PathBuf, RunState)> {
    let mut v = Vec::new();
    let Ok(rd) = fs::read_dir(STATE_DIR) else {
        return v;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        match fs::read(&p)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<RunState>(&b).map_err(|e| e.to_string()))
        {
            Ok(s) => v.push((p, s)),
            Err(e) => {
                r.errors.push(format!("{}: {e} (removed)", p.display()));
                let _ = fs::remove_file(&p);
            }
        }
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Kill a run's processes, delete its namespaces and cgroups.
fn clean_run(s: &RunState, r: &mut CleanReport) {
    // Processes first: cgroup members, then anything else inside the namespaces.
    for d in &s.cgroup_dirs {
        if d.exists() {
            remove_run_cgroup(d, r);
        }
    }
    for ns in s.namespaces.iter().rev() {
        remove_netns(ns, r);
    }
    // Cgroups again, in case a namespace process was in them.
    for d in &s.cgroup_dirs {
        if d.exists() {
            remove_run_cgroup(d, r);
        }
    }
}

fn remove_netns(ns: &str, r: &mut CleanReport) {
    let path = netns_path_of(ns);
    let Ok(md) = fs::metadata(&path) else {
        return;
    };
    kill_netns_procs(md.ino(), r);
    match ip(&["netns", "del", ns]) {
        Ok(_) => r.namespaces.push(ns.to_string()),
        Err(e) => {
            if path.exists() {
                r.errors.push(e.to_string());
            }
        }
    }
}

/// SIGKILL every process (but this one) whose netns has inode `ino`.
fn kill_netns_procs(ino: u64, r: &mut CleanReport) {
    let me = std::process::id();
    let want = format!("net:[{ino}]");
    let Ok(rd) = fs::read_dir("/proc") else {
        return;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if fs::read_link(e.path().join("ns/net")).is_ok_and(|l| l.as_os_str() == want.as_str()) {
            // SAFETY: kill has no memory-safety preconditions.
            if unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } == 0 {
                r.killed_pids.push(pid);
            }
        }
    }
}

/// Remove `farside/<run_id>` in one hierarchy: kill its processes, rmdir the node
/// cgroups and the run's.
fn remove_run_cgroup(run: &Path, r: &mut CleanReport) {
    let mut dirs: Vec<PathBuf> = fs::read_dir(run)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    dirs.push(run.to_path_buf());
    for d in &dirs {
        kill_cgroup(d, r);
    }
    for d in &dirs {
        let deadline = Instant::now() + KILL_WAIT;
        loop {
            match fs::remove_dir(d) {
                Ok(()) => {
                    r.cgroups.push(d.clone());
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) if Instant::now() < deadline && e.raw_os_error() == Some(libc::EBUSY) => {
                    kill_cgroup(d, r);
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => {
                    r.errors.push(format!("rmdir {}: {e}", d.display()));
                    break;
                }
            }
        }
    }
}

/// SIGKILL a cgroup's processes: `cgroup.kill` (v2, also kills processes forked
/// meanwhile), then each pid `cgroup.procs` still lists.
fn kill_cgroup(d: &Path, r: &mut CleanReport) {
    let kill = d.join("cgroup.kill");
    if kill.exists() {
        let _ = fs::write(kill, "1");
    }
    let me = std::process::id();
    if let Ok(s) = fs::read_to_string(d.join("cgroup.procs")) {
        for pid in s.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            if pid == me {
                continue;
            }
            // SAFETY: kill has no memory-safety preconditions.
            if unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } == 0
                && !r.killed_pids.contains(&pid)
            {
                r.killed_pids.push(pid);
            }
        }
    }
}

/// Names in `ip netns list`.
pub fn list_netns() -> io::Result<Vec<String>> {
    Ok(ip(&["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

fn netns_path_of(ns: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(ns)
}

fn node_addr(i: usize) -> Ipv4Addr {
    let o = SUBNET.octets();
    Ipv4Addr::new(o[0], o[1], o[2], FIRST_HOST + i as u8)
}

fn truncate_ifname(s: &str) -> String {
    // IFNAMSIZ - 1; names are ASCII (validated).
    s.chars().take(15).collect()
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn open_ctx(p: &Path, write: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .open(p)
        .map_err(|e| ctx(e, &format!("open {}", p.display())))
}

fn write_file(p: &Path, v: &str, what: &str) -> io::Result<()> {
    fs::write(p, v).map_err(|e| {
        ctx(
            e,
            &format!("--hosts netns: {what}: write {v:?} to {}", p.display()),
        )
    })
}

fn write_state(p: &Path, s: &RunState) -> io::Result<()> {
    fs::create_dir_all(STATE_DIR).map_err(|e| ctx(e, &format!("create {STATE_DIR}")))?;
    let tmp = p.with_extension("json.tmp");
    let body = serde_json::to_vec_pretty(s).map_err(io::Error::other)?;
    fs::write(&tmp, body).map_err(|e| ctx(e, &format!("write {}", tmp.display())))?;
    fs::rename(&tmp, p).map_err(|e| ctx(e, &format!("rename to {}", p.display())))
}

fn mkdir_cg(d: &Path) -> io::Result<()> {
    match fs::create_dir(d) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(ctx(
            e,
            &format!("--hosts netns: create cgroup {}", d.display()),
        )),
    }
}

/// v2: enable `ctl` in `d/cgroup.subtree_control` where not yet enabled.
fn enable_controllers(d: &Path, ctl: &[&str]) -> io::Result<()> {
    let on = fs::read_to_string(d.join("cgroup.subtree_control")).unwrap_or_default();
    let avail = fs::read_to_string(d.join("cgroup.controllers")).unwrap_or_default();
    for c in ctl {
        if on.split_whitespace().any(|x| x == *c) {
            continue;
        }
        if !avail.split_whitespace().any(|x| x == *c) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "--hosts netns: cgroup controller {c} is not available in {} (controllers: \
                     {}); per-node CPU limits need it",
                    d.display(),
                    avail.trim()
                ),
            ));
        }
        fs::write(d.join("cgroup.subtree_control"), format!("+{c}")).map_err(|e| {
            let hint = if e.raw_os_error() == Some(libc::EBUSY) {
                " (the cgroup has processes of its own: cgroup v2 forbids controllers there; \
                 in a container, move its processes into a child cgroup first)"
            } else {
                ""
            };
            ctx(
                e,
                &format!(
                    "--hosts netns: enable +{c} in {}/cgroup.subtree_control{hint}",
                    d.display()
                ),
            )
        })?;
    }
    Ok(())
}

/// v1 cpuset: a new cpuset has empty `cpus`/`mems` and takes no tasks until both are set.
fn inherit_cpuset(parent: &Path, child: &Path) -> io::Result<()> {
    for f in ["cpuset.cpus", "cpuset.mems"] {
        let cur = fs::read_to_string(child.join(f)).unwrap_or_default();
        if cur.trim().is_empty() {
            let v = fs::read_to_string(parent.join(f))
                .map_err(|e| ctx(e, &format!("read {}", parent.join(f).display())))?;
            write_file(&child.join(f), v.trim(), "inherit cpuset")?;
        }
    }
    Ok(())
}

/// Start time of a process (field 22 of /proc/PID/stat), if it exists.
fn process_start(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may contain spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Run `ip ARGS`; errors carry the command line and its stderr.
fn ip(args: &[&str]) -> io::Result<String> {
    let line = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            ctx(
                e,
                &format!("--hosts netns: cannot run `{line}` (is iproute2 installed?)"),
            )
        })?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "--hosts netns: `{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn setns_net(f: &File) -> io::Result<()> {
    // SAFETY: setns on a valid fd; only affects the calling thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn join<T>(r: std::thread::Result<io::Result<T>>) -> io::Result<T> {
    r.unwrap_or_else(|_| {
        Err(io::Error::other(
            "--hosts netns: namespace helper thread panicked",
        ))
    })
}

/// Run `f` on a fresh thread that entered the netns at `ns`.
fn in_netns<T: Send>(ns: &Path, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let fd = open_ctx(ns, false)?;
    std::thread::scope(|s| {
        join(
            s.spawn(move || {
                setns_net(&fd).map_err(|e| ctx(e, &format!("setns {}", ns.display())))?;
                f()
            })
            .join(),
        )
    })
}

/// Run `f` on a fresh thread with a private mount namespace, inside the netns at `ns`,
/// with that netns's sysfs mounted on `/sys`.
fn in_netns_sysfs<T: Send>(
    ns: &Path,
    f: impl FnOnce(&Path) -> io::Result<T> + Send,
) -> io::Result<T> {
    let fd = open_ctx(ns, false)?;
    std::thread::scope(|s| {
        join(
            s.spawn(move || {
                // SAFETY: unshare/mount affect only this thread's fs and mount view.
                unsafe {
                    if libc::unshare(libc::CLONE_NEWNS) != 0 {
                        return Err(ctx(io::Error::last_os_error(), "unshare(CLONE_NEWNS)"));
                    }
                    let root = CString::new("/").unwrap_or_default();
                    if libc::mount(
                        std::ptr::null(),
                        root.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(ctx(io::Error::last_os_error(), "make / private"));
                    }
                }
                setns_net(&fd).map_err(|e| ctx(e, &format!("setns {}", ns.display())))?;
                let sysfs = CString::new("sysfs").unwrap_or_default();
                let sys = CString::new("/sys").unwrap_or_default();
                // SAFETY: valid C strings; the mount lives in this thread's mount namespace.
                if unsafe {
                    libc::mount(
                        sysfs.as_ptr(),
                        sys.as_ptr(),
                        sysfs.as_ptr(),
                        0,
                        std::ptr::null(),
                    )
                } != 0
                {
                    return Err(ctx(io::Error::last_os_error(), "mount the netns's sysfs"));
                }
                f(Path::new("/sys"))
            })
            .join(),
        )
    })
}

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;

#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn ethtool_value(sock: &OwnedFd, dev: &str, cmd: u32, data: u32) -> io::Result<u32> {
    let mut v = EthtoolValue { cmd, data };
    let mut ifr = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: (&mut v as *mut EthtoolValue).cast(),
        _pad: [0; 16],
    };
    for (d, s) in ifr
        .name
        .iter_mut()
        .zip(dev.bytes().take(libc::IFNAMSIZ - 1))
    {
        *d = s as libc::c_char;
    }
    // SAFETY: ifr points to a valid ifreq whose data points to a live ethtool_value.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut ifr) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v.data)
}

/// `ethtool -K DEV tx off` for a device of the calling thread's netns.
fn tx_csum_off(dev: &str) -> io::Result<()> {
    // SAFETY: plain socket(2); the result is checked and owned.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor we own.
    let sock = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let what = format!("--hosts netns: tx checksum offload off on {dev} (ethtool -K {dev} tx off)");
    ethtool_value(&sock, dev, ETHTOOL_STXCSUM, 0).map_err(|e| ctx(e, &what))?;
    let now = ethtool_value(&sock, dev, ETHTOOL_GTXCSUM, 0).map_err(|e| ctx(e, &what))?;
    if now != 0 {
        return Err(io::Error::other(format!(
            "{what}: still on after the change"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_root_is_refused_before_anything() {
        let e = VirtualDc::create_as(1000, "zz", &[NodeSpec::new("a")]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("--hosts netns needs root"));
        assert!(!state_path("zz").exists());
    }

    #[test]
    fn names_and_addresses() {
        assert_eq!(node_addr(0), Ipv4Addr::new(10, 77, 0, 10));
        assert_eq!(
            truncate_ifname("v12-averyveryverylongname"),
            "v12-averyveryve"
        );
        assert_eq!(netns_name("r1", "be0"), "fs-r1-be0");
        assert!(!valid_name("a b", 32));
        assert!(!valid_name("a/b", 32));
        assert!(valid_name("be-0_x", 32));
    }

    #[test]
    fn quota_period_is_short_and_never_below_the_kernel_minimum() {
        assert_eq!(cpu_quota_period(50), (5_000, CPU_PERIOD_US));
        assert_eq!(cpu_quota_period(10), (1_000, 10_000));
        assert_eq!(cpu_quota_period(200), (20_000, 10_000));
        // Below 10 % the period grows so that the quota stays at 1 ms.
        assert_eq!(cpu_quota_period(5), (1_000, 20_000));
        assert_eq!(cpu_quota_period(3), (1_000, 33_334));
        let (q, p) = cpu_quota_period(1);
        assert_eq!((q, p), (1_000, 100_000));
    }

    #[test]
    fn cpu_stat_parses_v1_and_v2() {
        let v2 = "usage_usec 10\nnr_periods 7\nnr_throttled 3\nthrottled_usec 4500\n";
        let s = parse_cpu_stat(v2);
        assert_eq!((s.nr_periods, s.nr_throttled, s.throttled_us), (7, 3, 4500));
        let v1 = "nr_periods 9\nnr_throttled 2\nthrottled_time 5000000\n";
        let s = parse_cpu_stat(v1);
        assert_eq!((s.nr_periods, s.nr_throttled, s.throttled_us), (9, 2, 5000));
        let d = s.since(&parse_cpu_stat("nr_periods 4\nnr_throttled 1\n"));
        assert_eq!((d.nr_periods, d.nr_throttled), (5, 1));
        let me = proc_cpu(std::process::id()).unwrap();
        assert!(!me.comm.is_empty());
    }

    #[test]
    fn proc_start_time() {
        assert!(process_start(std::process::id()).is_some());
        assert!(process_start(u32::MAX - 1).is_none());
    }
}
