//! The stable result format of a `farside lab` run: `summary.json`.
//!
//! One [`Summary`] per experiment run. Its JSON key names are a public,
//! stable interface: scripts, notebooks and the HTML report read them. Add
//! keys freely; never rename or remove one.
//!
//! `points` holds one record per measured configuration, all of the experiment's point
//! type ([`crate::experiment::Experiment::Point`]); the `experiment` field says which
//! (the points themselves carry no tag). The point types live with their experiments:
//! `admission::Point`, `probe::ProbePoint`, `faults::FaultRow`,
//! `reconfig::ReconfigPoint`, `speculative::SpecPoint`.
//!
//! Data a point keeps only in `points.jsonl` (an admission point's per-second series and
//! request samples) is not part of `summary.json`: deserializing a `summary.json`
//! yields points without it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One experiment run, as written to `summary.json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Summary<P> {
    /// `experiment`: experiment name, e.g. `"admission"` or `"probe"`.
    pub experiment: String,
    /// `hosts`: how the data-center was built, e.g. `"netns"` (virtual
    /// nodes in network namespaces on one machine) or a host list.
    pub hosts: String,
    /// `quick`: true for a shortened run (fewer loads, shorter durations);
    /// its numbers are for smoke-testing, not for comparison with the paper.
    pub quick: bool,
    /// `started_unix_s`: wall-clock start of the run, seconds since the Unix epoch.
    pub started_unix_s: u64,
    /// `duration_s`: wall-clock length of the whole run, seconds.
    pub duration_s: f64,
    /// `params`: the run's parameters (durations, think time, sample and
    /// monitor periods, thresholds, ...) as a free-form JSON object.
    pub params: serde_json::Value,
    /// `points`: one record per measured configuration, of the experiment's point type.
    pub points: Vec<P>,
    /// `notes`: free-text remarks (fallbacks taken, warnings, caveats).
    pub notes: Vec<String>,
    /// `finished`: false while the sweep runs or after it broke off (`--resume DIR`
    /// continues it); true once every point was measured.
    #[serde(default)]
    pub finished: bool,
    /// `commit`: the commit the binary was built from (compiled in), else `git rev-parse
    /// HEAD` of its source tree; `null` when neither is known.
    #[serde(default)]
    pub commit: Option<String>,
    /// `commit_dirty`: the tree had uncommitted changes to tracked files
    /// (`git status --porcelain --untracked-files=no`), read at run time: `null` when the
    /// tree has moved past the build's commit since (then unknown). The rule: a run of a
    /// dirty tree is never recorded as its commit alone: it keeps `commit` with
    /// `commit_dirty: true`, its run line says "(dirty tree)", and the results book
    /// (`farside lab report --book`) shows every current run's tree state.
    #[serde(default)]
    pub commit_dirty: Option<bool>,
    /// `build`: the cargo profile of the binary that ran the sweep (and of the farside
    /// processes it started, which are the same binary): `"release"` (what
    /// `scripts/demo.sh` and an operator run) or `"debug"` (the workspace's dev profile,
    /// opt-level 1, with debug assertions). Absent in runs kept before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    /// `kernel`: `uname -r` of the machine that ran the sweep.
    #[serde(default)]
    pub kernel: String,
    /// `cpu_model`: the first `model name` of `/proc/cpuinfo` (`"unknown"` without one).
    #[serde(default)]
    pub cpu_model: String,
    /// `cpus`: CPUs this process may run on.
    #[serde(default)]
    pub cpus: usize,
    /// `seed`: seed of the workload samplers (`--seed`; repeat `r` uses `seed + r`);
    /// `null` for experiments without randomness.
    #[serde(default)]
    pub seed: Option<u64>,
    /// `settings`: settings that need privileges or a particular host, each with what was
    /// asked for and whether it took effect (see [`Setting`]); a run whose settings were
    /// not all applied says so here and in a warning on stderr.
    #[serde(default)]
    pub settings: BTreeMap<String, Setting>,
}

/// A setting that needs privileges (or a host feature), as asked for and as applied.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Setting {
    /// `requested`: the value asked for (flag or default).
    pub requested: serde_json::Value,
    /// `applied`: whether it took effect.
    pub applied: bool,
    /// `reason`: why it was not applied (or how it was), `null` when applied as asked.
    #[serde(default)]
    pub reason: Option<String>,
}

impl Setting {
    /// A setting applied as requested.
    pub fn applied(requested: impl Into<serde_json::Value>) -> Setting {
        Setting {
            requested: requested.into(),
            applied: true,
            reason: None,
        }
    }

    /// A setting that was not applied, and why.
    pub fn not_applied(requested: impl Into<serde_json::Value>, reason: &str) -> Setting {
        Setting {
            requested: requested.into(),
            applied: false,
            reason: Some(reason.to_string()),
        }
    }
}

impl<P> Summary<P> {
    /// An empty summary started now, with `params` an empty JSON object.
    pub fn new(experiment: &str, hosts: &str, quick: bool) -> Summary<P> {
        let started_unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Summary {
            experiment: experiment.to_string(),
            hosts: hosts.to_string(),
            quick,
            started_unix_s,
            duration_s: 0.0,
            params: serde_json::Value::Object(serde_json::Map::new()),
            points: Vec::new(),
            notes: Vec::new(),
            finished: false,
            commit: None,
            commit_dirty: None,
            build: None,
            kernel: String::new(),
            cpu_model: String::new(),
            cpus: 0,
            seed: None,
            settings: BTreeMap::new(),
        }
    }

    /// Appends a point.
    pub fn push(&mut self, p: P) {
        self.points.push(p);
    }

    /// The same run's metadata with no points (of any point type).
    pub fn meta<Q>(&self) -> Summary<Q> {
        Summary {
            experiment: self.experiment.clone(),
            hosts: self.hosts.clone(),
            quick: self.quick,
            started_unix_s: self.started_unix_s,
            duration_s: self.duration_s,
            params: self.params.clone(),
            points: Vec::new(),
            notes: self.notes.clone(),
            finished: self.finished,
            commit: self.commit.clone(),
            commit_dirty: self.commit_dirty,
            build: self.build.clone(),
            kernel: self.kernel.clone(),
            cpu_model: self.cpu_model.clone(),
            cpus: self.cpus,
            seed: self.seed,
            settings: self.settings.clone(),
        }
    }
}

impl<P: Serialize> Summary<P> {
    /// `summary.json` text: pretty-printed, keys in declaration order, no series.
    pub fn to_json_pretty(&self) -> String {
        // Serializing plain structs, Strings, numbers and a Value cannot fail.
        serde_json::to_string_pretty(self).expect("Summary serializes")
    }
}

impl<P: serde::de::DeserializeOwned> Summary<P> {
    /// Parses `summary.json` text. Series come back empty (they live in CSV files).
    pub fn from_json(text: &str) -> serde_json::Result<Summary<P>> {
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_keys_are_present() {
        let s: Summary<serde_json::Value> = Summary::new("admission", "netns", false);
        let v: serde_json::Value = serde_json::from_str(&s.to_json_pretty()).unwrap();
        for k in [
            "experiment",
            "hosts",
            "quick",
            "started_unix_s",
            "duration_s",
            "params",
            "points",
            "notes",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
    }
}
