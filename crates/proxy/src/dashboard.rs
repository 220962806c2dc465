//! The operator's live dashboard, served by the admin listener (`admin_listen`) next to
//! `/metrics`: `GET /` is one HTML page (assets embedded in the binary, the chart library
//! vendored under `assets/vendor/`), `GET /events[?hz=N]` a server-sent-events stream of
//! JSON snapshots ([`farside_admin::HZ_DEFAULT`] a second, capped at
//! [`farside_admin::HZ_MAX`]; at most [`farside_admin::STREAMS_MAX`] streams).
//!
//! A snapshot is built from the very samples a `/metrics` scrape reads (the same render
//! closure, into a capturing encoder), so the page never touches the data path: the
//! monitor table's entries, the admission decisions by reason, per-back-end routed
//! counts, the sites. One snapshot per tick is shared by every open stream; none is built
//! while no page is open. Rates (decisions per second, balancing share) are computed by
//! the page from consecutive snapshots' counters and times.
//!
//! Snapshot (one line of JSON):
//!
//! ```text
//! {"t_ms": UNIX ms, "metric": "cpu", "admission": true, "stale_after_ms": 100,
//!  "backends": [{"addr", "site", "transport", "limit",
//!                "v": {"farside_backend_load{metric=cpu}": 3, ...}}],
//!  "sites": [{"name", "id", "hosts": [...]}],
//!  "g": {"farside_admission_decisions_total{stage=request,outcome=admit,reason=}": 9, ...}}
//! ```
//!
//! `v` holds each back-end's samples (labels `backend` and `site` dropped from the key),
//! `g` every sample without a `backend` label; keys are `name{k=v,...}`, in key order.

use crate::config::ProxyConfig;
use farside_admin::{Dashboard, Encoder, Render, Sample, Value};
use serde::Serialize;
use serde_json::Map;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

const PAGE: &[u8] = include_bytes!("../assets/dashboard.html");
const SCRIPT: &[u8] = include_bytes!("../assets/dashboard.js");
const STYLE: &[u8] = include_bytes!("../assets/dashboard.css");
const UPLOT_JS: &[u8] = include_bytes!("../assets/vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &[u8] = include_bytes!("../assets/vendor/uplot/uPlot.min.css");
const UPLOT_LICENSE: &[u8] = include_bytes!("../assets/vendor/uplot/LICENSE");

/// The running configuration, read at each snapshot (a reload changes it).
pub type CurrentConfig = Arc<dyn Fn() -> Arc<ProxyConfig> + Send + Sync>;

/// The dashboard for the admin server: its files, and snapshots from `render` (the
/// `/metrics` render closure) and the running configuration.
pub fn dashboard(render: Render, cfg: CurrentConfig) -> Dashboard {
    Dashboard {
        files: vec![
            ("/", "text/html; charset=utf-8", PAGE),
            ("/dashboard.js", "text/javascript; charset=utf-8", SCRIPT),
            ("/dashboard.css", "text/css; charset=utf-8", STYLE),
            (
                "/vendor/uplot/uPlot.iife.min.js",
                "text/javascript; charset=utf-8",
                UPLOT_JS,
            ),
            (
                "/vendor/uplot/uPlot.min.css",
                "text/css; charset=utf-8",
                UPLOT_CSS,
            ),
            (
                "/vendor/uplot/LICENSE",
                "text/plain; charset=utf-8",
                UPLOT_LICENSE,
            ),
        ],
        snapshot: Arc::new(move || {
            let mut enc = Encoder::capturing();
            render(&mut enc);
            let t_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            snapshot(&enc.into_samples(), &cfg(), t_ms)
        }),
    }
}

/// How the proxy reads a back-end's load: the region's scheme, `table` (a shared
/// monitor table), or `none`.
fn transport(cfg: &ProxyConfig, i: usize) -> &str {
    match cfg.backends[i].region.as_deref() {
        Some(r) => r.split(':').next().unwrap_or(""),
        None if cfg.monitor.table.is_some() => "table",
        None => "none",
    }
}

/// One snapshot: the shape the page reads (serialised in this field order).
#[derive(Serialize)]
struct Snapshot<'a> {
    t_ms: u64,
    metric: &'a str,
    admission: bool,
    stale_after_ms: u64,
    backends: Vec<BackendView<'a>>,
    sites: Vec<SiteView<'a>>,
    g: Map<String, serde_json::Value>,
}

/// One back-end in a snapshot: its configuration and its samples.
#[derive(Serialize)]
struct BackendView<'a> {
    addr: &'a str,
    site: &'a str,
    transport: &'a str,
    /// None (JSON null) when the back-end has no admission limit.
    limit: Option<u64>,
    /// The metric it is admitted by (`farside_backend_admission_metric`), when it differs
    /// from the configured one: `backlog` under metric `delay` for a back-end whose
    /// records carry no queueing delay. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    metric: Option<String>,
    v: Map<String, serde_json::Value>,
}

/// One site in a snapshot.
#[derive(Serialize)]
struct SiteView<'a> {
    name: &'a str,
    id: usize,
    hosts: &'a [String],
}

/// One snapshot of `samples` (a capturing scrape) with `cfg`'s back-ends and sites.
pub fn snapshot(samples: &[Sample], cfg: &ProxyConfig, t_ms: u64) -> String {
    let addrs: Vec<String> = cfg.backends.iter().map(|b| b.addr.to_string()).collect();
    let index: HashMap<&str, usize> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (a.as_str(), i))
        .collect();
    let mut per: Vec<Map<String, serde_json::Value>> = vec![Map::new(); addrs.len()];
    let mut global = Map::new();
    for s in samples {
        let backend = s.labels.iter().find(|(k, _)| k == "backend");
        let out = match backend {
            Some((_, a)) => match index.get(a.as_str()) {
                Some(&i) => &mut per[i],
                None => continue,
            },
            None => &mut global,
        };
        let mut key = s.name.clone();
        let mut first = true;
        for (k, v) in &s.labels {
            if backend.is_some() && (k == "backend" || k == "site") {
                continue;
            }
            key.push(if first { '{' } else { ',' });
            first = false;
            let _ = write!(key, "{k}={v}");
        }
        if !first {
            key.push('}');
        }
        out.insert(key, json_value(s.value));
    }
    let a = &cfg.admission;
    let backends = cfg
        .backends
        .iter()
        .zip(per)
        .enumerate()
        .map(|(i, (b, v))| BackendView {
            addr: &addrs[i],
            site: &b.site,
            transport: transport(cfg, i),
            limit: Some(cfg.limit_for(i)).filter(|&l| l != u64::MAX),
            metric: admitted_by(&v).filter(|m| m != a.metric.name()),
            v,
        })
        .collect();
    let sites = cfg
        .sites
        .iter()
        .enumerate()
        .map(|(i, s)| SiteView {
            name: &s.name,
            id: s.id.map_or(i, usize::from),
            hosts: &s.hosts,
        })
        .collect();
    let snap = Snapshot {
        t_ms,
        metric: a.metric.name(),
        admission: a.enabled,
        stale_after_ms: a.stale_after_ms,
        backends,
        sites,
        g: global,
    };
    serde_json::to_string(&snap).expect("a snapshot of strings and numbers serialises")
}

/// The metric a back-end's samples `v` say it is admitted by
/// (`farside_backend_admission_metric{metric=NAME}`), if they say.
fn admitted_by(v: &Map<String, serde_json::Value>) -> Option<String> {
    const KEY: &str = "farside_backend_admission_metric{metric=";
    v.keys().find_map(|k| {
        k.strip_prefix(KEY)
            .and_then(|m| m.strip_suffix('}'))
            .map(str::to_string)
    })
}

/// A sample's value as JSON: NaN and infinities (not JSON numbers) as null.
fn json_value(v: Value) -> serde_json::Value {
    match v {
        Value::U(v) => v.into(),
        Value::I(v) => v.into(),
        Value::F(v) => serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_groups_by_backend_and_escapes() {
        let cfg: ProxyConfig = toml::from_str(
            "listen = \"127.0.0.1:0\"\n\
             [admission]\nmetric = \"backlog\"\n\
             [[backend]]\naddr = \"127.0.0.1:1\"\nregion = \"tcp:127.0.0.1:9\"\n\
             [[backend]]\naddr = \"127.0.0.1:2\"\nsite = \"a\\\"b\"\n",
        )
        .unwrap();
        let mut e = Encoder::capturing();
        e.counter(
            "farside_admission_decisions_total",
            "D.",
            &[("stage", "request"), ("outcome", "admit"), ("reason", "")],
            5u64,
        );
        e.gauge(
            "farside_backend_load",
            "L.",
            &[
                ("backend", "127.0.0.1:2"),
                ("site", "a\"b"),
                ("metric", "cpu"),
            ],
            -1i64,
        );
        e.gauge("x", "X.", &[("backend", "10.0.0.1:1")], 1u64);
        // Admitted by the configured metric: no `metric` of its own.
        e.gauge(
            "farside_backend_admission_metric",
            "M.",
            &[
                ("backend", "127.0.0.1:1"),
                ("site", ""),
                ("metric", "backlog"),
            ],
            1u64,
        );
        e.gauge("nan", "N.", &[], f64::NAN);
        let s = snapshot(&e.into_samples(), &cfg, 7);
        assert_eq!(
            s,
            "{\"t_ms\":7,\"metric\":\"backlog\",\"admission\":false,\"stale_after_ms\":100,\"backends\":[\
             {\"addr\":\"127.0.0.1:1\",\"site\":\"\",\"transport\":\"tcp\",\"limit\":2,\
             \"v\":{\"farside_backend_admission_metric{metric=backlog}\":1}},\
             {\"addr\":\"127.0.0.1:2\",\"site\":\"a\\\"b\",\"transport\":\"none\",\"limit\":2,\
             \"v\":{\"farside_backend_load{metric=cpu}\":-1}}],\"sites\":[],\
             \"g\":{\"farside_admission_decisions_total{stage=request,outcome=admit,reason=}\":5,\
             \"nan\":null}}"
        );
    }

    #[test]
    fn a_backend_admitted_by_another_metric_says_which() {
        let cfg: ProxyConfig = toml::from_str(
            "listen = \"127.0.0.1:0\"\n\
             [admission]\nmetric = \"delay\"\n\
             [[backend]]\naddr = \"127.0.0.1:1\"\nregion = \"tcp:127.0.0.1:9\"\n\
             [[backend]]\naddr = \"127.0.0.1:2\"\nregion = \"tcp:127.0.0.1:9\"\n",
        )
        .unwrap();
        let mut e = Encoder::capturing();
        for (addr, m) in [("127.0.0.1:1", "delay"), ("127.0.0.1:2", "backlog")] {
            e.gauge(
                "farside_backend_admission_metric",
                "M.",
                &[("backend", addr), ("site", ""), ("metric", m)],
                1u64,
            );
        }
        let s: serde_json::Value =
            serde_json::from_str(&snapshot(&e.into_samples(), &cfg, 7)).unwrap();
        assert_eq!(s["metric"], "delay");
        assert!(s["backends"][0].get("metric").is_none(), "{s}");
        assert_eq!(s["backends"][1]["metric"], "backlog", "{s}");
    }
}
