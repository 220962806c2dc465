//! `farside lab`: a virtual data-center on one machine that runs the papers' experiments
//! end to end and writes tables, `summary.json`, CSV series, plots and an HTML report.
//!
//! - [`admission`]: seed 000's admission-control experiment (`lab admission`)
//! - [`scenario`]: the situations `lab admission --scenario` builds (several proxies,
//!   tenant load, mixed request costs, a capacity change)
//! - [`haproxy`]: HAProxy as the `haproxy` system of `lab admission`
//! - [`envoy`]: Envoy's adaptive concurrency as the `envoy-ac` system of `lab admission`
//! - [`probe`]: the remote-read latency micro-benchmark (`lab probe`)
//! - [`faults`]: fault injection into a loaded tier (`lab faults`)
//! - [`reconfig`]: seed 001's reconfiguration experiment (`lab reconfig`)
//! - [`speculative`]: seed 002's speculative connection admission (`lab speculative`;
//!   first version: the baselines)
//! - [`coop`]: seed 003's cooperative caching on real nodes (`lab coop`: rr, PRESS
//!   over tcp, and the HAProxy + nginx anchor)
//! - [`attacks`]: the attack lab (`lab attacks`): two attackers against a loaded
//!   data-center, success judged by effect, collateral and the defender's CPU
//! - [`rdmahttp`]: seed 004's RDMA over HTTP (`lab rdma-http`: registration cost,
//!   retrieval time vs size and vs clients, idle and loaded)
//! - [`error`]: the lab's own failures ([`error::LabError`])
//! - [`fabric`]: what every experiment runs on: the nodes' processes
//!   ([`fabric::procs`]), the namespaces of `--hosts netns` ([`fabric::netns`]) and the
//!   one wait for a node to listen ([`fabric::wait_port`])
//! - [`nginx`]: real nginx as a back-end
//! - [`peak`]: raw peaks and peaks under a failure bound, for every experiment's report
//! - [`experiment`]: what an experiment is to the sweep runner and the report shell
//!   (its point type, how repeats combine, its tables, CSV files and figures)
//! - [`sweep`]: the one sweep runner every experiment uses (repeats, progress with ETA,
//!   `points.jsonl` appended per run, `--resume`, run metadata)
//! - [`summary`], [`report`], [`svg`]: the stable result format and the report shell
//!   (`farside lab report DIR` re-renders a kept run, [`regenerate_any`])
//! - [`book`]: the results book `docs/RESULTS.md` (`farside lab report --book`), one
//!   section per question with its current kept runs' tables ([`table_any`])
//!
//! A new experiment is a module of its own: its set-up and point function (it lists its
//! point keys and hands [`sweep::Sweep::run`] a closure that measures one) and an
//! implementation of [`experiment::Experiment`]; see `admission` and `probe`. It is
//! named here only, in [`LabCmd`], [`regenerate_any`] and [`table_any`].
//! User documentation: `farside lab <command> --help` and `docs/lab.md`.

pub mod admission;
pub mod attacks;
pub mod book;
pub mod coop;
pub mod echo;
pub mod envoy;
pub mod error;
pub mod experiment;
pub mod fabric;
pub mod faults;
pub mod flood;
pub mod haproxy;
pub mod nginx;
pub mod peak;
pub mod probe;
pub mod promtext;
pub mod rdmahttp;
pub mod reconfig;
pub mod report;
pub mod scenario;
pub mod speculative;
pub mod summary;
pub mod svg;
pub mod sweep;
pub mod table;

/// `farside lab`: the experiments.
#[derive(Debug, Clone, clap::Args)]
pub struct LabArgs {
    #[command(subcommand)]
    pub cmd: LabCmd,
}

/// The lab's commands.
#[derive(Debug, Clone, clap::Subcommand)]
// Parsed once per process: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum LabCmd {
    /// Admission control: no-ac vs tcp-ac vs onesided-ac (and HAProxy) over a sweep of
    /// loads (closed and open loop), traces (seed 000, Fig. 5/9/10) and scenarios.
    Admission(admission::AdmissionArgs),
    /// Latency of one-sided vs two-sided reads of a back-end's region under rising
    /// background CPU load (seed 000 Fig. 4, seed 001 Fig. 5-6).
    Probe(probe::ProbeArgs),
    /// Fault injection into a loaded tier: gatherd restart, back-end stop and kill,
    /// proxy restart (drain) and reload; answered / refused / failed / hung requests
    /// and time to a fresh view per fault.
    Faults(faults::FaultsArgs),
    /// Seed 001's shared data-center: rigid vs overprovisioned vs reconf (balancers in
    /// the proxies move back-end nodes between sites by remote CAS) under bursts of
    /// requests to one site after another (Fig. 7-9); needs root (netns).
    Reconfig(reconfig::ReconfigArgs),
    /// Seed 002's speculative connection admission: a single server with accept queues
    /// 64/96/128 and two servers behind the blind eBPF front-end at 67/33 and 75/25,
    /// conn/s vs offered connection rate (Fig. 1-3), normal processing (accN) vs
    /// speculative admission (spec32, spec50: `farside specd` on both back-ends); needs
    /// root (netns).
    Speculative(speculative::SpeculativeArgs),
    /// Attack lab: an attacker on the cluster side and one on the client side try every
    /// known attack (specd offers, front-end MOVE and flow table, one-sided memory,
    /// local files) against a loaded data-center; per attack: succeeded (by its
    /// effect), legitimate connections lost and requests failed, the defenders' CPU;
    /// needs root (netns).
    Attacks(attacks::AttacksArgs),
    /// Seed 003's cooperative caching (PRESS): rr (each node caches alone), press-tcp
    /// (nodes fetch from peers' caches over TCP) and haproxy (URL hashing with bounded
    /// load over nginx proxy_cache) on World Cup files, closed and open loop, 2-8 netns
    /// nodes, links shaped by tc tbf, every body checked; needs root.
    Coop(coop::CoopLabArgs),
    /// Seed 004's RDMA over HTTP: Table 1 (registration cost vs size, per strategy),
    /// Fig. 3 (one client, retrieval time vs size) and Fig. 4 (1 to 15 clients, five
    /// 1 MB files each), idle and loaded (two CPU hogs on the server's CPU), for tcp and
    /// software iWARP with static, dynamic and cached registration; needs root (netns).
    RdmaHttp(rdmahttp::RdmaHttpArgs),
    /// Re-render the table, CSV files, plots and report.html of a kept run from its
    /// summary.json and points.jsonl, without running anything.
    Report(ReportArgs),
    /// Remove everything `--hosts netns` runs left behind (namespaces, links, cgroups,
    /// state files), e.g. after a crash; needs root. It removes runs that are still
    /// running too (their processes are killed): not while an experiment runs.
    Clean,
}

/// `farside lab report DIR`, or `farside lab report --book`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// A lab output directory (with summary.json and points.jsonl).
    #[arg(required_unless_present = "book")]
    pub dir: Option<std::path::PathBuf>,
    /// Generate the results book, docs/RESULTS.md: one section per paper figure or claim
    /// and per anchor comparison, each with its current kept runs' tables (rendered from
    /// their summary.json and points.jsonl, nothing written into them), the command that
    /// prints each again and the hand-written text of docs/book/<section>.md (question,
    /// reading, what falls short). Which kept runs are current is the list in
    /// crates/lab/src/book.rs.
    #[arg(long, conflicts_with = "dir")]
    pub book: bool,
    /// With --book: write nothing, exit with an error if docs/RESULTS.md differs from
    /// what the kept files give.
    #[arg(long, requires = "book")]
    pub check: bool,
    /// With --book: print one section (by its name, e.g. `read-floor`) to stdout.
    #[arg(long, requires = "book", value_name = "NAME")]
    pub section: Option<String>,
    /// With --book: the repository (default: the nearest directory at or above the
    /// current one holding docs/book/intro.md).
    #[arg(long, requires = "book", value_name = "DIR")]
    pub root: Option<std::path::PathBuf>,
}

use experiment::Experiment as _;

/// Run a `farside lab` command.
pub fn run(a: LabArgs) -> std::io::Result<()> {
    fabric::procs::install_interrupt_handler()?;
    let r = run_cmd(a);
    if r.is_err() && fabric::procs::interrupted() {
        // The interrupt handler is cleaning up and will exit with 130; the error is a
        // consequence of that clean-up (children killed), not news.
        loop {
            std::thread::park();
        }
    }
    r
}

/// Re-render every output of the kept run in `dir` (`farside lab report DIR`) and print
/// its table to `w`; the experiment is the one its `summary.json` names. Returns the
/// files written.
pub fn regenerate_any(
    dir: &std::path::Path,
    w: &mut impl std::io::Write,
) -> std::io::Result<Vec<std::path::PathBuf>> {
    fn render<E: experiment::Experiment>(
        dir: &std::path::Path,
        w: &mut impl std::io::Write,
    ) -> std::io::Result<Vec<std::path::PathBuf>> {
        let (s, files) = sweep::regenerate::<E>(dir)?;
        report::print_table::<E>(&s, w)?;
        Ok(files)
    }
    let kept: summary::Summary<serde::de::IgnoredAny> = sweep::read_summary(dir)?;
    match kept.experiment.as_str() {
        admission::Admission::NAME => render::<admission::Admission>(dir, w),
        probe::Probe::NAME => render::<probe::Probe>(dir, w),
        faults::Faults::NAME => render::<faults::Faults>(dir, w),
        reconfig::Reconfig::NAME => render::<reconfig::Reconfig>(dir, w),
        speculative::Speculative::NAME => render::<speculative::Speculative>(dir, w),
        attacks::Attacks::NAME => render::<attacks::Attacks>(dir, w),
        attacks::flood::AttacksFlood::NAME => render::<attacks::flood::AttacksFlood>(dir, w),
        rdmahttp::RdmaHttp::NAME => render::<rdmahttp::RdmaHttp>(dir, w),
        coop::Coop::NAME => render::<coop::Coop>(dir, w),
        other => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{}: unknown experiment {other:?} (not a lab output directory?)",
                dir.join(sweep::SUMMARY_FILE).display()
            ),
        )),
    }
}

/// The table `farside lab report DIR` prints for the kept run in `dir` (run lines and
/// the experiment's tables), rendered from its files without writing any.
pub fn table_any(dir: &std::path::Path) -> std::io::Result<String> {
    fn table<E: experiment::Experiment>(dir: &std::path::Path) -> std::io::Result<String> {
        Ok(report::table_text::<E>(&sweep::load::<E::Point>(dir)?))
    }
    let kept: summary::Summary<serde::de::IgnoredAny> = sweep::read_summary(dir)?;
    match kept.experiment.as_str() {
        admission::Admission::NAME => table::<admission::Admission>(dir),
        probe::Probe::NAME => table::<probe::Probe>(dir),
        faults::Faults::NAME => table::<faults::Faults>(dir),
        reconfig::Reconfig::NAME => table::<reconfig::Reconfig>(dir),
        speculative::Speculative::NAME => table::<speculative::Speculative>(dir),
        attacks::Attacks::NAME => table::<attacks::Attacks>(dir),
        attacks::flood::AttacksFlood::NAME => table::<attacks::flood::AttacksFlood>(dir),
        rdmahttp::RdmaHttp::NAME => table::<rdmahttp::RdmaHttp>(dir),
        coop::Coop::NAME => table::<coop::Coop>(dir),
        other => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{}: unknown experiment {other:?} (not a lab output directory?)",
                dir.join(sweep::SUMMARY_FILE).display()
            ),
        )),
    }
}

/// `farside lab report --book [--check] [--section NAME] [--root DIR]`.
fn run_book(x: &ReportArgs) -> std::io::Result<()> {
    let root = match &x.root {
        Some(r) => r.clone(),
        None => book::find_root(&std::env::current_dir()?)?,
    };
    let render: book::RenderRun = &|d| table_any(d);
    if let Some(name) = &x.section {
        print!("{}", book::section(&root, name, render)?);
        return Ok(());
    }
    let text = book::render(&root, render)?;
    let path = root.join(book::BOOK_FILE);
    if x.check {
        let kept = std::fs::read_to_string(&path).unwrap_or_default();
        if kept != text {
            return Err(std::io::Error::other(format!(
                "{} differs from what the kept files and docs/book give: run `farside lab \
                 report --book` and commit the result",
                path.display()
            )));
        }
        eprintln!("lab report --book: {} is current", path.display());
        return Ok(());
    }
    std::fs::write(&path, &text)?;
    eprintln!(
        "lab report --book: wrote {} ({} lines)",
        path.display(),
        text.lines().count()
    );
    Ok(())
}

fn run_cmd(a: LabArgs) -> std::io::Result<()> {
    match a.cmd {
        LabCmd::Admission(x) => admission::Admission::run(x),
        LabCmd::Probe(x) => probe::Probe::run(x),
        LabCmd::Faults(x) => faults::Faults::run(x),
        LabCmd::Reconfig(x) => reconfig::Reconfig::run(x),
        LabCmd::Speculative(x) => speculative::Speculative::run(x),
        LabCmd::Attacks(x) => attacks::Attacks::run(x),
        LabCmd::Coop(x) => coop::Coop::run(x),
        LabCmd::RdmaHttp(x) => rdmahttp::RdmaHttp::run(x),
        LabCmd::Report(x) if x.book => run_book(&x),
        LabCmd::Report(x) => {
            let dir = x.dir.as_deref().expect("clap: DIR unless --book");
            let files = regenerate_any(dir, &mut std::io::stdout())?;
            eprintln!(
                "lab report: wrote {} files to {}",
                files.len(),
                dir.display()
            );
            Ok(())
        }
        LabCmd::Clean => {
            print!("{}", fabric::netns::clean_all()?);
            Ok(())
        }
    }
}
