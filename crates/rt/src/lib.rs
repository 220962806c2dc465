//! What every periodic farside thread needs and none of the tiers owns: the clocks
//! ([`mono_ns`], [`coarse_mono_ns`]), a drift-free [`Pacer`], and per-thread priority
//! ([`set_thread_nice`], [`apply_thread_nice`]). Used by the remote-memory layer, the
//! monitor, gatherd's sampler, the proxy and the lab's prober; it depends on nothing of
//! farside so that any of them can.

use std::time::{Duration, Instant};

/// CLOCK_MONOTONIC in ns: comparable across processes on one host (shared tables).
pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_MONOTONIC_COARSE in ns: the same clock as [`mono_ns`] at kernel-tick
/// resolution (1–4 ms), at a fraction of the cost. Staleness thresholds are tens of ms,
/// so decision paths use this; a coarse `now` lags, which can only make a record look
/// fresher by at most one tick.
pub fn coarse_mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time the calling thread has used so far, ns (CLOCK_THREAD_CPUTIME_ID): what a
/// periodic thread reports as its own cost.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
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

/// Paces a polling loop at a fixed period without drift; a late wake-up skips ahead
/// instead of bursting to catch up.
pub struct Pacer {
    period: Duration,
    next: Instant,
    /// Periods whose deadline had passed when `wait` was called.
    pub overruns: u64,
}

impl Pacer {
    /// Start pacing at `period`; the first period ends `period` from now. Sets the
    /// calling thread's timer slack to 1 µs so sub-ms periods are kept (the default
    /// slack is 50 µs).
    pub fn new(period: Duration) -> Self {
        // SAFETY: prctl with integer arguments; affects only the calling thread.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64, 0, 0, 0) };
        Pacer {
            period,
            next: Instant::now() + period,
            overruns: 0,
        }
    }

    /// When the current period ends (the next `wait` returns).
    pub fn deadline(&self) -> Instant {
        self.next
    }

    /// Sleep until the next period starts.
    pub fn wait(&mut self) {
        let now = Instant::now();
        if self.next > now {
            std::thread::sleep(self.next - now);
            self.next += self.period;
        } else {
            self.overruns += 1;
            self.next = now + self.period;
        }
    }

    /// Start the next period without sleeping, for a loop that waited on its own (in
    /// `poll`) until [`Pacer::deadline`]: counts an overrun if it is already past the
    /// following deadline.
    pub fn advance(&mut self) {
        let now = Instant::now();
        self.next += self.period;
        if self.next <= now {
            self.overruns += 1;
            self.next = now + self.period;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_agree_within_a_tick_and_thread_time_advances() {
        let a = coarse_mono_ns();
        let b = mono_ns();
        // The coarse clock lags by at most a tick (≤ 10 ms at HZ=100).
        assert!(
            b + 1_000_000 >= a && b.saturating_sub(a) < 10_000_000,
            "{a} {b}"
        );
        let t0 = thread_cpu_ns();
        let mut x = 0u64;
        while thread_cpu_ns() == t0 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(thread_cpu_ns() > t0);
    }

    #[test]
    fn pacer_skips_ahead_after_an_overrun_instead_of_bursting() {
        let period = Duration::from_millis(2);
        let mut p = Pacer::new(period);
        std::thread::sleep(period * 3);
        p.wait();
        assert_eq!(p.overruns, 1);
        let t0 = Instant::now();
        p.wait();
        assert!(t0.elapsed() >= period / 2, "no burst after an overrun");
        p.advance();
        assert!(p.deadline() > Instant::now());
    }
}
