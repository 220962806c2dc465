//! Speculative connection admission (seed 002, issue 12 items 2–3).
//!
//! - [`window`]: the paper's admission window (§3.2) as a pure state machine: which
//!   arriving connection goes to the local server, which is admitted speculatively
//!   (migratory) and which is refused; closing on a refusal, reopening on the target's
//!   notification or after N locally served requests.
//! - [`target`]: the target side of `farside specd`: admits offers by the local
//!   server's accept queue, restores, hands over ([`handoff`]: fd passing to
//!   `farside backend --adopt-socket`, or a relay to unmodified nginx), notifies
//!   refused sources ([`notify`]) when it can take again.
//! - [`load`]: the local server's accept-queue length (sock_diag).
//! - [`stats`]: bounded per-migration samples.

pub mod handoff;
pub mod load;
pub mod notify;
pub mod stats;
pub mod target;
pub mod window;
