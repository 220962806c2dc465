//! Flag values every experiment shares: where the nodes run ([`Hosts`]) and which load
//! models a sweep measures ([`LoadModels`]).

/// Where the nodes of a run live (`--hosts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hosts {
    /// Processes on 127.0.0.1 ports; no privileges needed.
    Loopback,
    /// One network namespace per node (root).
    Netns,
}

impl Hosts {
    /// The flag's value, as `summary.json`'s `hosts` records it.
    pub fn as_str(self) -> &'static str {
        match self {
            Hosts::Loopback => "loopback",
            Hosts::Netns => "netns",
        }
    }
}

/// Load models of a sweep (`--load`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadModels {
    /// Closed loop only: `--clients` users.
    Closed,
    /// Open loop only: Poisson arrivals at `--rates` x capacity.
    Open,
    /// Both, closed loop first.
    Both,
}

impl LoadModels {
    /// The models measured, in sweep order.
    pub fn models(self) -> &'static [&'static str] {
        match self {
            LoadModels::Closed => &["closed"],
            LoadModels::Open => &["open"],
            LoadModels::Both => &["closed", "open"],
        }
    }
}
