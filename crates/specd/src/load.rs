//! The local web server's accept-queue length, read with netlink `sock_diag` (the
//! listener found once by a LISTEN dump on its port, then looked up exactly: a few
//! µs per read, no /proc parsing).

use std::io;

use farside_rt::sockdiag::SockDiag;

/// Reads the accept-queue length of the listener(s) on one local port.
pub struct ServerQueue {
    diag: SockDiag,
}

impl ServerQueue {
    /// Watches the listeners on `port` (both address families) in this network
    /// namespace.
    pub fn new(port: u16) -> io::Result<Self> {
        Ok(Self {
            diag: SockDiag::new(&[port])?,
        })
    }

    /// Connections waiting in the server's accept queue now (summed over its
    /// listeners; 0 if none listens yet).
    pub fn read(&mut self) -> io::Result<u32> {
        let n = if self.diag.knows_listeners() {
            match self.diag.count_listen_exact() {
                Ok(n) => n,
                // A listener closed or replaced: find them again.
                Err(_) => self.diag.count_listen()?,
            }
        } else {
            self.diag.count_listen()?
        };
        Ok(n.min(u64::from(u32::MAX)) as u32)
    }
}

/// Where a listener was found: a process and its descriptor (for the log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerOwner {
    /// The owning process.
    pub pid: u32,
    /// Its descriptor of the listener.
    pub fd: i32,
    /// The socket's inode.
    pub inode: u64,
}

/// A descriptor of the local server's listener on `port` (this network namespace,
/// IPv4 listeners first, then IPv6), taken from the process that holds it:
/// the listener's inode from `/proc/thread-self/net/tcp{,6}`, its owner by a scan of
/// `/proc/*/fd`, the descriptor by `pidfd_getfd` (needs ptrace rights over the owner:
/// root). The caller gets its own descriptor of the same socket: close it as soon as
/// it is no longer needed (it keeps the listener open if the server closes it).
/// With several listeners on the port (SO_REUSEPORT), the first.
pub fn server_listener(port: u16) -> io::Result<(std::os::fd::OwnedFd, ListenerOwner)> {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no listener on port {port} in this network namespace"),
        ));
    }
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let Some(inode) = socket_inode(link.as_os_str().to_str().unwrap_or("")) else {
                continue;
            };
            if !inodes.contains(&inode) {
                continue;
            }
            let Some(n) = fd.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let owner = ListenerOwner { pid, fd: n, inode };
            match farside_rt::pidfd::take_fd(pid, n) {
                Ok(f) => return Ok((f, owner)),
                // The process exited or closed it meanwhile: look further.
                Err(e) => log::debug!("specd: pidfd_getfd {owner:?}: {e}"),
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no process holds the listener of port {port} (inodes {inodes:?}) where we can take it"
        ),
    ))
}

/// Inodes of the sockets listening on local `port` in this network namespace (IPv4
/// first, then IPv6).
pub fn listening_inodes(port: u16) -> Vec<u64> {
    let mut inodes = Vec::new();
    for table in ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            inodes.extend(listen_inodes(&text, port));
        }
    }
    inodes
}

/// Inodes of the LISTEN sockets on local `port` in a `/proc/net/tcp{,6}` table.
fn listen_inodes(table: &str, port: u16) -> Vec<u64> {
    const TCP_LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit_once(':')?.1;
            (u16::from_str_radix(local_port, 16).ok()? == port && *f.get(3)? == TCP_LISTEN)
                .then(|| f.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// The inode of a `socket:[N]` link target.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn proc_net_tcp_lines_give_listening_inodes() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000 100 0 0 10 0\n   \
1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4243 1 0000 100 0 0 10 0\n   \
2: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4244 1 0000 100 0 0 10 0\n";
        assert_eq!(listen_inodes(t, 8080), vec![4242]);
        assert_eq!(listen_inodes(t, 8081), vec![4244]);
        assert!(listen_inodes(t, 80).is_empty());
        assert_eq!(socket_inode("socket:[123]"), Some(123));
        assert_eq!(socket_inode("pipe:[123]"), None);
    }

    #[test]
    fn the_listener_is_found_in_its_owner() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (fd, owner) = server_listener(port).unwrap();
        assert_eq!(owner.pid, std::process::id());
        assert_eq!(owner.fd, l.as_raw_fd());
        let copy = std::net::TcpListener::from(fd);
        assert_eq!(
            copy.local_addr().unwrap(),
            l.local_addr().unwrap(),
            "the same socket"
        );
        drop(l);
        drop(copy);
        assert!(server_listener(port).is_err(), "closed: not found");
    }
}
