//! `farside lab report DIR`: the tables, CSV and plots of a kept run are re-derived from
//! its `summary.json` and `points.jsonl` alone, byte for byte.
//!
//! The fixture `fixtures/admission-small` is a real loopback run (`lab admission --quick
//! --traces single --clients 2,6 --limits 2,8 --repeat 2 --duration-s 1`), its
//! per-request samples thinned to 8 per run to keep it small; `*.expected` are the table
//! and `points.csv` of the current format (a format change updates them on purpose: the
//! run itself wrote them before `points.csv` gained its `*_sd` columns).

use farside_lab::admission::{Admission, Point};
use farside_lab::summary::Summary;
use std::path::{Path, PathBuf};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/admission-small"
);

fn copy_fixture(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("farside-report-fx-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    for f in ["summary.json", "points.jsonl"] {
        std::fs::copy(Path::new(FIXTURE).join(f), d.join(f)).unwrap();
    }
    d
}

fn expected(name: &str) -> String {
    std::fs::read_to_string(Path::new(FIXTURE).join(name)).unwrap()
}

#[test]
fn report_regenerates_the_kept_tables_from_the_kept_files() {
    let dir = copy_fixture("tables");
    let (s, files) = farside_lab::sweep::regenerate::<Admission>(&dir).unwrap();
    let mut table = farside_lab::report::table_text::<Admission>(&s);
    table.truncate(table.trim_end().len());
    let want = expected("table.txt.expected");
    assert_eq!(table, want.trim_end(), "table differs from the kept one");
    assert_eq!(
        std::fs::read_to_string(dir.join("points.csv")).unwrap(),
        expected("points.csv.expected")
    );
    // Repeats were combined from points.jsonl: 1 no-ac + 2 systems x 2 limits, x 2 loads.
    assert_eq!(s.points.len(), 10);
    assert!(s.points.iter().all(|p| p.runs == 2));
    // The points in the regenerated summary.json are the ones the run kept.
    let kept: Summary<Point> =
        farside_lab::summary::Summary::from_json(&expected("summary.json")).unwrap();
    let again: Summary<Point> = farside_lab::summary::Summary::from_json(
        &std::fs::read_to_string(dir.join("summary.json")).unwrap(),
    )
    .unwrap();
    // The figures the run kept (its *_sd columns came later) are the ones re-derived.
    let figures = |s: &farside_lab::summary::Summary<Point>| -> Vec<String> {
        s.points
            .iter()
            .map(|p| {
                format!(
                    "{} {} {:?} {} {} {} {}",
                    p.system, p.clients, p.limit, p.avg_ms, p.tps, p.avg_ms_sd, p.tps_sd
                )
            })
            .collect()
    };
    assert_eq!(figures(&kept), figures(&again));
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for f in [
        "fig-avg-single.svg",
        "fig-requests-single.svg",
        "fig-rt-goodput-single.svg",
        "fig-series-drop-single.svg",
        "series-onesided-ac-limit8-single-6.csv",
        "report.html",
    ] {
        assert!(names.iter().any(|n| n == f), "{f} not in {names:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_is_deterministic_and_runs_nothing() {
    let dir = copy_fixture("det");
    let (_, first) = farside_lab::sweep::regenerate::<Admission>(&dir).unwrap();
    let bytes: Vec<Vec<u8>> = first.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let (_, second) = farside_lab::sweep::regenerate::<Admission>(&dir).unwrap();
    assert_eq!(first, second);
    for (f, b) in second.iter().zip(&bytes) {
        assert_eq!(&std::fs::read(f).unwrap(), b, "{f:?} changed");
    }
    // Nothing ran: no logs directory appeared.
    assert!(!dir.join("logs").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_of_a_directory_without_a_run_says_so() {
    let dir = std::env::temp_dir().join(format!("farside-report-none-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = farside_lab::regenerate_any(&dir, &mut std::io::sink()).unwrap_err();
    assert!(
        e.to_string().contains("summary.json") && e.to_string().contains("not a lab output"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
