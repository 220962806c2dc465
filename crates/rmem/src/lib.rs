//! Remote memory: `read`, `write`, `compare_swap` and `fetch_add` on a back-end's
//! region, over several transports behind one interface ([`RemoteMemory`]).
//!
//! | transport | who answers | one-sided? |
//! |---|---|---|
//! | `shm` | nobody: the region file is mapped here (same host) | yes |
//! | `tcp` | the gatherer process, per request | no (the papers' baseline) |
//! | `udp` | the XDP program in the kernel, or the gatherer as fallback | yes with XDP |
//!
//! Operation semantics (checks and their order) live in [`ops`]; the wire format in
//! [`wire`]. All offsets and lengths are bytes and multiples of 8.
//!
//! What every transport guarantees (the design, in one place):
//! - **One memory.** A node's transports operate on the same words. Without XDP that is
//!   the shm file (or heap) that gatherd's tcp and udp servers serve; with XDP it is the
//!   BPF map: gatherd publishes into the map, serves tcp and the udp fallback from its
//!   mapping, and hands same-host shm readers the map's fd over a Unix socket at the shm
//!   path ([`fdshare`], [`map_region`]), since pinning maps is refused on some kernels.
//! - **Exactly once, or at most once and said so.** Each client has a random id and
//!   numbers its ops; retries repeat (client, seq). Servers apply a WRITE, CAS or
//!   FETCH-ADD at most once per (client, seq), replay the recorded answer to a retry and
//!   drop older duplicates ([`ops::Dedup`]; the XDP program's `rmem_dedup` map, one per
//!   server: gatherd's tcp and udp servers share one, the XDP program has its own, and a
//!   client's datagrams all reach the same one). `Ok` is the one true answer; an error
//!   means applied at most once ([`RemoteMemory`]).
//! - **Authenticated, with per-key rights ([`auth`]).** Every request and reply carries
//!   a `farside_auth` envelope (SipHash-2-4 tag, key id, sender, seq); a server acts
//!   only on requests that verify under one of its keys and are not copies (replay
//!   window), within that key's rights (`farside_auth::rights`: agent-owned words are
//!   never remotely writable); anything else gets no reply. Replies are sealed under the
//!   request's key and bound to its envelope, so a client accepts only the answer to
//!   its own request. Datagram READs must be padded to their reply (no reflection); XDP
//!   answers only the node's address. Keys come from files ([`auth`]); a region's key
//!   can be named per region as `ENDPOINT?key=ID:PATH` ([`Target`]).

pub mod auth;
pub mod client;
mod endpoint;
pub mod fdshare;
pub mod iface;
pub mod ops;
pub mod relay;
pub mod tcp_server;
pub mod udp;
pub mod wire;

pub use auth::{ClientKey, KeySpec, LabKeyset, Role, ServerKeys};
pub use client::{
    connect, connect_target, map_region, ClientOptions, RemoteMemory, RmemError, ShmClient,
    TcpClient,
};
pub use endpoint::{Endpoint, Target};
pub use ops::{Dedup, OpCounters};
pub use tcp_server::TcpServer;
pub use udp::{GroupJoin, UdpClient, UdpServer};

/// A random 64-bit value from the kernel (sequence starts, generated keys).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 8 {
        u64::from_le_bytes(b)
    } else {
        // getrandom cannot fail for 8 bytes after boot; fall back to time anyway.
        farside_region::fresh_generation()
    }
}

/// Clocks, pacing and thread priority live in `farside-rt`; re-exported here for the
/// callers that reach them through the remote-memory layer.
pub use farside_rt::{apply_thread_nice, mono_ns, set_thread_nice, Pacer};
