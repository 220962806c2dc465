//! Process file descriptors: a descriptor of another process ([`open`]) and a copy of
//! one of its descriptors ([`get_fd`], [`take_fd`]). `pidfd_getfd` needs ptrace rights
//! over the owner (root, or the same user with `ptrace_scope` 0).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// A pidfd of process `pid` (`pidfd_open`), closed when dropped.
pub fn open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor pidfd_open just returned, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) })
}

/// A copy of descriptor `fd` of the process `pidfd` refers to (`pidfd_getfd`); the
/// caller owns the copy, which refers to the same open file.
pub fn get_fd(pidfd: BorrowedFd<'_>, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd on a live pidfd; returns a new descriptor or -1.
    let f = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if f < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by the caller.
    Ok(unsafe { OwnedFd::from_raw_fd(f as RawFd) })
}

/// A copy of descriptor `fd` of process `pid`: [`open`] then [`get_fd`].
pub fn take_fd(pid: u32, fd: RawFd) -> io::Result<OwnedFd> {
    let pidfd = open(pid)?;
    get_fd(pidfd.as_fd(), fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process may take its own descriptors (no ptrace rights needed over itself):
    /// the copy is another descriptor of the same socket.
    #[test]
    fn a_copy_of_an_own_descriptor_is_the_same_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let copy = take_fd(std::process::id(), l.as_raw_fd()).unwrap();
        assert_ne!(copy.as_raw_fd(), l.as_raw_fd());
        let copy = std::net::TcpListener::from(copy);
        assert_eq!(copy.local_addr().unwrap(), l.local_addr().unwrap());
        let e = take_fd(std::process::id(), -1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }
}
