//! The control layer: monitor table, admission policy and balancing, behind
//! [`crate::gate::Gate`].
//!
//! Admission policy (the paper's, made explicit): a request is admitted only if some
//! back-end eligible for it (right site, not marked down) has a fresh load below its
//! limit; the balancer then sends it to one of those. A back-end whose record is stale
//! or missing counts per `admission.on_stale`: `local` (the default: admitted while this
//! proxy's requests in flight to it are below its last known safe level, see
//! [`admit_local`]), `reject` (fail safe, treated as full) or `admit` (fail open,
//! treated as empty). The check runs right after accept (before the
//! request is read, across all sites) and again per request (for the request's site).
//!
//! What counts as load:
//! - the figure compared with the limit is an estimate, not the bare sample: the last
//!   sample plus the requests this proxy routed to the back-end since, minus those of
//!   its requests that completed since ([`estimate`]), for the metrics counted in
//!   connections (`conns`, `backlog`, `pending`). Balancing compares the same estimate,
//!   so the requests between two samples spread instead of herding onto one back-end;
//! - this proxy's own idle pooled connections are not load: for `conns` they are
//!   subtracted; for `backlog`/`pending`, a request that can take an idle pooled
//!   connection is admitted whatever the reading (it adds nothing to the accept queue),
//!   as a *reuse-only* route that never opens a new connection;
//! - when a back-end's accept queue is not empty, this proxy closes up to that many of
//!   its idle connections to it, and for the rest of the queue closes connections as
//!   they come back instead of pooling them (once per sample, [`relief`]): on a prefork
//!   server each open connection pins a worker that the queue is waiting for.
//!
//! # Liveness: admission never rejects forever
//!
//! Claim: once the offered load falls below capacity (in particular when it stops), a
//! request is admitted again within `B = D + P + T`, where D is the time the back-end
//! needs to serve the connections queued at it, P the monitor period and T the
//! period at which the data path calls [`Gate::tend`] ([`TEND_PERIOD`]), as long as
//! the back-end's load record stays fresh (a stale record is the fail-safe policy's
//! business, not a lock-out).
//!
//! Why: the load admission reads is made of (1) requests in service, (2) connections
//! waiting in the accept queue, (3) connections held open but idle. (1) ends within a
//! service time. (2) drains as soon as workers free up, and a worker is only held
//! forever by an open connection with no request, i.e. (3). Of (3), this proxy's own
//! idle connections are never counted as load (`conns`) and are closed as soon as the
//! back-end shows a queue (tend runs every T even with no request arriving, and reads
//! a sample at most P old); the busy + idle connections this proxy opens are capped
//! by `maxconn` (see [`crate::pool`]). So after load stops nothing of this proxy's
//! keeps (1)–(3) above the limit longer than D + P + T, and the estimate adds nothing
//! once no request was sent since the sample. The old lock-out broke exactly this: idle
//! pooled connections pinned every worker, the proxy's own queued connections kept
//! the backlog at the limit, and nothing ever closed them because nothing was
//! admitted. `crates/farside/tests/admission_liveness.rs` reproduces it with real
//! processes and checks the bound.
//!
//! With `[[classes]]` ([`classes`]) each request is classified by its path, and once the
//! metric's check admits it, its class's own bound out of the back-end's budget of
//! requests in flight (metric `delay`'s budget or metric `inflight`'s limit) decides:
//! costly classes run fewer at once, lower priorities are shed first.
//!
//! With metric `delay` ([`delay`]) the figure compared is this proxy's own requests in
//! flight to the back-end, against a budget that adapts to the back-end's published
//! queueing delay and never falls below one: (1)–(3) above do not enter it, and a
//! request is admitted as soon as this proxy's requests to the back-end complete.

pub mod classes;
pub mod content;
pub mod delay;
pub mod estimate;
pub mod render;
pub mod rules;

pub use rules::{admit, admit_local, relief, Admit, Decided, Load, Relief};

/// The monitor (its own crate, `farside-monitor`) and its table, under the names the
/// control layer has always used.
pub use farside_monitor as monitor;
pub use farside_monitor::{histogram, table};

use crate::config::{BalancePolicy, Metric, ProxyConfig, StalePolicy, QUEUE_LIMIT_DEFAULT};
use crate::gate::{ClassObserver, Gate, InflightGuard, InflightObserver, Reject, Route};
use crate::pool::Pool;
use estimate::{Event, Tally};
use farside_admin::{Encoder, Labels};
use farside_region::Words;
/// A back-end's region and optional per-back-end key (`udp:HOST:PORT?key=HEX`).
pub use farside_rmem::Target as RegionSource;
use farside_rt::{coarse_mono_ns, mono_ns};
use monitor::{Monitor, Watch};
use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use table::EntryStatus;

struct Backend {
    addr: SocketAddr,
    site: String,
    limit: u64,
    has_region: bool,
    inflight: Arc<AtomicU64>,
    /// Requests routed to it so far (its balancing share; `farside_backend_routed_total`).
    routed: AtomicU64,
    /// CLOCK_MONOTONIC ns until which the back-end is skipped after a failure.
    down_until_ns: AtomicU64,
    /// What this proxy sent it and what completed, for the estimate between samples.
    tally: Arc<TallyCell>,
    /// `advanced_mono_ns` of the sample last acted on by [`Control::relieve`], so that
    /// one queue reading closes connections once, not once per decision.
    relieved_sample_ns: AtomicU64,
    /// Metric `delay`: this back-end's adaptive budget of in-flight requests.
    delay: Arc<Mutex<delay::DelayBudget>>,
    /// Told when a request to it starts and ends: `tally`, and with metric `delay` also
    /// the budget's slow start ([`DelayDone`]).
    observer: Arc<dyn InflightObserver>,
    /// Metric `delay`: the budget was the constraint since the last reading.
    delay_used: AtomicBool,
    /// Metric `delay`: the back-end's last fresh record carried no queueing delay (its
    /// gatherd watches no port), so it is admitted by metric `backlog` meanwhile
    /// ([`Control::metric_of`]). Shared with its [`DelayDone`] (no slow start meanwhile).
    no_delay: Arc<AtomicBool>,
    /// `on_stale = local`: the back-end's last known safe level of this proxy's requests
    /// in flight to it (0: no fresh reading yet). See [`admit_local`].
    safe_inflight: AtomicU64,
    /// `[[classes]]`: this proxy's requests in flight to it and their learned cost, per
    /// class (empty without classes).
    classes: Arc<ClassCells>,
}

/// One back-end's per-class state for class-aware admission, fed by the in-flight
/// guards of its requests.
#[derive(Default)]
struct ClassCells {
    /// Per class: requests in flight.
    inflight: Vec<AtomicU64>,
    /// Per class: learned cost ([`classes::Cost`]).
    cost: Vec<Mutex<classes::Cost>>,
}

impl ClassCells {
    fn new(n: usize) -> ClassCells {
        ClassCells {
            inflight: (0..n).map(|_| AtomicU64::new(0)).collect(),
            cost: (0..n).map(|_| Mutex::default()).collect(),
        }
    }

    fn cost(&self, k: usize) -> classes::Cost {
        *self.cost[k].lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ClassObserver for ClassCells {
    fn sent(&self, class: usize) {
        self.inflight[class].fetch_add(1, Ordering::Relaxed);
    }
    fn done(&self, class: usize, took_ns: u64) {
        self.cost[class]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(took_ns as f64 / 1000.0);
        self.inflight[class].fetch_sub(1, Ordering::Relaxed);
    }
}

/// `[[classes]]`: the table requests are classified by, and per class the decisions.
struct ClassState {
    table: classes::ClassTable,
    /// Per class: requests admitted.
    admitted: Vec<AtomicU64>,
    /// Per class: requests refused (for any reason).
    rejected: Vec<AtomicU64>,
    /// Per-back-end checks the class rule refused, by [`classes::Verdict`].
    refused_by: [AtomicU64; classes::Verdict::ALL.len()],
    /// Per class: CLOCK_MONOTONIC (coarse) ns of its last request, for the lower
    /// classes (whether a class wants its guarantee, [`classes::DEMAND_WINDOW_NS`]).
    asked_ns: Vec<AtomicU64>,
}

impl ClassState {
    /// Whether class `k` asked within [`classes::DEMAND_WINDOW_NS`] of `now_ns`.
    fn wanting(&self, k: usize, now_ns: u64) -> bool {
        let at = self.asked_ns[k].load(Ordering::Relaxed);
        at != 0 && now_ns.saturating_sub(at) < classes::DEMAND_WINDOW_NS
    }
}

/// A back-end's [`Tally`], fed by the in-flight guards of its requests.
#[derive(Default)]
struct TallyCell {
    tally: Mutex<Tally>,
    /// Millisecond of the latest event: a decision whose sample is newer skips the lock.
    last_ms: AtomicU64,
}

impl TallyCell {
    fn record(&self, e: Event) {
        let now = mono_ns();
        self.tally
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(e, now);
        // Mostly the same millisecond as the last event: a load, not a write.
        let ms = now / 1_000_000;
        if self.last_ms.load(Ordering::Relaxed) < ms {
            self.last_ms.fetch_max(ms, Ordering::Relaxed);
        }
    }

    fn since(&self, since_ns: u64) -> (u64, u64) {
        if self.last_ms.load(Ordering::Relaxed) < since_ns / 1_000_000 {
            return (0, 0);
        }
        self.tally
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .since(since_ns)
    }
}

/// Metric `delay`: a back-end's completions feed its tally and, until the budget's first
/// cut, its slow start ([`delay::DelayBudget::on_done`]). After the first cut the lock is
/// no longer taken on completions (`slow` turns false).
struct DelayDone {
    tally: Arc<TallyCell>,
    delay: Arc<Mutex<delay::DelayBudget>>,
    /// The back-end's requests in flight from this proxy (the guard drops its count
    /// after telling this observer, so a completion sees itself in it).
    inflight: Arc<AtomicU64>,
    /// The budget's cap (the back-end's limit).
    max: f64,
    slow: AtomicBool,
    /// The back-end is admitted by `backlog` for want of a delay reading: its budget is
    /// not in use, so completions do not grow it.
    no_delay: Arc<AtomicBool>,
}

impl InflightObserver for DelayDone {
    fn sent(&self) {
        self.tally.sent();
    }
    fn done(&self) {
        self.tally.done();
        if self.slow.load(Ordering::Relaxed) && !self.no_delay.load(Ordering::Relaxed) {
            let mut st = self.delay.lock().unwrap_or_else(|p| p.into_inner());
            if st.slow_start {
                st.on_done(self.inflight.load(Ordering::Relaxed), self.max);
            } else {
                self.slow.store(false, Ordering::Relaxed);
            }
        }
    }
}

impl InflightObserver for TallyCell {
    fn sent(&self) {
        self.record(Event::Sent);
    }
    fn done(&self) {
        self.record(Event::Done);
    }
}

/// Decision counters, indexed by [`Reject::index`].
#[derive(Default)]
struct Counters {
    accept_admitted: AtomicU64,
    accept_rejected: [AtomicU64; Reject::ALL.len()],
    request_admitted: AtomicU64,
    /// Of `request_admitted`: admitted only onto an idle pooled connection.
    request_admitted_reuse_only: AtomicU64,
    request_rejected: [AtomicU64; Reject::ALL.len()],
}

/// Period at which the data path calls [`Gate::tend`]: one of the terms of the
/// liveness bound (module doc), far below its 1 s target, and ten monitor periods so
/// the extra table reads cost nothing measurable.
pub const TEND_PERIOD: Duration = Duration::from_millis(10);

/// Metric `delay`: how much of a delay reading's `lag` (its age when its record was
/// published: gatherd measures the delay with its connection count, every N samples)
/// counts against the staleness bound. The reading is as fresh as its record while it is
/// no older than the gatherer's counting interval as the monitor saw it
/// ([`table::conns_excess_lag_ns`]); until the monitor has seen that interval (two
/// counts, up to 2 N samples after a proxy starts), as long as the record itself is fresh
/// the reading may be as old as [`table::CONNS_INTERVAL_ALLOWANCE_MAX_NS`] (1 s), the
/// most any counting interval is excused. So a fresh proxy in front of a gatherd that
/// counts rarely does not refuse below capacity as "stale" while that gatherd publishes
/// every sample; a dead gatherd still goes stale with its record, and a counter that
/// stopped while its record advances goes stale at most 1 s + `stale_after` after its
/// last count. The reading itself is applied to the budget once, whatever its age (an
/// old reading of a long queue still cuts).
fn delay_excess_lag_ns(lag: u64, interval: u64) -> u64 {
    if interval == 0 {
        lag.saturating_sub(table::CONNS_INTERVAL_ALLOWANCE_MAX_NS)
    } else {
        table::conns_excess_lag_ns(lag, interval)
    }
}

/// The proxy's control layer. Cheap to query from every worker thread.
pub struct Control {
    admission_on: bool,
    at_accept: bool,
    per_request: bool,
    metric: Metric,
    /// Metric `delay`: the target queueing delay, µs.
    target_delay_us: u64,
    /// Which signal decided each per-back-end check ([`Control::render_signal_metrics`]).
    signals: SignalCounters,
    stale_after_ns: u64,
    on_stale: StalePolicy,
    retry_after_s: u32,
    policy: BalancePolicy,
    /// `lard`, `bounded-hash`: the content-aware policy ([`content`]); requests without
    /// a target, and those no back-end can take, fall to least-loaded's walk.
    content: Option<content::Content>,
    down_for_ns: u64,
    backends: Vec<Backend>,
    /// Whether any back-end names a site (else every Host goes everywhere).
    routed_by_site: bool,
    /// `[[sites]]`: routing by each back-end's served role (`crate::sites`).
    sites: Option<crate::sites::SiteRouter>,
    table: Option<Arc<dyn Words>>,
    monitor: Option<Monitor>,
    counters: Counters,
    rr: AtomicUsize,
    /// The data path's upstream pool ([`Gate::bind_pool`]); until bound, no idle
    /// connections are known.
    pool: OnceLock<Arc<Pool>>,
    /// `[[classes]]`: class-aware admission (none declared: every request is one class).
    classes: Option<ClassState>,
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
        // The high 32 bits scaled to [0, n) by a multiply (no division); n is far below
        // 2^32, so the bias is under n / 2^32.
        let hi = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32;
        ((hi * n as u64) >> 32) as usize
    })
}

/// Random back-ends power-of-two-choices draws before it falls back to a walk: with a
/// fraction f of the back-ends usable, 8 draws find two with probability
/// 1 − f⁸ − 8f(1 − f)⁷ (0.96 at f = ½), so with most of them usable a decision reads
/// about two entries whatever the back-end count; below that the walk
/// ([`Control::scan`]) takes over.
pub const P2C_DRAWS_MAX: usize = 8;

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
                let words = monitor::open_table(path.as_ref(), n)?;
                (Some(words), None)
            }
            None if !watches.is_empty() => {
                let words = monitor::create_table(None, n, cfg.monitor.period_us)?;
                let indices: Vec<usize> = watches.iter().map(|w| w.index).collect();
                let m = Monitor::start(
                    watches,
                    words.clone(),
                    cfg.monitor
                        .options(Duration::from_millis(cfg.admission.stale_after_ms))
                        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
                )?;
                wait_first_reads(&*words, &indices, cfg);
                (Some(words), Some(m))
            }
            None => (None, None),
        };
        let a = &cfg.admission;
        let class_state = (!cfg.classes.is_empty()).then(|| {
            let specs: Vec<_> = cfg.classes.iter().map(|c| c.spec()).collect();
            let table = classes::ClassTable::new(&specs);
            let n = table.len();
            ClassState {
                table,
                admitted: (0..n).map(|_| AtomicU64::new(0)).collect(),
                rejected: (0..n).map(|_| AtomicU64::new(0)).collect(),
                refused_by: Default::default(),
                asked_ns: (0..n).map(|_| AtomicU64::new(0)).collect(),
            }
        });
        let class_count = class_state.as_ref().map_or(0, |c| c.table.len());
        let backends = cfg
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let limit = cfg.limit_for(i);
                let inflight = Arc::new(AtomicU64::new(0));
                let tally: Arc<TallyCell> = Arc::default();
                let delay = Arc::new(Mutex::new(delay::DelayBudget::new(
                    delay::BUDGET_MIN,
                    limit as f64,
                )));
                let no_delay = Arc::new(AtomicBool::new(false));
                let observer: Arc<dyn InflightObserver> = if a.metric == Metric::Delay {
                    Arc::new(DelayDone {
                        tally: tally.clone(),
                        delay: delay.clone(),
                        inflight: inflight.clone(),
                        max: limit as f64,
                        slow: AtomicBool::new(true),
                        no_delay: no_delay.clone(),
                    })
                } else {
                    tally.clone()
                };
                Backend {
                    addr: b.addr,
                    site: b.site.clone(),
                    limit,
                    has_region: b.region.is_some() || cfg.monitor.table.is_some(),
                    inflight,
                    routed: AtomicU64::new(0),
                    down_until_ns: AtomicU64::new(0),
                    tally,
                    relieved_sample_ns: AtomicU64::new(0),
                    delay,
                    observer,
                    delay_used: AtomicBool::new(false),
                    no_delay,
                    safe_inflight: AtomicU64::new(0),
                    classes: Arc::new(ClassCells::new(class_count)),
                }
            })
            .collect();
        Ok(Control {
            admission_on: a.enabled,
            at_accept: a.at_accept,
            per_request: a.per_request,
            metric: a.metric,
            target_delay_us: cfg.target_delay_ms() * 1000,
            signals: SignalCounters::default(),
            stale_after_ns: a.stale_after_ms * 1_000_000,
            on_stale: a.on_stale,
            retry_after_s: a.retry_after_s,
            policy: cfg.balance.policy,
            content: match cfg.balance.policy {
                BalancePolicy::Lard => Some(content::Content::lard(
                    cfg.balance.lard_low,
                    cfg.balance.lard_high,
                )),
                BalancePolicy::BoundedHash => Some(content::Content::bounded(
                    n.clamp(1, content::CONTENT_BACKENDS_MAX),
                    cfg.balance.hash_balance_factor,
                )),
                _ => None,
            },
            down_for_ns: cfg.balance.down_for_ms * 1_000_000,
            routed_by_site: cfg.backends.iter().any(|b| !b.site.is_empty()),
            sites: crate::sites::SiteRouter::new(&cfg.sites),
            backends,
            table,
            monitor,
            counters: Counters::default(),
            rr: AtomicUsize::new(0),
            pool: OnceLock::new(),
            classes: class_state,
        })
    }

    /// Current load of back-end `i` in the admission metric: for `conns`, `backlog` and
    /// `pending` the estimate (sample + sent since − completed since), `conns` without
    /// this proxy's idle pooled connections. For `conns` the idle count subtracted is
    /// today's, not the sample's: the estimate is off by how much the idle count changed
    /// since the sample (a sample period's worth of checkouts and returns).
    pub fn load(&self, i: usize, now_ns: u64) -> Load {
        let (load, sample_ns) = self.sample(i, now_ns);
        let Load::Known(v) = load else {
            return load;
        };
        Load::Known(match self.metric_of(i) {
            Metric::Conns | Metric::Backlog | Metric::Pending => {
                let (sent, done) = self.backends[i].tally.since(sample_ns);
                let v = estimate::estimate(v, sent, done);
                if self.metric == Metric::Conns {
                    // Idle pooled connections are established but carry no request.
                    v.saturating_sub(self.idle(i))
                } else {
                    v
                }
            }
            _ => v,
        })
    }

    /// The metric back-end `i` is admitted by: the configured one, except that with
    /// metric `delay` a back-end whose last fresh record carried no queueing delay (its
    /// gatherd watches no port) is admitted by `backlog` with the `backlog` rule's limit
    /// ([`QUEUE_LIMIT_DEFAULT`]) until a record carries one (docs/proxy.md, "A back-end
    /// without a delay reading").
    pub fn metric_of(&self, i: usize) -> Metric {
        if self.metric == Metric::Delay && self.backends[i].no_delay.load(Ordering::Relaxed) {
            Metric::Backlog
        } else {
            self.metric
        }
    }

    fn idle(&self, i: usize) -> u64 {
        self.pool.get().map_or(0, |p| p.idle_count(i) as u64)
    }

    /// The bare sample of back-end `i` and its `advanced_mono_ns` (0 when there is none).
    fn sample(&self, i: usize, now_ns: u64) -> (Load, u64) {
        let b = &self.backends[i];
        if self.metric == Metric::Inflight {
            return (Load::Known(b.inflight.load(Ordering::Relaxed)), 0);
        }
        let (Some(t), true) = (&self.table, b.has_region) else {
            return (Load::Unknown, 0);
        };
        if self.metric == Metric::Delay {
            return self.delay_step(i, &**t, now_ns);
        }
        use table::field as f;
        let (f1, f2) = match self.metric {
            Metric::Conns => (f::CONNS_ESTABLISHED, None),
            Metric::Backlog => (f::ACCEPT_BACKLOG, None),
            Metric::Pending => (f::ACCEPT_BACKLOG, Some(f::CONNS_PENDING)),
            Metric::Cpu => (f::CPU_UTIL_PPM, None),
            Metric::Pressure => (f::CPU_PRESSURE_PPM, None),
            Metric::Runnable => (f::RUNNABLE, None),
            Metric::Inflight | Metric::Delay => unreachable!("handled above"),
        };
        match table::read_load(&**t, i, f1, f2) {
            Some((EntryStatus::Ok | EntryStatus::Error, advanced, v))
                if now_ns.saturating_sub(advanced) <= self.stale_after_ns =>
            {
                (Load::Known(v), advanced)
            }
            _ => (Load::Stale, 0),
        }
    }

    /// Metric `delay`: apply back-end `i`'s latest delay reading to its budget (once per
    /// reading) and return the load to compare with the budget: this proxy's requests
    /// in flight to it. Stale when the reading is older than the staleness bound.
    /// A fresh record without a delay reading turns the back-end to `backlog`
    /// ([`Control::metric_of`]): the load is then its accept queue and the sample's time
    /// (for the estimate), as metric `backlog` reads it.
    fn delay_step(&self, i: usize, t: &dyn Words, now_ns: u64) -> (Load, u64) {
        let b = &self.backends[i];
        let Some(e) = table::read(t, i) else {
            return (Load::Stale, 0);
        };
        if e.queue_delay_id == 0 {
            if !matches!(e.status, EntryStatus::Ok | EntryStatus::Error)
                || now_ns.saturating_sub(e.advanced_mono_ns) > self.stale_after_ns
            {
                return (Load::Stale, 0);
            }
            if !b.no_delay.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "admission: back-end {} publishes no queueing delay (its gatherd watches \
                     no port: give it --watch-port PORT of the web server); it is admitted by \
                     metric `backlog` (limit {QUEUE_LIMIT_DEFAULT}) until it publishes one",
                    b.addr
                );
            }
            return (Load::Known(e.accept_backlog), e.advanced_mono_ns);
        }
        if b.no_delay.swap(false, Ordering::Relaxed) {
            log::info!(
                "admission: back-end {} publishes a queueing delay again: metric `delay`",
                b.addr
            );
        }
        let taken = e
            .advanced_mono_ns
            .saturating_sub(delay_excess_lag_ns(e.conns_lag_ns, e.conns_interval_ns));
        if !matches!(e.status, EntryStatus::Ok | EntryStatus::Error)
            || now_ns.saturating_sub(taken) > self.stale_after_ns
        {
            return (Load::Stale, 0);
        }
        let mut st = b.delay.lock().unwrap_or_else(|p| p.into_inner());
        if st.reading_id != e.queue_delay_id && st.due(now_ns, self.target_delay_us) {
            let r = delay::Reading {
                id: e.queue_delay_id,
                delay_us: e.queue_delay_us,
                used: b.delay_used.swap(false, Ordering::Relaxed),
            };
            st.on_reading(r, self.target_delay_us, b.limit as f64, now_ns);
            if r.delay_us >= self.target_delay_us.max(1) {
                // A reading over the target: the levels admitted before it (a slow
                // start's overshoot among them) were not taken within the target, so
                // the stale policy's safe level is at most the budget after the cut;
                // admissions within the budget raise it again.
                let cut = st.budget.floor().max(delay::BUDGET_MIN) as u64;
                b.safe_inflight.fetch_min(cut, Ordering::Relaxed);
            }
        }
        (Load::Known(b.inflight.load(Ordering::Relaxed)), 0)
    }

    /// Metric `delay`: back-end `i`'s current budget of requests in flight.
    fn budget(&self, i: usize) -> u64 {
        let st = self.backends[i]
            .delay
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .budget;
        st.floor().max(delay::BUDGET_MIN) as u64
    }

    /// Back-end `i`'s budget of requests in flight as the class rule divides it: metric
    /// `delay`'s current budget, else the limit (no side effect, for metrics).
    fn budget_now(&self, i: usize) -> u64 {
        if self.metric_of(i) == Metric::Delay {
            self.budget(i)
        } else {
            self.backends[i].limit
        }
    }

    /// The limit admission compares back-end `i`'s load with: its `limit`, or with
    /// metric `delay` its current budget (and notes whether the budget is in use).
    fn limit_now(&self, i: usize, load: Load) -> u64 {
        let b = &self.backends[i];
        match self.metric_of(i) {
            Metric::Delay => {}
            // A back-end without a delay reading: the `backlog` rule's limit (its
            // configured limit is the delay budget's cap, not a queue length).
            Metric::Backlog if self.metric == Metric::Delay => return QUEUE_LIMIT_DEFAULT,
            _ => return b.limit,
        }
        let budget = self.budget(i);
        if let Load::Known(inflight) = load {
            // In use: after this request, at most one short of the budget.
            if inflight + 2 >= budget {
                b.delay_used.store(true, Ordering::Relaxed);
            }
        }
        budget
    }

    /// Whether back-end `i` may take one more request (of class `class`, if classified);
    /// `Err` says why not.
    fn admissible(&self, i: usize, load: Load, class: Option<usize>) -> Result<Admit, Reject> {
        let b = &self.backends[i];
        let mut r = if load == Load::Stale && self.on_stale == StalePolicy::Local {
            admit_local(
                b.inflight.load(Ordering::Relaxed),
                b.safe_inflight.load(Ordering::Relaxed),
            )
        } else {
            admit(
                load,
                self.limit_now(i, load),
                self.metric_of(i),
                self.on_stale,
                self.idle(i),
            )
        };
        if let (Metric::Delay, Load::Known(_), Err(Reject::Overloaded)) =
            (self.metric_of(i), load, r)
        {
            if self.slow_start_queue_admits(i) {
                r = Ok(Admit::Any);
            }
        }
        if let (Some(k), Load::Known(_), Ok(_)) = (class, load, r) {
            if self.class_verdict(i, k, load) != classes::Verdict::Admit {
                r = Err(Reject::Overloaded);
            }
        }
        if let (Load::Known(_), Ok(_)) = (load, r) {
            // The safe level: the most in flight with this request, admitted on a fresh
            // reading within the limit.
            // Written only when it rises (a read-modify-write on every decision would
            // take the line from the other workers each time).
            let inflight = b.inflight.load(Ordering::Relaxed);
            if b.safe_inflight.load(Ordering::Relaxed) <= inflight {
                b.safe_inflight.fetch_max(inflight + 1, Ordering::Relaxed);
            }
        }
        self.signals.count(load, &r);
        r
    }

    /// Metric `delay`, slow start: whether back-end `i` may take a request its budget
    /// refuses because its fresh accept queue (read every sample, however rarely its
    /// gatherd counts connections and measures the delay) holds fewer than
    /// [`QUEUE_LIMIT_DEFAULT`] connections (with this proxy's sends since the sample, as
    /// metric `backlog` estimates it), the `backlog` metric's rule; never beyond the
    /// budget's cap (`limit`). Until the first
    /// delay reading at or above the target ends slow start, a budget that starts at 1
    /// lags demand by a few service times (each completion adds one), and a reading may
    /// be up to a counting interval old; the accept queue is the fresh signal meanwhile,
    /// so a started or reloaded proxy admits what the back-end takes without queueing
    /// (as the former default did) instead of refusing below capacity. The first overload
    /// queues past the target and hands over to the budget, which then also bounds the
    /// stale policy's level ([`admit_local`]): what slow start admitted before the cut
    /// was not taken within the target.
    fn slow_start_queue_admits(&self, i: usize) -> bool {
        let b = &self.backends[i];
        let Some(t) = &self.table else {
            return false;
        };
        if b.inflight.load(Ordering::Relaxed) >= b.limit
            || !b.delay.lock().unwrap_or_else(|p| p.into_inner()).slow_start
        {
            return false;
        }
        match table::read_load(&**t, i, table::field::ACCEPT_BACKLOG, None) {
            Some((EntryStatus::Ok | EntryStatus::Error, advanced, backlog)) => {
                // As metric `backlog` reads it: the sample plus what this proxy sent
                // since, minus what completed (a burst between two samples counts).
                let (sent, done) = b.tally.since(advanced);
                coarse_mono_ns().saturating_sub(advanced) <= self.stale_after_ns
                    && estimate::estimate(backlog, sent, done) < QUEUE_LIMIT_DEFAULT
            }
            _ => false,
        }
    }

    /// The class rule ([`classes::decide`]) for a request of class `k` to back-end `i`
    /// whose metric admitted it with `load`: the budget is the metric's (`delay`'s
    /// budget, `inflight`'s limit), the counts are this proxy's requests in flight.
    fn class_verdict(&self, i: usize, k: usize, load: Load) -> classes::Verdict {
        let Some(cs) = &self.classes else {
            return classes::Verdict::Admit;
        };
        let b = &self.backends[i];
        let (now, n) = self.class_now(i, coarse_mono_ns());
        let v = classes::view(
            self.limit_now(i, load),
            b.inflight.load(Ordering::Relaxed),
            k,
            &now[..n],
        );
        let verdict = classes::decide(v);
        cs.refused_by[verdict as usize].fetch_add(1, Ordering::Relaxed);
        verdict
    }

    /// Every class's state on back-end `i` at `now_ns` (in flight, weight, priority,
    /// wanting), in a fixed array (no allocation on the decision path), and how many.
    fn class_now(
        &self,
        i: usize,
        now_ns: u64,
    ) -> ([classes::ClassNow; classes::CLASSES_MAX + 1], usize) {
        let mut out = [classes::ClassNow {
            inflight: 0,
            weight: 1.0,
            top: true,
            wanting: false,
        }; classes::CLASSES_MAX + 1];
        let Some(cs) = &self.classes else {
            return (out, 0);
        };
        let cells = &self.backends[i].classes;
        let n = cs.table.len().min(out.len());
        let mut costs = [classes::Cost::default(); classes::CLASSES_MAX + 1];
        for (k, c) in costs.iter_mut().enumerate().take(n) {
            *c = cells.cost(k);
        }
        let cheapest = classes::cheapest_us(costs[..n].iter().copied());
        for (k, o) in out.iter_mut().enumerate().take(n) {
            *o = classes::ClassNow {
                inflight: cells.inflight[k].load(Ordering::Relaxed),
                weight: classes::weight(costs[k], cheapest),
                top: cs.table.is_top(k),
                wanting: cs.wanting(k, now_ns),
            };
        }
        (out, n)
    }

    /// `on_stale = local`: back-end `i`'s last known safe level of requests in flight.
    pub fn safe_inflight(&self, i: usize) -> u64 {
        self.backends[i].safe_inflight.load(Ordering::Relaxed)
    }

    /// If back-end `i`'s accept queue is not empty, free the workers this proxy's own
    /// connections pin: close up to that many idle pooled connections now, and the rest
    /// of the queue's length in connections as they come back ([`relief`]). Acts once
    /// per sample. Returns how many idle connections were closed now.
    fn relieve(&self, i: usize, now_ns: u64) -> usize {
        let Some(pool) = self.pool.get() else {
            return 0;
        };
        let b = &self.backends[i];
        let (Some(t), true) = (&self.table, b.has_region) else {
            return 0;
        };
        let Some((EntryStatus::Ok | EntryStatus::Error, advanced, backlog)) =
            table::read_load(&**t, i, table::field::ACCEPT_BACKLOG, None)
        else {
            return 0;
        };
        // Already acted on this sample: the common case, a plain load (a swap on every
        // decision would take the line from the other workers each time); the swap
        // keeps "once per sample" among workers racing on a new one.
        if b.relieved_sample_ns.load(Ordering::Relaxed) == advanced
            || b.relieved_sample_ns.swap(advanced, Ordering::Relaxed) == advanced
        {
            return 0;
        }
        if now_ns.saturating_sub(advanced) > self.stale_after_ns {
            pool.close_on_return(i, 0);
            return 0;
        }
        let r = relief(backlog, pool.idle_count(i) as u64);
        let shed = pool.shed_idle(i, r.close_idle as usize);
        pool.close_on_return(i, r.close_on_return as usize);
        shed
    }

    /// Connections to back-end `i` closed so far because it queued (idle ones shed,
    /// and returning ones not pooled).
    pub fn shed_total(&self, i: usize) -> u64 {
        self.pool.get().map_or(0, |p| p.shed_total(i))
    }

    fn is_down(&self, i: usize, now_ns: u64) -> bool {
        self.backends[i].down_until_ns.load(Ordering::Relaxed) > now_ns
    }

    /// Back-end `i`'s `ROLE_SERVED` word as last read by the monitor (`None`: never).
    fn role_served(&self, i: usize) -> Option<u64> {
        let t = self.table.as_ref()?;
        match table::read_load(&**t, i, table::field::ROLE_SERVED, None)? {
            (EntryStatus::Never, _, _) => None,
            (_, _, w) => Some(w),
        }
    }

    fn serves(&self, i: usize, host: Option<&str>) -> bool {
        if let Some((_, site)) = self.sites.as_ref().and_then(|s| s.site_for_host(host)) {
            return self
                .role_served(i)
                .is_some_and(|w| crate::sites::role_serves(w, site));
        }
        let site = &self.backends[i].site;
        !self.routed_by_site
            || site.is_empty()
            || host.is_some_and(|h| h.eq_ignore_ascii_case(site))
    }

    /// The admission check alone, across all back-ends (what `on_accept` runs): true as
    /// soon as one back-end (not marked down, unless all are) may take a request. The
    /// walk starts at a random back-end and stops at the first admissible one, so it
    /// reads O(1) entries while a fair share of the back-ends is admissible and O(n)
    /// only to refuse.
    pub fn decide_accept(&self) -> Result<(), Reject> {
        let now = coarse_mono_ns();
        let n = self.backends.len();
        let start = rand_below(n.max(1));
        let mut why = Reject::NoBackend;
        let mut down = 0;
        for ignore_down in [false, true] {
            for k in 0..n {
                let i = (start + k) % n;
                if !ignore_down && self.is_down(i, now) {
                    down += 1;
                    continue;
                }
                if ignore_down && !self.is_down(i, now) {
                    continue; // already checked in the first pass
                }
                self.relieve(i, now);
                let load = self.load(i, now);
                match self.admissible(i, load, None) {
                    Ok(_) => return Ok(()),
                    Err(r) => why = merge_reason(why, r),
                }
            }
            if down < n {
                break; // some back-end is up: the marks stand
            }
        }
        Err(why)
    }

    /// Pick a back-end for a request to `host`: site filter, down filter, admission
    /// filter (if on), then the balancing policy among what is left.
    pub fn choose(&self, host: Option<&str>) -> Result<usize, Reject> {
        self.choose_route(host, None, None).map(|(i, _)| i)
    }

    /// [`Control::choose`] for a request whose request-line target is `target` (the
    /// content-aware policies route by its path).
    pub fn choose_for(&self, host: Option<&str>, target: &[u8]) -> Result<usize, Reject> {
        self.choose_route(host, None, Some(target)).map(|(i, _)| i)
    }

    /// The content-aware policy's choice for `target` among the usable back-ends (the
    /// same checks as every walk: site, down mark, admission), or `None` when no
    /// back-end is usable (the walk then says why). Reads every back-end's entry, as
    /// least-loaded does.
    fn choose_by_content(
        &self,
        c: &content::Content,
        host: Option<&str>,
        class: Option<usize>,
        now: u64,
        target: &[u8],
    ) -> Option<(usize, bool)> {
        let mut view = content::Candidates::new(self.backends.len());
        for i in 0..self.backends.len() {
            if let Considered::Usable {
                key: (score, inflight),
                reuse_only,
            } = self.consider(i, host, class, now, false)
            {
                // Metric `conns`: the score is the monitor's estimate of the back-end's
                // connections carrying requests (every front-end's); else this proxy's own.
                let load = if self.metric == Metric::Conns {
                    score.max(inflight)
                } else {
                    inflight
                };
                view.offer(i, load, reuse_only);
            }
        }
        c.decide(content::object_key(target), &view)
    }

    /// [`Control::choose`], also saying whether the back-end was admitted only onto an
    /// idle pooled connection (reuse-only).
    ///
    /// Cost in back-ends n: power-of-two-choices first draws up to [`P2C_DRAWS_MAX`]
    /// random back-ends and stops at two usable ones (O(1)); if the draws find fewer,
    /// a walk from a random back-end stops at the second usable one (O(n / usable)) and
    /// only a refusal reads all n. Round-robin walks from its rotation to the first
    /// usable one. Least-loaded reads all n (it must see every load).
    fn choose_route(
        &self,
        host: Option<&str>,
        class: Option<usize>,
        target: Option<&[u8]>,
    ) -> Result<(usize, bool), Reject> {
        let now = coarse_mono_ns();
        if let (Some(c), Some(t)) = (&self.content, target) {
            if let Some(chosen) = self.choose_by_content(c, host, class, now, t) {
                return Ok(chosen);
            }
        }
        let n = self.backends.len();
        if self.policy == BalancePolicy::P2c {
            let mut pick = Pick::new(self.policy, 2);
            for _ in 0..P2C_DRAWS_MAX.min(n) {
                let i = rand_below(n);
                if pick.has(i) {
                    continue;
                }
                if let Considered::Usable { key, reuse_only } =
                    self.consider(i, host, class, now, false)
                {
                    pick.offer(i, key, reuse_only);
                    if pick.is_full() {
                        return Ok(pick.finish().expect("two offered"));
                    }
                }
            }
        }
        // The rotation is a shared counter: p2c (which draws at random) leaves it alone,
        // so its decisions write no line that other workers read.
        let rotation = || self.rr.fetch_add(1, Ordering::Relaxed);
        let (start, want) = match self.policy {
            BalancePolicy::LeastLoaded | BalancePolicy::Lard | BalancePolicy::BoundedHash => {
                (rotation(), usize::MAX)
            }
            BalancePolicy::RoundRobin => (rotation(), 1),
            BalancePolicy::P2c => (rand_below(n.max(1)), 2),
        };
        let mut pick = Pick::new(self.policy, want);
        let scan = self.scan(host, class, now, false, start, &mut pick);
        if scan.serving == 0 {
            if let Some((index, _)) = self.sites.as_ref().and_then(|s| s.site_for_host(host)) {
                self.sites.as_ref().expect("matched").count_unserved(index);
                return Err(Reject::SiteUnserved);
            }
            return Err(Reject::UnknownSite);
        }
        if pick.is_empty() && scan.down == scan.serving {
            // Panic mode: every back-end of the site is marked down. Ignore the marks and
            // try them anyway: a failure seen under overload must not turn into "503 for
            // everyone for a second"; only admission control decides to shed load.
            let scan = self.scan(host, class, now, true, start, &mut pick);
            return pick.finish().ok_or(scan.why);
        }
        pick.finish().ok_or(scan.why)
    }

    /// Whether back-end `i` can take a request to `host` now, and at what score.
    fn consider(
        &self,
        i: usize,
        host: Option<&str>,
        class: Option<usize>,
        now: u64,
        ignore_down: bool,
    ) -> Considered {
        if !self.serves(i, host) {
            return Considered::NotServing;
        }
        if !ignore_down && self.is_down(i, now) {
            return Considered::Down;
        }
        self.relieve(i, now);
        let load = self.load(i, now);
        let mut reuse_only = false;
        if self.admission_on && self.per_request {
            match self.admissible(i, load, class) {
                Ok(Admit::Any) => {}
                Ok(Admit::ReuseOnly) => reuse_only = true,
                Err(r) => return Considered::Refused(r),
            }
        }
        let score = match load {
            Load::Known(v) if self.metric == Metric::Delay => self.delay_score(i, v),
            Load::Known(v) => v,
            Load::Stale | Load::Unknown => 0,
        };
        // Score: the load estimate (sample + this proxy's requests since), then this
        // proxy's in-flight requests.
        Considered::Usable {
            key: (score, self.backends[i].inflight.load(Ordering::Relaxed)),
            reuse_only,
        }
    }

    /// Metric `delay`'s balancing score of back-end `i` with `v` in its metric's unit,
    /// ppm of its bound, so that back-ends read by either metric compare:
    /// - by its delay: this proxy's requests in flight with this one, relative to the
    ///   budget, so a back-end whose delay allows more (a faster one, or one with no other
    ///   tenant) gets proportionally more. A back-end with none of this proxy's requests
    ///   in flight scores 0 whatever its budget: a budget grows only while in use and an
    ///   idle one keeps what it grew to, so among idle back-ends it records which one
    ///   was used last, not which is faster; ranking by it sent every request of a
    ///   sequential client to the back-end that served the first (its slow start had
    ///   grown its budget to 2). Idle back-ends tie, and ties spread (the walk starts at
    ///   a rotating back-end, p2c draws at random);
    /// - by `backlog` (no delay reading): its accept-queue estimate relative to the
    ///   `backlog` rule's limit.
    fn delay_score(&self, i: usize, v: u64) -> u64 {
        match self.metric_of(i) {
            Metric::Delay if v == 0 => 0,
            Metric::Delay => v.saturating_add(1) * 1_000_000 / self.budget(i).max(1),
            _ => v.saturating_mul(1_000_000) / QUEUE_LIMIT_DEFAULT,
        }
    }

    /// A walk over the back-ends from `start` (wrapping), offering each usable one
    /// (right site, not down unless `ignore_down`, admissible if admission is on) to
    /// `pick` until it is full; counts what it saw on the way.
    fn scan(
        &self,
        host: Option<&str>,
        class: Option<usize>,
        now: u64,
        ignore_down: bool,
        start: usize,
        pick: &mut Pick,
    ) -> Scan {
        let n = self.backends.len();
        let mut scan = Scan {
            serving: 0,
            down: 0,
            why: Reject::NoBackend,
        };
        for k in 0..n {
            let i = (start + k) % n;
            if pick.has(i) {
                scan.serving += 1;
                continue;
            }
            match self.consider(i, host, class, now, ignore_down) {
                Considered::NotServing => continue,
                Considered::Down => scan.down += 1,
                Considered::Refused(r) => scan.why = merge_reason(scan.why, r),
                Considered::Usable { key, reuse_only } => pick.offer(i, key, reuse_only),
            }
            scan.serving += 1;
            if pick.is_full() {
                break;
            }
        }
        scan
    }

    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }
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

/// What [`Control::consider`] found of one back-end.
enum Considered {
    /// It does not serve the request's site.
    NotServing,
    /// Marked down after a failure.
    Down,
    /// Admission refused it.
    Refused(Reject),
    /// It can take the request: its balancing key (lower is better) and whether only
    /// onto an idle pooled connection.
    Usable { key: (u64, u64), reuse_only: bool },
}

/// What one walk over the back-ends saw (until it stopped).
struct Scan {
    /// Back-ends serving the site.
    serving: usize,
    /// Of those, marked down (skipped).
    down: usize,
    /// The most telling reason a back-end was refused.
    why: Reject,
}

/// Chooses among the back-ends offered, in O(1) memory whatever their number:
/// least-loaded keeps the running minimum (the walk starts at a rotating back-end, so
/// ties spread); round-robin takes the first offered (the walk starts at the rotation);
/// power-of-two-choices keeps the first two offered (drawn at random, or met by a walk
/// from a random back-end) and takes the less loaded.
struct Pick {
    policy: BalancePolicy,
    /// Offers after which the choice is made (`usize::MAX`: all of them).
    want: usize,
    /// Offered so far.
    n: usize,
    /// The best (least-loaded, or the first for round-robin) and the runner-up (p2c).
    best: Option<(usize, (u64, u64), bool)>,
    second: Option<(usize, (u64, u64), bool)>,
}

impl Pick {
    fn new(policy: BalancePolicy, want: usize) -> Pick {
        Pick {
            policy,
            want,
            n: 0,
            best: None,
            second: None,
        }
    }

    fn offer(&mut self, i: usize, key: (u64, u64), reuse_only: bool) {
        let c = Some((i, key, reuse_only));
        match self.policy {
            BalancePolicy::LeastLoaded | BalancePolicy::Lard | BalancePolicy::BoundedHash => {
                if self.best.is_none_or(|(_, k, _)| key < k) {
                    self.best = c;
                }
            }
            BalancePolicy::RoundRobin | BalancePolicy::P2c => {
                if self.best.is_none() {
                    self.best = c;
                } else if self.second.is_none() {
                    self.second = c;
                }
            }
        }
        self.n += 1;
    }

    /// Whether back-end `i` was offered already (p2c's draws may repeat).
    fn has(&self, i: usize) -> bool {
        self.best.is_some_and(|b| b.0 == i) || self.second.is_some_and(|b| b.0 == i)
    }

    fn is_full(&self) -> bool {
        self.n >= self.want
    }

    fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The chosen back-end and whether it is reuse-only.
    fn finish(&self) -> Option<(usize, bool)> {
        let (i, k, r) = self.best?;
        Some(match (self.policy, self.second) {
            (BalancePolicy::P2c, Some((j, kj, rj))) if kj < k => (j, rj),
            _ => (i, r),
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
        Reject::UnknownSite | Reject::QueueTimeout | Reject::SiteUnserved => 0,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// Per-back-end admission checks by what decided them ([`Decided`]).
#[derive(Default)]
struct SignalCounters([AtomicU64; Decided::ALL.len()]);

impl SignalCounters {
    fn count(&self, load: Load, r: &Result<Admit, Reject>) {
        self.0[Decided::of(load, r) as usize].fetch_add(1, Ordering::Relaxed);
    }
}

impl Control {
    /// Route a request of class `class` (`None`: no classes declared) to `host`.
    fn route_class(
        &self,
        host: Option<&str>,
        class: Option<usize>,
        target: Option<&[u8]>,
    ) -> Result<Route, Reject> {
        if let (Some(k), Some(cs)) = (class, &self.classes) {
            // A lower class asking now wants its guarantee (the most important class
            // needs none: it is not tracked, so its requests write no shared line).
            if !cs.table.is_top(k) {
                cs.asked_ns[k].store(coarse_mono_ns().max(1), Ordering::Relaxed);
            }
        }
        match self.choose_route(host, class, target) {
            Ok((i, reuse_only)) => {
                self.counters
                    .request_admitted
                    .fetch_add(1, Ordering::Relaxed);
                if reuse_only {
                    self.counters
                        .request_admitted_reuse_only
                        .fetch_add(1, Ordering::Relaxed);
                }
                let b = &self.backends[i];
                b.routed.fetch_add(1, Ordering::Relaxed);
                // Metric `backlog` counts the accept queue, which a reuse-only request
                // (carried by an idle pooled connection, never a new one) cannot enter:
                // it stays out of the estimate. A request admitted below the limit may
                // open a new connection (an idle one seen now can be taken by another
                // request first), so it counts: leaving those out too let the accept
                // queue grow unseen under overload (p99 of seconds in a short
                // bench/lockout.sh run).
                let mut guard = if self.metric_of(i) == Metric::Backlog && reuse_only {
                    InflightGuard::new(b.inflight.clone())
                } else {
                    InflightGuard::observed(b.inflight.clone(), b.observer.clone())
                };
                if let (Some(k), Some(cs)) = (class, &self.classes) {
                    cs.admitted[k].fetch_add(1, Ordering::Relaxed);
                    guard = guard.with_class(b.classes.clone(), k);
                }
                Ok(Route {
                    backend: i,
                    addr: b.addr,
                    guard,
                    reuse_only,
                })
            }
            Err(why) => {
                if let (Some(k), Some(cs)) = (class, &self.classes) {
                    cs.rejected[k].fetch_add(1, Ordering::Relaxed);
                }
                self.counters.request_rejected[why.index()].fetch_add(1, Ordering::Relaxed);
                Err(why)
            }
        }
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
        self.route_class(host, self.classes.as_ref().map(|_| 0), None)
    }

    fn route_request(&self, host: Option<&str>, target: &[u8]) -> Result<Route, Reject> {
        let class = self.classes.as_ref().map(|c| c.table.classify(target));
        self.route_class(host, class, Some(target))
    }

    fn retry_after_s(&self) -> u32 {
        self.retry_after_s
    }

    fn bind_pool(&self, pool: Arc<Pool>) {
        if self.pool.set(pool).is_err() {
            log::warn!("control: a second upstream pool was bound; idle counts follow the first");
        }
    }

    fn tend(&self) {
        let now = coarse_mono_ns();
        for i in 0..self.backends.len() {
            self.relieve(i, now);
        }
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

    fn render_metrics(&self, enc: &mut Encoder) {
        self.render(enc);
    }
}

#[cfg(test)]
mod tests;
