//! Tests of `lab speculative`: arguments, keys, points, tables and figures.

#[test]
fn a_nodes_cpu_is_split_by_process_and_repeats_average_by_time() {
    use crate::fabric::netns::ProcCpu;
    let proc_ = |pid, cpu_us| ProcCpu {
        pid,
        comm: "farside".into(),
        cpu_us,
    };
    let pids = NodePids {
        backend: Some(10),
        specd: Some(11),
        gatherd: Some(12),
    };
    let a = NodeSnap {
        throttled_us: 1_000,
        procs: vec![proc_(10, 500_000), proc_(11, 10_000), proc_(12, 0)],
    };
    // A process that started during the load (13) counts from zero.
    let b = NodeSnap {
        throttled_us: 3_001_000,
        procs: vec![
            proc_(10, 2_500_000),
            proc_(11, 110_000),
            proc_(12, 10_000),
            proc_(13, 20_000),
        ],
    };
    let c = node_cpu("b0", &pids, &a, &b, Duration::from_secs(10));
    assert_eq!(c.backend_ms_per_s, 200.0);
    assert_eq!(c.specd_ms_per_s, 10.0);
    assert_eq!(c.gatherd_ms_per_s, 1.0);
    assert_eq!(c.cpu_ms_per_s, 213.0);
    assert_eq!(c.throttled_ms_per_s, 300.0);
    let run = |d: f64, cpu: f64| SpecPoint {
        duration_s: d,
        nodes: vec![NodeCpu {
            node: "b0".into(),
            cpu_ms_per_s: cpu,
            ..NodeCpu::default()
        }],
        ..SpecPoint::empty()
    };
    let both = SpecPoint::combine(&[run(10.0, 100.0), run(30.0, 200.0)]);
    assert_eq!(both.nodes.len(), 1);
    assert_eq!(both.nodes[0].cpu_ms_per_s, 175.0);
}

#[test]
fn peaks_compare_with_the_single_server_and_break_even_weighs_by_migrations() {
    let pt =
        |exp: &str, sys: &str, split: &str, rate: f64, cps: f64, mig: u64, cpu: f64| SpecPoint {
            experiment: exp.into(),
            system: sys.into(),
            split: split.into(),
            rate,
            conn_per_s: cps,
            migrations: mig,
            migration_cpu_source_us: (mig > 0).then_some(cpu),
            migration_cpu_target_us: (mig > 0).then_some(cpu / 2.0),
            ..SpecPoint::empty()
        };
    let pts = [
        pt("single", "acc64", "100", 100.0, 90.0, 0, 0.0),
        pt("single", "acc64", "100", 200.0, 80.0, 0, 0.0),
        pt("split", "acc64", "75/25", 200.0, 140.0, 0, 0.0),
        pt("split", "spec32", "75/25", 200.0, 171.0, 100, 400.0),
        pt("split", "spec32", "75/25", 300.0, 160.0, 300, 600.0),
    ];
    let refs: Vec<&SpecPoint> = pts.iter().collect();
    let t = peaks_and_break_even(&refs);
    assert!(t.contains("single       acc64        90.0  1.00x"), "{t}");
    assert!(t.contains("split 75/25  acc64       140.0  1.56x"), "{t}");
    assert!(t.contains("split 75/25  spec32      171.0  1.90x"), "{t}");
    // (100 x 400 + 300 x 600) / 400 = 550; the target's (50 + 0.5 x ...) = 275.
    assert!(t.contains("break-even request cost: 550 µs"), "{t}");
    assert!(t.contains("costs the target 275 µs"), "{t}");
    let none = peaks_and_break_even(&refs[..3]);
    assert!(
        none.contains("break-even request cost: - (no migration)"),
        "{none}"
    );
}

use super::*;

fn args() -> SpeculativeArgs {
    SpeculativeArgs {
        out: "x".into(),
        sweep: crate::fabric::flags::SweepFlags {
            quick: true,
            resume: None,
        },
        hosts: Hosts::Netns,
        experiment: vec!["single".into(), "split".into()],
        systems: vec!["acc64".into()],
        accept_queues: ACCEPT_QUEUES.to_vec(),
        splits: SPLITS.iter().map(|s| s.to_string()).collect(),
        rates: Vec::new(),
        load: crate::fabric::flags::LoadModels::Open,
        clients: Vec::new(),
        duration_s: None,
        warmup_s: POINT_WARMUP_S_DEFAULT,
        timeout_ms: 2000,
        connect_timeout_ms: S_CLIENT_CONNECT_TIMEOUT_MS,
        closed_timeout_ms: CLOSED_TIMEOUT_MS_DEFAULT,
        closed_connect_timeout_ms: 0,
        source_ports: farside_loadgen::SourcePorts::Random,
        node_cpu_pct: None,
        cpu_us_per_request: 2000,
        backend_workers: 8,
        seed: 1,
        no_pin: false,
        repeat: 1,
    }
}

#[test]
fn capacity_rule_and_default_rates() {
    let c = capacity_rps(20, 2000);
    assert!((c - 0.2e6 / 2030.0).abs() < 1e-9, "{c}");
    let p = check_args(&args()).unwrap();
    assert_eq!(p.rates.len(), RATE_MULTIPLES_QUICK.len());
    assert!((p.rates[0] - 0.5 * c).abs() < 1e-9);
    assert!((p.rates[2] - 3.0 * c).abs() < 1e-9);
    assert_eq!(p.duration_s, 3.0);
    assert_eq!(p.nodes, 2);
    let full = check_args(&SpeculativeArgs {
        sweep: crate::fabric::flags::SweepFlags {
            quick: false,
            resume: None,
        },
        experiment: vec!["single".into()],
        ..args()
    })
    .unwrap();
    assert_eq!(full.rates.len(), RATE_MULTIPLES_FULL.len());
    assert_eq!(full.nodes, 1);
}

#[test]
fn warmup_and_connect_timeout_are_checked() {
    let p = check_args(&args()).unwrap();
    assert_eq!(p.warmup_s, POINT_WARMUP_S_DEFAULT);
    for w in [-1.0, f64::NAN, POINT_WARMUP_S_MAX + 1.0] {
        let Err(e) = check_args(&SpeculativeArgs {
            warmup_s: w,
            ..args()
        }) else {
            panic!("--warmup-s {w} accepted");
        };
        assert!(e.to_string().contains("--warmup-s"), "{e}");
    }
    for (ct, ok) in [
        (0, true),
        (500, true),
        (1999, true),
        (2000, false),
        (5000, false),
    ] {
        let r = check_args(&SpeculativeArgs {
            connect_timeout_ms: ct,
            ..args()
        });
        assert_eq!(r.is_ok(), ok, "{ct}");
        if let Err(e) = r {
            assert!(e.to_string().contains("--connect-timeout-ms"), "{e}");
        }
    }
    // The closed loop's pair is checked on its own, under its own flag names.
    for (t, ct, ok, flag) in [
        (CLOSED_TIMEOUT_MS_DEFAULT, 0, true, ""),
        (CLOSED_TIMEOUT_MS_DEFAULT, 500, true, ""),
        (2000, 2000, false, "--closed-connect-timeout-ms"),
        (0, 0, false, "--closed-timeout-ms"),
        (TIMEOUT_MS_MAX, 0, true, ""),
        (TIMEOUT_MS_MAX + 1, 0, false, "--closed-timeout-ms"),
    ] {
        let r = check_args(&SpeculativeArgs {
            closed_timeout_ms: t,
            closed_connect_timeout_ms: ct,
            ..args()
        });
        assert_eq!(r.is_ok(), ok, "{t} {ct}");
        if let Err(e) = r {
            assert!(e.to_string().contains(flag), "{e}");
        }
    }
    let Err(e) = check_args(&SpeculativeArgs {
        timeout_ms: TIMEOUT_MS_MAX + 1,
        ..args()
    }) else {
        panic!("--timeout-ms past its bound accepted");
    };
    assert!(e.to_string().starts_with("--timeout-ms"), "{e}");
}

#[test]
fn the_daemons_seconds_are_apportioned_to_the_window() {
    let daemon = |start: u64, migrated: &[u32], refused: &[u32]| {
        serde_json::json!({"source": {
            "started_unix_ms": start,
            "series": {"first_s": 0, "migrated": migrated, "refused": refused,
                       "closed": [0, 1, 0], "evicted": 0},
        }})
    };
    // The window starts half-way through the daemon's first second and lasts 2 s.
    let a = daemon(10_000, &[10, 20, 30], &[0, 0, 4]);
    let w = WindowSeries::from_summaries(std::slice::from_ref(&a), 10_500.0, 2_000.0);
    assert_eq!(w.migrated, vec![15.0, 25.0]);
    assert_eq!(w.refused, vec![0.0, 2.0]);
    assert_eq!(w.closed, vec![0.5, 0.5]);
    assert_eq!(w.migrations_per_s, Some(20.0));
    // Both sources add; a summary without a series (an older specd) adds nothing;
    // a partial last second gets only what falls in it.
    let b = daemon(11_000, &[6], &[0]);
    let old = serde_json::json!({"source": {"migrated": 99}});
    let w = WindowSeries::from_summaries(&[a, b, old], 10_500.0, 1_500.0);
    assert_eq!(w.migrated, vec![18.0, 13.0]);
    let per_s = w.migrations_per_s.unwrap();
    assert!((per_s - 31.0 / 1.5).abs() < 1e-9, "{per_s}");
    // No window, no rate.
    let w = WindowSeries::from_summaries(&[], 0.0, 0.0);
    assert!(w.migrated.is_empty() && w.migrations_per_s.is_none());
}

#[test]
fn each_load_model_gets_its_own_client_timeouts() {
    let a = args();
    let vip = SocketAddr::V4(VIP);
    let open = loadgen_args(vip, Offer::Rate(90.0), 20.0, 3.0, &a, 2);
    assert_eq!(open.rate, Some(90.0));
    assert_eq!((open.timeout_ms, open.connect_timeout_ms), (2000, 500));
    assert_eq!(open.seed, a.seed + 2);
    let closed = loadgen_args(vip, Offer::Clients(128), 20.0, 3.0, &a, 0);
    assert_eq!((closed.rate, closed.clients), (None, 128));
    // Users of real hosts: no connect timeout, their kernels retransmit the SYN.
    assert_eq!(
        (closed.timeout_ms, closed.connect_timeout_ms),
        (CLOSED_TIMEOUT_MS_DEFAULT, 0)
    );
    for lg in [&open, &closed] {
        assert!(lg.no_keepalive && lg.session_requests == 1);
        assert!(lg.validate().is_ok(), "{lg:?}");
    }
}

#[test]
fn splits_and_systems_parse() {
    assert_eq!(parse_split("75/25").unwrap(), (75, 25));
    assert_eq!(parse_split("67/33").unwrap(), (67, 33));
    for bad in ["75", "0/100", "a/b", "75/"] {
        assert!(parse_split(bad).unwrap_err().contains("--splits"), "{bad}");
    }
    assert_eq!(parse_system("acc64").unwrap(), (64, None));
    assert_eq!(parse_system("spec32").unwrap(), (64, Some(32)));
    assert_eq!(parse_system("spec50g").unwrap(), (64, Some(50)));
    assert!(system_gated("spec50g") && !system_gated("spec50") && !system_gated("acc64"));
    assert!(parse_system("acc64g").is_err());
    assert!(parse_system("acc0").is_err());
    assert!(parse_system("cm33").unwrap_err().contains("--systems"));
}

#[test]
fn speculative_systems_are_accepted_and_specd_gets_its_flags() {
    for s in SPEC_SYSTEMS {
        check_args(&SpeculativeArgs {
            systems: vec!["acc64".into(), s.into()],
            ..args()
        })
        .expect(s);
    }
    assert!(parse_system("spec0").unwrap_err().contains("window"));
    let keys = crate::fabric::keys::LabKeys::generate(&[MIGRATION_KEY, MOVE_KEY]).unwrap();
    let with_gate = |gate| {
        specd_args(
            Ipv4Addr::new(10, 0, 0, 2),
            Ipv4Addr::new(10, 0, 0, 3),
            50,
            "10.0.0.9:7400".parse().unwrap(),
            SpecdFiles {
                adopt: Path::new("/tmp/a.sock"),
                summary: Path::new("/tmp/s.json"),
                keys: &keys,
                rmem: crate::fabric::keys::RmemLabKeys::shared().unwrap(),
            },
            gate,
        )
    };
    let v = with_gate(false).join(" ");
    assert!(!v.contains("--gate-peer-load"));
    let g = with_gate(true);
    assert_eq!(g.last().map(String::as_str), Some("--gate-peer-load"));
    for want in [
        "specd --listen 10.0.0.2:7000 --server-port 80 --adopt-socket /tmp/a.sock",
        "--accept 127.0.0.1:0 --queue 64 --window 50 --vip 10.77.1.100",
        "--peer daemon=10.0.0.3:7000,backend=10.0.0.3,region=udp:10.0.0.3:7471?key=1:",
        " --frontend 10.0.0.9:7400",
        "--summary /tmp/s.json",
    ] {
        assert!(v.contains(want), "{want}: {v}");
    }
}

#[test]
fn specd_summaries_fill_the_point() {
    let b0: serde_json::Value = serde_json::from_str(
        r#"{"wall_s":5.0,"process_cpu_ms":100.0,"source":{"accepted":12,"migrated":10,"lost":1,"steer_mode":"kernel",
        "local_handoff_failed":0,"local_handoff":{"queued_max":7,"client_gone":1},
        "window":{"target_refusals":2,"closures":3},
        "migration_us":{"count":10,"p50":100,"p99":900,"max":950,"mean":150.0},
        "cpu_us":{"count":10,"p50":400,"p99":800,"max":800,"mean":500.0}},
        "target":{"handoff_failed":0,"cpu_us":{"count":0,"p50":0,"p99":0,"max":0,"mean":0.0}}}"#,
    )
    .unwrap();
    let b1: serde_json::Value = serde_json::from_str(
        r#"{"wall_s":4.0,"process_cpu_ms":120.0,"source":{"migrated":30,"lost":0,"local_handoff_failed":0,"steer_mode":"kernel",
        "window":{"target_refusals":0,"closures":1},
        "migration_us":{"count":30,"p50":200,"p99":500,"max":600,"mean":210.0},
        "cpu_us":{"count":30,"p50":300,"p99":400,"max":400,"mean":300.0}},
        "target":{"handoff_failed":2,"handoff":{"queued_max":12,"client_gone":2},"cpu_us":{"count":10,"p50":250,"p99":300,"max":300,"mean":250.0}}}"#,
    )
    .unwrap();
    let f = SpecdFigures::from_summaries(&[b0, b1]);
    assert_eq!(
        (f.migrations, f.refusals, f.window_closures, f.lost),
        (40, 2, 4, 3)
    );
    assert_eq!((f.handoff_queued_max, f.handoff_client_gone), (12, 3));
    assert_eq!(f.p50_us, Some(175.0));
    assert_eq!(f.p99_us, Some(900.0));
    assert_eq!(f.cpu_source_us, Some(350.0));
    assert_eq!(f.cpu_target_us, Some(250.0));
    // 100 ms over 5 s and 120 ms over 4 s: 20 and 30 ms/s.
    assert_eq!(f.cpu_ms_per_s, Some(25.0));
    assert_eq!(f.steer_mode.as_deref(), Some("kernel"));
    let none = SpecdFigures::from_summaries(&[serde_json::json!({"source": null})]);
    assert_eq!(none, SpecdFigures::default());
}

#[test]
fn arguments_are_checked_with_the_flag_named() {
    let cases: [(&str, SpeculativeArgs); 9] = [
        (
            "--repeat",
            SpeculativeArgs {
                repeat: 0,
                ..args()
            },
        ),
        (
            "--repeat",
            SpeculativeArgs {
                repeat: REPEAT_MAX + 1,
                ..args()
            },
        ),
        (
            "--hosts",
            SpeculativeArgs {
                hosts: Hosts::Loopback,
                ..args()
            },
        ),
        (
            "--experiment",
            SpeculativeArgs {
                experiment: vec!["triple".into()],
                ..args()
            },
        ),
        (
            "--rates",
            SpeculativeArgs {
                rates: vec![0.0],
                ..args()
            },
        ),
        (
            "--node-cpu-pct",
            SpeculativeArgs {
                node_cpu_pct: Some(0),
                ..args()
            },
        ),
        (
            "--accept-queues",
            SpeculativeArgs {
                accept_queues: vec![0],
                ..args()
            },
        ),
        (
            "--splits",
            SpeculativeArgs {
                splits: vec!["100".into()],
                ..args()
            },
        ),
        (
            "--duration-s",
            SpeculativeArgs {
                duration_s: Some(0.0),
                ..args()
            },
        ),
    ];
    for (flag, a) in cases {
        let e = check_args(&a).err().expect(flag).to_string();
        assert!(e.contains(flag), "{flag}: {e}");
    }
}

#[test]
fn load_models_choose_rates_and_clients() {
    let both = SpeculativeArgs {
        load: crate::fabric::flags::LoadModels::Both,
        ..args()
    };
    let p = check_args(&both).unwrap();
    assert_eq!(p.rates.len(), RATE_MULTIPLES_QUICK.len());
    assert_eq!(p.clients, [128]);
    let full = check_args(&SpeculativeArgs {
        sweep: crate::fabric::flags::SweepFlags {
            quick: false,
            resume: None,
        },
        ..both.clone()
    })
    .unwrap();
    assert_eq!(full.clients, [64, 128, 256]);
    let closed = check_args(&SpeculativeArgs {
        load: crate::fabric::flags::LoadModels::Closed,
        clients: vec![10, 20],
        ..args()
    })
    .unwrap();
    assert!(closed.rates.is_empty());
    assert_eq!(closed.clients, [10, 20]);
    assert!(check_args(&args()).unwrap().clients.is_empty(), "open only");
    for bad in [0, CLIENTS_MAX + 1] {
        let e = check_args(&SpeculativeArgs {
            clients: vec![8, bad],
            ..both.clone()
        })
        .err()
        .expect("bad --clients accepted")
        .to_string();
        assert!(e.contains("--clients"), "{e}");
    }
    // Each line: its closed-loop points first, then its open-loop ones.
    let a = SpeculativeArgs {
        experiment: vec!["split".into()],
        splits: vec!["75/25".into()],
        rates: vec![50.0],
        clients: vec![64],
        ..both
    };
    let p = check_args(&a).unwrap();
    let labels: Vec<String> = point_keys(&a, &p)
        .iter()
        .map(|k| format!("{} {}", k.split, k.load_label()))
        .collect();
    assert_eq!(labels, ["75/25 clients=64", "75/25 rate=50.0"]);
}

#[test]
fn closed_loop_points_have_their_own_panels_and_single_server() {
    let closed = |mut p: SpecPoint, clients: u32| {
        p.load = "closed".into();
        p.clients = Some(clients);
        p
    };
    let pts = [
        point("acc64", SPLIT_SINGLE, 100.0, 90.0),
        closed(point("acc64", SPLIT_SINGLE, 95.0, 80.0), 64),
        closed(point("acc64", "75/25", 120.0, 120.0), 64),
        closed(point("spec32", "75/25", 170.0, 168.0), 256),
        point("spec32", "75/25", 200.0, 171.0),
    ];
    let refs: Vec<&SpecPoint> = pts.iter().collect();
    let t = peaks_and_break_even(&refs);
    // A peaks row with its spacing collapsed, found by its panel and system.
    let row = |panel: &str, sys: &str| {
        t.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .find(|l| l.starts_with(&format!("{panel} {sys} ")))
            .unwrap_or_else(|| panic!("no {panel} {sys} row: {t}"))
    };
    // Closed against the closed single server (80), open against the open one (90).
    assert_eq!(
        row("split 75/25 closed", "acc64"),
        "split 75/25 closed acc64 120.0 1.50x"
    );
    assert_eq!(
        row("split 75/25 closed", "spec32"),
        "split 75/25 closed spec32 168.0 2.10x"
    );
    assert_eq!(
        row("split 75/25", "spec32"),
        "split 75/25 spec32 171.0 1.90x"
    );
    let table = table(&refs);
    assert!(
        table.contains("conn/s vs closed-loop users, split 75/25 closed (Fig. 3)"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["256", "-", "168.0"]),
        "{table}"
    );
    let names: Vec<String> = figures(&refs).into_iter().map(|f| f.0).collect();
    assert!(
        names.contains(&"fig-spec-conn-split-75-25-closed.svg".to_string()),
        "{names:?}"
    );
    let any = pts[3].clone();
    let text = serde_json::to_string(&any).unwrap();
    assert!(
        text.contains("\"load\":\"closed\",\"clients\":256"),
        "{text}"
    );
    assert_eq!(serde_json::from_str::<SpecPoint>(&text).unwrap(), any);
    // Repeats of a closed-loop point: its rate is what the users offered in all.
    let both = SpecPoint::combine(&[
        closed(point("spec32", "75/25", 100.0, 90.0), 64),
        closed(point("spec32", "75/25", 200.0, 95.0), 64),
    ]);
    assert_eq!((both.rate, both.offered_per_s), (150.0, 150.0));
    assert_eq!(both.clients, Some(64));
    // Points written before the closed loop read as open-loop points.
    let old = text.replace("\"load\":\"closed\",\"clients\":256,", "");
    let back: SpecPoint = serde_json::from_str(&old).unwrap();
    assert_eq!((back.load.as_str(), back.clients), ("open", None));
}

#[test]
fn keys_cover_each_experiment_line_and_rate() {
    let a = SpeculativeArgs {
        rates: vec![50.0, 100.0],
        ..args()
    };
    let p = check_args(&a).unwrap();
    let names: Vec<String> = point_keys(&a, &p)
        .iter()
        .map(|k| format!("{} {} {} {}", k.experiment, k.system, k.split, k.rate))
        .collect();
    assert_eq!(names.len(), (3 + 2) * 2);
    assert_eq!(names[0], "single acc64 100 50");
    assert_eq!(names[5], "single acc128 100 100");
    assert_eq!(names[6], "split acc64 67/33 50");
    assert_eq!(names[9], "split acc64 75/25 100");
}

#[test]
fn mac_is_read_from_ip_link() {
    let l = "3: eth0@if4: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue \
             state UP mode DEFAULT group default qlen 1000\\    link/ether \
             9a:3b:00:11:22:33 brd ff:ff:ff:ff:ff:ff link-netns fs-x";
    assert_eq!(mac_of(l).as_deref(), Some("9a:3b:00:11:22:33"));
    assert_eq!(mac_of("1: lo: <LOOPBACK>"), None);
}

fn point(system: &str, split: &str, rate: f64, conn: f64) -> SpecPoint {
    SpecPoint {
        experiment: if split == SPLIT_SINGLE {
            "single".into()
        } else {
            "split".into()
        },
        system: system.into(),
        split: split.into(),
        accept_queue: 64,
        rate,
        offered_per_s: rate,
        conn_per_s: conn,
        served: (conn * 10.0) as u64,
        duration_s: 10.0,
        capacity_rps: 98.5,
        runs: 1,
        ..SpecPoint::empty()
    }
}

#[test]
fn repeats_combine_into_one_point_with_their_spread() {
    let a = point("spec32", "75/25", 200.0, 140.0);
    let b = point("spec32", "75/25", 200.0, 150.0);
    let c = SpecPoint::combine(&[a.clone(), b]);
    assert_eq!(c.runs, 2);
    assert!((c.conn_per_s - 145.0).abs() < 1e-9, "{}", c.conn_per_s);
    assert_eq!(c.conn_per_s_min, Some(140.0));
    assert_eq!(c.conn_per_s_max, Some(150.0));
    assert!(table(&[&c]).contains("(2 runs: 140.0-150.0 conn/s)"));
    let one = SpecPoint::combine(std::slice::from_ref(&a));
    assert_eq!((one.conn_per_s_min, one.conn_per_s_max), (None, None));
    // Per-second completions add up second by second, a shorter run's as far as
    // it goes; connect timeouts are summed.
    let s1 = SpecPoint {
        served_per_s: vec![10, 20, 30],
        connect_timeouts: 2,
        connect_errors: 1,
        io_errors: 4,
        ..a.clone()
    };
    let s2 = SpecPoint {
        served_per_s: vec![1, 2],
        connect_timeouts: 3,
        ..a
    };
    let both = SpecPoint::combine(&[s1, s2]);
    assert_eq!(both.served_per_s, vec![11, 22, 30]);
    assert_eq!(both.connect_timeouts, 5);
    assert_eq!((both.connect_errors, both.io_errors), (1, 4));
    assert!(!table(&[&one]).contains("runs:"));
}

#[test]
fn points_round_trip_and_render() {
    let p = point("acc64", "75/25", 100.0, 90.0);
    let any = p.clone();
    let text = serde_json::to_string(&any).unwrap();
    for k in [
        "\"system\"",
        "\"split\"",
        "\"rate\"",
        "\"conn_per_s\"",
        "\"migrations\"",
        "\"migration_p50_us\":null",
        "\"migration_p99_us\":null",
    ] {
        assert!(text.contains(k), "{k}: {text}");
    }
    let back: SpecPoint = serde_json::from_str(&text).unwrap();
    assert_eq!(back, any);
    let pts = [
        p.clone(),
        point("acc64", SPLIT_SINGLE, 100.0, 80.0),
        point("acc96", SPLIT_SINGLE, 100.0, 85.0),
    ];
    let refs: Vec<&SpecPoint> = pts.iter().collect();
    let t = table(&refs);
    assert!(t.contains("Fig. 1") && t.contains("Fig. 3"), "{t}");
    assert!(t.contains("acc96"), "{t}");
    assert!(csv(&refs)
        .lines()
        .nth(1)
        .unwrap()
        .starts_with("split,acc64,75/25,64,,100.000,"));
    let f = figures(&refs);
    let names: Vec<&str> = f.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "fig-spec-conn-split-75-25.svg",
            "fig-spec-rt-split-75-25.svg",
            "fig-spec-conn-single.svg",
            "fig-spec-rt-single.svg"
        ]
    );
    for (_, _, svg) in &f {
        crate::svg::check_well_formed(svg).unwrap();
    }
    let c = SpecPoint::combine(&[p.clone(), p.clone()]);
    assert_eq!((c.runs, c.served), (2, 1800));
    assert!((c.conn_per_s - 90.0).abs() < 1e-9);
}

#[test]
fn a_point_is_built_from_the_measured_figures_alone() {
    let key = |clients: Option<u32>| Key {
        experiment: "split".into(),
        system: "spec32".into(),
        split: "75/25".into(),
        rate: if clients.is_some() { 0.0 } else { 120.0 },
        clients,
    };
    let s = farside_loadgen::Summary {
        offered_rps: 150.0,
        tps: 90.0,
        served: 900,
        failures: 3,
        dropped_503: 2,
        avg_ms: 4.0,
        p99_ms: 40.0,
        duration_s: 10.0,
        ..Default::default()
    };
    let figures = SpecdFigures {
        migrations: 7,
        ..Default::default()
    };
    let open = point_of(
        &key(None),
        (64, Some(32)),
        100.0,
        &s,
        Vec::new(),
        figures.clone(),
        WindowSeries::default(),
    );
    assert_eq!((open.load.as_str(), open.rate), ("open", 120.0));
    assert_eq!(
        (open.conn_per_s, open.failures, open.migrations),
        (90.0, 5, 7)
    );
    assert_eq!((open.accept_queue, open.admission_window), (64, Some(32)));
    assert_eq!(open.capacity_rps, 100.0);
    // The closed loop's rate is what its users offered.
    let closed = point_of(
        &key(Some(128)),
        (64, None),
        100.0,
        &s,
        Vec::new(),
        figures,
        WindowSeries::default(),
    );
    assert_eq!((closed.load.as_str(), closed.rate), ("closed", 150.0));
    assert_eq!(closed.clients, Some(128));
    assert_eq!(point_tag(&key(Some(128)), 0), "split-spec32-75-25-c128");
    assert_eq!(point_tag(&key(None), 2), "split-spec32-75-25-120-r2");
}
