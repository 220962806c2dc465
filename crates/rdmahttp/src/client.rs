//! The client side: one GET, asking for its body by RDMA if told to, taking it over
//! TCP whenever the server answers that way.
//!
//! ```text
//!  connect HTTP ─ listen for RDMA on the HTTP connection's local address ─ register
//!  (server-writes: a sink of maxlen, REMOTE_WRITE; a receive for the length) ─ GET with
//!  `RDMA:` ─ accept the server's RDMA connection (a thread) while reading the answer:
//!    RDMA: server-writes, len   wait for the Send behind the Write, then the body is
//!                               the sink's first len bytes
//!    RDMA: client-reads, ...    Read stag/to/len into a local region, Send done
//!    anything else              the body is the HTTP body; stop accepting
//! ```

use crate::header::{self, Decline, Mode, Response};
use farside_iwarp::qp::{Qp, QpConfig, RecvWr, SendWr, Sge};
use farside_iwarp::tcp::Endpoint;
use farside_iwarp::verbs::{Access, Cq, Device, PdId, WcOpcode, WcStatus, MR_BYTES_MAX};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest response head read.
const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Header fields parsed in a response head.
const HEADERS_MAX: usize = 64;
/// Largest body taken over TCP (the whole body is held in memory).
pub const TCP_BODY_BYTES_MAX: u64 = 1 << 30;
/// Largest region the software iWARP stack registers, bytes: the largest body taken
/// by RDMA.
pub const REGION_BYTES_MAX: usize = MR_BYTES_MAX;
/// How often the accepting thread looks for the server's connection or a cancel.
const ACCEPT_POLL: Duration = Duration::from_millis(1);
pub(crate) const CQ_DEPTH: usize = 16;
pub(crate) const WR_RECV: u64 = 1;
const WR_READ: u64 = 2;
const WR_DONE: u64 = 3;

/// How one GET is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetOptions {
    /// Ask for the body by RDMA, and how.
    pub mode: Option<Mode>,
    /// Largest body taken by RDMA (server-writes: the sink region's size).
    pub maxlen: u64,
    /// Bound on each wait: connect, answer, RDMA completion.
    pub timeout: Duration,
}

/// How the body came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Over the HTTP connection; with the server's reason if RDMA was asked for and
    /// the server said why not.
    Tcp(Option<Decline>),
    ServerWrites,
    ClientReads,
    /// Read one-sidedly from the server's kernel-answered object arena.
    ArenaReads,
    /// Resolved and read one-sidedly from the arena under a grant, with no HTTP
    /// request (`crate::grant`).
    ArenaDirect,
}

impl Via {
    pub fn token(self) -> &'static str {
        match self {
            Via::Tcp(_) => "tcp",
            Via::ServerWrites => "server-writes",
            Via::ClientReads => "client-reads",
            Via::ArenaReads => "arena-reads",
            Via::ArenaDirect => "arena-direct",
        }
    }
}

/// One GET's outcome.
#[derive(Debug)]
pub struct Fetched {
    pub status: u16,
    pub body: Vec<u8>,
    pub via: Via,
}

/// `http://host[:port]/path` → (address, Host value, path).
pub fn parse_url(url: &str) -> io::Result<(SocketAddr, String, String)> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {m}"));
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("only http:// URLs"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    let with_port = if authority.ends_with(']') || !authority.contains(':') {
        format!("{authority}:80")
    } else {
        authority.to_string()
    };
    let addr = with_port
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| bad("host has no address"))?;
    Ok((addr, authority.to_string(), path.to_string()))
}

/// The RDMA side prepared before the request goes out.
struct Listening {
    field: String,
    pd: PdId,
    /// Server-writes: the sink region.
    sink: Option<u32>,
    note: u32,
    cancel: Arc<AtomicBool>,
    accept: JoinHandle<io::Result<Endpoint>>,
}

fn listen(http: &TcpStream, opts: &GetOptions, mode: Mode) -> io::Result<Listening> {
    let local = http.local_addr()?.ip();
    let listener = TcpListener::bind((local, 0))?;
    let endpoint = listener.local_addr()?;
    let mut dev = Device::with_random_keys();
    let pd = dev.alloc_pd().map_err(io::Error::other)?;
    let note = dev
        .reg_mr(pd, 0, 8, Access::LOCAL_WRITE)
        .map_err(io::Error::other)?;
    let qp = Qp::accept(pd, QpConfig::default());
    let mut qp = qp;
    let sink = match mode {
        Mode::ServerWrites => {
            let len = usize::try_from(opts.maxlen)
                .ok()
                .filter(|&n| (1..=MR_BYTES_MAX).contains(&n))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("maxlen must be in 1..={MR_BYTES_MAX} for server-writes"),
                    )
                })?;
            let sink = dev
                .reg_mr(pd, 0, len, Access::REMOTE_WRITE)
                .map_err(io::Error::other)?;
            // Posted before the connection exists: the server's Send may follow its
            // MPA set-up at once.
            qp.post_recv(RecvWr {
                wr_id: WR_RECV,
                sge: Sge {
                    stag: note,
                    to: 0,
                    len: 8,
                },
            })
            .map_err(io::Error::other)?;
            Some(sink)
        }
        Mode::ClientReads => None,
    };
    let field = header::Request {
        mode,
        endpoint,
        sink: sink.map(|s| (s, 0)),
        maxlen: opts.maxlen,
    }
    .to_string();
    let cancel = Arc::new(AtomicBool::new(false));
    let (stop, timeout) = (Arc::clone(&cancel), opts.timeout);
    let accept = std::thread::Builder::new()
        .name("rdma-accept".into())
        .spawn(move || {
            listener.set_nonblocking(true)?;
            let deadline = Instant::now() + timeout;
            let stream = loop {
                match listener.accept() {
                    Ok((s, _)) => break s,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if stop.load(Ordering::Acquire) || Instant::now() >= deadline {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                std::thread::sleep(ACCEPT_POLL);
            };
            stream.set_nonblocking(false)?;
            let cq = Cq::new(CQ_DEPTH).map_err(io::Error::other)?;
            Endpoint::start(stream, dev, cq, qp)
        })?;
    Ok(Listening {
        field,
        pd,
        sink,
        note,
        cancel,
        accept,
    })
}

/// GET `url`. An error is the client's own (bad URL, no connection, a malformed or
/// truncated answer, an RDMA transfer the server announced that did not arrive).
pub fn get(url: &str, opts: &GetOptions) -> io::Result<Fetched> {
    let (addr, host, path) = parse_url(url)?;
    let mut http = TcpStream::connect_timeout(&addr, opts.timeout)?;
    http.set_read_timeout(Some(opts.timeout))?;
    let rdma = opts.mode.map(|m| listen(&http, opts, m)).transpose()?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    if let Some(l) = &rdma {
        req.push_str(&format!("{}: {}\r\n", header::NAME, l.field));
    }
    req.push_str("\r\n");
    http.write_all(req.as_bytes())?;
    let Answer {
        status,
        field,
        body: tcp_body,
        ..
    } = read_response(&mut http)?;
    let answered = field.map(|f| header::parse_response(&f));
    let Some(l) = rdma else {
        return Ok(Fetched {
            status,
            body: tcp_body,
            via: Via::Tcp(None),
        });
    };
    match answered {
        Some(Ok(Response::ServerWrites { len })) => {
            let ep = join(l.accept)?;
            let body = take_written(&ep, l.sink, l.note, len, opts)?;
            Ok(Fetched {
                status,
                body,
                via: Via::ServerWrites,
            })
        }
        Some(Ok(Response::ClientReads { stag, to, len })) => {
            let ep = join(l.accept)?;
            let body = read_and_say_done(&ep, l.pd, l.note, stag, to, len, opts)?;
            Ok(Fetched {
                status,
                body,
                via: Via::ClientReads,
            })
        }
        other => {
            l.cancel.store(true, Ordering::Release);
            // A connection the server made before it declined is dropped here.
            let _ = l.accept.join();
            let reason = match other {
                Some(Ok(Response::Declined(d))) => Some(d),
                _ => None,
            };
            Ok(Fetched {
                status,
                body: tcp_body,
                via: Via::Tcp(reason),
            })
        }
    }
}

fn join(accept: JoinHandle<io::Result<Endpoint>>) -> io::Result<Endpoint> {
    accept
        .join()
        .map_err(|_| io::Error::other("rdma accept thread panicked"))?
        .map_err(|e| io::Error::new(e.kind(), format!("rdma connection: {e}")))
}

pub(crate) fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("rdma: no {what} in time"))
}

/// Server-writes: wait for the Send behind the Write, check the length, take the body.
pub(crate) fn take_written(
    ep: &Endpoint,
    sink: Option<u32>,
    note: u32,
    len: u64,
    opts: &GetOptions,
) -> io::Result<Vec<u8>> {
    let sink = sink.expect("server-writes registered a sink");
    let wc = ep
        .wait_wc(opts.timeout)
        .ok_or_else(|| timed_out("length Send"))?;
    if wc.opcode != WcOpcode::Recv || wc.status != WcStatus::Success {
        return Err(io::Error::other(format!("rdma: {wc:?}")));
    }
    ep.with(|dev, _| {
        let sent = dev
            .read(note, 0, 8)
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
        let sent = u64::from_be_bytes(sent.try_into().expect("8 bytes"));
        if sent != len || len > opts.maxlen {
            return Err(io::Error::other(format!(
                "rdma: answer says {len} bytes, the stream {sent}"
            )));
        }
        dev.read(sink, 0, len as usize)
            .map(<[u8]>::to_vec)
            .map_err(|e| io::Error::other(format!("{e:?}")))
    })
}

/// Client-reads: Read `len` bytes at `stag`/`to` into a new region, then Send done.
fn read_and_say_done(
    ep: &Endpoint,
    pd: PdId,
    note: u32,
    stag: u32,
    to: u64,
    len: u64,
    opts: &GetOptions,
) -> io::Result<Vec<u8>> {
    check_offer(len, opts)?;
    let sink = ep
        .with(|dev, _| dev.reg_mr(pd, 0, len as usize, Access::LOCAL_WRITE))
        .map_err(io::Error::other)?;
    let body = read_remote(
        ep,
        Remote {
            sink,
            note,
            stag,
            to,
            len,
        },
        opts,
    )?;
    // Done completed when the writer took it: let it go before the socket closes.
    ep.drain(opts.timeout);
    Ok(body)
}

/// Whether a client-reads answer's length can be taken.
pub(crate) fn check_offer(len: u64, opts: &GetOptions) -> io::Result<()> {
    if len == 0 || len > opts.maxlen || len > MR_BYTES_MAX as u64 {
        return Err(io::Error::other(format!("rdma: answer offers {len} bytes")));
    }
    Ok(())
}

/// One client-reads transfer on a connected endpoint: the local region `sink` (at
/// least `len` bytes, local write) and `note` (8 bytes) for the done message, the
/// server's `stag`/`to` and `len`.
pub(crate) struct Remote {
    pub(crate) sink: u32,
    pub(crate) note: u32,
    pub(crate) stag: u32,
    pub(crate) to: u64,
    pub(crate) len: u64,
}

/// Read `r.len` bytes at `r.stag`/`r.to` into `r.sink`, then Send done; the body once
/// done is handed to TCP (the server releases its region on it).
pub(crate) fn read_remote(ep: &Endpoint, r: Remote, opts: &GetOptions) -> io::Result<Vec<u8>> {
    ep.with(|_, qp| {
        qp.post_send(SendWr::Read {
            wr_id: WR_READ,
            local: Sge {
                stag: r.sink,
                to: 0,
                len: r.len as u32,
            },
            remote_stag: r.stag,
            remote_to: r.to,
        })
    })
    .map_err(io::Error::other)?;
    let wc = ep
        .wait_wc(opts.timeout)
        .ok_or_else(|| timed_out("Read Response"))?;
    if wc.wr_id != WR_READ || wc.status != WcStatus::Success {
        return Err(io::Error::other(format!("rdma: {wc:?}")));
    }
    let (body, done) = ep.with(|dev, qp| {
        let body = dev.read(r.sink, 0, r.len as usize).map(<[u8]>::to_vec);
        let _ = dev.write(r.note, 0, &r.len.to_be_bytes());
        let done = qp.post_send(SendWr::Send {
            wr_id: WR_DONE,
            local: Sge {
                stag: r.note,
                to: 0,
                len: 8,
            },
            solicited: true,
            invalidate: None,
        });
        (body, done)
    });
    let body = body.map_err(|e| io::Error::other(format!("{e:?}")))?;
    done.map_err(io::Error::other)?;
    // Done is on its way once handed to TCP.
    let wc = ep
        .wait_wc(opts.timeout)
        .ok_or_else(|| timed_out("done Send"))?;
    if wc.wr_id != WR_DONE || wc.status != WcStatus::Success {
        return Err(io::Error::other(format!("rdma: {wc:?}")));
    }
    Ok(body)
}

/// An HTTP answer as read by [`read_response`].
pub(crate) struct Answer {
    pub(crate) status: u16,
    /// The `RDMA:` field, if any.
    pub(crate) field: Option<Vec<u8>>,
    pub(crate) body: Vec<u8>,
    /// The server closes the connection after it (`Connection: close`, or a body
    /// delimited by the end of the stream).
    pub(crate) close: bool,
}

/// Status, the `RDMA:` field if any, the body (by `Content-Length`, else to EOF) and
/// whether the connection ends with it.
pub(crate) fn read_response(s: &mut TcpStream) -> io::Result<Answer> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                let status = resp.code.unwrap_or(0);
                let mut field = None;
                let mut length = None;
                let mut close = false;
                for h in resp.headers.iter() {
                    if h.name.eq_ignore_ascii_case("connection") {
                        close |= h.value.eq_ignore_ascii_case(b"close");
                    } else if h.name.eq_ignore_ascii_case(header::NAME) {
                        field = Some(h.value.to_vec());
                    } else if h.name.eq_ignore_ascii_case("content-length") {
                        let v = std::str::from_utf8(h.value).unwrap_or("").trim();
                        length = Some(v.parse::<u64>().map_err(|_| {
                            io::Error::new(io::ErrorKind::InvalidData, "bad Content-Length")
                        })?);
                    }
                }
                let mut body = buf.split_off(n);
                match length {
                    Some(len) if len > TCP_BODY_BYTES_MAX => {
                        return Err(io::Error::other(format!("body of {len} bytes too large")))
                    }
                    Some(len) => {
                        let want = len.saturating_sub(body.len() as u64);
                        s.take(want).read_to_end(&mut body)?;
                        if body.len() as u64 != len {
                            return Err(io::ErrorKind::UnexpectedEof.into());
                        }
                    }
                    None => {
                        s.take(TCP_BODY_BYTES_MAX).read_to_end(&mut body)?;
                        close = true;
                    }
                }
                return Ok(Answer {
                    status,
                    field,
                    body,
                    close,
                });
            }
            Ok(httparse::Status::Partial) if buf.len() < HEAD_BYTES_MAX => {}
            Ok(httparse::Status::Partial) => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"))
            }
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// FNV-1a 64 of `bytes` (as the back-end's `POST /digest` answers).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}
