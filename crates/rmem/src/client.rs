//! Opening a client for an endpoint ([`connect`]), and the `shm` and `tcp` transports.
//! The interface they implement is in `iface`; `udp` is its own module.

use crate::iface::{spin_until_readable, Codec, Exchange};
pub use crate::iface::{ClientOptions, RemoteMemory, RmemError};
use crate::ops::{self, Dedup, OpCounters};
use crate::wire::*;
use crate::Endpoint;
use farside_region::{MappedWords, Words, REGION_WORDS};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Open a client for a [`crate::Target`]: its own key if it names one (loaded from its
/// file now), else `opts.key`.
pub fn connect_target(
    t: &crate::Target,
    opts: &ClientOptions,
) -> Result<Box<dyn RemoteMemory>, RmemError> {
    connect(&t.endpoint, &t.options(opts).map_err(RmemError::Protocol)?)
}

/// Open a client for `ep`.
pub fn connect(ep: &Endpoint, opts: &ClientOptions) -> Result<Box<dyn RemoteMemory>, RmemError> {
    Ok(match ep {
        Endpoint::Shm(path) => Box::new(ShmClient::open(path)?),
        Endpoint::Tcp(addr) => Box::new(TcpClient::new(*addr, opts.clone())?),
        Endpoint::Udp(addr) => Box::new(crate::udp::UdpClient::new(*addr, opts.clone())?),
    })
}

/// Implements [`RemoteMemory`] for a transport through its [`Exchange`].
macro_rules! remote_memory_via_exchange {
    ($t:ty, $name:expr) => {
        impl $crate::iface::RemoteMemory for $t {
            fn read(
                &mut self,
                offset: usize,
                buf: &mut [u8],
            ) -> Result<(), $crate::iface::RmemError> {
                $crate::iface::Exchange::ex_read(self, offset, buf)
            }
            fn write(
                &mut self,
                offset: usize,
                data: &[u8],
            ) -> Result<(), $crate::iface::RmemError> {
                $crate::iface::Exchange::ex_write(self, offset, data)
            }
            fn compare_swap(
                &mut self,
                offset: usize,
                expected: u64,
                new: u64,
            ) -> Result<u64, $crate::iface::RmemError> {
                $crate::iface::Exchange::ex_compare_swap(self, offset, expected, new)
            }
            fn fetch_add(
                &mut self,
                offset: usize,
                delta: u64,
            ) -> Result<u64, $crate::iface::RmemError> {
                $crate::iface::Exchange::ex_fetch_add(self, offset, delta)
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
    // lstat: a symlink goes to open_file, which refuses it.
    if !std::fs::symlink_metadata(path)?.file_type().is_socket() {
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
/// (`ops::execute_local`, with `crate::auth::local_rights`), so semantics match.
pub struct ShmClient {
    mem: MappedWords,
    /// The region's path and the identity (device, inode) of what was mapped: a
    /// restarted gatherd with XDP serves a new map at a new socket, so the client
    /// re-maps when the path names something else (checked every `SHM_RECHECK`).
    path: std::path::PathBuf,
    mapped_id: (u64, u64),
    checked: std::time::Instant,
    rights: farside_auth::rights::Rights,
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
        // Local mapping: whoever can open the file may do what a remote key at most may.
        Ok(ShmClient {
            mem,
            path: path.to_path_buf(),
            mapped_id,
            checked: std::time::Instant::now(),
            rights: crate::auth::local_rights(),
            counters: OpCounters::default(),
            dedup: Dedup::new(),
            codec: Codec::new(None),
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
            rights,
            counters,
            dedup,
            codec,
            ..
        } = self;
        let req = std::mem::take(&mut codec.req);
        let client = codec.client();
        ops::execute_local(
            mem.words(),
            rights,
            client,
            counters,
            dedup,
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
    /// A client whose requests are sealed with `opts.key` (required).
    pub fn new(addr: SocketAddr, opts: ClientOptions) -> Result<Self, RmemError> {
        let codec = Codec::new(Some(opts.require_key()?));
        Ok(TcpClient {
            addr,
            opts,
            conn: None,
            codec,
        })
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
            // The envelope says how many covered bytes follow; the tag is checked after.
            let rep = &mut self.codec.rep;
            rep.resize(ENVELOPE_BYTES, 0);
            s.read_exact(&mut rep[..ENVELOPE_BYTES])?;
            let n = u32::from_le_bytes(rep[12..16].try_into().expect("4 bytes")) as usize;
            if !(REP_HEADER_BYTES..=REP_HEADER_BYTES + OP_BYTES_MAX).contains(&n) {
                return Err(RmemError::Protocol(format!(
                    "reply length {n} outside {REP_HEADER_BYTES}..={}",
                    REP_HEADER_BYTES + OP_BYTES_MAX
                )));
            }
            rep.resize(ENVELOPE_BYTES + n, 0);
            s.read_exact(&mut rep[ENVELOPE_BYTES..])?;
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
