//! Which grouped back-end a group reply comes from: an open-addressing table from an
//! IPv4 endpoint (address, port) to the back-end's slot, one 8-byte word per entry.
//!
//! A group READ's replies are matched by their source alone, once per reply: 1,024
//! lookups per period at 1,024 back-ends. With a std `HashMap<SocketAddr, usize>` (40
//! bytes an entry, SipHash) each lookup missed the cache on its bucket: the profile of
//! the AF_XDP poller put 60 % of its per-reply time on that one load. Here an entry is
//! a word (48-bit key, 16-bit slot), the table is at most 16 KiB, the hash is one
//! multiply, and [`EndpointIndex::prefetch`] lets the poller ask for a reply's bucket
//! while it parses the next ones, so the lookup finds it in cache.

use std::net::{SocketAddr, SocketAddrV4};

/// Most entries (grouped back-ends): a slot must fit the entry's 16 bits, with 0 left
/// for "empty"; the monitor's table holds at most 1,024 back-ends anyway.
pub const ENDPOINTS_MAX: usize = u16::MAX as usize - 1;

/// Table words per entry, at least: a load factor ≤ 1/2 keeps linear probes short.
const SLACK: usize = 2;

/// The endpoint → slot table.
#[derive(Debug, Clone)]
pub struct EndpointIndex {
    /// `key << 16 | (slot + 1)`, 0 for an empty word.
    words: Vec<u64>,
    /// `words.len() - 1` (a power of two minus one).
    mask: usize,
    /// Bits of the hash's top kept as the first probe (log2 of `words.len()`).
    shift: u32,
    len: usize,
}

fn key(a: &SocketAddrV4) -> u64 {
    u64::from(u32::from(*a.ip())) << 16 | u64::from(a.port())
}

impl EndpointIndex {
    /// A table of `entries` (endpoint, slot). `None` if there are more than
    /// [`ENDPOINTS_MAX`], a slot is above it, or an endpoint is listed twice.
    pub fn new(entries: &[(SocketAddrV4, usize)]) -> Option<EndpointIndex> {
        if entries.len() > ENDPOINTS_MAX {
            return None;
        }
        let size = (entries.len() * SLACK).next_power_of_two().max(16);
        let mut t = EndpointIndex {
            words: vec![0; size],
            mask: size - 1,
            shift: 64 - size.trailing_zeros(),
            len: 0,
        };
        for (a, slot) in entries {
            if *slot >= ENDPOINTS_MAX || !t.insert(key(a), *slot) {
                return None;
            }
        }
        Some(t)
    }

    fn first(&self, k: u64) -> usize {
        (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    fn insert(&mut self, k: u64, slot: usize) -> bool {
        let mut i = self.first(k);
        loop {
            let w = self.words[i];
            if w == 0 {
                self.words[i] = k << 16 | (slot as u64 + 1);
                self.len += 1;
                return true;
            }
            if w >> 16 == k {
                return false;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The slot of `from`, if it is one of the table's endpoints.
    pub fn get(&self, from: &SocketAddr) -> Option<usize> {
        let SocketAddr::V4(a) = from else {
            return None;
        };
        let k = key(a);
        let mut i = self.first(k);
        // The table is never full (load ≤ 1/2), so an empty word ends every probe.
        loop {
            let w = self.words[i];
            if w == 0 {
                return None;
            }
            if w >> 16 == k {
                return Some((w & 0xffff) as usize - 1);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Ask the CPU to bring `from`'s first bucket into cache (a hint: no effect on
    /// results, nothing on targets without a prefetch instruction).
    pub fn prefetch(&self, from: &SocketAddr) {
        if let SocketAddr::V4(a) = from {
            prefetch(&self.words[self.first(key(a))]);
        }
    }

    /// Entries in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table has no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slots in the table, in no particular order.
    pub fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.words
            .iter()
            .filter(|&&w| w != 0)
            .map(|&w| (w & 0xffff) as usize - 1)
    }
}

/// Bytes of a cache line, the stride of [`prefetch_lines`].
const CACHE_LINE: usize = 64;

/// Ask for every cache line of the `size` bytes at `p` (a hint, never a fault).
pub(crate) fn prefetch_lines<T>(p: *const T, size: usize) {
    let p = p.cast::<u8>();
    for off in (0..size).step_by(CACHE_LINE) {
        prefetch(p.wrapping_add(off));
    }
}

/// Ask the CPU to bring the cache line holding `p` closer (a hint, never a fault).
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 does not fault, whatever the address; SSE is part of the
    // x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::net::Ipv4Addr;

    fn ep(i: u32, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::from(0x0a00_0000 + i), port)
    }

    #[test]
    fn every_endpoint_finds_its_slot_and_others_find_none() {
        // 1,024 back-ends as a lab would number them, plus neighbours that must miss:
        // the same address on another port, the next address, an IPv6 source.
        let entries: Vec<_> = (0..1024).map(|i| (ep(i, 7471), i as usize)).collect();
        let t = EndpointIndex::new(&entries).expect("fits");
        assert_eq!(t.len(), 1024);
        for (a, s) in &entries {
            assert_eq!(t.get(&SocketAddr::V4(*a)), Some(*s));
            t.prefetch(&SocketAddr::V4(*a));
        }
        assert_eq!(t.get(&SocketAddr::V4(ep(3, 7472))), None);
        assert_eq!(t.get(&SocketAddr::V4(ep(1024, 7471))), None);
        assert_eq!(t.get(&"[::1]:7471".parse().unwrap()), None);
        let mut slots: Vec<_> = t.slots().collect();
        slots.sort_unstable();
        assert_eq!(slots, (0..1024).collect::<Vec<_>>());
    }

    #[test]
    fn agrees_with_a_hash_map_on_random_endpoints() {
        // A seeded xorshift: endpoints spread over addresses and ports, some colliding
        // in their first bucket; every lookup must agree with std's map.
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut m = HashMap::new();
        while m.len() < 700 {
            let r = next();
            let n = m.len();
            m.entry(SocketAddrV4::new(
                Ipv4Addr::from(r as u32),
                (r >> 32) as u16,
            ))
            .or_insert(n);
        }
        let entries: Vec<_> = m.iter().map(|(a, s)| (*a, *s)).collect();
        let t = EndpointIndex::new(&entries).expect("fits");
        for _ in 0..20_000 {
            let r = next();
            let a = if r & 1 == 0 {
                entries[(r >> 1) as usize % entries.len()].0
            } else {
                SocketAddrV4::new(Ipv4Addr::from((r >> 8) as u32), (r >> 40) as u16)
            };
            assert_eq!(t.get(&SocketAddr::V4(a)), m.get(&a).copied(), "{a}");
        }
    }

    #[test]
    fn duplicates_and_slots_out_of_range_are_refused() {
        assert!(EndpointIndex::new(&[(ep(1, 1), 0), (ep(1, 1), 1)]).is_none());
        assert!(EndpointIndex::new(&[(ep(1, 1), ENDPOINTS_MAX)]).is_none());
        let empty = EndpointIndex::new(&[]).expect("empty");
        assert!(empty.is_empty());
        assert_eq!(empty.get(&SocketAddr::V4(ep(1, 1))), None);
    }
}
