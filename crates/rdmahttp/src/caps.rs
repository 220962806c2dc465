//! The server's limits on RDMA transfers, and the budget that enforces them.
//!
//! The `RDMA:` header makes the server open a connection to, and write into, an
//! address the client chose. So: the address must be the HTTP peer's own (checked by
//! the server, [`crate::server`]); one transfer moves at most `transfer_bytes_max`;
//! at most `transfers_max` run at once; and the bytes registered for them together
//! stay under `registered_bytes_max` (the memlock budget an RNIC would pin). A
//! transfer holds an [`Admission`] while it runs; dropping it gives its share back.

use crate::header::Decline;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Default largest transfer: 16 MiB, a quarter of the stack's largest region
/// ([`farside_iwarp::verbs::MR_BYTES_MAX`]).
pub const TRANSFER_BYTES_MAX_DEFAULT: u64 = 16 << 20;
/// Default transfers at once: one per worker of a default back-end (8 workers).
pub const TRANSFERS_MAX_DEFAULT: usize = 8;
/// Default registered bytes: 64 MiB, Linux's default `RLIMIT_MEMLOCK` order (8 MiB
/// unprivileged, more with CAP_IPC_LOCK) scaled to a few large transfers at once.
pub const REGISTERED_BYTES_MAX_DEFAULT: u64 = 64 << 20;
/// Default time to open the TCP connection to the client's RDMA listener, and again
/// for the MPA set-up on it: a LAN peer answers in well under a millisecond, a loaded
/// one in seconds (the seed paper saw up to 3 s); longer, and the body goes over TCP
/// instead.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_millis(1000);
/// Default time a transfer may take once connected: the Write and Send handed to TCP
/// (server-writes), or the client's done (client-reads; the region is released then).
pub const TRANSFER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// The limits. See the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub transfer_bytes_max: u64,
    pub transfers_max: usize,
    pub registered_bytes_max: u64,
    pub connect_timeout: Duration,
    pub transfer_timeout: Duration,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            transfer_bytes_max: TRANSFER_BYTES_MAX_DEFAULT,
            transfers_max: TRANSFERS_MAX_DEFAULT,
            registered_bytes_max: REGISTERED_BYTES_MAX_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            transfer_timeout: TRANSFER_TIMEOUT_DEFAULT,
        }
    }
}

impl Caps {
    /// Checks every bound; the message names the offending flag.
    pub fn validate(&self) -> Result<(), String> {
        let mr_max = farside_iwarp::verbs::MR_BYTES_MAX as u64;
        if self.transfer_bytes_max == 0 || self.transfer_bytes_max > mr_max {
            return Err(format!("--rdma-transfer-bytes-max must be in 1..={mr_max}"));
        }
        if self.transfers_max == 0 {
            return Err("--rdma-transfers-max must be at least 1".into());
        }
        if self.registered_bytes_max < self.transfer_bytes_max {
            return Err(
                "--rdma-registered-bytes-max must be at least --rdma-transfer-bytes-max".into(),
            );
        }
        if self.connect_timeout.is_zero() || self.transfer_timeout.is_zero() {
            return Err(
                "--rdma-connect-timeout-ms and --rdma-transfer-timeout-ms must be at least 1"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Bytes registered beyond one transfer (a connection's static buffer, a cached
/// file), held against the registered-bytes budget until dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget
            .registered_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Transfers running and bytes registered, against [`Caps`]. Shared by the workers.
#[derive(Debug)]
pub struct Budget {
    caps: Caps,
    transfers: AtomicUsize,
    registered_bytes: AtomicU64,
}

/// One transfer's share of the [`Budget`]; given back on drop.
#[derive(Debug)]
pub struct Admission {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    pub fn new(caps: Caps) -> Arc<Budget> {
        Arc::new(Budget {
            caps,
            transfers: AtomicUsize::new(0),
            registered_bytes: AtomicU64::new(0),
        })
    }

    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    /// A transfer of `bytes`: refused as [`Decline::TooLarge`] beyond the transfer cap,
    /// [`Decline::Busy`] when the transfers or registered bytes would exceed theirs.
    pub fn admit(self: &Arc<Budget>, bytes: u64) -> Result<Admission, Decline> {
        if bytes > self.caps.transfer_bytes_max {
            return Err(Decline::TooLarge);
        }
        let ok = self
            .transfers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.caps.transfers_max).then_some(n + 1)
            });
        if ok.is_err() {
            return Err(Decline::Busy);
        }
        let ok = self
            .registered_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(bytes)
                    .filter(|&m| m <= self.caps.registered_bytes_max)
            });
        if ok.is_err() {
            self.transfers.fetch_sub(1, Ordering::AcqRel);
            return Err(Decline::Busy);
        }
        Ok(Admission {
            budget: Arc::clone(self),
            bytes,
        })
    }

    /// `bytes` of the registered-bytes budget, for longer than one transfer; `None`
    /// when they do not fit.
    pub fn reserve(self: &Arc<Budget>, bytes: u64) -> Option<Reservation> {
        self.registered_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(bytes)
                    .filter(|&m| m <= self.caps.registered_bytes_max)
            })
            .ok()?;
        Some(Reservation {
            budget: Arc::clone(self),
            bytes,
        })
    }

    /// Transfers running now.
    pub fn transfers(&self) -> usize {
        self.transfers.load(Ordering::Acquire)
    }

    /// Bytes registered for transfers now.
    pub fn registered_bytes(&self) -> u64 {
        self.registered_bytes.load(Ordering::Acquire)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.budget
            .registered_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
        self.budget.transfers.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(transfers_max: usize, registered_bytes_max: u64) -> Caps {
        Caps {
            transfer_bytes_max: 100,
            transfers_max,
            registered_bytes_max,
            ..Caps::default()
        }
    }

    #[test]
    fn caps_transfer_size_concurrency_and_registered_bytes() {
        let b = Budget::new(caps(2, 150));
        assert_eq!(b.admit(101).unwrap_err(), Decline::TooLarge);
        let a1 = b.admit(100).unwrap();
        assert_eq!(b.admit(60).unwrap_err(), Decline::Busy, "bytes over budget");
        let a2 = b.admit(50).unwrap();
        assert_eq!(b.admit(0).unwrap_err(), Decline::Busy, "transfers at cap");
        assert_eq!((b.transfers(), b.registered_bytes()), (2, 150));
        drop(a1);
        let a3 = b.admit(100).unwrap();
        drop((a2, a3));
        assert_eq!((b.transfers(), b.registered_bytes()), (0, 0));
    }

    #[test]
    fn a_refused_admission_takes_nothing() {
        let b = Budget::new(caps(4, 100));
        let _a = b.admit(90).unwrap();
        for _ in 0..10 {
            assert!(b.admit(20).is_err());
        }
        assert_eq!((b.transfers(), b.registered_bytes()), (1, 90));
    }

    #[test]
    fn validate_names_the_flag() {
        assert!(Caps::default().validate().is_ok());
        let bad = Caps {
            registered_bytes_max: 1,
            ..Caps::default()
        };
        assert!(bad.validate().unwrap_err().contains("registered-bytes"));
    }
}
