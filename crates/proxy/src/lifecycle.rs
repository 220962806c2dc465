//! The proxy's life after start: graceful drain (SIGTERM) and live reload (SIGHUP).
//!
//! ```text
//! running ──SIGHUP──→ build next config + control layer (off the data path)
//!    │                  ├─ invalid / fails → keep running config, log, count error
//!    │                  └─ ok → new requests use the new generation; the old one's idle
//!    │                         upstream connections close, busy ones close when their
//!    │                         exchange ends; its monitor stops with its last user
//!    └──SIGTERM/SIGINT──→ draining: every worker's listener closed (the kernel refuses
//!                          new SYNs, or a successor bound with SO_REUSEPORT takes them,
//!                          see `crate::server::runtime`'s docs on queued
//!                          connections); idle keep-alive clients closed; in-flight
//!                          responses carry `Connection: close`
//!          ├─ no client connection left ─────────────→ exit 0
//!          ├─ `http.drain_timeout_ms` reached ──────→ exit 0 (logged, the rest cut)
//!          └─ second SIGTERM/SIGINT ────────────────→ exit at once (error)
//! ```
//!
//! A *generation* is one configuration with its control layer ([`Gate`]) and upstream
//! pool. Connections look the current generation up per request, so a reload applies to
//! the next request of every client connection, kept-alive ones included, and never
//! closes a client connection. What a reload cannot change (the listeners, worker
//! threads, busy polling, `reuse_port`, `http.max_client_conns`) needs a restart; a
//! reload that changes them is applied without them and says so in the log.

use crate::config::ProxyConfig;
use crate::gate::Gate;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Builds the next generation on SIGHUP: re-reads the configuration (file, then the
/// command-line flags over it) and starts its control layer. Runs on a blocking thread
/// (starting a monitor waits for its first reads). `Err` keeps the running generation.
pub type Reloader = Arc<dyn Fn() -> Result<(ProxyConfig, Arc<dyn Gate>), String> + Send + Sync>;

/// Period at which a drain checks whether client connections remain: small against
/// any drain timeout, large against the cost of one atomic load.
pub const DRAIN_POLL: Duration = Duration::from_millis(10);

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every client connection finished.
    Drained,
    /// `http.drain_timeout_ms` passed with this many client connections still open.
    Deadline { open: usize },
    /// A second termination signal arrived with this many client connections open.
    Interrupted { open: usize },
}

/// State shared by every generation: the drain flag, the count of open client
/// connections, and reload counters.
pub struct Lifecycle {
    drain: watch::Sender<bool>,
    /// Client connections of the main listener open now (admin ones not counted).
    client_conns: AtomicUsize,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            drain: watch::Sender::new(false),
            client_conns: AtomicUsize::new(0),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
        }
    }
}

impl Lifecycle {
    /// Whether the proxy is draining (after SIGTERM).
    pub fn draining(&self) -> bool {
        *self.drain.borrow()
    }

    /// Resolves once the drain has started.
    pub async fn until_draining(&self) {
        let mut rx = self.drain.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Start draining (idempotent).
    pub fn start_drain(&self) {
        self.drain.send_replace(true);
    }

    /// Client connections open now.
    pub fn client_conns(&self) -> usize {
        self.client_conns.load(Relaxed)
    }

    pub(crate) fn conn_opened(&self) {
        self.client_conns.fetch_add(1, Relaxed);
    }

    pub(crate) fn conn_closed(&self) {
        self.client_conns.fetch_sub(1, Relaxed);
    }

    pub(crate) fn reload_done(&self, ok: bool) {
        if ok {
            self.reloads_ok.fetch_add(1, Relaxed);
        } else {
            self.reloads_failed.fetch_add(1, Relaxed);
        }
    }

    /// Reloads so far: (applied, refused or failed).
    pub fn reloads(&self) -> (u64, u64) {
        (
            self.reloads_ok.load(Relaxed),
            self.reloads_failed.load(Relaxed),
        )
    }

    /// Append the lifecycle's Prometheus metrics.
    pub fn render(&self, enc: &mut farside_admin::Encoder) {
        let (ok, failed) = self.reloads();
        let help =
            "Configuration reloads (SIGHUP) by outcome; an error keeps the running configuration.";
        enc.counter(
            "farside_proxy_config_reloads_total",
            help,
            &[("outcome", "ok")],
            ok,
        );
        enc.counter(
            "farside_proxy_config_reloads_total",
            help,
            &[("outcome", "error")],
            failed,
        );
        enc.gauge(
            "farside_proxy_draining",
            "1 once SIGTERM started the graceful drain.",
            &[],
            self.draining(),
        );
    }
}

/// The settings a reload cannot change (they shape the listeners and the runtime), as
/// `key: running → requested` for each that `next` changes.
pub fn restart_only_changes(running: &ProxyConfig, next: &ProxyConfig) -> Vec<String> {
    let mut v = Vec::new();
    let mut diff = |k: &str, a: String, b: String| {
        if a != b {
            v.push(format!("{k}: {a} → {b}"));
        }
    };
    diff(
        "listen",
        running.listen.to_string(),
        next.listen.to_string(),
    );
    diff(
        "admin_listen",
        format!("{:?}", running.admin_listen),
        format!("{:?}", next.admin_listen),
    );
    diff(
        "workers",
        running.workers.to_string(),
        next.workers.to_string(),
    );
    diff(
        "busy_poll_us",
        running.busy_poll_us.to_string(),
        next.busy_poll_us.to_string(),
    );
    diff(
        "reuse_port",
        running.reuse_port.to_string(),
        next.reuse_port.to_string(),
    );
    // The accept loop's connection semaphore is sized once.
    diff(
        "http.max_client_conns",
        running.http.max_client_conns.to_string(),
        next.http.max_client_conns.to_string(),
    );
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_only_changes_names_listener_and_runtime_keys_only() {
        let a = ProxyConfig::simple("127.0.0.1:80".parse().unwrap(), Vec::new());
        let mut b = a.clone();
        b.admission.limit = Some(7);
        b.http.drain_timeout_ms = 1;
        assert!(restart_only_changes(&a, &b).is_empty());
        b.listen = "127.0.0.1:81".parse().unwrap();
        b.workers = a.workers + 1;
        let c = restart_only_changes(&a, &b);
        assert_eq!(c.len(), 2, "{c:?}");
        assert!(c[0].starts_with("listen: 127.0.0.1:80 → 127.0.0.1:81"));
    }

    #[test]
    fn metrics_count_reloads_and_show_the_drain() {
        let l = Lifecycle::default();
        l.reload_done(true);
        l.reload_done(false);
        l.reload_done(false);
        l.start_drain();
        let mut e = farside_admin::Encoder::new();
        l.render(&mut e);
        let s = e.finish();
        assert!(s.contains("farside_proxy_config_reloads_total{outcome=\"ok\"} 1"));
        assert!(s.contains("farside_proxy_config_reloads_total{outcome=\"error\"} 2"));
        assert!(s.contains("farside_proxy_draining 1"));
    }
}
