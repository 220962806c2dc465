//! `farside lab reconfig`: tiny runs on network namespaces and on loopback (root) in
//! which the proxies' balancers move a node to the loaded site and the summary carries
//! the keys, switching time measured from the balancer's CAS to the node's first
//! request in the new role, and the decision-to-move latency; bad host modes and
//! transports are refused with the reason.

use std::path::Path;

mod common;
use common::{exe, Dir};

fn summary(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn bad_hosts_and_transports_are_refused_with_the_reason() {
    let dir = Dir::new("reconfig-refused");
    for (args, want) in [
        (
            &["--hosts", "cloud"][..],
            "invalid value 'cloud' for '--hosts",
        ),
        (
            &["--hosts", "loopback", "--transport", "xdp"][..],
            "no XDP on lo",
        ),
        (&["--transport", "shm"][..], "xdp or tcp"),
    ] {
        let st = std::process::Command::new(exe())
            .args(["lab", "reconfig"])
            .args(args)
            .arg("--out")
            .arg(dir.0.join("out"))
            .output()
            .unwrap();
        assert!(!st.status.success(), "{args:?}");
        let e = String::from_utf8_lossy(&st.stderr);
        assert!(e.contains(want), "{args:?}: {e}");
    }
}

/// The timing keys of a `reconf` point that moved nodes: switching time from the
/// balancers' CAS to the first request in the new role, decision-to-move latency, the
/// agents' apply time beside them, and the per-move records they come from.
fn check_move_timings(reconf: &serde_json::Value) {
    let moves = reconf["moves"].as_u64().unwrap();
    let timed = reconf["moves_timed"].as_array().unwrap();
    // Every counted move is logged with its timing (a move between the lab's metrics
    // scrape and its reading of the logs can only add a line).
    assert!(
        timed.len() as u64 >= moves && moves >= 1,
        "every balancer move logged with its timing: {reconf}"
    );
    let matched: Vec<f64> = timed
        .iter()
        .filter_map(|m| m["switch_ms"].as_f64())
        .collect();
    assert!(!matched.is_empty(), "a move served its new site: {reconf}");
    assert_eq!(
        reconf["switch_unmatched"].as_u64().unwrap(),
        timed.len() as u64 - matched.len() as u64
    );
    for m in timed {
        let d = m["decision_ms"].as_f64().unwrap();
        let r = m["round_ms"].as_f64().unwrap();
        // A decision is followed by at least a lock read, an acquire, an intent and the
        // move CAS, each a round trip; and it comes after the round's reads.
        assert!(d > 0.0 && d <= r, "{m}");
        assert!(d < 1000.0, "decision to move within the lease: {m}");
    }
    for &sw in &matched {
        // CAS -> agent poll -> drain -> switch -> proxies see the served word -> request.
        assert!(sw > 0.0 && sw < 10_000.0, "{sw}");
    }
    let p50 = reconf["switch_p50_ms"].as_f64().unwrap();
    let p99 = reconf["switch_p99_ms"].as_f64().unwrap();
    assert!(p50 > 0.0 && p99 >= p50, "{reconf}");
    let max = matched.iter().cloned().fold(0.0, f64::max);
    assert!(p99 <= max + 1e-6, "quantiles of the joined moves: {reconf}");
    assert!(
        reconf["decision_p50_ms"].as_f64().unwrap() > 0.0,
        "{reconf}"
    );
    assert!(reconf["decision_p99_ms"].as_f64().is_some(), "{reconf}");
    // The agents' own part, a separate key (gatherd's histogram).
    assert!(reconf["apply_p50_ms"].as_f64().is_some(), "{reconf}");
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside -- --include-ignored` as root"]
fn netns_reconf_moves_a_node_to_the_loaded_site() {
    assert!(farside_lab::fabric::netns::is_root(), "needs root");
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
    check_move_timings(reconf);
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
    // The lab's own set-up moves are no balancer moves: no switch time from them.
    assert!(over["moves_timed"].as_array().unwrap().is_empty(), "{over}");
    assert!(over["switch_p50_ms"].is_null(), "{over}");
    for f in [
        "table.txt",
        "reconfig.csv",
        "nodes-reconf-T300-2-2-1200.csv",
        "fig7-tps-2-2.svg",
        "fig8-nodes-2-2-L1200.svg",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    let table = std::fs::read_to_string(out.join("table.txt")).unwrap();
    assert!(
        table.contains("Fig. 7") && table.contains("dec_p50"),
        "{table}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("fig7-tps-2-2.svg"), "figures in the report");
    assert!(out.join("configs/reconf-T300-2-2-p0.toml").exists());
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside -- --include-ignored` as root"]
fn loopback_reconf_moves_a_node_over_shm_with_per_node_quotas() {
    assert!(
        farside_lab::fabric::netns::is_root(),
        "needs root (a cgroup per node)"
    );
    let dir = Dir::new("reconfig-loopback");
    let out = dir.0.join("out");
    // As the netns test, with every node a set of processes on 127.0.0.1 in its own
    // cgroup, and the regions mapped by the proxies (shm: CAS and FETCH-ADD in place).
    let (_, stderr) = common::run_lab(
        &[
            "reconfig",
            "--hosts",
            "loopback",
            "--scenario",
            "2:2",
            "--systems",
            "reconf",
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
            "--sweep-t",
            "300",
            "--lease-ms",
            "1000",
        ],
        &out,
    );
    let s = summary(&out);
    assert_eq!(s["hosts"], "loopback", "{stderr}");
    let points = s["points"].as_array().unwrap();
    assert_eq!(points.len(), 1, "{points:?}");
    let reconf = &points[0];
    assert_eq!(reconf["transport"], "shm");
    assert_eq!(reconf["served"], 2400, "{reconf}");
    assert!(reconf["moves"].as_u64().unwrap() >= 1, "{reconf}");
    check_move_timings(reconf);
    let notes = s["notes"].to_string();
    assert!(
        notes.contains("processes on 127.0.0.1") && notes.contains("one-sided on one host"),
        "{notes}"
    );
}
