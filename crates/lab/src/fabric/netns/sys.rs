//! Kernel interfaces behind the namespaces: `ip` commands, running a closure in a
//! namespace on a throw-away thread (with a fresh sysfs when it needs one), and the
//! ethtool ioctl that turns tx checksum offload off.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};

/// `e` with `what` (the operation and its object) in front of its message.
pub(super) fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Open `p` for reading, or for writing if `write`; errors name the path.
pub(super) fn open_ctx(p: &Path, write: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .open(p)
        .map_err(|e| ctx(e, &format!("open {}", p.display())))
}

/// Start time of a process (field 22 of /proc/PID/stat), if it exists.
pub(super) fn process_start(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may contain spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Run `ip ARGS`; errors carry the command line and its stderr.
pub(super) fn ip(args: &[&str]) -> io::Result<String> {
    let line = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            ctx(
                e,
                &format!("--hosts netns: cannot run `{line}` (is iproute2 installed?)"),
            )
        })?;
    if !out.status.success() {
        return Err(crate::error::LabError::NetnsCommand {
            line,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(super) fn setns_net(f: &File) -> io::Result<()> {
    // SAFETY: setns on a valid fd; only affects the calling thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(super) fn join<T>(r: std::thread::Result<io::Result<T>>) -> io::Result<T> {
    r.unwrap_or_else(|_| {
        Err(io::Error::other(
            "--hosts netns: namespace helper thread panicked",
        ))
    })
}

/// Run `f` on a fresh thread that entered the netns at `ns`.
pub(super) fn in_netns<T: Send>(
    ns: &Path,
    f: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    let fd = open_ctx(ns, false)?;
    std::thread::scope(|s| {
        join(
            s.spawn(move || {
                setns_net(&fd).map_err(|e| ctx(e, &format!("setns {}", ns.display())))?;
                f()
            })
            .join(),
        )
    })
}

/// Run `f` on a fresh thread with a private mount namespace, inside the netns at `ns`,
/// with that netns's sysfs mounted on `/sys`.
pub(super) fn in_netns_sysfs<T: Send>(
    ns: &Path,
    f: impl FnOnce(&Path) -> io::Result<T> + Send,
) -> io::Result<T> {
    let fd = open_ctx(ns, false)?;
    std::thread::scope(|s| {
        join(
            s.spawn(move || {
                // SAFETY: unshare/mount affect only this thread's fs and mount view.
                unsafe {
                    if libc::unshare(libc::CLONE_NEWNS) != 0 {
                        return Err(ctx(io::Error::last_os_error(), "unshare(CLONE_NEWNS)"));
                    }
                    let root = CString::new("/").unwrap_or_default();
                    if libc::mount(
                        std::ptr::null(),
                        root.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(ctx(io::Error::last_os_error(), "make / private"));
                    }
                }
                setns_net(&fd).map_err(|e| ctx(e, &format!("setns {}", ns.display())))?;
                let sysfs = CString::new("sysfs").unwrap_or_default();
                let sys = CString::new("/sys").unwrap_or_default();
                // SAFETY: valid C strings; the mount lives in this thread's mount namespace.
                if unsafe {
                    libc::mount(
                        sysfs.as_ptr(),
                        sys.as_ptr(),
                        sysfs.as_ptr(),
                        0,
                        std::ptr::null(),
                    )
                } != 0
                {
                    return Err(ctx(io::Error::last_os_error(), "mount the netns's sysfs"));
                }
                f(Path::new("/sys"))
            })
            .join(),
        )
    })
}

pub(super) const SIOCETHTOOL: libc::c_ulong = 0x8946;
pub(super) const ETHTOOL_GTXCSUM: u32 = 0x16;
pub(super) const ETHTOOL_STXCSUM: u32 = 0x17;

#[repr(C)]
pub(super) struct EthtoolValue {
    cmd: u32,
    data: u32,
}

#[repr(C)]
pub(super) struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

pub(super) fn ethtool_value(sock: &OwnedFd, dev: &str, cmd: u32, data: u32) -> io::Result<u32> {
    let mut v = EthtoolValue { cmd, data };
    let mut ifr = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: (&mut v as *mut EthtoolValue).cast(),
        _pad: [0; 16],
    };
    for (d, s) in ifr
        .name
        .iter_mut()
        .zip(dev.bytes().take(libc::IFNAMSIZ - 1))
    {
        *d = s as libc::c_char;
    }
    // SAFETY: ifr points to a valid ifreq whose data points to a live ethtool_value.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut ifr) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v.data)
}

/// `ethtool -K DEV tx off` for a device of the calling thread's netns.
pub(super) fn tx_csum_off(dev: &str) -> io::Result<()> {
    // SAFETY: plain socket(2); the result is checked and owned.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor we own.
    let sock = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let what = format!("--hosts netns: tx checksum offload off on {dev} (ethtool -K {dev} tx off)");
    ethtool_value(&sock, dev, ETHTOOL_STXCSUM, 0).map_err(|e| ctx(e, &what))?;
    let now = ethtool_value(&sock, dev, ETHTOOL_GTXCSUM, 0).map_err(|e| ctx(e, &what))?;
    if now != 0 {
        return Err(crate::error::LabError::StillOn { what }.into());
    }
    Ok(())
}

/// `path` opened (created if missing) and locked exclusively with `flock`; the lock
/// lasts as long as the returned file.
pub(super) fn lock_exclusive(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    // SAFETY: flock on a descriptor this function owns; it blocks until the lock is ours.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}

/// Write `v` to `p` (a sysctl or cgroup file); the error names what for.
pub(super) fn write_file(p: &Path, v: &str, what: &str) -> io::Result<()> {
    fs::write(p, v).map_err(|e| {
        ctx(
            e,
            &format!("--hosts netns: {what}: write {v:?} to {}", p.display()),
        )
    })
}
