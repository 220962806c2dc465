//! HTTP/1.1 reverse proxy with one-sided admission control and load-aware balancing.
//!
//! - [`gate`]: the contract between the data path and the control layer
//! - [`config`]: the typed configuration (TOML and flags)
//! - [`control`]: monitor table, admission policy, balancing
//! - [`server`]: the HTTP/1.1 data path (accept loop, connections, runtime), with
//!   [`http`] (heads and framing), [`pool`] (upstream keep-alive) and [`metrics`]
//! - [`dashboard`]: the live page on the admin listener (`GET /`, `GET /events`)
//! - [`lifecycle`]: graceful drain (SIGTERM) and live reload (SIGHUP)

pub mod config;
pub mod control;
pub mod dashboard;
pub mod gate;
pub mod http;
pub mod lifecycle;
pub mod metrics;
pub mod pool;
pub mod reconf;
pub mod server;
pub mod sites;
