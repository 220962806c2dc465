//! Cooperative caching between back-ends (`--coop`): PRESS (Carrera, Rao, Iftode,
//! Bianchini, HPCA 2002) on real nodes.
//!
//! ```text
//!  client ──GET──► initial node n (any node: clients are spread round-robin)
//!                  policy (farside_coop::policy, pure) on n's cache, peers' hints, loads
//!                  ├─ Local      body from n's cache
//!                  ├─ Forward(p) fetch from p's cache over --coop-peer's transport:
//!                  │             tcp / udp (p's process answers, sealed 'F' / 'B',
//!                  │             CRC32c), xdp (one-sided READs of p's object arena,
//!                  │             answered by p's XDP program: no process of p runs),
//!                  │             shm (p's arena mapped read-only, one host only);
//!                  │             a stale hint costs one wasted fetch, then disk
//!                  └─ Disk       read through the emulated disk, cache at n
//!  every node ──UDP──► every peer: its Bloom directory + epoch + load, sealed ('D'),
//!                      on change, at most once per --coop-publish-ms
//!  (--coop-directory read: the same record written into the node's own arena under
//!   arena::DIRECTORY_KEY, and every peer READs it one-sidedly each publish period;
//!   --coop-directory write: the node WRITEs it one-sidedly into its own slot of every
//!   peer's arena, and reads its peers' slots in its own arena: see [`dirwrite`])
//! ```
//!
//! With `--coop-policy rr` no peer is asked: each node caches on its own (the baseline).
//!
//! - [`wire`]: the messages, pure;
//! - [`disk`]: the emulated disk (latency + size / bandwidth per read, one at a time);
//! - [`peer`]: the peer fetch transport ([`peer::PeerTransport`]) over TCP and the peer
//!   port's server; [`udp`]: the same fetch answered in user space over UDP;
//! - [`arena`]: the node's cached bodies mirrored into its object arena (an XDP-answered
//!   BPF map, or a shared-memory file); [`onesided`]: the transports that read a peer's
//!   arena without its process (xdp, shm);
//! - [`seal`]: the cluster key, sealing, receiving with replay windows;
//! - [`overhead`]: the per-message processor overhead ablation (an experiment knob);
//! - [`stats`]: `/coop/stats` on a listener of its own (`--coop-stats-listen`), readable
//!   while the node's workers are all busy;
//! - [`node`]: the node: cache, views of the peers, the decision, the counters.
//!
//! Every message between nodes is sealed (`auth::mac::seal`, `Domain::Notify`) with
//! the key of `--coop-key-file` (0600) and checked by `auth::receive::receive` against
//! a replay window per sender: a forged or replayed one is dropped and counted.

mod accept;
pub mod arena;
pub mod dirwrite;
pub mod disk;
pub mod node;
pub mod onesided;
pub mod overhead;
pub mod peer;
pub mod seal;
pub mod stats;
pub mod udp;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use node::{Counters, Node};

/// Nodes a cluster may have at most: the node index travels in one byte and PRESS scans
/// every peer's hint per miss (`farside_coop::policy::NODES_MAX` bounds the policy).
pub const COOP_NODES_MAX: usize = 64;
const _: () = assert!(
    dirwrite::SLOTS == COOP_NODES_MAX,
    "a directory slot per node"
);
/// Default cache bytes per node: 16 MiB, about a quarter of the World Cup sample's 54.6
/// MB of distinct objects (the lab sets it from the working set).
pub const COOP_CACHE_BYTES_DEFAULT: u64 = 16 << 20;
/// Largest cache per node: 16 GiB bounds the memory a typo could ask for.
pub const COOP_CACHE_BYTES_MAX: u64 = 16 << 30;
/// Default shortest time between two directory publications, ms: 20 ms bounds the
/// updates to 50/s per node (8 KB each at most, 400 KB/s to each peer), while a hint is
/// at most that much older than the cache.
pub const COOP_PUBLISH_MS_DEFAULT: u64 = 20;
/// Largest publication period accepted: a peer's view older than
/// [`node::VIEW_TTL`] is dropped, so publications must come more often.
pub const COOP_PUBLISH_MS_MAX: u64 = 1000;

/// How a node serves a miss in its own cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CoopPolicy {
    /// No cooperation: own cache, else disk.
    Rr,
    /// PRESS: own cache, else a peer that caches it (least loaded), else disk.
    Press,
}

/// How a node fetches a body from a peer's cache (`--coop-peer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CoopPeer {
    /// The peer's process answers on its TCP peer port (PRESS as published).
    Tcp,
    /// The peer's process answers sealed UDP datagrams in user space.
    Udp,
    /// One-sided READs of the peer's object arena, answered by its XDP program.
    Xdp,
    /// The peer's arena mapped read-only (nodes on one host only: a bound).
    Shm,
}

impl CoopPeer {
    pub fn name(self) -> &'static str {
        match self {
            CoopPeer::Tcp => "tcp",
            CoopPeer::Udp => "udp",
            CoopPeer::Xdp => "xdp",
            CoopPeer::Shm => "shm",
        }
    }
}

/// How a node's directory reaches its peers (`--coop-directory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CoopDirectory {
    /// Pushed: a sealed UDP datagram to every peer, on change (PRESS's broadcast).
    Datagram,
    /// Pulled: written into the node's own object arena (a reserved entry); every
    /// peer READs it one-sidedly each publish period (`--coop-peer xdp` or `shm`).
    Read,
    /// Pushed by one-sided WRITEs into this node's slot of every peer's arena, answered
    /// by the peer's XDP program (`--coop-peer xdp`); each node reads its slots locally.
    Write,
}

impl CoopDirectory {
    pub fn name(self) -> &'static str {
        match self {
            CoopDirectory::Datagram => "datagram",
            CoopDirectory::Read => "read",
            CoopDirectory::Write => "write",
        }
    }
}

/// Default `--coop-arena-port`: the udp port of the node's arena responder.
pub const COOP_ARENA_PORT_DEFAULT: u16 = 7301;

/// Which replacement policy the cache uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CoopReplacement {
    Lru,
    Gds,
}

/// `farside backend --coop ...`.
#[derive(Debug, Clone, clap::Args)]
pub struct CoopArgs {
    /// Cooperative caching: files under --root are served from a bounded cache, peers'
    /// caches (--coop-policy press) or an emulated disk. Needs --root.
    #[arg(long)]
    pub coop: bool,
    /// With --coop: `press` (fetch from a peer that caches the file) or `rr` (each node
    /// caches on its own). Default: press.
    #[arg(long = "coop-policy", value_enum, default_value = "press")]
    pub policy: CoopPolicy,
    /// With --coop: this node's index in --coop-peers. Default: 0.
    #[arg(long = "coop-index", default_value_t = 0)]
    pub index: usize,
    /// With --coop: every node's peer address (TCP for fetches, UDP for directory
    /// updates, same port), in one order on every node, this node's included at
    /// --coop-index. Port 0 (one node only) picks a free port.
    #[arg(long = "coop-peers", value_delimiter = ',')]
    pub peers: Vec<SocketAddr>,
    /// With --coop: the cache's capacity in bytes. Default 16 MiB.
    #[arg(long = "coop-cache-bytes", default_value_t = COOP_CACHE_BYTES_DEFAULT)]
    pub cache_bytes: u64,
    /// With --coop: cache replacement, `lru` or `gds` (GreedyDual-Size). Default: lru.
    #[arg(long = "coop-replacement", value_enum, default_value = "lru")]
    pub replacement: CoopReplacement,
    /// With --coop --coop-policy press: the cluster's coop key (32 hex digits, mode
    /// 0600, or the systemd credential `farside-coop`). Every directory update and peer
    /// fetch is sealed with it.
    #[arg(long = "coop-key-file")]
    pub key_file: Option<PathBuf>,
    /// With --coop: emulated disk latency per read, µs. Default: see
    /// `coop::disk::DISK_LATENCY_US_DEFAULT`.
    #[arg(long = "coop-disk-latency-us", default_value_t = disk::DISK_LATENCY_US_DEFAULT)]
    pub disk_latency_us: u64,
    /// With --coop: emulated disk bandwidth, bytes/s. Default: see
    /// `coop::disk::DISK_BYTES_PER_S_DEFAULT`.
    #[arg(long = "coop-disk-bytes-per-s", default_value_t = disk::DISK_BYTES_PER_S_DEFAULT)]
    pub disk_bytes_per_s: u64,
    /// With --coop: shortest time between two directory publications, ms. Default 20.
    #[arg(long = "coop-publish-ms", default_value_t = COOP_PUBLISH_MS_DEFAULT)]
    pub publish_ms: u64,
    /// With --coop --coop-policy press: how a body is fetched from a peer's cache.
    /// `tcp`: the peer's process answers on its TCP peer port. `udp`: the peer's process
    /// answers sealed UDP datagrams on the same port number. `xdp`: the node mirrors its
    /// cached bodies into its object arena (a BPF map answered by the rmem XDP program
    /// on --coop-arena-iface) and a peer reads them one-sidedly (index, then the slot's
    /// chunks; seqlock and CRC32c checked): no process of the serving node runs for the
    /// body. `shm`: the arena is a file under --coop-shm-dir that peers map read-only
    /// and validate the same way: only possible when every node runs on one host (a
    /// bound, not a deployment). Bodies above 89,568 B (the arena's one-sided bound) go
    /// over tcp with udp, xdp and shm. Every node of a cluster must use the same.
    /// Default: tcp.
    #[arg(long = "coop-peer", value_enum, default_value = "tcp")]
    pub peer: CoopPeer,
    /// With --coop-peer xdp: the interface the node's arena responder is attached to
    /// (generic XDP; no other XDP program may be attached there). Needs root.
    #[arg(long = "coop-arena-iface", value_name = "IFACE")]
    pub coop_arena_iface: Option<String>,
    /// With --coop-peer xdp: udp port of the arena responders (the same on every node).
    /// Default: 7301.
    #[arg(long = "coop-arena-port", default_value_t = COOP_ARENA_PORT_DEFAULT)]
    pub coop_arena_port: u16,
    /// With --coop-peer xdp: the cluster's arena reader key, ID:PATH (a key file, mode
    /// 0600) or ID (the credential rmem-ID); its rights are READ of the arena region
    /// only. Every node's responder accepts it and every node reads with it.
    #[arg(long = "coop-arena-key", value_name = "ID[:PATH]")]
    pub coop_arena_key: Option<String>,
    /// With --coop-peer shm: the directory (mode 0700, on a tmpfs such as /dev/shm)
    /// where node i keeps its arena as `node-i.arena` and maps its peers' read-only.
    #[arg(long = "coop-shm-dir", value_name = "DIR")]
    pub shm_dir: Option<PathBuf>,
    /// With --coop: an EXPERIMENT KNOB that adds cost, never a tuning (leave it at 0 in
    /// service). Every peer message the node handles (each directory update sent and
    /// received, each fetch request and reply sent and received, and with --coop-peer
    /// xdp or shm each READ or mapped read the initial node makes for a body) first
    /// spins this many µs of CPU on the thread that handles it: the per-message
    /// processor overhead ablation. Counted as `overhead_spins` in /coop/stats. At most
    /// 1,000. Default: 0 (nothing spun).
    #[arg(long = "coop-message-overhead-us", default_value_t = 0)]
    pub message_overhead_us: u64,
    /// With --coop --coop-policy press: how the node's directory (its Bloom filter with
    /// its epoch, and its load) reaches its peers. `datagram`: a sealed UDP datagram to
    /// every peer on change, at most once per --coop-publish-ms (heartbeat 500 ms).
    /// `read` (needs --coop-peer xdp or shm): the node writes the same record into its
    /// own object arena (a reserved entry, seqlock and CRC32c), and every peer reads it
    /// one-sidedly once per --coop-publish-ms (no process of the publishing node runs
    /// for it). `write` (needs --coop-peer xdp): the node writes the record one-sidedly
    /// into its own slot of every peer's object arena (three acknowledged WRITE phases:
    /// sequence odd, record with length and CRC32c, sequence even; answered by the
    /// peer's XDP program under a per-peer key derived from --coop-key-file that may
    /// write that slot only), and reads the slots its peers write in its own arena once
    /// per --coop-publish-ms. Every node of a cluster must use the same. Default:
    /// datagram.
    #[arg(long = "coop-directory", value_enum, default_value = "datagram")]
    pub directory: CoopDirectory,
    /// With --coop: also answer `GET /coop/stats` (the same counters as on --listen) on
    /// this address, from a thread of its own, so they can be read while every worker
    /// is busy and the main accept queue is full. At most 4 stats connections at once,
    /// 2 s to send the request. No authentication, as on --listen: the counters are
    /// read-only and hold no secret; bind it where only your tools reach it. Port 0
    /// picks a free port. Default: none (only --listen answers /coop/stats).
    #[arg(long = "coop-stats-listen", value_name = "ADDR")]
    pub stats_listen: Option<SocketAddr>,
    /// With --coop: most reads queued on the emulated disk; a request that would add a
    /// read past it gets 503 at once instead of holding a worker in the queue (a request
    /// for an object whose read is under way waits for that read and is never refused).
    /// Keeps workers free for hits when the disk is past its capacity. 0: no bound (the
    /// queue is then bounded by --workers). At most 4,096. Default: 16 (about 90 ms of
    /// reads at the default disk; below the default 8 workers it never binds).
    #[arg(long = "coop-disk-queue-max", default_value_t = disk::DISK_QUEUE_MAX_DEFAULT)]
    pub disk_queue_max: u64,
}

impl Default for CoopArgs {
    fn default() -> Self {
        CoopArgs {
            coop: false,
            policy: CoopPolicy::Press,
            index: 0,
            peers: Vec::new(),
            cache_bytes: COOP_CACHE_BYTES_DEFAULT,
            replacement: CoopReplacement::Lru,
            key_file: None,
            disk_latency_us: disk::DISK_LATENCY_US_DEFAULT,
            disk_bytes_per_s: disk::DISK_BYTES_PER_S_DEFAULT,
            publish_ms: COOP_PUBLISH_MS_DEFAULT,
            peer: CoopPeer::Tcp,
            coop_arena_iface: None,
            coop_arena_port: COOP_ARENA_PORT_DEFAULT,
            coop_arena_key: None,
            shm_dir: None,
            message_overhead_us: 0,
            directory: CoopDirectory::Datagram,
            stats_listen: None,
            disk_queue_max: disk::DISK_QUEUE_MAX_DEFAULT,
        }
    }
}

impl CoopArgs {
    /// Checks every bound; a message naming the flag.
    pub fn validate(&self, has_root: bool) -> Result<(), String> {
        if !self.coop {
            return Ok(());
        }
        if !has_root {
            return Err("--coop needs --root".into());
        }
        if self.cache_bytes == 0 || self.cache_bytes > COOP_CACHE_BYTES_MAX {
            return Err(format!(
                "--coop-cache-bytes must be in 1..={COOP_CACHE_BYTES_MAX}"
            ));
        }
        if self.disk_latency_us > disk::DISK_LATENCY_US_MAX {
            return Err(format!(
                "--coop-disk-latency-us must be at most {}",
                disk::DISK_LATENCY_US_MAX
            ));
        }
        if self.disk_queue_max > disk::DISK_QUEUE_MAX_MAX {
            return Err(format!(
                "--coop-disk-queue-max must be at most {}",
                disk::DISK_QUEUE_MAX_MAX
            ));
        }
        if self.disk_bytes_per_s == 0 {
            return Err("--coop-disk-bytes-per-s must be at least 1".into());
        }
        if self.publish_ms == 0 || self.publish_ms > COOP_PUBLISH_MS_MAX {
            return Err(format!(
                "--coop-publish-ms must be in 1..={COOP_PUBLISH_MS_MAX}"
            ));
        }
        if self.message_overhead_us > overhead::COOP_MESSAGE_OVERHEAD_US_MAX {
            return Err(format!(
                "--coop-message-overhead-us must be at most {}",
                overhead::COOP_MESSAGE_OVERHEAD_US_MAX
            ));
        }
        if self.policy == CoopPolicy::Press {
            if self.peers.is_empty() || self.peers.len() > COOP_NODES_MAX {
                return Err(format!(
                    "--coop-peers: 1..={COOP_NODES_MAX} addresses with --coop-policy press"
                ));
            }
            if self.index >= self.peers.len() {
                return Err("--coop-index must index --coop-peers".into());
            }
            if self.key_file.is_none() {
                return Err("--coop-policy press needs --coop-key-file".into());
            }
            match self.peer {
                CoopPeer::Xdp
                    if self.coop_arena_iface.is_none() || self.coop_arena_key.is_none() =>
                {
                    return Err(
                        "--coop-peer xdp needs --coop-arena-iface and --coop-arena-key".into(),
                    )
                }
                CoopPeer::Xdp if self.coop_arena_port == 0 => {
                    return Err("--coop-arena-port must not be 0".into())
                }
                CoopPeer::Shm if self.shm_dir.is_none() => {
                    return Err("--coop-peer shm needs --coop-shm-dir".into())
                }
                _ => {}
            }
            if self.directory == CoopDirectory::Write && self.peer != CoopPeer::Xdp {
                return Err(format!(
                    "--coop-directory write needs --coop-peer xdp (the peer's XDP program \
                     answers the WRITEs into its arena; with shm a peer's arena file is \
                     mapped read-only), not {}",
                    self.peer.name()
                ));
            }
            if self.directory == CoopDirectory::Write {
                let id = self
                    .coop_arena_key
                    .as_deref()
                    .and_then(|k| farside_rmem::ClientKey::parse_spec(k).ok())
                    .map(|(id, _)| id);
                let writers = dirwrite::DIRECTORY_WRITE_KEY_BASE
                    ..dirwrite::DIRECTORY_WRITE_KEY_BASE + COOP_NODES_MAX as u32;
                if id.is_some_and(|id| writers.contains(&id)) {
                    return Err(format!(
                        "--coop-arena-key: ids {}..{} are the directory writers' with \
                         --coop-directory write",
                        writers.start, writers.end
                    ));
                }
            }
            if self.directory == CoopDirectory::Read
                && !matches!(self.peer, CoopPeer::Xdp | CoopPeer::Shm)
            {
                return Err(format!(
                    "--coop-directory read needs --coop-peer xdp or shm (the directory is \
                     read from the peer's object arena), not {}",
                    self.peer.name()
                ));
            }
        } else if self.directory != CoopDirectory::Datagram {
            return Err(format!(
                "--coop-directory {} needs --coop-policy press",
                self.directory.name()
            ));
        }
        Ok(())
    }
}
