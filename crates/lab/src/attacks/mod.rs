//! `farside lab attacks`: an attack lab on the shared fabric. Two attackers — one on
//! the cluster side, one on the client side — try every attack below against a
//! running data-center under legitimate load ([`dc`]), and the lab reports, per
//! attack, whether it succeeded (judged by its effect, never by a protocol detail),
//! the collateral (requests failed, connections lost by the legitimate clients) and
//! the CPU it cost the defender.
//!
//! - [`specd`]: forged migration offers (non-peer; the peer's address without the key;
//!   a captured authenticated one replayed), slow senders, a huge length prefix;
//! - [`frontend`]: a spoofed one-sided MOVE, a captured MOVE replayed, the sealed TCP
//!   control port (plain, forged, tampered and replayed lines, idle connections past
//!   its slots), a spoofed non-SYN flood against the flow table;
//! - [`rmem`]: one-sided memory against its authenticated envelope: a captured CAS and
//!   FETCH-ADD replayed, captured requests modified under their old tag (a CAS
//!   retargeted at ROLE_SERVED, a larger FETCH-ADD delta, a huge sequence number),
//!   requests sealed under a made-up key (a WRITE of ROLE_SERVED, a CAS loop on
//!   ROLE_WANTED), a compromised monitor's reader key used to write, group READs with a
//!   victim's source (amplification);
//! - [`files`]: a symlink planted at gatherd's region path, the proxy's
//!   `/farside/metrics` read from its public port.
//!
//! How a run goes: build the data-center, mirror b0's, b1's and px's ports to the
//! cluster attacker and start its capture; measure the defenders' CPU under legitimate
//! load alone (the baseline); a burst of connections makes b0 migrate some to b1 while
//! the lab's balancer does its role-word operations from px and the operator sets the
//! front-end's weights (all captured); then each attack runs in a window of legitimate
//! load of its own ([`dc::Dc::window`]), which opens once the tier is quiet again
//! (nothing queued or in service at the back-ends, no migration in flight: what the
//! burst or the previous window left is not counted against the next window).
//! `defender_cpu_ms` = CPU of every process on fe, b0, b1 and px over the window minus
//! the baseline's over as long; `softirq_ms` = the machine's softirq time likewise (the
//! attacker's sending included: not attributable on one machine).
//!
//! Each attack is a test (`crates/lab/tests/lab_attacks.rs`): it would succeed against
//! the old code and must fail against the current one. An attack whose defence is
//! still being built would carry `defence_pending` (the table marks it with `*`); none
//! does on this code.

use crate::experiment::{Experiment, LabPoint, NoExtra};
use crate::fabric::flags::SweepFlags;
use crate::summary::Summary;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::PathBuf;
use std::time::Duration;

pub mod dc;
pub mod files;
pub mod flood;
pub mod frontend;
pub mod legit;
pub mod lost;
pub mod outcome;
pub mod raw;
pub mod rmem;
pub mod specd;

pub use outcome::Outcome;

/// Every attack, in run order: `(name, target, defence under test, defence pending)`.
/// A pending defence is being built in parallel: the attack succeeds today.
pub const ATTACKS: [(&str, &str, &str, bool); 22] = [
    // A window of legitimate load alone, for reference (and the CPU baseline).
    ("baseline", "-", "no attack", false),
    ("specd-offer-non-peer", "specd", "allowlist", false),
    ("specd-offer-peer-address", "specd", "wire v4 (key)", false),
    (
        "specd-offer-replay",
        "specd",
        "wire v4 replay window",
        false,
    ),
    (
        "specd-slow-senders",
        "specd",
        "per-peer cap, deadlines",
        false,
    ),
    (
        "specd-huge-length",
        "specd",
        "length bound before bytes",
        false,
    ),
    ("fe-move-spoofed", "frontend", "sealed MOVE (key)", false),
    ("fe-move-replay", "frontend", "MOVE replay window", false),
    (
        "fe-control-tcp",
        "frontend",
        "sealed lines, replay window",
        false,
    ),
    (
        "fe-nonsyn-flood",
        "frontend",
        "SYN-only flow entries",
        false,
    ),
    ("rmem-replay-cas", "rmem", "replay window", false),
    ("rmem-replay-fadd", "rmem", "replay window", false),
    ("rmem-forge-served", "rmem", "auth envelope (tag)", false),
    ("rmem-fadd-counter", "rmem", "auth envelope (tag)", false),
    ("rmem-huge-seq", "rmem", "auth envelope (tag)", false),
    ("rmem-write-role", "rmem", "auth envelope (tag)", false),
    (
        "rmem-cas-wanted-loop",
        "rmem",
        "auth envelope (key id)",
        false,
    ),
    ("rmem-reader-writes", "rmem", "per-key rights", false),
    ("rmem-group-read", "rmem", "no reply unauthenticated", false),
    (
        "files-symlink-region",
        "gatherd",
        "rundir refuses foreign link",
        false,
    ),
    (
        "files-proxy-metrics",
        "proxy",
        "metrics off the data port",
        false,
    ),
    // Whether every daemon survived the run.
    ("daemons-alive", "all", "-", false),
];

/// Length of an attack's window of legitimate load (full run, `--quick`): the
/// longest attack (the slow senders' hold) fits with a margin.
const WINDOW_FULL: Duration = Duration::from_secs(12);
const WINDOW_QUICK: Duration = Duration::from_secs(7);
/// The capture burst: open-loop connections/s to the VIP and how long (s): about 2×
/// b0's capacity at 75/25 (lab speculative's spec32 point), so b0 migrates.
const BURST_RATE: f64 = 500.0;
const BURST_S: f64 = 3.0;
/// Longest wait for the monitor's READs to show up in the capture.
const CAPTURE_WAIT: Duration = Duration::from_secs(3);

/// `farside lab attacks`.
#[derive(Debug, Clone, clap::Args)]
pub struct AttacksArgs {
    /// Output directory (summary.json, points.jsonl, table.txt, attacks.csv, logs/).
    #[arg(long, default_value = "out/attacks")]
    pub out: PathBuf,
    #[command(flatten)]
    pub sweep: SweepFlags,
    /// Attacks to run (comma-separated names, see docs/lab.md; default: all).
    #[arg(long, value_delimiter = ',')]
    pub attacks: Vec<String>,
    /// The `farside` binary the data-center's daemons run (default: this one; the
    /// lab's own tests point it at the built binary).
    #[arg(long, hide = true)]
    pub farside_bin: Option<PathBuf>,
    /// Instead of the attacks one by one: a flood of this many seconds during a
    /// speculative run (spoofed non-SYN packets at the front-end's flow table and
    /// forged, garbage, replayed and slow connections at specd's migration port),
    /// after a reference phase of the legitimate load alone; recorded per second
    /// (kept as experiment `attacks-flood`, see docs/lab.md).
    #[arg(long = "flood-seconds")]
    pub flood_seconds: Option<f64>,
    /// With --flood-seconds: spoofed non-SYN packets a second.
    #[arg(long = "flood-pps", default_value_t = flood::FLOOD_PPS_DEFAULT)]
    pub flood_pps: u64,
}

/// One attack's result (a point of the run).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AttackPoint {
    /// `attack`: its name ([`ATTACKS`]).
    pub attack: String,
    /// `target`: the component attacked (specd, frontend, rmem, gatherd, proxy).
    pub target: String,
    /// `system`: the defence under test.
    pub system: String,
    /// `succeeded`: the attack's effect was observed.
    pub succeeded: bool,
    /// `tested`: false when a precondition was missing (nothing captured to replay).
    pub tested: bool,
    /// `defence_pending`: the defence is being built in parallel (succeeds today).
    pub defence_pending: bool,
    /// `effect`: what the lab observed.
    pub effect: String,
    /// `packets_sent`, `bytes_sent`: what the attacker sent.
    pub packets_sent: u64,
    pub bytes_sent: u64,
    /// `bytes_answered`: what the defenders answered (to the attacker or a victim).
    pub bytes_answered: u64,
    /// `lost_connections`: legitimate connections broken in the window.
    pub lost_connections: u64,
    /// `failed_requests`: legitimate requests failed in the window.
    pub failed_requests: u64,
    /// `served_requests`: legitimate requests served in the window.
    pub served_requests: u64,
    /// `defender_cpu_ms`: CPU of the defending processes over the window, net of the
    /// baseline.
    pub defender_cpu_ms: f64,
    /// `softirq_ms`: the machine's softirq time over the window, net of the baseline.
    pub softirq_ms: f64,
    /// `window_s`: the window's length.
    pub window_s: f64,
}

impl LabPoint for AttackPoint {
    type Extra = NoExtra;

    fn take_extra(&mut self) -> NoExtra {
        NoExtra {}
    }

    fn put_extra(&mut self, _: NoExtra) {}

    fn combine(runs: &[Self]) -> Self {
        // Any success across repeats is a success; collateral adds up.
        let mut p = runs[runs.len() - 1].clone();
        p.succeeded = runs.iter().any(|r| r.succeeded);
        p.lost_connections = runs.iter().map(|r| r.lost_connections).sum();
        p.failed_requests = runs.iter().map(|r| r.failed_requests).sum();
        p
    }

    fn progress_line(&self) -> String {
        format!(
            "succeeded={} lost={} failed={} cpu={:.0} ms — {}",
            self.succeeded,
            self.lost_connections,
            self.failed_requests,
            self.defender_cpu_ms,
            self.effect
        )
    }
}

/// The experiment.
pub struct Attacks;

fn yes_no(b: bool) -> &'static str {
    if b {
        "YES"
    } else {
        "no"
    }
}

/// The text table.
pub fn table(points: &[AttackPoint]) -> String {
    let mut out = format!(
        "{:<26} {:<9} {:<28} {:>9} {:>5} {:>9} {:>7} {:>9} {:>8} {:>8}\n",
        "attack",
        "target",
        "defence",
        "succeeded",
        "lost",
        "failed",
        "served",
        "cpu_ms",
        "softirq",
        "packets"
    );
    for p in points {
        let ok = if !p.tested {
            "untested".to_string()
        } else if p.defence_pending {
            format!("{}*", yes_no(p.succeeded))
        } else {
            yes_no(p.succeeded).to_string()
        };
        out.push_str(&format!(
            "{:<26} {:<9} {:<28} {:>9} {:>5} {:>9} {:>7} {:>9.0} {:>8.0} {:>8}\n",
            p.attack,
            p.target,
            p.system,
            ok,
            p.lost_connections,
            p.failed_requests,
            p.served_requests,
            p.defender_cpu_ms,
            p.softirq_ms,
            p.packets_sent
        ));
    }
    out.push_str(
        "* defence built in parallel: succeeds on this code until it lands.\n\
         lost/failed: legitimate connections lost and requests failed in the attack's window;\n\
         cpu_ms: CPU of the defending processes (fe, b0, b1, px) over the window minus the\n\
         baseline's; softirq: the machine's softirq ms likewise (attacker's sending included).\n",
    );
    out.push_str("\neffects:\n");
    for p in points {
        out.push_str(&format!("  {}: {}\n", p.attack, p.effect));
    }
    out
}

fn csv(points: &[AttackPoint]) -> io::Result<String> {
    crate::report::csv_text(
        &[
            "attack",
            "target",
            "system",
            "succeeded",
            "tested",
            "defence_pending",
            "lost_connections",
            "failed_requests",
            "served_requests",
            "defender_cpu_ms",
            "softirq_ms",
            "packets_sent",
            "bytes_sent",
            "bytes_answered",
            "window_s",
            "effect",
        ],
        points.iter().map(|p| {
            vec![
                p.attack.clone(),
                p.target.clone(),
                p.system.clone(),
                p.succeeded.to_string(),
                p.tested.to_string(),
                p.defence_pending.to_string(),
                p.lost_connections.to_string(),
                p.failed_requests.to_string(),
                p.served_requests.to_string(),
                format!("{:.1}", p.defender_cpu_ms),
                format!("{:.1}", p.softirq_ms),
                p.packets_sent.to_string(),
                p.bytes_sent.to_string(),
                p.bytes_answered.to_string(),
                format!("{:.2}", p.window_s),
                p.effect.clone(),
            ]
        }),
    )
}

impl Experiment for Attacks {
    const NAME: &'static str = "attacks";
    type Args = AttacksArgs;
    type Point = AttackPoint;

    fn run(a: AttacksArgs) -> io::Result<()> {
        if let Some(seconds) = a.flood_seconds {
            return flood::run(flood::FloodArgs {
                out: a.out,
                sweep: a.sweep,
                farside_bin: a.farside_bin,
                seconds,
                pps: a.flood_pps,
            })
            .map(|_| ());
        }
        run(a).map(|_| ())
    }

    fn table(s: &Summary<AttackPoint>) -> String {
        if s.points.is_empty() {
            return String::new();
        }
        table(&s.points)
    }

    fn files(s: &Summary<AttackPoint>) -> io::Result<Vec<(String, String)>> {
        if s.points.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![
            ("attacks.csv".to_string(), csv(&s.points)?),
            (
                "table.txt".to_string(),
                crate::report::table_text::<Attacks>(s),
            ),
        ])
    }

    fn figures(_: &Summary<AttackPoint>) -> Vec<crate::experiment::Figure> {
        Vec::new()
    }

    fn html(s: &Summary<AttackPoint>) -> String {
        if s.points.is_empty() {
            return String::new();
        }
        format!(
            "<h2>Attacks</h2>\n<pre>{}</pre>\n",
            crate::svg::escape(&table(&s.points))
        )
    }
}

/// What the capture phase kept for the replays.
struct Captures {
    specd: specd::SpecdCapture,
    moves: Vec<raw::Packet>,
    rmem: rmem::RmemCapture,
    /// The operator's sealed control lines.
    control: Vec<String>,
}

fn point(name: &str, o: &Outcome, c: &dc::Collateral) -> AttackPoint {
    let (_, target, system, pending) = ATTACKS
        .iter()
        .find(|a| a.0 == name)
        .copied()
        .unwrap_or((name, "?", "?", false));
    AttackPoint {
        attack: name.to_string(),
        target: target.to_string(),
        system: system.to_string(),
        succeeded: o.succeeded,
        tested: o.tested,
        defence_pending: pending,
        effect: o.effect.clone(),
        packets_sent: o.packets,
        bytes_sent: o.bytes,
        bytes_answered: o.answered_bytes,
        lost_connections: c.lost_connections,
        failed_requests: c.failed_requests,
        served_requests: c.served,
        defender_cpu_ms: c.defender_cpu_ms,
        softirq_ms: c.softirq_ms,
        window_s: c.window_s,
    }
}

/// Run the lab; returns the summary.
pub fn run(a: AttacksArgs) -> io::Result<Summary<AttackPoint>> {
    crate::fabric::netns::check_root(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
    )?;
    let names: Vec<&str> = if a.attacks.is_empty() {
        ATTACKS.iter().map(|x| x.0).collect()
    } else {
        for n in &a.attacks {
            if !ATTACKS.iter().any(|x| x.0 == n) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "--attacks: unknown attack {n:?} (known: {})",
                        ATTACKS.map(|x| x.0).join(", ")
                    ),
                ));
            }
        }
        // The baseline and the survival check are part of every run.
        let mut v = vec!["baseline"];
        v.extend(
            a.attacks
                .iter()
                .map(String::as_str)
                .filter(|n| !matches!(*n, "baseline" | "daemons-alive")),
        );
        v.push("daemons-alive");
        v
    };
    let quick = a.sweep.quick;
    let window = if quick { WINDOW_QUICK } else { WINDOW_FULL };
    let exe = match &a.farside_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?,
    };
    let dir = a.sweep.dir(&a.out);
    let mut meta = Summary::new(Attacks::NAME, "netns", quick);
    crate::sweep::fill_host_metadata(&mut meta);
    meta.params = serde_json::json!({
        "attacks": names,
        "window_s": window.as_secs_f64(),
        "flood_packets": if quick { frontend::FLOOD_PACKETS_QUICK } else { frontend::FLOOD_PACKETS },
        "slow_conns": specd::SLOW_CONNS,
        "cas_loop": rmem::CAS_LOOP,
        "group_reads": rmem::GROUP_READS,
        "burst_rate": BURST_RATE,
        "burst_s": BURST_S,
        "weights": dc::WEIGHTS,
        "victims_vip": dc::VICTIMS_VIP,
    });
    let mut sweep = crate::sweep::Sweep::<Attacks>::start(&dir, meta, a.sweep.resume.is_some())?;
    eprintln!("lab attacks: building the data-center (netns)");
    let mut d = dc::Dc::start(&dir, &exe)?;
    for n in [dc::B0, dc::B1, dc::PX] {
        raw::mirror(&d.dc, n, dc::ATK)?;
    }
    let sniff = raw::Sniffer::start(&d.dc, dc::ATK)?;
    eprintln!("lab attacks: baseline window of legitimate load");
    let base = d.measure_baseline(window)?;
    let base_point = point(
        "baseline",
        &Outcome {
            tested: true,
            effect: format!(
                "legitimate load alone: {} served, defenders' CPU {:.0} ms over {:.1} s",
                base.served, base.defender_cpu_ms, base.window_s
            ),
            ..Default::default()
        },
        &dc::Collateral {
            defender_cpu_ms: 0.0,
            softirq_ms: 0.0,
            ..base.clone()
        },
    );
    eprintln!(
        "lab attacks: capture burst ({BURST_RATE}/s for {BURST_S} s) and the balancer's operations"
    );
    let mut lab = rmem::LabClients::open(&d)?;
    lab.legit_ops()?;
    let burst = d.burst(BURST_RATE, BURST_S)?;
    let ips = |n| d.dc.node_ip(n);
    // The operator sets the weights the front-end has (a no-op, sealed, from px).
    let set = d.fe_request(&format!(
        "WEIGHTS {}={},{}={}",
        ips(dc::B0),
        dc::WEIGHTS[0],
        ips(dc::B1),
        dc::WEIGHTS[1]
    ))?;
    if !set.starts_with("OK") {
        return Err(io::Error::other(format!(
            "the operator's sealed WEIGHTS was refused: {set}"
        )));
    }
    let _ = sniff.wait_for(CAPTURE_WAIT, |p| {
        p.src == ips(dc::PX) && p.dport == dc::REGION_PORT
    });
    let _ = sniff.wait_for(CAPTURE_WAIT, |p| {
        p.src == ips(dc::PX) && p.dport == dc::CONTROL_PORT && !p.payload.is_empty()
    });
    let caps = Captures {
        specd: specd::capture(&sniff, ips(dc::B0), ips(dc::B1)),
        moves: frontend::captured_moves(&sniff, ips(dc::B0), ips(dc::FE)),
        rmem: rmem::capture(&sniff, ips(dc::PX), ips(dc::B0)),
        control: frontend::captured_control(&sniff, ips(dc::PX), ips(dc::FE)),
    };
    sweep.note(format!(
        "capture: burst of {:.0} conn/s served {} (failed {}); captured {} specd control \
         connection(s) ({} B in the longest), {} MOVE(s), {} sealed control line(s), {} region \
         requests from px ({} READ(s) under key id {}, {} CAS and {} FETCH-ADD(s) under key \
         id {})",
        BURST_RATE,
        burst.served,
        burst.failures,
        caps.specd.connections,
        caps.specd.stream.len(),
        caps.moves.len(),
        caps.control.len(),
        caps.rmem.requests,
        caps.rmem.reads.len(),
        caps.rmem
            .read_key_id()
            .map_or("-".to_string(), |k| k.to_string()),
        caps.rmem.cas.len(),
        caps.rmem.fadd.len(),
        caps.rmem
            .rw_key_id()
            .map_or("-".to_string(), |k| k.to_string()),
    ))?;
    let mut dead: Option<String> = None;
    // How each window started (the first after the capture burst always noted).
    let mut settles: Vec<String> = Vec::new();
    sweep.run(
        &names,
        1,
        window.as_secs_f64() + 2.0,
        |n| n.to_string(),
        |name, _| {
            if *name == "baseline" {
                return Ok(base_point.clone());
            }
            if *name == "daemons-alive" {
                let alive = d.check_alive();
                let o = Outcome {
                    succeeded: alive.is_err(),
                    tested: true,
                    effect: match &alive {
                        Ok(()) => "every daemon is still running".to_string(),
                        Err(e) => format!("a daemon died: {e}"),
                    },
                    ..Default::default()
                };
                return Ok(point(name, &o, &dc::Collateral::default()));
            }
            if let Some(why) = &dead {
                return Ok(point(
                    name,
                    &Outcome::untested(why),
                    &dc::Collateral::default(),
                ));
            }
            let caps = &caps;
            let sniff = &sniff;
            let lab = &mut lab;
            let (o, c) = d.window(window, |d, victims| match *name {
                "specd-offer-non-peer" => specd::offer_from_non_peer(d),
                "specd-offer-peer-address" => specd::offer_from_peer_address(d),
                "specd-offer-replay" => specd::replay(d, &caps.specd),
                "specd-slow-senders" => specd::slow_senders(d, quick),
                "specd-huge-length" => specd::huge_length(d),
                "fe-move-spoofed" => frontend::spoofed_move(d, victims),
                "fe-move-replay" => frontend::replayed_move(d, &caps.moves),
                "fe-control-tcp" => frontend::control_port(d, victims, &caps.control),
                "fe-nonsyn-flood" => frontend::nonsyn_flood(d, victims, quick),
                "rmem-write-role" => rmem::write_role(d, &caps.rmem, lab),
                "rmem-cas-wanted-loop" => rmem::cas_wanted_loop(d, &caps.rmem, lab),
                "rmem-fadd-counter" => rmem::fadd_counter(d, &caps.rmem, lab),
                "rmem-replay-cas" => rmem::replay_cas(d, &caps.rmem, lab),
                "rmem-replay-fadd" => rmem::replay_fadd(d, &caps.rmem, lab),
                "rmem-forge-served" => rmem::forge_served(d, &caps.rmem, lab),
                "rmem-reader-writes" => rmem::reader_writes(d, lab),
                "rmem-huge-seq" => rmem::huge_seq(d, &caps.rmem, lab),
                "rmem-group-read" => rmem::group_read(d, &caps.rmem, sniff),
                "files-symlink-region" => files::symlink_region(d),
                "files-proxy-metrics" => files::proxy_metrics(d),
                other => Err(io::Error::other(format!("no attack {other}"))),
            })?;
            if settles.is_empty() || !c.started_quiet {
                settles.push(format!(
                    "window {name} opened {}: {}",
                    if c.started_quiet {
                        "on a quiet tier"
                    } else {
                        "before the tier was quiet"
                    },
                    c.settle
                ));
            }
            if let Err(e) = d.check_alive() {
                dead = Some(format!(
                    "not run: a daemon died during an earlier attack: {e}"
                ));
            }
            Ok(point(name, &o, &c))
        },
    )?;
    for n in settles {
        sweep.note(n)?;
    }
    drop(sniff);
    drop(d);
    sweep.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_attack_has_a_unique_name_and_the_table_names_each() {
        let mut names: Vec<&str> = ATTACKS.iter().map(|a| a.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ATTACKS.len());
        let p = point(
            "rmem-write-role",
            &Outcome {
                succeeded: true,
                tested: true,
                effect: "ROLE_SERVED 0x0 → 0x1".into(),
                ..Default::default()
            },
            &dc::Collateral::default(),
        );
        assert!(!p.defence_pending);
        assert_eq!(p.system, "auth envelope (tag)");
        let t = table(&[p]);
        assert!(t.contains("rmem-write-role") && t.contains("YES"), "{t}");
    }
}
