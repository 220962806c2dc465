//! Outputs of a lab run: the text table on the terminal, and into `--out DIR`
//! `summary.json`, CSV files (written with the `csv` crate), SVG figures ([`crate::svg`],
//! the lab's one plotting module) and a self-contained `report.html`. The sweep runner
//! calls [`write_all`] on the summary it rebuilds from `points.jsonl`, as
//! `farside lab report DIR` does ([`crate::sweep::regenerate`]).
//!
//! Files written by [`write_all`] (names are stable; `<trace>` and `<system>`
//! are sanitised to `[A-Za-z0-9._-]`):
//!
//! | file | content |
//! |---|---|
//! | `summary.json` | [`Summary`], pretty JSON, without per-second series |
//! | `points.csv` | one row per admission point (written when there are admission points or no points at all) |
//! | `probe.csv` | one row per probe point (when there are probe points) |
//! | `series-<system>[-limit<N>]-<trace>-<clients>.csv` | per-second series of one admission point (`-limit<N>` when several limits were swept) |
//! | `fig-avg-<trace>.svg` | avg response time vs clients, one line per system, error bars ± 1 sd over repeats (Fig. 5(a), 10) |
//! | `fig-tps-<trace>.svg` | TPS vs clients, error bars (Fig. 5(b)) |
//! | `fig-slow-<trace>.svg` | % of served requests over the QoS threshold vs clients (Fig. 9) |
//! | `fig-rt-goodput-<trace>.svg` | avg response time against goodput across the swept limits, heaviest load (`--limits`) |
//! | `fig-requests-<trace>.svg` | response time of each served request (thinned sample), log y, QoS line, heaviest load (Fig. 6) |
//! | `fig-series-rt-<trace>.svg` | per-second avg response time at the heaviest load |
//! | `fig-series-drop-<trace>.svg` | per-second (instant) drop rate over the run at the heaviest load (Fig. 7) |
//! | `fig-probe-p99-<size>B.svg`, `fig-probe-p50-<size>B.svg` | probe p99 / p50 vs background load, one line per transport, log y |
//! | `fig-probe-size-load<N>.svg` | probe p50 vs read size at background load N (Fig. 4a) |
//! | `fig7-tps-<scenario>.svg`, `fig8-nodes-<scenario>-L<burst>.svg`, `fig9-…` | `lab reconfig`: TPS vs burst length per system; nodes serving the loaded site over time at L = 512 and the burst closest to 8,096 (seed 001's Fig. 7-9; `reconfig::figures`) |
//! | `speculative.csv`, `fig-spec-conn-<panel>.svg`, `fig-spec-rt-<panel>.svg` | `lab speculative`: rows; conn/s and avg response time vs offered rate per panel (`single`: Fig. 1, `split-67-33`, `split-75-25`: Fig. 2/3), one line per system |
//! | `report.html` | title, run metadata and warnings, parameters, tables, improvements, figures inlined, notes |
//!
//! Everything is a pure function of the [`Summary`]: the same input gives
//! byte-identical files. Where several points share a label, trace and client count, the
//! first one is used in tables and figures.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::summary::{Point, ProbePoint, SecondPoint, Summary, SYSTEMS, SYSTEM_NO_AC};

/// The anchor system of `lab admission` (HAProxy), compared against in the improvement
/// lines when it ran.
const SYSTEM_HAPROXY: &str = "haproxy";
use crate::svg::{escape, Chart};

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
    /// Each system vs `no-ac` (when it ran), each farside system vs `haproxy` (when it
    /// ran), then `onesided-ac` vs `tcp-ac`.
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
    fn new(s: &'a Summary) -> Grid<'a> {
        let points: Vec<&Point> = s.admission_points().collect();
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
        // Against no-ac when it ran (or when nothing else is there to compare with).
        let mut items: Vec<Improvement> = if has(SYSTEM_NO_AC) || !has(SYSTEM_HAPROXY) {
            self.systems
                .iter()
                .filter(|s| *s != SYSTEM_NO_AC)
                .map(|s| pct(s, SYSTEM_NO_AC))
                .collect()
        } else {
            Vec::new()
        };
        // The farside systems against the anchor, HAProxy.
        if has(SYSTEM_HAPROXY) {
            for sys in self
                .systems
                .iter()
                .filter(|s| *s != SYSTEM_NO_AC && *s != SYSTEM_HAPROXY)
            {
                items.push(pct(sys, SYSTEM_HAPROXY));
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
    const CELL: usize = 36; // width of one system's four columns
    let _ = writeln!(
        out,
        "scenarios — avg and p99 response time of served requests (ms), goodput (served/s), drop %"
    );
    let mut head1 = format!("{:<16}{:<7}{:<9}{:>8} ", "", "", "", "");
    let mut head2 = format!("{:<16}{:<7}{:<9}{:>8} ", "scenario", "load", "trace", "x");
    for sys in &g.systems {
        let _ = write!(head1, "| {sys:^w$} ", w = CELL - 3);
        let _ = write!(
            head2,
            "| {:>9}{:>9}{:>9}{:>6} ",
            "avg ms", "p99 ms", "goodput", "drop%"
        );
    }
    let _ = writeln!(out, "{}", head1.trim_end());
    let _ = writeln!(out, "{}", head2.trim_end());
    let _ = writeln!(out, "{}", "-".repeat(head2.trim_end().chars().count()));
    for r in &rows {
        let mut row = format!(
            "{:<16}{:<7}{:<9}{:>8} ",
            r.scenario, r.load_model, r.trace, r.x
        );
        for c in &r.cells {
            match c {
                Some((avg, p99, good, drop)) => {
                    let _ = write!(
                        row,
                        "| {avg:>9.2}{p99:>9.2}{good:>9.1}{:>6.1} ",
                        drop * 100.0
                    );
                }
                None => {
                    let _ = write!(row, "| {:>9}{:>9}{:>9}{:>6} ", "-", "-", "-", "-");
                }
            }
        }
        let _ = writeln!(out, "{}", row.trim_end());
    }
    let _ = writeln!(
        out,
        "(x: clients in the closed loop, arrivals/s in the open loop)\n"
    );
    if rows.iter().all(|r| r.splits.iter().all(Option::is_none)) {
        return out;
    }
    let _ = writeln!(out, "{SPLIT_TITLE}");
    let mut head1 = format!("{:<16}{:<7}{:<9}{:>8} ", "", "", "", "");
    let mut head2 = format!("{:<16}{:<7}{:<9}{:>8} ", "scenario", "load", "trace", "x");
    for sys in &g.systems {
        let _ = write!(head1, "| {sys:^w$} ", w = CELL - 3);
        let _ = write!(
            head2,
            "| {:>8}{:>8}{:>8}{:>9} ",
            "p.queue", "p.time", "b.queue", "b.q p99"
        );
    }
    let _ = writeln!(out, "{}", head1.trim_end());
    let _ = writeln!(out, "{}", head2.trim_end());
    let _ = writeln!(out, "{}", "-".repeat(head2.trim_end().chars().count()));
    for r in &rows {
        let mut row = format!(
            "{:<16}{:<7}{:<9}{:>8} ",
            r.scenario, r.load_model, r.trace, r.x
        );
        for c in &r.splits {
            let [a, b, c2, d] =
                c.map_or_else(|| std::array::from_fn(|_| "-".to_string()), |s| s.cells());
            let _ = write!(row, "| {a:>8}{b:>8}{c2:>8}{d:>9} ");
        }
        let _ = writeln!(out, "{}", row.trim_end());
    }
    let _ = writeln!(out, "{SPLIT_LEGEND}\n");
    out
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
pub fn improvements(s: &Summary) -> Vec<TraceImprovements> {
    let g = Grid::new(s);
    g.traces.iter().filter_map(|t| g.improvements(t)).collect()
}

/// QoS threshold for `slow_rate` from `params` ([`PARAM_SLOW_MS_KEYS`]), else 1000 ms.
pub fn slow_ms(s: &Summary) -> f64 {
    PARAM_SLOW_MS_KEYS
        .iter()
        .find_map(|k| s.params.get(*k).and_then(|v| v.as_f64()))
        .unwrap_or(SLOW_MS_DEFAULT)
}

/// Prints the paper's Fig. 5/9/10 numbers as text: per trace, one row per
/// client count and, per system, avg ms, TPS, drop % and slow %; then the
/// trace's improvement line. Probe points get their own table.
pub fn print_table(s: &Summary, w: &mut impl Write) -> io::Result<()> {
    w.write_all(table_text(s).as_bytes())
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

/// What ran where: commit, kernel, CPU, seed, whether the run was quick or unfinished,
/// and every privileged setting that was not applied (one per line).
pub fn run_lines(s: &Summary) -> String {
    let mut out = String::new();
    let dirty = match s.commit_dirty {
        Some(true) => " (dirty tree)",
        _ => "",
    };
    let _ = writeln!(
        out,
        "commit {}{dirty}; kernel {}; CPU {} x {}; seed {}",
        s.commit.as_deref().unwrap_or("unknown"),
        if s.kernel.is_empty() {
            "unknown"
        } else {
            &s.kernel
        },
        s.cpus,
        if s.cpu_model.is_empty() {
            "unknown"
        } else {
            &s.cpu_model
        },
        s.seed.map_or_else(|| "none".to_string(), |x| x.to_string())
    );
    if s.quick {
        let _ = writeln!(
            out,
            "quick run: for demos and smoke tests, not for comparison"
        );
    }
    if !s.finished {
        let _ = writeln!(
            out,
            "unfinished sweep: points so far only (`--resume DIR` continues it)"
        );
    }
    for (name, st) in &s.settings {
        if !st.applied {
            let _ = writeln!(
                out,
                "warning: {name} = {} not applied: {}",
                st.requested,
                st.reason.as_deref().unwrap_or("unknown reason")
            );
        }
    }
    // The one operator objective and what it set for each system (`lab admission`).
    if let Some(rule) = s.params.get("objective_rule").and_then(|v| v.as_str()) {
        let _ = writeln!(out, "objective: {rule}");
    }
    if let Some(by) = s
        .params
        .get("proxy_args_by_system")
        .and_then(|v| v.as_object())
    {
        for (sys, args) in by {
            let args: Vec<&str> = args
                .as_array()
                .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
                .unwrap_or_default();
            let _ = writeln!(out, "proxy args {sys}: {}", args.join(" "));
        }
    }
    out
}

/// The text of [`print_table`].
pub fn table_text(s: &Summary) -> String {
    let g = Grid::new(s);
    let mut out = run_lines(s);
    out.push('\n');
    const CELL: usize = 32; // width of one system's four columns
    for trace in &g.traces {
        let _ = writeln!(
            out,
            "{} — trace {trace}: avg response time, TPS, drop %, slow % (> {} ms)",
            s.experiment,
            fmt_num(slow_ms(s))
        );
        let mut head1 = format!("{:>8} ", "");
        let mut head2 = format!("{:>8} ", load_header(trace));
        for sys in &g.systems {
            let _ = write!(head1, "| {sys:^w$} ", w = CELL - 3);
            let _ = write!(
                head2,
                "| {:>9}{:>8}{:>6}{:>6} ",
                "avg ms", "TPS", "drop%", "slow%"
            );
        }
        let _ = writeln!(out, "{}", head1.trim_end());
        let _ = writeln!(out, "{}", head2.trim_end());
        let _ = writeln!(out, "{}", "-".repeat(head2.trim_end().chars().count()));
        for c in g.clients(trace) {
            let mut row = format!("{c:>8} ");
            for sys in &g.systems {
                match g.get(sys, trace, c) {
                    Some(p) => {
                        let _ = write!(
                            row,
                            "| {:>9.2}{:>8.1}{:>6.1}{:>6.1} ",
                            p.avg_ms,
                            p.tps,
                            p.drop_rate * 100.0,
                            p.slow_rate * 100.0
                        );
                    }
                    None => {
                        let _ = write!(row, "| {:>9}{:>8}{:>6}{:>6} ", "-", "-", "-", "-");
                    }
                }
            }
            let _ = writeln!(out, "{}", row.trim_end());
        }
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
    let probes: Vec<&ProbePoint> = s.probe_points().collect();
    if !probes.is_empty() {
        let _ = writeln!(
            out,
            "{} — remote read round trip (µs; timed-out reads count as the timeout)",
            s.experiment
        );
        // With repeats, the spread of p50 and p99 across runs says what is noise.
        let spread = probes.iter().any(|p| p.runs > 1);
        let mut head = format!(
            "{:<12}{:>6}{:>9}{:>10}{:>10}{:>10}{:>10}{:>10}{:>9}",
            "transport",
            "load",
            "size B",
            "samples",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "max us",
            "timeouts"
        );
        if spread {
            let _ = write!(head, "{:>10}{:>10}", "p50 sd", "p99 sd");
        }
        let _ = writeln!(out, "{head}");
        let _ = writeln!(out, "{}", "-".repeat(head.chars().count()));
        for p in probes {
            let _ = write!(
                out,
                "{:<12}{:>6}{:>9}{:>10}{:>10.1}{:>10.1}{:>10.1}{:>10.1}{:>9}",
                p.transport,
                p.background_load,
                p.size_bytes,
                p.samples,
                p.p50_us,
                p.p99_us,
                p.p999_us,
                p.max_us,
                p.timeouts
            );
            if spread {
                let _ = write!(out, "{:>10.1}{:>10.1}", p.p50_us_sd, p.p99_us_sd);
            }
            out.push('\n');
        }
        out.push('\n');
    }
    let faults: Vec<&crate::faults::FaultRow> = s.fault_rows().collect();
    if !faults.is_empty() {
        out.push_str(&crate::faults::table(&faults));
        if let Some(bound) = s.params.get("fresh_bound_ms").and_then(|v| v.as_f64()) {
            let met = crate::faults::targets_met(&faults, bound);
            let _ = writeln!(
                out,
                "targets (no hung request; fresh view <= {bound:.0} ms after the gatherd \
                 restart command): {}",
                if met { "met" } else { "NOT met" }
            );
        }
        out.push('\n');
    }
    let reconfig: Vec<&crate::reconfig::ReconfigPoint> = s.reconfig_points().collect();
    if !reconfig.is_empty() {
        out.push_str(&crate::reconfig::table(&reconfig));
        out.push('\n');
    }
    let spec: Vec<&crate::speculative::SpecPoint> = s.speculative_points().collect();
    if !spec.is_empty() {
        out.push_str(&crate::speculative::table(&spec));
        out.push('\n');
    }
    if s.points.is_empty() {
        let _ = writeln!(out, "{}: no points measured", s.experiment);
    }
    out
}

/// Writes every output of the run into `dir` (created if missing) and
/// returns the paths written, in writing order. See the module docs for the list.
pub fn write_all(s: &Summary, dir: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let mut put = |name: &str, text: &str| -> io::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        written.push(path);
        Ok(())
    };
    put("summary.json", &(s.to_json_pretty() + "\n"))?;
    let g = Grid::new(s);
    if !g.points.is_empty() || s.points.is_empty() {
        put("points.csv", &points_csv(&g.points)?)?;
    }
    let probes: Vec<&ProbePoint> = s.probe_points().collect();
    if !probes.is_empty() {
        put("probe.csv", &probe_csv(&probes)?)?;
    }
    let faults: Vec<&crate::faults::FaultRow> = s.fault_rows().collect();
    if !faults.is_empty() {
        put("faults.csv", &faults_csv(&faults)?)?;
        put("table.txt", &table_text(s))?;
    }
    let reconfig: Vec<&crate::reconfig::ReconfigPoint> = s.reconfig_points().collect();
    if !reconfig.is_empty() {
        put("reconfig.csv", &crate::reconfig::csv(&reconfig))?;
        put("table.txt", &table_text(s))?;
        for p in &reconfig {
            let (name, body) = crate::reconfig::series_csv(p);
            put(&name, &body)?;
        }
    }
    let spec: Vec<&crate::speculative::SpecPoint> = s.speculative_points().collect();
    if !spec.is_empty() {
        put("speculative.csv", &crate::speculative::csv(&spec))?;
        put("table.txt", &table_text(s))?;
    }
    for p in &g.points {
        if !p.series.is_empty() {
            put(&series_file_name(p, g.multi_limit), &series_csv(&p.series)?)?;
        }
    }
    let figures = figures(s, &g);
    for (name, _, svg) in &figures {
        put(name, svg)?;
    }
    put("report.html", &html(s, &g, &figures))?;
    Ok(written)
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

/// CSV text of `rows` under `head` (RFC 4180 quoting by the `csv` crate).
fn csv_text(head: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> io::Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(head).map_err(io::Error::other)?;
    for r in rows {
        w.write_record(&r).map_err(io::Error::other)?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| io::Error::other(e.to_string()))?;
    String::from_utf8(bytes).map_err(io::Error::other)
}

fn points_csv(points: &[&Point]) -> io::Result<String> {
    // Absent monitor figures (no-ac) and limits are empty fields.
    let opt = |v: Option<f64>| v.map(|x| x.to_string()).unwrap_or_default();
    csv_text(
        &[
            "system",
            "trace",
            "clients",
            "transport",
            "avg_ms",
            "p50_ms",
            "p90_ms",
            "p99_ms",
            "max_ms",
            "tps",
            "drop_rate",
            "slow_rate",
            "attempts",
            "served",
            "dropped",
            "failures",
            "monitor_read_p50_us",
            "monitor_read_p99_us",
            "update_gap_p99_ms",
            "limit",
            "runs",
            "avg_ms_sd",
            "tps_sd",
            "p99_ms_sd",
            "drop_rate_sd",
            "slow_rate_sd",
            "scenario",
            "load_model",
            "rate_x",
            "rate_rps",
            "offered_rps",
            "goodput",
            "reject_p99_ms",
            "inflight_at_end",
        ],
        points.iter().map(|p| {
            vec![
                p.system.clone(),
                p.trace.clone(),
                p.clients.to_string(),
                p.transport.clone(),
                p.avg_ms.to_string(),
                p.p50_ms.to_string(),
                p.p90_ms.to_string(),
                p.p99_ms.to_string(),
                p.max_ms.to_string(),
                p.tps.to_string(),
                p.drop_rate.to_string(),
                p.slow_rate.to_string(),
                p.attempts.to_string(),
                p.served.to_string(),
                p.dropped.to_string(),
                p.failures.to_string(),
                opt(p.monitor_read_p50_us),
                opt(p.monitor_read_p99_us),
                opt(p.update_gap_p99_ms),
                p.limit.map(|l| l.to_string()).unwrap_or_default(),
                p.runs.to_string(),
                p.avg_ms_sd.to_string(),
                p.tps_sd.to_string(),
                p.p99_ms_sd.to_string(),
                p.drop_rate_sd.to_string(),
                p.slow_rate_sd.to_string(),
                p.scenario.clone(),
                p.load_model.clone(),
                opt(p.rate_x),
                opt(p.rate_rps),
                p.offered_rps.to_string(),
                p.goodput.to_string(),
                p.reject_p99_ms.to_string(),
                p.inflight_at_end.to_string(),
            ]
        }),
    )
}

fn faults_csv(rows: &[&crate::faults::FaultRow]) -> io::Result<String> {
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    csv_text(
        &[
            "fault",
            "runs",
            "started",
            "answered",
            "refused_503",
            "failed",
            "failed_connect",
            "failed_io",
            "failed_malformed",
            "failed_5xx",
            "hung",
            "inflight_at_end",
            "time_to_fresh_ms",
            "stale_at_repair",
            "repair_ms",
            "time_to_fresh_from_repair_cmd_ms",
        ],
        rows.iter().map(|r| {
            vec![
                r.fault.clone(),
                r.runs.to_string(),
                r.started.to_string(),
                r.answered.to_string(),
                r.refused_503.to_string(),
                r.failed.to_string(),
                r.failed_connect.to_string(),
                r.failed_io.to_string(),
                r.failed_malformed.to_string(),
                r.failed_5xx.to_string(),
                r.hung.to_string(),
                r.inflight_at_end.to_string(),
                opt(r.time_to_fresh_ms),
                r.stale_at_repair.to_string(),
                opt(r.repair_ms),
                opt(r.time_to_fresh_from_repair_cmd_ms),
            ]
        }),
    )
}

fn probe_csv(points: &[&ProbePoint]) -> io::Result<String> {
    csv_text(
        &[
            "transport",
            "background_load",
            "size_bytes",
            "samples",
            "p50_us",
            "p99_us",
            "p999_us",
            "max_us",
            "timeouts",
            "runs",
            "p50_us_sd",
            "p99_us_sd",
        ],
        points.iter().map(|p| {
            vec![
                p.transport.clone(),
                p.background_load.to_string(),
                p.size_bytes.to_string(),
                p.samples.to_string(),
                p.p50_us.to_string(),
                p.p99_us.to_string(),
                p.p999_us.to_string(),
                p.max_us.to_string(),
                p.timeouts.to_string(),
                p.runs.to_string(),
                p.p50_us_sd.to_string(),
                p.p99_us_sd.to_string(),
            ]
        }),
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
fn figures(s: &Summary, g: &Grid) -> Vec<(String, String, String)> {
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
    let probes: Vec<&ProbePoint> = s.probe_points().collect();
    let sizes: BTreeSet<u64> = probes.iter().map(|p| p.size_bytes).collect();
    for size in sizes {
        let mut transports: Vec<&str> = Vec::new();
        for p in &probes {
            if !transports.contains(&p.transport.as_str()) {
                transports.push(&p.transport);
            }
        }
        let mut c = Chart::new(
            &format!("Remote read p99 vs background load — {size} B"),
            "CPU-busy processes on the read node",
            "p99 round trip (µs)",
        )
        .log_y(true);
        for tr in transports {
            let mut pts: Vec<(f64, f64)> = probes
                .iter()
                .filter(|p| p.transport == tr && p.size_bytes == size)
                .map(|p| (p.background_load as f64, p.p99_us))
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            c = c.series(tr, pts);
        }
        out.push((
            format!("fig-probe-p99-{size}B.svg"),
            format!("Remote read p99 latency vs background load, {size} B reads"),
            c.to_svg(),
        ));
        out.push((
            format!("fig-probe-p50-{size}B.svg"),
            format!("Remote read median latency vs background load, {size} B reads"),
            probe_chart(
                &probes,
                &format!("Remote read p50 vs background load — {size} B"),
                "CPU-busy processes on the read node",
                |p| (p.size_bytes == size).then_some(p.background_load as f64),
                |p| (p.p50_us, p.p50_us_sd),
            ),
        ));
    }
    let loads: BTreeSet<u64> = probes.iter().map(|p| p.background_load).collect();
    if sizes_of(&probes) > 1 {
        for load in loads {
            out.push((
                format!("fig-probe-size-load{load}.svg"),
                format!(
                    "Remote read median latency vs read size, background load {load} (Fig. 4a)"
                ),
                probe_chart(
                    &probes,
                    &format!("Remote read p50 vs size — background load {load}"),
                    "read size (log2 bytes: 3 = 8 B, 12 = 4 KiB)",
                    |p| (p.background_load == load).then_some((p.size_bytes as f64).log2()),
                    |p| (p.p50_us, p.p50_us_sd),
                ),
            ));
        }
    }
    let reconfig: Vec<&crate::reconfig::ReconfigPoint> = s.reconfig_points().collect();
    out.extend(crate::reconfig::figures::figures(&reconfig));
    let spec: Vec<&crate::speculative::SpecPoint> = s.speculative_points().collect();
    out.extend(crate::speculative::figures(&spec));
    out
}

/// Distinct read sizes among the probe points.
fn sizes_of(probes: &[&ProbePoint]) -> usize {
    probes
        .iter()
        .map(|p| p.size_bytes)
        .collect::<BTreeSet<_>>()
        .len()
}

/// A probe chart, one line per transport: `x(p)` selects and places a point, `y(p)` is
/// its value and error bar; log y (transports differ by orders of magnitude).
fn probe_chart(
    probes: &[&ProbePoint],
    title: &str,
    x_label: &str,
    x: impl Fn(&ProbePoint) -> Option<f64>,
    y: impl Fn(&ProbePoint) -> (f64, f64),
) -> String {
    let mut transports: Vec<&str> = Vec::new();
    for p in probes {
        if !transports.contains(&p.transport.as_str()) {
            transports.push(&p.transport);
        }
    }
    let mut c = Chart::new(title, x_label, "round trip (µs)").log_y(true);
    for tr in transports {
        let mut pts: Vec<(f64, f64, f64)> = probes
            .iter()
            .filter(|p| p.transport == tr)
            .filter_map(|p| x(p).map(|xv| (xv, y(p).0, y(p).1)))
            .collect();
        if pts.is_empty() {
            continue;
        }
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        c = c.series_err(
            tr,
            pts.iter().map(|p| (p.0, p.1)).collect(),
            pts.iter().map(|p| p.2).collect(),
        );
    }
    c.to_svg()
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

fn html(s: &Summary, g: &Grid, figures: &[(String, String, String)]) -> String {
    let mut out = String::new();
    let title = format!("farside lab — {}", s.experiment);
    let _ = write!(
        out,
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{t}</title>
<style>
body {{ font-family: Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }}
h1 {{ margin-bottom: 0.2em; }}
.meta {{ color: #555; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1em 0; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; }}
td {{ text-align: right; font-variant-numeric: tabular-nums; }}
th {{ background: #f2f2f2; }}
td.missing {{ color: #aaa; text-align: center; }}
.imp {{ font-weight: bold; margin: 0.3em 0 1.5em 0; }}
figure {{ margin: 1em 0; }}
figcaption {{ color: #555; font-size: 13px; }}
pre {{ background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 12px; }}
</style>
</head>
<body>
<h1>{t}</h1>
<p class="meta">hosts: {hosts} · started {start} UTC · duration {dur:.1} s{quick}</p>
"#,
        t = escape(&title),
        hosts = escape(&s.hosts),
        start = utc_string(s.started_unix_s),
        dur = s.duration_s,
        quick = if s.quick {
            " · <b>quick run</b> (smoke test, not for comparison)"
        } else {
            ""
        },
    );
    let _ = writeln!(out, "<h2>Run</h2>\n<pre>{}</pre>", escape(&run_lines(s)));
    let _ = writeln!(out, "<h2>Parameters</h2>");
    let params = serde_json::to_string_pretty(&s.params).unwrap_or_default();
    let _ = writeln!(out, "<pre>{}</pre>", escape(&params));
    if let Some(cfg) = s.params.get("haproxy_config").and_then(|v| v.as_str()) {
        let _ = writeln!(
            out,
            "<h2>HAProxy configuration</h2>\n<p class=\"meta\">As the lab wrote it for the \
             <code>haproxy</code> system (addresses symbolic).</p>\n<pre>{}</pre>",
            escape(cfg)
        );
    }

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

    let probes: Vec<&ProbePoint> = s.probe_points().collect();
    if !probes.is_empty() {
        out.push_str("<h2>Remote read latency</h2>\n<table>\n<tr><th>transport</th><th>background load</th><th>size B</th><th>samples</th><th>p50 µs</th><th>p99 µs</th><th>p99.9 µs</th><th>max µs</th><th>timeouts</th></tr>\n");
        for p in probes {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{}</td></tr>",
                escape(&p.transport),
                p.background_load,
                p.size_bytes,
                p.samples,
                p.p50_us,
                p.p99_us,
                p.p999_us,
                p.max_us,
                p.timeouts
            );
        }
        out.push_str("</table>\n");
    }
    let faults: Vec<&crate::faults::FaultRow> = s.fault_rows().collect();
    if !faults.is_empty() {
        let _ = writeln!(
            out,
            "<h2>Faults</h2>\n<pre>{}</pre>",
            escape(&crate::faults::table(&faults))
        );
    }
    let reconfig: Vec<&crate::reconfig::ReconfigPoint> = s.reconfig_points().collect();
    if !reconfig.is_empty() {
        let _ = writeln!(
            out,
            "<h2>Reconfiguration</h2>\n<pre>{}</pre>",
            escape(&crate::reconfig::table(&reconfig))
        );
    }
    let spec: Vec<&crate::speculative::SpecPoint> = s.speculative_points().collect();
    if !spec.is_empty() {
        let _ = writeln!(
            out,
            "<h2>Speculative admission</h2>\n<pre>{}</pre>",
            escape(&crate::speculative::table(&spec))
        );
    }
    if s.points.is_empty() {
        out.push_str("<p>No points were measured.</p>\n");
    }

    if !figures.is_empty() {
        out.push_str("<h2>Figures</h2>\n");
    }
    for (name, caption, svg) in figures {
        let _ = writeln!(
            out,
            "<figure>\n{}<figcaption>{} — <a href=\"{n}\">{n}</a></figcaption>\n</figure>",
            svg,
            escape(caption),
            n = escape(name)
        );
    }

    out.push_str("<h2>Notes</h2>\n");
    if s.notes.is_empty() {
        out.push_str("<p>None.</p>\n");
    } else {
        out.push_str("<ul>\n");
        for n in &s.notes {
            let _ = writeln!(out, "<li>{}</li>", escape(n));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</body>\n</html>\n");
    out
}

/// Keeps `[A-Za-z0-9._-]`, maps anything else to `_`, so names are safe in file names.
pub fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with('.') {
        format!("_{out}")
    } else {
        out
    }
}

/// `1000` for whole numbers, else up to 3 decimals.
fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time, without a date library.
fn utc_string(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::svg::check_well_formed;

    /// A synthetic admission run: 2 traces × 3 systems × 3 loads, series on
    /// the heaviest load. At 640 clients on `single`: no-ac 200 ms, tcp-ac
    /// 150 ms, onesided-ac 100 ms → 25%, 50% over no-ac and 33.3% over tcp-ac.
    pub(crate) fn synthetic() -> Summary {
        let mut s = Summary::new("admission", "netns", true);
        s.started_unix_s = 1_700_000_000;
        s.duration_s = 42.0;
        s.params = serde_json::json!({ "slow_ms": 1000, "think_ms": 0, "sample_period_us": 1000 });
        s.notes.push("synthetic <data> for tests".into());
        for trace in ["single", "zipf"] {
            for (si, sys) in SYSTEMS.iter().enumerate() {
                for clients in [40u64, 240, 640] {
                    let load = clients as f64 / 640.0;
                    let avg_ms = match clients {
                        640 => [200.0, 150.0, 100.0][si],
                        _ => 5.0 + 50.0 * load * (3 - si) as f64,
                    };
                    let series = if clients == 640 {
                        (0..60u64)
                            .map(|t| SecondPoint {
                                t_s: t,
                                served: 900 + (t * 37 + si as u64 * 11) % 200,
                                dropped: if si == 0 {
                                    5
                                } else {
                                    (t * 13 + si as u64 * 7) % 90
                                },
                                avg_ms: avg_ms * (0.5 + ((t * 7 + si as u64) % 10) as f64 / 10.0),
                            })
                            .collect()
                    } else {
                        Vec::new()
                    };
                    s.push(Point {
                        system: sys.to_string(),
                        trace: trace.to_string(),
                        clients,
                        transport: ["none", "tcp", "udp-xdp"][si].into(),
                        avg_ms,
                        p50_ms: avg_ms * 0.8,
                        p90_ms: avg_ms * 1.5,
                        p99_ms: avg_ms * 3.0,
                        max_ms: avg_ms * 10.0,
                        tps: 1000.0 * load * (1.0 + 0.1 * si as f64),
                        drop_rate: 0.05 * si as f64 * load,
                        slow_rate: 0.2 * load / (1 + si) as f64,
                        attempts: 1000,
                        served: 950,
                        dropped: 50,
                        failures: 0,
                        runs: 1,
                        avg_ms_sd: 0.0,
                        tps_sd: 0.0,
                        p99_ms_sd: 0.0,
                        drop_rate_sd: 0.0,
                        slow_rate_sd: 0.0,
                        monitor_read_p50_us: (si > 0).then_some(20.0 * si as f64),
                        monitor_read_p99_us: (si > 0).then_some(900.0 / si as f64),
                        update_gap_p99_ms: (si > 0).then_some(3.0 / si as f64),
                        series,
                        limit: (si > 0).then_some(16),
                        requests: Vec::new(),
                        scenario: "single".into(),
                        load_model: "closed".into(),
                        ..Point::default()
                    });
                }
            }
        }
        s
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("farside-report-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn scenario_table_has_avg_p99_goodput_and_drop_per_scenario_and_load_model() {
        let mut s = Summary::new("admission", "loopback", true);
        let pt =
            |system: &str, scenario: &str, model: &str, clients: u64, rate: Option<f64>| Point {
                system: system.into(),
                trace: "single".into(),
                clients,
                transport: "none".into(),
                scenario: scenario.into(),
                load_model: model.into(),
                rate_rps: rate,
                avg_ms: 2.5,
                p99_ms: 40.0,
                tps: 123.0,
                goodput: 123.0,
                drop_rate: 0.25,
                runs: 1,
                ..Point::default()
            };
        let mut h = pt("haproxy", "multi-proxy", "closed", 8, None);
        h.proxy_queue_ms = Some(7.25);
        h.proxy_time_ms = Some(9.0);
        h.backend_queue_ms = Some(0.5);
        h.backend_queue_p99_ms = Some(4.0);
        s.push(h);
        let mut o = pt("onesided-ac", "multi-proxy", "closed", 8, None);
        o.proxy_time_ms = Some(30.0);
        o.backend_queue_ms = Some(22.0);
        o.backend_queue_p99_ms = Some(48.0);
        o.limit = Some(12);
        s.push(o);
        let mut d = pt("onesided-delay", "multi-proxy", "closed", 8, None);
        d.limit = Some(28);
        s.push(d);
        s.push(pt("onesided-ac", "multi-proxy", "open", 0, Some(600.4)));
        let text = table_text(&s);
        assert!(text.contains("scenarios — avg and p99"), "{text}");
        let row = text
            .lines()
            .find(|l| l.starts_with("multi-proxy     closed single"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(row.contains("2.50    40.00    123.0  25.0"), "{row}");
        // Where the time went: HAProxy's queue vs the back-ends' queue, per system; a
        // point without figures has dashes.
        let split = text
            .split(SPLIT_TITLE)
            .nth(1)
            .unwrap_or_else(|| panic!("{text}"));
        let row = split
            .lines()
            .find(|l| l.starts_with("multi-proxy     closed"))
            .unwrap();
        assert!(
            row.contains("|      7.2     9.0     0.5      4.0")
                && row.contains("|        -    30.0    22.0     48.0"),
            "{row}"
        );
        // One limit per system: plain system names, no "limit=" labels.
        assert!(!text.contains("limit="), "{text}");
        assert!(text.contains("onesided-delay"), "{text}");
        // The open-loop row is labelled by its rate; haproxy has no point there.
        let row = text
            .lines()
            .find(|l| l.starts_with("multi-proxy     open"))
            .unwrap();
        assert!(row.contains(" 600 ") && row.contains("-"), "{row}");
        // Panels are per scenario and load model; the open one counts arrivals/s.
        assert!(text.contains("trace single-multi-proxy-open"), "{text}");
        assert!(text.contains("rate/s"), "{text}");
        // Without no-ac, the farside systems are compared with the anchor.
        let imp = text.lines().find(|l| l.starts_with("improvement")).unwrap();
        assert!(
            imp.contains("onesided-ac vs haproxy") && !imp.contains("no-ac"),
            "{imp}"
        );
        let html = html(&s, &Grid::new(&s), &[]);
        assert!(html.contains("<h2>Scenarios</h2>"));
        assert!(html.contains("Where served time went") && html.contains("<td>7.2</td>"));
        // The objective and the proxy arguments it set are printed with the run.
        s.params = serde_json::json!({
            "objective_rule": "Q = --queue-ms 50; L_Q = 12",
            "proxy_args_by_system": {"onesided-ac": ["--queue-timeout-ms", "50"]},
        });
        let lines = run_lines(&s);
        assert!(
            lines.contains("objective: Q = --queue-ms 50; L_Q = 12"),
            "{lines}"
        );
        assert!(
            lines.contains("proxy args onesided-ac: --queue-timeout-ms 50"),
            "{lines}"
        );
        // A plain closed-loop single run has no scenario table.
        assert!(!table_text(&synthetic()).contains("scenarios —"));
    }

    #[test]
    fn table_has_rows_per_load_and_the_improvement_arithmetic() {
        let s = synthetic();
        let mut buf = Vec::new();
        print_table(&s, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(text.contains("trace single"), "{text}");
        assert!(text.contains("no-ac") && text.contains("tcp-ac") && text.contains("onesided-ac"));
        for c in ["      40 |", "     240 |", "     640 |"] {
            assert!(text.contains(c), "row {c:?} missing:\n{text}");
        }
        let line = "improvement single @ 640 clients (avg response time): \
                    tcp-ac vs no-ac 25.0%, onesided-ac vs no-ac 50.0%, onesided-ac vs tcp-ac 33.3%";
        assert!(text.contains(line), "{text}");
        let monitor = "monitor single @ 640 clients: \
                       tcp-ac read p50 20 µs p99 900 µs, new record p99 every 3.0 ms; \
                       onesided-ac read p50 40 µs p99 450 µs, new record p99 every 1.5 ms";
        assert!(text.contains(monitor), "{text}");
        let imp = improvements(&s);
        assert_eq!(imp.len(), 2);
        let p = imp[0].items[2].percent.unwrap();
        assert!((p - 100.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn fault_rows_render_a_table_csv_and_the_targets_line() {
        let row = |fault: &str, hung: u64, cmd: Option<f64>| crate::faults::FaultRow {
            fault: fault.into(),
            started: 100,
            answered: 90,
            refused_503: 10,
            failed: 0,
            failed_connect: 0,
            failed_io: 0,
            failed_malformed: 0,
            failed_5xx: 0,
            hung,
            inflight_at_end: 0,
            time_to_fresh_ms: Some(3.0),
            stale_at_repair: fault == "gatherd-restart",
            repair_ms: cmd.map(|v| v - 3.0),
            time_to_fresh_from_repair_cmd_ms: cmd,
            runs: 1,
        };
        let mut s = Summary::new("faults", "loopback", true);
        s.params = serde_json::json!({ "fresh_bound_ms": 200 });
        s.push(crate::summary::AnyPoint::Fault(row(
            "gatherd-restart",
            0,
            Some(150.0),
        )));
        s.push(crate::summary::AnyPoint::Fault(row(
            "backend-kill",
            0,
            None,
        )));
        let text = table_text(&s);
        assert!(
            text.contains("gatherd-restart") && text.contains("backend-kill"),
            "{text}"
        );
        assert!(text.contains("): met"), "{text}");
        // The untagged point survives the trip through JSON as a fault row.
        let back = Summary::from_json(&s.to_json_pretty()).unwrap();
        assert_eq!(back.fault_rows().count(), 2);
        assert_eq!(back.admission_points().count(), 0);
        s.push(crate::summary::AnyPoint::Fault(row(
            "gatherd-restart",
            0,
            Some(250.0),
        )));
        assert!(table_text(&s).contains("NOT met"));
        let combined = crate::faults::FaultRow::combine(&[
            row("backend-stop", 1, None),
            row("backend-stop", 0, None),
        ]);
        assert_eq!(
            (combined.started, combined.hung, combined.runs),
            (200, 1, 2)
        );
        let dir =
            std::env::temp_dir().join(format!("farside-report-faults-{}", std::process::id()));
        let files = write_all(&s, &dir).unwrap();
        assert!(files.iter().any(|f| f.ends_with("faults.csv")));
        assert!(std::fs::read_to_string(dir.join("report.html"))
            .unwrap()
            .contains("<h2>Faults</h2>"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn missing_baseline_gives_na_not_a_made_up_number() {
        let mut s = synthetic();
        s.points.retain(|p| match p {
            crate::summary::AnyPoint::Admission(p) => !(p.system == "no-ac" && p.clients == 640),
            _ => true,
        });
        let text = table_text(&s);
        assert!(text.contains("tcp-ac vs no-ac n/a"), "{text}");
        assert!(text.contains("onesided-ac vs tcp-ac 33.3%"), "{text}");
    }

    #[test]
    fn write_all_writes_every_file_and_json_round_trips() {
        let s = synthetic();
        let dir = temp_dir("all");
        let files = write_all(&s, &dir).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in [
            "summary.json",
            "points.csv",
            "series-no-ac-single-640.csv",
            "series-onesided-ac-zipf-640.csv",
            "fig-avg-single.svg",
            "fig-tps-single.svg",
            "fig-slow-single.svg",
            "fig-series-rt-single.svg",
            "fig-series-drop-single.svg",
            "fig-avg-zipf.svg",
            "report.html",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
        }
        for f in &files {
            assert!(f.exists(), "{f:?}");
        }

        let json = std::fs::read_to_string(dir.join("summary.json")).unwrap();
        let back = Summary::from_json(&json).unwrap();
        let mut expect = s.clone();
        for p in &mut expect.points {
            if let crate::summary::AnyPoint::Admission(p) = p {
                p.series.clear();
            }
        }
        assert_eq!(back, expect);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        for k in ["experiment", "hosts", "points"] {
            assert!(v.get(k).is_some());
        }
        for k in [
            "system",
            "trace",
            "clients",
            "avg_ms",
            "p50_ms",
            "p99_ms",
            "tps",
            "drop_rate",
            "slow_rate",
        ] {
            assert!(v["points"][0].get(k).is_some(), "{k}");
        }

        let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
        assert!(html.contains("monitor single @ 640 clients: tcp-ac read p50 20 µs"));

        let csv = std::fs::read_to_string(dir.join("points.csv")).unwrap();
        assert_eq!(csv.lines().count(), 1 + 18);
        let series = std::fs::read_to_string(dir.join("series-tcp-ac-single-640.csv")).unwrap();
        assert_eq!(series.lines().count(), 1 + 60);
        assert!(series.starts_with("t_s,served,dropped,drop_rate,avg_ms\n"));

        for f in files
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "svg"))
        {
            let svg = std::fs::read_to_string(f).unwrap();
            check_well_formed(&svg).unwrap_or_else(|e| panic!("{f:?}: {e}"));
        }
        let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("improvement single @ 640 clients"));
        assert!(html.contains("synthetic &lt;data&gt; for tests"));
        assert_eq!(html.matches("<svg").count(), 10);
        assert!(html.contains("2023-11-14 22:13:20"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn output_is_deterministic() {
        let s = synthetic();
        let (a, b) = (temp_dir("det-a"), temp_dir("det-b"));
        let fa = write_all(&s, &a).unwrap();
        let fb = write_all(&s, &b).unwrap();
        assert_eq!(fa.len(), fb.len());
        for (x, y) in fa.iter().zip(&fb) {
            assert_eq!(
                std::fs::read(x).unwrap(),
                std::fs::read(y).unwrap(),
                "{x:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&a);
        let _ = std::fs::remove_dir_all(&b);
    }

    #[test]
    fn probe_and_empty_summaries_are_reported_too() {
        let mut s = Summary::new("probe", "netns", true);
        let dir = temp_dir("empty");
        let files = write_all(&s, &dir).unwrap();
        assert_eq!(files.len(), 3); // summary.json, points.csv, report.html
        assert!(table_text(&s).contains("no points measured"));
        for (tr, base) in [("udp-xdp", 4.5), ("udp-user", 9.0)] {
            for load in [0u64, 1, 2] {
                s.push(ProbePoint {
                    transport: tr.into(),
                    background_load: load,
                    size_bytes: 64,
                    samples: 1000,
                    p50_us: base,
                    p99_us: base * (1.0 + 100.0 * load as f64 * (tr == "udp-user") as u8 as f64),
                    p999_us: base * 10.0,
                    max_us: base * 20.0,
                    timeouts: 0,
                    runs: 1,
                    p50_us_sd: 0.0,
                    p99_us_sd: 0.0,
                });
            }
        }
        let files = write_all(&s, &dir).unwrap();
        assert!(files.iter().any(|f| f.ends_with("probe.csv")));
        let fig = dir.join("fig-probe-p99-64B.svg");
        check_well_formed(&std::fs::read_to_string(fig).unwrap()).unwrap();
        assert!(table_text(&s).contains("udp-xdp"));
        assert!(
            !table_text(&s).contains("p50 sd"),
            "no spread for single runs"
        );
        for p in &mut s.points {
            if let crate::summary::AnyPoint::Probe(p) = p {
                p.runs = 3;
                p.p50_us_sd = 0.25;
            }
        }
        let text = table_text(&s);
        assert!(
            text.contains("p50 sd") && text.contains("       0.2"),
            "{text}"
        );
        assert!(
            text.contains("timed-out reads count as the timeout"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Writes the synthetic report for eyeballing:
    /// `FARSIDE_SAMPLE_DIR=/tmp/x cargo test -p farside-lab --lib -- --ignored sample`.
    #[test]
    #[ignore = "writes a sample report for manual inspection"]
    fn sample_report_for_inspection() {
        let dir = std::env::var_os("FARSIDE_SAMPLE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| temp_dir("sample"));
        let mut s = synthetic();
        // Give no-ac on zipf an overload tail, so its Fig. 6 goes log scale.
        for p in &mut s.points {
            if let crate::summary::AnyPoint::Admission(p) = p {
                if p.trace == "zipf" && p.system == SYSTEM_NO_AC {
                    for sp in p.series.iter_mut().filter(|sp| sp.t_s % 5 == 0) {
                        sp.avg_ms *= 30.0;
                    }
                }
            }
        }
        for (tr, p99_us) in [
            ("udp-xdp", [6.0, 9.0, 22.0]),
            ("udp-user", [12.0, 900.0, 4000.0]),
            ("tcp", [30.0, 2500.0, 9000.0]),
        ] {
            for (load, p99_us) in [0u64, 1, 2].into_iter().zip(p99_us) {
                s.push(ProbePoint {
                    transport: tr.into(),
                    background_load: load,
                    size_bytes: 64,
                    samples: 100_000,
                    p50_us: p99_us / 4.0,
                    p99_us,
                    p999_us: p99_us * 3.0,
                    max_us: p99_us * 10.0,
                    timeouts: 0,
                    runs: 1,
                    p50_us_sd: 0.0,
                    p99_us_sd: 0.0,
                });
            }
        }
        write_all(&s, &dir).unwrap();
        print_table(&s, &mut io::stdout()).unwrap();
        println!("sample report in {}", dir.display());
    }

    #[test]
    fn names_are_sanitised_and_dates_are_utc() {
        assert_eq!(sanitize("world cup/98"), "world_cup_98");
        assert_eq!(sanitize(".."), "_..");
        assert_eq!(utc_string(0), "1970-01-01 00:00:00");
        assert_eq!(utc_string(951_782_400), "2000-02-29 00:00:00");
    }

    #[test]
    fn qos_threshold_comes_from_params() {
        let mut s = Summary::new("admission", "netns", true);
        assert_eq!(slow_ms(&s), 1000.0);
        s.params = serde_json::json!({ "qos_ms": 250 });
        assert_eq!(slow_ms(&s), 250.0);
        s.push(Point {
            system: SYSTEM_NO_AC.into(),
            trace: "single".into(),
            clients: 10,
            ..Point::default()
        });
        assert!(
            table_text(&s).contains("slow % (> 250 ms)"),
            "{}",
            table_text(&s)
        );
    }
}
