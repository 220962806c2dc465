//! The monitor table: the latest load of every back-end as seen by the monitor, one
//! seqlock block per back-end, in words that can live on the heap (embedded monitor) or
//! in a shared file (`farside monitor` publishing to proxies on the same host, as the
//! paper's load-monitoring daemon does through shared memory).
//!
//! ```text
//! word 0..8            header: magic, version, backends, period_us, generation
//! word 8 + i*20 ..     entry i (ENTRY_WORDS): seqlock block, fields below
//! ```

use farside_region::seqlock::{self, SeqlockWriter};
use farside_region::Words;
use std::sync::atomic::Ordering;

/// `b"FSMONTBL"`.
pub const TABLE_MAGIC: u64 = u64::from_le_bytes(*b"FSMONTBL");
/// Version 2: entries grew to 18 words (`queue_delay_us`, `queue_delay_id`).
/// Version 3: 19 words (`conns_interval_ns`).
/// Version 4: 20 words (`role_served`, seed 001 sites).
pub const TABLE_VERSION: u64 = 4;
/// Most back-ends one table holds (and so one proxy balances over): the poller and the
/// decisions were built and measured for this many (at least 1,024); a table
/// is sized for the configured back-ends ([`table_words`]), 160 KiB at this bound.
pub const TABLE_BACKENDS_MAX: usize = 1024;
/// Words of the table header.
pub const HEADER_WORDS: usize = 8;
/// Words of one entry (seqlock head and tail included).
pub const ENTRY_WORDS: usize = 20;

/// Words of a table for `backends` entries.
pub const fn table_words(backends: usize) -> usize {
    HEADER_WORDS + backends * ENTRY_WORDS
}

const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_BACKENDS: usize = 2;
const H_PERIOD_US: usize = 3;
const H_GENERATION: usize = 4;

/// What the monitor last knew of one back-end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Entry {
    pub status: EntryStatus,
    /// The region's own sequence number and generation.
    pub remote_seq: u64,
    pub remote_generation: u64,
    /// Monitor-host CLOCK_MONOTONIC when the last read completed.
    pub fetched_mono_ns: u64,
    /// Monitor-host CLOCK_MONOTONIC when the remote sequence was last seen to advance.
    /// Staleness is measured from here: a gatherer that stops, or a monitor that stops,
    /// both freeze it.
    pub advanced_mono_ns: u64,
    pub cpu_util_ppm: u64,
    pub cpu_pressure_ppm: u64,
    pub runnable: u64,
    pub conns_established: u64,
    pub accept_backlog: u64,
    pub conns_pending: u64,
    /// Latency of the last read, ns.
    pub read_latency_ns: u64,
    /// How much older than the record the connection counts were (the gatherer counts
    /// them only every N samples), ns: their freshness is `advanced_mono_ns - this`.
    pub conns_lag_ns: u64,
    /// Failed reads so far.
    pub errors: u64,
    /// The back-end's queueing delay, µs (region `queue_delay_us`), as old as the
    /// connection counts (`conns_lag_ns`).
    pub queue_delay_us: u64,
    /// Identity of that delay reading: the gatherer's time of it (its clock; compare for
    /// equality only). 0: the back-end publishes no delay.
    pub queue_delay_id: u64,
    /// The gatherer's connection-counting interval as the monitor saw it: the time
    /// between its last two full counts (gatherer clock), ns; 0 until two counts of the
    /// same gatherer run were seen. A count is due again within this, so a lag up to it
    /// (capped by [`CONNS_INTERVAL_ALLOWANCE_MAX_NS`]) is the counter's rhythm, not a
    /// failure ([`conns_excess_lag_ns`]).
    pub conns_interval_ns: u64,
    /// The back-end's `ROLE_SERVED` word (site << 48 | version) at the last good read;
    /// version 0: no node agent publishes a role (`crate::sites`).
    pub role_served: u64,
}

/// Most of a connection count's lag that its counting interval may excuse, ns (1 s).
/// gatherd's automatic rate (a 2% CPU budget at 1 ms samples) stays under it up to a
/// 20 ms full count, i.e. hundreds of thousands of sockets; a count older than this
/// is not a reading of the load admission protects (service times of ms), so beyond
/// it the count ages into staleness as any other field.
pub const CONNS_INTERVAL_ALLOWANCE_MAX_NS: u64 = 1_000_000_000;

/// How much of a connection count's `lag` (its age when the record was published)
/// counts against the staleness bound: what exceeds the gatherer's counting interval
/// (capped at [`CONNS_INTERVAL_ALLOWANCE_MAX_NS`]; 0 = not yet known, so nothing is
/// excused). A slow but live counter is then as fresh as its record; one that stopped
/// counting while the record still advances goes stale `stale_after` past its due time;
/// a dead gatherer goes stale with its record, as before.
pub fn conns_excess_lag_ns(lag: u64, interval: u64) -> u64 {
    lag.saturating_sub(interval.min(CONNS_INTERVAL_ALLOWANCE_MAX_NS))
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(u64)]
pub enum EntryStatus {
    /// No successful read yet.
    #[default]
    Never = 0,
    /// The last read succeeded.
    Ok = 1,
    /// The last read failed (timeout, refused, torn, bad region); values are the last good ones.
    Error = 2,
}

impl Entry {
    fn fields(&self) -> [u64; ENTRY_WORDS - 2] {
        [
            self.status as u64,
            self.remote_seq,
            self.remote_generation,
            self.fetched_mono_ns,
            self.advanced_mono_ns,
            self.cpu_util_ppm,
            self.cpu_pressure_ppm,
            self.runnable,
            self.conns_established,
            self.accept_backlog,
            self.conns_pending,
            self.read_latency_ns,
            self.errors,
            self.conns_lag_ns,
            self.queue_delay_us,
            self.queue_delay_id,
            self.conns_interval_ns,
            self.role_served,
        ]
    }

    fn from_block(b: &[u64; ENTRY_WORDS]) -> Entry {
        let f = &b[1..];
        Entry {
            status: match f[0] {
                1 => EntryStatus::Ok,
                2 => EntryStatus::Error,
                _ => EntryStatus::Never,
            },
            remote_seq: f[1],
            remote_generation: f[2],
            fetched_mono_ns: f[3],
            advanced_mono_ns: f[4],
            cpu_util_ppm: f[5],
            cpu_pressure_ppm: f[6],
            runnable: f[7],
            conns_established: f[8],
            accept_backlog: f[9],
            conns_pending: f[10],
            read_latency_ns: f[11],
            errors: f[12],
            conns_lag_ns: f[13],
            queue_delay_us: f[14],
            queue_delay_id: f[15],
            conns_interval_ns: f[16],
            role_served: f[17],
        }
    }
}

fn entry_first(i: usize) -> usize {
    HEADER_WORDS + i * ENTRY_WORDS
}

/// Initialise a table for `backends` entries (`words` holds at least
/// [`table_words`]`(backends)`).
pub fn init(words: &dyn Words, backends: usize, period_us: u64) {
    assert!(backends <= TABLE_BACKENDS_MAX && words.words().len() >= table_words(backends));
    let w = words.words();
    w[H_MAGIC].store(0, Ordering::Release);
    for x in &w[HEADER_WORDS..] {
        x.store(0, Ordering::Relaxed);
    }
    w[H_VERSION].store(TABLE_VERSION, Ordering::Release);
    w[H_BACKENDS].store(backends as u64, Ordering::Release);
    w[H_PERIOD_US].store(period_us, Ordering::Release);
    w[H_GENERATION].store(farside_region::fresh_generation(), Ordering::Release);
    w[H_MAGIC].store(TABLE_MAGIC, Ordering::Release);
}

/// Check an existing (shared) table holds `backends` entries.
pub fn check(words: &dyn Words, backends: usize) -> Result<(), String> {
    let w = words.words();
    if w.len() < table_words(backends) || w[H_MAGIC].load(Ordering::Acquire) != TABLE_MAGIC {
        return Err("not a farside monitor table (is `farside monitor` running?)".into());
    }
    if w[H_VERSION].load(Ordering::Acquire) != TABLE_VERSION {
        return Err("monitor table version differs from this build".into());
    }
    let n = w[H_BACKENDS].load(Ordering::Acquire) as usize;
    if n != backends {
        return Err(format!(
            "monitor table has {n} back-ends, configuration has {backends}"
        ));
    }
    Ok(())
}

/// The single writer of entry `i`.
pub struct EntryWriter<'a>(SeqlockWriter<'a>);

impl<'a> EntryWriter<'a> {
    /// The writer of entry `i` of `words`.
    pub fn new(words: &'a dyn Words, i: usize) -> Self {
        EntryWriter(SeqlockWriter::new(
            words.words(),
            entry_first(i),
            ENTRY_WORDS,
        ))
    }

    /// The entry's words in the table (to prefetch them before a publish).
    pub fn words(&self) -> &'a [std::sync::atomic::AtomicU64] {
        self.0.block()
    }

    /// Publish `e` as the entry's new value (seqlock write).
    pub fn publish(&mut self, e: &Entry) {
        self.0.publish(&e.fields());
    }
}

/// Read entry `i`; `None` if never written or torn on every try (a writer that died
/// mid-update leaves a torn block: it is never used).
pub fn read(words: &dyn Words, i: usize) -> Option<Entry> {
    let mut b = [0u64; ENTRY_WORDS];
    seqlock::read_local(words.words(), entry_first(i), &mut b, 4).ok()?;
    Some(Entry::from_block(&b))
}

/// Word index (within an entry) of fields the policy reads on the hot path.
pub mod field {
    pub const STATUS: usize = 1;
    pub const ADVANCED_MONO_NS: usize = 5;
    pub const CPU_UTIL_PPM: usize = 6;
    pub const CPU_PRESSURE_PPM: usize = 7;
    pub const RUNNABLE: usize = 8;
    pub const CONNS_ESTABLISHED: usize = 9;
    pub const ACCEPT_BACKLOG: usize = 10;
    pub const CONNS_PENDING: usize = 11;
    pub const CONNS_LAG_NS: usize = 14;
    pub const QUEUE_DELAY_US: usize = 15;
    pub const QUEUE_DELAY_ID: usize = 16;
    pub const CONNS_INTERVAL_NS: usize = 17;
    pub const ROLE_SERVED: usize = 18;
}

/// The hot-path read: status, advance time and one load field (or the sum of two) of
/// entry `i`, validated by the same head/tail check as [`read`] but loading 5–7 words
/// instead of 17. `None` if never written or torn on every try. The advance time is the
/// field's own: for the connection counts it is moved back by the part of their lag
/// beyond the gatherer's counting interval ([`conns_excess_lag_ns`]), so a staleness
/// bound applies to how overdue the count is, not to the record alone.
pub fn read_load(
    words: &dyn Words,
    i: usize,
    f1: usize,
    f2: Option<usize>,
) -> Option<(EntryStatus, u64, u64)> {
    let b = &words.words()[entry_first(i)..entry_first(i) + ENTRY_WORDS];
    for _ in 0..4 {
        let head = b[0].load(Ordering::Acquire);
        let status = b[field::STATUS].load(Ordering::Acquire);
        let advanced = b[field::ADVANCED_MONO_NS].load(Ordering::Acquire);
        let mut v = b[f1].load(Ordering::Acquire);
        if let Some(f2) = f2 {
            v += b[f2].load(Ordering::Acquire);
        }
        let conns = f1 == field::CONNS_ESTABLISHED || f2 == Some(field::CONNS_PENDING);
        let lag = if conns {
            conns_excess_lag_ns(
                b[field::CONNS_LAG_NS].load(Ordering::Acquire),
                b[field::CONNS_INTERVAL_NS].load(Ordering::Acquire),
            )
        } else {
            0
        };
        let tail = b[ENTRY_WORDS - 1].load(Ordering::Acquire);
        if head == tail {
            if head == 0 {
                return None;
            }
            let status = match status {
                1 => EntryStatus::Ok,
                2 => EntryStatus::Error,
                _ => EntryStatus::Never,
            };
            return Some((status, advanced.saturating_sub(lag), v));
        }
        std::hint::spin_loop();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use farside_region::HeapWords;

    #[test]
    fn entries_round_trip_and_unwritten_ones_read_as_none() {
        let t = HeapWords::new(table_words(2));
        init(&t, 2, 1000);
        check(&t, 2).unwrap();
        assert!(check(&t, 3).is_err());
        assert_eq!(read(&t, 1), None);
        let e = Entry {
            status: EntryStatus::Ok,
            conns_established: 9,
            advanced_mono_ns: 5,
            ..Default::default()
        };
        EntryWriter::new(&t, 1).publish(&e);
        assert_eq!(read(&t, 1), Some(e));
        assert_eq!(
            read_load(&t, 1, field::CONNS_ESTABLISHED, None),
            Some((EntryStatus::Ok, 5, 9))
        );
        assert_eq!(read_load(&t, 0, field::CONNS_ESTABLISHED, None), None);
        assert_eq!(read(&t, 0), None);
        // A connection count 3 ns older than its record is 3 ns less fresh; other
        // fields keep the record's time.
        let e = Entry {
            conns_lag_ns: 3,
            ..e
        };
        EntryWriter::new(&t, 1).publish(&e);
        assert_eq!(read(&t, 1), Some(e));
        assert_eq!(
            read_load(&t, 1, field::CONNS_ESTABLISHED, None),
            Some((EntryStatus::Ok, 2, 9))
        );
        assert_eq!(
            read_load(&t, 1, field::CPU_UTIL_PPM, None).map(|r| r.1),
            Some(5)
        );
        // A gatherer that counts every 10 ns: a 3 ns lag is its rhythm, not staleness;
        // 12 ns is 2 ns overdue.
        let e = Entry {
            advanced_mono_ns: 50,
            conns_lag_ns: 3,
            conns_interval_ns: 10,
            ..e
        };
        EntryWriter::new(&t, 1).publish(&e);
        assert_eq!(read(&t, 1), Some(e));
        assert_eq!(
            read_load(&t, 1, field::CONNS_ESTABLISHED, None).map(|r| r.1),
            Some(50)
        );
        let e = Entry {
            conns_lag_ns: 12,
            ..e
        };
        EntryWriter::new(&t, 1).publish(&e);
        assert_eq!(
            read_load(&t, 1, field::ACCEPT_BACKLOG, Some(field::CONNS_PENDING)).map(|r| r.1),
            Some(48)
        );
    }

    #[test]
    fn the_counting_interval_excuses_lag_only_up_to_its_bound() {
        assert_eq!(
            conns_excess_lag_ns(50, 0),
            50,
            "interval unknown: nothing excused"
        );
        assert_eq!(conns_excess_lag_ns(50, 60), 0);
        assert_eq!(conns_excess_lag_ns(70, 60), 10);
        let cap = CONNS_INTERVAL_ALLOWANCE_MAX_NS;
        assert_eq!(conns_excess_lag_ns(3 * cap, 10 * cap), 2 * cap);
    }
}
