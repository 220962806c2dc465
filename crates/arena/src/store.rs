//! The node's own side of the arena: which slots are free, and putting and evicting
//! objects so that slots, index and sequence words always agree.
//!
//! `put` writes the object into a free slot of the smallest class that holds it (seqlock
//! protocol), then points the url's bucket at it; the url's previous slot, if any, is
//! invalidated and freed only after. `evict` removes the bucket and invalidates the slot
//! (an empty object written under the url hash no url has, by the seqlock protocol), so
//! a reader holding an old hint gets [`crate::ReadError::Stale`] at once, never the
//! evicted body.

use crate::index::{Bucket, Index, IndexFull, HASH_EMPTY};
use crate::layout::{class_for_len, ArenaLayout, CLASS_COUNT, SLOT_OBJECT_BYTES_MAX};
use crate::slot::{write_object, SlotRef};
use std::fmt;

/// Why an object was not put in the arena; the caller serves it another way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutError {
    /// Above [`SLOT_OBJECT_BYTES_MAX`].
    TooLarge,
    /// No free slot of the object's class: evict something of that class first.
    NoSlot { class: usize },
    /// No free bucket in the url's probe window.
    IndexFull,
}

impl fmt::Display for PutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PutError::TooLarge => write!(f, "object above {SLOT_OBJECT_BYTES_MAX} B"),
            PutError::NoSlot { class } => write!(f, "no free slot of class {class}"),
            PutError::IndexFull => f.write_str(&IndexFull.to_string()),
        }
    }
}

impl std::error::Error for PutError {}

/// Empties a slot: an empty object under [`HASH_EMPTY`], which no url hashes to, so no
/// reader accepts it for any url.
pub fn invalidate(mem: &mut [u8], slot: SlotRef) {
    write_object(mem, slot, HASH_EMPTY, &[]).expect("an empty object fits every slot");
}

/// Free slots per class.
#[derive(Debug, Clone)]
pub struct Store {
    layout: ArenaLayout,
    free: [Vec<u32>; CLASS_COUNT],
}

impl Store {
    /// A store with every slot of `layout` free (the arena memory zeroed).
    pub fn new(layout: ArenaLayout) -> Store {
        let free = std::array::from_fn(|c| (0..layout.slots_per_class[c]).rev().collect());
        Store { layout, free }
    }

    pub fn layout(&self) -> &ArenaLayout {
        &self.layout
    }

    /// Free slots of `class`.
    pub fn free_slots(&self, class: usize) -> usize {
        self.free[class].len()
    }

    fn slot_of(&self, offset: u32) -> SlotRef {
        SlotRef::at(&self.layout, offset as usize).expect("index points at slots")
    }

    fn release(&mut self, arena: &mut [u8], slot: SlotRef) {
        invalidate(arena, slot);
        let base = self
            .layout
            .slot_offset(slot.class, 0)
            .expect("class has slots");
        let i = (slot.offset - base) / slot.bytes();
        self.free[slot.class].push(i as u32);
    }

    /// Writes `data` as `url_hash`'s object and indexes it.
    pub fn put(
        &mut self,
        arena: &mut [u8],
        index: &mut Index,
        url_hash: u64,
        data: &[u8],
    ) -> Result<Bucket, PutError> {
        let class = class_for_len(data.len()).ok_or(PutError::TooLarge)?;
        let i = self.free[class].pop().ok_or(PutError::NoSlot { class })?;
        let offset = self.layout.slot_offset(class, i).expect("free slots exist");
        let slot = SlotRef { offset, class };
        let version = write_object(arena, slot, url_hash, data).expect("the class fits the object");
        let old = index.lookup(url_hash);
        let bucket = Bucket {
            url_hash,
            offset: offset as u32,
            len: data.len() as u32,
            version,
            object: 0,
        };
        if index.insert(bucket).is_err() {
            self.release(arena, slot);
            return Err(PutError::IndexFull);
        }
        if let Some(old) = old {
            let old_slot = self.slot_of(old.offset);
            self.release(arena, old_slot);
        }
        Ok(bucket)
    }

    /// Removes `url_hash`'s object; true if it was there.
    pub fn evict(&mut self, arena: &mut [u8], index: &mut Index, url_hash: u64) -> bool {
        let Some(b) = index.lookup(url_hash) else {
            return false;
        };
        index.evict(url_hash);
        let slot = self.slot_of(b.offset);
        self.release(arena, slot);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::INDEX_BYTES;
    use crate::slot::read_object;
    use crate::ReadError;

    #[test]
    fn put_read_replace_evict_and_reuse() {
        let layout = ArenaLayout::new([2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        let mut arena = vec![0u8; layout.bytes()];
        let mut index_mem = vec![0u8; INDEX_BYTES];
        let mut index = Index::new(&mut index_mem);
        let mut store = Store::new(layout.clone());
        let a = store
            .put(&mut arena, &mut index, 11, b"first body")
            .unwrap();
        let read = |arena: &[u8], b: &Bucket| {
            read_object(
                arena,
                &layout,
                b.url_hash,
                b.offset as usize,
                b.len as usize,
            )
        };
        assert_eq!(read(&arena, &a).unwrap().1, b"first body");
        // Replacing moves the object to another slot and invalidates the old one.
        let a2 = store
            .put(&mut arena, &mut index, 11, b"second, longer body")
            .unwrap();
        assert_ne!(a2.offset, a.offset);
        assert_eq!(
            read(&arena, &a),
            Err(ReadError::Stale),
            "old hint: no old body"
        );
        assert_eq!(read(&arena, &a2).unwrap().1, b"second, longer body");
        assert_eq!(store.free_slots(0), 1);
        // A class with no free slot is refused; evicting frees one.
        let big = vec![7u8; 2000];
        store.put(&mut arena, &mut index, 12, &big).unwrap();
        assert_eq!(
            store.put(&mut arena, &mut index, 13, &big),
            Err(PutError::NoSlot { class: 1 })
        );
        assert!(store.evict(&mut arena, &mut index, 12));
        assert!(!store.evict(&mut arena, &mut index, 12));
        let c = store.put(&mut arena, &mut index, 13, &big).unwrap();
        assert_eq!(read(&arena, &c).unwrap().1, big);
        assert_eq!(index.lookup(12), None);
        assert_eq!(
            store.put(
                &mut arena,
                &mut index,
                14,
                &vec![0; SLOT_OBJECT_BYTES_MAX + 1]
            ),
            Err(PutError::TooLarge)
        );
    }
}
