//! HAProxy, the anchor of the admission comparison: the `haproxy` system of
//! `lab admission`.
//!
//! HAProxy has no view of the back-ends' load; it limits what it sends them. Each server
//! gets `maxconn` = the back-end's connection capacity (its workers), so HAProxy holds
//! at most that many requests in service per back-end and queues the rest in its own
//! per-server queue; a request still queued after `timeout queue` is answered 503. With a
//! short queue timeout this is admission control by connection counting, the usual way
//! to protect back-ends with HAProxy. Everything else is as HAProxy ships it: keep-alive
//! to clients (`option http-keep-alive`, its default mode), `http-reuse safe` (its
//! default, so the line is not written), `balance leastconn` (the connection-aware
//! balancer, as the farside proxy balances by its own in-flight counts).
//!
//! Two configurations, because operators differ where several HAProxies share the
//! back-ends (`multi-proxy`): `haproxy` gives every proxy the full per-server `maxconn`
//! (each proxy protects the back-end as if it were alone: N proxies may put N × C
//! connections on a back-end of capacity C, an over-commit some operators accept
//! knowingly), `haproxy-divided` divides C among the proxies ([`divided_maxconn`]), so
//! the tier as a whole never holds more than C in service per back-end. With one proxy
//! the two are the same configuration.
//!
//! Rejections are signalled as the farside proxy signals them: HAProxy's own 503 (a
//! request still queued after `timeout queue`, or no server) carries `Retry-After`
//! ([`RETRY_AFTER_S`] s, written as `http-error status 503 ... hdr Retry-After`), the
//! farside proxy's default `retry_after_s`. Closed-loop clients honour it the same way for every system
//! (the loadgen's `--on-reject backoff`: a uniform wait in [0, min(cap, Retry-After)]).
//!
//! The lab writes the configuration ([`HaproxyConfig::render`]); the same text with
//! symbolic addresses is in `summary.json` (`params.haproxy_config`) and the report.

use crate::fabric::procs::Child;
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Where HAProxy is looked for when `$HAPROXY` is not set (Debian's path first).
pub const BINARY_PATHS: [&str; 3] = [
    "/usr/sbin/haproxy",
    "/usr/local/sbin/haproxy",
    "/usr/bin/haproxy",
];
/// Highest process-wide and front-end connection limit written: above the loadgen's most
/// clients (`farside_loadgen::CLIENTS_MAX`, 10,000) so that only the per-server `maxconn`
/// and the queue decide, never a front-end limit the other systems do not have.
pub const MAXCONN_GLOBAL_MAX: u64 = 20_000;
/// File descriptors HAProxy keeps for itself beyond two per connection (listeners, logs,
/// pollers, pipes).
const FD_RESERVE: u64 = 100;

/// The global `maxconn`: [`MAXCONN_GLOBAL_MAX`], lowered so that two descriptors per
/// connection fit under this host's hard `RLIMIT_NOFILE` (HAProxy refuses to start when
/// it cannot raise its limit that far).
pub fn maxconn_global() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    let fds: u64 = r.rlim_max;
    (fds.saturating_sub(FD_RESERVE) / 2).clamp(1, MAXCONN_GLOBAL_MAX)
}
/// Default `timeout queue`, ms: short, so a request HAProxy cannot place on a server
/// within a few service times is refused (503) rather than kept waiting for seconds.
pub const TIMEOUT_QUEUE_MS_DEFAULT: u64 = 50;
/// `timeout connect`, ms: back-ends are on this machine; a connect that takes longer is
/// a failure, as it is for the farside proxy.
pub const TIMEOUT_CONNECT_MS: u64 = 5_000;
/// `Retry-After` of HAProxy's 503, s: the farside proxy's default (`[admission]
/// retry_after_s = 1`), so that a rejected closed-loop client waits the same way behind
/// either proxy. Without it the loadgen's back-off starts at a ceiling of 50 ms and
/// doubles per consecutive rejection, against 1 s after farside's 503, so clients
/// rejected by HAProxy came back far sooner (a multi-proxy run had ~32k attempts against
/// HAProxy, ~22k against farside): the comparison would rest on how clients back off.
pub const RETRY_AFTER_S: u32 = 1;
/// Body of HAProxy's 503 (plain text, as the farside proxy's).
const REJECT_BODY: &str = "no server slot within timeout queue";

/// Per-proxy `maxconn` of one server when `proxies` HAProxies share a back-end of
/// `capacity` connections (`haproxy-divided`): equal shares, the remainder to the first
/// proxies (16 over 3: 6, 5, 5), so the shares add up to the capacity. A share is at
/// least 1: `maxconn 0` would mean no limit to HAProxy, and a proxy with no slot could
/// serve nothing; with more proxies than connections the tier over-commits by the
/// difference, the least it can.
pub fn divided_maxconn(capacity: u64, proxies: usize) -> Vec<u64> {
    let n = proxies.max(1) as u64;
    (0..n)
        .map(|i| (capacity / n + u64::from(i < capacity % n)).max(1))
        .collect()
}

/// One HAProxy instance's configuration.
#[derive(Debug, Clone)]
pub struct HaproxyConfig {
    /// Front-end address (`bind`), as text so a symbolic form can be rendered.
    pub listen: String,
    /// Back-end addresses, one `server` line each.
    pub servers: Vec<String>,
    /// Per-server `maxconn`: the back-end's connection capacity.
    pub maxconn_per_server: u64,
    /// `timeout queue`, ms.
    pub timeout_queue_ms: u64,
    /// `timeout client` and `timeout server`, ms: the clients' request timeout.
    pub timeout_ms: u64,
    /// `nbthread`: the proxy's worker threads (as `proxy --workers`).
    pub threads: usize,
    /// Global and front-end `maxconn` ([`maxconn_global`]).
    pub maxconn_global: u64,
    /// `Retry-After` of HAProxy's own 503, s ([`RETRY_AFTER_S`]); `None`: HAProxy's
    /// stock 503, without the header.
    pub retry_after_s: Option<u32>,
    /// Address of a separate stats listener (`/stats;csv`, where the lab reads HAProxy's
    /// queue and response times: [`fetch_times`]); `None`: none. Not subject to the
    /// front-end's connections, as farside's admin listener.
    pub stats_listen: Option<String>,
    /// The back-end's balancing lines: `balance leastconn` for the admission anchor;
    /// `lab coop`'s anchor hashes the URL with bounded load ([`url_hash_balance`]).
    pub balance: Vec<String>,
}

/// `hash-balance-factor` of `lab coop`'s anchor, percent: a server takes a request
/// while its load stays under 125 % of the average, the value the HAProxy
/// documentation's bounded-load example shows (and the paper of Mirrokni et al.
/// recommends: 1 + ε with ε = 0.25).
pub const HASH_BALANCE_FACTOR: u32 = 125;

/// The balancing lines of `lab coop`'s anchor: consistent hashing of the URL
/// (`balance uri`, `hash-type consistent`) with bounded load (`hash-balance-factor`).
pub fn url_hash_balance(factor: u32) -> Vec<String> {
    vec![
        "balance uri".into(),
        "hash-type consistent".into(),
        format!("hash-balance-factor {factor}"),
    ]
}

impl HaproxyConfig {
    /// The configuration with `listen` and `servers` given as addresses.
    pub fn new(listen: SocketAddr, servers: &[SocketAddr]) -> HaproxyConfig {
        HaproxyConfig {
            listen: listen.to_string(),
            servers: servers.iter().map(|s| s.to_string()).collect(),
            maxconn_per_server: 16,
            timeout_queue_ms: TIMEOUT_QUEUE_MS_DEFAULT,
            timeout_ms: 10_000,
            threads: 1,
            maxconn_global: maxconn_global(),
            retry_after_s: Some(RETRY_AFTER_S),
            stats_listen: None,
            balance: vec!["balance leastconn".into()],
        }
    }

    /// The same configuration with symbolic addresses (`<proxy>`, `<b0>`, ...): what the
    /// summary and the report show, identical across runs whose ports differ.
    pub fn symbolic(&self) -> HaproxyConfig {
        HaproxyConfig {
            listen: "<proxy>".into(),
            servers: (0..self.servers.len()).map(|i| format!("<b{i}>")).collect(),
            stats_listen: self.stats_listen.as_ref().map(|_| "<stats>".into()),
            ..self.clone()
        }
    }

    /// The `haproxy.cfg` text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# Written by farside lab admission (system haproxy).");
        let _ = writeln!(s, "global");
        let _ = writeln!(s, "    nbthread {}", self.threads.max(1));
        let _ = writeln!(s, "    maxconn {}", self.maxconn_global);
        let _ = writeln!(s, "defaults");
        let _ = writeln!(s, "    mode http");
        let _ = writeln!(s, "    option http-keep-alive");
        let _ = writeln!(s, "    # http-reuse: HAProxy's default (safe)");
        let _ = writeln!(s, "    maxconn {}", self.maxconn_global);
        let _ = writeln!(s, "    timeout connect {TIMEOUT_CONNECT_MS}ms");
        let _ = writeln!(s, "    timeout client {}ms", self.timeout_ms);
        let _ = writeln!(s, "    timeout server {}ms", self.timeout_ms);
        let _ = writeln!(s, "    timeout queue {}ms", self.timeout_queue_ms);
        if let Some(r) = self.retry_after_s {
            let _ = writeln!(
                s,
                "    http-error status 503 content-type text/plain string \"{REJECT_BODY}\" \
                 hdr Retry-After {r}"
            );
        }
        let _ = writeln!(s, "frontend fe");
        let _ = writeln!(s, "    bind {}", self.listen);
        let _ = writeln!(s, "    default_backend be");
        let _ = writeln!(s, "backend be");
        for line in &self.balance {
            let _ = writeln!(s, "    {line}");
        }
        for (i, srv) in self.servers.iter().enumerate() {
            let _ = writeln!(
                s,
                "    server b{i} {srv} maxconn {}",
                self.maxconn_per_server
            );
        }
        if let Some(st) = &self.stats_listen {
            let _ = writeln!(s, "listen stats");
            let _ = writeln!(s, "    bind {st}");
            let _ = writeln!(s, "    stats enable");
            let _ = writeln!(s, "    stats uri /stats");
        }
        s
    }
}

/// The report's section on the anchors of a run with `params`: HAProxy's configuration
/// (`params.haproxy_config`) with its per-proxy `maxconn` and the rule
/// (`haproxy_maxconn`, `haproxy_maxconn_rule`), Envoy's (`envoy_config`), and the
/// rejection signalling every system shares (`rejection_signalling`). Empty for runs
/// that recorded none of them.
pub fn anchors_html(params: &serde_json::Value) -> String {
    use crate::svg::escape;
    let text = |k: &str| params.get(k).and_then(|v| v.as_str());
    let mut out = String::new();
    let pre = |out: &mut String, title: &str, system: &str, cfg: &str| {
        let _ = writeln!(
            out,
            "<h2>{title} configuration</h2>\n<p class=\"meta\">As the lab wrote it for the \
             <code>{system}</code> system (addresses symbolic).</p>\n<pre>{}</pre>",
            escape(cfg)
        );
    };
    if let Some(cfg) = text("haproxy_config") {
        pre(&mut out, "HAProxy", "haproxy", cfg);
        if let (Some(rule), Some(by)) =
            (text("haproxy_maxconn_rule"), params.get("haproxy_maxconn"))
        {
            let _ = writeln!(
                out,
                "<p class=\"meta\">Per-server maxconn by system and scenario (one value per \
                 proxy): <code>{}</code>. {}</p>",
                escape(&by.to_string()),
                escape(rule)
            );
        }
    }
    if let Some(cfg) = text("envoy_config") {
        pre(&mut out, "Envoy", "envoy-ac", cfg);
    }
    if let Some(r) = params.get("rejection_signalling") {
        let _ = writeln!(
            out,
            "<p class=\"meta\">Rejection signalling, the same for every system: \
             <code>{}</code></p>",
            escape(&r.to_string())
        );
    }
    out
}

/// Longest the lab waits for HAProxy's stats page.
const STATS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// Most bytes of the stats page read: a few lines per server.
const STATS_BYTES_MAX: u64 = 1 << 20;

/// HAProxy's own timings of its back-end `be`, ms: its averages over its last 1024
/// requests (`qtime`, `ctime`, `rtime`, `ttime` of the stats CSV).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Times {
    /// Mean wait in HAProxy's queue for a server slot.
    pub queue_ms: f64,
    /// Mean time to connect to a server.
    pub connect_ms: f64,
    /// Mean time from sending the request to the server's response.
    pub response_ms: f64,
    /// Mean total time of a request.
    pub total_ms: f64,
}

/// Parse `/stats;csv`: the `be,BACKEND` row's `qtime`, `ctime`, `rtime`, `ttime`.
pub fn parse_times(csv: &str) -> Option<Times> {
    // The header line starts with `# pxname`; anything before it (a chunk size) is
    // skipped.
    let mut lines = csv.lines().skip_while(|l| !l.starts_with("# pxname"));
    let head: Vec<&str> = lines.next()?.trim_start_matches("# ").split(',').collect();
    let col = |n: &str| head.iter().position(|h| *h == n);
    let (px, sv) = (col("pxname")?, col("svname")?);
    let (q, c, r, t) = (col("qtime")?, col("ctime")?, col("rtime")?, col("ttime")?);
    let row: Vec<&str> = lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|f| f.get(px) == Some(&"be") && f.get(sv) == Some(&"BACKEND"))?;
    let num = |i: usize| {
        row.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Some(Times {
        queue_ms: num(q),
        connect_ms: num(c),
        response_ms: num(r),
        total_ms: num(t),
    })
}

/// The body of a chunked HTTP/1.1 response (HAProxy answers its stats page so): the
/// chunks' data joined, up to the last chunk or the first malformed size line.
pub fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            out.push_str(after.get(..n.min(after.len())).unwrap_or(""));
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    out
}

/// Fetch and parse HAProxy's stats CSV from `addr` (its `stats_listen`).
pub fn fetch_times(addr: SocketAddr) -> io::Result<Times> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, STATS_TIMEOUT)?;
    s.set_read_timeout(Some(STATS_TIMEOUT))?;
    s.write_all(b"GET /stats;csv HTTP/1.0\r\nHost: lab\r\n\r\n")?;
    let mut raw = String::new();
    s.take(STATS_BYTES_MAX).read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or(("", ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    parse_times(&body).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{addr}/stats;csv: no `be,BACKEND` row with qtime/ctime/rtime/ttime"),
        )
    })
}

/// The HAProxy binary: `$HAPROXY`, else the first of [`BINARY_PATHS`] that exists.
pub fn find_binary() -> io::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HAPROXY") {
        let p = PathBuf::from(p);
        if p.exists() {
            return Ok(p);
        }
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("$HAPROXY={}: no such file", p.display()),
        ));
    }
    BINARY_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "system haproxy: HAProxy not found (looked in {}; set $HAPROXY)",
                    BINARY_PATHS.join(", ")
                ),
            )
        })
}

/// Write `cfg` to `dir/NAME.cfg`, check it with `haproxy -c`, and return the path and
/// the arguments that run it in the foreground (`-db`: no daemon, logs to stderr).
pub fn prepare(
    bin: &Path,
    cfg: &HaproxyConfig,
    dir: &Path,
    name: &str,
) -> io::Result<(PathBuf, Vec<String>)> {
    let path = dir.join(format!("{name}.cfg"));
    std::fs::write(&path, cfg.render())?;
    let out = std::process::Command::new(bin)
        .arg("-c")
        .arg("-f")
        .arg(&path)
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", bin.display())))?;
    if !out.status.success() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: HAProxy refused the configuration: {}{}",
                path.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ));
    }
    Ok((
        path.clone(),
        vec!["-f".into(), path.display().to_string(), "-db".into()],
    ))
}

/// Start HAProxy on this host (loopback lab), pinned to `cpus`.
pub fn start_local(
    bin: &Path,
    cfg: &HaproxyConfig,
    logs: &Path,
    name: &str,
    cpus: Option<&[usize]>,
) -> io::Result<Child> {
    let (_, args) = prepare(bin, cfg, logs, name)?;
    Child::spawn_pinned(name, bin, &args, logs, cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_limits_each_server_to_its_workers_with_a_short_queue() {
        let mut c = HaproxyConfig::new(
            "127.0.0.1:8080".parse().unwrap(),
            &[
                "127.0.0.1:9001".parse().unwrap(),
                "127.0.0.1:9002".parse().unwrap(),
            ],
        );
        c.maxconn_per_server = 16;
        c.timeout_queue_ms = 50;
        let text = c.render();
        assert!(text.contains("bind 127.0.0.1:8080"), "{text}");
        assert!(
            text.contains("server b0 127.0.0.1:9001 maxconn 16"),
            "{text}"
        );
        assert!(
            text.contains("server b1 127.0.0.1:9002 maxconn 16"),
            "{text}"
        );
        assert!(text.contains("timeout queue 50ms"), "{text}");
        // HAProxy's 503 carries the farside proxy's Retry-After.
        assert!(
            text.contains(&format!(
                "http-error status 503 content-type text/plain string \"{REJECT_BODY}\" \
                 hdr Retry-After {RETRY_AFTER_S}\n"
            )),
            "{text}"
        );
        let mut stock = c.clone();
        stock.retry_after_s = None;
        assert!(!stock.render().contains("http-error"));
        // http-reuse is left at HAProxy's default.
        assert!(!text.contains("\n    http-reuse"), "{text}");
        let sym = c.symbolic().render();
        assert!(sym.contains("bind <proxy>") && sym.contains("server b1 <b1> maxconn 16"));
        assert!(!sym.contains("listen stats"));
        c.stats_listen = Some("127.0.0.1:8081".into());
        let sym = c.symbolic().render();
        assert!(sym.contains("listen stats\n    bind <stats>\n"), "{sym}");
    }

    #[test]
    fn stats_csv_gives_the_backends_queue_and_response_times() {
        let csv = "1f3\n# pxname,svname,qcur,qtime,ctime,rtime,ttime,\n\
                   fe,FRONTEND,,,,,,\n\
                   be,b0,0,7,0,3,11,\n\
                   be,BACKEND,0,12,1,4,18,\n";
        let t = parse_times(csv).unwrap();
        assert_eq!(
            (t.queue_ms, t.connect_ms, t.response_ms, t.total_ms),
            (12.0, 1.0, 4.0, 18.0)
        );
        assert!(parse_times("# pxname,svname\nbe,BACKEND\n").is_none());
        // A row split across two chunks is joined again.
        let body = "12\r\n# pxname,svname,qt\r\nd\r\nime,ctime,rti\r\n0\r\n\r\n";
        assert_eq!(dechunk(body), "# pxname,svname,qtime,ctime,rti");
    }

    #[test]
    fn divided_maxconn_shares_the_capacity_among_the_proxies() {
        assert_eq!(divided_maxconn(16, 3), vec![6, 5, 5]);
        assert_eq!(divided_maxconn(16, 2), vec![8, 8]);
        assert_eq!(divided_maxconn(16, 1), vec![16]);
        assert_eq!(divided_maxconn(16, 4).iter().sum::<u64>(), 16);
        // Fewer connections than proxies: every proxy keeps one slot (maxconn 0 would
        // be no limit at all).
        assert_eq!(divided_maxconn(2, 3), vec![1, 1, 1]);
    }

    /// Real HAProxy in front of a server that accepts and never answers, one slot:
    /// the second request waits in HAProxy's queue past `timeout queue` and gets the
    /// 503 the lab configured, with its Retry-After.
    #[test]
    fn haproxy_answers_a_queue_timeout_with_503_and_retry_after() {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        let bin = match find_binary() {
            Ok(b) => b,
            Err(e) => {
                farside_testkit::skip(
                    "haproxy_answers_a_queue_timeout_with_503_and_retry_after",
                    &e.to_string(),
                );
                return;
            }
        };
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let silent_addr = silent.local_addr().unwrap();
        // Holds every accepted connection open, unanswered, until the test ends.
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for c in silent.incoming() {
                match c {
                    Ok(c) => held.push(c),
                    Err(_) => return,
                }
            }
        });
        let listen: SocketAddr = format!(
            "127.0.0.1:{}",
            crate::nginx::free_port(std::net::Ipv4Addr::LOCALHOST.into()).unwrap()
        )
        .parse()
        .unwrap();
        let mut c = HaproxyConfig::new(listen, &[silent_addr]);
        c.maxconn_per_server = 1;
        c.timeout_queue_ms = 50;
        let dir = std::env::temp_dir().join(format!("farside-haproxy-ra-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = start_local(&bin, &c, &dir, "ra", None).unwrap();
        child.wait_port(listen).unwrap();
        let get = || {
            let mut s = TcpStream::connect(listen).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: lab\r\n\r\n").unwrap();
            s
        };
        // The first request takes the only slot and is never answered.
        let _first = get();
        // A later request queues behind it and must get the queue timeout's 503. Should
        // HAProxy not have placed the first one yet, the second takes the slot and is
        // never answered (the read times out, empty): then the next one queues.
        let mut reply = String::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let mut s = get();
            s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap_or(0);
            reply = String::from_utf8_lossy(&buf[..n]).into_owned();
            if !reply.is_empty() {
                break;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        drop(child);
        let head = reply.to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 503"), "{reply}");
        assert!(
            head.contains(&format!("\r\nretry-after: {RETRY_AFTER_S}\r\n")),
            "{reply}"
        );
    }

    #[test]
    fn the_installed_haproxy_accepts_the_config() {
        let bin = match find_binary() {
            Ok(b) => b,
            Err(e) => {
                farside_testkit::skip("the_installed_haproxy_accepts_the_config", &e.to_string());
                return;
            }
        };
        let dir = std::env::temp_dir().join(format!("farside-haproxy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = HaproxyConfig::new(
            "127.0.0.1:1".parse().unwrap(),
            &["127.0.0.1:2".parse().unwrap()],
        );
        prepare(&bin, &c, &dir, "check").unwrap();
        let mut st = c.clone();
        st.stats_listen = Some("127.0.0.1:3".into());
        prepare(&bin, &st, &dir, "stats").unwrap();
        let mut bad = c.clone();
        bad.listen = "not-an-address".into();
        let e = prepare(&bin, &bad, &dir, "bad").unwrap_err();
        assert!(e.to_string().contains("refused the configuration"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
