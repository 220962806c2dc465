//! `farside frontend`: attach the blind front-end to an interface, serve the control
//! port, print the counters on exit. `farside frontend --detach IF` removes a
//! front-end a dead process left attached (only possible on kernels before 6.6).

use std::net::SocketAddrV4;
use std::sync::{Arc, Mutex};

use crate::backend::{validate_backends, BackendSpec};
use crate::control::{ControlAddr, Server};
use crate::loader::{detach_iface, Frontend, MOVED_IDLE_MAX};

/// The systemd credential name of the MOVE key (`LoadCredential=frontend-move:PATH`):
/// found in `$CREDENTIALS_DIRECTORY` before `--key-file`.
pub const MOVE_KEY_CREDENTIAL: &str = "frontend-move";

/// How often the moved-flow table is swept of flows idle [`MOVED_IDLE_MAX`]: a
/// thirtieth of it, so an entry outlives its bound by at most ~3 %.
pub const MOVED_SWEEP_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// The sweep of idle moved flows, in its own thread until dropped.
struct Sweeper {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sweeper {
    fn start(fe: Arc<Mutex<Frontend>>) -> std::io::Result<Sweeper> {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("fe-sweep".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(MOVED_SWEEP_PERIOD)
                {
                    let mut fe = fe.lock().unwrap_or_else(|p| p.into_inner());
                    match fe.expire_moved(MOVED_IDLE_MAX) {
                        Ok(0) => {}
                        Ok(n) => log::debug!("frontend: {n} idle moved flows removed"),
                        Err(e) => log::warn!("frontend: sweeping moved flows: {e}"),
                    }
                }
            })?;
        Ok(Sweeper {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `farside frontend` flags.
#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Forwarding: L2 direct server return. Put the VIP on every back-end's lo \
(sysctl net.ipv4.conf.all.arp_ignore=1, arp_announce=2), route the VIP to this node, and \
give every back-end here as MAC@IP=WEIGHT (its MAC on IF's LAN, its own address, its \
share of new flows). Control port (one line per request, one reply line): MOVE \
client_ip:port backend_ip | HOLD client_ip:port [ttl_ms] | RELEASE client_ip:port | FLOW \
client_ip:port | WEIGHTS ip=w,ip=w | STATS; recommended on a Unix socket \
(--control unix:/run/farside/frontend.sock, 0600); over TCP every request is sealed with \
--key-file's key (docs/frontend.md). One-sided \
MOVE (answered by the tc program, no process involved): UDP to this node's address on \
--move-udp-port (default: a TCP control port's number). See docs/frontend.md."
)]
pub struct FrontendArgs {
    /// The LAN interface clients' VIP traffic arrives on and back-ends are reached
    /// through (the program runs at its tc ingress).
    #[arg(long, value_name = "IF", required_unless_present = "detach")]
    pub iface: Option<String>,
    /// The service's virtual address: IPv4 TCP to it is routed, everything else passes.
    #[arg(long, value_name = "IP:PORT", required_unless_present = "detach")]
    pub vip: Option<SocketAddrV4>,
    /// A back-end, MAC@IP=WEIGHT (e.g. 02:00:00:00:00:0b@10.0.0.11=75); repeat for
    /// each (at most 64). Weights are relative shares of new flows.
    #[arg(long = "backend", value_name = "MAC@IP=WEIGHT")]
    pub backends: Vec<BackendSpec>,
    /// Serve the control port here: unix:/PATH (recommended, e.g.
    /// unix:/run/farside/frontend.sock: a 0600 socket only local root can open) or
    /// IP:PORT (TCP: needs --key-file; every request must be sealed with that key,
    /// as `specd --frontend-key-file` seals them); none if absent.
    #[arg(long, value_name = "ADDR")]
    pub control: Option<ControlAddr>,
    /// UDP port of the one-sided MOVE, answered by the tc program itself (no process
    /// involved) at this node's address: a TCP --control's IP if it names one, else
    /// IF's IPv4 address. Default: a TCP --control's port number (off without one);
    /// 0 = off.
    #[arg(long, value_name = "PORT")]
    pub move_udp_port: Option<u16>,
    /// Require the one-sided MOVE to be authenticated with the key in this file (32
    /// hex digits, mode 0600 or 0400, owned by this user; `$CREDENTIALS_DIRECTORY/
    /// frontend-move` takes precedence when systemd provides it). Without it the
    /// one-sided MOVE is unauthenticated (a warning is logged).
    #[arg(long, value_name = "PATH")]
    pub key_file: Option<std::path::PathBuf>,
    /// The id of --key-file's key, as the back-ends' envelopes name it.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub key_id: u32,
    /// Answer the one-sided MOVE only when it arrives on this interface (the
    /// cluster-facing one; the program is attached there too). Default: --iface.
    #[arg(long, value_name = "IF")]
    pub move_iface: Option<String>,
    /// Pin the maps a restart must keep (flows, moved flows, hash key, MOVE replay
    /// state) under --pin-root/IF, and restore them at start if an earlier front-end
    /// of the same VIP and back-ends left them. Default: on when --pin-root is on a
    /// bpffs and this is the host's network namespace.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub pin_maps: Option<bool>,
    /// Where maps are pinned (one directory per interface below it).
    #[arg(long, value_name = "DIR", default_value = crate::pin::PIN_ROOT)]
    pub pin_root: std::path::PathBuf,
    /// Stop after this many seconds (default: at SIGINT/SIGTERM).
    #[arg(long, value_name = "S")]
    pub duration_s: Option<f64>,
    /// Remove a front-end left attached to IF by a process that died, and exit
    /// (needed only on kernels before 6.6: a TCX attachment ends with its process).
    #[arg(long, value_name = "IF", conflicts_with_all = ["iface", "vip", "backends", "control", "move_udp_port", "key_file", "move_iface", "pin_maps"])]
    pub detach: Option<String>,
}

impl FrontendArgs {
    /// Check the flags without touching the kernel.
    pub fn validate(&self) -> Result<(), String> {
        if self.detach.is_some() {
            return Ok(());
        }
        let vip = self.vip.ok_or("--vip is required")?;
        if vip.port() == 0 {
            return Err("--vip: port 0".into());
        }
        if self.backends.is_empty() {
            return Err("give at least one --backend MAC@IP=WEIGHT".into());
        }
        validate_backends(&self.backends).map_err(|e| format!("--backend: {e}"))?;
        if let Some(d) = self.duration_s {
            if !(d.is_finite() && d > 0.0) {
                return Err(format!("--duration-s {d}: must be positive"));
            }
        }
        Ok(())
    }

    /// The one-sided MOVE's port: `--move-udp-port`, else the control port's number,
    /// else none (0 = off).
    pub fn move_port(&self) -> u16 {
        self.move_udp_port
            .or(self
                .control
                .as_ref()
                .and_then(|c| c.tcp())
                .map(|c| c.port()))
            .unwrap_or(0)
    }
}

/// Run `farside frontend`: attach, serve the control port, call `wait` (which
/// returns at the termination signal or the duration), print the counters, detach.
/// Block SIGINT/SIGTERM before calling (the control threads inherit the mask).
pub fn run(a: FrontendArgs, wait: impl FnOnce(Option<std::time::Duration>)) -> Result<(), String> {
    a.validate()?;
    if let Some(ifname) = &a.detach {
        let msg = detach_iface(ifname).map_err(|e| e.to_string())?;
        println!("farside frontend: {msg}");
        return Ok(());
    }
    let ifname = a.iface.as_deref().ok_or("--iface is required")?;
    let vip = a.vip.ok_or("--vip is required")?;
    // The key first: a bad key file must fail before anything is attached.
    let creds =
        std::env::var_os(farside_auth::keys::CREDENTIALS_DIRECTORY).map(std::path::PathBuf::from);
    let key = load_move_key(a.key_file.as_deref(), creds.as_deref())?;
    if let (Some(ControlAddr::Tcp(t)), None) = (&a.control, &key) {
        return Err(format!(
            "--control {t}: a TCP control port needs the front-end's key (--key-file, or \
             systemd's credential {MOVE_KEY_CREDENTIAL}): every request on it is sealed \
             with that key; or use --control unix:{}",
            crate::control::UNIX_SOCKET_DEFAULT
        ));
    }
    let pin = a
        .pin_maps
        .unwrap_or_else(|| crate::pin::default_on(&a.pin_root));
    let (mut fe, restored) = Frontend::attach_pinned(
        ifname,
        vip,
        &a.backends,
        pin.then_some(a.pin_root.as_path()),
    )
    .map_err(|e| e.to_string())?;
    if pin {
        let dir = crate::pin::pin_dir(&a.pin_root, ifname);
        if restored.discarded {
            log::warn!(
                "frontend: maps pinned in {} were for another VIP or other back-ends: not restored",
                dir.display()
            );
        }
        log::info!(
            "frontend: maps pinned in {} (restored {} flows, {} moved, {} replay entries{})",
            dir.display(),
            restored.flows,
            restored.moved,
            restored.replay,
            if restored.hash_key.is_some() {
                ", the hash key"
            } else {
                ""
            }
        );
    }
    let move_port = a.move_port();
    let move_ifname = a.move_iface.as_deref().unwrap_or(ifname);
    if move_port != 0 {
        fe.attach_move_iface(move_ifname)
            .map_err(|e| format!("--move-iface {move_ifname}: {e}"))?;
        match &key {
            Some(k) => fe
                .add_move_key(farside_auth::mac::KeyId(a.key_id), k.key)
                .map_err(|e| format!("--key-file: {e}"))?,
            None => log::warn!(
                "frontend: the one-sided MOVE on udp port {move_port} is UNAUTHENTICATED \
                 (only its source address is checked, which can be spoofed): give \
                 --key-file and seal the back-ends' MOVEs with the same key"
            ),
        }
        // The front-end's own address: a TCP --control's if it names one (the address
        // the back-ends' `specd --frontend` gives), else the move interface's.
        let ip = match a.control.as_ref().and_then(|c| c.tcp()).map(|c| c.ip()) {
            Some(std::net::IpAddr::V4(ip)) if !ip.is_unspecified() => ip,
            _ => crate::loader::iface_ipv4(move_ifname)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| {
                    format!(
                        "--move-udp-port {move_port}: {move_ifname} has no IPv4 address to answer on \
                         (give --control IP:PORT, or --move-udp-port 0)"
                    )
                })?,
        };
        fe.set_move_udp(ip, move_port)
            .map_err(|e| format!("--move-udp-port {move_port}: {e}"))?;
    }
    let fe = Arc::new(Mutex::new(fe));
    let sweeper = Sweeper::start(fe.clone()).map_err(|e| format!("sweep thread: {e}"))?;
    let server = match &a.control {
        Some(addr) => {
            let key = key.as_ref().map(|k| crate::fmove::MoveKey {
                id: farside_auth::mac::KeyId(a.key_id),
                key: k.key,
            });
            Some(
                Server::start_at(addr, fe.clone(), key)
                    .map_err(|e| format!("--control {addr}: {e}"))?,
            )
        }
        None => None,
    };
    let shares: Vec<String> = a
        .backends
        .iter()
        .map(|b| format!("{}={}", b.ip, b.weight))
        .collect();
    let move_udp = fe.lock().unwrap_or_else(|p| p.into_inner()).move_udp();
    log::info!(
        "frontend: routing TCP to {vip} arriving on {ifname} to {} (L2 DSR, tc ingress){}{}",
        shares.join(","),
        server
            .as_ref()
            .map(|s| format!("; control on {}", s.addr()))
            .unwrap_or_default(),
        move_udp
            .map(|m| format!(
                "; one-sided MOVE on udp {m} via {move_ifname}{}",
                if key.is_some() {
                    " (authenticated)"
                } else {
                    ""
                }
            ))
            .unwrap_or_default()
    );
    wait(a.duration_s.map(std::time::Duration::from_secs_f64));
    drop(server);
    drop(sweeper);
    let (stats, detached) = {
        // A control connection still open holds a reference: detach explicitly.
        let mut fe = fe.lock().unwrap_or_else(|p| p.into_inner());
        (fe.stats(), fe.detach())
    };
    match detached {
        Ok(()) => log::info!("frontend: detached from {ifname}"),
        Err(e) => log::warn!("frontend: {e}"),
    }
    match stats {
        Ok(s) => println!("{s}"),
        Err(e) => log::warn!("frontend: reading the counters: {e}"),
    }
    Ok(())
}

/// The MOVE key: systemd's credential `frontend-move` (`LoadCredential=`) if the
/// service has it, else `--key-file`; `None` when neither is given. A key file others
/// may read, or an example or weak key, is an error naming the flag.
fn load_move_key(
    key_file: Option<&std::path::Path>,
    credentials_dir: Option<&std::path::Path>,
) -> Result<Option<farside_auth::keys::LoadedKey>, String> {
    use farside_auth::keys::{load_key_from, KeyError, Policy};
    match load_key_from(
        credentials_dir,
        MOVE_KEY_CREDENTIAL,
        key_file,
        Policy::Production,
        farside_auth::keys::euid(),
    ) {
        Ok(k) => Ok(Some(k)),
        Err(KeyError::NotFound { .. }) if key_file.is_none() => Ok(None),
        Err(e) => Err(match key_file {
            Some(p) => format!("--key-file {}: {e}", p.display()),
            None => format!("credential {MOVE_KEY_CREDENTIAL}: {e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// systemd's credential is used without --key-file (and before it); an exposed one
    /// is refused like a file.
    #[test]
    fn the_move_key_comes_from_the_systemd_credential() {
        let dir = std::env::temp_dir().join(format!("fe-cli-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cred = dir.join(MOVE_KEY_CREDENTIAL);
        std::fs::write(&cred, "8f3a1c9e27b4d6051e9c3b7a2f6d4e18\n").unwrap();
        std::fs::set_permissions(&cred, std::fs::Permissions::from_mode(0o400)).unwrap();
        let k = load_move_key(None, Some(&dir))
            .unwrap()
            .expect("the credential");
        assert_eq!(k.origin, farside_auth::keys::Origin::Credential);
        assert!(load_move_key(None, None).unwrap().is_none());
        std::fs::set_permissions(&cred, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_move_key(None, Some(&dir)).unwrap_err();
        assert!(e.starts_with("credential frontend-move"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn args(key_file: Option<std::path::PathBuf>) -> FrontendArgs {
        FrontendArgs {
            iface: Some("no-such-if0".into()),
            vip: Some("10.0.0.100:80".parse().unwrap()),
            backends: vec!["02:00:00:00:00:0b@10.0.0.11=1".parse().unwrap()],
            control: None,
            move_udp_port: Some(7400),
            key_file,
            key_id: 1,
            move_iface: None,
            pin_maps: Some(false),
            pin_root: crate::pin::PIN_ROOT.into(),
            duration_s: None,
            detach: None,
        }
    }

    /// A key file others may read, or a missing one, stops the front-end before it
    /// touches an interface; the message names the flag.
    #[test]
    fn an_exposed_or_missing_key_file_is_refused_before_attaching() {
        let dir = std::env::temp_dir().join(format!("fe-cli-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        std::fs::write(&path, "8f3a1c9e27b4d6051e9c3b7a2f6d4e18\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = run(args(Some(path.clone())), |_| {}).unwrap_err();
        assert!(e.starts_with("--key-file"), "{e}");
        let e = run(args(Some(dir.join("absent"))), |_| {}).unwrap_err();
        assert!(e.starts_with("--key-file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_move_port_follows_a_tcp_control_port_only() {
        let mut a = args(None);
        a.move_udp_port = None;
        assert_eq!(a.move_port(), 0);
        a.control = Some("10.0.0.2:7400".parse().unwrap());
        assert_eq!(a.move_port(), 7400);
        a.control = Some("unix:/run/farside/frontend.sock".parse().unwrap());
        assert_eq!(a.move_port(), 0, "a Unix socket has no port");
    }
}
