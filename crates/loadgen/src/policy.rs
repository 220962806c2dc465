//! How simulated users behave: what a client does after a 503, and when
//! open-loop users arrive. Pure functions of a seeded [`Rng`], so their
//! distributions are tested without timing.
//!
//! On rejection (`--on-reject`, closed loop):
//! - `backoff` (default): the client sleeps a *full-jitter* delay, uniform in
//!   `[0, min(cap, base·2^k)]` where `k` counts its consecutive rejections
//!   (reset by any other outcome), or uniform in `[0, min(cap, Retry-After)]`
//!   when the 503 carried `Retry-After` (delta-seconds). Jitter breaks the
//!   synchronised waves a fixed pause makes; the cap (`--backoff-cap-ms`)
//!   bounds how long a client may leave the experiment.
//! - `retry`: the client sends its next request at once (after its think time).
//! - `leave`: the user gives up: its connection is closed and a new user takes
//!   its place at once (same client slot, fresh connection, fresh session).
//! - `fixed` is what the deprecated `--reject-think-ms` selects: a fixed pause
//!   with no jitter (the old behaviour, kept for old command lines).
//!
//! Open loop (`--rate`): users arrive independently at the offered rate; a
//! rejected user always leaves (it does not retry), see the crate docs.

use std::time::Duration;

use crate::trace::Rng;

/// Longest back-off any client may take, ms: the bound of `--backoff-cap-ms`
/// (a client asleep longer than this has left the experiment in all but name).
pub const BACKOFF_CAP_MS_MAX: u64 = 60_000;
/// Default back-off cap, ms: the paper's clients retried within seconds.
pub const BACKOFF_CAP_MS_DEFAULT: u64 = 2_000;
/// Default first back-off ceiling, ms (`base·2^0`).
pub const BACKOFF_BASE_MS_DEFAULT: u64 = 50;
/// Exponent bound of `base·2^k`: beyond it the cap applies anyway (2^20·1 ms
/// exceeds `BACKOFF_CAP_MS_MAX`) and the shift cannot overflow.
const BACKOFF_EXPONENT_MAX: u32 = 20;

/// What a closed-loop client does after a 503 (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnReject {
    /// Full-jitter exponential back-off honouring `Retry-After`, capped.
    Backoff,
    /// Next request at once.
    Retry,
    /// The user leaves; a new user (new connection) replaces it.
    Leave,
    /// Fixed pause (`--reject-think-ms`, deprecated): no jitter. Not a
    /// value of `--on-reject`.
    #[value(skip)]
    Fixed,
}

impl OnReject {
    /// The flag value, as recorded in the summary.
    pub fn as_str(self) -> &'static str {
        match self {
            OnReject::Backoff => "backoff",
            OnReject::Retry => "retry",
            OnReject::Leave => "leave",
            OnReject::Fixed => "fixed",
        }
    }
}

/// Full-jitter back-off after the `k`-th consecutive rejection (k = 0 for
/// the first): uniform in `[0, min(cap, retry_after)]` if the server sent
/// `Retry-After`, else uniform in `[0, min(cap, base·2^k)]`.
pub fn backoff_delay(
    k: u32,
    retry_after: Option<Duration>,
    base: Duration,
    cap: Duration,
    rng: &mut Rng,
) -> Duration {
    let ceiling = match retry_after {
        Some(ra) => ra.min(cap),
        None => {
            let factor = 1u32 << k.min(BACKOFF_EXPONENT_MAX);
            base.saturating_mul(factor).min(cap)
        }
    };
    ceiling.mul_f64(rng.next_f64())
}

/// How open-loop arrivals are spaced (`--arrivals`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Poisson process: exponential inter-arrival times (independent users).
    Poisson,
    /// Fixed interval 1/rate (a metronome; not a model of users).
    Uniform,
}

/// Seeded generator of open-loop inter-arrival gaps.
#[derive(Debug, Clone)]
pub struct ArrivalGen {
    rng: Rng,
    rate: f64,
    kind: Arrivals,
}

impl ArrivalGen {
    /// Gaps for `rate` arrivals per second (must be > 0).
    pub fn new(kind: Arrivals, rate: f64, seed: u64) -> ArrivalGen {
        assert!(rate > 0.0, "arrival rate must be positive");
        ArrivalGen {
            rng: Rng::new(seed ^ 0xA441_7A15_0000_0001),
            rate,
            kind,
        }
    }

    /// Time from the previous arrival to the next, s.
    pub fn next_gap_s(&mut self) -> f64 {
        match self.kind {
            Arrivals::Uniform => 1.0 / self.rate,
            // Inverse CDF of Exp(rate); 1 - u is in (0, 1], so ln is finite.
            Arrivals::Poisson => -(1.0 - self.rng.next_f64()).ln() / self.rate,
        }
    }
}
