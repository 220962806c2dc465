//! Cooperative caching across a cluster's nodes: which node answers a request and where
//! the body comes from (its own cache, a peer's cache read one-sidedly, or disk), and a
//! model that predicts the cluster's throughput from costs and hit fractions.
//!
//! - [`cache`]: a node's byte-bounded cache of object ids (LRU or GreedyDual-Size);
//! - [`directory`]: the Bloom filter a node publishes of what it caches, with its epoch;
//! - [`policy`]: PRESS, LARD, bounded-load consistent hashing and round-robin as pure
//!   decisions;
//! - [`sim`]: a seeded discrete-event simulator of nodes with CPU, disk and NIC queues,
//!   driven by a trace ([`trace`]), that checks the invariants and reports fractions,
//!   throughput and utilisations;
//! - [`model`]: exact mean-value analysis of a closed queueing network, fed by service
//!   demands and the simulator's fractions;
//! - [`synth`]: synthetic traces in the sample's format, fitted to published statistics
//!   of classic web traces;
//! - [`validate`]: the model against kept lab runs (measured costs, PASS/FAIL within the
//!   tolerance fixed in advance), then the labelled extrapolation.
//!
//! The bodies themselves live in the object arena (`farside-arena`).

pub mod cache;
pub mod directory;
pub mod fill;
pub mod model;
pub mod policy;
pub mod sim;
pub mod synth;
pub mod trace;
pub mod validate;
