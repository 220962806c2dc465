//! The flow hold of a same-namespace migration ([`crate::Handover::CloseBeforeRestore`]).
//!
//! **The gap.** When source and target share a network namespace, the target cannot
//! restore while the source socket exists (same 4-tuple in the established hash), so
//! the source closes its frozen socket silently after ACCEPT and before COMMIT. Until
//! the target's restore puts the 4-tuple back, a client segment finds no established
//! socket, meets the service's listener and is answered with a RST: the client sees a
//! reset (about 2 in 10 keep-alive migrations under load before this module).
//!
//! **The hold.** [`FlowHold::attach`] loads `bpf/hold.bpf.c`, an sk_lookup program,
//! into the calling thread's network namespace with a bounded map of held 4-tuples
//! ([`FLOWS_MAX`]). The source puts the connection's 4-tuple in it just before its
//! close ([`FlowHold::hold`]) and the returned [`Held`] removes it when dropped: after
//! the target's restore (RESTORED: the restored copy, frozen, is in the established
//! hash), after the local re-restore of a fall-back, or when the connection is lost,
//! on every return path of [`crate::migrate`] (and on unwinding). sk_lookup runs only
//! when no established socket matches, i.e. exactly in the gap; for a held 4-tuple it
//! assigns the lookup to a black-hole listener of this module (a TCP listener with the
//! freeze's drop-everything socket filter). TCP runs the socket filter before any
//! state processing, listeners included, so the segment is dropped silently; the
//! client retransmits it to the restored socket, whose repair state covers its
//! sequence space. (An sk_lookup verdict of `SK_DROP` would not do: the kernel answers
//! a refused lookup with a RST.)
//!
//! **Bounds.** Each entry carries a deadline ([`FlowHold::hold`]'s `ttl`, on the
//! kernel's monotonic clock): the program ignores an entry past it, so a hold that
//! was not removed (a bug; the guard removes it on every path) lasts at most its ttl;
//! a full map is swept of such entries before an insert fails. Nothing is pinned: the
//! program's link, its maps and the black-hole listeners belong to the process and go
//! with it, so a daemon that crashes leaves nothing behind (no cleanup step needed).
//!
//! **Cost.** With [`crate::Handover::CloseAfterRestore`] (the deployment: source and
//! target on different hosts) nothing of this runs. With `CloseBeforeRestore`, one
//! map insert and one delete (two `bpf(2)` calls) per migration when the caller keeps
//! a [`FlowHold`] in [`crate::MigrateConfig::hold`] (as `farside specd --same-netns`
//! does); without one, [`crate::migrate`] attaches a hold for that migration alone,
//! before the freeze (a program load: 24–32 ms on the shared 2-core test machine,
//! debug build).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use aya::programs::SkLookup;
use farside_bpfrt::{flags, ktime_ns, Object, RawMap};

use crate::sys;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/hold.bpf.o"));

/// Most 4-tuples held at once (`HOLD_FLOWS_MAX` in `bpf/hold.bpf.c`): each is held
/// for one hand-over (about a millisecond, at most its ttl); a source runs at most a
/// few dozen migrations at once (`farside specd --migrators`), so 4096 leaves a
/// hundredfold margin for entries that wait out their ttl.
pub const FLOWS_MAX: usize = 4096;

/// Counter indices, as `HOLD_CNT_*` in `bpf/hold.bpf.c`: segments of a held flow
/// dropped by the black hole.
pub const CNT_DROPPED: usize = 0;
/// Lookups that found a held flow past its deadline (not held).
pub const CNT_EXPIRED: usize = 1;
/// A held flow of a family without a black-hole listener (not held).
pub const CNT_NO_SOCK: usize = 2;
/// `bpf_sk_assign` failed (not held).
pub const CNT_ASSIGN_FAILED: usize = 3;
/// Number of counters.
pub const COUNTERS: usize = 4;

/// `hold_sock` entries.
const SOCK_V4: u32 = 0;
const SOCK_V6: u32 = 1;
/// Backlog of a black-hole listener: it never accepts (its filter drops every
/// segment, SYNs included), the value only has to make it a listener.
const BLACK_HOLE_BACKLOG: libc::c_int = 1;

/// The program as errors name it.
const LABEL: &str = "the flow hold (bpf/hold.bpf.c)";

/// `IPV6_FREEBIND` (linux/in6.h).
const IPV6_FREEBIND: libc::c_int = 78;

/// `struct hold_key` of `bpf/hold.bpf.c`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct HoldKey {
    family: u32,
    local_ip: [u32; 4],
    remote_ip: [u32; 4],
    local_port: u32,
    remote_port: u32,
}

// SAFETY: repr(C), plain integers, no padding (9 u32s), every bit pattern valid.
unsafe impl aya::Pod for HoldKey {}

impl HoldKey {
    /// The key the program builds for segments from `remote` to `local`.
    fn new(local: SocketAddr, remote: SocketAddr) -> io::Result<HoldKey> {
        let (local, remote) = (unmap(local), unmap(remote));
        let mut k = HoldKey {
            local_port: u32::from(local.port()),
            // Network order, as the 16-bit field the program reads.
            remote_port: u32::from(u16::from_ne_bytes(remote.port().to_be_bytes())),
            ..HoldKey::default()
        };
        match (local, remote) {
            (SocketAddr::V4(l), SocketAddr::V4(r)) => {
                k.family = libc::AF_INET as u32;
                k.local_ip[0] = u32::from_ne_bytes(l.ip().octets());
                k.remote_ip[0] = u32::from_ne_bytes(r.ip().octets());
            }
            (SocketAddr::V6(l), SocketAddr::V6(r)) => {
                k.family = libc::AF_INET6 as u32;
                k.local_ip = words(l.ip().octets());
                k.remote_ip = words(r.ip().octets());
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("hold: {local} and {remote} are of different families"),
                ))
            }
        }
        Ok(k)
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 one (the lookup of an IPv4 segment has
/// family AF_INET even when a dual-stack socket serves it).
fn unmap(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        SocketAddr::V4(_) => a,
    }
}

fn words(o: [u8; 16]) -> [u32; 4] {
    let mut w = [0u32; 4];
    for (i, c) in o.chunks_exact(4).enumerate() {
        w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
    }
    w
}

fn err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("hold: {what}: {e}"))
}

/// A black-hole listener: bound with FREEBIND (the namespace's loopback may be down)
/// to port 0 of the loopback address, the drop-everything filter attached before
/// `listen`, so nothing ever reaches it, not even a SYN to its own port.
fn black_hole(v6: bool) -> io::Result<OwnedFd> {
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: plain socket(2); the fd is owned below.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = fd.as_raw_fd();
    let one: libc::c_int = 1;
    crate::dump::attach_drop_filter(raw)?;
    if v6 {
        sys::setsockopt(
            raw,
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            &one,
            "IPV6_V6ONLY",
        )?;
        sys::setsockopt(
            raw,
            libc::IPPROTO_IPV6,
            IPV6_FREEBIND,
            &one,
            "IPV6_FREEBIND",
        )?;
        let mut a: libc::sockaddr_in6 = zeroed_in6();
        a.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        a.sin6_addr.s6_addr = std::net::Ipv6Addr::LOCALHOST.octets();
        bind_raw(raw, &a)?;
    } else {
        sys::setsockopt(
            raw,
            libc::IPPROTO_IP,
            libc::IP_FREEBIND,
            &one,
            "IP_FREEBIND",
        )?;
        let a = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(std::net::Ipv4Addr::LOCALHOST.octets()),
            },
            sin_zero: [0; 8],
        };
        bind_raw(raw, &a)?;
    }
    // SAFETY: listen(2) on an owned, bound socket.
    if unsafe { libc::listen(raw, BLACK_HOLE_BACKLOG) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn zeroed_in6() -> libc::sockaddr_in6 {
    // SAFETY: sockaddr_in6 is plain data; all-zero is a valid value (::, port 0).
    unsafe { std::mem::zeroed() }
}

fn bind_raw<T>(fd: RawFd, addr: &T) -> io::Result<()> {
    // SAFETY: `addr` is a live sockaddr_in / sockaddr_in6 of the size passed.
    let r = unsafe {
        libc::bind(
            fd,
            (addr as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r != 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The sk_lookup flow hold attached to one network namespace (see the module doc).
/// Shared by the threads that migrate (`&self` methods); dropping it detaches the
/// program and frees its maps.
pub struct FlowHold {
    obj: Object,
    flows: RawMap,
    _v4: OwnedFd,
    v6: Option<OwnedFd>,
}

impl std::fmt::Debug for FlowHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowHold")
            .field("flows", &self.flows)
            .field("v6", &self.v6.is_some())
            .finish()
    }
}

impl FlowHold {
    /// Loads `bpf/hold.bpf.c` and attaches it to the calling thread's network
    /// namespace, with a black-hole listener for IPv4 and, if the namespace has
    /// IPv6, one for IPv6. Needs CAP_BPF and CAP_NET_ADMIN.
    pub fn attach() -> io::Result<FlowHold> {
        let mut obj = Object::load(LABEL, OBJECT)?;
        let flows = obj.raw_map("hold_flows")?;
        let socks = obj.raw_map("hold_sock")?;
        let v4 = black_hole(false).map_err(|e| err("IPv4 black-hole listener", e))?;
        put_sock(&socks, SOCK_V4, &v4)?;
        let v6 = match black_hole(true) {
            Ok(s) => {
                put_sock(&socks, SOCK_V6, &s)?;
                Some(s)
            }
            Err(e) => {
                log::debug!("migrate: no IPv6 black-hole listener ({e}): IPv6 flows not held");
                None
            }
        };
        obj.load_program::<SkLookup>("hold")?;
        obj.attach_sk_lookup("hold")?;
        Ok(FlowHold {
            obj,
            flows,
            _v4: v4,
            v6,
        })
    }

    /// Holds the segments from `remote` to `local` (the connection's addresses as
    /// its server socket sees them) for at most `ttl`, until the returned guard is
    /// dropped: while no established socket has that 4-tuple they are dropped
    /// silently instead of answered with a RST.
    pub fn hold(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        ttl: Duration,
    ) -> io::Result<Held<'_>> {
        let key = HoldKey::new(local, remote)?;
        if key.family == libc::AF_INET6 as u32 && self.v6.is_none() {
            return Err(err("IPv6 flow", "no IPv6 black-hole listener"));
        }
        let deadline = ktime_ns().saturating_add(ttl.as_nanos() as u64);
        let put = || self.flows.update(&key, &deadline, flags::ANY);
        match put() {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::E2BIG) => {
                // Full: entries past their deadline (holds not removed) make room.
                self.sweep_expired()?;
                put().map_err(|e| err("hold_flows (full)", e))?;
            }
            Err(e) => return Err(err("hold_flows", e)),
        }
        Ok(Held { hold: self, key })
    }

    /// The 4-tuples held now (expired ones included until removed).
    pub fn held(&self) -> io::Result<usize> {
        Ok(self.keys()?.len())
    }

    /// One of the program's counters (`CNT_*`) summed over CPUs.
    pub fn counter(&self, i: usize) -> io::Result<u64> {
        Ok(self.obj.per_cpu_sum("hold_counters", i as u32)?)
    }

    /// Every key in the map; bounded by [`FLOWS_MAX`] (plus one pass, in case
    /// entries come and go meanwhile).
    fn keys(&self) -> io::Result<Vec<HoldKey>> {
        self.flows
            .keys(FLOWS_MAX)
            .map_err(|e| err("hold_flows keys", e))
    }

    /// Removes the entries past their deadline.
    fn sweep_expired(&self) -> io::Result<()> {
        let now = ktime_ns();
        for k in self.keys()? {
            if let Ok(Some(deadline)) = self.flows.lookup::<HoldKey, u64>(&k) {
                if deadline < now {
                    let _ = self.flows.delete(&k);
                }
            }
        }
        Ok(())
    }
}

fn put_sock(socks: &RawMap, at: u32, sock: &OwnedFd) -> io::Result<()> {
    let fd = sock.as_raw_fd() as u64;
    socks
        .update(&at, &fd, flags::ANY)
        .map_err(|e| err("putting a black-hole listener in hold_sock", e))
}

/// One held 4-tuple; dropping it ends the hold.
#[derive(Debug)]
pub struct Held<'a> {
    hold: &'a FlowHold,
    key: HoldKey,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.hold.flows.delete(&self.key) {
            // The entry expires at its deadline anyway.
            log::warn!("migrate: removing a flow hold failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_what_the_program_reads() {
        let k = HoldKey::new(
            "10.0.0.1:8080".parse().unwrap(),
            "10.0.0.2:40000".parse().unwrap(),
        )
        .unwrap();
        assert_eq!(k.family, 2);
        assert_eq!(k.local_ip[0].to_ne_bytes(), [10, 0, 0, 1]);
        assert_eq!(k.remote_ip[0].to_ne_bytes(), [10, 0, 0, 2]);
        assert_eq!(k.local_port, 8080);
        assert_eq!((k.remote_port as u16).to_ne_bytes(), 40000u16.to_be_bytes());
        // A dual-stack socket's mapped addresses give the IPv4 key.
        let m = HoldKey::new(
            "[::ffff:10.0.0.1]:8080".parse().unwrap(),
            "[::ffff:10.0.0.2]:40000".parse().unwrap(),
        )
        .unwrap();
        assert_eq!(m, k);
        let v6 = HoldKey::new("[::1]:80".parse().unwrap(), "[::1]:5".parse().unwrap()).unwrap();
        assert_eq!(v6.family, 10);
        assert_eq!(v6.local_ip[3].to_ne_bytes(), [0, 0, 0, 1]);
        assert!(HoldKey::new("10.0.0.1:1".parse().unwrap(), "[::1]:5".parse().unwrap()).is_err());
    }
}
