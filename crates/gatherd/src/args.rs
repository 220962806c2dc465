//! `farside gatherd`'s command line: the flags ([`GatherdArgs`], the node agent's
//! `--role-*` flattened in), their defaults and their validation.

use std::net::SocketAddr;
use std::path::PathBuf;

use farside_rmem::{KeySpec, ServerKeys};

use crate::role;

/// Most watched ports (they are packed into one header word).
pub const WATCHED_PORTS_MAX: usize = 4;
/// Shortest allowed period.
pub const PERIOD_US_MIN: u64 = 100;

#[derive(Debug, Clone, clap::Args)]
pub struct GatherdArgs {
    /// Node id written into the region header.
    #[arg(long, default_value_t = 0)]
    pub node_id: u64,
    /// Sampling period in microseconds (minimum 100).
    #[arg(long, default_value_t = 1000)]
    pub period_us: u64,
    /// TCP port of the web server whose connections are counted (repeatable, up to 4).
    #[arg(long = "watch-port")]
    pub watch_ports: Vec<u16>,
    /// Region file in shared memory for same-host readers (`shm:` transport).
    /// Default: `/run/farside/node<ID>.region` (as root; otherwise under
    /// `$XDG_RUNTIME_DIR/farside`). Its directory is made 0700 and checked (ours or
    /// root's, no other user's symlink), the file is 0600. With XDP attached this path is a Unix
    /// socket that hands readers the XDP region map itself, so shm, tcp, udp and XDP
    /// all operate on the same words.
    #[arg(long)]
    pub shm: Option<PathBuf>,
    /// Do not create a shared-memory region file (serve over tcp/udp only).
    #[arg(long)]
    pub no_shm: bool,
    /// Serve the two-sided tcp baseline on this address (e.g. 127.0.0.1:7001). Default: off.
    #[arg(long)]
    pub tcp_listen: Option<SocketAddr>,
    /// Serve the udp protocol from user space on this address. Default: off.
    #[arg(long)]
    pub udp_listen: Option<SocketAddr>,
    /// Attach the XDP responder to this interface so udp requests to the --udp-listen
    /// port are answered in the kernel (one-sided). Default: none (user space answers).
    #[arg(long)]
    pub xdp_iface: Option<String>,
    /// XDP attach mode: auto (native, then generic, then the user-space server, logged),
    /// native, generic, or off.
    #[arg(long, value_enum, default_value_t = XdpChoice::Auto)]
    pub xdp_mode: XdpChoice,
    /// Answer group READs sent to this IPv4 multicast group (e.g. 239.1.1.1) on the
    /// --udp-listen port: a monitor's one READ per period (`--group-read ADDR:PORT`)
    /// answered by every back-end from its own address. The XDP program answers them
    /// (needs the interface's IPv4 address and MAC) and the user-space server joins the
    /// group (IGMP) and answers them when XDP does not; WRITEs and atomics to the group
    /// are dropped. Needs --udp-listen 0.0.0.0:PORT. Default: off.
    #[arg(long, value_name = "ADDR")]
    pub group_read: Option<std::net::Ipv4Addr>,
    /// Serve Prometheus metrics (samples, sampling cost, per-op and per-refusal counters of
    /// every server, XDP included) on this address. Default: off.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// A key the tcp and udp servers (and the XDP program) accept, `ROLE:ID:PATH`
    /// (repeatable): ROLE `reader` (READ the region) or `balancer` (READ; CAS the wanted
    /// role and the lock words; FETCH-ADD the wanted role and the counters by at most
    /// 1; never the words this agent writes), ID the key id (a number) its users'
    /// requests name, PATH its key file: 32 hex digits, mode 0600, owned by gatherd's
    /// user (`openssl rand -hex 16 > rmem-1.key; chmod 0600 rmem-1.key`). Without
    /// PATH (`ROLE:ID`), the systemd credential `rmem-ID` in $CREDENTIALS_DIRECTORY,
    /// which is also looked at first when a path is given. Example and weak keys are
    /// refused. Rotation: give the new key of a role after the old one (both verify),
    /// move the clients to it, then remove the old key's file and send SIGHUP (every
    /// key file is read again; a missing one revokes its key, in the XDP program too).
    /// Needed with --tcp-listen or --udp-listen (or --rmem-key-dir). Readers name their key as `ID:PATH`
    /// (`[monitor] key`, a region's `?key=ID:PATH`).
    #[arg(long = "rmem-key", value_name = "ROLE:ID:PATH")]
    pub rmem_keys: Vec<KeySpec>,
    /// A directory of key files named `ROLE-ID.key` (`reader-1.key`, `balancer-7.key`;
    /// each as a --rmem-key file), read at start and again on SIGHUP: adding a file and
    /// sending SIGHUP adds a key, removing one revokes it, without a restart. Other
    /// names are ignored.
    #[arg(long = "rmem-key-dir", value_name = "DIR")]
    pub rmem_key_dir: Option<PathBuf>,
    /// The replay state file: a ceiling persisted (atomically, 0600) ahead of every
    /// request sequence accepted, so a restarted gatherd refuses every request sealed
    /// before it (a recorded request cannot be replayed across a restart). Requests
    /// from senders whose clock runs over a second ahead are refused, and senders wait
    /// up to 2 s after a quick restart. Without it, a restart refuses only requests
    /// sealed in earlier seconds. Default: none.
    #[arg(long = "replay-state", value_name = "PATH")]
    pub replay_state: Option<PathBuf>,
    /// Take CPU figures from this cgroup v2 directory instead of the whole host.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// Count established connections every N samples (the accept backlog is counted every
    /// sample). Default 0 = automatic: as often as keeps that count under 2% of one CPU
    /// (it walks the kernel's whole TCP hash; see README). The same count measures the
    /// queueing delay (`queue_delay_us`) that `proxy --metric delay` follows.
    #[arg(long, default_value_t = 0)]
    pub conns_every: u64,
    /// Nice value of the sampling thread, -20..=19 (only that thread; the tcp and udp
    /// servers keep the process's priority). A negative value keeps samples on time when
    /// the web server saturates the node's CPUs, so a one-sided reader gets fresh load
    /// (needs CAP_SYS_NICE; without it gatherd logs a warning and samples at the
    /// process's priority). Default 0: unchanged.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub sampler_nice: i32,
    /// Who writes the load record: kernel (the kernel-resident sampler: tracepoints and
    /// a per-CPU tick write the region map, no user-space thread samples; needs BPF
    /// (root, or CAP_BPF and CAP_PERFMON, and the kernel's BTF) and no --cgroup, with or
    /// without --xdp-iface: shm readers then map the BPF map), user (gatherd's sampling
    /// thread), or auto (kernel if it loads, else user; logged with the reason).
    #[arg(long, value_enum, default_value_t = SamplerChoice::Auto)]
    pub sampler: SamplerChoice,
    /// Turn the kernel's BPF run-time statistics on while gatherd runs
    /// (BPF_ENABLE_STATS), so the metrics count the kernel's share of the cost
    /// (`farside_gatherd_bpf_run_time_seconds_total`). It costs two clock reads on every
    /// run of every BPF program on the host. Without it the figures are read all the
    /// same, and grow only while `sysctl kernel.bpf_stats_enabled=1`. Default: off.
    #[arg(long)]
    pub bpf_stats: bool,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// The node agent of co-hosted sites (seed 001): see `role.rs`.
    #[command(flatten)]
    pub role: role::RoleArgs,
}

impl Default for GatherdArgs {
    fn default() -> Self {
        GatherdArgs {
            node_id: 0,
            period_us: 1000,
            watch_ports: Vec::new(),
            shm: None,
            no_shm: false,
            tcp_listen: None,
            udp_listen: None,
            xdp_iface: None,
            xdp_mode: XdpChoice::Auto,
            group_read: None,
            metrics_listen: None,
            rmem_keys: Vec::new(),
            rmem_key_dir: None,
            replay_state: None,
            cgroup: None,
            conns_every: 0,
            sampler_nice: 0,
            sampler: SamplerChoice::Auto,
            bpf_stats: false,
            duration_s: None,
            role: role::RoleArgs::default(),
        }
    }
}

impl GatherdArgs {
    pub fn shm_path(&self) -> Option<PathBuf> {
        if self.no_shm {
            return None;
        }
        Some(self.shm.clone().unwrap_or_else(|| {
            farside_rt::rundir::default_run_dir().join(format!("node{}.region", self.node_id))
        }))
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.period_us < PERIOD_US_MIN {
            return Err(format!(
                "--period-us: at least {PERIOD_US_MIN}, got {}",
                self.period_us
            ));
        }
        if self.watch_ports.len() > WATCHED_PORTS_MAX {
            return Err(format!("--watch-port: at most {WATCHED_PORTS_MAX} ports"));
        }
        if self.watch_ports.contains(&0) {
            return Err("--watch-port: port 0 is not a port a server listens on".into());
        }
        if let Some(g) = self.group_read {
            if !g.is_multicast() {
                return Err(format!(
                    "--group-read {g}: not an IPv4 multicast group (224.0.0.0/4)"
                ));
            }
            if !self
                .udp_listen
                .is_some_and(|a| a.is_ipv4() && a.ip().is_unspecified())
            {
                return Err(format!(
                    "--group-read {g}: needs --udp-listen 0.0.0.0:PORT (a socket bound to \
                     one address never receives the group's datagrams)"
                ));
            }
        }
        if self.rmem_keys.is_empty()
            && self.rmem_key_dir.is_none()
            && (self.tcp_listen.is_some() || self.udp_listen.is_some())
        {
            return Err(
                "--tcp-listen / --udp-listen: every request is authenticated; give the keys \
                 readers and balancers use with --rmem-key ROLE:ID:PATH"
                    .into(),
            );
        }
        if !(-20..=19).contains(&self.sampler_nice) {
            return Err(format!(
                "--sampler-nice: -20..=19, got {}",
                self.sampler_nice
            ));
        }
        Ok(())
    }

    /// The keys of `--rmem-key` and `--rmem-key-dir`, read from their files (refused
    /// if exposed, weak or an example).
    pub fn keys(&self) -> std::io::Result<std::sync::Arc<ServerKeys>> {
        crate::trust::specs(self, false)
            .and_then(|s| ServerKeys::load(&s))
            .map(std::sync::Arc::new)
            .map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("--rmem-key: {e}"))
            })
    }
}

/// `--sampler`: who writes the load record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SamplerChoice {
    /// The kernel sampler if it can run, else gatherd's thread (logged).
    Auto,
    /// The kernel-resident sampler; an error if it cannot run.
    Kernel,
    /// gatherd's sampling thread.
    User,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpChoice {
    Auto,
    Native,
    Generic,
    Off,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nice value is one thread's (`farside_rt::set_thread_nice`, tested there);
    /// here only its bounds.
    #[test]
    fn sampler_nice_is_bounded() {
        for bad in [-21, 20] {
            let a = GatherdArgs {
                sampler_nice: bad,
                ..Default::default()
            };
            assert!(a.validate().unwrap_err().contains("--sampler-nice"));
        }
    }

    #[test]
    fn servers_need_keys_and_keys_come_from_files() {
        let a = GatherdArgs {
            udp_listen: Some("127.0.0.1:7000".parse().unwrap()),
            ..Default::default()
        };
        assert!(a.validate().unwrap_err().contains("--rmem-key"));
        let dir = std::env::temp_dir().join(format!("gatherd-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let set = farside_rmem::LabKeyset::generate();
        let (reader, balancer) = set.write_files(&dir).unwrap();
        let spec = |s: String| s.parse::<KeySpec>().unwrap();
        let a = GatherdArgs {
            rmem_keys: vec![
                spec(format!("reader:1:{}", reader.display())),
                spec(format!("balancer:2:{}", balancer.display())),
            ],
            ..a
        };
        assert!(a.validate().is_ok());
        let ring = a.keys().unwrap().keyring();
        assert_eq!(ring.len(), 2);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&reader, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(a.keys().unwrap_err().to_string().contains("0600"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn group_read_needs_a_multicast_group_and_the_wildcard_udp_address() {
        let a = |group: &str, udp: Option<&str>| GatherdArgs {
            group_read: Some(group.parse().unwrap()),
            udp_listen: udp.map(|u| u.parse().unwrap()),
            rmem_keys: vec!["reader:1".parse().unwrap()],
            ..Default::default()
        };
        assert!(a("239.1.1.1", Some("0.0.0.0:7000")).validate().is_ok());
        let e = a("10.0.0.1", Some("0.0.0.0:7000")).validate().unwrap_err();
        assert!(e.contains("not an IPv4 multicast group"), "{e}");
        for udp in [None, Some("127.0.0.1:7000"), Some("[::]:7000")] {
            let e = a("239.1.1.1", udp).validate().unwrap_err();
            assert!(e.contains("0.0.0.0:PORT"), "{udp:?}: {e}");
        }
    }
}
