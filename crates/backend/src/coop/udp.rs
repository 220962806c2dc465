//! Peer fetch over UDP, answered in user space by the service node's process (on its
//! peer port's UDP socket, the thread that also takes directory updates).
//!
//! ```text
//!  initial node ── 'F' object (sealed, fresh sequence) ──► service node's process
//!               ◄── 'P' pieces, each sealed with the fetch's envelope ──
//!  'P' | object u64 | present u8 | len u32 | crc32c u32 | piece u16 | pieces u16 | bytes
//! ```
//!
//! Bounded like the TCP port: a fetch is authenticated and checked against the replay
//! window of its sender before it is acted on, a body is at most [`UDP_BODY_BYTES_MAX`]
//! (larger ones go over TCP) in at most [`UDP_PIECES_MAX`] datagrams, and the client
//! waits [`UDP_FETCH_TIMEOUT`] for all of them, asks again (a new sequence) at most
//! [`UDP_RESENDS_MAX`] times, then fails (the caller reads its disk). The whole body is
//! accepted only if every piece agrees on object, length and CRC32c and the CRC matches.

use super::arena::OBJECT_BYTES_MAX;
use super::peer::{PeerTransport, TcpTransport, PEER_POOL_MAX};
use super::seal::{Sealer, COOP_KEY_ID};
use super::wire;
use farside_auth::mac::{self, Envelope};
use farside_auth::siphash::SipKey;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// First byte of a body piece.
pub const KIND_PIECE: u8 = b'P';
/// Bytes of a piece before its body bytes.
pub const PIECE_HEAD_BYTES: usize = 1 + 8 + 1 + 4 + 4 + 2 + 2;
/// Body bytes per piece: 60,000 B keeps a sealed piece within one UDP datagram (65,507
/// B), so a body of [`UDP_BODY_BYTES_MAX`] takes two.
pub const UDP_PIECE_BYTES: usize = 60_000;
/// Largest body fetched over UDP: the arena's one-sided bound, so udp, xdp and shm move
/// the same bodies and send the same larger ones over TCP.
pub const UDP_BODY_BYTES_MAX: usize = OBJECT_BYTES_MAX;
/// Pieces of one body at most.
pub const UDP_PIECES_MAX: usize = UDP_BODY_BYTES_MAX.div_ceil(UDP_PIECE_BYTES);
/// How long the client waits for a whole answer before it asks again. Rule: a loaded
/// node answers within a few ms (one scheduling period of its CPU quota is 100 ms at
/// worst, which a resend then covers); short enough that a lost datagram costs little.
pub const UDP_FETCH_TIMEOUT: Duration = Duration::from_millis(50);
/// Times a fetch is asked again before it fails: 3 losses in a row mean the peer is gone
/// or saturated, where the disk is the better source.
pub const UDP_RESENDS_MAX: u32 = 3;
/// Receive buffer a client socket asks for: every piece of one answer (the kernel may
/// cap it at `rmem_max`).
const RECV_BUFFER_BYTES: usize = 256 * 1024;

/// The pieces answering a fetch of `object`: the body (with its CRC) or absent.
pub fn encode_pieces(object: u64, body: Option<(&[u8], u32)>) -> Vec<Vec<u8>> {
    let head = |present: u8, len: usize, crc: u32, i: usize, n: usize| {
        let mut out = Vec::with_capacity(PIECE_HEAD_BYTES + UDP_PIECE_BYTES);
        out.push(KIND_PIECE);
        out.extend_from_slice(&object.to_le_bytes());
        out.push(present);
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&(i as u16).to_le_bytes());
        out.extend_from_slice(&(n as u16).to_le_bytes());
        out
    };
    match body {
        Some((b, crc)) if b.len() <= UDP_BODY_BYTES_MAX => {
            let n = b.len().div_ceil(UDP_PIECE_BYTES).max(1);
            (0..n)
                .map(|i| {
                    let mut p = head(1, b.len(), crc, i, n);
                    let end = ((i + 1) * UDP_PIECE_BYTES).min(b.len());
                    p.extend_from_slice(&b[i * UDP_PIECE_BYTES..end]);
                    p
                })
                .collect()
        }
        _ => vec![head(0, 0, 0, 0, 1)],
    }
}

/// One decoded piece.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece<'a> {
    pub present: bool,
    pub len: usize,
    pub crc: u32,
    pub index: usize,
    pub count: usize,
    pub bytes: &'a [u8],
}

/// A piece answering a fetch of `object`, or `None` if malformed or for another object.
pub fn decode_piece(object: u64, b: &[u8]) -> Option<Piece<'_>> {
    if b.len() < PIECE_HEAD_BYTES || b[0] != KIND_PIECE {
        return None;
    }
    if u64::from_le_bytes(b[1..9].try_into().ok()?) != object {
        return None;
    }
    let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as usize;
    let p = Piece {
        present: b[9] == 1,
        len: u32::from_le_bytes(b[10..14].try_into().ok()?) as usize,
        crc: u32::from_le_bytes(b[14..18].try_into().ok()?),
        index: u16_at(18),
        count: u16_at(20),
        bytes: &b[PIECE_HEAD_BYTES..],
    };
    let ok = match (b[9], p.present) {
        (0, false) => p.len == 0 && p.count == 1 && p.index == 0 && p.bytes.is_empty(),
        (1, true) => {
            p.len <= UDP_BODY_BYTES_MAX
                && p.count == p.len.div_ceil(UDP_PIECE_BYTES).max(1)
                && p.index < p.count
                && p.bytes.len()
                    == (p.len - (p.index * UDP_PIECE_BYTES).min(p.len)).min(UDP_PIECE_BYTES)
        }
        _ => false,
    };
    ok.then_some(p)
}

/// Fetches over UDP from the peer's process, a bounded pool of sockets per peer.
pub struct UdpTransport {
    tcp: TcpTransport,
    sealer: Sealer,
    peers: Vec<SocketAddr>,
    pools: Vec<Mutex<Vec<UdpSocket>>>,
    /// Attempts that timed out and were asked again (the node's `peer_resends`).
    resends: Arc<AtomicU64>,
}

impl UdpTransport {
    pub fn new(
        tcp: TcpTransport,
        me: usize,
        peers: Vec<SocketAddr>,
        key: SipKey,
        resends: Arc<AtomicU64>,
    ) -> UdpTransport {
        UdpTransport {
            tcp,
            sealer: Sealer::new(key, me).expect("a key the node already accepted"),
            pools: peers.iter().map(|_| Mutex::new(Vec::new())).collect(),
            peers,
            resends,
        }
    }

    fn socket(&self, peer: usize) -> io::Result<UdpSocket> {
        if let Some(s) = self.pools[peer]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
        {
            return Ok(s);
        }
        let bind: SocketAddr = if self.peers[peer].is_ipv4() {
            "0.0.0.0:0".parse().expect("literal")
        } else {
            "[::]:0".parse().expect("literal")
        };
        let s = UdpSocket::bind(bind)?;
        s.connect(self.peers[peer])?;
        farside_rdmahttp::arena_read::set_recv_buffer(&s, RECV_BUFFER_BYTES);
        Ok(s)
    }

    /// One attempt: the body, absent, or `Err(TimedOut)` if not all pieces came.
    fn attempt(&self, s: &UdpSocket, object: u64, buf: &mut [u8]) -> io::Result<Option<Vec<u8>>> {
        let (request, seq) = self.sealer.seal(&wire::encode_fetch(object));
        let env = Envelope {
            key_id: COOP_KEY_ID,
            sender: self.sealer.me,
            seq,
        };
        self.tcp.overhead.spin(1);
        s.send(&request)?;
        let deadline = Instant::now() + UDP_FETCH_TIMEOUT;
        let mut body: Vec<u8> = Vec::new();
        let mut got: Vec<bool> = Vec::new();
        let (mut want_len, mut want_crc) = (0usize, 0u32);
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "udp fetch"));
            }
            s.set_read_timeout(Some(wait))?;
            let n = match s.recv(buf) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            };
            // Every datagram received is a message handled, a late one included.
            self.tcp.overhead.spin(1);
            // Late pieces of an earlier attempt carry another envelope: ignored.
            let Some(msg) = self.sealer.open_reply(&env, &buf[..n]) else {
                continue;
            };
            let Some(p) = decode_piece(object, msg) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "malformed piece",
                ));
            };
            if !p.present {
                return Ok(None);
            }
            if got.is_empty() {
                got = vec![false; p.count];
                body = vec![0; p.len];
                (want_len, want_crc) = (p.len, p.crc);
            }
            if p.len != want_len || p.crc != want_crc || p.count != got.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "pieces disagree",
                ));
            }
            if !got[p.index] {
                let at = p.index * UDP_PIECE_BYTES;
                body[at..at + p.bytes.len()].copy_from_slice(p.bytes);
                got[p.index] = true;
            }
            if got.iter().all(|&g| g) {
                if crc32c::crc32c(&body) != want_crc {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "body CRC32c"));
                }
                return Ok(Some(body));
            }
        }
    }
}

impl PeerTransport for UdpTransport {
    fn fetch(&self, peer: usize, object: u64, len: Option<u64>) -> io::Result<Option<Vec<u8>>> {
        if peer >= self.peers.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "no such peer"));
        }
        if len.is_some_and(|l| l > UDP_BODY_BYTES_MAX as u64) {
            return self.tcp.fetch(peer, object, len);
        }
        let s = self.socket(peer)?;
        let mut buf = vec![0u8; mac::ENVELOPE_BYTES + PIECE_HEAD_BYTES + UDP_PIECE_BYTES + 1];
        let mut last = io::Error::new(io::ErrorKind::TimedOut, "udp fetch");
        for attempt in 0..=UDP_RESENDS_MAX {
            if attempt > 0 {
                self.resends.fetch_add(1, Ordering::Relaxed);
            }
            match self.attempt(&s, object, &mut buf) {
                Ok(body) => {
                    let mut pool = self.pools[peer].lock().unwrap_or_else(|p| p.into_inner());
                    if pool.len() < PEER_POOL_MAX {
                        pool.push(s);
                    }
                    return Ok(body);
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coop::overhead::Overhead;

    #[test]
    fn a_silent_peer_costs_the_bounded_resends_and_they_are_counted() {
        // A bound socket that never answers: every attempt times out.
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let peers = vec!["127.0.0.1:9".parse().unwrap(), silent.local_addr().unwrap()];
        let key = SipKey::from_bytes(*b"0123456789abcdef");
        let overhead = Arc::new(Overhead::new(0));
        let tcp = TcpTransport::new(0, peers.clone(), key, overhead);
        let resends = Arc::new(AtomicU64::new(0));
        let t = UdpTransport::new(tcp, 0, peers, key, Arc::clone(&resends));
        let e = t.fetch(1, 7, Some(100)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(resends.load(Ordering::Relaxed), u64::from(UDP_RESENDS_MAX));
        // The peer saw every attempt: the first and each resend.
        silent.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 2048];
        let mut asked = 0;
        while silent.recv(&mut buf).is_ok() {
            asked += 1;
        }
        assert_eq!(asked, 1 + UDP_RESENDS_MAX);
    }

    #[test]
    fn pieces_round_trip_and_are_checked() {
        let body: Vec<u8> = (0..UDP_BODY_BYTES_MAX).map(|i| (i * 13) as u8).collect();
        let crc = crc32c::crc32c(&body);
        let pieces = encode_pieces(5, Some((&body, crc)));
        assert_eq!(pieces.len(), UDP_PIECES_MAX);
        let mut out = Vec::new();
        for p in &pieces {
            assert!(p.len() + mac::ENVELOPE_BYTES <= 65_507);
            let d = decode_piece(5, p).unwrap();
            assert_eq!((d.len, d.crc, d.count), (body.len(), crc, pieces.len()));
            out.extend_from_slice(d.bytes);
        }
        assert_eq!(out, body);
        assert_eq!(decode_piece(6, &pieces[0]), None, "another object");
        assert_eq!(
            decode_piece(5, &pieces[0][..pieces[0].len() - 1]),
            None,
            "short"
        );
        let absent = encode_pieces(5, None);
        assert!(!decode_piece(5, &absent[0]).unwrap().present);
        let tiny = encode_pieces(5, Some((b"", crc32c::crc32c(b""))));
        assert_eq!(decode_piece(5, &tiny[0]).unwrap().count, 1);
        assert_eq!(decode_piece(5, b"P"), None);
    }
}
