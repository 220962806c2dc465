//! Runtime and state files that a privileged daemon creates in shared places (region
//! files, the monitor table, Unix sockets, state files) without being steered by a
//! local user: a safe directory, a safe create, a safe open, an atomic write.
//!
//! The attack this closes: a daemon running as root that makes its directory with
//! `create_dir_all` follows a symlink a local user planted at the directory's name (in
//! `/dev/shm`, `/tmp`), and then creates (and later deletes) its files wherever that
//! user named; a symlink at the file's own name, removed before an `open` without
//! `O_NOFOLLOW | O_EXCL`, leaves a race between the check and the open.
//!
//! The rules, applied to every path given to this module (an explicit `--shm PATH` as
//! well as the defaults under [`RUN_DIR`]):
//!
//! - **The directory** ([`SafeDir`]): each missing component is made with `mkdir` mode
//!   0700 (never through a symlink); then every component from `/` down is checked with
//!   `lstat`: a directory owned by root or by us, writable by others only if it is
//!   root's and sticky (`/tmp`, `/dev/shm`: there nobody can remove or rename what is
//!   not theirs); a symlink only if root or we made it (a safe transition: `/var/run`,
//!   systemd's `StateDirectory=` of a `DynamicUser=` service), its target checked by the
//!   same rules; another user's symlink, at the directory's own name or on the way, is
//!   refused. The directory is then opened `O_DIRECTORY | O_NOFOLLOW` and the
//!   descriptor's `fstat` must be the `lstat` just checked; every file operation after
//!   that is relative to this descriptor (`openat`, `unlinkat`), so a rename of a path
//!   component later changes nothing.
//! - **Creating** ([`SafeDir::create_new`], [`SafeDir::create_or_reuse`]): an entry at
//!   the name that is not ours is refused with an error naming its owner (we never
//!   remove or open another user's file); one of ours that is not a plain file (a
//!   socket of an earlier run, a symlink) is unlinked; the file is then created
//!   `O_CREAT | O_EXCL | O_NOFOLLOW` with the mode asked for (0600 for every farside
//!   runtime file). `create_or_reuse` keeps a plain file of ours with one link (opened
//!   `O_NOFOLLOW`, its `fstat` checked again), so readers that have it mapped keep
//!   reading a restarted writer; `create_new` always starts from a new inode.
//! - **Opening** ([`SafeDir::open_file`]): `O_NOFOLLOW`, then `fstat`: a plain file,
//!   owned by root or us, with one link (not a hard link to something else), not
//!   writable by group or others.
//! - **Sockets** ([`SafeDir::bind_unix`]): bound through the checked directory's
//!   descriptor (`/proc/self/fd/N/NAME`), after unlinking only a stale entry of ours;
//!   made 0600.
//! - **Atomic writes** ([`write_atomic`]): a temporary file created `O_EXCL` in the
//!   checked directory, written, `fsync`ed, renamed over the name, the directory
//!   `fsync`ed: a crash leaves the old contents or the new, never a torn file.
//!
//! Every refusal is an `io::Error` whose message names the path and the reason
//! (`PermissionDenied` for ownership and mode, `InvalidInput` for symlinks), so a
//! daemon that refuses to start says what to fix.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixListener;
use std::path::{Component, Path, PathBuf};

/// Where farside's daemons keep runtime files (region files, sockets) by default when
/// they run as root: on a tmpfs that is emptied at boot, and root-owned so no local
/// user can plant a name in it (unlike `/dev/shm`).
pub const RUN_DIR: &str = "/run/farside";

/// Where farside's daemons keep state that must survive their restarts (gatherd's
/// role and boot epoch) by default when they run as root.
pub const STATE_DIR: &str = "/var/lib/farside";

/// Mode of every runtime file farside creates: the owner only (root reads root's
/// regions; a non-root run reads its own).
pub const FILE_MODE: u32 = 0o600;

/// Mode of every directory this module creates.
pub const DIR_MODE: u32 = 0o700;

/// A directory component's name is at most this long (a Unix socket's whole path must
/// fit `sun_path`, 108 bytes; see [`SafeDir::bind_unix`]).
const NAME_BYTES_MAX: usize = 255;

/// The effective user id of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The runtime directory for this process: systemd's `$RUNTIME_DIRECTORY` (a unit's
/// `RuntimeDirectory=`) if set; else [`RUN_DIR`] as root; otherwise
/// `$XDG_RUNTIME_DIR/farside` if set, else `/tmp/farside-<uid>` (the checks of
/// [`SafeDir::create`] refuse it if another user made it first).
pub fn default_run_dir() -> PathBuf {
    default_dir("RUNTIME_DIRECTORY", RUN_DIR, "XDG_RUNTIME_DIR")
}

/// The state directory for this process: systemd's `$STATE_DIRECTORY` (a unit's
/// `StateDirectory=`) if set; else [`STATE_DIR`] as root; otherwise
/// `$XDG_STATE_HOME/farside` if set, else `/tmp/farside-<uid>`.
pub fn default_state_dir() -> PathBuf {
    default_dir("STATE_DIRECTORY", STATE_DIR, "XDG_STATE_HOME")
}

fn default_dir(systemd_env: &str, root_dir: &str, xdg_env: &str) -> PathBuf {
    // systemd lists a unit's directories separated by colons: the first is ours.
    if let Some(v) = std::env::var_os(systemd_env) {
        if let Some(first) = v.as_bytes().split(|b| *b == b':').next() {
            let p = Path::new(OsStr::from_bytes(first));
            if p.is_absolute() {
                return p.to_path_buf();
            }
        }
    }
    let uid = euid();
    if uid == 0 {
        return PathBuf::from(root_dir);
    }
    match std::env::var_os(xdg_env) {
        Some(d) if Path::new(&d).is_absolute() => Path::new(&d).join("farside"),
        _ => PathBuf::from(format!("/tmp/farside-{uid}")),
    }
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: a path with a NUL byte", p.display()),
        )
    })
}

fn cname(dir: &Path, name: &OsStr) -> io::Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.len() > NAME_BYTES_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{:?} in {}: not a single file name", name, dir.display()),
        ));
    }
    CString::new(b).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{:?}: a name with a NUL byte", name),
        )
    })
}

fn lstat(p: &Path) -> io::Result<libc::stat> {
    let c = cstr(p)?;
    // SAFETY: zeroed stat is a valid out-buffer; c is NUL-terminated.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is a descriptor the caller holds.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; `None` if there is no such entry.
fn stat_at(dir: RawFd, name: &CString) -> io::Result<Option<libc::stat>> {
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: dir is a held directory descriptor; name is NUL-terminated.
    if unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOENT) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(st))
}

fn kind(mode: u32) -> u32 {
    mode & libc::S_IFMT
}

fn denied(p: &Path, why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{}: {why}; refusing to use it", p.display()),
    )
}

/// Owner and mode of a directory we are about to trust: ours or root's, and writable
/// by others only if root's and sticky (`/tmp`, `/dev/shm`).
fn check_dir_stat(p: &Path, st: &libc::stat, me: u32) -> io::Result<()> {
    if kind(st.st_mode) != libc::S_IFDIR {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a directory", p.display()),
        ));
    }
    if st.st_uid != me && st.st_uid != 0 {
        return Err(denied(
            p,
            format!("a directory owned by uid {} (not root, not us)", st.st_uid),
        ));
    }
    let others_write = st.st_mode & 0o022 != 0;
    let sticky = st.st_mode & libc::S_ISVTX != 0;
    if others_write && !(sticky && st.st_uid == 0) {
        return Err(denied(
            p,
            format!(
                "a directory others may write (mode {:o}, not root's and sticky)",
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(())
}

/// A directory checked by the rules of the module doc, held open: every file
/// operation is relative to its descriptor.
#[derive(Debug)]
pub struct SafeDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl SafeDir {
    /// Make `path` (each missing component with `mkdir` 0700) and check it.
    pub fn create(path: &Path) -> io::Result<SafeDir> {
        SafeDir::walk(path, true)
    }

    /// Check an existing directory (readers: nothing is created).
    pub fn open(path: &Path) -> io::Result<SafeDir> {
        SafeDir::walk(path, false)
    }

    /// The directory of `file` made and checked, and `file`'s name in it.
    pub fn create_parent(file: &Path) -> io::Result<(SafeDir, &OsStr)> {
        let (dir, name) = split(file)?;
        Ok((SafeDir::create(&dir)?, name))
    }

    /// The directory of `file` checked (not created), and `file`'s name in it.
    pub fn open_parent(file: &Path) -> io::Result<(SafeDir, &OsStr)> {
        let (dir, name) = split(file)?;
        Ok((SafeDir::open(&dir)?, name))
    }

    fn walk(path: &Path, make: bool) -> io::Result<SafeDir> {
        let abs = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir()?.join(path)
        };
        let me = euid();
        let mut prefix = PathBuf::from("/");
        let mut last = lstat(&prefix)?;
        check_dir_stat(&prefix, &last, me)?;
        let comps: Vec<Component> = abs.components().collect();
        for c in &comps {
            let name = match c {
                Component::RootDir | Component::CurDir => continue,
                Component::ParentDir => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: a runtime path with `..`", path.display()),
                    ))
                }
                Component::Normal(n) => n,
                Component::Prefix(_) => unreachable!("no prefixes on Unix"),
            };
            prefix.push(name);
            let st = match lstat(&prefix) {
                Ok(st) => st,
                Err(e) if make && e.raw_os_error() == Some(libc::ENOENT) => {
                    let c = cstr(&prefix)?;
                    // SAFETY: c is NUL-terminated. mkdir never follows a symlink at the
                    // final component: if one appears meanwhile, EEXIST and the lstat
                    // below sees it.
                    if unsafe { libc::mkdir(c.as_ptr(), DIR_MODE as libc::mode_t) } != 0 {
                        let e = io::Error::last_os_error();
                        if e.raw_os_error() != Some(libc::EEXIST) {
                            return Err(io::Error::new(
                                e.kind(),
                                format!("{}: mkdir: {e}", prefix.display()),
                            ));
                        }
                    }
                    lstat(&prefix)?
                }
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("{}: {e}", prefix.display()),
                    ))
                }
            };
            if kind(st.st_mode) == libc::S_IFLNK {
                // A symlink (`/var/run -> /run`, systemd's `/var/lib/NAME ->
                // private/NAME` of a DynamicUser service) is followed only if root or
                // we made it; its target is checked by the same rules. Another user's
                // symlink is what the attack plants: refused.
                if st.st_uid != me && st.st_uid != 0 {
                    return Err(denied(
                        &prefix,
                        format!("a symlink owned by uid {} (not root, not us)", st.st_uid),
                    ));
                }
                prefix = std::fs::canonicalize(&prefix)?;
                last = lstat(&prefix)?;
                check_ancestors(&prefix, me)?;
                continue;
            }
            check_dir_stat(&prefix, &st, me)?;
            last = st;
        }
        let c = cstr(&prefix)?;
        // SAFETY: c is NUL-terminated; the result is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("{}: {e}", prefix.display()),
            ));
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st = fstat(fd.as_raw_fd())?;
        if (st.st_dev, st.st_ino) != (last.st_dev, last.st_ino) {
            return Err(denied(
                &prefix,
                "the directory changed while it was checked".into(),
            ));
        }
        check_dir_stat(&prefix, &st, me)?;
        Ok(SafeDir { fd, path: prefix })
    }

    /// The directory's path (symlinks on the way resolved).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's descriptor (for `*at` calls of the caller's own).
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn full(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    /// Remove the entry `name` if it is ours (of any kind but a directory); a missing
    /// entry is fine; another user's entry is refused.
    pub fn remove_own(&self, name: &OsStr) -> io::Result<()> {
        let c = cname(&self.path, name)?;
        let Some(st) = stat_at(self.as_raw_fd(), &c)? else {
            return Ok(());
        };
        self.unlink_own(name, &c, &st)
    }

    fn unlink_own(&self, name: &OsStr, c: &CString, st: &libc::stat) -> io::Result<()> {
        if st.st_uid != euid() {
            return Err(denied(
                &self.full(name),
                format!("it exists and belongs to uid {} (not us)", st.st_uid),
            ));
        }
        if kind(st.st_mode) == libc::S_IFDIR {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}: a directory is in the way", self.full(name).display()),
            ));
        }
        // SAFETY: held dir fd, NUL-terminated name. Nobody else can replace our entry
        // in between: the directory is ours (or sticky, where only we remove ours).
        if unsafe { libc::unlinkat(self.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: unlink: {e}", self.full(name).display()),
                ));
            }
        }
        Ok(())
    }

    fn open_at(&self, c: &CString, flags: libc::c_int, mode: u32) -> io::Result<File> {
        // SAFETY: held dir fd, NUL-terminated name; the result is checked.
        let fd = unsafe {
            libc::openat(
                self.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Create `name` afresh: an entry of ours at the name is unlinked first (another
    /// user's is refused), then `O_CREAT | O_EXCL | O_NOFOLLOW`, read-write, `mode`
    /// exactly (the umask does not widen or narrow it).
    pub fn create_new(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        let c = cname(&self.path, name)?;
        if let Some(st) = stat_at(self.as_raw_fd(), &c)? {
            self.unlink_own(name, &c, &st)?;
        }
        let f = self
            .open_at(&c, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, mode)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("{}: create: {e}", self.full(name).display()),
                )
            })?;
        // SAFETY: f is an open descriptor of ours.
        if unsafe { libc::fchmod(f.as_raw_fd(), mode as libc::mode_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(f)
    }

    /// Open `name` read-write if it is a plain file of ours with one link, not writable
    /// by others (its `fstat` after the `O_NOFOLLOW` open must be what was checked);
    /// otherwise as [`SafeDir::create_new`]. Returns the file and whether it was
    /// reused.
    pub fn create_or_reuse(&self, name: &OsStr, mode: u32) -> io::Result<(File, bool)> {
        let c = cname(&self.path, name)?;
        if let Some(st) = stat_at(self.as_raw_fd(), &c)? {
            if kind(st.st_mode) == libc::S_IFREG && st.st_uid == euid() && st.st_nlink == 1 {
                if let Ok(f) = self.open_at(&c, libc::O_RDWR, 0) {
                    let now = fstat(f.as_raw_fd())?;
                    if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) && now.st_nlink == 1 {
                        // SAFETY: f is an open descriptor of ours.
                        if unsafe { libc::fchmod(f.as_raw_fd(), mode as libc::mode_t) } != 0 {
                            return Err(io::Error::last_os_error());
                        }
                        return Ok((f, true));
                    }
                }
            }
        }
        Ok((self.create_new(name, mode)?, false))
    }

    /// Open an existing `name` (read-only, or read-write if `write`) with
    /// `O_NOFOLLOW`, and check what was opened: a plain file, owned by root or us,
    /// one link, not writable by group or others.
    pub fn open_file(&self, name: &OsStr, write: bool) -> io::Result<File> {
        let c = cname(&self.path, name)?;
        let full = self.full(name);
        let flags = if write { libc::O_RDWR } else { libc::O_RDONLY };
        let f = self.open_at(&c, flags, 0).map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: a symlink; refusing to follow it", full.display()),
                )
            } else {
                io::Error::new(e.kind(), format!("{}: {e}", full.display()))
            }
        })?;
        let st = fstat(f.as_raw_fd())?;
        check_file_stat(&full, &st)?;
        Ok(f)
    }

    /// Bind a Unix stream socket at `name` (a stale entry of ours is removed first;
    /// another user's is refused) and make it 0600.
    pub fn bind_unix(&self, name: &OsStr) -> io::Result<UnixListener> {
        let c = cname(&self.path, name)?;
        if let Some(st) = stat_at(self.as_raw_fd(), &c)? {
            self.unlink_own(name, &c, &st)?;
        }
        // The path through our held descriptor: whatever happens to the directory's
        // names meanwhile, the socket lands in the directory that was checked.
        let via = Path::new("/proc/self/fd")
            .join(self.as_raw_fd().to_string())
            .join(name);
        let l = UnixListener::bind(&via).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{}: bind: {e}", self.full(name).display()),
            )
        })?;
        // SAFETY: held dir fd, NUL-terminated name; a socket is never a symlink here
        // (we just made it), and AT_SYMLINK_NOFOLLOW is not supported by fchmodat.
        if unsafe { libc::fchmodat(self.as_raw_fd(), c.as_ptr(), FILE_MODE, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(l)
    }

    /// Check that `name` is a Unix socket owned by root or us (before connecting to
    /// it); returns its full path.
    pub fn check_socket(&self, name: &OsStr) -> io::Result<PathBuf> {
        let c = cname(&self.path, name)?;
        let full = self.full(name);
        let Some(st) = stat_at(self.as_raw_fd(), &c)? else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: no such socket", full.display()),
            ));
        };
        if kind(st.st_mode) != libc::S_IFSOCK {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a socket", full.display()),
            ));
        }
        if st.st_uid != euid() && st.st_uid != 0 {
            return Err(denied(
                &full,
                format!("a socket owned by uid {} (not root, not us)", st.st_uid),
            ));
        }
        Ok(full)
    }
}

/// Ancestors of a symlink's target: the same ownership rules as the walk.
fn check_ancestors(p: &Path, me: u32) -> io::Result<()> {
    let mut a = PathBuf::from("/");
    for c in p.components() {
        if let Component::Normal(n) = c {
            a.push(n);
        }
        let st = lstat(&a)?;
        check_dir_stat(&a, &st, me)?;
    }
    Ok(())
}

/// A plain file owned by root or us, one link, not writable by group or others.
fn check_file_stat(p: &Path, st: &libc::stat) -> io::Result<()> {
    if kind(st.st_mode) != libc::S_IFREG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a plain file", p.display()),
        ));
    }
    if st.st_uid != euid() && st.st_uid != 0 {
        return Err(denied(
            p,
            format!("a file owned by uid {} (not root, not us)", st.st_uid),
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(denied(
            p,
            format!("a file others may write (mode {:o})", st.st_mode & 0o7777),
        ));
    }
    if st.st_nlink != 1 {
        return Err(denied(p, format!("a file with {} hard links", st.st_nlink)));
    }
    Ok(())
}

fn split(file: &Path) -> io::Result<(PathBuf, &OsStr)> {
    let name = file.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: no file name", file.display()),
        )
    })?;
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name))
}

/// Create the file at `path` afresh (its directory made and checked; see
/// [`SafeDir::create_new`]).
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    let (dir, name) = SafeDir::create_parent(path)?;
    dir.create_new(name, mode)
}

/// Open the file at `path`, reusing a plain file of ours (see
/// [`SafeDir::create_or_reuse`]).
pub fn create_or_reuse(path: &Path, mode: u32) -> io::Result<File> {
    let (dir, name) = SafeDir::create_parent(path)?;
    Ok(dir.create_or_reuse(name, mode)?.0)
}

/// Open an existing file at `path` by the reader's rules (see [`SafeDir::open_file`]).
pub fn open_file(path: &Path, write: bool) -> io::Result<File> {
    let (dir, name) = SafeDir::open_parent(path)?;
    dir.open_file(name, write)
}

/// Replace the file at `path` with `bytes` atomically (mode `mode`): a temporary file
/// in the same checked directory, written and `fsync`ed, renamed over `path`, the
/// directory `fsync`ed.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let (dir, name) = SafeDir::create_parent(path)?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let mut f = dir.create_new(&tmp_name, mode)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = dir.remove_own(&tmp_name);
        return Err(io::Error::new(
            e.kind(),
            format!("{}: write: {e}", path.display()),
        ));
    }
    drop(f);
    let from = cname(dir.path(), &tmp_name)?;
    let to = cname(dir.path(), name)?;
    // A directory is never replaced by rename of a file (EISDIR); another user's entry
    // at the name cannot exist unnoticed in a directory only we write, and in a sticky
    // one rename refuses to replace it (EPERM).
    // SAFETY: held dir fd, NUL-terminated names.
    if unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) } != 0
    {
        let e = io::Error::last_os_error();
        let _ = dir.remove_own(&tmp_name);
        return Err(io::Error::new(
            e.kind(),
            format!("{}: rename: {e}", path.display()),
        ));
    }
    // SAFETY: held dir fd.
    if unsafe { libc::fsync(dir.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Read the whole file at `path` by the reader's rules; `Ok(None)` if it does not
/// exist (its directory must still pass the checks if it exists).
pub fn read_file(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let (dir, name) = match SafeDir::open_parent(path) {
        Ok(x) => x,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut f = match dir.open_file(name, false) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut v = Vec::new();
    io::Read::read_to_end(&mut f, &mut v)?;
    Ok(Some(v))
}

#[cfg(test)]
mod tests;
