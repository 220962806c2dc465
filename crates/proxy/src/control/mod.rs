//! The control layer: monitor table, admission policy and balancing, behind
//! [`crate::gate::Gate`].
//!
//! Admission policy (the paper's, made explicit): a request is admitted only if some
//! back-end eligible for it (right site, not marked down) has a fresh load below its
//! limit; the balancer then sends it to one of those. A back-end whose record is stale
//! or missing counts per `admission.on_stale`: `reject` (fail safe, treated as full) or
//! `admit` (fail open, treated as empty). The check runs right after accept (before the
//! request is read, across all sites) and again per request (for the request's site).

pub mod histogram;
pub mod monitor;
pub mod table;

use crate::config::{BalancePolicy, Metric, ProxyConfig, StalePolicy};
use crate::gate::{Gate, InflightGuard, Reject, Route};
use farside_region::Words;
use farside_rmem::mono_ns;
/// A back-end's region and optional per-back-end key (`udp:HOST:PORT?key=HEX`).
pub use farside_rmem::Target as RegionSource;
use monitor::{Monitor, MonitorOptions, Watch};
use std::cell::Cell;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use table::EntryStatus;

/// A back-end's load as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Fresh value in the metric's unit.
    Known(u64),
    /// Record stale, missing, or never read.
    Stale,
    /// No load data is configured for it (no region, no monitor): only local in-flight.
    Unknown,
}

struct Backend {
    addr: SocketAddr,
    site: String,
    limit: u64,
    has_region: bool,
    inflight: Arc<AtomicU64>,
    /// CLOCK_MONOTONIC ns until which the back-end is skipped after a failure.
    down_until_ns: AtomicU64,
}

/// Decision counters, indexed by reject reason (`Reject as usize`).
#[derive(Default)]
struct Counters {
    accept_admitted: AtomicU64,
    accept_rejected: [AtomicU64; 4],
    request_admitted: AtomicU64,
    request_rejected: [AtomicU64; 4],
}

/// The proxy's control layer. Cheap to query from every worker thread.
pub struct Control {
    admission_on: bool,
    at_accept: bool,
    per_request: bool,
    metric: Metric,
    stale_after_ns: u64,
    on_stale: StalePolicy,
    retry_after_s: u32,
    policy: BalancePolicy,
    down_for_ns: u64,
    backends: Vec<Backend>,
    /// Whether any back-end names a site (else every Host goes everywhere).
    routed_by_site: bool,
    table: Option<Arc<dyn Words>>,
    monitor: Option<Monitor>,
    counters: Counters,
    rr: AtomicUsize,
}

thread_local! {
    static RNG: Cell<u64> = Cell::new(farside_rmem::random_u64() | 1);
}

fn rand_below(n: usize) -> usize {
    RNG.with(|r| {
        // xorshift64*
        let mut x = r.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as usize % n
    })
}

/// Most back-ends considered per decision (the table's bound).
const CANDIDATES_MAX: usize = table::TABLE_BACKENDS_MAX;

impl Control {
    /// Build the control layer: start the embedded monitor, or map an external
    /// monitor's table (`monitor.table`).
    pub fn new(cfg: &ProxyConfig) -> std::io::Result<Control> {
        let n = cfg.backends.len();
        let watches: Vec<Watch> = cfg
            .backends
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let region = RegionSource::parse(b.region.as_deref()?).ok()?;
                Some(Watch {
                    index: i,
                    name: b.addr.to_string(),
                    region,
                })
            })
            .collect();
        let (table, monitor) = match &cfg.monitor.table {
            Some(path) => {
                let words: Arc<dyn Words> = Arc::new(farside_region::MappedWords::open_file(
                    path.as_ref(),
                    table::TABLE_WORDS,
                )?);
                table::check(&*words, n).map_err(|m| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{path}: {m}"))
                })?;
                (Some(words), None)
            }
            None if !watches.is_empty() => {
                let words = monitor::create_table(None, n, cfg.monitor.period_us)?;
                let indices: Vec<usize> = watches.iter().map(|w| w.index).collect();
                let m = Monitor::start(watches, words.clone(), monitor_options(cfg))?;
                wait_first_reads(&*words, &indices, cfg);
                (Some(words), Some(m))
            }
            None => (None, None),
        };
        let a = &cfg.admission;
        let backends = cfg
            .backends
            .iter()
            .map(|b| Backend {
                addr: b.addr,
                site: b.site.clone(),
                limit: b
                    .limit
                    .or_else(|| a.site_limits.get(&b.site).copied())
                    .unwrap_or(a.limit),
                has_region: b.region.is_some() || cfg.monitor.table.is_some(),
                inflight: Arc::new(AtomicU64::new(0)),
                down_until_ns: AtomicU64::new(0),
            })
            .collect();
        Ok(Control {
            admission_on: a.enabled,
            at_accept: a.at_accept,
            per_request: a.per_request,
            metric: a.metric,
            stale_after_ns: a.stale_after_ms * 1_000_000,
            on_stale: a.on_stale,
            retry_after_s: a.retry_after_s,
            policy: cfg.balance.policy,
            down_for_ns: cfg.balance.down_for_ms * 1_000_000,
            routed_by_site: cfg.backends.iter().any(|b| !b.site.is_empty()),
            backends,
            table,
            monitor,
            counters: Counters::default(),
            rr: AtomicUsize::new(0),
        })
    }

    /// Current load of back-end `i` in the admission metric.
    pub fn load(&self, i: usize, now_ns: u64) -> Load {
        let b = &self.backends[i];
        if self.metric == Metric::Inflight {
            return Load::Known(b.inflight.load(Ordering::Relaxed));
        }
        let (Some(t), true) = (&self.table, b.has_region) else {
            return Load::Unknown;
        };
        use table::field as f;
        let (f1, f2) = match self.metric {
            Metric::Conns => (f::CONNS_ESTABLISHED, None),
            Metric::Backlog => (f::ACCEPT_BACKLOG, None),
            Metric::Pending => (f::ACCEPT_BACKLOG, Some(f::CONNS_PENDING)),
            Metric::Cpu => (f::CPU_UTIL_PPM, None),
            Metric::Pressure => (f::CPU_PRESSURE_PPM, None),
            Metric::Runnable => (f::RUNNABLE, None),
            Metric::Inflight => unreachable!("handled above"),
        };
        match table::read_load(&**t, i, f1, f2) {
            Some((EntryStatus::Ok | EntryStatus::Error, advanced, v))
                if now_ns.saturating_sub(advanced) <= self.stale_after_ns =>
            {
                Load::Known(v)
            }
            _ => Load::Stale,
        }
    }

    /// Whether back-end `i` may take one more request; `Err` says why not.
    fn admissible(&self, i: usize, load: Load) -> Result<(), Reject> {
        match load {
            Load::Known(v) if v < self.backends[i].limit => Ok(()),
            Load::Known(_) => Err(Reject::Overloaded),
            Load::Stale if self.on_stale == StalePolicy::Admit => Ok(()),
            Load::Stale => Err(Reject::StaleLoad),
            Load::Unknown => Ok(()),
        }
    }

    fn is_down(&self, i: usize, now_ns: u64) -> bool {
        self.backends[i].down_until_ns.load(Ordering::Relaxed) > now_ns
    }

    fn serves(&self, i: usize, host: Option<&str>) -> bool {
        let site = &self.backends[i].site;
        !self.routed_by_site
            || site.is_empty()
            || host.is_some_and(|h| h.eq_ignore_ascii_case(site))
    }

    /// The admission check alone, across all back-ends (what `on_accept` runs).
    pub fn decide_accept(&self) -> Result<(), Reject> {
        let now = coarse_mono_ns();
        let mut why = Reject::NoBackend;
        let all_down = (0..self.backends.len()).all(|i| self.is_down(i, now));
        for i in 0..self.backends.len() {
            if self.is_down(i, now) && !all_down {
                continue;
            }
            match self.admissible(i, self.load(i, now)) {
                Ok(()) => return Ok(()),
                Err(r) => why = merge_reason(why, r),
            }
        }
        Err(why)
    }

    /// Pick a back-end for a request to `host`: site filter, down filter, admission
    /// filter (if on), then the balancing policy among what is left.
    pub fn choose(&self, host: Option<&str>) -> Result<usize, Reject> {
        let now = coarse_mono_ns();
        let mut pick = Pick::new(
            self.policy,
            self.rr.fetch_add(1, Ordering::Relaxed),
            self.backends.len(),
        );
        let scan = self.scan(host, now, false, &mut pick);
        if scan.serving == 0 {
            return Err(Reject::UnknownSite);
        }
        if pick.is_empty() && scan.down == scan.serving {
            // Panic mode: every back-end of the site is marked down. Ignore the marks and
            // try them anyway: a failure seen under overload must not turn into "503 for
            // everyone for a second"; only admission control decides to shed load.
            let scan = self.scan(host, now, true, &mut pick);
            return pick.finish().ok_or(scan.why);
        }
        pick.finish().ok_or(scan.why)
    }

    /// One pass over the back-ends serving `host`: offers each usable one (right site,
    /// not down unless `ignore_down`, admissible if admission is on) to `pick`.
    fn scan(&self, host: Option<&str>, now: u64, ignore_down: bool, pick: &mut Pick) -> Scan {
        let check = self.admission_on && self.per_request;
        let mut scan = Scan {
            serving: 0,
            down: 0,
            why: Reject::NoBackend,
        };
        for i in 0..self.backends.len() {
            if !self.serves(i, host) {
                continue;
            }
            scan.serving += 1;
            if !ignore_down && self.is_down(i, now) {
                scan.down += 1;
                continue;
            }
            let load = self.load(i, now);
            if check {
                if let Err(r) = self.admissible(i, load) {
                    scan.why = merge_reason(scan.why, r);
                    continue;
                }
            }
            let score = match load {
                Load::Known(v) => v,
                Load::Stale | Load::Unknown => 0,
            };
            // Score: remote load first, then this proxy's in-flight requests (fresher).
            pick.offer(
                i,
                (score, self.backends[i].inflight.load(Ordering::Relaxed)),
            );
        }
        scan
    }

    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }
}

/// CLOCK_MONOTONIC_COARSE in ns: the same clock as `mono_ns` at kernel-tick resolution
/// (1–4 ms), at a fraction of the cost. Staleness thresholds are tens of ms, so the
/// decision path uses this; a coarse `now` lags, which can only make a record look
/// fresher by at most one tick.
fn coarse_mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Most time a starting proxy waits for the monitor's first read of every back-end, so
/// that it does not answer its first requests with fail-safe 503s.
const FIRST_READ_WAIT: Duration = Duration::from_secs(2);

fn wait_first_reads(words: &dyn Words, indices: &[usize], cfg: &ProxyConfig) {
    let wait = FIRST_READ_WAIT.min(Duration::from_millis(cfg.monitor.read_timeout_ms * 4 + 100));
    let deadline = std::time::Instant::now() + wait;
    loop {
        let pending: Vec<usize> = indices
            .iter()
            .copied()
            .filter(|&i| !table::read(words, i).is_some_and(|e| e.status == EntryStatus::Ok))
            .collect();
        if pending.is_empty() {
            return;
        }
        if std::time::Instant::now() >= deadline {
            for i in pending {
                log::warn!(
                    "monitor: no load record yet from {} after {wait:?}; it counts as stale",
                    cfg.backends[i].addr
                );
            }
            return;
        }
        std::thread::sleep(Duration::from_micros(cfg.monitor.period_us));
    }
}

/// What one pass over the back-ends saw.
struct Scan {
    /// Back-ends serving the site.
    serving: usize,
    /// Of those, marked down (skipped).
    down: usize,
    /// The most telling reason a back-end was refused.
    why: Reject,
}

/// Chooses among the back-ends offered by a scan, without allocating: least-loaded keeps
/// a running minimum (ties broken by a rotating start so they spread); round-robin and
/// p2c collect candidate indices in a fixed array.
struct Pick {
    policy: BalancePolicy,
    rotation: usize,
    len: usize,
    best: Option<((u64, u64, usize), usize)>,
    n: usize,
    idx: [u8; CANDIDATES_MAX],
    key: [(u64, u64); CANDIDATES_MAX],
}

impl Pick {
    fn new(policy: BalancePolicy, rotation: usize, len: usize) -> Pick {
        Pick {
            policy,
            rotation,
            len: len.max(1),
            best: None,
            n: 0,
            idx: [0; CANDIDATES_MAX],
            key: [(0, 0); CANDIDATES_MAX],
        }
    }

    fn offer(&mut self, i: usize, key: (u64, u64)) {
        match self.policy {
            BalancePolicy::LeastLoaded => {
                let rot = (i + self.len - self.rotation % self.len) % self.len;
                let k = (key.0, key.1, rot);
                if self.best.is_none_or(|(b, _)| k < b) {
                    self.best = Some((k, i));
                }
            }
            BalancePolicy::RoundRobin | BalancePolicy::P2c => {
                self.idx[self.n] = i as u8;
                self.key[self.n] = key;
            }
        }
        self.n += 1;
    }

    fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn finish(&self) -> Option<usize> {
        if self.n == 0 {
            return None;
        }
        Some(match self.policy {
            BalancePolicy::LeastLoaded => self.best.expect("n > 0").1,
            BalancePolicy::RoundRobin => self.idx[self.rotation % self.n] as usize,
            BalancePolicy::P2c => {
                let (a, b) = (rand_below(self.n), rand_below(self.n));
                let k = if self.key[a] <= self.key[b] { a } else { b };
                self.idx[k] as usize
            }
        })
    }
}

/// When several back-ends refuse for different reasons, report the most telling one:
/// overloaded beats stale beats no-backend.
fn merge_reason(a: Reject, b: Reject) -> Reject {
    let rank = |r| match r {
        Reject::Overloaded => 3,
        Reject::StaleLoad => 2,
        Reject::NoBackend => 1,
        Reject::UnknownSite => 0,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

pub fn monitor_options(cfg: &ProxyConfig) -> MonitorOptions {
    MonitorOptions {
        period: Duration::from_micros(cfg.monitor.period_us),
        read_timeout: Duration::from_millis(cfg.monitor.read_timeout_ms),
        stale_after: Duration::from_millis(cfg.admission.stale_after_ms),
        nice: cfg.monitor.nice,
        key: farside_rmem::DEFAULT_READ_KEY,
    }
}

impl Gate for Control {
    fn on_accept(&self, _peer: SocketAddr) -> Result<(), Reject> {
        if !(self.admission_on && self.at_accept) {
            return Ok(());
        }
        let r = self.decide_accept();
        match r {
            Ok(()) => self
                .counters
                .accept_admitted
                .fetch_add(1, Ordering::Relaxed),
            Err(why) => self.counters.accept_rejected[why.index()].fetch_add(1, Ordering::Relaxed),
        };
        r
    }

    fn route(&self, host: Option<&str>) -> Result<Route, Reject> {
        match self.choose(host) {
            Ok(i) => {
                self.counters
                    .request_admitted
                    .fetch_add(1, Ordering::Relaxed);
                let b = &self.backends[i];
                Ok(Route {
                    backend: i,
                    addr: b.addr,
                    guard: InflightGuard::new(b.inflight.clone()),
                })
            }
            Err(why) => {
                self.counters.request_rejected[why.index()].fetch_add(1, Ordering::Relaxed);
                Err(why)
            }
        }
    }

    fn retry_after_s(&self) -> u32 {
        self.retry_after_s
    }

    fn report_failure(&self, backend: usize) {
        if let Some(b) = self.backends.get(backend) {
            let until = mono_ns() + self.down_for_ns;
            if b.down_until_ns.swap(until, Ordering::Relaxed) < mono_ns() {
                log::warn!(
                    "backend {} failed; skipping it for {} ms",
                    b.addr,
                    self.down_for_ns / 1_000_000
                );
            }
        }
    }

    fn render_metrics(&self, out: &mut String) {
        let c = &self.counters;
        let _ = writeln!(
            out,
            "# HELP farside_admission_decisions_total Admission decisions by stage and outcome."
        );
        let _ = writeln!(out, "# TYPE farside_admission_decisions_total counter");
        for (stage, admitted, rejected) in [
            ("accept", &c.accept_admitted, &c.accept_rejected),
            ("request", &c.request_admitted, &c.request_rejected),
        ] {
            let _ = writeln!(
                out,
                "farside_admission_decisions_total{{stage=\"{stage}\",outcome=\"admit\",reason=\"\"}} {}",
                admitted.load(Ordering::Relaxed)
            );
            for r in Reject::ALL {
                let _ = writeln!(
                    out,
                    "farside_admission_decisions_total{{stage=\"{stage}\",outcome=\"reject\",reason=\"{}\"}} {}",
                    r.reason(),
                    rejected[r.index()].load(Ordering::Relaxed)
                );
            }
        }
        let now = mono_ns();
        let _ = writeln!(out, "# HELP farside_backend_load Back-end load in the admission metric's unit (-1: stale or unknown).");
        let _ = writeln!(out, "# TYPE farside_backend_load gauge");
        let _ = writeln!(out, "# TYPE farside_backend_inflight gauge");
        let _ = writeln!(out, "# TYPE farside_backend_limit gauge");
        let _ = writeln!(out, "# TYPE farside_monitor_read_errors_total counter");
        let _ = writeln!(out, "# TYPE farside_monitor_read_latency_ns gauge");
        let _ = writeln!(out, "# TYPE farside_monitor_record_age_ns gauge");
        let _ = writeln!(out, "# HELP farside_monitor_read_seconds Round trip of the embedded monitor's successful region reads.");
        let _ = writeln!(out, "# TYPE farside_monitor_read_seconds histogram");
        let _ = writeln!(out, "# HELP farside_monitor_update_gap_seconds Time between two monitor reads that each found a new load record.");
        let _ = writeln!(out, "# TYPE farside_monitor_update_gap_seconds histogram");
        for (i, b) in self.backends.iter().enumerate() {
            let lbl = format!("backend=\"{}\",site=\"{}\"", b.addr, b.site);
            let load = match self.load(i, now) {
                Load::Known(v) => v as i64,
                _ => -1,
            };
            let _ = writeln!(
                out,
                "farside_backend_load{{{lbl},metric=\"{}\"}} {load}",
                self.metric.name()
            );
            let _ = writeln!(
                out,
                "farside_backend_inflight{{{lbl}}} {}",
                b.inflight.load(Ordering::Relaxed)
            );
            let _ = writeln!(out, "farside_backend_limit{{{lbl}}} {}", b.limit);
            if let Some(e) = self.table.as_ref().and_then(|t| table::read(&**t, i)) {
                let _ = writeln!(
                    out,
                    "farside_monitor_read_errors_total{{{lbl}}} {}",
                    e.errors
                );
                let _ = writeln!(
                    out,
                    "farside_monitor_read_latency_ns{{{lbl}}} {}",
                    e.read_latency_ns
                );
                let _ = writeln!(
                    out,
                    "farside_monitor_record_age_ns{{{lbl}}} {}",
                    now.saturating_sub(e.advanced_mono_ns)
                );
            }
            if let Some(st) = self.monitor.as_ref().and_then(|m| m.stats(i)) {
                st.read.render(out, "farside_monitor_read_seconds", &lbl);
                st.update_gap
                    .render(out, "farside_monitor_update_gap_seconds", &lbl);
            }
        }
    }
}

#[cfg(test)]
mod tests;
