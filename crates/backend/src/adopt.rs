//! Adopting connected sockets from a local agent (`--adopt-socket PATH`).
//!
//! The speculative-admission daemon (`farside specd`) restores migrated connections
//! and hands them to this server, which serves them exactly like accepted ones. The
//! channel is a Unix **datagram** socket bound at PATH (mode 0600): each datagram
//! carries one byte ([`ADOPT_TAG`]) and one connected TCP socket as `SCM_RIGHTS`.
//! Datagrams keep one connection per message without framing; the kernel bounds the
//! queue (`net.unix.max_dgram_qlen`, 10 by default). A blocking sender waits (up to its
//! send timeout) when the server falls behind; specd sends non-blocking and keeps the
//! connections the queue cannot take in its own bounded queue until the server makes
//! room (`farside_specd::handoff`), so a slow server never costs a connection.
//!
//! Workers wait on both the listener and this socket with `poll` and take one item
//! with a non-blocking `accept` or `recvmsg`; a worker that loses the race to another
//! simply polls again.

use std::io;
use std::mem::size_of;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

/// Payload byte of an adoption datagram (a datagram needs at least one byte for its
/// ancillary data to be delivered).
pub const ADOPT_TAG: u8 = b'A';

/// Binds the adoption socket at `path` (an existing socket file is replaced), mode
/// 0600, non-blocking (workers poll it).
pub fn bind(path: &Path) -> io::Result<UnixDatagram> {
    let _ = std::fs::remove_file(path);
    let sock = UnixDatagram::bind(path)
        .map_err(|e| io::Error::new(e.kind(), format!("--adopt-socket {}: {e}", path.display())))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    sock.set_nonblocking(true)?;
    Ok(sock)
}

/// Hands the connected socket `conn` to the server whose `--adopt-socket` is `path`,
/// through `via` (a datagram socket of the caller). On a blocking `via`, blocks while
/// the server's adoption queue is full, up to `timeout`; on a non-blocking one, a full
/// queue is `WouldBlock` at once. The caller keeps its own descriptor and
/// should close it at once: the server owns the connection from here.
pub fn send(via: &UnixDatagram, path: &Path, conn: RawFd, timeout: Duration) -> io::Result<()> {
    via.set_write_timeout(Some(timeout))?;
    let addr = unix_addr(path)?;
    let mut byte = [ADOPT_TAG];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: all-zero is a valid msghdr; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&addr.0 as *const libc::sockaddr_un).cast_mut().cast();
    msg.msg_namelen = addr.1;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` bytes, enough for one fd's cmsg.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), conn);
    }
    loop {
        // SAFETY: msg describes valid buffers (above).
        let n = unsafe { libc::sendmsg(via.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Takes one adopted connection if one is waiting (`Ok(None)` if none, or another
/// worker took it first). A datagram without exactly one descriptor is dropped (its
/// descriptors closed) and reported as an error.
pub(crate) fn recv(sock: &UnixDatagram) -> io::Result<Option<TcpStream>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for a few descriptors, so a sender passing several is detected and all of
    // them are closed rather than truncated away (MSG_CTRUNC) and leaked.
    const FDS_ROOM: usize = 4;
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE((FDS_ROOM * size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: all-zero is a valid msghdr; pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg describes valid buffers.
    let n = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: walking the control buffer the kernel filled, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let len = (*c).cmsg_len as usize - (data as usize - c as usize);
                for i in 0..len / size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n != 1 || byte[0] != ADOPT_TAG || fds.len() != 1 || msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "adoption datagram of {n} bytes with {} descriptors: dropped",
                fds.len()
            ),
        ));
    }
    let fd = fds.pop().expect("checked above");
    if !is_tcp_stream(fd.as_raw_fd()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "adopted descriptor is not a TCP stream socket: closed",
        ));
    }
    let stream = TcpStream::from(fd);
    // A sender may pass a non-blocking socket; the workers use blocking I/O.
    stream.set_nonblocking(false)?;
    Ok(Some(stream))
}

fn is_tcp_stream(fd: RawFd) -> bool {
    let get = |opt: libc::c_int| -> Option<libc::c_int> {
        let mut v: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes one int of the length passed.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (r == 0).then_some(v)
    };
    get(libc::SO_TYPE) == Some(libc::SOCK_STREAM)
        && get(libc::SO_PROTOCOL) == Some(libc::IPPROTO_TCP)
}

fn unix_addr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= sa.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path too long: {}", path.display()),
        ));
    }
    for (d, s) in sa.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    Ok((sa, len))
}

/// Waits until the listener or the adoption socket is readable (or `timeout`).
/// Returns (listener readable or hung up, adoption socket readable).
pub(crate) fn wait(listener: RawFd, adopt: RawFd, timeout: Duration) -> io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd {
            fd: listener,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: adopt,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: two valid pollfd entries.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok((false, false));
        }
        return Err(e);
    }
    Ok((fds[0].revents != 0, fds[1].revents != 0))
}
