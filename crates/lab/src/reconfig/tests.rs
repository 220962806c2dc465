//! Tests of `lab reconfig`: scenarios, allocations, schedules, points and tables.

use super::*;
use crate::fabric::flags::Hosts;

#[test]
fn scenarios_parse_and_bad_ones_name_the_flag() {
    assert_eq!(parse_scenario("3:3:2").unwrap(), vec![3, 3, 2]);
    assert_eq!(parse_scenario("2:2:2:2").unwrap(), vec![2, 2, 2, 2]);
    for bad in ["3", "3:0:2", "a:b", "", "40:40"] {
        let e = parse_scenario(bad).unwrap_err();
        assert!(e.contains("--scenario"), "{bad}: {e}");
    }
}

#[test]
fn allocations_follow_the_ratio_and_overprovisioning_keeps_anchors() {
    let r = [3, 3, 2];
    assert_eq!(initial_allocation(&r), vec![0, 0, 0, 1, 1, 1, 2, 2]);
    assert_eq!(anchors(&r), vec![0, 3, 6]);
    let o = overprovisioned_allocation(&r, 1);
    assert_eq!(o, vec![0, 1, 1, 1, 1, 1, 2, 1]);
    // The loaded site has N − (sites − 1) nodes, every other site its anchor only.
    for loaded in 0..3 {
        let o = overprovisioned_allocation(&r, loaded);
        assert_eq!(o.iter().filter(|&&s| s == loaded).count(), 8 - 2);
        for s in 0..3 {
            assert!(o.contains(&s), "site {s} kept a node");
        }
    }
    let r4 = [2, 2, 2, 2];
    let o = overprovisioned_allocation(&r4, 3);
    assert_eq!(o, vec![0, 3, 1, 3, 2, 3, 3, 3]);
}

#[test]
fn bursts_cycle_over_the_sites() {
    assert_eq!(
        burst_schedule(3, 512, 1),
        vec![(0, 512), (1, 512), (2, 512)]
    );
    assert_eq!(
        burst_schedule(2, 7, 2),
        vec![(0, 7), (1, 7), (0, 7), (1, 7)]
    );
    assert_eq!(burst_schedule(2, 7, 0).len(), 2, "at least one cycle");
    assert_eq!(split(10, 3), vec![4, 3, 3]);
    assert_eq!(split(10, 3).iter().sum::<u64>(), 10);
    assert_eq!(split(1, 2), vec![1, 0]);
}

#[test]
fn default_quota_gives_the_backends_half_the_cpus() {
    assert_eq!(default_node_cpu_pct(2, 8), 12);
    assert_eq!(default_node_cpu_pct(16, 8), 100);
    assert_eq!(default_node_cpu_pct(1, 64), NODE_CPU_PCT_MIN);
    // 80% of a 12% quota, in ppm of 2 CPUs: 0.8 × 0.12 / 2.
    assert_eq!(quota_share_ppm(80, 12, 2), 48_000);
    assert_eq!(quota_share_ppm(80, 100, 1), 800_000);
}

#[test]
fn metrics_are_read_by_name_and_label() {
    let m = "farside_proxy_site_backends{site=\"s0\"} 3\n\
             farside_proxy_site_backends{site=\"s1\"} 1\n\
             farside_reconf_moves_total 4\n";
    assert_eq!(site_backends(m, "s0"), Some(3));
    assert_eq!(site_backends(m, "s1"), Some(1));
    assert_eq!(site_backends(m, "s2"), None);
    assert_eq!(plain_value(m, "farside_reconf_moves_total"), 4);
    assert_eq!(plain_value(m, "farside_reconf_rounds_total"), 0);
}

fn args() -> ReconfigArgs {
    ReconfigArgs {
        out: "x".into(),
        sweep: crate::fabric::flags::SweepFlags {
            quick: true,
            resume: None,
        },
        hosts: Hosts::Netns,
        systems: SYSTEMS.iter().map(|s| s.to_string()).collect(),
        scenario: Vec::new(),
        bursts: Vec::new(),
        cycles: 1,
        clients: 64,
        proxies: 2,
        node_cpu_pct: None,
        transport: None,
        sensitivity_ms: 250,
        history_ms: vec![DEFAULT_HISTORY_MS],
        sweep_t: Vec::new(),
        lease_ms: 3000,
        high_pct: 80,
        spare_pct: 60,
        backend_workers: 8,
        cpu_us_per_request: 500,
        repeat: 1,
    }
}

#[test]
fn arguments_are_checked_with_the_flag_named() {
    let p = check_args(&args()).unwrap();
    assert_eq!(p.bursts, BURSTS_QUICK.to_vec());
    assert_eq!(p.scenarios.len(), 1);
    let full = check_args(&ReconfigArgs {
        sweep: crate::fabric::flags::SweepFlags {
            quick: false,
            resume: None,
        },
        ..args()
    })
    .unwrap();
    assert_eq!(full.bursts, BURSTS_FULL.to_vec());
    assert_eq!(full.scenarios.len(), 2);
    // Transports per host mode: xdp by default on netns, shm on loopback.
    assert_eq!(p.transport, Transport::Xdp);
    let lo = |t: Option<&str>| ReconfigArgs {
        hosts: Hosts::Loopback,
        transport: t.map(str::to_string),
        ..args()
    };
    let l = check_args(&lo(None)).unwrap();
    assert!(l.loopback);
    assert_eq!(l.transport, Transport::Shm);
    assert_eq!(
        check_args(&lo(Some("udp"))).unwrap().transport,
        Transport::Udp
    );
    assert_eq!(
        check_args(&lo(Some("tcp"))).unwrap().transport,
        Transport::Tcp
    );
    let cases: [(&str, ReconfigArgs); 7] = [
        (
            "--transport",
            ReconfigArgs {
                transport: Some("shm".into()),
                ..args()
            },
        ),
        ("--transport", lo(Some("xdp"))),
        ("--transport", lo(Some("rdma"))),
        (
            "--systems",
            ReconfigArgs {
                systems: vec!["elastic".into()],
                ..args()
            },
        ),
        (
            "--scenario",
            ReconfigArgs {
                scenario: vec!["8".into()],
                ..args()
            },
        ),
        (
            "--bursts",
            ReconfigArgs {
                bursts: vec![0],
                ..args()
            },
        ),
        (
            "--clients",
            ReconfigArgs {
                clients: 1,
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
fn a_t_sweep_gives_reconf_one_point_per_t() {
    let plan = check_args(&ReconfigArgs {
        systems: vec!["rigid".into(), "reconf".into()],
        bursts: vec![512, 4096],
        ..args()
    })
    .unwrap();
    let keys = point_keys(&plan, &[300, 5000]);
    let names: Vec<String> = keys
        .iter()
        .map(|k| format!("{} {}", label(&k.system, k.history_ms), k.burst))
        .collect();
    assert_eq!(
        names,
        [
            "rigid 512",
            "reconf-T300 512",
            "reconf-T5000 512",
            "rigid 4096",
            "reconf-T300 4096",
            "reconf-T5000 4096"
        ]
    );
    let e = check_args(&ReconfigArgs {
        history_ms: vec![0],
        ..args()
    })
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("--history-ms"), "{e}");
    // --sweep-t is the sweep's documented name: same points as --history-ms.
    let plan = check_args(&ReconfigArgs {
        systems: vec!["reconf".into()],
        bursts: vec![512],
        sweep_t: vec![300, 1000, 5000],
        ..args()
    })
    .unwrap();
    assert_eq!(plan.history_ms, [300, 1000, 5000]);
    assert_eq!(point_keys(&plan, &plan.history_ms).len(), 3);
    for (bad, flag) in [
        (
            ReconfigArgs {
                sweep_t: vec![300, 0],
                ..args()
            },
            "--sweep-t",
        ),
        (
            ReconfigArgs {
                sweep_t: vec![300],
                history_ms: vec![1000],
                ..args()
            },
            "--history-ms",
        ),
    ] {
        let e = check_args(&bad).err().unwrap().to_string();
        assert!(e.contains(flag), "{e}");
    }
}

#[test]
fn the_t_sweep_table_gives_moves_and_tps_per_t() {
    let mk = |t: u64, burst: u64, moves: u64, tps: f64| {
        let mut p = ReconfigPoint::combine(&[]);
        p.system = "reconf".into();
        p.scenario = "2:2:2:2".into();
        p.transport = "xdp".into();
        p.history_ms = Some(t);
        p.burst = burst;
        p.moves = moves;
        p.tps = tps;
        p
    };
    let pts = [mk(300, 512, 9, 500.0), mk(5000, 512, 1, 420.0)];
    let refs: Vec<&ReconfigPoint> = pts.iter().collect();
    let t = t_sweep_table(&refs);
    assert!(t.contains("T sweep, scenario 2:2:2:2"), "{t}");
    let row = t.lines().find(|l| l.starts_with("300 ")).expect(&t);
    assert!(row.contains(" 9 ") && row.contains("500.0"), "{row}");
    assert!(table(&refs).contains("T sweep"), "in the main table too");
    // One T: no sweep table.
    assert!(t_sweep_table(&refs[..1]).is_empty());
}

#[test]
fn points_round_trip_as_reconfig_points_and_render() {
    let p = ReconfigPoint {
        system: "reconf".into(),
        scenario: "2:2".into(),
        burst: 512,
        transport: "xdp".into(),
        history_ms: Some(300),
        tps: 100.0,
        served: 1024,
        failures: 0,
        wall_s: 10.24,
        bursts: 2,
        moves: 1,
        lab_moves: 0,
        switches: 1,
        switch_p50_ms: Some(45.0),
        switch_p99_ms: Some(45.0),
        switch_unmatched: 0,
        apply_p50_ms: Some(25.0),
        apply_p99_ms: Some(40.0),
        decision_p50_ms: Some(1.8),
        decision_p99_ms: Some(1.8),
        moves_timed: vec![timing::MoveTiming {
            balancer: 0,
            node: 1,
            to_site: 0,
            t_s: 1.5,
            decision_ms: 1.8,
            round_ms: 2.6,
            switch_ms: Some(45.0),
        }],
        burst_tps: vec![90.0, 110.0],
        series: vec![NodesSample {
            t_s: 0.1,
            site: 0,
            nodes: 2,
        }],
        runs: 1,
        run_tps: Vec::new(),
    };
    let text = serde_json::to_string(&p).unwrap();
    let back: ReconfigPoint = serde_json::from_str(&text).unwrap();
    assert_eq!(back, p);
    let t = table(&[&p]);
    assert!(t.contains("reconf") && t.contains("Fig. 7"), "{t}");
    assert!(csv(&[&p])
        .lines()
        .nth(1)
        .unwrap()
        .starts_with("reconf,300,2:2,512,xdp,"));
    assert!(t.contains("reconf-T300"), "{t}");
    let (name, body) = series_csv(&p);
    assert_eq!(name, "nodes-reconf-T300-2-2-512.csv");
    assert_eq!(body, "t_s,site,nodes\n0.100,0,2\n");
    let c = ReconfigPoint::combine(&[p.clone(), p.clone()]);
    assert_eq!((c.runs, c.moves, c.served), (2, 2, 2048));
    assert_eq!(c.moves_timed.len(), 2);
    assert_eq!(
        (c.switch_p99_ms, c.decision_p50_ms),
        (Some(45.0), Some(1.8))
    );
    // A point written before these keys existed still reads (they default).
    let mut old = serde_json::to_value(&p).unwrap();
    for k in [
        "switch_unmatched",
        "apply_p50_ms",
        "decision_p99_ms",
        "moves_timed",
    ] {
        old.as_object_mut().unwrap().remove(k);
    }
    let back: ReconfigPoint = serde_json::from_value(old).unwrap();
    assert!(back.moves_timed.is_empty() && back.decision_p99_ms.is_none());
    assert!((c.tps - 100.0).abs() < 1e-9);
}

#[test]
fn repeated_points_keep_each_run_and_show_the_spread() {
    let mk = |system: &str, t: Option<u64>, tps: f64| {
        let mut p = ReconfigPoint::combine(&[]);
        p.system = system.into();
        p.scenario = "4:4".into();
        p.transport = "xdp".into();
        p.history_ms = t;
        p.burst = 4096;
        p.tps = tps;
        p.served = (tps * 10.0) as u64;
        p.wall_s = 10.0;
        p.runs = 1;
        p
    };
    // A single run has no spread, and its table has no spread columns.
    let one = mk("rigid", None, 300.0);
    assert!(one.tps_spread().is_none());
    assert!(!table(&[&one]).contains("tps_sd"));
    assert!(!serde_json::to_string(&one).unwrap().contains("run_tps"));
    let rigid = ReconfigPoint::combine(&[
        mk("rigid", None, 300.0),
        mk("rigid", None, 320.0),
        mk("rigid", None, 310.0),
    ]);
    assert_eq!(rigid.run_tps, vec![300.0, 320.0, 310.0]);
    let sp = rigid.tps_spread().unwrap();
    assert!((sp.sd - 10.0).abs() < 1e-9, "{sp:?}");
    assert_eq!((sp.min, sp.max), (300.0, 320.0));
    assert!((rigid.tps - 310.0).abs() < 1e-9);
    // Combining combined points keeps every run.
    let more = ReconfigPoint::combine(&[rigid.clone(), mk("rigid", None, 330.0)]);
    assert_eq!(more.run_tps.len(), 4);
    let reconf = ReconfigPoint::combine(&[
        mk("reconf", Some(500), 450.0),
        mk("reconf", Some(500), 480.0),
        mk("reconf", Some(500), 465.0),
    ]);
    let t = table(&[&rigid, &reconf]);
    assert!(t.contains("tps_sd") && t.contains("310.0 ± 10.0"), "{t}");
    // 465 / 310 = 1.50; runs 450 / 320 .. 480 / 300.
    assert!(
        t.contains("reconf-T500 burst 4096: 1.50x (runs 1.41..1.60)"),
        "{t}"
    );
}
