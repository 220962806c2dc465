//! `farside`: the control layer of a cluster-based web data-center in which front-ends
//! read back-end state one-sidedly. One binary, one subcommand per role.

mod logging;
mod model;
mod model_calibrate;
mod trace_synth;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "farside", version, about, long_about = None, propagate_version = true)]
#[command(after_help = "Logging: set FARSIDE_LOG=error|warn|info|debug (default info).")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Back-end node: sample load every period and publish the node's region.
    Gatherd(GatherdCli),
    /// Front-end: HTTP reverse proxy with one-sided admission control and balancing.
    Proxy(farside_proxy::ProxyArgs),
    /// Stand-alone load monitor: poll every back-end's region and publish a shared table
    /// that proxies on this host read (`proxy --monitor-table`).
    Monitor(farside_proxy::MonitorArgs),
    /// Test web server: static files, CPU-costly dynamic endpoint, bounded workers.
    Backend(farside_backend::BackendArgs),
    /// Closed- and open-loop HTTP load generator with the papers' traces.
    Loadgen(farside_loadgen::LoadgenArgs),
    /// Blind front-end (seed 002): route TCP to a VIP to back-ends by weighted hash
    /// with an eBPF flow table (L2 direct server return); `--detach IF` cleans up.
    Frontend(farside_frontend::cli::FrontendArgs),
    /// Virtual data-center on this machine: run the papers' experiments end to end.
    Lab(farside_lab::LabArgs),
    /// Speculative-admission daemon of a back-end: migrates connections beyond its
    /// server's accept queue to the least-loaded peer, takes its peers' migrations.
    Specd(farside_specd::SpecdArgs),
    /// Software iWARP (seed 004): `decode FILE.pcap` prints its MPA/DDP/RDMAP messages.
    Iwarp(farside_iwarp::IwarpArgs),
    /// One HTTP GET, optionally with its body by RDMA (`--rdma server-writes|client-reads`).
    Get(farside_rdmahttp::GetArgs),
    /// Analytical models checked against the lab: `model coop` (cooperative caching).
    Model(model::ModelArgs),
    /// Traces: `trace synth` writes one fitted to a classic trace's published statistics.
    Trace(trace_synth::TraceArgs),
}

/// `farside gatherd`: its flags, and `--check`.
#[derive(clap::Args)]
struct GatherdCli {
    #[command(flatten)]
    args: farside_gatherd::GatherdArgs,
    /// Check the flags and exit: 0 with a one-line summary, or 2 with every error
    /// (bounds, --xdp-iface present in this network namespace and paired with a fixed
    /// --udp-listen port, --sampler kernel's needs). Loads no program, binds no socket,
    /// creates no file (deploy/farside-gatherd.service runs it before every start).
    #[arg(long)]
    check: bool,
}

/// Exit status of a `--check-config` / `--check` that found errors (as for a usage
/// error: the command line or file given is wrong, not the run).
const EXIT_INVALID_CONFIG: u8 = 2;

/// Print a check's outcome and turn it into the exit status.
fn report_check(what: &str, r: Result<String, Vec<String>>) -> ExitCode {
    match r {
        Ok(summary) => {
            println!("farside {what}: {summary}");
            ExitCode::SUCCESS
        }
        Err(errs) => {
            for e in &errs {
                eprintln!("farside {what}: {e}");
            }
            eprintln!("farside {what}: {} error(s)", errs.len());
            ExitCode::from(EXIT_INVALID_CONFIG)
        }
    }
}

fn main() -> ExitCode {
    logging::init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Gatherd(a) if a.check => return report_check("gatherd", check_gatherd(&a.args)),
        Cmd::Gatherd(a) => run_gatherd(a.args),
        Cmd::Proxy(a) if a.check_config.is_some() => {
            return report_check("proxy", farside_proxy::check_config(&a))
        }
        Cmd::Proxy(a) => farside_proxy::run(a),
        Cmd::Monitor(a) => {
            let signals = logging::block_termination_signals();
            farside_proxy::run_monitor(a, |limit| logging::wait_for_signal(&signals, limit))
        }
        Cmd::Backend(a) => farside_backend::run(a, None).map_err(|e| format!("backend: {e}")),
        Cmd::Loadgen(a) => run_loadgen(a),
        Cmd::Lab(a) => farside_lab::run(a).map_err(|e| format!("lab: {e}")),
        Cmd::Frontend(a) => {
            let signals = logging::block_termination_signals();
            farside_frontend::cli::run(a, |limit| logging::wait_for_signal(&signals, limit))
                .map_err(|e| format!("frontend: {e}"))
        }
        Cmd::Specd(a) => farside_specd::run(a).map_err(|e| format!("specd: {e}")),
        Cmd::Iwarp(a) => farside_iwarp::run(a).map_err(|e| format!("iwarp: {e}")),
        Cmd::Get(a) => farside_rdmahttp::run_get(a).map_err(|e| format!("get: {e}")),
        Cmd::Trace(a) => trace_synth::run(a),
        Cmd::Model(a) => match model::run(a) {
            Ok(true) => Ok(()),
            Ok(false) => Err("model: a configuration is outside the tolerance (FAIL above)".into()),
            Err(e) => Err(format!("model: {e}")),
        },
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("farside: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn run_gatherd(a: farside_gatherd::GatherdArgs) -> Result<(), String> {
    let signals = logging::block_termination_signals();
    let cpu0 = farside_gatherd::process_cpu_us();
    let t0 = std::time::Instant::now();
    let mut g = farside_gatherd::Gatherd::start(&a).map_err(|e| format!("gatherd: {e}"))?;
    log::info!(
        "gatherd: node {} every {} µs; shm={} tcp={} udp={}",
        a.node_id,
        a.period_us,
        g.shm_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "off".into()),
        g.tcp_addr
            .map(|x| x.to_string())
            .unwrap_or_else(|| "off".into()),
        g.udp_addr
            .map(|x| x.to_string())
            .unwrap_or_else(|| "off".into()),
    );
    logging::wait_for_signal(&signals, a.duration_s.map(Duration::from_secs_f64));
    g.stop();
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (farside_gatherd::process_cpu_us() - cpu0) as f64 / 1e6;
    log::info!(
        "gatherd: {}; own CPU {:.2}% of one core over {:.1} s",
        g.summary(),
        100.0 * cpu / wall,
        wall
    );
    // Drop the gatherer (its servers) before removing the shm path: with XDP that path
    // is the region-fd server's socket, which its drop connects to in order to wake its
    // accept loop (removing it first left gatherd hanging on SIGTERM).
    let shm_path = g.shm_path.clone();
    drop(g);
    if let Some(p) = shm_path {
        // Relative to the checked directory, and only if the entry is still ours.
        let _ = farside_rt::rundir::SafeDir::open_parent(&p).and_then(|(d, n)| d.remove_own(n));
    }
    Ok(())
}

/// `farside gatherd --check`: what `gatherd` would refuse at start (or silently
/// ignore: `--xdp-iface` without `--udp-listen`), found without starting anything.
fn check_gatherd(a: &farside_gatherd::GatherdArgs) -> Result<String, Vec<String>> {
    use farside_gatherd::{SamplerChoice, XdpChoice};
    let mut errs = Vec::new();
    if let Err(e) = a.validate() {
        errs.push(e);
    }
    if let Err(e) = a.role.validate() {
        errs.push(e);
    }
    let xdp = a
        .xdp_iface
        .as_deref()
        .filter(|_| a.xdp_mode != XdpChoice::Off);
    if let Some(ifname) = xdp {
        match a.udp_listen {
            None => errs.push(format!(
                "--xdp-iface {ifname}: needs --udp-listen IP:PORT (the port XDP answers)"
            )),
            Some(u) if u.port() == 0 => {
                errs.push("--xdp-iface needs a fixed --udp-listen port, not 0".into())
            }
            Some(_) => {}
        }
        let present = std::ffi::CString::new(ifname)
            // SAFETY: if_nametoindex reads a NUL-terminated string and nothing else.
            .map(|c| unsafe { libc::if_nametoindex(c.as_ptr()) } != 0)
            .unwrap_or(false);
        if !present {
            errs.push(format!(
                "--xdp-iface {ifname}: no such interface in this network namespace"
            ));
        }
    }
    if a.sampler == SamplerChoice::Kernel {
        if xdp.is_none() {
            errs.push("--sampler kernel: needs --xdp-iface (it writes the XDP region map)".into());
        }
        if a.cgroup.is_some() {
            errs.push("--sampler kernel: does not sample a --cgroup (use user or auto)".into());
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let off = || "off".to_string();
    let lower = |v: &dyn std::fmt::Debug| format!("{v:?}").to_lowercase();
    Ok(format!(
        "OK: node {} every {} µs, watching port(s) {:?}; udp {}{}, tcp {}, shm {}; sampler {}; metrics {}",
        a.node_id,
        a.period_us,
        a.watch_ports,
        a.udp_listen.map(|x| x.to_string()).unwrap_or_else(off),
        xdp.map(|i| format!(" answered by XDP on {i} ({} mode)", lower(&a.xdp_mode)))
            .unwrap_or_default(),
        a.tcp_listen.map(|x| x.to_string()).unwrap_or_else(off),
        a.shm_path()
            .map(|p| p.display().to_string())
            .unwrap_or_else(off),
        lower(&a.sampler),
        a.metrics_listen.map(|x| x.to_string()).unwrap_or_else(off),
    ))
}

fn run_loadgen(a: farside_loadgen::LoadgenArgs) -> Result<(), String> {
    if a.rdma.rdma.is_some() {
        return farside_loadgen::rdma::run_cli(&a)
            .map(|_| ())
            .map_err(|e| format!("loadgen --rdma: {e}"));
    }
    let s = farside_loadgen::run(&a).map_err(|e| format!("loadgen: {e}"))?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&s).map_err(|e| e.to_string())?
        );
    } else {
        farside_loadgen::print_summary(&s, &mut std::io::stdout()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn documented_command_lines_parse() {
        for line in [
            "farside lab admission --quick",
            "farside lab admission --systems no-ac,onesided-ac --traces single --clients 8,16 --out /tmp/x",
            "farside lab admission --limits 2,8,16 --proxy-arg=--pool-idle=0 --proxy-arg --stale-after-ms=50 --seed 7 --repeat 3",
            "farside lab admission --resume out/admission",
            "farside lab probe --hosts netns --repeat 2 --resume out/probe",
            "farside lab report out/admission",
            "farside proxy --listen 127.0.0.1:8000 --backend 127.0.0.1:8080",
            "farside proxy --listen 127.0.0.1:8000 --backend 127.0.0.1:8080,region=tcp:127.0.0.1:7001 --admission --metric backlog --limit 4 --pool-idle 0",
            "farside gatherd --node-id 1 --watch-port 8080 --tcp-listen 127.0.0.1:7001",
            "farside gatherd --node-id 1 --watch-port 80 --udp-listen 10.0.0.11:7000 --xdp-iface eth0 --check",
            "farside proxy --check-config /etc/farside/proxy.toml --monitor-nice 0",
            "farside monitor --backend 127.0.0.1:8080,region=tcp:127.0.0.1:7001 --table /tmp/t",
            "farside backend --listen 127.0.0.1:0 --workers 4 --cpu-us-per-request 100 --cpu-ns-per-byte 2.5",
            "farside loadgen --target 127.0.0.1:8000 --clients 4 --trace zipf",
            "farside frontend --iface eth0 --vip 10.0.0.100:80 --backend 02:00:00:00:00:0a@10.0.0.11=75 --backend 02:00:00:00:00:0b@10.0.0.12=25 --control 10.0.0.1:7400",
            "farside frontend --detach eth0",
            "farside iwarp decode capture.pcap",
            "farside model coop --costs c.json --runs docs/results/coop/a,docs/results/coop/b --out /tmp/m",
            "farside model coop --calibrate --out /tmp/m --no-extrapolate",
        ] {
            let args: Vec<&str> = line.split_whitespace().collect();
            if let Err(e) = Cli::try_parse_from(&args) {
                panic!("`{line}`: {e}");
            }
        }
    }
}
