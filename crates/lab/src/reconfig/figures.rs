//! The figures of `lab reconfig` (seed 001's Fig. 7-9), drawn with [`crate::svg`] from
//! the points alone, so `farside lab report DIR` draws them again:
//!
//! - `fig7-tps-<scenario>.svg`: aggregate TPS vs burst length, one line per system
//!   (`reconf-T<ms>` per T), one chart per scenario (Fig. 7).
//! - `fig8-nodes-<scenario>-L<burst>.svg`: nodes serving the loaded site over time, one
//!   line per system, at L = 512 (or the burst closest to it) (Fig. 8).
//! - `fig9-nodes-<scenario>-L<burst>.svg`: the same at the burst closest to 8,096 (the
//!   paper's figure), when that is another burst than Fig. 8's (Fig. 9).
//!
//! Each figure is `(file name, caption, svg)`, as `Experiment::figures` returns them.

use super::point::{label, ReconfigPoint};
use crate::svg::Chart;

/// Fig. 8's burst length (the paper's smallest).
pub const FIG8_BURST: u64 = 512;
/// Fig. 9's burst length (as the paper writes it).
pub const FIG9_BURST: u64 = 8096;

/// `2:2:2:2` → `2-2-2-2`, for file names.
fn file_scenario(s: &str) -> String {
    crate::report::sanitize(&s.replace(':', "-"))
}

/// The burst of `bursts` closest to `want` (the smaller on a tie).
pub fn closest(bursts: &[u64], want: u64) -> Option<u64> {
    bursts
        .iter()
        .copied()
        .min_by_key(|&b| (b.abs_diff(want), b))
}

fn distinct<T: PartialEq + Clone>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

/// Every reconfig figure of `points`.
pub fn figures(points: &[&ReconfigPoint]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for sc in distinct(points.iter().map(|p| p.scenario.clone())) {
        let here: Vec<&ReconfigPoint> = points
            .iter()
            .copied()
            .filter(|p| p.scenario == sc)
            .collect();
        let systems = distinct(here.iter().map(|p| label(&p.system, p.history_ms)));
        let transports = distinct(here.iter().map(|p| p.transport.clone())).join(", ");
        let mut c = Chart::new(
            &format!("Aggregate throughput vs burst length — {sc} ({transports})"),
            "burst length L (requests per site)",
            "served requests per second (TPS)",
        );
        for sys in &systems {
            let mut pts: Vec<(f64, f64)> = here
                .iter()
                .filter(|p| label(&p.system, p.history_ms) == *sys)
                .map(|p| (p.burst as f64, p.tps))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            c = c.series(sys, pts);
        }
        let f = file_scenario(&sc);
        out.push((
            format!("fig7-tps-{f}.svg"),
            format!("Aggregate TPS vs burst length, scenario {sc} (Fig. 7)"),
            c.to_svg(),
        ));
        let mut bursts: Vec<u64> = distinct(here.iter().map(|p| p.burst));
        bursts.sort_unstable();
        let b8 = closest(&bursts, FIG8_BURST);
        let b9 = closest(&bursts, FIG9_BURST).filter(|b| Some(*b) != b8);
        for (fig, burst) in [(8, b8), (9, b9)] {
            let Some(burst) = burst else { continue };
            let mut c = Chart::new(
                &format!("Nodes serving the loaded site — {sc}, L = {burst}"),
                "time since the first burst (s)",
                "nodes serving the loaded site",
            );
            for sys in &systems {
                let Some(p) = here
                    .iter()
                    .find(|p| p.burst == burst && label(&p.system, p.history_ms) == *sys)
                else {
                    continue;
                };
                c = c.series(
                    sys,
                    p.series.iter().map(|x| (x.t_s, x.nodes as f64)).collect(),
                );
            }
            out.push((
                format!("fig{fig}-nodes-{f}-L{burst}.svg"),
                format!(
                    "Nodes serving the loaded site over time (proxy p0's view every 100 ms), \
                     scenario {sc}, L = {burst} (Fig. {fig})"
                ),
                c.to_svg(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconfig::NodesSample;

    fn point(system: &str, t: Option<u64>, burst: u64, tps: f64) -> ReconfigPoint {
        let mut p = ReconfigPoint::combine(&[]);
        p.system = system.into();
        p.history_ms = t;
        p.scenario = "2:2:2:2".into();
        p.transport = "xdp".into();
        p.burst = burst;
        p.tps = tps;
        p.series = vec![
            NodesSample {
                t_s: 0.0,
                site: 0,
                nodes: 2,
            },
            NodesSample {
                t_s: 0.1,
                site: 0,
                nodes: 3,
            },
        ];
        p
    }

    #[test]
    fn fig7_per_scenario_and_fig8_9_at_the_papers_bursts() {
        assert_eq!(closest(&[512, 2048, 8192, 16384], 8096), Some(8192));
        assert_eq!(closest(&[512, 4096], 8096), Some(4096));
        assert_eq!(closest(&[], 512), None);
        let pts = [
            point("rigid", None, 512, 400.0),
            point("reconf", Some(5000), 512, 420.0),
            point("rigid", None, 8192, 410.0),
            point("reconf", Some(5000), 8192, 900.0),
        ];
        let refs: Vec<&ReconfigPoint> = pts.iter().collect();
        let f = figures(&refs);
        let names: Vec<&str> = f.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "fig7-tps-2-2-2-2.svg",
                "fig8-nodes-2-2-2-2-L512.svg",
                "fig9-nodes-2-2-2-2-L8192.svg"
            ]
        );
        for (_, caption, svg) in &f {
            assert!(svg.starts_with("<svg"), "{caption}");
            assert!(
                svg.contains("rigid") && svg.contains("reconf-T5000"),
                "{caption}"
            );
        }
        // One burst only: Fig. 8, no duplicate Fig. 9.
        let one: Vec<&ReconfigPoint> = pts.iter().filter(|p| p.burst == 512).collect();
        assert_eq!(figures(&one).len(), 2);
    }
}
