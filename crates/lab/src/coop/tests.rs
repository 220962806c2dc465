//! Unit tests of the coop lab's points, tables and cache rule.

use super::*;
use farside_coop::trace::{world_cup_sample_path, Trace};

#[test]
fn the_models_session_replay_is_the_load_generators() {
    // farside_coop's sessions and start rows (what `farside model coop` simulates)
    // against farside loadgen's own replay, for the seeds the lab gives its instances.
    use farside_loadgen::trace::{PathMode, Rng, WorldCupTrace};
    let path = world_cup_sample_path();
    let t = Trace::read_world_cup(&path).unwrap();
    let (sessions, replayed) = (t.sessions(), t.replayed_rows());
    let wc = WorldCupTrace::load(&path).unwrap();
    assert_eq!(replayed.len(), wc.sequence.len());
    let mut ids = std::collections::HashMap::new();
    let mut rng = Rng::new(0);
    for (run, node) in [(0, 0), (0, 3), (1, 1), (2, 7)] {
        let seed = farside_coop::validate::lab_loadgen_seed(run, node);
        let lg = farside_loadgen::Trace::worldcup(wc.clone(), PathMode::Docroot).seeded(seed);
        let start = t.loadgen_start_row(seed);
        assert_eq!(replayed[lg.start_row()], start, "seed {seed}");
        let first = t.clients[start] as usize;
        for k in 0..300 {
            let mut s = lg.new_session();
            for &row in &sessions[(first + k) % sessions.len()] {
                let pick = lg.next_in(&mut s, &mut rng).expect("as long a session");
                let object = t.requests[row as usize];
                // One loadgen object per model object, of the same size.
                assert_eq!(*ids.entry(object).or_insert(pick.object), pick.object);
                assert_eq!(
                    lg.objects[pick.object].bytes,
                    u64::from(t.object_bytes[object as usize])
                );
            }
            assert!(lg.next_in(&mut s, &mut rng).is_none(), "as short a session");
        }
    }
}

#[test]
fn objects_differ_and_the_cache_rule_splits_the_hot_set() {
    assert_ne!(object_body(1, 64), object_body(2, 64));
    assert_eq!(object_body(7, 100)[..50], object_body(7, 50)[..]);
    let t = Trace::read_world_cup(&world_cup_sample_path()).unwrap();
    let w = t.working_set_bytes(CACHE_RULE_FRACTION);
    assert_eq!(cache_rule(&t, 4), w.div_ceil(4));
    assert!(cache_rule(&t, 4) * 4 >= w);
}

fn point(system: &str, link: f64, tps: f64) -> CoopPoint {
    CoopPoint {
        system: system.into(),
        nodes: 4,
        link_gbit: link,
        load_model: "closed".into(),
        clients: 16,
        runs: 1,
        tps,
        ..CoopPoint::default()
    }
}

#[test]
fn the_bandwidth_line_compares_the_lower_link_with_the_higher() {
    let pts = [
        point("press-tcp", 10.0, 1000.0),
        point("press-tcp", 1.0, 940.0),
    ];
    let t = table(&pts);
    assert!(
        t.contains("press-tcp 4 nodes closed 16 clients: 10G -> 1G: tps 1000.0 -> 940.0 (-6.0 %)"),
        "{t}"
    );
    let c = CoopPoint::combine(&[point("rr", 0.0, 10.0), point("rr", 0.0, 20.0)]);
    assert_eq!((c.runs, c.tps), (2, 15.0));
}

#[test]
fn the_table_and_csv_carry_the_overhead_only_when_measured() {
    let ovh = |us: u64, tps: f64| CoopPoint {
        message_overhead_us: us,
        // 4,800 spins over 2 runs of 8 s at 500/s: 0.6 per request.
        overhead_spins: us * 96,
        runs: 2,
        duration_s: 8.0,
        ..point("press-tcp", 0.0, tps)
    };
    let with = [ovh(0, 1000.0), ovh(50, 500.0)];
    let t = table(&with);
    assert!(t.lines().next().unwrap().contains("ovh_us"), "{t}");
    assert!(
        t.contains("overhead: press-tcp 4 nodes closed 16 clients link -: 0 / 50 us"),
        "{t}"
    );
    assert!(t.contains("spins/req 0.00 / 0.60"), "{t}");
    let c = csv(&with).unwrap();
    let head = c.lines().next().unwrap();
    assert!(
        head.starts_with("system,nodes,cache_bytes,link_gbit,message_overhead_us,"),
        "{head}"
    );
    assert!(head.ends_with(",overhead_spins"), "{head}");
    assert_eq!(figures(&with).len(), 2, "split and overhead");
    let without = [ovh(0, 1000.0)];
    assert!(!table(&without).contains("ovh_us"));
    assert!(!csv(&without).unwrap().contains("message_overhead_us"));
    // Points kept before the field read as 0 and write nothing new.
    let old: CoopPoint = serde_json::from_str(
        r#"{"system":"rr","nodes":4,"cache_bytes":1,"link_gbit":0.0,"load_model":"closed",
        "clients":16,"rate":0.0,"runs":1,"duration_s":8.0,"tps":1.0,"p50_ms":1.0,
        "p99_ms":1.0,"local_frac":1.0,"remote_frac":0.0,"miss_frac":0.0,
        "wasted_fetches":0,"peer_bytes":0,"peer_bytes_per_req":0.0,"cpu_us_per_req":1.0,
        "lb_cpu_us_per_req":0.0,"wrong_bodies":0,"failures":0,"offered_rps":0.0,
        "directory_refused":0}"#,
    )
    .unwrap();
    assert_eq!(old.message_overhead_us, 0);
    assert!(!serde_json::to_string(&old).unwrap().contains("overhead"));
}

#[test]
fn the_table_carries_throttling_and_host_cpu_only_when_recorded() {
    let mut p = point("press-tcp", 0.0, 1000.0);
    assert!(!table(std::slice::from_ref(&p)).contains("throttled:"));
    assert!(!table(std::slice::from_ref(&p)).contains("host CPU:"));
    p.throttled_period_frac = 0.25;
    p.throttled_ms_per_s = 12.5;
    p.host_busy_us_per_req = 110.0;
    p.host_busy_frac = 0.9;
    let t = table(&[p]);
    assert!(
        t.contains("throttled: press-tcp closed 16 clients: 25.0 % of the nodes' CFS periods, 12.50 ms/s per node"),
        "{t}"
    );
    assert!(
        t.contains("host CPU: press-tcp closed 16 clients: 110.0 us busy per request over all CPUs, 90 % of the host's CPUs busy"),
        "{t}"
    );
}

#[test]
fn a_points_failures_are_kept_by_kind_summed_over_its_runs_and_printed() {
    let failing = |timeouts: u64| CoopPoint {
        failures: timeouts,
        failure_kinds: farside_loadgen::FailureCounts {
            timeouts,
            ..Default::default()
        },
        ..point("press-tcp", 0.0, 100.0)
    };
    let c = CoopPoint::combine(&[failing(2), failing(1)]);
    assert_eq!((c.failures, c.failure_kinds.timeouts), (3, 3));
    let t = table(std::slice::from_ref(&c));
    assert!(
        t.contains("failures: ") && t.contains(": 3 timeouts\n"),
        "{t}"
    );
    // Kept as JSON only when there are any: older points read as before.
    let j = serde_json::to_string(&point("rr", 0.0, 1.0)).unwrap();
    assert!(!j.contains("failure_kinds"), "{j}");
    let back: CoopPoint = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back.failure_kinds.timeouts, 3);
}
