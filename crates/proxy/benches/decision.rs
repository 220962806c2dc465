//! Admission decision cost: read the monitor table + apply the policy, per request.
//! The policy includes the load estimate between samples (this proxy's requests since
//! the sample, a per-back-end tally); `route` also records the request in it.
//! Target: under 100 ns. Run: `cargo bench -p farside-proxy --bench decision`.

use farside_proxy::config::{BackendConfig, ProxyConfig};
use farside_proxy::control::monitor::create_table;
use farside_proxy::control::table::{Entry, EntryStatus, EntryWriter};
use farside_proxy::control::Control;
use farside_proxy::gate::Gate;
use std::hint::black_box;
use std::time::Instant;

const ITERS: u64 = 5_000_000;

fn bench(name: &str, mut f: impl FnMut()) {
    for _ in 0..ITERS / 10 {
        f();
    }
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        for _ in 0..ITERS {
            f();
        }
        best = best.min(t0.elapsed().as_nanos() as f64 / ITERS as f64);
    }
    println!("{name:<44} {best:>7.1} ns/op (best of 5 x {ITERS})");
}

fn main() {
    for n in [1usize, 4, 16] {
        let path =
            std::env::temp_dir().join(format!("farside-bench-table-{}-{n}", std::process::id()));
        let table = create_table(Some(&path), n, 1000).unwrap();
        let backends: Vec<BackendConfig> = (0..n)
            .map(|i| BackendConfig {
                addr: format!("127.0.0.1:{}", 10000 + i).parse().unwrap(),
                site: String::new(),
                region: None,
                limit: None,
                maxconn: None,
            })
            .collect();
        let mut cfg = ProxyConfig::simple("127.0.0.1:1".parse().unwrap(), backends);
        cfg.admission.enabled = true;
        cfg.admission.limit = Some(1000);
        cfg.admission.stale_after_ms = 3_600_000;
        cfg.monitor.table = Some(path.display().to_string());
        let ctl = Control::new(&cfg).unwrap();
        for i in 0..n {
            let e = Entry {
                status: EntryStatus::Ok,
                conns_established: 10 + i as u64,
                advanced_mono_ns: farside_rt::mono_ns(),
                ..Default::default()
            };
            EntryWriter::new(&*table, i).publish(&e);
        }
        let peer = "127.0.0.1:9".parse().unwrap();
        bench(&format!("on_accept ({n} back-ends, all fresh)"), || {
            black_box(ctl.on_accept(black_box(peer))).unwrap();
        });
        bench(
            &format!("choose: per-request admission + least-loaded ({n})"),
            || {
                black_box(ctl.choose(black_box(None))).unwrap();
            },
        );
        bench(
            &format!("route: choose + in-flight guard ({n} back-ends)"),
            || {
                black_box(ctl.route(black_box(None)).unwrap());
            },
        );
        let _ = std::fs::remove_file(path);
    }
}
