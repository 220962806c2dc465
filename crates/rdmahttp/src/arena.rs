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
//! **Direct** (`--rdma-arena-direct`, [`ArenaServer::enable_direct`]): a request that
//! asks (`direct=1`) also gets a grant (`crate::grant`), and the file is **published**
//! under its url path: an alias bucket in the arena's index, keyed by [`direct_hash`]
//! of the path, naming the object's slot, length, version and object hash. A client
//! holding a live grant resolves that path with one index READ and reads the body as
//! above, with no request to this process. Only static public files are published
//! ([`publishable`]); a published file is re-checked every [`REVALIDATE_PERIOD`] by
//! its (device, inode, size, mtime), and a changed or missing one is unpublished (its
//! readers fall back to HTTP, which puts and publishes the new contents). At most
//! [`DIRECT_PATHS_MAX`] paths are published.
//!
//! The responder is this process's own: it loads the rmem XDP program with an arena
//! map of [`server_layout`]'s size and attaches it to `--rdma-arena-iface` (no other
//! XDP program may be attached there: on a node that runs gatherd's responder, gatherd
//! would create the arena map and hand it over like the region, which is not built).

use crate::grant::{Grant, GrantTable};
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
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// Most url paths published for direct readers. Rule: aliases share the index
/// (`INDEX_BUCKETS`, 8,192) with the objects' own buckets; a quarter of it for aliases
/// keeps the index under half load when every published file is also an object, where
/// linear probing stays short.
pub const DIRECT_PATHS_MAX: usize = farside_arena::layout::INDEX_BUCKETS / 4;
/// How often published files are checked against their file (identity, size,
/// modification time). Rule: a changed file is served in its old version to direct
/// readers for at most this long (plus the checker's scheduling delay: it is a nice-0
/// thread like the workers), a CDN's revalidation bound; 2,048 `stat`s every 200 ms is
/// ~1 % of a core at worst.
pub const REVALIDATE_PERIOD: Duration = Duration::from_millis(200);
/// Longest url path published. Rule: the paths of static sites are far shorter, and a
/// bound keeps the hash input and the table bounded.
pub const DIRECT_PATH_BYTES_MAX: usize = 256;

/// The index key of a published url path: its hash under a label of its own, so it
/// never equals an object's key (a file's identity hash).
pub fn direct_hash(path: &str) -> u64 {
    let mut b = Vec::with_capacity(16 + path.len());
    b.extend_from_slice(b"farside-direct\0");
    b.extend_from_slice(path.as_bytes());
    farside_arena::url_hash(&b)
}

/// Whether a url path may be published for direct readers (and looked up by them):
/// absolute, at most [`DIRECT_PATH_BYTES_MAX`] bytes of `A-Z a-z 0-9 . _ ~ / -`, no
/// `..` segment and no `//`, no query. One spelling per file: a client that spells a
/// path otherwise (escapes, a query) asks over HTTP. The server publishes only what
/// it served as a 200 from a regular file under its `--root`, for any client.
pub fn publishable(path: &str) -> bool {
    path.starts_with('/')
        && path.len() <= DIRECT_PATH_BYTES_MAX
        && path
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"._~/-".contains(&c))
        && !path.contains("//")
        && !path.split('/').any(|seg| seg == "..")
}

/// A published path: the file it was, and where to look at it again.
struct Published {
    file: FileKey,
    fs_path: PathBuf,
}

struct State {
    map: ArenaMap,
    objects: HashMap<FileKey, ArenaHint>,
    /// Objects in the order they were put, per class (the eviction order).
    order: [VecDeque<FileKey>; CLASS_COUNT],
    /// Published url paths by their alias hash (direct only).
    published: HashMap<u64, Published>,
}

/// Direct readers: the grants and the arena key they derive from.
struct Direct {
    arena_key: farside_auth::siphash::SipKey,
    grants: Mutex<GrantTable>,
    stop: Arc<AtomicBool>,
    revalidator: Option<std::thread::JoinHandle<()>>,
}

/// The node's arena and its responder, shared by the workers.
pub struct ArenaServer {
    xdp: XdpResponder,
    mem: Arc<Mutex<ArenaMemory>>,
    state: Arc<Mutex<State>>,
    port: u16,
    key: u32,
    direct: Option<Direct>,
}

impl Drop for ArenaServer {
    fn drop(&mut self) {
        if let Some(d) = &mut self.direct {
            d.stop.store(true, Ordering::Release);
            if let Some(t) = d.revalidator.take() {
                let _ = t.join();
            }
        }
    }
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
            xdp,
            mem,
            state: Arc::new(Mutex::new(State {
                map,
                objects: HashMap::new(),
                order: Default::default(),
                published: HashMap::new(),
            })),
            port,
            key,
            direct: None,
        })
    }

    /// Direct readers on: requests that ask get grants derived from `arena_key` (the
    /// arena reader key clients hold), and their files are published under their
    /// paths; a thread re-checks published files every [`REVALIDATE_PERIOD`].
    pub fn enable_direct(&mut self, arena_key: farside_auth::siphash::SipKey) {
        if self.direct.is_some() {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (state, mem, halt) = (
            Arc::clone(&self.state),
            Arc::clone(&self.mem),
            Arc::clone(&stop),
        );
        let revalidator = std::thread::Builder::new()
            .name("arena-revalidate".into())
            .spawn(move || {
                while !halt.load(Ordering::Acquire) {
                    std::thread::sleep(REVALIDATE_PERIOD);
                    revalidate(&state, &mem);
                }
            })
            .map_err(|e| log::warn!("arena: no revalidation thread ({e}): direct off"))
            .ok();
        if revalidator.is_none() {
            return;
        }
        self.direct = Some(Direct {
            arena_key,
            grants: Mutex::new(GrantTable::new()),
            stop,
            revalidator,
        });
    }

    /// Whether direct readers are on.
    pub fn direct(&self) -> bool {
        self.direct.is_some()
    }

    /// A grant for the client at `peer` (IPv4, or IPv4-mapped IPv6), its key installed
    /// in the responder bound to that address; `None` without direct, for an IPv6
    /// client, when the server holds `GRANTS_MAX` grants, or if the kernel refused it.
    pub fn grant(&self, peer: IpAddr) -> Option<Grant> {
        let d = self.direct.as_ref()?;
        let client: Ipv4Addr = match peer {
            IpAddr::V4(a) => a,
            IpAddr::V6(a) => a.to_ipv4_mapped()?,
        };
        let mut grants = d.grants.lock().expect("grants");
        let (grant, changes) = grants.issue(client, farside_xdp::monotonic_ns());
        for id in changes.revoke {
            if let Err(e) = self.xdp.revoke_grant(id) {
                log::warn!("arena: revoking grant {id}: {e}");
            }
        }
        if let Some((g, ip)) = changes.install {
            let key = crate::grant::grant_key(&d.arena_key, g.id, ip, g.expires_ns);
            let mut ring = Keyring::new(Policy::Production);
            let entry = ring
                .install(
                    "arena-grant",
                    KeyId(g.id),
                    key,
                    Rights::reader(ARENA_REGION),
                )
                .ok()
                .and_then(|_| ring.get(KeyId(g.id)).cloned())?;
            if let Err(e) = self.xdp.install_grant(&entry, ip, g.expires_ns) {
                log::warn!("arena: installing grant {}: {e}", g.id);
                return None;
            }
        }
        grant
    }

    /// Publishes the object of `file` (already in the arena) under the url path
    /// `path` for direct readers, to be re-checked at `fs_path`; nothing without
    /// direct, for a path that is not [`publishable`], beyond [`DIRECT_PATHS_MAX`], or
    /// when the alias finds no index bucket. True if it is published now.
    pub fn publish(&self, path: &str, file: &FileKey, fs_path: &Path) -> bool {
        if self.direct.is_none() || !publishable(path) {
            return false;
        }
        let alias = direct_hash(path);
        let mut st = self.state.lock().expect("arena state");
        if st.published.get(&alias).is_some_and(|p| p.file == *file) {
            return true;
        }
        if !st.published.contains_key(&alias) && st.published.len() >= DIRECT_PATHS_MAX {
            return false;
        }
        let mut mem = self.mem.lock().expect("arena memory");
        match st.map.publish(mem.bytes_mut(), alias, file_hash(file)) {
            Some(Ok(_)) => {
                st.published.insert(
                    alias,
                    Published {
                        file: *file,
                        fs_path: fs_path.to_path_buf(),
                    },
                );
                true
            }
            _ => false,
        }
    }

    /// Url paths published.
    pub fn published(&self) -> usize {
        self.state.lock().expect("arena state").published.len()
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
                    unpublish_file(&mut st, bytes, &old);
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

    /// Re-checks published files now (as the revalidation thread does every
    /// [`REVALIDATE_PERIOD`]); the paths unpublished.
    pub fn revalidate_now(&self) -> usize {
        revalidate(&self.state, &self.mem)
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

/// Removes every alias of `file` (its object is gone or changed).
fn unpublish_file(st: &mut State, mem: &mut [u8], file: &FileKey) {
    let gone: Vec<u64> = st
        .published
        .iter()
        .filter(|(_, p)| p.file == *file)
        .map(|(&a, _)| a)
        .collect();
    for a in gone {
        st.published.remove(&a);
        st.map.unpublish(mem, a);
    }
}

/// Unpublishes every published path whose file changed (identity, size, mtime) or is
/// gone; `stat` runs outside the locks. The number unpublished.
fn revalidate(state: &Mutex<State>, mem: &Mutex<ArenaMemory>) -> usize {
    let list: Vec<(u64, FileKey, PathBuf)> = {
        let st = state.lock().expect("arena state");
        st.published
            .iter()
            .map(|(&a, p)| (a, p.file, p.fs_path.clone()))
            .collect()
    };
    let changed: Vec<(u64, FileKey)> = list
        .into_iter()
        .filter(|(_, file, path)| {
            std::fs::metadata(path).map_or(true, |m| !m.is_file() || FileKey::of(&m) != *file)
        })
        .map(|(a, f, _)| (a, f))
        .collect();
    if changed.is_empty() {
        return 0;
    }
    let mut st = state.lock().expect("arena state");
    let mut mem = mem.lock().expect("arena memory");
    let mut n = 0;
    for (alias, file) in changed {
        if st.published.get(&alias).is_some_and(|p| p.file == file) {
            st.published.remove(&alias);
            st.map.unpublish(mem.bytes_mut(), alias);
            n += 1;
        }
    }
    n
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
    fn only_plain_paths_are_published() {
        for ok in ["/a", "/f/1048576.bin", "/x-y_z.~/b.html"] {
            assert!(publishable(ok), "{ok}");
        }
        for bad in [
            "", "a", "/a?b", "/a/../b", "/..", "//a", "/a%20b", "/a b", "/é",
        ] {
            assert!(!publishable(bad), "{bad}");
        }
        assert!(!publishable(&format!(
            "/{}",
            "a".repeat(DIRECT_PATH_BYTES_MAX)
        )));
        assert_ne!(direct_hash("/a"), direct_hash("/b"));
        assert_ne!(direct_hash("/a"), farside_arena::url_hash(b"/a"));
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
