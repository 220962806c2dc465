//! The kernel's own echo as the floor of a one-sided read (`lab probe`, transport
//! `icmp`): an ICMP echo request from the front node to the back-end node over the same
//! veth path, bridge and RPS steering the region reads take, answered by the back-end
//! node's kernel in softirq, with no program of ours on either side of the answer. A
//! one-sided read (XDP) can be no faster than this; what it costs above it is the read's
//! own path.
//!
//! The prober waits for the reply exactly as it waits for a region read
//! (`farside_rmem::ClientOptions::spin`: poll without sleeping for up to `spin`, then
//! sleep in `poll(2)` until the timeout), so the two rows differ only by what answers.
//! A raw ICMP socket needs root (the netns lab does already).

use farside_rmem::RmemError;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// ICMP echo request and reply types (RFC 792).
const ICMP_ECHO_REQUEST: u8 = 8;
const ICMP_ECHO_REPLY: u8 = 0;
/// ICMP header bytes (type, code, checksum, identifier, sequence).
const ICMP_HEADER: usize = 8;
/// Largest echo payload: the probe's largest read (4096 B) fits; a bigger request is
/// refused rather than fragmented.
pub const ECHO_PAYLOAD_MAX: usize = 4096;
/// Receive buffer: an IPv4 header with options (60 B) + ICMP header + the payload.
const RECV_BYTES: usize = 60 + ICMP_HEADER + ECHO_PAYLOAD_MAX;

/// The Internet checksum (RFC 1071) of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An echo request with `payload` bytes of body (pattern bytes), checksummed.
pub fn echo_request(id: u16, seq: u16, payload: usize) -> Vec<u8> {
    let mut p = vec![0u8; ICMP_HEADER + payload];
    p[0] = ICMP_ECHO_REQUEST;
    p[4..6].copy_from_slice(&id.to_be_bytes());
    p[6..8].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in p[ICMP_HEADER..].iter_mut().enumerate() {
        *b = i as u8;
    }
    let c = checksum(&p);
    p[2..4].copy_from_slice(&c.to_be_bytes());
    p
}

/// Whether `packet` (as a raw IPv4 ICMP socket receives it: IP header first) is the echo
/// reply to (`id`, `seq`) with a valid checksum.
pub fn is_reply_to(packet: &[u8], id: u16, seq: u16) -> bool {
    let Some(&v) = packet.first() else {
        return false;
    };
    let ihl = usize::from(v & 0x0f) * 4;
    if v >> 4 != 4 || ihl < 20 || packet.len() < ihl + ICMP_HEADER {
        return false;
    }
    let icmp = &packet[ihl..];
    icmp[0] == ICMP_ECHO_REPLY
        && icmp[1] == 0
        && icmp[4..6] == id.to_be_bytes()
        && icmp[6..8] == seq.to_be_bytes()
        && checksum(icmp) == 0
}

/// A raw ICMP socket sending echoes to one address.
pub struct IcmpEcho {
    fd: OwnedFd,
    dst: (libc::sockaddr_storage, libc::socklen_t),
    id: u16,
    seq: u16,
    spin: Duration,
    timeout: Duration,
    buf: Vec<u8>,
}

impl IcmpEcho {
    /// A raw ICMP socket towards `dst` (root or CAP_NET_RAW).
    pub fn new(dst: Ipv4Addr, spin: Duration, timeout: Duration) -> io::Result<IcmpEcho> {
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::IPPROTO_ICMP,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("raw ICMP socket (needs root or CAP_NET_RAW): {e}"),
            ));
        }
        // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(IcmpEcho {
            fd,
            dst: farside_rt::sockaddr::to_storage(&std::net::SocketAddr::from((dst, 0))),
            // Distinguishes this prober's replies from any other echo in the namespace.
            id: (std::process::id() & 0xffff) as u16,
            seq: 0,
            spin,
            timeout,
            buf: vec![0u8; RECV_BYTES],
        })
    }

    /// One echo with `payload` bytes; `Err(Timeout)` when no reply came in time.
    pub fn echo(&mut self, payload: usize) -> Result<(), RmemError> {
        if payload > ECHO_PAYLOAD_MAX {
            return Err(RmemError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("echo payload {payload} B > {ECHO_PAYLOAD_MAX} B"),
            )));
        }
        self.seq = self.seq.wrapping_add(1);
        let req = echo_request(self.id, self.seq, payload);
        // SAFETY: req and dst are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                req.as_ptr().cast(),
                req.len(),
                0,
                (&self.dst.0 as *const libc::sockaddr_storage).cast(),
                self.dst.1,
            )
        };
        if n < 0 {
            return Err(RmemError::Io(io::Error::last_os_error()));
        }
        let start = Instant::now();
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                if is_reply_to(&self.buf[..n as usize], self.id, self.seq) {
                    return Ok(());
                }
                continue; // another echo, our own request looped back, or a stale reply
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                return Err(RmemError::Io(e));
            }
            let waited = start.elapsed();
            if waited >= self.timeout {
                return Err(RmemError::Timeout);
            }
            if waited < self.spin {
                std::hint::spin_loop();
                continue;
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let left = (self.timeout - waited).as_millis().max(1) as libc::c_int;
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, left) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_a_checksummed_packet_is_zero() {
        for payload in [0, 1, 8, 63, 4096] {
            let p = echo_request(0x1234, 7, payload);
            assert_eq!(checksum(&p), 0, "payload {payload}");
        }
        // RFC 1071's example bytes.
        assert_eq!(
            checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
    }

    #[test]
    fn only_the_matching_valid_reply_is_accepted() {
        let mut reply = echo_request(9, 3, 16);
        reply[0] = ICMP_ECHO_REPLY;
        reply[2..4].copy_from_slice(&[0, 0]);
        let c = checksum(&reply);
        reply[2..4].copy_from_slice(&c.to_be_bytes());
        let mut ip = vec![0x45u8];
        ip.resize(20, 0);
        let packet: Vec<u8> = ip.iter().chain(&reply).copied().collect();
        assert!(is_reply_to(&packet, 9, 3));
        assert!(!is_reply_to(&packet, 9, 4), "other sequence");
        assert!(!is_reply_to(&packet, 8, 3), "other identifier");
        let mut bad = packet.clone();
        bad[30] ^= 1;
        assert!(!is_reply_to(&bad, 9, 3), "bad checksum");
        let mut req = packet.clone();
        req[20] = ICMP_ECHO_REQUEST;
        assert!(!is_reply_to(&req, 9, 3), "our own request looped back");
        assert!(!is_reply_to(&packet[..25], 9, 3), "truncated");
        assert!(!is_reply_to(&[], 9, 3));
        assert!(!is_reply_to(&[0x65; 40], 9, 3), "not IPv4");
    }

    /// As root: an echo to 127.0.0.1 in this namespace is answered; a payload over the
    /// bound is refused.
    #[test]
    #[ignore = "needs root: a raw ICMP socket"]
    fn echo_on_loopback_is_answered() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "needs root");
        let mut e = IcmpEcho::new(
            Ipv4Addr::LOCALHOST,
            Duration::from_micros(50),
            Duration::from_secs(2),
        )
        .unwrap();
        for size in [8, 512, 4096] {
            e.echo(size).unwrap();
        }
        assert!(e.echo(ECHO_PAYLOAD_MAX + 1).is_err());
    }
}
