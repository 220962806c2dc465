//! Child processes of a lab run: every role runs as its own `farside` process (or nginx),
//! as on separate machines. Children die with the lab (PR_SET_PDEATHSIG), are stopped
//! on drop (SIGTERM, then SIGKILL after `STOP_GRACE`), and log to files in the run's
//! directory.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Time a child has to exit after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(3);
/// Time a child has to start listening.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Poll interval while waiting for a port or file.
const POLL: Duration = Duration::from_millis(10);

pub struct Child {
    pub name: String,
    child: std::process::Child,
    pub log: PathBuf,
}

impl Child {
    /// Start `program args` with stdout/stderr to `log_dir/NAME.log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], log_dir: &Path) -> io::Result<Child> {
        Self::spawn_pinned(name, program, args, log_dir, None)
    }

    /// As [`Child::spawn`], restricted to the CPUs in `cpus` (unprivileged
    /// `sched_setaffinity`), so a lab can keep its tiers on separate CPUs.
    pub fn spawn_pinned(
        name: &str,
        program: &Path,
        args: &[String],
        log_dir: &Path,
        cpus: Option<&[usize]>,
    ) -> io::Result<Child> {
        let set = cpus.map(cpu_set);
        let log = log_dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                reset_signal_mask();
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if let Some(set) = &set {
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{name}: cannot start {}: {e}", program.display()),
            )
        })?;
        log::debug!(
            "lab: started {name} (pid {}): {} {}",
            child.id(),
            program.display(),
            args.join(" ")
        );
        Ok(Child {
            name: name.to_string(),
            child,
            log,
        })
    }

    /// Supervise a process started elsewhere (e.g. inside a lab node's namespace).
    pub fn adopt(name: &str, child: std::process::Child, log: PathBuf) -> Child {
        Child {
            name: name.to_string(),
            child,
            log,
        }
    }

    /// Error if the child has exited; for polling from threads that cannot borrow it.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Start another subcommand of this same `farside` binary.
    pub fn farside(
        name: &str,
        args: &[String],
        log_dir: &Path,
        cpus: Option<&[usize]>,
    ) -> io::Result<Child> {
        let exe = std::env::current_exe()?;
        Self::spawn_pinned(name, &exe, args, log_dir, cpus)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Error if the child has exited, with the tail of its log.
    pub fn check_alive(&mut self) -> io::Result<()> {
        if let Some(st) = self.child.try_wait()? {
            return Err(crate::error::LabError::Exited {
                name: self.name.clone(),
                status: st,
                log_tail: tail(&self.log, 15),
            }
            .into());
        }
        Ok(())
    }

    /// Wait until `ready()` says yes, failing early if the child exits: at most
    /// `within`, asking every `poll`. The error names what did not happen (`what`, e.g.
    /// "listen on 10.77.0.10:80") and ends with the tail of the child's log.
    pub fn wait_ready(
        &mut self,
        what: &str,
        within: Duration,
        poll: Duration,
        mut ready: impl FnMut() -> io::Result<bool>,
    ) -> io::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            self.check_alive()?;
            if ready()? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} did not {what} within {within:?}; log tail:\n{}",
                        self.name,
                        tail(&self.log, 15)
                    ),
                ));
            }
            std::thread::sleep(poll);
        }
    }

    /// Wait until `addr` accepts connections from this process, failing early if the
    /// child exits (at most [`READY_TIMEOUT`]).
    pub fn wait_port(&mut self, addr: SocketAddr) -> io::Result<()> {
        self.wait_ready(&format!("listen on {addr}"), READY_TIMEOUT, POLL, || {
            Ok(TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok())
        })
    }

    /// Wait until `path` exists, failing early if the child exits.
    pub fn wait_file(&mut self, path: &Path) -> io::Result<()> {
        self.wait_ready(
            &format!("create {}", path.display()),
            READY_TIMEOUT,
            POLL,
            || Ok(path.exists()),
        )
    }

    pub fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(POLL);
        }
        log::warn!(
            "lab: {} had not exited {STOP_GRACE:?} after SIGTERM (a proxy still draining \
             in-flight requests, or a process stuck in its exit); killing it",
            self.name
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

pub(crate) fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it for cpu < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(c, &mut set);
            }
        }
        set
    }
}

/// Restrict the calling thread (and threads it creates afterwards) to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    let set = cpu_set(cpus);
    // SAFETY: valid set for the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs of a lab's two tiers when they are pinned (lab admission, lab speculative):
/// the front tier (clients, proxy or front-end) on the first CPU this process may use,
/// the back-end nodes on the others, so the back-end tier can be saturated while the
/// front is not, as on separate machines. `None` with fewer than two CPUs (the tiers
/// share them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tiers {
    pub front: Vec<usize>,
    pub back: Vec<usize>,
}

impl Tiers {
    /// The split of `cpus` (sorted, as [`allowed_cpus`] gives them).
    pub fn of(cpus: &[usize]) -> Option<Tiers> {
        (cpus.len() >= 2).then(|| Tiers {
            front: cpus[..1].to_vec(),
            back: cpus[1..].to_vec(),
        })
    }
}

/// `cpus` as a cpuset list: `1,2,3`.
pub fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// `cpus` as a hex CPU mask (`rps_cpus`): `e` for CPUs 1-3.
pub fn cpu_mask(cpus: &[usize]) -> String {
    format!("{:x}", cpus.iter().fold(0u64, |m, &c| m | (1 << c)))
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: valid out-pointer of the right size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Give a child the default signal mask. The lab blocks SIGINT/SIGTERM for its
/// interrupt handler, and a blocked mask survives exec: without this, children ignore
/// SIGTERM. Async-signal-safe (for `pre_exec`).
pub(crate) fn reset_signal_mask() {
    // SAFETY: sigemptyset and pthread_sigmask on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

type Cleanup = Box<dyn Fn() + Send + Sync>;

/// Set once an interrupt is being handled: the main thread then waits for the handler
/// (which exits with 130) instead of reporting the errors the clean-up causes.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the lab is being interrupted.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Clean-ups run when the lab is interrupted (SIGINT/SIGTERM), newest first.
static ON_INTERRUPT: std::sync::Mutex<Vec<Cleanup>> = std::sync::Mutex::new(Vec::new());

/// Register a clean-up for an interrupted run (removing temp dirs, namespaces, cgroups).
/// Children need none: they die with the lab (PR_SET_PDEATHSIG).
pub fn on_interrupt(f: impl Fn() + Send + Sync + 'static) {
    ON_INTERRUPT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Box::new(f));
}

/// Block SIGINT and SIGTERM in the calling thread (and threads it creates later) and
/// start a thread that waits for them, runs the registered clean-ups and exits with 130.
/// Call it first thing, before other threads exist. Spawned children start with the
/// default mask (Rust's `Command` resets it).
pub fn install_interrupt_handler() -> io::Result<()> {
    // SAFETY: building a signal set and masking it for this thread.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        set
    };
    std::thread::Builder::new()
        .name("lab-signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: waiting on a blocked set.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                return;
            }
            INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
            eprintln!("lab: signal {sig}: cleaning up");
            let cleanups =
                std::mem::take(&mut *ON_INTERRUPT.lock().unwrap_or_else(|p| p.into_inner()));
            for f in cleanups.iter().rev() {
                f();
            }
            std::process::exit(130);
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_put_the_front_on_the_first_cpu_and_the_back_ends_on_the_rest() {
        assert_eq!(Tiers::of(&[0]), None);
        let t = Tiers::of(&[2, 3, 5]).unwrap();
        assert_eq!(
            (t.front.as_slice(), t.back.as_slice()),
            (&[2][..], &[3, 5][..])
        );
        assert_eq!(cpu_list(&t.back), "3,5");
        assert_eq!(cpu_mask(&t.back), "28");
        assert_eq!(cpu_mask(&[0]), "1");
    }

    #[test]
    fn children_start_with_no_blocked_signals_even_when_the_lab_blocks_them() {
        let dir = std::env::temp_dir().join(format!("farside-procs-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.clone();
        // A fresh thread: block SIGINT/SIGTERM there as the interrupt handler does, then spawn.
        let log = std::thread::spawn(move || {
            // SAFETY: masking signals for this thread only.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGTERM);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            let args = vec![
                "-c".to_string(),
                "grep SigBlk /proc/self/status".to_string(),
            ];
            let mut c = Child::spawn("sigblk", Path::new("/bin/sh"), &args, &d).unwrap();
            while c.exited().is_none() {
                std::thread::sleep(Duration::from_millis(5));
            }
            c.log.clone()
        })
        .join()
        .unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains("SigBlk:\t0000000000000000"),
            "child inherited a blocked mask: {text}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
