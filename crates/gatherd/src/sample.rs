//! Load sources read every period. Files stay open and are re-read with `pread` at
//! offset 0 (procfs and cgroupfs regenerate their content on each read), so a sample
//! costs a few system calls and no allocation.
//!
//! # Queueing delay (`queue_delay_us`)
//!
//! What the objective-driven admission (`proxy --metric delay --target-delay-ms`)
//! keeps under its target is the back-end's queueing delay: how long a request waits
//! before the server starts on it. For an unmodified prefork or event server it is
//! measured from outside, one-sidedly, as **the age of the oldest request that has
//! arrived and not been read**, CoDel's sojourn time: in the full `sock_diag` dump of
//! the watched ports, every established socket with unread bytes (one in an accept
//! queue, or accepted but not read yet) carries `tcp_info.tcpi_last_data_recv`, the
//! time since its data arrived; the largest is the head-of-line wait
//! ([`queue_delay_us`]).
//!
//! Why this and not the alternatives the issue lists:
//! - *queue length / service rate* needs a service rate, and nothing per port counts
//!   accepts or completions (a listener's `tcp_info` holds only its queue length; the
//!   `/proc/net` counters are per host), so the rate would be a guess; the sojourn is
//!   measured directly and needs no rate, so it follows capacity changes (a quota
//!   halving doubles it) and 100x cost differences without a model;
//! - *CPU run-queue delay* (PSI `total` deltas, schedstat) is included where it
//!   matters: a worker that accepted a connection but waits for a CPU before reading
//!   it leaves the request unread, so its wait counts; PSI itself is a fraction of
//!   wall time, not a per-request delay, and is published separately
//!   (`cpu_pressure_ppm`).
//!
//! Limits: the age has the kernel tick's resolution (4 ms at HZ=250, 1 ms at
//! HZ=1000): a target should be a few ticks or the controller sees {0, 4, 8} ms
//! steps; and it is taken with the full count, so it is as fresh as
//! `conns_sampled_mono_ns` (gatherd's `--conns-every`). A kernel-resident sampler
//! that timestamps arrivals could fill the same word at every sample.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes read from one procfs/cgroupfs file per sample; /proc/stat on a 2-CPU machine is
/// ~1.5 KB, and only its first lines are needed.
const READ_BUF_BYTES: usize = 4096;

fn pread_all<'a>(f: &File, buf: &'a mut [u8]) -> io::Result<&'a str> {
    let n = f.read_at(buf, 0)?;
    std::str::from_utf8(&buf[..n])
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}

fn field_after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let i = text.find(key)? + key.len();
    text[i..].split(|c: char| c.is_whitespace()).next()
}

/// Where CPU figures come from: the whole host, or one cgroup v2 (a lab node).
pub enum CpuSource {
    /// All CPUs: the root cgroup's `cpu.stat` (system-wide busy time, 1.6 µs to read)
    /// with runnable tasks from `/proc/loadavg`, or `/proc/stat` where there is no cgroup
    /// v2 root (it computes every IRQ's count on each read: ~8 µs); and `/proc/pressure/cpu`.
    Host {
        stat: File,
        psi: Option<File>,
        root_cpu_stat: Option<File>,
        loadavg: Option<File>,
        /// Online CPUs, read once at start: glibc's `sysconf` opens and reads
        /// `/sys/devices/system/cpu/online` on every call, more than the rest of a sample.
        ncpu: u64,
    },
    /// `<cgroup>/cpu.stat` (`usage_usec`) and `<cgroup>/cpu.pressure`; runnable tasks
    /// are the host's, from `/proc/loadavg` (the same count as /proc/stat's
    /// `procs_running`, at a sixth of its cost: 1.4 µs against 8.3 µs here).
    Cgroup {
        cpu_stat: File,
        psi: Option<File>,
        loadavg: File,
        ncpu: u64,
    },
}

/// Raw cumulative counters at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuCounters {
    /// Busy CPU time, µs (host: non-idle jiffies converted; cgroup: usage_usec).
    pub busy_us: u64,
    /// PSI "some" total stall time, µs, if available.
    pub stall_us: Option<u64>,
    /// procs_running.
    pub runnable: u64,
}

impl CpuSource {
    pub fn host() -> io::Result<Self> {
        let stat = File::open("/proc/stat")?;
        let psi = File::open("/proc/pressure/cpu").ok();
        let mut buf = [0u8; READ_BUF_BYTES];
        let root_cpu_stat = ["/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/unified/cpu.stat"]
            .iter()
            .filter_map(|p| File::open(p).ok())
            .find(|f| pread_all(f, &mut buf).is_ok_and(|t| t.starts_with("usage_usec ")));
        let loadavg = File::open("/proc/loadavg").ok();
        Ok(CpuSource::Host {
            stat,
            psi,
            root_cpu_stat,
            loadavg,
            ncpu: online_cpus(),
        })
    }

    pub fn cgroup(dir: &Path) -> io::Result<Self> {
        let open = |name: &str| -> io::Result<File> {
            let p: PathBuf = dir.join(name);
            File::open(&p).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))
        };
        let cpu_stat = open("cpu.stat")?;
        let psi = open("cpu.pressure").ok();
        let ncpu = cgroup_cpus(dir).unwrap_or_else(online_cpus);
        Ok(CpuSource::Cgroup {
            cpu_stat,
            psi,
            loadavg: File::open("/proc/loadavg")?,
            ncpu,
        })
    }

    /// CPUs the utilisation is relative to.
    pub fn ncpu(&self) -> u64 {
        match self {
            CpuSource::Host { ncpu, .. } | CpuSource::Cgroup { ncpu, .. } => *ncpu,
        }
    }

    pub fn has_psi(&self) -> bool {
        match self {
            CpuSource::Host { psi, .. } | CpuSource::Cgroup { psi, .. } => psi.is_some(),
        }
    }

    pub fn read(&self, buf: &mut [u8; READ_BUF_BYTES]) -> io::Result<CpuCounters> {
        self.read_with_lap(buf, &mut || {})
    }

    /// As [`CpuSource::read`], calling `lap` between the busy-time/runnable reads and
    /// the PSI read (the per-field cost measurement's split point).
    pub fn read_with_lap(
        &self,
        buf: &mut [u8; READ_BUF_BYTES],
        lap: &mut dyn FnMut(),
    ) -> io::Result<CpuCounters> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        let mut c = CpuCounters::default();
        let psi = match self {
            CpuSource::Host {
                root_cpu_stat: Some(cs),
                loadavg: Some(la),
                psi,
                ..
            } => {
                // Fast path: "usage_usec N ..." and "0.00 0.01 0.05 R/T last-pid".
                let t = pread_all(cs, buf)?;
                c.busy_us = field_after(t, "usage_usec ")
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| bad("cpu.stat: no usage_usec"))?;
                c.runnable = loadavg_running(pread_all(la, buf)?)?;
                psi
            }
            CpuSource::Host { stat, psi, .. } => {
                let text = pread_all(stat, buf)?;
                c.runnable = field_after(text, "procs_running ")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let line = text.lines().next().unwrap_or("");
                c.busy_us =
                    parse_proc_stat_busy_us(line).ok_or_else(|| bad("/proc/stat: no cpu line"))?;
                psi
            }
            CpuSource::Cgroup {
                cpu_stat,
                psi,
                loadavg,
                ..
            } => {
                c.runnable = loadavg_running(pread_all(loadavg, buf)?)?;
                let t = pread_all(cpu_stat, buf)?;
                c.busy_us = field_after(t, "usage_usec ")
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| bad("cpu.stat: no usage_usec"))?;
                psi
            }
        };
        lap();
        if let Some(p) = psi {
            let t = pread_all(p, buf)?;
            // First line: "some avg10=.. avg60=.. avg300=.. total=N"
            c.stall_us = t
                .lines()
                .next()
                .and_then(|l| field_after(l, "total="))
                .and_then(|v| v.parse().ok());
        }
        Ok(c)
    }
}

pub const READ_BUF: usize = READ_BUF_BYTES;

/// Runnable tasks from `/proc/loadavg` ("0.00 0.01 0.05 R/T last-pid": R).
fn loadavg_running(t: &str) -> io::Result<u64> {
    t.split_whitespace()
        .nth(3)
        .and_then(|f| f.split_once('/'))
        .and_then(|(r, _)| r.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "/proc/loadavg: no R/T field"))
}

/// The queueing delay published in the region, µs, from one full connection count:
/// the age of the oldest unread request (module doc). 0 when nothing waits.
pub fn queue_delay_us(c: &farside_rt::sockdiag::ConnCounts) -> u64 {
    if c.pending == 0 {
        return 0;
    }
    c.oldest_unread_ms.saturating_mul(1000)
}

/// Busy time from the aggregate `cpu` line of /proc/stat, in µs: user + nice + system +
/// irq + softirq + steal (idle and iowait are not busy).
pub fn parse_proc_stat_busy_us(line: &str) -> Option<u64> {
    let mut it = line.split_ascii_whitespace();
    if it.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = it.take(8).map(|x| x.parse().unwrap_or(0)).collect();
    if v.len() < 8 {
        return None;
    }
    let busy_ticks = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    Some(busy_ticks * (1_000_000 / clock_ticks()))
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

pub fn online_cpus() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as u64
    } else {
        1
    }
}

/// CPUs a cgroup may use: its `cpu.max` quota if set, else its effective cpuset.
pub fn cgroup_cpus(dir: &Path) -> Option<u64> {
    if let Ok(s) = std::fs::read_to_string(dir.join("cpu.max")) {
        let mut it = s.split_whitespace();
        if let (Some(q), Some(p)) = (it.next(), it.next()) {
            if let (Ok(q), Ok(p)) = (q.parse::<f64>(), p.parse::<f64>()) {
                return Some(((q / p).ceil() as u64).max(1));
            }
        }
    }
    let s = std::fs::read_to_string(dir.join("cpuset.cpus.effective")).ok()?;
    Some(count_cpu_list(s.trim()).max(1))
}

/// Count CPUs in a list like `0-3,6`.
pub fn count_cpu_list(s: &str) -> u64 {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('-') {
            Some((a, b)) => {
                b.parse::<u64>()
                    .unwrap_or(0)
                    .saturating_sub(a.parse().unwrap_or(0))
                    + 1
            }
            None => 1,
        })
        .sum()
}

/// MemTotal and MemAvailable from /proc/meminfo, kB.
pub fn meminfo(f: &File, buf: &mut [u8; READ_BUF_BYTES]) -> io::Result<(u64, u64)> {
    let t = pread_all(f, buf)?;
    let get = |k| field_after(t, k).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok((get("MemTotal:"), get("MemAvailable:")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_busy_excludes_idle_and_iowait() {
        let hz = clock_ticks();
        let us = parse_proc_stat_busy_us("cpu  10 1 5 1000 50 2 3 4 0 0").unwrap();
        assert_eq!(us, (10 + 1 + 5 + 2 + 3 + 4) * (1_000_000 / hz));
        assert!(parse_proc_stat_busy_us("cpu0 1 2 3").is_none());
    }

    #[test]
    fn loadavg_gives_the_running_count_or_an_error() {
        assert_eq!(loadavg_running("0.52 0.58 0.59 3/467 12345\n").unwrap(), 3);
        for bad in [
            "",
            "0.52 0.58 0.59",
            "0.52 0.58 0.59 x/467 1",
            "0.52 0.58 0.59 3 1",
        ] {
            assert!(loadavg_running(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(count_cpu_list("0-3,6"), 5);
        assert_eq!(count_cpu_list("1"), 1);
    }

    #[test]
    fn host_source_reads_real_counters() {
        let s = CpuSource::host().unwrap();
        let mut buf = [0u8; READ_BUF_BYTES];
        let a = s.read(&mut buf).unwrap();
        assert!(a.busy_us > 0);
        assert!(a.runnable >= 1, "this test itself is running");
    }
}
