//! `farside lab speculative`: a tiny run of each experiment on network namespaces (root)
//! through the blind eBPF front-end: the summary's keys, an unmodified client (curl)
//! fetching the 4 KB page from the VIP during the run, and nothing left behind (no
//! namespace, no state file, no process); one speculative point (spec32, `farside specd`
//! on both back-ends) that migrates connections without losing one. Without netns, or
//! with a malformed system, the command refuses with the reason.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{exe, Dir};

/// Longest the tiny netns run may take (namespaces, calibration, 6 points of 2 s after
/// 3 s of warm-up each).
const RUN_MAX: Duration = Duration::from_secs(180);
/// curl's own bound per attempt, s.
const CURL_MAX_S: &str = "2";

fn summary(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

fn refused(args: &[&str], tag: &str) -> String {
    let dir = Dir::new(tag);
    let st = Command::new(exe())
        .args(["lab", "speculative"])
        .args(args)
        .arg("--out")
        .arg(dir.0.join("out"))
        .output()
        .unwrap();
    assert!(!st.status.success());
    String::from_utf8_lossy(&st.stderr).into_owned()
}

#[test]
fn loopback_and_malformed_systems_are_refused_with_the_reason() {
    let e = refused(&["--hosts", "loopback"], "spec-loopback");
    assert!(e.contains("--hosts loopback") && e.contains("netns"), "{e}");
    let e = refused(
        &["--experiment", "split", "--systems", "acc64,spec0"],
        "spec-sys",
    );
    assert!(e.contains("spec0") && e.contains("window"), "{e}");
}

/// Command lines of running processes that contain `needle`.
fn processes_with(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside -- --include-ignored` as root"]
fn netns_spec32_point_migrates_and_loses_no_connection() {
    assert!(farside_lab::fabric::netns::is_root(), "needs root");
    let dir = Dir::new("speculative-spec32");
    let out = dir.0.join("out");
    // One node: 20 % of a CPU at 2 ms per request, ~98 conn/s. 250 conn/s at 75/25 offers
    // b0 ~190 conn/s, about twice its capacity: its accept queue (64) fills within a
    // second and the window admits the excess, migrated to b1 (~60 conn/s offered).
    let o = Command::new(exe())
        .args([
            "lab",
            "speculative",
            "--quick",
            "--experiment",
            "split",
            "--systems",
            "spec32",
            "--splits",
            "75/25",
            "--rates",
            "250",
            "--load",
            "open",
            "--duration-s",
            "3",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let s = summary(&out);
    let points = s["points"].as_array().unwrap();
    assert_eq!(points.len(), 1, "{points:?}");
    let p = &points[0];
    assert_eq!(
        (p["system"].as_str(), p["split"].as_str()),
        (Some("spec32"), Some("75/25"))
    );
    assert_eq!(p["admission_window"], 32);
    assert!(p["migrations"].as_u64().unwrap() > 0, "{p}");
    // Migrations over the measured window, per second of it as its completions.
    let per_s = p["migrations_per_s"].as_f64().unwrap();
    assert!(per_s > 0.0, "{p}");
    let secs = p["served_per_s"].as_array().unwrap().len();
    assert_eq!(p["migrated_per_s"].as_array().unwrap().len(), secs, "{p}");
    let in_window: f64 = p["migrated_per_s"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .sum();
    assert!(
        in_window <= p["migrations"].as_f64().unwrap() + 1.0,
        "window {in_window} of all {}",
        p["migrations"]
    );
    assert!(out.join("fig-spec-time-split-75-25-spec32.svg").exists());
    assert!(p["migration_p50_us"].as_f64().unwrap() > 0.0, "{p}");
    assert!(
        p["migration_p99_us"].as_f64().unwrap() >= p["migration_p50_us"].as_f64().unwrap(),
        "{p}"
    );
    // Failures caused by migration: connections a specd took and then lost (`lost`:
    // neither migrated nor resumed on the source) or could not hand to its server
    // (`local_handoff_failed`, target `handoff_failed`). Zero, in the point and in each
    // daemon's own summary. (Client timeouts of SYNs dropped by an overloaded back-end's
    // full accept queue are overload, not migration, and are not counted here.)
    assert_eq!(p["migration_lost"], 0, "{p}");
    let logs = out.join("logs");
    let mut daemons = 0;
    for e in std::fs::read_dir(&logs).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.contains("-specd-") && name.ends_with(".json")) {
            continue;
        }
        daemons += 1;
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(d["source"]["lost"], 0, "{name}: {d}");
        assert_eq!(d["source"]["local_handoff_failed"], 0, "{name}: {d}");
        assert_eq!(d["target"]["handoff_failed"], 0, "{name}: {d}");
        // The per-second series counts what the totals count.
        let src = &d["source"];
        let sum = |k: &str| -> u64 {
            src["series"][k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .sum()
        };
        assert_eq!(src["series"]["evicted"], 0, "{name}");
        assert_eq!(sum("migrated"), src["migrated"].as_u64().unwrap(), "{name}");
        assert_eq!(
            sum("refused"),
            src["window"]["target_refusals"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(
            sum("closed"),
            src["window"]["closures"].as_u64().unwrap(),
            "{name}"
        );
        assert!(src["started_unix_ms"].as_u64().unwrap() > 0, "{name}");
    }
    assert_eq!(
        daemons,
        2,
        "one specd summary per back-end in {}",
        logs.display()
    );
    let notes = s["notes"].to_string();
    assert!(notes.contains("specd"), "{notes}");
    // No specd (its --summary is under <out>/logs) nor back-end left running.
    let left = processes_with(&logs.display().to_string());
    assert!(left.is_empty(), "specd left: {left:?}");
    let left = processes_with(&out.join("docroot").display().to_string());
    assert!(left.is_empty(), "back-ends left: {left:?}");
}

/// Namespaces whose name starts with `prefix`.
fn namespaces(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

/// `GET /index.html` from the VIP with curl inside namespace `ns`: the body, if any.
fn curl_vip(ns: &str) -> Option<Vec<u8>> {
    let vip = farside_lab::speculative::VIP;
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-sf", "--max-time", CURL_MAX_S])
        .arg(format!("http://{vip}/index.html"))
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status.success().then_some(out.stdout)
}

#[test]
#[ignore = "needs root and curl: run with `cargo test -p farside -- --include-ignored` as root"]
fn netns_single_and_split_points_carry_the_keys_and_leave_nothing() {
    assert!(farside_lab::fabric::netns::is_root(), "needs root");
    let dir = Dir::new("speculative-netns");
    let out = dir.0.join("out");
    // One node: 20 % of a CPU at 2 ms per request, ~98 conn/s; per line one closed-loop
    // point of 16 users and one open-loop rate of 60 conn/s (below the capacity), 2 s
    // each: two accept queues of the single server, one split.
    let mut lab = Command::new(exe())
        .args([
            "lab",
            "speculative",
            "--quick",
            "--accept-queues",
            "64,128",
            "--splits",
            "75/25",
            "--systems",
            "acc64",
            "--rates",
            "60",
            "--load",
            "both",
            "--clients",
            "16",
            "--duration-s",
            "2",
            "--out",
        ])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The lab names its run after its pid (`VirtualDc` run id `s<pid % 100000>`).
    let prefix = farside_lab::fabric::netns::netns_name(&format!("s{}", lab.id() % 100_000), "");
    let client_ns = format!("{prefix}client");
    let t0 = Instant::now();
    let mut page = None;
    let status = loop {
        if let Some(st) = lab.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < RUN_MAX,
            "the lab ran longer than {RUN_MAX:?}"
        );
        // While a point runs, the front-end routes the VIP: an unmodified client works.
        if page.is_none() && out.join("logs/single-acc64-100-60-frontend.log").exists() {
            page = curl_vip(&client_ns);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let o = lab.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(status.success(), "{stderr}");
    let page = page.expect("curl fetched the page from the VIP during the run");
    assert_eq!(page.len(), farside_lab::speculative::FILE_BYTES);

    let s = summary(&out);
    assert_eq!(s["experiment"], "speculative");
    assert_eq!(s["finished"], true);
    let points = s["points"].as_array().unwrap();
    assert_eq!(points.len(), 6, "{points:?}");
    for p in points {
        for k in [
            "system",
            "split",
            "rate",
            "conn_per_s",
            "avg_ms",
            "p99_ms",
            "failures",
            "migrations",
            "migration_p50_us",
            "migration_p99_us",
            "accept_queue",
            "capacity_rps",
        ] {
            assert!(p.get(k).is_some(), "key {k} missing: {p}");
        }
        if p["load"] == "closed" {
            // The closed loop's x is its users; its rate is what they offered.
            assert_eq!(p["clients"], 16, "{p}");
            assert_eq!(p["rate"], p["offered_per_s"], "{p}");
        } else {
            assert_eq!((p["load"].as_str(), p.get("clients")), (Some("open"), None));
            assert_eq!(p["rate"], 60.0);
        }
        assert_eq!(p["migrations"], 0);
        assert!(p["migration_p50_us"].is_null() && p["migration_p99_us"].is_null());
        // Below one node's capacity: connections complete through the front-end.
        assert!(p["conn_per_s"].as_f64().unwrap() > 20.0, "{p}");
    }
    let names: Vec<String> = points
        .iter()
        .map(|p| format!("{} {} {}", p["system"], p["split"], p["load"]))
        .collect();
    assert_eq!(
        names,
        [
            "\"acc64\" \"100\" \"closed\"",
            "\"acc64\" \"100\" \"open\"",
            "\"acc128\" \"100\" \"closed\"",
            "\"acc128\" \"100\" \"open\"",
            "\"acc64\" \"75/25\" \"closed\"",
            "\"acc64\" \"75/25\" \"open\""
        ]
    );
    // Each load model states its clients' timeouts: S-Clients in the open loop, users
    // whose kernels retransmit a dropped SYN in the closed loop.
    let params = &s["params"];
    assert_eq!(
        (&params["timeout_ms"], &params["connect_timeout_ms"]),
        (&2000.into(), &500.into())
    );
    assert_eq!(
        (
            &params["closed_timeout_ms"],
            &params["closed_connect_timeout_ms"]
        ),
        (&20_000.into(), &0.into())
    );
    // The tiers are pinned as in lab admission: the front on the first CPU.
    let pin = s["params"]["pin"].as_str().unwrap();
    if farside_lab::fabric::procs::allowed_cpus().len() >= 2 {
        assert!(pin.starts_with("client and front-end on CPU"), "{pin}");
    }
    let notes = s["notes"].to_string();
    assert!(
        notes.contains("capacity") && notes.contains("measured"),
        "{notes}"
    );
    for f in [
        "table.txt",
        "speculative.csv",
        "fig-spec-conn-single.svg",
        "fig-spec-conn-split-75-25.svg",
        "fig-spec-conn-single-closed.svg",
        "fig-spec-conn-split-75-25-closed.svg",
        "report.html",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    let table = std::fs::read_to_string(out.join("table.txt")).unwrap();
    assert!(
        table.contains("Fig. 1")
            && table.contains("Fig. 3")
            && table.contains("conn/s vs closed-loop users, split 75/25 closed"),
        "{table}"
    );
    // Cleanup: no namespace and no state file of the run left (`farside lab clean`
    // reads those state files after a crash), no process in the run's namespaces.
    assert!(namespaces(&prefix).is_empty(), "{:?}", namespaces(&prefix));
    let run_id = prefix.trim_start_matches(farside_lab::fabric::netns::NETNS_PREFIX);
    let run_id = run_id.trim_end_matches('-');
    let states: Vec<String> = std::fs::read_dir(farside_lab::fabric::netns::STATE_DIR)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(run_id))
                .collect()
        })
        .unwrap_or_default();
    assert!(states.is_empty(), "{states:?}");
    // Every back-end ran with `--root <out>/docroot`: none is still running.
    let left = processes_with(&out.join("docroot").display().to_string());
    assert!(left.is_empty(), "processes left: {left:?}");
}
