//! Counting a server's TCP connections with netlink `sock_diag` (no /proc parsing per
//! sample), filtered in the kernel by the request's source port and an `inet_diag`
//! bytecode program `sport >= P && sport <= P`.
//!
//! Cost (this host, 2 CPUs, 262,144-bucket TCP hash): a dump of LISTEN sockets walks the
//! whole listening hash (~15 µs), so it only finds the listeners
//! ([`SockDiag::count_listen`]: at start, then once a second or when a lookup fails);
//! every sample reads their accept queues by **exact lookup** of each listener's id
//! (cookie included: an O(1) hash lookup in the kernel), all of them in one `sendto` and
//! one `recvmmsg` on a socket kept open, into buffers allocated once
//! ([`SockDiag::count_listen_exact`], ~3 µs). A dump that includes ESTABLISHED sockets
//! walks every bucket of the established hash whatever the filter (~170 µs here, ms with
//! many TIME_WAIT sockets); a network namespace created after
//! `net.ipv4.tcp_child_ehash_entries` is set small has its own small hash, and the same
//! dump costs microseconds. So established connections are counted
//! ([`SockDiag::count_established`]) as often as a CPU budget allows (gatherd's
//! `--conns-every`).
//!
//! Replies are checked, never guessed at: every message must be whole, carry the
//! sequence number of the request it answers and, for an exact lookup, name the socket
//! asked for; anything else is an error (the sample fails and the record goes stale
//! rather than carrying a wrong number), and the netlink socket is replaced so no
//! leftover of a broken exchange can be read as the next answer.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_NOOP: u16 = 1;
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
pub const LISTENERS_MAX: usize = 32;
/// Receive-buffer bytes for one exact lookup's reply (a listener's `inet_diag_msg` and
/// its default attributes take ~100 bytes; a reply that does not fit is an error).
const EXACT_REPLY_BYTES: usize = RECV_BUF_BYTES / LISTENERS_MAX;
/// Remote ports tried to steer an exact lookup to one member of a SO_REUSEPORT group:
/// the kernel answers a lookup with the member a hash of the (remote address, remote
/// port) picks, and refuses it (ENOENT) if that is not the socket asked for, so each
/// member needs a remote port that hashes to it (about n tries for a group of n). A
/// member not reached within this bound is read by LISTEN dumps instead.
const STEER_TRIES_MAX: u16 = 256;
/// `recvmmsg` calls allowed to collect one batch of exact-lookup replies (the kernel
/// queues them all before `sendto` returns, so one call normally takes them all).
const EXACT_RECV_CALLS_MAX: usize = 4;

const NLMSG_HDR: usize = 16;
const REQ_V2: usize = 56;
const DIAG_MSG: usize = 72;
const SOCKID: usize = 48;
/// Bytes of one exact-lookup request (header and `inet_diag_req_v2`, no attribute).
const EXACT_REQ: usize = NLMSG_HDR + REQ_V2;

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

/// A listening socket found by a LISTEN dump: its family and `inet_diag_sockid` (the
/// cookie included), what an exact lookup names; the id's remote port (bytes 2..4)
/// steers the lookup within a SO_REUSEPORT group (see [`STEER_TRIES_MAX`]).
type Listener = (u8, [u8; SOCKID]);

fn cookie(id: &[u8; SOCKID]) -> &[u8] {
    &id[40..48]
}

/// A sock_diag client for a fixed set of ports (gatherd's sampler, specd's load): one
/// netlink socket, kept open.
pub struct SockDiag {
    fd: OwnedFd,
    ports: Vec<u16>,
    /// Address families that had a listener on a watched port at the last listen dump;
    /// full dumps skip the others (each full dump walks the whole established hash).
    families: Vec<u8>,
    /// Listening sockets found by the last LISTEN dump, looked up one by one each
    /// sample, which costs O(1) instead of a hash walk.
    listeners: Vec<Listener>,
    /// Whether every listener can be looked up exactly (else LISTEN dumps are needed).
    all_steered: bool,
    /// Cookies of the listeners no remote port reached: not searched again (each
    /// search is up to [`STEER_TRIES_MAX`] lookups) while they are listed by the dumps.
    unreached: Vec<[u8; 8]>,
    /// The listeners' exact-lookup requests, back to back: sent in one `sendto` (their
    /// sequence numbers are rewritten before each send).
    exact_req: Vec<u8>,
    buf: Vec<u8>,
    req: Vec<u8>,
    seq: u32,
}

fn bad(m: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("sock_diag: {m}"))
}

fn open_socket() -> io::Result<OwnedFd> {
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
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl SockDiag {
    /// A client counting connections on `ports` (none found yet).
    pub fn new(ports: &[u16]) -> io::Result<Self> {
        Ok(SockDiag {
            fd: open_socket()?,
            ports: ports.to_vec(),
            families: vec![libc::AF_INET as u8, libc::AF_INET6 as u8],
            listeners: Vec::with_capacity(LISTENERS_MAX),
            all_steered: false,
            unreached: Vec::new(),
            exact_req: Vec::with_capacity(LISTENERS_MAX * EXACT_REQ),
            buf: vec![0; RECV_BUF_BYTES],
            req: Vec::with_capacity(128),
            seq: 0,
        })
    }

    /// After a failed exchange: a fresh socket, so nothing left of it (the rest of a
    /// dump, a late reply) is read as the answer to the next request.
    fn after<T>(&mut self, r: io::Result<T>) -> io::Result<T> {
        if r.is_err() {
            if let Ok(fd) = open_socket() {
                self.fd = fd;
            }
        }
        r
    }

    /// Accept-queue lengths by a LISTEN dump (walks the listening hash), which also
    /// finds the listeners [`SockDiag::count_listen_exact`] looks up and notes which
    /// address families have listeners, for the full counts.
    pub fn count_listen(&mut self) -> io::Result<u64> {
        let r = self.count_listen_inner();
        self.after(r)
    }

    fn count_listen_inner(&mut self) -> io::Result<u64> {
        let mut backlog = 0;
        let mut families = Vec::with_capacity(2);
        let previous = std::mem::take(&mut self.listeners);
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
        self.steer(&previous)?;
        self.build_exact_requests();
        Ok(backlog)
    }

    /// Finds, for each listener just dumped, a remote port whose exact lookup reaches
    /// it (the one it had before first, then 0, 1, ...: see [`STEER_TRIES_MAX`]).
    /// Listeners not reached are dropped from the exact lookups and `all_steered` is
    /// cleared, so the sampler reads the backlog by LISTEN dumps.
    fn steer(&mut self, previous: &[Listener]) -> io::Result<()> {
        let mut kept = Vec::with_capacity(self.listeners.len());
        let mut unreached = Vec::new();
        self.all_steered = true;
        for i in 0..self.listeners.len() {
            let (family, mut id) = self.listeners[i];
            let c: [u8; 8] = cookie(&id).try_into().expect("8 bytes");
            if self.unreached.contains(&c) {
                unreached.push(c);
                self.all_steered = false;
                continue;
            }
            let before = previous
                .iter()
                .find(|(f, p)| *f == family && cookie(p) == cookie(&id))
                .map(|(_, p)| u16::from_be_bytes([p[2], p[3]]));
            let mut reached = false;
            for port in before.into_iter().chain(0..STEER_TRIES_MAX) {
                id[2..4].copy_from_slice(&port.to_be_bytes());
                match self.lookup_one(family, &id) {
                    Ok(_) => {
                        reached = true;
                        break;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(e) => return Err(e),
                }
            }
            if reached {
                kept.push((family, id));
            } else {
                unreached.push(c);
                self.all_steered = false;
            }
        }
        self.listeners = kept;
        self.unreached = unreached;
        Ok(())
    }

    /// One exact lookup of listener `id`: its accept-queue length.
    fn lookup_one(&mut self, family: u8, id: &[u8; SOCKID]) -> io::Result<u64> {
        let seq = self.next_seq();
        let mut r = [0u8; EXACT_REQ];
        exact_request(&mut r, family, id, seq);
        send(self.fd.as_raw_fd(), &r)?;
        // SAFETY: receiving into our own buffer; MSG_TRUNC returns the real length.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                self.buf.as_mut_ptr().cast(),
                self.buf.len(),
                libc::MSG_TRUNC,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize > self.buf.len() {
            return Err(bad("exact lookup reply truncated"));
        }
        parse_exact_reply(&self.buf[..n as usize], seq, family, id)
    }

    /// Accept-queue lengths by exact lookup of the listeners the last [`count_listen`]
    /// found (no hash walk): one `sendto` for all, one `recvmmsg` for their replies. An
    /// error (a listener closed or replaced: ENOENT, ESTALE; or one the lookup cannot
    /// reach: Unsupported) means the caller should run `count_listen` instead.
    ///
    /// [`count_listen`]: SockDiag::count_listen
    pub fn count_listen_exact(&mut self) -> io::Result<u64> {
        if self.listeners.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no listener known yet",
            ));
        }
        if !self.all_steered {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a SO_REUSEPORT listener no exact lookup reaches",
            ));
        }
        let r = self.count_listen_exact_inner();
        self.after(r)
    }

    /// Whether the last [`SockDiag::count_listen`] found a listener (one an exact lookup
    /// reaches, or one only dumps read).
    pub fn knows_listeners(&self) -> bool {
        !self.listeners.is_empty() || !self.unreached.is_empty()
    }

    /// Full counts on all watched ports: established, backlog, pending. Walks the
    /// listening hash and the established hash once per address family with a listener.
    pub fn count(&mut self) -> io::Result<ConnCounts> {
        let r = self.count_states((1 << TCP_ESTABLISHED) | (1 << TCP_LISTEN));
        self.after(r)
    }

    /// Established and pending connections only (`accept_backlog` 0: the sampler reads
    /// it by exact lookup every sample), which spares the listening hash's walk.
    pub fn count_established(&mut self) -> io::Result<ConnCounts> {
        let r = self.count_states(1 << TCP_ESTABLISHED);
        self.after(r)
    }

    fn count_states(&mut self, states: u32) -> io::Result<ConnCounts> {
        let mut c = ConnCounts::default();
        for i in 0..self.ports.len() {
            let port = self.ports[i];
            for f in 0..self.families.len() {
                let family = self.families[f];
                self.dump(family, port, states, &mut c)?;
            }
        }
        Ok(c)
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// The exact-lookup requests of the known listeners, back to back.
    fn build_exact_requests(&mut self) {
        self.exact_req.clear();
        for &(family, id) in &self.listeners {
            let start = self.exact_req.len();
            self.exact_req.resize(start + EXACT_REQ, 0);
            // seq is set before each send.
            exact_request(&mut self.exact_req[start..], family, &id, 0);
        }
    }

    fn count_listen_exact_inner(&mut self) -> io::Result<u64> {
        let n = self.listeners.len();
        let first = self.seq.wrapping_add(1);
        for i in 0..n {
            let s = self.next_seq();
            self.exact_req[i * EXACT_REQ + 8..i * EXACT_REQ + 12].copy_from_slice(&s.to_ne_bytes());
        }
        send(self.fd.as_raw_fd(), &self.exact_req)?;
        // One receive slot per reply, in the buffer allocated once.
        let mut iov: [libc::iovec; LISTENERS_MAX] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; LISTENERS_MAX];
        // SAFETY: mmsghdr is plain data; all-zero is a valid empty header.
        let mut hdrs: [libc::mmsghdr; LISTENERS_MAX] = unsafe { std::mem::zeroed() };
        let mut got = 0;
        let mut backlog = 0;
        for _ in 0..EXACT_RECV_CALLS_MAX {
            let want = n - got;
            for k in 0..want {
                let slot = &mut self.buf[(got + k) * EXACT_REPLY_BYTES..][..EXACT_REPLY_BYTES];
                iov[k] = libc::iovec {
                    iov_base: slot.as_mut_ptr().cast(),
                    iov_len: EXACT_REPLY_BYTES,
                };
                hdrs[k].msg_hdr.msg_iov = &mut iov[k];
                hdrs[k].msg_hdr.msg_iovlen = 1;
                hdrs[k].msg_hdr.msg_flags = 0;
                hdrs[k].msg_len = 0;
            }
            // SAFETY: `want` headers, each pointing at one slot of our own buffer.
            let r = unsafe {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    hdrs.as_mut_ptr(),
                    want as u32,
                    libc::MSG_WAITFORONE,
                    std::ptr::null_mut(),
                )
            };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            for h in &hdrs[..r as usize] {
                if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                    return Err(bad("exact lookup reply truncated"));
                }
                let i = got;
                let slot = &self.buf[i * EXACT_REPLY_BYTES..][..h.msg_len as usize];
                let (family, id) = &self.listeners[i];
                backlog += parse_exact_reply(slot, first.wrapping_add(i as u32), *family, id)?;
                got += 1;
            }
            if got == n {
                return Ok(backlog);
            }
        }
        Err(bad("exact lookup replies missing"))
    }

    fn build_request(&mut self, family: u8, port: u16, states: u32) {
        let seq = self.next_seq();
        let attr_len: u16 = 4 + 16;
        let total = (NLMSG_HDR + REQ_V2 + attr_len as usize) as u32;
        let r = &mut self.req;
        r.clear();
        r.extend_from_slice(&total.to_ne_bytes());
        r.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        r.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        r.extend_from_slice(&seq.to_ne_bytes());
        r.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel
                                                  // inet_diag_req_v2
        r.push(family);
        r.push(libc::IPPROTO_TCP as u8);
        // ext: ask for tcp_info with established sockets (the age of unread requests).
        let full = states & (1 << TCP_ESTABLISHED) != 0;
        r.push(if full { 1 << (INET_DIAG_INFO - 1) } else { 0 });
        r.push(0); // pad
        r.extend_from_slice(&states.to_ne_bytes());
        // inet_diag_sockid: the source port (the kernel skips other ports before the
        // bytecode runs), the rest wildcard.
        r.extend_from_slice(&port.to_be_bytes());
        r.extend_from_slice(&[0u8; SOCKID - 2]);
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

    /// One dump; adds to `c` and returns the number of listeners seen (remembered for
    /// exact lookups when the dump is of LISTEN sockets only).
    fn dump(&mut self, family: u8, port: u16, states: u32, c: &mut ConnCounts) -> io::Result<u64> {
        self.build_request(family, port, states);
        let seq = self.seq;
        let fd = self.fd.as_raw_fd();
        send(fd, &self.req)?;
        let keep = states == 1 << TCP_LISTEN;
        let mut listeners = 0;
        for _ in 0..DUMP_BATCHES_MAX {
            // SAFETY: receiving into our own buffer; MSG_TRUNC returns the datagram's
            // real length, so a truncated one is caught.
            let n = unsafe {
                libc::recv(
                    fd,
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_TRUNC,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            if n > self.buf.len() {
                return Err(bad("dump batch truncated"));
            }
            let found = &mut self.listeners;
            let done = parse_dump_batch(&self.buf[..n], seq, family, c, &mut |id| {
                listeners += 1;
                if keep && found.len() < LISTENERS_MAX {
                    found.push((family, id));
                }
            })?;
            if done {
                return Ok(listeners);
            }
        }
        Err(io::Error::other(
            "sock_diag: dump did not finish within the batch bound",
        ))
    }
}

/// An exact-lookup request for socket `id` into `r` (`EXACT_REQ` bytes).
fn exact_request(r: &mut [u8], family: u8, id: &[u8; SOCKID], seq: u32) {
    r[..EXACT_REQ].fill(0);
    r[0..4].copy_from_slice(&(EXACT_REQ as u32).to_ne_bytes());
    r[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    // One socket by its full id (cookie included): an O(1) lookup, no dump.
    r[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    r[8..12].copy_from_slice(&seq.to_ne_bytes());
    // pid (12..16) 0: the kernel.
    r[16] = family;
    r[17] = libc::IPPROTO_TCP as u8;
    // ext (18) 0, pad (19) 0.
    r[20..24].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    r[24..24 + SOCKID].copy_from_slice(id);
}

fn send(fd: i32, req: &[u8]) -> io::Result<()> {
    // SAFETY: kernel as destination: zeroed sockaddr_nl with the family set.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: valid buffer and address for the call's duration.
    let n = unsafe {
        libc::sendto(
            fd,
            req.as_ptr().cast(),
            req.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != req.len() {
        return Err(bad("request sent in part"));
    }
    Ok(())
}

/// One netlink message at the start of `b`: its type, sequence number, payload, and
/// the bytes it takes with its padding (at most `b.len()`).
fn next_msg(b: &[u8]) -> io::Result<(u16, u32, &[u8], usize)> {
    if b.len() < NLMSG_HDR {
        return Err(bad("truncated netlink header"));
    }
    let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
    if len < NLMSG_HDR || len > b.len() {
        return Err(bad("bad netlink length"));
    }
    let ty = u16::from_ne_bytes([b[4], b[5]]);
    let seq = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
    Ok((ty, seq, &b[NLMSG_HDR..len], ((len + 3) & !3).min(b.len())))
}

/// An `NLMSG_ERROR` payload: Ok for an acknowledgement (0), else the error.
fn netlink_error(p: &[u8]) -> io::Result<()> {
    if p.len() < 4 {
        return Err(bad("truncated error message"));
    }
    match i32::from_ne_bytes([p[0], p[1], p[2], p[3]]) {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e.saturating_neg())),
    }
}

/// The fields gatherd uses of one `inet_diag_msg`, and its attributes.
struct DiagMsg<'a> {
    family: u8,
    state: u8,
    id: [u8; SOCKID],
    rqueue: u64,
    attrs: &'a [u8],
}

fn parse_diag(p: &[u8]) -> io::Result<DiagMsg<'_>> {
    if p.len() < DIAG_MSG {
        return Err(bad("truncated inet_diag_msg"));
    }
    Ok(DiagMsg {
        family: p[0],
        state: p[1],
        id: p[4..4 + SOCKID].try_into().expect("48 bytes"),
        rqueue: u32::from_ne_bytes([p[56], p[57], p[58], p[59]]) as u64,
        attrs: &p[DIAG_MSG..],
    })
}

/// Adds one received batch of a dump's messages (`buf`, one datagram) to `c`, calling
/// `on_listener` with each listener's id. Returns whether the dump is done. Every
/// message must be whole, answer request `seq` and be of `family`: a malformed,
/// truncated or foreign message is an error, never a count.
fn parse_dump_batch(
    buf: &[u8],
    seq: u32,
    family: u8,
    c: &mut ConnCounts,
    on_listener: &mut dyn FnMut([u8; SOCKID]),
) -> io::Result<bool> {
    let mut off = 0;
    while off < buf.len() {
        let (ty, s, p, step) = next_msg(&buf[off..])?;
        if s != seq {
            return Err(bad("reply to another request"));
        }
        match ty {
            NLMSG_DONE => {
                // The dump's status: negative if it ended in an error.
                if p.len() >= 4 {
                    let e = i32::from_ne_bytes([p[0], p[1], p[2], p[3]]);
                    if e < 0 {
                        return Err(io::Error::from_raw_os_error(e.saturating_neg()));
                    }
                }
                return Ok(true);
            }
            NLMSG_ERROR => {
                netlink_error(p)?;
                return Ok(true);
            }
            NLMSG_NOOP => {}
            SOCK_DIAG_BY_FAMILY => {
                let m = parse_diag(p)?;
                if m.family != family {
                    return Err(bad("reply of another address family"));
                }
                match m.state {
                    TCP_LISTEN => {
                        c.accept_backlog += m.rqueue;
                        on_listener(m.id);
                    }
                    TCP_ESTABLISHED => {
                        c.established += 1;
                        if m.rqueue > 0 {
                            c.pending += 1;
                            let age = last_data_recv_ms(m.attrs)?;
                            c.oldest_unread_ms = c.oldest_unread_ms.max(age);
                        }
                    }
                    _ => return Err(bad("socket in a state not asked for")),
                }
            }
            _ => return Err(bad("unexpected netlink message type")),
        }
        off += step;
    }
    Ok(false)
}

/// The accept-queue length in an exact lookup's reply (`msg`, one datagram) to request
/// `seq` for listener `id` of `family`. An error reply, a malformed or truncated
/// message, a reply to another request or about another socket, or a socket not
/// listening is an error.
fn parse_exact_reply(msg: &[u8], seq: u32, family: u8, id: &[u8; SOCKID]) -> io::Result<u64> {
    let (ty, s, p, step) = next_msg(msg)?;
    if step != msg.len() {
        return Err(bad("exact lookup reply of more than one message"));
    }
    if s != seq {
        return Err(bad("reply to another request"));
    }
    match ty {
        NLMSG_ERROR => {
            netlink_error(p)?;
            Err(bad("exact lookup acknowledged without an answer"))
        }
        SOCK_DIAG_BY_FAMILY => {
            let m = parse_diag(p)?;
            // Source port (0..2) and cookie (40..48): the socket asked for.
            if m.family != family || m.id[0..2] != id[0..2] || m.id[40..48] != id[40..48] {
                return Err(bad("exact lookup answered about another socket"));
            }
            if m.state != TCP_LISTEN {
                return Err(bad("looked-up socket no longer listens"));
            }
            Ok(m.rqueue)
        }
        _ => Err(bad("unexpected netlink message type")),
    }
}

/// `tcpi_last_data_recv` from a diag message's attributes (a full dump asks for
/// tcp_info): malformed attributes, or none carrying tcp_info, are an error.
fn last_data_recv_ms(mut attrs: &[u8]) -> io::Result<u64> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let ty = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            return Err(bad("bad attribute length"));
        }
        if ty == INET_DIAG_INFO {
            let off = 4 + TCPI_LAST_DATA_RECV_OFFSET;
            if len < off + 4 {
                return Err(bad("truncated tcp_info"));
            }
            let v = &attrs[off..off + 4];
            return Ok(u32::from_ne_bytes([v[0], v[1], v[2], v[3]]) as u64);
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    Err(bad("no tcp_info for a socket with unread bytes"))
}

#[cfg(test)]
mod tests;
