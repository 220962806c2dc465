//! The one-sided MOVE: a migration's source moves the client's flow at the front-end
//! with one UDP datagram that the front-end's tc program answers in the kernel
//! (`handle_move` in `bpf/frontend.bpf.c`): no front-end process, no control
//! connection. Over a veth/bridge LAN the whole round trip completes inside the
//! requester's `sendto` (the reply is queued on its socket before `sendto` returns).
//!
//! Protocol, version [`VERSION`] (docs/frontend.md "One-sided MOVE"): UDP to the
//! front-end's own address on its move port (`farside frontend --move-udp-port`,
//! default the control port's number), a payload of exactly [`MSG_BYTES`] bytes,
//! network byte order:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic [`MAGIC`] (`"FSMV"`) |
//! | 4 | 1 | version [`VERSION`] |
//! | 5 | 1 | op: [`OP_REQUEST`]; the reply [`OP_REPLY`] |
//! | 6 | 2 | status: 0 in a request; the reply's [`MoveStatus`] (1 to 5) |
//! | 8 | 8 | seq, chosen by the requester, echoed |
//! | 16 | 4 | client IPv4 address (the flow: client to the VIP:port) |
//! | 20 | 2 | client port |
//! | 22 | 2 | reserved, 0 |
//! | 24 | 4 | expected back-end: the one the entry names now, and the sender |
//! | 28 | 4 | new back-end |
//!
//! The [`MoveClient`] sends a request and waits for the reply with its seq, at most
//! [`ATTEMPTS`] times [`ATTEMPT_TIMEOUT`] (a retry after a lost reply is answered
//! [`MoveStatus::Already`]).
//!
//! **Authenticated** (the front-end started with `--key-file`): the payload is
//! [`SEALED_BYTES`] = 64 bytes, a `farside_auth::mac` envelope (domain
//! `FrontendMove`, the key's id, `len` 32, sender = the requester's IPv4 address as a
//! u64, a sequence number above every earlier one of this sender under this key) and
//! then the 32 bytes above. The front-end's program verifies the tag, that the sender
//! is the expected back-end, and that the sequence is above the highest it accepted
//! from that (key id, sender); the reply is sealed the same way under the same key,
//! with the front-end's address as sender and the request's sequence echoed. Every
//! attempt is sealed afresh (a new sequence), so a retry is not a replay.
//! [`MoveClient::with_key`] turns it on; sequences come from one process-wide counter
//! ([`next_envelope_seq`]) so that pooled clients of one back-end never reuse one.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use farside_auth::mac::{self, Domain, Envelope, KeyId, ENVELOPE_BYTES};
use farside_auth::siphash::SipKey;

/// `"FSMV"` (`FE_MOVE_MAGIC`).
pub const MAGIC: u32 = 0x4653_4d56;
/// Protocol version (`FE_MOVE_VERSION`); a request of another version is dropped.
pub const VERSION: u8 = 1;
/// Op of a request (`FE_MOVE_OP_REQUEST`).
pub const OP_REQUEST: u8 = 1;
/// Op of a reply (`FE_MOVE_OP_REPLY`).
pub const OP_REPLY: u8 = 2;
/// Size of a request and of a reply (`struct fe_move_msg`): anything else is dropped.
pub const MSG_BYTES: usize = 32;
/// Size of an authenticated request and reply: the envelope, then the message.
pub const SEALED_BYTES: usize = ENVELOPE_BYTES + MSG_BYTES;
/// Attempts per move: a lost request or reply costs one [`ATTEMPT_TIMEOUT`]; three
/// losses in a row on a LAN mean the front-end is gone or refuses us.
pub const ATTEMPTS: u32 = 3;
/// Wait for a reply per attempt. The front-end answers in its receive path (on a
/// veth LAN before the request's `sendto` returns; on a real LAN one RTT): 50 ms is
/// hundreds of RTTs, and the migrating connection is frozen meanwhile.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(50);

/// The front-end's answer (`FE_MOVE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum MoveStatus {
    /// The entry named the expected back-end: it names the new one now (hold cleared).
    Moved = 1,
    /// The entry already named the new back-end (a retried request): hold cleared.
    Already = 2,
    /// The entry names a third back-end: nothing changed.
    NotOwner = 3,
    /// No entry for the flow (evicted): nothing written; the migration falls back
    /// to the source.
    NotFound = 4,
    /// The front-end's moved-flow table is full ([`crate::MOVED_MAX`]): nothing
    /// written; the migration falls back to the source.
    Full = 5,
}

impl MoveStatus {
    fn from_wire(v: u16) -> Option<MoveStatus> {
        Some(match v {
            1 => MoveStatus::Moved,
            2 => MoveStatus::Already,
            3 => MoveStatus::NotOwner,
            4 => MoveStatus::NotFound,
            5 => MoveStatus::Full,
            _ => return None,
        })
    }

    /// Whether the flow now goes to the new back-end.
    pub fn is_moved(self) -> bool {
        matches!(self, MoveStatus::Moved | MoveStatus::Already)
    }
}

/// One MOVE request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoveRequest {
    /// Echoed in the reply.
    pub seq: u64,
    /// The flow's client (its connection to the VIP).
    pub client: SocketAddrV4,
    /// The back-end the flow's entry names now; must be the request's sender.
    pub expected: Ipv4Addr,
    /// The back-end it is to name.
    pub next: Ipv4Addr,
}

impl MoveRequest {
    /// The request's payload.
    pub fn encode(&self) -> [u8; MSG_BYTES] {
        let mut b = [0u8; MSG_BYTES];
        b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        b[4] = VERSION;
        b[5] = OP_REQUEST;
        b[8..16].copy_from_slice(&self.seq.to_be_bytes());
        b[16..20].copy_from_slice(&self.client.ip().octets());
        b[20..22].copy_from_slice(&self.client.port().to_be_bytes());
        b[24..28].copy_from_slice(&self.expected.octets());
        b[28..32].copy_from_slice(&self.next.octets());
        b
    }

    /// The reply to this request, if `reply` is one: its status. None for anything
    /// else (wrong size, magic, version, op, seq, flow, or an unknown status).
    pub fn match_reply(&self, reply: &[u8]) -> Option<MoveStatus> {
        if reply.len() != MSG_BYTES {
            return None;
        }
        let mut want = self.encode();
        want[5] = OP_REPLY;
        // Everything but the status is the request's, echoed.
        if reply[..6] != want[..6] || reply[8..] != want[8..] {
            return None;
        }
        MoveStatus::from_wire(u16::from_be_bytes([reply[6], reply[7]]))
    }
}

/// A key the one-sided MOVE is sealed with: its id (as the front-end's `--key-id`) and
/// the key (from a key file: `farside_auth::keys::load_key`).
#[derive(Clone, Copy, Debug)]
pub struct MoveKey {
    /// Names the key at the front-end.
    pub id: KeyId,
    /// The 128-bit SipHash key.
    pub key: SipKey,
}

/// The envelope sender of a back-end (or front-end) address: the address as a u64.
pub fn sender_id(ip: Ipv4Addr) -> u64 {
    u64::from(u32::from(ip))
}

/// The last envelope sequence this process sent.
static ENVELOPE_SEQ: AtomicU64 = AtomicU64::new(0);

/// The next envelope sequence of this process: strictly increasing, and above what an
/// earlier run sent (the wall clock's seconds in the high 32 bits, as
/// `farside_auth::replay::Sequencer`), shared by every [`MoveClient`] of the process.
pub fn next_envelope_seq() -> u64 {
    let clock = farside_auth::replay::Sequencer::unix_s().min(u64::from(u32::MAX))
        << farside_auth::replay::SEQ_COUNT_BITS;
    let prev = ENVELOPE_SEQ
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
            Some(last.saturating_add(1).max(clock))
        })
        .unwrap_or_else(|v| v);
    prev.saturating_add(1).max(clock)
}

impl MoveRequest {
    /// The request sealed under `key` by `sender` with envelope sequence `env_seq`.
    pub fn seal(&self, key: &MoveKey, sender: Ipv4Addr, env_seq: u64) -> Vec<u8> {
        let env = Envelope {
            key_id: key.id,
            sender: sender_id(sender),
            seq: env_seq,
        };
        let mut out = Vec::with_capacity(SEALED_BYTES);
        mac::seal(
            &mut out,
            Domain::FrontendMove,
            &key.key,
            &env,
            &self.encode(),
        )
        .expect("32 bytes are under the envelope's bound");
        out
    }

    /// The authenticated reply to this request sealed with `env_seq`, from the
    /// front-end at `frontend`: its status, if `reply` verifies under `key`, names the
    /// front-end as sender, echoes `env_seq` and is the reply to this request.
    pub fn match_sealed_reply(
        &self,
        key: &MoveKey,
        frontend: Ipv4Addr,
        env_seq: u64,
        reply: &[u8],
    ) -> Option<MoveStatus> {
        if reply.len() != SEALED_BYTES {
            return None;
        }
        let o = mac::open(Domain::FrontendMove, reply, |id| {
            (id == key.id).then_some(key.key)
        })
        .ok()?;
        if o.envelope.sender != sender_id(frontend) || o.envelope.seq != env_seq {
            return None;
        }
        self.match_reply(o.message)
    }
}

/// First seq of a client: time-derived so that two clients (or a restarted process)
/// on one port do not take each other's late replies for their own.
fn seq_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}

/// A UDP socket connected to a front-end's move port. Its source address (picked by
/// the kernel's routing toward the front-end, or given to [`MoveClient::bind`]) is
/// the requester: it must be the back-end's address as the front-end knows it
/// (`--backend MAC@IP=W`), since only the flow's owner may move it. Not shareable
/// between threads at once (one request in flight); pool them.
pub struct MoveClient {
    sock: UdpSocket,
    local: Ipv4Addr,
    frontend: SocketAddrV4,
    seq: u64,
    /// The socket's receive timeout now: [`ATTEMPT_TIMEOUT`], set once, so a move
    /// whose reply is the first datagram back costs no `setsockopt` (only a receive
    /// after a stale reply waits with what is left of its attempt, and the next
    /// attempt sets it back).
    read_timeout: Duration,
    /// Seal every request under this key (the front-end requires it with `--key-file`).
    key: Option<MoveKey>,
}

impl MoveClient {
    /// A client of the front-end's move port at `frontend`, sending from the address
    /// routing picks.
    pub fn connect(frontend: SocketAddrV4) -> io::Result<MoveClient> {
        MoveClient::bind(Ipv4Addr::UNSPECIFIED, frontend)
    }

    /// A client sending from `local` (unspecified: the address routing picks).
    pub fn bind(local: Ipv4Addr, frontend: SocketAddrV4) -> io::Result<MoveClient> {
        if frontend.port() == 0 || frontend.ip().is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("front-end move address {frontend}: needs an address and a port"),
            ));
        }
        let sock = UdpSocket::bind(SocketAddrV4::new(local, 0))?;
        sock.connect(frontend)?;
        sock.set_read_timeout(Some(ATTEMPT_TIMEOUT))?;
        let SocketAddr::V4(l) = sock.local_addr()? else {
            unreachable!("an IPv4 socket")
        };
        Ok(MoveClient {
            sock,
            local: *l.ip(),
            frontend,
            seq: seq_seed(),
            read_timeout: ATTEMPT_TIMEOUT,
            key: None,
        })
    }

    /// Seal every request under `key` (and accept only replies sealed under it): what
    /// a front-end started with `--key-file` requires.
    pub fn with_key(mut self, key: MoveKey) -> MoveClient {
        self.key = Some(key);
        self
    }

    /// The requester's address (the back-end that must own the flows it moves).
    pub fn local_ip(&self) -> Ipv4Addr {
        self.local
    }

    /// Move `client`'s flow from this back-end ([`MoveClient::local_ip`]) to `next`.
    /// `Ok` if the flow now goes to `next` (moved, or already); an error for
    /// `NotOwner`, `NotFound`, `Full`, no answer within [`ATTEMPTS`] x [`ATTEMPT_TIMEOUT`], or
    /// an ICMP refusal (nothing answers on the front-end's move port).
    pub fn move_flow(&mut self, client: SocketAddrV4, next: Ipv4Addr) -> io::Result<()> {
        let expected = self.local;
        match self.request(client, expected, next)? {
            s if s.is_moved() => Ok(()),
            MoveStatus::NotOwner => Err(io::Error::other(format!(
                "front-end {}: MOVE {client} {expected} -> {next}: NOT_OWNER (the flow names a third back-end)",
                self.frontend
            ))),
            MoveStatus::Full => Err(io::Error::other(format!(
                "front-end {}: MOVE {client} {expected} -> {next}: FULL (its moved-flow table is full)",
                self.frontend
            ))),
            _ => Err(io::Error::other(format!(
                "front-end {}: MOVE {client} {expected} -> {next}: NOT_FOUND (no flow entry: evicted?)",
                self.frontend
            ))),
        }
    }

    /// Send one request (a fresh seq; `expected` as given, for tests of the
    /// front-end's refusal) and return the front-end's status.
    pub fn request(
        &mut self,
        client: SocketAddrV4,
        expected: Ipv4Addr,
        next: Ipv4Addr,
    ) -> io::Result<MoveStatus> {
        self.seq = self.seq.wrapping_add(1);
        let req = MoveRequest {
            seq: self.seq,
            client,
            expected,
            next,
        };
        let plain = req.encode();
        let mut buf = [0u8; SEALED_BYTES + 1];
        // Envelope sequences of this request's attempts: a late reply to any of them
        // is this request's reply.
        let mut sent = [0u64; ATTEMPTS as usize];
        for attempt in 0..ATTEMPTS as usize {
            let msg = match &self.key {
                Some(k) => {
                    sent[attempt] = next_envelope_seq();
                    req.seal(k, self.local, sent[attempt])
                }
                None => plain.to_vec(),
            };
            self.sock.send(&msg).map_err(|e| self.refused(e))?;
            let deadline = Instant::now() + ATTEMPT_TIMEOUT;
            let mut first = true;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                // The attempt's first receive waits the whole ATTEMPT_TIMEOUT (ending at
                // most the few µs since `deadline` was taken after it), a later one only
                // what is left; the timeout is set only when it changes.
                let wait = if first { ATTEMPT_TIMEOUT } else { left };
                first = false;
                if wait != self.read_timeout {
                    self.sock.set_read_timeout(Some(wait))?;
                    self.read_timeout = wait;
                }
                match self.sock.recv(&mut buf) {
                    Ok(n) => {
                        // A stale reply (an earlier request's) or junk: keep waiting.
                        let got = match &self.key {
                            Some(k) => sent[..=attempt].iter().find_map(|&q| {
                                req.match_sealed_reply(k, *self.frontend.ip(), q, &buf[..n])
                            }),
                            None => req.match_reply(&buf[..n]),
                        };
                        if let Some(s) = got {
                            return Ok(s);
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                    {
                        break
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(self.refused(e)),
                }
            }
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "front-end {}: no MOVE reply in {ATTEMPTS} x {ATTEMPT_TIMEOUT:?} (front-end down, \
                 --move-udp-port off, or {} is not a back-end it knows)",
                self.frontend, self.local
            ),
        ))
    }

    fn refused(&self, e: io::Error) -> io::Error {
        if e.kind() == io::ErrorKind::ConnectionRefused {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!(
                    "front-end {}: nothing answers MOVE on this UDP port (front-end not running, or its --move-udp-port differs)",
                    self.frontend
                ),
            )
        } else {
            e
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> MoveRequest {
        MoveRequest {
            seq: 0x0102_0304_0506_0708,
            client: "10.0.9.1:40000".parse().unwrap(),
            expected: Ipv4Addr::new(10, 0, 0, 11),
            next: Ipv4Addr::new(10, 0, 0, 12),
        }
    }

    #[test]
    fn request_layout_is_the_documented_one() {
        let b = req().encode();
        assert_eq!(
            b,
            [
                b'F', b'S', b'M', b'V', 1, 1, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 0, 9, 1, 0x9c,
                0x40, 0, 0, 10, 0, 0, 11, 10, 0, 0, 12
            ]
        );
    }

    const KEY: MoveKey = MoveKey {
        id: KeyId(3),
        key: SipKey::from_halves(0x1122_3344_5566_7788, 0x99aa_bbcc_ddee_ff00),
    };

    #[test]
    fn a_sealed_request_is_the_envelope_then_the_message() {
        let r = req();
        let b = r.seal(&KEY, r.expected, 77);
        assert_eq!(b.len(), SEALED_BYTES);
        assert_eq!(&b[ENVELOPE_BYTES..], &r.encode());
        let o = mac::open(Domain::FrontendMove, &b, |_| Some(KEY.key)).unwrap();
        assert_eq!(o.envelope.key_id, KeyId(3));
        assert_eq!(o.envelope.sender, 0x0a00_000b);
        assert_eq!(o.envelope.seq, 77);
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 32);
    }

    #[test]
    fn only_a_sealed_reply_under_the_key_with_the_sequence_is_taken() {
        let r = req();
        let fe = Ipv4Addr::new(10, 0, 0, 2);
        let mut msg = r.encode();
        msg[5] = OP_REPLY;
        msg[7] = 1;
        let seal = |key: &MoveKey, sender: Ipv4Addr, seq: u64, msg: &[u8]| {
            let mut out = Vec::new();
            let env = Envelope {
                key_id: key.id,
                sender: sender_id(sender),
                seq,
            };
            mac::seal(&mut out, Domain::FrontendMove, &key.key, &env, msg).unwrap();
            out
        };
        let good = seal(&KEY, fe, 77, &msg);
        assert_eq!(
            r.match_sealed_reply(&KEY, fe, 77, &good),
            Some(MoveStatus::Moved)
        );
        // Another sequence, sender, key; a forged tag; the plain reply; the request.
        assert_eq!(r.match_sealed_reply(&KEY, fe, 78, &good), None);
        let other_sender = seal(&KEY, r.expected, 77, &msg);
        assert_eq!(r.match_sealed_reply(&KEY, fe, 77, &other_sender), None);
        let other_key = MoveKey {
            id: KEY.id,
            key: SipKey::from_halves(1, 2),
        };
        assert_eq!(r.match_sealed_reply(&other_key, fe, 77, &good), None);
        let mut forged = good.clone();
        forged[ENVELOPE_BYTES + 7] = 2;
        assert_eq!(r.match_sealed_reply(&KEY, fe, 77, &forged), None);
        assert_eq!(r.match_sealed_reply(&KEY, fe, 77, &msg), None);
        let request = r.seal(&KEY, fe, 77);
        assert_eq!(r.match_sealed_reply(&KEY, fe, 77, &request), None);
    }

    #[test]
    fn envelope_sequences_increase_and_start_at_the_clock() {
        let a = next_envelope_seq();
        let b = next_envelope_seq();
        assert!(b > a);
        assert!(a >> 32 >= farside_auth::replay::Sequencer::unix_s() - 1);
    }

    #[test]
    fn only_the_matching_reply_is_taken() {
        let r = req();
        let mut reply = r.encode();
        reply[5] = OP_REPLY;
        for (code, s) in [
            (1u8, MoveStatus::Moved),
            (2, MoveStatus::Already),
            (3, MoveStatus::NotOwner),
            (4, MoveStatus::NotFound),
        ] {
            reply[7] = code;
            assert_eq!(r.match_reply(&reply), Some(s));
        }
        reply[7] = 1;
        assert!(MoveStatus::Moved.is_moved() && MoveStatus::Already.is_moved());
        assert!(!MoveStatus::NotOwner.is_moved() && !MoveStatus::NotFound.is_moved());
        // Not a reply: the request itself, other seq, other flow, unknown status, size.
        assert_eq!(r.match_reply(&r.encode()), None);
        let other = MoveRequest {
            seq: r.seq + 1,
            ..r
        };
        assert_eq!(other.match_reply(&reply), None);
        let mut bad = reply;
        bad[21] ^= 1;
        assert_eq!(r.match_reply(&bad), None);
        let mut bad = reply;
        bad[7] = 9;
        assert_eq!(r.match_reply(&bad), None);
        assert_eq!(r.match_reply(&reply[..31]), None);
    }

    #[test]
    fn nothing_listening_is_a_quick_clear_error() {
        // A UDP port nothing listens on: the ICMP refusal ends the move at once.
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut c = MoveClient::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).unwrap();
        assert_eq!(c.local_ip(), Ipv4Addr::LOCALHOST);
        let t0 = Instant::now();
        let e = c
            .move_flow("10.0.9.1:1".parse().unwrap(), Ipv4Addr::new(10, 0, 0, 12))
            .unwrap_err();
        assert!(e.to_string().contains("nothing answers"), "{e}");
        assert!(t0.elapsed() < ATTEMPT_TIMEOUT * ATTEMPTS);
    }

    #[test]
    fn silence_times_out_after_the_bounded_attempts() {
        // A bound socket that never answers: three attempts, then TimedOut.
        let mute = UdpSocket::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(a) = mute.local_addr().unwrap() else {
            unreachable!()
        };
        let mut c = MoveClient::connect(a).unwrap();
        let t0 = Instant::now();
        let e = c
            .move_flow("10.0.9.1:1".parse().unwrap(), Ipv4Addr::new(10, 0, 0, 12))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(t0.elapsed() >= ATTEMPT_TIMEOUT * ATTEMPTS);
        let mut got = [0u8; 64];
        mute.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut n_req = 0;
        while let Ok(n) = mute.recv(&mut got) {
            assert_eq!(n, MSG_BYTES);
            n_req += 1;
            mute.set_nonblocking(true).unwrap();
        }
        assert_eq!(n_req, ATTEMPTS, "one datagram per attempt, same request");
    }

    #[test]
    fn a_late_reply_to_a_retried_request_is_accepted_and_stale_ones_ignored() {
        // A fake front-end that drops the first copy, answers a stale seq, then the right one.
        let fe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(a) = fe.local_addr().unwrap() else {
            unreachable!()
        };
        let h = std::thread::spawn(move || {
            let mut b = [0u8; 64];
            let (n, _) = fe.recv_from(&mut b).unwrap();
            assert_eq!(n, MSG_BYTES);
            let (n, from) = fe.recv_from(&mut b).unwrap();
            let mut reply = b;
            reply[5] = OP_REPLY;
            reply[7] = 2;
            let mut stale = reply;
            stale[15] ^= 0xff;
            fe.send_to(&stale[..n], from).unwrap();
            fe.send_to(&reply[..n], from).unwrap();
        });
        let mut c = MoveClient::connect(a).unwrap();
        let s = c
            .request(
                "10.0.9.1:1".parse().unwrap(),
                Ipv4Addr::LOCALHOST,
                Ipv4Addr::new(10, 0, 0, 12),
            )
            .unwrap();
        assert_eq!(s, MoveStatus::Already);
        h.join().unwrap();
        // The stale reply made the attempt wait with what was left of it; the next
        // request's attempt waits the whole ATTEMPT_TIMEOUT again.
        assert!(c.read_timeout < ATTEMPT_TIMEOUT);
        let fe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(a) = fe.local_addr().unwrap() else {
            unreachable!()
        };
        let h = answer_once(fe, 2);
        let mut c2 = MoveClient::connect(a).unwrap();
        // The kernel keeps SO_RCVTIMEO in jiffies: compare with what it reads back.
        let whole = c2.sock.read_timeout().unwrap();
        // A shortened timeout, as a stale reply leaves it, then a move.
        c2.sock.set_read_timeout(Some(ATTEMPT_TIMEOUT / 2)).unwrap();
        c2.read_timeout = ATTEMPT_TIMEOUT / 2;
        c2.move_flow("10.0.9.1:1".parse().unwrap(), Ipv4Addr::new(10, 0, 0, 12))
            .unwrap();
        h.join().unwrap();
        assert_eq!(c2.read_timeout, ATTEMPT_TIMEOUT);
        assert_eq!(c2.sock.read_timeout().unwrap(), whole);
    }

    /// A fake front-end answering one request with `code`.
    fn answer_once(fe: UdpSocket, code: u8) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut b = [0u8; 64];
            let (n, from) = fe.recv_from(&mut b).unwrap();
            b[5] = OP_REPLY;
            b[7] = code;
            fe.send_to(&b[..n], from).unwrap();
        })
    }

    /// A move answered by the first datagram back sets no receive timeout: the
    /// socket keeps the one set at connect (one `setsockopt` per move saved; before,
    /// every receive set the time left of its attempt).
    #[test]
    fn an_answered_move_leaves_the_receive_timeout_as_set_at_connect() {
        let fe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(a) = fe.local_addr().unwrap() else {
            unreachable!()
        };
        let mut c = MoveClient::connect(a).unwrap();
        assert!(c.sock.read_timeout().unwrap().is_some());
        // A mark no move would set: if the move set the socket's timeout (as every
        // receive did before), it would read back as about 50 ms.
        c.sock
            .set_read_timeout(Some(Duration::from_secs(7)))
            .unwrap();
        let h = answer_once(fe, 1);
        c.move_flow("10.0.9.1:1".parse().unwrap(), Ipv4Addr::new(10, 0, 0, 12))
            .unwrap();
        h.join().unwrap();
        assert_eq!(
            c.sock.read_timeout().unwrap(),
            Some(Duration::from_secs(7)),
            "the move set a receive timeout"
        );
    }
}
