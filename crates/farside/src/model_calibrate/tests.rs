//! Tests of `model_calibrate`.

use super::clocks::process_cpu_ns;
use super::*;

#[test]
fn the_fit_recovers_a_line_and_never_goes_negative() {
    let (a, b) = fit(&[(0.5, 110.0), (4.0, 145.0), (16.0, 265.0), (64.0, 745.0)]);
    assert!(
        (a - 105.0).abs() < 1e-6 && (b - 10.0).abs() < 1e-6,
        "{a} {b}"
    );
    let (a, b) = fit(&[(1.0, 10.0), (2.0, 5.0)]);
    assert_eq!((a, b), (7.5, 0.0));
}

#[test]
fn the_synthetic_trace_is_sessions_of_the_lab_length_over_the_set() {
    let set: Vec<String> = (0..3).map(|i| format!("/o/512-0-{i}")).collect();
    let text = session_trace(&set, 512, 2);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(
        text.lines().next(),
        Some("timestamp,client_id,url,status,size")
    );
    assert_eq!(rows.len(), 2 * SESSION_REQUESTS);
    // Each trace client (session) asks for SESSION_REQUESTS objects, cycling the set.
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[1], (i / SESSION_REQUESTS).to_string());
        assert_eq!(r[2], set[i % 3]);
        assert_eq!((r[3], r[4]), ("200", "512"));
    }
}

#[test]
fn proc_stat_busy_is_every_cpu_tick_but_idle_and_iowait() {
    let text = "cpu  100 20 300 5000 70 8 90 11 40 2\n\
                cpu0 50 10 150 2500 35 4 45 5 20 1\n\
                intr 123 0 0\nctxt 999\n";
    // user + nice + system + irq + softirq + steal; guest (40, 2) is inside user/nice.
    assert_eq!(
        parse_proc_stat(text),
        Some(HostTicks {
            busy: 100 + 20 + 300 + 8 + 90 + 11,
            softirq: 90,
            steal: 11,
        })
    );
    // Older kernels end after softirq or steal.
    let short = parse_proc_stat("cpu  1 2 3 4 5 6 7\n").unwrap();
    assert_eq!((short.busy, short.steal), (1 + 2 + 3 + 6 + 7, 0));
    // Only the all-CPU line counts; a missing or malformed one is no figure.
    assert_eq!(parse_proc_stat("cpu0 1 2 3 4 5 6 7 8\n"), None);
    assert_eq!(parse_proc_stat("cpu  1 2 x 4 5 6 7 8\n"), None);
    assert_eq!(parse_proc_stat("cpu  1 2 3\n"), None);
    // This host's own file parses, and its busy time holds its softirq and steal.
    if let Ok(t) = std::fs::read_to_string("/proc/stat") {
        let h = parse_proc_stat(&t).expect("this host's /proc/stat");
        assert!(h.busy >= h.softirq + h.steal);
    }
}

#[test]
fn utc_dates_are_civil() {
    let s = utc_now();
    assert_eq!(s.len(), 20);
    assert!(s.starts_with("20") && s.ends_with('Z'));
}

#[test]
fn every_measured_phase_runs_right_after_its_own_base_phase() {
    let order = interleaved(3, 4);
    assert_eq!(order.len(), 3 * 4 * 2);
    for pair in order.chunks(2) {
        // The base (local) phase, then the measured one of the same repeat and size.
        assert_eq!((pair[0].0, pair[0].1), (pair[1].0, pair[1].1));
        assert!(!pair[0].2 && pair[1].2);
    }
    // Repeat by repeat: a repeat's every size before the next repeat.
    let reps: Vec<usize> = order.iter().map(|o| o.0).collect();
    assert!(reps.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(order[0..8].iter().filter(|o| o.2).count(), 4);
    assert!(interleaved(0, 4).is_empty());
}

#[test]
fn a_cost_over_its_base_is_the_difference_never_below_zero() {
    assert_eq!(over_base(75.0, 30.0), 45.0);
    assert_eq!(over_base(30.0, 31.0), 0.0);
    // A drift that raises both terms of a pair leaves the difference: the reason the
    // base phase runs right before its measured phase.
    assert_eq!(over_base(75.0 * 1.2, 30.0 * 1.2), 45.0 * 1.2);
}

#[test]
fn the_cpu_clocks_count_this_threads_work() {
    let (p0, t0) = (process_cpu_ns(), thread_cpu_ns());
    let mut x = 0u64;
    for i in 0..2_000_000u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
    }
    std::hint::black_box(x);
    assert!(thread_cpu_ns() > t0);
    assert!(process_cpu_ns() > p0);
}
