//! Proxy configuration: one typed struct, loaded from TOML and/or flags, with defaults
//! named in each field's doc and an explicit [`ProxyConfig::validate`] whose errors
//! name the offending key.
//!
//! - [`error`]: [`ConfigError`], naming the key at fault
//! - [`sites`] (`[[sites]]`), [`reconf`] (`[reconf]`) and [`classes`](mod@classes)
//!   (`[[classes]]`): the sections of the features of the same names, with their checks
//! - this module: [`ProxyConfig`] and its sections, their bounds and the rules that
//!   derive limits (`limit_for`, `maxconn_for`), and validation
//! - [`file`](mod@file): the TOML file
//! - [`cli`]: the flags of `farside proxy` and `farside monitor`, merged over the file,
//!   and `--check-config`
//! - `[monitor]` is the monitor crate's own [`MonitorConfig`]

pub mod classes;
pub mod cli;
pub mod error;
pub mod file;
pub mod reconf;
pub mod sites;

pub use classes::ClassConfig;
pub use error::ConfigError;
pub use reconf::ReconfConfig;
pub use sites::SiteConfig;

use error::err;
use serde::Deserialize;
use std::net::SocketAddr;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// Address the proxy accepts clients on. Required.
    pub listen: SocketAddr,
    /// Data-path workers, 1..=256. Each is a thread with its own single-threaded runtime
    /// and its own listener on `listen` (`SO_REUSEPORT`: the kernel spreads new
    /// connections over the workers by a hash of their addresses, with no shared accept
    /// queue or lock); a connection stays on the worker that accepted it. Counters are
    /// kept per worker (`farside_proxy_worker_*{worker}`). Default 1.
    #[serde(default = "defaults::workers")]
    pub workers: usize,
    /// Before a worker thread sleeps waiting for I/O it spins this long, µs (like
    /// HAProxy's `busy-polling`, but bounded). Data arriving meanwhile is handled without
    /// the thread being woken, which the sender pays for (an IPI; costly in VMs). Costs
    /// up to this much CPU per sleep on the proxy's cores. Default 0 (off); at most
    /// [`BUSY_POLL_US_MAX`].
    #[serde(default)]
    pub busy_poll_us: u64,
    /// Separate admin listener serving `/metrics` (Prometheus text) and the live
    /// dashboard (`/`, `/events`; `crate::dashboard`). Default: none. Bind it to a
    /// loopback or management address: what it shows (back-end addresses, loads,
    /// roles) is for operators.
    #[serde(default)]
    pub admin_listen: Option<SocketAddr>,
    /// Also answer `/farside/metrics` on the public data port (`listen`). Default
    /// false: the metrics name every back-end's address, load and role, which no
    /// client of the site should learn; the path is then forwarded like any other.
    /// Operators read metrics on `admin_listen`.
    #[serde(default)]
    pub data_port_metrics: bool,
    /// Bind `listen` with `SO_REUSEPORT`, so a successor proxy can bind the same port
    /// while this one drains (zero-downtime restart). Default false: a second proxy on
    /// the same port is then an error instead of silently sharing the traffic (with
    /// several `workers`, the first listener is bound without the option and given it
    /// only afterwards, for its siblings, so that stays true).
    #[serde(default)]
    pub reuse_port: bool,
    #[serde(default)]
    pub http: HttpConfig,
    /// The back-end servers. At least one.
    #[serde(default, rename = "backend")]
    pub backends: Vec<BackendConfig>,
    #[serde(default)]
    pub admission: AdmissionConfig,
    #[serde(default)]
    pub monitor: MonitorConfig,
    #[serde(default)]
    pub balance: BalanceConfig,
    /// `[[sites]]`: co-hosted sites routed by each back-end's served role (seed 001,
    /// `crate::sites`). Empty: routing as without it.
    #[serde(default)]
    pub sites: Vec<SiteConfig>,
    /// `[reconf]`: the reconfiguration driver (`crate::reconf`). Default off.
    #[serde(default)]
    pub reconf: ReconfConfig,
    /// `[[classes]]`: request classes for class-aware admission
    /// (`crate::control::classes`). Empty: every request is of one class.
    #[serde(default)]
    pub classes: Vec<ClassConfig>,
}

/// Limits and timeouts of the HTTP data path.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Time a client has to send a complete request head. Default 10000 ms.
    pub header_timeout_ms: u64,
    /// Idle time allowed between requests on a keep-alive client connection. Default 60000 ms.
    pub idle_timeout_ms: u64,
    /// Time to connect to a back-end. Default 2000 ms.
    pub connect_timeout_ms: u64,
    /// Time for a back-end to send its response head. Default 30000 ms.
    pub response_timeout_ms: u64,
    /// Largest request or response head accepted, bytes (431 / 502 beyond). Default 16384.
    pub max_header_bytes: usize,
    /// Most header fields in one head. Default 100.
    pub max_headers: usize,
    /// Most client connections open at once; further accepts wait. Default 10000.
    pub max_client_conns: usize,
    /// Idle upstream connections kept per back-end. Default 10000, the default of
    /// `max_client_conns`. Rule: every connection the data path may use at once may also
    /// be kept, so a keep-alive load never churns connections for want of pool room (a
    /// churned connection re-enters the back-end's accept queue, which the default
    /// admission metric counts: with 64, 400 keep-alive clients to nginx reconnected
    /// ~2,500 times in 3 s and doubled the 503s). An idle connection costs an event
    /// server a few KB; on a prefork server it pins a worker, so at most its workers'
    /// worth can be idle, and admission's relief closes them as soon as it queues.
    pub pool_idle_per_backend: usize,
    /// An idle upstream connection older than this is closed, not reused. Default 30000 ms.
    pub pool_idle_timeout_ms: u64,
    /// Cap on open upstream connections (busy + idle) per back-end, for back-ends that
    /// set no `maxconn` of their own. Default: none, i.e. the rule of
    /// [`ProxyConfig::maxconn_for`].
    pub maxconn_per_backend: Option<usize>,
    /// Most time a request waits in the proxy for a connection when its back-end's
    /// `maxconn` is reached (HAProxy's `timeout queue`), then 503 `queue_timeout`.
    /// 0 = do not wait. Default 500 ms: well inside the 1 s `Retry-After` a rejected
    /// client is told, and many back-end service times.
    pub queue_timeout_ms: u64,
    /// After SIGTERM, time in-flight requests get to finish before the proxy exits
    /// anyway (the listeners are closed at once; idle keep-alive connections are closed,
    /// busy ones get `Connection: close` on their last response). Default 10000 ms:
    /// longer than most responses, shorter than the 30 s most supervisors wait before
    /// SIGKILL.
    pub drain_timeout_ms: u64,

    // ---- Body deadlines: a slow body must not pin a client slot, an upstream connection
    // and a back-end worker for longer than these (per-read timeouts alone let a client
    // trickle one byte a minute). Validated by `HttpConfig::validate_body_deadlines`. ----
    /// Total time a request body may take to arrive, counted from when the proxy starts
    /// relaying it (a back-end connection is ready); beyond it the client gets 408 and
    /// both connections close. Default 60000 ms.
    pub request_body_timeout_ms: u64,
    /// Total time to relay a response body (reads from the back-end and writes to the
    /// client); beyond it both connections are dropped. Default 300000 ms.
    pub response_body_timeout_ms: u64,
    /// After `body_rate_grace_ms`, a request or response body must have moved at least
    /// this many bytes per second on average since it began (mod_reqtimeout's `MinRate`),
    /// or it fails as on its total timeout. 0 = no minimum rate. Default 500.
    pub body_min_rate_bytes_per_s: u64,
    /// Time a body transfer has before `body_min_rate_bytes_per_s` applies. Default 10000 ms.
    pub body_rate_grace_ms: u64,
    /// Forward a client's `RDMA:` request header (RDMA over HTTP, docs/rdma-http.md) to
    /// the back-end. Default false: it is removed, since it asks the back-end to connect
    /// to and write into an address the client chose, and the back-end sees the proxy,
    /// not the client, as the HTTP peer it checks that address against.
    pub pass_rdma_header: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            header_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            connect_timeout_ms: 2_000,
            response_timeout_ms: 30_000,
            max_header_bytes: 16 * 1024,
            max_headers: 100,
            max_client_conns: 10_000,
            pool_idle_per_backend: 10_000,
            pool_idle_timeout_ms: 30_000,
            maxconn_per_backend: None,
            queue_timeout_ms: 500,
            drain_timeout_ms: 10_000,

            // Body deadlines.
            request_body_timeout_ms: 60_000,
            response_body_timeout_ms: 300_000,
            body_min_rate_bytes_per_s: 500,
            body_rate_grace_ms: 10_000,
            pass_rdma_header: false,
        }
    }
}

/// Largest `http.body_min_rate_bytes_per_s`: 1 GiB/s, beyond any single client; larger
/// values are a unit mistake.
pub const BODY_MIN_RATE_BYTES_PER_S_MAX: u64 = 1 << 30;

impl HttpConfig {
    /// Check the body-deadline keys; errors name the key.
    pub fn validate_body_deadlines(&self) -> Result<(), ConfigError> {
        for (k, v) in [
            ("http.request_body_timeout_ms", self.request_body_timeout_ms),
            (
                "http.response_body_timeout_ms",
                self.response_body_timeout_ms,
            ),
            ("http.body_rate_grace_ms", self.body_rate_grace_ms),
        ] {
            if v == 0 || v > TIMEOUT_MS_MAX {
                return Err(err(k, format!("must be 1..={TIMEOUT_MS_MAX} ms, got {v}")));
            }
        }
        if self.body_min_rate_bytes_per_s > BODY_MIN_RATE_BYTES_PER_S_MAX {
            return Err(err(
                "http.body_min_rate_bytes_per_s",
                format!(
                    "must be 0..={BODY_MIN_RATE_BYTES_PER_S_MAX}, got {}",
                    self.body_min_rate_bytes_per_s
                ),
            ));
        }
        Ok(())
    }
}

/// One back-end web server.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Address of the web server. Required.
    pub addr: SocketAddr,
    /// Site (virtual host) this back-end serves; requests are routed by `Host`.
    /// Default "" = serves every site.
    #[serde(default)]
    pub site: String,
    /// Where its gatherer publishes the load region: `shm:/run/farside/NAME.region`,
    /// `tcp:HOST:PORT`, `udp:HOST:PORT`, optionally with `?key=HEX` (this back-end's
    /// read key, as given to its gatherd `--read-key`). Default: none (no load data; admission treats it per
    /// `admission.on_missing`).
    #[serde(default)]
    pub region: Option<String>,
    /// Load limit for this back-end in the admission metric's unit; overrides
    /// `admission.limit`. Default: none.
    #[serde(default)]
    pub limit: Option<u64>,
    /// Most upstream connections (busy + idle) this proxy keeps open to it, like
    /// HAProxy's `server maxconn`; set it to the back-end's workers (Apache's
    /// MaxClients) or fewer. Default: `http.maxconn_per_backend`, else the rule of
    /// [`ProxyConfig::maxconn_for`].
    #[serde(default)]
    pub maxconn: Option<usize>,
}

/// Which load figure admission and balancing compare.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// Established connections on the back-end's watched ports.
    Conns,
    /// Connections waiting in the back-end's accept queue (fresh every sample: cheap to count).
    Backlog,
    /// Connections waiting to be served: accept backlog + connections with unread requests.
    Pending,
    /// CPU utilisation, ppm (1_000_000 = all CPUs busy).
    Cpu,
    /// CPU pressure (PSI some), ppm.
    Pressure,
    /// Runnable tasks.
    Runnable,
    /// Requests this proxy has in flight to the back-end (local, needs no monitor).
    Inflight,
    /// Objective-driven: the back-end's published queueing delay is kept under
    /// `target_delay_ms` by an adaptive per-back-end budget of in-flight requests
    /// (`limit` caps the budget); see `control::delay`.
    Delay,
}

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Metric::Conns => "conns",
            Metric::Backlog => "backlog",
            Metric::Pending => "pending",
            Metric::Cpu => "cpu",
            Metric::Pressure => "pressure",
            Metric::Runnable => "runnable",
            Metric::Inflight => "inflight",
            Metric::Delay => "delay",
        }
    }
}

/// What to do when a back-end's load record is stale or missing.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum StalePolicy {
    /// Treat the back-end as overloaded (fail safe: protect it).
    Reject,
    /// Ignore load data for it (fail open: admit as without admission control).
    Admit,
    /// Fall back to this proxy's own view (fail safe, not blind): admit while its
    /// requests in flight to the back-end are below the back-end's last known safe
    /// level, the most this proxy had in flight to it when a fresh reading admitted a
    /// request; refuse beyond it, and refuse everything if there never was a fresh
    /// reading.
    Local,
}

impl StalePolicy {
    pub fn name(self) -> &'static str {
        match self {
            StalePolicy::Reject => "reject",
            StalePolicy::Admit => "admit",
            StalePolicy::Local => "local",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Admission control on or off. Default off.
    pub enabled: bool,
    /// Load figure compared with the limit. Default `delay` (objective-driven), chosen by
    /// the written rule of `--metric`'s help (docs/proxy.md, "How the default mode is
    /// chosen"): over five scenarios against HAProxy it is the mode whose goodput ratio's
    /// minimum is highest with a p99 at or below HAProxy's in every one; `backlog` (the
    /// former default) exceeds HAProxy's p99 where request costs differ 100x, because
    /// costly requests hold workers without lengthening the accept queue. Its target is
    /// [`ProxyConfig::target_delay_ms`]'s rule.
    pub metric: Metric,
    /// Admit only while the chosen back-end's load is below this, in the metric's unit.
    /// Default: none, i.e. the rule of [`AdmissionConfig::default_limit`] for `backlog`,
    /// `pending` and `delay`; `conns`, `inflight`, `cpu`, `pressure` and `runnable` have
    /// no capacity-free rule, so they need a limit here, per site or per back-end.
    pub limit: Option<u64>,
    /// Check at accept time (before reading the request), as in the paper. Default true.
    pub at_accept: bool,
    /// Check again per request (keep-alive connections). Default true.
    pub per_request: bool,
    /// A record whose sequence has not advanced for this long is stale. Default 100 ms.
    /// A connection count (metrics `conns`, `pending`, `delay`) may be older than its
    /// record by its gatherer's counting interval (at most 1 s of it): it is stale once
    /// overdue by this much (`farside_monitor::table::conns_excess_lag_ns`).
    pub stale_after_ms: u64,
    /// What a stale or missing record means. Default `local`: a dead gatherd (or a
    /// lost region, or a monitor that cannot read it) must neither let this proxy
    /// overload the back-end (`admit` sends it everything) nor refuse every request
    /// (`reject`): the proxy keeps the back-end at the concurrency it last saw it take
    /// without exceeding its limit, which is what it would be admitted at anyway.
    pub on_stale: StalePolicy,
    /// Value of `Retry-After` on 503. Default 1 s.
    pub retry_after_s: u32,
    /// Per-site limits overriding `limit`, e.g. `{ "shop.example" = 100 }`.
    pub site_limits: std::collections::BTreeMap<String, u64>,
    /// Metric `delay`: the queueing delay each back-end is kept under, ms. Default: none,
    /// i.e. the rule of [`ProxyConfig::target_delay_ms`] (half of `http.queue_timeout_ms`).
    pub target_delay_ms: Option<u64>,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            enabled: false,
            metric: Metric::Delay,
            limit: None,
            at_accept: true,
            per_request: true,
            stale_after_ms: 100,
            on_stale: StalePolicy::Local,
            retry_after_s: 1,
            site_limits: Default::default(),
            target_delay_ms: None,
        }
    }
}

/// Default limit of the queue metrics (`backlog`, `pending`): connections a back-end may
/// hold waiting beyond its busy workers. Rule (queue terms, not a tuned result): each
/// waiting connection adds one service time S, spread over the W workers (S/W), to the
/// wait of every connection behind it. At least 1 waiting, so that a worker that frees
/// takes the next request at once instead of idling while this proxy learns of the
/// completion and sends one; at most 2, so that the queueing delay admission lets a
/// request incur stays within 2 service times on any back-end, one worker or hundreds
/// (2·S/W ≤ 2·S). With N proxies reading the same sample, each adds only its own sends
/// to its estimate, so the queue can reach N·L until the next sample shows it.
pub const QUEUE_LIMIT_DEFAULT: u64 = 2;

impl AdmissionConfig {
    /// The limit used when neither `admission.limit`, a site limit nor a back-end's
    /// `limit` gives one, by metric:
    /// - `backlog`, `pending`: [`QUEUE_LIMIT_DEFAULT`] connections waiting beyond the
    ///   busy workers;
    /// - `delay`: the cap of the adaptive budget is `max_client_conns`, the data path's
    ///   own bound on requests in flight (each holds a client connection): the budget is
    ///   steered by the delay target, not by the cap;
    /// - `conns`, `inflight`: none. They count connections (requests) in service plus
    ///   waiting, so the limit is the back-end's capacity (its workers, Apache's
    ///   MaxClients) plus the connections allowed to wait (e.g. [`QUEUE_LIMIT_DEFAULT`]):
    ///   only the operator knows the workers;
    /// - `cpu`, `pressure`, `runnable`: none; they are not queue lengths.
    pub fn default_limit(&self, max_client_conns: usize) -> Option<u64> {
        match self.metric {
            Metric::Backlog | Metric::Pending => Some(QUEUE_LIMIT_DEFAULT),
            Metric::Delay => Some(max_client_conns as u64),
            Metric::Conns
            | Metric::Inflight
            | Metric::Cpu
            | Metric::Pressure
            | Metric::Runnable => None,
        }
    }
}

/// Largest `admission.target_delay_ms`: a queueing delay target above 10 s is not a
/// target, it is a timeout.
pub const TARGET_DELAY_MS_MAX: u64 = 10_000;

/// The default queueing-delay target of metric `delay`, ms, from the proxy's queue
/// timeout `queue_timeout_ms` (`http.queue_timeout_ms`, HAProxy's `timeout queue`): the
/// operator's one bound on how long a request may wait before a back-end starts on it,
/// Q. Rule: `max(1, Q / 2)`, at most [`TARGET_DELAY_MS_MAX`]. The budget's AIMD
/// oscillates about its target (a cut shows only once the queue ahead has drained), so
/// half the bound leaves the other half for the overshoot. The same rule sets the lab's
/// objective (`farside lab admission --queue-ms Q`), and the default mode was chosen with
/// it (docs/proxy.md); it is not fitted to a result. With the default queue timeout
/// (500 ms) the target is 250 ms; an operator with a tighter bound states it once
/// (`--queue-timeout-ms 50`: a 25 ms target).
pub fn target_delay_rule(queue_timeout_ms: u64) -> u64 {
    (queue_timeout_ms / 2).clamp(1, TARGET_DELAY_MS_MAX)
}

/// `[monitor]`: the monitor crate's own settings (period, read timeout, threads, group
/// reads, receive path, an external table), and how they become its options.
pub use farside_monitor::MonitorConfig;

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum BalancePolicy {
    /// Rotate through usable back-ends.
    RoundRobin,
    /// Lowest load (remote metric + local in-flight).
    LeastLoaded,
    /// Power of two random choices on the same score.
    P2c,
    /// Content-aware: LARD on the request's path (`control::content`).
    Lard,
    /// Content-aware: consistent hashing of the path with bounded loads.
    BoundedHash,
}

impl BalancePolicy {
    /// Whether the request's path chooses the back-end (`lard`, `bounded-hash`).
    pub fn by_content(self) -> bool {
        matches!(self, BalancePolicy::Lard | BalancePolicy::BoundedHash)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BalanceConfig {
    /// Default `least-loaded`.
    pub policy: BalancePolicy,
    /// After a connect failure a back-end is skipped for this long. Default 1000 ms.
    pub down_for_ms: u64,
    /// Policy `lard`: T_low, requests in service (a back-end below it is underused).
    /// Default 25, the paper's.
    pub lard_low: u64,
    /// Policy `lard`: T_high (a path leaves its back-end above it while another is
    /// below T_low, or at twice it). Default 65, the paper's.
    pub lard_high: u64,
    /// Policy `bounded-hash`: a back-end takes a request only while its load stays
    /// within this percentage of the mean (HAProxy's `hash-balance-factor`; 0: no
    /// bound). Default 125.
    pub hash_balance_factor: u64,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        use crate::control::content as c;
        BalanceConfig {
            policy: BalancePolicy::LeastLoaded,
            down_for_ms: 1000,
            lard_low: c::LARD_LOW_DEFAULT,
            lard_high: c::LARD_HIGH_DEFAULT,
            hash_balance_factor: c::HASH_BALANCE_FACTOR_DEFAULT,
        }
    }
}

impl BalanceConfig {
    /// The content-aware policy's own keys, checked against `backends` back-ends.
    fn content_errors(&self, backends: usize, errs: &mut Vec<ConfigError>) {
        use crate::control::content as c;
        if !self.policy.by_content() {
            return;
        }
        if backends > c::CONTENT_BACKENDS_MAX {
            errs.push(err(
                "balance.policy",
                format!(
                    "lard and bounded-hash route over at most {} back-ends, got {backends}",
                    c::CONTENT_BACKENDS_MAX
                ),
            ));
        }
        if !(self.lard_low < self.lard_high && self.lard_high <= c::LARD_HIGH_MAX) {
            errs.push(err(
                "balance.lard_low",
                format!(
                    "need lard_low < lard_high <= {}, got {} and {}",
                    c::LARD_HIGH_MAX,
                    self.lard_low,
                    self.lard_high
                ),
            ));
        }
        let f = self.hash_balance_factor;
        if f != 0 && !(100..=c::HASH_BALANCE_FACTOR_MAX).contains(&f) {
            errs.push(err(
                "balance.hash_balance_factor",
                format!(
                    "must be 0 (no bound) or 100..={}, got {f}",
                    c::HASH_BALANCE_FACTOR_MAX
                ),
            ));
        }
    }
}

mod defaults {
    pub fn workers() -> usize {
        1
    }
}

/// Largest `busy_poll_us`: longer spins only burn CPU (a sleeping thread is woken in
/// tens of µs at most).
pub const BUSY_POLL_US_MAX: u64 = 1000;

/// Largest sane value for timeouts, to catch unit mistakes (ms given as µs).
const TIMEOUT_MS_MAX: u64 = 3_600_000;

/// Largest `maxconn`: more connections than ports one source address can use to one
/// back-end address is a unit mistake.
pub const MAXCONN_MAX: usize = 65_535;

impl ProxyConfig {
    /// A configuration from flags alone: listen address and back-ends, defaults elsewhere.
    pub fn simple(listen: SocketAddr, backends: Vec<BackendConfig>) -> Self {
        ProxyConfig {
            listen,
            workers: defaults::workers(),
            busy_poll_us: 0,
            admin_listen: None,
            data_port_metrics: false,
            reuse_port: false,
            http: HttpConfig::default(),
            backends,
            admission: AdmissionConfig::default(),
            monitor: MonitorConfig::default(),
            balance: BalanceConfig::default(),
            sites: Vec::new(),
            reconf: ReconfConfig::default(),
            classes: Vec::new(),
        }
    }

    /// The load limit of back-end `i` in the admission metric's unit as configured: its
    /// own `limit`, else its site's `admission.site_limits` entry, else
    /// `admission.limit`, else the metric's rule ([`AdmissionConfig::default_limit`]).
    /// `None` when none applies ([`ProxyConfig::validate`] refuses that with admission on).
    pub fn configured_limit(&self, i: usize) -> Option<u64> {
        let b = &self.backends[i];
        let a = &self.admission;
        b.limit
            .or_else(|| a.site_limits.get(&b.site).copied())
            .or(a.limit)
            .or_else(|| a.default_limit(self.http.max_client_conns))
    }

    /// [`ProxyConfig::configured_limit`], or `u64::MAX` (no limit) where none applies,
    /// which only happens with admission off.
    pub fn limit_for(&self, i: usize) -> u64 {
        self.configured_limit(i).unwrap_or(u64::MAX)
    }

    /// Metric `delay`'s target queueing delay, ms: `admission.target_delay_ms`, else the
    /// rule of [`target_delay_rule`] on `http.queue_timeout_ms`.
    pub fn target_delay_ms(&self) -> u64 {
        self.admission
            .target_delay_ms
            .unwrap_or_else(|| target_delay_rule(self.http.queue_timeout_ms))
    }

    /// The limit every back-end shares when they all have the same one (for the start-up
    /// log and `/metrics`), else `None`.
    pub fn common_limit(&self) -> Option<u64> {
        let first = self.configured_limit(0)?;
        (1..self.backends.len())
            .all(|i| self.configured_limit(i) == Some(first))
            .then_some(first)
    }

    /// The connection cap of back-end `i` (busy + idle upstream connections). Its own
    /// `maxconn`, else `http.maxconn_per_backend`, else derived:
    /// - admission on with metric `conns` or `inflight`: the back-end's limit
    ///   ([`ProxyConfig::limit_for`]). It is admitted requests only while below that
    ///   many connections (requests), so connections beyond it could only sit idle or
    ///   wait in its accept queue. What `limit` means there: the back-end's workers plus
    ///   the connections allowed to wait for them, so this proxy alone never has more
    ///   than `limit − workers` waiting (a limit of 256 on 16 workers lets 240 wait:
    ///   that is why `conns` has no default limit);
    /// - otherwise `http.max_client_conns`: every upstream connection serves one client
    ///   connection, so this is the bound the data path had anyway.
    ///
    /// The result is clamped to 1..=[`MAXCONN_MAX`].
    pub fn maxconn_for(&self, i: usize) -> usize {
        let derived = || {
            let a = &self.admission;
            match a.metric {
                Metric::Conns | Metric::Inflight if a.enabled => {
                    usize::try_from(self.limit_for(i)).unwrap_or(usize::MAX)
                }
                _ => self.http.max_client_conns,
            }
        };
        self.backends[i]
            .maxconn
            .or(self.http.maxconn_per_backend)
            .unwrap_or_else(derived)
            .clamp(1, MAXCONN_MAX)
    }

    /// Check the configuration; the error is the first of
    /// [`ProxyConfig::validation_errors`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.validation_errors().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// `[reconf]` checked against the back-ends and sites it moves nodes between.
    pub fn validate_reconf(&self) -> Result<(), ConfigError> {
        let every_node_has_region = self.backends.iter().all(|b| b.region.is_some());
        self.reconf
            .validate(&self.sites, self.backends.len(), every_node_has_region)
    }

    /// Every validation error, each naming its key (for `farside proxy
    /// --check-config`). Each key's own bounds are checked independently; the checks
    /// across keys (sites, reconfiguration, regions needed by the admission metric) run
    /// only once every key on its own is valid, since they read those keys.
    pub fn validation_errors(&self) -> Vec<ConfigError> {
        let mut errs = Vec::new();
        if self.workers == 0 || self.workers > 256 {
            errs.push(err("workers", "must be 1..=256"));
        }
        if self.busy_poll_us > BUSY_POLL_US_MAX {
            errs.push(err(
                "busy_poll_us",
                format!("must be 0..={BUSY_POLL_US_MAX}"),
            ));
        }
        if self.backends.is_empty() {
            errs.push(err("backend", "at least one back-end is required"));
        }
        if self.monitor.threads > farside_monitor::MONITOR_THREADS_MAX {
            errs.push(err(
                "monitor.threads",
                format!(
                    "must be 0 (one per {} back-ends) ..={}",
                    farside_monitor::BACKENDS_PER_THREAD,
                    farside_monitor::MONITOR_THREADS_MAX
                ),
            ));
        }
        if self.monitor.group_read.is_some_and(|g| !g.is_ipv4()) {
            errs.push(err(
                "monitor.group_read",
                "must be an IPv4 ADDR:PORT (back-ends answer IPv4 group reads only)",
            ));
        }
        if let Err(m) = self.monitor.rx.parse::<farside_monitor::MonitorRx>() {
            errs.push(err("monitor.rx", m));
        }
        let max = farside_monitor::table::TABLE_BACKENDS_MAX;
        if self.backends.len() > max {
            errs.push(err(
                "backend",
                format!("at most {max} back-ends, got {}", self.backends.len()),
            ));
        }
        let h = &self.http;
        for (k, v) in [
            ("http.header_timeout_ms", h.header_timeout_ms),
            ("http.idle_timeout_ms", h.idle_timeout_ms),
            ("http.connect_timeout_ms", h.connect_timeout_ms),
            ("http.response_timeout_ms", h.response_timeout_ms),
            ("http.pool_idle_timeout_ms", h.pool_idle_timeout_ms),
            ("http.drain_timeout_ms", h.drain_timeout_ms),
            ("admission.stale_after_ms", self.admission.stale_after_ms),
            ("monitor.read_timeout_ms", self.monitor.read_timeout_ms),
            ("balance.down_for_ms", self.balance.down_for_ms),
        ] {
            if v == 0 || v > TIMEOUT_MS_MAX {
                errs.push(err(k, format!("must be 1..={TIMEOUT_MS_MAX} ms, got {v}")));
            }
        }
        self.balance.content_errors(self.backends.len(), &mut errs);
        if !(1024..=1 << 20).contains(&h.max_header_bytes) {
            errs.push(err("http.max_header_bytes", "must be 1024..=1048576"));
        }
        if !(8..=1000).contains(&h.max_headers) {
            errs.push(err("http.max_headers", "must be 8..=1000"));
        }
        if h.queue_timeout_ms > TIMEOUT_MS_MAX {
            errs.push(err(
                "http.queue_timeout_ms",
                format!("must be 0..={TIMEOUT_MS_MAX} ms"),
            ));
        }
        if let Some(m) = h.maxconn_per_backend {
            if !(1..=MAXCONN_MAX).contains(&m) {
                errs.push(err(
                    "http.maxconn_per_backend",
                    format!("must be 1..={MAXCONN_MAX}, got {m}"),
                ));
            }
        }
        for (i, b) in self.backends.iter().enumerate() {
            if let Some(m) = b.maxconn {
                if !(1..=MAXCONN_MAX).contains(&m) {
                    errs.push(err(
                        format!("backend[{i}].maxconn"),
                        format!("must be 1..={MAXCONN_MAX}, got {m}"),
                    ));
                }
            }
        }
        if let Some(t) = self.admission.target_delay_ms {
            if !(1..=TARGET_DELAY_MS_MAX).contains(&t) {
                errs.push(err(
                    "admission.target_delay_ms",
                    format!("must be 1..={TARGET_DELAY_MS_MAX} ms, got {t}"),
                ));
            }
        }
        if h.max_client_conns == 0 {
            errs.push(err("http.max_client_conns", "must be at least 1"));
        }
        if let Err(e) = h.validate_body_deadlines() {
            errs.push(e);
        }
        if !(10..=1_000_000).contains(&self.monitor.period_us) {
            errs.push(err("monitor.period_us", "must be 10..=1000000 µs"));
        }
        if !(-20..=19).contains(&self.monitor.nice) {
            errs.push(err(
                "monitor.nice",
                format!("must be -20..=19, got {}", self.monitor.nice),
            ));
        }
        for (i, b) in self.backends.iter().enumerate() {
            if let Some(r) = &b.region {
                if let Err(m) = farside_rmem::Target::parse(r) {
                    errs.push(err(format!("backend[{i}].region"), m));
                }
            }
        }
        if self.admission.enabled
            && (0..self.backends.len()).any(|i| self.configured_limit(i).is_none())
        {
            let m = self.admission.metric.name();
            let what = match self.admission.metric {
                Metric::Conns | Metric::Inflight => format!(
                    "metric `{m}` has no default limit: set it to the back-end's workers \
                         (Apache's MaxClients) plus the connections allowed to wait for them \
                         (e.g. {QUEUE_LIMIT_DEFAULT}); it is also the back-end's maxconn"
                ),
                _ => format!(
                    "metric `{m}` has no default limit (not a queue length): give one in \
                         its unit"
                ),
            };
            errs.push(err(
                "admission.limit",
                format!("{what} (admission.limit, --limit, a site limit or a back-end's limit=)"),
            ));
        }
        if !errs.is_empty() {
            return errs;
        }
        if let Err(e) = sites::validate(
            &self.sites,
            self.monitor.table.is_some() || self.backends.iter().all(|b| b.region.is_some()),
        ) {
            errs.push(e);
        }
        if let Err(e) = self.validate_reconf() {
            errs.push(e);
        }
        if let Err(e) = classes::validate(
            &self.classes,
            self.admission.enabled,
            self.admission.metric.name(),
            matches!(self.admission.metric, Metric::Delay | Metric::Inflight),
        ) {
            errs.push(e);
        }
        if self.admission.enabled && self.admission.metric != Metric::Inflight {
            if let Some(i) = self.backends.iter().position(|b| b.region.is_none()) {
                if self.monitor.table.is_none() {
                    errs.push(err(
                        format!("backend[{i}].region"),
                        format!(
                            "admission metric `{}` needs every back-end's load region \
                             (or use metric `inflight`)",
                            self.admission.metric.name()
                        ),
                    ));
                }
            }
        }
        errs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn full_config_parses_with_defaults() {
        let c = ProxyConfig::from_toml_str(
            r#"
            listen = "127.0.0.1:8000"
            [admission]
            enabled = true
            metric = "cpu"
            limit = 900000
            [[backend]]
            addr = "127.0.0.1:8081"
            region = "shm:/run/farside/a.region"
            "#,
        )
        .unwrap();
        assert_eq!(c.admission.metric, Metric::Cpu);
        assert_eq!(c.http.max_header_bytes, 16384);
        assert_eq!(c.monitor.period_us, 1000);
    }

    #[test]
    fn group_read_parses_and_an_ipv6_group_is_refused() {
        let c = ProxyConfig::from_toml_str(
            "listen = \"127.0.0.1:1\"\n[monitor]\ngroup_read = \"239.1.1.1:7000\"\n[[backend]]\naddr = \"127.0.0.1:2\"\n",
        )
        .unwrap();
        assert_eq!(
            c.monitor.group_read,
            Some("239.1.1.1:7000".parse().unwrap())
        );
        let o = c.monitor.options(Duration::ZERO).unwrap();
        assert_eq!(o.group, c.monitor.group_read);
        let e = ProxyConfig::from_toml_str(
            "listen = \"127.0.0.1:1\"\n[monitor]\ngroup_read = \"[ff02::1]:7000\"\n[[backend]]\naddr = \"127.0.0.1:2\"\n",
        )
        .unwrap_err();
        assert_eq!(e.key, "monitor.group_read");
    }

    #[test]
    fn monitor_rx_parses_and_a_bad_value_names_the_key() {
        let toml = |rx: &str| {
            format!("listen = \"127.0.0.1:1\"\n[monitor]\nrx = \"{rx}\"\n[[backend]]\naddr = \"127.0.0.1:2\"\n")
        };
        let c = ProxyConfig::from_toml_str(&toml("xsk:eth1")).unwrap();
        let o = c.monitor.options(Duration::ZERO).unwrap();
        assert_eq!(o.rx, farside_monitor::MonitorRx::Xsk("eth1".into()));
        let d = ProxyConfig::from_toml_str(&toml("udp")).unwrap();
        assert_eq!(
            d.monitor.options(Duration::ZERO).unwrap().rx,
            farside_monitor::MonitorRx::Udp
        );
        for bad in ["xsk:", "xdp:eth1"] {
            let e = ProxyConfig::from_toml_str(&toml(bad)).unwrap_err();
            assert_eq!(e.key, "monitor.rx", "{bad}");
        }
    }

    #[test]
    fn invalid_config_names_the_key() {
        let e = ProxyConfig::from_toml_str(
            "listen = \"127.0.0.1:1\"\n[http]\nheader_timeout_ms = 0\n[[backend]]\naddr = \"127.0.0.1:2\"\n",
        )
        .unwrap_err();
        assert_eq!(e.key, "http.header_timeout_ms");

        let e = ProxyConfig::from_toml_str("listen = \"127.0.0.1:1\"\n").unwrap_err();
        assert_eq!(e.key, "backend");

        let e = ProxyConfig::from_toml_str(
            "listen = \"127.0.0.1:1\"\n[[backend]]\naddr = \"127.0.0.1:2\"\nregion = \"ftp:x\"\n",
        )
        .unwrap_err();
        assert_eq!(e.key, "backend[0].region");

        let e = ProxyConfig::from_toml_str(
            "listen = \"127.0.0.1:1\"\nbusy_poll_us = 5000\n[[backend]]\naddr = \"127.0.0.1:2\"\n",
        )
        .unwrap_err();
        assert_eq!(e.key, "busy_poll_us");

        let e = ProxyConfig::from_toml_str(
            "listen = \"127.0.0.1:1\"\n[monitor]\nnice = -30\n[[backend]]\naddr = \"127.0.0.1:2\"\n",
        )
        .unwrap_err();
        assert_eq!(e.key, "monitor.nice");

        let e = ProxyConfig::from_toml_str(
            "listen = \"127.0.0.1:1\"\n[[backend]]\naddr = \"127.0.0.1:2\"\nmaxconn = 0\n",
        )
        .unwrap_err();
        assert_eq!(e.key, "backend[0].maxconn");

        for bad in [0, TARGET_DELAY_MS_MAX + 1] {
            let e = ProxyConfig::from_toml_str(&format!(
                "listen = \"127.0.0.1:1\"\n[admission]\nmetric = \"delay\"\ntarget_delay_ms = {bad}\n[[backend]]\naddr = \"127.0.0.1:2\"\nregion = \"shm:/x\"\n"
            ))
            .unwrap_err();
            assert_eq!(e.key, "admission.target_delay_ms");
        }

        let e = ProxyConfig::from_toml_str(
            "listen = \"127.0.0.1:1\"\n[http]\nrequest_body_timeout_ms = 0\n[[backend]]\naddr = \"127.0.0.1:2\"\n",
        )
        .unwrap_err();
        assert_eq!(e.key, "http.request_body_timeout_ms");

        let e = ProxyConfig::from_toml_str(
            "listen = \"127.0.0.1:1\"\n[http]\nbody_min_rate_bytes_per_s = 2000000000\n[[backend]]\naddr = \"127.0.0.1:2\"\n",
        )
        .unwrap_err();
        assert_eq!(e.key, "http.body_min_rate_bytes_per_s");

        let e = ProxyConfig::from_toml_str("listen = \"127.0.0.1:1\"\nbogus = 3\n").unwrap_err();
        assert!(e.msg.contains("bogus"), "{e}");
    }

    #[test]
    fn validation_reports_every_invalid_key() {
        let c = ProxyConfig::parse_toml_str(
            "listen = \"127.0.0.1:1\"\nworkers = 0\n[http]\nheader_timeout_ms = 0\n\
             [monitor]\nnice = 40\n[[backend]]\naddr = \"127.0.0.1:2\"\nregion = \"ftp:x\"\n",
        )
        .unwrap();
        let keys: Vec<String> = c.validation_errors().into_iter().map(|e| e.key).collect();
        assert_eq!(
            keys,
            [
                "workers",
                "http.header_timeout_ms",
                "monitor.nice",
                "backend[0].region"
            ]
        );
        assert_eq!(c.validate().unwrap_err().key, "workers", "the first one");
    }

    #[test]
    fn admission_defaults_follow_their_rules() {
        // `[admission] enabled = true` only: metric delay, its budget capped at
        // max_client_conns, target half the queue timeout.
        let base =
            "listen = \"127.0.0.1:1\"\n[[backend]]\naddr = \"127.0.0.1:2\"\nregion = \"shm:/x\"\n";
        let c =
            ProxyConfig::from_toml_str(&format!("{base}[admission]\nenabled = true\n")).unwrap();
        assert_eq!(c.admission.metric, Metric::Delay);
        assert_eq!(c.admission.limit, None);
        assert_eq!(c.limit_for(0), c.http.max_client_conns as u64);
        assert_eq!(c.maxconn_for(0), c.http.max_client_conns);
        assert_eq!(c.admission.target_delay_ms, None);
        assert_eq!(c.target_delay_ms(), c.http.queue_timeout_ms / 2);
        // The target follows the queue timeout, unless stated.
        let c = ProxyConfig::from_toml_str(&format!(
            "{base}[http]\nqueue_timeout_ms = 50\n[admission]\nenabled = true\n"
        ))
        .unwrap();
        assert_eq!(c.target_delay_ms(), 25);
        let c = ProxyConfig::from_toml_str(&format!(
            "{base}[http]\nqueue_timeout_ms = 50\n[admission]\nenabled = true\ntarget_delay_ms = 7\n"
        ))
        .unwrap();
        assert_eq!(c.target_delay_ms(), 7);
        assert_eq!(target_delay_rule(0), 1, "never 0");
        assert_eq!(target_delay_rule(3_600_000), TARGET_DELAY_MS_MAX);
        let c = ProxyConfig::from_toml_str(&format!(
            "{base}[admission]\nenabled = true\nmetric = \"backlog\"\n"
        ))
        .unwrap();
        assert_eq!(c.limit_for(0), QUEUE_LIMIT_DEFAULT);
        assert_eq!(c.common_limit(), Some(QUEUE_LIMIT_DEFAULT));
        let c = ProxyConfig::from_toml_str(&format!(
            "{base}[admission]\nenabled = true\nmetric = \"pending\"\n"
        ))
        .unwrap();
        assert_eq!(c.limit_for(0), QUEUE_LIMIT_DEFAULT);
        let c = ProxyConfig::from_toml_str(&format!(
            "{base}[admission]\nenabled = true\nmetric = \"delay\"\n"
        ))
        .unwrap();
        assert_eq!(c.limit_for(0), c.http.max_client_conns as u64);
        // No magic limit for the metrics whose limit is the back-end's capacity.
        for m in ["conns", "inflight", "cpu", "pressure", "runnable"] {
            let e = ProxyConfig::from_toml_str(&format!(
                "{base}[admission]\nenabled = true\nmetric = \"{m}\"\n"
            ))
            .unwrap_err();
            assert_eq!(e.key, "admission.limit", "{m}: {e}");
            assert!(e.msg.contains("no default limit"), "{m}: {e}");
        }
        let e = ProxyConfig::from_toml_str(&format!(
            "{base}[admission]\nenabled = true\nmetric = \"conns\"\n"
        ))
        .unwrap_err();
        assert!(e.msg.contains("workers"), "{e}");
        // A back-end's own limit is enough; admission off needs none.
        ProxyConfig::from_toml_str(&format!(
            "{base}limit = 18\n[admission]\nenabled = true\nmetric = \"conns\"\n"
        ))
        .unwrap();
        ProxyConfig::from_toml_str(&format!("{base}[admission]\nmetric = \"conns\"\n")).unwrap();
    }

    #[test]
    fn maxconn_follows_the_stated_rule() {
        let c = ProxyConfig::from_toml_str(
            r#"
            listen = "127.0.0.1:8000"
            [admission]
            enabled = true
            metric = "conns"
            limit = 40
            [[backend]]
            addr = "127.0.0.1:8081"
            region = "shm:/run/farside/a.region"
            [[backend]]
            addr = "127.0.0.1:8082"
            region = "shm:/run/farside/b.region"
            limit = 7
            [[backend]]
            addr = "127.0.0.1:8083"
            region = "shm:/run/farside/c.region"
            maxconn = 3
            "#,
        )
        .unwrap();
        assert_eq!(c.maxconn_for(0), 40, "conns: the back-end's limit");
        assert_eq!(c.maxconn_for(1), 7, "its own limit");
        assert_eq!(c.maxconn_for(2), 3, "explicit maxconn wins");
        let mut c = c;
        c.admission.metric = Metric::Backlog;
        assert_eq!(c.maxconn_for(0), c.http.max_client_conns);
        c.http.maxconn_per_backend = Some(16);
        assert_eq!(c.maxconn_for(0), 16);
        assert_eq!(c.maxconn_for(2), 3);
    }
}
