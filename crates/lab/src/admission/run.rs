//! The sweep of `lab admission`: its point keys, the effective settings, and [`run`],
//! which starts the tier each (system, limit) needs and measures every point.

use super::*;
use crate::fabric::quiet;

/// The tier serving (scenario, system, limit) and the back-ends' background load.
pub(super) type Running = (
    (Scenario, String, Option<u64>),
    Tier,
    Vec<crate::fabric::netns::LoadHandle>,
);

/// Distance between the seeds of a point's client groups (proxies, cost classes), so
/// that no two groups draw the same workload or arrivals, even across repeats.
pub(super) const GROUP_SEED_STRIDE: u64 = 1_000_003;

/// One point of the sweep: its key in `points.jsonl`.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Key {
    pub(super) scenario: Scenario,
    pub(super) system: String,
    pub(super) trace: String,
    /// `None` for no-ac.
    pub(super) limit: Option<u64>,
    /// `closed` or `open`.
    pub(super) load_model: String,
    /// Closed loop: the number of clients.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) clients: Option<u64>,
    /// Open loop: the arrival rate as a multiple of the capacity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) rate_x: Option<f64>,
}

/// The sweep's keys: per system (and per limit for the admission-controlled ones),
/// per trace, per load model, per client count (closed) or rate (open); one tier is
/// started per (system, limit).
pub(super) fn keys(a: &AdmissionArgs, limits: &[u64], clients: &[u64], rates: &[f64]) -> Vec<Key> {
    let mut out = Vec::new();
    for &scenario in &a.scenario {
        for system in &a.systems {
            let ls: Vec<Option<u64>> =
                if system == "no-ac" || is_anchor(system) || system == "onesided-delay" {
                    // onesided-delay runs the proxy's default admission: no limit to sweep.
                    vec![None]
                } else {
                    limits.iter().map(|&l| Some(l)).collect()
                };
            for limit in ls {
                for trace in &a.traces {
                    for model in a.load.models() {
                        let key = |clients, rate_x| Key {
                            scenario,
                            system: system.clone(),
                            trace: trace.clone(),
                            limit,
                            load_model: model.to_string(),
                            clients,
                            rate_x,
                        };
                        if *model == "closed" {
                            out.extend(clients.iter().map(|&c| key(Some(c), None)));
                        } else {
                            out.extend(rates.iter().map(|&r| key(None, Some(r))));
                        }
                    }
                }
            }
        }
    }
    out
}

/// The effective settings of a run: every flag after defaults (what `--resume` compares).
pub(super) fn effective(
    a: &AdmissionArgs,
    clients: &[u64],
    limits: &[u64],
    rule: &str,
    duration_s: f64,
    warmup_s: f64,
) -> io::Result<serde_json::Value> {
    let mut e = a.clone();
    e.clients = clients.to_vec();
    e.duration_s = Some(duration_s);
    e.warmup_s = Some(warmup_s);
    e.limits = limits.to_vec();
    e.limit = None;
    let mut v = serde_json::to_value(&e).map_err(io::Error::other)?;
    if let Some(m) = v.as_object_mut() {
        m.remove("limit");
        m.insert("limit_rule".into(), rule.into());
        m.insert("capacity_conns".into(), capacity_conns(a).into());
        m.insert("backlog".into(), BACKEND_BACKLOG.into());
        m.insert("keepalive".into(), (!a.no_keepalive).into());
    }
    Ok(v)
}

/// What [`run`] takes from its checked arguments.
struct Checked {
    euid: u32,
    /// Closed-loop client counts to sweep.
    clients: Vec<u64>,
    /// Open-loop rates to sweep, as multiples of the capacity.
    rates: Vec<f64>,
    pl: Placement,
    /// CPUs of the back-end tier.
    back_cpus: usize,
    quota: Option<BackendQuota>,
    /// A system with admission control runs.
    any_ac: bool,
    /// CPUs this process may run on, read before the clients' pinning narrows it.
    cpus: usize,
}

/// Check the arguments before anything starts (root for netns, systems, traces,
/// scenarios, proxy arguments, loads, limits and rates), and derive the loads to sweep.
fn check_args(a: &AdmissionArgs) -> io::Result<Checked> {
    let euid = unsafe_euid();
    if a.hosts == Hosts::Netns {
        if a.dashboard.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--dashboard is not supported with --hosts netns yet: the proxy's admin \
                 listener is inside the proxy's namespace (open it from there, e.g. \
                 `ip netns exec NS curl -N http://ADMIN/events`)",
            ));
        }
        crate::fabric::netns::check_root(euid)?;
    }
    if let Some(d) = a.dashboard {
        eprintln!("lab admission: live dashboard at http://{d}/ (while a farside system runs)");
    }
    for s in &a.systems {
        if !SYSTEMS.contains(&s.as_str()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--systems: unknown system `{s}` ({})", SYSTEMS.join(", ")),
            ));
        }
    }
    if a.systems.iter().any(|s| is_haproxy(s)) {
        crate::haproxy::find_binary()?;
    }
    if a.systems.iter().any(|s| s == SYSTEM_ENVOY_AC) {
        crate::envoy::find_binary()?;
    }
    check_scenarios(a)?;
    for t in &a.traces {
        trace_kind(t)?;
    }
    check_proxy_args(&a.proxy_args)?;
    let clients: Vec<u64> = if a.clients.is_empty() {
        let list = if a.sweep.quick {
            CLIENTS_QUICK
        } else {
            CLIENTS_FULL
        };
        list.split(',')
            .map(|c| c.parse().expect("literal list"))
            .collect()
    } else {
        a.clients.clone()
    };
    if clients.iter().any(|&c| c == 0 || c > 10_000) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--clients: each count must be 1..=10000",
        ));
    }
    let pl = placement(a);
    let back_cpus = pl
        .back
        .as_ref()
        .map_or_else(|| crate::fabric::procs::allowed_cpus().len(), |b| b.len());
    let quota = backend_quota(a)?;
    if a.limit == Some(0) || a.limits.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--limit/--limits: a limit of 0 admits nothing; use 1 or more",
        ));
    }
    let any_ac = a
        .systems
        .iter()
        .any(|s| s == "tcp-ac" || s == "onesided-ac");
    if any_ac && a.limit.is_none() && a.limits.is_empty() {
        // A metric without a default limit fails here, before namespaces and calibration.
        default_limit(&a.metric, 1, 1)?;
    }
    let rates: Vec<f64> = if a.rates.is_empty() {
        let list = if a.sweep.quick {
            RATES_QUICK
        } else {
            RATES_FULL
        };
        list.split(',')
            .map(|r| r.parse().expect("literal list"))
            .collect()
    } else {
        a.rates.clone()
    };
    if rates.iter().any(|&r| !(r > 0.0 && r <= RATE_X_MAX)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--rates: each multiple of the capacity must be in (0, {RATE_X_MAX}]"),
        ));
    }
    Ok(Checked {
        euid,
        clients,
        rates,
        pl,
        back_cpus,
        quota,
        any_ac,
        cpus: crate::fabric::procs::allowed_cpus().len(),
    })
}

/// What `run` settled before its sweep, as `summary.json` records it.
struct Settled<'a> {
    euid: u32,
    /// CPUs this process may run on (before pinning).
    cpus: usize,
    clients: &'a [u64],
    rates: &'a [f64],
    limits: &'a [u64],
    /// How the limits were chosen.
    rule: &'a str,
    duration_s: f64,
    warmup_s: f64,
    /// The open loop's capacity per scenario, and how it was found.
    capacities: &'a BTreeMap<&'static str, (f64, String)>,
    /// nginx's calibrated capacity, and how it was found.
    calibrated: Option<&'a (f64, String)>,
    /// The calibration run's record.
    calibration: Option<&'a serde_json::Value>,
    quota: &'a Option<BackendQuota>,
    objective: &'a Objective,
    objective_rule: &'a str,
    /// Why the open loop did not run, when `--load both` had no capacity rule.
    open_skipped: Option<String>,
    calibration_notes: Vec<String>,
}

/// The run's metadata (`summary.json` before any point): effective settings, rates,
/// capacities, objective, each system's proxy arguments, privileged settings, notes.
fn metadata(a: &AdmissionArgs, s: Settled) -> io::Result<Summary<Point>> {
    let open = a.load != LoadModels::Closed;
    let mut meta = Summary::new("admission", a.hosts.as_str(), a.sweep.quick);
    crate::sweep::fill_host_metadata(&mut meta);
    // The clients' pinning (before this) narrowed this thread to the front CPU.
    meta.cpus = s.cpus;
    meta.seed = Some(a.seed);
    meta.params = effective(a, s.clients, s.limits, s.rule, s.duration_s, s.warmup_s)?;
    if let Some(m) = meta.params.as_object_mut() {
        m.insert(
            "rates".into(),
            serde_json::json!(if open { s.rates.to_vec() } else { Vec::new() }),
        );
        m.insert("load_models".into(), serde_json::json!(a.load.models()));
        // nginx's calibrated capacity is recorded in closed-loop runs too: the limit rule's
        // R_b comes from it.
        if let Some((r, rule)) = s.capacities.values().next().or(s.calibrated) {
            m.insert("capacity_rps".into(), serde_json::json!(r));
            m.insert("capacity_rule".into(), rule.clone().into());
        }
        if s.capacities.len() > 1 {
            let by: serde_json::Map<String, serde_json::Value> = s
                .capacities
                .iter()
                .map(|(k, (r, _))| (k.to_string(), serde_json::json!(r)))
                .collect();
            m.insert("capacity_rps_by_scenario".into(), by.into());
        }
        m.insert(
            "backend_quota".into(),
            serde_json::to_value(s.quota).map_err(io::Error::other)?,
        );
        if let Some(c) = s.calibration {
            m.insert("calibration".into(), c.clone());
        }
        m.insert(
            "objective".into(),
            serde_json::to_value(s.objective).map_err(io::Error::other)?,
        );
        m.insert("objective_rule".into(), s.objective_rule.to_string().into());
        // What the lab passes each farside proxy beyond addresses, workers and monitor
        // flags (the rest is the product's defaults, or --proxy-arg, appended after).
        let by: serde_json::Map<String, serde_json::Value> = a
            .systems
            .iter()
            .filter(|sys| !is_anchor(sys))
            .map(|sys| {
                let limit = match sys.as_str() {
                    "no-ac" | "onesided-delay" => None,
                    _ => s.limits.first().copied(),
                };
                let mut v = objective_proxy_args(a, sys, limit);
                v.extend(a.proxy_args.iter().cloned());
                (sys.clone(), serde_json::json!(v))
            })
            .collect();
        m.insert("proxy_args_by_system".into(), by.into());
        // The request classes a scenario's farside proxies declare, after those flags.
        let classes: serde_json::Map<String, serde_json::Value> = a
            .scenario
            .iter()
            .flat_map(|sc| a.systems.iter().map(move |sys| (*sc, sys)))
            .filter_map(|(sc, sys)| {
                let v = crate::scenario::class_proxy_args(sc, sys);
                (!v.is_empty()).then(|| (format!("{}/{sys}", sc.name()), serde_json::json!(v)))
            })
            .collect();
        if !classes.is_empty() {
            m.insert("class_args_by_scenario".into(), classes.into());
        }
        if a.systems.iter().any(|sys| is_haproxy(sys)) {
            let cfg = haproxy_config(
                a,
                SocketAddr::new(LOCALHOST, 0),
                &vec![SocketAddr::new(LOCALHOST, 0); a.backends],
            );
            m.insert("haproxy_config".into(), cfg.symbolic().render().into());
            m.insert("haproxy_maxconn".into(), haproxy_maxconn_record(a));
            m.insert("haproxy_maxconn_rule".into(), HAPROXY_MAXCONN_RULE.into());
        }
        if a.systems.iter().any(|sys| sys == SYSTEM_ENVOY_AC) {
            let cfg = envoy_config(
                a,
                SocketAddr::new(LOCALHOST, 0),
                &vec![SocketAddr::new(LOCALHOST, 0); a.backends],
            );
            m.insert("envoy_config".into(), cfg.symbolic().render().into());
        }
        m.insert("rejection_signalling".into(), rejection_signalling(a));
    }
    meta.settings = privileged_settings(a, s.euid == 0, nice_floor(), s.cpus);
    if let Some(why) = s.open_skipped {
        meta.settings
            .insert("open_loop".into(), Setting::not_applied("both", &why));
    }
    meta.notes.extend(s.calibration_notes);
    if a.sweep.quick {
        meta.notes.push(format!(
            "quick run: {} s points after {} s of warm-up, for demos; not for comparison",
            s.duration_s, s.warmup_s
        ));
    }
    Ok(meta)
}

pub fn run(mut a: AdmissionArgs) -> io::Result<()> {
    let Checked {
        euid,
        clients,
        rates,
        pl,
        back_cpus,
        quota,
        any_ac,
        cpus,
    } = check_args(&a)?;
    let (duration_s, warmup_s) = point_time(&a);
    let dir = a.sweep.dir(&a.out);
    let netns = a.hosts == Hosts::Netns;
    let run = Run {
        logs: dir.join("logs"),
        shm: PathBuf::from(format!("/dev/shm/farside-lab-{}", std::process::id())),
        docroot: std::env::temp_dir().join(format!("farside-lab-docroot-{}", std::process::id())),
    };
    std::fs::create_dir_all(&run.logs)?;
    std::fs::create_dir_all(&run.shm)?;
    let _cleanup = Cleanup(vec![run.shm.clone(), run.docroot.clone()]);
    {
        let dirs = vec![run.shm.clone(), run.docroot.clone()];
        crate::fabric::procs::on_interrupt(move || {
            for d in &dirs {
                let _ = std::fs::remove_dir_all(d);
            }
        });
    }
    for t in &a.traces {
        let l = loadgen_args(&a, "127.0.0.1:1".parse().expect("literal"), t, 1, 1.0, 0.0)?;
        let trace = l
            .build_trace()
            .map_err(|e| io::Error::other(e.to_string()))?;
        farside_loadgen::write_docroot(&trace, &run.docroot)?;
    }

    if let (Some(f), Some(b)) = (&pl.front, &pl.back) {
        eprintln!("lab admission: proxy and clients on CPU {f:?}, back-end nodes on CPUs {b:?} (--no-pin to share)");
    }
    let fabric = if netns {
        use crate::fabric::netns::{NodeSpec, VirtualDc};
        let node = |name: &str, c: &Option<Vec<usize>>| NodeSpec::new(name).pinned(c.as_deref());
        let mut nodes: Vec<NodeSpec> = (0..a.backends)
            .map(|i| {
                let n = node(&format!("b{i}"), &pl.back);
                match &quota {
                    Some(q) => n.cpu_quota_pct(q.pct),
                    None => n,
                }
            })
            .collect();
        nodes.push(node("proxy", &pl.front));
        nodes.push(node("client", &pl.front));
        let dc = VirtualDc::create(&format!("a{}", std::process::id() % 100_000), &nodes)?;
        let id = dc.run_id().to_string();
        crate::fabric::procs::on_interrupt(move || {
            if let Ok(r) = crate::fabric::netns::clean_run_id(&id) {
                eprint!("{r}");
            }
        });
        eprintln!(
            "lab admission: {} nodes in network namespaces on 10.77.0.0/24",
            nodes.len()
        );
        Fabric::Netns(dc)
    } else {
        if let Some(f) = &pl.front {
            // Clients run in this process: pin it (threads created from now on inherit it).
            crate::fabric::procs::pin_current_thread(f)?;
        }
        Fabric::Loopback(pl.clone())
    };

    if let Some(q) = &quota {
        eprintln!(
            "lab admission: back-end nodes in a CPU quota of {} % of one CPU each ({} us every \
             {} us; {})",
            q.pct, q.quota_us, q.period_us, q.rule
        );
    }
    // nginx's capacity is measured, not ruled: the calibration run (or the kept run's
    // value when resuming, so that the settings still match).
    let mut calibration: Option<serde_json::Value> = None;
    let mut calibration_notes = Vec::new();
    if a.backend_server == BackendServer::Nginx && a.capacity_rps.is_none() {
        if a.sweep.resume.is_some() {
            let kept: Summary<Point> = crate::sweep::read_summary(&dir)?;
            calibration = kept.params.get("calibration").cloned();
        } else {
            eprintln!(
                "lab admission: calibrating the nginx tier's capacity ({} clients, {CALIBRATION_S} s)",
                CALIBRATION_CLIENTS_PER_BACKEND * a.backends
            );
            let c = calibrate(&a, &run, &fabric, pl.front.as_deref())?;
            eprintln!("lab admission: {}", c.rule);
            for w in c.warnings() {
                eprintln!("lab admission: warning: {w}");
                calibration_notes.push(w);
            }
            calibration = Some(serde_json::to_value(&c).map_err(io::Error::other)?);
        }
    }
    let calibrated: Option<(f64, String)> = calibration.as_ref().and_then(|c| {
        Some((
            c.get("capacity_rps")?.as_f64()?,
            c.get("rule")?.as_str()?.to_string(),
        ))
    });
    // The operator's objective, from --queue-ms and one back-end's service rate at the
    // reference request (the same for every scenario: an operator sets it once).
    let rate_b = capacity_rps(
        &a,
        back_cpus,
        reference_cost_us(&a, Scenario::Single),
        calibrated.as_ref(),
    )
    .ok()
    .map(|(r, _)| r / a.backends.max(1) as f64);
    let (objective, objective_rule) = Objective::derive(&a, rate_b);
    let (limits, rule) = if !a.limits.is_empty() {
        (a.limits.clone(), "--limits".to_string())
    } else if let Some(l) = a.limit {
        (vec![l], "--limit".to_string())
    } else if any_ac {
        let (l, rule) = default_limit(&a.metric, capacity_conns(&a), objective.queue_len)?;
        (vec![l], format!("default: {rule}"))
    } else {
        (
            Vec::new(),
            "none (no limit-driven admission control)".to_string(),
        )
    };
    let open = a.load != LoadModels::Closed;
    // The open loop's capacity per scenario (mixed-cost's requests cost more on average).
    let mut capacities: BTreeMap<&'static str, (f64, String)> = BTreeMap::new();
    let mut open_skipped = None;
    if open {
        for sc in a.scenario.clone() {
            match capacity_rps(
                &a,
                back_cpus,
                reference_cost_us(&a, sc),
                calibrated.as_ref(),
            ) {
                Ok(c) => {
                    capacities.insert(sc.name(), c);
                }
                // The default `--load both` without a capacity rule (nginx, or no CPU
                // cost): the closed loop still runs, and the summary says why the open
                // loop did not. An explicit `--load open` is an error.
                Err(e) if a.load == LoadModels::Both => {
                    open_skipped = Some(e.to_string());
                    capacities.clear();
                    a.load = LoadModels::Closed;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
    }
    let meta = metadata(
        &a,
        Settled {
            euid,
            cpus,
            clients: &clients,
            rates: &rates,
            limits: &limits,
            rule: &rule,
            duration_s,
            warmup_s,
            capacities: &capacities,
            calibrated: calibrated.as_ref(),
            calibration: calibration.as_ref(),
            quota: &quota,
            objective: &objective,
            objective_rule: &objective_rule,
            open_skipped,
            calibration_notes,
        },
    )?;
    let mut sweep = Sweep::<Admission>::start(&dir, meta, a.sweep.resume.is_some())?;

    let keys = keys(&a, &limits, &clients, &rates);
    let heaviest = clients.iter().copied().max().unwrap_or(0);
    let dc = match &fabric {
        Fabric::Netns(dc) => Some(dc),
        Fabric::Loopback(_) => None,
    };
    // The tier serving a (scenario, system, limit), with its background load.
    let start_running = |k: &Key| -> io::Result<Running> {
        let tier = start_tier(&a, &run, k.scenario, &k.system, k.limit, &fabric)?;
        let busy = match &fabric {
            Fabric::Netns(dc) if a.background_load > 0 => (0..a.backends)
                .map(|i| dc.start_cpu_load(&format!("b{i}"), a.background_load))
                .collect::<io::Result<Vec<_>>>()?,
            _ => Vec::new(),
        };
        Ok(((k.scenario, k.system.clone(), k.limit), tier, busy))
    };
    // The running tier and its background load, for the (system, limit) it serves.
    let mut current: Option<Running> = None;
    sweep.run_isolated(
        &keys,
        a.repeat,
        duration_s + warmup_s + 0.5,
        |k| {
            let limit = k.limit.map(|l| format!(" limit={l}")).unwrap_or_default();
            let load = match (k.clients, k.rate_x) {
                (Some(c), _) => format!("clients={c:<4}"),
                (_, Some(x)) => format!("rate={x}x"),
                _ => String::new(),
            };
            format!("{:<12} {:<8}{limit} {load}", k.system, k.trace)
        },
        |k, r| {
            let want = (k.scenario, k.system.clone(), k.limit);
            if current.as_ref().map(|c| &c.0) != Some(&want) {
                // One tier at a time: the old one stops before the new one starts.
                current = None;
                current = Some(start_running(k)?);
            }
            // Every point starts from an empty tier: what the previous point left (an
            // open loop past capacity leaves the back-ends' accept queues full) drains
            // within DRAIN_WAIT_MAX, or the tier is restarted.
            let t0 = Instant::now();
            let found = {
                let (_, tier, _) = current.as_ref().expect("tier started above");
                quiet::wait_quiet(dc, &watched_ports(&fabric, tier), DRAIN_WAIT_MAX)?
            };
            let start = if found.quiet {
                found.start(&found.first, t0.elapsed(), false)
            } else {
                eprintln!(
                    "lab admission: the tier did not drain within {} s ({} queued, {} \
                     connections carrying a request at the back-ends): restarting it",
                    DRAIN_WAIT_MAX.as_secs_f64(),
                    found.last.back.backlog + found.last.front.backlog,
                    found.last.back.busy
                );
                current = None;
                current = Some(start_running(k)?);
                let (_, tier, _) = current.as_ref().expect("tier started above");
                let again =
                    quiet::wait_quiet(dc, &watched_ports(&fabric, tier), RESTART_QUIET_MAX)?;
                again.start(&found.first, t0.elapsed(), true)
            };
            let (_, tier, _) = current.as_mut().expect("tier started above");
            let seed = a.seed.wrapping_add(u64::from(r));
            let rate = match (k.rate_x, capacities.get(k.scenario.name())) {
                (Some(x), Some((cap, _))) => Some(x * cap),
                _ => None,
            };
            let groups = crate::scenario::client_groups(
                k.scenario,
                tier.proxies.len(),
                k.clients.unwrap_or(0),
                rate,
            );
            // Per-request records only at the heaviest load: Fig. 6 shows that one, and a
            // 60 s point at every load would keep megabytes per point.
            let keep_requests = k.clients == Some(heaviest)
                || (k.rate_x.is_some() && k.rate_x == rates.iter().copied().reduce(f64::max));
            let mut ls = Vec::new();
            for (i, g) in groups.iter().enumerate() {
                let mut l = loadgen_args(
                    &a,
                    tier.proxies[g.proxy].addr,
                    &k.trace,
                    g.clients.max(1),
                    duration_s,
                    warmup_s,
                )?;
                // Each group draws its own workload and arrivals.
                l.seed = seed.wrapping_add(GROUP_SEED_STRIDE.wrapping_mul(i as u64));
                if g.dynamic {
                    l.trace = TraceKind::Single;
                    l.file_path = format!(
                        "/cgi/work?us={}",
                        a.backend_cpu_us * crate::scenario::MIXED_COST_FACTOR
                    );
                }
                if rate.is_some() {
                    l.rate = Some(g.rate);
                    l.open_users_max = OPEN_USERS_MAX;
                }
                l.out = keep_requests.then(|| run.logs.join(format!("requests-{i}.csv")));
                ls.push(l);
            }
            let before = MonitorScrape::take(&fabric, tier);
            let queues =
                QueueSampler::start(&tier.regions, std::time::Duration::from_secs_f64(warmup_s));
            let all_cpus = crate::fabric::procs::allowed_cpus;
            let host = HostSampler::start(
                pl.back.clone().unwrap_or_else(all_cpus),
                pl.front.clone().unwrap_or_else(all_cpus),
                match &fabric {
                    Fabric::Netns(dc) => Some(dc.cgroup_dir(&Fabric::node(Role::Proxy))),
                    Fabric::Loopback(_) => None,
                },
                match &fabric {
                    Fabric::Netns(_) => tier.backends.iter().map(|b| b.pid()).collect(),
                    Fabric::Loopback(_) => Vec::new(),
                },
                std::time::Duration::from_secs_f64(warmup_s),
                std::time::Duration::from_secs_f64(duration_s),
            );
            // The scenario's disturbance runs beside the clients, and stops (continuing
            // every process it paused) when the point ends, however it ends.
            let disturbance = match k.scenario {
                Scenario::TenantLoad if !tier.tenant_pids.is_empty() => {
                    Some(crate::scenario::Disturbance::tenants(
                        tier.tenant_pids.clone(),
                        crate::scenario::tenant_mean_s(duration_s),
                        seed,
                    ))
                }
                Scenario::CapacityChange => {
                    let pid = tier.backends.first().map(|b| b.pid()).ok_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "--scenario capacity-change needs --backend-server farside",
                        )
                    })?;
                    Some(crate::scenario::Disturbance::half_speed(
                        pid,
                        std::time::Duration::from_secs_f64(warmup_s + duration_s / 3.0),
                        std::time::Duration::from_secs_f64(duration_s / 3.0),
                    ))
                }
                _ => None,
            };
            let parts = std::thread::scope(|sc| {
                let handles: Vec<_> = ls
                    .iter()
                    .map(|l| sc.spawn(|| fabric.run_clients(l, pl.front.as_deref())))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(io::Error::other("a client group panicked")))
                    })
                    .collect::<io::Result<Vec<_>>>()
            })?;
            drop(disturbance);
            let s = crate::scenario::merge_concurrent(&parts)?;
            for p in &mut tier.proxies {
                p.child.check_alive()?;
            }
            let mut p = point(k, transport_of(&k.system, netns), &s);
            host.finish(&mut p);
            p.classes = crate::scenario::class_breakdown(&groups, &parts)?;
            if let (Some(b), Some(after)) = (before, MonitorScrape::take(&fabric, tier)) {
                after.fill(&b, &mut p);
            }
            // The first farside proxy's metrics at the point's end, kept beside the
            // processes' logs: what admission decided and why (per class with
            // `[[classes]]`), for a reader who asks why a figure is what it is.
            if let Some(admin) = tier.proxies.first().and_then(|p| p.admin_addr) {
                if let Ok(text) = fabric.scrape(admin) {
                    let name = format!(
                        "metrics-{}-{}-{}-{}-r{r}.prom",
                        k.system,
                        k.scenario.name(),
                        k.trace,
                        k.rate_x.map_or_else(
                            || format!("c{}", k.clients.unwrap_or(0)),
                            |x| format!("x{x}")
                        )
                    );
                    let _ = std::fs::write(run.logs.join(name), text);
                }
            }
            queues.finish(&mut p);
            if let Some(st) = tier.proxies.first().and_then(|p| p.stats_addr) {
                match fabric.haproxy_times(st) {
                    Ok(t) => {
                        p.proxy_queue_ms = Some(t.queue_ms);
                        p.proxy_time_ms = Some(t.queue_ms + t.connect_ms + t.response_ms);
                    }
                    Err(e) => eprintln!("lab admission: warning: no HAProxy timings: {e}"),
                }
            }
            let mut samples = Vec::new();
            for l in &ls {
                let Some(path) = &l.out else { continue };
                match request_samples(path, REQUEST_SAMPLES_MAX / ls.len().max(1)) {
                    Ok(v) => samples.extend(v),
                    Err(e) => eprintln!("lab admission: warning: no per-request samples: {e}"),
                }
                let _ = std::fs::remove_file(path);
            }
            samples.sort_by(|a, b| a.0.total_cmp(&b.0));
            p.requests = samples;
            Ok((p, start))
        },
    )?;
    drop(current);
    sweep.finish()?;
    Ok(())
}

/// Longest wait for the previous point's load to drain before a point, after which
/// the tier is restarted instead: 3 s is several times what a closed-loop point leaves
/// (at most one request per client, up to 520 clients at ~2 ms of back-end CPU each,
/// shared by 16 workers per back-end: under 1 s), while an open loop past capacity
/// leaves up to the back-ends' accept queues (2 x 2048 connections, ~8 s of work at the
/// default cost) that restarting the tier (~1 s) ends sooner.
pub const DRAIN_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(3);

/// Longest wait for a restarted tier to be quiet (its processes just started and hold
/// no connection; the bound only catches a tier that is not what it seems): past it the
/// point runs and records `started_empty = false`, with a warning and a note.
pub const RESTART_QUIET_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// The tier's listening ports that must be quiet before a point: every proxy's (front:
/// no client connection open) and every back-end's (back: nothing queued or carrying a
/// request), each in its node's namespace.
pub(super) fn watched_ports(fabric: &Fabric, tier: &Tier) -> Vec<quiet::Watched> {
    let node = |role| match fabric {
        Fabric::Netns(_) => Some(Fabric::node(role)),
        Fabric::Loopback(_) => None,
    };
    let front = tier
        .proxies
        .iter()
        .map(|p| quiet::Watched::new(node(Role::Proxy), p.addr.port(), quiet::Side::Front));
    let back = tier
        .backend_addrs
        .iter()
        .enumerate()
        .map(|(i, b)| quiet::Watched::new(node(Role::Backend(i)), b.port(), quiet::Side::Back));
    front.chain(back).collect()
}

/// Removes the run's temporary directories when the run ends, however it ends.
pub(super) struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

pub(super) fn unsafe_euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}
