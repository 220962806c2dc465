//! The emulated disk of a cooperating node: every read of a file not cached anywhere
//! costs `latency + bytes / bandwidth`, one read at a time (one disk arm), on top of the
//! real `read` (which the page cache answers on the lab machine, so without this a miss
//! would cost almost nothing and cooperation could not pay).

use std::io::{self, Read};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// Default latency per read, µs. Rule: a 7,200 rpm disk's mean rotational delay (4.2
/// ms) plus a short seek, rounded to 5 ms: the disks of the PRESS paper's cluster.
pub const DISK_LATENCY_US_DEFAULT: u64 = 5_000;
/// Largest latency accepted, µs: one second per read is already no disk.
pub const DISK_LATENCY_US_MAX: u64 = 1_000_000;
/// Default bandwidth, bytes/s. Rule: 40 MB/s, the sequential rate of such a disk.
pub const DISK_BYTES_PER_S_DEFAULT: u64 = 40_000_000;
/// Largest file the disk reads: 64 MiB bounds one read's memory (the World Cup sample's
/// largest object is 2.9 MB).
pub const DISK_FILE_BYTES_MAX: u64 = 64 << 20;

/// The emulated disk.
#[derive(Debug)]
pub struct Disk {
    latency_us: u64,
    bytes_per_s: u64,
    /// Held for the whole read: reads queue as on one disk.
    arm: Mutex<()>,
}

impl Disk {
    pub fn new(latency_us: u64, bytes_per_s: u64) -> Disk {
        Disk {
            latency_us,
            bytes_per_s: bytes_per_s.max(1),
            arm: Mutex::new(()),
        }
    }

    /// The service time of one read of `bytes`.
    pub fn service_time(&self, bytes: u64) -> Duration {
        let transfer_ns = (u128::from(bytes) * 1_000_000_000 / u128::from(self.bytes_per_s))
            .min(u128::from(u64::MAX)) as u64;
        Duration::from_micros(self.latency_us) + Duration::from_nanos(transfer_ns)
    }

    /// Reads the whole file at `path` (a regular file of at most [`DISK_FILE_BYTES_MAX`])
    /// taking the emulated service time, after the reads queued before it.
    pub fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let _arm = self.arm.lock().unwrap_or_else(|p| p.into_inner());
        let mut file = std::fs::File::open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "not a file"));
        }
        if meta.len() > DISK_FILE_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "larger than DISK_FILE_BYTES_MAX",
            ));
        }
        let mut body = Vec::with_capacity(meta.len() as usize);
        file.by_ref()
            .take(DISK_FILE_BYTES_MAX)
            .read_to_end(&mut body)?;
        std::thread::sleep(self.service_time(body.len() as u64));
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_time_is_latency_plus_transfer() {
        let d = Disk::new(5_000, 40_000_000);
        assert_eq!(d.service_time(0), Duration::from_millis(5));
        assert_eq!(d.service_time(40_000_000), Duration::from_millis(1005));
        assert_eq!(d.service_time(4_000), Duration::from_micros(5_100));
    }
}
