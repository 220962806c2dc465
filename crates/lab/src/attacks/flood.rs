//! `farside lab attacks --flood-seconds S`: a long flood during a speculative run.
//!
//! The attack lab's data-center ([`super::dc`]: front-end, two back-ends whose specd
//! migrate connections to each other and move their flows at the front-end with
//! sealed MOVEs) serves legitimate keep-alive sessions to the VIP, enough of them that
//! b0's workers are all busy and specd migrates new connections to b1 all along. A
//! reference phase runs that load alone; then, for S seconds, two attackers work at
//! once:
//!
//! - the client-side attacker floods the front-end with spoofed non-SYN TCP packets
//!   to the VIP from random addresses and ports (`--flood-pps` a second, every one a
//!   flow the table has never seen: past the flow table's 65,536 entries within
//!   seconds);
//! - the cluster-side attacker works specd's migration port on b1 every round
//!   ([`ROUND`]): a forged offer from a non-peer address, a forged offer and a block of
//!   garbage from the peer's own address (b0's namespace: a tenant of the peer's
//!   host), a captured authenticated control connection replayed, and [`SLOW_CONNS`]
//!   slow senders from the peer's address kept open (re-opened as the target closes
//!   them), each dribbling a byte of a frame header per round.
//!
//! Every second the lab records: the legitimate requests served and failed and the
//! connections lost (a request that failed or timed out breaks its connection); the
//! front-end's entry of every live legitimate connection (`FLOW`, over its control
//! socket: an entry that disappeared or changed other than by the one move of a
//! migration is `live_flows_evicted`), its table sizes and counters; specd's counters
//! on both back-ends (their summaries, rewritten every second: migrations completed,
//! fallen back and lost, connections refused as non-peer or over the peer's share,
//! offers refused); the defenders' CPU and the machine's softirq time. A phase
//! "succeeded" (the attack had its effect) if a live flow was evicted, a migration
//! was lost or a legitimate connection was lost.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::dc::{self, Dc, ATK, ATKC, B0, B1, CLIENT, VIP};
use super::legit::{lock, session, Legit, REQUEST_PERIOD};
use super::lost::{handoff_phase, unix_ms, where_is, HandoffPhase};
use super::raw::{ipv4_tcp, RawSender, TCP_ACK};
use crate::experiment::{Experiment, LabPoint};
use crate::summary::Summary;

/// Spoofed non-SYN packets a second by default: the attack lab's flood sent its
/// 70,000 packets about this fast, and at this rate the flood names more flows than
/// the table holds (65,536) every 3.3 s.
pub const FLOOD_PPS_DEFAULT: u64 = 20_000;
/// Most spoofed packets a second (`--flood-pps`): the attacker's thread paces itself
/// below what one CPU sends.
pub const FLOOD_PPS_MAX: u64 = 200_000;
/// Longest flood (`--flood-seconds`): an hour.
pub const FLOOD_SECONDS_MAX: f64 = 3600.0;
/// The reference phase (legitimate load alone) before the flood: a minute, or a
/// quarter of a short flood.
const REFERENCE_S_MAX: f64 = 60.0;
/// Legitimate sessions to the VIP, always open (one closed is replaced): with b0's
/// share of the flows (75 %) about 18 of them and 6 victims hold b0's 16 prefork
/// workers (a keep-alive connection holds its worker), so new connections queue there
/// past [`SPEC_QUEUE`] and specd migrates them to b1.
pub const SESSIONS: usize = 24;
/// specd's `--queue` in this run: migrate once 4 connections wait for b0's workers.
/// The attack lab's 64 (lab speculative's) is reached only by open-loop bursts past
/// capacity, which fail requests of their own; long-lived sessions on prefork
/// workers keep a short queue instead, and 4 makes specd migrate all along without a
/// request waiting longer than a session (2 s) for a worker.
pub const SPEC_QUEUE: u32 = 4;
/// Requests per session before it closes and a new connection is opened (a new
/// connection every 2 s per session: ~10 admissions a second for specd to decide).
const SESSION_REQUESTS: u32 = 10;
/// Long-lived connections to the VIP (flows that stay put for long, the flood's first
/// victims if the table let traffic evict entries), each re-opened after
/// [`VICTIM_REQUESTS`].
pub const VICTIMS: usize = 8;
/// Requests per victim connection: 18 s of them, under the back-end's keep-alive
/// limit (`--keepalive-max`, 100), which would close the connection itself.
const VICTIM_REQUESTS: u32 = 90;
/// The sampling period of the per-second series.
const SAMPLE: Duration = Duration::from_secs(1);
/// The specd attacker's round: a byte to every slow sender, offers every other round.
const ROUND: Duration = Duration::from_millis(500);
/// Slow senders kept open from the peer's address (more than specd's 32 target
/// threads, as in the attack lab).
pub const SLOW_CONNS: usize = 40;
/// How long the specd attacker waits for an answer to a forged frame.
const ANSWER_WAIT: Duration = Duration::from_millis(300);
/// Garbage bytes sent per round from the peer's address.
const GARBAGE_BYTES: usize = 1024;
/// Most captured bytes replayed per round.
const REPLAY_BYTES_MAX: usize = 64 << 10;
/// The flood's pacing tick.
const FLOOD_TICK: Duration = Duration::from_millis(10);
/// The capture burst before the flood (open-loop conn/s and s), as in the attack lab:
/// b0 migrates and its authenticated control connections are captured for replay.
const BURST_RATE: f64 = 500.0;
const BURST_S: f64 = 3.0;

/// One second of the run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct FloodSecond {
    /// Seconds since the phase started (end of this sample).
    pub t_s: f64,
    pub phase: String,
    /// Spoofed non-SYN packets sent this second.
    pub nonsyn_sent: u64,
    /// Connections the specd attacker opened this second.
    pub specd_attack_conns: u64,
    /// Legitimate requests served and failed, connections lost, this second.
    pub served: u64,
    pub failed: u64,
    pub lost_connections: u64,
    /// Live legitimate connections whose front-end entry was sampled, and of those,
    /// entries gone or changed (other than a migration's move) / moved this second.
    pub flows_tracked: u64,
    pub flows_evicted: u64,
    pub flows_moved: u64,
    /// The front-end's table sizes now and its `nonsyn_miss` this second.
    pub fe_flows: u64,
    pub fe_moved_flows: u64,
    pub fe_nonsyn_miss: u64,
    /// specd (both back-ends) this second: migrations completed, fallen back, lost;
    /// control connections refused as non-peer / over the peer's share; bad offers.
    pub migrated: u64,
    pub fell_back: u64,
    pub migrations_lost: u64,
    pub not_allowed: u64,
    pub over_peer_cap: u64,
    pub bad_offers: u64,
    /// Defenders' CPU (fe, b0, b1, px) and the machine's softirq, ms this second.
    pub defender_cpu_ms: f64,
    pub softirq_ms: f64,
}

/// The per-second series of a phase (kept beside its point in `points.jsonl`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct FloodSeries {
    #[serde(default)]
    pub series: Vec<FloodSecond>,
}

/// One phase of the run (`reference`: legitimate load alone; `flood`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct FloodPoint {
    pub phase: String,
    pub seconds: f64,
    /// `succeeded`: a live flow evicted, a migration lost or a legitimate connection
    /// lost in the phase.
    pub succeeded: bool,
    pub nonsyn_sent: u64,
    pub nonsyn_pps: f64,
    pub specd_attack_conns: u64,
    pub specd_attack_bytes: u64,
    /// Bytes specd answered to the attacker (a refusal answers none).
    pub specd_answered_bytes: u64,
    /// Most slow senders open at once (sampled each round).
    pub slow_held_max: u64,
    pub live_flows_tracked: u64,
    pub live_flows_evicted: u64,
    pub live_flows_moved: u64,
    pub migrations_attempted: u64,
    pub migrations_completed: u64,
    pub migrations_fell_back: u64,
    pub migrations_lost: u64,
    pub specd_not_allowed: u64,
    pub specd_over_peer_cap: u64,
    pub specd_bad_offers: u64,
    pub served_requests: u64,
    pub failed_requests: u64,
    pub lost_connections: u64,
    pub fe_flows_max: u64,
    pub fe_moved_flows_max: u64,
    pub fe_nonsyn_miss: u64,
    pub defender_cpu_ms: f64,
    pub softirq_ms: f64,
    /// specd's hand-offs to the local servers in the phase (absent in runs kept
    /// before it was recorded, which re-render as they were, and when all zero).
    #[serde(default, skip_serializing_if = "HandoffPhase::is_zero")]
    pub handoff: HandoffPhase,
    /// The steering programs' decisions past Q in the phase, both back-ends (absent in
    /// runs kept before they were recorded, and when all zero).
    #[serde(default, skip_serializing_if = "SteerPhase::is_zero")]
    pub steering: SteerPhase,
    pub effect: String,
    #[serde(skip)]
    pub series: Vec<FloodSecond>,
}

impl LabPoint for FloodPoint {
    type Extra = FloodSeries;

    fn take_extra(&mut self) -> FloodSeries {
        FloodSeries {
            series: std::mem::take(&mut self.series),
        }
    }

    fn put_extra(&mut self, e: FloodSeries) {
        self.series = e.series;
    }

    fn combine(runs: &[Self]) -> Self {
        runs[runs.len() - 1].clone()
    }

    fn progress_line(&self) -> String {
        format!(
            "succeeded={} evicted={} migrations {}/{} lost={} connections lost={} failed={} — {}",
            self.succeeded,
            self.live_flows_evicted,
            self.migrations_completed,
            self.migrations_attempted,
            self.migrations_lost,
            self.lost_connections,
            self.failed_requests,
            self.effect
        )
    }
}

/// The experiment (its runs are kept as `attacks-flood`).
pub struct AttacksFlood;

/// What `lab attacks --flood-seconds` passes on (see `AttacksArgs`).
#[derive(Debug, Clone)]
pub struct FloodArgs {
    pub out: std::path::PathBuf,
    pub sweep: crate::fabric::flags::SweepFlags,
    pub farside_bin: Option<std::path::PathBuf>,
    pub seconds: f64,
    pub pps: u64,
}

/// The text table: one line per phase, then the flood's series by minute.
pub fn table(points: &[FloodPoint]) -> String {
    let mut out = String::from(
        "phase          s succeeded evicted  tracked migrated  mig_lost   lost  failed served nonsyn    slow    cpu_%\n",
    );
    for p in points {
        out.push_str(&format!(
            "{:<9} {:>6.0} {:>9} {:>7} {:>8} {:>8} {:>9} {:>6} {:>7} {:>6} {:>6.0} {:>7} {:>8.1}\n",
            p.phase,
            p.seconds,
            if p.succeeded { "YES" } else { "no" },
            p.live_flows_evicted,
            p.live_flows_tracked,
            p.migrations_completed,
            p.migrations_lost,
            p.lost_connections,
            p.failed_requests,
            p.served_requests,
            p.nonsyn_pps,
            p.slow_held_max,
            p.defender_cpu_ms / 10.0 / p.seconds.max(1e-9),
        ));
    }
    out.push_str(
        "evicted: live legitimate connections whose front-end entry disappeared or changed\n\
         other than by a migration's move (of `tracked` connections sampled each second);\n\
         migrated/mig_lost: specd's migrations completed/lost on both back-ends; lost/failed/\n\
         served: legitimate connections and requests; nonsyn: spoofed packets a second;\n\
         slow: most slow senders open at once on specd's port; cpu_%: the defenders' CPU.\n",
    );
    for p in points.iter().filter(|p| p.series.len() > 60) {
        out.push_str(&format!("\n{} by minute:\n", p.phase));
        out.push_str(&format!(
            "{:>5} {:>9} {:>7} {:>8} {:>9} {:>8} {:>6} {:>7} {:>7} {:>9} {:>8} {:>6}\n",
            "min",
            "nonsyn/s",
            "evicted",
            "migrated",
            "fell_back",
            "mig_lost",
            "lost",
            "failed",
            "served",
            "fe_flows",
            "refused",
            "cpu_%"
        ));
        for (i, m) in p.series.chunks(60).enumerate() {
            let sum = |f: fn(&FloodSecond) -> u64| m.iter().map(f).sum::<u64>();
            out.push_str(&format!(
                "{:>5} {:>9.0} {:>7} {:>8} {:>9} {:>8} {:>6} {:>7} {:>7} {:>9} {:>8} {:>6.1}\n",
                i,
                sum(|s| s.nonsyn_sent) as f64 / m.len() as f64,
                sum(|s| s.flows_evicted),
                sum(|s| s.migrated),
                sum(|s| s.fell_back),
                sum(|s| s.migrations_lost),
                sum(|s| s.lost_connections),
                sum(|s| s.failed),
                sum(|s| s.served),
                m.iter().map(|s| s.fe_flows).max().unwrap_or(0),
                sum(|s| s.not_allowed + s.over_peer_cap + s.bad_offers),
                m.iter().map(|s| s.defender_cpu_ms).sum::<f64>() / 10.0 / m.len() as f64,
            ));
        }
    }
    out.push_str("\neffects:\n");
    for p in points {
        out.push_str(&format!("  {}: {}\n", p.phase, p.effect));
    }
    out
}

fn series_csv(points: &[FloodPoint]) -> io::Result<String> {
    let head: Vec<&str> = "phase,t_s,nonsyn_sent,specd_attack_conns,served,failed,lost_\
        connections,flows_tracked,flows_evicted,flows_moved,fe_flows,fe_moved_\
        flows,fe_nonsyn_miss,migrated,fell_back,migrations_lost,not_allowed,over_peer_cap,bad_offers,defender_cpu_ms,softirq_ms"
        .split(',')
        .collect();
    crate::report::csv_text(
        &head,
        points.iter().flat_map(|p| {
            p.series.iter().map(|s| {
                vec![
                    s.phase.clone(),
                    format!("{:.2}", s.t_s),
                    s.nonsyn_sent.to_string(),
                    s.specd_attack_conns.to_string(),
                    s.served.to_string(),
                    s.failed.to_string(),
                    s.lost_connections.to_string(),
                    s.flows_tracked.to_string(),
                    s.flows_evicted.to_string(),
                    s.flows_moved.to_string(),
                    s.fe_flows.to_string(),
                    s.fe_moved_flows.to_string(),
                    s.fe_nonsyn_miss.to_string(),
                    s.migrated.to_string(),
                    s.fell_back.to_string(),
                    s.migrations_lost.to_string(),
                    s.not_allowed.to_string(),
                    s.over_peer_cap.to_string(),
                    s.bad_offers.to_string(),
                    format!("{:.1}", s.defender_cpu_ms),
                    format!("{:.1}", s.softirq_ms),
                ]
            })
        }),
    )
}

impl Experiment for AttacksFlood {
    const NAME: &'static str = "attacks-flood";
    type Args = FloodArgs;
    type Point = FloodPoint;

    fn run(a: FloodArgs) -> io::Result<()> {
        run(a).map(|_| ())
    }

    fn table(s: &Summary<FloodPoint>) -> String {
        if s.points.is_empty() {
            return String::new();
        }
        table(&s.points)
    }

    fn files(s: &Summary<FloodPoint>) -> io::Result<Vec<(String, String)>> {
        if s.points.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![
            ("series.csv".to_string(), series_csv(&s.points)?),
            (
                "table.txt".to_string(),
                crate::report::table_text::<AttacksFlood>(s),
            ),
        ])
    }

    fn figures(_: &Summary<FloodPoint>) -> Vec<crate::experiment::Figure> {
        Vec::new()
    }

    fn html(s: &Summary<FloodPoint>) -> String {
        if s.points.is_empty() {
            return String::new();
        }
        format!(
            "<h2>Flood</h2>\n<pre>{}</pre>\n",
            crate::svg::escape(&table(&s.points))
        )
    }
}

/// The attackers' tallies.
#[derive(Default)]
struct Attackers {
    nonsyn_sent: AtomicU64,
    specd_conns: AtomicU64,
    specd_bytes: AtomicU64,
    specd_answered: AtomicU64,
    slow_held_max: AtomicU64,
}

/// The client-side flood: spoofed ACKs to the VIP from random addresses in
/// 10.99.0.0/16 (no host of the lab) and ports, `pps` a second, until `stop`.
fn nonsyn_flood(d: &Dc, pps: u64, att: &Attackers, stop: &AtomicBool) -> io::Result<()> {
    let mut raw = RawSender::open(&d.dc, ATKC)?;
    let per_tick = (pps as f64 * FLOOD_TICK.as_secs_f64()).max(1.0);
    let mut x: u32 = 0x9e37_79b9;
    let t0 = Instant::now();
    let mut due = 0.0f64;
    let mut i = 0u32;
    while !stop.load(Ordering::Relaxed) {
        due += per_tick;
        while (i as f64) < due {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let src = SocketAddrV4::new(
                Ipv4Addr::new(10, 99, (x >> 8) as u8, x as u8),
                1024 + (x >> 16) as u16 % 64_512,
            );
            raw.send(&ipv4_tcp(src, VIP, i, x, TCP_ACK, &[]))?;
            att.nonsyn_sent.fetch_add(1, Ordering::Relaxed);
            i = i.wrapping_add(1);
        }
        // Paced against the clock: a late tick is made up by the next ones.
        let next = t0 + FLOOD_TICK.mul_f64(due / per_tick);
        if let Some(w) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(w);
        }
        if due > 1e15 {
            due = 0.0;
            i = 0;
        }
    }
    Ok(())
}

/// One connection to b1's specd from `node`: send `bytes`, read what comes back for
/// [`ANSWER_WAIT`], counted in `att`.
fn specd_try(d: &Dc, node: &str, bytes: &[u8], att: &Attackers) -> io::Result<()> {
    let to = SocketAddr::V4(d.specd_addr(B1));
    let sent = bytes.len() as u64;
    let bytes = bytes.to_vec();
    let answered = d.dc.run_in_ns(node, move || {
        let Ok(mut s) = TcpStream::connect_timeout(&to, ANSWER_WAIT) else {
            return Ok(0);
        };
        s.set_read_timeout(Some(ANSWER_WAIT))?;
        let _ = s.write_all(&bytes);
        let mut buf = [0u8; 4096];
        let mut got = 0;
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(got as u64)
    })?;
    att.specd_conns.fetch_add(1, Ordering::Relaxed);
    att.specd_bytes.fetch_add(sent, Ordering::Relaxed);
    att.specd_answered.fetch_add(answered, Ordering::Relaxed);
    Ok(())
}

/// The cluster-side attacker on specd's port, until `stop` (see the module doc).
fn specd_attacker(d: &Dc, replay: &[u8], att: &Attackers, stop: &AtomicBool) -> io::Result<()> {
    let offer = super::specd::forged_offer();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut garbage = vec![0u8; GARBAGE_BYTES];
    let header = b"FSMG\x04\x01\x00\x00\x10\x00";
    let mut slow: Vec<TcpStream> = Vec::new();
    let to = SocketAddr::V4(d.specd_addr(B1));
    let mut round = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        // Slow senders: a byte each; closed ones are replaced.
        slow.retain_mut(|s| {
            !super::specd::closed(s) && s.write_all(&header[round % header.len()..][..1]).is_ok()
        });
        att.specd_bytes
            .fetch_add(slow.len() as u64, Ordering::Relaxed);
        att.slow_held_max
            .fetch_max(slow.len() as u64, Ordering::Relaxed);
        let missing = SLOW_CONNS - slow.len();
        let fresh: Vec<TcpStream> = d.dc.run_in_ns(B0, move || {
            Ok((0..missing)
                .filter_map(|_| TcpStream::connect_timeout(&to, ANSWER_WAIT).ok())
                .collect())
        })?;
        att.specd_conns
            .fetch_add(fresh.len() as u64, Ordering::Relaxed);
        slow.extend(fresh);
        if round.is_multiple_of(2) {
            for b in garbage.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            specd_try(d, ATK, &offer, att)?;
            specd_try(d, B0, &offer, att)?;
            specd_try(d, B0, &garbage, att)?;
            if !replay.is_empty() {
                specd_try(d, B0, replay, att)?;
            }
        }
        round += 1;
        if let Some(w) = ROUND.checked_sub(t.elapsed()) {
            std::thread::sleep(w);
        }
    }
    for s in &slow {
        let _ = s.shutdown(Shutdown::Both);
    }
    Ok(())
}

/// The steering programs' counters past Q over a phase, summed over both back-ends
/// (specd's summary, `source.steer`; the flood phase's spoofed packets reach the
/// program too, so only the reference phase's are SYNs alone).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
pub struct SteerPhase {
    /// SYNs diverted because half-open connections took the server's queue to Q.
    pub half_open: u64,
    /// SYNs dropped at the refusal listener (established ones at Q, no room).
    pub dropped: u64,
    /// SYNs passed to the server past Q without room.
    pub full_passed: u64,
}

impl SteerPhase {
    fn is_zero(&self) -> bool {
        *self == SteerPhase::default()
    }
}

/// specd's counters summed over both back-ends: (migrated, fell_back, lost,
/// not_allowed, over_peer_cap, bad_offers, steering).
#[derive(Clone, Copy, Default, Debug)]
struct SpecdCounts {
    migrated: u64,
    fell_back: u64,
    lost: u64,
    not_allowed: u64,
    over_peer_cap: u64,
    bad_offers: u64,
    steer: SteerPhase,
}

impl SpecdCounts {
    fn read(d: &Dc) -> SpecdCounts {
        let mut c = SpecdCounts::default();
        for n in [B0, B1] {
            let Some(v) = read_json(&d.specd_summary_path(n)) else {
                continue;
            };
            let g = |side: &str, k: &str| v[side][k].as_u64().unwrap_or(0);
            c.migrated += g("source", "migrated");
            c.fell_back += g("source", "fell_back");
            c.lost += g("source", "lost");
            c.not_allowed += g("target", "not_allowed");
            c.over_peer_cap += g("target", "over_peer_cap");
            c.bad_offers += g("target", "bad_offers");
            let st = |k: &str| v["source"]["steer"][k].as_u64().unwrap_or(0);
            c.steer.half_open += st("half_open");
            c.steer.dropped += st("dropped");
            c.steer.full_passed += st("full_passed");
        }
        c
    }

    fn minus(self, o: SpecdCounts) -> SpecdCounts {
        SpecdCounts {
            migrated: self.migrated.saturating_sub(o.migrated),
            fell_back: self.fell_back.saturating_sub(o.fell_back),
            lost: self.lost.saturating_sub(o.lost),
            not_allowed: self.not_allowed.saturating_sub(o.not_allowed),
            over_peer_cap: self.over_peer_cap.saturating_sub(o.over_peer_cap),
            bad_offers: self.bad_offers.saturating_sub(o.bad_offers),
            steer: SteerPhase {
                half_open: self.steer.half_open.saturating_sub(o.steer.half_open),
                dropped: self.steer.dropped.saturating_sub(o.steer.dropped),
                full_passed: self.steer.full_passed.saturating_sub(o.steer.full_passed),
            },
        }
    }
}

fn read_json(p: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
}

/// The front-end's table sizes and `nonsyn_miss`.
fn fe_tables(d: &Dc) -> (u64, u64, u64) {
    let Ok(v) = d.fe_counters() else {
        return (0, 0, 0);
    };
    (
        v["flows"].as_u64().unwrap_or(0),
        v["moved_flows"].as_u64().unwrap_or(0),
        v["counters"]["nonsyn_miss"].as_u64().unwrap_or(0),
    )
}

/// The back-end a `FLOW` reply names (`none` when the flow has no entry).
fn flow_backend(reply: &str) -> Option<String> {
    let rest = reply.strip_prefix("OK ")?;
    rest.split_whitespace().next().map(str::to_string)
}

/// Sample every live connection's entry: (tracked, newly evicted or changed, moved).
fn sample_flows(d: &Dc, legit: &Legit) -> (u64, u64, u64) {
    let addrs: Vec<SocketAddrV4> = lock(&legit.live).keys().copied().collect();
    let (mut evicted, mut moved) = (0, 0);
    for a in &addrs {
        let Some(now) = d.fe_flow(*a).ok().and_then(|r| flow_backend(&r)) else {
            continue;
        };
        let mut live = lock(&legit.live);
        // Closed since the list was taken: its entry no longer matters.
        let Some(t) = live.get_mut(a) else { continue };
        if t.evicted {
            continue;
        }
        match &t.last {
            _ if now == "none" => {
                t.evicted = true;
                evicted += 1;
            }
            Some(prev) if *prev != now => {
                // A migration moves its flow once, from one back-end to the other.
                if t.moves == 0 {
                    t.moves = 1;
                    moved += 1;
                } else {
                    t.evicted = true;
                    evicted += 1;
                }
            }
            _ => {}
        }
        t.last = Some(now);
    }
    (addrs.len() as u64, evicted, moved)
}

/// One phase: the legitimate load for `secs`, with the attackers when `flood` is
/// `Some((pps, replayed bytes))`.
fn phase(d: &Dc, name: &str, secs: f64, flood: Option<(u64, &[u8])>) -> io::Result<FloodPoint> {
    let legit = Legit::default();
    let att = Attackers::default();
    let stop = AtomicBool::new(false);
    let stop_attack = AtomicBool::new(false);
    let front = d.front_cpus().map(<[usize]>::to_vec);
    let mut series = Vec::new();
    let (mut fe_flows_max, mut fe_moved_max) = (0u64, 0u64);
    let (_, _, miss0) = fe_tables(d);
    let spec0 = SpecdCounts::read(d);
    let cpu0 = d.defender_cpu_us();
    let soft0 = dc::softirq_ms();
    let t0 = Instant::now();
    let t0_ms = unix_ms();
    let attack_errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let probe = |a: SocketAddrV4| where_is(d, a);
    std::thread::scope(|sc| {
        for i in 0..SESSIONS + VICTIMS {
            let (legit, stop, front, probe) = (&legit, &stop, front.clone(), &probe);
            let requests = if i < SESSIONS {
                SESSION_REQUESTS
            } else {
                VICTIM_REQUESTS
            };
            sc.spawn(move || {
                let _ = d.dc.run_in_ns(CLIENT, move || {
                    if let Some(cpus) = &front {
                        crate::fabric::procs::pin_current_thread(cpus)?;
                    }
                    session(legit, requests, stop, probe);
                    Ok(())
                });
            });
        }
        if let Some((pps, replay)) = flood {
            let (att, stop_attack, errors) = (&att, &stop_attack, &attack_errors);
            sc.spawn(move || {
                if let Err(e) = nonsyn_flood(d, pps, att, stop_attack) {
                    lock(errors).push(format!("non-SYN flood: {e}"));
                }
            });
            sc.spawn(move || {
                if let Err(e) = specd_attacker(d, replay, att, stop_attack) {
                    lock(errors).push(format!("specd attacker: {e}"));
                }
            });
        }
        let mut prev = (0, 0, 0, 0, 0, miss0, spec0, cpu0, soft0);
        let mut tick = t0;
        while t0.elapsed().as_secs_f64() < secs {
            tick += SAMPLE;
            if let Some(w) = tick.checked_duration_since(Instant::now()) {
                std::thread::sleep(w);
            }
            let (tracked, evicted, moved) = sample_flows(d, &legit);
            let (fe_flows, fe_moved, miss) = fe_tables(d);
            let spec = SpecdCounts::read(d);
            let cpu = d.defender_cpu_us();
            let soft = dc::softirq_ms();
            let served = legit.served.load(Ordering::Relaxed);
            let failed = legit.failed.load(Ordering::Relaxed);
            let lost = legit.lost.load(Ordering::Relaxed);
            let sent = att.nonsyn_sent.load(Ordering::Relaxed);
            let conns = att.specd_conns.load(Ordering::Relaxed);
            let ds = spec.minus(prev.6);
            fe_flows_max = fe_flows_max.max(fe_flows);
            fe_moved_max = fe_moved_max.max(fe_moved);
            series.push(FloodSecond {
                t_s: (t0.elapsed().as_secs_f64() * 100.0).round() / 100.0,
                phase: name.to_string(),
                nonsyn_sent: sent - prev.3,
                specd_attack_conns: conns - prev.4,
                served: served - prev.0,
                failed: failed - prev.1,
                lost_connections: lost - prev.2,
                flows_tracked: tracked,
                flows_evicted: evicted,
                flows_moved: moved,
                fe_flows,
                fe_moved_flows: fe_moved,
                fe_nonsyn_miss: miss.saturating_sub(prev.5),
                migrated: ds.migrated,
                fell_back: ds.fell_back,
                migrations_lost: ds.lost,
                not_allowed: ds.not_allowed,
                over_peer_cap: ds.over_peer_cap,
                bad_offers: ds.bad_offers,
                defender_cpu_ms: cpu.saturating_sub(prev.7) as f64 / 1e3,
                softirq_ms: ((soft - prev.8) * 10.0).round() / 10.0,
            });
            prev = (served, failed, lost, sent, conns, miss, spec, cpu, soft);
        }
        stop_attack.store(true, Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
    });
    let wall = t0.elapsed().as_secs_f64();
    let spec = SpecdCounts::read(d).minus(spec0);
    let handoff = handoff_phase(d, t0_ms, unix_ms());
    let (_, _, miss) = fe_tables(d);
    let sum = |f: fn(&FloodSecond) -> u64| series.iter().map(f).sum::<u64>();
    let (tracked, evicted, moved) = (
        sum(|s| s.flows_tracked),
        sum(|s| s.flows_evicted),
        sum(|s| s.flows_moved),
    );
    let nonsyn = att.nonsyn_sent.load(Ordering::Relaxed);
    let errors = lock(&attack_errors).clone();
    let mut p = FloodPoint {
        phase: name.to_string(),
        seconds: (wall * 100.0).round() / 100.0,
        succeeded: false,
        nonsyn_sent: nonsyn,
        nonsyn_pps: (nonsyn as f64 / wall).round(),
        specd_attack_conns: att.specd_conns.load(Ordering::Relaxed),
        specd_attack_bytes: att.specd_bytes.load(Ordering::Relaxed),
        specd_answered_bytes: att.specd_answered.load(Ordering::Relaxed),
        slow_held_max: att.slow_held_max.load(Ordering::Relaxed),
        live_flows_tracked: tracked,
        live_flows_evicted: evicted,
        live_flows_moved: moved,
        migrations_attempted: spec.migrated + spec.fell_back + spec.lost,
        migrations_completed: spec.migrated,
        migrations_fell_back: spec.fell_back,
        migrations_lost: spec.lost,
        specd_not_allowed: spec.not_allowed,
        specd_over_peer_cap: spec.over_peer_cap,
        specd_bad_offers: spec.bad_offers,
        served_requests: legit.served.load(Ordering::Relaxed),
        failed_requests: legit.failed.load(Ordering::Relaxed),
        lost_connections: legit.lost.load(Ordering::Relaxed),
        fe_flows_max,
        fe_moved_flows_max: fe_moved_max,
        fe_nonsyn_miss: miss.saturating_sub(miss0),
        defender_cpu_ms: (d.defender_cpu_us().saturating_sub(cpu0) as f64 / 1e3).round(),
        softirq_ms: (dc::softirq_ms() - soft0).round(),
        handoff,
        steering: spec.steer,
        effect: String::new(),
        series,
    };
    p.succeeded = p.live_flows_evicted > 0 || p.migrations_lost > 0 || p.lost_connections > 0;
    p.effect = format!(
        "{} spoofed non-SYN packets ({:.0}/s; front-end nonsyn_miss +{}, flow table at most \
         {} entries, {} moved); specd's port: {} attacker connections, {} B sent, {} B answered, \
         at most {} slow senders open; {} of {} live-connection samples lost or changed their \
         entry ({} moves by migration seen); migrations {} completed, {} fell back, {} lost \
         (refused: {} non-peer, {} over the peer's share, {} bad offers); hand-offs to the local \
         servers: {} ({} queued, wait p99 {} µs, max {} µs; {} offered on, {} refused, {} closed); \
         steering past Q: {} diverted for half-open connections, {} dropped without room, {} \
         passed without room; legitimate: {} served, {} failed, {} connections lost{}{}",
        p.nonsyn_sent,
        p.nonsyn_pps,
        p.fe_nonsyn_miss,
        p.fe_flows_max,
        p.fe_moved_flows_max,
        p.specd_attack_conns,
        p.specd_attack_bytes,
        p.specd_answered_bytes,
        p.slow_held_max,
        p.live_flows_evicted,
        p.live_flows_tracked,
        p.live_flows_moved,
        p.migrations_completed,
        p.migrations_fell_back,
        p.migrations_lost,
        p.specd_not_allowed,
        p.specd_over_peer_cap,
        p.specd_bad_offers,
        p.handoff.handed,
        p.handoff.queued,
        p.handoff.wait_p99_us,
        p.handoff.wait_max_us,
        p.handoff.offered_on,
        p.handoff.refused,
        p.handoff.closed,
        p.steering.half_open,
        p.steering.dropped,
        p.steering.full_passed,
        p.served_requests,
        p.failed_requests,
        p.lost_connections,
        {
            let lost = lock(&legit.lost_details);
            if lost.is_empty() {
                String::new()
            } else {
                format!(" ({})", lost.join("; "))
            }
        },
        if errors.is_empty() {
            String::new()
        } else {
            format!("; attacker errors: {}", errors.join("; "))
        }
    );
    // An attacker that stopped early did not flood for the phase: not a defence.
    if !errors.is_empty() {
        return Err(io::Error::other(p.effect));
    }
    Ok(p)
}

/// Run the flood; returns the summary (phases `reference`, `flood`).
pub fn run(a: FloodArgs) -> io::Result<Summary<FloodPoint>> {
    crate::fabric::netns::check_root(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
    )?;
    let secs = a.seconds;
    if !(secs > 0.0 && secs <= FLOOD_SECONDS_MAX) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--flood-seconds must be in (0, {FLOOD_SECONDS_MAX}]"),
        ));
    }
    if a.pps == 0 || a.pps > FLOOD_PPS_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--flood-pps must be in 1..={FLOOD_PPS_MAX}"),
        ));
    }
    let reference = (secs / 4.0).clamp(1.0, REFERENCE_S_MAX);
    let exe = match &a.farside_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?,
    };
    let dir = a.sweep.dir(&a.out);
    let mut meta = Summary::new(AttacksFlood::NAME, "netns", a.sweep.quick);
    crate::sweep::fill_host_metadata(&mut meta);
    meta.params = serde_json::json!({
        "flood_seconds": secs,
        "reference_seconds": reference,
        "flood_pps": a.pps,
        "sessions": SESSIONS,
        "spec_queue": SPEC_QUEUE,
        "session_requests": SESSION_REQUESTS,
        "victims": VICTIMS,
        "victim_requests": VICTIM_REQUESTS,
        "request_period_ms": REQUEST_PERIOD.as_millis() as u64,
        "slow_conns": SLOW_CONNS,
        "round_ms": ROUND.as_millis() as u64,
        "burst_rate": BURST_RATE,
        "burst_s": BURST_S,
        "weights": dc::WEIGHTS,
    });
    let mut sweep =
        crate::sweep::Sweep::<AttacksFlood>::start(&dir, meta, a.sweep.resume.is_some())?;
    eprintln!("lab attacks --flood-seconds {secs}: building the data-center (netns)");
    let mut d = Dc::start_with_queue(&dir, &exe, SPEC_QUEUE)?;
    // Capture one of b0's authenticated control connections to replay: b0's frames
    // mirrored to the cluster attacker during a burst, then no longer.
    super::raw::mirror(&d.dc, B0, ATK)?;
    let sniff = super::raw::Sniffer::start(&d.dc, ATK)?;
    let burst = d.burst(BURST_RATE, BURST_S)?;
    let cap = super::specd::capture(&sniff, d.dc.node_ip(B0), d.dc.node_ip(B1));
    drop(sniff);
    super::raw::unmirror(&d.dc, B0)?;
    let replay = cap.stream[..cap.stream.len().min(REPLAY_BYTES_MAX)].to_vec();
    sweep.note(format!(
        "capture: burst of {BURST_RATE:.0} conn/s served {} (failed {}); captured {} specd \
         control connection(s), {} B replayed per round",
        burst.served,
        burst.failures,
        cap.connections,
        replay.len()
    ))?;
    let phases = ["reference", "flood"];
    let pps = a.pps;
    sweep.run(
        &phases,
        1,
        secs,
        |n| n.to_string(),
        |name, _| match *name {
            "reference" => phase(&d, name, reference, None),
            _ => phase(&d, name, secs, Some((pps, replay.as_slice()))),
        },
    )?;
    let alive = d.check_alive();
    if let Err(e) = &alive {
        sweep.note(format!("a daemon died during the run: {e}"))?;
    }
    drop(d);
    let s = sweep.finish()?;
    alive.map(|()| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_replies_name_the_backend_or_none() {
        assert_eq!(
            flow_backend("OK 10.7.0.1 held=0").as_deref(),
            Some("10.7.0.1")
        );
        assert_eq!(flow_backend("OK none").as_deref(), Some("none"));
        assert_eq!(flow_backend("ERR bad"), None);
    }

    #[test]
    fn the_table_sums_the_series_by_minute_and_says_whether_it_succeeded() {
        let s = |t: usize, evicted: u64| FloodSecond {
            t_s: t as f64,
            phase: "flood".into(),
            nonsyn_sent: 20_000,
            migrated: 2,
            served: 100,
            flows_evicted: evicted,
            defender_cpu_ms: 500.0,
            ..Default::default()
        };
        let p = FloodPoint {
            phase: "flood".into(),
            seconds: 120.0,
            succeeded: true,
            live_flows_evicted: 1,
            series: (0..120).map(|t| s(t, u64::from(t == 70))).collect(),
            ..Default::default()
        };
        let t = table(&[p]);
        assert!(t.contains("flood by minute"), "{t}");
        let rows: Vec<&str> = t
            .lines()
            .skip_while(|l| !l.contains("by minute"))
            .skip(2)
            .take(2)
            .collect();
        // Minute 0: nothing evicted, 120 migrated, 6000 served; minute 1: one eviction.
        assert!(rows[0].split_whitespace().nth(2) == Some("0"), "{t}");
        assert!(rows[1].split_whitespace().nth(2) == Some("1"), "{t}");
        assert!(
            rows[0].contains(" 120 ") && rows[0].contains(" 6000 "),
            "{t}"
        );
        assert!(t.contains("YES"), "{t}");
    }
}
