//! Point isolation: every point of a sweep starts from an empty system, checked and
//! recorded, so that no point inherits the load the previous one left (an open loop
//! past capacity leaves thousands of connections queued at the back-ends, which the
//! next point's clients would otherwise wait behind).
//!
//! What "empty" means is measured on the tier's listening ports with the kernel's own
//! socket tables (`/proc/thread-self/net/tcp{,6}`, the data `ss` and `sock_diag` show,
//! read in the node's network namespace), the same way for every proxy
//! (farside's or HAProxy) and every back-end (farside's server or nginx):
//!
//! - a **front** port (a proxy's listener, where clients connect): its accept queue is
//!   empty and no connection to it is open in any state but TIME-WAIT: every client
//!   connection of the last point is closed (the load generator abandoned its
//!   outstanding requests) and the proxy let go of each one (a proxy still waiting on a
//!   back-end for a client that left keeps the socket in CLOSE-WAIT);
//! - a **back** port (a back-end's listener): its accept queue is empty and no
//!   connection carries a request: none has unread or unsent bytes, none is in
//!   CLOSE-WAIT (a request whose proxy gave up, still owed work) or in a handshake.
//!   Idle kept-alive connections (a proxy's upstream pool) carry no request: they are
//!   counted (`start_conns`), not waited for.
//!
//! [`wait_quiet`] polls these until every port is quiet ([`QUIET_CONFIRM`] samples in a
//! row) or its bound passes; [`Start`] is what a point records of it (in `points.jsonl`,
//! beside the point: [`crate::sweep::Record::start`]). An experiment whose tier can hold
//! load across points plugs in with [`crate::sweep::Sweep::run_isolated`]: its point
//! function settles the tier first (waits within the experiment's named bound, restarts
//! the tier when it does not drain, waits again) and returns the [`Start`] with the
//! point; the sweep prints it, warns and notes a point that did not start empty.

use super::netns::VirtualDc;
use serde::{Deserialize, Serialize};
use std::io;
use std::time::{Duration, Instant};

/// Poll period while waiting for quiet: short against the bounds (seconds), long
/// against the cost of one sample (reading the node's socket table, ~1 ms).
pub const QUIET_POLL: Duration = Duration::from_millis(20);

/// Consecutive quiet samples that make a port set quiet: two, so that a sample taken in
/// the instant between a connection's close and the next one's arrival does not count.
pub const QUIET_CONFIRM: u32 = 2;

/// Most sockets counted on one port in one sample: a listener's accept queue is bounded
/// by its backlog (the lab's deepest is 2048) and a tier's connections by its clients
/// (a few thousand); a table with more is reported as an error, never truncated.
pub const SOCKETS_PER_PORT_MAX: u64 = 1 << 20;

/// Which side of the tier a watched port is on (what quiet means there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Where clients connect (a proxy, a front-end): no connection may be open.
    Front,
    /// A back-end's listener: no connection may carry a request.
    Back,
}

/// One listening port of the tier and where its sockets live.
#[derive(Clone, Debug)]
pub struct Watched {
    /// The node of the virtual data-center whose namespace holds the port (`None`: this
    /// process's namespace, the loopback lab).
    pub node: Option<String>,
    /// The listening TCP port.
    pub port: u16,
    pub side: Side,
}

impl Watched {
    /// Port `port` on `side`, in `node`'s namespace (`None`: here).
    pub fn new(node: Option<String>, port: u16, side: Side) -> Watched {
        Watched { node, port, side }
    }
}

/// What one port held at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortLoad {
    /// Connections waiting in the listener's accept queue.
    pub backlog: u64,
    /// Connections on the port in any state but LISTEN and TIME-WAIT.
    pub conns: u64,
    /// Of those, the ones carrying a request (see the module docs): unread or unsent
    /// bytes, CLOSE-WAIT, SYN-RECV.
    pub busy: u64,
}

impl PortLoad {
    fn add(&mut self, o: PortLoad) {
        self.backlog += o.backlog;
        self.conns += o.conns;
        self.busy += o.busy;
    }

    /// Whether the port is quiet for its side.
    pub fn quiet(&self, side: Side) -> bool {
        self.backlog == 0
            && match side {
                Side::Front => self.conns == 0,
                Side::Back => self.busy == 0,
            }
    }
}

/// TCP states of `/proc/net/tcp` (`include/net/tcp_states.h`).
const ST_ESTABLISHED: u8 = 0x01;
const ST_SYN_RECV: u8 = 0x03;
const ST_FIN_WAIT1: u8 = 0x04;
const ST_TIME_WAIT: u8 = 0x06;
const ST_CLOSE_WAIT: u8 = 0x08;
const ST_LISTEN: u8 = 0x0A;

/// The load on local port `port` in a `/proc/net/tcp` (or `tcp6`) text. For a LISTEN
/// socket the kernel reports its accept queue as `rx_queue`; for a connection, its
/// unread (`rx_queue`) and unsent or unacknowledged (`tx_queue`) bytes.
pub fn port_load_of(table: &str, port: u16) -> io::Result<PortLoad> {
    let bad = |l: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("socket table: cannot parse `{l}`"),
        )
    };
    let mut p = PortLoad::default();
    for line in table.lines().skip(1) {
        let mut f = line.split_whitespace();
        let (Some(_sl), Some(local), Some(_remote), Some(st), Some(queues)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            if line.trim().is_empty() {
                continue;
            }
            return Err(bad(line));
        };
        let lport = local
            .rsplit_once(':')
            .and_then(|(_, h)| u16::from_str_radix(h, 16).ok())
            .ok_or_else(|| bad(line))?;
        if lport != port {
            continue;
        }
        let st = u8::from_str_radix(st, 16).map_err(|_| bad(line))?;
        let (tx, rx) = queues
            .split_once(':')
            .and_then(|(t, r)| {
                Some((
                    u64::from_str_radix(t, 16).ok()?,
                    u64::from_str_radix(r, 16).ok()?,
                ))
            })
            .ok_or_else(|| bad(line))?;
        match st {
            ST_LISTEN => p.backlog += rx,
            ST_TIME_WAIT => {}
            _ => {
                p.conns += 1;
                let carrying = match st {
                    ST_SYN_RECV | ST_CLOSE_WAIT => true,
                    ST_ESTABLISHED | ST_FIN_WAIT1 => rx > 0 || tx > 0,
                    _ => false,
                };
                if carrying {
                    p.busy += 1;
                }
            }
        }
        if p.conns + p.backlog > SOCKETS_PER_PORT_MAX {
            return Err(io::Error::other(format!(
                "port {port}: more than {SOCKETS_PER_PORT_MAX} sockets"
            )));
        }
    }
    Ok(p)
}

/// The load on local port `port` in the calling thread's network namespace.
fn port_load_here(port: u16) -> io::Result<PortLoad> {
    let mut p = PortLoad::default();
    for f in ["tcp", "tcp6"] {
        let path = format!("/proc/thread-self/net/{f}");
        match std::fs::read_to_string(&path) {
            Ok(t) => p.add(port_load_of(&t, port)?),
            // A kernel without IPv6 has no tcp6 table.
            Err(e) if f == "tcp6" && e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{path}: {e}"))),
        }
    }
    Ok(p)
}

/// The load on `w`'s port, read in its node's namespace (of the data-center `dc`).
pub fn port_load(dc: Option<&VirtualDc>, w: &Watched) -> io::Result<PortLoad> {
    match (&w.node, dc) {
        (None, _) => port_load_here(w.port),
        (Some(node), Some(dc)) => dc.run_in_ns(node, || port_load_here(w.port)),
        (Some(node), None) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "port {} of node {node}: no virtual data-center to read it in",
                w.port
            ),
        )),
    }
}

/// One sample of every watched port, summed per side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub front: PortLoad,
    pub back: PortLoad,
    /// Every port quiet for its side.
    pub quiet: bool,
}

/// Sample every port of `ports`.
pub fn sample(dc: Option<&VirtualDc>, ports: &[Watched]) -> io::Result<Sample> {
    let mut s = Sample {
        quiet: true,
        ..Sample::default()
    };
    for w in ports {
        let l = port_load(dc, w)?;
        s.quiet &= l.quiet(w.side);
        match w.side {
            Side::Front => s.front.add(l),
            Side::Back => s.back.add(l),
        }
    }
    Ok(s)
}

/// How a point started, as it records it (`start` in `points.jsonl`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Start {
    /// Every watched port was quiet when the point started (see the module docs).
    pub started_empty: bool,
    /// Time spent waiting for quiet before the point, ms (restart included).
    pub settle_ms: f64,
    /// Accept-queue entries at the start, every watched listener.
    pub start_backlog: u64,
    /// Requests in flight at the start: open client connections at the front plus
    /// back-end connections carrying a request.
    pub start_inflight: u64,
    /// Connections open at the back-ends at the start (idle kept-alive ones included).
    pub start_conns: u64,
    /// What the previous point left: accept-queue entries at the first sample.
    pub left_backlog: u64,
    /// What the previous point left: requests in flight at the first sample.
    pub left_inflight: u64,
    /// The tier did not drain within the experiment's bound and was restarted.
    #[serde(default)]
    pub restarted: bool,
    /// Why the point did not start empty (`None` when it did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Start {
    /// The point's start on one line, for progress output.
    pub fn line(&self) -> String {
        let restarted = if self.restarted {
            ", tier restarted"
        } else {
            ""
        };
        if self.started_empty {
            let left = if self.left_backlog + self.left_inflight > 0 {
                format!(
                    " (previous point left {} queued, {} in flight{restarted})",
                    self.left_backlog, self.left_inflight
                )
            } else {
                String::new()
            };
            format!("start empty after {:.0} ms{left}", self.settle_ms)
        } else {
            format!(
                "NOT EMPTY at start after {:.0} ms{restarted}: {} queued, {} in flight ({})",
                self.settle_ms,
                self.start_backlog,
                self.start_inflight,
                self.reason.as_deref().unwrap_or("")
            )
        }
    }
}

fn inflight(s: &Sample) -> u64 {
    s.front.conns + s.back.busy
}

/// What [`wait_quiet`] saw.
#[derive(Clone, Copy, Debug)]
pub struct Settled {
    /// The first sample (what the previous point left).
    pub first: Sample,
    /// The last sample.
    pub last: Sample,
    /// Quiet reached ([`QUIET_CONFIRM`] quiet samples in a row).
    pub quiet: bool,
    /// Time waited.
    pub waited: Duration,
}

/// Wait until every port of `ports` is quiet, at most `within`, sampling every
/// [`QUIET_POLL`]. Not reaching quiet is not an error here: the caller decides (restart
/// the tier, or record `started_empty = false`); a port that cannot be read is.
pub fn wait_quiet(
    dc: Option<&VirtualDc>,
    ports: &[Watched],
    within: Duration,
) -> io::Result<Settled> {
    let t0 = Instant::now();
    let first = sample(dc, ports)?;
    let mut last = first;
    let mut run = u32::from(first.quiet);
    while run < QUIET_CONFIRM {
        if t0.elapsed() >= within {
            break;
        }
        std::thread::sleep(QUIET_POLL);
        last = sample(dc, ports)?;
        run = if last.quiet { run + 1 } else { 0 };
    }
    Ok(Settled {
        first,
        last,
        quiet: run >= QUIET_CONFIRM,
        waited: t0.elapsed(),
    })
}

impl Settled {
    /// The point's [`Start`]: `first` from the first wait (what the previous point left),
    /// `self` the last one (after a restart, if any); `waited` the whole wait.
    pub fn start(&self, first: &Sample, waited: Duration, restarted: bool) -> Start {
        let l = &self.last;
        Start {
            started_empty: self.quiet,
            settle_ms: waited.as_secs_f64() * 1e3,
            start_backlog: l.front.backlog + l.back.backlog,
            start_inflight: inflight(l),
            start_conns: l.back.conns,
            left_backlog: first.front.backlog + first.back.backlog,
            left_inflight: inflight(first),
            restarted,
            reason: (!self.quiet).then(|| {
                format!(
                    "not quiet within {:.1} s: front {} queued, {} open; back {} queued, {} carrying a request",
                    self.waited.as_secs_f64(),
                    l.front.backlog,
                    l.front.conns,
                    l.back.backlog,
                    l.back.busy
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000800:00000003 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:A000 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 0 10 -1
   2: 0100007F:1F90 0100007F:A001 01 00000000:0000004E 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 0 10 -1
   3: 0100007F:1F90 0100007F:A002 08 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 20 4 0 10 -1
   4: 0100007F:1F90 0100007F:A003 06 00000000:00000000 03:00000FA0 00000000     0        0 0 3 0000000000000000
   5: 0100007F:A004 0100007F:1F90 01 00000010:00000000 00:00000000 00000000     0        0 5 1 0000000000000000 20 4 0 10 -1
   6: 0100007F:1F90 0100007F:A005 01 00000200:00000000 00:00000000 00000000     0        0 6 1 0000000000000000 20 4 0 10 -1
";

    #[test]
    fn the_table_gives_backlog_connections_and_the_ones_carrying_a_request() {
        let p = port_load_of(TABLE, 0x1F90).unwrap();
        // Listener: 3 queued. Connections: idle (1), unread request (2), CLOSE-WAIT (3),
        // unsent response (6); TIME-WAIT (4) and a peer's socket (5, remote port) are not.
        assert_eq!(
            p,
            PortLoad {
                backlog: 3,
                conns: 4,
                busy: 3
            }
        );
        assert!(!p.quiet(Side::Back) && !p.quiet(Side::Front));
        let idle =
            port_load_of(&TABLE.lines().take(3).collect::<Vec<_>>().join("\n"), 8080).unwrap();
        // The listener (3 queued) and the idle connection only.
        assert_eq!((idle.backlog, idle.conns, idle.busy), (3, 1, 0));
        assert_eq!(port_load_of(TABLE, 81).unwrap(), PortLoad::default());
        assert!(port_load_of("head\n 0: zz\n", 80).is_err());
    }

    #[test]
    fn an_idle_kept_alive_connection_is_quiet_at_the_back_only() {
        let idle = PortLoad {
            backlog: 0,
            conns: 2,
            busy: 0,
        };
        assert!(idle.quiet(Side::Back));
        assert!(!idle.quiet(Side::Front));
        assert!(!PortLoad {
            backlog: 1,
            ..PortLoad::default()
        }
        .quiet(Side::Back));
    }

    #[test]
    fn a_loaded_listener_is_seen_then_quiet_once_its_queue_is_taken() {
        use std::net::{TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let w = [Watched::new(None, port, Side::Back)];
        let clients: Vec<TcpStream> = (0..3)
            .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
            .collect();
        let s = sample(None, &w).unwrap();
        assert_eq!(s.back.backlog, 3, "{s:?}");
        assert!(!s.quiet);
        let s = wait_quiet(None, &w, Duration::ZERO).unwrap();
        assert!(!s.quiet, "not quiet within no time");
        // Accept them all and close both ends: quiet.
        let served: Vec<_> = (0..3).map(|_| l.accept().unwrap().0).collect();
        drop(served);
        drop(clients);
        let s = wait_quiet(None, &w, Duration::from_secs(60)).unwrap();
        assert!(s.quiet, "{s:?}");
        let st = s.start(&s.first, s.waited, false);
        assert!(st.started_empty && st.reason.is_none());
        assert_eq!(st.start_backlog, 0);
    }
}
