//! The point of `lab faults` ([`FaultRow`]: what the clients saw during one injected
//! fault), how repeats combine, and its report: the table, the targets and `faults.csv`.
//!
//! Files: `faults.csv`, `table.txt`.

use super::*;

/// What the clients saw during one fault's phase (a point of the shared runner).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FaultRow {
    pub fault: String,
    /// Requests started in the phase.
    pub started: u64,
    /// Responses with status < 500.
    pub answered: u64,
    /// 503 responses (admission or queue refusals).
    pub refused_503: u64,
    /// Connect errors + I/O errors + malformed + other 5xx.
    pub failed: u64,
    pub failed_connect: u64,
    pub failed_io: u64,
    pub failed_malformed: u64,
    pub failed_5xx: u64,
    /// No response and no error within the request timeout.
    pub hung: u64,
    /// In flight when the phase's load ended (neither answered nor hung).
    pub inflight_at_end: u64,
    /// From the repair to the first fully fresh view, ms; `None`: not within
    /// [`FRESH_WAIT_MAX`].
    pub time_to_fresh_ms: Option<f64>,
    /// Whether the proxy's view was stale just before the repair (the fault reached the
    /// view; expected for `gatherd-restart` only).
    pub stale_at_repair: bool,
    /// How long the repair took, ms: for `gatherd-restart`, from starting the new
    /// gatherd until it serves (its metrics listener answers; the XDP attach takes
    /// most of it in netns). `time_to_fresh_ms` counts from its end.
    pub repair_ms: Option<f64>,
    /// From the repair command (for `gatherd-restart`: the new gatherd's spawn) to the
    /// first fresh view, ms, polled while the repair runs (a restarted gatherd serves a
    /// fresh region before its start-up ends); `None` where the repair takes no time
    /// (then it equals `time_to_fresh_ms`) or no fresh view came.
    pub time_to_fresh_from_repair_cmd_ms: Option<f64>,
    /// Runs combined in this row (counts summed, times the worst run's).
    #[serde(default = "one")]
    pub runs: u64,
}

pub(super) fn one() -> u64 {
    1
}

impl FaultRow {
    pub(super) fn new(
        fault: &str,
        s: &Summary,
        (fresh, stale_at_repair, repair, cmd): Repair,
    ) -> FaultRow {
        let k = &s.failure_kinds;
        FaultRow {
            fault: fault.into(),
            started: s.started,
            answered: s.served,
            refused_503: s.dropped_503,
            failed: k.connect_errors + k.io_errors + k.malformed + k.status_5xx,
            failed_connect: k.connect_errors,
            failed_io: k.io_errors,
            failed_malformed: k.malformed,
            failed_5xx: k.status_5xx,
            hung: k.timeouts,
            inflight_at_end: s.inflight_at_end,
            time_to_fresh_ms: fresh.map(|d| d.as_secs_f64() * 1e3),
            stale_at_repair,
            repair_ms: repair.map(|d| d.as_secs_f64() * 1e3),
            time_to_fresh_from_repair_cmd_ms: cmd.map(|d| d.as_secs_f64() * 1e3),
            runs: 1,
        }
    }

    /// Repeats of one fault: counts summed; times are the worst run's (a run that never
    /// became fresh makes the combined row `None`: the target is per run).
    pub fn combine(runs: &[FaultRow]) -> FaultRow {
        let Some(first) = runs.first() else {
            return FaultRow::new("", &Summary::default(), (None, false, None, None));
        };
        let sum = |f: fn(&FaultRow) -> u64| runs.iter().map(f).sum::<u64>();
        let worst = |f: fn(&FaultRow) -> Option<f64>| {
            runs.iter()
                .map(f)
                .try_fold(0.0f64, |m, v| v.map(|v| m.max(v)))
        };
        let any_worst = |f: fn(&FaultRow) -> Option<f64>| {
            runs.iter()
                .filter_map(f)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        };
        FaultRow {
            fault: first.fault.clone(),
            started: sum(|r| r.started),
            answered: sum(|r| r.answered),
            refused_503: sum(|r| r.refused_503),
            failed: sum(|r| r.failed),
            failed_connect: sum(|r| r.failed_connect),
            failed_io: sum(|r| r.failed_io),
            failed_malformed: sum(|r| r.failed_malformed),
            failed_5xx: sum(|r| r.failed_5xx),
            hung: sum(|r| r.hung),
            inflight_at_end: sum(|r| r.inflight_at_end),
            time_to_fresh_ms: worst(|r| r.time_to_fresh_ms),
            stale_at_repair: runs.iter().any(|r| r.stale_at_repair),
            repair_ms: any_worst(|r| r.repair_ms),
            time_to_fresh_from_repair_cmd_ms: any_worst(|r| r.time_to_fresh_from_repair_cmd_ms),
            runs: runs.iter().map(|r| r.runs).sum(),
        }
    }
}

/// The faults table (`table.txt`, `farside lab report`).
/// `faults.csv`: one row per fault.
pub fn csv(rows: &[&FaultRow]) -> io::Result<String> {
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    crate::report::csv_text(
        &[
            "fault",
            "runs",
            "started",
            "answered",
            "refused_503",
            "failed",
            "failed_connect",
            "failed_io",
            "failed_malformed",
            "failed_5xx",
            "hung",
            "inflight_at_end",
            "time_to_fresh_ms",
            "stale_at_repair",
            "repair_ms",
            "time_to_fresh_from_repair_cmd_ms",
        ],
        rows.iter().map(|r| {
            vec![
                r.fault.clone(),
                r.runs.to_string(),
                r.started.to_string(),
                r.answered.to_string(),
                r.refused_503.to_string(),
                r.failed.to_string(),
                r.failed_connect.to_string(),
                r.failed_io.to_string(),
                r.failed_malformed.to_string(),
                r.failed_5xx.to_string(),
                r.hung.to_string(),
                r.inflight_at_end.to_string(),
                opt(r.time_to_fresh_ms),
                r.stale_at_repair.to_string(),
                opt(r.repair_ms),
                opt(r.time_to_fresh_from_repair_cmd_ms),
            ]
        }),
    )
}

/// The fault table.
pub fn table(rows: &[&FaultRow]) -> String {
    use crate::table::{Align, Table};
    let mut t = Table::new().col("", "fault", Align::Left, 16).cols(
        " ",
        Align::Right,
        [
            ("started", 8),
            ("answered", 9),
            ("refused", 8),
            ("failed", 7),
            ("hung", 5),
            ("inflight", 9),
            ("time_to_fresh_ms", 16),
            ("repair_ms", 9),
            ("fresh_from_cmd_ms", 16),
        ],
    );
    for r in rows {
        let fresh = r
            .time_to_fresh_ms
            .map_or("never".to_string(), |v| format!("{v:.0}"));
        let repair = r.repair_ms.map_or("-".to_string(), |v| format!("{v:.0}"));
        let cmd = r
            .time_to_fresh_from_repair_cmd_ms
            .map_or("-".to_string(), |v| format!("{v:.0}"));
        t.row(vec![
            r.fault.to_string(),
            r.started.to_string(),
            r.answered.to_string(),
            r.refused_503.to_string(),
            r.failed.to_string(),
            r.hung.to_string(),
            r.inflight_at_end.to_string(),
            fresh,
            repair,
            cmd,
        ]);
    }
    t.render()
}

/// Whether `rows` meet the targets: no hung request in any fault, and after the
/// gatherd restart a fresh view within `fresh_bound_ms` of the restart command.
pub fn targets_met(rows: &[&FaultRow], fresh_bound_ms: f64) -> bool {
    rows.iter().all(|r| r.hung == 0)
        && rows
            .iter()
            .filter(|r| r.fault == "gatherd-restart")
            .all(|r| {
                r.time_to_fresh_from_repair_cmd_ms
                    .is_some_and(|v| v <= fresh_bound_ms)
            })
}

impl crate::experiment::LabPoint for FaultRow {
    type Extra = crate::experiment::NoExtra;

    fn take_extra(&mut self) -> crate::experiment::NoExtra {
        crate::experiment::NoExtra {}
    }

    fn put_extra(&mut self, _: crate::experiment::NoExtra) {}

    fn combine(runs: &[FaultRow]) -> FaultRow {
        FaultRow::combine(runs)
    }

    fn progress_line(&self) -> String {
        format!(
            "answered={} refused={} failed={} hung={} fresh after {}",
            self.answered,
            self.refused_503,
            self.failed,
            self.hung,
            self.time_to_fresh_ms
                .map_or("never".to_string(), |v| format!("{v:.0} ms"))
        )
    }
}
