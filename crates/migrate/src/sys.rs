//! Thin, checked wrappers over the Linux socket calls TCP_REPAIR needs. Constants
//! are from the uapi headers (`linux/tcp.h`, `linux/sockios.h`); the `libc` crate does
//! not export all of them.

use std::io;
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::RawFd;

use farside_rt::sockaddr::{from_storage, to_storage};

pub const TCP_MAXSEG: libc::c_int = 2;
pub const TCP_INFO: libc::c_int = 11;
pub const TCP_REPAIR: libc::c_int = 19;
pub const TCP_REPAIR_QUEUE: libc::c_int = 20;
pub const TCP_QUEUE_SEQ: libc::c_int = 21;
pub const TCP_REPAIR_OPTIONS: libc::c_int = 22;
pub const TCP_TIMESTAMP: libc::c_int = 24;
pub const TCP_REPAIR_WINDOW: libc::c_int = 29;

pub const TCP_REPAIR_ON: libc::c_int = 1;
/// Repair off, and send a window probe so the peer learns our window at once.
pub const TCP_REPAIR_OFF: libc::c_int = 0;
/// Repair off without the window probe (Linux 4.8+, with `TCP_REPAIR_WINDOW`).
pub const TCP_REPAIR_OFF_NO_WP: libc::c_int = -1;

pub const TCP_NO_QUEUE: libc::c_int = 0;
pub const TCP_RECV_QUEUE: libc::c_int = 1;
pub const TCP_SEND_QUEUE: libc::c_int = 2;

pub const TCPOPT_MSS: u32 = 2;
pub const TCPOPT_WINDOW: u32 = 3;
pub const TCPOPT_SACK_PERM: u32 = 4;
pub const TCPOPT_TIMESTAMP: u32 = 8;

pub const TCPI_OPT_TIMESTAMPS: u8 = 1;
pub const TCPI_OPT_SACK: u8 = 2;
pub const TCPI_OPT_WSCALE: u8 = 4;
/// The `tcpi_options` bits this crate knows how to restore; any other bit (ECN,
/// ECN seen, SYN data, µs timestamps, TFO child, …) makes the dump refuse.
pub const TCPI_OPT_KNOWN: u8 = TCPI_OPT_TIMESTAMPS | TCPI_OPT_SACK | TCPI_OPT_WSCALE;

pub const TCP_ESTABLISHED: u8 = 1;

/// `SIOCINQ` (= FIONREAD): bytes in the receive queue.
pub const SIOCINQ: libc::c_ulong = 0x541B;
/// `SIOCOUTQ` (= TIOCOUTQ): bytes in the send queue, unacknowledged plus unsent.
pub const SIOCOUTQ: libc::c_ulong = 0x5411;

pub const IPV6_FREEBIND: libc::c_int = 78;

/// `SO_ATTACH_BPF` (asm-generic/socket.h): attach a loaded eBPF socket filter by fd.
pub const SO_ATTACH_BPF: libc::c_int = 50;

/// `union bpf_attr` as `BPF_PROG_LOAD` reads it (linux/bpf.h), zero beyond the fields
/// set; 128 bytes cover every field up to the ones this call leaves zero.
#[repr(C)]
struct BpfProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    rest: [u8; 88],
}

/// `struct bpf_insn`.
#[repr(C)]
struct BpfInsn {
    code: u8,
    /// dst_reg:4 | src_reg:4 (little-endian bitfield order).
    regs: u8,
    off: i16,
    imm: i32,
}

/// Loads the eBPF socket filter `r0 = 0; exit` (every packet: keep 0 bytes, i.e.
/// drop). Attaching it by fd ([`SO_ATTACH_BPF`]) only takes a reference, where
/// `SO_ATTACH_FILTER` converts and JIT-compiles a classic program on every attach.
pub fn load_drop_socket_filter() -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
    let insns = [
        // BPF_ALU64 | BPF_MOV | BPF_K, dst r0, imm 0
        BpfInsn {
            code: 0xb7,
            regs: 0,
            off: 0,
            imm: 0,
        },
        // BPF_JMP | BPF_EXIT
        BpfInsn {
            code: 0x95,
            regs: 0,
            off: 0,
            imm: 0,
        },
    ];
    let license = b"GPL\0";
    let attr = BpfProgLoadAttr {
        prog_type: BPF_PROG_TYPE_SOCKET_FILTER,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        rest: [0; 88],
    };
    // SAFETY: `attr` is a live, zero-padded bpf_attr of the size passed; the
    // pointers in it stay valid for the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &attr as *const BpfProgLoadAttr,
            size_of::<BpfProgLoadAttr>(),
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("bpf(BPF_PROG_LOAD): {e}")));
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `struct tcp_repair_window`.
#[repr(C)]
#[derive(Default)]
pub struct TcpRepairWindow {
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_window: u32,
    pub rcv_wnd: u32,
    pub rcv_wup: u32,
}

fn check(ret: libc::c_int, op: &'static str) -> io::Result<libc::c_int> {
    if ret < 0 {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{op}: {e}")))
    } else {
        Ok(ret)
    }
}

/// `setsockopt` with a plain-old-data value.
pub fn setsockopt<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    val: &T,
    op: &'static str,
) -> io::Result<()> {
    // SAFETY: `val` points to a live T of the length passed.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (val as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    check(ret, op).map(drop)
}

/// `setsockopt` with a byte buffer (for arrays such as `TCP_REPAIR_OPTIONS`).
pub fn setsockopt_bytes(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    val: &[u8],
    op: &'static str,
) -> io::Result<()> {
    // SAFETY: `val` is a live buffer of the length passed.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            val.as_ptr().cast(),
            val.len() as libc::socklen_t,
        )
    };
    check(ret, op).map(drop)
}

/// `getsockopt` into a plain-old-data value; returns the length the kernel wrote.
pub fn getsockopt<T: Default>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    op: &'static str,
) -> io::Result<(T, usize)> {
    let mut val = T::default();
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `val` is a live T and `len` its size; the kernel writes at most `len`.
    let ret = unsafe { libc::getsockopt(fd, level, name, (&mut val as *mut T).cast(), &mut len) };
    check(ret, op)?;
    Ok((val, len as usize))
}

/// `getsockopt` of an int.
pub fn getsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    op: &'static str,
) -> io::Result<libc::c_int> {
    getsockopt::<libc::c_int>(fd, level, name, op).map(|(v, _)| v)
}

/// `ioctl` returning an int (SIOCINQ / SIOCOUTQ).
pub fn ioctl_int(fd: RawFd, req: libc::c_ulong, op: &'static str) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    // SAFETY: these requests write one int through the pointer.
    let ret = unsafe { libc::ioctl(fd, req as _, &mut v as *mut libc::c_int) };
    check(ret, op)?;
    Ok(v)
}

/// `recv` with flags into `buf`; returns the byte count. Errors are the raw OS error
/// (callers match on errno).
pub fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is a live, writable buffer of the length passed.
    let ret = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret as usize)
}

/// `send` without SIGPIPE; returns the byte count.
pub fn send(fd: RawFd, buf: &[u8], op: &'static str) -> io::Result<usize> {
    // SAFETY: `buf` is a live buffer of the length passed.
    let ret = unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if ret < 0 {
        check(-1, op)?;
    }
    Ok(ret as usize)
}

/// `getsockname` / `getpeername`.
pub fn sock_addr(fd: RawFd, peer: bool) -> io::Result<SocketAddr> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = (&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: `ss` is a live sockaddr_storage and `len` its size.
    let ret = unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    check(ret, if peer { "getpeername" } else { "getsockname" })?;
    from_storage(&ss).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("address family {} is not IPv4 or IPv6", ss.ss_family),
        )
    })
}

/// `bind`.
pub fn bind(fd: RawFd, addr: &SocketAddr) -> io::Result<()> {
    let (ss, len) = to_storage(addr);
    // SAFETY: `ss` holds a valid address of length `len`.
    let ret = unsafe { libc::bind(fd, (&ss as *const libc::sockaddr_storage).cast(), len) };
    check(ret, "bind").map(drop)
}

/// `SO_REUSEADDR` on.
pub fn set_reuseaddr(fd: RawFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    setsockopt(
        fd,
        libc::SOL_SOCKET,
        libc::SO_REUSEADDR,
        &one,
        "SO_REUSEADDR",
    )
}

/// `connect` (in repair mode it returns at once, without a handshake).
pub fn connect(fd: RawFd, addr: &SocketAddr) -> io::Result<()> {
    let (ss, len) = to_storage(addr);
    // SAFETY: `ss` holds a valid address of length `len`.
    let ret = unsafe { libc::connect(fd, (&ss as *const libc::sockaddr_storage).cast(), len) };
    check(ret, "connect (repair)").map(drop)
}

/// `connect` to an `AF_UNSPEC` address: the protocol's disconnect (`tcp_disconnect`)
/// on the socket itself, whoever else holds its file. The socket goes to CLOSE and
/// leaves the established hash before the call returns (and the bind hash, unless
/// `bind` put it there); in repair mode it sends nothing (no RST, no FIN).
pub fn disconnect(fd: RawFd) -> io::Result<()> {
    // SAFETY: all-zero is a valid sockaddr; its family is AF_UNSPEC (0).
    let sa: libc::sockaddr = unsafe { std::mem::zeroed() };
    let len = size_of::<libc::sockaddr>() as libc::socklen_t;
    // SAFETY: `sa` is a live sockaddr of length `len`.
    let ret = unsafe { libc::connect(fd, &sa, len) };
    check(ret, "connect (AF_UNSPEC)").map(drop)
}

/// The first bytes of `struct tcp_info` this crate reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpInfoHead {
    pub state: u8,
    pub options: u8,
    pub snd_wscale: u8,
    pub rcv_wscale: u8,
}

/// `TCP_INFO`, parsed for state, options and window scales.
pub fn tcp_info(fd: RawFd) -> io::Result<TcpInfoHead> {
    // The kernel copies min(len, sizeof tcp_info); 8 bytes cover the fields used:
    // u8 state, ca_state, retransmits, probes, backoff, options,
    // snd_wscale:4 | rcv_wscale:4 (little-endian bitfield order), …
    let (buf, len) = getsockopt::<[u8; 8]>(fd, libc::SOL_TCP, TCP_INFO, "getsockopt TCP_INFO")?;
    if len < 7 {
        return Err(io::Error::other("TCP_INFO too short"));
    }
    Ok(TcpInfoHead {
        state: buf[0],
        options: buf[5],
        snd_wscale: buf[6] & 0x0f,
        rcv_wscale: buf[6] >> 4,
    })
}

/// `SO_MEMINFO` (asm-generic/socket.h, Linux ≥ 4.12): the socket's memory counters,
/// `u32[SK_MEMINFO_VARS]`.
const SO_MEMINFO: libc::c_int = 55;
/// `SK_MEMINFO_RCVBUF` (linux/sock_diag.h): `sk_rcvbuf`, as `SO_RCVBUF` reports it.
const SK_MEMINFO_RCVBUF: usize = 1;
/// `SK_MEMINFO_SNDBUF`: `sk_sndbuf`, as `SO_SNDBUF` reports it.
const SK_MEMINFO_SNDBUF: usize = 3;

/// `(SO_SNDBUF, SO_RCVBUF)` in one system call (`SO_MEMINFO`, which reads the same
/// two fields) instead of two.
pub fn buffer_sizes(fd: RawFd) -> io::Result<(libc::c_int, libc::c_int)> {
    let (mem, len) = getsockopt::<[u32; 9]>(fd, libc::SOL_SOCKET, SO_MEMINFO, "SO_MEMINFO")?;
    if len <= SK_MEMINFO_SNDBUF * 4 {
        return Err(io::Error::other(format!("SO_MEMINFO of {len} bytes")));
    }
    let int = |v: u32| libc::c_int::try_from(v).unwrap_or(libc::c_int::MAX);
    Ok((int(mem[SK_MEMINFO_SNDBUF]), int(mem[SK_MEMINFO_RCVBUF])))
}

/// What `TCP_INFO` says about a frozen socket's input and output since the last read:
/// [`tcp_info_marks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpInfoMarks {
    /// State, options and window scales (as [`tcp_info`]).
    pub head: TcpInfoHead,
    /// `tcpi_bytes_acked`: moves with every ACK that frees send-queue bytes.
    pub bytes_acked: u64,
    /// `tcpi_bytes_received`: moves with every in-order byte received.
    pub bytes_received: u64,
    /// `tcpi_segs_in`: counted for every segment that passed the socket filter, under
    /// the socket's lock, whether processed at once or put on the backlog.
    pub segs_in: u32,
    /// `tcpi_notsent_bytes` (`write_seq - snd_nxt`, as `SIOCOUTQNSD`).
    pub notsent: u32,
}

/// Bytes of `struct tcp_info` read by [`tcp_info_marks`]: up to and including
/// `tcpi_notsent_bytes` (offset 144, Linux ≥ 4.6).
const TCP_INFO_MARKS_BYTES: usize = 148;

/// `TCP_INFO` with the counters that change whenever a segment reaches the socket.
/// The kernel fills it under the socket's lock (`lock_sock_fast`), so every field is
/// from one instant, and any segment counted before it was fully processed (the
/// backlog is drained when the socket's owner releases it).
pub fn tcp_info_marks(fd: RawFd) -> io::Result<TcpInfoMarks> {
    let mut buf = [0u8; TCP_INFO_MARKS_BYTES];
    let mut len = TCP_INFO_MARKS_BYTES as libc::socklen_t;
    // SAFETY: `buf` is a live buffer of `len` bytes; the kernel writes at most `len`.
    let ret = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_TCP,
            TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    check(ret, "getsockopt TCP_INFO")?;
    let len = len as usize;
    if len < TCP_INFO_MARKS_BYTES {
        return Err(io::Error::other(format!(
            "TCP_INFO of {len} bytes: this kernel is older than Linux 4.6"
        )));
    }
    let u32_at = |o: usize| u32::from_ne_bytes(buf[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_ne_bytes(buf[o..o + 8].try_into().expect("8 bytes"));
    Ok(TcpInfoMarks {
        head: TcpInfoHead {
            state: buf[0],
            options: buf[5],
            snd_wscale: buf[6] & 0x0f,
            rcv_wscale: buf[6] >> 4,
        },
        bytes_acked: u64_at(120),
        bytes_received: u64_at(128),
        segs_in: u32_at(140),
        notsent: u32_at(144),
    })
}

#[cfg(not(target_endian = "little"))]
compile_error!("tcp_info bitfield parsing assumes a little-endian target");

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    fn await_inq(fd: RawFd, n: i32) {
        let t0 = Instant::now();
        while ioctl_int(fd, SIOCINQ, "SIOCINQ").unwrap() < n {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "bytes never arrived"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The dump's stability check rests on these marks: they stay put while nothing
    /// arrives and move when a segment does (no root needed: TCP_INFO is open to any
    /// socket's owner).
    #[test]
    fn tcp_info_marks_move_with_every_segment_and_only_then() {
        let (mut c, s) = pair();
        let fd = s.as_raw_fd();
        let m0 = tcp_info_marks(fd).unwrap();
        assert_eq!(m0.head.state, TCP_ESTABLISHED);
        assert_eq!(m0.notsent, 0);
        assert_eq!(tcp_info_marks(fd).unwrap(), m0, "nothing arrived: equal");
        c.write_all(&[7u8; 100]).unwrap();
        await_inq(fd, 100);
        let m1 = tcp_info_marks(fd).unwrap();
        assert!(m1.segs_in > m0.segs_in, "{m0:?} -> {m1:?}");
        assert_eq!(m1.bytes_received, m0.bytes_received + 100);
        assert_ne!(m1, m0);
        // The head agrees with the short read.
        let h = tcp_info(fd).unwrap();
        assert_eq!(
            (h.state, h.options, h.snd_wscale, h.rcv_wscale),
            (
                m1.head.state,
                m1.head.options,
                m1.head.snd_wscale,
                m1.head.rcv_wscale
            )
        );
    }

    /// One SO_MEMINFO reads what SO_SNDBUF and SO_RCVBUF report.
    #[test]
    fn buffer_sizes_are_what_so_sndbuf_and_so_rcvbuf_report() {
        let (_c, s) = pair();
        let fd = s.as_raw_fd();
        setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            &(48_000 as libc::c_int),
            "SO_SNDBUF",
        )
        .unwrap();
        let snd = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, "SO_SNDBUF").unwrap();
        let rcv = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, "SO_RCVBUF").unwrap();
        assert_eq!(buffer_sizes(fd).unwrap(), (snd, rcv));
        assert_eq!(snd, 96_000, "the kernel doubles the value set");
    }
}
