//! Objective-driven admission end to end: `farside proxy --admission
//! --metric delay --target-delay-ms 5` in front of a prefork `farside backend` whose
//! `gatherd` publishes its queueing delay over shm, under an open-loop overload.
//!
//! The same overload runs twice, without admission control and with the delay target,
//! while the test samples the back-end's published `queue_delay_us` from its region. The
//! bounds are loose and relative, so a busy 2-core machine does not make them flake:
//! with the target the back-end's delay stays within a few targets (without admission it
//! grows to hundreds of ms), and goodput stays near what the back-end serves when it is
//! kept saturated without admission.

use farside_region::{MappedWords, Snapshot, REGION_WORDS};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{exe, free_addr, metrics_raw as metrics, spawn, Dir};

/// Back-end: 2 prefork workers, 5 ms of CPU per request: at most 400 req/s.
const WORKERS: u32 = 2;
const CPU_US: u64 = 5_000;
const CAPACITY: f64 = WORKERS as f64 * 1e6 / CPU_US as f64;
/// Offered load, a multiple of [`CAPACITY`], open loop, for this long.
const OVERLOAD: f64 = 3.0;
const RUN_S: f64 = 4.0;
/// Delay readings before this much of the run are the budget's climb, not its
/// steady state.
const SETTLE: Duration = Duration::from_millis(1500);
const TARGET_DELAY_MS: u64 = 5;
/// How often the test samples the back-end's published delay.
const READ_EVERY: Duration = Duration::from_millis(5);

struct Outcome {
    /// Published queueing delays after [`SETTLE`], µs, sorted.
    delays_us: Vec<u64>,
    /// Goodput through each proxy, req/s.
    tps: Vec<f64>,
    /// The first proxy's metrics after the run.
    metrics: String,
}

impl Outcome {
    fn total_tps(&self) -> f64 {
        self.tps.iter().sum()
    }

    fn pct(&self, p: f64) -> u64 {
        let i = ((self.delays_us.len() as f64 - 1.0) * p).round() as usize;
        self.delays_us.get(i).copied().unwrap_or(0)
    }
}

/// [`OVERLOAD`] × capacity offered open loop, split evenly over `proxies` proxies that
/// share the one back-end, each with admission (`--metric delay`) or without.
fn overload(tag: &str, admission: bool, proxies: usize) -> Outcome {
    let dir = Dir::new(tag);
    let backend = free_addr();
    let mut be = spawn(
        "backend",
        &[
            "backend",
            "--listen",
            &backend.to_string(),
            "--workers",
            &WORKERS.to_string(),
            "--static-cpu-us",
            &CPU_US.to_string(),
        ],
        &dir,
    );
    be.wait_port(backend).unwrap();
    let region = dir.0.join("node.region");
    let mut g = spawn(
        "gatherd",
        &[
            "gatherd",
            "--watch-port",
            &backend.port().to_string(),
            "--shm",
            region.to_str().unwrap(),
            // A delay reading every 5 ms (the full count that measures it costs a few
            // hundred µs of kernel CPU on this host's TCP hash).
            "--conns-every",
            "5",
            // The user-space sampler's delay (the dump's), read from the region file
            // below; as root the default would be the kernel sampler's.
            "--sampler",
            "user",
        ],
        &dir,
    );
    g.wait_file(&region).unwrap();
    let target = TARGET_DELAY_MS.to_string();
    let backend_spec = format!("{backend},region=shm:{}", region.display());
    let mut ps = Vec::new();
    for i in 0..proxies {
        let (proxy, admin) = (free_addr(), free_addr());
        let mut args: Vec<String> = [
            "proxy",
            "--listen",
            &proxy.to_string(),
            "--admin-listen",
            &admin.to_string(),
            "--backend",
            &backend_spec,
        ]
        .map(String::from)
        .to_vec();
        if admission {
            for a in [
                "--admission",
                "--metric",
                "delay",
                "--target-delay-ms",
                &target,
            ] {
                args.push(a.into());
            }
        }
        let mut p = spawn(&format!("proxy{i}"), &args, &dir);
        p.wait_port(proxy).unwrap();
        ps.push((p, proxy, admin));
    }

    // Sample the back-end's published queueing delay while the load runs.
    let words = MappedWords::open_file(&region, REGION_WORDS).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            let mut out = Vec::new();
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(s) = Snapshot::read_local(&words, 4) {
                    let id = s.load.conns_sampled_mono_ns;
                    if id != last && t0.elapsed() >= SETTLE {
                        out.push(s.load.queue_delay_us);
                    }
                    last = id;
                }
                std::thread::sleep(READ_EVERY);
            }
            out
        })
    };
    let loads: Vec<_> = ps
        .iter()
        .map(|(_, proxy, _)| {
            std::process::Command::new(exe())
                .args([
                    "loadgen",
                    "--target",
                    &proxy.to_string(),
                    "--rate",
                    &(OVERLOAD * CAPACITY / proxies as f64).to_string(),
                    "--duration-s",
                    &RUN_S.to_string(),
                    "--warmup-s",
                    "0",
                    "--timeout-ms",
                    "3000",
                    "--json",
                    "--quiet",
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = loads
        .into_iter()
        .map(|l| l.wait_with_output().unwrap())
        .collect();
    stop.store(true, Ordering::Relaxed);
    let mut delays_us = reader.join().unwrap();
    delays_us.sort_unstable();
    let mut tps = Vec::new();
    for out in outs {
        assert!(out.status.success(), "loadgen: {out:?}");
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        eprintln!(
            "{tag}: served {} 503 {} failures {}",
            summary["served"], summary["dropped_503"], summary["failures"]
        );
        tps.push(summary["tps"].as_f64().unwrap());
    }
    let metrics = metrics(ps[0].2);
    for (p, _, _) in &mut ps {
        p.check_alive().unwrap();
    }
    let o = Outcome {
        delays_us,
        tps,
        metrics,
    };
    eprintln!(
        "{tag}: {} delay readings, p50 {} µs, p90 {} µs; tps {:?}",
        o.delays_us.len(),
        o.pct(0.5),
        o.pct(0.9),
        o.tps,
    );
    o
}

/// Loose bounds for a busy 2-core machine, where the back-end's workers themselves wait
/// for a CPU (other builds and tests): the runs being compared are seconds apart, so
/// goodput is compared with a wide margin.
const GOODPUT_SHARE_MIN: f64 = 0.5;
/// The median published delay with the target is within this many targets...
const DELAY_TARGETS_MAX: u64 = 5;
/// ...and this many times below the median without admission.
const DELAY_CUT_MIN: u64 = 10;

/// The published delay has the kernel tick's resolution (4 ms at HZ=250): a 5 ms target
/// reads as 4 or 8 ms around its operating point, more when the machine starves the
/// back-end's workers of CPU.
fn near_target(with: &Outcome, without: &Outcome) {
    let target_us = TARGET_DELAY_MS * 1000;
    assert!(
        with.pct(0.5) <= DELAY_TARGETS_MAX * target_us
            && with.pct(0.5) * DELAY_CUT_MIN <= without.pct(0.5),
        "median delay {} µs with the target, {} µs without; metrics:\n{}",
        with.pct(0.5),
        without.pct(0.5),
        with.metrics
    );
}

#[test]
fn a_target_delay_keeps_the_backends_queueing_delay_near_it_for_one_or_two_proxies() {
    let noac = overload("noac", false, 1);
    let delay = overload("delay", true, 1);
    let target_us = TARGET_DELAY_MS * 1000;
    assert!(
        delay.delays_us.len() >= 20,
        "delay readings arrive: {}",
        delay.delays_us.len()
    );
    assert!(
        noac.pct(0.5) > 10 * target_us,
        "without admission the overload queues far beyond the target: {} µs",
        noac.pct(0.5)
    );
    near_target(&delay, &noac);
    assert!(
        delay.total_tps() >= GOODPUT_SHARE_MIN * noac.total_tps(),
        "goodput near what the saturated back-end serves: {:.0} vs {:.0}",
        delay.total_tps(),
        noac.total_tps()
    );
    let decided = |d: &str| {
        delay
            .metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "farside_admission_checks_total{{metric=\"delay\",decided=\"{d}\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(
        decided("below_limit") > 0 && decided("over_limit") > 0,
        "the delay budget both admitted and refused:\n{}",
        delay.metrics
    );

    // Two proxies share the back-end, each with its own budget and half the overload:
    // the delay still holds, the back-end still serves near capacity, and neither proxy
    // is starved. (One test, so that the runs never overlap.)
    let two = overload("two", true, 2);
    near_target(&two, &noac);
    assert!(
        two.total_tps() >= GOODPUT_SHARE_MIN * noac.total_tps(),
        "{:?} vs {:.0}",
        two.tps,
        noac.total_tps()
    );
    for t in &two.tps {
        assert!(
            *t >= 0.2 * two.total_tps(),
            "no proxy starves: {:?}",
            two.tps
        );
    }
}
