//! `--coop-directory write`: each node pushes its directory record by one-sided WRITEs
//! into its own slot of every peer's object arena, answered by the peer's XDP program
//! (no process of the peer runs), and reads the records its peers wrote into its own
//! arena locally.
//!
//! ```text
//!  node i's arena (the XDP map):  index | object slots ... | directory slots
//!  directory slot j (chunk WRITE_BASE + j * SLOT_CHUNKS): seq u64 | len u32 | crc32c u32 | record
//!  peer j publishes into slot j of node i, each WRITE acknowledged:
//!    WRITE seq = epoch - 1 (odd)   WRITE len | crc | record (one WRITE per chunk)
//!    WRITE seq = epoch (even)      a failure is counted; 3 in a row back the peer off
//!  node i, each period, copies slot j: seq, bytes, seq again; odd or changed ─► torn;
//!    len over the bound or CRC32c wrong ─► torn; then the record's node must be j and
//!    its epoch newer (`DirectoryUpdate::judge_read`); a slot that stops advancing is
//!    never refreshed and ages out (the views' TTL)
//! ```
//!
//! Rights: node i's XDP program knows one writer key per peer j (key id
//! [`DIRECTORY_WRITE_KEY_BASE`] + j, [`writer_key`]), whose rights
//! (`Rights::chunk_writer`) are WRITE on slot j's chunks and nothing else: no READ, no
//! other slot, no object, no atomics. The keys are derived from the cluster's coop key
//! (SipHash-2-4 as a PRF over a label and j), so they need no files of their own; a
//! holder of the coop key could derive them all, which gives it nothing it does not
//! have already (it can seal any node's directory datagram). What the per-peer keys
//! add is confinement: a peer's WRITE, buggy or replayed, lands in its own slot or
//! nowhere, and the owner never applies a record whose node is not the slot's.

use farside_arena::layout::{ARENA_CHUNKS_MAX, ARENA_REGION, CHUNK_BYTES};
use farside_auth::keys::Keyring;
use farside_auth::mac::KeyId;
use farside_auth::rights::{Rights, CHUNK_GRANT_END_MAX};
use farside_auth::siphash::{siphash24, SipKey};
use farside_rmem::iface::RemoteMemory;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Bytes before the record in a slot: the sequence word, then length and CRC32c.
pub const SLOT_HEAD_BYTES: usize = 16;
/// Chunks of one directory slot: the head and the largest directory record.
pub const SLOT_CHUNKS: usize =
    (SLOT_HEAD_BYTES + super::wire::DIRECTORY_BYTES_MAX).div_ceil(CHUNK_BYTES);
/// Directory slots per arena: one per possible peer (the coop's `COOP_NODES_MAX`, 64,
/// which `coop/mod.rs` asserts equal), so every node finds slot j at the same chunk
/// whatever the cluster's size.
pub const SLOTS: usize = 64;
/// Chunks of the directory slots.
pub const WRITE_CHUNKS: usize = SLOTS * SLOT_CHUNKS;
/// First chunk of the directory slots: the top of the arena, ending at the last chunk a
/// chunk grant can name, so every node's slots are at the same place (the arena map is
/// made [`ARENA_CHUNKS_MAX`] chunks long in this mode; the object layout stays below).
pub const WRITE_BASE: usize = CHUNK_GRANT_END_MAX - WRITE_CHUNKS;
/// Chunks the object layout must leave free at the top of the arena.
pub const RESERVED_CHUNKS: usize = ARENA_CHUNKS_MAX - WRITE_BASE;
/// Key id of peer j's writer key is this plus j. Rule: far from the small ids keys are
/// given by hand (the lab's arena reader is 1), below `u32::MAX`; `--coop-arena-key`
/// may not use an id in this range.
pub const DIRECTORY_WRITE_KEY_BASE: u32 = 0x6469_0000;
/// Time one WRITE may take before the publication to that peer is given up (each WRITE
/// is tried [`farside_rmem::udp::UDP_TRIES`] times within it, retries answered from the
/// peer's dedup record, never applied twice). Rule: a WRITE on the lab's links answers
/// in well under a millisecond; 20 ms is the publish period, so a dead peer costs one
/// period at most before it is backed off.
pub const DIRECTORY_WRITE_TIMEOUT: Duration = Duration::from_millis(20);
/// How long a peer is skipped after [`DIRECTORY_WRITE_FAILURES_MAX`] publications in a
/// row failed. Rule: as the read mode's pull back-off: a dead or restarting peer costs
/// one timeout per half second, and a live one has a fresh record again within one
/// period after it.
pub const DIRECTORY_WRITE_BACKOFF: Duration = Duration::from_millis(500);
/// Publications to one peer that may fail in a row before it is backed off. Rule: a
/// live peer's WRITE times out now and then when the *writer* is throttled at its CPU
/// quota while the acknowledgement waits (measured: about 2 % of publications at 40 % of
/// a CPU); backing off on the first such failure left that peer's view of this node
/// 500 ms stale each time (about a third of the node pairs at any moment, misses up from
/// 0.027 to 0.041). Three in a row (60 ms at the lab's period) is a peer that is down,
/// not one that answered late.
pub const DIRECTORY_WRITE_FAILURES_MAX: u32 = 3;
/// Threads one publication runs at most: the peers are written in parallel, each thread
/// taking its share one after the other. Rule: a publication is three round trips per
/// peer; done serially over 7 peers that is 21 waits per period, in parallel 3 per
/// share; 8 threads cover the lab's 8 nodes with one peer each and bound the threads a
/// 64-node cluster starts per period.
pub const DIRECTORY_WRITE_THREADS_MAX: usize = 8;

const _: () = assert!(WRITE_BASE > 0 && WRITE_BASE + WRITE_CHUNKS <= CHUNK_GRANT_END_MAX);
const _: () =
    assert!(SLOT_CHUNKS * CHUNK_BYTES >= SLOT_HEAD_BYTES + super::wire::DIRECTORY_BYTES_MAX);

/// First chunk of slot `j` in any node's arena.
pub fn slot_chunk(j: usize) -> usize {
    WRITE_BASE + j * SLOT_CHUNKS
}

/// Byte offset of slot `j` in any node's arena.
pub fn slot_offset(j: usize) -> usize {
    slot_chunk(j) * CHUNK_BYTES
}

/// The writer key of peer `j`, derived from the cluster's coop key.
pub fn writer_key(coop: &SipKey, j: usize) -> SipKey {
    let half = |i: u8| {
        let mut m = b"farside-coop-directory-write\0".to_vec();
        m.extend_from_slice(&(j as u64).to_le_bytes());
        m.push(i);
        siphash24(coop, &m)
    };
    SipKey::from_halves(half(0), half(1))
}

/// Installs into `ring` (the node's XDP keyring) the writer key of every peer of a
/// cluster of `nodes` but `me`, each granted WRITE on its own slot only.
pub fn install_writers(
    ring: &mut Keyring,
    coop: &SipKey,
    nodes: usize,
    me: usize,
) -> Result<(), String> {
    for j in (0..nodes).filter(|&j| j != me) {
        let rights = Rights::chunk_writer(ARENA_REGION, slot_chunk(j), slot_chunk(j) + SLOT_CHUNKS)
            .map_err(|e| e.to_string())?;
        // One name per peer: installing a key under a name it already holds is a
        // rotation (the name's older key is retired, its oldest dropped).
        ring.install(
            &format!("coop-directory-writer-{j}"),
            KeyId(DIRECTORY_WRITE_KEY_BASE + j as u32),
            writer_key(coop, j),
            rights,
        )
        .map_err(|e| format!("directory writer key of node {j}: {e}"))?;
    }
    Ok(())
}

/// The slot's bytes after the sequence word for `record`: len, CRC32c (over the length,
/// little-endian, then the record), the record, zero-padded to whole words.
pub fn slot_body(record: &[u8]) -> Vec<u8> {
    let len = (record.len() as u32).to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len), record);
    let mut b = Vec::with_capacity(8 + record.len() + 7);
    b.extend_from_slice(&len);
    b.extend_from_slice(&crc.to_le_bytes());
    b.extend_from_slice(record);
    b.resize(b.len().div_ceil(8) * 8, 0);
    b
}

/// The WRITEs of a publication after the first sequence word: `(offset in the slot,
/// bytes)`, each inside one chunk (the slot starts at a chunk boundary).
pub fn body_writes(body: &[u8]) -> Vec<(usize, &[u8])> {
    let mut out = Vec::new();
    let mut at = 8;
    let mut rest = body;
    while !rest.is_empty() {
        let n = rest.len().min(CHUNK_BYTES - at % CHUNK_BYTES);
        out.push((at, &rest[..n]));
        at += n;
        rest = &rest[n..];
    }
    out
}

/// Why a slot gave no record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRefusal {
    /// Never written (sequence 0).
    Empty,
    /// A write was under way (odd or changed sequence), or the bytes do not check
    /// (length over the bound, CRC32c): a mixture of two publications.
    Torn,
}

/// Judges a copy of a slot taken between two loads of its sequence word (`seq_before`,
/// `copy` = the slot's bytes from its start, `seq_after`): the sequence and the record,
/// or why not. Pure.
pub fn judge_slot(
    seq_before: u64,
    copy: &[u8],
    seq_after: u64,
) -> Result<(u64, &[u8]), SlotRefusal> {
    if seq_before == 0 && seq_after == 0 {
        return Err(SlotRefusal::Empty);
    }
    if seq_before % 2 == 1 || seq_before != seq_after || copy.len() < SLOT_HEAD_BYTES {
        return Err(SlotRefusal::Torn);
    }
    let len = u32::from_le_bytes(copy[8..12].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(copy[12..16].try_into().expect("4 bytes"));
    if len > super::wire::DIRECTORY_BYTES_MAX || SLOT_HEAD_BYTES + len > copy.len() {
        return Err(SlotRefusal::Torn);
    }
    let record = &copy[SLOT_HEAD_BYTES..SLOT_HEAD_BYTES + len];
    if crc32c::crc32c_append(crc32c::crc32c(&copy[8..12]), record) != crc {
        return Err(SlotRefusal::Torn);
    }
    Ok((seq_before, record))
}

/// Reads slot `j` of an arena held in `mem` (the owner's mapping of its XDP map, which
/// the program writes concurrently): the sequence word, a copy, the sequence word
/// again, each load ordered (acquire fences), then [`judge_slot`].
pub fn read_slot(mem: &[u8], j: usize) -> Result<(u64, Vec<u8>), SlotRefusal> {
    let o = slot_offset(j);
    let n = SLOT_CHUNKS * CHUNK_BYTES;
    if o + n > mem.len() {
        return Err(SlotRefusal::Empty);
    }
    let seq = |at: usize| {
        // SAFETY: within `mem` (checked), 8-aligned (chunks are 1400 B from a page-aligned
        // mapping); a volatile load, since the kernel writes the word concurrently.
        unsafe { std::ptr::read_volatile(mem.as_ptr().add(at).cast::<u64>()) }
    };
    let before = seq(o);
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
    let mut copy = vec![0u8; n];
    // SAFETY: within `mem` (checked above); the bytes may change under the copy, which
    // the sequence words and the CRC32c detect.
    unsafe { std::ptr::copy_nonoverlapping(mem.as_ptr().add(o), copy.as_mut_ptr(), n) };
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
    let after = seq(o);
    let (s, record) = judge_slot(before, &copy, after)?;
    Ok((s, record.to_vec()))
}

/// What one publication to a peer cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pushed {
    /// WRITEs acknowledged (three phases; the middle one a WRITE per chunk).
    pub writes: u64,
    /// Bytes the WRITEs carried.
    pub bytes: u64,
}

/// A peer's client, taken out of the writer for one publication.
type Client = Option<farside_rmem::udp::UdpClient>;
/// One peer's publication: the peer, its client (to put back) and the outcome.
type Published = (usize, Client, Result<Pushed, String>);

/// Pushes this node's directory record into its slot of every peer's arena.
pub struct DirectoryWriter {
    me: usize,
    responders: Vec<SocketAddr>,
    key: farside_rmem::ClientKey,
    clients: Vec<Option<farside_rmem::udp::UdpClient>>,
    not_before: Vec<Option<Instant>>,
    failures: Vec<u32>,
}

impl DirectoryWriter {
    /// Node `me` of `peers` (their arena responders at `arena_port`), writing with its
    /// writer key derived from `coop`.
    pub fn new(me: usize, peers: &[SocketAddr], arena_port: u16, coop: &SipKey) -> DirectoryWriter {
        DirectoryWriter {
            me,
            responders: peers
                .iter()
                .map(|p| SocketAddr::new(p.ip(), arena_port))
                .collect(),
            key: farside_rmem::ClientKey::new(
                KeyId(DIRECTORY_WRITE_KEY_BASE + me as u32),
                writer_key(coop, me),
            ),
            clients: peers.iter().map(|_| None).collect(),
            not_before: vec![None; peers.len()],
            failures: vec![0; peers.len()],
        }
    }

    /// True if `peer` is skipped now after failed publications.
    pub fn backing_off(&self, peer: usize, now: Instant) -> bool {
        self.not_before
            .get(peer)
            .copied()
            .flatten()
            .is_some_and(|t| now < t)
    }

    /// Publishes `record` with `epoch` (even, growing) into this node's slot of every
    /// peer's arena that is not backed off, the peers in parallel (at most
    /// [`DIRECTORY_WRITE_THREADS_MAX`] threads): per peer sequence odd, body, sequence
    /// even, each WRITE acknowledged. Returns each peer's outcome. A failure leaves that
    /// slot odd (torn to its owner) until the next publication; after
    /// [`DIRECTORY_WRITE_FAILURES_MAX`] in a row the peer is backed off for
    /// [`DIRECTORY_WRITE_BACKOFF`].
    pub fn publish_all(
        &mut self,
        epoch: u64,
        record: &[u8],
    ) -> Vec<(usize, Result<Pushed, String>)> {
        let now = Instant::now();
        let peers: Vec<usize> = (0..self.responders.len())
            .filter(|&p| p != self.me && !self.backing_off(p, now))
            .collect();
        if peers.is_empty() {
            return Vec::new();
        }
        let (me, key) = (self.me, self.key);
        let threads = peers.len().min(DIRECTORY_WRITE_THREADS_MAX);
        // Each peer's client, moved out for the publication and put back after it.
        let mut jobs: Vec<Vec<(usize, SocketAddr, Client)>> =
            (0..threads).map(|_| Vec::new()).collect();
        for (k, &p) in peers.iter().enumerate() {
            jobs[k % threads].push((p, self.responders[p], self.clients[p].take()));
        }
        let done: Vec<Vec<Published>> = std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|share| {
                    s.spawn(move || {
                        share
                            .into_iter()
                            .map(|(p, addr, mut client)| {
                                let out = publish_to(&mut client, addr, key, me, epoch, record);
                                (p, client, out)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        });
        let mut outcomes = Vec::with_capacity(peers.len());
        for (p, client, out) in done.into_iter().flatten() {
            if out.is_ok() {
                self.clients[p] = client;
                self.failures[p] = 0;
            } else {
                // A fresh socket next time (a late acknowledgement must not be taken
                // for the next WRITE's).
                self.clients[p] = None;
                self.failures[p] += 1;
                if self.failures[p] >= DIRECTORY_WRITE_FAILURES_MAX {
                    self.failures[p] = 0;
                    self.not_before[p] = Some(Instant::now() + DIRECTORY_WRITE_BACKOFF);
                }
            }
            outcomes.push((p, out));
        }
        outcomes
    }
}

/// One publication by node `me` into its slot of the arena answered at `addr`, over
/// `client` (made on first use).
fn publish_to(
    client: &mut Option<farside_rmem::udp::UdpClient>,
    addr: SocketAddr,
    key: farside_rmem::ClientKey,
    me: usize,
    epoch: u64,
    record: &[u8],
) -> Result<Pushed, String> {
    if epoch % 2 == 1 || record.len() > super::wire::DIRECTORY_BYTES_MAX {
        return Err("no such publication".into());
    }
    if client.is_none() {
        let opts = farside_rmem::ClientOptions {
            key: Some(key),
            timeout: DIRECTORY_WRITE_TIMEOUT,
            ..Default::default()
        };
        let mut c = farside_rmem::udp::UdpClient::new(addr, opts).map_err(|e| e.to_string())?;
        c.set_region(ARENA_REGION);
        *client = Some(c);
    }
    let c = client.as_mut().expect("made above");
    let base = slot_offset(me);
    let body = slot_body(record);
    let mut pushed = Pushed::default();
    let mut write = |at: usize, b: &[u8]| {
        c.write(base + at, b)
            .map_err(|e| format!("WRITE at {at} of slot {me}: {e}"))?;
        pushed.writes += 1;
        pushed.bytes += b.len() as u64;
        Ok::<(), String>(())
    };
    write(0, &(epoch - 1).to_le_bytes())?;
    for (at, b) in body_writes(&body) {
        write(at, b)?;
    }
    write(0, &epoch.to_le_bytes())?;
    Ok(pushed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use farside_auth::keys::KeyEntry;

    fn slot_with(seq: u64, record: &[u8]) -> Vec<u8> {
        let mut s = vec![0u8; SLOT_CHUNKS * CHUNK_BYTES];
        s[..8].copy_from_slice(&seq.to_le_bytes());
        let body = slot_body(record);
        s[8..8 + body.len()].copy_from_slice(&body);
        s
    }

    #[test]
    fn slots_fit_the_grantable_chunks_and_do_not_overlap() {
        assert!(slot_chunk(SLOTS - 1) + SLOT_CHUNKS <= CHUNK_GRANT_END_MAX);
        assert_eq!(slot_chunk(1) - slot_chunk(0), SLOT_CHUNKS);
        // Each WRITE of the largest record stays inside one chunk of the slot.
        let body = slot_body(&vec![7u8; super::super::wire::DIRECTORY_BYTES_MAX]);
        let writes = body_writes(&body);
        let mut next = 8;
        for (at, b) in &writes {
            assert_eq!(*at, next, "contiguous");
            assert_eq!(
                at / CHUNK_BYTES,
                (at + b.len() - 1) / CHUNK_BYTES,
                "one chunk"
            );
            assert!(b.len() % 8 == 0 && at % 8 == 0);
            next = at + b.len();
        }
        assert!(next <= SLOT_CHUNKS * CHUNK_BYTES);
        assert_eq!(writes.len(), SLOT_CHUNKS);
    }

    #[test]
    fn a_torn_or_corrupt_slot_is_never_taken_for_a_record() {
        let rec: Vec<u8> = (0..600u32).map(|i| (i * 13) as u8).collect();
        let s = slot_with(40, &rec);
        assert_eq!(judge_slot(40, &s, 40), Ok((40, &rec[..])));
        assert_eq!(judge_slot(0, &[0; 64], 0), Err(SlotRefusal::Empty));
        // A write under way (odd), or one that began or ended during the copy.
        assert_eq!(judge_slot(41, &s, 41), Err(SlotRefusal::Torn));
        assert_eq!(judge_slot(40, &s, 41), Err(SlotRefusal::Torn));
        assert_eq!(judge_slot(40, &s, 42), Err(SlotRefusal::Torn));
        // A mixture of two records under one even sequence: the CRC32c refuses it.
        let other: Vec<u8> = vec![0x55; 600];
        let mut mixed = s.clone();
        mixed[SLOT_HEAD_BYTES + 300..SLOT_HEAD_BYTES + 600].copy_from_slice(&other[300..]);
        assert_eq!(judge_slot(40, &mixed, 40), Err(SlotRefusal::Torn));
        // A length over the bound or beyond the copy.
        let mut long = s.clone();
        long[8..12].copy_from_slice(&(u32::MAX).to_le_bytes());
        assert_eq!(judge_slot(40, &long, 40), Err(SlotRefusal::Torn));
        assert_eq!(judge_slot(40, &s[..100], 40), Err(SlotRefusal::Torn));
        // Every single flipped byte of the head or record is caught.
        for i in 8..SLOT_HEAD_BYTES + rec.len() {
            let mut f = s.clone();
            f[i] ^= 0x20;
            assert!(judge_slot(40, &f, 40).is_err(), "byte {i}");
        }
        // read_slot on a mapping: slot j of a whole arena.
        let mut mem = vec![0u8; (WRITE_BASE + WRITE_CHUNKS) * CHUNK_BYTES];
        let o = slot_offset(3);
        mem[o..o + s.len()].copy_from_slice(&s);
        assert_eq!(read_slot(&mem, 3), Ok((40, rec.clone())));
        assert_eq!(read_slot(&mem, 2), Err(SlotRefusal::Empty));
    }

    #[test]
    fn writer_keys_differ_per_peer_and_grant_only_their_slot() {
        let coop = SipKey::from_halves(1, 2);
        assert_ne!(writer_key(&coop, 0), writer_key(&coop, 1));
        assert_eq!(writer_key(&coop, 3), writer_key(&coop, 3));
        let mut ring = Keyring::new(farside_auth::keys::Policy::Production);
        install_writers(&mut ring, &coop, 4, 2).unwrap();
        assert!(
            ring.get(KeyId(DIRECTORY_WRITE_KEY_BASE + 2)).is_none(),
            "none for itself"
        );
        // Every peer's key is held, whichever node installs them (a shared name once
        // made each install a rotation, which dropped the first peer's key).
        for me in 0..SLOTS {
            let mut ring = Keyring::new(farside_auth::keys::Policy::Production);
            install_writers(&mut ring, &coop, SLOTS, me).unwrap();
            for j in (0..SLOTS).filter(|&j| j != me) {
                let e = ring
                    .get(KeyId(DIRECTORY_WRITE_KEY_BASE + j as u32))
                    .unwrap_or_else(|| panic!("node {me} lacks peer {j}'s writer key"));
                assert_eq!(e.key, writer_key(&coop, j), "node {me}, peer {j}");
            }
        }
        let e: &KeyEntry = ring.get(KeyId(DIRECTORY_WRITE_KEY_BASE + 1)).unwrap();
        let ck = |off: usize| {
            farside_auth::rights::check_chunks(
                &e.rights,
                ARENA_REGION,
                farside_auth::rights::Access::Write,
                off as u64,
                8,
                CHUNK_BYTES as u64,
                ARENA_CHUNKS_MAX as u64,
            )
        };
        assert!(ck(slot_offset(1)).is_ok());
        assert!(ck(slot_offset(1) + SLOT_CHUNKS * CHUNK_BYTES - 8).is_ok());
        assert!(ck(slot_offset(0)).is_err(), "another peer's slot");
        assert!(ck(slot_offset(2)).is_err(), "another peer's slot");
        assert!(ck(0).is_err(), "the index");
    }
}
