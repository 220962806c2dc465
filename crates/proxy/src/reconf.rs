//! The proxy's reconfiguration driver (seed 001): runs
//! `farside_reconf`'s [`Balancer`] every S over the back-ends' regions and the peers'
//! balancer regions, through `farside_rmem` (`farside_reconf::drive`).
//!
//! ```toml
//! [reconf]
//! enabled = true
//! balancer_id = 0                       # this proxy's index in `balancers`
//! balancers = ["tcp:10.0.0.1:7100", "tcp:10.0.0.2:7100"]   # every balancer's region
//! region_listen = "0.0.0.0:7100"        # this proxy's own region (rmem tcp server)
//! key = "2:/etc/farside/rmem-2.key"     # the balancers' rmem key (gatherd --rmem-key balancer:2:PATH)
//! sensitivity_ms = 250                  # S
//! history_ms = 500                      # T = 2 S
//! lease_ms = 3000
//! high_ppm = 800000
//! spare_ppm = 600000
//! ```
//!
//! Nodes are the `[[backend]]`s in order (their `region`); every `[[sites]]` entry names
//! its `anchor` (a back-end index: it holds the site's lock word and is never moved).
//! The proxy serves its own small region (shared update counter, heartbeat) with an
//! embedded rmem tcp server on `region_listen`; peers FETCH-ADD its counter (the entry
//! for `balancer_id` in `balancers` is replaced by that server). Started once per
//! process, beside the data path ([`crate::daemon`]), its counters added to the admin
//! scrape: a reload (SIGHUP) does not restart it and ignores `[reconf]` changes. Its
//! settings and their checks: [`crate::config::reconf`].
//! Connections are (re)opened every round where missing, and dropped after a lost op
//! (a tcp stream may be out of step). Metrics:
//! `farside_reconf_*_total` from `BalancerStats`; every move is logged with its reason
//! and its timing as `key=value` fields (`node=`, `to=`, `wanted=`, `cas_unix_us=`: the
//! host's wall clock when the move CAS's reply arrived, `decision_to_cas_us=`: from the
//! round's decision to that reply, `round_to_cas_us=`: from the round's start), which
//! `farside lab reconfig` joins with the nodes' first request in the new role.

use crate::config::reconf::{err, OP_TIMEOUT};
use crate::config::{ConfigError, ProxyConfig};
use farside_reconf::drive::{run_round, RmemRegions};
use farside_reconf::{Balancer, BalancerStats};
use farside_region::{HeapWords, Words};
use farside_rmem::{connect_target, ClientOptions, OpCounters, Role, ServerKeys, TcpServer};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The running driver; stops on drop.
pub struct ReconfDriver {
    stats: Arc<Mutex<BalancerStats>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    _server: TcpServer,
    /// Address of this proxy's own region server.
    pub region_addr: SocketAddr,
}

impl ReconfDriver {
    /// Start the driver if `[reconf]` enables it.
    pub fn start(cfg: &ProxyConfig) -> std::io::Result<Option<ReconfDriver>> {
        let r = &cfg.reconf;
        if !r.enabled {
            return Ok(None);
        }
        let inval = |e: ConfigError| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
        cfg.validate_reconf().map_err(inval)?;
        let key = r.balancer_key().map_err(inval)?;
        let mem: Arc<HeapWords> = Arc::new(HeapWords::new(farside_region::REGION_WORDS));
        // Peers hold the same balancer key: READ, FETCH-ADD of the counters by 1.
        let mut ring = farside_auth::keys::Keyring::new(farside_auth::keys::Policy::Production);
        ring.install("balancer", key.id, *key.key(), Role::Balancer.rights())
            .map_err(|e| inval(err("key", e.to_string())))?;
        let server = TcpServer::spawn(
            r.region_listen.expect("validated"),
            mem.clone(),
            Arc::new(ServerKeys::new(ring)),
            Arc::new(OpCounters::default()),
        )?;
        let region_addr = server.local_addr;
        let opts = ClientOptions {
            key: Some(key),
            timeout: OP_TIMEOUT,
            ..Default::default()
        };
        let node_targets: Vec<_> = cfg
            .backends
            .iter()
            .map(|b| farside_rmem::Target::parse(b.region.as_deref().expect("validated")))
            .collect::<Result<_, _>>()
            .map_err(|m| inval(err("enabled", m)))?;
        let me = r.balancer_id;
        let mut bal_targets: Vec<_> = r
            .balancers
            .iter()
            .map(|b| farside_rmem::Target::parse(b))
            .collect::<Result<_, _>>()
            .map_err(|m| inval(err("balancers", m)))?;
        // Our own region is the one we serve, whatever address the list gives for it.
        bal_targets[me as usize] = farside_rmem::Target::parse(&format!("tcp:{region_addr}"))
            .map_err(|m| inval(err("region_listen", m)))?;
        let mut balancer = Balancer::new(
            me,
            r.balancer_config(),
            r.topology(&cfg.sites, cfg.backends.len()),
        )
        .map_err(|e| inval(err("enabled", e.0)))?;
        let stats = Arc::new(Mutex::new(BalancerStats::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, stp) = (stats.clone(), stop.clone());
        let period = Duration::from_millis(r.sensitivity_ms);
        let names: Vec<String> = cfg.sites.iter().map(|s| s.name.clone()).collect();
        let thread = std::thread::Builder::new()
            .name("reconf".into())
            .spawn(move || {
                let own = farside_reconf::words::W_BALANCER_HEARTBEAT;
                let t0 = Instant::now();
                let now = move || t0.elapsed().as_nanos() as u64 + 1;
                let mut regions = RmemRegions {
                    nodes: node_targets.iter().map(|_| None).collect(),
                    balancers: bal_targets.iter().map(|_| None).collect(),
                };
                let mut pacer = farside_rt::Pacer::new(period);
                while !stp.load(Ordering::Relaxed) {
                    pacer.wait();
                    mem.words()[own].fetch_add(1, Ordering::AcqRel);
                    // (Re)connect what is missing; an unreachable region's ops are lost.
                    for (slot, t) in regions.nodes.iter_mut().zip(&node_targets) {
                        if slot.is_none() {
                            *slot = connect_target(t, &opts).ok();
                        }
                    }
                    for (slot, t) in regions.balancers.iter_mut().zip(&bal_targets) {
                        if slot.is_none() {
                            *slot = connect_target(t, &opts).ok();
                        }
                    }
                    run_round(&mut balancer, &mut regions, &now);
                    // The host's wall clock at the CAS (shared by every process on the
                    // host, so the lab can join it with the node's first request in the
                    // new role): now, less the monotonic time since the CAS's reply.
                    let (mono, unix_us) = (now(), unix_now_us());
                    for m in balancer.drain_log() {
                        let name = |s: u16| names.get(usize::from(s)).cloned().unwrap_or_default();
                        log::info!(
                            "reconf: moved node {} from site {} to site {} (site load {} ppm, overloaded for {} ms, lock token {}) node={} to={} wanted={:#x} cas_unix_us={} decision_to_cas_us={} round_to_cas_us={}",
                            m.node,
                            name(m.from_site),
                            name(m.to_site),
                            m.site_load_ppm,
                            m.overloaded_ns / 1_000_000,
                            m.token,
                            m.node,
                            m.to_site,
                            m.wanted.0,
                            unix_us.saturating_sub(mono.saturating_sub(m.at_ns) / 1000),
                            m.at_ns.saturating_sub(m.decided_ns) / 1000,
                            m.at_ns.saturating_sub(m.round_ns) / 1000
                        );
                    }
                    *st.lock().unwrap_or_else(|p| p.into_inner()) = balancer.stats().clone();
                }
            })?;
        log::info!("reconf: balancer {me} on region {region_addr}");
        Ok(Some(ReconfDriver {
            stats,
            stop,
            thread: Some(thread),
            _server: server,
            region_addr,
        }))
    }

    /// The balancer's counters so far.
    pub fn stats(&self) -> Arc<Mutex<BalancerStats>> {
        self.stats.clone()
    }
}

impl Drop for ReconfDriver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Microseconds since the Unix epoch by this host's wall clock (0 before 1970).
fn unix_now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Report the driver's counters into a scrape.
pub fn render(stats: &Mutex<BalancerStats>, enc: &mut farside_admin::Encoder) {
    let s = stats.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (name, help, v) in [
        ("rounds", "Balancer rounds (every S).", s.rounds),
        ("moves", "Nodes moved (role CAS won).", s.moves),
        ("lock_acquired", "Site locks acquired.", s.lock_acquired),
        (
            "takeovers",
            "Expired locks of another holder taken over.",
            s.takeovers,
        ),
        (
            "lock_busy",
            "Rounds that found the site lock held.",
            s.lock_busy,
        ),
        (
            "node_races",
            "Move CASes lost to another balancer.",
            s.node_races,
        ),
        (
            "skipped_rounds",
            "Rounds skipped: a peer moved a node (update counters).",
            s.skipped_rounds,
        ),
        ("fenced_out", "Holds lost to a takeover.", s.fenced_out),
        (
            "unknown_outcomes",
            "Ops whose reply was lost.",
            s.unknown_outcomes,
        ),
        (
            "no_donor",
            "Overloaded sites with no node to spare.",
            s.no_donor,
        ),
    ] {
        enc.counter(&format!("farside_reconf_{name}_total"), help, &[], v);
    }
}
