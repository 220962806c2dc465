//! Memory of idle keep-alive client connections: each connection makes
//! one request, so it sits where a real idle keep-alive client does (between requests),
//! then the proxy's resident set is compared with its size before. Ignored by default (it
//! opens tens of thousands of sockets):
//!
//! ```text
//! FARSIDE_IDLE_CONNS=50000 cargo test --release -p farside-proxy --test idle_conns -- --ignored --nocapture
//! ```
//!
//! The clients live in child processes (the test binary run again as
//! `idle_client_pool_child`, one per 20,000 connections), so the proxy's process holds
//! only its own descriptor per connection and its RSS only the proxy's memory. Clients
//! bind 127.0.0.2, .3, … (20000 each) so the 4-tuples do not run out of ephemeral
//! ports; RLIMIT_NOFILE is raised (the hard limit only with CAP_SYS_RESOURCE).

use farside_proxy::config::{BackendConfig, ProxyConfig};
use farside_proxy::gate::{Gate, InflightGuard, Reject, Route};
use farside_proxy::server;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Client connections per source address (below the ~28k ephemeral ports).
const CONNS_PER_SOURCE_IP: usize = 20_000;

struct One(SocketAddr, Arc<AtomicU64>);

impl Gate for One {
    fn on_accept(&self, _peer: SocketAddr) -> Result<(), Reject> {
        Ok(())
    }
    fn route(&self, _host: Option<&str>) -> Result<Route, Reject> {
        Ok(Route {
            backend: 0,
            addr: self.0,
            guard: InflightGuard::new(self.1.clone()),
            reuse_only: false,
        })
    }
}

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A keep-alive upstream answering every request `ok`.
fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut c = c;
                let mut buf = vec![0u8; 4096];
                let mut have = Vec::new();
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => have.extend_from_slice(&buf[..n]),
                    }
                    while let Some(i) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                        have.drain(..i + 4);
                        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if c.write_all(r).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

fn connect_from(i: usize, to: SocketAddr) -> TcpStream {
    let src = std::net::Ipv4Addr::new(127, 0, 0, 2 + (i / CONNS_PER_SOURCE_IP) as u8);
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from((src, 0))).unwrap();
    let fd = {
        use std::os::fd::{FromRawFd, IntoRawFd};
        let raw = s.into_raw_fd();
        // SAFETY: `raw` was just released by the socket above and is owned here.
        unsafe { std::net::TcpStream::from_raw_fd(raw) }
    };
    // Blocking connect on the bound socket via libc (std has no bind-then-connect).
    fd.set_nonblocking(false).unwrap();
    let sa = match to {
        SocketAddr::V4(a) => libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*a.ip()).to_be(),
            },
            sin_zero: [0; 8],
        },
        SocketAddr::V6(_) => panic!("v4 only"),
    };
    use std::os::fd::AsRawFd;
    // SAFETY: `sa` is a valid sockaddr_in of the length given; the fd is open.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
    fd
}

/// Environment of a client-pool child (see [`idle_client_pool_child`]): the proxy's
/// address, how many connections, and the index of the first (for its source address).
const CHILD_ADDR: &str = "FARSIDE_IDLE_CHILD_ADDR";
const CHILD_N: &str = "FARSIDE_IDLE_CHILD_N";
const CHILD_FIRST: &str = "FARSIDE_IDLE_CHILD_FIRST";
/// The line a child prints when all its connections are idle.
const CHILD_READY: &str = "FARSIDE_IDLE_CHILD_READY";
/// File descriptors kept free for everything else (listeners, pipes, the runtime).
const FDS_SPARE: usize = 256;

/// Raises the soft RLIMIT_NOFILE to `want` (and the hard one where allowed:
/// CAP_SYS_RESOURCE), else to the hard limit. Returns the soft limit now in force.
fn raise_nofile(want: usize) -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        let raised = libc::rlimit {
            rlim_cur: want as libc::rlim_t,
            rlim_max: (want as libc::rlim_t).max(lim.rlim_max),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        } else {
            lim = raised;
        }
    }
    lim.rlim_cur as usize
}

/// One keep-alive request on a fresh connection from client `i`; the connection is
/// returned idle (its response read).
fn one_request(i: usize, to: SocketAddr) -> TcpStream {
    let mut c = connect_from(i, to);
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 256];
    let mut got = 0;
    while !buf[..got].ends_with(b"ok") {
        let n = c.read(&mut buf[got..]).unwrap();
        assert!(n > 0, "proxy closed client {i}");
        got += n;
    }
    c
}

/// Not a test of its own: the client side of [`memory_per_idle_keep_alive_connection`],
/// run in a child process (the test binary again) so that the clients' descriptors do
/// not count against the proxy's process limit and their memory is not in its RSS.
/// Without its environment it returns at once.
#[test]
#[ignore = "client pool of memory_per_idle_keep_alive_connection (a child process)"]
fn idle_client_pool_child() {
    let (Ok(addr), Ok(n), Ok(first)) = (
        std::env::var(CHILD_ADDR),
        std::env::var(CHILD_N),
        std::env::var(CHILD_FIRST),
    ) else {
        return;
    };
    let addr: SocketAddr = addr.parse().unwrap();
    let n: usize = n.parse().unwrap();
    let first: usize = first.parse().unwrap();
    raise_nofile(n + FDS_SPARE);
    let clients: Vec<TcpStream> = (first..first + n).map(|i| one_request(i, addr)).collect();
    println!("{CHILD_READY} {}", clients.len());
    // Idle until the parent closes our stdin.
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(clients);
}

/// A child process holding `n` idle client connections from client index `first` on,
/// and the read end of its stdout (kept open until it exits, so its last lines do not
/// meet a closed pipe).
struct ClientPool(
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
);

impl ClientPool {
    fn start(to: SocketAddr, first: usize, n: usize) -> ClientPool {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "idle_client_pool_child",
                "--nocapture",
            ])
            .env(CHILD_ADDR, to.to_string())
            .env(CHILD_N, n.to_string())
            .env(CHILD_FIRST, first.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while out.read_line(&mut line).unwrap() > 0 {
            if let Some(k) = line.trim_end().strip_prefix(CHILD_READY) {
                assert_eq!(k.trim(), n.to_string(), "child opened {k} of {n}");
                return ClientPool(child, out);
            }
            line.clear();
        }
        panic!(
            "client pool child exited before {CHILD_READY}: {:?}",
            child.wait()
        );
    }
}

impl Drop for ClientPool {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let mut rest = Vec::new();
        let _ = self.1.read_to_end(&mut rest);
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "opens FARSIDE_IDLE_CONNS (default 50000) sockets; run by hand"]
fn memory_per_idle_keep_alive_connection() {
    let n: usize = std::env::var("FARSIDE_IDLE_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    // The proxy holds one descriptor per client connection (the clients are in child
    // processes, one per CONNS_PER_SOURCE_IP, each with its own limit).
    let cap = raise_nofile(n + FDS_SPARE).saturating_sub(FDS_SPARE);
    if n > cap {
        println!(
            "RLIMIT_NOFILE allows {} descriptors here (hard limit not raisable): measuring {cap} connections, not {n}",
            cap + FDS_SPARE
        );
    }
    let n = n.min(cap);
    let up = upstream();
    let mut cfg = ProxyConfig::simple(
        "127.0.0.1:0".parse().unwrap(),
        vec![BackendConfig {
            addr: up,
            site: String::new(),
            region: None,
            limit: None,
            maxconn: None,
        }],
    );
    cfg.http.max_client_conns = n + 16;
    cfg.http.idle_timeout_ms = 600_000;
    let p = server::spawn(cfg, Arc::new(One(up, Arc::default()))).unwrap();
    // Warm up allocator and runtime with a few connections first.
    for i in 0..64 {
        drop(one_request(i, p.addr));
    }
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_bytes();
    let t = Instant::now();
    let pools: Vec<ClientPool> = (0..n)
        .step_by(CONNS_PER_SOURCE_IP)
        .map(|first| ClientPool::start(p.addr, first, CONNS_PER_SOURCE_IP.min(n - first)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while p.metrics.total(|s| &s.conn_buffer_bytes) != 0 {
        assert!(Instant::now() < deadline, "buffers never released");
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = rss_bytes();
    let per = (after.saturating_sub(before)) as f64 / n as f64;
    println!(
        "{n} idle keep-alive connections (opened in {:.1} s, clients in {} child processes): RSS {} -> {} MiB, {per:.0} bytes per connection",
        t.elapsed().as_secs_f64(),
        pools.len(),
        before >> 20,
        after >> 20
    );
    assert!(
        per <= 4096.0,
        "{per:.0} bytes per idle connection (target <= 4 KiB)"
    );
    drop(pools);
}
