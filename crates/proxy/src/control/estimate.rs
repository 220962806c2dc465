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
//! at most a bucket plus a monitor period. A send so counted errs towards a higher
//! estimate (safer for admission); a completion so counted, if the sample already shows
//! it, towards a lower one, by at most that millisecond's completions. The next sample
//! corrects either.

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

/// Counts of events before the start of one millisecond (wrapping: only differences
/// within the window are read, far below 2^32 events).
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    ms: u64,
    sent_before: u32,
    done_before: u32,
}

/// Requests sent to and completed by one back-end, for the last [`TALLY_MS`] ms: running
/// totals, and for every millisecond of the window the totals before it, so that
/// [`Tally::since`] (on every decision) is two loads and a subtraction whatever the
/// sample's age; [`Tally::record`] pays for the milliseconds it moves over (at most
/// [`TALLY_MS`], once each).
#[derive(Debug, Clone)]
pub struct Tally {
    buckets: [Bucket; TALLY_MS],
    sent: u32,
    done: u32,
    /// Latest millisecond recorded.
    last_ms: u64,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            buckets: [Bucket::default(); TALLY_MS],
            sent: 0,
            done: 0,
            last_ms: 0,
        }
    }
}

impl Tally {
    /// Count `event` at `now_ns`.
    pub fn record(&mut self, event: Event, now_ns: u64) {
        let ms = now_ns / 1_000_000;
        let window_start = |last: u64| last.saturating_sub(TALLY_MS as u64 - 1);
        if ms > self.last_ms {
            // Open the milliseconds up to `ms` (those older than the window are skipped).
            for k in (self.last_ms + 1).max(window_start(ms))..=ms {
                self.buckets[k as usize % TALLY_MS] = Bucket {
                    ms: k,
                    sent_before: self.sent,
                    done_before: self.done,
                };
            }
            self.last_ms = ms;
        }
        let (ds, dd) = match event {
            Event::Sent => (1, 0),
            Event::Done => (0, 1),
        };
        self.sent = self.sent.wrapping_add(ds);
        self.done = self.done.wrapping_add(dd);
        // An event in a past millisecond (another thread's, recorded late) counts as
        // before every later millisecond of the window.
        for k in (ms + 1).max(window_start(self.last_ms))..=self.last_ms {
            let b = &mut self.buckets[k as usize % TALLY_MS];
            b.sent_before = b.sent_before.wrapping_add(ds);
            b.done_before = b.done_before.wrapping_add(dd);
        }
    }

    /// (sent, done) since `since_ns` (from its millisecond on), within the window.
    pub fn since(&self, since_ns: u64) -> (u64, u64) {
        let from = (since_ns / 1_000_000).max(self.last_ms.saturating_sub(TALLY_MS as u64 - 1));
        if from > self.last_ms {
            return (0, 0);
        }
        let b = &self.buckets[from as usize % TALLY_MS];
        let (s0, d0) = if b.ms == from {
            (b.sent_before, b.done_before)
        } else {
            (0, 0) // before the first event: nothing was before it
        };
        (
            u64::from(self.sent.wrapping_sub(s0)),
            u64::from(self.done.wrapping_sub(d0)),
        )
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

    /// The window's events counted one by one: what `since` must equal.
    fn naive(events: &[(Event, u64)], since_ns: u64) -> (u64, u64) {
        let last = events.iter().map(|e| e.1 / MS).max().unwrap_or(0);
        let from = (since_ns / MS).max(last.saturating_sub(TALLY_MS as u64 - 1));
        events
            .iter()
            .filter(|e| e.1 / MS >= from)
            .fold((0, 0), |(s, d), e| match e.0 {
                Event::Sent => (s + 1, d),
                Event::Done => (s, d + 1),
            })
    }

    #[test]
    fn since_equals_counting_the_window_for_any_sample_age() {
        let mut t = Tally::default();
        let mut events = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut now = 50_000 * MS;
        for _ in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly forward by up to 3 ms, sometimes a jump past the window, sometimes
            // an event from a few ms ago (recorded late by another thread).
            now = match x % 50 {
                0 => now + (TALLY_MS as u64 + x % 300) * MS,
                1..=4 => now - (x % 4) * MS,
                _ => now + (x % 3) * MS + x % MS,
            };
            let ev = if x & 1 == 0 { Event::Sent } else { Event::Done };
            t.record(ev, now);
            events.push((ev, now));
            let latest = events.iter().map(|e| e.1).max().unwrap();
            for back in [0, 1, 2, 5, 40, 127, 128, 129, 400] {
                let since = latest.saturating_sub(back * MS);
                assert_eq!(t.since(since), naive(&events, since), "since {since}");
            }
        }
    }
}
