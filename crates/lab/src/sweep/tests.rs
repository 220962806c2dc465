//! Tests of the sweep runner: resume, repeats, fresh outputs, metadata, steal.

use super::*;
use crate::admission::{Admission, Point, SecondPoint};
use crate::probe::ProbePoint;
use crate::summary::Setting;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("farside-sweep-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn steal_is_the_eighth_value_of_each_cpu_line() {
    let stat = "cpu  921315 0 377485 420157 14066 0 47610 18192 0 0\n\
                cpu0 461365 0 131817 262672 6052 0 26557 9919 0 0\n\
                cpu1 459950 0 245667 157485 8013 0 21053 8273 0 0\n\
                intr 1 2 3\ncpufreq 5\n";
    assert_eq!(steal_ticks_of(stat), vec![9919, 8273]);
    let s = Steal {
        wall_s: 10.0,
        per_cpu_ms: vec![20.0, 300.0],
    };
    assert!((s.max_share() - 0.03).abs() < 1e-12);
    assert!(s.flagged());
    let one_tick = Steal {
        wall_s: 1.0,
        per_cpu_ms: vec![20.0, 0.0],
    };
    assert!(one_tick.max_share() > STEAL_FLAG_SHARE && !one_tick.flagged());
}

fn meta(limit: u64) -> Summary<Point> {
    let mut s = Summary::new("admission", "loopback", true);
    s.params = serde_json::json!({ "limit": limit, "duration_s": 1.0 });
    s.seed = Some(1);
    s
}

fn point(system: &str, clients: u64, avg_ms: f64) -> Point {
    Point {
        system: system.into(),
        trace: "single".into(),
        clients,
        avg_ms,
        tps: 100.0,
        series: vec![SecondPoint {
            t_s: 0,
            served: 3,
            dropped: 1,
            avg_ms,
        }],
        requests: vec![(0.5, avg_ms)],
        ..Point::default()
    }
}

#[derive(Serialize)]
struct Key {
    system: &'static str,
    clients: u64,
}

const KEYS: [Key; 3] = [
    Key {
        system: "no-ac",
        clients: 4,
    },
    Key {
        system: "no-ac",
        clients: 8,
    },
    Key {
        system: "tcp-ac",
        clients: 4,
    },
];

#[test]
fn resume_skips_finished_runs_and_keeps_their_results() {
    let dir = temp_dir("resume");
    let mut calls = Vec::new();
    {
        let mut sw = Sweep::<Admission>::start(&dir, meta(2), false).unwrap();
        // The sweep breaks off after two runs (the third point fails).
        let r = sw.run(
            &KEYS,
            1,
            1.0,
            |k| k.system.into(),
            |k, _| {
                if k.system == "tcp-ac" {
                    return Err(io::Error::other("tier died"));
                }
                calls.push((k.system, k.clients));
                Ok(point(k.system, k.clients, k.clients as f64))
            },
        );
        assert!(r.is_err());
    }
    assert_eq!(read_records::<Point>(&dir).unwrap().len(), 2);
    assert!(!read_summary::<Point>(&dir).unwrap().finished);
    calls.clear();
    let mut sw = Sweep::<Admission>::start(&dir, meta(2), true).unwrap();
    sw.run(
        &KEYS,
        1,
        1.0,
        |k| k.system.into(),
        |k, _| {
            calls.push((k.system, k.clients));
            Ok(point(k.system, k.clients, 7.0))
        },
    )
    .unwrap();
    assert_eq!(calls, vec![("tcp-ac", 4)], "only the missing point ran");
    let s = sw.finish().unwrap();
    assert!(s.finished);
    let pts: Vec<(String, u64, f64)> = s
        .points
        .iter()
        .map(|p| (p.system.clone(), p.clients, p.avg_ms))
        .collect();
    assert_eq!(
        pts,
        vec![
            ("no-ac".into(), 4, 4.0),
            ("no-ac".into(), 8, 8.0),
            ("tcp-ac".into(), 4, 7.0)
        ]
    );
    // Series and request samples survive the trip through points.jsonl.
    let p = &s.points[0];
    assert_eq!((p.series.len(), p.requests.len()), (1, 1));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resume_refuses_changed_settings_with_the_differences() {
    let dir = temp_dir("refuse");
    let mut sw = Sweep::<Admission>::start(&dir, meta(2), false).unwrap();
    sw.run(
        &KEYS[..1],
        1,
        1.0,
        |_| String::new(),
        |k, _| Ok(point(k.system, k.clients, 1.0)),
    )
    .unwrap();
    drop(sw);
    let e = Sweep::<Admission>::start(&dir, meta(4), true)
        .err()
        .unwrap();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    let msg = e.to_string();
    assert!(msg.contains("limit: 2 → 4"), "{msg}");
    assert!(msg.contains("settings differ"), "{msg}");
    // The kept run is untouched by the refusal.
    assert_eq!(read_records::<Point>(&dir).unwrap().len(), 1);
    let mut quick_changed = meta(2);
    quick_changed.quick = false;
    let e = Sweep::<Admission>::start(&dir, quick_changed, true)
        .err()
        .unwrap();
    assert!(e.to_string().contains("quick: true → false"), "{e}");
    // No kept run at all: a clear error too.
    let e = Sweep::<Admission>::start(&temp_dir("none"), meta(2), true)
        .err()
        .unwrap();
    assert!(e.to_string().contains("summary.json"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn repeats_combine_and_a_cut_off_line_is_skipped() {
    let dir = temp_dir("repeat");
    let mut sw = Sweep::<Admission>::start(&dir, meta(2), false).unwrap();
    sw.run(
        &KEYS[..1],
        2,
        1.0,
        |_| String::new(),
        |k, r| Ok(point(k.system, k.clients, 10.0 + 10.0 * r as f64)),
    )
    .unwrap();
    drop(sw);
    // A crash in the middle of writing a third line.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(POINTS_FILE))
        .unwrap();
    f.write_all(b"{\"key\":{\"system\":\"tcp").unwrap();
    drop(f);
    let s = load::<Point>(&dir).unwrap();
    let p = &s.points[0];
    assert_eq!((p.runs, p.avg_ms), (2, 15.0));
    assert!((p.avg_ms_sd - 50f64.sqrt()).abs() < 1e-9);
    // Resuming ends the fragment and appends after it.
    let mut sw = Sweep::<Admission>::start(&dir, meta(2), true).unwrap();
    sw.run(
        &KEYS,
        2,
        1.0,
        |_| String::new(),
        |k, _| Ok(point(k.system, k.clients, 1.0)),
    )
    .unwrap();
    assert_eq!(read_records::<Point>(&dir).unwrap().len(), 6);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_older_run_without_points_jsonl_keeps_its_points() {
    let dir = temp_dir("old");
    std::fs::create_dir_all(&dir).unwrap();
    let mut s = meta(2);
    s.push(point("no-ac", 4, 3.0));
    std::fs::write(dir.join(SUMMARY_FILE), s.to_json_pretty()).unwrap();
    let (back, _) = regenerate::<Admission>(&dir).unwrap();
    assert_eq!(back.points.len(), 1);
    assert_eq!(load::<Point>(&dir).unwrap().points.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_fresh_sweep_removes_the_previous_outputs_only() {
    let dir = temp_dir("fresh");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["fig-old.svg", "series-x-y-1.csv", "points.csv", "notes.txt"] {
        std::fs::write(dir.join(f), "old").unwrap();
    }
    let _sw = Sweep::<Admission>::start(&dir, meta(2), false).unwrap();
    for f in ["fig-old.svg", "series-x-y-1.csv", "points.csv"] {
        assert!(!dir.join(f).exists(), "{f} left behind");
    }
    assert!(dir.join("notes.txt").exists(), "not ours: kept");
    assert!(dir.join(SUMMARY_FILE).exists() && dir.join(POINTS_FILE).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn metadata_keys_are_in_summary_json_from_the_start() {
    let dir = temp_dir("meta");
    let mut m = meta(2);
    fill_host_metadata(&mut m);
    m.settings.insert(
        "control_nice".into(),
        Setting::not_applied(-20, "needs root"),
    );
    let _sw = Sweep::<Admission>::start(&dir, m, false).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(SUMMARY_FILE)).unwrap()).unwrap();
    for k in [
        "commit",
        "commit_dirty",
        "build",
        "kernel",
        "cpu_model",
        "cpus",
        "seed",
        "params",
        "settings",
        "quick",
        "finished",
    ] {
        assert!(v.get(k).is_some(), "missing {k}: {v}");
    }
    assert_eq!(v["finished"], false);
    assert_eq!(v["seed"], 1);
    assert_eq!(
        v["settings"]["control_nice"],
        serde_json::json!({"requested": -20, "applied": false, "reason": "needs root"})
    );
    assert!(!v["kernel"].as_str().unwrap().is_empty());
    // This test runs from a git checkout: the commit is a 40-digit hash.
    if let Some(c) = v["commit"].as_str() {
        assert_eq!(c.len(), 40, "{c}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cpu_model_is_read_from_cpuinfo() {
    let x86 =
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n";
    assert_eq!(
        cpu_model_of(x86).as_deref(),
        Some("Intel(R) Xeon(R) CPU @ 2.20GHz")
    );
    assert_eq!(cpu_model_of("processor : 0\n"), None);
}

#[test]
fn probe_runs_combine_with_spread() {
    let p = |p50: f64| ProbePoint {
        transport: "tcp".into(),
        samples: 10,
        p50_us: p50,
        p99_us: p50 * 2.0,
        timeouts: 1,
        runs: 1,
        ..ProbePoint::default()
    };
    let c = <ProbePoint as LabPoint>::combine(&[p(10.0), p(20.0)]);
    assert_eq!((c.samples, c.timeouts, c.runs, c.p50_us), (20, 2, 2, 15.0));
    assert!((c.p50_us_sd - 50f64.sqrt()).abs() < 1e-9);
}

#[test]
fn isolated_runs_keep_how_they_started_and_a_start_not_empty_is_noted() {
    let dir = temp_dir("isolated");
    let mut sw = Sweep::<Admission>::start(&dir, meta(2), false).unwrap();
    let start = |empty: bool| Start {
        started_empty: empty,
        settle_ms: 12.0,
        start_backlog: if empty { 0 } else { 7 },
        left_backlog: 40,
        left_inflight: 3,
        restarted: !empty,
        reason: (!empty).then(|| "not quiet within 10.0 s".to_string()),
        ..Start::default()
    };
    sw.run_isolated(
        &KEYS[..2],
        1,
        1.0,
        |k| k.system.into(),
        |k, _| Ok((point(k.system, k.clients, 1.0), start(k.clients == 4))),
    )
    .unwrap();
    let recs = read_records::<Point>(&dir).unwrap();
    assert_eq!(
        recs.iter().map(|r| r.start.clone()).collect::<Vec<_>>(),
        vec![Some(start(true)), Some(start(false))]
    );
    // The not-empty run is in the summary's notes, once, during the run and when the
    // kept files are loaded again; the empty one is not.
    let s = sw.finish().unwrap();
    let noted: Vec<&String> = s
        .notes
        .iter()
        .filter(|n| n.contains("did not start empty"))
        .collect();
    assert_eq!(noted.len(), 1, "{:?}", s.notes);
    assert!(
        noted[0].contains("\"clients\":8") && noted[0].contains("7 queued"),
        "{noted:?}"
    );
    assert_eq!(load::<Point>(&dir).unwrap().notes, s.notes);
    // Runs of a plain `run` (and runs kept before the check) have no `start` key.
    let line = std::fs::read_to_string(dir.join(POINTS_FILE)).unwrap();
    assert!(line.lines().all(|l| l.contains("\"start\":")));
    let dir2 = temp_dir("plain");
    let mut sw = Sweep::<Admission>::start(&dir2, meta(2), false).unwrap();
    sw.run(
        &KEYS[..1],
        1,
        1.0,
        |_| String::new(),
        |k, _| Ok(point(k.system, k.clients, 1.0)),
    )
    .unwrap();
    let text = std::fs::read_to_string(dir2.join(POINTS_FILE)).unwrap();
    assert!(!text.contains("\"start\""), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}
