//! The kernel's run-time statistics of loaded programs: how long each program ran and
//! how often (`bpf_prog_info`'s `run_time_ns` and `run_cnt`, read with
//! `BPF_OBJ_GET_INFO_BY_FD`), so a BPF user can count the kernel's share of its cost.
//!
//! The kernel keeps them only while statistics are on: `sysctl
//! kernel.bpf_stats_enabled=1` (system-wide, until turned off) or an open
//! `BPF_ENABLE_STATS` descriptor ([`enable_stats`], while it lives). Either costs two
//! clock reads on every run of every BPF program on the host, so they are off by
//! default; with them off the figures stay where they were (zero for a program
//! that never ran with them on).

use std::os::fd::OwnedFd;

use crate::error::{Error, Result};
use crate::object::Object;

/// Where the kernel says whether statistics were turned on by sysctl (`0` or `1`; an
/// [`enable_stats`] descriptor turns them on without showing here).
pub const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Run time and count of one loaded program.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgStats {
    /// Runs counted while statistics were on (`run_cnt`).
    pub run_count: u64,
    /// Their total run time, ns (`run_time_ns`).
    pub run_time_ns: u64,
}

impl ProgStats {
    /// Mean run time of one run, ns (0 if none was counted).
    pub fn ns_per_run(&self) -> f64 {
        if self.run_count == 0 {
            0.0
        } else {
            self.run_time_ns as f64 / self.run_count as f64
        }
    }
}

/// Whether `kernel.bpf_stats_enabled` is set (None: unknown, e.g. no /proc or a kernel
/// without statistics). Statistics are also on while some process holds an
/// [`enable_stats`] descriptor, which this does not see.
pub fn stats_enabled() -> Option<bool> {
    let s = std::fs::read_to_string(STATS_SYSCTL).ok()?;
    Some(s.trim() != "0")
}

/// Turn the kernel's run-time statistics on while the returned descriptor is open
/// (`BPF_ENABLE_STATS`, root or CAP_SYS_ADMIN). `label` names the caller in errors.
pub fn enable_stats(label: &'static str) -> Result<OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| {
        Error::classify(label, "BPF_ENABLE_STATS", &e, |detail| Error::Load {
            program: label,
            detail,
        })
    })
}

impl Object {
    /// Run time and count of program `name` (`BPF_OBJ_GET_INFO_BY_FD`). None if the
    /// object has no such program, it is not loaded, or the kernel does not say.
    pub fn program_stats(&self, name: &str) -> Option<ProgStats> {
        let info = self.ebpf().program(name)?.info().ok()?;
        Some(ProgStats {
            run_count: info.run_count(),
            run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_run_time_is_zero_without_runs() {
        assert_eq!(ProgStats::default().ns_per_run(), 0.0);
        let s = ProgStats {
            run_count: 4,
            run_time_ns: 3000,
        };
        assert_eq!(s.ns_per_run(), 750.0);
    }

    #[test]
    fn the_sysctl_reads_as_on_or_off() {
        // Present on every kernel with BPF statistics (5.1+); readable by anyone.
        if std::path::Path::new(STATS_SYSCTL).exists() {
            assert!(stats_enabled().is_some());
        }
    }
}
