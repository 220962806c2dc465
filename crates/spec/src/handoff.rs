//! Handing a restored (or fallen-back) connection to the local web server.
//!
//! - [`Handoff::Adopt`]: to `farside backend --adopt-socket PATH`, by passing the
//!   descriptor (SCM_RIGHTS); the server's workers then serve it like an accepted
//!   connection. No copy, no extra process on the data path.
//! - [`Handoff::Relay`]: to an unmodified server (nginx) listening on a local
//!   address: the daemon opens a new connection to it and relays bytes both ways (two
//!   threads per connection, `read`/`write` through a 64 KiB buffer each; half-closes
//!   are forwarded). Costs two extra socket copies per byte and two threads per
//!   connection, and the server sees 127.0.0.1 as the client. A sockmap `sk_skb`
//!   splice would save the copies but not the bookkeeping (the verdict never sees a
//!   FIN, and bytes already queued are not redirected: DESIGN.md); not done here.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest a hand-over may block on a full adoption queue or a slow connect to the
/// local server: a local server that cannot take a connection within a second is
/// stuck, and the connection is closed rather than holding the daemon.
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(1);
/// Most relayed connections at once (two threads each): bounds the daemon's threads.
pub const RELAYS_MAX: usize = 1024;
/// Relay buffer per direction.
const RELAY_BUF_BYTES: usize = 64 * 1024;
/// Relay threads' stack: one buffer lives on the heap, little else.
const RELAY_STACK_BYTES: usize = 64 * 1024;

/// Where connections go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handoff {
    /// `farside backend --adopt-socket PATH`.
    Adopt(PathBuf),
    /// An unmodified server at this local address, through a relay.
    Relay(SocketAddr),
}

/// Counters of the hand-off.
#[derive(Debug, Default)]
pub struct HandoffStats {
    /// Connections handed over.
    pub handed: AtomicU64,
    /// Hand-overs that failed (the connection was closed).
    pub failed: AtomicU64,
    /// Bytes relayed (both directions), with [`Handoff::Relay`].
    pub relayed_bytes: AtomicU64,
}

/// Hands connections to the local server.
pub struct HandOff {
    how: Handoff,
    via: Option<UnixDatagram>,
    relays: Arc<AtomicUsize>,
    stats: Arc<HandoffStats>,
}

impl HandOff {
    /// Prepares the hand-off (an unbound datagram socket for [`Handoff::Adopt`]).
    pub fn new(how: Handoff) -> io::Result<Self> {
        let via = match &how {
            Handoff::Adopt(_) => Some(UnixDatagram::unbound()?),
            Handoff::Relay(_) => None,
        };
        Ok(Self {
            how,
            via,
            relays: Arc::new(AtomicUsize::new(0)),
            stats: Arc::new(HandoffStats::default()),
        })
    }

    /// The counters.
    pub fn stats(&self) -> &HandoffStats {
        &self.stats
    }

    /// Hands `conn` over. On error the connection is dropped (closed).
    pub fn hand(&self, conn: TcpStream) -> io::Result<()> {
        let r = match (&self.how, &self.via) {
            (Handoff::Adopt(path), Some(via)) => {
                farside_backend::adopt::send(via, path, conn.as_raw_fd(), HANDOFF_TIMEOUT)
            }
            (Handoff::Relay(to), _) => self.relay(conn, *to),
            (Handoff::Adopt(_), None) => unreachable!("adopt has its socket"),
        };
        match &r {
            Ok(()) => self.stats.handed.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.stats.failed.fetch_add(1, Ordering::Relaxed),
        };
        r
    }

    fn relay(&self, conn: TcpStream, to: SocketAddr) -> io::Result<()> {
        if self.relays.fetch_add(1, Ordering::SeqCst) >= RELAYS_MAX {
            self.relays.fetch_sub(1, Ordering::SeqCst);
            return Err(io::Error::other(format!("{RELAYS_MAX} relays already")));
        }
        let guard = RelaySlot(Arc::clone(&self.relays));
        let server = TcpStream::connect_timeout(&to, HANDOFF_TIMEOUT)?;
        server.set_nodelay(true)?;
        conn.set_nodelay(true)?;
        conn.set_nonblocking(false)?;
        let (c2, s2) = (conn.try_clone()?, server.try_clone()?);
        let stats = Arc::clone(&self.stats);
        let stats2 = Arc::clone(&self.stats);
        let up = std::thread::Builder::new()
            .name("specd-relay-up".into())
            .stack_size(RELAY_STACK_BYTES)
            .spawn(move || pump(conn, server, &stats))?;
        std::thread::Builder::new()
            .name("specd-relay-down".into())
            .stack_size(RELAY_STACK_BYTES)
            .spawn(move || {
                pump(s2, c2, &stats2);
                let _ = up.join();
                drop(guard);
            })?;
        Ok(())
    }
}

/// Frees a relay slot when both directions are done.
struct RelaySlot(Arc<AtomicUsize>);

impl Drop for RelaySlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Copies `from` → `to` until EOF or an error, then half-closes `to` (forwarding the
/// FIN); on an error both are shut down so the other direction ends too.
fn pump(mut from: TcpStream, mut to: TcpStream, stats: &HandoffStats) {
    let mut buf = vec![0u8; RELAY_BUF_BYTES];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                let _ = to.shutdown(Shutdown::Both);
                let _ = from.shutdown(Shutdown::Both);
                return;
            }
        };
        if to.write_all(&buf[..n]).is_err() {
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
        stats.relayed_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn relay_carries_both_directions_and_forwards_half_close() {
        // The "unmodified server": echoes everything, then closes after EOF.
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let server_addr = server.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut all = Vec::new();
            s.read_to_end(&mut all).unwrap();
            s.write_all(&all).unwrap();
        });
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(front.local_addr().unwrap()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (conn, _) = front.accept().unwrap();
        let h = HandOff::new(Handoff::Relay(server_addr)).unwrap();
        h.hand(conn).unwrap();
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
        client.write_all(&data).unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).unwrap();
        assert_eq!(back, data);
        echo.join().unwrap();
        assert_eq!(h.stats().handed.load(Ordering::Relaxed), 1);
        let t0 = std::time::Instant::now();
        while h.relays.load(Ordering::SeqCst) != 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "relay slot not freed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            h.stats().relayed_bytes.load(Ordering::Relaxed),
            2 * data.len() as u64
        );
    }

    fn process_cpu_us() -> u64 {
        // SAFETY: getrusage writes one rusage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }

    /// Sends `bytes` from a client to a sink server, through the relay or directly;
    /// returns (wall µs, process CPU µs).
    fn transfer(bytes: usize, relay: bool) -> (u64, u64) {
        let sink = TcpListener::bind("127.0.0.1:0").unwrap();
        let sink_addr = sink.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = sink.accept().unwrap();
            let mut buf = vec![0u8; 1 << 16];
            let mut got = 0;
            while got < bytes {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0);
                got += n;
            }
            s.write_all(b"k").unwrap();
        });
        let h = HandOff::new(Handoff::Relay(sink_addr)).unwrap();
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let (t0, c0) = (std::time::Instant::now(), process_cpu_us());
        let mut client = if relay {
            let c = TcpStream::connect(front.local_addr().unwrap()).unwrap();
            let (conn, _) = front.accept().unwrap();
            h.hand(conn).unwrap();
            c
        } else {
            TcpStream::connect(sink_addr).unwrap()
        };
        let chunk = vec![7u8; 1 << 16];
        let mut sent = 0;
        while sent < bytes {
            client.write_all(&chunk).unwrap();
            sent += chunk.len();
        }
        let mut k = [0u8; 1];
        client.read_exact(&mut k).unwrap();
        server.join().unwrap();
        (
            t0.elapsed().as_micros() as u64,
            process_cpu_us().saturating_sub(c0),
        )
    }

    /// The relay's cost against a direct connection on loopback (informative: run
    /// on an idle machine with `cargo test -p farside-spec relay_cost -- --ignored
    /// --nocapture`).
    #[test]
    #[ignore = "measurement, not a check: run on an idle machine"]
    fn relay_cost() {
        const BYTES: usize = 256 << 20;
        let (dw, dc) = transfer(BYTES, false);
        let (rw, rc) = transfer(BYTES, true);
        let mb = BYTES as f64 / 1e6;
        eprintln!(
            "direct: {:.0} MB/s, {:.1} µs CPU/MB; relay: {:.0} MB/s, {:.1} µs CPU/MB (+{:.1} µs/MB)",
            mb / (dw as f64 / 1e6),
            dc as f64 / mb,
            mb / (rw as f64 / 1e6),
            rc as f64 / mb,
            (rc as f64 - dc as f64) / mb
        );
    }

    #[test]
    fn relay_to_a_dead_server_fails_and_counts() {
        let dead = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = dead.local_addr().unwrap();
        drop(dead);
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(front.local_addr().unwrap()).unwrap();
        let (conn, _) = front.accept().unwrap();
        let h = HandOff::new(Handoff::Relay(addr)).unwrap();
        assert!(h.hand(conn).is_err());
        assert_eq!(h.stats().failed.load(Ordering::Relaxed), 1);
        assert_eq!(h.relays.load(Ordering::SeqCst), 0);
    }
}
