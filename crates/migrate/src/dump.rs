//! Freeze and dump an established TCP socket with TCP_REPAIR; resume it or close it
//! silently afterwards.
//!
//! **What is frozen.** Repair mode stops the socket from *sending* (no data, no
//! FIN/RST on close) but not from *receiving*: a segment arriving after the dump would
//! be acknowledged by the source and then lost with it. So before entering repair mode
//! [`freeze_and_dump`] attaches a one-instruction classic BPF socket filter that drops
//! every incoming segment (`tcp_filter()` runs before TCP processing, so dropped
//! segments are neither queued nor acknowledged); the peer retransmits them later to
//! the restored socket. This holds the flow at the socket itself, on loopback as well
//! as across hosts; the front-end's flow hold comes on top of it in the deployment.
//!
//! Repair mode does not stop the *transmit* path either: a pacing or persist timer can
//! still send never-sent bytes after the dump. So the freeze also sets the send window
//! to zero (`TCP_REPAIR_WINDOW`); the dumped state keeps the real window, and
//! [`resume`] puts it back.
//!
//! Order: filter on → urgent-data check → TCP_REPAIR on → send window 0 →
//! `TCP_INFO` → the fixed fields once → sequence numbers and queue lengths, queues →
//! `TCP_INFO` again, until two consecutive `TCP_INFO` reads agree (segments counted,
//! bytes acknowledged and received, never-sent bytes, state) → return. On any
//! refusal the socket is thawed (repair off, filter off) and keeps working.
//!
//! Cost (CPU per migration): the queues are peeked once when the reads
//! around them agree, the fixed fields (addresses, MSS, timestamp clock, buffer sizes,
//! options) once, the repair queue is selected only when it changes, and the check
//! that nothing landed meanwhile is one `TCP_INFO` (it was a second read of both
//! sequence numbers and three queue lengths): 23 system calls per dump of a
//! connection whose send queue is empty (down from 30, and 53 before that).

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

use crate::bufs;
use crate::error::{DumpError, Queue};
use crate::state::{RepairWindow, TcpOptions, TcpState, QUEUE_BYTES_MAX};
use crate::sys;

/// Times the dump re-reads the state when two consecutive reads disagree (a segment
/// that passed the filter just before it was attached); one retry covers that race,
/// a third disagreement means input is not frozen.
const DUMP_ATTEMPTS_MAX: usize = 3;

/// The process's drop-everything eBPF socket filter, loaded once; `None` if the
/// kernel refused it (then the classic filter is attached each time).
fn drop_prog() -> Option<RawFd> {
    static PROG: std::sync::OnceLock<Option<std::os::fd::OwnedFd>> = std::sync::OnceLock::new();
    PROG.get_or_init(|| match sys::load_drop_socket_filter() {
        Ok(fd) => Some(fd),
        Err(e) => {
            log::warn!("migrate: {e}; attaching a classic filter on every freeze instead");
            None
        }
    })
    .as_ref()
    .map(|f| f.as_raw_fd())
}

/// Attaches the drop-everything socket filter (input freeze): the eBPF program
/// loaded once per process (attaching it takes a reference), or a classic one.
pub(crate) fn attach_drop_filter(fd: RawFd) -> io::Result<()> {
    if let Some(prog) = drop_prog() {
        if sys::setsockopt(
            fd,
            libc::SOL_SOCKET,
            sys::SO_ATTACH_BPF,
            &prog,
            "SO_ATTACH_BPF",
        )
        .is_ok()
        {
            return Ok(());
        }
    }
    attach_classic_drop_filter(fd)
}

/// The classic form: converted and JIT-compiled by the kernel on every attach.
fn attach_classic_drop_filter(fd: RawFd) -> io::Result<()> {
    // BPF_RET | BPF_K, k = 0: accept zero bytes of every packet, i.e. drop it.
    let mut insn = [libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    let prog = libc::sock_fprog {
        len: 1,
        filter: insn.as_mut_ptr(),
    };
    sys::setsockopt(
        fd,
        libc::SOL_SOCKET,
        libc::SO_ATTACH_FILTER,
        &prog,
        "SO_ATTACH_FILTER",
    )
}

fn detach_filter(fd: RawFd) -> io::Result<()> {
    let zero: libc::c_int = 0;
    sys::setsockopt(
        fd,
        libc::SOL_SOCKET,
        libc::SO_DETACH_FILTER,
        &zero,
        "SO_DETACH_FILTER",
    )
}

pub(crate) fn repair_on(fd: RawFd) -> io::Result<()> {
    sys::setsockopt(
        fd,
        libc::SOL_TCP,
        sys::TCP_REPAIR,
        &sys::TCP_REPAIR_ON,
        "TCP_REPAIR",
    )
}

/// Whether turning repair off sends a window probe ([`thaw`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// `TCP_REPAIR_OFF`: one segment (`seq = snd_una - 1`) that the peer answers with
    /// an ACK, which tells the socket the peer's window and how much of our sent data
    /// it has; both cost the sending node a packet each way.
    Send,
    /// `TCP_REPAIR_OFF_NO_WP`: nothing is sent.
    Skip,
}

fn repair_off(fd: RawFd, probe: Probe) -> io::Result<()> {
    let v = match probe {
        Probe::Send => sys::TCP_REPAIR_OFF,
        Probe::Skip => sys::TCP_REPAIR_OFF_NO_WP,
    };
    sys::setsockopt(fd, libc::SOL_TCP, sys::TCP_REPAIR, &v, "TCP_REPAIR")
}

pub(crate) fn repair_queue(fd: RawFd, q: libc::c_int) -> io::Result<()> {
    sys::setsockopt(
        fd,
        libc::SOL_TCP,
        sys::TCP_REPAIR_QUEUE,
        &q,
        "TCP_REPAIR_QUEUE",
    )
}

/// Fails with `UrgentData` if urgent data is announced or pending.
fn check_no_urgent(fd: RawFd) -> Result<(), DumpError> {
    if sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_OOBINLINE, "SO_OOBINLINE")? != 0 {
        return Err(DumpError::OobInline);
    }
    let mut b = [0u8; 1];
    // tcp_recv_urg(): EINVAL means "no urgent data to read" (none, or already read);
    // a byte or EAGAIN (announced, not yet arrived) means urgent data is pending.
    match sys::recv(
        fd,
        &mut b,
        libc::MSG_OOB | libc::MSG_PEEK | libc::MSG_DONTWAIT,
    ) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(DumpError::UrgentData),
        Ok(_) => Err(DumpError::UrgentData),
        Err(e) => Err(io::Error::new(e.kind(), format!("recv MSG_OOB: {e}")).into()),
    }
}

/// The repair queue selected on a socket (`TCP_REPAIR_QUEUE`), set only when it
/// changes: each selection is a system call.
struct QueueSel {
    fd: RawFd,
    cur: libc::c_int,
}

impl QueueSel {
    /// Repair on has just reset the selection to no queue.
    fn new(fd: RawFd) -> Self {
        Self {
            fd,
            cur: sys::TCP_NO_QUEUE,
        }
    }

    fn select(&mut self, q: libc::c_int) -> io::Result<()> {
        if self.cur != q {
            repair_queue(self.fd, q)?;
            self.cur = q;
        }
        Ok(())
    }

    fn seq(&mut self, q: libc::c_int) -> io::Result<u32> {
        self.select(q)?;
        Ok(sys::getsockopt::<u32>(self.fd, libc::SOL_TCP, sys::TCP_QUEUE_SEQ, "TCP_QUEUE_SEQ")?.0)
    }
}

fn queue_id(q: Queue) -> libc::c_int {
    match q {
        Queue::Send => sys::TCP_SEND_QUEUE,
        Queue::Recv => sys::TCP_RECV_QUEUE,
    }
}

/// Reads one queue completely (repair mode, MSG_PEEK), or refuses.
fn read_queue(sel: &mut QueueSel, q: Queue, len: usize) -> Result<Vec<u8>, DumpError> {
    if len > QUEUE_BYTES_MAX {
        return Err(DumpError::QueueTooLarge(q, len));
    }
    if len == 0 {
        return Ok(Vec::new());
    }
    sel.select(queue_id(q))?;
    // One spare byte: reading more than the kernel announced means the count was stale.
    // A buffer kept from this thread's last migration (resident pages), written by the
    // kernel without zeroing it first.
    let mut buf = bufs::take(len + 1);
    let spare = &mut buf.spare_capacity_mut()[..len + 1];
    // SAFETY: `spare` is writable memory of the length passed; recv writes at most
    // that many bytes.
    let got = unsafe {
        libc::recv(
            sel.fd,
            spare.as_mut_ptr().cast(),
            spare.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if got < 0 {
        let e = io::Error::last_os_error();
        bufs::give(buf);
        return Err(io::Error::new(e.kind(), format!("peek {q:?} queue (repair): {e}")).into());
    }
    let got = got as usize;
    if got != len {
        bufs::give(buf);
        return Err(DumpError::QueueIncomplete {
            queue: q,
            expected: len,
            got,
        });
    }
    // SAFETY: recv initialised the first `got` (= len) bytes.
    unsafe { buf.set_len(len) };
    Ok(buf)
}

/// The sequence numbers and queue lengths, read once per attempt between two
/// `TCP_INFO` reads ([`sys::tcp_info_marks`]) that must agree.
#[derive(Clone, Copy)]
struct Moving {
    snd_seq: u32,
    rcv_seq: u32,
    inq: usize,
    outq: usize,
}

fn read_moving(sel: &mut QueueSel) -> Result<Moving, DumpError> {
    // Send first: the receive queue stays selected for its peek, which comes first
    // (a migrated request's bytes; the send queue is often empty).
    let snd_seq = sel.seq(sys::TCP_SEND_QUEUE)?;
    let rcv_seq = sel.seq(sys::TCP_RECV_QUEUE)?;
    let fd = sel.fd;
    Ok(Moving {
        snd_seq,
        rcv_seq,
        inq: sys::ioctl_int(fd, sys::SIOCINQ, "SIOCINQ")? as usize,
        outq: sys::ioctl_int(fd, sys::SIOCOUTQ, "SIOCOUTQ")? as usize,
    })
}

/// Reads the state of a frozen socket (repair on, send window zeroed; `window` is the
/// real one, read before it was zeroed).
///
/// Consistency: the sequence numbers, lengths and queues are read between two
/// `TCP_INFO` reads; the kernel counts every segment that passed the input filter in
/// `tcpi_segs_in` under the socket's lock before processing it, so when both reads
/// agree (that counter, the bytes acknowledged and received, the never-sent bytes,
/// the state) no segment changed the socket in between, and what was read between
/// them is one state. This replaces a second read of the sequence numbers and queue
/// lengths (six system calls) with one.
fn read_state(fd: RawFd, window: RepairWindow) -> Result<TcpState, DumpError> {
    let mut marks = sys::tcp_info_marks(fd)?;
    let info = marks.head;
    if info.state != sys::TCP_ESTABLISHED {
        return Err(DumpError::NotEstablished(info.state));
    }
    if info.options & !sys::TCPI_OPT_KNOWN != 0 {
        return Err(DumpError::UnknownOptions(
            info.options & !sys::TCPI_OPT_KNOWN,
        ));
    }
    let local = sys::sock_addr(fd, false)?;
    let remote = sys::sock_addr(fd, true)?;
    let mss = sys::getsockopt_int(fd, libc::SOL_TCP, sys::TCP_MAXSEG, "TCP_MAXSEG")?;
    let timestamp =
        sys::getsockopt::<u32>(fd, libc::SOL_TCP, sys::TCP_TIMESTAMP, "TCP_TIMESTAMP")?.0;
    let (sndbuf, rcvbuf) = sys::buffer_sizes(fd)?;
    let mss = u16::try_from(mss)
        .ok()
        .filter(|m| *m > 0)
        .ok_or_else(|| DumpError::Sys(io::Error::other(format!("MSS {mss} out of range"))))?;

    // The repair queue selection is left as it is at the end: it only matters while
    // repair is on, for TCP_QUEUE_SEQ and repair-mode reads/writes, and the source
    // socket is only resumed (repair off) or closed after this.
    let mut sel = QueueSel::new(fd);
    for _ in 0..DUMP_ATTEMPTS_MAX {
        let m = read_moving(&mut sel)?;
        let unsent = marks.notsent as usize;
        if unsent > m.outq {
            return Err(DumpError::Unstable);
        }
        let recv_queue = read_queue(&mut sel, Queue::Recv, m.inq)?;
        let send_queue = match read_queue(&mut sel, Queue::Send, m.outq) {
            Ok(q) => q,
            Err(e) => {
                bufs::give(recv_queue);
                return Err(e);
            }
        };
        let after = sys::tcp_info_marks(fd)?;
        if after != marks {
            bufs::give(send_queue);
            bufs::give(recv_queue);
            if after.head.state != sys::TCP_ESTABLISHED {
                return Err(DumpError::NotEstablished(after.head.state));
            }
            marks = after;
            continue;
        }
        let state = TcpState {
            local,
            remote,
            snd_seq: m.snd_seq,
            rcv_seq: m.rcv_seq,
            options: TcpOptions {
                mss,
                wscale: (info.options & sys::TCPI_OPT_WSCALE != 0)
                    .then_some((info.snd_wscale, info.rcv_wscale)),
                sack: info.options & sys::TCPI_OPT_SACK != 0,
                timestamps: info.options & sys::TCPI_OPT_TIMESTAMPS != 0,
            },
            timestamp,
            window,
            sndbuf: sndbuf.max(0) as u32,
            rcvbuf: rcvbuf.max(0) as u32,
            send_queue,
            unsent_len: unsent as u32,
            recv_queue,
        };
        state
            .validate()
            .map_err(|e| DumpError::Sys(io::Error::other(e)))?;
        return Ok(state);
    }
    Err(DumpError::Unstable)
}

/// Freezes `sock` (input filter, then repair mode) and dumps its full state.
///
/// On success the socket stays frozen: the caller either closes it with
/// [`close_silently`] or continues it with [`resume`]. On error the socket has been
/// thawed and works as before: it is never left half-frozen.
pub fn freeze_and_dump(sock: &TcpStream) -> Result<TcpState, DumpError> {
    let fd = sock.as_raw_fd();
    // IPPROTO_TCP sockets are always SOCK_STREAM (MPTCP has its own protocol number),
    // and a Unix or UDP socket has another protocol: one call checks both.
    let proto = sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL, "SO_PROTOCOL")?;
    if proto != libc::IPPROTO_TCP {
        return Err(DumpError::NotTcp);
    }
    // Cheap refusals first, before touching the socket (read_state checks again
    // once frozen).
    let state = sys::tcp_info(fd)?.state;
    if state != sys::TCP_ESTABLISHED {
        return Err(DumpError::NotEstablished(state));
    }
    attach_drop_filter(fd)?;
    let mut saved: Option<RepairWindow> = None;
    let result = check_no_urgent(fd).and_then(|()| {
        repair_on(fd)?;
        // Repair mode does not stop the transmit path: a pacing or persist timer can
        // still send never-sent bytes after the dump (seen with BBR on a veth), and
        // the target would not know them. A zero send window stops new data; only
        // already-sent bytes may be retransmitted. The real window is dumped and
        // put back on resume.
        let w = get_window(fd)?;
        saved = Some(w);
        set_window(fd, &RepairWindow { snd_wnd: 0, ..w })?;
        read_state(fd, w)
    });
    if result.is_err() {
        if let Err(e) = thaw(fd, saved.as_ref(), Probe::Send) {
            log::warn!("migrate: thawing a refused socket failed: {e}");
        }
    }
    result
}

fn get_window(fd: RawFd) -> io::Result<RepairWindow> {
    let (w, len) = sys::getsockopt::<sys::TcpRepairWindow>(
        fd,
        libc::SOL_TCP,
        sys::TCP_REPAIR_WINDOW,
        "TCP_REPAIR_WINDOW",
    )?;
    if len != std::mem::size_of::<sys::TcpRepairWindow>() {
        return Err(io::Error::other("TCP_REPAIR_WINDOW short"));
    }
    Ok(RepairWindow {
        snd_wl1: w.snd_wl1,
        snd_wnd: w.snd_wnd,
        max_window: w.max_window,
        rcv_wnd: w.rcv_wnd,
        rcv_wup: w.rcv_wup,
    })
}

pub(crate) fn set_window(fd: RawFd, w: &RepairWindow) -> io::Result<()> {
    let raw = sys::TcpRepairWindow {
        snd_wl1: w.snd_wl1,
        snd_wnd: w.snd_wnd,
        max_window: w.max_window,
        rcv_wnd: w.rcv_wnd,
        rcv_wup: w.rcv_wup,
    };
    sys::setsockopt(
        fd,
        libc::SOL_TCP,
        sys::TCP_REPAIR_WINDOW,
        &raw,
        "TCP_REPAIR_WINDOW",
    )
}

/// Lets a frozen socket run again: `window` (the one the freeze zeroed) put back,
/// repair off with or without a window probe, input filter off.
///
/// The probe does not make the peer resend what the filter dropped (to the peer it is
/// one duplicate ACK; its own timers resend); what it buys is the peer's answer, with
/// its window and how much of our sent data it has. A socket that kept its own state
/// (a resumed source: its window was zeroed by the freeze, the peer may have moved on)
/// probes; a restored copy with nothing sent in flight has its window from the dump
/// and no sent data to learn about, and skips it (see `restore::release_probe`).
pub(crate) fn thaw(fd: RawFd, window: Option<&RepairWindow>, probe: Probe) -> io::Result<()> {
    // The send window zeroed by the freeze (while repair is still on).
    let w = window.map_or(Ok(()), |w| set_window(fd, w));
    let r = w.and(repair_off(fd, probe));
    detach_filter(fd)?;
    r?;
    // Repair off leaves `sk_reuse` at SK_NO_REUSE (repair on had forced reuse), and a
    // socket without SO_REUSEADDR (later its TIME_WAIT) keeps the server from binding
    // its port again: a web server restarted on a node that took migrated connections
    // got EADDRINUSE for a minute. A connected socket's SO_REUSEADDR only lets others
    // bind beside it, which is what the server's listener expects of its connections.
    sys::set_reuseaddr(fd)
}

/// Continues a frozen socket where it was (the paper's fall-back): repair off, input
/// filter off. Nothing was lost: dropped segments are retransmitted by the peer.
pub fn resume(sock: &TcpStream, st: &TcpState) -> io::Result<()> {
    thaw(sock.as_raw_fd(), Some(&st.window), Probe::Send)
}

/// Closes `sock` without telling the peer: in repair mode `close()` sends neither FIN
/// nor RST and leaves no TIME_WAIT, and the input filter makes sure nothing arriving
/// meanwhile is acknowledged. Its 4-tuple is free when this returns
/// ([`close_frozen`]).
pub fn close_silently(sock: TcpStream) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    // Idempotent: the socket is normally frozen already.
    let _ = attach_drop_filter(fd);
    repair_on(fd)?;
    close_frozen(sock);
    Ok(())
}

/// [`close_silently`] for a socket frozen by [`freeze_and_dump`] or
/// [`crate::restore_frozen`] and not thawed since (filter attached, repair on):
/// nothing to set again (saves two system calls), the close is silent.
///
/// The socket is disconnected (repair mode: silently) before its descriptor is
/// closed, so it has left the established hash when this returns. `close()` alone
/// only drops this descriptor: while another process holds a copy of the file (any
/// child between its `fork` and its `exec`, which closes the copy, e.g. a command the
/// daemon or another thread spawns), the socket and its 4-tuple would live on, and a
/// restore of the 4-tuple in this namespace (the target's in
/// [`crate::Handover::CloseBeforeRestore`], or the source's local one after a failed
/// hand-over) would fail with EADDRNOTAVAIL. One system call more.
pub(crate) fn close_frozen(sock: TcpStream) {
    if let Err(e) = sys::disconnect(sock.as_raw_fd()) {
        // The close below still frees the 4-tuple unless another process holds
        // the file.
        log::warn!("migrate: disconnecting a frozen socket before its close: {e}");
    }
    drop(sock);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Duration;

    /// The eBPF drop filter loads (root) and drops input like the classic one: bytes
    /// sent while it is attached arrive only after it is detached (retransmitted).
    #[test]
    #[ignore = "needs root (bpf): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
    fn the_ebpf_drop_filter_loads_and_holds_input_until_detached() {
        assert!(drop_prog().is_some(), "the eBPF program must load as root");
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        attach_drop_filter(s.as_raw_fd()).unwrap();
        c.write_all(b"held").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            sys::ioctl_int(s.as_raw_fd(), sys::SIOCINQ, "SIOCINQ").unwrap(),
            0
        );
        detach_filter(s.as_raw_fd()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"held");
    }
}
