//! Tests of `lab faults`: rows, their combination, the table and the report files.

use super::*;

#[test]
fn fresh_view_needs_every_backend_fresh() {
    let m = "farside_backend_load{backend=\"a\",site=\"\",metric=\"backlog\"} 0\n\
             farside_backend_load{backend=\"b\",site=\"\",metric=\"backlog\"} 3\n";
    assert!(view_fresh(m));
    assert!(!view_fresh(&format!(
        "{m}farside_backend_load{{backend=\"c\",site=\"\",metric=\"backlog\"}} -1\n"
    )));
    assert!(!view_fresh("farside_requests_total 3\n"));
}

#[test]
fn bad_arguments_are_refused_with_the_flag_named() {
    let mut a = FaultsArgs {
        out: "x".into(),
        sweep: crate::fabric::flags::SweepFlags {
            quick: true,
            resume: None,
        },
        hosts: Hosts::Netns,
        rate: Some(10.0),
        load_share: 0.7,
        backends: 2,
        backend_workers: 2,
        stale_after_ms: 100,
        limit: 4,
        timeout_ms: 1000,
        faults: Vec::new(),
    };
    assert_eq!(check_args(&a).unwrap().len(), FAULTS.len());
    a.hosts = Hosts::Loopback;
    assert_eq!(check_args(&a).unwrap().len(), FAULTS.len() - 1);
    a.faults = vec!["region-drop".into()];
    assert!(check_args(&a).unwrap_err().to_string().contains("netns"));
    a.load_share = 0.0;
    assert!(check_args(&a)
        .unwrap_err()
        .to_string()
        .contains("--load-share"));
    a.load_share = 0.7;
    a.faults = vec!["meteor".into()];
    assert!(check_args(&a).unwrap_err().to_string().contains("meteor"));
}

#[test]
fn fault_rows_render_a_table_csv_and_the_targets_line() {
    let row = |fault: &str, hung: u64, cmd: Option<f64>| FaultRow {
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
    let mut s = crate::summary::Summary::new("faults", "loopback", true);
    s.params = serde_json::json!({ "fresh_bound_ms": 200 });
    s.push(row("gatherd-restart", 0, Some(150.0)));
    s.push(row("backend-kill", 0, None));
    let text = crate::report::table_text::<Faults>(&s);
    assert!(
        text.contains("gatherd-restart") && text.contains("backend-kill"),
        "{text}"
    );
    assert!(text.contains("): met"), "{text}");
    // The rows survive the trip through JSON.
    let back: crate::summary::Summary<FaultRow> =
        crate::summary::Summary::from_json(&s.to_json_pretty()).unwrap();
    assert_eq!(back.points, s.points);
    s.push(row("gatherd-restart", 0, Some(250.0)));
    assert!(crate::report::table_text::<Faults>(&s).contains("NOT met"));
    let combined = FaultRow::combine(&[row("backend-stop", 1, None), row("backend-stop", 0, None)]);
    assert_eq!(
        (combined.started, combined.hung, combined.runs),
        (200, 1, 2)
    );
    let dir = std::env::temp_dir().join(format!("farside-report-faults-{}", std::process::id()));
    let files = crate::report::write_all::<Faults>(&s, &dir).unwrap();
    assert!(files.iter().any(|f| f.ends_with("faults.csv")));
    assert!(std::fs::read_to_string(dir.join("report.html"))
        .unwrap()
        .contains("<h2>Faults</h2>"));
    let _ = std::fs::remove_dir_all(&dir);
}
