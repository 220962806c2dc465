//! The local web server's accept-queue length, read with netlink `sock_diag` (the
//! listener found once by a LISTEN dump on its port, then looked up exactly: a few
//! µs per read, no /proc parsing).

use std::io;

use farside_gatherd::sockdiag::SockDiag;

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
