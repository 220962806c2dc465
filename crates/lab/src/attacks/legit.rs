//! The flood lab's legitimate clients: sessions to the VIP at a steady pace, their
//! tallies, and a description of every request they lose.

use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::dc::{self, VIP};

/// A session's pace: one request per period.
pub const REQUEST_PERIOD: Duration = Duration::from_millis(200);
/// A legitimate request's bound (connect, then each request).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Lost legitimate requests described in a point's effect (what failed, when, on a
/// connection moved how often): enough to tell a flood's effect from a migration's.
const LOST_DETAILS_MAX: usize = 8;
/// The legitimate clients' tallies.
#[derive(Default)]
pub struct Legit {
    pub served: AtomicU64,
    pub failed: AtomicU64,
    pub lost: AtomicU64,
    /// The first [`LOST_DETAILS_MAX`] lost requests, described.
    pub lost_details: Mutex<Vec<String>>,
    /// Live connections to the VIP (client address → its tracking state).
    pub live: Mutex<HashMap<SocketAddrV4, Tracked>>,
}

/// What the sampler last saw of one live connection's front-end entry.
#[derive(Default, Clone)]
pub struct Tracked {
    pub last: Option<String>,
    pub moves: u32,
    pub evicted: bool,
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where a lost connection is, looked up when its request is lost (client address →
/// a description: which process on which node holds it, its queues and timers).
pub type Probe<'a> = &'a (dyn Fn(SocketAddrV4) -> String + Sync);

/// One legitimate session: a connection to the VIP used every [`REQUEST_PERIOD`] for
/// `requests` requests, then a new one, until `stop`. A lost request is described
/// with what `probe` finds of its connection then.
pub fn session(legit: &Legit, requests: u32, stop: &AtomicBool, probe: Probe<'_>) {
    while !stop.load(Ordering::Relaxed) {
        let mut s = match TcpStream::connect_timeout(&SocketAddr::V4(VIP), REQUEST_TIMEOUT) {
            Ok(s) => s,
            Err(_) => {
                legit.failed.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(REQUEST_PERIOD);
                continue;
            }
        };
        let _ = s.set_read_timeout(Some(REQUEST_TIMEOUT));
        let _ = s.set_write_timeout(Some(REQUEST_TIMEOUT));
        let _ = s.set_nodelay(true);
        let me = match s.local_addr() {
            Ok(SocketAddr::V4(a)) => Some(a),
            _ => None,
        };
        if let Some(a) = me {
            lock(&legit.live).insert(a, Tracked::default());
        }
        let mut n = 0u32;
        while !stop.load(Ordering::Relaxed) && n < requests {
            let asked = Instant::now();
            match dc::http_get(&mut s) {
                Ok(200) => {
                    legit.served.fetch_add(1, Ordering::Relaxed);
                }
                other => {
                    legit.failed.fetch_add(1, Ordering::Relaxed);
                    legit.lost.fetch_add(1, Ordering::Relaxed);
                    let what = match other {
                        Ok(status) => format!("status {status}"),
                        Err(e) => format!("{:?}: {e}", e.kind()),
                    };
                    let moves = me
                        .and_then(|a| lock(&legit.live).get(&a).map(|t| t.moves))
                        .unwrap_or(0);
                    let waited = asked.elapsed().as_millis();
                    let full = lock(&legit.lost_details).len() >= LOST_DETAILS_MAX;
                    let seen = match me {
                        Some(a) if !full => format!("; {}", probe(a)),
                        _ => String::new(),
                    };
                    let mut details = lock(&legit.lost_details);
                    if details.len() < LOST_DETAILS_MAX {
                        details.push(format!(
                            "request {} of {me:?} after {waited} ms: {what} (connection seen moved {moves}x{seen})",
                            n + 1,
                        ));
                    }
                    break;
                }
            }
            n += 1;
            std::thread::sleep(REQUEST_PERIOD);
        }
        if let Some(a) = me {
            lock(&legit.live).remove(&a);
        }
    }
}
