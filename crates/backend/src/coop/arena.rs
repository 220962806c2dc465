//! The node's cached bodies mirrored into its object arena (`farside_arena`), where a
//! peer reads them without this node's process: an XDP-answered BPF map (`--coop-peer
//! xdp`, the rmem responder answers authenticated arena READs in the kernel) or a file
//! under `--coop-shm-dir` that peers on the same host map read-only (`--coop-peer shm`).
//!
//! The node's cache ([`farside_coop::cache::NodeCache`]) decides what is cached; every
//! object it takes that fits [`OBJECT_BYTES_MAX`] is written into a slot (seqlock
//! protocol) and indexed under [`arena_key`] of its object id, and every object it evicts
//! is evicted here (slot invalidated first). When a size class has no free slot left the
//! oldest arena object of that class is dropped from the arena only (the node still
//! serves it; a peer that asks reads "not indexed" and goes to its disk): counted.
//!
//! Layout rule ([`layout_for`]): every class up to the one-sided bound gets the slots
//! that would let the whole cache be objects of that class (capped at
//! [`CLASS_SLOTS_MAX`], half the index), scaled down together if that exceeds the arena's
//! chunks. A reader needs no layout: an object sits in the smallest class that holds it.
//!
//! Read stamps: a peer's one-sided read schedules no process of this node, so this
//! node's cache would not see the hit and could evict a body its peers read often.
//! Every arena read therefore adds one to a counter of the chunk it reads, where the
//! owner can see it without a message: the XDP program's `rmem_arena_reads` map
//! (`farside_xdp::ArenaMemory::take_reads`), or for shm a second file beside the arena
//! (`node-i.reads`, one u64 per chunk) that readers map writable and add to after they
//! read an object. [`NodeArena::take_read_objects`] swaps the counters of each object's
//! first chunk to zero and names the objects read since its last call; the node treats
//! them as recently used before it picks eviction victims.

use farside_arena::layout::{
    class_object_bytes_max, ArenaLayout, ARENA_CHUNKS_MAX, CHUNK_BYTES, CLASS_COUNT, INDEX_BUCKETS,
};
use farside_arena::store::PutError;
use farside_arena::{map_chunks, ArenaMap, INDEX_CHUNKS, SLOTS_BASE};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Largest body kept in the arena and read one-sidedly: the arena's own rule (class 6,
/// 89,568 B: a larger body takes over 64 READs, where asking the owner over TCP is
/// cheaper). Larger bodies are fetched over TCP whatever `--coop-peer` says.
pub const OBJECT_BYTES_MAX: usize = farside_arena::layout::OBJECT_BYTES_MAX;
/// Slots of one class at most: half the index's buckets (probing stays short below half
/// load, and no more objects than that can be indexed well anyway).
pub const CLASS_SLOTS_MAX: u64 = (INDEX_BUCKETS / 2) as u64;

/// The key an object is indexed under in the arena: its object id (FNV-1a of the path,
/// [`super::wire::object_id`]), moved off the two hashes the index reserves exactly as
/// `farside_arena::url_hash` does, and off [`DIRECTORY_KEY`]; so it equals
/// `url_hash(path)` for every path but one whose hash is `u64::MAX` or [`DIRECTORY_KEY`]
/// (both moved to `u64::MAX - 2`: a 64-bit hash collision, as two paths with one FNV
/// hash already are).
pub fn arena_key(object: u64) -> u64 {
    match object {
        0 => 1,
        u64::MAX | DIRECTORY_KEY => u64::MAX - 2,
        h => h,
    }
}

/// The key of the node's own directory record in its arena (`--coop-directory read`):
/// a key [`arena_key`] never returns, whatever the object id (it maps that one value
/// elsewhere, as it maps the index's empty and tombstone hashes), so the record cannot
/// collide with an object, nor an object with it. Its content is the published
/// directory update ([`super::wire::DirectoryUpdate`]), validated by a reader like a
/// body (seqlock, length, CRC32c under this key) and then as a record (kind, node,
/// epoch).
pub const DIRECTORY_KEY: u64 = u64::MAX - 1;

/// Slots kept aside for the directory record in each class it may take (its size
/// follows the Bloom filter's, up to [`super::wire::DIRECTORY_BYTES_MAX`]): two, since
/// a put writes the new copy into a free slot before it frees the old one. Objects may
/// still take them; then a directory put drops the oldest object of the class from the
/// arena (counted as `dropped`), as an object's put does.
pub const DIRECTORY_SLOTS: u32 = 2;

/// The classes a directory record may take: 0 up to the class of
/// [`super::wire::DIRECTORY_BYTES_MAX`].
fn directory_classes() -> std::ops::RangeInclusive<usize> {
    0..=farside_arena::layout::class_for_len(super::wire::DIRECTORY_BYTES_MAX)
        .expect("the largest directory fits a class")
}

/// The arena layout of a node caching `cache_bytes` (see the module doc).
pub fn layout_for(cache_bytes: u64) -> ArenaLayout {
    layout_with(cache_bytes, false)
}

/// As [`layout_for`], with `directory`: [`DIRECTORY_SLOTS`] more slots in every class a
/// directory record may take (`--coop-directory read`).
pub fn layout_with(cache_bytes: u64, directory: bool) -> ArenaLayout {
    layout_reserving(cache_bytes, directory, 0)
}

/// As [`layout_with`], leaving `top` chunks free at the top of the arena (the directory
/// slots of `--coop-directory write`, [`super::dirwrite::RESERVED_CHUNKS`]).
pub fn layout_reserving(cache_bytes: u64, directory: bool, top: usize) -> ArenaLayout {
    let reserve: [u64; CLASS_COUNT] = std::array::from_fn(|c| {
        if directory && directory_classes().contains(&c) {
            u64::from(DIRECTORY_SLOTS)
        } else {
            0
        }
    });
    let mut slots = [0u64; CLASS_COUNT];
    for (c, s) in slots.iter_mut().enumerate() {
        if class_object_bytes_max(c) > OBJECT_BYTES_MAX {
            break;
        }
        let min = if c == 0 {
            1
        } else {
            class_object_bytes_max(c - 1) as u64 + 1
        };
        if min > cache_bytes {
            break;
        }
        *s = cache_bytes.div_ceil(min).min(CLASS_SLOTS_MAX);
    }
    let reserved: u64 = (0..CLASS_COUNT).map(|c| reserve[c] << c).sum();
    let budget = (ARENA_CHUNKS_MAX - INDEX_CHUNKS - top) as u64 - reserved;
    let chunks: u64 = (0..CLASS_COUNT).map(|c| slots[c] << c).sum();
    let mut out = [0u32; CLASS_COUNT];
    for c in 0..CLASS_COUNT {
        let s = if chunks > budget {
            slots[c] * budget / chunks
        } else {
            slots[c]
        };
        out[c] = (s + reserve[c]) as u32;
    }
    ArenaLayout::new(out).expect("scaled within the arena's chunks")
}

/// Where the arena's memory lives.
pub enum Backing {
    /// The BPF map of the node's XDP responder (kept loaded and attached here).
    Xdp {
        _responder: Box<farside_xdp::XdpResponder>,
        mem: Arc<Mutex<farside_xdp::ArenaMemory>>,
    },
    /// A shared file mapping (peers on the same host map the file read-only), and the
    /// read stamps' file (peers map it writable and add to it).
    Shm {
        map: ShmMap,
        path: PathBuf,
        reads: ShmMap,
        reads_path: PathBuf,
    },
}

/// The file of node `index`'s arena under `dir`.
pub fn shm_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("node-{index}.arena"))
}

/// The file of node `index`'s read stamps under `dir` (one u64 per arena chunk).
pub fn shm_reads_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("node-{index}.reads"))
}

/// Bytes of one read stamp (a u64 per chunk).
pub const READ_STAMP_BYTES: usize = 8;

/// The arena chunk a slot (slot-area offset, as index buckets hold it) starts in: the
/// chunk whose read stamp says the object was read.
pub fn head_chunk(slot_offset: u32) -> usize {
    (SLOTS_BASE + slot_offset as usize) / CHUNK_BYTES
}

/// A shared mapping of a file, writable by its owner or read-only for a peer.
pub struct ShmMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value until drop; writers hold the
// node's state lock, readers validate what they copy (seqlock and CRC32c).
unsafe impl Send for ShmMap {}
// SAFETY: as above; `&ShmMap` only hands out copies (`copy_to`).
unsafe impl Sync for ShmMap {}

impl ShmMap {
    /// Creates `path` afresh with `len` zero bytes, mode 0600, mapped writable. An
    /// older file there (a crashed owner's) is unlinked first, never truncated: a peer
    /// still mapping it keeps reading its old, valid bytes instead of faulting on pages
    /// that truncation would take away.
    pub fn create(path: &Path, len: usize) -> io::Result<ShmMap> {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        f.set_len(len as u64)?;
        ShmMap::map(&f, len, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// Maps a peer's read stamps file writable (its whole length: a u64 per chunk of
    /// an arena, at most [`ARENA_CHUNKS_MAX`]).
    pub fn open_stamps(path: &Path) -> io::Result<ShmMap> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let len = f.metadata()?.len() as usize;
        if len == 0
            || !len.is_multiple_of(READ_STAMP_BYTES)
            || len > ARENA_CHUNKS_MAX * READ_STAMP_BYTES
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {len} bytes are no read stamps", path.display()),
            ));
        }
        ShmMap::map(&f, len, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// Maps a peer's arena file read-only (its whole length, at least the index).
    pub fn open_read_only(path: &Path) -> io::Result<ShmMap> {
        let f = std::fs::File::open(path)?;
        let len = f.metadata()?.len() as usize;
        if !(INDEX_CHUNKS * CHUNK_BYTES..=ARENA_CHUNKS_MAX * CHUNK_BYTES).contains(&len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {len} bytes is no arena", path.display()),
            ));
        }
        ShmMap::map(&f, len, libc::PROT_READ)
    }

    fn map(f: &std::fs::File, len: usize, prot: libc::c_int) -> io::Result<ShmMap> {
        // SAFETY: a fresh shared mapping of an open file of at least `len` bytes; the
        // kernel picks the address; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(ShmMap {
            ptr: ptr.cast(),
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `[offset, offset + out.len())` out; false if out of bounds. The owner may
    /// be writing it: the caller validates (seqlock, CRC32c) before using the bytes.
    pub fn copy_to(&self, offset: usize, out: &mut [u8]) -> bool {
        if offset.checked_add(out.len()).is_none_or(|e| e > self.len) {
            return false;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        // SAFETY: within the mapping (checked above), which lives as long as self.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), out.as_mut_ptr(), out.len()) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        true
    }

    /// The u64 stamp `i` of a writable mapping ([`ShmMap::create`],
    /// [`ShmMap::open_stamps`]); None beyond the mapping.
    fn stamp(&self, i: usize) -> Option<&std::sync::atomic::AtomicU64> {
        let end = i.checked_add(1)?.checked_mul(READ_STAMP_BYTES)?;
        if end > self.len {
            return None;
        }
        // SAFETY: within the mapping (checked), 8-aligned (the mapping is page-aligned),
        // alive as long as self; every process accesses stamps atomically only.
        Some(unsafe { std::sync::atomic::AtomicU64::from_ptr(self.ptr.cast::<u64>().add(i)) })
    }

    /// Adds one to read stamp `i` (a reader, after reading an object whose first chunk
    /// is `i`); false beyond the mapping.
    pub fn add_read(&self, i: usize) -> bool {
        self.stamp(i)
            .map(|s| s.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
            .is_some()
    }

    /// Read stamp `i`, swapped to zero (the owner); 0 beyond the mapping.
    pub fn take_reads(&self, i: usize) -> u64 {
        self.stamp(i)
            .map_or(0, |s| s.swap(0, std::sync::atomic::Ordering::Relaxed))
    }

    /// The whole mapping, writable: only for the owner (mapped by [`ShmMap::create`]),
    /// under the node's state lock, with the seqlock protocol.
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes, lives as long as self, and &mut self makes
        // this the only view of it in this process.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for ShmMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// What the arena counts (read into the node's `/coop/stats`).
#[derive(Debug, Default, Clone, Copy)]
pub struct ArenaCounts {
    /// Objects written into the arena.
    pub put: u64,
    /// Objects the cache took that the arena could not hold (class full: the oldest of
    /// the class dropped from the arena; or the index's probe window full).
    pub dropped: u64,
    /// Objects above [`OBJECT_BYTES_MAX`] (served to peers over TCP).
    pub too_large: u64,
    /// Directory records written (`--coop-directory read`).
    pub directory_put: u64,
}

/// The node's arena: its memory, free slots and index, the put order per class, and
/// each indexed object's id and first chunk (for its read stamp).
pub struct NodeArena {
    map: ArenaMap,
    backing: Backing,
    order: [VecDeque<u64>; CLASS_COUNT],
    /// arena key -> (object id, first chunk of its slot).
    objects: HashMap<u64, (u64, usize)>,
    pub counts: ArenaCounts,
}

impl NodeArena {
    /// `arena_xdp_<status> N` lines for every status the node's XDP responder has
    /// answered (or dropped) a request with, summed over CPUs; empty for a shm arena.
    /// What an operator reads when a peer's READ or WRITE goes unanswered.
    pub fn xdp_status_text(&self) -> String {
        let Backing::Xdp { _responder, .. } = &self.backing else {
            return String::new();
        };
        let (_, status) = _responder.counters();
        farside_rmem::wire::Status::ALL
            .iter()
            .zip(status)
            .filter(|(_, n)| *n > 0)
            .map(|(st, n)| format!("arena_xdp_{} {n}\n", st.name()))
            .collect()
    }

    /// The arena of a node caching `cache_bytes`, answered by an XDP responder on
    /// `iface` (generic mode) at udp `port` for readers holding `key` (`ID[:PATH]`);
    /// `directory`: with room for the directory record ([`layout_with`]); `writers`
    /// (`--coop-directory write`): the cluster's coop key, its size and this node's
    /// index: the peers' directory slots at the top of a whole-size arena, each writable
    /// by its peer's key only ([`super::dirwrite`]).
    pub fn xdp(
        cache_bytes: u64,
        directory: bool,
        iface: &str,
        port: u16,
        key: &str,
        writers: Option<(&farside_auth::siphash::SipKey, usize, usize)>,
    ) -> io::Result<NodeArena> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        let (id, path) = farside_rmem::ClientKey::parse_spec(key).map_err(bad)?;
        let mut keys = farside_rdmahttp::arena::arena_keyring(id, path.as_deref()).map_err(bad)?;
        let top = if let Some((coop, nodes, me)) = writers {
            super::dirwrite::install_writers(&mut keys, coop, nodes, me).map_err(bad)?;
            super::dirwrite::RESERVED_CHUNKS
        } else {
            0
        };
        let layout = layout_reserving(cache_bytes, directory, top);
        let mut chunks = map_chunks(&layout).map_err(|e| bad(e.to_string()))? as u32;
        if writers.is_some() {
            chunks = ARENA_CHUNKS_MAX as u32;
        }
        let mut xdp = farside_xdp::XdpResponder::load_with_arena(port, &keys, chunks)
            .map_err(|e| io::Error::other(format!("coop arena responder: {e}")))?;
        xdp.attach_to(iface, farside_xdp::XdpMode::Generic)
            .map_err(|e| io::Error::other(format!("coop arena responder on {iface}: {e}")))?;
        let mem = xdp.arena();
        NodeArena::new(
            layout,
            Backing::Xdp {
                _responder: Box::new(xdp),
                mem,
            },
        )
    }

    /// The arena of node `index` caching `cache_bytes`, in a file under `dir`;
    /// `directory`: with room for the directory record ([`layout_with`]).
    pub fn shm(
        cache_bytes: u64,
        directory: bool,
        dir: &Path,
        index: usize,
    ) -> io::Result<NodeArena> {
        let layout = layout_with(cache_bytes, directory);
        let chunks = map_chunks(&layout)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let path = shm_path(dir, index);
        let reads_path = shm_reads_path(dir, index);
        let reads = ShmMap::create(&reads_path, chunks * READ_STAMP_BYTES)?;
        let map = ShmMap::create(&path, chunks * CHUNK_BYTES)?;
        NodeArena::new(
            layout,
            Backing::Shm {
                map,
                path,
                reads,
                reads_path,
            },
        )
    }

    fn new(layout: ArenaLayout, backing: Backing) -> io::Result<NodeArena> {
        let map = ArenaMap::new(layout)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        Ok(NodeArena {
            map,
            backing,
            order: Default::default(),
            objects: HashMap::new(),
            counts: ArenaCounts::default(),
        })
    }

    pub fn layout(&self) -> &ArenaLayout {
        self.map.layout()
    }

    fn with_mem<R>(&mut self, f: impl FnOnce(&mut ArenaMap, &mut [u8]) -> R) -> R {
        match &mut self.backing {
            Backing::Xdp { mem, .. } => {
                let mut m = mem.lock().unwrap_or_else(|p| p.into_inner());
                f(&mut self.map, m.bytes_mut())
            }
            Backing::Shm { map, .. } => f(&mut self.map, map.bytes_mut()),
        }
    }

    /// Read stamp of `chunk`, swapped to zero.
    fn take_reads(&self, chunk: usize) -> u64 {
        let mut one = 0;
        self.take_each(std::iter::once(chunk), |_, n| one = n);
        one
    }

    /// Swaps the read stamps of `chunks` to zero, `f(i, stamp)` for the i-th (one lock of
    /// the XDP memory for all).
    fn take_each(&self, chunks: impl Iterator<Item = usize>, mut f: impl FnMut(usize, u64)) {
        match &self.backing {
            Backing::Xdp { mem, .. } => {
                let m = mem.lock().unwrap_or_else(|p| p.into_inner());
                chunks.enumerate().for_each(|(i, c)| f(i, m.take_reads(c)));
            }
            Backing::Shm { reads, .. } => chunks
                .enumerate()
                .for_each(|(i, c)| f(i, reads.take_reads(c))),
        }
    }

    /// The objects peers read one-sidedly since the last call (their first chunk's read
    /// stamp was not zero; every stamp looked at is reset). At most one entry per
    /// object in the arena, whose count the layout bounds.
    pub fn take_read_objects(&mut self) -> Vec<u64> {
        let objects: Vec<(u64, usize)> = self.objects.values().copied().collect();
        let mut read = Vec::new();
        self.take_each(objects.iter().map(|&(_, c)| c), |i, n| {
            if n > 0 {
                read.push(objects[i].0);
            }
        });
        read
    }

    /// Writes `object`'s body into the arena (replacing an older copy).
    pub fn put(&mut self, object: u64, body: &[u8]) {
        if body.len() > OBJECT_BYTES_MAX {
            self.counts.too_large += 1;
            return;
        }
        let key = arena_key(object);
        loop {
            match self.with_mem(|map, mem| map.put(mem, key, body)) {
                Ok(b) => {
                    let class = farside_arena::layout::class_for_len(b.len as usize)
                        .expect("put objects have a class");
                    let chunk = head_chunk(b.offset);
                    // Reads of the slot's previous object are not this one's.
                    self.take_reads(chunk);
                    self.objects.insert(key, (object, chunk));
                    self.order[class].push_back(key);
                    self.counts.put += 1;
                    return;
                }
                Err(PutError::NoSlot { class }) => {
                    let Some(old) = self.order[class].pop_front() else {
                        self.counts.dropped += 1;
                        return;
                    };
                    if self.with_mem(|map, mem| map.evict(mem, old)) {
                        self.counts.dropped += 1;
                    }
                    self.objects.remove(&old);
                }
                Err(PutError::TooLarge | PutError::IndexFull) => {
                    self.counts.dropped += 1;
                    return;
                }
            }
        }
    }

    /// Writes this node's directory record (the encoded
    /// [`super::wire::DirectoryUpdate`]) under [`DIRECTORY_KEY`] through the same
    /// seqlock + CRC32c put as a body, replacing the previous record (the new copy is
    /// written into a free slot and indexed before the old slot is freed, so a reader
    /// finds a whole record, the old or the new). The record is in no class's put order
    /// and has no read stamp, so no object's put ever drops it. When its class has no
    /// free slot, the oldest object of the class leaves the arena (counted as
    /// `dropped`). False if it could not be written (too large, or the index's probe
    /// window full): peers then keep the previous record until it ages out.
    pub fn put_directory(&mut self, record: &[u8]) -> bool {
        if record.len() > super::wire::DIRECTORY_BYTES_MAX {
            return false;
        }
        loop {
            match self.with_mem(|map, mem| map.put(mem, DIRECTORY_KEY, record)) {
                Ok(_) => {
                    self.counts.directory_put += 1;
                    return true;
                }
                Err(PutError::NoSlot { class }) => {
                    let Some(old) = self.order[class].pop_front() else {
                        return false;
                    };
                    if self.with_mem(|map, mem| map.evict(mem, old)) {
                        self.counts.dropped += 1;
                    }
                    self.objects.remove(&old);
                }
                Err(PutError::TooLarge | PutError::IndexFull) => return false,
            }
        }
    }

    /// `--coop-directory write`: the record peer `j` wrote into its slot of this node's
    /// arena, with its sequence (see [`super::dirwrite::read_slot`]); only with the XDP
    /// backing (shm arenas have no slots).
    pub fn directory_slot(
        &mut self,
        j: usize,
    ) -> Result<(u64, Vec<u8>), super::dirwrite::SlotRefusal> {
        match &mut self.backing {
            Backing::Xdp { mem, .. } => {
                let mut m = mem.lock().unwrap_or_else(|p| p.into_inner());
                super::dirwrite::read_slot(m.bytes_mut(), j)
            }
            Backing::Shm { .. } => Err(super::dirwrite::SlotRefusal::Empty),
        }
    }

    /// Evicts `object` from the arena (its slot invalidated: a reader holding an old
    /// hint reads it as stale).
    pub fn evict(&mut self, object: u64) {
        let key = arena_key(object);
        self.objects.remove(&key);
        if self.with_mem(|map, mem| map.evict(mem, key)) {
            for q in &mut self.order {
                if let Some(i) = q.iter().position(|&k| k == key) {
                    q.remove(i);
                    break;
                }
            }
        }
    }
}

impl Drop for NodeArena {
    fn drop(&mut self) {
        if let Backing::Shm {
            path, reads_path, ..
        } = &self.backing
        {
            let _ = std::fs::remove_file(path);
            let _ = std::fs::remove_file(reads_path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_key_is_the_arena_url_hash_of_the_path() {
        for p in ["/", "/a", "/english/images/x.gif"] {
            assert_eq!(
                arena_key(super::super::wire::object_id(p)),
                farside_arena::url_hash(p.as_bytes())
            );
        }
        assert_eq!(arena_key(0), 1);
        assert_eq!(arena_key(u64::MAX), u64::MAX - 2);
        // No object id is indexed under the directory's key.
        for id in [DIRECTORY_KEY, u64::MAX, 0, 1, DIRECTORY_KEY - 1] {
            assert_ne!(arena_key(id), DIRECTORY_KEY, "{id}");
        }
    }

    /// The directory record (`--coop-directory read`): written through the seqlock put,
    /// read back whole by a peer's mapping, replaced by the next one, never shadowed by
    /// an object (even one whose id is the directory key), and a write cut short reads
    /// as torn, never as a record.
    #[test]
    fn the_directory_record_round_trips_and_a_torn_write_is_detected() {
        use super::super::onesided::read_mapped;
        use super::super::wire::{DirectoryUpdate, DIRECTORY_BYTES_MAX};
        use farside_arena::{write_steps, ReadError, SlotRef};
        let dir = std::env::temp_dir().join(format!("farside-coop-dirrec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A tiny cache: without the reserve, classes 2 and 3 would have no slot.
        let mut a = NodeArena::shm(3_000, true, &dir, 0).unwrap();
        for c in directory_classes() {
            assert!(
                a.layout().slots_per_class[c] >= DIRECTORY_SLOTS,
                "class {c}"
            );
        }
        assert!(map_chunks(&layout_with(1 << 30, true)).is_ok());
        let record = |objects: usize, epoch: u64| {
            let mut filter = farside_coop::directory::BloomFilter::for_objects(objects, 0.01);
            filter.insert(epoch);
            DirectoryUpdate {
                node: 0,
                load: 3,
                epoch,
                filter,
            }
            .encode()
        };
        let peer = ShmMap::open_read_only(&shm_path(&dir, 0)).unwrap();
        let small = record(10, 2);
        assert!(a.put_directory(&small));
        assert_eq!(read_mapped(&peer, DIRECTORY_KEY), Ok(Some(small.clone())));
        // An object whose id is the directory key lives under another key.
        a.put(DIRECTORY_KEY, &[7u8; 500]);
        assert_eq!(read_mapped(&peer, DIRECTORY_KEY), Ok(Some(small)));
        // The largest record (another class) replaces it.
        let big = record(1_000_000, 4);
        assert!(big.len() <= DIRECTORY_BYTES_MAX && big.len() > 8_000);
        assert!(a.put_directory(&big));
        assert_eq!(read_mapped(&peer, DIRECTORY_KEY), Ok(Some(big.clone())));
        assert_eq!(a.counts.directory_put, 2);
        // A write cut short in its slot (the owner died mid-write): torn, every time.
        let next = record(1_000_000, 6);
        let b = a
            .with_mem(|map, mem| map.lookup(mem, DIRECTORY_KEY))
            .unwrap();
        let slot = SlotRef::at(a.layout(), b.offset as usize).unwrap();
        let (steps, _) = a.with_mem(|_, mem| {
            write_steps(&mem[SLOTS_BASE..], slot, DIRECTORY_KEY, &next, 1_000).unwrap()
        });
        a.with_mem(|_, mem| {
            for st in &steps[..5] {
                farside_arena::slot::apply(&mut mem[SLOTS_BASE..], st);
            }
        });
        assert_eq!(read_mapped(&peer, DIRECTORY_KEY), Err(ReadError::Torn));
        a.with_mem(|_, mem| {
            for st in &steps[5..] {
                farside_arena::slot::apply(&mut mem[SLOTS_BASE..], st);
            }
        });
        assert_eq!(read_mapped(&peer, DIRECTORY_KEY), Ok(Some(next)));
        drop(a);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_layout_holds_the_cache_in_any_one_class_or_scales_down() {
        let c = 1_730_000u64;
        let l = layout_for(c);
        assert_eq!(l.slots_per_class[0] as u64, CLASS_SLOTS_MAX);
        for class in 1..=6 {
            let min = class_object_bytes_max(class - 1) as u64 + 1;
            assert_eq!(l.slots_per_class[class] as u64, c.div_ceil(min), "{class}");
        }
        assert!(l.slots_per_class[7..].iter().all(|&s| s == 0));
        let big = layout_for(1 << 30);
        assert!(map_chunks(&big).is_ok());
        assert!(big.slots_per_class[6] > 0);
        let tiny = layout_for(100);
        assert_eq!(tiny.slots_per_class[0], 100);
        assert_eq!(tiny.slots_per_class[1], 0);
    }

    #[test]
    fn a_shm_arena_mirrors_puts_and_evictions_and_a_full_class_drops_the_oldest() {
        let dir = std::env::temp_dir().join(format!("farside-coop-arena-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // 3,000 B of cache: class 0 gets 3,000 slots, class 1 (1,369..2,768 B) gets 3.
        let mut a = NodeArena::shm(3_000, false, &dir, 0).unwrap();
        assert_eq!(a.layout().slots_per_class[1], 3);
        let peer = ShmMap::open_read_only(&shm_path(&dir, 0)).unwrap();
        let lookup = |object: u64| {
            let key = arena_key(object);
            let mut window = Vec::new();
            for (o, l) in farside_arena::index::probe_window(key) {
                let mut b = vec![0; l];
                assert!(peer.copy_to(o, &mut b));
                window.extend(b);
            }
            farside_arena::index::lookup_in_window(&window, key)
        };
        for o in 1..=4u64 {
            a.put(o, &vec![o as u8; 2_000]);
        }
        assert_eq!((a.counts.put, a.counts.dropped), (4, 1));
        assert!(
            lookup(1).is_none(),
            "the oldest of the full class was dropped"
        );
        assert!(lookup(4).is_some());
        a.evict(4);
        assert!(lookup(4).is_none());
        a.put(5, &vec![0; OBJECT_BYTES_MAX + 1]);
        assert_eq!(a.counts.too_large, 1);
        drop(a);
        assert!(!shm_path(&dir, 0).exists(), "the owner removes its file");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
