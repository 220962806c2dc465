//! What an attacker on a shared segment does with packets: build IPv4 UDP and TCP
//! packets with any source address and send them through a raw socket
//! (`IPPROTO_RAW`, the header written by us), capture what the segment carries
//! (`AF_PACKET`), and make the lab's bridge mirror a node's traffic to the attacker's
//! port (`tc ... action mirred egress mirror`), which is what a hub, a shared
//! Wi-Fi segment or a compromised switch port gives an attacker.
//!
//! Sockets are opened inside a node's network namespace ([`VirtualDc::run_in_ns`]) and
//! keep it, so the attack code can use them from any thread afterwards.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::fabric::netns::VirtualDc;

/// Most packets a [`Sniffer`] keeps (the newest: older ones are dropped): about 20 s of
/// the mirrored segment (the monitor's reads of two regions every millisecond, both
/// directions, ~4,000 packets/s), bounded so a flood cannot grow the lab's memory.
pub const CAPTURE_PACKETS_MAX: usize = 100_000;
/// The capture socket's receive buffer (bytes): seconds of the mirrored segment, so a
/// burst of replies is not lost while the capture thread sorts packets.
const CAPTURE_RCVBUF_BYTES: libc::c_int = 32 << 20;
/// Largest packet captured (bytes): an Ethernet MTU's IPv4 packet and more.
const CAPTURE_BYTES_MAX: usize = 65_536;
/// How often the capture thread looks at its stop flag.
const CAPTURE_POLL: Duration = Duration::from_millis(50);
/// IP protocol numbers.
pub const PROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;
/// TCP flags.
pub const TCP_SYN: u8 = 0x02;
/// TCP ACK flag.
pub const TCP_ACK: u8 = 0x10;
/// TCP PSH flag.
pub const TCP_PSH: u8 = 0x08;

/// The Internet checksum of `data` (RFC 1071), starting from the partial sum `sum`.
pub fn checksum(data: &[u8], mut sum: u32) -> u16 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        sum += u32::from(*b) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn pseudo_sum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, len: usize) -> u32 {
    let (s, d) = (src.octets(), dst.octets());
    u32::from(u16::from_be_bytes([s[0], s[1]]))
        + u32::from(u16::from_be_bytes([s[2], s[3]]))
        + u32::from(u16::from_be_bytes([d[0], d[1]]))
        + u32::from(u16::from_be_bytes([d[2], d[3]]))
        + u32::from(proto)
        + len as u32
}

fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4_len: usize, id: u16) -> Vec<u8> {
    let total = (20 + l4_len) as u16;
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&id.to_be_bytes());
    h.extend_from_slice(&0x4000u16.to_be_bytes()); // DF
    h.push(64);
    h.push(proto);
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let c = checksum(&h, 0);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

/// An IPv4 UDP packet from `src` to `dst` (any source: the raw socket sends it as is).
pub fn ipv4_udp(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let len = 8 + payload.len();
    let mut u = Vec::with_capacity(len);
    u.extend_from_slice(&src.port().to_be_bytes());
    u.extend_from_slice(&dst.port().to_be_bytes());
    u.extend_from_slice(&(len as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    let c = checksum(&u, pseudo_sum(*src.ip(), *dst.ip(), PROTO_UDP, len));
    let c = if c == 0 { 0xffff } else { c };
    u[6..8].copy_from_slice(&c.to_be_bytes());
    let mut p = ipv4_header(*src.ip(), *dst.ip(), PROTO_UDP, len, 0);
    p.extend_from_slice(&u);
    p
}

/// An IPv4 TCP segment (no options) from `src` to `dst`.
pub fn ipv4_tcp(
    src: SocketAddrV4,
    dst: SocketAddrV4,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let len = 20 + payload.len();
    let mut t = Vec::with_capacity(len);
    t.extend_from_slice(&src.port().to_be_bytes());
    t.extend_from_slice(&dst.port().to_be_bytes());
    t.extend_from_slice(&seq.to_be_bytes());
    t.extend_from_slice(&ack.to_be_bytes());
    t.push(5 << 4);
    t.push(flags);
    t.extend_from_slice(&64_240u16.to_be_bytes());
    t.extend_from_slice(&[0, 0, 0, 0]);
    t.extend_from_slice(payload);
    let c = checksum(&t, pseudo_sum(*src.ip(), *dst.ip(), PROTO_TCP, len));
    t[16..18].copy_from_slice(&c.to_be_bytes());
    let mut p = ipv4_header(*src.ip(), *dst.ip(), PROTO_TCP, len, 0);
    p.extend_from_slice(&t);
    p
}

/// A parsed IPv4 packet (no options needed: we read what we sent or captured).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    /// TCP only: sequence number and flags.
    pub tcp_seq: u32,
    pub tcp_flags: u8,
    /// The transport payload.
    pub payload: Vec<u8>,
    /// The whole IP packet, as captured (for a replay).
    pub raw: Vec<u8>,
}

impl Packet {
    /// Parse an IPv4 UDP or TCP packet; `None` for anything else or a truncated one.
    pub fn parse(p: &[u8]) -> Option<Packet> {
        if p.len() < 20 || p[0] >> 4 != 4 {
            return None;
        }
        let ihl = usize::from(p[0] & 0xf) * 4;
        let total = usize::from(u16::from_be_bytes([p[2], p[3]])).min(p.len());
        if ihl < 20 || total < ihl + 8 {
            return None;
        }
        let l4 = &p[ihl..total];
        let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
        let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
        let (sport, dport) = (
            u16::from_be_bytes([l4[0], l4[1]]),
            u16::from_be_bytes([l4[2], l4[3]]),
        );
        let (tcp_seq, tcp_flags, payload) = match p[9] {
            PROTO_UDP => (0, 0, l4[8..].to_vec()),
            PROTO_TCP => {
                if l4.len() < 20 {
                    return None;
                }
                let off = usize::from(l4[12] >> 4) * 4;
                if off < 20 || off > l4.len() {
                    return None;
                }
                (
                    u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]),
                    l4[13],
                    l4[off..].to_vec(),
                )
            }
            _ => return None,
        };
        Some(Packet {
            src,
            dst,
            proto: p[9],
            sport,
            dport,
            tcp_seq,
            tcp_flags,
            payload,
            raw: p[..total].to_vec(),
        })
    }
}

/// A raw IPv4 socket whose packets carry our own header (`IPPROTO_RAW`): any source
/// address, routed by destination in the namespace it was opened in.
pub struct RawSender {
    fd: OwnedFd,
    /// Packets and bytes (IP) sent.
    pub packets: u64,
    pub bytes: u64,
}

impl RawSender {
    /// Open one in `node`.
    pub fn open(dc: &VirtualDc, node: &str) -> io::Result<RawSender> {
        let fd = dc.run_in_ns(node, || {
            // SAFETY: plain socket(2).
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a fresh descriptor we own.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })?;
        Ok(RawSender {
            fd,
            packets: 0,
            bytes: 0,
        })
    }

    /// Send one IP packet (its destination read from its header). A full socket
    /// buffer (ENOBUFS) is waited out briefly, not counted as sent.
    pub fn send(&mut self, pkt: &[u8]) -> io::Result<()> {
        let dst = Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]);
        // SAFETY: plain data, all-zero valid.
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_addr.s_addr = u32::from_ne_bytes(dst.octets());
        for _ in 0..100 {
            // SAFETY: valid buffer and address for the call.
            let n = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    pkt.as_ptr().cast(),
                    pkt.len(),
                    0,
                    (&sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            if n >= 0 {
                self.packets += 1;
                self.bytes += pkt.len() as u64;
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOBUFS) {
                return Err(e);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Err(io::Error::other("raw send: socket buffer full for 20 ms"))
    }
}

/// Captured IPv4 packets of one interface, read by a thread until dropped.
pub struct Sniffer {
    got: Arc<Mutex<std::collections::VecDeque<Packet>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sniffer {
    /// Start capturing every IPv4 packet that arrives on `node`'s `eth0` (mirrored
    /// frames for other hosts included: the interface is put in promiscuous mode).
    pub fn start(dc: &VirtualDc, node: &str) -> io::Result<Sniffer> {
        let fd = dc.run_in_ns(node, || {
            let proto = (libc::ETH_P_IP as u16).to_be();
            // SAFETY: plain socket(2).
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(proto)) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a fresh descriptor we own.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let name = std::ffi::CString::new(crate::fabric::netns::VETH_IN_NS)
                .map_err(io::Error::other)?;
            // SAFETY: NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if ifindex == 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: plain data, all-zero valid.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto;
            sll.sll_ifindex = ifindex as i32;
            // SAFETY: valid address for bind.
            if unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sll as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            } != 0
            {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: plain data, all-zero valid.
            let mut mr: libc::packet_mreq = unsafe { std::mem::zeroed() };
            mr.mr_ifindex = ifindex as i32;
            mr.mr_type = libc::PACKET_MR_PROMISC as u16;
            // SAFETY: valid option value.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_PACKET,
                    libc::PACKET_ADD_MEMBERSHIP,
                    (&mr as *const libc::packet_mreq).cast(),
                    std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
                );
            }
            set_rcv_timeout(&fd, CAPTURE_POLL)?;
            let buf = CAPTURE_RCVBUF_BYTES;
            // SAFETY: valid option value; FORCE (root) goes past rmem_max.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUFFORCE,
                    (&buf as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
            Ok(fd)
        })?;
        let got = Arc::new(Mutex::new(std::collections::VecDeque::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, st) = (Arc::clone(&got), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("lab-sniffer".into())
            .spawn(move || {
                let mut buf = vec![0u8; CAPTURE_BYTES_MAX];
                while !st.load(Ordering::Relaxed) {
                    // SAFETY: plain data, all-zero valid.
                    let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                    // SAFETY: valid buffer and address out-pointers.
                    let n = unsafe {
                        libc::recvfrom(
                            fd.as_raw_fd(),
                            buf.as_mut_ptr().cast(),
                            buf.len(),
                            0,
                            (&mut from as *mut libc::sockaddr_ll).cast(),
                            &mut len,
                        )
                    };
                    if n <= 0 || from.sll_pkttype == libc::PACKET_OUTGOING {
                        continue;
                    }
                    if let Some(p) = Packet::parse(&buf[..n as usize]) {
                        let mut v = g.lock().unwrap_or_else(|p| p.into_inner());
                        if v.len() >= CAPTURE_PACKETS_MAX {
                            v.pop_front();
                        }
                        v.push_back(p);
                    }
                }
            })?;
        Ok(Sniffer {
            got,
            stop,
            thread: Some(thread),
        })
    }

    /// The packets captured so far that `keep` selects.
    pub fn matching(&self, keep: impl Fn(&Packet) -> bool) -> Vec<Packet> {
        let v = self.got.lock().unwrap_or_else(|p| p.into_inner());
        v.iter().filter(|p| keep(p)).cloned().collect()
    }

    /// Forget what was captured.
    pub fn clear(&self) {
        self.got.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Wait until a packet `keep` selects has been captured, at most `within`.
    pub fn wait_for(&self, within: Duration, keep: impl Fn(&Packet) -> bool) -> Option<Packet> {
        let t0 = Instant::now();
        loop {
            if let Some(p) = self.matching(&keep).into_iter().next() {
                return Some(p);
            }
            if t0.elapsed() > within {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Sniffer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(crate) fn set_rcv_timeout(fd: &OwnedFd, t: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: valid option value.
    if unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Make the bridge copy every frame `from` sends (its bridge port's ingress) to the
/// port of `to`, as a shared segment would show them to `to`.
pub fn mirror(dc: &VirtualDc, from: &str, to: &str) -> io::Result<()> {
    let ns = dc
        .bridge_netns_path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (src, dst) = (dc.veth_peer(from), dc.veth_peer(to));
    let tc = |args: &[&str]| -> io::Result<()> {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "tc"])
            .args(args)
            .output()?;
        if !out.status.success() {
            let e = String::from_utf8_lossy(&out.stderr);
            // A second mirror from the same port finds its qdisc there.
            if !(args.contains(&"qdisc") && e.contains("File exists")) {
                return Err(io::Error::other(format!(
                    "tc {}: {}",
                    args.join(" "),
                    e.trim()
                )));
            }
        }
        Ok(())
    };
    tc(&["qdisc", "add", "dev", &src, "clsact"])?;
    tc(&[
        "filter", "add", "dev", &src, "ingress", "protocol", "all", "u32", "match", "u32", "0",
        "0", "action", "mirred", "egress", "mirror", "dev", &dst,
    ])
}

/// Undo [`mirror`] from `from` (every filter of its port's clsact goes with it).
pub fn unmirror(dc: &VirtualDc, from: &str) -> io::Result<()> {
    let ns = dc
        .bridge_netns_path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let src = dc.veth_peer(from);
    let out = std::process::Command::new("ip")
        .args([
            "netns", "exec", &ns, "tc", "qdisc", "del", "dev", &src, "clsact",
        ])
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "tc qdisc del dev {src} clsact: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_packets_parse_back_with_valid_checksums() {
        let a = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 10), 4000);
        let b = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 11), 7400);
        let u = ipv4_udp(a, b, b"hello");
        assert_eq!(checksum(&u[..20], 0), 0, "IP header checksum");
        let len = u.len() - 20;
        assert_eq!(
            checksum(&u[20..], pseudo_sum(*a.ip(), *b.ip(), PROTO_UDP, len)),
            0
        );
        let p = Packet::parse(&u).unwrap();
        assert_eq!(
            (p.src, p.dst, p.sport, p.dport),
            (*a.ip(), *b.ip(), 4000, 7400)
        );
        assert_eq!(p.payload, b"hello");
        let t = ipv4_tcp(a, b, 7, 9, TCP_ACK, b"xy");
        let len = t.len() - 20;
        assert_eq!(
            checksum(&t[20..], pseudo_sum(*a.ip(), *b.ip(), PROTO_TCP, len)),
            0
        );
        let p = Packet::parse(&t).unwrap();
        assert_eq!(
            (p.tcp_seq, p.tcp_flags, p.payload.as_slice()),
            (7, TCP_ACK, &b"xy"[..])
        );
        assert!(Packet::parse(&t[..30]).is_none());
    }
}
