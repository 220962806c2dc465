//! The two-sided baseline server: the gatherer process reads each request from a TCP
//! connection and answers it. It runs at normal priority like any daemon, so under CPU
//! saturation its answers wait for the scheduler — the effect the papers measure.

use crate::auth::ServerKeys;
use crate::ops::{self, Dedup, OpCounters};
use crate::wire::*;
use farside_region::Words;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Most client connections served at once; further ones are closed at accept.
pub const TCP_CONNS_MAX: usize = 64;
/// A connection idle this long is closed.
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

pub struct TcpServer {
    pub local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl TcpServer {
    pub fn spawn(
        addr: SocketAddr,
        mem: Arc<dyn Words>,
        keys: Arc<ServerKeys>,
        counters: Arc<OpCounters>,
    ) -> io::Result<TcpServer> {
        Self::spawn_with_dedup(addr, mem, keys, counters, Arc::new(Dedup::new()))
    }

    /// As [`TcpServer::spawn`], sharing duplicate detection with other servers of the
    /// same memory (gatherd's udp server), so a client's retry is recognised whichever
    /// server the first attempt reached.
    pub fn spawn_with_dedup(
        addr: SocketAddr,
        mem: Arc<dyn Words>,
        keys: Arc<ServerKeys>,
        counters: Arc<OpCounters>,
        dedup: Arc<Dedup>,
    ) -> io::Result<TcpServer> {
        let listener = TcpListener::bind(addr)?;
        let local_addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let active = Arc::new(AtomicUsize::new(0));
        std::thread::Builder::new()
            .name("rmem-tcp".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if st.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    if active.load(Ordering::Relaxed) >= TCP_CONNS_MAX {
                        log::warn!("rmem tcp: {TCP_CONNS_MAX} connections open, refusing one");
                        continue;
                    }
                    active.fetch_add(1, Ordering::Relaxed);
                    let (mem, keys, counters, dedup, active, st) = (
                        mem.clone(),
                        keys.clone(),
                        counters.clone(),
                        dedup.clone(),
                        active.clone(),
                        st.clone(),
                    );
                    let spawned = std::thread::Builder::new()
                        .name("rmem-tcp-conn".into())
                        .spawn(move || {
                            if let Err(e) = serve_conn(conn, &*mem, &keys, &counters, &dedup, &st) {
                                log::debug!("rmem tcp connection ended: {e}");
                            }
                            active.fetch_sub(1, Ordering::Relaxed);
                        });
                    if spawned.is_err() {
                        log::warn!("rmem tcp: cannot spawn a connection thread");
                    }
                }
            })?;
        Ok(TcpServer { local_addr, stop })
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_millis(100));
    }
}

fn serve_conn(
    mut s: TcpStream,
    mem: &dyn Words,
    keys: &ServerKeys,
    counters: &OpCounters,
    dedup: &Dedup,
    stop: &AtomicBool,
) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(TCP_IDLE_TIMEOUT))?;
    let mut req = vec![0u8; REQ_BYTES_MAX];
    let mut reply = Vec::with_capacity(REP_BYTES_MAX);
    while !stop.load(Ordering::Relaxed) {
        // The envelope's len frames the request; nothing in it is trusted before the
        // tag verified (ops::execute), and a request that does not verify ends the
        // connection unanswered (its framing cannot be trusted either).
        s.read_exact(&mut req[..ENVELOPE_BYTES])?;
        let len = u32::from_le_bytes(req[12..16].try_into().expect("4 bytes")) as usize;
        if !(REQ_HEADER_BYTES..=REQ_HEADER_BYTES + OP_BYTES_MAX).contains(&len) {
            return Ok(());
        }
        s.read_exact(&mut req[ENVELOPE_BYTES..ENVELOPE_BYTES + len])?;
        let status = ops::execute(
            mem.words(),
            keys,
            counters,
            dedup,
            false,
            &req[..ENVELOPE_BYTES + len],
            &mut reply,
        );
        if reply.is_empty() {
            // Not authentic, or a copy: no answer, and the stream is not trusted.
            debug_assert!(ops::silent(status));
            return Ok(());
        }
        s.write_all(&reply)?;
    }
    Ok(())
}
