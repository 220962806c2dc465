//! Handing a region's memory to same-host readers as a file descriptor over a Unix
//! socket (SCM_RIGHTS). With XDP the region is a BPF map, which a reader can only map
//! through the map's fd (pinning on a bpffs is not available everywhere: this machine's
//! kernel refuses BPF_OBJ_PIN). gatherd listens on the region's shm path; a reader
//! connects once, receives the fd, maps it (`MAP_SHARED`) and from then on reads and
//! changes the very words the kernel answers udp requests from, with no process on the
//! gatherer's side involved. Access control is the socket file's permissions.

use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use farside_rt::rundir::SafeDir;
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
    /// The socket's checked directory and its name there (removed on drop if ours).
    dir: SafeDir,
    name: std::ffi::OsString,
    /// A second descriptor of the listening socket: shutting it down wakes the accept
    /// loop (whether or not the socket's path still exists).
    wake: UnixListener,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FdServer {
    /// Listen at `path` (an existing file or socket there is replaced) and hand `fd` to
    /// every connecting client. `fd` must stay open as long as the server runs (the
    /// caller owns it; gatherd keeps the XDP map's fd open for its lifetime).
    pub fn spawn(path: &Path, fd: RawFd) -> io::Result<FdServer> {
        // A checked directory (made 0700, ours or root's, no other user's symlink) and a 0600
        // socket; only a stale entry of ours is replaced (`farside_rt::rundir`).
        let (dir, name) = SafeDir::create_parent(path)?;
        let listener = dir.bind_unix(name)?;
        let name = name.to_os_string();
        let wake = listener.try_clone()?;
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
            dir,
            name,
            wake,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for FdServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag: accept on a listening socket that
        // is shut down fails at once (connecting to the path would hang if the path
        // was removed meanwhile).
        // SAFETY: `wake` is a live descriptor of the listening socket, owned by self.
        unsafe { libc::shutdown(self.wake.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = self.dir.remove_own(&self.name);
    }
}

fn send_fd(sock: &UnixStream, fd: RawFd) -> io::Result<()> {
    farside_rt::fdpass::send_fd(sock.as_raw_fd(), None, TOKEN, fd)
}

/// Connect to an [`FdServer`] at `path` and receive its fd (the caller owns and closes it).
/// The socket must be root's or ours in a checked directory, and so must the process
/// that answers (its `SO_PEERCRED`): a local user cannot hand a reader memory of theirs.
pub fn receive_fd(path: &Path) -> io::Result<RawFd> {
    let (dir, name) = SafeDir::open_parent(path)?;
    let sock = UnixStream::connect(dir.check_socket(name)?)?;
    let peer = peer_uid(&sock)?;
    if peer != 0 && peer != farside_rt::rundir::euid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: served by uid {peer} (not root, not us); refusing its region",
                path.display()
            ),
        ));
    }
    sock.set_read_timeout(Some(SEND_TIMEOUT))?;
    let mut got = farside_rt::fdpass::recv_fds(sock.as_raw_fd(), 1, 0)?;
    if got.bytes == 1 && got.tag == TOKEN && got.fds.len() == 1 && !got.truncated {
        return Ok(got.fds.pop().expect("one fd").into_raw_fd());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: the socket did not hand over a region", path.display()),
    ))
}

/// The user id of the process at the other end of a connected Unix socket.
fn peer_uid(sock: &UnixStream) -> io::Result<u32> {
    // SAFETY: zeroed ucred is a valid out-buffer of the size passed.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a connected socket we hold; cred and len as above.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
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

    #[test]
    fn the_server_stops_even_when_its_socket_path_was_removed() {
        let dir = std::env::temp_dir().join(format!("farside-fdgone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = std::fs::File::open("/dev/null").unwrap();
        let sock = dir.join("region.sock");
        let srv = FdServer::spawn(&sock, f.as_raw_fd()).unwrap();
        std::fs::remove_file(&sock).unwrap();
        // Dropping joins the accept thread: it returns only if the thread woke.
        drop(srv);
        let _ = std::fs::remove_dir_all(dir);
    }
}
