//! A minimal stderr logger (level from `FARSIDE_LOG`) and termination-signal waiting.

use std::io::Write;
use std::time::Duration;

struct StderrLog(log::LevelFilter);

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= self.0
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let _ = writeln!(
                std::io::stderr().lock(),
                "{}.{:03} {:5} {}",
                t.as_secs(),
                t.subsec_millis(),
                r.level(),
                r.args()
            );
        }
    }
    fn flush(&self) {}
}

pub fn init() {
    let level = match std::env::var("FARSIDE_LOG").as_deref() {
        Ok("error") => log::LevelFilter::Error,
        Ok("warn") => log::LevelFilter::Warn,
        Ok("debug") => log::LevelFilter::Debug,
        Ok("off") => log::LevelFilter::Off,
        _ => log::LevelFilter::Info,
    };
    if log::set_logger(Box::leak(Box::new(StderrLog(level)))).is_ok() {
        log::set_max_level(level);
    }
}

/// Block SIGINT and SIGTERM in this thread (and the threads it spawns afterwards) so
/// that [`wait_for_signal`] can receive them synchronously.
pub fn block_termination_signals() -> libc::sigset_t {
    // SAFETY: building and installing a signal mask for this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Wait for SIGINT/SIGTERM, or until `limit` has passed.
pub fn wait_for_signal(set: &libc::sigset_t, limit: Option<Duration>) {
    let deadline = limit.map(|d| std::time::Instant::now() + d);
    loop {
        let left = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return;
                }
                left.min(Duration::from_secs(1))
            }
            None => Duration::from_secs(1),
        };
        let ts = libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: waiting on a valid, blocked signal set.
        let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
        if sig == libc::SIGINT || sig == libc::SIGTERM {
            log::info!("signal {sig}: stopping");
            return;
        }
    }
}
