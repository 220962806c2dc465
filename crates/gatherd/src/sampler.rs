//! The user-space sampler: reads the node's counters (CPU busy time, pressure and
//! runnable tasks, the watched ports' accept backlog and connections by `sock_diag`,
//! memory) and turns successive readings into load records ([`Sampler::sample`]),
//! each field read as often as it changes and measured for what it costs.
//!
//! Budget: the sampling thread keeps within `SAMPLER_CPU_TARGET` (2 %) of a core; full
//! connection counts (a walk of the kernel's whole TCP hash) get what the rest of a
//! sample leaves of it (`--conns-every 0`).

use std::io;

use farside_region::layout::{FLAG_CONNS, FLAG_MEM, FLAG_PSI, FLAG_QUEUE_DELAY};
use farside_region::LoadRecord;
use farside_rt::sockdiag;
use farside_rt::thread_cpu_ns;

use crate::sample::{self, CpuCounters, CpuSource};
use crate::GatherdArgs;

/// Memory is sampled once every this many periods (it changes slowly and meminfo is the
/// costliest file to read).
const MEM_EVERY_PERIODS: u64 = 100;

/// One sample in this many (on average) measures its per-field cost, and the sampling
/// thread's CPU time is read once per this many samples: each reading is a
/// `clock_gettime(CLOCK_THREAD_CPUTIME_ID)` system call (~0.7 µs here), which would
/// otherwise add to the cost it measures.
pub const FIELD_COST_EVERY: u64 = 64;

/// CPU cost of one sample's parts, ns (summed in `metrics::GatherStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FieldCost {
    /// Busy time and runnable tasks (and the rate computation; read every
    /// [`CPU_READ_INTERVAL_US`]).
    pub cpu_ns: u64,
    /// CPU pressure (PSI; read with the busy time).
    pub psi_ns: u64,
    /// Accept backlog (full connection counts are accounted apart:
    /// `metrics::GatherStats::full_count_ns_sum`).
    pub conns_ns: u64,
    /// Memory (read every `MEM_EVERY_PERIODS` samples).
    pub mem_ns: u64,
}

/// CPU figures (busy time, pressure, runnable tasks) are read once every this long, and
/// at least every sample: the host's busy time advances only at the scheduler tick
/// (4 ms at HZ=250, this host's and the common distribution setting, without IRQ-time
/// accounting), so reading it every 1 ms returns the same value three times in four.
/// Pressure and runnable tasks are read with it, so the record's CPU figures are one
/// reading, at most this old.
pub const CPU_READ_INTERVAL_US: u64 = 4000;

/// Samples between two readings of the CPU figures at `period_us`.
fn cpu_every_for(period_us: u64) -> u64 {
    CPU_READ_INTERVAL_US.div_ceil(period_us.max(1)).max(1)
}

/// The CPU figures of the last reading, carried by the records in between.
#[derive(Debug, Clone, Copy, Default)]
struct CpuFigures {
    util_ppm: u64,
    pressure_ppm: u64,
    runnable: u64,
}

/// Computes load records from successive counter readings.
pub struct Sampler {
    cpu: CpuSource,
    diag: Option<sockdiag::SockDiag>,
    meminfo: Option<std::fs::File>,
    buf: Box<[u8; sample::READ_BUF]>,
    prev: Option<(CpuCounters, u64)>,
    /// CPU figures read every `cpu_every` samples ([`CPU_READ_INTERVAL_US`]).
    cpu_every: u64,
    cpu_figures: CpuFigures,
    mem: (u64, u64),
    n: u64,
    /// Full connection count every this many samples.
    pub conns_every: u64,
    /// Re-derive `conns_every` from the cost of each full count (`--conns-every 0`): the
    /// cost grows with the sockets in the hash (TIME_WAIT included), so a rate calibrated
    /// on an idle node would overspend under load.
    conns_every_auto: bool,
    period_us: u64,
    conns: sockdiag::ConnCounts,
    /// CLOCK_MONOTONIC of the sample whose full count `conns` holds.
    conns_sampled_mono_ns: u64,
    /// Per-field cost of the last sample if it measured it (one in
    /// [`FIELD_COST_EVERY`], at random).
    pub last_field_cost: Option<FieldCost>,
    /// CPU cost of the last sample's fields, if it was measured.
    pub last_sample_cost_ns: Option<u64>,
    /// CPU cost of the last sample's full connection count, if it did one.
    pub last_full_count_ns: Option<u64>,
    /// The sampling thread's CPU time over the window of [`FIELD_COST_EVERY`] samples
    /// the last sample closed, if it closed one.
    pub last_window_cpu_ns: Option<u64>,
    /// Thread CPU time at the start of the current window (None until the thread's
    /// first sample: the clock is per thread).
    window_start_ns: Option<u64>,
    /// Published in each record: the thread's CPU per sample over the last window.
    cost_per_sample_ns: u64,
    /// Moving average of full counts' cost, ns (`--conns-every 0`).
    full_cost_avg_ns: u64,
    /// Full counts' CPU within the current cost window, ns.
    window_full_ns: u64,
    /// Moving average of a sample's CPU without full counts, ns (0: not measured yet).
    base_cost_avg_ns: u64,
    /// xorshift64 state choosing the measured samples.
    rng: u64,
}

/// The user sampler's CPU target, share of one core (at most 2% of a core at
/// 1 ms with a watched port). With `--conns-every 0` full connection counts get what
/// the rest of the sampling thread (the period's wake-up: ~15 µs of CPU per wake-up on
/// this VM, i.e. 1.5% of a core at 1 ms; the per-sample fields) leaves of it, measured
/// every [`FIELD_COST_EVERY`] samples.
const SAMPLER_CPU_TARGET: f64 = 0.02;
/// ...and never less than this share, so established connections are still counted
/// where the rest alone reaches the target (every ~170 ms for a 170 µs count at 1 ms).
const CONNS_CPU_BUDGET_MIN: f64 = 0.001;
/// With no listener on the watched ports, look for one every this many samples: a server
/// that starts listening is found within 10 periods (its backlog reads 0 until then),
/// and an idle watched port costs a LISTEN dump per 10 samples instead of per sample.
const NO_LISTENER_REDUMP_EVERY: u64 = 10;
/// Weight of one reading in the moving averages of costs (1/4): a count's rate follows
/// a lasting rise within a few readings and ignores a single cheap one.
const COST_AVG_WEIGHT: u64 = 4;

/// Moving average of costs (`avg` 0: none yet, the reading itself).
fn ewma(avg: u64, reading: u64) -> u64 {
    if avg == 0 {
        reading
    } else {
        avg - avg / COST_AVG_WEIGHT + reading / COST_AVG_WEIGHT
    }
}
/// Listening sockets are found again by a dump every this many samples (1 s at 1 ms).
const LISTENERS_REFRESH_EVERY: u64 = 1000;
/// Calibration dumps at start (the cheapest one counts).
const CONNS_CALIBRATION_DUMPS: u32 = 3;

/// Samples between full connection counts so that counts costing `cost_ns` of CPU each
/// stay within what the target leaves at a sampling period of `period_us` when the rest
/// of a sample costs `base_ns` (see [`SAMPLER_CPU_TARGET`]).
fn conns_every_for(cost_ns: u64, base_ns: u64, period_us: u64) -> u64 {
    let period_ns = period_us as f64 * 1000.0;
    let budget_ns =
        (SAMPLER_CPU_TARGET * period_ns - base_ns as f64).max(CONNS_CPU_BUDGET_MIN * period_ns);
    ((cost_ns as f64 / budget_ns).ceil() as u64).max(1)
}

impl Sampler {
    pub fn new(args: &GatherdArgs) -> io::Result<Self> {
        let cpu = match &args.cgroup {
            Some(dir) => CpuSource::cgroup(dir)?,
            None => CpuSource::host()?,
        };
        let mut diag = if args.watch_ports.is_empty() {
            None
        } else {
            Some(sockdiag::SockDiag::new(&args.watch_ports)?)
        };
        let mut conns_every = args.conns_every.max(1);
        if let Some(d) = &mut diag {
            d.count_listen()?;
            let mut cost_ns = u64::MAX;
            for _ in 0..CONNS_CALIBRATION_DUMPS {
                let t0 = thread_cpu_ns();
                d.count_established()?;
                cost_ns = cost_ns.min(thread_cpu_ns() - t0);
            }
            if args.conns_every == 0 {
                // Until the rest of a sample is measured, the least budget.
                conns_every = conns_every_for(cost_ns, u64::MAX / 2, args.period_us);
            }
            log::info!(
                "gatherd: a full connection count costs {:.1} µs; counting established connections every {} sample(s) (automatic: then as often as keeps the sampler within {}% of a core), the accept backlog every sample",
                cost_ns as f64 / 1000.0,
                conns_every,
                SAMPLER_CPU_TARGET * 100.0
            );
        }
        Ok(Sampler {
            cpu,
            diag,
            meminfo: std::fs::File::open("/proc/meminfo").ok(),
            buf: Box::new([0; sample::READ_BUF]),
            prev: None,
            cpu_every: cpu_every_for(args.period_us),
            cpu_figures: CpuFigures::default(),
            mem: (0, 0),
            n: 0,
            conns_every,
            conns_every_auto: args.conns_every == 0,
            period_us: args.period_us,
            conns: Default::default(),
            conns_sampled_mono_ns: 0,
            last_field_cost: None,
            last_sample_cost_ns: None,
            last_full_count_ns: None,
            last_window_cpu_ns: None,
            window_start_ns: None,
            cost_per_sample_ns: 0,
            full_cost_avg_ns: 0,
            window_full_ns: 0,
            base_cost_avg_ns: 0,
            rng: farside_rt::mono_ns() | 1,
        })
    }

    /// The sampler now runs on another thread: its CPU clock starts afresh.
    pub fn restart_cost_window(&mut self) {
        self.window_start_ns = None;
    }

    /// Whether this sample measures its fields: one in [`FIELD_COST_EVERY`] at random,
    /// so fields read every k samples are caught in proportion to how often they run.
    fn pick_measured(&mut self) -> bool {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x.is_multiple_of(FIELD_COST_EVERY)
    }

    /// Every [`FIELD_COST_EVERY`] samples: the thread's CPU over the window just ended
    /// (none for the first boundary on a thread, which opens the first window).
    fn close_cost_window(&mut self) {
        self.last_window_cpu_ns = None;
        if !self.n.is_multiple_of(FIELD_COST_EVERY) {
            return;
        }
        let now = thread_cpu_ns();
        if let Some(start) = self.window_start_ns {
            let spent = now.saturating_sub(start);
            self.cost_per_sample_ns = spent / FIELD_COST_EVERY;
            self.last_window_cpu_ns = Some(spent);
            let base = spent.saturating_sub(self.window_full_ns) / FIELD_COST_EVERY;
            self.base_cost_avg_ns = ewma(self.base_cost_avg_ns, base);
        }
        self.window_start_ns = Some(now);
        self.window_full_ns = 0;
    }

    /// Take one sample. Rates (utilisation, pressure) are over the time since the last
    /// reading of the CPU figures.
    pub fn sample(&mut self) -> io::Result<LoadRecord> {
        self.close_cost_window();
        let measure = self.pick_measured();
        let lap = |on: bool| if on { thread_cpu_ns() } else { 0 };
        let t0 = lap(measure);
        self.last_field_cost = None;
        self.last_sample_cost_ns = None;
        let now = farside_rt::mono_ns();
        let (mut t_busy, mut t_cpu) = (t0, t0);
        if self.n.is_multiple_of(self.cpu_every) {
            let c = self
                .cpu
                .read_with_lap(&mut self.buf, &mut || t_busy = lap(measure))?;
            self.cpu_figures.runnable = c.runnable;
            if let Some((p, pt)) = self.prev {
                let wall_us = (now.saturating_sub(pt) / 1000).max(1);
                let busy = c.busy_us.saturating_sub(p.busy_us);
                let ncpu = self.cpu.ncpu();
                self.cpu_figures.util_ppm = (busy * 1_000_000 / (wall_us * ncpu)).min(1_000_000);
                if let (Some(a), Some(b)) = (c.stall_us, p.stall_us) {
                    self.cpu_figures.pressure_ppm =
                        (a.saturating_sub(b) * 1_000_000 / wall_us).min(1_000_000);
                }
            }
            // /proc/stat counts in clock ticks (10 ms): keep the previous reading until
            // the busy counter or 10 ms of wall time has moved, so utilisation is not
            // 0/100% noise.
            let keep_prev = matches!(self.cpu, CpuSource::Host { .. })
                && self
                    .prev
                    .is_some_and(|(p, pt)| p.busy_us == c.busy_us && now - pt < 10_000_000);
            if !keep_prev {
                self.prev = Some((c, now));
            }
            t_cpu = lap(measure);
        }
        let mut rec = LoadRecord {
            sample_mono_ns: now,
            runnable: self.cpu_figures.runnable,
            ncpu: self.cpu.ncpu(),
            cpu_util_ppm: self.cpu_figures.util_ppm,
            cpu_pressure_ppm: self.cpu_figures.pressure_ppm,
            ..Default::default()
        };
        if self.cpu.has_psi() {
            rec.flags |= FLAG_PSI;
        }
        let mut full_count_ns = 0;
        self.last_full_count_ns = None;
        if let Some(d) = &mut self.diag {
            rec.accept_backlog =
                if !d.knows_listeners() && !self.n.is_multiple_of(NO_LISTENER_REDUMP_EVERY) {
                    // Nothing listens on the watched ports (yet): a LISTEN dump every sample
                    // would cost ~15 µs to find nothing.
                    0
                } else {
                    // Exact lookups of the known listeners; a periodic dump (or a failed
                    // lookup: listener closed or replaced) finds them again.
                    match d.count_listen_exact() {
                        Ok(v) if !self.n.is_multiple_of(LISTENERS_REFRESH_EVERY) => v,
                        _ => d.count_listen()?,
                    }
                };
            if self.n.is_multiple_of(self.conns_every) {
                let t = thread_cpu_ns();
                self.conns = d.count_established()?;
                self.conns_sampled_mono_ns = now;
                let cost_ns = thread_cpu_ns().saturating_sub(t);
                full_count_ns = cost_ns;
                self.last_full_count_ns = Some(cost_ns);
                self.window_full_ns += cost_ns;
                if self.conns_every_auto {
                    // An average, not the last count: one cheap count must not let the
                    // rate jump (the cost varies several-fold with the hash's load).
                    self.full_cost_avg_ns = ewma(self.full_cost_avg_ns, cost_ns);
                    let base = match self.base_cost_avg_ns {
                        0 => u64::MAX / 2, // not measured yet: the least budget
                        b => b,
                    };
                    self.conns_every =
                        conns_every_for(self.full_cost_avg_ns.max(cost_ns), base, self.period_us);
                }
            }
            rec.conns_established = self.conns.established;
            rec.conns_pending = self.conns.pending;
            rec.conns_sampled_mono_ns = self.conns_sampled_mono_ns;
            rec.queue_delay_us = sample::queue_delay_us(&self.conns);
            rec.flags |= FLAG_CONNS | FLAG_QUEUE_DELAY;
        }
        let t_conns = lap(measure);
        if self.n.is_multiple_of(MEM_EVERY_PERIODS) {
            if let Some(f) = &self.meminfo {
                self.mem = sample::meminfo(f, &mut self.buf)?;
            }
        }
        if self.mem.0 > 0 {
            rec.mem_total_kb = self.mem.0;
            rec.mem_available_kb = self.mem.1;
            rec.flags |= FLAG_MEM;
        }
        self.n += 1;
        if measure {
            let t_end = thread_cpu_ns();
            self.last_field_cost = Some(FieldCost {
                cpu_ns: t_busy.saturating_sub(t0),
                psi_ns: t_cpu.saturating_sub(t_busy),
                conns_ns: t_conns.saturating_sub(t_cpu).saturating_sub(full_count_ns),
                mem_ns: t_end.saturating_sub(t_conns),
            });
            self.last_sample_cost_ns = Some(t_end.saturating_sub(t0));
        }
        rec.sample_cost_ns = self.cost_per_sample_ns;
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn full_connection_counts_get_what_the_rest_of_the_sampler_leaves_of_its_target() {
        // 2% of a 1 ms period is 20 µs; a sample costing 15 µs leaves 5 µs.
        assert_eq!(conns_every_for(5_000, 15_000, 1000), 1);
        assert_eq!(conns_every_for(50_000, 15_000, 1000), 10);
        assert_eq!(conns_every_for(170_000, 10_000, 1000), 17);
        // The rest alone at or past the target: the least budget, 0.1% (1 µs per period).
        assert_eq!(conns_every_for(170_000, 25_000, 1000), 170);
        assert_eq!(conns_every_for(5_000_000, u64::MAX / 2, 1000), 5000);
        // A longer period leaves more.
        assert_eq!(conns_every_for(50_000, 15_000, 10_000), 1);
    }

    /// The record carries the queueing delay: the age of a request left unread in the
    /// accept queue, with FLAG_QUEUE_DELAY, and 0 once nothing waits.
    #[test]
    fn records_publish_the_age_of_the_oldest_unread_request_as_queue_delay() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let args = GatherdArgs {
            watch_ports: vec![l.local_addr().unwrap().port()],
            conns_every: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(&args).unwrap();
        let idle = s.sample().unwrap();
        assert_ne!(idle.flags & FLAG_QUEUE_DELAY, 0);
        assert_eq!(idle.queue_delay_us, 0);
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let r = s.sample().unwrap();
        // Kernel-tick resolution: up to 10 ms below the true age at HZ=100.
        assert!(r.queue_delay_us >= 40_000, "{r:?}");
        assert!(r.queue_delay_us < 10_000_000, "{r:?}");
        assert_eq!(
            r.conns_sampled_mono_ns, r.sample_mono_ns,
            "taken by this sample"
        );
        let (mut a, _) = l.accept().unwrap();
        let _ = a.read(&mut [0u8; 64]).unwrap();
        assert_eq!(s.sample().unwrap().queue_delay_us, 0, "read: nothing waits");
    }

    /// About one sample in FIELD_COST_EVERY (at random) measures its fields, within
    /// its own cost; the thread's CPU is read once per window and published as the
    /// cost per sample.
    #[test]
    fn about_one_sample_in_field_cost_every_measures_its_fields() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = Sampler::new(&GatherdArgs {
            watch_ports: vec![l.local_addr().unwrap().port()],
            ..Default::default()
        })
        .unwrap();
        let n = FIELD_COST_EVERY * 40;
        let (mut measured, mut windows) = (0, 0);
        for _ in 0..n {
            let rec = s.sample().unwrap();
            match s.last_field_cost {
                Some(f) => {
                    measured += 1;
                    let total = s.last_sample_cost_ns.unwrap();
                    let full = s.last_full_count_ns.unwrap_or(0);
                    assert!(f.conns_ns > 0, "the backlog is read every sample: {f:?}");
                    assert!(
                        f.cpu_ns + f.psi_ns + f.conns_ns + f.mem_ns + full <= total,
                        "{f:?} within {total}"
                    );
                }
                None => assert!(s.last_sample_cost_ns.is_none()),
            }
            if let Some(w) = s.last_window_cpu_ns {
                windows += 1;
                assert_eq!(rec.sample_cost_ns, w / FIELD_COST_EVERY);
                assert!(rec.sample_cost_ns > 0);
            }
        }
        // Binomial(2560, 1/64): mean 40, standard deviation 6.2.
        assert!((15..=80).contains(&measured), "{measured} measured");
        assert_eq!(
            windows, 39,
            "one per FIELD_COST_EVERY samples after the first"
        );
    }

    #[test]
    fn cpu_figures_are_read_once_per_tick_interval_and_at_least_every_sample() {
        assert_eq!(cpu_every_for(1000), 4);
        assert_eq!(cpu_every_for(3000), 2);
        assert_eq!(cpu_every_for(100), 40);
        assert_eq!(cpu_every_for(4000), 1);
        assert_eq!(cpu_every_for(10_000), 1);
    }

    #[test]
    fn a_listener_that_appears_later_is_found_within_the_redump_bound() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut s = Sampler::new(&GatherdArgs {
            watch_ports: vec![port],
            conns_every: 1_000_000,
            ..Default::default()
        })
        .unwrap();
        for _ in 0..3 {
            assert_eq!(s.sample().unwrap().accept_backlog, 0);
        }
        let l = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let found = (0..NO_LISTENER_REDUMP_EVERY).any(|_| s.sample().unwrap().accept_backlog == 1);
        assert!(
            found,
            "listener not found within {NO_LISTENER_REDUMP_EVERY} samples"
        );
    }
}
