//! What `lab admission` measures during a point besides the clients' view: the proxy's
//! monitor and time split (scraped before and after), the back-ends' published queueing
//! delay (sampled), the clients' arguments, and the point built from the loadgen's
//! summary.

use super::*;

/// Histograms of the proxy's monitor at one moment; two of them bracket a point.
pub(super) struct MonitorScrape {
    pub(super) read: crate::promtext::Buckets,
    pub(super) gap: crate::promtext::Buckets,
    /// `farside_proxy_request_duration_seconds` `_sum` and `_count`.
    pub(super) duration_sum_s: f64,
    pub(super) duration_count: f64,
    /// `farside_proxy_upstream_wait_microseconds_total` and `_checkouts_total`.
    pub(super) wait_us: f64,
    pub(super) checkouts: f64,
}

/// The value of the unlabelled sample `name` in Prometheus text, 0 when absent.
pub(super) fn sample_value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

impl MonitorScrape {
    /// `None` (with a warning) when the proxy has no admin listener or does not answer:
    /// the point is still measured, only without the monitor's figures.
    pub(super) fn take(fabric: &Fabric, tier: &Tier) -> Option<MonitorScrape> {
        // The first proxy's monitor (with `multi-proxy`, the one with the most clients).
        let admin = tier.proxies.first()?.admin_addr?;
        match fabric.scrape(admin) {
            Ok(text) => Some(MonitorScrape {
                read: crate::promtext::buckets(&text, "farside_monitor_read_seconds"),
                gap: crate::promtext::buckets(&text, "farside_monitor_update_gap_seconds"),
                duration_sum_s: sample_value(&text, "farside_proxy_request_duration_seconds_sum"),
                duration_count: sample_value(&text, "farside_proxy_request_duration_seconds_count"),
                wait_us: sample_value(&text, "farside_proxy_upstream_wait_microseconds_total"),
                checkouts: sample_value(&text, "farside_proxy_upstream_checkouts_total"),
            }),
            Err(e) => {
                eprintln!("lab admission: warning: no monitor figures for this point: {e}");
                None
            }
        }
    }

    /// Fill `p`'s monitor figures from the window `before..self`.
    pub(super) fn fill(&self, before: &MonitorScrape, p: &mut Point) {
        use crate::promtext::{delta, quantile};
        let read = delta(&self.read, &before.read);
        let gap = delta(&self.gap, &before.gap);
        p.monitor_read_p50_us = quantile(&read, 0.50).map(|s| s * 1e6);
        p.monitor_read_p99_us = quantile(&read, 0.99).map(|s| s * 1e6);
        p.update_gap_p99_ms = quantile(&gap, 0.99).map(|s| s * 1e3);
        let checkouts = self.checkouts - before.checkouts;
        if checkouts > 0.0 {
            // Mean wait for an upstream connection slot per request that asked for one.
            p.proxy_queue_ms = Some((self.wait_us - before.wait_us) / checkouts / 1e3);
        }
        let n = self.duration_count - before.duration_count;
        if n > 0.0 {
            p.proxy_time_ms = Some((self.duration_sum_s - before.duration_sum_s) / n * 1e3);
        } else {
            eprintln!(
                "lab admission: warning: the first proxy's request-duration count did not \
                 move during the point: no proxy_time_ms"
            );
        }
    }
}

/// Period of [`QueueSampler`]'s reads: a few per gatherer connection count (every few ms
/// to tens of ms), at a negligible cost (one shm read per back-end).
pub(super) const QUEUE_SAMPLE_PERIOD: std::time::Duration = std::time::Duration::from_millis(5);

/// Most readings a [`QueueSampler`] keeps: a 60 s point at one new reading per ms from
/// each of 4 back-ends; later readings are dropped (and the figures come from the rest).
pub(super) const QUEUE_READINGS_MAX: usize = 240_000;

/// Reads the back-ends' published queueing delay (`queue_delay_us`) from their regions
/// while a point runs, keeping each new reading (a new connection count): where served
/// time went at the back-ends, the same measurement whichever proxy runs.
pub(super) struct QueueSampler {
    pub(super) stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(super) thread: Option<std::thread::JoinHandle<Vec<u64>>>,
}

impl QueueSampler {
    /// Start reading `regions`, from `skip` (the warm-up) on.
    pub(super) fn start(regions: &[PathBuf], skip: std::time::Duration) -> QueueSampler {
        use farside_region::layout::{FLAG_QUEUE_DELAY, REGION_WORDS};
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let paths = regions.to_vec();
        let thread = std::thread::spawn(move || {
            let maps: Vec<_> = paths
                .iter()
                // A region file, or gatherd's socket handing out the XDP region map.
                .filter_map(|p| farside_rmem::map_region(p, REGION_WORDS).ok())
                .collect();
            let mut last = vec![0u64; maps.len()];
            let mut out = Vec::new();
            let measure_from = Instant::now() + skip;
            while Instant::now() < measure_from && !s.load(Ordering::Relaxed) {
                std::thread::sleep(QUEUE_SAMPLE_PERIOD);
            }
            while !s.load(Ordering::Relaxed) {
                for (m, l) in maps.iter().zip(&mut last) {
                    let Ok(snap) = farside_region::Snapshot::read_local(m, 4) else {
                        continue;
                    };
                    let r = snap.load;
                    if r.flags & FLAG_QUEUE_DELAY == 0 || r.conns_sampled_mono_ns == *l {
                        continue;
                    }
                    *l = r.conns_sampled_mono_ns;
                    if out.len() < QUEUE_READINGS_MAX {
                        out.push(r.queue_delay_us);
                    }
                }
                std::thread::sleep(QUEUE_SAMPLE_PERIOD);
            }
            out
        });
        QueueSampler {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop and fill `p`'s back-end queueing figures (left empty without readings).
    pub(super) fn finish(mut self, p: &mut Point) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut v = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        if v.is_empty() {
            return;
        }
        v.sort_unstable();
        let mean = v.iter().sum::<u64>() as f64 / v.len() as f64;
        let i = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
        p.backend_queue_ms = Some(mean / 1e3);
        p.backend_queue_p99_ms = Some(v[i] as f64 / 1e3);
    }
}

impl Drop for QueueSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(super) fn trace_kind(t: &str) -> io::Result<TraceKind> {
    Ok(match t {
        "single" => TraceKind::Single,
        "worldcup" => TraceKind::Worldcup,
        "zipf" => TraceKind::Zipf,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--traces: unknown trace `{t}` (single, worldcup, zipf)"),
            ))
        }
    })
}

pub(super) fn loadgen_args(
    a: &AdmissionArgs,
    target: SocketAddr,
    trace: &str,
    clients: u64,
    duration_s: f64,
    warmup_s: f64,
) -> io::Result<LoadgenArgs> {
    let mut l = LoadgenArgs::new(target.to_string());
    l.trace = trace_kind(trace)?;
    l.paths = PathMode::Docroot;
    l.clients = clients as usize;
    l.duration_s = duration_s;
    l.warmup_s = warmup_s;
    l.think_ms = a.think_ms;
    l.on_reject = Some(a.on_reject);
    l.qos_ms = a.qos_ms;
    l.timeout_ms = a.timeout_ms;
    l.no_keepalive = a.no_keepalive;
    l.keepalive = !a.no_keepalive;
    l.quiet = true;
    Ok(l)
}

pub(super) fn point(k: &Key, transport: &str, s: &farside_loadgen::Summary) -> Point {
    let mut p = Point {
        system: k.system.clone(),
        trace: k.trace.clone(),
        clients: k.clients.unwrap_or(0),
        limit: k.limit,
        transport: transport.into(),
        runs: 1,
        scenario: k.scenario.name().into(),
        load_model: k.load_model.clone(),
        rate_x: k.rate_x,
        rate_rps: k.rate_x.and(s.rate),
        series: s
            .series
            .iter()
            .map(|x| SecondPoint {
                t_s: x.t_s,
                served: x.served,
                dropped: x.dropped_503 + x.failures,
                avg_ms: x.avg_ms,
            })
            .collect(),
        ..Point::default()
    };
    p.fill_from_loadgen(s);
    p
}

/// Served requests of a loadgen `--out` file as `(start s, response time ms)`, thinned
/// evenly to at most `max` (every k-th served request).
pub fn request_samples(path: &std::path::Path, max: usize) -> io::Result<Vec<(f64, f64)>> {
    let mut r = csv::Reader::from_path(path).map_err(io::Error::other)?;
    let head = r.headers().map_err(io::Error::other)?.clone();
    let col = |name: &str| {
        head.iter().position(|h| h == name).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: no `{name}` column", path.display()),
            )
        })
    };
    let (start, lat, outcome) = (col("start_us")?, col("latency_us")?, col("outcome")?);
    let mut all = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(io::Error::other)?;
        if rec.get(outcome) != Some("served") {
            continue;
        }
        let num = |i: usize| rec.get(i).and_then(|v| v.parse::<f64>().ok());
        if let (Some(s), Some(l)) = (num(start), num(lat)) {
            all.push((s / 1e6, l / 1e3));
        }
    }
    let step = all.len().div_ceil(max.max(1)).max(1);
    Ok(all.into_iter().step_by(step).collect())
}

pub(super) fn transport_of(system: &str, netns: bool) -> &'static str {
    match (system, netns) {
        ("tcp-ac", _) => "tcp",
        ("onesided-ac" | "onesided-delay", false) => "shm",
        ("onesided-ac" | "onesided-delay", true) => "udp-xdp",
        _ => "none",
    }
}

/// How often [`HostSampler`]'s thread looks whether the point ended early while it waits
/// for the measured window's end: the end snapshot is at most this late.
pub(super) const HOST_STOP_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// What the host's counters said at one moment of a point ([`HostSampler`]).
#[derive(Debug, Clone, Default)]
pub(super) struct HostSnap {
    /// `/proc/stat` per CPU: (busy ticks, softirq + irq ticks, all ticks), by CPU id.
    cpus: BTreeMap<usize, (u64, u64, u64)>,
    /// The proxy node's cgroup CPU time (`cpu.stat` `usage_usec`), µs.
    proxy_us: Option<u64>,
    /// TCP connections the back-ends accepted so far (sum over their namespaces).
    passive_opens: Option<u64>,
}

/// Per-CPU times of a `/proc/stat` text: (busy, softirq + irq, all), in ticks. Busy is
/// everything but idle and iowait (steal included: the CPU was not ours to idle).
pub(super) fn cpu_ticks_of(stat: &str) -> BTreeMap<usize, (u64, u64, u64)> {
    stat.lines()
        .filter_map(|l| {
            // `cpuN ...`; the aggregate `cpu  ...` line has no number after the name.
            let rest = l.strip_prefix("cpu")?;
            if !rest.starts_with(|c: char| c.is_ascii_digit()) {
                return None;
            }
            let mut f = rest.split_whitespace();
            let id: usize = f.next()?.parse().ok()?;
            // user nice system idle iowait irq softirq steal (guest is inside user).
            let v: Vec<u64> = f.take(8).filter_map(|x| x.parse().ok()).collect();
            if v.len() < 8 {
                return None;
            }
            let all: u64 = v.iter().sum();
            let busy = all - v[3] - v[4];
            Some((id, (busy, v[5] + v[6], all)))
        })
        .collect()
}

/// `PassiveOpens` of a `/proc/PID/net/snmp` text (the `Tcp:` header and value lines).
pub(super) fn passive_opens_of(snmp: &str) -> Option<u64> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (head, vals) = (tcp.next()?, tcp.next()?);
    let i = head.split_whitespace().position(|h| h == "PassiveOpens")?;
    vals.split_whitespace().nth(i)?.parse().ok()
}

/// `usage_usec` of a cgroup v2 `cpu.stat` text.
pub(super) fn usage_us_of(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
}

/// Where the host's CPU and the back-ends' connections went during a point's measured
/// window: `/proc/stat` of the two tiers' CPUs, the proxy node's cgroup CPU time, and
/// the back-end namespaces' accepted connections, snapshotted when the clients' warm-up
/// ends and when their measured window ends (the clients' own clock), so the figures
/// divide by the same requests the clients counted.
pub(super) struct HostSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Option<(HostSnap, HostSnap, f64)>>>,
    back: Vec<usize>,
    front: Vec<usize>,
}

impl HostSampler {
    /// Start watching: `back` / `front` the tiers' CPUs, `proxy_cgroup` the proxy node's
    /// v2 cgroup (netns), `backend_pids` one process in each back-end's namespace.
    pub(super) fn start(
        back: Vec<usize>,
        front: Vec<usize>,
        proxy_cgroup: Option<PathBuf>,
        backend_pids: Vec<u32>,
        warmup: std::time::Duration,
        window: std::time::Duration,
    ) -> HostSampler {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let snap = || HostSnap {
                cpus: std::fs::read_to_string("/proc/stat")
                    .map(|t| cpu_ticks_of(&t))
                    .unwrap_or_default(),
                proxy_us: proxy_cgroup
                    .as_ref()
                    .and_then(|d| usage_us_of(&std::fs::read_to_string(d.join("cpu.stat")).ok()?)),
                passive_opens: (!backend_pids.is_empty())
                    .then(|| {
                        backend_pids
                            .iter()
                            .map(|pid| {
                                passive_opens_of(
                                    &std::fs::read_to_string(format!("/proc/{pid}/net/snmp"))
                                        .ok()?,
                                )
                            })
                            .sum::<Option<u64>>()
                    })
                    .flatten(),
            };
            let wait_until = |t: Instant| {
                while Instant::now() < t {
                    if s.load(Ordering::Relaxed) {
                        return false;
                    }
                    std::thread::sleep(HOST_STOP_POLL.min(t - Instant::now()));
                }
                true
            };
            let t0 = Instant::now();
            if !wait_until(t0 + warmup) {
                return None;
            }
            let (a, at) = (snap(), Instant::now());
            wait_until(t0 + warmup + window);
            let b = snap();
            Some((a, b, at.elapsed().as_secs_f64()))
        });
        HostSampler {
            stop,
            thread: Some(thread),
            back,
            front,
        }
    }

    /// Stop and fill `p`'s host figures (those it could read); call after the clients'
    /// figures are in `p` (it divides by `p.served` and `p.attempts`).
    pub(super) fn finish(mut self, p: &mut Point) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let Some((a, b, secs)) = self.thread.take().and_then(|t| t.join().ok()).flatten() else {
            return;
        };
        // (busy, softirq, all) ticks of `cpus` over the window.
        let delta = |cpus: &[usize]| {
            cpus.iter().fold((0u64, 0u64, 0u64), |acc, c| {
                match (a.cpus.get(c), b.cpus.get(c)) {
                    (Some(x), Some(y)) => (
                        acc.0 + y.0.saturating_sub(x.0),
                        acc.1 + y.1.saturating_sub(x.1),
                        acc.2 + y.2.saturating_sub(x.2),
                    ),
                    _ => acc,
                }
            })
        };
        let (busy, soft, all) = delta(&self.back);
        if all > 0 {
            p.backend_cpu_busy = Some(busy as f64 / all as f64);
            p.backend_softirq = Some(soft as f64 / all as f64);
            if p.served > 0 {
                // Ticks of the window → µs: each CPU's all-ticks span the window.
                let us_per_tick = secs * 1e6 * self.back.len() as f64 / all as f64;
                p.backend_cpu_us_per_served = Some(busy as f64 * us_per_tick / p.served as f64);
            }
        }
        let (fbusy, _, fall) = delta(&self.front);
        if fall > 0 {
            p.front_cpu_busy = Some(fbusy as f64 / fall as f64);
        }
        if let (Some(x), Some(y), true) = (a.passive_opens, b.passive_opens, p.served > 0) {
            p.backend_conns_per_served = Some(y.saturating_sub(x) as f64 / p.served as f64);
        }
        if let (Some(x), Some(y), true) = (a.proxy_us, b.proxy_us, p.attempts > 0) {
            p.proxy_cpu_us_per_attempt = Some(y.saturating_sub(x) as f64 / p.attempts as f64);
        }
    }
}

impl Drop for HostSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
