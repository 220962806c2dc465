//! The clocks every periodic thread reads ([`mono_ns`], [`coarse_mono_ns`]), a
//! drift-free [`Pacer`] for polling loops, and the civil (UTC) date of a Unix time
//! ([`civil_from_days`], [`utc`]) for logs, HTTP dates and result files.

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

/// `clock_gettime(clock)` in ns.
pub(crate) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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
    fn the_coarse_clock_lags_the_fine_one_by_at_most_a_tick() {
        let a = coarse_mono_ns();
        let b = mono_ns();
        // The coarse clock lags by at most a tick (≤ 10 ms at HZ=100).
        assert!(
            b + 1_000_000 >= a && b.saturating_sub(a) < 10_000_000,
            "{a} {b}"
        );
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

/// (year, month 1..=12, day 1..=31) of `z` days since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, exact over the proleptic Gregorian calendar).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The UTC date and time of `unix_s`: (year, month, day, hour, minute, second).
pub fn utc(unix_s: u64) -> (i64, u32, u32, u32, u32, u32) {
    let (y, m, d) = civil_from_days((unix_s / 86_400) as i64);
    let rem = (unix_s % 86_400) as u32;
    (y, m, d, rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod civil_tests {
    use super::*;

    #[test]
    fn civil_dates_of_known_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        // 2000-02-29 (a leap day in a century year divisible by 400) is day 11,016.
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(utc(1_795_879_662), (2026, 11, 28, 15, 27, 42));
    }
}
