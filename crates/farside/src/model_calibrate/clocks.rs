//! The calibration's clocks: this process's and a thread's CPU time, a node cgroup's
//! CPU time, and the host's busy, softirq and steal time from `/proc/stat`.

use farside_lab::fabric::netns::VirtualDc;

/// A CPU-time clock, ns: `clock_gettime` reads the scheduler's exact runtime (rusage's
/// user/system split is scaled from tick samples and held monotonic per field, so its
/// sum can lag by a tick over a short interval: a directory phase read 0 and 2.7 us
/// for the same work).
fn cpu_clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct it is given and nothing else.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time of this process (every thread, the ended ones included), ns.
pub(super) fn process_cpu_ns() -> u64 {
    cpu_clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time of the calling thread, ns.
pub(super) fn thread_cpu_ns() -> u64 {
    cpu_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of a node's cgroup so far, ns (v1 `cpuacct.usage`, else v2 `usage_usec`).
pub(super) fn cgroup_cpu_ns(dc: &VirtualDc, node: &str) -> u64 {
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

pub use farside_lab::fabric::hostcpu::host_ns;
