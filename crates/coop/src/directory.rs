//! A node's directory: a Bloom filter of the object ids it caches, published in its
//! region with its own seqlock epoch, for peers to decide where to fetch from.
//!
//! Semantics of a hint:
//! - **false positive** (the filter says yes, the node does not hold the object: hash
//!   collision, or the object was evicted since the filter was built): the peer's fetch
//!   finds no such object in the node's arena index or slot and falls back to disk. It
//!   costs one wasted fetch, never a wrong body, because the arena validates every
//!   object by url hash and CRC.
//! - **false negative** (the node cached the object after the filter was built): the
//!   peer reads from disk although a copy existed. It costs a disk read and a duplicate
//!   copy, never correctness.
//!
//! A Bloom filter cannot delete, so the node rebuilds it from its cache for every
//! publication (each one a new epoch), which also bounds how stale a hint can be to one
//! publication period.
//!
//! Sizing rule: `bits = -n ln p / (ln 2)^2` and `k = (bits / n) ln 2` for `n` expected
//! objects (the cache's bytes over the mean cached object's bytes) and false-positive
//! rate `p` (default [`BLOOM_FP_DEFAULT`]), rounded up to whole 64-bit words and bounded
//! by [`BLOOM_BITS_MAX`].

/// Bits of the largest filter: 65,536 bits = 8 KB, six READs of 1,400 B. Rule: holds
/// about 6,800 objects at 1 % false positives, more than the World Cup sample's 2,730
/// distinct urls; beyond that the rate rises (a cost, not an error).
pub const BLOOM_BITS_MAX: usize = 65_536;
/// Hash functions at most: more buys nothing at the sizes above and costs a peer's
/// lookup more memory reads.
pub const BLOOM_HASHES_MAX: u32 = 16;
/// Default false-positive rate: one wasted fetch per hundred lookups of absent objects,
/// a fraction of a percent of all requests once the popular objects are cached.
pub const BLOOM_FP_DEFAULT: f64 = 0.01;

/// Bytes before the bit words in the published form: `epoch u64 | k u32 | words u32`.
pub const DIRECTORY_HEAD_BYTES: usize = 16;

/// A Bloom filter of object ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BloomFilter {
    words: Vec<u64>,
    hashes: u32,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl BloomFilter {
    /// A filter sized by the rule above for `objects` expected ids at false-positive rate
    /// `fp` (within the bounds).
    pub fn for_objects(objects: usize, fp: f64) -> BloomFilter {
        let n = objects.max(1) as f64;
        let ln2 = std::f64::consts::LN_2;
        let bits = (-n * fp.clamp(1e-9, 0.5).ln() / (ln2 * ln2)).ceil() as usize;
        let bits = bits.clamp(64, BLOOM_BITS_MAX).div_ceil(64) * 64;
        let hashes = ((bits as f64 / n) * ln2)
            .round()
            .clamp(1.0, BLOOM_HASHES_MAX as f64) as u32;
        BloomFilter {
            words: vec![0; bits / 64],
            hashes,
        }
    }

    pub fn bits(&self) -> usize {
        self.words.len() * 64
    }

    pub fn hashes(&self) -> u32 {
        self.hashes
    }

    fn positions(&self, id: u64) -> impl Iterator<Item = usize> {
        // Double hashing (Kirsch and Mitzenmacher): k positions from two hashes.
        let h1 = mix(id ^ 0x5851_F42D_4C95_7F2D);
        let h2 = mix(h1) | 1;
        let bits = self.bits() as u64;
        (0..self.hashes as u64).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) % bits) as usize)
    }

    pub fn insert(&mut self, id: u64) {
        for p in self.positions(id).collect::<Vec<_>>() {
            self.words[p / 64] |= 1 << (p % 64);
        }
    }

    /// True if `id` may be in the set (false positives possible, no false negatives).
    pub fn may_contain(&self, id: u64) -> bool {
        self.positions(id)
            .all(|p| self.words[p / 64] & (1 << (p % 64)) != 0)
    }

    pub fn clear(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }

    /// Bytes of the published form.
    pub fn published_bytes(&self) -> usize {
        DIRECTORY_HEAD_BYTES + self.words.len() * 8 + 8
    }

    /// The stores that publish the filter with `epoch` (even, growing), in order: make
    /// the epoch words odd, write the filter, make them even. `(offset, bytes)` within
    /// the directory's place in the region.
    pub fn publish_steps(&self, epoch: u64) -> Vec<(usize, Vec<u8>)> {
        assert!(
            epoch % 2 == 0 && epoch > 0,
            "published epochs are even and non-zero"
        );
        let tail = DIRECTORY_HEAD_BYTES + self.words.len() * 8;
        let odd = (epoch - 1).to_le_bytes().to_vec();
        let mut body = Vec::with_capacity(tail - 8);
        body.extend_from_slice(&self.hashes.to_le_bytes());
        body.extend_from_slice(&(self.words.len() as u32).to_le_bytes());
        for w in &self.words {
            body.extend_from_slice(&w.to_le_bytes());
        }
        vec![
            (0, odd.clone()),
            (tail, odd),
            (8, body),
            (0, epoch.to_le_bytes().to_vec()),
            (tail, epoch.to_le_bytes().to_vec()),
        ]
    }

    /// The published form with `epoch` in one buffer (the steps of
    /// [`BloomFilter::publish_steps`] applied in order), e.g. to send in a message.
    pub fn to_published(&self, epoch: u64) -> Vec<u8> {
        let mut out = vec![0u8; self.published_bytes()];
        for (off, b) in self.publish_steps(epoch) {
            out[off..off + b.len()].copy_from_slice(&b);
        }
        out
    }

    /// A filter read back from its published form (read head first, tail last), with its
    /// epoch; `None` if torn (retry) or malformed.
    pub fn from_published(bytes: &[u8]) -> Option<(u64, BloomFilter)> {
        let u64_at = |o: usize| {
            bytes
                .get(o..o + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
        };
        let u32_at = |o: usize| {
            bytes
                .get(o..o + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4")))
        };
        let head = u64_at(0)?;
        let hashes = u32_at(8)?;
        let words = u32_at(12)? as usize;
        if words == 0 || words * 64 > BLOOM_BITS_MAX || hashes == 0 || hashes > BLOOM_HASHES_MAX {
            return None;
        }
        let tail = u64_at(DIRECTORY_HEAD_BYTES + words * 8)?;
        if head != tail || head % 2 == 1 || head == 0 {
            return None;
        }
        let words = (0..words)
            .map(|i| u64_at(DIRECTORY_HEAD_BYTES + i * 8))
            .collect::<Option<Vec<_>>>()?;
        Some((head, BloomFilter { words, hashes }))
    }
}

/// What a node knows of one peer's cache: the last filter it read and its epoch.
#[derive(Debug, Clone)]
pub struct DirectoryView {
    pub epoch: u64,
    pub filter: BloomFilter,
}

impl DirectoryView {
    /// Replaces the view if `epoch` is newer (a late reply never rolls a view back).
    pub fn update(&mut self, epoch: u64, filter: BloomFilter) -> bool {
        if epoch > self.epoch {
            self.epoch = epoch;
            self.filter = filter;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sized_by_the_rule_and_meets_its_false_positive_rate() {
        let mut f = BloomFilter::for_objects(1000, 0.01);
        assert_eq!(f.bits(), 9600); // 9,585.1 rounded up to whole words
        assert_eq!(f.hashes(), 7);
        for id in 0..1000 {
            f.insert(id);
        }
        assert!((0..1000).all(|id| f.may_contain(id)), "no false negatives");
        let fp = (1_000_000..1_100_000)
            .filter(|&id| f.may_contain(id))
            .count();
        assert!(fp < 1500, "false positives {fp} of 100,000");
        assert_eq!(
            BloomFilter::for_objects(1_000_000, 0.01).bits(),
            BLOOM_BITS_MAX
        );
    }

    #[test]
    fn published_filters_read_back_only_when_whole() {
        let mut f = BloomFilter::for_objects(100, 0.01);
        f.insert(42);
        let steps = f.publish_steps(4);
        let mut mem = vec![0u8; f.published_bytes()];
        assert!(
            BloomFilter::from_published(&mem).is_none(),
            "never published"
        );
        for (i, (off, b)) in steps.iter().enumerate() {
            mem[*off..*off + b.len()].copy_from_slice(b);
            let read = BloomFilter::from_published(&mem);
            if i + 1 < steps.len() {
                assert!(read.is_none(), "accepted after step {i}");
            } else {
                assert_eq!(read, Some((4, f.clone())));
            }
        }
        assert_eq!(mem, f.to_published(4), "one buffer, the same bytes");
    }

    #[test]
    fn views_never_roll_back() {
        let f = BloomFilter::for_objects(10, 0.01);
        let mut v = DirectoryView {
            epoch: 6,
            filter: f.clone(),
        };
        assert!(!v.update(4, f.clone()));
        assert!(v.update(8, f));
        assert_eq!(v.epoch, 8);
    }
}
