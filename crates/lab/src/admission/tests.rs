//! Tests of `lab admission`: arguments, limits, capacity, keys and settings.

use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    a: AdmissionArgs,
}

fn args(line: &str) -> AdmissionArgs {
    Cli::try_parse_from(std::iter::once("lab").chain(line.split_whitespace()))
        .unwrap()
        .a
}

#[test]
fn dashboard_flag_parses_and_netns_is_refused_clearly() {
    assert_eq!(args("").dashboard, None);
    let a = args("--dashboard 127.0.0.1:9101");
    assert_eq!(a.dashboard, Some("127.0.0.1:9101".parse().unwrap()));
    assert!(Cli::try_parse_from(["lab", "--dashboard", "nowhere"]).is_err());
    // Refused before anything starts (and before the root check).
    let e = run(args("--hosts netns --dashboard 127.0.0.1:9101")).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(
        e.to_string()
            .contains("--dashboard is not supported with --hosts netns"),
        "{e}"
    );
}

#[test]
fn default_limit_follows_the_capacity_rule() {
    // farside's server: C = workers.
    let a = args("");
    assert_eq!(capacity_conns(&a), 16);
    assert_eq!(default_limit("backlog", 16, 12).unwrap().0, 12);
    assert_eq!(default_limit("pending", 16, 12).unwrap().0, 12);
    assert_eq!(default_limit("conns", 16, 12).unwrap().0, 28);
    assert_eq!(capacity_conns(&args("--backend-workers 40")), 40);
    // nginx: worker_processes x worker_connections.
    assert_eq!(capacity_conns(&args("--backend-server nginx")), 1024);
    // Metrics that are not connection counts have no default: a clear error.
    let e = default_limit("cpu", 16, 12).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("give --limit N or --limits"), "{e}");
    // The rule is in --help.
    use clap::CommandFactory;
    let help = Cli::command().render_long_help().to_string();
    assert!(help.contains("backlog, pending: limit = L_Q"), "{help}");
    assert!(help.contains("--queue-ms"), "{help}");
}

#[test]
fn one_queue_bound_sets_every_systems_limits() {
    // 50 ms at 253 requests/s per back-end: 12 requests drain within the bound.
    let a = args("");
    assert_eq!(a.queue_ms, 50);
    let (o, rule) = Objective::derive(&a, Some(253.2));
    assert_eq!(
        o,
        Objective {
            queue_ms: 50,
            queue_len: 12,
            target_delay_ms: 25,
        }
    );
    assert!(
        rule.contains("timeout queue 50 ms") && rule.contains("= 12"),
        "{rule}"
    );
    // A tight bound still admits one waiting request; no capacity rule: L_Q = C.
    let (o, _) = Objective::derive(&args("--queue-ms 1"), Some(253.2));
    assert_eq!((o.queue_len, o.target_delay_ms), (1, 1));
    assert_eq!(Objective::derive(&a, None).0.queue_len, 16);
    // The same Q reaches HAProxy and every farside proxy; the old flag still works.
    let a = args("--haproxy-timeout-queue-ms 20");
    assert_eq!(a.queue_ms, 20);
    let (o, _) = Objective::derive(&a, Some(500.0));
    let cfg = haproxy_config(&a, "127.0.0.1:1".parse().unwrap(), &[]);
    assert_eq!(cfg.timeout_queue_ms, 20);
    let v = objective_proxy_args(&a, "no-ac", None);
    assert_eq!(v, ["--queue-timeout-ms", "20"]);
    let v = objective_proxy_args(&a, "onesided-ac", Some(o.queue_len));
    assert_eq!(
        v.join(" "),
        "--queue-timeout-ms 20 --admission --metric backlog --limit 10"
    );
    // The objective mode is the proxy's default admission: only the queue bound.
    let v = objective_proxy_args(&a, "onesided-delay", None);
    assert_eq!(v.join(" "), "--queue-timeout-ms 20 --admission");
    assert_eq!(
        o.target_delay_ms, 10,
        "what the proxy's rule makes of Q = 20"
    );
    // The lab's own flags cannot be given again through --proxy-arg.
    assert!(check_proxy_args(&["--queue-timeout-ms=5".into()]).is_err());
    assert!(check_scenarios(&args("--queue-ms 0")).is_err());
}

#[test]
fn negative_nice_without_root_is_recorded_not_applied() {
    let a = args("");
    assert_eq!(a.control_nice, -20);
    // Forced "not root" branch, default RLIMIT_NICE (floor 0).
    let m = privileged_settings(&a, false, 0, 4);
    let s = &m["control_nice"];
    assert!(!s.applied);
    assert_eq!(s.requested, serde_json::json!(-20));
    assert!(s.reason.as_deref().unwrap().contains("needs root"), "{s:?}");
    // Root, or an RLIMIT_NICE that allows it: applied.
    assert!(privileged_settings(&a, true, 0, 4)["control_nice"].applied);
    assert!(control_nice_setting(-20, false, -20).applied);
    assert!(!control_nice_setting(-20, false, -10).applied);
    assert!(control_nice_setting(0, false, 0).applied);
    // Background load asked for on loopback is not applied either; one CPU: no pinning.
    let m = privileged_settings(&args("--background-load 2"), true, 0, 1);
    assert!(!m["background_load"].applied);
    assert!(!m["pin"].applied);
    // netns records its isolation as applied.
    let m = privileged_settings(&args("--hosts netns"), true, 0, 4);
    assert!(m["cgroups"].applied && m["rps"].applied && m["pin"].applied);
}

#[test]
fn effective_settings_hold_every_flag_after_defaults() {
    let a = args("--quick --proxy-arg=--pool-idle=0 --proxy-arg --stale-after-ms=50");
    assert_eq!(a.proxy_args, ["--pool-idle=0", "--stale-after-ms=50"]);
    check_proxy_args(&a.proxy_args).unwrap();
    let e = check_proxy_args(&["--workers=2".to_string()]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--proxy-arg --workers=2: the lab sets --workers itself; use --proxy-workers"
    );
    let v = effective(
        &a,
        &[4],
        &[16],
        "default: backlog: limit = C = 16",
        6.0,
        1.0,
    )
    .unwrap();
    for k in [
        "hosts",
        "quick",
        "systems",
        "traces",
        "clients",
        "duration_s",
        "warmup_s",
        "limits",
        "limit_rule",
        "metric",
        "control_nice",
        "proxy_args",
        "seed",
        "repeat",
        "capacity_conns",
    ] {
        assert!(v.get(k).is_some(), "missing {k}: {v}");
    }
    // The output directory is not a setting: resuming in another place is fine.
    assert!(v.get("out").is_none() && v.get("resume").is_none());
    assert_eq!(
        v["proxy_args"],
        serde_json::json!(["--pool-idle=0", "--stale-after-ms=50"])
    );
    assert_eq!(v["backend_server"], "farside");
    // --resume names the directory: an --out beside it would be ambiguous.
    assert!(Cli::try_parse_from(["lab", "--resume", "a", "--out", "b"]).is_err());
}

#[test]
fn full_points_are_the_papers_scale_and_quick_is_short() {
    assert_eq!(point_time(&args("")), (60.0, 10.0));
    assert_eq!(point_time(&args("--quick")), (6.0, 1.0));
    assert_eq!(point_time(&args("--quick --duration-s 3")), (3.0, 1.0));
    // no-ac once, each static-limit system once per limit, onesided-delay (the proxy's
    // default admission, no limit) once.
    let a = args("--systems no-ac,tcp-ac,onesided-delay --traces single --load closed");
    let k = keys(&a, &[2, 8], &[4], &[1.0]);
    let names: Vec<(String, Option<u64>)> = k.iter().map(|k| (k.system.clone(), k.limit)).collect();
    assert_eq!(
        names,
        vec![
            ("no-ac".into(), None),
            ("tcp-ac".into(), Some(2)),
            ("tcp-ac".into(), Some(8)),
            ("onesided-delay".into(), None)
        ]
    );
}

#[test]
fn nginx_in_netns_gets_a_quota_by_rule_and_the_flag_needs_netns() {
    // The default: the tier a fifth of a CPU, split over the back-ends, short period.
    let q = backend_quota(&args("--hosts netns --backend-server nginx"))
        .unwrap()
        .unwrap();
    assert_eq!((q.pct, q.quota_us, q.period_us), (10, 1_000, 10_000));
    assert!(q.rule.starts_with("default for nginx"), "{}", q.rule);
    let q = backend_quota(&args("--hosts netns --backend-server nginx --backends 4"))
        .unwrap()
        .unwrap();
    assert_eq!((q.pct, q.quota_us, q.period_us), (5, 1_000, 20_000));
    let q = backend_quota(&args("--hosts netns --backend-server nginx --backends 40"))
        .unwrap()
        .unwrap();
    assert_eq!(q.pct, 1);
    // The flag overrides, also for farside's server; without it farside has none.
    let q = backend_quota(&args("--hosts netns --backend-cpu-quota-pct 30"))
        .unwrap()
        .unwrap();
    assert_eq!((q.pct, q.quota_us, q.period_us), (30, 3_000, 10_000));
    assert_eq!(backend_quota(&args("--hosts netns")).unwrap(), None);
    assert_eq!(
        backend_quota(&args("--backend-server nginx")).unwrap(),
        None
    );
    // Never a silent unlimited run: loopback has no per-node cgroup.
    let e = backend_quota(&args("--backend-cpu-quota-pct 30")).unwrap_err();
    assert!(e.to_string().contains("needs --hosts netns"), "{e}");
    let e = backend_quota(&args("--hosts netns --backend-cpu-quota-pct 0")).unwrap_err();
    assert!(e.to_string().contains("1..="), "{e}");
    // The settings say so.
    let s = privileged_settings(&args("--hosts netns --backend-server nginx"), true, 0, 2);
    let text = s["cgroups"].requested.to_string();
    assert!(
        text.contains("10 % of one CPU (1000 us every 10000 us)"),
        "{text}"
    );
}

#[test]
fn calibration_warns_when_the_quota_never_bound() {
    let node = |name: &str, cpu_max: &str, throttled| NodeCalibration {
        node: name.into(),
        cpu: crate::fabric::netns::CpuStat {
            cpu_max: cpu_max.into(),
            nr_periods: 200,
            nr_throttled: throttled,
            throttled_us: 0,
        },
        web_cpu_s: 0.2,
        gatherd_cpu_s: 0.01,
    };
    let mut c = Calibration {
        capacity_rps: 1000.0,
        rule: String::new(),
        duration_s: CALIBRATION_S,
        warmup_s: CALIBRATION_WARMUP_S,
        clients: 64,
        object_bytes: CAPACITY_REFERENCE_BYTES,
        avg_ms: 1.0,
        p99_ms: 2.0,
        nodes: vec![node("b0", "1000 10000", 150), node("b1", "max 10000", 0)],
    };
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    c.nodes.push(node("b2", "1000 10000", 0));
    let w = c.warnings();
    assert_eq!(w.len(), 1);
    assert!(w[0].contains("node b2 was never throttled"), "{w:?}");
}

#[test]
fn both_load_models_are_swept_by_default_with_rates_of_the_capacity() {
    let a = args("--systems no-ac --traces single");
    assert_eq!(a.load, LoadModels::Both);
    assert_eq!(a.on_reject, OnReject::Backoff);
    let k = keys(&a, &[16], &[4, 8], &[0.5, 3.0]);
    let got: Vec<(String, Option<u64>, Option<f64>)> = k
        .iter()
        .map(|k| (k.load_model.clone(), k.clients, k.rate_x))
        .collect();
    assert_eq!(
        got,
        vec![
            ("closed".into(), Some(4), None),
            ("closed".into(), Some(8), None),
            ("open".into(), None, Some(0.5)),
            ("open".into(), None, Some(3.0)),
        ]
    );
    // The capacity rule: back-end CPUs (at most one per worker) over the CPU cost.
    let (r, rule) = capacity_rps(&args(""), 3, 1500.0, None).unwrap();
    assert!((r - 2000.0).abs() < 1e-9, "{r}");
    assert!(rule.contains("1e6 / 1500"), "{rule}");
    let (r, _) = capacity_rps(&args("--backends 1 --backend-workers 2"), 8, 1000.0, None).unwrap();
    assert!((r - 2000.0).abs() < 1e-9, "two workers cap it: {r}");
    assert_eq!(
        capacity_rps(&args("--capacity-rps 300"), 3, 1.0, None)
            .unwrap()
            .0,
        300.0
    );
    let e = capacity_rps(&args("--backend-server nginx"), 3, 1500.0, None).unwrap_err();
    assert!(e.to_string().contains("--capacity-rps"), "{e}");
    // nginx: the calibrated capacity, unless --capacity-rps overrides it.
    let cal = (1234.0, "calibrated: ...".to_string());
    let n = args("--backend-server nginx");
    assert_eq!(capacity_rps(&n, 3, 1500.0, Some(&cal)).unwrap(), cal);
    let n = args("--backend-server nginx --capacity-rps 300");
    assert_eq!(capacity_rps(&n, 3, 1500.0, Some(&cal)).unwrap().0, 300.0);
    // farside's server under a quota: the quota's CPUs bound the rule's.
    let q = args("--hosts netns --backends 2 --backend-cpu-quota-pct 25");
    let (r, rule) = capacity_rps(&q, 3, 1000.0, None).unwrap();
    assert!((r - 500.0).abs() < 1e-9, "2 x 25 % of a CPU at 1 ms: {r}");
    assert!(rule.contains("25 % quota"), "{rule}");
    // The closed loop follows --on-reject; the deprecated fixed pause is gone.
    let l = loadgen_args(
        &args("--on-reject leave"),
        "127.0.0.1:1".parse().unwrap(),
        "single",
        4,
        1.0,
        0.0,
    )
    .unwrap();
    assert_eq!(l.effective_on_reject(), OnReject::Leave);
    assert_eq!(l.reject_think_ms, None);
    let l = loadgen_args(&a, "127.0.0.1:1".parse().unwrap(), "single", 4, 1.0, 0.0).unwrap();
    assert_eq!(l.effective_on_reject(), OnReject::Backoff);
}

#[test]
fn request_samples_keep_served_requests_thinned() {
    let dir = std::env::temp_dir().join(format!("farside-req-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("r.csv");
    let mut text = String::from("start_us,latency_us,status,bytes,outcome\n");
    for i in 0..100u64 {
        let outcome = if i % 10 == 0 { "dropped" } else { "served" };
        text += &format!("{},{},200,10,{outcome}\n", i * 1000, 2000 + i);
    }
    std::fs::write(&path, text).unwrap();
    let v = request_samples(&path, 30).unwrap();
    assert!(v.len() <= 30 && v.len() >= 20, "{}", v.len());
    assert_eq!(v[0], (0.001, 2.001));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn host_counters_parse_from_the_kernels_texts() {
    let stat = "cpu  10 0 10 100 0 0 0 0 0 0\n\
                cpu0 5 1 4 50 2 1 3 0 0 0\n\
                cpu1 7 0 3 20 0 0 10 0 0 0\n\
                intr 1 2 3\n";
    let t = cpu_ticks_of(stat);
    assert_eq!(t.len(), 2, "the aggregate `cpu` line is not a CPU");
    // busy = all - idle - iowait; soft = irq + softirq.
    assert_eq!(t[&0], (5 + 1 + 4 + 1 + 3, 1 + 3, 66));
    assert_eq!(t[&1], (20, 10, 40));
    let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails\n\
                Tcp: 1 200 120000 -1 17 4242 0\n";
    assert_eq!(passive_opens_of(snmp), Some(4242));
    assert_eq!(passive_opens_of("Ip: a\nIp: 1\n"), None);
    assert_eq!(
        usage_us_of("usage_usec 123456\nuser_usec 1\nsystem_usec 2\n"),
        Some(123456)
    );
    assert_eq!(usage_us_of("nr_periods 0\n"), None);
}

#[test]
fn host_sampler_fills_nothing_when_the_point_ends_before_its_warm_up() {
    let s = HostSampler::start(
        vec![0],
        vec![0],
        None,
        Vec::new(),
        std::time::Duration::from_secs(3600),
        std::time::Duration::from_secs(1),
    );
    let mut p = Point {
        served: 10,
        attempts: 10,
        ..Point::default()
    };
    s.finish(&mut p);
    assert_eq!(p.backend_cpu_busy, None);
    assert_eq!(p.proxy_cpu_us_per_attempt, None);
}

#[test]
fn host_sampler_measures_the_cpus_over_its_window() {
    let s = HostSampler::start(
        vec![0],
        vec![0],
        None,
        Vec::new(),
        std::time::Duration::ZERO,
        std::time::Duration::from_millis(50),
    );
    // Spin on the CPU until the window has surely closed: /proc/stat moves in 10 ms ticks.
    let t = Instant::now();
    while t.elapsed() < std::time::Duration::from_millis(200) {
        std::hint::spin_loop();
    }
    let mut p = Point {
        served: 1,
        attempts: 1,
        ..Point::default()
    };
    s.finish(&mut p);
    let busy = p.backend_cpu_busy.expect("CPU 0's ticks were read");
    assert!((0.0..=1.0).contains(&busy), "{busy}");
    assert!(p.backend_cpu_us_per_served.is_some());
    assert_eq!(p.backend_conns_per_served, None, "no back-end pid given");
}
