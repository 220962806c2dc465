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
//! - **Keys and permissions.** READs anywhere in the region; mutations only on the
//!   control words; unknown keys get no reply; datagram READs must be padded to their
//!   reply (no reflection); XDP answers only the node's address. A reader's key can be
//!   given per region as `ENDPOINT?key=HEX` ([`Target`]).

pub mod client;
mod endpoint;
pub mod fdshare;
pub mod ops;
pub mod relay;
pub mod tcp_server;
pub mod udp;
pub mod wire;

pub use client::{
    connect, connect_target, map_region, ClientOptions, RemoteMemory, RmemError, ShmClient,
    TcpClient, DEFAULT_READ_KEY,
};
pub use endpoint::{Endpoint, Target};
pub use ops::{AccessKeys, Dedup, OpCounters, Perm};
pub use tcp_server::TcpServer;
pub use udp::{UdpClient, UdpServer};

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

/// Set the calling thread's nice value (-20..=19). On Linux `setpriority` on a thread id
/// affects that thread only: a periodic thread (gatherd's sampler, a monitor) can be
/// kept on time on a busy CPU without raising the rest of its process. Lowering it
/// needs CAP_SYS_NICE.
pub fn set_thread_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: gettid and setpriority take plain integers and have no memory effects.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Apply `nice` to the calling periodic thread if it is not 0, logging the outcome as
/// `who` (a failure is a warning: the thread runs on at the process's priority).
pub fn apply_thread_nice(who: &str, nice: i32) {
    if nice == 0 {
        return;
    }
    match set_thread_nice(nice) {
        Ok(()) => log::info!("{who}: thread at nice {nice}"),
        Err(e) => log::warn!("{who}: nice {nice}: {e}; running at the process's priority"),
    }
}

/// Paces a polling loop at a fixed period without drift; a late wake-up skips ahead
/// instead of bursting to catch up.
pub struct Pacer {
    period: std::time::Duration,
    next: std::time::Instant,
    /// Periods whose deadline had passed when `wait` was called.
    pub overruns: u64,
}

impl Pacer {
    pub fn new(period: std::time::Duration) -> Self {
        // Timer slack of 1 µs so sub-ms periods are kept (the default slack is 50 µs).
        // SAFETY: prctl with integer arguments; affects only the calling thread.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64, 0, 0, 0) };
        Pacer {
            period,
            next: std::time::Instant::now() + period,
            overruns: 0,
        }
    }

    /// Sleep until the next period starts.
    pub fn wait(&mut self) {
        let now = std::time::Instant::now();
        if self.next > now {
            std::thread::sleep(self.next - now);
            self.next += self.period;
        } else {
            self.overruns += 1;
            self.next = now + self.period;
        }
    }
}

/// CLOCK_MONOTONIC in ns: comparable across processes on one host (shared tables).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
