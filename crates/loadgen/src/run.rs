//! The run: shared state, closed-loop clients, open-loop users, the World
//! Cup timed replay, and the summary of what completed in the window (see the
//! crate docs for the models and the accounting).

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::client::{Conn, Failure, PortPicker};
use crate::policy::{backoff_delay, ArrivalGen, Arrivals, OnReject};
use crate::summary::{
    new_latency_hist, record_latency, ClientSuccess, FailureCounts, SecondStats, Summary,
};
use crate::trace::{Pick, Rng, Trace, TraceKind};
use crate::{
    LoadgenArgs, LoadgenError, Outcome, Record, SourcePorts, CONDITIONAL_DATE,
    CONNECT_RETRY_BACKOFF, RECORDS_MAX, REPLAY_IDLE_CONNS_MAX,
};

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
    failure_kinds: [AtomicU64; 8],
}

/// State shared by every client task.
struct Ctx {
    addr: SocketAddr,
    trace: Trace,
    request_get: Vec<Vec<u8>>,
    /// Conditional GET per object (World Cup only, else empty).
    request_cond: Vec<Vec<u8>>,
    /// `--check-root`: each object's file CRC32c (None: its file is missing, so any
    /// 200 for it is wrong); empty when bodies are not checked.
    expected_crc: Vec<Option<u32>>,
    keepalive: bool,
    timeout: Duration,
    /// `--connect-timeout-ms` (None: 0, off).
    connect_timeout: Option<Duration>,
    /// `--source-ports random` (None: the kernel chooses).
    ports: Option<PortPicker>,
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
            Outcome::ConnectTimeout => Some(6),
            Outcome::WrongBody => Some(7),
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
            None => match Conn::connect(ctx.addr, ctx.connect_timeout, ctx.ports.as_ref()).await {
                Ok(mut c) => {
                    if !ctx.expected_crc.is_empty() {
                        c.check_bodies();
                    }
                    c
                }
                Err(f) => return (0, 0, outcome_of(f), None),
            },
        };
        let was_reused = c.reused > 0;
        match c.exchange(request).await {
            Ok(reply) => {
                if ctx.keepalive && reply.reusable {
                    *conn = Some(c);
                }
                let wrong = reply.status == 200
                    && !ctx.expected_crc.is_empty()
                    && reply.body_crc != ctx.expected_crc[pick.object];
                let outcome = match reply.status {
                    _ if wrong => Outcome::WrongBody,
                    503 => Outcome::Dropped,
                    s if s >= 500 => Outcome::Status5xx,
                    _ => Outcome::Served,
                };
                return (reply.status, reply.body_bytes, outcome, reply.retry_after);
            }
            // The server closed an idle kept-alive connection before we
            // sent: retry once on a fresh one, as HTTP clients do.
            Err((Failure::Io, false)) if was_reused && attempt == 0 => continue,
            Err((f, _)) => return (0, 0, outcome_of(f), None),
        }
    }
    (0, 0, Outcome::Io, None)
}

/// The request outcome of a failed connect or exchange.
fn outcome_of(f: Failure) -> Outcome {
    match f {
        Failure::Connect => Outcome::Connect,
        Failure::ConnectTimeout => Outcome::ConnectTimeout,
        Failure::Io => Outcome::Io,
        Failure::Malformed => Outcome::Malformed,
    }
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
    /// Bounded by the trace's clients (its rows: `WORLDCUP_ROWS_MAX`).
    left: HashSet<u32>,
    /// Per trace client completions in the window; same bound.
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

/// `--check-root DIR`: the CRC32c of each object's file under `dir` (None when it
/// cannot be read: every 200 for it is then wrong). Fails if no file can be read (a
/// wrong directory would make every response wrong).
fn expected_crcs(trace: &Trace, dir: &std::path::Path) -> Result<Vec<Option<u32>>, LoadgenError> {
    let crcs: Vec<Option<u32>> = trace
        .objects
        .iter()
        .map(|o| {
            std::fs::read(dir.join(&o.file))
                .ok()
                .map(|b| crc32c::crc32c(&b))
        })
        .collect();
    if crcs.iter().all(Option::is_none) {
        return Err(LoadgenError::Args(format!(
            "--check-root {}: none of the trace's files is there",
            dir.display()
        )));
    }
    Ok(crcs)
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
    let ports = match args.source_ports {
        SourcePorts::Kernel => None,
        SourcePorts::Random => Some(
            PortPicker::from_host(args.seed)
                .map_err(|e| LoadgenError::Args(format!("--source-ports random: {e}")))?,
        ),
    };
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
    let expected_crc = match &args.check_root {
        Some(dir) => expected_crcs(&trace, dir)?,
        None => Vec::new(),
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
            expected_crc,
            keepalive,
            timeout: Duration::from_millis(args.timeout_ms),
            connect_timeout: (args.connect_timeout_ms > 0)
                .then(|| Duration::from_millis(args.connect_timeout_ms)),
            ports,
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
            connect_timeouts: k(6),
            wrong_bodies: k(7),
        },
        inflight_at_end: load(&c.inflight_at_end),
        source_ports: args.source_ports.as_str().into(),
        source_port_fallbacks: ctx.ports.as_ref().map_or(0, |p| load(&p.fallbacks)),
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
