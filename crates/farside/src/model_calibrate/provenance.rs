//! What a costs file records of where it was measured: the load, the time, the commit,
//! kernel facts.

use std::path::Path;
use std::process::Command;

/// The host's 1-minute load average (0 if unreadable).
pub fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0.0)
}

/// The time now, UTC, ISO 8601.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d, hh, mm, ss) = farside_rt::clock::utc(secs);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

/// `git ARGS` in the source tree, trimmed (`unknown` if it fails).
pub fn git(args: &[&str]) -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    Command::new("git")
        .arg("-C")
        .arg(&repo)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// A file's text, trimmed (`unknown` if unreadable).
pub fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
