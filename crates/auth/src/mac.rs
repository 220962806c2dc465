//! The envelope every authenticated farside message starts with: which key made the
//! tag, who sent the message and its sequence number, and a SipHash-2-4 tag over all of
//! it and a domain label.
//!
//! ```text
//!  0  u64 tag      SipHash-2-4(key, label || bytes 8 .. 32 + len)
//!  8  u32 key id   names the key (rotation: current and previous both verify)
//! 12  u32 len      bytes after the envelope the tag covers (the protocol's header + body)
//! 16  u64 sender   the sender's id; replay windows are per (key id, sender)
//! 24  u64 seq      strictly increasing per (key id, sender); 0 is never sent
//! 32  message      len bytes, then bytes the tag does not cover (padding), if any
//! ```
//!
//! Little-endian, like every farside wire format. `bpf/auth_siphash.h` mirrors the
//! layout and the labels (a test checks them), so XDP and tc programs verify the same
//! tags in bounded instructions.
//!
//! Why it is safe:
//! - **Forgery.** The tag is a PRF of everything a receiver acts on (key id, length,
//!   sender, sequence, message), under a key only the parties hold: changing any covered
//!   bit, or making a new message, succeeds with probability about 2^-64 per attempt.
//!   Bytes after `len` are not covered; receivers must ignore them (they exist so an
//!   rmem READ can be padded to the size of its reply, as the udp transport requires).
//! - **Cross-protocol and reflection.** The 8-byte domain label ([`Domain`]) is the
//!   first block of every tag and differs per protocol and direction, so a request's
//!   tag never verifies as a reply or as another protocol's message, even under a key
//!   shared by the whole cluster. Labels are never sent.
//! - **Replay.** The tag makes `(key id, sender, seq)` unforgeable; rejecting a
//!   sequence already seen is [`crate::replay`]'s job, done only after the tag verified
//!   (an unauthenticated message never moves a window).
//! - **Timing.** Tags are compared in constant time ([`tags_equal`]): how long a refusal
//!   takes says nothing about how many tag bytes were right.
//! - **Bounds.** [`parse`] reads nothing beyond the buffer and refuses a `len` longer
//!   than what follows the envelope; [`seal`] refuses messages over
//!   [`MESSAGE_BYTES_MAX`].

use crate::siphash::{Prefix, SipKey};
use std::fmt;

/// Bytes of the envelope (`AUTH_ENVELOPE_BYTES`).
pub const ENVELOPE_BYTES: usize = 32;
/// First byte the tag covers: everything after the tag (`AUTH_COVERED_OFFSET`).
pub const COVERED_OFFSET: usize = 8;
/// Longest message [`seal`] accepts: above the largest any farside protocol sends (an
/// rmem WRITE of a whole region is 4 KiB, the front-end control port's reply at most
/// 1 MiB), far under what the envelope's u32 `len` can say.
pub const MESSAGE_BYTES_MAX: usize = 16 << 20;

/// Names a key in a keyring (`crate::keys`); carried in every envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub u32);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {}", self.0)
    }
}

/// Which protocol, and which direction, a tag was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Domain {
    /// rmem requests (READ, WRITE, CAS, FETCH-ADD), the XDP path included.
    RmemRequest,
    /// rmem replies.
    RmemReply,
    /// specd's migration protocol between nodes.
    SpecdMigration,
    /// The front-end's MOVE datagram.
    FrontendMove,
    /// The front-end's control port.
    FrontendControl,
    /// gatherd's notifications.
    Notify,
}

impl Domain {
    pub const ALL: [Domain; 6] = [
        Domain::RmemRequest,
        Domain::RmemReply,
        Domain::SpecdMigration,
        Domain::FrontendMove,
        Domain::FrontendControl,
        Domain::Notify,
    ];

    /// The label: 8 ASCII bytes, the first block of the tag. The final digit is the
    /// envelope's version: a change of layout changes every label.
    pub const fn label_bytes(self) -> &'static [u8; 8] {
        match self {
            Domain::RmemRequest => b"fs-rmq-1",
            Domain::RmemReply => b"fs-rmp-1",
            Domain::SpecdMigration => b"fs-mig-1",
            Domain::FrontendMove => b"fs-mov-1",
            Domain::FrontendControl => b"fs-ctl-1",
            Domain::Notify => b"fs-ntf-1",
        }
    }

    /// The label as the little-endian word the BPF side absorbs (`AUTH_LABEL_*`).
    pub const fn label(self) -> u64 {
        u64::from_le_bytes(*self.label_bytes())
    }

    pub fn name(self) -> &'static str {
        match self {
            Domain::RmemRequest => "rmem_request",
            Domain::RmemReply => "rmem_reply",
            Domain::SpecdMigration => "specd_migration",
            Domain::FrontendMove => "frontend_move",
            Domain::FrontendControl => "frontend_control",
            Domain::Notify => "notify",
        }
    }
}

/// The authenticated facts of an envelope (its `len` is the message's, its tag
/// derived).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    pub key_id: KeyId,
    pub sender: u64,
    pub seq: u64,
}

/// Why a message was not accepted. None of them says which bytes were wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Shorter than an envelope.
    Truncated { bytes: usize },
    /// The envelope's `len` runs past the end of the message.
    LengthBeyondMessage { len: u32, available: usize },
    /// No key with this id (never installed, or revoked).
    UnknownKey(KeyId),
    /// The tag does not verify under the named key.
    BadTag,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Truncated { bytes } => {
                write!(
                    f,
                    "{bytes} bytes, shorter than a {ENVELOPE_BYTES}-byte envelope"
                )
            }
            Refusal::LengthBeyondMessage { len, available } => {
                write!(f, "envelope covers {len} bytes, only {available} follow it")
            }
            Refusal::UnknownKey(id) => write!(f, "unknown {id}"),
            Refusal::BadTag => f.write_str("tag does not verify"),
        }
    }
}

impl std::error::Error for Refusal {}

/// A message too long for [`seal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLong {
    pub bytes: usize,
}

impl fmt::Display for TooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes, over the envelope's {MESSAGE_BYTES_MAX}",
            self.bytes
        )
    }
}

impl std::error::Error for TooLong {}

/// The tag of `message` in `env` for `domain`: SipHash-2-4 of the label followed by
/// the envelope's bytes 8..32 and the message.
pub fn tag(domain: Domain, key: &SipKey, env: &Envelope, message: &[u8]) -> u64 {
    TagKey::new(domain, key).tag(env, message)
}

/// A key prepared for one domain: SipHash's state after the key and the domain's
/// label, made once per key (not per message). [`TagKey::tag`] equals [`tag`]; hot
/// paths (the monitor's READs, the rmem servers) keep one per key and domain.
#[derive(Clone, Copy, Debug)]
pub struct TagKey {
    after_label: Prefix,
}

impl TagKey {
    pub const fn new(domain: Domain, key: &SipKey) -> TagKey {
        TagKey {
            after_label: Prefix::new(key).block_const(domain.label()),
        }
    }

    /// The tag of `message` in `env` (see [`tag`]): the envelope's bytes 8..32 absorbed
    /// as three words, then the message.
    #[inline]
    pub fn tag(&self, env: &Envelope, message: &[u8]) -> u64 {
        let len = message.len() as u32;
        self.after_label
            .block(u64::from(env.key_id.0) | (u64::from(len) << 32))
            .block(env.sender)
            .block(env.seq)
            .finish(message)
    }

    /// [`Parsed::verify`] with the key prepared.
    pub fn verify<'a>(&self, parsed: &Parsed<'a>) -> Result<Opened<'a>, Refusal> {
        let want = self.tag(&parsed.envelope, parsed.message);
        if !tags_equal(want, parsed.tag) {
            return Err(Refusal::BadTag);
        }
        Ok(Opened {
            envelope: parsed.envelope,
            message: parsed.message,
            trailing: parsed.trailing,
        })
    }
}

/// Envelope bytes 8..32.
fn covered_header(env: &Envelope, len: u32) -> [u8; ENVELOPE_BYTES - COVERED_OFFSET] {
    let mut b = [0u8; ENVELOPE_BYTES - COVERED_OFFSET];
    b[0..4].copy_from_slice(&env.key_id.0.to_le_bytes());
    b[4..8].copy_from_slice(&len.to_le_bytes());
    b[8..16].copy_from_slice(&env.sender.to_le_bytes());
    b[16..24].copy_from_slice(&env.seq.to_le_bytes());
    b
}

/// Appends the envelope and `message` to `out`.
pub fn seal(
    out: &mut Vec<u8>,
    domain: Domain,
    key: &SipKey,
    env: &Envelope,
    message: &[u8],
) -> Result<(), TooLong> {
    if message.len() > MESSAGE_BYTES_MAX {
        return Err(TooLong {
            bytes: message.len(),
        });
    }
    out.reserve(ENVELOPE_BYTES + message.len());
    out.extend_from_slice(&tag(domain, key, env, message).to_le_bytes());
    out.extend_from_slice(&covered_header(env, message.len() as u32));
    out.extend_from_slice(message);
    Ok(())
}

/// A message whose envelope is well formed, its tag not yet verified: nothing in it may
/// be acted on except looking up [`Envelope::key_id`].
#[derive(Debug, Clone, Copy)]
pub struct Parsed<'a> {
    pub envelope: Envelope,
    tag: u64,
    /// The covered message (after the envelope, `len` bytes).
    message: &'a [u8],
    /// Bytes after the covered message (padding).
    trailing: &'a [u8],
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// Reads the envelope at the start of `bytes`.
pub fn parse(bytes: &[u8]) -> Result<Parsed<'_>, Refusal> {
    if bytes.len() < ENVELOPE_BYTES {
        return Err(Refusal::Truncated { bytes: bytes.len() });
    }
    let len = u32_at(bytes, 12);
    let available = bytes.len() - ENVELOPE_BYTES;
    if len as usize > available {
        return Err(Refusal::LengthBeyondMessage { len, available });
    }
    let (message, trailing) = bytes[ENVELOPE_BYTES..].split_at(len as usize);
    Ok(Parsed {
        envelope: Envelope {
            key_id: KeyId(u32_at(bytes, 8)),
            sender: u64_at(bytes, 16),
            seq: u64_at(bytes, 24),
        },
        tag: u64_at(bytes, 0),
        message,
        trailing,
    })
}

impl<'a> Parsed<'a> {
    /// The covered message, once the tag verified under `key` for `domain`.
    pub fn verify(&self, domain: Domain, key: &SipKey) -> Result<Opened<'a>, Refusal> {
        TagKey::new(domain, key).verify(self)
    }
}

/// A message whose tag verified. Not yet checked against replay ([`crate::replay`]) or
/// rights ([`crate::rights`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened<'a> {
    pub envelope: Envelope,
    /// The `len` bytes the tag covers.
    pub message: &'a [u8],
    /// Bytes after them, not authenticated: ignore them.
    pub trailing: &'a [u8],
}

/// [`parse`], look the key up by its id, [`Parsed::verify`].
pub fn open(
    domain: Domain,
    bytes: &[u8],
    key_of: impl FnOnce(KeyId) -> Option<SipKey>,
) -> Result<Opened<'_>, Refusal> {
    let parsed = parse(bytes)?;
    let id = parsed.envelope.key_id;
    let key = key_of(id).ok_or(Refusal::UnknownKey(id))?;
    parsed.verify(domain, &key)
}

/// Compares two tags in time independent of their values: every byte is looked at,
/// and `black_box` keeps the compiler from turning the fold into an early exit.
pub fn tags_equal(a: u64, b: u64) -> bool {
    let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
    let mut diff = 0u8;
    for i in 0..8 {
        diff |= std::hint::black_box(a[i] ^ b[i]);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::siphash::siphash24;
    use crate::siphash::tests::Rng;
    use std::collections::HashMap;

    const KEY: SipKey = SipKey::from_halves(0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210);
    const OTHER: SipKey = SipKey::from_halves(0x1111_2222_3333_4444, 0x5555_6666_7777_8888);
    const ENV: Envelope = Envelope {
        key_id: KeyId(7),
        sender: 0xabcdef,
        seq: 42,
    };

    fn sealed(domain: Domain, msg: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        seal(&mut b, domain, &KEY, &ENV, msg).unwrap();
        b
    }

    fn key_7(id: KeyId) -> Option<SipKey> {
        (id == KeyId(7)).then_some(KEY)
    }

    #[test]
    fn sealed_messages_open_under_their_key_and_domain() {
        let msg = b"a control message";
        for d in Domain::ALL {
            let b = sealed(d, msg);
            assert_eq!(b.len(), ENVELOPE_BYTES + msg.len());
            let o = open(d, &b, key_7).unwrap();
            assert_eq!(o.envelope, ENV);
            assert_eq!(o.message, msg);
            assert!(o.trailing.is_empty());
        }
    }

    #[test]
    fn the_tag_is_siphash_of_label_and_bytes_after_the_tag() {
        // The formula bpf/auth_siphash.h implements: label, then the frame from byte 8.
        let msg = b"0123456789abcdef-xyz";
        for d in Domain::ALL {
            let b = sealed(d, msg);
            let mut input = d.label_bytes().to_vec();
            input.extend_from_slice(&b[COVERED_OFFSET..]);
            assert_eq!(u64_at(&b, 0), siphash24(&KEY, &input), "{}", d.name());
        }
    }

    #[test]
    fn a_prepared_key_tags_as_siphash_of_label_and_bytes_after_the_tag() {
        let mut rng = Rng(0x7a6);
        for _ in 0..2000 {
            let key = SipKey::from_halves(rng.next(), rng.next());
            let env = Envelope {
                key_id: KeyId(rng.next() as u32),
                sender: rng.next(),
                seq: rng.next(),
            };
            let n = rng.below(260) as usize;
            let msg = rng.bytes(n);
            let d = Domain::ALL[rng.below(6) as usize];
            let mut b = Vec::new();
            seal(&mut b, d, &key, &env, &msg).unwrap();
            let mut input = d.label_bytes().to_vec();
            input.extend_from_slice(&b[COVERED_OFFSET..]);
            let reference = siphash24(&key, &input);
            assert_eq!(TagKey::new(d, &key).tag(&env, &msg), reference);
            assert_eq!(u64_at(&b, 0), reference);
            let parsed = parse(&b).unwrap();
            assert!(TagKey::new(d, &key).verify(&parsed).is_ok());
            let other = Domain::ALL[(Domain::ALL.iter().position(|&x| x == d).unwrap() + 1) % 6];
            assert_eq!(
                TagKey::new(other, &key).verify(&parsed),
                Err(Refusal::BadTag)
            );
        }
    }

    #[test]
    fn a_tag_never_verifies_for_another_domain() {
        for made in Domain::ALL {
            let b = sealed(made, b"move node 3 to site 1");
            for tried in Domain::ALL.into_iter().filter(|&t| t != made) {
                assert_eq!(open(tried, &b, key_7), Err(Refusal::BadTag));
            }
        }
        let labels: std::collections::HashSet<u64> =
            Domain::ALL.iter().map(|d| d.label()).collect();
        assert_eq!(labels.len(), Domain::ALL.len(), "labels are distinct");
    }

    #[test]
    fn every_single_bit_flip_of_a_covered_byte_is_refused() {
        let msg = b"CAS word 34: 0x0001000000000007 -> 0x0002000000000008";
        let b = sealed(Domain::RmemRequest, msg);
        for i in 0..b.len() {
            for bit in 0..8 {
                let mut f = b.clone();
                f[i] ^= 1 << bit;
                let r = open(Domain::RmemRequest, &f, key_7);
                match i {
                    // The key id: now names no key (or, had it named one, a wrong tag).
                    8..=11 => assert_eq!(
                        r,
                        Err(Refusal::UnknownKey(KeyId(7 ^ (1 << (bit + 8 * (i - 8))))))
                    ),
                    // len: longer than what follows, or shorter (then the tag is wrong).
                    12..=15 => assert!(
                        matches!(
                            r,
                            Err(Refusal::LengthBeyondMessage { .. } | Refusal::BadTag)
                        ),
                        "byte {i} bit {bit}: {r:?}"
                    ),
                    _ => assert_eq!(r, Err(Refusal::BadTag), "byte {i} bit {bit}"),
                }
            }
        }
    }

    #[test]
    fn a_wrong_or_unknown_key_is_refused() {
        let b = sealed(Domain::Notify, b"x");
        assert_eq!(
            open(Domain::Notify, &b, |_| Some(OTHER)),
            Err(Refusal::BadTag)
        );
        assert_eq!(
            open(Domain::Notify, &b, |_| None),
            Err(Refusal::UnknownKey(KeyId(7)))
        );
    }

    #[test]
    fn padding_after_the_covered_message_is_ignored_and_not_authenticated() {
        let mut b = sealed(Domain::RmemRequest, b"READ 200 bytes at 0");
        b.extend_from_slice(&[0u8; 200]);
        let o = open(Domain::RmemRequest, &b, key_7).unwrap();
        assert_eq!(o.message, b"READ 200 bytes at 0");
        assert_eq!(o.trailing.len(), 200);
        let last = b.len() - 1;
        b[last] = 0xff;
        assert!(open(Domain::RmemRequest, &b, key_7).is_ok());
    }

    #[test]
    fn truncated_envelopes_and_lengths_beyond_the_message_are_refused_without_reading_past_it() {
        let b = sealed(Domain::FrontendMove, b"MOVE");
        for n in 0..ENVELOPE_BYTES {
            assert_eq!(parse(&b[..n]).unwrap_err(), Refusal::Truncated { bytes: n });
        }
        for n in ENVELOPE_BYTES..b.len() {
            assert_eq!(
                parse(&b[..n]).unwrap_err(),
                Refusal::LengthBeyondMessage {
                    len: 4,
                    available: n - ENVELOPE_BYTES
                }
            );
        }
        assert!(parse(&b).is_ok());
    }

    #[test]
    fn random_messages_round_trip_and_random_garbage_never_opens() {
        let mut rng = Rng(0xfeed);
        let keys: HashMap<KeyId, SipKey> = (0..4)
            .map(|i| (KeyId(i), SipKey::from_halves(rng.next(), rng.next())))
            .collect();
        for _ in 0..2000 {
            let id = KeyId(rng.below(4) as u32);
            let env = Envelope {
                key_id: id,
                sender: rng.next(),
                seq: rng.next(),
            };
            let len = rng.below(200) as usize;
            let msg = rng.bytes(len);
            let d = Domain::ALL[rng.below(6) as usize];
            let mut b = Vec::new();
            seal(&mut b, d, &keys[&id], &env, &msg).unwrap();
            let o = open(d, &b, |k| keys.get(&k).copied()).unwrap();
            assert_eq!((o.envelope, o.message), (env, &msg[..]));
            // Garbage with a plausible envelope (known key, fitting len): tag fails.
            let mut g = rng.bytes(ENVELOPE_BYTES + msg.len());
            g[8..12].copy_from_slice(&id.0.to_le_bytes());
            g[12..16].copy_from_slice(&(msg.len() as u32).to_le_bytes());
            assert_eq!(open(d, &g, |k| keys.get(&k).copied()), Err(Refusal::BadTag));
        }
    }

    #[test]
    fn seal_refuses_messages_over_the_bound() {
        let big = vec![0u8; MESSAGE_BYTES_MAX + 1];
        let mut out = Vec::new();
        assert_eq!(
            seal(&mut out, Domain::SpecdMigration, &KEY, &ENV, &big),
            Err(TooLong {
                bytes: MESSAGE_BYTES_MAX + 1
            })
        );
        assert!(out.is_empty());
    }

    #[test]
    fn tags_equal_is_equality() {
        let mut rng = Rng(3);
        for _ in 0..1000 {
            let a = rng.next();
            let b = if rng.below(2) == 0 {
                a
            } else {
                a ^ (1 << rng.below(64))
            };
            assert_eq!(tags_equal(a, b), a == b);
        }
    }

    /// `bpf/auth_siphash.h` mirrors the envelope and the labels.
    #[test]
    fn the_bpf_header_mirrors_the_envelope_and_labels() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bpf/auth_siphash.h");
        let text = std::fs::read_to_string(path).expect("bpf/auth_siphash.h");
        let defines: HashMap<&str, u64> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                (it.next()? == "#define").then_some(())?;
                let name = it.next()?;
                let v = it.next()?.trim_end_matches("ULL");
                let v = match v.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16).ok()?,
                    None => v.parse().ok()?,
                };
                Some((name, v))
            })
            .collect();
        let want = [
            ("AUTH_ENVELOPE_BYTES", ENVELOPE_BYTES as u64),
            ("AUTH_COVERED_OFFSET", COVERED_OFFSET as u64),
            ("AUTH_LABEL_RMEM_REQUEST", Domain::RmemRequest.label()),
            ("AUTH_LABEL_RMEM_REPLY", Domain::RmemReply.label()),
            ("AUTH_LABEL_SPECD_MIGRATION", Domain::SpecdMigration.label()),
            ("AUTH_LABEL_FRONTEND_MOVE", Domain::FrontendMove.label()),
            (
                "AUTH_LABEL_FRONTEND_CONTROL",
                Domain::FrontendControl.label(),
            ),
            ("AUTH_LABEL_NOTIFY", Domain::Notify.label()),
        ];
        for (name, value) in want {
            assert_eq!(defines.get(name), Some(&value), "bpf/auth_siphash.h {name}");
        }
    }
}
