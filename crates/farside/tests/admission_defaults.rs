//! The proxy's out-of-the-box admission (`farside proxy --admission` and nothing else) on
//! real processes: coherent whatever the back-end host.
//!
//! - a gatherd that counts connections rarely (`--conns-every 500`, as its automatic rate
//!   does on a host where a full count costs ~5 ms) causes no stale refusals below
//!   capacity, and a fresh proxy refuses almost nothing below capacity: the default
//!   metric (`delay`) and metric `conns` accept a reading as old as the gatherer's
//!   counting interval (a dead gatherd still goes stale), and the delay budget's slow
//!   start follows demand from its first request;
//! - under a 3× open-loop overload the back-end's accept queue stays within the
//!   operator's queueing bound (`--queue-timeout-ms`, of which the default delay target
//!   is half) expressed in connections (the old default, `conns` with limit 256 and
//!   maxconn 256, let the queue fill up to the back-end's listen backlog, 128 here:
//!   seconds of p99);
//! - a real nginx behind the default admission under 400 closed-loop clients serves
//!   at least half of what it serves without admission (the old default
//!   answered 98% with 503).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{eventually, exe, free_addr, metrics_raw, spawn, Dir};
use farside_lab::fabric::procs::Child;

/// Bound on start-up waits (ports, first records).
const WAIT: Duration = Duration::from_secs(10);

/// A prefork `farside backend` with `workers` workers burning `cpu_us` per request, and a
/// gatherd publishing its region over shm with `gatherd_extra` flags.
fn tier(
    dir: &Dir,
    workers: u32,
    cpu_us: u64,
    gatherd_extra: &[&str],
) -> (SocketAddr, Child, Child) {
    let backend = free_addr();
    let mut be = spawn(
        "backend",
        &[
            "backend",
            "--listen",
            &backend.to_string(),
            "--workers",
            &workers.to_string(),
            "--static-cpu-us",
            &cpu_us.to_string(),
        ],
        dir,
    );
    be.wait_port(backend).unwrap();
    let g = gatherd(dir, backend, gatherd_extra);
    (backend, be, g)
}

fn region_of(dir: &Dir) -> std::path::PathBuf {
    dir.0.join("node.region")
}

fn gatherd(dir: &Dir, backend: SocketAddr, extra: &[&str]) -> Child {
    let region = region_of(dir);
    let mut args = vec![
        "gatherd".to_string(),
        "--watch-port".into(),
        backend.port().to_string(),
        "--shm".into(),
        region.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut g = spawn("gatherd", &args, dir);
    g.wait_file(&region).unwrap();
    g
}

/// `farside proxy --admission` in front of `backend`, plus `extra` flags.
fn proxy(dir: &Dir, backend: SocketAddr, extra: &[&str]) -> (SocketAddr, SocketAddr, Child) {
    let (proxy, admin) = (free_addr(), free_addr());
    let mut args = vec![
        "proxy".to_string(),
        "--listen".into(),
        proxy.to_string(),
        "--admin-listen".into(),
        admin.to_string(),
        "--backend".into(),
        format!("{backend},region=shm:{}", region_of(dir).display()),
        "--admission".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut p = spawn("proxy", &args, dir);
    p.wait_port(proxy).unwrap();
    p.wait_port(admin).unwrap();
    (proxy, admin, p)
}

/// `farside loadgen --target proxy ARGS --json`: its summary.
fn loadgen(proxy: SocketAddr, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(exe())
        .args(["loadgen", "--target", &proxy.to_string()])
        .args(args)
        .args([
            "--warmup-s",
            "0",
            "--timeout-ms",
            "5000",
            "--json",
            "--quiet",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "loadgen: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no `{k}` in {v}"))
}

/// Value of the first metrics line starting with `prefix` (a name with labels), or 0.
fn metric(admin: SocketAddr, prefix: &str) -> u64 {
    metrics_raw(admin)
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn stale_rejects(admin: SocketAddr) -> u64 {
    let m = metrics_raw(admin);
    m.lines()
        .filter(|l| l.starts_with("farside_admission_checks_total{") && l.contains("stale_reject"))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<u64>().ok())
        .sum()
}

/// Whether the proxy at `admin` reports its back-end's load as stale (-1).
fn load_stale(admin: SocketAddr) -> bool {
    metrics_raw(admin)
        .lines()
        .any(|l| l.starts_with("farside_backend_load{") && l.trim_end().ends_with(" -1"))
}

fn startup_log(p: &Child) -> String {
    std::fs::read_to_string(&p.log).unwrap_or_default()
}

#[test]
fn rare_connection_counts_cause_no_stale_refusals_below_capacity() {
    let dir = Dir::new("rare-counts");
    // 4 workers × 2 ms: 2,000 req/s nominal; 100 req/s offered is far below it even on
    // a busy machine. Connections counted every 500 samples (500 ms), 5× the default
    // stale_after.
    let (backend, _be, mut g) = tier(&dir, 4, 2_000, &["--conns-every", "500"]);

    // 1. The proxy's defaults.
    let (px, admin, mut p) = proxy(&dir, backend, &[]);
    let log = startup_log(&p);
    assert!(
        log.contains(
            "metric delay, limit 10000 by the metric's default rule, target delay 250 ms \
             (half the queue timeout)"
        ),
        "start-up log names the default metric, its cap and target: {log}"
    );
    let s = loadgen(px, &["--rate", "100", "--duration-s", "2"]);
    eprintln!("defaults: {s}");
    // What this test is about: no refusal because the count is old (the old code
    // refused 35% of checks as stale here). A fresh delay budget is 1 request in flight
    // and, without slow start, grows one per target delay (250 ms), so Poisson overlaps
    // of two or three requests were refused for seconds; with slow start each
    // completion with the budget in use adds one. A refusal stays possible, but rare.
    assert_eq!(stale_rejects(admin), 0, "no stale refusal: {s}");
    assert!(
        n(&s, "dropped_503") * 50 <= n(&s, "attempts"),
        "at most 2% refused below capacity: {s}"
    );
    assert!(n(&s, "served") > 100, "{s}");
    p.stop();

    // 2. Metric conns, with the limit it needs (4 workers + 2 waiting): a count as old
    //    as the gatherer's counting interval is due, not stale, once the monitor has
    //    seen the interval (two counts).
    let (px, admin, _p) = proxy(&dir, backend, &["--metric", "conns", "--limit", "6"]);
    eventually("the monitor sees the counting interval", WAIT, || {
        metric(admin, "farside_monitor_conns_interval_ns{") > 0
    });
    let before = stale_rejects(admin);
    let s = loadgen(px, &["--rate", "100", "--duration-s", "2"]);
    eprintln!("conns: {s}");
    assert_eq!(stale_rejects(admin), before, "no stale refusal: {s}");

    // A dead gatherd is still stale (its record stops advancing), whatever the interval.
    g.stop();
    eventually("a dead gatherd's count goes stale", WAIT, || {
        load_stale(admin)
    });
}

/// The back-end's accept queue as its gatherd published it (fresh every sample).
fn accept_backlog(region: &Path) -> Option<u64> {
    let bytes = std::fs::read(region).ok()?;
    let s = farside_region::Snapshot::decode(&bytes).ok()?;
    Some(s.load.accept_backlog)
}

/// The operator's queueing bound the overload tests state (`--queue-timeout-ms`), ms: the
/// default delay target is half of it (10 ms, 2.5 kernel ticks).
const QUEUE_MS: &str = "20";

/// Most connections the default admission may let wait in one back-end's accept queue
/// here: the operator's bound (20 ms) in connections of the 2 workers × 5 ms back-end,
/// Q × W / S = 8, doubled for a busy test machine and the budget's overshoot (AIMD
/// oscillates about a target of half of it; the published delay has a 4 ms tick). The
/// old default (metric conns, limit = maxconn = 256) let the queue grow to the
/// back-end's listen backlog (128).
const QUEUE_BOUND: u64 = 16;

#[test]
fn default_admission_keeps_the_accept_queue_short_under_3x_open_loop() {
    let dir = Dir::new("queue-bound");
    // 2 workers × 5 ms: 400 req/s nominal; 1,200 req/s offered is 3× (more on a busy
    // machine, where capacity is lower).
    let (backend, _be, _g) = tier(&dir, 2, 5_000, &[]);
    let (px, admin, _p) = proxy(&dir, backend, &["--queue-timeout-ms", QUEUE_MS]);
    let region = region_of(&dir);
    let (max, s) = max_while(
        move || accept_backlog(&region),
        || loadgen(px, &["--rate", "1200", "--duration-s", "2"]),
    );
    eprintln!("3x: longest accept queue {max}; {s}");
    assert!(
        max <= QUEUE_BOUND,
        "accept queue reached {max} (> {QUEUE_BOUND}); {s}\n{}",
        metrics_raw(admin)
    );
    assert!(n(&s, "served") > 0, "some are served: {s}");
    assert!(n(&s, "dropped_503") > 0, "the excess is refused: {s}");
}

/// The accept queue of the listener on `port`, read with `ss` (Recv-Q of a LISTEN
/// socket), for when no gatherd publishes it.
fn ss_backlog(port: u16) -> Option<u64> {
    let out = std::process::Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .max()
}

/// Runs `f` while a thread records the largest value `probe` returns (every ms).
fn max_while<T>(
    probe: impl Fn() -> Option<u64> + Send + 'static,
    f: impl FnOnce() -> T,
) -> (u64, T) {
    let stop = Arc::new(AtomicBool::new(false));
    let max = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (stop, max) = (stop.clone(), max.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(b) = probe() {
                    max.fetch_max(b, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let r = f();
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    (max.load(Ordering::Relaxed), r)
}

/// The default stale policy (`local`) with a dead gatherd under a 3× overload: the
/// proxy neither refuses everything (`reject`) nor overloads the back-end (`admit`): it
/// holds the concurrency it last saw the back-end take within its limit.
#[test]
fn a_dead_gatherd_under_overload_neither_overloads_nor_refuses_everything() {
    if !farside_testkit::tool_or_skip(
        "a_dead_gatherd_under_overload_neither_overloads_nor_refuses_everything",
        "ss",
        "-V",
        "iproute2",
    ) {
        return;
    }
    let dir = Dir::new("dead-gatherd");
    let (backend, _be, mut g) = tier(&dir, 2, 5_000, &[]);
    let (px, admin, _p) = proxy(
        &dir,
        backend,
        &["--stale-after-ms", "50", "--queue-timeout-ms", QUEUE_MS],
    );
    // Fresh view under overload: the safe level settles at workers + queue.
    let s = loadgen(px, &["--rate", "1200", "--duration-s", "1"]);
    assert!(n(&s, "served") > 0, "{s}");
    // What the stale phase will hold the back-end at, and the budget it came from.
    let level = metric(admin, "farside_backend_safe_inflight{");
    let budget = metric(admin, "farside_backend_limit{");
    eprintln!("fresh 3x: safe level {level}, budget {budget}; {s}");
    g.stop();
    eventually("the record goes stale", WAIT, || load_stale(admin));
    let port = backend.port();
    let (max, s) = max_while(
        move || ss_backlog(port),
        || loadgen(px, &["--rate", "1200", "--duration-s", "2"]),
    );
    eprintln!("dead gatherd, 3x: longest accept queue {max}, safe level {level}; {s}");
    assert!(n(&s, "served") > 100, "not blind: keeps serving: {s}");
    assert!(
        n(&s, "dropped_503") > 0,
        "not open: the excess is refused: {s}"
    );
    assert!(
        max <= QUEUE_BOUND,
        "accept queue reached {max} (> {QUEUE_BOUND}): {s}"
    );
}

/// Of the 200s nginx serves through a proxy without admission, the share the default
/// admission must still serve in the same closed loop (the old default served 2%).
/// Below 1 because admission does refuse while nginx's accept queue holds more than
/// the limit (on a busy machine nginx's one worker is often descheduled): measured
/// 0.97–1.09 on a quiet machine and 0.65 with a fuzzer at nice 19 beside it, so the
/// bound is set at half, far from the old default's 2%, since the two runs compared
/// cannot share the machine's noise.
const NGINX_GOODPUT_SHARE_MIN: f64 = 0.5;

#[test]
fn nginx_behind_the_default_admission_keeps_at_least_half_its_goodput() {
    if let Err(e) = farside_lab::nginx::find_binary() {
        farside_testkit::skip(
            "nginx_behind_the_default_admission_keeps_at_least_half_its_goodput",
            &e.to_string(),
        );
        return;
    }
    let dir = Dir::new("nginx");
    let docroot = dir.0.join("www");
    std::fs::create_dir_all(&docroot).unwrap();
    std::fs::write(docroot.join("file16k"), vec![b'x'; 16 * 1024]).unwrap();
    let port = farside_lab::nginx::free_port("127.0.0.1".parse().unwrap()).unwrap();
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let ngx =
        farside_lab::nginx::Nginx::start(&farside_lab::nginx::NginxConfig::new(listen, &docroot))
            .unwrap();
    let _g = gatherd(&dir, listen, &[]);
    // As `wrk -c400`: 400 clients, a refused one retries at once.
    let run = |px| {
        loadgen(
            px,
            &[
                "--clients",
                "400",
                "--on-reject",
                "retry",
                "--duration-s",
                "3",
            ],
        )
    };
    // Without admission (the same proxy, `--admission` countermanded by a limit no
    // load reaches on the local metric): what nginx serves here.
    let (px, _, mut p) = proxy(
        &dir,
        listen,
        &[
            "--metric",
            "inflight",
            "--limit",
            "1000000",
            "--no-accept-check",
        ],
    );
    let open = run(px);
    assert_eq!(n(&open, "dropped_503"), 0, "{open}");
    p.stop();
    let (px, admin, _p) = proxy(&dir, listen, &[]);
    let s = run(px);
    let (ok, refused) = (n(&s, "served"), n(&s, "dropped_503"));
    let share = ok as f64 / n(&open, "served").max(1) as f64;
    eprintln!(
        "nginx, 400 clients: {ok} served, {refused} refused with the default admission; \
         {} served without ({share:.2}); p99 {} vs {} ms",
        n(&open, "served"),
        s["p99_ms"],
        open["p99_ms"]
    );
    assert!(
        // Refusals are not bounded here: these clients retry a 503 at once, so their
        // count follows how fast a refusal comes back, not how many users were turned
        // away; goodput is the property (the old default served 2% of it).
        share >= NGINX_GOODPUT_SHARE_MIN,
        "default admission served {ok} ({share:.2} of {}), refused {refused}: {s}\n{}",
        n(&open, "served"),
        metrics_raw(admin)
            .lines()
            .filter(|l| l.starts_with("farside_") && !l.trim_end().ends_with(" 0"))
            .filter(|l| !l.contains("_bucket"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    ngx.stop().unwrap();
}
