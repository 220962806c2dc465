//! The running gatherer ([`Gatherd`]): start-up, the publishing loop, the servers.
//!
//! The loop never blocks on readers: it writes the region with plain stores under the
//! seqlock and the servers (tcp, udp fallback, metrics) run on their own threads.
//!
//! Start-up is ordered for a restart's freshness: the region (with XDP the map, before
//! the program is verified) is served from user space and sampled within milliseconds
//! of the exec; the XDP attach and the kernel sampler follow (see [`Gatherd::start`]).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use farside_region::{Header, HeapWords, MappedWords, RegionWriter, Words, REGION_WORDS};
use farside_rmem::fdshare::FdServer;
use farside_rmem::{Dedup, OpCounters, TcpServer, UdpServer};

use crate::metrics::{self, render_metrics, GatherStats, LONG_GAP};
use crate::xdp::{attach_xdp, iface_ipv4, load_bpf, start_kernel_sampler};
use crate::{role, GatherdArgs, Sampler, FIELD_COST_EVERY, WATCHED_PORTS_MAX};

/// A running gatherer: sampling thread plus optional servers. Stops when dropped.
pub struct Gatherd {
    pub stats: Arc<GatherStats>,
    pub counters: Arc<OpCounters>,
    pub tcp_addr: Option<SocketAddr>,
    pub udp_addr: Option<SocketAddr>,
    /// Where same-host readers find the region (`shm:` transport): the region file, or
    /// with XDP a Unix socket that hands out the region map's fd.
    pub shm_path: Option<PathBuf>,
    /// With XDP: serves the map's fd at `shm_path` (removed on drop).
    fd_server: Option<FdServer>,
    stop: Arc<AtomicBool>,
    /// The user-space sampling thread (none while the kernel sampler writes).
    pub(crate) thread: Option<std::thread::JoinHandle<SamplerParts>>,
    /// Wall time of each start-up stage, in order: gatherd's (`sampler_new`,
    /// `first_sample`, `xdp_maps`, `serving`: the region answers from here,
    /// `xdp_attached`, `sampler_handover`, `tcp`), then the XDP responder's own steps
    /// (`farside_xdp::XdpResponder::startup_stages`, inside those).
    pub startup: Vec<(&'static str, Duration)>,
    /// How udp requests are answered: "xdp-native", "xdp-generic", "user-space" or "off".
    pub udp_server: &'static str,
    /// Who writes the load record: "kernel" (the kernel-resident sampler) or "user".
    pub sampler: &'static str,
    /// Why the user-space sampler writes it (None while the kernel sampler does), as
    /// logged at start-up: `--sampler user`, `--cgroup`, or what BPF refused.
    pub sampler_reason: Option<String>,
    /// Keeps the kernel's BPF run-time statistics on (`--bpf-stats`).
    _bpf_stats: Option<std::os::fd::OwnedFd>,
    started: std::time::Instant,
    cpu_us_at_start: u64,
    pub(crate) xdp: Option<Arc<farside_xdp::XdpResponder>>,
    _tcp: Option<TcpServer>,
    _udp: Option<UdpServer>,
    _metrics: Option<metrics::MetricsServer>,
    /// The node agent (`--role-*`), if running.
    pub role: Option<role::RoleAgent>,
    /// The replay ceiling's keeper and SIGHUP's key reloads.
    pub trust: crate::trust::Keeper,
    args: GatherdArgs,
    keys: Arc<farside_rmem::ServerKeys>,
}

/// Region storage shared between the writer loop and the servers.
pub(crate) struct SharedWords(Arc<dyn Words>);

impl Words for SharedWords {
    fn words(&self) -> &[std::sync::atomic::AtomicU64] {
        self.0.words()
    }
}

impl Gatherd {
    /// Start sampling and serving. Errors (bad args, a busy port, no /proc) are returned
    /// before anything runs.
    ///
    /// Start-up order (a restart's time to a fresh region is what it is for): sample
    /// once; create the region (with XDP: the BPF maps only, milliseconds); publish the
    /// first record; serve it at once from user space (udp on the XDP port, shm) and
    /// start the user-space sampling thread; only then verify and attach the XDP
    /// program and start the kernel sampler, which are the slow steps (hundreds of ms
    /// under a busy verifier). Readers thus get a fresh record within milliseconds of
    /// the exec; the user-space udp server answers until XDP attaches (the same words:
    /// the map), and the user sampler writes the record until the kernel sampler's
    /// first tick (handed over in the seed callback, see
    /// `farside_xdp::XdpResponder::start_kernel_sampler`). The per-stage times are
    /// logged and kept in [`Gatherd::startup`].
    pub fn start(args: &GatherdArgs) -> io::Result<Gatherd> {
        args.validate()
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
        let mut lap = Lap::new();
        let mut sampler = Sampler::new(args)?;
        lap.stage("sampler_new");
        let mut ports = [0u16; WATCHED_PORTS_MAX];
        ports[..args.watch_ports.len()].copy_from_slice(&args.watch_ports);
        let header = Header {
            node_id: args.node_id,
            generation: farside_region::fresh_generation(),
            period_us: args.period_us,
            watched_ports: ports,
        };
        let counters = Arc::new(OpCounters::default());
        let dedup = Arc::new(Dedup::new());
        let keys = args.keys()?;
        // Before anything answers: nothing sealed before this start is accepted.
        let (floor_file, limits) = crate::trust::start_limits(args)?;
        keys.with_replay(|t| limits.apply(t));
        // One memory: every transport of this node operates on the same words. With XDP
        // that is the BPF map the kernel answers from (the tcp server and the udp
        // fallback serve the map's mapping, and shm readers map the map itself); without,
        // the shm file (or heap). The writer publishes a first record before any server
        // answers, so readers never see Empty from a started gatherer; the TCP server
        // starts last, so a gatherer whose TCP port accepts is wholly ready (the lab
        // waits for that).
        let first = sampler.sample()?;
        lap.stage("first_sample");
        let (mut xdp, bpf_unavailable) = load_bpf(args, &keys)?;
        if let Some(x) = xdp.as_ref().filter(|x| x.serves_udp()) {
            x.set_replay_limits(limits)
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
        lap.stage("xdp_maps");
        let mut fd_server = None;
        let (mem, writer, shm_path): (Arc<dyn Words>, _, _) = match &xdp {
            Some(x) => {
                let mut w = RegionWriter::init(SharedWords(x.region()), header);
                w.publish(&first);
                // Same-host shm readers must map the BPF map, not a copy: the shm path
                // becomes a Unix socket that hands out the map's fd (`map_region`).
                let shm_path = args.shm_path();
                if let Some(p) = &shm_path {
                    fd_server = Some(FdServer::spawn(p, x.region_fd())?);
                    log::info!(
                        "gatherd: shm readers of {} map the BPF region map (fd handed over the socket)",
                        p.display()
                    );
                }
                (x.region(), w, shm_path)
            }
            None => {
                let shm_path = args.shm_path();
                let mem: Arc<dyn Words> = match &shm_path {
                    Some(p) => {
                        // A socket of ours left by an XDP run is replaced; another
                        // user's entry, a symlinked or shared directory are refused
                        // (`farside_rt::rundir`).
                        Arc::new(MappedWords::create_file(p, REGION_WORDS).map_err(|e| {
                            io::Error::new(e.kind(), format!("{}: {e}", p.display()))
                        })?)
                    }
                    None => Arc::new(HeapWords::new(REGION_WORDS)),
                };
                let mut w = RegionWriter::init(SharedWords(mem.clone()), header);
                w.publish(&first);
                (mem, w, shm_path)
            }
        };
        // Before any server answers, so no reader sees the role words unset.
        let role = role::RoleAgent::start(&args.role, args.node_id, mem.clone())?;
        // Same port, same memory as XDP: answers everything until the program attaches,
        // then what it passes on to the stack (fragments, IP options).
        let group = args.group_read.map(|group| farside_rmem::GroupJoin {
            group,
            iface: args
                .xdp_iface
                .as_deref()
                .and_then(iface_ipv4)
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
        });
        let udp = args
            .udp_listen
            .map(|a| {
                UdpServer::spawn_with_group(
                    a,
                    mem.clone(),
                    keys.clone(),
                    counters.clone(),
                    dedup.clone(),
                    group,
                )
            })
            .transpose()?;
        let stats = Arc::new(GatherStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let period = Duration::from_micros(args.period_us);
        let nice = args.sampler_nice;
        let mut thread = Some(spawn_sampler(
            sampler,
            vec![writer],
            stats.clone(),
            stop.clone(),
            period,
            nice,
        )?);
        lap.stage("serving");
        // If a later step fails, the sampling thread must not outlive the error.
        let abort = StopOnDrop(Some(stop.clone()));
        // The slow steps, while the region is served and sampled.
        let udp_server = match xdp.as_mut() {
            Some(x) => attach_xdp(args, x, &dedup)?,
            None => None,
        }
        .unwrap_or(if args.udp_listen.is_some() {
            "user-space"
        } else {
            "off"
        });
        lap.stage("xdp_attached");
        let bpf_stats = args.bpf_stats.then(enable_bpf_stats).flatten();
        let mut parked = None;
        let sampler_reason =
            start_kernel_sampler(args, xdp.as_mut(), bpf_unavailable, &mut || {
                // The handover: the user-space writer stops here and the kernel's first tick
                // follows (its sequence continues from the user writer's last record).
                stop.store(true, Ordering::Relaxed);
                if let Some(t) = thread.take() {
                    parked = t.join().ok();
                }
            })?;
        let kernel_sampler = sampler_reason.is_none();
        if let (false, Some((sampler, writers))) = (kernel_sampler, parked) {
            // The kernel sampler failed after the handover: the user writer resumes.
            stop.store(false, Ordering::Relaxed);
            thread = Some(spawn_sampler(
                sampler,
                writers,
                stats.clone(),
                stop.clone(),
                period,
                nice,
            )?);
        }
        lap.stage("sampler_handover");
        let xdp = xdp.map(Arc::new);
        let trust = crate::trust::Keeper::spawn(
            args,
            floor_file,
            crate::trust::Targets {
                keys: keys.clone(),
                xdp: xdp.clone(),
            },
        )?;
        let tcp = args
            .tcp_listen
            .map(|a| {
                TcpServer::spawn_with_dedup(
                    a,
                    mem.clone(),
                    keys.clone(),
                    counters.clone(),
                    dedup.clone(),
                )
            })
            .transpose()?;
        let udp_addr = match (&udp, args.udp_listen) {
            (Some(u), _) => Some(u.local_addr),
            (None, a) => a,
        };
        stats
            .kernel_sampler
            .store(kernel_sampler, Ordering::Relaxed);
        stats
            .bpf_stats
            .store(bpf_stats.is_some(), Ordering::Relaxed);
        lap.stage("tcp");
        let mut startup = lap.stages;
        if let Some(x) = &xdp {
            // The responder's own steps (inside xdp_maps, xdp_attached, sampler_handover).
            startup.extend(x.startup_stages().iter().map(|&(n, d)| (n, d)));
        }
        log::info!("gatherd: start-up {}", format_stages(&startup));
        abort.disarm();
        Gatherd {
            stats,
            counters,
            tcp_addr: tcp.as_ref().map(|t| t.local_addr),
            udp_addr,
            udp_server,
            sampler: if kernel_sampler { "kernel" } else { "user" },
            sampler_reason,
            _bpf_stats: bpf_stats,
            started: std::time::Instant::now(),
            cpu_us_at_start: process_cpu_us(),
            xdp,
            shm_path,
            fd_server,
            stop,
            thread,
            startup,
            _tcp: tcp,
            _udp: udp,
            _metrics: None,
            role,
            trust,
            args: args.clone(),
            keys,
        }
        .with_metrics(args.metrics_listen)
    }

    fn with_metrics(mut self, addr: Option<SocketAddr>) -> io::Result<Gatherd> {
        if let Some(a) = addr {
            let (stats, counters, xdp) =
                (self.stats.clone(), self.counters.clone(), self.xdp.clone());
            let role = self.role.as_ref().map(|r| r.stats.clone());
            let trust = self.trust.stats.clone();
            let render: metrics::Render = Arc::new(move |enc| {
                render_metrics(enc, &stats, &counters, xdp.as_deref());
                trust.render(enc);
                if let Some(r) = &role {
                    r.render(enc);
                }
            });
            let m = metrics::MetricsServer::spawn(a, "gatherd", render)?;
            log::info!("gatherd: metrics on http://{}/metrics", m.local_addr);
            self._metrics = Some(m);
        }
        Ok(self)
    }

    /// Stop sampling: the region's sequence stops advancing (readers see it go stale).
    /// With the kernel sampler, its ticks are detached.
    pub fn stop(&mut self) {
        if let Some(x) = &self.xdp {
            x.stop_kernel_sampler_ticks();
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Read the key files again and replace the keys in user space and in the XDP
    /// program, as SIGHUP does (`crate::trust`): all or nothing; a missing file revokes
    /// its key.
    pub fn reload_keys(&self) {
        crate::trust::reload(
            &self.args,
            &crate::trust::Targets {
                keys: self.keys.clone(),
                xdp: self.xdp.clone(),
            },
            &self.trust.stats,
        );
    }

    /// Address of the metrics endpoint, if serving.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self._metrics.as_ref().map(|m| m.local_addr)
    }

    /// One line for the log at exit. `sampler=` says who wrote the record; `cpu_pct` is
    /// gatherd's whole process CPU (all threads, servers included) over its run, % of one
    /// core. Per sample of the user sampler, µs: `cost_avg_us` the sampling thread's
    /// whole CPU (read every [`FIELD_COST_EVERY`] samples), of which
    /// `cost_{cpu,psi,conns,mem}_us` the fields (`conns`: the accept backlog; measured
    /// on one sample in [`FIELD_COST_EVERY`] at random, so a field read every k samples
    /// shows its cost divided by k), `cost_full_us` the full connection counts
    /// (`full_counts` of them, `full_count_us` each) and `cost_loop_us` the rest: the
    /// period's wake-up and sleep, publication, bookkeeping. `cost_max_us` is the
    /// costliest measured sample's fields. `ktick_ns` the kernel sampler's mean kernel
    /// time per record (all CPUs' ticks; 0 unless `kernel.bpf_stats_enabled=1`).
    /// `bpf_cpu_pct` (with a BPF object) is the kernel run time of its programs (the
    /// kernel sampler's, the XDP responder's) over gatherd's run, % of one core: the
    /// kernel's share, not in `cpu_pct` (counted only while BPF statistics are on).
    pub fn summary(&self) -> String {
        let s = &self.stats;
        let n = s.samples.load(Ordering::Relaxed).max(1) as f64;
        let f = s.field_cost_samples.load(Ordering::Relaxed).max(1) as f64 * 1000.0;
        let wall_us = self.started.elapsed().as_micros().max(1) as f64;
        let cpu_pct =
            process_cpu_us().saturating_sub(self.cpu_us_at_start) as f64 * 100.0 / wall_us;
        let avg_us = s.cost_ns_sum.load(Ordering::Relaxed) as f64
            / s.cost_samples.load(Ordering::Relaxed).max(1) as f64
            / 1000.0;
        let fields_us = [
            &s.field_cost_cpu_ns,
            &s.field_cost_psi_ns,
            &s.field_cost_conns_ns,
            &s.field_cost_mem_ns,
        ]
        .map(|v| v.load(Ordering::Relaxed) as f64 / f);
        let full_counts = s.full_counts.load(Ordering::Relaxed);
        let full_ns = s.full_count_ns_sum.load(Ordering::Relaxed) as f64;
        let full_us = full_ns / n / 1000.0;
        let loop_us = (avg_us - fields_us.iter().sum::<f64>() - full_us).max(0.0);
        let mut out = format!(
            "sampler={} samples={} cost_avg_us={avg_us:.1} cost_max_us={:.1} cost_cpu_us={:.1} cost_psi_us={:.1} cost_conns_us={:.1} cost_mem_us={:.1} cost_full_us={full_us:.1} cost_loop_us={loop_us:.1} full_counts={full_counts} full_count_us={:.1} cpu_pct={cpu_pct:.2} overruns={} errors={} gap_max_ms={:.1} long_gaps={}",
            self.sampler,
            s.samples.load(Ordering::Relaxed),
            s.cost_ns_max.load(Ordering::Relaxed) as f64 / 1000.0,
            fields_us[0],
            fields_us[1],
            fields_us[2],
            fields_us[3],
            full_ns / full_counts.max(1) as f64 / 1000.0,
            s.overruns.load(Ordering::Relaxed),
            s.sample_errors.load(Ordering::Relaxed),
            s.gap_ns_max.load(Ordering::Relaxed) as f64 / 1e6,
            s.long_gaps.load(Ordering::Relaxed)
        );
        if let Some(c) = self.xdp.as_ref().and_then(|x| x.kernel_sampler_costs()) {
            use std::fmt::Write;
            let _ = write!(
                out,
                " ktick_ns={:.0} krecords={}",
                c.tick_ns_per_sample(),
                c.records()
            );
        }
        if let Some(x) = &self.xdp {
            // The kernel's share: every program of the object, over gatherd's run.
            use std::fmt::Write;
            let ns: u64 = x.program_stats().iter().map(|(_, p)| p.run_time_ns).sum();
            let _ = write!(
                out,
                " bpf_cpu_pct={:.3}",
                ns as f64 / 1000.0 * 100.0 / wall_us
            );
        }
        out
    }
}

impl Drop for Gatherd {
    fn drop(&mut self) {
        self.stop();
        // Before the responder (and its map fd) goes; removes the socket, so readers
        // fail to open instead of mapping a region nobody updates.
        self.fd_server.take();
    }
}

/// `--bpf-stats`: the kernel's BPF run-time statistics on while the descriptor lives
/// (None and a warning if the kernel refuses).
fn enable_bpf_stats() -> Option<std::os::fd::OwnedFd> {
    match farside_xdp::enable_bpf_stats() {
        Ok(fd) => {
            log::info!("gatherd: BPF run-time statistics on (--bpf-stats): farside_gatherd_bpf_run_time_seconds_total counts the kernel's share");
            Some(fd)
        }
        Err(e) => {
            log::warn!("gatherd: --bpf-stats: {e}; BPF run times are counted only while kernel.bpf_stats_enabled=1");
            None
        }
    }
}

/// The user-space sampling thread's state, handed back when it stops.
pub(crate) type SamplerParts = (Sampler, Vec<RegionWriter<SharedWords>>);

/// Start the user-space sampling thread: every `period` it samples and publishes to
/// `writers` until `stop` is set, then hands its state back (the kernel sampler's
/// handover, or a resumption if that fails).
fn spawn_sampler(
    mut sampler: Sampler,
    mut writers: Vec<RegionWriter<SharedWords>>,
    st: Arc<GatherStats>,
    stp: Arc<AtomicBool>,
    period: Duration,
    nice: i32,
) -> io::Result<std::thread::JoinHandle<SamplerParts>> {
    std::thread::Builder::new()
        .name("gatherd".into())
        .spawn(move || {
            farside_rt::apply_thread_nice("gatherd: sampler", nice);
            sampler.restart_cost_window();
            let mut pacer = farside_rt::Pacer::new(period);
            let mut last_publish: Option<std::time::Instant> = None;
            while !stp.load(Ordering::Relaxed) {
                pacer.wait();
                if stp.load(Ordering::Relaxed) {
                    break;
                }
                st.overruns.store(pacer.overruns, Ordering::Relaxed);
                match sampler.sample() {
                    Ok(rec) => {
                        for w in &mut writers {
                            w.publish(&rec);
                        }
                        let now = std::time::Instant::now();
                        if let Some(gap) = last_publish.map(|t| now.duration_since(t)) {
                            let ns = u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX);
                            st.gap_ns_max.fetch_max(ns, Ordering::Relaxed);
                            if gap > LONG_GAP {
                                let n = st.long_gaps.fetch_add(1, Ordering::Relaxed) + 1;
                                // Every gap up to 8, then powers of two: bounded log.
                                if n <= 8 || n.is_power_of_two() {
                                    log::warn!(
                                        "gatherd: {:.0} ms between two published samples \
                                         (long gap {n}; the sampler's CPU per sample is \
                                         {:.1} µs): the sampler was not running",
                                        gap.as_secs_f64() * 1e3,
                                        rec.sample_cost_ns as f64 / 1e3
                                    );
                                }
                            }
                        }
                        last_publish = Some(now);
                        st.samples.fetch_add(1, Ordering::Relaxed);
                        if let Some(ns) = sampler.last_window_cpu_ns {
                            st.cost_ns_sum.fetch_add(ns, Ordering::Relaxed);
                            st.cost_samples
                                .fetch_add(FIELD_COST_EVERY, Ordering::Relaxed);
                        }
                        if let Some(ns) = sampler.last_sample_cost_ns {
                            st.cost_ns_max.fetch_max(ns, Ordering::Relaxed);
                        }
                        if let Some(ns) = sampler.last_full_count_ns {
                            st.full_counts.fetch_add(1, Ordering::Relaxed);
                            st.full_count_ns_sum.fetch_add(ns, Ordering::Relaxed);
                        }
                        if let Some(f) = sampler.last_field_cost {
                            st.field_cost_samples.fetch_add(1, Ordering::Relaxed);
                            st.field_cost_cpu_ns.fetch_add(f.cpu_ns, Ordering::Relaxed);
                            st.field_cost_psi_ns.fetch_add(f.psi_ns, Ordering::Relaxed);
                            st.field_cost_conns_ns
                                .fetch_add(f.conns_ns, Ordering::Relaxed);
                            st.field_cost_mem_ns.fetch_add(f.mem_ns, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        // The record is left as it was: its sequence stops advancing, so
                        // readers see it go stale instead of reading a wrong value.
                        if st.sample_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            log::error!("gatherd: sampling failed: {e}");
                        }
                    }
                }
            }
            (sampler, writers)
        })
}

/// Sets the flag when dropped unless disarmed: stops the sampling thread of a start-up
/// that fails after spawning it.
struct StopOnDrop(Option<Arc<AtomicBool>>);

impl StopOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(f) = &self.0 {
            f.store(true, Ordering::Relaxed);
        }
    }
}

/// Wall-clock laps of gatherd's start-up, one named stage at a time.
struct Lap {
    last: std::time::Instant,
    stages: Vec<(&'static str, Duration)>,
}

impl Lap {
    fn new() -> Lap {
        Lap {
            last: std::time::Instant::now(),
            stages: Vec::new(),
        }
    }

    fn stage(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.stages.push((name, now - self.last));
        self.last = now;
    }
}

/// `name=ms name=ms ...` for the start-up log line.
fn format_stages(stages: &[(&'static str, Duration)]) -> String {
    stages
        .iter()
        .map(|(n, d)| format!("{n}={:.1}ms", d.as_secs_f64() * 1e3))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Process CPU time (user + system) so far, µs.
pub fn process_cpu_us() -> u64 {
    farside_rt::process_cpu_ns() / 1000
}

#[cfg(test)]
mod tests;
