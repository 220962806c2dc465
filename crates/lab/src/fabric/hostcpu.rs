//! The host's CPU time over all its CPUs (`/proc/stat`): what a measurement on this one
//! machine costs the host, every node, client and kernel thread together.

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
pub fn host_ns() -> HostTicks {
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

/// CPUs whose time the `cpu` line of `/proc/stat` sums (its `cpuN` lines; at least 1).
pub fn host_cpus() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let n = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    n.max(1) as f64
}
