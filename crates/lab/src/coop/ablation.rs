//! The per-message processor overhead ablation of `lab coop` (`--message-overhead-us`):
//! each configuration's throughput, CPU and peer-fetch time against the µs every peer
//! message costs, and the slope (throughput lost per µs of overhead, a least-squares
//! line over the configuration's overheads).
//!
//! Rendered only for points that carry an overhead, so runs kept before the ablation
//! re-render as they were.

use super::{link_label, CoopPoint};

/// Whether any point ran with a per-message overhead.
pub fn with_overhead(points: &[CoopPoint]) -> bool {
    points.iter().any(|p| p.message_overhead_us > 0)
}

/// The configurations of the ablation: points alike in everything but their overhead,
/// in order of first appearance, each sorted by overhead; only those measured at two
/// overheads or more.
fn groups(points: &[CoopPoint]) -> Vec<Vec<&CoopPoint>> {
    let same = |p: &CoopPoint, q: &CoopPoint| {
        p.system == q.system
            && p.nodes == q.nodes
            && p.link_gbit == q.link_gbit
            && p.load_model == q.load_model
            && p.clients == q.clients
            && p.rate == q.rate
    };
    let mut out: Vec<Vec<&CoopPoint>> = Vec::new();
    for p in points {
        match out.iter_mut().find(|g| same(g[0], p)) {
            Some(g) => g.push(p),
            None => out.push(vec![p]),
        }
    }
    for g in &mut out {
        g.sort_by_key(|p| p.message_overhead_us);
    }
    out.retain(|g| g.len() > 1 && g.iter().any(|p| p.message_overhead_us > 0));
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

fn load_label(p: &CoopPoint) -> String {
    if p.load_model == "open" {
        format!("{:.0}/s", p.rate)
    } else {
        format!("{} clients", p.clients)
    }
}

/// Peer messages that paid the overhead per served request.
fn spins_per_req(p: &CoopPoint) -> f64 {
    let served = p.tps * p.duration_s * f64::from(p.runs.max(1));
    if served > 0.0 {
        p.overhead_spins as f64 / served
    } else {
        0.0
    }
}

/// `overhead:` lines under the table, one block per configuration.
pub fn overhead_lines(points: &[CoopPoint]) -> String {
    let mut out = String::new();
    for g in groups(points) {
        let join = |f: &dyn Fn(&CoopPoint) -> String| {
            g.iter().map(|p| f(p)).collect::<Vec<_>>().join(" / ")
        };
        let first = g[0];
        let s = slope(
            &g.iter()
                .map(|p| (p.message_overhead_us as f64, p.tps))
                .collect::<Vec<_>>(),
        );
        let base = if first.message_overhead_us == 0 {
            first.tps
        } else {
            0.0
        };
        out += &format!(
            "overhead: {} {} nodes {} {} link {}: {} us per message\n",
            first.system,
            first.nodes,
            first.load_model,
            load_label(first),
            link_label(first.link_gbit),
            join(&|p| p.message_overhead_us.to_string())
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
            join(&|p| format!("{:.2}", spins_per_req(p)))
        );
    }
    out
}

/// `overhead.svg`: throughput against the per-message overhead, one line per
/// configuration (none without the ablation).
pub fn overhead_figure(points: &[CoopPoint]) -> Vec<crate::experiment::Figure> {
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
        let p = g[0];
        let name = format!(
            "{} n{} {} {} {}",
            p.system,
            p.nodes,
            link_label(p.link_gbit),
            p.load_model,
            load_label(p)
        );
        chart = chart.series(
            &name,
            g.iter()
                .map(|p| (p.message_overhead_us as f64, p.tps))
                .collect(),
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

    fn point(system: &str, us: u64, tps: f64) -> CoopPoint {
        CoopPoint {
            system: system.into(),
            nodes: 4,
            message_overhead_us: us,
            overhead_spins: us * 96,
            load_model: "closed".into(),
            clients: 16,
            runs: 2,
            duration_s: 8.0,
            tps,
            ..CoopPoint::default()
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
        assert!(with_overhead(&pts));
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
        // 4,800 spins over 2 runs of 8 s at 500/s.
        assert!(t.contains("spins/req 0.00 / 0.07 / 0.60"), "{t}");
        assert_eq!(overhead_figure(&pts).len(), 1);
        // No overhead anywhere: nothing rendered (earlier runs unchanged).
        let none = [point("press-tcp", 0, 1.0), point("rr", 0, 1.0)];
        assert!(!with_overhead(&none));
        assert_eq!(overhead_lines(&none), "");
        assert!(overhead_figure(&none).is_empty());
        assert_eq!(slope(&[(1.0, 2.0), (1.0, 3.0)]), 0.0);
    }

    #[test]
    fn the_table_and_csv_carry_the_overhead_only_when_measured() {
        let with = [point("press-tcp", 0, 1000.0), point("press-tcp", 25, 800.0)];
        let t = super::super::table(&with);
        assert!(t.lines().next().unwrap().contains("ovh_us"), "{t}");
        let c = super::super::csv(&with).unwrap();
        let head = c.lines().next().unwrap();
        assert!(
            head.starts_with("system,nodes,cache_bytes,link_gbit,message_overhead_us,"),
            "{head}"
        );
        assert!(head.ends_with(",overhead_spins"), "{head}");
        let without = [point("press-tcp", 0, 1000.0)];
        assert!(!super::super::table(&without).contains("ovh_us"));
        assert!(!super::super::csv(&without)
            .unwrap()
            .contains("message_overhead_us"));
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
}
