//! The hand-over protocol's messages and their compact, versioned encoding.
//!
//! Frame (all integers big-endian):
//!
//! ```text
//! magic "FSMG" | version u8 (= 3) | kind u8 | payload length u32 | payload
//! ```
//!
//! Version 2: a control connection carries any number of hand-overs one after the
//! other (the source keeps it in a [`crate::ControlPool`]; version 1 closed it after
//! one), and OFFER_COMMIT exists. Version 3 (this one): the end of a migration is
//! acknowledged, DONE answered RELEASED (or FAILED), so a source counts a connection
//! migrated only once the target holds it. A peer speaking another version is refused
//! with [`WireError::Version`], whose text names both versions.
//!
//! Kinds: `1 OFFER(state)`, `2 ACCEPT`, `3 REFUSE(reason)`, `4 COMMIT`,
//! `5 RESTORED`, `6 FAILED(reason)`, `7 DONE`, `8 ABORT`, `9 OFFER_COMMIT(state)`,
//! `10 RELEASED`
//! (version 2: OFFER and COMMIT at once, answered REFUSE or RESTORED/FAILED). A
//! reason is UTF-8 text of at most [`REASON_BYTES_MAX`] bytes. The OFFER (and
//! OFFER_COMMIT) payload (a [`TcpState`]):
//!
//! ```text
//! family u8 (4|6) | local addr | remote addr
//!     addr = v4: ip[4] port u16 | v6: ip[16] flowinfo u32 scope_id u32 port u16
//! snd_seq u32 | rcv_seq u32 | timestamp u32
//! mss u16 | flags u8 (bit0 wscale, bit1 sack, bit2 timestamps) | snd_wscale u8 | rcv_wscale u8
//! snd_wl1 u32 | snd_wnd u32 | max_window u32 | rcv_wnd u32 | rcv_wup u32
//! sndbuf u32 | rcvbuf u32 | unsent_len u32
//! send_len u32 | send bytes | recv_len u32 | recv bytes
//! ```
//!
//! The decoder refuses anything malformed: wrong magic or version, unknown kind or
//! flag bits, lengths above their bounds, truncation, trailing bytes, or a state that
//! fails [`TcpState::validate`].
//!
//! **Version 4, authenticated** ([`Auth`], daemons given a key): every frame, in both
//! directions, is written with version 4 in its header and wrapped:
//!
//! ```text
//! envelope (32 bytes, farside_auth::mac, domain SpecdMigration, covering the header)
//!     | header (10 bytes) | payload | payload tag u64 LE (only if the payload is not empty)
//! payload tag = SipHash-2-4(key, label | key id u32 | 0xffffffff | header tag u64 | payload)
//! ```
//!
//! The receiver verifies the envelope, checks that its sequence number's clock is
//! within [`SEQ_CLOCK_SKEW_MAX_S`] of its own and moves its replay window (per key id
//! and sender) before it reads a byte of the payload, so a host without the key never
//! gets its payload read; the payload tag is bound to the header's (unique per
//! sequence number), and its `0xffffffff` length can never be an envelope's. A frame
//! failing either check ends the connection. Keyed and unkeyed daemons do not talk:
//! both ends must be given the same key.

use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use farside_auth::mac::{self, Domain, Envelope, KeyId, ENVELOPE_BYTES};
use farside_auth::replay::{ReplayTable, Sequencer};
use farside_auth::siphash::{siphash24, Sip24, SipKey};

use crate::state::{RepairWindow, TcpOptions, TcpState, QUEUE_BYTES_MAX, WSCALE_MAX};

/// Frame magic.
pub const MAGIC: [u8; 4] = *b"FSMG";
/// The wire version this crate writes and reads without a key (2: control
/// connections are reused across hand-overs; 3: DONE is acknowledged, RELEASED).
pub const VERSION: u8 = 3;
/// The wire version of the authenticated framing ([`Auth`]).
pub const VERSION_AUTH: u8 = 4;
/// Bytes an authenticated frame starts with before its header.
pub const AUTH_ENVELOPE_BYTES: usize = ENVELOPE_BYTES;
/// Bytes of the payload tag after an authenticated frame's (non-empty) payload.
pub const PAYLOAD_TAG_BYTES: usize = 8;
/// Frame header: magic, version, kind, payload length.
pub const HEADER_BYTES: usize = 4 + 1 + 1 + 4;
/// Longest REFUSE/FAILED reason: a one-line diagnostic, not a log.
pub const REASON_BYTES_MAX: usize = 256;
/// Fixed part of an OFFER payload at its largest (IPv6 addresses).
const STATE_FIXED_BYTES_MAX: usize = 1 + 2 * (16 + 4 + 4 + 2) + 3 * 4 + 5 + 5 * 4 + 3 * 4 + 2 * 4;
/// An OFFER payload up to and including the send queue's length: family, addresses
/// (`addr` bytes each), then sequence numbers, timestamp, options, window, buffer
/// sizes, unsent length and the send queue's length.
const fn offer_prefix_bytes(addr: usize) -> usize {
    1 + 2 * addr + 3 * 4 + 5 + 5 * 4 + 3 * 4 + 4
}
/// [`offer_prefix_bytes`] with IPv4 addresses (ip, port).
const OFFER_PREFIX_V4: usize = offer_prefix_bytes(4 + 2);
/// [`offer_prefix_bytes`] with IPv6 addresses (ip, flowinfo, scope id, port).
const OFFER_PREFIX_V6: usize = offer_prefix_bytes(16 + 4 + 4 + 2);
const _: () = assert!(OFFER_PREFIX_V6 + 4 == STATE_FIXED_BYTES_MAX);
/// Longest payload: an OFFER with both queues full. Bounds the reader's allocation.
pub const PAYLOAD_BYTES_MAX: usize = STATE_FIXED_BYTES_MAX + 2 * QUEUE_BYTES_MAX;

const FLAG_WSCALE: u8 = 1;
const FLAG_SACK: u8 = 2;
const FLAG_TIMESTAMPS: u8 = 4;
const FLAGS_KNOWN: u8 = FLAG_WSCALE | FLAG_SACK | FLAG_TIMESTAMPS;

/// Why the wire decoder refused its input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Input ended early.
    Truncated,
    /// Bad magic.
    Magic,
    /// Version this decoder does not speak.
    Version(u8),
    /// Unknown message kind.
    Kind(u8),
    /// A length above its bound.
    TooLarge(&'static str, usize),
    /// A field with an invalid value.
    Invalid(String),
    /// Bytes after the end of the message.
    Trailing(usize),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => write!(f, "truncated"),
            Self::Magic => write!(f, "bad magic"),
            Self::Version(v) => write!(
                f,
                "peer speaks migration wire version {v}, this build speaks {} (upgrade both daemons together{})",
                VERSION,
                if *v == VERSION_AUTH {
                    "; version 4 is the keyed framing: give both daemons the same key"
                } else {
                    ""
                }
            ),
            Self::Kind(k) => write!(f, "unknown message kind {k}"),
            Self::TooLarge(what, n) => write!(f, "{what} of {n} bytes above its bound"),
            Self::Invalid(s) => write!(f, "invalid: {s}"),
            Self::Trailing(n) => write!(f, "{n} trailing bytes"),
        }
    }
}

impl std::error::Error for WireError {}

/// One protocol message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Source → target: the connection's state; the target answers ACCEPT or REFUSE.
    Offer(TcpState),
    /// Target → source: willing to restore.
    Accept,
    /// Target → source: will not restore (reason).
    Refuse(String),
    /// Source → target: restore now (the source has closed, or holds, its socket).
    Commit,
    /// Target → source: restored and handed over.
    Restored,
    /// Target → source: the restore failed (reason); nothing of it is left.
    Failed(String),
    /// Source → target: the flow now points at the target and the source socket is
    /// closed: hand the connection to the local server.
    Done,
    /// Source → target: the flow could not be moved; close the restored copy silently
    /// (the target answers FAILED("aborted") once it has).
    Abort,
    /// Source → target: OFFER and COMMIT in one message (the source holds its frozen
    /// socket until RESTORED, `Handover::CloseAfterRestore`, so nothing has to happen
    /// between them): the target answers REFUSE, or restores at once and answers
    /// RESTORED or FAILED. Saves one round trip (two sends, two receives) a migration.
    OfferCommit(TcpState),
    /// Target → source, after DONE: the restored connection is live here and handed
    /// to the local server (version 3). Until it arrives the source keeps its frozen
    /// socket; without it (FAILED, silence) the source takes the connection back.
    Released,
}

/// The OFFER kind.
const KIND_OFFER: u8 = 1;
/// The OFFER_COMMIT kind.
const KIND_OFFER_COMMIT: u8 = 9;
/// The RELEASED kind.
const KIND_RELEASED: u8 = 10;
/// The highest kind.
const KIND_MAX: u8 = KIND_RELEASED;

impl Message {
    fn kind(&self) -> u8 {
        match self {
            Self::Offer(_) => KIND_OFFER,
            Self::Accept => 2,
            Self::Refuse(_) => 3,
            Self::Commit => 4,
            Self::Restored => 5,
            Self::Failed(_) => 6,
            Self::Done => 7,
            Self::Abort => 8,
            Self::OfferCommit(_) => KIND_OFFER_COMMIT,
            Self::Released => KIND_RELEASED,
        }
    }
}

fn put_addr(out: &mut Vec<u8>, a: &SocketAddr) {
    match a {
        SocketAddr::V4(a) => out.extend_from_slice(&a.ip().octets()),
        SocketAddr::V6(a) => {
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.flowinfo().to_be_bytes());
            out.extend_from_slice(&a.scope_id().to_be_bytes());
        }
    }
    out.extend_from_slice(&a.port().to_be_bytes());
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// The OFFER payload up to and including the send queue's length (the queues follow:
/// send bytes, receive length, receive bytes).
fn encode_state_prefix(out: &mut Vec<u8>, st: &TcpState) {
    out.push(if st.local.is_ipv4() { 4 } else { 6 });
    put_addr(out, &st.local);
    put_addr(out, &st.remote);
    put_u32(out, st.snd_seq);
    put_u32(out, st.rcv_seq);
    put_u32(out, st.timestamp);
    out.extend_from_slice(&st.options.mss.to_be_bytes());
    let mut flags = 0;
    if st.options.wscale.is_some() {
        flags |= FLAG_WSCALE;
    }
    if st.options.sack {
        flags |= FLAG_SACK;
    }
    if st.options.timestamps {
        flags |= FLAG_TIMESTAMPS;
    }
    let (snd_ws, rcv_ws) = st.options.wscale.unwrap_or((0, 0));
    out.extend_from_slice(&[flags, snd_ws, rcv_ws]);
    let w = &st.window;
    for v in [w.snd_wl1, w.snd_wnd, w.max_window, w.rcv_wnd, w.rcv_wup] {
        put_u32(out, v);
    }
    put_u32(out, st.sndbuf);
    put_u32(out, st.rcvbuf);
    put_u32(out, st.unsent_len);
    put_u32(out, st.send_queue.len() as u32);
}

fn offer_payload_len(st: &TcpState) -> usize {
    let prefix = if st.local.is_ipv4() {
        OFFER_PREFIX_V4
    } else {
        OFFER_PREFIX_V6
    };
    prefix + st.send_queue.len() + 4 + st.recv_queue.len()
}

fn put_header(out: &mut Vec<u8>, kind: u8, len: usize) {
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(kind);
    put_u32(out, len as u32);
}

/// Encodes one message as a frame. Panics only on a programmer error: an OFFER whose
/// state fails [`TcpState::validate`] or a reason longer than [`REASON_BYTES_MAX`].
pub fn encode(msg: &Message) -> Vec<u8> {
    match msg {
        Message::Offer(st) | Message::OfferCommit(st) => {
            assert!(st.validate().is_ok(), "encoding an invalid TcpState");
            let len = offer_payload_len(st);
            let mut out = Vec::with_capacity(HEADER_BYTES + len);
            put_header(&mut out, msg.kind(), len);
            encode_state_prefix(&mut out, st);
            out.extend_from_slice(&st.send_queue);
            put_u32(&mut out, st.recv_queue.len() as u32);
            out.extend_from_slice(&st.recv_queue);
            out
        }
        Message::Refuse(r) | Message::Failed(r) => {
            assert!(r.len() <= REASON_BYTES_MAX, "reason too long");
            let mut out = Vec::with_capacity(HEADER_BYTES + r.len());
            put_header(&mut out, msg.kind(), r.len());
            out.extend_from_slice(r.as_bytes());
            out
        }
        Message::Accept
        | Message::Commit
        | Message::Restored
        | Message::Done
        | Message::Abort
        | Message::Released => {
            let mut out = Vec::with_capacity(HEADER_BYTES);
            put_header(&mut out, msg.kind(), 0);
            out
        }
    }
}

/// A reason cut to [`REASON_BYTES_MAX`] bytes at a character boundary.
pub fn reason(text: &str) -> String {
    let mut end = text.len().min(REASON_BYTES_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated);
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn addr(&mut self, v4: bool) -> Result<SocketAddr, WireError> {
        if v4 {
            let ip: [u8; 4] = self.take(4)?.try_into().expect("4 bytes");
            let port = self.u16()?;
            Ok(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port)))
        } else {
            let ip: [u8; 16] = self.take(16)?.try_into().expect("16 bytes");
            let flowinfo = self.u32()?;
            let scope = self.u32()?;
            let port = self.u16()?;
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                flowinfo,
                scope,
            )))
        }
    }
    fn queue(&mut self, what: &'static str) -> Result<Vec<u8>, WireError> {
        let len = queue_len(self.u32()?, what)?;
        Ok(self.take(len)?.to_vec())
    }
}

fn queue_len(len: u32, what: &'static str) -> Result<usize, WireError> {
    let len = len as usize;
    if len > QUEUE_BYTES_MAX {
        return Err(WireError::TooLarge(what, len));
    }
    Ok(len)
}

/// Decodes an OFFER payload up to and including the send queue's length; returns the
/// state with empty queues and that length.
fn decode_state_prefix(c: &mut Cursor<'_>) -> Result<(TcpState, usize), WireError> {
    let v4 = match c.u8()? {
        4 => true,
        6 => false,
        f => return Err(WireError::Invalid(format!("address family {f}"))),
    };
    let local = c.addr(v4)?;
    let remote = c.addr(v4)?;
    let snd_seq = c.u32()?;
    let rcv_seq = c.u32()?;
    let timestamp = c.u32()?;
    let mss = c.u16()?;
    let flags = c.u8()?;
    if flags & !FLAGS_KNOWN != 0 {
        return Err(WireError::Invalid(format!("option flags 0x{flags:02x}")));
    }
    let snd_ws = c.u8()?;
    let rcv_ws = c.u8()?;
    let wscale = if flags & FLAG_WSCALE != 0 {
        if snd_ws > WSCALE_MAX || rcv_ws > WSCALE_MAX {
            return Err(WireError::Invalid(format!(
                "window scale {snd_ws}/{rcv_ws}"
            )));
        }
        Some((snd_ws, rcv_ws))
    } else {
        if snd_ws != 0 || rcv_ws != 0 {
            return Err(WireError::Invalid("window scale without the flag".into()));
        }
        None
    };
    let window = RepairWindow {
        snd_wl1: c.u32()?,
        snd_wnd: c.u32()?,
        max_window: c.u32()?,
        rcv_wnd: c.u32()?,
        rcv_wup: c.u32()?,
    };
    let sndbuf = c.u32()?;
    let rcvbuf = c.u32()?;
    let unsent_len = c.u32()?;
    let send_len = queue_len(c.u32()?, "send queue")?;
    let st = TcpState {
        local,
        remote,
        snd_seq,
        rcv_seq,
        options: TcpOptions {
            mss,
            wscale,
            sack: flags & FLAG_SACK != 0,
            timestamps: flags & FLAG_TIMESTAMPS != 0,
        },
        timestamp,
        window,
        sndbuf,
        rcvbuf,
        send_queue: Vec::new(),
        unsent_len,
        recv_queue: Vec::new(),
    };
    Ok((st, send_len))
}

fn decode_state(c: &mut Cursor<'_>) -> Result<TcpState, WireError> {
    let (mut st, send_len) = decode_state_prefix(c)?;
    st.send_queue = c.take(send_len)?.to_vec();
    st.recv_queue = c.queue("receive queue")?;
    st.validate().map_err(WireError::Invalid)?;
    Ok(st)
}

/// Checks a frame header; returns the kind and the payload length.
pub fn decode_header(h: &[u8; HEADER_BYTES]) -> Result<(u8, usize), WireError> {
    decode_header_version(h, VERSION)
}

/// [`decode_header`] of a frame of wire version `version` ([`VERSION`] or
/// [`VERSION_AUTH`]).
pub fn decode_header_version(
    h: &[u8; HEADER_BYTES],
    version: u8,
) -> Result<(u8, usize), WireError> {
    if h[..4] != MAGIC {
        return Err(WireError::Magic);
    }
    if h[4] != version {
        return Err(WireError::Version(h[4]));
    }
    let kind = h[5];
    if !(1..=KIND_MAX).contains(&kind) {
        return Err(WireError::Kind(kind));
    }
    let len = u32::from_be_bytes(h[6..10].try_into().expect("4 bytes")) as usize;
    let max = match kind {
        KIND_OFFER | KIND_OFFER_COMMIT => PAYLOAD_BYTES_MAX,
        3 | 6 => REASON_BYTES_MAX,
        _ => 0,
    };
    if len > max {
        return Err(WireError::TooLarge("payload", len));
    }
    Ok((kind, len))
}

/// Decodes the payload of a frame of `kind`.
pub fn decode_payload(kind: u8, payload: &[u8]) -> Result<Message, WireError> {
    let mut c = Cursor { buf: payload };
    let msg = match kind {
        KIND_OFFER => Message::Offer(decode_state(&mut c)?),
        KIND_OFFER_COMMIT => Message::OfferCommit(decode_state(&mut c)?),
        2 => Message::Accept,
        3 | 6 => {
            let text = std::str::from_utf8(c.take(payload.len())?)
                .map_err(|_| WireError::Invalid("reason is not UTF-8".into()))?
                .to_string();
            if kind == 3 {
                Message::Refuse(text)
            } else {
                Message::Failed(text)
            }
        }
        4 => Message::Commit,
        5 => Message::Restored,
        7 => Message::Done,
        8 => Message::Abort,
        KIND_RELEASED => Message::Released,
        k => return Err(WireError::Kind(k)),
    };
    if !c.buf.is_empty() {
        return Err(WireError::Trailing(c.buf.len()));
    }
    Ok(msg)
}

/// Decodes exactly one frame.
pub fn decode(frame: &[u8]) -> Result<Message, WireError> {
    let h: &[u8; HEADER_BYTES] = frame
        .get(..HEADER_BYTES)
        .ok_or(WireError::Truncated)?
        .try_into()
        .expect("header length");
    let (kind, len) = decode_header(h)?;
    let rest = &frame[HEADER_BYTES..];
    if rest.len() < len {
        return Err(WireError::Truncated);
    }
    if rest.len() > len {
        return Err(WireError::Trailing(rest.len() - len));
    }
    decode_payload(kind, rest)
}

/// Reads one frame from a stream; malformed input is `InvalidData`.
///
/// An OFFER's queues are read straight into their own buffers (no staging copy of
/// the payload): give a buffered reader so the header and the fixed fields cost one
/// `recv`, not several.
pub fn read_message(r: &mut impl Read) -> io::Result<Message> {
    let mut h = [0u8; HEADER_BYTES];
    r.read_exact(&mut h)?;
    read_message_after(r, &h)
}

/// [`read_message`] once its header `h` has been read.
pub fn read_message_after(r: &mut impl Read, h: &[u8; HEADER_BYTES]) -> io::Result<Message> {
    let (kind, len) = decode_header(h).map_err(bad_data)?;
    if kind == KIND_OFFER {
        return read_offer(r, len).map(Message::Offer);
    }
    if kind == KIND_OFFER_COMMIT {
        return read_offer(r, len).map(Message::OfferCommit);
    }
    // `len` is bounded by decode_header (REASON_BYTES_MAX for every other kind).
    let mut payload = [0u8; REASON_BYTES_MAX];
    let payload = &mut payload[..len];
    r.read_exact(payload)?;
    decode_payload(kind, payload).map_err(bad_data)
}

fn bad_data(e: WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// First allocation of a queue being read when this thread has no spare buffer:
/// a lab state's queue fits; a larger one grows as its bytes arrive.
const READ_CHUNK_FIRST: usize = 64 << 10;

/// Reads exactly `n` bytes into a buffer (a spare one of this thread if it has one:
/// resident pages, see `bufs`). `n` comes from the wire, so the buffer is not sized
/// by it: it starts at most [`READ_CHUNK_FIRST`] (or a spare's capacity) and doubles
/// as the bytes arrive, so a peer that claims a long queue and sends less costs at
/// most twice what it sent. Each chunk is zeroed first: `read_to_end` would skip that
/// but reads a socket in growing chunks (8 KiB, 16 KiB, …), more `recv` calls.
fn read_vec(r: &mut impl Read, n: usize) -> io::Result<Vec<u8>> {
    let mut v = crate::bufs::take(n.min(READ_CHUNK_FIRST));
    // Bounded: each pass fills the buffer to its capacity (at least one more byte)
    // or fails.
    while v.len() < n {
        if v.len() == v.capacity() {
            let more = v.capacity().max(READ_CHUNK_FIRST).min(n - v.len());
            v.reserve_exact(more);
        }
        let start = v.len();
        let end = n.min(v.capacity());
        v.resize(end, 0);
        if let Err(e) = r.read_exact(&mut v[start..end]) {
            crate::bufs::give(v);
            return Err(e);
        }
    }
    Ok(v)
}

/// Reads an OFFER payload of `len` bytes (checked against the structure before each
/// queue is read; a queue's buffer grows as its bytes arrive, so a lying length
/// allocates at most twice what was sent, never what it claims).
fn read_offer(r: &mut impl Read, len: usize) -> io::Result<TcpState> {
    if len == 0 {
        return Err(bad_data(WireError::Truncated));
    }
    let mut prefix = [0u8; OFFER_PREFIX_V6];
    r.read_exact(&mut prefix[..1])?;
    let n = match prefix[0] {
        4 => OFFER_PREFIX_V4,
        6 => OFFER_PREFIX_V6,
        f => return Err(bad_data(WireError::Invalid(format!("address family {f}")))),
    };
    if len < n + 4 {
        return Err(bad_data(WireError::Truncated));
    }
    r.read_exact(&mut prefix[1..n])?;
    let (mut st, send_len) =
        decode_state_prefix(&mut Cursor { buf: &prefix[..n] }).map_err(bad_data)?;
    if n + send_len + 4 > len {
        return Err(bad_data(WireError::Truncated));
    }
    st.send_queue = read_vec(r, send_len)?;
    let mut l = [0u8; 4];
    r.read_exact(&mut l)?;
    let recv_len = queue_len(u32::from_be_bytes(l), "receive queue").map_err(bad_data)?;
    let end = n + send_len + 4 + recv_len;
    if end > len {
        return Err(bad_data(WireError::Truncated));
    }
    if end < len {
        return Err(bad_data(WireError::Trailing(len - end)));
    }
    st.recv_queue = read_vec(r, recv_len)?;
    st.validate().map_err(|e| bad_data(WireError::Invalid(e)))?;
    Ok(st)
}

/// Writes one frame to a stream. An OFFER goes out with one vectored write straight
/// from the state's queues (no copy into a frame buffer).
pub fn write_message(w: &mut impl Write, msg: &Message) -> io::Result<()> {
    match msg {
        Message::Offer(st) => write_offer(w, st),
        Message::OfferCommit(st) => write_offer_commit(w, st),
        _ => {
            w.write_all(&encode(msg))?;
            w.flush()
        }
    }
}

/// Writes an OFFER of `st` (the same bytes as `encode(&Message::Offer(st))`) without
/// copying the queues. Panics like [`encode`] on an invalid state.
pub fn write_offer(w: &mut impl Write, st: &TcpState) -> io::Result<()> {
    write_state(w, KIND_OFFER, st)
}

/// [`write_offer`] for an OFFER_COMMIT ([`Message::OfferCommit`]).
pub fn write_offer_commit(w: &mut impl Write, st: &TcpState) -> io::Result<()> {
    write_state(w, KIND_OFFER_COMMIT, st)
}

fn write_state(w: &mut impl Write, kind: u8, st: &TcpState) -> io::Result<()> {
    assert!(st.validate().is_ok(), "encoding an invalid TcpState");
    let mut head = Vec::with_capacity(HEADER_BYTES + OFFER_PREFIX_V6);
    put_header(&mut head, kind, offer_payload_len(st));
    encode_state_prefix(&mut head, st);
    let recv_len = (st.recv_queue.len() as u32).to_be_bytes();
    write_all_vectored(
        w,
        &mut [
            IoSlice::new(&head),
            IoSlice::new(&st.send_queue),
            IoSlice::new(&recv_len),
            IoSlice::new(&st.recv_queue),
        ],
    )
}

/// Writes every slice of `bufs` (vectored), then flushes.
fn write_all_vectored(w: &mut impl Write, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    let mut bufs = bufs;
    // Bounded: each pass writes at least one byte or fails.
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes")),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    w.flush()
}

/// The authenticated framing's keys and counters (wire version 3, see the module
/// doc): one per daemon, shared by its control connections in both roles.
pub struct Auth {
    key: SipKey,
    key_id: KeyId,
    /// This daemon's id in the envelopes it seals (random per start).
    sender: u64,
    seq: Mutex<Sequencer>,
    /// The peers' windows (per key id and sender).
    replay: Mutex<ReplayTable>,
    /// Sequences at or below this are refused: the seconds before this daemon started.
    floor: u64,
    refused: AtomicU64,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("Auth")
            .field("key_id", &self.key_id)
            .field("sender", &self.sender)
            .finish_non_exhaustive()
    }
}

/// Most a frame's sequence clock (its sender's seconds) may differ from the
/// receiver's: cluster nodes keep time with NTP (milliseconds apart); two minutes
/// spare a node whose clock was just stepped. Bounds how old a recorded frame can be
/// replayed to a receiver that restarted (and lost its replay windows).
pub const SEQ_CLOCK_SKEW_MAX_S: u64 = 120;
/// The label's first block of a payload tag after the key id: a length no envelope
/// can have.
const PAYLOAD_TAG_MARK: u32 = u32::MAX;

impl Auth {
    /// Seals and opens with `key` (loaded with `farside_auth::keys`); its id is
    /// derived from it, so daemons with different keys see "unknown key".
    ///
    /// As a receiver it refuses every sequence of a second before its creation (the
    /// daemon's start, `farside_auth::floor::clock_floor`): senders seal with clock
    /// sequences, so a frame captured before the daemon restarted is refused after it
    /// although the restart emptied the windows (unless it was sealed in the
    /// restart's own second, or by a sender whose clock runs ahead by more than the
    /// restart took).
    pub fn new(key: SipKey) -> Self {
        let limits = farside_auth::floor::Limits::without_state(Sequencer::unix_s());
        let mut replay = ReplayTable::default();
        limits.apply(&mut replay);
        Self {
            floor: limits.floor,
            key_id: Self::key_id_of(&key),
            key,
            sender: random_u64(),
            seq: Mutex::new(Sequencer::new()),
            replay: Mutex::new(replay),
            refused: AtomicU64::new(0),
        }
    }

    /// The lowest sequence this receiver may accept, less one: the clock floor of its
    /// start (see [`Auth::new`]).
    pub fn replay_floor(&self) -> u64 {
        self.floor
    }

    /// The id envelopes sealed with `key` carry.
    pub fn key_id_of(key: &SipKey) -> KeyId {
        KeyId(siphash24(key, b"farside specd migration key id") as u32)
    }

    /// This daemon's key id.
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// Frames refused: forged, under another key, replayed, or with a bad payload
    /// tag.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn next_seq(&self) -> io::Result<u64> {
        self.seq
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .next(Sequencer::unix_s())
            .ok_or_else(|| io::Error::other("sequence numbers exhausted for this key"))
    }

    /// The envelope of `header` and its tag.
    fn seal_header(&self, header: &[u8]) -> io::Result<(Vec<u8>, u64)> {
        let env = Envelope {
            key_id: self.key_id,
            sender: self.sender,
            seq: self.next_seq()?,
        };
        let mut out = Vec::with_capacity(ENVELOPE_BYTES + HEADER_BYTES + OFFER_PREFIX_V6);
        mac::seal(&mut out, Domain::SpecdMigration, &self.key, &env, header)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let tag = u64::from_le_bytes(out[..8].try_into().expect("8 bytes"));
        Ok((out, tag))
    }

    /// The hasher of a payload whose header's tag is `header_tag`.
    fn payload_mac(&self, header_tag: u64) -> Sip24 {
        let mut h = Sip24::new(&self.key);
        h.write_u64(Domain::SpecdMigration.label());
        h.write(&self.key_id.0.to_le_bytes());
        h.write(&PAYLOAD_TAG_MARK.to_le_bytes());
        h.write_u64(header_tag);
        h
    }

    fn refuse(&self, why: impl fmt::Display) -> io::Error {
        self.refused.fetch_add(1, Ordering::Relaxed);
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("migration frame not authentic: {why}"),
        )
    }

    /// Verifies an envelope and the header it covers, and moves the replay window:
    /// the header's tag, for the payload's.
    fn open_header(&self, b: &[u8; ENVELOPE_BYTES + HEADER_BYTES]) -> io::Result<u64> {
        let parsed = mac::parse(b).map_err(|e| self.refuse(e))?;
        if parsed.envelope.key_id != self.key_id {
            return Err(self.refuse(mac::Refusal::UnknownKey(parsed.envelope.key_id)));
        }
        let opened = parsed
            .verify(Domain::SpecdMigration, &self.key)
            .map_err(|e| self.refuse(e))?;
        if opened.message.len() != HEADER_BYTES || !opened.trailing.is_empty() {
            return Err(self.refuse("the envelope does not cover exactly a header"));
        }
        let env = opened.envelope;
        // The sequence carries its sender's clock (seconds, high 32 bits): a frame
        // from far outside this clock is a recording (a receiver that restarted has
        // no window to refuse it by), or a sender whose clock is off.
        let sent_s = env.seq >> 32;
        let now_s = Sequencer::unix_s();
        if sent_s.abs_diff(now_s) > SEQ_CLOCK_SKEW_MAX_S {
            return Err(self.refuse(format_args!(
                "sequence from {sent_s} s, {} s off this clock (bound {SEQ_CLOCK_SKEW_MAX_S} s)",
                sent_s.abs_diff(now_s)
            )));
        }
        self.replay
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .accept(env.key_id, env.sender, env.seq)
            .map_err(|e| self.refuse(e))?;
        Ok(u64::from_le_bytes(b[..8].try_into().expect("8 bytes")))
    }
}

/// 8 random bytes from the kernel (a daemon's sender id); the clock and the process
/// id if that fails (the replay windows then still hold within one run).
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom into a local buffer of the length passed.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

/// A reader that hashes what it reads (an authenticated payload).
struct Hashing<'a, R> {
    inner: &'a mut R,
    mac: Sip24,
}

impl<R: Read> Read for Hashing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.mac.write(&buf[..n]);
        Ok(n)
    }
}

/// Reads one frame of either framing: [`read_message`] without `auth`, the
/// authenticated one (version 3) with it.
pub fn read_message_auth(r: &mut impl Read, auth: Option<&Auth>) -> io::Result<Message> {
    let Some(auth) = auth else {
        return read_message(r);
    };
    let mut b = [0u8; ENVELOPE_BYTES + HEADER_BYTES];
    r.read_exact(&mut b)?;
    let tag = auth.open_header(&b)?;
    let h: [u8; HEADER_BYTES] = b[ENVELOPE_BYTES..].try_into().expect("header length");
    read_authentic_after(r, &h, auth, tag)
}

/// Reads an authenticated frame's envelope and header: the header once both
/// verified and the replay window moved, and the header's tag (for
/// [`read_authentic_after`]). Nothing of the payload is read.
pub fn read_authentic_header(
    r: &mut impl Read,
    auth: &Auth,
) -> io::Result<([u8; HEADER_BYTES], u64)> {
    let mut b = [0u8; ENVELOPE_BYTES + HEADER_BYTES];
    r.read_exact(&mut b)?;
    let tag = auth.open_header(&b)?;
    Ok((b[ENVELOPE_BYTES..].try_into().expect("header length"), tag))
}

/// The payload of an authenticated frame whose header `h` (tag `header_tag`)
/// verified, checked against its payload tag.
pub fn read_authentic_after(
    r: &mut impl Read,
    h: &[u8; HEADER_BYTES],
    auth: &Auth,
    header_tag: u64,
) -> io::Result<Message> {
    let (kind, len) = decode_header_version(h, VERSION_AUTH).map_err(bad_data)?;
    if len == 0 {
        return decode_payload(kind, &[]).map_err(bad_data);
    }
    let mut hashing = Hashing {
        inner: r,
        mac: auth.payload_mac(header_tag),
    };
    // The payload as an unauthenticated frame's, hashed as it is read.
    let mut plain = *h;
    plain[4] = VERSION;
    let msg = read_message_after(&mut hashing, &plain);
    let want = hashing.mac.finish();
    let msg = msg?;
    let mut t = [0u8; PAYLOAD_TAG_BYTES];
    r.read_exact(&mut t)?;
    if !mac::tags_equal(want, u64::from_le_bytes(t)) {
        return Err(auth.refuse("payload tag does not verify"));
    }
    Ok(msg)
}

/// Writes one frame in either framing ([`write_message`] without `auth`).
pub fn write_message_auth(
    w: &mut impl Write,
    msg: &Message,
    auth: Option<&Auth>,
) -> io::Result<()> {
    let Some(auth) = auth else {
        return write_message(w, msg);
    };
    match msg {
        Message::Offer(st) => write_state_auth(w, KIND_OFFER, st, auth),
        Message::OfferCommit(st) => write_state_auth(w, KIND_OFFER_COMMIT, st, auth),
        _ => {
            w.write_all(&encode_auth(msg, auth)?)?;
            w.flush()
        }
    }
}

/// [`encode`] in the authenticated framing.
pub fn encode_auth(msg: &Message, auth: &Auth) -> io::Result<Vec<u8>> {
    let mut frame = encode(msg);
    frame[4] = VERSION_AUTH;
    let (mut out, tag) = auth.seal_header(&frame[..HEADER_BYTES])?;
    let payload = &frame[HEADER_BYTES..];
    out.extend_from_slice(payload);
    if !payload.is_empty() {
        let mut h = auth.payload_mac(tag);
        h.write(payload);
        out.extend_from_slice(&h.finish().to_le_bytes());
    }
    Ok(out)
}

/// [`write_offer`] (or, `commit`, [`write_offer_commit`]) in the authenticated
/// framing, without copying the queues.
pub fn write_offer_auth(
    w: &mut impl Write,
    st: &TcpState,
    commit: bool,
    auth: &Auth,
) -> io::Result<()> {
    let kind = if commit {
        KIND_OFFER_COMMIT
    } else {
        KIND_OFFER
    };
    write_state_auth(w, kind, st, auth)
}

fn write_state_auth(w: &mut impl Write, kind: u8, st: &TcpState, auth: &Auth) -> io::Result<()> {
    assert!(st.validate().is_ok(), "encoding an invalid TcpState");
    let mut header = Vec::with_capacity(HEADER_BYTES);
    put_header(&mut header, kind, offer_payload_len(st));
    header[4] = VERSION_AUTH;
    let (mut head, tag) = auth.seal_header(&header)?;
    let prefix_at = head.len();
    encode_state_prefix(&mut head, st);
    let recv_len = (st.recv_queue.len() as u32).to_be_bytes();
    let mut h = auth.payload_mac(tag);
    for part in [
        &head[prefix_at..],
        &st.send_queue[..],
        &recv_len[..],
        &st.recv_queue[..],
    ] {
        h.write(part);
    }
    let ptag = h.finish().to_le_bytes();
    write_all_vectored(
        w,
        &mut [
            IoSlice::new(&head),
            IoSlice::new(&st.send_queue),
            IoSlice::new(&recv_len),
            IoSlice::new(&st.recv_queue),
            IoSlice::new(&ptag),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lying_queue_length_allocates_about_what_arrives_not_what_it_claims() {
        // 100 kB arrive of a claimed 32 MiB queue.
        let mut r = io::Cursor::new(vec![7u8; 100_000]);
        let e = read_vec(&mut r, QUEUE_BYTES_MAX).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // The buffer went back to this thread's spares: at most twice what arrived.
        let v = crate::bufs::take(0);
        assert!(
            v.capacity() <= 2 * 100_000 + READ_CHUNK_FIRST,
            "{}",
            v.capacity()
        );
        // A queue that does arrive is read whole, across several growths.
        let data: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
        let got = read_vec(&mut io::Cursor::new(data.clone()), data.len()).unwrap();
        assert_eq!(got, data);
    }
}
