//! The TCP driver: a [`Qp`] on a `std::net::TcpStream`, with one reader thread and one
//! writer thread per connection. The protocol is all in the sans-I/O core; this layer
//! only moves bytes and wakes waiters.
//!
//! ```text
//!  reader thread: read ─► lock { qp.on_bytes, qp.take_tx } ─► writer queue ─► writer thread: write_all
//!  application:  lock { post_send / post_recv / Device, qp.take_tx } ─► writer queue
//! ```
//! The writer queue holds at most [`WRITER_QUEUE_CHUNKS`] chunks of at most
//! [`crate::qp::TX_BYTES_MAX`] bytes; a full queue blocks the thread that fills it (the
//! reader then stops reading, and TCP flow control pushes back on the peer). Once the
//! queue pair is done (a Terminate sent or received, a failed set-up) the writer sends
//! what is queued and shuts the socket down.

use crate::qp::{Event, Qp, QpConfig, QpState};
use crate::verbs::{Cq, Device, PdId, VerbsError, Wc};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes one `read` takes from the socket.
pub const READ_CHUNK_BYTES: usize = 64 << 10;
/// Chunks waiting for the writer thread.
pub const WRITER_QUEUE_CHUNKS: usize = 64;
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
}

enum Out {
    Bytes(Vec<u8>),
    Close,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// One connected queue pair with its device and completion queue.
pub struct Endpoint {
    shared: Shared,
    out: SyncSender<Out>,
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

    fn start(stream: TcpStream, dev: Device, cq: Cq, qp: Qp) -> io::Result<Endpoint> {
        stream.set_nodelay(true)?;
        let shared: Shared = Arc::new((
            Mutex::new(State {
                dev,
                cq,
                qp,
                events: Vec::new(),
                closed: false,
            }),
            Condvar::new(),
        ));
        let (out, rx) = sync_channel(WRITER_QUEUE_CHUNKS);
        let w = stream.try_clone()?;
        let writer = std::thread::Builder::new()
            .name("iwarp-tx".into())
            .spawn(move || write_loop(w, rx))?;
        let r = stream.try_clone()?;
        let (sh, o) = (shared.clone(), out.clone());
        let reader = std::thread::Builder::new()
            .name("iwarp-rx".into())
            .spawn(move || read_loop(r, sh, o))?;
        let ep = Endpoint {
            shared,
            out,
            stream,
            threads: vec![writer, reader],
        };
        ep.flush(lock(&ep.shared));
        let ok = ep.wait_until(SETUP_TIMEOUT, |st, _| *st != QpState::Connecting);
        let st = ep.state();
        if !ok || st != QpState::Rts {
            return Err(io::Error::other(format!("MPA set-up failed: {st:?}")));
        }
        Ok(ep)
    }

    /// Take the queue pair's bytes under the lock, queue them after releasing it.
    fn flush(&self, mut g: MutexGuard<'_, State>) {
        let st = &mut *g;
        let tx = st.qp.take_tx(&st.dev, &mut st.cq);
        let done = st.qp.is_done();
        drop(g);
        self.shared.1.notify_all();
        if !tx.is_empty() {
            let _ = self.out.send(Out::Bytes(tx));
        }
        if done {
            let _ = self.out.send(Out::Close);
        }
    }

    /// Run `f` on the device and queue pair (register memory, post work), then send
    /// what it produced.
    pub fn with<R>(&self, f: impl FnOnce(&mut Device, &mut Qp) -> R) -> R {
        let mut g = lock(&self.shared);
        let st = &mut *g;
        let r = f(&mut st.dev, &mut st.qp);
        self.flush(g);
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
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Shut the socket first: a writer blocked on a peer that does not read then
        // fails and exits, so nothing here can block.
        let _ = self.stream.shutdown(Shutdown::Both);
        let _ = self.out.try_send(Out::Close);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn write_loop(mut s: TcpStream, rx: Receiver<Out>) {
    while let Ok(o) = rx.recv() {
        match o {
            Out::Bytes(b) => {
                if s.write_all(&b).is_err() {
                    break;
                }
            }
            Out::Close => break,
        }
    }
    let _ = s.shutdown(Shutdown::Both);
}

fn read_loop(mut s: TcpStream, shared: Shared, out: SyncSender<Out>) {
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
        let tx = st.qp.take_tx(&st.dev, &mut st.cq);
        let done = st.qp.is_done();
        drop(g);
        shared.1.notify_all();
        if !tx.is_empty() && out.send(Out::Bytes(tx)).is_err() {
            return;
        }
        if done {
            let _ = out.send(Out::Close);
        }
    }
}
