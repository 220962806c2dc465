//! The dumped state of one established TCP connection: everything
//! [`crate::restore()`] needs to rebuild the server-side endpoint on another socket.
//!
//! Sequence-number convention (as the kernel reports them in repair mode):
//! `snd_seq` is `write_seq`, the sequence number *after* the last byte the
//! application wrote, so the send queue covers `[snd_seq - send_queue.len(), snd_seq)`
//! (its first `send_queue.len() - unsent_len` bytes were sent and are unacknowledged,
//! the last `unsent_len` bytes were never sent); `rcv_seq` is `rcv_nxt`, so the
//! receive queue covers `[rcv_seq - recv_queue.len(), rcv_seq)`.

use std::net::SocketAddr;

/// Largest send or receive queue this crate dumps, ships or restores, in bytes.
/// Linux autotunes buffers to `tcp_wmem`/`tcp_rmem` max (4 MiB / 6 MiB by default);
/// 32 MiB leaves room for raised sysctls and bounds the decoder's allocation.
pub const QUEUE_BYTES_MAX: usize = 32 << 20;

/// Largest window scale TCP allows (RFC 7323 §2.3); the kernel refuses more.
pub const WSCALE_MAX: u8 = 14;

/// TCP options negotiated in the handshake, restored with `TCP_REPAIR_OPTIONS`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpOptions {
    /// Maximum segment size (`TCP_MAXSEG` read on the source), restored as the
    /// MSS clamp.
    pub mss: u16,
    /// Window scaling negotiated: `(snd_wscale, rcv_wscale)` (shift counts ≤ 14).
    pub wscale: Option<(u8, u8)>,
    /// SACK permitted.
    pub sack: bool,
    /// RFC 7323 timestamps in use (then `TcpState::timestamp` matters: without it
    /// the peer drops the restored socket's segments by PAWS).
    pub timestamps: bool,
}

/// The kernel's `struct tcp_repair_window` (Linux ≥ 4.8): the peer's advertised window
/// and ours, so the restored socket neither over-sends nor shrinks its window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RepairWindow {
    /// Sequence number of the segment that last updated `snd_wnd`.
    pub snd_wl1: u32,
    /// The peer's receive window (bytes, already scaled).
    pub snd_wnd: u32,
    /// Largest window the peer ever advertised.
    pub max_window: u32,
    /// Our receive window as last advertised.
    pub rcv_wnd: u32,
    /// `rcv_nxt` when the window was last advertised.
    pub rcv_wup: u32,
}

/// Full state of an established TCP connection, as dumped by [`crate::dump`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpState {
    /// The endpoint's own address (the service address, e.g. the VIP).
    pub local: SocketAddr,
    /// The peer (client) address.
    pub remote: SocketAddr,
    /// `write_seq`: sequence number after the last byte in the send queue.
    pub snd_seq: u32,
    /// `rcv_nxt`: sequence number after the last byte in the receive queue.
    pub rcv_seq: u32,
    /// Negotiated options.
    pub options: TcpOptions,
    /// `TCP_TIMESTAMP`: the connection's current timestamp clock (ms), so the restored
    /// socket's TSval continue where the source's stopped.
    pub timestamp: u32,
    /// Windows (`TCP_REPAIR_WINDOW`).
    pub window: RepairWindow,
    /// `SO_SNDBUF` of the source (bytes, as getsockopt reports it).
    pub sndbuf: u32,
    /// `SO_RCVBUF` of the source (bytes, as getsockopt reports it).
    pub rcvbuf: u32,
    /// Send queue: unacknowledged bytes followed by never-sent bytes.
    pub send_queue: Vec<u8>,
    /// How many bytes at the end of `send_queue` were never sent.
    pub unsent_len: u32,
    /// Receive queue: bytes received and acknowledged but not yet read by the
    /// application (for a fresh connection: the request bytes already received).
    pub recv_queue: Vec<u8>,
}

impl TcpState {
    /// Bytes of the send queue that were sent and are not yet acknowledged.
    pub fn sent_unacked(&self) -> &[u8] {
        &self.send_queue[..self.send_queue.len() - self.unsent_len as usize]
    }

    /// Bytes of the send queue that were never sent.
    pub fn unsent(&self) -> &[u8] {
        &self.send_queue[self.send_queue.len() - self.unsent_len as usize..]
    }

    /// Checks the invariants the encoder, decoder and restore rely on; a state that
    /// fails them is never shipped or restored.
    pub fn validate(&self) -> Result<(), String> {
        if self.local.is_ipv4() != self.remote.is_ipv4() {
            return Err("local and remote address families differ".into());
        }
        if self.send_queue.len() > QUEUE_BYTES_MAX || self.recv_queue.len() > QUEUE_BYTES_MAX {
            return Err(format!("a queue exceeds {QUEUE_BYTES_MAX} bytes"));
        }
        if self.unsent_len as usize > self.send_queue.len() {
            return Err("unsent length exceeds the send queue".into());
        }
        if self.options.mss == 0 {
            return Err("MSS is zero".into());
        }
        if let Some((snd, rcv)) = self.options.wscale {
            if snd > WSCALE_MAX || rcv > WSCALE_MAX {
                return Err(format!("window scale above {WSCALE_MAX}"));
            }
        }
        if self.window.max_window < self.window.snd_wnd {
            return Err("max_window below snd_wnd".into());
        }
        Ok(())
    }
}
