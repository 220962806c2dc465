//! Data-path counters, lock-free (relaxed atomics), reported to the one Prometheus
//! encoder ([`farside_admin::Encoder`]) with every name prefixed `farside_proxy_`.

use crate::reject::Reject;
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

/// Counters of the HTTP data path, sharded per worker: each worker thread counts in
/// its own [`Shard`] (no cache line written by two workers on the request path), and a
/// scrape sums the shards. Write through [`Metrics::here`] (the calling worker's shard),
/// read totals with [`Metrics::total`].
///
/// Which shard a thread writes is set once per worker thread by the server
/// ([`set_worker`]); every other thread (the caller's runtime running worker 0, the
/// admin thread, tests) counts in shard 0.
#[derive(Debug)]
pub struct Metrics {
    shards: Box<[Shard]>,
}

/// Largest number of shards: the proxy's `workers` bound (`ProxyConfig::validate`).
pub const SHARDS_MAX: usize = 256;

thread_local! {
    /// The worker this thread runs (0 unless [`set_worker`] said otherwise).
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Make the calling thread count in shard `worker` of every [`Metrics`] (clamped to its
/// shards). Called once by each worker thread before it serves.
pub fn set_worker(worker: usize) {
    WORKER.with(|w| w.set(worker));
}

/// One worker's counters, alone on its cache lines (128 B: a line and the neighbour the
/// adjacent-line prefetcher pulls with it), so workers never write a shared line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Shard {
    pub conns_accepted: AtomicU64,
    pub conns_rejected_at_accept: AtomicU64,
    /// A gauge: incremented and decremented by the worker that accepted the connection;
    /// sums wrap, so the total stays right even if another thread decremented it.
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
    /// connections (a connection idle between requests holds none). A gauge, like
    /// `conns_active`.
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

impl Shard {
    /// Responses this shard sent, all classes.
    pub fn responses(&self) -> u64 {
        self.responses_by_class
            .iter()
            .fold(0, |a, c| a.wrapping_add(c.load(Relaxed)))
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Counters of a single worker.
    pub fn new() -> Self {
        Self::with_workers(1)
    }

    /// Counters of `workers` workers (1..=[`SHARDS_MAX`]; clamped).
    pub fn with_workers(workers: usize) -> Self {
        let n = workers.clamp(1, SHARDS_MAX);
        Metrics {
            shards: (0..n).map(|_| Shard::default()).collect(),
        }
    }

    /// The number of shards (workers).
    pub fn workers(&self) -> usize {
        self.shards.len()
    }

    /// The calling worker's shard: where the data path counts.
    #[inline]
    pub fn here(&self) -> &Shard {
        let i = WORKER.with(|w| w.get());
        &self.shards[i.min(self.shards.len() - 1)]
    }

    /// Worker `i`'s shard. Panics if `i >= self.workers()`.
    pub fn worker(&self, i: usize) -> &Shard {
        &self.shards[i]
    }

    /// The sum over all workers of the counter `f` picks (wrapping, so gauges
    /// incremented on one shard and decremented on another still add up).
    pub fn total(&self, f: impl Fn(&Shard) -> &AtomicU64) -> u64 {
        self.shards
            .iter()
            .fold(0, |a, s| a.wrapping_add(f(s).load(Relaxed)))
    }

    pub fn response(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.here().responses_by_class[class].fetch_add(1, Relaxed);
    }

    pub fn reject(&self, r: Reject) {
        self.here().rejects[r.index()].fetch_add(1, Relaxed);
    }

    pub fn rejects_for(&self, r: Reject) -> u64 {
        self.total(|s| &s.rejects[r.index()])
    }

    pub fn upstream_error(&self, e: UpstreamError) {
        self.here().upstream_errors[e.index()].fetch_add(1, Relaxed);
    }

    pub fn upstream_errors_for(&self, e: UpstreamError) -> u64 {
        self.total(|s| &s.upstream_errors[e.index()])
    }

    /// One checkout of an upstream connection that waited `d` for a slot.
    pub fn upstream_wait(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let s = self.here();
        s.upstream_wait_us.fetch_add(us, Relaxed);
        s.upstream_checkouts.fetch_add(1, Relaxed);
    }

    pub fn latency(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = LATENCY_BUCKETS_US.partition_point(|&b| b < us);
        let s = self.here();
        s.latency_buckets[i].fetch_add(1, Relaxed);
        s.latency_sum_us.fetch_add(us, Relaxed);
        s.latency_count.fetch_add(1, Relaxed);
    }

    /// Report all counters to the scrape's encoder, every name prefixed `farside_proxy_`.
    pub fn render(&self, enc: &mut Encoder) {
        type Pick = fn(&Shard) -> &AtomicU64;
        for (name, kind, help, pick) in [
            (
                "connections_accepted_total",
                Kind::Counter,
                "Client connections accepted.",
                (|s| &s.conns_accepted) as Pick,
            ),
            (
                "connections_rejected_at_accept_total",
                Kind::Counter,
                "Client connections answered 503 right after accept.",
                (|s| &s.conns_rejected_at_accept) as Pick,
            ),
            (
                "connections_active",
                Kind::Gauge,
                "Client connections open now.",
                (|s| &s.conns_active) as Pick,
            ),
            (
                "connection_buffer_bytes",
                Kind::Gauge,
                "Bytes of client and upstream read buffers allocated now (none while a connection idles between requests).",
                (|s| &s.conn_buffer_bytes) as Pick,
            ),
            (
                "upstream_wait_microseconds_total",
                Kind::Counter,
                "Time requests waited in the proxy for an upstream connection slot, summed over all checkouts.",
                (|s| &s.upstream_wait_us) as Pick,
            ),
            (
                "upstream_checkouts_total",
                Kind::Counter,
                "Requests that asked for an upstream connection (waited or not).",
                (|s| &s.upstream_checkouts) as Pick,
            ),
            (
                "upstream_connects_total",
                Kind::Counter,
                "New connections opened to back-ends.",
                (|s| &s.upstream_connects) as Pick,
            ),
            (
                "upstream_reused_total",
                Kind::Counter,
                "Requests sent on a pooled back-end connection.",
                (|s| &s.upstream_reused) as Pick,
            ),
            (
                "upstream_retries_total",
                Kind::Counter,
                "Requests resent on a fresh connection after a stale pooled one failed.",
                (|s| &s.upstream_retries) as Pick,
            ),
            (
                "bytes_in_total",
                Kind::Counter,
                "Bytes read from clients.",
                (|s| &s.bytes_in) as Pick,
            ),
            (
                "bytes_out_total",
                Kind::Counter,
                "Bytes written to clients.",
                (|s| &s.bytes_out) as Pick,
            ),
            (
                "request_body_timeouts_total",
                Kind::Counter,
                "Request bodies that missed their idle, total or minimum-rate deadline (408).",
                (|s| &s.request_body_timeouts) as Pick,
            ),
            (
                "response_body_timeouts_total",
                Kind::Counter,
                "Response bodies cut off at a deadline (back-end reads or client writes).",
                (|s| &s.response_body_timeouts) as Pick,
            ),
        ] {
            let name = format!("farside_proxy_{name}");
            let v = self.total(pick);
            match kind {
                Kind::Gauge => enc.gauge(&name, help, &[], v),
                _ => enc.counter(&name, help, &[], v),
            }
        }
        for i in 0..5 {
            let class = format!("{}xx", i + 1);
            enc.counter(
                "farside_proxy_responses_total",
                "Responses sent to clients by status class.",
                &[("class", &class)],
                self.total(|s| &s.responses_by_class[i]),
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
            .enumerate()
            .map(|(i, &us)| (us as f64 / 1e6, self.total(|s| &s.latency_buckets[i])));
        enc.histogram(
            "farside_proxy_request_duration_seconds",
            "Time from request head to end of response.",
            &[],
            buckets,
            self.total(|s| &s.latency_buckets[LATENCY_BUCKETS_US.len()]),
            self.total(|s| &s.latency_sum_us) as f64 / 1e6,
        );
        // The spread over workers (each worker its own `SO_REUSEPORT` listener: the
        // kernel picks the worker of a connection by a hash of its addresses).
        for (i, s) in self.shards.iter().enumerate() {
            let w = i.to_string();
            let worker = [("worker", w.as_str())];
            enc.counter(
                "farside_proxy_worker_requests_total",
                "Responses sent to clients by each worker (its share of the requests).",
                &worker,
                s.responses(),
            );
            enc.counter(
                "farside_proxy_worker_connections_accepted_total",
                "Client connections accepted by each worker's listener.",
                &worker,
                s.conns_accepted.load(Relaxed),
            );
            enc.gauge(
                "farside_proxy_worker_connections_active",
                "Client connections open now on each worker.",
                &worker,
                s.conns_active.load(Relaxed),
            );
        }
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

    #[test]
    fn each_worker_counts_in_its_own_shard_and_a_scrape_sums_them() {
        let m = std::sync::Arc::new(Metrics::with_workers(2));
        m.response(200);
        m.latency(Duration::from_micros(50));
        let m1 = m.clone();
        std::thread::spawn(move || {
            set_worker(1);
            m1.response(200);
            m1.response(503);
            m1.here().bytes_out.fetch_add(10, Relaxed);
            m1.here().conns_active.fetch_add(1, Relaxed);
        })
        .join()
        .unwrap();
        // A gauge decremented on another shard than it was incremented on still sums.
        m.here().conns_active.fetch_sub(1, Relaxed);
        assert_eq!(m.worker(0).responses(), 1);
        assert_eq!(m.worker(1).responses(), 2);
        assert_eq!(m.total(|s| &s.bytes_out), 10);
        assert_eq!(m.total(|s| &s.conns_active), 0);
        assert_eq!(
            std::mem::align_of::<Shard>(),
            128,
            "no two shards share a line"
        );
        let mut e = Encoder::new();
        m.render(&mut e);
        let s = e.finish();
        assert!(
            s.contains("farside_proxy_responses_total{class=\"2xx\"} 2\n"),
            "{s}"
        );
        assert!(s.contains("farside_proxy_responses_total{class=\"5xx\"} 1\n"));
        assert!(s.contains("farside_proxy_bytes_out_total 10\n"));
        assert!(s.contains("farside_proxy_connections_active 0\n"));
        assert!(s.contains("farside_proxy_request_duration_seconds_count 1\n"));
        assert!(s.contains("farside_proxy_worker_requests_total{worker=\"0\"} 1\n"));
        assert!(s.contains("farside_proxy_worker_requests_total{worker=\"1\"} 2\n"));
        // A thread of another worker than the shards cover counts in the last one.
        let m2 = m.clone();
        std::thread::spawn(move || {
            set_worker(7);
            m2.response(200);
        })
        .join()
        .unwrap();
        assert_eq!(m.worker(1).responses(), 3);
    }
}
