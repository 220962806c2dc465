//! The point of `lab speculative` ([`SpecPoint`]: one experiment, system, split and
//! offered rate), the nodes' CPU it records, and the figures read from the specd
//! daemons' summaries ([`SpecdFigures`], [`WindowSeries`]).

use super::*;

/// One point of `lab speculative`: one experiment, system, split and offered rate.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SpecPoint {
    /// `single` or `split`.
    pub experiment: String,
    /// `accN` (normal processing, accept queue N) or `specN` (speculative).
    pub system: String,
    /// Percent of new flows per back-end, `67/33`; `100` for the single server.
    pub split: String,
    /// Accept queue of every back-end (listen backlog).
    pub accept_queue: u32,
    /// Admission window of every back-end (`specN`); `None` for normal processing.
    pub admission_window: Option<u32>,
    /// `open` (arrivals at `rate`) or `closed` (`clients` users).
    #[serde(default = "open_load")]
    pub load: String,
    /// Closed loop: the users (the x axis); `None` in the open loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<u32>,
    /// Offered connection rate, connections/s: the open loop's x axis (the rate set);
    /// in the closed loop the rate the users offered (measured, = `offered_per_s`).
    pub rate: f64,
    /// Connections the clients started per second of measured time.
    pub offered_per_s: f64,
    /// Connections completed (response received) per second: the paper's connection
    /// throughput (the y axis of Fig. 1-3).
    pub conn_per_s: f64,
    /// Connections completed in the measured window.
    pub served: u64,
    /// Connections refused, reset or timed out (`--timeout-ms`), or answered 5xx.
    pub failures: u64,
    /// Of `failures`: client timeouts.
    pub timeouts: u64,
    /// Of `failures`: connection attempts abandoned at `--connect-timeout-ms` (their
    /// SYN was dropped, by a full accept queue or a closed window).
    #[serde(default)]
    pub connect_timeouts: u64,
    /// Of `failures`: connects refused or failed (`ECONNREFUSED`, `ECONNRESET` during the
    /// handshake, the kernel giving up its SYN retries).
    #[serde(default)]
    pub connect_errors: u64,
    /// Of `failures`: connections reset or broken after they were established.
    #[serde(default)]
    pub io_errors: u64,
    /// Response time of completed connections (connect to last byte), ms.
    pub avg_ms: f64,
    pub p99_ms: f64,
    /// Connections migrated between back-ends (0 without speculation).
    pub migrations: u64,
    /// Migration latency p50 / p99, µs; `None` without a migration.
    pub migration_p50_us: Option<f64>,
    pub migration_p99_us: Option<f64>,
    /// Migrations refused by a target, and admission windows closed (0 without
    /// speculation).
    pub refusals: u64,
    pub window_closures: u64,
    /// Connections specd lost or could not hand to a server after taking them
    /// (summaries' `lost` + `local_handoff_failed` + target `handoff_failed`): client
    /// failures caused by migration. 0 without speculation.
    #[serde(default)]
    pub migration_lost: u64,
    /// Most connections waiting at once in one specd for its local server to take them
    /// (its adoption queue full), source or target side (`queued_max` of the
    /// summaries' `local_handoff` / `handoff`).
    #[serde(default)]
    pub handoff_queued_max: u64,
    /// Connections whose client had gone while they waited for the hand-off (not
    /// lost: closed by the client; summaries' `client_gone`).
    #[serde(default)]
    pub handoff_client_gone: u64,
    /// CPU per migrated connection on the source (migrator thread) and on the target
    /// (restore and hand-off), mean µs; `None` without a migration.
    #[serde(default)]
    pub migration_cpu_source_us: Option<f64>,
    #[serde(default)]
    pub migration_cpu_target_us: Option<f64>,
    /// specd's process CPU, ms per second per back-end (mean): its whole tax on a
    /// node's quota (`None` without speculation).
    #[serde(default)]
    pub specd_cpu_ms_per_s: Option<f64>,
    /// How the sources' sk_lookup program decided (`kernel`: per SYN from the server's
    /// accept queue; `poll`: a flag polled by specd).
    #[serde(default)]
    pub steer_mode: Option<String>,
    /// Each back-end node's CPU over the measured window (from the end of the warm-up
    /// for `duration_s`), by process: where a node's quota went while conn/s was
    /// counted. Older result files measured it over the whole load (warm-up and drain
    /// included); empty in files from before this field.
    #[serde(default)]
    pub nodes: Vec<NodeCpu>,
    /// One node's capacity by the formula, connections/s ([`capacity_rps`]).
    pub capacity_rps: f64,
    /// Measured time, s.
    pub duration_s: f64,
    /// Runs combined in this point.
    #[serde(default = "one")]
    pub runs: u64,
    /// The lowest and highest conn/s of a single run (`--repeat`): the spread behind
    /// `conn_per_s`. `None` for one run.
    #[serde(default)]
    pub conn_per_s_min: Option<f64>,
    #[serde(default)]
    pub conn_per_s_max: Option<f64>,
    /// Connections completed in each second of the measured window (summed over
    /// runs): whether the point was in its steady state from the window's start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub served_per_s: Vec<u64>,
    /// Migrations per second over the measured window (the sources' per-second
    /// series, apportioned to the window by overlap); `None` without speculation, and in
    /// older result files (whose `migrations` also count the warm-up and the drain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrations_per_s: Option<f64>,
    /// Per second of the measured window, as `served_per_s` (summed over runs, 0.1
    /// resolution): migrations, target refusals and window closures, both sources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrated_per_s: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_per_s: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub closed_per_s: Vec<f64>,
}

pub(super) fn one() -> u64 {
    1
}

/// Per-second series of `runs` added second by second, a shorter run's as far as it
/// goes.
pub(super) fn add_by_second<T: Copy + std::iter::Sum<T>>(
    runs: &[SpecPoint],
    f: impl Fn(&SpecPoint) -> &Vec<T>,
) -> Vec<T> {
    let n = runs.iter().map(|r| f(r).len()).max().unwrap_or(0);
    (0..n)
        .map(|i| runs.iter().filter_map(|r| f(r).get(i).copied()).sum())
        .collect()
}

pub(super) fn open_load() -> String {
    "open".into()
}

/// One back-end node's CPU during a point's load, ms of CPU per second of wall time
/// (`/proc/PID/stat` utime + stime of each process in the node's cgroup, 10 ms ticks:
/// ±0.5 ms/s over a 20 s point; softirq work the kernel does while one of them runs
/// counts as theirs).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct NodeCpu {
    /// The node, `b0` or `b1`.
    pub node: String,
    /// Every process of the node (the quota is `--node-cpu-pct` × 10 ms/s).
    pub cpu_ms_per_s: f64,
    /// `farside backend` (the web server).
    pub backend_ms_per_s: f64,
    /// `farside specd` (0 for normal processing).
    pub specd_ms_per_s: f64,
    /// `farside gatherd` (the load region; only with specd).
    pub gatherd_ms_per_s: f64,
    /// Time the node's tasks were throttled (quota used up), ms per second, summed over
    /// the CPUs they wait on (`cpu.stat` throttled time): above 1,000 on two CPUs.
    pub throttled_ms_per_s: f64,
}

impl NodeCpu {
    /// `runs`' nodes averaged, weighted by each run's measured time.
    pub(super) fn combine(runs: &[SpecPoint]) -> Vec<NodeCpu> {
        let d: f64 = runs.iter().map(|r| r.duration_s).sum();
        let n = runs.iter().map(|r| r.nodes.len()).min().unwrap_or(0);
        if d <= 0.0 {
            return runs.first().map(|r| r.nodes.clone()).unwrap_or_default();
        }
        (0..n)
            .map(|i| {
                let avg = |f: fn(&NodeCpu) -> f64| {
                    runs.iter()
                        .map(|r| f(&r.nodes[i]) * r.duration_s)
                        .sum::<f64>()
                        / d
                };
                NodeCpu {
                    node: runs[0].nodes[i].node.clone(),
                    cpu_ms_per_s: avg(|c| c.cpu_ms_per_s),
                    backend_ms_per_s: avg(|c| c.backend_ms_per_s),
                    specd_ms_per_s: avg(|c| c.specd_ms_per_s),
                    gatherd_ms_per_s: avg(|c| c.gatherd_ms_per_s),
                    throttled_ms_per_s: avg(|c| c.throttled_ms_per_s),
                }
            })
            .collect()
    }

    /// One node for the peaks line: `b0 198 (backend 181, specd 14.0, gatherd 0.9)`.
    pub(super) fn brief(&self) -> String {
        format!(
            "{} {:.0} (backend {:.0}, specd {:.1}, gatherd {:.1})",
            self.node,
            self.cpu_ms_per_s,
            self.backend_ms_per_s,
            self.specd_ms_per_s,
            self.gatherd_ms_per_s,
        )
    }
}

impl SpecPoint {
    /// Repeats of one point: counts summed, rates and times averaged (weighted by the
    /// measured time), migration quantiles the worst run's.
    pub fn combine(runs: &[SpecPoint]) -> SpecPoint {
        let Some(first) = runs.first() else {
            return SpecPoint::empty();
        };
        let d: f64 = runs.iter().map(|r| r.duration_s).sum();
        let served: u64 = runs.iter().map(|r| r.served).sum();
        let wavg = |f: fn(&SpecPoint) -> f64| {
            if d > 0.0 {
                runs.iter().map(|r| f(r) * r.duration_s).sum::<f64>() / d
            } else {
                f(first)
            }
        };
        let worst = |f: fn(&SpecPoint) -> Option<f64>| {
            runs.iter()
                .filter_map(f)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        };
        let offered_per_s = wavg(|r| r.offered_per_s);
        SpecPoint {
            // Closed loop: the rate is what the users offered, over all runs.
            rate: if first.clients.is_some() {
                offered_per_s
            } else {
                first.rate
            },
            offered_per_s,
            conn_per_s: if d > 0.0 { served as f64 / d } else { 0.0 },
            served,
            failures: runs.iter().map(|r| r.failures).sum(),
            timeouts: runs.iter().map(|r| r.timeouts).sum(),
            connect_timeouts: runs.iter().map(|r| r.connect_timeouts).sum(),
            connect_errors: runs.iter().map(|r| r.connect_errors).sum(),
            io_errors: runs.iter().map(|r| r.io_errors).sum(),
            avg_ms: wavg(|r| r.avg_ms),
            p99_ms: runs.iter().map(|r| r.p99_ms).fold(0.0, f64::max),
            migrations: runs.iter().map(|r| r.migrations).sum(),
            migration_p50_us: worst(|r| r.migration_p50_us),
            migration_p99_us: worst(|r| r.migration_p99_us),
            refusals: runs.iter().map(|r| r.refusals).sum(),
            window_closures: runs.iter().map(|r| r.window_closures).sum(),
            migration_lost: runs.iter().map(|r| r.migration_lost).sum(),
            handoff_queued_max: runs.iter().map(|r| r.handoff_queued_max).max().unwrap_or(0),
            handoff_client_gone: runs.iter().map(|r| r.handoff_client_gone).sum(),
            migration_cpu_source_us: worst(|r| r.migration_cpu_source_us),
            migration_cpu_target_us: worst(|r| r.migration_cpu_target_us),
            specd_cpu_ms_per_s: worst(|r| r.specd_cpu_ms_per_s),
            nodes: NodeCpu::combine(runs),
            duration_s: d,
            runs: runs.iter().map(|r| r.runs).sum(),
            conn_per_s_min: (runs.len() > 1).then(|| {
                runs.iter()
                    .map(|r| r.conn_per_s_min.unwrap_or(r.conn_per_s))
                    .fold(f64::INFINITY, f64::min)
            }),
            conn_per_s_max: (runs.len() > 1).then(|| {
                runs.iter()
                    .map(|r| r.conn_per_s_max.unwrap_or(r.conn_per_s))
                    .fold(0.0, f64::max)
            }),
            served_per_s: add_by_second(runs, |r| &r.served_per_s),
            migrations_per_s: {
                let m: Vec<(f64, f64)> = runs
                    .iter()
                    .filter_map(|r| r.migrations_per_s.map(|m| (m, r.duration_s)))
                    .collect();
                let t: f64 = m.iter().map(|x| x.1).sum();
                (!m.is_empty() && t > 0.0).then(|| m.iter().map(|(v, d)| v * d).sum::<f64>() / t)
            },
            migrated_per_s: add_by_second(runs, |r| &r.migrated_per_s),
            refused_per_s: add_by_second(runs, |r| &r.refused_per_s),
            closed_per_s: add_by_second(runs, |r| &r.closed_per_s),
            ..first.clone()
        }
    }

    pub(super) fn empty() -> SpecPoint {
        SpecPoint {
            experiment: String::new(),
            system: String::new(),
            split: String::new(),
            accept_queue: 0,
            admission_window: None,
            load: open_load(),
            clients: None,
            rate: 0.0,
            offered_per_s: 0.0,
            conn_per_s: 0.0,
            served: 0,
            failures: 0,
            timeouts: 0,
            connect_timeouts: 0,
            connect_errors: 0,
            io_errors: 0,
            avg_ms: 0.0,
            p99_ms: 0.0,
            migrations: 0,
            migration_p50_us: None,
            migration_p99_us: None,
            refusals: 0,
            window_closures: 0,
            migration_lost: 0,
            handoff_queued_max: 0,
            handoff_client_gone: 0,
            migration_cpu_source_us: None,
            migration_cpu_target_us: None,
            specd_cpu_ms_per_s: None,
            steer_mode: None,
            nodes: Vec::new(),
            capacity_rps: 0.0,
            duration_s: 0.0,
            runs: 0,
            conn_per_s_min: None,
            conn_per_s_max: None,
            served_per_s: Vec::new(),
            migrations_per_s: None,
            migrated_per_s: Vec::new(),
            refused_per_s: Vec::new(),
            closed_per_s: Vec::new(),
        }
    }

    /// The point's figures on one line, for progress output.
    pub fn progress_line(&self) -> String {
        format!(
            "conn/s={:.1} offered={:.1}/s failures={} timeouts={} connect_timeouts={} \
             connect_errors={} io_errors={} avg={:.1} ms p99={:.1} ms migrations={}",
            self.conn_per_s,
            self.offered_per_s,
            self.failures,
            self.timeouts,
            self.connect_timeouts,
            self.connect_errors,
            self.io_errors,
            self.avg_ms,
            self.p99_ms,
            self.migrations
        )
    }

    /// The line this point belongs to in tables and figures: `single` or `split 75/25`,
    /// with ` closed` after it in the closed loop.
    pub fn panel(&self) -> String {
        let mut p = if self.experiment == "single" {
            "single".to_string()
        } else {
            format!("split {}", self.split)
        };
        if self.clients.is_some() {
            p.push_str(CLOSED_SUFFIX);
        }
        p
    }

    /// The point's x: users in the closed loop, the offered rate in the open loop.
    pub fn x(&self) -> f64 {
        self.clients.map_or(self.rate, f64::from)
    }
}

/// The sources' migrations, target refusals and window closures per second of a
/// point's measured window, from each specd summary's `source.series` (per second since
/// that daemon's `source.started_unix_ms`). A daemon's second is taken as spread evenly
/// and apportioned to the window's seconds by overlap, so the lab's and the daemons'
/// clocks need not tick together (the last window second may be partial).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowSeries {
    /// Migrations per second over the whole window; `None` for an empty window.
    pub migrations_per_s: Option<f64>,
    pub migrated: Vec<f64>,
    pub refused: Vec<f64>,
    pub closed: Vec<f64>,
}

impl WindowSeries {
    /// The window from `w0_unix_ms` for `wall_ms`.
    pub fn from_summaries(
        summaries: &[serde_json::Value],
        w0_unix_ms: f64,
        wall_ms: f64,
    ) -> WindowSeries {
        // The sampler wakes a few ms after the window's end: an overrun of up to
        // WINDOW_OVERRUN_MS is cut, so a 20 s window has 20 seconds, as `served_per_s`.
        let n = ((wall_ms - WINDOW_OVERRUN_MS) / 1e3).ceil().max(0.0) as usize;
        let wall_ms = wall_ms.min(n as f64 * 1e3);
        let mut cols = [vec![0.0; n], vec![0.0; n], vec![0.0; n]];
        let w_end = w0_unix_ms + wall_ms;
        for s in summaries {
            let src = &s["source"];
            let Some(start) = src["started_unix_ms"].as_f64() else {
                continue;
            };
            let first = src["series"]["first_s"].as_f64().unwrap_or(0.0);
            for (k, name) in ["migrated", "refused", "closed"].iter().enumerate() {
                let Some(bins) = src["series"][*name].as_array() else {
                    continue;
                };
                for (i, c) in bins.iter().enumerate() {
                    let c = c.as_f64().unwrap_or(0.0);
                    let b0 = start + (first + i as f64) * 1e3;
                    let b1 = b0 + 1e3;
                    if c == 0.0 || b1 <= w0_unix_ms || b0 >= w_end {
                        continue;
                    }
                    let j0 = ((b0.max(w0_unix_ms) - w0_unix_ms) / 1e3) as usize;
                    for (j, slot) in cols[k].iter_mut().enumerate().skip(j0) {
                        let s0 = w0_unix_ms + j as f64 * 1e3;
                        let s1 = (s0 + 1e3).min(w_end);
                        if s0 >= b1 {
                            break;
                        }
                        let overlap = (s1.min(b1) - s0.max(b0)).max(0.0);
                        *slot += c * overlap / 1e3;
                    }
                }
            }
        }
        let migrated_total: f64 = cols[0].iter().sum();
        let [migrated, refused, closed] = cols.map(|v| {
            v.into_iter()
                .map(|x| (x * 10.0).round() / 10.0)
                .collect::<Vec<f64>>()
        });
        WindowSeries {
            migrations_per_s: (wall_ms > 0.0).then(|| migrated_total * 1e3 / wall_ms),
            migrated,
            refused,
            closed,
        }
    }
}

/// The most a measured window's wall time may pass a whole second and still count
/// as that many seconds ([`WindowSeries`]), ms.
pub(super) const WINDOW_OVERRUN_MS: f64 = 100.0;

/// What one point takes from the back-ends' `farside specd` exit summaries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecdFigures {
    /// Connections migrated (sources' `migrated`).
    pub migrations: u64,
    /// Migration latency (freeze to DONE): p50 weighted by each source's count, p99 the
    /// worst source's; µs.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Migrations refused by a target (`window.target_refusals`).
    pub refusals: u64,
    /// Admission windows closed (`window.closures`).
    pub window_closures: u64,
    /// Connections lost by specd (`lost` + `local_handoff_failed` + target
    /// `handoff_failed`).
    pub lost: u64,
    /// Most connections waiting for a hand-off at once in one specd (`queued_max`).
    pub handoff_queued_max: u64,
    /// Hand-offs whose client had gone while waiting (`client_gone`).
    pub handoff_client_gone: u64,
    /// Mean CPU per migration on the sources and on the targets, µs.
    pub cpu_source_us: Option<f64>,
    pub cpu_target_us: Option<f64>,
    /// specd's whole process CPU (`process_cpu_ms` over `wall_s`), ms per second,
    /// mean over the back-ends: its tax on a node's quota, migrations included.
    pub cpu_ms_per_s: Option<f64>,
    /// The sources' steering modes (`source.steer_mode`), distinct, comma-separated.
    pub steer_mode: Option<String>,
}

impl SpecdFigures {
    /// Sum the summaries (one JSON object per back-end, `farside specd --summary`).
    pub fn from_summaries(summaries: &[serde_json::Value]) -> SpecdFigures {
        let u = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        let mut f = SpecdFigures::default();
        let (mut p50_w, mut src_cpu, mut src_n, mut tgt_cpu, mut tgt_n) =
            (0.0, 0.0, 0u64, 0.0, 0u64);
        for s in summaries {
            let src = &s["source"];
            let tgt = &s["target"];
            let n = u(&src["migration_us"]["count"]);
            f.migrations += u(&src["migrated"]);
            if n > 0 {
                p50_w += src["migration_us"]["p50"].as_f64().unwrap_or(0.0) * n as f64;
                let p99 = src["migration_us"]["p99"].as_f64().unwrap_or(0.0);
                f.p99_us = Some(f.p99_us.map_or(p99, |m: f64| m.max(p99)));
            }
            let c = u(&src["cpu_us"]["count"]);
            if c > 0 {
                src_cpu += src["cpu_us"]["mean"].as_f64().unwrap_or(0.0) * c as f64;
                src_n += c;
            }
            let c = u(&tgt["cpu_us"]["count"]);
            if c > 0 {
                tgt_cpu += tgt["cpu_us"]["mean"].as_f64().unwrap_or(0.0) * c as f64;
                tgt_n += c;
            }
            f.refusals += u(&src["window"]["target_refusals"]);
            f.window_closures += u(&src["window"]["closures"]);
            f.lost += u(&src["lost"]) + u(&src["local_handoff_failed"]) + u(&tgt["handoff_failed"]);
            for h in [&src["local_handoff"], &tgt["handoff"]] {
                f.handoff_queued_max = f.handoff_queued_max.max(u(&h["queued_max"]));
                f.handoff_client_gone += u(&h["client_gone"]);
            }
        }
        let counted: u64 = summaries
            .iter()
            .map(|s| u(&s["source"]["migration_us"]["count"]))
            .sum();
        if counted > 0 {
            f.p50_us = Some(p50_w / counted as f64);
        }
        f.cpu_source_us = (src_n > 0).then(|| src_cpu / src_n as f64);
        f.cpu_target_us = (tgt_n > 0).then(|| tgt_cpu / tgt_n as f64);
        let taxes: Vec<f64> = summaries
            .iter()
            .filter_map(|s| {
                let wall = s["wall_s"].as_f64()?;
                (wall > 0.0).then(|| s["process_cpu_ms"].as_f64().unwrap_or(0.0) / wall)
            })
            .collect();
        f.cpu_ms_per_s =
            (!taxes.is_empty()).then(|| taxes.iter().sum::<f64>() / taxes.len() as f64);
        let mut modes: Vec<&str> = summaries
            .iter()
            .filter_map(|s| s["source"]["steer_mode"].as_str())
            .collect();
        modes.sort_unstable();
        modes.dedup();
        f.steer_mode = (!modes.is_empty()).then(|| modes.join(","));
        f
    }
}

impl crate::experiment::LabPoint for SpecPoint {
    type Extra = crate::experiment::NoExtra;

    fn take_extra(&mut self) -> crate::experiment::NoExtra {
        crate::experiment::NoExtra {}
    }

    fn put_extra(&mut self, _: crate::experiment::NoExtra) {}

    fn combine(runs: &[SpecPoint]) -> SpecPoint {
        SpecPoint::combine(runs)
    }

    fn progress_line(&self) -> String {
        SpecPoint::progress_line(self)
    }
}
