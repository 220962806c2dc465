//! Idle keep-alive connections to back-ends, one small LIFO stack per back-end.
//!
//! Bounds: at most `http.pool_idle_per_backend` idle connections per back-end (a
//! connection returned to a full stack is closed), none older than
//! `http.pool_idle_timeout_ms` is handed out. LIFO keeps the hottest connections in use
//! and lets the back-end's own keep-alive timeout retire the cold ones.
//!
//! A connection the back-end closed while it sat idle is usually caught at checkout (its
//! socket is already readable: EOF); the rest are caught by the caller's single retry
//! on a fresh connection for idempotent requests.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

struct Idle {
    addr: SocketAddr,
    stream: TcpStream,
    since: Instant,
}

pub struct Pool {
    /// Indexed by back-end index (`Route::backend`, i.e. the configured back-end list);
    /// an index beyond it is simply not pooled. The lock is held only to push or pop.
    slots: Vec<Mutex<Vec<Idle>>>,
    idle_max: usize,
    idle_timeout: Duration,
}

impl Pool {
    pub fn new(backends: usize, idle_max: usize, idle_timeout: Duration) -> Self {
        Pool {
            slots: (0..backends).map(|_| Mutex::new(Vec::new())).collect(),
            idle_max,
            idle_timeout,
        }
    }

    /// An idle connection to `addr`, if a live, fresh one is pooled for `backend`.
    pub fn take(&self, backend: usize, addr: SocketAddr) -> Option<TcpStream> {
        let slot = self.slots.get(backend)?;
        let now = Instant::now();
        loop {
            let idle = slot.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
            if idle.addr != addr || now.duration_since(idle.since) >= self.idle_timeout {
                continue;
            }
            // Readiness is cached by the reactor: this costs no syscall unless the socket
            // became readable while idle, which for an idle HTTP connection means EOF,
            // a reset, or stray bytes; all make it unusable.
            let mut probe = [0u8; 1];
            match idle.stream.try_read(&mut probe) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Some(idle.stream),
                _ => continue,
            }
        }
    }

    /// Return a connection whose last response was fully read.
    pub fn put(&self, backend: usize, addr: SocketAddr, stream: TcpStream) {
        let Some(slot) = self.slots.get(backend) else {
            return;
        };
        if self.idle_max == 0 {
            return;
        }
        let mut idle = slot.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() >= self.idle_max {
            // Drop the oldest: the newest is the likeliest to stay alive.
            let oldest = idle.remove(0);
            idle.push(Idle {
                addr,
                stream,
                since: Instant::now(),
            });
            drop(idle);
            drop(oldest);
            return;
        }
        idle.push(Idle {
            addr,
            stream,
            since: Instant::now(),
        });
    }

    /// Close idle connections that have expired or that their back-end has closed, so
    /// they do not linger in CLOSE_WAIT until the next checkout. Called periodically.
    pub fn purge(&self) {
        let now = Instant::now();
        for slot in &self.slots {
            let mut idle = slot.lock().unwrap_or_else(|p| p.into_inner());
            let before = idle.len();
            let mut probe = [0u8; 1];
            idle.retain(|i| {
                now.duration_since(i.since) < self.idle_timeout
                    && matches!(i.stream.try_read(&mut probe),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            });
            debug_assert!(idle.len() <= before);
        }
    }

    /// Idle connections pooled for `backend` now.
    pub fn idle_count(&self, backend: usize) -> usize {
        self.slots
            .get(backend)
            .map_or(0, |s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
    }
}
