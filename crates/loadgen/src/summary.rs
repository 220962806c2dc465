//! The result of a run ([`Summary`]), its mergeable latency histograms and
//! [`Summary::merge`] for repeats. The key table is in the crate docs.

use std::fmt;
use std::io::Cursor;

use base64::Engine;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;

use crate::LoadgenError;

/// Longest latency a histogram resolves, µs (1 h); longer ones are recorded
/// as this value. Every request ends at `--timeout-ms` or the run end, both
/// bounded well below it.
pub const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Significant decimal digits of the latency histograms (0.1% resolution).
pub const LATENCY_SIGFIG: u8 = 3;
/// Buckets of the per-client success distribution: one per percent, 0..=100.
pub const SUCCESS_BUCKETS: usize = 101;

/// An empty latency histogram (µs, 1 µs .. [`LATENCY_US_MAX`]).
pub fn new_latency_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_SIGFIG)
        .expect("constant bounds are valid")
}

/// Records one latency, clamped into the histogram's range.
pub(crate) fn record_latency(h: &mut Histogram<u64>, us: u64) {
    h.saturating_record(us.clamp(1, LATENCY_US_MAX));
}

/// Base64 (standard alphabet) of the HdrHistogram V2-deflate encoding of `h`,
/// readable by every HdrHistogram implementation.
pub fn encode_hist(h: &Histogram<u64>) -> String {
    let mut buf = Vec::new();
    V2DeflateSerializer::new()
        .serialize(h, &mut buf)
        .expect("serialising into a Vec cannot fail");
    base64::engine::general_purpose::STANDARD.encode(buf)
}

/// Inverse of [`encode_hist`].
pub fn decode_hist(text: &str) -> Result<Histogram<u64>, LoadgenError> {
    let bad = |m: String| LoadgenError::Args(format!("latency histogram: {m}"));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| bad(e.to_string()))?;
    Deserializer::new()
        .deserialize(&mut Cursor::new(bytes))
        .map_err(|e| bad(format!("{e:?}")))
}

/// Failures by kind (they sum to `Summary::failures`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FailureCounts {
    pub timeouts: u64,
    pub connect_errors: u64,
    /// Connection attempts abandoned at `--connect-timeout-ms`.
    #[serde(default)]
    pub connect_timeouts: u64,
    pub io_errors: u64,
    pub malformed: u64,
    pub status_5xx: u64,
    /// Open-loop arrivals shed by the client because `--open-users-max`
    /// users were already active (also `Summary::shed_by_client`).
    pub overflow: u64,
    /// `--check-root`: 200s whose body differs from the file (absent when 0, so
    /// summaries of runs without the check read as before).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wrong_bodies: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl FailureCounts {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &FailureCounts) {
        self.timeouts += o.timeouts;
        self.connect_errors += o.connect_errors;
        self.connect_timeouts += o.connect_timeouts;
        self.io_errors += o.io_errors;
        self.malformed += o.malformed;
        self.status_5xx += o.status_5xx;
        self.overflow += o.overflow;
        self.wrong_bodies += o.wrong_bodies;
    }
}

/// One second of the measured run; requests are counted in the second in
/// which they completed.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SecondStats {
    /// Seconds since the end of warm-up (bucket start).
    pub t_s: u64,
    pub served: u64,
    pub dropped_503: u64,
    pub failures: u64,
    /// Mean latency of the served requests of this second, ms (0 if none).
    pub avg_ms: f64,
    /// (dropped_503 + failures) / all requests completed in this second.
    pub drop_rate: f64,
}

/// Per-client (per-user) success: served / completed, over the users that
/// completed at least one request in the measured window.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClientSuccess {
    pub users: u64,
    pub sum: f64,
    pub min: f64,
    pub pct_counts: Vec<u64>,
}

impl Default for ClientSuccess {
    fn default() -> Self {
        ClientSuccess {
            users: 0,
            sum: 0.0,
            min: 1.0,
            pct_counts: vec![0; SUCCESS_BUCKETS],
        }
    }
}

impl ClientSuccess {
    /// Adds a user that completed `completed` requests, `served` of them served.
    pub fn add_user(&mut self, served: u64, completed: u64) {
        if completed == 0 {
            return;
        }
        let rate = served as f64 / completed as f64;
        self.users += 1;
        self.sum += rate;
        self.min = self.min.min(rate);
        self.pct_counts[(rate * 100.0).floor() as usize] += 1;
    }
}

/// Result of a run. Keys are stable (the lab's summary.json embeds them);
/// the crate docs list them with units.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Summary {
    pub target: String,
    pub trace: String,
    /// "closed" or "open".
    pub mode: String,
    pub clients: usize,
    /// Open loop: offered arrival rate (users/s; with World Cup, requests/s).
    pub rate: Option<f64>,
    /// Open loop: "poisson", "uniform" or "trace" (World Cup timing).
    pub arrivals: Option<String>,
    /// World Cup open loop: trace time / replay time.
    pub time_scale: Option<f64>,
    /// Closed loop: behaviour after a 503 ("backoff", "retry", "leave", "fixed").
    pub on_reject: String,
    pub keepalive: bool,
    /// Runs merged into this summary (1 for a single run).
    pub runs: u64,
    /// Requests started in the measured window (including arrivals shed by the client).
    pub started: u64,
    /// Requests completed in the measured window (served + dropped_503 + failures).
    pub attempts: u64,
    /// Full responses with status < 500 completed in the window.
    pub served: u64,
    pub dropped_503: u64,
    pub failures: u64,
    pub failure_kinds: FailureCounts,
    /// Open-loop arrivals shed by the client (bound full), never sent.
    pub shed_by_client: u64,
    /// Requests still in flight when the run ended (not in any count above).
    pub inflight_at_end: u64,
    /// `--source-ports`: `kernel` (the host's choice) or `random`.
    pub source_ports: String,
    /// With `--source-ports random`: connections whose random ports were all busy,
    /// connected from a port the kernel chose.
    pub source_port_fallbacks: u64,
    /// Users that left after a 503 (leave mode, open loop).
    pub users_left: u64,
    /// Requests of left users that were therefore never sent (sessions, replay).
    pub skipped_after_leave: u64,
    /// Conditional GETs (`If-Modified-Since`, World Cup 304 rows) started in the window.
    pub conditional_requests: u64,
    /// 304 responses completed in the window (counted as served).
    pub not_modified: u64,
    /// Latency of served requests, ms.
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Time to a 503 (rejection latency), ms.
    pub reject_avg_ms: f64,
    pub reject_p50_ms: f64,
    pub reject_p99_ms: f64,
    pub reject_max_ms: f64,
    /// Served completions per second of measured time (= goodput_rps).
    pub tps: f64,
    /// Requests started per second of measured time (offered attempts/s).
    pub offered_rps: f64,
    /// All completions (served, 503, failures) per second.
    pub completed_rps: f64,
    /// Served (non-5xx) completions per second.
    pub goodput_rps: f64,
    /// (dropped_503 + failures) / attempts.
    pub drop_rate: f64,
    /// dropped_503 / attempts.
    pub reject_rate: f64,
    /// Served requests slower than `qos_ms`.
    pub slow: u64,
    /// slow / served.
    pub slow_rate: f64,
    pub qos_ms: u64,
    /// Users with at least one completion in the window.
    pub client_success_users: u64,
    /// Lowest, mean and 10th-percentile (1% resolution) per-user success
    /// rate (served / completed); 0 when no user completed a request.
    pub client_success_min: f64,
    pub client_success_avg: f64,
    pub client_success_p10: f64,
    /// Users per success percent 0..=100 (mergeable distribution).
    pub client_success_pct_counts: Vec<u64>,
    /// Measured time, s (summed over merged runs).
    pub duration_s: f64,
    /// Body bytes of served requests.
    pub bytes: u64,
    /// Records beyond `RECORDS_MAX` were not written to `--out` (counts,
    /// histograms and the series stay exact).
    pub records_truncated: bool,
    /// World Cup rows skipped for bad fields.
    pub trace_rows_skipped: u64,
    /// World Cup: first row replayed (seeded).
    pub trace_start_row: u64,
    /// Served latency histogram, µs: base64 of the HdrHistogram V2-deflate encoding.
    pub latency_hist_v2: String,
    /// Rejection (503) latency histogram, µs, same encoding.
    pub reject_latency_hist_v2: String,
    pub series: Vec<SecondStats>,
}

impl Summary {
    /// Fills every key derived from counts and histograms.
    pub(crate) fn derive(
        &mut self,
        latency: &Histogram<u64>,
        reject_latency: &Histogram<u64>,
        success: &ClientSuccess,
    ) {
        let ratio = |a: f64, b: f64| if b <= 0.0 { 0.0 } else { a / b };
        let ms = |us: u64| us as f64 / 1000.0;
        let q = |h: &Histogram<u64>, p: f64| {
            if h.is_empty() {
                0.0
            } else {
                ms(h.value_at_quantile(p))
            }
        };
        self.p50_ms = q(latency, 0.50);
        self.p90_ms = q(latency, 0.90);
        self.p99_ms = q(latency, 0.99);
        self.max_ms = if latency.is_empty() {
            0.0
        } else {
            ms(latency.max())
        };
        self.reject_p50_ms = q(reject_latency, 0.50);
        self.reject_p99_ms = q(reject_latency, 0.99);
        self.reject_max_ms = if reject_latency.is_empty() {
            0.0
        } else {
            ms(reject_latency.max())
        };
        let d = self.duration_s;
        self.tps = ratio(self.served as f64, d);
        self.goodput_rps = self.tps;
        self.offered_rps = ratio(self.started as f64, d);
        self.completed_rps = ratio(self.attempts as f64, d);
        let attempts = self.attempts as f64;
        self.drop_rate = ratio((self.dropped_503 + self.failures) as f64, attempts);
        self.reject_rate = ratio(self.dropped_503 as f64, attempts);
        self.slow_rate = ratio(self.slow as f64, self.served as f64);
        self.shed_by_client = self.failure_kinds.overflow;
        self.client_success_users = success.users;
        self.client_success_pct_counts = success.pct_counts.clone();
        if success.users == 0 {
            self.client_success_min = 0.0;
            self.client_success_avg = 0.0;
            self.client_success_p10 = 0.0;
        } else {
            self.client_success_min = success.min;
            self.client_success_avg = success.sum / success.users as f64;
            let rank = (success.users as f64 * 0.10).ceil().max(1.0) as u64;
            let mut seen = 0;
            self.client_success_p10 = 1.0;
            for (pct, n) in success.pct_counts.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    self.client_success_p10 = pct as f64 / 100.0;
                    break;
                }
            }
        }
        self.latency_hist_v2 = encode_hist(latency);
        self.reject_latency_hist_v2 = encode_hist(reject_latency);
    }

    /// Merges repeated runs of one configuration exactly: counts and
    /// durations add up, percentiles come from the merged histograms (not
    /// averaged), rates are recomputed over the summed time, the per-user
    /// success distribution is pooled, and the series are concatenated
    /// (second `t_s` of run 2 follows the last of run 1). Descriptive keys
    /// (target, trace, mode, ...) are the first run's.
    pub fn merge(runs: &[Summary]) -> Result<Summary, LoadgenError> {
        let Some(first) = runs.first() else {
            return Err(LoadgenError::Args("merge: no summaries".into()));
        };
        let mut out = first.clone();
        let mut latency = decode_hist(&first.latency_hist_v2)?;
        let mut reject = decode_hist(&first.reject_latency_hist_v2)?;
        let mut success = first.success();
        let mut latency_sum = first.avg_ms * first.served as f64;
        let mut reject_sum = first.reject_avg_ms * first.dropped_503 as f64;
        for r in &runs[1..] {
            latency
                .add(decode_hist(&r.latency_hist_v2)?)
                .map_err(|e| LoadgenError::Args(format!("merge: {e:?}")))?;
            reject
                .add(decode_hist(&r.reject_latency_hist_v2)?)
                .map_err(|e| LoadgenError::Args(format!("merge: {e:?}")))?;
            let s = r.success();
            success.users += s.users;
            success.sum += s.sum;
            success.min = success.min.min(s.min);
            for (a, b) in success.pct_counts.iter_mut().zip(&s.pct_counts) {
                *a += b;
            }
            latency_sum += r.avg_ms * r.served as f64;
            reject_sum += r.reject_avg_ms * r.dropped_503 as f64;
            let offset = out.series.len() as u64;
            out.series.extend(r.series.iter().map(|x| SecondStats {
                t_s: x.t_s + offset,
                ..x.clone()
            }));
            out.runs += r.runs;
            out.started += r.started;
            out.attempts += r.attempts;
            out.served += r.served;
            out.dropped_503 += r.dropped_503;
            out.failures += r.failures;
            out.failure_kinds.add(&r.failure_kinds);
            out.inflight_at_end += r.inflight_at_end;
            out.source_port_fallbacks += r.source_port_fallbacks;
            out.users_left += r.users_left;
            out.skipped_after_leave += r.skipped_after_leave;
            out.conditional_requests += r.conditional_requests;
            out.not_modified += r.not_modified;
            out.slow += r.slow;
            out.duration_s += r.duration_s;
            out.bytes += r.bytes;
            out.records_truncated |= r.records_truncated;
            out.trace_rows_skipped = out.trace_rows_skipped.max(r.trace_rows_skipped);
        }
        let ratio = |a: f64, b: u64| if b == 0 { 0.0 } else { a / b as f64 };
        out.avg_ms = ratio(latency_sum, out.served);
        out.reject_avg_ms = ratio(reject_sum, out.dropped_503);
        out.derive(&latency, &reject, &success);
        Ok(out)
    }

    fn success(&self) -> ClientSuccess {
        let mut pct_counts = self.client_success_pct_counts.clone();
        pct_counts.resize(SUCCESS_BUCKETS, 0);
        ClientSuccess {
            users: self.client_success_users,
            sum: self.client_success_avg * self.client_success_users as f64,
            min: if self.client_success_users == 0 {
                1.0
            } else {
                self.client_success_min
            },
            pct_counts,
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let load = match (self.rate, &self.arrivals) {
            (Some(r), Some(a)) => format!("open loop {r}/s ({a})"),
            (Some(r), None) => format!("open loop {r}/s"),
            _ => format!("{} clients, on-reject {}", self.clients, self.on_reject),
        };
        writeln!(
            f,
            "loadgen {} trace={} {} keepalive={} measured {:.1}s{}",
            self.target,
            self.trace,
            load,
            self.keepalive,
            self.duration_s,
            if self.runs > 1 {
                format!(" over {} runs", self.runs)
            } else {
                String::new()
            }
        )?;
        writeln!(
            f,
            "  started {}  completed {}  served {}  dropped(503) {}  failures {} (timeout {}, connect {}, connect timeout {}, io {}, malformed {}, 5xx {}, shed by client {})  in flight at end {}",
            self.started,
            self.attempts,
            self.served,
            self.dropped_503,
            self.failures,
            self.failure_kinds.timeouts,
            self.failure_kinds.connect_errors,
            self.failure_kinds.connect_timeouts,
            self.failure_kinds.io_errors,
            self.failure_kinds.malformed,
            self.failure_kinds.status_5xx,
            self.failure_kinds.overflow,
            self.inflight_at_end
        )?;
        writeln!(
            f,
            "  latency ms: avg {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}",
            self.avg_ms, self.p50_ms, self.p90_ms, self.p99_ms, self.max_ms
        )?;
        writeln!(
            f,
            "  rejection ms: avg {:.3}  p50 {:.3}  p99 {:.3}  max {:.3}",
            self.reject_avg_ms, self.reject_p50_ms, self.reject_p99_ms, self.reject_max_ms
        )?;
        writeln!(
            f,
            "  per-user success: users {}  min {:.3}  p10 {:.2}  avg {:.3}  left {}  skipped after leaving {}",
            self.client_success_users,
            self.client_success_min,
            self.client_success_p10,
            self.client_success_avg,
            self.users_left,
            self.skipped_after_leave
        )?;
        write!(
            f,
            "  tps {:.1}  offered/s {:.1}  completed/s {:.1}  drop rate {:.4}  reject rate {:.4}  slow(>{}ms) {:.4}  bytes {}{}{}",
            self.tps,
            self.offered_rps,
            self.completed_rps,
            self.drop_rate,
            self.reject_rate,
            self.qos_ms,
            self.slow_rate,
            self.bytes,
            if self.records_truncated {
                "  (records truncated)"
            } else {
                ""
            },
            if self.trace_rows_skipped > 0 || self.conditional_requests > 0 {
                format!(
                    "  trace start row {}  rows skipped {}  conditional {}  304s {}",
                    self.trace_start_row,
                    self.trace_rows_skipped,
                    self.conditional_requests,
                    self.not_modified
                )
            } else {
                String::new()
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary_with(latencies_us: &[u64], success: &[(u64, u64)]) -> Summary {
        let mut h = new_latency_hist();
        for l in latencies_us {
            record_latency(&mut h, *l);
        }
        let mut c = ClientSuccess::default();
        for (served, completed) in success {
            c.add_user(*served, *completed);
        }
        let mut s = Summary {
            served: latencies_us.len() as u64,
            attempts: latencies_us.len() as u64,
            avg_ms: latencies_us.iter().sum::<u64>() as f64 / latencies_us.len() as f64 / 1000.0,
            duration_s: 1.0,
            runs: 1,
            ..Summary::default()
        };
        s.derive(&h, &new_latency_hist(), &c);
        s
    }

    #[test]
    fn merged_percentiles_are_those_of_the_pooled_requests_not_averages() {
        // Run 1: 99 fast requests and 1 slow; run 2: 100 slow. Averaging the
        // runs' p50s would give ~50 ms; the pooled p50 is slow.
        let mut fast = vec![1_000u64; 99];
        fast.push(100_000);
        let a = summary_with(&fast, &[(1, 1), (0, 2), (3, 4)]);
        let b = summary_with(&[100_000; 100], &[(1, 1); 8]);
        assert_eq!(a.p50_ms, 1.0);
        let m = Summary::merge(&[a, b]).unwrap();
        assert!((m.p50_ms - 100.0).abs() < 0.1, "{}", m.p50_ms);
        assert_eq!(m.served, 200);
        assert!((m.tps - 100.0).abs() < 1e-9);
        // Users: 0.0, 0.75, 1.0 x 9 => min 0, p10 0.75 (rank 2 of 11).
        assert_eq!(m.client_success_users, 11);
        assert_eq!(m.client_success_min, 0.0);
        assert_eq!(m.client_success_p10, 0.75);
        assert!((m.client_success_avg - 9.75 / 11.0).abs() < 1e-12);
    }

    #[test]
    fn histograms_round_trip_through_text() {
        let mut h = new_latency_hist();
        for v in [1, 7, 900, 1_000_000, LATENCY_US_MAX * 2] {
            record_latency(&mut h, v);
        }
        let back = decode_hist(&encode_hist(&h)).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.len(), 5);
        assert!(decode_hist("not base64!").is_err());
    }
}
