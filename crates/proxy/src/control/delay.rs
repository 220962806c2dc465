//! Objective-driven admission (`--metric delay --target-delay-ms N`): the operator
//! states a target queueing delay instead of a limit, and each back-end's admission
//! budget (the most requests this proxy keeps in flight to it) adapts so that the
//! back-end's published queueing delay (`queue_delay_us` in its region: the age of its
//! oldest unread request, see gatherd's `sample` module) stays under the target.
//!
//! The rule (AIMD, as Breakwater's credits and TCP's window, on CoDel's sojourn signal),
//! applied once per new delay reading, per back-end, by [`DelayBudget::on_reading`]:
//! - delay below the target and the budget was in use (this proxy had at least
//!   `budget - 1` requests in flight at some point since the last reading): grow by
//!   [`GROW_STEP`]. An unused budget does not grow, so it cannot build up credit that a
//!   sudden burst would spend at once;
//! - delay at or above the target: cut multiplicatively in proportion to the overshoot,
//!   `budget × max(1 − CUT_GAIN × (delay − target) / delay, CUT_FACTOR_MIN)`: a small
//!   overshoot trims, a large one halves;
//! - always within `[BUDGET_MIN, max]`, `max` being the back-end's `limit`.
//!
//! Nothing is modelled: other tenants' load, other proxies' requests, a request mix whose
//! cost differs 100×, or a CPU quota that halves all show up as delay, and the budget
//! follows. Several proxies sharing a back-end each run this rule on the same signal, and
//! AIMD converges to a shared operating point.
//!
//! Liveness (the argument of the parent module's doc, for this metric): admission
//! compares this proxy's own in-flight requests to the back-end with a budget that is
//! never below [`BUDGET_MIN`] = 1, so whatever the delay reads, a request is admitted
//! as soon as this proxy's requests to the back-end have completed (within their
//! service time): no reading can lock admission out. A stale reading is the stale
//! policy's business, as for every metric.
//!
//! The state machine is pure: `(state, reading, now) -> state`, no clock or I/O, so
//! `tests` drive it with a seeded simulated back-end.

/// Smallest budget: one request in flight per back-end, the liveness floor (module doc).
pub const BUDGET_MIN: f64 = 1.0;
/// Additive increase per reading below the target, requests. One per reading (a reading
/// every few tens of ms) climbs to a 16-worker back-end's operating point in well
/// under a second.
pub const GROW_STEP: f64 = 1.0;
/// Gain of the multiplicative cut in the relative overshoot `(delay − target) / delay`.
pub const CUT_GAIN: f64 = 0.5;
/// Strongest single cut: halve (TCP's and Breakwater's bound: one reading never
/// empties the budget).
pub const CUT_FACTOR_MIN: f64 = 0.5;

/// The budget of one back-end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DelayBudget {
    /// Requests this proxy may keep in flight to the back-end (fractional; admission
    /// compares with its floor).
    pub budget: f64,
    /// Identity of the last reading acted on (the gatherer's sample time of it).
    pub reading_id: u64,
    /// CLOCK_MONOTONIC ns of the last reading acted on.
    pub updated_ns: u64,
}

/// One delay reading of a back-end, and how this proxy used its budget since the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// Changes with every new measurement (gatherer's sample time of it).
    pub id: u64,
    /// The back-end's queueing delay, µs.
    pub delay_us: u64,
    /// Whether this proxy had `budget - 1` or more requests in flight to it since the
    /// previous reading (the budget was the constraint).
    pub used: bool,
}

impl DelayBudget {
    /// A fresh budget, starting at `start` (clamped to `[BUDGET_MIN, max]`).
    pub fn new(start: f64, max: f64) -> DelayBudget {
        DelayBudget {
            budget: start.clamp(BUDGET_MIN, max.max(BUDGET_MIN)),
            reading_id: 0,
            updated_ns: 0,
        }
    }

    /// The admission check: may one more request go out with `inflight` already out?
    pub fn admits(&self, inflight: u64) -> bool {
        (inflight as f64) < self.budget.floor().max(BUDGET_MIN)
    }

    /// Whether `inflight` requests in flight use the budget (see [`Reading::used`]).
    pub fn used_by(&self, inflight: u64) -> bool {
        inflight as f64 + 1.0 >= self.budget.floor()
    }

    /// Apply one reading (no-op if it is the one already applied). Returns whether the
    /// state changed.
    pub fn on_reading(&mut self, r: Reading, target_us: u64, max: f64, now_ns: u64) -> bool {
        if r.id == self.reading_id {
            return false;
        }
        self.reading_id = r.id;
        self.updated_ns = now_ns;
        let max = max.max(BUDGET_MIN);
        if r.delay_us >= target_us.max(1) {
            let over = (r.delay_us - target_us) as f64 / r.delay_us as f64;
            self.budget *= (1.0 - CUT_GAIN * over).max(CUT_FACTOR_MIN);
        } else if r.used {
            self.budget += GROW_STEP;
        }
        self.budget = self.budget.clamp(BUDGET_MIN, max);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded simulated back-end: `workers` servers, FIFO accept queue, exponential
    /// service times of mean `service_us`; the published delay is the age of the
    /// oldest waiting request, rounded down to a 4 ms kernel tick like the real one,
    /// and read every `READ_EVERY_US`.
    struct SimBackend {
        workers: usize,
        service_us: f64,
        /// Arrival time of each waiting request (front: oldest), and who sent it.
        queue: std::collections::VecDeque<(u64, bool)>,
        /// Completion time of each busy worker, and whether the proxy sent it.
        busy: Vec<(u64, bool)>,
        rng: u64,
        /// From this time on, service takes twice as long (a CPU quota halving).
        halve_at_us: u64,
        served_proxy: u64,
        served_tenant: u64,
    }

    const TICK_US: u64 = 4_000;
    const READ_EVERY_US: u64 = 20_000;
    const STEP_US: u64 = 100;

    impl SimBackend {
        fn new(workers: usize, service_us: f64, seed: u64) -> Self {
            SimBackend {
                workers,
                service_us,
                queue: Default::default(),
                busy: Vec::new(),
                rng: seed | 1,
                halve_at_us: u64::MAX,
                served_proxy: 0,
                served_tenant: 0,
            }
        }
        fn uniform(&mut self) -> f64 {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            (self.rng >> 11) as f64 / (1u64 << 53) as f64
        }
        fn exp(&mut self, mean: f64) -> u64 {
            (-mean * (1.0 - self.uniform()).ln()) as u64
        }
        fn arrive(&mut self, now: u64, proxy: bool) {
            self.queue.push_back((now, proxy));
        }
        /// Advance to `now`; returns requests of the proxy's that completed.
        fn run(&mut self, now: u64) -> u64 {
            let mut done = 0;
            self.busy.retain(|&(t, p)| {
                if t <= now {
                    done += p as u64;
                    false
                } else {
                    true
                }
            });
            self.served_proxy += done;
            while self.busy.len() < self.workers {
                let Some((_, p)) = self.queue.pop_front() else {
                    break;
                };
                if !p {
                    self.served_tenant += 1;
                }
                let mean = if now >= self.halve_at_us {
                    2.0 * self.service_us
                } else {
                    self.service_us
                };
                let s = self.exp(mean);
                self.busy.push((now + s, p));
            }
            done
        }
        fn delay_us(&self, now: u64) -> u64 {
            self.queue
                .front()
                .map_or(0, |&(t, _)| (now - t) / TICK_US * TICK_US)
        }
    }

    struct Run {
        /// Published delay at each reading in the second half, µs.
        delays: Vec<u64>,
        /// Proxy requests served per second over the second half.
        goodput: f64,
        /// Admission never refused with nothing of this proxy's in flight.
        locked_out: bool,
        budget: DelayBudget,
    }

    /// Open-loop arrivals at `rate` per second through the proxy for `secs`; a tenant
    /// the proxy does not see adds `tenant(t_us)` requests per second directly.
    fn simulate(
        b: &mut SimBackend,
        rate: f64,
        secs: u64,
        target_us: u64,
        tenant: impl Fn(u64) -> f64,
    ) -> Run {
        let max = 1000.0;
        let mut st = DelayBudget::new(BUDGET_MIN, max);
        let mut inflight = 0u64;
        let mut used = false;
        let end = secs * 1_000_000;
        let (mut next_arrival, mut next_tenant, mut next_read) = (0u64, 0u64, READ_EVERY_US);
        let mut delays = Vec::new();
        let mut served_half = 0;
        let mut locked_out = false;
        let mut now = 0;
        while now < end {
            inflight -= b.run(now);
            while next_arrival <= now {
                if st.admits(inflight) {
                    inflight += 1;
                    used |= st.used_by(inflight);
                    b.arrive(now, true);
                } else if inflight == 0 {
                    locked_out = true;
                }
                next_arrival += b.exp(1e6 / rate).max(1);
            }
            let tr = tenant(now);
            while tr > 0.0 && next_tenant <= now {
                b.arrive(now, false);
                next_tenant += b.exp(1e6 / tr).max(1);
            }
            if tr <= 0.0 {
                next_tenant = now;
            }
            inflight -= b.run(now);
            if now >= next_read {
                let d = b.delay_us(now);
                st.on_reading(
                    Reading {
                        id: now,
                        delay_us: d,
                        used,
                    },
                    target_us,
                    max,
                    now * 1000,
                );
                used = st.used_by(inflight);
                if now >= end / 2 {
                    delays.push(d);
                }
                next_read += READ_EVERY_US;
            }
            if now == end / 2 {
                served_half = b.served_proxy;
            }
            now += STEP_US;
        }
        Run {
            delays,
            goodput: (b.served_proxy - served_half) as f64 / (secs as f64 / 2.0),
            locked_out,
            budget: st,
        }
    }

    fn mean(v: &[u64]) -> f64 {
        v.iter().sum::<u64>() as f64 / v.len().max(1) as f64
    }

    #[test]
    fn converges_to_the_target_at_different_capacities_and_keeps_goodput() {
        const TARGET_US: u64 = 10_000;
        for (workers, service_us, seed) in [(4, 1_500.0, 1), (16, 1_500.0, 2), (4, 15_000.0, 3)] {
            let capacity = workers as f64 * 1e6 / service_us;
            let mut b = SimBackend::new(workers, service_us, seed);
            let r = simulate(&mut b, 3.0 * capacity, 20, TARGET_US, |_| 0.0);
            let m = mean(&r.delays);
            eprintln!(
                "workers {workers} service {service_us} µs: mean delay {m:.0} µs, goodput {:.0}/{capacity:.0}, budget {:.1}",
                r.goodput, r.budget.budget
            );
            assert!(!r.locked_out);
            assert!(
                m < 2.0 * TARGET_US as f64,
                "delay held near the target under 3x overload: {m}"
            );
            assert!(
                r.goodput > 0.85 * capacity,
                "goodput near capacity: {} of {capacity}",
                r.goodput
            );
        }
    }

    #[test]
    fn adapts_when_a_tenant_switches_on_and_off_and_when_capacity_halves() {
        const TARGET_US: u64 = 10_000;
        let (workers, service_us) = (8, 2_000.0);
        let capacity = workers as f64 * 1e6 / service_us; // 4000/s
                                                          // A tenant the proxy does not see takes half the capacity from 10 s to 20 s.
        let mut b = SimBackend::new(workers, service_us, 7);
        let on = |t: u64| (10_000_000..20_000_000).contains(&t);
        let r = simulate(&mut b, 2.0 * capacity, 30, TARGET_US, |t| {
            if on(t) {
                capacity / 2.0
            } else {
                0.0
            }
        });
        let m = mean(&r.delays);
        eprintln!(
            "tenant on/off: mean delay {m:.0} µs, proxy goodput {:.0}, tenant served {}",
            r.goodput, b.served_tenant
        );
        assert!(!r.locked_out);
        assert!(m < 2.0 * TARGET_US as f64, "{m}");
        assert!(b.served_tenant > 0);
        // The second half (15..30 s) has the tenant for 5 s: the proxy gets at least
        // what is left, most of the time.
        assert!(r.goodput > 0.6 * capacity, "{}", r.goodput);

        // Capacity halves (service time doubles) 5 s into a 20 s run: the second half
        // is measured at the new capacity, without retuning anything.
        let mut b = SimBackend::new(workers, service_us, 8);
        b.halve_at_us = 5_000_000;
        let r2 = simulate(&mut b, 2.0 * capacity, 20, TARGET_US, |_| 0.0);
        let m2 = mean(&r2.delays);
        eprintln!(
            "halved: mean delay {m2:.0} µs, goodput {:.0}, budget {:.1}",
            r2.goodput, r2.budget.budget
        );
        assert!(m2 < 2.0 * TARGET_US as f64, "{m2}");
        assert!(r2.goodput > 0.85 * capacity / 2.0, "{}", r2.goodput);
    }

    #[test]
    fn never_locks_out_and_stays_bounded_whatever_the_delay_reads() {
        let mut st = DelayBudget::new(8.0, 32.0);
        for i in 1..100 {
            let r = Reading {
                id: i,
                delay_us: 1_000_000,
                used: true,
            };
            st.on_reading(r, 5_000, 32.0, i);
            assert!(st.budget >= BUDGET_MIN);
            assert!(st.admits(0), "nothing in flight: always admitted");
        }
        assert_eq!(st.budget, BUDGET_MIN);
        assert!(!st.admits(1));
        for i in 100..200 {
            st.on_reading(
                Reading {
                    id: i,
                    delay_us: 0,
                    used: true,
                },
                5_000,
                32.0,
                i,
            );
        }
        assert_eq!(st.budget, 32.0, "capped by max");
        // The same reading twice counts once; an unused budget does not grow.
        let mut s2 = DelayBudget::new(4.0, 32.0);
        let r = Reading {
            id: 1,
            delay_us: 0,
            used: true,
        };
        assert!(s2.on_reading(r, 5_000, 32.0, 1));
        assert!(!s2.on_reading(r, 5_000, 32.0, 2));
        assert_eq!(s2.budget, 5.0);
        s2.on_reading(
            Reading {
                id: 2,
                delay_us: 0,
                used: false,
            },
            5_000,
            32.0,
            3,
        );
        assert_eq!(s2.budget, 5.0);
    }
}
