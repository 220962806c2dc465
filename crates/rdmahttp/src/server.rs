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
//! **Security.** The client names where the server connects and writes, so: the
//! endpoint's address must be the HTTP peer's own; sizes, transfers at once and bytes
//! registered are capped ([`crate::caps`]); every connection has its own device, so a
//! region is reachable only over the connection of the request that registered it,
//! with a random STag key, and is deregistered when the transfer ends (client-reads:
//! on done or at the deadline).

use crate::caps::{Admission, Budget, Caps};
use crate::header::{self, Decline, Mode, Response};
use farside_iwarp::qp::{Qp, QpConfig, QpState, RecvWr, SendWr, Sge};
use farside_iwarp::tcp::Endpoint;
use farside_iwarp::verbs::{Access, Cq, Device, PdId, WcOpcode, WcStatus};
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
#[derive(Debug, Clone)]
pub struct Server {
    budget: Arc<Budget>,
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
    ep: Endpoint,
    pd: PdId,
    note: u32,
    /// Bound on sending what is posted when the connection is dropped.
    drain_timeout: Duration,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The last Write and Send completed when the writer took them, not when they
        // were on the wire: let them go before the socket closes.
        self.ep.drain(self.drain_timeout);
    }
}

struct PendingRead {
    stag: u32,
    deadline: Instant,
    _admission: Admission,
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
}

impl Moved {
    /// The response's `RDMA:` field.
    pub fn response(self) -> Response {
        match self {
            Moved::Written { len } => Response::ServerWrites { len },
            Moved::Readable { stag, to, len } => Response::ClientReads { stag, to, len },
        }
    }
}

fn same_host(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

impl Server {
    pub fn new(caps: Caps) -> Server {
        Server {
            budget: Budget::new(caps),
        }
    }

    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Move `body` as the `RDMA:` request field `field` asks, for a client whose HTTP
    /// connection comes from `peer`. On `Err` nothing was moved that the client may
    /// trust, and the body goes in the response as usual.
    pub fn serve(
        &self,
        session: &mut Session,
        peer: IpAddr,
        field: &[u8],
        body: &[u8],
    ) -> Result<Moved, Decline> {
        // A client-reads transfer the client never finished ends before the next one.
        self.after_answer(session);
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
        if len > req.maxlen {
            return Err(Decline::TooLarge);
        }
        if len == 0 {
            // Nothing to move.
            return Err(Decline::NotOffered);
        }
        let admission = self.budget.admit(len)?;
        let caps = *self.budget.caps();
        let conn = connect(session, req.endpoint, &caps)?;
        let r = match req.mode {
            Mode::ServerWrites => {
                let (stag, to) = req.sink.expect("server-writes names its sink");
                server_writes(conn, body, stag, to, caps.transfer_timeout)
            }
            Mode::ClientReads => client_reads(conn, body).map(|stag| {
                session.pending = Some(PendingRead {
                    stag,
                    deadline: Instant::now() + caps.transfer_timeout,
                    _admission: admission,
                });
                Moved::Readable { stag, to: 0, len }
            }),
        };
        if r.is_err() {
            // A connection that failed a transfer is not reused.
            session.conn = None;
        }
        r
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
            match conn.ep.wait_wc(left) {
                Some(wc) if wc.wr_id == WR_DONE => break wc.status == WcStatus::Success,
                Some(_) => continue,
                None => break false,
            }
        };
        let _ = conn.ep.with(|dev, _| dev.dereg_mr(p.stag));
        if !done {
            log::warn!("rdma: client-reads of {} not done by its deadline", conn.to);
            session.conn = None;
        }
    }
}

/// The session's connection to `to`, reused if it is still up, else a new one.
fn connect<'s>(session: &'s mut Session, to: SocketAddr, caps: &Caps) -> Result<&'s Conn, Decline> {
    let reusable = session
        .conn
        .as_ref()
        .is_some_and(|c| c.to == to && !c.ep.is_closed() && c.ep.state() == QpState::Rts);
    if !reusable {
        session.conn = None;
        session.conn = Some(open(to, caps).map_err(|e| {
            log::info!("rdma: connect to {to}: {e}");
            Decline::Connect
        })?);
    }
    Ok(session.conn.as_ref().expect("just set"))
}

fn open(to: SocketAddr, caps: &Caps) -> std::io::Result<Conn> {
    let stream = TcpStream::connect_timeout(&to, caps.connect_timeout)?;
    let mut dev = Device::with_random_keys();
    let pd = dev.alloc_pd().map_err(std::io::Error::other)?;
    let note = dev
        .reg_mr(pd, 0, NOTE_BYTES, Access::LOCAL_WRITE)
        .map_err(std::io::Error::other)?;
    let cq = Cq::new(CQ_DEPTH).map_err(std::io::Error::other)?;
    let ep = Endpoint::start(stream, dev, cq, Qp::connect(pd, QpConfig::default()))?;
    Ok(Conn {
        to,
        ep,
        pd,
        note,
        drain_timeout: caps.transfer_timeout,
    })
}

/// Register `body`, Write it to the client's `stag`/`to`, Send its length behind it,
/// wait until both are handed to TCP, deregister.
fn server_writes(
    conn: &Conn,
    body: &[u8],
    stag: u32,
    to: u64,
    timeout: Duration,
) -> Result<Moved, Decline> {
    let len = body.len() as u64;
    let src = conn
        .ep
        .with(|dev, qp| {
            let src = dev.reg_mr(conn.pd, 0, body.len(), Access::NONE)?;
            dev.write(src, 0, body)
                .and_then(|()| dev.write(conn.note, 0, &len.to_be_bytes()))
                .map_err(farside_iwarp::verbs::VerbsError::Access)?;
            let posted = qp
                .post_send(SendWr::Write {
                    wr_id: WR_WRITE,
                    local: Sge {
                        stag: src,
                        to: 0,
                        len: body.len() as u32,
                    },
                    remote_stag: stag,
                    remote_to: to,
                })
                .and_then(|()| {
                    qp.post_send(SendWr::Send {
                        wr_id: WR_SEND,
                        local: Sge {
                            stag: conn.note,
                            to: 0,
                            len: 8,
                        },
                        solicited: true,
                        invalidate: None,
                    })
                });
            match posted {
                Ok(()) => Ok(src),
                Err(e) => {
                    let _ = dev.dereg_mr(src);
                    Err(e)
                }
            }
        })
        .map_err(|e| {
            log::warn!("rdma: post to {}: {e}", conn.to);
            Decline::Transfer
        })?;
    let deadline = Instant::now() + timeout;
    let mut ok = true;
    for want in [WcOpcode::Write, WcOpcode::Send] {
        let left = deadline.saturating_duration_since(Instant::now());
        match conn.ep.wait_wc(left) {
            Some(wc) if wc.opcode == want && wc.status == WcStatus::Success => {}
            other => {
                log::warn!("rdma: write to {}: {other:?}", conn.to);
                ok = false;
                break;
            }
        }
    }
    // Both are on the wire (or the connection is gone): the region is not read again.
    let _ = conn.ep.with(|dev, _| dev.dereg_mr(src));
    if ok {
        Ok(Moved::Written { len })
    } else {
        Err(Decline::Transfer)
    }
}

/// Register `body` for remote reads and post the receive for the client's done.
fn client_reads(conn: &Conn, body: &[u8]) -> Result<u32, Decline> {
    conn.ep
        .with(|dev, qp| {
            let src = dev.reg_mr(conn.pd, 0, body.len(), Access::REMOTE_READ)?;
            let r = dev
                .write(src, 0, body)
                .map_err(farside_iwarp::verbs::VerbsError::Access)
                .and_then(|()| {
                    qp.post_recv(RecvWr {
                        wr_id: WR_DONE,
                        sge: Sge {
                            stag: conn.note,
                            to: 8,
                            len: 8,
                        },
                    })
                });
            match r {
                Ok(()) => Ok(src),
                Err(e) => {
                    let _ = dev.dereg_mr(src);
                    Err(e)
                }
            }
        })
        .map_err(|e| {
            log::warn!("rdma: register for {}: {e}", conn.to);
            Decline::Transfer
        })
}
