//! gatherd's Prometheus endpoint: the admin HTTP server shared with the proxy
//! ([`farside_admin::AdminServer`]: one blocking thread, one short request per
//! connection, bounded request size and time). It never touches the sampling loop; the
//! text comes from the one encoder ([`farside_admin::Encoder`]) via
//! [`crate::render_metrics`].

pub use farside_admin::{AdminServer as MetricsServer, Render};
