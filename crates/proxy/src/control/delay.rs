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
//! - always within `[BUDGET_MIN, max]`, `max` being the back-end's `limit`;
//! - at most one step per target delay ([`DelayBudget::due`]): a cut shows in the delay
//!   only once the queue in front of it has drained, about one target's worth of time,
//!   so a sampler that publishes every millisecond (the kernel sampler) would otherwise
//!   cut again and again for the same overshoot. Readings in between are skipped;
//! - **slow start** until the first cut ([`DelayBudget::on_done`]): a fresh budget is 1,
//!   and one step per target delay would take a 16-worker back-end seconds to reach
//!   (with the default target of 250 ms, about 5 s of refusals below capacity after
//!   every start or reload). So, as TCP's slow start, until the first reading at or
//!   above the target every completion of a request while the budget was in use adds
//!   one: the budget at most doubles per service time, following demand, and the first
//!   overshoot ends it (from then on, the steps above). A completion is this proxy's own
//!   event, so the growth needs no reading.
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
    /// In slow start: no reading has been at or above the target yet (module doc).
    pub slow_start: bool,
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
            slow_start: true,
        }
    }

    /// Slow start (module doc): one of this proxy's requests to the back-end completed
    /// while `inflight` were in flight, itself included. Grows the budget by one when
    /// the budget was in use (at most one short of full), until the first cut. Returns
    /// whether the state changed.
    pub fn on_done(&mut self, inflight: u64, max: f64) -> bool {
        if !self.slow_start || !self.used_by(inflight.saturating_sub(1)) {
            return false;
        }
        let before = self.budget;
        self.budget = (self.budget + GROW_STEP).min(max.max(BUDGET_MIN));
        self.budget != before
    }

    /// The admission check: may one more request go out with `inflight` already out?
    pub fn admits(&self, inflight: u64) -> bool {
        (inflight as f64) < self.budget.floor().max(BUDGET_MIN)
    }

    /// Whether `inflight` requests in flight use the budget (see [`Reading::used`]).
    pub fn used_by(&self, inflight: u64) -> bool {
        inflight as f64 + 1.0 >= self.budget.floor()
    }

    /// Whether a step is due at `now_ns` with target `target_us` (module doc: at most one
    /// step per target delay).
    pub fn due(&self, now_ns: u64, target_us: u64) -> bool {
        self.updated_ns == 0 || now_ns.saturating_sub(self.updated_ns) >= target_us * 1000
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
            self.slow_start = false;
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

    #[test]
    fn slow_start_grows_per_completion_in_use_until_the_first_cut() {
        let mut b = DelayBudget::new(BUDGET_MIN, 100.0);
        // Not in use (nothing else in flight with a budget of 4): no growth.
        b.budget = 4.0;
        assert!(!b.on_done(1, 100.0));
        // In use: each completion adds one; the budget doubles per round of completions.
        // 7 completions, each with the budget full (a freed slot is taken at once): 1 -> 8,
        // a doubling per round of completions.
        let mut b = DelayBudget::new(BUDGET_MIN, 100.0);
        for _ in 0..7 {
            let full = b.budget.floor() as u64;
            assert!(b.on_done(full, 100.0));
        }
        assert_eq!(b.budget, 8.0);
        // Capped by the limit.
        let mut c = DelayBudget::new(BUDGET_MIN, 2.0);
        c.on_done(1, 2.0);
        c.on_done(2, 2.0);
        assert_eq!(c.budget, 2.0);
        // A reading below the target does not end it; one above cuts and ends it.
        let below = Reading {
            id: 1,
            delay_us: 1_000,
            used: true,
        };
        b.on_reading(below, 5_000, 100.0, 1);
        assert!(b.slow_start);
        let above = Reading {
            id: 2,
            delay_us: 10_000,
            used: true,
        };
        b.on_reading(above, 5_000, 100.0, 10_000_000);
        assert!(!b.slow_start);
        let after = b.budget;
        assert!(
            !b.on_done(after as u64, 100.0),
            "no growth per completion after the cut"
        );
        assert_eq!(b.budget, after);
    }

    /// Who sent a simulated request: proxy `i`, or the tenant the proxies do not see.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum From {
        Proxy(usize),
        Tenant,
    }

    /// A seeded simulated back-end: `workers` servers, FIFO accept queue, exponential
    /// service times of mean `service_us` (a fraction `heavy_share` of requests costs
    /// `HEAVY_COST`× that); the published delay is the age of the oldest waiting
    /// request, rounded down to a 4 ms kernel tick like the real one, read every
    /// `READ_EVERY_US`.
    struct SimBackend {
        workers: usize,
        service_us: f64,
        heavy_share: f64,
        /// Arrival time of each waiting request (front: oldest), and who sent it.
        queue: std::collections::VecDeque<(u64, From)>,
        /// Completion time of each busy worker, and who sent its request.
        busy: Vec<(u64, From)>,
        rng: u64,
        /// From this time on, service takes twice as long (a CPU quota halving).
        halve_at_us: u64,
        /// Requests served, per proxy.
        served: Vec<u64>,
        served_tenant: u64,
        /// Busy worker-µs, for utilisation.
        busy_us: f64,
    }

    const TICK_US: u64 = 4_000;
    const READ_EVERY_US: u64 = 20_000;
    const STEP_US: u64 = 100;
    /// Cost of a heavy request relative to a light one: the 100×.
    const HEAVY_COST: f64 = 100.0;

    impl SimBackend {
        fn new(workers: usize, service_us: f64, seed: u64) -> Self {
            SimBackend {
                workers,
                service_us,
                heavy_share: 0.0,
                queue: Default::default(),
                busy: Vec::new(),
                rng: seed | 1,
                halve_at_us: u64::MAX,
                served: Vec::new(),
                served_tenant: 0,
                busy_us: 0.0,
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
        /// Mean cost of a request at `now`, heavy ones included.
        fn mean_cost(&self, now: u64) -> f64 {
            let base = if now >= self.halve_at_us {
                2.0 * self.service_us
            } else {
                self.service_us
            };
            base * (1.0 - self.heavy_share + self.heavy_share * HEAVY_COST)
        }
        fn capacity(&self, now: u64) -> f64 {
            self.workers as f64 * 1e6 / self.mean_cost(now)
        }
        /// Advance to `now`; returns each proxy's requests that completed.
        fn run(&mut self, now: u64, done: &mut [u64]) {
            let served = &mut self.served;
            served.resize(done.len(), 0);
            self.busy.retain(|&(t, f)| {
                if t > now {
                    return true;
                }
                if let From::Proxy(i) = f {
                    done[i] += 1;
                    served[i] += 1;
                }
                false
            });
            while self.busy.len() < self.workers {
                let Some((_, f)) = self.queue.pop_front() else {
                    break;
                };
                if f == From::Tenant {
                    self.served_tenant += 1;
                }
                let mut mean = if now >= self.halve_at_us {
                    2.0 * self.service_us
                } else {
                    self.service_us
                };
                if self.uniform() < self.heavy_share {
                    mean *= HEAVY_COST;
                }
                let s = self.exp(mean);
                self.busy_us += s as f64;
                self.busy.push((now + s, f));
            }
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
        /// Requests served per second over the second half, per proxy.
        goodput: Vec<f64>,
        /// Admission refused with nothing of that proxy's in flight.
        locked_out: bool,
        budgets: Vec<DelayBudget>,
    }

    /// Open-loop arrivals at `rates[i]` per second through proxy `i` for `secs`, each
    /// proxy with its own budget; a tenant the proxies do not see adds `tenant(t_us)`
    /// requests per second directly.
    fn simulate(
        b: &mut SimBackend,
        rates: &[f64],
        secs: u64,
        target_us: u64,
        tenant: impl Fn(u64) -> f64,
    ) -> Run {
        let max = 1000.0;
        let n = rates.len();
        let mut st = vec![DelayBudget::new(BUDGET_MIN, max); n];
        let mut inflight = vec![0u64; n];
        let mut used = vec![false; n];
        let mut done = vec![0u64; n];
        let end = secs * 1_000_000;
        let mut next_arrival = vec![0u64; n];
        let (mut next_tenant, mut next_read) = (0u64, READ_EVERY_US);
        let mut delays = Vec::new();
        let mut served_half = vec![0; n];
        let mut locked_out = false;
        let mut now = 0;
        let mut settle = |b: &mut SimBackend, inflight: &mut [u64], now| {
            done.iter_mut().for_each(|d| *d = 0);
            b.run(now, &mut done);
            for (f, d) in inflight.iter_mut().zip(&done) {
                *f -= d;
            }
        };
        while now < end {
            settle(b, &mut inflight, now);
            for p in 0..n {
                while next_arrival[p] <= now {
                    if st[p].admits(inflight[p]) {
                        inflight[p] += 1;
                        used[p] |= st[p].used_by(inflight[p]);
                        b.queue.push_back((now, From::Proxy(p)));
                    } else if inflight[p] == 0 {
                        locked_out = true;
                    }
                    next_arrival[p] += b.exp(1e6 / rates[p]).max(1);
                }
            }
            let tr = tenant(now);
            while tr > 0.0 && next_tenant <= now {
                b.queue.push_back((now, From::Tenant));
                next_tenant += b.exp(1e6 / tr).max(1);
            }
            if tr <= 0.0 {
                next_tenant = now;
            }
            settle(b, &mut inflight, now);
            if now >= next_read {
                let d = b.delay_us(now);
                for p in 0..n {
                    if !st[p].due(now * 1000, target_us) {
                        used[p] |= st[p].used_by(inflight[p]);
                        continue;
                    }
                    let r = Reading {
                        id: now,
                        delay_us: d,
                        used: used[p],
                    };
                    st[p].on_reading(r, target_us, max, now * 1000);
                    used[p] = st[p].used_by(inflight[p]);
                }
                if now >= end / 2 {
                    delays.push(d);
                }
                next_read += READ_EVERY_US;
            }
            if now == end / 2 {
                served_half = b.served.clone();
            }
            now += STEP_US;
        }
        let half_s = secs as f64 / 2.0;
        Run {
            delays,
            goodput: (0..n)
                .map(|p| (b.served[p] - served_half[p]) as f64 / half_s)
                .collect(),
            locked_out,
            budgets: st,
        }
    }

    fn mean(v: &[u64]) -> f64 {
        v.iter().sum::<u64>() as f64 / v.len().max(1) as f64
    }

    /// The simulated target: a few 4 ms ticks, as the rule for choosing it says.
    const TARGET_US: u64 = 10_000;

    fn check_near_target(what: &str, r: &Run) {
        let m = mean(&r.delays);
        assert!(!r.locked_out, "{what}: locked out");
        assert!(
            m < 2.0 * TARGET_US as f64,
            "{what}: mean delay {m} µs, target {TARGET_US}"
        );
    }

    #[test]
    fn converges_to_the_target_at_different_capacities_and_keeps_goodput() {
        for (workers, service_us, seed) in [(4, 1_500.0, 1), (16, 1_500.0, 2), (4, 15_000.0, 3)] {
            let mut b = SimBackend::new(workers, service_us, seed);
            let capacity = b.capacity(0);
            let r = simulate(&mut b, &[3.0 * capacity], 20, TARGET_US, |_| 0.0);
            eprintln!(
                "workers {workers} service {service_us} µs: mean delay {:.0} µs, goodput {:.0}/{capacity:.0}, budget {:.1}",
                mean(&r.delays), r.goodput[0], r.budgets[0].budget
            );
            check_near_target("capacities", &r);
            assert!(
                r.goodput[0] > 0.85 * capacity,
                "goodput near capacity: {} of {capacity}",
                r.goodput[0]
            );
        }
    }

    #[test]
    fn adapts_when_a_tenant_switches_on_and_off_and_when_capacity_halves() {
        let (workers, service_us) = (8, 2_000.0);
        // A tenant the proxy does not see takes half the capacity from 10 s to 20 s.
        let mut b = SimBackend::new(workers, service_us, 7);
        let capacity = b.capacity(0); // 4000/s
        let on = |t: u64| (10_000_000..20_000_000).contains(&t);
        let r = simulate(&mut b, &[2.0 * capacity], 30, TARGET_US, |t| {
            if on(t) {
                capacity / 2.0
            } else {
                0.0
            }
        });
        eprintln!(
            "tenant on/off: mean delay {:.0} µs, proxy goodput {:.0}, tenant served {}",
            mean(&r.delays),
            r.goodput[0],
            b.served_tenant
        );
        check_near_target("tenant", &r);
        assert!(b.served_tenant > 0);
        // The second half (15..30 s) has the tenant for 5 s: the proxy gets at least
        // what is left, most of the time.
        assert!(r.goodput[0] > 0.6 * capacity, "{}", r.goodput[0]);

        // Capacity halves (service time doubles) 5 s into a 20 s run: the second half
        // is measured at the new capacity, without retuning anything.
        let mut b = SimBackend::new(workers, service_us, 8);
        b.halve_at_us = 5_000_000;
        let r2 = simulate(&mut b, &[2.0 * capacity], 20, TARGET_US, |_| 0.0);
        eprintln!(
            "halved: mean delay {:.0} µs, goodput {:.0}, budget {:.1}",
            mean(&r2.delays),
            r2.goodput[0],
            r2.budgets[0].budget
        );
        check_near_target("halved", &r2);
        assert!(
            r2.goodput[0] > 0.85 * b.capacity(u64::MAX),
            "{}",
            r2.goodput[0]
        );
    }

    #[test]
    fn several_proxies_share_a_backend_and_a_100x_cost_mix_is_handled() {
        // Three proxies, unequal offered loads, all above their share: each gets a
        // share, none is starved, the delay holds and the back-end stays busy.
        let mut b = SimBackend::new(8, 2_000.0, 11);
        let capacity = b.capacity(0);
        let r = simulate(
            &mut b,
            &[capacity, capacity, 2.0 * capacity],
            20,
            TARGET_US,
            |_| 0.0,
        );
        let total: f64 = r.goodput.iter().sum();
        eprintln!(
            "3 proxies: mean delay {:.0} µs, goodput {:?} (total {total:.0}/{capacity:.0}), budgets {:?}",
            mean(&r.delays),
            r.goodput,
            r.budgets.iter().map(|s| s.budget).collect::<Vec<_>>()
        );
        check_near_target("3 proxies", &r);
        assert!(total > 0.85 * capacity, "{total}");
        for g in &r.goodput {
            assert!(*g > 0.1 * capacity, "no proxy starves: {:?}", r.goodput);
        }

        // 1% of requests cost 100× the rest (half the work is in them).
        let mut b = SimBackend::new(8, 200.0, 12);
        b.heavy_share = 0.01;
        let capacity = b.capacity(0);
        let r = simulate(&mut b, &[3.0 * capacity], 30, TARGET_US, |_| 0.0);
        let util = b.busy_us / (8.0 * 30e6);
        eprintln!(
            "100x mix: mean delay {:.0} µs, goodput {:.0}/{capacity:.0}, utilisation {util:.2}",
            mean(&r.delays),
            r.goodput[0]
        );
        check_near_target("100x mix", &r);
        assert!(util > 0.8, "the back-end stays busy: {util}");
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

    #[test]
    fn steps_at_most_once_per_target_delay() {
        let mut st = DelayBudget::new(16.0, 32.0);
        assert!(st.due(1, 5_000), "the first reading is always due");
        st.on_reading(
            Reading {
                id: 1,
                delay_us: 10_000,
                used: true,
            },
            5_000,
            32.0,
            1_000_000,
        );
        assert_eq!(st.budget, 12.0, "one cut: 16 x (1 - 0.5 x 5/10)");
        // Readings every 1 ms (the kernel sampler): not due until 5 ms have passed.
        assert!(!st.due(2_000_000, 5_000));
        assert!(!st.due(5_999_999, 5_000));
        assert!(st.due(6_000_000, 5_000));
    }
}
