//! Liveness of admission control with the proxy's default upstream pooling:
//! after an open-loop overload stops, requests are admitted again within 1 s.
//!
//! Real processes, as an operator runs them: a prefork `farside backend` with few
//! workers, its `gatherd` publishing over shm, and `farside proxy --admission --metric
//! backlog --limit 2` with every other setting at its default (keep-alive pooling on).
//! Before the fix this locked out: the pool's idle keep-alive connections pinned every
//! worker, the proxy's extra connections sat in the back-end's accept queue, the backlog
//! stayed at the limit, and every request got 503 until the back-end's keep-alive
//! timeout (here 30 s) finally closed the idle connections.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

mod common;
use common::{exe, free_addr, metrics_raw, spawn, Dir};

/// The liveness bound the issue sets: after the load stops, the next request is
/// admitted within this.
const ADMITTED_AGAIN_WITHIN: Duration = Duration::from_secs(1);
/// Pause between probe requests after the load stops.
const PROBE_EVERY: Duration = Duration::from_millis(20);

/// Back-end: 2 prefork workers, 5 ms of CPU per request, so at most 400 req/s.
const WORKERS: u32 = 2;
const CPU_US: u64 = 5_000;
/// Nominal capacity of that back-end, req/s (less on a busy machine: the offered load
/// is then an even larger multiple of it).
const CAPACITY: f64 = WORKERS as f64 * 1e6 / CPU_US as f64;
/// Offered loads, multiples of [`CAPACITY`] (the 1.5× and 3×), open loop, each
/// for this long.
const OVERLOADS: [f64; 2] = [1.5, 3.0];
const OVERLOAD_S: f64 = 1.5;

/// One GET through `addr` on a fresh connection; returns the status (0 on failure).
fn status_of(addr: SocketAddr, path: &str) -> u16 {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    if write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return 0;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0)
}

#[test]
fn admission_recovers_within_a_second_after_open_loop_overloads_with_default_pooling() {
    let dir = Dir::new("backlog");
    let backend = free_addr();
    let mut be = spawn(
        "backend",
        &[
            "backend",
            "--listen",
            &backend.to_string(),
            "--workers",
            &WORKERS.to_string(),
            "--static-cpu-us",
            &CPU_US.to_string(),
            // Longer than the test: the back-end never retires the proxy's idle
            // connections itself, as with a long KeepAliveTimeout.
            "--header-timeout-ms",
            "30000",
        ],
        &dir,
    );
    be.wait_port(backend).unwrap();
    let region = dir.0.join("node.region");
    let mut g = spawn(
        "gatherd",
        &[
            "gatherd",
            "--watch-port",
            &backend.port().to_string(),
            "--shm",
            region.to_str().unwrap(),
        ],
        &dir,
    );
    g.wait_file(&region).unwrap();
    let proxy = free_addr();
    let admin = free_addr();
    // The product's defaults apart from turning admission on (pooling on, no maxconn).
    let mut p = spawn(
        "proxy",
        &[
            "proxy",
            "--listen",
            &proxy.to_string(),
            "--admin-listen",
            &admin.to_string(),
            "--backend",
            &format!("{backend},region=shm:{}", region.display()),
            "--admission",
            "--metric",
            "backlog",
            "--limit",
            "2",
        ],
        &dir,
    );
    p.wait_port(proxy).unwrap();
    assert_eq!(status_of(proxy, "/file16k"), 200, "idle back-end serves");

    for times in OVERLOADS {
        let rate = times * CAPACITY;
        let out = std::process::Command::new(exe())
            .args([
                "loadgen",
                "--target",
                &proxy.to_string(),
                "--rate",
                &rate.to_string(),
                "--duration-s",
                &OVERLOAD_S.to_string(),
                "--warmup-s",
                "0",
                "--timeout-ms",
                "2000",
                "--json",
                "--quiet",
            ])
            .output()
            .unwrap();
        let stopped = Instant::now();
        assert!(out.status.success(), "loadgen: {out:?}");
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        eprintln!(
            "{times}x ({rate} req/s): served {} ({} req/s), 503 {}, failures {}",
            summary["served"], summary["tps"], summary["dropped_503"], summary["failures"]
        );
        assert!(
            summary["served"].as_u64().unwrap() > 0,
            "some requests are served during the overload: {summary}"
        );

        let admitted = loop {
            let s = status_of(proxy, "/file16k");
            if s == 200 {
                break stopped.elapsed();
            }
            assert!(
                stopped.elapsed() < ADMITTED_AGAIN_WITHIN,
                "{times}x: still refused ({s}) {:?} after the load stopped; metrics:\n{}",
                stopped.elapsed(),
                metrics(admin)
            );
            std::thread::sleep(PROBE_EVERY);
        };
        eprintln!("{times}x: admitted again {admitted:?} after the load stopped");
    }
    p.check_alive().unwrap();
}

fn metrics(admin: SocketAddr) -> String {
    metrics_raw(admin)
        .lines()
        .filter(|l| l.starts_with("farside_backend") || l.starts_with("farside_upstream"))
        .collect::<Vec<_>>()
        .join("\n")
}
