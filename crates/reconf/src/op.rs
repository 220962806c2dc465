//! The remote operations a state machine asks for, and their completions.
//!
//! They mirror `farside_rmem::RemoteMemory` (read / write / compare_swap / fetch_add on
//! u64 words), with word indices instead of byte offsets and a [`Target`] naming whose
//! region. The caller issues each op over a transport (or the simulator's network) and
//! hands back exactly one [`Completion`] per op id: the reply, or [`Completion::Lost`]
//! when no reply came within the transport's timeout. A lost WRITE / CAS / FETCH-ADD
//! has an unknown outcome: it may have been applied, may still be in flight and be
//! applied later, or never be; the state machines resolve it (see `balancer`).

/// Identifies one issued op; completions carry it back.
pub type OpId = u64;

/// Whose region an op addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// A back-end node's region (role, error and site lock words).
    Node(u32),
    /// A balancer's own small region (shared update counter, heartbeat).
    Balancer(u32),
}

/// A remote operation on 64-bit words at word indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Read `len` words from `word`.
    Read {
        /// Region.
        target: Target,
        /// First word.
        word: usize,
        /// Words to read.
        len: usize,
    },
    /// Write one word.
    Write {
        /// Region.
        target: Target,
        /// Word index.
        word: usize,
        /// New value.
        value: u64,
    },
    /// If the word equals `expect`, set it to `new`; the reply is the previous value.
    Cas {
        /// Region.
        target: Target,
        /// Word index.
        word: usize,
        /// Expected value.
        expect: u64,
        /// Value written when `expect` matched.
        new: u64,
    },
    /// Add `delta` (wrapping); the reply is the previous value.
    Fadd {
        /// Region.
        target: Target,
        /// Word index.
        word: usize,
        /// Addend.
        delta: u64,
    },
}

impl Op {
    /// The region the op addresses.
    pub fn target(&self) -> Target {
        match *self {
            Op::Read { target, .. }
            | Op::Write { target, .. }
            | Op::Cas { target, .. }
            | Op::Fadd { target, .. } => target,
        }
    }
    /// Does the op change memory?
    pub fn is_mutation(&self) -> bool {
        !matches!(self, Op::Read { .. })
    }
}

/// How an op ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// The words read.
    Read(Vec<u64>),
    /// The write was applied.
    Written,
    /// The previous value of a CAS (equal to `expect` iff it swapped).
    Cas(u64),
    /// The previous value of a FETCH-ADD.
    Fadd(u64),
    /// No reply within the timeout: a mutation's outcome is unknown.
    Lost,
}

/// An op to issue, with the id its completion must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// Id to hand back with the completion.
    pub id: OpId,
    /// The operation.
    pub op: Op,
}
