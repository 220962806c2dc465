//! The node agent: beside gatherd on each back-end, it watches its own `ROLE_WANTED`
//! word, reconfigures the local web server through a callback (nginx: a generated
//! include and a reload; the test server: its own mechanism), and publishes
//! `ROLE_SERVED` only once the server serves the new site. Requests are routed by the
//! served word, so none reaches a node for a site it is still switching to.
//!
//! ```text
//! poll(wanted) ── wanted == served ─────────────────► Idle
//!      │ same site, new version (a fence) ───────────► Publish served = wanted
//!      │ new site ───────────────────────────────────► Apply(site) … applied(result)
//!      │                                   Ok  ─► served = wanted, epoch + 1, error = 0
//!      │                                   Err ─► served kept, error = wanted (reported)
//!      │ the wanted value that last failed, retry not yet due ─► Idle
//! ```
//!
//! The core ([`NodeAgent::poll`], [`NodeAgent::applied`]) is pure; [`NodeAgent::step`]
//! runs it synchronously on the node's own words.

use crate::words::{Role, W_ROLE_EPOCH, W_ROLE_ERROR, W_ROLE_SERVED, W_ROLE_WANTED};
use std::sync::atomic::{AtomicU64, Ordering};

/// Default wait before retrying a wanted role whose apply failed: a failing reload
/// (bad config, full disk) rarely heals in less, and each try costs the server a reload.
pub const APPLY_RETRY_NS_DEFAULT: u64 = 30_000_000_000;

/// What the agent wants done now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentAction {
    /// Nothing to do.
    Idle,
    /// Same site, new version: write `ROLE_SERVED` = this value (no reconfiguration).
    Publish(Role),
    /// Reconfigure the web server for this role's site, then call
    /// [`NodeAgent::applied`] with the result.
    Apply(Role),
}

/// The outcome of an apply, as written to the node's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// `ROLE_SERVED` after the apply (the old role if it failed).
    pub served: Role,
    /// `ROLE_ERROR`: 0, or the wanted value that failed.
    pub error_word: u64,
    /// The failure to report, if any.
    pub error: Option<String>,
}

/// The agent's state.
#[derive(Debug, Clone)]
pub struct NodeAgent {
    served: Role,
    applying: Option<Role>,
    failed: Option<(Role, u64)>,
    retry_ns: u64,
    /// Applies that failed.
    pub failures: u64,
    /// Applies that succeeded.
    pub switches: u64,
}

impl NodeAgent {
    /// An agent whose server serves `served` now; a failed wanted role is retried after
    /// `retry_ns`.
    pub fn new(served: Role, retry_ns: u64) -> NodeAgent {
        NodeAgent {
            served,
            applying: None,
            failed: None,
            retry_ns,
            failures: 0,
            switches: 0,
        }
    }

    /// The role served now.
    pub fn served(&self) -> Role {
        self.served
    }

    /// Is an apply under way?
    pub fn applying(&self) -> Option<Role> {
        self.applying
    }

    /// Look at the wanted word.
    pub fn poll(&mut self, now_ns: u64, wanted: Role) -> AgentAction {
        if self.applying.is_some() || wanted == self.served {
            return AgentAction::Idle;
        }
        if wanted.site() == self.served.site() {
            self.served = wanted;
            self.failed = None;
            return AgentAction::Publish(wanted);
        }
        if let Some((f, at)) = self.failed {
            if f == wanted && now_ns.saturating_sub(at) < self.retry_ns {
                return AgentAction::Idle;
            }
        }
        self.applying = Some(wanted);
        AgentAction::Apply(wanted)
    }

    /// The server reconfiguration for the role [`NodeAgent::poll`] returned finished.
    pub fn applied(&mut self, now_ns: u64, result: Result<(), String>) -> Applied {
        let Some(wanted) = self.applying.take() else {
            return Applied {
                served: self.served,
                error_word: 0,
                error: Some("applied() without an apply under way".into()),
            };
        };
        match result {
            Ok(()) => {
                self.served = wanted;
                self.failed = None;
                self.switches += 1;
                Applied {
                    served: wanted,
                    error_word: 0,
                    error: None,
                }
            }
            Err(e) => {
                self.failed = Some((wanted, now_ns));
                self.failures += 1;
                Applied {
                    served: self.served,
                    error_word: wanted.0,
                    error: Some(format!(
                        "applying site {} (role {:#x}) failed: {e}; still serving site {}",
                        wanted.site(),
                        wanted.0,
                        self.served.site()
                    )),
                }
            }
        }
    }

    /// One synchronous step on the node's own region words: read `ROLE_WANTED`, apply
    /// with `apply(site)` if needed, publish `ROLE_SERVED` / `ROLE_EPOCH` / `ROLE_ERROR`.
    /// Returns the error of a failed apply.
    pub fn step(
        &mut self,
        now_ns: u64,
        words: &[AtomicU64],
        apply: impl FnOnce(u16) -> Result<(), String>,
    ) -> Option<String> {
        let wanted = Role(words[W_ROLE_WANTED].load(Ordering::Acquire));
        match self.poll(now_ns, wanted) {
            AgentAction::Idle => None,
            AgentAction::Publish(r) => {
                words[W_ROLE_SERVED].store(r.0, Ordering::Release);
                None
            }
            AgentAction::Apply(r) => {
                let out = self.applied(now_ns, apply(r.site()));
                words[W_ROLE_ERROR].store(out.error_word, Ordering::Release);
                if out.error.is_none() {
                    words[W_ROLE_SERVED].store(out.served.0, Ordering::Release);
                    words[W_ROLE_EPOCH].fetch_add(1, Ordering::AcqRel);
                }
                out.error
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(served: Role, wanted: Role) -> Vec<AtomicU64> {
        let w: Vec<AtomicU64> = (0..64).map(|_| AtomicU64::new(0)).collect();
        w[W_ROLE_SERVED].store(served.0, Ordering::Relaxed);
        w[W_ROLE_WANTED].store(wanted.0, Ordering::Relaxed);
        w
    }

    #[test]
    fn failed_apply_keeps_old_role_and_reports_error() {
        let old = Role::new(1, 5);
        let new = old.moved_to(2);
        let words = region(old, new);
        let mut agent = NodeAgent::new(old, 1_000);
        let err = agent.step(0, &words, |site| {
            assert_eq!(site, 2);
            Err("nginx -s reload: exit 1".into())
        });
        let err = err.expect("the failure is reported");
        assert!(
            err.contains("nginx") && err.contains("still serving site 1"),
            "{err}"
        );
        assert_eq!(words[W_ROLE_SERVED].load(Ordering::Relaxed), old.0);
        assert_eq!(words[W_ROLE_ERROR].load(Ordering::Relaxed), new.0);
        assert_eq!(words[W_ROLE_EPOCH].load(Ordering::Relaxed), 0);
        assert_eq!(agent.served(), old);
        // Not retried before the backoff, retried after it; success clears the error.
        assert_eq!(
            agent.step(500, &words, |_| panic!("retried too early")),
            None
        );
        assert_eq!(agent.step(1_000, &words, |_| Ok(())), None);
        assert_eq!(words[W_ROLE_SERVED].load(Ordering::Relaxed), new.0);
        assert_eq!(words[W_ROLE_ERROR].load(Ordering::Relaxed), 0);
        assert_eq!(words[W_ROLE_EPOCH].load(Ordering::Relaxed), 1);
    }

    #[test]
    fn fence_republishes_without_reconfiguring() {
        let old = Role::new(3, 9);
        let fenced = Role(old.0 + 1);
        let words = region(old, fenced);
        let mut agent = NodeAgent::new(old, 1_000);
        assert_eq!(
            agent.step(0, &words, |_| panic!("no reload for a fence")),
            None
        );
        assert_eq!(words[W_ROLE_SERVED].load(Ordering::Relaxed), fenced.0);
    }
}
