//! How a body gets into registered memory, three ways (`--rdma-registration`):
//!
//! - **dynamic** (the seed paper's "dynamic"): register a region per request, copy the
//!   body in, deregister when the transfer ends. Its bytes count against the budget
//!   for the transfer only.
//! - **static** (the paper's "static"): each RDMA connection registers one region of
//!   `--rdma-transfer-bytes-max` on its first transfer and copies every body into it;
//!   the region is held (and counted) for the connection's life.
//! - **cache** (beyond the paper): a file's contents are registered once and shared,
//!   without a copy, by every connection that serves it
//!   ([`farside_iwarp::verbs::Device::reg_shared`]). Entries are keyed by the file's
//!   identity (device, inode) and checked against its size and modification time: a
//!   changed file misses and replaces its entry. Cached bytes are held against the
//!   registered-bytes budget; a miss that does not fit evicts the least recently used
//!   entries no transfer is using, else the body is served uncached (as dynamic).

use crate::caps::{Budget, Reservation};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Most files the cache holds, whatever their size: bounds the map and its scans.
pub const CACHE_ENTRIES_MAX: usize = 4096;

/// The registration strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Registration {
    #[default]
    Dynamic,
    Static,
    Cache,
}

/// A file's identity and version, from `fstat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i128,
}

impl FileKey {
    /// The key of an open file's metadata.
    pub fn of(meta: &std::fs::Metadata) -> FileKey {
        use std::os::unix::fs::MetadataExt;
        FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

struct Entry {
    key: FileKey,
    bytes: Arc<[u8]>,
    last_used: u64,
    _reservation: Reservation,
}

/// Registered file contents, shared by the connections. See the module doc.
#[derive(Default)]
pub struct Cache {
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    entries: HashMap<(u64, u64), Entry>,
    clock: u64,
    hits: u64,
    misses: u64,
}

/// What [`Cache::get`] found.
pub struct Cached {
    pub bytes: Arc<[u8]>,
    pub hit: bool,
    /// In the cache (and counted in the budget by it); else the caller counts them.
    pub held: bool,
}

impl Cache {
    /// The registered contents of the file `key` whose bytes are `body`: the cached
    /// ones if the file has not changed, else `body` registered now (and cached if the
    /// budget allows).
    pub fn get(&self, budget: &Arc<Budget>, key: FileKey, body: &[u8]) -> Cached {
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        c.clock += 1;
        let now = c.clock;
        let id = (key.dev, key.ino);
        if let Some(e) = c.entries.get_mut(&id) {
            if e.key == key {
                e.last_used = now;
                let bytes = Arc::clone(&e.bytes);
                c.hits += 1;
                return Cached {
                    bytes,
                    hit: true,
                    held: true,
                };
            }
            // The file changed: its old contents are never served again.
            c.entries.remove(&id);
        }
        c.misses += 1;
        let bytes: Arc<[u8]> = Arc::from(body);
        let len = body.len() as u64;
        let reservation = loop {
            if c.entries.len() < CACHE_ENTRIES_MAX {
                if let Some(r) = budget.reserve(len) {
                    break Some(r);
                }
            }
            // Evict the least recently used entry no transfer holds.
            let victim = c
                .entries
                .iter()
                .filter(|(_, e)| Arc::strong_count(&e.bytes) == 1)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(id, _)| *id);
            match victim {
                Some(v) => {
                    c.entries.remove(&v);
                }
                None => break None,
            }
        };
        let held = reservation.is_some();
        if let Some(r) = reservation {
            c.entries.insert(
                id,
                Entry {
                    key,
                    bytes: Arc::clone(&bytes),
                    last_used: now,
                    _reservation: r,
                },
            );
        }
        Cached {
            bytes,
            hit: false,
            held,
        }
    }

    /// (hits, misses, entries).
    pub fn stats(&self) -> (u64, u64, usize) {
        let c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (c.hits, c.misses, c.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::Caps;

    fn key(ino: u64, mtime_ns: i128) -> FileKey {
        FileKey {
            dev: 1,
            ino,
            size: 4,
            mtime_ns,
        }
    }

    #[test]
    fn hits_until_the_file_changes() {
        let b = Budget::new(Caps::default());
        let c = Cache::default();
        assert!(!c.get(&b, key(1, 10), b"aaaa").hit);
        let hit = c.get(&b, key(1, 10), b"zzzz");
        assert!(hit.hit);
        assert_eq!(&hit.bytes[..], b"aaaa");
        let changed = c.get(&b, key(1, 11), b"bbbb");
        assert!(!changed.hit);
        assert_eq!(&changed.bytes[..], b"bbbb");
        assert_eq!(c.stats(), (1, 2, 1));
        assert_eq!(b.registered_bytes(), 4);
    }

    #[test]
    fn stays_under_the_budget_evicting_unused_entries() {
        let b = Budget::new(Caps {
            transfer_bytes_max: 8,
            registered_bytes_max: 8,
            ..Caps::default()
        });
        let c = Cache::default();
        c.get(&b, key(1, 0), b"1111");
        let held = c.get(&b, key(2, 0), b"2222");
        // Full: 3 evicts 1 (unused), not 2 (a transfer holds it).
        c.get(&b, key(3, 0), b"3333");
        assert!(c.get(&b, key(2, 0), b"").hit);
        assert!(!c.get(&b, key(1, 0), b"1111").hit);
        assert!(b.registered_bytes() <= 8);
        drop(held);
        // Everything held: a miss is served uncached.
        let _h2 = c.get(&b, key(2, 0), b"");
        let _h1 = c.get(&b, key(1, 0), b"1111");
        let extra = c.get(&b, key(9, 0), b"9999");
        assert!(!extra.hit && !extra.held && &extra.bytes[..] == b"9999");
        assert!(b.registered_bytes() <= 8);
    }
}
