//! The HTTP/1.1 data path, in the order its parts depend on each other:
//!
//! - [`generation`]: what an exchange needs (configuration, control layer, upstream
//!   pool), swapped whole by a reload
//! - [`transfer`]: read buffers, body framing progress, body deadlines, bounded writes
//! - [`conn`]: one client connection's life, with the diagram of a request's life and
//!   the timeout of every wait
//! - [`runtime`]: listeners, workers and their runtimes, the accept loop, start, reload,
//!   drain and stop; its entry points are re-exported here
//!
//! The data path starts nothing beside itself: the reconfiguration driver is started
//! next to it by the process ([`crate::daemon`]), which hands [`start_with`] the
//! metrics to add to the admin scrape.

pub mod conn;
pub mod generation;
pub mod runtime;
pub mod transfer;

pub use runtime::{
    build_runtime, run, run_with_reload, serve, spawn, start, start_with, Running, Spawned,
};
