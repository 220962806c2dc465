//! Tests of `model_calibrate`.

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
