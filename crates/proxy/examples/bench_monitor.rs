//! Monitor and decision cost against the number of back-ends (issue 9 item 10).
//!
//! For each back-end count N: one gatherd-like responder answers N udp regions (one
//! socket, a region per read key, `farside_monitor::responder`); the monitor polls them
//! every period with its poller threads for `--seconds`; then the proxy's decisions run
//! over a table of N fresh entries. Prints, per N: the pollers' CPU (% of one core, and
//! µs per period, from each poller's CLOCK_THREAD_CPUTIME_ID), periods that overran,
//! the share of reads answered, and ns per decision (route: p2c and least-loaded;
//! accept check).
//!
//! Run (release, on a quiet machine; the responder needs a core of its own at 1,024):
//! `cargo run --release -p farside-proxy --example bench_monitor -- \
//!    [--backends 16,256,1024] [--seconds 5] [--period-us 1000] [--threads 0]`
//!
//! Targets (issue 9): 1,024 back-ends at 1 ms with the monitor ≤ 1 core; a per-request
//! decision < 100 ns.

use farside_monitor::responder::MultiResponder;
use farside_monitor::table::{Entry, EntryStatus, EntryWriter};
use farside_monitor::{create_table, Monitor, MonitorOptions, Watch};
use farside_proxy::config::{BackendConfig, BalancePolicy, ProxyConfig};
use farside_proxy::control::Control;
use farside_proxy::gate::Gate;
use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

struct Args {
    backends: Vec<usize>,
    seconds: f64,
    period_us: u64,
    threads: usize,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        backends: vec![16, 256, 1024],
        seconds: 5.0,
        period_us: 1000,
        threads: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{k} {v}: {e}");
        match k.as_str() {
            "--backends" => {
                a.backends = v
                    .split(',')
                    .map(|x| x.parse::<usize>().map_err(|e| bad(&e)))
                    .collect::<Result<_, _>>()?
            }
            "--seconds" => a.seconds = v.parse().map_err(|e| bad(&e))?,
            "--period-us" => a.period_us = v.parse().map_err(|e| bad(&e))?,
            "--threads" => a.threads = v.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown flag {k} (see the file's doc comment)")),
        }
    }
    Ok(a)
}

/// Pollers' CPU over a steady window: (% of one core, µs per period, periods, overruns).
fn monitor_cost(n: usize, a: &Args) -> (f64, f64, u64, u64, f64) {
    let r = MultiResponder::spawn(n).expect("responder");
    let table = create_table(None, n, a.period_us).expect("table");
    let watches = (0..n)
        .map(|i| Watch {
            index: i,
            name: format!("b{i}"),
            region: r.target(i),
        })
        .collect();
    let opts = MonitorOptions {
        period: Duration::from_micros(a.period_us),
        read_timeout: Duration::from_millis(50),
        stale_after: Duration::from_millis(100),
        key: farside_rmem::DEFAULT_READ_KEY,
        nice: 0,
        threads: a.threads,
    };
    let m = Monitor::start(watches, table, opts).expect("monitor");
    let snap = |m: &Monitor| {
        m.pollers().iter().fold((0u64, 0u64, 0u64), |s, p| {
            (
                s.0 + p.cpu_ns.load(Ordering::Relaxed),
                s.1 + p.periods.load(Ordering::Relaxed),
                s.2 + p.overruns.load(Ordering::Relaxed),
            )
        })
    };
    let reads = |m: &Monitor| -> u64 {
        (0..n)
            .filter_map(|i| m.stats(i))
            .map(|s| s.read.count())
            .sum()
    };
    // Warm up (first reads, socket buffers), then measure a steady window.
    std::thread::sleep(Duration::from_millis(500));
    let (c0, r0, t0) = (snap(&m), reads(&m), Instant::now());
    let ticker = std::thread::spawn({
        let until = Instant::now() + Duration::from_secs_f64(a.seconds);
        move || {
            // A gatherer's rhythm: every region gets a new sample each 10 ms.
            let mut k = 0;
            while Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
                k += 1;
                r.publish_all(k);
            }
            r
        }
    });
    let _r = ticker.join().expect("ticker");
    let (c1, r1, wall) = (snap(&m), reads(&m), t0.elapsed());
    let cpu_ns = (c1.0 - c0.0) as f64;
    let periods = (c1.1 - c0.1).max(1);
    let threads = m.pollers().len() as u64;
    let expected_reads = n as f64 * wall.as_secs_f64() * 1e6 / a.period_us as f64;
    (
        100.0 * cpu_ns / wall.as_nanos() as f64,
        cpu_ns / 1e3 / (periods / threads.max(1)) as f64,
        periods,
        c1.2 - c0.2,
        100.0 * (r1 - r0) as f64 / expected_reads,
    )
}

/// ns per call of `f`, best of 5 runs of about 200 ms each.
fn ns_per(mut f: impl FnMut()) -> f64 {
    let mut iters = 1_000u64;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        if t.elapsed() > Duration::from_millis(200) {
            break;
        }
        iters *= 4;
    }
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .fold(f64::MAX, f64::min)
}

fn decision_cost(n: usize, policy: BalancePolicy) -> (f64, f64) {
    let path = std::env::temp_dir().join(format!(
        "farside-bench-monitor-{}-{n}-{policy:?}",
        std::process::id()
    ));
    let table = create_table(Some(&path), n, 1000).expect("table");
    let backends = (0..n)
        .map(|i| BackendConfig {
            addr: format!("127.0.0.{}:{}", 1 + i / 60_000, 1024 + i % 60_000)
                .parse()
                .expect("addr"),
            site: String::new(),
            region: None,
            limit: None,
            maxconn: None,
        })
        .collect();
    let mut cfg = ProxyConfig::simple("127.0.0.1:1".parse().expect("addr"), backends);
    cfg.admission.enabled = true;
    cfg.admission.limit = Some(1000);
    cfg.admission.stale_after_ms = 3_600_000;
    cfg.balance.policy = policy;
    cfg.monitor.table = Some(path.display().to_string());
    let ctl = Control::new(&cfg).expect("control");
    for i in 0..n {
        let e = Entry {
            status: EntryStatus::Ok,
            conns_established: 10 + (i as u64 % 7),
            advanced_mono_ns: farside_rt::mono_ns(),
            ..Default::default()
        };
        EntryWriter::new(&*table, i).publish(&e);
    }
    let route = ns_per(|| {
        black_box(ctl.route(black_box(None)).expect("admitted"));
    });
    let peer = "127.0.0.1:9".parse().expect("addr");
    let accept = ns_per(|| {
        black_box(ctl.on_accept(black_box(peer))).expect("admitted");
    });
    let _ = std::fs::remove_file(path);
    (route, accept)
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_monitor: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "{:>8} {:>8} {:>10} {:>12} {:>9} {:>9} {:>12} {:>12} {:>11}",
        "backends",
        "pollers",
        "cpu_%core",
        "cpu_us/period",
        "overruns",
        "answered%",
        "route_p2c_ns",
        "route_ll_ns",
        "accept_ns"
    );
    for &n in &a.backends {
        let (cpu, per_period, _periods, overruns, answered) = monitor_cost(n, &a);
        let (p2c, accept) = decision_cost(n, BalancePolicy::P2c);
        let (ll, _) = decision_cost(n, BalancePolicy::LeastLoaded);
        println!(
            "{n:>8} {:>8} {cpu:>10.1} {per_period:>12.1} {overruns:>9} {answered:>9.1} {p2c:>12.1} {ll:>12.1} {accept:>11.1}",
            farside_monitor::poller_threads(n, a.threads),
        );
    }
}
