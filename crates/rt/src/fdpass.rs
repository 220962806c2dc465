//! Passing descriptors between local processes over Unix sockets (`SCM_RIGHTS`).
//!
//! Each message carries one payload byte, its **tag** (a control message needs some
//! data to ride on, and the tag tells a stray message from the expected one), and the
//! descriptors as ancillary data. The tags of farside's channels:
//!
//! - [`TAG_ADOPT`]: a connected TCP socket handed to the test web server to serve
//!   (`farside backend --adopt-socket`, fed by specd's hand-off), one per datagram.
//! - `b'R'`: a region's memory handed to same-host readers (`farside_rmem::fdshare`).
//!
//! The receiver takes every descriptor a message carries (up to the room it gives),
//! so a sender passing more than expected is detected and all of them are closed
//! rather than leaked.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

/// Tag of an adoption datagram: one connected TCP socket for the web server to serve.
pub const TAG_ADOPT: u8 = b'A';

/// Sends `fd` with `tag` on `sock`: to the socket bound at `to`, or (None) to the
/// peer `sock` is connected to. Retries when interrupted; a full queue of a
/// non-blocking socket is `WouldBlock`. The caller keeps its own descriptor.
pub fn send_fd(sock: RawFd, to: Option<&Path>, tag: u8, fd: RawFd) -> io::Result<()> {
    let addr = to.map(unix_addr).transpose()?;
    let mut byte = [tag];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: all-zero is a valid msghdr; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    if let Some((sa, len)) = &addr {
        msg.msg_name = (sa as *const libc::sockaddr_un).cast_mut().cast();
        msg.msg_namelen = *len;
    }
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
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
    }
    loop {
        // SAFETY: msg describes valid buffers (above).
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// [`send_fd`] to the datagram socket bound at `path`, through `via` (a datagram
/// socket of the caller). On a blocking `via`, blocks while the receiver's queue is
/// full, up to `timeout`; on a non-blocking one, a full queue is `WouldBlock` at once.
pub fn send_to(
    via: &UnixDatagram,
    path: &Path,
    tag: u8,
    fd: RawFd,
    timeout: Duration,
) -> io::Result<()> {
    via.set_write_timeout(Some(timeout))?;
    send_fd(via.as_raw_fd(), Some(path), tag, fd)
}

/// One received message: its payload, the descriptors it carried (owned: closed when
/// dropped), and whether the kernel had to drop some ancillary data for lack of room.
#[derive(Debug)]
pub struct Received {
    /// Payload bytes received (1 for a well-formed message).
    pub bytes: usize,
    /// The first payload byte (0 if none).
    pub tag: u8,
    /// Every descriptor the message carried, up to the room asked for.
    pub fds: Vec<OwnedFd>,
    /// The control data was cut (`MSG_CTRUNC`): the message carried more descriptors
    /// than there was room for (those beyond were closed by the kernel).
    pub truncated: bool,
}

/// Receives one message from `sock` with room for `fds_max` descriptors; `flags` are
/// `recvmsg`'s (e.g. `MSG_DONTWAIT`), `MSG_CMSG_CLOEXEC` is always added. Errors as
/// `recvmsg` reports them (`WouldBlock`, `Interrupted` included).
pub fn recv_fds(sock: RawFd, fds_max: usize, flags: libc::c_int) -> io::Result<Received> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE((fds_max.max(1) * size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: all-zero is a valid msghdr; pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg describes valid buffers.
    let n = unsafe { libc::recvmsg(sock, &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
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
    Ok(Received {
        bytes: n as usize,
        tag: if n > 0 { byte[0] } else { 0 },
        fds,
        truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
    })
}

/// The `sockaddr_un` of `path` and its length.
pub fn unix_addr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("farside-fdpass-{name}-{}", std::process::id()))
    }

    /// A descriptor sent to a bound datagram socket arrives as another descriptor of
    /// the same open file, with its tag; nothing waiting is `WouldBlock`.
    #[test]
    fn a_descriptor_sent_to_a_path_arrives_with_its_tag() {
        let path = tmp("dgram");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap();
        let via = UnixDatagram::unbound().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        send_to(
            &via,
            &path,
            TAG_ADOPT,
            l.as_raw_fd(),
            Duration::from_secs(1),
        )
        .unwrap();
        let mut r = recv_fds(rx.as_raw_fd(), 4, libc::MSG_DONTWAIT).unwrap();
        assert_eq!(
            (r.bytes, r.tag, r.fds.len(), r.truncated),
            (1, TAG_ADOPT, 1, false)
        );
        let got = std::net::TcpListener::from(r.fds.pop().unwrap());
        assert_eq!(got.local_addr().unwrap(), l.local_addr().unwrap());
        let e = recv_fds(rx.as_raw_fd(), 4, libc::MSG_DONTWAIT).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let _ = std::fs::remove_file(&path);
    }

    /// On a connected stream socket no address is needed; a path too long for a
    /// `sockaddr_un` is refused before anything is sent.
    #[test]
    fn a_connected_pair_passes_a_descriptor_without_an_address() {
        let (a, b) = UnixStream::pair().unwrap();
        send_fd(a.as_raw_fd(), None, b'R', b.as_raw_fd()).unwrap();
        let r = recv_fds(b.as_raw_fd(), 1, 0).unwrap();
        assert_eq!((r.bytes, r.tag, r.fds.len()), (1, b'R', 1));
        assert!(!r.truncated);
        let long = std::path::PathBuf::from("/".repeat(200));
        assert_eq!(
            send_fd(a.as_raw_fd(), Some(&long), 0, 0)
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
