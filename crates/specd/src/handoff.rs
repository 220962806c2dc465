//! Handing a restored (or fallen-back) connection to the local web server.
//!
//! - [`Handoff::Adopt`]: to `farside backend --adopt-socket PATH`, by passing the
//!   descriptor (SCM_RIGHTS); the server's workers then serve it like an accepted
//!   connection. No copy, no extra process on the data path.
//! - [`Handoff::Relay`]: to an unmodified server (nginx) listening on a local
//!   address: the daemon opens a new connection to it and relays bytes both ways (two
//!   threads per connection, `read`/`write` through a 64 KiB buffer each; half-closes
//!   are forwarded). Costs two extra socket copies per byte and two threads per
//!   connection, and the server sees 127.0.0.1 as the client. A sockmap `sk_skb`
//!   splice would save the copies but not the bookkeeping (the verdict never sees a
//!   FIN, and bytes already queued are not redirected: DESIGN.md); not done here.
//!
//! # Adoption under overload
//!
//! The adoption channel is the back-end's Unix datagram socket, whose receive queue
//! the kernel bounds at `net.unix.max_dgram_qlen` (10 by default: 11 datagrams) for
//! every socket; an overloaded server's workers drain it slowly. A full channel is
//! not a reason to close a connection the server could still serve, and a caller (a
//! migrator, a target thread) must not wait for it. So:
//!
//! ```text
//! hand(conn) ── queue empty? ── non-blocking sendmsg ── sent ──▶ handed
//!                   │ no                 │ EAGAIN (channel full)
//!                   ▼                    ▼
//!        pending queue (≤ pending_max; beyond: closed, `over_bound`)
//!                   │ one hand-off thread, FIFO: poll(POLLOUT) on the socket
//!                   │ connected to PATH (the kernel wakes it when the server
//!                   │ takes a datagram; RETRY_SLICE at most), then sendmsg again
//!                   ├─ client sent FIN/RST, nothing left to serve ─▶ `client_gone`
//!                   ├─ taken back by its watcher (the source offers it to a
//!                   │  peer: `Taken::take_back`) ─▶ `taken_back`
//!                   ├─ waited more than wait_max ─▶ refused with a reset,
//!                   │                               `waited_too_long`
//!                   └─ other send error (server gone) ─▶ closed, `failed`
//! ```
//!
//! A waiting connection is never left silent past `wait_max` ([`HANDOFF_WAIT_MAX`],
//! 1 s by default): its client gets a reset (`SO_LINGER` 0), a refusal it sees at
//! once, and may retry on a new connection.
//!
//! `hand` returns after a non-blocking send or an enqueue (microseconds), never
//! waiting for the server. A caller that needs to know when the server has taken a
//! connection uses `hand_watched` and waits on its [`Taken`] as long as it chooses
//! (the source's migrator for a fall-back, whose place in the admission window ends
//! then), and can take it back while it still waits, to offer it to a peer.
//! Trade-off against changing the channel (a connected `SOCK_SEQPACKET` socket, bounded by its send buffer rather than
//! `max_dgram_qlen`): that moves the same queue into the kernel, still bounded, so
//! specd would need this queue all the same once it fills, and it changes the
//! back-end's worker loop (one more socket per peer to poll). The datagram channel
//! stays as it is (`farside backend --adopt-socket PATH` unchanged); what it costs:
//! queued connections hold a descriptor each in specd (bounded by `pending_max`),
//! they are invisible to the server's accept-queue length (the target counts them in
//! its admission: [`HandOff::pending`]), and a server that never drains keeps them
//! for `wait_max`. No sysctl is set: the product does not depend on one.
//!
//! Relay mode is unchanged: it connects to the server (at most [`HANDOFF_TIMEOUT`])
//! in the caller's thread.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::stats::Samples;
use crate::trace;

/// Longest a relay hand-over waits for its connect to the local server: a local
/// server that cannot take a connection within a second is stuck, and the connection
/// is closed rather than holding the daemon. Also the adoption send's timeout
/// argument (unused: the socket is non-blocking) and how long a stopping hand-off
/// thread keeps trying to pass what still waits.
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections that may wait for the local server at once, by default
/// ([`HandOff::new`]): the paper's accept queue (64) plus its largest admission
/// window (50), rounded up — as many as the paper's enlarged accept queue held
/// unserved. specd sets its own from `--queue` + `--window` (source) and
/// `--admit-queue-max` (target).
pub const PENDING_DEFAULT: usize = 128;
/// Upper bound of a pending queue: each waiting connection holds a descriptor in
/// specd, whose soft `RLIMIT_NOFILE` is 1,024 by default, shared with the migrators'
/// sockets and the relays.
pub const PENDING_MAX: usize = 512;
/// Longest a connection waits in the hand-off queue for the local server to take it,
/// by default; then it is refused with a reset (`waited_too_long`), never left
/// silent. 1 s: half the shortest client bound the lab and wrk use (2 s; the flood
/// lab's clients 3 s), so the client learns in time to retry on a new connection
/// (steered afresh) rather than time out on silence. A connection the server has not
/// taken in a second waits behind workers held by keep-alive connections, which free
/// them on the scale of seconds: measured in the flood lab, one waited 2.06 s here and
/// then more than 1 s in the adoption socket, unanswered, while the peer was idle.
/// The source offers such a connection to a peer first
/// (`source::HANDOFF_REOFFER_AFTER`); one whose client has gone is closed as soon as
/// that is seen (`client_gone`).
pub const HANDOFF_WAIT_MAX: Duration = Duration::from_secs(1);
/// Longest the hand-off thread sleeps in `poll(POLLOUT)` on a full adoption channel
/// before it re-checks (the kernel's wake-up when the server takes a datagram
/// normally comes first): bounds how late it sees a stop, an expiry or a restarted
/// server.
const RETRY_SLICE: Duration = Duration::from_millis(10);
/// How often the waiting connections are all checked for a client that has gone
/// (one `recv` each, at most [`PENDING_MAX`]); the front one is checked before every
/// send.
const SWEEP_PERIOD: Duration = Duration::from_millis(100);
/// Relay threads' stack: one buffer lives on the heap, little else.
const RELAY_STACK_BYTES: usize = 64 * 1024;
/// Most relayed connections at once (two threads each): bounds the daemon's threads.
pub const RELAYS_MAX: usize = 1024;
/// A relayed connection on which neither direction carried a byte this long is
/// closed (both ways), freeing its slot of [`RELAYS_MAX`]: nginx's own
/// `keepalive_timeout` is 75 s and its body/send timeouts 60 s, so a connection idle
/// for two minutes is one the server has given up on or a client holding a slot.
pub const RELAY_IDLE_DEFAULT: Duration = Duration::from_secs(120);
/// Relay buffer per direction.
const RELAY_BUF_BYTES: usize = 64 * 1024;

/// Where connections go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handoff {
    /// `farside backend --adopt-socket PATH`.
    Adopt(PathBuf),
    /// An unmodified server at this local address, through a relay.
    Relay(SocketAddr),
}

/// Counters of the hand-off.
#[derive(Debug, Default)]
pub struct HandoffStats {
    /// Connections handed over (the server has them).
    pub handed: AtomicU64,
    /// Hand-overs that failed for another reason than a full channel (server gone,
    /// relay connect failed): the connection was closed.
    pub failed: AtomicU64,
    /// Connections that had to wait in the pending queue (the channel was full).
    pub queued: AtomicU64,
    /// Connections waiting now.
    pub pending: AtomicU64,
    /// Most connections waiting at once (high-water mark).
    pub queued_max: AtomicU64,
    /// Arrivals closed because `pending_max` connections were already waiting.
    pub over_bound: AtomicU64,
    /// Waiting connections refused with a reset after `wait_max` (the server took
    /// none of them).
    pub waited_too_long: AtomicU64,
    /// Waiting connections taken back to be offered elsewhere ([`Taken::take_back`]).
    pub taken_back: AtomicU64,
    /// Waiting connections whose client had gone (FIN with nothing left to serve, or
    /// a reset): closed, not handed, not a failure.
    pub client_gone: AtomicU64,
    /// Time in the pending queue of each connection handed after waiting, µs.
    pub wait_us: Mutex<Samples>,
    /// Bytes relayed (both directions), with [`Handoff::Relay`].
    pub relayed_bytes: AtomicU64,
}

impl HandoffStats {
    /// Connections a server could still have served that the hand-off closed:
    /// `failed` + `over_bound` + `waited_too_long` (not `client_gone`).
    pub fn closed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
            + self.over_bound.load(Ordering::Relaxed)
            + self.waited_too_long.load(Ordering::Relaxed)
    }

    /// The counters and the wait times.
    pub fn summary(&self) -> crate::summary::HandoffSummary {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        crate::summary::HandoffSummary {
            handed: c(&self.handed),
            failed: c(&self.failed),
            queued: c(&self.queued),
            pending: c(&self.pending),
            queued_max: c(&self.queued_max),
            over_bound: c(&self.over_bound),
            waited_too_long: c(&self.waited_too_long),
            taken_back: c(&self.taken_back),
            client_gone: c(&self.client_gone),
            wait_us: lock(&self.wait_us).summary(),
        }
    }

    /// `{"handed":…,"failed":…,"queued":…,"pending":…,"queued_max":…,
    /// "over_bound":…,"waited_too_long":…,"client_gone":…,"wait_us":{…}}`.
    pub fn json(&self) -> String {
        crate::summary::to_line(&self.summary())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Hands connections to the local server.
pub struct HandOff {
    how: Handoff,
    adopt: Option<Arc<Adopter>>,
    /// The hand-off thread ([`Handoff::Adopt`]); joined on drop.
    thread: Option<JoinHandle<()>>,
    relays: Arc<AtomicUsize>,
    /// See [`RELAY_IDLE_DEFAULT`].
    relay_idle: Duration,
    stats: Arc<HandoffStats>,
    /// What the connection trace calls this hand-off's steps (`local`, `restored`).
    label: &'static str,
}

impl HandOff {
    /// Prepares the hand-off with the default bounds ([`PENDING_DEFAULT`],
    /// [`HANDOFF_WAIT_MAX`]).
    pub fn new(how: Handoff) -> io::Result<Self> {
        Self::with_bounds(how, PENDING_DEFAULT, HANDOFF_WAIT_MAX)
    }

    /// Prepares the hand-off: for [`Handoff::Adopt`], a non-blocking datagram socket
    /// and the hand-off thread; at most `pending_max` (1..=[`PENDING_MAX`])
    /// connections wait for the server, each at most `wait_max` (non-zero).
    pub fn with_bounds(how: Handoff, pending_max: usize, wait_max: Duration) -> io::Result<Self> {
        if !(1..=PENDING_MAX).contains(&pending_max) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("hand-off pending bound {pending_max}: must be in 1..={PENDING_MAX}"),
            ));
        }
        if wait_max.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "hand-off wait bound must be positive",
            ));
        }
        let stats = Arc::new(HandoffStats::default());
        let (adopt, thread) = match &how {
            Handoff::Adopt(path) => {
                let via = UnixDatagram::unbound()?;
                via.set_nonblocking(true)?;
                let charge = match datagram_charge() {
                    Ok(c) => Some(c),
                    Err(e) => {
                        log::warn!("specd hand-off: cannot measure a datagram's charge ({e}): the channel's fill is judged by poll alone");
                        None
                    }
                };
                let a = Arc::new(Adopter {
                    path: path.clone(),
                    via,
                    charge,
                    capacity: channel_capacity(),
                    pending_max,
                    wait_max,
                    state: Mutex::new(Pending::default()),
                    wake: Condvar::new(),
                });
                let (a2, s2) = (Arc::clone(&a), Arc::clone(&stats));
                let t = std::thread::Builder::new()
                    .name("specd-handoff".into())
                    .spawn(move || a2.run(&s2))?;
                (Some(a), Some(t))
            }
            Handoff::Relay(_) => (None, None),
        };
        Ok(Self {
            how,
            adopt,
            thread,
            relays: Arc::new(AtomicUsize::new(0)),
            relay_idle: RELAY_IDLE_DEFAULT,
            stats,
            label: "local",
        })
    }

    /// Names this hand-off's steps in the connection trace ([`crate::trace`]):
    /// `local` by default (the source's fall-backs), `restored` on the target.
    pub fn set_trace_label(&mut self, label: &'static str) {
        self.label = label;
    }

    /// The counters.
    pub fn stats(&self) -> &HandoffStats {
        &self.stats
    }

    /// Connections waiting for the local server now (0 with [`Handoff::Relay`]).
    pub fn pending(&self) -> usize {
        self.stats.pending.load(Ordering::Relaxed) as usize
    }

    /// Whether a connection handed now would reach the server at once, with room left
    /// for `others` more besides (restores in progress that will be handed here): with
    /// [`Handoff::Adopt`], nothing waits in the queue, the server's adoption channel
    /// has room (`poll(POLLOUT)` on the socket connected to it, which the kernel
    /// clears while the server's receive queue is full, whoever filled it: this
    /// daemon's other hand-off too), and the datagrams this hand-off
    /// sent that the server has not taken yet ([`HandOff::in_channel`]) plus `others`
    /// stay under the channel's capacity (`net.unix.max_dgram_qlen` + 1), so offers
    /// admitted together cannot overflow it between admission and hand-off. False if
    /// no server is bound at the path; always true with [`Handoff::Relay`]. A
    /// migration target admits only while this holds, since a connection that must
    /// wait in the queue is refused past `wait_max`.
    pub fn has_room_for(&self, others: usize) -> bool {
        let Some(a) = &self.adopt else { return true };
        let mut p = lock(&a.state);
        if !p.items.is_empty() {
            return false;
        }
        if !p.connected {
            p.connected = a.via.connect(&a.path).is_ok();
        }
        if !p.connected || !poll_out(a.via.as_raw_fd(), Duration::ZERO) {
            return false;
        }
        a.in_channel()
            .is_none_or(|n| n.saturating_add(others) < a.capacity)
    }

    /// Connections this hand-off passed that the server has not taken yet (still in
    /// its adoption channel): the bytes the kernel still charges to the sending
    /// socket (`SIOCOUTQ`, released as the server receives each datagram) over one
    /// datagram's charge. `None` with [`Handoff::Relay`], or if the charge could not be
    /// measured.
    pub fn in_channel(&self) -> Option<usize> {
        self.adopt.as_ref()?.in_channel()
    }

    /// Hands `conn` over. With [`Handoff::Adopt`] it never waits for the server: the
    /// connection is passed at once if the channel has room, else queued (see the
    /// module doc); `Err` means it was closed now (over the bound, or the server is
    /// not there). Later outcomes are counted in [`HandoffStats`]. With
    /// [`Handoff::Relay`], `Err` means the relay could not start (connection closed).
    pub fn hand(&self, conn: TcpStream) -> io::Result<()> {
        self.hand_with(conn, None).map(|_| ())
    }

    /// As [`HandOff::hand`], and what it returns tells when the connection's wait for
    /// the server has ended (at once if it was passed, or closed, without waiting),
    /// and can take it back while it still waits ([`Taken::take_back`]).
    pub fn hand_watched(&self, conn: TcpStream) -> io::Result<Taken> {
        let (tx, rx) = std::sync::mpsc::sync_channel(0);
        let queued = self.hand_with(conn, Some(tx))?;
        let back = match (queued, &self.adopt) {
            (Some(id), Some(a)) => Some((Arc::clone(a), id, Arc::clone(&self.stats))),
            _ => None,
        };
        Ok(Taken { rx, back })
    }

    /// Hands `conn` over; `Some(id)` when it waits in the queue under that id.
    fn hand_with(&self, conn: TcpStream, watch: Option<SyncSender<()>>) -> io::Result<Option<u64>> {
        let client = trace::on().then(|| conn.peer_addr().ok()).flatten();
        match (&self.how, &self.adopt) {
            (Handoff::Adopt(_), Some(a)) => a.hand(conn, &self.stats, watch, (self.label, client)),
            (Handoff::Relay(to), _) => {
                let r = self.relay(conn, *to);
                let step = match &r {
                    Ok(()) => {
                        self.stats.handed.fetch_add(1, Ordering::Relaxed);
                        "relayed"
                    }
                    Err(_) => {
                        self.stats.failed.fetch_add(1, Ordering::Relaxed);
                        "failed"
                    }
                };
                trace_step((self.label, client), step, 0);
                r.map(|()| None)
            }
            (Handoff::Adopt(_), None) => unreachable!("adopt has its socket"),
        }
    }

    /// Closes relayed connections idle (no byte either way) for `idle` instead of
    /// [`RELAY_IDLE_DEFAULT`] (non-zero).
    pub fn set_relay_idle(&mut self, idle: Duration) {
        if !idle.is_zero() {
            self.relay_idle = idle;
        }
    }

    fn relay(&self, conn: TcpStream, to: SocketAddr) -> io::Result<()> {
        if self.relays.fetch_add(1, Ordering::SeqCst) >= RELAYS_MAX {
            self.relays.fetch_sub(1, Ordering::SeqCst);
            return Err(io::Error::other(format!("{RELAYS_MAX} relays already")));
        }
        let guard = RelaySlot(Arc::clone(&self.relays));
        let server = TcpStream::connect_timeout(&to, HANDOFF_TIMEOUT)?;
        server.set_nodelay(true)?;
        conn.set_nodelay(true)?;
        conn.set_nonblocking(false)?;
        // Each read and write wakes at least every quarter of the idle bound to
        // look at the connection's last activity (either direction).
        let slice = (self.relay_idle / 4).max(Duration::from_millis(1));
        for c in [&conn, &server] {
            c.set_read_timeout(Some(slice))?;
            c.set_write_timeout(Some(self.relay_idle))?;
        }
        let (c2, s2) = (conn.try_clone()?, server.try_clone()?);
        let stats = Arc::clone(&self.stats);
        let stats2 = Arc::clone(&self.stats);
        let activity = Arc::new(Activity::new(self.relay_idle));
        let activity2 = Arc::clone(&activity);
        let up = std::thread::Builder::new()
            .name("specd-relay-up".into())
            .stack_size(RELAY_STACK_BYTES)
            .spawn(move || pump(conn, server, &stats, &activity))?;
        std::thread::Builder::new()
            .name("specd-relay-down".into())
            .stack_size(RELAY_STACK_BYTES)
            .spawn(move || {
                pump(s2, c2, &stats2, &activity2);
                let _ = up.join();
                drop(guard);
            })?;
        Ok(())
    }
}

impl Drop for HandOff {
    /// Stops the hand-off thread: it keeps passing what waits for at most
    /// [`HANDOFF_TIMEOUT`], then closes the rest (counted `failed`).
    fn drop(&mut self) {
        if let Some(a) = &self.adopt {
            lock(&a.state).stop = true;
            a.wake.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The adoption channel and the connections waiting for it.
struct Adopter {
    path: PathBuf,
    /// Non-blocking; connected to `path` when it could be (so that `poll(POLLOUT)`
    /// reports the server's queue having room), re-connected after an error.
    via: UnixDatagram,
    /// Bytes one adoption datagram is charged to `via` until the server takes it
    /// ([`datagram_charge`]); `None` if it could not be measured.
    charge: Option<usize>,
    /// Datagrams the server's channel holds ([`channel_capacity`]).
    capacity: usize,
    pending_max: usize,
    wait_max: Duration,
    state: Mutex<Pending>,
    /// Signalled when a connection is queued and on stop.
    wake: Condvar,
}

#[derive(Default)]
struct Pending {
    /// Oldest first: sent in arrival order, and the front is the first to expire.
    items: VecDeque<Waiting>,
    /// The id of the next connection queued ([`Taken::take_back`] finds it by it).
    next_id: u64,
    /// `via` is connected to the socket now bound at `path`, as far as we know.
    connected: bool,
    stop: bool,
}

struct Waiting {
    id: u64,
    conn: TcpStream,
    since: Instant,
    /// The trace's label and the client's address ([`crate::trace`]).
    who: Who,
    /// Dropped with the entry, whatever ends its wait (passed, expired, gone,
    /// failed, closed at stop): that wakes a [`Taken`] watching it.
    _watch: Option<SyncSender<()>>,
}

/// The end of one connection's wait for the local server ([`HandOff::hand_watched`]):
/// it was passed to the server, or closed (expired, client gone, server gone, stop),
/// or taken back ([`Taken::take_back`]).
pub struct Taken {
    rx: Receiver<()>,
    /// Where it waits and under which id, when it was queued.
    back: Option<(Arc<Adopter>, u64, Arc<HandoffStats>)>,
}

impl Taken {
    /// Waits up to `t` for the connection's wait to end; `true` if it has.
    pub fn wait(&self, t: Duration) -> bool {
        !matches!(self.rx.recv_timeout(t), Err(RecvTimeoutError::Timeout))
    }

    /// Takes the connection out of the hand-off queue if it still waits there (to
    /// offer it elsewhere), with how long it waited; `None` if it was passed or
    /// closed already (or never queued).
    pub fn take_back(&self) -> Option<(TcpStream, Duration)> {
        let (a, id, stats) = self.back.as_ref()?;
        let mut p = lock(&a.state);
        let i = p.items.iter().position(|w| w.id == *id)?;
        let w = p.items.remove(i)?;
        stats.pending.store(p.items.len() as u64, Ordering::Relaxed);
        stats.taken_back.fetch_add(1, Ordering::Relaxed);
        drop(p);
        let waited = w.since.elapsed();
        trace_step(w.who, "taken_back", waited.as_micros() as u64);
        Some((w.conn, waited))
    }
}

enum Sent {
    Yes,
    /// The server's queue is full (EAGAIN).
    Full,
    Failed(io::Error),
}

impl Adopter {
    /// See [`HandOff::in_channel`].
    fn in_channel(&self) -> Option<usize> {
        let unit = self.charge?;
        outq_bytes(self.via.as_raw_fd())
            .ok()
            .map(|b| b.div_ceil(unit))
    }

    /// One non-blocking send, under the state's lock (sends stay in order).
    fn try_send(&self, p: &mut Pending, conn: &TcpStream) -> Sent {
        if !p.connected {
            p.connected = self.via.connect(&self.path).is_ok();
        }
        match farside_rt::fdpass::send_to(
            &self.via,
            &self.path,
            farside_rt::fdpass::TAG_ADOPT,
            conn.as_raw_fd(),
            HANDOFF_TIMEOUT,
        ) {
            Ok(()) => Sent::Yes,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Sent::Full,
            Err(e) => {
                p.connected = false;
                Sent::Failed(e)
            }
        }
    }

    fn hand(
        &self,
        conn: TcpStream,
        stats: &HandoffStats,
        watch: Option<SyncSender<()>>,
        who: Who,
    ) -> io::Result<Option<u64>> {
        let mut p = lock(&self.state);
        if p.items.is_empty() {
            match self.try_send(&mut p, &conn) {
                Sent::Yes => {
                    stats.handed.fetch_add(1, Ordering::Relaxed);
                    trace_step(who, "handed", 0);
                    return Ok(None);
                }
                Sent::Failed(e) => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    trace_step(who, "failed", 0);
                    return Err(e);
                }
                Sent::Full => {}
            }
        }
        if p.items.len() >= self.pending_max {
            // Rare: make room from clients that have gone before refusing a live one.
            sweep(&mut p, stats);
        }
        if p.items.len() >= self.pending_max {
            stats.over_bound.fetch_add(1, Ordering::Relaxed);
            trace_step(who, "over_bound", 0);
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "{} connections already wait for the local server (bound): closed",
                    self.pending_max
                ),
            ));
        }
        trace_step(who, "queued", 0);
        let id = p.next_id;
        p.next_id += 1;
        p.items.push_back(Waiting {
            id,
            conn,
            since: Instant::now(),
            who,
            _watch: watch,
        });
        stats.queued.fetch_add(1, Ordering::Relaxed);
        stats
            .queued_max
            .fetch_max(p.items.len() as u64, Ordering::Relaxed);
        stats.pending.store(p.items.len() as u64, Ordering::Relaxed);
        drop(p);
        self.wake.notify_one();
        Ok(Some(id))
    }

    /// Passes waiting connections from the front until the channel is full or none
    /// waits; drops the expired and the gone on the way. Returns (full, passed).
    fn drain(&self, p: &mut Pending, stats: &HandoffStats) -> (bool, usize) {
        let mut passed = 0;
        let full = loop {
            let Some(w) = p.items.pop_front() else {
                break false;
            };
            if w.since.elapsed() > self.wait_max {
                stats.waited_too_long.fetch_add(1, Ordering::Relaxed);
                trace_step(w.who, "refused", w.since.elapsed().as_micros() as u64);
                log::warn!(
                    "specd: a connection waited {:?} for the local server: refused (reset)",
                    self.wait_max
                );
                refuse(w.conn);
                continue;
            }
            if client_gone(&w.conn) {
                stats.client_gone.fetch_add(1, Ordering::Relaxed);
                trace_step(w.who, "client_gone", w.since.elapsed().as_micros() as u64);
                continue;
            }
            match self.try_send(p, &w.conn) {
                Sent::Yes => {
                    passed += 1;
                    stats.handed.fetch_add(1, Ordering::Relaxed);
                    let us = w.since.elapsed().as_micros() as u64;
                    lock(&stats.wait_us).record(us);
                    trace_step(w.who, "handed", us);
                }
                Sent::Full => {
                    p.items.push_front(w);
                    break true;
                }
                Sent::Failed(e) => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    trace_step(w.who, "failed", w.since.elapsed().as_micros() as u64);
                    log::warn!("specd: hand-off to the local server failed: {e}");
                }
            }
        };
        stats.pending.store(p.items.len() as u64, Ordering::Relaxed);
        (full, passed)
    }

    /// The hand-off thread: waits for queued connections and passes them as the
    /// server makes room.
    fn run(&self, stats: &HandoffStats) {
        let mut last_sweep = Instant::now();
        let mut stop_by: Option<Instant> = None;
        // The last poll said the channel has room: a send that finds it full anyway
        // means `via` is connected to a socket no longer bound at the path (the server
        // restarted), whose poll tells nothing; reconnect.
        let mut room_seen = false;
        let mut p = lock(&self.state);
        loop {
            while p.items.is_empty() && !p.stop {
                p = self.wake.wait(p).unwrap_or_else(|e| e.into_inner());
            }
            if p.items.is_empty() {
                return;
            }
            if p.stop
                && *stop_by.get_or_insert_with(|| Instant::now() + HANDOFF_TIMEOUT)
                    <= Instant::now()
            {
                let left = p.items.len() as u64;
                p.items.clear();
                stats.failed.fetch_add(left, Ordering::Relaxed);
                stats.pending.store(0, Ordering::Relaxed);
                log::warn!(
                    "specd: stopping: {left} connections still waiting for the local server closed"
                );
                return;
            }
            if last_sweep.elapsed() >= SWEEP_PERIOD {
                sweep(&mut p, stats);
                last_sweep = Instant::now();
            }
            let (full, passed) = self.drain(&mut p, stats);
            if !full {
                room_seen = false;
                continue;
            }
            if room_seen && passed == 0 {
                p.connected = false;
            }
            drop(p);
            room_seen = poll_out(self.via.as_raw_fd(), RETRY_SLICE);
            p = lock(&self.state);
        }
    }
}

/// A hand-off's trace label and its connection's client ([`crate::trace`]).
type Who = (&'static str, Option<SocketAddr>);

fn trace_step((label, client): Who, step: &str, us: u64) {
    if trace::on() {
        trace::record(client, &format!("{label}.{step}"), us);
    }
}

/// Closes `conn` with a reset (`SO_LINGER` 0): a clear refusal the client sees at
/// once, not a FIN it may take for an answer still to come.
pub fn refuse(conn: TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket we own with a linger struct of the stated size.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(conn);
}

/// Drops every waiting connection whose client has gone.
fn sweep(p: &mut Pending, stats: &HandoffStats) {
    let before = p.items.len();
    p.items.retain(|w| !client_gone(&w.conn));
    let gone = (before - p.items.len()) as u64;
    if gone > 0 {
        stats.client_gone.fetch_add(gone, Ordering::Relaxed);
        stats.pending.store(p.items.len() as u64, Ordering::Relaxed);
    }
}

/// The client has gone and left nothing to serve: a FIN with no request byte
/// waiting (recv peeks 0), or an error such as a reset. One non-blocking `recv`.
fn client_gone(conn: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: recv into a 1-byte buffer we own; MSG_PEEK leaves the byte queued.
    let n = unsafe {
        libc::recv(
            conn.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => true,
        n if n > 0 => false,
        _ => !matches!(
            io::Error::last_os_error().kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

/// Waits until `fd` is writable, at most `timeout`; `true` if it is.
/// Datagrams a Unix datagram socket's receive queue holds: the kernel refuses more
/// past `net.unix.max_dgram_qlen` (of this network namespace; 10 by default).
fn channel_capacity() -> usize {
    std::fs::read_to_string("/proc/sys/net/unix/max_dgram_qlen")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(10)
        .saturating_add(1)
}

/// Bytes the kernel charges to a sending socket for one adoption datagram (one tag
/// byte and one descriptor: its buffer's truesize), until the receiver takes it:
/// measured on a private socket pair, passing `/dev/null`.
fn datagram_charge() -> io::Result<usize> {
    let (a, b) = UnixDatagram::pair()?;
    let null = std::fs::File::open("/dev/null")?;
    farside_rt::fdpass::send_fd(
        a.as_raw_fd(),
        None,
        farside_rt::fdpass::TAG_ADOPT,
        null.as_raw_fd(),
    )?;
    let charge = outq_bytes(a.as_raw_fd())?;
    // The received descriptor is closed with the result.
    drop(farside_rt::fdpass::recv_fds(
        b.as_raw_fd(),
        1,
        libc::MSG_DONTWAIT,
    ));
    if charge == 0 {
        return Err(io::Error::other("SIOCOUTQ reported no charge"));
    }
    Ok(charge)
}

/// `SIOCOUTQ` of a Unix socket: bytes sent and not yet taken by the receiver.
fn outq_bytes(fd: i32) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int through the pointer.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

fn poll_out(fd: i32, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
    n > 0 && p.revents & libc::POLLOUT != 0
}

/// Frees a relay slot when both directions are done.
struct RelaySlot(Arc<AtomicUsize>);

impl Drop for RelaySlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The last time either direction of a relayed connection carried bytes.
struct Activity {
    t0: Instant,
    /// Milliseconds since `t0`.
    last_ms: AtomicU64,
    idle: Duration,
}

impl Activity {
    fn new(idle: Duration) -> Self {
        Self {
            t0: Instant::now(),
            last_ms: AtomicU64::new(0),
            idle,
        }
    }

    fn now_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn expired(&self) -> bool {
        let idle_ms = self.idle.as_millis() as u64;
        self.now_ms()
            .saturating_sub(self.last_ms.load(Ordering::Relaxed))
            >= idle_ms
    }
}

/// Copies `from` → `to` until EOF or an error, then half-closes `to` (forwarding the
/// FIN); on an error, or when neither direction moved a byte for the idle bound,
/// both are shut down so the other direction ends too.
fn pump(mut from: TcpStream, mut to: TcpStream, stats: &HandoffStats, activity: &Activity) {
    let mut buf = vec![0u8; RELAY_BUF_BYTES];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) && !activity.expired() =>
            {
                continue
            }
            Err(_) => {
                let _ = to.shutdown(Shutdown::Both);
                let _ = from.shutdown(Shutdown::Both);
                return;
            }
        };
        activity.touch();
        if to.write_all(&buf[..n]).is_err() {
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
        activity.touch();
        stats.relayed_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Longest any awaited condition or client read may take here, and the hand-off
    /// wait bound of the tests that do not test it (no wall-clock bound in a test).
    const AWAIT_MAX: Duration = Duration::from_secs(10);
    const REQUEST: &[u8] = b"GET /files/100 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

    fn await_cond(what: &str, mut f: impl FnMut() -> bool) {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < AWAIT_MAX, "timed out awaiting {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The kernel's bound on a datagram socket's queue (the adoption channel).
    fn max_dgram_qlen() -> usize {
        std::fs::read_to_string("/proc/sys/net/unix/max_dgram_qlen")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(10)
    }

    /// A real `farside backend --adopt-socket` with one worker: the first adopted
    /// connection whose client sends nothing yet keeps it busy (it waits for the
    /// request), so nothing more leaves the adoption queue until the clients ask.
    fn one_worker_backend(name: &str) -> (PathBuf, farside_backend::Handle) {
        let path = std::env::temp_dir().join(format!(
            "farside-handoff-{}-{name}.sock",
            std::process::id()
        ));
        let (_, handle) = farside_backend::spawn(farside_backend::BackendArgs {
            listen: "127.0.0.1:0".parse().unwrap(),
            workers: 1,
            adopt_socket: Some(path.clone()),
            ..farside_backend::BackendArgs::default()
        })
        .expect("backend");
        (path, handle)
    }

    /// A connected pair through `front`: (client, server side to hand over).
    fn pair(front: &TcpListener) -> (TcpStream, TcpStream) {
        let c = TcpStream::connect(front.local_addr().unwrap()).unwrap();
        c.set_read_timeout(Some(AWAIT_MAX)).unwrap();
        let (s, _) = front.accept().unwrap();
        (c, s)
    }

    /// Sends the request and reads until the server closes: the response, or
    /// nothing when the connection was closed unserved.
    fn ask(c: &mut TcpStream) -> Vec<u8> {
        // A closed peer may answer the write or the read with a reset: unserved.
        if c.write_all(REQUEST).is_err() {
            return Vec::new();
        }
        ask_read(c)
    }

    fn served(got: &[u8]) -> bool {
        got.starts_with(b"HTTP/1.1 200")
    }

    fn count(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }

    #[test]
    fn more_connections_than_the_adoption_queue_holds_wait_and_are_all_served() {
        let (path, backend) = one_worker_backend("many");
        let h = HandOff::with_bounds(Handoff::Adopt(path), PENDING_DEFAULT, AWAIT_MAX).unwrap();
        // Beyond what the worker and the kernel's datagram queue (qlen + 1) take.
        let n = max_dgram_qlen() + 12;
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut clients = Vec::new();
        for i in 0..n {
            let (c, s) = pair(&front);
            // No client has asked yet, so the server cannot drain: a hand-off that
            // waited for room would never return (the old one failed after 1 s).
            h.hand(s)
                .unwrap_or_else(|e| panic!("connection {i} closed: {e}"));
            clients.push(c);
        }
        let st = h.stats();
        await_cond("every connection handed or waiting", || {
            count(&st.handed) + count(&st.pending) == n as u64
        });
        assert!(count(&st.pending) > 0, "{}", st.json());
        assert_eq!(count(&st.failed) + count(&st.over_bound), 0);
        // Now the clients ask; the one worker serves them one after another.
        for c in &mut clients {
            c.write_all(REQUEST).unwrap();
        }
        for (i, c) in clients.iter_mut().enumerate() {
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            assert!(
                served(&got),
                "client {i}: {:?}",
                String::from_utf8_lossy(&got)
            );
        }
        assert_eq!(count(&st.handed), n as u64, "{}", st.json());
        assert_eq!(count(&st.pending), 0);
        assert!(count(&st.queued) > 0 && count(&st.queued_max) > 0);
        assert_eq!(lock(&st.wait_us).count, count(&st.queued));
        assert_eq!(st.closed() + count(&st.client_gone), 0);
        // Every key holds what its name says (the format's arguments are positional).
        let v: serde_json::Value = serde_json::from_str(&st.json()).expect("JSON");
        assert_eq!(v["handed"], n as u64);
        assert_eq!(v["queued"], count(&st.queued));
        assert_eq!(v["queued_max"], count(&st.queued_max));
        assert_eq!(v["pending"], 0);
        assert_eq!(v["wait_us"]["count"], count(&st.queued));
        for k in ["failed", "over_bound", "waited_too_long", "client_gone"] {
            assert_eq!(v[k], 0, "{k}");
        }
        drop(h);
        backend.stop();
    }

    #[test]
    fn the_channel_counts_what_the_server_has_not_taken_and_keeps_room_for_restores() {
        let (path, backend) = one_worker_backend("count");
        let h = HandOff::with_bounds(Handoff::Adopt(path), PENDING_DEFAULT, AWAIT_MAX).unwrap();
        assert_eq!(h.in_channel(), Some(0));
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut clients = Vec::new();
        // The worker takes the first and waits for its request: three stay.
        for _ in 0..4 {
            let (c, s) = pair(&front);
            h.hand(s).unwrap();
            clients.push(c);
        }
        await_cond("three in the channel", || h.in_channel() == Some(3));
        let capacity = max_dgram_qlen() + 1;
        assert!(h.has_room_for(capacity - 4), "room for one more");
        assert!(
            !h.has_room_for(capacity - 3),
            "restores in progress fill it"
        );
        for c in &mut clients {
            c.write_all(REQUEST).unwrap();
        }
        for c in &mut clients {
            assert!(served(&ask_read(c)));
        }
        await_cond("the channel empty", || h.in_channel() == Some(0));
        drop(h);
        backend.stop();
    }

    #[test]
    fn room_is_seen_only_while_the_adoption_channel_takes_a_connection_at_once() {
        let (path, backend) = one_worker_backend("room");
        let gone = HandOff::new(Handoff::Adopt(path.with_extension("none"))).unwrap();
        assert!(!gone.has_room_for(0), "no server bound: no room");
        let h = HandOff::with_bounds(Handoff::Adopt(path), PENDING_DEFAULT, AWAIT_MAX).unwrap();
        assert!(h.has_room_for(0), "an idle server has room");
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut clients = Vec::new();
        // The worker takes the first and waits for its request; the channel then
        // fills (qlen + 1 datagrams) and the next waits in the queue.
        let n = max_dgram_qlen() + 3;
        for _ in 0..n {
            let (c, s) = pair(&front);
            h.hand(s).unwrap();
            clients.push(c);
        }
        await_cond("a connection waiting in the queue", || h.pending() > 0);
        assert!(!h.has_room_for(0), "a connection waits: no room");
        assert_eq!(
            h.in_channel(),
            Some(max_dgram_qlen() + 1),
            "the channel full"
        );
        // The clients ask; once the worker has drained the channel, room again.
        for c in &mut clients {
            c.write_all(REQUEST).unwrap();
        }
        for c in &mut clients {
            assert!(served(&ask_read(c)));
        }
        assert!(h.has_room_for(0), "drained: room");
        drop(h);
        backend.stop();
    }

    fn ask_read(c: &mut TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        got
    }

    #[test]
    fn a_watched_hand_off_ends_when_the_server_takes_the_connection() {
        let (path, backend) = one_worker_backend("watched");
        let h = HandOff::with_bounds(Handoff::Adopt(path), PENDING_DEFAULT, AWAIT_MAX).unwrap();
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        // The channel has room: passed at once, the wait is already over.
        let (mut first, s) = pair(&front);
        assert!(h.hand_watched(s).unwrap().wait(Duration::ZERO));
        // Fill the worker (it waits for `first`'s request) and the channel.
        let mut clients = Vec::new();
        for _ in 0..max_dgram_qlen() + 2 {
            let (c, s) = pair(&front);
            h.hand(s).unwrap();
            clients.push(c);
        }
        let st = h.stats();
        await_cond("a connection waiting", || count(&st.pending) > 0);
        let (mut last, s) = pair(&front);
        let taken = h.hand_watched(s).unwrap();
        assert!(!taken.wait(Duration::from_millis(50)), "{}", st.json());
        // The clients ask, the worker drains the channel, the watched one is passed.
        for c in std::iter::once(&mut first).chain(clients.iter_mut()) {
            c.write_all(REQUEST).unwrap();
        }
        assert!(taken.wait(AWAIT_MAX), "{}", st.json());
        assert!(served(&ask(&mut last)));
        drop(h);
        backend.stop();
    }

    #[test]
    fn a_client_that_closes_while_queued_is_counted_gone_not_handed() {
        let (path, backend) = one_worker_backend("gone");
        let h = HandOff::with_bounds(Handoff::Adopt(path), PENDING_DEFAULT, AWAIT_MAX).unwrap();
        let st = h.stats();
        let n = max_dgram_qlen() + 4;
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut clients: Vec<TcpStream> = (0..n)
            .map(|_| {
                let (c, s) = pair(&front);
                h.hand(s).unwrap();
                c
            })
            .collect();
        await_cond("connections waiting in specd", || {
            count(&st.handed) + count(&st.pending) == n as u64 && count(&st.pending) > 0
        });
        let queued = count(&st.queued);
        let (victim, s) = pair(&front);
        h.hand(s).unwrap();
        assert_eq!(count(&st.queued), queued + 1, "the victim waits in specd");
        drop(victim);
        // The periodic check finds it while the server is still blocked.
        await_cond("the gone client counted", || count(&st.client_gone) == 1);
        for (i, c) in clients.iter_mut().enumerate() {
            assert!(served(&ask(c)), "client {i}");
        }
        assert_eq!(count(&st.handed), n as u64, "{}", st.json());
        assert_eq!(count(&st.client_gone), 1);
        assert_eq!(st.closed(), 0, "{}", st.json());
        assert_eq!(count(&st.pending), 0);
        drop(h);
        backend.stop();
    }

    #[test]
    fn an_arrival_over_the_bound_is_closed_and_counted_and_the_others_are_served() {
        const BOUND: usize = 3;
        let (path, backend) = one_worker_backend("bound");
        let h = HandOff::with_bounds(Handoff::Adopt(path), BOUND, AWAIT_MAX).unwrap();
        let st = h.stats();
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut kept = Vec::new();
        let mut refused = None;
        for _ in 0..max_dgram_qlen() + 2 + BOUND + 8 {
            let (c, s) = pair(&front);
            match h.hand(s) {
                Ok(()) => kept.push(c),
                Err(e) => {
                    eprintln!("over the bound: {e}");
                    refused = Some(c);
                    break;
                }
            }
        }
        let mut refused = refused.expect("an arrival over the bound");
        assert_eq!(count(&st.over_bound), 1);
        let mut b = [0u8; 1];
        assert_eq!(refused.read(&mut b).unwrap_or(0), 0, "closed at once");
        for (i, c) in kept.iter_mut().enumerate() {
            assert!(served(&ask(c)), "client {i}");
        }
        assert_eq!(count(&st.handed), kept.len() as u64, "{}", st.json());
        assert_eq!(count(&st.failed) + count(&st.waited_too_long), 0);
        assert_eq!(st.closed(), 1);
        drop(h);
        backend.stop();
    }

    /// Whether the peer has reset `c` (a non-blocking peek).
    fn was_reset(c: &TcpStream) -> bool {
        c.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let r = c.peek(&mut b);
        c.set_nonblocking(false).unwrap();
        matches!(r, Err(e) if e.kind() == io::ErrorKind::ConnectionReset)
    }

    #[test]
    fn a_waiting_connection_can_be_taken_back_and_handed_again() {
        let (path, backend) = one_worker_backend("back");
        let h = HandOff::with_bounds(Handoff::Adopt(path), PENDING_DEFAULT, AWAIT_MAX).unwrap();
        let st = h.stats();
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        // Passed at once: nothing to take back.
        let (mut first, s) = pair(&front);
        let passed = h.hand_watched(s).unwrap();
        assert!(passed.take_back().is_none());
        // Fill the worker (waiting for `first`'s request) and the channel.
        let mut clients = Vec::new();
        for _ in 0..max_dgram_qlen() + 2 {
            let (c, s) = pair(&front);
            h.hand(s).unwrap();
            clients.push(c);
        }
        await_cond("a connection waiting", || count(&st.pending) > 0);
        let (mut mine, s) = pair(&front);
        let taken = h.hand_watched(s).unwrap();
        let pending = count(&st.pending);
        let (back, _waited) = taken.take_back().expect("still waiting: taken back");
        assert_eq!(count(&st.taken_back), 1, "{}", st.json());
        assert_eq!(count(&st.pending), pending - 1);
        // Taken once: a second call finds nothing, and its wait is over.
        assert!(taken.take_back().is_none());
        assert!(taken.wait(Duration::ZERO));
        // The connection is whole: handed again, it is served like the others.
        h.hand(back).unwrap();
        for c in std::iter::once(&mut first).chain(clients.iter_mut()) {
            c.write_all(REQUEST).unwrap();
        }
        assert!(served(&ask(&mut mine)), "{}", st.json());
        for (i, c) in clients.iter_mut().enumerate() {
            let mut got = Vec::new();
            let _ = c.read_to_end(&mut got);
            assert!(served(&got), "client {i}");
        }
        assert_eq!(st.closed(), 0, "{}", st.json());
        drop(h);
        backend.stop();
    }

    #[test]
    fn a_connection_the_server_does_not_take_in_time_is_refused_with_a_reset() {
        let wait_max = Duration::from_millis(200);
        let (path, backend) = one_worker_backend("expire");
        let h = HandOff::with_bounds(Handoff::Adopt(path), PENDING_DEFAULT, wait_max).unwrap();
        let st = h.stats();
        let n = max_dgram_qlen() + 4;
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut clients: Vec<TcpStream> = (0..n)
            .map(|_| {
                let (c, s) = pair(&front);
                h.hand(s).unwrap();
                c
            })
            .collect();
        await_cond("the waiting ones expired", || {
            count(&st.handed) + count(&st.waited_too_long) == n as u64 && count(&st.pending) == 0
        });
        let expired = count(&st.waited_too_long);
        assert!(expired > 0);
        // Each expired one was refused with a reset, not left silent or closed
        // with a FIN its client could take for an answer still to come.
        let reset = clients.iter().filter(|c| was_reset(c)).count();
        assert_eq!(reset as u64, expired, "{}", st.json());
        let unserved = clients
            .iter_mut()
            .map(ask)
            .filter(|got| !served(got))
            .count();
        assert_eq!(unserved as u64, expired, "{}", st.json());
        assert_eq!(st.closed(), expired);
        drop(h);
        backend.stop();
    }

    #[test]
    fn adoption_without_a_server_fails_at_once_and_counts() {
        let path = std::env::temp_dir().join(format!(
            "farside-handoff-{}-nobody.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let h = HandOff::with_bounds(Handoff::Adopt(path), PENDING_DEFAULT, AWAIT_MAX).unwrap();
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let (_c, s) = pair(&front);
        assert!(h.hand(s).is_err());
        assert_eq!(count(&h.stats().failed), 1);
        assert_eq!(h.pending(), 0);
    }

    #[test]
    fn an_idle_relay_is_closed_both_ways_and_frees_its_slot() {
        // A server that takes the connection and never says a thing.
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let server_addr = server.local_addr().unwrap();
        let silent = std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            s.set_read_timeout(Some(AWAIT_MAX)).unwrap();
            let mut all = Vec::new();
            // Ends when the relay closes its side.
            let _ = s.read_to_end(&mut all);
            all
        });
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(front.local_addr().unwrap()).unwrap();
        client.set_read_timeout(Some(AWAIT_MAX)).unwrap();
        let (conn, _) = front.accept().unwrap();
        let mut h = HandOff::new(Handoff::Relay(server_addr)).unwrap();
        h.set_relay_idle(Duration::from_millis(300));
        let t0 = Instant::now();
        h.hand(conn).unwrap();
        client.write_all(b"hello").unwrap();
        // The client sees the close (EOF or reset) once both directions sat idle.
        let mut rest = Vec::new();
        let _ = client.read_to_end(&mut rest);
        assert!(rest.is_empty());
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert!(t0.elapsed() < AWAIT_MAX);
        assert_eq!(silent.join().unwrap(), b"hello");
        await_cond("the relay slot freed", || {
            h.relays.load(Ordering::SeqCst) == 0
        });
    }

    #[test]
    fn relay_carries_both_directions_and_forwards_half_close() {
        // The "unmodified server": echoes everything, then closes after EOF.
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let server_addr = server.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut all = Vec::new();
            s.read_to_end(&mut all).unwrap();
            s.write_all(&all).unwrap();
        });
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(front.local_addr().unwrap()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (conn, _) = front.accept().unwrap();
        let h = HandOff::new(Handoff::Relay(server_addr)).unwrap();
        h.hand(conn).unwrap();
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
        client.write_all(&data).unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).unwrap();
        assert_eq!(back, data);
        echo.join().unwrap();
        assert_eq!(h.stats().handed.load(Ordering::Relaxed), 1);
        let t0 = std::time::Instant::now();
        while h.relays.load(Ordering::SeqCst) != 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "relay slot not freed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            h.stats().relayed_bytes.load(Ordering::Relaxed),
            2 * data.len() as u64
        );
    }

    fn process_cpu_us() -> u64 {
        // SAFETY: getrusage writes one rusage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }

    /// Sends `bytes` from a client to a sink server, through the relay or directly;
    /// returns (wall µs, process CPU µs).
    fn transfer(bytes: usize, relay: bool) -> (u64, u64) {
        let sink = TcpListener::bind("127.0.0.1:0").unwrap();
        let sink_addr = sink.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = sink.accept().unwrap();
            let mut buf = vec![0u8; 1 << 16];
            let mut got = 0;
            while got < bytes {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0);
                got += n;
            }
            s.write_all(b"k").unwrap();
        });
        let h = HandOff::new(Handoff::Relay(sink_addr)).unwrap();
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let (t0, c0) = (std::time::Instant::now(), process_cpu_us());
        let mut client = if relay {
            let c = TcpStream::connect(front.local_addr().unwrap()).unwrap();
            let (conn, _) = front.accept().unwrap();
            h.hand(conn).unwrap();
            c
        } else {
            TcpStream::connect(sink_addr).unwrap()
        };
        let chunk = vec![7u8; 1 << 16];
        let mut sent = 0;
        while sent < bytes {
            client.write_all(&chunk).unwrap();
            sent += chunk.len();
        }
        let mut k = [0u8; 1];
        client.read_exact(&mut k).unwrap();
        server.join().unwrap();
        (
            t0.elapsed().as_micros() as u64,
            process_cpu_us().saturating_sub(c0),
        )
    }

    /// The relay's cost against a direct connection on loopback (informative: run
    /// on an idle machine with `cargo test -p farside-specd relay_cost -- --ignored
    /// --nocapture`).
    #[test]
    #[ignore = "measurement, not a check: run on an idle machine"]
    fn relay_cost() {
        const BYTES: usize = 256 << 20;
        let (dw, dc) = transfer(BYTES, false);
        let (rw, rc) = transfer(BYTES, true);
        let mb = BYTES as f64 / 1e6;
        eprintln!(
            "direct: {:.0} MB/s, {:.1} µs CPU/MB; relay: {:.0} MB/s, {:.1} µs CPU/MB (+{:.1} µs/MB)",
            mb / (dw as f64 / 1e6),
            dc as f64 / mb,
            mb / (rw as f64 / 1e6),
            rc as f64 / mb,
            (rc as f64 - dc as f64) / mb
        );
    }

    #[test]
    fn relay_to_a_dead_server_fails_and_counts() {
        let dead = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = dead.local_addr().unwrap();
        drop(dead);
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(front.local_addr().unwrap()).unwrap();
        let (conn, _) = front.accept().unwrap();
        let h = HandOff::new(Handoff::Relay(addr)).unwrap();
        assert!(h.hand(conn).is_err());
        assert_eq!(h.stats().failed.load(Ordering::Relaxed), 1);
        assert_eq!(h.relays.load(Ordering::SeqCst), 0);
    }
}
