//! Bounded per-migration samples (time, CPU) and their percentiles for the metrics
//! and the exit summary.

/// Most samples kept per series: enough for p99 of a long lab run (each sample is 8
/// bytes), bounded so a daemon that runs for days does not grow.
pub const SAMPLES_MAX: usize = 200_000;

/// A bounded series of samples (µs). Past [`SAMPLES_MAX`] new samples replace old
/// ones round-robin, so percentiles follow recent behaviour.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    v: Vec<u64>,
    next: usize,
    /// Samples ever recorded.
    pub count: u64,
}

impl Samples {
    /// Records one sample.
    pub fn record(&mut self, x: u64) {
        self.count += 1;
        if self.v.len() < SAMPLES_MAX {
            self.v.push(x);
        } else {
            self.v[self.next] = x;
            self.next = (self.next + 1) % SAMPLES_MAX;
        }
    }

    /// The `q` quantile (0..=1) of the kept samples, nearest rank; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.v.is_empty() {
            return 0;
        }
        let mut s = self.v.clone();
        s.sort_unstable();
        let rank = ((q.clamp(0.0, 1.0) * s.len() as f64).ceil() as usize).clamp(1, s.len());
        s[rank - 1]
    }

    /// Mean of the kept samples; 0 when empty.
    pub fn mean(&self) -> f64 {
        if self.v.is_empty() {
            0.0
        } else {
            self.v.iter().sum::<u64>() as f64 / self.v.len() as f64
        }
    }

    /// `{"count":…,"p50":…,"p99":…,"max":…,"mean":…}`.
    pub fn json(&self) -> String {
        format!(
            "{{\"count\":{},\"p50\":{},\"p99\":{},\"max\":{},\"mean\":{:.1}}}",
            self.count,
            self.quantile(0.5),
            self.quantile(0.99),
            self.quantile(1.0),
            self.mean()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut s = Samples::default();
        assert_eq!(s.quantile(0.5), 0);
        for x in 1..=100 {
            s.record(x);
        }
        assert_eq!(s.quantile(0.5), 50);
        assert_eq!(s.quantile(0.99), 99);
        assert_eq!(s.quantile(1.0), 100);
        assert_eq!(s.count, 100);
    }

    #[test]
    fn the_series_is_bounded() {
        let mut s = Samples::default();
        for x in 0..(SAMPLES_MAX as u64 + 10) {
            s.record(x);
        }
        assert_eq!(s.v.len(), SAMPLES_MAX);
        assert_eq!(s.count, SAMPLES_MAX as u64 + 10);
    }
}
