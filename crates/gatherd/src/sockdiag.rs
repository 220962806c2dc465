//! Counting a server's TCP connections with netlink `sock_diag` (no /proc parsing per
//! sample), filtered in the kernel by an `inet_diag` bytecode program
//! `sport >= P && sport <= P`.
//!
//! Cost: a dump of LISTEN sockets only walks the small listening hash and is cheap (a few
//! µs). A dump that includes ESTABLISHED sockets walks every bucket of the TCP
//! established hash, whatever the filter: on a host whose hash has 262,144 buckets that
//! is about 1.5 ms of kernel CPU per dump. A network namespace created after
//! `net.ipv4.tcp_child_ehash_entries` is set small has its own small hash, and the same
//! dump costs microseconds. So the accept backlog is counted every sample
//! ([`SockDiag::count_listen`]) and the full count ([`SockDiag::count`]) as often as a CPU
//! budget allows (see gatherd's `--conns-every`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const INET_DIAG_REQ_BYTECODE: u16 = 1;
/// Reply attribute carrying the socket's `struct tcp_info`.
const INET_DIAG_INFO: u16 = 2;
/// `struct tcp_info`'s `tcpi_last_data_recv` (ms since data last arrived): byte offset.
const TCPI_LAST_DATA_RECV_OFFSET: usize = 52;
const INET_DIAG_BC_S_GE: u8 = 2;
const INET_DIAG_BC_S_LE: u8 = 3;
const TCP_ESTABLISHED: u8 = 1;
const TCP_LISTEN: u8 = 10;

/// Receive buffer for one batch of dump messages (the kernel fills up to ~32 KiB).
const RECV_BUF_BYTES: usize = 64 * 1024;
/// Most batches read for one dump; a host with more matching sockets is reported as an
/// error rather than looping without bound.
const DUMP_BATCHES_MAX: usize = 4096;

/// Most listening sockets remembered for exact lookups (SO_REUSEPORT groups, two
/// families, four ports).
const LISTENERS_MAX: usize = 32;

const NLMSG_HDR: usize = 16;
const REQ_V2: usize = 56;
const DIAG_MSG: usize = 72;

/// Connection counts on the watched ports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnCounts {
    /// Sockets in ESTABLISHED state (including ones still in an accept queue).
    pub established: u64,
    /// Sum of the listeners' accept-queue lengths.
    pub accept_backlog: u64,
    /// Established sockets with unread received bytes (a request waiting to be read).
    pub pending: u64,
    /// Of those, how long ago the oldest one's data arrived, ms (`tcp_info`'s
    /// `tcpi_last_data_recv`, kernel-tick resolution): how long the oldest waiting
    /// request has been queued. 0 when nothing is pending; full counts only.
    pub oldest_unread_ms: u64,
}

pub struct SockDiag {
    fd: OwnedFd,
    ports: Vec<u16>,
    /// Address families that had a listener on a watched port at the last listen dump;
    /// full dumps skip the others (each full dump walks the whole established hash).
    families: Vec<u8>,
    /// Listening sockets found by the last LISTEN dump: (family, inet_diag_sockid bytes,
    /// cookie included). Looked up one by one, which costs O(1) instead of a hash walk.
    listeners: Vec<(u8, [u8; 48])>,
    buf: Vec<u8>,
    req: Vec<u8>,
    seq: u32,
}

impl SockDiag {
    pub fn new(ports: &[u16]) -> io::Result<Self> {
        // SAFETY: plain socket(2).
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, owned descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let families = vec![libc::AF_INET as u8, libc::AF_INET6 as u8];
        Ok(SockDiag {
            fd,
            ports: ports.to_vec(),
            families,
            listeners: Vec::new(),
            buf: vec![0; RECV_BUF_BYTES],
            req: Vec::with_capacity(128),
            seq: 0,
        })
    }

    /// Accept-queue lengths only (LISTEN sockets; cheap). Also notes which address
    /// families have listeners, for [`SockDiag::count`].
    pub fn count_listen(&mut self) -> io::Result<u64> {
        let mut backlog = 0;
        let mut families = Vec::with_capacity(2);
        self.listeners.clear();
        for i in 0..self.ports.len() {
            let port = self.ports[i];
            for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
                let mut c = ConnCounts::default();
                let listeners = self.dump(family, port, 1 << TCP_LISTEN, &mut c)?;
                backlog += c.accept_backlog;
                if listeners > 0 && !families.contains(&family) {
                    families.push(family);
                }
            }
        }
        if !families.is_empty() {
            self.families = families;
        }
        Ok(backlog)
    }

    /// Accept-queue lengths by exact lookup of the listeners the last [`count_listen`]
    /// found (no hash walk). An error (a listener closed or replaced: ENOENT, ESTALE)
    /// means the caller should run `count_listen` again.
    ///
    /// [`count_listen`]: SockDiag::count_listen
    pub fn count_listen_exact(&mut self) -> io::Result<u64> {
        if self.listeners.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no listener known yet",
            ));
        }
        let mut c = ConnCounts::default();
        for i in 0..self.listeners.len() {
            let (family, id) = self.listeners[i];
            self.exchange(family, 0, 1 << TCP_LISTEN, Some(&id), &mut c)?;
        }
        Ok(c.accept_backlog)
    }

    /// Whether the last [`SockDiag::count_listen`] found a listener to look up exactly.
    pub fn knows_listeners(&self) -> bool {
        !self.listeners.is_empty()
    }

    /// Full counts on all watched ports: established, backlog, pending. Walks the
    /// established hash once per address family with a listener.
    pub fn count(&mut self) -> io::Result<ConnCounts> {
        let mut c = ConnCounts::default();
        for i in 0..self.ports.len() {
            let port = self.ports[i];
            for f in 0..self.families.len() {
                let family = self.families[f];
                self.dump(
                    family,
                    port,
                    (1 << TCP_ESTABLISHED) | (1 << TCP_LISTEN),
                    &mut c,
                )?;
            }
        }
        Ok(c)
    }

    fn build_request(&mut self, family: u8, port: u16, states: u32, exact: Option<&[u8; 48]>) {
        self.seq = self.seq.wrapping_add(1);
        let attr_len: u16 = 4 + 16;
        let total = (NLMSG_HDR
            + REQ_V2
            + if exact.is_some() {
                0
            } else {
                attr_len as usize
            }) as u32;
        let flags = if exact.is_some() {
            NLM_F_REQUEST
        } else {
            NLM_F_REQUEST | NLM_F_DUMP
        };
        let r = &mut self.req;
        r.clear();
        r.extend_from_slice(&total.to_ne_bytes());
        r.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        r.extend_from_slice(&flags.to_ne_bytes());
        r.extend_from_slice(&self.seq.to_ne_bytes());
        r.extend_from_slice(&0u32.to_ne_bytes()); // pid
                                                  // inet_diag_req_v2
        r.push(family);
        r.push(libc::IPPROTO_TCP as u8);
        // ext: ask for tcp_info with full dumps (the age of unread requests).
        let full = exact.is_none() && states & (1 << TCP_ESTABLISHED) != 0;
        r.push(if full { 1 << (INET_DIAG_INFO - 1) } else { 0 });
        r.push(0); // pad
        r.extend_from_slice(&states.to_ne_bytes());
        match exact {
            // One socket by its full id (cookie included): an O(1) lookup, no dump.
            Some(id) => {
                r.extend_from_slice(id);
                return;
            }
            None => r.extend_from_slice(&[0u8; 48]), // inet_diag_sockid: wildcard
        }
        // INET_DIAG_REQ_BYTECODE: sport >= port && sport <= port.
        r.extend_from_slice(&attr_len.to_ne_bytes());
        r.extend_from_slice(&INET_DIAG_REQ_BYTECODE.to_ne_bytes());
        // op0: S_GE, yes -> op1 (8), no -> past the end (16 + 4): reject.
        r.extend_from_slice(&[INET_DIAG_BC_S_GE, 8]);
        r.extend_from_slice(&20u16.to_ne_bytes());
        r.extend_from_slice(&[0, 0]);
        r.extend_from_slice(&port.to_ne_bytes());
        // op1: S_LE, yes -> end (accept), no -> past the end (8 + 4): reject.
        r.extend_from_slice(&[INET_DIAG_BC_S_LE, 8]);
        r.extend_from_slice(&12u16.to_ne_bytes());
        r.extend_from_slice(&[0, 0]);
        r.extend_from_slice(&port.to_ne_bytes());
    }

    /// One dump; adds to `c` and returns the number of listeners seen.
    fn dump(&mut self, family: u8, port: u16, states: u32, c: &mut ConnCounts) -> io::Result<u64> {
        self.exchange(family, port, states, None, c)
    }

    /// One request (a dump, or an exact lookup of `exact`) and its replies.
    fn exchange(
        &mut self,
        family: u8,
        port: u16,
        states: u32,
        exact: Option<&[u8; 48]>,
        c: &mut ConnCounts,
    ) -> io::Result<u64> {
        self.build_request(family, port, states, exact);
        let mut listeners = 0;
        let fd = self.fd.as_raw_fd();
        // SAFETY: sending our own buffer on our socket (kernel as destination: zeroed sockaddr_nl).
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: valid buffer and address for the call's duration.
        let n = unsafe {
            libc::sendto(
                fd,
                self.req.as_ptr().cast(),
                self.req.len(),
                0,
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for _ in 0..DUMP_BATCHES_MAX {
            // SAFETY: receiving into our own buffer.
            let n = unsafe { libc::recv(fd, self.buf.as_mut_ptr().cast(), self.buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut off = 0usize;
            let n = n as usize;
            while off + NLMSG_HDR <= n {
                let b = &self.buf[off..n];
                let len = u32::from_ne_bytes(b[0..4].try_into().expect("4")) as usize;
                let ty = u16::from_ne_bytes(b[4..6].try_into().expect("2"));
                if len < NLMSG_HDR || len > b.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "sock_diag: bad netlink length",
                    ));
                }
                match ty {
                    NLMSG_DONE => return Ok(listeners),
                    NLMSG_ERROR => {
                        let errno = i32::from_ne_bytes(b[16..20].try_into().expect("4"));
                        if errno == 0 {
                            return Ok(listeners);
                        }
                        return Err(io::Error::from_raw_os_error(-errno));
                    }
                    SOCK_DIAG_BY_FAMILY if len >= NLMSG_HDR + DIAG_MSG => {
                        let m = &b[NLMSG_HDR..];
                        let state = m[1];
                        let rqueue = u32::from_ne_bytes(m[56..60].try_into().expect("4")) as u64;
                        match state {
                            TCP_LISTEN => {
                                listeners += 1;
                                c.accept_backlog += rqueue;
                                if exact.is_none()
                                    && states == 1 << TCP_LISTEN
                                    && self.listeners.len() < LISTENERS_MAX
                                {
                                    let id: [u8; 48] = m[4..52].try_into().expect("48 bytes");
                                    self.listeners.push((family, id));
                                }
                            }
                            TCP_ESTABLISHED => {
                                c.established += 1;
                                if rqueue > 0 {
                                    c.pending += 1;
                                    let age = last_data_recv_ms(&m[DIAG_MSG..len - NLMSG_HDR]);
                                    c.oldest_unread_ms = c.oldest_unread_ms.max(age.unwrap_or(0));
                                }
                            }
                            _ => {}
                        }
                    }
                    _ => {}
                }
                if exact.is_some() && ty == SOCK_DIAG_BY_FAMILY {
                    // An exact lookup answers with one message and no NLMSG_DONE.
                    return Ok(listeners);
                }
                off += (len + 3) & !3;
            }
        }
        Err(io::Error::other(
            "sock_diag: dump did not finish within the batch bound",
        ))
    }
}

/// `tcpi_last_data_recv` from a diag message's attributes, if they carry tcp_info.
fn last_data_recv_ms(mut attrs: &[u8]) -> Option<u64> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let ty = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            return None;
        }
        let off = 4 + TCPI_LAST_DATA_RECV_OFFSET;
        if ty == INET_DIAG_INFO && len >= off + 4 {
            return Some(u32::from_ne_bytes(attrs[off..off + 4].try_into().ok()?) as u64);
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn counts_established_backlog_and_pending_on_the_watched_port_only() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let _noise: Vec<_> = (0..3)
            .map(|_| TcpStream::connect(other.local_addr().unwrap()).unwrap())
            .collect();
        let mut d = SockDiag::new(&[port]).unwrap();
        assert_eq!(d.count().unwrap(), ConnCounts::default());

        // Two clients, not accepted: both in the accept queue.
        let mut c1 = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _c2 = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert_eq!(d.count_listen().unwrap(), 2);
        assert_eq!(
            d.count_listen_exact().unwrap(),
            2,
            "exact lookup of the listener agrees"
        );
        let c = d.count().unwrap();
        assert_eq!(c.accept_backlog, 2, "{c:?}");
        assert_eq!(
            c.established, 2,
            "server-side sockets with sport = port: {c:?}"
        );

        // Accept one and leave a request unread on it.
        c1.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let (_s1, _) = l.accept().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let c = d.count().unwrap();
            if c.pending >= 1 {
                assert_eq!(c.accept_backlog, 1);
                assert_eq!(c.established, 2);
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "pending never seen: {c:?}"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_oldest_unread_request_reports_its_age_and_none_once_read() {
        use std::io::Read;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut d = SockDiag::new(&[port]).unwrap();
        d.count_listen().unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let sent = std::time::Instant::now();
        // Waits in the accept queue, unread, for at least this long.
        std::thread::sleep(std::time::Duration::from_millis(60));
        let n = d.count().unwrap();
        let waited_ms = sent.elapsed().as_millis() as u64;
        assert_eq!(n.pending, 1, "{n:?}");
        // Kernel-tick resolution (up to 10 ms at HZ=100).
        assert!(
            n.oldest_unread_ms + 10 >= 60 && n.oldest_unread_ms <= waited_ms + 10,
            "age {n:?} after {waited_ms} ms"
        );
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf).unwrap();
        let n = d.count().unwrap();
        assert_eq!(
            (n.pending, n.oldest_unread_ms),
            (0, 0),
            "read: nothing waits"
        );
    }
}
