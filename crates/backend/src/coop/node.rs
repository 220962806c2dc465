//! One cooperating node: its cache of bodies, what it knows of its peers (directory and
//! load, from their sealed updates or, with `--coop-directory read`, from their records
//! read one-sidedly out of their arenas, or with `--coop-directory write`, from the
//! slots they write into this node's arena), the decision per request, and its
//! counters.

use super::arena::NodeArena;
use super::dirwrite::{DirectoryWriter, SlotRefusal};
use super::disk::Disk;
use super::onesided::{DirectoryReader, ShmTransport, XdpTransport};
use super::overhead::Overhead;
use super::peer::{
    read_frame, PeerTransport, TcpTransport, PEER_CONNS_MAX, PEER_IDLE_TIMEOUT, PEER_IO_TIMEOUT,
};
use super::seal::Sealer;
use super::udp::UdpTransport;
use super::wire::{self, DirectoryUpdate};
use super::{CoopArgs, CoopDirectory, CoopPeer, CoopPolicy, CoopReplacement};
use farside_auth::keys::Policy as KeyPolicy;
use farside_auth::mac;
use farside_auth::replay::ReplayTable;
use farside_coop::cache::{NodeCache, Replacement};
use farside_coop::directory::{BloomFilter, DirectoryView, BLOOM_FP_DEFAULT};
use farside_coop::fill::{Fills, Join, Poll};
use farside_coop::policy::{ClusterView, NodeId, Press, RemoteMode, Request, Source};
use std::collections::HashMap;
use std::io::{self, Write};
use std::net::TcpStream;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A peer's view older than this is ignored (no hints from it): the peer stopped
/// publishing, so it may be gone. Rule: many publication periods (at most 1 s each),
/// short enough that a dead peer costs a few seconds of wasted fetches at most.
pub const VIEW_TTL: Duration = Duration::from_secs(3);
/// A node republishes at least this often even when nothing changed, so its peers'
/// views of it stay fresh (well within [`VIEW_TTL`]).
pub const PUBLISH_HEARTBEAT: Duration = Duration::from_millis(500);
/// Longest a blocking receive waits before the thread checks the stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);
/// The credential name of the coop key (`$CREDENTIALS_DIRECTORY/farside-coop`).
pub const COOP_KEY_CREDENTIAL: &str = "farside-coop";
/// Longest request path a coop node serves, bytes.
pub const COOP_PATH_BYTES_MAX: usize = 1024;
/// Longest a request waits for another request's disk read of the same object (see
/// [`farside_coop::fill`]) before it reads the object itself: the clients' own timeout
/// (10 s in the lab), so a waiter never outlives the client it answers for.
pub const FILL_WAIT_MAX: Duration = Duration::from_secs(10);
/// Senders remembered per replay table: the nodes of a cluster, with room to spare
/// (`farside_auth::replay` evicts safely beyond it).
const REPLAY_SENDERS_MAX: usize = 4 * super::COOP_NODES_MAX;

/// What a node counts (read by `/coop/stats`).
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests answered from the node's own cache.
    pub local_hits: AtomicU64,
    /// Requests answered with a body fetched from a peer's cache.
    pub remote_hits: AtomicU64,
    /// Requests answered from the (emulated) disk.
    pub misses: AtomicU64,
    /// Requests answered with the body of another request's disk read of the same
    /// object under way on this node (counted in `local_hits` too: no read of theirs).
    pub fill_followed: AtomicU64,
    /// Requests refused (503) because the disk queue was at `--coop-disk-queue-max`.
    pub disk_shed: AtomicU64,
    /// Fetches a peer answered "absent" (a stale or false-positive hint) or that failed.
    pub wasted_fetches: AtomicU64,
    /// Of the wasted fetches, those that failed (connect, timeout, refused reply).
    pub peer_errors: AtomicU64,
    /// UDP fetches (`--coop-peer udp`) asked again because the whole answer had not come
    /// within `UDP_FETCH_TIMEOUT` (shared with the transport, which counts them).
    pub peer_resends: Arc<AtomicU64>,
    /// Body bytes received from peers.
    pub peer_bytes: AtomicU64,
    /// Fetches this node answered for peers with a body.
    pub peer_served: AtomicU64,
    /// Directory updates accepted from peers (datagrams; with `--coop-directory read`,
    /// newer records read from their arenas).
    pub directory_received: AtomicU64,
    /// Directory updates sent (one per peer per publication).
    pub directory_sent: AtomicU64,
    /// Directory updates dropped: forged, replayed, malformed or from a wrong sender.
    pub directory_refused: AtomicU64,
    /// Fetch requests dropped: forged, replayed or malformed.
    pub fetch_refused: AtomicU64,
    /// Time spent in peer fetches that brought a body (remote hits), µs in all.
    pub remote_fetch_us: AtomicU64,
    /// Bodies written into this node's object arena (xdp, shm).
    pub arena_put: AtomicU64,
    /// Bodies the cache took that the arena could not hold (see `coop::arena`).
    pub arena_dropped: AtomicU64,
    /// Bodies above the arena's one-sided bound (peers fetch them over TCP).
    pub arena_too_large: AtomicU64,
    /// The per-message overhead ablation (`--coop-message-overhead-us`), shared with
    /// the transports; its spins are `overhead_spins`.
    pub overhead: Arc<Overhead>,
    /// Bytes of the directory datagrams sent (sealed, one per peer per publication).
    pub directory_sent_bytes: AtomicU64,
    /// `--coop-directory read`: this node's directory records written into its arena.
    pub directory_put: AtomicU64,
    /// `--coop-directory read`: pulls of a peer's directory record (each a few READs).
    pub directory_reads: AtomicU64,
    /// Of the pulls, those that gave no valid record (lost READs, no record, torn
    /// every time, malformed, another node's): dropped, never applied.
    pub directory_read_failed: AtomicU64,
    /// Of the pulls, those whose record was older than the last accepted: dropped.
    pub directory_read_stale: AtomicU64,
    /// READs (xdp, resends included) or chunk copies (shm) the pulls made.
    pub directory_read_ops: AtomicU64,
    /// Bytes the pulls moved (index window and record slot).
    pub directory_read_bytes: AtomicU64,
    /// `--coop-directory write`: publications written into a peer's slot (three
    /// acknowledged WRITE phases each).
    pub directory_writes: AtomicU64,
    /// Of the publications, those that failed (a WRITE lost or refused every try): the
    /// peer is backed off; its slot stays torn until the next publication.
    pub directory_write_failed: AtomicU64,
    /// WRITEs acknowledged by peers (the publications' three phases, one WRITE per
    /// chunk of the record).
    pub directory_write_ops: AtomicU64,
    /// Bytes the acknowledged WRITEs carried.
    pub directory_write_bytes: AtomicU64,
    /// Looks at a peer's slot in this node's arena that found a new sequence.
    pub directory_slot_reads: AtomicU64,
    /// Of the looks, slots caught mid-write or not checking (odd or moving sequence,
    /// bad length, CRC32c): never applied.
    pub directory_slot_torn: AtomicU64,
    /// Of the looks, records older than the view held: never applied.
    pub directory_slot_stale: AtomicU64,
    /// Of the looks, records of another node than the slot's, or malformed: never
    /// applied.
    pub directory_slot_foreign: AtomicU64,
}

impl Counters {
    fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// `name value` lines, the `/coop/stats` body.
    pub fn text(&self) -> String {
        let rows = [
            ("local_hits", &self.local_hits),
            ("remote_hits", &self.remote_hits),
            ("misses", &self.misses),
            ("fill_followed", &self.fill_followed),
            ("disk_shed", &self.disk_shed),
            ("wasted_fetches", &self.wasted_fetches),
            ("peer_errors", &self.peer_errors),
            ("peer_resends", &*self.peer_resends),
            ("peer_bytes", &self.peer_bytes),
            ("peer_served", &self.peer_served),
            ("directory_received", &self.directory_received),
            ("directory_sent", &self.directory_sent),
            ("directory_refused", &self.directory_refused),
            ("fetch_refused", &self.fetch_refused),
            ("remote_fetch_us", &self.remote_fetch_us),
            ("arena_put", &self.arena_put),
            ("arena_dropped", &self.arena_dropped),
            ("arena_too_large", &self.arena_too_large),
            ("overhead_spins", &self.overhead.spins),
            ("directory_sent_bytes", &self.directory_sent_bytes),
            ("directory_put", &self.directory_put),
            ("directory_reads", &self.directory_reads),
            ("directory_read_failed", &self.directory_read_failed),
            ("directory_read_stale", &self.directory_read_stale),
            ("directory_read_ops", &self.directory_read_ops),
            ("directory_read_bytes", &self.directory_read_bytes),
            ("directory_writes", &self.directory_writes),
            ("directory_write_failed", &self.directory_write_failed),
            ("directory_write_ops", &self.directory_write_ops),
            ("directory_write_bytes", &self.directory_write_bytes),
            ("directory_slot_reads", &self.directory_slot_reads),
            ("directory_slot_torn", &self.directory_slot_torn),
            ("directory_slot_stale", &self.directory_slot_stale),
            ("directory_slot_foreign", &self.directory_slot_foreign),
        ];
        rows.iter()
            .map(|(n, c)| format!("{n} {}\n", Counters::get(c)))
            .collect()
    }
}

/// A cached body and its CRC32c (computed when read from disk).
#[derive(Debug, Clone)]
pub struct Cached {
    pub body: Arc<Vec<u8>>,
    pub crc: u32,
}

/// A peer as this node knows it.
#[derive(Debug, Clone)]
struct PeerView {
    directory: DirectoryView,
    load: u64,
    at: Instant,
    /// The envelope sequence of the update this view comes from (`--coop-directory
    /// read`: its epoch).
    seq: u64,
}

struct State {
    cache: NodeCache,
    bodies: HashMap<u64, Cached>,
    views: Vec<Option<PeerView>>,
    /// The cache changed since the last publication.
    dirty: bool,
    /// With --coop-peer xdp or shm: the cached bodies, mirrored where peers read them.
    arena: Option<NodeArena>,
}

/// The decision's view of the cluster from node `me`: its own cache exactly, its
/// peers' last fresh directories and loads.
struct View<'a> {
    me: NodeId,
    st: &'a State,
    my_load: u64,
    now: Instant,
}

impl View<'_> {
    fn fresh(&self, p: NodeId) -> Option<&PeerView> {
        self.st.views[p]
            .as_ref()
            .filter(|v| self.now.duration_since(v.at) < VIEW_TTL)
    }
}

impl ClusterView for View<'_> {
    fn nodes(&self) -> usize {
        self.st.views.len()
    }
    fn cached(&self, node: NodeId, object: u64) -> bool {
        node == self.me && self.st.bodies.contains_key(&object)
    }
    fn hint(&self, node: NodeId, peer: NodeId, object: u64) -> bool {
        node == self.me
            && self
                .fresh(peer)
                .is_some_and(|v| v.directory.filter.may_contain(object))
    }
    fn load(&self, node: NodeId) -> u64 {
        if node == self.me {
            self.my_load
        } else {
            self.fresh(node).map_or(0, |v| v.load)
        }
    }
}

/// A cooperating node.
pub struct Node {
    me: NodeId,
    policy: CoopPolicy,
    root: PathBuf,
    disk: Disk,
    state: Mutex<State>,
    /// The disk reads under way and their waiters (one read per object at a time).
    fills: Mutex<Fills<Arc<Vec<u8>>>>,
    /// Signalled when a read in `fills` ends.
    filled: Condvar,
    /// `--coop-disk-queue-max` (0: no bound).
    disk_queue_max: u64,
    inflight: AtomicU64,
    /// The largest `inflight` seen (`inflight_max` in `/coop/stats`): with the node's
    /// `--workers`, whether its worker pool filled.
    inflight_max: AtomicU64,
    pub counters: Counters,
    pub(crate) sealer: Option<Sealer>,
    pub(crate) fetch_replay: Mutex<ReplayTable>,
    directory_replay: Mutex<ReplayTable>,
    transport: Option<Box<dyn PeerTransport>>,
    peer_kind: CoopPeer,
    directory_mode: CoopDirectory,
    peers: Vec<SocketAddr>,
    publish_period: Duration,
    stop: AtomicBool,
}

/// A running node's threads (publisher, directory receiver, peer server).
pub struct Running {
    pub node: Arc<Node>,
    /// The bound peer address (TCP and UDP).
    pub peer_addr: Option<SocketAddr>,
    listener: Option<TcpListener>,
    /// With `--coop-stats-listen`: the bound stats address.
    pub stats_addr: Option<SocketAddr>,
    stats_listener: Option<TcpListener>,
    threads: Vec<JoinHandle<()>>,
}

impl Running {
    pub fn stop(&mut self) {
        self.node.stop.store(true, Ordering::SeqCst);
        for l in self.listener.iter().chain(&self.stats_listener) {
            use std::os::fd::AsRawFd;
            // SAFETY: the fd is owned by `l`, alive for this call; shutdown of a
            // listening socket wakes its blocked accept.
            unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a request's body came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Local,
    Remote(NodeId),
    /// From disk; `wasted` if a peer was asked first and did not have it.
    Disk {
        wasted: bool,
    },
}

impl Served {
    pub fn name(self) -> &'static str {
        match self {
            Served::Local => "local",
            Served::Remote(_) => "remote",
            Served::Disk { wasted: false } => "disk",
            Served::Disk { wasted: true } => "disk-after-wasted-fetch",
        }
    }
}

/// Why a path is not served: the HTTP status.
pub fn check_path(path: &str) -> Result<&str, u16> {
    if path.len() > COOP_PATH_BYTES_MAX || !path.starts_with('/') {
        return Err(400);
    }
    if !path.bytes().all(|b| b.is_ascii_graphic()) || path.contains('%') {
        return Err(400);
    }
    if path.split('/').any(|s| s == "..") {
        return Err(400);
    }
    Ok(path)
}

impl Node {
    /// A node from `args` serving files under `root`; starts its threads.
    pub fn start(args: &CoopArgs, root: &Path) -> io::Result<Running> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        let press = args.policy == CoopPolicy::Press;
        let nodes = if press { args.peers.len() } else { 1 };
        let me = if press { args.index } else { 0 };
        let (listener, udp, peers) = if press {
            let listener = TcpListener::bind(args.peers[me])?;
            let addr = listener.local_addr()?;
            let udp = UdpSocket::bind(addr)?;
            udp.set_read_timeout(Some(STOP_POLL))?;
            let mut peers = args.peers.clone();
            peers[me] = addr;
            (Some(listener), Some(udp), peers)
        } else {
            (None, None, Vec::new())
        };
        let sealer = match (&args.key_file, press) {
            (Some(path), true) => {
                let loaded = farside_auth::keys::load_key(
                    COOP_KEY_CREDENTIAL,
                    Some(path),
                    KeyPolicy::Production,
                )
                .map_err(|e| bad(format!("--coop-key-file {}: {e}", path.display())))?;
                Some(Sealer::new(loaded.key, me).map_err(bad)?)
            }
            _ => None,
        };
        let overhead = Arc::new(Overhead::new(args.message_overhead_us));
        let peer_resends = Arc::new(AtomicU64::new(0));
        let transport: Option<Box<dyn PeerTransport>> = match &sealer {
            None => None,
            Some(s) => {
                let tcp = TcpTransport::new(me, peers.clone(), s.key, Arc::clone(&overhead));
                Some(match args.peer {
                    CoopPeer::Tcp => Box::new(tcp),
                    CoopPeer::Udp => Box::new(UdpTransport::new(
                        tcp,
                        me,
                        peers.clone(),
                        s.key,
                        Arc::clone(&peer_resends),
                    )),
                    CoopPeer::Xdp => Box::new(XdpTransport::new(
                        tcp,
                        &peers,
                        args.coop_arena_port,
                        args.coop_arena_key.as_deref().unwrap_or_default(),
                    )?),
                    CoopPeer::Shm => Box::new(ShmTransport::new(
                        tcp,
                        peers.len(),
                        args.shm_dir.clone().unwrap_or_default(),
                    )),
                })
            }
        };
        let read_dir = press && args.directory == CoopDirectory::Read;
        let write_dir = press && args.directory == CoopDirectory::Write;
        if write_dir && args.peer != CoopPeer::Xdp {
            return Err(bad(
                "--coop-directory write needs --coop-peer xdp (WRITEs answered by the peer's XDP program)".into(),
            ));
        }
        let coop_key = sealer.as_ref().map(|s| s.key);
        let writers = match (&coop_key, write_dir) {
            (Some(k), true) => Some((k, nodes, me)),
            _ => None,
        };
        let dir_writer = match (&coop_key, write_dir) {
            (Some(k), true) => Some(DirectoryWriter::new(me, &peers, args.coop_arena_port, k)),
            _ => None,
        };
        let arena = match (press, args.peer) {
            (true, CoopPeer::Xdp) => Some(NodeArena::xdp(
                args.cache_bytes,
                read_dir,
                args.coop_arena_iface.as_deref().unwrap_or_default(),
                args.coop_arena_port,
                args.coop_arena_key.as_deref().unwrap_or_default(),
                writers,
            )?),
            (true, CoopPeer::Shm) => Some(NodeArena::shm(
                args.cache_bytes,
                read_dir,
                args.shm_dir.as_deref().unwrap_or(Path::new("")),
                me,
            )?),
            _ => None,
        };
        let dir_reader = match (read_dir, args.peer) {
            (true, CoopPeer::Xdp) => Some(DirectoryReader::xdp(
                &peers,
                args.coop_arena_port,
                args.coop_arena_key.as_deref().unwrap_or_default(),
            )?),
            (true, CoopPeer::Shm) => Some(DirectoryReader::shm(
                peers.len(),
                args.shm_dir.clone().unwrap_or_default(),
            )),
            (true, _) => {
                return Err(bad(
                    "--coop-directory read needs --coop-peer xdp or shm".into()
                ))
            }
            _ => None,
        };
        let replacement = match args.replacement {
            CoopReplacement::Lru => Replacement::Lru,
            CoopReplacement::Gds => Replacement::GreedyDualSize,
        };
        let node = Arc::new(Node {
            me,
            policy: args.policy,
            root: root.to_path_buf(),
            disk: Disk::new(args.disk_latency_us, args.disk_bytes_per_s),
            state: Mutex::new(State {
                cache: NodeCache::new(replacement, args.cache_bytes),
                bodies: HashMap::new(),
                views: vec![None; nodes],
                dirty: true,
                arena,
            }),
            fills: Mutex::new(Fills::default()),
            filled: Condvar::new(),
            disk_queue_max: args.disk_queue_max,
            inflight: AtomicU64::new(0),
            inflight_max: AtomicU64::new(0),
            counters: Counters {
                overhead,
                peer_resends,
                ..Counters::default()
            },
            sealer,
            fetch_replay: Mutex::new(ReplayTable::new(REPLAY_SENDERS_MAX)),
            directory_replay: Mutex::new(ReplayTable::new(REPLAY_SENDERS_MAX)),
            transport,
            peer_kind: args.peer,
            directory_mode: if press {
                args.directory
            } else {
                CoopDirectory::Datagram
            },
            peers: peers.clone(),
            publish_period: Duration::from_millis(args.publish_ms),
            stop: AtomicBool::new(false),
        });
        let mut threads = Vec::new();
        let peer_addr = peers.get(me).copied();
        let listener_keep = match (listener, udp) {
            (Some(listener), Some(udp)) => {
                let keep = listener.try_clone()?;
                let udp2 = udp.try_clone()?;
                let n = Arc::clone(&node);
                threads.push(
                    std::thread::Builder::new()
                        .name("coop-peers".into())
                        .spawn(move || serve_peers(listener, n))?,
                );
                let n = Arc::clone(&node);
                threads.push(
                    std::thread::Builder::new()
                        .name("coop-dir-rx".into())
                        .spawn(move || n.receive_directories(&udp))?,
                );
                let n = Arc::clone(&node);
                threads.push(
                    std::thread::Builder::new()
                        .name("coop-dir-tx".into())
                        .spawn(move || n.publish_loop(&udp2, dir_writer))?,
                );
                if write_dir {
                    let n = Arc::clone(&node);
                    threads.push(
                        std::thread::Builder::new()
                            .name("coop-dir-slots".into())
                            .spawn(move || n.slot_loop())?,
                    );
                }
                if let Some(reader) = dir_reader {
                    let n = Arc::clone(&node);
                    threads.push(
                        std::thread::Builder::new()
                            .name("coop-dir-pull".into())
                            .spawn(move || n.pull_loop(reader))?,
                    );
                }
                Some(keep)
            }
            _ => None,
        };
        let (stats_addr, stats_listener) = match args.stats_listen {
            Some(addr) => {
                let l = TcpListener::bind(addr).map_err(|e| {
                    io::Error::new(e.kind(), format!("--coop-stats-listen {addr}: {e}"))
                })?;
                let bound = l.local_addr()?;
                let keep = l.try_clone()?;
                let n = Arc::clone(&node);
                threads.push(
                    std::thread::Builder::new()
                        .name("coop-stats".into())
                        .spawn(move || super::stats::serve(l, n))?,
                );
                (Some(bound), Some(keep))
            }
            None => (None, None),
        };
        Ok(Running {
            node,
            peer_addr,
            listener: listener_keep,
            stats_addr,
            stats_listener,
            threads,
        })
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn index(&self) -> NodeId {
        self.me
    }

    pub fn nodes(&self) -> usize {
        self.peers.len().max(1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The body of `path` (checked by [`check_path`]) and where it came from; an HTTP
    /// status if it cannot be served.
    pub fn get(&self, path: &str) -> Result<(Arc<Vec<u8>>, Served), u16> {
        let path = check_path(path)?;
        let object = wire::object_id(path);
        let load = self.inflight.fetch_add(1, Ordering::Relaxed) + 1;
        self.inflight_max.fetch_max(load, Ordering::Relaxed);
        let _inflight = InFlight(&self.inflight);
        let source = {
            let mut st = self.lock();
            if st.bodies.contains_key(&object) {
                st.cache.touch(object);
                let body = Arc::clone(&st.bodies[&object].body);
                drop(st);
                self.counters.local_hits.fetch_add(1, Ordering::Relaxed);
                return Ok((body, Served::Local));
            }
            match self.policy {
                CoopPolicy::Rr => Source::Disk,
                CoopPolicy::Press => {
                    let view = View {
                        me: self.me,
                        st: &st,
                        my_load: load,
                        now: Instant::now(),
                    };
                    let req = Request {
                        object,
                        bytes: 0,
                        initial: self.me,
                    };
                    Press::new(RemoteMode::Forward).decide(&req, &view).source
                }
            }
        };
        let mut wasted = false;
        let file = self.root.join(path.trim_start_matches('/'));
        if let (Source::Forward(p) | Source::Peer(p), Some(t)) = (source, &self.transport) {
            // Every node has the same files: the size on this node's file system says
            // which bodies a one-sided transport cannot move (metadata, no disk read).
            let len = match self.peer_kind {
                CoopPeer::Tcp => None,
                _ => std::fs::metadata(&file).ok().map(|m| m.len()),
            };
            let started = Instant::now();
            match t.fetch(p, object, len) {
                Ok(Some(body)) => {
                    self.counters
                        .remote_fetch_us
                        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                    self.counters.remote_hits.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .peer_bytes
                        .fetch_add(body.len() as u64, Ordering::Relaxed);
                    return Ok((Arc::new(body), Served::Remote(p)));
                }
                Ok(None) => {}
                Err(e) => {
                    log::debug!("coop: fetch from node {p}: {e}");
                    self.counters.peer_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.counters.wasted_fetches.fetch_add(1, Ordering::Relaxed);
            wasted = true;
        }
        let queued = self.disk.counts.queue.load(Ordering::Relaxed);
        // Bound first: a guard in the match's scrutinee would live through the arms and
        // `wait_fill` takes the same lock.
        let join = self.lock_fills().join(object, queued, self.disk_queue_max);
        let lead = match join {
            Join::Lead => true,
            Join::Full => false,
            Join::Shed => {
                self.counters.disk_shed.fetch_add(1, Ordering::Relaxed);
                return Err(503);
            }
            Join::Follow => match self.wait_fill(object) {
                Some(body) => {
                    self.counters.local_hits.fetch_add(1, Ordering::Relaxed);
                    return Ok((body, Served::Local));
                }
                None => false,
            },
        };
        let read = self.disk.read(&file).map(Arc::new);
        if lead {
            let waiting = self
                .lock_fills()
                .finish(object, read.as_ref().ok().map(Arc::clone));
            if waiting > 0 {
                self.filled.notify_all();
            }
        }
        let body = match read {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(404),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Err(403),
            Err(_) => return Err(500),
        };
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        self.insert(object, Arc::clone(&body));
        Ok((body, Served::Disk { wasted }))
    }

    fn lock_fills(&self) -> std::sync::MutexGuard<'_, Fills<Arc<Vec<u8>>>> {
        self.fills.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits (at most [`FILL_WAIT_MAX`]) for the read of `object` this request follows
    /// and returns its body; `None`: read it yourself (the read failed or the wait bound
    /// passed).
    fn wait_fill(&self, object: u64) -> Option<Arc<Vec<u8>>> {
        let until = Instant::now() + FILL_WAIT_MAX;
        let mut f = self.lock_fills();
        loop {
            if let Poll::Ready(body) = f.poll(object) {
                if body.is_some() {
                    self.counters.fill_followed.fetch_add(1, Ordering::Relaxed);
                }
                return body;
            }
            let now = Instant::now();
            if now >= until {
                f.leave(object);
                return None;
            }
            f = self
                .filled
                .wait_timeout(f, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn insert(&self, object: u64, body: Arc<Vec<u8>>) {
        let crc = crc32c::crc32c(&body);
        let mut evicted = Vec::new();
        let mut st = self.lock();
        let st = &mut *st;
        // Before the cache picks victims: what peers read one-sidedly since the last
        // look counts as recently used (see `coop::arena`, "Read stamps").
        if let Some(a) = &mut st.arena {
            if st.cache.used_bytes() + body.len() as u64 > st.cache.capacity_bytes() {
                for id in a.take_read_objects() {
                    st.cache.touch(id);
                }
            }
        }
        let inserted = st.cache.insert(object, body.len() as u64, &mut evicted);
        for &id in &evicted {
            st.bodies.remove(&id);
        }
        if let Some(a) = &mut st.arena {
            for &id in &evicted {
                a.evict(id);
            }
            if inserted {
                a.put(object, &body);
            }
            let c = a.counts;
            self.counters.arena_put.store(c.put, Ordering::Relaxed);
            self.counters
                .arena_dropped
                .store(c.dropped, Ordering::Relaxed);
            self.counters
                .arena_too_large
                .store(c.too_large, Ordering::Relaxed);
        }
        if inserted {
            st.bodies.insert(object, Cached { body, crc });
        }
        st.dirty = true;
    }

    /// The `/coop/stats` body (the main listener's and `--coop-stats-listen`'s): the
    /// counters, the cache's bytes, requests in the node now and at most, the disk's.
    pub fn stats_text(&self) -> String {
        let used = self.cache_used_bytes();
        format!(
            "{}cache_used_bytes {used}\ninflight {}\ninflight_max {}\n{}{}",
            self.counters.text(),
            self.inflight.load(Ordering::Relaxed),
            self.inflight_max.load(Ordering::Relaxed),
            self.disk.counts.text(),
            self.arena_status_text()
        )
    }

    /// Body bytes this node's cache holds now (`cache_used_bytes` in `/coop/stats`).
    pub fn cache_used_bytes(&self) -> u64 {
        self.lock().cache.used_bytes()
    }

    /// The arena's XDP status counters as `/coop/stats` lines (empty without an XDP arena).
    pub fn arena_status_text(&self) -> String {
        self.lock()
            .arena
            .as_ref()
            .map(|a| a.xdp_status_text())
            .unwrap_or_default()
    }

    /// Drops `object` from this node's cache (its peers' hints become stale until the
    /// next publication). For tests and operators.
    pub fn evict(&self, object: u64) -> bool {
        let mut st = self.lock();
        let had = st.bodies.remove(&object).is_some();
        st.cache.remove(object);
        if let Some(a) = &mut st.arena {
            a.evict(object);
        }
        // Deliberately not dirty: peers keep the stale hint until the next change.
        had
    }

    /// A cached body for a peer's fetch (a hit refreshes its recency here).
    pub(crate) fn cached_for_peer(&self, object: u64) -> Option<Cached> {
        let mut st = self.lock();
        let c = st.bodies.get(&object).cloned()?;
        st.cache.touch(object);
        Some(c)
    }

    /// The node's current directory update with `epoch`.
    fn directory(&self, epoch: u64) -> DirectoryUpdate {
        let mut st = self.lock();
        st.dirty = false;
        let ids: Vec<u64> = st.bodies.keys().copied().collect();
        drop(st);
        let mut filter = BloomFilter::for_objects(ids.len(), BLOOM_FP_DEFAULT);
        for id in ids {
            filter.insert(id);
        }
        DirectoryUpdate {
            node: self.me as u8,
            load: self.inflight.load(Ordering::Relaxed),
            epoch,
            filter,
        }
    }

    fn publish_loop(&self, udp: &UdpSocket, mut writer: Option<DirectoryWriter>) {
        let Some(sealer) = &self.sealer else { return };
        let unix_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let mut epoch = wire::first_epoch(unix_us);
        let mut last = Instant::now() - PUBLISH_HEARTBEAT;
        let mut last_load = u64::MAX;
        while !self.stopping() {
            std::thread::sleep(self.publish_period);
            let load = self.inflight.load(Ordering::Relaxed);
            let dirty = self.lock().dirty;
            if !dirty && load == last_load && last.elapsed() < PUBLISH_HEARTBEAT {
                continue;
            }
            epoch += 2;
            let update = self.directory(epoch);
            last_load = update.load;
            last = Instant::now();
            if let Some(w) = &mut writer {
                // Into this node's slot of every peer's arena (no datagram).
                let record = update.encode();
                self.write_directory(w, epoch, &record);
                continue;
            }
            if self.directory_mode == CoopDirectory::Read {
                // Into the node's own arena: peers read it there (no datagram).
                let record = update.encode();
                let mut st = self.lock();
                if let Some(a) = &mut st.arena {
                    if !a.put_directory(&record) {
                        log::debug!("coop: directory record of {} B not written", record.len());
                    }
                    self.counters
                        .directory_put
                        .store(a.counts.directory_put, Ordering::Relaxed);
                    self.counters
                        .arena_dropped
                        .store(a.counts.dropped, Ordering::Relaxed);
                }
                continue;
            }
            let (sealed, _) = sealer.seal(&update.encode());
            for (p, addr) in self.peers.iter().enumerate() {
                if p == self.me {
                    continue;
                }
                self.counters.overhead.spin(1);
                if udp.send_to(&sealed, addr).is_ok() {
                    self.counters.directory_sent.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .directory_sent_bytes
                        .fetch_add(sealed.len() as u64, Ordering::Relaxed);
                }
            }
        }
    }

    /// `--coop-directory write`: one publication of `record` (with `epoch`) into this
    /// node's slot of every live peer's arena.
    fn write_directory(&self, w: &mut DirectoryWriter, epoch: u64, record: &[u8]) {
        for (p, out) in w.publish_all(epoch, record) {
            match out {
                Ok(pushed) => {
                    self.counters.overhead.spin(pushed.writes);
                    self.counters
                        .directory_writes
                        .fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .directory_write_ops
                        .fetch_add(pushed.writes, Ordering::Relaxed);
                    self.counters
                        .directory_write_bytes
                        .fetch_add(pushed.bytes, Ordering::Relaxed);
                }
                Err(why) => {
                    log::debug!("coop: directory not written to node {p}: {why}");
                    self.counters
                        .directory_write_failed
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// `--coop-directory write`: once per publish period, looks at every peer's slot in
    /// this node's own arena and applies a valid, newer record as a received update is
    /// applied; a torn, stale or foreign one is counted and never applied. A slot whose
    /// sequence has not moved is not looked at again, so a peer that stops publishing
    /// ages out after the views' TTL.
    fn slot_loop(&self) {
        let mut seen = vec![0u64; self.nodes()];
        while !self.stopping() {
            std::thread::sleep(self.publish_period);
            for (p, last) in seen.iter_mut().enumerate() {
                if p == self.me {
                    continue;
                }
                let got = match self.lock().arena.as_mut() {
                    Some(a) => a.directory_slot(p),
                    None => return,
                };
                let (seq, record) = match got {
                    Ok(x) if x.0 == *last => continue,
                    Ok(x) => x,
                    Err(SlotRefusal::Empty) => continue,
                    Err(SlotRefusal::Torn) => {
                        self.counters
                            .directory_slot_torn
                            .fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                *last = seq;
                self.counters
                    .directory_slot_reads
                    .fetch_add(1, Ordering::Relaxed);
                match self.judge_and_apply(p, &record) {
                    Ok(_) => {}
                    Err(wire::RecordRefusal::Stale) => {
                        self.counters
                            .directory_slot_stale
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    Err(why) => {
                        log::debug!("coop: directory slot of node {p} refused: {why:?}");
                        self.counters
                            .directory_slot_foreign
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// `--coop-directory read`: once per publish period, reads every peer's directory
    /// record out of its arena and applies each valid, newer one as a received update
    /// is applied. Nothing of the peer's process runs for it.
    fn pull_loop(&self, mut reader: DirectoryReader) {
        while !self.stopping() {
            std::thread::sleep(self.publish_period);
            for p in 0..self.nodes() {
                if p == self.me || reader.backing_off(p, Instant::now()) {
                    continue;
                }
                self.counters
                    .directory_reads
                    .fetch_add(1, Ordering::Relaxed);
                let pulled = match reader.pull(p) {
                    Ok(x) => x,
                    Err(e) => {
                        log::debug!("coop: directory of node {p} not read: {}", e.why);
                        self.counters
                            .directory_read_failed
                            .fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                self.counters
                    .directory_read_ops
                    .fetch_add(pulled.reads, Ordering::Relaxed);
                self.counters
                    .directory_read_bytes
                    .fetch_add(pulled.bytes, Ordering::Relaxed);
                self.apply_record(p, &pulled.record);
            }
        }
    }

    /// Applies a directory record read from node `p`'s arena if it is valid and newer
    /// than the view held (see [`DirectoryUpdate::judge_read`]); counts a refusal.
    pub(crate) fn apply_record(&self, p: NodeId, record: &[u8]) {
        match self.judge_and_apply(p, record) {
            Ok(_) => {}
            Err(wire::RecordRefusal::Stale) => {
                self.counters
                    .directory_read_stale
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(why) => {
                log::debug!("coop: directory record of node {p} refused: {why:?}");
                self.counters
                    .directory_read_failed
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Applies a record from node `p` if [`DirectoryUpdate::judge_read`] accepts it as
    /// newer (true; counted as received), false if it is the record applied already
    /// (the view keeps its time), or the refusal.
    fn judge_and_apply(&self, p: NodeId, record: &[u8]) -> Result<bool, wire::RecordRefusal> {
        let mut st = self.lock();
        let last = st.views[p].as_ref().map(|v| v.seq);
        match DirectoryUpdate::judge_read(record, p, last)? {
            Some(update) => {
                st.views[p] = Some(PeerView {
                    directory: DirectoryView {
                        epoch: update.epoch,
                        filter: update.filter,
                    },
                    load: update.load,
                    at: Instant::now(),
                    seq: update.epoch,
                });
                drop(st);
                self.counters
                    .directory_received
                    .fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            // The record already applied: the view keeps its time, so a peer that stops
            // republishing (its heartbeat) ages out after VIEW_TTL.
            None => Ok(false),
        }
    }

    fn receive_directories(&self, udp: &UdpSocket) {
        let Some(sealer) = &self.sealer else { return };
        let mut buf = vec![0u8; mac::ENVELOPE_BYTES + wire::DIRECTORY_BYTES_MAX + 1];
        while !self.stopping() {
            let (n, from) = match udp.recv_from(&mut buf) {
                Ok(x) => x,
                Err(_) => continue,
            };
            // Every datagram received is a message handled (update or udp fetch).
            self.counters.overhead.spin(1);
            // The kind byte is covered by the tag: a forged kind fails authentication.
            if buf.get(mac::ENVELOPE_BYTES) == Some(&wire::KIND_FETCH) {
                self.answer_udp_fetch(sealer, udp, &buf[..n], from);
                continue;
            }
            match self.accept_directory(sealer, &buf[..n]) {
                Ok(()) => self
                    .counters
                    .directory_received
                    .fetch_add(1, Ordering::Relaxed),
                Err(why) => {
                    log::debug!("coop: directory update refused: {why}");
                    self.counters
                        .directory_refused
                        .fetch_add(1, Ordering::Relaxed)
                }
            };
        }
    }

    /// Answers one UDP fetch (`--coop-peer udp`) if it is authentic, fresh and from a
    /// peer: the body's pieces, each sealed with the fetch's envelope, or "absent".
    fn answer_udp_fetch(&self, sealer: &Sealer, udp: &UdpSocket, bytes: &[u8], from: SocketAddr) {
        let opened = sealer
            .receive(bytes, &self.fetch_replay)
            .map_err(|e| e.to_string())
            .and_then(|(env, msg)| {
                let object = wire::decode_fetch(msg).ok_or("malformed fetch")?;
                if env.sender as usize >= self.nodes() || env.sender as usize == self.me {
                    return Err(format!("fetch from sender {}", env.sender));
                }
                Ok((env, object))
            });
        let (env, object) = match opened {
            Ok(x) => x,
            Err(why) => {
                log::debug!("coop: udp fetch refused: {why}");
                self.counters.fetch_refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let cached = self.cached_for_peer(object);
        let body = cached
            .as_ref()
            .filter(|c| c.body.len() <= super::udp::UDP_BODY_BYTES_MAX)
            .map(|c| (c.body.as_slice(), c.crc));
        if body.is_some() {
            self.counters.peer_served.fetch_add(1, Ordering::Relaxed);
        }
        for piece in super::udp::encode_pieces(object, body) {
            self.counters.overhead.spin(1);
            let _ = udp.send_to(&sealer.seal_as(&env, &piece), from);
        }
    }

    /// Acts on one received datagram if it is an authentic, fresh, well-formed update
    /// from a peer about itself.
    pub(crate) fn accept_directory(&self, sealer: &Sealer, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() > mac::ENVELOPE_BYTES + wire::DIRECTORY_BYTES_MAX {
            return Err("too long".into());
        }
        if self.directory_mode == CoopDirectory::Read {
            // Views come from the peers' arenas only: a datagram is not looked at.
            return Err("a directory datagram with --coop-directory read".into());
        }
        let (env, msg) = sealer
            .receive(bytes, &self.directory_replay)
            .map_err(|e| e.to_string())?;
        let update = DirectoryUpdate::decode(msg).ok_or("malformed")?;
        let p = update.node as usize;
        if env.sender != p as u64 || p == self.me || p >= self.nodes() {
            return Err(format!("node {p} from sender {}", env.sender));
        }
        let mut st = self.lock();
        let now = Instant::now();
        // Sequences grow across a peer's restarts (they start from the clock), epochs do
        // not: the newest update by sequence wins, so a late datagram never rolls a view
        // back and a restarted peer's first update is taken.
        if st.views[p].as_ref().is_some_and(|v| v.seq >= env.seq) {
            return Ok(());
        }
        st.views[p] = Some(PeerView {
            directory: DirectoryView {
                epoch: update.epoch,
                filter: update.filter,
            },
            load: update.load,
            at: now,
            seq: env.seq,
        });
        Ok(())
    }
}

/// The peer port's accept loop: one thread per connection, at most [`PEER_CONNS_MAX`].
pub(crate) fn serve_peers(listener: TcpListener, node: Arc<Node>) {
    super::accept::accept_bounded(
        &listener,
        &node,
        PEER_CONNS_MAX,
        ("coop-peer", 256 * 1024),
        serve_peer,
    );
}

/// Answers fetches on one connection until it closes, idles out or sends a refused
/// message (then it is closed: a peer speaking wrongly gets no more of our time).
fn serve_peer(mut s: TcpStream, node: &Node) {
    let Some(sealer) = &node.sealer else { return };
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(PEER_IDLE_TIMEOUT));
    let _ = s.set_write_timeout(Some(PEER_IO_TIMEOUT));
    while !node.stopping() {
        let Ok(frame) = read_frame(&mut s, wire::FETCH_BYTES) else {
            return;
        };
        node.counters.overhead.spin(1);
        let opened = sealer
            .receive(&frame, &node.fetch_replay)
            .map_err(|e| e.to_string())
            .and_then(|(env, msg)| {
                let object = wire::decode_fetch(msg).ok_or("malformed fetch")?;
                if env.sender as usize >= node.nodes() || env.sender as usize == node.index() {
                    return Err(format!("fetch from sender {}", env.sender));
                }
                Ok((env, object))
            });
        let (env, object) = match opened {
            Ok(x) => x,
            Err(why) => {
                log::debug!("coop: fetch refused: {why}");
                node.counters.fetch_refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let cached = node.cached_for_peer(object);
        if cached.is_some() {
            node.counters.peer_served.fetch_add(1, Ordering::Relaxed);
        }
        let msg = wire::encode_body(
            object,
            cached
                .as_ref()
                .filter(|c| c.body.len() <= wire::BODY_BYTES_MAX)
                .map(|c| (c.body.as_slice(), c.crc)),
        );
        node.counters.overhead.spin(1);
        if s.write_all(&sealer.seal_as(&env, &msg)).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_root_or_odd_are_refused() {
        assert_eq!(check_path("/o/1"), Ok("/o/1"));
        assert_eq!(check_path("o/1"), Err(400));
        assert_eq!(check_path("/a/../b"), Err(400));
        assert_eq!(check_path("/a/%2e%2e/b"), Err(400));
        assert_eq!(check_path("/a b"), Err(400));
        assert_eq!(check_path(&format!("/{}", "x".repeat(2000))), Err(400));
    }
}
