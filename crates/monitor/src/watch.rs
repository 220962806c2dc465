//! One watched back-end's bookkeeping, shared by every way of reading it (the poller,
//! and a thread per back-end for blocking transports): what a read's outcome does to
//! its table entry. [`apply_snapshot`] is the pure step (state, event, now); the
//! [`WatchState`] around it adds the publishing and the logging.

use crate::table::{self, Entry, EntryStatus, EntryWriter};
use crate::ReadStats;
use farside_region::layout::{W_ROLE_ERROR, W_ROLE_SERVED};
use farside_region::{Snapshot, Words, SNAPSHOT_BYTES};
use std::time::Duration;

/// Bytes of one monitor READ: header, load record and the role words (32..=35, seed
/// 001 sites), one READ of 288 bytes (within every transport's single-READ bound).
pub const MONITOR_READ_BYTES: usize = (W_ROLE_ERROR + 1) * 8;
const _: () = assert!(MONITOR_READ_BYTES >= SNAPSHOT_BYTES && MONITOR_READ_BYTES <= 1400);

/// What a good read changes besides the entry's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
    /// The record advanced, this long after the previous advance (ns); `None` if it
    /// did not advance, or advanced for the first time.
    pub update_gap_ns: Option<u64>,
}

/// The gatherer's last full connection count seen: (its clock, its generation).
pub type LastCount = (u64, u64);

/// Apply a good read of `bytes` (a [`MONITOR_READ_BYTES`] read from word 0) that took
/// `latency_ns` and completed at `now` (monitor clock) to entry `e`. Pure: no I/O, no
/// clock. A record that does not decode is an `Err` and changes nothing.
pub fn apply_snapshot(
    e: &mut Entry,
    last_count: &mut LastCount,
    bytes: &[u8],
    latency_ns: u64,
    now: u64,
) -> Result<Applied, String> {
    let s = Snapshot::decode(bytes).map_err(|e| e.to_string())?;
    let mut out = Applied::default();
    if s.seq != e.remote_seq || s.header.generation != e.remote_generation {
        if e.advanced_mono_ns != 0 {
            out.update_gap_ns = Some(now.saturating_sub(e.advanced_mono_ns));
        }
        e.advanced_mono_ns = now;
    }
    e.status = EntryStatus::Ok;
    e.remote_seq = s.seq;
    e.remote_generation = s.header.generation;
    e.fetched_mono_ns = now;
    e.cpu_util_ppm = s.load.cpu_util_ppm;
    e.cpu_pressure_ppm = s.load.cpu_pressure_ppm;
    e.runnable = s.load.runnable;
    e.conns_established = s.load.conns_established;
    e.accept_backlog = s.load.accept_backlog;
    e.conns_pending = s.load.conns_pending;
    e.conns_lag_ns = s.load.conns_lag_ns();
    let counted = s.load.conns_sampled_mono_ns;
    if counted != 0 && (counted, s.header.generation) != *last_count {
        // A new full count: the interval is the gap since the previous one of the same
        // gatherer run (unknown again after a restart).
        e.conns_interval_ns = if last_count.1 == s.header.generation && counted > last_count.0 {
            counted - last_count.0
        } else {
            0
        };
        *last_count = (counted, s.header.generation);
    }
    let has_delay = s.load.flags & farside_region::layout::FLAG_QUEUE_DELAY != 0;
    e.queue_delay_us = s.load.queue_delay_us;
    e.queue_delay_id = if has_delay {
        s.load.conns_sampled_mono_ns.max(1)
    } else {
        0
    };
    e.read_latency_ns = latency_ns;
    let r = W_ROLE_SERVED * 8;
    e.role_served = bytes
        .get(r..r + 8)
        .map_or(0, |w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
    Ok(out)
}

/// One watched back-end: its entry, its writer into the table, and what it logged.
pub struct WatchState<'t> {
    /// Back-end name and region, for logs.
    pub name: String,
    pub region: String,
    writer: EntryWriter<'t>,
    /// The entry as last published.
    pub entry: Entry,
    last_count: LastCount,
    stale_logged: bool,
    /// Times the connection count alone was found older than stale_after (logged at
    /// powers of two: it flips every count interval on a host whose counts are rare).
    conns_stale_seen: u64,
}

impl<'t> WatchState<'t> {
    /// The state of entry `index` of `table`.
    pub fn new(table: &'t dyn Words, index: usize, name: String, region: String) -> Self {
        WatchState {
            name,
            region,
            writer: EntryWriter::new(table, index),
            entry: Entry::default(),
            last_count: (0, 0),
            stale_logged: false,
            conns_stale_seen: 0,
        }
    }

    /// The table words this state publishes to (to prefetch them before a reply).
    pub(crate) fn entry_words(&self) -> &'t [std::sync::atomic::AtomicU64] {
        self.writer.words()
    }

    /// A read answered with `bytes` after `latency_ns`, at `now`. A record that does not
    /// decode counts as a failed read.
    pub fn on_read(&mut self, bytes: &[u8], latency_ns: u64, now: u64, stats: &ReadStats) {
        match apply_snapshot(
            &mut self.entry,
            &mut self.last_count,
            bytes,
            latency_ns,
            now,
        ) {
            Ok(a) => {
                stats.read.record(latency_ns);
                if let Some(gap) = a.update_gap_ns {
                    stats.update_gap.record(gap);
                }
            }
            Err(err) => self.on_error(&err),
        }
    }

    /// A read (or connect) failed: counted, logged at powers of two; values stay the
    /// last good ones.
    pub fn on_error(&mut self, err: &dyn std::fmt::Display) {
        let e = &mut self.entry;
        e.errors += 1;
        e.status = EntryStatus::Error;
        if e.errors.is_power_of_two() {
            log::warn!(
                "monitor: {} ({}): read failed ({} so far): {err}",
                self.name,
                self.region,
                e.errors
            );
        }
    }

    /// End of a read (good or not) at `now`: log staleness transitions and publish.
    pub fn publish(&mut self, now: u64, stale_after: Duration) {
        let e = &self.entry;
        let bound = stale_after.as_nanos() as u64;
        let stale = now.saturating_sub(e.advanced_mono_ns) > bound;
        if stale != self.stale_logged {
            if stale {
                log::warn!(
                    "monitor: {} ({}): load record is stale (no update for over {stale_after:?})",
                    self.name,
                    self.region,
                );
            } else {
                log::info!(
                    "monitor: {} ({}): load record fresh again",
                    self.name,
                    self.region
                );
            }
            self.stale_logged = stale;
        }
        let overdue = table::conns_excess_lag_ns(e.conns_lag_ns, e.conns_interval_ns);
        if !stale && overdue > 0 && now.saturating_sub(e.advanced_mono_ns) + overdue > bound {
            self.conns_stale_seen += 1;
            if self.conns_stale_seen.is_power_of_two() {
                log::warn!(
                    "monitor: {} ({}): connection count is stale ({} ms older than its fresh record, {} ms beyond the gatherer's counting interval): the conns, pending and delay metrics treat it as stale (seen {} times; raise --stale-after-ms or lower gatherd --conns-every)",
                    self.name,
                    self.region,
                    e.conns_lag_ns / 1_000_000,
                    overdue / 1_000_000,
                    self.conns_stale_seen
                );
            }
        }
        self.writer.publish(&self.entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farside_region::{Header, HeapWords, LoadRecord, RegionWriter, REGION_WORDS};

    /// The first `MONITOR_READ_BYTES` of a region after `publishes` records.
    fn record(publishes: usize, node_id: u64, conns: u64) -> Vec<u8> {
        let header = Header {
            node_id,
            generation: 1,
            period_us: 1000,
            watched_ports: [0; 4],
        };
        let mut w = RegionWriter::init(HeapWords::new(REGION_WORDS), header);
        for _ in 0..publishes {
            w.publish(&LoadRecord {
                conns_established: conns,
                ..Default::default()
            });
        }
        w.mem().words()[..MONITOR_READ_BYTES / 8]
            .iter()
            .flat_map(|x| x.load(std::sync::atomic::Ordering::Relaxed).to_le_bytes())
            .collect()
    }

    #[test]
    fn a_record_advances_the_entry_only_when_its_sequence_moves() {
        let mut e = Entry::default();
        let mut lc = (0, 0);
        let b = record(1, 7, 5);
        let a = apply_snapshot(&mut e, &mut lc, &b, 40, 1_000).unwrap();
        assert_eq!(a.update_gap_ns, None, "first advance has no gap");
        assert_eq!(
            (e.status, e.conns_established, e.advanced_mono_ns),
            (EntryStatus::Ok, 5, 1_000)
        );
        // The same record again: fetched later, not advanced.
        let a = apply_snapshot(&mut e, &mut lc, &b, 40, 3_000).unwrap();
        assert_eq!(
            (a.update_gap_ns, e.advanced_mono_ns, e.fetched_mono_ns),
            (None, 1_000, 3_000)
        );
        let garbage = vec![0u8; MONITOR_READ_BYTES];
        let before = e;
        assert!(apply_snapshot(&mut e, &mut lc, &garbage, 1, 4_000).is_err());
        assert_eq!(e, before, "a bad record changes nothing");
    }
}
