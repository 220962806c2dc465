//! The hand-over between a source and a target daemon over TCP.
//!
//! ```text
//! source                                   target
//!   freeze + dump ── fails ──> ResumedOnSource(NotDumpable), socket untouched
//!   OFFER(state)  ─────────────────────>   admit(state)?
//!                 <───────────── ACCEPT | REFUSE(reason)
//!   REFUSE / timeout / EOF ──> resume (repair off): ResumedOnSource
//!   [CloseBeforeRestore: close source silently]
//!   COMMIT        ─────────────────────>   restore(state)
//!                 <───────────── RESTORED | FAILED(reason)
//!   RESTORED: move_flow() (front-end entry → target)
//!     ok:  DONE ──────────────────────>   hand the fd to the local server
//!          [CloseAfterRestore: close source silently] ──> Migrated
//!     err: ABORT ─────────────────────>   close the restored copy silently
//!                 <───────────── FAILED("aborted")
//!   FAILED / timeout / EOF / ABORT sent:
//!     CloseAfterRestore:  resume the frozen source socket
//!     CloseBeforeRestore: restore the dump locally on a new socket
//!     ──> ResumedOnSource
//! ```
//!
//! Every wait is bounded ([`MigrateConfig`]); a target that is unreachable, refuses,
//! dies or stalls costs the client at most those bounds plus one retransmission.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::dump::{close_silently, freeze_and_dump, resume};
use crate::error::DumpError;
use crate::restore::{restore, restore_frozen};
use crate::state::TcpState;
use crate::wire::{read_message, reason, write_message, Message};

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

/// When the source socket is closed relative to the target's restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// Source and target share a network namespace (tests, or two daemons on one
    /// host): the restore would collide with the source's 4-tuple, so the source is
    /// closed silently *before* COMMIT; on failure the source restores its own dump.
    CloseBeforeRestore,
    /// Different hosts/namespaces (the deployment): the source keeps the frozen
    /// socket until RESTORED, so the fall-back is simply repair off.
    CloseAfterRestore,
}

/// Bounds and mode of one migration.
#[derive(Clone, Copy, Debug)]
pub struct MigrateConfig {
    /// See [`Handover`]. Default: `CloseAfterRestore`.
    pub handover: Handover,
    /// Bound on connecting to the target. Default [`CONNECT_TIMEOUT_DEFAULT`].
    pub connect_timeout: Duration,
    /// Bound on each reply and write. Default [`REPLY_TIMEOUT_DEFAULT`].
    pub reply_timeout: Duration,
    /// With [`Handover::CloseAfterRestore`]: how long the source stays frozen after
    /// the flow was moved, so in-flight segments are dropped rather than reset.
    /// Default [`FLOW_DRAIN_DEFAULT`].
    pub flow_drain: Duration,
}

impl Default for MigrateConfig {
    fn default() -> Self {
        Self {
            handover: Handover::CloseAfterRestore,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            reply_timeout: REPLY_TIMEOUT_DEFAULT,
            flow_drain: FLOW_DRAIN_DEFAULT,
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
    /// Connecting to the target and OFFER until ACCEPT (the state's transfer and the
    /// target's admission).
    pub offer: Duration,
    /// COMMIT until RESTORED (the target's restore).
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
    /// succeeded; or the flow was moved but DONE could not be sent to the target.
    Lost(io::Error),
}

fn state_bytes(st: &TcpState) -> usize {
    st.send_queue.len() + st.recv_queue.len()
}

fn exchange(ctrl: &mut TcpStream, msg: &Message) -> io::Result<Message> {
    write_message(ctrl, msg)?;
    read_message(ctrl)
}

fn open_control(target: SocketAddr, cfg: &MigrateConfig) -> io::Result<TcpStream> {
    let c = TcpStream::connect_timeout(&target, cfg.connect_timeout)?;
    c.set_read_timeout(Some(cfg.reply_timeout))?;
    c.set_write_timeout(Some(cfg.reply_timeout))?;
    c.set_nodelay(true)?;
    Ok(c)
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
    let t0 = Instant::now();
    let st = match freeze_and_dump(&sock) {
        Ok(st) => st,
        Err(e) => {
            return Outcome::ResumedOnSource {
                sock,
                reason: Fallback::NotDumpable(e),
            }
        }
    };
    let dump = t0.elapsed();
    let t_offer = Instant::now();
    let mut ctrl = match open_control(target, cfg) {
        Ok(c) => c,
        Err(e) => return resumed(sock, &st, Fallback::TargetUnreachable(e)),
    };
    match exchange(&mut ctrl, &Message::Offer(st.clone())) {
        Ok(Message::Accept) => {}
        Ok(Message::Refuse(r)) => return resumed(sock, &st, Fallback::Refused(r)),
        Ok(m) => return resumed(sock, &st, Fallback::TargetGone(unexpected(&m))),
        Err(e) => return resumed(sock, &st, Fallback::TargetGone(e)),
    }
    let offer = t_offer.elapsed();
    let held = match cfg.handover {
        Handover::CloseAfterRestore => Some(sock),
        Handover::CloseBeforeRestore => {
            if let Err(e) = close_silently(sock) {
                // Cannot happen after a successful dump (repair was on); report it.
                log::error!("migrate: silent close failed: {e}");
            }
            None
        }
    };
    let t_commit = Instant::now();
    let reason = match exchange(&mut ctrl, &Message::Commit) {
        Ok(Message::Restored) => match (t_commit.elapsed(), Instant::now(), move_flow()) {
            (restore, t_flow, Ok(())) => {
                let done = write_message(&mut ctrl, &Message::Done);
                let total = t0.elapsed();
                let flow = t_flow.elapsed();
                if let Some(sock) = held {
                    // Still frozen: segments in flight to the source are dropped (the
                    // client resends them to the target) instead of answered by RST.
                    std::thread::sleep(cfg.flow_drain);
                    if let Err(e) = close_silently(sock) {
                        log::error!("migrate: silent close failed: {e}");
                    }
                }
                return match done {
                    Ok(()) => Outcome::Migrated(Timings {
                        dump,
                        total,
                        state_bytes: state_bytes(&st),
                        offer,
                        restore,
                        flow,
                    }),
                    Err(e) => Outcome::Lost(io::Error::new(
                        e.kind(),
                        format!("flow moved but DONE not delivered: {e}"),
                    )),
                };
            }
            (_, _, Err(e)) => {
                // Wait (bounded) until the target has dropped its copy: in one
                // namespace the local re-restore needs the 4-tuple free.
                let _ = exchange(&mut ctrl, &Message::Abort);
                Fallback::FlowNotMoved(e)
            }
        },
        Ok(Message::Failed(r)) => Fallback::RestoreFailed(r),
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
}

impl Target {
    /// Listens for source daemons on `addr` (port 0 for any).
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        Ok(Self {
            listener: TcpListener::bind(addr)?,
            reply_timeout: REPLY_TIMEOUT_DEFAULT,
        })
    }

    /// The address sources connect to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts one source and serves its offer: `admit` decides (Err = REFUSE with
    /// that reason), `handoff` receives the restored connection.
    pub fn serve_one(
        &self,
        admit: impl FnOnce(&TcpState) -> Result<(), String>,
        handoff: impl FnOnce(TcpStream),
    ) -> io::Result<TargetOutcome> {
        let (ctrl, _) = self.listener.accept()?;
        serve_conn(ctrl, self.reply_timeout, admit, handoff)
    }
}

/// Serves one offer on an accepted control connection (see [`Target::serve_one`]).
pub fn serve_conn(
    mut ctrl: TcpStream,
    timeout: Duration,
    admit: impl FnOnce(&TcpState) -> Result<(), String>,
    handoff: impl FnOnce(TcpStream),
) -> io::Result<TargetOutcome> {
    ctrl.set_read_timeout(Some(timeout))?;
    ctrl.set_write_timeout(Some(timeout))?;
    ctrl.set_nodelay(true)?;
    let st = match read_message(&mut ctrl) {
        Ok(Message::Offer(st)) => st,
        Ok(m) => return Ok(TargetOutcome::SourceGone(unexpected(&m))),
        Err(e) => return Ok(TargetOutcome::SourceGone(e)),
    };
    if let Err(r) = admit(&st) {
        let r = reason(&r);
        write_message(&mut ctrl, &Message::Refuse(r.clone()))?;
        return Ok(TargetOutcome::Refused(r));
    }
    if let Err(e) = write_message(&mut ctrl, &Message::Accept) {
        return Ok(TargetOutcome::SourceGone(e));
    }
    match read_message(&mut ctrl) {
        Ok(Message::Commit) => {}
        Ok(m) => return Ok(TargetOutcome::SourceGone(unexpected(&m))),
        Err(e) => return Ok(TargetOutcome::SourceGone(e)),
    }
    let frozen = match restore_frozen(&st) {
        Ok(s) => s,
        Err(e) => {
            let r = reason(&e.to_string());
            write_message(&mut ctrl, &Message::Failed(r.clone()))?;
            return Ok(TargetOutcome::RestoreFailed(r));
        }
    };
    // Until DONE the copy stays frozen (repair on, input dropped): the source may
    // still resume, so this copy must neither send nor acknowledge anything yet.
    let verdict =
        write_message(&mut ctrl, &Message::Restored).and_then(|()| read_message(&mut ctrl));
    match verdict {
        Ok(Message::Done) => {
            let sock = match frozen.release() {
                Ok(s) => s,
                // The source has closed: nothing left to fall back to.
                Err(e) => return Ok(TargetOutcome::RestoreFailed(reason(&e.to_string()))),
            };
            handoff(sock);
            Ok(TargetOutcome::Restored {
                local: st.local,
                remote: st.remote,
            })
        }
        Ok(Message::Abort) => {
            frozen.discard();
            let _ = write_message(&mut ctrl, &Message::Failed("aborted".into()));
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
