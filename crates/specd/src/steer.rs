//! Steering new connections between the web server and the daemon.
//!
//! - [`Steering`]: the sk_lookup program (`bpf/steer.bpf.c`) attached to this
//!   network namespace: SYNs for the service go to the server's listener, or to the
//!   daemon's admission listener. Who decides, per [`Mode`]:
//!   - [`Mode::Kernel`]: the program, per SYN, from the exact queue: the server's
//!     listener is in the program's socket map ([`Steering::use_server_listener`]) and
//!     the program reads its `sk_ack_backlog` (established connections waiting for
//!     accept) and `icsk_accept_queue.qlen` (half-open ones), at the offsets the
//!     kernel's BTF gives, and applies [`crate::window::syn_verdict`]: to the daemon
//!     at backlog + half-open ≥ Q while the window has room ([`Live::set_room`], a
//!     plain store into a map the daemon mmaps, written on window events); with
//!     `--no-room drop`, dropped silently at backlog ≥ Q without room (assigned to the
//!     [`RefusalListener`], whose full accept queue makes the kernel drop the SYN as
//!     at any full queue; the client retransmits it); else the server. It publishes what it read
//!     ([`Live::backlog`], [`Live::half_open`]), so the daemon reads it with no
//!     syscall. The map entry does not keep the listener alive: when the server closes
//!     it the kernel drops it from the map and SYNs take the normal lookup.
//!   - [`Mode::Poll`]: the daemon sets `divert` = "server's accept queue ≥ Q and the
//!     window has room" every poll period (`--poll-us`), so the program's view is at
//!     most one period plus one sock_diag read old (the fallback when the server's
//!     listener cannot be put in the map).
//!
//!   Either way the daemon re-decides every connection it accepts with the fresh
//!   window, and a connection diverted on a stale view is served locally (handed to
//!   the server). The program is detached when the daemon exits (its link is not
//!   pinned), so a crash leaves nothing attached.
//! - [`FlowSteer`]: moving a migrated connection's flow at the front-end, the hook
//!   `migrate_with` calls between restore and close. [`FrontendSteer`] moves it at the
//!   eBPF front-end in deployment: by default with the one-sided MOVE (one UDP
//!   datagram answered by the front-end's tc program, `farside_frontend::fmove`), or
//!   with `MOVE` on its control port (`farside frontend --control`, TCP);
//!   [`PolicyRouteSteer`] is the stand-in the tests use (a per-flow policy route in the
//!   client's namespace).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use aya::programs::SkLookup;
use farside_bpfrt::btf::Btf;
use farside_bpfrt::{flags, MmapArray, Object, RawMap};

pub use crate::window::NoRoom;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.bpf.o"));

/// Counter indices, as `STEER_CNT_*` in `bpf/steer.bpf.c`.
pub const CNT_SERVER: usize = 0;
/// SYNs assigned to the daemon's listener.
pub const CNT_DAEMON: usize = 1;
/// Divert set but no daemon listener in the map.
pub const CNT_NO_DAEMON: usize = 2;
/// `bpf_sk_assign` failed.
pub const CNT_ASSIGN_FAILED: usize = 3;
/// Kernel mode, but the server's listener was not in the map (closed by the server):
/// the SYN took the normal lookup.
pub const CNT_NO_SERVER: usize = 4;
/// Kernel mode: SYNs diverted that the established connections alone (below Q) would
/// have left to the server: half-open ones took the queue to Q (a burst).
pub const CNT_HALF_OPEN: usize = 5;
/// Kernel mode: SYNs dropped at the refusal listener (the server's established
/// connections at Q, the window without room).
pub const CNT_DROPPED: usize = 6;
/// Kernel mode: SYNs passed to the server although backlog + half-open was ≥ Q and the
/// window had no room (half-open ones past Q, which never make the program drop, or
/// no refusal listener).
pub const CNT_FULL_PASSED: usize = 7;
/// Number of counters.
pub const COUNTERS: usize = 8;

/// `steer_sock` entry of the daemon's admission listener (`STEER_SOCK_DAEMON`).
const SOCK_DAEMON: u32 = 0;
/// `steer_sock` entry of the server's listener (`STEER_SOCK_SERVER`).
const SOCK_SERVER: u32 = 1;
/// `steer_sock` entry of the refusal listener (`STEER_SOCK_REFUSE`).
const SOCK_REFUSE: u32 = 2;
/// The program as errors name it.
const LABEL: &str = "the steering program (bpf/steer.bpf.c)";

/// Who decides whether a SYN is diverted (`STEER_MODE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The daemon, from its polls, in the `divert` flag.
    Poll = 0,
    /// The program, per SYN, from the server's listener's backlog and the `room` flag.
    Kernel = 1,
}

/// `struct steer_config` of `bpf/steer.bpf.c`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SteerConfig {
    vip: u32,
    port: u32,
    divert: u32,
    mode: u32,
    queue: u32,
    off_ack_backlog: u32,
    off_qlen: u32,
    drop_no_room: u32,
}

// SAFETY: plain C struct of u32s, no padding, every bit pattern valid.
unsafe impl aya::Pod for SteerConfig {}

/// `struct steer_live` of `bpf/steer.bpf.c`, as the daemon sees it in its mapping.
#[repr(C)]
struct LiveWords {
    room: AtomicU32,
    backlog: AtomicU32,
    seen: AtomicU64,
    half_open: AtomicU32,
    pad: AtomicU32,
}

/// The daemon's mapping of the program's `steer_live` map: the `room` flag it writes
/// and the backlog the program saw, both without a syscall. Valid after the program
/// is gone (the mapping holds the map).
pub struct Live {
    map: MmapArray,
}

impl Live {
    fn map(fd: BorrowedFd<'_>) -> io::Result<Live> {
        let map = MmapArray::map(fd, std::mem::size_of::<LiveWords>())
            .map_err(|e| err("mmap of steer_live", e))?;
        Ok(Live { map })
    }

    fn words(&self) -> &LiveWords {
        // SAFETY: entry 0 of steer_live is a `struct steer_live`, which LiveWords
        // mirrors; every access is atomic.
        unsafe { self.map.value::<LiveWords>() }
    }

    /// Tells the program whether the window has room (kernel mode).
    pub fn set_room(&self, room: bool) {
        self.words().room.store(u32::from(room), Ordering::Release);
    }

    /// The `room` flag as last written.
    pub fn room(&self) -> bool {
        self.words().room.load(Ordering::Acquire) != 0
    }

    /// The server's accept-queue length the program read at the last SYN for the
    /// service (kernel mode; 0 before the first).
    pub fn backlog(&self) -> u32 {
        self.words().backlog.load(Ordering::Acquire)
    }

    /// The server's half-open connections (request socks) the program read at the
    /// last SYN for the service (kernel mode; 0 before the first).
    pub fn half_open(&self) -> u32 {
        self.words().half_open.load(Ordering::Acquire)
    }

    /// SYNs at which the program read the server's backlog (kernel mode).
    pub fn seen(&self) -> u64 {
        self.words().seen.load(Ordering::Acquire)
    }
}

/// The attached sk_lookup program. Dropping it detaches the program.
pub struct Steering {
    obj: Object,
    cfg: SteerConfig,
    /// `steer_sock` through its own descriptor (its values are u64).
    socks: RawMap,
    live: Arc<Live>,
    /// Why the kernel mode is unavailable (`steer_poll` attached), if it is.
    no_kernel_mode: Option<String>,
    /// The refusal listener in `steer_sock` (kernel mode), made at the first
    /// [`Steering::use_server_listener`]; `Err`: why there is none.
    refusal: Option<Result<RefusalListener, String>>,
}

fn err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("steer: {what}: {e}"))
}

/// Largest offset the program reads at (`STEER_SK_OFF_MASK`): an offset past it would
/// be masked to another field, so it is refused here.
const SK_OFF_MAX: u32 = 0xfff - 4;

/// Offsets of `struct sock.sk_ack_backlog` and of
/// `struct inet_connection_sock.icsk_accept_queue.qlen` in the running kernel (its
/// BTF); both from the start of the `tcp_sock`, which begins with both structs.
fn queue_offsets() -> io::Result<(u32, u32)> {
    let btf = Btf::kernel().map_err(|e| err("kernel BTF", e))?;
    let field = |strukt: &str, path: &[&str]| {
        let off = btf.offset_of(strukt, path).ok_or_else(|| {
            err(
                farside_bpfrt::btf::VMLINUX_BTF,
                format!("no struct {strukt} field {}", path.join(".")),
            )
        })?;
        if off > SK_OFF_MAX {
            return Err(err(
                farside_bpfrt::btf::VMLINUX_BTF,
                format!(
                    "struct {strukt} field {} at {off}, past {SK_OFF_MAX}",
                    path.join(".")
                ),
            ));
        }
        Ok(off)
    };
    Ok((
        field("sock", &["sk_ack_backlog"])?,
        field("inet_connection_sock", &["icsk_accept_queue", "qlen"])?,
    ))
}

/// Connections the refusal listener's accept queue holds: its backlog is 1 and the
/// kernel calls a queue full past its backlog (`sk_acceptq_is_full`), so two
/// established connections, never accepted, fill it.
const REFUSAL_FILLERS: usize = 2;
/// Longest wait for the fillers' handshakes to land in the refusal listener's queue
/// (loopback: microseconds; a CPU-starved namespace: milliseconds).
const REFUSAL_FILL_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// A listener of the daemon whose accept queue is kept full: a SYN assigned to it is
/// dropped by the kernel as at any full accept queue (`ListenOverflows`), silently, and
/// the client retransmits it (1 s, then 3 s). This is how the program refuses a SYN
/// without a reset: an sk_lookup `SK_DROP` makes TCP answer with a reset (the client
/// sees "connection refused", a failed request rather than a wait).
pub struct RefusalListener {
    listener: TcpListener,
    /// The client ends of the connections that fill its queue.
    _fillers: Vec<std::net::TcpStream>,
}

impl RefusalListener {
    /// Binds 127.0.0.1:0 in the calling thread's network namespace (its loopback must
    /// be up) with backlog 1 and fills its accept queue.
    pub fn open() -> io::Result<RefusalListener> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| err("the refusal listener on 127.0.0.1", e))?;
        // SAFETY: listen(2) on our bound socket, to set its backlog.
        if unsafe { libc::listen(listener.as_raw_fd(), 1) } != 0 {
            return Err(err("listen(1)", io::Error::last_os_error()));
        }
        let addr = listener.local_addr()?;
        let fillers = (0..REFUSAL_FILLERS)
            .map(|_| std::net::TcpStream::connect_timeout(&addr, REFUSAL_FILL_MAX))
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| err("filling the refusal listener", e))?;
        let r = RefusalListener {
            listener,
            _fillers: fillers,
        };
        let t0 = std::time::Instant::now();
        while !r.full()? {
            if t0.elapsed() > REFUSAL_FILL_MAX {
                return Err(err(
                    "the refusal listener",
                    format!("its accept queue not full after {REFUSAL_FILL_MAX:?}"),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(r)
    }

    /// Whether its accept queue is full (TCP_INFO of a listener: `tcpi_unacked` is its
    /// accept queue, `tcpi_sacked` its backlog).
    pub fn full(&self) -> io::Result<bool> {
        // SAFETY: tcp_info is plain data; getsockopt writes at most `len` bytes.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: a valid socket, buffer and length.
        let r = unsafe {
            libc::getsockopt(
                self.listener.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(err(
                "TCP_INFO of the refusal listener",
                io::Error::last_os_error(),
            ));
        }
        Ok(info.tcpi_unacked > info.tcpi_sacked)
    }
}

impl Steering {
    /// Loads the program (`steer`; if the verifier refuses its kernel-mode helpers,
    /// `steer_poll`, and [`Steering::use_server_listener`] then says why), puts
    /// `daemon` (the admission listener) in its socket map and attaches it to the
    /// calling thread's network namespace for `vip:port` (`vip` `None`: any local
    /// address). Starts in [`Mode::Poll`] with divert off. Needs CAP_BPF and
    /// CAP_NET_ADMIN (and CAP_PERFMON for the kernel mode's helpers).
    pub fn attach(vip: Option<Ipv4Addr>, port: u16, daemon: &TcpListener) -> io::Result<Self> {
        Self::attach_with(vip, port, daemon, true)
    }

    /// [`Steering::attach`], with `kernel_mode` false: `steer_poll` (the program
    /// without the kernel mode) whatever the verifier would accept (`--poll-steer`).
    pub fn attach_with(
        vip: Option<Ipv4Addr>,
        port: u16,
        daemon: &TcpListener,
        kernel_mode: bool,
    ) -> io::Result<Self> {
        let obj = Object::load(LABEL, OBJECT)?;
        let cfg = SteerConfig {
            vip: vip.map(|a| u32::from_ne_bytes(a.octets())).unwrap_or(0),
            port: u32::from(port),
            ..SteerConfig::default()
        };
        let socks = obj.raw_map("steer_sock")?;
        let live = Arc::new(Live::map(obj.map_fd("steer_live")?)?);
        socks
            .update(&SOCK_DAEMON, &(daemon.as_raw_fd() as u64), flags::ANY)
            .map_err(|e| err("putting the admission listener in steer_sock", e))?;
        let mut st = Self {
            obj,
            cfg,
            socks,
            live,
            no_kernel_mode: None,
            refusal: None,
        };
        st.write_config()?;
        let first = if kernel_mode {
            st.load_program("steer")
        } else {
            st.no_kernel_mode = Some("the poll mode was asked for (--poll-steer)".into());
            Ok(())
        };
        let name = match first {
            Ok(()) if kernel_mode => "steer",
            Ok(()) => {
                st.load_program("steer_poll")
                    .map_err(|e| err("loading the sk_lookup program steer_poll", e))?;
                "steer_poll"
            }
            Err(e) => {
                // The kernel mode's helpers need CAP_PERFMON and no lockdown.
                st.no_kernel_mode = Some(format!(
                    "the verifier refused the program that reads the backlog: {e}"
                ));
                st.load_program("steer_poll")
                    .map_err(|e| err("loading the sk_lookup program steer_poll", e))?;
                "steer_poll"
            }
        };
        st.obj.attach_sk_lookup(name)?;
        Ok(st)
    }

    fn load_program(&mut self, name: &str) -> farside_bpfrt::Result<()> {
        self.obj.load_program::<SkLookup>(name).map(|_| ())
    }

    fn write_config(&mut self) -> io::Result<()> {
        Ok(self
            .obj
            .array_set("steer_config", 0, self.cfg, "writing steer_config")?)
    }

    /// Switches to [`Mode::Kernel`]: puts `server` (the web server's listener; the
    /// map takes its own reference to the socket, not to the descriptor, so the caller
    /// may close `server` and the server's close still frees the socket) in the
    /// program's socket map and has the program divert at `queue` (Q); without room,
    /// `no_room` (with [`NoRoom::Drop`] the refusal listener is made at the first
    /// call; if it cannot be, SYNs go to the server and [`Steering::refusal`] says
    /// why). Divert off until [`Live::set_room`] says the window has room.
    pub fn use_server_listener(
        &mut self,
        server: BorrowedFd<'_>,
        queue: u32,
        no_room: NoRoom,
    ) -> io::Result<()> {
        if let Some(why) = &self.no_kernel_mode {
            return Err(err("kernel mode", why));
        }
        let (off, off_qlen) = queue_offsets()?;
        self.socks
            .update(&SOCK_SERVER, &(server.as_raw_fd() as u64), flags::ANY)
            .map_err(|e| err("putting the server's listener in steer_sock", e))?;
        if no_room == NoRoom::Drop && self.refusal.is_none() {
            let r = RefusalListener::open().and_then(|r| {
                self.socks
                    .update(&SOCK_REFUSE, &(r.listener.as_raw_fd() as u64), flags::ANY)
                    .map_err(|e| err("putting the refusal listener in steer_sock", e))?;
                Ok(r)
            });
            self.refusal = Some(r.map_err(|e| e.to_string()));
        }
        self.cfg.off_ack_backlog = off;
        self.cfg.off_qlen = off_qlen;
        self.cfg.drop_no_room = u32::from(no_room == NoRoom::Drop);
        self.cfg.queue = queue;
        self.cfg.mode = Mode::Kernel as u32;
        self.cfg.divert = 0;
        self.write_config()
    }

    /// Switches to [`Mode::Poll`] (divert off) and drops the server's listener from
    /// the map if it is still there.
    pub fn use_polling(&mut self) -> io::Result<()> {
        self.cfg.mode = Mode::Poll as u32;
        self.cfg.divert = 0;
        self.write_config()?;
        match self.socks.delete(&SOCK_SERVER) {
            // A sockmap answers EINVAL for an empty entry (the server closed it).
            Err(e) if !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) => {
                Err(err("dropping the server's listener from steer_sock", e))
            }
            _ => Ok(()),
        }
    }

    /// Kernel mode: `Ok` if SYNs past Q without room are dropped at the refusal
    /// listener, else why not (they go to the server's queue then).
    pub fn refusal(&self) -> Result<(), String> {
        match &self.refusal {
            Some(Ok(_)) => Ok(()),
            Some(Err(why)) => Err(why.clone()),
            None => Err("--no-room queue".into()),
        }
    }

    /// Who decides now.
    pub fn mode(&self) -> Mode {
        if self.cfg.mode == Mode::Kernel as u32 {
            Mode::Kernel
        } else {
            Mode::Poll
        }
    }

    /// Whether the server's listener is still in the map: the kernel drops it when
    /// the last descriptor of it closes (the server closed or restarted).
    pub fn server_listener_present(&self) -> io::Result<bool> {
        // A socket map's value, read from user space, is the socket's cookie.
        match self.socks.lookup::<u32, u64>(&SOCK_SERVER) {
            Ok(found) => Ok(found.is_some()),
            Err(e) => Err(err("steer_sock lookup", e)),
        }
    }

    /// The shared `room`/`backlog` words (kernel mode).
    pub fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live)
    }

    /// Sets whether new connections go to the daemon's listener ([`Mode::Poll`]).
    pub fn set_divert(&mut self, on: bool) -> io::Result<()> {
        let v = u32::from(on);
        if self.cfg.divert == v {
            return Ok(());
        }
        self.cfg.divert = v;
        self.write_config()
    }

    /// Whether [`Steering::use_server_listener`] can work (the attached program has
    /// the kernel mode).
    pub fn kernel_mode_possible(&self) -> bool {
        self.no_kernel_mode.is_none()
    }

    /// One of the program's counters (`CNT_*`) summed over CPUs: one syscall, where
    /// [`Steering::counters`] makes one per counter.
    pub fn counter(&self, i: usize) -> io::Result<u64> {
        Ok(self.obj.per_cpu_sum("steer_counters", i as u32)?)
    }

    /// The program's counters summed over CPUs (index by `CNT_*`).
    pub fn counters(&self) -> io::Result<[u64; COUNTERS]> {
        let sums = self.obj.per_cpu_sums("steer_counters", COUNTERS as u32)?;
        let mut out = [0u64; COUNTERS];
        out.copy_from_slice(&sums);
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

/// Most idle control connections (or one-sided MOVE sockets) kept to the front-end:
/// one per migrator thread that may flip a flow at the same time would do; more only
/// hold sockets open.
pub const FRONTEND_CONNS_MAX: usize = 8;

/// How [`FrontendSteer`] moves a flow (`specd --frontend-move`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FrontendMove {
    /// The one-sided MOVE: one UDP datagram to the front-end's address, answered by
    /// its tc program in the kernel (a compare-and-swap of the flow's entry from this
    /// back-end to the target); no front-end process, no connection. Bounded by
    /// `farside_frontend::fmove::ATTEMPTS` x `ATTEMPT_TIMEOUT` (3 x 50 ms).
    Udp,
    /// `MOVE client backend` on the front-end's control port (TCP; sealed with the
    /// front-end's key), answered by `farside frontend`'s control thread. Bounded by its `CLIENT_TIMEOUT` (1 s, one
    /// retry on a fresh connection).
    Tcp,
}

/// The deployed front-end (crates/frontend): each move rewrites the flow's entry in
/// its eBPF flow table, either one-sidedly ([`FrontendMove::Udp`]: the request's
/// source address, picked by routing toward the front-end, must be this back-end's
/// address as the front-end knows it, since only the flow's owner may move it) or by
/// `MOVE` on the control port ([`FrontendMove::Tcp`]). Sockets are reused (at most
/// [`FRONTEND_CONNS_MAX`] idle ones).
///
/// Outcomes: MOVED or ALREADY (a retry whose first reply was lost) are `Ok`;
/// NOT_OWNER, NOT_FOUND (the entry was evicted: the one-sided MOVE never creates one),
/// no reply, or a TCP `ERR` are errors, and the migration resumes on the source.
pub struct FrontendSteer {
    addr: SocketAddr,
    via: FrontendMove,
    idle_tcp: std::sync::Mutex<Vec<farside_frontend::control::Client>>,
    idle_udp: std::sync::Mutex<Vec<farside_frontend::fmove::MoveClient>>,
    /// The key that seals each one-sided MOVE, if the front-end has one.
    key: Option<farside_frontend::fmove::MoveKey>,
}

impl FrontendSteer {
    /// A steer that moves flows at the front-end at `addr` (its control port; the
    /// one-sided MOVE goes to the same address and port number over UDP, `farside
    /// frontend --move-udp-port`'s default), by `via`. Sockets are made lazily.
    pub fn new(addr: SocketAddr, via: FrontendMove) -> FrontendSteer {
        FrontendSteer {
            addr,
            via,
            idle_tcp: std::sync::Mutex::new(Vec::new()),
            idle_udp: std::sync::Mutex::new(Vec::new()),
            key: None,
        }
    }

    /// Seal every one-sided MOVE, and every request on a TCP control port, with `key`
    /// (the front-end's `--key-file` key; its TCP control port refuses requests
    /// without it).
    pub fn with_key(mut self, key: farside_frontend::fmove::MoveKey) -> FrontendSteer {
        self.key = Some(key);
        self
    }

    /// How it moves flows.
    pub fn via(&self) -> FrontendMove {
        self.via
    }

    fn pooled<T>(pool: &std::sync::Mutex<Vec<T>>) -> Option<T> {
        pool.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn put_back<T>(pool: &std::sync::Mutex<Vec<T>>, c: T) {
        let mut idle = pool.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < FRONTEND_CONNS_MAX {
            idle.push(c);
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
        match self.via {
            FrontendMove::Udp => {
                let SocketAddr::V4(fe) = self.addr else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("front-end {}: the one-sided MOVE is IPv4", self.addr),
                    ));
                };
                let mut c = match Self::pooled(&self.idle_udp) {
                    Some(c) => c,
                    None => {
                        let c = farside_frontend::fmove::MoveClient::connect(fe)?;
                        match self.key {
                            Some(k) => c.with_key(k),
                            None => c,
                        }
                    }
                };
                c.move_flow(client, backend)?;
                Self::put_back(&self.idle_udp, c);
            }
            FrontendMove::Tcp => {
                let mut c = match Self::pooled(&self.idle_tcp) {
                    Some(c) => c,
                    None => {
                        let c = farside_frontend::control::Client::connect(self.addr)?;
                        match self.key {
                            Some(k) => c.with_key(k),
                            None => c,
                        }
                    }
                };
                c.move_flow(client, backend)?;
                Self::put_back(&self.idle_tcp, c);
            }
        }
        Ok(())
    }
}
