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
//! - **RDMA** (`--rdma MODE`, seed 004): closed-loop clients that ask for their
//!   bodies with the `RDMA:` header, each keeping one HTTP and one RDMA connection,
//!   every body checked against its file; its own summary ([`rdma`]).
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
//! | `failure_kinds.{timeouts,connect_errors,connect_timeouts,io_errors,malformed,status_5xx,overflow}` | requests | failures by kind (`connect_timeouts`: attempts abandoned at `--connect-timeout-ms`) |
//! | `failure_kinds.wrong_bodies` | requests | `--check-root`: 200s whose body's CRC32c differs from the file's (written only when not 0) |
//! | `shed_by_client` | requests | open-loop arrivals shed at `--open-users-max` |
//! | `inflight_at_end` | requests | in flight when the run ended (in no other count) |
//! | `source_ports` | | `--source-ports`: `kernel` or `random` |
//! | `source_port_fallbacks` | connections | `random`: all `SOURCE_PORT_ATTEMPTS` drawn ports busy, the kernel chose |
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
pub use client::{PortPicker, SOURCE_PORT_ATTEMPTS};
pub mod policy;
pub mod rdma;
mod run;
pub mod summary;
pub mod trace;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

pub use policy::{backoff_delay, ArrivalGen, Arrivals, OnReject};
pub use run::{print_summary, run, run_cli};
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
    /// Open loop: most users active at once (World Cup replay: requests in
    /// flight); arrivals beyond are shed by the client and counted
    /// (shed_by_client). Default: 10000.
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
    /// Abandon a TCP connection attempt not established within this many ms
    /// (a `connect_timeouts` failure); 0: connect under `--timeout-ms` only.
    /// Below Linux's initial SYN retransmission timeout (1 s) a dropped SYN is
    /// never sent again, so a server's drops do not come back as extra
    /// arrivals: the S-Client of Banga and Druschel (USITS '97, T = 500 ms),
    /// whose offered rate does not depend on the server. Default: 0.
    #[arg(long = "connect-timeout-ms", default_value_t = 0)]
    pub connect_timeout_ms: u64,
    /// Source port of each connection: `kernel` (the host's choice) or `random`
    /// (uniform over the host's ephemeral range, as if each connection came from a
    /// client host of its own). Linux reuses a host's freed ports within seconds, so
    /// one client host's ports follow the fate of its earlier connections, and a
    /// front-end that hashes the 4-tuple sends a reused port where its last
    /// connection went. Default: kernel.
    #[arg(long = "source-ports", value_enum, default_value_t = SourcePorts::Kernel)]
    pub source_ports: SourcePorts,
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
    /// Check every 200 response's body: its CRC32c must equal that of the file the
    /// request names under DIR (the directory the server serves, or a copy: the World
    /// Cup and Zipf docroot paths, `--paths docroot`); a body that differs is a failure
    /// of kind wrong_bodies. Default: bodies are counted, not checked.
    #[arg(long = "check-root", value_name = "DIR")]
    pub check_root: Option<PathBuf>,
    /// `--rdma` and its flags: load with the `RDMA:` header ([`rdma`]).
    #[command(flatten)]
    pub rdma: rdma::RdmaLoadArgs,
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
            connect_timeout_ms: 0,
            source_ports: SourcePorts::Kernel,
            qos_ms: 1000,
            seed: 1,
            out: None,
            json: false,
            quiet: false,
            threads: 1,
            check_root: None,
            rdma: rdma::RdmaLoadArgs::default(),
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
        if self.connect_timeout_ms >= self.timeout_ms {
            return bad(format!(
                "--connect-timeout-ms ({}) must be below --timeout-ms ({}), or 0 (off)",
                self.connect_timeout_ms, self.timeout_ms
            ));
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
        if self.rdma.rdma.is_some() {
            return bad("--rdma runs its own clients: rdma::run (farside loadgen calls it)".into());
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
/// `--source-ports`: who chooses each connection's source port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SourcePorts {
    /// The host's kernel (`connect` without `bind`).
    Kernel,
    /// Uniform over the ephemeral range ([`PortPicker`]).
    Random,
}

impl SourcePorts {
    pub fn as_str(self) -> &'static str {
        match self {
            SourcePorts::Kernel => "kernel",
            SourcePorts::Random => "random",
        }
    }
}

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
    /// TCP connect not established within `--connect-timeout-ms`: abandoned.
    ConnectTimeout,
    /// Reset or EOF mid-exchange.
    Io,
    /// Unparsable or unframeable response.
    Malformed,
    /// A 5xx other than 503.
    Status5xx,
    /// Open loop only: `--open-users-max` users already active; not sent.
    Overflow,
    /// `--check-root`: a 200 whose body is not the file's.
    WrongBody,
}

impl Outcome {
    /// The name used in `--out` records.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::Dropped => "dropped",
            Outcome::Timeout => "timeout",
            Outcome::Connect => "connect",
            Outcome::ConnectTimeout => "connect_timeout",
            Outcome::Io => "io",
            Outcome::Malformed => "malformed",
            Outcome::Status5xx => "5xx",
            Outcome::Overflow => "overflow",
            Outcome::WrongBody => "wrong_body",
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
