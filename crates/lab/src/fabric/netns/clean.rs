//! Removing what `--hosts netns` runs created: the state file each run writes before it
//! creates anything ([`RunState`]), and the clean-up of namespaces, their processes and
//! cgroups after a crash (`farside lab clean`, [`clean_all`]) or of stale runs.
use super::*;

/// What a run created (or is about to create); written to `/run/farside-lab/<run_id>.json`
/// before anything is created.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunState {
    pub run_id: String,
    pub owner_pid: u32,
    /// Start time (clock ticks since boot) of the owner, against pid reuse.
    pub owner_start: u64,
    /// Namespaces (bridge namespace first).
    pub namespaces: Vec<String>,
    /// `farside/<run_id>` directory in every cgroup hierarchy.
    pub cgroup_dirs: Vec<PathBuf>,
    /// Previous `net.ipv4.tcp_child_ehash_entries` while the run has it changed.
    pub ehash_prev: Option<String>,
    /// The run lowered (or is about to lower) the host's CFS bandwidth slice
    /// ([`SLICE_SYSCTL`]); the last such run to end restores it.
    #[serde(default)]
    pub cfs_slice_lowered: bool,
}

impl RunState {
    pub(super) fn owner_alive(&self) -> bool {
        process_start(self.owner_pid).is_some_and(|s| s == self.owner_start)
    }
}

/// What [`clean_all`] (or a teardown) removed.
#[derive(Debug, Default, Clone, Serialize)]
pub struct CleanReport {
    pub namespaces: Vec<String>,
    pub links: Vec<String>,
    pub cgroups: Vec<PathBuf>,
    pub state_files: Vec<PathBuf>,
    pub killed_pids: Vec<u32>,
    /// `net.ipv4.tcp_child_ehash_entries` restored to this value.
    pub sysctl_restored: Option<String>,
    /// `kernel.sched_cfs_bandwidth_slice_us` restored to this value.
    pub slice_restored: Option<u64>,
    pub errors: Vec<String>,
}

impl CleanReport {
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.links.is_empty()
            && self.cgroups.is_empty()
            && self.state_files.is_empty()
            && self.killed_pids.is_empty()
            && self.sysctl_restored.is_none()
            && self.slice_restored.is_none()
    }
}

impl fmt::Display for CleanReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() && self.errors.is_empty() {
            return writeln!(f, "lab clean: nothing to remove");
        }
        for p in &self.killed_pids {
            writeln!(f, "killed process {p}")?;
        }
        for n in &self.namespaces {
            writeln!(f, "removed namespace {n}")?;
        }
        for l in &self.links {
            writeln!(f, "removed link {l}")?;
        }
        for c in &self.cgroups {
            writeln!(f, "removed cgroup {}", c.display())?;
        }
        for s in &self.state_files {
            writeln!(f, "removed state file {}", s.display())?;
        }
        if let Some(v) = &self.sysctl_restored {
            writeln!(f, "restored net.ipv4.tcp_child_ehash_entries = {v}")?;
        }
        if let Some(v) = &self.slice_restored {
            writeln!(f, "restored kernel.sched_cfs_bandwidth_slice_us = {v}")?;
        }
        for e in &self.errors {
            writeln!(f, "error: {e}")?;
        }
        Ok(())
    }
}

/// Remove everything any `--hosts netns` run left behind (including runs that are still
/// active!): all `fs-*` namespaces and the processes in them, root-namespace links named
/// `fs-*`, the `farside/` cgroups in every hierarchy, and the state files (restoring the
/// TCP hash sysctl if a run crashed while it was changed). Idempotent.
pub fn clean_all() -> io::Result<CleanReport> {
    check_root(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
    )?;
    let mut r = CleanReport::default();
    let states = read_states(&mut r);
    if let Some(p) = states.iter().find_map(|(_, s)| s.ehash_prev.clone()) {
        match write_file(Path::new(EHASH_SYSCTL), &p, "restore") {
            Ok(()) => r.sysctl_restored = Some(p),
            Err(e) => r.errors.push(e.to_string()),
        }
    }
    for (_, s) in &states {
        clean_run(s, &mut r);
    }
    // Namespaces no state file names.
    for ns in list_netns()? {
        if ns.starts_with(NETNS_PREFIX) {
            remove_netns(&ns, &mut r);
        }
    }
    // Root-namespace links (the lab makes none; defensive).
    if let Ok(out) = ip(&["-o", "link", "show"]) {
        for l in out.lines() {
            let name = l.split(':').nth(1).map(str::trim).unwrap_or("");
            let name = name.split('@').next().unwrap_or("");
            if name.starts_with(NETNS_PREFIX) {
                match ip(&["link", "del", name]) {
                    Ok(_) => r.links.push(name.to_string()),
                    Err(e) => r.errors.push(e.to_string()),
                }
            }
        }
    }
    // Cgroups no state file names.
    if let Ok(hs) = cgroup_hierarchies() {
        for h in hs {
            let sub = h.subtree();
            if let Ok(rd) = fs::read_dir(&sub) {
                for e in rd.flatten() {
                    if e.path().is_dir() {
                        remove_run_cgroup(&e.path(), &mut r);
                    }
                }
            }
            if sub.exists() {
                match fs::remove_dir(&sub) {
                    Ok(()) => r.cgroups.push(sub),
                    Err(e) => r.errors.push(format!("rmdir {}: {e}", sub.display())),
                }
            }
        }
    }
    for (p, _) in states {
        match fs::remove_file(&p) {
            Ok(()) => r.state_files.push(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => r.errors.push(format!("remove {}: {e}", p.display())),
        }
    }
    // No run is left to hold the CFS slice lowered.
    release_slice(&mut r);
    Ok(r)
}

/// Remove what runs whose owner process is dead left behind (safe to call while other
/// runs are active, e.g. when a lab starts). Only runs with a state file are found.
pub fn clean_stale() -> io::Result<CleanReport> {
    check_root(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
    )?;
    let mut r = CleanReport::default();
    for (p, s) in read_states(&mut r) {
        if s.owner_alive() {
            continue;
        }
        if let Some(v) = &s.ehash_prev {
            match write_file(Path::new(EHASH_SYSCTL), v, "restore") {
                Ok(()) => r.sysctl_restored = Some(v.clone()),
                Err(e) => r.errors.push(e.to_string()),
            }
        }
        clean_run(&s, &mut r);
        match fs::remove_file(&p) {
            Ok(()) => r.state_files.push(p),
            Err(e) => r.errors.push(format!("remove {}: {e}", p.display())),
        }
    }
    // The CFS slice, unless a live run still holds it lowered.
    release_slice(&mut r);
    Ok(r)
}

/// Remove what one run (by run id) created, whether or not its owner is alive: what an
/// interrupted lab calls for its own run, leaving other runs alone.
pub fn clean_run_id(run_id: &str) -> io::Result<CleanReport> {
    check_root(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
    )?;
    let mut r = CleanReport::default();
    for (p, s) in read_states(&mut r) {
        if p.file_stem().is_none_or(|x| x != run_id) {
            continue;
        }
        if let Some(v) = &s.ehash_prev {
            match write_file(Path::new(EHASH_SYSCTL), v, "restore") {
                Ok(()) => r.sysctl_restored = Some(v.clone()),
                Err(e) => r.errors.push(e.to_string()),
            }
        }
        clean_run(&s, &mut r);
        match fs::remove_file(&p) {
            Ok(()) => r.state_files.push(p),
            Err(e) => r.errors.push(format!("remove {}: {e}", p.display())),
        }
    }
    // The CFS slice, unless a live run still holds it lowered.
    release_slice(&mut r);
    Ok(r)
}

/// The state files of all runs.
pub fn read_states(r: &mut CleanReport) -> Vec<(PathBuf, RunState)> {
    let mut v = Vec::new();
    let Ok(rd) = fs::read_dir(STATE_DIR) else {
        return v;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        match fs::read(&p)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<RunState>(&b).map_err(|e| e.to_string()))
        {
            Ok(s) => v.push((p, s)),
            Err(e) => {
                r.errors.push(format!("{}: {e} (removed)", p.display()));
                let _ = fs::remove_file(&p);
            }
        }
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Kill a run's processes, delete its namespaces and cgroups.
pub(super) fn clean_run(s: &RunState, r: &mut CleanReport) {
    // Processes first: cgroup members, then anything else inside the namespaces.
    for d in &s.cgroup_dirs {
        if d.exists() {
            remove_run_cgroup(d, r);
        }
    }
    for ns in s.namespaces.iter().rev() {
        remove_netns(ns, r);
    }
    // Cgroups again, in case a namespace process was in them.
    for d in &s.cgroup_dirs {
        if d.exists() {
            remove_run_cgroup(d, r);
        }
    }
}

pub(super) fn remove_netns(ns: &str, r: &mut CleanReport) {
    let path = netns_path_of(ns);
    let Ok(md) = fs::metadata(&path) else {
        return;
    };
    kill_netns_procs(md.ino(), r);
    match ip(&["netns", "del", ns]) {
        Ok(_) => r.namespaces.push(ns.to_string()),
        Err(e) => {
            if path.exists() {
                r.errors.push(e.to_string());
            }
        }
    }
}

/// SIGKILL every process (but this one) whose netns has inode `ino`.
pub(super) fn kill_netns_procs(ino: u64, r: &mut CleanReport) {
    let me = std::process::id();
    let want = format!("net:[{ino}]");
    let Ok(rd) = fs::read_dir("/proc") else {
        return;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if fs::read_link(e.path().join("ns/net")).is_ok_and(|l| l.as_os_str() == want.as_str()) {
            // SAFETY: kill has no memory-safety preconditions.
            if unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } == 0 {
                r.killed_pids.push(pid);
            }
        }
    }
}

/// Remove `farside/<run_id>` in one hierarchy: kill its processes, rmdir the node
/// cgroups and the run's.
pub(super) fn remove_run_cgroup(run: &Path, r: &mut CleanReport) {
    let mut dirs: Vec<PathBuf> = fs::read_dir(run)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    dirs.push(run.to_path_buf());
    for d in &dirs {
        kill_cgroup(d, r);
    }
    for d in &dirs {
        let deadline = Instant::now() + KILL_WAIT;
        loop {
            match fs::remove_dir(d) {
                Ok(()) => {
                    r.cgroups.push(d.clone());
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) if Instant::now() < deadline && e.raw_os_error() == Some(libc::EBUSY) => {
                    kill_cgroup(d, r);
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => {
                    r.errors.push(format!("rmdir {}: {e}", d.display()));
                    break;
                }
            }
        }
    }
}

/// SIGKILL a cgroup's processes: `cgroup.kill` (v2, also kills processes forked
/// meanwhile), then each pid `cgroup.procs` still lists.
pub(super) fn kill_cgroup(d: &Path, r: &mut CleanReport) {
    let kill = d.join("cgroup.kill");
    if kill.exists() {
        let _ = fs::write(kill, "1");
    }
    let me = std::process::id();
    if let Ok(s) = fs::read_to_string(d.join("cgroup.procs")) {
        for pid in s.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            if pid == me {
                continue;
            }
            // SAFETY: kill has no memory-safety preconditions.
            if unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } == 0
                && !r.killed_pids.contains(&pid)
            {
                r.killed_pids.push(pid);
            }
        }
    }
}

/// Restores the host's CFS bandwidth slice unless a live run (a state file marked
/// `cfs_slice_lowered` whose owner runs) still has it lowered; the caller has removed its
/// own run's state file. Records the restored value, or the error, in `r`.
pub(super) fn release_slice(r: &mut CleanReport) {
    let mut errors = Vec::new();
    let held = || {
        let mut scratch = CleanReport::default();
        let held = read_states(&mut scratch)
            .iter()
            .any(|(_, s)| s.cfs_slice_lowered && s.owner_alive());
        errors = scratch.errors;
        held
    };
    match super::slice::release(Path::new(STATE_DIR), held) {
        Ok(v) => r.slice_restored = r.slice_restored.or(v),
        Err(e) => r.errors.push(format!("the CFS bandwidth slice: {e}")),
    }
    r.errors.extend(errors);
}
