//! Crash mode of `lab coop`: one node's process killed with SIGKILL in the measured
//! window and started again with the same arguments, from a keeper thread that lives as
//! long as the point (see the module doc of `coop`); and the processes of one point
//! ([`Running`]), of which crash mode replaces a node's.

use super::client::stats;
use crate::fabric::netns::VirtualDc;
use crate::fabric::procs::Child;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The clients' node.
pub(super) const CLIENT: &str = "client";
/// How long a process may take to listen.
pub(super) const READY_WITHIN: Duration = Duration::from_secs(20);
pub(super) const READY_POLL: Duration = Duration::from_millis(50);
/// Crash mode: longest a SIGKILLed node may take to be reaped.
pub(super) const KILL_WITHIN: Duration = Duration::from_secs(5);

/// How a node's process was started (crash mode starts it again so).
#[derive(Clone)]
pub(super) struct NodeSpawn {
    /// Its index in [`Running::children`].
    pub(super) child: usize,
    pub(super) name: String,
    pub(super) args: Vec<String>,
    pub(super) log: PathBuf,
    pub(super) http: SocketAddr,
}

/// The processes of one point; stopped on drop.
pub(super) struct Running {
    pub(super) children: Vec<Child>,
    /// Node `i`'s coop process, for the systems crash mode runs.
    pub(super) spawns: Vec<Option<NodeSpawn>>,
    /// Crash mode: the threads that started restarted nodes wait until this is dropped
    /// (a node dies with the thread that started it: PR_SET_PDEATHSIG). After
    /// `children`, so the nodes are stopped first.
    pub(super) _keepers: Vec<std::sync::mpsc::Sender<()>>,
    /// Where the lab reads `/coop/stats`: the nodes (rr, press) or the origins (haproxy).
    pub(super) stats_at: Vec<SocketAddr>,
    /// Where the clients of node `i`'s share connect.
    pub(super) targets: Vec<SocketAddr>,
    /// nginx prefix directories to remove.
    pub(super) prefixes: Vec<PathBuf>,
    /// The anchor's nginx cache directories (their bytes are sampled at the end).
    pub(super) cache_dirs: Vec<PathBuf>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for c in &mut self.children {
            c.stop();
        }
        for p in &self.prefixes {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// What crash mode saw of its kill and restart.
pub(super) struct Crashed {
    pub(super) node: usize,
    /// The node's `/coop/stats` just before the kill.
    pub(super) stats_before_kill: String,
    /// From the kill until the new process accepted a connection, ms.
    pub(super) restart_ms: f64,
}

/// Crash mode: after `at`, kills node `node`'s process with SIGKILL, waits `down`, starts
/// it again with the same arguments and waits until it listens.
pub(super) fn crash_and_restart(
    dc: &VirtualDc,
    sys: &mut Running,
    node: usize,
    at: Duration,
    down: Duration,
) -> io::Result<Crashed> {
    std::thread::sleep(at);
    let spawn =
        sys.spawns.get(node).cloned().flatten().ok_or_else(|| {
            io::Error::other(format!("crash mode: node {node} has no coop process"))
        })?;
    let stats_before_kill = stats(spawn.http);
    let child = &mut sys.children[spawn.child];
    let killed = Instant::now();
    // SAFETY: signalling our own child, not yet reaped (checked alive just above by
    // the stats read; a pid is only reused after the reap, which happens here).
    unsafe { libc::kill(child.pid() as i32, libc::SIGKILL) };
    while child.exited().is_none() {
        if killed.elapsed() > KILL_WITHIN {
            return Err(io::Error::other(format!(
                "crash mode: {} not reaped {KILL_WITHIN:?} after SIGKILL",
                spawn.name
            )));
        }
        std::thread::sleep(READY_POLL);
    }
    eprintln!("lab coop: crash: {} killed", spawn.name);
    std::thread::sleep(down);
    // The node dies with the thread that starts it (PR_SET_PDEATHSIG, see
    // `prepare_command`): a keeper thread starts it and lives as long as the point.
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spawn.log)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(&spawn.args)
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    dc.prepare_command(&spawn.name, &mut cmd)?;
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name(format!("crash-keeper-{}", spawn.name))
        .spawn(move || {
            let started = cmd.spawn();
            let ok = started.is_ok();
            let _ = started_tx.send(started);
            if ok {
                // Until the point's processes are dropped (the sender with them).
                let _ = hold_rx.recv();
            }
        })?;
    let c = started_rx
        .recv()
        .map_err(|_| io::Error::other("crash mode: the keeper thread died"))??;
    sys._keepers.push(hold_tx);
    sys.children[spawn.child] = Child::adopt(&spawn.name, c, spawn.log.clone());
    crate::fabric::wait_port(
        &mut sys.children[spawn.child],
        spawn.http,
        crate::fabric::Vantage::Node(dc, CLIENT),
        READY_WITHIN,
        READY_POLL,
    )?;
    let restart_ms = killed.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "lab coop: crash: {} listening again {restart_ms:.0} ms after the kill",
        spawn.name
    );
    Ok(Crashed {
        node,
        stats_before_kill,
        restart_ms,
    })
}
