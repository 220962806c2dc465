//! The emulated disk of a cooperating node: every read of a file not cached anywhere
//! costs `latency + bytes / bandwidth`, one read at a time (one disk arm), on top of the
//! real `read` (which the page cache answers on the lab machine, so without this a miss
//! would cost almost nothing and cooperation could not pay).

use std::io::{self, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Default latency per read, µs. Rule: a 7,200 rpm disk's mean rotational delay (4.2
/// ms) plus a short seek, rounded to 5 ms: the disks of the PRESS paper's cluster.
pub const DISK_LATENCY_US_DEFAULT: u64 = 5_000;
/// Largest latency accepted, µs: one second per read is already no disk.
pub const DISK_LATENCY_US_MAX: u64 = 1_000_000;
/// Default bandwidth, bytes/s. Rule: 40 MB/s, the sequential rate of such a disk.
pub const DISK_BYTES_PER_S_DEFAULT: u64 = 40_000_000;
/// Default `--coop-disk-queue-max`: reads queued on the disk before a new read is
/// refused (503). Rule: 16 reads are ~90 ms of the default disk's service (5 ms + a
/// mean 17 KB at 40 MB/s each), enough that the disk never idles while requests wait,
/// and a quarter of the lab's 64 workers, leaving the rest for hits. A node with the
/// default 8 workers never reaches it.
pub const DISK_QUEUE_MAX_DEFAULT: u64 = 16;
/// Largest `--coop-disk-queue-max`: `--workers`' own bound (`WORKERS_MAX`).
pub const DISK_QUEUE_MAX_MAX: u64 = 4096;
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
    /// What the disk did (`disk_*` in `/coop/stats`).
    pub counts: DiskCounts,
}

/// What the emulated disk counts: its utilisation and its queue, read as `disk_*` lines
/// of `/coop/stats` (see [`DiskCounts::text`]).
#[derive(Debug, Default)]
pub struct DiskCounts {
    /// Reads waiting for the arm or in service now.
    pub queue: AtomicU64,
    /// The largest `queue` seen.
    pub queue_max: AtomicU64,
    /// Reads served.
    pub reads: AtomicU64,
    /// Time the arm was held (the emulated service time plus the real read), µs: over a
    /// window, busy / window is the disk's utilisation.
    pub busy_us: AtomicU64,
    /// Time reads waited for the arm before their service began, µs: over a window,
    /// wait / reads is the mean queueing delay.
    pub wait_us: AtomicU64,
}

impl DiskCounts {
    /// `name value` lines.
    pub fn text(&self) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "disk_reads {}\ndisk_busy_us {}\ndisk_wait_us {}\ndisk_queue {}\ndisk_queue_max {}\n",
            g(&self.reads),
            g(&self.busy_us),
            g(&self.wait_us),
            g(&self.queue),
            g(&self.queue_max)
        )
    }
}

/// Counts one read in the queue while alive.
struct Queued<'a>(&'a DiskCounts);

impl<'a> Queued<'a> {
    fn enter(c: &'a DiskCounts) -> Queued<'a> {
        let q = c.queue.fetch_add(1, Ordering::Relaxed) + 1;
        c.queue_max.fetch_max(q, Ordering::Relaxed);
        Queued(c)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queue.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Disk {
    pub fn new(latency_us: u64, bytes_per_s: u64) -> Disk {
        Disk {
            latency_us,
            bytes_per_s: bytes_per_s.max(1),
            arm: Mutex::new(()),
            counts: DiskCounts::default(),
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
        let _queued = Queued::enter(&self.counts);
        let asked = Instant::now();
        let _arm = self.arm.lock().unwrap_or_else(|p| p.into_inner());
        let started = Instant::now();
        let us = |d: Duration| d.as_micros().min(u128::from(u64::MAX)) as u64;
        self.counts
            .wait_us
            .fetch_add(us(started - asked), Ordering::Relaxed);
        let result = self.read_locked(path);
        self.counts
            .busy_us
            .fetch_add(us(started.elapsed()), Ordering::Relaxed);
        self.counts.reads.fetch_add(1, Ordering::Relaxed);
        result
    }

    fn read_locked(&self, path: &Path) -> io::Result<Vec<u8>> {
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

    #[test]
    fn a_read_is_counted_with_its_service_time_and_leaves_the_queue() {
        let dir = std::env::temp_dir().join(format!("farside-coop-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a");
        std::fs::write(&f, vec![7u8; 4_000]).unwrap();
        let d = Disk::new(1_000, 40_000_000);
        assert_eq!(d.read(&f).unwrap().len(), 4_000);
        let c = &d.counts;
        assert_eq!(c.reads.load(Ordering::Relaxed), 1);
        assert!(
            c.busy_us.load(Ordering::Relaxed) >= 1_100,
            "at least the service time"
        );
        assert_eq!(c.queue.load(Ordering::Relaxed), 0);
        assert_eq!(c.queue_max.load(Ordering::Relaxed), 1);
        assert!(d.counts.text().contains("disk_reads 1\n"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
