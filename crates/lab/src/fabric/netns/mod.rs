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

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

mod cgroup;
mod clean;
mod slice;
mod sys;

pub use cgroup::*;
pub use clean::*;
pub use slice::{slice_for, SLICE_MIN_US, SLICE_SYSCTL};
use sys::*;

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
const EHASH_SYSCTL: &str = "/proc/sys/net/ipv4/tcp_child_ehash_entries";
/// Lock file (in [`STATE_DIR`]) serialising the read-set-restore of [`EHASH_SYSCTL`]
/// between runs that build namespaces at the same time.
const EHASH_LOCK: &str = "ehash.lock";

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
                .cpus(&crate::fabric::procs::cpu_list(c))
                .rps_cpus(&crate::fabric::procs::cpu_mask(c)),
            None => self,
        }
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
            cfs_slice_lowered: false,
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
        self.build_cgroups()?;

        // 7. The host's CFS bandwidth slice, lowered for the nodes' quotas while the run
        // lives (see `slice`); marked in the state first, so a crash is restored. A kernel
        // without the sysctl has no slice to lower.
        let quota = self
            .nodes
            .iter()
            .filter_map(|n| n.spec.cpu_quota_pct)
            .map(|p| cpu_quota_period(p).0)
            .min();
        if let Some(q) = quota.filter(|_| Path::new(SLICE_SYSCTL).exists()) {
            self.state.cfs_slice_lowered = true;
            write_state(&self.state_path, &self.state)?;
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let (was, now) = slice::lower(Path::new(STATE_DIR), q, cpus)?;
            if now != was {
                log::info!(
                    "lab: host CFS bandwidth slice {now} us while the run lasts (was {was} us; \
                     rule: the smallest node quota {q} us over 2 x {cpus} CPUs)"
                );
            }
        }
        Ok(())
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
                crate::fabric::procs::reset_signal_mask();
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
        if self.state.cfs_slice_lowered {
            release_slice(&mut report);
        }
        if report.errors.is_empty() {
            Ok(())
        } else {
            Err(crate::error::LabError::Cleanup {
                run_id: self.run_id.clone(),
                errors: report.errors.join("; "),
            }
            .into())
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

fn write_state(p: &Path, s: &RunState) -> io::Result<()> {
    fs::create_dir_all(STATE_DIR).map_err(|e| ctx(e, &format!("create {STATE_DIR}")))?;
    let tmp = p.with_extension("json.tmp");
    let body = serde_json::to_vec_pretty(s).map_err(io::Error::other)?;
    fs::write(&tmp, body).map_err(|e| ctx(e, &format!("write {}", tmp.display())))?;
    fs::rename(&tmp, p).map_err(|e| ctx(e, &format!("rename to {}", p.display())))
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
