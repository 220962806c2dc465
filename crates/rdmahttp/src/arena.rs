//! The server side of arena-reads: bodies put once into the node's object arena (a BPF
//! array map the rmem XDP responder answers READs from, `farside_xdp`), and answered
//! with a hint ([`ArenaHint`]: port, key id, slot, class, url hash, length) instead of
//! the body, so a client reads the body one-sidedly and no server process is scheduled
//! for it.
//!
//! ```text
//!  GET + RDMA: arena-reads, maxlen=N
//!    file's (dev, ino, size, mtime) in the arena? ── yes ─► 200, CL 0, RDMA: arena-reads, ...
//!    no: body ≤ maxlen and ≤ the largest slot ─► put (seqlock write) ─► the same answer
//!    else ─► the body over TCP, RDMA: declined, reason=...
//! ```
//!
//! An object is keyed by its file's identity and modification time, hashed into the url
//! hash the slot carries: a changed file is a new object, and the old one is never
//! answered for it (its slot's hash differs). When a size class has no free slot the
//! oldest object of that class is evicted (its slot invalidated first: a reader holding
//! its hint gets a stale read, never another body). Only file bodies are put; generated
//! ones go over TCP.
//!
//! The responder is this process's own: it loads the rmem XDP program with an arena
//! map of [`server_layout`]'s size and attaches it to `--rdma-arena-iface` (no other
//! XDP program may be attached there: on a node that runs gatherd's responder, gatherd
//! would create the arena map and hand it over like the region, which is not built).

use crate::header::{ArenaHint, Decline};
use crate::registration::FileKey;
use farside_arena::layout::{ArenaLayout, ARENA_REGION, CHUNK_BYTES, CLASS_COUNT};
use farside_arena::store::PutError;
use farside_arena::{map_chunks, ArenaMap, SLOTS_BASE};
use farside_auth::keys::{Keyring, Policy};
use farside_auth::mac::KeyId;
use farside_auth::rights::Rights;
use farside_xdp::{ArenaMemory, XdpMode, XdpResponder};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Slots per class of a server's arena: every body size of the RDMA-over-HTTP figures
/// (1 kB to 8 MB) with room for several of each; 64,512 chunks (90.3 MB with the
/// index), within `ARENA_CHUNKS_MAX`.
pub const SERVER_SLOTS: [u32; CLASS_COUNT] =
    [1024, 512, 256, 256, 128, 64, 32, 16, 8, 8, 12, 4, 2, 2];

/// The layout of [`SERVER_SLOTS`].
pub fn server_layout() -> ArenaLayout {
    ArenaLayout::new(SERVER_SLOTS).expect("SERVER_SLOTS fit ARENA_CHUNKS_MAX")
}

/// The url hash of a file's contents: its identity and modification time.
pub fn file_hash(k: &FileKey) -> u64 {
    let mut b = Vec::with_capacity(40);
    b.extend_from_slice(&k.dev.to_le_bytes());
    b.extend_from_slice(&k.ino.to_le_bytes());
    b.extend_from_slice(&k.size.to_le_bytes());
    b.extend_from_slice(&k.mtime_ns.to_le_bytes());
    farside_arena::url_hash(&b)
}

/// The server's key for arena readers: key `id` from `path` (or the credential
/// `rmem-<id>`), with rights naming the arena region only, READ only.
pub fn arena_keyring(id: u32, path: Option<&Path>) -> Result<Keyring, String> {
    let name = farside_rmem::auth::credential_name(id);
    let key = farside_auth::keys::load_key(&name, path, Policy::Production)
        .map_err(|e| format!("arena key {id}: {e}"))?
        .key;
    let mut ring = Keyring::new(Policy::Production);
    ring.install("arena-reader", KeyId(id), key, Rights::reader(ARENA_REGION))
        .map_err(|e| format!("arena key {id}: {e}"))?;
    Ok(ring)
}

struct State {
    map: ArenaMap,
    objects: HashMap<FileKey, ArenaHint>,
    /// Objects in the order they were put, per class (the eviction order).
    order: [VecDeque<FileKey>; CLASS_COUNT],
}

/// The node's arena and its responder, shared by the workers.
pub struct ArenaServer {
    _xdp: XdpResponder,
    mem: Arc<Mutex<ArenaMemory>>,
    state: Mutex<State>,
    port: u16,
    key: u32,
}

impl ArenaServer {
    /// Loads the responder with an arena of [`server_layout`], answering arena READs
    /// under `keys` on udp `port`, attached to `iface` in `mode`.
    pub fn start(
        iface: &str,
        mode: XdpMode,
        port: u16,
        key: u32,
        keys: &Keyring,
    ) -> Result<ArenaServer, String> {
        let layout = server_layout();
        let chunks = map_chunks(&layout).map_err(|e| e.to_string())? as u32;
        let mut xdp = XdpResponder::load_with_arena(port, keys, chunks)
            .map_err(|e| format!("arena responder: {e}"))?;
        xdp.attach_to(iface, mode)
            .map_err(|e| format!("arena responder on {iface}: {e}"))?;
        let mem = xdp.arena();
        let map = ArenaMap::new(layout).map_err(|e| e.to_string())?;
        Ok(ArenaServer {
            _xdp: xdp,
            mem,
            state: Mutex::new(State {
                map,
                objects: HashMap::new(),
                order: Default::default(),
            }),
            port,
            key,
        })
    }

    /// The hint of a file already in the arena, if its body fits `maxlen`.
    pub fn hint(&self, file: &FileKey, maxlen: u64) -> Option<ArenaHint> {
        let st = self.state.lock().expect("arena state");
        st.objects.get(file).copied().filter(|h| h.len <= maxlen)
    }

    /// Puts `body` (the contents of `file`) into the arena and answers its hint.
    pub fn put(&self, file: &FileKey, body: &[u8], maxlen: u64) -> Result<ArenaHint, Decline> {
        if body.len() as u64 > maxlen || body.len() > farside_arena::layout::SLOT_OBJECT_BYTES_MAX {
            return Err(Decline::TooLarge);
        }
        let mut st = self.state.lock().expect("arena state");
        if let Some(h) = st.objects.get(file) {
            return Ok(*h);
        }
        let hash = file_hash(file);
        let mut mem = self.mem.lock().expect("arena memory");
        let bytes = mem.bytes_mut();
        let bucket = loop {
            match st.map.put(bytes, hash, body) {
                Ok(b) => break b,
                Err(PutError::NoSlot { class }) => {
                    // Evict the oldest object of the class, then try again.
                    let Some(old) = st.order[class].pop_front() else {
                        return Err(Decline::Busy);
                    };
                    st.objects.remove(&old);
                    st.map.evict(bytes, file_hash(&old));
                }
                Err(PutError::TooLarge) => return Err(Decline::TooLarge),
                Err(PutError::IndexFull) => return Err(Decline::Busy),
            }
        };
        let class = st
            .map
            .layout()
            .class_at(bucket.offset as usize)
            .expect("the store puts objects in slots");
        let hint = ArenaHint {
            port: self.port,
            key: self.key,
            slot: bucket.offset.into(),
            class: class as u8,
            hash,
            len: body.len() as u64,
        };
        st.objects.insert(*file, hint);
        st.order[class].push_back(*file);
        Ok(hint)
    }

    /// Objects in the arena.
    pub fn objects(&self) -> usize {
        self.state.lock().expect("arena state").objects.len()
    }

    /// Map byte offset of the slot area (for tools reading the arena directly).
    pub fn slots_base() -> usize {
        SLOTS_BASE
    }

    /// Bytes of one chunk.
    pub fn chunk_bytes() -> usize {
        CHUNK_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_layout_holds_every_figure_size() {
        let l = server_layout();
        let chunks = map_chunks(&l).unwrap();
        assert!(chunks <= farside_arena::layout::ARENA_CHUNKS_MAX);
        for size in [
            1_024usize,
            4_096,
            32_768,
            131_072,
            512_000,
            1 << 20,
            8 << 20,
        ] {
            let c = farside_arena::layout::class_for_len(size).unwrap();
            assert!(l.slots_per_class[c] >= 2, "{size} B: class {c} has slots");
        }
        assert!(l.slots_per_class[farside_arena::layout::class_for_len(1 << 20).unwrap()] >= 5);
    }

    #[test]
    fn a_changed_file_is_another_object() {
        let k = FileKey {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: 4,
        };
        let k2 = FileKey { mtime_ns: 5, ..k };
        assert_ne!(file_hash(&k), file_hash(&k2));
    }
}
