//! `farside specd`: the speculative-admission daemon of one back-end (both roles:
//! target of its peers' migrations, and with `--accept` source of its own).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farside_auth::keys::{load_key, KeyError, Policy};
use farside_migrate::wire::Auth;
use farside_migrate::Handover;

use crate::handoff::{HandOff, Handoff, HANDOFF_WAIT_MAX, PENDING_MAX};
use crate::source::{
    Affinity, Peer, SourceConfig, SourceDaemon, AFFINITY_WAIT_DEFAULT, MIGRATORS_DEFAULT,
};
use crate::steer::{FlowSteer, FrontendMove, FrontendSteer, NoSteer, PolicyRouteSteer};
use crate::summary::{rounded, to_line, ExitSummary};
use crate::target::{OfferRules, TargetConfig, TargetDaemon, TARGET_THREADS_DEFAULT};
use crate::window::{WindowConfig, QUEUE_DEFAULT, WINDOW_DEFAULT};

/// The target side's configuration: peers are allowed to connect from their daemon
/// and front-end (`backend=`) addresses; an offered connection's local address must
/// be the service (`--vip` if given, `--service-port`), its client neither loopback
/// nor a peer's or this daemon's address.
/// The systemd credential name of the migration key (`LoadCredential=NAME:PATH`).
pub const KEY_CREDENTIAL: &str = "specd-migration";

/// The migration protocol's authentication from `--key-file` or the credential
/// [`KEY_CREDENTIAL`]: `None` (with a warning) when neither is given; an error for a
/// key file that is missing, readable by others or not a random key.
pub fn load_auth(args: &SpecdArgs) -> Result<Option<Arc<Auth>>, String> {
    match load_key(KEY_CREDENTIAL, args.key_file.as_deref(), Policy::Production) {
        Ok(k) => {
            let auth = Auth::new(k.key);
            log::info!(
                "specd: migrations authenticated ({}, key id {:08x})",
                k.path.display(),
                auth.key_id().0
            );
            Ok(Some(Arc::new(auth)))
        }
        Err(KeyError::NotFound { .. }) if args.key_file.is_none() => {
            log::warn!(
                "specd: migration port unauthenticated: any host that reaches it can inject \
                 connections; pass --key-file"
            );
            Ok(None)
        }
        Err(e) => Err(format!("specd --key-file: {e}")),
    }
}

/// The systemd credential name of the front-end's MOVE key (as `farside frontend`).
pub const MOVE_KEY_CREDENTIAL: &str = "frontend-move";

/// The key that seals one-sided MOVEs, from `--frontend-key-file` or the credential
/// [`MOVE_KEY_CREDENTIAL`]; `None` when neither is given.
fn load_move_key(args: &SpecdArgs) -> Result<Option<farside_frontend::fmove::MoveKey>, String> {
    match load_key(
        MOVE_KEY_CREDENTIAL,
        args.frontend_key_file.as_deref(),
        Policy::Production,
    ) {
        Ok(k) => Ok(Some(farside_frontend::fmove::MoveKey {
            id: farside_auth::mac::KeyId(args.frontend_key_id),
            key: k.key,
        })),
        Err(KeyError::NotFound { .. }) if args.frontend_key_file.is_none() => Ok(None),
        Err(e) => Err(format!("specd --frontend-key-file: {e}")),
    }
}

pub fn target_config(args: &SpecdArgs, handoff: Handoff, auth: Option<Arc<Auth>>) -> TargetConfig {
    let mut allow: Vec<IpAddr> = Vec::new();
    for ip in args.peers.iter().flat_map(|p| [p.daemon.ip(), p.backend]) {
        if !allow.contains(&ip) {
            allow.push(ip);
        }
    }
    if allow.is_empty() {
        log::warn!("specd target: no --peer: migration offers from every host are refused");
    }
    let mut cluster = allow.clone();
    if !args.listen.ip().is_unspecified() && !cluster.contains(&args.listen.ip()) {
        cluster.push(args.listen.ip());
    }
    TargetConfig {
        listen: args.listen,
        server_port: args.server_port,
        admit_queue_max: args.admit_queue_max,
        handoff,
        threads: args.target_threads,
        peers: args.peers.iter().map(|p| p.daemon).collect(),
        allow,
        offers: OfferRules {
            service_ip: args.vip.map(IpAddr::V4),
            service_port: args.service_port.unwrap_or(args.server_port),
            cluster,
            loopback: false,
        },
        auth,
    }
}

/// Upper bound of the poll periods, µs: a window that learns its server's queue less
/// often than every second is not speculative admission any more.
pub const POLL_US_MAX: u64 = 1_000_000;

/// Command-line flags of `farside specd`.
#[derive(Debug, Clone, clap::Args)]
pub struct SpecdArgs {
    /// Migration listener (TCP) on the cluster network, where peers offer
    /// connections; peers' notifications arrive on the same address (UDP). Port 0
    /// picks one (logged).
    #[arg(long)]
    pub listen: SocketAddr,
    /// Port of the local web server's listener: its accept-queue length (read with
    /// sock_diag) is this node's load, for admitting offers and for the window.
    #[arg(long = "server-port")]
    pub server_port: u16,
    /// Hand restored and fallen-back connections to `farside backend --adopt-socket
    /// PATH` (fd passing).
    #[arg(
        long = "adopt-socket",
        conflicts_with = "relay",
        required_unless_present = "relay"
    )]
    pub adopt_socket: Option<PathBuf>,
    /// Hand connections to an unmodified server (nginx) at this local address
    /// through a relay (two threads and two copies per connection).
    #[arg(long)]
    pub relay: Option<SocketAddr>,
    /// Target role: refuse offers while the server's accept queue plus restores in
    /// progress plus restored connections waiting for the hand-off (the server's
    /// adoption queue was full) is at least this; also the most that may wait.
    /// Default: 64 (the paper's accept queue).
    #[arg(long = "admit-queue-max", default_value_t = QUEUE_DEFAULT)]
    pub admit_queue_max: u32,
    /// Threads serving offers. Default: 32 (one per migration a peer runs at once).
    #[arg(long = "target-threads", default_value_t = TARGET_THREADS_DEFAULT)]
    pub target_threads: usize,
    /// A peer back-end: `daemon=IP:PORT[,region=ENDPOINT][,backend=IP]` — its
    /// specd's --listen, its gatherd region read one-sidedly for its load (e.g.
    /// udp:10.0.0.2:7471, answered by XDP), and its address at the front-end
    /// (default: the daemon's IP). Repeat per peer. Refused sources among the peers
    /// are notified at their daemon address.
    #[arg(long = "peer", value_parser = Peer::parse)]
    pub peers: Vec<Peer>,
    /// The migration protocol's key: a file of 32 hex digits (`openssl rand -hex 16`),
    /// owned by specd's user, mode 0600 or 0400; the systemd credential
    /// `specd-migration` (`LoadCredential=`) is used first if present. Every
    /// migration message is then authenticated (wire version 3: every peer needs the
    /// same key). Without a key the migration port is unauthenticated (warned).
    #[arg(long = "key-file")]
    pub key_file: Option<PathBuf>,
    /// The front-end's MOVE key (`farside frontend --key-file`'s key: 32 hex digits,
    /// mode 0600 or 0400; the systemd credential `frontend-move` first if present):
    /// every one-sided MOVE is then sealed with it. Without it the MOVE goes unsealed,
    /// which a front-end given a key refuses.
    #[arg(long = "frontend-key-file")]
    pub frontend_key_file: Option<PathBuf>,
    /// The id of --frontend-key-file's key, as the front-end knows it
    /// (`farside frontend --key-id`).
    #[arg(long = "frontend-key-id", default_value_t = 1)]
    pub frontend_key_id: u32,
    /// Source role: the admission listener for speculatively admitted connections
    /// (e.g. 127.0.0.1:0; the sk_lookup program assigns the service's SYNs to it).
    /// Without it the daemon is a target only.
    #[arg(long)]
    pub accept: Option<SocketAddr>,
    /// Q: the server's accept-queue length at which new connections go to the
    /// admission window. Default: 64.
    #[arg(long, default_value_t = QUEUE_DEFAULT)]
    pub queue: u32,
    /// W: the admission window (migratory connections in flight at most). Default: 32.
    #[arg(long, default_value_t = WINDOW_DEFAULT)]
    pub window: u32,
    /// N: locally served requests after which a closed window reopens without a
    /// notification. Default: W.
    #[arg(long = "reopen-after")]
    pub reopen_after: Option<u32>,
    /// Service address steered by the sk_lookup program: the VIP (IPv4). Default:
    /// any local address.
    #[arg(long)]
    pub vip: Option<Ipv4Addr>,
    /// Service port steered by the sk_lookup program. Default: --server-port.
    #[arg(long = "service-port")]
    pub service_port: Option<u16>,
    /// Do not attach the sk_lookup program (connections reach --accept otherwise).
    #[arg(long = "no-steer")]
    pub no_steer: bool,
    /// Migration threads: each accepts on the admission listener and migrates what it
    /// accepted, so this bounds the migrations in flight. Default: 32.
    #[arg(long, default_value_t = MIGRATORS_DEFAULT)]
    pub migrators: usize,
    /// Poll period of the server's accept queue, µs. In the kernel steering mode (the
    /// sk_lookup program reads the server's queue per SYN) the daemon polls only while
    /// its window is closed (to count locally served requests); in the poll mode
    /// (fallback, logged) it also sets the steering flag every period. Default: 5000
    /// (see `source::POLL_DEFAULT`).
    #[arg(long = "poll-us", default_value_t = crate::source::POLL_DEFAULT.as_micros() as u64)]
    pub poll_us: u64,
    /// Steer by polling (the daemon sets the program's divert flag every --poll-us)
    /// even where the kernel mode (the program reads the server's queue per SYN) is
    /// possible: for comparisons. Default: the kernel mode when it can be set up.
    #[arg(long = "poll-steer")]
    pub poll_steer: bool,
    /// Kernel steering mode: what a SYN meets when the server's established
    /// connections are at --queue and the window has no room. `queue` (default): the
    /// server's listener, where it waits in the server's own backlog for a worker.
    /// `drop`: dropped silently, as the kernel drops a SYN at a full accept queue (the
    /// paper's queue is Q once its window is shut); the client retransmits it after
    /// 1 s, then 3 s. Half-open connections never make it drop (a SYN flood cannot).
    #[arg(long = "no-room", value_enum, default_value_t = crate::window::NoRoom::Queue)]
    pub no_room: crate::window::NoRoom,
    /// A peer's load is read from its region when a migration chooses its target;
    /// a load read less than this many µs ago is reused. Default: 5000.
    #[arg(long = "peer-poll-us", default_value_t = 5000)]
    pub peer_poll_us: u64,
    /// Source and targets share one network namespace (tests, one host): close the
    /// source socket before the target restores (the 4-tuple would collide), and
    /// hold the flow meanwhile (an sk_lookup program drops the client's segments
    /// instead of the listener resetting them; needs CAP_BPF).
    #[arg(long = "same-netns")]
    pub same_netns: bool,
    /// Test front-end: move each migrated flow with a policy rule in this network
    /// namespace (the client's), by the tables of --flow-table. Default: no
    /// front-end flow to move (the eBPF front-end's control client replaces this).
    #[arg(
        long = "flow-netns",
        requires = "flow_tables",
        conflicts_with = "frontend"
    )]
    pub flow_netns: Option<String>,
    /// The eBPF front-end's control address (`farside frontend --control ADDR`): every
    /// migrated flow is moved there after the restore, per --frontend-move.
    #[arg(long)]
    pub frontend: Option<SocketAddr>,
    /// How --frontend moves a flow: `udp`, the one-sided MOVE (one datagram to the
    /// same IP and port number, answered by the front-end's tc program in the kernel;
    /// sent from this host's address toward the front-end, which must be this
    /// back-end's --backend IP there), or `tcp`, `MOVE client backend` on the control
    /// port (answered by the front-end process).
    #[arg(long = "frontend-move", value_enum, default_value_t = FrontendMove::Udp)]
    pub frontend_move: FrontendMove,
    /// With --flow-netns: `BACKEND_IP=TABLE`, the routing table that reaches that
    /// back-end. Repeat per peer.
    #[arg(long = "flow-table", value_parser = parse_flow_table)]
    pub flow_tables: Vec<(IpAddr, u32)>,
    /// Stop after this many seconds. Default: run until SIGTERM/SIGINT.
    #[arg(long = "duration-s")]
    pub duration_s: Option<f64>,
    /// Write the exit summary (JSON: window, migrations, migration time and CPU
    /// percentiles, target counters) to this file too.
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// With --summary: rewrite that file every this many seconds while the daemon
    /// runs (atomically: a temporary file renamed over it), so a monitor can follow
    /// its counters live. Default: only at exit.
    #[arg(long = "summary-every-s")]
    pub summary_every_s: Option<f64>,
    /// Write one JSON line per step specd takes with a client's connection (the
    /// window's decision, migrated or fell back, the hand-off to the local server:
    /// passed at once or after how long a wait, closed and why) to this file, so a
    /// client's odd connection can be matched by its address and port. For labs and
    /// debugging; at most 1,000,000 lines. Default: none.
    #[arg(long = "conn-trace")]
    pub conn_trace: Option<PathBuf>,
    /// Read the peers' load one-sidedly (their `region=`) before offering: while every
    /// peer is full (backlog plus migrations in flight ≥ --queue) a migratory arrival
    /// stays local and the window closes as on a refusal, with no dump or offer spent;
    /// while closed, a peer whose load leaves room for a whole window reopens it. Off
    /// by default (see `source::SourceConfig::gate_on_peer_load`).
    #[arg(long = "gate-peer-load")]
    pub gate_peer_load: bool,
    /// Content-aware migration: with several peers, send requests for the same path
    /// to the same peer (the request line is peeked, it moves with the connection),
    /// unless that peer's known load says it is full (--admit-queue-max); then the
    /// least-loaded peer.
    #[arg(long)]
    pub affinity: bool,
    /// With --affinity: how long a migrator waits for the request line, µs.
    /// Default: 2000.
    #[arg(long = "affinity-wait-us", default_value_t = AFFINITY_WAIT_DEFAULT.as_micros() as u64)]
    pub affinity_wait_us: u64,
    /// Nice value of every daemon thread (-20..=19; inherited by the threads started
    /// after it is set). Default: -10 (see [`NICE_DEFAULT`]); 0 leaves it unchanged.
    #[arg(long, default_value_t = NICE_DEFAULT, allow_hyphen_values = true)]
    pub nice: i32,
}

/// Default nice value of the daemon: -10. specd runs beside the web server it relieves,
/// on the same CPUs (in the lab, in the same CPU quota), and its work per connection
/// (a dump, an offer, a restore: ~0.5 ms of CPU) sits on the path of a connection that
/// is waiting. At nice 0 a migrator thread gets one share among the server's saturated
/// workers, so a migration waited for CPU for most of a second (lab, 8 workers in 20 %
/// of a CPU: p50 0.9 s); at -10 a runnable daemon thread weighs 9,548 against a nice-0
/// worker's 1,024 and runs within the next scheduling slice. It still spends the node's
/// CPU: what the daemon uses the server does not get.
pub const NICE_DEFAULT: i32 = -10;

fn parse_flow_table(s: &str) -> Result<(IpAddr, u32), String> {
    let (ip, t) = s
        .split_once('=')
        .ok_or_else(|| format!("--flow-table `{s}`: expected BACKEND_IP=TABLE"))?;
    Ok((
        ip.parse().map_err(|e| format!("--flow-table `{s}`: {e}"))?,
        t.parse().map_err(|e| format!("--flow-table `{s}`: {e}"))?,
    ))
}

impl SpecdArgs {
    fn window_config(&self) -> WindowConfig {
        WindowConfig {
            queue: self.queue,
            window: self.window,
            reopen_after: self.reopen_after.unwrap_or(self.window),
        }
    }

    /// Checks every bound; the message names the flag.
    pub fn validate(&self) -> Result<(), String> {
        self.window_config().validate()?;
        if self.accept.is_some() && self.peers.is_empty() {
            return Err("--accept needs at least one --peer to migrate to".into());
        }
        for (name, us) in [
            ("--poll-us", self.poll_us),
            ("--peer-poll-us", self.peer_poll_us),
        ] {
            if us == 0 || us > POLL_US_MAX {
                return Err(format!("{name} must be in 1..={POLL_US_MAX}"));
            }
        }
        if self.affinity_wait_us > POLL_US_MAX {
            return Err(format!("--affinity-wait-us must be at most {POLL_US_MAX}"));
        }
        if !(-20..=19).contains(&self.nice) {
            return Err(format!("--nice {}: must be in -20..=19", self.nice));
        }
        if let Some(d) = self.duration_s {
            if !(d > 0.0 && d.is_finite()) {
                return Err("--duration-s must be positive".into());
            }
        }
        if let Some(e) = self.summary_every_s {
            if self.summary.is_none() {
                return Err("--summary-every-s needs --summary".into());
            }
            if !(SUMMARY_EVERY_MIN_S..=SUMMARY_EVERY_MAX_S).contains(&e) {
                return Err(format!(
                    "--summary-every-s must be in {SUMMARY_EVERY_MIN_S}..={SUMMARY_EVERY_MAX_S}"
                ));
            }
        }
        if let (Some(fe), FrontendMove::Udp) = (self.frontend, self.frontend_move) {
            if !fe.is_ipv4() || fe.ip().is_unspecified() || fe.port() == 0 {
                return Err(format!(
                    "--frontend {fe}: the one-sided MOVE (--frontend-move udp) needs the \
                     front-end's IPv4 address and port"
                ));
            }
        }
        Ok(())
    }
}

/// Runs the daemon until SIGTERM/SIGINT or `--duration-s`, then prints the summary.
/// Blocks SIGTERM and SIGINT in the calling thread first (call before other threads
/// exist).
pub fn run(args: SpecdArgs) -> Result<(), String> {
    args.validate()?;
    // SAFETY: plain libc signal-set manipulation on a local sigset_t.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let handoff = match (&args.adopt_socket, args.relay) {
        (Some(p), _) => Handoff::Adopt(p.clone()),
        (None, Some(a)) => Handoff::Relay(a),
        (None, None) => return Err("--adopt-socket or --relay is required".into()),
    };
    if args.nice != 0 {
        // Before any thread is started: Linux threads inherit their creator's nice.
        // SAFETY: setpriority on the calling thread (id 0) takes plain integers.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, args.nice) } == 0 {
            log::info!("specd: threads at nice {}", args.nice);
        } else {
            log::warn!(
                "specd: --nice {}: {}; running at the default priority",
                args.nice,
                std::io::Error::last_os_error()
            );
        }
    }
    if let Some(p) = &args.conn_trace {
        crate::trace::install(p).map_err(|e| format!("specd: {e}"))?;
    }
    let t0 = Instant::now();
    let auth = load_auth(&args)?;
    let target = TargetDaemon::start(target_config(&args, handoff.clone(), auth.clone()))
        .map_err(|e| format!("specd target: {e}"))?;
    let source = match args.accept {
        Some(accept) => {
            let flow: Box<dyn FlowSteer> = match (&args.flow_netns, args.frontend) {
                (Some(ns), _) => Box::new(PolicyRouteSteer {
                    netns: ns.clone(),
                    tables: args.flow_tables.clone(),
                }),
                (None, Some(fe)) => {
                    log::info!(
                        "specd: migrated flows moved at the front-end {fe} ({})",
                        match args.frontend_move {
                            FrontendMove::Udp =>
                                "one-sided MOVE over UDP, answered by its tc program",
                            FrontendMove::Tcp => "MOVE on its control port, TCP",
                        }
                    );
                    let mut steer = FrontendSteer::new(fe, args.frontend_move);
                    if let Some(key) = load_move_key(&args)? {
                        steer = steer.with_key(key);
                    }
                    Box::new(steer)
                }
                (None, None) => Box::new(NoSteer),
            };
            // The local server's share of the paper's enlarged accept queue: Q + W
            // connections may wait for it (fall-backs and stale diverts).
            let local = HandOff::with_bounds(
                handoff,
                (args.queue as usize + args.window as usize).clamp(1, PENDING_MAX),
                HANDOFF_WAIT_MAX,
            )
            .map_err(|e| format!("specd: {e}"))?;
            Some(
                SourceDaemon::start(
                    SourceConfig {
                        accept,
                        notify: target.addr(),
                        window: args.window_config(),
                        server_port: args.server_port,
                        steer: (!args.no_steer)
                            .then_some((args.vip, args.service_port.unwrap_or(args.server_port))),
                        peers: args.peers.clone(),
                        migrators: args.migrators,
                        poll: Duration::from_micros(args.poll_us),
                        poll_steer: args.poll_steer,
                        no_room: args.no_room,
                        peer_poll: Duration::from_micros(args.peer_poll_us),
                        handover: if args.same_netns {
                            Handover::CloseBeforeRestore
                        } else {
                            Handover::CloseAfterRestore
                        },
                        gate_on_peer_load: args.gate_peer_load,
                        auth,
                        // As a peer's `backend=` defaults to its daemon's address.
                        own_backend: Some(args.listen.ip()).filter(|ip| !ip.is_unspecified()),
                        affinity: args.affinity.then(|| Affinity {
                            wait: Duration::from_micros(args.affinity_wait_us),
                            full_at: u64::from(args.admit_queue_max),
                        }),
                    },
                    local,
                    flow,
                )
                .map_err(|e| format!("specd source: {e}"))?,
            )
        }
        None => None,
    };
    log::info!(
        "specd: migrations on {}{}",
        target.addr(),
        source
            .as_ref()
            .map(|s| format!(", admission listener {}", s.accept_addr()))
            .unwrap_or_default()
    );
    let current = || {
        to_line(&ExitSummary {
            wall_s: rounded(t0.elapsed().as_secs_f64(), 3),
            process_cpu_ms: rounded(process_cpu_ms(), 1),
            source: source.as_ref().map(|s| s.summary()),
            target: target.summary(),
        })
    };
    let limit = args.duration_s.map(Duration::from_secs_f64);
    match (&args.summary, args.summary_every_s) {
        (Some(path), Some(every)) => {
            let every = Duration::from_secs_f64(every);
            loop {
                let left = limit.map(|l| l.saturating_sub(t0.elapsed()));
                let step = left.map_or(every, |l| l.min(every));
                if wait_for_signal(&set, Some(step)) || left.is_some_and(|l| l <= every) {
                    break;
                }
                if let Err(e) = write_atomically(path, &current()) {
                    log::warn!("specd: --summary-every-s: {}: {e}", path.display());
                }
            }
        }
        _ => {
            wait_for_signal(&set, limit);
        }
    }
    let summary = current();
    if let Some(s) = source {
        s.stop();
    }
    target.stop();
    println!("{summary}");
    if let Some(path) = &args.summary {
        std::fs::write(path, format!("{summary}\n"))
            .map_err(|e| format!("--summary {}: {e}", path.display()))?;
    }
    Ok(())
}

/// CPU time (user + system) of the whole daemon so far, ms: what it cost its node,
/// migrations, polls and notifications together.
fn process_cpu_ms() -> f64 {
    // SAFETY: getrusage writes one rusage struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

/// Shortest and longest period of `--summary-every-s`: a tenth of a second (the
/// summary sorts its samples, a few ms of CPU) to an hour.
const SUMMARY_EVERY_MIN_S: f64 = 0.1;
const SUMMARY_EVERY_MAX_S: f64 = 3600.0;

/// Write `line` to `path` through a temporary file beside it, renamed over it, so a
/// reader sees the old summary or the new one, never a part.
fn write_atomically(path: &std::path::Path, line: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, format!("{line}\n"))?;
    std::fs::rename(&tmp, path)
}

/// Waits for SIGTERM/SIGINT, at most `limit`: whether a signal came.
fn wait_for_signal(set: &libc::sigset_t, limit: Option<Duration>) -> bool {
    match limit {
        None => {
            let mut sig = 0;
            // SAFETY: `set` is initialised; sigwait writes one int.
            unsafe { libc::sigwait(set, &mut sig) };
            true
        }
        Some(d) => {
            let ts = libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            };
            // SAFETY: valid set and timespec; no siginfo wanted.
            unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) > 0 }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: SpecdArgs,
    }

    fn parse(args: &str) -> Result<SpecdArgs, String> {
        Cli::try_parse_from(std::iter::once("specd").chain(args.split_whitespace()))
            .map(|c| c.a)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_target_allows_its_peers_and_takes_offers_for_the_service_only() {
        let a = parse(
            "--listen 10.0.0.1:7000 --server-port 8080 --adopt-socket /run/a.sock \
             --vip 10.0.0.100 --service-port 80 \
             --peer daemon=10.0.0.2:7000,backend=10.0.1.2 --peer daemon=10.0.0.3:7000",
        )
        .unwrap();
        let c = target_config(&a, Handoff::Adopt("/run/a.sock".into()), None);
        let ips = |v: &[&str]| {
            v.iter()
                .map(|a| a.parse().unwrap())
                .collect::<Vec<IpAddr>>()
        };
        assert_eq!(c.allow, ips(&["10.0.0.2", "10.0.1.2", "10.0.0.3"]));
        assert_eq!(
            c.offers,
            OfferRules {
                service_ip: Some("10.0.0.100".parse().unwrap()),
                service_port: 80,
                cluster: ips(&["10.0.0.2", "10.0.1.2", "10.0.0.3", "10.0.0.1"]),
                loopback: false,
            }
        );
    }

    #[test]
    fn a_key_file_others_may_read_is_refused_and_none_warns_only() {
        let dir = std::env::temp_dir().join(format!("specd-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key");
        std::fs::write(&key, "3f9a1c0e5b7d2468acf0e1d2c3b4a596\n").unwrap();
        let base = "--listen 10.0.0.1:7000 --server-port 80 --adopt-socket /a";
        let with_key = |mode: u32| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
            let a = parse(&format!("{base} --key-file {}", key.display())).unwrap();
            load_auth(&a)
        };
        assert!(with_key(0o644).unwrap_err().contains("--key-file"));
        let auth = with_key(0o600).unwrap().expect("a key");
        assert_eq!(
            auth.key_id(),
            Auth::key_id_of(&farside_auth::siphash::SipKey::from_bytes([
                0x3f, 0x9a, 0x1c, 0x0e, 0x5b, 0x7d, 0x24, 0x68, 0xac, 0xf0, 0xe1, 0xd2, 0xc3, 0xb4,
                0xa5, 0x96
            ]))
        );
        let missing = parse(&format!("{base} --key-file {}", dir.join("none").display())).unwrap();
        assert!(load_auth(&missing).is_err(), "a named key file must exist");
        if std::env::var_os(farside_auth::keys::CREDENTIALS_DIRECTORY).is_none() {
            assert!(load_auth(&parse(base).unwrap()).unwrap().is_none());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn flags_parse_and_bad_ones_are_refused() {
        let a = parse(
            "--listen 10.0.0.1:7000 --server-port 80 --adopt-socket /run/a.sock \
             --accept 127.0.0.1:0 --peer daemon=10.0.0.2:7000,region=udp:10.0.0.2:7471 \
             --window 50 --flow-netns c --flow-table 10.0.0.2=102",
        )
        .unwrap();
        a.validate().unwrap();
        assert_eq!(a.window_config(), WindowConfig::new(64, 50));
        assert_eq!(a.flow_tables, vec![("10.0.0.2".parse().unwrap(), 102)]);
        // One hand-off, exactly.
        assert!(parse("--listen 10.0.0.1:7000 --server-port 80").is_err());
        assert!(parse(
            "--listen 10.0.0.1:7000 --server-port 80 --adopt-socket /a --relay 127.0.0.1:80"
        )
        .is_err());
        // A source needs a peer.
        let a = parse(
            "--listen 10.0.0.1:7000 --server-port 80 --relay 127.0.0.1:80 --accept 127.0.0.1:0",
        )
        .unwrap();
        assert!(a.validate().is_err());
        let a = parse("--listen 10.0.0.1:7000 --server-port 80 --relay 127.0.0.1:80 --poll-us 0")
            .unwrap();
        assert!(a.validate().is_err());
        assert!(parse("--listen x --server-port 80 --relay 127.0.0.1:80").is_err());
        assert!(parse(
            "--listen 1.2.3.4:5 --server-port 80 --relay 127.0.0.1:80 --flow-table nope"
        )
        .is_err());
    }

    #[test]
    fn no_room_defaults_to_the_servers_queue_and_takes_drop() {
        use crate::window::NoRoom;
        let base = "--listen 10.0.0.1:7000 --server-port 80 --relay 127.0.0.1:80";
        assert_eq!(parse(base).unwrap().no_room, NoRoom::Queue);
        let a = parse(&format!("{base} --no-room drop")).unwrap();
        assert_eq!(a.no_room, NoRoom::Drop);
        let e = parse(&format!("{base} --no-room reset"))
            .map(drop)
            .unwrap_err();
        assert!(e.contains("queue") && e.contains("drop"), "{e}");
    }

    #[test]
    fn frontend_move_defaults_to_the_one_sided_udp_and_checks_the_address() {
        let base = "--listen 10.0.0.1:7000 --server-port 80 --relay 127.0.0.1:80";
        let a = parse(&format!("{base} --frontend 10.0.0.9:7400")).unwrap();
        assert_eq!(a.frontend_move, FrontendMove::Udp);
        a.validate().unwrap();
        let a = parse(&format!(
            "{base} --frontend 10.0.0.9:7400 --frontend-move tcp"
        ))
        .unwrap();
        assert_eq!(a.frontend_move, FrontendMove::Tcp);
        a.validate().unwrap();
        let e = parse(&format!("{base} --frontend [::1]:7400"))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.contains("--frontend-move udp"), "{e}");
        parse(&format!("{base} --frontend [::1]:7400 --frontend-move tcp"))
            .unwrap()
            .validate()
            .unwrap();
        let e = parse(&format!(
            "{base} --frontend 10.0.0.9:7400 --frontend-move ssh"
        ))
        .map(drop)
        .unwrap_err();
        assert!(e.contains("udp") && e.contains("tcp"), "{e}");
    }
}
