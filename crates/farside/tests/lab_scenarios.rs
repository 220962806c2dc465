//! `farside lab admission --scenario`: every scenario builds and measures on loopback
//! with tiny durations, HAProxy included, and `summary.json` carries the keys the
//! scenario tables are made of.

use std::path::Path;

mod common;
use common::{exe, Dir};

/// Run `lab admission --quick` with 1 s points after 0.2 s of warm-up, one client count
/// and one open-loop rate, and return summary.json.
fn lab(args: &[&str], out: &Path) -> serde_json::Value {
    let mut all = vec![
        "admission",
        "--quick",
        "--duration-s",
        "1",
        "--warmup-s",
        "0.2",
    ];
    all.extend([
        "--traces",
        "single",
        "--clients",
        "6",
        "--rates",
        "1.5",
        "--backend-cpu-us",
        "300",
    ]);
    all.extend(args);
    common::run_lab(&all, out);
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

/// True when HAProxy is installed; otherwise records a skip of `test`.
fn has_haproxy(test: &str) -> bool {
    match farside_lab::haproxy::find_binary() {
        Ok(_) => true,
        Err(e) => {
            farside_testkit::skip(test, &e.to_string());
            false
        }
    }
}

#[test]
fn multi_proxy_runs_haproxy_and_onesided_ac_in_both_loop_models() {
    if !has_haproxy("multi_proxy_runs_haproxy_and_onesided_ac_in_both_loop_models") {
        return;
    }
    let dir = Dir::new("multi");
    let out = dir.0.join("out");
    let s = lab(
        &[
            "--scenario",
            "multi-proxy",
            "--systems",
            "haproxy,onesided-ac",
            "--proxies",
            "2",
        ],
        &out,
    );
    let points = s["points"].as_array().unwrap();
    // 2 systems x (1 client count + 1 rate).
    assert_eq!(points.len(), 4, "{points:?}");
    let mut seen = std::collections::BTreeSet::new();
    for p in points {
        for k in [
            "system",
            "scenario",
            "load_model",
            "avg_ms",
            "p99_ms",
            "goodput",
            "drop_rate",
            "offered_rps",
            "reject_p99_ms",
            "inflight_at_end",
        ] {
            assert!(p.get(k).is_some(), "point lacks `{k}`: {p}");
        }
        assert_eq!(p["scenario"], "multi-proxy");
        let served = p["served"].as_u64().unwrap() + p["dropped"].as_u64().unwrap();
        assert!(served > 0, "every point got answers: {p}");
        seen.insert((
            p["system"].as_str().unwrap().to_string(),
            p["load_model"].as_str().unwrap().to_string(),
        ));
        if p["load_model"] == "open" {
            assert!(p["rate_rps"].as_f64().unwrap() > 0.0, "{p}");
            assert!(p["offered_rps"].as_f64().unwrap() > 0.0, "{p}");
        }
    }
    assert_eq!(seen.len(), 4, "each system in both loop models: {seen:?}");
    // The HAProxy configuration the lab wrote is in the summary and the report, with a
    // per-server maxconn of the back-end's workers (16 by default).
    let cfg = s["params"]["haproxy_config"].as_str().unwrap();
    assert!(cfg.contains("server b0 <b0> maxconn 16"), "{cfg}");
    assert!(cfg.contains("timeout queue 50ms"), "{cfg}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("HAProxy configuration"));
    // Two proxies of each kind ran: one configuration (and log) per HAProxy instance.
    for f in [
        "haproxy-proxy0.cfg",
        "haproxy-proxy1.cfg",
        "onesided-ac-proxy1.log",
    ] {
        assert!(out.join("logs").join(f).exists(), "{f}");
    }
    assert!(s["params"]["capacity_rps"].as_f64().unwrap() > 0.0);
}

#[test]
fn disturbance_scenarios_run_and_record_how_they_were_applied() {
    let dir = Dir::new("disturb");
    let out = dir.0.join("out");
    let s = lab(
        &[
            "--scenario",
            "tenant-load,mixed-cost,capacity-change",
            "--systems",
            "onesided-ac",
            "--tenant-procs",
            "1",
        ],
        &out,
    );
    let points = s["points"].as_array().unwrap();
    let got: Vec<(String, String)> = points
        .iter()
        .map(|p| {
            (
                p["scenario"].as_str().unwrap().to_string(),
                p["load_model"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = ["tenant-load", "mixed-cost", "capacity-change"]
        .iter()
        .flat_map(|sc| ["closed", "open"].map(|m| (sc.to_string(), m.to_string())))
        .collect();
    assert_eq!(got, want);
    for p in points {
        assert!(p["tps"].as_f64().unwrap() > 0.0, "served requests: {p}");
    }
    for k in ["tenant_load", "capacity_change"] {
        let st = &s["settings"][k];
        assert_eq!(st["applied"], true, "{k}: {st}");
        assert!(st["reason"].as_str().unwrap().contains("SIGSTOP"), "{st}");
    }
    // mixed-cost's requests cost more on average: its open loop uses a lower capacity.
    let by = &s["params"]["capacity_rps_by_scenario"];
    assert!(by["mixed-cost"].as_f64().unwrap() < by["tenant-load"].as_f64().unwrap());
}

#[test]
fn mixed_cost_and_capacity_change_run_haproxy_and_onesided_ac_under_one_objective() {
    if !has_haproxy(
        "mixed_cost_and_capacity_change_run_haproxy_and_onesided_ac_under_one_objective",
    ) {
        return;
    }
    let dir = Dir::new("anchor");
    let out = dir.0.join("out");
    let s = lab(
        &[
            "--scenario",
            "mixed-cost,capacity-change",
            "--systems",
            "haproxy,onesided-ac",
            "--queue-ms",
            "40",
        ],
        &out,
    );
    let points = s["points"].as_array().unwrap();
    // 2 scenarios x 2 systems x (1 client count + 1 rate).
    assert_eq!(points.len(), 8, "{points:?}");
    let mut seen = std::collections::BTreeSet::new();
    for p in points {
        for k in [
            "system",
            "scenario",
            "avg_ms",
            "p99_ms",
            "goodput",
            "drop_rate",
        ] {
            assert!(p.get(k).is_some(), "point lacks `{k}`: {p}");
        }
        assert!(p["goodput"].as_f64().unwrap() > 0.0, "served requests: {p}");
        seen.insert((
            p["scenario"].as_str().unwrap().to_string(),
            p["system"].as_str().unwrap().to_string(),
            p["load_model"].as_str().unwrap().to_string(),
        ));
    }
    assert_eq!(seen.len(), 8, "{seen:?}");
    // One bound for both: HAProxy's timeout queue, the farside proxy's queue timeout,
    // and the backlog limit derived from it, recorded with the rule.
    let params = &s["params"];
    assert_eq!(params["queue_ms"], 40);
    assert_eq!(params["objective"]["queue_ms"], 40);
    let rule = params["objective_rule"].as_str().unwrap();
    assert!(rule.contains("timeout queue 40 ms"), "{rule}");
    let cfg = params["haproxy_config"].as_str().unwrap();
    assert!(cfg.contains("timeout queue 40ms"), "{cfg}");
    let args = params["proxy_args_by_system"]["onesided-ac"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect::<Vec<_>>()
        .join(" ");
    let l = params["objective"]["queue_len"].as_u64().unwrap();
    assert!(
        args.starts_with("--queue-timeout-ms 40 --admission --metric backlog")
            && args.ends_with(&format!("--limit {l}")),
        "{args}"
    );
    let report = std::fs::read_to_string(out.join("table.txt")).unwrap_or_default()
        + &std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(report.contains("Where served time went"), "no time split");
}

#[test]
fn scenario_flags_are_checked_before_anything_starts() {
    let dir = Dir::new("bad");
    let st = std::process::Command::new(exe())
        .args([
            "lab",
            "admission",
            "--scenario",
            "multi-proxy",
            "--proxies",
            "9",
        ])
        .arg("--out")
        .arg(dir.0.join("out"))
        .output()
        .unwrap();
    assert!(!st.status.success());
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(err.contains("--proxies 9"), "{err}");
    let st = std::process::Command::new(exe())
        .args(["lab", "admission", "--scenario", "nonsense"])
        .output()
        .unwrap();
    assert!(!st.status.success());
    let help = std::process::Command::new(exe())
        .args(["lab", "admission", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for s in [
        "single",
        "multi-proxy",
        "tenant-load",
        "mixed-cost",
        "capacity-change",
        "haproxy",
        "--load",
        "--rates",
        "--on-reject",
    ] {
        assert!(help.contains(s), "--help lacks {s}");
    }
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside -- --include-ignored` as root"]
fn netns_runs_haproxy_and_onesided_ac_across_proxies_and_a_capacity_change() {
    assert!(farside_lab::fabric::netns::is_root(), "needs root");
    if !has_haproxy("netns_runs_haproxy_and_onesided_ac_across_proxies_and_a_capacity_change") {
        return;
    }
    let dir = Dir::new("netns");
    let out = dir.0.join("out");
    let s = lab(
        &[
            "--hosts",
            "netns",
            "--scenario",
            "multi-proxy,capacity-change",
            "--systems",
            "haproxy,onesided-ac",
            "--proxies",
            "2",
        ],
        &out,
    );
    assert_eq!(s["hosts"], "netns");
    let points = s["points"].as_array().unwrap();
    // 2 scenarios x 2 systems x (1 client count + 1 rate).
    assert_eq!(points.len(), 8);
    for p in points {
        assert!(p["tps"].as_f64().unwrap() > 0.0, "served requests: {p}");
        if p["system"] == "onesided-ac" {
            // One-sided across namespaces: the XDP responder answers the proxies.
            assert_eq!(p["transport"], "udp-xdp", "{p}");
        }
    }
    assert_eq!(s["settings"]["capacity_change"]["applied"], true);
    assert_eq!(
        s["settings"]["capacity_change_cpu_quota"]["applied"], false,
        "the quota is emulated, and said so"
    );
}

#[test]
#[ignore = "needs root and nginx: run with `cargo test -p farside -- --include-ignored` as root"]
fn nginx_in_netns_runs_inside_a_short_period_cpu_quota_with_a_calibrated_capacity() {
    assert!(farside_lab::fabric::netns::is_root(), "needs root");
    if let Err(e) = farside_lab::nginx::find_binary() {
        panic!("needs nginx (scripts/setup.sh installs nginx-light): {e}");
    }
    let dir = Dir::new("nginx-quota");
    let out = dir.0.join("out");
    let s = lab(
        &[
            "--hosts",
            "netns",
            "--backend-server",
            "nginx",
            "--systems",
            "no-ac",
        ],
        &out,
    );
    let p = &s["params"];
    // The default quota for 2 nginx back-ends: 10 % of a CPU each, in a 10 ms period.
    let (quota_us, period_us) = farside_lab::fabric::netns::cpu_quota_period(10);
    assert_eq!(p["backend_quota"]["pct"], 10, "{}", p["backend_quota"]);
    assert_eq!(p["backend_quota"]["quota_us"], quota_us);
    assert_eq!(p["backend_quota"]["period_us"], period_us);
    assert_eq!(period_us, farside_lab::fabric::netns::CPU_PERIOD_US);
    assert!(
        s["settings"]["cgroups"]["requested"]
            .as_str()
            .unwrap()
            .contains("10 % of one CPU"),
        "{}",
        s["settings"]
    );
    // The calibrated capacity is what the open loop and the limit rule use.
    let cal = &p["calibration"];
    let cap = cal["capacity_rps"].as_f64().unwrap();
    assert!(cap > 0.0, "{cal}");
    assert_eq!(p["capacity_rps"].as_f64(), Some(cap));
    assert!(
        p["capacity_rule"]
            .as_str()
            .unwrap()
            .starts_with("calibrated"),
        "{}",
        p["capacity_rule"]
    );
    assert_eq!(cal["clients"], 64);
    let per_backend = format!("{:.1} req/s per back-end", cap / 2.0);
    assert!(
        p["objective_rule"].as_str().unwrap().contains(&per_backend),
        "{} lacks {per_backend}",
        p["objective_rule"]
    );
    // While the calibration ran, each node's cgroup had the quota and hit it.
    let nodes = cal["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{cal}");
    for n in nodes {
        assert_eq!(
            n["cpu"]["cpu_max"],
            format!("{quota_us} {period_us}"),
            "{n}"
        );
        assert!(n["cpu"]["nr_periods"].as_u64().unwrap() > 0, "{n}");
        assert!(n["cpu"]["nr_throttled"].as_u64().unwrap() > 0, "{n}");
        assert!(n["web_cpu_s"].as_f64().unwrap() > 0.0, "{n}");
    }
    // One closed-loop point and one open-loop point at 1.5 x the calibrated capacity.
    let points = s["points"].as_array().unwrap();
    assert_eq!(points.len(), 2, "{points:?}");
    for pt in points {
        assert!(pt["tps"].as_f64().unwrap() > 0.0, "served requests: {pt}");
    }
    let open = points.iter().find(|pt| pt["load_model"] == "open").unwrap();
    let rate = open["rate_rps"].as_f64().unwrap();
    assert!(
        (rate - 1.5 * cap).abs() < 1e-6 * cap,
        "{rate} vs 1.5 x {cap}"
    );
}
