//! Run the reconfiguration simulator: `cargo run -p farside-reconf --release --example
//! sim -- --seed 1 --nodes 1000 --sites 10 --balancers 10 --hours 2`. Exits 1 if any
//! invariant was violated; the same seed replays the same run exactly.

use clap::Parser;
use farside_reconf::sim::{self, SimConfig};

/// Seeded simulation of the reconfiguration protocol with faults.
#[derive(Parser, Debug)]
struct Args {
    /// PRNG seed (replays exactly).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Back-end nodes.
    #[arg(long, default_value_t = 1000)]
    nodes: u32,
    /// Sites (round-robin initial allocation).
    #[arg(long, default_value_t = 10)]
    sites: u16,
    /// Balancers.
    #[arg(long, default_value_t = 10)]
    balancers: u32,
    /// Simulated hours.
    #[arg(long, default_value_t = 2.0)]
    hours: f64,
    /// S, ms (the balancer's default, `BalancerConfig::default()`).
    #[arg(long, default_value_t = 250)]
    sensitivity_ms: u64,
    /// T, ms (the balancer's default: 2 S).
    #[arg(long, default_value_t = 500)]
    history_ms: u64,
    /// Lease, ms.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
    /// Exactly-once servers (duplicates not applied twice).
    #[arg(long)]
    dedup: bool,
    /// Disable fencing on takeover (shows the stale writes it prevents).
    #[arg(long)]
    no_fence: bool,
    /// Multiply every network fault rate (loss, duplication, long delay) by this.
    #[arg(long, default_value_t = 1.0)]
    fault_scale: f64,
}

fn main() {
    let a = Args::parse();
    let mut cfg = SimConfig::new(
        a.seed,
        a.nodes,
        a.sites,
        a.balancers,
        (a.hours * 3600e9) as u64,
    );
    cfg.balancer.sensitivity_ns = a.sensitivity_ms * 1_000_000;
    cfg.balancer.history_ns = a.history_ms * 1_000_000;
    cfg.balancer.lease_ns = a.lease_ms * 1_000_000;
    cfg.balancer.fence_on_takeover = !a.no_fence;
    cfg.net.dedup = a.dedup;
    let scale = |p: u32| ((p as f64 * a.fault_scale) as u32).min(1_000_000);
    cfg.net.request_loss_ppm = scale(cfg.net.request_loss_ppm);
    cfg.net.reply_loss_ppm = scale(cfg.net.reply_loss_ppm);
    cfg.net.dup_ppm = scale(cfg.net.dup_ppm);
    cfg.net.tail_ppm = scale(cfg.net.tail_ppm);
    let r = match sim::run(cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let f = &r.faults;
    let s = &r.stats;
    println!(
        "seed {}: simulated {:.2} h in {:.1} s wall: {} events ({:.0} events/s), {} ops, {} mutations",
        r.seed,
        r.sim_ns as f64 / 3600e9,
        r.wall_s,
        r.events,
        r.events_per_s(),
        r.ops,
        r.mutations_applied
    );
    println!(
        "faults: {} total: {} requests lost, {} replies lost, {} duplicated, {} long delays, {} late replies, {} crashes, {} partitions, {} apply failures",
        f.total(),
        f.requests_lost,
        f.replies_lost,
        f.duplicated,
        f.long_delays,
        f.late_replies,
        f.crashes,
        f.partitions,
        f.apply_failures
    );
    println!(
        "balancers: {} rounds, {} moves, {} locks ({} taken over, longest wait {:.2} s, {} adopted), {} busy, {} node races, {} skipped, {} fenced out, {} fences, {} unknown outcomes, {} abandoned, {} no donor",
        s.rounds,
        s.moves,
        s.lock_acquired,
        s.takeovers,
        r.takeover_wait_max_ns as f64 / 1e9,
        s.adopted,
        s.lock_busy,
        s.node_races,
        s.skipped_rounds,
        s.fenced_out,
        s.fences,
        s.unknown_outcomes,
        s.abandoned,
        s.no_donor
    );
    let ms = |v: Option<u64>| v.map_or("-".into(), |v| format!("{:.0}", v as f64 / 1e6));
    println!(
        "switches: {} (p50 {} ms, p99 {} ms); nodes per site at end: {:?}",
        r.switches,
        ms(r.switch_pct_ns(0.5)),
        ms(r.switch_pct_ns(0.99)),
        r.nodes_per_site
    );
    println!("violations: {}", r.violations);
    for v in &r.violation_log {
        println!("  {v}");
    }
    if r.violations > 0 {
        std::process::exit(1);
    }
}
