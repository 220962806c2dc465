//! The calling thread's (and process's) CPU time, and per-thread priority.
//!
//! CPU time is what a periodic thread reports as its own cost (gatherd's sampler, the
//! monitor's pollers, specd's per-connection cost) and what the test web server burns
//! to emulate a request's cost: one reading of `CLOCK_THREAD_CPUTIME_ID`, in the unit
//! the caller keeps ([`thread_cpu_ns`], [`thread_cpu_us`], [`thread_cpu`]).

use std::time::Duration;

use crate::clock::clock_ns;

/// CPU time the calling thread has used so far, ns (CLOCK_THREAD_CPUTIME_ID).
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time the calling thread has used so far, µs (whole µs of [`thread_cpu_ns`]).
pub fn thread_cpu_us() -> u64 {
    thread_cpu_ns() / 1000
}

/// CPU time the calling thread has used so far, as a duration.
pub fn thread_cpu() -> Duration {
    Duration::from_nanos(thread_cpu_ns())
}

/// CPU time (user + system, all threads) the calling process has used so far, ns
/// (CLOCK_PROCESS_CPUTIME_ID).
pub fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Set the calling thread's nice value (-20..=19). On Linux `setpriority` on a thread id
/// affects that thread only: a periodic thread (gatherd's sampler, a monitor) can be
/// kept on time on a busy CPU without raising the rest of its process. Lowering it
/// needs CAP_SYS_NICE.
pub fn set_thread_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: gettid and setpriority take plain integers and have no memory effects.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Apply `nice` to the calling periodic thread if it is not 0, logging the outcome as
/// `who` (a failure is a warning: the thread runs on at the process's priority).
pub fn apply_thread_nice(who: &str, nice: i32) {
    if nice == 0 {
        return;
    }
    match set_thread_nice(nice) {
        Ok(()) => log::info!("{who}: thread at nice {nice}"),
        Err(e) => log::warn!("{who}: nice {nice}: {e}; running at the process's priority"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_time_advances_with_work_and_its_units_agree() {
        let t0 = thread_cpu_ns();
        let mut x = 0u64;
        while thread_cpu_ns() == t0 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(thread_cpu_ns() > t0);
        let (ns, us, d) = (thread_cpu_ns(), thread_cpu_us(), thread_cpu());
        assert!(us >= ns / 1000, "{us} µs, {ns} ns");
        assert!(d.as_nanos() as u64 >= ns);
        assert!(
            process_cpu_ns() >= ns,
            "the process has used at least this thread's"
        );
    }

    #[test]
    fn nice_applies_to_the_calling_thread_only() {
        // Raising a thread's nice value needs no privilege; the spawning thread keeps its own.
        // SAFETY: getpriority takes plain integers.
        let prio =
            |tid: libc::pid_t| unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
        // SAFETY: gettid has no preconditions.
        let mine = prio(unsafe { libc::gettid() });
        // Nice stops at 19 (a test run under `nice -n 19` starts there).
        let want = (mine + 3).min(19);
        let theirs = std::thread::spawn(move || {
            set_thread_nice(want).unwrap();
            // SAFETY: as above.
            prio(unsafe { libc::gettid() })
        })
        .join()
        .unwrap();
        assert_eq!(theirs, want);
        // SAFETY: as above.
        assert_eq!(
            prio(unsafe { libc::gettid() }),
            mine,
            "only the other thread"
        );
    }
}
