//! Word offsets of the region. Every field is one little-endian 64-bit word.
//!
//! ```text
//! word   0..8     header         written once at start (magic, version, node, generation)
//! word   8..25    load record    seqlock block: SEQ_HEAD .. fields .. SEQ_TAIL
//! word  25..32    reserved       (pads the record to its own cache lines)
//! word  32..64    control        role / lock / counter words (docs/reconf.md): remote CAS and
//!                                FETCH-ADD, plus words only the local owner writes
//! word  64..512   scratch        application data (probe payloads, cache directory)
//! ```
//!
//! Remote READs may cover any word. Remote WRITE, COMPARE-AND-SWAP and FETCH-ADD are
//! confined to the control words (`WRITABLE_FIRST_WORD..WRITABLE_END_WORD`), so that no
//! key, read-write or not, can overwrite the header or the gatherer's load record.
//! Every server (shm, tcp, udp, XDP) enforces it (`farside_rmem::ops`, `bpf/`).
//!
//! The layout version changes whenever a word moves; readers refuse other versions.
//! These constants are the single source: the BPF side (`bpf/`) is checked against
//! them by a test.

/// Size of a region in 64-bit words.
pub const REGION_WORDS: usize = 512;
/// Size of a region in bytes (one 4 KiB page, so it maps and registers as one page).
pub const REGION_BYTES: usize = REGION_WORDS * 8;

/// `b"FSREGION"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"FSREGION");
/// Bumped whenever a word of this layout moves or changes meaning.
/// Version 2: `W_CONNS_SAMPLED_MONO_NS` (word 22) and `W_ROLE_WANTED` (word 34).
/// Version 3: `W_QUEUE_DELAY_US` (word 23); `W_SEQ_TAIL` moves to word 24.
pub const LAYOUT_VERSION: u64 = 3;

// ---- header (written once by the gatherer before the first record) ----
pub const W_MAGIC: usize = 0;
pub const W_LAYOUT_VERSION: usize = 1;
/// Operator-chosen node id.
pub const W_NODE_ID: usize = 2;
/// Changes on every gatherer start: a reader that sees it change knows the
/// sequence restarted and must not compare sequence numbers across it.
pub const W_GENERATION: usize = 3;
/// The gatherer's sampling period in microseconds.
pub const W_PERIOD_US: usize = 4;
/// Region size in bytes, so a reader can check it reads a region of the size it expects.
pub const W_REGION_BYTES: usize = 5;
/// Up to four watched TCP ports, 16 bits each (0 = unused).
pub const W_WATCHED_PORTS: usize = 6;
pub const HEADER_WORDS: usize = 8;

// ---- load record: a seqlock block ----
//
// The writer stores SEQ_TAIL first, then the fields, then SEQ_HEAD (all with release
// order). A reader that copies the block in ascending address order (one remote READ
// does) accepts it only if SEQ_HEAD == SEQ_TAIL != 0. See `seqlock.rs` for the argument.
pub const W_SEQ_HEAD: usize = 8;
/// Gatherer's CLOCK_MONOTONIC at the sample, in ns (meaningful on the gatherer's host only).
pub const W_SAMPLE_MONO_NS: usize = 9;
/// CPU utilisation over the last period, parts per million of all CPUs the gatherer watches.
pub const W_CPU_UTIL_PPM: usize = 10;
/// CPU pressure (PSI "some") over the last period, ppm of wall time.
pub const W_CPU_PRESSURE_PPM: usize = 11;
/// Runnable tasks (procs_running) at the sample.
pub const W_RUNNABLE: usize = 12;
/// Established TCP connections on the watched ports.
pub const W_CONNS_ESTABLISHED: usize = 13;
/// Connections waiting in the watched listeners' accept queues.
pub const W_ACCEPT_BACKLOG: usize = 14;
/// Established connections with unread request bytes (received, not yet read by the server).
pub const W_CONNS_PENDING: usize = 15;
pub const W_MEM_TOTAL_KB: usize = 16;
pub const W_MEM_AVAILABLE_KB: usize = 17;
/// Requests in flight where the server reports it, else 0 with FLAG_INFLIGHT clear.
pub const W_INFLIGHT: usize = 18;
/// Number of CPUs the utilisation is relative to.
pub const W_NCPU: usize = 19;
/// Which optional fields are valid, see `FLAG_*`.
pub const W_FLAGS: usize = 20;
/// The gatherer's sampling-thread CPU per sample, ns: mean over its last 64 samples,
/// the period's wake-up included (0 until the first 64; 0 from the kernel sampler).
pub const W_SAMPLE_COST_NS: usize = 21;
/// Gatherer's CLOCK_MONOTONIC when `W_CONNS_ESTABLISHED` and `W_CONNS_PENDING` were last
/// counted, ns. They are counted only every N samples (a full count walks the kernel's
/// TCP hash), so they can be older than `W_SAMPLE_MONO_NS`: their age at the sample is
/// `sample_mono_ns - conns_sampled_mono_ns`, and a reader applies its staleness bound to
/// that field's age, not the record's. 0 with FLAG_CONNS clear.
pub const W_CONNS_SAMPLED_MONO_NS: usize = 22;
/// The back-end's current queueing delay, µs: how long the oldest request that has
/// arrived on a watched port has waited unread (in an accept queue, or on an accepted
/// connection whose worker has not read it yet), CoDel's sojourn time measured from
/// outside the server. Valid with `FLAG_QUEUE_DELAY`; taken by the same dump as the
/// connection counts, so its time is `W_CONNS_SAMPLED_MONO_NS` and its inputs are
/// `W_CONNS_PENDING` and `W_ACCEPT_BACKLOG`. Any sampler (user space or a BPF one)
/// that can tell when the oldest waiting request arrived may fill it, and must set
/// `FLAG_QUEUE_DELAY`; 0 with the flag set means nothing is waiting.
pub const W_QUEUE_DELAY_US: usize = 23;
pub const W_SEQ_TAIL: usize = 24;
/// First word of the load record block (its SEQ_HEAD).
pub const RECORD_FIRST_WORD: usize = W_SEQ_HEAD;
/// Number of words from SEQ_HEAD to SEQ_TAIL inclusive.
pub const RECORD_WORDS: usize = W_SEQ_TAIL - W_SEQ_HEAD + 1;
/// Bytes a reader fetches in one READ to get header and record: words 0..=SEQ_TAIL.
pub const SNAPSHOT_BYTES: usize = (W_SEQ_TAIL + 1) * 8;

pub const FLAG_PSI: u64 = 1 << 0;
pub const FLAG_CONNS: u64 = 1 << 1;
pub const FLAG_INFLIGHT: u64 = 1 << 2;
pub const FLAG_MEM: u64 = 1 << 3;
/// `W_QUEUE_DELAY_US` is measured.
pub const FLAG_QUEUE_DELAY: u64 = 1 << 4;

// ---- control area (seed 001: reconfiguration, `farside_reconf`, docs/reconf.md) ----
//
// Role words are `site << 48 | version` (`farside_reconf::Role`): the version changes
// with every write, so a CAS that expects an older value can never succeed again.
/// The role the node serves now (site|version): the `W_ROLE_WANTED` value its agent
/// applied. Written only by the node's own agent (gatherd's role module), never
/// remotely; proxies route a site's requests to nodes whose served site is that site.
pub const W_ROLE_SERVED: usize = 32;
/// Former name of [`W_ROLE_SERVED`].
pub const W_ROLE_SITE: usize = W_ROLE_SERVED;
/// Bumped by the node's agent each time it starts serving a new site (readers detect a
/// switch).
pub const W_ROLE_EPOCH: usize = 33;
/// The role balancers want this node to serve (site|version): changed only by remote
/// COMPARE-AND-SWAP (a move) or FETCH-ADD of 1 (a fence: new version, same site). The
/// node's agent applies it and then copies it into `W_ROLE_SERVED`.
pub const W_ROLE_WANTED: usize = 34;
/// The `W_ROLE_WANTED` value whose apply failed on this node (0: the last apply
/// succeeded). Written only by the node's agent.
pub const W_ROLE_ERROR: usize = 35;
/// First of `LOCK_WORDS` site lock words (only the first, [`W_SITE_LOCK`], is used: on
/// a site's anchor node). Encoding `intent:20 | beat:12 | token:20 | owner:12` (high to
/// low, `farside_reconf::Lock`); owner 0 = free. It holds no expiry time: clocks are
/// not trusted across hosts, so a contender declares a lease expired when the whole
/// word stayed unchanged for the lease by its own monotonic clock.
pub const W_LOCK_BASE: usize = 40;
/// A site's lock word (on the site's anchor node, which never moves).
pub const W_SITE_LOCK: usize = W_LOCK_BASE;
pub const LOCK_WORDS: usize = 8;
/// First of `COUNTER_WORDS` counter words; in a balancer's region the first two are its
/// shared update counter and its heartbeat.
pub const W_COUNTER_BASE: usize = 48;
/// A balancer's shared update counter, in the balancer's own region: peers FETCH-ADD it
/// after every move (the paper's dual update counters).
pub const W_SHARED_COUNTER: usize = W_COUNTER_BASE;
/// A balancer's heartbeat, in its own region: the balancer adds 1 every S.
pub const W_BALANCER_HEARTBEAT: usize = W_COUNTER_BASE + 1;
pub const COUNTER_WORDS: usize = 16;
pub const CONTROL_FIRST_WORD: usize = 32;
pub const CONTROL_END_WORD: usize = 64;
/// First word a remote WRITE / CAS / FETCH-ADD may change: the control area only.
pub const WRITABLE_FIRST_WORD: usize = CONTROL_FIRST_WORD;
/// One past the last word a remote WRITE / CAS / FETCH-ADD may change.
pub const WRITABLE_END_WORD: usize = CONTROL_END_WORD;

// ---- scratch ----
pub const SCRATCH_FIRST_WORD: usize = 64;

/// Byte offset of a word.
pub const fn byte_offset(word: usize) -> usize {
    word * 8
}
