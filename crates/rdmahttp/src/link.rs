//! The server's RDMA connection, over either back-end: the software iWARP stack
//! ([`farside_iwarp::tcp::Endpoint`]) or, with the `verbs` feature, a real RDMA device
//! ([`farside_verbs::Conn`]). [`crate::server`] registers bodies, posts Writes, Sends
//! and receives, and waits for completions through [`Link`] and does not know which
//! one runs.
//!
//! The two differ where verbs differ from the software stack: a device's region is
//! addressed by its rkey and its virtual address ([`Link::remote_to`]), the software
//! stack's by its STag and tagged offset 0; and a device's completion of a Write or
//! Send means the device took it, the software stack's that its writer thread handed
//! it to TCP; either way [`Link::drain`] closes gracefully (the software stack sends
//! what is posted, then FIN; a device disconnects and waits for the connection manager
//! to report the connection closed).

use farside_iwarp::qp::{QpState, RecvWr, SendWr, Sge};
use farside_iwarp::tcp::Endpoint;
use farside_iwarp::verbs::{Access, PdId, VerbsError, Wc};
use std::sync::Arc;
use std::time::Duration;

/// Longest wait for a device connection's graceful close: the connection manager
/// reports it once the peer has closed too, and a peer that keeps its end open must not
/// hold the worker that closes (the data posted before was completed already).
#[cfg(feature = "verbs")]
pub const DISCONNECT_WAIT_MAX: Duration = Duration::from_secs(1);

/// Which back-end new RDMA connections use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Backend {
    /// The software iWARP stack.
    #[default]
    Software,
    /// A real RDMA device through rdma-core (`None`: the device that routes to the
    /// client), falling back to the software stack for a connection it cannot make.
    #[cfg(feature = "verbs")]
    Verbs { device: Option<String> },
}

/// One RDMA connection of the server.
pub(crate) enum Link {
    Software {
        ep: Endpoint,
        pd: PdId,
    },
    #[cfg(feature = "verbs")]
    Verbs(farside_verbs::Conn),
}

type R<T> = Result<T, String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

impl Link {
    /// What runs this connection, for logs.
    pub(crate) fn name(&self) -> String {
        match self {
            Link::Software { .. } => "software iWARP".into(),
            #[cfg(feature = "verbs")]
            Link::Verbs(c) => format!("verbs device {}", c.device()),
        }
    }

    /// Register a zeroed region of `len` bytes; its STag.
    pub(crate) fn reg_mr(&self, len: usize, access: Access) -> R<u32> {
        match self {
            Link::Software { ep, pd } => {
                ep.with(|dev, _| dev.reg_mr(*pd, 0, len, access)).map_err(s)
            }
            #[cfg(feature = "verbs")]
            Link::Verbs(c) => c.reg_mr(len, access).map_err(s),
        }
    }

    /// Register `bytes` read-only without a copy; its STag.
    pub(crate) fn reg_shared(&self, bytes: Arc<[u8]>, access: Access) -> R<u32> {
        match self {
            Link::Software { ep, pd } => ep
                .with(|dev, _| dev.reg_shared(*pd, 0, bytes, access))
                .map_err(s),
            #[cfg(feature = "verbs")]
            Link::Verbs(c) => c.reg_shared(bytes, access).map_err(s),
        }
    }

    pub(crate) fn dereg_mr(&self, stag: u32) -> R<()> {
        match self {
            Link::Software { ep, .. } => ep.with(|dev, _| dev.dereg_mr(stag)).map_err(s),
            #[cfg(feature = "verbs")]
            Link::Verbs(c) => c.dereg_mr(stag).map_err(s),
        }
    }

    /// Copy `data` into region `stag` from its start.
    pub(crate) fn write(&self, stag: u32, data: &[u8]) -> R<()> {
        match self {
            Link::Software { ep, .. } => ep
                .with(|dev, _| dev.write(stag, 0, data))
                .map_err(|e| s(VerbsError::Access(e))),
            #[cfg(feature = "verbs")]
            Link::Verbs(c) => c.write(stag, 0, data).map_err(s),
        }
    }

    /// Where the peer addresses byte 0 of region `stag`.
    pub(crate) fn remote_to(&self, stag: u32) -> u64 {
        match self {
            Link::Software { .. } => {
                let _ = stag;
                0
            }
            #[cfg(feature = "verbs")]
            Link::Verbs(c) => c.remote_to(stag).unwrap_or(0),
        }
    }

    /// Write `len` bytes of region `src` to the peer's `stag`/`to`, then Send `send_len`
    /// bytes of region `note` behind it (solicited): both posted before either runs.
    pub(crate) fn post_write_then_send(
        &self,
        ids: (u64, u64),
        src: u32,
        len: u32,
        remote: (u32, u64),
        note: u32,
        send_len: u32,
    ) -> R<()> {
        match self {
            Link::Software { ep, .. } => ep
                .with(|_, qp| {
                    qp.post_send(SendWr::Write {
                        wr_id: ids.0,
                        local: Sge {
                            stag: src,
                            to: 0,
                            len,
                        },
                        remote_stag: remote.0,
                        remote_to: remote.1,
                    })?;
                    qp.post_send(SendWr::Send {
                        wr_id: ids.1,
                        local: Sge {
                            stag: note,
                            to: 0,
                            len: send_len,
                        },
                        solicited: true,
                        invalidate: None,
                    })
                })
                .map_err(s),
            #[cfg(feature = "verbs")]
            Link::Verbs(c) => {
                c.post_write(ids.0, src, 0, len as usize, remote.0, remote.1)
                    .map_err(s)?;
                c.post_send(ids.1, note, 0, send_len as usize, true)
                    .map_err(s)
            }
        }
    }

    /// Post a receive into `len` bytes at `off` of region `stag`.
    pub(crate) fn post_recv(&self, wr_id: u64, stag: u32, off: u32, len: u32) -> R<()> {
        match self {
            Link::Software { ep, .. } => ep
                .post_recv(RecvWr {
                    wr_id,
                    sge: Sge {
                        stag,
                        to: u64::from(off),
                        len,
                    },
                })
                .map_err(s),
            #[cfg(feature = "verbs")]
            Link::Verbs(c) => c
                .post_recv(wr_id, stag, off as usize, len as usize)
                .map_err(s),
        }
    }

    /// The next completion within `timeout`.
    pub(crate) fn wait_wc(&self, timeout: Duration) -> Option<Wc> {
        match self {
            Link::Software { ep, .. } => ep.wait_wc(timeout),
            #[cfg(feature = "verbs")]
            Link::Verbs(c) => c.wait_wc(timeout),
        }
    }

    /// Whether the connection still takes work.
    pub(crate) fn is_up(&self) -> bool {
        match self {
            Link::Software { ep, .. } => !ep.is_closed() && ep.state() == QpState::Rts,
            #[cfg(feature = "verbs")]
            Link::Verbs(c) => c.is_up(),
        }
    }

    /// Before closing: let what was posted reach the peer, within `timeout`.
    pub(crate) fn drain(&self, timeout: Duration) {
        match self {
            Link::Software { ep, .. } => {
                ep.drain(timeout);
            }
            #[cfg(feature = "verbs")]
            Link::Verbs(c) => {
                c.disconnect(timeout.min(DISCONNECT_WAIT_MAX));
            }
        }
    }
}
