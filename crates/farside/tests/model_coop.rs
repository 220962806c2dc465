//! `farside model coop` end to end: a small trace, hand-set costs and a kept-run
//! fixture in a temporary directory; the comparison passes or fails by the tolerance
//! and labels the extrapolation accordingly; and `--calibrate` measures real nodes the
//! way the lab runs them.

use std::io::Write;
use std::path::Path;
use std::process::Output;

mod common;
use common::Dir;

/// A World Cup-format trace (gzip'd CSV) of `requests` requests over 300 objects with a
/// skewed popularity.
fn write_trace(path: &Path, requests: usize) {
    let f = std::fs::File::create(path).unwrap();
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    writeln!(gz, "timestamp,client_id,url,status,size").unwrap();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in 0..requests {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let u = (x >> 11) as f64 / (1u64 << 53) as f64;
        let id = (u * u * u * 300.0) as u64;
        let size = 500 + (id * 7919) % 20_000;
        writeln!(gz, "{i},1,/o/{id},200,{size}").unwrap();
    }
    gz.finish().unwrap();
}

const COSTS: &str = r#"{
  "format": "farside-coop-costs/1",
  "provenance": {"commit": "fixture", "tree_dirty": false, "kernel": "k", "host": "h",
    "cpus": 2, "build": "debug", "measured_at": "2026-01-01T00:00:00Z",
    "load_avg": [0.0, 0.0], "method": "set by hand for the test"},
  "costs": {"cpu_request_ns": 60000, "cpu_per_kb_ns": 2000, "disk_access_ns": 0,
    "disk_per_kb_ns": 0, "nic_per_kb_ns": 0, "cpu_read_chunk_ns": 5000,
    "cpu_xdp_chunk_ns": 2000, "cpu_forward_ns": 40000, "cpu_forward_per_kb_ns": 500,
    "cpu_peer_serve_ns": 50000, "cpu_peer_serve_per_kb_ns": 1500, "cpu_miss_ns": 30000,
    "cpu_miss_per_kb_ns": 1000, "cpu_directory_build_ns": 20000,
    "cpu_directory_send_ns": 10000, "cpu_directory_apply_ns": 10000},
  "disk": {"configured_latency_us": 5000, "configured_bytes_per_s": 40000000,
    "measured_access_ns": 5060000.0, "measured_per_kb_ns": 25600.0},
  "client_request_ns": 30000.0, "client_per_kb_ns": 500.0, "samples": []
}"#;

fn write_run(dir: &Path, tps: [f64; 2]) {
    std::fs::create_dir_all(dir).unwrap();
    let point = |system: &str, tps: f64| {
        serde_json::json!({"system": system, "nodes": 2, "cache_bytes": 150000,
            "load_model": "closed", "clients": 8, "duration_s": 1.0, "tps": tps,
            "p50_ms": 1.0, "p99_ms": 20.0, "local_frac": 0.5, "remote_frac": 0.2,
            "miss_frac": 0.3, "wrong_bodies": 0})
    };
    // One second measured after half a second of warm-up: the simulated replays stay short.
    let run = serde_json::json!({"experiment": "coop", "quick": false, "cpu_quota_pct": 40,
        "disk_latency_us": 5000, "warmup_s": 0.5, "points": [point("rr", tps[0]), point("press-tcp", tps[1])]});
    std::fs::write(dir.join("points.json"), run.to_string()).unwrap();
}

fn model(dir: &Path, run: &Path, out: &str, extra: &[&str]) -> (Output, String) {
    let o = std::process::Command::new(common::exe())
        .args(["model", "coop", "--costs"])
        .arg(dir.join("costs.json"))
        .arg("--trace")
        .arg(dir.join("trace.csv.gz"))
        .arg("--runs")
        .arg(run)
        .arg("--out")
        .arg(dir.join(out))
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    (o, text)
}

/// The predicted throughput of `system` in the table.
fn predicted(text: &str, system: &str) -> f64 {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() > 5 && w[1] == system)
        .and_then(|w| w[4].parse().ok())
        .unwrap_or_else(|| panic!("no {system} row in:\n{text}"))
}

#[test]
fn predictions_outside_the_tolerance_fail_and_within_it_pass() {
    let dir = Dir::new("model");
    write_trace(&dir.0.join("trace.csv.gz"), 4000);
    std::fs::write(dir.0.join("costs.json"), COSTS).unwrap();
    // Measured figures the model cannot match: FAIL, exit 1, the extrapolation unchecked.
    let run = dir.0.join("run-far");
    write_run(&run, [1.0, 1.0]);
    let (o, text) = model(&dir.0, &run, "far", &[]);
    assert!(!o.status.success(), "{text}");
    assert!(text.contains("FAIL") && !text.contains(" PASS "), "{text}");
    assert!(text.contains("model output, UNCHECKED: 2 of 2"), "{text}");
    assert!(text.contains("Little: not checkable"), "{text}");
    // A file measured once has no spread: the checks are not repeated at its ends.
    assert!(
        text.contains("no spread in a costs file (format farside-coop-costs/1"),
        "{text}"
    );
    // A format 1 file has no delay: the output says the delay centre is 0.
    assert!(
        text.contains("no delay in the costs file (format farside-coop-costs/1)")
            && text.contains("delay centre 0"),
        "{text}"
    );
    assert!(dir.0.join("far/model.txt").exists());
    // The same configurations measured at what the model predicts (within 10 %): PASS.
    let (rr, press) = (predicted(&text, "rr"), predicted(&text, "press-tcp"));
    assert!(rr > 0.0 && press > 0.0);
    let run = dir.0.join("run-near");
    write_run(&run, [rr * 1.1, press * 0.92]);
    let (o, text) = model(&dir.0, &run, "near", &[]);
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(text.matches(" PASS ").count(), 2, "{text}");
    assert!(
        text.contains("extrapolation, model output (extrapolated from checked"),
        "{text}"
    );
    // These costs have no peer-fetch costs per transport, so press-xdp is not modelled and
    // the paper's 55% stands beside no gain; the cooperation gain is still extrapolated.
    assert!(
        text.contains("32 nodes") && text.contains("no gain beside the paper's 55%"),
        "{text}"
    );
    // The same seed gives the same prediction.
    let (_, again) = model(&dir.0, &run, "again", &["--no-extrapolate"]);
    assert_eq!(predicted(&again, "rr"), rr);
}

#[test]
fn each_point_is_checked_with_the_costs_of_its_own_shape() {
    let dir = Dir::new("model-shape");
    write_trace(&dir.0.join("trace.csv.gz"), 4000);
    std::fs::write(dir.0.join("costs.json"), COSTS).unwrap();
    let run = dir.0.join("run");
    write_run(&run, [100.0, 100.0]);
    let (_, alone) = model(&dir.0, &run, "alone", &["--no-extrapolate"]);
    // The same costs with a local hit a hundred times as dear (the CPU, not the disk,
    // binds), calibrated at the run's own shape (2 nodes at 40 %): the run's points
    // take them.
    let mut dear: serde_json::Value = serde_json::from_str(COSTS).unwrap();
    dear["costs"]["cpu_request_ns"] = 6_000_000.into();
    let shaped = |nodes: u32| {
        let mut f = dear.clone();
        f["shape"] = serde_json::json!({"nodes": nodes, "cpu_quota_pct": 40});
        let p = dir.0.join(format!("costs-{nodes}.json"));
        std::fs::write(&p, f.to_string()).unwrap();
        p.display().to_string()
    };
    let two = shaped(2);
    let (o, text) = model(
        &dir.0,
        &run,
        "shaped",
        &["--no-extrapolate", "--costs", &two],
    );
    assert!(!o.status.success(), "{text}");
    assert!(
        text.contains("calibrated at 4 nodes at 40 %")
            && text.contains("calibrated at 2 nodes at 40 %"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{two} (2 nodes at 40 %): run rr (2 nodes), run press-tcp (2 nodes)"
        )),
        "{text}"
    );
    let (a, b) = (predicted(&alone, "rr"), predicted(&text, "rr"));
    assert!(
        b < a * 0.9,
        "dearer costs predict less: {a} then {b}\n{text}"
    );
    // Costs of another shape (8 nodes) check no point: the first file's are taken.
    let eight = shaped(8);
    let (_, text) = model(
        &dir.0,
        &run,
        "other",
        &["--no-extrapolate", "--costs", &eight],
    );
    assert!(text.contains("(8 nodes at 40 %): no point"), "{text}");
    assert_eq!(predicted(&text, "rr"), a, "{text}");
    assert_eq!(
        predicted(&text, "press-tcp"),
        predicted(&alone, "press-tcp")
    );
    // --calibrate writes one file.
    let o = std::process::Command::new(common::exe())
        .args(["model", "coop", "--calibrate", "--costs", "a.json,b.json"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("one costs file"));
}

#[test]
fn the_model_refuses_to_run_without_measured_costs() {
    let o = std::process::Command::new(common::exe())
        .args(["model", "coop"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("measured costs only"));
}

#[test]
fn calibration_measures_real_nodes_and_records_its_provenance() {
    let dir = Dir::new("calibrate");
    let out = dir.0.join("out");
    let o = std::process::Command::new(common::exe())
        .args([
            "model",
            "coop",
            "--calibrate",
            "--calibrate-requests",
            "200",
            // Long enough that the nodes' counters, read through their 40 % quota on a
            // busy host, are taken well inside the clients' window.
            "--calibrate-seconds",
            "0.8",
            // Two repeats: a median and a spread, in half the time of the default.
            "--calibrate-repeats",
            "2",
            // Not the default shape: 2 nodes at half a CPU each.
            "--calibrate-nodes",
            "2",
            "--calibrate-cpu-quota-pct",
            "50",
            "--no-extrapolate",
            "--nodes",
            "2",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let f: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("costs.json")).unwrap()).unwrap();
    assert_eq!(f["format"], "farside-coop-costs/4");
    assert_eq!(
        f["shape"],
        serde_json::json!({"nodes": 2, "cpu_quota_pct": 50}),
        "{f}"
    );
    assert!(f["costs"]["cpu_request_ns"].as_u64().unwrap() > 0, "{f}");
    assert!(f["costs"]["cpu_peer_serve_ns"].as_u64().unwrap() > 0, "{f}");
    // The emulated disk takes at least its configured 5 ms per read.
    assert!(
        f["disk"]["measured_access_ns"].as_f64().unwrap() >= 5.0e6,
        "{f}"
    );
    assert!(f["provenance"]["kernel"].as_str().unwrap() != "unknown");
    // Per repeat, at four sizes: local, client and host-wide local (tcp set-up), the
    // paired local and host-wide local of the three other transports' set-ups and of
    // the rr set-up, miss and host-wide miss, the peer fetch of every transport (initial
    // node, service node, softirq, host-wide) and the disk; three directory costs. Once:
    // the host speed reference before each of the five set-ups and after the last.
    let samples = f["samples"].as_array().unwrap();
    assert_eq!(
        samples.len(),
        2 * (4 * (3 + 3 * 2 + 2 + 2 + 4 * 4 + 1) + 3) + 6,
        "{f}"
    );
    let speed = f["host_wide"]["reference_ns_per_op"].as_f64().unwrap();
    assert!(speed > 0.0, "{f}");
    assert_eq!(
        samples
            .iter()
            .filter(|x| x["phase"] == "host-reference")
            .count(),
        6,
        "{f}"
    );
    for r in 0..2 {
        assert!(samples.iter().any(|x| x["repeat"] == r), "{f}");
    }
    // The spread: every repeat's costs, and each cost's lowest, median and highest.
    let sp = &f["spread"];
    assert_eq!(sp["repeats"], 2, "{sp}");
    assert_eq!(sp["per_repeat"].as_array().unwrap().len(), 2, "{sp}");
    let cpu = |set: &serde_json::Value| set["costs"]["cpu_request_ns"].as_u64().unwrap();
    let med = f["costs"]["cpu_request_ns"].as_u64().unwrap();
    assert!(cpu(&sp["low"]) <= med && med <= cpu(&sp["high"]), "{sp}");
    assert_eq!(sp["low"]["transports"].as_array().unwrap().len(), 4, "{sp}");
    // The host-wide busy time of every lab-shaped phase (the tcp, udp, xdp, shm and rr
    // set-ups' local phases, miss, 4 transports) at each size and repeat: busy time
    // counted, steal inside it, and a local hit costs the host something.
    let hw = &f["host_wide"];
    let phases = hw["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2 * 4 * 10, "{hw}");
    for p in phases {
        let busy = p["busy_ns"].as_u64().unwrap();
        assert!(busy > 0 && p["requests"].as_u64().unwrap() > 0, "{p}");
        assert!(busy >= p["steal_ns"].as_u64().unwrap(), "{p}");
    }
    assert!(hw["local_ns"].as_f64().unwrap() + hw["local_per_kb_ns"].as_f64().unwrap() > 0.0);
    assert_eq!(hw["fetch"].as_array().unwrap().len(), 4, "{hw}");
    assert!(hw["unattributed_share"].as_f64().unwrap().is_finite());
    // Measured the lab's way: nodes at their quota driven by farside loadgen replaying
    // sessions, every phase counting requests of its kind from the nodes.
    let method = f["provenance"]["method"].as_str().unwrap();
    assert!(
        method.contains("lab-shaped: 2 nodes")
            && method.contains("at 50 % of a CPU each")
            && method.contains("farside loadgen"),
        "{method}"
    );
    for x in samples {
        let phase = x["phase"].as_str().unwrap();
        if phase.starts_with("local") || phase == "miss" || phase.starts_with("fetch-") {
            assert!(x["requests"].as_u64().unwrap() > 0, "{x}");
        }
    }
    for t in ["tcp", "udp", "xdp", "shm"] {
        let name = format!("fetch-{t}-initial");
        assert!(
            samples.iter().any(|x| x.to_string().contains(&name)),
            "no {name} sample: {f}"
        );
    }
    // The delay: a light phase per kind (local, miss, 4 transports) and size, one client
    // in all, its measured time per request less the model's own answer recorded with
    // both; a line per kind, every clamp listed.
    let d = &f["delay"];
    assert_eq!(d["clients"], 1, "{d}");
    let phases = d["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 4 * 6, "{d}");
    for p in phases {
        let (m, model) = (
            p["measured_ns"].as_f64().unwrap(),
            p["model_ns"].as_f64().unwrap(),
        );
        assert!(p["requests"].as_u64().unwrap() > 0, "{p}");
        assert!(m > 0.0 && model > 0.0, "{p}");
        assert!(
            (p["delay_ns"].as_f64().unwrap() - (m - model)).abs() < 1e-3,
            "{p}"
        );
        assert!(p["latency_mean_ns"].as_f64().unwrap() > 0.0, "{p}");
    }
    assert!(d["local_ns"].as_f64().unwrap() >= 0.0, "{d}");
    assert_eq!(d["fetch"].as_array().unwrap().len(), 4, "{d}");
    assert!(d["clamped"].is_array(), "{d}");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("UNCHECKED"), "{text}");
    assert!(
        text.contains("delay per request at light load") && text.contains("delay centre"),
        "{text}"
    );
    assert!(
        text.contains("costs measured in 2 repeats") && text.contains("spread of the repeats"),
        "{text}"
    );
}
