//! A per-connection trace (`farside specd --conn-trace PATH`): one JSON line for each
//! step specd took with a client's connection, so a client that saw something odd
//! (a first request unanswered, a reset) can be matched, by its address and port, to
//! what specd did with it.
//!
//! ```text
//! {"unix_ms":1795930522463,"client":"10.77.0.10:58578","step":"local.handed","us":1830}
//! ```
//!
//! Steps: on the source, `admitted.migrate|server|refuse` (the window's decision),
//! `migrated` (`us`: the migration's time) or `fell_back.<why>`; on either side, the
//! hand-off to the local web server (`local.` on the source, `restored.` on the
//! target): `handed` (passed at once, or after waiting `us` in the hand-off queue),
//! `queued`, `offered_on` (waited past the hand-off bound: offered to a peer),
//! `refused` (closed with a reset), `client_gone`, `failed`, `over_bound`.
//!
//! The trace is one file per process (a global, installed once by the CLI: the
//! daemon's source and target sides share it); without `--conn-trace` every record is
//! a no-op. Each line is written whole and flushed, so a reader sees whole lines
//! while the daemon runs; past [`TRACE_LINES_MAX`] lines are counted, not written.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// Most lines written: a line is about 90 bytes, so at most ~90 MB, a few hours of a
/// lab node's hundreds of connections a second; a daemon left tracing for days stops
/// writing rather than filling the disk.
pub const TRACE_LINES_MAX: u64 = 1_000_000;

struct Trace {
    out: Mutex<BufWriter<File>>,
    lines: AtomicU64,
}

static TRACE: OnceLock<Trace> = OnceLock::new();

/// Starts tracing to `path` (created or truncated). Once per process: a second call
/// is refused.
pub fn install(path: &Path) -> io::Result<()> {
    let f = File::create(path)
        .map_err(|e| io::Error::new(e.kind(), format!("--conn-trace {}: {e}", path.display())))?;
    TRACE
        .set(Trace {
            out: Mutex::new(BufWriter::new(f)),
            lines: AtomicU64::new(0),
        })
        .map_err(|_| io::Error::other("the connection trace is already installed"))
}

/// Whether a trace is being written (callers skip building a record otherwise).
pub fn on() -> bool {
    TRACE.get().is_some()
}

/// Records one step of the connection of `client` (`us`: a duration in µs, or 0).
pub fn record(client: Option<SocketAddr>, step: &str, us: u64) {
    let Some(t) = TRACE.get() else { return };
    if t.lines.fetch_add(1, Ordering::Relaxed) >= TRACE_LINES_MAX {
        return;
    }
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let client = client.map_or_else(|| "?".to_string(), |a| a.to_string());
    let line = line(unix_ms, &client, step, us);
    let mut out = t.out.lock().unwrap_or_else(|p| p.into_inner());
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

/// Lines past [`TRACE_LINES_MAX`] that were not written.
pub fn dropped() -> u64 {
    TRACE.get().map_or(0, |t| {
        t.lines
            .load(Ordering::Relaxed)
            .saturating_sub(TRACE_LINES_MAX)
    })
}

fn line(unix_ms: u64, client: &str, step: &str, us: u64) -> String {
    serde_json::json!({"unix_ms": unix_ms, "client": client, "step": step, "us": us}).to_string()
        + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_one_json_object_with_the_client_and_step() {
        let l = line(7, "10.0.0.1:5", "local.handed", 12);
        assert!(l.ends_with('\n') && l.matches('\n').count() == 1);
        let v: serde_json::Value = serde_json::from_str(l.trim()).unwrap();
        assert_eq!(v["client"], "10.0.0.1:5");
        assert_eq!(v["step"], "local.handed");
        assert_eq!(v["us"], 12);
        assert_eq!(v["unix_ms"], 7);
    }
}
