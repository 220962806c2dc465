//! The region: a fixed-layout, versioned block of little-endian 64-bit words that a
//! back-end's gatherer publishes and that front-ends read one-sidedly (shared memory,
//! an in-kernel XDP responder, or RDMA), so that no process on the back-end has to be
//! scheduled to answer.
//!
//! - [`layout`]: word offsets (the one source of truth; the BPF side is checked against it)
//! - [`seqlock`]: the head/tail sequence pair that lets a single READ reject torn records
//! - [`record`]: the load record, its writer and the validating decoder
//! - [`mem`]: heap or shared-mapping word storage

pub mod layout;
pub mod mem;
pub mod record;
pub mod seqlock;

pub use layout::{REGION_BYTES, REGION_WORDS, SNAPSHOT_BYTES};
pub use mem::{HeapWords, MappedWords, Words};
pub use record::{fresh_generation, Header, LoadRecord, RegionError, RegionWriter, Snapshot};
