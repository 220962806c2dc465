//! farside's test web server, modelled on Apache httpd's prefork MPM.
//!
//! A fixed pool of `--workers` OS threads (Apache's `MaxClients`) each accept
//! one connection from a shared listening socket and serve it with blocking
//! I/O until the client closes it, the keep-alive idle timeout expires, or
//! `--keepalive-max` requests were served (Apache's `MaxKeepAliveRequests`).
//! While every worker is busy, new connections wait in the kernel's accept
//! backlog (`--backlog`, Apache's `ListenBacklog`), and once that is full the
//! kernel drops SYNs and clients retry with exponential backoff. That queueing
//! is the overload the admission-control paper (seed 000) protects against,
//! so it is real here, not simulated.
//!
//! Endpoints (GET and HEAD):
//! - `/healthz` → 200.
//! - `POST /digest` (with `Content-Length`, at most [`POST_DIGEST_BYTES_MAX`]) → 200
//!   `fnv1a64=<16 hex digits> bytes=<n>`: the body streamed through FNV-1a 64, so tests
//!   can check every byte of a large upload (e.g. one carried across a migration).
//! - `/cgi/work?us=N` → burns N µs of *thread CPU time* (default `--cpu-us`):
//!   the dynamic request of a mixed-cost workload (e.g. static files at the
//!   default ~tens of µs against `/cgi/work?us=5000`, a 100× difference).
//! - with `--root DIR`: real files under DIR, read from disk per request
//!   (`read` + `write`, see `serve`); a directory serves its `index.html`.
//!   Refused: `..` segments, raw or percent-encoded (`%2e%2e`) → 400; malformed
//!   escapes or NUL → 400; symlinks leading outside DIR → 403. Responses carry
//!   `Last-Modified`, and `If-Modified-Since` no earlier than the file's mtime
//!   → 304 Not Modified with no body. This is what the lab serves: it writes
//!   the trace's files with `farside_loadgen::write_docroot` and runs the
//!   load generator with `--paths docroot`.
//! - with `--sites-root DIR --site NAME`: co-hosted sites (seed 001): every site's
//!   files under `DIR/<site>`, exactly one site served at a time (as `--root`), switched
//!   at run time over the `--control` Unix socket (see [`sites`]); responses carry
//!   `X-Farside-Site: <site>`.
//! - without `--root`: generated content, `/file16k` (16384 bytes) and
//!   `/files/<N>` or `/files/<N>/<anything>` (N bytes), so load generator
//!   traces (`--paths generated`) and unit tests work with no docroot at all.
//!
//! Cost: file and generated requests burn the cost model's CPU
//! (`--cpu-us-per-request` + `--cpu-ns-per-byte` × body bytes; see [`CostModel`]
//! and the rule that sets its defaults) on top of the server's real work.
//! Every response carries `X-Farside-Cpu-Us`: the worker thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`) from the parsed request head to the response
//! head's write — routing, `open`/`stat`, reading the body from disk (bodies up
//! to 1 MiB), the emulated cost or `/cgi/work`'s burn; the final socket write is
//! not included (an RDMA transfer, which happens before the head, is). Experiments use it to check the model.
//!
//! With `--adopt-socket PATH` the same workers also serve connected sockets handed
//! over by a local agent (the speculative-admission daemon's migrated connections),
//! see [`adopt`].
//!
//! With `--rdma`, a GET carrying the `RDMA:` header of the seed paper (Dalessandro and
//! Wyckoff, NCA 2007) gets its 200 body by RDMA over the software iWARP stack,
//! server-writes or client-reads (see [`farside_rdmahttp::server`]): the answer has
//! `Content-Length: 0` and an `RDMA:` field with the length (and, for client-reads,
//! where to read). A request the server will not take that way (too large, not the
//! client's own address, caps reached, RDMA connection failed) gets its body as usual
//! with `RDMA: declined, reason=...`; a request without the header is unchanged.
//!
//! Errors: bad request line → 400, head larger than [`HEAD_BYTES_MAX`] → 431,
//! unknown method → 501, missing file → 404, a file that shrank while read →
//! 500. Every response carries an `X-Farside-Backend` header naming the listen
//! address, so tests (and the lab) can see which back-end served a request.

pub mod adopt;
pub mod coop;
mod cost;
mod httpdate;
mod serve;
pub mod sites;

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use cost::{
    CostModel, CPU_NS_PER_BYTE_DEFAULT, CPU_NS_PER_BYTE_MAX, CPU_US_PER_REQUEST_DEFAULT,
};
pub use serve::generated_byte;

/// Largest request head (request line + headers) accepted, in bytes; larger
/// heads get 431. Apache's default `LimitRequestFieldSize` is 8 KiB per field;
/// 16 KiB for the whole head is generous for every trace we replay.
pub const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Most header fields parsed per request; more → 431.
pub const HEADERS_MAX: usize = 64;
/// Upper bound of `--workers`: each worker is an OS thread with its own stack.
pub const WORKERS_MAX: usize = 4096;
/// Upper bound of `/cgi/work?us=N`: 10 s of CPU per request is already absurd.
pub const CPU_US_MAX: u64 = 10_000_000;
/// Largest generated file (`/files/<N>`); larger N → 404. 1 GiB.
pub const GENERATED_BYTES_MAX: u64 = 1 << 30;
/// Largest request body a GET/HEAD may carry (it is read and discarded); more → 413.
pub const REQUEST_BODY_BYTES_MAX: u64 = 1 << 20;
/// Largest `POST /digest` body (streamed, never held): 1 GiB bounds one request's time.
pub const POST_DIGEST_BYTES_MAX: u64 = 1 << 30;

/// Command-line flags of `farside backend`.
#[derive(Debug, Clone, clap::Args)]
pub struct BackendArgs {
    /// Address to listen on; port 0 picks a free port. Default: 127.0.0.1:8080.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Directory of static files to serve. Default: none, which serves
    /// generated files (`/file16k`, `/files/<N>`).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Co-hosted sites: a directory with one sub-directory per site (its docroot).
    /// Exactly one site is served at a time (--site), switched at run time over
    /// --control. Excludes --root.
    #[arg(long = "sites-root", conflicts_with = "root", requires = "site")]
    pub sites_root: Option<PathBuf>,
    /// With --sites-root: the site served at start (a sub-directory name).
    #[arg(long, requires = "sites_root")]
    pub site: Option<String>,
    /// With --sites-root: path of a Unix stream socket through which a local agent
    /// (gatherd --role-backend-control) switches the site served: request `site NAME`,
    /// answer `ok NAME` or `err REASON`; `get` answers `site NAME`. One line each, at
    /// most 128 bytes. Mode 0600 (this user only). An existing socket file at the path
    /// is replaced.
    #[arg(long, requires = "sites_root")]
    pub control: Option<PathBuf>,
    /// Worker threads, i.e. connections served at once (Apache's MaxClients).
    /// Default: 8.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Kernel accept backlog of the listening socket (Apache's ListenBacklog).
    /// The kernel caps it at net.core.somaxconn. Default: 128.
    #[arg(long, default_value_t = 128)]
    pub backlog: u32,
    /// CPU time burned by `/cgi/work` when the request names no `us=`, in µs.
    /// Default: 1000.
    #[arg(long = "cpu-us", default_value_t = 1000)]
    pub cpu_us: u64,
    /// Emulated CPU per static or generated file request (200, 304 or error), in µs,
    /// burned before the response is written, on top of the server's own work. Cost
    /// model: µs = this + --cpu-ns-per-byte × body bytes / 1000. Default 0, by the rule
    /// "this server's total = nginx's" (crates/backend/calibrate.sh: nginx ≈ 12–22 µs +
    /// 0.28–0.37 ns/B on the lab machine, this server's own work ≈ 28–33 µs + 0.30–0.39
    /// ns/B). For a back-end k times as costly as nginx use ≈ k × 17 − 30 here and
    /// k × 0.33 − 0.35 for --cpu-ns-per-byte, e.g. 1500 and 29 for k = 90 (1.5 ms for a
    /// small file, 32 ms for 1 MiB). --static-cpu-us is the deprecated name.
    #[arg(
        long = "cpu-us-per-request",
        alias = "static-cpu-us",
        default_value_t = CPU_US_PER_REQUEST_DEFAULT
    )]
    pub cpu_us_per_request: u64,
    /// Emulated CPU per body byte a file request sends, in ns (fractions allowed; see
    /// --cpu-us-per-request). Default 0: nginx's per-byte cost minus this server's own
    /// read + write cost, clamped at 0.
    #[arg(long = "cpu-ns-per-byte", default_value_t = CPU_NS_PER_BYTE_DEFAULT)]
    pub cpu_ns_per_byte: f64,
    /// Requests served on one connection before it is closed (Apache's
    /// MaxKeepAliveRequests). Default: 100.
    #[arg(long = "keepalive-max", default_value_t = 100)]
    pub keepalive_max: u32,
    /// Time allowed to receive a request head, and idle time of a kept-alive
    /// connection before it is closed, in ms. Default: 10000.
    #[arg(long = "header-timeout-ms", default_value_t = 10_000)]
    pub header_timeout_ms: u64,
    /// Path of a Unix datagram socket (created, mode 0600; an existing socket file is
    /// replaced) through which a local agent (`farside specd`) hands over connected
    /// TCP sockets by SCM_RIGHTS, one per datagram; they are served like accepted
    /// connections by the same workers. Default: none.
    #[arg(long = "adopt-socket")]
    pub adopt_socket: Option<PathBuf>,
    // RDMA over HTTP: --rdma and its caps.
    #[command(flatten)]
    pub rdma: farside_rdmahttp::cli::RdmaServeArgs,
    // Cooperative caching: --coop and its flags (see [`coop`]).
    #[command(flatten)]
    pub coop: coop::CoopArgs,
}

impl Default for BackendArgs {
    fn default() -> Self {
        BackendArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            root: None,
            sites_root: None,
            site: None,
            control: None,
            workers: 8,
            backlog: 128,
            cpu_us: 1000,
            cpu_us_per_request: CPU_US_PER_REQUEST_DEFAULT,
            cpu_ns_per_byte: CPU_NS_PER_BYTE_DEFAULT,
            keepalive_max: 100,
            header_timeout_ms: 10_000,
            adopt_socket: None,
            rdma: Default::default(),
            coop: Default::default(),
        }
    }
}

impl BackendArgs {
    /// Checks every bound; returns a message naming the offending flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.workers == 0 || self.workers > WORKERS_MAX {
            return Err(format!("--workers must be in 1..={WORKERS_MAX}"));
        }
        if self.backlog == 0 || self.backlog > i32::MAX as u32 {
            return Err("--backlog must be at least 1".into());
        }
        if self.cpu_us > CPU_US_MAX {
            return Err(format!("--cpu-us must be at most {CPU_US_MAX}"));
        }
        if self.cpu_us_per_request > CPU_US_MAX {
            return Err(format!("--cpu-us-per-request must be at most {CPU_US_MAX}"));
        }
        if !(0.0..=CPU_NS_PER_BYTE_MAX).contains(&self.cpu_ns_per_byte) {
            return Err(format!(
                "--cpu-ns-per-byte must be in 0..={CPU_NS_PER_BYTE_MAX}"
            ));
        }
        if self.keepalive_max == 0 {
            return Err("--keepalive-max must be at least 1".into());
        }
        if self.header_timeout_ms == 0 {
            return Err("--header-timeout-ms must be at least 1".into());
        }
        if self.sites_root.is_some() && self.root.is_some() {
            return Err("--sites-root and --root exclude each other".into());
        }
        if self.sites_root.is_some() != self.site.is_some() {
            return Err("--sites-root and --site go together".into());
        }
        if self.control.is_some() && self.sites_root.is_none() {
            return Err("--control needs --sites-root".into());
        }
        if let Some(site) = &self.site {
            if !farside_reconf::sites::valid_site_name(site) {
                return Err(format!(
                    "--site {site:?}: 1..={} bytes of [A-Za-z0-9._-], not . or ..",
                    farside_reconf::sites::SITE_NAME_MAX
                ));
            }
        }
        if self.rdma.rdma {
            self.rdma.caps().validate()?;
        }
        self.coop.validate(self.root.is_some())?;
        if let Some(root) = &self.root {
            if !root.is_dir() {
                return Err(format!("--root {} is not a directory", root.display()));
            }
        }
        Ok(())
    }
}

/// State shared by the workers and the [`Handle`].
pub(crate) struct Shared {
    pub(crate) stop: AtomicBool,
    listener: TcpListener,
    /// With `--adopt-socket`: where adopted connections arrive (non-blocking).
    adopt: Option<std::os::unix::net::UnixDatagram>,
    /// The connection each worker is serving, so that stopping can shut it down.
    active: Vec<Mutex<Option<TcpStream>>>,
    pub(crate) config: serve::Config,
}

/// A running in-process back-end. Dropping it stops the server.
pub struct Handle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// The `--control` socket's path and thread.
    control: Option<(PathBuf, JoinHandle<()>)>,
    control_stop: Arc<AtomicBool>,
    /// The `--adopt-socket` path, removed on stop.
    adopt_path: Option<PathBuf>,
    /// With `--coop`: the node's threads.
    coop: Option<coop::node::Running>,
}

impl Handle {
    /// The bound listen address (the real port when `--listen` had port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, shuts down connections in service and joins every worker.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    /// With `--coop`: the node (its counters) and its bound peer address.
    pub fn coop(&self) -> Option<(&Arc<coop::Node>, Option<SocketAddr>)> {
        self.coop.as_ref().map(|r| (&r.node, r.peer_addr))
    }

    /// With `--coop --coop-stats-listen`: the bound stats address.
    pub fn coop_stats_addr(&self) -> Option<SocketAddr> {
        self.coop.as_ref().and_then(|r| r.stats_addr)
    }

    /// The site served now, with `--sites-root`.
    pub fn site(&self) -> Option<String> {
        self.shared
            .config
            .sites
            .as_ref()
            .map(|s| s.current().name.to_string())
    }

    fn stop_and_join(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some((path, thread)) = self.control.take() {
            self.control_stop.store(true, Ordering::SeqCst);
            // Wake the control thread's accept, then remove the socket file.
            let _ = std::os::unix::net::UnixStream::connect(&path);
            let _ = thread.join();
            let _ = std::fs::remove_file(&path);
        }
        // On Linux, shutdown() of a listening socket wakes every thread
        // blocked in accept() on it (accept returns EINVAL).
        // SAFETY: the fd is owned by `shared.listener`, alive for this call.
        unsafe { libc::shutdown(self.shared.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for slot in &self.shared.active {
            if let Some(stream) = slot.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
        if let Some(path) = self.adopt_path.take() {
            let _ = std::fs::remove_file(path);
        }
        if let Some(mut c) = self.coop.take() {
            c.stop();
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if !self.workers.is_empty() || self.control.is_some() || self.coop.is_some() {
            self.stop_and_join();
        }
    }
}

/// Binds the listener and starts the worker pool; returns at once.
pub fn spawn(args: BackendArgs) -> io::Result<(SocketAddr, Handle)> {
    args.validate()
        .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
    let listener = bind_listener(args.listen, args.backlog as i32)?;
    let addr = listener.local_addr()?;
    let mut config = serve::Config::new(&args, addr)?;
    let coop = match (&args.coop.coop, &config.root) {
        (true, Some(root)) => Some(coop::Node::start(&args.coop, root)?),
        _ => None,
    };
    config.coop = coop.as_ref().map(|r| Arc::clone(&r.node));
    let adopt = match &args.adopt_socket {
        Some(path) => {
            // Workers poll both sockets and take items without blocking.
            listener.set_nonblocking(true)?;
            Some(adopt::bind(path)?)
        }
        None => None,
    };
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        listener,
        adopt,
        active: (0..args.workers).map(|_| Mutex::new(None)).collect(),
        config,
    });
    let control_stop = Arc::new(AtomicBool::new(false));
    let control = match (&args.control, &shared.config.sites) {
        (Some(path), Some(sites)) => {
            // A stale socket file from an earlier run would make bind fail.
            let _ = std::fs::remove_file(path);
            let listener = std::os::unix::net::UnixListener::bind(path).map_err(|e| {
                io::Error::new(e.kind(), format!("--control {}: {e}", path.display()))
            })?;
            // Only this user (gatherd runs as the same user, or root) may switch sites.
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            }
            let (sites, stop) = (Arc::clone(sites), Arc::clone(&control_stop));
            let thread = std::thread::Builder::new()
                .name("backend-control".into())
                .spawn(move || sites::control_loop(listener, sites, stop))?;
            Some((path.clone(), thread))
        }
        _ => None,
    };
    let mut workers = Vec::with_capacity(args.workers);
    for index in 0..args.workers {
        let shared = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name(format!("backend-w{index}"))
            // Workers hold a 16 KiB head buffer and a heap body buffer (≤ 1 MiB).
            .stack_size(256 * 1024)
            .spawn(move || worker_loop(&shared, index))?;
        workers.push(worker);
    }
    log::info!(
        "backend listening on {addr} with {} workers, backlog {}",
        args.workers,
        args.backlog
    );
    Ok((
        addr,
        Handle {
            addr,
            shared,
            workers,
            control,
            control_stop,
            adopt_path: args.adopt_socket.clone(),
            coop,
        },
    ))
}

/// Runs the back-end until SIGTERM or SIGINT, then stops it cleanly.
///
/// Sends the bound address on `ready` once listening. Meant for the CLI
/// process: it blocks SIGTERM and SIGINT in the calling thread (and so in the
/// workers it starts) and waits for them with `sigwait`. Call it before other
/// threads exist, or use [`spawn`] to embed a back-end in a larger program.
pub fn run(args: BackendArgs, ready: Option<mpsc::Sender<SocketAddr>>) -> io::Result<()> {
    // SAFETY: plain libc signal-set manipulation on a local sigset_t.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        set
    };
    let (addr, handle) = spawn(args)?;
    if let Some(ready) = ready {
        let _ = ready.send(addr);
    }
    let mut signal: libc::c_int = 0;
    // SAFETY: `set` is initialised above; sigwait writes one int.
    let rc = unsafe { libc::sigwait(&set, &mut signal) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    log::info!("backend {addr}: signal {signal}, stopping");
    handle.stop();
    Ok(())
}

/// Longest a worker polling the listener and the adoption socket sleeps before it
/// checks the stop flag again: a safety net (shutting the listener down wakes it).
const ADOPT_POLL_MAX: Duration = Duration::from_secs(1);

/// The next connection for a worker with `--adopt-socket`: an adopted one if waiting,
/// else an accepted one. `None` when stopping.
fn next_connection(shared: &Shared, adopt: &std::os::unix::net::UnixDatagram) -> Option<TcpStream> {
    while !shared.stop.load(Ordering::SeqCst) {
        let (listen_ready, adopt_ready) = match adopt::wait(
            shared.listener.as_raw_fd(),
            adopt.as_raw_fd(),
            ADOPT_POLL_MAX,
        ) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("backend poll: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if adopt_ready {
            match adopt::recv(adopt) {
                Ok(Some(s)) => return Some(s),
                Ok(None) => {}
                Err(e) => log::warn!("backend adopt: {e}"),
            }
        }
        if listen_ready {
            match shared.listener.accept() {
                Ok((s, _)) => {
                    // Accepted sockets do not inherit O_NONBLOCK on Linux; make sure.
                    let _ = s.set_nonblocking(false);
                    return Some(s);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    if shared.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    log::warn!("backend accept: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
    None
}

fn worker_loop(shared: &Shared, index: usize) {
    // Response bodies: the worker's own buffer, reused across connections.
    let mut body_buf = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        if let Some(adopt) = &shared.adopt {
            let Some(stream) = next_connection(shared, adopt) else {
                break;
            };
            serve_one(shared, index, stream, &mut body_buf);
            continue;
        }
        let stream = match shared.listener.accept() {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                if shared.stop.load(Ordering::SeqCst) {
                    break;
                }
                // EMFILE/ENFILE/ECONNABORTED and friends: back off briefly
                // rather than spin, then keep serving.
                log::warn!("backend accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        serve_one(shared, index, stream, &mut body_buf);
    }
}

fn serve_one(shared: &Shared, index: usize, stream: TcpStream, body_buf: &mut Vec<u8>) {
    if let Ok(clone) = stream.try_clone() {
        *shared.active[index]
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(clone);
    }
    // A stop that raced with accept must still close this connection.
    if !shared.stop.load(Ordering::SeqCst) {
        serve::serve_connection(stream, &shared.config, &shared.stop, body_buf);
    }
    *shared.active[index]
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = None;
}

/// Creates a listening TCP socket with an explicit backlog (std's
/// `TcpListener::bind` always uses 128).
fn bind_listener(addr: SocketAddr, backlog: i32) -> io::Result<TcpListener> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: socket() has no memory-safety preconditions.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: valid fd and a pointer to a c_int of the stated length.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let (sa, len) = farside_rt::sockaddr::to_storage(&addr);
    // SAFETY: `sa` holds a socket address of `len` bytes of the socket's family.
    let rc = unsafe { libc::bind(fd, (&sa as *const libc::sockaddr_storage).cast(), len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: valid bound socket.
    if unsafe { libc::listen(fd, backlog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpListener::from(owned))
}
