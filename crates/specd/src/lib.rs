//! Speculative connection admission (seed 002).
//!
//! - [`window`]: the paper's admission window (§3.2) as a pure state machine: which
//!   arriving connection goes to the local server, which is admitted speculatively
//!   (migratory) and which is refused; closing on a refusal, reopening on the target's
//!   notification or after N locally served requests.
//! - [`target`]: the target side of `farside specd`: admits offers by the local
//!   server's accept queue, restores, hands over ([`handoff`]: fd passing to
//!   `farside backend --adopt-socket`, or a relay to unmodified nginx), notifies
//!   refused sources ([`notify`]) when it can take again.
//! - [`load`]: the local server's accept-queue length (sock_diag) and its listener
//!   (taken from its owner for the kernel steering mode).
//! - [`source`] (peers: [`peer`]): the source side: steered connections accepted on the admission
//!   listener, migrated to the least-loaded peer (regions read one-sidedly), falling
//!   back to the local server; [`steer`]: the sk_lookup program (`bpf/steer.bpf.c`)
//!   (kernel mode: it reads the server's queue per SYN; poll mode: a flag the daemon
//!   polls) and the front-end flow hook ([`steer::FlowSteer`]).
//! - [`stats`]: bounded per-migration samples; [`trace`]: the per-connection trace
//!   (`--conn-trace`).
//! - [`summary`]: the JSON the daemon writes (the exit summary and its parts), as
//!   serde structs.
//! - [`cli`]: `farside specd`.
//!
//! Deployment and flags: `docs/speculative.md`.

pub mod cli;
pub mod handoff;
pub mod load;
pub mod notify;
pub mod peer;
pub mod source;
pub mod stats;
pub mod steer;
pub mod summary;
pub mod target;
pub mod trace;
pub mod window;

pub use cli::{run, SpecdArgs};
