//! Bench: migrate many real TCP connections between network
//! namespaces and check every byte. Root only (netns, TCP_REPAIR).
//!
//! ```text
//! cargo run --release -p farside-migrate --example migrate_many -- \
//!     --connections 10000 [--concurrency 16] [--small] [--auth] [--out FILE] \
//!     [--conn-timeout-s 30] [--deadline-s 3600]
//! ```
//!
//! How it works and what each figure means: `farside_migrate::testkit::many`.
//! Prints the JSON report on stdout (and writes it to `--out`), progress every
//! 1,000 connections on stderr. Exits 1 if a byte was lost or duplicated, a
//! connection was lost or failed, or a flow rule was left behind. SIGINT/SIGTERM
//! stop starting connections; the namespaces are removed in every case but SIGKILL
//! (then: `ip netns del mm<pid>{c,a,b}`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use farside_migrate::testkit::many::{self, ManyConfig, CONCURRENCY_MAX};

const USAGE: &str = "\
usage: migrate_many [--connections N] [--concurrency K] [--small] [--auth]
                    [--out FILE] [--conn-timeout-s S] [--deadline-s S]

Migrates N real TCP connections (client namespace -> source back-end namespace,
moved mid-stream to the target back-end namespace with ControlPool::migrate_with,
one reused control connection per lane, CloseAfterRestore, one policy rule per
flow) and checks every byte. Reports CPU per migration on each side. Root only.

  --connections N     connections to attempt (default 10000)
  --concurrency K     connections in flight, 1..=256 (default 16)
  --small             lab-sized connections (request body 300-555 bytes,
                      response 1,000-1,255 bytes; default: 1 KB to 1 MB each
                      way): the CPU a migration costs whatever its bytes
  --auth              both sides speak the authenticated framing (wire version 3,
                      as specd with --key-file) under a fresh random key: the
                      CPU authentication adds to a migration (default: off)
  --out FILE          also write the JSON report to FILE
  --conn-timeout-s S  bound on each wait of one connection (default 30)
  --deadline-s S      start no connection after S seconds (default 3600)
  --help              this text
";

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// The report with a `provenance` object: the commit of the source tree this example
/// was built from and whether it had uncommitted changes to tracked files (read at run
/// time: a dirty tree is recorded as `commit_dirty: true`, never as the commit alone;
/// `null` without git), the kernel, the start time, and the seed: none, since every
/// connection's sizes and bytes are a function of its id.
fn with_provenance(report: &str, started_unix_s: u64) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]);
    let dirty = commit
        .as_ref()
        .and_then(|_| git(&["status", "--porcelain", "--untracked-files=no"]))
        .map(|s| !s.is_empty());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_string(), |k| k.trim().to_string());
    let mut v: serde_json::Value = serde_json::from_str(report).expect("the report is JSON");
    v["provenance"] = serde_json::json!({
        "commit": commit,
        "commit_dirty": dirty,
        "kernel": kernel,
        "seed": null,
        "seed_note": "no randomness: each connection's sizes and bytes are a function of its id",
        "started_unix_s": started_unix_s,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
    });
    serde_json::to_string_pretty(&v).expect("JSON") + "\n"
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("migrate_many: {e}");
        std::process::exit(2);
    }
}

fn real_main() -> Result<(), String> {
    let mut cfg = ManyConfig::new(10_000);
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let num = |name: &str, v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{name}: not a number: {v:?}"))
        };
        match a.as_str() {
            "--connections" => cfg.connections = num(&a, val(&a)?)? as usize,
            "--concurrency" => cfg.concurrency = num(&a, val(&a)?)? as usize,
            "--small" => cfg.small = true,
            "--auth" => {
                let mut b = [0u8; 16];
                std::fs::File::open("/dev/urandom")
                    .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
                    .map_err(|e| format!("--auth: /dev/urandom: {e}"))?;
                cfg.auth = Some(farside_auth::siphash::SipKey::from_bytes(b));
            }
            "--out" => out = Some(val(&a)?),
            "--conn-timeout-s" => cfg.conn_timeout = Duration::from_secs(num(&a, val(&a)?)?),
            "--deadline-s" => cfg.deadline = Duration::from_secs(num(&a, val(&a)?)?),
            "--help" | "-h" => {
                print!("{USAGE}");
                return Ok(());
            }
            _ => return Err(format!("unknown argument {a:?}\n{USAGE}")),
        }
    }
    if !(1..=CONCURRENCY_MAX).contains(&cfg.concurrency) {
        return Err(format!("--concurrency must be 1..={CONCURRENCY_MAX}"));
    }
    if !farside_migrate::testkit::is_root() {
        return Err("needs root (network namespaces, TCP_REPAIR)".into());
    }
    let stop = Arc::new(AtomicBool::new(false));
    cfg.stop = stop.clone();
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
    std::thread::spawn(move || loop {
        if STOP.load(Ordering::Relaxed) {
            stop.store(true, Ordering::Relaxed);
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    });
    eprintln!(
        "migrate_many: {} connections, {} in flight",
        cfg.connections, cfg.concurrency
    );
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let report = many::run(cfg.clone()).map_err(|e| e.to_string())?;
    let json = with_provenance(&report.to_json(&cfg), started);
    print!("{json}");
    if let Some(path) = out {
        std::fs::write(&path, &json).map_err(|e| format!("{path}: {e}"))?;
    }
    let ok = report.bytes_lost + report.bytes_bad == 0
        && report.lost == 0
        && report.failed == 0
        && report.flow_rules_left == 0;
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
