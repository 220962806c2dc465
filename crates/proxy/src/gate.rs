//! The contract between the HTTP data path and the control layer (admission control,
//! balancing, monitor). The data path asks two questions and maps the answers to HTTP
//! in exactly one place (`Reject::status`, in [`crate::reject`], below the upstream pool
//! that refuses too).
//!
//! 1. `on_accept`: right after `accept()`, before a byte of the request is read (the
//!    paper's earliest stage). A rejected connection gets a 503 and is closed.
//! 2. `route_request`: once the request head is parsed: which back-end serves this
//!    request (site from `Host`, class from the target's path), or a rejection. The
//!    returned [`Route`] holds an in-flight guard that the data path keeps until the
//!    response has been fully relayed.
//! 3. `bind_pool`: once, at start: the data path hands the control layer its upstream
//!    connection pool, so admission can tell this proxy's own idle keep-alive
//!    connections from load, and shed them when they pin a back-end's workers.
//! 4. `tend`: every few ms, requests or not: the control layer's upkeep (closing idle
//!    connections that pin a queueing back-end's workers), so recovery from overload
//!    never waits for a request to be admitted first.

use crate::pool::Pool;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Why the control layer (or the upstream pool) refused a connection or request; each
/// reason maps to one HTTP status ([`Reject::status`]).
pub use crate::reject::Reject;

/// The back-end chosen for one request.
pub struct Route {
    /// Index into the configured back-end list.
    pub backend: usize,
    pub addr: SocketAddr,
    /// Decrements the back-end's local in-flight count when dropped.
    pub guard: InflightGuard,
    /// Admitted only because an idle pooled connection to the back-end can carry it
    /// (it adds nothing to the back-end's accept queue): the data path must not open a
    /// new connection for it, and answers [`Reject::Overloaded`] if none is left.
    pub reuse_only: bool,
}

/// Told when a request to a back-end starts and ends (the control layer's count of
/// what this proxy sent since the last load sample).
pub trait InflightObserver: Send + Sync {
    /// A request was routed to the back-end.
    fn sent(&self);
    /// That request's exchange ended (relayed, failed, or abandoned).
    fn done(&self);
}

/// Told when a request of a class to a back-end ends, and how long it took (class-aware
/// admission's per-class count and learned cost, `crate::control::classes`).
pub trait ClassObserver: Send + Sync {
    /// A request of class `class` was routed to the back-end.
    fn sent(&self, class: usize);
    /// That request's exchange ended after `took_ns` (routed to relayed).
    fn done(&self, class: usize, took_ns: u64);
}

/// Counts requests in flight to one back-end; the count drops with the guard.
pub struct InflightGuard {
    counter: Arc<AtomicU64>,
    observer: Option<Arc<dyn InflightObserver>>,
    /// Class-aware admission: the request's class, its observer and when it was sent
    /// (CLOCK_MONOTONIC ns).
    class: Option<(Arc<dyn ClassObserver>, usize, u64)>,
}

impl InflightGuard {
    /// Count one request in `counter` until the guard is dropped.
    pub fn new(counter: Arc<AtomicU64>) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        InflightGuard {
            counter,
            observer: None,
            class: None,
        }
    }

    /// As [`InflightGuard::new`], and tell `observer` when the request starts and ends.
    pub fn observed(counter: Arc<AtomicU64>, observer: Arc<dyn InflightObserver>) -> Self {
        observer.sent();
        let mut g = Self::new(counter);
        g.observer = Some(observer);
        g
    }

    /// Also count the request as one of class `class` in `observer`, and tell it how
    /// long the exchange took when the guard drops.
    pub fn with_class(mut self, observer: Arc<dyn ClassObserver>, class: usize) -> Self {
        observer.sent(class);
        self.class = Some((observer, class, farside_rt::mono_ns()));
        self
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        // The end is told before the count drops, so that a reader who sees the count
        // at zero also sees the end in the estimate (`farside_backend_inflight` 0 means
        // no completion is still to be subtracted from `farside_backend_load`).
        if let Some(o) = &self.observer {
            o.done();
        }
        if let Some((o, class, sent_ns)) = &self.class {
            o.done(*class, farside_rt::mono_ns().saturating_sub(*sent_ns));
        }
        self.counter.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the data path needs from the control layer.
pub trait Gate: Send + Sync + 'static {
    /// Called right after accept. `Err` means: answer 503 and close.
    fn on_accept(&self, peer: SocketAddr) -> Result<(), Reject>;
    /// Choose a back-end for a request to `host` (the Host header, port stripped).
    fn route(&self, host: Option<&str>) -> Result<Route, Reject>;
    /// [`Gate::route`] for a request whose request-line target is `target` (a control
    /// layer with request classes classifies it by its path). Default: `route(host)`.
    fn route_request(&self, host: Option<&str>, _target: &[u8]) -> Result<Route, Reject> {
        self.route(host)
    }
    /// Seconds to put in `Retry-After` on a 503.
    fn retry_after_s(&self) -> u32 {
        1
    }
    /// Tell the control layer a back-end failed to connect/answer (502), so it can
    /// mark it down for a while.
    fn report_failure(&self, _backend: usize) {}
    /// Append the control layer's Prometheus metrics.
    fn render_metrics(&self, _enc: &mut farside_admin::Encoder) {}
    /// The data path's upstream pool, handed over once at start. A control layer that
    /// reads back-end load uses it to leave this proxy's own idle connections out of
    /// that load and to close them when they pin a queueing back-end's workers.
    fn bind_pool(&self, _pool: Arc<Pool>) {}
    /// Periodic upkeep, called by the data path every few ms whether or not requests
    /// arrive (the control layer closes idle connections that pin a queueing
    /// back-end's workers here, so that recovery does not wait for a request).
    fn tend(&self) {}
}
