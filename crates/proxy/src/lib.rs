//! HTTP/1.1 reverse proxy with one-sided admission control and load-aware balancing.
//!
//! - [`gate`]: the contract between the data path and the control layer
//! - [`config`]: the typed configuration (TOML and flags)
//! - [`control`]: monitor table, admission policy, balancing

pub mod config;
pub mod control;
pub mod gate;
