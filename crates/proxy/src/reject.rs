//! Why a connection or request is refused: one typed reason each, and the one place
//! they become HTTP statuses. Refused by the control layer ([`crate::gate::Gate`]) or
//! by the upstream pool ([`crate::pool`]: a back-end's `maxconn` stayed reached), so it
//! sits below both.

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
    /// The chosen back-end's connection cap (`maxconn`) stayed reached for the whole
    /// `http.queue_timeout_ms`: the request waited in the proxy's queue and gave up.
    QueueTimeout,
    /// The Host names a `[[sites]]` site, but no back-end's served role is that site
    /// ([`crate::sites`]).
    SiteUnserved,
}

impl Reject {
    /// Every rejection reason, in the order of [`Reject::index`] (metric label order).
    pub const ALL: [Reject; 6] = [
        Reject::Overloaded,
        Reject::StaleLoad,
        Reject::UnknownSite,
        Reject::NoBackend,
        Reject::QueueTimeout,
        Reject::SiteUnserved,
    ];

    /// Position in [`Reject::ALL`], for per-reason counter arrays.
    pub fn index(self) -> usize {
        match self {
            Reject::Overloaded => 0,
            Reject::StaleLoad => 1,
            Reject::UnknownSite => 2,
            Reject::NoBackend => 3,
            Reject::QueueTimeout => 4,
            Reject::SiteUnserved => 5,
        }
    }

    /// HTTP status for this rejection. The only place rejections become statuses.
    pub fn status(self) -> u16 {
        match self {
            Reject::Overloaded
            | Reject::StaleLoad
            | Reject::NoBackend
            | Reject::QueueTimeout
            | Reject::SiteUnserved => 503,
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
            Reject::QueueTimeout => "queue_timeout",
            Reject::SiteUnserved => "site_unserved",
        }
    }
}
