//! farside's HTTP load generator, like the clients of the admission-control
//! paper (seed 000, section IV).
//!
//! - Closed loop (default): `--clients` clients, each sends a request, waits
//!   for the full response (or the `--timeout-ms`), thinks `--think-ms`, and
//!   repeats. Open loop: `--rate` requests per second regardless of replies.
//! - Traces: single 16 KiB file, Zipf (alpha 0.9), World Cup 1998 (see
//!   [`trace`]).
//! - Keep-alive is on by default: Apache 2.2 ships with `KeepAlive On` and
//!   HTTP/1.1 clients reuse connections, so a client occupies one prefork
//!   worker for as long as it keeps sending, which is what makes the paper's
//!   back-ends overload near MaxClients clients. `--no-keepalive` opens one
//!   connection per request instead.
//! - Outcomes: a complete non-5xx response is *served*; 503 is *dropped*
//!   (admission control said no); connect errors, resets, malformed
//!   responses, timeouts and other 5xx are *failures*.
//! - A warm-up (`--warmup-s`) precedes the measured `--duration-s`; requests
//!   started during warm-up are not counted. Requests still in flight when
//!   the run ends are abandoned and not counted (as wrk does).
//!
//! [`run`] returns a [`Summary`] (serde-serialisable, stable keys) with a
//! one-second [`SecondStats`] series for the paper's Fig. 6/7-style plots.

mod client;
pub mod trace;

use std::fmt;
use std::io::{self, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use client::{Conn, Failure};
pub use trace::{
    find_data_file, write_docroot, zipf_file_bytes, DocrootReport, PathMode, Rng, Trace, TraceKind,
    WorldCupTrace, ZipfSampler,
};

/// Most concurrent clients (closed loop) or requests in flight (open loop).
/// Each holds a socket and a 32 KiB read buffer: 10,000 ≈ 320 MiB worst case.
pub const CLIENTS_MAX: usize = 10_000;
/// Most per-request records kept for percentiles and `--out` (≈ 40 B each,
/// so ≈ 200 MB at the cap). Counts and the series stay exact beyond it.
pub const RECORDS_MAX: usize = 5_000_000;
/// Longest run (warm-up + measured), seconds: bounds the series table.
pub const DURATION_S_MAX: f64 = 86_400.0;
/// Highest open-loop rate, requests/s.
pub const RATE_MAX: f64 = 1_000_000.0;
/// Pause after a failed connect before the same client tries again, so a
/// refused port does not turn a client into a busy loop.
pub const CONNECT_RETRY_BACKOFF: Duration = Duration::from_millis(10);
/// Most runtime worker threads.
pub const THREADS_MAX: usize = 64;

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
    /// Think time after a 503 (a client that honours `Retry-After`-style back-off), ms.
    /// Default: the same as --think-ms.
    #[arg(long = "reject-think-ms")]
    pub reject_think_ms: Option<u64>,
    /// Open-loop rate, requests/s; turns the closed loop off. Default: none.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Measured duration, s (after warm-up). Default: 10.
    #[arg(long = "duration-s", default_value_t = 10.0)]
    pub duration_s: f64,
    /// Stop after this many measured requests. Default: no limit.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Warm-up before measuring, s; its requests are not counted. Default: 1.
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
    /// Seed of the workload samplers. Default: 1.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write per-request records as CSV (start_us,latency_us,status,bytes,
    /// outcome; start_us counted from the end of warm-up). Default: none.
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
            reject_think_ms: None,
            rate: None,
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

    /// Builds the workload these flags describe (loads the World Cup file).
    pub fn build_trace(&self) -> Result<Trace, LoadgenError> {
        Ok(match self.trace {
            TraceKind::Single => Trace::single(&self.file_path),
            TraceKind::Zipf => Trace::zipf(self.zipf_files, self.zipf_alpha, self.paths),
            TraceKind::Worldcup => {
                let path = match &self.trace_file {
                    Some(p) => p.clone(),
                    None => find_data_file(trace::WORLDCUP_FILE)?,
                };
                Trace::worldcup(WorldCupTrace::load(&path)?, self.paths)
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
    /// Open loop only: `CLIENTS_MAX` requests already in flight.
    Overflow,
}

impl Outcome {
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
    /// Start time since the end of warm-up, µs.
    pub start_us: u64,
    pub latency_us: u64,
    /// HTTP status, 0 when none was received.
    pub status: u16,
    /// Body bytes received.
    pub bytes: u64,
    pub outcome: Outcome,
}

/// Failures by kind (they sum to `Summary::failures`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FailureCounts {
    pub timeouts: u64,
    pub connect_errors: u64,
    pub io_errors: u64,
    pub malformed: u64,
    pub status_5xx: u64,
    pub overflow: u64,
}

/// One second of the measured run, bucketed by completion time.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SecondStats {
    /// Seconds since the end of warm-up (bucket start).
    pub t_s: u64,
    pub served: u64,
    pub dropped_503: u64,
    pub failures: u64,
    /// Mean latency of the served requests of this second, ms (0 if none).
    pub avg_ms: f64,
    /// (dropped_503 + failures) / all requests of this second.
    pub drop_rate: f64,
}

/// Result of a run. Keys are stable: the lab's summary.json embeds them.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Summary {
    pub target: String,
    pub trace: String,
    /// "closed" or "open".
    pub mode: String,
    pub clients: usize,
    pub rate: Option<f64>,
    pub keepalive: bool,
    /// Requests started after warm-up and finished (served + dropped_503 + failures).
    pub attempts: u64,
    /// Full responses with status < 500.
    pub served: u64,
    pub dropped_503: u64,
    pub failures: u64,
    pub failure_kinds: FailureCounts,
    /// Latency of served requests, ms.
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Served requests per second of measured time.
    pub tps: f64,
    /// (dropped_503 + failures) / attempts.
    pub drop_rate: f64,
    /// Fraction of served requests slower than `qos_ms`.
    pub slow_rate: f64,
    pub qos_ms: u64,
    /// Measured time, s.
    pub duration_s: f64,
    /// Body bytes of served requests.
    pub bytes: u64,
    /// Records beyond `RECORDS_MAX` were not kept (percentiles use the kept ones).
    pub records_truncated: bool,
    /// World Cup rows skipped for bad fields.
    pub trace_rows_skipped: u64,
    pub series: Vec<SecondStats>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let load = match self.rate {
            Some(r) => format!("open loop {r} req/s"),
            None => format!("{} clients", self.clients),
        };
        writeln!(
            f,
            "loadgen {} trace={} {} keepalive={} measured {:.1}s",
            self.target, self.trace, load, self.keepalive, self.duration_s
        )?;
        writeln!(
            f,
            "  attempts {}  served {}  dropped(503) {}  failures {} (timeout {}, connect {}, io {}, malformed {}, 5xx {}, overflow {})",
            self.attempts,
            self.served,
            self.dropped_503,
            self.failures,
            self.failure_kinds.timeouts,
            self.failure_kinds.connect_errors,
            self.failure_kinds.io_errors,
            self.failure_kinds.malformed,
            self.failure_kinds.status_5xx,
            self.failure_kinds.overflow
        )?;
        writeln!(
            f,
            "  latency ms: avg {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}",
            self.avg_ms, self.p50_ms, self.p90_ms, self.p99_ms, self.max_ms
        )?;
        write!(
            f,
            "  tps {:.1}  drop rate {:.4}  slow(>{}ms) {:.4}  bytes {}{}{}",
            self.tps,
            self.drop_rate,
            self.qos_ms,
            self.slow_rate,
            self.bytes,
            if self.records_truncated {
                "  (records truncated)"
            } else {
                ""
            },
            if self.trace_rows_skipped > 0 {
                format!("  trace rows skipped {}", self.trace_rows_skipped)
            } else {
                String::new()
            }
        )
    }
}

/// Live per-second counters (lock-free), indexed by completion second.
struct Slot {
    served: AtomicU64,
    dropped: AtomicU64,
    failures: AtomicU64,
    latency_sum_us: AtomicU64,
}

/// State shared by every client task.
struct Ctx {
    addr: SocketAddr,
    trace: Trace,
    request_get: Vec<Vec<u8>>,
    keepalive: bool,
    timeout: Duration,
    think: Duration,
    reject_think: Duration,
    seed: u64,
    run_start: Instant,
    measure_start: Instant,
    end: Instant,
    requests_max: Option<u64>,
    tickets: AtomicU64,
    /// Stop issuing requests (request budget exhausted).
    done: AtomicBool,
    records: Mutex<Vec<Record>>,
    records_truncated: AtomicBool,
    /// slots[0] is the whole warm-up; slots[1 + s] is measured second s.
    slots: Vec<Slot>,
    failure_kinds: [AtomicU64; 6],
    bytes: AtomicU64,
    inflight: AtomicUsize,
    last_completion_us: AtomicU64,
}

impl Ctx {
    fn note(&self, start: Instant, latency: Duration, status: u16, bytes: u64, outcome: Outcome) {
        let finish = start + latency;
        let measured = start >= self.measure_start;
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
            return;
        }
        let kind = match outcome {
            Outcome::Served | Outcome::Dropped => None,
            Outcome::Timeout => Some(0),
            Outcome::Connect => Some(1),
            Outcome::Io => Some(2),
            Outcome::Malformed => Some(3),
            Outcome::Status5xx => Some(4),
            Outcome::Overflow => Some(5),
        };
        if let Some(k) = kind {
            self.failure_kinds[k].fetch_add(1, Ordering::Relaxed);
        }
        if outcome == Outcome::Served {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        self.last_completion_us.fetch_max(
            finish.duration_since(self.measure_start).as_micros() as u64,
            Ordering::Relaxed,
        );
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if records.len() < RECORDS_MAX {
            records.push(Record {
                start_us: start.duration_since(self.measure_start).as_micros() as u64,
                latency_us,
                status,
                bytes,
                outcome,
            });
        } else {
            self.records_truncated.store(true, Ordering::Relaxed);
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
}

/// Performs one request with retry-once on a stale kept-alive connection.
/// Returns (status, body bytes, outcome).
async fn one_request(ctx: &Ctx, conn: &mut Option<Conn>, object: usize) -> (u16, u64, Outcome) {
    let request = &ctx.request_get[object];
    for attempt in 0..2 {
        let mut c = match conn.take() {
            Some(c) => c,
            None => match Conn::connect(ctx.addr).await {
                Ok(c) => c,
                Err(_) => return (0, 0, Outcome::Connect),
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
                return (reply.status, reply.body_bytes, outcome);
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
                return (0, 0, outcome);
            }
        }
    }
    (0, 0, Outcome::Io)
}

/// Runs one request under the timeout, records it; false if the run ended first.
async fn timed_request(ctx: &Ctx, conn: &mut Option<Conn>, object: usize) -> Option<Outcome> {
    let start = Instant::now();
    let result = tokio::select! {
        r = tokio::time::timeout(ctx.timeout, one_request(ctx, conn, object)) => r,
        // In flight at the end of the run: abandoned, not counted.
        _ = tokio::time::sleep_until(ctx.end) => return None,
    };
    let latency = start.elapsed();
    let (status, bytes, outcome) = match result {
        Ok(r) => r,
        Err(_) => {
            *conn = None;
            (0, 0, Outcome::Timeout)
        }
    };
    ctx.note(start, latency, status, bytes, outcome);
    Some(outcome)
}

async fn closed_client(ctx: Arc<Ctx>, id: u64) {
    let mut rng = Rng::new(ctx.seed ^ id.wrapping_mul(0xA076_1D64_78BD_642F));
    let mut conn: Option<Conn> = None;
    while ctx.may_start(Instant::now()) {
        let object = ctx.trace.next(&mut rng);
        let Some(outcome) = timed_request(&ctx, &mut conn, object).await else {
            return;
        };
        let pause = match outcome {
            Outcome::Connect => ctx.think.max(CONNECT_RETRY_BACKOFF),
            Outcome::Dropped => ctx.reject_think,
            _ => ctx.think,
        };
        if !pause.is_zero() {
            if Instant::now() + pause >= ctx.end {
                return;
            }
            tokio::time::sleep(pause).await;
        }
    }
}

async fn open_loop(ctx: Arc<Ctx>, rate: f64) {
    let interval = Duration::from_secs_f64(1.0 / rate);
    // Idle kept-alive connections shared by the requests.
    let pool: Arc<Mutex<Vec<Conn>>> = Arc::new(Mutex::new(Vec::new()));
    let mut rng = Rng::new(ctx.seed);
    let mut tasks = tokio::task::JoinSet::new();
    let mut k: u32 = 0;
    loop {
        let due = ctx.run_start + interval * k;
        k = k.saturating_add(1);
        tokio::time::sleep_until(due).await;
        while tasks.try_join_next().is_some() {}
        if !ctx.may_start(Instant::now()) {
            break;
        }
        let object = ctx.trace.next(&mut rng);
        if ctx.inflight.load(Ordering::Relaxed) >= CLIENTS_MAX {
            ctx.note(Instant::now(), Duration::ZERO, 0, 0, Outcome::Overflow);
            continue;
        }
        ctx.inflight.fetch_add(1, Ordering::Relaxed);
        let ctx2 = Arc::clone(&ctx);
        let pool = Arc::clone(&pool);
        tasks.spawn(async move {
            let mut conn = pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
            timed_request(&ctx2, &mut conn, object).await;
            if let Some(c) = conn {
                pool.lock().unwrap_or_else(|p| p.into_inner()).push(c);
            }
            ctx2.inflight.fetch_sub(1, Ordering::Relaxed);
        });
    }
    // Let in-flight requests finish until the end of the run.
    let _ = tokio::time::timeout_at(ctx.end, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
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

/// Runs the load described by `args` (building its own runtime) and returns
/// the summary; writes `--out` if given. Does not print the summary.
pub fn run(args: &LoadgenArgs) -> Result<Summary, LoadgenError> {
    args.validate()?;
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
    let request_get = trace
        .objects
        .iter()
        .map(|o| {
            format!(
                "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: farside-loadgen\r\n{}\r\n",
                o.target,
                if keepalive {
                    ""
                } else {
                    "Connection: close\r\n"
                }
            )
            .into_bytes()
        })
        .collect();
    let rows_skipped = trace.rows_skipped;
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
            keepalive,
            timeout: Duration::from_millis(args.timeout_ms),
            think: Duration::from_millis(args.think_ms),
            reject_think: Duration::from_millis(args.reject_think_ms.unwrap_or(args.think_ms)),
            seed: args.seed,
            run_start,
            measure_start,
            end,
            requests_max: args.requests,
            tickets: AtomicU64::new(0),
            done: AtomicBool::new(false),
            records: Mutex::new(Vec::with_capacity(records_hint)),
            records_truncated: AtomicBool::new(false),
            slots: (0..seconds + 2)
                .map(|_| Slot {
                    served: AtomicU64::new(0),
                    dropped: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                    latency_sum_us: AtomicU64::new(0),
                })
                .collect(),
            failure_kinds: Default::default(),
            bytes: AtomicU64::new(0),
            inflight: AtomicUsize::new(0),
            last_completion_us: AtomicU64::new(0),
        });
        let progress_task = (!args.quiet).then(|| tokio::spawn(progress(Arc::clone(&ctx))));
        match args.rate {
            Some(rate) => open_loop(Arc::clone(&ctx), rate).await,
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
    Ok(summary)
}

fn summarize(ctx: &Ctx, args: &LoadgenArgs) -> Result<Summary, LoadgenError> {
    let mut records = std::mem::take(&mut *ctx.records.lock().unwrap_or_else(|p| p.into_inner()));
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
    let attempts = served + dropped + failures;
    // Measured time: until the end, or until the last completion when a
    // --requests budget ended the run early.
    let duration_s = if !ctx.done.load(Ordering::Relaxed) {
        args.duration_s
    } else {
        (load(&ctx.last_completion_us) as f64 / 1e6).clamp(1e-6, args.duration_s)
    };
    let mut lat: Vec<u64> = records
        .iter()
        .filter(|r| r.outcome == Outcome::Served)
        .map(|r| r.latency_us)
        .collect();
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let rank = ((p / 100.0) * lat.len() as f64).ceil() as usize;
        lat[rank.clamp(1, lat.len()) - 1] as f64 / 1000.0
    };
    let qos_us = args.qos_ms * 1000;
    let slow = lat.iter().filter(|l| **l > qos_us).count();
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
    let k = |i: usize| load(&ctx.failure_kinds[i]);
    Ok(Summary {
        target: args.target.clone(),
        trace: String::new(),
        mode: if args.rate.is_some() {
            "open"
        } else {
            "closed"
        }
        .into(),
        clients: args.clients,
        rate: args.rate,
        keepalive: ctx.keepalive,
        attempts,
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
        avg_ms: ratio(latency_sum_us, served) / 1000.0,
        p50_ms: pct(50.0),
        p90_ms: pct(90.0),
        p99_ms: pct(99.0),
        max_ms: lat.last().map_or(0.0, |m| *m as f64 / 1000.0),
        tps: served as f64 / duration_s,
        drop_rate: ratio(dropped + failures, attempts),
        slow_rate: ratio(slow as u64, lat.len() as u64),
        qos_ms: args.qos_ms,
        duration_s,
        bytes: load(&ctx.bytes),
        records_truncated: ctx.records_truncated.load(Ordering::Relaxed),
        trace_rows_skipped: 0,
        series,
    })
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
