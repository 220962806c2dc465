//! Upstream connections to back-ends: a per-back-end connection cap (`maxconn`), a short
//! proxy-side wait queue when the cap is reached, and idle keep-alive connections kept
//! in one small LIFO stack per back-end.
//!
//! Every upstream connection, busy or idle, holds one [`ConnPermit`] of its back-end,
//! so busy + idle ≤ `maxconn` always (HAProxy's `server maxconn`). A prefork back-end
//! (Apache's MaxClients, farside's `backend --workers`) gives every open connection a
//! worker for as long as it stays open, idle or not; connections beyond its workers wait
//! in its accept queue. A cap at or below the back-end's workers means this proxy never
//! queues its own connections there.
//!
//! Bounds:
//! - open connections per back-end ≤ `maxconn` (see `ProxyConfig::maxconn_for`);
//! - a request that finds the cap reached waits at most `http.queue_timeout_ms`, then
//!   gets [`Reject::QueueTimeout`] (503). Waiters are woken in FIFO order when a
//!   connection is returned idle or closed; each waiter holds a client connection, so
//!   their number is bounded by `http.max_client_conns`;
//! - at most `http.pool_idle_per_backend` idle connections per back-end (a connection
//!   returned to a full stack closes the oldest), none older than
//!   `http.pool_idle_timeout_ms` is handed out. LIFO keeps the hottest connections in
//!   use and lets the back-end's own keep-alive timeout retire the cold ones.
//!
//! **A fresh connection left waiting stops pooling.** A request on a connection this
//! proxy just opened may sit in the back-end's accept queue; one on a pooled connection
//! never does (its worker is already on it). Handing a returned connection to the next
//! request (LIFO) lets that request jump the accept queue, and the worker stays pinned
//! until the back-end closes the connection (after `--keepalive-max` requests, or its
//! idle timeout when no request comes): with 16 clients on 2 two-worker back-ends, 6
//! connections per back-end waited there for 100 requests of each pinned one, seconds.
//! Rule, needing no region: while a connection to a back-end opened for a request has
//! gone [`stall_after`] (the queue timeout, at least [`STALL_MIN`]) without its exchange
//! ending, every connection to that back-end that comes back is closed instead of
//! pooled, and its idle ones are closed (at once, and by a watchdog when that moment
//! comes with no connection returning), so each freed worker takes the oldest queued
//! connection: the accept queue is served in order. Pooling resumes as soon as no fresh
//! exchange is that old. A back-end with a region is left to the control layer, which
//! sees its accept backlog and relieves it ([`Pool::close_on_return`]; before its first
//! sample the rule applies): the rule is for back-ends nobody reads, where it needs no
//! region, and it keeps admission's behaviour as it was. A request retried on a new connection after a stale pooled one
//! is not watched (rare; it shares the stale one's permit).
//!
//! The control layer reads [`Pool::idle_count`] (this proxy's idle connections are not
//! load) and calls [`Pool::shed_idle`] when a back-end queues connections while this
//! proxy keeps idle ones to it: each of those pins a worker the queue is waiting for.
//!
//! A connection the back-end closed while it sat idle is usually caught at checkout (its
//! socket is already readable: EOF); the rest are caught by the caller's single retry
//! on a fresh connection for idempotent requests.

use crate::reject::Reject;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::Notify;

struct Idle {
    addr: SocketAddr,
    stream: TcpStream,
    since: Instant,
    _permit: ConnPermit,
}

/// One back-end's connections.
struct Slot {
    /// Idle connections, oldest first. The lock is held only to push, pop or trim.
    idle: Mutex<Vec<Idle>>,
    /// `idle.len()`, readable without the lock by the decision path.
    idle_count: AtomicUsize,
    /// Open connections (busy + idle), i.e. permits held. Never above `maxconn`.
    open: AtomicUsize,
    maxconn: usize,
    /// Signalled when a connection is returned idle or closed.
    freed: Notify,
    /// Connections to close instead of pooling when they come back (see
    /// [`Pool::close_on_return`]).
    close_on_return: AtomicUsize,
    /// Connections closed by [`Pool::shed_idle`] or instead of being pooled.
    shed_total: AtomicU64,
    /// Exchanges on fresh connections not ended yet: ticket (in grant order) → when it
    /// counts as stalled. At most `maxconn` entries (one per permit).
    fresh: Mutex<BTreeMap<u64, Instant>>,
    next_ticket: AtomicU64,
    /// A stall watchdog task is running for this slot.
    watching: AtomicBool,
    /// The control layer relieves this back-end from its region's accept backlog (it
    /// has called [`Pool::close_on_return`]): the stall rule stays out of its way.
    relieved: AtomicBool,
}

impl Slot {
    fn set_idle_count(&self, idle: &[Idle]) {
        self.idle_count.store(idle.len(), Ordering::Relaxed);
    }

    /// Whether some fresh exchange to this back-end has stalled by `now`.
    fn stalled(&self, now: Instant) -> bool {
        let fresh = self.fresh.lock().unwrap_or_else(|p| p.into_inner());
        fresh.first_key_value().is_some_and(|(_, &at)| at <= now)
    }

    /// Close every idle connection; returns how many.
    fn shed_all_idle(&self) -> usize {
        let shed: Vec<Idle> = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let shed = idle.drain(..).collect();
            self.set_idle_count(&idle);
            shed
        };
        // Closed outside the lock.
        self.shed_total
            .fetch_add(shed.len() as u64, Ordering::Relaxed);
        let n = shed.len();
        shed.into_iter().for_each(|i| close_reset(i.stream));
        n
    }

    /// Watch the fresh exchanges of `slot` until none is left: when one stalls, close
    /// the idle connections (each pins a worker the stalled one may be queued for).
    /// Once per fresh exchange at most; connections returning later are closed by
    /// [`Pool::put`].
    fn watch(slot: Arc<Slot>) {
        tokio::spawn(async move {
            let mut handled: Option<u64> = None;
            loop {
                let next = {
                    let fresh = slot.fresh.lock().unwrap_or_else(|p| p.into_inner());
                    let from = handled.map_or(0, |t| t + 1);
                    fresh.range(from..).next().map(|(&t, &at)| (t, at))
                };
                let Some((ticket, at)) = next else {
                    slot.watching.store(false, Ordering::Release);
                    // A registration between the look and the store saw `watching` set
                    // and spawned nothing: look again.
                    let more = {
                        let fresh = slot.fresh.lock().unwrap_or_else(|p| p.into_inner());
                        let from = handled.map_or(0, |t| t + 1);
                        fresh.range(from..).next().is_some()
                    };
                    if more && !slot.watching.swap(true, Ordering::AcqRel) {
                        continue;
                    }
                    return;
                };
                tokio::time::sleep_until(at.into()).await;
                handled = Some(ticket);
                let still = {
                    let fresh = slot.fresh.lock().unwrap_or_else(|p| p.into_inner());
                    fresh.contains_key(&ticket)
                };
                if still && !slot.relieved.load(Ordering::Relaxed) {
                    slot.shed_all_idle();
                }
            }
        });
    }
}

/// The right to keep one upstream connection open to a back-end; released on drop.
pub struct ConnPermit {
    slot: Option<Arc<Slot>>,
    /// The ticket of this connection's first exchange while it has not ended (a
    /// connection opened for a request, which may wait in the back-end's accept queue).
    fresh: Option<u64>,
}

impl ConnPermit {
    fn unslotted() -> Self {
        ConnPermit {
            slot: None,
            fresh: None,
        }
    }

    /// Its first exchange ended: the connection is no longer waiting for a worker.
    fn end_fresh(&mut self) {
        if let (Some(slot), Some(t)) = (&self.slot, self.fresh.take()) {
            let mut fresh = slot.fresh.lock().unwrap_or_else(|p| p.into_inner());
            fresh.remove(&t);
        }
    }
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        self.end_fresh();
        if let Some(slot) = self.slot.take() {
            slot.open.fetch_sub(1, Ordering::Relaxed);
            slot.freed.notify_one();
        }
    }
}

/// Shortest time a fresh exchange must last before it counts as stalled (waiting in the
/// back-end's accept queue), whatever the queue timeout: a loopback back-end serves a
/// small file in well under this, so with `queue_timeout_ms = 0` an exchange that old is
/// likelier queued than served.
pub const STALL_MIN: Duration = Duration::from_millis(10);

/// How long a fresh exchange may last before its back-end counts as queueing it: the
/// queue timeout (the operator's bound on waiting before a back-end starts on a request),
/// at least [`STALL_MIN`].
pub fn stall_after(queue_timeout: Duration) -> Duration {
    queue_timeout.max(STALL_MIN)
}

/// Close an upstream connection whose exchanges have all ended (its last response was
/// read in full, nothing is in flight either way) with a reset rather than a FIN.
///
/// Every connection this pool closes instead of keeping is one a queued back-end needs
/// closed: its worker is what the oldest queued connection waits for. A FIN costs the
/// back-end's CPU (the bottleneck under overload) the FIN exchange (its FIN back, the
/// ACKs) and its worker a read that returns 0 only when our FIN arrives; a reset is one
/// packet, after which its read fails and the worker takes the next connection. It also
/// leaves no TIME_WAIT socket here: under a queued back-end every request opens a new
/// connection, so at a few hundred requests per second TIME_WAIT would hold tens of
/// thousands of the proxy's ephemeral ports.
pub(crate) fn close_reset(stream: TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket fd and a pointer to a `linger` of the stated length. With a
    // zero linger time `close` aborts the connection at once: it never blocks.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(stream);
}

/// What [`Pool::checkout`] found for a request.
pub enum Checkout {
    /// A live idle connection, with its permit.
    Pooled(TcpStream, ConnPermit),
    /// No idle connection, but a permit to connect a new one.
    Fresh(ConnPermit),
}

/// The upstream connections of every configured back-end.
pub struct Pool {
    /// Indexed by back-end index (`Route::backend`, i.e. the configured back-end list);
    /// an index beyond it is neither capped nor pooled.
    slots: Vec<Arc<Slot>>,
    idle_max: usize,
    idle_timeout: Duration,
    /// Set by [`Pool::retire`]: a reload replaced this pool, so returning connections
    /// close instead of pooling.
    retired: AtomicBool,
}

impl Pool {
    /// A pool for `maxconn.len()` back-ends, back-end `i` capped at `maxconn[i]` open
    /// connections, keeping up to `idle_max` idle ones each.
    pub fn new(maxconn: &[usize], idle_max: usize, idle_timeout: Duration) -> Self {
        Pool {
            slots: maxconn
                .iter()
                .map(|&m| {
                    assert!(m > 0, "maxconn is validated to be at least 1");
                    Arc::new(Slot {
                        idle: Mutex::new(Vec::new()),
                        idle_count: AtomicUsize::new(0),
                        open: AtomicUsize::new(0),
                        maxconn: m,
                        freed: Notify::new(),
                        close_on_return: AtomicUsize::new(0),
                        shed_total: AtomicU64::new(0),
                        fresh: Mutex::new(BTreeMap::new()),
                        next_ticket: AtomicU64::new(0),
                        watching: AtomicBool::new(false),
                        relieved: AtomicBool::new(false),
                    })
                })
                .collect(),
            idle_max,
            idle_timeout,
            retired: AtomicBool::new(false),
        }
    }

    /// A connection for a request to back-end `backend` at `addr`: an idle one if a live
    /// one is pooled, else a permit to open one. At the cap, waits up to `queue_timeout`
    /// for a connection to come back or close ([`Reject::QueueTimeout`] after that).
    /// With `reuse_only`, only an idle connection will do ([`Reject::Overloaded`] if
    /// none is left). A permit to open a connection starts its first exchange's stall
    /// clock ([`stall_after`]`(queue_timeout)`, see the module doc).
    pub async fn checkout(
        &self,
        backend: usize,
        addr: SocketAddr,
        reuse_only: bool,
        queue_timeout: Duration,
    ) -> Result<Checkout, Reject> {
        let Some(slot) = self.slots.get(backend) else {
            return if reuse_only {
                Err(Reject::Overloaded)
            } else {
                Ok(Checkout::Fresh(ConnPermit::unslotted()))
            };
        };
        let deadline = tokio::time::Instant::now() + queue_timeout;
        loop {
            // Registered before looking, so a release between the look and the wait
            // is not missed.
            let freed = slot.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some((s, p)) = self.take(backend, addr) {
                return Ok(Checkout::Pooled(s, p));
            }
            if reuse_only {
                return Err(Reject::Overloaded);
            }
            if let Some(mut p) = Self::try_open(slot) {
                if slot.relieved.load(Ordering::Relaxed) {
                    return Ok(Checkout::Fresh(p));
                }
                let ticket = slot.next_ticket.fetch_add(1, Ordering::Relaxed);
                let at = Instant::now() + stall_after(queue_timeout);
                {
                    let mut fresh = slot.fresh.lock().unwrap_or_else(|p| p.into_inner());
                    fresh.insert(ticket, at);
                }
                p.fresh = Some(ticket);
                if !slot.watching.swap(true, Ordering::AcqRel) {
                    Slot::watch(slot.clone());
                }
                return Ok(Checkout::Fresh(p));
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(Reject::QueueTimeout);
            }
        }
    }

    fn try_open(slot: &Arc<Slot>) -> Option<ConnPermit> {
        slot.open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < slot.maxconn).then_some(n + 1)
            })
            .ok()
            .map(|_| ConnPermit {
                slot: Some(slot.clone()),
                fresh: None,
            })
    }

    /// An idle connection to `addr`, if a live, fresh one is pooled for `backend`.
    pub fn take(&self, backend: usize, addr: SocketAddr) -> Option<(TcpStream, ConnPermit)> {
        let slot = self.slots.get(backend)?;
        let now = Instant::now();
        loop {
            let idle = {
                let mut v = slot.idle.lock().unwrap_or_else(|p| p.into_inner());
                let i = v.pop();
                slot.set_idle_count(&v);
                i?
            };
            if idle.addr != addr || now.duration_since(idle.since) >= self.idle_timeout {
                continue;
            }
            // Readiness is cached by the reactor: this costs no syscall unless the socket
            // became readable while idle, which for an idle HTTP connection means EOF,
            // a reset, or stray bytes; all make it unusable.
            let mut probe = [0u8; 1];
            match idle.stream.try_read(&mut probe) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Some((idle.stream, idle._permit))
                }
                _ => continue,
            }
        }
    }

    /// Return a connection whose last response was fully read, with its permit. It is
    /// closed instead if a fresh exchange to the back-end has stalled (module doc).
    pub fn put(&self, backend: usize, addr: SocketAddr, stream: TcpStream, mut permit: ConnPermit) {
        permit.end_fresh();
        let Some(slot) = self.slots.get(backend) else {
            return;
        };
        if self.idle_max == 0 || self.retired.load(Ordering::Relaxed) {
            return;
        }
        if !slot.relieved.load(Ordering::Relaxed) && slot.stalled(Instant::now()) {
            // Its worker is what a queued connection waits for; so are the idle ones'.
            slot.shed_all_idle();
            slot.shed_total.fetch_add(1, Ordering::Relaxed);
            close_reset(stream);
            return;
        }
        let close = slot
            .close_on_return
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if close.is_ok() {
            // Pooled, it would pin the worker that a queued connection is waiting for.
            slot.shed_total.fetch_add(1, Ordering::Relaxed);
            close_reset(stream);
            return;
        }
        let oldest = {
            let mut idle = slot.idle.lock().unwrap_or_else(|p| p.into_inner());
            // Drop the oldest: the newest is the likeliest to stay alive.
            let oldest = (idle.len() >= self.idle_max).then(|| idle.remove(0));
            idle.push(Idle {
                addr,
                stream,
                since: Instant::now(),
                _permit: permit,
            });
            slot.set_idle_count(&idle);
            oldest
        };
        drop(oldest);
        // A request queued at the cap can take it now.
        slot.freed.notify_one();
    }

    /// Close up to `n` idle connections to `backend`, oldest first; returns how many.
    /// For a back-end that queues connections while this proxy keeps idle ones to it.
    pub fn shed_idle(&self, backend: usize, n: usize) -> usize {
        let Some(slot) = self.slots.get(backend) else {
            return 0;
        };
        let shed: Vec<Idle> = {
            let mut idle = slot.idle.lock().unwrap_or_else(|p| p.into_inner());
            let n = n.min(idle.len());
            let shed = idle.drain(..n).collect();
            slot.set_idle_count(&idle);
            shed
        };
        // Closed outside the lock.
        slot.shed_total
            .fetch_add(shed.len() as u64, Ordering::Relaxed);
        let n = shed.len();
        shed.into_iter().for_each(|i| close_reset(i.stream));
        n
    }

    /// Close the next `n` connections to `backend` that come back instead of pooling
    /// them (replaces the previous count). For a back-end whose queue is longer than the
    /// idle connections [`Pool::shed_idle`] could close: each returning connection's
    /// worker then takes a queued connection at once.
    ///
    /// The control layer calls this once per sample of a back-end with a region; from the
    /// first call on, the back-end is relieved by what its region says and not by the
    /// stall rule (module doc).
    pub fn close_on_return(&self, backend: usize, n: usize) {
        if let Some(slot) = self.slots.get(backend) {
            slot.relieved.store(true, Ordering::Relaxed);
            slot.close_on_return.store(n, Ordering::Relaxed);
        }
    }

    /// Connections to `backend` closed so far by [`Pool::shed_idle`] or
    /// [`Pool::close_on_return`].
    pub fn shed_total(&self, backend: usize) -> u64 {
        self.slots
            .get(backend)
            .map_or(0, |s| s.shed_total.load(Ordering::Relaxed))
    }

    /// A reload replaced this pool: close its idle connections now and every busy one
    /// when its exchange ends (it is never pooled again).
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        for slot in &self.slots {
            let closed: Vec<Idle> = {
                let mut idle = slot.idle.lock().unwrap_or_else(|p| p.into_inner());
                let closed = idle.drain(..).collect();
                slot.set_idle_count(&idle);
                closed
            };
            drop(closed);
        }
    }

    /// Close idle connections that have expired or that their back-end has closed, so
    /// they do not linger in CLOSE_WAIT until the next checkout. Called periodically.
    pub fn purge(&self) {
        let now = Instant::now();
        for slot in &self.slots {
            let mut idle = slot.idle.lock().unwrap_or_else(|p| p.into_inner());
            let mut probe = [0u8; 1];
            idle.retain(|i| {
                now.duration_since(i.since) < self.idle_timeout
                    && matches!(i.stream.try_read(&mut probe),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            });
            slot.set_idle_count(&idle);
        }
    }

    /// Idle connections pooled for `backend` now (lock-free; may lag a push or pop).
    pub fn idle_count(&self, backend: usize) -> usize {
        self.slots
            .get(backend)
            .map_or(0, |s| s.idle_count.load(Ordering::Relaxed))
    }

    /// Open connections (busy + idle) to `backend` now.
    pub fn open_count(&self, backend: usize) -> usize {
        self.slots
            .get(backend)
            .map_or(0, |s| s.open.load(Ordering::Relaxed))
    }

    /// The connection cap of `backend` (`usize::MAX` if it has no slot).
    pub fn maxconn(&self, backend: usize) -> usize {
        self.slots.get(backend).map_or(usize::MAX, |s| s.maxconn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn listener() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    }

    fn permit(c: Checkout) -> ConnPermit {
        match c {
            Checkout::Fresh(p) | Checkout::Pooled(_, p) => p,
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn busy_plus_idle_never_exceed_maxconn_and_a_queued_request_times_out() {
        let (_l, addr) = listener().await;
        let pool = Pool::new(&[2], 8, Duration::from_secs(30));
        let q = Duration::from_millis(50);
        let a = permit(pool.checkout(0, addr, false, q).await.unwrap());
        let b = permit(pool.checkout(0, addr, false, q).await.unwrap());
        assert_eq!(pool.open_count(0), 2);
        let t0 = std::time::Instant::now();
        assert_eq!(
            pool.checkout(0, addr, false, q).await.err(),
            Some(Reject::QueueTimeout)
        );
        assert!(t0.elapsed() >= q, "waited the queue timeout first");
        drop(a);
        drop(b);
        assert_eq!(pool.open_count(0), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_queued_request_gets_the_connection_returned_idle() {
        let (l, addr) = listener().await;
        let pool = Arc::new(Pool::new(&[1], 8, Duration::from_secs(30)));
        let p = permit(pool.checkout(0, addr, false, Duration::ZERO).await.unwrap());
        let stream = TcpStream::connect(addr).await.unwrap();
        let _server_side = l.accept().await.unwrap();
        let waiter = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.checkout(0, addr, false, Duration::from_secs(5)).await })
        };
        tokio::task::yield_now().await;
        pool.put(0, addr, stream, p);
        let got = waiter.await.unwrap();
        assert!(
            matches!(got, Ok(Checkout::Pooled(..))),
            "handed the idle connection"
        );
        assert_eq!(pool.open_count(0), 1, "still one connection in all");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn idle_connections_count_against_the_cap_and_shedding_frees_them() {
        let (l, addr) = listener().await;
        let pool = Pool::new(&[1], 8, Duration::from_secs(30));
        let p = permit(pool.checkout(0, addr, false, Duration::ZERO).await.unwrap());
        let stream = TcpStream::connect(addr).await.unwrap();
        let _server_side = l.accept().await.unwrap();
        pool.put(0, addr, stream, p);
        assert_eq!((pool.idle_count(0), pool.open_count(0)), (1, 1));
        assert_eq!(pool.shed_idle(0, 5), 1);
        assert_eq!((pool.idle_count(0), pool.open_count(0)), (0, 0));
        assert!(
            matches!(
                pool.checkout(0, addr, true, Duration::ZERO).await,
                Err(Reject::Overloaded)
            ),
            "reuse-only finds nothing idle"
        );
        assert!(matches!(
            pool.checkout(0, addr, false, Duration::ZERO).await,
            Ok(Checkout::Fresh(_))
        ));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn connections_marked_close_on_return_are_closed_not_pooled() {
        let (l, addr) = listener().await;
        let pool = Pool::new(&[4], 8, Duration::from_secs(30));
        pool.close_on_return(0, 1);
        let mut ends = Vec::new();
        for _ in 0..2 {
            let p = permit(pool.checkout(0, addr, false, Duration::ZERO).await.unwrap());
            let stream = TcpStream::connect(addr).await.unwrap();
            ends.push(l.accept().await.unwrap().0);
            pool.put(0, addr, stream, p);
        }
        assert_eq!(
            pool.idle_count(0),
            1,
            "the first was closed, the second pooled"
        );
        assert_eq!(pool.open_count(0), 1);
        assert_eq!(pool.shed_total(0), 1);
        // The back-end's end of the closed one sees a reset (its worker is freed by one
        // packet, no FIN exchange); the pooled one's end is still open (nothing to read).
        use tokio::io::AsyncReadExt;
        let mut b = [0u8; 1];
        let closed = ends[0].read(&mut b).await;
        assert_eq!(
            closed.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::ConnectionReset),
            "closed with a reset, not a FIN"
        );
        assert!(matches!(
            ends[1].try_read(&mut b),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        ));
    }

    /// A connection to `addr` opened through `pool` (fresh permit), its server end kept.
    async fn open(
        pool: &Pool,
        l: &TcpListener,
        addr: SocketAddr,
        q: Duration,
    ) -> (TcpStream, ConnPermit, TcpStream) {
        let c = pool.checkout(0, addr, false, q).await.unwrap();
        assert!(matches!(c, Checkout::Fresh(_)), "a fresh connection");
        let s = TcpStream::connect(addr).await.unwrap();
        let (end, _) = l.accept().await.unwrap();
        (s, permit(c), end)
    }

    async fn reuse(pool: &Pool, addr: SocketAddr, q: Duration) -> (TcpStream, ConnPermit) {
        match pool.checkout(0, addr, false, q).await.unwrap() {
            Checkout::Pooled(s, p) => (s, p),
            Checkout::Fresh(_) => panic!("expected the pooled connection"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_stalled_fresh_exchange_stops_pooling_until_it_ends() {
        let (l, addr) = listener().await;
        let pool = Pool::new(&[8], 8, Duration::from_secs(30));
        let q = Duration::from_millis(30);
        let (a, pa, _ea) = open(&pool, &l, addr, q).await;
        pool.put(0, addr, a, pa);
        assert_eq!(pool.idle_count(0), 1, "its own exchange ended: pooled");
        let (a, pa) = reuse(&pool, addr, q).await;
        // B: opened while A is busy, as a request finding no idle connection does.
        let (_b, pb, _eb) = open(&pool, &l, addr, q).await;
        pool.put(0, addr, a, pa);
        assert_eq!(pool.idle_count(0), 1, "B not stalled yet: A pooled");
        let (a, pa) = reuse(&pool, addr, q).await;
        tokio::time::sleep(stall_after(q)).await;
        pool.put(0, addr, a, pa);
        assert_eq!(
            (pool.idle_count(0), pool.open_count(0), pool.shed_total(0)),
            (0, 1, 1),
            "B stalled: A closed, not pooled (its worker is what B waits for)"
        );
        drop(pb);
        let (c, pc, _ec) = open(&pool, &l, addr, q).await;
        pool.put(0, addr, c, pc);
        assert_eq!(pool.idle_count(0), 1, "B ended: pooling again");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn idle_connections_are_closed_when_a_fresh_exchange_stalls() {
        let (l, addr) = listener().await;
        let pool = Pool::new(&[8], 8, Duration::from_secs(30));
        let q = Duration::from_millis(30);
        let (a, pa, _ea) = open(&pool, &l, addr, q).await;
        pool.put(0, addr, a, pa);
        let (a, pa) = reuse(&pool, addr, q).await;
        let t0 = Instant::now();
        let (_b, pb, _eb) = open(&pool, &l, addr, q).await;
        pool.put(0, addr, a, pa);
        assert_eq!(pool.idle_count(0), 1);
        // No connection comes back: the watchdog closes the idle one when B stalls.
        let limit = t0 + Duration::from_secs(5);
        while pool.idle_count(0) > 0 {
            assert!(
                Instant::now() < limit,
                "the idle connection was never closed"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(t0.elapsed() >= stall_after(q), "not before B stalled");
        assert_eq!((pool.open_count(0), pool.shed_total(0)), (1, 1));
        drop(pb);
        let slot = pool.slots[0].clone();
        while slot.watching.load(Ordering::Acquire) {
            assert!(Instant::now() < limit, "the watchdog did not end");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_back_end_the_control_layer_relieves_is_left_to_it() {
        let (l, addr) = listener().await;
        let pool = Pool::new(&[8], 8, Duration::from_secs(30));
        pool.close_on_return(0, 0);
        let q = Duration::from_millis(30);
        let (a, pa, _ea) = open(&pool, &l, addr, q).await;
        pool.put(0, addr, a, pa);
        let (a, pa) = reuse(&pool, addr, q).await;
        let (_b, _pb, _eb) = open(&pool, &l, addr, q).await;
        tokio::time::sleep(stall_after(q)).await;
        pool.put(0, addr, a, pa);
        assert_eq!(
            (pool.idle_count(0), pool.shed_total(0)),
            (1, 0),
            "pooled as before: its region says whether it queues"
        );
    }

    #[test]
    fn the_stall_threshold_is_the_queue_timeout_with_a_floor() {
        assert_eq!(stall_after(Duration::ZERO), STALL_MIN);
        assert_eq!(
            stall_after(Duration::from_millis(500)),
            Duration::from_millis(500)
        );
    }
}
