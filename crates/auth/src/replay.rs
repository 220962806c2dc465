//! Replay protection: a sliding window of sequence numbers per (key id, sender), as
//! IPsec and WireGuard keep per security association (RFC 6479's bitmap), and the
//! sender's side that makes sequence numbers survive restarts without stored state.
//!
//! ```text
//!   sender:   seq = max(last + 1, unix_seconds << 32)        (Sequencer)
//!   receiver: open the envelope (mac) ── tag ok ──► ReplayTable::accept(key id, sender, seq)
//!                                                   │ seq 0                    ─► Zero
//!                                                   │ second(seq) < second(top): judged by the
//!                                                   │   window of the sender's previous second
//!                                                   │   (SecondWindows), if it is that second,
//!                                                   │   else                   ─► TooOld
//!                                                   │ seq > top                ─► accept, slide
//!                                                   │ top - seq >= WINDOW_MSGS ─► TooOld
//!                                                   │ its bit set              ─► Duplicate
//!                                                   └ else                     ─► accept, set bit
//! ```
//!
//! Why it is safe:
//! - **Exactly once inside the window.** The bitmap holds [`WINDOW_BITS`] bits in
//!   [`WINDOW_BLOCKS`] words; a sequence maps to bit `seq % WINDOW_BITS`. Only the last
//!   [`WINDOW_MSGS`] = `WINDOW_BITS - 64` sequences below the highest accepted (`top`)
//!   are judged by their bit; they span at most `WINDOW_BLOCKS` distinct words, and a
//!   word is zeroed only when `top` first enters it, so inside the window a bit is set
//!   if and only if that sequence was accepted. The tests compare the window with a
//!   model that remembers every sequence.
//! - **Nothing older.** A sequence `WINDOW_MSGS` or more below `top` is refused
//!   unjudged, so a message can be accepted at most once per (key id, sender) entry.
//! - **Only authenticated messages move a window**: callers accept after the tag
//!   verified ([`crate::mac`]), so an attacker without the key can neither advance a
//!   window (denying the sender) nor fill the table with senders.
//! - **Eviction never reopens a replay.** The table tracks at most
//!   [`ReplayTable::senders_max`] entries ([`SENDERS_MAX`] by default). A new sender
//!   arriving at a full table evicts the least recently accepted entry, and the evicted
//!   entry's `top` raises its key's floor: entries created later for that key start at
//!   the floor, refusing every sequence at or below it. So a recorded message of an
//!   evicted sender is refused when replayed, as it would have been before.
//! - **Restarts without stored state.** [`Sequencer`] starts from the wall clock's
//!   seconds in the high 32 bits and counts by one within a second: after a restart its
//!   sequences are above everything it sent before, unless it sent over 2^32 messages
//!   in one second or the clock stepped back across the restart (then the receiver
//!   refuses it until the clock passes its old sequences: a denial, never an accepted
//!   replay). Counting by one keeps the window's reordering tolerance (960 messages)
//!   for messages sent within one second.
//! - **Reordering across a second boundary.** A sender whose threads share one
//!   sequencer over several connections (a daemon's pooled control connections) may
//!   have a message sealed just before a second boundary arrive after one sealed just
//!   after it: 2^32 − k below the newest, far past any bitmap. So a table keeps, per
//!   sender, the window of the second before the newest one as well
//!   ([`SecondWindows`]): a sequence of that second is judged by it (exactly once
//!   inside its window, as any), one of an older second is refused as too old. When
//!   the newest second moves on, the window two seconds back is dropped, and with it
//!   every sequence of that second or older is refused for good, so nothing is
//!   accepted twice. The XDP program's windows (`bpf/rmem.bpf.c`) judge by one window
//!   only: a one-sided request overtaken across a second boundary is dropped there.
//! - **Restarts of the receiver.** Windows live in memory; a restarted receiver starts
//!   with a floor above everything it accepted before ([`ReplayTable::raise_floor`])
//!   and accepts nothing above a ceiling it persisted first
//!   ([`ReplayTable::raise_ceiling`]); [`crate::floor`] keeps both.
//! - **No wrap.** A sequence never wraps: [`Sequencer::next`] returns `None` at
//!   `u64::MAX` (rotate the key), and a receiver refuses anything `WINDOW_MSGS` below
//!   its `top`, so a wrapped counter is refused, never taken for a fresh one.
//!
//! Cost of the floor: a sender new to this receiver whose clock runs behind an evicted
//! sender of the same key by more than a second is refused until it catches up. The
//! evicted entry is the least recently used one, so its `top` is usually old.

use crate::mac::KeyId;
use std::collections::HashMap;
use std::fmt;

/// Words of a window's bitmap.
pub const WINDOW_BLOCKS: usize = 16;
/// Bits of a window's bitmap: 128 bytes per tracked sender.
pub const WINDOW_BITS: u64 = WINDOW_BLOCKS as u64 * 64;
/// How far below the highest accepted sequence a message may still be accepted: one
/// word less than the bitmap (RFC 6479), so sliding zeroes whole words. Control
/// messages of one sender are rarely more than a few apart; 960 absorbs bursts.
pub const WINDOW_MSGS: u64 = WINDOW_BITS - 64;
/// Senders a [`ReplayTable`] tracks at most by default (about 180 bytes each, so
/// 720 KiB): well above the peers of a node (proxies' monitors, balancers, front-ends,
/// specd peers) and the rmem clients of each.
pub const SENDERS_MAX: usize = 4096;
/// Key ids with their own eviction floor; beyond it floors merge into one for all keys
/// (safe: a floor only refuses more). More than a keyring holds at once.
pub const FLOOR_KEYS_MAX: usize = 64;
/// Bits of [`Sequencer`]'s count within one second.
pub const SEQ_COUNT_BITS: u32 = 32;

/// Why a sequence was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// 0 is never sent.
    Zero,
    /// Accepted before.
    Duplicate,
    /// Below the window: too old to tell, or below an eviction or restart floor.
    TooOld { seq: u64, top: u64 },
    /// Above the receiver's ceiling: further ahead of its clock than the bound it
    /// persisted before accepting (see [`crate::floor`]); refused so that a restart's
    /// floor stays above everything accepted.
    AboveCeiling { seq: u64, ceiling: u64 },
}

impl fmt::Display for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Replay::Zero => f.write_str("sequence 0"),
            Replay::Duplicate => f.write_str("duplicate sequence"),
            Replay::TooOld { seq, top } => write!(
                f,
                "sequence {seq} is {} below the newest {top}, over the window of {WINDOW_MSGS}",
                top - seq
            ),
            Replay::AboveCeiling { seq, ceiling } => {
                write!(f, "sequence {seq} is above the ceiling {ceiling}")
            }
        }
    }
}

impl std::error::Error for Replay {}

/// One sender's window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// Highest sequence accepted (or the floor it started at).
    top: u64,
    bits: [u64; WINDOW_BLOCKS],
}

impl Default for Window {
    fn default() -> Self {
        Window::new()
    }
}

fn block_of(seq: u64) -> usize {
    ((seq / 64) % WINDOW_BLOCKS as u64) as usize
}

impl Window {
    /// Nothing accepted yet: every sequence from 1 is new.
    pub const fn new() -> Window {
        Window {
            top: 0,
            bits: [0; WINDOW_BLOCKS],
        }
    }

    /// As if every sequence up to `floor` had been accepted: they are all refused, and
    /// everything above is new.
    pub fn starting_above(floor: u64) -> Window {
        let mut w = Window {
            top: floor,
            bits: [u64::MAX; WINDOW_BLOCKS],
        };
        // The word holding `floor` also holds sequences above it: only its lower bits.
        let bit = floor % 64;
        w.bits[block_of(floor)] = if bit == 63 {
            u64::MAX
        } else {
            (1u64 << (bit + 1)) - 1
        };
        w
    }

    /// Highest sequence accepted.
    pub fn top(&self) -> u64 {
        self.top
    }

    /// Would `seq` be accepted? Changes nothing.
    pub fn check(&self, seq: u64) -> Result<(), Replay> {
        if seq == 0 {
            return Err(Replay::Zero);
        }
        if seq > self.top {
            return Ok(());
        }
        if self.top - seq >= WINDOW_MSGS {
            return Err(Replay::TooOld { seq, top: self.top });
        }
        if self.bits[block_of(seq)] & (1 << (seq % 64)) != 0 {
            return Err(Replay::Duplicate);
        }
        Ok(())
    }

    /// [`check`](Window::check), and record `seq` if accepted.
    pub fn accept(&mut self, seq: u64) -> Result<(), Replay> {
        self.check(seq)?;
        if seq > self.top {
            // Zero the words `top` enters (all of them after a jump of a whole window).
            let (cur, new) = (self.top / 64, seq / 64);
            let entered = (new - cur).min(WINDOW_BLOCKS as u64);
            for i in 1..=entered {
                self.bits[((cur + i) % WINDOW_BLOCKS as u64) as usize] = 0;
            }
            self.top = seq;
        }
        self.bits[block_of(seq)] |= 1 << (seq % 64);
        Ok(())
    }
}

/// The second a sequence was sealed in (its high bits, see [`Sequencer`]).
fn second_of(seq: u64) -> u64 {
    seq >> SEQ_COUNT_BITS
}

/// One sender's window in its newest second, and the window it had in the second
/// before that (see the module doc: reordering across a second boundary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecondWindows {
    /// The window of the newest second accepted (or of the floor).
    newest: Window,
    /// The window as it stood when the newest second began (its `top` is in an older
    /// second), kept until the next second begins.
    before: Option<Window>,
}

impl SecondWindows {
    /// As [`Window::starting_above`]: every sequence up to `floor` is refused.
    pub fn starting_above(floor: u64) -> SecondWindows {
        SecondWindows {
            newest: Window::starting_above(floor),
            before: None,
        }
    }

    /// Highest sequence accepted.
    pub fn top(&self) -> u64 {
        self.newest.top()
    }

    /// Would `seq` be accepted? Changes nothing.
    pub fn check(&self, seq: u64) -> Result<(), Replay> {
        let top = self.newest.top();
        if seq == 0 || second_of(seq) >= second_of(top) {
            return self.newest.check(seq);
        }
        match &self.before {
            Some(b) if second_of(seq) == second_of(b.top()) => b.check(seq).map_err(|e| match e {
                Replay::TooOld { seq, .. } => Replay::TooOld { seq, top },
                e => e,
            }),
            _ => Err(Replay::TooOld { seq, top }),
        }
    }

    /// [`check`](SecondWindows::check), and record `seq` if accepted.
    pub fn accept(&mut self, seq: u64) -> Result<(), Replay> {
        self.check(seq)?;
        let top = self.newest.top();
        if second_of(seq) > second_of(top) {
            self.before = Some(self.newest.clone());
            self.newest.accept(seq)
        } else if second_of(seq) == second_of(top) {
            self.newest.accept(seq)
        } else {
            self.before
                .as_mut()
                .expect("check judged it by the window before")
                .accept(seq)
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    window: SecondWindows,
    /// Value of the table's clock at the last accept (least recently used goes first).
    used: u64,
}

/// Windows per (key id, sender), bounded; see the module doc for the eviction rule.
#[derive(Debug, Clone)]
pub struct ReplayTable {
    senders_max: usize,
    entries: HashMap<(KeyId, u64), Entry>,
    /// Highest `top` evicted per key id (at most [`FLOOR_KEYS_MAX`]).
    floors: HashMap<KeyId, u64>,
    /// Floor of every key whose own floor did not fit, and the restart floor.
    floor_all: u64,
    /// Highest sequence accepted at all (`u64::MAX`: no ceiling).
    ceiling: u64,
    clock: u64,
    evictions: u64,
}

impl Default for ReplayTable {
    fn default() -> Self {
        ReplayTable::new(SENDERS_MAX)
    }
}

impl ReplayTable {
    /// A table tracking at most `senders_max` (key id, sender) pairs (at least 1).
    pub fn new(senders_max: usize) -> ReplayTable {
        ReplayTable {
            senders_max: senders_max.max(1),
            entries: HashMap::new(),
            floors: HashMap::new(),
            floor_all: 0,
            ceiling: u64::MAX,
            clock: 0,
            evictions: 0,
        }
    }

    /// Refuse, for every key and sender, every sequence at or below `floor` (a
    /// restart's floor, [`crate::floor`]): a sender without a window starts above it,
    /// and a window at or below it is dropped (its sender starts above the floor
    /// too). Floors only rise.
    pub fn raise_floor(&mut self, floor: u64) {
        if floor <= self.floor_all {
            return;
        }
        self.floor_all = floor;
        self.entries.retain(|_, e| e.window.top() > floor);
    }

    /// Refuse every sequence above `ceiling` (the bound persisted before anything up
    /// to it may be accepted, [`crate::floor`]). Ceilings only rise.
    pub fn raise_ceiling(&mut self, ceiling: u64) {
        if self.ceiling == u64::MAX || ceiling > self.ceiling {
            self.ceiling = ceiling;
        }
    }

    /// The ceiling (`u64::MAX`: none).
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    pub fn senders_max(&self) -> usize {
        self.senders_max
    }

    /// (key id, sender) pairs tracked now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries evicted so far (a metric: non-zero means the bound is tight).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    fn floor(&self, key_id: KeyId) -> u64 {
        self.floors
            .get(&key_id)
            .copied()
            .unwrap_or(0)
            .max(self.floor_all)
    }

    /// Would `seq` from `sender` under `key_id` be accepted? Changes nothing.
    pub fn check(&self, key_id: KeyId, sender: u64, seq: u64) -> Result<(), Replay> {
        self.under_ceiling(seq)?;
        match self.entries.get(&(key_id, sender)) {
            Some(e) => e.window.check(seq),
            None => SecondWindows::starting_above(self.floor(key_id)).check(seq),
        }
    }

    /// Accept `seq` from `sender` under `key_id`, once its envelope's tag verified.
    pub fn accept(&mut self, key_id: KeyId, sender: u64, seq: u64) -> Result<(), Replay> {
        self.under_ceiling(seq)?;
        self.clock += 1;
        let now = self.clock;
        if let Some(e) = self.entries.get_mut(&(key_id, sender)) {
            e.window.accept(seq)?;
            e.used = now;
            return Ok(());
        }
        // A new sender: judge it before evicting anyone for it.
        let mut window = SecondWindows::starting_above(self.floor(key_id));
        window.accept(seq)?;
        if self.entries.len() >= self.senders_max {
            self.evict_least_recent();
        }
        self.entries
            .insert((key_id, sender), Entry { window, used: now });
        Ok(())
    }

    fn under_ceiling(&self, seq: u64) -> Result<(), Replay> {
        if seq > self.ceiling {
            return Err(Replay::AboveCeiling {
                seq,
                ceiling: self.ceiling,
            });
        }
        Ok(())
    }

    /// O(tracked senders); runs only when a new authenticated sender meets a full table.
    fn evict_least_recent(&mut self) {
        let Some((&victim, _)) = self.entries.iter().min_by_key(|(_, e)| e.used) else {
            return;
        };
        let top = self
            .entries
            .remove(&victim)
            .expect("just found")
            .window
            .top();
        self.evictions += 1;
        let key_id = victim.0;
        if let Some(f) = self.floors.get_mut(&key_id) {
            *f = (*f).max(top);
        } else if self.floors.len() < FLOOR_KEYS_MAX {
            self.floors.insert(key_id, top);
        } else {
            self.floor_all = self.floor_all.max(top);
        }
    }

    /// Drop every window and the floor of `key_id` (after the key is revoked: nothing
    /// under it verifies any more, so its windows protect nothing).
    pub fn forget_key(&mut self, key_id: KeyId) {
        self.entries.retain(|(k, _), _| *k != key_id);
        self.floors.remove(&key_id);
    }
}

/// The sender's sequence numbers for one (key id, sender): strictly increasing, and
/// above everything an earlier run of the same sender sent (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct Sequencer {
    last: u64,
}

impl Sequencer {
    pub fn new() -> Sequencer {
        Sequencer { last: 0 }
    }

    /// The next sequence, given the wall clock in seconds since the Unix epoch;
    /// `None` once `u64::MAX` was handed out (switch to a new key id).
    pub fn next(&mut self, unix_s: u64) -> Option<u64> {
        let after = self.last.checked_add(1)?;
        let clock = unix_s.min(u64::from(u32::MAX)) << SEQ_COUNT_BITS;
        self.last = after.max(clock);
        Some(self.last)
    }

    /// Seconds since the Unix epoch by the system clock (0 if it is before 1970).
    pub fn unix_s() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::siphash::tests::Rng;
    use std::collections::HashSet;

    /// Remembers every accepted sequence: what the window must agree with.
    #[derive(Default)]
    struct Model {
        top: u64,
        seen: HashSet<u64>,
    }

    impl Model {
        fn accept(&mut self, seq: u64) -> Result<(), Replay> {
            if seq == 0 {
                return Err(Replay::Zero);
            }
            if seq <= self.top && self.top - seq >= WINDOW_MSGS {
                return Err(Replay::TooOld { seq, top: self.top });
            }
            if !self.seen.insert(seq) {
                return Err(Replay::Duplicate);
            }
            self.top = self.top.max(seq);
            Ok(())
        }
    }

    #[test]
    fn in_order_sequences_are_accepted_once() {
        let mut w = Window::new();
        for s in 1..=5000 {
            assert_eq!(w.accept(s), Ok(()));
        }
        for s in 5000 - WINDOW_MSGS + 1..=5000 {
            assert_eq!(w.accept(s), Err(Replay::Duplicate), "{s}");
        }
        assert_eq!(
            w.accept(5000 - WINDOW_MSGS),
            Err(Replay::TooOld {
                seq: 5000 - WINDOW_MSGS,
                top: 5000
            })
        );
    }

    #[test]
    fn reordering_within_the_window_is_accepted_and_duplicates_are_not() {
        let mut rng = Rng(0x0de7);
        let mut w = Window::new();
        let mut base = 1u64;
        for _ in 0..50 {
            // A shuffled run of WINDOW_MSGS consecutive sequences.
            let mut run: Vec<u64> = (base..base + WINDOW_MSGS).collect();
            for i in (1..run.len()).rev() {
                run.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for &s in &run {
                assert_eq!(w.accept(s), Ok(()), "{s}");
            }
            for &s in &run {
                assert_eq!(w.accept(s), Err(Replay::Duplicate), "{s}");
            }
            base += WINDOW_MSGS + rng.below(3 * WINDOW_BITS);
        }
    }

    /// Random mixes of steps forward, steps back, duplicates, sequences far below and
    /// huge jumps: the window decides exactly as the model that remembers everything.
    #[test]
    fn the_window_agrees_with_a_model_that_remembers_everything() {
        for seed in 0..20 {
            let mut rng = Rng(seed);
            let mut w = Window::new();
            let mut m = Model::default();
            let mut last = 1u64;
            for step in 0..20_000 {
                let seq = match rng.below(10) {
                    0..=3 => last + 1 + rng.below(4),
                    4..=5 => last.saturating_sub(rng.below(WINDOW_MSGS + 64)),
                    6 => last,
                    7 => last.saturating_sub(WINDOW_BITS + rng.below(1 << 20)),
                    8 => last + rng.below(WINDOW_BITS * 3),
                    _ => last.saturating_add(rng.below(1 << 40)),
                };
                let got = w.accept(seq);
                assert_eq!(got, m.accept(seq), "seed {seed} step {step} seq {seq}");
                if got.is_ok() {
                    last = seq;
                }
            }
        }
    }

    /// Remembers every accepted sequence and the top of the newest second and of the
    /// second before it: what [`SecondWindows`] must agree with.
    #[derive(Default)]
    struct SecondsModel {
        top: u64,
        before_top: Option<u64>,
        seen: HashSet<u64>,
    }

    impl SecondsModel {
        fn accept(&mut self, seq: u64) -> Result<(), Replay> {
            let too_old = Replay::TooOld { seq, top: self.top };
            if seq == 0 {
                return Err(Replay::Zero);
            }
            // The top of the window that judges `seq`.
            let judge = if second_of(seq) >= second_of(self.top) {
                self.top
            } else {
                match self.before_top {
                    Some(b) if second_of(b) == second_of(seq) => b,
                    _ => return Err(too_old),
                }
            };
            if seq <= judge && judge - seq >= WINDOW_MSGS {
                return Err(too_old);
            }
            if !self.seen.insert(seq) {
                return Err(Replay::Duplicate);
            }
            if second_of(seq) > second_of(self.top) {
                self.before_top = Some(self.top);
            }
            if second_of(seq) >= second_of(self.top) {
                self.top = self.top.max(seq);
            } else {
                self.before_top = Some(judge.max(seq));
            }
            Ok(())
        }
    }

    #[test]
    fn a_message_overtaken_across_a_second_boundary_is_accepted_once() {
        let s = 1_800_000_000u64 << SEQ_COUNT_BITS;
        let second = 1u64 << SEQ_COUNT_BITS;
        let mut w = SecondWindows::starting_above(s - 1);
        for k in 0..5 {
            w.accept(s + k).unwrap();
        }
        // The next second's first message arrives before the last two of this one.
        assert_eq!(w.accept(s + second), Ok(()));
        assert_eq!(w.accept(s + 6), Ok(()));
        assert_eq!(w.accept(s + 5), Ok(()));
        for k in 0..7 {
            assert_eq!(w.accept(s + k), Err(Replay::Duplicate), "{k}");
        }
        // Below the floor (the second before the first one): refused.
        assert!(matches!(w.accept(s - 1), Err(Replay::TooOld { .. })));
        assert!(matches!(w.accept(s - 2), Err(Replay::TooOld { .. })));
        // The second after: the first second's window is dropped, all of it refused.
        assert_eq!(w.accept(s + 2 * second), Ok(()));
        assert_eq!(w.accept(s + second + 1), Ok(()));
        for k in [0, 7, 100] {
            assert!(matches!(w.accept(s + k), Err(Replay::TooOld { .. })), "{k}");
        }
        // The same through a table (one sender's entry).
        let mut t = ReplayTable::new(4);
        t.accept(KeyId(1), 9, s + 3).unwrap();
        t.accept(KeyId(1), 9, s + second).unwrap();
        assert_eq!(t.accept(KeyId(1), 9, s + 2), Ok(()));
        assert_eq!(t.accept(KeyId(1), 9, s + 2), Err(Replay::Duplicate));
    }

    /// Random mixes within a second, into the next seconds, back into the second before
    /// and older: the windows decide exactly as the model that remembers everything.
    #[test]
    fn second_windows_agree_with_a_model_that_remembers_everything() {
        let second = 1u64 << SEQ_COUNT_BITS;
        for seed in 0..20 {
            let mut rng = Rng(0x5ec0 + seed);
            let mut w = SecondWindows::starting_above(0);
            let mut m = SecondsModel::default();
            let mut last = second;
            for step in 0..20_000 {
                let base = last & !(second - 1);
                let seq = match rng.below(12) {
                    0..=3 => last + 1 + rng.below(4),
                    4 => last.saturating_sub(rng.below(WINDOW_MSGS + 64)),
                    5 => last,
                    6 => base + second * (1 + rng.below(2)) + rng.below(8),
                    7..=8 => (base - second) + rng.below(WINDOW_BITS + 64),
                    9 => base.saturating_sub(2 * second) + rng.below(64),
                    10 => (base - second) + rng.below(second),
                    _ => last + rng.below(WINDOW_BITS * 3),
                };
                let got = w.accept(seq);
                assert_eq!(got, m.accept(seq), "seed {seed} step {step} seq {seq:#x}");
                if got.is_ok() {
                    last = last.max(seq);
                }
            }
        }
    }

    #[test]
    fn zero_is_refused() {
        assert_eq!(Window::new().accept(0), Err(Replay::Zero));
    }

    #[test]
    fn a_huge_jump_slides_the_whole_window() {
        let mut w = Window::new();
        for s in 1..=100 {
            w.accept(s).unwrap();
        }
        let far = 1u64 << 60;
        assert_eq!(w.accept(far), Ok(()));
        assert!(matches!(w.accept(100), Err(Replay::TooOld { .. })));
        assert_eq!(w.accept(far - 1), Ok(()));
        assert_eq!(w.accept(far - WINDOW_MSGS + 1), Ok(()));
        assert_eq!(w.accept(far), Err(Replay::Duplicate));
        // Bits of the old sequences' words were zeroed: far - 100 is new.
        assert_eq!(w.accept(far - 100), Ok(()));
    }

    #[test]
    fn a_wrapped_sequence_is_refused_and_the_sequencer_never_wraps() {
        let mut w = Window::new();
        w.accept(u64::MAX - 1).unwrap();
        w.accept(u64::MAX).unwrap();
        assert_eq!(w.accept(u64::MAX), Err(Replay::Duplicate));
        for s in [1, 2, 1000] {
            assert!(matches!(w.accept(s), Err(Replay::TooOld { .. })), "{s}");
        }
        let mut s = Sequencer { last: u64::MAX - 1 };
        assert_eq!(s.next(0), Some(u64::MAX));
        assert_eq!(s.next(0), None);
        assert_eq!(s.next(u64::MAX), None);
    }

    #[test]
    fn starting_above_a_floor_refuses_everything_up_to_it() {
        for floor in [0u64, 1, 62, 63, 64, 1000, 1023, 1024, 5000, 1 << 40] {
            let w = Window::starting_above(floor);
            for s in floor.saturating_sub(2 * WINDOW_BITS)..=floor {
                assert!(w.check(s).is_err(), "floor {floor} seq {s}");
            }
            // Everything above is new, in any order.
            let mut w2 = w.clone();
            for s in (floor + 1..=floor + 200).rev() {
                assert_eq!(w2.accept(s), Ok(()), "floor {floor} seq {s}");
            }
        }
    }

    #[test]
    fn the_sequencer_follows_the_clock_and_counts_within_a_second() {
        let mut s = Sequencer::new();
        let t = 1_800_000_000u64;
        assert_eq!(s.next(t), Some(t << 32));
        assert_eq!(s.next(t), Some((t << 32) + 1));
        // The clock stepping back does not move sequences back.
        assert_eq!(s.next(t - 10), Some((t << 32) + 2));
        assert_eq!(s.next(t + 1), Some((t + 1) << 32));
        // A restart a second later starts above everything sent.
        let mut restarted = Sequencer::new();
        assert!(restarted.next(t + 2).unwrap() > (t + 1) << 32);
        assert!(Sequencer::unix_s() > 1_700_000_000);
    }

    #[test]
    fn the_table_keeps_one_window_per_key_and_sender() {
        let mut t = ReplayTable::new(16);
        for key in 0..2 {
            for sender in 0..3 {
                assert_eq!(t.accept(KeyId(key), sender, 10), Ok(()));
            }
        }
        assert_eq!(t.len(), 6);
        assert_eq!(t.accept(KeyId(1), 2, 10), Err(Replay::Duplicate));
        assert_eq!(t.check(KeyId(1), 2, 11), Ok(()));
        assert_eq!(t.check(KeyId(1), 2, 10), Err(Replay::Duplicate));
        // A refused first message creates no entry.
        assert_eq!(t.accept(KeyId(5), 9, 0), Err(Replay::Zero));
        assert_eq!(t.len(), 6);
        t.forget_key(KeyId(0));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn eviction_takes_the_least_recent_sender_and_its_replays_stay_refused() {
        let cap = 8;
        let mut t = ReplayTable::new(cap);
        let key = KeyId(1);
        let other_key = KeyId(2);
        // Sender 0 sends 1..=5 first; the others keep sending after it.
        for s in 1..=5 {
            t.accept(key, 0, 100 + s).unwrap();
        }
        for sender in 1..cap as u64 {
            t.accept(key, sender, 1000 + sender).unwrap();
        }
        assert_eq!(t.len(), cap);
        // A ninth sender evicts sender 0 (least recently used).
        t.accept(key, 99, 5000).unwrap();
        assert_eq!((t.len(), t.evictions()), (cap, 1));
        // Sender 0's recorded messages replayed: refused by the floor (105).
        for s in 1..=5 {
            assert!(t.accept(key, 0, 100 + s).is_err(), "replay of {}", 100 + s);
        }
        // Sender 0 sending on with newer sequences is accepted again.
        assert_eq!(t.accept(key, 0, 106), Ok(()));
        // The floor is per key: a sender under another key starts from 1.
        assert_eq!(t.accept(other_key, 0, 1), Ok(()));
    }

    #[test]
    fn under_churn_no_sequence_is_ever_accepted_twice() {
        // Many senders through a small table; each sender's messages are replayed at
        // random later: every (key, sender, seq) must be accepted at most once.
        let mut rng = Rng(77);
        let mut t = ReplayTable::new(16);
        let mut sent: Vec<(KeyId, u64, u64)> = Vec::new();
        let mut accepted: HashSet<(KeyId, u64, u64)> = HashSet::new();
        let mut next_seq = [0u64; 64];
        for _ in 0..50_000 {
            let (key, sender, seq) = if !sent.is_empty() && rng.below(3) == 0 {
                sent[rng.below(sent.len() as u64) as usize]
            } else {
                let sender = rng.below(64);
                next_seq[sender as usize] += 1 + rng.below(3);
                let m = (
                    KeyId((sender % 3) as u32),
                    sender,
                    next_seq[sender as usize],
                );
                sent.push(m);
                m
            };
            if t.accept(key, sender, seq).is_ok() {
                assert!(
                    accepted.insert((key, sender, seq)),
                    "{key:?} {sender} {seq} twice"
                );
            }
        }
        assert!(t.evictions() > 0);
        assert!(t.len() <= 16);
    }

    #[test]
    fn floors_beyond_their_bound_merge_into_one() {
        let mut t = ReplayTable::new(1);
        // Every new key evicts the previous key's only sender.
        for k in 0..(FLOOR_KEYS_MAX as u32 + 5) {
            t.accept(KeyId(k), 1, 1000 + u64::from(k)).unwrap();
        }
        assert_eq!(t.floors.len(), FLOOR_KEYS_MAX);
        assert!(t.floor_all > 0);
        // A key evicted after the floors filled is still protected.
        let late = KeyId(FLOOR_KEYS_MAX as u32 + 1);
        assert!(t.check(late, 1, 1000 + u64::from(late.0)).is_err());
    }
}
