//! The point of `lab reconfig` ([`ReconfigPoint`]: one system, scenario and burst
//! length), the nodes-per-site samples it keeps, how repeats combine, and the label
//! that names a system in tables and files.

use serde::{Deserialize, Serialize};

use super::timing;

/// The nodes serving the loaded site at one instant (proxy `p0`'s view).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct NodesSample {
    /// Seconds since the point's first burst started.
    pub t_s: f64,
    /// The loaded site's index.
    pub site: usize,
    /// Back-ends whose served role is that site.
    pub nodes: u64,
}

/// One point of `lab reconfig`: one system, scenario and burst length.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ReconfigPoint {
    pub system: String,
    /// Node ratio, e.g. `2:2:2:2`.
    pub scenario: String,
    /// Requests per burst (L).
    pub burst: u64,
    /// The back-ends' region transport: `xdp` or `tcp` (netns), `shm`, `tcp` or `udp`
    /// (loopback).
    pub transport: String,
    /// T (history window) of a `reconf` point, ms; `None` for the static systems.
    #[serde(default)]
    pub history_ms: Option<u64>,
    /// Requests served / summed wall time of the point's bursts, requests/s.
    pub tps: f64,
    /// Requests served (status < 500) over all bursts.
    pub served: u64,
    /// Failed or refused requests over all bursts.
    pub failures: u64,
    /// Summed wall time of the bursts, s (the overprovisioned set-up excluded).
    pub wall_s: f64,
    /// Bursts run.
    pub bursts: u64,
    /// Nodes moved by the balancers (`farside_reconf_moves_total`, all proxies).
    pub moves: u64,
    /// Nodes moved by the lab itself (the overprovisioned set-up before each burst).
    pub lab_moves: u64,
    /// Role switches the nodes completed during the point.
    pub switches: u64,
    /// Switching time p50 / p99, ms: from a balancer's move CAS
    /// on the node's `ROLE_WANTED` to the first request the node served in the new role
    /// (one host clock; [`timing`]). Balancer moves only (`moves_timed`); `None` without
    /// one.
    pub switch_p50_ms: Option<f64>,
    pub switch_p99_ms: Option<f64>,
    /// Moves whose node served no request for its new site within the point (the load
    /// had moved on): not in the switch quantiles.
    #[serde(default)]
    pub switch_unmatched: u64,
    /// The node agents' part, p50 / p99, ms: gatherd's `farside_gatherd_role_switch_ms`
    /// (new wanted value seen → served published, drain included), every switch of the
    /// point (the overprovisioned set-up's included).
    #[serde(default)]
    pub apply_p50_ms: Option<f64>,
    #[serde(default)]
    pub apply_p99_ms: Option<f64>,
    /// Decision-to-move latency p50 / p99, ms: from the balancer round's decision that a
    /// site is due a node to the reply of that node's role CAS (lock read, acquire,
    /// intent, move: round trips over `transport`).
    #[serde(default)]
    pub decision_p50_ms: Option<f64>,
    #[serde(default)]
    pub decision_p99_ms: Option<f64>,
    /// Every balancer move of the point with its timings (Fig. 8/9 marks, the quantiles'
    /// samples).
    #[serde(default)]
    pub moves_timed: Vec<timing::MoveTiming>,
    /// TPS of each burst in order (served / its wall time).
    pub burst_tps: Vec<f64>,
    /// Nodes serving the loaded site, every [`SERIES_EVERY`](super::plan::SERIES_EVERY) (Fig. 8/9).
    pub series: Vec<NodesSample>,
    /// Runs combined in this point.
    #[serde(default = "one")]
    pub runs: u64,
    /// TPS of each run combined in this point, in run order (empty for a single run):
    /// the spread of the repeats ([`ReconfigPoint::tps_spread`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub run_tps: Vec<f64>,
}

/// The spread of a point's runs: sample standard deviation, least and greatest TPS.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TpsSpread {
    pub sd: f64,
    pub min: f64,
    pub max: f64,
}

pub(super) fn one() -> u64 {
    1
}

impl ReconfigPoint {
    /// Repeats of one point: counts summed, `tps` recomputed from the sums, each run's
    /// TPS kept (`run_tps`), switch and
    /// decision quantiles recomputed over every run's moves, apply quantiles the worst
    /// run's, series and per-burst TPS the first run's.
    pub fn combine(runs: &[ReconfigPoint]) -> ReconfigPoint {
        let Some(first) = runs.first() else {
            return ReconfigPoint {
                system: String::new(),
                scenario: String::new(),
                burst: 0,
                transport: String::new(),
                history_ms: None,
                tps: 0.0,
                served: 0,
                failures: 0,
                wall_s: 0.0,
                bursts: 0,
                moves: 0,
                lab_moves: 0,
                switches: 0,
                switch_p50_ms: None,
                switch_p99_ms: None,
                switch_unmatched: 0,
                apply_p50_ms: None,
                apply_p99_ms: None,
                decision_p50_ms: None,
                decision_p99_ms: None,
                moves_timed: Vec::new(),
                burst_tps: Vec::new(),
                series: Vec::new(),
                runs: 0,
                run_tps: Vec::new(),
            };
        };
        let worst = |f: fn(&ReconfigPoint) -> Option<f64>| {
            runs.iter()
                .filter_map(f)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        };
        let served = runs.iter().map(|r| r.served).sum::<u64>();
        let wall_s = runs.iter().map(|r| r.wall_s).sum::<f64>();
        let moves_timed: Vec<timing::MoveTiming> =
            runs.iter().flat_map(|r| r.moves_timed.clone()).collect();
        let q = timing_quantiles(&moves_timed);
        ReconfigPoint {
            tps: if wall_s > 0.0 {
                served as f64 / wall_s
            } else {
                0.0
            },
            served,
            failures: runs.iter().map(|r| r.failures).sum(),
            wall_s,
            bursts: runs.iter().map(|r| r.bursts).sum(),
            moves: runs.iter().map(|r| r.moves).sum(),
            lab_moves: runs.iter().map(|r| r.lab_moves).sum(),
            switches: runs.iter().map(|r| r.switches).sum(),
            switch_p50_ms: q.switch_p50_ms,
            switch_p99_ms: q.switch_p99_ms,
            switch_unmatched: runs.iter().map(|r| r.switch_unmatched).sum(),
            apply_p50_ms: worst(|r| r.apply_p50_ms),
            apply_p99_ms: worst(|r| r.apply_p99_ms),
            decision_p50_ms: q.decision_p50_ms,
            decision_p99_ms: q.decision_p99_ms,
            moves_timed,
            runs: runs.iter().map(|r| r.runs).sum(),
            run_tps: if runs.len() > 1 {
                runs.iter().flat_map(ReconfigPoint::each_run_tps).collect()
            } else {
                first.run_tps.clone()
            },
            ..first.clone()
        }
    }

    /// The TPS of every run in this point (its own `tps` if it is one run).
    fn each_run_tps(&self) -> Vec<f64> {
        if self.run_tps.is_empty() {
            vec![self.tps]
        } else {
            self.run_tps.clone()
        }
    }

    /// The spread of the runs' TPS; `None` for a single run.
    pub fn tps_spread(&self) -> Option<TpsSpread> {
        let v = &self.run_tps;
        if v.len() < 2 {
            return None;
        }
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
        Some(TpsSpread {
            sd: var.sqrt(),
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }

    /// The point's figures on one line, for progress output.
    pub fn progress_line(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
        // The decision-to-move latency is often under a millisecond.
        let ms2 = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        format!(
            "tps={:.1} served={} failures={} moves={} lab_moves={} switch p50={} p99={} ms \
             (unmatched {}) decision p50={} p99={} ms apply p50={} p99={} ms",
            self.tps,
            self.served,
            self.failures,
            self.moves,
            self.lab_moves,
            ms(self.switch_p50_ms),
            ms(self.switch_p99_ms),
            self.switch_unmatched,
            ms2(self.decision_p50_ms),
            ms2(self.decision_p99_ms),
            ms(self.apply_p50_ms),
            ms(self.apply_p99_ms)
        )
    }
}

/// Switch and decision quantiles of a set of moves.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct TimingQuantiles {
    pub switch_p50_ms: Option<f64>,
    pub switch_p99_ms: Option<f64>,
    pub decision_p50_ms: Option<f64>,
    pub decision_p99_ms: Option<f64>,
}

/// The quantiles of `moves`' switch times (matched moves only) and decision latencies.
pub fn timing_quantiles(moves: &[timing::MoveTiming]) -> TimingQuantiles {
    let sw: Vec<f64> = moves.iter().filter_map(|m| m.switch_ms).collect();
    let de: Vec<f64> = moves.iter().map(|m| m.decision_ms).collect();
    TimingQuantiles {
        switch_p50_ms: timing::quantile(&sw, 0.5),
        switch_p99_ms: timing::quantile(&sw, 0.99),
        decision_p50_ms: timing::quantile(&de, 0.5),
        decision_p99_ms: timing::quantile(&de, 0.99),
    }
}

impl crate::experiment::LabPoint for ReconfigPoint {
    type Extra = crate::experiment::NoExtra;

    fn take_extra(&mut self) -> crate::experiment::NoExtra {
        crate::experiment::NoExtra {}
    }

    fn put_extra(&mut self, _: crate::experiment::NoExtra) {}

    fn combine(runs: &[ReconfigPoint]) -> ReconfigPoint {
        ReconfigPoint::combine(runs)
    }

    fn progress_line(&self) -> String {
        ReconfigPoint::progress_line(self)
    }
}

/// A system's name in tables and file names: `reconf` points carry their T
/// (`reconf-T5000`).
pub fn label(system: &str, history_ms: Option<u64>) -> String {
    match history_ms {
        Some(t) => format!("{system}-T{t}"),
        None => system.to_string(),
    }
}
