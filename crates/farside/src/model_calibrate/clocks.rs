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

/// The host's CPU time so far over all CPUs, in clock ticks (the `cpu` line of
/// `/proc/stat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostTicks {
    /// user + nice + system + irq + softirq + steal (idle and iowait excluded; guest
    /// time is already inside user and nice).
    pub busy: u64,
    pub softirq: u64,
    pub steal: u64,
}

/// The all-CPU line of a `/proc/stat` text: `cpu  user nice system idle iowait irq
/// softirq steal [guest guest_nice]`; `None` if it is missing or malformed.
pub fn parse_proc_stat(text: &str) -> Option<HostTicks> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse::<u64>())
        .collect::<Result<_, _>>()
        .ok()?;
    if v.len() < 7 {
        return None;
    }
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    let (user, nice, system, irq, softirq, steal) = (at(0), at(1), at(2), at(5), at(6), at(7));
    Some(HostTicks {
        busy: user + nice + system + irq + softirq + steal,
        softirq,
        steal,
    })
}

/// The host's CPU time so far, ns (`/proc/stat`; zeros if it cannot be read).
pub(super) fn host_ns() -> HostTicks {
    let t = parse_proc_stat(&std::fs::read_to_string("/proc/stat").unwrap_or_default())
        .unwrap_or_default();
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let ns = |ticks: u64| ticks * 1_000_000_000 / hz;
    HostTicks {
        busy: ns(t.busy),
        softirq: ns(t.softirq),
        steal: ns(t.steal),
    }
}
