//! The object arena: cached response bodies laid out so that a peer (or an XDP responder
//! answering for a peer) can read them one-sidedly, one chunk at a time, and never accept
//! a torn or wrong object.
//!
//! ```text
//!  arena = ARENA_CHUNKS_MAX chunks of CHUNK_BYTES (one BPF_F_MMAPABLE array map, one
//!          chunk per element: one remote READ never crosses an element)
//!  ├─ class 0: slots of 1 chunk   ┐
//!  ├─ class 1: slots of 2 chunks  │ a slot never changes size, so its tail word sits at
//!  ├─ ...                         │ a fixed place whatever object it holds
//!  └─ class 6: slots of 64 chunks ┘
//!
//!  slot = seq_head u64 | url_hash u64 | len u32 | crc32c u32 | data[len] ... | seq_tail u64
//!         (seq_tail is the slot's last 8 bytes)
//!
//!  index = INDEX_BUCKETS buckets of {url_hash u64, offset u32, len u32, version u64, object u64},
//!          linear probing bounded by PROBE_MAX (one READ fetches a whole probe window)
//! ```
//!
//! The writer is the node's own process ([`slot::write_steps`]): make both sequence words
//! odd, write the header and data, make both even (the version bump). A reader
//! ([`slot::ObjectRead`]) reads the slot's chunks in ascending order, possibly far apart
//! in time, and accepts the assembled object only if `seq_head == seq_tail`, the value is
//! even and non-zero, the url hash is the one it asked for, and the CRC32c over
//! `url_hash | len | data` matches. Why that is enough: see [`slot`]. [`store`] keeps
//! free slots, index and sequence words in step when objects are put and evicted.

pub mod index;
pub mod layout;
pub mod map;
pub mod slot;
pub mod store;

pub use index::{url_hash, Bucket, Index, IndexFull};
pub use layout::ArenaLayout;
pub use map::{chunk_reads, map_chunks, ArenaMap, INDEX_CHUNKS, SLOTS_BASE};
pub use slot::{write_object, write_steps, ObjectRead, ReadError, SlotRef, WriteStep};
pub use store::{PutError, Store};
