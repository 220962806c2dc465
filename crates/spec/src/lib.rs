//! Speculative connection admission (seed 002, issue 12 items 2–3).
//!
//! - [`window`]: the paper's admission window (§3.2) as a pure state machine: which
//!   arriving connection goes to the local server, which is admitted speculatively
//!   (migratory) and which is refused; closing on a refusal, reopening on the target's
//!   notification or after N locally served requests.

pub mod window;
