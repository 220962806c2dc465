//! HTTP/1.1 reverse proxy with one-sided admission control and load-aware balancing.
//!
//! - [`gate`]: the contract between the data path and the control layer, with its
//!   typed rejections ([`reject`])
//! - [`config`]: the typed configuration (TOML and flags)
//! - [`control`]: monitor table, admission policy, balancing; [`sites`]: routing by site
//! - [`server`]: the HTTP/1.1 data path (runtime and workers, one client connection's
//!   life), with [`http`] (heads and framing), [`pool`] (upstream keep-alive) and
//!   [`metrics`]
//! - [`reconf`]: the reconfiguration driver, run beside the data path
//! - [`dashboard`]: the live page on the admin listener (`GET /`, `GET /events`)
//! - [`lifecycle`]: graceful drain (SIGTERM) and live reload (SIGHUP)
//! - [`daemon`]: `farside proxy` and `farside monitor` as processes
//!
//! Modules depend only on those before them, in this order (bottom to top; a module's
//! own children in brackets, in their order):
//!
//! `reject`, `http`, `metrics`, `pool`, `gate`, `config` (`file`, `sites`, `reconf`,
//! `cli`), `sites`, `control` (`rules`, `estimate`, `delay`, `render`), `reconf`,
//! `lifecycle`, `dashboard`, `server` (`generation`, `transfer`, `conn`, `runtime`),
//! `daemon`.
//!
//! Within a tree, the children also use their root's shared types (`config`'s
//! `ConfigError` and `ProxyConfig`, `control`'s `Control`): a tree is one unit.

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
