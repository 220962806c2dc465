//! The point of `lab probe` ([`ProbePoint`]: one transport, background load and read
//! size) and its part of the report: the latency table, `probe.csv` and the latency
//! figures.
//!
//! Files: `probe.csv`, `fig-probe-p99-<size>B.svg`, `fig-probe-p50-<size>B.svg`,
//! `fig-probe-size-load<N>.svg` (Fig. 4a).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io;

use serde::{Deserialize, Serialize};

use crate::experiment::{Figure, LabPoint, NoExtra};
use crate::report::csv_text;
use crate::summary::Summary;
use crate::svg::{escape, Chart};
use crate::table::{Align, Table};

/// One remote-read latency measurement: one transport, background load and size.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ProbePoint {
    /// `transport`: `"tcp"`, `"udp-xdp"`, `"udp-user"`, `"shm"`, ...
    pub transport: String,
    /// `background_load`: CPU-busy processes running on the read node.
    pub background_load: u64,
    /// `size_bytes`: bytes read per request.
    pub size_bytes: u64,
    /// `samples`: number of completed reads measured.
    pub samples: u64,
    /// `p50_us`: median read round trip, µs.
    pub p50_us: f64,
    /// `p99_us`: 99th percentile round trip, µs.
    pub p99_us: f64,
    /// `p999_us`: 99.9th percentile round trip, µs.
    pub p999_us: f64,
    /// `max_us`: largest round trip, µs.
    pub max_us: f64,
    /// `timeouts`: reads that got no reply within the timeout. They are in `samples` and
    /// in the percentiles, counted as taking the whole timeout.
    pub timeouts: u64,
    /// `runs`: repetitions this point averages (`lab probe --repeat`).
    #[serde(default = "one")]
    pub runs: u64,
    /// `p50_us_sd`: sample standard deviation of `p50_us` across runs (0 for one run).
    #[serde(default)]
    pub p50_us_sd: f64,
    /// `p99_us_sd`: sample standard deviation of `p99_us` across runs (0 for one run).
    #[serde(default)]
    pub p99_us_sd: f64,
}

/// Sample standard deviation of `v` (0 for fewer than two values).
fn sd_of(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
}

impl ProbePoint {
    /// Combine repetitions: means of the percentiles, sums of the counts, the largest
    /// max, and the spread of p50 and p99.
    pub fn combine(runs: &[ProbePoint]) -> ProbePoint {
        let Some(first) = runs.first() else {
            return ProbePoint::default();
        };
        let n = runs.len() as f64;
        let mean = |f: fn(&ProbePoint) -> f64| runs.iter().map(f).sum::<f64>() / n;
        let vals = |f: fn(&ProbePoint) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
        ProbePoint {
            samples: runs.iter().map(|p| p.samples).sum(),
            p50_us: mean(|p| p.p50_us),
            p99_us: mean(|p| p.p99_us),
            p999_us: mean(|p| p.p999_us),
            max_us: runs.iter().map(|p| p.max_us).fold(0.0, f64::max),
            timeouts: runs.iter().map(|p| p.timeouts).sum(),
            runs: runs.len() as u64,
            p50_us_sd: sd_of(&vals(|p| p.p50_us)),
            p99_us_sd: sd_of(&vals(|p| p.p99_us)),
            ..first.clone()
        }
    }
}

fn one() -> u64 {
    1
}

impl LabPoint for ProbePoint {
    type Extra = NoExtra;

    fn take_extra(&mut self) -> NoExtra {
        NoExtra {}
    }

    fn put_extra(&mut self, _: NoExtra) {}

    fn combine(runs: &[ProbePoint]) -> ProbePoint {
        ProbePoint::combine(runs)
    }

    fn progress_line(&self) -> String {
        format!(
            "p50={:>8.1} µs p99={:>8.1} µs p99.9={:>8.1} µs timeouts={}",
            self.p50_us, self.p99_us, self.p999_us, self.timeouts
        )
    }
}

/// The latency table (empty without points).
pub fn table(s: &Summary<ProbePoint>) -> String {
    let mut out = String::new();
    let probes: Vec<&ProbePoint> = s.points.iter().collect();
    if !probes.is_empty() {
        let _ = writeln!(
            out,
            "{} — remote read round trip (µs; timed-out reads count as the timeout)",
            s.experiment
        );
        // With repeats, the spread of p50 and p99 across runs says what is noise.
        let spread = probes.iter().any(|p| p.runs > 1);
        let mut t = Table::new().col("", "transport", Align::Left, 12).cols(
            "",
            Align::Right,
            [
                ("load", 6),
                ("size B", 9),
                ("samples", 10),
                ("p50 us", 10),
                ("p99 us", 10),
                ("p99.9 us", 10),
                ("max us", 10),
                ("timeouts", 9),
            ],
        );
        if spread {
            t = t.cols("", Align::Right, [("p50 sd", 10), ("p99 sd", 10)]);
        }
        t = t.rule('-');
        for p in probes {
            let mut row = vec![
                p.transport.to_string(),
                p.background_load.to_string(),
                p.size_bytes.to_string(),
                p.samples.to_string(),
                format!("{:.1}", p.p50_us),
                format!("{:.1}", p.p99_us),
                format!("{:.1}", p.p999_us),
                format!("{:.1}", p.max_us),
                p.timeouts.to_string(),
            ];
            if spread {
                row.push(format!("{:.1}", p.p50_us_sd));
                row.push(format!("{:.1}", p.p99_us_sd));
            }
            t.row(row);
        }
        out.push_str(&t.render());
        out.push('\n');
    }
    out
}

/// The latency table of `report.html` (empty without points).
pub fn html(s: &Summary<ProbePoint>) -> String {
    let mut out = String::new();
    let probes: Vec<&ProbePoint> = s.points.iter().collect();
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
    out
}

/// `probe.csv`: one row per point.
pub fn csv(points: &[&ProbePoint]) -> io::Result<String> {
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

/// The latency figures: p99 and p50 against background load per read size, p50 against
/// read size per background load (when several sizes ran).
pub fn figures(s: &Summary<ProbePoint>) -> Vec<Figure> {
    let mut out = Vec::new();
    let probes: Vec<&ProbePoint> = s.points.iter().collect();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::Probe;
    use crate::report::{table_text, write_all};
    use crate::svg::check_well_formed;

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("farside-probe-report-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn probe_and_empty_summaries_are_reported_too() {
        let mut s = Summary::new("probe", "netns", true);
        let dir = temp_dir("empty");
        let files = write_all::<Probe>(&s, &dir).unwrap();
        assert_eq!(files.len(), 2); // summary.json, report.html
        assert!(table_text::<Probe>(&s).contains("no points measured"));
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
        let files = write_all::<Probe>(&s, &dir).unwrap();
        assert!(files.iter().any(|f| f.ends_with("probe.csv")));
        let fig = dir.join("fig-probe-p99-64B.svg");
        check_well_formed(&std::fs::read_to_string(fig).unwrap()).unwrap();
        assert!(table_text::<Probe>(&s).contains("udp-xdp"));
        assert!(
            !table_text::<Probe>(&s).contains("p50 sd"),
            "no spread for single runs"
        );
        for p in &mut s.points {
            p.runs = 3;
            p.p50_us_sd = 0.25;
        }
        let text = table_text::<Probe>(&s);
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
}
