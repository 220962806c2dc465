//! End-to-end behaviour of the real `farside` processes: backend + gatherd + proxy (and
//! monitor), talking over loopback and shared memory, as an operator would run them.

use farside_lab::fabric::procs::Child;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::{eventually, exe, free_addr, get_raw, spawn, strings, Dir};

/// How long `eventually` waits in these tests.
const WAIT: Duration = Duration::from_secs(10);

/// One GET through `addr`; returns (status, body).
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let out = get_raw(addr, path);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    (status, out)
}

struct Tier {
    _backend: Child,
    gatherd: Child,
    proxy: Child,
    backend: SocketAddr,
    proxy_addr: SocketAddr,
}

fn start_tier(dir: &Dir, extra_proxy: &[&str]) -> Tier {
    let backend = free_addr();
    let mut be = spawn(
        "backend",
        &strings(&[
            "backend",
            "--listen",
            &backend.to_string(),
            "--workers",
            "1",
            "--header-timeout-ms",
            "20000",
        ]),
        dir,
    );
    be.wait_port(backend).unwrap();
    let region = dir.0.join("node.region");
    let mut g = spawn(
        "gatherd",
        &strings(&[
            "gatherd",
            "--watch-port",
            &backend.port().to_string(),
            "--shm",
            region.to_str().unwrap(),
        ]),
        dir,
    );
    g.wait_file(&region).unwrap();
    let proxy_addr = free_addr();
    let mut args = strings(&[
        "proxy",
        "--listen",
        &proxy_addr.to_string(),
        "--backend",
        &format!("{backend},region=shm:{}", region.display()),
        "--pool-idle",
        "0",
    ]);
    args.extend(strings(extra_proxy));
    let mut p = spawn("proxy", &args, dir);
    p.wait_port(proxy_addr).unwrap();
    Tier {
        _backend: be,
        gatherd: g,
        proxy: p,
        backend,
        proxy_addr,
    }
}

#[test]
fn overloaded_backend_gets_503_with_retry_after_and_recovers() {
    let dir = Dir::new("overload");
    let admin = free_addr().to_string();
    let t = start_tier(
        &dir,
        &[
            "--admission",
            "--metric",
            "backlog",
            "--limit",
            "1",
            "--stale-after-ms",
            "2000",
            "--admin-listen",
            &admin,
        ],
    );
    let admin: SocketAddr = admin.parse().unwrap();
    assert_eq!(get(t.proxy_addr, "/file16k").0, 200, "idle back-end serves");
    // The proxy counts that request's end (its estimate subtracts ends after the latest
    // sample) a moment after the client has the response; a busy host can delay it past
    // the sample that shows the queue below, which would then read one less. Wait for it
    // (in flight 0 follows the end's count), and for the millisecond it fell in to pass
    // (the estimate counts ends in the sample's own millisecond as after it).
    eventually("the proxy counts the first request's end", WAIT, || {
        get(admin, "/metrics")
            .1
            .lines()
            .any(|l| l.starts_with("farside_backend_inflight{") && l.ends_with(" 0"))
    });
    std::thread::sleep(Duration::from_millis(2));

    // Occupy the only worker with a connection that never finishes its request, and
    // queue one more connection in the accept backlog.
    let mut busy = TcpStream::connect(t.backend).unwrap();
    busy.write_all(b"GET /file16k HTTP/1.1\r\n").unwrap();
    let queued = TcpStream::connect(t.backend).unwrap();
    // The admin listener is not subject to admission: watch the proxy's view of the load.
    eventually(
        "the proxy's monitor sees one connection in the back-end's backlog",
        WAIT,
        || {
            get(admin, "/metrics")
                .1
                .lines()
                .any(|l| l.starts_with("farside_backend_load{") && l.ends_with(" 1"))
        },
    );
    let (status, body) = get(t.proxy_addr, "/file16k");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("Retry-After:"),
        "503 carries Retry-After: {body}"
    );

    drop(busy);
    drop(queued);
    eventually(
        "back-end drains and requests are admitted again",
        WAIT,
        || get(t.proxy_addr, "/file16k").0 == 200,
    );
    // Read the counters from the admin listener: the data port's own `/farside/metrics`
    // is admitted at accept like any connection, so a back-end that is momentarily full
    // again (the proxy's pooled connection queued behind a draining worker) would 503 it.
    let metrics = get(admin, "/metrics").1;
    assert!(
        metrics
            .lines()
            .any(|l| l.contains("reason=\"overloaded\"") && !l.trim_end().ends_with(" 0")),
        "rejections are counted by reason:\n{metrics}"
    );
}

#[test]
fn dead_gatherer_goes_stale_and_the_proxy_fails_safe() {
    let dir = Dir::new("stale");
    let mut t = start_tier(
        &dir,
        &[
            "--admission",
            // Counted every sample, so only the gatherer's death makes it stale (a
            // connection count may be taken every few hundred ms on a big host, and is
            // then stale on its own at 50 ms: freshness is per field).
            "--metric",
            "backlog",
            "--limit",
            "100",
            "--stale-after-ms",
            "50",
            // The refusing policy (the default, `local`, keeps serving at the last safe
            // concurrency: admission_defaults.rs).
            "--on-stale",
            "reject",
        ],
    );
    assert_eq!(get(t.proxy_addr, "/file16k").0, 200);
    t.gatherd.stop();
    eventually("stale record makes the proxy reject", WAIT, || {
        get(t.proxy_addr, "/file16k").0 == 503
    });
    let (_, body) = get(t.proxy_addr, "/file16k");
    assert!(body.contains("stale"), "the 503 says why: {body}");
    t.proxy.check_alive().expect("proxy keeps running");
    let log = std::fs::read_to_string(&t.proxy.log).unwrap();
    assert!(
        log.contains("stale"),
        "the proxy logs the stale record:\n{log}"
    );
}

#[test]
fn fail_open_policy_keeps_admitting_without_load_data() {
    let dir = Dir::new("open");
    let mut t = start_tier(
        &dir,
        &[
            "--admission",
            "--metric",
            "conns",
            "--limit",
            "100",
            "--stale-after-ms",
            "50",
            "--on-stale",
            "admit",
        ],
    );
    t.gatherd.stop();
    std::thread::sleep(Duration::from_millis(100)); // past stale_after: nothing to await
    assert_eq!(get(t.proxy_addr, "/file16k").0, 200);
}

#[test]
fn proxy_reads_an_external_monitors_shared_table() {
    let dir = Dir::new("monitor");
    let backend = free_addr();
    let mut be = spawn(
        "backend",
        &strings(&["backend", "--listen", &backend.to_string()]),
        &dir,
    );
    be.wait_port(backend).unwrap();
    let tcp = free_addr();
    // The run's rmem reader key, in a key file (0600) of the test's directory.
    let (reader, _) = farside_rmem::LabKeyset::generate()
        .write_files(&dir.0)
        .unwrap();
    let mut g = spawn(
        "gatherd",
        &strings(&[
            "gatherd",
            "--no-shm",
            "--watch-port",
            &backend.port().to_string(),
            "--tcp-listen",
            &tcp.to_string(),
            "--rmem-key",
            &format!("reader:1:{}", reader.display()),
        ]),
        &dir,
    );
    g.wait_port(tcp).unwrap();
    let table = dir.0.join("monitor.table");
    let spec = format!("{backend},region=tcp:{tcp}?key=1:{}", reader.display());
    let mut m = spawn(
        "monitor",
        &strings(&[
            "monitor",
            "--backend",
            &spec,
            "--table",
            table.to_str().unwrap(),
        ]),
        &dir,
    );
    m.wait_file(&table).unwrap();
    let proxy_addr = free_addr();
    let admin = free_addr();
    let mut p = spawn(
        "proxy",
        &strings(&[
            "proxy",
            "--listen",
            &proxy_addr.to_string(),
            "--admin-listen",
            &admin.to_string(),
            "--backend",
            &spec,
            "--admission",
            "--limit",
            "100",
            // Refuse when stale, so the monitor's death shows as 503 (the default, `local`,
            // keeps serving one request at a time here: admission_defaults.rs).
            "--on-stale",
            "reject",
            "--monitor-table",
            table.to_str().unwrap(),
        ]),
        &dir,
    );
    p.wait_port(proxy_addr).unwrap();
    eventually("request admitted on the monitor's data", WAIT, || {
        get(proxy_addr, "/file16k").0 == 200
    });
    // The admin listener: the data port does not answer metrics by default.
    p.wait_port(admin).unwrap();
    let metrics = get(admin, "/metrics").1;
    assert!(
        metrics.contains("farside_monitor_read_latency_ns"),
        "{metrics}"
    );
    // The monitor dies: its table stops advancing, the proxy fails safe.
    m.stop();
    eventually("monitor death makes the table stale", WAIT, || {
        get(proxy_addr, "/file16k").0 == 503
    });
}

#[test]
fn invalid_configuration_names_the_key_and_exits_nonzero() {
    let dir = Dir::new("badcfg");
    let cfg = dir.0.join("bad.toml");
    std::fs::write(
        &cfg,
        "listen = \"127.0.0.1:1\"\n[[backend]]\naddr = \"127.0.0.1:2\"\n[monitor]\nperiod_us = 1\n",
    )
    .unwrap();
    let out = std::process::Command::new(exe())
        .args(["proxy", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("monitor.period_us"), "{err}");
}

/// Run a short `lab admission` (1 s per point after 0.2 s of warm-up) with `args`,
/// writing to `out`; asserts it succeeded and returns its output and stderr.
fn lab_admission(args: &[&str], out: &Path) -> (std::process::Output, String) {
    let mut all = vec!["admission", "--duration-s", "1", "--warmup-s", "0.2"];
    all.extend(["--load", "closed"]);
    all.extend(args);
    common::run_lab(&all, out)
}

#[test]
fn lab_admission_writes_summary_with_stable_keys_and_report() {
    let dir = Dir::new("lab");
    let out = dir.0.join("out");
    let (st, _) = lab_admission(
        &[
            "--systems",
            "no-ac,onesided-ac",
            "--traces",
            "single,zipf",
            "--clients",
            "2,6",
            "--backend-cpu-us",
            "200",
        ],
        &out,
    );
    assert!(
        String::from_utf8_lossy(&st.stdout).contains("improvement"),
        "table printed"
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["experiment"], "admission");
    assert_eq!(s["hosts"], "loopback");
    let points = s["points"].as_array().unwrap();
    assert_eq!(points.len(), 2 * 2 * 2, "systems x traces x clients");
    for p in points {
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
            "transport",
        ] {
            assert!(p.get(k).is_some(), "point lacks `{k}`: {p}");
        }
        assert!(
            p["tps"].as_f64().unwrap() > 0.0,
            "every point served requests: {p}"
        );
        // The admission-controlled proxy's monitor reports how its load reads went during
        // the point; no-ac has no monitor and no such keys.
        let monitored = p["system"] == "onesided-ac";
        for k in [
            "monitor_read_p50_us",
            "monitor_read_p99_us",
            "update_gap_p99_ms",
        ] {
            assert_eq!(p.get(k).is_some(), monitored, "`{k}` on {p}");
        }
        if monitored {
            let gap_ms = p["update_gap_p99_ms"].as_f64().unwrap();
            assert!(gap_ms > 0.0 && gap_ms < 1000.0, "{p}");
        }
    }
    for f in [
        "points.csv",
        "points.jsonl",
        "report.html",
        "fig-avg-single.svg",
        "fig-requests-single.svg",
    ] {
        assert!(out.join(f).exists(), "{f} written");
    }
    // What ran, and where: reproducible metadata.
    for k in [
        "commit",
        "commit_dirty",
        "kernel",
        "cpu_model",
        "seed",
        "settings",
        "params",
    ] {
        assert!(s.get(k).is_some(), "summary lacks `{k}`");
    }
    assert_eq!(s["finished"], true);
    assert!(
        s["settings"].get("control_nice").is_some(),
        "{}",
        s["settings"]
    );
    // The product's defaults: the lab adds no proxy arguments of its own choosing
    // (no `--pool-idle 0`), and a default limit set by the objective rule: for metric
    // backlog, L_Q, the accept queue one back-end drains within --queue-ms.
    assert_eq!(s["params"]["proxy_args"], serde_json::json!([]));
    let l_q = s["params"]["objective"]["queue_len"].as_u64().unwrap();
    assert!(l_q >= 1, "{}", s["params"]);
    assert_eq!(s["params"]["limits"], serde_json::json!([l_q]));
    // Every run was appended as it finished.
    let jsonl = std::fs::read_to_string(out.join("points.jsonl")).unwrap();
    assert_eq!(jsonl.lines().count(), 8);

    // `lab report` re-renders the same files from what was kept.
    let csv = std::fs::read(out.join("points.csv")).unwrap();
    let html = std::fs::read(out.join("report.html")).unwrap();
    let st = std::process::Command::new(exe())
        .args(["lab", "report"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert!(String::from_utf8_lossy(&st.stdout).contains("improvement"));
    assert_eq!(std::fs::read(out.join("points.csv")).unwrap(), csv);
    assert_eq!(std::fs::read(out.join("report.html")).unwrap(), html);

    // --resume of a finished sweep measures nothing; with other settings it is refused.
    let resume = |extra: &[&str]| {
        std::process::Command::new(exe())
            .args(["lab", "admission", "--duration-s", "1", "--warmup-s", "0.2"])
            .args(["--load", "closed"])
            .args([
                "--systems",
                "no-ac,onesided-ac",
                "--traces",
                "single,zipf",
                "--clients",
                "2,6",
                "--backend-cpu-us",
            ])
            .args(extra)
            .arg("--resume")
            .arg(&out)
            .env(
                "FARSIDE_DATA",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../../data"),
            )
            .output()
            .unwrap()
    };
    let st = resume(&["200"]);
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(st.status.success(), "{err}");
    assert!(
        err.contains("8 run(s) already on disk") && err.contains("0 to measure"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("points.jsonl")).unwrap(),
        jsonl
    );
    let st = resume(&["300"]);
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success());
    assert!(
        err.contains("settings differ") && err.contains("backend_cpu_us: 200 → 300"),
        "{err}"
    );
}

/// Fails loudly when a root test was asked to run without root (`--include-ignored`).
fn require_root() {
    assert!(
        farside_lab::fabric::netns::is_root(),
        "needs root: run as root (`cargo test -p farside -- --include-ignored`)"
    );
}

/// netns lab runs in this binary take turns: one lab's namespace teardown holds the
/// kernel's rtnl lock for long stretches, which would stall the other's set-up.
fn netns_lab_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
#[ignore = "needs root and nginx: run with `cargo test -p farside -- --include-ignored` as root"]
fn lab_admission_runs_nginx_back_ends_inside_namespaces() {
    require_root();
    let _one_at_a_time = netns_lab_lock();
    if let Err(e) = farside_lab::nginx::find_binary() {
        panic!("needs nginx (scripts/setup.sh installs nginx-light): {e}");
    }
    let dir = Dir::new("lab-nginx-ns");
    let out = dir.0.join("out");
    let (_, stderr) = lab_admission(
        &[
            "--hosts",
            "netns",
            "--backend-server",
            "nginx",
            "--systems",
            "onesided-ac",
            "--traces",
            "single",
            "--clients",
            "4",
            // 4 clients hold at most 4 connections: with a limit above that, any drop
            // is a fault (a stale or unread record), not load.
            "--limit",
            "8",
        ],
        &out,
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["hosts"], "netns");
    let points = s["points"].as_array().unwrap();
    assert_eq!(points.len(), 1);
    if points[0]["tps"].as_f64().unwrap() <= 0.0 {
        let mut logs = String::new();
        for e in std::fs::read_dir(out.join("logs")).unwrap().flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            // Its start (what the daemon was told) and its end (what it saw last).
            let lines: Vec<&str> = text.lines().collect();
            let head = lines.len().min(10);
            let tail = &lines[lines.len().saturating_sub(15).max(head)..];
            logs += &format!(
                "--- {}\n{}\n...\n{}\n",
                e.path().display(),
                lines[..head].join("\n"),
                tail.join("\n")
            );
        }
        panic!(
            "nginx in a namespace served no client in another: {}\n{stderr}\n{logs}",
            points[0]
        );
    }
    assert_eq!(points[0]["drop_rate"].as_f64(), Some(0.0), "{}", points[0]);
}

/// Start a lab run, interrupt it with SIGINT once it is measuring, and check it exits
/// with 130 leaving nothing behind.
fn interrupt_lab(
    tag: &str,
    extra: &[&str],
    leftovers: impl Fn(u32) -> Vec<PathBuf>,
    hosts_gone: impl Fn(u32) -> bool,
) {
    // A directory of its own: the two interrupt tests may run at once, and one must not
    // see the other's proxy log and signal its lab too early.
    let dir = Dir::new(&format!("interrupt-{tag}"));
    let out = dir.0.join("out");
    let mut child = std::process::Command::new(exe())
        .args([
            "lab",
            "admission",
            "--systems",
            "no-ac",
            "--traces",
            "single",
            "--clients",
            "4",
            "--duration-s",
            "30",
        ])
        .args(extra)
        .arg("--out")
        .arg(&out)
        .env(
            "FARSIDE_DATA",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../data"),
        )
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Measuring once the proxy's log exists and the back-end answered.
    eventually("the lab started its tier", WAIT, || {
        out.join("logs/no-ac-proxy.log").exists()
    });
    std::thread::sleep(Duration::from_millis(300)); // let the clients start: nothing to await
                                                    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(130), "exit status after SIGINT");
    for p in leftovers(pid) {
        assert!(!p.exists(), "{} left behind", p.display());
    }
    assert!(hosts_gone(pid), "namespaces left behind");
}

#[test]
fn interrupted_loopback_lab_removes_its_temporary_state() {
    interrupt_lab(
        "loopback",
        &[],
        |pid| {
            vec![
                PathBuf::from(format!("/dev/shm/farside-lab-{pid}")),
                std::env::temp_dir().join(format!("farside-lab-docroot-{pid}")),
            ]
        },
        |_| true,
    );
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside -- --include-ignored` as root"]
fn interrupted_netns_lab_removes_its_namespaces_and_cgroups() {
    require_root();
    let _one_at_a_time = netns_lab_lock();
    interrupt_lab(
        "netns",
        &["--hosts", "netns"],
        |_| Vec::new(),
        |pid| {
            let list = std::process::Command::new("ip")
                .args(["netns", "list"])
                .output()
                .unwrap();
            let run = format!("fs-a{}", pid % 100_000);
            !String::from_utf8_lossy(&list.stdout).contains(&run)
        },
    );
}
