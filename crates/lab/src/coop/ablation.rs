//! The per-message processor overhead ablation of `lab coop` (`--message-overhead-us`):
//! each configuration's throughput, CPU and peer-fetch time against the µs every peer
//! message costs, and the slope (throughput lost per µs of overhead, a least-squares
//! line over the configuration's overheads).
//!
//! Nothing is rendered for configurations measured at one overhead, so runs kept
//! before the ablation re-render as they were. A leaf: the experiment hands it its
//! points as [`OverheadPoint`]s.

/// One point as the ablation reads it (the experiment fills it from its own point).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OverheadPoint {
    /// Everything the point is but its overhead (system, nodes, load, link), as printed:
    /// points with the same `config` form one line of the ablation.
    pub config: String,
    pub overhead_us: u64,
    pub tps: f64,
    pub p99_ms: f64,
    pub cpu_us_per_req: f64,
    pub peer_fetch_us: f64,
    /// Peer messages that paid the overhead per served request.
    pub spins_per_req: f64,
}

/// The configurations of the ablation: points with one `config`, in order of first
/// appearance, each sorted by overhead; only those measured at two overheads or more,
/// one of them above 0.
fn groups(points: &[OverheadPoint]) -> Vec<Vec<&OverheadPoint>> {
    let mut out: Vec<Vec<&OverheadPoint>> = Vec::new();
    for p in points {
        match out.iter_mut().find(|g| g[0].config == p.config) {
            Some(g) => g.push(p),
            None => out.push(vec![p]),
        }
    }
    for g in &mut out {
        g.sort_by_key(|p| p.overhead_us);
    }
    out.retain(|g| g.len() > 1 && g.iter().any(|p| p.overhead_us > 0));
    out
}

/// The least-squares slope of `y` against `x` (0 if the x are all equal).
pub fn slope(xy: &[(f64, f64)]) -> f64 {
    let n = xy.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mx, my) = (
        xy.iter().map(|p| p.0).sum::<f64>() / n,
        xy.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = xy.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return 0.0;
    }
    xy.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / sxx
}

/// `overhead:` lines under the table, one block per configuration (nothing without
/// the ablation).
pub fn overhead_lines(points: &[OverheadPoint]) -> String {
    let mut out = String::new();
    for g in groups(points) {
        let join = |f: &dyn Fn(&OverheadPoint) -> String| {
            g.iter().map(|p| f(p)).collect::<Vec<_>>().join(" / ")
        };
        let first = g[0];
        let s = slope(
            &g.iter()
                .map(|p| (p.overhead_us as f64, p.tps))
                .collect::<Vec<_>>(),
        );
        let base = if first.overhead_us == 0 {
            first.tps
        } else {
            0.0
        };
        out += &format!(
            "overhead: {}: {} us per message\n",
            first.config,
            join(&|p| p.overhead_us.to_string())
        );
        out += &format!(
            "  tps {}; slope {:+.1} tps per us{}\n",
            join(&|p| format!("{:.0}", p.tps)),
            s,
            if base > 0.0 {
                format!(" ({:+.2} % of the 0 us tps per us)", s / base * 100.0)
            } else {
                String::new()
            }
        );
        out += &format!(
            "  p99 ms {}; CPU us/req {}; peer fetch us {}; spins/req {}\n",
            join(&|p| format!("{:.2}", p.p99_ms)),
            join(&|p| format!("{:.0}", p.cpu_us_per_req)),
            join(&|p| format!("{:.0}", p.peer_fetch_us)),
            join(&|p| format!("{:.2}", p.spins_per_req))
        );
    }
    out
}

/// `overhead.svg`: throughput against the per-message overhead, one line per
/// configuration (none without the ablation).
pub fn overhead_figure(points: &[OverheadPoint]) -> Vec<crate::experiment::Figure> {
    let groups = groups(points);
    if groups.is_empty() {
        return Vec::new();
    }
    let mut chart = crate::svg::Chart::new(
        "Per-message processor overhead",
        "µs of CPU per peer message",
        "served requests/s",
    );
    for g in &groups {
        chart = chart.series(
            &g[0].config,
            g.iter().map(|p| (p.overhead_us as f64, p.tps)).collect(),
        );
    }
    vec![(
        "overhead.svg".to_string(),
        "Throughput against the CPU each peer message costs (the nodes' \
         --coop-message-overhead-us), per system"
            .to_string(),
        chart.to_svg(),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(system: &str, us: u64, tps: f64) -> OverheadPoint {
        OverheadPoint {
            config: format!("{system} 4 nodes closed 16 clients link -"),
            overhead_us: us,
            tps,
            spins_per_req: us as f64 / 64.0,
            ..OverheadPoint::default()
        }
    }

    #[test]
    fn the_overhead_lines_give_each_system_its_slope() {
        let pts = [
            point("press-tcp", 0, 1000.0),
            point("rr", 0, 500.0),
            point("press-tcp", 10, 900.0),
            point("rr", 10, 500.0),
            point("press-tcp", 50, 500.0),
            point("rr", 50, 500.0),
        ];
        let t = overhead_lines(&pts);
        assert!(
            t.contains("overhead: press-tcp 4 nodes closed 16 clients link -: 0 / 10 / 50 us"),
            "{t}"
        );
        // tps 1000, 900, 500 at 0, 10, 50: the least-squares slope is -10.0 per µs.
        assert!(
            t.contains("tps 1000 / 900 / 500; slope -10.0 tps per us (-1.00 % of"),
            "{t}"
        );
        assert!(t.contains("slope +0.0 tps per us"), "rr flat: {t}");
        assert!(t.contains("spins/req 0.00 / 0.16 / 0.78"), "{t}");
        assert_eq!(overhead_figure(&pts).len(), 1);
        // No overhead anywhere: nothing rendered (earlier runs unchanged).
        let none = [point("press-tcp", 0, 1.0), point("rr", 0, 1.0)];
        assert_eq!(overhead_lines(&none), "");
        assert!(overhead_figure(&none).is_empty());
        assert_eq!(slope(&[(1.0, 2.0), (1.0, 3.0)]), 0.0);
    }
}
