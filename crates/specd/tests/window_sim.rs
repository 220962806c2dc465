//! Seeded simulation of two back-ends under speculative admission: node A (source)
//! receives more connections than it can serve, admits the excess speculatively and
//! migrates it to node B (target), which admits by its own queue and sends a
//! notification (sometimes lost) whenever it finished a migrated request.
//!
//! Checked at every event, for many seeds: never more than W migratory connections in
//! flight; the window closes on every refusal and failure and admits nothing while
//! closed; it reopens only on a notification or after N locally served requests (an
//! independent model of §3.2 tracks what the state should be); and over the run the
//! window closes and reopens both ways, migrations happen, and the pair serves more
//! than node A alone with the window off (W = 0).

use std::collections::VecDeque;

use farside_specd::window::{Decision, Resolution, Window, WindowConfig};

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A node's server: an accept queue and workers, each request `service` ticks.
struct Server {
    queue: VecDeque<bool>, // true = a migrated (or fallen-back) connection
    busy: Vec<(u64, bool)>,
    workers: usize,
    service: u64,
}

impl Server {
    fn new(workers: usize, service: u64) -> Self {
        Self {
            queue: VecDeque::new(),
            busy: Vec::new(),
            workers,
            service,
        }
    }
    /// Advances to tick `t`; returns the finished requests (their "migrated" marks).
    fn step(&mut self, t: u64) -> Vec<bool> {
        let mut done = Vec::new();
        self.busy.retain(|&(end, m)| {
            if end <= t {
                done.push(m);
                false
            } else {
                true
            }
        });
        while self.busy.len() < self.workers {
            let Some(m) = self.queue.pop_front() else {
                break;
            };
            self.busy.push((t + self.service, m));
        }
        done
    }
}

/// What §3.2 says the window's state should be, tracked independently.
struct Model {
    open: bool,
    served_since_close: u64,
    n: u64,
}

struct Outcome {
    served: u64,
    migrated: u64,
    closures: u64,
    reopened_by_notification: u64,
    reopened_by_service: u64,
    refusals: u64,
}

const TICKS: u64 = 20_000;
/// Ticks a migration takes (dump, ship, restore).
const MIGRATION_TICKS: u64 = 3;
/// Ticks a notification takes to reach the source.
const NOTIFY_TICKS: u64 = 2;
/// Node B refuses a migration once its accept queue holds this many.
const TARGET_ADMIT_MAX: usize = 24;

fn simulate(seed: u64, cfg: WindowConfig) -> Outcome {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut w = Window::new(cfg);
    let mut model = Model {
        open: cfg.window > 0,
        served_since_close: 0,
        n: u64::from(cfg.reopen_after),
    };
    // A serves 4 at a time, 10 ticks each (0.4/tick); B likewise with its own
    // arrivals at 0.1/tick; A receives 0.75/tick (75/25 routing of 1/tick).
    let mut a = Server::new(4, 10);
    let mut b = Server::new(4, 10);
    let mut migrations: VecDeque<u64> = VecDeque::new();
    let mut notifications: VecDeque<u64> = VecDeque::new();
    let mut out = Outcome {
        served: 0,
        migrated: 0,
        closures: 0,
        reopened_by_notification: 0,
        reopened_by_service: 0,
        refusals: 0,
    };
    let q_max = cfg.queue as usize;
    for t in 0..TICKS {
        // Arrivals at A.
        if rng.chance(75) {
            let was_open = w.is_open();
            let room = w.has_room();
            match w.on_arrival(a.queue.len() as u32) {
                Decision::Server => {
                    assert!(a.queue.len() < q_max);
                    a.queue.push_back(false);
                }
                Decision::Migrate => {
                    assert!(a.queue.len() >= q_max, "seed {seed} t {t}");
                    assert!(
                        was_open && room && model.open,
                        "seed {seed} t {t}: admitted while closed"
                    );
                    migrations.push_back(t + MIGRATION_TICKS);
                }
                Decision::Refuse => {
                    assert!(a.queue.len() >= q_max);
                    assert!(!room, "seed {seed} t {t}: refused with room");
                }
            }
        }
        // B's own arrivals (admitted by its own queue; the kernel drops the rest).
        if rng.chance(10) && b.queue.len() < q_max {
            b.queue.push_back(false);
        }
        // Migrations ending now.
        while migrations.front().is_some_and(|&end| end <= t) {
            migrations.pop_front();
            let r = if rng.chance(2) {
                Resolution::TargetFailed
            } else if b.queue.len() >= TARGET_ADMIT_MAX {
                Resolution::Refused
            } else {
                Resolution::Migrated
            };
            w.on_resolved(r);
            match r {
                Resolution::Migrated => {
                    b.queue.push_back(true);
                    out.migrated += 1;
                }
                _ => {
                    // Fall-back: served on the source.
                    a.queue.push_back(false);
                    out.refusals += 1;
                    model.open = false;
                    model.served_since_close = 0;
                    assert!(!w.is_open(), "seed {seed} t {t}: open after {r:?}");
                }
            }
        }
        // Notifications reaching A.
        while notifications.front().is_some_and(|&at| at <= t) {
            notifications.pop_front();
            w.on_notification();
            model.open = cfg.window > 0;
        }
        // Service.
        for _ in a.step(t) {
            out.served += 1;
            w.on_served_locally(1);
            if !model.open && cfg.window > 0 {
                model.served_since_close += 1;
                if model.served_since_close >= model.n {
                    model.open = true;
                }
            }
        }
        for migrated in b.step(t) {
            out.served += 1;
            // A lost notification (30 %) leaves the reopening to the N-rule.
            if migrated && !rng.chance(30) {
                notifications.push_back(t + NOTIFY_TICKS);
            }
        }
        assert!(w.in_flight() <= cfg.window, "seed {seed} t {t}");
        assert_eq!(
            w.in_flight() as usize,
            migrations.len(),
            "seed {seed} t {t}"
        );
        assert_eq!(w.is_open(), model.open, "seed {seed} t {t}");
    }
    let s = w.stats();
    out.closures = s.closures;
    out.reopened_by_notification = s.reopened_by_notification;
    out.reopened_by_service = s.reopened_by_service;
    out
}

#[test]
fn window_invariants_hold_over_seeded_two_node_runs() {
    let mut totals = (0, 0, 0, 0);
    for seed in 1..=20 {
        let cfg = WindowConfig::new(16, 8);
        let o = simulate(seed, cfg);
        assert!(o.migrated > 0, "seed {seed}: nothing migrated");
        assert!(o.refusals > 0, "seed {seed}: the target never refused");
        totals.0 += o.closures;
        totals.1 += o.reopened_by_notification;
        totals.2 += o.reopened_by_service;
        totals.3 += o.migrated;
    }
    assert!(totals.0 > 0, "the window never closed");
    assert!(totals.1 > 0, "never reopened by a notification");
    assert!(totals.2 > 0, "never reopened by N local requests");
}

#[test]
fn speculative_admission_serves_more_than_the_source_alone() {
    for seed in 1..=5 {
        let spec = simulate(seed, WindowConfig::new(16, 8));
        let alone = simulate(seed, WindowConfig::new(16, 0));
        assert_eq!(alone.migrated, 0);
        assert!(
            spec.served > alone.served,
            "seed {seed}: {} with the window, {} without",
            spec.served,
            alone.served
        );
    }
}
