//! Peer fetch: how an initial node gets a body from the service node's cache.
//!
//! [`PeerTransport`] is the extension point: [`TcpTransport`] (PRESS as published, the
//! service node's process answers) is here; [`super::udp::UdpTransport`] (user-level
//! UDP), [`super::onesided::XdpTransport`] (one-sided READs of the peer's arena, answered
//! by its XDP program) and [`super::onesided::ShmTransport`] (the arena mapped, one host)
//! implement the same `fetch`. Whatever the transport, the caller gets a body only after
//! its object, length and CRC32c were checked ([`super::wire::decode_body`], or the
//! arena's seqlock, url hash and CRC32c).
//!
//! Frames on the TCP peer port are `auth` envelopes (32 bytes, with the covered length)
//! followed by the message: the reader bounds the length before reading it.

use super::overhead::Overhead;
use super::seal::{Sealer, COOP_KEY_ID};
use super::wire;
use farside_auth::mac::{self, Envelope};
use farside_auth::siphash::SipKey;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Time to connect to a peer: on one LAN a SYN answers in well under a millisecond; 200
/// ms covers a busy host and bounds what a dead peer costs a request.
pub const PEER_CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// Time for one read or write on a peer connection: a 4 MiB body at 1 Gb/s takes 34 ms;
/// one second covers a loaded peer and bounds a stuck one.
pub const PEER_IO_TIMEOUT: Duration = Duration::from_secs(1);
/// Idle connections kept per peer: one per worker of a small node; more are closed after
/// use.
pub const PEER_POOL_MAX: usize = 16;
/// Peer connections a node serves at once (one thread each); more are closed at once.
/// Rule: each peer's pool (16) times the largest lab cluster's other nodes (7), plus room.
pub const PEER_CONNS_MAX: usize = 128;
/// Idle time after which the server side of a peer connection closes it.
pub const PEER_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Gets bodies from peers' caches.
pub trait PeerTransport: Send + Sync {
    /// The body of `object` from `peer`'s cache, checked; `Ok(None)` if the peer does not
    /// hold it (a stale or false-positive hint); `Err` if the peer could not be asked or
    /// its reply was refused. `len`: the body's length if the caller knows it (its own
    /// copy of the file), which picks the path for bodies a transport cannot move.
    fn fetch(&self, peer: usize, object: u64, len: Option<u64>) -> io::Result<Option<Vec<u8>>>;
}

/// Fetches over TCP from the peer's process (its peer port), with a bounded pool of
/// kept-alive connections per peer.
pub struct TcpTransport {
    sealer: Sealer,
    peers: Vec<SocketAddr>,
    pools: Vec<Mutex<Vec<TcpStream>>>,
    /// The per-message overhead ablation, shared with the node (and with the
    /// transports that fall back to this one).
    pub(crate) overhead: Arc<Overhead>,
}

impl TcpTransport {
    pub fn new(
        me: usize,
        peers: Vec<SocketAddr>,
        key: SipKey,
        overhead: Arc<Overhead>,
    ) -> TcpTransport {
        TcpTransport {
            sealer: Sealer::new(key, me).expect("a key the node already accepted"),
            pools: peers.iter().map(|_| Mutex::new(Vec::new())).collect(),
            peers,
            overhead,
        }
    }

    fn connection(&self, peer: usize) -> io::Result<TcpStream> {
        if let Some(s) = self.pools[peer]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
        {
            return Ok(s);
        }
        let s = TcpStream::connect_timeout(&self.peers[peer], PEER_CONNECT_TIMEOUT)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(PEER_IO_TIMEOUT))?;
        s.set_write_timeout(Some(PEER_IO_TIMEOUT))?;
        Ok(s)
    }
}

fn refused(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Reads one frame (envelope + message) of at most `max` message bytes.
pub fn read_frame(s: &mut impl Read, max: usize) -> io::Result<Vec<u8>> {
    let mut frame = vec![0u8; mac::ENVELOPE_BYTES];
    s.read_exact(&mut frame)?;
    let len = u32::from_le_bytes(frame[12..16].try_into().expect("4 bytes")) as usize;
    if len > max {
        return Err(refused(format!("frame of {len} bytes, at most {max}")));
    }
    frame.resize(mac::ENVELOPE_BYTES + len, 0);
    s.read_exact(&mut frame[mac::ENVELOPE_BYTES..])?;
    Ok(frame)
}

impl PeerTransport for TcpTransport {
    fn fetch(&self, peer: usize, object: u64, _len: Option<u64>) -> io::Result<Option<Vec<u8>>> {
        if peer >= self.peers.len() {
            return Err(refused("no such peer"));
        }
        let mut s = self.connection(peer)?;
        let (request, seq) = self.sealer.seal(&wire::encode_fetch(object));
        let env = Envelope {
            key_id: COOP_KEY_ID,
            sender: self.sealer.me,
            seq,
        };
        self.overhead.spin(1);
        s.write_all(&request)?;
        let reply = read_frame(&mut s, wire::BODY_HEAD_BYTES + wire::BODY_BYTES_MAX)?;
        self.overhead.spin(1);
        let msg = self
            .sealer
            .open_reply(&env, &reply)
            .ok_or_else(|| refused("reply not sealed for this request"))?;
        let body = wire::decode_body(object, msg).map_err(|e| refused(format!("{e:?}")))?;
        let body = body.map(<[u8]>::to_vec);
        let mut pool = self.pools[peer].lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < PEER_POOL_MAX {
            pool.push(s);
        }
        Ok(body)
    }
}
