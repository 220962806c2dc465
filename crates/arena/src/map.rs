//! The arena as one memory the kernel answers READs from (the `rmem_arena` BPF map:
//! one [`CHUNK_BYTES`] chunk per element): the index in its first [`INDEX_CHUNKS`]
//! chunks, the slots after it. A remote reader fetches a url's probe window, then the
//! slot's chunks; every READ lies within one chunk ([`chunk_reads`]).
//!
//! ```text
//!  chunk 0 ......... INDEX_CHUNKS-1 | INDEX_CHUNKS ........................ chunks-1
//!  index (INDEX_BYTES, zero padded) | slots of the ArenaLayout (offsets from here)
//! ```
//!
//! Slot offsets in index buckets and in hints are relative to the slot area, as
//! [`crate::Store`] writes them; [`SLOTS_BASE`] turns them into map offsets.

use crate::index::{Bucket, Index};
use crate::layout::{ArenaLayout, LayoutTooLarge, ARENA_CHUNKS_MAX, CHUNK_BYTES, INDEX_BYTES};
use crate::store::{PutError, Store};

/// Chunks the index occupies at the start of the map (188).
pub const INDEX_CHUNKS: usize = INDEX_BYTES.div_ceil(CHUNK_BYTES);
/// Map byte offset of the slot area.
pub const SLOTS_BASE: usize = INDEX_CHUNKS * CHUNK_BYTES;

/// Chunks a map holding the index and `layout`'s slots needs, checked against
/// [`ARENA_CHUNKS_MAX`].
pub fn map_chunks(layout: &ArenaLayout) -> Result<usize, LayoutTooLarge> {
    let chunks = INDEX_CHUNKS + layout.chunks();
    if chunks > ARENA_CHUNKS_MAX {
        return Err(LayoutTooLarge { chunks });
    }
    Ok(chunks)
}

/// `(map offset, length)` READs covering `[offset, offset + len)`, each within one chunk.
pub fn chunk_reads(offset: usize, len: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (mut o, end) = (offset, offset + len);
    while o < end {
        let chunk_end = (o / CHUNK_BYTES + 1) * CHUNK_BYTES;
        let e = end.min(chunk_end);
        out.push((o, e - o));
        o = e;
    }
    out
}

/// The owner's view of a whole arena memory (the mapped BPF map, or a plain buffer in
/// tests): the store of free slots and the index, kept in step.
pub struct ArenaMap {
    store: Store,
}

impl ArenaMap {
    /// An empty arena for `layout` over zeroed memory of at least
    /// [`map_chunks`]`(layout) * CHUNK_BYTES` bytes.
    pub fn new(layout: ArenaLayout) -> Result<ArenaMap, LayoutTooLarge> {
        map_chunks(&layout)?;
        Ok(ArenaMap {
            store: Store::new(layout),
        })
    }

    pub fn layout(&self) -> &ArenaLayout {
        self.store.layout()
    }

    fn split(mem: &mut [u8]) -> (&mut [u8], &mut [u8]) {
        let (index, slots) = mem.split_at_mut(SLOTS_BASE);
        (&mut index[..INDEX_BYTES], slots)
    }

    /// Puts `data` under `url_hash` (seqlock write of a free slot, then the index):
    /// the bucket, whose `offset` is slot-area relative.
    pub fn put(&mut self, mem: &mut [u8], url_hash: u64, data: &[u8]) -> Result<Bucket, PutError> {
        let (index, slots) = ArenaMap::split(mem);
        let mut index = Index::new(index);
        self.store.put(slots, &mut index, url_hash, data)
    }

    /// Evicts `url_hash`'s object; true if it was there.
    pub fn evict(&mut self, mem: &mut [u8], url_hash: u64) -> bool {
        let (index, slots) = ArenaMap::split(mem);
        let mut index = Index::new(index);
        self.store.evict(slots, &mut index, url_hash)
    }

    /// Publishes `object_hash`'s object under a second name, `alias_hash` (an alias
    /// bucket: the object's slot, length and version, and `object_hash`, the hash its
    /// slot carries). A reader that knows only the alias looks it up in the index and
    /// reads the slot as for the object, checking it against `object_hash` and the
    /// version, so an alias left behind by a replaced or evicted object reads as stale,
    /// never as another body. `None`: the object is not in the arena; `Err`: no free
    /// bucket in the alias's probe window.
    pub fn publish(
        &mut self,
        mem: &mut [u8],
        alias_hash: u64,
        object_hash: u64,
    ) -> Option<Result<Bucket, crate::IndexFull>> {
        let (index, _) = ArenaMap::split(mem);
        let mut index = Index::new(index);
        let object = index.lookup(object_hash).filter(|b| b.object == 0)?;
        let alias = Bucket {
            url_hash: alias_hash,
            object: object_hash,
            ..object
        };
        Some(index.insert(alias).map(|()| alias))
    }

    /// Removes the alias `alias_hash` (never an object's own bucket: the object and
    /// its slot stay); true if it was there.
    pub fn unpublish(&mut self, mem: &mut [u8], alias_hash: u64) -> bool {
        let (index, _) = ArenaMap::split(mem);
        let mut index = Index::new(index);
        match index.lookup(alias_hash) {
            Some(b) if b.object != 0 => index.evict(alias_hash),
            _ => false,
        }
    }

    /// `url_hash`'s bucket, as the owner sees it.
    pub fn lookup(&self, mem: &mut [u8], url_hash: u64) -> Option<Bucket> {
        let (index, _) = ArenaMap::split(mem);
        Index::new(index).lookup(url_hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{lookup_in_window, probe_window};
    use crate::slot::ObjectRead;

    #[test]
    fn reads_never_cross_a_chunk() {
        assert_eq!(chunk_reads(0, 0), vec![]);
        assert_eq!(chunk_reads(8, 16), vec![(8, 16)]);
        assert_eq!(
            chunk_reads(1392, 24),
            vec![(1392, 8), (1400, 16)],
            "a window across a chunk boundary is two READs"
        );
        let r = chunk_reads(100, 5000);
        assert_eq!(r.iter().map(|x| x.1).sum::<usize>(), 5000);
        assert!(r
            .iter()
            .all(|&(o, l)| o / CHUNK_BYTES == (o + l - 1) / CHUNK_BYTES));
        assert_eq!(INDEX_CHUNKS, 188);
    }

    /// The remote path in memory: probe window by chunk READs, then the slot's plan.
    #[test]
    fn an_object_is_found_and_read_through_chunk_reads_only() {
        let mut classes = [0; crate::layout::CLASS_COUNT];
        classes[0] = 2;
        classes[3] = 1;
        let layout = ArenaLayout::new(classes).unwrap();
        let mut mem = vec![0u8; map_chunks(&layout).unwrap() * CHUNK_BYTES];
        let mut arena = ArenaMap::new(layout.clone()).unwrap();
        let body: Vec<u8> = (0..9000u32).map(|i| (i * 7) as u8).collect();
        let hash = crate::url_hash(b"/big");
        arena.put(&mut mem, hash, &body).unwrap();
        let read = |o: usize, l: usize| -> Vec<u8> {
            chunk_reads(o, l)
                .into_iter()
                .flat_map(|(o, l)| mem[o..o + l].to_vec())
                .collect()
        };
        let mut window = Vec::new();
        for (o, l) in probe_window(hash) {
            window.extend(read(o, l));
        }
        let b = lookup_in_window(&window, hash).expect("indexed");
        let mut r = ObjectRead::new(&layout, hash, b.offset as usize, b.len as usize).unwrap();
        let plan = r.plan();
        for (i, (o, l)) in plan.into_iter().enumerate().rev() {
            r.feed_at(i, &read(SLOTS_BASE + o, l));
        }
        assert_eq!(r.finish().unwrap().1, body);
        assert!(arena.evict(&mut mem, hash));
        assert_eq!(arena.lookup(&mut mem, hash), None);
    }

    /// An alias is found by its own hash through the remote window and names the
    /// object's slot; a replaced object leaves the old alias reading as stale.
    #[test]
    fn an_alias_publishes_an_object_under_a_second_name() {
        let mut classes = [0; crate::layout::CLASS_COUNT];
        classes[1] = 2;
        let layout = ArenaLayout::new(classes).unwrap();
        let mut mem = vec![0u8; map_chunks(&layout).unwrap() * CHUNK_BYTES];
        let mut arena = ArenaMap::new(layout.clone()).unwrap();
        let (object, alias) = (
            crate::url_hash(b"file-identity"),
            crate::url_hash(b"/a.bin"),
        );
        assert!(
            arena.publish(&mut mem, alias, object).is_none(),
            "no object, no alias"
        );
        let body = vec![9u8; 2000];
        let own = arena.put(&mut mem, object, &body).unwrap();
        let published = arena.publish(&mut mem, alias, object).unwrap().unwrap();
        assert_eq!(published.object, object);
        assert_eq!(
            (published.offset, published.len, published.version),
            (own.offset, own.len, own.version)
        );
        let window: Vec<u8> = probe_window(alias)
            .iter()
            .flat_map(|&(o, l)| mem[o..o + l].to_vec())
            .collect();
        let b = lookup_in_window(&window, alias).expect("published");
        assert_eq!(b, published);
        let read = |mem: &[u8], b: &Bucket| {
            let mut r =
                ObjectRead::new(&layout, b.object, b.offset as usize, b.len as usize).unwrap();
            for (i, (o, l)) in r.plan().into_iter().enumerate() {
                r.feed_at(i, &mem[SLOTS_BASE + o..SLOTS_BASE + o + l]);
            }
            r.finish()
        };
        let (version, got) = read(&mem, &b).unwrap();
        assert_eq!((version, got), (b.version, body));
        // The object replaced (a changed file): the old alias never yields a body.
        arena.put(&mut mem, object, &[1u8; 1500]).unwrap();
        assert!(read(&mem, &b).is_err(), "stale alias");
        // unpublish removes aliases only, never an object's own bucket.
        assert!(!arena.unpublish(&mut mem, object));
        assert!(arena.unpublish(&mut mem, alias));
        assert!(!arena.unpublish(&mut mem, alias));
        assert!(arena.lookup(&mut mem, object).is_some());
    }
}
