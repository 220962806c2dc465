//! Tests of `lab admission`'s report: tables, improvement arithmetic, files and figures
//! of a synthetic run.

use super::*;
use crate::admission::Admission;
use crate::report::{print_table, table_text as shell_table_text, write_all};
use crate::svg::check_well_formed;
use std::path::PathBuf;

fn table_text(s: &Summary<Point>) -> String {
    shell_table_text::<Admission>(s)
}

/// A synthetic admission run: 2 traces × 3 systems × 3 loads, series on
/// the heaviest load. At 640 clients on `single`: no-ac 200 ms, tcp-ac
/// 150 ms, onesided-ac 100 ms → 25%, 50% over no-ac and 33.3% over tcp-ac.
pub(crate) fn synthetic() -> Summary<Point> {
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
    let pt = |system: &str, scenario: &str, model: &str, clients: u64, rate: Option<f64>| Point {
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
    let html = html(&s);
    assert!(html.contains("<h2>Scenarios</h2>"));
    assert!(html.contains("Where served time went") && html.contains("<td>7.2</td>"));
    // The objective and the proxy arguments it set are printed with the run.
    s.params = serde_json::json!({
        "objective_rule": "Q = --queue-ms 50; L_Q = 12",
        "proxy_args_by_system": {"onesided-ac": ["--queue-timeout-ms", "50"]},
    });
    let lines = crate::report::run_lines(&s);
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
    print_table::<Admission>(&s, &mut buf).unwrap();
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
fn missing_baseline_gives_na_not_a_made_up_number() {
    let mut s = synthetic();
    s.points
        .retain(|p| !(p.system == "no-ac" && p.clients == 640));
    let text = table_text(&s);
    assert!(text.contains("tcp-ac vs no-ac n/a"), "{text}");
    assert!(text.contains("onesided-ac vs tcp-ac 33.3%"), "{text}");
}

#[test]
fn write_all_writes_every_file_and_json_round_trips() {
    let s = synthetic();
    let dir = temp_dir("all");
    let files = write_all::<Admission>(&s, &dir).unwrap();
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
        p.series.clear();
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
    let fa = write_all::<Admission>(&s, &a).unwrap();
    let fb = write_all::<Admission>(&s, &b).unwrap();
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
        if p.trace == "zipf" && p.system == SYSTEM_NO_AC {
            for sp in p.series.iter_mut().filter(|sp| sp.t_s % 5 == 0) {
                sp.avg_ms *= 30.0;
            }
        }
    }
    write_all::<Admission>(&s, &dir).unwrap();
    print_table::<Admission>(&s, &mut std::io::stdout()).unwrap();
    println!("sample report in {}", dir.display());
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
