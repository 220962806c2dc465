//! Content-aware balancing (`balance.policy = "lard"` or `"bounded-hash"`): the request's
//! path chooses the back-end, so each back-end's cache holds its own share of the URLs
//! instead of every back-end caching every hot object.
//!
//! The decisions are `farside_coop::policy`'s pure state machines, the code the
//! cooperative-caching simulator runs:
//! - **LARD** (Pai et al., ASPLOS 1998): a path stays on the back-end it was first sent
//!   to (the least loaded then) unless that back-end is above T_high while another is
//!   below T_low, or at 2·T_high; then it moves to the least loaded;
//! - **bounded-load consistent hashing** (Mirrokni, Thorup, Zadimoghaddam; HAProxy's
//!   `hash-type consistent` + `hash-balance-factor`): the path's point on a ring of
//!   [`RING_POINTS_PER_NODE`] points per back-end, walked to the first back-end whose
//!   load stays under `factor`% of the mean.
//!
//! This module is the edge that feeds them the proxy's view ([`Candidates`]): a back-end
//! is usable when the ordinary checks let it take the request (right site, not marked
//! down, admitted if admission is on); its load is this proxy's requests in service at
//! it, or, with metric `conns` and a fresh monitor reading, the larger of that and the
//! monitor's estimate of the back-end's connections (its one-sided read every period,
//! plus what this proxy sent since, minus this proxy's idle pooled connections), which
//! counts the load other front-ends put on it too.
//!
//! Bounds: at most [`CONTENT_BACKENDS_MAX`] back-ends (the policies keep per-node state
//! in arrays); LARD's path table holds at most [`LARD_TARGETS_MAX`] paths and is cleared
//! and relearnt when full (a moment of worse locality, never a wrong route).

use farside_coop::policy::{BoundedHash, ClusterView, Lard, NodeId, Request};
use std::sync::Mutex;

pub use farside_coop::policy::{LARD_TARGETS_MAX, RING_POINTS_PER_NODE};

/// Back-ends a content-aware policy routes over at most: the coop policies' own bound
/// (`farside_coop::policy::NODES_MAX`), which keeps a decision's view in fixed arrays.
pub const CONTENT_BACKENDS_MAX: usize = farside_coop::policy::NODES_MAX;

/// LARD's T_low by default, requests: the paper's 25.
pub const LARD_LOW_DEFAULT: u64 = 25;
/// LARD's T_high by default, requests: the paper's 65.
pub const LARD_HIGH_DEFAULT: u64 = 65;
/// Largest T_high accepted: twice it must fit a back-end's load (u64) with room, and a
/// back-end with more than a million requests in service is a unit mistake.
pub const LARD_HIGH_MAX: u64 = 1_000_000;
/// `hash-balance-factor` by default, percent: 125, the value HAProxy's documentation
/// suggests (and the lab's anchor runs).
pub const HASH_BALANCE_FACTOR_DEFAULT: u64 = 125;
/// Largest `hash-balance-factor`, percent: beyond 100× the mean the bound never acts.
pub const HASH_BALANCE_FACTOR_MAX: u64 = 10_000;

/// The key of a request-line target: FNV-1a (64 bits) of its path, query excluded (the
/// back-ends cache by file). Two paths with one key share a back-end, nothing more.
pub fn object_key(target: &[u8]) -> u64 {
    let path = target.split(|&b| b == b'?').next().unwrap_or(target);
    path.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A content-aware policy and its state.
pub enum Content {
    /// LARD's path table changes with every new path: one lock, held for a table look-up.
    Lard(Mutex<Lard>),
    /// The ring never changes: decisions share it without a lock.
    Bounded(BoundedHash),
}

impl Content {
    /// LARD with thresholds `low` < `high` (requests).
    pub fn lard(low: u64, high: u64) -> Content {
        Content::Lard(Mutex::new(Lard::new(low, high)))
    }

    /// Bounded-load consistent hashing over `backends` (1..=[`CONTENT_BACKENDS_MAX`])
    /// with `factor_pct` (0: no bound).
    pub fn bounded(backends: usize, factor_pct: u64) -> Content {
        Content::Bounded(BoundedHash::new(backends, factor_pct))
    }

    /// The back-end for the request with key `object`, and whether only onto an idle
    /// pooled connection; `None` when no back-end is usable.
    pub fn decide(&self, object: u64, view: &Candidates) -> Option<(usize, bool)> {
        if !view.usable[..view.n].contains(&true) {
            return None;
        }
        let req = Request {
            object,
            bytes: 0,
            initial: 0,
        };
        let node = match self {
            Content::Lard(l) => l
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .decide(&req, view),
            Content::Bounded(h) => h.decide(&req, view),
        }
        .node;
        // The policies route to a usable node while one exists.
        view.usable[node].then_some((node, view.reuse_only[node]))
    }

    /// The back-end LARD assigned `object` to, if any (bounded hashing keeps no table).
    pub fn assigned(&self, object: u64) -> Option<usize> {
        match self {
            Content::Lard(l) => l.lock().unwrap_or_else(|p| p.into_inner()).assigned(object),
            Content::Bounded(_) => None,
        }
    }
}

/// One decision's view of the back-ends, in fixed arrays (no allocation per request).
pub struct Candidates {
    n: usize,
    usable: [bool; CONTENT_BACKENDS_MAX],
    load: [u64; CONTENT_BACKENDS_MAX],
    reuse_only: [bool; CONTENT_BACKENDS_MAX],
}

impl Candidates {
    /// `n` back-ends (at most [`CONTENT_BACKENDS_MAX`]), none usable yet.
    pub fn new(n: usize) -> Candidates {
        Candidates {
            n: n.min(CONTENT_BACKENDS_MAX),
            usable: [false; CONTENT_BACKENDS_MAX],
            load: [0; CONTENT_BACKENDS_MAX],
            reuse_only: [false; CONTENT_BACKENDS_MAX],
        }
    }

    /// Back-end `i` can take the request, with `load`; `reuse_only` as admission said.
    pub fn offer(&mut self, i: usize, load: u64, reuse_only: bool) {
        if i < self.n {
            self.usable[i] = true;
            self.load[i] = load;
            self.reuse_only[i] = reuse_only;
        }
    }
}

impl ClusterView for Candidates {
    fn nodes(&self) -> usize {
        self.n
    }
    fn cached(&self, _: NodeId, _: u64) -> bool {
        false
    }
    fn hint(&self, _: NodeId, _: NodeId, _: u64) -> bool {
        false
    }
    fn load(&self, node: NodeId) -> u64 {
        self.load[node]
    }
    fn usable(&self, node: NodeId) -> bool {
        self.usable[node]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(n: usize, loads: &[u64]) -> Candidates {
        let mut c = Candidates::new(n);
        for (i, &l) in loads.iter().enumerate() {
            c.offer(i, l, false);
        }
        c
    }

    #[test]
    fn keys_ignore_the_query_and_differ_by_path() {
        assert_eq!(object_key(b"/a/b.gif?x=1"), object_key(b"/a/b.gif"));
        assert_ne!(object_key(b"/a/b.gif"), object_key(b"/a/c.gif"));
    }

    #[test]
    fn lard_keeps_a_path_on_its_back_end_until_the_thresholds_move_it() {
        let c = Content::lard(2, 4);
        let k = object_key(b"/x");
        assert_eq!(c.decide(k, &all(3, &[3, 1, 2])), Some((1, false)));
        assert_eq!(c.assigned(k), Some(1));
        assert_eq!(
            c.decide(k, &all(3, &[0, 4, 0])),
            Some((1, false)),
            "at T_high"
        );
        assert_eq!(
            c.decide(k, &all(3, &[3, 5, 1])),
            Some((2, false)),
            "above, 2 below T_low"
        );
        assert_eq!(
            c.decide(k, &all(3, &[0, 0, 8])),
            Some((0, false)),
            "at 2 T_high"
        );
    }

    #[test]
    fn bounded_hash_spills_past_the_bound_and_skips_unusable_back_ends() {
        let c = Content::bounded(4, 125);
        let k = object_key(b"/y");
        let (home, _) = c.decide(k, &all(4, &[0; 4])).unwrap();
        let mut loads = [1u64; 4];
        loads[home] = 10;
        let (spill, _) = c.decide(k, &all(4, &loads)).unwrap();
        assert_ne!(spill, home);
        let mut v = all(4, &[0; 4]);
        v.usable[home] = false;
        assert_ne!(c.decide(k, &v).unwrap().0, home);
        assert_eq!(c.decide(k, &Candidates::new(4)), None, "none usable");
        let mut r = Candidates::new(4);
        r.offer(home, 0, true);
        assert_eq!(c.decide(k, &r), Some((home, true)), "reuse-only carried");
    }
}
