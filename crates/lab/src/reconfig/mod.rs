//! `farside lab reconfig`: seed 001's reconfiguration experiment.
//!
//! A shared data-center of N back-end nodes (N = the scenario's sum: `3:3:2` and
//! `2:2:2:2` are 8) hosting several sites, each node in its own network namespace (or,
//! `--hosts loopback`, as processes on 127.0.0.1: [`loopback`]) and cgroup with a CPU
//! quota (`--node-cpu-pct`; default: the back-ends together get half of
//! the machine's CPUs, each node an equal share, so nodes saturate independently). Every
//! node runs `farside backend --sites-root DIR --site S --control SOCK` (DIR holds one
//! directory per site with a 1 KiB file, the paper's 1 KB files; `--cpu-us-per-request`
//! emulates a costlier server, as Apache was on the paper's nodes) and `farside gatherd`
//! with the node agent (`--role-backend-control SOCK --role-sites s0,s1,..
//! --role-initial i --rw-key KEY`), `--cgroup` at the node's cgroup so the load it
//! publishes is the node's own, and the region served over `--transport`: `xdp` (udp
//! answered by XDP in the node's kernel: one-sided) or `tcp` (gatherd's user-space tcp
//! server: two-sided, it needs the node's CPU, which the loaded nodes are short of); on
//! loopback `shm` (one-sided on one host), `tcp` or `udp`.
//!
//! `--proxies` proxies (`p0`, `p1`, ..) share the client load; each has a `[[sites]]`
//! entry per site (hosts `s0.example`, ..; anchor: the site's first node) and, for the
//! `reconf` system, `[reconf]` with every balancer's region. Their TOML is written to
//! `configs/` in the output directory.
//!
//! Systems:
//! - `rigid`: the scenario's static allocation (sites get consecutive nodes in ratio
//!   order), no `[reconf]`.
//! - `overprovisioned`: the loaded site statically has N − (sites − 1) nodes. The
//!   loaded site changes every burst, so before each burst the lab itself moves every
//!   non-anchor node to the burst's site by remote CAS on `ROLE_WANTED` and waits until
//!   every proxy routes to them; that set-up time is not counted in the TPS (the best
//!   static case, which a real data-center pays for with that many nodes per site).
//! - `reconf`: starts as `rigid`; the proxies' balancers move nodes (`[reconf]`).
//!
//! Load: bursts of L requests to one site (the Host header), then L to the next, cycling
//! over the sites `--cycles` times (`sites × cycles` bursts per point), run as one
//! closed-loop loadgen per proxy in parallel (`--clients` split over them, L split
//! likewise). A point is (system, scenario, L); its `tps` = requests served / the summed
//! wall time of its bursts. Moves: the proxies' `farside_reconf_moves_total` (summed);
//! switching time: from a balancer's move CAS to the node's first request served in the
//! new role, and decision-to-move latency, both joined per move from the processes' logs
//! ([`timing`]); the agents' apply time: the gatherds' `farside_gatherd_role_switch_ms`
//! histogram over the point (new wanted value seen → served, drain included), p50/p99
//! interpolated. Figures: [`figures`] (Fig. 7-9). `--sweep-t` sweeps T. Every
//! [`SERIES_EVERY`] the lab reads proxy `p0`'s `farside_proxy_site_backends{site}` for
//! the loaded site: the nodes serving it over time (Fig. 8/9), kept in the point.
//! Every point starts from fresh processes (allocation, balancer history and metrics
//! reset); the namespaces are built once per run.

use std::fmt::Write as _;
use std::io;

pub mod figures;
mod lab;
pub mod loopback;
mod plan;
mod point;
mod report;
#[cfg(test)]
mod tests;
pub mod timing;

use lab::{measure, start_lab, Lab};
pub use plan::*;
pub use point::*;
pub use report::*;

/// Run `farside lab reconfig`.
pub fn run(a: ReconfigArgs) -> io::Result<()> {
    let plan = check_args(&a)?;
    if !plan.loopback {
        // SAFETY: geteuid has no preconditions.
        crate::fabric::netns::check_root(unsafe { libc::geteuid() }).map_err(|_| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                "lab reconfig --hosts netns needs root: it builds a network namespace and a \
                 cgroup with a CPU quota per node, and attaches XDP (or use --hosts loopback)",
            )
        })?;
    } else if a.node_cpu_pct.is_some() && !crate::fabric::netns::is_root() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "--node-cpu-pct with --hosts loopback needs root (a cgroup per node)",
        ));
    }
    let dir = a.sweep.dir(&a.out);
    let mut meta = crate::summary::Summary::new("reconfig", a.hosts.as_str(), a.sweep.quick);
    crate::sweep::fill_host_metadata(&mut meta);
    let nodes_n = plan
        .scenarios
        .iter()
        .map(|(_, r)| r.iter().sum::<usize>())
        .max()
        .unwrap_or(0);
    let sites_n = plan
        .scenarios
        .iter()
        .map(|(_, r)| r.len())
        .max()
        .unwrap_or(0);
    meta.params = serde_json::json!({
        "systems": plan.systems,
        "scenarios": plan.scenarios.iter().map(|(s, _)| s.clone()).collect::<Vec<_>>(),
        "bursts": plan.bursts,
        "cycles": a.cycles,
        "clients": a.clients,
        "proxies": a.proxies,
        "node_cpu_pct": a.node_cpu_pct,
        "transport": plan.transport.name(),
        "hosts": a.hosts,
        "sensitivity_ms": a.sensitivity_ms,
        "history_ms": plan.history_ms,
        "sweep_t": !a.sweep_t.is_empty() || plan.history_ms.len() > 1,
        "lease_ms": a.lease_ms,
        "high_pct": a.high_pct,
        "spare_pct": a.spare_pct,
        "backend_workers": a.backend_workers,
        "cpu_us_per_request": a.cpu_us_per_request,
        "file_bytes": FILE_BYTES,
        "series_every_ms": SERIES_EVERY.as_millis() as u64,
        "tps": "requests served / summed wall time of the point's bursts",
    });
    if a.repeat > 1 {
        // Only when repeated, so that single runs keep the parameters of the runs kept
        // before --repeat (and --resume of them still matches).
        meta.params["repeat"] = a.repeat.into();
    }
    let mut sweep = crate::sweep::Sweep::<Reconfig>::start(&dir, meta, a.sweep.resume.is_some())?;
    let keys = point_keys(&plan, &plan.history_ms);
    let mut lab: Option<Lab> = None;
    let mut notes = Vec::new();
    // A rough per-point estimate for the ETA: every site's burst at ~500 requests/s,
    // plus the tier's start.
    let est = |k: &Key| {
        let sites = k.scenario.split(':').count() as f64;
        sites * a.cycles as f64 * k.burst as f64 / 500.0 + 10.0
    };
    let est_run_s = keys.iter().map(est).sum::<f64>() / keys.len().max(1) as f64;
    let result = sweep.run(
        &keys,
        a.repeat,
        est_run_s,
        |k: &Key| {
            format!(
                "{} {} L={}",
                label(&k.system, k.history_ms),
                k.scenario,
                k.burst
            )
        },
        |k, _| {
            if lab.is_none() {
                lab = Some(start_lab(&a, &plan, &dir, nodes_n, &mut notes, sites_n)?);
            }
            let l = lab.as_ref().expect("started above");
            let ratio = plan
                .scenarios
                .iter()
                .find(|(s, _)| *s == k.scenario)
                .map(|(_, r)| r.clone())
                .expect("keys come from the plan");
            measure(l, &a, plan.transport, k, &ratio)
        },
    );
    drop(lab);
    for n in notes {
        sweep.note(n)?;
    }
    sweep.note(
        "overprovisioned: before each burst the lab moves every non-anchor node to the \
         burst's site by remote CAS and waits until the proxies route to them; that time \
         is not counted"
            .into(),
    )?;
    result?;
    sweep.finish()?;
    Ok(())
}

/// `lab reconfig` as the sweep runner and the report shell see it.
pub struct Reconfig;

impl crate::experiment::Experiment for Reconfig {
    const NAME: &'static str = "reconfig";
    type Args = ReconfigArgs;
    type Point = ReconfigPoint;

    fn run(args: ReconfigArgs) -> io::Result<()> {
        run(args)
    }

    fn table(s: &crate::summary::Summary<ReconfigPoint>) -> String {
        let points: Vec<&ReconfigPoint> = s.points.iter().collect();
        if points.is_empty() {
            return String::new();
        }
        table(&points) + "\n"
    }

    fn files(s: &crate::summary::Summary<ReconfigPoint>) -> io::Result<Vec<(String, String)>> {
        let points: Vec<&ReconfigPoint> = s.points.iter().collect();
        if points.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = vec![
            ("reconfig.csv".to_string(), csv(&points)),
            (
                "table.txt".to_string(),
                crate::report::table_text::<Reconfig>(s),
            ),
        ];
        out.extend(points.iter().map(|p| series_csv(p)));
        Ok(out)
    }

    fn figures(s: &crate::summary::Summary<ReconfigPoint>) -> Vec<crate::experiment::Figure> {
        let points: Vec<&ReconfigPoint> = s.points.iter().collect();
        figures::figures(&points)
    }

    fn html(s: &crate::summary::Summary<ReconfigPoint>) -> String {
        let points: Vec<&ReconfigPoint> = s.points.iter().collect();
        if points.is_empty() {
            return String::new();
        }
        format!(
            "<h2>Reconfiguration</h2>\n<pre>{}</pre>\n",
            crate::svg::escape(&table(&points))
        )
    }
}
