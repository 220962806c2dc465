//! `farside lab faults`: inject the faults a deployment meets into a loaded tier and
//! count what the clients saw.
//!
//! The tier: `backends` web servers (`farside backend`), one gatherd each serving its
//! region over udp (user space on loopback), one proxy (`farside proxy --config`,
//! admission on, `reuse_port = true`), and an open-loop loadgen (Poisson arrivals, one
//! request per connection) at `--rate` for the whole of every fault's phase. One phase
//! per fault, in this order:
//!
//! | fault | injected at `fault_at` | repaired (`time_to_fresh_ms` counts from here) |
//! |---|---|---|
//! | `gatherd-restart` | SIGKILL back-end 0's gatherd | a new gatherd started 0.5 s later serves (`repair_ms`: its start-up) |
//! | `backend-stop` | SIGSTOP back-end 0 | SIGCONT 2 s later |
//! | `backend-kill` | SIGKILL back-end 0 | a new back-end started 1 s later |
//! | `region-drop` (netns only) | an nftables rule drops 30% of region requests leaving the proxy node | the rule removed 2 s later |
//! | `proxy-restart` | a second proxy binds the port (SO_REUSEPORT), then SIGTERM to the first | the first exits (drained) |
//! | `reload` | config + spare back-end, SIGHUP | config without it, SIGHUP, 1 s later |
//!
//! Per fault a row: `answered` (responses < 500), `refused_503`, `failed` (connect and
//! I/O errors, malformed and non-503 5xx responses, by kind), `hung` (requests with no
//! response and no error within loadgen's `--timeout-ms`: its `timeouts`; must be 0),
//! `inflight_at_end` (cut by the end of the phase, not hung), and `time_to_fresh_ms`:
//! from the repair to the first scrape (every [`FRESH_POLL`]) of the proxy's admin
//! metrics in which every back-end's load is fresh (`farside_backend_load` ≥ 0); for
//! `gatherd-restart` that counts from the new gatherd serving again (`repair_ms` after
//! its spawn), and `time_to_fresh_from_repair_cmd_ms` from its spawn (polled while it
//! starts: its region answers before its start-up ends).
//! Target: `hung` = 0 for every fault; `time_to_fresh_from_repair_cmd_ms` ≤ 2 ×
//! `stale_after_ms` after the gatherd restart.
//!
//! Outputs in `--out`, through the shared runner ([`crate::sweep`]): one point per fault
//! appended to `points.jsonl` as it finishes (`--resume DIR` continues a broken run),
//! `summary.json` (commit, kernel, CPU, settings in `params`, the rows as `points`,
//! `targets_met`), `table.txt` and `faults.csv`; `farside lab report DIR` prints the
//! table again from the kept files.
//! The offered rate is `--load-share` (0.7) × the capacity measured by a short
//! closed-loop run through the proxy first, unless `--rate` sets it.
//! The phases share one tier; each starts only once the tier is quiet (no client
//! connection at the proxy, nothing queued or carrying a request at the back-ends:
//! [`crate::fabric::quiet`], at most [`PHASE_QUIET_MAX`]), and its record in
//! `points.jsonl` keeps how it started (`start`: `started_empty`, `settle_ms`, what the
//! previous phase left).
//!
//! `--hosts netns` (root) runs every node in its own network namespace
//! ([`crate::fabric::netns`]), regions over udp answered by XDP (generic mode) in the back-end
//! node's kernel, and adds `region-drop`: an nftables output rule in the proxy node's
//! namespace, `udp dport PORT numgen random mod 100 < 30 drop` (needs `nft`; this
//! kernel has no netem, prio or tc actions, and XDP's replies on the back-end side
//! bypass both qdiscs and netfilter).

use crate::fabric::flags::Hosts;
use crate::fabric::flags::SweepFlags;
use crate::fabric::procs::Child;
use farside_loadgen::{LoadgenArgs, Summary};
use serde::{Deserialize, Serialize};
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod point;
#[cfg(test)]
mod tests;
mod tier;

pub use point::*;
pub use tier::*;

/// The faults, in the order they run.
pub const FAULTS: [&str; 6] = [
    "gatherd-restart",
    "backend-stop",
    "backend-kill",
    "region-drop",
    "proxy-restart",
    "reload",
];
/// Faults that need `--hosts netns` (they are skipped on loopback).
pub const FAULTS_NETNS_ONLY: [&str; 1] = ["region-drop"];
/// Share of region packets dropped in `region-drop`, percent.
pub const REGION_DROP_PCT: u32 = 30;
/// nftables table holding the `region-drop` rule (in the proxy node's namespace only).
const NFT_TABLE: &str = "farside_faults";
/// How long region packets are dropped in `region-drop`.
const REGION_DROP_FOR: Duration = Duration::from_secs(2);
/// Fixed ports of the netns tier (each node has its own IP).
const NETNS_WEB_PORT: u16 = 80;
const NETNS_UDP_PORT: u16 = 7002;
const NETNS_PROXY_PORT: u16 = 8080;
/// Admin port of the first proxy; a restarted one takes the next.
const NETNS_ADMIN_PORT: u16 = 9100;
/// gatherd's metrics port in each back-end node.
const NETNS_GATHERD_METRICS_PORT: u16 = 9200;

/// Period of the admin-metrics poll measuring `time_to_fresh_ms` (the 10 ms).
pub const FRESH_POLL: Duration = Duration::from_millis(10);
/// Longest wait for a fresh view after a repair: 100× the default `stale_after_ms`; a
/// view still stale then is reported as `null` (and fails the lab's test).
pub const FRESH_WAIT_MAX: Duration = Duration::from_secs(10);
/// How long the gatherd stays dead in `gatherd-restart`.
const GATHERD_DOWN: Duration = Duration::from_millis(500);
/// How long the back-end stays stopped in `backend-stop` (the 2 s).
const BACKEND_STOPPED: Duration = Duration::from_secs(2);
/// How long the back-end stays dead in `backend-kill`.
const BACKEND_DOWN: Duration = Duration::from_secs(1);
/// How long the spare back-end stays in the configuration in `reload`.
const RELOAD_HELD: Duration = Duration::from_secs(1);
/// Longest wait for a process to listen or exit.
const READY_MAX: Duration = Duration::from_secs(15);
/// Phase length per fault: it must hold the longest fault (2 s) plus recovery.
const PHASE_S_FULL: f64 = 10.0;
const PHASE_S_QUICK: f64 = 4.0;

/// `farside lab faults`.
#[derive(Debug, Clone, clap::Args)]
pub struct FaultsArgs {
    /// Output directory (summary.json, points.jsonl, table.txt, faults.csv, logs/).
    #[arg(long, default_value = "out/faults")]
    pub out: PathBuf,
    #[command(flatten)]
    pub sweep: SweepFlags,
    /// Where the nodes run: loopback (unprivileged) or netns (root: one network
    /// namespace per node, regions over udp answered by XDP, and the `region-drop`
    /// fault).
    #[arg(long, value_enum, default_value_t = Hosts::Loopback)]
    pub hosts: Hosts,
    /// Open-loop arrival rate, requests/s (one request per connection), for the whole
    /// run. Default: `--load-share` × the tier's capacity, measured first by a short
    /// closed-loop run through the proxy (`capacity_rps` in summary.json).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Share of the measured capacity offered when --rate is not given.
    #[arg(long, default_value_t = 0.7)]
    pub load_share: f64,
    /// Back-ends in the tier (≥ 2, so one can fail while the other serves).
    #[arg(long, default_value_t = 2)]
    pub backends: usize,
    /// Workers per back-end (`farside backend --workers`).
    #[arg(long, default_value_t = 8)]
    pub backend_workers: usize,
    /// The proxy's `admission.stale_after_ms`.
    #[arg(long, default_value_t = 100)]
    pub stale_after_ms: u64,
    /// The proxy's admission limit (metric backlog).
    #[arg(long, default_value_t = 4)]
    pub limit: u64,
    /// Loadgen's per-request timeout, ms: a request without response or error by then is
    /// counted hung.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    /// Run only these faults (comma-separated; default all).
    #[arg(long, value_delimiter = ',')]
    pub faults: Vec<String>,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Clients of the calibration run: enough to keep every worker of two back-ends busy.
const CALIBRATION_CLIENTS: usize = 32;

/// Served requests/s of a short closed-loop run without think time through the proxy.
fn capacity(fab: &Fabric, target: SocketAddr, quick: bool) -> io::Result<f64> {
    let mut l = LoadgenArgs::new(target.to_string());
    l.clients = CALIBRATION_CLIENTS;
    // The same shape as the open loop's requests: a new connection each.
    l.no_keepalive = true;
    l.keepalive = false;
    (l.warmup_s, l.duration_s) = if quick { (0.5, 1.5) } else { (1.0, 4.0) };
    l.quiet = true;
    let s = fab.loadgen(&l)?;
    if s.tps <= 0.0 {
        return Err(io::Error::other(
            "calibration served nothing; see logs/ (or give --rate)",
        ));
    }
    Ok(s.tps)
}

fn check_args(a: &FaultsArgs) -> io::Result<Vec<String>> {
    let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
    let netns = a.hosts == Hosts::Netns;
    if a.backends < 2 {
        return bad(format!("--backends {}: at least 2", a.backends));
    }
    if let Some(r) = a.rate {
        if !(r > 0.0 && r.is_finite()) {
            return bad(format!("--rate {r}: must be > 0"));
        }
    }
    if !(a.load_share > 0.0 && a.load_share <= 1.0) {
        return bad(format!("--load-share {}: must be in (0, 1]", a.load_share));
    }
    let faults: Vec<String> = if a.faults.is_empty() {
        FAULTS
            .iter()
            .filter(|f| netns || !FAULTS_NETNS_ONLY.contains(f))
            .map(|s| s.to_string())
            .collect()
    } else {
        a.faults.clone()
    };
    for f in &faults {
        if !FAULTS.contains(&f.as_str()) {
            return bad(format!(
                "--faults: unknown fault `{f}` ({})",
                FAULTS.join(", ")
            ));
        }
        if !netns && FAULTS_NETNS_ONLY.contains(&f.as_str()) {
            return bad(format!("--faults {f}: needs --hosts netns"));
        }
    }
    Ok(faults)
}

/// Run `farside lab faults`.
pub fn run(a: FaultsArgs) -> io::Result<()> {
    let faults = check_args(&a)?;
    let phase_s = if a.sweep.quick {
        PHASE_S_QUICK
    } else {
        PHASE_S_FULL
    };
    let fresh_bound_ms = 2 * a.stale_after_ms;
    let dir = a.sweep.dir(&a.out);
    let mut meta = crate::summary::Summary::new("faults", a.hosts.as_str(), a.sweep.quick);
    crate::sweep::fill_host_metadata(&mut meta);
    meta.params = serde_json::json!({
        "faults": faults,
        "rate": a.rate,
        "load_share": a.load_share,
        "backends": a.backends,
        "backend_workers": a.backend_workers,
        "stale_after_ms": a.stale_after_ms,
        "limit": a.limit,
        "metric": "backlog",
        "timeout_ms": a.timeout_ms,
        "phase_s": phase_s,
        "fresh_bound_ms": fresh_bound_ms,
        "fresh_poll_ms": FRESH_POLL.as_millis() as u64,
    });
    let mut sweep = crate::sweep::Sweep::<Faults>::start(&dir, meta, a.sweep.resume.is_some())?;
    let logs = dir.join("logs");
    let fault_at = Duration::from_secs_f64(phase_s / 8.0);
    let mut running: Option<Running> = None;
    let mut notes = Vec::new();
    let result = sweep.run_isolated(
        &faults,
        1,
        phase_s + 1.0,
        |f: &String| f.clone(),
        |f, _| {
            if running.is_none() {
                running = Some(start_tier(&a, &logs, &mut notes)?);
            }
            let r = running.as_mut().expect("started above");
            // Every phase starts from a tier without load: the previous phase's
            // requests (a stopped back-end's queue, a restarted proxy's) are done.
            let t0 = Instant::now();
            let s = crate::fabric::quiet::wait_quiet(
                r.fab.dc(),
                &watched_ports(&r.fab, &r.t),
                PHASE_QUIET_MAX,
            )?;
            let start = s.start(&s.first, t0.elapsed(), false);
            let mut l = LoadgenArgs::new(r.t.listen.to_string());
            l.rate = Some(r.rate);
            l.duration_s = phase_s;
            l.warmup_s = 0.0;
            l.timeout_ms = a.timeout_ms;
            l.quiet = true;
            let (fab, t) = (&r.fab, &mut r.t);
            let (summary, fresh) = std::thread::scope(|sc| {
                let load = sc.spawn(|| fab.loadgen(&l));
                std::thread::sleep(fault_at);
                let fresh = inject(&a, fab, t, f);
                let summary = load
                    .join()
                    .map_err(|_| io::Error::other("loadgen thread panicked"));
                (summary, fresh)
            });
            Ok((FaultRow::new(f, &summary??, fresh?), start))
        },
    );
    drop(running);
    for n in notes {
        sweep.note(n)?;
    }
    result?;
    let s = sweep.finish()?;
    let rows: Vec<&FaultRow> = s.points.iter().collect();
    if !targets_met(&rows, fresh_bound_ms as f64) {
        eprintln!(
            "lab faults: targets NOT met (hung > 0, or a slow fresh view after the gatherd restart)"
        );
    }
    Ok(())
}

/// Longest wait for the tier to be quiet before a fault's phase: 10 s covers a stopped
/// back-end's queue (2 s of arrivals at 0.7 x capacity, then served at the capacity:
/// ~1.5 s) several times over. The tier is not restarted past it (a restart rebuilds the
/// namespaces and measures the capacity again): the phase runs and records
/// `started_empty = false`, with a warning and a note.
pub const PHASE_QUIET_MAX: Duration = Duration::from_secs(10);

/// The tier's listening ports that must be quiet before a phase: the proxy's (front) and
/// every back-end's web server's, the spare's included (back), in their nodes'
/// namespaces.
fn watched_ports(fab: &Fabric, t: &Tier) -> Vec<crate::fabric::quiet::Watched> {
    use crate::fabric::quiet::{Side, Watched};
    let node = |n: &str| matches!(fab, Fabric::Netns(_)).then(|| n.to_string());
    let mut w = vec![Watched::new(node("proxy"), t.listen.port(), Side::Front)];
    for n in t.nodes.iter().chain(std::iter::once(&t.spare)) {
        w.push(Watched::new(node(&n.name), n.web.port(), Side::Back));
    }
    w
}

/// `lab faults` as the sweep runner and the report shell see it.
pub struct Faults;

impl crate::experiment::Experiment for Faults {
    const NAME: &'static str = "faults";
    type Args = FaultsArgs;
    type Point = FaultRow;

    fn run(args: FaultsArgs) -> io::Result<()> {
        run(args)
    }

    fn table(s: &crate::summary::Summary<FaultRow>) -> String {
        let rows: Vec<&FaultRow> = s.points.iter().collect();
        if rows.is_empty() {
            return String::new();
        }
        use std::fmt::Write as _;
        let mut out = table(&rows);
        if let Some(bound) = s.params.get("fresh_bound_ms").and_then(|v| v.as_f64()) {
            let met = targets_met(&rows, bound);
            let _ = writeln!(
                out,
                "targets (no hung request; fresh view <= {bound:.0} ms after the gatherd \
                 restart command): {}",
                if met { "met" } else { "NOT met" }
            );
        }
        out.push('\n');
        out
    }

    fn files(s: &crate::summary::Summary<FaultRow>) -> io::Result<Vec<(String, String)>> {
        let rows: Vec<&FaultRow> = s.points.iter().collect();
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![
            ("faults.csv".to_string(), csv(&rows)?),
            (
                "table.txt".to_string(),
                crate::report::table_text::<Faults>(s),
            ),
        ])
    }

    fn figures(s: &crate::summary::Summary<FaultRow>) -> Vec<crate::experiment::Figure> {
        let _ = s;
        Vec::new()
    }

    fn html(s: &crate::summary::Summary<FaultRow>) -> String {
        let rows: Vec<&FaultRow> = s.points.iter().collect();
        if rows.is_empty() {
            return String::new();
        }
        format!(
            "<h2>Faults</h2>\n<pre>{}</pre>\n",
            crate::svg::escape(&table(&rows))
        )
    }
}
