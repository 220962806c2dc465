//! farside's HTTP load generator, like the clients of the admission-control
//! paper (seed 000, section IV).
//!
//! # Load models
//! - **Closed loop** (default): `--clients` clients, each sends a request,
//!   waits for the full response (or the `--timeout-ms`), thinks `--think-ms`,
//!   and repeats. After a 503 it follows `--on-reject` ([`policy`]):
//!   `backoff` (default; full-jitter exponential back-off honouring
//!   `Retry-After`, capped by `--backoff-cap-ms`, added to the think time),
//!   `retry` (at once) or `leave` (the user gives up; a new user with a new
//!   connection takes its slot). The deprecated `--reject-think-ms` keeps its
//!   old meaning (a fixed pause, recorded as `on_reject = "fixed"`).
//! - **Open loop** (`--rate R`): independent users arrive at R per second,
//!   Poisson (exponential inter-arrivals drawn from `--seed`; `--arrivals
//!   uniform` for a fixed interval). Each user opens its own connection, sends
//!   a session of `--session-requests` requests (default 1, think time
//!   between them) and leaves; a user whose request is rejected (503) leaves
//!   at once, its remaining requests counted in `skipped_after_leave`. At most
//!   `--open-users-max` users are active; an arrival that finds the bound full
//!   is shed by the client (`shed_by_client`, a failure of kind `overflow`),
//!   never silently lost. With the World Cup trace the open loop replays the
//!   log's own timing instead (see [`trace`]): `--time-scale F` (trace seconds
//!   per replay second), or `--rate R` to pick the F whose average rate is R
//!   requests/s.
//! - Traces: single 16 KiB file, Zipf (alpha 0.9), World Cup 1998 (see
//!   [`trace`]).
//! - Keep-alive is on by default: Apache 2.2 ships with `KeepAlive On` and
//!   HTTP/1.1 clients reuse connections, so a client occupies one prefork
//!   worker for as long as it keeps sending, which is what makes the paper's
//!   back-ends overload near MaxClients clients. `--no-keepalive` opens one
//!   connection per request instead.
//!
//! # Accounting
//! - Outcomes: a complete non-5xx response is *served*; 503 is *dropped*
//!   (admission control said no); connect errors, resets, malformed
//!   responses, timeouts, other 5xx and arrivals shed by the client are
//!   *failures*.
//! - A warm-up (`--warmup-s`) precedes the measured `--duration-s` window. A
//!   request counts in the window in which it **completes**: TPS = served
//!   completions in the window / window length (a request started in the
//!   warm-up that completes in the window counts). Requests still in flight
//!   when the run ends are not counted but reported (`inflight_at_end`).
//! - Latency percentiles come from HdrHistograms (µs, 3 significant digits),
//!   serialised in the summary so repeats merge exactly ([`Summary::merge`]).
//!
//! # Summary keys
//! [`run`] returns a [`Summary`]; its serde keys are stable:
//!
//! | key | unit | meaning |
//! |---|---|---|
//! | `target`, `trace`, `mode` | | server, workload, `closed`/`open` |
//! | `clients` | users | closed-loop clients |
//! | `rate` | 1/s | open loop: offered arrivals (users/s; World Cup: requests/s) |
//! | `arrivals` | | `poisson`, `uniform`, `trace` (open loop) |
//! | `time_scale` | | World Cup open loop: trace time / replay time |
//! | `on_reject` | | `backoff`, `retry`, `leave`, `fixed` |
//! | `keepalive` | | connections reused |
//! | `runs` | | runs merged into this summary |
//! | `started` | requests | started in the window (incl. shed arrivals) |
//! | `attempts` | requests | completed in the window: served + dropped_503 + failures |
//! | `served`, `dropped_503`, `failures` | requests | completed in the window |
//! | `failure_kinds.{timeouts,connect_errors,io_errors,malformed,status_5xx,overflow}` | requests | failures by kind |
//! | `shed_by_client` | requests | open-loop arrivals shed at `--open-users-max` |
//! | `inflight_at_end` | requests | in flight when the run ended (in no other count) |
//! | `users_left` | users | users that left after a 503 (leave mode, open loop) |
//! | `skipped_after_leave` | requests | requests of left users never sent |
//! | `conditional_requests` | requests | `If-Modified-Since` GETs started in the window |
//! | `not_modified` | requests | 304s completed in the window (served) |
//! | `avg_ms`, `p50_ms`, `p90_ms`, `p99_ms`, `max_ms` | ms | latency of served requests |
//! | `reject_avg_ms`, `reject_p50_ms`, `reject_p99_ms`, `reject_max_ms` | ms | time to a 503 |
//! | `tps`, `goodput_rps` | 1/s | served completions / window |
//! | `offered_rps` | 1/s | started / window (offered attempts) |
//! | `completed_rps` | 1/s | attempts / window |
//! | `drop_rate` | ratio | (dropped_503 + failures) / attempts |
//! | `reject_rate` | ratio | dropped_503 / attempts |
//! | `slow`, `slow_rate` | requests, ratio | served slower than `qos_ms`; / served |
//! | `qos_ms` | ms | QoS threshold |
//! | `client_success_users` | users | users with a completion in the window |
//! | `client_success_min`, `client_success_avg`, `client_success_p10` | ratio | per-user served / completed |
//! | `client_success_pct_counts` | users | users per success percent 0..=100 |
//! | `duration_s` | s | measured time (summed when merged) |
//! | `bytes` | bytes | body bytes served |
//! | `records_truncated` | | `--out` stopped at `RECORDS_MAX` |
//! | `trace_rows_skipped`, `trace_start_row` | rows | World Cup rows skipped; first row replayed |
//! | `latency_hist_v2`, `reject_latency_hist_v2` | µs | base64 HdrHistogram V2-deflate |
//! | `series[].{t_s,served,dropped_503,failures,avg_ms,drop_rate}` | s, requests, ms, ratio | per second of completion |

mod client;
pub mod policy;
pub mod summary;
pub mod trace;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{self, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use client::{Conn, Failure};
pub use policy::{backoff_delay, ArrivalGen, Arrivals, OnReject};
use summary::{new_latency_hist, record_latency, ClientSuccess};
pub use summary::{FailureCounts, SecondStats, Summary};
pub use trace::{
    find_data_file, write_docroot, zipf_file_bytes, DocrootReport, PathMode, Pick, Rng, Trace,
    TraceKind, WorldCupTrace, ZipfSampler,
};

/// Most concurrent clients (closed loop) or active users (open loop).
/// Each holds a socket and a 32 KiB read buffer: 10,000 ≈ 320 MiB worst case.
pub const CLIENTS_MAX: usize = 10_000;
/// Most per-request records kept for `--out` (≈ 40 B each, so ≈ 200 MB at
/// the cap). Counts, histograms and the series stay exact beyond it.
pub const RECORDS_MAX: usize = 5_000_000;
/// Longest run (warm-up + measured), seconds: bounds the series table.
pub const DURATION_S_MAX: f64 = 86_400.0;
/// Highest open-loop rate, arrivals/s.
pub const RATE_MAX: f64 = 1_000_000.0;
/// Largest World Cup time scale (trace s per replay s): the day in < 0.1 s.
pub const TIME_SCALE_MAX: f64 = 1_000_000.0;
/// Most requests of one open-loop user's session.
pub const SESSION_REQUESTS_MAX: u32 = 10_000;
/// Most idle kept-alive connections held for World Cup trace clients between
/// their requests (open-loop replay); beyond it a connection is closed.
pub const REPLAY_IDLE_CONNS_MAX: usize = 1_000;
/// Pause after a failed connect before the same client tries again, so a
/// refused port does not turn a client into a busy loop.
pub const CONNECT_RETRY_BACKOFF: Duration = Duration::from_millis(10);
/// Most runtime worker threads.
pub const THREADS_MAX: usize = 64;
/// `If-Modified-Since` of conditional GETs: the eve of the World Cup log's
/// day. `write_docroot` stamps files with this time, so a server answering
/// `If-Modified-Since` exactly (nginx's default) returns 304.
pub const CONDITIONAL_DATE: &str = "Thu, 30 Apr 1998 00:00:00 GMT";

/// Command-line flags of `farside loadgen`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadgenArgs {
    /// Server address, HOST:PORT (resolved once at start). Required.
    #[arg(long)]
    pub target: String,
    /// Host header. Default: the --target string.
    #[arg(long)]
    pub host: Option<String>,
    /// Closed-loop clients. Default: 16.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Think time between a client's requests, ms. Default: 0.
    #[arg(long = "think-ms", default_value_t = 0)]
    pub think_ms: u64,
    /// Closed loop, after a 503: backoff (full-jitter exponential back-off
    /// honouring Retry-After, capped by --backoff-cap-ms), retry (at once) or
    /// leave (the user gives up; a new user on a new connection replaces it).
    /// Default: backoff.
    #[arg(long = "on-reject", value_enum)]
    pub on_reject: Option<OnReject>,
    /// Back-off ceiling after the first 503, ms; doubles with each further
    /// consecutive 503. Default: 50.
    #[arg(long = "backoff-base-ms", default_value_t = policy::BACKOFF_BASE_MS_DEFAULT)]
    pub backoff_base_ms: u64,
    /// Longest back-off (also caps Retry-After), ms, at most 60000. Default: 2000.
    #[arg(long = "backoff-cap-ms", default_value_t = policy::BACKOFF_CAP_MS_DEFAULT)]
    pub backoff_cap_ms: u64,
    /// DEPRECATED (use --on-reject): a fixed, unjittered pause after a 503,
    /// ms. Kept for old command lines; recorded as on_reject = "fixed".
    #[arg(long = "reject-think-ms", conflicts_with = "on_reject")]
    pub reject_think_ms: Option<u64>,
    /// Open loop: users arriving per second (World Cup: average requests/s of
    /// the timed replay); turns the closed loop off. Default: none.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open-loop arrival process: poisson (exponential gaps, seeded) or
    /// uniform (fixed interval). Default: poisson.
    #[arg(long, value_enum, default_value_t = Arrivals::Poisson)]
    pub arrivals: Arrivals,
    /// Open loop: requests per user session, on one connection, --think-ms
    /// apart; a 503 ends the session. Default: 1.
    #[arg(long = "session-requests", default_value_t = 1)]
    pub session_requests: u32,
    /// Open loop: most users active at once; arrivals beyond are shed by the
    /// client and counted (shed_by_client). Default: 10000.
    #[arg(long = "open-users-max", default_value_t = CLIENTS_MAX)]
    pub open_users_max: usize,
    /// World Cup open loop: replay the log's timing compressed by this factor
    /// (trace seconds per replay second; the sample averages 2.3 requests/s
    /// at 1). Default: derived from --rate.
    #[arg(long = "time-scale")]
    pub time_scale: Option<f64>,
    /// Measured duration, s (after warm-up). Default: 10.
    #[arg(long = "duration-s", default_value_t = 10.0)]
    pub duration_s: f64,
    /// Stop starting requests after this many have started in the measured
    /// window (those in flight complete). Default: no limit.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Warm-up before measuring, s; requests completing in it are not
    /// counted. Default: 1.
    #[arg(long = "warmup-s", default_value_t = 1.0)]
    pub warmup_s: f64,
    /// Workload. Default: single.
    #[arg(long, value_enum, default_value_t = TraceKind::Single)]
    pub trace: TraceKind,
    /// Path requested by the single-file trace. Default: /file16k.
    #[arg(long = "file-path", default_value = "/file16k")]
    pub file_path: String,
    /// Zipf exponent. Default: 0.9 (the paper's).
    #[arg(long = "zipf-alpha", default_value_t = 0.9)]
    pub zipf_alpha: f64,
    /// Number of files of the Zipf trace. Default: 1000.
    #[arg(long = "zipf-files", default_value_t = 1000)]
    pub zipf_files: usize,
    /// URL scheme of zipf/worldcup objects: generated (`/files/<bytes>/..`,
    /// served by farside-backend without docroot) or docroot (natural paths,
    /// see `write_docroot`). Default: generated.
    #[arg(long, value_enum, default_value_t = PathMode::Generated)]
    pub paths: PathMode,
    /// World Cup trace file. Default: `wc98-day6-sample.csv.gz` found in
    /// $FARSIDE_DATA, or `data/` above the current directory or executable.
    #[arg(long = "trace-file")]
    pub trace_file: Option<PathBuf>,
    /// Reuse connections (HTTP/1.1 keep-alive). This is the default.
    #[arg(long, conflicts_with = "no_keepalive")]
    pub keepalive: bool,
    /// One connection per request (sends `Connection: close`).
    #[arg(long = "no-keepalive")]
    pub no_keepalive: bool,
    /// Per-request timeout including connect, ms; a timeout is a failure.
    /// Default: 5000.
    #[arg(long = "timeout-ms", default_value_t = 5000)]
    pub timeout_ms: u64,
    /// QoS threshold: served requests slower than this count as slow, ms.
    /// Default: 1000 (the paper's Fig. 8/9).
    #[arg(long = "qos-ms", default_value_t = 1000)]
    pub qos_ms: u64,
    /// Seed of the workload samplers, arrivals, back-off jitter and the
    /// World Cup start row. Default: 1.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write per-request records as CSV (start_us,latency_us,status,bytes,
    /// outcome; start_us counted from the end of warm-up, negative for
    /// requests started in it). Default: none.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the summary as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// No per-second progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Runtime threads; 1 is a current-thread runtime. Default: 1.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

impl LoadgenArgs {
    /// Defaults for `target`, as the command line would give them.
    pub fn new(target: impl Into<String>) -> LoadgenArgs {
        LoadgenArgs {
            target: target.into(),
            host: None,
            clients: 16,
            think_ms: 0,
            on_reject: None,
            backoff_base_ms: policy::BACKOFF_BASE_MS_DEFAULT,
            backoff_cap_ms: policy::BACKOFF_CAP_MS_DEFAULT,
            reject_think_ms: None,
            rate: None,
            arrivals: Arrivals::Poisson,
            session_requests: 1,
            open_users_max: CLIENTS_MAX,
            time_scale: None,
            duration_s: 10.0,
            requests: None,
            warmup_s: 1.0,
            trace: TraceKind::Single,
            file_path: "/file16k".into(),
            zipf_alpha: 0.9,
            zipf_files: 1000,
            paths: PathMode::Generated,
            trace_file: None,
            keepalive: false,
            no_keepalive: false,
            timeout_ms: 5000,
            qos_ms: 1000,
            seed: 1,
            out: None,
            json: false,
            quiet: false,
            threads: 1,
        }
    }

    /// The closed-loop behaviour after a 503 these flags select.
    pub fn effective_on_reject(&self) -> OnReject {
        match (self.reject_think_ms, self.on_reject) {
            (Some(_), _) => OnReject::Fixed,
            (None, Some(o)) => o,
            (None, None) => OnReject::Backoff,
        }
    }

    /// Whether these flags select the open loop.
    pub fn is_open_loop(&self) -> bool {
        self.rate.is_some() || self.time_scale.is_some()
    }

    /// Checks every bound; the message names the offending flag.
    pub fn validate(&self) -> Result<(), LoadgenError> {
        let bad = |m: String| Err(LoadgenError::Args(m));
        if self.clients == 0 || self.clients > CLIENTS_MAX {
            return bad(format!("--clients must be in 1..={CLIENTS_MAX}"));
        }
        if let Some(rate) = self.rate {
            if !(rate > 0.0 && rate <= RATE_MAX) {
                return bad(format!("--rate must be in (0, {RATE_MAX}]"));
            }
        }
        if let Some(f) = self.time_scale {
            if self.trace != TraceKind::Worldcup {
                return bad("--time-scale applies to --trace worldcup only".into());
            }
            if !(f > 0.0 && f <= TIME_SCALE_MAX) {
                return bad(format!("--time-scale must be in (0, {TIME_SCALE_MAX}]"));
            }
        }
        if self.on_reject == Some(OnReject::Fixed) {
            return bad("--on-reject fixed is selected by --reject-think-ms (deprecated)".into());
        }
        if self.on_reject.is_some() && self.reject_think_ms.is_some() {
            return bad("--reject-think-ms (deprecated) and --on-reject exclude each other".into());
        }
        if self.backoff_cap_ms > policy::BACKOFF_CAP_MS_MAX {
            return bad(format!(
                "--backoff-cap-ms must be at most {}",
                policy::BACKOFF_CAP_MS_MAX
            ));
        }
        if self.session_requests == 0 || self.session_requests > SESSION_REQUESTS_MAX {
            return bad(format!(
                "--session-requests must be in 1..={SESSION_REQUESTS_MAX}"
            ));
        }
        if self.open_users_max == 0 || self.open_users_max > CLIENTS_MAX {
            return bad(format!("--open-users-max must be in 1..={CLIENTS_MAX}"));
        }
        let total = self.duration_s + self.warmup_s;
        if !(self.duration_s > 0.0 && self.warmup_s >= 0.0 && total <= DURATION_S_MAX) {
            return bad(format!(
                "--duration-s must be > 0, --warmup-s >= 0, together <= {DURATION_S_MAX}"
            ));
        }
        if self.timeout_ms == 0 {
            return bad("--timeout-ms must be at least 1".into());
        }
        if self.trace == TraceKind::Zipf
            && (self.zipf_files == 0 || self.zipf_files > trace::ZIPF_FILES_MAX)
        {
            return bad(format!(
                "--zipf-files must be in 1..={}",
                trace::ZIPF_FILES_MAX
            ));
        }
        if !(self.zipf_alpha.is_finite() && self.zipf_alpha >= 0.0) {
            return bad("--zipf-alpha must be >= 0".into());
        }
        if !self.file_path.starts_with('/') {
            return bad("--file-path must start with /".into());
        }
        if self.threads == 0 || self.threads > THREADS_MAX {
            return bad(format!("--threads must be in 1..={THREADS_MAX}"));
        }
        Ok(())
    }

    /// Builds the workload these flags describe (loads the World Cup file;
    /// its replay starts at a row drawn from `--seed`).
    pub fn build_trace(&self) -> Result<Trace, LoadgenError> {
        Ok(match self.trace {
            TraceKind::Single => Trace::single(&self.file_path),
            TraceKind::Zipf => Trace::zipf(self.zipf_files, self.zipf_alpha, self.paths),
            TraceKind::Worldcup => {
                let path = match &self.trace_file {
                    Some(p) => p.clone(),
                    None => find_data_file(trace::WORLDCUP_FILE)?,
                };
                Trace::worldcup(WorldCupTrace::load(&path)?, self.paths).seeded(self.seed)
            }
        })
    }
}

/// Everything that can stop a run from starting or finishing.
#[derive(Debug)]
pub enum LoadgenError {
    /// A flag is out of bounds.
    Args(String),
    /// `--target` does not resolve.
    Target(String),
    /// The trace file is missing or unusable.
    Trace(String),
    /// Runtime creation or `--out` writing failed.
    Io(io::Error),
}

impl fmt::Display for LoadgenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadgenError::Args(m) => write!(f, "invalid arguments: {m}"),
            LoadgenError::Target(m) => write!(f, "bad target: {m}"),
            LoadgenError::Trace(m) => write!(f, "trace: {m}"),
            LoadgenError::Io(e) => write!(f, "i/o: {e}"),
        }
    }
}

impl std::error::Error for LoadgenError {}

impl From<io::Error> for LoadgenError {
    fn from(e: io::Error) -> Self {
        LoadgenError::Io(e)
    }
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Full response with a status below 500.
    Served,
    /// 503: rejected by admission control.
    Dropped,
    /// No response within `--timeout-ms`.
    Timeout,
    /// TCP connect failed (refused, unreachable).
    Connect,
    /// Reset or EOF mid-exchange.
    Io,
    /// Unparsable or unframeable response.
    Malformed,
    /// A 5xx other than 503.
    Status5xx,
    /// Open loop only: `--open-users-max` users already active; not sent.
    Overflow,
}

impl Outcome {
    /// The name used in `--out` records.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::Dropped => "dropped",
            Outcome::Timeout => "timeout",
            Outcome::Connect => "connect",
            Outcome::Io => "io",
            Outcome::Malformed => "malformed",
            Outcome::Status5xx => "5xx",
            Outcome::Overflow => "overflow",
        }
    }
}

/// One request, as written to `--out`.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    /// Start time since the end of warm-up, µs (negative: started in warm-up).
    pub start_us: i64,
    pub latency_us: u64,
    /// HTTP status, 0 when none was received.
    pub status: u16,
    /// Body bytes received.
    pub bytes: u64,
    pub outcome: Outcome,
}

/// Live per-second counters (lock-free), indexed by completion second.
struct Slot {
    served: AtomicU64,
    dropped: AtomicU64,
    failures: AtomicU64,
    latency_sum_us: AtomicU64,
}

/// Per-request records and histograms of the measured window (one lock).
struct Recorded {
    records: Vec<Record>,
    latency: Histogram<u64>,
    reject_latency: Histogram<u64>,
    success: ClientSuccess,
}

/// Counters of the measured window besides the per-second slots.
#[derive(Default)]
struct Counters {
    started: AtomicU64,
    inflight_at_end: AtomicU64,
    users_left: AtomicU64,
    skipped_after_leave: AtomicU64,
    conditional: AtomicU64,
    not_modified: AtomicU64,
    slow: AtomicU64,
    reject_latency_sum_us: AtomicU64,
    bytes: AtomicU64,
    failure_kinds: [AtomicU64; 6],
}

/// State shared by every client task.
struct Ctx {
    addr: SocketAddr,
    trace: Trace,
    request_get: Vec<Vec<u8>>,
    /// Conditional GET per object (World Cup only, else empty).
    request_cond: Vec<Vec<u8>>,
    keepalive: bool,
    timeout: Duration,
    think: Duration,
    on_reject: OnReject,
    reject_think: Duration,
    backoff_base: Duration,
    backoff_cap: Duration,
    session_requests: u32,
    open_users_max: usize,
    qos_us: u64,
    seed: u64,
    run_start: Instant,
    measure_start: Instant,
    end: Instant,
    requests_max: Option<u64>,
    tickets: AtomicU64,
    /// Stop issuing requests (request budget exhausted).
    done: AtomicBool,
    recorded: Mutex<Recorded>,
    records_truncated: AtomicBool,
    /// slots[0] is the whole warm-up; slots[1 + s] is measured second s.
    slots: Vec<Slot>,
    counters: Counters,
    /// Open-loop users (or replayed requests) active now.
    inflight: AtomicUsize,
    last_completion_us: AtomicU64,
}

/// How one sent request ended, for the client that sent it.
#[derive(Debug, Clone, Copy)]
struct Done {
    outcome: Outcome,
    retry_after: Option<Duration>,
    /// Completed in the measured window.
    measured: bool,
}

/// One user's completions in the measured window (per-user success rate).
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    served: u64,
    completed: u64,
}

impl Tally {
    fn add(&mut self, d: &Done) {
        if d.measured {
            self.completed += 1;
            if d.outcome == Outcome::Served {
                self.served += 1;
            }
        }
    }
}

/// Decrements the open-loop active-user count when a user task ends,
/// however it ends.
struct ActiveUser(Arc<Ctx>);

impl Drop for ActiveUser {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Ctx {
    fn in_window(&self, t: Instant) -> bool {
        t >= self.measure_start && t < self.end
    }

    /// Counts a request that completed at `start + latency` in the slot of
    /// its completion second; only completions in the measured window enter
    /// the summary. Returns whether it was measured.
    fn note(
        &self,
        start: Instant,
        latency: Duration,
        status: u16,
        bytes: u64,
        outcome: Outcome,
    ) -> bool {
        let finish = start + latency;
        let measured = finish >= self.measure_start;
        let slot = if measured {
            let s = finish.duration_since(self.measure_start).as_secs() as usize;
            &self.slots[(1 + s).min(self.slots.len() - 1)]
        } else {
            &self.slots[0]
        };
        let latency_us = latency.as_micros() as u64;
        match outcome {
            Outcome::Served => {
                slot.served.fetch_add(1, Ordering::Relaxed);
                slot.latency_sum_us.fetch_add(latency_us, Ordering::Relaxed);
            }
            Outcome::Dropped => {
                slot.dropped.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                slot.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        if !measured {
            return false;
        }
        let c = &self.counters;
        let kind = match outcome {
            Outcome::Served => {
                c.bytes.fetch_add(bytes, Ordering::Relaxed);
                if latency_us > self.qos_us {
                    c.slow.fetch_add(1, Ordering::Relaxed);
                }
                if status == 304 {
                    c.not_modified.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
            Outcome::Dropped => {
                c.reject_latency_sum_us
                    .fetch_add(latency_us, Ordering::Relaxed);
                None
            }
            Outcome::Timeout => Some(0),
            Outcome::Connect => Some(1),
            Outcome::Io => Some(2),
            Outcome::Malformed => Some(3),
            Outcome::Status5xx => Some(4),
            Outcome::Overflow => Some(5),
        };
        if let Some(k) = kind {
            c.failure_kinds[k].fetch_add(1, Ordering::Relaxed);
        }
        self.last_completion_us.fetch_max(
            finish.duration_since(self.measure_start).as_micros() as u64,
            Ordering::Relaxed,
        );
        let start_us = if start >= self.measure_start {
            start.duration_since(self.measure_start).as_micros() as i64
        } else {
            -(self.measure_start.duration_since(start).as_micros() as i64)
        };
        let mut r = lock(&self.recorded);
        match outcome {
            Outcome::Served => record_latency(&mut r.latency, latency_us),
            Outcome::Dropped => record_latency(&mut r.reject_latency, latency_us),
            _ => {}
        }
        if r.records.len() < RECORDS_MAX {
            r.records.push(Record {
                start_us,
                latency_us,
                status,
                bytes,
                outcome,
            });
        } else {
            self.records_truncated.store(true, Ordering::Relaxed);
        }
        true
    }

    /// An open-loop arrival found `--open-users-max` users active: counted
    /// as started and as a failure of kind overflow, never sent.
    fn shed(&self, now: Instant) {
        if self.in_window(now) {
            self.counters.started.fetch_add(1, Ordering::Relaxed);
        }
        self.note(now, Duration::ZERO, 0, 0, Outcome::Overflow);
    }

    /// A user's end: its measured completions enter the success distribution.
    fn user_done(&self, t: Tally) {
        if t.completed > 0 {
            lock(&self.recorded).success.add_user(t.served, t.completed);
        }
    }

    /// A user left after a 503, leaving `skipped` requests unsent.
    fn user_left(&self, skipped: u64) {
        if Instant::now() >= self.measure_start {
            self.counters.users_left.fetch_add(1, Ordering::Relaxed);
            self.counters
                .skipped_after_leave
                .fetch_add(skipped, Ordering::Relaxed);
        }
    }

    /// Whether another request may start now (and takes a ticket for it).
    fn may_start(&self, now: Instant) -> bool {
        if now >= self.end || self.done.load(Ordering::Relaxed) {
            return false;
        }
        if let (Some(max), true) = (self.requests_max, now >= self.measure_start) {
            if self.tickets.fetch_add(1, Ordering::Relaxed) >= max {
                self.done.store(true, Ordering::Relaxed);
                return false;
            }
        }
        true
    }

    /// Sleeps `pause`; false (without sleeping) if the run ends first.
    async fn pause(&self, pause: Duration) -> bool {
        if pause.is_zero() {
            return true;
        }
        if Instant::now() + pause >= self.end {
            return false;
        }
        tokio::time::sleep(pause).await;
        true
    }
}

/// Performs one request with retry-once on a stale kept-alive connection.
/// Returns (status, body bytes, outcome, Retry-After).
async fn one_request(
    ctx: &Ctx,
    conn: &mut Option<Conn>,
    pick: Pick,
) -> (u16, u64, Outcome, Option<Duration>) {
    let request = if pick.conditional && !ctx.request_cond.is_empty() {
        &ctx.request_cond[pick.object]
    } else {
        &ctx.request_get[pick.object]
    };
    for attempt in 0..2 {
        let mut c = match conn.take() {
            Some(c) => c,
            None => match Conn::connect(ctx.addr).await {
                Ok(c) => c,
                Err(_) => return (0, 0, Outcome::Connect, None),
            },
        };
        let was_reused = c.reused > 0;
        match c.exchange(request).await {
            Ok(reply) => {
                if ctx.keepalive && reply.reusable {
                    *conn = Some(c);
                }
                let outcome = match reply.status {
                    503 => Outcome::Dropped,
                    s if s >= 500 => Outcome::Status5xx,
                    _ => Outcome::Served,
                };
                return (reply.status, reply.body_bytes, outcome, reply.retry_after);
            }
            // The server closed an idle kept-alive connection before we
            // sent: retry once on a fresh one, as HTTP clients do.
            Err((Failure::Io, false)) if was_reused && attempt == 0 => continue,
            Err((f, _)) => {
                let outcome = match f {
                    Failure::Connect => Outcome::Connect,
                    Failure::Io => Outcome::Io,
                    Failure::Malformed => Outcome::Malformed,
                };
                return (0, 0, outcome, None);
            }
        }
    }
    (0, 0, Outcome::Io, None)
}

/// Runs one request under the timeout and counts it at its completion;
/// None if the run ended first (then it is counted in `inflight_at_end`).
async fn timed_request(ctx: &Ctx, conn: &mut Option<Conn>, pick: Pick) -> Option<Done> {
    let start = Instant::now();
    if ctx.in_window(start) {
        ctx.counters.started.fetch_add(1, Ordering::Relaxed);
        if pick.conditional && !ctx.request_cond.is_empty() {
            ctx.counters.conditional.fetch_add(1, Ordering::Relaxed);
        }
    }
    let result = tokio::select! {
        r = tokio::time::timeout(ctx.timeout, one_request(ctx, conn, pick)) => r,
        _ = tokio::time::sleep_until(ctx.end) => {
            *conn = None;
            ctx.counters.inflight_at_end.fetch_add(1, Ordering::Relaxed);
            return None;
        }
    };
    let latency = start.elapsed();
    let (status, bytes, outcome, retry_after) = match result {
        Ok(r) => r,
        Err(_) => {
            *conn = None;
            (0, 0, Outcome::Timeout, None)
        }
    };
    let measured = ctx.note(start, latency, status, bytes, outcome);
    Some(Done {
        outcome,
        retry_after,
        measured,
    })
}

/// A closed-loop client: one user after another in its slot (a new user
/// after `leave` or, World Cup, when its trace session ends).
async fn closed_client(ctx: Arc<Ctx>, id: u64) {
    let mut rng = Rng::new(ctx.seed ^ id.wrapping_mul(0xA076_1D64_78BD_642F));
    let mut conn: Option<Conn> = None;
    let mut session = ctx.trace.new_session();
    let mut tally = Tally::default();
    // Consecutive 503s of this client (back-off exponent).
    let mut rejections: u32 = 0;
    loop {
        let Some(pick) = ctx.trace.next_in(&mut session, &mut rng) else {
            // The trace client's session is over: a new user.
            ctx.user_done(std::mem::take(&mut tally));
            conn = None;
            session = ctx.trace.new_session();
            rejections = 0;
            continue;
        };
        if !ctx.may_start(Instant::now()) {
            break;
        }
        let Some(done) = timed_request(&ctx, &mut conn, pick).await else {
            break;
        };
        tally.add(&done);
        let pause = match done.outcome {
            Outcome::Connect => ctx.think.max(CONNECT_RETRY_BACKOFF),
            Outcome::Dropped => match ctx.on_reject {
                OnReject::Backoff => {
                    let d = backoff_delay(
                        rejections,
                        done.retry_after,
                        ctx.backoff_base,
                        ctx.backoff_cap,
                        &mut rng,
                    );
                    rejections = rejections.saturating_add(1);
                    ctx.think + d
                }
                OnReject::Retry => ctx.think,
                OnReject::Leave => {
                    ctx.user_left(0);
                    ctx.user_done(std::mem::take(&mut tally));
                    conn = None;
                    session = ctx.trace.new_session();
                    rejections = 0;
                    ctx.think
                }
                OnReject::Fixed => ctx.reject_think,
            },
            _ => {
                rejections = 0;
                ctx.think
            }
        };
        if !ctx.pause(pause).await {
            break;
        }
    }
    ctx.user_done(tally);
}

/// Open loop: users arrive by `--arrivals` at `rate` per second.
async fn open_loop(ctx: Arc<Ctx>, rate: f64, arrivals: Arrivals) {
    let mut gen = ArrivalGen::new(arrivals, rate, ctx.seed);
    let mut tasks = tokio::task::JoinSet::new();
    let mut due = ctx.run_start;
    let mut user: u64 = 0;
    loop {
        due += Duration::from_secs_f64(gen.next_gap_s());
        if due >= ctx.end {
            break;
        }
        tokio::time::sleep_until(due).await;
        while tasks.try_join_next().is_some() {}
        let now = Instant::now();
        if !ctx.may_start(now) {
            break;
        }
        if ctx.inflight.load(Ordering::Relaxed) >= ctx.open_users_max {
            ctx.shed(now);
            continue;
        }
        ctx.inflight.fetch_add(1, Ordering::Relaxed);
        user += 1;
        tasks.spawn(open_user(Arc::clone(&ctx), user));
    }
    // Users stop by themselves at the end of the run.
    while tasks.join_next().await.is_some() {}
}

/// One open-loop user: a session of `--session-requests` on its own
/// connection; a 503 ends it.
async fn open_user(ctx: Arc<Ctx>, id: u64) {
    let active = ActiveUser(Arc::clone(&ctx));
    let mut rng = Rng::new(ctx.seed ^ id.wrapping_mul(0xE703_7ED1_A0B4_28DB));
    let mut session = ctx.trace.new_session();
    let mut conn: Option<Conn> = None;
    let mut tally = Tally::default();
    let n = ctx.session_requests;
    let mut last = Outcome::Served;
    for i in 0..n {
        if i > 0 {
            let pause = match last {
                Outcome::Connect => ctx.think.max(CONNECT_RETRY_BACKOFF),
                _ => ctx.think,
            };
            if !ctx.pause(pause).await || !ctx.may_start(Instant::now()) {
                break;
            }
        }
        let Some(pick) = ctx.trace.next_in(&mut session, &mut rng) else {
            break;
        };
        let Some(done) = timed_request(&ctx, &mut conn, pick).await else {
            break;
        };
        tally.add(&done);
        last = done.outcome;
        if done.outcome == Outcome::Dropped {
            ctx.user_left(u64::from(n - i - 1));
            break;
        }
    }
    ctx.user_done(tally);
    drop(active);
}

/// Open-loop World Cup replay state shared by the row tasks.
#[derive(Default)]
struct ReplayState {
    /// Idle kept-alive connection of each trace client (at most
    /// `REPLAY_IDLE_CONNS_MAX`).
    idle: HashMap<u32, Conn>,
    /// Trace clients that left after a 503: their later rows are skipped.
    left: HashSet<u32>,
    /// Per trace client completions in the window.
    tally: HashMap<u32, Tally>,
}

/// Open loop, World Cup: every row at its logged time / `scale`, on its
/// trace client's connection.
async fn replay_open(ctx: Arc<Ctx>, scale: f64) {
    let state = Arc::new(Mutex::new(ReplayState::default()));
    let mut tasks = tokio::task::JoinSet::new();
    let mut k: u64 = 0;
    while let Some(row) = ctx.trace.replay_row(k) {
        k += 1;
        let due = ctx.run_start + Duration::from_secs_f64(row.offset_ms as f64 / 1000.0 / scale);
        if due >= ctx.end {
            break;
        }
        tokio::time::sleep_until(due).await;
        while tasks.try_join_next().is_some() {}
        let now = Instant::now();
        if !ctx.may_start(now) {
            break;
        }
        if lock(&state).left.contains(&row.client) {
            if now >= ctx.measure_start {
                ctx.counters
                    .skipped_after_leave
                    .fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        if ctx.inflight.load(Ordering::Relaxed) >= ctx.open_users_max {
            ctx.shed(now);
            continue;
        }
        ctx.inflight.fetch_add(1, Ordering::Relaxed);
        let (ctx2, state2) = (Arc::clone(&ctx), Arc::clone(&state));
        tasks.spawn(async move {
            let active = ActiveUser(Arc::clone(&ctx2));
            let mut conn = lock(&state2).idle.remove(&row.client);
            let done = timed_request(&ctx2, &mut conn, row.pick).await;
            let mut st = lock(&state2);
            if let Some(done) = done {
                st.tally.entry(row.client).or_default().add(&done);
                if done.outcome == Outcome::Dropped && st.left.insert(row.client) {
                    ctx2.user_left(0);
                }
            }
            if let Some(c) = conn {
                if st.idle.len() < REPLAY_IDLE_CONNS_MAX && !st.left.contains(&row.client) {
                    st.idle.entry(row.client).or_insert(c);
                }
            }
            drop(st);
            drop(active);
        });
    }
    while tasks.join_next().await.is_some() {}
    let tallies = std::mem::take(&mut lock(&state).tally);
    for t in tallies.into_values() {
        ctx.user_done(t);
    }
}

async fn progress(ctx: Arc<Ctx>) {
    let mut last = (0u64, 0u64, 0u64, 0u64);
    let mut second = 0u64;
    let mut tick = tokio::time::interval_at(
        ctx.run_start + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    loop {
        tick.tick().await;
        second += 1;
        let sum = |f: fn(&Slot) -> &AtomicU64| {
            ctx.slots
                .iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let now = (
            sum(|s| &s.served),
            sum(|s| &s.dropped),
            sum(|s| &s.failures),
            sum(|s| &s.latency_sum_us),
        );
        let served = now.0 - last.0;
        let avg_ms = if served > 0 {
            (now.3 - last.3) as f64 / served as f64 / 1000.0
        } else {
            0.0
        };
        let phase = if Instant::now() <= ctx.measure_start + Duration::from_millis(1) {
            " (warm-up)"
        } else {
            ""
        };
        eprintln!(
            "[loadgen] t={second}s served/s={served} dropped/s={} failed/s={} avg_ms={avg_ms:.2}{phase}",
            now.1 - last.1,
            now.2 - last.2
        );
        last = now;
    }
}

fn resolve(target: &str) -> Result<SocketAddr, LoadgenError> {
    target
        .to_socket_addrs()
        .map_err(|e| LoadgenError::Target(format!("{target}: {e}")))?
        .next()
        .ok_or_else(|| LoadgenError::Target(format!("{target}: no address")))
}

/// Raises the open-file soft limit to the hard limit (many clients, many sockets).
fn raise_nofile_limit() {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// The open-loop process these flags and this trace select:
/// (rate, arrivals name, World Cup time scale).
fn open_model(args: &LoadgenArgs, trace: &Trace) -> Option<(f64, &'static str, Option<f64>)> {
    if !args.is_open_loop() {
        return None;
    }
    match trace.replay_rate() {
        Some(trace_rate) => {
            let scale = args
                .time_scale
                .or_else(|| args.rate.map(|r| r / trace_rate))
                .unwrap_or(1.0);
            Some((trace_rate * scale, "trace", Some(scale)))
        }
        None => {
            let arrivals = match args.arrivals {
                Arrivals::Poisson => "poisson",
                Arrivals::Uniform => "uniform",
            };
            Some((args.rate.unwrap_or(1.0), arrivals, None))
        }
    }
}

/// Runs the load described by `args` (building its own runtime) and returns
/// the summary; writes `--out` if given. Does not print the summary.
pub fn run(args: &LoadgenArgs) -> Result<Summary, LoadgenError> {
    args.validate()?;
    if args.reject_think_ms.is_some() {
        log::warn!(
            "--reject-think-ms is deprecated: it pauses every rejected client for the same fixed time \
             (synchronised waves); use --on-reject backoff|retry|leave"
        );
    }
    let addr = resolve(&args.target)?;
    let trace = args.build_trace()?;
    let host = args.host.clone().unwrap_or_else(|| args.target.clone());
    let keepalive = !args.no_keepalive;
    raise_nofile_limit();
    let runtime = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()?
    };
    let request = |target: &str, conditional: bool| {
        format!(
            "GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: farside-loadgen\r\n{}{}\r\n",
            if conditional {
                format!("If-Modified-Since: {CONDITIONAL_DATE}\r\n")
            } else {
                String::new()
            },
            if keepalive {
                ""
            } else {
                "Connection: close\r\n"
            }
        )
        .into_bytes()
    };
    let request_get = trace
        .objects
        .iter()
        .map(|o| request(&o.target, false))
        .collect();
    let request_cond = if trace.kind == TraceKind::Worldcup {
        trace
            .objects
            .iter()
            .map(|o| request(&o.target, true))
            .collect()
    } else {
        Vec::new()
    };
    let open = open_model(args, &trace);
    let rows_skipped = trace.rows_skipped;
    let start_row = trace.start_row() as u64;
    let trace_name = format!("{:?}", trace.kind).to_lowercase();
    let seconds = args.duration_s.ceil() as usize;
    let summary = runtime.block_on(async {
        let run_start = Instant::now();
        let measure_start = run_start + Duration::from_secs_f64(args.warmup_s);
        let end = measure_start + Duration::from_secs_f64(args.duration_s);
        let records_hint = args.requests.unwrap_or(1 << 16).min(RECORDS_MAX as u64) as usize;
        let ctx = Arc::new(Ctx {
            addr,
            trace,
            request_get,
            request_cond,
            keepalive,
            timeout: Duration::from_millis(args.timeout_ms),
            think: Duration::from_millis(args.think_ms),
            on_reject: args.effective_on_reject(),
            reject_think: Duration::from_millis(args.reject_think_ms.unwrap_or(args.think_ms)),
            backoff_base: Duration::from_millis(args.backoff_base_ms),
            backoff_cap: Duration::from_millis(args.backoff_cap_ms),
            session_requests: args.session_requests,
            open_users_max: args.open_users_max,
            qos_us: args.qos_ms * 1000,
            seed: args.seed,
            run_start,
            measure_start,
            end,
            requests_max: args.requests,
            tickets: AtomicU64::new(0),
            done: AtomicBool::new(false),
            recorded: Mutex::new(Recorded {
                records: Vec::with_capacity(records_hint),
                latency: new_latency_hist(),
                reject_latency: new_latency_hist(),
                success: ClientSuccess::default(),
            }),
            records_truncated: AtomicBool::new(false),
            slots: (0..seconds + 2)
                .map(|_| Slot {
                    served: AtomicU64::new(0),
                    dropped: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                    latency_sum_us: AtomicU64::new(0),
                })
                .collect(),
            counters: Counters::default(),
            inflight: AtomicUsize::new(0),
            last_completion_us: AtomicU64::new(0),
        });
        let progress_task = (!args.quiet).then(|| tokio::spawn(progress(Arc::clone(&ctx))));
        match open {
            Some((_, _, Some(scale))) => replay_open(Arc::clone(&ctx), scale).await,
            Some((rate, _, None)) => open_loop(Arc::clone(&ctx), rate, args.arrivals).await,
            None => {
                let mut clients = tokio::task::JoinSet::new();
                for id in 0..args.clients {
                    clients.spawn(closed_client(Arc::clone(&ctx), id as u64));
                }
                while clients.join_next().await.is_some() {}
            }
        }
        if let Some(t) = progress_task {
            t.abort();
        }
        summarize(&ctx, args)
    });
    let mut summary = summary?;
    summary.trace = trace_name;
    summary.trace_rows_skipped = rows_skipped;
    summary.trace_start_row = start_row;
    if let Some((rate, arrivals, scale)) = open {
        summary.rate = Some(rate);
        summary.arrivals = Some(arrivals.into());
        summary.time_scale = scale;
    }
    Ok(summary)
}

fn summarize(ctx: &Ctx, args: &LoadgenArgs) -> Result<Summary, LoadgenError> {
    let recorded = std::mem::replace(
        &mut *lock(&ctx.recorded),
        Recorded {
            records: Vec::new(),
            latency: new_latency_hist(),
            reject_latency: new_latency_hist(),
            success: ClientSuccess::default(),
        },
    );
    let mut records = recorded.records;
    records.sort_by_key(|r| r.start_us);
    if let Some(path) = &args.out {
        let mut w = io::BufWriter::new(std::fs::File::create(path)?);
        writeln!(w, "start_us,latency_us,status,bytes,outcome")?;
        for r in &records {
            writeln!(
                w,
                "{},{},{},{},{}",
                r.start_us,
                r.latency_us,
                r.status,
                r.bytes,
                r.outcome.as_str()
            )?;
        }
        w.flush()?;
    }
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let measured_slots = &ctx.slots[1..];
    let served: u64 = measured_slots.iter().map(|s| load(&s.served)).sum();
    let dropped: u64 = measured_slots.iter().map(|s| load(&s.dropped)).sum();
    let failures: u64 = measured_slots.iter().map(|s| load(&s.failures)).sum();
    let latency_sum_us: u64 = measured_slots.iter().map(|s| load(&s.latency_sum_us)).sum();
    // Measured time: until the end, or until the last completion when a
    // --requests budget ended the run early.
    let duration_s = if !ctx.done.load(Ordering::Relaxed) {
        args.duration_s
    } else {
        (load(&ctx.last_completion_us) as f64 / 1e6).clamp(1e-6, args.duration_s)
    };
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let seconds = (duration_s.ceil() as usize).min(measured_slots.len());
    let series = measured_slots[..seconds]
        .iter()
        .enumerate()
        .map(|(t, s)| {
            let (sv, dr, fl) = (load(&s.served), load(&s.dropped), load(&s.failures));
            SecondStats {
                t_s: t as u64,
                served: sv,
                dropped_503: dr,
                failures: fl,
                avg_ms: ratio(load(&s.latency_sum_us), sv) / 1000.0,
                drop_rate: ratio(dr + fl, sv + dr + fl),
            }
        })
        .collect();
    let c = &ctx.counters;
    let k = |i: usize| load(&c.failure_kinds[i]);
    let mut summary = Summary {
        target: args.target.clone(),
        mode: if args.is_open_loop() {
            "open"
        } else {
            "closed"
        }
        .into(),
        clients: args.clients,
        on_reject: ctx.on_reject.as_str().into(),
        keepalive: ctx.keepalive,
        runs: 1,
        started: load(&c.started),
        attempts: served + dropped + failures,
        served,
        dropped_503: dropped,
        failures,
        failure_kinds: FailureCounts {
            timeouts: k(0),
            connect_errors: k(1),
            io_errors: k(2),
            malformed: k(3),
            status_5xx: k(4),
            overflow: k(5),
        },
        inflight_at_end: load(&c.inflight_at_end),
        users_left: load(&c.users_left),
        skipped_after_leave: load(&c.skipped_after_leave),
        conditional_requests: load(&c.conditional),
        not_modified: load(&c.not_modified),
        avg_ms: ratio(latency_sum_us, served) / 1000.0,
        reject_avg_ms: ratio(load(&c.reject_latency_sum_us), dropped) / 1000.0,
        slow: load(&c.slow),
        qos_ms: args.qos_ms,
        duration_s,
        bytes: load(&c.bytes),
        records_truncated: ctx.records_truncated.load(Ordering::Relaxed),
        series,
        ..Summary::default()
    };
    summary.derive(
        &recorded.latency,
        &recorded.reject_latency,
        &recorded.success,
    );
    Ok(summary)
}

/// Writes the human-readable summary (the `Display` form) and a newline.
pub fn print_summary<W: Write>(summary: &Summary, out: &mut W) -> io::Result<()> {
    writeln!(out, "{summary}")
}

/// The CLI entry: runs, then prints the summary (text or `--json`) to stdout.
pub fn run_cli(args: &LoadgenArgs) -> Result<Summary, LoadgenError> {
    let summary = run(args)?;
    let mut out = io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &summary).map_err(io::Error::other)?;
        writeln!(out)?;
    } else {
        print_summary(&summary, &mut out)?;
    }
    Ok(summary)
}
