//! The `udp` transport: one datagram per request and one per reply. Two servers answer
//! the same packets: the XDP program in `bpf/` (in the kernel, one-sided) and
//! [`UdpServer`] in gatherd (user space, the fallback when XDP cannot be attached).
//!
//! Retries and their semantics (a datagram or its reply may be lost, duplicated or
//! delayed past later ones):
//! - Every op is retried up to `UDP_TRIES` times with the same (client id, seq) and
//!   `FLAG_RETRY` set. Both servers (XDP and user space) apply a WRITE, CAS or FETCH-ADD
//!   at most once per (client id, seq) and answer a retry of an applied one with the
//!   recorded reply (`ops::Dedup`; `rmem_dedup` in the XDP program). So a CAS whose
//!   first reply was lost still reports the value it saw when applied, a FETCH-ADD is
//!   never counted twice, and a delayed duplicate of an old WRITE never overwrites a
//!   newer one (it is older than the client's last seq: dropped as `Stale`).
//! - `Timeout` after all attempts, or `Refused(Unknown)` (the server had no record of a
//!   retried op's first attempt), means the op may or may not have been applied.
//! - A reply whose sequence number is not the current request's is discarded (late
//!   replies of earlier operations), so replies are never matched to the wrong request.
//! - A READ request is padded to the size of its reply: servers refuse shorter ones
//!   (`Unpadded`), so the protocol cannot reflect a small datagram as a large one.

use crate::auth::ServerKeys;
use crate::iface::{ClientOptions, Codec, Exchange, RmemError};
use crate::ops::{self, Dedup, OpCounters};
use crate::wire::*;
use farside_region::Words;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Attempts per operation (first try + retries), every op alike.
pub const UDP_TRIES: u32 = 3;
/// Largest READ one datagram carries: the reply must fit one 1500-byte frame, because the
/// XDP responder answers in place and cannot fragment. Larger reads are split into
/// several READs by [`UdpClient`] (each chunk is consistent on its own; callers that need
/// one consistent snapshot keep it within one chunk, as the load record is).
pub const UDP_READ_BYTES_MAX: usize = 1400;

pub struct UdpClient {
    sock: UdpSocket,
    opts: ClientOptions,
    codec: Codec,
    /// Attempts per operation; `UDP_TRIES` by default.
    pub tries: u32,
    /// Test hook: drop this many outgoing datagrams (simulated loss).
    pub drop_next_sends: u32,
}

impl UdpClient {
    pub fn new(server: SocketAddr, opts: ClientOptions) -> Result<Self, RmemError> {
        let bind: SocketAddr = if server.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        }
        .parse()
        .expect("literal");
        let sock = UdpSocket::bind(bind)?;
        sock.connect(server)?;
        let codec = Codec::new(Some(opts.require_key()?));
        Ok(UdpClient {
            sock,
            opts,
            codec,
            tries: UDP_TRIES,
            drop_next_sends: 0,
        })
    }

    /// The region every later request names (0, the control region, by default): an
    /// object arena's region, whose chunks a key with chunk grants may WRITE.
    pub fn set_region(&mut self, region: u32) {
        self.codec.region = region;
    }

    /// Per-attempt timeout: the operation timeout split over the attempts.
    fn attempt_timeout(&self, tries: u32) -> Duration {
        (self.opts.timeout / tries.max(1)).max(Duration::from_micros(100))
    }

    fn one_attempt(&mut self, seq: u64, timeout: Duration, retry: bool) -> Result<(), RmemError> {
        if retry {
            self.codec.mark_retry();
        }
        if self.drop_next_sends > 0 {
            self.drop_next_sends -= 1;
        } else {
            self.sock.send(self.codec.req())?;
        }
        let deadline = Instant::now() + timeout;
        crate::iface::spin_until_readable(&self.sock, self.opts.spin.min(timeout));
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RmemError::Timeout);
            }
            self.sock.set_read_timeout(Some(left))?;
            let rep = self.codec.rep_mut();
            rep.resize(REP_BYTES_MAX, 0);
            let n = match self.sock.recv(rep) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    // ICMP port unreachable: nothing listens (and no XDP answered).
                    return Err(RmemError::Io(e));
                }
                Err(e) => return Err(e.into()),
            };
            rep.truncate(n);
            if self.codec.reply_answers(seq) {
                return Ok(());
            }
            // A late reply to an earlier operation, a forgery or junk: not ours.
        }
    }
}

impl Exchange for UdpClient {
    fn codec(&mut self) -> &mut Codec {
        &mut self.codec
    }

    fn exchange(&mut self, op: Op, seq: u64) -> Result<(), RmemError> {
        if op == Op::Read {
            // Pad a READ to the size of its reply: the XDP responder answers in place and
            // on veth/generic XDP the frame has almost no tailroom to grow into.
            let len = self.codec.request_len();
            self.codec
                .pad_request(ENVELOPE_BYTES + REP_HEADER_BYTES + len);
        }
        let tries = self.tries.max(1);
        let per = self.attempt_timeout(tries);
        let mut last = RmemError::Timeout;
        for attempt in 0..tries {
            match self.one_attempt(seq, per, attempt > 0) {
                Ok(()) => return Ok(()),
                Err(RmemError::Timeout) => last = RmemError::Timeout,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }
}

/// Reads larger than one datagram are split; everything else goes straight through.
impl crate::iface::RemoteMemory for UdpClient {
    fn read(&mut self, offset: usize, buf: &mut [u8]) -> Result<(), RmemError> {
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(UDP_READ_BYTES_MAX);
            self.ex_read(offset + done, &mut buf[done..done + n])?;
            done += n;
        }
        Ok(())
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RmemError> {
        self.ex_write(offset, data)
    }
    fn compare_swap(&mut self, offset: usize, expected: u64, new: u64) -> Result<u64, RmemError> {
        self.ex_compare_swap(offset, expected, new)
    }
    fn fetch_add(&mut self, offset: usize, delta: u64) -> Result<u64, RmemError> {
        self.ex_fetch_add(offset, delta)
    }
    fn transport(&self) -> &'static str {
        "udp"
    }
}

/// Most datagrams the user-space server answers per wake-up before checking for stop.
const SERVER_BATCH_MAX: usize = 64;

/// User-space responder for the udp protocol (the fallback when XDP is unavailable).
/// Requests that are not authentic (unknown key, wrong tag), copies (replay window),
/// malformed requests and stale duplicates are dropped without a reply, like the XDP
/// program does; READs must be padded to their reply's size (no reflection).
pub struct UdpServer {
    pub local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UdpServer {
    pub fn spawn(
        addr: SocketAddr,
        mem: Arc<dyn Words>,
        keys: Arc<ServerKeys>,
        counters: Arc<OpCounters>,
    ) -> io::Result<UdpServer> {
        Self::spawn_with_dedup(addr, mem, keys, counters, Arc::new(Dedup::new()))
    }

    /// As [`UdpServer::spawn`], sharing duplicate detection with other servers of the
    /// same memory (gatherd's tcp server).
    pub fn spawn_with_dedup(
        addr: SocketAddr,
        mem: Arc<dyn Words>,
        keys: Arc<ServerKeys>,
        counters: Arc<OpCounters>,
        dedup: Arc<Dedup>,
    ) -> io::Result<UdpServer> {
        Self::spawn_with_group(addr, mem, keys, counters, dedup, None)
    }

    /// As [`UdpServer::spawn_with_dedup`], also answering group READs if `group` is
    /// given: the socket joins the multicast group (`IP_ADD_MEMBERSHIP`, which also
    /// makes the kernel send the IGMP report switches need) and answers READs sent to
    /// it from its own address (the reply's source is the node's address, chosen by the
    /// route back, as for any reply); WRITEs and atomics sent to the group, and
    /// datagrams to any other multicast address, are dropped unanswered. `addr` must be
    /// the wildcard address (0.0.0.0:PORT): a socket bound to one address never
    /// receives datagrams sent to a group.
    pub fn spawn_with_group(
        addr: SocketAddr,
        mem: Arc<dyn Words>,
        keys: Arc<ServerKeys>,
        counters: Arc<OpCounters>,
        dedup: Arc<Dedup>,
        group: Option<GroupJoin>,
    ) -> io::Result<UdpServer> {
        if let Some(g) = group {
            if !g.group.is_multicast() || !addr.ip().is_unspecified() || !addr.is_ipv4() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "group reads on {addr} for {}: need an IPv4 multicast group and a \
                         server on the wildcard address (0.0.0.0:PORT)",
                        g.group
                    ),
                ));
            }
        }
        let sock = UdpSocket::bind(addr)?;
        let local_addr = sock.local_addr()?;
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        if let Some(g) = group {
            sock.join_multicast_v4(&g.group, &g.iface)?;
            set_int_opt(&sock, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?;
            // Only the groups this socket joined (not every group the host joined).
            set_int_opt(&sock, libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, 0)?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        if let Some(g) = group {
            let thread = std::thread::Builder::new()
                .name("rmem-udp".into())
                .spawn(move || serve_with_group(&sock, &*mem, &keys, &counters, &dedup, g, &st))?;
            return Ok(UdpServer {
                local_addr,
                stop,
                thread: Some(thread),
            });
        }
        let thread = std::thread::Builder::new()
            .name("rmem-udp".into())
            .spawn(move || {
                let mut buf = vec![0u8; REQ_BYTES_MAX + 64];
                let mut reply = Vec::with_capacity(REP_BYTES_MAX);
                while !st.load(Ordering::Relaxed) {
                    for _ in 0..SERVER_BATCH_MAX {
                        let (n, peer) = match sock.recv_from(&mut buf) {
                            Ok(x) => x,
                            Err(_) => break,
                        };
                        let status = ops::execute(
                            mem.words(),
                            &keys,
                            &counters,
                            &dedup,
                            true,
                            &buf[..n],
                            &mut reply,
                        );
                        if !ops::silent(status) {
                            let _ = sock.send_to(&reply, peer);
                        }
                    }
                }
            })?;
        Ok(UdpServer {
            local_addr,
            stop,
            thread: Some(thread),
        })
    }
}

/// A multicast group a [`UdpServer`] answers READs on, and the local interface address
/// to join it on (`UNSPECIFIED`: the kernel's choice, by route).
#[derive(Debug, Clone, Copy)]
pub struct GroupJoin {
    pub group: std::net::Ipv4Addr,
    pub iface: std::net::Ipv4Addr,
}

fn set_int_opt(
    sock: &UdpSocket,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt with a valid int option value.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes of the control buffer that receives one `in_pktinfo` (CMSG_SPACE of it).
const PKTINFO_CMSG_BYTES: usize = 32;

/// A datagram's source and the destination address it was sent to (from `IP_PKTINFO`).
fn recv_with_dst(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, Option<std::net::Ipv4Addr>)> {
    use std::os::fd::AsRawFd;
    #[repr(C, align(8))]
    struct Ctl([u8; PKTINFO_CMSG_BYTES]);
    let mut ctl = Ctl([0; PKTINFO_CMSG_BYTES]);
    // SAFETY: plain data, all-zero valid.
    let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: plain data, all-zero valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.0.as_mut_ptr().cast();
    msg.msg_controllen = PKTINFO_CMSG_BYTES as _;
    // SAFETY: msg points to live buffers for the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let peer = farside_rt::sockaddr::from_storage(&from).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidData, "datagram from a non-IP address")
    })?;
    let mut dst = None;
    // SAFETY: the kernel filled msg's control buffer; the CMSG walk stays within
    // msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_PKTINFO {
                let info: libc::in_pktinfo = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                dst = Some(std::net::Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr)));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, peer, dst))
}

/// The server loop with group reads (see [`UdpServer::spawn_with_group`]).
fn serve_with_group(
    sock: &UdpSocket,
    mem: &dyn Words,
    keys: &ServerKeys,
    counters: &OpCounters,
    dedup: &Dedup,
    g: GroupJoin,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; REQ_BYTES_MAX + 64];
    let mut reply = Vec::with_capacity(REP_BYTES_MAX);
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..SERVER_BATCH_MAX {
            let Ok((n, peer, dst)) = recv_with_dst(sock, &mut buf) else {
                break;
            };
            let req = &buf[..n];
            if let Some(d) = dst.filter(|d| d.is_multicast()) {
                // To the group: READs only (a mutation is never applied by every node
                // at once); other groups: not ours.
                let read = req.len() > ENVELOPE_BYTES
                    && ReqHeader::decode(&req[ENVELOPE_BYTES..])
                        .is_ok_and(|h| h.op == Op::Read as u8);
                if d != g.group || !read {
                    continue;
                }
            }
            let status = ops::execute(mem.words(), keys, counters, dedup, true, req, &mut reply);
            if !ops::silent(status) {
                let _ = sock.send_to(&reply, peer);
            }
        }
    }
}

impl Drop for UdpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{seal_request, ClientKey, LabKeyset};
    use farside_region::HeapWords;
    use std::net::Ipv4Addr;

    const GROUP: Ipv4Addr = Ipv4Addr::new(239, 77, 1, 2);

    /// A server on 0.0.0.0 answering group READs of GROUP on loopback, word 40 = 5.
    fn server(group: Option<GroupJoin>) -> io::Result<(UdpServer, Arc<HeapWords>, LabKeyset)> {
        let mem = Arc::new(HeapWords::new(farside_region::REGION_WORDS));
        mem.words()[40].store(5, Ordering::Relaxed);
        let set = LabKeyset::generate();
        let s = UdpServer::spawn_with_group(
            "0.0.0.0:0".parse().unwrap(),
            mem.clone(),
            set.server(),
            Arc::new(OpCounters::default()),
            Arc::new(Dedup::new()),
            group,
        )?;
        Ok((s, mem, set))
    }

    /// A client socket whose multicast goes out on loopback.
    fn client() -> UdpSocket {
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        // SAFETY: setsockopt with an in_addr value.
        let lo = libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        };
        let rc = unsafe {
            use std::os::fd::AsRawFd;
            libc::setsockopt(
                c.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_MULTICAST_IF,
                (&lo as *const libc::in_addr).cast(),
                std::mem::size_of::<libc::in_addr>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        c
    }

    fn request(op: Op, seq: u64, key: &ClientKey, offset: u32, payload: &[u8]) -> Vec<u8> {
        let mut covered = Vec::new();
        encode_request(
            &mut covered,
            &ReqHeader {
                op: op as u8,
                seq,
                offset,
                len: 8,
                ..Default::default()
            },
            payload,
        );
        let mut b = Vec::new();
        seal_request(&mut b, key, 9, seq, &covered);
        if op == Op::Read {
            b.resize(b.len().max(ENVELOPE_BYTES + REP_HEADER_BYTES + 8), 0);
        }
        b
    }

    /// The reply to `req` sent to `to`: (source, seq, payload word) or None.
    fn ask(c: &UdpSocket, to: SocketAddr, req: &[u8]) -> Option<(SocketAddr, u64, u64)> {
        c.send_to(req, to).unwrap();
        let mut buf = [0u8; 512];
        let (n, from) = c.recv_from(&mut buf).ok()?;
        let h = RepHeader::decode(&buf[ENVELOPE_BYTES..n]).unwrap();
        let word = if n >= ENVELOPE_BYTES + REP_HEADER_BYTES + 8 {
            u64_at(&buf[..n], ENVELOPE_BYTES + REP_HEADER_BYTES)
        } else {
            0
        };
        Some((from, h.seq, word))
    }

    #[test]
    fn group_reads_are_answered_from_the_servers_own_address_and_group_writes_dropped() {
        let lo = Ipv4Addr::LOCALHOST;
        let (s, mem, set) = server(Some(GroupJoin {
            group: GROUP,
            iface: lo,
        }))
        .unwrap();
        let port = s.local_addr.port();
        let (group, own) = (
            SocketAddr::from((GROUP, port)),
            SocketAddr::from((lo, port)),
        );
        let c = client();
        let rep = ask(&c, group, &request(Op::Read, 1, &set.reader, 320, &[]));
        assert_eq!(
            rep,
            Some((own, 1, 5)),
            "from the node's address, not the group's"
        );
        // Mutations to the group: dropped, memory untouched; the same unicast applies.
        let cas = [5u64.to_le_bytes(), 9u64.to_le_bytes()].concat();
        let write = request(Op::CompareSwap, 2, &set.balancer, 320, &cas);
        assert_eq!(ask(&c, group, &write), None);
        let fadd = request(Op::FetchAdd, 3, &set.balancer, 320, &1u64.to_le_bytes());
        assert_eq!(ask(&c, group, &fadd), None);
        assert_eq!(mem.words()[40].load(Ordering::Relaxed), 5);
        assert!(ask(
            &c,
            own,
            &request(Op::CompareSwap, 4, &set.balancer, 320, &cas)
        )
        .is_some());
        assert_eq!(mem.words()[40].load(Ordering::Relaxed), 9);
    }

    #[test]
    fn a_group_server_needs_a_multicast_group_and_the_wildcard_address() {
        let g = |group| {
            Some(GroupJoin {
                group,
                iface: Ipv4Addr::UNSPECIFIED,
            })
        };
        let e = server(g(Ipv4Addr::new(10, 0, 0, 1))).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let mem = Arc::new(HeapWords::new(farside_region::REGION_WORDS));
        let e = UdpServer::spawn_with_group(
            "127.0.0.1:0".parse().unwrap(),
            mem,
            LabKeyset::generate().server(),
            Arc::new(OpCounters::default()),
            Arc::new(Dedup::new()),
            g(GROUP),
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("wildcard"), "{e}");
    }
}
