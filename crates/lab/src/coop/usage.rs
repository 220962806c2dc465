//! What a coop lab point's nodes use while it is measured: CPU time per node cgroup
//! (and per command inside it, to tell nginx from its origin) and the bytes every cache
//! holds, sampled over the measured window.

use super::client::{stat, stats};
use super::crash::READY_POLL;
use super::*;
use crate::fabric::netns::{CpuStat, VirtualDc};
use std::net::SocketAddr;

/// CPU time used by a node's cgroup so far, µs (`usage_usec` of cgroup v2's
/// `cpu.stat`, or v1's `cpuacct.usage`); 0 if neither is readable.
pub(super) fn cgroup_cpu_us(dc: &VirtualDc, node: &str) -> u64 {
    for d in dc.cgroup_dirs(node) {
        if let Ok(t) = std::fs::read_to_string(d.join("cpu.stat")) {
            let v = stat(&t, "usage_usec");
            if v > 0 {
                return v;
            }
        }
        if let Ok(t) = std::fs::read_to_string(d.join("cpuacct.usage")) {
            if let Ok(ns) = t.trim().parse::<u64>() {
                return ns / 1000;
            }
        }
    }
    0
}

/// Processes listed in one node's `cgroup.procs` at most: a node runs a handful.
const NODE_PROCS_MAX: usize = 4096;

/// CPU time (user + system, all threads) of the processes in a node's cgroup whose
/// command name is `comm`, µs, from `/proc/<pid>/stat` (clock-tick resolution). A
/// process that exits between two reads takes its time with it: the lab reads while
/// its processes run.
pub(super) fn cgroup_comm_cpu_us(dc: &VirtualDc, node: &str, comm: &str) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    for d in dc.cgroup_dirs(node) {
        let Ok(procs) = std::fs::read_to_string(d.join("cgroup.procs")) else {
            continue;
        };
        let mut ticks = 0u64;
        let mut any = false;
        for pid in procs.lines().take(NODE_PROCS_MAX) {
            let Ok(st) = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) else {
                continue;
            };
            any = true;
            ticks += proc_stat_ticks(&st, comm).unwrap_or(0);
        }
        if any {
            return ticks * 1_000_000 / hz;
        }
    }
    0
}

/// User + system clock ticks of a `/proc/<pid>/stat` text if its command is `comm`.
pub(super) fn proc_stat_ticks(st: &str, comm: &str) -> Option<u64> {
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    let (open, close) = (st.find('(')?, st.rfind(')')?);
    if st.get(open + 1..close)? != comm {
        return None;
    }
    let f: Vec<&str> = st.get(close + 1..)?.split_whitespace().collect();
    // After ")" the state is stat(5)'s field 3, so utime (14) and stime (15) are
    // indexes 11 and 12.
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(field(11)? + field(12)?)
}

/// The counters at one moment: each stats address's text, the back-end nodes' and the
/// front-end's CPU, and the nginx processes' CPU in the back-end nodes.
pub(super) struct Snapshot {
    pub(super) stats: Vec<String>,
    pub(super) cpu_us: u64,
    pub(super) lb_cpu_us: u64,
    pub(super) nginx_cpu_us: u64,
    /// The back-end nodes' CFS throttling counters, summed over the nodes (zero where
    /// no cgroup has the cpu controller).
    pub(super) throttle: CpuStat,
    /// The host's busy CPU time over all CPUs so far, ns (`/proc/stat`): every node,
    /// client, the front-end and the kernel together.
    pub(super) host_busy_ns: u64,
}

pub(super) fn snapshot(dc: &VirtualDc, nodes: usize, at: &[SocketAddr], nginx: bool) -> Snapshot {
    Snapshot {
        stats: at.iter().map(|&s| stats(s)).collect(),
        cpu_us: (0..nodes).map(|i| cgroup_cpu_us(dc, &node_name(i))).sum(),
        lb_cpu_us: cgroup_cpu_us(dc, LB),
        nginx_cpu_us: if nginx {
            (0..nodes)
                .map(|i| cgroup_comm_cpu_us(dc, &node_name(i), "nginx"))
                .sum()
        } else {
            0
        },
        throttle: (0..nodes)
            .filter_map(|i| dc.cpu_stat(&node_name(i)).ok())
            .fold(CpuStat::default(), |a, c| CpuStat {
                cpu_max: c.cpu_max,
                nr_periods: a.nr_periods + c.nr_periods,
                nr_throttled: a.nr_throttled + c.nr_throttled,
                throttled_us: a.throttled_us + c.throttled_us,
            }),
        host_busy_ns: crate::fabric::hostcpu::host_ns().busy,
    }
}

/// Body bytes the caches hold now, over all nodes: the nginx cache directories'
/// files' apparent bytes (the anchor), else the nodes' `cache_used_bytes`.
pub(super) fn held_now(cache_dirs: &[PathBuf], stats_at: &[SocketAddr]) -> u64 {
    if cache_dirs.is_empty() {
        stats_at
            .iter()
            .map(|&a| stat(&stats(a), "cache_used_bytes"))
            .sum()
    } else {
        cache_dirs.iter().map(|d| dir_bytes(d).apparent).sum()
    }
}

/// Samples [`held_now`] every [`HELD_SAMPLE_INTERVAL`] until `stop`; the samples.
pub(super) fn sample_held(
    cache_dirs: &[PathBuf],
    stats_at: &[SocketAddr],
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<u64> {
    let mut out = Vec::new();
    let mut next = std::time::Instant::now();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let now = std::time::Instant::now();
        if now >= next {
            out.push(held_now(cache_dirs, stats_at));
            next = now + HELD_SAMPLE_INTERVAL;
        }
        std::thread::sleep(READY_POLL);
    }
    out
}

/// Samples, every [`HELD_SAMPLE_INTERVAL`] until `stop`, the requests in the nodes
/// (`inflight`, summed) and the reads in their disks' queues (`disk_queue`, summed),
/// and how long each round of stats reads took, ms.
pub(super) fn sample_queues(
    stats_at: &[SocketAddr],
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<(u64, u64, f64)> {
    let mut out = Vec::new();
    let mut next = std::time::Instant::now();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let now = std::time::Instant::now();
        if now >= next {
            let texts: Vec<String> = stats_at.iter().map(|&a| stats(a)).collect();
            let sum = |k: &str| texts.iter().map(|t| stat(t, k)).sum::<u64>();
            out.push((
                sum("inflight"),
                sum("disk_queue"),
                now.elapsed().as_secs_f64() * 1e3,
            ));
            next = now + HELD_SAMPLE_INTERVAL;
        }
        std::thread::sleep(READY_POLL);
    }
    out
}

/// Files below `dir` at most: the anchor's cache holds a few thousand objects.
const DIR_FILES_MAX: usize = 1_000_000;

/// What a cache directory holds.
#[derive(Default)]
pub(super) struct DirBytes {
    pub(super) files: u64,
    /// The files' sizes.
    pub(super) apparent: u64,
    /// The files' allocated blocks.
    pub(super) allocated: u64,
    /// Subdirectories, and their allocated blocks.
    pub(super) dirs: u64,
    pub(super) dirs_allocated: u64,
}

/// The files and subdirectories under `dir` (at most [`DIR_FILES_MAX`] entries).
pub(super) fn dir_bytes(dir: &Path) -> DirBytes {
    use std::os::unix::fs::MetadataExt;
    let mut b = DirBytes::default();
    let mut seen = 0usize;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > DIR_FILES_MAX {
                return b;
            }
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                b.dirs += 1;
                b.dirs_allocated += m.blocks() * 512;
                todo.push(e.path());
            } else {
                b.files += 1;
                b.apparent += m.len();
                b.allocated += m.blocks() * 512;
            }
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_ticks_sum_user_and_system_of_the_named_command() {
        let st = "4242 (nginx) S 1 4242 4242 0 -1 4194560 900 0 0 0 150 25 0 0 20 0 1 0 \
                  1000 10000000 500 18446744073709551615";
        assert_eq!(proc_stat_ticks(st, "nginx"), Some(175));
        assert_eq!(proc_stat_ticks(st, "farside"), None);
        let odd = "7 (a) b) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0";
        assert_eq!(proc_stat_ticks(odd, "a) b"), Some(7));
        assert_eq!(proc_stat_ticks("7 (nginx) S", "nginx"), None);
    }
}
