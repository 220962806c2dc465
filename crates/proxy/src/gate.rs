//! The contract between the HTTP data path and the control layer (admission control,
//! balancing, monitor). The data path asks two questions and maps the answers to HTTP
//! in exactly one place (`Reject::status`).
//!
//! 1. `on_accept`: right after `accept()`, before a byte of the request is read (the
//!    paper's earliest stage). A rejected connection gets a 503 and is closed.
//! 2. `route`: once the request head is parsed: which back-end serves this request
//!    (site from `Host`), or a rejection. The returned [`Route`] holds an in-flight guard
//!    that the data path keeps until the response has been fully relayed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Why the control layer refused a connection or request. Each maps to one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Every eligible back-end is at or above its load limit.
    Overloaded,
    /// Load data is stale (gatherer or monitor dead) and the fail-safe policy is `reject`.
    StaleLoad,
    /// No back-end serves the requested site.
    UnknownSite,
    /// The site has back-ends but none is usable (all down).
    NoBackend,
}

impl Reject {
    /// Every rejection reason, in the order of [`Reject::index`] (metric label order).
    pub const ALL: [Reject; 4] = [
        Reject::Overloaded,
        Reject::StaleLoad,
        Reject::UnknownSite,
        Reject::NoBackend,
    ];

    /// Position in [`Reject::ALL`], for per-reason counter arrays.
    pub fn index(self) -> usize {
        match self {
            Reject::Overloaded => 0,
            Reject::StaleLoad => 1,
            Reject::UnknownSite => 2,
            Reject::NoBackend => 3,
        }
    }

    /// HTTP status for this rejection. The only place rejections become statuses.
    pub fn status(self) -> u16 {
        match self {
            Reject::Overloaded | Reject::StaleLoad | Reject::NoBackend => 503,
            Reject::UnknownSite => 404,
        }
    }

    /// Short machine-readable reason, used in the response body and metric labels.
    pub fn reason(self) -> &'static str {
        match self {
            Reject::Overloaded => "overloaded",
            Reject::StaleLoad => "stale_load",
            Reject::UnknownSite => "unknown_site",
            Reject::NoBackend => "no_backend",
        }
    }
}

/// The back-end chosen for one request.
pub struct Route {
    /// Index into the configured back-end list.
    pub backend: usize,
    pub addr: SocketAddr,
    /// Decrements the back-end's local in-flight count when dropped.
    pub guard: InflightGuard,
}

/// Counts requests in flight to one back-end; the count drops with the guard.
pub struct InflightGuard(Arc<AtomicU64>);

impl InflightGuard {
    pub fn new(counter: Arc<AtomicU64>) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        InflightGuard(counter)
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the data path needs from the control layer.
pub trait Gate: Send + Sync + 'static {
    /// Called right after accept. `Err` means: answer 503 and close.
    fn on_accept(&self, peer: SocketAddr) -> Result<(), Reject>;
    /// Choose a back-end for a request to `host` (the Host header, port stripped).
    fn route(&self, host: Option<&str>) -> Result<Route, Reject>;
    /// Seconds to put in `Retry-After` on a 503.
    fn retry_after_s(&self) -> u32 {
        1
    }
    /// Tell the control layer a back-end failed to connect/answer (502), so it can
    /// mark it down for a while.
    fn report_failure(&self, _backend: usize) {}
    /// Append the control layer's Prometheus metrics.
    fn render_metrics(&self, _out: &mut String) {}
}
