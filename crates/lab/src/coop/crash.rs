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
    let stats_before_kill = stats(sys.stats_at[node]);
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

/// Crash mode's figures from the clients' per-second series (summed over the
/// instances, second `t` since the end of warm-up): failures from second `at_s` on,
/// the recovery (see [`CoopPoint::recovery_s`]), the pre-crash mean rate, the fewest
/// served in a second from `at_s` on. `None` if the window has no second before the
/// crash or none after it.
pub fn crash_figures(series: &[Vec<(u64, u64, u64)>], at_s: u64) -> Option<(u64, f64, f64, f64)> {
    let len = series
        .iter()
        .flat_map(|s| s.iter().map(|&(t, _, _)| t + 1))
        .max()? as usize;
    let at = at_s as usize;
    if at == 0 || at >= len {
        return None;
    }
    let (mut served, mut failures) = (vec![0u64; len], vec![0u64; len]);
    for s in series {
        for &(t, ok, failed) in s {
            served[t as usize] += ok;
            failures[t as usize] += failed;
        }
    }
    let pre = served[..at].iter().sum::<u64>() as f64 / at as f64;
    let crash_failures = failures[at..].iter().sum();
    let recovery = (at + 1..len)
        .find(|&t| served[t] as f64 >= super::RECOVERED_FRACTION * pre && failures[t] == 0)
        .map_or(-1.0, |t| (t - at) as f64);
    let min = served[at..].iter().copied().min().unwrap_or(0) as f64;
    Some((crash_failures, recovery, pre, min))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_figures_count_failures_from_the_crash_and_find_the_recovery() {
        // Two client instances, 8 seconds; the crash in second 3.
        let a = vec![
            (0, 100, 0),
            (1, 100, 0),
            (2, 100, 0),
            (3, 40, 7),
            (4, 60, 0),
            (5, 95, 1),
            (6, 100, 0),
            (7, 100, 0),
        ];
        let b: Vec<_> = a
            .iter()
            .map(|&(t, s, f)| (t, s, f + u64::from(t == 4)))
            .collect();
        let (failures, recovery, pre, min) = crash_figures(&[a.clone(), b], 3).unwrap();
        assert_eq!(failures, 7 + 1 + 1 + 7 + 1);
        assert_eq!(pre, 200.0);
        assert_eq!(min, 80.0);
        // Second 5 serves 190 >= 180 but has failures; second 6 is the first clean one.
        assert_eq!(recovery, 3.0);
        // Never recovered within the window.
        let low: Vec<_> = a
            .iter()
            .map(|&(t, s, _)| (t, if t >= 3 { s / 2 } else { s }, 0))
            .collect();
        assert_eq!(crash_figures(&[low], 3).unwrap().1, -1.0);
        // No second before or after the crash.
        assert!(crash_figures(std::slice::from_ref(&a), 0).is_none());
        assert!(crash_figures(&[a], 8).is_none());
        assert!(crash_figures(&[], 3).is_none());
    }
}
