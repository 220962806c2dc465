//! The hand-over protocol's messages and their compact, versioned encoding.
//!
//! Frame (all integers big-endian):
//!
//! ```text
//! magic "FSMG" | version u8 (= 1) | kind u8 | payload length u32 | payload
//! ```
//!
//! Kinds: `1 OFFER(state)`, `2 ACCEPT`, `3 REFUSE(reason)`, `4 COMMIT`,
//! `5 RESTORED`, `6 FAILED(reason)`, `7 DONE`, `8 ABORT`. A reason is UTF-8 text of at most
//! [`REASON_BYTES_MAX`] bytes. The OFFER payload (a [`TcpState`]):
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

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::error::WireError;
use crate::state::{RepairWindow, TcpOptions, TcpState, QUEUE_BYTES_MAX, WSCALE_MAX};

/// Frame magic.
pub const MAGIC: [u8; 4] = *b"FSMG";
/// The wire version this crate writes and reads.
pub const VERSION: u8 = 1;
/// Frame header: magic, version, kind, payload length.
pub const HEADER_BYTES: usize = 4 + 1 + 1 + 4;
/// Longest REFUSE/FAILED reason: a one-line diagnostic, not a log.
pub const REASON_BYTES_MAX: usize = 256;
/// Fixed part of an OFFER payload at its largest (IPv6 addresses).
const STATE_FIXED_BYTES_MAX: usize = 1 + 2 * (16 + 4 + 4 + 2) + 3 * 4 + 5 + 5 * 4 + 3 * 4 + 2 * 4;
/// Longest payload: an OFFER with both queues full. Bounds the reader's allocation.
pub const PAYLOAD_BYTES_MAX: usize = STATE_FIXED_BYTES_MAX + 2 * QUEUE_BYTES_MAX;

const FLAG_WSCALE: u8 = 1;
const FLAG_SACK: u8 = 2;
const FLAG_TIMESTAMPS: u8 = 4;
const FLAGS_KNOWN: u8 = FLAG_WSCALE | FLAG_SACK | FLAG_TIMESTAMPS;

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
}

impl Message {
    fn kind(&self) -> u8 {
        match self {
            Self::Offer(_) => 1,
            Self::Accept => 2,
            Self::Refuse(_) => 3,
            Self::Commit => 4,
            Self::Restored => 5,
            Self::Failed(_) => 6,
            Self::Done => 7,
            Self::Abort => 8,
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

fn encode_state(out: &mut Vec<u8>, st: &TcpState) {
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
    out.extend_from_slice(&st.send_queue);
    put_u32(out, st.recv_queue.len() as u32);
    out.extend_from_slice(&st.recv_queue);
}

/// Encodes one message as a frame. Panics only on a programmer error: an OFFER whose
/// state fails [`TcpState::validate`] or a reason longer than [`REASON_BYTES_MAX`].
pub fn encode(msg: &Message) -> Vec<u8> {
    let mut payload = Vec::new();
    match msg {
        Message::Offer(st) => {
            assert!(st.validate().is_ok(), "encoding an invalid TcpState");
            encode_state(&mut payload, st);
        }
        Message::Refuse(r) | Message::Failed(r) => {
            assert!(r.len() <= REASON_BYTES_MAX, "reason too long");
            payload.extend_from_slice(r.as_bytes());
        }
        Message::Accept | Message::Commit | Message::Restored | Message::Done | Message::Abort => {}
    }
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(msg.kind());
    put_u32(&mut out, payload.len() as u32);
    out.extend_from_slice(&payload);
    out
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
        let len = self.u32()? as usize;
        if len > QUEUE_BYTES_MAX {
            return Err(WireError::TooLarge(what, len));
        }
        Ok(self.take(len)?.to_vec())
    }
}

fn decode_state(c: &mut Cursor<'_>) -> Result<TcpState, WireError> {
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
    let send_queue = c.queue("send queue")?;
    let recv_queue = c.queue("receive queue")?;
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
        send_queue,
        unsent_len,
        recv_queue,
    };
    st.validate().map_err(WireError::Invalid)?;
    Ok(st)
}

/// Checks a frame header; returns the kind and the payload length.
pub fn decode_header(h: &[u8; HEADER_BYTES]) -> Result<(u8, usize), WireError> {
    if h[..4] != MAGIC {
        return Err(WireError::Magic);
    }
    if h[4] != VERSION {
        return Err(WireError::Version(h[4]));
    }
    let kind = h[5];
    if !(1..=8).contains(&kind) {
        return Err(WireError::Kind(kind));
    }
    let len = u32::from_be_bytes(h[6..10].try_into().expect("4 bytes")) as usize;
    let max = match kind {
        1 => PAYLOAD_BYTES_MAX,
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
        1 => Message::Offer(decode_state(&mut c)?),
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
pub fn read_message(r: &mut impl Read) -> io::Result<Message> {
    let mut h = [0u8; HEADER_BYTES];
    r.read_exact(&mut h)?;
    let bad = |e: WireError| io::Error::new(io::ErrorKind::InvalidData, e);
    let (kind, len) = decode_header(&h).map_err(bad)?;
    // `len` is bounded by decode_header, so this allocation is too.
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    decode_payload(kind, &payload).map_err(bad)
}

/// Writes one frame to a stream.
pub fn write_message(w: &mut impl Write, msg: &Message) -> io::Result<()> {
    w.write_all(&encode(msg))?;
    w.flush()
}
