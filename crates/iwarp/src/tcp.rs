//! The TCP driver: a [`Qp`] on a `std::net::TcpStream`, with one reader thread and one
//! writer thread per connection. The protocol is all in the sans-I/O core; this layer
//! only moves bytes and wakes waiters.
//!
//! ```text
//!  reader thread:  read ─► lock { qp.on_bytes } ─► notify
//!  application:    lock { Device, post_send / post_recv } ─► notify
//!  writer thread:  wait ─► lock { qp.take_tx } ─► write_all      (the only caller of take_tx)
//! ```
//! Only the writer takes bytes from the queue pair, so they reach the socket in the
//! order the queue pair produced them, whichever thread caused them. Backpressure is the
//! queue pair's: while the writer is blocked on a slow peer, at most
//! [`crate::qp::TX_BYTES_MAX`] bytes wait in the queue pair, then work waits in its
//! send queue, then `post_send` reports the queue full. Once the queue pair is done (a
//! Terminate sent or received, a failed set-up) the writer sends what is left and shuts
//! the socket down.

use crate::qp::{Event, Qp, QpConfig, QpState};
use crate::verbs::{Cq, Device, PdId, VerbsError, Wc};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes one `read` takes from the socket.
pub const READ_CHUNK_BYTES: usize = 64 << 10;
/// How long the MPA set-up may take (siw waits 10 s for a Reply; a loopback or LAN peer
/// answers in well under a second).
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

struct State {
    dev: Device,
    cq: Cq,
    qp: Qp,
    /// Bounded by the queue pair: one set-up outcome and at most one Terminate.
    events: Vec<Event>,
    /// The socket reached EOF or failed.
    closed: bool,
    /// The endpoint is being dropped.
    stopping: bool,
    /// [`Endpoint::drain`] asked the writer to send everything and then FIN.
    draining: bool,
    /// The writer sent everything after `draining` and shut its side down.
    drained: bool,
    /// The writer thread has ended (drained, failed or stopped): a drain waits for
    /// this, not for the reader's end of stream, which the peer's answer to the
    /// drain's own FIN can bring before `drained` is set.
    writer_exited: bool,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// One connected queue pair with its device and completion queue.
pub struct Endpoint {
    shared: Shared,
    stream: TcpStream,
    threads: Vec<JoinHandle<()>>,
}

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    // A panicking reader thread poisons the lock; the state is still consistent
    // enough to report from.
    s.0.lock().unwrap_or_else(|p| p.into_inner())
}

impl Endpoint {
    /// Connect to `addr` and run the MPA set-up as initiator.
    pub fn connect(
        addr: SocketAddr,
        dev: Device,
        pd: PdId,
        cfg: QpConfig,
        cq: Cq,
    ) -> io::Result<Endpoint> {
        let stream = TcpStream::connect(addr)?;
        Self::start(stream, dev, cq, Qp::connect(pd, cfg))
    }

    /// Accept one connection on `listener` and run the MPA set-up as responder.
    pub fn accept(
        listener: &TcpListener,
        dev: Device,
        pd: PdId,
        cfg: QpConfig,
        cq: Cq,
    ) -> io::Result<Endpoint> {
        let (stream, _) = listener.accept()?;
        Self::start(stream, dev, cq, Qp::accept(pd, cfg))
    }

    /// Run `qp` (from [`Qp::connect`] or [`Qp::accept`], with receives possibly posted
    /// already) on a stream the caller connected or accepted, e.g. with its own timeout;
    /// returns once the MPA set-up is done (within [`SETUP_TIMEOUT`]).
    pub fn start(stream: TcpStream, dev: Device, cq: Cq, qp: Qp) -> io::Result<Endpoint> {
        Self::start_within(stream, dev, cq, qp, SETUP_TIMEOUT)
    }

    /// [`Endpoint::start`] with the MPA set-up bounded by `setup_timeout`.
    pub fn start_within(
        stream: TcpStream,
        dev: Device,
        cq: Cq,
        qp: Qp,
        setup_timeout: Duration,
    ) -> io::Result<Endpoint> {
        stream.set_nodelay(true)?;
        let shared: Shared = Arc::new((
            Mutex::new(State {
                dev,
                cq,
                qp,
                events: Vec::new(),
                closed: false,
                stopping: false,
                draining: false,
                drained: false,
                writer_exited: false,
            }),
            Condvar::new(),
        ));
        let (w, sh) = (stream.try_clone()?, shared.clone());
        let writer = std::thread::Builder::new()
            .name("iwarp-tx".into())
            .spawn(move || write_loop(w, sh))?;
        let (r, sh) = (stream.try_clone()?, shared.clone());
        let reader = std::thread::Builder::new()
            .name("iwarp-rx".into())
            .spawn(move || read_loop(r, sh))?;
        let ep = Endpoint {
            shared,
            stream,
            threads: vec![writer, reader],
        };
        let ok = ep.wait_until(setup_timeout, |st, _| *st != QpState::Connecting);
        let st = ep.state();
        if !ok || st != QpState::Rts {
            return Err(io::Error::other(format!("MPA set-up failed: {st:?}")));
        }
        Ok(ep)
    }

    /// Run `f` on the device and queue pair (register memory, post work), then send
    /// what it produced.
    pub fn with<R>(&self, f: impl FnOnce(&mut Device, &mut Qp) -> R) -> R {
        let mut g = lock(&self.shared);
        let st = &mut *g;
        let r = f(&mut st.dev, &mut st.qp);
        drop(g);
        self.shared.1.notify_all();
        r
    }

    pub fn post_send(&self, wr: crate::qp::SendWr) -> Result<(), VerbsError> {
        self.with(|_, qp| qp.post_send(wr))
    }

    pub fn post_recv(&self, wr: crate::qp::RecvWr) -> Result<(), VerbsError> {
        self.with(|_, qp| qp.post_recv(wr))
    }

    pub fn state(&self) -> QpState {
        lock(&self.shared).qp.state().clone()
    }

    pub fn events(&self) -> Vec<Event> {
        lock(&self.shared).events.clone()
    }

    /// Wait up to `timeout` until `pred(state, events)` holds; whether it did.
    pub fn wait_until(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&QpState, &[Event]) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.shared);
        loop {
            if pred(g.qp.state(), &g.events) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline || g.closed {
                return pred(g.qp.state(), &g.events);
            }
            g = self
                .shared
                .1
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The next completion, waiting up to `timeout`.
    pub fn wait_wc(&self, timeout: Duration) -> Option<Wc> {
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.shared);
        loop {
            if let Some(wc) = g.cq.poll() {
                return Some(wc);
            }
            let now = Instant::now();
            if now >= deadline || g.closed {
                return None;
            }
            g = self
                .shared
                .1
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Whether the socket has closed (peer EOF, error, or our shutdown).
    pub fn is_closed(&self) -> bool {
        lock(&self.shared).closed
    }

    /// Send everything posted so far, then close this side (FIN), waiting up to
    /// `timeout`; whether it all went. A completion only means the writer took the
    /// bytes, so an endpoint dropped right after its last completion could cut them
    /// off: drain first when the peer must get them. Work posted later is not sent.
    pub fn drain(&self, timeout: Duration) -> bool {
        lock(&self.shared).draining = true;
        self.shared.1.notify_all();
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.shared);
        loop {
            if g.drained {
                return true;
            }
            let now = Instant::now();
            if now >= deadline || g.writer_exited {
                return g.drained;
            }
            g = self
                .shared
                .1
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        lock(&self.shared).stopping = true;
        self.shared.1.notify_all();
        // Unblocks a reader in read and a writer in write_all.
        let _ = self.stream.shutdown(Shutdown::Both);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn write_loop(mut s: TcpStream, shared: Shared) {
    loop {
        let mut g = lock(&shared);
        let (tx, done, drained) = loop {
            if g.stopping {
                g.writer_exited = true;
                drop(g);
                let _ = s.shutdown(Shutdown::Both);
                return;
            }
            let st = &mut *g;
            let tx = st.qp.take_tx(&st.dev, &mut st.cq);
            let done = st.qp.is_done();
            // Draining and nothing left: everything taken before has been written.
            let drained = st.draining && tx.is_empty();
            if !tx.is_empty() || done || st.closed || drained {
                break (tx, done || st.closed, drained);
            }
            g = shared.1.wait(g).unwrap_or_else(|p| p.into_inner());
        };
        drop(g);
        // take_tx may have completed Sends and Writes.
        shared.1.notify_all();
        if drained {
            let _ = s.shutdown(Shutdown::Write);
            let mut g = lock(&shared);
            g.drained = true;
            g.writer_exited = true;
            drop(g);
            shared.1.notify_all();
            return;
        }
        if s.write_all(&tx).is_err() || done {
            let _ = s.shutdown(Shutdown::Both);
            let mut g = lock(&shared);
            g.closed = true;
            g.writer_exited = true;
            drop(g);
            shared.1.notify_all();
            return;
        }
    }
}

fn read_loop(mut s: TcpStream, shared: Shared) {
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        let mut g = lock(&shared);
        if n == 0 {
            g.closed = true;
            drop(g);
            shared.1.notify_all();
            return;
        }
        let st = &mut *g;
        let ev = st.qp.on_bytes(&mut st.dev, &mut st.cq, &buf[..n]);
        st.events.extend(ev);
        drop(g);
        shared.1.notify_all();
    }
}
