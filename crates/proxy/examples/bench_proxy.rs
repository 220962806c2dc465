//! Minimal proxy for data-path benchmarks until the `farside proxy` CLI lands:
//! `bench_proxy --listen ADDR --backend ADDR [--backend ADDR ...] [--workers N]
//! [--admin ADDR]`. Routes round-robin, admits everything (no admission control).

use farside_proxy::config::{BackendConfig, ProxyConfig};
use farside_proxy::gate::{Gate, InflightGuard, Reject, Route};
use farside_proxy::server;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

struct RoundRobin {
    addrs: Vec<SocketAddr>,
    next: AtomicUsize,
    inflight: Vec<Arc<AtomicU64>>,
}

impl Gate for RoundRobin {
    fn on_accept(&self, _peer: SocketAddr) -> Result<(), Reject> {
        Ok(())
    }

    fn route(&self, _host: Option<&str>) -> Result<Route, Reject> {
        let i = self.next.fetch_add(1, Relaxed) % self.addrs.len();
        Ok(Route {
            backend: i,
            addr: self.addrs[i],
            guard: InflightGuard::new(self.inflight[i].clone()),
            reuse_only: false,
        })
    }
}

fn usage(msg: &str) -> ! {
    eprintln!(
        "bench_proxy: {msg}\nusage: bench_proxy --listen ADDR --backend ADDR [--backend ADDR ...] \
         [--workers N] [--admin ADDR]"
    );
    std::process::exit(2)
}

fn main() {
    let mut listen = None;
    let mut backends = Vec::new();
    let mut workers = 1;
    let mut admin = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let addr = || -> SocketAddr {
            value
                .parse()
                .unwrap_or_else(|e| usage(&format!("{flag} {value}: {e}")))
        };
        match flag.as_str() {
            "--listen" => listen = Some(addr()),
            "--backend" => backends.push(addr()),
            "--admin" => admin = Some(addr()),
            "--workers" => {
                workers = value
                    .parse()
                    .unwrap_or_else(|e| usage(&format!("--workers {value}: {e}")))
            }
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    let listen = listen.unwrap_or_else(|| usage("--listen is required"));
    if backends.is_empty() {
        usage("at least one --backend is required");
    }
    let gate = Arc::new(RoundRobin {
        inflight: backends.iter().map(|_| Arc::default()).collect(),
        addrs: backends.clone(),
        next: AtomicUsize::new(0),
    });
    let mut cfg = ProxyConfig::simple(
        listen,
        backends
            .into_iter()
            .map(|addr| BackendConfig {
                addr,
                site: String::new(),
                region: None,
                limit: None,
                maxconn: None,
            })
            .collect(),
    );
    cfg.workers = workers;
    cfg.admin_listen = admin;
    if let Err(e) = server::run(cfg, gate) {
        eprintln!("bench_proxy: {e}");
        std::process::exit(1);
    }
}
