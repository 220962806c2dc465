//! The control words the protocol uses, and how each 64-bit word is encoded.
//!
//! Everything lives in the region's writable control area (words 32..64,
//! [`farside_region::layout::CONTROL_FIRST_WORD`]..`CONTROL_END_WORD`), so the rmem
//! servers (shm, tcp, udp, XDP) already permit the remote CAS / FETCH-ADD it needs.
//!
//! ```text
//! back-end node region                       balancer region
//! word 32  ROLE_SERVED  site|version (node)   word 48  SHARED_COUNTER  peers FETCH-ADD it
//! word 33  ROLE_EPOCH   +1 per applied role   word 49  HEARTBEAT       +1 every S (local)
//! word 34  ROLE_WANTED  site|version (CAS)
//! word 35  ROLE_ERROR   wanted value whose apply failed (0: none)
//! word 40  SITE_LOCK    owner|token|beat|intent, only on a site's anchor node
//! ```
//!
//! Role words are `site << 48 | version`: the version (48 bits) changes with every
//! write, so a CAS that expects an older value can never succeed again (no ABA).
//! Site numbers are 0-based; `SITE_MAX` sites fit.

use farside_region::layout;

/// A balancer's heartbeat, in its own region.
pub use layout::W_BALANCER_HEARTBEAT;
/// Bumped by the node's agent each time it serves a new site.
pub use layout::W_ROLE_EPOCH;
/// The `ROLE_WANTED` value the agent failed to apply (0: none).
pub use layout::W_ROLE_ERROR;
/// Role the node serves now (site|version), written only by the node's agent.
pub use layout::W_ROLE_SERVED;
/// Role balancers want the node to serve (remote CAS or FETCH-ADD 1 only).
pub use layout::W_ROLE_WANTED;
/// A balancer's shared update counter, in its own region.
pub use layout::W_SHARED_COUNTER;
/// A site's lock word, on the site's anchor node.
pub use layout::W_SITE_LOCK;
/// First word a balancer reads per node in one READ (served, epoch, wanted, error).
pub const NODE_READ_FIRST: usize = W_ROLE_SERVED;
/// Words in that READ.
pub const NODE_READ_WORDS: usize = W_ROLE_ERROR - W_ROLE_SERVED + 1;

const _: () = {
    assert!(W_ROLE_ERROR >= layout::CONTROL_FIRST_WORD && W_ROLE_ERROR < layout::W_LOCK_BASE);
    assert!(W_ROLE_SERVED + 1 == W_ROLE_EPOCH && W_ROLE_EPOCH + 1 == W_ROLE_WANTED);
    assert!(W_ROLE_WANTED + 1 == W_ROLE_ERROR);
    assert!(W_BALANCER_HEARTBEAT < layout::CONTROL_END_WORD);
};

/// Bits of the version in a role word.
const ROLE_VERSION_BITS: u32 = 48;
const ROLE_VERSION_MASK: u64 = (1 << ROLE_VERSION_BITS) - 1;
/// Sites a role word can name (16 bits).
pub const SITE_MAX: usize = 1 << 16;

/// A role word: the site (high 16 bits) and a version (low 48 bits). FETCH-ADD of 1
/// bumps the version and keeps the site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Role(pub u64);

impl Role {
    /// Encode `site` with `version` (truncated to 48 bits).
    pub fn new(site: u16, version: u64) -> Role {
        Role((site as u64) << ROLE_VERSION_BITS | (version & ROLE_VERSION_MASK))
    }
    /// The site this role names.
    pub fn site(self) -> u16 {
        (self.0 >> ROLE_VERSION_BITS) as u16
    }
    /// The version.
    pub fn version(self) -> u64 {
        self.0 & ROLE_VERSION_MASK
    }
    /// The same site one version later: what a move from this value writes, with `site`.
    pub fn moved_to(self, site: u16) -> Role {
        Role::new(site, self.version() + 1)
    }
}

// Lock word fields, low to high. Owner 0 means free. The fencing token grows by one
// with every acquisition (free keeps the last token, so a late duplicate of an old
// acquire CAS can never match again). The beat changes with every CAS its holder makes.
const OWNER_BITS: u32 = 12;
const TOKEN_BITS: u32 = 20;
const BEAT_BITS: u32 = 12;
const INTENT_BITS: u32 = 20;
const TOKEN_SHIFT: u32 = OWNER_BITS;
const BEAT_SHIFT: u32 = TOKEN_SHIFT + TOKEN_BITS;
const INTENT_SHIFT: u32 = BEAT_SHIFT + BEAT_BITS;
const _: () = assert!(INTENT_SHIFT + INTENT_BITS == 64);
/// Balancers the lock word can name (owner 0 is "free"); 12 bits.
pub const BALANCER_MAX: usize = (1 << OWNER_BITS) - 1;
/// Nodes the lock word's intent can name (intent 0 is "none"); 20 bits.
pub const NODE_MAX: usize = (1 << INTENT_BITS) - 1;
/// Tokens wrap at 2^20: a stale CAS would have to stay in flight across a million
/// acquisitions of one site's lock to match again.
const TOKEN_MASK: u64 = (1 << TOKEN_BITS) - 1;
const BEAT_MASK: u64 = (1 << BEAT_BITS) - 1;

/// A decoded site lock word.
///
/// `owner`: 0 free, else balancer id + 1. `token`: fencing token of the current (or
/// last) holder. `beat`: advanced by the holder with every CAS it makes on the word
/// (contenders measure the lease as "the word did not change for `lease` by my own
/// clock"). `intent`: 0 none, else node index + 1 that the holder announced it is about
/// to move; a contender that takes the lock over fences that node first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lock {
    /// 0: free; else balancer id + 1.
    pub owner: u16,
    /// Fencing token (20 bits, wrapping).
    pub token: u32,
    /// Heartbeat (12 bits, wrapping).
    pub beat: u16,
    /// 0: none; else node index + 1.
    pub intent: u32,
}

impl Lock {
    /// Decode a lock word.
    pub fn decode(w: u64) -> Lock {
        Lock {
            owner: (w & ((1 << OWNER_BITS) - 1)) as u16,
            token: ((w >> TOKEN_SHIFT) & TOKEN_MASK) as u32,
            beat: ((w >> BEAT_SHIFT) & BEAT_MASK) as u16,
            intent: (w >> INTENT_SHIFT) as u32,
        }
    }
    /// Encode (fields are truncated to their widths).
    pub fn encode(self) -> u64 {
        (self.owner as u64 & ((1 << OWNER_BITS) - 1))
            | (self.token as u64 & TOKEN_MASK) << TOKEN_SHIFT
            | (self.beat as u64 & BEAT_MASK) << BEAT_SHIFT
            | (self.intent as u64) << INTENT_SHIFT
    }
    /// Is nobody holding it?
    pub fn is_free(self) -> bool {
        self.owner == 0
    }
    /// The balancer holding it, if any.
    pub fn holder(self) -> Option<u32> {
        (self.owner != 0).then(|| self.owner as u32 - 1)
    }
    /// The node the holder announced, if any.
    pub fn intent_node(self) -> Option<u32> {
        (self.intent != 0).then(|| self.intent - 1)
    }
    /// The word `balancer` writes to acquire this lock (from free, or taking over an
    /// expired holder): next token, beat 0, the announced intent kept so it is fenced.
    pub fn acquired_by(self, balancer: u32) -> Lock {
        Lock {
            owner: (balancer + 1) as u16,
            token: (self.token + 1) & TOKEN_MASK as u32,
            beat: 0,
            intent: self.intent,
        }
    }
    /// The holder's next word announcing `node` (or none): one more beat.
    pub fn with_intent(self, node: Option<u32>) -> Lock {
        Lock {
            beat: (self.beat + 1) & BEAT_MASK as u16,
            intent: node.map_or(0, |n| n + 1),
            ..self
        }
    }
    /// The word a holder writes to release: free, token kept, no intent.
    pub fn released(self) -> Lock {
        Lock {
            owner: 0,
            token: self.token,
            beat: 0,
            intent: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_round_trips_and_fadd_bumps_version_only() {
        let r = Role::new(7, 41);
        assert_eq!((r.site(), r.version()), (7, 41));
        let bumped = Role(r.0.wrapping_add(1));
        assert_eq!((bumped.site(), bumped.version()), (7, 42));
        assert_eq!(r.moved_to(3), Role::new(3, 42));
    }

    #[test]
    fn lock_round_trips_and_every_transition_changes_the_word() {
        let free = Lock::decode(0);
        assert!(free.is_free());
        let held = free.acquired_by(4094);
        assert_eq!(Lock::decode(held.encode()), held);
        assert_eq!(held.holder(), Some(4094));
        assert_eq!(held.token, 1);
        let announced = held.with_intent(Some(NODE_MAX as u32 - 1));
        assert_eq!(Lock::decode(announced.encode()), announced);
        assert_eq!(announced.intent_node(), Some(NODE_MAX as u32 - 1));
        let rel = announced.released();
        assert!(rel.is_free() && rel.token == 1);
        // A late duplicate of the first acquire (expect 0) cannot match the released word.
        assert_ne!(rel.encode(), 0);
        let taken = announced.acquired_by(2);
        assert_eq!(taken.intent_node(), announced.intent_node());
        assert_eq!(taken.token, 2);
    }
}
