//! The migration test kit (cargo feature `testkit`), shared by the root tests of
//! farside-migrate, farside-frontend and farside-specd and by the `migrate_many`
//! bench: one copy of the HTTP/1.1 keep-alive session, its pattern bytes and digest,
//! the small-receive-buffer client, the socket helpers and the three network
//! namespaces.
//!
//! - [`session`]: the session of the migration tests — `GET /big` (4 MiB, answered
//!   partly before the move), an 8 MiB `POST` written during the migration,
//!   `GET /small` — with [`session::source_prefix`], [`session::finish_serving`] and
//!   [`session::run_client`].
//! - [`netns`]: client `c`, source back-end `a`, target back-end `b`, the VIP on both
//!   back-ends' loopback, deleted on drop.
//! - [`rule`]: per-flow policy rules over rtnetlink (the bench's flow move).
//! - [`many`]: the bench core: many connections migrated between namespaces, each
//!   byte checked.
//!
//! Test code: the helpers panic on any error (a failure is a failed test), except
//! [`many`], which counts failures instead.

pub mod many;
pub mod netns;
pub mod rule;
pub mod session;

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::{Duration, Instant};

/// Bound on any await in the tests (a hang is a failure, not a wait).
pub const AWAIT_MAX: Duration = Duration::from_secs(60);

/// Whether the process runs as root (TCP_REPAIR and netns need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Moves the calling thread into a fresh network namespace with loopback up (its
/// counters and sockets are then the test's alone; children it spawns inherit it).
pub fn private_netns() {
    // SAFETY: unshare(2) of the network namespace, for the calling thread only.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "unshare: {}", io::Error::last_os_error());
    let st = std::process::Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .expect("ip");
    assert!(st.success(), "ip link set lo up: {st}");
}

/// Byte `i` of the pattern stream `seed` (a splitmix of the 8-byte word index, so
/// shifted, repeated or dropped bytes never match).
pub fn pat(seed: u64, i: usize) -> u8 {
    let mut x = (i as u64 / 8).wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> ((i % 8) * 8)) as u8
}

/// Fills `buf` with bytes `from..from + buf.len()` of the pattern stream `seed`.
pub fn fill_pat(seed: u64, from: usize, buf: &mut [u8]) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = pat(seed, from + k);
    }
}

/// FNV-1a, 64 bit: the digest both ends compare.
#[derive(Clone, Copy, Debug)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv {
    /// The empty digest.
    pub fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    /// Adds `b`.
    pub fn update(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// The digest of the first `len` bytes of pattern stream `seed`.
pub fn pattern_digest(seed: u64, len: usize) -> u64 {
    let mut f = Fnv::new();
    for i in 0..len {
        f.update(&[pat(seed, i)]);
    }
    f.0
}

/// A client socket whose receive buffer (`rcvbuf` bytes, doubled by the kernel) is
/// set before connecting, so the window it announces stays small.
pub fn connect_with_rcvbuf(addr: SocketAddr, rcvbuf: libc::c_int) -> io::Result<TcpStream> {
    let SocketAddr::V4(a) = addr else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "v4 only"));
    };
    // SAFETY: plain socket(2), owned by the TcpStream below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor, owned from here on.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    set_int_opt(&s, libc::SOL_SOCKET, libc::SO_RCVBUF, rcvbuf)?;
    // SAFETY: zeroed sockaddr_in filled below.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = a.port().to_be();
    sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    // SAFETY: valid sockaddr_in of the length passed.
    let r = unsafe {
        libc::connect(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(s)
}

/// `setsockopt(level, opt, v)` for an int option.
pub fn set_int_opt(
    s: &TcpStream,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: setsockopt with an int of the length passed.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes waiting in the socket's receive queue (FIONREAD).
pub fn inq(s: &TcpStream) -> io::Result<usize> {
    let mut v: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut v) };
    if r == 0 {
        Ok(v as usize)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Polls `f` every millisecond until it holds; panics after [`AWAIT_MAX`].
pub fn await_cond(what: &str, f: impl FnMut() -> bool) {
    assert!(await_within(AWAIT_MAX, f), "timed out awaiting {what}");
}

/// Polls `f` every millisecond until it holds (true) or `bound` has passed (false).
pub fn await_within(bound: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() >= bound {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// CPU time (user + system) the calling thread has used so far (RUSAGE_THREAD).
pub fn thread_cpu() -> Duration {
    // SAFETY: zeroed rusage filled by getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    if r != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
