//! `farside lab reconfig`: a tiny run on network namespaces (root) in which the proxies'
//! balancers move a node to the loaded site and the summary carries the keys;
//! without netns the command refuses with the reason.

use std::path::Path;

mod common;
use common::{exe, Dir};

fn summary(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn loopback_is_refused_with_the_reason() {
    let dir = Dir::new("reconfig-loopback");
    let st = std::process::Command::new(exe())
        .args(["lab", "reconfig", "--hosts", "loopback", "--out"])
        .arg(dir.0.join("out"))
        .output()
        .unwrap();
    assert!(!st.status.success());
    let e = String::from_utf8_lossy(&st.stderr);
    assert!(e.contains("--hosts loopback") && e.contains("netns"), "{e}");
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside -- --include-ignored` as root"]
fn netns_reconf_moves_a_node_to_the_loaded_site() {
    assert!(farside_lab::netns::is_root(), "needs root");
    let dir = Dir::new("reconfig-netns");
    let out = dir.0.join("out");
    // 2 sites on 4 nodes of 10% of a CPU each; 1 ms of CPU per request makes a node
    // serve ~100 requests/s, so a burst of 1,200 to one site keeps its 2 nodes busy for
    // seconds while T = 300 ms and S = 100 ms let the balancers move the idle site's
    // spare node within the burst.
    common::run_lab(
        &[
            "reconfig",
            "--scenario",
            "2:2",
            "--systems",
            "reconf,overprovisioned",
            "--bursts",
            "1200",
            "--proxies",
            "2",
            "--clients",
            "16",
            "--node-cpu-pct",
            "10",
            "--cpu-us-per-request",
            "1000",
            "--sensitivity-ms",
            "100",
            "--history-ms",
            "300",
            "--lease-ms",
            "1000",
        ],
        &out,
    );
    let s = summary(&out);
    assert_eq!(s["experiment"], "reconfig");
    let points = s["points"].as_array().unwrap();
    assert_eq!(points.len(), 2, "{points:?}");
    for p in points {
        for k in [
            "system",
            "scenario",
            "burst",
            "tps",
            "moves",
            "switch_p50_ms",
            "switch_p99_ms",
            "transport",
        ] {
            assert!(p.get(k).is_some(), "key {k} missing: {p}");
        }
        assert_eq!(p["scenario"], "2:2");
        assert_eq!(p["burst"], 1200);
        assert_eq!(p["transport"], "xdp");
        assert!(p["tps"].as_f64().unwrap() > 0.0, "{p}");
        assert_eq!(
            p["served"], 2400,
            "every request of both bursts served: {p}"
        );
        assert!(!p["series"].as_array().unwrap().is_empty(), "{p}");
    }
    let reconf = points.iter().find(|p| p["system"] == "reconf").unwrap();
    assert!(reconf["moves"].as_u64().unwrap() >= 1, "{reconf}");
    assert_eq!(reconf["history_ms"], 300, "{reconf}");
    assert!(reconf["switch_p50_ms"].as_f64().is_some(), "{reconf}");
    // The loaded site was served by more than its 2 static nodes at some point.
    assert!(
        reconf["series"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["nodes"].as_u64().unwrap() > 2),
        "{reconf}"
    );
    let over = points
        .iter()
        .find(|p| p["system"] == "overprovisioned")
        .unwrap();
    assert_eq!(over["moves"], 0, "no balancer runs: {over}");
    assert!(over["lab_moves"].as_u64().unwrap() >= 1, "{over}");
    for f in [
        "table.txt",
        "reconfig.csv",
        "nodes-reconf-T300-2-2-1200.csv",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    let table = std::fs::read_to_string(out.join("table.txt")).unwrap();
    assert!(table.contains("Fig. 7"), "{table}");
    assert!(out.join("configs/reconf-T300-2-2-p0.toml").exists());
}
