//! The target side of `farside specd`: takes migration offers from peers, admits by
//! its own load, restores and hands the connection to the local web server, and
//! notifies the sources it refused once it can take again.
//!
//! ```text
//! peer (source) ──OFFER──▶ acceptor threads (TARGET_THREADS) ── admit? ──┐
//!                           server accept queue (sock_diag) + restores   │ no: REFUSE,
//!                           in progress + waiting for hand-off           │ remember source
//!                           < --admit-queue-max, and the server's        │
//!                           adoption channel has room                    │
//!                            │ yes                                        ▼
//!                            ▼                                  notifier (NOTIFY_PERIOD):
//!                     restore (frozen) ─DONE─▶ HandOff            queue back under the
//!                                              (adopt / relay)     bound → "can take"
//!                                                                  datagram to each
//! ```
//!
//! Each thread keeps its control connection between offers (wire version 2, the
//! source's `ControlPool`), see [`TARGET_THREADS_DEFAULT`].
//!
//! "Can take again" is what the source's window waits for (seed 002 §3.2: the paper
//! sends it when the migrated requests were served; here the target does not see its
//! server finish a request, so it notifies when its admission condition holds again,
//! which is the same promise).

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use farside_migrate::proto::{CONTROL_IDLE_TIMEOUT, REPLY_TIMEOUT_DEFAULT};
use farside_migrate::{ControlConn, Ready, TargetOutcome};

use crate::handoff::{HandOff, Handoff, HANDOFF_WAIT_MAX, PENDING_MAX};
use crate::load::ServerQueue;
use crate::stats::Samples;
use crate::summary::TargetSummary;

/// Threads serving offers at once: 32, one per migration a peer runs at once
/// (`source::MIGRATORS_DEFAULT`). A thread holds an offer for its whole exchange
/// (OFFER, COMMIT, restore, RESTORED, DONE), about a millisecond on an idle node but
/// tens of ms on a node whose CPU quota is spent: with 4 threads offers queued in the
/// listen backlog and OFFER-to-ACCEPT took 210 ms p50 in `lab speculative` (75/25 at 3×
/// one node's capacity). More offers wait in the listen backlog (bounded by the
/// kernel) and the source's connect timeout.
///
/// A thread keeps its control connection between offers (wire version 2: the
/// source's `ControlPool` reuses it), until the source closes it, it stays idle for
/// `CONTROL_IDLE_TIMEOUT`, or a new source waits to connect while no thread is free:
/// then one idle connection (one at a time) is closed and its thread takes the
/// newcomer, so idle pooled connections never starve a source. Idle threads watch
/// the listener only while no thread is free (else a new source would wake them all).
pub const TARGET_THREADS_DEFAULT: usize = 32;
/// Upper bound of `--target-threads`.
pub const TARGET_THREADS_MAX: usize = 64;
/// How often the notifier checks whether refused sources can be told "can take":
/// 5 ms is well under a request's service time and costs a sock_diag read (µs).
pub const NOTIFY_PERIOD: Duration = Duration::from_millis(5);
/// Bound on the notifier's sleep while no source waits for a notification, so it
/// sees a stop.
const NOTIFY_IDLE_WAIT_MAX: Duration = Duration::from_millis(200);
/// Most refused sources remembered for a notification (one per peer; a cluster of
/// more back-ends than this is outside the design, and extra sources fall back to
/// the N-local-requests rule).
pub const REFUSED_SOURCES_MAX: usize = 64;

/// Threads every other peer keeps free of one peer's connections: with several
/// peers, one peer holds at most `threads - PEER_RESERVE_THREADS × (peers - 1)`
/// control connections at once (all of them with one peer), so a peer that opens
/// connections and sends nothing cannot take every thread.
pub const PEER_RESERVE_THREADS: usize = 2;

/// Most control connections one peer may hold at once with `threads` serving threads
/// and `peers` peers (at least 1).
pub fn per_peer_max(threads: usize, peers: usize) -> usize {
    threads
        .saturating_sub(PEER_RESERVE_THREADS * peers.saturating_sub(1))
        .max(1)
}

/// What an offered connection may be: its local address is the service, its
/// client is neither this host (loopback) nor a cluster address. An offer outside
/// these is refused before anything is restored: the restore binds any address
/// (`IP_FREEBIND`) and connects to any remote, so a peer could otherwise hand the web
/// server a request "from" any address (127.0.0.1 past `allow` rules) or make this
/// host send segments with a forged source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfferRules {
    /// The service's address (the VIP) an offered connection's local address must
    /// have; `None`: any address that is not loopback, unspecified or multicast.
    pub service_ip: Option<IpAddr>,
    /// The service's port an offered connection's local port must be.
    pub service_port: u16,
    /// Addresses no client may have: the cluster's own (peers, this daemon).
    pub cluster: Vec<IpAddr>,
    /// Accept loopback addresses (single-host tests only: `farside specd` never sets
    /// it).
    pub loopback: bool,
}

impl OfferRules {
    /// Why `st` may not be restored here, if it may not.
    pub fn check(&self, st: &farside_migrate::TcpState) -> Result<(), String> {
        let (local, remote) = (st.local, st.remote);
        if local.port() != self.service_port {
            return Err(format!(
                "offered local address {local} is not the service's port {}",
                self.service_port
            ));
        }
        match self.service_ip {
            Some(ip) if local.ip() != ip => {
                return Err(format!(
                    "offered local address {local} is not the service's {ip}"
                ))
            }
            Some(_) => {}
            None if !self.usable(local.ip()) => {
                return Err(format!(
                    "offered local address {local} is not a service address"
                ))
            }
            None => {}
        }
        if !self.usable(remote.ip()) || remote.port() == 0 {
            return Err(format!("offered client {remote} is not a client address"));
        }
        if self.cluster.contains(&remote.ip()) {
            return Err(format!("offered client {remote} is a cluster address"));
        }
        Ok(())
    }

    fn usable(&self, ip: IpAddr) -> bool {
        let bad = ip.is_unspecified()
            || ip.is_multicast()
            || (ip.is_loopback() && !self.loopback)
            || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast())
            || matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some());
        !bad
    }
}

/// Configuration of the target side.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    /// Migration listener (TCP) on the cluster network.
    pub listen: SocketAddr,
    /// The local web server's port (its accept queue is the load).
    pub server_port: u16,
    /// Refuse offers while the server's accept queue plus restores in progress plus
    /// restored connections waiting for the hand-off (`HandOff::pending`) is at
    /// least this.
    pub admit_queue_max: u32,
    /// Where restored connections go.
    pub handoff: Handoff,
    /// Threads serving offers.
    pub threads: usize,
    /// The peers' daemon addresses: a refused source whose IP is among them is
    /// notified at that address, any other at (its IP, our listen port).
    pub peers: Vec<SocketAddr>,
    /// The addresses peers connect from: a control connection from any other is
    /// closed at once, before a byte of it is read (empty: none is served).
    pub allow: Vec<IpAddr>,
    /// What an offered connection may be ([`OfferRules::check`]).
    pub offers: OfferRules,
    /// The authenticated framing (`--key-file`): every control connection speaks it,
    /// a frame failing its check ends the connection (counted in
    /// [`farside_migrate::wire::Auth::refused`]); `None`: unauthenticated.
    pub auth: Option<Arc<farside_migrate::wire::Auth>>,
}

/// Counters of the target side.
#[derive(Debug, Default)]
pub struct TargetStats {
    /// Offers received.
    pub offers: AtomicU64,
    /// Offers refused by load.
    pub refused: AtomicU64,
    /// Connections restored and handed over.
    pub restored: AtomicU64,
    /// Restores that failed.
    pub restore_failed: AtomicU64,
    /// Offers the source aborted or abandoned.
    pub aborted: AtomicU64,
    /// Control connections closed at once because their peer already held its
    /// share of the threads ([`per_peer_max`]).
    pub over_peer_cap: AtomicU64,
    /// Control connections closed at once because they came from an address not
    /// in [`TargetConfig::allow`].
    pub not_allowed: AtomicU64,
    /// Offers refused by [`OfferRules::check`] (also counted in `refused`).
    pub bad_offers: AtomicU64,
    /// Notifications sent.
    pub notifications: AtomicU64,
    /// Target CPU per restored migration, µs (thread CPU of the offer's handling).
    pub cpu_us: Mutex<Samples>,
}

struct Shared {
    cfg: TargetConfig,
    stop: AtomicBool,
    listener: TcpListener,
    handoff: HandOff,
    /// Offers admitted and not yet handed over (or queued for the server).
    restoring: AtomicU32,
    refused_sources: Mutex<Vec<IpAddr>>,
    /// Signalled when a source is added to `refused_sources`: the notifier sleeps on
    /// it instead of polling while nobody waits for a notification.
    refused_added: std::sync::Condvar,
    stats: TargetStats,
    /// Threads without a control connection (waiting in accept).
    free: AtomicU32,
    /// Written when the last free thread takes a source (and on stop): threads with an
    /// idle connection watch it instead of the listener while some thread is free, so
    /// a new source wakes one thread (accept's exclusive wait), not every idle one;
    /// when none is free they watch the listener to make room for the next source.
    none_free: OwnedFd,
    /// Set while one thread gives up its idle connection for a waiting source, so
    /// the other idle threads keep theirs.
    yielding: AtomicBool,
    /// Control connections held now, per peer address.
    per_peer: Mutex<Vec<(IpAddr, usize)>>,
    /// [`per_peer_max`] of this configuration.
    per_peer_max: usize,
}

/// One control connection counted against its peer's cap; uncounted when dropped.
struct PeerSlot<'a> {
    s: &'a Shared,
    ip: IpAddr,
}

impl<'a> PeerSlot<'a> {
    /// Counts a connection from `ip`, or `None` if `ip` holds its share already.
    fn take(s: &'a Shared, ip: IpAddr) -> Option<Self> {
        let mut v = s.per_peer.lock().unwrap_or_else(|p| p.into_inner());
        match v.iter_mut().find(|(a, _)| *a == ip) {
            Some((_, n)) if *n >= s.per_peer_max => return None,
            Some((_, n)) => *n += 1,
            None => v.push((ip, 1)),
        }
        Some(Self { s, ip })
    }
}

impl Drop for PeerSlot<'_> {
    fn drop(&mut self) {
        let mut v = self.s.per_peer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = v.iter().position(|(a, _)| *a == self.ip) {
            v[i].1 -= 1;
            if v[i].1 == 0 {
                v.swap_remove(i);
            }
        }
    }
}

/// A running target side. Dropping it stops it.
pub struct TargetDaemon {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    addr: SocketAddr,
}

impl TargetDaemon {
    /// Binds the migration listener and starts the threads.
    pub fn start(cfg: TargetConfig) -> io::Result<Self> {
        if cfg.threads == 0 || cfg.threads > TARGET_THREADS_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("target threads must be in 1..={TARGET_THREADS_MAX}"),
            ));
        }
        let listener = TcpListener::bind(cfg.listen)
            .map_err(|e| io::Error::new(e.kind(), format!("--listen {}: {e}", cfg.listen)))?;
        let addr = listener.local_addr()?;
        // Probe the server's queue once so a bad port or missing permission fails now.
        ServerQueue::new(cfg.server_port)?.read()?;
        let (cfg_threads, cfg_peers) = (cfg.threads, cfg.peers.len());
        let shared = Arc::new(Shared {
            // Restored connections waiting for the server count in the admission
            // (below), so no more than --admit-queue-max of them ever wait.
            handoff: {
                let mut h = HandOff::with_bounds(
                    cfg.handoff.clone(),
                    (cfg.admit_queue_max as usize).clamp(1, PENDING_MAX),
                    HANDOFF_WAIT_MAX,
                )?;
                h.set_trace_label("restored");
                h
            },
            cfg,
            stop: AtomicBool::new(false),
            listener,
            restoring: AtomicU32::new(0),
            refused_sources: Mutex::new(Vec::new()),
            refused_added: std::sync::Condvar::new(),
            stats: TargetStats::default(),
            free: AtomicU32::new(0),
            yielding: AtomicBool::new(false),
            none_free: eventfd()?,
            per_peer: Mutex::new(Vec::new()),
            per_peer_max: per_peer_max(cfg_threads, cfg_peers),
        });
        let mut threads = Vec::new();
        for i in 0..shared.cfg.threads {
            let s = Arc::clone(&shared);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("specd-target{i}"))
                    .spawn(move || offers_loop(&s))?,
            );
        }
        let notify_sock = UdpSocket::bind(SocketAddr::new(addr.ip(), 0))?;
        let s = Arc::clone(&shared);
        threads.push(
            std::thread::Builder::new()
                .name("specd-notify".into())
                .spawn(move || notifier_loop(&s, &notify_sock))?,
        );
        log::info!("specd target: migrations on {addr}");
        Ok(Self {
            shared,
            threads,
            addr,
        })
    }

    /// The migration listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Threads waiting in accept for a source (none holds a control connection).
    pub fn free_threads(&self) -> u32 {
        self.shared.free.load(Ordering::SeqCst)
    }

    /// The counters.
    pub fn stats(&self) -> &TargetStats {
        &self.shared.stats
    }

    /// Hand-off counters.
    pub fn handoff_stats(&self) -> &crate::handoff::HandoffStats {
        self.shared.handoff.stats()
    }

    /// The counters (the exit summary's `target` object).
    pub fn summary(&self) -> TargetSummary {
        let s = &self.shared.stats;
        let h = self.shared.handoff.stats();
        TargetSummary {
            offers: s.offers.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            restored: s.restored.load(Ordering::Relaxed),
            restore_failed: s.restore_failed.load(Ordering::Relaxed),
            aborted: s.aborted.load(Ordering::Relaxed),
            not_allowed: s.not_allowed.load(Ordering::Relaxed),
            over_peer_cap: s.over_peer_cap.load(Ordering::Relaxed),
            bad_offers: s.bad_offers.load(Ordering::Relaxed),
            notifications: s.notifications.load(Ordering::Relaxed),
            handoff_failed: h.closed(),
            handoff: h.summary(),
            relayed_bytes: h.relayed_bytes.load(Ordering::Relaxed),
            cpu_us: s.cpu_us.lock().unwrap_or_else(|p| p.into_inner()).summary(),
        }
    }

    /// One-line JSON of [`TargetDaemon::summary`].
    pub fn summary_json(&self) -> String {
        crate::summary::to_line(&self.summary())
    }

    /// Stops accepting offers and joins the threads (offers being served finish).
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes every thread blocked in accept (it returns EINVAL) or watching the
        // listener.
        // SAFETY: the fd is owned by the listener, alive for this call.
        unsafe { libc::shutdown(self.shared.listener.as_raw_fd(), libc::SHUT_RDWR) };
        // And those watching their idle connection and the "none free" signal.
        signal(&self.shared.none_free);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for TargetDaemon {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop_and_join();
        }
    }
}

/// Decrements the restores-in-progress count however the offer ends.
struct Restoring<'a>(&'a AtomicU32);

impl Drop for Restoring<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// While a waiting source is left to the free threads (or to the one idle thread
/// yielding), an idle thread waits on its connection alone this long before
/// watching the listener again: the accept takes microseconds, so this bounds the
/// wake-ups without delaying anything.
const LISTENER_RECHECK: Duration = Duration::from_millis(10);

/// An eventfd for [`Shared::none_free`] (non-blocking: its reset never waits).
fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with valid flags; the descriptor is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes `efd` readable (wakes every thread polling it).
fn signal(efd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: an 8-byte write from a local to an eventfd we own; a full counter
    // (EAGAIN) is readable already.
    let _ = unsafe { libc::write(efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Resets `efd` (non-blocking read of its counter).
fn reset(efd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: an 8-byte read into a local from an eventfd we own (non-blocking).
    let _ = unsafe { libc::read(efd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

/// Accepts one source (blocking), counted as a free thread meanwhile; taking the
/// last free slot signals `none_free`.
/// A connection over its peer's cap is closed at once (before anything is read).
fn accept_control(s: &Shared) -> Option<(ControlConn, SocketAddr, PeerSlot<'_>)> {
    s.free.fetch_add(1, Ordering::SeqCst);
    let r = s.listener.accept();
    if s.free.fetch_sub(1, Ordering::SeqCst) == 1 {
        signal(&s.none_free);
    }
    match r {
        Ok((ctrl, peer)) => {
            if !s.cfg.allow.contains(&peer.ip()) {
                s.stats.not_allowed.fetch_add(1, Ordering::Relaxed);
                log::debug!("specd target: control connection from {peer}, not a peer: closed");
                return None;
            }
            let Some(slot) = PeerSlot::take(s, peer.ip()) else {
                s.stats.over_peer_cap.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "specd target: {peer} holds {} control connections already: closed",
                    s.per_peer_max
                );
                return None;
            };
            match ControlConn::new(ctrl, REPLY_TIMEOUT_DEFAULT) {
                Ok(mut c) => {
                    if let Some(a) = &s.cfg.auth {
                        c.set_auth(Arc::clone(a));
                    }
                    Some((c, peer, slot))
                }
                Err(e) => {
                    log::debug!("specd target: control connection from {peer}: {e}");
                    None
                }
            }
        }
        Err(e) => {
            if !s.stop.load(Ordering::SeqCst) {
                log::warn!("specd target accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            None
        }
    }
}

fn offers_loop(s: &Shared) {
    let mut queue = match ServerQueue::new(s.cfg.server_port) {
        Ok(q) => q,
        Err(e) => {
            log::error!("specd target: sock_diag: {e}");
            return;
        }
    };
    let mut conn: Option<(ControlConn, SocketAddr, PeerSlot<'_>)> = None;
    let mut watch_listener = true;
    while !s.stop.load(Ordering::SeqCst) {
        let (ctrl, peer, _) = match conn.as_mut() {
            Some(c) => c,
            None => match accept_control(s) {
                Some(c) => conn.insert(c),
                None => continue,
            },
        };
        let peer = *peer;
        // While a thread waits in accept it takes the next source: watch the idle
        // connection and the "none free" signal only (a new source then wakes that
        // one thread, not every idle one). With none free, watch the listener.
        let some_free = s.free.load(Ordering::SeqCst) > 0;
        let (idle, other) = if some_free {
            (CONTROL_IDLE_TIMEOUT, Some(s.none_free.as_fd()))
        } else if watch_listener {
            (CONTROL_IDLE_TIMEOUT, Some(s.listener.as_fd()))
        } else {
            (LISTENER_RECHECK, None)
        };
        match ctrl.wait_fd(idle, other) {
            Ok(Ready::Offer) => {}
            Ok(Ready::Listener) if some_free => {
                // The last free thread took a source (or a stop): look again. The
                // signal is reset only while a thread is free again (while none is, it
                // stays set and the threads watch the listener instead), never on a
                // stop (every thread must see it).
                if !s.stop.load(Ordering::SeqCst) && s.free.load(Ordering::SeqCst) > 0 {
                    reset(&s.none_free);
                }
                continue;
            }
            Ok(Ready::Listener) => {
                // A source waits to connect (or the listener was shut down: stop).
                // With no free thread, one idle connection makes room for it.
                if s.free.load(Ordering::SeqCst) == 0 && !s.yielding.swap(true, Ordering::SeqCst) {
                    // Closed before the accept, so its source sees the EOF at once.
                    drop(conn.take());
                    let next = accept_control(s);
                    s.yielding.store(false, Ordering::SeqCst);
                    conn = next;
                } else {
                    watch_listener = false;
                }
                continue;
            }
            Ok(Ready::Idle) if !some_free && !watch_listener => {
                watch_listener = true;
                continue;
            }
            Ok(Ready::Idle) | Err(_) => {
                conn = None;
                continue;
            }
        }
        watch_listener = true;
        let cpu0 = farside_rt::thread_cpu_us();
        let mut admitted: Option<Restoring<'_>> = None;
        let mut bad_offer = false;
        let admit = |st: &farside_migrate::TcpState| -> Result<(), String> {
            if let Err(e) = s.cfg.offers.check(st) {
                bad_offer = true;
                return Err(e);
            }
            let q = queue.read().map_err(|e| format!("cannot read load: {e}"))?;
            let restoring = s.restoring.fetch_add(1, Ordering::SeqCst);
            let guard = Restoring(&s.restoring);
            // Connections the hand-off still holds for the server (its adoption queue
            // was full) are load the accept queue does not show.
            let waiting = s.handoff.pending() as u32;
            if q.saturating_add(restoring).saturating_add(waiting) >= s.cfg.admit_queue_max {
                return Err(format!(
                    "loaded: accept queue {q} + {restoring} restoring + {waiting} waiting for hand-off >= {}",
                    s.cfg.admit_queue_max
                ));
            }
            // Every worker held and the adoption channel full (counting the restores
            // in progress, each to be handed there): a restored connection would wait
            // in the hand-off queue, and be refused with a reset past its bound, while
            // the source may serve it (measured in the flood lab: 27 connections held
            // here, 3 at the source, two migrated ones reset).
            if !s.handoff.has_room_for(restoring as usize) {
                return Err(format!(
                    "loaded: the local server's adoption channel is full ({} waiting there, {restoring} restoring)",
                    s.handoff.in_channel().map_or("?".to_string(), |n| n.to_string())
                ));
            }
            admitted = Some(guard);
            Ok(())
        };
        let handoff = |sock| {
            // Never waits for the server: queued if its adoption queue is full.
            if let Err(e) = s.handoff.hand(sock) {
                log::warn!("specd target: hand-off to the local server failed: {e}");
            }
        };
        let outcome = ctrl.serve_ready(admit, handoff);
        drop(admitted);
        if !ctrl.reusable() {
            conn = None;
        }
        let outcome = match outcome {
            // The source closed its (idle) connection: not an offer.
            Ok(None) => continue,
            Ok(Some(o)) => Ok(o),
            Err(e) => Err(e),
        };
        s.stats.offers.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(TargetOutcome::Restored { .. }) => {
                s.stats.restored.fetch_add(1, Ordering::Relaxed);
                let cpu = farside_rt::thread_cpu_us().saturating_sub(cpu0);
                s.stats
                    .cpu_us
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .record(cpu);
            }
            Ok(TargetOutcome::Refused(r)) if bad_offer => {
                s.stats.refused.fetch_add(1, Ordering::Relaxed);
                s.stats.bad_offers.fetch_add(1, Ordering::Relaxed);
                log::warn!("specd target: refused an offer from {peer}: {r}");
            }
            Ok(TargetOutcome::Refused(r)) => {
                s.stats.refused.fetch_add(1, Ordering::Relaxed);
                log::debug!("specd target: refused {peer}: {r}");
                let mut v = s.refused_sources.lock().unwrap_or_else(|p| p.into_inner());
                if !v.contains(&peer.ip()) && v.len() < REFUSED_SOURCES_MAX {
                    v.push(peer.ip());
                    s.refused_added.notify_one();
                }
            }
            Ok(TargetOutcome::RestoreFailed(r)) => {
                s.stats.restore_failed.fetch_add(1, Ordering::Relaxed);
                log::warn!("specd target: restore from {peer} failed: {r}");
            }
            Ok(TargetOutcome::Aborted) | Ok(TargetOutcome::SourceGone(_)) => {
                s.stats.aborted.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                s.stats.aborted.fetch_add(1, Ordering::Relaxed);
                log::debug!("specd target: offer from {peer}: {e}");
            }
        }
    }
}

fn notify_addr(cfg: &TargetConfig, ip: IpAddr) -> SocketAddr {
    cfg.peers
        .iter()
        .find(|p| p.ip() == ip)
        .copied()
        .unwrap_or(SocketAddr::new(ip, cfg.listen.port()))
}

fn notifier_loop(s: &Shared, sock: &UdpSocket) {
    let mut queue = match ServerQueue::new(s.cfg.server_port) {
        Ok(q) => q,
        Err(e) => {
            log::error!("specd notifier: sock_diag: {e}");
            return;
        }
    };
    while !s.stop.load(Ordering::SeqCst) {
        {
            // Nobody refused: sleep until a refusal (bounded, to see a stop).
            let v = s.refused_sources.lock().unwrap_or_else(|p| p.into_inner());
            if v.is_empty() {
                let _ = s
                    .refused_added
                    .wait_timeout(v, NOTIFY_IDLE_WAIT_MAX)
                    .unwrap_or_else(|p| p.into_inner());
                continue;
            }
        }
        std::thread::sleep(NOTIFY_PERIOD);
        let Ok(q) = queue.read() else { continue };
        let waiting = s.handoff.pending() as u32;
        if q.saturating_add(s.restoring.load(Ordering::SeqCst))
            .saturating_add(waiting)
            >= s.cfg.admit_queue_max
            || !s
                .handoff
                .has_room_for(s.restoring.load(Ordering::SeqCst) as usize)
        {
            continue;
        }
        let sources =
            std::mem::take(&mut *s.refused_sources.lock().unwrap_or_else(|p| p.into_inner()));
        for ip in sources {
            let to = notify_addr(&s.cfg, ip);
            match crate::notify::send(sock, to) {
                Ok(()) => {
                    s.stats.notifications.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => log::debug!("specd notify {to}: {e}"),
            }
        }
    }
}
