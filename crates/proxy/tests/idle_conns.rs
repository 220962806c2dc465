//! Memory of idle keep-alive client connections (issue 9 item 11): each connection makes
//! one request, so it sits where a real idle keep-alive client does (between requests),
//! then the proxy's resident set is compared with its size before. Ignored by default (it
//! opens tens of thousands of sockets):
//!
//! ```text
//! FARSIDE_IDLE_CONNS=50000 cargo test --release -p farside-proxy --test idle_conns -- --ignored --nocapture
//! ```
//!
//! The clients live in the same process, so the figure also holds their (small) socket
//! handles: an upper bound of the proxy's cost. Clients bind 127.0.0.2, .3, … (20000
//! each) so the 4-tuples do not run out of ephemeral ports; RLIMIT_NOFILE is raised.

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

#[test]
#[ignore = "opens FARSIDE_IDLE_CONNS (default 50000) sockets; run by hand"]
fn memory_per_idle_keep_alive_connection() {
    let n: usize = std::env::var("FARSIDE_IDLE_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    // Two fds per connection here (client and proxy side) plus a few; raise the soft
    // limit to the hard one, and the hard one too where allowed (CAP_SYS_RESOURCE).
    let want = (2 * n + 256) as libc::rlim_t;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: want.max(lim.rlim_max),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        } else {
            lim = raised;
        }
    }
    let cap = (lim.rlim_cur as usize).saturating_sub(256) / 2;
    if n > cap {
        println!(
            "RLIMIT_NOFILE is {} here (hard limit not raisable): measuring {cap} connections, not {n}",
            lim.rlim_cur
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
    let mut clients: Vec<TcpStream> = Vec::with_capacity(n);
    let mut buf = [0u8; 256];
    let mut one = |i: usize| {
        let mut c = connect_from(i, p.addr);
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut got = 0;
        while !buf[..got].ends_with(b"ok") {
            got += c.read(&mut buf[got..]).unwrap();
        }
        c
    };
    for i in 0..64 {
        drop(one(i));
    }
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_bytes();
    let t = Instant::now();
    for i in 0..n {
        clients.push(one(i));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while p.metrics.total(|s| &s.conn_buffer_bytes) != 0 {
        assert!(Instant::now() < deadline, "buffers never released");
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = rss_bytes();
    let per = (after.saturating_sub(before)) as f64 / n as f64;
    println!(
        "{n} idle keep-alive connections (opened in {:.1} s): RSS {} -> {} MiB, {per:.0} bytes per connection",
        t.elapsed().as_secs_f64(),
        before >> 20,
        after >> 20
    );
    assert!(
        per <= 4096.0,
        "{per:.0} bytes per idle connection (target <= 4 KiB)"
    );
    drop(clients);
}
