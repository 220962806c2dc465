//! The fabric every experiment of the lab runs on: its nodes' processes, the virtual
//! data-center of network namespaces, and waiting for a node to be ready.
//!
//! - [`flags`]: flag values every experiment shares (`--hosts`, `--load`);
//! - [`hostcpu`], [`hostspeed`]: the host's busy CPU time and its speed on a fixed
//!   reference workload (to compare measurements taken at different times);
//! - [`keys`]: a run's cluster keys (random, 0600, outside the results);
//! - [`procs`]: a node's process (spawned, pinned, logged, stopped on drop) and the
//!   interrupt handler that cleans up a run broken by Ctrl-C;
//! - [`netns`]: `--hosts netns`, one network namespace and cgroup per node;
//! - [`quiet`]: point isolation: waiting until a tier holds no load before a point,
//!   and the [`quiet::Start`] every isolated point records;
//! - [`wait_port`]: the one wait for a node to listen, from this process or from a
//!   node of the virtual data-center ([`Vantage`]).

pub mod flags;
pub mod hostcpu;
pub mod hostspeed;
pub mod keys;
pub mod netns;
pub mod procs;
pub mod quiet;

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use netns::VirtualDc;
use procs::Child;

/// Where a readiness check connects from: this process (loopback runs) or a node of
/// the virtual data-center (`--hosts netns`: the clients' node).
#[derive(Clone, Copy)]
pub enum Vantage<'a> {
    /// This process's namespace.
    Here,
    /// Node `.1` of the data-center `.0`.
    Node(&'a VirtualDc, &'a str),
}

impl Vantage<'_> {
    /// Whether `addr` accepts a TCP connection within `connect`, seen from here.
    pub fn accepts(&self, addr: SocketAddr, connect: Duration) -> io::Result<bool> {
        let up = || Ok(TcpStream::connect_timeout(&addr, connect).is_ok());
        match self {
            Vantage::Here => up(),
            Vantage::Node(dc, node) => dc.run_in_ns(node, up),
        }
    }
}

impl Vantage<'_> {
    /// Whether an HTTP server at `addr` answers a `HEAD /` (any status) within
    /// `within`: its workers serve, not only its listener accepts.
    pub fn answers_http(&self, addr: SocketAddr, within: Duration) -> io::Result<bool> {
        let ask = || -> io::Result<bool> {
            use std::io::{Read, Write};
            let Ok(mut s) = TcpStream::connect_timeout(&addr, within) else {
                return Ok(false);
            };
            s.set_read_timeout(Some(within))?;
            s.set_write_timeout(Some(within))?;
            if s.write_all(b"HEAD / HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")
                .is_err()
            {
                return Ok(false);
            }
            let mut head = [0u8; 5];
            Ok(s.read_exact(&mut head).is_ok() && &head == b"HTTP/")
        };
        match self {
            Vantage::Here => ask(),
            Vantage::Node(dc, node) => dc.run_in_ns(node, ask),
        }
    }
}

/// Wait until the HTTP server at `addr` answers ([`Vantage::answers_http`]), seen
/// `from` there, failing early if `child` exits: at most `within`, one request (of at
/// most `poll` x 5) every `poll`. For a server whose listener is bound before its
/// set-up ends (the back-end binds its port, then loads its XDP responder).
pub fn wait_http(
    child: &mut Child,
    addr: SocketAddr,
    from: Vantage<'_>,
    within: Duration,
    poll: Duration,
) -> io::Result<()> {
    child.wait_ready(&format!("answer HTTP on {addr}"), within, poll, || {
        from.answers_http(addr, poll * 5)
    })
}

/// Wait until `addr` accepts TCP connections, seen `from` there, failing early if
/// `child` exits: at most `within`, one connect attempt (of at most `poll` x 5) every
/// `poll`. Every experiment waits for its nodes with this.
pub fn wait_port(
    child: &mut Child,
    addr: SocketAddr,
    from: Vantage<'_>,
    within: Duration,
    poll: Duration,
) -> io::Result<()> {
    child.wait_ready(&format!("listen on {addr}"), within, poll, || {
        from.accepts(addr, poll * 5)
    })
}
