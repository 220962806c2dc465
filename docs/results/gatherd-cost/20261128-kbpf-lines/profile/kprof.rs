//! SCRATCH: kernel sampler tick cost per variant (KSAMP_TICK), BPF stats on.
use std::time::Duration;
fn main() {
    let secs: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let ports: Vec<u16> = std::env::args().skip(2).filter_map(|s| s.parse().ok()).collect();
    let _fd = farside_xdp::enable_bpf_stats().expect("stats");
    let mut x = farside_xdp::XdpResponder::load_for_sampler().expect("load");
    x.start_kernel_sampler(&ports, Duration::from_millis(1), &mut || {
        Ok(vec![Default::default(); ports.len()])
    })
    .expect("start");
    let t0 = std::time::Instant::now();
    let a = x.kernel_sampler_costs().unwrap();
    std::thread::sleep(Duration::from_secs(secs));
    let b = x.kernel_sampler_costs().unwrap();
    let wall = t0.elapsed().as_secs_f64();
    let dt = b.tick.run_time_ns - a.tick.run_time_ns;
    let dn = b.tick.run_count - a.tick.run_count;
    let ds = b.state.run_time_ns - a.state.run_time_ns;
    let dr = b.ready.run_time_ns - a.ready.run_time_ns;
    println!(
        "{} ticks={} ns/tick={:.0} tick_pct={:.4} state_pct={:.4} ready_pct={:.4} ns/record={:.0}",
        std::env::var("KSAMP_TICK").unwrap_or("ksamp_tick".into()),
        dn,
        dt as f64 / dn.max(1) as f64,
        dt as f64 / 1e9 / wall * 100.0,
        ds as f64 / 1e9 / wall * 100.0,
        dr as f64 / 1e9 / wall * 100.0,
        dt as f64 / (dn as f64 / b.ticks_per_period()),
    );
}
