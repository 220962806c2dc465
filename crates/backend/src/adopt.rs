//! Adopting connected sockets from a local agent (`--adopt-socket PATH`).
//!
//! The speculative-admission daemon (`farside specd`) restores migrated connections
//! and hands them to this server, which serves them exactly like accepted ones. The
//! channel is a Unix **datagram** socket bound at PATH (mode 0600): each datagram
//! carries one byte ([`ADOPT_TAG`]) and one connected TCP socket as `SCM_RIGHTS`
//! (sent and received with [`farside_rt::fdpass`]).
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
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

use farside_rt::fdpass;

/// Payload byte of an adoption datagram (a datagram needs at least one byte for its
/// ancillary data to be delivered).
pub const ADOPT_TAG: u8 = fdpass::TAG_ADOPT;

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
    fdpass::send_to(via, path, ADOPT_TAG, conn, timeout)
}

/// Takes one adopted connection if one is waiting (`Ok(None)` if none, or another
/// worker took it first). A datagram without exactly one descriptor is dropped (its
/// descriptors closed) and reported as an error.
pub(crate) fn recv(sock: &UnixDatagram) -> io::Result<Option<TcpStream>> {
    // Room for a few descriptors, so a sender passing several is detected and all of
    // them are closed rather than truncated away (MSG_CTRUNC) and leaked.
    const FDS_ROOM: usize = 4;
    let got = match fdpass::recv_fds(sock.as_raw_fd(), FDS_ROOM, libc::MSG_DONTWAIT) {
        Ok(got) => got,
        Err(e) => {
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            }
        }
    };
    let fdpass::Received {
        bytes: n,
        tag,
        mut fds,
        truncated,
    } = got;
    if n != 1 || tag != ADOPT_TAG || fds.len() != 1 || truncated {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "adoption datagram of {n} bytes with {} descriptors: dropped",
                fds.len()
            ),
        ));
    }
    let fd: OwnedFd = fds.pop().expect("checked above");
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
