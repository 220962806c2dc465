//! Class-aware admission: requests are sorted into classes by their path, each class's
//! cost is learned per back-end from the service times this proxy measures, and each
//! class gets its own bound of requests in flight derived from the back-end's budget,
//! with lower-priority classes shed first.
//!
//! Why: the budget of a back-end (metric `delay`'s adaptive budget, or metric
//! `inflight`'s limit) counts requests, not work. When one request in a hundred costs a
//! hundred times the others, the costly ones stay in flight a hundred times longer, so
//! by Little's law they come to hold about half of the budget's slots; each slot is a
//! worker, and on a CPU shared by the workers every running request slows all the
//! others. The delay signal (the age of the oldest *waiting* request) does not see
//! which requests hold the slots, so it bounds neither how many costly requests run at
//! once nor the cheap requests' latency behind them.
//!
//! The rule, per back-end with budget `B` (requests in flight), applied once the
//! metric's own check admitted the request:
//! - **cost**: each class's cost is an exponentially weighted mean of its requests'
//!   measured times on that back-end (routed to relayed, µs; [`Cost::observe`], gain
//!   [`COST_GAIN`], samples clamped to `[COST_US_MIN, COST_US_MAX]`), trusted after
//!   [`COST_WARM_SAMPLES`] completions. A class's *weight* is its cost over the cheapest
//!   trusted class's cost on the back-end (1 until trusted, at most [`WEIGHT_MAX`]).
//!   Both classes' times stretch alike when the workers share a CPU, so their ratio
//!   stays the ratio of their costs;
//! - **guarantee**: the lower-priority classes (a priority number above the best
//!   configured one, as HAProxy's `set-priority-class`) that asked within
//!   [`DEMAND_WINDOW_NS`] share a guaranteed `⌊B × LOWER_SHARE⌋` of the budget's slots
//!   equally: `g = ⌊B × LOWER_SHARE / n⌋` each ([`guarantee`]). A class below its
//!   guarantee is admitted whenever the budget has room, and every other request
//!   (the most important class's included) leaves room for what the wanting classes
//!   are still owed (`owed`, the sum of `g − in flight` over them): under sustained
//!   overload by the most important class, a lower class still holds its `g` slots.
//!   Why slots and not work: on a back-end whose workers share a CPU (processor
//!   sharing) every running request gets the same slice of it, so a class's share of
//!   the requests in flight is its share of the back-end's CPU, whatever each of its
//!   requests costs (Little's law: `λ × cost × n / CPU = n_class`, its CPU rate is
//!   `n_class / n`). A class a hundred times costlier holding one slot of 28 gets
//!   1/28 of the CPU, a hundredth of its requests' worth of cheap ones: that is the
//!   share its bound must be stated in;
//! - **priority**: above its guarantee, a lower class is refused once the back-end's
//!   requests in flight reach `B − reserve`, `reserve = ⌈B × PRIORITY_RESERVE_FRACTION⌉`:
//!   the most important class keeps the last quarter of the budget, and the lower
//!   classes are shed first as the back-end approaches its bound (DAGOR's rule);
//! - **concurrency**: each class may keep at most `bound` requests in flight to the
//!   back-end: `B` for the most important class, and for the others
//!   `max(g, ⌊(1 − PRIORITY_RESERVE_FRACTION) × B / weight⌋)`: past its guarantee, the
//!   work a class holds in flight (its requests times its weight, in requests of the
//!   cheapest class) stays within its share of the budget, so a class a hundred times
//!   costlier than the budget's worth of cheap requests does not take the cheap
//!   class's slots beyond its guarantee (each of its slots serves a hundredth of the
//!   requests a cheap slot serves).
//!
//! Liveness: every class may keep one request in flight to a back-end whenever the
//! back-end's budget is not full (`bound ≥ 1`, and a class below `max(g, 1)` is held
//! back by neither the reserve nor the others' guarantees); the most important class
//! is refused only at `B` or within what the lower classes are owed, at most
//! `⌊B × LOWER_SHARE⌋ < B`, so it always keeps `⌈B × (1 − LOWER_SHARE)⌉ ≥ 1` slots. So
//! under sustained overload by the most important class a lower class that keeps
//! asking is cut to its guarantee, never to one request (the rule before the
//! guarantee did that: one slot per back-end, and on a slow back-end that one request
//! took longer than the clients waited, so the class was served not at all), and the
//! most important class to `B` minus the guarantees, never to none.
//!
//! Everything here is pure (no clock, no I/O): [`decide`] takes a [`View`] of the
//! back-end and answers; the control layer reads its counters and calls it, and the
//! seeded simulator below drives it against a simulated back-end.

/// Most classes a proxy may declare (the default class comes on top): a class is one
/// slot of a fixed array per back-end, and the data path compares the request's path
/// with each declared prefix, so the table stays a few cache lines long.
pub const CLASSES_MAX: usize = 8;
/// Longest path or prefix of a class, bytes (a request head line is at most
/// `http.max_header_bytes` anyway; a longer key is a mistake).
pub const CLASS_PATH_BYTES_MAX: usize = 256;
/// Longest class name (a metrics label value).
pub const CLASS_NAME_BYTES_MAX: usize = 32;
/// Priorities are within `±PRIORITY_ABS_MAX` (lower is more important): room for any
/// ordering of [`CLASSES_MAX`] classes, and a bound that catches a typo.
pub const PRIORITY_ABS_MAX: i32 = 100;
/// Gain of the cost's moving mean per completion: 1/8 as TCP's smoothed RTT, so the
/// estimate follows a change of cost within about 8 completions of the class (for a
/// costly class arriving a few times a second: a few seconds) and one outlier moves it
/// by an eighth.
pub const COST_GAIN: f64 = 0.125;
/// Completions of a class on a back-end before its cost counts: one odd first request
/// (a cold cache, a connection set-up) must not set a weight of 100.
pub const COST_WARM_SAMPLES: u32 = 4;
/// Smallest cost sample, µs: below the clock's and the relay's own resolution.
pub const COST_US_MIN: f64 = 1.0;
/// Largest cost sample, µs (300 s, the default `http.response_body_timeout_ms`: no
/// exchange lasts longer).
pub const COST_US_MAX: f64 = 300e6;
/// Largest weight: a class 10,000 times costlier than the cheapest is bounded to one
/// request in flight by any budget up to 10,000 already.
pub const WEIGHT_MAX: f64 = 10_000.0;
/// Share of a back-end's budget guaranteed to the lower-priority classes that want it,
/// between them (module doc): a quarter, the mirror of the reserve the most important
/// class keeps, so each side is sure of a quarter and the rest goes by priority.
/// Under overload by both, a class a hundred times costlier then gets a quarter of the
/// back-end's CPU, a few requests per second, instead of one slot per back-end.
pub const LOWER_SHARE: f64 = 0.25;
/// A lower-priority class wants its guarantee while it asked within this long (ns):
/// one second, many inter-arrival times of any class that matters (a class asking less
/// than once a second needs no more than the one request every class may keep in
/// flight), and short enough that slots reserved for a class that stopped asking go
/// back to the others within a second.
pub const DEMAND_WINDOW_NS: u64 = 1_000_000_000;
/// Share of a back-end's budget kept for the most important class (module doc): a
/// quarter, so a lower class is shed once the back-end is three quarters full and the
/// most important class still finds room at once; also the share the lower classes do
/// not get.
pub const PRIORITY_RESERVE_FRACTION: f64 = 0.25;

/// How a class recognises its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// The request target starts with these bytes (a query string included).
    Prefix(Vec<u8>),
    /// The request's path (the target up to `?`) is exactly this.
    Exact(Vec<u8>),
}

impl PathMatch {
    /// Whether `target` (the request line's target) matches, and how specifically
    /// (bytes matched; an exact match beats any prefix).
    fn matches(&self, target: &[u8]) -> Option<usize> {
        match self {
            PathMatch::Prefix(p) => target.starts_with(p).then_some(p.len()),
            PathMatch::Exact(p) => {
                let path = target
                    .iter()
                    .position(|&b| b == b'?')
                    .map_or(target, |q| &target[..q]);
                (path == p.as_slice()).then_some(usize::MAX)
            }
        }
    }
}

/// One declared class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassSpec {
    pub name: String,
    pub matcher: PathMatch,
    /// Lower is more important.
    pub priority: i32,
}

/// Name of the class of requests that match no declared class.
pub const DEFAULT_CLASS: &str = "default";
/// Priority of the default class.
pub const DEFAULT_PRIORITY: i32 = 0;

/// The declared classes, and the default one at index 0.
#[derive(Debug, Clone)]
pub struct ClassTable {
    /// Index 0 is the default class (its matcher is never consulted).
    specs: Vec<ClassSpec>,
    /// Per class: whether it is of the best (smallest) priority present.
    top: Vec<bool>,
}

impl ClassTable {
    /// The table of `declared` classes (at most [`CLASSES_MAX`]; the configuration
    /// checks that before), behind the default class.
    pub fn new(declared: &[ClassSpec]) -> ClassTable {
        let mut specs = vec![ClassSpec {
            name: DEFAULT_CLASS.into(),
            matcher: PathMatch::Prefix(Vec::new()),
            priority: DEFAULT_PRIORITY,
        }];
        specs.extend(declared.iter().take(CLASSES_MAX).cloned());
        let best = specs.iter().map(|s| s.priority).min().unwrap_or(0);
        let top = specs.iter().map(|s| s.priority == best).collect();
        ClassTable { specs, top }
    }

    /// Classes, the default one included.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Never: the default class is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The class of a request for `target` (its request line's target): the declared
    /// class that matches most specifically (exact path, then the longest prefix; the
    /// first declared on a tie), else the default class 0. No allocation: one pass over
    /// at most [`CLASSES_MAX`] byte comparisons.
    pub fn classify(&self, target: &[u8]) -> usize {
        let mut best = (0, 0);
        for (k, s) in self.specs.iter().enumerate().skip(1) {
            if let Some(n) = s.matcher.matches(target) {
                if best.0 == 0 || n > best.1 {
                    best = (k, n);
                }
            }
        }
        best.0
    }

    pub fn name(&self, k: usize) -> &str {
        &self.specs[k].name
    }

    /// Whether class `k` is of the most important priority declared.
    pub fn is_top(&self, k: usize) -> bool {
        self.top[k]
    }
}

/// A class's learned cost on one back-end.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cost {
    /// Moving mean of its requests' measured times, µs.
    pub us: f64,
    /// Completions seen (saturating).
    pub samples: u32,
}

impl Cost {
    /// Fold in one completion that took `sample_us`.
    pub fn observe(&mut self, sample_us: f64) {
        let s = if sample_us.is_finite() {
            sample_us.clamp(COST_US_MIN, COST_US_MAX)
        } else {
            COST_US_MAX
        };
        if self.samples == 0 {
            self.us = s;
        } else {
            self.us += COST_GAIN * (s - self.us);
        }
        self.samples = self.samples.saturating_add(1);
    }

    /// Whether enough completions were seen to trust it.
    pub fn warm(&self) -> bool {
        self.samples >= COST_WARM_SAMPLES
    }
}

/// The weight of a class of cost `c` when the cheapest trusted class on the back-end
/// costs `cheapest_us` (`None`: none trusted yet): 1 until both are known.
pub fn weight(c: Cost, cheapest_us: Option<f64>) -> f64 {
    match cheapest_us {
        Some(m) if c.warm() && m > 0.0 => (c.us / m).clamp(1.0, WEIGHT_MAX),
        _ => 1.0,
    }
}

/// The cheapest trusted cost among `costs`, µs.
pub fn cheapest_us(costs: impl IntoIterator<Item = Cost>) -> Option<f64> {
    costs
        .into_iter()
        .filter(Cost::warm)
        .map(|c| c.us)
        .min_by(f64::total_cmp)
}

/// Requests kept for the most important class out of a budget of `budget`.
pub fn reserve(budget: u64) -> u64 {
    let r = (budget as f64 * PRIORITY_RESERVE_FRACTION).ceil() as u64;
    // A budget of 1 keeps its one slot open to every class (liveness beats priority
    // when there is nothing to divide).
    r.min(budget.saturating_sub(1))
}

/// Slots guaranteed to each of `wanting` lower-priority classes that want them, out of a
/// budget of `budget` (0 when there is too little to divide: each class still keeps one
/// request in flight, see [`decide`]).
pub fn guarantee(budget: u64, wanting: usize) -> u64 {
    if wanting == 0 {
        return 0;
    }
    (budget as f64 * LOWER_SHARE / wanting as f64).floor() as u64
}

/// The most requests of a class of weight `weight` (top priority or not) in flight to a
/// back-end of budget `budget`, the class being guaranteed `guaranteed` slots.
pub fn bound(budget: u64, weight: f64, top: bool, guaranteed: u64) -> u64 {
    if top {
        return budget.max(1);
    }
    let share = 1.0 - PRIORITY_RESERVE_FRACTION;
    ((share * budget as f64 / weight.max(1.0)).floor() as u64)
        .max(guaranteed)
        .clamp(1, budget.max(1))
}

/// One class's state on a back-end, as [`view`] needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassNow {
    /// This proxy's requests of the class in flight to the back-end.
    pub inflight: u64,
    /// The class's weight there ([`weight`]).
    pub weight: f64,
    /// The class is of the most important priority.
    pub top: bool,
    /// The class asked within [`DEMAND_WINDOW_NS`].
    pub wanting: bool,
}

/// The [`View`] for a request of class `k` to a back-end of budget `budget` where this
/// proxy has `inflight` requests in flight and `classes` is every class's state there.
pub fn view(budget: u64, inflight: u64, k: usize, classes: &[ClassNow]) -> View {
    let budget = budget.max(1);
    let wanting = classes.iter().filter(|c| !c.top && c.wanting).count();
    let g = guarantee(budget, wanting);
    let owed = classes
        .iter()
        .enumerate()
        .filter(|&(j, c)| j != k && !c.top && c.wanting)
        .map(|(_, c)| g.saturating_sub(c.inflight))
        .sum();
    let c = classes[k];
    View {
        budget,
        inflight,
        class_inflight: c.inflight,
        weight: c.weight,
        top: c.top,
        guaranteed: if c.top { 0 } else { g },
        owed,
    }
}

/// What admission knows of one back-end and the request's class when it decides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    /// The back-end's budget of requests in flight (≥ 1 is used).
    pub budget: u64,
    /// This proxy's requests in flight to it, every class.
    pub inflight: u64,
    /// Of those, the request's class's.
    pub class_inflight: u64,
    /// The class's weight ([`weight`]).
    pub weight: f64,
    /// The class is of the most important priority.
    pub top: bool,
    /// Slots guaranteed to the class ([`guarantee`]; 0 for the most important class).
    pub guaranteed: u64,
    /// Slots the other wanting lower classes are still owed of their guarantees.
    pub owed: u64,
}

/// The answer of [`decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// The back-end's whole budget is in use.
    OverBudget,
    /// A lower-priority class past its guarantee and the back-end within the reserve of
    /// its budget, or any class and the rest of the budget owed to lower classes.
    Reserved,
    /// The class holds its bound of requests in flight.
    OverClassBound,
}

impl Verdict {
    pub const ALL: [Verdict; 4] = [
        Verdict::Admit,
        Verdict::OverBudget,
        Verdict::Reserved,
        Verdict::OverClassBound,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Verdict::Admit => "admitted",
            Verdict::OverBudget => "over_budget",
            Verdict::Reserved => "reserved",
            Verdict::OverClassBound => "over_class_bound",
        }
    }
}

/// May one more request of the class go to the back-end (module doc)?
pub fn decide(v: View) -> Verdict {
    let budget = v.budget.max(1);
    if v.inflight >= budget {
        return Verdict::OverBudget;
    }
    // A lower class below its guarantee (and every class with nothing in flight) is
    // held back by neither the reserve nor the others' guarantees (liveness, module doc).
    if !v.top && v.class_inflight < v.guaranteed.max(1) {
        return Verdict::Admit;
    }
    if v.inflight + v.owed >= budget {
        return Verdict::Reserved;
    }
    if !v.top && v.inflight >= budget - reserve(budget) {
        return Verdict::Reserved;
    }
    if v.class_inflight >= bound(budget, v.weight, v.top, v.guaranteed) {
        return Verdict::OverClassBound;
    }
    Verdict::Admit
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> ClassTable {
        ClassTable::new(&[
            ClassSpec {
                name: "costly".into(),
                matcher: PathMatch::Prefix(b"/cgi/".to_vec()),
                priority: 1,
            },
            ClassSpec {
                name: "work".into(),
                matcher: PathMatch::Prefix(b"/cgi/work".to_vec()),
                priority: 2,
            },
            ClassSpec {
                name: "health".into(),
                matcher: PathMatch::Exact(b"/health".to_vec()),
                priority: -1,
            },
        ])
    }

    #[test]
    fn classify_takes_the_most_specific_match_else_the_default() {
        let t = table();
        assert_eq!(t.classify(b"/index.html"), 0);
        assert_eq!(t.classify(b"/cgi/other"), 1);
        assert_eq!(t.classify(b"/cgi/work?us=150000"), 2, "longer prefix wins");
        assert_eq!(t.classify(b"/health?x=1"), 3, "exact path, query ignored");
        assert_eq!(t.classify(b"/healthz"), 0, "exact is not a prefix");
        assert_eq!(t.name(0), DEFAULT_CLASS);
        assert!(t.is_top(3) && !t.is_top(0) && !t.is_top(1));
    }

    #[test]
    fn cost_is_a_bounded_moving_mean_trusted_after_a_few_samples() {
        let mut c = Cost::default();
        for _ in 0..COST_WARM_SAMPLES - 1 {
            c.observe(1000.0);
        }
        assert!(!c.warm());
        assert_eq!(weight(c, Some(10.0)), 1.0, "untrusted: weight 1");
        c.observe(1000.0);
        assert!(c.warm());
        assert_eq!(weight(c, Some(10.0)), 100.0);
        c.observe(9000.0);
        assert_eq!(c.us, 1000.0 + COST_GAIN * 8000.0);
        c.observe(f64::INFINITY);
        assert!(c.us <= COST_US_MAX);
        let mut z = Cost::default();
        z.observe(0.0);
        assert_eq!(z.us, COST_US_MIN);
        assert_eq!(weight(c, Some(1e-9)), WEIGHT_MAX.min(c.us / 1e-9));
    }

    #[test]
    fn bounds_keep_costly_classes_small_and_every_class_live() {
        // Budget 28: a 100x class is bounded by its guarantee (7 of 28 with one lower
        // class wanting); the cheap top class gets all 28.
        assert_eq!(guarantee(28, 1), 7);
        assert_eq!(guarantee(28, 2), 3);
        assert_eq!(guarantee(28, 0), 0);
        assert_eq!(guarantee(3, 1), 0, "too little to divide");
        assert_eq!(bound(28, 100.0, false, 0), 1);
        assert_eq!(bound(28, 100.0, false, 7), 7);
        assert_eq!(bound(28, 1.0, true, 0), 28);
        assert_eq!(bound(28, 1.0, false, 7), 21);
        assert_eq!(bound(28, 4.0, false, 0), 5);
        assert_eq!(bound(28, 4.0, false, 7), 7);
        assert_eq!(bound(0, 1e9, false, 0), 1);
        assert_eq!(reserve(28), 7);
        assert_eq!(reserve(1), 0, "a budget of one is open to all");
        let v = View {
            budget: 28,
            inflight: 20,
            class_inflight: 0,
            weight: 100.0,
            top: false,
            guaranteed: 0,
            owed: 0,
        };
        assert_eq!(decide(v), Verdict::Admit);
        assert_eq!(
            decide(View {
                class_inflight: 1,
                ..v
            }),
            Verdict::OverClassBound
        );
        assert_eq!(
            decide(View { inflight: 21, ..v }),
            Verdict::Admit,
            "one of each class passes the reserve"
        );
        assert_eq!(
            decide(View {
                inflight: 21,
                class_inflight: 1,
                weight: 1.0,
                ..v
            }),
            Verdict::Reserved
        );
        assert_eq!(
            decide(View {
                inflight: 21,
                top: true,
                weight: 1.0,
                ..v
            }),
            Verdict::Admit
        );
        assert_eq!(decide(View { inflight: 28, ..v }), Verdict::OverBudget);
        // A guaranteed class is admitted up to its guarantee whatever the reserve, and
        // the others leave room for what it is owed.
        let g = View {
            inflight: 26,
            class_inflight: 6,
            guaranteed: 7,
            ..v
        };
        assert_eq!(decide(g), Verdict::Admit, "below its guarantee");
        assert_eq!(
            decide(View {
                class_inflight: 7,
                ..g
            }),
            Verdict::Reserved,
            "at its guarantee, within the reserve"
        );
        let top = View {
            inflight: 22,
            class_inflight: 22,
            weight: 1.0,
            top: true,
            guaranteed: 0,
            owed: 6,
            ..v
        };
        assert_eq!(decide(top), Verdict::Reserved, "6 slots owed");
        assert_eq!(
            decide(View {
                inflight: 21,
                ..top
            }),
            Verdict::Admit
        );
        // Liveness: nothing in flight is always admitted, whatever the class and
        // whatever the others are owed (at most the lower share of the budget).
        for top in [false, true] {
            for budget in [0, 1, 2, 3, 4, 28] {
                let b = budget.max(1);
                let v = View {
                    budget,
                    inflight: 0,
                    class_inflight: 0,
                    weight: WEIGHT_MAX,
                    top,
                    guaranteed: if top { 0 } else { guarantee(b, 2) },
                    owed: guarantee(b, 2) * 2,
                };
                assert_eq!(decide(v), Verdict::Admit, "{v:?}");
            }
        }
    }

    #[test]
    fn view_owes_only_wanting_lower_classes_their_missing_slots() {
        let c = |inflight, top, wanting| ClassNow {
            inflight,
            weight: 1.0,
            top,
            wanting,
        };
        let classes = [c(20, true, false), c(2, false, true), c(0, false, false)];
        let v = view(28, 22, 0, &classes);
        assert_eq!(
            (v.guaranteed, v.owed),
            (0, 5),
            "one lower class wanting: 7 - 2"
        );
        let v = view(28, 22, 1, &classes);
        assert_eq!(
            (v.guaranteed, v.owed),
            (7, 0),
            "its own slots are not owed to others"
        );
        let classes = [c(20, true, false), c(2, false, true), c(9, false, true)];
        let v = view(28, 31, 0, &classes);
        assert_eq!(
            (v.guaranteed, v.owed),
            (0, 1),
            "3 each; the second holds more"
        );
    }

    // ---- The seeded simulator: two classes against a simulated back-end. ----

    /// The policy a simulated proxy runs.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Policy {
        /// Class-blind: admit while fewer than the budget are in flight.
        Blind,
        /// This module's rule with costs learned from the simulated completions.
        Classes,
        /// The same without the lower classes' guarantee (the rule before it: a lower
        /// class past one request in flight is shed at the reserve, and a costly one is
        /// bounded to `⌊share × B / weight⌋`, i.e. one).
        OneSlot,
    }

    /// One request at the simulated back-end.
    struct Job {
        class: usize,
        arrived_us: u64,
        /// CPU work left, µs.
        left_us: f64,
        /// CPU work in all, µs.
        work_us: f64,
    }

    /// What one simulated run measured.
    #[derive(Debug)]
    struct Outcome {
        /// Per class: completions, refusals, p99 latency µs, most in flight at once once
        /// the class's cost was trusted (before, its weight is 1).
        done: [u64; 2],
        refused: [u64; 2],
        p99_us: [u64; 2],
        inflight_max: [u64; 2],
        /// Completions per second, both classes.
        goodput: f64,
        learned: [Cost; 2],
        /// Per class: share of the back-end's CPU its completed requests used.
        cpu_share: [f64; 2],
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            // xorshift64*, mapped to (0, 1].
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
            (x as f64 + 1.0) / (1u64 << 53) as f64
        }
        fn exp(&mut self, mean: f64) -> f64 {
            -mean * self.next().ln()
        }
    }

    fn p99(v: &mut [u64]) -> u64 {
        if v.is_empty() {
            return 0;
        }
        v.sort_unstable();
        v[(v.len() * 99 / 100).min(v.len() - 1)]
    }

    /// A back-end of `workers` workers sharing `cpus` CPUs (processor sharing among the
    /// running requests, as a prefork server's processes on a CPU), a FIFO accept queue
    /// in front; Poisson arrivals at `rate` per second, a `costly_share` of them of
    /// class 1 costing `factor` times class 0's `cost_us` (exponentially distributed);
    /// the proxy admits or refuses each with `policy` and budget `budget`. Time steps of
    /// `STEP_US`, `secs` simulated seconds, seeded.
    #[allow(clippy::too_many_arguments)]
    fn simulate(
        policy: Policy,
        seed: u64,
        secs: u64,
        rate: f64,
        costly_share: f64,
        cost_us: f64,
        factor: f64,
        workers: usize,
        cpus: f64,
        budget: u64,
    ) -> Outcome {
        const STEP_US: u64 = 50;
        let mut rng = Rng(seed | 1);
        let t = ClassTable::new(&[ClassSpec {
            name: "costly".into(),
            matcher: PathMatch::Prefix(b"/cgi/".to_vec()),
            priority: 1,
        }]);
        let mut running: Vec<Job> = Vec::new();
        let mut queue: std::collections::VecDeque<Job> = Default::default();
        let mut next_arrival = rng.exp(1e6 / rate);
        let mut inflight = [0u64; 2];
        let mut costs = [Cost::default(); 2];
        let mut asked_us: [Option<u64>; 2] = [None; 2];
        let mut lat: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        let mut out = Outcome {
            done: [0; 2],
            refused: [0; 2],
            p99_us: [0; 2],
            inflight_max: [0; 2],
            goodput: 0.0,
            learned: [Cost::default(); 2],
            cpu_share: [0.0; 2],
        };
        let mut cpu_us = [0.0f64; 2];
        let end_us = secs * 1_000_000;
        let mut now = 0u64;
        while now < end_us {
            // Arrivals of this step.
            while next_arrival < (now + STEP_US) as f64 {
                let costly = rng.next() < costly_share;
                let target: &[u8] = if costly { b"/cgi/work" } else { b"/a.html" };
                let class = t.classify(target);
                let total = inflight[0] + inflight[1];
                let admit = match policy {
                    Policy::Blind => total < budget,
                    Policy::Classes | Policy::OneSlot => {
                        asked_us[class] = Some(now);
                        let m = cheapest_us(costs);
                        let now_of = |k: usize| ClassNow {
                            inflight: inflight[k],
                            weight: weight(costs[k], m),
                            top: t.is_top(k),
                            wanting: asked_us[k]
                                .is_some_and(|a| (now - a) * 1000 < DEMAND_WINDOW_NS),
                        };
                        let mut v = view(budget, total, class, &[now_of(0), now_of(1)]);
                        if policy == Policy::OneSlot {
                            // The rule before the guarantee: none, and nothing owed.
                            v.guaranteed = 0;
                            v.owed = 0;
                        }
                        decide(v) == Verdict::Admit
                    }
                };
                if admit {
                    inflight[class] += 1;
                    if costs[class].warm() {
                        out.inflight_max[class] = out.inflight_max[class].max(inflight[class]);
                    }
                    let mean = if costly { cost_us * factor } else { cost_us };
                    let work = rng.exp(mean);
                    queue.push_back(Job {
                        class,
                        arrived_us: now,
                        left_us: work,
                        work_us: work,
                    });
                } else {
                    out.refused[class] += 1;
                }
                next_arrival += rng.exp(1e6 / rate);
            }
            while running.len() < workers {
                let Some(j) = queue.pop_front() else { break };
                running.push(j);
            }
            // Processor sharing: each running request gets min(1, cpus / running) of a CPU.
            if !running.is_empty() {
                let speed = (cpus / running.len() as f64).min(1.0);
                for j in &mut running {
                    j.left_us -= speed * STEP_US as f64;
                }
            }
            now += STEP_US;
            let mut k = 0;
            while k < running.len() {
                if running[k].left_us <= 0.0 {
                    let j = running.swap_remove(k);
                    let took = now - j.arrived_us;
                    inflight[j.class] -= 1;
                    costs[j.class].observe(took as f64);
                    out.done[j.class] += 1;
                    cpu_us[j.class] += j.work_us;
                    lat[j.class].push(took);
                } else {
                    k += 1;
                }
            }
        }
        for (p, l) in out.p99_us.iter_mut().zip(&mut lat) {
            *p = p99(l);
        }
        out.goodput = (out.done[0] + out.done[1]) as f64 / secs as f64;
        out.learned = costs;
        for (s, c) in out.cpu_share.iter_mut().zip(cpu_us) {
            *s = c / (secs as f64 * 1e6 * cpus);
        }
        out
    }

    /// `mixed-cost` in the simulator: 1 arrival in 100 costs 100x (half the CPU), offered
    /// at 1.5x the back-end's capacity, 16 workers on one CPU, budget 28 (the lab's
    /// C + L_Q). Class-blind, the costly requests come to hold about half the slots and
    /// the cheap class's p99 is many times its cost; with classes, the costly class runs
    /// at most its bound (its guarantee) at once, the cheap class's p99 stays within a
    /// few budgets' worth of its cost and below class-blind's, and goodput does not
    /// fall.
    #[test]
    fn sim_cheap_class_p99_is_bounded_and_costly_concurrency_too() {
        let cost_us = 1000.0;
        // Capacity: one CPU / mean cost (0.99 + 0.01 x 100 = 1.99 ms) = 502/s.
        let rate = 1.5 * 1e6 / (cost_us * 1.99);
        let budget = 28;
        for seed in [1, 2, 3] {
            let run = |p| simulate(p, seed, 30, rate, 0.01, cost_us, 100.0, 16, 1.0, budget);
            let blind = run(Policy::Blind);
            let classes = run(Policy::Classes);
            // The costly class's cost was learned near its 100x.
            let w = weight(classes.learned[1], cheapest_us(classes.learned));
            assert!(w > 20.0, "learned weight {w}: {classes:?}");
            // Once its cost is trusted, the costly class runs at most its bound at once:
            // its guarantee, 7 of 28; class-blind, many more.
            assert!(
                classes.inflight_max[1] <= guarantee(budget, 1),
                "{classes:?}"
            );
            assert!(
                blind.inflight_max[1] > guarantee(budget, 1),
                "class-blind lets many in: {blind:?}"
            );
            // The cheap class's p99: class-blind it queues behind the costly requests'
            // slots (half the workers); with classes it is bounded by the budget's worth
            // of requests sharing the CPU (28 x 1 ms, and the tail of the exponential
            // costs), and below class-blind's: the costly class holds its guarantee, a
            // quarter of the budget, not half.
            let bound_us = 4 * budget * cost_us as u64;
            assert!(
                classes.p99_us[0] <= bound_us,
                "cheap p99 {} µs > {bound_us}: {classes:?}",
                classes.p99_us[0]
            );
            assert!(
                classes.p99_us[0] < blind.p99_us[0],
                "cheap p99 classes {} vs blind {}",
                classes.p99_us[0],
                blind.p99_us[0]
            );
            assert!(
                classes.goodput >= blind.goodput,
                "goodput classes {} < blind {}",
                classes.goodput,
                blind.goodput
            );
            // Every class is served (no class is shut out under this load).
            assert!(classes.done[1] > 0 && classes.done[0] > 0);
        }
    }

    /// Both classes overload the back-end on their own (the cheap one at 1.5x its
    /// capacity, the costly one asking 1.5 CPUs' worth), budget = the workers (as the
    /// delay budget settles when the delay target is short): the costly class gets its
    /// guarantee's share of the CPU, a quarter, and the cheap class the rest. The rule
    /// without the guarantee held the costly class to one request in flight, a
    /// sixteenth of the CPU (and on a back-end a tenth as fast, one request that took
    /// longer than the clients waited: served not at all).
    #[test]
    fn sim_every_class_gets_its_share_under_overload() {
        let cost_us = 1000.0;
        let (workers, budget) = (16, 16);
        let rate = 1.5 * 1e6 / cost_us / 0.99;
        let share = guarantee(budget, 1) as f64 / budget as f64;
        for seed in [1, 2, 3] {
            let run = |p| {
                simulate(
                    p, seed, 30, rate, 0.01, cost_us, 100.0, workers, 1.0, budget,
                )
            };
            let fair = run(Policy::Classes);
            let one = run(Policy::OneSlot);
            assert!(fair.done[0] > 0 && fair.done[1] > 0, "{fair:?}");
            assert!(
                fair.cpu_share[1] >= 0.8 * share,
                "costly class got {:.3} of the CPU, its share is {share}: {fair:?}",
                fair.cpu_share[1]
            );
            assert!(
                fair.cpu_share[0] >= 0.6,
                "the cheap class keeps the rest: {fair:?}"
            );
            assert!(
                one.cpu_share[1] < 0.5 * share,
                "without the guarantee the costly class is held to one slot: {one:?}"
            );
        }
    }

    /// Under load the costly class cannot reach, nothing is refused by the class rule:
    /// at a tenth of capacity both policies serve everything.
    #[test]
    fn sim_light_load_refuses_nothing() {
        let cost_us = 1000.0;
        let rate = 0.1 * 1e6 / (cost_us * 1.99);
        let c = simulate(
            Policy::Classes,
            7,
            20,
            rate,
            0.01,
            cost_us,
            100.0,
            16,
            1.0,
            28,
        );
        // The costly class runs one at a time under classes (its bound); at this load a
        // second costly arrival within one's service time (~150 ms at 1/10 load) is rare,
        // so almost nothing is refused.
        let offered = c.done[0] + c.done[1] + c.refused[0] + c.refused[1];
        assert_eq!(c.refused[0], 0, "{c:?}");
        assert!((c.refused[1] as f64) < 0.01 * offered as f64, "{c:?}");
    }
}
