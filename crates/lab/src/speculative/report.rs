//! `lab speculative`'s part of the report: the table per panel, peaks and break-even
//! rates, `speculative.csv` and the conn/s and response-time figures (seed 002's
//! Fig. 1-3).
//!
//! Files: `speculative.csv`, `table.txt`, `fig-spec-conn-<panel>.svg`,
//! `fig-spec-rt-<panel>.svg`.

use super::*;
use crate::table::{Align, Table};

/// The panels in first-seen order, each with its systems in first-seen order.
pub(super) fn panels(points: &[&SpecPoint]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for p in points {
        let panel = p.panel();
        let i = match out.iter().position(|(x, _)| *x == panel) {
            Some(i) => i,
            None => {
                out.push((panel, Vec::new()));
                out.len() - 1
            }
        };
        if !out[i].1.contains(&p.system) {
            out[i].1.push(p.system.clone());
        }
    }
    out
}

/// What a closed-loop panel's name ends with.
pub(super) const CLOSED_SUFFIX: &str = " closed";

/// The x axis of a panel: its table column, its name in the table's title, and the
/// figures' axis label.
pub(super) fn x_axis(panel: &str) -> (&'static str, &'static str, &'static str) {
    if panel.ends_with(CLOSED_SUFFIX) {
        ("clients", "closed-loop users", "closed-loop users")
    } else {
        ("rate", "offered rate", "offered connections/s")
    }
}

pub(super) fn fig_of(panel: &str) -> &'static str {
    let panel = panel.strip_suffix(CLOSED_SUFFIX).unwrap_or(panel);
    if panel == "single" {
        "Fig. 1"
    } else if panel.ends_with("67/33") {
        "Fig. 2"
    } else if panel.ends_with("75/25") {
        "Fig. 3"
    } else {
        "Fig. 2/3"
    }
}

/// The speculative tables: one row per point (`clients`: the closed loop's users, `-`
/// in the open loop), and conn/s vs offered rate or users per panel (single server:
/// Fig. 1; each split: Fig. 2/3), one column per system.
pub fn table(points: &[&SpecPoint]) -> String {
    let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    let mut t = Table::new()
        .col("", "exp", Align::Left, 8)
        .cols(" ", Align::Left, [("system", 8), ("split", 6)])
        .cols(
            " ",
            Align::Right,
            [
                ("clients", 7),
                ("rate", 8),
                ("offered", 9),
                ("conn/s", 9),
                ("failures", 8),
                ("timeouts", 8),
                ("avg_ms", 9),
                ("p99_ms", 9),
                ("migrations", 10),
                ("mig/s", 7),
                ("mig_p50", 8),
                ("mig_p99", 8),
            ],
        );
    for p in points {
        t.row(vec![
            p.experiment.clone(),
            p.system.clone(),
            p.split.clone(),
            p.clients.map_or("-".to_string(), |c| c.to_string()),
            format!("{:.1}", p.rate),
            format!("{:.1}", p.offered_per_s),
            format!("{:.1}", p.conn_per_s),
            p.failures.to_string(),
            p.timeouts.to_string(),
            format!("{:.1}", p.avg_ms),
            format!("{:.1}", p.p99_ms),
            p.migrations.to_string(),
            p.migrations_per_s
                .map_or("-".to_string(), |v| format!("{v:.1}")),
            us(p.migration_p50_us),
            us(p.migration_p99_us),
        ]);
        if let (Some(lo), Some(hi)) = (p.conn_per_s_min, p.conn_per_s_max) {
            // The runs' conn/s range after the row.
            t.note(&format!("  ({} runs: {lo:.1}-{hi:.1} conn/s)", p.runs));
        }
    }
    let mut s = t.render();
    if let Some(c) = points.first().map(|p| p.capacity_rps) {
        let _ = writeln!(s, "one node's capacity (formula): {c:.1} conn/s");
    }
    for (panel, systems) in panels(points) {
        let (x, x_label, _) = x_axis(&panel);
        let _ = writeln!(s, "\nconn/s vs {x_label}, {panel} ({})", fig_of(&panel));
        let mut t = Table::new().col("", x, Align::Left, 10).cols(
            " ",
            Align::Right,
            systems.iter().map(|sys| (sys.clone(), 10)),
        );
        let mut xs: Vec<f64> = points
            .iter()
            .filter(|p| p.panel() == panel)
            .map(|p| p.x())
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        for r in xs {
            let digits = usize::from(x == "rate");
            let mut row = vec![format!("{r:.digits$}")];
            for sys in &systems {
                row.push(
                    points
                        .iter()
                        .find(|p| p.panel() == panel && p.system == *sys && p.x() == r)
                        .map_or("-".to_string(), |p| format!("{:.1}", p.conn_per_s)),
                );
            }
            t.row(row);
        }
        s.push_str(&t.render());
    }
    s.push_str(&peaks_and_break_even(points));
    s
}

/// The peak conn/s of each panel and system, against the single server's peak (the
/// issue's target: two speculative servers at 75/25 ≥ 1.9× one), and the break-even
/// request cost: a migration pays for the overloaded source only if the request it
/// moves would have cost the source more CPU than moving it, so the break-even request
/// cost is the source's CPU per migration (mean over every migrated connection, the
/// points weighted by their migrations); the target's CPU per migration is the extra
/// work the move adds to the cluster.
///
/// Both client models get the same lines: the paper's S-Clients (open loop, panels
/// without `closed`) and closed-loop users (panels `... closed`). Under each peak, the
/// raw peak and the peak over the loads where at most [`crate::peak::FAILURE_BOUND`] of
/// the connections failed or timed out (refused, reset, abandoned at connect, timed out,
/// answered 5xx: `failures` over `served + failures`).
pub fn peaks_and_break_even(points: &[&SpecPoint]) -> String {
    let mut s = format!(
        "\npeak conn/s (x the single server's acc64 peak in the same load model), both \
         client models alike: the paper's S-Clients (open loop) and closed-loop users \
         (panels `closed`); under each, the raw peak and the peak over the loads with {}\n",
        crate::peak::bound_label(crate::peak::FAILURE_BOUND)
    );
    let peak = |panel: &str, sys: &str| {
        points
            .iter()
            .filter(|p| p.panel() == panel && p.system == sys)
            .max_by(|a, b| a.conn_per_s.total_cmp(&b.conn_per_s))
            .copied()
    };
    let panels = panels(points);
    let width = panels
        .iter()
        .map(|(p, _)| p.len())
        .max()
        .unwrap_or(0)
        .max(12);
    for (panel, systems) in panels {
        // Against the single server in the same load model.
        let single_panel = if panel.ends_with(CLOSED_SUFFIX) {
            format!("single{CLOSED_SUFFIX}")
        } else {
            "single".to_string()
        };
        let single = peak(&single_panel, "acc64").map(|p| p.conn_per_s);
        for sys in systems {
            let Some(p) = peak(&panel, &sys) else {
                continue;
            };
            let pk = p.conn_per_s;
            let ratio = single
                .filter(|s| *s > 0.0)
                .map_or("-".to_string(), |sg| format!("{:.2}x", pk / sg));
            let _ = write!(s, "  {panel:<width$} {sys:<8} {pk:>8.1}  {ratio}");
            let at = match p.clients {
                Some(c) => format!("{c} clients"),
                None => format!("rate {:.1}", p.rate),
            };
            if let Some(tax) = p.specd_cpu_ms_per_s {
                // specd's share of this point's node quota, at the peak.
                let _ = write!(
                    s,
                    "  (at {at}; specd {tax:.1} ms/s per node, {})",
                    p.steer_mode.as_deref().unwrap_or("-")
                );
            }
            s.push('\n');
            if !p.nodes.is_empty() {
                // Where each node's quota went at the peak, ms of CPU per second.
                let nodes: Vec<String> = p.nodes.iter().map(NodeCpu::brief).collect();
                let _ = writeln!(s, "      cpu ms/s: {}", nodes.join(", "));
            }
            let pts: Vec<&SpecPoint> = points
                .iter()
                .copied()
                .filter(|q| q.panel() == panel && q.system == sys)
                .collect();
            let pk = crate::peak::peaks(
                &pts,
                |q| q.conn_per_s,
                |q| crate::peak::failed_fraction(q.failures, q.served + q.failures),
                crate::peak::FAILURE_BOUND,
            );
            let at = |i: usize| match pts[i].clients {
                Some(c) => format!("{c} clients"),
                None => format!("rate {:.1}", pts[i].rate),
            };
            let _ = writeln!(s, "      peak {}", pk.text(1, at));
        }
    }
    let migrated: Vec<&&SpecPoint> = points.iter().filter(|p| p.migrations > 0).collect();
    let n: u64 = migrated.iter().map(|p| p.migrations).sum();
    let mean = |f: fn(&SpecPoint) -> Option<f64>| {
        let w: f64 = migrated
            .iter()
            .filter_map(|p| f(p).map(|v| v * p.migrations as f64))
            .sum();
        (n > 0).then(|| w / n as f64)
    };
    match (
        mean(|p| p.migration_cpu_source_us),
        mean(|p| p.migration_cpu_target_us),
    ) {
        (Some(src), tgt) => {
            let _ = writeln!(
                s,
                "break-even request cost: {src:.0} µs of CPU (the source's CPU per migration, \
                 mean of {n} migrations): a request that costs its server less is cheaper to \
                 serve where it landed; each migration also costs the target {} µs",
                tgt.map_or("-".to_string(), |t| format!("{t:.0}"))
            );
        }
        (None, _) => s.push_str("break-even request cost: - (no migration)\n"),
    }
    s
}

/// `speculative.csv`: one row per point.
pub fn csv(points: &[&SpecPoint]) -> String {
    let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
    let mut s = String::from(
        "experiment,system,split,accept_queue,admission_window,rate,offered_per_s,conn_per_s,served,failures,timeouts,avg_ms,p99_ms,migrations,migration_p50_us,migration_p99_us,refusals,window_closures,migration_lost,migration_cpu_source_us,migration_cpu_target_us,capacity_rps,duration_s,load,clients,migrations_per_s\n",
    );
    for p in points {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.3},{:.3},{:.3},{},{},{},{:.3},{:.3},{},{},{},{},{},{},{},{},{:.3},{:.3},{},{},{}",
            p.experiment,
            p.system,
            p.split,
            p.accept_queue,
            p.admission_window.map_or(String::new(), |w| w.to_string()),
            p.rate,
            p.offered_per_s,
            p.conn_per_s,
            p.served,
            p.failures,
            p.timeouts,
            p.avg_ms,
            p.p99_ms,
            p.migrations,
            o(p.migration_p50_us),
            o(p.migration_p99_us),
            p.refusals,
            p.window_closures,
            p.migration_lost,
            o(p.migration_cpu_source_us),
            o(p.migration_cpu_target_us),
            p.capacity_rps,
            p.duration_s,
            p.load,
            p.clients.map_or(String::new(), |c| c.to_string()),
            o(p.migrations_per_s)
        );
    }
    s
}

/// `(file name, caption, svg)` per panel: conn/s vs offered rate and avg response time
/// vs offered rate, one line per system.
pub fn figures(points: &[&SpecPoint]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (panel, systems) in panels(points) {
        let file = panel.replace([' ', '/'], "-");
        let (_, _, x_label) = x_axis(&panel);
        let line = |sys: &str, f: fn(&SpecPoint) -> f64| {
            let mut v: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.panel() == panel && p.system == sys)
                .map(|p| (p.x(), f(p)))
                .collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v
        };
        let mut c = Chart::new(
            &format!("Connection throughput, {panel}"),
            x_label,
            "connections completed/s",
        );
        let mut rt = Chart::new(
            &format!("Response time, {panel}"),
            x_label,
            "avg response time (ms)",
        );
        for sys in &systems {
            c = c.series(sys, line(sys, |p| p.conn_per_s));
            rt = rt.series(sys, line(sys, |p| p.avg_ms));
        }
        out.push((
            format!("fig-spec-conn-{file}.svg"),
            format!(
                "Connections completed/s vs {}, {panel} ({})",
                x_axis(&panel).1,
                fig_of(&panel)
            ),
            c.to_svg(),
        ));
        out.push((
            format!("fig-spec-rt-{file}.svg"),
            format!("Average response time vs {}, {panel}", x_axis(&panel).1),
            rt.to_svg(),
        ));
        // Over time: each speculative system at its peak, per second of the window.
        for sys in &systems {
            let peak = points
                .iter()
                .filter(|p| p.panel() == panel && p.system == *sys && !p.migrated_per_s.is_empty())
                .max_by(|a, b| a.conn_per_s.total_cmp(&b.conn_per_s));
            if let Some(p) = peak {
                out.push(over_time_figure(p, &panel, &file));
            }
        }
    }
    out
}

/// One speculative point per second of its measured window (runs summed, so divided by
/// its runs): connections completed, migrations, target refusals and window closures.
pub(super) fn over_time_figure(p: &SpecPoint, panel: &str, file: &str) -> (String, String, String) {
    let runs = p.runs.max(1) as f64;
    let line = |v: Vec<f64>| -> Vec<(f64, f64)> {
        v.into_iter()
            .enumerate()
            .map(|(i, y)| (i as f64 + 1.0, y / runs))
            .collect()
    };
    let served: Vec<f64> = p.served_per_s.iter().map(|&n| n as f64).collect();
    let at = match p.clients {
        Some(c) => format!("{c} users"),
        None => format!("{:.1} conn/s offered", p.rate),
    };
    let c = Chart::new(
        &format!("Over time, {} {panel} at {at}", p.system),
        "second of the measured window",
        "per second",
    )
    .series("completed", line(served))
    .series("migrated", line(p.migrated_per_s.clone()))
    .series("refused by the target", line(p.refused_per_s.clone()))
    .series("window closed", line(p.closed_per_s.clone()));
    (
        format!("fig-spec-time-{file}-{}.svg", p.system),
        format!(
            "Connections completed, migrations, refusals and window closures per second, \
             {} {panel} at its peak ({at})",
            p.system
        ),
        c.to_svg(),
    )
}
