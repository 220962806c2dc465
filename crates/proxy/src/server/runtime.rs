//! The data path's runtime: listeners and workers, the accept loop, runtime set-up, and
//! the proxy's life as a whole (start, reload, drain, stop; the signals of
//! [`run_with_reload`]). What happens on one accepted connection is [`super::conn`].
//!
//! Workers (`workers`): worker 0 runs on the runtime [`start`] is called on (a
//! single-threaded one under [`run`] and [`spawn`]), workers 1.. each on a thread of
//! their own with a single-threaded runtime. Every worker has its own listener on the
//! same port (`SO_REUSEPORT`), so the kernel picks a connection's worker by a hash of
//! its addresses and no accept queue, lock or wake-up is shared; the connection's task
//! runs on that worker until it closes. Chosen over one multi-threaded runtime with a
//! listener per worker because there tasks migrate between threads (work stealing), so
//! neither a connection's counters nor its I/O would stay on one core; the price is no
//! rebalancing of an uneven spread. Shared by all workers: the generation (below), the
//! upstream pool with its `maxconn` caps (a pooled connection is moved to the reusing
//! worker's I/O driver, see `conn::rehome`), the bound on client connections, and the
//! drain. Counters are per worker ([`Metrics`]). A listener that closes resets the connections
//! still in its accept queue unless `net.ipv4.tcp_migrate_req = 1` hands them to another
//! listener of the group (a successor's): the same as with one listener, per listener.
//!
//! Drain and reload ([`crate::lifecycle`]): every exchange looks up the current
//! *generation* (configuration, control layer, upstream pool) when its head has been
//! read, so a reload applies to the next request of every connection; once the drain
//! starts, the main listener is closed, a connection idle between requests is closed,
//! and the response in flight is the connection's last (`Connection: close`).

use super::conn::handle_conn;
use super::generation::{render_metrics, Live, Shared};
use crate::config::ProxyConfig;
use crate::gate::Gate;
use crate::lifecycle::{self, DrainOutcome, Lifecycle, Reloader};
use crate::metrics::Metrics;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Pause after a failed accept (EMFILE and friends) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// Kernel accept queue of the listeners.
const LISTEN_BACKLOG: u32 = 1024;
/// Bounds of the period at which idle upstream connections are checked and closed
/// (half of `http.pool_idle_timeout_ms` within these).
const POOL_PURGE_PERIOD_MS_MIN: u64 = 100;
const POOL_PURGE_PERIOD_MS_MAX: u64 = 5_000;
/// Time the runtime gives tasks still running to finish once the proxy stops (after
/// the drain, none should be left).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Serve clients accepted on `listener` until `shutdown` resolves. Connections already
/// open keep running on the runtime; `serve` only stops accepting.
pub async fn serve(
    cfg: Arc<ProxyConfig>,
    listener: TcpListener,
    gate: Arc<dyn Gate>,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let max = cfg.http.max_client_conns;
    let life = Arc::new(Lifecycle::default());
    let sh = Arc::new(Shared::new(cfg, gate, metrics.clone(), life.clone()));
    let live = Arc::new(Live {
        current: RwLock::new(sh),
        life,
        metrics,
    });
    let tend = tend_loop(live.clone(), std::future::pending());
    let limit = Arc::new(Semaphore::new(max));
    tokio::select! {
        r = accept_loop(live, listener, limit, true, shutdown) => r,
        r = tend => r,
    }
}

/// The proxy running: worker 0 on the current tokio runtime, the others on threads of
/// their own (see [`start`]). Dropping it stops every worker's accept loop.
pub struct Running {
    /// The main listener's address (useful with port 0).
    pub addr: SocketAddr,
    /// The admin listener's address, if `admin_listen` was set.
    pub admin_addr: Option<SocketAddr>,
    pub metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<io::Result<()>>>,
    /// Workers 1.. (worker 0 is the accept loop in `tasks`).
    workers: Vec<WorkerThread>,
    live: Arc<Live>,
    /// The admin listener's server (its own thread); stops when dropped.
    _admin: Option<farside_admin::AdminServer>,
}

impl Running {
    /// Stop accepting on all listeners and wait for the accept loops to end. Connections
    /// still open on worker 0 keep running on the caller's runtime; those of the other
    /// workers get [`SHUTDOWN_GRACE`] on their threads, which then exit.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        for w in self.workers {
            // `Err`: the thread is gone, so is its accept loop.
            let _ = w.accepting.await;
        }
    }

    /// The drain flag, open client connections and reload counters.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.live.life
    }

    /// Replace the configuration and control layer of new requests (a reload; see
    /// [`crate::lifecycle`]). `cfg` is validated first; on error nothing changes.
    /// Settings only a restart can change are kept as they run (logged).
    pub fn reload(&self, cfg: ProxyConfig, gate: Arc<dyn Gate>) -> Result<(), String> {
        let r = self.swap_in(cfg, gate);
        self.live.life.reload_done(r.is_ok());
        r
    }

    fn swap_in(&self, mut cfg: ProxyConfig, gate: Arc<dyn Gate>) -> Result<(), String> {
        cfg.validate().map_err(|e| e.to_string())?;
        let running = self.live.current().cfg.clone();
        let kept = lifecycle::restart_only_changes(&running, &cfg);
        if !kept.is_empty() {
            log::warn!(
                "reload: needs a restart, kept as running: {}",
                kept.join(", ")
            );
            cfg.listen = running.listen;
            cfg.admin_listen = running.admin_listen;
            cfg.workers = running.workers;
            cfg.busy_poll_us = running.busy_poll_us;
            cfg.reuse_port = running.reuse_port;
            cfg.http.max_client_conns = running.http.max_client_conns;
        }
        let n = cfg.backends.len();
        let next = Shared::new(
            Arc::new(cfg),
            gate,
            self.live.metrics.clone(),
            self.live.life.clone(),
        );
        self.live.swap(Arc::new(next));
        log::info!("reload: applied ({n} back-end(s))");
        Ok(())
    }

    /// Build the next generation with `reloader` on a blocking thread and swap it in;
    /// on error keep the running one, log it and count it.
    pub async fn reload_with(&self, reloader: Reloader) -> Result<(), String> {
        let built = tokio::task::spawn_blocking(move || reloader())
            .await
            .unwrap_or_else(|e| Err(format!("reload task failed: {e}")));
        let r = match built {
            Ok((cfg, gate)) => self.reload(cfg, gate),
            Err(e) => {
                self.live.life.reload_done(false);
                Err(e)
            }
        };
        if let Err(e) = &r {
            log::error!("reload failed, keeping the running configuration: {e}");
        }
        r
    }

    /// Graceful drain: close the main listener, close idle client connections, let
    /// in-flight requests finish (their responses say `Connection: close`) until none
    /// is left, `http.drain_timeout_ms` passes, or `interrupt` resolves; then stop.
    pub async fn drain(self, interrupt: impl Future<Output = ()>) -> DrainOutcome {
        let life = self.live.life.clone();
        life.start_drain();
        let limit = Duration::from_millis(self.live.current().cfg.http.drain_timeout_ms);
        let deadline = Instant::now() + limit;
        tokio::pin!(interrupt);
        let outcome = loop {
            let open = life.client_conns();
            if open == 0 {
                break DrainOutcome::Drained;
            }
            if Instant::now() >= deadline {
                break DrainOutcome::Deadline { open };
            }
            tokio::select! {
                _ = &mut interrupt => break DrainOutcome::Interrupted { open: life.client_conns() },
                _ = tokio::time::sleep(lifecycle::DRAIN_POLL) => {}
            }
        };
        self.stop().await;
        outcome
    }
}

/// Validate `cfg`, bind `cfg.listen` once per worker (and `cfg.admin_listen`), and serve
/// until [`Running::stop`]: worker 0 on the current runtime, workers 1.. on threads of
/// their own. Port 0 works; the bound addresses are returned.
pub async fn start(cfg: ProxyConfig, gate: Arc<dyn Gate>) -> io::Result<Running> {
    start_with(cfg, gate, None).await
}

/// [`start`], with the metrics of what runs beside the data path in this process (the
/// reconfiguration driver's, [`crate::daemon`]) appended to every admin scrape.
pub async fn start_with(
    cfg: ProxyConfig,
    gate: Arc<dyn Gate>,
    beside: Option<farside_admin::Render>,
) -> io::Result<Running> {
    cfg.validate()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // Workers 1.. each get a thread with a single-threaded runtime, built first so that
    // their listeners register with their own I/O drivers (see the module docs).
    let listener = bind(cfg.listen, cfg.reuse_port, cfg.workers > 1)?;
    let addr = listener.local_addr()?;
    let runtimes = (1..cfg.workers)
        .map(|_| build_runtime(1, cfg.busy_poll_us).map(WorkerRuntime::new))
        .collect::<io::Result<Vec<_>>>()?;
    // The others join its `SO_REUSEPORT` group on the port it got (so port 0 works).
    let siblings = runtimes
        .iter()
        .map(|rt| {
            let _in_rt = rt.get().enter();
            bind(addr, true, false)
        })
        .collect::<io::Result<Vec<_>>>()?;
    let admin = cfg
        .admin_listen
        .map(std::net::TcpListener::bind)
        .transpose()?;
    let admin_addr = admin
        .as_ref()
        .map(std::net::TcpListener::local_addr)
        .transpose()?;
    let cfg = Arc::new(cfg);
    let metrics = Arc::new(Metrics::with_workers(cfg.workers));
    let life = Arc::new(Lifecycle::default());
    let sh = Arc::new(Shared::new(
        cfg.clone(),
        gate,
        metrics.clone(),
        life.clone(),
    ));
    let live = Arc::new(Live {
        current: RwLock::new(sh),
        life: life.clone(),
        metrics: metrics.clone(),
    });
    let (stop, stopped) = watch::channel(false);
    let mut tasks = vec![tokio::spawn(tend_loop(
        live.clone(),
        until_stopped(stopped.clone()),
    ))];
    // The admin server (the one shared with gatherd, on its own thread) answers scrapes
    // until the proxy stops, through the drain.
    // It also serves the live dashboard (`crate::dashboard`), built from the same render.
    let admin = admin
        .map(|l| {
            let render: farside_admin::Render = {
                let live = live.clone();
                Arc::new(move |enc| {
                    render_metrics(&live.current(), enc);
                    if let Some(beside) = &beside {
                        beside(enc);
                    }
                })
            };
            let cfg: crate::dashboard::CurrentConfig = {
                let live = live.clone();
                Arc::new(move || live.current().cfg.clone())
            };
            let dash = crate::dashboard::dashboard(render.clone(), cfg);
            farside_admin::AdminServer::serve_with(l, "proxy", render, Some(dash))
        })
        .transpose()?;
    // One bound on client connections for all workers, as for one.
    let limit = Arc::new(Semaphore::new(cfg.http.max_client_conns));
    // The main listeners close when the drain starts.
    tasks.push(tokio::spawn(accept_loop(
        live.clone(),
        listener,
        limit.clone(),
        true,
        until_stop_or_drain(life.clone(), stopped.clone()),
    )));
    let workers = runtimes
        .into_iter()
        .zip(siblings)
        .enumerate()
        .map(|(i, (rt, l))| {
            spawn_worker(i + 1, rt, l, live.clone(), limit.clone(), stopped.clone())
        })
        .collect::<io::Result<Vec<_>>>()?;
    Ok(Running {
        addr,
        admin_addr,
        metrics,
        stop,
        tasks,
        workers,
        live,
        _admin: admin,
    })
}

/// The proxy running on its own thread and runtime (see [`spawn`]). Dropping it stops
/// the proxy too.
pub struct Spawned {
    pub addr: SocketAddr,
    pub admin_addr: Option<SocketAddr>,
    pub metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spawned {
    /// Stop accepting, give open connections a grace period (1 s), join the thread.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Start the proxy on a new thread (worker 0, a single-threaded runtime; workers 1..
/// get threads of their own) and return once it listens. For the lab and tests that
/// are not themselves async.
pub fn spawn(cfg: ProxyConfig, gate: Arc<dyn Gate>) -> io::Result<Spawned> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("farside-proxy".into())
        .spawn(move || {
            let rt = match build_runtime(1, cfg.busy_poll_us) {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                match start(cfg, gate).await {
                    Ok(running) => {
                        let info = (running.addr, running.admin_addr, running.metrics.clone());
                        let _ = ready_tx.send(Ok(info));
                        let _ = stop_rx.await;
                        running.stop().await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
            rt.shutdown_timeout(SHUTDOWN_GRACE);
        })?;
    let (addr, admin_addr, metrics) = ready_rx
        .recv()
        .map_err(|_| io::Error::other("proxy thread died during start"))??;
    Ok(Spawned {
        addr,
        admin_addr,
        metrics,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

/// Run the proxy until SIGINT or SIGTERM: `cfg.workers` workers, each a thread with a
/// single-threaded runtime and its own listener on `cfg.listen` (worker 0 is the calling
/// thread; 1 worker is the configuration compared with HAProxy `nbthread 1`), and
/// `cfg.admin_listen` if set. SIGHUP is ignored (logged); see
/// [`run_with_reload`].
pub fn run(cfg: ProxyConfig, gate: Arc<dyn Gate>) -> io::Result<()> {
    run_with_reload(cfg, gate, None, None)
}

/// [`run`], with the signals of [`crate::lifecycle`]: SIGHUP builds the next generation
/// with `reloader` and swaps it in; SIGTERM or SIGINT drains gracefully (a second one
/// exits at once, as an error). `beside`: as for [`start_with`].
pub fn run_with_reload(
    cfg: ProxyConfig,
    gate: Arc<dyn Gate>,
    reloader: Option<Reloader>,
    beside: Option<farside_admin::Render>,
) -> io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = build_runtime(1, cfg.busy_poll_us)?;
    let result = rt.block_on(async {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        let running = start_with(cfg, gate, beside).await?;
        log::info!(
            "proxy listening on {}{}",
            running.addr,
            running
                .admin_addr
                .map(|a| format!(", admin on {a}"))
                .unwrap_or_default()
        );
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = hup.recv() => match &reloader {
                    Some(r) => {
                        log::info!("SIGHUP: reloading the configuration");
                        let _ = running.reload_with(r.clone()).await;
                    }
                    None => log::warn!("SIGHUP: this proxy has no reloader; ignored"),
                },
            }
        }
        log::info!(
            "signal received: draining {} client connection(s) (up to {} ms; a second signal exits at once)",
            running.lifecycle().client_conns(),
            running.live.current().cfg.http.drain_timeout_ms
        );
        let second = async {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        match running.drain(second).await {
            DrainOutcome::Drained => {
                log::info!("drained; exiting");
                Ok(())
            }
            DrainOutcome::Deadline { open } => {
                log::warn!("drain timeout: exiting with {open} client connection(s) still open");
                Ok(())
            }
            DrainOutcome::Interrupted { open } => Err(io::Error::other(format!(
                "second signal during the drain: exited with {open} client connection(s) open"
            ))),
        }
    });
    rt.shutdown_timeout(SHUTDOWN_GRACE);
    result
}

/// A runtime of `threads` threads (1, what each worker runs: a single-threaded one),
/// each spinning up to `busy_poll_us` before it sleeps in the I/O driver (see
/// [`ProxyConfig::busy_poll_us`]).
pub fn build_runtime(threads: usize, busy_poll_us: u64) -> io::Result<tokio::runtime::Runtime> {
    let mut b = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads).thread_name("farside-proxy");
        b
    };
    if busy_poll_us > 0 {
        let spin = Duration::from_micros(busy_poll_us);
        // Called just before the thread parks: readiness that arrives during the spin is
        // queued by the kernel on the (not yet waited on) epoll set, so the park that
        // follows returns at once instead of sleeping and being woken.
        b.on_thread_park(move || {
            let start = std::time::Instant::now();
            while start.elapsed() < spin {
                std::hint::spin_loop();
            }
        });
    }
    b.enable_all().build()
}

/// Call [`Gate::tend`] every [`TEND_PERIOD`](crate::control::TEND_PERIOD) until
/// `shutdown`, so the control layer's upkeep does not wait for requests to arrive.
async fn tend_loop(live: Arc<Live>, shutdown: impl Future<Output = ()>) -> io::Result<()> {
    let mut tick = tokio::time::interval(crate::control::TEND_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => return Ok(()),
            _ = tick.tick() => live.current().gate.tend(),
        }
    }
}

/// Bind and listen on `addr`, registered with the current runtime. `reuse_port`: with
/// `SO_REUSEPORT` from the start, so the port may already be held by listeners that set
/// it too (a predecessor, or this proxy's first worker). `siblings`: set it only after
/// the bind, so the bind itself stays exclusive (a second proxy without `reuse_port`
/// still fails with "address in use") while this proxy's other workers can join.
fn bind(addr: SocketAddr, reuse_port: bool, siblings: bool) -> io::Result<TcpListener> {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    sock.set_reuseaddr(true)?;
    if reuse_port {
        sock.set_reuseport(true)?;
    }
    sock.bind(addr)?;
    if siblings && !reuse_port {
        // Read at listen(), when the kernel creates the socket's reuseport group.
        sock.set_reuseport(true)?;
    }
    sock.listen(LISTEN_BACKLOG)
}

/// A worker's runtime until its thread runs it. Dropped on the way (a failed start, on
/// the caller's runtime), it shuts down without blocking, which tokio requires there.
struct WorkerRuntime(Option<tokio::runtime::Runtime>);

impl WorkerRuntime {
    fn new(rt: tokio::runtime::Runtime) -> Self {
        WorkerRuntime(Some(rt))
    }

    fn get(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("taken only by its thread")
    }

    fn take(mut self) -> tokio::runtime::Runtime {
        self.0.take().expect("taken only by its thread")
    }
}

impl Drop for WorkerRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A data-path worker on its own thread (workers 1..; worker 0 runs on the caller's
/// runtime).
struct WorkerThread {
    /// Resolves (or fails, if the thread died) when the worker's accept loop has ended.
    accepting: oneshot::Receiver<()>,
    _thread: std::thread::JoinHandle<()>,
}

/// Run worker `i` on a new thread: its accept loop on `listener` (registered with `rt`)
/// until the drain or the stop, then its remaining connections until the stop.
fn spawn_worker(
    i: usize,
    rt: WorkerRuntime,
    listener: TcpListener,
    live: Arc<Live>,
    limit: Arc<Semaphore>,
    stopped: watch::Receiver<bool>,
) -> io::Result<WorkerThread> {
    let (accepting_tx, accepting) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name(format!("farside-proxy-{i}"))
        .spawn(move || {
            crate::metrics::set_worker(i);
            let rt = rt.take();
            rt.block_on(async move {
                let life = live.life.clone();
                let until = until_stop_or_drain(life, stopped.clone());
                if let Err(e) = accept_loop(live, listener, limit, false, until).await {
                    log::error!("worker {i}: accept loop failed: {e}");
                }
                let _ = accepting_tx.send(());
                // Its connections run on (a drain lets them finish) until the proxy stops.
                until_stopped(stopped).await;
            });
            rt.shutdown_timeout(SHUTDOWN_GRACE);
        })?;
    Ok(WorkerThread {
        accepting,
        _thread: thread,
    })
}

/// Resolves when [`Running::stop`] was called or the [`Running`] dropped.
async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

/// Resolves at the stop or when the drain starts: when the listeners close.
async fn until_stop_or_drain(life: Arc<Lifecycle>, stopped: watch::Receiver<bool>) {
    tokio::select! {
        _ = until_stopped(stopped) => {}
        _ = life.until_draining() => {}
    }
}

/// Accept clients on `listener` until `shutdown`, each connection a task on the current
/// runtime, at most `limit`'s permits open (shared by all workers). One worker
/// (`purge_pool`) also closes the upstream pool's expired idle connections.
async fn accept_loop(
    live: Arc<Live>,
    listener: TcpListener,
    limit: Arc<Semaphore>,
    purge_pool: bool,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    tokio::pin!(shutdown);
    let mut purge = tokio::time::interval(Duration::from_millis(
        (live.current().cfg.http.pool_idle_timeout_ms / 2)
            .clamp(POOL_PURGE_PERIOD_MS_MIN, POOL_PURGE_PERIOD_MS_MAX),
    ));
    purge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Take the permit before accepting: at the limit, new clients wait in the kernel's
        // accept queue instead of costing us memory.
        let permit = tokio::select! {
            biased;
            _ = &mut shutdown => return Ok(()),
            _ = purge.tick(), if purge_pool => {
                live.current().pool.purge();
                continue;
            }
            p = limit.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return Ok(()),
            },
        };
        let (sock, peer) = tokio::select! {
            biased;
            _ = &mut shutdown => return Ok(()),
            _ = purge.tick(), if purge_pool => {
                live.current().pool.purge();
                drop(permit);
                continue;
            }
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    log::warn!("accept failed: {e}");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
        };
        tokio::spawn(handle_conn(live.clone(), sock, peer, permit));
    }
}
