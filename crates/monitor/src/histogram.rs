//! A fixed-bucket, lock-free duration histogram for the monitor: how long its reads take
//! and how often fresh load reaches the proxy. One writer (a monitor thread) and any
//! number of readers (metrics scrapes); rendered as a Prometheus histogram in seconds.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bucket mantissas per decade: steps of at most 1.67x keep a quantile estimated from
/// the buckets within that factor (enough to tell 30 µs from 3 ms).
const MANTISSAS: [u64; 6] = [10, 15, 20, 30, 50, 70];
/// Decades covered: 1 µs up to 1 s (a read slower than the 1 s cap is a timeout anyway).
const DECADES: usize = 6;
/// Number of finite buckets: every mantissa of every decade, plus 1 s.
pub const BUCKETS: usize = MANTISSAS.len() * DECADES + 1;

/// Upper bounds of the finite buckets, ns (1 µs, 1.5 µs, 2 µs, 3 µs, 5 µs, 7 µs, 10 µs,
/// ..., 700 ms, 1 s); one more bucket counts everything above.
pub const BOUNDS_NS: [u64; BUCKETS] = bounds();

const fn bounds() -> [u64; BUCKETS] {
    let mut b = [0u64; BUCKETS];
    let mut scale = 100; // ns per mantissa unit in the first decade: 10 x 100 ns = 1 µs
    let mut d = 0;
    while d < DECADES {
        let mut m = 0;
        while m < MANTISSAS.len() {
            b[d * MANTISSAS.len() + m] = MANTISSAS[m] * scale;
            m += 1;
        }
        scale *= 10;
        d += 1;
    }
    b[BUCKETS - 1] = 1_000_000_000;
    b
}

/// Counts of durations per bucket, their sum and count.
pub struct Histogram {
    /// `counts[i]` for `BOUNDS_NS[i - 1] < x <= BOUNDS_NS[i]`; the last is the overflow.
    counts: [AtomicU64; BUCKETS + 1],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn record(&self, ns: u64) {
        let i = BOUNDS_NS.partition_point(|&b| b < ns);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Durations recorded so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Report as histogram `name` (seconds) with `labels` to the scrape's encoder.
    pub fn render(
        &self,
        enc: &mut farside_admin::Encoder,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
    ) {
        let n = |i: usize| self.counts[i].load(Ordering::Relaxed);
        enc.histogram(
            name,
            help,
            labels,
            BOUNDS_NS
                .iter()
                .enumerate()
                .map(|(i, &b)| (b as f64 / 1e9, n(i))),
            n(BOUNDS_NS.len()),
            self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_rise_from_one_microsecond_to_one_second() {
        assert_eq!(BOUNDS_NS[0], 1_000);
        assert_eq!(BOUNDS_NS[5], 7_000);
        assert_eq!(BOUNDS_NS[6], 10_000);
        assert_eq!(BOUNDS_NS[BUCKETS - 2], 700_000_000);
        assert_eq!(BOUNDS_NS[BUCKETS - 1], 1_000_000_000);
        assert!(BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn renders_cumulative_buckets_in_seconds() {
        let h = Histogram::default();
        for ns in [500, 1_000, 1_001, 40_000, 3_000_000_000] {
            h.record(ns);
        }
        assert_eq!(h.count(), 5);
        let mut e = farside_admin::Encoder::new();
        h.render(&mut e, "x_seconds", "X.", &[("b", "1")]);
        let out = e.finish();
        let line = |le: &str| {
            out.lines()
                .find(|l| l.starts_with(&format!("x_seconds_bucket{{b=\"1\",le=\"{le}\"}} ")))
                .unwrap_or_else(|| panic!("no bucket le={le}:\n{out}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_string()
        };
        // 500 ns and exactly 1 µs fall in the first bucket (le is inclusive).
        assert_eq!(line("0.000001"), "2");
        assert_eq!(line("0.0000015"), "3");
        assert_eq!(line("0.00005"), "4");
        assert_eq!(line("1"), "4");
        assert_eq!(line("+Inf"), "5");
        assert!(out.contains("x_seconds_count{b=\"1\"} 5"), "{out}");
        assert!(out.contains("x_seconds_sum{b=\"1\"} 3.000042501"), "{out}");
    }
}
