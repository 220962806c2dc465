//! The load monitor: reads every back-end's region every period G through its
//! transport and publishes what it saw into the monitor table ([`table`]), which the
//! proxy's policy reads (embedded) or proxies on the same host map (`farside monitor`).
//! Reads that fail (timeout, refusal, torn or corrupt record) are counted and never
//! published as load: the entry keeps its last good values and goes stale.
//!
//! Who reads: a few poller threads ([`poller`]), each reading all its regions once per
//! period: `udp` with one non-blocking socket and batched sends and receives
//! (`sendmmsg`/`recvmmsg`), `tcp` (the two-sided baseline) with a non-blocking stream
//! per back-end in the same `ppoll` set, `shm` in place. Threads:
//! `MonitorOptions::threads`, or by default one per [`BACKENDS_PER_THREAD`].
//!
//! What a read's outcome does to an entry is one pure function
//! ([`watch::apply_snapshot`]).

pub mod endpoints;
pub mod histogram;
pub mod options;
pub mod poller;
pub mod responder;
pub mod table;
mod tcp;
pub mod watch;
pub mod xsk;

use farside_region::Words;
use histogram::Histogram;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use farside_rmem::Target;
pub use options::{
    poller_threads, MonitorConfig, MonitorOptions, BACKENDS_PER_THREAD, MONITOR_THREADS_MAX,
};
pub use watch::MONITOR_READ_BYTES;
pub use xsk::MonitorRx;

/// One back-end to watch: its table index and where its region is.
#[derive(Debug, Clone)]
pub struct Watch {
    pub index: usize,
    pub name: String,
    /// Where the region is, and its own key if the configuration names one (else
    /// `MonitorOptions::key`).
    pub region: Target,
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

/// What one poller thread did, for metrics and the benchmark.
#[derive(Default, Debug)]
pub struct PollerStats {
    /// Periods completed.
    pub periods: AtomicU64,
    /// Periods whose deadline had passed before the work of the previous one ended.
    pub overruns: AtomicU64,
    /// The thread's CPU time so far, ns (updated once per period).
    pub cpu_ns: AtomicU64,
    /// Datagrams that matched no pending read (answers after their read was given
    /// up, or strays): dropped.
    pub late: AtomicU64,
    /// Requests the socket would not take (send buffer full): retried at their deadline.
    pub send_dropped: AtomicU64,
    /// READ datagrams sent (first attempts and retries).
    pub sent: AtomicU64,
    /// `sendmmsg` calls that sent datagrams (reads sent / this: the batch size reached).
    pub send_calls: AtomicU64,
    /// `recvmmsg` calls, and AF_XDP ring drains, that received datagrams (replies /
    /// this: the batch size reached).
    pub recv_calls: AtomicU64,
    /// Sleeps in `ppoll` (each one a wake-up when it ends).
    pub waits: AtomicU64,
    /// Group READs sent (also counted in `sent`).
    pub group_sent: AtomicU64,
    /// Replies to group READs accepted.
    pub group_replies: AtomicU64,
    /// Replies to a group READ from an address that is no grouped back-end's endpoint:
    /// dropped (also counted in `late`).
    pub unknown_source: AtomicU64,
    /// Replies whose tag does not verify under the key of the read they name, or that
    /// name another sender: forged or someone else's, dropped (also counted in `late`).
    pub unauthentic: AtomicU64,
    /// The poller takes its udp replies from AF_XDP sockets (`MonitorRx::Xsk` set up);
    /// false: from its UDP sockets.
    pub xsk: AtomicBool,
    /// Datagrams taken from the AF_XDP RX rings.
    pub xsk_rx: AtomicU64,
    /// Datagrams received on the UDP sockets.
    pub udp_rx: AtomicU64,
}

/// Running monitor threads; they stop when this is dropped.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Read statistics by table index (`None`: not watched).
    stats: Vec<Option<Arc<ReadStats>>>,
    pollers: Vec<Arc<PollerStats>>,
}

/// Connection retry backoff after a failed connect, bounded.
pub(crate) const RECONNECT_BACKOFF_MAX: Duration = Duration::from_millis(200);

impl Monitor {
    /// Start reading `watches` into `table` (sized for every watch's index).
    pub fn start(
        watches: Vec<Watch>,
        table: Arc<dyn Words>,
        opts: MonitorOptions,
    ) -> std::io::Result<Monitor> {
        let stop = Arc::new(AtomicBool::new(false));
        let slots = watches.iter().map(|w| w.index + 1).max().unwrap_or(0);
        let mut stats = vec![None; slots];
        let mut polled = Vec::new();
        for w in watches {
            let st = Arc::new(ReadStats::default());
            stats[w.index] = Some(st.clone());
            polled.push((w, st));
        }
        let mut m = Monitor {
            stop: stop.clone(),
            threads: Vec::new(),
            stats,
            pollers: Vec::new(),
        };
        // Group reads: one poller. Every back-end answers every group READ, so a second
        // poller's READ would send it each reply twice, half to a poller that does
        // not know it.
        // AF_XDP receive: one poller too, the RX queues' sockets are its own.
        let k = if opts.group.is_some() || opts.rx != MonitorRx::Udp {
            1
        } else {
            poller_threads(polled.len(), opts.threads)
        };
        let mut parts: Vec<Vec<_>> = (0..k).map(|_| Vec::new()).collect();
        for (j, w) in polled.into_iter().enumerate() {
            parts[j % k].push(w);
        }
        for (j, part) in parts.into_iter().enumerate() {
            if part.is_empty() {
                continue;
            }
            let ps = Arc::new(PollerStats::default());
            m.pollers.push(ps.clone());
            let (table, stop, opts) = (table.clone(), stop.clone(), opts.clone());
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let h = std::thread::Builder::new()
                .name(format!("monitor-poll-{j}"))
                .spawn(move || {
                    farside_rt::apply_thread_nice(&format!("monitor: poller {j}"), opts.nice);
                    match poller::Poller::new(&*table, part, &opts, ps) {
                        Ok(mut p) => {
                            let _ = tx.send(Ok(()));
                            p.run(&stop);
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                })?;
            m.threads.push(h);
            rx.recv()
                .unwrap_or_else(|_| Err(std::io::Error::other("monitor poller ended at start")))?;
        }
        Ok(m)
    }

    /// Read statistics of the back-end at table index `index`, if it is watched.
    pub fn stats(&self, index: usize) -> Option<&ReadStats> {
        self.stats.get(index)?.as_deref()
    }

    /// Each poller thread's counters.
    pub fn pollers(&self) -> &[Arc<PollerStats>] {
        &self.pollers
    }

    /// Report the poller threads' counters to a metrics scrape.
    pub fn render(&self, enc: &mut farside_admin::Encoder) {
        for (j, p) in self.pollers.iter().enumerate() {
            let t = j.to_string();
            let l: &[(&str, &str)] = &[("poller", &t)];
            enc.counter(
                "farside_monitor_periods_total",
                "Periods a monitor poller thread completed.",
                l,
                p.periods.load(Ordering::Relaxed),
            );
            enc.counter(
                "farside_monitor_overruns_total",
                "Periods a monitor poller thread started late (its work outlasted a period).",
                l,
                p.overruns.load(Ordering::Relaxed),
            );
            enc.counter(
                "farside_monitor_cpu_ns_total",
                "CPU time of a monitor poller thread, ns.",
                l,
                p.cpu_ns.load(Ordering::Relaxed),
            );
            enc.counter(
                "farside_monitor_late_replies_total",
                "Replies that matched no pending read (late or stray): dropped.",
                l,
                p.late.load(Ordering::Relaxed),
            );
            enc.counter(
                "farside_monitor_group_reads_total",
                "Group READs a monitor poller thread sent (one per period in group mode).",
                l,
                p.group_sent.load(Ordering::Relaxed),
            );
            enc.counter(
                "farside_monitor_group_replies_total",
                "Replies to group READs accepted.",
                l,
                p.group_replies.load(Ordering::Relaxed),
            );
            enc.counter(
                "farside_monitor_unknown_source_replies_total",
                "Replies to a group READ from no watched back-end's endpoint: dropped.",
                l,
                p.unknown_source.load(Ordering::Relaxed),
            );
            enc.counter(
                "farside_monitor_unauthentic_replies_total",
                "Replies that do not verify under the key of the read they name, or name another sender: dropped.",
                l,
                p.unauthentic.load(Ordering::Relaxed),
            );
            enc.gauge(
                "farside_monitor_rx_xsk",
                "1 if a monitor poller thread takes its replies from AF_XDP sockets, 0 if from its UDP socket.",
                l,
                u64::from(p.xsk.load(Ordering::Relaxed)),
            );
            enc.counter(
                "farside_monitor_xsk_replies_total",
                "Datagrams a monitor poller thread took from its AF_XDP RX rings.",
                l,
                p.xsk_rx.load(Ordering::Relaxed),
            );
            enc.counter(
                "farside_monitor_udp_replies_total",
                "Datagrams a monitor poller thread received on its UDP sockets.",
                l,
                p.udp_rx.load(Ordering::Relaxed),
            );
        }
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
                "{n} back-ends, a monitor table holds at most {} (table::TABLE_BACKENDS_MAX)",
                table::TABLE_BACKENDS_MAX
            ),
        ));
    }
    let words: Arc<dyn Words> = match path {
        Some(p) => Arc::new(farside_region::MappedWords::create_file(
            p,
            table::table_words(n),
        )?),
        None => Arc::new(farside_region::HeapWords::new(table::table_words(n))),
    };
    table::init(&*words, n, period_us);
    Ok(words)
}

/// Map the shared table of a `farside monitor` at `path`, checking it holds `n`
/// back-ends.
pub fn open_table(path: &std::path::Path, n: usize) -> std::io::Result<Arc<dyn Words>> {
    let words: Arc<dyn Words> = Arc::new(farside_region::MappedWords::open_file(
        path,
        table::table_words(n),
    )?);
    table::check(&*words, n).map_err(|m| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {m}", path.display()),
        )
    })?;
    Ok(words)
}

#[cfg(test)]
mod tests;
