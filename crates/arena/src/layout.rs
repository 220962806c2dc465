//! Every size and offset of the arena, each with its bound and the reason for it. The BPF
//! side (the XDP responder that answers READs of the arena map) must use these values;
//! they are the one source of truth.

/// Bytes of one chunk: the largest READ one reply datagram carries (rmem's
/// `UDP_READ_BYTES_MAX`: the XDP responder answers in place in one 1500-byte frame and
/// cannot fragment). The arena map has one chunk per element, so a READ of one chunk never
/// spans two elements. A multiple of 8, so every slot starts 8-byte aligned.
pub const CHUNK_BYTES: usize = 1400;

/// Offset of `seq_head` in a slot: the sequence word a reader sees first.
pub const OFF_SEQ_HEAD: usize = 0;
/// Offset of the object's url hash (the key it was stored under).
pub const OFF_URL_HASH: usize = 8;
/// Offset of the object's length in bytes (u32).
pub const OFF_LEN: usize = 16;
/// Offset of the CRC32c over `url_hash (8 LE) | len (4 LE) | data` (u32).
pub const OFF_CRC: usize = 20;
/// Offset of the object's first byte.
pub const OFF_DATA: usize = 24;
/// Bytes before the data.
pub const SLOT_HEAD_BYTES: usize = OFF_DATA;
/// Bytes of `seq_tail`, the slot's last word.
pub const SLOT_TAIL_BYTES: usize = 8;

/// Size classes: class `c` has slots of `1 << c` chunks. Powers of two bound the waste of
/// a slot to under half of it and a READ plan to one chunk more than the data needs.
/// Rule for 14: the largest class (8,192 chunks, 11.5 MB) holds the 8 MB bodies of the
/// RDMA-over-HTTP figures, whose point is that a loaded server delivers large bodies
/// without being scheduled; a layout gives the classes it does not use no slot.
pub const CLASS_COUNT: usize = 14;
/// Chunks of the largest slot (class `CLASS_COUNT - 1`).
pub const SLOT_CHUNKS_MAX: usize = 1 << (CLASS_COUNT - 1);
/// Largest object a slot holds: 11,468,768 B (the largest class less its words).
pub const SLOT_OBJECT_BYTES_MAX: usize =
    SLOT_CHUNKS_MAX * CHUNK_BYTES - SLOT_HEAD_BYTES - SLOT_TAIL_BYTES;
/// Largest object the cooperative cache reads one-sidedly by default: 89,568 B (class 6
/// of 64 chunks). Rule: the World Cup sample's 90th percentile object is about 10 KB and
/// its largest 2.9 MB; a 2.9 MB body would take over 2,000 READs, which costs an idle
/// reader more than asking the owner over TCP. Larger cached objects are served by the
/// owner's user-space path; the arena itself holds up to [`SLOT_OBJECT_BYTES_MAX`].
pub const OBJECT_BYTES_MAX: usize = (1 << 6) * CHUNK_BYTES - SLOT_HEAD_BYTES - SLOT_TAIL_BYTES;

/// Region id of the arena in a remote READ (rmem's request `region` field): the node's
/// XDP responder reads its arena map, not the control region (id 0), for it. Mirrored in
/// `bpf/rmem_consts.h` (`RMEM_ARENA_REGION`). Keys whose rights name this region are
/// "arena readers": READ only, the arena and nothing else.
pub const ARENA_REGION: u32 = 1;

/// Request flag of a **bulk** arena READ (rmem request header `flags`, beside
/// `FLAG_RETRY` = 1): the READ starts at a chunk boundary and may span up to
/// [`BULK_CHUNKS_MAX`] consecutive chunks, and the reply's tag covers its envelope and
/// reply header only, not the body. The per-byte SipHash of every reply body was the
/// responder's largest cost (about 4 ns/B in BPF, which has no rotate instruction); a
/// reader asks for bulk READs only where the object's own check (url hash, length and
/// CRC32c, read under full tags in the head chunk) validates the body, and the docs
/// (`docs/rdma-http.md`) say what that trades. Without the flag a READ is exactly as
/// before: one chunk, body tagged. Mirrored in `bpf/rmem_consts.h`.
pub const FLAG_BULK: u16 = 2;

/// Most chunks one bulk READ spans: 6 chunks = 8,400 B, whose reply frame of 8,498 B
/// (Ethernet, IPv4, UDP, envelope and reply header around the data) fits a 9,000-byte
/// (jumbo) MTU. Rule: the largest whole number of chunks under the common jumbo MTU; a
/// reader uses as many as its path's MTU allows ([`bulk_chunks_for_mtu`]), one on a
/// 1,500-byte link.
pub const BULK_CHUNKS_MAX: usize = 6;
/// Bytes of the largest bulk READ.
pub const BULK_READ_BYTES_MAX: usize = BULK_CHUNKS_MAX * CHUNK_BYTES;
/// Bytes a reply frame adds to its READ's data: IPv4 (20), UDP (8), the envelope (32)
/// and the reply header (24); what an MTU must hold besides the data.
pub const REPLY_OVERHEAD_BYTES: usize = 20 + 8 + 32 + 24;

/// Chunks per bulk READ on a path of `mtu` bytes (IP MTU): as many whole chunks as one
/// reply datagram carries unfragmented, at least 1 and at most [`BULK_CHUNKS_MAX`].
pub const fn bulk_chunks_for_mtu(mtu: usize) -> usize {
    let n = mtu.saturating_sub(REPLY_OVERHEAD_BYTES) / CHUNK_BYTES;
    if n == 0 {
        1
    } else if n > BULK_CHUNKS_MAX {
        BULK_CHUNKS_MAX
    } else {
        n
    }
}

/// Chunks of the whole arena: 65,536 chunks = 91.75 MB. Rule: the World Cup sample's
/// distinct bytes (54.6 MB) fit with the waste of power-of-two slots, and the map stays
/// well below the memory of a small node.
pub const ARENA_CHUNKS_MAX: usize = 65_536;

/// Bytes of one index bucket: `url_hash u64 | offset u32 | len u32 | version u64 | object u64`.
pub const BUCKET_BYTES: usize = 32;
/// Buckets of the index (a power of two, so the home bucket is `hash & (n - 1)`). Rule: a
/// full arena of one-chunk slots holds at most `ARENA_CHUNKS_MAX` objects, but the World
/// Cup sample has 2,730 distinct URLs; 8,192 buckets keep a working set of a few thousand
/// objects under half load, where linear probing stays short.
pub const INDEX_BUCKETS: usize = 8192;
/// Buckets a lookup or insert examines from the home bucket before giving up. Rule: the
/// whole window (16 x 32 B = 512 B) fits one READ, so a remote lookup is one round trip;
/// at half load an insert fails to find room in 16 probes with probability below 1e-4,
/// and the caller then simply does not cache the object in the arena.
pub const PROBE_MAX: usize = 16;
/// Bytes of the index region.
pub const INDEX_BYTES: usize = INDEX_BUCKETS * BUCKET_BYTES;

/// Times a reader restarts an object read that came back torn before it gives up and
/// treats the object as a miss. Rule: a torn read means a write of that very slot ran
/// during the read; two in a row mean the slot is being rewritten constantly (an object
/// churning in and out of the cache), where one more fetch from disk is cheaper.
pub const READ_RETRY_MAX: u32 = 2;

const _: () = assert!(CHUNK_BYTES % 8 == 0);
const _: () = assert!(INDEX_BUCKETS.is_power_of_two());
const _: () = assert!(PROBE_MAX * BUCKET_BYTES <= CHUNK_BYTES);
const _: () = assert!(SLOT_HEAD_BYTES + SLOT_TAIL_BYTES < CHUNK_BYTES);
const _: () = assert!(BULK_READ_BYTES_MAX + REPLY_OVERHEAD_BYTES <= 9000);

/// Bytes of a slot of class `class`.
pub const fn slot_bytes(class: usize) -> usize {
    (1 << class) * CHUNK_BYTES
}

/// Largest object a slot of class `class` holds.
pub const fn class_object_bytes_max(class: usize) -> usize {
    slot_bytes(class) - SLOT_HEAD_BYTES - SLOT_TAIL_BYTES
}

/// The smallest class whose slots hold `len` bytes, or `None` above [`SLOT_OBJECT_BYTES_MAX`].
pub fn class_for_len(len: usize) -> Option<usize> {
    (0..CLASS_COUNT).find(|&c| len <= class_object_bytes_max(c))
}

/// How many slots each class has: the arena's partition, known to writer and readers
/// alike (a reader derives a slot's size, and so its tail's place, from its offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArenaLayout {
    /// Slots of each class, classes laid out one after another from chunk 0.
    pub slots_per_class: [u32; CLASS_COUNT],
}

/// A layout whose classes do not fit [`ARENA_CHUNKS_MAX`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutTooLarge {
    /// Chunks the layout asks for.
    pub chunks: usize,
}

impl std::fmt::Display for LayoutTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "arena layout needs {} chunks, at most {ARENA_CHUNKS_MAX}",
            self.chunks
        )
    }
}

impl std::error::Error for LayoutTooLarge {}

impl ArenaLayout {
    /// A layout, checked against [`ARENA_CHUNKS_MAX`].
    pub fn new(slots_per_class: [u32; CLASS_COUNT]) -> Result<ArenaLayout, LayoutTooLarge> {
        let layout = ArenaLayout { slots_per_class };
        let chunks = layout.chunks();
        if chunks > ARENA_CHUNKS_MAX {
            return Err(LayoutTooLarge { chunks });
        }
        Ok(layout)
    }

    /// Chunks the layout occupies.
    pub fn chunks(&self) -> usize {
        (0..CLASS_COUNT)
            .map(|c| self.slots_per_class[c] as usize * (1 << c))
            .sum()
    }

    /// Bytes of the arena memory this layout needs.
    pub fn bytes(&self) -> usize {
        self.chunks() * CHUNK_BYTES
    }

    /// Byte offset of class `class`'s first slot.
    pub fn class_base(&self, class: usize) -> usize {
        (0..class)
            .map(|c| self.slots_per_class[c] as usize * slot_bytes(c))
            .sum()
    }

    /// Byte offset of slot `index` of class `class`, if it exists.
    pub fn slot_offset(&self, class: usize, index: u32) -> Option<usize> {
        if class >= CLASS_COUNT || index >= self.slots_per_class[class] {
            return None;
        }
        Some(self.class_base(class) + index as usize * slot_bytes(class))
    }

    /// The class of the slot starting at `offset`, or `None` if no slot starts there.
    pub fn class_at(&self, offset: usize) -> Option<usize> {
        let mut base = 0;
        for c in 0..CLASS_COUNT {
            let end = base + self.slots_per_class[c] as usize * slot_bytes(c);
            if offset < end {
                return ((offset - base) % slot_bytes(c) == 0).then_some(c);
            }
            base = end;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_bound_is_the_largest_slot_less_its_words() {
        assert_eq!(OBJECT_BYTES_MAX, 89_568);
        assert_eq!(SLOT_OBJECT_BYTES_MAX, 11_468_768);
        assert_eq!(class_for_len(0), Some(0));
        assert_eq!(class_for_len(CHUNK_BYTES - 32), Some(0));
        assert_eq!(class_for_len(CHUNK_BYTES - 31), Some(1));
        assert_eq!(class_for_len(OBJECT_BYTES_MAX), Some(6));
        assert_eq!(class_for_len(8 << 20), Some(CLASS_COUNT - 1));
        assert_eq!(class_for_len(SLOT_OBJECT_BYTES_MAX), Some(CLASS_COUNT - 1));
        assert_eq!(class_for_len(SLOT_OBJECT_BYTES_MAX + 1), None);
    }

    #[test]
    fn slots_are_found_from_their_offsets_only() {
        let layout = ArenaLayout::new([4, 3, 2, 1, 1, 0, 1, 0, 0, 0, 1, 0, 0, 1]).unwrap();
        for c in 0..CLASS_COUNT {
            for i in 0..layout.slots_per_class[c] {
                let off = layout.slot_offset(c, i).unwrap();
                assert_eq!(layout.class_at(off), Some(c));
                assert_eq!(layout.class_at(off + 8), None);
            }
        }
        assert_eq!(layout.class_at(layout.bytes()), None);
        assert_eq!(layout.slot_offset(5, 0), None);
    }

    #[test]
    fn bulk_reads_fit_their_path() {
        assert_eq!(bulk_chunks_for_mtu(0), 1);
        assert_eq!(bulk_chunks_for_mtu(1500), 1);
        assert_eq!(
            bulk_chunks_for_mtu(2 * CHUNK_BYTES + REPLY_OVERHEAD_BYTES),
            2
        );
        assert_eq!(
            bulk_chunks_for_mtu(2 * CHUNK_BYTES + REPLY_OVERHEAD_BYTES - 1),
            1
        );
        assert_eq!(bulk_chunks_for_mtu(9000), BULK_CHUNKS_MAX);
        assert_eq!(bulk_chunks_for_mtu(65_535), BULK_CHUNKS_MAX);
    }

    #[test]
    fn oversized_layouts_are_refused() {
        let mut c = [0; CLASS_COUNT];
        c[6] = 1025;
        assert!(ArenaLayout::new(c).is_err());
        c[6] = 1024;
        assert!(ArenaLayout::new(c).is_ok());
        c[6] = 0;
        c[CLASS_COUNT - 1] = 9;
        assert!(ArenaLayout::new(c).is_err());
    }
}
