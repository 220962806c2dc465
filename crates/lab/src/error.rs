//! The lab's own errors: what went wrong in a run, one variant per kind of failure.
//!
//! The lab's functions return `std::io::Result` (most failures are the system's: files,
//! sockets, processes); a failure of the lab's own making is a [`LabError`], carried
//! inside the `io::Error` (`io::Error::other`) with its message as the text, so callers
//! can still tell it apart (`io::Error::get_ref` and `downcast_ref`).

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// A failure of a lab run.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A node's process ended while the lab still needed it.
    #[error("{name} exited ({status}); log tail:\n{log_tail}")]
    Exited {
        /// The process's name in the run.
        name: String,
        /// How it ended.
        status: ExitStatus,
        /// The last lines of its log.
        log_tail: String,
    },
    /// nginx ended while it was starting.
    #[error("nginx exited during start ({status}); {log_tail}")]
    NginxExited {
        /// How it ended.
        status: ExitStatus,
        /// The last lines of its error log.
        log_tail: String,
    },
    /// Something the run waits for did not happen in time; the text says what.
    #[error("{0}")]
    NotReady(String),
    /// A node did not log its ready line in time.
    #[error("{name} did not log `{line}` within {within:?}; see {}", log.display())]
    NoReadyLine {
        /// The process's name in the run.
        name: String,
        /// The line it should have logged.
        line: &'static str,
        /// How long it had.
        within: Duration,
        /// Its log.
        log: PathBuf,
    },
    /// The clients (the loadgen) failed.
    #[error("loadgen: {0}")]
    Loadgen(#[from] farside_loadgen::LoadgenError),
    /// A remote-memory operation failed: `at` names the region (and the operation).
    #[error("{at}: {error}")]
    Rmem {
        /// The region or endpoint, and the operation when there is one.
        at: String,
        /// What the transport said.
        error: farside_rmem::RmemError,
    },
    /// A command the lab ran failed; `what` names it, `stderr` is what it said.
    #[error("{what}: {stderr}")]
    Command {
        /// The command (or what it was for).
        what: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// A namespace command failed.
    #[error("--hosts netns: `{line}` failed ({status}): {stderr}")]
    NetnsCommand {
        /// The command line.
        line: String,
        /// How it ended.
        status: ExitStatus,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// The namespaces of a run could not all be removed.
    #[error("--hosts netns: cleanup of run {run_id}: {errors}")]
    Cleanup {
        /// The run.
        run_id: String,
        /// What failed, `; `-separated.
        errors: String,
    },
    /// A device setting did not take.
    #[error("{what}: still on after the change")]
    StillOn {
        /// The device and setting.
        what: String,
    },
    /// A `/metrics` endpoint answered something else than metrics.
    #[error("{addr}/metrics: unexpected reply: {first_line}")]
    Metrics {
        /// The endpoint.
        addr: std::net::SocketAddr,
        /// The first line of its reply.
        first_line: String,
    },
    /// A specd summary file could not be read or parsed.
    #[error("specd summary {}: {error}", path.display())]
    SpecdSummary {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        error: String,
    },
    /// A node's link has no MAC address in `ip link`'s output.
    #[error("no MAC for {node}'s eth0 in: {link}")]
    NoMac {
        /// The node.
        node: String,
        /// `ip link`'s output.
        link: String,
    },
}

impl From<LabError> for std::io::Error {
    fn from(e: LabError) -> std::io::Error {
        std::io::Error::other(e)
    }
}
