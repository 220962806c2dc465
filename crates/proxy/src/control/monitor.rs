//! The load monitor: one thread per back-end reads the back-end's region every period G
//! through its transport and publishes what it saw into the monitor table. Reads that
//! fail (timeout, refusal, torn or corrupt record) are counted and never published as
//! load: the entry keeps its last good values and goes stale.

use super::histogram::Histogram;
use super::table::{self, Entry, EntryStatus, EntryWriter};
use farside_region::layout::{W_ROLE_ERROR, W_ROLE_SERVED};
use farside_region::{Snapshot, Words, SNAPSHOT_BYTES};
use farside_rmem::{connect_target, mono_ns, ClientOptions, Pacer, Target};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One back-end to watch: its table index and where its region is.
#[derive(Debug, Clone)]
pub struct Watch {
    pub index: usize,
    pub name: String,
    /// Where the region is, and its own key if the configuration names one (else
    /// `MonitorOptions::key`).
    pub region: Target,
}

#[derive(Debug, Clone)]
pub struct MonitorOptions {
    pub period: Duration,
    pub read_timeout: Duration,
    /// Only used to log fresh → stale transitions.
    pub stale_after: Duration,
    pub key: u64,
    /// Nice value of every polling thread (0: unchanged).
    pub nice: i32,
}

/// What one monitor thread measured of its reads, for the proxy's metrics: the part of
/// the paper's argument that can be observed from the front-end (a two-sided read waits
/// for the back-end's CPU; a one-sided one does not).
#[derive(Default)]
pub struct ReadStats {
    /// Round trip of every successful read.
    pub read: Histogram,
    /// Time between two reads that each found a new record: how often fresh load
    /// reaches the proxy (about max(G, gatherer period) when nothing waits).
    pub update_gap: Histogram,
}

/// Running monitor threads; they stop when this is dropped.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// `(table index, stats)` of every watched back-end.
    stats: Vec<(usize, Arc<ReadStats>)>,
}

impl Monitor {
    pub fn start(
        watches: Vec<Watch>,
        table: Arc<dyn Words>,
        opts: MonitorOptions,
    ) -> std::io::Result<Monitor> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::with_capacity(watches.len());
        let mut stats = Vec::with_capacity(watches.len());
        for w in watches {
            let (table, stop, opts) = (table.clone(), stop.clone(), opts.clone());
            let st = Arc::new(ReadStats::default());
            stats.push((w.index, st.clone()));
            threads.push(
                std::thread::Builder::new()
                    .name(format!("monitor-{}", w.index))
                    .spawn(move || poll_loop(w, &*table, &opts, &stop, &st))?,
            );
        }
        Ok(Monitor {
            stop,
            threads,
            stats,
        })
    }

    /// Read statistics of the back-end at table index `index`, if it is watched.
    pub fn stats(&self, index: usize) -> Option<&ReadStats> {
        self.stats
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, s)| &**s)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Bytes of one monitor READ: header, load record and the role words (32..=35, seed
/// 001 sites), one READ of 288 bytes (within every transport's single-READ bound).
const MONITOR_READ_BYTES: usize = (W_ROLE_ERROR + 1) * 8;
const _: () = assert!(MONITOR_READ_BYTES >= SNAPSHOT_BYTES && MONITOR_READ_BYTES <= 1400);

/// Connection retry backoff after a failed connect, bounded.
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_millis(200);

fn poll_loop(
    w: Watch,
    table: &dyn Words,
    opts: &MonitorOptions,
    stop: &AtomicBool,
    stats: &ReadStats,
) {
    let mut writer = EntryWriter::new(table, w.index);
    let mut e = Entry::default();
    let mut client = None;
    let mut backoff = Duration::ZERO;
    let mut next_connect = Instant::now();
    let mut stale_logged = false;
    // Times the connection count alone was found older than stale_after (logged at
    // powers of two: it flips every count interval on a host whose counts are rare).
    let mut conns_stale_seen = 0u64;
    // The gatherer's last full count (its clock) and run, for its counting interval.
    let mut last_count = (0u64, 0u64);
    let mut bytes = [0u8; MONITOR_READ_BYTES];
    let copts = ClientOptions {
        key: opts.key,
        timeout: opts.read_timeout,
        ..Default::default()
    };
    farside_rmem::apply_thread_nice(&format!("monitor: {}", w.name), opts.nice);
    let mut pacer = Pacer::new(opts.period);
    while !stop.load(Ordering::Relaxed) {
        pacer.wait();
        if client.is_none() {
            if Instant::now() < next_connect {
                continue;
            }
            match connect_target(&w.region, &copts) {
                Ok(c) => {
                    client = Some(c);
                    backoff = Duration::ZERO;
                }
                Err(err) => {
                    e.errors += 1;
                    e.status = EntryStatus::Error;
                    writer.publish(&e);
                    backoff = (backoff * 2).clamp(opts.period, RECONNECT_BACKOFF_MAX);
                    next_connect = Instant::now() + backoff;
                    if e.errors == 1 {
                        log::warn!("monitor: {} ({}): {err}", w.name, w.region);
                    }
                    continue;
                }
            }
        }
        let c = client.as_mut().expect("connected above");
        let t0 = Instant::now();
        let result = c
            .read(0, &mut bytes)
            .map_err(|e| e.to_string())
            .and_then(|()| Snapshot::decode(&bytes).map_err(|e| e.to_string()));
        let now = mono_ns();
        match result {
            Ok(s) => {
                let latency_ns = t0.elapsed().as_nanos() as u64;
                stats.read.record(latency_ns);
                if s.seq != e.remote_seq || s.header.generation != e.remote_generation {
                    if e.advanced_mono_ns != 0 {
                        stats.update_gap.record(now - e.advanced_mono_ns);
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
                if counted != 0 && (counted, s.header.generation) != last_count {
                    // A new full count: the interval is the gap since the previous one of
                    // the same gatherer run (unknown again after a restart).
                    e.conns_interval_ns =
                        if last_count.1 == s.header.generation && counted > last_count.0 {
                            counted - last_count.0
                        } else {
                            0
                        };
                    last_count = (counted, s.header.generation);
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
                e.role_served = u64::from_le_bytes(bytes[r..r + 8].try_into().expect("8 bytes"));
            }
            Err(err) => {
                e.errors += 1;
                e.status = EntryStatus::Error;
                if e.errors.is_power_of_two() {
                    log::warn!(
                        "monitor: {} ({}): read failed ({} so far): {err}",
                        w.name,
                        w.region,
                        e.errors
                    );
                }
                if c.transport() != "shm" {
                    // Reconnect: a tcp stream may be out of step after a timeout.
                    client = None;
                }
            }
        }
        let stale = now.saturating_sub(e.advanced_mono_ns) > opts.stale_after.as_nanos() as u64;
        if stale != stale_logged {
            if stale {
                log::warn!(
                    "monitor: {} ({}): load record is stale (no update for over {:?})",
                    w.name,
                    w.region,
                    opts.stale_after
                );
            } else {
                log::info!(
                    "monitor: {} ({}): load record fresh again",
                    w.name,
                    w.region
                );
            }
            stale_logged = stale;
        }
        let bound = opts.stale_after.as_nanos() as u64;
        let overdue = super::table::conns_excess_lag_ns(e.conns_lag_ns, e.conns_interval_ns);
        if !stale && overdue > 0 && now.saturating_sub(e.advanced_mono_ns) + overdue > bound {
            conns_stale_seen += 1;
            if conns_stale_seen.is_power_of_two() {
                log::warn!(
                    "monitor: {} ({}): connection count is stale ({} ms older than its fresh record, {} ms beyond the gatherer's counting interval): the conns, pending and delay metrics treat it as stale (seen {conns_stale_seen} times; raise --stale-after-ms or lower gatherd --conns-every)",
                    w.name,
                    w.region,
                    e.conns_lag_ns / 1_000_000,
                    overdue / 1_000_000
                );
            }
        }
        writer.publish(&e);
    }
}

/// Create the table words for `n` back-ends: a shared file if `path` is given.
pub fn create_table(
    path: Option<&std::path::Path>,
    n: usize,
    period_us: u64,
) -> std::io::Result<Arc<dyn Words>> {
    if n > table::TABLE_BACKENDS_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{n} back-ends, a monitor table holds at most {}",
                table::TABLE_BACKENDS_MAX
            ),
        ));
    }
    let words: Arc<dyn Words> = match path {
        Some(p) => Arc::new(farside_region::MappedWords::create_file(
            p,
            table::TABLE_WORDS,
        )?),
        None => Arc::new(farside_region::HeapWords::new(table::TABLE_WORDS)),
    };
    table::init(&*words, n, period_us);
    Ok(words)
}
