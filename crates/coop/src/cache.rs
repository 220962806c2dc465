//! A node's cache of objects, bounded in bytes: least-recently-used ([`LruCache`]) or
//! GreedyDual-Size ([`GdsCache`], Cao and Irani 1997), behind one type ([`NodeCache`]).
//!
//! Only ids and sizes are kept (the bodies live in the object arena); the cache decides
//! what stays. An object larger than the whole capacity is never cached.

use std::collections::{BTreeSet, HashMap};

const NIL: usize = usize::MAX;

#[derive(Debug, Clone)]
struct Entry {
    id: u64,
    bytes: u64,
    prev: usize,
    next: usize,
}

/// A byte-bounded LRU cache of object ids.
#[derive(Debug, Clone)]
pub struct LruCache {
    capacity_bytes: u64,
    used_bytes: u64,
    map: HashMap<u64, usize>,
    entries: Vec<Entry>,
    free: Vec<usize>,
    /// Most recently used.
    head: usize,
    /// Least recently used: evicted first.
    tail: usize,
}

impl LruCache {
    /// An empty cache holding at most `capacity_bytes`.
    pub fn new(capacity_bytes: u64) -> LruCache {
        LruCache {
            capacity_bytes,
            used_bytes: 0,
            map: HashMap::new(),
            entries: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether `id` is cached (does not change recency).
    pub fn contains(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    /// The cached ids, most recent first.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            (at != NIL).then(|| {
                let e = &self.entries[at];
                at = e.next;
                e.id
            })
        })
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.entries[i].prev, self.entries[i].next);
        match prev {
            NIL => self.head = next,
            p => self.entries[p].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.entries[n].prev = prev,
        }
    }

    fn push_front(&mut self, i: usize) {
        self.entries[i].prev = NIL;
        self.entries[i].next = self.head;
        if self.head != NIL {
            self.entries[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    /// A hit makes `id` the most recent; returns whether it was cached.
    pub fn touch(&mut self, id: u64) -> bool {
        match self.map.get(&id) {
            Some(&i) => {
                self.unlink(i);
                self.push_front(i);
                true
            }
            None => false,
        }
    }

    /// Removes `id`; returns whether it was cached.
    pub fn remove(&mut self, id: u64) -> bool {
        match self.map.remove(&id) {
            Some(i) => {
                self.unlink(i);
                self.used_bytes -= self.entries[i].bytes;
                self.free.push(i);
                true
            }
            None => false,
        }
    }

    /// Caches `id` as the most recent, evicting least recent objects until it fits; the
    /// evicted ids are appended to `evicted`. Returns false (and caches nothing) if the
    /// object is larger than the capacity.
    pub fn insert(&mut self, id: u64, bytes: u64, evicted: &mut Vec<u64>) -> bool {
        if bytes > self.capacity_bytes {
            return false;
        }
        if self.touch(id) {
            return true;
        }
        while self.used_bytes + bytes > self.capacity_bytes {
            let victim = self.entries[self.tail].id;
            self.remove(victim);
            evicted.push(victim);
        }
        let entry = Entry {
            id,
            bytes,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.entries[i] = entry;
                i
            }
            None => {
                self.entries.push(entry);
                self.entries.len() - 1
            }
        };
        self.map.insert(id, i);
        self.push_front(i);
        self.used_bytes += bytes;
        true
    }
}

/// GreedyDual-Size with unit cost ("GDS(1)"): each object has a value `H = L + 1 / size`
/// set when it is cached or hit, the object with the least `H` is evicted, and `L`
/// (inflation) becomes its `H`. Small objects stay longer, which raises the hit ratio on
/// web traces whose popular objects are small (the World Cup sample's are).
#[derive(Debug, Clone)]
pub struct GdsCache {
    capacity_bytes: u64,
    used_bytes: u64,
    inflation: f64,
    seq: u64,
    /// id -> (H as ordered bits, insertion sequence, bytes)
    map: HashMap<u64, (u64, u64, u64)>,
    /// (H bits, sequence, id), least first. Non-negative f64 bits order like the values.
    order: BTreeSet<(u64, u64, u64)>,
}

impl GdsCache {
    pub fn new(capacity_bytes: u64) -> GdsCache {
        GdsCache {
            capacity_bytes,
            used_bytes: 0,
            inflation: 0.0,
            seq: 0,
            map: HashMap::new(),
            order: BTreeSet::new(),
        }
    }

    fn value_bits(&self, bytes: u64) -> u64 {
        (self.inflation + 1.0 / bytes.max(1) as f64).to_bits()
    }

    pub fn contains(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    /// A hit restores the object's value; returns whether it was cached.
    pub fn touch(&mut self, id: u64) -> bool {
        let Some(&(h, seq, bytes)) = self.map.get(&id) else {
            return false;
        };
        self.order.remove(&(h, seq, id));
        self.seq += 1;
        let h = self.value_bits(bytes);
        self.order.insert((h, self.seq, id));
        self.map.insert(id, (h, self.seq, bytes));
        true
    }

    pub fn remove(&mut self, id: u64) -> bool {
        match self.map.remove(&id) {
            Some((h, seq, bytes)) => {
                self.order.remove(&(h, seq, id));
                self.used_bytes -= bytes;
                true
            }
            None => false,
        }
    }

    /// As [`LruCache::insert`], evicting least-value objects.
    pub fn insert(&mut self, id: u64, bytes: u64, evicted: &mut Vec<u64>) -> bool {
        if bytes > self.capacity_bytes {
            return false;
        }
        if self.touch(id) {
            return true;
        }
        while self.used_bytes + bytes > self.capacity_bytes {
            let &(h, _, victim) = self.order.first().expect("over capacity means not empty");
            self.inflation = f64::from_bits(h);
            self.remove(victim);
            evicted.push(victim);
        }
        self.seq += 1;
        let h = self.value_bits(bytes);
        self.order.insert((h, self.seq, id));
        self.map.insert(id, (h, self.seq, bytes));
        self.used_bytes += bytes;
        true
    }
}

/// Which replacement policy a node's cache uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replacement {
    Lru,
    GreedyDualSize,
}

/// A node's cache, either policy.
#[derive(Debug, Clone)]
pub enum NodeCache {
    Lru(LruCache),
    Gds(GdsCache),
}

impl NodeCache {
    pub fn new(replacement: Replacement, capacity_bytes: u64) -> NodeCache {
        match replacement {
            Replacement::Lru => NodeCache::Lru(LruCache::new(capacity_bytes)),
            Replacement::GreedyDualSize => NodeCache::Gds(GdsCache::new(capacity_bytes)),
        }
    }

    pub fn contains(&self, id: u64) -> bool {
        match self {
            NodeCache::Lru(c) => c.contains(id),
            NodeCache::Gds(c) => c.contains(id),
        }
    }

    pub fn touch(&mut self, id: u64) -> bool {
        match self {
            NodeCache::Lru(c) => c.touch(id),
            NodeCache::Gds(c) => c.touch(id),
        }
    }

    /// Removes `id`; returns whether it was cached.
    pub fn remove(&mut self, id: u64) -> bool {
        match self {
            NodeCache::Lru(c) => c.remove(id),
            NodeCache::Gds(c) => c.remove(id),
        }
    }

    pub fn insert(&mut self, id: u64, bytes: u64, evicted: &mut Vec<u64>) -> bool {
        match self {
            NodeCache::Lru(c) => c.insert(id, bytes, evicted),
            NodeCache::Gds(c) => c.insert(id, bytes, evicted),
        }
    }

    /// The cached ids (in no promised order).
    pub fn ids(&self) -> Vec<u64> {
        match self {
            NodeCache::Lru(c) => c.ids().collect(),
            NodeCache::Gds(c) => c.map.keys().copied().collect(),
        }
    }

    pub fn used_bytes(&self) -> u64 {
        match self {
            NodeCache::Lru(c) => c.used_bytes,
            NodeCache::Gds(c) => c.used_bytes,
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        match self {
            NodeCache::Lru(c) => c.capacity_bytes,
            NodeCache::Gds(c) => c.capacity_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gds_keeps_small_objects_and_ages_idle_ones_out() {
        let mut c = GdsCache::new(100);
        let mut ev = Vec::new();
        assert!(c.insert(1, 10, &mut ev)); // H = 0.1
        assert!(c.insert(2, 80, &mut ev)); // H = 0.0125
        assert!(c.insert(3, 20, &mut ev)); // H = 0.05: evicts the large one first
        assert_eq!(ev, vec![2]);
        // Inflation is now 0.0125: new 8-byte objects (H = 0.1375) outrank the idle
        // 20-byte one, which goes when room runs out.
        for id in 10..20 {
            assert!(c.insert(id, 8, &mut ev));
        }
        assert!(c.used_bytes <= 100);
        assert_eq!(ev, vec![2, 3]);
        assert!(c.contains(1), "the smallest old object stays");
        assert!(!c.insert(99, 101, &mut ev));
    }

    #[test]
    fn both_replacements_never_exceed_capacity() {
        for r in [Replacement::Lru, Replacement::GreedyDualSize] {
            let mut c = NodeCache::new(r, 1000);
            let mut ev = Vec::new();
            let mut x: u64 = 11;
            for _ in 0..5000 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let id = (x >> 33) % 60;
                if !c.touch(id) {
                    c.insert(id, (x >> 20) % 400, &mut ev);
                }
                assert!(c.used_bytes() <= c.capacity_bytes());
            }
            let ids = c.ids();
            assert!(ids.iter().all(|&id| c.contains(id)));
            let distinct: std::collections::HashSet<u64> = ids.iter().copied().collect();
            assert_eq!(distinct.len(), ids.len(), "each id cached once");
        }
    }

    #[test]
    fn evicts_least_recently_used_until_the_object_fits() {
        let mut c = LruCache::new(100);
        let mut ev = Vec::new();
        assert!(c.insert(1, 40, &mut ev));
        assert!(c.insert(2, 40, &mut ev));
        assert!(c.touch(1));
        assert!(c.insert(3, 40, &mut ev));
        assert_eq!(ev, vec![2]);
        assert_eq!(c.ids().collect::<Vec<_>>(), vec![3, 1]);
        assert_eq!(c.used_bytes(), 80);
        ev.clear();
        assert!(c.insert(4, 100, &mut ev));
        assert_eq!(ev, vec![1, 3]);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn never_holds_more_than_its_capacity() {
        let mut c = LruCache::new(1000);
        let mut ev = Vec::new();
        assert!(!c.insert(9, 1001, &mut ev), "larger than the cache");
        let mut x: u64 = 7;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = (x >> 33) % 50;
            if !c.touch(id) {
                c.insert(id, (x >> 20) % 300, &mut ev);
            }
            assert!(c.used_bytes() <= 1000);
            assert_eq!(c.ids().count(), c.len());
        }
        for id in c.ids().collect::<Vec<_>>() {
            assert!(c.remove(id));
        }
        assert_eq!((c.used_bytes(), c.len()), (0, 0));
    }
}
