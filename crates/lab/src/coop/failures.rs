//! A point's failed requests by kind: the load generator's counts (timeouts, connection
//! errors, I/O errors, malformed answers, 5xx with the nodes' 503s, shed arrivals), so
//! a run's few failures say what they were. Wrong bodies are counted apart
//! (`wrong_bodies`), never among these.

use farside_loadgen::FailureCounts;

/// The kinds as a point keeps them: the load generator's, wrong bodies apart, the
/// requests a node refused with a 503 (its disk queue at its bound, the load generator's
/// `dropped_503`) among the 5xx; they sum to the point's `failures`.
pub(super) fn of_run(kinds: &FailureCounts, dropped_503: u64) -> FailureCounts {
    FailureCounts {
        status_5xx: kinds.status_5xx + dropped_503,
        wrong_bodies: 0,
        ..kinds.clone()
    }
}

/// The kinds of several runs of a point, summed.
pub(super) fn sum<'a>(runs: impl Iterator<Item = &'a FailureCounts>) -> FailureCounts {
    let mut out = FailureCounts::default();
    for k in runs {
        out.add(k);
    }
    out
}

/// Whether no failure of any kind was counted (then a point does not record them).
pub(super) fn none(k: &FailureCounts) -> bool {
    total(k) == 0
}

fn total(k: &FailureCounts) -> u64 {
    k.timeouts
        + k.connect_errors
        + k.connect_timeouts
        + k.io_errors
        + k.malformed
        + k.status_5xx
        + k.overflow
        + k.wrong_bodies
}

/// `failures: <label>: 2 timeouts, 1 I/O error` for each point that failed any request
/// (none for a run kept before the kinds were recorded).
pub(super) fn lines<'a>(points: impl Iterator<Item = (String, &'a FailureCounts)>) -> String {
    let mut out = String::new();
    for (label, k) in points.filter(|(_, k)| !none(k)) {
        let kinds: Vec<String> = [
            (k.timeouts, "timeout"),
            (k.connect_errors, "connection error"),
            (k.connect_timeouts, "connect timeout"),
            (k.io_errors, "I/O error"),
            (k.malformed, "malformed answer"),
            (k.status_5xx, "5xx"),
            (k.overflow, "shed arrival"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| {
            format!(
                "{n} {what}{}",
                if *n == 1 || *what == "5xx" { "" } else { "s" }
            )
        })
        .collect();
        out += &format!("failures: {label}: {}\n", kinds.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kinds_sum_to_the_failures_with_503s_among_the_5xx_and_wrong_bodies_apart() {
        let lg = FailureCounts {
            timeouts: 2,
            io_errors: 1,
            status_5xx: 1,
            wrong_bodies: 3,
            ..FailureCounts::default()
        };
        let k = of_run(&lg, 4);
        assert_eq!((k.status_5xx, k.wrong_bodies, total(&k)), (5, 0, 8));
        let both = sum([k.clone(), k].iter());
        assert_eq!(total(&both), 16);
        assert_eq!(
            lines([("rr n4".to_string(), &both)].into_iter()),
            "failures: rr n4: 4 timeouts, 2 I/O errors, 10 5xx\n"
        );
        // A point without failures (or kept before they were recorded) prints nothing.
        assert!(none(&FailureCounts::default()));
        assert_eq!(
            lines([("x".to_string(), &FailureCounts::default())].into_iter()),
            ""
        );
    }
}
