//! How `lab admission` sizes its tier: the operator's one objective and the limits it
//! sets, the back-ends' CPU quota, the capacity of the tier (ruled from the request
//! cost, or measured by a calibration run for nginx), and the privileged settings it
//! asks for.

use super::*;

/// The bounds every system gets from `--queue-ms` ([`LIMIT_RULE`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Objective {
    /// `--queue-ms`: the longest a request should wait before a back-end starts on it.
    pub queue_ms: u64,
    /// L_Q: the accept-queue length one back-end drains within `queue_ms`.
    pub queue_len: u64,
    /// The delay target onesided-delay's proxy runs with: not passed, the proxy's own
    /// default rule on its queue timeout Q (`farside_proxy::config::target_delay_rule`,
    /// max(1, Q/2)), recorded here for the report.
    pub target_delay_ms: u64,
}

impl Objective {
    /// The objective of `a`: `rate_b` is one back-end's service rate (requests/s), `None`
    /// without a capacity rule. Returns it with its derivation as text.
    pub fn derive(a: &AdmissionArgs, rate_b: Option<f64>) -> (Objective, String) {
        let c = capacity_conns(a);
        let q = a.queue_ms;
        let (queue_len, how) = match rate_b {
            Some(r) => {
                let l = ((q as f64 / 1000.0 * r).floor() as u64).max(1);
                (
                    l,
                    format!("L_Q = max(1, floor({q} ms x {r:.1} req/s per back-end)) = {l}"),
                )
            }
            None => (c, format!("L_Q = C = {c} (no capacity rule)")),
        };
        let target = (q / 2).clamp(1, QUEUE_MS_MAX);
        let o = Objective {
            queue_ms: q,
            queue_len,
            target_delay_ms: target,
        };
        let rule = format!(
            "Q = --queue-ms {q}; {how}; haproxy: maxconn {c}, timeout queue {q} ms; farside \
             proxies: --queue-timeout-ms {q}; onesided-delay: --admission alone, the proxy's \
             defaults: metric delay, target max(1, Q/2) = {target} ms by its rule on the \
             queue timeout, budget cap http.max_client_conns"
        );
        (o, rule)
    }
}

/// Body bytes of the request the open-loop capacity rule prices: the single trace's 16 KiB
/// object, the paper's reference request.
pub const CAPACITY_REFERENCE_BYTES: u64 = 16_384;

/// The mean CPU cost of a request of `scenario` at the reference object
/// ([`CAPACITY_REFERENCE_BYTES`]), µs: what the capacity rule divides by.
pub fn reference_cost_us(a: &AdmissionArgs, scenario: Scenario) -> f64 {
    crate::scenario::mean_cost_us(scenario, a.backend_cpu_us)
        + a.backend_cpu_ns_per_byte * CAPACITY_REFERENCE_BYTES as f64 / 1000.0
}

/// Share of one CPU the whole back-end tier gets by default with nginx in `--hosts
/// netns`, percent ([`LIMIT_RULE`]): the proxy and the clients share the first CPU and
/// each does at least a static server's work per request, so a tier of a fifth of a CPU
/// stays below what the front end can drive, with room for the proxy's extra copies.
pub const NGINX_TIER_CPU_PCT: u32 = 20;

/// Largest `--backend-cpu-quota-pct`: ten CPUs per node, more than any host this lab runs
/// on has (a larger value is a typo, not a limit).
pub const BACKEND_CPU_QUOTA_PCT_MAX: u32 = 1000;

/// The CPU quota of every back-end node ([`backend_quota`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BackendQuota {
    /// Percent of one CPU per node.
    pub pct: u32,
    /// CFS quota per period, µs.
    pub quota_us: u64,
    /// CFS period, µs ([`crate::fabric::netns::CPU_PERIOD_US`] unless the quota needs longer).
    pub period_us: u64,
    /// What the node's cgroup holds.
    pub covers: String,
    /// How `pct` was chosen.
    pub rule: String,
}

/// The back-end nodes' CPU quota: `--backend-cpu-quota-pct`, else with nginx in
/// `--hosts netns` the default of [`LIMIT_RULE`], else none. Errors: a quota outside
/// 1..=[`BACKEND_CPU_QUOTA_PCT_MAX`], or asked for without `--hosts netns` (loopback has
/// no per-node cgroup: the run would be silently unlimited).
pub fn backend_quota(a: &AdmissionArgs) -> io::Result<Option<BackendQuota>> {
    let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
    let (pct, rule) = match a.backend_cpu_quota_pct {
        Some(p) => {
            if p == 0 || p > BACKEND_CPU_QUOTA_PCT_MAX {
                return bad(format!(
                    "--backend-cpu-quota-pct {p}: must be 1..={BACKEND_CPU_QUOTA_PCT_MAX} (percent of one \
                    CPU per back-end node)"
                ));
            }
            if a.hosts != Hosts::Netns {
                return bad(format!(
                    "--backend-cpu-quota-pct {p}: needs --hosts netns (a per-node cgroup); loopback has \
                    none, so the quota could not be applied"
                ));
            }
            (p, format!("--backend-cpu-quota-pct {p}"))
        }
        None if a.hosts == Hosts::Netns && a.backend_server == BackendServer::Nginx => {
            let p = (NGINX_TIER_CPU_PCT / a.backends.max(1) as u32).max(1);
            (
                p,
                format!(
                    "default for nginx: max(1, floor({NGINX_TIER_CPU_PCT} / {} backends)) = {p} % of one CPU \
                    per node (the tier a fifth of a CPU, below what the proxy and clients on the first CPU \
                    can drive)",
                    a.backends
                ),
            )
        }
        None => return Ok(None),
    };
    let (quota_us, period_us) = crate::fabric::netns::cpu_quota_period(pct);
    Ok(Some(BackendQuota {
        pct,
        quota_us,
        period_us,
        covers: "the back-end node's cgroup: the web server and its gatherer".into(),
        rule,
    }))
}

/// Measured seconds of the calibration run that prices an nginx tier: the tier saturates
/// within ms, and 2 s of 16 KiB requests is thousands of them.
pub const CALIBRATION_S: f64 = 2.0;

/// Warm-up of the calibration run, not measured: connections open, page cache warm.
pub const CALIBRATION_WARMUP_S: f64 = 0.5;

/// Calibration clients per back-end: well above an event-driven nginx's saturation (a
/// few connections keep its worker busy) and far below its 1024 connections.
pub const CALIBRATION_CLIENTS_PER_BACKEND: usize = 32;

/// One back-end node during the calibration run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeCalibration {
    /// `b0`, `b1`, ...
    pub node: String,
    /// The node cgroup's quota as the kernel had it and its throttling during the run
    /// (warm-up included, as the CPU times below).
    pub cpu: crate::fabric::netns::CpuStat,
    /// CPU seconds the web server's processes used during the run.
    pub web_cpu_s: f64,
    /// CPU seconds the gatherer used during the run (inside the same quota).
    pub gatherd_cpu_s: f64,
}

/// The calibration run of an nginx tier ([`LIMIT_RULE`]): `params.calibration`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Calibration {
    /// Requests/s the tier served: the capacity the open loop's `--rates` multiply.
    pub capacity_rps: f64,
    /// The rule as text (`params.capacity_rule`).
    pub rule: String,
    /// Measured seconds.
    pub duration_s: f64,
    /// Warm-up seconds.
    pub warmup_s: f64,
    /// Closed-loop clients in all.
    pub clients: usize,
    /// Body bytes of the object asked for.
    pub object_bytes: u64,
    /// Mean and p99 response time during the run, ms.
    pub avg_ms: f64,
    pub p99_ms: f64,
    /// Per back-end node (netns only).
    pub nodes: Vec<NodeCalibration>,
}

impl Calibration {
    /// Warnings for nodes under a quota that was never hit: then something other than
    /// the quota (the clients' CPU) bounded the tier.
    pub fn warnings(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| !n.cpu.cpu_max.starts_with("max") && n.cpu.nr_throttled == 0)
            .map(|n| {
                format!(
                    "calibration: node {} was never throttled by its CPU quota ({}): the calibrated capacity \
                    may be the clients' limit, not nginx's",
                    n.node, n.cpu.cpu_max
                )
            })
            .collect()
    }
}

/// The back-end's connection capacity C of [`LIMIT_RULE`].
pub fn capacity_conns(a: &AdmissionArgs) -> u64 {
    match a.backend_server {
        BackendServer::Farside => a.backend_workers as u64,
        BackendServer::Nginx => {
            let c = NginxConfig::new(SocketAddr::new(LOCALHOST, 0), "/");
            u64::from(c.worker_processes) * u64::from(c.worker_connections)
        }
    }
}

/// The default limit of [`LIMIT_RULE`] for `metric`, capacity `c` and the queue `L_Q`
/// that drains within `--queue-ms` (`queue_len`), with the rule as text; an error for
/// metrics the rule does not cover.
pub fn default_limit(metric: &str, c: u64, queue_len: u64) -> io::Result<(u64, String)> {
    match metric {
        "backlog" | "pending" => Ok((queue_len, format!("{metric}: limit = L_Q = {queue_len}"))),
        "conns" => Ok((
            c + queue_len,
            format!(
                "conns: limit = C + L_Q = {c} + {queue_len} = {}",
                c + queue_len
            ),
        )),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "--metric {metric}: no default limit (it is not a connection count, so the \
                 capacity rule does not apply); give --limit N or --limits a,b,c"
            ),
        )),
    }
}

/// The open-loop capacity of [`LIMIT_RULE`] in requests/s, with the rule as text:
/// `--capacity-rps`, else the calibrated value and its rule (`calibrated`, nginx), else
/// back-end CPUs (`back_cpus`, at most the quota's) over the mean CPU cost of a request
/// (`cost_us`).
pub fn capacity_rps(
    a: &AdmissionArgs,
    back_cpus: usize,
    cost_us: f64,
    calibrated: Option<&(f64, String)>,
) -> io::Result<(f64, String)> {
    if let Some(r) = a.capacity_rps {
        if !(r.is_finite() && r > 0.0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--capacity-rps {r}: must be a positive number of requests/s"),
            ));
        }
        return Ok((r, format!("--capacity-rps {r}")));
    }
    if let Some((r, rule)) = calibrated {
        return Ok((*r, rule.clone()));
    }
    if a.backend_server == BackendServer::Nginx {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "open loop with --backend-server nginx: the lab does not set nginx's cost per \
             request and no calibration ran; give --capacity-rps R (or --load closed)",
        ));
    }
    if cost_us <= 0.0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "open loop with --backend-cpu-us 0: requests cost no CPU, so there is no capacity \
             rule; give --capacity-rps R (or --load closed)",
        ));
    }
    let cpus = back_cpus.min(a.backends * a.backend_workers).max(1);
    if let Some(q) = backend_quota(a)? {
        let quota_cpus = a.backends as f64 * f64::from(q.pct) / 100.0;
        let c = (cpus as f64).min(quota_cpus);
        let r = c * 1e6 / cost_us;
        return Ok((
            r,
            format!(
                "capacity_rps = min({back_cpus} CPUs, {} workers, {} backends x {} % quota) x \
                 1e6 / {cost_us} us = {r:.0}",
                a.backends * a.backend_workers,
                a.backends,
                q.pct
            ),
        ));
    }
    let r = cpus as f64 * 1e6 / cost_us;
    Ok((
        r,
        format!(
            "capacity_rps = min({back_cpus} CPUs, {} workers) x 1e6 / {cost_us} us = {r:.0}",
            a.backends * a.backend_workers
        ),
    ))
}

/// The lowest nice an unprivileged thread may set: `20 - RLIMIT_NICE` (0 by default).
pub fn nice_floor() -> i32 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut r) } != 0 {
        return 0;
    }
    (20 - r.rlim_cur.min(40) as i32).min(0)
}

/// Whether `--control-nice` takes effect: a negative nice needs root, or an
/// `RLIMIT_NICE` that allows it (`floor` from [`nice_floor`]).
pub fn control_nice_setting(requested: i32, is_root: bool, floor: i32) -> Setting {
    if requested >= 0 || is_root || requested >= floor {
        Setting::applied(requested)
    } else {
        Setting::not_applied(
            requested,
            &format!(
                "nice {requested} needs root or CAP_SYS_NICE (RLIMIT_NICE allows down to {floor}); \
                 the gatherers' samplers and the proxy's monitor run at nice 0"
            ),
        )
    }
}

/// The settings of this run that need privileges or a particular host, as asked for and
/// as they will be applied (`is_root` is a parameter so the unprivileged branch is
/// testable as root).
pub fn privileged_settings(
    a: &AdmissionArgs,
    is_root: bool,
    nice_floor: i32,
    cpus: usize,
) -> BTreeMap<String, Setting> {
    let mut m = BTreeMap::new();
    m.insert(
        "control_nice".into(),
        control_nice_setting(a.control_nice, is_root, nice_floor),
    );
    let netns = a.hosts == Hosts::Netns;
    if a.background_load > 0 {
        m.insert(
            "background_load".into(),
            if netns {
                Setting::applied(a.background_load)
            } else {
                Setting::not_applied(
                    a.background_load,
                    "busy processes run in the back-end nodes' cgroups: --hosts netns only",
                )
            },
        );
    }
    if netns {
        m.insert(
            "cgroups".into(),
            match backend_quota(a).ok().flatten() {
                Some(q) => Setting::applied(format!(
                    "per-node cgroup with a cpuset; back-end nodes (web server and gatherer) \
                     in a CPU quota of {} % of one CPU ({} us every {} us)",
                    q.pct, q.quota_us, q.period_us
                )),
                None => Setting::applied("per-node cgroup with a cpuset (no CPU quota: the back-ends' cost per request and their CPUs set their capacity)"),
            },
        );
        m.insert(
            "rps".into(),
            Setting::applied("receive softirq on each node's CPUs"),
        );
    }
    if a.scenario.contains(&Scenario::TenantLoad) {
        m.insert(
            "tenant_load".into(),
            Setting {
                requested: serde_json::json!(a.tenant_procs),
                applied: true,
                reason: Some(format!(
                    "{} busy process(es) per back-end node ({}), each running and paused \
                     (SIGSTOP/SIGCONT) for exponential times of mean a tenth of the point",
                    a.tenant_procs,
                    if netns {
                        "in the node's cgroup"
                    } else {
                        "on the back-end CPUs"
                    }
                )),
            },
        );
    }
    if a.scenario.contains(&Scenario::CapacityChange) {
        m.insert(
            "capacity_change".into(),
            Setting {
                requested: "b0 at half capacity in the middle third of each point".into(),
                applied: true,
                reason: Some(format!(
                    "SIGSTOP/SIGCONT duty cycle of b0's web server: runs {}% of every {} ms \
                     (no cgroup CPU quota is used, on loopback or netns)",
                    (crate::scenario::DUTY_RUN_FRACTION * 100.0) as u32,
                    crate::scenario::DUTY_PERIOD.as_millis()
                )),
            },
        );
        // The capacity change is a CPU quota that halves; the lab emulates it
        // with the duty cycle above on both hosts, so the quota itself is recorded as
        // not applied (the back-ends share their CPUs, so a quota would have to halve a
        // share that other nodes' load moves: the duty cycle halves it whatever it is).
        m.insert(
            "capacity_change_cpu_quota".into(),
            Setting::not_applied(
                "b0's cgroup CPU quota halved",
                "no cgroup CPU quota is changed (loopback has no per-node cgroup; in netns \
                 the back-ends share a cpuset, so their share is not a fixed quota): the \
                 halving is the SIGSTOP/SIGCONT duty cycle of settings.capacity_change",
            ),
        );
    }
    if !a.no_pin {
        m.insert(
            "pin".into(),
            if cpus >= 2 {
                Setting::applied("proxy and clients on the first CPU, back-ends on the rest")
            } else {
                Setting::not_applied(true, "one CPU: the tiers share it")
            },
        );
    }
    m
}

/// The calibration run of [`LIMIT_RULE`]: a no-ac tier (back-ends and gatherers as in the
/// sweep, inside their quota), [`CALIBRATION_CLIENTS_PER_BACKEND`] closed-loop clients per
/// back-end sent straight to it (no proxy, no admission) for [`CALIBRATION_S`] after
/// [`CALIBRATION_WARMUP_S`], asking the single trace's 16 KiB object. The capacity is the
/// requests/s served; per node it records the quota's throttling and the CPU time of the
/// web server and of the gatherer.
pub(super) fn calibrate(
    a: &AdmissionArgs,
    run: &Run,
    fabric: &Fabric,
    front: Option<&[usize]>,
) -> io::Result<Calibration> {
    let tier = start_tier(a, run, Scenario::Single, "no-ac", None, fabric)?;
    let nodes: Vec<String> = (0..a.backends).map(|i| format!("b{i}")).collect();
    let gatherd_pids: Vec<u32> = tier._gatherers.iter().map(|g| g.pid()).collect();
    type Snap = Vec<(
        crate::fabric::netns::CpuStat,
        Vec<crate::fabric::netns::ProcCpu>,
    )>;
    let snap = || -> io::Result<Snap> {
        match fabric {
            Fabric::Netns(dc) => nodes
                .iter()
                .map(|n| Ok((dc.cpu_stat(n)?, dc.node_procs_cpu(n)?)))
                .collect(),
            Fabric::Loopback(_) => Ok(Vec::new()),
        }
    };
    let mut ls = Vec::new();
    for (i, addr) in tier.backend_addrs.iter().enumerate() {
        let mut l = loadgen_args(
            a,
            *addr,
            "single",
            CALIBRATION_CLIENTS_PER_BACKEND as u64,
            CALIBRATION_S,
            CALIBRATION_WARMUP_S,
        )?;
        // Saturation: no think time, whatever the sweep's.
        l.think_ms = 0;
        l.seed = a
            .seed
            .wrapping_add(GROUP_SEED_STRIDE.wrapping_mul(i as u64));
        ls.push(l);
    }
    let before = snap()?;
    let parts = std::thread::scope(|sc| {
        let handles: Vec<_> = ls
            .iter()
            .map(|l| sc.spawn(|| fabric.run_clients(l, front)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("a calibration client panicked")))
            })
            .collect::<io::Result<Vec<_>>>()
    })?;
    let after = snap()?;
    drop(tier);
    let s = crate::scenario::merge_concurrent(&parts)?;
    let capacity: f64 = parts.iter().map(|p| p.goodput_rps).sum();
    if capacity.is_nan() || capacity <= 0.0 {
        return Err(crate::error::LabError::NotReady(format!(
            "calibration: the back-end tier served nothing in {CALIBRATION_S} s ({} failures); see \
            the logs in {}",
            s.failures,
            run.logs.display()
        ))
        .into());
    }
    let node_cal = nodes
        .iter()
        .zip(before.iter().zip(after.iter()))
        .map(|(n, ((c0, p0), (c1, p1)))| {
            let (mut web, mut gatherd) = (0u64, 0u64);
            for p in p1 {
                let was = p0.iter().find(|q| q.pid == p.pid).map_or(0, |q| q.cpu_us);
                let used = p.cpu_us.saturating_sub(was);
                if gatherd_pids.contains(&p.pid) {
                    gatherd += used;
                } else {
                    web += used;
                }
            }
            NodeCalibration {
                node: n.clone(),
                cpu: c1.since(c0),
                web_cpu_s: web as f64 / 1e6,
                gatherd_cpu_s: gatherd as f64 / 1e6,
            }
        })
        .collect();
    let clients = CALIBRATION_CLIENTS_PER_BACKEND * a.backends;
    Ok(Calibration {
        capacity_rps: capacity,
        rule: format!(
            "calibrated: the back-end tier's saturated throughput for the \
            {CAPACITY_REFERENCE_BYTES}-byte reference object, closed loop, {clients} clients \
            straight to the back-ends (no proxy, no admission) for {CALIBRATION_S} s after \
            {CALIBRATION_WARMUP_S} s = {capacity:.0} req/s"
        ),
        duration_s: CALIBRATION_S,
        warmup_s: CALIBRATION_WARMUP_S,
        clients,
        object_bytes: CAPACITY_REFERENCE_BYTES,
        avg_ms: s.avg_ms,
        p99_ms: s.p99_ms,
        nodes: node_cal,
    })
}
