//! `farside lab coop --quick` end to end (root: network namespaces): no client ever gets
//! a wrong body, PRESS serves more requests from memory (own cache or a peer's) than
//! round-robin nodes caching on their own, and so does the farside proxy routing by path
//! (`lard`) from the nodes' own caches; every system records the cache bytes it held;
//! press-xdp with directories read (`--directory read`) or written (`--directory write`)
//! one-sidedly still finds remote hits, with no directory datagram.

use std::path::PathBuf;
use std::process::Command;

/// The `farside` binary of this target directory (the lab starts its nodes from it).
fn farside_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    // target/<profile>/deps/lab_coop-<hash> -> target/<profile>/farside
    let bin = exe.parent()?.parent()?.join("farside");
    bin.exists().then_some(bin)
}

#[test]
fn quick_lab_press_beats_rr_locality_and_never_a_wrong_body() {
    const TEST: &str = "lab_coop::quick_lab_press_beats_rr_locality_and_never_a_wrong_body";
    if !farside_testkit::root_or_skip(TEST) {
        return;
    }
    let Some(bin) = farside_bin() else {
        farside_testkit::skip(
            TEST,
            "the farside binary is not built (cargo build -p farside)",
        );
        return;
    };
    let out = std::env::temp_dir().join(format!("farside-lab-coop-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(&bin)
        .args(["lab", "coop", "--quick", "--nodes", "3", "--out"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success(), "farside lab coop --quick failed");
    // The sweep runner's points, one JSON object a line: {"key", "run", "point", ..}.
    let text = std::fs::read_to_string(out.join("points.jsonl")).unwrap();
    let points: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["point"].clone())
        .collect();
    for p in &points {
        assert_eq!(p["wrong_bodies"], 0, "{p}");
    }
    let point = |s: &str| {
        points
            .iter()
            .find(|p| p["system"] == s && p["load_model"] == "closed")
            .unwrap_or_else(|| panic!("no closed-loop point of {s} in {text}"))
            .clone()
    };
    let (rr, press) = (point("rr"), point("press-tcp"));
    for p in [&rr, &press] {
        assert!(p["tps"].as_f64().unwrap() > 0.0, "{p}");
    }
    let f = |p: &serde_json::Value, k: &str| p[k].as_f64().unwrap();
    assert!(
        f(&press, "local_frac") + f(&press, "remote_frac") > f(&rr, "local_frac"),
        "press {press} vs rr {rr}"
    );
    // `lard` runs in `farside proxy --balance lard`: routing by path keeps more of the
    // requests in the nodes' own caches than round-robin does.
    let lard = point("lard");
    assert!(
        f(&lard, "local_frac") > f(&rr, "local_frac"),
        "lard {lard} vs rr {rr}"
    );
    // Every system's caches held something at the end, and said how much.
    for s in ["rr", "press-tcp", "lard", "bounded-hash", "haproxy"] {
        assert!(f(&point(s), "cache_held_bytes") > 0.0, "{}", point(s));
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// `farside lab coop --quick --nodes 2 --systems press-xdp --load closed` with `extra`
/// flags, as root: the first point's JSON, or `None` (skip recorded) when the test
/// cannot run here.
fn quick_press_xdp_point(test: &str, tag: &str, extra: &[&str]) -> Option<serde_json::Value> {
    if !farside_testkit::root_or_skip(test) {
        return None;
    }
    let Some(bin) = farside_bin() else {
        farside_testkit::skip(
            test,
            "the farside binary is not built (cargo build -p farside)",
        );
        return None;
    };
    let out = std::env::temp_dir().join(format!(
        "farside-lab-coop-{tag}-test-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(&bin)
        .args([
            "lab",
            "coop",
            "--quick",
            "--nodes",
            "2",
            "--systems",
            "press-xdp",
        ])
        .args(["--load", "closed"])
        .args(extra)
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "farside lab coop --quick (press-xdp {extra:?}) failed"
    );
    let text = std::fs::read_to_string(out.join("points.jsonl")).unwrap();
    let p = serde_json::from_str::<serde_json::Value>(text.lines().next().unwrap()).unwrap()
        ["point"]
        .clone();
    let _ = std::fs::remove_dir_all(&out);
    // Never a wrong body, and the nodes found each other's bodies (remote hits).
    assert_eq!(p["system"], "press-xdp", "{p}");
    assert_eq!(p["wrong_bodies"], 0, "{p}");
    assert!(p["tps"].as_f64().unwrap() > 0.0, "{p}");
    assert!(
        p["remote_frac"].as_f64().unwrap() > 0.0,
        "no remote hit: {p}"
    );
    Some(p)
}

/// PRESS with one-sided peer fetch: the service node's XDP program answers READs of its
/// object arena, and the initial nodes get bodies that way (remote hits), never a wrong
/// one (every 200's body is checked against its file).
#[test]
fn quick_lab_press_xdp_serves_remote_hits_and_never_a_wrong_body() {
    let test = "lab_coop::quick_lab_press_xdp_serves_remote_hits_and_never_a_wrong_body";
    let Some(p) = quick_press_xdp_point(test, "xdp", &[]) else {
        return;
    };
    assert!(p["peer_fetch_us"].as_f64().unwrap() > 0.0, "{p}");
}

/// `--directory read` with press-xdp: every node writes its directory record into its
/// own arena and its peers READ it one-sidedly (the owner's XDP program answers); the
/// nodes still find each other's bodies (remote hits) with no directory datagram sent,
/// and never a wrong body.
#[test]
fn quick_lab_press_xdp_reads_directories_one_sidedly_with_no_datagram() {
    let test = "lab_coop::quick_lab_press_xdp_reads_directories_one_sidedly_with_no_datagram";
    let Some(p) = quick_press_xdp_point(test, "dirread", &["--directory", "read"]) else {
        return;
    };
    assert_eq!(p["directory"], "read", "{p}");
    assert_eq!(
        p["directory_sent"].as_u64().unwrap_or(0),
        0,
        "a datagram was sent: {p}"
    );
    assert!(p["directory_reads"].as_u64().unwrap() > 0, "{p}");
    assert!(p["directory_read_bytes"].as_u64().unwrap() > 0, "{p}");
}

/// `--directory write` with press-xdp (two nodes, each in its own network namespace):
/// every node WRITEs its directory record one-sidedly into its own slot of its peer's
/// arena (the peer's XDP program answers under a key that may write that slot only) and
/// reads its own slots locally; the nodes find each other's bodies through directories
/// learned that way (remote hits) with no directory datagram sent, no publication
/// failed, and never a wrong body.
#[test]
fn quick_lab_press_xdp_writes_directories_one_sidedly_with_no_datagram() {
    let test = "lab_coop::quick_lab_press_xdp_writes_directories_one_sidedly_with_no_datagram";
    let Some(p) = quick_press_xdp_point(test, "dirwrite", &["--directory", "write"]) else {
        return;
    };
    let n = |k: &str| p[k].as_u64().unwrap_or(0);
    assert_eq!(p["directory"], "write", "{p}");
    assert_eq!(n("directory_sent"), 0, "a datagram was sent: {p}");
    assert_eq!(n("directory_reads"), 0, "a record was pulled: {p}");
    assert!(n("directory_writes") > 0, "{p}");
    // Three phases per publication at least (sequence, record, sequence).
    assert!(n("directory_write_ops") >= 3 * n("directory_writes"), "{p}");
    assert!(n("directory_write_bytes") > 0, "{p}");
    assert_eq!(n("directory_write_failed"), 0, "{p}");
}
