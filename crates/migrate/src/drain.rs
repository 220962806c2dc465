//! The source's flow drain without a sleeping migrator (fewer wake-ups per
//! migration).
//!
//! After the front-end's flow moved, the source keeps its frozen socket (repair on,
//! drop filter attached) for [`crate::MigrateConfig::flow_drain`] so that segments
//! already in flight to it are dropped rather than answered with a RST, then closes
//! it silently. That used to be a `thread::sleep` in the migrating thread: one more
//! sleep and wake-up per migration, and the thread held for 50 ms. A [`Reaper`]
//! takes the socket instead: a deadline-ordered queue bounded by
//! [`Reaper::pending_max`], and one thread per [`crate::ControlPool`].
//!
//! Who closes: every deferral first closes the sockets already due (the migrating
//! thread is running anyway: no wake-up), so while migrations keep coming, each
//! closes about one; the thread closes only what no later deferral did, waking at
//! the earliest deadline plus [`REAPER_SLACK`] (and once when the queue turns
//! non-empty, its sleep having no timeout while there is nothing to close).
//!
//! ```text
//!  migrator: DONE ─▶ defer(sock, now + flow_drain): closes what is due,
//!                    queues sock ─▶ returns Migrated at once
//!                      full ─▶ Err(sock): the caller sleeps and closes inline
//!  reaper:   sleeps until the earliest deadline + REAPER_SLACK,
//!            closes every socket whose deadline passed (silent: repair mode)
//!  drop:     closes every pending socket at once (still silently)
//! ```
//!
//! The close of a frozen socket sends nothing (repair mode: no FIN, no RST, no
//! TIME_WAIT), so closing later than the deadline only holds a descriptor longer;
//! closing earlier is what must not happen (a segment in flight would meet no
//! socket, or the service's listener, and its RST).

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::io;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Default bound on sockets waiting for their drain deadline: at the default 50 ms
/// drain it covers 20,000 migrations a second (the lab's source migrates ~40 a
/// second at the pair's peak), and each pending socket holds a descriptor (and its
/// queues' memory) in a daemon whose soft `RLIMIT_NOFILE` is 1,024 by default: a
/// longer queue would run the process out of descriptors before it filled.
pub const DRAIN_PENDING_DEFAULT: usize = 1024;
/// Upper bound of a reaper's queue (a daemon with a raised `RLIMIT_NOFILE`).
pub const DRAIN_PENDING_MAX: usize = 65_536;
/// How long after the earliest deadline the reaper wakes, if no deferral closed that
/// socket first: at most 10 wake-ups a second however many migrations (a source at
/// the lab pair's peak migrates ~40 a second, and each deferral closes what is
/// due, so at that rate the reaper finds little to do); after the last migration of a
/// burst a frozen socket lives at most this much longer than its drain (it sends
/// nothing meanwhile, and holds a descriptor and its queues).
pub const REAPER_SLACK: Duration = Duration::from_millis(100);
/// The reaper thread's stack (it only closes sockets).
const REAPER_STACK_BYTES: usize = 64 * 1024;

/// One socket waiting for its deadline; ordered so that `BinaryHeap` (a max-heap)
/// pops the earliest deadline first (ties: the first deferred).
struct Pending {
    deadline: Instant,
    seq: u64,
    sock: TcpStream,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.deadline, self.seq) == (o.deadline, o.seq)
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}

impl Ord for Pending {
    fn cmp(&self, o: &Self) -> CmpOrdering {
        (o.deadline, o.seq).cmp(&(self.deadline, self.seq))
    }
}

#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Pending>,
    seq: u64,
    stop: bool,
}

struct Inner {
    queue: Mutex<Queue>,
    wake: Condvar,
    max: usize,
    deferred: AtomicU64,
    closed: AtomicU64,
    closed_by_deferrals: AtomicU64,
    wakeups: AtomicU64,
    pending_peak: AtomicUsize,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Counters of a [`Reaper`] (and of the inline fall-back, for a
/// [`crate::ControlPool`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainStats {
    /// Sockets handed to the reaper.
    pub deferred: u64,
    /// Sockets drained inline (the migrating thread slept and closed): the queue was
    /// full, or no reaper thread could be started.
    pub inline: u64,
    /// Sockets closed after their deadline (or at the reaper's drop), by the reaper
    /// thread or by a later deferral.
    pub closed: u64,
    /// Of `closed`, those a later deferral closed (no wake-up of the reaper).
    pub closed_by_deferrals: u64,
    /// Sockets waiting now.
    pub pending: usize,
    /// Most sockets waiting at once.
    pub pending_peak: usize,
    /// Times the reaper thread woke (deadlines, earlier deadlines, its stop).
    pub wakeups: u64,
}

/// Closes frozen sockets at their drain deadline (see the module doc). Dropping it
/// closes every pending socket at once and joins its thread.
pub struct Reaper {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Reaper {
    /// Starts the reaper thread with a queue of at most `pending_max` sockets
    /// (1..=[`DRAIN_PENDING_MAX`]).
    pub fn start(pending_max: usize) -> io::Result<Reaper> {
        if !(1..=DRAIN_PENDING_MAX).contains(&pending_max) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "flow-drain queue bound must be in 1..={DRAIN_PENDING_MAX}, got {pending_max}"
                ),
            ));
        }
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            max: pending_max,
            deferred: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            closed_by_deferrals: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            pending_peak: AtomicUsize::new(0),
        });
        let i = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("migrate-drain".into())
            .stack_size(REAPER_STACK_BYTES)
            .spawn(move || reap(&i))?;
        Ok(Reaper {
            inner,
            thread: Some(thread),
        })
    }

    /// The queue's bound.
    pub fn pending_max(&self) -> usize {
        self.inner.max
    }

    /// Queues `sock` to be closed at `deadline` (not before), after closing, in the
    /// calling thread, the sockets already due. `Err(sock)`: the queue is full even
    /// so (or the reaper is stopping); the caller drains it itself. Wakes the reaper
    /// only when the queue was empty (it sleeps without a timeout then) or `deadline`
    /// is more than [`REAPER_SLACK`] before the earliest one (with one drain length
    /// deadlines arrive in order).
    pub fn defer(&self, sock: TcpStream, deadline: Instant) -> Result<(), TcpStream> {
        let now = Instant::now();
        let mut due: Vec<TcpStream> = Vec::new();
        let mut q = self.inner.lock();
        if q.stop {
            return Err(sock);
        }
        // Bounded by the queue's length.
        while q.heap.peek().is_some_and(|p| p.deadline <= now) {
            due.push(q.heap.pop().expect("peeked").sock);
        }
        let queued = if q.heap.len() < self.inner.max {
            let wake = q
                .heap
                .peek()
                .is_none_or(|p| deadline + REAPER_SLACK < p.deadline);
            q.seq += 1;
            let seq = q.seq;
            q.heap.push(Pending {
                deadline,
                seq,
                sock,
            });
            let n = q.heap.len();
            drop(q);
            self.inner.deferred.fetch_add(1, Ordering::Relaxed);
            self.inner.pending_peak.fetch_max(n, Ordering::Relaxed);
            if wake {
                self.inner.wake.notify_one();
            }
            Ok(())
        } else {
            drop(q);
            Err(sock)
        };
        if !due.is_empty() {
            // Outside the lock; silent (repair mode).
            self.inner
                .closed
                .fetch_add(due.len() as u64, Ordering::Relaxed);
            self.inner
                .closed_by_deferrals
                .fetch_add(due.len() as u64, Ordering::Relaxed);
            drop(due);
        }
        queued
    }

    /// The counters (`inline` is the caller's: 0 here).
    pub fn stats(&self) -> DrainStats {
        let pending = self.inner.lock().heap.len();
        DrainStats {
            deferred: self.inner.deferred.load(Ordering::Relaxed),
            inline: 0,
            closed: self.inner.closed.load(Ordering::Relaxed),
            closed_by_deferrals: self.inner.closed_by_deferrals.load(Ordering::Relaxed),
            pending,
            pending_peak: self.inner.pending_peak.load(Ordering::Relaxed),
            wakeups: self.inner.wakeups.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.inner.lock().stop = true;
        self.inner.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The thread closed everything before it ended; a thread that panicked left
        // the rest here.
        let rest = std::mem::take(&mut self.inner.lock().heap);
        self.inner
            .closed
            .fetch_add(rest.len() as u64, Ordering::Relaxed);
        drop(rest);
    }
}

/// The reaper thread: sleeps until the earliest deadline plus [`REAPER_SLACK`] (no
/// timeout while the queue is empty), closes every socket due, outside the lock.
fn reap(inner: &Inner) {
    let mut due: Vec<TcpStream> = Vec::new();
    let mut q = inner.lock();
    loop {
        if q.stop {
            due.extend(std::mem::take(&mut q.heap).into_iter().map(|p| p.sock));
            drop(q);
            inner.closed.fetch_add(due.len() as u64, Ordering::Relaxed);
            // Closing a frozen socket sends nothing: repair mode.
            due.clear();
            return;
        }
        let now = Instant::now();
        // Bounded by the queue's length.
        while q.heap.peek().is_some_and(|p| p.deadline <= now) {
            due.push(q.heap.pop().expect("peeked").sock);
        }
        if !due.is_empty() {
            drop(q);
            inner.closed.fetch_add(due.len() as u64, Ordering::Relaxed);
            due.clear();
            q = inner.lock();
            continue;
        }
        q = match q.heap.peek().map(|p| p.deadline) {
            None => inner.wake.wait(q).unwrap_or_else(|p| p.into_inner()),
            Some(d) => {
                let t = (d + REAPER_SLACK).saturating_duration_since(now);
                inner
                    .wake
                    .wait_timeout(q, t)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
        };
        inner.wakeups.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;

    /// (server end, client end) of a loopback connection; the client's reads time out
    /// after `read_timeout`.
    fn pair(read_timeout: Duration) -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.set_read_timeout(Some(read_timeout)).unwrap();
        (l.accept().unwrap().0, c)
    }

    /// The socket inode behind descriptor `fd` of this process, if it is open.
    fn inode_of(fd: i32) -> Option<String> {
        std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .ok()
            .map(|p| p.display().to_string())
    }

    fn await_within(bound: Duration, mut f: impl FnMut() -> bool) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < bound {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        f()
    }

    /// Whether the client sees its peer's close (EOF or reset) within its timeout.
    fn sees_close(c: &mut TcpStream) -> bool {
        let mut b = [0u8; 16];
        match c.read(&mut b) {
            Ok(0) => true,
            Ok(_) => panic!("unexpected bytes"),
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
        }
    }

    /// A deferred socket stays open (the client sees nothing) until its deadline and
    /// is closed after it, without the caller waiting (sockets here are not frozen, so
    /// the close shows as the client's EOF: what a frozen socket would not send).
    #[test]
    fn sockets_stay_open_until_their_deadline_then_close() {
        let r = Reaper::start(8).unwrap();
        let drain = Duration::from_millis(300);
        let (s, mut c) = pair(Duration::from_millis(100));
        let fd = s.as_raw_fd();
        let ino = inode_of(fd).unwrap();
        let t0 = Instant::now();
        r.defer(s, t0 + drain).unwrap();
        assert!(t0.elapsed() < drain, "defer does not wait for the drain");
        assert_eq!(r.stats().pending, 1);
        // Before the deadline: the descriptor is ours and nothing reached the client.
        assert!(!sees_close(&mut c), "closed before its deadline");
        if t0.elapsed() < drain {
            assert_eq!(inode_of(fd).as_deref(), Some(ino.as_str()));
        }
        // After it: closed within the coalescing slack (plus a loaded machine's delay).
        assert!(
            await_within(Duration::from_secs(5), || inode_of(fd).as_deref()
                != Some(ino.as_str())),
            "not closed"
        );
        assert!(t0.elapsed() >= drain, "closed at {:?}", t0.elapsed());
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(sees_close(&mut c));
        let st = r.stats();
        assert_eq!((st.deferred, st.closed, st.pending), (1, 1, 0));
    }

    /// Sockets whose deadlines fall within the reaper's slack close in one pass (a
    /// few wake-ups, not one each), whatever order they came in; a socket deferred
    /// earlier with a later deadline stays open.
    #[test]
    fn due_sockets_close_in_one_pass_and_later_ones_stay() {
        let r = Reaper::start(64).unwrap();
        let t0 = Instant::now();
        let mut clients = Vec::new();
        let base = t0 + Duration::from_millis(200);
        // Ten within 1 ms of each other, plus one far later, deferred first.
        let (late, late_c) = pair(Duration::from_millis(50));
        r.defer(late, t0 + Duration::from_secs(3600)).unwrap();
        for k in 0..10u64 {
            let (s, c) = pair(Duration::from_millis(50));
            r.defer(s, base + Duration::from_micros(100 * (9 - k)))
                .unwrap();
            clients.push(c);
        }
        assert!(await_within(Duration::from_secs(5), || r.stats().closed == 10));
        assert!(t0.elapsed() >= Duration::from_millis(200));
        for c in &mut clients {
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            assert!(sees_close(c));
        }
        let mut late_c = late_c;
        assert!(!sees_close(&mut late_c), "the later one stays open");
        let st = r.stats();
        assert_eq!((st.pending, st.deferred), (1, 11));
        // Woken for the first deadline (and possibly a spurious wake), not ten times.
        assert!(st.wakeups <= 4, "{st:?}");
    }

    /// A full queue refuses (the caller drains inline); dropping the reaper closes
    /// every pending socket at once.
    #[test]
    fn a_full_queue_refuses_and_drop_closes_everything_pending() {
        let r = Reaper::start(2).unwrap();
        let far = Instant::now() + Duration::from_secs(3600);
        let (a, mut ca) = pair(Duration::from_millis(50));
        let (b, mut cb) = pair(Duration::from_millis(50));
        let (x, _cx) = pair(Duration::from_millis(50));
        r.defer(a, far).unwrap();
        r.defer(b, far).unwrap();
        let back = r.defer(x, far).expect_err("the queue holds 2");
        assert!(back.peer_addr().is_ok(), "the socket comes back, open");
        assert_eq!(r.stats().pending, 2);
        assert!(!sees_close(&mut ca));
        assert_eq!(r.stats().inline, 0, "counted by the caller");
        let t0 = Instant::now();
        drop(r);
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "drop waits for no deadline"
        );
        ca.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        cb.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(sees_close(&mut ca) && sees_close(&mut cb));
    }

    /// A deferral closes the sockets already due itself, so the reaper, woken only
    /// when its queue turned non-empty, has nothing left at its timer; and a full
    /// queue with a socket due makes room instead of refusing.
    #[test]
    fn a_deferral_closes_what_is_due_without_waking_the_reaper() {
        let r = Reaper::start(1).unwrap();
        let (a, mut ca) = pair(Duration::from_millis(50));
        let t0 = Instant::now();
        r.defer(a, t0 + Duration::from_millis(30)).unwrap();
        // Before the reaper's timer (deadline + REAPER_SLACK): a is due, not closed.
        std::thread::sleep(Duration::from_millis(40));
        let (b, _cb) = pair(Duration::from_millis(50));
        r.defer(b, Instant::now() + Duration::from_secs(3600))
            .expect("a, due, made room");
        let took = t0.elapsed();
        ca.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(sees_close(&mut ca), "a closed by the deferral of b");
        let st = r.stats();
        assert_eq!((st.closed, st.closed_by_deferrals, st.pending), (1, 1, 1));
        if took < Duration::from_millis(30) + REAPER_SLACK {
            // The reaper woke for a (the queue turned non-empty), not for its timer.
            assert!(st.wakeups <= 2, "{st:?}");
        }
    }

    #[test]
    fn bounds_are_checked() {
        assert!(Reaper::start(0).is_err());
        assert!(Reaper::start(DRAIN_PENDING_MAX + 1).is_err());
    }
}
