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
