//! What one registration costs the server, per strategy and body size: the seed
//! paper's Table 1, measured as the server does it ([`crate::server`]) with each
//! sample's wall time and the calling thread's CPU time, so that time the thread
//! spent waiting for a CPU (wall − CPU) is told from the work itself.
//!
//! The timed step of a request, per [`Registration`]:
//!
//! - **dynamic**: register a region of the body's size, copy the body in, deregister
//!   (the region is allocated zeroed and faulted in by the copy: the software stack's
//!   stand-in for pinning and translation).
//! - **static**: copy the body into the connection's region, registered once (not
//!   timed) at the largest size.
//! - **cache**: a hit in the registration cache, the cached buffer registered
//!   read-only without a copy, deregistered (the first, missing, lookup is not timed).
//!
//! Reading the file is not timed: the back-end reads it for every request whatever
//! the strategy (and over TCP).
//!
//! Each step may start after a sleep (`gap`), as a server's worker starts a request
//! right after blocking on its socket: on a busy CPU a thread that just woke may wait
//! for the CPU before and while it registers, which a loop that never sleeps (and so
//! runs whole time slices) would not show.

use crate::caps::{Budget, Caps};
use crate::registration::{Cache, FileKey, Registration};
use farside_iwarp::verbs::{Access, Device, MR_BYTES_MAX};
use std::time::Instant;

/// Most samples of one measurement: bounds its time and its output.
pub const SAMPLES_MAX: usize = 10_000;

/// One timed registration step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// Wall time, ns.
    pub wall_ns: u64,
    /// CPU time of the calling thread, ns (user + system).
    pub cpu_ns: u64,
}

/// `samples` timed registration steps of `strategy` for a body of `size` bytes (see
/// the module doc), on the calling thread, each after sleeping `gap` (not timed).
pub fn measure(
    strategy: Registration,
    size: usize,
    samples: usize,
    gap: std::time::Duration,
) -> Result<Vec<Sample>, String> {
    if size == 0 || size > MR_BYTES_MAX {
        return Err(format!("size {size}: 1..={MR_BYTES_MAX}"));
    }
    if samples == 0 || samples > SAMPLES_MAX {
        return Err(format!("samples {samples}: 1..={SAMPLES_MAX}"));
    }
    let body: Vec<u8> = (0..size).map(|i| (i * 131 + 7) as u8).collect();
    let mut dev = Device::with_random_keys();
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let caps = Caps {
        transfer_bytes_max: size as u64,
        registered_bytes_max: (size as u64).max(1) * 2,
        ..Caps::default()
    };
    let budget = Budget::new(caps);
    let cache = Cache::default();
    let key = FileKey {
        dev: 1,
        ino: 1,
        size: size as u64,
        mtime_ns: 1,
    };
    let static_region = match strategy {
        Registration::Static => Some(
            dev.reg_mr(pd, 0, size, Access::REMOTE_READ)
                .map_err(|e| e.to_string())?,
        ),
        _ => None,
    };
    if strategy == Registration::Cache {
        // The miss that fills the cache.
        let _ = cache.get(&budget, key, &body);
    }
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
        let cpu0 = farside_rt::thread_cpu_ns();
        let t0 = Instant::now();
        match strategy {
            Registration::Dynamic => {
                let stag = dev
                    .reg_mr(pd, 0, size, Access::NONE)
                    .map_err(|e| e.to_string())?;
                dev.write(stag, 0, &body).map_err(|e| format!("{e:?}"))?;
                dev.dereg_mr(stag).map_err(|e| e.to_string())?;
            }
            Registration::Static => {
                let stag = static_region.expect("registered above");
                dev.write(stag, 0, &body).map_err(|e| format!("{e:?}"))?;
            }
            Registration::Cache => {
                let c = cache.get(&budget, key, &body);
                if !c.hit {
                    return Err("the registration cache missed a file it holds".into());
                }
                let stag = dev
                    .reg_shared(pd, 0, c.bytes, Access::NONE)
                    .map_err(|e| e.to_string())?;
                dev.dereg_mr(stag).map_err(|e| e.to_string())?;
            }
        }
        let wall_ns = t0.elapsed().as_nanos() as u64;
        let cpu_ns = farside_rt::thread_cpu_ns().saturating_sub(cpu0);
        out.push(Sample { wall_ns, cpu_ns });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_strategy_measures_and_bad_sizes_are_refused() {
        for s in [
            Registration::Dynamic,
            Registration::Static,
            Registration::Cache,
        ] {
            let v = measure(s, 4096, 3, std::time::Duration::from_micros(10)).unwrap();
            assert_eq!(v.len(), 3);
        }
        let z = std::time::Duration::ZERO;
        assert!(measure(Registration::Dynamic, 0, 1, z).is_err());
        assert!(measure(Registration::Dynamic, MR_BYTES_MAX + 1, 1, z).is_err());
        assert!(measure(Registration::Static, 16, 0, z).is_err());
    }
}
