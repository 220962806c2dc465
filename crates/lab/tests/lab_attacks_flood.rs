//! `farside lab attacks --flood-seconds 20 --quick` as a test (root: network
//! namespaces, raw sockets, XDP): a short flood during a speculative run. Spoofed
//! non-SYN packets past the flow table's size at the front-end, and forged, garbage,
//! replayed and slow connections at specd's migration port, must evict no live flow,
//! lose no migration and cost the legitimate clients no connection, while specd keeps
//! migrating and answers the attacker nothing.
//!
//! The daemons run from the `farside` binary built beside this test
//! (`cargo build -p farside` first); without it the test is counted as skipped.

use std::path::PathBuf;

use farside_lab::attacks::flood::{FloodArgs, FloodPoint};

/// The flood's length (s): the table's 65,536 entries are named within its first
/// 4 s at the default rate.
const FLOOD_S: f64 = 20.0;
/// The front-end's flow table (`farside_frontend::FLOWS_MAX`).
const FLOWS_MAX: u64 = 65_536;

fn farside_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("farside");
    bin.exists().then_some(bin)
}

fn get<'a>(points: &'a [FloodPoint], phase: &str) -> &'a FloodPoint {
    points
        .iter()
        .find(|p| p.phase == phase)
        .unwrap_or_else(|| panic!("no {phase} phase"))
}

#[test]
fn a_flood_at_the_flow_table_and_specd_evicts_no_live_flow_and_loses_no_migration() {
    let test = "a_flood_at_the_flow_table_and_specd_evicts_no_live_flow_and_loses_no_migration";
    if !farside_testkit::root_or_skip(test) {
        return;
    }
    let Some(bin) = farside_bin() else {
        farside_testkit::skip(
            test,
            "no farside binary beside the tests: `cargo build -p farside` first",
        );
        return;
    };
    let out = std::env::temp_dir().join(format!("farside-lab-flood-{}", std::process::id()));
    let args = FloodArgs {
        out: out.clone(),
        sweep: farside_lab::fabric::flags::SweepFlags {
            quick: true,
            resume: None,
        },
        farside_bin: Some(bin),
        seconds: FLOOD_S,
        pps: farside_lab::attacks::flood::FLOOD_PPS_DEFAULT,
    };
    let s = farside_lab::attacks::flood::run(args);
    let _ = std::fs::remove_dir_all(&out);
    let s = s.expect("lab attacks --flood-seconds");
    let reference = get(&s.points, "reference");
    let f = get(&s.points, "flood");
    eprintln!("reference: {}\nflood: {}", reference.effect, f.effect);
    // The load is a speculative run: specd migrates before and during the flood.
    assert!(reference.migrations_completed > 0, "{reference:?}");
    assert!(
        f.migrations_completed > 0,
        "no migration under the flood: {f:?}"
    );
    // The attackers worked: more spoofed flows than the table holds, specd's port
    // hammered, every second sampled.
    assert!(f.nonsyn_sent > FLOWS_MAX, "{}", f.effect);
    assert!(
        f.specd_attack_conns > 0 && f.live_flows_tracked > 0,
        "{f:?}"
    );
    assert!(f.series.len() as f64 >= FLOOD_S - 1.0, "{}", f.series.len());
    // And had no effect.
    assert_eq!(f.live_flows_evicted, 0, "{}", f.effect);
    assert_eq!(f.migrations_lost, 0, "{}", f.effect);
    assert_eq!(f.specd_answered_bytes, 0, "{}", f.effect);
    assert_eq!(f.lost_connections, 0, "{}", f.effect);
    assert_eq!(f.failed_requests, 0, "{}", f.effect);
    assert!(!f.succeeded, "{}", f.effect);
}
