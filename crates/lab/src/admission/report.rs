//! `lab admission`'s part of the report: per trace, a table of avg response time, TPS,
//! drop and slow rates per system and load, with the improvement line; the scenario and
//! where-time-went tables; `points.csv` and the per-second series; the figures of the
//! paper's Fig. 5-10. Where several points share a label, trace and client count, the
//! first one is used in tables and figures.
//!
//! Files: `points.csv` (one row per point, always), `series-<system>[-limit<N>]-<trace>-
//! <clients>.csv` (per-second series; `-limit<N>` when several limits were swept),
//! `fig-avg-<trace>.svg`, `fig-tps-<trace>.svg`, `fig-slow-<trace>.svg` (Fig. 5, 9, 10;
//! error bars ± 1 sd over repeats), `fig-rt-goodput-<trace>.svg` (across `--limits`),
//! `fig-requests-<trace>.svg` (Fig. 6), `fig-series-rt-<trace>.svg`,
//! `fig-series-drop-<trace>.svg` (Fig. 7).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io;

use super::point::{
    Point, SecondPoint, SYSTEMS, SYSTEM_ENVOY_AC, SYSTEM_HAPROXY, SYSTEM_HAPROXY_DIVIDED,
    SYSTEM_NO_AC,
};
use crate::experiment::Figure;
use crate::peak::{bound_label, failed_fraction, grouped_lines, Measured, FAILURE_BOUND};
use crate::report::{csv_text, fmt_num, sanitize};
use crate::summary::Summary;
use crate::svg::{escape, Chart};
use crate::table::{Align, Table};

/// The anchor systems of `lab admission` (HAProxy with the full per-server `maxconn` on
/// every proxy, and with it divided among the proxies; Envoy's adaptive concurrency),
/// compared against in the improvement lines when they ran.
const ANCHORS: [&str; 3] = [SYSTEM_HAPROXY, SYSTEM_HAPROXY_DIVIDED, SYSTEM_ENVOY_AC];
/// `params` keys that may hold the QoS threshold for `slow_rate`, in ms,
/// first match wins (`farside lab admission` writes `qos_ms`).
pub const PARAM_SLOW_MS_KEYS: [&str; 2] = ["slow_ms", "qos_ms"];
/// QoS threshold shown when `params` does not say: the paper's 1 s (Fig. 8/9).
const SLOW_MS_DEFAULT: f64 = 1000.0;
/// Per-second response times spanning more than this ratio get a log axis,
/// as in the paper's Fig. 8 (no-ac's overload tail dwarfs the others otherwise).
const LOG_AXIS_RATIO_MIN: f64 = 50.0;

/// Improvement of one system's average response time over a baseline, at one load.
#[derive(Clone, Debug, PartialEq)]
pub struct Improvement {
    /// The system measured.
    pub system: String,
    /// The system compared against.
    pub baseline: String,
    /// `(baseline_avg - system_avg) / baseline_avg * 100`: positive is better.
    /// `None` when either point is missing or the baseline is 0.
    pub percent: Option<f64>,
}

/// The improvement line of one trace: all comparisons at its heaviest load.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceImprovements {
    /// Trace name.
    pub trace: String,
    /// The heaviest load measured for the trace (largest `clients`).
    pub clients: u64,
    /// Each system vs `no-ac` (when it ran), each farside system vs `haproxy`,
    /// `haproxy-divided` and `envoy-ac` (those that ran), then `onesided-ac` vs `tcp-ac`.
    pub items: Vec<Improvement>,
}

impl TraceImprovements {
    /// One-line text form, e.g.
    /// `improvement zipf @ 640 clients (avg response time): tcp-ac vs no-ac 26.0%, ...`.
    pub fn line(&self) -> String {
        let items: Vec<String> = self
            .items
            .iter()
            .map(|i| {
                let v = i
                    .percent
                    .map_or_else(|| "n/a".to_string(), |p| format!("{p:.1}%"));
                format!("{} vs {} {v}", i.system, i.baseline)
            })
            .collect();
        format!(
            "improvement {} @ {} {} (avg response time): {}",
            self.trace,
            self.clients,
            load_header(&self.trace),
            items.join(", ")
        )
    }
}

/// The admission points of a summary, indexed for tables and figures.
///
/// A point's *label* is its system, or `system limit=N` when the summary sweeps more
/// than one admission limit (`lab admission --limits`): each label is one column of the
/// tables and one line of the figures.
struct Grid<'a> {
    points: Vec<&'a Point>,
    /// The label of each point of `points`.
    labels: Vec<String>,
    /// Panels (trace, with scenario and load model when not the default; see
    /// [`Point::panel`]) in order of first appearance.
    traces: Vec<String>,
    /// Labels present: `SYSTEMS` order (by limit within a system), then other systems
    /// in order of appearance.
    systems: Vec<String>,
    /// More than one admission limit was measured.
    multi_limit: bool,
}

impl<'a> Grid<'a> {
    fn new(s: &'a Summary<Point>) -> Grid<'a> {
        let points: Vec<&Point> = s.points.iter().collect();
        // Several limits of one system (a `--limits` sweep); systems with one limit each
        // (onesided-ac's and onesided-delay's differ) keep their plain names.
        let limits: BTreeSet<(&str, u64)> = points
            .iter()
            .filter_map(|p| Some((p.system.as_str(), p.limit?)))
            .collect();
        let systems_limited: BTreeSet<&str> = limits.iter().map(|l| l.0).collect();
        let multi_limit = limits.len() > systems_limited.len();
        let labels: Vec<String> = points.iter().map(|p| label(p, multi_limit)).collect();
        let mut traces: Vec<String> = Vec::new();
        for p in &points {
            let panel = p.panel();
            if !traces.contains(&panel) {
                traces.push(panel);
            }
        }
        // Sort labels by (rank of the system, limit, first appearance).
        let mut keyed: Vec<(usize, u64, usize, String)> = Vec::new();
        for (i, (p, l)) in points.iter().zip(&labels).enumerate() {
            if keyed.iter().any(|k| &k.3 == l) {
                continue;
            }
            let rank = SYSTEMS
                .iter()
                .position(|sys| *sys == p.system)
                .unwrap_or(SYSTEMS.len());
            keyed.push((rank, p.limit.unwrap_or(0), i, l.clone()));
        }
        keyed.sort();
        Grid {
            points,
            labels,
            traces,
            systems: keyed.into_iter().map(|k| k.3).collect(),
            multi_limit,
        }
    }

    /// Client counts measured for `trace`, ascending.
    fn clients(&self, trace: &str) -> Vec<u64> {
        let set: BTreeSet<u64> = self
            .points
            .iter()
            .filter(|p| p.panel() == trace)
            .map(|p| p.load_x())
            .collect();
        set.into_iter().collect()
    }

    /// The point of `label` (see [`Grid`]) at `trace` and `clients`.
    fn get(&self, label: &str, trace: &str, clients: u64) -> Option<&'a Point> {
        self.points
            .iter()
            .zip(&self.labels)
            .find(|(p, l)| *l == label && p.panel() == trace && p.load_x() == clients)
            .map(|(p, _)| *p)
    }

    /// The label of `p` in this grid.
    fn label_of(&self, p: &Point) -> String {
        label(p, self.multi_limit)
    }

    /// `(clients, f(point))` for one system's line on one trace, ascending clients.
    fn line(&self, system: &str, trace: &str, f: impl Fn(&Point) -> f64) -> Vec<(f64, f64)> {
        self.clients(trace)
            .into_iter()
            .filter_map(|c| self.get(system, trace, c).map(|p| (c as f64, f(p))))
            .collect()
    }

    fn improvements(&self, trace: &str) -> Option<TraceImprovements> {
        let clients = *self.clients(trace).last()?;
        let avg = |sys: &str| self.get(sys, trace, clients).map(|p| p.avg_ms);
        let pct = |system: &str, baseline: &str| Improvement {
            system: system.to_string(),
            baseline: baseline.to_string(),
            percent: match (avg(system), avg(baseline)) {
                (Some(x), Some(b)) if b > 0.0 => Some((b - x) / b * 100.0),
                _ => None,
            },
        };
        let has = |sys: &str| self.systems.iter().any(|s| s == sys);
        let anchors: Vec<&str> = ANCHORS.into_iter().filter(|a| has(a)).collect();
        // Against no-ac when it ran (or when nothing else is there to compare with).
        let mut items: Vec<Improvement> = if has(SYSTEM_NO_AC) || anchors.is_empty() {
            self.systems
                .iter()
                .filter(|s| *s != SYSTEM_NO_AC)
                .map(|s| pct(s, SYSTEM_NO_AC))
                .collect()
        } else {
            Vec::new()
        };
        // The farside systems against the anchor, HAProxy, in each configuration that ran.
        for anchor in anchors {
            for sys in self
                .systems
                .iter()
                .filter(|s| *s != SYSTEM_NO_AC && !ANCHORS.contains(&s.as_str()))
            {
                items.push(pct(sys, anchor));
            }
        }
        // One-sided against two-sided at the same limit.
        for sys in self.systems.iter().filter(|s| s.starts_with("onesided-ac")) {
            let tcp = sys.replacen("onesided-ac", "tcp-ac", 1);
            if self.systems.contains(&tcp) {
                items.push(pct(sys, &tcp));
            }
        }
        Some(TraceImprovements {
            trace: trace.to_string(),
            clients,
            items,
        })
    }
}

/// `system`, or `system limit=N` when the run swept several limits.
fn label(p: &Point, multi_limit: bool) -> String {
    match (multi_limit, p.limit) {
        (true, Some(l)) => format!("{} limit={l}", p.system),
        _ => p.system.clone(),
    }
}

/// One row of the scenario table: a (scenario, load model, trace, load) and, per
/// system of the grid, `(avg ms, p99 ms, goodput/s, drop rate)`.
struct ScenarioRow {
    scenario: String,
    load_model: String,
    trace: String,
    x: u64,
    cells: Vec<Option<(f64, f64, f64, f64)>>,
    /// Per system: where served time went ([`Split`]).
    splits: Vec<Option<Split>>,
}

/// Where a point's served time went: the proxy's queue, the proxy's whole time (queue +
/// back-end), the back-ends' queueing delay (mean, p99), ms; `None` where not measured.
#[derive(Clone, Copy)]
struct Split {
    proxy_queue: Option<f64>,
    proxy_time: Option<f64>,
    backend_queue: Option<f64>,
    backend_queue_p99: Option<f64>,
}

impl Split {
    fn of(p: &Point) -> Option<Split> {
        let s = Split {
            proxy_queue: p.proxy_queue_ms,
            proxy_time: p.proxy_time_ms,
            backend_queue: p.backend_queue_ms,
            backend_queue_p99: p.backend_queue_p99_ms,
        };
        [s.proxy_queue, s.proxy_time, s.backend_queue]
            .iter()
            .any(Option::is_some)
            .then_some(s)
    }

    fn cells(&self) -> [String; 4] {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        [
            f(self.proxy_queue),
            f(self.proxy_time),
            f(self.backend_queue),
            f(self.backend_queue_p99),
        ]
    }
}

/// The rows of the scenario table, in order of first appearance; empty when every point
/// is the plain closed-loop `single` case (the per-trace tables say it all then).
fn scenario_rows(g: &Grid) -> Vec<ScenarioRow> {
    let plain = |p: &Point| p.panel() == p.trace;
    if g.points.iter().all(|p| plain(p)) {
        return Vec::new();
    }
    let mut rows: Vec<ScenarioRow> = Vec::new();
    for p in &g.points {
        let scenario = if p.scenario.is_empty() {
            "single".to_string()
        } else {
            p.scenario.clone()
        };
        let load_model = if p.load_model.is_empty() {
            "closed".to_string()
        } else {
            p.load_model.clone()
        };
        let x = p.load_x();
        if rows.iter().any(|r| {
            r.scenario == scenario && r.load_model == load_model && r.trace == p.trace && r.x == x
        }) {
            continue;
        }
        let panel = p.panel();
        let cells = g
            .systems
            .iter()
            .map(|sys| {
                g.get(sys, &panel, x)
                    .map(|q| (q.avg_ms, q.p99_ms, q.tps, q.drop_rate))
            })
            .collect();
        let splits = g
            .systems
            .iter()
            .map(|sys| g.get(sys, &panel, x).and_then(Split::of))
            .collect();
        rows.push(ScenarioRow {
            scenario,
            load_model,
            trace: p.trace.clone(),
            x,
            cells,
            splits,
        });
    }
    rows
}

/// The scenario table as text (empty when [`scenario_rows`] is).
fn scenario_table_text(g: &Grid) -> String {
    let rows = scenario_rows(g);
    let mut out = String::new();
    if rows.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "scenarios — avg and p99 response time of served requests (ms), goodput (served/s), drop %"
    );
    let mut t = scenario_grid(
        &g.systems,
        [("avg ms", 9), ("p99 ms", 9), ("goodput", 9), ("drop%", 6)],
    );
    for r in &rows {
        let mut row = vec![
            r.scenario.clone(),
            r.load_model.clone(),
            r.trace.clone(),
            r.x.to_string(),
        ];
        for c in &r.cells {
            match c {
                Some((avg, p99, good, drop)) => row.extend([
                    format!("{avg:.2}"),
                    format!("{p99:.2}"),
                    format!("{good:.1}"),
                    format!("{:.1}", drop * 100.0),
                ]),
                None => row.extend(std::iter::repeat_n("-".to_string(), 4)),
            }
        }
        t.row(row);
    }
    out.push_str(&t.render());
    let _ = writeln!(
        out,
        "(x: clients in the closed loop, arrivals/s in the open loop)\n"
    );
    if rows.iter().all(|r| r.splits.iter().all(Option::is_none)) {
        return out;
    }
    let _ = writeln!(out, "{SPLIT_TITLE}");
    let mut t = scenario_grid(
        &g.systems,
        [
            ("p.queue", 8),
            ("p.time", 8),
            ("b.queue", 8),
            ("b.q p99", 9),
        ],
    );
    for r in &rows {
        let mut row = vec![
            r.scenario.clone(),
            r.load_model.clone(),
            r.trace.clone(),
            r.x.to_string(),
        ];
        for c in &r.splits {
            row.extend(c.map_or_else(|| std::array::from_fn(|_| "-".to_string()), |s| s.cells()));
        }
        t.row(row);
    }
    out.push_str(&t.render());
    let _ = writeln!(out, "{SPLIT_LEGEND}\n");
    out
}

/// The layout of the scenario tables: scenario, load model, trace and x, then per
/// system a group of four columns (`heads`) under the system's name.
fn scenario_grid(systems: &[String], heads: [(&str, usize); 4]) -> Table {
    let mut t = Table::new()
        .cols(
            "",
            Align::Left,
            [("scenario", 16), ("load", 7), ("trace", 9)],
        )
        .col("", "x", Align::Right, 8)
        .group("", 4);
    for sys in systems {
        t = system_group(t, sys, heads);
    }
    t.rule('-').trim_end()
}

/// One system's group of four columns (`heads`) under its name, after a `|`.
fn system_group(t: Table, sys: &str, heads: [(&str, usize); 4]) -> Table {
    let [(h0, w0), rest @ ..] = heads;
    t.col(" | ", h0, Align::Right, w0)
        .cols("", Align::Right, rest)
        .group(sys, 4)
}

/// Title of the where-time-went table.
const SPLIT_TITLE: &str = "where served time went (ms): the proxy's queue, the proxy's time \
(queue + back-end), the back-ends' queueing delay (mean, p99)";
/// What the where-time-went columns are and where they come from.
const SPLIT_LEGEND: &str = "(p.queue: HAProxy's qtime, its mean over its last 1024 requests \
at the point's end; farside: its mean wait for an upstream connection slot over the point \
(farside_proxy_upstream_wait_microseconds_total / _checkouts_total). p.time: farside: mean request duration at the proxy over the point; HAProxy: qtime + ctime \
+ rtime. b.queue: the back-ends' published queueing delay (gatherd's queue_delay_us, the age \
of the oldest unread request), every new reading during the point: the same measurement for \
every system. multi-proxy: the first proxy's figures.)";

/// The x axis of a panel: clients (closed loop) or the open loop's arrival rate.
fn load_header(panel: &str) -> &'static str {
    if panel.ends_with("-open") {
        "rate/s"
    } else {
        "clients"
    }
}

/// Per trace, the improvement of each admission-controlled system over
/// `no-ac` (and of `onesided-ac` over `tcp-ac`) at the heaviest load.
pub fn improvements(s: &Summary<Point>) -> Vec<TraceImprovements> {
    let g = Grid::new(s);
    g.traces.iter().filter_map(|t| g.improvements(t)).collect()
}

/// QoS threshold for `slow_rate` from `params` ([`PARAM_SLOW_MS_KEYS`]), else 1000 ms.
pub fn slow_ms<P>(s: &Summary<P>) -> f64 {
    PARAM_SLOW_MS_KEYS
        .iter()
        .find_map(|k| s.params.get(*k).and_then(|v| v.as_f64()))
        .unwrap_or(SLOW_MS_DEFAULT)
}

/// What the proxy's monitor saw at `trace`'s heaviest load, per admission system: how
/// long a load read took and how stale the proxy's view got (the mechanism behind the
/// difference between two-sided and one-sided admission). `None` without monitor figures.
fn monitor_line(g: &Grid, trace: &str) -> Option<String> {
    let &heaviest = g.clients(trace).last()?;
    let seen: Vec<String> = g
        .systems
        .iter()
        .filter_map(|sys| g.get(sys, trace, heaviest))
        .filter_map(|p| {
            Some(format!(
                "{} read p50 {:.0} µs p99 {:.0} µs, new record p99 every {:.1} ms",
                g.label_of(p),
                p.monitor_read_p50_us?,
                p.monitor_read_p99_us?,
                p.update_gap_p99_ms?
            ))
        })
        .collect();
    (!seen.is_empty()).then(|| {
        format!(
            "monitor {trace} @ {heaviest} {}: {}",
            load_header(trace),
            seen.join("; ")
        )
    })
}

/// The per-trace tables and the scenario tables (empty without points).
pub fn table(s: &Summary<Point>) -> String {
    let g = Grid::new(s);
    let mut out = String::new();
    for trace in &g.traces {
        let _ = writeln!(
            out,
            "{} — trace {trace}: avg response time, TPS, drop %, slow % (> {} ms)",
            s.experiment,
            fmt_num(slow_ms(s))
        );
        let mut t = Table::new()
            .col("", load_header(trace), Align::Right, 8)
            .group("", 1);
        for sys in &g.systems {
            t = system_group(
                t,
                sys,
                [("avg ms", 9), ("TPS", 8), ("drop%", 6), ("slow%", 6)],
            );
        }
        let mut t = t.rule('-').trim_end();
        for c in g.clients(trace) {
            let mut row = vec![c.to_string()];
            for sys in &g.systems {
                match g.get(sys, trace, c) {
                    Some(p) => row.extend([
                        format!("{:.2}", p.avg_ms),
                        format!("{:.1}", p.tps),
                        format!("{:.1}", p.drop_rate * 100.0),
                        format!("{:.1}", p.slow_rate * 100.0),
                    ]),
                    None => row.extend(std::iter::repeat_n("-".to_string(), 4)),
                }
            }
            t.row(row);
        }
        out.push_str(&t.render());
        if let Some(imp) = g.improvements(trace) {
            let _ = writeln!(out, "{}", imp.line());
        }
        if let Some(line) = monitor_line(&g, trace) {
            let _ = writeln!(out, "{line}");
        }
        // With repeated runs, the spread at the heaviest load says whether a difference
        // is larger than the noise.
        if let Some(&heaviest) = g.clients(trace).last() {
            let spread: Vec<String> = g
                .systems
                .iter()
                .filter_map(|sys| g.get(sys, trace, heaviest))
                .filter(|p| p.runs > 1)
                .map(|p| {
                    format!(
                        "{} {:.1} ± {:.1} ms, {:.0} ± {:.0} TPS",
                        g.label_of(p),
                        p.avg_ms,
                        p.avg_ms_sd,
                        p.tps,
                        p.tps_sd
                    )
                })
                .collect();
            if !spread.is_empty() {
                let runs = g.get(&g.systems[0], trace, heaviest).map_or(0, |p| p.runs);
                let _ = writeln!(
                    out,
                    "spread {trace} @ {heaviest} {} (mean ± sd of {runs} runs): {}",
                    load_header(trace),
                    spread.join("; ")
                );
            }
        }
        out.push('\n');
    }
    out.push_str(&scenario_table_text(&g));
    out.push_str(&class_table_text(&g));
    out.push_str(&peaks_text(&g));
    out
}

/// Per panel (trace, scenario, load model) and system, the goodput peak two ways
/// ([`crate::peak`]): raw, and over the loads where at most [`FAILURE_BOUND`] of the
/// attempts failed or timed out. A 503 is an answer, counted in drop %, not a failure.
fn peaks_text(g: &Grid) -> String {
    let pts: Vec<Measured> = (g.points.iter().zip(&g.labels))
        .map(|(p, l)| Measured {
            panel: p.panel(),
            system: l.clone(),
            at: match load_header(&p.panel()) {
                "rate/s" => format!("{}/s", p.load_x()),
                _ => format!("{} clients", p.load_x()),
            },
            value: p.tps,
            failed: failed_fraction(p.failures, p.attempts),
        })
        .collect();
    format!(
        "peak goodput (served/s), per panel and system: raw, and over the loads with {} \
         (failures / attempts: requests that failed or timed out; a 503 is an answer, \
         counted in drop%)\n{}",
        bound_label(FAILURE_BOUND),
        grouped_lines(&pts, FAILURE_BOUND, 1)
    )
}

/// The per-class breakdown table (`crate::scenario::class_table_text`); empty when no
/// point has one (runs that predate it render as before).
fn class_table_text(g: &Grid) -> String {
    crate::scenario::class_table_text(g.points.iter().map(|p| {
        let head = [p.scenario.clone(), p.load_model.clone(), g.label_of(p)];
        (head, p.load_x(), &p.classes[..])
    }))
}

/// `points.csv` (always, header only without points) and the per-second series files.
pub fn files(s: &Summary<Point>) -> io::Result<Vec<(String, String)>> {
    let g = Grid::new(s);
    let mut out = vec![("points.csv".to_string(), points_csv(&g.points)?)];
    for p in &g.points {
        if !p.series.is_empty() {
            out.push((series_file_name(p, g.multi_limit), series_csv(&p.series)?));
        }
    }
    Ok(out)
}

/// `series-<system>-<trace>-<clients>.csv`, or `series-<system>-limit<N>-<trace>-<clients>.csv`
/// for an admission-controlled point of a run that swept several limits.
pub fn series_file_name(p: &Point, multi_limit: bool) -> String {
    let limit = match (multi_limit, p.limit) {
        (true, Some(l)) => format!("-limit{l}"),
        _ => String::new(),
    };
    format!(
        "series-{}{limit}-{}-{}.csv",
        sanitize(&p.system),
        sanitize(&p.panel()),
        p.load_x()
    )
}

fn points_csv(points: &[&Point]) -> io::Result<String> {
    csv_text(
        &Point::CSV_COLUMNS,
        points.iter().map(|p| p.csv_row().to_vec()),
    )
}

fn series_csv(series: &[SecondPoint]) -> io::Result<String> {
    csv_text(
        &["t_s", "served", "dropped", "drop_rate", "avg_ms"],
        series.iter().map(|sp| {
            vec![
                sp.t_s.to_string(),
                sp.served.to_string(),
                sp.dropped.to_string(),
                sp.drop_rate().to_string(),
                sp.avg_ms.to_string(),
            ]
        }),
    )
}

/// `(file name, caption, svg)` for every figure, in a fixed order.
pub fn figures(s: &Summary<Point>) -> Vec<Figure> {
    let g = Grid::new(s);
    let g = &g;
    let mut out = Vec::new();
    let slow = fmt_num(slow_ms(s));
    for trace in &g.traces {
        let t = sanitize(trace);
        // Error bars: ± one standard deviation over the repeats (none for one run).
        let chart =
            |title: &str, y: &str, f: &dyn Fn(&Point) -> f64, sd: &dyn Fn(&Point) -> f64| {
                let mut c = Chart::new(title, load_header(trace), y);
                for sys in &g.systems {
                    let err = g.line(sys, trace, sd).into_iter().map(|p| p.1).collect();
                    c = c.series_err(sys, g.line(sys, trace, f), err);
                }
                c.to_svg()
            };
        out.push((
            format!("fig-avg-{t}.svg"),
            format!("Average response time vs load, trace {trace} (Fig. 5(a)/10)"),
            chart(
                &format!("Average response time — {trace}"),
                "avg response time (ms)",
                &|p| p.avg_ms,
                &|p| p.avg_ms_sd,
            ),
        ));
        out.push((
            format!("fig-tps-{t}.svg"),
            format!("Aggregate throughput vs load, trace {trace} (Fig. 5(b))"),
            chart(
                &format!("Throughput — {trace}"),
                "served requests per second (TPS)",
                &|p| p.tps,
                &|p| p.tps_sd,
            ),
        ));
        out.push((
            format!("fig-slow-{t}.svg"),
            format!("Requests missing the {slow} ms QoS target vs load, trace {trace} (Fig. 9)"),
            chart(
                &format!("Requests slower than {slow} ms — {trace}"),
                "slow requests (% of served)",
                &|p| p.slow_rate * 100.0,
                &|p| p.slow_rate_sd * 100.0,
            ),
        ));
        let Some(&heaviest) = g.clients(trace).last() else {
            continue;
        };
        if g.multi_limit {
            out.push((
                format!("fig-rt-goodput-{t}.svg"),
                format!(
                    "Response time against goodput across admission limits, {heaviest} clients, trace {trace}"
                ),
                rt_goodput_chart(g, trace, heaviest),
            ));
        }
        let sampled: Vec<&Point> = g
            .systems
            .iter()
            .filter_map(|sys| g.get(sys, trace, heaviest))
            .filter(|p| !p.requests.is_empty())
            .collect();
        if !sampled.is_empty() {
            let mut c = Chart::new(
                &format!("Response time of each request, {heaviest} clients — {trace}"),
                "request start (s)",
                "response time (ms, log)",
            )
            .log_y(true)
            .hline(slow_ms(s), &format!("QoS {slow} ms"));
            for p in &sampled {
                c = c.scatter(&g.label_of(p), p.requests.clone());
            }
            out.push((
                format!("fig-requests-{t}.svg"),
                format!(
                    "Response time of served requests (a thinned sample) at {heaviest} clients, trace {trace} (Fig. 6)"
                ),
                c.to_svg(),
            ));
        }
        let with_series: Vec<&Point> = g
            .systems
            .iter()
            .filter_map(|sys| g.get(sys, trace, heaviest))
            .filter(|p| !p.series.is_empty())
            .collect();
        if with_series.is_empty() {
            continue;
        }
        let rt: Vec<(String, Vec<(f64, f64)>)> = with_series
            .iter()
            .map(|p| {
                let pts = p
                    .series
                    .iter()
                    // A second with nothing served has no response time: a gap.
                    .map(|sp| {
                        (
                            sp.t_s as f64,
                            if sp.served == 0 { f64::NAN } else { sp.avg_ms },
                        )
                    })
                    .collect();
                (g.label_of(p), pts)
            })
            .collect();
        let positive = rt
            .iter()
            .flat_map(|(_, v)| v.iter().map(|p| p.1))
            .filter(|y| y.is_finite() && *y > 0.0);
        let (lo, hi) = positive.fold((f64::INFINITY, 0.0f64), |(lo, hi), y| {
            (lo.min(y), hi.max(y))
        });
        let log = lo.is_finite() && hi / lo > LOG_AXIS_RATIO_MIN;
        let mut c = Chart::new(
            &format!("Per-second response time, {heaviest} clients — {trace}"),
            "time (s)",
            "avg response time in the second (ms)",
        )
        .log_y(log);
        if log || hi >= slow_ms(s) {
            c = c.hline(slow_ms(s), &format!("QoS {slow} ms"));
        }
        for (name, pts) in rt {
            c = c.series(&name, pts);
        }
        out.push((
            format!("fig-series-rt-{t}.svg"),
            format!("Instant response time at {heaviest} clients, trace {trace} (Fig. 6)"),
            c.to_svg(),
        ));
        let mut c = Chart::new(
            &format!("Per-second drop rate, {heaviest} clients — {trace}"),
            "time (s)",
            "dropped (% of attempts in the second)",
        );
        for p in &with_series {
            let pts = p
                .series
                .iter()
                .map(|sp| (sp.t_s as f64, sp.drop_rate() * 100.0))
                .collect();
            c = c.series(&g.label_of(p), pts);
        }
        out.push((
            format!("fig-series-drop-{t}.svg"),
            format!("Instant drop rate at {heaviest} clients, trace {trace} (Fig. 7)"),
            c.to_svg(),
        ));
    }
    out
}

/// Response time against goodput at `clients`, one line per system across its limits
/// (ascending limit), no-ac as a single point; error bars ± 1 sd of the response time.
fn rt_goodput_chart(g: &Grid, trace: &str, clients: u64) -> String {
    let mut c = Chart::new(
        &format!("Response time vs goodput across limits, {clients} clients — {trace}"),
        "goodput (served requests/s)",
        "avg response time (ms)",
    );
    let mut systems: Vec<&str> = Vec::new();
    for p in &g.points {
        if !systems.contains(&p.system.as_str()) {
            systems.push(&p.system);
        }
    }
    systems.sort_by_key(|sys| {
        SYSTEMS
            .iter()
            .position(|x| x == sys)
            .unwrap_or(SYSTEMS.len())
    });
    for sys in systems {
        let mut pts: Vec<&Point> = g
            .points
            .iter()
            .filter(|p| p.system == sys && p.panel() == trace && p.load_x() == clients)
            .copied()
            .collect();
        pts.sort_by_key(|p| p.limit.unwrap_or(0));
        c = c.series_err(
            sys,
            pts.iter().map(|p| (p.tps, p.avg_ms)).collect(),
            pts.iter().map(|p| p.avg_ms_sd).collect(),
        );
    }
    c.to_svg()
}

/// The HAProxy configuration, the per-trace tables and the scenario tables of
/// `report.html`.
pub fn html(s: &Summary<Point>) -> String {
    let g = Grid::new(s);
    let g = &g;
    let mut out = String::new();
    out.push_str(&crate::haproxy::anchors_html(&s.params));

    if !g.traces.is_empty() {
        let _ = writeln!(out, "<h2>Results</h2>");
    }
    for trace in &g.traces {
        let _ = writeln!(
            out,
            "<h3>Trace {}</h3>\n<table>\n<tr><th rowspan=\"2\">{}</th>",
            escape(trace),
            load_header(trace)
        );
        for sys in &g.systems {
            let _ = write!(out, "<th colspan=\"4\">{}</th>", escape(sys));
        }
        out.push_str("</tr>\n<tr>");
        for _ in &g.systems {
            out.push_str("<th>avg ms</th><th>TPS</th><th>drop %</th><th>slow %</th>");
        }
        out.push_str("</tr>\n");
        for c in g.clients(trace) {
            let _ = write!(out, "<tr><td>{c}</td>");
            for sys in &g.systems {
                match g.get(sys, trace, c) {
                    Some(p) => {
                        let _ = write!(
                            out,
                            "<td>{:.2}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td>",
                            p.avg_ms,
                            p.tps,
                            p.drop_rate * 100.0,
                            p.slow_rate * 100.0
                        );
                    }
                    None => out.push_str(r#"<td class="missing" colspan="4">—</td>"#),
                }
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table>\n");
        if let Some(imp) = g.improvements(trace) {
            let _ = writeln!(out, "<p class=\"imp\">{}</p>", escape(&imp.line()));
        }
        if let Some(line) = monitor_line(g, trace) {
            let _ = writeln!(out, "<p class=\"imp\">{}</p>", escape(&line));
        }
    }

    let rows = scenario_rows(g);
    if !rows.is_empty() {
        out.push_str("<h2>Scenarios</h2>\n<p class=\"meta\">Per scenario and load model: avg and p99 response time of served requests (ms), goodput (served/s) and drop rate (%).</p>\n<table>\n<tr><th>scenario</th><th>load</th><th>trace</th><th>clients or rate/s</th>");
        for sys in &g.systems {
            let _ = write!(out, "<th colspan=\"4\">{}</th>", escape(sys));
        }
        out.push_str("</tr>\n");
        for r in &rows {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                escape(&r.scenario),
                escape(&r.load_model),
                escape(&r.trace),
                r.x
            );
            for c in &r.cells {
                match c {
                    Some((avg, p99, good, drop)) => {
                        let _ = write!(
                            out,
                            "<td>{avg:.2}</td><td>{p99:.2}</td><td>{good:.1}</td><td>{:.1}</td>",
                            drop * 100.0
                        );
                    }
                    None => out.push_str(r#"<td class="missing" colspan="4">—</td>"#),
                }
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table>\n");
        if rows.iter().any(|r| r.splits.iter().any(Option::is_some)) {
            let _ = write!(
                out,
                "<h3>Where served time went</h3>\n<p class=\"meta\">{}</p>\n<table>\n<tr><th>scenario</th><th>load</th><th>trace</th><th>clients or rate/s</th>",
                escape(SPLIT_TITLE)
            );
            for sys in &g.systems {
                let _ = write!(out, "<th colspan=\"4\">{}</th>", escape(sys));
            }
            out.push_str("</tr>\n<tr><th></th><th></th><th></th><th></th>");
            for _ in &g.systems {
                out.push_str("<th>p.queue</th><th>p.time</th><th>b.queue</th><th>b.q p99</th>");
            }
            out.push_str("</tr>\n");
            for r in &rows {
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                    escape(&r.scenario),
                    escape(&r.load_model),
                    escape(&r.trace),
                    r.x
                );
                for c in &r.splits {
                    match c {
                        Some(sp) => {
                            for v in sp.cells() {
                                let _ = write!(out, "<td>{}</td>", escape(&v));
                            }
                        }
                        None => out.push_str(r#"<td class="missing" colspan="4">—</td>"#),
                    }
                }
                out.push_str("</tr>\n");
            }
            let _ = writeln!(
                out,
                "</table>\n<p class=\"meta\">{}</p>",
                escape(SPLIT_LEGEND)
            );
        }
    }

    out
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
