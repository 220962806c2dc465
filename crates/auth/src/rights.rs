//! What a key may do to a region: per-region, per-operation rights on named word
//! ranges, as an RDMA rkey is scoped to one memory region and its access flags.
//!
//! A key's [`Rights`] name one region and a few [`Grant`]s, each a set of operations
//! (READ, WRITE, COMPARE-AND-SWAP, FETCH-ADD) on one [`Words`] range of
//! `farside_region::layout`, FETCH-ADD optionally limited in its delta. [`check`] is
//! the whole decision for one remote operation, pure, with a typed [`Refusal`]:
//!
//! ```text
//!   region named by the key?         no ─► WrongRegion
//!   len: > 0, atomics exactly 8?     no ─► BadLength
//!   offset, len multiples of 8?      no ─► Unaligned
//!   within the region?               no ─► OutOfBounds
//!   mutation of an agent-owned word? yes ─► AgentOwned
//!   one grant covers op and words?   no ─► NotGranted
//!   FETCH-ADD delta within its limit? no ─► DeltaTooLarge
//! ```
//!
//! Why it is safe:
//! - **Agent-owned words are never remotely writable.** The header, the load record
//!   (with its padding) and the role words the node's own agent writes
//!   (`W_ROLE_SERVED`, `W_ROLE_EPOCH`, `W_ROLE_ERROR`) are [`AGENT_OWNED`]: no
//!   [`Rights`] granting WRITE, CAS or FETCH-ADD on them can be built ([`Rights::new`]
//!   refuses it), and [`check`] refuses such a mutation before looking at grants. So
//!   no key, however configured, can forge a node's load or its served role.
//! - **Least privilege for balancers.** [`Rights::balancer`] may READ the region,
//!   COMPARE-AND-SWAP `W_ROLE_WANTED` (a move) and the lock words, and FETCH-ADD
//!   `W_ROLE_WANTED` (a fence) and the counter words, each by at most 1: a FETCH-ADD
//!   with a large delta would change a role word's site bits, i.e. move a node without
//!   the CAS that makes moves exclusive (`farside_reconf::balancer`).
//! - **A whole access in one grant.** An operation must lie inside a single grant's
//!   range: rights cannot be combined across grants into an access none of them allows.
//! - **No arithmetic overflow.** Offsets and lengths are checked in u64 from the wire's
//!   u32 fields.
//!
//! **Chunked regions** (an object arena: `farside_arena`, region 1) are checked by
//! [`check_chunks`] instead: READ needs a READ grant (readers see the whole arena),
//! WRITE needs a *chunk grant* ([`Rights::chunk_writer`]: WRITE on chunks
//! `first..end`, built for nothing else and never opening region words), and one WRITE
//! lies inside one chunk of that range; COMPARE-AND-SWAP and FETCH-ADD are never granted
//! there. This is how a peer may WRITE only its own slot of another node's arena.
//!
//! Servers map refusals to their wire status (rmem: `NoRegion`, `BadLength`,
//! `Unaligned`, `OutOfBounds`, `Protected` for the rest). The servers of today also
//! confine every mutation to the control words; rights are narrower inside them.

use farside_region::layout;
use std::fmt;

/// A remote operation on region words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
    CompareSwap,
    FetchAdd,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Read, Op::Write, Op::CompareSwap, Op::FetchAdd];

    const fn bit(self) -> u8 {
        match self {
            Op::Read => 1,
            Op::Write => 2,
            Op::CompareSwap => 4,
            Op::FetchAdd => 8,
        }
    }

    pub fn is_mutation(self) -> bool {
        self != Op::Read
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::CompareSwap => "compare_swap",
            Op::FetchAdd => "fetch_add",
        }
    }
}

/// A set of [`Op`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpSet(u8);

impl OpSet {
    pub const NONE: OpSet = OpSet(0);
    pub const READ: OpSet = OpSet(Op::Read.bit());
    pub const CAS: OpSet = OpSet(Op::CompareSwap.bit());
    pub const FADD: OpSet = OpSet(Op::FetchAdd.bit());
    pub const WRITE: OpSet = OpSet(Op::Write.bit());
    /// WRITE, CAS and FETCH-ADD.
    pub const MUTATIONS: OpSet =
        OpSet(Op::Write.bit() | Op::CompareSwap.bit() | Op::FetchAdd.bit());

    pub const fn union(self, other: OpSet) -> OpSet {
        OpSet(self.0 | other.0)
    }

    pub const fn contains(self, op: Op) -> bool {
        self.0 & op.bit() != 0
    }

    pub const fn has_mutation(self) -> bool {
        self.0 & OpSet::MUTATIONS.0 != 0
    }
}

/// A named range of region words, `first..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Words {
    pub name: &'static str,
    pub first: usize,
    pub end: usize,
}

impl Words {
    const fn one(name: &'static str, word: usize) -> Words {
        Words {
            name,
            first: word,
            end: word + 1,
        }
    }

    pub const fn overlaps(&self, first: usize, end: usize) -> bool {
        self.first < end && first < self.end
    }

    pub const fn covers(&self, first: usize, end: usize) -> bool {
        self.first <= first && end <= self.end
    }
}

/// The region's named ranges (offsets from `farside_region::layout`).
pub mod words {
    use super::{layout, Words};

    /// Magic, version, node id, generation...: written once by the gatherer.
    pub const HEADER: Words = Words {
        name: "header",
        first: 0,
        end: layout::HEADER_WORDS,
    };
    /// The seqlock load record and its padding up to the control area.
    pub const LOAD_RECORD: Words = Words {
        name: "load_record",
        first: layout::RECORD_FIRST_WORD,
        end: layout::CONTROL_FIRST_WORD,
    };
    pub const ROLE_SERVED: Words = Words::one("role_served", layout::W_ROLE_SERVED);
    pub const ROLE_EPOCH: Words = Words::one("role_epoch", layout::W_ROLE_EPOCH);
    pub const ROLE_WANTED: Words = Words::one("role_wanted", layout::W_ROLE_WANTED);
    pub const ROLE_ERROR: Words = Words::one("role_error", layout::W_ROLE_ERROR);
    /// Site lock words.
    pub const LOCKS: Words = Words {
        name: "locks",
        first: layout::W_LOCK_BASE,
        end: layout::W_LOCK_BASE + layout::LOCK_WORDS,
    };
    /// Counter words (a balancer's shared update counter and heartbeat first).
    pub const COUNTERS: Words = Words {
        name: "counters",
        first: layout::W_COUNTER_BASE,
        end: layout::W_COUNTER_BASE + layout::COUNTER_WORDS,
    };
    /// The whole control area (role, lock and counter words).
    pub const CONTROL: Words = Words {
        name: "control",
        first: layout::CONTROL_FIRST_WORD,
        end: layout::CONTROL_END_WORD,
    };
    /// Application data (probe payloads, cache directory).
    pub const SCRATCH: Words = Words {
        name: "scratch",
        first: layout::SCRATCH_FIRST_WORD,
        end: layout::REGION_WORDS,
    };
    /// Every word.
    pub const REGION: Words = Words {
        name: "region",
        first: 0,
        end: layout::REGION_WORDS,
    };
}

/// Words only the node's own agent (gatherd) writes: never remotely writable.
pub const AGENT_OWNED: [Words; 5] = [
    words::HEADER,
    words::LOAD_RECORD,
    words::ROLE_SERVED,
    words::ROLE_EPOCH,
    words::ROLE_ERROR,
];

/// Most grants per key: a few named ranges is all a role needs.
pub const GRANTS_MAX: usize = 16;

/// Largest `end` of a chunk grant ([`Rights::chunk_writer`]): the XDP program keeps a
/// grant's range in two u16 fields (`struct rmem_grant`), so a chunk grant ends at chunk
/// 65,535 at most (an arena has 65,536 chunks: its last chunk is never remotely
/// writable, which no layout needs).
pub const CHUNK_GRANT_END_MAX: usize = u16::MAX as usize;

/// Operations `ops` on `words`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub ops: OpSet,
    pub words: Words,
    /// Largest FETCH-ADD delta allowed (as unsigned: a "negative" delta is huge);
    /// `u64::MAX`: any.
    pub fadd_delta_max: u64,
}

impl Grant {
    pub const fn new(ops: OpSet, words: Words) -> Grant {
        Grant {
            ops,
            words,
            fadd_delta_max: u64::MAX,
        }
    }

    pub const fn fadd_at_most(self, delta_max: u64) -> Grant {
        Grant {
            fadd_delta_max: delta_max,
            ..self
        }
    }
}

/// A grant [`Rights::new`] refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantError {
    /// A mutation on words the node's agent owns.
    AgentOwned { grant: Words, owned: Words },
    /// An empty range, or one beyond the region.
    BadRange(Words),
    /// More than [`GRANTS_MAX`].
    TooMany { grants: usize },
    /// A chunk grant on region 0 (the control region has words, not chunks), or an
    /// empty one, or one ending beyond [`CHUNK_GRANT_END_MAX`].
    BadChunks {
        region: u32,
        first: usize,
        end: usize,
    },
}

impl fmt::Display for GrantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GrantError::AgentOwned { grant, owned } => write!(
                f,
                "grant on {} ({}..{}) would let a remote key change {}, which only the node's agent writes",
                grant.name, grant.first, grant.end, owned.name
            ),
            GrantError::BadRange(w) => write!(
                f,
                "grant on {} ({}..{}): empty or beyond the region's {} words",
                w.name,
                w.first,
                w.end,
                layout::REGION_WORDS
            ),
            GrantError::TooMany { grants } => {
                write!(f, "{grants} grants, at most {GRANTS_MAX}")
            }
            GrantError::BadChunks { region, first, end } => write!(
                f,
                "chunk grant {first}..{end} on region {region}: needs a chunked region (not 0), \
                 a non-empty range ending at most at chunk {CHUNK_GRANT_END_MAX}"
            ),
        }
    }
}

impl std::error::Error for GrantError {}

/// What one key may do, on one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rights {
    region: u32,
    grants: Vec<Grant>,
    /// The grants name chunks of a chunked region ([`Rights::chunk_writer`]), not words:
    /// [`check`] grants nothing under them, [`check_chunks`] only WRITEs.
    chunks: bool,
}

impl Rights {
    /// Rights on region `region`; refuses mutations of agent-owned words.
    pub fn new(region: u32, grants: &[Grant]) -> Result<Rights, GrantError> {
        if grants.len() > GRANTS_MAX {
            return Err(GrantError::TooMany {
                grants: grants.len(),
            });
        }
        for g in grants {
            if g.words.first >= g.words.end || g.words.end > layout::REGION_WORDS {
                return Err(GrantError::BadRange(g.words));
            }
            if g.ops.has_mutation() {
                if let Some(owned) = AGENT_OWNED
                    .iter()
                    .find(|o| o.overlaps(g.words.first, g.words.end))
                {
                    return Err(GrantError::AgentOwned {
                        grant: g.words,
                        owned: *owned,
                    });
                }
            }
        }
        Ok(Rights {
            region,
            grants: grants.to_vec(),
            chunks: false,
        })
    }

    /// WRITE (only) of chunks `first..end` of chunked region `region` (an object arena):
    /// a peer's key that may write its own slot of a node's arena and nothing else
    /// (no READ, no atomics, no region word). Refuses region 0, an empty range and one
    /// ending beyond [`CHUNK_GRANT_END_MAX`].
    pub fn chunk_writer(region: u32, first: usize, end: usize) -> Result<Rights, GrantError> {
        if region == 0 || first >= end || end > CHUNK_GRANT_END_MAX {
            return Err(GrantError::BadChunks { region, first, end });
        }
        Ok(Rights {
            region,
            grants: vec![Grant::new(
                OpSet::WRITE,
                Words {
                    name: "chunks",
                    first,
                    end,
                },
            )],
            chunks: true,
        })
    }

    /// True for [`Rights::chunk_writer`]'s rights (grants on chunks, not words).
    pub fn is_chunked(&self) -> bool {
        self.chunks
    }

    /// READ of the whole region: proxies' monitors and other readers.
    pub fn reader(region: u32) -> Rights {
        Rights::new(region, &[Grant::new(OpSet::READ, words::REGION)]).expect("valid")
    }

    /// A balancer (`farside_reconf::balancer`): READ everything; COMPARE-AND-SWAP the
    /// wanted role (a move) and the lock words; FETCH-ADD of at most 1 on the wanted
    /// role (a fence) and the counter words (peers' shared update counters).
    pub fn balancer(region: u32) -> Rights {
        Rights::new(
            region,
            &[
                Grant::new(OpSet::READ, words::REGION),
                Grant::new(OpSet::CAS.union(OpSet::FADD), words::ROLE_WANTED).fadd_at_most(1),
                Grant::new(OpSet::CAS, words::LOCKS),
                Grant::new(OpSet::FADD, words::COUNTERS).fadd_at_most(1),
            ],
        )
        .expect("valid")
    }

    pub fn region(&self) -> u32 {
        self.region
    }

    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    /// Bit `w` set: a one-word `op` on word `w` (< 64) is granted, whatever its
    /// FETCH-ADD delta limit. The form a BPF program checks with one AND.
    pub fn control_mask(&self, op: Op) -> u64 {
        (0..64)
            .filter(|&w| {
                let access = match op {
                    Op::Read => Access::Read,
                    Op::Write => Access::Write,
                    Op::CompareSwap => Access::CompareSwap,
                    Op::FetchAdd => Access::FetchAdd { delta: 0 },
                };
                check(self, self.region, access, w * 8, 8).is_ok()
            })
            .fold(0, |m, w| m | 1 << w)
    }
}

/// One remote operation, with the operand rights may limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    CompareSwap,
    FetchAdd { delta: u64 },
}

impl Access {
    pub fn op(self) -> Op {
        match self {
            Access::Read => Op::Read,
            Access::Write => Op::Write,
            Access::CompareSwap => Op::CompareSwap,
            Access::FetchAdd { .. } => Op::FetchAdd,
        }
    }
}

/// Why [`check`] refused an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The key's rights are on another region.
    WrongRegion { granted: u32, asked: u32 },
    /// Zero, or not 8 for an atomic.
    BadLength { len: u64 },
    /// Offset or length not a multiple of 8.
    Unaligned { offset: u64, len: u64 },
    /// Beyond the region.
    OutOfBounds { offset: u64, len: u64 },
    /// A mutation touching this agent-owned word.
    AgentOwned { word: usize, words: &'static str },
    /// No single grant covers this op on these words.
    NotGranted {
        op: Op,
        first_word: usize,
        end_word: usize,
    },
    /// FETCH-ADD delta over the grant's limit.
    DeltaTooLarge { delta: u64, max: u64 },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::WrongRegion { granted, asked } => {
                write!(f, "region {asked}: the key grants region {granted} only")
            }
            Refusal::BadLength { len } => write!(f, "length {len}"),
            Refusal::Unaligned { offset, len } => {
                write!(f, "offset {offset} length {len}: not multiples of 8")
            }
            Refusal::OutOfBounds { offset, len } => write!(
                f,
                "offset {offset} length {len}: beyond the region's {} bytes",
                layout::REGION_BYTES
            ),
            Refusal::AgentOwned { word, words } => {
                write!(
                    f,
                    "word {word} ({words}) is written by the node's agent only"
                )
            }
            Refusal::NotGranted {
                op,
                first_word,
                end_word,
            } => write!(
                f,
                "{} on words {first_word}..{end_word} is not granted to this key",
                op.name()
            ),
            Refusal::DeltaTooLarge { delta, max } => {
                write!(f, "fetch_add delta {delta} over the granted {max}")
            }
        }
    }
}

impl std::error::Error for Refusal {}

/// May a key with `rights` do `access` on `len` bytes at byte `offset` of region
/// `region`? The order of the checks is the module doc's.
pub fn check(
    rights: &Rights,
    region: u32,
    access: Access,
    offset: u64,
    len: u64,
) -> Result<(), Refusal> {
    let op = access.op();
    if region != rights.region {
        return Err(Refusal::WrongRegion {
            granted: rights.region,
            asked: region,
        });
    }
    if len == 0 || (matches!(op, Op::CompareSwap | Op::FetchAdd) && len != 8) {
        return Err(Refusal::BadLength { len });
    }
    if (offset | len) % 8 != 0 {
        return Err(Refusal::Unaligned { offset, len });
    }
    // Both from u32 fields in practice; checked_add keeps any u64 input honest.
    match offset.checked_add(len) {
        Some(end) if end <= layout::REGION_BYTES as u64 => {}
        _ => return Err(Refusal::OutOfBounds { offset, len }),
    }
    let (first, end) = ((offset / 8) as usize, ((offset + len) / 8) as usize);
    if op.is_mutation() {
        if let Some(owned) = AGENT_OWNED.iter().find(|o| o.overlaps(first, end)) {
            return Err(Refusal::AgentOwned {
                word: first.max(owned.first),
                words: owned.name,
            });
        }
    }
    let Some(grant) = rights
        .grants
        .iter()
        .filter(|_| !rights.chunks)
        .find(|g| g.ops.contains(op) && g.words.covers(first, end))
    else {
        return Err(Refusal::NotGranted {
            op,
            first_word: first,
            end_word: end,
        });
    };
    if let Access::FetchAdd { delta } = access {
        if delta > grant.fadd_delta_max {
            return Err(Refusal::DeltaTooLarge {
                delta,
                max: grant.fadd_delta_max,
            });
        }
    }
    Ok(())
}

/// May a key with `rights` do `access` on `len` bytes at byte `offset` of chunked
/// region `region` (chunks of `chunk_bytes`, at most `chunks_max` of them)? The XDP
/// program's arena rule, in its order:
///
/// ```text
///   region named by the key?                  no ─► WrongRegion
///   READ or WRITE?                            no ─► NotGranted (no atomics on chunks)
///   len > 0?                                  no ─► BadLength
///   offset, len multiples of 8?               no ─► Unaligned
///   chunk below chunks_max, access inside it? no ─► OutOfBounds
///   READ: a READ grant (word rights)          no ─► NotGranted
///   WRITE: a chunk grant covering the chunk   no ─► NotGranted
/// ```
pub fn check_chunks(
    rights: &Rights,
    region: u32,
    access: Access,
    offset: u64,
    len: u64,
    chunk_bytes: u64,
    chunks_max: u64,
) -> Result<(), Refusal> {
    let op = access.op();
    let words = || {
        (
            (offset / 8) as usize,
            (offset.saturating_add(len) / 8) as usize,
        )
    };
    if region != rights.region {
        return Err(Refusal::WrongRegion {
            granted: rights.region,
            asked: region,
        });
    }
    let not_granted = || {
        let (first_word, end_word) = words();
        Refusal::NotGranted {
            op,
            first_word,
            end_word,
        }
    };
    if !matches!(op, Op::Read | Op::Write) {
        return Err(not_granted());
    }
    if len == 0 {
        return Err(Refusal::BadLength { len });
    }
    if (offset | len) % 8 != 0 {
        return Err(Refusal::Unaligned { offset, len });
    }
    let chunk = offset / chunk_bytes;
    if chunk >= chunks_max || offset % chunk_bytes + len > chunk_bytes {
        return Err(Refusal::OutOfBounds { offset, len });
    }
    let granted = match op {
        // A reader's grant: READ covering word 0 (the XDP program's test).
        Op::Read => {
            !rights.chunks
                && rights
                    .grants
                    .iter()
                    .any(|g| g.ops.contains(Op::Read) && g.words.covers(0, 1))
        }
        _ => {
            let c = chunk as usize;
            rights.chunks
                && rights
                    .grants
                    .iter()
                    .any(|g| g.ops.contains(Op::Write) && g.words.covers(c, c + 1))
        }
    };
    if granted {
        Ok(())
    } else {
        Err(not_granted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::siphash::tests::Rng;
    use layout::*;

    fn w(word: usize) -> u64 {
        (word * 8) as u64
    }

    #[test]
    fn a_reader_reads_anything_and_changes_nothing() {
        let r = Rights::reader(0);
        assert_eq!(check(&r, 0, Access::Read, 0, REGION_BYTES as u64), Ok(()));
        assert_eq!(check(&r, 0, Access::Read, w(W_SEQ_HEAD), 136), Ok(()));
        for word in CONTROL_FIRST_WORD..REGION_WORDS {
            for a in [
                Access::Write,
                Access::CompareSwap,
                Access::FetchAdd { delta: 1 },
            ] {
                assert!(check(&r, 0, a, w(word), 8).is_err(), "{a:?} on {word}");
            }
        }
    }

    #[test]
    fn a_balancer_may_cas_role_wanted_and_locks_and_fadd_role_wanted_and_counters_by_one() {
        let b = Rights::balancer(0);
        let cas = Access::CompareSwap;
        let fadd1 = Access::FetchAdd { delta: 1 };
        assert_eq!(check(&b, 0, cas, w(W_ROLE_WANTED), 8), Ok(()));
        assert_eq!(check(&b, 0, fadd1, w(W_ROLE_WANTED), 8), Ok(()));
        assert_eq!(check(&b, 0, cas, w(W_SITE_LOCK), 8), Ok(()));
        assert_eq!(
            check(&b, 0, cas, w(W_LOCK_BASE + LOCK_WORDS - 1), 8),
            Ok(())
        );
        assert_eq!(check(&b, 0, fadd1, w(W_SHARED_COUNTER), 8), Ok(()));
        assert_eq!(check(&b, 0, fadd1, w(W_BALANCER_HEARTBEAT), 8), Ok(()));
        // Not: WRITE anywhere, CAS on counters, FETCH-ADD on locks.
        assert!(matches!(
            check(&b, 0, Access::Write, w(W_ROLE_WANTED), 8),
            Err(Refusal::NotGranted { .. })
        ));
        assert!(matches!(
            check(&b, 0, cas, w(W_SHARED_COUNTER), 8),
            Err(Refusal::NotGranted { .. })
        ));
        assert!(matches!(
            check(&b, 0, fadd1, w(W_SITE_LOCK), 8),
            Err(Refusal::NotGranted { .. })
        ));
        // A FETCH-ADD that would rewrite the role's site bits, or subtract.
        for delta in [2, 1 << 48, u64::MAX] {
            assert_eq!(
                check(&b, 0, Access::FetchAdd { delta }, w(W_ROLE_WANTED), 8),
                Err(Refusal::DeltaTooLarge { delta, max: 1 })
            );
        }
        assert_eq!(
            b.control_mask(Op::CompareSwap),
            (1 << W_ROLE_WANTED) | (0xff << W_LOCK_BASE)
        );
        assert_eq!(
            b.control_mask(Op::FetchAdd),
            (1 << W_ROLE_WANTED) | (0xffff << W_COUNTER_BASE)
        );
        assert_eq!(b.control_mask(Op::Write), 0);
        assert_eq!(b.control_mask(Op::Read), u64::MAX);
    }

    #[test]
    fn agent_owned_words_are_never_remotely_writable_whatever_the_grants() {
        // No rights granting a mutation on them can be built...
        for owned in AGENT_OWNED {
            for ops in [OpSet::WRITE, OpSet::CAS, OpSet::FADD, OpSet::MUTATIONS] {
                assert!(matches!(
                    Rights::new(0, &[Grant::new(ops, owned)]),
                    Err(GrantError::AgentOwned { .. })
                ));
            }
        }
        assert!(matches!(
            Rights::new(0, &[Grant::new(OpSet::WRITE, words::REGION)]),
            Err(GrantError::AgentOwned { .. })
        ));
        assert!(matches!(
            Rights::new(0, &[Grant::new(OpSet::CAS, words::CONTROL)]),
            Err(GrantError::AgentOwned { .. })
        ));
        // ...and the widest rights that can be built still refuse them.
        let widest = Rights::new(
            0,
            &[
                Grant::new(OpSet::READ, words::REGION),
                Grant::new(OpSet::MUTATIONS, words::ROLE_WANTED),
                Grant::new(
                    OpSet::MUTATIONS,
                    Words {
                        name: "rest",
                        first: W_ROLE_ERROR + 1,
                        end: REGION_WORDS,
                    },
                ),
            ],
        )
        .unwrap();
        for word in 0..REGION_WORDS {
            let owned = AGENT_OWNED.iter().any(|o| o.covers(word, word + 1));
            for a in [
                Access::Write,
                Access::CompareSwap,
                Access::FetchAdd { delta: 1 },
            ] {
                let r = check(&widest, 0, a, w(word), 8);
                assert_eq!(
                    matches!(r, Err(Refusal::AgentOwned { .. })),
                    owned,
                    "{a:?} on word {word}: {r:?}"
                );
                assert_eq!(r.is_ok(), !owned, "{a:?} on word {word}");
            }
        }
        // A WRITE spanning into an owned word from a granted one.
        assert_eq!(
            check(&widest, 0, Access::Write, w(W_ROLE_WANTED), 16),
            Err(Refusal::AgentOwned {
                word: W_ROLE_ERROR,
                words: "role_error"
            })
        );
    }

    #[test]
    fn malformed_accesses_are_refused_before_rights() {
        let b = Rights::balancer(0);
        let cas = Access::CompareSwap;
        assert_eq!(
            check(&b, 1, cas, w(W_ROLE_WANTED), 8),
            Err(Refusal::WrongRegion {
                granted: 0,
                asked: 1
            })
        );
        assert_eq!(
            check(&b, 0, Access::Read, 0, 0),
            Err(Refusal::BadLength { len: 0 })
        );
        assert_eq!(
            check(&b, 0, cas, w(W_ROLE_WANTED), 16),
            Err(Refusal::BadLength { len: 16 })
        );
        assert_eq!(
            check(&b, 0, cas, w(W_ROLE_WANTED) + 4, 8),
            Err(Refusal::Unaligned {
                offset: w(W_ROLE_WANTED) + 4,
                len: 8
            })
        );
        assert_eq!(
            check(&b, 0, Access::Read, REGION_BYTES as u64, 8),
            Err(Refusal::OutOfBounds {
                offset: REGION_BYTES as u64,
                len: 8
            })
        );
        assert_eq!(
            check(&b, 0, Access::Read, u64::MAX - 7, 8),
            Err(Refusal::OutOfBounds {
                offset: u64::MAX - 7,
                len: 8
            })
        );
    }

    #[test]
    fn an_access_must_fit_in_one_grant() {
        let split = Rights::new(
            0,
            &[
                Grant::new(OpSet::READ, words::HEADER),
                Grant::new(OpSet::READ, words::LOAD_RECORD),
            ],
        )
        .unwrap();
        assert_eq!(check(&split, 0, Access::Read, 0, 64), Ok(()));
        assert_eq!(check(&split, 0, Access::Read, 64, 64), Ok(()));
        assert!(matches!(
            check(&split, 0, Access::Read, 0, 128),
            Err(Refusal::NotGranted { .. })
        ));
    }

    #[test]
    fn bad_or_too_many_grants_are_refused() {
        let empty = Words {
            name: "empty",
            first: 70,
            end: 70,
        };
        let beyond = Words {
            name: "beyond",
            first: 500,
            end: 513,
        };
        assert_eq!(
            Rights::new(0, &[Grant::new(OpSet::READ, empty)]),
            Err(GrantError::BadRange(empty))
        );
        assert_eq!(
            Rights::new(0, &[Grant::new(OpSet::READ, beyond)]),
            Err(GrantError::BadRange(beyond))
        );
        let many = vec![Grant::new(OpSet::READ, words::SCRATCH); GRANTS_MAX + 1];
        assert_eq!(
            Rights::new(0, &many),
            Err(GrantError::TooMany {
                grants: GRANTS_MAX + 1
            })
        );
    }

    /// Random accesses: never a panic, and every accepted mutation lies inside one
    /// grant with that op and outside every agent-owned word.
    #[test]
    fn random_accesses_accepted_only_inside_a_grant() {
        let mut rng = Rng(0x417e);
        let rights = [Rights::reader(0), Rights::balancer(0)];
        for _ in 0..200_000 {
            let r = &rights[rng.below(2) as usize];
            let access = match rng.below(4) {
                0 => Access::Read,
                1 => Access::Write,
                2 => Access::CompareSwap,
                _ => Access::FetchAdd {
                    delta: rng.below(3),
                },
            };
            let offset = match rng.below(3) {
                0 => rng.next(),
                _ => rng.below(REGION_BYTES as u64 + 64),
            };
            let len = match rng.below(3) {
                0 => 8,
                1 => rng.below(REGION_BYTES as u64 + 16),
                _ => rng.next(),
            };
            if check(r, 0, access, offset, len).is_ok() {
                let (first, end) = ((offset / 8) as usize, ((offset + len) / 8) as usize);
                assert!(end <= REGION_WORDS && first < end);
                if access.op().is_mutation() {
                    assert!(AGENT_OWNED.iter().all(|o| !o.overlaps(first, end)));
                }
                assert!(r
                    .grants()
                    .iter()
                    .any(|g| g.ops.contains(access.op()) && g.words.covers(first, end)));
            }
        }
    }

    #[test]
    fn named_ranges_follow_the_layout() {
        assert_eq!(words::LOAD_RECORD.first, W_SEQ_HEAD);
        assert!(words::LOAD_RECORD.covers(W_SEQ_HEAD, W_SEQ_TAIL + 1));
        assert!(words::CONTROL.covers(words::LOCKS.first, words::LOCKS.end));
        assert!(words::CONTROL.covers(words::COUNTERS.first, words::COUNTERS.end));
        assert_eq!(words::COUNTERS.end, CONTROL_END_WORD);
        // Agent-owned ranges and the ranges a balancer mutates never meet.
        for g in Rights::balancer(0).grants() {
            if g.ops.has_mutation() {
                assert!(AGENT_OWNED
                    .iter()
                    .all(|o| !o.overlaps(g.words.first, g.words.end)));
            }
        }
    }

    #[test]
    fn a_chunk_writer_writes_only_inside_its_chunks_and_nothing_else() {
        const CB: u64 = 1400;
        const MAX: u64 = 65_536;
        let wr = Rights::chunk_writer(1, 300, 302).unwrap();
        let at = |c: u64, o: u64| c * CB + o;
        let ck =
            |r: &Rights, a: Access, off: u64, len: u64| check_chunks(r, 1, a, off, len, CB, MAX);
        assert_eq!(ck(&wr, Access::Write, at(300, 0), 8), Ok(()));
        assert_eq!(ck(&wr, Access::Write, at(301, 8), CB - 8), Ok(()));
        // Outside its chunks, across a chunk, beyond the arena, unaligned, empty.
        for c in [299, 302, 0, 65_535] {
            assert!(matches!(
                ck(&wr, Access::Write, at(c, 0), 8),
                Err(Refusal::NotGranted { .. })
            ));
        }
        assert!(matches!(
            ck(&wr, Access::Write, at(300, 1392), 16),
            Err(Refusal::OutOfBounds { .. })
        ));
        assert!(matches!(
            ck(&wr, Access::Write, at(MAX, 0), 8),
            Err(Refusal::OutOfBounds { .. })
        ));
        assert!(matches!(
            ck(&wr, Access::Write, at(300, 4), 8),
            Err(Refusal::Unaligned { .. })
        ));
        assert_eq!(
            ck(&wr, Access::Write, at(300, 0), 0),
            Err(Refusal::BadLength { len: 0 })
        );
        // No READ, no atomics, another region, and nothing on region words.
        for a in [
            Access::Read,
            Access::CompareSwap,
            Access::FetchAdd { delta: 1 },
        ] {
            assert!(matches!(
                ck(&wr, a, at(300, 0), 8),
                Err(Refusal::NotGranted { .. })
            ));
        }
        assert!(matches!(
            check_chunks(&wr, 0, Access::Write, at(300, 0), 8, CB, MAX),
            Err(Refusal::WrongRegion { .. })
        ));
        for word in 0..layout::REGION_WORDS {
            assert!(check(&wr, 1, Access::Write, w(word), 8).is_err(), "{word}");
            assert!(check(&wr, 1, Access::Read, w(word), 8).is_err(), "{word}");
        }
        // A reader reads any chunk and writes none.
        let rd = Rights::reader(1);
        assert_eq!(ck(&rd, Access::Read, at(300, 0), CB), Ok(()));
        assert!(matches!(
            ck(&rd, Access::Write, at(300, 0), 8),
            Err(Refusal::NotGranted { .. })
        ));
        // What cannot be built.
        for (region, first, end) in [
            (0, 1, 2),
            (1, 5, 5),
            (1, 6, 5),
            (1, 0, CHUNK_GRANT_END_MAX + 1),
        ] {
            assert_eq!(
                Rights::chunk_writer(region, first, end),
                Err(GrantError::BadChunks { region, first, end })
            );
        }
    }
}
