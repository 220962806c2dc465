//! Peaks users would accept: every experiment that reports a peak throughput (admission's
//! goodput, speculative admission's conn/s, reconfiguration's TPS) reports it twice, the
//! raw peak over its measured points and the peak over the points whose failures stay
//! within a stated bound ([`FAILURE_BOUND`]).
//!
//! A raw peak can sit at a load where many users got nothing: a throughput reached while
//! 5 % of the connections time out is not one an operator would run at. The rule:
//!
//! - a point's *failed fraction* is its failed or timed-out attempts over its attempts
//!   (what counts as failed is the experiment's: connections refused, reset or timed
//!   out; requests that failed or timed out). An explicit, immediate refusal by
//!   admission control (a 503 answered at once) is a clean answer, not a failure: it is
//!   the mechanism under test, and counted apart (drop %);
//! - the *raw peak* is the largest value over all points;
//! - the *bounded peak* is the largest value over the points whose failed fraction is at
//!   most the bound (a point without attempts has failed nothing);
//! - both name the point they come from; the bounded peak is absent (`-`) when every point
//!   failed more than the bound.
//!
//! Pure functions of the points, so a kept run re-renders its peaks exactly.

/// The failure bound of the bounded peak: at most 1 % of the attempts failed or timed
/// out. One user in a hundred getting nothing is about what a web service's availability
/// target tolerates at its busiest; a tighter bound would rest on single failures in a
/// short point (a 6 s quick point at 100/s has 600 attempts), a looser one accepts loads
/// no operator would run at.
pub const FAILURE_BOUND: f64 = 0.01;

/// The bound as the reports print it: `≤ 1% failed`.
pub fn bound_label(bound: f64) -> String {
    format!("≤ {}% failed", short(bound * 100.0))
}

/// `v` with at most one decimal and no trailing zero (`1`, `0.5`, `4.1`).
fn short(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_string)
}

/// One peak: the value and the index of the point it comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peak {
    /// Index into the points given to [`peaks`].
    pub index: usize,
    /// The point's value.
    pub value: f64,
    /// The point's failed fraction (0..=1).
    pub failed: f64,
}

/// The raw peak and the peak under a failure bound of a set of points.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peaks {
    /// The largest value over all points; `None` without points.
    pub raw: Option<Peak>,
    /// The largest value over the points failing at most `bound`; `None` when none does.
    pub bounded: Option<Peak>,
    /// The failure bound applied (a fraction, 0..=1).
    pub bound: f64,
}

/// Failed fraction of a point with `failed` failed or timed-out attempts out of
/// `attempts` (0 without attempts).
pub fn failed_fraction(failed: u64, attempts: u64) -> f64 {
    if attempts == 0 {
        0.0
    } else {
        failed as f64 / attempts as f64
    }
}

/// The raw and bounded peaks of `points` (see the module docs): `value` is the
/// throughput, `failed` the failed fraction of a point. Ties go to the first point.
pub fn peaks<T>(
    points: &[T],
    value: impl Fn(&T) -> f64,
    failed: impl Fn(&T) -> f64,
    bound: f64,
) -> Peaks {
    let mut raw: Option<Peak> = None;
    let mut bounded: Option<Peak> = None;
    for (index, p) in points.iter().enumerate() {
        let pk = Peak {
            index,
            value: value(p),
            failed: failed(p),
        };
        if raw.is_none_or(|r| pk.value > r.value) {
            raw = Some(pk);
        }
        if pk.failed <= bound && bounded.is_none_or(|b| pk.value > b.value) {
            bounded = Some(pk);
        }
    }
    Peaks {
        raw,
        bounded,
        bound,
    }
}

impl Peaks {
    /// The text form used by every report: `812.3 (at X, 4.1% failed); ≤ 1% failed:
    /// 640.0 (at Y)`, where `at` names a point by its index, `digits` the value's decimals.
    pub fn text(&self, digits: usize, at: impl Fn(usize) -> String) -> String {
        let Some(raw) = self.raw else {
            return "-".to_string();
        };
        let bounded = match self.bounded {
            Some(b) => format!("{:.digits$} (at {})", b.value, at(b.index)),
            None => "- (every point failed more)".to_string(),
        };
        format!(
            "{:.digits$} (at {}, {}% failed); {}: {bounded}",
            raw.value,
            at(raw.index),
            short(raw.failed * 100.0),
            bound_label(self.bound)
        )
    }
}

/// One measured point for [`grouped_lines`]: its group (panel) and system, where it
/// was measured (as the report names a load: `400 clients`, `759/s`), its value and its
/// failed fraction.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The panel (trace, scenario, load model) the point belongs to.
    pub panel: String,
    /// The system measured.
    pub system: String,
    /// The load, as the line names it.
    pub at: String,
    /// The throughput.
    pub value: f64,
    /// Failed fraction (0..=1).
    pub failed: f64,
}

/// One line per (panel, system), in first-seen order: `  panel  system  <Peaks::text>`,
/// panels and systems padded to their longest name.
pub fn grouped_lines(points: &[Measured], bound: f64, digits: usize) -> String {
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for p in points {
        if !groups.contains(&(p.panel.as_str(), p.system.as_str())) {
            groups.push((&p.panel, &p.system));
        }
    }
    let wp = groups.iter().map(|g| g.0.len()).max().unwrap_or(0);
    let ws = groups.iter().map(|g| g.1.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (panel, system) in groups {
        let pts: Vec<&Measured> = points
            .iter()
            .filter(|p| p.panel == panel && p.system == system)
            .collect();
        let pk = peaks(&pts, |p| p.value, |p| p.failed, bound);
        out.push_str(&format!(
            "  {panel:<wp$}  {system:<ws$}  {}\n",
            pk.text(digits, |i| pts[i].at.clone())
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (throughput, failed, attempts)
    fn pts() -> Vec<(f64, u64, u64)> {
        vec![
            (100.0, 0, 1000),
            (180.0, 5, 1000),  // 0.5 %: acceptable
            (240.0, 30, 1000), // 3 %: the raw peak, not acceptable
            (200.0, 10, 1000), // exactly 1 %: acceptable, the bounded peak
        ]
    }

    #[test]
    fn the_bounded_peak_skips_points_that_fail_more_than_the_bound() {
        let p = peaks(
            &pts(),
            |p| p.0,
            |p| failed_fraction(p.1, p.2),
            FAILURE_BOUND,
        );
        assert_eq!(p.raw.map(|r| (r.index, r.value)), Some((2, 240.0)));
        assert_eq!(p.bounded.map(|b| (b.index, b.value)), Some((3, 200.0)));
        let t = p.text(1, |i| format!("#{i}"));
        assert_eq!(t, "240.0 (at #2, 3% failed); ≤ 1% failed: 200.0 (at #3)");
    }

    #[test]
    fn without_an_acceptable_point_the_bounded_peak_is_absent() {
        let bad = vec![(50.0, 20u64, 100u64), (60.0, 50, 100)];
        let p = peaks(&bad, |p| p.0, |p| failed_fraction(p.1, p.2), FAILURE_BOUND);
        assert_eq!(p.raw.map(|r| r.index), Some(1));
        assert!(p.bounded.is_none());
        assert!(p
            .text(0, |i| i.to_string())
            .ends_with("≤ 1% failed: - (every point failed more)"));
        // No points: no peak at all.
        let none: Vec<(f64, u64, u64)> = Vec::new();
        let p = peaks(&none, |p| p.0, |_| 0.0, FAILURE_BOUND);
        assert_eq!((p.raw, p.bounded), (None, None));
        assert_eq!(p.text(1, |_| String::new()), "-");
    }

    #[test]
    fn grouped_lines_give_one_peak_line_per_panel_and_system() {
        let m = |panel: &str, system: &str, at: &str, value: f64, failed: f64| Measured {
            panel: panel.into(),
            system: system.into(),
            at: at.into(),
            value,
            failed,
        };
        let pts = [
            m("open", "a", "1/s", 10.0, 0.0),
            m("open", "bb", "1/s", 12.0, 0.0),
            m("open", "a", "2/s", 20.0, 0.5),
            m("closed", "a", "4 clients", 5.0, 0.0),
        ];
        assert_eq!(
            grouped_lines(&pts, FAILURE_BOUND, 1),
            "  open    a   20.0 (at 2/s, 50% failed); ≤ 1% failed: 10.0 (at 1/s)\n\
             \x20 open    bb  12.0 (at 1/s, 0% failed); ≤ 1% failed: 12.0 (at 1/s)\n\
             \x20 closed  a   5.0 (at 4 clients, 0% failed); ≤ 1% failed: 5.0 (at 4 clients)\n"
        );
    }

    #[test]
    fn a_point_without_attempts_failed_nothing() {
        assert_eq!(failed_fraction(0, 0), 0.0);
        assert_eq!(failed_fraction(1, 4), 0.25);
        assert_eq!(bound_label(0.01), "≤ 1% failed");
        assert_eq!(bound_label(0.005), "≤ 0.5% failed");
    }
}
