//! Flags of `farside proxy` and `farside monitor`, merged over an optional TOML file
//! ([`proxy_config`], [`monitor_config`]), and `farside proxy --check-config`
//! ([`check_config`]).

use super::{BackendConfig, BalancePolicy, Metric, ProxyConfig, StalePolicy};
use farside_rmem::Target as RegionSource;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Parse `ADDR[,site=NAME][,region=shm:PATH|tcp:HOST:PORT|udp:HOST:PORT][,limit=N][,maxconn=N]`.
pub fn parse_backend(s: &str) -> Result<BackendConfig, String> {
    let mut parts = s.split(',');
    let addr = parts.next().unwrap_or_default();
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| format!("`{addr}`: not an IP:PORT address: {e}"))?;
    let mut b = BackendConfig {
        addr,
        site: String::new(),
        region: None,
        limit: None,
        maxconn: None,
    };
    for kv in parts {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("`{kv}`: expected key=value"))?;
        match k {
            "site" => b.site = v.to_string(),
            "region" => {
                RegionSource::parse(v)?;
                b.region = Some(v.to_string());
            }
            "limit" => b.limit = Some(v.parse().map_err(|e| format!("limit `{v}`: {e}"))?),
            "maxconn" => b.maxconn = Some(v.parse().map_err(|e| format!("maxconn `{v}`: {e}"))?),
            _ => {
                return Err(format!(
                    "`{k}`: unknown back-end option (site, region, limit, maxconn)"
                ))
            }
        }
    }
    Ok(b)
}

fn parse_metric(s: &str) -> Result<Metric, String> {
    Ok(match s {
        "conns" => Metric::Conns,
        "backlog" => Metric::Backlog,
        "pending" => Metric::Pending,
        "cpu" => Metric::Cpu,
        "pressure" => Metric::Pressure,
        "runnable" => Metric::Runnable,
        "inflight" => Metric::Inflight,
        "delay" => Metric::Delay,
        _ => {
            return Err(format!(
            "`{s}`: expected conns, backlog, pending, cpu, pressure, runnable, inflight or delay"
        ))
        }
    })
}

fn parse_balance(s: &str) -> Result<BalancePolicy, String> {
    Ok(match s {
        "round-robin" => BalancePolicy::RoundRobin,
        "least-loaded" => BalancePolicy::LeastLoaded,
        "p2c" => BalancePolicy::P2c,
        "lard" => BalancePolicy::Lard,
        "bounded-hash" => BalancePolicy::BoundedHash,
        _ => {
            return Err(format!(
                "`{s}`: expected round-robin, least-loaded, p2c, lard or bounded-hash"
            ))
        }
    })
}

fn parse_stale(s: &str) -> Result<StalePolicy, String> {
    Ok(match s {
        "reject" => StalePolicy::Reject,
        "admit" => StalePolicy::Admit,
        "local" => StalePolicy::Local,
        _ => return Err(format!("`{s}`: expected local, reject or admit")),
    })
}

/// Flags shared by `proxy` and `monitor`: where the back-ends are.
#[derive(Debug, Clone, clap::Args)]
pub struct BackendFlags {
    /// TOML configuration file (see README); flags given as well override its values.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Back-end: ADDR[,site=NAME][,region=shm:PATH|tcp:HOST:PORT|udp:HOST:PORT[?key=ID:PATH]]
    /// [,limit=N][,maxconn=N]. Repeatable; replaces the file's back-ends. `?key=`: the
    /// rmem key its reads are sealed with (key id and key file), as given to its gatherd
    /// --rmem-key reader:ID:PATH. `maxconn`: most upstream
    /// connections (busy + idle) kept open to it; set it to its workers or fewer.
    #[arg(long = "backend", value_parser = parse_backend)]
    pub backends: Vec<BackendConfig>,
    /// Monitor poll period G in µs (default 1000).
    #[arg(long)]
    pub monitor_period_us: Option<u64>,
    /// Timeout of one remote read in ms (default 50).
    #[arg(long)]
    pub read_timeout_ms: Option<u64>,
    /// Nice value of the monitor's polling threads, -20..=19 (default 0; negative keeps
    /// them on time on a busy front-end CPU; needs CAP_SYS_NICE).
    #[arg(long, allow_negative_numbers = true)]
    pub monitor_nice: Option<i32>,
    /// Monitor poller threads, each reading its share of the regions every period,
    /// 1..=16 (default: one per 512 back-ends).
    #[arg(long)]
    pub monitor_threads: Option<usize>,
    /// Group reads: every period ONE READ to this IPv4 group ADDR:PORT (e.g.
    /// 239.1.1.1:7000), answered by every back-end's gatherd --group-read from its own
    /// region endpoint; replies matched by source, missing ones retried unicast.
    /// Back-ends with their own read key are read unicast (default: off).
    #[arg(long, value_name = "ADDR:PORT")]
    pub group_read: Option<SocketAddr>,
    /// Where the monitor takes its udp replies from: `udp` (its UDP socket, the
    /// default) or `xsk:IFACE` (AF_XDP sockets on IFACE's RX queues, fed by an XDP
    /// program that takes the replies off the kernel's UDP stack: less CPU per reply;
    /// one poller thread; needs root, else the UDP socket is used with a warning).
    #[arg(long, value_name = "udp|xsk:IFACE", value_parser = parse_monitor_rx)]
    pub monitor_rx: Option<String>,
}

/// `--monitor-rx`: checked here, kept as the configuration's string.
fn parse_monitor_rx(s: &str) -> Result<String, String> {
    s.parse::<farside_monitor::MonitorRx>()
        .map(|_| s.to_string())
}

#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub b: BackendFlags,
    /// Address to accept clients on (required unless in the file).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Data-path workers, 1..=256 (default 1): threads, each with its own runtime and
    /// SO_REUSEPORT listener on --listen, over which the kernel spreads connections.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Spin up to this long before a worker sleeps waiting for I/O, µs (default 0 = off;
    /// max 1000). Spares the sender the cost of waking the proxy (an IPI; costly in
    /// VMs) and raises throughput when the proxy's CPU has idle time, at the price of
    /// that CPU time. Like HAProxy's `busy-polling`, but bounded.
    #[arg(long)]
    pub busy_poll_us: Option<u64>,
    /// Admin listener serving /metrics and the live dashboard at / (default: none).
    /// Bind it to a loopback or management address.
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,
    /// Also answer /farside/metrics on the public --listen port (default off: the
    /// metrics show back-end addresses, loads and roles to any client; read them on
    /// --admin-listen instead).
    #[arg(long)]
    pub data_port_metrics: bool,
    /// Turn admission control on (default off).
    #[arg(long)]
    pub admission: bool,
    /// Admission metric: delay, backlog, pending, conns, cpu, pressure, runnable or
    /// inflight. Default delay (objective-driven: each back-end's queueing delay is kept
    /// under --target-delay-ms by an adaptive budget of requests in flight, read from the
    /// back-end's gatherd run with --watch-port; a back-end whose records carry no delay
    /// reading (its gatherd watches no port) is admitted by backlog, limit 2, until they
    /// do, shown in farside_backend_admission_metric and on the dashboard; with nothing of
    /// this proxy's in flight back-ends tie, and ties rotate). The default is chosen by a
    /// written rule:
    /// the mode with the highest minimum goodput ratio against HAProxy over the choosing
    /// scenarios (`farside lab admission`, closed and open loop, 3 repeats), subject to a
    /// mean p99 at or below HAProxy's in every one; minimum ratios within their spread over
    /// the repeats are a tie, won by the lower largest p99 ratio. Over single and
    /// tenant-load it picked backlog, which held-out mixed-cost showed short of HAProxy
    /// (costly requests hold workers without lengthening the accept queue); over all five
    /// scenarios it picks delay, with the target below: docs/proxy.md ("How the default
    /// mode is chosen") has the runs, and the held-out traces where delay's goodput is
    /// 0.96-0.99x HAProxy's. A fresh budget grows by slow start until the first delay
    /// reading at or above the target; until then a request it refuses is still admitted
    /// while the back-end's accept queue (fresh every sample) holds fewer than 2.
    #[arg(long, value_parser = parse_metric)]
    pub metric: Option<Metric>,
    /// Load limit in the metric's unit; a back-end's `limit=` overrides it. Default, by
    /// rule: backlog, pending: 2 connections waiting beyond the busy workers (at least 1 so
    /// a worker that frees never idles while the proxy sends the next request; at most 2
    /// so admission lets a request wait at most 2 service times on any back-end). conns,
    /// inflight: none, give the back-end's workers (MaxClients) plus the connections
    /// allowed to wait, e.g. 16 + 2 = 18; it is also the back-end's maxconn. cpu, pressure,
    /// runnable: none. delay: the most requests in flight a back-end's budget may grow to
    /// (default http.max_client_conns).
    #[arg(long)]
    pub limit: Option<u64>,
    /// With --metric delay: the queueing delay to keep each back-end under, ms (1..=10000).
    /// Default, by rule: half the queue timeout (--queue-timeout-ms, the operator's bound
    /// on a request's wait before a back-end starts on it; the budget oscillates about its
    /// target, so half the bound leaves the other half for the overshoot): 250 ms with the
    /// default 500, 25 ms with --queue-timeout-ms 50. Each back-end's budget of in-flight
    /// requests grows while its published queueing delay is below this and is cut in
    /// proportion to the overshoot above it.
    #[arg(long)]
    pub target_delay_ms: Option<u64>,
    /// A record not updated for this long is stale, ms (default 100). A connection count
    /// (conns, pending, delay) may be older by its gatherd's counting interval as the
    /// monitor saw it (at most 1 s of it): it is stale once overdue by this much. For
    /// delay, until the monitor has seen that interval (two counts), a reading up to 1 s
    /// old in a fresh record is not stale.
    #[arg(long)]
    pub stale_after_ms: Option<u64>,
    /// What a stale record means: local (default; fail safe, not blind: admit while this
    /// proxy's requests in flight to the back-end are below the most it had in flight at
    /// a fresh reading under the limit, so a dead gatherd neither overloads the back-end
    /// nor refuses everyone), reject (fail safe: refuse) or admit (fail open).
    #[arg(long, value_parser = parse_stale)]
    pub on_stale: Option<StalePolicy>,
    /// Check only per request, not right after accept.
    #[arg(long)]
    pub no_accept_check: bool,
    /// A request class for class-aware admission, repeatable (replaces the file's
    /// [[classes]]): NAME,prefix=/PATH or NAME,path=/EXACT, optionally ,priority=N (lower
    /// is more important; requests matching no class are class `default`, priority 0).
    /// Each class's cost is learned per back-end from measured service times, and it
    /// gets its own bound of requests in flight out of the back-end's budget; lower
    /// priorities are shed first. Needs --admission with --metric delay or inflight.
    #[arg(long = "class", value_name = "NAME,prefix=/P[,priority=N]", value_parser = super::classes::parse_class)]
    pub classes: Vec<super::ClassConfig>,
    /// Balancing: round-robin, least-loaded (default), p2c, or by content: lard or
    /// bounded-hash. The content-aware ones route by the request's path (query
    /// excluded) so each back-end caches its own share of the URLs: lard keeps a path
    /// on the back-end it first went to (the least loaded then) unless that one is
    /// above --lard-high while another is below --lard-low, or at twice --lard-high;
    /// bounded-hash walks a consistent-hash ring (100 points per back-end) from the
    /// path's point to the first back-end whose load is under --hash-balance-factor %
    /// of the mean. Load: this proxy's requests in service per back-end (with
    /// --metric conns and a fresh monitor reading, the larger of that and the
    /// monitor's estimate). At most 64 back-ends; lard remembers at most 32768 paths
    /// (cleared and relearnt when full).
    #[arg(long, value_parser = parse_balance)]
    pub balance: Option<BalancePolicy>,
    /// --balance lard: T_low, requests in service (default 25, the paper's).
    #[arg(long)]
    pub lard_low: Option<u64>,
    /// --balance lard: T_high, requests in service (default 65, the paper's).
    #[arg(long)]
    pub lard_high: Option<u64>,
    /// --balance bounded-hash: the load bound, percent of the mean (HAProxy's
    /// hash-balance-factor; default 125; 0: no bound, pure consistent hashing).
    #[arg(long)]
    pub hash_balance_factor: Option<u64>,
    /// Read the load table of a `farside monitor` from this file instead of embedding
    /// the monitor.
    #[arg(long)]
    pub monitor_table: Option<String>,
    /// Idle keep-alive connections kept per back-end (default 10000, as many as the client
    /// connections the proxy takes, so keep-alive loads do not churn connections; 0 = a new upstream
    /// connection per request, so back-end connection counts equal requests in service).
    #[arg(long)]
    pub pool_idle: Option<usize>,
    /// Most upstream connections (busy + idle) per back-end without a `maxconn=` of its
    /// own, like HAProxy's `server maxconn`: set it to the back-ends' workers (Apache's
    /// MaxClients) or fewer. Default: the back-end's limit with admission on metric
    /// conns or inflight, else http.max_client_conns (default 10000).
    #[arg(long)]
    pub maxconn: Option<usize>,
    /// Most time a request waits in the proxy for a connection when its back-end is at
    /// its maxconn, ms; then 503 queue_timeout (default 500; 0 = do not wait).
    #[arg(long)]
    pub queue_timeout_ms: Option<u64>,
    /// After SIGTERM/SIGINT, time in-flight requests get to finish, ms (default 10000).
    /// The listener closes at once, idle keep-alive clients are closed, busy ones get
    /// `Connection: close`; a second signal exits at once. See README "Operating the
    /// proxy: drain and reload" (SIGHUP re-reads --config; these flags are kept).
    #[arg(long)]
    pub drain_timeout_ms: Option<u64>,
    /// Bind --listen with SO_REUSEPORT, so a new proxy can take the port while this one
    /// drains (zero-downtime restart). Off by default: a second proxy on the port is
    /// then an error.
    #[arg(long)]
    pub reuse_port: bool,
    /// Check the configuration FILE, with the other flags given over it exactly as
    /// `--config FILE` would run it, and exit: 0 with a one-line summary (back-ends,
    /// their region transports, admission metric and limit), or 2 with every error.
    /// Binds no socket and starts no thread (deploy/farside-proxy.service runs it before
    /// every start and reload).
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    pub check_config: Option<PathBuf>,
}

fn load_base(b: &BackendFlags, listen: Option<SocketAddr>) -> Result<ProxyConfig, String> {
    let mut cfg = match &b.config {
        // Validated once the flags are merged over it: a flag may repair the file.
        Some(p) => ProxyConfig::parse_file(p).map_err(|e| e.to_string())?,
        None => {
            let listen = listen.unwrap_or_else(|| "127.0.0.1:0".parse().expect("literal"));
            ProxyConfig::simple(listen, Vec::new())
        }
    };
    if !b.backends.is_empty() {
        cfg.backends = b.backends.clone();
    }
    if let Some(v) = b.monitor_period_us {
        cfg.monitor.period_us = v;
    }
    if let Some(v) = b.monitor_nice {
        cfg.monitor.nice = v;
    }
    if let Some(v) = b.monitor_threads {
        cfg.monitor.threads = v;
    }
    if let Some(v) = b.group_read {
        cfg.monitor.group_read = Some(v);
    }
    if let Some(v) = &b.monitor_rx {
        cfg.monitor.rx = v.clone();
    }
    if let Some(v) = b.read_timeout_ms {
        cfg.monitor.read_timeout_ms = v;
    }
    Ok(cfg)
}

/// The configuration `farside proxy` runs with: the file, the flags over it, validated.
pub fn proxy_config(a: &ProxyArgs) -> Result<ProxyConfig, String> {
    let cfg = merged_config(a)?;
    cfg.validate().map_err(|e| e.to_string())?;
    Ok(cfg)
}

/// The file (if any) with the flags over it, not validated yet.
fn merged_config(a: &ProxyArgs) -> Result<ProxyConfig, String> {
    if a.b.config.is_none() && a.listen.is_none() {
        return Err("proxy: --listen ADDR is required (or --config FILE)".into());
    }
    let mut cfg = load_base(&a.b, a.listen)?;
    if let Some(v) = a.listen {
        cfg.listen = v;
    }
    if let Some(v) = a.workers {
        cfg.workers = v;
    }
    if let Some(v) = a.busy_poll_us {
        cfg.busy_poll_us = v;
    }
    if a.admin_listen.is_some() {
        cfg.admin_listen = a.admin_listen;
    }
    let ad = &mut cfg.admission;
    ad.enabled |= a.admission;
    if let Some(v) = a.metric {
        ad.metric = v;
    }
    if let Some(v) = a.limit {
        ad.limit = Some(v);
    }
    if let Some(v) = a.target_delay_ms {
        ad.target_delay_ms = Some(v);
    }
    if let Some(v) = a.stale_after_ms {
        ad.stale_after_ms = v;
    }
    if let Some(v) = a.on_stale {
        ad.on_stale = v;
    }
    if a.no_accept_check {
        ad.at_accept = false;
    }
    if !a.classes.is_empty() {
        cfg.classes = a.classes.clone();
    }
    if let Some(v) = a.balance {
        cfg.balance.policy = v;
    }
    if let Some(v) = a.lard_low {
        cfg.balance.lard_low = v;
    }
    if let Some(v) = a.lard_high {
        cfg.balance.lard_high = v;
    }
    if let Some(v) = a.hash_balance_factor {
        cfg.balance.hash_balance_factor = v;
    }
    if a.monitor_table.is_some() {
        cfg.monitor.table = a.monitor_table.clone();
    }
    if let Some(v) = a.pool_idle {
        cfg.http.pool_idle_per_backend = v;
    }
    if a.maxconn.is_some() {
        cfg.http.maxconn_per_backend = a.maxconn;
    }
    if let Some(v) = a.queue_timeout_ms {
        cfg.http.queue_timeout_ms = v;
    }
    if let Some(v) = a.drain_timeout_ms {
        cfg.http.drain_timeout_ms = v;
    }
    cfg.reuse_port |= a.reuse_port;
    cfg.data_port_metrics |= a.data_port_metrics;
    Ok(cfg)
}

/// `farside proxy --check-config FILE`: everything `farside proxy --config FILE` (with
/// the same other flags) checks before it starts, without binding a socket or starting
/// a thread. `Ok`: a one-line summary; `Err`: every error found, one per line (a file
/// that cannot be read or parsed is one error; then every invalid key is listed).
pub fn check_config(a: &ProxyArgs) -> Result<String, Vec<String>> {
    let mut a = a.clone();
    let file = a
        .check_config
        .take()
        .ok_or_else(|| vec!["no FILE".to_string()])?;
    a.b.config = Some(file.clone());
    let cfg = merged_config(&a).map_err(|e| vec![format!("{}: {e}", file.display())])?;
    let mut errs: Vec<String> = cfg
        .validation_errors()
        .iter()
        .map(|e| format!("{}: {e}", file.display()))
        .collect();
    // The one start-up step that reads outside the file: an external monitor's table.
    if let Some(t) = &cfg.monitor.table {
        if let Err(e) = std::fs::metadata(t) {
            errs.push(format!(
                "{}: `monitor.table`: {t}: {e} (start `farside monitor --table {t}` first)",
                file.display()
            ));
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok(format!("{}: OK: {}", file.display(), summary(&cfg)))
}

/// One line saying what a valid configuration runs: listeners, back-ends with their
/// region transport (keys redacted) and limit, admission metric and limit (and by which
/// rule), monitor period.
fn summary(cfg: &ProxyConfig) -> String {
    let ad = &cfg.admission;
    let common = cfg.common_limit();
    let backends: Vec<String> = (0..cfg.backends.len())
        .map(|i| {
            let b = &cfg.backends[i];
            let region = match b.region.as_deref().map(RegionSource::parse) {
                Some(Ok(r)) => r.to_string(),
                _ if cfg.monitor.table.is_some() => "monitor table".to_string(),
                _ => "no region".to_string(),
            };
            let mut s = format!("{} via {region}", b.addr);
            if !b.site.is_empty() {
                s += &format!(", site {}", b.site);
            }
            if ad.enabled && common.is_none() {
                if let Some(l) = cfg.configured_limit(i) {
                    s += &format!(", limit {l}");
                }
            }
            format!("[{s}]")
        })
        .collect();
    let admission = if !ad.enabled {
        "admission off".to_string()
    } else {
        let limit = match (common, ad.limit) {
            (Some(l), Some(_)) => format!("limit {l}"),
            (Some(l), None)
                if ad.site_limits.is_empty() && cfg.backends.iter().all(|b| b.limit.is_none()) =>
            {
                format!("limit {l} by the metric's default rule")
            }
            (Some(l), None) => format!("limit {l}"),
            (None, _) => "limit per back-end".to_string(),
        };
        let target = if ad.metric == Metric::Delay {
            format!(
                ", target delay {} ms{}",
                cfg.target_delay_ms(),
                if ad.target_delay_ms.is_none() {
                    " (half the queue timeout)"
                } else {
                    ""
                }
            )
        } else {
            String::new()
        };
        format!(
            "admission on: metric {}, {limit}{target}, on_stale {} after {} ms",
            ad.metric.name(),
            ad.on_stale.name(),
            ad.stale_after_ms
        )
    };
    format!(
        "listen {}{}, {} back-end(s) {}; {admission}; monitor every {} µs at nice {}",
        cfg.listen,
        cfg.admin_listen
            .map(|a| format!(", admin {a}"))
            .unwrap_or_default(),
        cfg.backends.len(),
        backends.join(" "),
        cfg.monitor.period_us,
        cfg.monitor.nice,
    )
}

#[derive(Debug, Clone, clap::Args)]
pub struct MonitorArgs {
    #[command(flatten)]
    pub b: BackendFlags,
    /// Shared-memory file to publish the table in (its directory made 0700 and checked,
    /// the file 0600: see `farside_rt::rundir`).
    #[arg(long, default_value = "/run/farside/monitor.table")]
    pub table: PathBuf,
    /// Stop after this many seconds (default: until SIGINT/SIGTERM).
    #[arg(long)]
    pub duration_s: Option<f64>,
}

/// The configuration `farside monitor` runs with: the file, the flags over it, with at
/// least one back-end, validated.
pub fn monitor_config(a: &MonitorArgs) -> Result<ProxyConfig, String> {
    let cfg = load_base(&a.b, None)?;
    if cfg.backends.is_empty() {
        return Err("monitor: no back-ends (--backend ADDR,region=... or --config FILE)".into());
    }
    cfg.validate().map_err(|e| format!("monitor: {e}"))?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_spec_parses_options_and_rejects_unknown_ones() {
        let b = parse_backend(
            "127.0.0.1:80,site=a.example,region=tcp:127.0.0.1:7001,limit=5,maxconn=16",
        )
        .unwrap();
        assert_eq!(b.site, "a.example");
        assert_eq!(b.limit, Some(5));
        assert_eq!(b.maxconn, Some(16));
        assert!(parse_backend("127.0.0.1:80,maxconn=x")
            .unwrap_err()
            .contains("maxconn"));
        assert!(parse_backend("127.0.0.1:80,colour=red")
            .unwrap_err()
            .contains("colour"));
        assert!(parse_backend("nohost").is_err());
        assert!(parse_backend("127.0.0.1:80,region=ftp:x").is_err());
        let keyed = parse_backend("127.0.0.1:80,region=udp:127.0.0.1:7000?key=5:/k").unwrap();
        assert_eq!(keyed.region.as_deref(), Some("udp:127.0.0.1:7000?key=5:/k"));
        assert!(parse_backend("127.0.0.1:80,region=udp:127.0.0.1:7000?key=zz").is_err());
    }

    #[test]
    fn delay_metric_and_target_parse() {
        assert_eq!(parse_metric("delay"), Ok(Metric::Delay));
        assert!(parse_metric("latency").unwrap_err().contains("delay"));
    }
}
