//! A minimal content-aware front-end for `lab coop`: an HTTP/1.1 dispatcher that
//! routes every request by its URL with one of `farside_coop::policy`'s front-end
//! policies, LARD (Pai et al., ASPLOS 1998: a target stays on its node unless that node
//! is above T_high while another is below T_low) or consistent hashing with bounded
//! load (as HAProxy's `hash-balance-factor`), over back-ends that each cache on their
//! own (`farside backend --coop --coop-policy rr`).
//!
//! The load a policy sees is the dispatcher's own count of requests in service at each
//! back-end (LARD's front-end counted its open connections; with kept-alive clients a
//! request in service is the same thing). One thread per client connection (at most
//! [`CONNS_MAX`]), each keeping one connection per back-end; requests are GETs without
//! a body (the trace's), relayed head and `Content-Length` body as they come.
//! It runs as a process of its own in the `lb` node: `farside lab coop --dispatch ...`.

use farside_coop::policy::{BoundedHash, ClusterView, Lard, NodeId, Request};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Client connections served at once; more are closed at accept (the lab's clients are
/// at most 8 × 64 kept-alive plus the open loop's short ones in flight).
pub const CONNS_MAX: usize = 4096;
/// Largest request or response head relayed.
const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Read/write timeout of every socket: a client idle this long is dropped, a back-end
/// this slow fails the request (502).
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Relay buffer.
const COPY_BYTES: usize = 64 * 1024;
/// `hash-balance-factor` of `bounded-hash`, as the anchor's.
pub const BOUNDED_HASH_FACTOR_PCT: u64 = crate::haproxy::HASH_BALANCE_FACTOR as u64;

/// The routing policy.
pub enum Route {
    Lard(Lard),
    Bounded(BoundedHash),
}

impl Route {
    /// `lard` (the paper's T_low 25, T_high 65) or `bounded-hash` over `nodes`.
    pub fn by_name(name: &str, nodes: usize) -> io::Result<Route> {
        match name {
            "lard" => Ok(Route::Lard(Lard::default())),
            "bounded-hash" => Ok(Route::Bounded(BoundedHash::new(
                nodes,
                BOUNDED_HASH_FACTOR_PCT,
            ))),
            o => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--dispatch: unknown policy {o:?} (lard, bounded-hash)"),
            )),
        }
    }

    fn node(&mut self, object: u64, view: &Loads) -> NodeId {
        let req = Request {
            object,
            bytes: 0,
            initial: 0,
        };
        match self {
            Route::Lard(p) => p.decide(&req, view).node,
            Route::Bounded(p) => p.decide(&req, view).node,
        }
    }
}

/// Requests in service at each back-end: what the policies see.
pub struct Loads(pub Vec<AtomicU64>);

impl ClusterView for Loads {
    fn nodes(&self) -> usize {
        self.0.len()
    }
    fn cached(&self, _: NodeId, _: u64) -> bool {
        false
    }
    fn hint(&self, _: NodeId, _: NodeId, _: u64) -> bool {
        false
    }
    fn load(&self, node: NodeId) -> u64 {
        self.0[node].load(Ordering::Relaxed)
    }
}

/// The URL's object key (FNV-1a 64 of the path, query excluded: the back-ends serve
/// the file of the path).
pub fn object_key(target: &str) -> u64 {
    let path = target.split('?').next().unwrap_or(target);
    path.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

struct Shared {
    backends: Vec<SocketAddr>,
    route: Mutex<Route>,
    loads: Loads,
    conns: AtomicUsize,
}

/// Serve on `listen` until the process is killed.
pub fn serve(listen: SocketAddr, backends: Vec<SocketAddr>, policy: &str) -> io::Result<()> {
    if backends.is_empty() || backends.len() > farside_coop::policy::NODES_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--dispatch-backends: 1 to 64 addresses",
        ));
    }
    let shared = Arc::new(Shared {
        route: Mutex::new(Route::by_name(policy, backends.len())?),
        loads: Loads((0..backends.len()).map(|_| AtomicU64::new(0)).collect()),
        backends,
        conns: AtomicUsize::new(0),
    });
    let listener = TcpListener::bind(listen)?;
    eprintln!("lab coop dispatcher ({policy}) on {listen}");
    for s in listener.incoming() {
        let Ok(s) = s else { continue };
        if shared.conns.fetch_add(1, Ordering::Relaxed) >= CONNS_MAX {
            shared.conns.fetch_sub(1, Ordering::Relaxed);
            continue;
        }
        let sh = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("dispatch".into())
            .spawn(move || {
                let _ = client(s, &sh);
                sh.conns.fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            shared.conns.fetch_sub(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Reads one head (up to the blank line) into `head`; false at a clean EOF.
fn read_head(r: &mut impl BufRead, head: &mut Vec<u8>) -> io::Result<bool> {
    head.clear();
    loop {
        let n = r.read_until(b'\n', head)?;
        if n == 0 {
            if head.is_empty() {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if head.len() > HEAD_BYTES_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"));
        }
        if head.ends_with(b"\r\n\r\n") || head == b"\r\n" {
            return Ok(true);
        }
    }
}

/// A header's value in `head` (case-insensitive name).
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn client(s: TcpStream, sh: &Shared) -> io::Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_nodelay(true)?;
    let mut out = s.try_clone()?;
    let mut r = BufReader::new(s);
    let mut ups: Vec<Option<BufReader<TcpStream>>> = (0..sh.backends.len()).map(|_| None).collect();
    let mut head = Vec::new();
    let mut resp = Vec::new();
    let mut buf = vec![0u8; COPY_BYTES];
    loop {
        if !read_head(&mut r, &mut head)? {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let target = text.split(' ').nth(1).unwrap_or("/").to_string();
        let has_body = header(&text, "content-length").is_some_and(|v| v != "0")
            || header(&text, "transfer-encoding").is_some();
        if has_body {
            out.write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )?;
            return Ok(());
        }
        let close = header(&text, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let node = sh
            .route
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .node(object_key(&target), &sh.loads);
        sh.loads.0[node].fetch_add(1, Ordering::Relaxed);
        let relayed = relay(sh, node, &mut ups, &head, &mut resp, &mut buf, &mut out);
        sh.loads.0[node].fetch_sub(1, Ordering::Relaxed);
        match relayed {
            Ok(keep) if keep && !close => {}
            Ok(_) => return Ok(()),
            Err(RelayError::Upstream) => {
                ups[node] = None;
                out.write_all(
                    b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )?;
                return Ok(());
            }
            Err(RelayError::Client(e)) => return Err(e),
        }
    }
}

enum RelayError {
    Upstream,
    Client(io::Error),
}

/// Sends `head` to back-end `node` (its kept connection, or a new one) and relays the
/// response to `out`; whether the back-end connection stays open.
fn relay(
    sh: &Shared,
    node: NodeId,
    ups: &mut [Option<BufReader<TcpStream>>],
    head: &[u8],
    resp: &mut Vec<u8>,
    buf: &mut [u8],
    out: &mut TcpStream,
) -> Result<bool, RelayError> {
    let up = |e: io::Error| {
        let _ = e;
        RelayError::Upstream
    };
    for attempt in 0..2 {
        let reused = ups[node].is_some();
        if ups[node].is_none() {
            let s = TcpStream::connect_timeout(&sh.backends[node], IO_TIMEOUT).map_err(up)?;
            s.set_read_timeout(Some(IO_TIMEOUT)).map_err(up)?;
            s.set_write_timeout(Some(IO_TIMEOUT)).map_err(up)?;
            s.set_nodelay(true).map_err(up)?;
            ups[node] = Some(BufReader::new(s));
        }
        let u = ups[node].as_mut().expect("set above");
        let sent = u.get_mut().write_all(head);
        let got = sent.and_then(|()| read_head(u, resp));
        match got {
            Ok(true) => {}
            // A kept connection the back-end closed while idle: once more on a new one.
            Ok(false) | Err(_) if reused && attempt == 0 => {
                ups[node] = None;
                continue;
            }
            _ => return Err(RelayError::Upstream),
        }
        let text = String::from_utf8_lossy(resp);
        let len: u64 = header(&text, "content-length")
            .and_then(|v| v.parse().ok())
            .ok_or(RelayError::Upstream)?;
        let keep = !header(&text, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        out.write_all(resp).map_err(RelayError::Client)?;
        let mut left = len;
        while left > 0 {
            let want = (left as usize).min(buf.len());
            let n = u.read(&mut buf[..want]).map_err(up)?;
            if n == 0 {
                return Err(RelayError::Upstream);
            }
            out.write_all(&buf[..n]).map_err(RelayError::Client)?;
            left -= n as u64;
        }
        if !keep {
            ups[node] = None;
        }
        return Ok(true);
    }
    Err(RelayError::Upstream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_ignore_the_query_and_differ_by_path() {
        assert_eq!(object_key("/a/b.gif?x=1"), object_key("/a/b.gif"));
        assert_ne!(object_key("/a/b.gif"), object_key("/a/c.gif"));
    }

    #[test]
    fn lard_sends_a_new_target_to_the_least_loaded_node_and_keeps_it_there() {
        let loads = Loads((0..3).map(|_| AtomicU64::new(0)).collect());
        loads.0[0].store(5, Ordering::Relaxed);
        loads.0[2].store(3, Ordering::Relaxed);
        let mut r = Route::by_name("lard", 3).unwrap();
        assert_eq!(r.node(7, &loads), 1);
        loads.0[1].store(9, Ordering::Relaxed);
        assert_eq!(r.node(7, &loads), 1, "below T_high: stays");
        assert!(Route::by_name("nope", 3).is_err());
    }
}
