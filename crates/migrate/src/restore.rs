//! Rebuild a dumped connection on a new socket with TCP_REPAIR.
//!
//! Order (each step depends on the ones before it):
//! 1. `socket()`, `SO_REUSEADDR`, TCP_REPAIR on (after it: lets `bind` share the
//!    port with the service's listener), `bind` to the original local address (again
//!    with `IP_FREEBIND` if the address is not local yet);
//! 2. `TCP_QUEUE_SEQ` of both queues to the sequence number of their first byte;
//! 3. `connect()` to the peer: in repair mode no handshake, the socket is ESTABLISHED;
//! 4. `TCP_REPAIR_OPTIONS` (MSS, window scales, SACK, timestamps: the kernel takes
//!    them only before any byte was sent), `TCP_TIMESTAMP`;
//! 5. buffer sizes raised to the source's, and the send buffer to hold the whole send queue
//!    (see `sndbuf_wanted`);
//! 6. refill the *sent* part of the send queue and the receive queue (repair-mode
//!    writes: queued as already transmitted / as received);
//! 7. `TCP_REPAIR_WINDOW` (checked by the kernel against `rcv_nxt`, hence after 6);
//! 8. (on [`Frozen::release`]) TCP_REPAIR off (a window probe only if sent bytes
//!    are in flight: [`release_probe`]), input filter off, then the never-sent bytes
//!    are written normally.
//!
//! Until released the restored socket is frozen like the source: repair mode on and
//! the drop-everything input filter attached from before `connect`.
//!
//! The socket and its 4-tuple must not exist in this network namespace: on the same
//! host the source is closed silently first (see [`crate::Handover`]).

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::dump::{
    attach_drop_filter, close_frozen, close_silently, repair_on, repair_queue, thaw, Probe,
};
use crate::state::TcpState;
use crate::sys;

/// How long writing the never-sent bytes may block after repair is off: they fit in
/// the source's send buffer, so they go as soon as the peer's window opens; a peer
/// that keeps its window shut this long is treated as a failed restore.
pub const UNSENT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Writes all of `buf` into the queue selected in repair mode. Each call may take
/// only part (the kernel builds one skb of at most MAX_SKB_FRAGS pages per call).
/// `selected`: `queue` is already the repair queue selected.
fn refill(fd: RawFd, queue: libc::c_int, buf: &[u8], selected: bool) -> io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    if !selected {
        repair_queue(fd, queue)?;
    }
    let mut off = 0;
    while off < buf.len() {
        let n = sys::send(fd, &buf[off..], "send (repair refill)")?;
        if n == 0 {
            return Err(io::Error::other("repair refill made no progress"));
        }
        off += n;
    }
    Ok(())
}

/// Raises the buffer to `want` (in `getsockopt` units) if `have` is smaller, within
/// the system's bound: `opt` is `SO_SNDBUF` or `SO_RCVBUF`, which the kernel clamps
/// to `net.core.wmem_max` / `rmem_max` (never the `*FORCE` variants: the sizes come
/// from the peer, and a restored socket must not pin more memory than any local
/// socket may). A queue that does not fit the clamped buffer fails its refill (the
/// refill does not wait), so the restore fails and the source resumes.
fn raise_buffer(fd: RawFd, have: libc::c_int, opt: libc::c_int, want: u32) -> io::Result<()> {
    if (want as i64) > have as i64 {
        // The kernel doubles the value set (for its bookkeeping) and reports the
        // doubled one, so half of the source's reported size gives the same buffer.
        let half = (want / 2).min(libc::c_int::MAX as u32) as libc::c_int;
        sys::setsockopt(fd, libc::SOL_SOCKET, opt, &half, "SO_SNDBUF/SO_RCVBUF")?;
    }
    Ok(())
}

/// Headroom of the restored send buffer over the bytes of the send queue: the kernel
/// charges an skb's truesize (payload plus page and struct overhead), and the refilled
/// queue is built from different skbs than the source's, so the source's `SO_SNDBUF`
/// alone may not hold the whole queue again.
const SNDBUF_HEADROOM: u32 = 2;

/// The send buffer the restored socket needs (in `getsockopt` units, which count the
/// kernel's doubling): the whole send queue, sent and never-sent part, must fit before
/// the client's window opens, or writing the never-sent part would wait for a client
/// that may itself be waiting for the migration to end.
fn sndbuf_wanted(st: &TcpState) -> u32 {
    let queue = u32::try_from(st.send_queue.len()).unwrap_or(u32::MAX);
    st.sndbuf.max(
        queue
            .saturating_mul(SNDBUF_HEADROOM)
            .saturating_add(64 << 10),
    )
}

fn options_blob(st: &TcpState) -> Vec<u8> {
    let mut opts = vec![(sys::TCPOPT_MSS, u32::from(st.options.mss))];
    if let Some((snd, rcv)) = st.options.wscale {
        opts.push((sys::TCPOPT_WINDOW, u32::from(snd) | (u32::from(rcv) << 16)));
    }
    if st.options.sack {
        opts.push((sys::TCPOPT_SACK_PERM, 0));
    }
    if st.options.timestamps {
        opts.push((sys::TCPOPT_TIMESTAMP, 0));
    }
    // An array of struct tcp_repair_opt, native byte order.
    opts.iter()
        .flat_map(|(c, v)| c.to_ne_bytes().into_iter().chain(v.to_ne_bytes()))
        .collect()
}

fn new_socket(local: &SocketAddr) -> io::Result<OwnedFd> {
    let family = if local.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2); the fd is owned below.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Steps 1–7: leaves the socket in repair mode.
fn rebuild(fd: RawFd, st: &TcpState) -> io::Result<()> {
    sys::set_reuseaddr(fd)?;
    let one: libc::c_int = 1;
    // After SO_REUSEADDR, which would overwrite it: repair on sets sk_reuse to
    // SK_FORCE_REUSE, so `bind` succeeds next to the service's listener.
    repair_on(fd)?;
    match sys::bind(fd, &st.local) {
        Ok(()) => {}
        // The address is not local (yet) here: bind it anyway. Tried second, as the
        // service address is normally local (one system call less per restore).
        Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
            if st.local.is_ipv4() {
                sys::setsockopt(fd, libc::SOL_IP, libc::IP_FREEBIND, &one, "IP_FREEBIND")?;
            } else {
                sys::setsockopt(
                    fd,
                    libc::SOL_IPV6,
                    sys::IPV6_FREEBIND,
                    &one,
                    "IPV6_FREEBIND",
                )?;
            }
            sys::bind(fd, &st.local)?;
        }
        Err(e) => return Err(e),
    }

    let rcv_first = st.rcv_seq.wrapping_sub(st.recv_queue.len() as u32);
    let snd_first = st.snd_seq.wrapping_sub(st.send_queue.len() as u32);
    // Send first: the receive queue stays selected for its refill (a migrated
    // request's bytes), so a connection with an empty send queue selects twice.
    repair_queue(fd, sys::TCP_SEND_QUEUE)?;
    sys::setsockopt(
        fd,
        libc::SOL_TCP,
        sys::TCP_QUEUE_SEQ,
        &snd_first,
        "TCP_QUEUE_SEQ send",
    )?;
    repair_queue(fd, sys::TCP_RECV_QUEUE)?;
    sys::setsockopt(
        fd,
        libc::SOL_TCP,
        sys::TCP_QUEUE_SEQ,
        &rcv_first,
        "TCP_QUEUE_SEQ recv",
    )?;
    // The queue selection stays: `connect`, the options, the buffers and the window do
    // not depend on it (one system call less; each refill selects its queue).

    sys::connect(fd, &st.remote)?;
    sys::setsockopt_bytes(
        fd,
        libc::SOL_TCP,
        sys::TCP_REPAIR_OPTIONS,
        &options_blob(st),
        "TCP_REPAIR_OPTIONS",
    )?;
    sys::setsockopt(
        fd,
        libc::SOL_TCP,
        sys::TCP_TIMESTAMP,
        &st.timestamp,
        "TCP_TIMESTAMP",
    )?;
    // Both sizes in one call (SO_MEMINFO).
    let (sndbuf, rcvbuf) = sys::buffer_sizes(fd)?;
    raise_buffer(fd, sndbuf, libc::SO_SNDBUF, sndbuf_wanted(st))?;
    raise_buffer(fd, rcvbuf, libc::SO_RCVBUF, st.rcvbuf)?;

    // The receive queue is still selected (its TCP_QUEUE_SEQ was set last): refill
    // it first, then the send queue (selected only if it has bytes); the two are
    // independent in the kernel.
    refill(fd, sys::TCP_RECV_QUEUE, &st.recv_queue, true)?;
    refill(fd, sys::TCP_SEND_QUEUE, st.sent_unacked(), false)?;

    let w = sys::TcpRepairWindow {
        snd_wl1: st.window.snd_wl1,
        snd_wnd: st.window.snd_wnd,
        max_window: st.window.max_window,
        rcv_wnd: st.window.rcv_wnd,
        rcv_wup: st.window.rcv_wup,
    };
    sys::setsockopt(
        fd,
        libc::SOL_TCP,
        sys::TCP_REPAIR_WINDOW,
        &w,
        "TCP_REPAIR_WINDOW",
    )
}

/// A restored connection still frozen (repair mode on, input dropped): nothing is
/// sent or acknowledged until [`Frozen::release`]; dropping it closes it silently.
pub struct Frozen {
    stream: TcpStream,
    unsent: Vec<u8>,
    probe: Probe,
}

/// Whether releasing a copy restored from `st` sends a window probe: only when bytes
/// we sent are unacknowledged. The probe's answer then tells the copy how much of
/// them the client has (its ACKs to the source may have been dropped by the freeze),
/// before the restored retransmission timer resends them. Without sent bytes in flight
/// the answer has nothing to tell: the window is the dumped one, and the client's own
/// timers resend whatever the freeze dropped (the probe does not make it resend).
/// The lab's migrations carry a request and nothing sent, so a release costs the node
/// no packet (two with the probe: the probe and the client's answer, both through
/// the node's network path).
fn release_probe(st: &TcpState) -> Probe {
    if st.sent_unacked().is_empty() {
        Probe::Skip
    } else {
        Probe::Send
    }
}

/// Restores `st` on a new socket and keeps it frozen until the caller releases it
/// (the target waits for the source's DONE: until then the source may still resume).
///
/// On failure the partial socket is closed in repair mode, so the peer sees nothing
/// and the 4-tuple is free again (the caller may restore elsewhere).
pub fn restore_frozen(st: &TcpState) -> io::Result<Frozen> {
    st.validate().map_err(io::Error::other)?;
    let owned = new_socket(&st.local)?;
    let fd = owned.as_raw_fd();
    // Input is dropped from the moment the 4-tuple exists (at `connect`), so nothing
    // is acknowledged before the caller decides.
    attach_drop_filter(fd)?;
    if let Err(e) = rebuild(fd, st) {
        // Repair is still on: the close is silent, and the disconnect frees the
        // 4-tuple now even if another process holds the file (see `close_frozen`).
        close_frozen(TcpStream::from(owned));
        return Err(e);
    }
    Ok(Frozen {
        stream: TcpStream::from(owned),
        probe: release_probe(st),
        unsent: {
            let mut u = crate::bufs::take(st.unsent().len());
            u.extend_from_slice(st.unsent());
            u
        },
    })
}

impl Frozen {
    /// Lets the connection run: repair off (with a window probe if sent bytes are in
    /// flight: [`release_probe`]), input on, then the never-sent bytes are written.
    pub fn release(self) -> io::Result<TcpStream> {
        let Frozen {
            mut stream,
            unsent,
            probe,
        } = self;
        let r = release_stream(&mut stream, &unsent, probe);
        crate::bufs::give(unsent);
        match r {
            Ok(()) => Ok(stream),
            Err(e) => {
                // Some bytes may be lost already: never leave such a socket running.
                let _ = close_silently(stream);
                Err(e)
            }
        }
    }

    /// Closes the frozen copy without a trace (no FIN, no RST).
    pub fn discard(self) {
        // Still frozen (repair on, filter attached since before `connect`).
        close_frozen(self.stream);
        crate::bufs::give(self.unsent);
    }
}

fn release_stream(stream: &mut TcpStream, unsent: &[u8], probe: Probe) -> io::Result<()> {
    thaw(stream.as_raw_fd(), None, probe)?;
    if !unsent.is_empty() {
        write_unsent(stream, unsent)
            .map_err(|e| io::Error::new(e.kind(), format!("writing unsent bytes: {e}")))?;
    }
    Ok(())
}

/// Poll interval while the send buffer is full (a few client round trips).
const UNSENT_POLL_MS: libc::c_int = 10;

/// Writes the never-sent bytes within [`UNSENT_WRITE_TIMEOUT`]. The send buffer was
/// sized for the whole queue ([`sndbuf_wanted`]), but the client's window may be
/// shut; on EAGAIN wait for POLLOUT and retry, until the deadline. Each write is
/// non-blocking by itself (`MSG_DONTWAIT`), so the deadline holds without switching
/// the socket's mode back and forth.
fn write_unsent(stream: &mut TcpStream, mut buf: &[u8]) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    let deadline = std::time::Instant::now() + UNSENT_WRITE_TIMEOUT;
    while !buf.is_empty() {
        match sys::send(fd, buf, "send (unsent bytes)") {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes")),
            Ok(n) => buf = &buf[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                if std::time::Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "send buffer stayed full",
                    ));
                }
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one live pollfd.
                unsafe { libc::poll(&mut pfd, 1, UNSENT_POLL_MS) };
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Restores `st` on a new socket and returns it as a working, blocking stream
/// ([`restore_frozen`] then [`Frozen::release`]).
pub fn restore(st: &TcpState) -> io::Result<TcpStream> {
    restore_frozen(st)?.release()
}
