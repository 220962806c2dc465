//! Per-flow policy rules over rtnetlink (what `ip rule add priority P from C ipproto
//! tcp sport S dport D lookup T` sends), without a process per rule: the bench moves
//! each connection's flow with one rule, and a fork/exec of `ip` on a busy host
//! costs tens of milliseconds, which would be most of the migration's latency.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const RTM_NEWRULE: u16 = 32;
const RTM_DELRULE: u16 = 33;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
/// `FR_ACT_TO_TBL`: look the packet up in `table`.
const FR_ACT_TO_TBL: u8 = 1;
// Attributes of linux/fib_rules.h.
const FRA_SRC: u16 = 2;
const FRA_PRIORITY: u16 = 6;
const FRA_TABLE: u16 = 15;
const FRA_IP_PROTO: u16 = 22;
const FRA_SPORT_RANGE: u16 = 23;
const FRA_DPORT_RANGE: u16 = 24;
/// Room for the kernel's answer (an error message echoes our request, < 128 bytes).
const REPLY_BYTES_MAX: usize = 1024;

/// One TCP flow's policy rule.
#[derive(Clone, Copy, Debug)]
pub struct FlowRule {
    /// Rule priority (before the main table's 32766).
    pub priority: u32,
    /// The client's address.
    pub from: Ipv4Addr,
    /// The client's port.
    pub sport: u16,
    /// The service port.
    pub dport: u16,
    /// Routing table to use.
    pub table: u32,
}

/// An rtnetlink socket in the network namespace of the thread that opened it.
pub struct RuleSock {
    fd: OwnedFd,
    seq: u32,
}

impl RuleSock {
    /// Opens a NETLINK_ROUTE socket in the calling thread's network namespace.
    pub fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2).
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor, owned from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        // SAFETY: setsockopt with a timeval of the length passed (bounds the ack wait).
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        Ok(Self { fd, seq: 0 })
    }

    /// Adds `r` (fails if it exists).
    pub fn add(&mut self, r: &FlowRule) -> io::Result<()> {
        self.request(RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL, r)
    }

    /// Deletes `r`.
    pub fn del(&mut self, r: &FlowRule) -> io::Result<()> {
        self.request(RTM_DELRULE, 0, r)
    }

    fn request(&mut self, kind: u16, flags: u16, r: &FlowRule) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let msg = encode(kind, NLM_F_REQUEST | NLM_F_ACK | flags, self.seq, r);
        // SAFETY: send a live buffer of the length passed (to the kernel: no address).
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = [0u8; REPLY_BYTES_MAX];
        loop {
            // SAFETY: receive into a live buffer of the length passed.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let b = &buf[..n as usize];
            if b.len() < 20 {
                return Err(io::Error::other("short netlink reply"));
            }
            let kind = u16::from_ne_bytes([b[4], b[5]]);
            let seq = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
            if kind != NLMSG_ERROR || seq != self.seq {
                continue; // not our ack (stale, or a notification)
            }
            let err = i32::from_ne_bytes([b[16], b[17], b[18], b[19]]);
            return if err == 0 {
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(-err))
            };
        }
    }
}

fn attr(m: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    m.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(payload);
    while m.len() % 4 != 0 {
        m.push(0);
    }
}

fn encode(kind: u16, flags: u16, seq: u32, r: &FlowRule) -> Vec<u8> {
    let mut m = vec![0u8; 16]; // nlmsghdr, length filled in below
    m[4..6].copy_from_slice(&kind.to_ne_bytes());
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    // struct fib_rule_hdr: family, dst_len, src_len, tos, table, res1, res2, action,
    // flags (u32).
    let table_byte = u8::try_from(r.table).unwrap_or(0);
    m.extend_from_slice(&[
        libc::AF_INET as u8,
        0,
        32,
        0,
        table_byte,
        0,
        0,
        FR_ACT_TO_TBL,
    ]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    attr(&mut m, FRA_PRIORITY, &r.priority.to_ne_bytes());
    attr(&mut m, FRA_SRC, &r.from.octets());
    attr(&mut m, FRA_IP_PROTO, &[libc::IPPROTO_TCP as u8]);
    let range = |p: u16| [p.to_ne_bytes(), p.to_ne_bytes()].concat();
    attr(&mut m, FRA_SPORT_RANGE, &range(r.sport));
    attr(&mut m, FRA_DPORT_RANGE, &range(r.dport));
    attr(&mut m, FRA_TABLE, &r.table.to_ne_bytes());
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_is_aligned_and_carries_every_selector() {
        let r = FlowRule {
            priority: 1000,
            from: Ipv4Addr::new(10, 79, 9, 1),
            sport: 40000,
            dport: 9001,
            table: 102,
        };
        let m = encode(RTM_NEWRULE, NLM_F_REQUEST, 7, &r);
        assert_eq!(m.len() % 4, 0);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        // header 16 + fib_rule_hdr 12 + attrs 8+8+8+8+8+8
        assert_eq!(m.len(), 16 + 12 + 48);
        assert_eq!(m[16 + 7], FR_ACT_TO_TBL);
    }
}
