//! Handing a region's memory to same-host readers as a file descriptor over a Unix
//! socket (SCM_RIGHTS). With XDP the region is a BPF map, which a reader can only map
//! through the map's fd (pinning on a bpffs is not available everywhere: this machine's
//! kernel refuses BPF_OBJ_PIN). gatherd listens on the region's shm path; a reader
//! connects once, receives the fd, maps it (`MAP_SHARED`) and from then on reads and
//! changes the very words the kernel answers udp requests from, with no process on the
//! gatherer's side involved. Access control is the socket file's permissions.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One byte of payload: SCM_RIGHTS needs some data to ride on. `b'R'` = region.
const TOKEN: u8 = b'R';
/// A reader that connects but does not read its fd within this is dropped, so a stuck
/// reader cannot hold the accept loop.
const SEND_TIMEOUT: Duration = Duration::from_millis(200);

/// Serves one fd to every process that connects to a Unix socket at `path`. The socket
/// file is removed on drop.
pub struct FdServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FdServer {
    /// Listen at `path` (an existing file or socket there is replaced) and hand `fd` to
    /// every connecting client. `fd` must stay open as long as the server runs (the
    /// caller owns it; gatherd keeps the XDP map's fd open for its lifetime).
    pub fn spawn(path: &Path, fd: RawFd) -> io::Result<FdServer> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("region-fd".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if st.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Ok(c) = conn {
                        let _ = c.set_write_timeout(Some(SEND_TIMEOUT));
                        if let Err(e) = send_fd(&c, fd) {
                            log::debug!("region fd: sending to a reader failed: {e}");
                        }
                    }
                }
            })?;
        Ok(FdServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for FdServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A zeroed control-message buffer with room for one fd.
fn fd_cmsg_buf() -> Vec<u8> {
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    vec![0u8; space]
}

/// A header for a message of the one buffer `iov` with the control buffer `cbuf`. It
/// points into both, so they must outlive every sendmsg/recvmsg call that uses it.
fn single_iov_msghdr(iov: &mut libc::iovec, cbuf: &mut [u8]) -> libc::msghdr {
    // SAFETY: msghdr is plain data; all zeros is a valid (empty) header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = cbuf.len() as _;
    msg
}

fn send_fd(sock: &UnixStream, fd: RawFd) -> io::Result<()> {
    let mut data = [TOKEN];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut cbuf = fd_cmsg_buf();
    let msg = single_iov_msghdr(&mut iov, &mut cbuf);
    // SAFETY: msg_control points to `cbuf`, room for one cmsg with one fd.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
    }
    // SAFETY: a valid socket and message.
    if unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) } != 1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Connect to an [`FdServer`] at `path` and receive its fd (the caller owns and closes it).
pub fn receive_fd(path: &Path) -> io::Result<RawFd> {
    let sock = UnixStream::connect(path)?;
    sock.set_read_timeout(Some(SEND_TIMEOUT))?;
    let mut data = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut cbuf = fd_cmsg_buf();
    let mut msg = single_iov_msghdr(&mut iov, &mut cbuf);
    // SAFETY: a valid socket and message buffers.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel filled msg; CMSG_FIRSTHDR checks msg_controllen.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if n == 1
            && data[0] == TOKEN
            && !c.is_null()
            && (*c).cmsg_level == libc::SOL_SOCKET
            && (*c).cmsg_type == libc::SCM_RIGHTS
        {
            return Ok(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>()));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: the socket did not hand over a region", path.display()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use farside_region::{MappedWords, Words};
    use std::sync::atomic::Ordering;

    #[test]
    fn a_reader_maps_the_same_memory_through_the_handed_over_fd() {
        let dir = std::env::temp_dir().join(format!("farside-fdshare-{}", std::process::id()));
        let file = dir.join("backing");
        let owner = MappedWords::create_file(&file, 16).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .unwrap();
        let sock = dir.join("region.sock");
        let srv = FdServer::spawn(&sock, f.as_raw_fd()).unwrap();
        let fd = receive_fd(&sock).unwrap();
        let reader = MappedWords::map_fd(fd, 16).unwrap();
        // SAFETY: our fd from receive_fd.
        unsafe { libc::close(fd) };
        owner.words()[3].store(77, Ordering::Release);
        assert_eq!(reader.words()[3].load(Ordering::Acquire), 77);
        drop(srv);
        assert!(!sock.exists(), "socket removed on drop");
        let _ = std::fs::remove_dir_all(dir);
    }
}
