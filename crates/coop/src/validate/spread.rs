//! The spread of a repeated calibration: each repeat's costs as a set, the per-cost
//! median, lowest and highest over the repeats, a costs file at either end, and the
//! checks at those ends (for information; the pass rule is the median's).

use super::{CostsFile, PointCheck, TransportCosts};
use crate::model::HostFetchCosts;
use crate::sim::Costs;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Every cost the model reads that the repeated calibration measures once per repeat:
/// the CPU costs, the client's, the transports', the host-wide lines and the disk
/// emulation's measured service. The delay (light phases, measured once) and the
/// constants of [`Costs`] that are not measured are not in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostSet {
    pub costs: Costs,
    pub client_request_ns: f64,
    pub client_per_kb_ns: f64,
    pub transports: Vec<TransportCosts>,
    pub host_local_ns: f64,
    pub host_local_per_kb_ns: f64,
    pub host_miss_ns: f64,
    pub host_miss_per_kb_ns: f64,
    pub host_fetch: Vec<HostFetchCosts>,
    pub disk_access_ns: f64,
    pub disk_per_kb_ns: f64,
}

/// The spread of a repeated calibration: each repeat's costs, and per cost the lowest
/// and the highest of them (each field on its own: `low` is every cost at its lowest,
/// the cheapest the repeats allow, `high` every cost at its highest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Repeats of every lab-shaped phase.
    pub repeats: usize,
    /// How a repeat is measured and how the costs are taken from the repeats.
    pub rule: String,
    pub low: CostSet,
    pub high: CostSet,
    pub per_repeat: Vec<CostSet>,
}

/// How [`combine_sets`] takes one cost from its repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    Median,
    Min,
    Max,
}

/// The median of `xs` (the mean of the two middle values for an even count); `None` if
/// empty or if any is not a number.
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() || xs.iter().any(|x| x.is_nan()) {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// `(min, max)` of `xs`; `None` if empty or if any is not a number.
pub fn min_max(xs: &[f64]) -> Option<(f64, f64)> {
    if xs.is_empty() || xs.iter().any(|x| x.is_nan()) {
        return None;
    }
    Some(
        xs.iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            }),
    )
}

fn pick(xs: &[f64], how: Pick) -> Option<f64> {
    match how {
        Pick::Median => median(xs),
        Pick::Min => min_max(xs).map(|m| m.0),
        Pick::Max => min_max(xs).map(|m| m.1),
    }
}

/// Field by field over JSON values of one shape: numbers picked (whole numbers stay
/// whole, rounded), strings and booleans must agree, arrays must have one length.
fn combine_values(vs: &[serde_json::Value], how: Pick) -> Result<serde_json::Value, String> {
    use serde_json::Value;
    let first = vs.first().ok_or("no repeats")?;
    match first {
        Value::Number(_) => {
            let xs: Vec<f64> = vs
                .iter()
                .map(|v| v.as_f64().ok_or("a cost is a number in one repeat only"))
                .collect::<Result<_, _>>()?;
            let x = pick(&xs, how).ok_or("a cost is not a number")?;
            if vs.iter().all(Value::is_u64) {
                Ok(Value::from(x.round().max(0.0) as u64))
            } else {
                serde_json::Number::from_f64(x)
                    .map(Value::Number)
                    .ok_or_else(|| "a cost is not finite".to_string())
            }
        }
        Value::Array(a) => {
            let mut out = Vec::with_capacity(a.len());
            for i in 0..a.len() {
                let col: Vec<Value> = vs
                    .iter()
                    .map(|v| match v {
                        Value::Array(b) if b.len() == a.len() => Ok(b[i].clone()),
                        _ => Err("the repeats list different transports".to_string()),
                    })
                    .collect::<Result<_, _>>()?;
                out.push(combine_values(&col, how)?);
            }
            Ok(Value::Array(out))
        }
        Value::Object(o) => {
            let mut out = serde_json::Map::new();
            for k in o.keys() {
                let col: Vec<Value> = vs
                    .iter()
                    .map(|v| {
                        v.get(k)
                            .cloned()
                            .ok_or_else(|| format!("{k:?} missing in a repeat"))
                    })
                    .collect::<Result<_, _>>()?;
                out.insert(k.clone(), combine_values(&col, how)?);
            }
            Ok(Value::Object(out))
        }
        other => {
            if vs.iter().all(|v| v == other) {
                Ok(other.clone())
            } else {
                Err(format!("the repeats disagree on {other}"))
            }
        }
    }
}

/// One cost set from the repeats' sets, each cost on its own by `how` (the median, the
/// lowest or the highest over the repeats).
pub fn combine_sets(sets: &[CostSet], how: Pick) -> Result<CostSet, String> {
    let vs: Vec<serde_json::Value> = sets
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let v = combine_values(&vs, how).map_err(|e| format!("combining the repeats: {e}"))?;
    serde_json::from_value(v).map_err(|e| format!("combining the repeats: {e}"))
}

impl CostsFile {
    /// The costs of this file that a repeated calibration measures, as a set.
    pub fn cost_set(&self) -> CostSet {
        let h = self.host_wide.as_ref();
        CostSet {
            costs: self.costs.clone(),
            client_request_ns: self.client_request_ns,
            client_per_kb_ns: self.client_per_kb_ns,
            transports: self.transports.clone(),
            host_local_ns: h.map_or(0.0, |h| h.local_ns),
            host_local_per_kb_ns: h.map_or(0.0, |h| h.local_per_kb_ns),
            host_miss_ns: h.map_or(0.0, |h| h.miss_ns),
            host_miss_per_kb_ns: h.map_or(0.0, |h| h.miss_per_kb_ns),
            host_fetch: h.map_or_else(Vec::new, |h| h.fetch.clone()),
            disk_access_ns: self.disk.measured_access_ns,
            disk_per_kb_ns: self.disk.measured_per_kb_ns,
        }
    }

    /// This file with the costs of `set` in place of its own (the host-wide lines only
    /// where the file has host-wide figures).
    pub fn with_set(&self, set: &CostSet) -> CostsFile {
        let mut f = self.clone();
        f.costs = set.costs.clone();
        f.client_request_ns = set.client_request_ns;
        f.client_per_kb_ns = set.client_per_kb_ns;
        f.transports = set.transports.clone();
        if let Some(h) = f.host_wide.as_mut() {
            h.local_ns = set.host_local_ns;
            h.local_per_kb_ns = set.host_local_per_kb_ns;
            h.miss_ns = set.host_miss_ns;
            h.miss_per_kb_ns = set.host_miss_per_kb_ns;
            h.fetch = set.host_fetch.clone();
        }
        f.disk.measured_access_ns = set.disk_access_ns;
        f.disk.measured_per_kb_ns = set.disk_per_kb_ns;
        f
    }

    /// The file at the low and at the high end of its spread (`None`: it has none).
    pub fn spread_ends(&self) -> Option<(CostsFile, CostsFile)> {
        let s = self.spread.as_ref()?;
        Some((self.with_set(&s.low), self.with_set(&s.high)))
    }
}

/// Whether `measured` lies between two predictions (in either order).
pub fn within_band(measured: f64, a: f64, b: f64) -> bool {
    a.min(b) <= measured && measured <= a.max(b)
}

/// The checks again at the ends of the calibration's spread, for information: per
/// modelled point, the throughput predicted with every cost at its highest and at its
/// lowest over the repeats beside the median's, and for each point outside the
/// tolerance whether the measured value lies inside that band. `low` and `high` are
/// [`check_runs`] over the same runs with the low and the high costs; the pass rule
/// stays the median's.
pub fn render_spread(checks: &[PointCheck], low: &[PointCheck], high: &[PointCheck]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "at the ends of the calibration's spread (information; the verdict above is the median costs'):"
    );
    let _ = writeln!(
        s,
        "{:<22} {:<10} {:>5} {:>12} {:>10} {:>12} {:>10} {:>7}  outside the tolerance: measured inside the spread's band?",
        "run",
        "system",
        "nodes",
        "high costs",
        "median",
        "low costs",
        "measured",
        "error",
    );
    let (mut missed, mut inside) = (0, 0);
    for ((c, l), h) in checks.iter().zip(low).zip(high) {
        let (Ok(pm), Ok(pl), Ok(ph)) = (&c.prediction, &l.prediction, &h.prediction) else {
            continue;
        };
        let p = &c.point;
        let (xl, xm, xh) = (ph.throughput(), pm.throughput(), pl.throughput());
        let verdict = if c.pass() == Some(true) {
            "-".to_string()
        } else {
            missed += 1;
            if within_band(p.tps, xl, xh) {
                inside += 1;
                "yes".to_string()
            } else {
                format!(
                    "no ({:+.1} % from the nearer end)",
                    if p.tps < xl.min(xh) {
                        (p.tps / xl.min(xh) - 1.0) * 100.0
                    } else {
                        (p.tps / xl.max(xh) - 1.0) * 100.0
                    }
                )
            }
        };
        let _ = writeln!(
            s,
            "{:<22} {:<10} {:>5} {:>12.1} {:>10.1} {:>12.1} {:>10.1} {:>+6.1}%  {verdict}",
            c.run,
            p.system,
            p.nodes,
            xl,
            xm,
            xh,
            p.tps,
            (xm / p.tps - 1.0) * 100.0
        );
    }
    let _ = writeln!(
        s,
        "outside the tolerance: {missed}; of them with the measured value inside the spread's band: {inside}"
    );
    s
}
