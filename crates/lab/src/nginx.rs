//! Real nginx as a lab back-end: an unmodified web server, as the papers use.
//!
//! [`Nginx::start`] writes a config into a fresh temp prefix directory and
//! runs `nginx -p DIR -c DIR/nginx.conf -e DIR/error.log -g 'daemon off;'` as a
//! child in its own process group, then waits (bounded by
//! [`NginxConfig::start_timeout`], polling every [`START_POLL`]) until the
//! listen port accepts. Dropping the handle stops nginx (SIGTERM, then
//! SIGKILL to the whole group after [`STOP_GRACE`]), reaps it and removes the
//! prefix directory.
//!
//! Everything nginx writes lives in the prefix directory (pid, error log,
//! temp paths), so it runs as root and as an ordinary user alike; as root
//! the workers stay root (`user root;`) so they can read any docroot.

use std::io::{self, Read as _};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Interval between connect attempts while waiting for nginx to listen.
pub const START_POLL: Duration = Duration::from_millis(10);
/// How long nginx gets to exit after SIGTERM before the group is SIGKILLed.
/// A fast shutdown takes a few ms; 2 s covers a loaded machine.
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// Bytes of `error.log` quoted in a start error.
const ERROR_TAIL_BYTES: u64 = 2048;
/// Where nginx is looked for when it is not on PATH (PATH often lacks sbin
/// for non-root users).
const FALLBACK_PATHS: [&str; 3] = [
    "/usr/sbin/nginx",
    "/usr/local/sbin/nginx",
    "/usr/local/nginx/sbin/nginx",
];

/// How to run one nginx instance. Build with [`NginxConfig::new`].
#[derive(Clone, Debug)]
pub struct NginxConfig {
    /// Address and port to listen on. Use [`free_port`] for the port.
    pub listen: SocketAddr,
    /// Directory served as `root`.
    pub docroot: PathBuf,
    /// `worker_processes`. Default 1.
    pub worker_processes: u32,
    /// `worker_connections` per worker. Default 1024.
    pub worker_connections: u32,
    /// `keepalive_requests`: requests per kept-alive connection. Default 1000.
    pub keepalive_requests: u32,
    /// `keepalive_timeout`, seconds. Default 65 (nginx's default).
    pub keepalive_timeout_s: u32,
    /// `backlog=` on `listen`: accept queue length. Default 511 (nginx's
    /// default; the kernel caps it at `net.core.somaxconn`).
    pub backlog: u32,
    /// Bound on waiting for the port to accept. Default 5 s.
    pub start_timeout: Duration,
    /// The nginx binary; `None` looks it up ([`find_binary`]).
    pub binary: Option<PathBuf>,
    /// CPUs nginx may run on (`sched_setaffinity`). Default: all.
    pub cpus: Option<Vec<usize>>,
}

impl NginxConfig {
    /// Defaults for everything but the listen address and docroot.
    pub fn new(listen: SocketAddr, docroot: impl Into<PathBuf>) -> NginxConfig {
        NginxConfig {
            listen,
            docroot: docroot.into(),
            worker_processes: 1,
            worker_connections: 1024,
            keepalive_requests: 1000,
            keepalive_timeout_s: 65,
            backlog: 511,
            start_timeout: Duration::from_secs(5),
            binary: None,
            cpus: None,
        }
    }

    /// Checks the values nginx would reject less clearly.
    pub fn validate(&self) -> io::Result<()> {
        let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
        if self.listen.port() == 0 {
            return bad("nginx: listen port 0; pick one with free_port()".into());
        }
        if self.worker_processes == 0 || self.worker_connections == 0 || self.backlog == 0 {
            return bad(
                "nginx: worker_processes, worker_connections and backlog must be > 0".into(),
            );
        }
        if !self.docroot.is_dir() {
            return bad(format!(
                "nginx: docroot {} is not a directory",
                self.docroot.display()
            ));
        }
        Ok(())
    }

    /// The `nginx.conf` text for prefix directory `prefix`.
    pub fn render(&self, prefix: &Path, as_root: bool, modules: &Modules) -> String {
        let p = prefix.display();
        let docroot = self
            .docroot
            .canonicalize()
            .unwrap_or_else(|_| self.docroot.clone());
        let listen = match self.listen {
            SocketAddr::V4(a) => a.to_string(),
            SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
        };
        let mut temp_paths = format!(
            "    client_body_temp_path {p}/tmp/body;\n    proxy_temp_path {p}/tmp/proxy;\n"
        );
        for (on, name) in [
            (modules.fastcgi, "fastcgi"),
            (modules.uwsgi, "uwsgi"),
            (modules.scgi, "scgi"),
        ] {
            if on {
                temp_paths.push_str(&format!("    {name}_temp_path {p}/tmp/{name};\n"));
            }
        }
        format!(
            "# Generated by farside lab; runs with -g 'daemon off;'.\n\
             {user}worker_processes {wp};\n\
             pid {p}/nginx.pid;\n\
             error_log {p}/error.log warn;\n\
             events {{\n    worker_connections {wc};\n}}\n\
             http {{\n\
             \x20   access_log off;\n\
             \x20   sendfile on;\n\
             \x20   tcp_nopush on;\n\
             \x20   keepalive_requests {kr};\n\
             \x20   keepalive_timeout {kt};\n\
             \x20   default_type application/octet-stream;\n\
             \x20   types {{ text/html html; text/plain txt; image/jpeg jpg; image/gif gif; }}\n\
             {temp_paths}\
             \x20   server {{\n\
             \x20       listen {listen} backlog={bl};\n\
             \x20       root {root};\n\
             \x20       location / {{ }}\n\
             \x20   }}\n\
             }}\n",
            user = if as_root { "user root;\n" } else { "" },
            wp = self.worker_processes,
            wc = self.worker_connections,
            kr = self.keepalive_requests,
            kt = self.keepalive_timeout_s,
            bl = self.backlog,
            root = docroot.display(),
        )
    }
}

/// Optional nginx modules whose directives the config uses only when built in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Modules {
    /// `fastcgi_temp_path` is available.
    pub fastcgi: bool,
    /// `uwsgi_temp_path` is available.
    pub uwsgi: bool,
    /// `scgi_temp_path` is available.
    pub scgi: bool,
}

impl Modules {
    /// Reads `nginx -V` configure arguments (`--without-http_uwsgi_module`, ...).
    pub fn detect(binary: &Path) -> Modules {
        let v = Command::new(binary)
            .arg("-V")
            .stdin(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
            .unwrap_or_default();
        Modules {
            fastcgi: !v.contains("--without-http_fastcgi_module"),
            uwsgi: !v.contains("--without-http_uwsgi_module"),
            scgi: !v.contains("--without-http_scgi_module"),
        }
    }
}

/// A running nginx. Dropping it stops nginx and removes its prefix directory.
#[derive(Debug)]
pub struct Nginx {
    child: Option<Child>,
    prefix: PathBuf,
    listen: SocketAddr,
}

impl Nginx {
    /// Starts nginx and returns once `cfg.listen` accepts connections.
    ///
    /// Readiness is "something accepts on the port": if another process
    /// already listens there, this returns early and nginx exits later
    /// (its bind retries for 2.5 s). Give it a port from [`free_port`].
    ///
    /// Errors: nginx not installed (`NotFound`, with the install hint), bad
    /// config values (`InvalidInput`), nginx exiting or not listening within
    /// `cfg.start_timeout` (with the tail of its error log).
    pub fn start(cfg: &NginxConfig) -> io::Result<Nginx> {
        Self::start_with(
            cfg,
            |_| Ok(()),
            |addr| TcpStream::connect_timeout(&addr, START_POLL).is_ok(),
        )
    }

    /// Like [`Nginx::start`], with `place` preparing the command before spawn (e.g. a lab
    /// node's namespace and cgroup hooks) and `probe` telling whether `listen` accepts
    /// (e.g. connecting from inside another node).
    pub fn start_with(
        cfg: &NginxConfig,
        place: impl FnOnce(&mut Command) -> io::Result<()>,
        probe: impl Fn(SocketAddr) -> bool,
    ) -> io::Result<Nginx> {
        cfg.validate()?;
        let binary = match &cfg.binary {
            Some(b) => b.clone(),
            None => find_binary()?,
        };
        let prefix = make_prefix_dir()?;
        // From here on, `guard` removes the prefix (and stops nginx) on any error.
        let mut guard = Nginx {
            child: None,
            prefix: prefix.clone(),
            listen: cfg.listen,
        };
        std::fs::create_dir_all(prefix.join("tmp"))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let as_root = unsafe { libc::geteuid() } == 0;
        let conf = prefix.join("nginx.conf");
        std::fs::write(
            &conf,
            cfg.render(&prefix, as_root, &Modules::detect(&binary)),
        )?;
        let stderr = std::fs::File::create(prefix.join("stderr.log"))?;
        let mut cmd = Command::new(&binary);
        let set = cfg.cpus.as_deref().map(crate::fabric::procs::cpu_set);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                crate::fabric::procs::reset_signal_mask();
                if let Some(set) = &set {
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        place(&mut cmd)?;
        let child = cmd
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(prefix.join("error.log"))
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            // Own process group: Drop can signal master and workers together.
            .process_group(0)
            .spawn()
            .map_err(|e| {
                io::Error::new(e.kind(), format!("nginx: spawn {}: {e}", binary.display()))
            })?;
        guard.child = Some(child);

        let deadline = Instant::now() + cfg.start_timeout;
        let addr = connect_addr(cfg.listen);
        loop {
            if let Some(status) = guard
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                guard.child = None;
                return Err(crate::error::LabError::NginxExited {
                    status,
                    log_tail: guard.log_tail(),
                }
                .into());
            }
            if probe(addr) {
                return Ok(guard);
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "nginx did not accept on {} within {:?}; {}",
                        cfg.listen,
                        cfg.start_timeout,
                        guard.log_tail()
                    ),
                ));
            }
            std::thread::sleep(START_POLL);
        }
    }

    /// The address nginx listens on.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Process id of the nginx master.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The temp prefix directory (config, error.log, pid file, temp paths).
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The last bytes of `error.log` and nginx's stderr, for error messages.
    pub fn log_tail(&self) -> String {
        let mut parts = Vec::new();
        for name in ["error.log", "stderr.log"] {
            let t = tail(&self.prefix.join(name), ERROR_TAIL_BYTES);
            if !t.trim().is_empty() {
                parts.push(format!("{name}: {}", t.trim_end()));
            }
        }
        if parts.is_empty() {
            "error.log is empty".to_string()
        } else {
            parts.join("\n")
        }
    }

    /// Stops nginx now (what Drop does), reporting a failure to reap it.
    pub fn stop(mut self) -> io::Result<()> {
        self.stop_child()
    }

    fn stop_child(&mut self) -> io::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = child.id() as libc::pid_t;
        // SAFETY: signalling our own child, which is not reaped yet (so the pid
        // cannot have been reused); errors are reported through the return value.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            if child.try_wait()?.is_some() {
                break;
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(START_POLL);
        }
        // SIGKILL the whole group: the master if it ignored SIGTERM, and any
        // worker orphaned by it. The group id is the master's pid
        // (process_group(0)); the group is ours alone.
        // SAFETY: as above; ESRCH (group already gone) is fine.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        child.wait()?;
        Ok(())
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Err(e) = self.stop_child() {
            log::warn!("nginx: stopping: {e}");
        }
        let _ = std::fs::remove_dir_all(&self.prefix);
    }
}

/// The nginx binary: the first `nginx` on PATH, else a usual sbin location.
pub fn find_binary() -> io::Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nginx"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(FALLBACK_PATHS.iter().map(PathBuf::from))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "nginx not found: apt-get install nginx-light",
            )
        })
}

/// `nginx -v` output, e.g. `"nginx/1.22.1"`; `None` when nginx is absent.
pub fn version() -> Option<String> {
    let out = Command::new(find_binary().ok()?)
        .arg("-v")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    // nginx prints "nginx version: nginx/1.22.1" on stderr.
    let text = String::from_utf8_lossy(&out.stderr);
    let line = text.lines().next()?.trim();
    Some(
        line.strip_prefix("nginx version: ")
            .unwrap_or(line)
            .to_string(),
    )
}

/// A port on `ip` that was free a moment ago: binds port 0 and releases it.
/// Another process may take it before the caller binds; retry on `AddrInUse`.
pub fn free_port(ip: IpAddr) -> io::Result<u16> {
    Ok(TcpListener::bind((ip, 0))?.local_addr()?.port())
}

/// Where to connect to reach a listener on `addr` (unspecified → loopback).
fn connect_addr(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::from(([127, 0, 0, 1], addr.port())),
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, addr.port()))
        }
        _ => addr,
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A fresh, private directory under the system temp dir.
fn make_prefix_dir() -> io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "farside-nginx-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    // create_dir (not _all) fails if it exists: never reuse someone's directory.
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

/// The last `max` bytes of a file, lossily decoded ("" if unreadable).
fn tail(path: &Path, max: u64) -> String {
    use std::io::{Seek as _, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// A caching reverse proxy's `nginx.conf` (`lab coop`'s anchor): nginx listening on
/// `listen`, every request passed to `upstream` (kept-alive connections) through a
/// `proxy_cache` of at most `cache_bytes` under `prefix/cache` (nginx's cache manager
/// evicts the least recently used files above it), concurrent misses of one URL
/// collapsed into one upstream request (`proxy_cache_lock`). Each response says
/// `X-Cache: HIT|MISS|...`. Run it as [`Nginx`] runs its config: `-p prefix`.
pub fn proxy_cache_conf(
    prefix: &Path,
    listen: SocketAddr,
    upstream: SocketAddr,
    cache_bytes: u64,
    as_root: bool,
    modules: &Modules,
) -> String {
    let p = prefix.display();
    let mut temp_paths =
        format!("    client_body_temp_path {p}/tmp/body;\n    proxy_temp_path {p}/tmp/proxy;\n");
    for (on, name) in [
        (modules.fastcgi, "fastcgi"),
        (modules.uwsgi, "uwsgi"),
        (modules.scgi, "scgi"),
    ] {
        if on {
            temp_paths.push_str(&format!("    {name}_temp_path {p}/tmp/{name};\n"));
        }
    }
    format!(
        "# Generated by farside lab coop (system haproxy: nginx proxy_cache).\n\
         {user}worker_processes 1;\n\
         pid {p}/nginx.pid;\n\
         error_log {p}/error.log warn;\n\
         events {{\n    worker_connections 4096;\n}}\n\
         http {{\n\
         \x20   access_log off;\n\
         \x20   keepalive_requests 100000;\n\
         \x20   default_type application/octet-stream;\n\
         {temp_paths}\
         \x20   proxy_cache_path {p}/cache levels=1:2 keys_zone=objects:{zone}m max_size={cache_bytes} manager_files={files} manager_sleep={sleep}ms manager_threshold={threshold}ms inactive={inactive}s use_temp_path=off;\n\
         \x20   upstream origin {{\n\
         \x20       server {upstream};\n\
         \x20       keepalive 16;\n\
         \x20   }}\n\
         \x20   server {{\n\
         \x20       listen {listen} backlog=511;\n\
         \x20       location / {{\n\
         \x20           proxy_pass http://origin;\n\
         \x20           proxy_http_version 1.1;\n\
         \x20           proxy_set_header Connection \"\";\n\
         \x20           proxy_cache objects;\n\
         \x20           proxy_cache_valid 200 1d;\n\
         \x20           proxy_cache_lock on;\n\
         \x20           add_header X-Cache $upstream_cache_status;\n\
         \x20       }}\n\
         \x20   }}\n\
         }}\n",
        user = if as_root { "user root;\n" } else { "" },
        zone = PROXY_CACHE_ZONE_MB,
        files = PROXY_CACHE_MANAGER_FILES,
        sleep = PROXY_CACHE_MANAGER_SLEEP_MS,
        threshold = PROXY_CACHE_MANAGER_THRESHOLD_MS,
        inactive = PROXY_CACHE_INACTIVE_S,
    )
}

/// nginx's cache manager, which alone holds the cache to `max_size`: when it wakes it
/// deletes the entries unused for `inactive`, then least recently used files while the
/// size (counted in the file system's blocks) is over `max_size`, at most
/// `manager_files` per sweep and for at most `manager_threshold`. But when it finds the
/// cache under `max_size` it sleeps until the least recently used entry turns inactive
/// (at most an hour), not `manager_sleep`: with the lab's former `inactive=1d` it found
/// the empty cache at start and did not wake again during a point, and each cache grew
/// to every object it was asked for (11 MB per node against 1.7 MB in a `--quick` run).
/// So `inactive` bounds how long the cache may run over ([`PROXY_CACHE_INACTIVE_S`]);
/// while over, a sweep runs every [`PROXY_CACHE_MANAGER_SLEEP_MS`] and may delete a
/// whole cache's worth of files ([`PROXY_CACHE_MANAGER_FILES`]).
pub const PROXY_CACHE_BOUND_RULE: &str = "max_size = the cache bytes, counted by nginx in \
allocated blocks; inactive=1s so the cache manager wakes at least every second (under \
max_size it sleeps until the least recently used entry turns inactive); while over, a \
sweep every 10 ms, up to 10000 files and 100 ms each";
/// `inactive`, seconds: the longest the cache manager sleeps while the cache is under
/// `max_size`, hence the longest the cache can run over it (by that second's misses).
/// Its cost: an object unused for this long is deleted even from a cache with room. 1 s,
/// nginx's smallest: at the lab's thousands of requests per second the hot set is asked
/// for far more often.
pub const PROXY_CACHE_INACTIVE_S: u32 = 1;
/// Files nginx's cache manager may delete in one sweep: more than the World Cup
/// sample's 2,730 URLs, so one sweep can always bring the cache under `max_size`.
pub const PROXY_CACHE_MANAGER_FILES: u32 = 10_000;
/// Pause between the cache manager's sweeps, ms (nginx's default 50).
pub const PROXY_CACHE_MANAGER_SLEEP_MS: u32 = 10;
/// Longest sweep, ms (nginx's default 200): deleting a few thousand small files takes
/// far less.
pub const PROXY_CACHE_MANAGER_THRESHOLD_MS: u32 = 100;

/// Size of the proxy cache's key zone, MB: nginx keeps ~8,000 keys per MB, so 4 MB
/// holds 32,000 objects, ten times the World Cup sample's 2,730 URLs.
pub const PROXY_CACHE_ZONE_MB: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::net::Ipv4Addr;

    const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn docroot(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("farside-nginx-doc-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Sends one HTTP/1.0 GET and returns the whole response.
    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: lab\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_a_static_file_and_cleans_up_on_drop() {
        if let Err(e) = find_binary() {
            farside_testkit::skip("serves_a_static_file_and_cleans_up_on_drop", &e.to_string());
            return;
        }
        let doc = docroot("serve");
        let body = "x".repeat(16 * 1024);
        std::fs::write(doc.join("16k.html"), &body).unwrap();
        let port = free_port(LOOPBACK).unwrap();
        let mut cfg = NginxConfig::new(SocketAddr::new(LOOPBACK, port), &doc);
        cfg.worker_processes = 2;
        cfg.backlog = 64;
        let nginx = Nginx::start(&cfg).unwrap();
        let prefix = nginx.prefix().to_path_buf();
        let conf = std::fs::read_to_string(prefix.join("nginx.conf")).unwrap();
        assert!(
            conf.contains(&format!("listen 127.0.0.1:{port} backlog=64;")),
            "{conf}"
        );

        let resp = get(nginx.addr(), "/16k.html");
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp:.200}");
        assert!(resp.ends_with(&body));
        let resp = get(nginx.addr(), "/missing");
        assert!(resp.starts_with("HTTP/1.1 404"), "{resp:.200}");

        let pid = nginx.pid().unwrap() as libc::pid_t;
        drop(nginx);
        assert!(!prefix.exists(), "prefix dir left behind");
        // The process group is gone: no master, no orphaned worker.
        // SAFETY: signal 0 only checks for existence.
        let alive = unsafe { libc::kill(-pid, 0) } == 0;
        assert!(!alive, "nginx group {pid} still alive");
        assert!(TcpStream::connect(SocketAddr::new(LOOPBACK, port)).is_err());
        let _ = std::fs::remove_dir_all(&doc);
    }

    #[test]
    fn a_start_failure_quotes_the_error_log() {
        if let Err(e) = find_binary() {
            farside_testkit::skip("a_start_failure_quotes_the_error_log", &e.to_string());
            return;
        }
        let doc = docroot("busy");
        // TEST-NET-1 is on no interface: bind fails with EADDRNOTAVAIL, which
        // nginx does not retry (it retries EADDRINUSE for 2.5 s).
        let addr = SocketAddr::from(([192, 0, 2, 1], 8080));
        let t0 = Instant::now();
        let err = Nginx::start(&NginxConfig::new(addr, &doc))
            .unwrap_err()
            .to_string();
        assert!(err.contains("exited during start"), "{err}");
        assert!(err.contains("Cannot assign requested address"), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        let _ = std::fs::remove_dir_all(&doc);
    }

    #[test]
    fn config_is_validated_and_version_is_reported() {
        let doc = docroot("cfg");
        let cfg = NginxConfig::new(SocketAddr::new(LOOPBACK, 0), &doc);
        assert_eq!(
            cfg.validate().unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let cfg = NginxConfig::new(SocketAddr::new(LOOPBACK, 8080), doc.join("nope"));
        assert!(cfg.validate().unwrap_err().to_string().contains("docroot"));
        if find_binary().is_ok() {
            assert!(version().unwrap().starts_with("nginx/"), "{:?}", version());
        }
        let all = Modules {
            fastcgi: true,
            uwsgi: true,
            scgi: true,
        };
        let none = Modules {
            fastcgi: false,
            uwsgi: false,
            scgi: false,
        };
        let cfg = NginxConfig::new(SocketAddr::new(LOOPBACK, 8080), &doc);
        let c = cfg.render(Path::new("/p"), true, &all);
        assert!(
            c.starts_with("# Generated")
                && c.contains("user root;")
                && c.contains("uwsgi_temp_path /p/tmp/uwsgi;")
        );
        let c = cfg.render(Path::new("/p"), false, &none);
        assert!(!c.contains("user ") && !c.contains("uwsgi"));
        let _ = std::fs::remove_dir_all(&doc);
    }
}
