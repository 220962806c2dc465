//! The stable result format of a `farside lab` run: `summary.json`.
//!
//! One [`Summary`] per experiment run. Its JSON key names are a public,
//! stable interface: scripts, notebooks and the HTML report read them. Add
//! keys freely; never rename or remove one.
//!
//! `points` holds one record per measured configuration. Two kinds exist and
//! share the one list ([`AnyPoint`], serialized untagged, so a point is a flat
//! JSON object whose keys say what it is):
//!
//! - [`Point`] — an admission-control run (seed 000): one system × trace ×
//!   client count, with response-time percentiles, TPS, drop and slow rates.
//! - [`ProbePoint`] — a remote-read latency probe: one transport ×
//!   background load × read size, with latency percentiles in µs.
//!
//! A point's per-second [`Point::series`] is **not** part of `summary.json`:
//! it can be thousands of rows per point, so the report writes it to
//! `series-<system>-<trace>-<clients>.csv` instead (see `report::write_all`).
//! Deserializing a `summary.json` therefore yields empty series.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Name of the baseline system without admission control.
pub const SYSTEM_NO_AC: &str = "no-ac";
/// Name of the system with two-sided (TCP) load reads feeding admission control.
pub const SYSTEM_TCP_AC: &str = "tcp-ac";
/// Name of the system with one-sided load reads feeding admission control.
pub const SYSTEM_ONESIDED_AC: &str = "onesided-ac";
/// The three systems of the paper's comparison, in the order tables and plots show them.
pub const SYSTEMS: [&str; 3] = [SYSTEM_NO_AC, SYSTEM_TCP_AC, SYSTEM_ONESIDED_AC];

/// One experiment run, as written to `summary.json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Summary {
    /// `experiment`: experiment name, e.g. `"admission"` or `"probe"`.
    pub experiment: String,
    /// `hosts`: how the data-center was built, e.g. `"netns"` (virtual
    /// nodes in network namespaces on one machine) or a host list.
    pub hosts: String,
    /// `quick`: true for a shortened run (fewer loads, shorter durations);
    /// its numbers are for smoke-testing, not for comparison with the paper.
    pub quick: bool,
    /// `started_unix_s`: wall-clock start of the run, seconds since the Unix epoch.
    pub started_unix_s: u64,
    /// `duration_s`: wall-clock length of the whole run, seconds.
    pub duration_s: f64,
    /// `params`: the run's parameters (durations, think time, sample and
    /// monitor periods, thresholds, ...) as a free-form JSON object.
    pub params: serde_json::Value,
    /// `points`: one record per measured configuration; see [`AnyPoint`].
    pub points: Vec<AnyPoint>,
    /// `notes`: free-text remarks (fallbacks taken, warnings, caveats).
    pub notes: Vec<String>,
    /// `finished`: false while the sweep runs or after it broke off (`--resume DIR`
    /// continues it); true once every point was measured.
    #[serde(default)]
    pub finished: bool,
    /// `commit`: the commit the binary was built from (compiled in), else `git rev-parse
    /// HEAD` of its source tree; `null` when neither is known.
    #[serde(default)]
    pub commit: Option<String>,
    /// `commit_dirty`: the tree had uncommitted changes to tracked files
    /// (`git status --porcelain --untracked-files=no`), read at run time: `null` when the
    /// tree has moved past the build's commit since (then unknown).
    #[serde(default)]
    pub commit_dirty: Option<bool>,
    /// `kernel`: `uname -r` of the machine that ran the sweep.
    #[serde(default)]
    pub kernel: String,
    /// `cpu_model`: the first `model name` of `/proc/cpuinfo` (`"unknown"` without one).
    #[serde(default)]
    pub cpu_model: String,
    /// `cpus`: CPUs this process may run on.
    #[serde(default)]
    pub cpus: usize,
    /// `seed`: seed of the workload samplers (`--seed`; repeat `r` uses `seed + r`);
    /// `null` for experiments without randomness.
    #[serde(default)]
    pub seed: Option<u64>,
    /// `settings`: settings that need privileges or a particular host, each with what was
    /// asked for and whether it took effect (see [`Setting`]); a run whose settings were
    /// not all applied says so here and in a warning on stderr.
    #[serde(default)]
    pub settings: BTreeMap<String, Setting>,
}

/// A setting that needs privileges (or a host feature), as asked for and as applied.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Setting {
    /// `requested`: the value asked for (flag or default).
    pub requested: serde_json::Value,
    /// `applied`: whether it took effect.
    pub applied: bool,
    /// `reason`: why it was not applied (or how it was), `null` when applied as asked.
    #[serde(default)]
    pub reason: Option<String>,
}

impl Setting {
    /// A setting applied as requested.
    pub fn applied(requested: impl Into<serde_json::Value>) -> Setting {
        Setting {
            requested: requested.into(),
            applied: true,
            reason: None,
        }
    }

    /// A setting that was not applied, and why.
    pub fn not_applied(requested: impl Into<serde_json::Value>, reason: &str) -> Setting {
        Setting {
            requested: requested.into(),
            applied: false,
            reason: Some(reason.to_string()),
        }
    }
}

/// One element of [`Summary::points`]: either kind, told apart by its keys.
///
/// Serialized untagged: an admission point is recognised by its required
/// keys (`system`, `trace`, `clients`, `avg_ms`, ...), a probe point by its
/// own (`transport`, `background_load`, `size_bytes`, `p50_us`, ...), a fault row by
/// `fault`, `started`, `answered`, `hung`, ...
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
// A run holds hundreds of points at most: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum AnyPoint {
    /// An admission-control measurement.
    Admission(Point),
    /// A remote-read latency probe measurement.
    Probe(ProbePoint),
    /// What the clients saw during one injected fault (`lab faults`).
    Fault(crate::faults::FaultRow),
    /// One system, scenario and burst length of `lab reconfig` (recognised by
    /// `scenario`, `burst`, `moves`, `lab_moves`, ...; last, so it never shadows the
    /// kinds above).
    Reconfig(crate::reconfig::ReconfigPoint),
    /// One experiment, system, split and offered rate of `lab speculative` (recognised
    /// by `split`, `conn_per_s`, `migrations`, ...; after the kinds above).
    Speculative(crate::speculative::SpecPoint),
}

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
            offered_rps: mean(|p| p.offered_rps),
            goodput: mean(|p| p.goodput),
            reject_p99_ms: mean(|p| p.reject_p99_ms),
            inflight_at_end: runs.iter().map(|p| p.inflight_at_end).sum(),
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

/// One remote-read latency measurement: one transport, background load and size.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ProbePoint {
    /// `transport`: `"tcp"`, `"udp-xdp"`, `"udp-user"`, `"shm"`, ...
    pub transport: String,
    /// `background_load`: CPU-busy processes running on the read node.
    pub background_load: u64,
    /// `size_bytes`: bytes read per request.
    pub size_bytes: u64,
    /// `samples`: number of completed reads measured.
    pub samples: u64,
    /// `p50_us`: median read round trip, µs.
    pub p50_us: f64,
    /// `p99_us`: 99th percentile round trip, µs.
    pub p99_us: f64,
    /// `p999_us`: 99.9th percentile round trip, µs.
    pub p999_us: f64,
    /// `max_us`: largest round trip, µs.
    pub max_us: f64,
    /// `timeouts`: reads that got no reply within the timeout. They are in `samples` and
    /// in the percentiles, counted as taking the whole timeout.
    pub timeouts: u64,
    /// `runs`: repetitions this point averages (`lab probe --repeat`).
    #[serde(default = "one")]
    pub runs: u64,
    /// `p50_us_sd`: sample standard deviation of `p50_us` across runs (0 for one run).
    #[serde(default)]
    pub p50_us_sd: f64,
    /// `p99_us_sd`: sample standard deviation of `p99_us` across runs (0 for one run).
    #[serde(default)]
    pub p99_us_sd: f64,
}

/// Sample standard deviation of `v` (0 for fewer than two values).
fn sd_of(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
}

impl ProbePoint {
    /// Combine repetitions: means of the percentiles, sums of the counts, the largest
    /// max, and the spread of p50 and p99.
    pub fn combine(runs: &[ProbePoint]) -> ProbePoint {
        let Some(first) = runs.first() else {
            return ProbePoint::default();
        };
        let n = runs.len() as f64;
        let mean = |f: fn(&ProbePoint) -> f64| runs.iter().map(f).sum::<f64>() / n;
        let vals = |f: fn(&ProbePoint) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
        ProbePoint {
            samples: runs.iter().map(|p| p.samples).sum(),
            p50_us: mean(|p| p.p50_us),
            p99_us: mean(|p| p.p99_us),
            p999_us: mean(|p| p.p999_us),
            max_us: runs.iter().map(|p| p.max_us).fold(0.0, f64::max),
            timeouts: runs.iter().map(|p| p.timeouts).sum(),
            runs: runs.len() as u64,
            p50_us_sd: sd_of(&vals(|p| p.p50_us)),
            p99_us_sd: sd_of(&vals(|p| p.p99_us)),
            ..first.clone()
        }
    }
}

impl AnyPoint {
    /// Combine repetitions of one point (all of one kind; a mixed list keeps the first
    /// kind's runs only).
    pub fn combine(runs: &[AnyPoint]) -> AnyPoint {
        match runs.first() {
            Some(AnyPoint::Probe(_)) => AnyPoint::Probe(ProbePoint::combine(
                &runs
                    .iter()
                    .filter_map(|p| match p {
                        AnyPoint::Probe(p) => Some(p.clone()),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            )),
            Some(AnyPoint::Fault(_)) => AnyPoint::Fault(crate::faults::FaultRow::combine(
                &runs
                    .iter()
                    .filter_map(|p| match p {
                        AnyPoint::Fault(p) => Some(p.clone()),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            )),
            Some(AnyPoint::Reconfig(_)) => {
                AnyPoint::Reconfig(crate::reconfig::ReconfigPoint::combine(
                    &runs
                        .iter()
                        .filter_map(|p| match p {
                            AnyPoint::Reconfig(p) => Some(p.clone()),
                            _ => None,
                        })
                        .collect::<Vec<_>>(),
                ))
            }
            Some(AnyPoint::Speculative(_)) => {
                AnyPoint::Speculative(crate::speculative::SpecPoint::combine(
                    &runs
                        .iter()
                        .filter_map(|p| match p {
                            AnyPoint::Speculative(p) => Some(p.clone()),
                            _ => None,
                        })
                        .collect::<Vec<_>>(),
                ))
            }
            _ => AnyPoint::Admission(Point::combine(
                &runs
                    .iter()
                    .filter_map(|p| match p {
                        AnyPoint::Admission(p) => Some(p.clone()),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            )),
        }
    }

    /// The point's figures on one line, for progress output.
    pub fn progress_line(&self) -> String {
        match self {
            AnyPoint::Admission(p) => {
                let monitor = match (p.monitor_read_p99_us, p.update_gap_p99_ms) {
                    (Some(r), Some(g)) => format!(" read-p99={r:.0}us gap-p99={g:.1}ms"),
                    _ => String::new(),
                };
                format!(
                    "avg={:>8.1} ms p99={:>8.1} ms tps={:>7.1} drop={:>5.1}% slow={:>5.1}%{monitor}",
                    p.avg_ms,
                    p.p99_ms,
                    p.tps,
                    100.0 * p.drop_rate,
                    100.0 * p.slow_rate
                )
            }
            AnyPoint::Probe(p) => format!(
                "p50={:>8.1} µs p99={:>8.1} µs p99.9={:>8.1} µs timeouts={}",
                p.p50_us, p.p99_us, p.p999_us, p.timeouts
            ),
            AnyPoint::Fault(r) => format!(
                "answered={} refused={} failed={} hung={} fresh after {}",
                r.answered,
                r.refused_503,
                r.failed,
                r.hung,
                r.time_to_fresh_ms
                    .map_or("never".to_string(), |v| format!("{v:.0} ms"))
            ),
            AnyPoint::Reconfig(p) => p.progress_line(),
            AnyPoint::Speculative(p) => p.progress_line(),
        }
    }
}

impl From<Point> for AnyPoint {
    fn from(p: Point) -> Self {
        AnyPoint::Admission(p)
    }
}

impl From<ProbePoint> for AnyPoint {
    fn from(p: ProbePoint) -> Self {
        AnyPoint::Probe(p)
    }
}

impl Summary {
    /// An empty summary started now, with `params` an empty JSON object.
    pub fn new(experiment: &str, hosts: &str, quick: bool) -> Summary {
        let started_unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Summary {
            experiment: experiment.to_string(),
            hosts: hosts.to_string(),
            quick,
            started_unix_s,
            duration_s: 0.0,
            params: serde_json::Value::Object(serde_json::Map::new()),
            points: Vec::new(),
            notes: Vec::new(),
            finished: false,
            commit: None,
            commit_dirty: None,
            kernel: String::new(),
            cpu_model: String::new(),
            cpus: 0,
            seed: None,
            settings: BTreeMap::new(),
        }
    }

    /// Appends a point of either kind.
    pub fn push(&mut self, p: impl Into<AnyPoint>) {
        self.points.push(p.into());
    }

    /// The admission-control points, in insertion order.
    pub fn admission_points(&self) -> impl Iterator<Item = &Point> {
        self.points.iter().filter_map(|p| match p {
            AnyPoint::Admission(p) => Some(p),
            _ => None,
        })
    }

    /// The probe points, in insertion order.
    pub fn probe_points(&self) -> impl Iterator<Item = &ProbePoint> {
        self.points.iter().filter_map(|p| match p {
            AnyPoint::Probe(p) => Some(p),
            _ => None,
        })
    }

    /// The fault rows (`lab faults`), in insertion order.
    pub fn fault_rows(&self) -> impl Iterator<Item = &crate::faults::FaultRow> {
        self.points.iter().filter_map(|p| match p {
            AnyPoint::Fault(r) => Some(r),
            _ => None,
        })
    }

    /// The `lab reconfig` points, in insertion order.
    pub fn reconfig_points(&self) -> impl Iterator<Item = &crate::reconfig::ReconfigPoint> {
        self.points.iter().filter_map(|p| match p {
            AnyPoint::Reconfig(p) => Some(p),
            _ => None,
        })
    }

    /// The `lab speculative` points, in insertion order.
    pub fn speculative_points(&self) -> impl Iterator<Item = &crate::speculative::SpecPoint> {
        self.points.iter().filter_map(|p| match p {
            AnyPoint::Speculative(p) => Some(p),
            _ => None,
        })
    }

    /// `summary.json` text: pretty-printed, keys in declaration order, no series.
    pub fn to_json_pretty(&self) -> String {
        // Serializing plain structs, Strings, numbers and a Value cannot fail.
        serde_json::to_string_pretty(self).expect("Summary serializes")
    }

    /// Parses `summary.json` text. Series come back empty (they live in CSV files).
    pub fn from_json(text: &str) -> serde_json::Result<Summary> {
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn probe() -> ProbePoint {
        ProbePoint {
            transport: "udp-xdp".into(),
            background_load: 2,
            size_bytes: 64,
            samples: 10000,
            p50_us: 4.5,
            p99_us: 22.0,
            p999_us: 40.0,
            max_us: 100.0,
            timeouts: 0,
            runs: 1,
            p50_us_sd: 0.0,
            p99_us_sd: 0.0,
        }
    }

    #[test]
    fn both_point_kinds_round_trip_through_one_list() {
        let mut s = Summary::new("admission", "netns", true);
        s.push(admission());
        s.push(probe());
        let back = Summary::from_json(&s.to_json_pretty()).unwrap();
        assert_eq!(back.admission_points().count(), 1);
        assert_eq!(back.probe_points().count(), 1);
        assert_eq!(back.probe_points().next().unwrap(), &probe());
        let mut no_series = admission();
        no_series.series.clear();
        no_series.requests.clear();
        assert_eq!(back.admission_points().next().unwrap(), &no_series);
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
        s.push(probe());
        let v: serde_json::Value = serde_json::from_str(&s.to_json_pretty()).unwrap();
        for k in [
            "experiment",
            "hosts",
            "quick",
            "started_unix_s",
            "duration_s",
            "params",
            "points",
            "notes",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        for k in [
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
        ] {
            assert!(v["points"][0].get(k).is_some(), "missing point key {k}");
        }
        for k in [
            "transport",
            "background_load",
            "size_bytes",
            "p50_us",
            "p99_us",
            "p999_us",
        ] {
            assert!(v["points"][1].get(k).is_some(), "missing probe key {k}");
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
