//! The receiving side in one place, in the only safe order: parse the envelope, find
//! the key it names, verify the tag, and only then let the sequence number move the
//! replay window. What the message may do (its key's [`crate::rights::Rights`]) is the
//! caller's next question.
//!
//! One [`ReplayTable`] per protocol a receiver serves, and on the sender one
//! [`crate::replay::Sequencer`] per (protocol, key id): sequence numbers of different
//! protocols are independent.

use crate::keys::{KeyEntry, Keyring};
use crate::mac::{self, Domain, Envelope};
use crate::replay::{Replay, ReplayTable};
use std::fmt;

/// Why a received message was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Malformed, unknown key or wrong tag.
    Envelope(mac::Refusal),
    /// Authentic, but seen before or too old.
    Replay(Replay),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Envelope(r) => r.fmt(f),
            Refused::Replay(r) => r.fmt(f),
        }
    }
}

impl std::error::Error for Refused {}

impl From<mac::Refusal> for Refused {
    fn from(r: mac::Refusal) -> Refused {
        Refused::Envelope(r)
    }
}

impl From<Replay> for Refused {
    fn from(r: Replay) -> Refused {
        Refused::Replay(r)
    }
}

/// An authentic, fresh message and the key that vouched for it.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a, 'k> {
    pub envelope: Envelope,
    /// The covered message (bytes after it, e.g. padding, are dropped).
    pub message: &'a [u8],
    /// Its key: `key.rights` say what the message may do, `key.name` who sent it.
    pub key: &'k KeyEntry,
}

/// Accept `bytes` as a `domain` message: authentic under a key of `keys`, and never
/// accepted before by `replay`.
pub fn receive<'a, 'k>(
    domain: Domain,
    bytes: &'a [u8],
    keys: &'k Keyring,
    replay: &mut ReplayTable,
) -> Result<Received<'a, 'k>, Refused> {
    let parsed = mac::parse(bytes)?;
    let id = parsed.envelope.key_id;
    let key = keys.get(id).ok_or(mac::Refusal::UnknownKey(id))?;
    let opened = parsed.verify(domain, &key.key)?;
    let env = opened.envelope;
    replay.accept(env.key_id, env.sender, env.seq)?;
    Ok(Received {
        envelope: env,
        message: opened.message,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Policy;
    use crate::mac::KeyId;
    use crate::replay::Sequencer;
    use crate::rights::{self, Access, Rights};
    use crate::siphash::tests::Rng;
    use crate::siphash::SipKey;
    use farside_region::layout::{W_ROLE_SERVED, W_ROLE_WANTED};

    struct Sender {
        id: u64,
        seq: Sequencer,
    }

    impl Sender {
        fn send(&mut self, keys: &Keyring, name: &str, domain: Domain, msg: &[u8]) -> Vec<u8> {
            let k = keys.current(name).expect("a current key");
            let env = Envelope {
                key_id: k.id,
                sender: self.id,
                seq: self.seq.next(1_800_000_000).unwrap(),
            };
            let mut b = Vec::new();
            mac::seal(&mut b, domain, &k.key, &env, msg).unwrap();
            b
        }
    }

    fn ring() -> (Keyring, Rng) {
        let mut rng = Rng(0xace);
        let mut keys = Keyring::new(Policy::Production);
        let k = SipKey::from_halves(rng.next(), rng.next());
        keys.install("balancer", KeyId(1), k, Rights::balancer(0))
            .unwrap();
        let k = SipKey::from_halves(rng.next(), rng.next());
        keys.install("monitor", KeyId(2), k, Rights::reader(0))
            .unwrap();
        (keys, rng)
    }

    #[test]
    fn a_fresh_authentic_message_is_received_once_with_its_keys_rights() {
        let (keys, _) = ring();
        let mut table = ReplayTable::default();
        let mut bal = Sender {
            id: 7,
            seq: Sequencer::new(),
        };
        let m = bal.send(&keys, "balancer", Domain::RmemRequest, b"CAS role_wanted");
        let r = receive(Domain::RmemRequest, &m, &keys, &mut table).unwrap();
        assert_eq!(
            (r.message, r.key.name.as_str()),
            (&b"CAS role_wanted"[..], "balancer")
        );
        let cas = |rights: &Rights, word: usize| {
            rights::check(rights, 0, Access::CompareSwap, (word * 8) as u64, 8)
        };
        assert_eq!(cas(&r.key.rights, W_ROLE_WANTED), Ok(()));
        assert!(cas(&r.key.rights, W_ROLE_SERVED).is_err());
        // The same bytes again.
        assert_eq!(
            receive(Domain::RmemRequest, &m, &keys, &mut table).unwrap_err(),
            Refused::Replay(Replay::Duplicate)
        );
        // A reader's message may not CAS.
        let mut mon = Sender {
            id: 8,
            seq: Sequencer::new(),
        };
        let m = mon.send(&keys, "monitor", Domain::RmemRequest, b"CAS role_wanted");
        let r = receive(Domain::RmemRequest, &m, &keys, &mut table).unwrap();
        assert!(cas(&r.key.rights, W_ROLE_WANTED).is_err());
    }

    #[test]
    fn forgeries_never_move_the_window() {
        let (keys, mut rng) = ring();
        let mut table = ReplayTable::default();
        let mut bal = Sender {
            id: 7,
            seq: Sequencer::new(),
        };
        let genuine = bal.send(&keys, "balancer", Domain::Notify, b"n");
        // A forged message from the same sender with a far higher sequence number.
        let mut forged = genuine.clone();
        forged[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        forged[0..8].copy_from_slice(&rng.next().to_le_bytes());
        assert_eq!(
            receive(Domain::Notify, &forged, &keys, &mut table).unwrap_err(),
            Refused::Envelope(mac::Refusal::BadTag)
        );
        assert!(table.is_empty());
        assert!(receive(Domain::Notify, &genuine, &keys, &mut table).is_ok());
    }

    #[test]
    fn rotation_and_revocation_as_the_receiver_sees_them() {
        let (mut keys, mut rng) = ring();
        let mut table = ReplayTable::default();
        let mut bal = Sender {
            id: 7,
            seq: Sequencer::new(),
        };
        let before = bal.send(&keys, "balancer", Domain::FrontendMove, b"MOVE 1");
        let k = SipKey::from_halves(rng.next(), rng.next());
        keys.install("balancer", KeyId(3), k, Rights::balancer(0))
            .unwrap();
        let after = bal.send(&keys, "balancer", Domain::FrontendMove, b"MOVE 2");
        // Both verify during the rotation.
        assert!(receive(Domain::FrontendMove, &before, &keys, &mut table).is_ok());
        assert!(receive(Domain::FrontendMove, &after, &keys, &mut table).is_ok());
        // The old id revoked: its messages are refused at once.
        keys.revoke(KeyId(1));
        table.forget_key(KeyId(1));
        let late = {
            let env = Envelope {
                key_id: KeyId(1),
                sender: 7,
                seq: bal.seq.next(0).unwrap(),
            };
            let mut b = Vec::new();
            mac::seal(
                &mut b,
                Domain::FrontendMove,
                &SipKey::from_halves(1, 2),
                &env,
                b"x",
            )
            .unwrap();
            b
        };
        assert_eq!(
            receive(Domain::FrontendMove, &late, &keys, &mut table).unwrap_err(),
            Refused::Envelope(mac::Refusal::UnknownKey(KeyId(1)))
        );
    }
}
