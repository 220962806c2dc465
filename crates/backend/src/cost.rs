//! The back-end's CPU cost model: what a request costs follows what it serves.
//!
//! A static or generated file request burns, on top of the server's own real
//! work (parsing, `open`/`stat`, `read` from disk, `write` to the socket),
//!
//! ```text
//! emulated µs = cpu_us_per_request + cpu_ns_per_byte × body bytes / 1000
//! ```
//!
//! of *thread CPU time* before its response is written. Body bytes are the
//! bytes the response carries: 0 for HEAD, 304 and errors, so a conditional
//! GET that hits costs only the per-request part, as on a real server.
//!
//! # Defaults and the rule that sets them
//!
//! The defaults make the test server cost, per request and per byte, what
//! nginx (as the lab runs it: one worker, `sendfile on`, `access_log off`)
//! costs on the lab machine: `crates/backend/calibrate.sh` serves files of
//! 1 KiB to 1 MiB with nginx and with this server at zero emulated cost,
//! reads each server's CPU time (`/proc/<pid>/stat` utime + stime) around a
//! bounded `wrk` run per size, fits `CPU per request = a + b × bytes` for
//! both by least squares, and prints `max(0, a_nginx − a_self)` and
//! `max(0, b_nginx − b_self)`: the emulated part that brings this server's
//! total to nginx's.
//!
//! Measured 2026-11-23 on the lab machine (2 vCPU VM, three runs of 3 s per
//! size and server with `wrk -t1 -c4`, load average 2–6 from other
//! engineers' builds, so the ranges are wide):
//!
//! | server                     | a (µs/request) | b (ns/byte) |
//! |----------------------------|----------------|-------------|
//! | nginx 1 worker, sendfile   | 11.6 – 22.1    | 0.28 – 0.37 |
//! | farside-backend, no model  | 27.6 – 32.9    | 0.30 – 0.39 |
//!
//! (nginx ≈ 19–21 µs for 1–16 KiB and ≈ 310–400 µs for 1 MiB; this server
//! ≈ 30–41 µs and ≈ 350–440 µs.) This server's own work — a thread per
//! connection, `realpath`, `read` into a buffer, `writev` — already costs at
//! least nginx's per request, and as much per byte within the noise
//! (b_nginx − b_self = +0.06, +0.02, −0.11 ns/B), so the rule gives **0 µs and
//! 0 ns/B**: at its defaults the test server costs what it really does, which
//! is about what nginx costs, and that cost follows the bytes served (≈ 35 µs
//! for 16 KiB, ≈ 400 µs for 1 MiB). Re-run `calibrate.sh` on an idle machine
//! before quoting these figures.
//!
//! # Scaling: a back-end k times as costly as nginx
//!
//! A lab that wants the back-end tier to be the bottleneck (the paper's
//! testbed ran 2008 hardware, not bare loopback) should scale *both* parts,
//! so that traces of different sizes keep costing differently: for a total
//! of k × nginx, emulate k × nginx's cost minus this server's own. With the
//! mid-range figures (nginx ≈ 17 µs + 0.33 ns/B, this server ≈ 30 µs +
//! 0.35 ns/B): `--cpu-us-per-request ≈ k × 17 − 30` and
//! `--cpu-ns-per-byte ≈ k × 0.33 − 0.35`. For example k = 90 (1.5 ms for a
//! small file, the old fixed `--static-cpu-us 1500`):
//! `--cpu-us-per-request 1500 --cpu-ns-per-byte 29`, so a 16 KiB file costs
//! ≈ 2 ms and a 1 MiB file ≈ 32 ms.

use std::time::Duration;

use farside_rt::thread_cpu;

use crate::CPU_US_MAX;

/// Default emulated CPU per file request, µs: `max(0, a_nginx − a_self)`
/// measured by `calibrate.sh` (see the module doc's table): 0.
pub const CPU_US_PER_REQUEST_DEFAULT: u64 = 0;
/// Default emulated CPU per body byte served, ns: `max(0, b_nginx − b_self)`
/// measured by `calibrate.sh` (+0.06, +0.02, −0.11 ns/B: noise around 0): 0.
pub const CPU_NS_PER_BYTE_DEFAULT: f64 = 0.0;
/// Upper bound of `--cpu-ns-per-byte`: 1 µs per byte makes a 1 MiB file cost
/// a second of CPU, far beyond any server's real per-byte cost.
pub const CPU_NS_PER_BYTE_MAX: f64 = 1000.0;

/// Per-request plus per-byte CPU cost of file requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Emulated CPU per file request, µs.
    pub cpu_us_per_request: u64,
    /// Emulated CPU per body byte served, ns (fractions allowed: nginx's is
    /// about 0.4).
    pub cpu_ns_per_byte: f64,
}

impl CostModel {
    /// Emulated CPU for a response carrying `body_bytes`, µs, capped at
    /// [`CPU_US_MAX`].
    pub fn emulated_us(&self, body_bytes: u64) -> u64 {
        self.emulated(body_bytes).as_micros() as u64
    }

    /// Emulated CPU for a response carrying `body_bytes`, capped at
    /// [`CPU_US_MAX`] µs.
    pub fn emulated(&self, body_bytes: u64) -> Duration {
        // Float-to-int `as` saturates; the model's flags are validated finite.
        let per_byte_ns = (self.cpu_ns_per_byte * body_bytes as f64) as u64;
        let total_ns = self
            .cpu_us_per_request
            .saturating_mul(1000)
            .saturating_add(per_byte_ns);
        Duration::from_nanos(total_ns.min(CPU_US_MAX * 1000))
    }
}

/// Busy-loops until this thread has consumed `us` µs of CPU time (so the cost
/// is real CPU, and a descheduled worker keeps owing it).
pub(crate) fn burn_cpu_us(us: u64) {
    burn_cpu(Duration::from_micros(us));
}

/// Busy-loops until this thread has consumed `cpu` more CPU time.
pub(crate) fn burn_cpu(cpu: Duration) {
    if cpu.is_zero() {
        return;
    }
    let until = thread_cpu() + cpu;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while thread_cpu() < until {
        // ~0.3 µs of work between clock reads: overshoot stays well under 1 µs.
        for _ in 0..256 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
        }
        std::hint::black_box(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emulated_cost_is_per_request_plus_per_byte_and_capped() {
        let m = CostModel {
            cpu_us_per_request: 50,
            cpu_ns_per_byte: 2.0,
        };
        assert_eq!(m.emulated_us(0), 50);
        assert_eq!(m.emulated_us(16 * 1024), 50 + 32);
        assert_eq!(m.emulated_us(u64::MAX), CPU_US_MAX);
        let nginx_like = CostModel {
            cpu_us_per_request: 0,
            cpu_ns_per_byte: 0.37,
        };
        assert_eq!(nginx_like.emulated(1 << 20), Duration::from_nanos(387_973));
    }

    #[test]
    fn burn_consumes_thread_cpu_time() {
        let t0 = farside_rt::thread_cpu_us();
        burn_cpu_us(5000);
        assert!(farside_rt::thread_cpu_us() - t0 >= 5000);
    }
}
