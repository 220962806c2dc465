//! gatherd's keys and replay windows over time: the replay state that keeps a restart
//! from accepting requests again (`--replay-state`, `farside_auth::floor`), and key
//! reloads without a restart (SIGHUP: `--rmem-key` files and `--rmem-key-dir`
//! re-read, the user-space keyring and the XDP program's keys map replaced in place).
//!
//! ```text
//!  start:  FloorFile::open ─► limits ─► ServerKeys' table, XDP rmem_seqlim (before serving)
//!  keeper thread, every CEILING_TICK:
//!          FloorFile::extend (persisted) ─► ceiling ─► ServerKeys' table, XDP map
//!          SIGHUP seen ─► reload: every key file read again ─► XDP keys map, ServerKeys
//! ```
//!
//! A reload is all or nothing: a key file that cannot be read (wrong mode, weak key)
//! keeps the previous keys and is logged; a key file that no longer exists revokes its
//! key (that is how a key is revoked: remove its file, send SIGHUP). Keys in
//! `--rmem-key-dir` are the files named `ROLE-ID.key` (`reader-1.key`,
//! `balancer-7.key`); adding one and sending SIGHUP adds the key (a rotation: clients
//! move to it, then the old file goes).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use farside_auth::floor::{FloorFile, Limits, CEILING_TICK};
use farside_auth::keys::Keyring;
use farside_auth::replay::Sequencer;
use farside_rmem::{KeySpec, ServerKeys};

use crate::GatherdArgs;

/// Files looked at in `--rmem-key-dir`: more than a keyring holds, so a directory
/// with too many keys is refused by the keyring's own bound, not cut silently.
const KEY_DIR_ENTRIES_MAX: usize = 4 * farside_auth::keys::KEYS_MAX;

/// SIGHUPs received: every keeper of the process (one per gatherd) reloads when it
/// changes.
static SIGHUPS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sighup(_: libc::c_int) {
    SIGHUPS.fetch_add(1, Ordering::Relaxed);
}

/// Install the SIGHUP handler (a flag the keeper polls: async-signal-safe).
fn install_sighup() {
    // SAFETY: a handler that only stores to an atomic; sigaction with a zeroed mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sighup as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGHUP, &sa, std::ptr::null_mut());
    }
}

/// The key specs of `--rmem-key-dir`: its files `ROLE-ID.key`, in id order.
pub fn dir_specs(dir: &Path) -> Result<Vec<KeySpec>, String> {
    let rd =
        std::fs::read_dir(dir).map_err(|e| format!("--rmem-key-dir {}: {e}", dir.display()))?;
    let mut specs = Vec::new();
    for (n, e) in rd.enumerate() {
        if n >= KEY_DIR_ENTRIES_MAX {
            return Err(format!(
                "--rmem-key-dir {}: more than {KEY_DIR_ENTRIES_MAX} entries",
                dir.display()
            ));
        }
        let e = e.map_err(|e| format!("--rmem-key-dir {}: {e}", dir.display()))?;
        let name = e.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".key")) else {
            continue;
        };
        let Some((role, id)) = stem.rsplit_once('-') else {
            continue;
        };
        let spec = format!("{role}:{id}:{}", e.path().display());
        specs.push(KeySpec::parse(&spec).map_err(|m| format!("--rmem-key-dir: {m}"))?);
    }
    specs.sort_by_key(|s| s.id);
    Ok(specs)
}

/// Every key spec of `args`: `--rmem-key` flags, then `--rmem-key-dir`'s files. With
/// `reload`, a flag's key file that no longer exists is left out (revoked).
pub fn specs(args: &GatherdArgs, reload: bool) -> Result<Vec<KeySpec>, String> {
    let mut v: Vec<KeySpec> = args
        .rmem_keys
        .iter()
        .filter(|s| {
            !(reload
                && s.path
                    .as_deref()
                    .is_some_and(|p| matches!(std::fs::symlink_metadata(p), Err(e) if e.kind() == std::io::ErrorKind::NotFound)))
        })
        .cloned()
        .collect();
    if let Some(d) = &args.rmem_key_dir {
        v.extend(dir_specs(d)?);
    }
    Ok(v)
}

/// The keyring `args` names now (every key file read).
pub fn load_keyring(args: &GatherdArgs, reload: bool) -> Result<Keyring, String> {
    ServerKeys::load(&specs(args, reload)?).map(|k| k.keyring())
}

/// Counters of the keeper, for the metrics.
#[derive(Debug, Default)]
pub struct TrustStats {
    /// Key reloads applied.
    pub reloads: AtomicU64,
    /// Key reloads refused (a key file that cannot be read; previous keys kept).
    pub reload_failures: AtomicU64,
    /// Writes of the replay state that failed (the ceiling stays: a denial, logged).
    pub state_write_failures: AtomicU64,
    /// The ceiling in force (0: none).
    pub ceiling: AtomicU64,
}

impl TrustStats {
    /// The keeper's metrics.
    pub fn render(&self, enc: &mut farside_admin::Encoder) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        enc.counter(
            "farside_gatherd_key_reloads_total",
            "Key reloads applied (SIGHUP).",
            &[],
            l(&self.reloads),
        );
        enc.counter(
            "farside_gatherd_key_reload_failures_total",
            "Key reloads refused, previous keys kept (logged).",
            &[],
            l(&self.reload_failures),
        );
        enc.counter(
            "farside_gatherd_replay_state_write_failures_total",
            "Writes of the --replay-state file that failed (logged; the ceiling stays).",
            &[],
            l(&self.state_write_failures),
        );
    }
}

/// What the keeper changes: the user-space keys and windows, and the XDP program's.
#[derive(Clone)]
pub struct Targets {
    pub keys: Arc<ServerKeys>,
    pub xdp: Option<Arc<farside_xdp::XdpResponder>>,
}

impl Targets {
    /// Apply replay limits everywhere (both only rise).
    pub fn limits(&self, l: Limits) -> Result<(), String> {
        self.keys.with_replay(|t| l.apply(t));
        if let Some(x) = self.xdp.as_ref().filter(|x| x.serves_udp()) {
            x.set_replay_limits(l).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Replace the keys everywhere: the XDP program's first (the kernel's answers),
    /// then user space's. Returns the key ids revoked.
    pub fn keys(&self, ring: Keyring) -> Result<Vec<u32>, String> {
        if let Some(x) = self.xdp.as_ref().filter(|x| x.serves_udp()) {
            x.set_keys(&ring).map_err(|e| e.to_string())?;
        }
        Ok(self
            .keys
            .replace_keyring(ring)
            .iter()
            .map(|k| k.0)
            .collect())
    }
}

/// The replay state at start: read `--replay-state` (persisting this life's first
/// ceiling) or, without it, the clock's floor. Before any server answers.
pub fn start_limits(args: &GatherdArgs) -> std::io::Result<(Option<FloorFile>, Limits)> {
    let now = Sequencer::unix_s();
    match &args.replay_state {
        Some(p) => {
            let (f, l) = FloorFile::open(p, now)?;
            log::info!(
                "gatherd: replay state {}: requests at or below {} refused (sealed before this start)",
                p.display(),
                l.floor
            );
            Ok((Some(f), l))
        }
        None => Ok((None, Limits::without_state(now))),
    }
}

/// The keeper thread: raises the ceiling and applies SIGHUP's reloads until dropped.
pub struct Keeper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub stats: Arc<TrustStats>,
}

impl Keeper {
    pub fn spawn(
        args: &GatherdArgs,
        file: Option<FloorFile>,
        targets: Targets,
    ) -> std::io::Result<Keeper> {
        install_sighup();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(TrustStats::default());
        let (s, st, a) = (stop.clone(), stats.clone(), args.clone());
        // SIGHUPs from now on reload (counted before the thread runs: none is missed).
        let hups = SIGHUPS.load(Ordering::Relaxed);
        let thread = std::thread::Builder::new()
            .name("gatherd-trust".into())
            .spawn(move || keep(&a, file, &targets, &st, &s, hups))?;
        Ok(Keeper {
            stop,
            thread: Some(thread),
            stats,
        })
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn keep(
    args: &GatherdArgs,
    mut file: Option<FloorFile>,
    targets: &Targets,
    stats: &TrustStats,
    stop: &AtomicBool,
    mut hups: u64,
) {
    if let Some(f) = &file {
        stats.ceiling.store(f.ceiling(), Ordering::Relaxed);
    }
    while !stop.load(Ordering::Relaxed) {
        if let Some(f) = file.as_mut() {
            match f.extend(Sequencer::unix_s()) {
                Ok(Some(c)) => match targets.limits(Limits {
                    floor: 0,
                    ceiling: c,
                }) {
                    Ok(()) => stats.ceiling.store(c, Ordering::Relaxed),
                    Err(e) => log::error!("gatherd: raising the replay ceiling: {e}"),
                },
                Ok(None) => {}
                Err(e) => {
                    stats.state_write_failures.fetch_add(1, Ordering::Relaxed);
                    log::error!(
                        "gatherd: {}: {e}; the ceiling stays (requests from later seconds are refused until a write succeeds)",
                        f.path().display()
                    );
                }
            }
        }
        let now = SIGHUPS.load(Ordering::Relaxed);
        if now != hups {
            hups = now;
            reload(args, targets, stats);
        }
        sleep_unless(stop, CEILING_TICK);
    }
}

/// One reload: all or nothing (see the module doc).
pub fn reload(args: &GatherdArgs, targets: &Targets, stats: &TrustStats) {
    match load_keyring(args, true).and_then(|ring| {
        let ids: Vec<u32> = ring.iter().map(|e| e.id.0).collect();
        targets.keys(ring).map(|gone| (ids, gone))
    }) {
        Ok((ids, gone)) => {
            stats.reloads.fetch_add(1, Ordering::Relaxed);
            log::info!("gatherd: keys reloaded: ids {ids:?}; revoked {gone:?}");
        }
        Err(e) => {
            stats.reload_failures.fetch_add(1, Ordering::Relaxed);
            log::error!("gatherd: key reload refused, previous keys kept: {e}");
        }
    }
}

/// Wait `d`, or until the keeper is stopped (its `Drop` unparks the thread). One
/// wake-up per tick: polling the stop flag in short steps woke the process 20 times
/// a second for nothing, which cost more than publishing the load record with the
/// kernel sampler (~25 µs per wake-up on a VM).
fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let deadline = std::time::Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::park_timeout(left);
    }
}

#[cfg(test)]
mod tests;
