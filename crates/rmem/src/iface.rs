//! The interface every transport implements ([`RemoteMemory`], [`RmemError`],
//! [`ClientOptions`]) and the request codec the message-based ones share ([`Codec`],
//! [`Exchange`]). Transports (`client`'s shm and tcp, `udp`) depend on this module and
//! never on each other.

use crate::auth::{open_reply, seal_request, ClientKey, SenderState};
use crate::wire::*;
use std::fmt;
use std::io;
use std::time::Duration;

/// Why a remote-memory operation failed.
#[derive(Debug)]
pub enum RmemError {
    /// No reply within the timeout. For WRITE, CAS and FETCH-ADD the outcome is unknown:
    /// the operation may or may not have been applied.
    Timeout,
    /// The server answered with a refusal.
    Refused(Status),
    /// Connection or socket error.
    Io(io::Error),
    /// The reply did not match the request (wrong seq/op/length) or was malformed.
    Protocol(String),
}

impl fmt::Display for RmemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RmemError::Timeout => f.write_str("timed out"),
            RmemError::Refused(s) => write!(f, "refused: {}", s.name()),
            RmemError::Io(e) => write!(f, "{e}"),
            RmemError::Protocol(m) => write!(f, "protocol error: {m}"),
        }
    }
}

impl std::error::Error for RmemError {}

impl From<io::Error> for RmemError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => RmemError::Timeout,
            _ => RmemError::Io(e),
        }
    }
}

/// One-sided access to a region. Offsets and lengths are bytes, multiples of 8.
///
/// Semantics, the same over every transport: an operation that returns `Ok` was applied
/// exactly once and its answer is the one true answer (a CAS reports the value it saw
/// when it was applied, even if the reply that reached the caller is a retry's). An
/// operation that returns an error was applied at most once: `Timeout`, `Io` and
/// `Refused(Status::Unknown)` mean it may have been applied; every other `Refused`
/// means it was not. Retries inside a transport carry the same (client id, seq), and
/// servers apply a mutation at most once per (client id, seq) (`ops::Dedup`, and the
/// same table in the XDP program), so a lost reply, a duplicated request or a request
/// delayed past a newer one never applies an operation twice or out of order.
///
/// What an operation may do is its key's rights (`farside_auth::rights`): words the
/// node's agent owns are refused with `Protected`, anything else not granted with
/// `ReadOnly`.
pub trait RemoteMemory: Send {
    fn read(&mut self, offset: usize, buf: &mut [u8]) -> Result<(), RmemError>;
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RmemError>;
    /// Atomically: if the word at `offset` equals `expected`, set it to `new`. Returns the
    /// word's previous value (equal to `expected` iff the swap happened).
    fn compare_swap(&mut self, offset: usize, expected: u64, new: u64) -> Result<u64, RmemError>;
    /// Atomically add `delta` (wrapping) to the word at `offset`; returns the old value.
    fn fetch_add(&mut self, offset: usize, delta: u64) -> Result<u64, RmemError>;
    /// `shm`, `tcp`, `udp`.
    fn transport(&self) -> &'static str;
}

/// How to connect.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The key requests are sealed with (tcp, udp; `crate::auth`): required for them,
    /// unused by shm. Default: none.
    pub key: Option<ClientKey>,
    /// Timeout of one operation (connect included for tcp). Default 50 ms.
    pub timeout: Duration,
    /// Poll the socket for the reply for up to this long before sleeping in the kernel,
    /// as an RDMA client polls its completion queue: the reader's own wake-up then stays
    /// out of the round trip. Costs the reader's CPU while it waits; tcp and udp clients
    /// poll alike. Default 0: sleep at once.
    pub spin: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            key: None,
            timeout: Duration::from_millis(50),
            spin: Duration::ZERO,
        }
    }
}

impl ClientOptions {
    /// The options' key, or the error a tcp or udp client without one gets.
    pub fn require_key(&self) -> Result<ClientKey, RmemError> {
        self.key.ok_or_else(|| {
            RmemError::Protocol(
                "no rmem key: tcp and udp requests are authenticated (--rmem-key ID:PATH, or \
                 ?key=ID:PATH on the region)"
                    .into(),
            )
        })
    }
}

/// Poll `sock` (non-blocking peek) until it has something to read, an error is pending,
/// or `spin` has passed; the caller's blocking receive then returns at once or sleeps.
pub(crate) fn spin_until_readable(sock: &impl std::os::fd::AsRawFd, spin: Duration) {
    if spin.is_zero() {
        return;
    }
    let fd = sock.as_raw_fd();
    let start = std::time::Instant::now();
    let mut b = 0u8;
    loop {
        // SAFETY: one valid byte of buffer; MSG_PEEK leaves the data for the real read.
        let n = unsafe {
            libc::recv(
                fd,
                (&mut b as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        let would_block = n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock;
        if !would_block || start.elapsed() >= spin {
            return;
        }
        std::hint::spin_loop();
    }
}

/// Build a request, run it through `exchange`, and decode the reply. Shared by every
/// message-based transport (tcp, udp, and shm which executes in place without an
/// envelope: `key` is `None` there).
pub(crate) struct Codec {
    /// The request as sent: envelope, covered bytes, padding.
    pub(crate) req: Vec<u8>,
    /// The reply as received.
    pub(crate) rep: Vec<u8>,
    /// The request's covered bytes (header and payload).
    pub(crate) covered: Vec<u8>,
    /// The operation's sequence number (retries repeat it).
    seq: u64,
    key: Option<ClientKey>,
    env: SenderState,
    /// Envelope seqs of the current operation's first and latest attempt: a reply is
    /// bound to one of them.
    attempts: (u64, u64),
    /// Total length READ requests are padded to (0: none).
    pad_to: usize,
    /// The region every request names: 0 (the control region) unless set
    /// ([`crate::udp::UdpClient::set_region`]: an object arena's chunks).
    pub(crate) region: u32,
}

impl Codec {
    pub(crate) fn new(key: Option<ClientKey>) -> Self {
        Codec {
            req: Vec::with_capacity(REQ_BYTES_MAX),
            rep: Vec::with_capacity(REP_BYTES_MAX),
            covered: Vec::with_capacity(REQ_BYTES_MAX),
            seq: crate::random_u64(),
            key,
            env: SenderState::new(),
            attempts: (0, 0),
            pad_to: 0,
            region: 0,
        }
    }

    /// This client's id (the envelope's sender; servers detect duplicates per sender).
    pub(crate) fn client(&self) -> u64 {
        self.env.sender
    }

    /// Seal `covered` into `req` with a new envelope seq (or copy it: no key).
    fn seal(&mut self) {
        match &self.key {
            Some(k) => {
                let s = self.env.next_seq();
                self.attempts.1 = s;
                seal_request(&mut self.req, k, self.env.sender, s, &self.covered);
            }
            None => {
                self.req.clear();
                self.req.extend_from_slice(&self.covered);
            }
        }
        if self.req.len() < self.pad_to {
            self.req.resize(self.pad_to, 0);
        }
    }

    /// Mark the request as a retry of the same (client, op seq): sealed again, with a
    /// new envelope seq (servers refuse a copy of the first datagram as replayed).
    pub(crate) fn mark_retry(&mut self) {
        let flags = u16::from_le_bytes([self.covered[6], self.covered[7]]) | FLAG_RETRY;
        self.covered[6..8].copy_from_slice(&flags.to_le_bytes());
        self.seal();
    }

    pub(crate) fn next_seq(&mut self) -> u64 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Pad the request with zeros up to `total` bytes (servers ignore bytes after the
    /// covered ones), this attempt and its retries.
    pub(crate) fn pad_request(&mut self, total: usize) {
        self.pad_to = total;
        if self.req.len() < total {
            self.req.resize(total, 0);
        }
    }

    /// The length field of the encoded request.
    pub(crate) fn request_len(&self) -> usize {
        u32::from_le_bytes(self.covered[24..28].try_into().expect("header")) as usize
    }

    /// Encode request `op` with a new sequence number and seal it; returns the op seq.
    pub(crate) fn encode(
        &mut self,
        op: Op,
        offset: usize,
        len: usize,
        payload: &[u8],
    ) -> Result<u64, RmemError> {
        let offset = u32::try_from(offset).map_err(|_| RmemError::Refused(Status::OutOfBounds))?;
        let len = u32::try_from(len).map_err(|_| RmemError::Refused(Status::BadLength))?;
        let seq = self.next_seq();
        encode_request(
            &mut self.covered,
            &ReqHeader {
                op: op as u8,
                flags: 0,
                seq,
                region: self.region,
                offset,
                len,
            },
            payload,
        );
        self.pad_to = 0;
        self.seal();
        self.attempts.0 = self.attempts.1;
        Ok(seq)
    }

    /// The reply's covered bytes if it is authentic and answers one of this operation's
    /// attempts (any reply without a key: shm).
    fn opened_reply(&self) -> Result<&[u8], RmemError> {
        match &self.key {
            Some(k) => open_reply(
                &self.rep,
                k,
                self.env.sender,
                self.attempts.0..=self.attempts.1,
            )
            .map_err(|r| RmemError::Protocol(format!("reply refused: {r:?}"))),
            None => Ok(&self.rep),
        }
    }

    /// Whether the reply in `self.rep` is authentic and answers op seq `seq` (udp
    /// clients skip any other datagram: late replies, forgeries).
    pub(crate) fn reply_answers(&self, seq: u64) -> bool {
        self.opened_reply()
            .ok()
            .and_then(|b| RepHeader::decode(b).ok())
            .is_some_and(|h| h.seq == seq)
    }

    /// Validate the reply in `self.rep` against request (op, seq) and return its payload.
    pub(crate) fn check_reply(
        &self,
        op: Op,
        seq: u64,
        want_len: usize,
    ) -> Result<&[u8], RmemError> {
        let b = self.opened_reply()?;
        let h = RepHeader::decode(b).map_err(|_| RmemError::Protocol("malformed reply".into()))?;
        if h.seq != seq || h.op != op as u8 {
            return Err(RmemError::Protocol(format!(
                "reply for seq {} op {}, expected seq {seq} op {}",
                h.seq, h.op, op as u8
            )));
        }
        if h.status != Status::Ok {
            return Err(RmemError::Refused(h.status));
        }
        let body = &b[REP_HEADER_BYTES..];
        if h.len as usize != want_len || body.len() < want_len {
            return Err(RmemError::Protocol(format!(
                "reply carries {} bytes, expected {want_len}",
                body.len()
            )));
        }
        Ok(&body[..want_len])
    }

    pub(crate) fn req(&self) -> &[u8] {
        &self.req
    }

    pub(crate) fn rep_mut(&mut self) -> &mut Vec<u8> {
        &mut self.rep
    }
}

/// Implements the four operations of [`RemoteMemory`] on top of one `exchange` method
/// that sends `codec.req()` and leaves the reply in `codec.rep_mut()`.
pub(crate) trait Exchange {
    fn codec(&mut self) -> &mut Codec;
    /// Send the encoded request (sequence `seq`) and receive its reply.
    fn exchange(&mut self, op: Op, seq: u64) -> Result<(), RmemError>;

    fn op(
        &mut self,
        op: Op,
        offset: usize,
        len: usize,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<(), RmemError> {
        let seq = self.codec().encode(op, offset, len, payload)?;
        self.exchange(op, seq)?;
        let want = out.len();
        let body = self.codec().check_reply(op, seq, want)?;
        out.copy_from_slice(body);
        Ok(())
    }

    fn ex_read(&mut self, offset: usize, buf: &mut [u8]) -> Result<(), RmemError> {
        let len = buf.len();
        self.op(Op::Read, offset, len, &[], buf)
    }

    fn ex_write(&mut self, offset: usize, data: &[u8]) -> Result<(), RmemError> {
        self.op(Op::Write, offset, data.len(), data, &mut [])
    }

    fn ex_compare_swap(
        &mut self,
        offset: usize,
        expected: u64,
        new: u64,
    ) -> Result<u64, RmemError> {
        let mut p = [0u8; 16];
        p[..8].copy_from_slice(&expected.to_le_bytes());
        p[8..].copy_from_slice(&new.to_le_bytes());
        let mut old = [0u8; 8];
        self.op(Op::CompareSwap, offset, 8, &p, &mut old)?;
        Ok(u64::from_le_bytes(old))
    }

    fn ex_fetch_add(&mut self, offset: usize, delta: u64) -> Result<u64, RmemError> {
        let mut old = [0u8; 8];
        self.op(Op::FetchAdd, offset, 8, &delta.to_le_bytes(), &mut old)?;
        Ok(u64::from_le_bytes(old))
    }
}
