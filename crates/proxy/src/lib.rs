//! HTTP/1.1 reverse proxy with one-sided admission control and load-aware balancing.
//!
//! - [`gate`]: the contract between the data path and the control layer, with its
//!   typed rejections ([`reject`])
//! - [`config`]: the typed configuration (TOML and flags)
//! - [`control`]: monitor table, admission policy, balancing (by load, or by content:
//!   [`control::content`]); [`sites`]: routing by site
//! - [`server`]: the HTTP/1.1 data path (runtime and workers, one client connection's
//!   life), with [`http`] (heads and framing), [`pool`] (upstream keep-alive) and
//!   [`metrics`]
//! - [`reconf`]: the reconfiguration driver, run beside the data path
//! - [`dashboard`]: the live page on the admin listener (`GET /`, `GET /events`)
//! - [`lifecycle`]: graceful drain (SIGTERM) and live reload (SIGHUP)
//! - [`daemon`]: `farside proxy` and `farside monitor` as processes
//!
//! Modules (files) use only those before them, in this order from the bottom up, so
//! no two use each other, directly or through others (test modules aside):
//!
//! `reject`, `http`, `metrics`, `pool`, `gate`, `control::content`, `config::error`, `config::sites`,
//! `config::reconf`, `config`, `config::file`, `config::cli`, `sites`, `control::rules`,
//! `control::estimate`, `control::delay`, `control`, `control::render`, `reconf`,
//! `lifecycle`, `dashboard`, `server::generation`, `server::transfer`, `server::conn`,
//! `server::runtime`, `server`, `daemon`.

pub mod config;
pub mod control;
pub mod daemon;
pub mod dashboard;
pub mod gate;
pub mod http;
pub mod lifecycle;
pub mod metrics;
pub mod pool;
pub mod reconf;
pub mod reject;
pub mod server;
pub mod sites;

pub use config::cli::{check_config, MonitorArgs, ProxyArgs};
pub use daemon::{run, run_monitor};
