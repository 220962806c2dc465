//! Many connections migrated between network namespaces, every byte checked (issue
//! 12 Target: zero bytes lost or duplicated across ≥ 10,000 migrated connections).
//! The core of `examples/migrate_many.rs` and of the root test
//! `tests/migrate_many_root.rs`.
//!
//! Three namespaces ([`super::netns`]): client `c`, source back-end `a`, target
//! back-end `b`. The work runs in `concurrency` lanes; lane `k` has a client thread
//! in `c`, a source server on VIP:[`BASE_PORT`]+k in `a` and a [`Target`] in `b`,
//! and carries one connection at a time:
//!
//! 1. the client connects (receive buffer [`CLIENT_RCVBUF`]) and sends
//!    `POST /c/<id>?resp=<R>` with a body of `P` pattern bytes (sizes vary with the
//!    id, [`sizes`]); it reads nothing yet;
//! 2. the source reads the head, answers as much of the `R`-byte response as its
//!    fixed send buffer ([`SOURCE_SNDBUF`]) takes — for the larger `R` the send queue
//!    is full and bytes stay with the application — and waits until request bytes
//!    sit in its receive queue;
//! 3. it migrates with [`ControlPool::migrate_with`] (one pooled control connection
//!    per lane, reused across its connections; [`crate::Handover::CloseAfterRestore`]); the flow
//!    is moved between restore and close by one policy rule in `c` for this
//!    connection (`from C ipproto tcp sport S dport D lookup <table b>`, added over
//!    rtnetlink: [`super::rule`]), deleted by the client once the connection is
//!    closed: at most `concurrency` rules exist at a time, none at the end
//!    (counted: `flow_rules_left`);
//! 4. whoever holds the connection (the target, or the source after a fall-back)
//!    sends the rest of the response, reads the whole body checking every byte,
//!    and answers with its digest, length and mismatch count;
//! 5. the client, signalled once the migration is over, checks every response byte
//!    once and in order, the response's length, and the server's report against
//!    the digest of what it sent.
//!
//! Lost bytes are the ones a side expected and never got; bad bytes are the ones
//! that differ from the pattern at their offset (a duplicated or reordered byte is
//! one). CPU per migration is measured with `getrusage(RUSAGE_THREAD)` around
//! [`ControlPool::migrate_with`] on the source thread (the flow move's netlink request
//! included) and around [`Target::serve_next`] on the target thread.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::netns::{Netns, NetnsSpec, NsRef};
use super::rule::{FlowRule, RuleSock};
use super::session::read_head_unbuffered;
use super::{await_within, connect_with_rcvbuf, fill_pat, inq, set_int_opt, thread_cpu, Fnv};
use crate::proto::{ControlPool, Fallback, MigrateConfig, Outcome, Target};

/// First service port; lane `k` listens on `BASE_PORT + k` (one listener a lane, so
/// each lane's source accepts exactly its own client's connection).
pub const BASE_PORT: u16 = 9000;
/// Most lanes: each holds three threads and one connection of at most ~2 MiB of
/// buffers; more would only contend for this machine's two cores.
pub const CONCURRENCY_MAX: usize = 256;
/// Client receive buffer (doubled by the kernel): small, so that the source's send
/// queue fills and the larger responses cannot be sent before the freeze.
pub const CLIENT_RCVBUF: libc::c_int = 32 << 10;
/// Source send buffer (doubled by the kernel), fixed below the larger responses
/// (autotuning could take the whole response).
pub const SOURCE_SNDBUF: libc::c_int = 64 << 10;
/// The source migrates once `min(P, INQ_BEFORE_MIGRATE)` body bytes wait in its
/// receive queue, so every connection has a non-empty receive queue at the freeze.
pub const INQ_BEFORE_MIGRATE: usize = 16 << 10;
/// Priority of the per-flow rules in `c` (before the main table's 32766).
pub const RULE_PRIORITY: u32 = 1000;
/// Routing table in `c` that sends the VIP to back-end `b`.
pub const TABLE_B: u32 = 102;
/// Errors kept verbatim in the report (the rest are only counted).
pub const ERRORS_KEPT_MAX: usize = 20;

/// Response sizes, cycled by id (with up to 4 KiB of jitter): from below one segment
/// to well above the socket buffers.
const RESP_SIZES: [usize; 4] = [1_000, 30_000, 250_000, 1_000_000];
/// Request body sizes, cycled by id / 4 (with jitter), so all 16 pairs occur.
const POST_SIZES: [usize; 4] = [300, 20_000, 200_000, 800_000];

/// `(response bytes, request body bytes)` of connection `id`.
pub fn sizes(id: usize) -> (usize, usize) {
    let jitter = id.wrapping_mul(7919) % 4096;
    (
        RESP_SIZES[id % 4] + jitter,
        POST_SIZES[(id / 4) % 4] + (4095 - jitter),
    )
}

/// Jitter of [`small_sizes`]: both sizes stay well under one segment.
const SMALL_JITTER: usize = 256;

/// `(response bytes, request body bytes)` of connection `id` with
/// [`ManyConfig::small`]: the smallest pair of [`sizes`] (1,000 and 300 bytes) with
/// less jitter, so the state shipped is a few hundred bytes, as in `farside lab
/// speculative` (a connection migrated with its request, before its response):
/// the migration's fixed cost, not its bytes.
pub fn small_sizes(id: usize) -> (usize, usize) {
    let jitter = id.wrapping_mul(7919) % SMALL_JITTER;
    (
        RESP_SIZES[0] + jitter,
        POST_SIZES[0] + (SMALL_JITTER - 1 - jitter),
    )
}

fn seed_resp(id: usize) -> u64 {
    (id as u64) << 1
}

fn seed_post(id: usize) -> u64 {
    ((id as u64) << 1) | 1
}

/// What to run.
#[derive(Clone, Debug)]
pub struct ManyConfig {
    /// Connections to attempt.
    pub connections: usize,
    /// Lanes (connections in flight), 1..=[`CONCURRENCY_MAX`].
    pub concurrency: usize,
    /// Bound on each wait of one connection (connect, each read and write, the
    /// source's waits); a connection past it counts as failed.
    pub conn_timeout: Duration,
    /// No connection starts after this much time (the run then drains).
    pub deadline: Duration,
    /// Progress line on stderr every this many finished connections (0: none).
    pub progress_every: usize,
    /// Namespace name prefix (≤ 11 characters; not the lab's `fs…`).
    pub tag: String,
    /// Lab-sized connections ([`small_sizes`]) instead of [`sizes`]: measures a
    /// migration's fixed CPU cost (`migrate_many --small`).
    pub small: bool,
    /// Both sides speak the authenticated framing (wire version 3) under this key
    /// (`migrate_many --auth`: a fresh random key), each with its own
    /// [`crate::wire::Auth`]; `None`: unauthenticated. Measures what the
    /// authentication costs a migration.
    pub auth: Option<farside_auth::siphash::SipKey>,
    /// Set from outside (a signal handler) to stop starting connections.
    pub stop: Arc<AtomicBool>,
}

impl ManyConfig {
    /// `connections` with the defaults: 16 lanes, 30 s per wait, 1 h deadline,
    /// progress every 1,000, tag `mm<pid>`.
    pub fn new(connections: usize) -> Self {
        Self {
            connections,
            concurrency: 16,
            conn_timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(3600),
            progress_every: 1000,
            tag: format!("mm{}", std::process::id() % 100_000),
            small: false,
            auth: None,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    fn validate(&self) -> io::Result<()> {
        let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
        if self.connections == 0 {
            return bad("--connections must be at least 1".into());
        }
        if !(1..=CONCURRENCY_MAX).contains(&self.concurrency) {
            return bad(format!(
                "--concurrency must be 1..={CONCURRENCY_MAX}, got {}",
                self.concurrency
            ));
        }
        if self.tag.len() > 11 || self.tag.starts_with("fs") {
            return bad(format!("bad namespace tag {:?}", self.tag));
        }
        if self.conn_timeout.is_zero() || self.deadline.is_zero() {
            return bad("timeouts must be positive".into());
        }
        Ok(())
    }
}

/// Latency/size samples, reported as percentiles.
#[derive(Clone, Debug, Default)]
pub struct Samples(Vec<u64>);

impl Samples {
    fn push(&mut self, v: u64) {
        self.0.push(v);
    }
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Nearest-rank percentile `p` (0..=100); 0 without samples.
    pub fn pct(&self, p: u32) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        let mut v = self.0.clone();
        v.sort_unstable();
        let rank = (u64::from(p) * v.len() as u64).div_ceil(100).max(1) as usize;
        v[rank.min(v.len()) - 1]
    }
    /// Mean; 0 without samples.
    pub fn mean(&self) -> u64 {
        if self.0.is_empty() {
            0
        } else {
            self.0.iter().sum::<u64>() / self.0.len() as u64
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct ManyReport {
    /// Connections started by a client.
    pub attempted: u64,
    /// Connections the source migrated ([`Outcome::Migrated`]).
    pub migrated: u64,
    /// Connections that stayed on the source, by [`Fallback`] reason.
    pub resumed_on_source: BTreeMap<String, u64>,
    /// Connections the migration lost ([`Outcome::Lost`]).
    pub lost: u64,
    /// Connections whose client saw an error, a wrong byte or a short read.
    pub failed: u64,
    /// Bytes checked against the pattern and found right (response bytes by the
    /// client, request bytes by the server).
    pub bytes_checked: u64,
    /// Bytes a side expected and never got.
    pub bytes_lost: u64,
    /// Bytes that differ from the pattern at their offset (duplicated, reordered,
    /// corrupted), plus one for each digest that disagrees.
    pub bytes_bad: u64,
    /// Freeze to DONE (`Timings::total`), µs, of migrated connections.
    pub latency_us: Samples,
    /// Freeze and dump (`Timings::dump`), µs.
    pub dump_us: Samples,
    /// The flow move (one rule added over rtnetlink), µs.
    pub flow_move_us: Samples,
    /// Source thread CPU around `ControlPool::migrate_with`, µs (migrated connections).
    pub source_cpu_us: Samples,
    /// Target thread CPU around `serve_next`, µs (restored connections).
    pub target_cpu_us: Samples,
    /// State shipped (both queues), bytes.
    pub state_bytes: Samples,
    /// Per-flow rules still in `c` at the end (must be 0).
    pub flow_rules_left: u64,
    /// Control connections the sources opened (each lane keeps one in a
    /// [`ControlPool`]; more than one per lane means a target closed one).
    pub control_connections: u64,
    /// Wall time of the run.
    pub wall: Duration,
    /// The first [`ERRORS_KEPT_MAX`] errors.
    pub errors: Vec<String>,
}

impl ManyReport {
    fn error(&mut self, e: String) {
        if self.errors.len() < ERRORS_KEPT_MAX {
            self.errors.push(e);
        }
    }

    /// The report as one JSON object (`cfg` adds the run's parameters).
    pub fn to_json(&self, cfg: &ManyConfig) -> String {
        let pcts = |s: &Samples| Pcts {
            n: s.len(),
            p50: s.pct(50),
            p99: s.pct(99),
            max: s.pct(100),
            mean: s.mean(),
        };
        let json = ManyJson {
            connections_requested: cfg.connections,
            concurrency: cfg.concurrency,
            small: cfg.small,
            auth: cfg.auth.is_some(),
            conn_timeout_s: cfg.conn_timeout.as_secs(),
            deadline_s: cfg.deadline.as_secs(),
            handover: "CloseAfterRestore",
            flow_move: format!(
                "one policy rule per connection in the client namespace over rtnetlink \
                 (from client, tcp sport+dport, lookup table {TABLE_B}), deleted when the \
                 connection closes"
            ),
            attempted: self.attempted,
            migrated: self.migrated,
            resumed_on_source: &self.resumed_on_source,
            lost: self.lost,
            failed: self.failed,
            bytes_checked: self.bytes_checked,
            bytes_lost: self.bytes_lost,
            bytes_bad: self.bytes_bad,
            bytes_lost_or_duplicated: self.bytes_lost + self.bytes_bad,
            migration_latency_us: pcts(&self.latency_us),
            dump_us: pcts(&self.dump_us),
            flow_move_us: pcts(&self.flow_move_us),
            cpu_per_migration_source_us: pcts(&self.source_cpu_us),
            cpu_per_migration_target_us: pcts(&self.target_cpu_us),
            cpu_method: "getrusage(RUSAGE_THREAD) around ControlPool::migrate_with (source, \
                         the flow move included) and around Target::serve_next (target)",
            state_bytes: pcts(&self.state_bytes),
            flow_rules_left: self.flow_rules_left,
            control_connections: self.control_connections,
            wall_s: (self.wall.as_secs_f64() * 1000.0).round() / 1000.0,
            errors: &self.errors,
        };
        serde_json::to_string_pretty(&json).expect("a report of strings and numbers") + "\n"
    }
}

/// Percentiles of one sample set, as the report writes them.
#[derive(serde::Serialize)]
struct Pcts {
    n: usize,
    p50: u64,
    p99: u64,
    max: u64,
    mean: u64,
}

/// The report's JSON, in its field order.
#[derive(serde::Serialize)]
struct ManyJson<'a> {
    connections_requested: usize,
    concurrency: usize,
    small: bool,
    auth: bool,
    conn_timeout_s: u64,
    deadline_s: u64,
    handover: &'static str,
    flow_move: String,
    attempted: u64,
    migrated: u64,
    resumed_on_source: &'a BTreeMap<String, u64>,
    lost: u64,
    failed: u64,
    bytes_checked: u64,
    bytes_lost: u64,
    bytes_bad: u64,
    bytes_lost_or_duplicated: u64,
    migration_latency_us: Pcts,
    dump_us: Pcts,
    flow_move_us: Pcts,
    cpu_per_migration_source_us: Pcts,
    cpu_per_migration_target_us: Pcts,
    cpu_method: &'static str,
    state_bytes: Pcts,
    flow_rules_left: u64,
    control_connections: u64,
    wall_s: f64,
    errors: &'a [String],
}

fn fallback_name(f: &Fallback) -> &'static str {
    match f {
        Fallback::NotDumpable(_) => "not_dumpable",
        Fallback::TargetUnreachable(_) => "target_unreachable",
        Fallback::Refused(_) => "refused",
        Fallback::RestoreFailed(_) => "restore_failed",
        Fallback::TargetGone(_) => "target_gone",
        Fallback::FlowNotMoved(_) => "flow_not_moved",
    }
}

/// Shared by all lanes.
struct Shared {
    cfg: ManyConfig,
    /// The sources' authenticated framing (`ManyConfig::auth`).
    source_auth: Option<Arc<crate::wire::Auth>>,
    ns: NsRef,
    client_ip: Ipv4Addr,
    vip: Ipv4Addr,
    next_id: AtomicUsize,
    finished: AtomicUsize,
    t0: Instant,
    report: Mutex<ManyReport>,
}

impl Shared {
    /// The next connection id, or None once all are taken, the deadline passed or
    /// a stop was asked for.
    fn take_id(&self) -> Option<usize> {
        if self.cfg.stop.load(Ordering::Relaxed) || self.t0.elapsed() >= self.cfg.deadline {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        (id < self.cfg.connections).then_some(id)
    }

    fn rule(&self, sport: u16, dport: u16) -> FlowRule {
        FlowRule {
            priority: RULE_PRIORITY,
            from: self.client_ip,
            sport,
            dport,
            table: TABLE_B,
        }
    }

    fn with_report(&self, f: impl FnOnce(&mut ManyReport)) {
        f(&mut self.report.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// Runs the bench (root: netns, TCP_REPAIR). The namespaces are removed before it
/// returns, also on error or panic.
pub fn run(cfg: ManyConfig) -> io::Result<ManyReport> {
    cfg.validate()?;
    let spec = NetnsSpec {
        tag: cfg.tag.clone(),
        vip: Ipv4Addr::new(10, 79, 0, 100),
        client_ip: Ipv4Addr::new(10, 79, 9, 1),
        a_ip: Ipv4Addr::new(10, 79, 2, 1),
        b_ip: Ipv4Addr::new(10, 79, 2, 2),
        table_b: Some(TABLE_B),
    };
    let guard = Netns::setup(spec.clone())?;
    let shared = Arc::new(Shared {
        // One sealing identity for every source lane, as one specd has.
        source_auth: cfg.auth.map(|k| Arc::new(crate::wire::Auth::new(k))),
        cfg: cfg.clone(),
        ns: guard.r.clone(),
        client_ip: spec.client_ip,
        vip: spec.vip,
        next_id: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        t0: Instant::now(),
        report: Mutex::new(ManyReport::default()),
    });
    // One rtnetlink socket a lane, opened in `c` (where the rules go).
    let ns = guard.r.clone();
    let n = cfg.concurrency;
    let socks = thread::spawn(move || -> io::Result<Vec<RuleSock>> {
        ns.enter("c")?;
        (0..n).map(|_| RuleSock::open()).collect()
    })
    .join()
    .map_err(|_| io::Error::other("rule socket thread panicked"))??;
    let mut threads = Vec::new();
    for (k, sock) in socks.into_iter().enumerate() {
        match start_lane(&shared, k, spec.b_ip, Arc::new(Mutex::new(sock))) {
            Ok(mut t) => threads.append(&mut t),
            Err(e) => {
                shared.cfg.stop.store(true, Ordering::Relaxed);
                for t in threads {
                    let _ = t.join();
                }
                return Err(e);
            }
        }
    }
    for t in threads {
        if t.join().is_err() {
            shared.with_report(|r| r.error("a lane thread panicked".into()));
        }
    }
    let mut report = shared
        .report
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    report.wall = shared.t0.elapsed();
    report.flow_rules_left = count_flow_rules(&guard.r)?;
    drop(guard);
    Ok(report)
}

fn count_flow_rules(ns: &NsRef) -> io::Result<u64> {
    let out = std::process::Command::new("ip")
        .args(["-n", &ns.ns("c"), "rule", "show"])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("lookup {TABLE_B}")))
        .count() as u64)
}

/// Source → client: the migration of connection `id` is over.
struct Signal {
    id: usize,
    /// A flow rule was added (the client deletes it after the close).
    moved: bool,
}

/// Target → source: what one `serve_next` did.
struct Served {
    remote_port: Option<u16>,
    sock: Option<TcpStream>,
    cpu: Duration,
}

/// Starts lane `k`'s three threads (target in `b`, source in `a`, client in `c`).
fn start_lane(
    shared: &Arc<Shared>,
    k: usize,
    b_ip: Ipv4Addr,
    rules: Arc<Mutex<RuleSock>>,
) -> io::Result<Vec<thread::JoinHandle<()>>> {
    let port = BASE_PORT + k as u16;
    let lane_done = Arc::new(AtomicBool::new(false));
    let target_done = Arc::new(AtomicBool::new(false));
    let (served_tx, served_rx) = mpsc::channel::<Served>();
    let (addr_tx, addr_rx) = mpsc::channel::<io::Result<SocketAddr>>();
    let sh = shared.clone();
    let td = target_done.clone();
    // Named per side, so `perf report --sort comm` splits the CPU by side.
    let target = thread::Builder::new()
        .name("mm-target".into())
        .spawn(move || target_lane(&sh, b_ip, &td, &addr_tx, &served_tx))?;
    let target_addr = addr_rx
        .recv_timeout(super::AWAIT_MAX)
        .map_err(|_| io::Error::other("target lane did not start"))??;
    let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
    let (signal_tx, signal_rx) = mpsc::channel::<Signal>();
    let sh = shared.clone();
    let ld = lane_done.clone();
    let source_rules = rules.clone();
    let source = thread::Builder::new()
        .name("mm-source".into())
        .spawn(move || {
            source_lane(
                &sh,
                port,
                target_addr,
                &ld,
                &ready_tx,
                &served_rx,
                &signal_tx,
                &source_rules,
            );
            target_done.store(true, Ordering::Relaxed);
            // Wake the target's blocking accept (it sees EOF and the done flag).
            let _ = TcpStream::connect_timeout(&target_addr, Duration::from_secs(1));
        })?;
    ready_rx
        .recv_timeout(super::AWAIT_MAX)
        .map_err(|_| io::Error::other("source lane did not start"))??;
    let sh = shared.clone();
    let client = thread::Builder::new()
        .name("mm-client".into())
        .spawn(move || {
            client_lane(&sh, port, &signal_rx, &rules);
            lane_done.store(true, Ordering::Relaxed);
        })?;
    Ok(vec![client, source, target])
}

fn target_lane(
    sh: &Shared,
    b_ip: Ipv4Addr,
    done: &AtomicBool,
    addr_tx: &Sender<io::Result<SocketAddr>>,
    served_tx: &Sender<Served>,
) {
    let target = sh
        .ns
        .enter("b")
        .and_then(|()| Target::bind(SocketAddr::from((b_ip, 0))));
    let mut target = match target.and_then(|t| t.local_addr().map(|a| (t, a))) {
        Ok((mut t, a)) => {
            if let Some(key) = sh.cfg.auth {
                t.set_auth(Arc::new(crate::wire::Auth::new(key)));
            }
            let _ = addr_tx.send(Ok(a));
            t
        }
        Err(e) => {
            let _ = addr_tx.send(Err(e));
            return;
        }
    };
    // Bounded: a persistently failing accept ends the lane.
    let mut accept_errors = 0;
    while !done.load(Ordering::Relaxed) && accept_errors < 100 {
        let mut restored = None;
        let c0 = thread_cpu();
        let outcome = target.serve_next(|_| Ok(()), |s| restored = Some(s));
        let cpu = thread_cpu().saturating_sub(c0);
        let remote_port = match outcome {
            Ok(crate::TargetOutcome::Restored { remote, .. }) => Some(remote.port()),
            Ok(_) => None,
            Err(_) => {
                accept_errors += 1;
                None
            }
        };
        if served_tx
            .send(Served {
                remote_port,
                sock: restored,
                cpu,
            })
            .is_err()
        {
            return;
        }
    }
}

/// Waits (bounded by `bound`, checking `done` every 50 ms) for a connection.
fn accept_polled(
    l: &TcpListener,
    done: &AtomicBool,
    bound: Duration,
) -> io::Result<Option<TcpStream>> {
    let t0 = Instant::now();
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(Some(s));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if done.load(Ordering::Relaxed) || t0.elapsed() >= bound {
            return Ok(None);
        }
        let mut pfd = libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 50) };
    }
}

#[allow(clippy::too_many_arguments)]
fn source_lane(
    sh: &Shared,
    port: u16,
    target: SocketAddr,
    lane_done: &AtomicBool,
    ready: &Sender<io::Result<()>>,
    served: &Receiver<Served>,
    signal: &Sender<Signal>,
    rules: &Mutex<RuleSock>,
) {
    let listener = sh.ns.enter("a").and_then(|()| {
        let l = TcpListener::bind(SocketAddr::from((sh.vip, port)))?;
        l.set_nonblocking(true)?;
        Ok(l)
    });
    let listener = match listener {
        Ok(l) => {
            let _ = ready.send(Ok(()));
            l
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    // One connection at a time per lane: one pooled control connection.
    let pool = ControlPool::new(1).expect("bound 1 is valid");
    loop {
        let s = match accept_polled(&listener, lane_done, Duration::MAX) {
            Ok(Some(s)) => s,
            Ok(None) => break,
            Err(e) => {
                sh.with_report(|r| r.error(format!("source accept: {e}")));
                break;
            }
        };
        if let Err(e) = source_conn(sh, s, target, &pool, served, signal, rules) {
            sh.with_report(|r| r.error(format!("source port {port}: {e}")));
        }
    }
    sh.with_report(|r| r.control_connections += pool.opened());
}

/// Parses `POST /c/<id>?resp=<R> HTTP/1.1` → (id, R).
fn parse_request_line(line: &str) -> io::Result<(usize, usize)> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("bad request {line:?}"));
    let path = line
        .strip_prefix("POST /c/")
        .and_then(|r| r.split_whitespace().next())
        .ok_or_else(bad)?;
    let (id, resp) = path.split_once("?resp=").ok_or_else(bad)?;
    Ok((
        id.parse().map_err(|_| bad())?,
        resp.parse().map_err(|_| bad())?,
    ))
}

/// One connection on the source: prefix, migration, then finishing wherever the
/// connection ended up.
fn source_conn(
    sh: &Shared,
    mut s: TcpStream,
    target: SocketAddr,
    pool: &ControlPool,
    served: &Receiver<Served>,
    signal: &Sender<Signal>,
    rules: &Mutex<RuleSock>,
) -> io::Result<()> {
    let bound = sh.cfg.conn_timeout;
    s.set_read_timeout(Some(bound))?;
    s.set_write_timeout(Some(bound))?;
    set_int_opt(&s, libc::SOL_SOCKET, libc::SO_SNDBUF, SOURCE_SNDBUF)?;
    let client = s.peer_addr()?;
    let service = s.local_addr()?;
    let (line, post_len) = read_head_unbuffered(&mut s)?;
    let (id, resp_len) = parse_request_line(&line)?;
    // Answer as much as the socket takes now; the rest stays with the application.
    s.set_nonblocking(true)?;
    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {resp_len}\r\n\r\n");
    s.write_all(head.as_bytes())?;
    let mut chunk = vec![0u8; 64 << 10];
    let mut sent = 0;
    // Bounded: each pass sends bytes or stops; at most the response.
    while sent < resp_len {
        let n = chunk.len().min(resp_len - sent);
        fill_pat(seed_resp(id), sent, &mut chunk[..n]);
        match s.write(&chunk[..n]) {
            Ok(w) => sent += w,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    s.set_nonblocking(false)?;
    let need = post_len.min(INQ_BEFORE_MIGRATE);
    if !await_within(bound, || inq(&s).is_ok_and(|q| q >= need)) {
        return Err(io::Error::other(format!(
            "conn {id}: {need} body bytes never queued"
        )));
    }
    let mut flow_move = Duration::ZERO;
    let mut moved = false;
    let cfg = MigrateConfig {
        auth: sh.source_auth.clone(),
        ..MigrateConfig::default() // CloseAfterRestore
    };
    let c0 = thread_cpu();
    let outcome = pool.migrate_with(s, target, &cfg, || {
        let t = Instant::now();
        let r = rules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(&sh.rule(client.port(), service.port()));
        flow_move = t.elapsed();
        moved = r.is_ok();
        r
    });
    let cpu = thread_cpu().saturating_sub(c0);
    let sock = match outcome {
        Outcome::Migrated(t) => {
            let got = recv_served(served, client.port(), bound);
            sh.with_report(|r| {
                r.migrated += 1;
                r.latency_us.push(t.total.as_micros() as u64);
                r.dump_us.push(t.dump.as_micros() as u64);
                r.flow_move_us.push(flow_move.as_micros() as u64);
                r.source_cpu_us.push(cpu.as_micros() as u64);
                r.state_bytes.push(t.state_bytes as u64);
                if let Some((_, c)) = &got {
                    r.target_cpu_us.push(c.as_micros() as u64);
                }
            });
            let _ = signal.send(Signal { id, moved });
            match got {
                Some((sock, _)) => sock,
                None => {
                    return Err(io::Error::other(format!(
                        "conn {id}: migrated but never handed over"
                    )))
                }
            }
        }
        Outcome::ResumedOnSource { sock, reason } => {
            let name = fallback_name(&reason);
            sh.with_report(|r| {
                *r.resumed_on_source.entry(name.to_string()).or_default() += 1;
                r.error(format!("conn {id}: resumed on source: {reason:?}"));
            });
            let _ = signal.send(Signal { id, moved });
            sock
        }
        Outcome::Lost(e) => {
            sh.with_report(|r| {
                r.lost += 1;
                r.error(format!("conn {id}: lost: {e}"));
            });
            let _ = signal.send(Signal { id, moved });
            return Ok(());
        }
    };
    finish(sock, id, sent, resp_len, post_len, bound)
}

/// Waits for the target's hand-off of the connection from client port `port`,
/// dropping reports of other (failed) offers.
fn recv_served(
    served: &Receiver<Served>,
    port: u16,
    bound: Duration,
) -> Option<(TcpStream, Duration)> {
    let t0 = Instant::now();
    loop {
        let left = bound.checked_sub(t0.elapsed())?;
        match served.recv_timeout(left) {
            Ok(Served {
                remote_port: Some(p),
                sock: Some(s),
                cpu,
            }) if p == port => return Some((s, cpu)),
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// The server's part after the move: the rest of the response, the whole body
/// checked, the report `<fnv> <bytes> <bad>`, then the client's close.
fn finish(
    s: TcpStream,
    id: usize,
    sent: usize,
    resp_len: usize,
    post_len: usize,
    bound: Duration,
) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(bound))?;
    s.set_write_timeout(Some(bound))?;
    let mut w = s.try_clone()?;
    let mut chunk = vec![0u8; 64 << 10];
    let mut off = sent;
    while off < resp_len {
        let n = chunk.len().min(resp_len - off);
        fill_pat(seed_resp(id), off, &mut chunk[..n]);
        w.write_all(&chunk[..n])?;
        off += n;
    }
    let mut r = BufReader::with_capacity(64 << 10, s);
    let (mut got, mut bad, mut fnv) = (0usize, 0usize, Fnv::new());
    let mut exp = vec![0u8; 64 << 10];
    while got < post_len {
        let want = (post_len - got).min(chunk.len());
        let n = r.read(&mut chunk[..want])?;
        if n == 0 {
            break;
        }
        fill_pat(seed_post(id), got, &mut exp[..n]);
        if chunk[..n] != exp[..n] {
            bad += chunk[..n]
                .iter()
                .zip(&exp[..n])
                .filter(|(a, b)| a != b)
                .count();
        }
        fnv.update(&chunk[..n]);
        got += n;
    }
    let body = format!("{:016x} {got} {bad}", fnv.0);
    write!(
        w,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut rest = Vec::new();
    r.read_to_end(&mut rest)?;
    if !rest.is_empty() {
        return Err(io::Error::other(format!(
            "conn {id}: {} bytes after the body",
            rest.len()
        )));
    }
    Ok(())
}

fn client_lane(sh: &Shared, port: u16, signal: &Receiver<Signal>, rules: &Mutex<RuleSock>) {
    if let Err(e) = sh.ns.enter("c") {
        sh.with_report(|r| r.error(format!("client lane: {e}")));
        return;
    }
    let vip = SocketAddr::from((sh.vip, port));
    while let Some(id) = sh.take_id() {
        sh.with_report(|r| r.attempted += 1);
        let c = client_conn(sh, id, vip, signal, rules);
        sh.with_report(|r| {
            r.bytes_checked += c.checked;
            r.bytes_lost += c.lost;
            r.bytes_bad += c.bad;
            if let Some(e) = c.error {
                r.failed += 1;
                r.error(format!("conn {id}: client: {e}"));
            }
        });
        let n = sh.finished.fetch_add(1, Ordering::Relaxed) + 1;
        let every = sh.cfg.progress_every;
        if every > 0 && n % every == 0 {
            let r = sh.report.lock().unwrap_or_else(|p| p.into_inner());
            eprintln!(
                "[{:>7.1} s] {n} connections: {} migrated, {} resumed on source, {} lost, {} failed, {} bytes checked, {} lost/bad",
                sh.t0.elapsed().as_secs_f64(),
                r.migrated,
                r.resumed_on_source.values().sum::<u64>(),
                r.lost,
                r.failed,
                r.bytes_checked,
                r.bytes_lost + r.bytes_bad
            );
        }
    }
}

/// What the client of one connection counted.
#[derive(Default)]
struct ClientCount {
    checked: u64,
    lost: u64,
    bad: u64,
    error: Option<String>,
}

fn client_conn(
    sh: &Shared,
    id: usize,
    vip: SocketAddr,
    signal: &Receiver<Signal>,
    rules: &Mutex<RuleSock>,
) -> ClientCount {
    let (resp_len, post_len) = if sh.cfg.small {
        small_sizes(id)
    } else {
        sizes(id)
    };
    let mut c = ClientCount::default();
    let bound = sh.cfg.conn_timeout;
    let s = match connect_with_rcvbuf(vip, CLIENT_RCVBUF).and_then(|s| {
        s.set_read_timeout(Some(bound))?;
        s.set_write_timeout(Some(bound))?;
        Ok(s)
    }) {
        Ok(s) => s,
        Err(e) => {
            c.lost = (resp_len + post_len) as u64;
            c.error = Some(format!("connect: {e}"));
            return c;
        }
    };
    let sport = s.local_addr().map(|a| a.port()).unwrap_or(0);
    let writer = s.try_clone().map(|mut w| {
        thread::spawn(move || -> io::Result<u64> {
            write!(
                w,
                "POST /c/{id}?resp={resp_len} HTTP/1.1\r\nHost: t\r\nContent-Length: {post_len}\r\n\r\n"
            )?;
            let mut f = Fnv::new();
            let mut chunk = vec![0u8; 64 << 10];
            let mut off = 0;
            while off < post_len {
                let n = chunk.len().min(post_len - off);
                fill_pat(seed_post(id), off, &mut chunk[..n]);
                f.update(&chunk[..n]);
                w.write_all(&chunk[..n])?;
                off += n;
            }
            Ok(f.0)
        })
    });
    // Read nothing until the migration is over (the response stays queued).
    let mut moved = true; // unknown: try to delete the rule
    let t0 = Instant::now();
    while let Some(left) = bound.checked_sub(t0.elapsed()) {
        match signal.recv_timeout(left) {
            Ok(sg) if sg.id == id => {
                moved = sg.moved;
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let mut r = BufReader::with_capacity(64 << 10, s);
    let resp = read_response(&mut r, id, resp_len, &mut c);
    let report = resp.and_then(|()| read_report(&mut r));
    let sent_digest = match writer {
        Ok(h) => h
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("writer panicked"))),
        Err(e) => Err(e),
    };
    match (report, sent_digest) {
        (Ok((digest, got, bad)), Ok(want)) => {
            c.checked += got.min(post_len) as u64 - bad.min(got) as u64;
            c.lost += post_len.saturating_sub(got) as u64;
            c.bad += bad as u64;
            if digest != want || got != post_len {
                c.bad += 1;
                c.error
                    .get_or_insert_with(|| format!("request digest {digest:016x} != {want:016x}, {got}/{post_len} bytes, {bad} bad"));
            } else if bad > 0 {
                c.error
                    .get_or_insert_with(|| format!("{bad} bad request bytes"));
            }
        }
        (Err(e), _) | (_, Err(e)) => {
            c.lost += post_len as u64;
            c.error.get_or_insert_with(|| format!("request: {e}"));
        }
    }
    // Close, await the server's close, then drop the flow rule.
    let s = r.into_inner();
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut rest = Vec::new();
    let _ = (&s).read_to_end(&mut rest);
    if moved {
        let _ = rules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .del(&sh.rule(sport, vip.port()));
    }
    c
}

/// Reads response 1 (`resp_len` pattern bytes), counting right, lost and bad bytes.
fn read_response(
    r: &mut impl BufRead,
    id: usize,
    resp_len: usize,
    c: &mut ClientCount,
) -> io::Result<()> {
    let (line, len) = read_head(r)?;
    if !line.starts_with("HTTP/1.1 200") || len != resp_len {
        c.lost += resp_len as u64;
        c.error = Some(format!(
            "response head {line:?}, length {len} != {resp_len}"
        ));
        return Err(io::Error::other("bad response head"));
    }
    let mut buf = vec![0u8; 64 << 10];
    let mut exp = vec![0u8; 64 << 10];
    let mut got = 0;
    let mut bad = 0usize;
    let result = loop {
        if got == resp_len {
            break Ok(());
        }
        let want = (resp_len - got).min(buf.len());
        match r.read(&mut buf[..want]) {
            Ok(0) => break Err(io::Error::other(format!("EOF at {got}/{resp_len}"))),
            Ok(n) => {
                fill_pat(seed_resp(id), got, &mut exp[..n]);
                if buf[..n] != exp[..n] {
                    bad += buf[..n]
                        .iter()
                        .zip(&exp[..n])
                        .filter(|(a, b)| a != b)
                        .count();
                }
                got += n;
            }
            Err(e) => break Err(e),
        }
    };
    c.checked += (got - bad) as u64;
    c.bad += bad as u64;
    c.lost += (resp_len - got) as u64;
    if bad > 0 && c.error.is_none() {
        c.error = Some(format!("{bad} bad response bytes"));
    }
    if let Err(e) = &result {
        c.error.get_or_insert_with(|| format!("response: {e}"));
    }
    result
}

fn read_head(r: &mut impl BufRead) -> io::Result<(String, usize)> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "EOF in a head",
            ));
        }
        head.push_str(&line);
        if line == "\r\n" {
            return Ok(super::session::parse_head(&head));
        }
        if head.len() > super::session::HEAD_BYTES_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too long"));
        }
    }
}

/// Reads the server's report on the request body: (digest, bytes, bad bytes).
fn read_report(r: &mut impl BufRead) -> io::Result<(u64, usize, usize)> {
    let (_, len) = read_head(r)?;
    if len > 128 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "report too long",
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    let body = String::from_utf8_lossy(&body).to_string();
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("bad report {body:?}"));
    let mut f = body.split_whitespace();
    let digest = u64::from_str_radix(f.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
    let got = f.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let nbad = f.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    Ok((digest, got, nbad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_cover_every_pair_and_straddle_the_buffers() {
        let pairs: std::collections::BTreeSet<(usize, usize)> = (0..16)
            .map(|id| (sizes(id).0 / 1000, sizes(id).1 / 1000))
            .collect();
        assert_eq!(pairs.len(), 16);
        assert!((0..16).any(|id| sizes(id).0 > 4 * SOURCE_SNDBUF as usize));
        assert!((0..16).all(|id| sizes(id).1 > 0));
    }

    #[test]
    fn request_line_round_trips() {
        assert_eq!(
            parse_request_line("POST /c/17?resp=1234 HTTP/1.1").unwrap(),
            (17, 1234)
        );
        assert!(parse_request_line("GET /c/17 HTTP/1.1").is_err());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut s = Samples::default();
        for v in 1..=100 {
            s.push(v);
        }
        assert_eq!((s.pct(50), s.pct(99), s.pct(100)), (50, 99, 100));
        assert_eq!(Samples::default().pct(50), 0);
    }
}
