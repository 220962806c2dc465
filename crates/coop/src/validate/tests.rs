//! Tests of `validate`.

use super::*;

#[test]
fn disk_service_adds_the_measured_overhead_to_the_configuration() {
    let d = DiskEmulation {
        configured_latency_us: 5_000,
        configured_bytes_per_s: 40_000_000,
        measured_access_ns: 5_080_000.0,
        measured_per_kb_ns: 25_600.0 + 100.0,
    };
    assert_eq!(d.service(5_000, 40_000_000), (5_080_000, 25_700));
    assert_eq!(d.service(1_000, 40_000_000).0, 1_080_000);
}

#[test]
fn run_files_are_bounded_and_checked() {
    let ok = r#"{"cpu_quota_pct":40,"disk_latency_us":5000,"points":[{"system":"rr","nodes":2,
        "cache_bytes":1000,"clients":8,"duration_s":20.0,"tps":100.0,"local_frac":0.5,
        "remote_frac":0.0,"miss_frac":0.5}]}"#;
    assert!(LabRun::parse(ok).is_ok());
    assert!(LabRun::parse(&ok.replace("\"clients\":8", "\"clients\":7")).is_err());
    assert!(LabRun::parse(&ok.replace("\"tps\":100.0", "\"tps\":0.0")).is_err());
    assert!(LabRun::parse(&ok.replace("40", "0")).is_err());
}

/// A small trace: skewed popularity over `objects` objects of 0.5 to 20 KB.
pub(crate) fn small_trace(objects: u32, requests: usize) -> Trace {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let requests = (0..requests)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            (u * u * u * objects as f64) as u32
        })
        .collect();
    Trace {
        object_bytes: (0..objects).map(|i| 500 + (i * 7919) % 20_000).collect(),
        requests,
        clients: Vec::new(),
    }
}

pub(crate) fn costs_file() -> CostsFile {
    CostsFile {
        format: COSTS_FORMAT.into(),
        shape: CalibrationShape::default(),
        provenance: Provenance {
            commit: "test".into(),
            tree_dirty: false,
            kernel: "test".into(),
            host: "test".into(),
            cpus: 2,
            build: "debug".into(),
            measured_at: "2026-01-01T00:00:00Z".into(),
            load_avg: [0.0, 0.0],
            method: "set by hand".into(),
        },
        costs: Costs {
            cpu_request_ns: 60_000,
            cpu_per_kb_ns: 2_000,
            cpu_forward_ns: 40_000,
            cpu_peer_serve_ns: 50_000,
            ..Costs::default()
        },
        disk: DiskEmulation {
            configured_latency_us: 5_000,
            configured_bytes_per_s: 40_000_000,
            measured_access_ns: 5_060_000.0,
            measured_per_kb_ns: 25_600.0,
        },
        client_request_ns: 30_000.0,
        client_per_kb_ns: 500.0,
        transports: Vec::new(),
        host_wide: None,
        delay: None,
        spread: None,
        samples: Vec::new(),
    }
}

fn run_with(tps: [f64; 2]) -> LabRun {
    let point = |system: &str, tps: f64| LabPoint {
        system: system.into(),
        nodes: 2,
        cache_bytes: 200_000,
        clients: 8,
        duration_s: 20.0,
        tps,
        p99_ms: 10.0,
        mean_ms: None,
        local_frac: 0.5,
        remote_frac: 0.2,
        miss_frac: 0.3,
        link_gbit: None,
        load_model: None,
        cpu_us_per_req: None,
        host_busy_us_per_req: None,
        host_ref_ns_per_op: None,
    };
    LabRun {
        cpu_quota_pct: 40,
        disk_latency_us: 5_000,
        disk_bytes_per_s: None,
        warmup_s: None,
        publish_ms: None,
        quick: false,
        repeat: None,
        points: vec![
            point("rr", tps[0]),
            point("press-tcp", tps[1]),
            point("haproxy", 100.0),
        ],
    }
}

/// The model's own answers for the test's two modelled systems (and haproxy, not
/// modelled), and the throughputs of those it modelled: "measurements" are placed
/// around them.
fn probe(f: &CostsFile, trace: &Trace) -> (Vec<PointCheck>, Vec<f64>) {
    let probe = check_runs(f, trace, &[("probe".into(), run_with([1.0, 1.0]))], 1);
    let x = probe
        .iter()
        .filter_map(|c| c.prediction.as_ref().ok().map(Prediction::throughput))
        .collect();
    (probe, x)
}

#[test]
fn points_within_tolerance_pass_and_outside_fail_and_label_the_extrapolation() {
    let trace = small_trace(400, 6_000);
    let f = costs_file();
    // First the model's own answers, then "measurements" placed around them.
    let (probe, x) = probe(&f, &trace);
    assert_eq!(x.len(), 2, "rr and press-tcp modelled, haproxy not");
    assert!(probe[2].pass().is_none());
    let good = check_runs(
        &f,
        &trace,
        &[("good".into(), run_with([x[0] * 1.1, x[1] / 1.1]))],
        1,
    );
    assert_eq!(verdict(&good), (2, 2, 0));
    let bad = check_runs(
        &f,
        &trace,
        &[("bad".into(), run_with([x[0] * 1.1, x[1] * 1.5]))],
        1,
    );
    assert_eq!(verdict(&bad), (2, 1, 1));
    let text = render_checks(&bad);
    assert!(text.contains("FAIL") && text.contains("PASS"), "{text}");
    assert!(text.contains("not modelled"), "{text}");
    let row = ExtrapolatedRow {
        what: "as checked".into(),
        predictions: vec![
            probe[0].prediction.clone().unwrap(),
            probe[1].prediction.clone().unwrap(),
        ],
    };
    let checked = render_extrapolation(std::slice::from_ref(&row), 0, 2);
    assert!(checked.contains(CHECKED_LABEL) && !checked.contains(UNCHECKED_LABEL));
    let unchecked = render_extrapolation(&[row], 1, 2);
    assert!(unchecked.contains("UNCHECKED: 1 of 2"), "{unchecked}");
}

#[test]
fn laws_hold_on_the_models_own_output() {
    let trace = small_trace(400, 6_000);
    let f = costs_file();
    for system in ["rr", "press-tcp"] {
        let mut s = Setup::of_point(&run_with([1.0, 1.0]), &run_with([1.0, 1.0]).points[0]);
        s.system = system.into();
        let p = predict(&f, &trace, &s, 1).unwrap();
        let x = p.throughput();
        // Little's law over the whole closed network: N = X (R + Z).
        let n = x * (p.response_s() + p.think_s);
        assert!(relative_error(n, 8.0) < 1e-9, "{system}: {n}");
        // Utilisation law per node: U = X D, own demand from the node's clients
        // (X / nodes) plus its share of its peers' (X / nodes each, split evenly).
        let u_cpu = x / 2.0 * (p.demands.own[0] + p.demands.peer[0]) / 1e9;
        assert!(relative_error(p.mva.utilisation[0], u_cpu) < 1e-9);
        assert!(p.mva.utilisation.iter().all(|&u| u <= 1.0 + 1e-9));
        // The measured-law checks on a point built from the model's own answer hold.
        let mut point = run_with([x, x]).points[0].clone();
        point.mean_ms = Some(p.response_s() * 1e3);
        point.miss_frac = p.sim.fractions()[2];
        let laws = measured_laws(&point, Some(&p));
        assert!(laws.iter().all(|l| l.holds == Some(true)), "{laws:?}");
    }
}

#[test]
fn summaries_parse_and_each_system_is_modelled_only_with_its_costs() {
    let point = |system: &str, load: &str, clients: usize| {
        format!(
            r#"{{"system":"{system}","nodes":2,"cache_bytes":200000,"clients":{clients},
            "duration_s":8.0,"tps":100.0,"local_frac":0.5,"remote_frac":0.3,
            "miss_frac":0.2,"load_model":"{load}","cpu_us_per_req":50.0,"rate":3000.0}}"#
        )
    };
    let text = format!(
        r#"{{"params":{{"cpu_quota_pct":40,"disk_latency_us":5000,"warmup_s":5}},
        "points":[{},{},{}]}}"#,
        point("press-xdp", "closed", 8),
        point("press-xdp", "open", 0),
        point("lard", "closed", 8)
    );
    let run = LabRun::parse_summary(&text).unwrap();
    assert_eq!(run.warmup_s, Some(5.0));
    assert!(LabRun::parse_summary(&text.replace("\"clients\":8", "\"clients\":0")).is_err());
    let runs = [("s".to_string(), run)];
    let trace = small_trace(400, 6_000);
    let without = check_runs(&costs_file(), &trace, &runs, 1);
    let why = |c: &PointCheck| c.prediction.as_ref().err().cloned().unwrap_or_default();
    assert!(
        why(&without[0]).contains("calibrate again"),
        "{}",
        why(&without[0])
    );
    assert!(why(&without[1]).contains("open loop"));
    assert!(why(&without[2]).contains("proxy"));
    assert_eq!(verdict(&without), (0, 0, 0));
    // With xdp's costs (no process of the holder runs): modelled, nothing at peers.
    let mut f = costs_file();
    f.transports.push(TransportCosts {
        transport: "xdp".into(),
        initial_ns: 30_000.0,
        initial_per_kb_ns: 1_000.0,
        service_ns: 0.0,
        service_per_kb_ns: 0.0,
        softirq_ns: 5_000.0,
        softirq_per_kb_ns: 0.0,
    });
    assert_eq!(modelled_systems(&f), ["rr", "press-tcp", "press-xdp"]);
    let with = check_runs(&f, &trace, &runs, 1);
    let p = with[0].prediction.as_ref().unwrap();
    assert!(p.sim.remote.requests > 0 && p.sim.forwarded.requests == 0);
    assert_eq!(p.demands.peer, [0.0; 3]);
    assert_eq!(verdict(&with).0, 1);
    let laws = &with[0].laws;
    assert!(laws
        .iter()
        .any(|l| l.what.starts_with("Little (model)") && l.holds == Some(true)));
    assert!(laws.iter().any(|l| l.what.contains("D_lab")));
    // press-xdp's fetch costs more at the initial node than press-tcp's there.
    let tcp = predict(
        &f,
        &trace,
        &Setup {
            system: "press-tcp".into(),
            ..p.setup.clone()
        },
        1,
    )
    .unwrap();
    assert!(tcp.demands.peer[0] > 0.0);
}

fn host_wide() -> HostWideCosts {
    let fetch = |t: &str, ns: f64| HostFetchCosts {
        transport: t.into(),
        ns,
        per_kb_ns: 1_000.0,
    };
    HostWideCosts {
        local_ns: 70_000.0,
        local_per_kb_ns: 2_000.0,
        miss_ns: 20_000.0,
        miss_per_kb_ns: 500.0,
        fetch: vec![fetch("tcp", 50_000.0), fetch("xdp", 60_000.0)],
        unattributed_share: 0.01,
        unattributed_warn: 0.1,
        phases: Vec::new(),
        reference_ns_per_op: None,
    }
}

fn delay() -> DelayCosts {
    let fetch = |t: &str, ns: f64| HostFetchCosts {
        transport: t.into(),
        ns,
        per_kb_ns: 100.0,
    };
    DelayCosts {
        local_ns: 200_000.0,
        local_per_kb_ns: 1_000.0,
        miss_ns: 30_000.0,
        miss_per_kb_ns: 0.0,
        fetch: vec![fetch("tcp", 150_000.0), fetch("xdp", 40_000.0)],
        clients: DELAY_CLIENTS,
        phases: Vec::new(),
        clamped: Vec::new(),
    }
}

#[test]
fn costs_files_of_every_format_are_read_and_others_refused() {
    let mut f = costs_file();
    f.format = COSTS_FORMAT_V1.into();
    let v1 = serde_json::to_string(&f).unwrap();
    assert!(
        !v1.contains("host_wide") && !v1.contains("delay"),
        "format 1 files have no such fields"
    );
    assert_eq!(CostsFile::parse(&v1).unwrap().host_wide, None);
    // Formats 2 to 4 must carry their host-wide figures, formats 3 and 4 their delay,
    // format 4 its spread.
    for format in [COSTS_FORMAT_V2, COSTS_FORMAT_V3, COSTS_FORMAT] {
        f.format = format.into();
        let e = CostsFile::parse(&serde_json::to_string(&f).unwrap()).unwrap_err();
        assert!(
            e.contains("host_wide") && e.contains("calibrate again"),
            "{e}"
        );
    }
    f.host_wide = Some(host_wide());
    f.format = COSTS_FORMAT_V2.into();
    let v2 = serde_json::to_string(&f).unwrap();
    assert_eq!(CostsFile::parse(&v2).unwrap(), f);
    assert_eq!(CostsFile::parse(&v2).unwrap().delay, None);
    f.format = COSTS_FORMAT_V3.into();
    let e = CostsFile::parse(&serde_json::to_string(&f).unwrap()).unwrap_err();
    assert!(e.contains("delay") && e.contains("calibrate again"), "{e}");
    f.delay = Some(delay());
    let v3 = serde_json::to_string(&f).unwrap();
    assert_eq!(CostsFile::parse(&v3).unwrap(), f);
    assert!(CostsFile::parse(&v3).unwrap().spread_ends().is_none());
    f.format = COSTS_FORMAT.into();
    let e = CostsFile::parse(&serde_json::to_string(&f).unwrap()).unwrap_err();
    assert!(e.contains("spread") && e.contains("calibrate again"), "{e}");
    let set = f.cost_set();
    f.spread = Some(Spread {
        repeats: 1,
        rule: "test".into(),
        low: set.clone(),
        high: set.clone(),
        per_repeat: vec![set],
    });
    let v4 = serde_json::to_string(&f).unwrap();
    assert_eq!(CostsFile::parse(&v4).unwrap(), f);
    // An older format claiming a delay or a spread, and an unknown format, are refused.
    let e = CostsFile::parse(&v3.replace("costs/3", "costs/2")).unwrap_err();
    assert!(e.contains("delay"), "{e}");
    let e = CostsFile::parse(&v4.replace("costs/4", "costs/3")).unwrap_err();
    assert!(e.contains("spread"), "{e}");
    let e = CostsFile::parse(&v3.replace("costs/3", "costs/5")).unwrap_err();
    assert!(
        e.contains("costs/5") && e.contains("costs/3") && e.contains("costs/1"),
        "{e}"
    );
}

#[test]
fn median_and_spread_of_repeats() {
    assert_eq!(median(&[]), None);
    assert_eq!(median(&[3.0, f64::NAN]), None);
    assert_eq!(median(&[5.0]), Some(5.0));
    assert_eq!(median(&[9.0, 1.0, 5.0]), Some(5.0));
    assert_eq!(median(&[9.0, 1.0, 5.0, 3.0]), Some(4.0));
    // One wild repeat moves the median by nothing, the spread by all of it.
    assert_eq!(median(&[10.0, 11.0, 12.0, 100.0, 9.0]), Some(11.0));
    assert_eq!(min_max(&[10.0, 11.0, 100.0, 9.0]), Some((9.0, 100.0)));
    assert_eq!(min_max(&[]), None);
}

#[test]
fn cost_sets_combine_field_by_field() {
    let mut f = costs_file();
    f.host_wide = Some(host_wide());
    f.transports = vec![TransportCosts {
        transport: "tcp".into(),
        initial_ns: 10.0,
        initial_per_kb_ns: 1.0,
        service_ns: 5.0,
        service_per_kb_ns: 1.0,
        softirq_ns: 0.0,
        softirq_per_kb_ns: 0.0,
    }];
    let base = f.cost_set();
    let sets: Vec<CostSet> = [(3u64, 30.0), (1, 50.0), (2, 10.0)]
        .iter()
        .map(|&(cpu, init)| {
            let mut s = base.clone();
            s.costs.cpu_request_ns = cpu * 1000;
            s.transports[0].initial_ns = init;
            s.host_local_ns = init * 2.0;
            s
        })
        .collect();
    let med = combine_sets(&sets, Pick::Median).unwrap();
    let lo = combine_sets(&sets, Pick::Min).unwrap();
    let hi = combine_sets(&sets, Pick::Max).unwrap();
    assert_eq!(med.costs.cpu_request_ns, 2000);
    assert_eq!(med.transports[0].initial_ns, 30.0);
    assert_eq!(med.host_local_ns, 60.0);
    // Each field on its own: the low set takes every field's lowest, whichever repeat.
    assert_eq!(
        (lo.costs.cpu_request_ns, lo.transports[0].initial_ns),
        (1000, 10.0)
    );
    assert_eq!(
        (hi.costs.cpu_request_ns, hi.transports[0].initial_ns),
        (3000, 50.0)
    );
    assert_eq!(med.transports[0].transport, "tcp");
    // Whole costs stay whole: the median of two is rounded.
    let two = combine_sets(&sets[..2], Pick::Median).unwrap();
    assert_eq!(two.costs.cpu_request_ns, 2000);
    // Repeats that disagree on what they measured are refused.
    let mut odd = sets.clone();
    odd[1].transports[0].transport = "udp".into();
    assert!(combine_sets(&odd, Pick::Median).is_err());
    odd[1].transports.clear();
    assert!(combine_sets(&odd, Pick::Median).is_err());
    assert!(combine_sets(&[], Pick::Median).is_err());
    // The file with a set in place of its costs gives the set back.
    assert_eq!(f.with_set(&lo).cost_set(), lo);
}

/// The calibration's set-up as the light phases run it: 4 nodes at 40 %, disk
/// emulation at 0, one host of 2 CPUs.
fn light_setup() -> Setup {
    let run = run_with([1.0, 1.0]);
    Setup {
        nodes: 4,
        cpu_share: 0.4,
        disk_latency_us: 0,
        disk_bytes_per_s: 1_000_000_000_000,
        shared_host_cpus: Some(2.0),
        ..Setup::of_point(&run, &run.points[1])
    }
}

#[test]
fn the_light_phase_answer_is_the_sum_of_its_demands_at_one_client() {
    let mut f = costs_file();
    f.host_wide = Some(host_wide());
    let s = light_setup();
    // A local hit of 1 KB: the node's CPU at its 40 % share, (60 + 2) us / 0.4, and
    // the host-wide busy time, 70 + 2 us (its queue D/2 and delay D/2 together); no
    // disk, no NIC, no think time (the client's CPU is in the host's figure).
    let local = light_cycle_ns(&f, &s, LightKind::Local, 1024).unwrap();
    assert!(
        (local - (62_000.0 / 0.4 + 72_000.0)).abs() < 1e-3,
        "{local}"
    );
    // A forwarded body adds both ends' CPU at the share (the service node's 50 us +
    // 1 us/KB) and the host's tcp fetch.
    let tcp = light_cycle_ns(&f, &s, LightKind::Fetch("tcp"), 1024).unwrap();
    let want = (62_000.0 + 40_000.0 + 51_000.0) / 0.4 + 72_000.0 + 51_000.0;
    assert!((tcp - want).abs() < 1e-3, "{tcp} vs {want}");
    // A miss adds the emulated disk at the phase's settings: its measured overhead.
    let miss = light_cycle_ns(&f, &s, LightKind::Miss, 1024).unwrap();
    let (access, per_kb) = f.disk.service(0, 1_000_000_000_000);
    let want = 62_000.0 / 0.4 + (access + per_kb) as f64 + 72_000.0 + 20_500.0;
    assert!((miss - want).abs() < 1e-3, "{miss} vs {want}");
    // A delay in the file is not part of the model's own answer there.
    f.delay = Some(delay());
    assert_eq!(
        light_cycle_ns(&f, &s, LightKind::Local, 1024).unwrap(),
        local
    );
    // Without a shared host the client's CPU is the think time, inside the cycle.
    let alone = Setup {
        shared_host_cpus: None,
        ..s
    };
    let c = light_cycle_ns(&f, &alone, LightKind::Local, 1024).unwrap();
    assert!((c - (62_000.0 / 0.4 + 30_500.0)).abs() < 1e-3, "{c}");
    // A transport without costs is refused.
    assert!(light_cycle_ns(&f, &alone, LightKind::Fetch("udp"), 1024).is_err());
}

#[test]
fn the_delay_centre_adds_to_the_response_time_and_little_still_holds() {
    let trace = small_trace(400, 6_000);
    let mut f = costs_file();
    f.host_wide = Some(host_wide());
    let run = run_with([1.0, 1.0]);
    let s = Setup {
        shared_host_cpus: Some(2.0),
        ..Setup::of_point(&run, &run.points[1])
    };
    let without = predict(&f, &trace, &s, 1).unwrap();
    assert_eq!(without.delay_ns, None);
    assert!(render_prediction(&without).contains("delay centre 0"));
    f.delay = Some(delay());
    let with = predict(&f, &trace, &s, 1).unwrap();
    let want = delay_demand_ns(
        &f.delay.as_ref().unwrap().for_system("press-tcp").unwrap(),
        &with.sim,
    );
    assert_eq!(with.delay_ns, Some(want));
    assert!(want >= 200_000.0, "at least a local hit's delay: {want}");
    assert!(with.throughput() < without.throughput());
    // The delay centre is the network's last station: its residence is its demand
    // (no queue), and it adds no CPU, disk or NIC utilisation.
    let k = with.mva.queue_len.len() - 1;
    assert!(
        (with.mva.queue_len[k] - with.throughput() * want / 1e9).abs() < 1e-9,
        "{} vs {}",
        with.mva.queue_len[k],
        with.throughput() * want / 1e9
    );
    assert_eq!(with.demands, without.demands);
    // Little's law on the model's answer: N = X (R + Z), and the laws hold.
    let n = (s.nodes * s.clients_per_node as usize) as f64;
    let little = with.throughput() * (with.response_s() + with.think_s);
    assert!((little - n).abs() < 1e-6 * n, "{little} vs {n}");
    let mut point = run.points[1].clone();
    point.tps = with.throughput();
    let laws = measured_laws(&point, Some(&with));
    let model = laws
        .iter()
        .find(|l| l.what.starts_with("Little (model)"))
        .expect("the model's Little law");
    assert_eq!(model.holds, Some(true), "{}", model.what);
    assert!(render_prediction(&with).contains("delay centre"));
}

#[test]
fn host_wide_costs_pick_each_systems_transport() {
    let h = host_wide();
    let tcp = h.for_system("press-tcp").unwrap();
    assert_eq!((tcp.remote.ns, tcp.forward.ns), (0.0, 50_000.0));
    let xdp = h.for_system("press-xdp").unwrap();
    assert_eq!((xdp.remote.ns, xdp.forward.ns), (60_000.0, 50_000.0));
    let rr = h.for_system("rr").unwrap();
    assert_eq!(
        (rr.local.ns, rr.miss.ns, rr.forward.ns),
        (70_000.0, 20_000.0, 0.0)
    );
    let e = h.for_system("press-udp").unwrap_err();
    assert!(e.contains("udp") && e.contains("calibrate again"), "{e}");
}

#[test]
fn the_host_centre_takes_the_host_wide_demand_when_measured() {
    let trace = small_trace(400, 6_000);
    let mut f = costs_file();
    let run = run_with([1.0, 1.0]);
    let s = Setup {
        shared_host_cpus: Some(2.0),
        ..Setup::of_point(&run, &run.points[1])
    };
    let parts = predict(&f, &trace, &s, 1).unwrap();
    let ph = parts.host.unwrap();
    assert_eq!(ph.host_wide_ns, None);
    assert_eq!(ph.demand_ns(), ph.parts_ns());
    f.host_wide = Some(host_wide());
    let wide = predict(&f, &trace, &s, 1).unwrap();
    let wh = wide.host.unwrap();
    let want = host_wide_demand_ns(
        &f.host_wide
            .as_ref()
            .unwrap()
            .for_system("press-tcp")
            .unwrap(),
        &wide.sim,
    );
    assert_eq!(wh.host_wide_ns, Some(want));
    assert_eq!(wh.demand_ns(), want);
    assert!(want >= 70_000.0, "at least a local hit per request: {want}");
    // The law and the block name the host-wide figure and the sum beside it.
    let mut point = run.points[1].clone();
    point.tps = wide.throughput();
    let laws = measured_laws(&point, Some(&wide));
    let host = laws
        .iter()
        .find(|l| l.what.contains("host CPU"))
        .expect("a host law");
    assert!(host.what.contains("host-wide") && host.what.contains("would give U"));
    assert_eq!(host.holds, Some(true));
    assert!(render_prediction(&wide).contains("host-wide"));
    // Without a shared host (the extrapolation) the host-wide figures are not used.
    let alone = predict(
        &f,
        &trace,
        &Setup {
            shared_host_cpus: None,
            ..s
        },
        1,
    )
    .unwrap();
    assert!(alone.host.is_none());
}

/// A point whose host read the reference workload slower than the calibration did is
/// checked with every CPU cost scaled by the ratio, and the throughput the model gives
/// falls with it; without both readings, or past the range, nothing is scaled.
#[test]
fn the_host_speed_reference_scales_the_checked_costs() {
    let trace = small_trace(400, 6_000);
    let mut f = costs_file();
    f.host_wide = Some(host_wide());
    let run = run_with([1.0, 1.0]);
    let mut p = run.points[1].clone();
    assert_eq!(host_speedup(&f, &p), 1.0, "neither recorded");
    p.host_ref_ns_per_op = Some(20_000.0);
    assert_eq!(
        host_speedup(&f, &p),
        1.0,
        "the calibration did not record it"
    );
    f.host_wide.as_mut().unwrap().reference_ns_per_op = Some(16_000.0);
    assert_eq!(host_speedup(&f, &p), 0.8, "the point's host 25 % slower");
    let slow = LabRun {
        points: vec![p.clone()],
        ..run.clone()
    };
    let fast = LabRun {
        points: vec![LabPoint {
            host_ref_ns_per_op: Some(16_000.0),
            ..p.clone()
        }],
        ..run.clone()
    };
    let x = |r: &LabRun| {
        let c = check_runs(&f, &trace, &[("r".into(), r.clone())], 1);
        let pred = c[0].prediction.as_ref().unwrap();
        (pred.setup.cpu_speedup, pred.throughput())
    };
    let ((ks, xs), (kf, xf)) = (x(&slow), x(&fast));
    assert_eq!((ks, kf), (0.8, 1.0));
    assert!(xs < xf, "a slower host, less throughput: {xs} vs {xf}");
    // The nodes' whole-core CPU is this host's CPU time, as the host-wide figure is:
    // the demand at the share times the share alone (the speed-up is inside the demand;
    // the quota is a share of this host's cores whatever their speed).
    let c = check_runs(&f, &trace, &[("r".into(), slow.clone())], 1);
    let pred = c[0].prediction.as_ref().unwrap();
    let node = (pred.demands.own[0] + pred.demands.peer[0]) * pred.setup.cpu_share;
    assert!((pred.host.unwrap().node_ns - node).abs() < 1e-6);
    assert!(render_prediction(pred).contains(&format!("node {:.1}", node / 1e3)));
    p.host_ref_ns_per_op = Some(16_000.0 * 3.0);
    assert_eq!(host_speedup(&f, &p), 1.0, "3x: another host, not a drift");
}

#[test]
fn the_spread_band_says_whether_a_missed_point_lies_inside_it() {
    assert!(within_band(100.0, 90.0, 110.0));
    assert!(within_band(100.0, 110.0, 90.0));
    assert!(!within_band(120.0, 90.0, 110.0));
    let trace = small_trace(400, 6_000);
    let f = costs_file();
    let (_, x) = probe(&f, &trace);
    // Low and high costs: the disk's and every CPU cost at half and at twice the
    // median's (the test's points are disk-bound).
    let scaled = |k: f64| {
        let mut s = f.cost_set();
        s.disk_access_ns *= k;
        s.disk_per_kb_ns *= k;
        s.costs.cpu_request_ns = (s.costs.cpu_request_ns as f64 * k) as u64;
        s.costs.cpu_per_kb_ns = (s.costs.cpu_per_kb_ns as f64 * k) as u64;
        s.costs.cpu_forward_ns = (s.costs.cpu_forward_ns as f64 * k) as u64;
        s.costs.cpu_peer_serve_ns = (s.costs.cpu_peer_serve_ns as f64 * k) as u64;
        f.with_set(&s)
    };
    // rr measured 30 % below the median's prediction (outside), press-tcp at it. (The
    // disk's time never goes below its configured latency, so the low end moves little.)
    let runs = [("r".to_string(), run_with([x[0] * 0.7, x[1]]))];
    let checks = check_runs(&f, &trace, &runs, 1);
    let low = check_runs(&scaled(0.5), &trace, &runs, 1);
    let high = check_runs(&scaled(2.0), &trace, &runs, 1);
    let text = render_spread(&checks, &low, &high);
    let rr = text.lines().find(|l| l.contains(" rr ")).unwrap();
    let press = text.lines().find(|l| l.contains("press-tcp")).unwrap();
    assert!(rr.ends_with("yes"), "{text}");
    assert!(press.ends_with(" -"), "{text}");
    assert!(
        text.contains(
            "outside the tolerance: 1; of them with the measured value inside the spread's band: 1"
        ),
        "{text}"
    );
    // With no spread to speak of, the missed point lies outside the band.
    let text = render_spread(&checks, &checks, &checks);
    assert!(text.contains("band: 0"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains(" rr ") && l.contains("no (-30.0 %")),
        "{text}"
    );
}
