//! The proxy's and gatherd's `/metrics` are valid Prometheus text exposition (0.0.4),
//! read by a real parser (`prometheus-parse`) and by the strict checks below, which that
//! lenient parser does not make: every family has one HELP and one TYPE line before its
//! samples, a family's samples are contiguous (not interleaved per back-end), label
//! values are escaped, values are numbers. The back-ends' `site` names carry a quote and
//! a backslash so that unescaped label values would fail.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

mod common;
use common::{free_addr, get_raw, spawn, Dir};

/// One GET; the status line and body.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let out = get_raw(addr, path);
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// One sample line, strictly parsed: name, labels (unescaped), value.
type Sample = (String, Vec<(String, String)>, f64);

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .ok_or("no value")?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let eq = rest.find("=\"").ok_or("label without =\"")?;
            let key = &rest[..eq];
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("bad label name {key:?}"));
            }
            let mut chars = rest[eq + 2..].char_indices();
            let mut val = String::new();
            let end = loop {
                match chars.next().ok_or("unterminated label value")? {
                    (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                        '\\' => val.push('\\'),
                        '"' => val.push('"'),
                        'n' => val.push('\n'),
                        c => return Err(format!("bad escape \\{c}")),
                    },
                    (i, '"') => break eq + 2 + i + 1,
                    (_, '\n') => return Err("raw newline in label value".into()),
                    (_, c) => val.push(c),
                }
            };
            labels.push((key.to_string(), val));
            rest = &rest[end..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    let v = rest.strip_prefix(' ').ok_or("no space before value")?;
    let value = match v {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse::<f64>().map_err(|e| format!("value {v:?}: {e}"))?,
    };
    Ok((name.to_string(), labels, value))
}

/// Check `text` strictly; returns family name → type and all samples.
fn check_strict(text: &str) -> (HashMap<String, String>, Vec<Sample>) {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helped = HashSet::new();
    let mut done: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut samples = Vec::new();
    assert!(text.ends_with('\n'), "text ends with a newline");
    for (n, line) in text.lines().enumerate() {
        let ctx = format!("line {}: {line:?}", n + 1);
        if let Some(r) = line.strip_prefix("# HELP ") {
            let name = r.split(' ').next().unwrap().to_string();
            assert!(helped.insert(name.clone()), "second HELP: {ctx}");
            assert!(!done.contains(&name), "family comes back: {ctx}");
            if let Some(c) = current.replace(name.clone()) {
                if c != name {
                    done.insert(c);
                }
            }
        } else if let Some(r) = line.strip_prefix("# TYPE ") {
            let (name, kind) = r.split_once(' ').expect("TYPE name kind");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{ctx}"
            );
            assert_eq!(
                current.as_deref(),
                Some(name),
                "TYPE right after its HELP: {ctx}"
            );
            assert!(
                types.insert(name.into(), kind.into()).is_none(),
                "second TYPE: {ctx}"
            );
        } else {
            assert!(!line.starts_with('#') && !line.is_empty(), "{ctx}");
            let s = parse_sample(line).unwrap_or_else(|e| panic!("{e}: {ctx}"));
            let fam = current.as_deref().expect("sample before any family");
            let kind = types.get(fam).unwrap_or_else(|| panic!("no TYPE: {ctx}"));
            let ok = match kind.as_str() {
                "histogram" => [
                    format!("{fam}_bucket"),
                    format!("{fam}_sum"),
                    format!("{fam}_count"),
                ]
                .contains(&s.0),
                _ => s.0 == fam,
            };
            assert!(ok, "sample outside its family {fam} (interleaved?): {ctx}");
            samples.push(s);
        }
    }
    (types, samples)
}

/// Both parsers agree and the named families are there with their types.
fn check(text: &str, want: &[(&str, &str)]) -> Vec<Sample> {
    let (types, samples) = check_strict(text);
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    for (name, kind) in want {
        assert_eq!(
            types.get(*name).map(String::as_str),
            Some(*kind),
            "family {name} as {kind}:\n{text}"
        );
        let found = scrape.samples.iter().find(|s| s.metric == *name);
        let found = found.unwrap_or_else(|| panic!("prometheus-parse lost {name}:\n{text}"));
        let typed = match (kind, &found.value) {
            (&"counter", prometheus_parse::Value::Counter(_)) => true,
            (&"gauge", prometheus_parse::Value::Gauge(_)) => true,
            (&"histogram", prometheus_parse::Value::Histogram(h)) => !h.is_empty(),
            _ => false,
        };
        assert!(typed, "{name}: parsed as {:?}", found.value);
    }
    // Every sample the parser saw is typed; prometheus-parse only types a histogram's
    // buckets, so its `_sum` and `_count` come back untyped.
    for s in &scrape.samples {
        let histogram_part = ["_sum", "_count"].iter().any(|sfx| {
            s.metric
                .strip_suffix(sfx)
                .is_some_and(|base| types.get(base).map(String::as_str) == Some("histogram"))
        });
        assert!(
            histogram_part || !matches!(s.value, prometheus_parse::Value::Untyped(_)),
            "untyped sample {}: {:?}",
            s.metric,
            s.value
        );
    }
    samples
}

#[test]
fn proxy_and_gatherd_metrics_are_conformant_exposition() {
    let dir = Dir::new("metfmt");
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let backend = free_addr();
    let mut be = spawn(
        "backend",
        &s(&[
            "backend",
            "--listen",
            &backend.to_string(),
            "--workers",
            "1",
        ]),
        &dir,
    );
    be.wait_port(backend).unwrap();
    let region = dir.0.join("node.region");
    let gmetrics = free_addr();
    let mut g = spawn(
        "gatherd",
        &s(&[
            "gatherd",
            "--watch-port",
            &backend.port().to_string(),
            "--shm",
            region.to_str().unwrap(),
            "--metrics-listen",
            &gmetrics.to_string(),
        ]),
        &dir,
    );
    g.wait_file(&region).unwrap();
    g.wait_port(gmetrics).unwrap();
    let (proxy, admin) = (free_addr(), free_addr());
    let site = "q\"x\\y";
    let mut p = spawn(
        "proxy",
        &s(&[
            "proxy",
            "--listen",
            &proxy.to_string(),
            "--admin-listen",
            &admin.to_string(),
            "--admission",
            "--backend",
            &format!("{backend},site={site},region=shm:{}", region.display()),
            "--backend",
            &format!("{},site=plain,region=shm:{}", free_addr(), region.display()),
        ]),
        &dir,
    );
    p.wait_port(admin).unwrap();
    for _ in 0..3 {
        let _ = get(proxy, "/file16k");
    }

    let (status, text) = get(admin, "/metrics");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let samples = check(
        &text,
        &[
            ("farside_proxy_connections_accepted_total", "counter"),
            ("farside_proxy_connections_active", "gauge"),
            ("farside_proxy_responses_total", "counter"),
            ("farside_proxy_request_body_timeouts_total", "counter"),
            ("farside_proxy_response_body_timeouts_total", "counter"),
            ("farside_proxy_request_duration_seconds", "histogram"),
            ("farside_proxy_config_reloads_total", "counter"),
            ("farside_proxy_draining", "gauge"),
            ("farside_admission_decisions_total", "counter"),
            ("farside_admission_checks_total", "counter"),
            ("farside_backend_load", "gauge"),
            ("farside_backend_inflight", "gauge"),
            ("farside_upstream_conns", "gauge"),
            ("farside_monitor_read_seconds", "histogram"),
        ],
    );
    // The escaped site name reads back exactly.
    let sites: HashSet<&str> = samples
        .iter()
        .filter(|s| s.0 == "farside_backend_inflight")
        .flat_map(|s| s.1.iter().filter(|l| l.0 == "site").map(|l| l.1.as_str()))
        .collect();
    assert_eq!(sites, HashSet::from([site, "plain"]), "{text}");
    let responses: f64 = samples
        .iter()
        .filter(|s| s.0 == "farside_proxy_responses_total")
        .map(|s| s.2)
        .sum();
    assert!(responses >= 3.0, "{text}");

    let (status, text) = get(gmetrics, "/metrics");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    check(
        &text,
        &[
            ("farside_gatherd_samples_total", "counter"),
            ("farside_gatherd_sample_cost_ns_max", "gauge"),
            ("farside_gatherd_user_ops_total", "counter"),
            ("farside_gatherd_user_replies_total", "counter"),
        ],
    );
}
