//! The HTTP/1.1 data path: accept loop, per-connection state machine, runtime setup.
//!
//! One task per client connection, each a loop of exchanges:
//!
//! ```text
//! accept ─ gate.on_accept ─Err→ 503 + close (request never read)
//!   └→ read head (header/idle timeout, size limits) ─bad→ 400/408/431/501 + close
//!       └→ local endpoint (/farside/metrics)                  ─→ respond ─┐
//!       └→ gate.route(host) ─Err→ reject status (+Retry-After) ─→ respond ─┤
//!       └→ pool.checkout: idle conn, or a permit under the back-end's maxconn
//!          (waits ≤ http.queue_timeout_ms) ─Err→ 503 (+Retry-After) ─→ respond ─┤
//!       └→ pooled or new upstream conn ─fail→ 502/504 ─────────→ respond ─┤
//!           └→ send head + stream body → read response head (retry once on a
//!              fresh connection if a pooled one was stale) → stream body back ─┤
//!   ←───────────────── keep-alive: next head ←──────────────────────────────┘
//! ```
//!
//! Buffers live per connection and are reused by every exchange on it: the client read
//! buffer, the upstream read buffer (allocated on first use), and one output `Vec` that
//! holds each rewritten head, so a head and the first body bytes go out in one write.
//! Bodies are streamed, never buffered whole. Every wait has a timeout from
//! [`HttpConfig`](crate::config::HttpConfig), so no peer can hold a task forever, and a
//! failure only ever closes the connection it happened on.
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
//! worker's I/O driver, see [`rehome`]), the bound on client connections, and the drain.
//! Counters are per worker ([`Metrics`]). A listener that closes resets the connections
//! still in its accept queue unless `net.ipv4.tcp_migrate_req = 1` hands them to another
//! listener of the group (a successor's): the same as with one listener, per listener.
//!
//! Drain and reload ([`crate::lifecycle`]): every exchange looks up the current
//! *generation* (configuration, control layer, upstream pool) when its head has been
//! read, so a reload applies to the next request of every connection; once the drain
//! starts, the main listener is closed, a connection idle between requests is closed,
//! and the response in flight is the connection's last (`Connection: close`).
//!
//! Body transfers also have a total deadline and a minimum average rate ([`Pace`]): a
//! request body that misses them gets 408, a response body (back-end reads, client
//! writes) is cut off.
//!
//! Chunked bodies are relayed byte for byte only after [`Chunked`] has checked them
//! against RFC 9112's grammar, so the next hop delimits them exactly as the proxy did
//! (no request smuggling through lenient framing).

use crate::config::ProxyConfig;
use crate::gate::{Gate, Route};
use crate::http::{self, BodyFraming, ChunkError, Chunked, RequestError, RequestHead};
use crate::lifecycle::{self, DrainOutcome, Lifecycle, Reloader};
use crate::metrics::{Metrics, UpstreamError};
use crate::pool::{Checkout, Pool};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at, Instant};

/// Upstream read buffer: a 16 KiB object plus its head arrives in one read.
const UPSTREAM_BUF_BYTES: usize = 32 * 1024;
/// Initial client read buffer; grows up to `http.max_header_bytes` for large heads.
const CLIENT_BUF_BYTES: usize = 8 * 1024;
/// After an error response or `Connection: close`, keep reading (and discarding) for at
/// most this long before closing, so unread request bytes do not turn our close into a
/// reset that destroys the response in the client's receive buffer.
const LINGER: Duration = Duration::from_millis(500);
/// ...and at most this many bytes.
const LINGER_BYTES_MAX: usize = 64 * 1024;
/// Pause after a failed accept (EMFILE and friends) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// Kernel accept queue of the listeners.
const LISTEN_BACKLOG: u32 = 1024;
/// Bounds of the period at which idle upstream connections are checked and closed
/// (half of `http.pool_idle_timeout_ms` within these).
const POOL_PURGE_PERIOD_MS_MIN: u64 = 100;
const POOL_PURGE_PERIOD_MS_MAX: u64 = 5_000;
/// During a drain, how long a connection accepted before the listener closed may stay
/// silent before it is closed: a client sends its request right after connecting, so
/// this covers the race with the close without letting a silent one hold the drain up
/// to `http.header_timeout_ms` (and stays under the lab's 3 s stop grace).
const DRAIN_FIRST_BYTE_GRACE: Duration = Duration::from_millis(500);
/// Time the runtime gives tasks still running to finish once the proxy stops (after
/// the drain, none should be left).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// One generation (see [`crate::lifecycle`]): a configuration with its control layer and
/// upstream pool. Everything an exchange needs.
struct Shared {
    cfg: Arc<ProxyConfig>,
    gate: Arc<dyn Gate>,
    metrics: Arc<Metrics>,
    pool: Arc<Pool>,
    life: Arc<Lifecycle>,
    header_timeout: Duration,
    idle_timeout: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
    queue_timeout: Duration,
    request_body_timeout: Duration,
    response_body_timeout: Duration,
    body_rate_grace: Duration,
}

/// What reading a request head needs, copied out of the generation so that a client
/// idling between requests does not keep a replaced generation (and its monitor) alive.
#[derive(Clone, Copy)]
struct HeadLimits {
    max_headers: usize,
    max_header_bytes: usize,
    header_timeout: Duration,
    idle_timeout: Duration,
}

/// The generation in use, swapped by a reload, and the state every generation shares.
struct Live {
    current: RwLock<Arc<Shared>>,
    life: Arc<Lifecycle>,
    metrics: Arc<Metrics>,
}

impl Live {
    fn current(&self) -> Arc<Shared> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Make `next` the generation of new requests; retire the one it replaces.
    fn swap(&self, next: Arc<Shared>) {
        let old = std::mem::replace(
            &mut *self.current.write().unwrap_or_else(|p| p.into_inner()),
            next,
        );
        old.pool.retire();
    }
}

impl Shared {
    fn new(
        cfg: Arc<ProxyConfig>,
        gate: Arc<dyn Gate>,
        metrics: Arc<Metrics>,
        life: Arc<Lifecycle>,
    ) -> Self {
        let h = &cfg.http;
        let ms = Duration::from_millis;
        let maxconn: Vec<usize> = (0..cfg.backends.len())
            .map(|i| cfg.maxconn_for(i))
            .collect();
        let pool = Arc::new(Pool::new(
            &maxconn,
            h.pool_idle_per_backend,
            ms(h.pool_idle_timeout_ms),
        ));
        gate.bind_pool(pool.clone());
        Shared {
            pool,
            queue_timeout: ms(h.queue_timeout_ms),
            header_timeout: ms(h.header_timeout_ms),
            idle_timeout: ms(h.idle_timeout_ms),
            connect_timeout: ms(h.connect_timeout_ms),
            response_timeout: ms(h.response_timeout_ms),
            request_body_timeout: ms(h.request_body_timeout_ms),
            response_body_timeout: ms(h.response_body_timeout_ms),
            body_rate_grace: ms(h.body_rate_grace_ms),
            cfg,
            gate,
            metrics,
            life,
        }
    }

    fn limits(&self) -> HeadLimits {
        HeadLimits {
            max_headers: self.cfg.http.max_headers,
            max_header_bytes: self.cfg.http.max_header_bytes,
            header_timeout: self.header_timeout,
            idle_timeout: self.idle_timeout,
        }
    }
}

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
    // their listeners register with their own I/O drivers (see `crate::server` docs).
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

/// Move a pooled upstream connection to this worker's I/O driver. The pool is shared by
/// all workers, and a connection stays registered with the driver of the worker that
/// opened it: used from another worker as is, every readiness event would reach this one
/// through that worker's thread (a cross-thread wake-up, late while that worker is busy).
/// With several workers it is re-registered here (two `epoll_ctl` calls per reuse).
fn rehome(s: TcpStream, workers: usize) -> io::Result<TcpStream> {
    if workers <= 1 {
        return Ok(s);
    }
    TcpStream::from_std(s.into_std()?)
}

/// Keeps `connections_active` (and the drain's count of client connections) right
/// however the task ends.
struct ActiveConn {
    live: Arc<Live>,
}

impl ActiveConn {
    fn new(live: Arc<Live>) -> Self {
        live.metrics.here().conns_accepted.fetch_add(1, Relaxed);
        live.metrics.here().conns_active.fetch_add(1, Relaxed);
        live.life.conn_opened();
        ActiveConn { live }
    }
}

impl Drop for ActiveConn {
    fn drop(&mut self) {
        self.live.metrics.here().conns_active.fetch_sub(1, Relaxed);
        self.live.life.conn_closed();
    }
}

async fn handle_conn(
    live: Arc<Live>,
    client: TcpStream,
    peer: SocketAddr,
    _permit: OwnedSemaphorePermit,
) {
    let _active = ActiveConn::new(live.clone());
    let _ = client.set_nodelay(true);
    {
        let sh = live.current();
        if let Err(r) = sh.gate.on_accept(peer) {
            sh.metrics
                .here()
                .conns_rejected_at_accept
                .fetch_add(1, Relaxed);
            sh.metrics.reject(r);
            reject_at_accept(&sh, client, r).await;
            return;
        }
    }
    let conn = Conn {
        client,
        peer_ip: peer.ip().to_string(),
        rbuf: Buf::new(CLIENT_BUF_BYTES, live.metrics.clone()),
        ubuf: Buf::new(UPSTREAM_BUF_BYTES, live.metrics.clone()),
        out: Vec::new(),
        bytes_in: 0,
        bytes_out: 0,
    };
    conn.serve(&live).await;
}

/// One scrape of a generation's metrics (data path, lifecycle, control layer), for the
/// admin server and the data port's `/farside/metrics`.
fn render_metrics(sh: &Shared, enc: &mut farside_admin::Encoder) {
    sh.metrics.render(enc);
    sh.life.render(enc);
    sh.gate.render_metrics(enc);
}

/// The paper's earliest rejection: answer before reading a byte of the request.
async fn reject_at_accept(sh: &Shared, mut client: TcpStream, r: crate::gate::Reject) {
    let status = r.status();
    let retry = (status == 503).then(|| sh.gate.retry_after_s());
    let mut out = Vec::with_capacity(192);
    http::local_response(
        &mut out,
        status,
        true,
        retry,
        "text/plain",
        r.reason().as_bytes(),
        false,
    );
    sh.metrics.response(status);
    if write_all_timeout(&mut client, &out, LINGER).await.is_ok() {
        sh.metrics
            .here()
            .bytes_out
            .fetch_add(out.len() as u64, Relaxed);
        lingering_close(client).await;
    }
}

/// Half-close, then discard what the client still sends (bounded), then close.
async fn lingering_close(mut client: TcpStream) {
    if client.shutdown().await.is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER;
    // On the heap: an array here would sit in every connection task's state (the
    // future's size is that of its largest await point), idle ones included.
    let mut scratch = vec![0u8; 4096];
    let mut discarded = 0;
    while discarded < LINGER_BYTES_MAX {
        match timeout_at(deadline, client.read(&mut scratch)).await {
            Ok(Ok(n)) if n > 0 => discarded += n,
            _ => break,
        }
    }
}

async fn write_all_timeout(s: &mut TcpStream, data: &[u8], limit: Duration) -> io::Result<()> {
    write_all_until(s, data, Instant::now() + limit).await
}

async fn write_all_until(s: &mut TcpStream, data: &[u8], deadline: Instant) -> io::Result<()> {
    match timeout_at(deadline, s.write_all(data)).await {
        Ok(r) => r,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// Deadline of one body transfer: a total bound, and after a grace period a minimum
/// average rate (as Apache's mod_reqtimeout `body=20,MinRate=500`). A transfer that has
/// moved `bytes` must move more by `start + grace + bytes / rate`, and must end by
/// `start + total` whatever its rate. Every wait of the transfer is bounded by
/// [`Pace::until`], so a trickling peer cannot hold a client slot, an upstream
/// connection and a back-end worker beyond these.
struct Pace {
    start: Instant,
    total: Duration,
    grace: Duration,
    rate_bytes_per_s: u64,
    bytes: u64,
}

impl Pace {
    fn new(sh: &Shared, start: Instant, total: Duration) -> Self {
        Pace {
            start,
            total,
            grace: sh.body_rate_grace,
            rate_bytes_per_s: sh.cfg.http.body_min_rate_bytes_per_s,
            bytes: 0,
        }
    }

    fn moved(&mut self, n: usize) {
        self.bytes = self.bytes.saturating_add(n as u64);
    }

    /// When the transfer fails unless it moves more bytes (or ends) first.
    fn deadline(&self) -> Instant {
        if self.rate_bytes_per_s == 0 {
            return self.start + self.total;
        }
        let earned_us = u128::from(self.bytes) * 1_000_000 / u128::from(self.rate_bytes_per_s);
        let by_rate = self.grace.saturating_add(Duration::from_micros(
            u64::try_from(earned_us).unwrap_or(u64::MAX),
        ));
        self.start + by_rate.min(self.total)
    }

    /// The deadline of one wait that has its own limit `per_wait` too.
    fn until(&self, per_wait: Duration) -> Instant {
        self.deadline().min(Instant::now() + per_wait)
    }
}

/// A write to the client that failed on its deadline cuts the response body off.
fn count_write_timeout(sh: &Shared, e: &io::Error) {
    if e.kind() == io::ErrorKind::TimedOut {
        sh.metrics
            .here()
            .response_body_timeouts
            .fetch_add(1, Relaxed);
    }
}

/// `write_all` of `a` then `b`, as vectored writes.
async fn write_two(s: &mut TcpStream, a: &[u8], b: &[u8], deadline: Instant) -> io::Result<()> {
    let all = async {
        let (mut a, mut b) = (a, b);
        while !a.is_empty() || !b.is_empty() {
            let n = if a.is_empty() {
                s.write(b).await?
            } else if b.is_empty() {
                s.write(a).await?
            } else {
                s.write_vectored(&[io::IoSlice::new(a), io::IoSlice::new(b)])
                    .await?
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            let from_a = n.min(a.len());
            a = &a[from_a..];
            b = &b[n - from_a..];
        }
        Ok(())
    };
    match timeout_at(deadline, all).await {
        Ok(r) => r,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

async fn connect(addr: SocketAddr, limit: Duration) -> Result<TcpStream, UpstreamError> {
    match timeout(limit, TcpStream::connect(addr)).await {
        Err(_) => Err(UpstreamError::ConnectTimeout),
        Ok(Err(_)) => Err(UpstreamError::Connect),
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
    }
}

/// A read buffer with a consumed prefix: `data[start..end]` is unread.
struct Buf {
    data: Vec<u8>,
    start: usize,
    end: usize,
    /// Size allocated when bytes are ready to read (allocation is deferred: most
    /// connections that never reach a back-end never need the upstream buffer, and a
    /// connection idle between requests holds none, see [`Buf::release`]).
    initial: usize,
    /// Where the bytes allocated are accounted (`farside_proxy_connection_buffer_bytes`).
    metrics: Arc<Metrics>,
}

impl Buf {
    fn new(initial: usize, metrics: Arc<Metrics>) -> Self {
        Buf {
            data: Vec::new(),
            start: 0,
            end: 0,
            initial,
            metrics,
        }
    }

    /// Free the storage if nothing is buffered (a keep-alive connection waiting for its
    /// next request, as nginx frees its buffers then): idle connections cost no buffer.
    fn release(&mut self) {
        if self.is_empty() && !self.data.is_empty() {
            self.metrics
                .here()
                .conn_buffer_bytes
                .fetch_sub(self.data.len() as u64, Relaxed);
            self.data = Vec::new();
        }
    }

    fn filled(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }

    fn len(&self) -> usize {
        self.end - self.start
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len());
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Read once from `s`, growing up to `limit` bytes if full. `Ok(0)` is EOF; a full
    /// buffer at `limit` is an error (callers check their limits before).
    async fn read_from(&mut self, s: &mut TcpStream, limit: usize) -> io::Result<usize> {
        if self.data.is_empty() {
            // Allocate only once there is something to read.
            s.readable().await?;
            self.data = vec![0; self.initial.min(limit.max(1))];
            self.metrics
                .here()
                .conn_buffer_bytes
                .fetch_add(self.data.len() as u64, Relaxed);
        }
        if self.end == self.data.len() {
            if self.start > 0 {
                self.data.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else if self.data.len() < limit {
                let grown = (self.data.len() * 2).min(limit);
                self.metrics
                    .here()
                    .conn_buffer_bytes
                    .fetch_add((grown - self.data.len()) as u64, Relaxed);
                self.data.resize(grown, 0);
            } else {
                return Err(io::Error::other("read buffer full"));
            }
        }
        let n = s.read(&mut self.data[self.end..]).await?;
        self.end += n;
        Ok(n)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        self.metrics
            .here()
            .conn_buffer_bytes
            .fetch_sub(self.data.len() as u64, Relaxed);
    }
}

/// Progress through a message body.
enum Body {
    Done,
    Length(u64),
    Chunked { scan: Chunked, decode: bool },
    UntilClose,
}

impl Body {
    fn new(framing: BodyFraming, decode: bool) -> Self {
        match framing {
            BodyFraming::None => Body::Done,
            BodyFraming::Length(n) => Body::Length(n),
            BodyFraming::Chunked => Body::Chunked {
                scan: Chunked::new(),
                decode,
            },
            BodyFraming::Close => Body::UntilClose,
        }
    }

    fn is_done(&self) -> bool {
        matches!(self, Body::Done)
    }

    fn decodes(&self) -> bool {
        matches!(self, Body::Chunked { decode: true, .. })
    }

    /// How many leading bytes of `input` belong to the body; afterwards `is_done` says
    /// whether it is complete. A decoding body appends its payload to `decoded`.
    fn advance(&mut self, input: &[u8], decoded: &mut Vec<u8>) -> Result<usize, ChunkError> {
        let n = match self {
            Body::Done => 0,
            Body::UntilClose => input.len(),
            Body::Length(rest) => {
                let n = usize::try_from(*rest)
                    .unwrap_or(usize::MAX)
                    .min(input.len());
                *rest -= n as u64;
                if *rest == 0 {
                    *self = Body::Done;
                }
                n
            }
            Body::Chunked { scan, decode } => {
                let end = if *decode {
                    scan.feed(input, &mut |d| decoded.extend_from_slice(d))?
                } else {
                    scan.feed(input, &mut |_| {})?
                };
                match end {
                    Some(n) => {
                        *self = Body::Done;
                        n
                    }
                    None => input.len(),
                }
            }
        };
        Ok(n)
    }
}

/// What to do with the client connection after an exchange.
enum Next {
    KeepAlive,
    /// Half-close gracefully (the response is complete).
    Close,
    /// Drop at once (the response is incomplete; the client must see the close).
    Abort,
}

/// Why reading a request head ended without a head.
enum HeadFail {
    Bad(RequestError),
    Timeout,
}

struct Conn {
    client: TcpStream,
    peer_ip: String,
    rbuf: Buf,
    ubuf: Buf,
    /// Staging for every head (and the first body bytes) written to either side.
    out: Vec<u8>,
    bytes_in: u64,
    bytes_out: u64,
}

impl Conn {
    async fn serve(mut self, live: &Live) {
        let accepted = Instant::now();
        let mut first = true;
        loop {
            // Draining: a kept-alive client between requests is closed now (its last
            // response said `Connection: close` unless the drain began after it).
            if !first && live.life.draining() && self.rbuf.is_empty() {
                break;
            }
            if self.rbuf.is_empty() {
                // Idle until the next request: hold no buffers meanwhile (they are
                // allocated again when its first bytes arrive).
                self.rbuf.release();
                self.ubuf.release();
                self.out = Vec::new();
            }
            let limits = live.current().limits();
            let req = self.read_head(limits, &live.life, first, accepted).await;
            // Looked up per request: a reload applies to the next request.
            let current = live.current();
            let sh = &*current;
            let req = match req {
                Ok(Some(req)) => req,
                Ok(None) => break,
                Err(fail) => {
                    let (status, reason) = match fail {
                        HeadFail::Bad(e) => (e.status(), e.reason()),
                        HeadFail::Timeout => (408, "header_timeout"),
                    };
                    let sent = self
                        .respond(sh, status, true, None, reason.as_bytes(), false)
                        .await;
                    self.flush_counts(sh);
                    if sent.is_ok() {
                        lingering_close(self.client).await;
                    }
                    return;
                }
            };
            first = false;
            let started = Instant::now();
            // Boxed: the exchange's large state lives on the heap only while it runs, so
            // a connection idle between requests keeps just the small head-reading state.
            let next = Box::pin(self.exchange(sh, req)).await;
            sh.metrics.latency(started.elapsed());
            self.flush_counts(sh);
            match next {
                Next::KeepAlive if !sh.life.draining() => {}
                Next::KeepAlive | Next::Close => return lingering_close(self.client).await,
                Next::Abort => return,
            }
        }
        self.flush_counts(&live.current());
    }

    fn flush_counts(&mut self, sh: &Shared) {
        sh.metrics.here().bytes_in.fetch_add(self.bytes_in, Relaxed);
        sh.metrics
            .here()
            .bytes_out
            .fetch_add(self.bytes_out, Relaxed);
        self.bytes_in = 0;
        self.bytes_out = 0;
    }

    /// Read until a complete request head is buffered. `Ok(None)`: the client closed or
    /// idled out between requests (close quietly).
    async fn read_head(
        &mut self,
        h: HeadLimits,
        life: &Lifecycle,
        first: bool,
        accepted: Instant,
    ) -> Result<Option<RequestHead>, HeadFail> {
        // The first head must be complete `header_timeout` after accept; on a keep-alive
        // connection the client may idle `idle_timeout` before starting the next one.
        let mut awaiting_first_byte = !first && self.rbuf.is_empty();
        let mut deadline = if first {
            accepted + h.header_timeout
        } else if awaiting_first_byte {
            Instant::now() + h.idle_timeout
        } else {
            Instant::now() + h.header_timeout
        };
        loop {
            if !self.rbuf.is_empty() {
                match http::parse_request(
                    self.rbuf.filled(),
                    h.max_headers,
                    h.max_header_bytes,
                    &self.peer_ip,
                    &mut self.out,
                ) {
                    Ok(Some(req)) => return Ok(Some(req)),
                    Ok(None) => {}
                    Err(e) => return Err(HeadFail::Bad(e)),
                }
            }
            let silent_new_conn = first && self.rbuf.is_empty();
            let read = self.rbuf.read_from(&mut self.client, h.max_header_bytes);
            // Draining: an idle kept-alive client is closed at once; a new one that has
            // sent nothing yet gets DRAIN_FIRST_BYTE_GRACE for its request to arrive.
            let drained = async {
                if awaiting_first_byte {
                    life.until_draining().await
                } else if silent_new_conn {
                    life.until_draining().await;
                    tokio::time::sleep(DRAIN_FIRST_BYTE_GRACE).await
                } else {
                    std::future::pending().await
                }
            };
            let read = tokio::select! {
                r = timeout_at(deadline, read) => r,
                _ = drained => return Ok(None),
            };
            match read {
                Err(_) if self.rbuf.is_empty() => return Ok(None),
                Err(_) => return Err(HeadFail::Timeout),
                Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
                Ok(Ok(n)) => {
                    self.bytes_in += n as u64;
                    if awaiting_first_byte {
                        awaiting_first_byte = false;
                        deadline = Instant::now() + h.header_timeout;
                    }
                }
            }
        }
    }

    /// Write a response generated by the proxy.
    async fn respond(
        &mut self,
        sh: &Shared,
        status: u16,
        close: bool,
        retry_after_s: Option<u32>,
        body: &[u8],
        head_only: bool,
    ) -> io::Result<()> {
        http::local_response(
            &mut self.out,
            status,
            close,
            retry_after_s,
            "text/plain",
            body,
            head_only,
        );
        sh.metrics.response(status);
        self.bytes_out += self.out.len() as u64;
        write_all_timeout(&mut self.client, &self.out, sh.idle_timeout).await
    }

    /// Answer `req` locally. The connection stays open only if the client wants it and
    /// its request body (if any) was already buffered, so it can be skipped.
    async fn respond_to(
        &mut self,
        sh: &Shared,
        req: &RequestHead,
        status: u16,
        retry_after_s: Option<u32>,
        body: &[u8],
    ) -> Next {
        self.rbuf.consume(req.head_len);
        let mut rest = Body::new(req.framing, false);
        let skipped = rest
            .advance(self.rbuf.filled(), &mut Vec::new())
            .unwrap_or(0);
        self.rbuf.consume(skipped);
        let close = !req.keep_alive || !rest.is_done() || sh.life.draining();
        match self
            .respond(sh, status, close, retry_after_s, body, req.is_head)
            .await
        {
            Ok(()) if close => Next::Close,
            Ok(()) => Next::KeepAlive,
            Err(_) => Next::Abort,
        }
    }

    /// One request/response exchange for a parsed head (whose rewritten form is in `out`).
    async fn exchange(&mut self, sh: &Shared, req: RequestHead) -> Next {
        let target = &self.rbuf.filled()[req.target.clone()];
        if target == b"/farside/metrics" {
            return if req.is_get || req.is_head {
                let mut enc = farside_admin::Encoder::new();
                render_metrics(sh, &mut enc);
                let text = enc.finish();
                self.respond_to(sh, &req, 200, None, text.as_bytes()).await
            } else {
                self.respond_to(sh, &req, 405, None, b"method_not_allowed")
                    .await
            };
        }

        let routed = {
            let buf = self.rbuf.filled();
            let host = req
                .host
                .clone()
                .and_then(|r| std::str::from_utf8(&buf[r]).ok());
            sh.gate.route(host)
        };
        let route = match routed {
            Ok(route) => route,
            Err(r) => return self.reject(sh, &req, r).await,
        };
        // Before the head is consumed, so a refusal here is answered like the gate's.
        let waited_from = Instant::now();
        let checkout = sh
            .pool
            .checkout(
                route.backend,
                route.addr,
                route.reuse_only,
                sh.queue_timeout,
            )
            .await;
        sh.metrics.upstream_wait(waited_from.elapsed());
        match checkout {
            Ok(c) => self.proxy(sh, req, route, c).await,
            Err(r) => {
                drop(route);
                self.reject(sh, &req, r).await
            }
        }
    }

    /// Answer `req` with the status of a rejection (503s carry `Retry-After`).
    async fn reject(&mut self, sh: &Shared, req: &RequestHead, r: crate::gate::Reject) -> Next {
        sh.metrics.reject(r);
        let status = r.status();
        let retry = (status == 503).then(|| sh.gate.retry_after_s());
        self.respond_to(sh, req, status, retry, r.reason().as_bytes())
            .await
    }

    async fn proxy(
        &mut self,
        sh: &Shared,
        mut req: RequestHead,
        route: Route,
        checkout: Checkout,
    ) -> Next {
        self.rbuf.consume(req.head_len);
        if req.host.is_none() {
            // Only HTTP/1.0 may omit Host, but the request goes upstream as HTTP/1.1,
            // which must carry one (RFC 9112 §3.2; nginx answers 400 without): name the
            // back-end. `out` ends with the head's empty line.
            let end = self.out.len() - 2;
            let host = format!("Host: {}\r\n", route.addr);
            self.out.splice(end..end, host.bytes());
        }
        // The request body's deadlines (see `send_request`).
        let mut pace: Option<Pace> = None;
        if req.expect_continue {
            // We strip Expect and answer it ourselves: the client would otherwise wait
            // for the 100 while we wait for its body.
            const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
            if write_all_timeout(&mut self.client, CONTINUE, sh.idle_timeout)
                .await
                .is_err()
            {
                return Next::Abort;
            }
            self.bytes_out += CONTINUE.len() as u64;
        }
        // Whatever part of the request body is already buffered goes out with the head.
        let mut body = Body::new(req.framing, false);
        let buffered_body = match body.advance(self.rbuf.filled(), &mut Vec::new()) {
            Ok(n) => {
                self.out.extend_from_slice(&self.rbuf.filled()[..n]);
                self.rbuf.consume(n);
                n
            }
            Err(ChunkError) => return self.request_body_failed(sh, BodyFail::Malformed).await,
        };
        // A request that fits in `out` can be sent again if a pooled connection was stale.
        let retryable = body.is_done() && req.idempotent;

        // A retry after a stale pooled connection connects afresh under that
        // connection's permit (the back-end closed it, so the count is unchanged).
        let mut next = Some(checkout);
        let (mut up, permit, resp) = loop {
            let (reused, mut up, permit) = match next.take().expect("set for every attempt") {
                Checkout::Pooled(s, p) => match rehome(s, sh.cfg.workers) {
                    Ok(s) => {
                        sh.metrics.here().upstream_reused.fetch_add(1, Relaxed);
                        (true, s, p)
                    }
                    // Its old driver is gone (that worker stopped): connect afresh.
                    Err(_) => {
                        next = Some(Checkout::Fresh(p));
                        continue;
                    }
                },
                Checkout::Fresh(p) => match connect(route.addr, sh.connect_timeout).await {
                    Ok(s) => {
                        sh.metrics.here().upstream_connects.fetch_add(1, Relaxed);
                        (false, s, p)
                    }
                    Err(e) => {
                        sh.gate.report_failure(route.backend);
                        return self.upstream_failed(sh, &req, e, body.is_done()).await;
                    }
                },
            };
            // The request body's deadlines run from when the proxy starts relaying it: time
            // spent getting a back-end connection is not the client's to make up.
            let pace = pace.get_or_insert_with(|| {
                let mut p = Pace::new(sh, Instant::now(), sh.request_body_timeout);
                p.moved(buffered_body);
                p
            });
            match self.send_request(sh, &mut up, &mut body, pace).await {
                Ok(()) => {}
                // `up` holds part of a request: dropping it closes it, never pooled.
                Err(Side::Client(f)) => return self.request_body_failed(sh, f).await,
                Err(Side::Upstream) if reused && retryable => {
                    sh.metrics.here().upstream_retries.fetch_add(1, Relaxed);
                    next = Some(Checkout::Fresh(permit));
                    continue;
                }
                Err(Side::Upstream) => {
                    let e = UpstreamError::ResetBeforeHead;
                    return self.upstream_failed(sh, &req, e, body.is_done()).await;
                }
            }
            match self.read_response_head(sh, &mut up, &mut req).await {
                Ok(resp) => break (up, permit, resp),
                Err((UpstreamError::ResetBeforeHead, false)) if reused && retryable => {
                    sh.metrics.here().upstream_retries.fetch_add(1, Relaxed);
                    next = Some(Checkout::Fresh(permit));
                }
                Err((e, _)) => {
                    if !reused && e == UpstreamError::ResetBeforeHead {
                        sh.gate.report_failure(route.backend);
                    }
                    return self.upstream_failed(sh, &req, e, body.is_done()).await;
                }
            }
        };

        // A short body still arriving (a typical back-end writes the head, then sends the
        // file) is read in full before the first write, so the client gets the response
        // in one segment: it is woken, and acknowledges, once per response instead of
        // twice. Bounded by the buffer and by the response timeout; as nothing has been
        // sent yet, a back-end failing here gets the client a 502.
        // The response body's deadlines (total, minimum rate) bound every wait from here
        // on: back-end reads and client writes alike.
        let mut pace = Pace::new(sh, Instant::now(), sh.response_body_timeout);
        if let BodyFraming::Length(len) = resp.framing {
            let want = resp.head_len.saturating_add(len as usize);
            while !resp.dechunk && want <= UPSTREAM_BUF_BYTES && self.ubuf.len() < want {
                let read = self.ubuf.read_from(&mut up, UPSTREAM_BUF_BYTES);
                match timeout_at(pace.until(sh.response_timeout), read).await {
                    Ok(Ok(n)) if n > 0 => {}
                    r => {
                        if r.is_err() {
                            sh.metrics
                                .here()
                                .response_body_timeouts
                                .fetch_add(1, Relaxed);
                        }
                        sh.metrics.upstream_error(UpstreamError::MidBody);
                        return self.upstream_failed_before_head(sh, &req).await;
                    }
                }
            }
        }

        // Relay the response: head plus the body bytes already read, in one (vectored)
        // write; the body bytes are not copied unless they must be decoded.
        self.ubuf.consume(resp.head_len);
        let mut body = Body::new(resp.framing, resp.dechunk);
        // Captured now: a body that completes becomes `Body::Done`, which decodes nothing.
        let decode = body.decodes();
        let n = match body.advance(self.ubuf.filled(), &mut self.out) {
            Ok(n) => n,
            Err(ChunkError) => {
                sh.metrics.upstream_error(UpstreamError::BadHead);
                return self.upstream_failed_before_head(sh, &req).await;
            }
        };
        let raw = if decode {
            &[][..]
        } else {
            &self.ubuf.filled()[..n]
        };
        let deadline = pace.until(sh.idle_timeout);
        let written = write_two(&mut self.client, &self.out, raw, deadline).await;
        if let Err(e) = written {
            count_write_timeout(sh, &e);
            return Next::Abort;
        }
        self.bytes_out += (self.out.len() + raw.len()) as u64;
        pace.moved(raw.len());
        self.ubuf.consume(n);
        let until_close = matches!(body, Body::UntilClose);
        while !body.is_done() {
            let read = self.ubuf.read_from(&mut up, UPSTREAM_BUF_BYTES);
            match timeout_at(pace.until(sh.response_timeout), read).await {
                Ok(Ok(n)) if n > 0 => {}
                Ok(Ok(_)) if until_close => break,
                r => {
                    if r.is_err() {
                        sh.metrics
                            .here()
                            .response_body_timeouts
                            .fetch_add(1, Relaxed);
                    }
                    sh.metrics.upstream_error(UpstreamError::MidBody);
                    return Next::Abort;
                }
            }
            self.out.clear();
            let n = match body.advance(self.ubuf.filled(), &mut self.out) {
                Ok(n) => n,
                Err(ChunkError) => {
                    sh.metrics.upstream_error(UpstreamError::MidBody);
                    return Next::Abort;
                }
            };
            let chunk = if decode {
                &self.out[..]
            } else {
                &self.ubuf.filled()[..n]
            };
            let deadline = pace.until(sh.idle_timeout);
            if let Err(e) = write_all_until(&mut self.client, chunk, deadline).await {
                count_write_timeout(sh, &e);
                return Next::Abort;
            }
            self.bytes_out += chunk.len() as u64;
            pace.moved(chunk.len());
            self.ubuf.consume(n);
        }
        // Bytes beyond the response mean a confused back-end: do not reuse that connection.
        if resp.upstream_reusable && self.ubuf.is_empty() {
            sh.pool.put(route.backend, route.addr, up, permit);
        }
        self.ubuf.clear();
        drop(route);
        sh.metrics.response(resp.status);
        if resp.client_close {
            Next::Close
        } else {
            Next::KeepAlive
        }
    }

    /// Send the head in `out` (with any buffered body bytes), then stream the rest of the
    /// request body from the client. `out` is left intact when the body was complete, so
    /// the request can be resent.
    ///
    /// Each read from the client is bounded by `pace` (the request body's total and
    /// minimum-rate deadlines) as well as by the idle timeout.
    async fn send_request(
        &mut self,
        sh: &Shared,
        up: &mut TcpStream,
        body: &mut Body,
        pace: &mut Pace,
    ) -> Result<(), Side> {
        write_all_timeout(up, &self.out, sh.response_timeout)
            .await
            .map_err(|_| Side::Upstream)?;
        while !body.is_done() {
            let read = self
                .rbuf
                .read_from(&mut self.client, sh.cfg.http.max_header_bytes);
            match timeout_at(pace.until(sh.idle_timeout), read).await {
                Ok(Ok(n)) if n > 0 => self.bytes_in += n as u64,
                Err(_) => return Err(Side::Client(BodyFail::Timeout)),
                Ok(_) => return Err(Side::Client(BodyFail::Gone)),
            }
            let n = body
                .advance(self.rbuf.filled(), &mut Vec::new())
                .map_err(|_| Side::Client(BodyFail::Malformed))?;
            write_all_timeout(up, &self.rbuf.filled()[..n], sh.response_timeout)
                .await
                .map_err(|_| Side::Upstream)?;
            self.rbuf.consume(n);
            pace.moved(n);
        }
        Ok(())
    }

    /// The client's request body failed before any of the response was sent: tell it
    /// why if it can still hear (408 / 400), then close. Whatever part of the request
    /// reached a back-end dies with that connection, which is never reused.
    async fn request_body_failed(&mut self, sh: &Shared, f: BodyFail) -> Next {
        let (status, reason): (u16, &[u8]) = match f {
            BodyFail::Gone => return Next::Abort,
            BodyFail::Timeout => {
                sh.metrics
                    .here()
                    .request_body_timeouts
                    .fetch_add(1, Relaxed);
                (408, b"request_body_timeout")
            }
            BodyFail::Malformed => (400, b"malformed_chunked_body"),
        };
        match self.respond(sh, status, true, None, reason, false).await {
            Ok(()) => Next::Close,
            Err(_) => Next::Abort,
        }
    }

    /// Read the back-end's response head into `ubuf`, skipping interim 1xx responses.
    /// On error, the flag says whether any response byte had arrived.
    async fn read_response_head(
        &mut self,
        sh: &Shared,
        up: &mut TcpStream,
        req: &mut RequestHead,
    ) -> Result<http::ResponseHead, (UpstreamError, bool)> {
        let h = &sh.cfg.http;
        let limit = h.max_header_bytes.max(UPSTREAM_BUF_BYTES);
        let deadline = Instant::now() + sh.response_timeout;
        let mut got_bytes = false;
        self.ubuf.clear();
        loop {
            if !self.ubuf.is_empty() {
                // Draining: this response is the connection's last (`Connection: close`).
                if sh.life.draining() {
                    req.keep_alive = false;
                }
                match http::parse_response(
                    self.ubuf.filled(),
                    h.max_headers,
                    h.max_header_bytes,
                    req,
                    &mut self.out,
                ) {
                    Ok(Some(resp)) if resp.status < 200 => {
                        self.ubuf.consume(resp.head_len);
                        continue;
                    }
                    Ok(Some(resp)) => return Ok(resp),
                    Ok(None) => {}
                    Err(_) => return Err((UpstreamError::BadHead, true)),
                }
            }
            match timeout_at(deadline, self.ubuf.read_from(up, limit)).await {
                Err(_) => return Err((UpstreamError::HeadTimeout, got_bytes)),
                Ok(Ok(0)) | Ok(Err(_)) => return Err((UpstreamError::ResetBeforeHead, got_bytes)),
                Ok(Ok(_)) => got_bytes = true,
            }
        }
    }

    async fn upstream_failed(
        &mut self,
        sh: &Shared,
        req: &RequestHead,
        e: UpstreamError,
        body_consumed: bool,
    ) -> Next {
        sh.metrics.upstream_error(e);
        let close = !req.keep_alive || !body_consumed || sh.life.draining();
        match self
            .respond(
                sh,
                e.status(),
                close,
                None,
                e.kind().as_bytes(),
                req.is_head,
            )
            .await
        {
            Ok(()) if close => Next::Close,
            Ok(()) => Next::KeepAlive,
            Err(_) => Next::Abort,
        }
    }

    /// The response head was fine but its first body bytes were not: nothing has been
    /// sent to the client yet, so it still gets a 502 (and the connection closes).
    async fn upstream_failed_before_head(&mut self, sh: &Shared, req: &RequestHead) -> Next {
        match self
            .respond(sh, 502, true, None, b"bad_upstream_body", req.is_head)
            .await
        {
            Ok(()) => Next::Close,
            Err(_) => Next::Abort,
        }
    }
}

/// Which side of an exchange failed.
enum Side {
    Client(BodyFail),
    Upstream,
}

/// How a client's request body failed.
enum BodyFail {
    /// The client closed or reset the connection.
    Gone,
    /// Idle, total or minimum-rate deadline of the request body.
    Timeout,
    /// A chunked body outside RFC 9112's grammar or the scanner's bounds.
    Malformed,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(total_ms: u64, grace_ms: u64, rate_bytes_per_s: u64) -> Pace {
        Pace {
            start: Instant::now(),
            total: Duration::from_millis(total_ms),
            grace: Duration::from_millis(grace_ms),
            rate_bytes_per_s,
            bytes: 0,
        }
    }

    #[test]
    fn pace_deadline_is_grace_plus_earned_time_capped_by_total() {
        let mut p = pace(10_000, 1_000, 1_000);
        assert_eq!(p.deadline() - p.start, Duration::from_secs(1));
        p.moved(500);
        assert_eq!(p.deadline() - p.start, Duration::from_millis(1_500));
        p.moved(1_000_000);
        assert_eq!(
            p.deadline() - p.start,
            Duration::from_secs(10),
            "total caps it"
        );
        // Huge byte counts saturate instead of overflowing.
        p.moved(usize::MAX);
        p.moved(usize::MAX);
        assert_eq!(p.deadline() - p.start, Duration::from_secs(10));
        // Rate 0: the total alone.
        let p = pace(10_000, 1_000, 0);
        assert_eq!(p.deadline() - p.start, Duration::from_secs(10));
        // A wait's own limit applies when it is sooner.
        let p = pace(10_000, 1_000, 0);
        assert!(p.until(Duration::from_millis(5)) < p.start + Duration::from_secs(1));
    }
}
