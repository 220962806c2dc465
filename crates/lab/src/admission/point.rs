//! The point of `lab admission`: one system, trace and load ([`Point`]), its per-second
//! series ([`SecondPoint`]), and how repeats of a point combine.
//!
//! All time keys are in milliseconds and cover served requests only. A point's
//! per-second `series`, its request samples and its loadgen summary are kept in
//! `points.jsonl` only ([`AdmissionExtra`]): `summary.json` has the point without them,
//! and the report writes the series to `series-<system>-<trace>-<clients>.csv`.

use crate::experiment::LabPoint;
use serde::{Deserialize, Serialize};

/// Name of the baseline system without admission control.
pub const SYSTEM_NO_AC: &str = "no-ac";
/// Name of the system with two-sided (TCP) load reads feeding admission control.
pub const SYSTEM_TCP_AC: &str = "tcp-ac";
/// Name of the system with one-sided load reads feeding admission control.
pub const SYSTEM_ONESIDED_AC: &str = "onesided-ac";
/// The anchor: HAProxy with the full per-server `maxconn` on every proxy.
pub const SYSTEM_HAPROXY: &str = "haproxy";
/// The anchor with the per-server `maxconn` divided among the proxies (`multi-proxy`).
pub const SYSTEM_HAPROXY_DIVIDED: &str = "haproxy-divided";
/// Envoy with its adaptive concurrency filter, the anchor for hidden load.
pub const SYSTEM_ENVOY_AC: &str = "envoy-ac";
/// The three systems of the paper's comparison, in the order tables and plots show them.
pub const SYSTEMS: [&str; 3] = [SYSTEM_NO_AC, SYSTEM_TCP_AC, SYSTEM_ONESIDED_AC];

/// One admission-control measurement: one system, trace and client count.
///
/// All time keys are in milliseconds and cover served requests only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Point {
    /// `system`: `"no-ac"`, `"tcp-ac"`, `"onesided-ac"` (see [`SYSTEMS`]) or `"haproxy"`
    /// (the anchor, `lab admission --systems ...,haproxy`).
    pub system: String,
    /// `trace`: workload name, e.g. `"single"` (16 KB file), `"zipf"`, `"worldcup"`.
    pub trace: String,
    /// `clients`: number of closed-loop clients (the load, x axis of Fig. 5); 0 in the
    /// open loop (see `rate_rps`).
    pub clients: u64,
    /// `limit`: the admission limit of this point (`lab admission --limits`); absent for
    /// `no-ac`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// `transport`: how the proxy read back-end load: `"none"` for no-ac,
    /// else `"tcp"`, `"udp-xdp"`, `"udp-user"`, `"shm"`, ...
    pub transport: String,
    /// `avg_ms`: mean response time of served requests, ms.
    pub avg_ms: f64,
    /// `p50_ms`: median response time, ms.
    pub p50_ms: f64,
    /// `p90_ms`: 90th percentile response time, ms.
    pub p90_ms: f64,
    /// `p99_ms`: 99th percentile response time, ms.
    pub p99_ms: f64,
    /// `max_ms`: largest response time, ms.
    pub max_ms: f64,
    /// `tps`: served requests per second over the measured window.
    pub tps: f64,
    /// `drop_rate`: fraction (0..=1) of attempts refused by admission control
    /// or by the back-end (`dropped / attempts`).
    pub drop_rate: f64,
    /// `slow_rate`: fraction (0..=1) of served requests slower than the QoS
    /// threshold (`params.slow_ms` or `params.qos_ms`; the paper uses 1 s) — Fig. 9.
    pub slow_rate: f64,
    /// `attempts`: requests the clients tried to send.
    pub attempts: u64,
    /// `served`: requests answered successfully.
    pub served: u64,
    /// `dropped`: requests refused (503 from admission control or a full backlog).
    pub dropped: u64,
    /// `failures`: requests that failed otherwise (timeouts, resets, bad replies).
    pub failures: u64,
    /// `runs`: repetitions this point averages (`lab admission --repeat`); rates and
    /// times are means over the runs, counts are sums, `max_ms` the largest.
    #[serde(default = "one")]
    pub runs: u64,
    /// `avg_ms_sd`: sample standard deviation of `avg_ms` across runs (0 for one run).
    #[serde(default)]
    pub avg_ms_sd: f64,
    /// `tps_sd`: sample standard deviation of `tps` across runs (0 for one run).
    #[serde(default)]
    pub tps_sd: f64,
    /// `p99_ms_sd`: sample standard deviation of `p99_ms` across runs (0 for one run).
    #[serde(default)]
    pub p99_ms_sd: f64,
    /// `drop_rate_sd`: sample standard deviation of `drop_rate` across runs.
    #[serde(default)]
    pub drop_rate_sd: f64,
    /// `slow_rate_sd`: sample standard deviation of `slow_rate` across runs.
    #[serde(default)]
    pub slow_rate_sd: f64,
    /// `monitor_read_p50_us`: median round trip of the proxy's load reads during the
    /// point (its embedded monitor, every G), µs; absent for `no-ac`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor_read_p50_us: Option<f64>,
    /// `monitor_read_p99_us`: 99th percentile of those reads, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor_read_p99_us: Option<f64>,
    /// `update_gap_p99_ms`: 99th percentile of the time between two reads that each found
    /// a new load record (how stale the proxy's view gets), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_gap_p99_ms: Option<f64>,
    /// `proxy_queue_ms`: where served time went, part 1: mean wait in the proxy for a
    /// back-end connection slot, ms. HAProxy: its `qtime` (its own average over its last
    /// 1024 requests, read at the point's end); farside: the point's
    /// `farside_proxy_upstream_wait_microseconds_total` over `_checkouts_total` (every
    /// request that asked for an upstream connection, served or refused at the queue
    /// timeout). With `multi-proxy`, the first proxy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_queue_ms: Option<f64>,
    /// `proxy_time_ms`: mean time the proxy held a served request, head to end of
    /// response (its queue plus the back-end), ms. farside: the point's
    /// `farside_proxy_request_duration_seconds`; HAProxy: `qtime + ctime + rtime`.
    /// With `multi-proxy`, the first proxy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_time_ms: Option<f64>,
    /// `backend_queue_ms`: where served time went, part 2: mean of the back-ends'
    /// published queueing delay (the age of the oldest unread request, gatherd's
    /// `queue_delay_us`), every new reading of every back-end during the point, ms. The
    /// same measurement for every system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_queue_ms: Option<f64>,
    /// `backend_queue_p99_ms`: 99th percentile of those readings, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_queue_p99_ms: Option<f64>,
    /// `backend_cpu_busy`: where the back-end tier's CPU went, part 1: fraction (0..=1) of
    /// the back-end tier's CPUs not idle during the measured window (`/proc/stat`: all but
    /// idle and iowait; softirq included, whoever's packets it handled). Below 1 under
    /// overload means the admitted work left the back-ends' CPU idle part of the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_cpu_busy: Option<f64>,
    /// `backend_softirq`: fraction (0..=1) of the back-end tier's CPUs spent in softirq
    /// and irq during the window: packet processing, counted on the CPU the lab steers
    /// the back-end nodes' packets to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_softirq: Option<f64>,
    /// `backend_cpu_us_per_served`: busy time of the back-end tier's CPUs per served
    /// request, µs: what one served request cost the bottleneck, web server, kernel and
    /// whatever else ran there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_cpu_us_per_served: Option<f64>,
    /// `backend_conns_per_served`: TCP connections the back-ends accepted (their
    /// namespaces' `PassiveOpens`) per served request: 1 when every request comes on a
    /// new upstream connection, near 0 when the proxy reuses kept-alive ones. `--hosts
    /// netns` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_conns_per_served: Option<f64>,
    /// `front_cpu_busy`: fraction (0..=1) of the front tier's CPUs (proxies and clients)
    /// not idle during the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub front_cpu_busy: Option<f64>,
    /// `proxy_cpu_us_per_attempt`: CPU time of the proxy node's cgroup (every proxy of
    /// the point, user and system) per attempt the clients made (served or refused), µs.
    /// It shares the front CPUs with the clients. `--hosts netns` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_cpu_us_per_attempt: Option<f64>,
    /// `scenario`: what the data-center looked like (`lab admission --scenario`: `single`,
    /// `multi-proxy`, `tenant-load`, `mixed-cost`, `capacity-change`); `single` for runs
    /// kept by an older lab.
    #[serde(default = "single")]
    pub scenario: String,
    /// `load_model`: `closed` (a fixed number of clients, `clients`) or `open` (Poisson
    /// arrivals at `rate_rps`; users leave on rejection); `closed` for older runs.
    #[serde(default = "closed")]
    pub load_model: String,
    /// `rate_x`: open loop: offered arrival rate as a multiple of the capacity
    /// (`params.capacity_rps`, `lab admission --rates`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_x: Option<f64>,
    /// `rate_rps`: open loop: the arrival rate asked of the clients, requests/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_rps: Option<f64>,
    /// `offered_rps`: requests started per second of measured time (closed loop: what the
    /// clients managed to send).
    #[serde(default)]
    pub offered_rps: f64,
    /// `goodput`: served requests per second of measured time (= `tps`).
    #[serde(default)]
    pub goodput: f64,
    /// `reject_p99_ms`: 99th percentile time to a 503, ms (0 without rejections).
    #[serde(default)]
    pub reject_p99_ms: f64,
    /// `inflight_at_end`: requests still in flight when the measured window ended (in no
    /// other count; summed over runs).
    #[serde(default)]
    pub inflight_at_end: u64,
    /// The loadgen's own summary of the run (histograms included), kept in `points.jsonl`
    /// so that repeats merge exactly ([`farside_loadgen::Summary::merge`]: p99 of the
    /// pooled requests, not a mean of p99s). Not in `summary.json`.
    #[serde(skip_serializing, default)]
    pub loadgen: Option<farside_loadgen::Summary>,
    /// Per-second series (Fig. 6/7). Not written to `summary.json`: the
    /// report writes it to `series-<system>-<trace>-<clients>.csv`.
    #[serde(skip_serializing, default)]
    pub series: Vec<SecondPoint>,
    /// Served requests of the run, `(start s, response time ms)`, evenly thinned to at
    /// most `admission::REQUEST_SAMPLES_MAX` (Fig. 6's scatter). Kept in `points.jsonl`,
    /// not in `summary.json`.
    #[serde(skip_serializing, default)]
    pub requests: Vec<(f64, f64)>,
    /// `classes`: per request class, as the clients measured it (`mixed-cost`;
    /// `crate::scenario::class_breakdown`). Absent in runs that predate it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<crate::scenario::ClassBreakdown>,
}

fn one() -> u64 {
    1
}

fn single() -> String {
    "single".into()
}

fn closed() -> String {
    "closed".into()
}

/// Mean of the runs that have a value; `None` if none has.
fn mean_some(runs: &[Point], f: fn(&Point) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = runs.iter().filter_map(f).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

impl Point {
    /// The columns of `points.csv`, in order; [`Point::csv_row`] gives a point's values.
    pub const CSV_COLUMNS: [&'static str; 34] = [
        "system",
        "trace",
        "clients",
        "transport",
        "avg_ms",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "max_ms",
        "tps",
        "drop_rate",
        "slow_rate",
        "attempts",
        "served",
        "dropped",
        "failures",
        "monitor_read_p50_us",
        "monitor_read_p99_us",
        "update_gap_p99_ms",
        "limit",
        "runs",
        "avg_ms_sd",
        "tps_sd",
        "p99_ms_sd",
        "drop_rate_sd",
        "slow_rate_sd",
        "scenario",
        "load_model",
        "rate_x",
        "rate_rps",
        "offered_rps",
        "goodput",
        "reject_p99_ms",
        "inflight_at_end",
    ];

    /// The point's row of `points.csv` (absent monitor figures, limits and rates are
    /// empty fields).
    pub fn csv_row(&self) -> [String; 34] {
        let p = self;
        let opt = |v: Option<f64>| v.map(|x| x.to_string()).unwrap_or_default();
        [
            p.system.clone(),
            p.trace.clone(),
            p.clients.to_string(),
            p.transport.clone(),
            p.avg_ms.to_string(),
            p.p50_ms.to_string(),
            p.p90_ms.to_string(),
            p.p99_ms.to_string(),
            p.max_ms.to_string(),
            p.tps.to_string(),
            p.drop_rate.to_string(),
            p.slow_rate.to_string(),
            p.attempts.to_string(),
            p.served.to_string(),
            p.dropped.to_string(),
            p.failures.to_string(),
            opt(p.monitor_read_p50_us),
            opt(p.monitor_read_p99_us),
            opt(p.update_gap_p99_ms),
            p.limit.map(|l| l.to_string()).unwrap_or_default(),
            p.runs.to_string(),
            p.avg_ms_sd.to_string(),
            p.tps_sd.to_string(),
            p.p99_ms_sd.to_string(),
            p.drop_rate_sd.to_string(),
            p.slow_rate_sd.to_string(),
            p.scenario.clone(),
            p.load_model.clone(),
            opt(p.rate_x),
            opt(p.rate_rps),
            p.offered_rps.to_string(),
            p.goodput.to_string(),
            p.reject_p99_ms.to_string(),
            p.inflight_at_end.to_string(),
        ]
    }

    /// The x value of the point's load: `clients` in the closed loop, the asked arrival
    /// rate (requests/s, rounded) in the open loop.
    pub fn load_x(&self) -> u64 {
        match self.rate_rps {
            Some(r) if self.load_model == "open" => r.round() as u64,
            _ => self.clients,
        }
    }

    /// The group of points a table or figure shows together: the trace, with the
    /// scenario and load model when they are not the default `single`/`closed`.
    pub fn panel(&self) -> String {
        let plain = matches!(self.scenario.as_str(), "" | "single")
            && matches!(self.load_model.as_str(), "" | "closed");
        if plain {
            self.trace.clone()
        } else {
            format!("{}-{}-{}", self.trace, self.scenario, self.load_model)
        }
    }

    /// Set the figures that come from the loadgen's summary `s` (times, rates, counts),
    /// keeping `s` for exact merging of repeats.
    pub fn fill_from_loadgen(&mut self, s: &farside_loadgen::Summary) {
        self.avg_ms = s.avg_ms;
        self.p50_ms = s.p50_ms;
        self.p90_ms = s.p90_ms;
        self.p99_ms = s.p99_ms;
        self.max_ms = s.max_ms;
        self.tps = s.tps;
        self.goodput = s.goodput_rps;
        self.offered_rps = s.offered_rps;
        self.drop_rate = s.drop_rate;
        self.slow_rate = s.slow_rate;
        self.attempts = s.attempts;
        self.served = s.served;
        self.dropped = s.dropped_503;
        self.failures = s.failures;
        self.reject_p99_ms = s.reject_p99_ms;
        self.inflight_at_end = s.inflight_at_end;
        let mut kept = s.clone();
        // The series is the point's own (`series`); the kept summary needs only counts and
        // histograms.
        kept.series.clear();
        self.loadgen = Some(kept);
    }

    /// Combine repetitions of one point: means of times and rates, sums of counts, the
    /// largest max, standard deviations of `avg_ms` and `tps`, the first run's series.
    /// When every run kept its loadgen summary, times, percentiles and rates come from
    /// their exact merge ([`farside_loadgen::Summary::merge`]) instead of means.
    pub fn combine(runs: &[Point]) -> Point {
        let mut out = Self::combine_means(runs);
        let kept: Option<Vec<farside_loadgen::Summary>> =
            runs.iter().map(|p| p.loadgen.clone()).collect();
        if let Some(kept) = kept.filter(|k| k.len() > 1) {
            match farside_loadgen::Summary::merge(&kept) {
                Ok(m) => {
                    let series = std::mem::take(&mut out.series);
                    out.fill_from_loadgen(&m);
                    out.series = series;
                }
                Err(e) => log::warn!("lab: repeats of a point not merged exactly: {e}"),
            }
        }
        out
    }

    fn combine_means(runs: &[Point]) -> Point {
        let n = runs.len().max(1) as f64;
        let mean = |f: fn(&Point) -> f64| runs.iter().map(f).sum::<f64>() / n;
        let sd = |f: fn(&Point) -> f64| {
            if runs.len() < 2 {
                return 0.0;
            }
            let m = mean(f);
            (runs.iter().map(|p| (f(p) - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        };
        let Some(first) = runs.first() else {
            return Point::default();
        };
        Point {
            avg_ms: mean(|p| p.avg_ms),
            p50_ms: mean(|p| p.p50_ms),
            p90_ms: mean(|p| p.p90_ms),
            p99_ms: mean(|p| p.p99_ms),
            max_ms: runs.iter().map(|p| p.max_ms).fold(0.0, f64::max),
            tps: mean(|p| p.tps),
            drop_rate: mean(|p| p.drop_rate),
            slow_rate: mean(|p| p.slow_rate),
            attempts: runs.iter().map(|p| p.attempts).sum(),
            served: runs.iter().map(|p| p.served).sum(),
            dropped: runs.iter().map(|p| p.dropped).sum(),
            failures: runs.iter().map(|p| p.failures).sum(),
            runs: runs.len() as u64,
            avg_ms_sd: sd(|p| p.avg_ms),
            tps_sd: sd(|p| p.tps),
            p99_ms_sd: sd(|p| p.p99_ms),
            drop_rate_sd: sd(|p| p.drop_rate),
            slow_rate_sd: sd(|p| p.slow_rate),
            monitor_read_p50_us: mean_some(runs, |p| p.monitor_read_p50_us),
            monitor_read_p99_us: mean_some(runs, |p| p.monitor_read_p99_us),
            update_gap_p99_ms: mean_some(runs, |p| p.update_gap_p99_ms),
            proxy_queue_ms: mean_some(runs, |p| p.proxy_queue_ms),
            proxy_time_ms: mean_some(runs, |p| p.proxy_time_ms),
            backend_queue_ms: mean_some(runs, |p| p.backend_queue_ms),
            backend_queue_p99_ms: mean_some(runs, |p| p.backend_queue_p99_ms),
            backend_cpu_busy: mean_some(runs, |p| p.backend_cpu_busy),
            backend_softirq: mean_some(runs, |p| p.backend_softirq),
            backend_cpu_us_per_served: mean_some(runs, |p| p.backend_cpu_us_per_served),
            backend_conns_per_served: mean_some(runs, |p| p.backend_conns_per_served),
            front_cpu_busy: mean_some(runs, |p| p.front_cpu_busy),
            proxy_cpu_us_per_attempt: mean_some(runs, |p| p.proxy_cpu_us_per_attempt),
            offered_rps: mean(|p| p.offered_rps),
            goodput: mean(|p| p.goodput),
            reject_p99_ms: mean(|p| p.reject_p99_ms),
            inflight_at_end: runs.iter().map(|p| p.inflight_at_end).sum(),
            classes: crate::scenario::combine_breakdowns(runs.iter().map(|p| &p.classes[..])),
            ..first.clone()
        }
    }
}

/// One second of an admission run, for the time-series plots (Fig. 6/7).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SecondPoint {
    /// `t_s`: seconds since the start of the measured window.
    pub t_s: u64,
    /// `served`: requests served during this second.
    pub served: u64,
    /// `dropped`: requests dropped during this second.
    pub dropped: u64,
    /// `avg_ms`: mean response time of the requests served in this second, ms
    /// (0 when none was served).
    pub avg_ms: f64,
}

impl SecondPoint {
    /// Fraction (0..=1) of this second's finished attempts that were dropped.
    pub fn drop_rate(&self) -> f64 {
        let total = self.served + self.dropped;
        if total == 0 {
            0.0
        } else {
            self.dropped as f64 / total as f64
        }
    }
}

/// What an admission run keeps in `points.jsonl` beside its point.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct AdmissionExtra {
    /// Per-second series of an admission point.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<SecondPoint>,
    /// Thinned per-request samples of an admission point (Fig. 6).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<(f64, f64)>,
    /// The loadgen's summary of an admission run (histograms for exact merging).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loadgen: Option<farside_loadgen::Summary>,
}

impl LabPoint for Point {
    type Extra = AdmissionExtra;

    fn take_extra(&mut self) -> AdmissionExtra {
        AdmissionExtra {
            series: std::mem::take(&mut self.series),
            requests: std::mem::take(&mut self.requests),
            loadgen: self.loadgen.take(),
        }
    }

    fn put_extra(&mut self, extra: AdmissionExtra) {
        self.series = extra.series;
        self.requests = extra.requests;
        self.loadgen = extra.loadgen;
    }

    fn combine(runs: &[Point]) -> Point {
        Point::combine(runs)
    }

    fn progress_line(&self) -> String {
        let monitor = match (self.monitor_read_p99_us, self.update_gap_p99_ms) {
            (Some(r), Some(g)) => format!(" read-p99={r:.0}us gap-p99={g:.1}ms"),
            _ => String::new(),
        };
        format!(
            "avg={:>8.1} ms p99={:>8.1} ms tps={:>7.1} drop={:>5.1}% slow={:>5.1}%{monitor}",
            self.avg_ms,
            self.p99_ms,
            self.tps,
            100.0 * self.drop_rate,
            100.0 * self.slow_rate
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::Summary;

    fn admission() -> Point {
        Point {
            system: SYSTEM_TCP_AC.into(),
            trace: "zipf".into(),
            clients: 240,
            transport: "tcp".into(),
            avg_ms: 12.5,
            p50_ms: 10.0,
            p90_ms: 20.0,
            p99_ms: 40.0,
            max_ms: 90.0,
            tps: 1000.0,
            drop_rate: 0.1,
            slow_rate: 0.01,
            attempts: 1100,
            served: 990,
            dropped: 110,
            failures: 0,
            runs: 1,
            avg_ms_sd: 0.0,
            tps_sd: 0.0,
            p99_ms_sd: 0.0,
            drop_rate_sd: 0.0,
            slow_rate_sd: 0.0,
            monitor_read_p50_us: Some(30.0),
            monitor_read_p99_us: Some(900.0),
            update_gap_p99_ms: Some(2.5),
            limit: Some(16),
            requests: vec![(0.25, 3.0)],
            series: vec![SecondPoint {
                t_s: 0,
                served: 10,
                dropped: 1,
                avg_ms: 3.0,
            }],
            scenario: "single".into(),
            load_model: "closed".into(),
            ..Point::default()
        }
    }

    #[test]
    fn a_point_round_trips_through_summary_json_without_its_series() {
        let mut s = Summary::new("admission", "netns", true);
        s.push(admission());
        let back: Summary<Point> = Summary::from_json(&s.to_json_pretty()).unwrap();
        let mut no_series = admission();
        no_series.series.clear();
        no_series.requests.clear();
        assert_eq!(back.points, vec![no_series]);
    }

    #[test]
    fn series_is_not_in_summary_json() {
        let mut s = Summary::new("admission", "netns", false);
        s.push(admission());
        let v: serde_json::Value = serde_json::from_str(&s.to_json_pretty()).unwrap();
        assert!(v["points"][0].get("series").is_none());
    }

    #[test]
    fn stable_keys_are_present() {
        let mut s = Summary::new("admission", "netns", false);
        s.push(admission());
        let v: serde_json::Value = serde_json::from_str(&s.to_json_pretty()).unwrap();
        // The first columns of points.csv are the point's required keys.
        for k in &Point::CSV_COLUMNS[..16] {
            assert!(v["points"][0].get(k).is_some(), "missing point key {k}");
        }
    }

    #[test]
    fn second_drop_rate_handles_an_empty_second() {
        assert_eq!(SecondPoint::default().drop_rate(), 0.0);
        let s = SecondPoint {
            t_s: 1,
            served: 3,
            dropped: 1,
            avg_ms: 1.0,
        };
        assert_eq!(s.drop_rate(), 0.25);
    }

    /// A loadgen summary of `n` requests served in 1 s, each taking `ms`.
    fn loadgen_run(n: u64, ms: u64) -> farside_loadgen::Summary {
        use farside_loadgen::summary::{encode_hist, new_latency_hist};
        let mut h = new_latency_hist();
        h.record_n(ms * 1000, n).unwrap();
        farside_loadgen::Summary {
            runs: 1,
            served: n,
            attempts: n,
            started: n,
            avg_ms: ms as f64,
            p99_ms: ms as f64,
            duration_s: 1.0,
            tps: n as f64,
            latency_hist_v2: encode_hist(&h),
            reject_latency_hist_v2: encode_hist(&new_latency_hist()),
            ..Default::default()
        }
    }

    #[test]
    fn repeats_with_loadgen_summaries_merge_percentiles_exactly() {
        let run = |n, ms| {
            let mut p = admission();
            p.fill_from_loadgen(&loadgen_run(n, ms));
            p
        };
        // 990 fast requests in one run, 10 slow ones in the other: the pooled p99 is the
        // fast one; a mean of the two runs' p99s would be ~50 ms.
        let c = Point::combine(&[run(990, 1), run(10, 100)]);
        assert!((c.p99_ms - 1.0).abs() < 0.01, "exact p99: {}", c.p99_ms);
        assert_eq!((c.served, c.runs), (1000, 2));
        assert!(
            (c.goodput - 500.0).abs() < 1e-9,
            "served / summed time: {}",
            c.goodput
        );
        assert!((c.avg_ms - 1.99).abs() < 1e-9, "{}", c.avg_ms);
        // The spread across runs is still reported.
        assert!(c.p99_ms_sd > 50.0, "{}", c.p99_ms_sd);
        // Without kept summaries (older runs): means, as before.
        let mut a = admission();
        let mut b = admission();
        a.p99_ms = 10.0;
        b.p99_ms = 30.0;
        assert_eq!(Point::combine(&[a, b]).p99_ms, 20.0);
    }

    #[test]
    fn repeated_runs_combine_to_means_sums_and_spread() {
        let a = Point {
            avg_ms: 10.0,
            tps: 100.0,
            served: 5,
            max_ms: 30.0,
            ..admission()
        };
        let b = Point {
            avg_ms: 20.0,
            tps: 300.0,
            served: 7,
            max_ms: 50.0,
            monitor_read_p99_us: Some(1100.0),
            update_gap_p99_ms: None,
            ..admission()
        };
        let c = Point::combine(&[a.clone(), b]);
        assert_eq!(
            (c.avg_ms, c.tps, c.served, c.max_ms, c.runs),
            (15.0, 200.0, 12, 50.0, 2)
        );
        // Monitor figures: means of the runs that have them.
        assert_eq!(
            (c.monitor_read_p99_us, c.update_gap_p99_ms),
            (Some(1000.0), Some(2.5))
        );
        assert!(
            (c.avg_ms_sd - 50f64.sqrt()).abs() < 1e-9,
            "sample sd: {}",
            c.avg_ms_sd
        );
        let one = Point::combine(&[a]);
        assert_eq!((one.runs, one.avg_ms_sd), (1, 0.0));
        // Older summaries without the keys read as one run.
        let json = serde_json::to_string(&admission())
            .unwrap()
            .replace(",\"runs\":1", "");
        let p: Point = serde_json::from_str(&json).unwrap();
        assert_eq!(p.runs, 1);
    }
}
