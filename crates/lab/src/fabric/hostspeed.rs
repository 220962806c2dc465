//! The host's speed at one moment: a fixed reference workload, timed in the host's busy
//! CPU per operation, so that a cost calibrated at one time can be compared with a run
//! measured at another on a host whose speed drifts (a virtual machine beside other
//! tenants: the same lab point measured 16–20 % apart within an hour here).
//!
//! The workload is the request path's kernel work without any of the project's code:
//! one pair of threads per CPU (both on that CPU), each a client that writes a
//! [`REQUEST_BYTES`] request over loopback TCP and reads a [`RESPONSE_BYTES`] answer
//! from its server thread, for a fixed time. Its figure is the host's busy time (`/proc/stat`, all CPUs, steal
//! included as the time the host did not give) over the round trips it completed, so a
//! slower host (a busier neighbour, more steal, a colder cache) reads higher.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::hostcpu::{host_cpus, host_ns};

/// One reference request, bytes.
pub const REQUEST_BYTES: usize = 64;
/// One reference answer, bytes (a page's object of the World Cup trace's order).
pub const RESPONSE_BYTES: usize = 4096;
/// The default measured time: readings of 0.5 s on an idle host here spread from 8.6 to
/// 13.4 µs per round trip, readings of 2 s by ±8 % (with steps of 12 % within half a
/// minute: the host's own speed), so 1 s, read before and after what it describes.
pub const REFERENCE_DEFAULT: Duration = Duration::from_secs(1);
/// Pairs at most, whatever the CPU count (each pair is two threads).
pub const PAIRS_MAX: usize = 64;
/// Fewest round trips a measurement must complete to be a figure.
pub const OPS_MIN: u64 = 100;

/// One reference measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostSpeed {
    /// The host's busy ns per round trip (all CPUs).
    pub busy_ns_per_op: f64,
    /// Round trips completed, over all pairs.
    pub ops: u64,
    /// The host's steal over the measurement, as a share of its CPUs' time.
    pub steal_frac: f64,
    /// Wall time measured, s.
    pub wall_s: f64,
}

/// Runs the reference workload for `dur` (one client/server pair per CPU).
pub fn measure(dur: Duration) -> io::Result<HostSpeed> {
    let pairs = (host_cpus() as usize).clamp(1, PAIRS_MAX);
    // The clients start together when every pair is connected, so the round trips
    // counted are those of the window.
    let go = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::with_capacity(pairs);
    let mut servers = Vec::with_capacity(pairs);
    for cpu in 0..pairs {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        servers.push(std::thread::spawn(move || {
            pin(cpu);
            serve(listener)
        }));
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        let (go, stop) = (go.clone(), stop.clone());
        clients.push(std::thread::spawn(move || {
            pin(cpu);
            while !go.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            ping(stream, &stop)
        }));
    }
    // Every pair is connected: the window starts now.
    let (t0, h0) = (Instant::now(), host_ns());
    go.store(true, Ordering::Release);
    std::thread::sleep(dur);
    let (h1, wall) = (host_ns(), t0.elapsed());
    stop.store(true, Ordering::Relaxed);
    let mut ops = 0;
    for c in clients {
        ops += c
            .join()
            .map_err(|_| io::Error::other("a reference client panicked"))??;
    }
    for s in servers {
        s.join()
            .map_err(|_| io::Error::other("a reference server panicked"))??;
    }
    // The clients count round trips until they see `stop`, a little past the window:
    // at most one each, within the tolerance of the ticks.
    if ops < OPS_MIN {
        return Err(io::Error::other(format!(
            "the reference workload completed {ops} round trips in {:.0} ms (fewer than {OPS_MIN})",
            wall.as_secs_f64() * 1e3
        )));
    }
    let busy = h1.busy.saturating_sub(h0.busy) as f64;
    let cpu_ns = wall.as_nanos() as f64 * pairs as f64;
    Ok(HostSpeed {
        busy_ns_per_op: busy / ops as f64,
        ops,
        steal_frac: h1.steal.saturating_sub(h0.steal) as f64 / cpu_ns.max(1.0),
        wall_s: wall.as_secs_f64(),
    })
}

/// Keeps the calling thread on `cpu`: both threads of a pair on one CPU, each pair on
/// its own, so every reading has the same placement (it did not narrow the spread of
/// 0.5 s readings here, 8.9–13.7 µs pinned against 8.6–13.4 unpinned: that spread is
/// the host's). A CPU the thread may not use leaves it unpinned.
fn pin(cpu: usize) {
    let _ = super::procs::pin_current_thread(&[cpu]);
}

/// One reading at the default length ([`REFERENCE_DEFAULT`]), busy ns per round trip,
/// for `what` is measured; a failure is reported on stderr and loses the figure only.
pub fn reading(what: &str) -> Option<f64> {
    match measure(REFERENCE_DEFAULT) {
        Ok(s) => Some(s.busy_ns_per_op),
        Err(e) => {
            eprintln!("{what}: the host speed reference failed: {e}");
            None
        }
    }
}

/// A client: request, answer, until `stop`; the round trips it completed.
fn ping(mut s: TcpStream, stop: &AtomicBool) -> io::Result<u64> {
    let req = [7u8; REQUEST_BYTES];
    let mut answer = vec![0u8; RESPONSE_BYTES];
    let mut ops = 0;
    while !stop.load(Ordering::Relaxed) {
        s.write_all(&req)?;
        s.read_exact(&mut answer)?;
        ops += 1;
    }
    s.shutdown(Shutdown::Write)?;
    Ok(ops)
}

/// A server: one connection, an answer per request, until the client closes.
fn serve(listener: TcpListener) -> io::Result<()> {
    let (mut s, _) = listener.accept()?;
    s.set_nodelay(true)?;
    let mut req = [0u8; REQUEST_BYTES];
    let answer = vec![1u8; RESPONSE_BYTES];
    loop {
        match s.read_exact(&mut req) {
            Ok(()) => s.write_all(&answer)?,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workload runs, counts round trips and reads a busy time per one within what
    /// a loopback round trip can cost (above 0, below the window itself).
    #[test]
    fn the_reference_workload_counts_round_trips_and_their_host_time() {
        let s = measure(Duration::from_millis(200)).unwrap();
        assert!(s.ops >= OPS_MIN, "{s:?}");
        assert!(s.busy_ns_per_op > 0.0, "{s:?}");
        assert!(
            s.busy_ns_per_op < s.wall_s * 1e9 * host_cpus(),
            "per op below all the CPUs' time: {s:?}"
        );
        assert!((0.0..=1.0).contains(&s.steal_frac), "{s:?}");
    }
}
