//! The simulator on the whole World Cup sample: 2, 4 and 8 nodes with 6.9 MB of cache
//! each (the bytes that 90 % of the requests touch), every policy. Checks the invariants
//! and that cooperation does what it is for, checks the analytical model against the
//! simulator within its tolerance, and prints the table (simulator and model output with
//! the default `Costs`, not measurements).
//!
//! Two models are printed: `bal` spreads the cluster's demand evenly over the nodes (the
//! form used to extrapolate); `node` uses each node's own demands as the simulation found
//! them. Only `node` is required to fit: where `bal` does not, the policy loads nodes
//! unevenly and extrapolating it with the balanced form would be wrong.

use farside_coop::model::{
    cluster_demands_ns, mva, node_stations, predict, relative_error, MODEL_TOLERANCE,
};
use farside_coop::policy::{BoundedHash, Lard, Policy, Press, RemoteMode, RoundRobin};
use farside_coop::sim::{run, SimConfig};
use farside_coop::trace::{world_cup_sample_path, Trace};
use std::time::Instant;

/// Cache per node: the World Cup sample's 90 % working set.
const CACHE_BYTES_PER_NODE: u64 = 6_900_000;

#[test]
fn world_cup_sample_on_2_4_8_nodes() {
    let started = Instant::now();
    let trace = Trace::read_world_cup(&world_cup_sample_path()).expect("the sample is in data/");
    println!(
        "policy         nodes  local  remote  miss   wasted  X(req/s)  R(ms)  cpu   disk  nic   dir   bal err  node err"
    );
    for nodes in [2, 4, 8] {
        let policies = [
            Policy::Press(Press::new(RemoteMode::OneSided)),
            Policy::Press(Press::new(RemoteMode::Forward)),
            Policy::Lard(Lard::default()),
            Policy::BoundedHash(BoundedHash::new(nodes, 125)),
            Policy::RoundRobin(RoundRobin::default()),
        ];
        let mut rows = Vec::new();
        for p in policies {
            let cfg = SimConfig::new(nodes, CACHE_BYTES_PER_NODE);
            let r = run(&cfg, &trace, p);
            r.check()
                .unwrap_or_else(|e| panic!("{} on {nodes} nodes: {e}", r.policy));
            let [l, rem, m] = r.fractions();
            let mean = |k: usize| r.utilisation.iter().map(|u| u[k]).sum::<f64>() / nodes as f64;
            let x = r.throughput_rps();
            let demands = cluster_demands_ns(&cfg.costs, &r);
            let bal_x = predict(nodes, demands, r.clients as u32, 0.0).throughput_per_s;
            let node_x = mva(&node_stations(&r.demand_ns), 0.0, r.clients as u32).throughput_per_s;
            let dir = r.directory_cpu.iter().sum::<f64>() / nodes as f64;
            println!(
                "{:<14} {nodes:>5}  {l:.3}  {rem:.3}   {m:.3}  {:>6}  {x:>8.0}  {:>5.2}  {:.2}  {:.2}  {:.2}  {dir:.3}  {:+.3}   {:+.3}",
                r.policy,
                r.wasted_fetches + r.wasted_forwards,
                r.mean_response_ns / 1e6,
                mean(0),
                mean(1),
                mean(2),
                (bal_x - x) / x,
                (node_x - x) / x,
            );
            // The model, with its tolerance fixed in advance, must hold on every point.
            let err = relative_error(node_x, x);
            assert!(
                err <= MODEL_TOLERANCE,
                "{} on {nodes}: model off by {err:.3}",
                r.policy
            );
            // Little's law on the simulator's output (no think time: N = X R).
            let little = x * r.mean_response_ns / 1e9;
            assert!((little - r.mean_in_system).abs() <= 0.03 * r.mean_in_system);
            rows.push(r);
        }
        let miss = |name: &str| rows.iter().find(|r| r.policy == name).unwrap().fractions()[2];
        // Cooperation: PRESS misses less than round-robin, whose nodes each cache the
        // same popular objects.
        assert!(miss("press") < miss("round-robin"), "{nodes} nodes");
    }
    println!("elapsed {:.1} s", started.elapsed().as_secs_f64());
}
