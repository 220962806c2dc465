//! Load estimate between two samples (no herding): a back-end's load is its last sample
//! plus what this proxy sent it since the sample, minus what of this proxy's completed
//! since.
//!
//! Without it, every request between two samples sees the same figure for every
//! back-end, so least-loaded sends them all to the same one, and none of them counts
//! against the limit until the next sample. [`Tally`] is pure state driven by
//! `record(event, now)`; [`estimate`] is a pure function. The control layer keeps one
//! tally per back-end behind a mutex (held for a few adds).
//!
//! Time is CLOCK_MONOTONIC in ns, kept in 1 ms buckets. The sample's time is when the
//! monitor saw its sequence advance (`advanced_mono_ns`), a little after the back-end
//! took it; events in the sample's own millisecond count as after it. Both errors are
//! at most a bucket plus a monitor period, and both err towards a higher estimate
//! (safer for admission); the next sample corrects either.

/// Milliseconds of history kept. A sample older than this is stale under any sensible
/// `admission.stale_after_ms` (default 100); for one that old only the last
/// `TALLY_MS` of events are counted.
pub const TALLY_MS: usize = 128;

/// What happened to one request of this proxy's, as far as the estimate cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Routed to the back-end.
    Sent,
    /// Its exchange ended (response relayed, failed, or abandoned).
    Done,
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    ms: u64,
    sent: u32,
    done: u32,
}

/// Requests sent to and completed by one back-end, per millisecond, for the last
/// [`TALLY_MS`] ms.
#[derive(Debug, Clone)]
pub struct Tally {
    buckets: [Bucket; TALLY_MS],
    /// Latest millisecond recorded.
    last_ms: u64,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            buckets: [Bucket::default(); TALLY_MS],
            last_ms: 0,
        }
    }
}

impl Tally {
    /// Count `event` at `now_ns`.
    pub fn record(&mut self, event: Event, now_ns: u64) {
        let ms = now_ns / 1_000_000;
        let b = &mut self.buckets[ms as usize % TALLY_MS];
        if b.ms != ms {
            *b = Bucket {
                ms,
                sent: 0,
                done: 0,
            };
        }
        match event {
            Event::Sent => b.sent = b.sent.saturating_add(1),
            Event::Done => b.done = b.done.saturating_add(1),
        }
        self.last_ms = self.last_ms.max(ms);
    }

    /// (sent, done) since `since_ns` (from its millisecond on).
    pub fn since(&self, since_ns: u64) -> (u64, u64) {
        let from = (since_ns / 1_000_000).max(self.last_ms.saturating_sub(TALLY_MS as u64 - 1));
        let (mut sent, mut done) = (0u64, 0u64);
        for ms in from..=self.last_ms {
            let b = &self.buckets[ms as usize % TALLY_MS];
            if b.ms == ms {
                sent += u64::from(b.sent);
                done += u64::from(b.done);
            }
        }
        (sent, done)
    }
}

/// The estimated load now: the sample plus what was sent since, minus what completed
/// since (never below zero: a completion can belong to a request the sample did not
/// show yet).
pub fn estimate(sample: u64, sent_since: u64, done_since: u64) -> u64 {
    sample.saturating_add(sent_since).saturating_sub(done_since)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn requests_sent_after_the_sample_count_until_they_complete() {
        let mut t = Tally::default();
        let sample_ns = 1_000 * MS;
        t.record(Event::Sent, 999 * MS); // before the sample: in it already
        for k in 1..=3 {
            t.record(Event::Sent, sample_ns + k * MS);
        }
        let (s, d) = t.since(sample_ns);
        assert_eq!((s, d), (3, 0));
        assert_eq!(estimate(5, s, d), 8, "three requests sent since the sample");
        t.record(Event::Done, sample_ns + 5 * MS);
        t.record(Event::Done, sample_ns + 5 * MS);
        let (s, d) = t.since(sample_ns);
        assert_eq!(estimate(5, s, d), 6);
        // A new sample taken after all that already shows it.
        assert_eq!(t.since(sample_ns + 6 * MS), (0, 0));
    }

    #[test]
    fn the_estimate_never_goes_below_zero() {
        let mut t = Tally::default();
        for _ in 0..4 {
            t.record(Event::Done, 10 * MS);
        }
        let (s, d) = t.since(10 * MS);
        assert_eq!(estimate(1, s, d), 0);
    }

    #[test]
    fn history_older_than_the_window_is_forgotten() {
        let mut t = Tally::default();
        t.record(Event::Sent, 5 * MS);
        t.record(Event::Sent, (5 + TALLY_MS as u64) * MS); // reuses the bucket
        assert_eq!(t.since(0), (1, 0), "only the window's events count");
        t.record(Event::Sent, (6 + 2 * TALLY_MS as u64) * MS);
        assert_eq!(t.since(0), (1, 0));
    }

    #[test]
    fn events_recorded_out_of_order_land_in_their_own_millisecond() {
        let mut t = Tally::default();
        t.record(Event::Sent, 20 * MS);
        t.record(Event::Sent, 18 * MS);
        assert_eq!(t.since(19 * MS), (1, 0));
        assert_eq!(t.since(18 * MS), (2, 0));
    }
}
