//! Peer fetch without the peer's process: the initial node reads the service node's
//! object arena ([`super::arena`]) itself.
//!
//! ```text
//!  fetch(peer, object, len)
//!    len > OBJECT_BYTES_MAX ─► tcp (the arena holds no such body)
//!    index: the key's probe window (one or two READs) ─► bucket {slot, len} or absent
//!    body:  the slot's chunks, head first, tail last ─► seqlock + url hash + CRC32c
//!           torn ─► read again (READ_RETRY_MAX); stale / not indexed ─► absent
//! ```
//!
//! - [`XdpTransport`]: the READs are rmem requests sealed under the cluster's arena reader
//!   key and answered by the peer's XDP program in the kernel
//!   (`farside_rdmahttp::arena_read::ArenaReader`), a bounded pool of readers per peer;
//! - [`ShmTransport`]: the peer's arena file mapped read-only and copied chunk by chunk in
//!   the same order (nodes of one host only: the zero-copy bound of the comparison).
//!
//! Either way the owner learns of the read without a message: the XDP program stamps
//! every arena READ it answers; a shm reader adds one to the object's read stamp in the
//! peer's stamps file ([`super::arena`], "Read stamps") after it read a body.
//!
//! A stale index entry (the slot reused since) fails the url hash and reads as absent,
//! a torn read is retried and then fails: never a wrong body. What the one-sided read
//! could not settle (a lost READ, a refused key) is an error, and the caller goes to disk.
//!
//! [`DirectoryReader`] (`--coop-directory read`) pulls each peer's directory record
//! ([`super::arena::DIRECTORY_KEY`]) the same way, index then slot, with readers of its
//! own (the pull thread's, apart from the fetch pools); the caller validates the record
//! ([`super::wire::DirectoryUpdate::judge_read`]).

use super::arena::{
    arena_key, head_chunk, shm_path, shm_reads_path, ShmMap, DIRECTORY_KEY, OBJECT_BYTES_MAX,
};
use super::overhead::Overhead;
use super::peer::{PeerTransport, TcpTransport, PEER_POOL_MAX};
use farside_arena::index::{lookup_in_window, probe_window};
use farside_arena::layout::{class_for_len, READ_RETRY_MAX};
use farside_arena::map::chunk_reads;
use farside_arena::slot::SlotRef;
use farside_arena::{ObjectRead, ReadError, SLOTS_BASE};
use farside_rdmahttp::arena_read::{ArenaReader, FetchError};
use farside_rdmahttp::header::ArenaHint;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

fn refused(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Reads peers' arenas through their XDP responders.
pub struct XdpTransport {
    tcp: TcpTransport,
    responders: Vec<SocketAddr>,
    key: farside_rmem::ClientKey,
    key_id: u32,
    pools: Vec<Mutex<Vec<ArenaReader>>>,
}

/// Each peer's arena responder: its address at the cluster's arena port.
fn arena_responders(peers: &[SocketAddr], arena_port: u16) -> Vec<SocketAddr> {
    peers
        .iter()
        .map(|p| SocketAddr::new(p.ip(), arena_port))
        .collect()
}

impl XdpTransport {
    /// `peers`: every node's peer address (its responder listens on the same IP at
    /// `arena_port`); `key`: the arena reader key (`ID[:PATH]`).
    pub fn new(
        tcp: TcpTransport,
        peers: &[SocketAddr],
        arena_port: u16,
        key: &str,
    ) -> io::Result<XdpTransport> {
        let key = farside_rmem::ClientKey::load(key)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(XdpTransport {
            tcp,
            responders: arena_responders(peers, arena_port),
            key_id: key.id.0,
            key,
            pools: peers.iter().map(|_| Mutex::new(Vec::new())).collect(),
        })
    }

    fn fetch_one_sided(&self, peer: usize, object: u64) -> io::Result<Option<Vec<u8>>> {
        let reader = self.pools[peer]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        let mut reader = match reader {
            Some(r) => r,
            None => ArenaReader::connect(self.responders[peer], self.key)?,
        };
        let key = arena_key(object);
        // The overhead ablation: the index probe's READs (one per chunk of the window)
        // before the lookup, the body's as the reader counted them (resends included).
        let probe_reads = probe_window(key)
            .into_iter()
            .map(|(o, l)| chunk_reads(o, l).len() as u64)
            .sum();
        self.tcp.overhead.spin(probe_reads);
        let result = match reader.lookup(key) {
            Ok(b) => match class_for_len(b.len as usize) {
                Some(class) if b.len as usize <= OBJECT_BYTES_MAX => {
                    let hint = ArenaHint {
                        port: self.responders[peer].port(),
                        key: self.key_id,
                        slot: b.offset.into(),
                        class: class as u8,
                        hash: key,
                        len: b.len.into(),
                    };
                    match reader.fetch(&hint, OBJECT_BYTES_MAX as u64) {
                        Ok((body, stats)) => {
                            self.tcp.overhead.spin(stats.reads);
                            Ok(Some(body))
                        }
                        Err(FetchError::Invalid(ReadError::Stale)) => Ok(None),
                        Err(e) => Err(refused(e)),
                    }
                }
                _ => Ok(None), // a torn bucket: no slot of that length
            },
            Err(FetchError::NotIndexed) => Ok(None),
            Err(e) => Err(refused(e)),
        };
        if result.is_ok() {
            let mut pool = self.pools[peer].lock().unwrap_or_else(|p| p.into_inner());
            if pool.len() < PEER_POOL_MAX {
                pool.push(reader);
            }
        }
        // A reader that failed may hold late replies: dropped with it.
        result
    }
}

impl PeerTransport for XdpTransport {
    fn fetch(&self, peer: usize, object: u64, len: Option<u64>) -> io::Result<Option<Vec<u8>>> {
        if peer >= self.responders.len() {
            return Err(refused("no such peer"));
        }
        if len.is_some_and(|l| l > OBJECT_BYTES_MAX as u64) {
            return self.tcp.fetch(peer, object, len);
        }
        self.fetch_one_sided(peer, object)
    }
}

/// Reads peers' arena files, mapped read-only (nodes of one host).
pub struct ShmTransport {
    tcp: TcpTransport,
    dir: PathBuf,
    /// Each peer's mapping (its arena read-only, its read stamps writable), made at its
    /// first fetch (the peer may start later) and made again after a failed read (the
    /// peer may have restarted with new files).
    maps: Vec<RwLock<Option<PeerMaps>>>,
}

/// A peer's arena and read stamps, mapped.
#[derive(Clone)]
struct PeerMaps {
    arena: Arc<ShmMap>,
    reads: Arc<ShmMap>,
    /// The arena file's inode when mapped: a restarted peer makes a new file, and a
    /// reader that finds an object absent checks whether it is reading the old one.
    ino: u64,
}

/// The inode of `path`, 0 if it cannot be read.
fn inode(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.ino())
}

impl ShmTransport {
    pub fn new(tcp: TcpTransport, nodes: usize, dir: PathBuf) -> ShmTransport {
        ShmTransport {
            tcp,
            dir,
            maps: (0..nodes).map(|_| RwLock::new(None)).collect(),
        }
    }

    fn map(&self, peer: usize) -> io::Result<PeerMaps> {
        if let Some(m) = &*self.maps[peer].read().unwrap_or_else(|p| p.into_inner()) {
            return Ok(m.clone());
        }
        let path = shm_path(&self.dir, peer);
        let ino = inode(&path);
        let m = PeerMaps {
            arena: Arc::new(ShmMap::open_read_only(&path)?),
            reads: Arc::new(ShmMap::open_stamps(&shm_reads_path(&self.dir, peer))?),
            ino,
        };
        *self.maps[peer].write().unwrap_or_else(|p| p.into_inner()) = Some(m.clone());
        Ok(m)
    }
}

/// Reads `key`'s object from a mapped arena: absent, the validated body, or an error.
pub fn read_mapped(map: &ShmMap, key: u64) -> Result<Option<Vec<u8>>, ReadError> {
    Ok(read_mapped_slot(map, key, &Overhead::default())?.map(|(body, _)| body))
}

/// As [`read_mapped`], with the slot-area offset of the slot the body was read from;
/// each read of the mapping (a probe range, a chunk) first pays `overhead`.
fn read_mapped_slot(
    map: &ShmMap,
    key: u64,
    overhead: &Overhead,
) -> Result<Option<(Vec<u8>, u32)>, ReadError> {
    let copy = |o: usize, l: usize| -> Result<Vec<u8>, ReadError> {
        overhead.spin(1);
        let mut b = vec![0; l];
        if map.copy_to(o, &mut b) {
            Ok(b)
        } else {
            Err(ReadError::Bounds)
        }
    };
    let mut window = Vec::new();
    for (o, l) in probe_window(key) {
        window.extend(copy(o, l)?);
    }
    let Some(b) = lookup_in_window(&window, key) else {
        return Ok(None);
    };
    let Some(class) = class_for_len(b.len as usize).filter(|_| b.len as usize <= OBJECT_BYTES_MAX)
    else {
        return Ok(None);
    };
    let slot = SlotRef {
        offset: b.offset as usize,
        class,
    };
    let Some(mut read) = ObjectRead::for_slot(slot, key, b.len as usize) else {
        return Ok(None);
    };
    let mut torn = 0;
    loop {
        // In ascending order, each copy fenced: the head word first, the tail last.
        for (i, (o, l)) in read.plan().into_iter().enumerate() {
            read.feed_at(i, &copy(SLOTS_BASE + o, l)?);
        }
        match read.finish() {
            Ok((_, body)) => return Ok(Some((body, b.offset))),
            Err(ReadError::Torn) if torn < READ_RETRY_MAX => {
                torn += 1;
                read.restart();
            }
            Err(ReadError::Stale) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

impl PeerTransport for ShmTransport {
    fn fetch(&self, peer: usize, object: u64, len: Option<u64>) -> io::Result<Option<Vec<u8>>> {
        if peer >= self.maps.len() {
            return Err(refused("no such peer"));
        }
        if len.is_some_and(|l| l > OBJECT_BYTES_MAX as u64) {
            return self.tcp.fetch(peer, object, len);
        }
        let maps = self.map(peer)?;
        match read_mapped_slot(&maps.arena, arena_key(object), &self.tcp.overhead) {
            Ok(Some((body, slot))) => {
                // The owner's cache counts this read as a hit (see the module doc).
                maps.reads.add_read(head_chunk(slot));
                Ok(Some(body))
            }
            Ok(None) => {
                // A restarted peer's new arena replaces the file: map it at the next
                // fetch (the old mapping still holds valid bodies, just old ones).
                if inode(&shm_path(&self.dir, peer)) != maps.ino {
                    *self.maps[peer].write().unwrap_or_else(|p| p.into_inner()) = None;
                }
                Ok(None)
            }
            Err(e) => {
                *self.maps[peer].write().unwrap_or_else(|p| p.into_inner()) = None;
                Err(refused(format!("arena of node {peer}: {e}")))
            }
        }
    }
}

/// After a pull of a peer's directory failed (lost READs, no record, a refused key, a
/// missing file), that peer is not pulled again for this long: a dead peer's lost READs
/// (up to `READ_RESENDS_MAX` resends of `READ_RTO` each) then delay the other peers'
/// pulls once per back-off, not every period. Well within the view TTL (3 s), so a
/// peer that comes back is seen again within a second.
pub const DIRECTORY_PULL_BACKOFF: Duration = Duration::from_millis(500);
/// Times a pull looks the record up again when the slot it found was freed before it was
/// read (the owner republished in between: its new copy sits in another slot): one,
/// since a republication comes at most once per publish period.
pub const DIRECTORY_PULL_RETRIES: u32 = 1;

/// Why a pull gave no record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullError {
    pub why: String,
    /// The failure took time (lost READs, no socket): the peer backs off.
    pub slow: bool,
}

impl PullError {
    fn fast(why: impl std::fmt::Display) -> PullError {
        PullError {
            why: why.to_string(),
            slow: false,
        }
    }

    fn slow(why: impl std::fmt::Display) -> PullError {
        PullError {
            why: why.to_string(),
            slow: true,
        }
    }
}

/// One pulled directory record and what the pull moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The record's bytes (seqlock, length and CRC32c checked under the directory key).
    pub record: Vec<u8>,
    /// READs sent (xdp, resends included) or chunk copies made (shm).
    pub reads: u64,
    /// Bytes the READs or copies moved: the index's probe window and the slot's chunks.
    pub bytes: u64,
}

/// READs of the directory key's probe window (by chunk), slot READs of one untorn read
/// of a record of `len` bytes (head to tail), and the bytes both move.
fn pull_cost(len: usize) -> (u64, u64, u64) {
    let window: Vec<(usize, usize)> = probe_window(DIRECTORY_KEY)
        .into_iter()
        .flat_map(|(o, l)| farside_arena::chunk_reads(o, l))
        .collect();
    let plan = class_for_len(len)
        .and_then(|class| ObjectRead::for_slot(SlotRef { offset: 0, class }, DIRECTORY_KEY, len))
        .map(|r| r.plan())
        .unwrap_or_default();
    let bytes = window.iter().chain(&plan).map(|&(_, l)| l as u64).sum();
    (window.len() as u64, plan.len() as u64, bytes)
}

/// Where a peer's directory record is read from.
enum Source {
    /// Each peer's XDP responder; a reader per peer, made at its first pull and again
    /// after a failed one (a failed reader may hold late replies).
    Xdp {
        responders: Vec<SocketAddr>,
        key: farside_rmem::ClientKey,
        key_id: u32,
        readers: Vec<Option<ArenaReader>>,
    },
    /// Each peer's arena file, mapped read-only at its first pull and again when the
    /// file was replaced (a restarted peer) or a read failed.
    Shm {
        dir: PathBuf,
        maps: Vec<Option<(ShmMap, u64)>>,
    },
}

/// Pulls peers' directory records one-sidedly (`--coop-directory read`).
pub struct DirectoryReader {
    source: Source,
    /// Per peer: not pulled before this instant (see [`DIRECTORY_PULL_BACKOFF`]).
    not_before: Vec<Option<Instant>>,
}

impl DirectoryReader {
    /// Over the peers' XDP responders (`peers`' IPs at `arena_port`), with the arena
    /// reader key `key` (`ID[:PATH]`).
    pub fn xdp(peers: &[SocketAddr], arena_port: u16, key: &str) -> io::Result<DirectoryReader> {
        let key = farside_rmem::ClientKey::load(key)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(DirectoryReader {
            source: Source::Xdp {
                responders: arena_responders(peers, arena_port),
                key_id: key.id.0,
                key,
                readers: peers.iter().map(|_| None).collect(),
            },
            not_before: vec![None; peers.len()],
        })
    }

    /// Over the arena files of `nodes` nodes under `dir`.
    pub fn shm(nodes: usize, dir: PathBuf) -> DirectoryReader {
        DirectoryReader {
            source: Source::Shm {
                dir,
                maps: (0..nodes).map(|_| None).collect(),
            },
            not_before: vec![None; nodes],
        }
    }

    /// True if `peer` is backing off after a failed pull (not pulled now).
    pub fn backing_off(&self, peer: usize, now: Instant) -> bool {
        self.not_before
            .get(peer)
            .copied()
            .flatten()
            .is_some_and(|t| now < t)
    }

    fn back_off(&mut self, peer: usize) {
        if let Some(t) = self.not_before.get_mut(peer) {
            *t = Some(Instant::now() + DIRECTORY_PULL_BACKOFF);
        }
    }

    /// Reads `peer`'s directory record: its bytes (validated as an arena object under
    /// [`DIRECTORY_KEY`]), or why not (a slow failure backs `peer` off).
    pub fn pull(&mut self, peer: usize) -> Result<Pulled, PullError> {
        let out = match &mut self.source {
            Source::Xdp {
                responders,
                key,
                key_id,
                readers,
            } => {
                let (Some(addr), Some(slot)) = (responders.get(peer), readers.get_mut(peer)) else {
                    return Err(PullError::fast("no such peer"));
                };
                pull_xdp(slot, *addr, *key, *key_id)
            }
            Source::Shm { dir, maps } => {
                let Some(slot) = maps.get_mut(peer) else {
                    return Err(PullError::fast("no such peer"));
                };
                pull_shm(slot, &shm_path(dir, peer))
            }
        };
        if out.as_ref().is_err_and(|e| e.slow) {
            self.back_off(peer);
        }
        out
    }
}

fn pull_xdp(
    slot: &mut Option<ArenaReader>,
    addr: SocketAddr,
    key: farside_rmem::ClientKey,
    key_id: u32,
) -> Result<Pulled, PullError> {
    if slot.is_none() {
        *slot = Some(ArenaReader::connect(addr, key).map_err(PullError::slow)?);
    }
    let reader = slot.as_mut().expect("made above");
    let (window_reads, _, _) = pull_cost(0);
    let mut reads = 0;
    let mut attempt = 0;
    loop {
        reads += window_reads;
        let result = reader.lookup(DIRECTORY_KEY).and_then(|b| {
            let len = b.len as usize;
            let class = class_for_len(len)
                .filter(|_| len <= super::wire::DIRECTORY_BYTES_MAX)
                .ok_or(FetchError::BadHint)?;
            let hint = ArenaHint {
                port: addr.port(),
                key: key_id,
                slot: b.offset.into(),
                class: class as u8,
                hash: DIRECTORY_KEY,
                len: b.len.into(),
            };
            reader.fetch(&hint, super::wire::DIRECTORY_BYTES_MAX as u64)
        });
        match result {
            Ok((record, stats)) => {
                let (_, _, bytes) = pull_cost(record.len());
                return Ok(Pulled {
                    // The lookups' READs and the fetch's own (resends included).
                    reads: reads + stats.reads,
                    bytes,
                    record,
                });
            }
            Err(FetchError::Invalid(ReadError::Stale) | FetchError::BadHint)
                if attempt < DIRECTORY_PULL_RETRIES =>
            {
                attempt += 1;
            }
            Err(e @ (FetchError::NotIndexed | FetchError::Invalid(_) | FetchError::BadHint)) => {
                return Err(PullError::fast(e))
            }
            Err(e) => {
                // Lost or refused READs: a failed reader may hold late replies.
                *slot = None;
                return Err(PullError::slow(e));
            }
        }
    }
}

fn pull_shm(slot: &mut Option<(ShmMap, u64)>, path: &std::path::Path) -> Result<Pulled, PullError> {
    let ino = inode(path);
    if slot.as_ref().is_some_and(|(_, i)| *i != ino) {
        *slot = None; // the owner restarted: its new file replaced the old
    }
    if slot.is_none() {
        let map = ShmMap::open_read_only(path).map_err(PullError::slow)?;
        *slot = Some((map, ino));
    }
    let (map, _) = slot.as_ref().expect("mapped above");
    let mut attempt = 0;
    loop {
        match read_mapped(map, DIRECTORY_KEY) {
            Ok(Some(record)) if record.len() <= super::wire::DIRECTORY_BYTES_MAX => {
                let (window, plan, bytes) = pull_cost(record.len());
                return Ok(Pulled {
                    record,
                    reads: (window + plan) * u64::from(attempt + 1),
                    bytes: bytes * u64::from(attempt + 1),
                });
            }
            Ok(Some(_)) => return Err(PullError::fast("record over the directory bound")),
            // Not indexed, or the slot freed since the index was read: look again once.
            Ok(None) if attempt < DIRECTORY_PULL_RETRIES => attempt += 1,
            Ok(None) => return Err(PullError::fast("no directory record")),
            Err(e) => {
                *slot = None;
                return Err(PullError::fast(e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::arena::NodeArena;
    use super::*;

    #[test]
    fn a_mapped_peer_arena_gives_the_body_absent_or_never_a_wrong_one() {
        let dir =
            std::env::temp_dir().join(format!("farside-coop-onesided-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut owner = NodeArena::shm(1 << 20, false, &dir, 1).unwrap();
        let body: Vec<u8> = (0..20_000u32).map(|i| (i * 31) as u8).collect();
        owner.put(7, &body);
        let peer = ShmMap::open_read_only(&shm_path(&dir, 1)).unwrap();
        assert_eq!(read_mapped(&peer, arena_key(7)), Ok(Some(body.clone())));
        assert_eq!(read_mapped(&peer, arena_key(8)), Ok(None), "not indexed");
        // The overhead ablation: every read of the mapping spins once (the probe
        // window's range or ranges, then each chunk of the body).
        let o = Overhead::new(1);
        assert_eq!(
            read_mapped_slot(&peer, arena_key(7), &o).map(|r| r.map(|(b, _)| b)),
            Ok(Some(body.clone()))
        );
        // One probe range at least, then the body's 15 chunks at least (20,000 B in
        // 1,400-B chunks).
        assert!(o.spins() >= 16, "{} spins", o.spins());
        let none = Overhead::new(0);
        let _ = read_mapped_slot(&peer, arena_key(7), &none);
        assert_eq!(none.spins(), 0);
        owner.evict(7);
        assert_eq!(read_mapped(&peer, arena_key(7)), Ok(None), "evicted");
        // Another object in the same slot under a stale bucket: refused by its key.
        owner.put(9, &body);
        assert_eq!(read_mapped(&peer, arena_key(7)), Ok(None));
        assert_eq!(read_mapped(&peer, arena_key(9)), Ok(Some(body)));
        drop(owner);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The owner rewrites one object (two bodies, alternately, and evictions) while a
    /// peer reads it from the mapping: every read is one of the two bodies, absent, or
    /// refused (torn every time), never a mixture.
    #[test]
    fn reads_racing_the_owner_never_accept_a_mixture() {
        let dir = std::env::temp_dir().join(format!("farside-coop-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut owner = NodeArena::shm(1 << 20, false, &dir, 2).unwrap();
        let a = vec![0xAAu8; 30_000];
        let b = vec![0x55u8; 30_000];
        owner.put(3, &a);
        let peer = ShmMap::open_read_only(&shm_path(&dir, 2)).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (mut good, mut other) = (0u64, 0u64);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..3_000u32 {
                    match i % 3 {
                        0 => owner.put(3, &b),
                        1 => owner.put(3, &a),
                        _ => owner.evict(3),
                    }
                }
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match read_mapped(&peer, arena_key(3)) {
                    Ok(Some(body)) => {
                        assert!(body == a || body == b, "a mixture was accepted");
                        good += 1;
                    }
                    Ok(None) | Err(ReadError::Torn | ReadError::Corrupt) => other += 1,
                    Err(e) => panic!("{e:?}"),
                }
            }
        });
        assert!(good + other > 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
