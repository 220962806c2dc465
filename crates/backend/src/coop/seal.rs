//! Sealing and opening the messages between cooperating nodes: the cluster key (one
//! key per cluster, id [`COOP_KEY_ID`]), `Domain::Notify`, a process-wide sequence,
//! `auth::receive::receive` with a replay window per sender, replies bound to their
//! request's envelope.
//!
//! Replays across a restart: every node seals with clock sequences (the clock's
//! seconds in the high bits, as `farside_auth::replay::Sequencer`), and a [`Sealer`] refuses, on every window
//! it checks, each sequence of a second before its own start
//! (`farside_auth::floor::clock_floor`). A message captured before a node restarted is
//! refused after it, unless it was sealed in the restart's own second (or by a peer
//! whose clock runs ahead of this node's by more than the restart took).

use farside_auth::keys::{Keyring, Policy as KeyPolicy};
use farside_auth::mac::{self, Domain, Envelope, KeyId};
use farside_auth::replay::ReplayTable;
use farside_auth::siphash::SipKey;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The id of the cluster's coop key in envelopes (one key per cluster).
pub const COOP_KEY_ID: KeyId = KeyId(1);

/// The process-wide envelope sequence: strictly increasing and above what an earlier
/// run of the node sent (the clock's seconds in the high bits).
fn next_seq() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let clock = farside_auth::replay::Sequencer::unix_s().min(u64::from(u32::MAX))
        << farside_auth::replay::SEQ_COUNT_BITS;
    let prev = SEQ
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
            Some(last.saturating_add(1).max(clock))
        })
        .unwrap_or_else(|v| v);
    prev.saturating_add(1).max(clock)
}

/// The cluster key and what checks messages sealed with it.
pub struct Sealer {
    pub key: SipKey,
    keyring: Keyring,
    /// The envelope sender of this node (its index).
    pub me: u64,
    /// Every sequence at or below this is refused: the seconds before this sealer
    /// (this node's run) started, so a window emptied by a restart does not reopen
    /// a replay.
    floor: u64,
}

impl Sealer {
    pub fn new(key: SipKey, me: usize) -> Result<Sealer, String> {
        let mut keyring = Keyring::new(KeyPolicy::Production);
        let rights = farside_auth::rights::Rights::new(0, &[]).map_err(|e| format!("{e:?}"))?;
        keyring
            .install("coop", COOP_KEY_ID, key, rights)
            .map_err(|e| e.to_string())?;
        Ok(Sealer {
            key,
            keyring,
            me: me as u64,
            floor: farside_auth::floor::clock_floor(farside_auth::replay::Sequencer::unix_s()),
        })
    }

    /// The replay floor: sequences at or below it are refused (see the module doc).
    pub fn replay_floor(&self) -> u64 {
        self.floor
    }

    /// `message` sealed by this node with a fresh sequence; returns it and the sequence.
    pub fn seal(&self, message: &[u8]) -> (Vec<u8>, u64) {
        let seq = next_seq();
        let env = Envelope {
            key_id: COOP_KEY_ID,
            sender: self.me,
            seq,
        };
        (self.seal_as(&env, message), seq)
    }

    /// `message` sealed with a given envelope (a reply carries its request's).
    pub fn seal_as(&self, env: &Envelope, message: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        mac::seal(&mut out, Domain::Notify, &self.key, env, message)
            .expect("coop messages are far below MESSAGE_BYTES_MAX");
        out
    }

    /// An authentic message never accepted before by `replay`: its envelope and bytes.
    pub fn receive<'a>(
        &self,
        bytes: &'a [u8],
        replay: &Mutex<ReplayTable>,
    ) -> Result<(Envelope, &'a [u8]), farside_auth::receive::Refused> {
        let mut table = replay.lock().unwrap_or_else(|p| p.into_inner());
        // Once per table in effect: floors only rise, and an equal one returns at once.
        table.raise_floor(self.floor);
        let r = farside_auth::receive::receive(Domain::Notify, bytes, &self.keyring, &mut table)?;
        Ok((r.envelope, r.message))
    }

    /// The message of a reply sealed with exactly `env` (a request's own envelope).
    pub fn open_reply<'a>(&self, env: &Envelope, bytes: &'a [u8]) -> Option<&'a [u8]> {
        let parsed = mac::parse(bytes).ok()?;
        let opened = parsed.verify(Domain::Notify, &self.key).ok()?;
        (opened.envelope == *env).then_some(opened.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_messages_open_only_with_the_key_and_once() {
        let key = SipKey::from_bytes(*b"0123456789abcdef");
        let other = SipKey::from_bytes(*b"fedcba9876543210");
        let a = Sealer::new(key, 1).unwrap();
        let b = Sealer::new(key, 2).unwrap();
        let forger = Sealer::new(other, 1).unwrap();
        let replay = Mutex::new(ReplayTable::new(8));
        let (msg, _) = a.seal(b"hello");
        let (env, text) = b.receive(&msg, &replay).unwrap();
        assert_eq!((env.sender, text), (1, b"hello".as_slice()));
        assert!(b.receive(&msg, &replay).is_err(), "replayed");
        let (forged, _) = forger.seal(b"hello");
        assert!(b.receive(&forged, &replay).is_err(), "wrong key");
        let reply = b.seal_as(&env, b"answer");
        assert_eq!(a.open_reply(&env, &reply), Some(b"answer".as_slice()));
        let other_env = Envelope {
            seq: env.seq + 1,
            ..env
        };
        assert_eq!(
            a.open_reply(&other_env, &reply),
            None,
            "bound to its request"
        );
    }
    /// A message captured before a node restarted is refused by its next run (a new
    /// sealer and new, empty windows); a fresh one is accepted.
    #[test]
    fn a_message_captured_before_a_restart_is_refused_after_it() {
        use farside_auth::replay::Sequencer;
        let key = SipKey::from_bytes(*b"0123456789abcdef");
        let a = Sealer::new(key, 1).unwrap();
        let b = Sealer::new(key, 2).unwrap();
        let replay = Mutex::new(ReplayTable::new(8));
        let (captured, seq) = a.seal(b"fetch /x");
        assert!(b.receive(&captured, &replay).is_ok());
        // The restart: b's next run starts in a later second than the capture was
        // sealed in (awaited, not slept: at most a second).
        let sealed_s = seq >> farside_auth::replay::SEQ_COUNT_BITS;
        while Sequencer::unix_s() <= sealed_s {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let b2 = Sealer::new(key, 2).unwrap();
        assert!(b2.replay_floor() >= seq, "the floor is above the capture");
        let fresh_windows = Mutex::new(ReplayTable::new(8));
        let e = b2.receive(&captured, &fresh_windows).unwrap_err();
        assert!(
            matches!(e, farside_auth::receive::Refused::Replay(_)),
            "{e:?}"
        );
        let (fresh, _) = a.seal(b"fetch /x");
        assert!(b2.receive(&fresh, &fresh_windows).is_ok(), "a new message");
    }
}
