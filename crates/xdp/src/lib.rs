//! The rmem XDP responder: loads `bpf/rmem.bpf.c` (built by `build.rs` and embedded),
//! configures its port and keys (a `farside_auth` keyring: per key id the SipHash key
//! and its rights, copied into the `rmem_keys` map), and attaches it to an interface so
//! that remote READ/WRITE/CAS/FADD requests of the `udp` transport
//! (`farside_rmem::wire`) are answered in the kernel, with no user-space process
//! scheduled on this host. The program verifies each request's tag, refuses copies
//! (a replay window per key id and sender in a set-associative `rmem_replay` map that
//! evicts safely, above a restart floor and under a ceiling: `rmem_seqlim`,
//! `farside_auth::floor`), checks the key's rights as
//! `farside_auth::rights::check` does, and seals its reply under the request's key.
//!
//! The region lives in a `BPF_F_MMAPABLE` array map; [`XdpResponder::region`] maps it
//! (`MAP_SHARED`) as 512 little-endian words, which gatherd writes with plain stores
//! and remote atomics change under it. The program answers like
//! `farside_rmem::ops::execute` (same checks, same order, same reply bytes; requests
//! that do not verify, copies and malformed requests dropped) with one difference: READs longer than
//! [`XDP_READ_BYTES_MAX`] are refused with `BadLength`, because the reply must fit one
//! frame. Clients split larger reads.
//!
//! Not ours (XDP_PASS, left to the stack and gatherd's user-space fallback): non-IPv4,
//! non-UDP, other ports, IPv4 with options, IP fragments, inconsistent IP/UDP lengths.
//!
//! The reply is built in the request's buffer and is never longer than the request:
//! READ requests must be padded to their reply's size (`Unpadded` otherwise, as in
//! user space), which also means the protocol cannot reflect a small datagram as a
//! large one. Only datagrams to the node's address are answered once
//! [`XdpResponder::set_node_addr`] names it.
//!
//! WRITE, CAS and FETCH-ADD are confined to what the key's rights grant (never an
//! agent-owned word) and applied at most once per (client, op seq), the client being
//! the envelope's sender: the `rmem_dedup` LRU map (at most [`DEDUP_CLIENTS_MAX`]
//! clients) remembers each client's last mutation and replays its reply to a retry,
//! exactly as `farside_rmem::ops::Dedup` does in user space. gatherd makes the two
//! one table across the attach: [`XdpResponder::load`] creates the maps, user space
//! serves the region until [`XdpResponder::seed_dedup`] takes its table over and
//! [`XdpResponder::attach_to`] attaches the program.
//!
//! Use from gatherd: `XdpResponder::attach(iface, mode, port, keys)`, then make the map
//! the node's only region: publish the load record through [`XdpResponder::region`],
//! serve tcp and the user-space udp fallback from that same mapping, and give same-host
//! shm readers the map itself ([`XdpResponder::region_fd`], handed out by
//! `farside_rmem::fdshare`), so every transport
//! operates on the same words.
//!
//! The same object holds the kernel-resident load sampler ([`ksamp`]): started with
//! [`XdpResponder::start_kernel_sampler`], it writes the load record into the region map
//! from the kernel, so no user process publishes the load either. It needs no XDP: on a
//! host that answers udp from user space, [`XdpResponder::load_for_sampler`] creates
//! the maps alone and the region map is the node's region all the same.
//!
//! The object arena (`farside_arena`): a second `BPF_F_MMAPABLE` array map,
//! `rmem_arena`, one [`ARENA_CHUNK_BYTES`] chunk per element, created with the chunk
//! count the node asks for ([`XdpResponder::load_with_arena`], at most
//! [`ARENA_CHUNKS_MAX`]; one chunk otherwise). READs whose region is
//! [`farside_arena::layout::ARENA_REGION`] are answered from it, under keys whose rights
//! name that region (arena readers: READ only), each READ within one chunk. WRITEs of
//! the arena are answered under keys with chunk grants only
//! (`farside_auth::rights::Rights::chunk_writer`: a peer's slot), each WRITE inside one
//! granted chunk, deduplicated like every mutation (`farside_rmem::ops::check_arena` is
//! the reference rule). The process that owns the objects writes them through [`XdpResponder::arena`] (a `MAP_SHARED`
//! mapping) with `farside_arena`'s seqlock writer. Every arena READ answered adds one
//! to its chunk's counter in `rmem_arena_reads` (mapped too): the owner learns which
//! objects peers read one-sidedly ([`ArenaMemory::take_reads`]) and keeps them as
//! recently used.
//!
//! Everything here needs CAP_BPF and CAP_NET_ADMIN (root in practice).

pub mod ksamp;

/// The kernel-BTF reader now lives in the BPF runtime; kept here for its users.
pub use farside_bpfrt::btf;
pub use farside_bpfrt::{is_root, XdpMode};
pub use ksamp::{enable_bpf_stats, KernelSamplerCosts, PortCounts, ProgCost};

use farside_auth::keys::Keyring;
use farside_bpfrt::{Error, Object};
use farside_region::{MappedWords, Words, REGION_WORDS};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

/// Largest READ the XDP program answers: the reply, 14 (Ethernet) + 20 (IPv4) + 8 (UDP) +
/// 24 (reply header) + 1400 = 1466 bytes, fits a 1500-byte MTU. Mirrored in
/// `bpf/rmem_consts.h`, which `tests/consts.rs` checks against this.
pub const XDP_READ_BYTES_MAX: usize = 1400;

/// Bytes of one arena chunk (one element of the arena map, the most one arena READ
/// returns): `farside_arena::layout::CHUNK_BYTES`, mirrored in `bpf/rmem_consts.h`.
pub const ARENA_CHUNK_BYTES: usize = farside_arena::layout::CHUNK_BYTES;
/// Most chunks of the arena map (its declared `max_entries`).
pub const ARENA_CHUNKS_MAX: usize = farside_arena::layout::ARENA_CHUNKS_MAX;
/// Chunks of the arena map when the node asks for none: one, the smallest map the
/// kernel creates (every READ of it then finds an empty chunk 0 or OutOfBounds).
pub const ARENA_CHUNKS_NONE: u32 = 1;

/// Most keys the program holds (`max_entries` of its keys map): a keyring's bound.
pub const KEYS_MAX: usize = farside_auth::keys::KEYS_MAX;
/// Most grants per key (the bound of the program's grant loop).
pub const GRANTS_MAX: usize = farside_auth::rights::GRANTS_MAX;
/// Buckets of the program's replay map (a power of two): see `bpf/rmem_consts.h`.
pub const REPLAY_BUCKETS: usize = 1024;
/// Windows per bucket: a new sender in a full bucket evicts the one with the lowest
/// top, and the bucket's floor rises to it (`bpf/rmem_structs.h`, `struct rmem_bucket`).
pub const REPLAY_WAYS: usize = 4;
/// Senders whose replay window the program keeps at once, as user space
/// (`farside_auth::replay::SENDERS_MAX`).
pub const REPLAY_SENDERS_MAX: usize = REPLAY_BUCKETS * REPLAY_WAYS;
const _: () = assert!(REPLAY_SENDERS_MAX == farside_auth::replay::SENDERS_MAX);

/// Op counter slots (op codes 1..=4, 0 = unknown).
const OP_COUNTERS: usize = 5;
/// Status counter slots, one per `farside_rmem::wire::Status`.
const STATUS_COUNTERS: usize = farside_rmem::wire::STATUS_COUNT;
/// Counter slots in the counters map: ops, statuses, aborted, no room (see
/// rmem_consts.h).
const COUNTERS: u32 = (OP_COUNTERS + STATUS_COUNTERS) as u32 + 2;
/// Index of the "reply could not be built" counter.
const COUNTER_ABORTED: u32 = COUNTERS - 2;
/// Index of the "READ passed to the stack: the frame could not grow" counter.
const COUNTER_NO_ROOM: u32 = COUNTERS - 1;

/// Clients whose last mutation the program remembers (max_entries of its LRU dedup map).
pub const DEDUP_CLIENTS_MAX: usize = farside_rmem::ops::DEDUP_CLIENTS_MAX;

/// The program as errors name it.
const LABEL: &str = "the rmem XDP program";
/// Name of the XDP program function in the object.
const PROG_NAME: &str = "rmem_xdp";
const MAP_REGION: &str = "rmem_region";
const MAP_KEYS: &str = "rmem_keys";
const MAP_CONFIG: &str = "rmem_config";
const MAP_COUNTERS: &str = "rmem_counters";
const MAP_DEDUP: &str = "rmem_dedup";
const MAP_SEQLIM: &str = "rmem_seqlim";
/// Entries of the sequence limits map (RMEM_SEQLIM_* in rmem_consts.h).
const SEQLIM_FLOOR: u32 = 0;
const SEQLIM_CEILING: u32 = 1;
const MAP_ARENA: &str = "rmem_arena";
/// Per-chunk counters of the arena READs the program answered (sized like the arena).
const MAP_ARENA_READS: &str = "rmem_arena_reads";
/// Grant op bits (RMEM_GRANT_* in rmem_consts.h).
const GRANT_READ: u8 = 1;
const GRANT_WRITE: u8 = 2;
const GRANT_CAS: u8 = 4;
const GRANT_FADD: u8 = 8;
/// Key flag: its grants are arena chunk ranges (RMEM_KEY_FLAG_CHUNKS in rmem_consts.h,
/// `farside_auth::rights::Rights::chunk_writer`).
pub const KEY_FLAG_CHUNKS: u32 = 1;

/// The compiled program (clang -target bpf), 8-byte aligned as ELF parsing needs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rmem.bpf.o"));

/// XDP actions as returned by [`TestProgram::run`].
pub mod action {
    pub const ABORTED: u32 = 0;
    pub const DROP: u32 = 1;
    pub const PASS: u32 = 2;
    pub const TX: u32 = 3;
}

/// What failed: the BPF runtime's error. Every message names the step, so gatherd can
/// log it and fall back (to generic mode after an attach error in native mode, or to
/// the user-space server).
pub type XdpError = farside_bpfrt::Error;

/// The kernel's `CLOCK_MONOTONIC` in ns: the clock `bpf_ktime_get_ns` reads, in which
/// a grant's deadline ([`XdpResponder::install_grant`]) is stated.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A bad argument, said as such.
fn config_error(m: impl std::fmt::Display) -> XdpError {
    Error::Config(format!("rmem XDP configuration: {m}"))
}

/// Value of the config map (struct rmem_config).
#[repr(C)]
#[derive(Clone, Copy)]
struct Config {
    udp_port: u16,
    reserved0: u16,
    /// Network byte order; 0 = any address.
    ipv4_addr: u32,
    /// Group READs' multicast address, network byte order; 0 = off.
    group_ipv4: u32,
    /// The node's MAC, source of group replies; all zero = unknown.
    node_mac: [u8; 6],
    reserved1: u16,
}

// SAFETY: repr(C), plain integers, no padding.
unsafe impl aya::Pod for Config {}

/// One grant of a key (struct rmem_grant).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct GrantValue {
    first: u16,
    end: u16,
    ops: u8,
    reserved: [u8; 3],
    fadd_delta_max: u64,
}

/// Value of the keys map (struct rmem_key): a key and its rights.
#[repr(C)]
#[derive(Clone, Copy)]
struct KeyValue {
    k0: u64,
    k1: u64,
    region: u32,
    grants: u32,
    grant: [GrantValue; GRANTS_MAX],
    /// A grant's bound source address, network byte order; 0: any.
    bound_ipv4: u32,
    /// [`KEY_FLAG_CHUNKS`] for chunk grants (`Rights::chunk_writer`), else 0.
    flags: u32,
    /// `CLOCK_MONOTONIC` ns from which the key opens nothing; 0: never.
    expires_ns: u64,
}

// SAFETY: repr(C), plain integers, no padding (sizes asserted in the tests).
unsafe impl aya::Pod for KeyValue {}

impl KeyValue {
    fn of(e: &farside_auth::keys::KeyEntry) -> KeyValue {
        use farside_auth::rights::Op;
        let (k0, k1) = e.key.halves();
        let mut grant = [GrantValue::default(); GRANTS_MAX];
        let grants = e.rights.grants();
        for (g, v) in grants.iter().zip(grant.iter_mut()) {
            let bit = |op: Op, b: u8| if g.ops.contains(op) { b } else { 0 };
            *v = GrantValue {
                first: g.words.first as u16,
                end: g.words.end as u16,
                ops: bit(Op::Read, GRANT_READ)
                    | bit(Op::Write, GRANT_WRITE)
                    | bit(Op::CompareSwap, GRANT_CAS)
                    | bit(Op::FetchAdd, GRANT_FADD),
                reserved: [0; 3],
                fadd_delta_max: g.fadd_delta_max,
            };
        }
        KeyValue {
            k0,
            k1,
            region: e.rights.region(),
            grants: grants.len().min(GRANTS_MAX) as u32,
            grant,
            bound_ipv4: 0,
            flags: if e.rights.is_chunked() {
                KEY_FLAG_CHUNKS
            } else {
                0
            },
            expires_ns: 0,
        }
    }
}

/// Value of the dedup map (struct rmem_dedup): the last mutation of one client.
#[repr(C)]
#[derive(Clone, Copy)]
struct DedupValue {
    /// Last seq claimed.
    seq: u64,
    /// Last seq whose reply (`old`) is recorded.
    done_seq: u64,
    /// CAS/FADD: the old value returned; WRITE: 0.
    old: u64,
}

// SAFETY: repr(C), plain integers, no padding.
unsafe impl aya::Pod for DedupValue {}

/// `(ops, status)` counters: ops by op code (0 = unknown), replies by `Status as u8`.
pub type Counters = ([u64; OP_COUNTERS], [u64; STATUS_COUNTERS]);

/// The arena map, mapped shared and writable: the owner process writes objects here
/// (`farside_arena::ArenaMap` over [`ArenaMemory::bytes_mut`]) while the program reads
/// them. One writer: hand it out behind a lock.
pub struct ArenaMemory {
    map: farside_bpfrt::MmapArray,
    bytes: usize,
    /// `rmem_arena_reads`: one u64 per chunk, added to by the program per READ.
    reads: farside_bpfrt::MmapArray,
}

impl ArenaMemory {
    /// Chunks of the map.
    pub fn chunks(&self) -> usize {
        self.bytes / ARENA_CHUNK_BYTES
    }

    /// The whole arena, `chunks() * ARENA_CHUNK_BYTES` bytes, chunk `i` at
    /// `i * ARENA_CHUNK_BYTES`. The kernel reads it concurrently: write it only with the
    /// seqlock protocol (`farside_arena::slot`).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is at least `bytes` long (rounded up to pages), lives as
        // long as self, and &mut self makes this the only user-space view of it.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr(), self.bytes) }
    }

    /// READs of chunk `chunk` the program answered since the last call (the
    /// `rmem_arena_reads` counter, swapped to 0); 0 for a chunk beyond the map.
    pub fn take_reads(&self, chunk: usize) -> u64 {
        if chunk >= self.chunks() {
            return 0;
        }
        // SAFETY: the counters map holds one 8-byte, 8-aligned value per chunk of the
        // arena (same max_entries), mapped page-aligned for as long as self lives; the
        // program adds to it atomically, so it is only accessed atomically here.
        let word = unsafe {
            std::sync::atomic::AtomicU64::from_ptr(self.reads.as_ptr().cast::<u64>().add(chunk))
        };
        word.swap(0, std::sync::atomic::Ordering::Relaxed)
    }
}

/// The loaded (not necessarily attached) program, configured, with its region mapped.
struct Loaded {
    obj: Object,
    region: Arc<MappedWords>,
    arena: Arc<std::sync::Mutex<ArenaMemory>>,
    /// Set while the kernel sampler runs.
    sampler: Option<ksamp::SamplerState>,
    /// Wall time of each start-up step, in order (see [`XdpResponder::startup_stages`]).
    stages: Vec<(&'static str, Duration)>,
    /// The XDP program is loaded (verified).
    verified: bool,
}

impl Loaded {
    fn load(udp_port: u16, keys: &Keyring, arena_chunks: u32) -> Result<Loaded, XdpError> {
        if keys.len() > KEYS_MAX {
            return Err(config_error(format!(
                "{} keys, at most {KEYS_MAX}",
                keys.len()
            )));
        }
        if arena_chunks == 0 || arena_chunks as usize > ARENA_CHUNKS_MAX {
            return Err(config_error(format!(
                "{arena_chunks} arena chunks: 1 to {ARENA_CHUNKS_MAX}"
            )));
        }
        let mut lap = Lap::new();
        let mut obj = Object::load_sized(
            LABEL,
            OBJECT,
            &[(MAP_ARENA, arena_chunks), (MAP_ARENA_READS, arena_chunks)],
        )?;
        lap.stage("maps");
        obj.program::<aya::programs::Xdp>(PROG_NAME)?;
        let config = Config {
            udp_port,
            reserved0: 0,
            ipv4_addr: 0,
            group_ipv4: 0,
            node_mac: [0; 6],
            reserved1: 0,
        };
        obj.array_set(MAP_CONFIG, 0, config, "setting the port")?;
        {
            let mut key_map: aya::maps::HashMap<&mut aya::maps::MapData, u32, KeyValue> =
                obj.typed_mut(MAP_KEYS)?;
            for e in keys.iter() {
                key_map
                    .insert(e.id.0, KeyValue::of(e), 0)
                    .map_err(|err| Error::map(LABEL, "adding a key", &err))?;
            }
        }
        let region = {
            if !matches!(obj.map(MAP_REGION)?, aya::maps::Map::Array(_)) {
                return Err(Error::Missing {
                    program: LABEL,
                    kind: "map",
                    name: MAP_REGION.into(),
                    detail: "not an array map".into(),
                });
            }
            let fd = obj.map_fd(MAP_REGION)?.as_raw_fd();
            Arc::new(
                MappedWords::map_fd(fd, REGION_WORDS)
                    .map_err(|e| Error::os(LABEL, "mmap of the region map", e))?,
            )
        };
        let arena = {
            let bytes = arena_chunks as usize * ARENA_CHUNK_BYTES;
            let map = farside_bpfrt::MmapArray::map(obj.map_fd(MAP_ARENA)?, bytes)
                .map_err(|e| Error::os(LABEL, "mmap of the arena map", e))?;
            let reads = farside_bpfrt::MmapArray::map(
                obj.map_fd(MAP_ARENA_READS)?,
                arena_chunks as usize * 8,
            )
            .map_err(|e| Error::os(LABEL, "mmap of the arena read counters", e))?;
            Arc::new(std::sync::Mutex::new(ArenaMemory { map, bytes, reads }))
        };
        lap.stage("config_mmap");
        Ok(Loaded {
            obj,
            region,
            arena,
            sampler: None,
            stages: lap.stages,
            verified: false,
        })
    }

    /// Load (verify) the XDP program, once.
    fn verify(&mut self) -> Result<(), XdpError> {
        if self.verified {
            return Ok(());
        }
        let mut lap = Lap::new();
        self.obj.load_program::<aya::programs::Xdp>(PROG_NAME)?;
        lap.stage("xdp_verify");
        self.stages.append(&mut lap.stages);
        self.verified = true;
        Ok(())
    }

    /// See [`XdpResponder::seed_dedup`].
    fn seed_dedup(&mut self, entries: &[(u64, u64, u64)]) -> Result<(), XdpError> {
        if entries.len() > DEDUP_CLIENTS_MAX {
            return Err(config_error(format!(
                "{} dedup entries, the map holds {DEDUP_CLIENTS_MAX}",
                entries.len()
            )));
        }
        let mut m: aya::maps::HashMap<&mut aya::maps::MapData, u64, DedupValue> =
            self.obj.typed_mut(MAP_DEDUP)?;
        for &(client, seq, old) in entries {
            let v = DedupValue {
                seq,
                done_seq: seq,
                old,
            };
            m.insert(client, v, 0)
                .map_err(|e| Error::map(LABEL, "seeding the dedup map", &e))?;
        }
        Ok(())
    }

    /// Remove key `id`: nothing under it verifies from now on. Its replay windows stay
    /// (a key id that comes back with the same key must not accept old requests).
    fn revoke_key(&mut self, id: u32) -> Result<bool, XdpError> {
        let mut m: aya::maps::HashMap<&mut aya::maps::MapData, u32, KeyValue> =
            self.obj.typed_mut(MAP_KEYS)?;
        Ok(m.remove(&id).is_ok())
    }

    /// Install a grant: key `e` opening requests only from `bound` until
    /// `expires_ns` (`CLOCK_MONOTONIC`, the kernel's `bpf_ktime_get_ns`), whatever the
    /// server's process does after. Refused when the keys map is full.
    fn install_grant(
        &self,
        e: &farside_auth::keys::KeyEntry,
        bound: std::net::Ipv4Addr,
        expires_ns: u64,
    ) -> Result<(), XdpError> {
        let m = self.obj.raw_map(MAP_KEYS)?;
        let mut v = KeyValue::of(e);
        v.bound_ipv4 = u32::from_ne_bytes(bound.octets());
        v.expires_ns = expires_ns;
        m.update(&e.id.0, &v, farside_bpfrt::flags::ANY)
            .map_err(|err| Error::os(LABEL, "installing a grant", err))
    }

    /// Remove key `id` through a shared handle (grants end while workers run).
    fn revoke_grant(&self, id: u32) -> Result<bool, XdpError> {
        let m = self.obj.raw_map(MAP_KEYS)?;
        match m.delete(&id) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(Error::os(LABEL, "revoking a grant", e)),
        }
    }

    /// Make the keys map hold exactly `keys`: new and changed keys written in place,
    /// ids no longer in it removed (revoked at once). Returns the ids removed.
    fn set_keys(&self, keys: &Keyring) -> Result<Vec<u32>, XdpError> {
        if keys.len() > KEYS_MAX {
            return Err(config_error(format!(
                "{} keys, at most {KEYS_MAX}",
                keys.len()
            )));
        }
        let m = self.obj.raw_map(MAP_KEYS)?;
        let os = |step: &str, e: io::Error| Error::os(LABEL, step, e);
        // Removed first: the map's bound holds for old and new keys together only then.
        let gone: Vec<u32> = m
            .keys::<u32>(KEYS_MAX)
            .map_err(|e| os("listing the keys", e))?
            .into_iter()
            .filter(|id| keys.get(farside_auth::mac::KeyId(*id)).is_none())
            .collect();
        for id in &gone {
            match m.delete(id) {
                Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                    return Err(os("revoking a key", e))
                }
                _ => {}
            }
        }
        for e in keys.iter() {
            m.update(&e.id.0, &KeyValue::of(e), farside_bpfrt::flags::ANY)
                .map_err(|err| os("adding a key", err))?;
        }
        Ok(gone)
    }

    /// Set the replay windows' restart floor and ceiling (`farside_auth::floor`;
    /// ceiling `u64::MAX`: none). Both only rise: lower values are ignored.
    fn set_replay_limits(&self, limits: farside_auth::floor::Limits) -> Result<(), XdpError> {
        let m = self.obj.raw_map(MAP_SEQLIM)?;
        let os = |e: io::Error| Error::os(LABEL, "setting the replay limits", e);
        let get = |i: u32| -> Result<u64, XdpError> {
            Ok(m.lookup::<u32, u64>(&i).map_err(os)?.unwrap_or(0))
        };
        if limits.floor > get(SEQLIM_FLOOR)? {
            m.update(&SEQLIM_FLOOR, &limits.floor, farside_bpfrt::flags::ANY)
                .map_err(os)?;
        }
        // 0 in the map: no ceiling; u64::MAX asked: none either.
        if limits.ceiling != u64::MAX && limits.ceiling > get(SEQLIM_CEILING)? {
            m.update(&SEQLIM_CEILING, &limits.ceiling, farside_bpfrt::flags::ANY)
                .map_err(os)?;
        }
        Ok(())
    }

    /// Answer only datagrams to `addr` (None: any address). Takes effect at once.
    fn set_node_addr(&mut self, addr: Option<std::net::Ipv4Addr>) -> Result<(), XdpError> {
        self.update_config("setting the node address", |c| {
            c.ipv4_addr = addr.map(|a| u32::from_ne_bytes(a.octets())).unwrap_or(0);
        })
    }

    /// See [`XdpResponder::set_group_read`].
    fn set_group_read(
        &mut self,
        group: Option<std::net::Ipv4Addr>,
        node_mac: [u8; 6],
    ) -> Result<(), XdpError> {
        if let Some(g) = group {
            if !g.is_multicast() {
                return Err(config_error(format!(
                    "group read address {g}: not an IPv4 multicast group (224.0.0.0/4)"
                )));
            }
        }
        self.update_config("setting the group read", |c| {
            c.group_ipv4 = group.map(|a| u32::from_ne_bytes(a.octets())).unwrap_or(0);
            c.node_mac = node_mac;
        })
    }

    /// Read, change and write back the config map's one value.
    fn update_config(&mut self, step: &str, f: impl FnOnce(&mut Config)) -> Result<(), XdpError> {
        let mut c: Config = self.obj.array_get(MAP_CONFIG, 0)?;
        f(&mut c);
        self.obj.array_set(MAP_CONFIG, 0, c, step)
    }

    /// See [`XdpResponder::start_kernel_sampler`].
    fn start_sampler(
        &mut self,
        ports: &[u16],
        period: Duration,
        seed: &mut dyn FnMut() -> io::Result<Vec<PortCounts>>,
    ) -> Result<(), XdpError> {
        if self.sampler.is_some() {
            return Err(config_error("the kernel sampler already runs"));
        }
        self.sampler = Some(self.start_kernel_sampler(ports, period, seed)?);
        Ok(())
    }

    fn costs(&self) -> Option<KernelSamplerCosts> {
        self.sampler.as_ref().map(|s| self.sampler_costs(s))
    }

    /// (ops, status) like `farside_rmem::OpCounters`; zeros if the map cannot be read.
    fn counters(&self) -> Counters {
        let raw = self
            .obj
            .per_cpu_sums(MAP_COUNTERS, COUNTERS)
            .unwrap_or_else(|_| vec![0; COUNTERS as usize]);
        let mut ops = [0u64; OP_COUNTERS];
        let mut status = [0u64; STATUS_COUNTERS];
        ops.copy_from_slice(&raw[..OP_COUNTERS]);
        status.copy_from_slice(&raw[OP_COUNTERS..OP_COUNTERS + STATUS_COUNTERS]);
        (ops, status)
    }

    fn counter(&self, i: u32) -> u64 {
        self.obj.per_cpu_sum(MAP_COUNTERS, i).unwrap_or(0)
    }
}

/// Wall-clock laps of a start-up, one named stage at a time.
pub(crate) struct Lap {
    last: std::time::Instant,
    pub(crate) stages: Vec<(&'static str, Duration)>,
}

impl Lap {
    pub(crate) fn new() -> Lap {
        Lap {
            last: std::time::Instant::now(),
            stages: Vec::new(),
        }
    }

    /// Record the time since the previous stage (or the start) under `name`.
    pub(crate) fn stage(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.stages.push((name, now - self.last));
        self.last = now;
    }
}

/// The program attached to an interface. Detached when dropped; the region mapping
/// handed out by [`XdpResponder::region`] stays valid after that.
pub struct XdpResponder {
    loaded: Loaded,
    link: Option<aya::programs::xdp::XdpLinkId>,
    ifname: String,
    mode: XdpMode,
    /// Made by [`XdpResponder::load_for_sampler`]: no udp port, never attached.
    sampler_only: bool,
}

impl XdpResponder {
    /// Load the program, configure port and keys (`(key, read_write)`, at most
    /// [`KEYS_MAX`]), attach to `ifname` in `mode`. The interface is looked up in the
    /// calling thread's network namespace.
    pub fn attach(
        ifname: &str,
        mode: XdpMode,
        udp_port: u16,
        keys: &Keyring,
    ) -> Result<XdpResponder, XdpError> {
        Self::attach_with(ifname, mode, udp_port, keys, |_| {})
    }

    /// As [`XdpResponder::load`], with an arena map of `arena_chunks` chunks (1 to
    /// [`ARENA_CHUNKS_MAX`]; `farside_arena::map_chunks` says how many a layout needs).
    pub fn load_with_arena(
        udp_port: u16,
        keys: &Keyring,
        arena_chunks: u32,
    ) -> Result<XdpResponder, XdpError> {
        if udp_port == 0 {
            return Err(config_error("udp port 0 (the program would serve nothing)"));
        }
        Ok(XdpResponder {
            loaded: Loaded::load(udp_port, keys, arena_chunks)?,
            link: None,
            ifname: String::new(),
            mode: XdpMode::Generic,
            sampler_only: false,
        })
    }

    /// The arena map's memory (see [`ArenaMemory`]), valid after the responder is gone.
    pub fn arena(&self) -> Arc<std::sync::Mutex<ArenaMemory>> {
        self.loaded.arena.clone()
    }

    /// Like [`XdpResponder::attach`], with `init` given the region after the maps are
    /// created and before the program is attached: what it writes there is the first thing any
    /// request can read (no window in which the kernel answers from a zeroed region).
    pub fn attach_with(
        ifname: &str,
        mode: XdpMode,
        udp_port: u16,
        keys: &Keyring,
        init: impl FnOnce(Arc<dyn Words>),
    ) -> Result<XdpResponder, XdpError> {
        let mut x = XdpResponder::load(udp_port, keys)?;
        init(x.region());
        x.attach_to(ifname, mode)?;
        Ok(x)
    }

    /// Create the maps, configure port and keys, and map the region, without loading
    /// or attaching the program: the region exists (and can be served from user space,
    /// shared with shm readers, written by the sampler) before the slow steps, the
    /// program's verification and attach ([`XdpResponder::attach_to`]), so a restarted
    /// gatherd answers from its region within milliseconds while XDP comes up.
    pub fn load(udp_port: u16, keys: &Keyring) -> Result<XdpResponder, XdpError> {
        Self::load_with_arena(udp_port, keys, ARENA_CHUNKS_NONE)
    }

    /// Create the maps (the region among them) for the kernel sampler alone, on a host
    /// whose udp requests are not answered in the kernel: no port, no keys, and the
    /// XDP program is never verified nor attached ([`Self::attach_to`] refuses). The
    /// region map is the node's region as with XDP (mapped by [`Self::region`], handed
    /// to shm readers by [`Self::region_fd`]); [`Self::start_kernel_sampler`] then
    /// publishes into it. Needs CAP_BPF (root in practice), not CAP_NET_ADMIN.
    pub fn load_for_sampler() -> Result<XdpResponder, XdpError> {
        Ok(XdpResponder {
            loaded: Loaded::load(
                0,
                &Keyring::new(farside_auth::keys::Policy::Production),
                ARENA_CHUNKS_NONE,
            )?,
            link: None,
            ifname: String::new(),
            mode: XdpMode::Generic,
            sampler_only: true,
        })
    }

    /// Whether this responder may answer udp (made by [`Self::load`], attached or not),
    /// as opposed to holding the kernel sampler's maps alone
    /// ([`Self::load_for_sampler`]).
    pub fn serves_udp(&self) -> bool {
        !self.sampler_only
    }

    /// Load (verify) the program if not yet done and attach it to `ifname` in `mode`.
    /// On error nothing is attached and the responder (its maps, its region) stays
    /// usable: try another mode, or keep serving the region from user space.
    pub fn attach_to(&mut self, ifname: &str, mode: XdpMode) -> Result<(), XdpError> {
        if self.link.is_some() {
            return Err(config_error(format!("already attached to {}", self.ifname)));
        }
        if self.sampler_only {
            return Err(config_error(
                "loaded for the kernel sampler alone (no udp port): not attachable",
            ));
        }
        self.loaded.verify()?;
        let mut lap = Lap::new();
        let link = self.loaded.obj.attach_xdp(PROG_NAME, ifname, mode)?;
        lap.stage("xdp_attach");
        self.loaded.stages.append(&mut lap.stages);
        self.link = Some(link);
        self.ifname = ifname.to_string();
        self.mode = mode;
        Ok(())
    }

    /// Start the program's duplicate-detection table from another's entries
    /// `(client, seq, old)`: each client's last applied mutation and the old value it
    /// returned (`farside_rmem::Dedup::hand_over_datagrams`). A retry of one of them is
    /// then replayed by the program, not applied again. Call before [`Self::attach_to`]:
    /// the table must be complete before the program answers. At most
    /// [`DEDUP_CLIENTS_MAX`] entries.
    pub fn seed_dedup(&mut self, entries: &[(u64, u64, u64)]) -> Result<(), XdpError> {
        self.loaded.seed_dedup(entries)
    }

    /// Revoke key `id` in the kernel at once.
    pub fn revoke_key(&mut self, id: u32) -> Result<bool, XdpError> {
        self.loaded.revoke_key(id)
    }

    /// Replace the program's keys with `keys` in place, while it runs (a reload of the
    /// key files): ids not in `keys` are revoked at once. Returns the ids revoked.
    pub fn set_keys(&self, keys: &Keyring) -> Result<Vec<u32>, XdpError> {
        self.loaded.set_keys(keys)
    }

    /// Install (or replace) a grant while the program runs: key `entry` opens requests
    /// only from source `bound`, and nothing from `expires_ns` on (`CLOCK_MONOTONIC`
    /// ns: [`monotonic_ns`]). The kernel enforces both, so a grant ends on time even
    /// when the process that issued it is not scheduled. Revoke with [`Self::revoke_key`].
    pub fn install_grant(
        &self,
        entry: &farside_auth::keys::KeyEntry,
        bound: std::net::Ipv4Addr,
        expires_ns: u64,
    ) -> Result<(), XdpError> {
        self.loaded.install_grant(entry, bound, expires_ns)
    }

    /// Remove grant `id` (any key id) at once, through a shared handle; false if it
    /// was not there.
    pub fn revoke_grant(&self, id: u32) -> Result<bool, XdpError> {
        self.loaded.revoke_grant(id)
    }

    /// Set the replay windows' restart floor and ceiling (`farside_auth::floor`), while
    /// it runs; both only rise.
    pub fn set_replay_limits(&self, limits: farside_auth::floor::Limits) -> Result<(), XdpError> {
        self.loaded.set_replay_limits(limits)
    }

    /// Whether the program is attached (requests to the port are answered in the kernel).
    pub fn is_attached(&self) -> bool {
        self.link.is_some()
    }

    /// The region as words: a `MAP_SHARED`, read-write mapping of the region map.
    pub fn region(&self) -> Arc<dyn Words> {
        self.loaded.region.clone()
    }

    /// Wall time of each start-up step so far, in order: `maps` (object parse and map
    /// creation), `xdp_verify` (BPF_PROG_LOAD), `config_mmap`, `init_region` (the
    /// caller's `init`), `xdp_attach`, then the kernel sampler's (`ksamp_btf`,
    /// `ksamp_events`, `ksamp_seed`, `ksamp_ticks`) once started.
    pub fn startup_stages(&self) -> &[(&'static str, Duration)] {
        &self.loaded.stages
    }

    /// `(ops, status)` counters summed over CPUs, indexed like `farside_rmem::OpCounters`
    /// (ops by op code with 0 = unknown; status by `Status as u8`). Dropped requests
    /// (bad key, malformed) are counted too, as the user-space server does.
    pub fn counters(&self) -> Counters {
        self.loaded.counters()
    }

    /// Answer only datagrams addressed to `addr` (None: any destination address), so
    /// that packets for other hosts that reach the interface (a bridge port, a
    /// promiscuous device) are never answered. Takes effect at once.
    pub fn set_node_addr(&mut self, addr: Option<std::net::Ipv4Addr>) -> Result<(), XdpError> {
        self.loaded.set_node_addr(addr)
    }

    /// Answer group READs: READs addressed to the multicast `group` (in a frame to its
    /// multicast MAC) are answered like unicast ones, from the node's own address (set
    /// with [`Self::set_node_addr`]) and `node_mac` (the interface's MAC); WRITEs and
    /// atomics to the group are dropped. Group READs go to the stack while the node's
    /// address or MAC is unknown (None / all zero). `None`: off (the default). Takes
    /// effect at once; refused if `group` is not multicast.
    pub fn set_group_read(
        &mut self,
        group: Option<std::net::Ipv4Addr>,
        node_mac: [u8; 6],
    ) -> Result<(), XdpError> {
        self.loaded.set_group_read(group, node_mac)
    }

    /// The region map's fd (valid while the responder lives), for handing the map to
    /// same-host shm readers (`farside_rmem::fdshare`): they map the very words the
    /// kernel answers from.
    pub fn region_fd(&self) -> std::os::fd::RawFd {
        self.loaded
            .obj
            .map_fd(MAP_REGION)
            .expect("checked at load")
            .as_raw_fd()
    }

    /// Requests whose reply could not be built (the frame could not grow): XDP_ABORTED.
    pub fn aborted(&self) -> u64 {
        self.loaded.counter(COUNTER_ABORTED)
    }

    /// READs passed to the stack (to gatherd's user-space server on the same port, if
    /// it runs) because the receive buffer had no room to grow the frame to the reply.
    /// Clients that pad READ requests to the reply's size never cause this.
    pub fn no_room(&self) -> u64 {
        self.loaded.counter(COUNTER_NO_ROOM)
    }

    /// Start the kernel-resident sampler (see [`ksamp`]): from now on the kernel writes
    /// the load record every `period` and the caller must stop writing it. `ports` are
    /// the watched TCP ports (at most [`ksamp::SAMPLER_PORTS_MAX`]); `seed` counts their
    /// existing connections (one [`PortCounts`] per port), called once the event
    /// programs are attached and every program is verified, right before the ticks
    /// start: a user-space writer of the record stops there (the handover), and the
    /// record is next written by the first tick, one `period` and the tick attach later. On error nothing of the sampler stays attached.
    pub fn start_kernel_sampler(
        &mut self,
        ports: &[u16],
        period: Duration,
        seed: &mut dyn FnMut() -> io::Result<Vec<PortCounts>>,
    ) -> Result<(), XdpError> {
        self.loaded.start_sampler(ports, period, seed)
    }

    /// Stop the kernel sampler's ticks: the record stops advancing (as when a user-space
    /// gatherer stops). Connection events keep being counted; the sampler cannot be
    /// restarted on this responder.
    pub fn stop_kernel_sampler_ticks(&self) {
        if let Some(s) = &self.loaded.sampler {
            s.stop_ticks();
        }
    }

    /// Kernel cost of the sampler's programs, if it runs (zeros unless BPF stats are
    /// enabled: [`enable_bpf_stats`] or `sysctl kernel.bpf_stats_enabled=1`).
    pub fn kernel_sampler_costs(&self) -> Option<KernelSamplerCosts> {
        self.loaded.costs()
    }

    /// Run time and count of each loaded program of the object, by name: the XDP
    /// responder (`rmem_xdp`, once verified) and the kernel sampler's (`ksamp_tick`,
    /// `ksamp_state`, `ksamp_ready`, while it runs). Zeros unless BPF statistics are
    /// on (`farside_bpfrt::stats_enabled`).
    pub fn program_stats(&self) -> Vec<(&'static str, farside_bpfrt::ProgStats)> {
        let mut names = vec![PROG_NAME];
        if self.loaded.sampler.is_some() {
            names.extend(ksamp::PROGRAMS);
        }
        names
            .into_iter()
            .filter_map(|n| Some((n, self.loaded.obj.program_stats(n)?)))
            .collect()
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    pub fn mode(&self) -> XdpMode {
        self.mode
    }
}

impl Drop for XdpResponder {
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            // Dropping the program would detach too; doing it here keeps the order explicit.
            let _ = self.loaded.obj.detach_xdp(PROG_NAME, link, &self.ifname);
        }
    }
}

/// The program loaded and configured but not attached, for `BPF_PROG_TEST_RUN`: packet
/// tests and per-packet cost.
pub struct TestProgram {
    loaded: Loaded,
}

impl TestProgram {
    /// Load and configure (port, keys) without attaching.
    pub fn load(udp_port: u16, keys: &Keyring) -> Result<TestProgram, XdpError> {
        Self::load_with_arena(udp_port, keys, ARENA_CHUNKS_NONE)
    }

    /// As [`TestProgram::load`], with an arena map of `arena_chunks` chunks.
    pub fn load_with_arena(
        udp_port: u16,
        keys: &Keyring,
        arena_chunks: u32,
    ) -> Result<TestProgram, XdpError> {
        let mut loaded = Loaded::load(udp_port, keys, arena_chunks)?;
        loaded.verify()?;
        Ok(TestProgram { loaded })
    }

    /// As [`XdpResponder::arena`].
    pub fn arena(&self) -> Arc<std::sync::Mutex<ArenaMemory>> {
        self.loaded.arena.clone()
    }

    /// Run the program once on `packet` (an Ethernet frame). Returns the XDP action
    /// (see [`action`]) and the frame as the program left it.
    pub fn run(&self, packet: &[u8]) -> (u32, Vec<u8>) {
        self.try_run(packet)
            .map(|(a, out, _)| (a, out))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Mean time of one program run on `packet`, over `repeat` runs, as the kernel
    /// measures it (program run only, not the syscall). Each run gets a fresh copy of
    /// `packet`: the kernel's own repeat loop runs the program again on the frame the
    /// previous run rewrote (the reply), which measures the wrong path.
    pub fn run_repeat(&self, packet: &[u8], repeat: u32) -> Duration {
        let mut total_ns: u64 = 0;
        for _ in 0..repeat.max(1) {
            let (_, _, ns) = self.try_run(packet).unwrap_or_else(|e| panic!("{e}"));
            total_ns += u64::from(ns);
        }
        Duration::from_nanos(total_ns / u64::from(repeat.max(1)))
    }

    fn try_run(&self, packet: &[u8]) -> Result<(u32, Vec<u8>, u32), XdpError> {
        let r = self
            .loaded
            .obj
            .test_run(PROG_NAME, packet, farside_bpfrt::TEST_FRAME_BYTES_MAX)?;
        Ok((r.retval, r.frame, r.duration_ns))
    }

    /// The region as words (same mapping as the attached responder would give).
    pub fn region(&self) -> Arc<dyn Words> {
        self.loaded.region.clone()
    }

    /// `(ops, status)` counters, as [`XdpResponder::counters`].
    pub fn counters(&self) -> Counters {
        self.loaded.counters()
    }

    /// As [`XdpResponder::start_kernel_sampler`] (the sampler needs no attached XDP).
    pub fn start_kernel_sampler(
        &mut self,
        ports: &[u16],
        period: Duration,
        seed: &mut dyn FnMut() -> io::Result<Vec<PortCounts>>,
    ) -> Result<(), XdpError> {
        self.loaded.start_sampler(ports, period, seed)
    }

    /// Stop the kernel sampler: the record stops advancing.
    pub fn stop_kernel_sampler(&mut self) {
        if let Some(s) = self.loaded.sampler.take() {
            s.stop_ticks();
        }
        self.loaded.stop_kernel_sampler();
    }

    /// As [`XdpResponder::kernel_sampler_costs`].
    pub fn kernel_sampler_costs(&self) -> Option<KernelSamplerCosts> {
        self.loaded.costs()
    }

    /// As [`XdpResponder::seed_dedup`].
    pub fn seed_dedup(&mut self, entries: &[(u64, u64, u64)]) -> Result<(), XdpError> {
        self.loaded.seed_dedup(entries)
    }

    /// As [`XdpResponder::install_grant`].
    pub fn install_grant(
        &self,
        entry: &farside_auth::keys::KeyEntry,
        bound: std::net::Ipv4Addr,
        expires_ns: u64,
    ) -> Result<(), XdpError> {
        self.loaded.install_grant(entry, bound, expires_ns)
    }

    /// Remove grant `id` (any key id) at once, through a shared handle; false if it
    /// was not there.
    pub fn revoke_grant(&self, id: u32) -> Result<bool, XdpError> {
        self.loaded.revoke_grant(id)
    }

    /// As [`XdpResponder::set_node_addr`].
    pub fn set_node_addr(&mut self, addr: Option<std::net::Ipv4Addr>) -> Result<(), XdpError> {
        self.loaded.set_node_addr(addr)
    }

    /// As [`XdpResponder::revoke_key`].
    pub fn revoke_key(&mut self, id: u32) -> Result<bool, XdpError> {
        self.loaded.revoke_key(id)
    }

    /// As [`XdpResponder::set_keys`].
    pub fn set_keys(&self, keys: &Keyring) -> Result<Vec<u32>, XdpError> {
        self.loaded.set_keys(keys)
    }

    /// As [`XdpResponder::set_replay_limits`].
    pub fn set_replay_limits(&self, limits: farside_auth::floor::Limits) -> Result<(), XdpError> {
        self.loaded.set_replay_limits(limits)
    }

    /// As [`XdpResponder::set_group_read`].
    pub fn set_group_read(
        &mut self,
        group: Option<std::net::Ipv4Addr>,
        node_mac: [u8; 6],
    ) -> Result<(), XdpError> {
        self.loaded.set_group_read(group, node_mac)
    }

    /// As [`XdpResponder::aborted`].
    pub fn aborted(&self) -> u64 {
        self.loaded.counter(COUNTER_ABORTED)
    }

    /// READs passed to the stack (to gatherd's user-space server on the same port, if
    /// it runs) because the receive buffer had no room to grow the frame to the reply.
    /// Clients that pad READ requests to the reply's size never cause this.
    pub fn no_room(&self) -> u64 {
        self.loaded.counter(COUNTER_NO_ROOM)
    }
}

/// Compile-time check: gatherd may share the responder between threads.
#[allow(dead_code)]
fn _assert_send_sync() {
    fn s<T: Send + Sync>() {}
    s::<XdpResponder>();
    s::<TestProgram>();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The private indices and values above mirror bpf/rmem_consts.h (the public
    /// limits are checked in tests/consts.rs).
    #[test]
    fn private_constants_match_the_bpf_header() {
        let header = include_str!("../../../bpf/rmem_consts.h");
        let define = |name: &str| -> u32 {
            header
                .lines()
                .find_map(|l| {
                    let mut it = l.split_whitespace();
                    (it.next() == Some("#define") && it.next() == Some(name))
                        .then(|| it.next().and_then(|v| v.parse().ok()))
                        .flatten()
                })
                .unwrap_or_else(|| panic!("{name} not a number in rmem_consts.h"))
        };
        assert_eq!(define("RMEM_COUNTERS"), COUNTERS);
        assert_eq!(define("RMEM_CNT_ABORTED"), COUNTER_ABORTED);
        assert_eq!(define("RMEM_CNT_NO_ROOM"), COUNTER_NO_ROOM);
        assert_eq!(define("RMEM_GRANT_READ"), GRANT_READ.into());
        assert_eq!(define("RMEM_GRANT_WRITE"), GRANT_WRITE.into());
        assert_eq!(define("RMEM_GRANT_CAS"), GRANT_CAS.into());
        assert_eq!(define("RMEM_GRANT_FADD"), GRANT_FADD.into());
        assert_eq!(std::mem::size_of::<GrantValue>(), 16);
        assert_eq!(std::mem::size_of::<KeyValue>(), 40 + 16 * GRANTS_MAX);
        assert_eq!(std::mem::size_of::<Config>(), 20);
        assert_eq!(std::mem::size_of::<DedupValue>(), 24);
    }
}
