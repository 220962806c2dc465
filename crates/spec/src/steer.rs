//! Steering new connections between the web server and the daemon.
//!
//! - [`Steering`]: the sk_lookup program (`bpf/steer.bpf.c`) attached to this
//!   network namespace: SYNs for the service go to the server's listener, or, while
//!   the daemon sets `divert`, to the daemon's admission listener. The daemon sets
//!   `divert` = "server's accept queue ≥ Q and the window has room" every poll period
//!   (`--poll-us`), so the program's view is at most one period plus one sock_diag
//!   read old; the daemon re-decides every connection it accepts with the fresh
//!   window, and a connection diverted on a stale flag is served locally (handed to
//!   the server). The program is detached when the daemon exits (its link is not
//!   pinned), so a crash leaves nothing attached.
//! - [`FlowSteer`]: moving a migrated connection's flow at the front-end, the hook
//!   `migrate_with` calls between restore and close. [`FrontendSteer`] sends `MOVE` to
//!   the eBPF front-end's control port (`farside frontend --control`) in deployment;
//!   [`PolicyRouteSteer`] is the stand-in the tests use (a per-flow policy route in the
//!   client's namespace).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;

use aya::maps::{Array, MapData, PerCpuArray, SockMap};
use aya::programs::SkLookup;
use aya::Ebpf;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.bpf.o"));

/// Counter indices, as `STEER_CNT_*` in `bpf/steer.bpf.c`.
pub const CNT_SERVER: usize = 0;
/// SYNs assigned to the daemon's listener.
pub const CNT_DAEMON: usize = 1;
/// Divert set but no daemon listener in the map.
pub const CNT_NO_DAEMON: usize = 2;
/// `bpf_sk_assign` failed.
pub const CNT_ASSIGN_FAILED: usize = 3;
/// Number of counters.
pub const COUNTERS: usize = 4;

/// `struct steer_config` of `bpf/steer.bpf.c`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SteerConfig {
    vip: u32,
    port: u32,
    divert: u32,
    pad: u32,
}

// SAFETY: plain C struct of u32s, no padding, every bit pattern valid.
unsafe impl aya::Pod for SteerConfig {}

/// The attached sk_lookup program. Dropping it detaches the program.
pub struct Steering {
    ebpf: Ebpf,
    cfg: SteerConfig,
}

fn err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("steer: {what}: {e}"))
}

impl Steering {
    /// Loads the program, puts `daemon` (the admission listener) in its socket map and
    /// attaches it to the calling thread's network namespace for `vip:port` (`vip`
    /// `None`: any local address). Starts with divert off. Needs CAP_BPF and
    /// CAP_NET_ADMIN.
    pub fn attach(vip: Option<Ipv4Addr>, port: u16, daemon: &TcpListener) -> io::Result<Self> {
        let mut ebpf = aya::EbpfLoader::new()
            .btf(None)
            .load(OBJECT)
            .map_err(|e| err("loading bpf/steer.bpf.o", e))?;
        let cfg = SteerConfig {
            vip: vip.map(|a| u32::from_ne_bytes(a.octets())).unwrap_or(0),
            port: u32::from(port),
            divert: 0,
            pad: 0,
        };
        {
            let map = ebpf
                .map_mut("steer_config")
                .ok_or_else(|| err("map", "no steer_config"))?;
            let mut a: Array<&mut MapData, SteerConfig> =
                Array::try_from(map).map_err(|e| err("steer_config", e))?;
            a.set(0, cfg, 0).map_err(|e| err("steer_config", e))?;
        }
        {
            let map = ebpf
                .map_mut("steer_sock")
                .ok_or_else(|| err("map", "no steer_sock"))?;
            let mut m: SockMap<&mut MapData> =
                SockMap::try_from(map).map_err(|e| err("steer_sock", e))?;
            m.set(0, &daemon.as_raw_fd(), 0)
                .map_err(|e| err("putting the admission listener in steer_sock", e))?;
        }
        let netns = std::fs::File::open("/proc/thread-self/ns/net")?;
        let prog: &mut SkLookup = ebpf
            .program_mut("steer")
            .ok_or_else(|| err("program", "no steer"))?
            .try_into()
            .map_err(|e| err("program", e))?;
        prog.load()
            .map_err(|e| err("loading the sk_lookup program", e))?;
        prog.attach(&netns)
            .map_err(|e| err("attaching to the network namespace", e))?;
        Ok(Self { ebpf, cfg })
    }

    /// Sets whether new connections go to the daemon's listener.
    pub fn set_divert(&mut self, on: bool) -> io::Result<()> {
        let v = u32::from(on);
        if self.cfg.divert == v {
            return Ok(());
        }
        self.cfg.divert = v;
        let map = self
            .ebpf
            .map_mut("steer_config")
            .ok_or_else(|| err("map", "no steer_config"))?;
        let mut a: Array<&mut MapData, SteerConfig> =
            Array::try_from(map).map_err(|e| err("steer_config", e))?;
        a.set(0, self.cfg, 0).map_err(|e| err("steer_config", e))
    }

    /// The program's counters summed over CPUs (index by `CNT_*`).
    pub fn counters(&self) -> io::Result<[u64; COUNTERS]> {
        let map = self
            .ebpf
            .map("steer_counters")
            .ok_or_else(|| err("map", "no steer_counters"))?;
        let a: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(map).map_err(|e| err("steer_counters", e))?;
        let mut out = [0u64; COUNTERS];
        for (i, o) in out.iter_mut().enumerate() {
            let v = a
                .get(&(i as u32), 0)
                .map_err(|e| err("steer_counters", e))?;
            *o = v.iter().sum();
        }
        Ok(out)
    }
}

/// Moves a migrated connection's flow at the front-end: after it returns `Ok`, the
/// client's packets for this connection reach `to_backend`. Called by the source
/// between the target's restore and the source's close; an error aborts the
/// migration (the connection resumes on the source).
pub trait FlowSteer: Send + Sync {
    /// Points the flow of `client` (the connection's remote address) at `to_backend`.
    fn move_flow(&self, client: SocketAddr, to_backend: IpAddr) -> io::Result<()>;
}

/// No front-end flow to move (the flow follows the socket, e.g. on one host).
pub struct NoSteer;

impl FlowSteer for NoSteer {
    fn move_flow(&self, _client: SocketAddr, _to_backend: IpAddr) -> io::Result<()> {
        Ok(())
    }
}

/// The tests' front-end: in the client's network namespace, one policy rule per
/// moved flow (`ip rule add … ipproto tcp sport PORT lookup TABLE`) sends that
/// connection's packets by the routing table of the target back-end (a /32 route to
/// the VIP through the target's link, as the migrate test's route, but per flow so
/// that other connections to the VIP stay where they are).
pub struct PolicyRouteSteer {
    /// The client's network namespace (`ip -n`).
    pub netns: String,
    /// Routing table per back-end address (the daemon's peer IPs).
    pub tables: Vec<(IpAddr, u32)>,
}

/// First priority of the flow rules (below the main table's 32766).
const RULE_PRIORITY: u32 = 1000;

impl FlowSteer for PolicyRouteSteer {
    fn move_flow(&self, client: SocketAddr, to_backend: IpAddr) -> io::Result<()> {
        let table = self
            .tables
            .iter()
            .find(|(ip, _)| *ip == to_backend)
            .map(|(_, t)| *t)
            .ok_or_else(|| io::Error::other(format!("no route table for {to_backend}")))?;
        let st = std::process::Command::new("ip")
            .args(["-n", &self.netns, "rule", "add", "priority"])
            .arg(RULE_PRIORITY.to_string())
            .args(["from", &client.ip().to_string(), "ipproto", "tcp", "sport"])
            .arg(client.port().to_string())
            .args(["lookup", &table.to_string()])
            .status()?;
        if st.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("ip rule add for {client}: {st}")))
        }
    }
}

/// Most idle control connections kept to the front-end: one per migrator thread that
/// may flip a flow at the same time would do; more only hold sockets open.
pub const FRONTEND_CONNS_MAX: usize = 8;

/// The deployed front-end: each move is a `MOVE client backend` on the control port of
/// `farside frontend` (crates/frontend), which rewrites the flow's entry in its eBPF
/// flow table. Connections are reused (at most [`FRONTEND_CONNS_MAX`] idle ones); the
/// control client bounds every request (1 s, one retry on a fresh connection).
pub struct FrontendSteer {
    addr: SocketAddr,
    idle: std::sync::Mutex<Vec<farside_frontend::control::Client>>,
}

impl FrontendSteer {
    /// A steer that talks to the front-end's control port at `addr` (connects lazily).
    pub fn new(addr: SocketAddr) -> FrontendSteer {
        FrontendSteer {
            addr,
            idle: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl FlowSteer for FrontendSteer {
    fn move_flow(&self, client: SocketAddr, to_backend: IpAddr) -> io::Result<()> {
        let (SocketAddr::V4(client), IpAddr::V4(backend)) = (client, to_backend) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the front-end routes IPv4 only",
            ));
        };
        let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut c = match pooled {
            Some(c) => c,
            None => farside_frontend::control::Client::connect(self.addr)?,
        };
        c.move_flow(client, backend)?;
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < FRONTEND_CONNS_MAX {
            idle.push(c);
        }
        Ok(())
    }
}
