//! Replay protection across a receiver's restart. A receiver's windows
//! ([`crate::replay`]) live in memory, so a restarted receiver would accept once more a
//! message it accepted before; this module gives it a floor at or above everything it
//! accepted in earlier lives, without writing anything per message.
//!
//! Senders' sequences carry their wall clock's seconds in the high 32 bits
//! ([`crate::replay::Sequencer`]), so they rise about `2^32` a second. The receiver
//! keeps a **ceiling** C and refuses anything above it ([`ReplayTable::raise_ceiling`]);
//! it persists C before it may accept up to C, and keeps C a short lease ahead of its
//! own clock. A restarted receiver starts with the **floor** F = the last C persisted
//! ([`ReplayTable::raise_floor`]): every sequence at or below F is refused, for every
//! key and sender.
//!
//! ```text
//!  state file (0600, written atomically: farside_rt::rundir::write_atomic)
//!     farside-replay-floor 1
//!     ceiling <C>
//!  start:   F = max(C persisted, (start_s << 32) - 1)
//!           C = max(F, (now_s + CEILING_LEASE_S) << 32)   persisted, then used
//!  running: every CEILING_TICK the same C, persisted when it rises (once a second),
//!           then handed to the receivers (user space and the XDP map)
//!  receive: seq <= F refused (TooOld), seq > C refused (AboveCeiling)
//! ```
//!
//! Why it is safe:
//! - **Nothing accepted is above a persisted ceiling**: a ceiling reaches the receivers
//!   only after its write (file written, `fsync`ed, renamed, directory `fsync`ed)
//!   returned. A failed write leaves the old ceiling: a denial (senders are refused
//!   once their clock passes it, logged), never an unrecorded acceptance.
//! - **So a restart's floor is above everything accepted before**, whatever the clocks
//!   did: only the file matters. A replay of any message accepted in an earlier life
//!   is refused, as is every message sealed before the restart that was not accepted
//!   (in flight at the restart): a sender's retry gets a newer sequence.
//! - **Floors and ceilings only rise**, in the file and in memory. A clock stepped
//!   back leaves the ceiling where it was.
//!
//! What the clocks cost (availability only): a sender whose clock runs more than
//! about `CEILING_LEASE_S - 1` seconds ahead of the receiver's is refused (above the
//! ceiling); after a restart, senders are refused until their clock passes the floor,
//! at most `CEILING_LEASE_S` seconds after the previous life's last tick (a restart
//! that takes longer denies nothing); a sender whose clock is behind waits that much
//! longer.
//!
//! Without a state file ([`Limits::without_state`]) there is no ceiling and the floor
//! is just below the start's second (`(start_s << 32) - 1`): this refuses the replay of every message a
//! sender whose clock is not ahead of the receiver's sealed in an earlier second, but
//! not one sealed in the restart's own second; deployments give receivers a state file.

use crate::replay::{ReplayTable, SEQ_COUNT_BITS};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How far ahead of the receiver's clock its ceiling is kept, seconds. It bounds both
/// the clock skew a sender may have ahead of the receiver (about one second less) and
/// the time senders are refused after a quick restart; two seconds keeps both small
/// for NTP-synchronised hosts (milliseconds apart) while a tick may be late by a
/// second on a busy host.
pub const CEILING_LEASE_S: u64 = 2;
/// How often a receiver raises (and, once a second, persists) its ceiling: well under
/// a second, so the ceiling stays at least `CEILING_LEASE_S - 1` seconds ahead.
pub const CEILING_TICK: Duration = Duration::from_millis(250);
/// First line of a state file: the format and its version.
const MAGIC: &str = "farside-replay-floor 1";
/// Largest state file read: two short lines.
const STATE_BYTES_MAX: usize = 256;

/// The lowest sequence a [`crate::replay::Sequencer`] sends at `unix_s`.
pub fn clock_seq(unix_s: u64) -> u64 {
    unix_s.min(u64::from(u32::MAX)) << SEQ_COUNT_BITS
}

/// The floor the clock alone gives a receiver started at `unix_s`: every sequence of
/// an earlier second (a sender's first of `unix_s` is [`clock_seq`] itself, accepted).
pub fn clock_floor(unix_s: u64) -> u64 {
    clock_seq(unix_s).saturating_sub(1)
}

/// The ceiling due at `unix_s`: `CEILING_LEASE_S` seconds ahead.
pub fn ceiling_at(unix_s: u64) -> u64 {
    clock_seq(unix_s.saturating_add(CEILING_LEASE_S))
}

/// What a receiver refuses: sequences at or below `floor`, and above `ceiling`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub floor: u64,
    /// `u64::MAX`: no ceiling.
    pub ceiling: u64,
}

impl Limits {
    /// A receiver without a state file started at `unix_s`: the floor is just below
    /// that second (see the module doc), no ceiling.
    pub fn without_state(unix_s: u64) -> Limits {
        Limits {
            floor: clock_floor(unix_s),
            ceiling: u64::MAX,
        }
    }

    /// A receiver whose previous life persisted `persisted` (None: its first start),
    /// started at `unix_s`.
    pub fn after(persisted: Option<u64>, unix_s: u64) -> Limits {
        let floor = persisted.unwrap_or(0).max(clock_floor(unix_s));
        Limits {
            floor,
            ceiling: floor.max(ceiling_at(unix_s)),
        }
    }

    /// Apply to a table (floors and ceilings only rise).
    pub fn apply(&self, table: &mut ReplayTable) {
        table.raise_floor(self.floor);
        if self.ceiling != u64::MAX {
            table.raise_ceiling(self.ceiling);
        }
    }
}

/// The state file's text for `ceiling`.
pub fn encode(ceiling: u64) -> String {
    format!("{MAGIC}\nceiling {ceiling}\n")
}

/// The ceiling a state file's text holds.
pub fn decode(text: &str) -> Result<u64, String> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err(format!("first line is not `{MAGIC}`"));
    }
    let line = lines.next().ok_or("no ceiling line")?;
    let v = line
        .strip_prefix("ceiling ")
        .ok_or_else(|| format!("`{line}`: expected `ceiling N`"))?;
    let c = v
        .parse::<u64>()
        .map_err(|e| format!("ceiling `{v}`: {e}"))?;
    if lines.any(|l| !l.trim().is_empty()) {
        return Err("text after the ceiling line".into());
    }
    Ok(c)
}

/// A receiver's state file: the last ceiling persisted.
#[derive(Debug)]
pub struct FloorFile {
    path: PathBuf,
    ceiling: u64,
}

impl FloorFile {
    /// Read the state at `path` (none yet: a first start), and persist this life's
    /// first ceiling before returning the limits to start with. A file that does not
    /// parse is an error naming it, never replaced: starting without its floor would
    /// let earlier messages in again.
    pub fn open(path: &Path, unix_s: u64) -> io::Result<(FloorFile, Limits)> {
        let bad = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "replay state {}: {why}; refusing to start (removing it lets requests \
                     recorded before this restart in once more)",
                    path.display()
                ),
            )
        };
        let persisted = match farside_rt::rundir::read_file(path)? {
            None => None,
            Some(b) if b.len() > STATE_BYTES_MAX => {
                return Err(bad(format!("{} bytes, at most {STATE_BYTES_MAX}", b.len())))
            }
            Some(b) => {
                let text = std::str::from_utf8(&b).map_err(|_| bad("not UTF-8".into()))?;
                Some(decode(text).map_err(bad)?)
            }
        };
        let limits = Limits::after(persisted, unix_s);
        let mut f = FloorFile {
            path: path.to_path_buf(),
            ceiling: persisted.unwrap_or(0),
        };
        f.persist(limits.ceiling)?;
        Ok((f, limits))
    }

    /// Raise the ceiling for `unix_s` if it is due: `Ok(Some(c))` once `c` is
    /// persisted (then, and only then, hand it to the receivers), `Ok(None)` if it did
    /// not rise. On error the old ceiling stands (see the module doc).
    pub fn extend(&mut self, unix_s: u64) -> io::Result<Option<u64>> {
        let c = ceiling_at(unix_s);
        if c <= self.ceiling {
            return Ok(None);
        }
        self.persist(c)?;
        Ok(Some(c))
    }

    fn persist(&mut self, ceiling: u64) -> io::Result<()> {
        let ceiling = ceiling.max(self.ceiling);
        farside_rt::rundir::write_atomic(
            &self.path,
            encode(ceiling).as_bytes(),
            farside_rt::rundir::FILE_MODE,
        )
        .map_err(|e| io::Error::new(e.kind(), format!("replay state: {e}")))?;
        self.ceiling = ceiling;
        Ok(())
    }

    /// The last ceiling persisted.
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Keyring, Policy};
    use crate::mac::{self, Domain, Envelope, KeyId};
    use crate::receive::{receive, Refused};
    use crate::replay::{Replay, Sequencer};
    use crate::rights::Rights;
    use crate::siphash::SipKey;

    const T: u64 = 1_800_000_000;

    fn tmp(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("farside-auth-floor-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d.join("state/replay.state")
    }

    fn ring() -> Keyring {
        let mut k = Keyring::new(Policy::Production);
        k.install(
            "balancer",
            KeyId(1),
            SipKey::from_halves(0x0123_4567_89ab_cdef, 0x7766_5544_3322_1100),
            Rights::balancer(0),
        )
        .unwrap();
        k
    }

    fn seal(seq: u64) -> Vec<u8> {
        let keys = ring();
        let k = keys.current("balancer").unwrap();
        let env = Envelope {
            key_id: k.id,
            sender: 7,
            seq,
        };
        let mut b = Vec::new();
        mac::seal(&mut b, Domain::RmemRequest, &k.key, &env, b"FADD 1").unwrap();
        b
    }

    /// A receiver's life: its table with the limits it started with.
    fn start(path: &Path, unix_s: u64) -> (FloorFile, ReplayTable) {
        let (f, limits) = FloorFile::open(path, unix_s).unwrap();
        let mut t = ReplayTable::default();
        limits.apply(&mut t);
        (f, t)
    }

    #[test]
    fn the_state_file_round_trips_and_bad_ones_are_refused() {
        assert_eq!(decode(&encode(42)), Ok(42));
        for bad in [
            "",
            "farside-replay-floor 2\nceiling 1\n",
            "farside-replay-floor 1\n",
            "farside-replay-floor 1\nceiling x\n",
            "farside-replay-floor 1\nceiling 1\nmore\n",
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
        let p = tmp("bad");
        farside_rt::rundir::write_atomic(&p, b"garbage", 0o600).unwrap();
        let e = FloorFile::open(&p, T).unwrap_err();
        assert!(e.to_string().contains("refusing to start"), "{e}");
        std::fs::remove_dir_all(p.parent().unwrap().parent().unwrap()).unwrap();
    }

    /// The test the module exists for: a request captured before the receiver's
    /// restart and replayed after it is refused, in the restart's own second and
    /// later; the sender's new requests are accepted once its clock passes the floor.
    #[test]
    fn a_request_captured_before_a_restart_is_refused_after_it() {
        let p = tmp("restart");
        let keys = ring();
        let (mut file, mut table) = start(&p, T);
        let mut seq = Sequencer::new();
        // The receiver runs for three seconds; its ticks raise the ceiling.
        let mut captured = Vec::new();
        for s in T..T + 3 {
            if let Some(c) = file.extend(s).unwrap() {
                table.raise_ceiling(c);
            }
            for _ in 0..3 {
                let m = seal(seq.next(s).unwrap());
                assert!(receive(Domain::RmemRequest, &m, &keys, &mut table).is_ok());
                captured.push(m);
            }
        }
        assert_eq!(file.ceiling(), ceiling_at(T + 2));
        drop((file, table));
        // Restarted in the same second as the last request: every capture refused.
        let (mut file, mut table) = start(&p, T + 2);
        for m in &captured {
            let r = receive(Domain::RmemRequest, m, &keys, &mut table).unwrap_err();
            assert!(matches!(r, Refused::Replay(Replay::TooOld { .. })), "{r}");
        }
        // A request sealed before the restart but never delivered is refused too.
        let late = seal(seq.next(T + 2).unwrap());
        assert!(receive(Domain::RmemRequest, &late, &keys, &mut table).is_err());
        // The sender is refused until its clock passes the floor (the lease), then
        // accepted again.
        let later = T + 2 + CEILING_LEASE_S + 1;
        assert!(receive(
            Domain::RmemRequest,
            &seal(clock_seq(later)),
            &keys,
            &mut table
        )
        .is_err());
        table.raise_ceiling(file.extend(later).unwrap().unwrap());
        let fresh = seal(seq.next(later).unwrap());
        assert!(receive(Domain::RmemRequest, &fresh, &keys, &mut table).is_ok());
        std::fs::remove_dir_all(p.parent().unwrap().parent().unwrap()).unwrap();
    }

    #[test]
    fn the_ceiling_refuses_what_is_too_far_ahead_and_only_rises() {
        let p = tmp("ceiling");
        let keys = ring();
        let (mut file, mut table) = start(&p, T);
        let ahead = seal(ceiling_at(T) + 1);
        assert_eq!(
            receive(Domain::RmemRequest, &ahead, &keys, &mut table).unwrap_err(),
            Refused::Replay(Replay::AboveCeiling {
                seq: ceiling_at(T) + 1,
                ceiling: ceiling_at(T)
            })
        );
        // Refused, it took no slot: once the ceiling passes it, it is accepted once.
        table.raise_ceiling(file.extend(T + 1).unwrap().unwrap());
        assert!(receive(Domain::RmemRequest, &ahead, &keys, &mut table).is_ok());
        assert!(receive(Domain::RmemRequest, &ahead, &keys, &mut table).is_err());
        // A clock stepped back changes nothing, in the file or in memory.
        assert_eq!(file.extend(T - 100).unwrap(), None);
        table.raise_ceiling(ceiling_at(T - 100));
        assert_eq!(table.ceiling(), ceiling_at(T + 1));
        // A restart with the clock behind the file still starts above it.
        let (_f, limits) = FloorFile::open(&p, T - 100).unwrap();
        assert_eq!(limits.floor, ceiling_at(T + 1));
        assert!(limits.ceiling >= limits.floor);
        std::fs::remove_dir_all(p.parent().unwrap().parent().unwrap()).unwrap();
    }

    #[test]
    fn without_state_the_floor_is_the_starts_second() {
        let l = Limits::without_state(T);
        let mut t = ReplayTable::default();
        t.accept(KeyId(1), 7, clock_seq(T - 1) + 5).unwrap();
        l.apply(&mut t);
        // The window at or below the floor is gone; its sender starts above the floor.
        assert!(t.is_empty());
        assert!(t.accept(KeyId(1), 7, clock_seq(T - 1) + 6).is_err());
        assert!(t.accept(KeyId(1), 7, clock_seq(T) - 1).is_err());
        assert_eq!(t.accept(KeyId(1), 7, clock_seq(T)), Ok(()));
        assert_eq!(t.ceiling(), u64::MAX);
    }
}
