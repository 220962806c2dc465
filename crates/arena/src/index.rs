//! The index: fixed buckets `{url_hash, offset, len, version}` with bounded linear
//! probing, laid out in bytes so that a peer fetches a url's whole probe window with one
//! READ and looks it up itself.
//!
//! A bucket is a hint, not a promise: the node rewrites buckets while peers read them, so
//! a peer may see a torn or outdated bucket. That is safe because the slot it points to is
//! validated on its own (sequence words, url hash, CRC): a bad hint costs one wasted
//! fetch, never a wrong body.

use crate::layout::{BUCKET_BYTES, INDEX_BUCKETS, INDEX_BYTES, PROBE_MAX};
use std::fmt;

/// Url hash of an empty bucket (never produced by [`url_hash`]).
pub const HASH_EMPTY: u64 = 0;
/// Url hash of a bucket whose object was evicted: lookups probe past it, inserts reuse it.
pub const HASH_TOMBSTONE: u64 = u64::MAX;

/// The 64-bit key of a url (FNV-1a), never [`HASH_EMPTY`] nor [`HASH_TOMBSTONE`]. Not
/// keyed: a client that crafts colliding urls can at worst fill a probe window, and then
/// those objects are not cached in the arena.
pub fn url_hash(url: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in url {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    match h {
        HASH_EMPTY => 1,
        HASH_TOMBSTONE => HASH_TOMBSTONE - 1,
        h => h,
    }
}

/// One bucket's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub url_hash: u64,
    /// Byte offset of the object's slot in the arena.
    pub offset: u32,
    /// Object bytes.
    pub len: u32,
    /// The slot's version when the object was written.
    pub version: u64,
    /// 0 for an object's own bucket. An **alias** (a second name for an object, e.g.
    /// the url path a server publishes for readers that resolve urls themselves,
    /// [`crate::ArenaMap::publish`]): the url hash the object's slot carries, which a
    /// reader checks the slot against instead of the alias's own hash.
    pub object: u64,
}

impl Bucket {
    fn encode(&self) -> [u8; BUCKET_BYTES] {
        let mut b = [0u8; BUCKET_BYTES];
        b[0..8].copy_from_slice(&self.url_hash.to_le_bytes());
        b[8..12].copy_from_slice(&self.offset.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.version.to_le_bytes());
        b[24..32].copy_from_slice(&self.object.to_le_bytes());
        b
    }

    /// Decodes a bucket from its 32 bytes.
    pub fn decode(b: &[u8]) -> Bucket {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        Bucket {
            url_hash: u64_at(0),
            offset: u32_at(8),
            len: u32_at(12),
            version: u64_at(16),
            object: u64_at(24),
        }
    }
}

/// No free bucket within [`PROBE_MAX`] of the url's home: evict something or do not cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexFull;

impl fmt::Display for IndexFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no free index bucket within {PROBE_MAX} probes")
    }
}

impl std::error::Error for IndexFull {}

/// Home bucket of a url hash.
pub fn home(url_hash: u64) -> usize {
    (url_hash as usize) & (INDEX_BUCKETS - 1)
}

/// The probe window of a url hash: the byte ranges (offset in the index, length) a remote
/// reader fetches, at most two because the window wraps around the index's end.
pub fn probe_window(url_hash: u64) -> Vec<(usize, usize)> {
    let start = home(url_hash);
    let first = PROBE_MAX.min(INDEX_BUCKETS - start);
    let mut ranges = vec![(start * BUCKET_BYTES, first * BUCKET_BYTES)];
    if first < PROBE_MAX {
        ranges.push((0, (PROBE_MAX - first) * BUCKET_BYTES));
    }
    ranges
}

/// Looks a url up in a fetched probe window (the buckets in probe order).
pub fn lookup_in_window(window: &[u8], url_hash: u64) -> Option<Bucket> {
    for b in window.chunks_exact(BUCKET_BYTES) {
        let bucket = Bucket::decode(b);
        if bucket.url_hash == url_hash {
            return Some(bucket);
        }
        if bucket.url_hash == HASH_EMPTY {
            return None;
        }
    }
    None
}

/// The index over its memory (the writer's view: the node's own process).
pub struct Index<'a> {
    mem: &'a mut [u8],
}

impl<'a> Index<'a> {
    /// The index in `mem`, which must be [`INDEX_BYTES`] long (zeroed = empty).
    pub fn new(mem: &'a mut [u8]) -> Index<'a> {
        assert_eq!(mem.len(), INDEX_BYTES, "index memory must be INDEX_BYTES");
        Index { mem }
    }

    fn bucket(&self, i: usize) -> Bucket {
        Bucket::decode(&self.mem[i * BUCKET_BYTES..(i + 1) * BUCKET_BYTES])
    }

    fn put(&mut self, i: usize, b: &Bucket) {
        self.mem[i * BUCKET_BYTES..(i + 1) * BUCKET_BYTES].copy_from_slice(&b.encode());
    }

    fn probe(url_hash: u64) -> impl Iterator<Item = usize> {
        let h = home(url_hash);
        (0..PROBE_MAX).map(move |i| (h + i) & (INDEX_BUCKETS - 1))
    }

    fn find(&self, url_hash: u64) -> Option<usize> {
        for i in Self::probe(url_hash) {
            match self.bucket(i).url_hash {
                h if h == url_hash => return Some(i),
                HASH_EMPTY => return None,
                _ => {}
            }
        }
        None
    }

    /// The bucket of `url_hash`, if indexed.
    pub fn lookup(&self, url_hash: u64) -> Option<Bucket> {
        self.find(url_hash).map(|i| self.bucket(i))
    }

    /// Indexes (or re-indexes) an object.
    pub fn insert(&mut self, bucket: Bucket) -> Result<(), IndexFull> {
        assert!(bucket.url_hash != HASH_EMPTY && bucket.url_hash != HASH_TOMBSTONE);
        let at = self.find(bucket.url_hash).or_else(|| {
            Self::probe(bucket.url_hash)
                .find(|&i| matches!(self.bucket(i).url_hash, HASH_EMPTY | HASH_TOMBSTONE))
        });
        let i = at.ok_or(IndexFull)?;
        self.put(i, &bucket);
        Ok(())
    }

    /// Removes a url; true if it was indexed.
    pub fn evict(&mut self, url_hash: u64) -> bool {
        match self.find(url_hash) {
            Some(i) => {
                let tomb = Bucket {
                    url_hash: HASH_TOMBSTONE,
                    offset: 0,
                    len: 0,
                    version: 0,
                    object: 0,
                };
                self.put(i, &tomb);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(h: u64, off: u32) -> Bucket {
        Bucket {
            url_hash: h,
            offset: off,
            len: 10,
            version: 2,
            object: 0,
        }
    }

    #[test]
    fn insert_lookup_evict_round_trip() {
        let mut mem = vec![0; INDEX_BYTES];
        let mut idx = Index::new(&mut mem);
        let h = url_hash(b"/images/logo.gif");
        assert_eq!(idx.lookup(h), None);
        idx.insert(b(h, 1400)).unwrap();
        assert_eq!(idx.lookup(h), Some(b(h, 1400)));
        idx.insert(b(h, 2800)).unwrap();
        assert_eq!(idx.lookup(h).unwrap().offset, 2800, "re-insert replaces");
        assert!(idx.evict(h));
        assert!(!idx.evict(h));
        assert_eq!(idx.lookup(h), None);
    }

    #[test]
    fn probing_is_bounded_and_passes_tombstones() {
        let mut mem = vec![0; INDEX_BYTES];
        let mut idx = Index::new(&mut mem);
        // PROBE_MAX hashes with the same home bucket fill its window.
        let same: Vec<u64> = (1..=PROBE_MAX as u64 + 1)
            .map(|k| 5 + k * INDEX_BUCKETS as u64)
            .collect();
        for &h in &same[..PROBE_MAX] {
            idx.insert(b(h, 0)).unwrap();
        }
        assert_eq!(idx.insert(b(same[PROBE_MAX], 0)), Err(IndexFull));
        assert!(idx.evict(same[0]));
        assert!(
            idx.lookup(same[PROBE_MAX - 1]).is_some(),
            "lookup passes the tombstone"
        );
        idx.insert(b(same[PROBE_MAX], 0)).unwrap();
        assert!(idx.lookup(same[PROBE_MAX]).is_some());
    }

    #[test]
    fn a_remote_reader_finds_buckets_in_the_fetched_window() {
        let mut mem = vec![0; INDEX_BYTES];
        let wrap = (INDEX_BUCKETS as u64 - 2) | (7 << 32);
        let hashes = [url_hash(b"/a"), url_hash(b"/b"), wrap, wrap + (1 << 40)];
        {
            let mut idx = Index::new(&mut mem);
            for (k, &h) in hashes.iter().enumerate() {
                idx.insert(b(h, k as u32)).unwrap();
            }
        }
        for (k, &h) in hashes.iter().enumerate() {
            let window: Vec<u8> = probe_window(h)
                .iter()
                .flat_map(|&(o, l)| mem[o..o + l].to_vec())
                .collect();
            assert_eq!(window.len(), PROBE_MAX * BUCKET_BYTES);
            assert_eq!(lookup_in_window(&window, h), Some(b(h, k as u32)));
        }
        assert_eq!(
            probe_window(wrap).len(),
            2,
            "the window wraps around the end"
        );
    }

    #[test]
    fn url_hash_avoids_the_reserved_values() {
        assert_ne!(url_hash(b""), HASH_EMPTY);
        assert_ne!(url_hash(b"/index.html"), url_hash(b"/index.htm"));
    }
}
