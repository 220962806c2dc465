//! The one sweep runner of every `farside lab` experiment.
//!
//! An experiment is its own set-up and a *point function*; everything else is here:
//!
//! - **points and repeats**: the experiment lists its point keys (any `Serialize` value,
//!   e.g. `{system, trace, limit, clients}`); every key is run `repeat` times and the
//!   runs are combined ([`LabPoint::combine`]: means, sums, standard deviations; an
//!   admission point's times and percentiles from the exact merge of the runs' loadgen
//!   summaries, which each record keeps);
//! - **progress**: one line per run with the runs done, elapsed time and an ETA from the
//!   runs measured so far;
//! - **append to disk**: each run is appended to `points.jsonl` ([`Record`], one JSON
//!   object a line, the point's extras such as series and per-request samples included) as
//!   soon as it finishes, so
//!   a broken sweep loses at most the run in progress;
//! - **resume**: [`Sweep::start`] with `resume` reads `summary.json` and `points.jsonl`
//!   back, refuses if the effective settings differ, and [`Sweep::run`] skips the runs
//!   already on disk;
//! - **metadata**: `summary.json` is written at the start (`finished: false`) with the
//!   commit, kernel, CPU model, effective settings (`params`), seed and privileged
//!   settings (`settings`), then rewritten when the sweep ends;
//! - **outputs**: [`Sweep::finish`] and `farside lab report DIR` both call
//!   [`regenerate`], which rebuilds the summary from the two files and renders the
//!   table, CSV, plots and `report.html` (the report shell, [`crate::report`], with the
//!   experiment's parts): what a run printed can always be re-derived from what it kept.
//!
//! The runner is generic over the [`Experiment`]: it names none.
//!
//! A point function gets the key and the repeat index and returns the measured point;
//! state it needs across points (a running tier, background load) lives in its closure
//! and is set up lazily, so a resumed sweep starts exactly what its remaining points need.

use crate::experiment::{Experiment, LabPoint};
use crate::fabric::quiet::Start;
use crate::report;
use crate::summary::Summary;
use serde::{Deserialize, Serialize};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The appended results of a sweep, one [`Record`] a line.
pub const POINTS_FILE: &str = "points.jsonl";
/// The sweep's metadata (and, once finished, its combined points).
pub const SUMMARY_FILE: &str = "summary.json";

/// One finished run of one point: a line of `points.jsonl`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(bound = "P: LabPoint")]
pub struct Record<P: LabPoint> {
    /// The point's key as the experiment gave it.
    pub key: serde_json::Value,
    /// Repeat index, 0-based.
    pub run: u32,
    /// The measured point (without its extras: they follow).
    pub point: P,
    /// What the point keeps beside it ([`LabPoint::Extra`]: an admission point's series,
    /// request samples and loadgen summary), as keys of the record.
    #[serde(flatten)]
    pub extra: P::Extra,
    /// CPU time the hypervisor took from this machine's CPUs while the run was measured
    /// (`/proc/stat` steal), so a run hit by the host shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steal: Option<Steal>,
    /// How the run started ([`Sweep::run_isolated`]): whether the system was empty, what
    /// the previous run left and how long it took to drain. Absent for experiments whose
    /// every point starts a fresh tier, and in runs kept before points were checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Start>,
}

/// CPU steal during one run: time the hypervisor ran something else on our virtual CPUs.
/// A run in which one CPU lost a visible share of its time is not comparable with the
/// others; the progress line and `farside lab report` say so.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Steal {
    /// Wall time of the run, s.
    pub wall_s: f64,
    /// Steal per CPU over the run, ms (index = CPU number).
    pub per_cpu_ms: Vec<f64>,
}

impl Steal {
    /// Whether the run is flagged: one CPU lost more than [`STEAL_FLAG_SHARE`] of the
    /// run and at least [`STEAL_FLAG_MIN_MS`] (steal is counted in 10 ms ticks, so a
    /// single tick in a short run is not a finding).
    pub fn flagged(&self) -> bool {
        self.max_share() > STEAL_FLAG_SHARE
            && self.per_cpu_ms.iter().any(|&v| v >= STEAL_FLAG_MIN_MS)
    }

    /// The largest share of one CPU's time stolen during the run (0..=1).
    pub fn max_share(&self) -> f64 {
        if self.wall_s <= 0.0 {
            return 0.0;
        }
        self.per_cpu_ms.iter().fold(0.0f64, |m, &v| m.max(v)) / 1e3 / self.wall_s
    }
}

/// A run whose most-robbed CPU lost more than this share of the run is flagged: 1% is
/// above what this class of VM loses in a quiet hour (the host's background).
pub const STEAL_FLAG_SHARE: f64 = 0.01;
/// Least steal of one CPU that flags a run, ms: five of the kernel's 10 ms ticks.
pub const STEAL_FLAG_MIN_MS: f64 = 50.0;

/// Steal time per CPU from a `/proc/stat` text, in USER_HZ ticks (`cpuN` lines, 8th
/// value). Empty if the kernel does not report steal.
pub fn steal_ticks_of(stat: &str) -> Vec<u64> {
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .filter_map(|l| l.split_whitespace().nth(8)?.parse().ok())
        .collect()
}

/// Measures [`Steal`] between `start` and `finish`.
struct StealMeter {
    t0: Instant,
    ticks: Vec<u64>,
}

impl StealMeter {
    fn start() -> StealMeter {
        StealMeter {
            t0: Instant::now(),
            ticks: read_steal_ticks(),
        }
    }

    fn finish(self) -> Option<Steal> {
        let now = read_steal_ticks();
        if now.is_empty() || now.len() != self.ticks.len() {
            return None;
        }
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        Some(Steal {
            wall_s: self.t0.elapsed().as_secs_f64(),
            per_cpu_ms: now
                .iter()
                .zip(&self.ticks)
                .map(|(a, b)| a.saturating_sub(*b) as f64 * 1e3 / hz)
                .collect(),
        })
    }
}

fn read_steal_ticks() -> Vec<u64> {
    std::fs::read_to_string("/proc/stat")
        .map(|s| steal_ticks_of(&s))
        .unwrap_or_default()
}

impl<P: LabPoint> Record<P> {
    /// A record of `point`, its extras moved out (they are not part of the point's JSON
    /// form).
    pub fn new(key: serde_json::Value, run: u32, mut point: P) -> Record<P> {
        let extra = point.take_extra();
        Record {
            key,
            run,
            point,
            extra,
            steal: None,
            start: None,
        }
    }

    /// The point with its extras back in place.
    pub fn into_point(self) -> P {
        let mut point = self.point;
        point.put_extra(self.extra);
        point
    }
}

/// A sweep in progress: its output directory, metadata and the runs on disk.
pub struct Sweep<E: Experiment> {
    dir: PathBuf,
    meta: Summary<E::Point>,
    done: Vec<Record<E::Point>>,
    file: std::fs::File,
    t0: Instant,
    /// Wall-clock seconds spent by earlier attempts of a resumed sweep.
    earlier_s: f64,
}

impl<E: Experiment> Sweep<E> {
    /// Start a sweep in `dir` with the metadata `meta` (no points; `params` must hold the
    /// effective settings). Fresh: writes `summary.json` and an empty `points.jsonl`
    /// (replacing a previous sweep's). `resume`: reads both back and refuses when
    /// `experiment`, `hosts`, `quick`, `seed` or `params` differ from the kept run.
    pub fn start(dir: &Path, mut meta: Summary<E::Point>, resume: bool) -> io::Result<Sweep<E>> {
        std::fs::create_dir_all(dir)?;
        meta.points.clear();
        meta.finished = false;
        let mut done = Vec::new();
        let mut earlier_s = 0.0;
        if resume {
            let kept: Summary<E::Point> = read_summary(dir)?;
            let diffs = settings_diff(&kept, &meta);
            if !diffs.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "--resume {}: the settings differ from the kept run ({}); run with the kept settings, or start a fresh sweep with --out",
                        dir.display(),
                        diffs.join("; ")
                    ),
                ));
            }
            if kept.commit != meta.commit || kept.commit_dirty != meta.commit_dirty {
                let line = format!(
                    "resumed with commit {} (dirty {:?}); the sweep began with {} (dirty {:?})",
                    meta.commit.as_deref().unwrap_or("unknown"),
                    meta.commit_dirty,
                    kept.commit.as_deref().unwrap_or("unknown"),
                    kept.commit_dirty
                );
                eprintln!("lab {}: warning: {line}", meta.experiment);
                meta.notes.push(line);
            }
            // Notes of the earlier attempts (floods, warnings) stay.
            let mut notes = kept.notes.clone();
            notes.retain(|n| !meta.notes.contains(n));
            notes.append(&mut meta.notes);
            meta.notes = notes;
            meta.started_unix_s = kept.started_unix_s;
            earlier_s = kept.duration_s;
            done = read_records(dir)?;
            eprintln!(
                "lab {}: resuming {}: {} run(s) already on disk",
                meta.experiment,
                dir.display(),
                done.len()
            );
        } else {
            let removed = remove_outputs(dir)?;
            if removed > 0 {
                eprintln!(
                    "lab {}: starting a fresh sweep in {}: removed {removed} output file(s) of the previous one (--resume DIR continues a sweep instead)",
                    meta.experiment,
                    dir.display()
                );
            }
        }
        let file = if resume {
            // A run cut off mid-line left a partial last line: end it, so the next record
            // starts on a line of its own (read_records skips the fragment).
            let path = dir.join(POINTS_FILE);
            let text = std::fs::read(&path).unwrap_or_default();
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?;
            if !text.is_empty() && !text.ends_with(b"\n") {
                f.write_all(b"\n")?;
            }
            f
        } else {
            std::fs::File::create(dir.join(POINTS_FILE))?
        };
        for (name, s) in &meta.settings {
            if !s.applied {
                eprintln!(
                    "lab {}: warning: {name} = {} not applied: {}",
                    meta.experiment,
                    s.requested,
                    s.reason.as_deref().unwrap_or("unknown reason")
                );
            }
        }
        let sweep = Sweep {
            dir: dir.to_path_buf(),
            meta,
            done,
            file,
            t0: Instant::now(),
            earlier_s,
        };
        sweep.write_meta()?;
        Ok(sweep)
    }

    /// The sweep's output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Add a note to the summary (kept on disk at once).
    pub fn note(&mut self, line: String) -> io::Result<()> {
        self.meta.notes.push(line);
        self.write_meta()
    }

    fn write_meta(&self) -> io::Result<()> {
        let mut m = self.meta.clone();
        m.duration_s = self.earlier_s + self.t0.elapsed().as_secs_f64();
        std::fs::write(self.dir.join(SUMMARY_FILE), m.to_json_pretty() + "\n")
    }

    /// Whether run `run` of `key` is on disk already.
    fn is_done(&self, key: &serde_json::Value, run: u32) -> bool {
        self.done.iter().any(|r| &r.key == key && r.run == run)
    }

    /// Run every key `repeat` times (skipping runs on disk), appending each run to
    /// `points.jsonl` and printing a progress line. `est_run_s` estimates one run before
    /// any has been measured; `label` names a key in progress lines. For experiments
    /// whose every point starts its own tier; one that reuses a tier between points uses
    /// [`Sweep::run_isolated`].
    pub fn run<K: Serialize>(
        &mut self,
        keys: &[K],
        repeat: u32,
        est_run_s: f64,
        label: impl Fn(&K) -> String,
        mut point: impl FnMut(&K, u32) -> io::Result<E::Point>,
    ) -> io::Result<()> {
        self.run_inner(keys, repeat, est_run_s, label, |k, r| {
            Ok((point(k, r)?, None))
        })
    }

    /// [`Sweep::run`] for experiments that reuse a tier between points: the point
    /// function first settles the tier (waits until it is empty, restarts it when it
    /// does not drain: [`crate::fabric::quiet`]) and returns how the point started with
    /// the point. The start is kept in the run's record (`start` in `points.jsonl`) and
    /// printed on the progress line; a run that did not start empty is warned about and
    /// noted in the summary (the note is re-derived from the records by [`load`]).
    pub fn run_isolated<K: Serialize>(
        &mut self,
        keys: &[K],
        repeat: u32,
        est_run_s: f64,
        label: impl Fn(&K) -> String,
        mut point: impl FnMut(&K, u32) -> io::Result<(E::Point, Start)>,
    ) -> io::Result<()> {
        self.run_inner(keys, repeat, est_run_s, label, |k, r| {
            let (p, s) = point(k, r)?;
            Ok((p, Some(s)))
        })
    }

    fn run_inner<K: Serialize>(
        &mut self,
        keys: &[K],
        repeat: u32,
        est_run_s: f64,
        label: impl Fn(&K) -> String,
        mut point: impl FnMut(&K, u32) -> io::Result<(E::Point, Option<Start>)>,
    ) -> io::Result<()> {
        let repeat = repeat.max(1);
        let keyed: Vec<serde_json::Value> = keys
            .iter()
            .map(|k| serde_json::to_value(k).map_err(io::Error::other))
            .collect::<io::Result<_>>()?;
        let total = keys.len() * repeat as usize;
        let todo = keyed
            .iter()
            .flat_map(|k| (0..repeat).map(move |r| (k, r)))
            .filter(|(k, r)| !self.is_done(k, *r))
            .count();
        eprintln!(
            "lab {}: {} point(s) x {repeat} run(s) = {total} runs, {todo} to measure, about {:.0} s; output in {}",
            self.meta.experiment,
            keys.len(),
            todo as f64 * est_run_s,
            self.dir.display()
        );
        let t0 = Instant::now();
        let mut measured = 0usize;
        let mut finished = total - todo;
        for (k, kv) in keys.iter().zip(&keyed) {
            for r in 0..repeat {
                if self.is_done(kv, r) {
                    continue;
                }
                let meter = StealMeter::start();
                let (p, start) = point(k, r)?;
                let steal = meter.finish();
                measured += 1;
                finished += 1;
                let per_run = t0.elapsed().as_secs_f64() / measured as f64;
                let eta = (total - finished) as f64 * per_run;
                let rep = if repeat > 1 {
                    format!(" run {}/{repeat}", r + 1)
                } else {
                    String::new()
                };
                let stolen = match &steal {
                    Some(s) if s.flagged() => format!(
                        " [host stole {:.1}% of a CPU: not comparable]",
                        s.max_share() * 100.0
                    ),
                    _ => String::new(),
                };
                let started = start
                    .as_ref()
                    .map(|s| format!(" [{}]", s.line()))
                    .unwrap_or_default();
                eprintln!(
                    "[{finished}/{total} {:>5.0}s eta {:>5.0}s] {}{rep} {}{stolen}{started}",
                    t0.elapsed().as_secs_f64(),
                    eta,
                    label(k),
                    p.progress_line()
                );
                let mut rec = Record::new(kv.clone(), r, p);
                rec.steal = steal;
                rec.start = start;
                if let Some(n) = rec.start.as_ref().and_then(|s| not_empty_note(kv, r, s)) {
                    eprintln!("lab {}: warning: {n}", self.meta.experiment);
                    if !self.meta.notes.contains(&n) {
                        self.meta.notes.push(n);
                    }
                }
                let mut line = serde_json::to_string(&rec).map_err(io::Error::other)?;
                line.push('\n');
                self.file.write_all(line.as_bytes())?;
                self.file.flush()?;
                self.done.push(rec);
                self.write_meta()?;
            }
        }
        Ok(())
    }

    /// Mark the sweep finished, then regenerate every output from the files on disk (as
    /// `farside lab report DIR` does) and print the table. Returns the combined summary.
    pub fn finish(mut self) -> io::Result<Summary<E::Point>> {
        self.meta.finished = true;
        self.write_meta()?;
        let (summary, files) = regenerate::<E>(&self.dir)?;
        report::print_table::<E>(&summary, &mut io::stdout())?;
        eprintln!(
            "lab {}: wrote {} files to {} (open report.html; `farside lab report {}` renders them again)",
            summary.experiment,
            files.len(),
            self.dir.display(),
            self.dir.display()
        );
        Ok(summary)
    }
}

/// Whether `name` is a file the lab writes into an output directory (and may remove).
fn is_output(name: &str) -> bool {
    matches!(
        name,
        SUMMARY_FILE | POINTS_FILE | "points.csv" | "probe.csv" | "report.html"
    ) || (name.starts_with("series-") && name.ends_with(".csv"))
        || (name.starts_with("fig-") && name.ends_with(".svg"))
}

/// Remove a previous sweep's outputs from `dir`, so no figure or series of another run
/// is left beside the new one; other files are kept. Returns how many were removed.
fn remove_outputs(dir: &Path) -> io::Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_file() && e.file_name().to_str().is_some_and(is_output) {
            std::fs::remove_file(e.path())?;
            n += 1;
        }
    }
    Ok(n)
}

/// Differences between the kept run's settings and `now`'s, as `key: kept → now`.
pub fn settings_diff<P, Q>(kept: &Summary<P>, now: &Summary<Q>) -> Vec<String> {
    let mut out = Vec::new();
    let mut cmp = |name: &str, a: serde_json::Value, b: serde_json::Value| {
        if a != b {
            out.push(format!("{name}: {a} → {b}"));
        }
    };
    cmp(
        "experiment",
        kept.experiment.clone().into(),
        now.experiment.clone().into(),
    );
    cmp("hosts", kept.hosts.clone().into(), now.hosts.clone().into());
    cmp("quick", kept.quick.into(), now.quick.into());
    cmp("seed", kept.seed.into(), now.seed.into());
    let empty = serde_json::Map::new();
    let a = kept.params.as_object().unwrap_or(&empty);
    let b = now.params.as_object().unwrap_or(&empty);
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for k in keys {
        let get = |m: &serde_json::Map<String, serde_json::Value>| {
            m.get(k.as_str())
                .cloned()
                .unwrap_or(serde_json::Value::Null)
        };
        cmp(k, get(a), get(b));
    }
    out
}

/// `summary.json` of `dir`, with a clear error when it is missing or unreadable.
pub fn read_summary<P: serde::de::DeserializeOwned>(dir: &Path) -> io::Result<Summary<P>> {
    let path = dir.join(SUMMARY_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{}: {e} (not a lab output directory?)", path.display()),
        )
    })?;
    Summary::from_json(&text).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

/// The records of `dir/points.jsonl`. A last line cut off by a crash is skipped with a
/// warning; a bad line elsewhere is an error naming it.
pub fn read_records<P: LabPoint>(dir: &Path) -> io::Result<Vec<Record<P>>> {
    let path = dir.join(POINTS_FILE);
    let f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    let lines: Vec<String> = io::BufReader::new(f).lines().collect::<io::Result<_>>()?;
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Record<P>>(line) {
            Ok(r) => out.push(r),
            // A line that does not end its object is a run cut off mid-write by a crash
            // (a resume then appended after it): that run is simply not done.
            Err(e) if !line.trim_end().ends_with('}') => eprintln!(
                "lab: warning: {}:{}: skipping a run cut off mid-write ({e})",
                path.display(),
                i + 1
            ),
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}:{}: {e}", path.display(), i + 1),
                ))
            }
        }
    }
    Ok(out)
}

/// The summary of `dir` with its points rebuilt from `points.jsonl`: runs of one key
/// combined, keys in order of first appearance. Without `points.jsonl` (a run kept by an
/// older lab) the points of `summary.json` are used as they are.
pub fn load<P: LabPoint>(dir: &Path) -> io::Result<Summary<P>> {
    let mut s = read_summary(dir)?;
    if !dir.join(POINTS_FILE).exists() {
        // A run kept before points.jsonl existed: its summary.json holds the combined
        // points (without series), which are all there is to render.
        return Ok(s);
    }
    let records = read_records(dir)?;
    let mut keys: Vec<&serde_json::Value> = Vec::new();
    for r in &records {
        if !keys.contains(&&r.key) {
            keys.push(&r.key);
        }
    }
    s.points = keys
        .iter()
        .map(|k| {
            let mut runs: Vec<&Record<P>> = records.iter().filter(|r| &r.key == *k).collect();
            runs.sort_by_key(|r| r.run);
            let points: Vec<P> = runs.into_iter().map(|r| r.clone().into_point()).collect();
            P::combine(&points)
        })
        .collect();
    for r in &records {
        if let Some(n) = r
            .start
            .as_ref()
            .and_then(|st| not_empty_note(&r.key, r.run, st))
        {
            if !s.notes.contains(&n) {
                s.notes.push(n);
            }
        }
        if let Some(st) = r.steal.as_ref().filter(|st| st.flagged()) {
            let note = format!(
                "run {} of {}: the host stole {:.1}% of a CPU during it (/proc/stat steal \
                 {:?} ms over {:.0} s): not comparable with the others",
                r.run + 1,
                r.key,
                st.max_share() * 100.0,
                st.per_cpu_ms
                    .iter()
                    .map(|v| v.round() as u64)
                    .collect::<Vec<_>>(),
                st.wall_s
            );
            // summary.json keeps the notes of an earlier rendering: once each.
            if !s.notes.contains(&note) {
                s.notes.push(note);
            }
        }
    }
    Ok(s)
}

/// The summary's note for run `run` of `key` when it did not start empty (`None` when
/// it did).
fn not_empty_note(key: &serde_json::Value, run: u32, s: &Start) -> Option<String> {
    (!s.started_empty).then(|| {
        format!(
            "run {} of {key} did not start empty ({}): it may carry the previous point's load",
            run + 1,
            s.line()
        )
    })
}

/// Re-render every output of `dir` from its `summary.json` and `points.jsonl` without
/// running anything (`farside lab report DIR`). Returns the summary and the files written.
pub fn regenerate<E: Experiment>(dir: &Path) -> io::Result<(Summary<E::Point>, Vec<PathBuf>)> {
    let s = load::<E::Point>(dir)?;
    let files = report::write_all::<E>(&s, dir)?;
    Ok((s, files))
}

/// Fill the host and source metadata of `s`: commit and dirty flag, kernel, CPU model,
/// CPUs.
pub fn fill_host_metadata<P>(s: &mut Summary<P>) {
    let (commit, dirty) = source_commit();
    s.commit = commit;
    s.commit_dirty = dirty;
    s.build = Some(build_profile().to_string());
    s.kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    s.cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| cpu_model_of(&t))
        .unwrap_or_else(|| "unknown".into());
    s.cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
}

/// The cargo profile this binary was built with: `"release"` without debug assertions,
/// else `"debug"` (the dev profile, opt-level 1).
pub fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// The first `model name` (x86) or `Model`/`Hardware` (arm) of a `/proc/cpuinfo` text.
pub fn cpu_model_of(cpuinfo: &str) -> Option<String> {
    for key in ["model name", "Model", "Hardware", "cpu model"] {
        if let Some(v) = cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        }) {
            return Some(v);
        }
    }
    None
}

/// The commit this binary was built from (compiled in by `build.rs`), and whether the
/// tree had uncommitted changes to tracked files. The dirty flag is read from the tree
/// now, so it is only known while the tree is still at the build's commit; once HEAD has
/// moved the build commit is recorded with `dirty` unknown (and a warning), never the
/// tree's newer commit. Without a build commit (no git at build time): the tree's, as
/// before.
fn source_commit() -> (Option<String>, Option<bool>) {
    let built = env!("FARSIDE_BUILD_COMMIT");
    let (now, dirty) = tree_commit();
    // Read in another checkout sharing the target dir (build.rs): not this build's.
    let (built_in, this) = (env!("FARSIDE_BUILD_TREE"), env!("CARGO_MANIFEST_DIR"));
    if built.is_empty() || !Path::new(built_in).eq(Path::new(this)) {
        return (now, dirty);
    }
    if now.as_deref() == Some(built) {
        return (now, dirty);
    }
    eprintln!(
        "lab: warning: this binary was built from {built}, the source tree is now at {}: \
         recording {built} (uncommitted changes at build time unknown)",
        now.as_deref().unwrap_or("unknown")
    );
    (Some(built.to_string()), None)
}

/// `git rev-parse HEAD` and `git status --porcelain` of the source tree this binary was
/// built from (its path is compiled in); `(None, None)` when that tree or git is gone.
fn tree_commit() -> (Option<String>, Option<bool>) {
    let tree = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(tree)
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let commit = git(&["rev-parse", "HEAD"]).map(|c| c.trim().to_string());
    let dirty = commit
        .as_ref()
        .and_then(|_| git(&["status", "--porcelain", "--untracked-files=no"]))
        .map(|s| !s.trim().is_empty());
    (commit, dirty)
}

#[cfg(test)]
mod tests;
