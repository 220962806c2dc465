//! The front-end's control port: a line protocol over TCP, and the [`Client`] other
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
//! Bounds: [`CONNS_MAX`] connections at once (more are answered `ERR busy` and
//! closed), [`IDLE_TIMEOUT`] without a request closes a connection.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::loader::{parse_weights, Frontend, Stats};
#[cfg(doc)]
use crate::loader::{HOLD_TTL_DEFAULT, HOLD_TTL_MAX};

/// Longest request line: the longest request is `WEIGHTS` with 64 back-ends
/// (`255.255.255.255=4294967295,` is 27 bytes each: 1,736 bytes); 4 KiB leaves room.
pub const LINE_BYTES_MAX: usize = 4096;
/// Connections served at once: the front-end has one caller per back-end daemon
/// plus an operator; 16 is plenty and bounds the threads.
pub const CONNS_MAX: usize = 16;
/// A connection idle this long is closed (daemons reconnect; a stuck peer must not
/// hold one of the [`CONNS_MAX`] places forever).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest reply line the client reads: `STATS` for 64 back-ends is ~10 KiB.
const REPLY_BYTES_MAX: u64 = 1 << 20;
/// Pause after a failed accept (out of fds, ...), so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// Client: longest wait for connect, a write or a reply. A `MOVE` stalls a migrating
/// connection (frozen on its source) for this long at most before the migration
/// falls back to the source.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(1);

/// The control server; stops (and joins its accept thread) when dropped.
pub struct Server {
    addr: SocketAddr,
    /// The listener's fd (owned by the accept thread until it is joined).
    listener_fd: std::os::fd::RawFd,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Server {
    /// Listen on `addr` and serve requests on `fe` until dropped.
    pub fn start(addr: SocketAddr, fe: Arc<Mutex<Frontend>>) -> io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let listener_fd = listener.as_raw_fd();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = thread::Builder::new()
            .name("fe-control".into())
            .spawn(move || accept_loop(listener, fe, stop2))?;
        Ok(Server {
            addr,
            listener_fd,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop: shutdown makes a blocked accept(2) fail at once (a
        // connect to wake it would fail from another network namespace).
        // SAFETY: the fd is the listener's, still open: its thread is joined below.
        unsafe { libc::shutdown(self.listener_fd, libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, fe: Arc<Mutex<Frontend>>, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut conn) = conn else {
            // E.g. out of fds: do not spin.
            thread::sleep(ACCEPT_ERROR_PAUSE);
            continue;
        };
        if active.load(Ordering::SeqCst) >= CONNS_MAX {
            let _ = conn.write_all(b"ERR busy\n");
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let (fe, active2) = (fe.clone(), active.clone());
        let spawned = thread::Builder::new()
            .name("fe-control-conn".into())
            .spawn(move || {
                let _ = serve_conn(conn, &fe);
                active2.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn serve_conn(conn: TcpStream, fe: &Mutex<Frontend>) -> io::Result<()> {
    conn.set_read_timeout(Some(IDLE_TIMEOUT))?;
    conn.set_write_timeout(Some(IDLE_TIMEOUT))?;
    let _ = conn.set_nodelay(true);
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
        let reply = match std::str::from_utf8(&line) {
            Ok(s) => handle(s.trim(), fe),
            Err(_) => Err("request is not UTF-8".into()),
        };
        let out = match reply {
            Ok(p) if p.is_empty() => "OK\n".to_string(),
            Ok(p) => format!("OK {p}\n"),
            Err(e) => format!("ERR {}\n", e.replace('\n', " ")),
        };
        w.write_all(out.as_bytes())?;
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
    addr: SocketAddr,
    conn: Option<(BufReader<TcpStream>, TcpStream)>,
}

impl Client {
    /// Connect to the control port at `addr` (bounded by [`CLIENT_TIMEOUT`]).
    pub fn connect(addr: SocketAddr) -> io::Result<Client> {
        let mut c = Client { addr, conn: None };
        c.ensure()?;
        Ok(c)
    }

    fn ensure(&mut self) -> io::Result<&mut (BufReader<TcpStream>, TcpStream)> {
        if self.conn.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, CLIENT_TIMEOUT)?;
            s.set_read_timeout(Some(CLIENT_TIMEOUT))?;
            s.set_write_timeout(Some(CLIENT_TIMEOUT))?;
            let _ = s.set_nodelay(true);
            self.conn = Some((BufReader::new(s.try_clone()?), s));
        }
        Ok(self.conn.as_mut().expect("set above"))
    }

    fn once(&mut self, req: &str) -> io::Result<String> {
        let (r, w) = self.ensure()?;
        w.write_all(format!("{req}\n").as_bytes())?;
        let mut line = String::new();
        let n = r.by_ref().take(REPLY_BYTES_MAX).read_line(&mut line)?;
        if n == 0 || !line.ends_with('\n') {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "control connection closed",
            ));
        }
        Ok(line.trim_end().to_string())
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
