//! Pooled upstream connections and prefork back-ends without a region (the `no-ac` system
//! of `farside lab admission`: admission off, bare back-end addresses), on real processes.
//!
//! The lab's set-up in small: two `farside backend`s with the lab's flags (2 workers here
//! instead of 16, `--cpu-us-per-request 1500 --cpu-ns-per-byte 29 --backlog 2048`, the
//! back-end's defaults `--keepalive-max 100 --header-timeout-ms 10000`), a proxy given
//! only their addresses and the lab's `--queue-timeout-ms 50`, and 16 keep-alive
//! closed-loop clients, 4× the workers: 12 connections wait in the back-ends' accept
//! queues whatever the proxy does.
//!
//! Before the fix the proxy handed each returned connection to the next request (LIFO
//! pool), so the 4 connections holding the 4 workers were reused by the same 4 clients
//! until the back-end closed them after `--keepalive-max` (100) requests each, while the
//! other 12 clients' requests waited in the accept queues (6 per back-end) for whole
//! rotations: the first 400 responses all went to 4 clients (measured: 4 of 16 clients
//! served in 6 s with `--keepalive-max 400`; waits of 2–4.6 s with 100). When the load
//! stopped, the pinned connections sat idle in the pool and the queued ones waited for
//! the back-end's idle timeout (10 s). Now a returned connection is closed instead of
//! pooled while a fresh exchange to its back-end has gone the queue timeout without
//! ending, and idle ones are closed then too: the accept queue is served in order.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{free_addr, metrics_raw, spawn, Dir};

/// Workers per back-end (the lab runs 16).
const WORKERS: u32 = 2;
/// Back-ends (the lab's default).
const BACKENDS: usize = 2;
/// Closed-loop clients: 4× the workers of the tier.
const CLIENTS: usize = 4 * WORKERS as usize * BACKENDS;
/// The back-end's `--keepalive-max` (its default, as in the lab).
const KEEPALIVE_MAX: u64 = 100;
/// The back-end's idle timeout, `--header-timeout-ms` (its default, as in the lab).
const BACKEND_IDLE_MS: u64 = 10_000;
/// Responses to wait for: 25 per client. The old pool gave the first
/// `WORKERS × BACKENDS × KEEPALIVE_MAX` = 400 of them to the 4 clients holding workers,
/// so 12 clients had none.
const RESPONSES: u64 = 25 * CLIENTS as u64;
/// Each client's least share of `RESPONSES`: a fifth of an even split, so a descheduled
/// client on this busy machine still passes, and a starved one (0) does not.
const SHARE_MIN: u64 = RESPONSES / CLIENTS as u64 / 5;
/// Bound on the whole run; generous for a machine busy with compiles.
const RUN_LIMIT: Duration = Duration::from_secs(120);
/// Per-read bound of a client: far beyond any wait the fixed proxy causes.
const CLIENT_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The accept queue of the loopback listener on `port` now (`rx_queue` of a LISTEN socket
/// in /proc/net/tcp is its accept backlog).
fn accept_queue(port: u16) -> u64 {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = format!("0100007F:{port:04X}");
    tcp.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A"))
                .then(|| u64::from_str_radix(f[4].split(':').nth(1)?, 16).ok())
                .flatten()
        })
        .next()
        .unwrap_or(0)
}

/// The metric `name` (a counter), summed over its labels.
fn metric_sum(admin: SocketAddr, name: &str) -> u64 {
    metrics_raw(admin)
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// One keep-alive client: GET /file16k in a loop on one connection, counting 200s in
/// `served` and `total`, until the connection ends or an answer is not a 200 (counted in
/// `bad`).
fn client(mut s: TcpStream, served: Arc<AtomicU64>, total: Arc<AtomicU64>, bad: Arc<AtomicU64>) {
    s.set_read_timeout(Some(CLIENT_READ_TIMEOUT)).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut body = Vec::new();
    loop {
        if s.write_all(b"GET /file16k HTTP/1.1\r\nHost: t\r\n\r\n")
            .is_err()
        {
            return;
        }
        let mut len = None;
        let mut status = String::new();
        if r.read_line(&mut status).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse::<usize>().ok();
                }
            }
        }
        let (true, Some(len)) = (status.contains(" 200 "), len) else {
            bad.fetch_add(1, Ordering::Relaxed);
            return;
        };
        body.resize(len, 0);
        if r.read_exact(&mut body).is_err() {
            return;
        }
        served.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn queued_connections_are_served_in_order_not_starved_by_pooled_ones() {
    let dir = Dir::new("pool-fairness");
    let mut backends = Vec::new();
    let mut specs = Vec::new();
    for i in 0..BACKENDS {
        let addr = free_addr();
        let mut be = spawn(
            &format!("backend{i}"),
            &[
                "backend",
                "--listen",
                &addr.to_string(),
                "--workers",
                &WORKERS.to_string(),
                "--cpu-us-per-request",
                "1500",
                "--cpu-ns-per-byte",
                "29",
                "--backlog",
                "2048",
                "--keepalive-max",
                &KEEPALIVE_MAX.to_string(),
                "--header-timeout-ms",
                &BACKEND_IDLE_MS.to_string(),
            ],
            &dir,
        );
        be.wait_port(addr).unwrap();
        backends.push((addr, be));
        specs.push(addr.to_string());
    }
    let (proxy, admin) = (free_addr(), free_addr());
    let mut args = vec![
        "proxy".to_string(),
        "--listen".into(),
        proxy.to_string(),
        "--admin-listen".into(),
        admin.to_string(),
        "--queue-timeout-ms".into(),
        "50".into(),
    ];
    for s in &specs {
        args.extend(["--backend".to_string(), s.clone()]);
    }
    let mut px = spawn("proxy", &args, &dir);
    px.wait_port(proxy).unwrap();
    px.wait_port(admin).unwrap();

    let total = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let s = TcpStream::connect(proxy).unwrap();
        let served = Arc::new(AtomicU64::new(0));
        let handle = s.try_clone().unwrap();
        let (sv, t, b) = (served.clone(), total.clone(), bad.clone());
        let th = std::thread::spawn(move || client(s, sv, t, b));
        clients.push((handle, served, th));
    }
    let t0 = Instant::now();
    let mut queues_seen = vec![0; BACKENDS];
    while total.load(Ordering::Relaxed) < RESPONSES {
        assert!(t0.elapsed() < RUN_LIMIT, "the clients stalled");
        for (q, (addr, _)) in queues_seen.iter_mut().zip(&backends) {
            *q = (*q).max(accept_queue(addr.port()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let counts: Vec<u64> = clients
        .iter()
        .map(|(_, s, _)| s.load(Ordering::Relaxed))
        .collect();
    let took = t0.elapsed();
    let connects = metric_sum(admin, "farside_proxy_upstream_connects_total");
    let reused = metric_sum(admin, "farside_proxy_upstream_reused_total");
    let shed = metric_sum(admin, "farside_upstream_shed_total");
    eprintln!(
        "{} responses in {took:?}; per client {counts:?}; accept queues up to \
         {queues_seen:?}; upstream connects {connects}, reused {reused}, closed instead \
         of pooled {shed}",
        total.load(Ordering::Relaxed)
    );
    assert_eq!(bad.load(Ordering::Relaxed), 0, "answers other than 200");
    let starved = counts.iter().filter(|&&n| n < SHARE_MIN).count();
    assert_eq!(
        starved, 0,
        "{starved} of {CLIENTS} clients got fewer than {SHARE_MIN} of the first {RESPONSES} \
         responses (per client {counts:?}): their connections waited in the back-ends' \
         accept queues (up to {queues_seen:?}) behind pooled connections reused by others"
    );

    // The load stops: the queued connections must still get workers, well before the
    // back-end's idle timeout would close connections left idle in the pool.
    for (h, _, _) in &clients {
        let _ = h.shutdown(Shutdown::Both);
    }
    let drain_limit = Duration::from_millis(BACKEND_IDLE_MS / 2);
    let t1 = Instant::now();
    let mut left: Vec<u64> = backends
        .iter()
        .map(|(a, _)| accept_queue(a.port()))
        .collect();
    while left.iter().any(|&q| q > 0) {
        assert!(
            t1.elapsed() < drain_limit,
            "after the load stopped, {left:?} connections still wait in the back-ends' \
             accept queues after {drain_limit:?}: idle pooled connections pin the workers"
        );
        std::thread::sleep(Duration::from_millis(5));
        left = backends
            .iter()
            .map(|(a, _)| accept_queue(a.port()))
            .collect();
    }
    eprintln!(
        "accept queues empty {:?} after the load stopped",
        t1.elapsed()
    );
    for (_, _, th) in clients {
        th.join().unwrap();
    }
}
