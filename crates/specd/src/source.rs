//! The source side of `farside specd`: speculatively admitted connections are
//! accepted on the daemon's admission listener, marked migratory and migrated to the
//! least-loaded peer; refusals and failures fall back to the local server and close
//! the window (seed 002 §3.2).
//!
//! ```text
//!  SYN for VIP:port ──sk_lookup (steer.bpf.c)── divert? ──no──▶ web server's listener
//!              kernel mode: server's sk_ack_backlog ≥ Q    │yes
//!                           and room (window events)       ▼
//!  admission listener ─▶ migrators (--migrators threads, each blocked in accept(2)
//!                        on it: one connection wakes one thread), that thread:
//!        window.on_arrival(server queue: the backlog the program published, or the
//!                          poller's)
//!        Migrate ─▶ this thread migrates it now:
//!                     least-loaded peer (regions read one-sidedly when choosing,
//!                     a load younger than --peer-poll-us reused)
//!                     pool.migrate_with(sock, peer, move_flow)
//!                       Migrated ───────────────▶ resolved(Migrated); the frozen
//!                                                  source socket drains in the pool's
//!                                                  reaper (farside_migrate::drain)
//!                       Refused / failed / lost ─▶ resolved(…): window closes,
//!                                                  connection handed to the local server
//!        Server / Refuse (stale divert flag) ─▶ handed to the local server
//!  poller (--poll-us): server queue (sock_diag); locally served estimate →
//!                      window.on_served_locally; poll mode: → divert flag.
//!                      Kernel mode: runs only while the window is closed (else it
//!                      sleeps, waking every LISTENER_CHECK to see that the server's
//!                      listener is still there).
//!  notifications (UDP on --listen) from peers ─▶ window.on_notification
//! ```
//!
//! Steering modes (summary key `steer_mode`): `kernel` when the server's listener
//! could be put in the program's socket map (taken from its owner with
//! `pidfd_getfd`, see [`crate::load::server_listener`]; the daemon keeps no
//! descriptor of it, so a server that closes it closes it); `poll` when it could
//! not (or was closed since: checked every [`LISTENER_CHECK`], and taken again when a
//! server listens again); `none` without steering.
//!
//! Locally served requests (the N-rule) are estimated as the server's accepts:
//! connections the program passed to the server minus the growth of its accept
//! queue over the poll period, plus the connections that fell back. A SYN dropped
//! by a full accept queue is counted when the program passes it (it may be retried),
//! so the estimate can run ahead when the server's queue overflows.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use farside_migrate::{Fallback, FlowHold, Handover, MigrateConfig, Outcome};
use farside_region::layout::SNAPSHOT_BYTES;
use farside_region::Snapshot;
use farside_rmem::{connect_target, ClientOptions};

use crate::handoff::HandOff;
use crate::load::{server_listener, ServerQueue};
pub use crate::peer::Peer;
use crate::peer::{full_at_for, least_loaded, some_peer_has_room, PeerLoad};
use crate::stats::{Event, PerSecond, Samples, WindowEvents};
use crate::steer::{FlowSteer, Mode, Steering};
use crate::steer::{
    CNT_DAEMON, CNT_DROPPED, CNT_FULL_PASSED, CNT_HALF_OPEN, CNT_NO_SERVER, CNT_SERVER,
};
use crate::summary::{
    to_line, ControlSummary, DrainSummary, NamedCounts, PeerSummary, SourceSummary, SteerSummary,
    WindowSummary,
};
use crate::window::{Decision, Resolution, Window, WindowConfig};

/// Default migration threads, the most migrations in flight at once. Each thread
/// accepts on the admission listener itself and migrates what it accepted; a
/// migration holds its thread about a millisecond (more on a node short of CPU:
/// tens of ms in the lab), no longer its flow drain (`FLOW_DRAIN_DEFAULT`, 50 ms,
/// kept by the control pool's reaper), so 32 threads cover the paper's rates
/// (hundreds per second) with room for slow targets.
pub const MIGRATORS_DEFAULT: usize = 32;
/// Upper bound of `--migrators` (each a thread with a small stack).
pub const MIGRATORS_MAX: usize = 256;
/// Default poll period of the server's queue (and, in the poll mode, the divert flag):
/// 5 ms. A poll (a sock_diag exact lookup, one program counter) costs ~20 µs of CPU, so
/// 1 ms polls
/// cost the node 2 % of a CPU, 10 % of a lab node's 20 % quota, even idle; and the
/// queue moves by one position per served request (~11 ms at a lab node's 88 conn/s),
/// so a 5 ms old flag is at most about one connection behind.
pub const POLL_DEFAULT: Duration = Duration::from_millis(5);
/// Default age below which a peer's load read from its region is reused: 5 ms.
pub const PEER_POLL_DEFAULT: Duration = Duration::from_millis(5);
/// How often, in kernel mode, the daemon checks that the server's listener is still in
/// the program's map (the kernel drops it when the server closes it), and in poll mode
/// tries to take it again: 1 s, one bpf(2) lookup per second (a restarted server is
/// back in the kernel mode within a second; until then the polls steer).
pub const LISTENER_CHECK: Duration = Duration::from_secs(1);
/// Most peers (one region read each when choosing a target).
pub const PEERS_MAX: usize = 64;
/// Migrator threads' stack (the migrate protocol's buffers live on the heap).
const MIGRATOR_STACK_BYTES: usize = 256 * 1024;

/// Configuration of the source side.
#[derive(Clone, Debug)]
pub struct SourceConfig {
    /// The daemon's admission listener (steered connections arrive here).
    pub accept: SocketAddr,
    /// Where peers' notifications arrive (UDP; the daemon's `--listen`).
    pub notify: SocketAddr,
    /// Q, W, N.
    pub window: WindowConfig,
    /// The local web server's port.
    pub server_port: u16,
    /// Steer with the sk_lookup program for this service (`None`: no steering; only
    /// connections that reach the admission listener otherwise are handled).
    pub steer: Option<(Option<Ipv4Addr>, u16)>,
    /// The peers.
    pub peers: Vec<Peer>,
    /// Migration threads.
    pub migrators: usize,
    /// Poll period of the server's queue.
    pub poll: Duration,
    /// Steer by polling even where the kernel mode is possible (`--poll-steer`; for
    /// comparisons with the kernel mode).
    pub poll_steer: bool,
    /// Kernel mode: what a SYN meets at Q without room (`--no-room`).
    pub no_room: crate::window::NoRoom,
    /// Age below which a peer's load, read from its region when a migration chooses
    /// its target, is reused (no timer: regions are read on demand).
    pub peer_poll: Duration,
    /// Hand-over order (`CloseAfterRestore` across hosts/namespaces).
    pub handover: Handover,
    /// Content-aware choice of the target (`None`: least-loaded only).
    pub affinity: Option<Affinity>,
    /// Do not migrate while every peer's known load says full (`--gate-peer-load`):
    /// the divert flag stays off and migratory arrivals stay local. Off by default:
    /// in `lab speculative` (one peer, its load read every 5 ms) it made throughput
    /// swing between points (75/25 spec32 100–138 conn/s against 119–144 without).
    pub gate_on_peer_load: bool,
    /// The migrations' authenticated framing (`--key-file`); `None`: unauthenticated.
    /// The peers' targets must hold the same key.
    pub auth: Option<Arc<farside_migrate::wire::Auth>>,
    /// This back-end's address at the front-end: a migration whose DONE the target
    /// does not acknowledge moves the flow back here and resumes the connection;
    /// `None`: the flow is left where it is (a flow that follows the socket).
    pub own_backend: Option<IpAddr>,
}

/// Content-aware migration: the migrator reads the request's first line (a peek: the
/// bytes stay in the receive queue and move with the connection) and sends equal
/// paths to the same peer, so each peer's cache holds its share of the content; a
/// peer known to be full is passed over for the least-loaded one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Affinity {
    /// How long the migrator waits for the request's first bytes before choosing
    /// without them (the client sends its request right after the handshake).
    pub wait: Duration,
    /// A peer whose known backlog plus migrations in flight reaches this is full
    /// (it would refuse): `--admit-queue-max` of the peers, 64 by default.
    pub full_at: u64,
}

/// Bytes peeked for the request line (a request line longer than this is chosen
/// for by least load).
pub const AFFINITY_PEEK_BYTES: usize = 2048;
/// Default wait for the request's first bytes: 2 ms (one round trip on a LAN plus the
/// client's scheduling; a migration waits tens of ms for CPU on a saturated node).
pub const AFFINITY_WAIT_DEFAULT: Duration = Duration::from_millis(2);

/// The path of an HTTP/1.x request line at the start of `buf` (`None`: not a
/// complete request line).
pub fn request_path(buf: &[u8]) -> Option<&[u8]> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    let mut parts = buf[..end].split(|&b| b == b' ');
    let (_method, path, version) = (parts.next()?, parts.next()?, parts.next()?);
    (version.starts_with(b"HTTP/1.") && !path.is_empty() && parts.next().is_none()).then_some(path)
}

/// FNV-1a of a path: stable across runs and hosts, so every source sends a path to
/// the same peer.
pub fn path_hash(path: &[u8]) -> u64 {
    path.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The peer for a request: the path's peer (`hash % peers`) unless its load is known
/// and it is full, else the least-loaded (see [`least_loaded`]).
fn choose_with_affinity(hash: Option<u64>, cands: &[(PeerLoad, u32)], full_at: u64) -> usize {
    if let Some(h) = hash {
        let i = (h % cands.len() as u64) as usize;
        let (l, inflight) = cands[i];
        if !l.known || l.accept_backlog + u64::from(inflight) < full_at {
            return i;
        }
    }
    least_loaded(cands.iter().copied()).unwrap_or(0)
}

/// Peeks the request line of `sock` (waiting at most `wait`) and hashes its path.
fn peek_path_hash(sock: &TcpStream, wait: Duration) -> Option<u64> {
    if !wait_readable(sock.as_raw_fd(), Some(wait)) {
        return None;
    }
    let mut buf = [0u8; AFFINITY_PEEK_BYTES];
    // SAFETY: recv into a local buffer of the length passed.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    let n = usize::try_from(n).ok()?;
    request_path(&buf[..n]).map(path_hash)
}

impl SourceConfig {
    /// Checks every bound.
    pub fn validate(&self) -> Result<(), String> {
        self.window.validate()?;
        if self.peers.is_empty() {
            return Err("speculative admission needs at least one --peer".into());
        }
        if self.peers.len() > PEERS_MAX {
            return Err(format!("at most {PEERS_MAX} peers"));
        }
        if self.migrators == 0 || self.migrators > MIGRATORS_MAX {
            return Err(format!("--migrators must be in 1..={MIGRATORS_MAX}"));
        }
        if self.poll.is_zero() || self.peer_poll.is_zero() {
            return Err("poll periods must be positive".into());
        }
        Ok(())
    }
}

struct PeerState {
    peer: Peer,
    load: Mutex<PeerLoad>,
    /// The region client and when the load was last read (`None`: never).
    region: Mutex<RegionReader>,
    /// Migrations to it in progress (added to its backlog when choosing).
    inflight: AtomicU32,
    migrated: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
}

impl PeerState {
    /// A peer with no load read yet and nothing counted.
    fn new(peer: Peer) -> PeerState {
        PeerState {
            peer,
            load: Mutex::new(PeerLoad::default()),
            region: Mutex::new(RegionReader::default()),
            inflight: AtomicU32::new(0),
            migrated: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }
}

/// Counters of the source side.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// Connections accepted on the admission listener.
    pub accepted: AtomicU64,
    /// Accepted while the window said "server" or "refuse" (stale divert): served
    /// locally.
    pub stale_local: AtomicU64,
    /// Migrated.
    pub migrated: AtomicU64,
    /// Fell back to the local server (refused, failed, not dumpable).
    pub fell_back: AtomicU64,
    /// Lost (see `farside_migrate::Outcome::Lost`).
    pub lost: AtomicU64,
    /// Notifications received from peers.
    pub notifications: AtomicU64,
    /// Freeze to DONE per migrated connection, µs.
    pub migration_us: Mutex<Samples>,
    /// Freeze and dump per migrated connection, µs.
    pub dump_us: Mutex<Samples>,
    /// Source CPU per migrated connection (the migrator thread's CPU time), µs.
    pub cpu_us: Mutex<Samples>,
    /// Admission to a migrator thread taking the connection, per migratory
    /// connection, µs (waiting for a free migrator and for CPU).
    pub queue_wait_us: Mutex<Samples>,
    /// Admission to DONE per migrated connection, µs: what the connection waited
    /// for the move (queue wait + freeze to DONE).
    pub admit_to_done_us: Mutex<Samples>,
    /// Connect + OFFER until ACCEPT per migrated connection, µs.
    pub offer_us: Mutex<Samples>,
    /// COMMIT until RESTORED per migrated connection, µs.
    pub restore_us: Mutex<Samples>,
    /// The front-end's flow move until DONE per migrated connection, µs.
    pub flow_us: Mutex<Samples>,
    /// Migratory connections kept for the local server because every peer's known
    /// load said it was full (no dump, no offer, no refusal).
    pub no_peer_room: AtomicU64,
    /// Migratory connections whose target was chosen by their request path
    /// ([`Affinity`]).
    pub affinity_hashed: AtomicU64,
    /// Fall-backs by reason, indexed as [`FALLBACK_REASONS`].
    pub fallbacks: [AtomicU64; FALLBACK_REASONS.len()],
}

/// Labels of the fall-back reasons in the summary's `fallbacks` (the dump errors
/// that occur on a live server split out: a client that closed or reset first
/// leaves a socket that is no longer ESTABLISHED).
pub const FALLBACK_REASONS: [&str; 7] = [
    "not_established",
    "not_dumpable_other",
    "target_unreachable",
    "refused",
    "restore_failed",
    "target_gone",
    "flow_not_moved",
];

fn fallback_index(f: &Fallback) -> usize {
    match f {
        Fallback::NotDumpable(farside_migrate::DumpError::NotEstablished(_)) => 0,
        Fallback::NotDumpable(_) => 1,
        Fallback::TargetUnreachable(_) => 2,
        Fallback::Refused(_) => 3,
        Fallback::RestoreFailed(_) => 4,
        Fallback::TargetGone(_) => 5,
        Fallback::FlowNotMoved(_) => 6,
    }
}

/// A peer's region client and the age of its last read.
#[derive(Default)]
struct RegionReader {
    client: Option<Box<dyn farside_rmem::RemoteMemory>>,
    read_at: Option<Instant>,
    buf: Vec<u8>,
}

/// Which mode steers (`steer_mode` in the summary).
const STEER_NONE: u8 = 0;
const STEER_POLL: u8 = 1;
const STEER_KERNEL: u8 = 2;

fn steer_mode_name(m: u8) -> &'static str {
    match m {
        STEER_KERNEL => "kernel",
        STEER_POLL => "poll",
        _ => "none",
    }
}

struct Shared {
    cfg: SourceConfig,
    stop: AtomicBool,
    window: Mutex<Window>,
    /// The server's queue as the poller last read it (poll mode, and kernel mode while
    /// the window is closed).
    server_queue: AtomicU32,
    /// The program's shared words (`None`: no steering).
    live: Option<Arc<crate::steer::Live>>,
    /// `STEER_*`: who decides the divert now.
    steer_mode: AtomicU8,
    /// Wakes the poller when the window closes or on stop (kernel mode).
    poller_wake: Condvar,
    /// The admission listener, blocking: every migrator waits in its accept (shut
    /// down to wake them all on stop).
    admission: TcpListener,
    /// Where peers' notifications arrive (shut down to wake its thread on stop).
    notify_sock: UdpSocket,
    peers: Vec<PeerState>,
    stats: SourceStats,
    local: HandOff,
    flow: Box<dyn FlowSteer>,
    /// The sk_lookup program (`None`: no steering); the poller's, and the summary's
    /// counters.
    steering: Mutex<Option<Steering>>,
    /// The sk_lookup program's counters at the last summary (or at the poller's exit).
    steer_counts: Mutex<[u64; crate::steer::COUNTERS]>,
    /// When the daemon started (event times are relative to it), and the same
    /// moment in Unix time (ms), so a reader can place the series on its own clock.
    started: std::time::Instant,
    started_unix_ms: u64,
    window_events: Mutex<WindowEvents>,
    /// Migrations, refusals and window closures per second since the start.
    series: Mutex<PerSecond>,
    /// Control connections to the peers' daemons, reused across migrations (
    /// a connect, accept, two closes and a TIME_WAIT less per migration); up to
    /// `--migrators` idle per peer (at most `POOL_IDLE_PER_TARGET_MAX`).
    control: farside_migrate::ControlPool,
    /// With `CloseBeforeRestore` (`--same-netns`): the flow hold of this namespace,
    /// which drops a client's segments between the source's close and the target's
    /// restore instead of letting the listener reset them (`farside_migrate::hold`).
    hold: Option<Arc<FlowHold>>,
}

/// A running source side. Dropping it stops it.
pub struct SourceDaemon {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    accept_addr: SocketAddr,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SourceDaemon {
    /// Binds the admission listener (backlog W: the paper's admission queue, the part
    /// of its enlarged accept queue beyond Q), attaches steering if configured (in the
    /// calling thread's network namespace) and starts the threads.
    pub fn start(cfg: SourceConfig, local: HandOff, flow: Box<dyn FlowSteer>) -> io::Result<Self> {
        cfg.validate()
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
        let listener = TcpListener::bind(cfg.accept)
            .map_err(|e| io::Error::new(e.kind(), format!("--accept {}: {e}", cfg.accept)))?;
        // W bounds the connections waiting for the acceptor, as the room flag (window
        // size minus in flight) bounds the ones being migrated. The kernel drops a SYN
        // beyond it (the client retries, as at a full server queue): with a larger
        // backlog, an acceptor slowed by the node's CPU quota let hundreds of
        // migratory connections wait until their clients gave up (measured at 2.5x:
        // 661 of 1,407 gone before their turn).
        let backlog = cfg.window.window.max(1) as libc::c_int;
        // SAFETY: listen(2) on our bound socket, to set its backlog.
        if unsafe { libc::listen(listener.as_raw_fd(), backlog) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // Blocking: the migrators wait in accept(2), an exclusive wait (one
        // connection wakes one of them; a poll would wake them all).
        let accept_addr = listener.local_addr()?;
        let notify = UdpSocket::bind(cfg.notify).map_err(|e| {
            io::Error::new(e.kind(), format!("notifications on {}: {e}", cfg.notify))
        })?;
        // No read timeout, and the migrators' accepts have none either: a stop wakes
        // them by shutting their sockets down (at 200 ms timeouts they cost an idle
        // node 10 wake-ups a second).
        let mut steering = match cfg.steer {
            Some((vip, port)) => Some(Steering::attach_with(
                vip,
                port,
                &listener,
                !cfg.poll_steer,
            )?),
            None => None,
        };
        let mode = match steering.as_mut() {
            Some(st) => match take_server_listener(st, &cfg) {
                Ok(why) => {
                    log::info!("specd: steer mode kernel: the program decides per SYN ({why})");
                    STEER_KERNEL
                }
                Err(e) => {
                    log::warn!(
                        "specd: steer mode poll (every {:?}): the server's listener cannot be put in the program's map: {e}",
                        cfg.poll
                    );
                    STEER_POLL
                }
            },
            None => {
                log::info!("specd: steer mode none (no sk_lookup program)");
                STEER_NONE
            }
        };
        // After the steering program: the hold's selection replaces steer's anyway.
        let hold = match cfg.handover {
            Handover::CloseBeforeRestore => Some(Arc::new(FlowHold::attach().map_err(|e| {
                io::Error::new(e.kind(), format!("--same-netns needs the flow hold: {e}"))
            })?)),
            Handover::CloseAfterRestore => None,
        };
        let live = steering.as_ref().map(|st| st.live());
        if let Some(l) = &live {
            l.set_room(true);
        }
        let mut queue = ServerQueue::new(cfg.server_port)?;
        let q0 = queue.read()?;
        // As many idle control connections per peer as migrations can be in flight
        // (the migrators): a burst beyond the pool's default 8 opened connections that
        // were closed after it, each a connect, an accept, two closes, a TIME_WAIT and,
        // at the target, a wake-up of every thread whose idle connection watches the
        // listener. Kept ones the target closes after 3 s without an offer.
        let control = farside_migrate::ControlPool::new(
            cfg.migrators
                .clamp(1, farside_migrate::proto::POOL_IDLE_PER_TARGET_MAX),
        )?;
        let shared = Arc::new(Shared {
            window: Mutex::new(Window::new(cfg.window)),
            server_queue: AtomicU32::new(q0),
            live,
            steer_mode: AtomicU8::new(mode),
            poller_wake: Condvar::new(),
            steering: Mutex::new(steering),
            admission: listener,
            notify_sock: notify,
            peers: cfg
                .peers
                .iter()
                .map(|p| PeerState::new(p.clone()))
                .collect(),
            cfg,
            stop: AtomicBool::new(false),
            stats: SourceStats::default(),
            local,
            flow,
            steer_counts: Mutex::new([0; crate::steer::COUNTERS]),
            started: std::time::Instant::now(),
            started_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            window_events: Mutex::new(WindowEvents::default()),
            series: Mutex::new(PerSecond::default()),
            control,
            hold,
        });
        // Threads go into the daemon as they start: if one cannot be spawned, its drop
        // stops and joins those already running (the migrators wait in accept, which
        // only the stop's shutdown ends).
        let mut daemon = Self {
            shared,
            threads: Vec::new(),
            accept_addr,
        };
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .stack_size(MIGRATOR_STACK_BYTES)
                .spawn(f)
        };
        for i in 0..daemon.shared.cfg.migrators {
            let s = Arc::clone(&daemon.shared);
            daemon.threads.push(spawn(
                format!("specd-mig{i}"),
                Box::new(move || migrator_loop(&s)),
            )?);
        }
        let s = Arc::clone(&daemon.shared);
        daemon.threads.push(spawn(
            "specd-poll".into(),
            Box::new(move || poller_loop(&s, queue)),
        )?);
        let s = Arc::clone(&daemon.shared);
        daemon.threads.push(spawn(
            "specd-notified".into(),
            Box::new(move || notified_loop(&s, &s.notify_sock)),
        )?);
        log::info!(
            "specd source: admission listener {accept_addr}, Q {} W {} N {}, {} peers",
            daemon.shared.cfg.window.queue,
            daemon.shared.cfg.window.window,
            daemon.shared.cfg.window.reopen_after,
            daemon.shared.peers.len()
        );
        Ok(daemon)
    }

    /// The admission listener's address.
    pub fn accept_addr(&self) -> SocketAddr {
        self.accept_addr
    }

    /// The counters.
    pub fn stats(&self) -> &SourceStats {
        &self.shared.stats
    }

    /// The window's state now.
    pub fn window(&self) -> Window {
        lock(&self.shared.window).clone()
    }

    /// The source side's counters, samples and window (the exit summary's `source`).
    pub fn summary(&self) -> SourceSummary {
        let s = &self.shared.stats;
        let peers = self
            .shared
            .peers
            .iter()
            .map(|p| PeerSummary {
                daemon: p.peer.daemon.to_string(),
                migrated: p.migrated.load(Ordering::Relaxed),
                refused: p.refused.load(Ordering::Relaxed),
                failed: p.failed.load(Ordering::Relaxed),
            })
            .collect();
        if let Some(st) = lock(&self.shared.steering).as_ref() {
            if let Ok(c) = st.counters() {
                *lock(&self.shared.steer_counts) = c;
            }
        }
        let steer = *lock(&self.shared.steer_counts);
        let (window_events, window_events_dropped) = {
            let ev = lock(&self.shared.window_events);
            (ev.events.clone(), ev.dropped)
        };
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // The series and the totals it sums to, under both locks (`window_op`'s order):
        // an event ending meanwhile counts in both or in neither.
        let (window, series, migrated) = {
            let w = lock(&self.shared.window);
            let series = lock(&self.shared.series);
            (WindowSummary::from(&*w), series.summary(), n(&s.migrated))
        };
        let local = self.shared.local.stats();
        let control = &self.shared.control;
        SourceSummary {
            started_unix_ms: self.shared.started_unix_ms,
            series,
            window_events,
            window_events_dropped,
            accepted: n(&s.accepted),
            stale_local: n(&s.stale_local),
            migrated,
            fell_back: n(&s.fell_back),
            lost: n(&s.lost),
            local_handoff_failed: local.closed(),
            local_handoff: local.summary(),
            notifications: n(&s.notifications),
            window,
            steer: SteerSummary {
                server: steer[CNT_SERVER],
                daemon: steer[CNT_DAEMON],
                no_server: steer[CNT_NO_SERVER],
                half_open: steer[CNT_HALF_OPEN],
                dropped: steer[CNT_DROPPED],
                full_passed: steer[CNT_FULL_PASSED],
            },
            steer_mode: steer_mode_name(self.shared.steer_mode.load(Ordering::Relaxed)),
            migration_us: lock(&s.migration_us).summary(),
            dump_us: lock(&s.dump_us).summary(),
            cpu_us: lock(&s.cpu_us).summary(),
            queue_wait_us: lock(&s.queue_wait_us).summary(),
            offer_us: lock(&s.offer_us).summary(),
            restore_us: lock(&s.restore_us).summary(),
            flow_us: lock(&s.flow_us).summary(),
            admit_to_done_us: lock(&s.admit_to_done_us).summary(),
            flow_drain: DrainSummary::from(&control.drain_stats()),
            control: ControlSummary::from(control),
            no_peer_room: n(&s.no_peer_room),
            affinity_hashed: n(&s.affinity_hashed),
            fallbacks: NamedCounts(
                FALLBACK_REASONS
                    .iter()
                    .zip(&s.fallbacks)
                    .map(|(k, v)| (*k, n(v)))
                    .collect(),
            ),
            peers,
        }
    }

    /// One-line JSON of [`SourceDaemon::summary`].
    pub fn summary_json(&self) -> String {
        to_line(&self.summary())
    }

    /// Stops the threads (migrations in progress finish).
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            // Under the window's lock: the poller checks `stop` under it before waiting.
            let _w = lock(&self.shared.window);
            self.shared.poller_wake.notify_all();
        }
        // Wakes the migrators' accepts and the notification thread's read (no
        // timeouts; a shut-down listener wakes every thread blocked in its accept,
        // exclusive waiters included, with EINVAL): the listener stops listening (the
        // kernel drops it from the program's map, new SYNs take the normal lookup),
        // the datagram socket's reads return 0. A UDP socket answers ENOTCONN and is
        // shut down all the same.
        for fd in [
            self.shared.admission.as_raw_fd(),
            self.shared.notify_sock.as_raw_fd(),
        ] {
            // SAFETY: shutdown(2) on a socket Shared owns (open until Shared drops).
            unsafe { libc::shutdown(fd, libc::SHUT_RD) };
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for SourceDaemon {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop_and_join();
        }
    }
}

/// Runs `f` on the window and records the transitions it caused.
fn window_op<R>(s: &Shared, f: impl FnOnce(&mut Window) -> R) -> R {
    let mut w = lock(&s.window);
    let before = w.stats();
    let was_open = w.is_open();
    let r = f(&mut w);
    let after = w.stats();
    // Kernel mode: the program reads `room` at every SYN; a store, under the lock so
    // that stores land in the window's order.
    if let Some(l) = &s.live {
        l.set_room(w.is_open() && w.has_room());
    }
    if was_open && !w.is_open() {
        s.poller_wake.notify_all();
    }
    // The series counts the window's closures and refusals, under the window's lock
    // (order: window, then series), as the summary reads them.
    let closed = after.closures - before.closures;
    {
        let t_s = s.started.elapsed().as_secs();
        let mut series = lock(&s.series);
        for _ in 0..after.target_refusals - before.target_refusals {
            series.record(t_s, Event::Refused);
        }
        for _ in 0..closed {
            series.record(t_s, Event::Closed);
        }
    }
    drop(w);
    let happened = [
        (closed, "close"),
        (
            after.reopened_by_notification - before.reopened_by_notification,
            "open_notify",
        ),
        (
            after.reopened_by_service - before.reopened_by_service,
            "open_service",
        ),
        (
            after.reopened_by_peer_load - before.reopened_by_peer_load,
            "open_peer_load",
        ),
    ];
    if happened.iter().any(|(n, _)| *n > 0) {
        let t_ms = s.started.elapsed().as_millis() as u64;
        let mut ev = lock(&s.window_events);
        for (n, what) in happened {
            ev.push(t_ms, what, n);
        }
    }
    r
}

/// How often a migrator waiting for its connection to be taken by the local server
/// checks for a stop (the wait itself ends when the hand-off does: at most its
/// `HANDOFF_WAIT_MAX`).
const FALLBACK_STOP_CHECK: Duration = Duration::from_millis(100);
/// How long a connection handed to the local server may wait in the hand-off queue
/// (the server's adoption channel is full: every worker is held) before the window
/// may offer it to a peer instead ([`Window::on_local_wait`]): 100 ms. The queue
/// moves one position per connection a worker frees, which with keep-alive clients
/// takes seconds, while a migration takes ~20 ms (the flood lab's offer time, p50;
/// 140 ms p99) and the peer may be idle: measured, a connection refused by a window
/// closed for 68 ms then waited 2.06 s here and more in the adoption socket,
/// unanswered, while the peer's queues were empty. 100 ms is 20 of the server-queue
/// polls (5 ms) and a small part of any client's patience; a connection the server
/// takes within it is never moved.
pub const HANDOFF_REOFFER_AFTER: Duration = Duration::from_millis(100);
/// Longest a migration waits for each of its target's replies (ACCEPT/REFUSE,
/// RESTORED/FAILED) before it falls back (`target_gone`): 1 s, against the migrate
/// crate's 2 s default. The client waits in silence all that time, and then for the
/// local server: measured in the flood lab beside CPU hogs, two new connections
/// waited 2.0 s for a stalled target, fell back, and were still in the local
/// adoption socket when their clients gave up at 3 s. The slowest offer that
/// completed there took 0.43 s (p99 0.14 s), so 1 s is over twice the slowest answer
/// seen and leaves a 3 s client two seconds to be served here.
pub const MIGRATION_REPLY_MAX: Duration = Duration::from_secs(1);
/// How often, past [`HANDOFF_REOFFER_AFTER`], a migrator looks whether the window
/// has reopened for its waiting connection: 10 ms (one window lock; a reopening
/// comes with a target's notification).
const REOFFER_CHECK: Duration = Duration::from_millis(10);
/// Offers to a peer a connection may be given after the one it was admitted for
/// (or, for one handed to the local server at once, in all): one, so a connection
/// moves at most twice and a refusing peer is not offered the same connection again
/// and again; it then waits for the local server, at most `HANDOFF_WAIT_MAX`, and is
/// refused with a reset past that.
const REOFFERS_MAX: u32 = 1;

/// Hands a connection that stays here to the local server and waits until the server
/// has taken it (or it was closed: expired and refused, client gone, stop). A
/// migratory connection that fell back (`holds_place`) keeps its place in the window
/// until then ([`Window::on_handed_locally`]): the migrator waits on purpose, so that
/// while fall-backs wait for a saturated local server their places keep the window
/// from admitting more, as the server's full accept queue keeps SYNs out, instead of
/// piling connections up in front of it (measured: at 4x overload, 75/25, the
/// source's hand-off queue filled to its bound and closed up to 108 connections per
/// 20 s run). The wait is short when the server has room: one non-blocking send.
///
/// One that still waits after [`HANDOFF_REOFFER_AFTER`] is taken back and offered to
/// a peer if the window has room for it (`offers_left` of [`REOFFERS_MAX`]), rather
/// than waiting for workers held by keep-alive connections while a peer has room.
fn stay_local(
    s: &Shared,
    mcfg: &MigrateConfig,
    sock: TcpStream,
    holds_place: bool,
    offers_left: u32,
) {
    let taken = match s.local.hand_watched(sock) {
        Ok(t) => t,
        Err(e) => {
            log::warn!("specd: hand-off to the local server failed: {e}");
            if holds_place {
                window_op(s, |w| w.on_handed_locally());
            }
            return;
        }
    };
    let t0 = Instant::now();
    loop {
        let waited = t0.elapsed();
        let slice = match (offers_left > 0, HANDOFF_REOFFER_AFTER.checked_sub(waited)) {
            (true, Some(left)) if !left.is_zero() => left,
            (true, _) => REOFFER_CHECK,
            (false, _) => FALLBACK_STOP_CHECK,
        };
        if taken.wait(slice) || s.stop.load(Ordering::SeqCst) {
            break;
        }
        if offers_left == 0 || t0.elapsed() < HANDOFF_REOFFER_AFTER {
            continue;
        }
        // Only when the window would take it (the check and the transition are two
        // locks apart: a window that closed in between hands it back below).
        if !window_op(s, |w| w.is_open() && (holds_place || w.has_room())) {
            continue;
        }
        let Some((sock, waited)) = taken.take_back() else {
            continue;
        };
        if window_op(s, |w| w.on_local_wait(holds_place)) {
            crate::trace::record(
                sock.peer_addr().ok(),
                "reoffered",
                waited.as_micros() as u64,
            );
            migrate_one(s, mcfg, sock, Instant::now(), offers_left - 1);
        } else {
            stay_local(s, mcfg, sock, holds_place, 0);
        }
        return;
    }
    if holds_place {
        window_op(s, |w| w.on_handed_locally());
    }
}

/// Adds one to `total` and counts `e` in the per-second series, under the series'
/// lock (as the summary reads them), in the second since the start it happens in.
fn record_counted(s: &Shared, total: &AtomicU64, e: Event) {
    let t_s = s.started.elapsed().as_secs();
    let mut series = lock(&s.series);
    total.fetch_add(1, Ordering::Relaxed);
    series.record(t_s, e);
}

/// Waits until `fd` is readable (or hung up), at most `timeout` (`None`: no bound).
fn wait_readable(fd: i32, timeout: Option<Duration>) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as libc::c_int);
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n > 0
}

/// A migrator: accepts on the admission listener (blocking, no timeout: the stop
/// shuts the listener down, which wakes every thread waiting in accept), decides with
/// the window and migrates what it admitted itself, so a migratory connection costs
/// one wake-up here, not an acceptor's and then a migrator's. The migrators bound the
/// migrations in flight (`Decision::Migrate` means "this thread migrates it now";
/// the window's in-flight count is resolved by the same thread); connections beyond
/// them wait in the listener's backlog (W).
fn migrator_loop(s: &Shared) {
    let mcfg = MigrateConfig {
        handover: s.cfg.handover,
        hold: s.hold.clone(),
        auth: s.cfg.auth.clone(),
        reply_timeout: MIGRATION_REPLY_MAX,
        ..MigrateConfig::default()
    };
    while !s.stop.load(Ordering::SeqCst) {
        let sock = match s.admission.accept() {
            // An accepted socket is blocking (the listener's flags are not inherited).
            Ok((sock, _)) => sock,
            Err(_) if s.stop.load(Ordering::SeqCst) => break,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                // EMFILE and the like: the connection waits in the backlog.
                log::warn!("specd accept: {e}");
                std::thread::sleep(ACCEPT_ERROR_PAUSE);
                continue;
            }
        };
        let admitted = Instant::now();
        s.stats.accepted.fetch_add(1, Ordering::Relaxed);
        let q = match &s.live {
            // The program diverted this connection because the server's queue was at Q
            // when its SYN came (the paper marks a connection migratory then); a later
            // SYN's reading, published since, does not undo that verdict.
            Some(l) if s.steer_mode.load(Ordering::Relaxed) == STEER_KERNEL => {
                l.backlog().max(s.cfg.window.queue)
            }
            _ => s.server_queue.load(Ordering::Relaxed),
        };
        let decision = window_op(s, |w| w.on_arrival(q));
        if crate::trace::on() {
            let step = match decision {
                Decision::Migrate => "admitted.migrate",
                Decision::Server => "admitted.server",
                Decision::Refuse => "admitted.refuse",
            };
            crate::trace::record(sock.peer_addr().ok(), step, u64::from(q));
        }
        match decision {
            Decision::Migrate if s.cfg.gate_on_peer_load && !peers_have_room(s) => {
                // Every peer read one-sidedly is full: an offer would be refused after a
                // dump. The window closes as on that refusal (without the dump and the
                // offer) and the connection is served here.
                window_op(s, |w| w.on_fell_back(Resolution::NoPeerRoom));
                s.stats.no_peer_room.fetch_add(1, Ordering::Relaxed);
                stay_local(s, &mcfg, sock, true, REOFFERS_MAX);
            }
            Decision::Migrate => migrate_one(s, &mcfg, sock, admitted, REOFFERS_MAX),
            Decision::Server | Decision::Refuse => {
                s.stats.stale_local.fetch_add(1, Ordering::Relaxed);
                // A stale divert: served here, or offered to a peer if the server
                // does not take it in time and the window has room then.
                stay_local(s, &mcfg, sock, false, REOFFERS_MAX);
            }
        }
    }
}

/// Pause after an accept error other than a stop (e.g. out of descriptors) before
/// trying again: the connection stays in the backlog, and a thread retrying at once
/// would spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

fn peers_have_room(s: &Shared) -> bool {
    peers_have_room_for(s, 1)
}

/// Whether some peer's known load (refreshed if older than --peer-poll-us) leaves room
/// for `n` more connections under its admission bound (`--admit-queue-max` of the
/// peers, taken equal to our Q); an unknown load has room (the target decides).
fn peers_have_room_for(s: &Shared, n: u32) -> bool {
    refresh_peer_loads(s);
    let full_at = full_at_for(s.cfg.window.queue, n);
    some_peer_has_room(
        s.peers
            .iter()
            .map(|p| (*lock(&p.load), p.inflight.load(Ordering::Relaxed))),
        full_at,
    )
}

/// The target for `sock`: with [`Affinity`] the request path's peer (unless full),
/// else the least-loaded peer (see [`least_loaded`]). With one peer there is nothing
/// to rank: no region read (a one-sided read per migration is a UDP round trip, a
/// sleep and a wake-up of the migrator, for a load nothing would use).
fn choose_peer<'a>(s: &'a Shared, sock: &TcpStream) -> &'a PeerState {
    if let [only] = s.peers.as_slice() {
        return only;
    }
    refresh_peer_loads(s);
    let cands: Vec<(PeerLoad, u32)> = s
        .peers
        .iter()
        .map(|p| (*lock(&p.load), p.inflight.load(Ordering::Relaxed)))
        .collect();
    let i = match s.cfg.affinity {
        Some(a) if cands.len() > 1 => {
            let hash = peek_path_hash(sock, a.wait);
            if hash.is_some() {
                s.stats.affinity_hashed.fetch_add(1, Ordering::Relaxed);
            }
            choose_with_affinity(hash, &cands, a.full_at)
        }
        _ => least_loaded(cands.into_iter()).expect("validated: at least one peer"),
    };
    &s.peers[i]
}

/// Migrates one admitted connection on the calling migrator (window resolved,
/// counters, fall-back to the local server).
fn migrate_one(
    s: &Shared,
    mcfg: &MigrateConfig,
    sock: TcpStream,
    admitted: Instant,
    offers_left: u32,
) {
    let remote = match sock.peer_addr() {
        Ok(a) => a,
        Err(_) => {
            // The client is already gone: nothing to migrate.
            window_op(s, |w| w.on_resolved(Resolution::NotDumpable));
            return;
        }
    };
    let peer = choose_peer(s, &sock);
    peer.inflight.fetch_add(1, Ordering::Relaxed);
    lock(&s.stats.queue_wait_us).record(admitted.elapsed().as_micros() as u64);
    let cpu0 = farside_rt::thread_cpu_us();
    let outcome = s.control.migrate_with_back(
        sock,
        peer.peer.daemon,
        mcfg,
        || s.flow.move_flow(remote, peer.peer.backend),
        || match s.cfg.own_backend {
            Some(me) => s.flow.move_flow(remote, me),
            None => Ok(()),
        },
    );
    let cpu = farside_rt::thread_cpu_us().saturating_sub(cpu0);
    peer.inflight.fetch_sub(1, Ordering::Relaxed);
    match outcome {
        Outcome::Migrated(t) => {
            crate::trace::record(Some(remote), "migrated", t.total.as_micros() as u64);
            window_op(s, |w| w.on_resolved(Resolution::Migrated));
            record_counted(s, &s.stats.migrated, Event::Migrated);
            peer.migrated.fetch_add(1, Ordering::Relaxed);
            lock(&s.stats.migration_us).record(t.total.as_micros() as u64);
            lock(&s.stats.admit_to_done_us).record(admitted.elapsed().as_micros() as u64);
            lock(&s.stats.dump_us).record(t.dump.as_micros() as u64);
            lock(&s.stats.offer_us).record(t.offer.as_micros() as u64);
            lock(&s.stats.restore_us).record(t.restore.as_micros() as u64);
            lock(&s.stats.flow_us).record(t.flow.as_micros() as u64);
            lock(&s.stats.cpu_us).record(cpu);
        }
        Outcome::ResumedOnSource { sock, reason } => {
            s.stats.fallbacks[fallback_index(&reason)].fetch_add(1, Ordering::Relaxed);
            let r = match &reason {
                Fallback::NotDumpable(_) => Resolution::NotDumpable,
                Fallback::Refused(_) => {
                    peer.refused.fetch_add(1, Ordering::Relaxed);
                    Resolution::Refused
                }
                _ => {
                    peer.failed.fetch_add(1, Ordering::Relaxed);
                    Resolution::TargetFailed
                }
            };
            log::debug!("specd: {remote} stays here: {reason:?}");
            if crate::trace::on() {
                let why = FALLBACK_REASONS[fallback_index(&reason)];
                crate::trace::record(Some(remote), &format!("fell_back.{why}"), 0);
            }
            window_op(s, |w| {
                w.on_fell_back(r);
                w.on_served_locally(1);
            });
            s.stats.fell_back.fetch_add(1, Ordering::Relaxed);
            stay_local(s, mcfg, sock, true, offers_left);
        }
        Outcome::Lost(e) => {
            crate::trace::record(Some(remote), "lost", 0);
            log::warn!(
                "specd: {remote} lost migrating to {}: {e}",
                peer.peer.daemon
            );
            window_op(s, |w| w.on_resolved(Resolution::TargetFailed));
            peer.failed.fetch_add(1, Ordering::Relaxed);
            s.stats.lost.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Puts the server's listener (`cfg.server_port`) in the program's map, taken from its
/// owner; the daemon's copy of the descriptor is closed before returning, so only
/// the server's descriptors keep the listener open. Returns what was taken, for the
/// log.
fn take_server_listener(st: &mut Steering, cfg: &SourceConfig) -> io::Result<String> {
    let (fd, owner) = server_listener(cfg.server_port)?;
    st.use_server_listener(std::os::fd::AsFd::as_fd(&fd), cfg.window.queue, cfg.no_room)?;
    drop(fd);
    let drop_at = match st.refusal() {
        Ok(()) => format!("drop at sk_ack_backlog ≥ {} without room", cfg.window.queue),
        Err(why) => format!("the server's queue without room ({why})"),
    };
    Ok(format!(
        "the listener of port {} (inode {}) taken from pid {} fd {}, divert at sk_ack_backlog + half-open ≥ {}, {drop_at}",
        cfg.server_port, owner.inode, owner.pid, owner.fd, cfg.window.queue
    ))
}

/// Every [`LISTENER_CHECK`]: in kernel mode, whether the server's listener is still in
/// the map (else take the server's new one, or fall back to polling); in poll mode,
/// whether a listener the daemon has not tried yet appeared (a restarted server).
fn check_listener(s: &Shared, st: &mut Steering, tried: &mut Vec<u64>) {
    let port = s.cfg.server_port;
    if !st.kernel_mode_possible() {
        return;
    }
    if s.steer_mode.load(Ordering::Relaxed) == STEER_KERNEL {
        match st.server_listener_present() {
            Ok(true) => return,
            Ok(false) => log::warn!(
                "specd: the server's listener on port {port} left the program's map (the server closed it)"
            ),
            Err(e) => log::warn!("specd: {e}"),
        }
    } else {
        let now = crate::load::listening_inodes(port);
        if now.is_empty() || now == *tried {
            return;
        }
        *tried = now;
    }
    match take_server_listener(st, &s.cfg) {
        Ok(why) => {
            log::info!("specd: steer mode kernel: the program decides per SYN ({why})");
            s.steer_mode.store(STEER_KERNEL, Ordering::Relaxed);
        }
        Err(e) => {
            if s.steer_mode.swap(STEER_POLL, Ordering::Relaxed) == STEER_KERNEL {
                log::warn!(
                    "specd: steer mode poll (every {:?}): the server's listener cannot be put in the program's map: {e}",
                    s.cfg.poll
                );
            }
            *tried = crate::load::listening_inodes(port);
            if let Err(e) = st.use_polling() {
                log::warn!("specd: {e}");
            }
        }
    }
}

/// The poller's view at its last poll: the server's queue and the connections the
/// program had passed to the server.
#[derive(Clone, Copy)]
struct PollBase {
    queue: u32,
    passed: u64,
}

/// One poll: the server's queue; with steering the locally served estimate (for the
/// N-rule) and, in poll mode, the divert flag.
fn poll_once(s: &Shared, queue: &mut ServerQueue, base: &mut Option<PollBase>) {
    let q = match queue.read() {
        Ok(q) => q,
        Err(e) => {
            log::warn!("specd: reading the server's queue: {e}");
            return;
        }
    };
    s.server_queue.store(q, Ordering::Relaxed);
    let mut steering = lock(&s.steering);
    let Some(st) = steering.as_mut() else {
        return;
    };
    // One counter per poll (the summary reads them all).
    let passed = match st.counter(CNT_SERVER) {
        Ok(n) => n,
        Err(e) => {
            log::warn!("specd: {e}");
            return;
        }
    };
    let now = PollBase { queue: q, passed };
    let Some(prev) = base.replace(now) else {
        return;
    };
    let passed = now.passed.saturating_sub(prev.passed);
    // Accepts over the period ≈ passed − queue growth.
    let served = (passed as i64 - (i64::from(q) - i64::from(prev.queue))).max(0) as u64;
    // Gated: while closed, the peers' loads (read one-sidedly, at most one read per
    // --peer-poll-us each) reopen the window once one has room for a whole window.
    let peer_room = s.cfg.gate_on_peer_load
        && !lock(&s.window).is_open()
        && peers_have_room_for(s, s.cfg.window.window);
    let diverts = window_op(s, |w| {
        if served > 0 {
            w.on_served_locally(served);
        }
        if peer_room {
            w.on_peer_room();
        }
        w.diverts(q)
    });
    if st.mode() == Mode::Poll {
        let divert = diverts && (!s.cfg.gate_on_peer_load || peers_have_room(s));
        if let Err(e) = st.set_divert(divert) {
            log::warn!("specd: {e}");
        }
    }
}

/// The poller. Poll mode (and no steering): a poll every `--poll-us`. Kernel mode:
/// polls only while the window is closed (the N-rule counts locally served
/// requests); while it is open the thread sleeps until the window closes, waking every
/// [`LISTENER_CHECK`] to check the server's listener.
fn poller_loop(s: &Shared, mut queue: ServerQueue) {
    let mut base = None;
    poll_once(s, &mut queue, &mut base);
    let mut next_check = Instant::now() + LISTENER_CHECK;
    let mut tried = Vec::new();
    while !s.stop.load(Ordering::SeqCst) {
        let kernel = || s.steer_mode.load(Ordering::Relaxed) == STEER_KERNEL;
        let open = lock(&s.window).is_open();
        if kernel() && open {
            base = None;
            let w = lock(&s.window);
            let timeout = next_check.saturating_duration_since(Instant::now());
            let waited = s.poller_wake.wait_timeout_while(w, timeout, |w| {
                w.is_open() && !s.stop.load(Ordering::SeqCst)
            });
            drop(waited.unwrap_or_else(|e| e.into_inner()));
        } else if base.is_some() || !kernel() {
            std::thread::sleep(s.cfg.poll);
        }
        if s.stop.load(Ordering::SeqCst) {
            break;
        }
        if Instant::now() >= next_check {
            next_check = Instant::now() + LISTENER_CHECK;
            if let Some(st) = lock(&s.steering).as_mut() {
                check_listener(s, st, &mut tried);
            }
        }
        if kernel() && lock(&s.window).is_open() {
            continue;
        }
        poll_once(s, &mut queue, &mut base);
    }
    // Leave new connections to the server while the program is still attached.
    if let Some(st) = lock(&s.steering).as_mut() {
        if let Ok(c) = st.counters() {
            *lock(&s.steer_counts) = c;
        }
        if let Err(e) = st.use_polling() {
            log::warn!("specd: {e}");
        }
    }
}

/// Reads the peers' loads whose last read is older than `--peer-poll-us` (one
/// one-sided region read each; a peer another thread is reading keeps its cached
/// load). Called when a migration chooses its target: no timer thread.
fn refresh_peer_loads(s: &Shared) {
    refresh_loads(&s.peers, s.cfg.peer_poll);
}

/// [`refresh_peer_loads`] of `peers`, reusing loads younger than `max_age`.
fn refresh_loads(peers: &[PeerState], max_age: Duration) {
    for p in peers {
        let Some(region) = &p.peer.region else {
            continue;
        };
        let Ok(mut r) = p.region.try_lock() else {
            continue;
        };
        if r.read_at.is_some_and(|t| t.elapsed() < max_age) {
            continue;
        }
        r.read_at = Some(Instant::now());
        if r.client.is_none() {
            let t = farside_rmem::Target::parse(region).expect("validated at parse");
            match connect_target(&t, &ClientOptions::default()) {
                Ok(client) => r.client = Some(client),
                Err(e) => {
                    log::debug!("specd: region {region}: {e}");
                    lock(&p.load).known = false;
                    continue;
                }
            }
        }
        let RegionReader { client, buf, .. } = &mut *r;
        buf.resize(SNAPSHOT_BYTES, 0);
        let client = client.as_mut().expect("connected above");
        let read = client
            .read(0, buf)
            .map_err(|e| e.to_string())
            .and_then(|()| Snapshot::decode(buf).map_err(|e| e.to_string()));
        let mut l = lock(&p.load);
        match read {
            Ok(snap) => {
                *l = PeerLoad {
                    known: true,
                    accept_backlog: snap.load.accept_backlog,
                    cpu_util_ppm: snap.load.cpu_util_ppm,
                }
            }
            Err(e) => {
                log::debug!("specd: region {region}: {e}");
                l.known = false;
            }
        }
    }
}

fn notified_loop(s: &Shared, sock: &UdpSocket) {
    let mut b = [0u8; 64];
    while !s.stop.load(Ordering::SeqCst) {
        // None: the stop's shutdown woke the read (no sender); the loop sees `stop`.
        let Ok(Some((n, from))) = crate::notify::recv(sock, &mut b) else {
            continue;
        };
        let from_peer = s
            .peers
            .iter()
            .any(|p| p.peer.daemon.ip() == from.ip() || p.peer.backend == from.ip());
        if !from_peer || !crate::notify::is_can_take(&b[..n]) {
            log::debug!("specd: ignored a datagram from {from}");
            continue;
        }
        s.stats.notifications.fetch_add(1, Ordering::Relaxed);
        window_op(s, |w| w.on_notification());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(known: bool, backlog: u64, cpu: u64) -> PeerLoad {
        PeerLoad {
            known,
            accept_backlog: backlog,
            cpu_util_ppm: cpu,
        }
    }

    fn peer_state(region: Option<String>) -> PeerState {
        PeerState::new(Peer {
            daemon: "127.0.0.1:1".parse().unwrap(),
            region,
            backend: "127.0.0.1".parse().unwrap(),
        })
    }

    #[test]
    fn peer_loads_are_read_on_demand_and_reused_while_young() {
        use farside_region::{Header, LoadRecord, MappedWords, RegionWriter, REGION_WORDS};
        let path =
            std::env::temp_dir().join(format!("farside-specd-peer-{}.region", std::process::id()));
        let mut w = RegionWriter::init(
            MappedWords::create_file(&path, REGION_WORDS).unwrap(),
            Header {
                node_id: 2,
                generation: 1,
                period_us: 1000,
                watched_ports: [80, 0, 0, 0],
            },
        );
        let publish = |w: &mut RegionWriter<MappedWords>, backlog| {
            w.publish(&LoadRecord {
                accept_backlog: backlog,
                ..LoadRecord::default()
            })
        };
        publish(&mut w, 7);
        let peers = [
            peer_state(Some(format!("shm:{}", path.display()))),
            peer_state(None),
            peer_state(Some("tcp:127.0.0.1:1".into())),
        ];
        assert!(!lock(&peers[0].load).known, "nothing read before a choice");
        refresh_loads(&peers, Duration::from_secs(3600));
        let l = *lock(&peers[0].load);
        assert!(l.known && l.accept_backlog == 7, "{l:?}");
        assert!(!lock(&peers[1].load).known, "no region: unknown");
        assert!(!lock(&peers[2].load).known, "unreachable region: unknown");
        // Younger than the bound: the cached load, no read.
        publish(&mut w, 9);
        refresh_loads(&peers, Duration::from_secs(3600));
        assert_eq!(lock(&peers[0].load).accept_backlog, 7);
        // Older: read again.
        refresh_loads(&peers, Duration::ZERO);
        assert_eq!(lock(&peers[0].load).accept_backlog, 9);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn request_paths_are_read_from_complete_request_lines_only() {
        assert_eq!(
            request_path(b"GET /a/b.html HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(&b"/a/b.html"[..])
        );
        assert_eq!(request_path(b"POST /up HTTP/1.0\r\n"), Some(&b"/up"[..]));
        assert_eq!(request_path(b"GET /a/b.html HTTP/1.1"), None, "no CRLF yet");
        assert_eq!(request_path(b"GET /a HTTP/2\r\n"), None);
        assert_eq!(request_path(b"GET  HTTP/1.1\r\n"), None);
        assert_eq!(request_path(b"GET /a HTTP/1.1 x\r\n"), None);
        assert_eq!(request_path(b"\r\n"), None);
    }

    #[test]
    fn the_peek_leaves_the_request_in_the_receive_queue() {
        use std::io::{Read, Write};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        // Nothing sent yet: no path within the wait.
        assert_eq!(peek_path_hash(&s, Duration::from_millis(1)), None);
        let req = b"GET /a.html HTTP/1.1\r\nHost: x\r\n\r\n";
        c.write_all(req).unwrap();
        assert_eq!(
            peek_path_hash(&s, Duration::from_secs(5)),
            Some(path_hash(b"/a.html"))
        );
        let mut got = vec![0u8; req.len()];
        (&s).read_exact(&mut got).unwrap();
        assert_eq!(&got[..], &req[..], "the request is still there, whole");
    }

    #[test]
    fn equal_paths_go_to_one_peer_unless_it_is_full() {
        let free = (load(true, 3, 0), 0);
        let unknown = (load(false, 0, 0), 0);
        let full = (load(true, 60, 0), 4);
        let h = path_hash(b"/index.html");
        assert_eq!(h, path_hash(b"/index.html"), "stable");
        assert_ne!(h, path_hash(b"/other.html"));
        let cands = [free, free, free];
        let i = choose_with_affinity(Some(h), &cands, 64);
        assert_eq!(i, (h % 3) as usize);
        // Same path, same peer, whatever the loads of the others.
        let mut other = cands;
        other[(i + 1) % 3] = (load(true, 0, 0), 0);
        assert_eq!(choose_with_affinity(Some(h), &other, 64), i);
        // An unknown load is not full: the path's peer keeps it.
        let mut unk = cands;
        unk[i] = unknown;
        assert_eq!(choose_with_affinity(Some(h), &unk, 64), i);
        // Its peer full (60 + 4 in flight = 64): the least-loaded instead.
        let mut f = cands;
        f[i] = full;
        f[(i + 2) % 3] = (load(true, 1, 0), 0);
        assert_eq!(choose_with_affinity(Some(h), &f, 64), (i + 2) % 3);
        // No path: least-loaded.
        assert_eq!(choose_with_affinity(None, &f, 64), (i + 2) % 3);
    }

    #[test]
    fn room_for_a_whole_window_leaves_the_window_under_the_bound() {
        let c = |backlog: u64, n: u32| {
            some_peer_has_room(
                [(load(true, backlog, 0), 0)].into_iter(),
                full_at_for(64, n),
            )
        };
        assert!(c(32, 32), "32 + 32 = 64: fits");
        assert!(!c(33, 32), "33 + 32 > 64");
        assert!(c(63, 1) && !c(64, 1));
        assert_eq!(full_at_for(64, 0), 64, "n = 0 is read as 1");
        assert_eq!(
            full_at_for(8, 32),
            0,
            "a window larger than the bound never fits"
        );
    }

    #[test]
    fn a_peer_has_room_unless_its_known_load_is_full() {
        let c = |v: &[(PeerLoad, u32)]| some_peer_has_room(v.iter().copied(), 64);
        assert!(c(&[(load(false, 0, 0), 0)]), "unknown: the target decides");
        assert!(c(&[(load(true, 63, 0), 0)]));
        assert!(!c(&[(load(true, 63, 0), 1)]), "63 + 1 in flight = 64");
        assert!(!c(&[(load(true, 64, 0), 0), (load(true, 70, 0), 0)]));
        assert!(c(&[(load(true, 64, 0), 0), (load(true, 10, 0), 0)]));
        assert!(!c(&[]));
    }

    #[test]
    fn the_least_loaded_peer_is_chosen() {
        // By backlog.
        let c = [(load(true, 5, 0), 0), (load(true, 2, 900_000), 0)];
        assert_eq!(least_loaded(c.into_iter()), Some(1));
        // Migrations in flight count as backlog.
        let c = [(load(true, 5, 0), 0), (load(true, 2, 0), 4)];
        assert_eq!(least_loaded(c.into_iter()), Some(0));
        // Equal backlog: by CPU.
        let c = [(load(true, 3, 700_000), 0), (load(true, 3, 200_000), 0)];
        assert_eq!(least_loaded(c.into_iter()), Some(1));
        // An unknown load ranks after any known one.
        let c = [(load(false, 0, 0), 0), (load(true, 60, 999_000), 0)];
        assert_eq!(least_loaded(c.into_iter()), Some(1));
        // All unknown: the first, then the one with fewer in flight.
        let c = [(load(false, 0, 0), 1), (load(false, 0, 0), 0)];
        assert_eq!(least_loaded(c.into_iter()), Some(1));
        assert_eq!(least_loaded(std::iter::empty()), None);
    }
}
