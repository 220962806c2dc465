//! The server side: given a request's `RDMA:` field and the body it would send, move
//! the body by RDMA or say why not ([`Decline`]; the caller then sends it over TCP).
//!
//! ```text
//!  field ─ parse ─ mode, peer, size ─ admit (caps) ─ connect to client ─┬─ server-writes
//!   any failure ──────────────────────────────────────────► Decline    │  register body, Write it to
//!                                                                       │  the client's STag/TO, Send
//!                                                                       │  `len` behind it; wait both
//!                                                                       │  handed to TCP; release ──► 200, CL 0,
//!                                                                       │                         RDMA: server-writes, len
//!                                                                       └─ client-reads
//!                                                                          register body REMOTE_READ, post a
//!                                                                          receive for done ──► 200, CL 0,
//!                                                                          RDMA: client-reads, stag, to, len
//!                                                                          then (after the answer) wait done
//!                                                                          or the deadline; release
//! ```
//!
//! **Connection.** As in the seed paper (§3.3), the client listens and the server
//! connects to `ip:port`, as MPA initiator, so server-writes needs no extra round trip.
//! A [`Session`] (one per HTTP connection) keeps that RDMA connection for the next
//! request to the same endpoint, so its cost is paid once per HTTP connection.
//!
//! **Ordering.** A Write's local completion only means "handed to TCP", and the HTTP
//! answer travels on another connection and may overtake it. So the server Sends the
//! length on the RDMA stream behind the Write (RDMAP places a Write before a later Send
//! completes), and the client trusts the body only once that Send has arrived.
//!
//! **Registration** is [`Registration`]: dynamic, static or cache
//! ([`crate::registration`]).
//!
//! **Back-end.** Connections run on the software iWARP stack, or (feature `verbs`,
//! [`Server::with_verbs`]) on a real RDMA device ([`crate::link`]); a connection the
//! device cannot make falls back to the software stack.
//!
//! **Security.** The client names where the server connects and writes, so: the
//! endpoint's address must be the HTTP peer's own; sizes, transfers at once and bytes
//! registered are capped ([`crate::caps`]); every connection has its own device, so a
//! region is reachable only over the connection of the request that registered it,
//! with a random STag key, and is deregistered when the transfer ends (client-reads:
//! on done or at the deadline).

use crate::caps::{Admission, Budget, Caps, Reservation};
use crate::header::{self, Decline, Mode, Response};
use crate::link::{Backend, Link};
use crate::registration::{Cache, FileKey, Registration};
use farside_iwarp::qp::{Qp, QpConfig};
use farside_iwarp::tcp::Endpoint;
use farside_iwarp::verbs::{Access, Cq, Device, WcOpcode, WcStatus};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Completion queue depth of a server connection: one transfer's Write, Send and
/// receive at a time, with room to spare.
const CQ_DEPTH: usize = 16;
/// The small region of a connection: bytes 0..8 the length Sent (server-writes),
/// 8..16 the client's done (client-reads), both a big-endian u64.
const NOTE_BYTES: usize = 16;
const WR_WRITE: u64 = 1;
const WR_SEND: u64 = 2;
const WR_DONE: u64 = 3;

/// Moves bodies by RDMA under one [`Budget`]; shared by the workers.
pub struct Server {
    budget: Arc<Budget>,
    registration: Registration,
    cache: Cache,
    /// Arena-reads: the node's kernel-answered object arena ([`crate::arena`]).
    arena: Option<crate::arena::ArenaServer>,
    /// What new RDMA connections run on.
    backend: Backend,
}

/// One HTTP connection's RDMA state: its RDMA connection, and a client-reads transfer
/// waiting for done.
#[derive(Default)]
pub struct Session {
    conn: Option<Conn>,
    pending: Option<PendingRead>,
}

struct Conn {
    to: SocketAddr,
    link: Link,
    note: u32,
    /// Static registration: the connection's region, held for its life.
    static_region: Option<(u32, Reservation)>,
    /// Bound on sending what is posted when the connection is dropped.
    drain_timeout: Duration,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The last Write and Send completed when the writer took them, not when they
        // were on the wire: let them go before the socket closes.
        self.link.drain(self.drain_timeout);
    }
}

/// A body in registered memory for one transfer.
#[derive(Debug, Clone, Copy)]
struct Src {
    stag: u32,
    /// Deregistered when the transfer ends (not the static region).
    per_transfer: bool,
}

struct PendingRead {
    src: Src,
    deadline: Instant,
    _admission: Admission,
    /// An uncached body's bytes under the cache strategy.
    _extra: Option<Reservation>,
}

/// What the server did with a body it offered by RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    /// The body is in the client's region: answer `Content-Length: 0` with
    /// [`Response::ServerWrites`].
    Written { len: u64 },
    /// The body is registered for the client to read: answer `Content-Length: 0` with
    /// [`Response::ClientReads`], then call [`Server::after_answer`].
    Readable { stag: u32, to: u64, len: u64 },
    /// The body is in the object arena: answer `Content-Length: 0` with
    /// [`Response::ArenaReads`]; nothing to wait for.
    InArena(header::ArenaHint),
}

impl Moved {
    /// The response's `RDMA:` field.
    pub fn response(self) -> Response {
        match self {
            Moved::Written { len } => Response::ServerWrites { len },
            Moved::Readable { stag, to, len } => Response::ClientReads { stag, to, len },
            Moved::InArena(h) => Response::ArenaReads(h),
        }
    }
}

fn same_host(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

impl Server {
    pub fn new(caps: Caps, registration: Registration) -> Server {
        Server {
            budget: Budget::new(caps),
            registration,
            cache: Cache::default(),
            arena: None,
            backend: Backend::Software,
        }
    }

    /// What new RDMA connections run on.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// This server with its RDMA connections on a real RDMA device (`device`, or the
    /// one that routes to each client), if rdma-core loads and the device opens;
    /// otherwise on the software stack, with the reason (also logged).
    #[cfg(feature = "verbs")]
    pub fn with_verbs(mut self, device: Option<String>) -> (Server, Result<(), String>) {
        match farside_verbs::probe(device.as_deref()) {
            Ok(d) => {
                log::info!("rdma: verbs back-end on {} ({})", d.name, d.transport);
                self.backend = Backend::Verbs { device };
                (self, Ok(()))
            }
            Err(e) => {
                log::warn!(
                    "rdma: verbs back-end unavailable ({e}); using the software iWARP stack"
                );
                (self, Err(e.to_string()))
            }
        }
    }

    /// This server with arena-reads answered from `arena`.
    pub fn with_arena(mut self, arena: crate::arena::ArenaServer) -> Server {
        self.arena = Some(arena);
        self
    }

    /// Arena-reads for a file already in the arena: its answer, before the body is even
    /// read (the cheap path: the server touches no body byte). `None`: not an
    /// arena-reads field, no arena, or the file is not there yet ([`Server::serve`]
    /// then puts it).
    pub fn arena_answer(&self, field: &[u8], file: Option<FileKey>) -> Option<Response> {
        let maxlen = header::parse_arena_request(field)?;
        let hint = self.arena.as_ref()?.hint(&file?, maxlen)?;
        Some(Response::ArenaReads(hint))
    }

    /// An arena-reads answer for a request that asked for a grant (`direct=1`), from a
    /// server with direct readers on: the file is published under `public` (the url
    /// path and the file it resolved to, given only for a static public file) and the
    /// answer carries a grant for `peer` ([`crate::grant`]). Any other answer, or no
    /// grant to give, is returned as it was.
    pub fn with_grant(
        &self,
        answer: Response,
        field: &[u8],
        peer: Option<IpAddr>,
        file: Option<FileKey>,
        public: Option<(&str, &std::path::Path)>,
    ) -> Response {
        let (Response::ArenaReads(hint), Some(arena), Some(peer)) = (answer, &self.arena, peer)
        else {
            return answer;
        };
        if !arena.direct() || !header::arena_request_direct(field) {
            return answer;
        }
        if let (Some((path, fs_path)), Some(file)) = (public, file) {
            arena.publish(path, &file, fs_path);
        }
        match arena.grant(peer) {
            Some(g) => Response::ArenaDirect(hint, g),
            None => answer,
        }
    }

    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// The registration cache's (hits, misses, entries).
    pub fn cache_stats(&self) -> (u64, u64, usize) {
        self.cache.stats()
    }

    /// Move `body` as the `RDMA:` request field `field` asks, for a client whose HTTP
    /// connection comes from `peer`; `file` is the file the body was read from, if
    /// any (the registration cache's key). On `Err` nothing was moved that the client
    /// may trust, and the body goes in the response as usual.
    pub fn serve(
        &self,
        session: &mut Session,
        peer: IpAddr,
        field: &[u8],
        body: &[u8],
        file: Option<FileKey>,
    ) -> Result<Moved, Decline> {
        // A client-reads transfer the client never finished ends before the next one.
        self.after_answer(session);
        if let Some(maxlen) = header::parse_arena_request(field) {
            let (Some(arena), Some(file)) = (&self.arena, file) else {
                return Err(Decline::NotOffered);
            };
            if body.is_empty() {
                return Err(Decline::NotOffered);
            }
            return arena.put(&file, body, maxlen).map(Moved::InArena);
        }
        let req = header::parse_request(field).map_err(|e| {
            log::debug!("rdma: field not taken: {e}");
            Decline::BadField
        })?;
        if !same_host(req.endpoint.ip(), peer) {
            log::warn!(
                "rdma: {peer} named endpoint {}, not its own address",
                req.endpoint
            );
            return Err(Decline::PeerMismatch);
        }
        let len = body.len() as u64;
        let caps = *self.budget.caps();
        if len > req.maxlen || len > caps.transfer_bytes_max {
            return Err(Decline::TooLarge);
        }
        if len == 0 {
            // Nothing to move.
            return Err(Decline::NotOffered);
        }
        // Dynamic counts the body for this transfer; static and cache count theirs
        // for as long as they hold it.
        let per_transfer_bytes = match self.registration {
            Registration::Dynamic => len,
            Registration::Static | Registration::Cache => 0,
        };
        let admission = self.budget.admit(per_transfer_bytes)?;
        let conn = connect(session, req.endpoint, &caps, &self.backend)?;
        let r = self
            .register(conn, body, file, req.mode)
            .and_then(|(src, extra)| match req.mode {
                Mode::ServerWrites => {
                    let (stag, to) = req.sink.expect("server-writes names its sink");
                    server_writes(conn, src, len, stag, to, caps.transfer_timeout)
                        .map(|m| (m, None, extra))
                }
                Mode::ClientReads => client_reads(conn, src).map(|()| {
                    let m = Moved::Readable {
                        stag: src.stag,
                        to: conn.link.remote_to(src.stag),
                        len,
                    };
                    (m, Some(src), extra)
                }),
            });
        match r {
            Ok((moved, pending, extra)) => {
                session.pending = pending.map(|src| PendingRead {
                    src,
                    deadline: Instant::now() + caps.transfer_timeout,
                    _admission: admission,
                    _extra: extra,
                });
                Ok(moved)
            }
            Err(d) => {
                // A connection that failed a transfer is not reused.
                session.conn = None;
                Err(d)
            }
        }
    }

    /// Put `body` in registered memory on `conn`, by the server's strategy; with the
    /// budget share of bytes nobody else counts (an uncached body under cache).
    fn register(
        &self,
        conn: &mut Conn,
        body: &[u8],
        file: Option<FileKey>,
        mode: Mode,
    ) -> Result<(Src, Option<Reservation>), Decline> {
        let access = match mode {
            Mode::ServerWrites => Access::NONE,
            Mode::ClientReads => Access::REMOTE_READ,
        };
        let mut extra = None;
        let r = match self.registration {
            Registration::Dynamic => conn.link.reg_mr(body.len(), access).and_then(|stag| {
                fill(&conn.link, stag, body).map(|()| Src {
                    stag,
                    per_transfer: true,
                })
            }),
            Registration::Static => {
                if conn.static_region.is_none() {
                    let size = self.budget.caps().transfer_bytes_max;
                    let reservation = self.budget.reserve(size).ok_or(Decline::Busy)?;
                    let stag = conn
                        .link
                        .reg_mr(size as usize, Access::REMOTE_READ)
                        .map_err(|e| {
                            log::warn!("rdma: static region: {e}");
                            Decline::Transfer
                        })?;
                    conn.static_region = Some((stag, reservation));
                }
                let stag = conn.static_region.as_ref().expect("just set").0;
                conn.link.write(stag, body).map(|()| Src {
                    stag,
                    per_transfer: false,
                })
            }
            Registration::Cache => {
                let (bytes, held) = match file {
                    Some(key) => {
                        let c = self.cache.get(&self.budget, key, body);
                        (c.bytes, c.held)
                    }
                    None => (Arc::from(body), false),
                };
                if !held {
                    let r = self.budget.reserve(bytes.len() as u64);
                    extra = Some(r.ok_or(Decline::Busy)?);
                }
                conn.link.reg_shared(bytes, access).map(|stag| Src {
                    stag,
                    per_transfer: true,
                })
            }
        };
        r.map(|src| (src, extra)).map_err(|e| {
            log::warn!(
                "rdma: register for {} on {}: {e}",
                conn.to,
                conn.link.name()
            );
            Decline::Transfer
        })
    }

    /// After the HTTP answer: a client-reads transfer waits for the client's done or
    /// its deadline, then its region is deregistered and its budget given back.
    pub fn after_answer(&self, session: &mut Session) {
        let Some(p) = session.pending.take() else {
            return;
        };
        let Some(conn) = session.conn.as_ref() else {
            return;
        };
        let done = loop {
            let left = p.deadline.saturating_duration_since(Instant::now());
            match conn.link.wait_wc(left) {
                Some(wc) if wc.wr_id == WR_DONE => break wc.status == WcStatus::Success,
                Some(_) => continue,
                None => break false,
            }
        };
        release(conn, p.src);
        if !done {
            log::warn!("rdma: client-reads of {} not done by its deadline", conn.to);
            session.conn = None;
        }
    }
}

fn fill(link: &Link, stag: u32, body: &[u8]) -> Result<(), String> {
    link.write(stag, body).inspect_err(|_| {
        let _ = link.dereg_mr(stag);
    })
}

/// The transfer is over: a per-transfer region is deregistered (a static one stays).
fn release(conn: &Conn, src: Src) {
    if src.per_transfer {
        let _ = conn.link.dereg_mr(src.stag);
    }
}

/// The session's connection to `to`, reused if it is still up, else a new one.
fn connect<'s>(
    session: &'s mut Session,
    to: SocketAddr,
    caps: &Caps,
    backend: &Backend,
) -> Result<&'s mut Conn, Decline> {
    let reusable = session
        .conn
        .as_ref()
        .is_some_and(|c| c.to == to && c.link.is_up());
    if !reusable {
        session.conn = None;
        session.conn = Some(open(to, caps, backend).map_err(|e| {
            log::info!("rdma: connect to {to}: {e}");
            Decline::Connect
        })?);
    }
    Ok(session.conn.as_mut().expect("just set"))
}

/// A new connection to `to` on `backend`; a verbs connection that cannot be made
/// (no device routes to `to`, the peer refused, ...) is made on the software stack.
fn open(to: SocketAddr, caps: &Caps, backend: &Backend) -> std::io::Result<Conn> {
    #[cfg(feature = "verbs")]
    if let Backend::Verbs { device } = backend {
        match farside_verbs::Conn::connect(to, device.as_deref(), caps.connect_timeout) {
            Ok(c) => {
                let link = Link::Verbs(c);
                let note = link
                    .reg_mr(NOTE_BYTES, Access::LOCAL_WRITE)
                    .map_err(std::io::Error::other)?;
                return Ok(Conn {
                    to,
                    link,
                    note,
                    static_region: None,
                    drain_timeout: caps.transfer_timeout,
                });
            }
            Err(e) => log::info!("rdma: verbs connect to {to}: {e}; using the software stack"),
        }
    }
    let _ = backend;
    let stream = TcpStream::connect_timeout(&to, caps.connect_timeout)?;
    let mut dev = Device::with_random_keys();
    let pd = dev.alloc_pd().map_err(std::io::Error::other)?;
    let note = dev
        .reg_mr(pd, 0, NOTE_BYTES, Access::LOCAL_WRITE)
        .map_err(std::io::Error::other)?;
    let cq = Cq::new(CQ_DEPTH).map_err(std::io::Error::other)?;
    let qp = Qp::connect(pd, QpConfig::default());
    let ep = Endpoint::start_within(stream, dev, cq, qp, caps.connect_timeout)?;
    Ok(Conn {
        to,
        link: Link::Software { ep, pd },
        note,
        static_region: None,
        drain_timeout: caps.transfer_timeout,
    })
}

/// Write the body at `src` to the client's `stag`/`to`, Send its length behind it,
/// wait until both are handed to TCP, release `src`.
fn server_writes(
    conn: &Conn,
    src: Src,
    len: u64,
    stag: u32,
    to: u64,
    timeout: Duration,
) -> Result<Moved, Decline> {
    let posted = conn
        .link
        .write(conn.note, &len.to_be_bytes())
        .and_then(|()| {
            conn.link.post_write_then_send(
                (WR_WRITE, WR_SEND),
                src.stag,
                len as u32,
                (stag, to),
                conn.note,
                8,
            )
        });
    let mut ok = match posted {
        Ok(()) => true,
        Err(e) => {
            log::warn!("rdma: post to {}: {e}", conn.to);
            false
        }
    };
    let deadline = Instant::now() + timeout;
    for want in [WcOpcode::Write, WcOpcode::Send] {
        if !ok {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match conn.link.wait_wc(left) {
            Some(wc) if wc.opcode == want && wc.status == WcStatus::Success => {}
            other => {
                log::warn!(
                    "rdma: write to {} on {}: {other:?}",
                    conn.to,
                    conn.link.name()
                );
                ok = false;
            }
        }
    }
    // Both are on their way (or the connection is gone): the region is not read again.
    release(conn, src);
    if ok {
        Ok(Moved::Written { len })
    } else {
        Err(Decline::Transfer)
    }
}

/// Post the receive for the client's done (the body is registered for remote reads).
fn client_reads(conn: &Conn, src: Src) -> Result<(), Decline> {
    conn.link.post_recv(WR_DONE, conn.note, 8, 8).map_err(|e| {
        log::warn!("rdma: receive for {}: {e}", conn.to);
        release(conn, src);
        Decline::Transfer
    })
}
