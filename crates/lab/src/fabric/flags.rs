//! Flags every experiment shares: how its sweep runs ([`SweepFlags`], flattened into
//! each experiment's arguments), where the nodes run ([`Hosts`]) and which load models
//! a sweep measures ([`LoadModels`]). `--out` and `--hosts` stay in each experiment's
//! arguments: their defaults differ (`out/<experiment>`; loopback where the experiment
//! can run without privileges, netns where it cannot).

use std::path::PathBuf;

/// How a sweep runs: reduced, or resumed from a broken run.
#[derive(Debug, Clone, Default, clap::Args, serde::Serialize)]
pub struct SweepFlags {
    /// Reduced sweep for demos and CI: fewer points and shorter runs, minutes in all
    /// (what each experiment reduces: docs/lab.md). Its numbers are not for
    /// comparison; summary.json says `quick`.
    #[arg(long)]
    pub quick: bool,
    /// Continue the broken sweep kept in DIR (its output directory): finished points
    /// are skipped. Refused when the settings differ from the kept run's.
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    #[serde(skip)]
    pub resume: Option<PathBuf>,
}

impl SweepFlags {
    /// The run's directory: the one resumed, else `out`.
    pub fn dir(&self, out: &std::path::Path) -> PathBuf {
        self.resume.clone().unwrap_or_else(|| out.to_path_buf())
    }
}

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
