//! The client interface and the `shm` and `tcp` transports.

use crate::ops::{self, AccessKeys, Dedup, OpCounters, Perm};
use crate::wire::*;
use crate::Endpoint;
use farside_region::{MappedWords, Words, REGION_WORDS};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
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
/// WRITE, CAS and FETCH-ADD may only change the control words of the region
/// (`farside_region::layout::WRITABLE_*`); elsewhere they are refused with `Protected`.
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

/// Well-known read-only key used when none is configured (loopback labs). Deployments
/// across hosts should set their own with `--read-key`.
pub const DEFAULT_READ_KEY: u64 = u64::from_le_bytes(*b"farside0");

/// How to connect.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub key: u64,
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
            key: DEFAULT_READ_KEY,
            timeout: Duration::from_millis(50),
            spin: Duration::ZERO,
        }
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

/// Open a client for a [`crate::Target`]: its own key if it names one, else `opts.key`.
pub fn connect_target(
    t: &crate::Target,
    opts: &ClientOptions,
) -> Result<Box<dyn RemoteMemory>, RmemError> {
    match t.key {
        Some(key) => connect(
            &t.endpoint,
            &ClientOptions {
                key,
                ..opts.clone()
            },
        ),
        None => connect(&t.endpoint, opts),
    }
}

/// Open a client for `ep`.
pub fn connect(ep: &Endpoint, opts: &ClientOptions) -> Result<Box<dyn RemoteMemory>, RmemError> {
    Ok(match ep {
        Endpoint::Shm(path) => Box::new(ShmClient::open(path)?),
        Endpoint::Tcp(addr) => Box::new(TcpClient::new(*addr, opts.clone())),
        Endpoint::Udp(addr) => Box::new(crate::udp::UdpClient::new(*addr, opts.clone())?),
    })
}

/// Build a request, run it through `exchange`, and decode the reply. Shared by every
/// message-based transport (tcp, udp, and shm which executes in place).
pub(crate) struct Codec {
    req: Vec<u8>,
    rep: Vec<u8>,
    seq: u64,
    key: u64,
    /// Random, never 0: servers detect duplicates per (client, seq).
    client: u64,
}

impl Codec {
    pub(crate) fn new(key: u64) -> Self {
        Codec {
            req: Vec::with_capacity(REQ_BYTES_MAX),
            rep: Vec::with_capacity(REP_BYTES_MAX),
            seq: crate::random_u64(),
            key,
            client: crate::random_u64().max(1),
        }
    }

    /// Mark the encoded request as a retry of the same (client, seq).
    pub(crate) fn mark_retry(&mut self) {
        let flags = u16::from_le_bytes([self.req[6], self.req[7]]) | FLAG_RETRY;
        self.req[6..8].copy_from_slice(&flags.to_le_bytes());
    }

    pub(crate) fn next_seq(&mut self) -> u64 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Pad the last encoded request with zeros up to `total` bytes (servers ignore bytes
    /// after the payload).
    pub(crate) fn pad_request(&mut self, total: usize) {
        if self.req.len() < total {
            self.req.resize(total, 0);
        }
    }

    /// Encode request `op` into `self.req` with a new sequence number; returns it.
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
            &mut self.req,
            &ReqHeader {
                op: op as u8,
                flags: 0,
                seq,
                key: self.key,
                region: 0,
                offset,
                len,
                client: self.client,
            },
            payload,
        );
        Ok(seq)
    }

    /// Validate the reply in `self.rep` against request (op, seq) and return its payload.
    pub(crate) fn check_reply(
        &self,
        op: Op,
        seq: u64,
        want_len: usize,
    ) -> Result<&[u8], RmemError> {
        let h = RepHeader::decode(&self.rep)
            .map_err(|_| RmemError::Protocol("malformed reply".into()))?;
        if h.seq != seq || h.op != op as u8 {
            return Err(RmemError::Protocol(format!(
                "reply for seq {} op {}, expected seq {seq} op {}",
                h.seq, h.op, op as u8
            )));
        }
        if h.status != Status::Ok {
            return Err(RmemError::Refused(h.status));
        }
        let body = &self.rep[REP_HEADER_BYTES..];
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

macro_rules! remote_memory_via_exchange {
    ($t:ty, $name:expr) => {
        impl $crate::client::RemoteMemory for $t {
            fn read(
                &mut self,
                offset: usize,
                buf: &mut [u8],
            ) -> Result<(), $crate::client::RmemError> {
                $crate::client::Exchange::ex_read(self, offset, buf)
            }
            fn write(
                &mut self,
                offset: usize,
                data: &[u8],
            ) -> Result<(), $crate::client::RmemError> {
                $crate::client::Exchange::ex_write(self, offset, data)
            }
            fn compare_swap(
                &mut self,
                offset: usize,
                expected: u64,
                new: u64,
            ) -> Result<u64, $crate::client::RmemError> {
                $crate::client::Exchange::ex_compare_swap(self, offset, expected, new)
            }
            fn fetch_add(
                &mut self,
                offset: usize,
                delta: u64,
            ) -> Result<u64, $crate::client::RmemError> {
                $crate::client::Exchange::ex_fetch_add(self, offset, delta)
            }
            fn transport(&self) -> &'static str {
                $name
            }
        }
    };
}

/// Map `n` words of the region at `path`: a region file, or (when gatherd runs the XDP
/// responder) the Unix socket at which gatherd hands out the BPF map's fd
/// ([`crate::fdshare`]), so a shm reader operates on the same words the kernel answers
/// udp requests from.
pub fn map_region(path: &std::path::Path, n: usize) -> io::Result<MappedWords> {
    use std::os::unix::fs::FileTypeExt;
    if !std::fs::metadata(path)?.file_type().is_socket() {
        return MappedWords::open_file(path, n);
    }
    let fd = crate::fdshare::receive_fd(path)?;
    let r = MappedWords::map_fd(fd, n);
    // SAFETY: fd is ours; the mapping keeps the memory alive without it.
    unsafe { libc::close(fd) };
    r
}

/// Same-host transport: the region file (or the XDP region map, see [`map_region`]) mapped into this
/// process. Operations run in place with the same checks as every server
/// (`ops::execute`), so semantics match.
pub struct ShmClient {
    mem: MappedWords,
    /// The region's path and the identity (device, inode) of what was mapped: a
    /// restarted gatherd with XDP serves a new map at a new socket, so the client
    /// re-maps when the path names something else (checked every `SHM_RECHECK`).
    path: std::path::PathBuf,
    mapped_id: (u64, u64),
    checked: std::time::Instant,
    keys: AccessKeys,
    counters: OpCounters,
    /// Never consulted in earnest (a local operation cannot be lost), kept so that
    /// `ops::execute` runs exactly as in every server.
    dedup: Dedup,
    codec: Codec,
}

/// How often a shm client checks that its path still names what it mapped: well under
/// the proxy's default staleness bound (100 ms), one `stat` per period.
pub const SHM_RECHECK: Duration = Duration::from_millis(50);

fn path_id(path: &std::path::Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

impl ShmClient {
    pub fn open(path: &std::path::Path) -> Result<Self, RmemError> {
        let with_path = |e: io::Error| {
            RmemError::Io(io::Error::new(e.kind(), format!("{}: {e}", path.display())))
        };
        let mapped_id = path_id(path).map_err(with_path)?;
        let mem = map_region(path, REGION_WORDS).map_err(with_path)?;
        // Local mapping: whoever can open the file may do everything.
        let keys = AccessKeys::new().with(DEFAULT_READ_KEY, Perm::ReadWrite);
        Ok(ShmClient {
            mem,
            path: path.to_path_buf(),
            mapped_id,
            checked: std::time::Instant::now(),
            keys,
            counters: OpCounters::default(),
            dedup: Dedup::new(),
            codec: Codec::new(DEFAULT_READ_KEY),
        })
    }

    /// The mapped words, for readers that decode in place without copying.
    pub fn words(&self) -> &dyn Words {
        &self.mem
    }
}

impl Exchange for ShmClient {
    fn codec(&mut self) -> &mut Codec {
        &mut self.codec
    }
    fn exchange(&mut self, _op: Op, _seq: u64) -> Result<(), RmemError> {
        if self.checked.elapsed() >= SHM_RECHECK {
            self.checked = std::time::Instant::now();
            // Gone: keep the old mapping (its record goes stale, which readers see).
            if let Ok(id) = path_id(&self.path) {
                if id != self.mapped_id {
                    if let Ok(m) = map_region(&self.path, REGION_WORDS) {
                        self.mem = m;
                        self.mapped_id = id;
                    }
                }
            }
        }
        let ShmClient {
            mem,
            keys,
            counters,
            dedup,
            codec,
            ..
        } = self;
        let req = std::mem::take(&mut codec.req);
        ops::execute(
            mem.words(),
            keys,
            counters,
            dedup,
            false,
            &req,
            &mut codec.rep,
        );
        codec.req = req;
        Ok(())
    }
}
remote_memory_via_exchange!(ShmClient, "shm");

/// Attempts per tcp operation: the first, and one more on a fresh connection if the first
/// connection failed before its reply arrived (the server replays a mutation it already
/// applied, so the retry is safe for every op).
pub const TCP_TRIES: u32 = 2;

/// Two-sided baseline: one TCP connection to the gatherer, which reads each request and
/// answers it from user space. After an error the connection is dropped and the
/// operation retried once on a new one (`TCP_TRIES`).
pub struct TcpClient {
    addr: SocketAddr,
    opts: ClientOptions,
    conn: Option<TcpStream>,
    codec: Codec,
}

impl TcpClient {
    pub fn new(addr: SocketAddr, opts: ClientOptions) -> Self {
        let codec = Codec::new(opts.key);
        TcpClient {
            addr,
            opts,
            conn: None,
            codec,
        }
    }

    fn stream(&mut self) -> Result<&mut TcpStream, RmemError> {
        if self.conn.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, self.opts.timeout)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(self.opts.timeout))?;
            s.set_write_timeout(Some(self.opts.timeout))?;
            self.conn = Some(s);
        }
        Ok(self.conn.as_mut().expect("just set"))
    }

    fn try_exchange(&mut self) -> Result<(), RmemError> {
        let req = std::mem::take(&mut self.codec.req);
        let r = (|| {
            self.stream()?;
            let s = self.conn.as_mut().expect("stream() connected");
            s.write_all(&req)?;
            spin_until_readable(s, self.opts.spin.min(self.opts.timeout));
            let rep = &mut self.codec.rep;
            rep.resize(REP_HEADER_BYTES, 0);
            s.read_exact(&mut rep[..REP_HEADER_BYTES])?;
            let h = RepHeader::decode(rep)
                .map_err(|_| RmemError::Protocol("malformed reply header".into()))?;
            let n = h.len as usize;
            if n > OP_BYTES_MAX {
                return Err(RmemError::Protocol(format!(
                    "reply length {n} over {OP_BYTES_MAX}"
                )));
            }
            rep.resize(REP_HEADER_BYTES + n, 0);
            s.read_exact(&mut rep[REP_HEADER_BYTES..])?;
            Ok(())
        })();
        self.codec.req = req;
        r
    }
}

impl Exchange for TcpClient {
    fn codec(&mut self) -> &mut Codec {
        &mut self.codec
    }
    fn exchange(&mut self, _op: Op, _seq: u64) -> Result<(), RmemError> {
        let mut last = RmemError::Timeout;
        for attempt in 0..TCP_TRIES {
            if attempt > 0 {
                self.codec.mark_retry();
            }
            match self.try_exchange() {
                Ok(()) => return Ok(()),
                Err(e @ RmemError::Protocol(_)) => {
                    self.conn = None;
                    return Err(e);
                }
                Err(e) => {
                    // The stream may hold a partial reply: never reuse it.
                    self.conn = None;
                    last = e;
                }
            }
        }
        Err(last)
    }
}
remote_memory_via_exchange!(TcpClient, "tcp");
