//! Authenticated lines of the front-end's control port over TCP: a TCP control port
//! is reachable by whoever reaches its address, so every request on it is sealed with
//! the front-end's key (the `--key-file` key that also seals the one-sided MOVE) and
//! every reply is bound to its request.
//!
//! ```text
//!  client                                      front-end (TCP control)
//!  "MOVE 10.0.0.5:4000 10.0.0.12"
//!   seal(FrontendControl, key, {id, sender, seq}) ─► "AUTH <hex>\n"
//!                                               open_request: parse, key by id, tag,
//!                                               replay window per (key id, sender)
//!                                               ─► handle("MOVE ...") ─► "OK"
//!   open_reply: tag, same sender and seq   ◄──── "AUTH <hex of seal("reply OK")>\n"
//! ```
//!
//! The envelope is `farside_auth::mac`'s (SipHash-2-4, key id, sender, sequence);
//! the line carries the sealed bytes in lowercase hex after `AUTH `. Why it is safe:
//! - **Forgery**: a request acts only once its tag verifies under an installed key.
//! - **Replay**: the front-end keeps a window per (key id, sender)
//!   (`farside_auth::replay`, at most [`SENDERS_MAX`] senders): a captured line sent
//!   again, on this connection or any other, is refused. Clients take sequence numbers
//!   from the process-wide clock-seeded counter the one-sided MOVE uses
//!   ([`crate::fmove::next_envelope_seq`]) and a random sender id per client.
//! - **Reflection**: replies are sealed in the same domain but start with `reply `,
//!   which is no request, and echo the request's sender and sequence, which the
//!   front-end's window has already taken; a client accepts only the reply that
//!   verifies and echoes its own outstanding request.
//! - **Bounds**: a line is at most the control port's `LINE_BYTES_MAX` bytes, so the sealed
//!   request is at most half of it; nothing is decoded past it.
//!
//! A Unix-socket control port needs none of this (its 0600 socket is reachable by
//! local root only) and takes plain lines.

use crate::fmove::MoveKey;
use farside_auth::mac::{self, Domain, Envelope, KeyId};
use farside_auth::replay::ReplayTable;
use farside_auth::siphash::SipKey;
use std::sync::Mutex;

/// What starts an authenticated line.
pub const AUTH_PREFIX: &str = "AUTH ";
/// What starts the covered text of a reply.
pub const REPLY_PREFIX: &str = "reply ";
/// Senders the front-end keeps a replay window for: one per back-end daemon's client
/// (specd keeps at most 8 connections each) for 64 back-ends, and operators; past it
/// the least recent is evicted and its sequence becomes the key's floor
/// (`farside_auth::replay`'s rule), so eviction never re-opens a window.
pub const SENDERS_MAX: usize = 1024;

/// Why an authenticated line was refused. Says nothing about which bytes were wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineRefusal {
    /// Not `AUTH <hex>`, odd length, or not hex.
    Malformed,
    /// The envelope: truncated, unknown key, or a tag that does not verify.
    Envelope(mac::Refusal),
    /// Authentic, but its sequence was seen before (or is below the window).
    Replay(farside_auth::replay::Replay),
    /// The covered text is not UTF-8.
    NotText,
}

impl std::fmt::Display for LineRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineRefusal::Malformed => f.write_str("not an AUTH line"),
            LineRefusal::Envelope(r) => write!(f, "not authentic: {r}"),
            LineRefusal::Replay(r) => write!(f, "replayed: {r}"),
            LineRefusal::NotText => f.write_str("request is not UTF-8"),
        }
    }
}

/// A request that verified and was fresh: its text, and what its reply must echo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub request: String,
    pub envelope: Envelope,
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let s = s.as_bytes();
    if s.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    s.chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// `AUTH <hex of the sealed text>` (no newline).
fn seal_line(key: &SipKey, env: &Envelope, text: &str) -> String {
    let mut b = Vec::with_capacity(mac::ENVELOPE_BYTES + text.len());
    mac::seal(&mut b, Domain::FrontendControl, key, env, text.as_bytes())
        .expect("control lines are far below the envelope's bound");
    format!("{AUTH_PREFIX}{}", hex(&b))
}

/// Decode and verify an `AUTH` line under `key_of`; no replay check.
fn open_line(
    line: &str,
    key_of: impl FnOnce(KeyId) -> Option<SipKey>,
) -> Result<(Envelope, String), LineRefusal> {
    let body = line
        .trim_end()
        .strip_prefix(AUTH_PREFIX)
        .ok_or(LineRefusal::Malformed)?;
    let bytes = unhex(body.trim()).ok_or(LineRefusal::Malformed)?;
    let opened =
        mac::open(Domain::FrontendControl, &bytes, key_of).map_err(LineRefusal::Envelope)?;
    let text = std::str::from_utf8(opened.message).map_err(|_| LineRefusal::NotText)?;
    Ok((opened.envelope, text.to_string()))
}

/// The client side: `request` sealed by `sender` with sequence `seq` (no newline).
pub fn seal_request(key: &MoveKey, sender: u64, seq: u64, request: &str) -> String {
    let env = Envelope {
        key_id: key.id,
        sender,
        seq,
    };
    seal_line(&key.key, &env, request)
}

/// The client side: the reply text (`OK ...` / `ERR ...`) of the request sealed with
/// `sender` and `seq`, if `line` is that reply, authentic under `key`.
pub fn open_reply(key: &MoveKey, sender: u64, seq: u64, line: &str) -> Result<String, LineRefusal> {
    let (env, text) = open_line(line, |id| (id == key.id).then_some(key.key))?;
    let text = text
        .strip_prefix(REPLY_PREFIX)
        .ok_or(LineRefusal::Malformed)?;
    if env.sender != sender || env.seq != seq || env.key_id != key.id {
        return Err(LineRefusal::Malformed);
    }
    Ok(text.to_string())
}

/// The front-end's side: the keys that may seal requests and the replay windows.
pub struct ControlAuth {
    keys: Vec<MoveKey>,
    replay: Mutex<ReplayTable>,
}

impl ControlAuth {
    /// Requests sealed with `key` are accepted. Requests sealed in seconds before this
    /// start are refused (`farside_auth::floor::Limits::without_state`): a request
    /// recorded before a restart of the front-end is not accepted again after it.
    pub fn new(key: MoveKey) -> ControlAuth {
        let mut replay = ReplayTable::new(SENDERS_MAX);
        farside_auth::floor::Limits::without_state(farside_auth::replay::Sequencer::unix_s())
            .apply(&mut replay);
        ControlAuth {
            keys: vec![key],
            replay: Mutex::new(replay),
        }
    }

    fn key_of(&self, id: KeyId) -> Option<SipKey> {
        self.keys.iter().find(|k| k.id == id).map(|k| k.key)
    }

    /// Verify `line` and take its sequence: the request text, or why it was refused.
    pub fn open_request(&self, line: &str) -> Result<Opened, LineRefusal> {
        let (envelope, request) = open_line(line, |id| self.key_of(id))?;
        self.replay
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .accept(envelope.key_id, envelope.sender, envelope.seq)
            .map_err(LineRefusal::Replay)?;
        Ok(Opened { request, envelope })
    }

    /// The reply line (no newline) to `opened`: `reply` text sealed with the request's
    /// key, sender and sequence.
    pub fn seal_reply(&self, opened: &Opened, reply: &str) -> String {
        let key = self
            .key_of(opened.envelope.key_id)
            .expect("a request opened under an installed key");
        seal_line(&key, &opened.envelope, &format!("{REPLY_PREFIX}{reply}"))
    }
}

/// A random sender id for a client (each control client has its own, so
/// two clients of one process never share a replay window).
pub fn random_sender() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize {
        return u64::from_le_bytes(b);
    }
    // getrandom cannot fail for 8 bytes once the pool is initialised; should it,
    // the pid and the clock still make senders of one host distinct.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use farside_auth::replay::Replay;

    const KEY: MoveKey = MoveKey {
        id: KeyId(3),
        key: SipKey::from_halves(0x0123_4567_89ab_cdef, 0x0fed_cba9_8765_4321),
    };
    const OTHER: MoveKey = MoveKey {
        id: KeyId(3),
        key: SipKey::from_halves(1, 2),
    };

    /// A sequence as a client sends it now (above the start's clock floor), plus `k`.
    fn now_seq(k: u64) -> u64 {
        farside_auth::floor::clock_seq(farside_auth::replay::Sequencer::unix_s()) + k
    }

    #[test]
    fn a_sealed_request_opens_once_and_its_reply_opens_only_for_it() {
        let fe = ControlAuth::new(KEY);
        let seq = now_seq(1000);
        let line = seal_request(&KEY, 77, seq, "MOVE 10.0.0.5:4000 10.0.0.12");
        let o = fe.open_request(&line).unwrap();
        assert_eq!(o.request, "MOVE 10.0.0.5:4000 10.0.0.12");
        // The same line again, as a replay on any connection.
        assert_eq!(
            fe.open_request(&line),
            Err(LineRefusal::Replay(Replay::Duplicate))
        );
        let reply = fe.seal_reply(&o, "OK");
        assert_eq!(open_reply(&KEY, 77, seq, &reply).unwrap(), "OK");
        // A reply to another request, another sender, or under another key.
        assert!(open_reply(&KEY, 77, seq + 1, &reply).is_err());
        assert!(open_reply(&KEY, 78, seq, &reply).is_err());
        assert!(open_reply(&OTHER, 77, seq, &reply).is_err());
        // A reply sent back as a request: already in the window, and not a request.
        assert!(fe.open_request(&reply).is_err());
    }

    #[test]
    fn forged_tampered_and_malformed_lines_are_refused_without_moving_the_window() {
        let fe = ControlAuth::new(KEY);
        let forged = seal_request(&OTHER, 5, u64::MAX - 1, "WEIGHTS 10.0.0.11=0");
        assert_eq!(
            fe.open_request(&forged),
            Err(LineRefusal::Envelope(mac::Refusal::BadTag))
        );
        // The forged high sequence did not close the window for the genuine sender.
        let genuine = seal_request(&KEY, 5, now_seq(10), "STATS");
        assert!(fe.open_request(&genuine).is_ok());
        // One hex digit of the request changed.
        let mut t = seal_request(&KEY, 5, now_seq(11), "HOLD 10.0.0.5:4000").into_bytes();
        let last = t.len() - 1;
        t[last] = if t[last] == b'0' { b'1' } else { b'0' };
        let t = String::from_utf8(t).unwrap();
        assert_eq!(
            fe.open_request(&t),
            Err(LineRefusal::Envelope(mac::Refusal::BadTag))
        );
        for bad in [
            "MOVE 10.0.0.5:4000 10.0.0.12",
            "AUTH zz",
            "AUTH abc",
            "AUTH ",
        ] {
            assert!(fe.open_request(bad).is_err(), "{bad}");
        }
        // Unknown key id.
        let other_id = MoveKey {
            id: KeyId(9),
            ..KEY
        };
        assert_eq!(
            fe.open_request(&seal_request(&other_id, 5, now_seq(12), "STATS")),
            Err(LineRefusal::Envelope(mac::Refusal::UnknownKey(KeyId(9))))
        );
    }

    #[test]
    fn hex_round_trips() {
        let b: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&b)).unwrap(), b);
        assert_eq!(unhex("0G"), None);
    }
}
