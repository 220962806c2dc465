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

use crate::iface::{ClientOptions, Codec, Exchange, RmemError};
use crate::ops::{self, AccessKeys, Dedup, OpCounters};
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
        let codec = Codec::new(opts.key);
        Ok(UdpClient {
            sock,
            opts,
            codec,
            tries: UDP_TRIES,
            drop_next_sends: 0,
        })
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
        let rep = self.codec.rep_mut();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RmemError::Timeout);
            }
            self.sock.set_read_timeout(Some(left))?;
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
            match RepHeader::decode(rep) {
                Ok(h) if h.seq == seq => return Ok(()),
                _ => continue, // a late reply to an earlier attempt, or junk
            }
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
            let len =
                u32::from_le_bytes(self.codec.req()[32..36].try_into().expect("header")) as usize;
            self.codec.pad_request(REP_HEADER_BYTES + len);
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
/// Bad keys, malformed requests and stale duplicates are dropped without a reply, like
/// the XDP program does; READs must be padded to their reply's size (no reflection).
pub struct UdpServer {
    pub local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UdpServer {
    pub fn spawn(
        addr: SocketAddr,
        mem: Arc<dyn Words>,
        keys: AccessKeys,
        counters: Arc<OpCounters>,
    ) -> io::Result<UdpServer> {
        Self::spawn_with_dedup(addr, mem, keys, counters, Arc::new(Dedup::new()))
    }

    /// As [`UdpServer::spawn`], sharing duplicate detection with other servers of the
    /// same memory (gatherd's tcp server).
    pub fn spawn_with_dedup(
        addr: SocketAddr,
        mem: Arc<dyn Words>,
        keys: AccessKeys,
        counters: Arc<OpCounters>,
        dedup: Arc<Dedup>,
    ) -> io::Result<UdpServer> {
        let sock = UdpSocket::bind(addr)?;
        let local_addr = sock.local_addr()?;
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
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

impl Drop for UdpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
