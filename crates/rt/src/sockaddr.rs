//! One conversion between `std::net::SocketAddr` and the C socket addresses
//! (`sockaddr_in`, `sockaddr_in6` inside a `sockaddr_storage`) that raw socket calls
//! (`bind`, `connect`, `sendmsg`, `recvmmsg`, `getsockname`) take and return.
//!
//! Both directions keep every field: port, address, and for IPv6 the flow label and
//! scope id. The functions are `#[inline]`: a poller converts every datagram's source
//! address on its receive path.

use std::mem::size_of;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// `addr` as a C socket address and its length (the length of the family's struct,
/// as `bind`/`connect` expect).
#[inline]
pub fn to_storage(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The address in `ss` (as the kernel filled it for `getsockname`, `recvfrom`,
/// `recvmmsg`), or None if its family is neither IPv4 nor IPv6.
#[inline]
pub fn from_storage(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn every_field_survives_the_round_trip() {
        for a in [
            "127.0.0.1:8080".parse::<SocketAddr>().unwrap(),
            "10.1.2.3:1".parse().unwrap(),
            SocketAddr::V6(SocketAddrV6::new(
                "fe80::1".parse().unwrap(),
                7000,
                0x12345,
                3,
            )),
            "[::1]:65535".parse().unwrap(),
        ] {
            let (ss, len) = to_storage(&a);
            let want = if a.is_ipv4() {
                size_of::<libc::sockaddr_in>()
            } else {
                size_of::<libc::sockaddr_in6>()
            };
            assert_eq!(len as usize, want, "{a}");
            assert_eq!(from_storage(&ss), Some(a));
        }
        // SAFETY: all-zero is a valid sockaddr_storage (family AF_UNSPEC).
        let unspec: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(from_storage(&unspec), None);
    }

    /// The kernel reads and writes the same layout: a socket bound through
    /// [`to_storage`] reports that address through `getsockname` and [`from_storage`].
    #[test]
    fn the_kernel_agrees_with_the_conversion() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let want = l.local_addr().unwrap();
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: ss is a live sockaddr_storage and len its size.
        let rc = unsafe {
            libc::getsockname(
                l.as_raw_fd(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        assert_eq!(from_storage(&ss), Some(want));
        let (mine, mine_len) = to_storage(&want);
        assert_eq!(mine_len, len);
        // SAFETY: both are plain data of at least `len` bytes.
        let (a, b) = unsafe {
            (
                std::slice::from_raw_parts(
                    (&ss as *const libc::sockaddr_storage).cast::<u8>(),
                    len as usize,
                ),
                std::slice::from_raw_parts(
                    (&mine as *const libc::sockaddr_storage).cast::<u8>(),
                    len as usize,
                ),
            )
        };
        assert_eq!(a, b);
    }
}
