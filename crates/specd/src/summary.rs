//! The JSON the daemon writes: the exit summary (`farside specd` prints it and writes
//! `--summary`) and its parts, one struct per object. Field order is key order;
//! counts are integers, means and times floats rounded as documented per field.
//! Serialised with serde, so names and addresses are escaped as JSON requires.

use serde::{Serialize, Serializer};

/// `x` rounded to `decimals` places as `{:.N}` prints it (ties to even on the exact
/// binary value), so the JSON value is the one a fixed-point print gave.
pub fn rounded(x: f64, decimals: usize) -> f64 {
    format!("{x:.decimals$}").parse().unwrap_or(x)
}

/// One line of JSON (no newline).
pub fn to_line(v: &impl Serialize) -> String {
    // Plain structs of numbers, strings and string-keyed maps: serialising cannot fail.
    serde_json::to_string(v).expect("the summary's structs serialise")
}

/// Percentiles of a bounded series (`stats::Samples`), µs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SamplesSummary {
    /// Samples ever recorded.
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
    /// Mean of the kept samples, to 0.1.
    pub mean: f64,
}

/// Events per second (`stats::PerSecond`): second `first_s + i` is element `i`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeriesSummary {
    pub first_s: u64,
    pub migrated: Vec<u32>,
    pub refused: Vec<u32>,
    pub closed: Vec<u32>,
    pub evicted: u64,
}

/// The hand-off to the local server (`handoff::HandoffStats`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HandoffSummary {
    pub handed: u64,
    pub failed: u64,
    pub queued: u64,
    pub pending: u64,
    pub queued_max: u64,
    pub over_bound: u64,
    /// Refused with a reset after the wait bound.
    pub waited_too_long: u64,
    /// Taken back to be offered to a peer.
    pub taken_back: u64,
    pub client_gone: u64,
    pub wait_us: SamplesSummary,
}

/// The target side (the exit summary's `target`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TargetSummary {
    pub offers: u64,
    pub refused: u64,
    pub restored: u64,
    pub restore_failed: u64,
    pub aborted: u64,
    /// Control connections closed at once: from an address not allowed, over their
    /// peer's share of the threads; offers refused by the offer rules.
    pub not_allowed: u64,
    pub over_peer_cap: u64,
    pub bad_offers: u64,
    pub notifications: u64,
    /// Connections the hand-off closed (`HandoffStats::closed`).
    pub handoff_failed: u64,
    pub handoff: HandoffSummary,
    pub relayed_bytes: u64,
    pub cpu_us: SamplesSummary,
}

/// The admission window's state and life (`window::Window`, `WindowStats`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowSummary {
    pub size: u32,
    pub in_flight: u32,
    pub falling_back: u32,
    pub migratory: u64,
    pub target_refusals: u64,
    pub target_failures: u64,
    pub not_dumpable: u64,
    pub closures: u64,
    pub reopened_by_notification: u64,
    pub reopened_by_service: u64,
    pub reopened_by_peer_load: u64,
    /// Connections the local server did not take within the re-offer bound that were
    /// offered to a peer again (`source::HANDOFF_REOFFER_AFTER`).
    pub reoffered: u64,
}

impl From<&crate::window::Window> for WindowSummary {
    fn from(w: &crate::window::Window) -> WindowSummary {
        let ws = w.stats();
        WindowSummary {
            size: w.size(),
            in_flight: w.in_flight(),
            falling_back: w.falling_back(),
            migratory: ws.migratory,
            target_refusals: ws.target_refusals,
            target_failures: ws.target_failures,
            not_dumpable: ws.not_dumpable,
            closures: ws.closures,
            reopened_by_notification: ws.reopened_by_notification,
            reopened_by_service: ws.reopened_by_service,
            reopened_by_peer_load: ws.reopened_by_peer_load,
            reoffered: ws.reoffered,
        }
    }
}

/// The steering program's counters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SteerSummary {
    pub server: u64,
    pub daemon: u64,
    pub no_server: u64,
    /// Diverted because of half-open connections (`CNT_HALF_OPEN`).
    pub half_open: u64,
    /// Dropped at the refusal listener (`CNT_DROPPED`).
    pub dropped: u64,
    /// Passed to the server past Q without room (`CNT_FULL_PASSED`).
    pub full_passed: u64,
}

/// The control pool's flow drain (`farside_migrate::DrainStats`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DrainSummary {
    pub deferred: u64,
    pub inline: u64,
    pub closed: u64,
    pub closed_by_deferrals: u64,
    pub pending: u64,
    pub pending_peak: u64,
    pub wakeups: u64,
}

impl From<&farside_migrate::DrainStats> for DrainSummary {
    fn from(d: &farside_migrate::DrainStats) -> DrainSummary {
        DrainSummary {
            deferred: d.deferred,
            inline: d.inline,
            closed: d.closed,
            closed_by_deferrals: d.closed_by_deferrals,
            pending: d.pending as u64,
            pending_peak: d.pending_peak as u64,
            wakeups: d.wakeups,
        }
    }
}

/// The control connections to the peers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ControlSummary {
    pub opened: u64,
    pub reused: u64,
    pub stale: u64,
}

impl From<&farside_migrate::ControlPool> for ControlSummary {
    fn from(c: &farside_migrate::ControlPool) -> ControlSummary {
        ControlSummary {
            opened: c.opened(),
            reused: c.reused(),
            stale: c.stale(),
        }
    }
}

/// One peer's migrations.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeerSummary {
    /// The peer daemon's address.
    pub daemon: String,
    pub migrated: u64,
    pub refused: u64,
    pub failed: u64,
}

/// Counts by name, as a JSON object whose keys keep this order.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedCounts(pub Vec<(&'static str, u64)>);

impl Serialize for NamedCounts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// The source side (the exit summary's `source`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SourceSummary {
    pub started_unix_ms: u64,
    pub series: SeriesSummary,
    /// Window transitions: `[ms since start, what]`.
    pub window_events: Vec<(u64, &'static str)>,
    pub window_events_dropped: u64,
    pub accepted: u64,
    pub stale_local: u64,
    pub migrated: u64,
    pub fell_back: u64,
    pub lost: u64,
    pub local_handoff_failed: u64,
    pub local_handoff: HandoffSummary,
    pub notifications: u64,
    pub window: WindowSummary,
    pub steer: SteerSummary,
    pub steer_mode: &'static str,
    pub migration_us: SamplesSummary,
    pub dump_us: SamplesSummary,
    pub cpu_us: SamplesSummary,
    pub queue_wait_us: SamplesSummary,
    pub offer_us: SamplesSummary,
    pub restore_us: SamplesSummary,
    pub flow_us: SamplesSummary,
    pub admit_to_done_us: SamplesSummary,
    pub flow_drain: DrainSummary,
    pub control: ControlSummary,
    pub no_peer_room: u64,
    pub affinity_hashed: u64,
    /// Fall-backs by reason (`source::FALLBACK_REASONS`, in that order).
    pub fallbacks: NamedCounts,
    pub peers: Vec<PeerSummary>,
}

/// What `farside specd` prints when it exits (and writes to `--summary`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExitSummary {
    /// Wall time the daemon ran, s, to 0.001.
    pub wall_s: f64,
    /// CPU time (user + system) of the whole daemon, ms, to 0.1.
    pub process_cpu_ms: f64,
    /// `null` on a daemon without a source side.
    pub source: Option<SourceSummary>,
    pub target: TargetSummary,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_gives_the_value_a_fixed_point_print_gave() {
        for (x, d) in [(0.25, 1), (0.35, 1), (12.0, 1), (1.0005, 3), (2.5e-7, 3)] {
            let printed: serde_json::Value = serde_json::from_str(&format!("{x:.d$}")).unwrap();
            let ours: serde_json::Value = serde_json::from_str(&to_line(&rounded(x, d))).unwrap();
            assert_eq!(printed, ours, "{x} to {d}");
        }
    }

    #[test]
    fn named_counts_keep_their_order_and_strings_are_escaped() {
        let c = NamedCounts(vec![("zeta", 1), ("alpha", 2)]);
        assert_eq!(to_line(&c), r#"{"zeta":1,"alpha":2}"#);
        let p = PeerSummary {
            daemon: "a\"b".into(),
            migrated: 1,
            refused: 0,
            failed: 0,
        };
        assert_eq!(
            to_line(&p),
            r#"{"daemon":"a\"b","migrated":1,"refused":0,"failed":0}"#
        );
    }
}
