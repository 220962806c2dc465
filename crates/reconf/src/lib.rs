//! Reconfiguration of nodes between co-hosted sites (seed 001): the protocol
//! as pure state machines with I/O at the edges, and a seeded simulator.
//!
//! - [`words`]: the control words (role wanted / served / error, site lock, balancer
//!   counters) inside the region's writable words 32..64, and their encodings.
//! - [`op`]: the remote ops a machine asks for (READ, WRITE, CAS, FETCH-ADD on u64
//!   words, as `farside_rmem::RemoteMemory`) and their completions, lost ones included.
//! - [`balancer`]: the paper's load-balancer-based design (history window T,
//!   sensitivity S, site lock, node CAS, dual update counters) plus fenced, leased
//!   locks that survive a crashed or partitioned balancer.
//! - [`agent`]: the node side: apply the wanted role to the web server, publish the
//!   served role, keep the old one if the apply fails.
//! - [`drive`]: one balancer round over real remote memory (`farside_rmem`).
//! - [`sites`]: the site protocol: how the agent's node tells its local web server
//!   which co-hosted site to serve (names, request and reply lines, the client).
//! - [`sim`]: drives the same code over a lossy, reordering, duplicating network with
//!   crashes and partitions, checking the invariants after every event.
//!
//! The protocol and its failure cases are described in the [`balancer`] module and in
//! `docs/reconf.md`.

pub mod agent;
pub mod balancer;
pub mod drive;
pub mod op;
pub mod sim;
pub mod sites;
pub mod words;

pub use agent::{AgentAction, Applied, NodeAgent};
pub use balancer::{
    Balancer, BalancerConfig, BalancerStats, ConfigError, Ctx, MoveRecord, Topology,
};
pub use op::{Completion, Issue, Op, OpId, Target};
pub use words::{Lock, Role};
