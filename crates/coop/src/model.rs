//! The analytical model: exact mean-value analysis (MVA) of a closed queueing network,
//! fed by per-resource service demands computed from costs and the hit / remote / miss
//! fractions of a trace-driven simulation.
//!
//! Use it in this order: compute demands ([`cluster_demands_ns`]) from the costs and a
//! simulation's fractions; predict the throughput at the simulated population
//! ([`predict`]); check it against the simulated (later: measured) throughput within
//! [`MODEL_TOLERANCE`], fixed before looking; only then extrapolate ([`extrapolate`]:
//! more nodes, larger working sets, faster CPUs). Anything it returns beyond the checked
//! points is model output, and is to be labelled so.
//!
//! Two forms of the network: [`cluster_stations`] spreads the demand evenly over the
//! nodes (needed to extrapolate to other node counts); [`node_stations`] takes each
//! node's demands as the simulation found them. A policy that loads nodes unevenly (LARD
//! on few nodes) fits the second and not the first; extrapolating it with the balanced
//! form would overstate its throughput.
//!
//! MVA (Reiser and Lavenberg) for `N` customers, queueing stations with demands `D_k`
//! and think time `Z`, from `Q_k(0) = 0`:
//! `R_k(n) = D_k (1 + Q_k(n-1))`, `X(n) = n / (Z + sum R_k(n))`, `Q_k(n) = X(n) R_k(n)`.
//! Delay stations (no queueing) have `R_k = D_k`.

use crate::sim::{Costs, SimReport};

/// Population MVA solves at most: the recursion costs population x stations steps, and
/// a cluster of 64 nodes with 64 clients each is 4,096.
pub const MVA_POPULATION_MAX: u32 = 1_000_000;

/// Relative error between the model's and the simulator's throughput accepted before
/// extrapolating: 15 %. Rule, fixed in advance: MVA assumes exponential service and
/// perfectly balanced nodes, the simulator has fixed service times and the policies'
/// real imbalance; the seed's model was validated within about 10 % of measurement, and
/// the simulator adds its own imbalance.
pub const MODEL_TOLERANCE: f64 = 0.15;

/// Whether a station queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StationKind {
    Queueing,
    Delay,
}

/// One station of the network.
#[derive(Debug, Clone, PartialEq)]
pub struct Station {
    pub name: String,
    /// Service demand per request (visits x service time), seconds.
    pub demand_s: f64,
    pub kind: StationKind,
}

impl Station {
    pub fn queueing(name: impl Into<String>, demand_s: f64) -> Station {
        Station {
            name: name.into(),
            demand_s,
            kind: StationKind::Queueing,
        }
    }
}

/// MVA's answer for one population.
#[derive(Debug, Clone, PartialEq)]
pub struct MvaResult {
    pub population: u32,
    pub throughput_per_s: f64,
    /// Response time (excluding think time), seconds.
    pub response_s: f64,
    pub residence_s: Vec<f64>,
    pub queue_len: Vec<f64>,
    pub utilisation: Vec<f64>,
}

/// Exact MVA for `population` customers with think time `think_s`.
pub fn mva(stations: &[Station], think_s: f64, population: u32) -> MvaResult {
    assert!(
        population <= MVA_POPULATION_MAX,
        "population above MVA_POPULATION_MAX"
    );
    let k = stations.len();
    let mut q = vec![0.0; k];
    let mut r = vec![0.0; k];
    let mut x = 0.0;
    for n in 1..=population {
        for i in 0..k {
            r[i] = match stations[i].kind {
                StationKind::Queueing => stations[i].demand_s * (1.0 + q[i]),
                StationKind::Delay => stations[i].demand_s,
            };
        }
        let total: f64 = r.iter().sum();
        x = n as f64 / (think_s + total);
        for i in 0..k {
            q[i] = x * r[i];
        }
    }
    MvaResult {
        population,
        throughput_per_s: x,
        response_s: r.iter().sum(),
        utilisation: stations.iter().map(|s| x * s.demand_s).collect(),
        residence_s: r,
        queue_len: q,
    }
}

/// Service demand per request, summed over the cluster, per resource (cpu, disk, nic), in
/// nanoseconds: the costs weighted by the simulation's classes of answers.
pub fn cluster_demands_ns(costs: &Costs, report: &SimReport) -> [f64; 3] {
    let m = report.measured.max(1) as f64;
    let c = costs;
    let per = |ns: u64| ns as f64;
    let mut d = [0.0; 3];
    let all = [report.local, report.remote, report.forwarded, report.miss];
    // Every answer: the request at the answering node, its body copied and sent.
    for class in &all {
        d[0] +=
            class.requests as f64 * per(c.cpu_request_ns) + class.kb as f64 * per(c.cpu_per_kb_ns);
        d[2] += class.kb as f64 * per(c.nic_per_kb_ns);
    }
    // Misses: the disk.
    d[1] += report.miss.requests as f64 * per(c.disk_access_ns)
        + report.miss.kb as f64 * per(c.disk_per_kb_ns);
    // Bodies from a peer cross the peer's NIC too.
    d[2] += (report.remote.kb + report.forwarded.kb) as f64 * per(c.nic_per_kb_ns);
    // One-sided: the reader's READs and the peer's XDP answers; a wasted fetch costs the
    // reader's READs and the peer's one index READ.
    let reads_mean = report.remote.reads as f64 / report.remote.requests.max(1) as f64;
    d[0] += report.remote.reads as f64 * per(c.cpu_read_chunk_ns + c.cpu_xdp_chunk_ns);
    d[0] += report.wasted_fetches as f64
        * (reads_mean * per(c.cpu_read_chunk_ns) + per(c.cpu_xdp_chunk_ns));
    // Forwarded: a second request handled at each end, and the peer's copy.
    let forwarded = (report.forwarded.requests + report.wasted_forwards) as f64;
    d[0] += forwarded * per(2 * c.cpu_forward_ns + c.cpu_request_ns);
    d[0] += report.forwarded.kb as f64 * per(c.cpu_per_kb_ns);
    d.map(|x| x / m)
}

/// The cluster as a network: each node's CPU, disk and NIC a queueing station with an
/// equal share of the cluster's demand (the model's balance assumption).
pub fn cluster_stations(nodes: usize, demands_ns: [f64; 3]) -> Vec<Station> {
    (0..nodes)
        .flat_map(|n| {
            ["cpu", "disk", "nic"]
                .into_iter()
                .zip(demands_ns)
                .map(move |(r, d)| Station::queueing(format!("{r}{n}"), d / 1e9 / nodes as f64))
        })
        .collect()
}

/// The cluster as a network with each node's own demands (ns per request, cpu, disk,
/// nic): the shares a policy really gives each node, as the trace-driven simulation
/// found them, instead of the balance assumption.
pub fn node_stations(per_node_demands_ns: &[[f64; 3]]) -> Vec<Station> {
    per_node_demands_ns
        .iter()
        .enumerate()
        .flat_map(|(n, d)| {
            ["cpu", "disk", "nic"]
                .into_iter()
                .zip(*d)
                .map(move |(r, d)| Station::queueing(format!("{r}{n}"), d / 1e9))
        })
        .collect()
}

/// Throughput (requests/s) the model predicts for `nodes` nodes, `clients` clients with
/// think time `think_s`, and per-request cluster demands `demands_ns`.
pub fn predict(nodes: usize, demands_ns: [f64; 3], clients: u32, think_s: f64) -> MvaResult {
    mva(&cluster_stations(nodes, demands_ns), think_s, clients)
}

/// Label every extrapolated number carries in tables and files.
pub const EXTRAPOLATION_LABEL: &str = "model output (extrapolated, not measured)";

/// One extrapolated point: the inputs that differ from the checked points and the
/// model's answer, labelled.
#[derive(Debug, Clone, PartialEq)]
pub struct Extrapolation {
    pub label: &'static str,
    pub nodes: usize,
    pub clients: u32,
    /// Per-request cluster demands used (cpu, disk, nic), ns.
    pub demands_ns: [f64; 3],
    pub throughput_per_s: f64,
    pub response_s: f64,
}

/// Extrapolates with checked demands scaled per resource (`speedup` = how many times
/// faster each of cpu, disk and nic is, e.g. `[2.0, 1.0, 1.0]` for CPUs twice as fast)
/// to `nodes` nodes and `clients` clients. For other node counts or working sets the
/// fractions change: take them from a new trace-driven simulation, not from here.
pub fn extrapolate(
    demands_ns: [f64; 3],
    speedup: [f64; 3],
    nodes: usize,
    clients: u32,
    think_s: f64,
) -> Extrapolation {
    let d = [0, 1, 2].map(|k| demands_ns[k] / speedup[k]);
    let r = predict(nodes, d, clients, think_s);
    Extrapolation {
        label: EXTRAPOLATION_LABEL,
        nodes,
        clients,
        demands_ns: d,
        throughput_per_s: r.throughput_per_s,
        response_s: r.response_s,
    }
}

/// Relative error of a prediction against a simulated or measured value.
pub fn relative_error(predicted: f64, observed: f64) -> f64 {
    (predicted - observed).abs() / observed.abs().max(f64::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-12)
    }

    #[test]
    fn balanced_network_matches_the_closed_form() {
        // K stations of equal demand D, no think time: X(N) = N / (D (N + K - 1))
        // (Lazowska et al., Quantitative System Performance, balanced systems).
        for (k, d, n) in [(2, 1.0, 2), (3, 0.05, 10), (5, 0.2, 40)] {
            let st: Vec<Station> = (0..k)
                .map(|i| Station::queueing(format!("s{i}"), d))
                .collect();
            let r = mva(&st, 0.0, n);
            let want = n as f64 / (d * (n + k - 1) as f64);
            assert!(
                close(r.throughput_per_s, want, 1e-9),
                "K={k} N={n}: {} vs {want}",
                r.throughput_per_s
            );
        }
        // Worked by hand: two stations of D = 1, N = 2: X = 2/3, each queue holds 1.
        let st = vec![Station::queueing("a", 1.0), Station::queueing("b", 1.0)];
        let r = mva(&st, 0.0, 2);
        assert!(close(r.throughput_per_s, 2.0 / 3.0, 1e-12));
        assert!(close(r.queue_len[0], 1.0, 1e-12));
    }

    #[test]
    fn one_station_with_think_time_matches_the_finite_source_queue() {
        // Machine-repairman model (M/M/1//N): p0 = 1 / sum_n N!/(N-n)! (S/Z)^n,
        // X = (1 - p0) / S.
        let (s, z) = (0.1, 1.0);
        for n in [1u32, 5, 10, 30] {
            let mut term = 1.0;
            let mut sum = 1.0;
            for i in 1..=n {
                term *= (n - i + 1) as f64 * s / z;
                sum += term;
            }
            let want = (1.0 - 1.0 / sum) / s;
            let r = mva(&[Station::queueing("cpu", s)], z, n);
            assert!(
                close(r.throughput_per_s, want, 1e-9),
                "N={n}: {} vs {want}",
                r.throughput_per_s
            );
        }
    }

    #[test]
    fn extrapolation_is_labelled_and_moves_the_bottleneck() {
        // CPU-bound: twice-as-fast CPUs nearly double throughput at saturation, until the
        // disk becomes the bottleneck.
        let d = [40_000.0, 10_000.0, 5_000.0];
        let base = extrapolate(d, [1.0; 3], 4, 400, 0.0);
        let fast = extrapolate(d, [2.0, 1.0, 1.0], 4, 400, 0.0);
        assert_eq!(fast.label, EXTRAPOLATION_LABEL);
        assert!(fast.throughput_per_s > 1.8 * base.throughput_per_s);
        let faster = extrapolate(d, [10.0, 1.0, 1.0], 4, 400, 0.0);
        assert!(
            faster.throughput_per_s <= 4.0 / 10_000.0 * 1e9 + 1e-6,
            "disk bound"
        );
    }

    #[test]
    fn laws_and_bounds_hold_on_mva_output() {
        let st = vec![
            Station::queueing("cpu", 0.004),
            Station::queueing("disk", 0.010),
            Station::queueing("nic", 0.002),
            Station {
                name: "net".into(),
                demand_s: 0.001,
                kind: StationKind::Delay,
            },
        ];
        let z = 0.5;
        let d: f64 = st.iter().map(|s| s.demand_s).sum();
        for n in [1, 10, 50, 200] {
            let r = mva(&st, z, n);
            // Little's law over the whole loop, and per station.
            assert!(close(
                r.throughput_per_s * (r.response_s + z),
                n as f64,
                1e-9
            ));
            for (i, station) in st.iter().enumerate() {
                assert!(close(
                    r.queue_len[i],
                    r.throughput_per_s * r.residence_s[i],
                    1e-9
                ));
                // Utilisation law.
                assert!(close(
                    r.utilisation[i],
                    r.throughput_per_s * station.demand_s,
                    1e-12
                ));
            }
            // Asymptotic bounds.
            assert!(r.throughput_per_s <= (n as f64 / (d + z)).min(1.0 / 0.010) + 1e-9);
        }
        assert!(
            close(mva(&st, z, 2000).throughput_per_s, 100.0, 1e-3),
            "bottleneck bound reached"
        );
    }
}
