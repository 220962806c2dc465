//! A fault injector for the udp transport: a user-space UDP forwarder between one client
//! and a server that loses, duplicates, delays and so reorders datagrams in both
//! directions, driven by a seeded generator so a failing run can be repeated. The
//! exactly-once tests put it between a `UdpClient` and a real server (user space or
//! XDP); it binds loopback only.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest datagram forwarded (a jumbo frame; rmem datagrams are under 1500 bytes).
const DATAGRAM_BYTES_MAX: usize = 9000;
/// Most datagrams held back at once; beyond it new ones are dropped (counted as loss).
const HELD_MAX: usize = 4096;
/// Sleep of the forwarding loop when nothing arrived, bounding its CPU use.
const IDLE_SLEEP: Duration = Duration::from_micros(100);

/// Fault rates per datagram, in percent, and the delay bound.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// Requests (client → server) dropped.
    pub drop_req: u64,
    /// Replies (server → client) dropped.
    pub drop_rep: u64,
    /// Datagrams sent twice.
    pub dup: u64,
    /// Every forwarded datagram (and duplicate) waits 0..=this before it is sent on, so
    /// datagrams overtake each other.
    pub delay_ms_max: u64,
}

/// The running relay; clients send to [`LossyRelay::addr`]. Stops when dropped.
pub struct LossyRelay {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LossyRelay {
    /// Forward between one client (whoever sends to `addr`) and `server`.
    pub fn spawn(server: SocketAddr, f: Faults, seed: u64) -> io::Result<LossyRelay> {
        let front = UdpSocket::bind("127.0.0.1:0")?;
        let back = UdpSocket::bind("127.0.0.1:0")?;
        back.connect(server)?;
        front.set_nonblocking(true)?;
        back.set_nonblocking(true)?;
        let addr = front.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rmem-relay".into())
            .spawn(move || {
                let mut x = seed | 1;
                let mut rnd = move |n: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % n.max(1)
                };
                let mut client = None;
                // (due, toward the server, bytes)
                let mut later: Vec<(Instant, bool, Vec<u8>)> = Vec::new();
                let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
                while !st.load(Ordering::Relaxed) {
                    let mut idle = true;
                    for up in [true, false] {
                        let got = if up {
                            front.recv_from(&mut buf).map(|(n, from)| {
                                client = Some(from);
                                n
                            })
                        } else {
                            back.recv(&mut buf)
                        };
                        let Ok(n) = got else { continue };
                        idle = false;
                        let drop = if up { f.drop_req } else { f.drop_rep };
                        if rnd(100) < drop {
                            continue;
                        }
                        for _ in 0..1 + usize::from(rnd(100) < f.dup) {
                            if later.len() < HELD_MAX {
                                let d = Duration::from_millis(rnd(f.delay_ms_max + 1));
                                later.push((Instant::now() + d, up, buf[..n].to_vec()));
                            }
                        }
                    }
                    let now = Instant::now();
                    let mut i = 0;
                    while i < later.len() {
                        if later[i].0 > now {
                            i += 1;
                            continue;
                        }
                        let (_, up, b) = later.swap_remove(i);
                        if up {
                            let _ = back.send(&b);
                        } else if let Some(c) = client {
                            let _ = front.send_to(&b, c);
                        }
                    }
                    if idle {
                        std::thread::sleep(IDLE_SLEEP);
                    }
                }
            })?;
        Ok(LossyRelay {
            addr,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for LossyRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
