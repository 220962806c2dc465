//! A client that keeps its connections: one HTTP/1.1 keep-alive connection and, on
//! it, one RDMA connection reused by every request, as the seed paper's clients kept
//! theirs (§5.1: "this connection cost must only be endured one time"). The load
//! generator's `--rdma` clients are sessions ([`Session::get`] per request).
//!
//! ```text
//!  no HTTP connection ─ connect; bind the RDMA listener on its local address (kept
//!                       for the HTTP connection's life: every request names it)
//!  no RDMA connection ─ a fresh device: note, sink region of maxlen (server-writes:
//!                       remote write; client-reads: local write), a queue pair that
//!                       accepts; a thread accepts the server's connection
//!  RDMA connection up ─ server-writes: post a receive for the length (once per
//!                       transfer); the request names the same sink
//!  GET (keep-alive, `RDMA:`) ─ answer:
//!    server-writes, len  wait for the Send behind the Write; body = sink[..len]
//!    client-reads, ...   Read into the sink, Send done (the connection stays)
//!    anything else       the body is the HTTP body
//! ```
//!
//! The server keeps an RDMA connection for the rest of its HTTP connection while
//! requests name the same endpoint (`crate::server`), so a session pays the RDMA
//! connection set-up once per HTTP connection: [`Fetch::rdma_connect`] is that set-up
//! (request written to MPA set-up done, the server's work to get there included)
//! when this request made one, else `None`.
//!
//! **Direct** ([`Session::with_arena_direct`]): the arena-reads request also asks for
//! a grant (`direct=1`, `crate::grant`); while the session holds a live one, a GET of a
//! publishable path is first tried with no HTTP request at all: one index READ of the
//! path's alias and the body's READs under the grant's key. Any miss (not published,
//! stale, refused, lost, expired) falls back to the HTTP request, which renews the
//! grant; [`Session::direct_misses`] counts them.
//!
//! Any error ends both connections (the next request starts afresh); an answer that
//! says `Connection: close` ends them after it.

use crate::arena_read::{ArenaReader, FetchError};
use crate::client::{self, Fetched, GetOptions, Remote, Via, CQ_DEPTH, WR_RECV};
use crate::grant::ClientGrant;
use crate::header::{self, ArenaHint, Decline, Mode, Response};
use farside_iwarp::qp::{Qp, QpConfig, QpState, RecvWr, Sge};
use farside_iwarp::tcp::Endpoint;
use farside_iwarp::verbs::{Access, Cq, Device, MR_BYTES_MAX};
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bound on the local connection that wakes a cancelled accept (same host: a
/// loopback-fast connect; a listener that is gone refuses at once).
const WAKE_TIMEOUT: Duration = Duration::from_millis(200);

/// One request's outcome on a session.
#[derive(Debug)]
pub struct Fetch {
    pub fetched: Fetched,
    /// The RDMA connection this request set up (request written to MPA set-up done);
    /// `None` when it reused one or made none.
    pub rdma_connect: Option<Duration>,
    /// This request opened a new HTTP connection.
    pub http_connect: bool,
    /// Request written to the HTTP answer's head and body read (the server's part, the
    /// RDMA transfer after it excluded); `None` when no HTTP request was made (direct).
    pub http_answer: Option<Duration>,
}

/// A connected RDMA side: the endpoint and the regions registered once for it.
struct Live {
    ep: Endpoint,
    note: u32,
    sink: u32,
    /// Server-writes: a receive for the length is posted and not yet consumed (a
    /// declined request leaves it for the next).
    recv_posted: bool,
}

/// An RDMA connection being accepted for the request in flight.
struct Pending {
    note: u32,
    sink: u32,
    /// The listener's address (to wake the accept when cancelled).
    endpoint: SocketAddr,
    cancel: Arc<AtomicBool>,
    accept: JoinHandle<io::Result<(Endpoint, Instant)>>,
}

/// The HTTP connection with its RDMA listener and connection.
struct Http {
    stream: TcpStream,
    listener: TcpListener,
    endpoint: SocketAddr,
    live: Option<Live>,
}

/// A client of one server that keeps its HTTP and RDMA connections. See the module doc.
pub struct Session {
    addr: SocketAddr,
    host: String,
    opts: GetOptions,
    keepalive: bool,
    http: Option<Http>,
    rdma_connections: u64,
    /// Arena-reads: the arena reader key, and the reader once a hint named its port.
    arena_key: Option<farside_rmem::ClientKey>,
    arena: Option<ArenaReader>,
    /// Direct: asked for; the live grant and a reader under its key.
    direct: bool,
    grant: Option<ClientGrant>,
    direct_reader: Option<ArenaReader>,
    direct_misses: u64,
    /// Bodies the arena named but could not deliver, asked for again over HTTP, and
    /// why (the first [`FALLBACK_REASONS_MAX`]).
    arena_fallbacks: u64,
    arena_fallback_reasons: Vec<String>,
}

/// Reasons of arena fall-backs a session keeps.
pub const FALLBACK_REASONS_MAX: usize = 8;

impl Session {
    /// A session to `addr` (Host `host`); `keepalive: false` opens new connections
    /// (HTTP and RDMA) for every request.
    pub fn new(addr: SocketAddr, host: &str, opts: GetOptions, keepalive: bool) -> Session {
        Session {
            addr,
            host: host.to_string(),
            opts,
            keepalive,
            http: None,
            rdma_connections: 0,
            arena_key: None,
            arena: None,
            direct: false,
            grant: None,
            direct_reader: None,
            direct_misses: 0,
            arena_fallbacks: 0,
            arena_fallback_reasons: Vec::new(),
        }
    }

    /// This arena-reads session also resolving urls itself under a grant (see the
    /// module doc); needs [`Self::with_arena_key`].
    pub fn with_arena_direct(mut self) -> Session {
        self.direct = true;
        self
    }

    /// Direct attempts that fell back to HTTP (a grant was live, the path publishable).
    pub fn direct_misses(&self) -> u64 {
        self.direct_misses
    }

    /// A GET answered with no HTTP request, under the live grant; `None` if none is
    /// live or the path is not one a server publishes, `Some(Err)` on a miss.
    fn try_direct(&mut self, path: &str) -> Option<Result<Fetch, FetchError>> {
        let now = Instant::now();
        let g = self.grant.filter(|g| g.live(now))?;
        if !crate::arena::publishable(path) {
            return None;
        }
        let server = SocketAddr::new(self.addr.ip(), g.port);
        if self.direct_reader.as_ref().map(|r| r.key_id()) != Some(g.key.id.0) {
            match ArenaReader::connect(server, g.key) {
                Ok(r) => self.direct_reader = Some(r),
                Err(e) => return Some(Err(e.into())),
            }
        }
        let reader = self.direct_reader.as_mut().expect("opened above");
        let r = reader.fetch_published(crate::arena::direct_hash(path), g.port, self.opts.maxlen);
        Some(r.map(|(body, _)| Fetch {
            fetched: Fetched {
                status: 200,
                body,
                via: Via::ArenaDirect,
            },
            rdma_connect: None,
            http_connect: false,
            http_answer: None,
        }))
    }

    /// This session asking for arena-reads (`RDMA: arena-reads`, instead of
    /// `opts.mode`): bodies the server answers with a hint are read one-sidedly from
    /// its kernel-answered arena under `key` ([`crate::arena_read`]), from the HTTP
    /// peer's own address. The reader's socket is opened at the first hint and kept
    /// (its opening is the fetch's `rdma_connect`).
    pub fn with_arena_key(mut self, key: farside_rmem::ClientKey) -> Session {
        self.arena_key = Some(key);
        self
    }

    /// [`Self::read_arena`] within an exchange: a failed read is [`Failed::Arena`]
    /// (the body is then asked for over HTTP), after dropping an HTTP connection the
    /// server closes (`close`).
    fn arena_body(
        &mut self,
        hint: &ArenaHint,
        maxlen: u64,
        rdma_connect: &mut Option<Duration>,
        close: bool,
    ) -> Result<Vec<u8>, Failed> {
        self.read_arena(hint, maxlen, rdma_connect).map_err(|e| {
            if close {
                self.http = None;
            }
            Failed::Arena(e)
        })
    }

    /// Read the body `hint` names from the server's arena, opening the reader first
    /// when none is open to that port (its set-up time goes to `rdma_connect`).
    fn read_arena(
        &mut self,
        hint: &ArenaHint,
        maxlen: u64,
        rdma_connect: &mut Option<Duration>,
    ) -> io::Result<Vec<u8>> {
        let server = SocketAddr::new(self.addr.ip(), hint.port);
        if self.arena.as_ref().and_then(|r| r.server().ok()) != Some(server) {
            let t = Instant::now();
            let key = self.arena_key.expect("checked by the caller");
            self.arena = Some(ArenaReader::connect(server, key)?);
            *rdma_connect = Some(t.elapsed());
            self.rdma_connections += 1;
        }
        let reader = self.arena.as_mut().expect("opened above");
        let (body, _) = reader
            .fetch(hint, maxlen)
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(body)
    }

    /// RDMA connections set up so far.
    pub fn rdma_connections(&self) -> u64 {
        self.rdma_connections
    }

    /// Bodies the arena named but the one-sided read could not deliver (READs
    /// unanswered, the object stale, evicted or torn every time), which were then
    /// asked for over HTTP without the header.
    pub fn arena_fallbacks(&self) -> u64 {
        self.arena_fallbacks
    }

    /// Why those reads failed, the first [`FALLBACK_REASONS_MAX`].
    pub fn arena_fallback_reasons(&self) -> &[String] {
        &self.arena_fallback_reasons
    }

    /// GET `path`. On error both connections are closed; the next call starts afresh.
    ///
    /// The header never makes a request fail (`docs/rdma-http.md`, "Fallback"): a
    /// body the server put in its arena but the one-sided read could not deliver is
    /// asked for again on the same HTTP connection without the header, and comes over
    /// TCP as `Via::Tcp(Some(Decline::Transfer))`.
    pub fn get(&mut self, path: &str) -> io::Result<Fetch> {
        if self.direct {
            match self.try_direct(path) {
                Some(Ok(f)) => return Ok(f),
                Some(Err(e)) => {
                    log::debug!("direct {path}: {e}; asking over HTTP");
                    self.direct_misses += 1;
                }
                None => {}
            }
        }
        let mut r = self.try_get(path, true);
        if let Err(Failed::Arena(e)) = &r {
            log::debug!("arena read of {path}: {e}; asking over HTTP");
            self.arena_fallbacks += 1;
            if self.arena_fallback_reasons.len() < FALLBACK_REASONS_MAX {
                self.arena_fallback_reasons.push(format!("{path}: {e}"));
            }
            r = self.try_get(path, false).map(|mut f| {
                f.fetched.via = Via::Tcp(Some(Decline::Transfer));
                f
            });
        }
        let r = r.map_err(io::Error::from);
        if r.is_err() || !self.keepalive {
            self.http = None;
        }
        r
    }

    /// One exchange; `rdma: false` asks without the header (the arena fall-back).
    fn try_get(&mut self, path: &str, rdma: bool) -> Result<Fetch, Failed> {
        let http_connect = self.http.is_none();
        if http_connect {
            let stream = TcpStream::connect_timeout(&self.addr, self.opts.timeout)?;
            stream.set_read_timeout(Some(self.opts.timeout))?;
            let _ = stream.set_nodelay(true);
            let listener = TcpListener::bind((stream.local_addr()?.ip(), 0))?;
            let endpoint = listener.local_addr()?;
            self.http = Some(Http {
                stream,
                listener,
                endpoint,
                live: None,
            });
        }
        let opts = self.opts;
        let h = self.http.as_mut().expect("connected above");
        if h.live
            .as_ref()
            .is_some_and(|l| l.ep.is_closed() || l.ep.state() != QpState::Rts)
        {
            h.live = None;
        }
        let mut pending = None;
        let field = match opts.mode {
            _ if !rdma => None,
            None if self.arena_key.is_some() => Some(format!(
                "{}, maxlen={}{}",
                header::ARENA_READS,
                opts.maxlen,
                if self.direct { ", direct=1" } else { "" }
            )),
            None => None,
            Some(mode) => {
                let sink = match &mut h.live {
                    Some(l) => {
                        if mode == Mode::ServerWrites && !l.recv_posted {
                            let (note, ep) = (l.note, &l.ep);
                            ep.with(|_, qp| qp.post_recv(length_recv(note)))
                                .map_err(io::Error::other)?;
                            l.recv_posted = true;
                        }
                        l.sink
                    }
                    None => {
                        let p = prepare(&h.listener, &opts, mode)?;
                        let sink = p.sink;
                        pending = Some(p);
                        sink
                    }
                };
                Some(
                    header::Request {
                        mode,
                        endpoint: h.endpoint,
                        sink: (mode == Mode::ServerWrites).then_some((sink, 0)),
                        maxlen: opts.maxlen,
                    }
                    .to_string(),
                )
            }
        };
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n", self.host);
        if !self.keepalive {
            req.push_str("Connection: close\r\n");
        }
        if let Some(f) = &field {
            req.push_str(&format!("{}: {f}\r\n", header::NAME));
        }
        req.push_str("\r\n");
        let sent = Instant::now();
        let answer = h
            .stream
            .write_all(req.as_bytes())
            .and_then(|()| client::read_response(&mut h.stream));
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                if let Some(p) = pending {
                    p.cancel();
                }
                return Err(e.into());
            }
        };
        let answered = Instant::now();
        let http_answer = Some(answered.saturating_duration_since(sent));
        let close = answer.close;
        let taken = answer.field.as_ref().map(|f| header::parse_response(f));
        let mut rdma_connect = None;
        let rdma = matches!(
            taken,
            Some(Ok(
                Response::ServerWrites { .. } | Response::ClientReads { .. }
            ))
        );
        if let Some(p) = pending {
            if rdma {
                let (ep, up) = p
                    .accept
                    .join()
                    .map_err(|_| io::Error::other("rdma accept thread panicked"))?
                    .map_err(|e| io::Error::new(e.kind(), format!("rdma connection: {e}")))?;
                rdma_connect = Some(up.saturating_duration_since(sent));
                self.rdma_connections += 1;
                h.live = Some(Live {
                    ep,
                    note: p.note,
                    sink: p.sink,
                    recv_posted: opts.mode == Some(Mode::ServerWrites),
                });
            } else {
                // Declined: a connection the server made is dropped with the device.
                p.cancel();
            }
        }
        let fetched = match taken {
            Some(Ok(Response::ServerWrites { len })) => {
                let l = h.live.as_mut().expect("set above or reused");
                l.recv_posted = false;
                let body = client::take_written(&l.ep, Some(l.sink), l.note, len, &opts)?;
                Fetched {
                    status: answer.status,
                    body,
                    via: Via::ServerWrites,
                }
            }
            Some(Ok(Response::ArenaDirect(hint, g))) if self.arena_key.is_some() && self.direct => {
                let local = h.stream.local_addr()?.ip();
                let local = match local {
                    IpAddr::V4(a) => Some(a),
                    IpAddr::V6(a) => a.to_ipv4_mapped(),
                };
                if let Some(local) = local {
                    let key = self.arena_key.expect("checked");
                    self.grant = Some(ClientGrant::new(&key, g, local, hint.port, answered));
                }
                let body = self.arena_body(&hint, opts.maxlen, &mut rdma_connect, close)?;
                Fetched {
                    status: answer.status,
                    body,
                    via: Via::ArenaReads,
                }
            }
            Some(Ok(Response::ArenaReads(hint))) if self.arena_key.is_some() => {
                let body = self.arena_body(&hint, opts.maxlen, &mut rdma_connect, close)?;
                Fetched {
                    status: answer.status,
                    body,
                    via: Via::ArenaReads,
                }
            }
            Some(Ok(Response::ClientReads { stag, to, len })) => {
                client::check_offer(len, &opts)?;
                let l = h.live.as_ref().expect("set above or reused");
                let r = Remote {
                    sink: l.sink,
                    note: l.note,
                    stag,
                    to,
                    len,
                };
                let body = client::read_remote(&l.ep, r, &opts)?;
                Fetched {
                    status: answer.status,
                    body,
                    via: Via::ClientReads,
                }
            }
            other => Fetched {
                status: answer.status,
                body: answer.body,
                via: Via::Tcp(match other {
                    Some(Ok(Response::Declined(d))) => Some(d),
                    _ => None,
                }),
            },
        };
        if close {
            self.http = None;
        }
        Ok(Fetch {
            fetched,
            rdma_connect,
            http_connect,
            http_answer,
        })
    }
}

fn length_recv(note: u32) -> RecvWr {
    RecvWr {
        wr_id: WR_RECV,
        sge: Sge {
            stag: note,
            to: 0,
            len: 8,
        },
    }
}

/// A fresh device with the note and the sink region (`maxlen` bytes: remote write for
/// server-writes, local write for client-reads' Read), a queue pair that accepts
/// (server-writes: with the length's receive posted before the connection exists, as
/// the server may Send right after its MPA set-up), and a thread accepting the
/// server's connection on `listener`.
fn prepare(listener: &TcpListener, opts: &GetOptions, mode: Mode) -> io::Result<Pending> {
    let len = usize::try_from(opts.maxlen)
        .ok()
        .filter(|&n| (1..=MR_BYTES_MAX).contains(&n))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("maxlen must be in 1..={MR_BYTES_MAX}"),
            )
        })?;
    let mut dev = Device::with_random_keys();
    let pd = dev.alloc_pd().map_err(io::Error::other)?;
    let note = dev
        .reg_mr(pd, 0, 8, Access::LOCAL_WRITE)
        .map_err(io::Error::other)?;
    let access = match mode {
        Mode::ServerWrites => Access::REMOTE_WRITE,
        Mode::ClientReads => Access::LOCAL_WRITE,
    };
    let sink = dev.reg_mr(pd, 0, len, access).map_err(io::Error::other)?;
    let mut qp = Qp::accept(pd, QpConfig::default());
    if mode == Mode::ServerWrites {
        qp.post_recv(length_recv(note)).map_err(io::Error::other)?;
    }
    let endpoint = listener.local_addr()?;
    let listener = listener.try_clone()?;
    listener.set_nonblocking(false)?;
    let cancel = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&cancel);
    // A blocking accept (no polling delay in the measured set-up): the request's
    // owner either joins it after an RDMA answer (the server connected) or cancels
    // it and wakes it with a connection of its own ([`Pending::cancel`]).
    let accept = std::thread::Builder::new()
        .name("rdma-accept".into())
        .spawn(move || {
            let (stream, _) = listener.accept()?;
            if stop.load(Ordering::Acquire) {
                return Err(io::ErrorKind::Interrupted.into());
            }
            let cq = Cq::new(CQ_DEPTH).map_err(io::Error::other)?;
            let ep = Endpoint::start(stream, dev, cq, qp)?;
            Ok((ep, Instant::now()))
        })?;
    Ok(Pending {
        note,
        sink,
        endpoint,
        cancel,
        accept,
    })
}

impl Pending {
    /// Stop accepting: a connection the server made is dropped with the device.
    fn cancel(self) {
        self.cancel.store(true, Ordering::Release);
        // Wake the blocking accept (refused or unanswered once it returned: ignored).
        let _ = TcpStream::connect_timeout(&self.endpoint, WAKE_TIMEOUT);
        let _ = self.accept.join();
    }
}

/// How one exchange failed: the HTTP exchange or an RDMA step ([`Failed::Io`]: the
/// request fails), or only the one-sided read of a body the server put in its arena
/// ([`Failed::Arena`]: the HTTP connection is intact, so the body is asked for again
/// without the header).
enum Failed {
    Io(io::Error),
    Arena(io::Error),
}

impl From<io::Error> for Failed {
    fn from(e: io::Error) -> Failed {
        Failed::Io(e)
    }
}

impl From<Failed> for io::Error {
    fn from(f: Failed) -> io::Error {
        match f {
            Failed::Io(e) | Failed::Arena(e) => e,
        }
    }
}
