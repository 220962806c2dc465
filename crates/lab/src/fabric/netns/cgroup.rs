//! The nodes' cgroups: CPU quota and period, CPU time read back from a cgroup or a
//! process, the cgroup hierarchies of the host (pure v2 or hybrid v1/v2), and creating a
//! node's cgroup directories with their controllers.
use super::*;

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
pub(super) fn proc_cpu(pid: u32) -> Option<ProcCpu> {
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
    pub(super) fn subtree(&self) -> PathBuf {
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

pub(super) fn mkdir_cg(d: &Path) -> io::Result<()> {
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
pub(super) fn enable_controllers(d: &Path, ctl: &[&str]) -> io::Result<()> {
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
pub(super) fn inherit_cpuset(parent: &Path, child: &Path) -> io::Result<()> {
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
