//! `farside lab attacks --quick` as tests: one quick run of the attack lab (root:
//! network namespaces, raw sockets, XDP), shared by one test per target, each
//! asserting on its attacks' results: every attack must fail (its effect not seen)
//! and cost the legitimate clients no connection and no request — one-sided memory's
//! replays, forgeries, made-up keys, a reader key's writes and spoofed group READs
//! (the authenticated envelope, the replay window, per-key rights), the region path's
//! symlinks and the proxy's metrics on its public port included.
//!
//! The daemons run from the `farside` binary built beside this test
//! (`cargo build -p farside` first); without it the tests are counted as skipped.

use std::path::PathBuf;
use std::sync::OnceLock;

use farside_lab::attacks::{AttackPoint, AttacksArgs};

/// The `farside` binary of this target directory (`target/debug/farside`).
fn farside_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("farside");
    bin.exists().then_some(bin)
}

/// The run's points, or why there are none (no root, no binary); run once.
fn results(test: &str) -> Option<&'static [AttackPoint]> {
    static RUN: OnceLock<Result<Vec<AttackPoint>, String>> = OnceLock::new();
    if !farside_testkit::root_or_skip(test) {
        return None;
    }
    let r = RUN.get_or_init(|| {
        let Some(bin) = farside_bin() else {
            return Err(
                "no farside binary beside the tests: `cargo build -p farside` first".into(),
            );
        };
        let out = std::env::temp_dir().join(format!("farside-lab-attacks-{}", std::process::id()));
        let args = AttacksArgs {
            out: out.clone(),
            sweep: farside_lab::fabric::flags::SweepFlags {
                quick: true,
                resume: None,
            },
            attacks: Vec::new(),
            farside_bin: Some(bin),
            flood_seconds: None,
            flood_pps: farside_lab::attacks::flood::FLOOD_PPS_DEFAULT,
        };
        let s = farside_lab::attacks::run(args).map_err(|e| format!("lab attacks: {e}"));
        let _ = std::fs::remove_dir_all(&out);
        s.map(|s| s.points)
    });
    match r {
        Ok(p) => Some(p.as_slice()),
        Err(e) if e.contains("no farside binary") => {
            farside_testkit::skip(test, e);
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn get<'a>(points: &'a [AttackPoint], name: &str) -> &'a AttackPoint {
    points
        .iter()
        .find(|p| p.attack == name)
        .unwrap_or_else(|| panic!("no result for {name}"))
}

// Legitimate connections (or requests) a quick window may lose without an attack
// being blamed: none. A CI run once lost one client request (1 of 1,645) in the first
// window after the baseline, with the attack refused at once: that window opened right
// after the capture burst (500 conn/s past the tier's capacity), whose leftovers were
// still being served (a quick run measured 110 connections queued and 156 busy at the
// back-ends and 14 migrations in flight at that moment). Windows now open only on a
// quiet tier (`Dc::settle`; the summary notes how the first one started), so what the
// burst or a previous window left is no longer counted against an attack.

/// The attack was tried, failed, and cost the legitimate clients nothing.
fn defended(points: &[AttackPoint], name: &str) {
    let p = get(points, name);
    assert!(p.tested, "{name} was not tried: {}", p.effect);
    assert!(!p.succeeded, "{name} succeeded: {}", p.effect);
    assert_eq!(
        p.lost_connections, 0,
        "{name}: legitimate connections lost: {p:?}"
    );
    assert_eq!(
        p.failed_requests, 0,
        "{name}: legitimate requests failed: {p:?}"
    );
}

#[test]
fn specd_refuses_forged_and_replayed_offers_slow_senders_and_huge_lengths() {
    let Some(p) = results("specd_refuses_forged_and_replayed_offers_slow_senders_and_huge_lengths")
    else {
        return;
    };
    for a in [
        "specd-offer-non-peer",
        "specd-offer-peer-address",
        "specd-offer-replay",
        "specd-slow-senders",
        "specd-huge-length",
    ] {
        defended(p, a);
    }
}

#[test]
fn frontend_keeps_flows_against_spoofed_and_replayed_moves_and_floods() {
    let Some(p) = results("frontend_keeps_flows_against_spoofed_and_replayed_moves_and_floods")
    else {
        return;
    };
    for a in [
        "fe-move-spoofed",
        "fe-move-replay",
        "fe-control-tcp",
        "fe-nonsyn-flood",
    ] {
        defended(p, a);
    }
}

#[test]
fn rmem_refuses_replayed_forged_and_unkeyed_requests_and_reader_writes() {
    let Some(p) = results("rmem_refuses_replayed_forged_and_unkeyed_requests_and_reader_writes")
    else {
        return;
    };
    for a in [
        "rmem-replay-cas",
        "rmem-replay-fadd",
        "rmem-forge-served",
        "rmem-fadd-counter",
        "rmem-huge-seq",
        "rmem-write-role",
        "rmem-cas-wanted-loop",
        "rmem-reader-writes",
        "rmem-group-read",
    ] {
        defended(p, a);
    }
    // Spoofed group READs: nothing is answered to the victim (no amplification).
    let g = get(p, "rmem-group-read");
    assert_eq!(g.bytes_answered, 0, "{}", g.effect);
}

#[test]
fn local_file_and_metrics_attacks_are_refused_and_no_daemon_died() {
    let Some(p) = results("local_file_and_metrics_attacks_are_refused_and_no_daemon_died") else {
        return;
    };
    // gatherd refuses another user's symlink at its region path.
    defended(p, "files-symlink-region");
    // /farside/metrics is off the proxy's public port.
    defended(p, "files-proxy-metrics");
    let alive = get(p, "daemons-alive");
    assert!(!alive.succeeded, "{}", alive.effect);
    let base = get(p, "baseline");
    assert!(
        base.lost_connections == 0 && base.failed_requests == 0,
        "the legitimate load alone must lose nothing: {base:?}"
    );
    assert!(base.served_requests > 0, "{base:?}");
}
