//! `farside model coop`: the analytical model of cooperative caching, fed by costs
//! measured on this host (`--calibrate`, [`crate::model_calibrate`]) and checked against
//! kept `farside lab coop` runs before it extrapolates (`farside_coop::validate`).

use farside_coop::trace::{world_cup_sample_path, Trace};
use farside_coop::validate::{self, CostsFile, LabRun, Setup};
use std::path::{Path, PathBuf};

/// Checked configurations extrapolated from at most: each grid is ten configurations of
/// every modelled system, a few minutes of simulation.
const EXTRAPOLATION_BASES_MAX: usize = 3;

/// `farside model ...`.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    pub what: ModelWhat,
}

/// The models.
#[derive(Debug, clap::Subcommand)]
pub enum ModelWhat {
    /// Cooperative caching (rr and PRESS over tcp, udp, xdp and shm peer fetch):
    /// simulate the World Cup trace per system and node count, predict throughput and
    /// response time by mean-value analysis from measured costs (per-transport fetch
    /// costs from --calibrate), compare with the closed-loop points of kept `lab coop`
    /// runs (`points.json` or `summary.json`; PASS within 15 %, fixed in advance; open
    /// loop, lard, bounded-hash and haproxy listed as not modelled; with a repeated
    /// calibration's costs also predicted at the ends of their spread, for information:
    /// whether a point outside the tolerance lies inside that band), check the
    /// utilisation and Little's laws, then extrapolate (8/16/32 nodes, larger working
    /// sets, faster CPUs) with the largest gain of press-xdp over press-tcp beside the
    /// paper's 55 %, labelled "model output" only if every compared configuration
    /// passed, else "UNCHECKED" (and the command exits 1).
    Coop(CoopModelArgs),
}

/// `farside model coop`.
#[derive(Debug, Clone, clap::Args)]
pub struct CoopModelArgs {
    /// Costs file (JSON, `farside-coop-costs/4`; the older `/3`, measured once without
    /// a spread, `/2`, without the delay either, and `/1`, without host-wide busy time
    /// either, are still read: the output says what they lack) from `--calibrate`.
    /// Required unless --calibrate is given. Several, comma-separated (each calibrated
    /// in another shape, `--calibrate-nodes`): each checked point takes the costs
    /// calibrated at its own node count and CPU quota, else the first file's; the
    /// extrapolation and the model output without --runs take the first's.
    #[arg(long, value_delimiter = ',')]
    pub costs: Vec<PathBuf>,
    /// Measure the costs on this host first, the way `farside lab coop` incurs them:
    /// `farside backend --coop` nodes in network namespaces (--calibrate-nodes, default
    /// the lab's 4, at --calibrate-cpu-quota-pct, default the lab's 40 %), driven by `farside loadgen` replaying sessions of a synthetic trace (not
    /// the World Cup), in all-local, all-miss and all-remote phases (the last per
    /// transport: tcp, udp, xdp, shm), taking in each the nodes' cgroup CPU and the
    /// host's busy time over all CPUs (/proc/stat) per request; then, per kind and size,
    /// a light-load phase with one closed-loop client in all, whose time per request less
    /// the model's own answer at one client is the delay no service demand holds (the
    /// model's delay centre); needs root, about seven minutes at the defaults. Writes them to --costs
    /// (default <--out>/costs.json). Run it through the
    /// measurement lock, on an otherwise idle host (builds frozen: it warns when the
    /// host was busier than its own processes explain) and with the same build as the
    /// lab runs compared.
    #[arg(long)]
    pub calibrate: bool,
    /// Requests each calibration phase should count (its measured time is --calibrate-seconds);
    /// a phase that counts fewer is reported with a warning. Default 1000.
    #[arg(long = "calibrate-requests", default_value_t = 1000)]
    pub calibrate_requests: u64,
    /// Measured seconds of each calibration phase (after a warm-up of a third of it, at
    /// least 0.1 s, at most 1 s); 40 lab-shaped phases per repeat and 24 light phases.
    /// Default 1.
    #[arg(long = "calibrate-seconds", default_value_t = crate::model_calibrate::CALIBRATE_SECONDS_DEFAULT)]
    pub calibrate_seconds: f64,
    /// Repeats of the calibration's lab-shaped phases (1 to 20): in each set-up, per
    /// repeat and size, the all-local phase and right after it the all-remote (or
    /// all-miss) phase, whose cost is taken over that local phase; each repeat's costs
    /// are lines over the sizes, the costs file holds each cost's median over the
    /// repeats and its lowest and highest (the spread, which the check predicts at
    /// too). Default 5.
    #[arg(long = "calibrate-repeats", default_value_t = crate::model_calibrate::CALIBRATE_REPEATS_DEFAULT)]
    pub calibrate_repeats: usize,
    /// Nodes of the calibration (even, 2 to 8). Default 4, the lab's: costs calibrated
    /// at the node count and quota of the configurations they check hold the host's
    /// cost of carrying that many nodes (see --costs).
    #[arg(long = "calibrate-nodes", default_value_t = validate::SHAPE_NODES_DEFAULT)]
    pub calibrate_nodes: usize,
    /// Each calibration node's CPU quota, percent of one CPU (5 to 100). Default 40, the
    /// lab's.
    #[arg(long = "calibrate-cpu-quota-pct", default_value_t = validate::SHAPE_CPU_QUOTA_PCT_DEFAULT)]
    pub calibrate_cpu_quota_pct: u32,
    /// Kept `lab coop` run directories (each with `points.json`) to compare with.
    #[arg(long, value_delimiter = ',')]
    pub runs: Vec<PathBuf>,
    /// Trace (World Cup format). Default: the sample in `data/`.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Seed of the simulations. Default 1.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Without --runs: node counts to model (4 clients per node, cache W90/nodes, the
    /// lab's defaults). Default 2,4,8.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub nodes: Vec<usize>,
    /// Skip the extrapolation.
    #[arg(long = "no-extrapolate")]
    pub no_extrapolate: bool,
    /// Write `model.txt` (and the costs file, with --calibrate) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs `farside model ...`; `Ok(false)` when a configuration was outside tolerance.
pub fn run(a: ModelArgs) -> Result<bool, String> {
    match a.what {
        ModelWhat::Coop(c) => run_coop(&c),
    }
}

fn read_costs(path: &Path) -> Result<CostsFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    CostsFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The lab's defaults for a configuration with no kept run.
fn default_setup(trace: &Trace, system: &str, nodes: usize) -> Setup {
    Setup {
        system: system.into(),
        nodes,
        cache_bytes: trace.working_set_bytes(0.9).div_ceil(nodes as u64),
        clients_per_node: 4,
        cpu_share: 0.4,
        disk_latency_us: 5_000,
        disk_bytes_per_s: validate::LAB_DISK_BYTES_PER_S_DEFAULT,
        link_gbit: None,
        warmup_s: validate::LAB_WARMUP_S_DEFAULT,
        duration_s: 20.0,
        publish_ms: validate::LAB_PUBLISH_MS_DEFAULT,
        cpu_speedup: 1.0,
        shared_host_cpus: None,
        lab_repeats: 1,
    }
}

fn run_coop(a: &CoopModelArgs) -> Result<bool, String> {
    if let Some(out) = &a.out {
        std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    let costs_paths: Vec<PathBuf> = match (a.costs.as_slice(), &a.out) {
        ([p], _) if a.calibrate => vec![p.clone()],
        (_, _) if a.calibrate && a.costs.len() > 1 => {
            return Err(
                "model coop: --calibrate writes one costs file: give one --costs path".into(),
            )
        }
        ([], Some(out)) if a.calibrate => vec![out.join("costs.json")],
        ([], _) => {
            return Err(
                "model coop: needs --costs FILE (or --calibrate with --costs or --out): \
                 the model runs on measured costs only"
                    .into(),
            )
        }
        (paths, _) => paths.to_vec(),
    };
    if a.calibrate {
        let shape = validate::CalibrationShape::new(a.calibrate_nodes, a.calibrate_cpu_quota_pct)
            .map_err(|e| format!("model coop: {e}"))?;
        let costs_path = &costs_paths[0];
        let f = crate::model_calibrate::calibrate(
            a.calibrate_requests,
            a.calibrate_seconds,
            a.calibrate_repeats,
            shape,
        )?;
        let text = serde_json::to_string_pretty(&f).map_err(|e| e.to_string())? + "\n";
        std::fs::write(costs_path, text).map_err(|e| format!("{}: {e}", costs_path.display()))?;
        eprintln!("model coop: wrote {}", costs_path.display());
    }
    let all_costs = costs_paths
        .iter()
        .map(|p| read_costs(p))
        .collect::<Result<Vec<_>, _>>()?;
    let costs = &all_costs[0];
    let trace_path = a.trace.clone().unwrap_or_else(world_cup_sample_path);
    let trace =
        Trace::read_world_cup(&trace_path).map_err(|e| format!("{}: {e}", trace_path.display()))?;
    let mut runs = Vec::new();
    for dir in &a.runs {
        // A run's `points.json` (older runs) or the sweep runner's `summary.json`.
        let (p, summary) = match dir.join("points.json") {
            p if p.exists() => (p, false),
            _ => (dir.join("summary.json"), true),
        };
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let run = if summary {
            LabRun::parse_summary(&text)
        } else {
            LabRun::parse(&text)
        }
        .map_err(|e| format!("{}: {e}", p.display()))?;
        let name = dir
            .file_name()
            .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
        runs.push((name, run));
    }
    let mut text = format!(
        "farside model coop\ntrace: {} ({} requests, {} objects, {:.1} MB distinct)\n",
        trace_path.display(),
        trace.requests.len(),
        trace.object_bytes.len(),
        trace.distinct_bytes() as f64 / 1e6,
    );
    for (path, c) in costs_paths.iter().zip(&all_costs) {
        text += &costs_text(path, c);
    }
    text += "\n";
    let systems = validate::modelled_systems(costs);
    let (modelled, failed, bases) = if runs.is_empty() {
        text += "no lab runs given (--runs): nothing is checked, every figure is model output, UNCHECKED\n";
        for &n in &a.nodes {
            for system in &systems {
                let s = default_setup(&trace, system, n);
                let p = validate::predict(costs, &trace, &s, a.seed)?;
                text += &format!(
                    "\n{system} ({n} nodes, {} clients, cache {} B per node):\n",
                    n * 4,
                    s.cache_bytes
                );
                text += &validate::render_prediction(&p);
            }
        }
        let n = a.nodes.iter().copied().max().unwrap_or(4);
        (0, 0, vec![default_setup(&trace, "rr", n)])
    } else {
        let checks = check_by_shape(&all_costs, &trace, &runs, a.seed);
        if all_costs.len() > 1 {
            text += &shape_lines(&all_costs, &costs_paths, &runs);
        }
        text += &validate::render_checks(&checks);
        text += "\n";
        let ends: Option<Vec<(CostsFile, CostsFile)>> =
            all_costs.iter().map(CostsFile::spread_ends).collect();
        match ends {
            Some(ends) => {
                let (low, high): (Vec<_>, Vec<_>) = ends.into_iter().unzip();
                let l = check_by_shape(&low, &trace, &runs, a.seed);
                let h = check_by_shape(&high, &trace, &runs, a.seed);
                text += &validate::render_spread(&checks, &l, &h);
            }
            None => {
                text += &format!(
                    "no spread in a costs file (format {}: each cost measured once): the checks are not repeated at its ends\n",
                    all_costs
                        .iter()
                        .find(|c| c.spread.is_none())
                        .map_or(costs.format.as_str(), |c| c.format.as_str())
                );
            }
        }
        let (m, _, bad) = validate::verdict(&checks);
        // Extrapolate from every distinct checked configuration of the largest node
        // count (nodes, cache, clients per node): each cache rule is its own regime.
        let nodes_max = checks
            .iter()
            .filter_map(|c| c.prediction.as_ref().ok())
            .map(|p| p.setup.nodes)
            .max()
            .ok_or("model coop: no configuration of the runs is modelled")?;
        let mut bases: Vec<validate::Setup> = Vec::new();
        for p in checks.iter().filter_map(|c| c.prediction.as_ref().ok()) {
            let s = &p.setup;
            let same = |b: &validate::Setup| {
                (b.nodes, b.cache_bytes, b.clients_per_node)
                    == (s.nodes, s.cache_bytes, s.clients_per_node)
            };
            if s.nodes == nodes_max && !bases.iter().any(same) {
                bases.push(s.clone());
            }
        }
        (m, bad, bases)
    };
    if !a.no_extrapolate {
        for base in bases.iter().take(EXTRAPOLATION_BASES_MAX) {
            let rows = validate::extrapolate_grid(costs, &trace, base, &systems, a.seed)?;
            text += &format!(
                "\nfrom {} nodes, cache {} B per node, {} clients per node; one host per node as in the paper (no shared host CPU centre{}):\n",
                base.nodes,
                base.cache_bytes,
                base.clients_per_node,
                base.shared_host_cpus
                    .map_or(String::new(), |c| format!("; the checked points shared {c} CPUs"))
            );
            text += &validate::render_extrapolation(&rows, failed, modelled);
        }
    }
    print!("{text}");
    if let Some(out) = &a.out {
        let p = out.join("model.txt");
        std::fs::write(&p, &text).map_err(|e| format!("{}: {e}", p.display()))?;
        eprintln!("model coop: wrote {}", p.display());
    }
    Ok(failed == 0)
}

/// Every point of `runs` checked with the costs calibrated in its own shape (node count
/// and CPU quota, [`validate::pick_shape`]), else with the first costs file's.
fn check_by_shape(
    costs: &[CostsFile],
    trace: &Trace,
    runs: &[(String, LabRun)],
    seed: u64,
) -> Vec<validate::PointCheck> {
    if let [one] = costs {
        return validate::check_runs(one, trace, runs, seed);
    }
    let shapes: Vec<_> = costs.iter().map(|c| c.shape).collect();
    let mut out = Vec::new();
    for (name, run) in runs {
        // The run's settings once, without its points; each point checked alone in it.
        let settings = LabRun {
            points: Vec::new(),
            ..run.clone()
        };
        for p in &run.points {
            let k = validate::pick_shape(&shapes, p.nodes, run.cpu_quota_pct).unwrap_or(0);
            let one = LabRun {
                points: vec![p.clone()],
                ..settings.clone()
            };
            out.extend(validate::check_runs(
                &costs[k],
                trace,
                &[(name.clone(), one)],
                seed,
            ));
        }
    }
    out
}

/// Which costs file checked which points, one line per file.
fn shape_lines(costs: &[CostsFile], paths: &[PathBuf], runs: &[(String, LabRun)]) -> String {
    let shapes: Vec<_> = costs.iter().map(|c| c.shape).collect();
    let mut text = String::from(
        "each point checked with the costs calibrated at its own node count and CPU quota, else the first file's:\n",
    );
    for (k, (c, path)) in costs.iter().zip(paths).enumerate() {
        let mut points = Vec::new();
        for (name, run) in runs {
            for p in &run.points {
                if validate::pick_shape(&shapes, p.nodes, run.cpu_quota_pct) == Some(k) {
                    points.push(format!("{name} {} ({} nodes)", p.system, p.nodes));
                }
            }
        }
        text += &format!(
            "  {} ({}): {}\n",
            path.display(),
            c.shape.label(),
            if points.is_empty() {
                "no point".to_string()
            } else {
                points.join(", ")
            }
        );
    }
    text + "\n"
}

/// What the model says of one costs file: where and how it was measured, and its costs.
fn costs_text(costs_path: &Path, costs: &CostsFile) -> String {
    let pv = &costs.provenance;
    let mut text = format!(
        "costs: {} (calibrated at {}; commit {}{}, kernel {}, host {}, {} CPUs, {} build, {}, load {:.1}/{:.1})\n\
         CPU per request on one core: {:.1} us + {:.2} us/KB; miss +{:.1} us + {:.2} us/KB; \
         forward initial +{:.1} us + {:.2} us/KB, service {:.1} us + {:.2} us/KB; client {:.1} us + {:.2} us/KB\n\
         disk emulation: {} us + size / {} B/s configured, measured {:.1} us + {:.2} us/KB\n",
        costs_path.display(),
        costs.shape.label(),
        pv.commit,
        if pv.tree_dirty { ", dirty tree" } else { "" },
        pv.kernel,
        pv.host,
        pv.cpus,
        pv.build,
        pv.measured_at,
        pv.load_avg[0],
        pv.load_avg[1],
        costs.costs.cpu_request_ns as f64 / 1e3,
        costs.costs.cpu_per_kb_ns as f64 / 1e3,
        costs.costs.cpu_miss_ns as f64 / 1e3,
        costs.costs.cpu_miss_per_kb_ns as f64 / 1e3,
        costs.costs.cpu_forward_ns as f64 / 1e3,
        costs.costs.cpu_forward_per_kb_ns as f64 / 1e3,
        costs.costs.cpu_peer_serve_ns as f64 / 1e3,
        costs.costs.cpu_peer_serve_per_kb_ns as f64 / 1e3,
        costs.client_request_ns / 1e3,
        costs.client_per_kb_ns / 1e3,
        costs.disk.configured_latency_us,
        costs.disk.configured_bytes_per_s,
        costs.disk.measured_access_ns / 1e3,
        costs.disk.measured_per_kb_ns / 1e3,
    );
    for t in &costs.transports {
        text += &format!(
            "peer fetch over {}: initial node +{:.1} us + {:.2} us/KB, service node {:.1} us + {:.2} us/KB \
             (host softirq {:.1} us + {:.2} us/KB, inside those where it ran in their context)\n",
            t.transport,
            t.initial_ns / 1e3,
            t.initial_per_kb_ns / 1e3,
            t.service_ns / 1e3,
            t.service_per_kb_ns / 1e3,
            t.softirq_ns / 1e3,
            t.softirq_per_kb_ns / 1e3,
        );
    }
    if let Some(sp) = &costs.spread {
        text += &format!(
            "costs measured in {} repeats, each cost the median over them: {}\n",
            sp.repeats, sp.rule
        );
        text += &spread_lines(sp);
    }
    match &costs.host_wide {
        Some(h) => {
            text += "host-wide busy time per request (all CPUs, /proc/stat, each tick once): ";
            text += &cost_lines(
                (h.local_ns, h.local_per_kb_ns),
                (h.miss_ns, h.miss_per_kb_ns),
                &h.fetch,
            );
            text += &format!(
                "\n  busy time the calibration's own processes do not explain: {:+.1} % (a phase above {:.0} % is warned about)\n",
                h.unattributed_share * 100.0,
                h.unattributed_warn * 100.0
            );
            text += &match h.reference_ns_per_op {
                Some(r) => format!(
                    "  host speed while calibrating: {r:.0} ns busy per round trip of the reference workload (a checked point that read its own has every CPU cost scaled by this over its reading)\n"
                ),
                None => "  no host speed reference in the costs file: checked points are not scaled\n".into(),
            };
        }
        None => {
            text += "no host-wide busy time in the costs file (format 1): the host centre's demand is node + client + softirq\n";
        }
    }
    match &costs.delay {
        Some(d) => {
            text += &format!(
                "delay per request at light load ({} closed-loop client in all; measured time per request less the model's own answer there): ",
                d.clients
            );
            text += &cost_lines(
                (d.local_ns, d.local_per_kb_ns),
                (d.miss_ns, d.miss_per_kb_ns),
                &d.fetch,
            );
            text += &format!(
                "\n  in the network as a delay centre per class (adds to R, to no utilisation); differences clamped to 0: {}\n",
                if d.clamped.is_empty() {
                    "none".to_string()
                } else {
                    d.clamped.join(", ")
                }
            );
        }
        None => {
            text += &format!(
                "no delay in the costs file (format {}): the delay centre is 0\n",
                costs.format
            );
        }
    }
    text
}

/// `local hit A us + B us/KB; miss +C us + D us/KB; fetch over T +E us + F us/KB…`: a
/// cost per request of each kind, as the costs file's `a + b·KB` lines (ns) give it.
fn cost_lines(
    local: (f64, f64),
    miss: (f64, f64),
    fetch: &[farside_coop::model::HostFetchCosts],
) -> String {
    let mut text = format!(
        "local hit {:.1} us + {:.2} us/KB; miss +{:.1} us + {:.2} us/KB",
        local.0 / 1e3,
        local.1 / 1e3,
        miss.0 / 1e3,
        miss.1 / 1e3,
    );
    for f in fetch {
        text += &format!(
            "; fetch over {} +{:.1} us + {:.2} us/KB",
            f.transport,
            f.ns / 1e3,
            f.per_kb_ns / 1e3
        );
    }
    text
}

/// Each repeated cost's median and spread, one line per group (us; per KB in us/KB).
fn spread_lines(sp: &farside_coop::validate::Spread) -> String {
    let col = |f: &dyn Fn(&validate::CostSet) -> f64| -> String {
        let xs: Vec<f64> = sp.per_repeat.iter().map(f).collect();
        let m = validate::median(&xs).unwrap_or(f64::NAN);
        let (lo, hi) = validate::min_max(&xs).unwrap_or((f64::NAN, f64::NAN));
        format!("{:.2} [{:.2}, {:.2}]", m / 1e3, lo / 1e3, hi / 1e3)
    };
    let mut t = String::from("  spread of the repeats, median [lowest, highest], us or us/KB:\n");
    t += &format!(
        "  node CPU local hit {} + {}/KB; miss +{} + {}/KB; client {} + {}/KB\n",
        col(&|c| c.costs.cpu_request_ns as f64),
        col(&|c| c.costs.cpu_per_kb_ns as f64),
        col(&|c| c.costs.cpu_miss_ns as f64),
        col(&|c| c.costs.cpu_miss_per_kb_ns as f64),
        col(&|c| c.client_request_ns),
        col(&|c| c.client_per_kb_ns),
    );
    for (i, tr) in sp.low.transports.iter().enumerate() {
        let g = |f: fn(&validate::TransportCosts) -> f64| {
            move |c: &validate::CostSet| c.transports.get(i).map_or(f64::NAN, f)
        };
        t += &format!(
            "  fetch over {}: initial +{} + {}/KB, service {} + {}/KB\n",
            tr.transport,
            col(&g(|x| x.initial_ns)),
            col(&g(|x| x.initial_per_kb_ns)),
            col(&g(|x| x.service_ns)),
            col(&g(|x| x.service_per_kb_ns)),
        );
    }
    t += &format!(
        "  host-wide local hit {} + {}/KB; miss +{} + {}/KB\n",
        col(&|c| c.host_local_ns),
        col(&|c| c.host_local_per_kb_ns),
        col(&|c| c.host_miss_ns),
        col(&|c| c.host_miss_per_kb_ns),
    );
    for (i, f) in sp.low.host_fetch.iter().enumerate() {
        let g = |f: fn(&farside_coop::model::HostFetchCosts) -> f64| {
            move |c: &validate::CostSet| c.host_fetch.get(i).map_or(f64::NAN, f)
        };
        t += &format!(
            "  host-wide fetch over {}: +{} + {}/KB\n",
            f.transport,
            col(&g(|x| x.ns)),
            col(&g(|x| x.per_kb_ns)),
        );
    }
    t += &format!(
        "  directory build {}; disk access {} + {}/KB\n",
        col(&|c| c.costs.cpu_directory_build_ns as f64),
        col(&|c| c.disk_access_ns),
        col(&|c| c.disk_per_kb_ns),
    );
    t
}
