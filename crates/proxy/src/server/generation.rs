//! One *generation* (see [`crate::lifecycle`]): a configuration with its control layer
//! and upstream pool, everything an exchange needs, and the one in use (`Live`),
//! swapped by a reload. Every exchange looks it up when its head has been read, so a
//! reload applies to the next request of every connection.

use crate::config::ProxyConfig;
use crate::gate::Gate;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::pool::Pool;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// One generation (see [`crate::lifecycle`]): a configuration with its control layer and
/// upstream pool. Everything an exchange needs.
pub(super) struct Shared {
    pub(super) cfg: Arc<ProxyConfig>,
    pub(super) gate: Arc<dyn Gate>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) pool: Arc<Pool>,
    pub(super) life: Arc<Lifecycle>,
    pub(super) header_timeout: Duration,
    pub(super) idle_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) queue_timeout: Duration,
    pub(super) request_body_timeout: Duration,
    pub(super) response_body_timeout: Duration,
    pub(super) body_rate_grace: Duration,
}

/// What reading a request head needs, copied out of the generation so that a client
/// idling between requests does not keep a replaced generation (and its monitor) alive.
#[derive(Clone, Copy)]
pub(super) struct HeadLimits {
    pub(super) max_headers: usize,
    pub(super) max_header_bytes: usize,
    pub(super) header_timeout: Duration,
    pub(super) idle_timeout: Duration,
    /// Forward a client's `RDMA:` header (`http.pass_rdma_header`).
    pub(super) pass_rdma: bool,
}

/// The generation in use, swapped by a reload, and the state every generation shares.
pub(super) struct Live {
    pub(super) current: RwLock<Arc<Shared>>,
    pub(super) life: Arc<Lifecycle>,
    pub(super) metrics: Arc<Metrics>,
}

impl Live {
    pub(super) fn current(&self) -> Arc<Shared> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Make `next` the generation of new requests; retire the one it replaces.
    pub(super) fn swap(&self, next: Arc<Shared>) {
        let old = std::mem::replace(
            &mut *self.current.write().unwrap_or_else(|p| p.into_inner()),
            next,
        );
        old.pool.retire();
    }
}

impl Shared {
    pub(super) fn new(
        cfg: Arc<ProxyConfig>,
        gate: Arc<dyn Gate>,
        metrics: Arc<Metrics>,
        life: Arc<Lifecycle>,
    ) -> Self {
        let h = &cfg.http;
        let ms = Duration::from_millis;
        let maxconn: Vec<usize> = (0..cfg.backends.len())
            .map(|i| cfg.maxconn_for(i))
            .collect();
        let pool = Arc::new(Pool::new(
            &maxconn,
            h.pool_idle_per_backend,
            ms(h.pool_idle_timeout_ms),
        ));
        gate.bind_pool(pool.clone());
        Shared {
            pool,
            queue_timeout: ms(h.queue_timeout_ms),
            header_timeout: ms(h.header_timeout_ms),
            idle_timeout: ms(h.idle_timeout_ms),
            connect_timeout: ms(h.connect_timeout_ms),
            response_timeout: ms(h.response_timeout_ms),
            request_body_timeout: ms(h.request_body_timeout_ms),
            response_body_timeout: ms(h.response_body_timeout_ms),
            body_rate_grace: ms(h.body_rate_grace_ms),
            cfg,
            gate,
            metrics,
            life,
        }
    }

    pub(super) fn limits(&self) -> HeadLimits {
        HeadLimits {
            max_headers: self.cfg.http.max_headers,
            max_header_bytes: self.cfg.http.max_header_bytes,
            header_timeout: self.header_timeout,
            idle_timeout: self.idle_timeout,
            pass_rdma: self.cfg.http.pass_rdma_header,
        }
    }
}

/// One scrape of a generation's metrics (data path, lifecycle, control layer), for the
/// admin server and (with `data_port_metrics`) the data port's `/farside/metrics`.
pub(super) fn render_metrics(sh: &Shared, enc: &mut farside_admin::Encoder) {
    sh.metrics.render(enc);
    sh.life.render(enc);
    sh.gate.render_metrics(enc);
}
