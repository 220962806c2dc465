//! The hand-over between a source and a target daemon over TCP.
//!
//! ```text
//! source                                   target
//!   freeze + dump ── fails ──> ResumedOnSource(NotDumpable), socket untouched
//!   CloseBeforeRestore:
//!     OFFER(state) ──────────────────────>   admit(state)?
//!                 <───────────── ACCEPT | REFUSE(reason)
//!     REFUSE / timeout / EOF ──> resume (repair off): ResumedOnSource
//!     hold the flow (sk_lookup black hole, crate::hold), close source silently
//!     COMMIT       ──────────────────────>   restore(state)
//!   CloseAfterRestore (the source holds its frozen socket until RESTORED):
//!     OFFER_COMMIT(state) ───────────────>   admit(state)? then restore(state)
//!                 <───────────── REFUSE(reason) | RESTORED | FAILED(reason)
//!   then:         <───────────── RESTORED | FAILED(reason)
//!   RESTORED: move_flow() (front-end entry → target)
//!     ok:  DONE ──────────────────────>   release the copy (repair off)
//!                 <───────────── RELEASED   then hand the fd to the local server
//!                                          (RELEASED not written: copy closed silently)
//!          [CloseAfterRestore: close source silently] ──> Migrated
//!          FAILED / timeout / EOF instead of RELEASED: move_back() (the flow
//!          returns to the source), then as below
//!     err: ABORT ─────────────────────>   close the restored copy silently
//!                 <───────────── FAILED("aborted")
//!   FAILED / timeout / EOF / ABORT sent:
//!     CloseAfterRestore:  resume the frozen source socket
//!     CloseBeforeRestore: restore the dump locally on a new socket
//!     ──> ResumedOnSource
//!   CloseBeforeRestore: the hold ends on every outcome, after the restore (target's
//!   or local) or the loss
//! ```
//!
//! Every wait is bounded ([`MigrateConfig`]); a target that is unreachable, refuses,
//! dies or stalls costs the client at most those bounds plus one retransmission.
//!
//! **Control connections are reused** (wire version 2): a source that migrates through
//! a [`ControlPool`] keeps the connection to each target after a hand-over that ended
//! cleanly (REFUSE, RELEASED, FAILED) and sends its next OFFER on it, instead of paying a
//! connect, an accept, two closes and a TIME_WAIT per migration. The target serves
//! offers on a connection one after the other ([`ControlConn`]) and closes it after
//! [`CONTROL_IDLE_TIMEOUT`] without one. A pooled connection found dead before or
//! during its OFFER (the target restarted or timed it out) is replaced by a fresh one
//! once. Resending is safe: nothing happens on a target before COMMIT, and a copy
//! restored for an OFFER_COMMIT is discarded unless DONE follows on the same
//! connection (so at most one copy is ever released).

use std::io::{self, BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::bufs::Recycled;
use crate::drain::{DrainStats, Reaper, DRAIN_PENDING_DEFAULT, DRAIN_PENDING_MAX};
use crate::dump::{close_frozen, freeze_and_dump, resume};
use crate::error::DumpError;
use crate::hold::{FlowHold, Held};
use crate::restore::{restore, restore_frozen};
use crate::state::TcpState;
use crate::sys;
use crate::wire::{
    decode_header, encode, encode_auth, read_authentic_after, read_authentic_header,
    read_message_after, read_message_auth, reason, write_message_auth, write_offer,
    write_offer_auth, write_offer_commit, Auth, Message, HEADER_BYTES,
};

/// Default bound on connecting to the target: it is on the cluster network, a few
/// hops away; one that needs a second to accept is too loaded to take connections.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);
/// Default bound on each reply (ACCEPT/REFUSE, RESTORED/FAILED) and each write: the
/// client's segments are dropped while the connection is frozen, so this is also the
/// longest extra stall a silent target can cause.
pub const REPLY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);

/// Default time the source keeps its frozen socket after the flow was moved, before
/// closing it: segments the client sent before the flip may still be in flight to the
/// source, and a source without the socket answers them with RST (seen in the
/// cross-namespace test). One LAN round trip is well under a millisecond; 50 ms also
/// covers softirq delays on a loaded host.
pub const FLOW_DRAIN_DEFAULT: Duration = Duration::from_millis(50);

/// How long a target keeps a control connection without an OFFER before closing it:
/// each open connection holds one of the target's serving threads, so an idle source
/// must give it back; 3 s spans the pauses between migrations of a busy source.
pub const CONTROL_IDLE_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest a [`ControlPool`] reuses a connection that sat idle: well below
/// [`CONTROL_IDLE_TIMEOUT`], so the source drops it before the target does.
pub const POOL_IDLE_MAX: Duration = Duration::from_secs(1);
/// Default most idle connections a [`ControlPool`] keeps per target: about the
/// migrations a source runs at once to one target in the lab's 75/25 pair (a few
/// hundred per second at ~1 ms each); more in flight at once are opened and closed
/// as before. Each idle connection holds one target thread for at most
/// [`POOL_IDLE_MAX`].
pub const POOL_IDLE_PER_TARGET_DEFAULT: usize = 8;
/// Upper bound of a pool's per-target bound (a target serves at most 64 connections
/// at once: `farside specd --target-threads`).
pub const POOL_IDLE_PER_TARGET_MAX: usize = 64;
/// Longest a target waits for one whole message, first byte to last (OFFER,
/// OFFER_COMMIT, COMMIT, DONE, ABORT): the per-`recv` bound alone lets a peer that
/// trickles a byte now and then hold a serving thread indefinitely. The largest
/// state (two 32 MiB queues) crosses a 1 Gbit/s link in about 0.6 s.
pub const MESSAGE_DEADLINE_DEFAULT: Duration = Duration::from_secs(4);
/// How long a target keeps a restored, frozen copy for the source's DONE or ABORT:
/// between RESTORED and DONE the source moves the front-end's flow, whose MOVE is
/// bounded by 1 s and retried (about 4 s seen), so the reply timeout alone (2 s) made
/// the target drop copies the source then counted migrated.
pub const VERDICT_WAIT_DEFAULT: Duration = Duration::from_secs(8);
/// Default budget of OFFER payload bytes a process's targets hold at once (read or
/// being restored): each offer reserves its announced length before its bytes are
/// read and gives it back when it ends; an offer that does not fit is refused and
/// its connection closed. 256 MiB holds a thousand lab-sized states (≤ 200 KiB) or
/// four of the largest.
pub const OFFER_BUDGET_BYTES_DEFAULT: usize = 256 << 20;
/// The target's read buffer per control connection: one `recv` takes a reply or an
/// OFFER's header and fixed fields (≤ 120 bytes) and the start of its queues; larger
/// reads bypass it.
const CONTROL_READ_BUF_BYTES: usize = 4 << 10;

/// When the source socket is closed relative to the target's restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// Source and target share a network namespace (tests, or two daemons on one
    /// host): the restore would collide with the source's 4-tuple, so the source is
    /// closed silently *before* COMMIT; on failure the source restores its own dump.
    /// From the close until a socket has the 4-tuple again the flow is held
    /// ([`crate::hold`], [`MigrateConfig::hold`]): the client's segments are dropped
    /// silently, not answered with a RST by the service's listener.
    CloseBeforeRestore,
    /// Different hosts/namespaces (the deployment): the source keeps the frozen
    /// socket until RESTORED, so the fall-back is simply repair off.
    CloseAfterRestore,
}

/// Slack of a flow hold's deadline over the hand-over's own bounds (a `move_flow` and
/// the local re-restore are not bounded by [`MigrateConfig::reply_timeout`]; the
/// front-end's move is bounded by 1 s and a retry).
pub const HOLD_TTL_SLACK: Duration = Duration::from_secs(3);
/// Replies a held hand-over waits for at most (RESTORED, then FAILED after an ABORT):
/// with [`HOLD_TTL_SLACK`], a hold's deadline; the hold is removed when the migration
/// ends, the deadline only bounds a hold that was not.
const HOLD_TTL_REPLIES: u32 = 2;

/// Bounds and mode of one migration.
#[derive(Clone, Debug)]
pub struct MigrateConfig {
    /// See [`Handover`]. Default: `CloseAfterRestore`.
    pub handover: Handover,
    /// Bound on connecting to the target. Default [`CONNECT_TIMEOUT_DEFAULT`].
    pub connect_timeout: Duration,
    /// Bound on each reply and write. Default [`REPLY_TIMEOUT_DEFAULT`].
    pub reply_timeout: Duration,
    /// With [`Handover::CloseAfterRestore`]: how long the source stays frozen after
    /// the flow was moved, so in-flight segments are dropped rather than reset.
    /// Default [`FLOW_DRAIN_DEFAULT`]. Through a [`ControlPool`] the pool's reaper
    /// keeps the socket this long and the migration returns at once; [`migrate_with`]
    /// without a pool sleeps it before returning.
    pub flow_drain: Duration,
    /// With [`Handover::CloseBeforeRestore`]: the flow hold attached to the
    /// namespace (keep one per daemon: [`FlowHold::attach`]). `None` (the default):
    /// each such migration attaches a hold of its own before its freeze (a program
    /// load, tens of milliseconds), or, if that fails (no CAP_BPF), runs unheld with
    /// a warning.
    /// Unused with [`Handover::CloseAfterRestore`].
    pub hold: Option<Arc<FlowHold>>,
    /// The authenticated framing (wire version 3) with this key; `None` (the
    /// default): unauthenticated (version 2). The target must agree.
    pub auth: Option<Arc<Auth>>,
}

impl Default for MigrateConfig {
    fn default() -> Self {
        Self {
            handover: Handover::CloseAfterRestore,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            reply_timeout: REPLY_TIMEOUT_DEFAULT,
            flow_drain: FLOW_DRAIN_DEFAULT,
            hold: None,
            auth: None,
        }
    }
}

/// Why a connection stayed on (or came back to) the source.
#[derive(Debug)]
pub enum Fallback {
    /// The state could not be fully dumped: the connection was never offered.
    NotDumpable(DumpError),
    /// The target could not be reached within the bound.
    TargetUnreachable(io::Error),
    /// The target refused the offer.
    Refused(String),
    /// The target reported a failed restore.
    RestoreFailed(String),
    /// The target closed, stalled or spoke garbage.
    TargetGone(io::Error),
    /// The target restored, but the front-end's flow entry could not be moved
    /// (`move_flow` failed): the target was told to ABORT.
    FlowNotMoved(io::Error),
}

/// Timings of one migration, measured on the source.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    /// Freeze and dump.
    pub dump: Duration,
    /// From freeze to DONE, the flow moved (the client's worst stall is this plus
    /// its retransmission timeout); excludes the source's flow drain.
    pub total: Duration,
    /// Bytes of state shipped (both queues included).
    pub state_bytes: usize,
    /// Connecting to the target (or reusing a pooled connection) and OFFER until
    /// ACCEPT: the state's transfer and the target's admission. With
    /// [`Handover::CloseAfterRestore`] the OFFER carries the COMMIT (OFFER_COMMIT), so
    /// this runs until RESTORED and includes the target's restore.
    pub offer: Duration,
    /// COMMIT until RESTORED (the target's restore); zero with
    /// [`Handover::CloseAfterRestore`], whose restore is inside `offer`.
    pub restore: Duration,
    /// The flow move (`move_flow`) until DONE is written.
    pub flow: Duration,
}

/// What [`migrate`] did.
#[derive(Debug)]
pub enum Outcome {
    /// The target restored the connection; the source's socket is closed silently.
    Migrated(Timings),
    /// The connection continues on the source: `sock` is the original socket thawed,
    /// or (after [`Handover::CloseBeforeRestore`]) the dump restored locally.
    ResumedOnSource {
        /// The connection, ready to use.
        sock: TcpStream,
        /// Why it did not move.
        reason: Fallback,
    },
    /// The connection is gone (the client will time out): with
    /// [`Handover::CloseBeforeRestore`] neither the target nor the local re-restore
    /// succeeded. (A DONE the target does not acknowledge, RELEASED, is not a loss:
    /// the flow is taken back and the connection resumes on the source.)
    Lost(io::Error),
}

fn state_bytes(st: &TcpState) -> usize {
    st.send_queue.len() + st.recv_queue.len()
}

fn exchange(ctrl: &mut TcpStream, msg: &Message, cfg: &MigrateConfig) -> io::Result<Message> {
    let auth = cfg.auth.as_deref();
    write_message_auth(ctrl, msg, auth)?;
    read_reply(ctrl, auth, cfg.reply_timeout)
}

/// OFFER (or OFFER_COMMIT, `commit`) and its answer.
fn exchange_offer(
    ctrl: &mut TcpStream,
    st: &TcpState,
    commit: bool,
    cfg: &MigrateConfig,
) -> io::Result<Message> {
    let auth = cfg.auth.as_deref();
    match (auth, commit) {
        (Some(a), _) => write_offer_auth(ctrl, st, commit, a)?,
        (None, true) => write_offer_commit(ctrl, st)?,
        (None, false) => write_offer(ctrl, st)?,
    }
    read_reply(ctrl, auth, cfg.reply_timeout)
}

fn open_control(target: SocketAddr, cfg: &MigrateConfig) -> io::Result<TcpStream> {
    let c = TcpStream::connect_timeout(&target, cfg.connect_timeout)?;
    c.set_read_timeout(Some(cfg.reply_timeout))?;
    c.set_write_timeout(Some(cfg.reply_timeout))?;
    c.set_nodelay(true)?;
    Ok(c)
}

/// Errors that mean a reused connection was already dead (closed or reset by the
/// target) rather than a slow or refusing target.
fn is_stale(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected
    )
}

/// Whether an idle control connection is still usable: nothing to read (no EOF, no
/// reset, no stray bytes). One non-blocking peek.
fn idle_alive(c: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    match sys::recv(c.as_raw_fd(), &mut b, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        Ok(_) => false,
    }
}

struct IdleConn {
    target: SocketAddr,
    conn: TcpStream,
    since: Instant,
    /// The read/write timeout set on it.
    timeout: Duration,
}

/// Control connections kept open between migrations, per target (wire version 2).
/// Shared by the threads that migrate (all methods take `&self`).
///
/// The pool also drains the flows of its migrations ([`crate::drain`]): with
/// [`Handover::CloseAfterRestore`] the migrated source socket is handed, frozen, to the
/// pool's [`Reaper`] (one thread, started at the first migration that needs it) and
/// closed silently once [`MigrateConfig::flow_drain`] has passed, so
/// [`ControlPool::migrate_with`] returns without sleeping through the drain. When the
/// reaper's queue is full the migrating thread sleeps and closes inline, as
/// [`migrate_with`] without a pool always does. Dropping the pool closes every socket
/// still draining (silently).
pub struct ControlPool {
    idle: Mutex<Vec<IdleConn>>,
    per_target_max: usize,
    opened: AtomicU64,
    reused: AtomicU64,
    stale: AtomicU64,
    /// The flow-drain queue's bound.
    drain_max: usize,
    /// Started at the first deferred socket; `None` inside: it could not be started
    /// (the pool drains inline).
    reaper: OnceLock<Option<Reaper>>,
    /// Sockets drained inline (queue full, or no reaper).
    drain_inline: AtomicU64,
}

impl Default for ControlPool {
    fn default() -> Self {
        Self::new(POOL_IDLE_PER_TARGET_DEFAULT).expect("the default bound is in range")
    }
}

impl ControlPool {
    /// A pool keeping at most `idle_per_target_max` idle connections per target
    /// (1..=[`POOL_IDLE_PER_TARGET_MAX`]).
    pub fn new(idle_per_target_max: usize) -> io::Result<Self> {
        Self::with_drain(idle_per_target_max, DRAIN_PENDING_DEFAULT)
    }

    /// [`ControlPool::new`] with a flow-drain queue of at most `drain_pending_max`
    /// sockets (1..=[`DRAIN_PENDING_MAX`]; default [`DRAIN_PENDING_DEFAULT`]).
    pub fn with_drain(idle_per_target_max: usize, drain_pending_max: usize) -> io::Result<Self> {
        if !(1..=DRAIN_PENDING_MAX).contains(&drain_pending_max) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "flow-drain queue bound must be in 1..={DRAIN_PENDING_MAX}, got {drain_pending_max}"
                ),
            ));
        }
        if !(1..=POOL_IDLE_PER_TARGET_MAX).contains(&idle_per_target_max) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "idle control connections per target must be in 1..={POOL_IDLE_PER_TARGET_MAX}, got {idle_per_target_max}"
                ),
            ));
        }
        Ok(Self {
            idle: Mutex::new(Vec::new()),
            per_target_max: idle_per_target_max,
            opened: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            stale: AtomicU64::new(0),
            drain_max: drain_pending_max,
            reaper: OnceLock::new(),
            drain_inline: AtomicU64::new(0),
        })
    }

    /// The flow drain's counters: sockets deferred to the reaper, drained inline,
    /// closed after their drain, pending now.
    pub fn drain_stats(&self) -> DrainStats {
        let mut st = match self.reaper.get() {
            Some(Some(r)) => r.stats(),
            _ => DrainStats::default(),
        };
        st.inline = self.drain_inline.load(Ordering::Relaxed);
        st
    }

    /// Keeps the frozen, migrated `sock` for `drain` and then closes it silently:
    /// through the reaper, else (queue full, no reaper) here, sleeping.
    fn drain(&self, sock: TcpStream, drain: Duration) {
        let reaper = self.reaper.get_or_init(|| {
            Reaper::start(self.drain_max)
                .inspect_err(|e| log::warn!("migrate: no flow-drain thread ({e}): draining inline"))
                .ok()
        });
        let sock = match reaper {
            Some(r) => match r.defer(sock, Instant::now() + drain) {
                Ok(()) => return,
                Err(sock) => sock,
            },
            None => sock,
        };
        self.drain_inline.fetch_add(1, Ordering::Relaxed);
        drain_inline(sock, drain);
    }

    /// Connections opened (connects that succeeded).
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Migrations that reused an idle connection.
    pub fn reused(&self) -> u64 {
        self.reused.load(Ordering::Relaxed)
    }

    /// Idle connections found dead (closed by the target, expired, or failing at
    /// their OFFER) and replaced.
    pub fn stale(&self) -> u64 {
        self.stale.load(Ordering::Relaxed)
    }

    /// Idle connections held now.
    pub fn idle(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<IdleConn>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`migrate_with`] over a pooled control connection to `target`.
    pub fn migrate_with(
        &self,
        sock: TcpStream,
        target: SocketAddr,
        cfg: &MigrateConfig,
        move_flow: impl FnOnce() -> io::Result<()>,
    ) -> Outcome {
        migrate_inner(sock, target, cfg, Some(self), move_flow, || Ok(()))
    }

    /// [`migrate_with_back`] over a pooled control connection to `target`.
    pub fn migrate_with_back(
        &self,
        sock: TcpStream,
        target: SocketAddr,
        cfg: &MigrateConfig,
        move_flow: impl FnOnce() -> io::Result<()>,
        move_back: impl FnOnce() -> io::Result<()>,
    ) -> Outcome {
        migrate_inner(sock, target, cfg, Some(self), move_flow, move_back)
    }

    /// An idle connection to `target` that still looks alive, newest first.
    fn take_idle(&self, target: SocketAddr, cfg: &MigrateConfig) -> Option<TcpStream> {
        // Bounded: each pass removes one entry.
        loop {
            let c = {
                let mut idle = self.lock();
                let i = idle.iter().rposition(|c| c.target == target)?;
                idle.remove(i)
            };
            if c.since.elapsed() > POOL_IDLE_MAX || !idle_alive(&c.conn) {
                self.stale.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if c.timeout != cfg.reply_timeout {
                let set = c
                    .conn
                    .set_read_timeout(Some(cfg.reply_timeout))
                    .and_then(|()| c.conn.set_write_timeout(Some(cfg.reply_timeout)));
                if set.is_err() {
                    continue;
                }
            }
            self.reused.fetch_add(1, Ordering::Relaxed);
            return Some(c.conn);
        }
    }

    fn open(&self, target: SocketAddr, cfg: &MigrateConfig) -> io::Result<TcpStream> {
        let c = open_control(target, cfg)?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(c)
    }

    /// Keeps `conn` (its last hand-over ended cleanly) unless `target` has enough.
    fn give_back(&self, target: SocketAddr, conn: TcpStream, cfg: &MigrateConfig) {
        let mut idle = self.lock();
        if idle.iter().filter(|c| c.target == target).count() < self.per_target_max {
            idle.push(IdleConn {
                target,
                conn,
                since: Instant::now(),
                timeout: cfg.reply_timeout,
            });
        }
    }
}

/// Where a migration's control connection comes from and goes back to.
struct Control<'a> {
    pool: Option<&'a ControlPool>,
    target: SocketAddr,
    cfg: &'a MigrateConfig,
}

impl Control<'_> {
    /// A connection and whether it was reused.
    fn get(&self) -> io::Result<(TcpStream, bool)> {
        match self.pool {
            Some(p) => match p.take_idle(self.target, self.cfg) {
                Some(c) => Ok((c, true)),
                None => p.open(self.target, self.cfg).map(|c| (c, false)),
            },
            None => open_control(self.target, self.cfg).map(|c| (c, false)),
        }
    }

    /// The OFFER exchange; a reused connection that turns out dead is replaced by a
    /// fresh one, once.
    fn offer(
        &self,
        st: &TcpState,
        commit: bool,
    ) -> Result<(TcpStream, io::Result<Message>), Fallback> {
        let (mut ctrl, reused) = self.get().map_err(Fallback::TargetUnreachable)?;
        let reply = exchange_offer(&mut ctrl, st, commit, self.cfg);
        match (&reply, self.pool) {
            (Err(e), Some(p)) if reused && is_stale(e) => {
                p.stale.fetch_add(1, Ordering::Relaxed);
                let mut ctrl = p
                    .open(self.target, self.cfg)
                    .map_err(Fallback::TargetUnreachable)?;
                let reply = exchange_offer(&mut ctrl, st, commit, self.cfg);
                Ok((ctrl, reply))
            }
            _ => Ok((ctrl, reply)),
        }
    }

    /// The hand-over on `ctrl` ended cleanly: keep it for the next one.
    fn done(&self, ctrl: TcpStream) {
        if let Some(p) = self.pool {
            p.give_back(self.target, ctrl, self.cfg);
        }
    }
}

/// The flow drain in the migrating thread: sleeps `drain` (frozen: input dropped),
/// then closes silently.
fn drain_inline(sock: TcpStream, drain: Duration) {
    if !drain.is_zero() {
        std::thread::sleep(drain);
    }
    close_frozen(sock);
}

fn resumed(sock: TcpStream, st: &TcpState, reason: Fallback) -> Outcome {
    if let Err(e) = resume(&sock, st) {
        // Thawing failed: the socket stays frozen and the client would stall; report
        // it, the caller still owns the socket and can close it.
        log::error!("migrate: resuming on the source failed: {e}");
    }
    Outcome::ResumedOnSource { sock, reason }
}

/// Migrates the connection `sock` to the daemon at `target`, with no flow entry to
/// move (same host, or steering that follows the socket).
pub fn migrate(sock: TcpStream, target: SocketAddr, cfg: &MigrateConfig) -> Outcome {
    migrate_with(sock, target, cfg, || Ok(()))
}

/// Migrates the connection `sock` to the daemon at `target`. `move_flow` runs after
/// the target has restored the connection and before the source socket is closed: it
/// points the front-end's flow entry at the target. If it fails, the target is told
/// to ABORT and the connection resumes on the source.
///
/// Never loses the connection except in the cases [`Outcome::Lost`] names; a
/// connection whose state could not be fully dumped is never offered.
pub fn migrate_with(
    sock: TcpStream,
    target: SocketAddr,
    cfg: &MigrateConfig,
    move_flow: impl FnOnce() -> io::Result<()>,
) -> Outcome {
    migrate_inner(sock, target, cfg, None, move_flow, || Ok(()))
}

/// [`migrate_with`], and `move_back` points the flow at the source again when the
/// target did not acknowledge DONE (it answered FAILED, or nothing): the connection
/// then resumes on the source.
pub fn migrate_with_back(
    sock: TcpStream,
    target: SocketAddr,
    cfg: &MigrateConfig,
    move_flow: impl FnOnce() -> io::Result<()>,
    move_back: impl FnOnce() -> io::Result<()>,
) -> Outcome {
    migrate_inner(sock, target, cfg, None, move_flow, move_back)
}

fn migrate_inner(
    sock: TcpStream,
    target: SocketAddr,
    cfg: &MigrateConfig,
    pool: Option<&ControlPool>,
    move_flow: impl FnOnce() -> io::Result<()>,
    move_back: impl FnOnce() -> io::Result<()>,
) -> Outcome {
    // CloseBeforeRestore's hold: one attached for this migration alone if the config
    // has none (before the freeze: the load takes milliseconds the client must not
    // wait for), and the held 4-tuple, released (declared after) first.
    let own_hold = match (cfg.handover, &cfg.hold) {
        (Handover::CloseBeforeRestore, None) => FlowHold::attach()
            .inspect_err(|e| log::warn!("migrate: {e}; this migration's flow is not held"))
            .ok(),
        _ => None,
    };
    let mut _held: Option<Held<'_>> = None;
    let t0 = Instant::now();
    let st = match freeze_and_dump(&sock) {
        // Its queue buffers go back to this thread's spares at the end.
        Ok(st) => Recycled(st),
        Err(e) => {
            return Outcome::ResumedOnSource {
                sock,
                reason: Fallback::NotDumpable(e),
            }
        }
    };
    let dump = t0.elapsed();
    let t_offer = Instant::now();
    let control = Control { pool, target, cfg };
    // The source keeps its frozen socket until RESTORED: nothing to do between OFFER
    // and COMMIT, so both go in one message (one round trip less).
    let commit_now = cfg.handover == Handover::CloseAfterRestore;
    let (mut ctrl, first) = match control.offer(&st, commit_now) {
        Err(reason) => return resumed(sock, &st, reason),
        Ok(x) => x,
    };
    let (reply, offer, restore_time, held) = match first {
        Ok(Message::Refuse(r)) => {
            control.done(ctrl);
            return resumed(sock, &st, Fallback::Refused(r));
        }
        Ok(Message::Accept) if !commit_now => {
            let offer = t_offer.elapsed();
            // From the close until the target's restore (or the local one) no socket
            // has the 4-tuple: hold the flow, or a segment of the client would meet
            // the service's listener and its RST.
            _held = cfg
                .hold
                .as_deref()
                .or(own_hold.as_ref())
                .and_then(|h| hold_gap(h, cfg, &st));
            // CloseBeforeRestore: frozen by the dump (repair on, filter attached), so
            // the close is silent.
            close_frozen(sock);
            let t_commit = Instant::now();
            let reply = exchange(&mut ctrl, &Message::Commit, cfg);
            (reply, offer, t_commit.elapsed(), None)
        }
        // OFFER_COMMIT's answer: `offer` covers the restore too.
        Ok(m @ (Message::Restored | Message::Failed(_))) if commit_now => {
            (Ok(m), t_offer.elapsed(), Duration::ZERO, Some(sock))
        }
        Ok(m) => return resumed(sock, &st, Fallback::TargetGone(unexpected(&m))),
        Err(e) => return resumed(sock, &st, Fallback::TargetGone(e)),
    };
    let reason = match reply {
        Ok(Message::Restored) => match (Instant::now(), move_flow()) {
            (t_flow, Ok(())) => {
                let auth = cfg.auth.as_deref();
                let done = write_message_auth(&mut ctrl, &Message::Done, auth);
                let total = t0.elapsed();
                let flow = t_flow.elapsed();
                // Migrated only once the target says it holds the connection.
                match done.and_then(|()| read_reply(&ctrl, auth, cfg.reply_timeout)) {
                    Ok(Message::Released) => {
                        control.done(ctrl);
                        if let Some(sock) = held {
                            // Still frozen: segments in flight to the source are
                            // dropped (the client resends them to the target) instead
                            // of answered by RST. With a pool its reaper closes it
                            // later; the outcome does not wait for that.
                            match pool {
                                Some(p) if !cfg.flow_drain.is_zero() => {
                                    p.drain(sock, cfg.flow_drain)
                                }
                                _ => drain_inline(sock, cfg.flow_drain),
                            }
                        }
                        return Outcome::Migrated(Timings {
                            dump,
                            total,
                            state_bytes: state_bytes(&st),
                            offer,
                            restore: restore_time,
                            flow,
                        });
                    }
                    not_released => {
                        // The target does not hold the connection (FAILED) or may not
                        // (no answer): the flow comes back and the connection
                        // continues here.
                        let reason = match not_released {
                            Ok(Message::Failed(r)) => {
                                control.done(ctrl);
                                Fallback::RestoreFailed(r)
                            }
                            Ok(m) => Fallback::TargetGone(unexpected(&m)),
                            Err(e) => Fallback::TargetGone(io::Error::new(
                                e.kind(),
                                format!("flow moved, no RELEASED after DONE: {e}"),
                            )),
                        };
                        if let Err(e) = move_back() {
                            log::error!(
                                "migrate: taking the flow of {} back failed: {e}",
                                st.remote
                            );
                        }
                        reason
                    }
                }
            }
            (_, Err(e)) => {
                // Wait (bounded) until the target has dropped its copy: in one
                // namespace the local re-restore needs the 4-tuple free.
                if let Ok(Message::Failed(_)) = exchange(&mut ctrl, &Message::Abort, cfg) {
                    control.done(ctrl);
                }
                Fallback::FlowNotMoved(e)
            }
        },
        Ok(Message::Failed(r)) => {
            control.done(ctrl);
            Fallback::RestoreFailed(r)
        }
        Ok(m) => Fallback::TargetGone(unexpected(&m)),
        Err(e) => Fallback::TargetGone(e),
    };
    match held {
        Some(sock) => resumed(sock, &st, reason),
        None => match restore(&st) {
            Ok(sock) => Outcome::ResumedOnSource { sock, reason },
            Err(e) => Outcome::Lost(io::Error::new(
                e.kind(),
                format!("target failed ({reason:?}) and local restore failed: {e}"),
            )),
        },
    }
}

/// Holds `st`'s flow in `hold` for a [`Handover::CloseBeforeRestore`] gap; `None`
/// (and a warning) if that fails: the migration then runs unheld, as before the hold
/// existed.
fn hold_gap<'a>(hold: &'a FlowHold, cfg: &MigrateConfig, st: &TcpState) -> Option<Held<'a>> {
    let ttl = cfg.reply_timeout * HOLD_TTL_REPLIES + HOLD_TTL_SLACK;
    match hold.hold(st.local, st.remote, ttl) {
        Ok(h) => Some(h),
        Err(e) => {
            log::warn!("migrate: {e}; the flow of {} is not held", st.remote);
            None
        }
    }
}

fn unexpected(m: &Message) -> io::Error {
    let name = match m {
        Message::Offer(_) => "OFFER",
        Message::Accept => "ACCEPT",
        Message::Refuse(_) => "REFUSE",
        Message::Commit => "COMMIT",
        Message::Restored => "RESTORED",
        Message::Failed(_) => "FAILED",
        Message::Done => "DONE",
        Message::Abort => "ABORT",
        Message::OfferCommit(_) => "OFFER_COMMIT",
        Message::Released => "RELEASED",
    };
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected {name} message"),
    )
}

/// What the target side did with one offer.
#[derive(Debug)]
pub enum TargetOutcome {
    /// Restored and handed to the callback.
    Restored {
        /// The connection's local (service) address.
        local: SocketAddr,
        /// The client.
        remote: SocketAddr,
    },
    /// The admission callback refused (reason sent to the source).
    Refused(String),
    /// Restore failed (reason sent to the source; nothing left behind).
    RestoreFailed(String),
    /// Restored, but the source could not move the flow and sent ABORT: the copy
    /// was closed silently.
    Aborted,
    /// The source went away (or stalled past the bound) before DONE; nothing kept.
    SourceGone(io::Error),
}

/// The target daemon's side: a listener for source daemons.
pub struct Target {
    listener: TcpListener,
    reply_timeout: Duration,
    /// The connection [`Target::serve_next`] serves offers on.
    conn: Option<ControlConn>,
    /// The authenticated framing for connections [`Target::serve_next`] accepts.
    auth: Option<Arc<Auth>>,
}

impl Target {
    /// Listens for source daemons on `addr` (port 0 for any).
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        Ok(Self {
            listener: TcpListener::bind(addr)?,
            reply_timeout: REPLY_TIMEOUT_DEFAULT,
            conn: None,
            auth: None,
        })
    }

    /// [`Target::serve_next`] speaks the authenticated framing (wire version 3) with
    /// `auth` on every connection it accepts ([`ControlConn::set_auth`]).
    pub fn set_auth(&mut self, auth: Arc<Auth>) {
        self.auth = Some(auth);
    }

    /// The address sources connect to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts one source and serves its offer: `admit` decides (Err = REFUSE with
    /// that reason), `handoff` receives the restored connection. The connection is
    /// closed afterwards (a pooling source then opens a new one).
    pub fn serve_one(
        &self,
        admit: impl FnOnce(&TcpState) -> Result<(), String>,
        handoff: impl FnOnce(TcpStream),
    ) -> io::Result<TargetOutcome> {
        let (ctrl, _) = self.listener.accept()?;
        serve_conn(ctrl, self.reply_timeout, admit, handoff)
    }

    /// Serves the next offer on the current control connection, or on a newly
    /// accepted one if there is none; keeps the connection for the next call when the
    /// hand-over ended cleanly. A connection that closes, or stays idle for
    /// [`CONTROL_IDLE_TIMEOUT`], before its next OFFER ends the call with
    /// `SourceGone` (and is dropped).
    pub fn serve_next(
        &mut self,
        admit: impl FnOnce(&TcpState) -> Result<(), String>,
        handoff: impl FnOnce(TcpStream),
    ) -> io::Result<TargetOutcome> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => {
                let mut c = ControlConn::new(self.listener.accept()?.0, self.reply_timeout)?;
                if let Some(a) = &self.auth {
                    c.set_auth(Arc::clone(a));
                }
                c
            }
        };
        let outcome = conn.serve_next(CONTROL_IDLE_TIMEOUT, admit, handoff)?;
        if conn.reusable() {
            self.conn = Some(conn);
        }
        Ok(outcome.unwrap_or_else(|| {
            TargetOutcome::SourceGone(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "control connection closed or idle before an OFFER",
            ))
        }))
    }
}

/// One control connection on the target: the offers a source sends over it, served
/// one after the other (wire version 2).
pub struct ControlConn {
    reader: BufReader<Timed>,
    reusable: bool,
    /// Bound on each whole message ([`MESSAGE_DEADLINE_DEFAULT`]).
    message_deadline: Duration,
    /// Bound on the wait for a reply of the source (COMMIT, DONE/ABORT).
    reply_timeout: Duration,
    budget: Arc<OfferBudget>,
    /// The authenticated framing, if keyed.
    auth: Option<Arc<Auth>>,
    /// How long a restored copy waits for DONE or ABORT ([`VERDICT_WAIT_DEFAULT`]).
    verdict_wait: Duration,
}

/// The OFFER bytes targets may hold at once ([`OFFER_BUDGET_BYTES_DEFAULT`]): shared
/// by the control connections of a process unless given their own
/// ([`ControlConn::set_budget`]).
#[derive(Debug)]
pub struct OfferBudget {
    used: AtomicUsize,
    max: usize,
    refused: AtomicU64,
}

impl OfferBudget {
    /// A budget of `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            used: AtomicUsize::new(0),
            max,
            refused: AtomicU64::new(0),
        }
    }

    /// The process's budget (every [`ControlConn`]'s by default).
    pub fn global() -> Arc<Self> {
        static GLOBAL: OnceLock<Arc<OfferBudget>> = OnceLock::new();
        Arc::clone(GLOBAL.get_or_init(|| Arc::new(Self::new(OFFER_BUDGET_BYTES_DEFAULT))))
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// Offers refused because they did not fit.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Reserves `n` bytes, or `None` if they do not fit.
    fn reserve(self: &Arc<Self>, n: usize) -> Option<Reserved> {
        let ok = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                u.checked_add(n).filter(|&t| t <= self.max)
            })
            .is_ok();
        if !ok {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(Reserved(Arc::clone(self), n))
    }
}

/// Bytes of an [`OfferBudget`], given back when dropped.
struct Reserved(Arc<OfferBudget>, usize);

impl Drop for Reserved {
    fn drop(&mut self) {
        self.0.used.fetch_sub(self.1, Ordering::SeqCst);
    }
}

/// A control connection's reading side with a deadline per message: each `recv` is
/// bounded by the socket's timeout, lowered to what is left of the deadline as it
/// approaches (one `setsockopt` only then), so a whole message is bounded too.
struct Timed {
    stream: TcpStream,
    /// The per-`recv` bound set on the socket when no deadline is near.
    per_read: Duration,
    /// [`Timed::per_read`], or longer for the current message ([`Timed::start_wait`]).
    per_read_now: Duration,
    /// The socket's read timeout now.
    current: Duration,
    deadline: Option<Instant>,
}

impl Timed {
    /// Starts the deadline of the next message.
    fn start(&mut self, within: Duration) {
        self.deadline = Some(Instant::now() + within);
        self.per_read_now = self.per_read;
    }

    /// Starts the deadline of a message that may be long in coming (each `recv` may
    /// wait up to the whole deadline).
    fn start_wait(&mut self, within: Duration) {
        self.deadline = Some(Instant::now() + within);
        self.per_read_now = within.max(self.per_read);
    }
}

impl io::Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = &self.stream;
        timed_read(
            &mut s,
            buf,
            self.deadline,
            self.per_read_now,
            &mut self.current,
        )
    }
}

/// One `recv` on `stream` within `deadline`: the socket's read timeout is lowered to
/// what is left of it when that is less than `per_read` (one `setsockopt` only then),
/// and set back to `per_read` otherwise; `current` is the timeout set now.
fn timed_read(
    stream: &mut &TcpStream,
    buf: &mut [u8],
    deadline: Option<Instant>,
    per_read: Duration,
    current: &mut Duration,
) -> io::Result<usize> {
    let want = match deadline {
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "message not complete within its deadline",
                ));
            }
            left.min(per_read)
        }
        None => per_read,
    };
    if want != *current {
        stream.set_read_timeout(Some(want.max(Duration::from_millis(1))))?;
        *current = want;
    }
    io::Read::read(stream, buf)
}

/// The source's reading of one reply: whole within twice the reply timeout, each
/// `recv` within one (a target that trickles its reply cannot hold the migrating
/// thread longer). Costs no system call unless the reply is that slow.
struct ReplyReader<'a> {
    stream: &'a TcpStream,
    per_read: Duration,
    current: Duration,
    deadline: Instant,
}

impl io::Read for ReplyReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = self.stream;
        timed_read(
            &mut s,
            buf,
            Some(self.deadline),
            self.per_read,
            &mut self.current,
        )
    }
}

/// The target's next reply on `ctrl`, whose read timeout is `timeout` (see
/// [`ReplyReader`]).
fn read_reply(ctrl: &TcpStream, auth: Option<&Auth>, timeout: Duration) -> io::Result<Message> {
    let mut r = ReplyReader {
        stream: ctrl,
        per_read: timeout,
        current: timeout,
        deadline: Instant::now() + timeout * 2,
    };
    let m = read_message_auth(&mut r, auth);
    if r.current != timeout {
        ctrl.set_read_timeout(Some(timeout))?;
    }
    m
}

impl ControlConn {
    /// Prepares an accepted connection: every read and write bounded by
    /// `reply_timeout`, each whole message by [`MESSAGE_DEADLINE_DEFAULT`], Nagle
    /// off; OFFERs count in [`OfferBudget::global`].
    pub fn new(stream: TcpStream, reply_timeout: Duration) -> io::Result<Self> {
        stream.set_read_timeout(Some(reply_timeout))?;
        stream.set_write_timeout(Some(reply_timeout))?;
        stream.set_nodelay(true)?;
        let timed = Timed {
            stream,
            per_read: reply_timeout,
            per_read_now: reply_timeout,
            current: reply_timeout,
            deadline: None,
        };
        Ok(Self {
            reader: BufReader::with_capacity(CONTROL_READ_BUF_BYTES, timed),
            reusable: true,
            message_deadline: MESSAGE_DEADLINE_DEFAULT,
            reply_timeout,
            budget: OfferBudget::global(),
            auth: None,
            verdict_wait: VERDICT_WAIT_DEFAULT.max(reply_timeout),
        })
    }

    /// Speaks the authenticated framing (wire version 3) with `auth`: a frame that
    /// fails its check ends the connection (counted in [`Auth::refused`]) before its
    /// payload is read.
    pub fn set_auth(&mut self, auth: Arc<Auth>) {
        self.auth = Some(auth);
    }

    /// Bounds each whole message by `d` instead of [`MESSAGE_DEADLINE_DEFAULT`].
    pub fn set_message_deadline(&mut self, d: Duration) {
        self.message_deadline = d;
    }

    /// Keeps a restored copy up to `d` for the source's DONE or ABORT instead of
    /// [`VERDICT_WAIT_DEFAULT`].
    pub fn set_verdict_wait(&mut self, d: Duration) {
        self.verdict_wait = d;
    }

    /// Counts this connection's OFFERs in `budget` instead of the global one.
    pub fn set_budget(&mut self, budget: Arc<OfferBudget>) {
        self.budget = budget;
    }

    /// The connection (e.g. to shut it down from another thread via a clone).
    pub fn stream(&self) -> &TcpStream {
        &self.reader.get_ref().stream
    }

    /// Whether the last hand-over ended cleanly, so the next OFFER may follow on this
    /// connection; false after an error, an unexpected message or a closed connection.
    pub fn reusable(&self) -> bool {
        self.reusable
    }

    /// Waits up to `idle` for the next OFFER and serves it (see [`serve_conn`]).
    /// `Ok(None)`: the source closed the connection, or sent nothing within `idle`;
    /// the connection is then not reusable.
    pub fn serve_next(
        &mut self,
        idle: Duration,
        admit: impl FnOnce(&TcpState) -> Result<(), String>,
        handoff: impl FnOnce(TcpStream),
    ) -> io::Result<Option<TargetOutcome>> {
        match self.wait(idle, None)? {
            Ready::Offer => self.serve_ready(admit, handoff),
            Ready::Idle | Ready::Listener => {
                self.reusable = false;
                Ok(None)
            }
        }
    }

    /// Waits up to `idle` for the next OFFER (or EOF) on this connection, or for
    /// `listener` to become readable (a source waiting to connect, or the listener
    /// shut down), whichever comes first. One `poll`.
    pub fn wait(&mut self, idle: Duration, listener: Option<&TcpListener>) -> io::Result<Ready> {
        self.wait_fd(idle, listener.map(|l| l.as_fd()))
    }

    /// [`ControlConn::wait`] with any descriptor besides the connection (a listener,
    /// or an eventfd another thread writes to): [`Ready::Listener`] when `other` is
    /// readable.
    pub fn wait_fd(&mut self, idle: Duration, other: Option<BorrowedFd<'_>>) -> io::Result<Ready> {
        if !self.reader.buffer().is_empty() {
            return Ok(Ready::Offer);
        }
        let mut fds = [
            pollin(self.stream().as_raw_fd()),
            pollin(other.map_or(-1, |l| l.as_raw_fd())),
        ];
        let n = if other.is_some() { 2 } else { 1 };
        if !poll_within(&mut fds[..n], idle)? {
            return Ok(Ready::Idle);
        }
        if fds[0].revents != 0 {
            return Ok(Ready::Offer);
        }
        Ok(Ready::Listener)
    }

    /// Serves the OFFER that [`ControlConn::wait`] found ready: `Ok(None)` if it was
    /// the source's close instead.
    pub fn serve_ready(
        &mut self,
        admit: impl FnOnce(&TcpState) -> Result<(), String>,
        handoff: impl FnOnce(TcpStream),
    ) -> io::Result<Option<TargetOutcome>> {
        if !self.reusable {
            return Ok(None);
        }
        self.reusable = false;
        self.reader.get_mut().start(self.message_deadline);
        match self.reader.fill_buf() {
            Ok([]) => return Ok(None),
            Ok(_) => {}
            Err(e) => return Ok(Some(TargetOutcome::SourceGone(e))),
        }
        let auth = self.auth.clone();
        let (h, header_tag) = match auth.as_deref() {
            // Nothing of the payload is read before the envelope verified.
            Some(a) => match read_authentic_header(&mut self.reader, a) {
                Ok(x) => x,
                Err(e) => return Ok(Some(TargetOutcome::SourceGone(e))),
            },
            None => {
                let mut h = [0u8; HEADER_BYTES];
                if let Err(e) = io::Read::read_exact(&mut self.reader, &mut h) {
                    return Ok(Some(TargetOutcome::SourceGone(e)));
                }
                (h, 0)
            }
        };
        let header = match auth.as_deref() {
            Some(_) => crate::wire::decode_header_version(&h, crate::wire::VERSION_AUTH),
            None => decode_header(&h),
        };
        let len = match header {
            Ok((_, len)) => len,
            Err(e) => {
                // Another wire version (or garbage): say so to the source, in our
                // framing (an old source's decoder names the version it got).
                let text = reason(&format!("target refuses the frame: {e}"));
                let _ = self.write(&Message::Refuse(text));
                return Ok(Some(TargetOutcome::SourceGone(io::Error::new(
                    io::ErrorKind::InvalidData,
                    e,
                ))));
            }
        };
        // The announced length is reserved before a byte of the payload is read; an
        // offer that does not fit is refused and its connection closed (its payload
        // is never read).
        let Some(_reserved) = self.budget.reserve(len) else {
            let r = reason(&format!(
                "target memory budget full: {} of {} bytes held, offer of {len}",
                self.budget.used(),
                self.budget.max
            ));
            let _ = self.write(&Message::Refuse(r.clone()));
            return Ok(Some(TargetOutcome::Refused(r)));
        };
        let read = match auth.as_deref() {
            Some(a) => read_authentic_after(&mut self.reader, &h, a, header_tag),
            None => read_message_after(&mut self.reader, &h),
        };
        let (st, commit_now) = match read {
            Ok(Message::Offer(st)) => (st, false),
            Ok(Message::OfferCommit(st)) => (st, true),
            Ok(m) => return Ok(Some(TargetOutcome::SourceGone(unexpected(&m)))),
            Err(e) => return Ok(Some(TargetOutcome::SourceGone(e))),
        };
        let outcome = self.serve_offer(Recycled(st), commit_now, admit, handoff)?;
        self.reusable = matches!(
            outcome,
            TargetOutcome::Restored { .. }
                | TargetOutcome::Refused(_)
                | TargetOutcome::RestoreFailed(_)
                | TargetOutcome::Aborted
        );
        Ok(Some(outcome))
    }

    fn write(&mut self, msg: &Message) -> io::Result<()> {
        // Replies are empty or a short reason: one small frame, one write.
        let frame = match self.auth.as_deref() {
            Some(a) => encode_auth(msg, a)?,
            None => encode(msg),
        };
        io::Write::write_all(&mut self.reader.get_mut().stream, &frame)
    }

    /// The source's next message (COMMIT, DONE or ABORT), within the reply timeout
    /// and, once it starts, the message deadline.
    fn read_reply(&mut self) -> io::Result<Message> {
        let within = self.reply_timeout.min(self.message_deadline);
        self.reader.get_mut().start(within);
        let auth = self.auth.clone();
        read_message_auth(&mut self.reader, auth.as_deref())
    }

    /// One offer; `commit_now`: it was an OFFER_COMMIT (no ACCEPT, no COMMIT).
    fn serve_offer(
        &mut self,
        st: Recycled,
        commit_now: bool,
        admit: impl FnOnce(&TcpState) -> Result<(), String>,
        handoff: impl FnOnce(TcpStream),
    ) -> io::Result<TargetOutcome> {
        if let Err(r) = admit(&st) {
            let r = reason(&r);
            self.write(&Message::Refuse(r.clone()))?;
            return Ok(TargetOutcome::Refused(r));
        }
        if !commit_now {
            if let Err(e) = self.write(&Message::Accept) {
                return Ok(TargetOutcome::SourceGone(e));
            }
            match self.read_reply() {
                Ok(Message::Commit) => {}
                Ok(m) => return Ok(TargetOutcome::SourceGone(unexpected(&m))),
                Err(e) => return Ok(TargetOutcome::SourceGone(e)),
            }
        }
        let frozen = match restore_frozen(&st) {
            Ok(s) => s,
            Err(e) => {
                let r = reason(&e.to_string());
                self.write(&Message::Failed(r.clone()))?;
                return Ok(TargetOutcome::RestoreFailed(r));
            }
        };
        // Until DONE the copy stays frozen (repair on, input dropped): the source may
        // still resume, so this copy must neither send nor acknowledge anything yet.
        // DONE follows the source's flow move, which may take seconds (the
        // front-end's MOVE and its retry): the copy is kept that long.
        let verdict = self.write(&Message::Restored).and_then(|()| {
            self.reader.get_mut().start_wait(self.verdict_wait);
            let auth = self.auth.clone();
            read_message_auth(&mut self.reader, auth.as_deref())
        });
        match verdict {
            Ok(Message::Done) => {
                let sock = match frozen.release() {
                    Ok(s) => s,
                    // Nothing of the copy is left: the source, told so, takes the
                    // connection back (it still holds its frozen socket, or the dump).
                    Err(e) => {
                        let r = reason(&format!("release failed: {e}"));
                        let _ = self.write(&Message::Failed(r.clone()));
                        return Ok(TargetOutcome::RestoreFailed(r));
                    }
                };
                // Acknowledged before the server sees it: a source that is not told
                // takes the connection back, so a copy it was not told of must go,
                // silently (no FIN, no RST to the client).
                if let Err(e) = self.write(&Message::Released) {
                    if let Err(c) = crate::dump::close_silently(sock) {
                        log::warn!("migrate: closing an unacknowledged copy: {c}");
                    }
                    return Ok(TargetOutcome::SourceGone(e));
                }
                handoff(sock);
                Ok(TargetOutcome::Restored {
                    local: st.local,
                    remote: st.remote,
                })
            }
            Ok(Message::Abort) => {
                frozen.discard();
                self.write(&Message::Failed("aborted".into()))?;
                Ok(TargetOutcome::Aborted)
            }
            Ok(m) => {
                frozen.discard();
                Ok(TargetOutcome::SourceGone(unexpected(&m)))
            }
            Err(e) => {
                frozen.discard();
                Ok(TargetOutcome::SourceGone(e))
            }
        }
    }
}

/// What [`ControlConn::wait`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ready {
    /// Bytes (the next OFFER) or the source's close wait on the connection.
    Offer,
    /// The listener (or [`ControlConn::wait_fd`]'s other descriptor) is readable (a
    /// source waits to connect, or it was shut down).
    Listener,
    /// Nothing within the idle bound.
    Idle,
}

fn pollin(fd: libc::c_int) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Polls `fds` for up to `timeout`; false on timeout.
fn poll_within(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<bool> {
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // An interrupted wait restarts (with the full timeout: signals are rare here).
    loop {
        // SAFETY: `fds` is a live array of pollfd of the length passed.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if r >= 0 {
            return Ok(r > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Serves one offer on an accepted control connection (see [`Target::serve_one`]);
/// waits at most `timeout` for the OFFER, as for every reply and write.
pub fn serve_conn(
    ctrl: TcpStream,
    timeout: Duration,
    admit: impl FnOnce(&TcpState) -> Result<(), String>,
    handoff: impl FnOnce(TcpStream),
) -> io::Result<TargetOutcome> {
    let mut conn = ControlConn::new(ctrl, timeout)?;
    Ok(conn
        .serve_next(timeout, admit, handoff)?
        .unwrap_or_else(|| {
            TargetOutcome::SourceGone(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "no OFFER before the connection closed or timed out",
            ))
        }))
}
