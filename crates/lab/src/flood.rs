//! A bounded request flood against one back-end's udp responder: one thread sends READ
//! requests as fast as it can for a fixed time, another counts the replies. Measures the
//! request rate one back-end sustains (and what it drops), for XDP vs user space.

use farside_rmem::wire::{
    encode_request, Op, RepHeader, ReqHeader, Status, REP_BYTES_MAX, REP_HEADER_BYTES,
};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest flood allowed (a bound on any load this machine's lab generates).
pub const FLOOD_S_MAX: f64 = 30.0;
/// Requests sent per burst before checking the clock.
const BURST: usize = 64;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FloodResult {
    pub sent: u64,
    pub replies: u64,
    pub seconds: f64,
}

impl FloodResult {
    pub fn replies_per_s(&self) -> f64 {
        self.replies as f64 / self.seconds.max(1e-9)
    }
}

/// Flood `target` with READs of `size` bytes for `seconds` (at most `FLOOD_S_MAX`).
pub fn flood(target: SocketAddr, key: u64, size: usize, seconds: f64) -> io::Result<FloodResult> {
    let seconds = seconds.clamp(0.1, FLOOD_S_MAX);
    let sock = UdpSocket::bind(if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })?;
    sock.connect(target)?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let rx = sock.try_clone()?;
    let stop = Arc::new(AtomicBool::new(false));
    let replies = Arc::new(AtomicU64::new(0));
    let counter = {
        let (stop, replies) = (stop.clone(), replies.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; REP_BYTES_MAX];
            while !stop.load(Ordering::Relaxed) {
                if let Ok(n) = rx.recv(&mut buf) {
                    if RepHeader::decode(&buf[..n]).is_ok_and(|h| h.status == Status::Ok) {
                        replies.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    let mut req = Vec::new();
    let mut sent = 0u64;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        for _ in 0..BURST {
            encode_request(
                &mut req,
                &ReqHeader {
                    op: Op::Read as u8,
                    seq: sent,
                    key,
                    region: 0,
                    offset: 0,
                    len: size as u32,
                    ..Default::default()
                },
                &[],
            );
            // Padded to the reply's size, as UdpClient does, so XDP can answer in place.
            req.resize(req.len().max(REP_HEADER_BYTES + size), 0);
            if sock.send(&req).is_ok() {
                sent += 1;
            }
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    // Replies still in flight get a moment to arrive.
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    let _ = counter.join();
    Ok(FloodResult {
        sent,
        replies: replies.load(Ordering::Relaxed),
        seconds: elapsed,
    })
}
