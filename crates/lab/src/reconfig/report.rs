//! `lab reconfig`'s tables (per scenario and system, and the sweep of the history
//! window T), `reconfig.csv` and the per-point series files; the figures are in
//! [`super::figures`].
//!
//! Files: `reconfig.csv`, `table.txt`, one series file per point, `fig7-tps-<scenario>.svg`,
//! `fig8-nodes-<scenario>-L<burst>.svg`, `fig9-…` (seed 001's Fig. 7-9).

use super::*;

/// The reconfig tables: one row per point, and TPS vs burst length per system (Fig. 7).
pub fn table(points: &[&ReconfigPoint]) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let ms2 = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    use crate::table::{Align, Table};
    let mut t = Table::new()
        .col("", "system", Align::Left, 16)
        .col(" ", "scenario", Align::Left, 9)
        .cols(
            " ",
            Align::Right,
            [
                ("burst", 7),
                ("transport", 9),
                ("tps", 9),
                ("failures", 8),
                ("moves", 6),
                ("lab_moves", 9),
                ("switch_p50", 10),
                ("switch_p99", 10),
                ("dec_p50", 9),
                ("dec_p99", 9),
                ("apply_p50", 9),
                ("apply_p99", 9),
                ("wall_s", 9),
            ],
        );
    // Repeated points add their spread (single runs render as they always did).
    let spread = points.iter().any(|p| p.tps_spread().is_some());
    if spread {
        t = t.cols(
            " ",
            Align::Right,
            [("runs", 4), ("tps_sd", 7), ("tps_min", 8), ("tps_max", 8)],
        );
    }
    for p in points {
        let mut extra = Vec::new();
        if spread {
            let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
            let sp = p.tps_spread();
            extra = vec![
                p.runs.to_string(),
                f(sp.map(|s| s.sd)),
                f(sp.map(|s| s.min)),
                f(sp.map(|s| s.max)),
            ];
        }
        t.row(
            vec![
                label(&p.system, p.history_ms),
                p.scenario.clone(),
                p.burst.to_string(),
                p.transport.to_string(),
                format!("{:.1}", p.tps),
                p.failures.to_string(),
                p.moves.to_string(),
                p.lab_moves.to_string(),
                ms(p.switch_p50_ms),
                ms(p.switch_p99_ms),
                ms2(p.decision_p50_ms),
                ms2(p.decision_p99_ms),
                ms(p.apply_p50_ms),
                ms(p.apply_p99_ms),
                format!("{:.1}", p.wall_s),
            ]
            .into_iter()
            .chain(extra)
            .collect(),
        );
    }
    let mut s = t.render();
    s.push_str(
        "switch: balancer's move CAS -> the node's first request in the new role (ms; \
         balancer moves only); dec: the round's decision -> that CAS (ms); apply: the node \
         agent's wanted seen -> served (ms)\n",
    );
    let mut scenarios: Vec<&str> = Vec::new();
    for p in points {
        if !scenarios.contains(&p.scenario.as_str()) {
            scenarios.push(&p.scenario);
        }
    }
    for sc in scenarios {
        let mut systems: Vec<String> = Vec::new();
        let mut bursts: Vec<u64> = Vec::new();
        for p in points.iter().filter(|p| p.scenario == sc) {
            let l = label(&p.system, p.history_ms);
            if !systems.contains(&l) {
                systems.push(l);
            }
            if !bursts.contains(&p.burst) {
                bursts.push(p.burst);
            }
        }
        bursts.sort_unstable();
        let _ = writeln!(s, "\nTPS vs burst length, scenario {sc} (Fig. 7)");
        let mut t = Table::new().col("", "burst", Align::Left, 8).cols(
            " ",
            Align::Right,
            systems.iter().map(|sys| (sys.clone(), 16)),
        );
        for b in bursts {
            let mut row = vec![b.to_string()];
            for sys in &systems {
                row.push(
                    points
                        .iter()
                        .find(|p| {
                            p.scenario == sc
                                && p.burst == b
                                && label(&p.system, p.history_ms) == *sys
                        })
                        .map_or("-".to_string(), |p| match p.tps_spread() {
                            Some(sp) => format!("{:.1} ± {:.1}", p.tps, sp.sd),
                            None => format!("{:.1}", p.tps),
                        }),
                );
            }
            t.row(row);
        }
        s.push_str(&t.render());
        if spread {
            s.push_str("(repeated points: TPS over all runs ± the runs' sample sd)\n");
            s.push_str(&ratio_text(points, sc, &systems));
        }
        s.push_str(&peaks_text(points, sc, &systems));
    }
    s.push_str(&t_sweep_table(points));
    s
}

/// With repeated points: per `reconf` system and burst of scenario `sc`, its TPS over
/// rigid's (the ratio of the two points' TPS) and the range the runs allow (least
/// reconf run over the greatest rigid run .. greatest over least: the runs are not
/// paired). Empty without a rigid point.
fn ratio_text(points: &[&ReconfigPoint], sc: &str, systems: &[String]) -> String {
    let find = |sys: &str, b: u64| {
        points
            .iter()
            .copied()
            .find(|p| p.scenario == sc && p.burst == b && label(&p.system, p.history_ms) == sys)
    };
    let mut bursts: Vec<u64> = points
        .iter()
        .filter(|p| p.scenario == sc)
        .map(|p| p.burst)
        .collect();
    bursts.sort_unstable();
    bursts.dedup();
    let mut s = String::new();
    for sys in systems.iter().filter(|s| s.starts_with("reconf")) {
        for &b in &bursts {
            let (Some(r), Some(x)) = (find("rigid", b), find(sys, b)) else {
                continue;
            };
            if r.tps <= 0.0 {
                continue;
            }
            let range = match (x.tps_spread(), r.tps_spread()) {
                (Some(xs), Some(rs)) if rs.min > 0.0 && rs.max > 0.0 => {
                    format!(" (runs {:.2}..{:.2})", xs.min / rs.max, xs.max / rs.min)
                }
                _ => String::new(),
            };
            if s.is_empty() {
                let _ = writeln!(s, "ratio to rigid, scenario {sc}:");
            }
            let _ = writeln!(s, "  {sys} burst {b}: {:.2}x{range}", x.tps / r.tps);
        }
    }
    s
}

/// Per system of scenario `sc`, its TPS peak over the burst lengths two ways
/// ([`crate::peak`]): raw, and over the bursts where at most
/// [`crate::peak::FAILURE_BOUND`] of the requests failed or were refused (`failures` over
/// `served + failures`). `lab reconfig`'s clients are a closed loop only (each proxy's
/// users send their burst and wait), so there is no open-loop line.
fn peaks_text(points: &[&ReconfigPoint], sc: &str, systems: &[String]) -> String {
    let mut s = format!(
        "peak TPS, scenario {sc} (closed loop; no open loop in lab reconfig): raw, and over \
         the bursts with {}\n",
        crate::peak::bound_label(crate::peak::FAILURE_BOUND)
    );
    let w = systems.iter().map(String::len).max().unwrap_or(0);
    for sys in systems {
        let pts: Vec<&ReconfigPoint> = points
            .iter()
            .copied()
            .filter(|p| p.scenario == sc && label(&p.system, p.history_ms) == *sys)
            .collect();
        let pk = crate::peak::peaks(
            &pts,
            |p| p.tps,
            |p| crate::peak::failed_fraction(p.failures, p.served + p.failures),
            crate::peak::FAILURE_BOUND,
        );
        let _ = writeln!(
            s,
            "  {sys:<w$}  {}",
            pk.text(1, |i| format!("burst {}", pts[i].burst))
        );
    }
    s
}

/// The T sweep (`--sweep-t`): per scenario with more than one T, one row per (T,
/// burst): moves (thrashing) against TPS (responsiveness), switch and decision p50.
/// Empty without a sweep.
pub fn t_sweep_table(points: &[&ReconfigPoint]) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let mut s = String::new();
    let mut scenarios: Vec<&str> = Vec::new();
    for p in points {
        if !scenarios.contains(&p.scenario.as_str()) {
            scenarios.push(&p.scenario);
        }
    }
    for sc in scenarios {
        let mut rows: Vec<&ReconfigPoint> = points
            .iter()
            .copied()
            .filter(|p| p.scenario == sc && p.history_ms.is_some())
            .collect();
        let mut ts: Vec<u64> = rows.iter().filter_map(|p| p.history_ms).collect();
        ts.sort_unstable();
        ts.dedup();
        if ts.len() < 2 {
            continue;
        }
        rows.sort_by_key(|p| (p.history_ms, p.burst));
        let _ = writeln!(
            s,
            "\nT sweep, scenario {sc}: moves (thrashing) vs TPS (responsiveness)"
        );
        let mut t = crate::table::Table::new()
            .col("", "T_ms", crate::table::Align::Left, 8)
            .cols(
                " ",
                crate::table::Align::Right,
                [
                    ("burst", 7),
                    ("transport", 9),
                    ("moves", 6),
                    ("tps", 9),
                    ("switch_p50", 10),
                    ("dec_p50", 9),
                ],
            );
        for p in rows {
            t.row(vec![
                p.history_ms.unwrap_or(0).to_string(),
                p.burst.to_string(),
                p.transport.to_string(),
                p.moves.to_string(),
                format!("{:.1}", p.tps),
                ms(p.switch_p50_ms),
                ms(p.decision_p50_ms),
            ]);
        }
        s.push_str(&t.render());
    }
    s
}

/// `reconfig.csv`: one row per point.
pub fn csv(points: &[&ReconfigPoint]) -> String {
    let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    let mut s = String::from(
        "system,history_ms,scenario,burst,transport,tps,served,failures,wall_s,bursts,moves,lab_moves,switches,switch_p50_ms,switch_p99_ms,switch_unmatched,decision_p50_ms,decision_p99_ms,apply_p50_ms,apply_p99_ms\n",
    );
    for p in points {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.3},{},{},{:.3},{},{},{},{},{},{},{},{},{},{},{}",
            p.system,
            p.history_ms.map_or(String::new(), |t| t.to_string()),
            p.scenario,
            p.burst,
            p.transport,
            p.tps,
            p.served,
            p.failures,
            p.wall_s,
            p.bursts,
            p.moves,
            p.lab_moves,
            p.switches,
            o(p.switch_p50_ms),
            o(p.switch_p99_ms),
            p.switch_unmatched,
            o(p.decision_p50_ms),
            o(p.decision_p99_ms),
            o(p.apply_p50_ms),
            o(p.apply_p99_ms)
        );
    }
    s
}

/// The nodes-serving series of a point as CSV (`t_s,site,nodes`) and its file name
/// (`nodes-<system>-<scenario>-<burst>.csv`, `:` written `-`).
pub fn series_csv(p: &ReconfigPoint) -> (String, String) {
    let mut s = String::from("t_s,site,nodes\n");
    for x in &p.series {
        let _ = writeln!(s, "{:.3},{},{}", x.t_s, x.site, x.nodes);
    }
    (
        format!(
            "nodes-{}-{}-{}.csv",
            label(&p.system, p.history_ms),
            p.scenario.replace(':', "-"),
            p.burst
        ),
        s,
    )
}
