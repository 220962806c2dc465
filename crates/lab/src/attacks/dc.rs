//! The data-center under attack, and one attack's measurement window.
//!
//! Nodes (one namespace each, one bridge: the lab's fabric has one segment, so the
//! "client network" and the "cluster network" are the same L2 segment and the two
//! attackers differ by where they stand and what they do, not by wiring):
//!
//! ```text
//! client ── legitimate load: farside loadgen (keep-alive) to the VIP and to the proxy,
//!           plus victim connections held open and used all along the window
//! fe     ── farside frontend: the VIP, control on tcp 7401 with every line sealed by
//!           the run's key (the lab's operator requests come from px), one-sided MOVE on
//!           udp 7400 sealed with the same key
//! b0, b1 ── farside backend (adopts migrated connections), farside gatherd (region over
//!           udp answered by XDP, read key + read-write key, group READs), farside specd
//!           (source and target, each other's peer, authenticated wire, MOVEs to fe)
//! px     ── farside proxy: port 8080 in front of b0 and b1, its monitor reading their
//!           regions with the read key; the host of the reconfiguration balancer, whose
//!           role-word operations the lab performs with the read-write key
//! atk    ── attacker on the cluster side: the bridge mirrors b0's and px's frames to
//!           its port (tc mirred), as a shared segment would show them
//! atkc   ── attacker on the client side: raw sockets, any source address
//! ```
//!
//! Every daemon runs with the product's defaults apart from addresses, ports, keys and
//! what the experiment needs to run on one machine (CPU quota and per-request cost on
//! the back-ends, so a burst makes specd migrate connections the attacker can capture).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::LabError;
use crate::fabric::keys::{LabKeys, RmemLabKeys};
use crate::fabric::netns::{NodeSpec, VirtualDc};
use crate::fabric::procs::Child;
use crate::speculative::{specd_args, SpecdFiles, MIGRATION_KEY, MOVE_KEY};

/// Node names.
pub const CLIENT: &str = "client";
pub const FE: &str = "fe";
pub const B0: &str = "b0";
pub const B1: &str = "b1";
pub const PX: &str = "px";
/// The attacker on the cluster side (sees b0's and px's frames).
pub const ATK: &str = "atk";
/// The attacker on the client side.
pub const ATKC: &str = "atkc";
/// The back-ends, in `--backend` order.
pub const BACKENDS: [&str; 2] = [B0, B1];
/// The nodes whose processes defend (their CPU is `defender_cpu_ms`).
pub const DEFENDERS: [&str; 4] = [FE, B0, B1, PX];

/// The service's virtual address (outside the lab's subnet; routed to `fe`).
pub const VIP: SocketAddrV4 = crate::speculative::VIP;
/// The proxy's public data port.
pub const PROXY_PORT: u16 = 8080;
/// The front-end's one-sided MOVE port (udp, on fe's address).
pub const MOVE_PORT: u16 = 7400;
/// The front-end's control port (tcp, on fe's address; every line sealed).
pub const CONTROL_PORT: u16 = 7401;
/// The key id of the front-end's key (its `--key-id` default).
pub const FE_KEY_ID: u32 = 1;
/// The lab operator's wait for a control reply.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait, before a window, for the tier to be quiet (no request queued or in
/// service at the back-ends, no connection at the proxy, no migration in flight): what
/// the previous window or the capture burst left must not be counted against the next
/// window (a burst past capacity leaves connections queued and migrations in flight
/// for a few seconds).
pub const SETTLE_MAX: Duration = Duration::from_secs(10);
/// specd's migration port on every back-end.
pub const SPECD_PORT: u16 = crate::speculative::SPECD_PORT;
/// gatherd's region port (udp, answered by XDP).
pub const REGION_PORT: u16 = crate::speculative::REGION_UDP_PORT;
/// gatherd's tcp region port (the lab waits on it).
const GATHERD_TCP_PORT: u16 = 7472;
/// The multicast group gatherd answers group READs on.
pub const GROUP: Ipv4Addr = Ipv4Addr::new(239, 77, 0, 1);
/// The routing split of new flows b0/b1 (the paper's 75/25: b0 is the busier).
pub const WEIGHTS: [u32; 2] = [75, 25];
/// specd's admission window (the paper's spec32).
const SPEC_WINDOW: u32 = 32;
/// Each back-end's CPU quota, percent of one CPU, and per-request cost, µs: about 190
/// requests/s a node (lab speculative's defaults), so the capture burst overloads b0.
const NODE_CPU_PCT: u32 = 20;
const CPU_US_PER_REQUEST: u32 = 1000;
/// Web-server workers and accept queue on each back-end (lab speculative's acc64).
const BACKEND_WORKERS: u32 = 16;
const BACKLOG: u32 = 64;
/// The page every request asks for, and its size.
pub const FILE_PATH: &str = "/index.html";
const FILE_BYTES: usize = 4096;
/// Longest wait for a daemon to be ready.
const READY_MAX: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(20);
/// What specd logs once its listeners are up.
const SPECD_READY: &str = "specd: migrations on";

/// Legitimate load during a window: closed-loop keep-alive users to the VIP and to the
/// proxy, each thinking between requests, well under the tier's capacity (~380
/// requests/s over both back-ends), so a baseline window loses nothing and every
/// failure in an attack window is the attack's.
const LEGIT_VIP_USERS: usize = 4;
const LEGIT_PROXY_USERS: usize = 2;
const LEGIT_THINK_MS: u64 = 25;
/// Requests per keep-alive connection of the load before it opens a new one.
const LEGIT_SESSION_REQUESTS: u32 = 50;
/// The legitimate clients' timeout per request, ms.
const LEGIT_TIMEOUT_MS: u64 = 3000;
/// Victim connections held open through a window (to the VIP and to the proxy), each
/// sending a request every [`VICTIM_PERIOD`]: a connection broken by an attack is
/// seen within one period.
pub const VICTIMS_VIP: usize = 8;
const VICTIMS_PROXY: usize = 4;
const VICTIM_PERIOD: Duration = Duration::from_millis(200);
/// A victim's bound per request.
const VICTIM_TIMEOUT: Duration = Duration::from_secs(3);
/// When an attack starts after its window's load (the victims connect first).
const ATTACK_LEAD: Duration = Duration::from_millis(500);

/// One attack's legitimate traffic and the defenders' CPU over its window.
#[derive(Clone, Debug, Default)]
pub struct Collateral {
    /// Requests that failed: the loadgens' failures and the victims' failed requests.
    pub failed_requests: u64,
    /// Connections lost: victims broken and the loadgens' connections broken by I/O
    /// errors or timeouts mid-request.
    pub lost_connections: u64,
    /// Requests served to the legitimate clients in the window.
    pub served: u64,
    /// CPU of the defending processes (fe, b0, b1, px) in the window, ms.
    pub defender_cpu_ms: f64,
    /// Softirq time of the whole machine in the window, ms (the attacker's sending
    /// included: the lab cannot attribute it).
    pub softirq_ms: f64,
    /// The window's length, s.
    pub window_s: f64,
    /// Whether the tier was quiet when the window opened ([`Dc::settle`]), and how
    /// long that took from what.
    pub started_quiet: bool,
    pub settle: String,
}

/// The running data-center.
pub struct Dc {
    pub dc: VirtualDc,
    pub logs: PathBuf,
    pub exe: PathBuf,
    pub keys: LabKeys,
    /// The run's rmem keys (random, files 0600 in a temp dir): gatherd holds both
    /// (`--rmem-key reader:..`, `balancer:..`), the proxy's monitor the reader key, the
    /// lab's balancer the balancer key.
    pub rkeys: RmemLabKeys,
    /// The front-end's control port (tcp, sealed lines).
    pub fe_control: SocketAddr,
    /// The lab operator's control key, envelope sender id and last sequence.
    fe_key: farside_auth::siphash::SipKey,
    fe_sender: u64,
    fe_seq: AtomicU64,
    /// b0's and b1's MAC on the segment.
    pub macs: Vec<String>,
    adopt: Vec<PathBuf>,
    /// Every daemon, stopped on drop (specd first).
    specds: Vec<Child>,
    children: Vec<Child>,
    /// Defenders' CPU per second of legitimate load alone (ms/s, softirq ms/s).
    baseline: Option<(f64, f64)>,
    front: Option<Vec<usize>>,
    /// specd's `--queue`.
    queue: u32,
}

pub(crate) fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn ip_cmd(args: &[&str]) -> io::Result<String> {
    let out = std::process::Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(LabError::Command {
            what: format!("ip {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Dc {
    /// Build the namespaces and start every daemon; `exe` is the `farside` binary.
    pub fn start(dir: &Path, exe: &Path) -> io::Result<Dc> {
        Dc::start_with_queue(dir, exe, crate::speculative::BASE_ACCEPT_QUEUE)
    }

    /// [`Dc::start`] with specd's `--queue` (the server backlog at which it migrates)
    /// set to `queue`.
    pub fn start_with_queue(dir: &Path, exe: &Path, queue: u32) -> io::Result<Dc> {
        let tiers = crate::fabric::procs::Tiers::of(&crate::fabric::procs::allowed_cpus());
        let front = tiers.as_ref().map(|t| t.front.as_slice());
        let back = tiers.as_ref().map(|t| t.back.as_slice());
        let mut specs: Vec<NodeSpec> = [CLIENT, FE, PX, ATK, ATKC]
            .iter()
            .map(|n| NodeSpec::new(n).pinned(front))
            .collect();
        specs.extend(
            BACKENDS
                .iter()
                .map(|n| NodeSpec::new(n).pinned(back).cpu_quota_pct(NODE_CPU_PCT)),
        );
        let dc = VirtualDc::create(&format!("a{}", std::process::id() % 100_000), &specs)?;
        let id = dc.run_id().to_string();
        crate::fabric::procs::on_interrupt(move || {
            if let Ok(r) = crate::fabric::netns::clean_run_id(&id) {
                eprint!("{r}");
            }
        });
        let vip = format!("{}/32", VIP.ip());
        let mut macs = Vec::new();
        for n in BACKENDS {
            let ns = dc.netns_name(n);
            ip_cmd(&["-n", &ns, "addr", "add", &vip, "dev", "lo"])?;
            dc.set_sysctl(n, "net/ipv4/conf/all/arp_ignore", "1")?;
            dc.set_sysctl(n, "net/ipv4/conf/all/arp_announce", "2")?;
            let link = ip_cmd(&["-n", &ns, "-o", "link", "show", "eth0"])?;
            macs.push(
                crate::speculative::mac_of(&link).ok_or_else(|| LabError::NoMac {
                    node: n.to_string(),
                    link: link.clone(),
                })?,
            );
        }
        let fe_ip = dc.node_ip(FE).to_string();
        for n in [CLIENT, ATKC, ATK] {
            ip_cmd(&["-n", &dc.netns_name(n), "route", "add", &vip, "via", &fe_ip])?;
        }
        // Multicast (the group READ) leaves the attackers' eth0.
        for n in [ATK, ATKC] {
            ip_cmd(&[
                "-n",
                &dc.netns_name(n),
                "route",
                "add",
                "224.0.0.0/4",
                "dev",
                "eth0",
            ])?;
        }
        let logs = dir.join("logs");
        let docroot = dir.join("docroot");
        std::fs::create_dir_all(&logs)?;
        std::fs::create_dir_all(&docroot)?;
        let mut body = b"<html><body>farside lab attacks: a 4 KB page\n".to_vec();
        body.resize(FILE_BYTES - 15, b'.');
        body.extend_from_slice(b"\n</body></html>");
        std::fs::write(docroot.join(FILE_PATH.trim_start_matches('/')), body)?;
        let run = dc.run_id().to_string();
        // Unix socket paths are short (108 bytes): in the temp dir, not under --out.
        let tmp = std::env::temp_dir();
        let keys = LabKeys::generate(&[MIGRATION_KEY, MOVE_KEY])?;
        let fe_key = farside_auth::keys::load_key_from(
            None,
            MOVE_KEY,
            Some(&keys.path(MOVE_KEY)),
            farside_auth::keys::Policy::Production,
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() },
        )
        .map_err(|e| io::Error::other(format!("the front-end's key: {e}")))?
        .key;
        let mut me = Dc {
            fe_control: SocketAddr::new(dc.node_ip(FE).into(), CONTROL_PORT),
            dc,
            logs,
            exe: exe.to_path_buf(),
            keys,
            rkeys: RmemLabKeys::generate()?,
            fe_key,
            fe_sender: u64::from(std::process::id()) << 32 | 0xfe,
            fe_seq: AtomicU64::new(0),
            macs,
            adopt: BACKENDS
                .iter()
                .map(|b| tmp.join(format!("farside-{run}-{b}-adopt.sock")))
                .collect(),
            specds: Vec::new(),
            children: Vec::new(),
            baseline: None,
            front: tiers.map(|t| t.front),
            queue,
        };
        for i in 0..BACKENDS.len() {
            me.start_backend(i, &docroot)?;
            me.start_gatherd(i)?;
        }
        me.start_frontend()?;
        for i in 0..BACKENDS.len() {
            me.start_specd(i)?;
        }
        me.start_proxy()?;
        Ok(me)
    }

    fn spawn(&self, node: &str, name: &str, args: &[String]) -> io::Result<Child> {
        let log = self.logs.join(format!("{name}.log"));
        let c = self.dc.spawn_in(node, &self.exe, args, &log)?;
        Ok(Child::adopt(name, c, log))
    }

    fn wait_port(&self, c: &mut Child, addr: SocketAddr) -> io::Result<()> {
        crate::fabric::wait_port(
            c,
            addr,
            crate::fabric::Vantage::Node(&self.dc, CLIENT),
            READY_MAX,
            POLL,
        )
    }

    fn start_backend(&mut self, i: usize, docroot: &Path) -> io::Result<()> {
        let node = BACKENDS[i];
        let args = strings(&[
            "backend",
            "--listen",
            "0.0.0.0:80",
            "--root",
            &docroot.display().to_string(),
            "--workers",
            &BACKEND_WORKERS.to_string(),
            "--backlog",
            &BACKLOG.to_string(),
            "--cpu-us-per-request",
            &CPU_US_PER_REQUEST.to_string(),
            "--adopt-socket",
            &self.adopt[i].display().to_string(),
        ]);
        let mut c = self.spawn(node, &format!("backend-{node}"), &args)?;
        self.wait_port(&mut c, SocketAddr::new(self.dc.node_ip(node).into(), 80))?;
        self.children.push(c);
        Ok(())
    }

    fn start_gatherd(&mut self, i: usize) -> io::Result<()> {
        let node = BACKENDS[i];
        let ip = self.dc.node_ip(node);
        let tcp = SocketAddr::new(ip.into(), GATHERD_TCP_PORT);
        let args = strings(&[
            "gatherd",
            "--node-id",
            &i.to_string(),
            "--watch-port",
            &VIP.port().to_string(),
            "--no-shm",
            "--tcp-listen",
            &tcp.to_string(),
            "--udp-listen",
            &format!("0.0.0.0:{REGION_PORT}"),
            "--xdp-iface",
            "eth0",
            "--xdp-mode",
            "generic",
            "--group-read",
            &GROUP.to_string(),
        ]);
        let mut args = args;
        args.extend(self.rkeys.gatherd_args());
        let mut c = self.spawn(node, &format!("gatherd-{node}"), &args)?;
        self.wait_port(&mut c, tcp)?;
        self.children.push(c);
        Ok(())
    }

    fn start_frontend(&mut self) -> io::Result<()> {
        let mut args = strings(&[
            "frontend",
            "--iface",
            "eth0",
            "--vip",
            &VIP.to_string(),
            "--control",
            &self.fe_control.to_string(),
            "--move-udp-port",
            &MOVE_PORT.to_string(),
            "--key-file",
            &self.keys.path(MOVE_KEY).display().to_string(),
        ]);
        for (i, w) in WEIGHTS.iter().enumerate() {
            args.push("--backend".into());
            args.push(format!(
                "{}@{}={w}",
                self.macs[i],
                self.dc.node_ip(BACKENDS[i])
            ));
        }
        let mut c = self.spawn(FE, "frontend", &args)?;
        self.wait_port(&mut c, self.fe_control)?;
        self.wait_port(&mut c, SocketAddr::V4(VIP))?;
        self.children.push(c);
        Ok(())
    }

    fn start_specd(&mut self, i: usize) -> io::Result<()> {
        let node = BACKENDS[i];
        let peer = BACKENDS[1 - i];
        let summary = self.logs.join(format!("specd-{node}.json"));
        let args = specd_args(
            self.dc.node_ip(node),
            self.dc.node_ip(peer),
            SPEC_WINDOW,
            SocketAddr::new(self.dc.node_ip(FE).into(), MOVE_PORT),
            SpecdFiles {
                adopt: &self.adopt[i],
                summary: &summary,
                keys: &self.keys,
                rmem: &self.rkeys,
            },
            false,
        );
        let mut args = args;
        if let Some(i) = args.iter().position(|a| a == "--queue") {
            args[i + 1] = self.queue.to_string();
        }
        // Counters followed live (`flood`): the summary rewritten every second.
        args.extend(strings(&["--summary-every-s", "1"]));
        // What specd did with each client's connection, matched to lost requests.
        let trace = self.specd_trace_path(node);
        args.extend(strings(&["--conn-trace", &trace.display().to_string()]));
        let mut c = self.spawn(node, &format!("specd-{node}"), &args)?;
        let log = c.log.clone();
        c.wait_ready(&format!("log `{SPECD_READY}`"), READY_MAX, POLL, || {
            Ok(std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains(SPECD_READY))
        })?;
        self.specds.push(c);
        Ok(())
    }

    fn start_proxy(&mut self) -> io::Result<()> {
        let mut args = strings(&["proxy", "--listen", &format!("0.0.0.0:{PROXY_PORT}")]);
        for b in BACKENDS {
            let ip = self.dc.node_ip(b);
            args.push("--backend".into());
            args.push(format!(
                "{ip}:80,region={}",
                self.rkeys.reader_region(&format!("udp:{ip}:{REGION_PORT}"))
            ));
        }
        let mut c = self.spawn(PX, "proxy", &args)?;
        self.wait_port(&mut c, self.proxy_addr())?;
        self.children.push(c);
        Ok(())
    }

    /// The front tier's CPUs (clients and attackers run there), when pinned.
    pub fn front_cpus(&self) -> Option<&[usize]> {
        self.front.as_deref()
    }

    /// The web server's adoption socket on back-end `i` (where specd hands it
    /// connections).
    pub fn adopt_path(&self, i: usize) -> &Path {
        &self.adopt[i]
    }

    /// specd's per-connection trace on `node` (`--conn-trace`: one JSON line per step
    /// it took with a client's connection).
    pub fn specd_trace_path(&self, node: &str) -> PathBuf {
        self.logs.join(format!("specd-{node}-trace.jsonl"))
    }

    /// specd's summary on `node` (rewritten every second while it runs).
    pub fn specd_summary_path(&self, node: &str) -> PathBuf {
        self.logs.join(format!("specd-{node}.json"))
    }

    /// The proxy's public data port.
    pub fn proxy_addr(&self) -> SocketAddr {
        SocketAddr::new(self.dc.node_ip(PX).into(), PROXY_PORT)
    }

    /// A back-end's region address.
    pub fn region_addr(&self, node: &str) -> SocketAddrV4 {
        SocketAddrV4::new(self.dc.node_ip(node), REGION_PORT)
    }

    /// A back-end's specd migration address.
    pub fn specd_addr(&self, node: &str) -> SocketAddrV4 {
        SocketAddrV4::new(self.dc.node_ip(node), SPECD_PORT)
    }

    /// The pid of a running daemon by its name (`specd-b1`, `frontend`, ...).
    pub fn pid_of(&self, name: &str) -> Option<u32> {
        self.specds
            .iter()
            .chain(&self.children)
            .find(|c| c.name == name)
            .map(Child::pid)
    }

    /// Error if a daemon has died (an attack that kills one succeeded; the lab says so).
    pub fn check_alive(&mut self) -> io::Result<()> {
        for c in self.specds.iter_mut().chain(self.children.iter_mut()) {
            c.check_alive()?;
        }
        Ok(())
    }

    /// `line` sealed as the lab's operator seals it (`AUTH <hex>`, a fresh sequence;
    /// the wire format of docs/frontend.md, written from it), with its sequence.
    pub fn fe_seal(&self, line: &str) -> (String, u64) {
        // As `farside_auth::replay::Sequencer`: above the last one and at least the
        // clock's second, so a front-end started after this `Dc` (its floor refuses
        // earlier seconds) accepts it.
        let clock = farside_auth::floor::clock_seq(farside_auth::replay::Sequencer::unix_s());
        let next = |s: u64| (s + 1).max(clock);
        let prev = self
            .fe_seq
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| Some(next(s)))
            .unwrap_or_else(|s| s);
        let seq = next(prev);
        let env = farside_auth::mac::Envelope {
            key_id: farside_auth::mac::KeyId(FE_KEY_ID),
            sender: self.fe_sender,
            seq,
        };
        (seal_line(&self.fe_key, &env, line), seq)
    }

    /// One request to the front-end's control port, sealed, from px (the operator's
    /// host; the lab observes the front-end's tables through it): the reply's text
    /// (`OK ...`, or the front-end's unsealed `ERR ...`).
    pub fn fe_request(&self, line: &str) -> io::Result<String> {
        let (sealed, seq) = self.fe_seal(line);
        let to = self.fe_control;
        let reply = self.dc.run_in_ns(PX, move || {
            let mut s = TcpStream::connect_timeout(&to, CONTROL_TIMEOUT)?;
            s.set_read_timeout(Some(CONTROL_TIMEOUT))?;
            s.write_all(format!("{sealed}\n").as_bytes())?;
            let mut r = String::new();
            BufReader::new(s).read_line(&mut r)?;
            Ok(r.trim().to_string())
        })?;
        if reply.starts_with("ERR ") {
            return Ok(reply);
        }
        open_reply(&self.fe_key, self.fe_sender, seq, &reply).ok_or_else(|| {
            io::Error::other(format!(
                "front-end: a reply that does not verify: {reply:?}"
            ))
        })
    }

    /// Wait, at most [`SETTLE_MAX`], until the back-ends hold no request, the proxy no
    /// connection and neither specd a migration in flight; `(quiet, waited, what the
    /// first look saw)`.
    pub fn settle(&self) -> io::Result<(bool, Duration, String)> {
        use crate::fabric::quiet::{wait_quiet, Side, Watched};
        let ports = [
            Watched::new(Some(B0.to_string()), VIP.port(), Side::Back),
            Watched::new(Some(B1.to_string()), VIP.port(), Side::Back),
            Watched::new(Some(PX.to_string()), PROXY_PORT, Side::Front),
        ];
        let t0 = Instant::now();
        let in_flight = || -> u64 {
            BACKENDS
                .iter()
                .filter_map(|n| {
                    let t = std::fs::read_to_string(self.specd_summary_path(n)).ok()?;
                    let v: serde_json::Value = serde_json::from_str(&t).ok()?;
                    v["source"]["window"]["in_flight"].as_u64()
                })
                .sum()
        };
        let first_flight = in_flight();
        let s = wait_quiet(Some(&self.dc), &ports, SETTLE_MAX)?;
        let first = format!(
            "back-ends {} queued / {} busy, proxy {} connections, {} migrations in flight",
            s.first.back.backlog, s.first.back.busy, s.first.front.conns, first_flight
        );
        let mut quiet = s.quiet;
        // specd's summary is rewritten every second: two looks in a row at 0.
        let mut zero = 0;
        while quiet && zero < 2 {
            if in_flight() == 0 {
                zero += 1;
            } else {
                zero = 0;
            }
            if zero < 2 {
                if t0.elapsed() >= SETTLE_MAX {
                    quiet = false;
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok((quiet, t0.elapsed(), first))
    }

    /// The front-end's `STATS` counters (`counters` object of its JSON).
    pub fn fe_counters(&self) -> io::Result<serde_json::Value> {
        let r = self.fe_request("STATS")?;
        let json = r
            .strip_prefix("OK ")
            .ok_or_else(|| io::Error::other(format!("frontend STATS: {r}")))?;
        let v: serde_json::Value = serde_json::from_str(json).map_err(io::Error::other)?;
        Ok(v)
    }

    /// Which back-end the front-end sends `client`'s flow to now (`FLOW`).
    pub fn fe_flow(&self, client: SocketAddrV4) -> io::Result<String> {
        self.fe_request(&format!("FLOW {client}"))
    }

    /// CPU of every process on the defending nodes, µs.
    pub(crate) fn defender_cpu_us(&self) -> u64 {
        DEFENDERS
            .iter()
            .flat_map(|n| self.dc.node_procs_cpu(n).unwrap_or_default())
            .map(|p| p.cpu_us)
            .sum()
    }

    /// Run `attack` (from this thread, [`ATTACK_LEAD`] after the window opens) while the
    /// legitimate clients and the victims work for `window`; the attack gets the
    /// victims' client addresses (to the VIP). Returns its result and the collateral.
    pub fn window<T>(
        &mut self,
        window: Duration,
        attack: impl FnOnce(&Dc, &[SocketAddrV4]) -> io::Result<T>,
    ) -> io::Result<(T, Collateral)> {
        let (quiet, waited, first) = self.settle()?;
        let vip_victims = self.open_victims(SocketAddr::V4(VIP), VICTIMS_VIP)?;
        let px_victims = self.open_victims(self.proxy_addr(), VICTIMS_PROXY)?;
        let addrs: Vec<SocketAddrV4> = vip_victims
            .iter()
            .filter_map(|v| match v.local_addr() {
                Ok(SocketAddr::V4(a)) => Some(a),
                _ => None,
            })
            .collect();
        let cpu0 = self.defender_cpu_us();
        let soft0 = softirq_ms();
        let t0 = Instant::now();
        let stop = AtomicBool::new(false);
        let me: &Dc = self;
        let (res, loads, victims) = std::thread::scope(|sc| {
            let load = |target: SocketAddr, users: usize| {
                let front = me.front.clone();
                let dc = &me.dc;
                sc.spawn(move || {
                    dc.run_in_ns(CLIENT, move || {
                        if let Some(cpus) = &front {
                            crate::fabric::procs::pin_current_thread(cpus)?;
                        }
                        farside_loadgen::run(&legit_load(target, users, window))
                            .map_err(|e| io::Error::from(LabError::Loadgen(e)))
                    })
                })
            };
            let l1 = load(SocketAddr::V4(VIP), LEGIT_VIP_USERS);
            let l2 = load(me.proxy_addr(), LEGIT_PROXY_USERS);
            let stop = &stop;
            let v = sc.spawn(move || {
                let mut all: Vec<Victim> = vip_victims
                    .into_iter()
                    .chain(px_victims)
                    .map(Victim::new)
                    .collect();
                while !stop.load(Ordering::Relaxed) {
                    for v in all.iter_mut() {
                        v.exercise();
                    }
                    std::thread::sleep(VICTIM_PERIOD);
                }
                all
            });
            std::thread::sleep(ATTACK_LEAD);
            let res = attack(me, &addrs);
            // The window lasts at least `window`, and until the attack is over.
            while t0.elapsed() < window {
                std::thread::sleep(POLL);
            }
            stop.store(true, Ordering::Relaxed);
            let join =
                |h: std::thread::ScopedJoinHandle<'_, io::Result<farside_loadgen::Summary>>| {
                    h.join()
                        .unwrap_or_else(|_| Err(io::Error::other("a load thread panicked")))
                };
            let loads = [join(l1), join(l2)];
            (res, loads, v.join())
        });
        let wall = t0.elapsed().as_secs_f64();
        let cpu_ms = self.defender_cpu_us().saturating_sub(cpu0) as f64 / 1e3;
        let soft_ms = (softirq_ms() - soft0).max(0.0);
        let victims = victims.map_err(|_| io::Error::other("the victims' thread panicked"))?;
        let mut c = Collateral {
            window_s: wall,
            started_quiet: quiet,
            settle: format!("{:.0} ms to quiet ({first})", waited.as_secs_f64() * 1e3),
            ..Default::default()
        };
        for l in loads {
            let l = l?;
            c.failed_requests += l.failures;
            c.lost_connections += l.failure_kinds.io_errors + l.failure_kinds.timeouts;
            c.served += l.served;
        }
        for v in &victims {
            c.failed_requests += v.failed;
            c.lost_connections += u64::from(v.broken);
            c.served += v.served;
        }
        let (base_cpu, base_soft) = self.baseline.unwrap_or((0.0, 0.0));
        c.defender_cpu_ms = cpu_ms - base_cpu * wall;
        c.softirq_ms = soft_ms - base_soft * wall;
        Ok((res?, c))
    }

    /// Measure the defenders' CPU under legitimate load alone, per second: what every
    /// attack window's figures are net of.
    pub fn measure_baseline(&mut self, window: Duration) -> io::Result<Collateral> {
        self.baseline = None;
        let ((), c) = self.window(window, |_, _| Ok(()))?;
        self.baseline = Some((c.defender_cpu_ms / c.window_s, c.softirq_ms / c.window_s));
        Ok(c)
    }

    fn open_victims(&self, to: SocketAddr, n: usize) -> io::Result<Vec<TcpStream>> {
        self.dc.run_in_ns(CLIENT, move || {
            (0..n)
                .map(|_| {
                    let s = TcpStream::connect_timeout(&to, VICTIM_TIMEOUT)?;
                    s.set_read_timeout(Some(VICTIM_TIMEOUT))?;
                    s.set_write_timeout(Some(VICTIM_TIMEOUT))?;
                    s.set_nodelay(true)?;
                    Ok(s)
                })
                .collect()
        })
    }

    /// An open-loop burst of `rate` new connections/s for `secs` from the client to
    /// the VIP (what makes b0 migrate connections); its failures are not an attack's.
    pub fn burst(&self, rate: f64, secs: f64) -> io::Result<farside_loadgen::Summary> {
        let mut lg = farside_loadgen::LoadgenArgs::new(VIP.to_string());
        lg.rate = Some(rate);
        lg.no_keepalive = true;
        lg.duration_s = secs;
        lg.warmup_s = 0.0;
        lg.file_path = FILE_PATH.to_string();
        lg.timeout_ms = 2000;
        lg.connect_timeout_ms = 500;
        lg.quiet = true;
        self.dc.run_in_ns(CLIENT, move || {
            farside_loadgen::run(&lg).map_err(|e| io::Error::from(LabError::Loadgen(e)))
        })
    }
}

impl Drop for Dc {
    fn drop(&mut self) {
        for mut c in self.specds.drain(..) {
            c.stop();
        }
        while let Some(mut c) = self.children.pop() {
            c.stop();
        }
        for p in &self.adopt {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn legit_load(target: SocketAddr, users: usize, window: Duration) -> farside_loadgen::LoadgenArgs {
    let mut lg = farside_loadgen::LoadgenArgs::new(target.to_string());
    lg.clients = users;
    lg.think_ms = LEGIT_THINK_MS;
    lg.keepalive = true;
    lg.session_requests = LEGIT_SESSION_REQUESTS;
    lg.duration_s = window.as_secs_f64();
    lg.warmup_s = 0.0;
    lg.file_path = FILE_PATH.to_string();
    lg.timeout_ms = LEGIT_TIMEOUT_MS;
    lg.quiet = true;
    lg
}

/// `AUTH <hex>` of `text` sealed under `key` with `env` (the front-end's control
/// line: `farside_auth::mac`, domain `FrontendControl`).
pub fn seal_line(
    key: &farside_auth::siphash::SipKey,
    env: &farside_auth::mac::Envelope,
    text: &str,
) -> String {
    let mut b = Vec::new();
    let _ = farside_auth::mac::seal(
        &mut b,
        farside_auth::mac::Domain::FrontendControl,
        key,
        env,
        text.as_bytes(),
    );
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("AUTH {hex}")
}

/// The text of a sealed reply line (`AUTH <hex>` of `reply <text>`) to the request
/// `(sender, seq)`, if it verifies under `key`.
fn open_reply(
    key: &farside_auth::siphash::SipKey,
    sender: u64,
    seq: u64,
    line: &str,
) -> Option<String> {
    let hex = line.strip_prefix("AUTH ")?.trim();
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<_>>()?;
    let o = farside_auth::mac::open(farside_auth::mac::Domain::FrontendControl, &bytes, |id| {
        (id.0 == FE_KEY_ID).then_some(*key)
    })
    .ok()?;
    if o.envelope.sender != sender || o.envelope.seq != seq {
        return None;
    }
    let text = std::str::from_utf8(o.message).ok()?;
    text.strip_prefix("reply ").map(str::to_string)
}

/// Softirq time of the whole machine so far, ms (`/proc/stat`, USER_HZ ticks).
pub(crate) fn softirq_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    stat.lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0.0, |t| t * 1e3 / hz)
}

/// A legitimate keep-alive connection used all along a window.
struct Victim {
    s: TcpStream,
    broken: bool,
    served: u64,
    failed: u64,
}

impl Victim {
    fn new(s: TcpStream) -> Victim {
        Victim {
            s,
            broken: false,
            served: 0,
            failed: 0,
        }
    }

    /// One request on the connection (none once it broke).
    fn exercise(&mut self) {
        if self.broken {
            return;
        }
        match http_get(&mut self.s) {
            Ok(200) => self.served += 1,
            _ => {
                self.failed += 1;
                self.broken = true;
            }
        }
    }
}

/// A `GET` of the page on a keep-alive connection; its status.
pub fn http_get(s: &mut TcpStream) -> io::Result<u16> {
    s.write_all(format!("GET {FILE_PATH} HTTP/1.1\r\nHost: lab\r\n\r\n").as_bytes())?;
    let (status, _) = read_response(s)?;
    Ok(status)
}

/// Read one HTTP/1.1 response with a `Content-Length`: its status and body.
pub fn read_response(s: &mut impl Read) -> io::Result<(u16, Vec<u8>)> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.push(b[0]);
        if head.len() > 16_384 {
            return Err(io::Error::other("response head over 16 KiB"));
        }
    }
    let text = String::from_utf8_lossy(&head);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other("no status"))?;
    let len = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok((status, body))
}
