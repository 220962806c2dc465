//! The front-end's control port: a line protocol over a Unix socket or TCP, and the [`Client`] other
//! crates use (the migration's `move_flow` is [`Client::move_flow`]).
//!
//! One request per line (at most [`LINE_BYTES_MAX`] bytes, ASCII), one reply line:
//! `OK` (with a payload for `STATS` and `FLOW`) or `ERR <reason>`.
//!
//! | request | effect | reply |
//! |---|---|---|
//! | `MOVE <client_ip>:<port> <backend_ip>` | the flow's entry (in the moved-flow table, created if evicted) names `backend_ip`, hold cleared | `OK`, `ERR` if that table is full |
//! | `HOLD <client_ip>:<port> [<ttl_ms>]` | the flow's packets are dropped at the front-end for `ttl_ms` (default [`HOLD_TTL_DEFAULT`], at most [`HOLD_TTL_MAX`]) | `OK` |
//! | `RELEASE <client_ip>:<port>` | hold cleared | `OK` |
//! | `FLOW <client_ip>:<port>` | — | `OK <backend_ip> held=<0/1>` or `OK none` |
//! | `WEIGHTS <ip>=<w>,<ip>=<w>...` | weights of the named back-ends (others unchanged), table refilled | `OK` |
//! | `STATS` | — | `OK <json>` ([`Stats`]) |
//!
//! Where: a Unix socket (`unix:/run/farside/frontend.sock`, 0600: only local root
//! can open it; recommended; plain lines) or TCP, where every request must be sealed
//! with the front-end's key and every reply is sealed and bound to its request
//! ([`crate::control_auth`]: `AUTH <hex>` lines; forged, tampered or replayed lines are
//! answered `ERR` and the connection closed). A TCP control port without a key is
//! refused.
//!
//! Bounds: [`CONNS_MAX`] connections at once; a new one past it closes the
//! connection whose last complete request is oldest if that is [`EVICT_IDLE_MIN`]
//! old, else it is answered `ERR busy` and closed; [`IDLE_TIMEOUT`] without a byte
//! closes a connection. So idle connections cannot keep callers out.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::backend::parse_weights;
use crate::control_auth::{self, ControlAuth};
use crate::fmove::MoveKey;
use crate::loader::{Frontend, Stats};
#[cfg(doc)]
use crate::loader::{HOLD_TTL_DEFAULT, HOLD_TTL_MAX};

/// Longest request line: the longest request is `WEIGHTS` with 64 back-ends
/// (`255.255.255.255=4294967295,` is 27 bytes each: 1,736 bytes); 4 KiB leaves room.
pub const LINE_BYTES_MAX: usize = 4096;
/// Connections served at once: the front-end has one caller per back-end daemon
/// plus an operator; 16 is plenty and bounds the threads.
pub const CONNS_MAX: usize = 16;
/// A connection with no complete request for this long is closed (daemons reconnect:
/// [`Client`] retries once on a fresh connection).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// With every one of the [`CONNS_MAX`] places taken, a new connection closes the one
/// whose last complete request is the oldest, if that is at least this long ago: so
/// idle (or byte-dribbling) connections can never keep a caller out, while a daemon
/// in the middle of a migration (requests milliseconds apart) is never cut off.
pub const EVICT_IDLE_MIN: Duration = Duration::from_secs(1);
/// The recommended control address: a Unix socket only root can open
/// (`--control unix:/run/farside/frontend.sock`; the socket is made 0600 and its
/// directory, if created, 0700).
pub const UNIX_SOCKET_DEFAULT: &str = "/run/farside/frontend.sock";
/// Longest reply line the client reads: `STATS` for 64 back-ends is ~10 KiB.
const REPLY_BYTES_MAX: u64 = 1 << 20;
/// Pause after a failed accept (out of fds, ...), so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// Client: longest wait for connect, a write or a reply. A `MOVE` stalls a migrating
/// connection (frozen on its source) for this long at most before the migration
/// falls back to the source.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(1);

// The one-sided MOVE, all its attempts, stays within the control client's bound (the
// migration's budget for the front-end flip, whichever way it goes).
const _: () = assert!(
    crate::fmove::ATTEMPTS as u128 * crate::fmove::ATTEMPT_TIMEOUT.as_millis()
        < CLIENT_TIMEOUT.as_millis()
);

/// Where the control port listens: a Unix socket (`unix:/path`, recommended: only
/// local root can reach it) or TCP (`IP:PORT`: every request sealed with the
/// front-end's key, [`crate::control_auth`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlAddr {
    /// TCP at this address.
    Tcp(SocketAddr),
    /// A Unix stream socket at this path.
    Unix(PathBuf),
}

impl ControlAddr {
    /// The TCP address, if it is one.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            ControlAddr::Tcp(a) => Some(*a),
            ControlAddr::Unix(_) => None,
        }
    }
}

impl FromStr for ControlAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if !p.starts_with('/') {
                return Err(format!(
                    "{s:?}: a Unix socket needs an absolute path (unix:/run/farside/frontend.sock)"
                ));
            }
            return Ok(ControlAddr::Unix(PathBuf::from(p)));
        }
        s.parse().map(ControlAddr::Tcp).map_err(|_| {
            format!(
                "{s:?}: give unix:/PATH (recommended, e.g. unix:{UNIX_SOCKET_DEFAULT}) or IP:PORT"
            )
        })
    }
}

impl fmt::Display for ControlAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlAddr::Tcp(a) => a.fmt(f),
            ControlAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl From<SocketAddr> for ControlAddr {
    fn from(a: SocketAddr) -> ControlAddr {
        ControlAddr::Tcp(a)
    }
}

/// A control connection, TCP or Unix.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn connect(addr: &ControlAddr) -> io::Result<Stream> {
        Ok(match addr {
            ControlAddr::Tcp(a) => Stream::Tcp(TcpStream::connect_timeout(a, CLIENT_TIMEOUT)?),
            ControlAddr::Unix(p) => Stream::Unix(UnixStream::connect(p)?),
        })
    }

    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                let _ = s.set_nodelay(true);
                s.set_read_timeout(Some(t))?;
                s.set_write_timeout(Some(t))
            }
            Stream::Unix(s) => {
                s.set_read_timeout(Some(t))?;
                s.set_write_timeout(Some(t))
            }
        }
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            Listener::Tcp(l) => Stream::Tcp(l.accept()?.0),
            Listener::Unix(l) => Stream::Unix(l.accept()?.0),
        })
    }

    fn raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l) => l.as_raw_fd(),
        }
    }
}

impl Stream {
    fn is_tcp(&self) -> bool {
        matches!(self, Stream::Tcp(_))
    }
}

/// Bind a Unix socket at `path`, 0600, in a directory made 0700 if missing and checked
/// (`farside_rt::rundir`: root's or ours, no other user's symlink, not writable by
/// others). A socket file of ours left by a dead front-end (nothing accepts on it) is
/// replaced; one a live front-end serves is not; another user's entry is refused.
fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    let (dir, name) = farside_rt::rundir::SafeDir::create_parent(path)?;
    if let Ok(meta) = std::fs::symlink_metadata(dir.path().join(name)) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        if UnixStream::connect(dir.path().join(name)).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("a front-end already serves {}", path.display()),
            ));
        }
    }
    dir.bind_unix(name)
}

/// The control server; stops (and joins its accept thread) when dropped.
pub struct Server {
    addr: ControlAddr,
    /// The listener's fd (owned by the accept thread until it is joined).
    listener_fd: std::os::fd::RawFd,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Server {
    /// Listen on TCP `addr` and serve requests sealed with `key` on `fe` until dropped.
    pub fn start(addr: SocketAddr, fe: Arc<Mutex<Frontend>>, key: MoveKey) -> io::Result<Server> {
        Server::start_at(&ControlAddr::Tcp(addr), fe, Some(key))
    }

    /// Listen on `addr` (TCP or a Unix socket) and serve requests on `fe` until
    /// dropped (a Unix socket's file is removed then). On TCP every request must be
    /// sealed with `key`, which is then required; on a Unix socket plain lines are
    /// served, and sealed ones too if a key is given.
    pub fn start_at(
        addr: &ControlAddr,
        fe: Arc<Mutex<Frontend>>,
        key: Option<MoveKey>,
    ) -> io::Result<Server> {
        if addr.tcp().is_some() && key.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a TCP control port needs the front-end's key (--key-file) to authenticate \
                 its requests; or serve it on a Unix socket (unix:/PATH)",
            ));
        }
        let auth = key.map(|k| Arc::new(ControlAuth::new(k)));
        let (listener, addr) = match addr {
            ControlAddr::Tcp(a) => {
                let l = TcpListener::bind(a)?;
                let a = l.local_addr()?;
                (Listener::Tcp(l), ControlAddr::Tcp(a))
            }
            ControlAddr::Unix(p) => (Listener::Unix(bind_unix(p)?), addr.clone()),
        };
        let listener_fd = listener.raw_fd();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = thread::Builder::new()
            .name("fe-control".into())
            .spawn(move || accept_loop(listener, fe, auth, stop2))?;
        Ok(Server {
            addr,
            listener_fd,
            stop,
            thread: Some(thread),
        })
    }

    /// The TCP address it listens on (port 0 resolved); unspecified for a Unix socket
    /// (see [`Server::addr`]).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
            .tcp()
            .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))
    }

    /// Where it listens.
    pub fn addr(&self) -> &ControlAddr {
        &self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop: shutdown makes a blocked accept(2) on TCP fail at once
        // (a connect to wake it would fail from another network namespace); a Unix
        // socket is woken by a connection to its path.
        // SAFETY: the fd is the listener's, still open: its thread is joined below.
        unsafe { libc::shutdown(self.listener_fd, libc::SHUT_RDWR) };
        if let ControlAddr::Unix(p) = &self.addr {
            let _ = UnixStream::connect(p);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let ControlAddr::Unix(p) = &self.addr {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// One served connection: when it last completed a request, and a handle to close it.
struct Slot {
    id: u64,
    last_request: Instant,
    conn: Stream,
}

/// The connections being served, at most [`CONNS_MAX`].
#[derive(Default)]
struct Slots {
    slots: Mutex<Vec<Slot>>,
    next_id: AtomicU64,
}

impl Slots {
    /// A place for `conn`: free, or taken from the connection idle longest if that is
    /// idle [`EVICT_IDLE_MIN`] or more (it is shut down). None: every place is busy.
    fn admit(&self, conn: &Stream) -> Option<u64> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots.len() >= CONNS_MAX {
            let (i, oldest) = slots
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.last_request)?;
            if oldest.last_request.elapsed() < EVICT_IDLE_MIN {
                return None;
            }
            log::debug!("frontend control: closing the connection idle longest for a new one");
            slots.swap_remove(i).conn.shutdown();
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let handle = conn.try_clone().ok()?;
        slots.push(Slot {
            id,
            last_request: Instant::now(),
            conn: handle,
        });
        Some(id)
    }

    fn touch(&self, id: u64) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slots.iter_mut().find(|s| s.id == id) {
            s.last_request = Instant::now();
        }
    }

    fn leave(&self, id: u64) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.retain(|s| s.id != id);
    }
}

fn accept_loop(
    listener: Listener,
    fe: Arc<Mutex<Frontend>>,
    auth: Option<Arc<ControlAuth>>,
    stop: Arc<AtomicBool>,
) {
    let slots = Arc::new(Slots::default());
    loop {
        let conn = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut conn) = conn else {
            // E.g. out of fds: do not spin.
            thread::sleep(ACCEPT_ERROR_PAUSE);
            continue;
        };
        let Some(id) = slots.admit(&conn) else {
            let _ = conn.write_all(b"ERR busy\n");
            continue;
        };
        let (fe, slots2, auth) = (fe.clone(), slots.clone(), auth.clone());
        let spawned = thread::Builder::new()
            .name("fe-control-conn".into())
            .spawn(move || {
                let _ = serve_conn(conn, &fe, auth.as_deref(), &slots2, id);
                slots2.leave(id);
            });
        if spawned.is_err() {
            slots.leave(id);
        }
    }
}

fn serve_conn(
    conn: Stream,
    fe: &Mutex<Frontend>,
    auth: Option<&ControlAuth>,
    slots: &Slots,
    id: u64,
) -> io::Result<()> {
    // TCP: only sealed lines (the server refuses to start without a key).
    let sealed_only = conn.is_tcp();
    conn.set_timeouts(IDLE_TIMEOUT)?;
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn).take(0);
    loop {
        let mut line = Vec::new();
        r.set_limit(LINE_BYTES_MAX as u64 + 1);
        let n = r.read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        if !line.ends_with(b"\n") {
            w.write_all(format!("ERR request longer than {LINE_BYTES_MAX} bytes\n").as_bytes())?;
            return Ok(());
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            w.write_all(b"ERR request is not UTF-8\n")?;
            continue;
        };
        let text = text.trim();
        let reply_text = |r: Result<String, String>| match r {
            Ok(p) if p.is_empty() => "OK".to_string(),
            Ok(p) => format!("OK {p}"),
            Err(e) => format!("ERR {}", e.replace('\n', " ")),
        };
        let out = match auth {
            Some(a) if sealed_only || text.starts_with(control_auth::AUTH_PREFIX) => {
                match a.open_request(text) {
                    Ok(opened) => {
                        let r = reply_text(handle(opened.request.trim(), fe));
                        a.seal_reply(&opened, &r)
                    }
                    Err(why) => {
                        // Unauthenticated: a plain refusal, and the place is freed for
                        // callers that hold the key.
                        log::debug!("frontend control: refused a request: {why}");
                        w.write_all(format!("ERR {why}\n").as_bytes())?;
                        return Ok(());
                    }
                }
            }
            _ => reply_text(handle(text, fe)),
        };
        w.write_all(format!("{out}\n").as_bytes())?;
        slots.touch(id);
    }
}

fn parse_client(s: &str) -> Result<SocketAddrV4, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not an IPv4 client_ip:port"))
}

/// Execute one request line; the reply's payload or the error.
fn handle(line: &str, fe: &Mutex<Frontend>) -> Result<String, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some(cmd) = words.first().map(|c| c.to_ascii_uppercase()) else {
        return Err("empty request".into());
    };
    let args = &words[1..];
    let want = match cmd.as_str() {
        "MOVE" => 2,
        "HOLD" if args.len() == 2 => 2,
        "HOLD" | "RELEASE" | "FLOW" | "WEIGHTS" => 1,
        "STATS" => 0,
        other => {
            return Err(format!(
                "unknown request {other:?} (MOVE, HOLD, RELEASE, FLOW, WEIGHTS, STATS)"
            ))
        }
    };
    if args.len() != want {
        return Err(format!(
            "{cmd} takes {want} argument(s), got {}",
            args.len()
        ));
    }
    let mut fe = fe.lock().unwrap_or_else(|p| p.into_inner());
    let r = match cmd.as_str() {
        "MOVE" => {
            let client = parse_client(args[0])?;
            let b: Ipv4Addr = args[1]
                .parse()
                .map_err(|_| format!("{:?} is not a back-end IPv4 address", args[1]))?;
            fe.move_flow(client, b).map(|()| String::new())
        }
        "HOLD" => {
            let ttl = match args.get(1) {
                Some(ms) => Duration::from_millis(
                    ms.parse()
                        .map_err(|_| format!("{ms:?} is not a hold time in ms"))?,
                ),
                None => crate::loader::HOLD_TTL_DEFAULT,
            };
            fe.set_hold(parse_client(args[0])?, Some(ttl))
                .map(|()| String::new())
        }
        "RELEASE" => fe
            .set_hold(parse_client(args[0])?, None)
            .map(|()| String::new()),
        "FLOW" => fe.flow(parse_client(args[0])?).map(|f| match f {
            Some((ip, held)) => format!("{ip} held={}", u8::from(held)),
            None => "none".into(),
        }),
        "WEIGHTS" => fe
            .set_weights(&parse_weights(args[0])?)
            .map(|()| String::new()),
        _ => fe
            .stats()
            .map(|s| serde_json::to_string(&s).unwrap_or_default()),
    };
    r.map_err(|e| e.to_string())
}

/// A connection to a front-end's control port. Requests are retried once on a fresh
/// connection if the old one broke (every request is idempotent).
pub struct Client {
    addr: ControlAddr,
    conn: Option<(BufReader<Stream>, Stream)>,
    /// Seal requests with this key (and this client's random sender id).
    key: Option<(MoveKey, u64)>,
}

impl Client {
    /// Connect to the control port at TCP `addr` (bounded by [`CLIENT_TIMEOUT`]).
    pub fn connect(addr: SocketAddr) -> io::Result<Client> {
        Client::connect_to(&ControlAddr::Tcp(addr))
    }

    /// Connect to the control port at `addr`, TCP or a Unix socket.
    pub fn connect_to(addr: &ControlAddr) -> io::Result<Client> {
        let mut c = Client {
            addr: addr.clone(),
            conn: None,
            key: None,
        };
        c.ensure()?;
        Ok(c)
    }

    /// Seal every request with `key` (the front-end's `--key-file` key; required on a
    /// TCP control port) and accept only replies bound to them.
    pub fn with_key(mut self, key: MoveKey) -> Client {
        self.key = Some((key, control_auth::random_sender()));
        self
    }

    fn ensure(&mut self) -> io::Result<&mut (BufReader<Stream>, Stream)> {
        if self.conn.is_none() {
            let s = Stream::connect(&self.addr)?;
            s.set_timeouts(CLIENT_TIMEOUT)?;
            self.conn = Some((BufReader::new(s.try_clone()?), s));
        }
        Ok(self.conn.as_mut().expect("set above"))
    }

    fn once(&mut self, req: &str) -> io::Result<String> {
        let key = self.key;
        let seq = crate::fmove::next_envelope_seq();
        let (r, w) = self.ensure()?;
        let out = match &key {
            Some((k, sender)) => control_auth::seal_request(k, *sender, seq, req),
            None => req.to_string(),
        };
        w.write_all(format!("{out}\n").as_bytes())?;
        let mut line = String::new();
        let n = r.by_ref().take(REPLY_BYTES_MAX).read_line(&mut line)?;
        if n == 0 || !line.ends_with('\n') {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "control connection closed",
            ));
        }
        let line = line.trim_end();
        match &key {
            Some((k, sender)) if line.starts_with(control_auth::AUTH_PREFIX) => {
                control_auth::open_reply(k, *sender, seq, line).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("front-end reply {e}"))
                })
            }
            // The front-end refused the sealed request (it says why, unsealed).
            Some(_) if line.starts_with("ERR ") => Ok(line.to_string()),
            Some(_) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("front-end: an unsealed reply {line:?} to a sealed request"),
            )),
            None => Ok(line.to_string()),
        }
    }

    /// Send one request line and return the `OK` payload (errors: I/O, or the
    /// server's `ERR` reason as [`io::ErrorKind::Other`]).
    pub fn request(&mut self, req: &str) -> io::Result<String> {
        let line = match self.once(req) {
            Ok(l) => l,
            Err(_) => {
                self.conn = None;
                self.once(req).inspect_err(|_| self.conn = None)?
            }
        };
        if let Some(rest) = line.strip_prefix("OK") {
            Ok(rest.trim_start().to_string())
        } else if let Some(e) = line.strip_prefix("ERR ") {
            Err(io::Error::other(format!("front-end: {e}")))
        } else {
            self.conn = None;
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("front-end: unexpected reply {line:?}"),
            ))
        }
    }

    /// Send `client`'s flow to `backend` from now on (and release a hold): the
    /// front-end flip of a migration, after the target restored the connection.
    pub fn move_flow(&mut self, client: SocketAddrV4, backend: Ipv4Addr) -> io::Result<()> {
        self.request(&format!("MOVE {client} {backend}")).map(drop)
    }

    /// Drop `client`'s packets at the front-end until released, moved, or the
    /// front-end's default hold time ran out.
    pub fn hold(&mut self, client: SocketAddrV4) -> io::Result<()> {
        self.request(&format!("HOLD {client}")).map(drop)
    }

    /// Drop `client`'s packets at the front-end until released, moved, or `ttl`
    /// (whole milliseconds) ran out.
    pub fn hold_for(&mut self, client: SocketAddrV4, ttl: Duration) -> io::Result<()> {
        self.request(&format!("HOLD {client} {}", ttl.as_millis()))
            .map(drop)
    }

    /// Undo [`Client::hold`].
    pub fn release(&mut self, client: SocketAddrV4) -> io::Result<()> {
        self.request(&format!("RELEASE {client}")).map(drop)
    }

    /// Where `client`'s flow goes (back-end IP, held), None if not in the table.
    pub fn flow(&mut self, client: SocketAddrV4) -> io::Result<Option<(Ipv4Addr, bool)>> {
        let p = self.request(&format!("FLOW {client}"))?;
        if p == "none" {
            return Ok(None);
        }
        let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("FLOW reply {p:?}"));
        let (ip, held) = p.split_once(' ').ok_or_else(bad)?;
        Ok(Some((
            ip.parse().map_err(|_| bad())?,
            match held {
                "held=1" => true,
                "held=0" => false,
                _ => return Err(bad()),
            },
        )))
    }

    /// Set weights (back-end IP, weight); the others keep theirs.
    pub fn set_weights(&mut self, weights: &[(Ipv4Addr, u32)]) -> io::Result<()> {
        let arg: Vec<String> = weights.iter().map(|(ip, w)| format!("{ip}={w}")).collect();
        self.request(&format!("WEIGHTS {}", arg.join(",")))
            .map(drop)
    }

    /// The front-end's counters.
    pub fn stats(&mut self) -> io::Result<Stats> {
        let p = self.request("STATS")?;
        serde_json::from_str(&p).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}
