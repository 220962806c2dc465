//! The node agent (seed 001): watches this node's own `ROLE_WANTED` word
//! (local memory: gatherd owns the region), runs `farside_reconf::NodeAgent`, applies a
//! new site to the local web server, and publishes `ROLE_SERVED` / `ROLE_EPOCH` /
//! `ROLE_ERROR`. Balancers write `ROLE_WANTED` remotely (CAS); proxies route by
//! `ROLE_SERVED`, so no request reaches this node for a site it does not serve yet.
//!
//! How a site is applied (one of):
//! - `--role-backend-control PATH`: the farside test server's control socket
//!   (`farside backend --sites-root DIR --control PATH`): `site NAME`, answered
//!   `ok NAME` once every later request is served from the new site.
//! - `--role-apply-cmd CMD` (e.g. `nginx -s reload`), optionally with `--role-include
//!   FILE --role-sites-root DIR`: the include is rewritten (atomically) to
//!   `root DIR/NAME;`, then `sh -c CMD` runs with `{site}`, `{site_id}`, `{root}`
//!   substituted (and `FARSIDE_SITE`, `FARSIDE_SITE_ID`, `FARSIDE_SITE_ROOT` in its
//!   environment). Exit status 0 within `--role-apply-timeout-ms` is success; on failure
//!   the previous include is restored, so the server keeps its old site even across an
//!   unrelated reload.
//!
//! A failed apply keeps the old role served, writes the failed wanted value to
//! `ROLE_ERROR`, logs it and counts it (`farside_gatherd_role_apply_failures_total`); it
//! is retried after `--role-retry-ms`. Site ids map to names with `--role-sites a,b,c`
//! (id = index); without it a site's name is its decimal id.
//!
//! Before each apply the agent drains: it publishes `ROLE_SERVED` with version 0 (no
//! role: proxies route nothing to it) and waits `--role-drain-ms`, so no request for the
//! old site arrives after the server switched; a failed apply restores the served word.
//!
//! At a node's first start the agent applies `--role-initial` (default site 0) and
//! publishes it as both wanted and served at version 1: a served word of version 0
//! means "no agent" to proxies. The role, the switch count and a boot epoch are kept in
//! a state file ([`state`], `--role-state`): a restart serves the site served before,
//! at a version above every version of the node's earlier lives, so a balancer's CAS
//! from before the restart cannot succeed on it.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farside_admin::Encoder;
use farside_reconf::words::{W_ROLE_EPOCH, W_ROLE_ERROR, W_ROLE_SERVED, W_ROLE_WANTED};
use farside_reconf::{NodeAgent, Role};
use farside_region::Words;

pub mod state;

/// Longest allowed `--role-poll-ms`: the poll period adds to every switch.
pub const POLL_MS_MAX: u64 = 1000;
/// Longest allowed `--role-apply-timeout-ms`: a reload that takes longer is hung.
pub const APPLY_TIMEOUT_MS_MAX: u64 = 600_000;
/// Longest allowed `--role-drain-ms`: a drain adds to every switch.
pub const DRAIN_MS_MAX: u64 = 10_000;
/// Most sites `--role-sites` may name (the role word holds 16 bits of site).
pub const SITES_MAX: usize = farside_reconf::words::SITE_MAX;
/// Bounds (ms) of the switch-time histogram: from a local control-socket switch
/// (sub-millisecond) to a slow nginx reload.
const SWITCH_MS_BUCKETS: [f64; 10] = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];
/// Longest command output kept for the error message.
const CMD_OUTPUT_MAX: usize = 512;

/// Flags of the node agent (`farside gatherd --role-*`). Off unless an apply mechanism
/// is given.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RoleArgs {
    /// Run the node agent, switching the farside test server's site through its
    /// control socket (`farside backend --control PATH`).
    #[arg(long = "role-backend-control", conflicts_with = "role_apply_cmd")]
    pub role_backend_control: Option<PathBuf>,
    /// Run the node agent, applying a site with this shell command (e.g.
    /// `nginx -s reload`); `{site}`, `{site_id}` and `{root}` are substituted. Exit
    /// status 0 is success.
    #[arg(long = "role-apply-cmd")]
    pub role_apply_cmd: Option<String>,
    /// With --role-apply-cmd: a file rewritten before the command to `root DIR/NAME;`
    /// (an nginx include), restored if the command fails. Needs --role-sites-root.
    #[arg(long = "role-include", requires = "role_sites_root")]
    pub role_include: Option<PathBuf>,
    /// With --role-include: the directory holding one sub-directory per site.
    #[arg(long = "role-sites-root")]
    pub role_sites_root: Option<PathBuf>,
    /// Site names by id (comma-separated; id = position). Default: a site's name is
    /// its decimal id.
    #[arg(long = "role-sites", value_delimiter = ',')]
    pub role_sites: Vec<String>,
    /// The site id served at the node's first start (no --role-state file yet); a
    /// restart serves the site it served before. Default 0.
    #[arg(long = "role-initial", default_value_t = 0)]
    pub role_initial: u16,
    /// The agent's state file: the served site and version, the switch count and the
    /// boot epoch, kept across restarts (written atomically, 0600; its directory made
    /// 0700 and checked). A restart serves the same site at versions above every
    /// earlier one. Default `node<ID>.state` in systemd's `$STATE_DIRECTORY` (a unit's
    /// `StateDirectory=`), else in `/var/lib/farside` as root, else in
    /// `$XDG_STATE_HOME/farside`.
    #[arg(long = "role-state")]
    pub role_state: Option<PathBuf>,
    /// How often the agent reads ROLE_WANTED, ms (1..=1000). Default 5.
    #[arg(long = "role-poll-ms", default_value_t = 5)]
    pub role_poll_ms: u64,
    /// Time an apply may take before it counts as failed, ms. Default 10000.
    #[arg(long = "role-apply-timeout-ms", default_value_t = 10_000)]
    pub role_apply_timeout_ms: u64,
    /// Before reconfiguring, publish "no role" (ROLE_SERVED version 0) and wait this
    /// long, so proxies stop sending the old site's requests before the server changes
    /// site (it must cover the proxies' monitor period G and a request's time in
    /// flight; 0..=10000). Default 20.
    #[arg(long = "role-drain-ms", default_value_t = 20)]
    pub role_drain_ms: u64,
    /// Wait before retrying a wanted role whose apply failed, ms. Default 30000.
    #[arg(long = "role-retry-ms", default_value_t = farside_reconf::agent::APPLY_RETRY_NS_DEFAULT / 1_000_000)]
    pub role_retry_ms: u64,
}

impl RoleArgs {
    /// Is the agent asked for?
    pub fn enabled(&self) -> bool {
        self.role_backend_control.is_some() || self.role_apply_cmd.is_some()
    }

    /// Checks every bound; the message names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if !self.enabled() {
            let stray = self.role_include.is_some()
                || self.role_sites_root.is_some()
                || !self.role_sites.is_empty();
            return if stray {
                Err("--role-*: needs --role-backend-control or --role-apply-cmd".into())
            } else {
                Ok(())
            };
        }
        if !(1..=POLL_MS_MAX).contains(&self.role_poll_ms) {
            return Err(format!("--role-poll-ms: 1..={POLL_MS_MAX}"));
        }
        if !(1..=APPLY_TIMEOUT_MS_MAX).contains(&self.role_apply_timeout_ms) {
            return Err(format!(
                "--role-apply-timeout-ms: 1..={APPLY_TIMEOUT_MS_MAX}"
            ));
        }
        if self.role_sites.len() > SITES_MAX {
            return Err(format!("--role-sites: at most {SITES_MAX} sites"));
        }
        for s in &self.role_sites {
            if !farside_reconf::sites::valid_site_name(s) {
                return Err(format!(
                    "--role-sites: {s:?} is not a site name (1..={} of [A-Za-z0-9._-])",
                    farside_reconf::sites::SITE_NAME_MAX
                ));
            }
        }
        if self.role_drain_ms > DRAIN_MS_MAX {
            return Err(format!("--role-drain-ms: 0..={DRAIN_MS_MAX}"));
        }
        if !self.role_sites.is_empty() && usize::from(self.role_initial) >= self.role_sites.len() {
            return Err(format!(
                "--role-initial {}: only {} sites in --role-sites",
                self.role_initial,
                self.role_sites.len()
            ));
        }
        if self.role_include.is_some() && self.role_apply_cmd.is_none() {
            return Err("--role-include needs --role-apply-cmd".into());
        }
        Ok(())
    }

    /// The name of site `id`, or `None` if `--role-sites` does not list it.
    fn site_name(&self, id: u16) -> Option<String> {
        if self.role_sites.is_empty() {
            Some(id.to_string())
        } else {
            self.role_sites.get(usize::from(id)).cloned()
        }
    }
}

/// The agent's counters (Prometheus, `farside_gatherd_role_*`).
#[derive(Default)]
pub struct RoleStats {
    /// Sites applied.
    pub switches: AtomicU64,
    /// Applies that failed.
    pub failures: AtomicU64,
    /// Fences republished without reconfiguring.
    pub fences: AtomicU64,
    /// The served site now.
    pub served_site: AtomicU64,
    /// Switch times (wanted seen -> served published), per bucket of `SWITCH_MS_BUCKETS`
    /// and one overflow; and their sum in µs.
    switch_hist: [AtomicU64; SWITCH_MS_BUCKETS.len() + 1],
    switch_us_sum: AtomicU64,
    /// The last switch time, µs.
    pub last_switch_us: AtomicU64,
    /// This start's boot epoch (`role::state`).
    pub boot_epoch: AtomicU64,
    /// State-file writes that failed (the role is served regardless; logged).
    pub state_write_failures: AtomicU64,
}

impl RoleStats {
    fn record_switch(&self, d: Duration) {
        let ms = d.as_secs_f64() * 1000.0;
        let i = SWITCH_MS_BUCKETS
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(SWITCH_MS_BUCKETS.len());
        self.switch_hist[i].fetch_add(1, Ordering::Relaxed);
        let us = d.as_micros() as u64;
        self.switch_us_sum.fetch_add(us, Ordering::Relaxed);
        self.last_switch_us.store(us, Ordering::Relaxed);
    }

    /// Report into a scrape.
    pub fn render(&self, enc: &mut Encoder) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        enc.counter(
            "farside_gatherd_role_switches_total",
            "Sites applied by the node agent (ROLE_SERVED changed site).",
            &[],
            l(&self.switches),
        );
        enc.counter(
            "farside_gatherd_role_apply_failures_total",
            "Applies that failed (the old site stays served; ROLE_ERROR set).",
            &[],
            l(&self.failures),
        );
        enc.counter(
            "farside_gatherd_role_fences_total",
            "Fences (same site, new version) republished without reconfiguring.",
            &[],
            l(&self.fences),
        );
        enc.gauge(
            "farside_gatherd_boot_epoch",
            "Starts of this node's gatherd with the role agent (the persisted boot epoch).",
            &[],
            l(&self.boot_epoch),
        );
        enc.counter(
            "farside_gatherd_role_state_write_failures_total",
            "Writes of the --role-state file that failed (logged).",
            &[],
            l(&self.state_write_failures),
        );
        enc.gauge(
            "farside_gatherd_role_served_site",
            "The site id this node serves now.",
            &[],
            l(&self.served_site),
        );
        enc.histogram(
            "farside_gatherd_role_switch_ms",
            "Switch time: a new ROLE_WANTED seen to ROLE_SERVED published, ms.",
            &[],
            SWITCH_MS_BUCKETS
                .iter()
                .zip(&self.switch_hist)
                .map(|(b, n)| (*b, l(n))),
            l(&self.switch_hist[SWITCH_MS_BUCKETS.len()]),
            l(&self.switch_us_sum) as f64 / 1000.0,
        );
    }
}

/// The running agent; stops (and joins its thread) on drop.
pub struct RoleAgent {
    /// Its counters.
    pub stats: Arc<RoleStats>,
    /// The state this start began from (boot epoch, role published).
    pub started: state::RoleState,
    /// Where the state is kept.
    pub state_path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RoleAgent {
    /// Apply the initial site, publish it, and start watching `ROLE_WANTED` in `mem`.
    /// `None` if the agent is not asked for. Call before any server answers, so no
    /// reader sees the words unset.
    pub fn start(
        args: &RoleArgs,
        node_id: u64,
        mem: Arc<dyn Words>,
    ) -> io::Result<Option<RoleAgent>> {
        args.validate()
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
        if !args.enabled() {
            return Ok(None);
        }
        let applier = Applier { args: args.clone() };
        // The boot epoch is durable before any role of this life is published.
        let state_path = args
            .role_state
            .clone()
            .unwrap_or_else(|| state::default_path(node_id));
        let prev = state::load(&state_path, node_id)?;
        let mut st = state::next_boot(prev, node_id, args.role_initial)?;
        state::save(&state_path, &st)?;
        let initial = st.role();
        applier
            .apply(initial.site())
            .map_err(|e| io::Error::other(format!("gatherd: initial role: {e}")))?;
        let words = mem.words();
        words[W_ROLE_ERROR].store(0, Ordering::Release);
        words[W_ROLE_WANTED].store(initial.0, Ordering::Release);
        words[W_ROLE_SERVED].store(initial.0, Ordering::Release);
        // Never backwards: neither below the persisted count nor below a reused region's.
        let epoch = (words[W_ROLE_EPOCH].load(Ordering::Acquire) + 1).max(st.role_epoch);
        words[W_ROLE_EPOCH].store(epoch, Ordering::Release);
        st.role_epoch = epoch;
        let stats = Arc::new(RoleStats::default());
        stats
            .served_site
            .store(initial.site().into(), Ordering::Relaxed);
        stats.boot_epoch.store(st.boot_epoch, Ordering::Relaxed);
        log::info!(
            "gatherd: role agent serving site {} at version {:#x} (boot epoch {}, {}, state {})",
            initial.site(),
            initial.version(),
            st.boot_epoch,
            if prev.is_some() {
                "restarted"
            } else {
                "first start"
            },
            state_path.display()
        );
        let started = st;
        let path = state_path.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let (st, stp) = (stats.clone(), stop.clone());
        let poll = Duration::from_millis(args.role_poll_ms);
        let drain = Duration::from_millis(args.role_drain_ms);
        let retry_ns = args.role_retry_ms.saturating_mul(1_000_000);
        let thread = std::thread::Builder::new()
            .name("gatherd-role".into())
            .spawn(move || {
                let t0 = Instant::now();
                let mut agent = NodeAgent::new(initial, retry_ns);
                let mut kept = started;
                while !stp.load(Ordering::Relaxed) {
                    std::thread::sleep(poll);
                    let words = mem.words();
                    let seen = Instant::now();
                    let served = agent.served();
                    let wanted = Role(words[W_ROLE_WANTED].load(Ordering::Acquire));
                    let now_ns = t0.elapsed().as_nanos() as u64;
                    let top = served.version().max(wanted.version());
                    let err = agent.step(now_ns, words, |site| {
                        // Drain: proxies route by the served word, so none sends the old
                        // site's requests once they read version 0; restored on failure.
                        words[W_ROLE_SERVED].store(Role::new(served.site(), 0).0, Ordering::Release);
                        std::thread::sleep(drain);
                        let out = applier.apply(site);
                        if out.is_err() {
                            words[W_ROLE_SERVED].store(served.0, Ordering::Release);
                        }
                        out
                    });
                    if let Some(e) = err {
                        st.failures.fetch_add(1, Ordering::Relaxed);
                        log::error!("gatherd: role: {e}");
                    } else if agent.served() != served {
                        if agent.served().site() == served.site() {
                            st.fences.fetch_add(1, Ordering::Relaxed);
                        } else {
                            st.switches.fetch_add(1, Ordering::Relaxed);
                            st.served_site
                                .store(agent.served().site().into(), Ordering::Relaxed);
                            let d = seen.elapsed();
                            st.record_switch(d);
                            log::info!(
                                "gatherd: role: now serving site {} (wanted {:#x}), switch {:.1} ms",
                                wanted.site(),
                                wanted.0,
                                d.as_secs_f64() * 1000.0
                            );
                        }
                    }
                    // Persist what a restart must stay above (after the counters, which
                    // readers of the words may scrape at once): the served role, the
                    // highest version seen, the switch count.
                    let now_served = agent.served();
                    let now_epoch = words[W_ROLE_EPOCH].load(Ordering::Acquire);
                    if now_served.site() != kept.site
                        || top.max(now_served.version()) > kept.version
                        || now_epoch != kept.role_epoch
                    {
                        kept.site = now_served.site();
                        kept.version = kept.version.max(top).max(now_served.version());
                        kept.role_epoch = now_epoch;
                        if let Err(e) = state::save(&path, &kept) {
                            st.state_write_failures.fetch_add(1, Ordering::Relaxed);
                            log::error!("gatherd: role: {e}");
                        }
                    }
                }
            })?;
        Ok(Some(RoleAgent {
            stats,
            started,
            state_path,
            stop,
            thread: Some(thread),
        }))
    }
}

impl Drop for RoleAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Applies a site to the local web server.
struct Applier {
    args: RoleArgs,
}

impl Applier {
    fn apply(&self, site: u16) -> Result<(), String> {
        let name = self
            .args
            .site_name(site)
            .ok_or_else(|| format!("site {site} is not in --role-sites"))?;
        let timeout = Duration::from_millis(self.args.role_apply_timeout_ms);
        if let Some(sock) = &self.args.role_backend_control {
            return farside_reconf::sites::request_site(sock, &name, timeout);
        }
        let Some(cmd) = &self.args.role_apply_cmd else {
            return Err("no apply mechanism".into());
        };
        let root = self
            .args
            .role_sites_root
            .as_ref()
            .map(|r| r.join(&name))
            .unwrap_or_default();
        let old = match &self.args.role_include {
            Some(inc) => {
                let old = std::fs::read(inc).ok();
                write_atomically(inc, format!("root {};\n", root.display()).as_bytes())
                    .map_err(|e| format!("--role-include {}: {e}", inc.display()))?;
                Some((inc, old))
            }
            None => None,
        };
        let cmd = cmd
            .replace("{site_id}", &site.to_string())
            .replace("{site}", &name)
            .replace("{root}", &root.display().to_string());
        let out = run_with_timeout(&cmd, site, &name, &root, timeout);
        if out.is_err() {
            if let Some((inc, old)) = old {
                let restored = match old {
                    Some(bytes) => write_atomically(inc, &bytes),
                    None => std::fs::remove_file(inc),
                };
                if let Err(e) = restored {
                    log::error!("gatherd: role: restoring {}: {e}", inc.display());
                }
            }
        }
        out
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("farside-tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// `sh -c cmd`, killed after `timeout`; Ok on exit status 0.
fn run_with_timeout(
    cmd: &str,
    site: u16,
    name: &str,
    root: &Path,
    timeout: Duration,
) -> Result<(), String> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("FARSIDE_SITE", name)
        .env("FARSIDE_SITE_ID", site.to_string())
        .env("FARSIDE_SITE_ROOT", root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("--role-apply-cmd `{cmd}`: {e}"))?;
    let deadline = Instant::now() + timeout;
    // Poll the child: the bound is the timeout, the step keeps a fast reload fast.
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "--role-apply-cmd `{cmd}`: no exit within {} ms (killed)",
                    timeout.as_millis()
                ));
            }
            Err(e) => return Err(format!("--role-apply-cmd `{cmd}`: {e}")),
        }
    };
    if status.success() {
        return Ok(());
    }
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let mut buf = vec![0u8; CMD_OUTPUT_MAX];
        let n = e.read(&mut buf).unwrap_or(0);
        stderr = String::from_utf8_lossy(&buf[..n]).trim().to_owned();
    }
    Err(format!("--role-apply-cmd `{cmd}`: {status}: {stderr}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_role_flags_name_the_flag() {
        let on = RoleArgs {
            role_apply_cmd: Some("true".into()),
            role_poll_ms: 5,
            role_apply_timeout_ms: 1000,
            ..RoleArgs::default()
        };
        on.validate().unwrap();
        for (bad, flag) in [
            (
                RoleArgs {
                    role_poll_ms: 0,
                    ..on.clone()
                },
                "--role-poll-ms",
            ),
            (
                RoleArgs {
                    role_drain_ms: DRAIN_MS_MAX + 1,
                    ..on.clone()
                },
                "--role-drain-ms",
            ),
            (
                RoleArgs {
                    role_sites: vec!["a/b".into()],
                    ..on.clone()
                },
                "--role-sites",
            ),
            (
                RoleArgs {
                    role_sites: vec!["a".into()],
                    role_initial: 1,
                    ..on.clone()
                },
                "--role-initial",
            ),
            (
                RoleArgs {
                    role_sites_root: Some("/x".into()),
                    ..RoleArgs::default()
                },
                "--role-",
            ),
        ] {
            let e = bad.validate().unwrap_err();
            assert!(e.contains(flag), "{e}");
        }
        assert_eq!(on.site_name(3).as_deref(), Some("3"));
    }
}
