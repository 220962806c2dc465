//! The admission rules, pure: what one back-end's load ([`Load`]) against its limit
//! lets through ([`admit`], [`admit_local`] for a stale reading under `on_stale =
//! local`), what to close when its accept queue is not empty ([`relief`]), and which
//! signal decided a check ([`Decided`]). [`super::Control`] applies them per back-end.

use crate::config::{Metric, StalePolicy};
use crate::reject::Reject;

/// A back-end's load as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Fresh value in the metric's unit.
    Known(u64),
    /// Record stale, missing, or never read.
    Stale,
    /// No load data is configured for it (no region, no monitor): only local in-flight.
    Unknown,
}

/// How a back-end may take a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// On any connection, new or pooled.
    Any,
    /// Only on an idle pooled connection: it adds nothing to the accept queue.
    ReuseOnly,
}

/// The admission rule for one back-end, pure: `load` (the estimate) against `limit`;
/// for the queue metrics (`backlog`, `pending`) an idle pooled connection (`idle` > 0)
/// may still carry the request, since it adds nothing to the reading.
pub fn admit(
    load: Load,
    limit: u64,
    metric: Metric,
    on_stale: StalePolicy,
    idle: u64,
) -> Result<Admit, Reject> {
    match load {
        Load::Known(v) if v < limit => Ok(Admit::Any),
        Load::Known(_) if idle > 0 && matches!(metric, Metric::Backlog | Metric::Pending) => {
            Ok(Admit::ReuseOnly)
        }
        Load::Known(_) => Err(Reject::Overloaded),
        Load::Stale if on_stale == StalePolicy::Admit => Ok(Admit::Any),
        // `local` needs the proxy's own state: `Control` applies [`admit_local`] first.
        Load::Stale => Err(Reject::StaleLoad),
        Load::Unknown => Ok(Admit::Any),
    }
}

/// The `on_stale = local` rule, pure: with no fresh reading, admit while this proxy's
/// requests in flight to the back-end (`inflight`) are below `safe`, the most it had in
/// flight (counting the admitted request) when a fresh reading admitted a request
/// (0 = never read fresh: refuse; with metric `delay`, at most the budget after the last
/// reading over the target). Under overload that is the back-end's full
/// concurrency within its limit: a request is admitted exactly when the reading has
/// just dropped below it. The back-end is
/// then held at a concurrency it was last seen to take within its limit: a dead
/// gatherd neither overloads it nor turns every request into a 503. Other proxies' load
/// is as unknown as it was at that reading; each holds its own level, so the sum stays
/// what it was.
pub fn admit_local(inflight: u64, safe: u64) -> Result<Admit, Reject> {
    if inflight < safe {
        Ok(Admit::Any)
    } else {
        Err(Reject::StaleLoad)
    }
}

/// What to close for a back-end whose accept queue holds `backlog` connections while
/// this proxy holds `idle` idle connections to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relief {
    /// Idle pooled connections to close now.
    pub close_idle: u64,
    /// Connections to close instead of pooling as they come back.
    pub close_on_return: u64,
}

/// The queue-relief rule, pure. On a prefork server each connection this proxy keeps
/// open pins a worker, so each queued connection waits for one of them to close: close
/// idle ones now, at most as many as are queued, and for the rest of the queue, close
/// connections as they come back instead of pooling them (their workers then take the
/// queued connections at once, rather than waiting for the next sample).
pub fn relief(backlog: u64, idle: u64) -> Relief {
    let close_idle = backlog.min(idle);
    Relief {
        close_idle,
        close_on_return: backlog - close_idle,
    }
}

/// What decided one per-back-end admission check (the "which signal decided"
/// accounting): the metric's reading against its limit or budget, an idle pooled
/// connection, or the stale policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decided {
    /// The metric's reading was below the limit (or, for `delay`, the budget).
    Below,
    /// At the limit, but an idle pooled connection could carry it (queue metrics).
    ReuseOnly,
    /// At or above the limit / budget: refused.
    Over,
    /// No fresh reading; the stale policy admitted.
    StaleAdmit,
    /// No fresh reading; the stale policy refused.
    StaleReject,
    /// No load data configured for the back-end: admitted on local state only.
    NoData,
}

impl Decided {
    pub const ALL: [Decided; 6] = [
        Decided::Below,
        Decided::ReuseOnly,
        Decided::Over,
        Decided::StaleAdmit,
        Decided::StaleReject,
        Decided::NoData,
    ];

    /// Label value in `farside_admission_checks_total{decided=...}`.
    pub fn name(self) -> &'static str {
        match self {
            Decided::Below => "below_limit",
            Decided::ReuseOnly => "reuse_only",
            Decided::Over => "over_limit",
            Decided::StaleAdmit => "stale_admit",
            Decided::StaleReject => "stale_reject",
            Decided::NoData => "no_data",
        }
    }

    /// What decided a check of `load` that ended in `r`.
    pub fn of(load: Load, r: &Result<Admit, Reject>) -> Decided {
        match (load, r) {
            (Load::Unknown, _) => Decided::NoData,
            (Load::Stale, Ok(_)) => Decided::StaleAdmit,
            (Load::Stale, Err(_)) => Decided::StaleReject,
            (Load::Known(_), Ok(Admit::Any)) => Decided::Below,
            (Load::Known(_), Ok(Admit::ReuseOnly)) => Decided::ReuseOnly,
            (Load::Known(_), Err(_)) => Decided::Over,
        }
    }
}
