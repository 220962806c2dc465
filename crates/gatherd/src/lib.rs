//! `farside gatherd`: runs on every back-end node, samples its load every period
//! (default 1 ms) and publishes the node's region, where front-ends read it one-sidedly
//! (shm on the same host, the XDP responder across hosts) or ask for it two-sidedly
//! (the tcp baseline).
//!
//! One memory: a node has exactly one region, whatever the transports. Where BPF is
//! available (XDP attached or not: the kernel sampler needs the map, not XDP) it is the
//! BPF region map, which the kernel sampler writes and XDP answers from: the record is
//! published into the map's mapping, the tcp server and the user-space udp fallback
//! serve that mapping, and the shm path becomes a Unix socket handing readers the map's
//! fd (`farside_rmem::fdshare`), so a CAS over udp is seen over tcp and shm at once and
//! the other way round. Without BPF (no privilege, `--sampler user` or `--cgroup`
//! without XDP) it is the shm file (`--shm`) or, with `--no-shm`, heap memory. The tcp and udp servers
//! share one duplicate-detection table (`farside_rmem::Dedup`). Datagram mutations
//! have one table at a time: user space's until the XDP program attaches, then the
//! program's map, seeded with user space's entries at the hand-over (see
//! `xdp::attach_xdp`), so a retry answered across the attach is never applied twice.
//!
//! Modules, by concern:
//!
//! - [`args`]: the command line ([`GatherdArgs`]) and its validation.
//! - [`sample`]: reading the node's counters (/proc, cgroup, PSI).
//! - [`sampler`]: turning them into load records, within a CPU budget ([`Sampler`]).
//! - [`daemon`]: start-up, the publishing loop and the servers ([`Gatherd`]).
//! - [`xdp`]: the BPF object (the XDP responder's maps and attach, the kernel
//!   sampler), interfaces.
//! - [`metrics`]: gatherd's counters ([`GatherStats`]) and Prometheus endpoint.
//! - [`role`]: the node agent of co-hosted sites (`--role-*`).
//! - [`trust`]: keys and replay windows over time: the replay state across restarts
//!   (`--replay-state`), key reloads on SIGHUP (`--rmem-key-dir`).

pub mod args;
pub mod daemon;
pub mod metrics;
pub mod role;
pub mod sample;
pub mod sampler;
#[cfg(test)]
mod testutil;
pub mod trust;
pub mod xdp;

pub use args::{GatherdArgs, SamplerChoice, XdpChoice, PERIOD_US_MIN, WATCHED_PORTS_MAX};
pub use daemon::{process_cpu_us, Gatherd};
pub use metrics::{render_metrics, GatherStats, LONG_GAP};
pub use sampler::{FieldCost, Sampler, CPU_READ_INTERVAL_US, FIELD_COST_EVERY};
