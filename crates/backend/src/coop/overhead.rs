//! The per-message processor overhead ablation (`--coop-message-overhead-us N`): an
//! experiment knob that **adds** cost, never a tuning. It sets how much CPU each peer
//! message costs, the axis along which PRESS's authors found user-level communication
//! gaining over TCP ("low processor overhead" being one of its three factors).
//!
//! Every peer message a node handles first spins N µs of CPU on the thread that
//! handles it (a busy loop on the monotonic clock, not a sleep: the overhead studied is
//! processor time):
//!
//! ```text
//!  directory update    sent (once per peer per publication), received (each datagram)
//!  fetch request       sent (each attempt), received (tcp frame / udp datagram)
//!  fetch reply         sent, received (tcp: one frame; udp: each piece datagram)
//!  one-sided (xdp)     each READ the initial node issues for a body: the index probe's
//!                      READs before the lookup, the body's READs (resends included) as
//!                      the reader counted them; the service node runs nothing
//!  one-sided (shm)     each read of the mapped arena: a probe window range, a chunk
//! ```
//!
//! 0 (the default) costs nothing: no clock is read and no spin counted. Each spin is
//! counted (`overhead_spins` in `/coop/stats`), so a run proves the knob applied.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Largest `--coop-message-overhead-us`: 1 ms per message is ~20x the whole CPU a
/// request costs a node here (~60 µs), far past where throughput has collapsed; the
/// bound keeps a typo from stalling every peer thread for seconds per message.
pub const COOP_MESSAGE_OVERHEAD_US_MAX: u64 = 1_000;

/// The knob and its count of spins.
#[derive(Debug, Default)]
pub struct Overhead {
    per_message: Duration,
    /// Messages that paid the overhead (`overhead_spins`).
    pub spins: AtomicU64,
}

impl Overhead {
    /// `us` µs of CPU per message (checked against [`COOP_MESSAGE_OVERHEAD_US_MAX`] by
    /// the flag's validation).
    pub fn new(us: u64) -> Overhead {
        Overhead {
            per_message: Duration::from_micros(us),
            spins: AtomicU64::new(0),
        }
    }

    /// The overhead per message, µs.
    pub fn per_message_us(&self) -> u64 {
        self.per_message.as_micros() as u64
    }

    /// Pays the overhead of `messages` messages on this thread: a busy loop until the
    /// monotonic clock has moved `messages` × N µs on. Nothing at all when N is 0.
    pub fn spin(&self, messages: u64) {
        if self.per_message.is_zero() || messages == 0 {
            return;
        }
        let total = self
            .per_message
            .saturating_mul(u32::try_from(messages).unwrap_or(u32::MAX));
        let until = Instant::now() + total;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        self.spins.fetch_add(messages, Ordering::Relaxed);
    }

    /// Messages that paid the overhead so far.
    pub fn spins(&self) -> u64 {
        self.spins.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spin_takes_its_time_and_is_counted() {
        let o = Overhead::new(200);
        assert_eq!(o.per_message_us(), 200);
        let started = Instant::now();
        o.spin(3);
        // A lower bound only: the loop cannot end before the clock passed 3 x 200 µs.
        assert!(started.elapsed() >= Duration::from_micros(600));
        assert_eq!(o.spins(), 3);
        o.spin(0);
        assert_eq!(o.spins(), 3, "no message, no spin");
    }

    #[test]
    fn zero_costs_nothing_and_counts_nothing() {
        let o = Overhead::new(0);
        for _ in 0..1000 {
            o.spin(5);
        }
        assert_eq!(o.spins(), 0);
        assert_eq!(Overhead::default().spins(), 0);
    }
}
