//! The host's CFS bandwidth slice while nodes have CPU quotas.
//!
//! The kernel hands a cgroup's quota to each CPU's run queue in slices of
//! `kernel.sched_cfs_bandwidth_slice_us` (5 ms by default). A node's quota per period is
//! 4 ms at 40 % of a 10 ms period ([`CPU_PERIOD_US`]): less than one slice, so the first
//! CPU that runs one of the node's threads takes the whole quota, and the node's threads
//! woken on the other CPU wait, throttled, although the node is within its quota. A node
//! of "40 % of one CPU" then stalls a thread for up to a period at every such wake-up,
//! which a machine of that speed never does. Measured (W99, 4 nodes at 40 %, 4 runs each,
//! 29 Nov 2026, `docs/results/coop/20261129d-slice-ab`): at 5 ms press-udp's nodes were
//! throttled 153-170 ms/s each and its peer fetch took 770-880 µs; at 1 ms 59-69 ms/s and
//! 420-750 µs, and its throughput rose 16 %.
//!
//! Rule ([`slice_for`]): a slice of at most the smallest node quota over twice the host's
//! CPUs, so that the slices every CPU may hold at once add up to half a quota at most; never
//! below [`SLICE_MIN_US`], never above the host's own setting. The lab lowers the sysctl
//! while a run with quotas lives and restores it when the last such run ends (a host-wide
//! flock serialises the read-set-restore; the value to restore is kept in
//! `/run/farside-lab/cfs-slice.orig`, so `farside lab clean` restores it after a crash).
use super::sys::{ctx, lock_exclusive, write_file};
use std::fs;
use std::io;
use std::path::Path;

/// The host-wide sysctl (µs).
pub const SLICE_SYSCTL: &str = "/proc/sys/kernel/sched_cfs_bandwidth_slice_us";
/// The smallest slice the lab sets, µs: below it every few µs of a node's CPU would take the
/// bandwidth pool's lock.
pub const SLICE_MIN_US: u64 = 100;
/// Lock file (in the runs' state directory) serialising the read-set-restore of [`SLICE_SYSCTL`].
const SLICE_LOCK: &str = "cfs-slice.lock";
/// File (in the runs' state directory) holding the host's own slice while a run has it lowered.
const SLICE_ORIG: &str = "cfs-slice.orig";

/// The slice (µs) for nodes whose smallest quota per period is `quota_us` on a host of
/// `cpus` CPUs, the host's setting being `host_us`: see the module docs.
pub fn slice_for(quota_us: u64, cpus: usize, host_us: u64) -> u64 {
    let cpus = cpus.max(1) as u64;
    (quota_us / (2 * cpus)).max(SLICE_MIN_US).min(host_us)
}

fn read_us(p: &Path) -> io::Result<u64> {
    let s = fs::read_to_string(p).map_err(|e| ctx(e, &format!("read {}", p.display())))?;
    s.trim().parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {s:?}: {e}", p.display()),
        )
    })
}

/// Lowers the host's slice for nodes whose smallest quota is `quota_us`: returns the
/// slice before and after (equal: left as it was). `dir` is the runs' state directory;
/// the caller has marked its run state (`cfs_slice_lowered`) before, so a crash in
/// between is restored by `farside lab clean`.
pub(super) fn lower(dir: &Path, quota_us: u64, cpus: usize) -> io::Result<(u64, u64)> {
    fs::create_dir_all(dir).map_err(|e| ctx(e, &format!("create {}", dir.display())))?;
    let _lock = lock_exclusive(&dir.join(SLICE_LOCK))?;
    let was = read_us(Path::new(SLICE_SYSCTL))?;
    let orig = dir.join(SLICE_ORIG);
    let host = match read_us(&orig) {
        Ok(v) => v,
        Err(_) => {
            fs::write(&orig, was.to_string())
                .map_err(|e| ctx(e, &format!("write {}", orig.display())))?;
            was
        }
    };
    let now = slice_for(quota_us, cpus, host).min(was);
    if now != was {
        write_file(
            Path::new(SLICE_SYSCTL),
            &now.to_string(),
            "set the CFS bandwidth slice",
        )?;
    }
    Ok((was, now))
}

/// Restores the host's slice (from `dir`'s record of it) unless `held()` says a live run
/// still has it lowered, asked under the lock: the value restored, `None` when held or
/// nothing was lowered.
pub(super) fn release(dir: &Path, held: impl FnOnce() -> bool) -> io::Result<Option<u64>> {
    let _lock = lock_exclusive(&dir.join(SLICE_LOCK))?;
    let orig = dir.join(SLICE_ORIG);
    if !orig.exists() || held() {
        return Ok(None);
    }
    let v = read_us(&orig)?;
    write_file(Path::new(SLICE_SYSCTL), &v.to_string(), "restore")?;
    fs::remove_file(&orig).map_err(|e| ctx(e, &format!("remove {}", orig.display())))?;
    Ok(Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slice_is_half_a_quota_over_the_cpus_within_its_bounds() {
        // 40 % of 10 ms on 2 CPUs: 4 ms / 4.
        assert_eq!(slice_for(4_000, 2, 5_000), 1_000);
        // 20 %: 500 µs; 8 CPUs at 40 %: 250 µs.
        assert_eq!(slice_for(2_000, 2, 5_000), 500);
        assert_eq!(slice_for(4_000, 8, 5_000), 250);
        // Never below the floor, never above the host's own setting.
        assert_eq!(slice_for(1_000, 64, 5_000), SLICE_MIN_US);
        assert_eq!(slice_for(40_000, 2, 5_000), 5_000);
        assert_eq!(slice_for(4_000, 2, 700), 700);
        // No CPUs reported counts as one.
        assert_eq!(slice_for(4_000, 0, 5_000), 2_000);
    }
}
