//! `lab reconfig --hosts loopback`: every node a set of processes on 127.0.0.1 (its own
//! ports), in the host's network namespace.
//!
//! A node's capacity:
//! - **as root**: a cgroup per node with a CPU quota, made the way `netns.rs` makes the
//!   nodes' cgroups (`/sys/fs/cgroup/farside/<run_id>/<node>` on cgroup v2; on a hybrid
//!   host membership in the `unified` hierarchy, where gatherd reads the node's CPU use,
//!   and the quota in the v1 `cpu` one), so the nodes saturate independently and each
//!   gatherd (`--cgroup`) publishes its own node's load, as with `--hosts netns`;
//! - **otherwise**: no quota: a node is bounded only by its back-end's `--backend-workers`
//!   × `--cpu-us-per-request`, the nodes share the host's CPUs, and every gatherd
//!   publishes the host's CPU use, so the balancers cannot tell a loaded site from an
//!   idle one. The run says so in its notes; it shows the moving parts, not the paper's
//!   figures.
//!
//! Regions are read and changed over `shm` (the region file mapped by the proxies: the
//! one-sided transport on one host; `farside_rmem`'s shm client executes READ, CAS and
//! FETCH-ADD on the mapped words in place, no gatherd involved), `tcp` or `udp`
//! (gatherd's user-space servers: two-sided). XDP is not attached to `lo`.

use crate::fabric::netns::{cpu_quota_period, CgroupKind, CGROUP_SUBTREE};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// The loopback address every node listens on.
pub const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// Attempts at removing a node cgroup on teardown (its processes may take a moment to
/// leave after SIGKILL).
const RMDIR_ATTEMPTS: usize = 50;
/// Pause between those attempts.
const RMDIR_PAUSE: Duration = Duration::from_millis(20);

/// The loopback "hosts" of a run: per node its ports and, as root, its cgroups.
pub struct LoopbackHosts {
    /// Per node: its cgroup directory in every hierarchy used (primary first); empty
    /// without a quota.
    cgroups: HashMap<String, Vec<PathBuf>>,
    /// `farside/<run_id>` in every hierarchy used (removed on drop).
    run_dirs: Vec<PathBuf>,
    /// (node, the netns layout's fixed port) → the free loopback port given to it.
    ports: Mutex<HashMap<(String, u16), u16>>,
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("--hosts loopback: {what}: {e}"))
}

fn mkdir(d: &Path) -> io::Result<()> {
    match std::fs::create_dir(d) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            Err(ctx(e, &format!("mkdir {}", d.display())))
        }
        _ => Ok(()),
    }
}

fn write(p: &Path, v: &str) -> io::Result<()> {
    std::fs::write(p, v).map_err(|e| ctx(e, &format!("write {v:?} to {}", p.display())))
}

/// Enable the cpu controller for the children of `d` (cgroup v2) if it is not yet.
fn enable_cpu(d: &Path) -> io::Result<()> {
    let on = std::fs::read_to_string(d.join("cgroup.subtree_control")).unwrap_or_default();
    if on.split_whitespace().any(|c| c == "cpu") {
        return Ok(());
    }
    write(&d.join("cgroup.subtree_control"), "+cpu")
}

impl LoopbackHosts {
    /// Nodes `nodes`; with `quota_pct` (root only) each gets a cgroup with that CPU
    /// quota under `farside/<run_id>`.
    pub fn create(run_id: &str, nodes: &[String], quota_pct: Option<u32>) -> io::Result<Self> {
        let mut hosts = LoopbackHosts {
            cgroups: HashMap::new(),
            run_dirs: Vec::new(),
            ports: Mutex::new(HashMap::new()),
        };
        let Some(pct) = quota_pct else {
            return Ok(hosts);
        };
        let (quota, period) = cpu_quota_period(pct);
        for h in crate::fabric::netns::cgroup_hierarchies()? {
            // The v1 cpuset hierarchy needs cpus/mems copied down before a process may
            // join; nothing here pins CPUs, so it is left alone.
            if h.kind == CgroupKind::V1Cpuset {
                continue;
            }
            let sub = h.mount.join(CGROUP_SUBTREE);
            let run = sub.join(run_id);
            if h.kind == CgroupKind::V2 {
                enable_cpu(&h.mount)?;
                mkdir(&sub)?;
                enable_cpu(&sub)?;
                mkdir(&run)?;
                enable_cpu(&run)?;
            } else {
                mkdir(&sub)?;
                mkdir(&run)?;
            }
            hosts.run_dirs.push(run.clone());
            for n in nodes {
                let d = run.join(n);
                mkdir(&d)?;
                match h.kind {
                    CgroupKind::V2 => write(&d.join("cpu.max"), &format!("{quota} {period}"))?,
                    CgroupKind::V1Cpu => {
                        write(&d.join("cpu.cfs_period_us"), &period.to_string())?;
                        write(&d.join("cpu.cfs_quota_us"), &quota.to_string())?;
                    }
                    CgroupKind::Unified | CgroupKind::V1Cpuset => {}
                }
                let e = hosts.cgroups.entry(n.clone()).or_default();
                // The v2 (or unified) directory first: gatherd reads the node's CPU there.
                if matches!(h.kind, CgroupKind::V2 | CgroupKind::Unified) {
                    e.insert(0, d);
                } else {
                    e.push(d);
                }
            }
        }
        Ok(hosts)
    }

    /// The node's cgroup where gatherd reads its CPU use (`None` without a quota).
    pub fn cgroup_dir(&self, node: &str) -> Option<PathBuf> {
        self.cgroups.get(node).and_then(|v| v.first().cloned())
    }

    /// The loopback address standing for `node`'s fixed `port` of the netns layout: a
    /// free port, the same one for the whole run.
    pub fn addr(&self, node: &str, port: u16) -> io::Result<SocketAddr> {
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&p) = ports.get(&(node.to_string(), port)) {
            return Ok(SocketAddr::new(LOCALHOST, p));
        }
        // A udp port too for the region's udp server: bind both to be sure it is free.
        let p = loop {
            let t = std::net::TcpListener::bind((LOCALHOST, 0))?;
            let p = t.local_addr()?.port();
            if std::net::UdpSocket::bind((LOCALHOST, p)).is_ok() && !ports.values().any(|&q| q == p)
            {
                break p;
            }
        };
        ports.insert((node.to_string(), port), p);
        Ok(SocketAddr::new(LOCALHOST, p))
    }

    /// Start `program args` as a process of `node` (in its cgroups, if any), dying with
    /// the lab, stdout and stderr appended to `log`.
    pub fn spawn(
        &self,
        node: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> io::Result<std::process::Child> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| ctx(e, &format!("open log {}", log.display())))?;
        let mut procs: Vec<OwnedFd> = Vec::new();
        for d in self.cgroups.get(node).into_iter().flatten() {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("cgroup.procs"))
                .map_err(|e| ctx(e, &format!("open {}/cgroup.procs", d.display())))?;
            procs.push(f.into());
        }
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        // SAFETY: only async-signal-safe calls (prctl, write) between fork and exec; the
        // fds are owned by the closure and close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                crate::fabric::procs::reset_signal_mask();
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                for fd in &procs {
                    // "0" = the writing process itself (v1 and v2).
                    if libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        cmd.spawn().map_err(|e| {
            ctx(
                e,
                &format!(
                    "start {} {} for node {node}",
                    program.display(),
                    args.join(" ")
                ),
            )
        })
    }
}

impl Drop for LoopbackHosts {
    /// Kill whatever is left in the nodes' cgroups and remove the cgroups this run made
    /// (never the shared `farside` subtree).
    fn drop(&mut self) {
        for dirs in self.cgroups.values() {
            for d in dirs {
                for pid in std::fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse::<i32>().ok())
                {
                    // SAFETY: kill has no memory effects; the pid is in our cgroup.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        for dirs in self.cgroups.values() {
            for d in dirs {
                for _ in 0..RMDIR_ATTEMPTS {
                    if std::fs::remove_dir(d).is_ok() || !d.exists() {
                        break;
                    }
                    std::thread::sleep(RMDIR_PAUSE);
                }
            }
        }
        for r in &self.run_dirs {
            let _ = std::fs::remove_dir(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_stable_per_node_and_role() {
        let h = LoopbackHosts::create("t", &["b0".into(), "b1".into()], None).unwrap();
        let a = h.addr("b0", 80).unwrap();
        assert_eq!(a.ip(), LOCALHOST);
        assert_eq!(h.addr("b0", 80).unwrap(), a, "stable");
        let others = [
            h.addr("b0", 7001).unwrap(),
            h.addr("b1", 80).unwrap(),
            h.addr("b1", 7001).unwrap(),
        ];
        for o in others {
            assert_ne!(o, a);
        }
        assert_ne!(others[0], others[1]);
        assert!(h.cgroup_dir("b0").is_none(), "no quota: no cgroup");
    }
}
