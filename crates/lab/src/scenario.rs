//! The scenarios of `lab admission --scenario`: the situations the paper's design is for.
//!
//! | scenario | what it models | how the lab builds it |
//! |---|---|---|
//! | `single` | one proxy in front of homogeneous back-ends (the paper's set-up) | one proxy; every client on it |
//! | `multi-proxy` | several proxies (a tier of load balancers) sharing the back-ends, each seeing only part of the traffic | `--proxies N` (2-4) proxies, all with the same back-ends; clients spread unevenly, halving from one proxy to the next (3 proxies: 4/7, 2/7, 1/7). `onesided-ac`/`tcp-ac` proxies all read the same regions, so each sees the load the others sent; each HAProxy only counts its own connections |
//! | `tenant-load` | back-ends that also run work the proxy did not send (co-hosted services, batch jobs) | `--tenant-procs` busy-looping processes per back-end node that come and go: each runs and pauses for exponentially distributed times (mean [`tenant_mean_s`] of the point's length), seeded |
//! | `mixed-cost` | requests whose cost differs by 100x (static files and a costly dynamic endpoint), so connection counts misstate load | a second group of clients asks `/cgi/work?us=` 100 x `--backend-cpu-us`: 1 client in 10 (closed loop), 1 arrival in 100 (open loop, about half the CPU) |
//! | `capacity-change` | a back-end whose capacity halves mid-run and recovers (a noisy neighbour, a CPU quota cut, thermal throttling) | back-end `b0` is stopped and continued (SIGSTOP/SIGCONT) every [`DUTY_PERIOD`], half of the time, during the middle third of the measured window |
//!
//! In `mixed-cost` the objective mode's proxy declares the costly endpoint as a request
//! class of lower priority ([`class_proxy_args`]: class-aware admission), and every
//! point carries a per-class breakdown measured by the clients ([`class_breakdown`]:
//! offered, served, rejected, p50/p99 per class, for every system).
//!
//! Both disturbances are applied with signals, on loopback and netns alike (no cgroup
//! quota: this host may not have cgroup v2, and signals work unprivileged); summary.json
//! records them under `settings` (`tenant_load`, `capacity_change`) with how they were
//! applied. Every scenario runs with every system in both load models.

use farside_loadgen::Summary;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A scenario of `lab admission` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// One proxy, homogeneous back-ends (the paper's case).
    Single,
    /// 2-4 proxies (--proxies) share the back-ends, clients spread unevenly (halving from
    /// one proxy to the next): each HAProxy knows only its own connections, one-sided
    /// and TCP proxies read every back-end's load.
    MultiProxy,
    /// Back-ends also run --tenant-procs busy processes that come and go (co-hosted
    /// services): load the proxy did not send.
    TenantLoad,
    /// Request costs differ 100x (static files and /cgi/work): 1 client in 10 (open loop:
    /// 1 arrival in 100) asks the costly endpoint, so connection counts misstate load.
    MixedCost,
    /// Back-end b0 runs at half speed (SIGSTOP/SIGCONT duty cycle) in the middle third of
    /// every point, then recovers: a capacity cut and its end.
    CapacityChange,
}

impl Scenario {
    /// The name used in keys, points and file names.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Single => "single",
            Scenario::MultiProxy => "multi-proxy",
            Scenario::TenantLoad => "tenant-load",
            Scenario::MixedCost => "mixed-cost",
            Scenario::CapacityChange => "capacity-change",
        }
    }
}

/// Fewest proxies of `multi-proxy`: one would be `single`.
pub const PROXIES_MIN: usize = 2;
/// Most proxies of `multi-proxy`: each is a process on the front-end CPU; beyond 4 the
/// front-end, not the back-ends, becomes the bottleneck on a small host.
pub const PROXIES_MAX: usize = 4;
/// Cost of a dynamic request over a static one in `mixed-cost`.
pub const MIXED_COST_FACTOR: u64 = 100;
/// `mixed-cost`, closed loop: share of the clients that ask the dynamic endpoint.
pub const MIXED_DYNAMIC_CLIENT_SHARE: f64 = 0.1;
/// `mixed-cost`, open loop: share of the arrivals that ask the dynamic endpoint (with
/// the 100x cost, about half the back-ends' CPU).
pub const MIXED_DYNAMIC_ARRIVAL_SHARE: f64 = 0.01;
/// `mixed-cost`: the request class the farside proxy declares for the costly endpoint
/// (`--class`), and the name of that class in a point's per-class breakdown.
pub const MIXED_COSTLY_CLASS: &str = "costly";
/// `mixed-cost`: the name of the static requests' class in a point's breakdown (the
/// proxy's `default` class).
pub const MIXED_STATIC_CLASS: &str = "static";
/// `mixed-cost`: priority of the costly class in the proxy (larger is less important;
/// the static requests are the default class, priority 0): the costly class is shed
/// first, as an operator would rank a costly dynamic endpoint against cheap pages.
pub const MIXED_COSTLY_PRIORITY: i32 = 1;

/// The class flags a farside proxy of `system` gets in `scenario`: in `mixed-cost`, the
/// objective mode (`onesided-delay`, whose budget of requests in flight the classes
/// divide) declares the costly endpoint's path as a lower-priority class; nothing
/// elsewhere (the other metrics have no in-flight budget to divide).
pub fn class_proxy_args(scenario: Scenario, system: &str) -> Vec<String> {
    if scenario != Scenario::MixedCost || system != "onesided-delay" {
        return Vec::new();
    }
    vec![
        "--class".into(),
        format!("{MIXED_COSTLY_CLASS},prefix=/cgi/work,priority={MIXED_COSTLY_PRIORITY}"),
    ]
}

/// One request class of a point, as its clients measured it (`mixed-cost`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClassBreakdown {
    /// [`MIXED_STATIC_CLASS`] or [`MIXED_COSTLY_CLASS`].
    pub class: String,
    /// Requests started per second of measured time.
    pub offered_rps: f64,
    /// Served requests per second of measured time.
    pub goodput: f64,
    /// Served requests (summed over runs).
    pub served: u64,
    /// 503 answers (summed over runs).
    pub rejected: u64,
    /// Failed requests: timeouts, resets (summed over runs).
    pub failures: u64,
    /// Median and 99th percentile of the served requests' response times, ms (mean over
    /// runs when combined).
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The per-class breakdown of a point whose client `groups` produced `parts` (same order):
/// the groups of each class merged as concurrent ([`merge_concurrent`]). Empty unless
/// some group asks the costly endpoint.
pub fn class_breakdown(
    groups: &[ClientGroup],
    parts: &[Summary],
) -> io::Result<Vec<ClassBreakdown>> {
    if !groups.iter().any(|g| g.dynamic) {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (dynamic, name) in [(false, MIXED_STATIC_CLASS), (true, MIXED_COSTLY_CLASS)] {
        let of: Vec<Summary> = groups
            .iter()
            .zip(parts)
            .filter(|(g, _)| g.dynamic == dynamic)
            .map(|(_, s)| s.clone())
            .collect();
        if of.is_empty() {
            continue;
        }
        let m = merge_concurrent(&of)?;
        out.push(ClassBreakdown {
            class: name.into(),
            offered_rps: m.offered_rps,
            goodput: m.goodput_rps,
            served: m.served,
            rejected: m.dropped_503,
            failures: m.failures,
            p50_ms: m.p50_ms,
            p99_ms: m.p99_ms,
        });
    }
    Ok(out)
}

/// The breakdowns of repeated runs of one point, class by class: means of rates and
/// percentiles, sums of counts (classes missing from a run are left out of its mean).
pub fn combine_breakdowns<'a>(
    runs: impl IntoIterator<Item = &'a [ClassBreakdown]>,
) -> Vec<ClassBreakdown> {
    let runs: Vec<&[ClassBreakdown]> = runs.into_iter().collect();
    let mut names: Vec<&str> = Vec::new();
    for r in &runs {
        for c in r.iter() {
            if !names.contains(&c.class.as_str()) {
                names.push(&c.class);
            }
        }
    }
    names
        .into_iter()
        .map(|name| {
            let of: Vec<&ClassBreakdown> = runs
                .iter()
                .filter_map(|r| r.iter().find(|c| c.class == name))
                .collect();
            let n = of.len() as f64;
            let mean = |f: fn(&ClassBreakdown) -> f64| of.iter().map(|c| f(c)).sum::<f64>() / n;
            ClassBreakdown {
                class: name.into(),
                offered_rps: mean(|c| c.offered_rps),
                goodput: mean(|c| c.goodput),
                served: of.iter().map(|c| c.served).sum(),
                rejected: of.iter().map(|c| c.rejected).sum(),
                failures: of.iter().map(|c| c.failures).sum(),
                p50_ms: mean(|c| c.p50_ms),
                p99_ms: mean(|c| c.p99_ms),
            }
        })
        .collect()
}

/// The per-class breakdown as a text table, one row per point and class: `points` gives
/// per point its scenario, load model and system label, its x (clients or arrivals/s)
/// and its breakdown. Empty when no point has a breakdown.
pub fn class_table_text<'a>(
    points: impl Iterator<Item = ([String; 3], u64, &'a [ClassBreakdown])>,
) -> String {
    use crate::table::{Align, Table};
    let points: Vec<_> = points.filter(|p| !p.2.is_empty()).collect();
    if points.is_empty() {
        return String::new();
    }
    let mut t = Table::new()
        .cols(
            "",
            Align::Left,
            [("scenario", 16), ("load", 7), ("system", 15), ("class", 8)],
        )
        .col("", "x", Align::Right, 8)
        .cols(
            "",
            Align::Right,
            [
                ("offered", 9),
                ("goodput", 9),
                ("503s", 8),
                ("failed", 7),
                ("p50 ms", 9),
                ("p99 ms", 10),
            ],
        )
        .rule('-')
        .trim_end();
    for ([scenario, load, system], x, classes) in points {
        for c in classes {
            t.row(vec![
                scenario.clone(),
                load.clone(),
                system.clone(),
                c.class.clone(),
                x.to_string(),
                format!("{:.1}", c.offered_rps),
                format!("{:.1}", c.goodput),
                c.rejected.to_string(),
                c.failures.to_string(),
                format!("{:.1}", c.p50_ms),
                format!("{:.1}", c.p99_ms),
            ]);
        }
    }
    format!(
        "request classes — per class: offered/s, goodput (served/s), 503s and failures, \
         p50 and p99 of served requests (ms)\n{}\n",
        t.render()
    )
}

/// `capacity-change`: period of the stop/continue cycle. Short against a point (seconds)
/// so the back-end looks like one at half speed, long against a signal's cost (µs).
pub const DUTY_PERIOD: Duration = Duration::from_millis(20);
/// `capacity-change`: fraction of [`DUTY_PERIOD`] the back-end runs while reduced.
pub const DUTY_RUN_FRACTION: f64 = 0.5;
/// Slice a disturbance thread sleeps before it looks at its stop flag again, so a point
/// ends (and its processes are continued) within this time.
const POLL: Duration = Duration::from_millis(5);

/// Mean on and off time of a `tenant-load` process for a point of `duration_s`: a tenth
/// of it, so several comings and goings fall into every point, within 0.25-5 s.
pub fn tenant_mean_s(duration_s: f64) -> f64 {
    (duration_s / 10.0).clamp(0.25, 5.0)
}

/// The mean CPU cost of a request in `scenario`, µs, for the capacity rule (open loop).
pub fn mean_cost_us(scenario: Scenario, cpu_us: u64) -> f64 {
    let c = cpu_us as f64;
    match scenario {
        Scenario::MixedCost => {
            (1.0 - MIXED_DYNAMIC_ARRIVAL_SHARE) * c
                + MIXED_DYNAMIC_ARRIVAL_SHARE * c * MIXED_COST_FACTOR as f64
        }
        _ => c,
    }
}

/// The share of the clients each of `n` proxies gets in `multi-proxy`: halving from one
/// to the next (2: 2/3, 1/3; 3: 4/7, 2/7, 1/7; 4: 8/15 ...), so no two proxies see the
/// same traffic.
pub fn proxy_shares(n: usize) -> Vec<f64> {
    let w: Vec<f64> = (0..n).map(|i| (1u64 << (n - 1 - i)) as f64).collect();
    let sum: f64 = w.iter().sum();
    w.into_iter().map(|x| x / sum).collect()
}

/// `total` split by `shares` (largest remainder: the parts add up to `total`).
pub fn split_count(total: u64, shares: &[f64]) -> Vec<u64> {
    let raw: Vec<f64> = shares.iter().map(|s| s * total as f64).collect();
    let mut out: Vec<u64> = raw.iter().map(|r| r.floor() as u64).collect();
    let mut left = total - out.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..raw.len()).collect();
    order.sort_by(|&a, &b| {
        let fa = raw[a] - raw[a].floor();
        let fb = raw[b] - raw[b].floor();
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    for i in order {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// One group of clients of a point: which proxy it uses, whether it asks the costly
/// endpoint, and its size (closed loop: clients; open loop: arrivals/s).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientGroup {
    /// Index of the proxy the group sends to.
    pub proxy: usize,
    /// The group asks `/cgi/work` (mixed-cost's dynamic class).
    pub dynamic: bool,
    /// Closed loop: clients of the group.
    pub clients: u64,
    /// Open loop: arrivals per second of the group.
    pub rate: f64,
}

/// The client groups of a point of `scenario` with `proxies` proxies: `clients` clients
/// (closed loop) or `rate` arrivals/s (open loop, `Some`). Empty groups are left out.
pub fn client_groups(
    scenario: Scenario,
    proxies: usize,
    clients: u64,
    rate: Option<f64>,
) -> Vec<ClientGroup> {
    let proxy_share = if scenario == Scenario::MultiProxy {
        proxy_shares(proxies)
    } else {
        vec![1.0]
    };
    let classes: Vec<(bool, f64)> = match (scenario, rate) {
        (Scenario::MixedCost, None) => vec![
            (false, 1.0 - MIXED_DYNAMIC_CLIENT_SHARE),
            (true, MIXED_DYNAMIC_CLIENT_SHARE),
        ],
        (Scenario::MixedCost, Some(_)) => vec![
            (false, 1.0 - MIXED_DYNAMIC_ARRIVAL_SHARE),
            (true, MIXED_DYNAMIC_ARRIVAL_SHARE),
        ],
        _ => vec![(false, 1.0)],
    };
    let mut shares = Vec::new();
    for (p, ps) in proxy_share.iter().enumerate() {
        for &(dynamic, cs) in &classes {
            shares.push((p, dynamic, ps * cs));
        }
    }
    let out: Vec<ClientGroup> = match rate {
        Some(r) => shares
            .iter()
            .map(|&(proxy, dynamic, s)| ClientGroup {
                proxy,
                dynamic,
                clients: 0,
                rate: r * s,
            })
            .collect(),
        None => {
            let w: Vec<f64> = shares.iter().map(|s| s.2).collect();
            let mut n = split_count(clients, &w);
            // mixed-cost keeps at least one dynamic client when there are two clients or
            // more, or the scenario would silently be `single`.
            if scenario == Scenario::MixedCost && clients >= 2 {
                for i in 0..shares.len() {
                    if shares[i].1 && n[i] == 0 {
                        if let Some(j) =
                            (0..n.len()).filter(|&j| !shares[j].1).max_by_key(|&j| n[j])
                        {
                            if n[j] > 1 {
                                n[j] -= 1;
                                n[i] += 1;
                            }
                        }
                    }
                }
            }
            shares
                .iter()
                .zip(n)
                .map(|(&(proxy, dynamic, _), c)| ClientGroup {
                    proxy,
                    dynamic,
                    clients: c,
                    rate: 0.0,
                })
                .collect()
        }
    };
    out.into_iter()
        .filter(|g| g.clients > 0 || g.rate > 0.0)
        .collect()
}

/// The summaries of client groups that ran *at the same time* as one: counts add up,
/// percentiles come from the pooled histograms, rates are per second of the (common)
/// window, and the per-second series are added second by second.
pub fn merge_concurrent(parts: &[Summary]) -> io::Result<Summary> {
    let Some(first) = parts.first() else {
        return Err(io::Error::other("merge_concurrent: no client groups"));
    };
    if parts.len() == 1 {
        return Ok(first.clone());
    }
    let mut m = Summary::merge(parts).map_err(|e| io::Error::other(e.to_string()))?;
    // `merge` treats its inputs as repeats (durations summed); these ran side by side.
    let k = parts.len() as f64;
    m.duration_s = first.duration_s;
    m.runs = first.runs;
    m.tps *= k;
    m.goodput_rps *= k;
    m.offered_rps *= k;
    m.completed_rps *= k;
    m.clients = parts.iter().map(|p| p.clients).sum();
    m.rate = parts.iter().map(|p| p.rate).sum();
    let len = parts.iter().map(|p| p.series.len()).max().unwrap_or(0);
    m.series = (0..len)
        .map(|t| {
            let mut s = farside_loadgen::SecondStats {
                t_s: t as u64,
                ..Default::default()
            };
            let mut latency_sum = 0.0;
            for x in parts.iter().filter_map(|p| p.series.get(t)) {
                s.t_s = x.t_s;
                s.served += x.served;
                s.dropped_503 += x.dropped_503;
                s.failures += x.failures;
                latency_sum += x.avg_ms * x.served as f64;
            }
            let done = s.served + s.dropped_503 + s.failures;
            if s.served > 0 {
                s.avg_ms = latency_sum / s.served as f64;
            }
            if done > 0 {
                s.drop_rate = (s.dropped_503 + s.failures) as f64 / done as f64;
            }
            s
        })
        .collect();
    Ok(m)
}

/// A disturbance running beside a point (tenant processes that come and go, a back-end
/// at half speed). Dropping it stops the thread and continues every process it may have
/// stopped, so no process is ever left stopped.
pub struct Disturbance {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pids: Vec<u32>,
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill has no memory effects; a pid that is gone gives ESRCH, ignored.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Sleep until `until` or until `stop` is set; false when stopped.
fn sleep_until(until: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        std::thread::sleep((until - now).min(POLL));
    }
}

impl Disturbance {
    fn spawn(pids: Vec<u32>, f: impl FnOnce(&AtomicBool) + Send + 'static) -> Disturbance {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || f(&s));
        Disturbance {
            stop,
            thread: Some(thread),
            pids,
        }
    }

    /// `tenant-load`: each of `pids` (busy processes) runs and pauses in turn for
    /// exponentially distributed times of mean `mean_s`, independently, from `seed`.
    /// They start paused.
    pub fn tenants(pids: Vec<u32>, mean_s: f64, seed: u64) -> Disturbance {
        for &p in &pids {
            signal(p, libc::SIGSTOP);
        }
        let list = pids.clone();
        Disturbance::spawn(pids, move |stop| {
            let mut rng = farside_loadgen::Rng::new(seed);
            let mut exp = move || {
                let u = 1.0 - rng.next_f64(); // (0, 1]: never ln(0)
                Duration::from_secs_f64(-u.ln() * mean_s)
            };
            if list.is_empty() {
                return;
            }
            let t0 = Instant::now();
            // Next switch time and state (running) of each process.
            let mut next: Vec<(Instant, bool)> = list.iter().map(|_| (t0 + exp(), false)).collect();
            loop {
                let (i, &(at, running)) = next
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, n)| n.0)
                    .expect("at least one process");
                if !sleep_until(at, stop) {
                    return;
                }
                signal(
                    list[i],
                    if running {
                        libc::SIGSTOP
                    } else {
                        libc::SIGCONT
                    },
                );
                next[i] = (at + exp(), !running);
            }
        })
    }

    /// `capacity-change`: `pid` runs [`DUTY_RUN_FRACTION`] of every [`DUTY_PERIOD`] from
    /// `start` after now for `len`, then runs freely again.
    pub fn half_speed(pid: u32, start: Duration, len: Duration) -> Disturbance {
        Disturbance::spawn(vec![pid], move |stop| {
            let t0 = Instant::now();
            if !sleep_until(t0 + start, stop) {
                return;
            }
            let end = t0 + start + len;
            let run = DUTY_PERIOD.mul_f64(DUTY_RUN_FRACTION);
            let mut at = t0 + start;
            while at < end {
                signal(pid, libc::SIGSTOP);
                if !sleep_until(at + DUTY_PERIOD - run, stop) {
                    break;
                }
                signal(pid, libc::SIGCONT);
                at += DUTY_PERIOD;
                if !sleep_until(at, stop) {
                    break;
                }
            }
            signal(pid, libc::SIGCONT);
        })
    }
}

impl Drop for Disturbance {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for &p in &self.pids {
            signal(p, libc::SIGCONT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_proxy_spreads_clients_unevenly_and_keeps_the_total() {
        let s = proxy_shares(3);
        assert!((s[0] - 4.0 / 7.0).abs() < 1e-12 && (s[2] - 1.0 / 7.0).abs() < 1e-12);
        let g = client_groups(Scenario::MultiProxy, 3, 70, None);
        let n: Vec<(usize, u64)> = g.iter().map(|g| (g.proxy, g.clients)).collect();
        assert_eq!(n, vec![(0, 40), (1, 20), (2, 10)]);
        assert_eq!(split_count(10, &proxy_shares(3)).iter().sum::<u64>(), 10);
        // Open loop: rates split the same way.
        let g = client_groups(Scenario::MultiProxy, 2, 0, Some(300.0));
        assert!((g[0].rate - 200.0).abs() < 1e-9 && (g[1].rate - 100.0).abs() < 1e-9);
        // Too few clients for every proxy: the empty groups are left out.
        assert_eq!(client_groups(Scenario::MultiProxy, 4, 1, None).len(), 1);
    }

    #[test]
    fn mixed_cost_declares_the_costly_class_for_the_objective_mode_only() {
        let v = class_proxy_args(Scenario::MixedCost, "onesided-delay");
        assert_eq!(v, ["--class", "costly,prefix=/cgi/work,priority=1"]);
        assert!(class_proxy_args(Scenario::MixedCost, "onesided-ac").is_empty());
        assert!(class_proxy_args(Scenario::Single, "onesided-delay").is_empty());
    }

    #[test]
    fn the_class_breakdown_is_per_class_and_absent_without_a_costly_class() {
        let part = |served: u64, p99_ms: f64| Summary {
            served,
            dropped_503: served / 2,
            goodput_rps: served as f64 / 20.0,
            offered_rps: served as f64 / 10.0,
            p50_ms: p99_ms / 4.0,
            p99_ms,
            ..Default::default()
        };
        let groups = client_groups(Scenario::MixedCost, 1, 0, Some(400.0));
        let parts = [part(8000, 120.0), part(40, 4000.0)];
        let b = class_breakdown(&groups, &parts).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(
            (b[0].class.as_str(), b[0].served, b[0].rejected, b[0].p99_ms),
            (MIXED_STATIC_CLASS, 8000, 4000, 120.0)
        );
        assert_eq!(
            (b[1].class.as_str(), b[1].goodput, b[1].p50_ms),
            (MIXED_COSTLY_CLASS, 2.0, 1000.0)
        );
        let single = client_groups(Scenario::Single, 1, 10, None);
        assert!(class_breakdown(&single, &parts[..1]).unwrap().is_empty());
        // Repeats: counts add up, rates and percentiles are means.
        let two = combine_breakdowns([&b[..], &b[..]]);
        assert_eq!(two[0].served, 16_000);
        assert_eq!(two[1].p99_ms, 4000.0);
        let text = class_table_text(
            [(
                ["mixed-cost".into(), "open".into(), "haproxy".into()],
                434,
                &b[..],
            )]
            .into_iter(),
        );
        assert!(text.starts_with("request classes"), "{text}");
        assert!(text.contains("costly") && text.contains("4000.0"), "{text}");
        assert!(class_table_text(std::iter::empty()).is_empty());
    }

    #[test]
    fn mixed_cost_has_a_costly_class_in_both_loops() {
        let g = client_groups(Scenario::MixedCost, 1, 20, None);
        assert_eq!(
            g.iter().map(|g| (g.dynamic, g.clients)).collect::<Vec<_>>(),
            vec![(false, 18), (true, 2)]
        );
        // Few clients: still one dynamic client.
        let g = client_groups(Scenario::MixedCost, 1, 3, None);
        assert_eq!(
            g.iter()
                .filter(|g| g.dynamic)
                .map(|g| g.clients)
                .sum::<u64>(),
            1
        );
        let g = client_groups(Scenario::MixedCost, 1, 0, Some(1000.0));
        assert!((g[1].rate - 10.0).abs() < 1e-9 && g[1].dynamic);
        // Mean cost: 0.99 c + 0.01 x 100 c.
        assert!((mean_cost_us(Scenario::MixedCost, 1000) - 1990.0).abs() < 1e-9);
        assert_eq!(mean_cost_us(Scenario::Single, 1000), 1000.0);
    }

    fn part(served: u64, p99_ms: u64) -> Summary {
        use farside_loadgen::summary::{encode_hist, new_latency_hist};
        let mut h = new_latency_hist();
        h.record_n(p99_ms * 1000, served).unwrap();
        Summary {
            runs: 1,
            clients: 2,
            served,
            attempts: served,
            started: served,
            avg_ms: p99_ms as f64,
            duration_s: 2.0,
            tps: served as f64 / 2.0,
            goodput_rps: served as f64 / 2.0,
            latency_hist_v2: encode_hist(&h),
            reject_latency_hist_v2: encode_hist(&new_latency_hist()),
            series: vec![
                farside_loadgen::SecondStats {
                    t_s: 0,
                    served: served / 2,
                    avg_ms: p99_ms as f64,
                    ..Default::default()
                },
                farside_loadgen::SecondStats {
                    t_s: 1,
                    served: served / 2,
                    avg_ms: p99_ms as f64,
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn concurrent_groups_add_up_over_one_window() {
        let m = merge_concurrent(&[part(300, 1), part(100, 9)]).unwrap();
        assert_eq!((m.served, m.clients, m.runs), (400, 4, 1));
        assert_eq!(m.duration_s, 2.0);
        assert!((m.goodput_rps - 200.0).abs() < 1e-9, "{}", m.goodput_rps);
        assert!((m.avg_ms - 3.0).abs() < 1e-9, "{}", m.avg_ms);
        assert!((m.p99_ms - 9.0).abs() < 0.01, "pooled p99: {}", m.p99_ms);
        assert_eq!(m.series.len(), 2);
        assert_eq!(m.series[1].served, 200);
        assert!((m.series[1].avg_ms - 3.0).abs() < 1e-9);
    }

    /// The state letter of `pid` in /proc (`T` when stopped).
    fn state(pid: u32) -> char {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = &s[s.rfind(')').unwrap() + 2..];
        after.chars().next().unwrap()
    }

    fn await_state(pid: u32, want: char) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while state(pid) != want {
            assert!(Instant::now() < deadline, "{pid} never reached {want}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn disturbances_stop_and_always_continue_their_processes() {
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let pid = child.id();
        // Half speed from the start for a long time: the process gets stopped...
        let d = Disturbance::half_speed(pid, Duration::ZERO, Duration::from_secs(60));
        await_state(pid, 'T');
        // ...and dropping the disturbance leaves it running.
        drop(d);
        await_state(pid, 'R');
        // Tenants start paused and come and go.
        let d = Disturbance::tenants(vec![pid], 0.01, 7);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = std::collections::BTreeSet::new();
        while seen.len() < 2 && Instant::now() < deadline {
            seen.insert(state(pid) == 'T');
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(seen.len(), 2, "both paused and running seen");
        drop(d);
        await_state(pid, 'R');
        let _ = child.kill();
        let _ = child.wait();
    }
}
