//! The proxy and its stand-alone monitor as processes (`farside proxy`, `farside
//! monitor`): the configuration from the file and flags ([`crate::config::cli`]), the
//! control layer, and beside the data path ([`crate::server`]) the reconfiguration
//! driver ([`crate::reconf`]), each started here and neither from inside the other.

use crate::config::cli::{monitor_config, proxy_config, MonitorArgs, ProxyArgs};
use crate::config::Metric;
use crate::control::Control;
use crate::gate::Gate;
use crate::lifecycle::Reloader;
use crate::reconf::ReconfDriver;
use farside_monitor::{Monitor, Target as RegionSource, Watch};
use std::sync::Arc;
use std::time::Duration;

/// `farside proxy`: run until SIGTERM or SIGINT (a drain), reloading on SIGHUP.
pub fn run(a: ProxyArgs) -> Result<(), String> {
    let cfg = proxy_config(&a)?;
    let ctl = Control::new(&cfg).map_err(|e| format!("proxy: {e}"))?;
    log::info!(
        "proxy: {} → {} back-end(s); admission {} (metric {}, limit {}{}); monitor every {} µs",
        cfg.listen,
        cfg.backends.len(),
        if cfg.admission.enabled { "on" } else { "off" },
        cfg.admission.metric.name(),
        match (cfg.common_limit(), cfg.admission.limit) {
            (Some(l), Some(_)) => l.to_string(),
            (Some(l), None) => format!("{l} by the metric's default rule"),
            (None, _) if cfg.admission.enabled => "per back-end".to_string(),
            (None, _) => "none".to_string(),
        },
        if cfg.admission.metric == Metric::Delay {
            format!(
                ", target delay {} ms{}",
                cfg.target_delay_ms(),
                if cfg.admission.target_delay_ms.is_none() {
                    " (half the queue timeout)"
                } else {
                    ""
                }
            )
        } else {
            String::new()
        },
        cfg.monitor.period_us,
    );
    // Once per process (a reload keeps it and ignores `[reconf]` changes): it serves
    // this proxy's own region, and its counters join the admin listener's scrape. It
    // stops when the proxy has stopped (dropped at the end of this function).
    let reconf = ReconfDriver::start(&cfg).map_err(|e| format!("proxy: {e}"))?;
    let beside = reconf.as_ref().map(|r| {
        let stats = r.stats();
        let render: farside_admin::Render = Arc::new(move |enc| crate::reconf::render(&stats, enc));
        render
    });
    // SIGHUP: the file read again, the same flags over it (flags win and are kept).
    let reloader: Reloader = Arc::new(move || {
        let cfg = proxy_config(&a)?;
        let ctl = Control::new(&cfg).map_err(|e| format!("control layer: {e}"))?;
        let gate: Arc<dyn Gate> = Arc::new(ctl);
        Ok((cfg, gate))
    });
    crate::server::run_with_reload(cfg, Arc::new(ctl), Some(reloader), beside)
        .map_err(|e| format!("proxy: {e}"))
}

/// `farside monitor`: poll every back-end's region into the shared table until `wait`
/// returns (a termination signal, or `--duration-s`).
pub fn run_monitor(a: MonitorArgs, wait: impl FnOnce(Option<Duration>)) -> Result<(), String> {
    let cfg = monitor_config(&a)?;
    let mut watches = Vec::new();
    for (i, b) in cfg.backends.iter().enumerate() {
        let r = b
            .region
            .as_deref()
            .ok_or_else(|| format!("monitor: backend[{i}] ({}) has no region=", b.addr))?;
        watches.push(Watch {
            index: i,
            name: b.addr.to_string(),
            region: RegionSource::parse(r)?,
        });
    }
    let table =
        farside_monitor::create_table(Some(&a.table), cfg.backends.len(), cfg.monitor.period_us)
            .map_err(|e| format!("monitor: {}: {e}", a.table.display()))?;
    let stale_after = Duration::from_millis(cfg.admission.stale_after_ms);
    let opts = cfg
        .monitor
        .options(stale_after)
        .map_err(|e| format!("monitor: {e}"))?;
    let _m = Monitor::start(watches, table, opts).map_err(|e| format!("monitor: {e}"))?;
    log::info!(
        "monitor: {} back-end(s) every {} µs → {}",
        cfg.backends.len(),
        cfg.monitor.period_us,
        a.table.display()
    );
    wait(a.duration_s.map(Duration::from_secs_f64));
    Ok(())
}
