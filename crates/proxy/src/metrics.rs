//! Data-path counters, lock-free (relaxed atomics), rendered in the Prometheus text
//! format with every name prefixed `farside_proxy_`.

use crate::gate::Reject;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (µs) of the request latency histogram. Fixed so that runs compare;
/// they span a loopback hit (~100 µs) to a back-end stuck for seconds.
pub const LATENCY_BUCKETS_US: [u64; 14] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 5_000_000,
];

/// How talking to a back-end failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamError {
    /// Connection refused or otherwise failed at connect.
    Connect,
    /// No connection within `http.connect_timeout_ms`.
    ConnectTimeout,
    /// Reset or closed before a complete response head.
    ResetBeforeHead,
    /// No complete response head within `http.response_timeout_ms`.
    HeadTimeout,
    /// Unparseable or oversized response head.
    BadHead,
    /// Reset, closed or stalled after the head: the client connection is closed (after a
    /// 502 when the body was short enough to be held back with the head).
    MidBody,
}

const UPSTREAM_ERRORS: [UpstreamError; 6] = [
    UpstreamError::Connect,
    UpstreamError::ConnectTimeout,
    UpstreamError::ResetBeforeHead,
    UpstreamError::HeadTimeout,
    UpstreamError::BadHead,
    UpstreamError::MidBody,
];

impl UpstreamError {
    /// Status for the client when this happens before the response head was relayed.
    /// The only place upstream failures become statuses.
    pub fn status(self) -> u16 {
        match self {
            UpstreamError::ConnectTimeout | UpstreamError::HeadTimeout => 504,
            _ => 502,
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            UpstreamError::Connect => "connect",
            UpstreamError::ConnectTimeout => "connect_timeout",
            UpstreamError::ResetBeforeHead => "reset_before_head",
            UpstreamError::HeadTimeout => "head_timeout",
            UpstreamError::BadHead => "bad_head",
            UpstreamError::MidBody => "mid_body",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counters of the HTTP data path, shared by all connections.
#[derive(Debug, Default)]
pub struct Metrics {
    pub conns_accepted: AtomicU64,
    pub conns_rejected_at_accept: AtomicU64,
    pub conns_active: AtomicU64,
    /// Responses sent to clients by status class, index 0 = 1xx .. 4 = 5xx.
    pub responses_by_class: [AtomicU64; 5],
    pub rejects: [AtomicU64; Reject::ALL.len()],
    pub upstream_errors: [AtomicU64; 6],
    pub upstream_connects: AtomicU64,
    pub upstream_reused: AtomicU64,
    pub upstream_retries: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Request bodies that missed their idle, total or minimum-rate deadline (408).
    pub request_body_timeouts: AtomicU64,
    /// Response bodies cut off at their total or minimum-rate deadline, or at a stalled
    /// write to the client.
    pub response_body_timeouts: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    latency_sum_us: AtomicU64,
    latency_count: AtomicU64,
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn response(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.responses_by_class[class].fetch_add(1, Relaxed);
    }

    pub fn reject(&self, r: Reject) {
        self.rejects[r.index()].fetch_add(1, Relaxed);
    }

    pub fn rejects_for(&self, r: Reject) -> u64 {
        self.rejects[r.index()].load(Relaxed)
    }

    pub fn upstream_error(&self, e: UpstreamError) {
        self.upstream_errors[e.index()].fetch_add(1, Relaxed);
    }

    pub fn upstream_errors_for(&self, e: UpstreamError) -> u64 {
        self.upstream_errors[e.index()].load(Relaxed)
    }

    pub fn latency(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = LATENCY_BUCKETS_US.partition_point(|&b| b < us);
        self.latency_buckets[i].fetch_add(1, Relaxed);
        self.latency_sum_us.fetch_add(us, Relaxed);
        self.latency_count.fetch_add(1, Relaxed);
    }

    /// Append all counters in the Prometheus text exposition format.
    pub fn render(&self, out: &mut String) {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let mut simple = |name: &str, kind: &str, help: &str, v: u64| {
            let _ = write!(
                out,
                "# HELP farside_proxy_{name} {help}\n# TYPE farside_proxy_{name} {kind}\nfarside_proxy_{name} {v}\n"
            );
        };
        simple(
            "connections_accepted_total",
            "counter",
            "Client connections accepted.",
            g(&self.conns_accepted),
        );
        simple(
            "connections_rejected_at_accept_total",
            "counter",
            "Client connections answered 503 right after accept.",
            g(&self.conns_rejected_at_accept),
        );
        simple(
            "connections_active",
            "gauge",
            "Client connections open now.",
            g(&self.conns_active),
        );
        simple(
            "upstream_connects_total",
            "counter",
            "New connections opened to back-ends.",
            g(&self.upstream_connects),
        );
        simple(
            "upstream_reused_total",
            "counter",
            "Requests sent on a pooled back-end connection.",
            g(&self.upstream_reused),
        );
        simple(
            "upstream_retries_total",
            "counter",
            "Requests resent on a fresh connection after a stale pooled one failed.",
            g(&self.upstream_retries),
        );
        simple(
            "bytes_in_total",
            "counter",
            "Bytes read from clients.",
            g(&self.bytes_in),
        );
        simple(
            "bytes_out_total",
            "counter",
            "Bytes written to clients.",
            g(&self.bytes_out),
        );
        simple(
            "request_body_timeouts_total",
            "counter",
            "Request bodies that missed their idle, total or minimum-rate deadline (408).",
            g(&self.request_body_timeouts),
        );
        simple(
            "response_body_timeouts_total",
            "counter",
            "Response bodies cut off at a deadline (back-end reads or client writes).",
            g(&self.response_body_timeouts),
        );

        out.push_str(
            "# HELP farside_proxy_responses_total Responses sent to clients by status class.\n\
             # TYPE farside_proxy_responses_total counter\n",
        );
        for (i, c) in self.responses_by_class.iter().enumerate() {
            let _ = writeln!(
                out,
                "farside_proxy_responses_total{{class=\"{}xx\"}} {}",
                i + 1,
                g(c)
            );
        }
        out.push_str(
            "# HELP farside_proxy_rejects_total Requests and connections refused by the gate.\n\
             # TYPE farside_proxy_rejects_total counter\n",
        );
        for r in Reject::ALL {
            let _ = writeln!(
                out,
                "farside_proxy_rejects_total{{reason=\"{}\"}} {}",
                r.reason(),
                self.rejects_for(r)
            );
        }
        out.push_str(
            "# HELP farside_proxy_upstream_errors_total Failures talking to back-ends.\n\
             # TYPE farside_proxy_upstream_errors_total counter\n",
        );
        for e in UPSTREAM_ERRORS {
            let _ = writeln!(
                out,
                "farside_proxy_upstream_errors_total{{kind=\"{}\"}} {}",
                e.kind(),
                self.upstream_errors_for(e)
            );
        }
        out.push_str(
            "# HELP farside_proxy_request_duration_seconds Time from request head to end of response.\n\
             # TYPE farside_proxy_request_duration_seconds histogram\n",
        );
        let mut cumulative = 0;
        for (i, b) in self.latency_buckets.iter().enumerate() {
            cumulative += g(b);
            match LATENCY_BUCKETS_US.get(i) {
                Some(&us) => {
                    let _ = writeln!(
                        out,
                        "farside_proxy_request_duration_seconds_bucket{{le=\"{}\"}} {cumulative}",
                        us as f64 / 1e6
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "farside_proxy_request_duration_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "farside_proxy_request_duration_seconds_sum {}\nfarside_proxy_request_duration_seconds_count {}",
            g(&self.latency_sum_us) as f64 / 1e6,
            g(&self.latency_count)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_labelled() {
        let m = Metrics::new();
        m.latency(Duration::from_micros(50));
        m.latency(Duration::from_micros(300));
        m.latency(Duration::from_secs(10));
        m.response(200);
        m.reject(Reject::Overloaded);
        let mut s = String::new();
        m.render(&mut s);
        assert!(s.contains("farside_proxy_request_duration_seconds_bucket{le=\"0.0001\"} 1\n"));
        assert!(s.contains("farside_proxy_request_duration_seconds_bucket{le=\"0.0005\"} 2\n"));
        assert!(s.contains("farside_proxy_request_duration_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(s.contains("farside_proxy_request_duration_seconds_count 3\n"));
        assert!(s.contains("farside_proxy_responses_total{class=\"2xx\"} 1\n"));
        assert!(s.contains("farside_proxy_rejects_total{reason=\"overloaded\"} 1\n"));
    }
}
