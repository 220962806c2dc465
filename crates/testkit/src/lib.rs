//! What farside's tests share: a **visible, counted skip**.
//!
//! Rust's test harness has no "skipped" outcome: a test that returns early because the
//! host lacks root, a tool or a file is reported as passed. Such a test calls [`skip`]
//! (or one of the `*_or_skip` checks) before returning, which
//!
//! - writes `SKIPPED <test>: <why>` straight to the stderr descriptor, past the
//!   harness's output capture, so the line shows in every run;
//! - appends `<test>\t<why>` to the file named by `FARSIDE_SKIP_LOG`, if set:
//!   `scripts/test.sh` sets it, subtracts the skips from the passed count and prints
//!   `N passed, N failed, N skipped` with every reason;
//! - panics instead when `FARSIDE_NO_SKIP` is set (CI as root, where the set-up
//!   installed every tool: a skip there is a broken set-up, not a pass).

use std::io::Write as _;

/// Environment variable naming the file skips are appended to.
pub const SKIP_LOG_ENV: &str = "FARSIDE_SKIP_LOG";
/// Environment variable that turns every skip into a failure.
pub const NO_SKIP_ENV: &str = "FARSIDE_NO_SKIP";

/// Record that `test` did not run, and why. The caller returns right after.
///
/// # Panics
/// When `FARSIDE_NO_SKIP` is set: the environment was meant to run every test.
pub fn skip(test: &str, why: &str) {
    record(
        test,
        why,
        std::env::var_os(SKIP_LOG_ENV).as_deref(),
        std::env::var_os(NO_SKIP_ENV).is_some(),
    );
}

/// [`skip`] with its environment passed in.
fn record(test: &str, why: &str, log: Option<&std::ffi::OsStr>, forbidden: bool) {
    let why = why.replace(['\n', '\t'], " ");
    if forbidden {
        panic!("{test} cannot run here ({why}) and {NO_SKIP_ENV} forbids skipping");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
    if let Some(path) = log {
        // One short line per write with O_APPEND: concurrent tests do not interleave.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(format!("{test}\t{why}\n").as_bytes());
        }
    }
}

/// Whether this process has root's effective user id.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// True when root; otherwise records a skip of `test` and returns false.
pub fn root_or_skip(test: &str) -> bool {
    if is_root() {
        return true;
    }
    skip(test, "needs root");
    false
}

/// True when `program` runs (`program <version_arg>` starts at all); otherwise records a
/// skip of `test` naming the Debian package that provides it, and returns false.
pub fn tool_or_skip(test: &str, program: &str, version_arg: &str, package: &str) -> bool {
    if std::process::Command::new(program)
        .arg(version_arg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
    {
        return true;
    }
    skip(
        test,
        &format!("{program} is not installed (apt-get install {package})"),
    );
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_appended_to_the_log_one_line_each() {
        let log = std::env::temp_dir().join(format!("farside-skip-{}", std::process::id()));
        let _ = std::fs::remove_file(&log);
        record("a", "needs root", Some(log.as_os_str()), false);
        record("b", "no\ttool\nhere", Some(log.as_os_str()), false);
        let text = std::fs::read_to_string(&log).unwrap();
        std::fs::remove_file(&log).unwrap();
        assert_eq!(text, "a\tneeds root\nb\tno tool here\n");
    }

    #[test]
    #[should_panic(expected = "forbids skipping")]
    fn a_skip_fails_where_skipping_is_forbidden() {
        record("a", "needs root", None, true);
    }

    #[test]
    fn a_tool_that_starts_is_no_skip() {
        assert!(tool_or_skip("t", "sh", "-c", "dash"));
    }
}
