//! Data-path counters, lock-free (relaxed atomics), reported to the one Prometheus
//! encoder ([`farside_admin::Encoder`]) with every name prefixed `farside_proxy_`.

use crate::gate::Reject;
use farside_admin::{Encoder, Kind};
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
    /// Bytes of client and upstream read buffers allocated now, over all client
    /// connections (a connection idle between requests holds none).
    pub conn_buffer_bytes: AtomicU64,
    /// Time requests waited in the proxy for an upstream connection slot (the back-end's
    /// connection cap reached), µs, summed over every checkout (those that did not wait
    /// add 0), and the number of checkouts: their ratio is the mean proxy queueing per
    /// request sent or refused there.
    pub upstream_wait_us: AtomicU64,
    pub upstream_checkouts: AtomicU64,
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

    /// One checkout of an upstream connection that waited `d` for a slot.
    pub fn upstream_wait(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.upstream_wait_us.fetch_add(us, Relaxed);
        self.upstream_checkouts.fetch_add(1, Relaxed);
    }

    pub fn latency(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = LATENCY_BUCKETS_US.partition_point(|&b| b < us);
        self.latency_buckets[i].fetch_add(1, Relaxed);
        self.latency_sum_us.fetch_add(us, Relaxed);
        self.latency_count.fetch_add(1, Relaxed);
    }

    /// Report all counters to the scrape's encoder, every name prefixed `farside_proxy_`.
    pub fn render(&self, enc: &mut Encoder) {
        let g = |a: &AtomicU64| a.load(Relaxed);
        for (name, kind, help, v) in [
            (
                "connections_accepted_total",
                Kind::Counter,
                "Client connections accepted.",
                &self.conns_accepted,
            ),
            (
                "connections_rejected_at_accept_total",
                Kind::Counter,
                "Client connections answered 503 right after accept.",
                &self.conns_rejected_at_accept,
            ),
            (
                "connections_active",
                Kind::Gauge,
                "Client connections open now.",
                &self.conns_active,
            ),
            (
                "connection_buffer_bytes",
                Kind::Gauge,
                "Bytes of client and upstream read buffers allocated now (none while a connection idles between requests).",
                &self.conn_buffer_bytes,
            ),
            (
                "upstream_wait_microseconds_total",
                Kind::Counter,
                "Time requests waited in the proxy for an upstream connection slot, summed over all checkouts.",
                &self.upstream_wait_us,
            ),
            (
                "upstream_checkouts_total",
                Kind::Counter,
                "Requests that asked for an upstream connection (waited or not).",
                &self.upstream_checkouts,
            ),
            (
                "upstream_connects_total",
                Kind::Counter,
                "New connections opened to back-ends.",
                &self.upstream_connects,
            ),
            (
                "upstream_reused_total",
                Kind::Counter,
                "Requests sent on a pooled back-end connection.",
                &self.upstream_reused,
            ),
            (
                "upstream_retries_total",
                Kind::Counter,
                "Requests resent on a fresh connection after a stale pooled one failed.",
                &self.upstream_retries,
            ),
            (
                "bytes_in_total",
                Kind::Counter,
                "Bytes read from clients.",
                &self.bytes_in,
            ),
            (
                "bytes_out_total",
                Kind::Counter,
                "Bytes written to clients.",
                &self.bytes_out,
            ),
            (
                "request_body_timeouts_total",
                Kind::Counter,
                "Request bodies that missed their idle, total or minimum-rate deadline (408).",
                &self.request_body_timeouts,
            ),
            (
                "response_body_timeouts_total",
                Kind::Counter,
                "Response bodies cut off at a deadline (back-end reads or client writes).",
                &self.response_body_timeouts,
            ),
        ] {
            let name = format!("farside_proxy_{name}");
            match kind {
                Kind::Gauge => enc.gauge(&name, help, &[], g(v)),
                _ => enc.counter(&name, help, &[], g(v)),
            }
        }
        for (i, c) in self.responses_by_class.iter().enumerate() {
            let class = format!("{}xx", i + 1);
            enc.counter(
                "farside_proxy_responses_total",
                "Responses sent to clients by status class.",
                &[("class", &class)],
                g(c),
            );
        }
        for r in Reject::ALL {
            enc.counter(
                "farside_proxy_rejects_total",
                "Requests and connections refused by the gate.",
                &[("reason", r.reason())],
                self.rejects_for(r),
            );
        }
        for e in UPSTREAM_ERRORS {
            enc.counter(
                "farside_proxy_upstream_errors_total",
                "Failures talking to back-ends.",
                &[("kind", e.kind())],
                self.upstream_errors_for(e),
            );
        }
        let buckets = LATENCY_BUCKETS_US
            .iter()
            .zip(&self.latency_buckets)
            .map(|(&us, n)| (us as f64 / 1e6, g(n)));
        enc.histogram(
            "farside_proxy_request_duration_seconds",
            "Time from request head to end of response.",
            &[],
            buckets,
            g(&self.latency_buckets[LATENCY_BUCKETS_US.len()]),
            g(&self.latency_sum_us) as f64 / 1e6,
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
        let mut e = Encoder::new();
        m.render(&mut e);
        let s = e.finish();
        assert!(s.contains("farside_proxy_request_duration_seconds_bucket{le=\"0.0001\"} 1\n"));
        assert!(s.contains("farside_proxy_request_duration_seconds_bucket{le=\"0.0005\"} 2\n"));
        assert!(s.contains("farside_proxy_request_duration_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(s.contains("farside_proxy_request_duration_seconds_count 3\n"));
        assert!(s.contains("farside_proxy_responses_total{class=\"2xx\"} 1\n"));
        assert!(s.contains("farside_proxy_rejects_total{reason=\"overloaded\"} 1\n"));
    }
}
