//! A bounded request flood against one back-end's udp responder: one thread sends READ
//! requests as fast as it can for a fixed time, another counts the replies. Measures the
//! request rate one back-end sustains (and what it drops), for XDP vs user space.
//!
//! The measuring side must not be what loses replies: both threads share the prober's
//! CPU, so requests go out [`BATCH`] per `sendmmsg` and replies come in [`BATCH`] per
//! `recvmmsg` into a socket with a [`RCVBUF_BYTES`] receive buffer. Every unanswered
//! request is then located by counters along the path ([`FloodResult`]): the back-end's
//! socket, the CPUs' input backlogs, the prober's socket.

use farside_rmem::wire::{
    encode_request, Op, RepHeader, ReqHeader, Status, ENVELOPE_BYTES, REP_BYTES_MAX,
    REP_HEADER_BYTES,
};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest flood allowed (a bound on any load this machine's lab generates).
pub const FLOOD_S_MAX: f64 = 30.0;
/// Requests per `sendmmsg` and replies per `recvmmsg` (one clock check per batch).
pub const BATCH: usize = 64;
/// A flood's replies have all been counted once none came for this long.
const DRAIN_QUIET: Duration = Duration::from_millis(50);
/// Longest the count waits for queued replies after the last send.
const DRAIN_MAX: Duration = Duration::from_secs(2);
/// The prober's receive buffer (SO_RCVBUFFORCE as root, else what SO_RCVBUF grants):
/// 3 s of replies arriving 20k/s faster than the counter drains them fit.
pub const RCVBUF_BYTES: usize = 64 << 20;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FloodResult {
    pub sent: u64,
    pub replies: u64,
    pub seconds: f64,
    /// Sends the prober's kernel refused (e.g. ENOBUFS): never left the prober.
    pub send_errors: u64,
    /// Replies dropped at the prober's own socket (its netns' UDP `RcvbufErrors` over the
    /// flood): answered by the back-end, lost by the measuring side.
    pub prober_rcvbuf_drops: u64,
    /// Packets dropped by a full per-CPU input backlog (`/proc/net/softnet_stat`'s
    /// second column, all CPUs, machine-wide: veth hands packets over through it).
    pub backlog_drops: u64,
}

/// A netns' UDP counters (`Udp:` of `/proc/thread-self/net/snmp`: the calling thread's
/// namespace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpCounters {
    pub in_datagrams: u64,
    pub in_errors: u64,
    pub rcvbuf_errors: u64,
}

/// Parses the two `Udp:` lines of an snmp file (names, then values).
pub fn parse_udp_snmp(text: &str) -> Option<UdpCounters> {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let names: Vec<&str> = lines.next()?.split_whitespace().collect();
    let values: Vec<&str> = lines.next()?.split_whitespace().collect();
    let get = |k: &str| {
        names
            .iter()
            .position(|n| *n == k)
            .and_then(|i| values.get(i))
            .and_then(|v| v.parse().ok())
    };
    Some(UdpCounters {
        in_datagrams: get("InDatagrams")?,
        in_errors: get("InErrors")?,
        rcvbuf_errors: get("RcvbufErrors")?,
    })
}

/// The calling thread's netns UDP counters.
pub fn udp_counters() -> io::Result<UdpCounters> {
    let text = std::fs::read_to_string("/proc/thread-self/net/snmp")?;
    parse_udp_snmp(&text).ok_or_else(|| io::Error::other("no Udp: lines in net/snmp"))
}

/// Sum of the per-CPU input backlog drops (`softnet_stat`, second column, hex).
pub fn parse_softnet_dropped(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|v| u64::from_str_radix(v, 16).ok())
        .sum()
}

fn backlog_dropped() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat").map_or(0, |t| parse_softnet_dropped(&t))
}

impl FloodResult {
    pub fn replies_per_s(&self) -> f64 {
        self.replies as f64 / self.seconds.max(1e-9)
    }
}

/// Flood `target` with READs of `size` bytes for `seconds` (at most `FLOOD_S_MAX`).
pub fn flood(
    target: SocketAddr,
    key: farside_rmem::ClientKey,
    size: usize,
    seconds: f64,
) -> io::Result<FloodResult> {
    let seconds = seconds.clamp(0.1, FLOOD_S_MAX);
    let sock = UdpSocket::bind(if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })?;
    sock.connect(target)?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    set_rcvbuf(&sock, RCVBUF_BYTES);
    let rx = sock.try_clone()?;
    let stop = Arc::new(AtomicBool::new(false));
    let replies = Arc::new(AtomicU64::new(0));
    let counter = {
        let (stop, replies) = (stop.clone(), replies.clone());
        std::thread::spawn(move || {
            let mut bufs = vec![[0u8; REP_BYTES_MAX]; BATCH];
            while !stop.load(Ordering::Relaxed) {
                let Ok(lens) = recv_batch(&rx, &mut bufs) else {
                    continue;
                };
                let ok = lens
                    .iter()
                    .zip(&bufs)
                    .filter(|(n, b)| {
                        // The covered bytes (the tag is not checked: counting only).
                        b[..**n]
                            .get(ENVELOPE_BYTES..)
                            .and_then(|c| RepHeader::decode(c).ok())
                            .is_some_and(|h| h.status == Status::Ok)
                    })
                    .count();
                replies.fetch_add(ok as u64, Ordering::Relaxed);
            }
        })
    };
    let udp0 = udp_counters().unwrap_or_default();
    let backlog0 = backlog_dropped();
    let mut reqs: Vec<Vec<u8>> = vec![Vec::new(); BATCH];
    let mut covered = Vec::new();
    let mut env = farside_rmem::auth::SenderState::new();
    let mut sent = 0u64;
    let mut send_errors = 0u64;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        for (i, req) in reqs.iter_mut().enumerate() {
            encode_request(
                &mut covered,
                &ReqHeader {
                    op: Op::Read as u8,
                    seq: sent + i as u64,
                    region: 0,
                    offset: 0,
                    len: size as u32,
                    ..Default::default()
                },
                &[],
            );
            // Sealed (a new envelope each: the server's replay window refuses copies).
            farside_rmem::auth::seal_request(req, &key, env.sender, env.next_seq(), &covered);
            // Padded to the reply's size, as UdpClient does, so XDP can answer in place.
            req.resize(req.len().max(ENVELOPE_BYTES + REP_HEADER_BYTES + size), 0);
        }
        match send_batch(&sock, &reqs) {
            Ok(n) => {
                sent += n as u64;
                send_errors += (BATCH - n) as u64;
            }
            Err(_) => send_errors += BATCH as u64,
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    // Replies in flight or queued in the (large) receive buffer: counted until none
    // came for DRAIN_QUIET, at most DRAIN_MAX.
    let drain_end = Instant::now() + DRAIN_MAX;
    let mut last = replies.load(Ordering::Relaxed);
    while Instant::now() < drain_end {
        std::thread::sleep(DRAIN_QUIET);
        let now = replies.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        last = now;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = counter.join();
    let udp1 = udp_counters().unwrap_or_default();
    Ok(FloodResult {
        sent,
        replies: replies.load(Ordering::Relaxed),
        seconds: elapsed,
        send_errors,
        prober_rcvbuf_drops: udp1.rcvbuf_errors.saturating_sub(udp0.rcvbuf_errors),
        backlog_drops: backlog_dropped().saturating_sub(backlog0),
    })
}

/// Asks for a `bytes` receive buffer: SO_RCVBUFFORCE (root, past rmem_max), else
/// SO_RCVBUF (capped by rmem_max). Best effort: the drops are counted either way.
fn set_rcvbuf(sock: &UdpSocket, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt with a valid c_int and its size.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            return;
        }
    }
}

/// One `mmsghdr` per iovec (no address: the socket is connected). The iovecs must
/// outlive every use of the headers.
fn headers(iovs: &mut [libc::iovec]) -> Vec<libc::mmsghdr> {
    iovs.iter_mut()
        .map(|iov| {
            // SAFETY: an all-zero mmsghdr is valid (no name, no control).
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect()
}

/// Sends `reqs` with one `sendmmsg` on the connected `sock`: how many went out.
fn send_batch(sock: &UdpSocket, reqs: &[Vec<u8>]) -> io::Result<usize> {
    let mut iovs: Vec<libc::iovec> = reqs
        .iter()
        .map(|r| libc::iovec {
            iov_base: r.as_ptr().cast_mut().cast(),
            iov_len: r.len(),
        })
        .collect();
    let mut msgs = headers(&mut iovs);
    // SAFETY: msgs describes valid buffers (above).
    let n = unsafe { libc::sendmmsg(sock.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as _, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Receives up to `bufs.len()` datagrams with one `recvmmsg` (waits for the first, up to
/// the socket's read timeout): their lengths.
fn recv_batch(sock: &UdpSocket, bufs: &mut [[u8; REP_BYTES_MAX]]) -> io::Result<Vec<usize>> {
    let mut iovs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    let mut msgs = headers(&mut iovs);
    // SAFETY: msgs describes valid buffers (above); no timeout pointer.
    let n = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            msgs.as_mut_ptr(),
            msgs.len() as _,
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(msgs[..n as usize]
        .iter()
        .map(|m| m.msg_len as usize)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_snmp_and_softnet_stat_parse() {
        let snmp = "Ip: Forwarding\nIp: 1\nUdp: InDatagrams NoPorts InErrors OutDatagrams \
                    RcvbufErrors SndbufErrors\nUdp: 100 2 7 90 5 0\nUdpLite: InDatagrams\nUdpLite: 0\n";
        assert_eq!(
            parse_udp_snmp(snmp),
            Some(UdpCounters {
                in_datagrams: 100,
                in_errors: 7,
                rcvbuf_errors: 5
            })
        );
        assert_eq!(parse_udp_snmp("Ip: x\n"), None);
        let softnet = "2c5b74d3 00000531 000001af\n1c28303f 00000284 000000db\n";
        assert_eq!(parse_softnet_dropped(softnet), 0x531 + 0x284);
        // This thread's own namespace has the lines.
        assert!(udp_counters().is_ok());
    }
}
