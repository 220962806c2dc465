//! The closed-loop clients of `lab coop`: blocking HTTP/1.1 keep-alive clients, each
//! replaying the trace from its own offset against one node (client `k` -> node
//! `k % nodes`, round-robin), every body checked against its object's length and
//! CRC32c. The project's load generator does not check bodies, which this experiment
//! must (a cooperative cache's worst failure is a wrong body), hence these clients.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time for one read or write of a client: far above a loaded node's latency, it only
/// unsticks a client from a dead node.
const CLIENT_IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Latency samples a client keeps (4 bytes each): a client at 10,000 requests/s for a
/// 100 s window.
const SAMPLES_PER_CLIENT_MAX: usize = 1_000_000;
/// Largest response head accepted.
const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Largest `/coop/stats` body read.
const STATS_BYTES_MAX: u64 = 64 * 1024;

/// What to run.
pub struct Spec {
    pub targets: Vec<SocketAddr>,
    pub clients: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Object of each request, in trace order.
    pub requests: Arc<Vec<u32>>,
    /// CRC32c of each object's body.
    pub crcs: Arc<Vec<u32>>,
}

/// What the clients measured.
pub struct Measure {
    pub served: u64,
    pub wrong_bodies: u64,
    pub errors: u64,
    pub latencies_us: Vec<u32>,
    pub window_s: f64,
    /// Each node's `/coop/stats` at the start and the end of the window.
    pub stats_before: Vec<String>,
    pub stats_after: Vec<String>,
}

impl Measure {
    pub fn percentile_ms(&self, q: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies_us.len() as f64 * q).ceil() as usize)
            .clamp(1, self.latencies_us.len())
            - 1;
        f64::from(self.latencies_us[i]) / 1e3
    }
}

/// The value of counter `key` in a `/coop/stats` text (0 if absent).
pub fn stat(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

struct Conn {
    r: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr) -> io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, CLIENT_IO_TIMEOUT)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(CLIENT_IO_TIMEOUT))?;
        s.set_write_timeout(Some(CLIENT_IO_TIMEOUT))?;
        Ok(Conn {
            r: BufReader::new(s),
        })
    }

    /// GET `path`: status, body, whether the connection stays open.
    fn get(&mut self, path: &str, body_max: u64) -> io::Result<(u16, Vec<u8>, bool)> {
        write!(
            self.r.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: farside\r\n\r\n"
        )?;
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        let (mut status, mut len, mut keep, mut head) = (0u16, None, true, 0usize);
        loop {
            let mut line = String::new();
            let n = self.r.read_line(&mut line)?;
            head += n;
            if n == 0 || head > HEAD_BYTES_MAX {
                return Err(bad("closed or oversized head"));
            }
            let line = line.trim_end();
            if status == 0 {
                status = line
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad("status line"))?;
                continue;
            }
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                if k == "content-length" {
                    len = Some(v.parse::<u64>().map_err(|_| bad("content-length"))?);
                } else if k == "connection" && v.eq_ignore_ascii_case("close") {
                    keep = false;
                }
            }
        }
        let len = len.ok_or_else(|| bad("no content-length"))?;
        if len > body_max {
            return Err(bad("body too large"));
        }
        let mut body = vec![0u8; len as usize];
        self.r.read_exact(&mut body)?;
        Ok((status, body, keep))
    }
}

fn stats(addr: SocketAddr) -> String {
    Conn::open(addr)
        .and_then(|mut c| c.get("/coop/stats", STATS_BYTES_MAX))
        .map(|(_, b, _)| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

#[derive(Default)]
struct ClientOut {
    served: u64,
    wrong: u64,
    errors: u64,
    lat: Vec<u32>,
}

fn client(k: usize, spec: &Spec, from: Instant, until: Instant, stop: &AtomicBool) -> ClientOut {
    let target = spec.targets[k % spec.targets.len()];
    let reqs = &spec.requests;
    let mut at = k * reqs.len() / spec.clients.max(1);
    let mut out = ClientOut::default();
    let mut conn: Option<Conn> = None;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        let object = reqs[at % reqs.len()] as usize;
        at += 1;
        let t0 = Instant::now();
        let c = match conn.take().map_or_else(|| Conn::open(target), Ok) {
            Ok(c) => conn.insert(c),
            Err(_) => {
                out.errors += u64::from(t0 >= from);
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let r = c.get(&format!("/o/{object}"), 64 << 20);
        let done = Instant::now();
        let counted = done >= from && done <= until;
        match r {
            Ok((200, body, keep)) => {
                if !keep {
                    conn = None;
                }
                if !counted {
                    continue;
                }
                if crc32c::crc32c(&body) != spec.crcs[object] {
                    out.wrong += 1;
                } else {
                    out.served += 1;
                    if out.lat.len() < SAMPLES_PER_CLIENT_MAX {
                        out.lat
                            .push(done.duration_since(t0).as_micros().min(u32::MAX as u128) as u32);
                    }
                }
            }
            Ok((_, _, keep)) => {
                if !keep {
                    conn = None;
                }
                out.errors += u64::from(counted);
            }
            Err(_) => {
                conn = None;
                out.errors += u64::from(counted);
            }
        }
    }
    out
}

/// Runs the clients (in the calling thread's network namespace) for warm-up + window.
pub fn run(spec: &Spec) -> io::Result<Measure> {
    let start = Instant::now();
    let from = start + spec.warmup;
    let until = from + spec.duration;
    let stop = AtomicBool::new(false);
    let (outs, before) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..spec.clients)
            .map(|k| {
                let stop = &stop;
                s.spawn(move || client(k, spec, from, until, stop))
            })
            .collect();
        std::thread::sleep(from.saturating_duration_since(Instant::now()));
        let before: Vec<String> = spec.targets.iter().map(|&a| stats(a)).collect();
        let outs: Vec<ClientOut> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect();
        (outs, before)
    });
    let after: Vec<String> = spec.targets.iter().map(|&a| stats(a)).collect();
    let mut lat: Vec<u32> = outs.iter().flat_map(|o| o.lat.iter().copied()).collect();
    lat.sort_unstable();
    Ok(Measure {
        served: outs.iter().map(|o| o.served).sum(),
        wrong_bodies: outs.iter().map(|o| o.wrong).sum(),
        errors: outs.iter().map(|o| o.errors).sum(),
        latencies_us: lat,
        window_s: spec.duration.as_secs_f64(),
        stats_before: before,
        stats_after: after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_lines_parse() {
        let t = "local_hits 5\nremote_hits 7\n";
        assert_eq!(stat(t, "remote_hits"), 7);
        assert_eq!(stat(t, "misses"), 0);
    }
}
