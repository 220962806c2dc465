//! Point isolation in `farside lab admission`: a heavy point (an open loop well past the
//! tier's capacity, which leaves the back-ends' accept queues full) followed by a light
//! one on the same tier. The light point must start empty (recorded in `points.jsonl`)
//! and get what the light load alone gets: served ≈ offered, nothing inherited.

use std::path::Path;

mod common;
use common::Dir;

/// The records of `points.jsonl`, in run order.
fn records(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("points.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_light_point_after_an_overload_starts_empty_and_serves_its_offer() {
    let dir = Dir::new("isolation");
    let out = dir.0.join("out");
    // One tier (no-ac: nothing sheds the overload), the open loop at 4x then 0.2x the
    // capacity, 1.5 s points after 0.3 s of warm-up. 10 ms of back-end CPU per request
    // (capacity ~95/s on one back-end CPU): the light point's ~19/s needs a fifth of a
    // CPU, which even a busy test host gives, and the heavy one leaves seconds of queued
    // work.
    let (_, stderr) = common::run_lab(
        &[
            "admission",
            "--quick",
            "--systems",
            "no-ac",
            "--traces",
            "single",
            "--load",
            "open",
            "--rates",
            "4,0.2",
            "--duration-s",
            "1.5",
            "--warmup-s",
            "0.3",
            "--backend-cpu-us",
            "10000",
        ],
        &out,
    );
    let recs = records(&out);
    assert_eq!(recs.len(), 2, "{stderr}");
    let (heavy, light) = (&recs[0], &recs[1]);
    assert_eq!(heavy["point"]["rate_x"], 4.0);
    assert_eq!(light["point"]["rate_x"], 0.2);
    for r in &recs {
        let s = &r["start"];
        assert_eq!(s["started_empty"], true, "{s}\n{stderr}");
        assert_eq!(
            (&s["start_backlog"], &s["start_inflight"]),
            (&0.into(), &0.into()),
            "{s}"
        );
        assert!(s["settle_ms"].as_f64().unwrap() >= 0.0, "{s}");
    }
    // The check saw what the overload left: requests still queued or in flight when it
    // ended, which the tier had to drain (or be restarted) before the light point.
    // More than the tier serves in the light point's whole run: inherited, that queue
    // would have left the light point (nearly) nothing.
    let left = &light["start"];
    let inherited =
        left["left_backlog"].as_u64().unwrap() + left["left_inflight"].as_u64().unwrap();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let capacity = summary["params"]["capacity_rps"].as_f64().unwrap();
    assert!(
        inherited as f64 > 1.8 * capacity,
        "the overload left {inherited} requests, less than the light point's run serves \
         ({capacity}/s x 1.8 s): {left}"
    );
    // The heavy point was an overload: it could not serve what was offered.
    let hp = &heavy["point"];
    assert!(
        hp["goodput"].as_f64().unwrap() < 0.8 * hp["offered_rps"].as_f64().unwrap(),
        "{hp}"
    );
    // The light point got the light load's result: most requests it started in the
    // window were served within it (the rest are in flight at its end), none failed or
    // was refused. An inherited queue would have served ~none.
    let lp = &light["point"];
    let (served, offered) = (
        lp["goodput"].as_f64().unwrap(),
        lp["offered_rps"].as_f64().unwrap(),
    );
    assert!(offered > 0.0, "{lp}");
    assert!(
        served >= 0.75 * offered,
        "served {served}/s of {offered}/s: {lp}"
    );
    assert_eq!(
        (&lp["dropped"], &lp["failures"]),
        (&0.into(), &0.into()),
        "{lp}"
    );
    // The progress lines say how each point started.
    assert!(stderr.contains("start empty after"), "{stderr}");
}
