//! Bounded per-migration samples (time, CPU) and their percentiles for the metrics
//! and the exit summary.

use crate::summary::{rounded, to_line, SamplesSummary, SeriesSummary};

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

    /// Count, p50, p99, max and mean (to 0.1) of the kept samples.
    pub fn summary(&self) -> SamplesSummary {
        SamplesSummary {
            count: self.count,
            p50: self.quantile(0.5),
            p99: self.quantile(0.99),
            max: self.quantile(1.0),
            mean: rounded(self.mean(), 1),
        }
    }

    /// `{"count":…,"p50":…,"p99":…,"max":…,"mean":…}`.
    pub fn json(&self) -> String {
        to_line(&self.summary())
    }
}

/// Seconds kept by a [`PerSecond`] series: the last hour (12 bytes a second), so a
/// daemon that runs for days keeps a bounded, recent series.
pub const SERIES_S_MAX: usize = 3600;

/// What a [`PerSecond`] series counts, one column each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A connection migrated (DONE).
    Migrated = 0,
    /// A migration refused by its target.
    Refused = 1,
    /// The admission window closed.
    Closed = 2,
}

/// Events per second since the daemon started: second `first_s + i` is `bins[i]`.
/// Past [`SERIES_S_MAX`] seconds the oldest second is dropped (its events counted in
/// `evicted`), so the series follows the daemon's last hour.
#[derive(Clone, Debug, Default)]
pub struct PerSecond {
    first_s: u64,
    bins: std::collections::VecDeque<[u32; 3]>,
    /// Events of seconds dropped from the front (or recorded for one already dropped).
    pub evicted: u64,
}

impl PerSecond {
    /// Counts one `e` in second `t_s` (seconds since the daemon started).
    pub fn record(&mut self, t_s: u64, e: Event) {
        if t_s < self.first_s {
            self.evicted += 1;
            return;
        }
        while t_s >= self.first_s + self.bins.len() as u64 {
            self.bins.push_back([0; 3]);
            if self.bins.len() > SERIES_S_MAX {
                let old = self.bins.pop_front().unwrap_or_default();
                self.evicted += old.iter().map(|&n| u64::from(n)).sum::<u64>();
                self.first_s += 1;
            }
        }
        let bin = &mut self.bins[(t_s - self.first_s) as usize][e as usize];
        *bin = bin.saturating_add(1);
    }

    /// The series, one column per [`Event`].
    pub fn summary(&self) -> SeriesSummary {
        let col = |e: Event| self.bins.iter().map(|b| b[e as usize]).collect();
        SeriesSummary {
            first_s: self.first_s,
            migrated: col(Event::Migrated),
            refused: col(Event::Refused),
            closed: col(Event::Closed),
            evicted: self.evicted,
        }
    }

    /// `{"first_s":…,"migrated":[…],"refused":[…],"closed":[…],"evicted":…}`.
    pub fn json(&self) -> String {
        to_line(&self.summary())
    }
}

/// Most window transitions kept for the summary (each a few bytes; a window that
/// flaps every millisecond for a long run is cut here, and the cut is counted).
pub const WINDOW_EVENTS_MAX: usize = 10_000;

/// Window transitions over time, for the summary's `window_events`.
#[derive(Debug, Default)]
pub(crate) struct WindowEvents {
    /// (ms since start, what): `close`, `open_notify`, `open_service`,
    /// `open_peer_load`.
    pub(crate) events: Vec<(u64, &'static str)>,
    /// Transitions past [`WINDOW_EVENTS_MAX`], not kept.
    pub(crate) dropped: u64,
}

impl WindowEvents {
    /// Keeps `n` transitions `what` at `t_ms`, up to [`WINDOW_EVENTS_MAX`]; counts the rest.
    pub(crate) fn push(&mut self, t_ms: u64, what: &'static str, n: u64) {
        for _ in 0..n {
            if self.events.len() < WINDOW_EVENTS_MAX {
                self.events.push((t_ms, what));
            } else {
                self.dropped += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_second_bins_by_second_and_keeps_the_last_hour() {
        let mut s = PerSecond::default();
        s.record(0, Event::Migrated);
        s.record(0, Event::Migrated);
        s.record(2, Event::Refused);
        s.record(2, Event::Closed);
        let j: serde_json::Value = serde_json::from_str(&s.json()).unwrap();
        assert_eq!(j["first_s"], 0);
        assert_eq!(j["migrated"], serde_json::json!([2, 0, 0]));
        assert_eq!(j["refused"], serde_json::json!([0, 0, 1]));
        assert_eq!(j["closed"], serde_json::json!([0, 0, 1]));
        // An hour later the first seconds are gone, and counted.
        let last = SERIES_S_MAX as u64 + 1;
        s.record(last, Event::Migrated);
        assert_eq!(s.bins.len(), SERIES_S_MAX);
        assert_eq!(s.first_s, 2);
        assert_eq!(s.evicted, 2);
        s.record(1, Event::Migrated);
        assert_eq!(s.evicted, 3);
        let j: serde_json::Value = serde_json::from_str(&s.json()).unwrap();
        assert_eq!(j["migrated"].as_array().unwrap().len(), SERIES_S_MAX);
        assert_eq!(j["migrated"][SERIES_S_MAX - 1], 1);
        assert_eq!(j["refused"][0], 1);
    }

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
