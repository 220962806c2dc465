//! AF_XDP receive of the monitor's udp replies (`--monitor-rx xsk:IFACE`).
//!
//! With group reads the poller's cost at 1,024 back-ends is mostly the kernel's UDP
//! receive path, once per reply datagram (socket lookup, queueing, `recvmmsg`'s copy).
//! Here an XDP program on the monitor's interface (`bpf/xskrx.bpf.c`) redirects the
//! replies (IPv4 UDP to the poller's own port) into an AF_XDP socket (XSK) per RX
//! queue; the poller takes them from the socket's RX ring in a UMEM it maps, with no
//! system call per datagram, parses Ethernet/IPv4/UDP ([`parse_udp4`]) and matches
//! them exactly as the ones its UDP socket receives. The UDP socket still sends the
//! READs and stays bound: it owns the port, and takes whatever the program passes.
//!
//! Receive only, in copy mode (`XDP_COPY`) with the program attached in generic (skb)
//! mode, which every interface supports (lo, veth, any NIC driver): the datagram is
//! copied once into the UMEM and the UDP stack is skipped. One socket per RX queue of
//! the interface (at most [`XSK_QUEUES_MAX`]), each with its own UMEM of
//! [`frames_for`] frames of [`XSK_FRAME_BYTES`], a fill ring that holds every frame
//! and an RX ring as large (the completion ring the kernel requires is never used).
//!
//! The frames reach the poller cold: the kernel copied them on the CPU that received
//! them, into frames spread over the whole UMEM (the fill ring recycles them in order).
//! So [`XskRx::take`] hands them over in batches of [`TAKE_BATCH`] with every line of
//! every frame already asked for (prefetched), and the UMEM sits on transparent huge
//! pages where the kernel gives them, so a frame's first touch does not also miss the
//! TLB. The poller matches a batch in passes for the same reason (see
//! [`crate::endpoints`]).
//!
//! Needs CAP_NET_ADMIN, CAP_BPF and CAP_IPC_LOCK (root in practice); the caller falls
//! back to the UDP socket with one log line when anything here fails. The program is
//! detached when the receiver is dropped (the poller stops).
//!
//! Not covered: VLAN-tagged frames and IPv6 (passed to the stack: read through the
//! UDP socket); a datagram to the poller's port that this host only forwards would be
//! taken too (the program matches the port, not the destination address).

use aya::maps::{HashMap as BpfHashMap, MapData, XskMap};
use aya::programs::Xdp;
use farside_bpfrt::{Error, Object, XdpMode};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// RX queues one receiver binds (`max_entries` of the program's socket map): a monitor
/// host's NIC rarely has more than 16 queues, and each costs a UMEM; an interface with
/// more is refused (reduce them with `ethtool -L IFACE combined 16`).
pub const XSK_QUEUES_MAX: usize = 16;

/// Ports the program takes (`max_entries` of its port map): one per poller, and
/// AF_XDP receive runs one poller.
pub const XSK_PORTS_MAX: usize = 16;

/// Bytes of one UMEM frame: the smallest chunk the kernel accepts (2048); a reply
/// frame is 354 bytes (Ethernet, IPv4, UDP, 312 B of reply) after the kernel's
/// 256-byte headroom.
pub const XSK_FRAME_BYTES: u32 = 2048;

/// Fewest frames per queue: replies that may wait in the ring between two drains
/// with a handful of back-ends.
pub const XSK_FRAMES_MIN: u32 = 256;

/// Most frames per queue (8 MiB of UMEM): twice the monitor table's 1,024 back-ends,
/// so one period's replies (at most one per back-end, plus a few late ones) fit the
/// ring while the poller gathers them.
pub const XSK_FRAMES_MAX: u32 = 4096;

/// Most frames handed to the caller at once. Their misses overlap because a batch is
/// prefetched together (frames here; the caller's lookups, slots and statistics in
/// passes): ~26 lines a reply, so 16 replies' lines (~26 KiB) still fit the L1 data
/// cache (32 KiB) when the batch is matched; 64 overflowed it.
pub const TAKE_BATCH: usize = 16;

/// Entries of the completion ring: receive only, nothing ever completes, but the
/// kernel refuses to bind without one.
const XSK_COMP_RING: u32 = 8;

/// How long a bind refused with EBUSY is retried: a socket closed just before on the
/// same queue (a restarted monitor) gives the queue back from a kernel work item,
/// within milliseconds (seen: 1 bind in 10 refused right after a close on a 4-queue
/// veth); a queue still busy after this is held by another socket.
const BIND_BUSY_WAIT_MAX: Duration = Duration::from_millis(500);
/// Pause between two of those binds.
const BIND_BUSY_PAUSE: Duration = Duration::from_millis(1);

/// The compiled program (clang -target bpf), 8-byte aligned as ELF parsing needs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xskrx.bpf.o"));
/// The receiver as errors name it.
const LABEL: &str = "AF_XDP receive (bpf/xskrx.bpf.c)";
const PROG_NAME: &str = "xskrx";
const MAP_SOCKS: &str = "xskrx_socks";
const MAP_PORTS: &str = "xskrx_ports";

/// `ETHTOOL_GCHANNELS` and `SIOCETHTOOL` (linux/ethtool.h, linux/sockios.h).
const ETHTOOL_GCHANNELS: u32 = 0x3c;
const SIOCETHTOOL: libc::c_ulong = 0x8946;

/// UMEM frames for a poller reading `udp_slots` back-ends: two per back-end (a reply
/// and a late one), within [`XSK_FRAMES_MIN`]..=[`XSK_FRAMES_MAX`], a power of two
/// (ring sizes must be).
pub fn frames_for(udp_slots: usize) -> u32 {
    let want = (udp_slots.saturating_mul(2)).min(XSK_FRAMES_MAX as usize) as u32;
    want.next_power_of_two()
        .clamp(XSK_FRAMES_MIN, XSK_FRAMES_MAX)
}

/// Where a poller takes its udp replies from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum MonitorRx {
    /// The UDP socket (`recvmmsg`): the default.
    #[default]
    Udp,
    /// AF_XDP sockets on this interface's RX queues, the UDP socket as fallback.
    Xsk(String),
}

impl std::str::FromStr for MonitorRx {
    type Err = String;

    /// `udp` or `xsk:IFACE`.
    fn from_str(s: &str) -> Result<MonitorRx, String> {
        if s == "udp" {
            return Ok(MonitorRx::Udp);
        }
        let Some(ifname) = s.strip_prefix("xsk:") else {
            return Err(format!("{s:?}: expected udp or xsk:IFACE"));
        };
        if ifname.is_empty()
            || ifname.len() >= libc::IFNAMSIZ
            || ifname
                .bytes()
                .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0)
        {
            return Err(format!(
                "{s:?}: {ifname:?} is no interface name (1..{} bytes, no '/', ':' or spaces)",
                libc::IFNAMSIZ - 1
            ));
        }
        Ok(MonitorRx::Xsk(ifname.to_string()))
    }
}

impl std::fmt::Display for MonitorRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MonitorRx::Udp => f.write_str("udp"),
            MonitorRx::Xsk(i) => write!(f, "xsk:{i}"),
        }
    }
}

/// The IPv4 source and the UDP payload of a datagram to `port` in an Ethernet frame,
/// or `None` if the frame is not one (what the XDP program checks, checked again:
/// IPv4 without options, not a fragment, IP and UDP lengths consistent and within the
/// frame). The UDP checksum is not verified (the program does not either; on lo and
/// veth it is often only partial).
pub fn parse_udp4(frame: &[u8], port: u16) -> Option<(SocketAddr, &[u8])> {
    const ETH: usize = 14;
    const IP: usize = 20;
    const UDP: usize = 8;
    if frame.len() < ETH + IP + UDP || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[ETH..];
    // Version 4, header of 5 words (no options), protocol UDP.
    if ip[0] != 0x45 || ip[9] != libc::IPPROTO_UDP as u8 {
        return None;
    }
    // More fragments, or a fragment offset.
    if u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return None;
    }
    let ip_len = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ip_len < IP + UDP || ETH + ip_len > frame.len() {
        return None;
    }
    let udp = &ip[IP..ip_len];
    if usize::from(u16::from_be_bytes([udp[4], udp[5]])) != udp.len()
        || u16::from_be_bytes([udp[2], udp[3]]) != port
    {
        return None;
    }
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let sport = u16::from_be_bytes([udp[0], udp[1]]);
    Some((SocketAddr::from((src, sport)), &udp[UDP..]))
}

/// What failed while setting the receiver up (the BPF runtime's error: the message
/// names the step).
pub type XskError = farside_bpfrt::Error;

fn fail(step: &str, e: io::Error) -> XskError {
    Error::os(LABEL, step, e)
}

fn os_fail(step: &str) -> XskError {
    fail(step, io::Error::last_os_error())
}

/// A memory mapping, unmapped when dropped.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(
        len: usize,
        flags: libc::c_int,
        fd: RawFd,
        offset: libc::off_t,
        step: &str,
    ) -> Result<Mapping, XskError> {
        // SAFETY: a fresh mapping of `len` bytes; the kernel checks fd and offset.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags | libc::MAP_POPULATE,
                fd,
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_fail(step));
        }
        Ok(Mapping { ptr: p.cast(), len })
    }
}

/// Bytes of a transparent huge page (x86_64, arm64 with 4 KiB pages).
const HUGE_PAGE_BYTES: usize = 2 << 20;

impl Mapping {
    /// Anonymous memory for a UMEM, on transparent huge pages where the kernel gives
    /// them (`madvise`, a hint): the replies land in frames spread over the whole UMEM
    /// (the fill ring recycles them in order), so with 4 KiB pages every reply's first
    /// touch also missed the TLB; 2 MiB pages make the UMEM a few TLB entries. The
    /// region is aligned to a huge page and populated before it is registered.
    fn umem(len: usize) -> Result<Mapping, XskError> {
        let step = "mapping the UMEM";
        let span = len.next_multiple_of(HUGE_PAGE_BYTES);
        // SAFETY: a fresh anonymous mapping, large enough to cut an aligned span from.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span + HUGE_PAGE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_fail(step));
        }
        let base = p as usize;
        let start = base.next_multiple_of(HUGE_PAGE_BYTES);
        let end = base + span + HUGE_PAGE_BYTES;
        // SAFETY: the slack before `start` and after `start + span` lies within the
        // mapping just made and is not used.
        unsafe {
            if start > base {
                libc::munmap(p, start - base);
            }
            if end > start + span {
                libc::munmap((start + span) as *mut libc::c_void, end - start - span);
            }
        }
        let m = Mapping {
            ptr: start as *mut u8,
            len: span,
        };
        // SAFETY: advice and population on our own mapping; a refused advice leaves
        // 4 KiB pages, which work the same.
        unsafe {
            libc::madvise(m.ptr.cast(), span, libc::MADV_HUGEPAGE);
            if libc::madvise(m.ptr.cast(), span, libc::MADV_POPULATE_WRITE) != 0 {
                // Before Linux 5.14: touch every page instead.
                for off in (0..span).step_by(4096) {
                    m.ptr.add(off).write_volatile(0);
                }
            }
        }
        Ok(m)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One ring shared with the kernel: producer and consumer indices (free-running u32)
/// and `size` descriptors of `T`.
struct Ring<T> {
    /// Keeps the ring mapped while the pointers below are used.
    _map: Mapping,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    desc: *mut T,
    mask: u32,
}

impl<T> Ring<T> {
    /// Map ring `off` of `fd` at page offset `pgoff`, `size` entries.
    fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: u64,
        step: &str,
    ) -> Result<Ring<T>, XskError> {
        let len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        let map = Mapping::new(len, libc::MAP_SHARED, fd, pgoff as libc::off_t, step)?;
        // SAFETY: the kernel's offsets lie within the mapping it sized for them; the
        // indices are 4-byte aligned u32s, the descriptors aligned for T.
        let (producer, consumer, desc) = unsafe {
            (
                map.ptr.add(off.producer as usize) as *const AtomicU32,
                map.ptr.add(off.consumer as usize) as *const AtomicU32,
                map.ptr.add(off.desc as usize) as *mut T,
            )
        };
        Ok(Ring {
            _map: map,
            producer,
            consumer,
            desc,
            mask: size - 1,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into `self.map`, alive as long as self.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    fn slot(&self, i: u32) -> *mut T {
        // SAFETY: masked index within the ring's `size` descriptors.
        unsafe { self.desc.add((i & self.mask) as usize) }
    }
}

/// One RX queue's socket, UMEM and rings. Field order is drop order: the socket
/// closes before its rings and UMEM are unmapped.
struct Queue {
    fd: OwnedFd,
    rx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    umem: Mapping,
}

impl Queue {
    /// Create the socket, register a UMEM of `frames` frames, create and map its
    /// rings, give every frame to the kernel (fill ring) and bind to `queue` of
    /// `ifindex` in copy mode.
    fn open(ifindex: u32, queue: u32, frames: u32) -> Result<Queue, XskError> {
        // SAFETY: plain socket(2).
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(os_fail("socket(AF_XDP)"));
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem_len = frames as usize * XSK_FRAME_BYTES as usize;
        let umem = Mapping::umem(umem_len)?;
        let reg = libc::xdp_umem_reg {
            addr: umem.ptr as u64,
            len: umem_len as u64,
            chunk_size: XSK_FRAME_BYTES,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setopt(&fd, libc::XDP_UMEM_REG, &reg, "registering the UMEM")?;
        setopt(
            &fd,
            libc::XDP_UMEM_FILL_RING,
            &frames,
            "sizing the fill ring",
        )?;
        setopt(
            &fd,
            libc::XDP_UMEM_COMPLETION_RING,
            &XSK_COMP_RING,
            "sizing the completion ring",
        )?;
        setopt(&fd, libc::XDP_RX_RING, &frames, "sizing the RX ring")?;
        // SAFETY: plain data, all-zero valid; getsockopt fills it.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: off is a valid buffer of len bytes.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(os_fail("reading the ring offsets"));
        }
        if len as usize != std::mem::size_of::<libc::xdp_mmap_offsets>() {
            return Err(fail(
                "reading the ring offsets",
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    "the kernel predates ring flags (5.4)",
                ),
            ));
        }
        let fill: Ring<u64> = Ring::map(
            fd.as_raw_fd(),
            &off.fr,
            frames,
            libc::XDP_UMEM_PGOFF_FILL_RING,
            "mapping the fill ring",
        )?;
        let rx: Ring<libc::xdp_desc> = Ring::map(
            fd.as_raw_fd(),
            &off.rx,
            frames,
            libc::XDP_PGOFF_RX_RING as u64,
            "mapping the RX ring",
        )?;
        // Every frame to the kernel.
        let prod = fill.producer().load(Ordering::Relaxed);
        for k in 0..frames {
            // SAFETY: slot within the ring; we are its only producer.
            unsafe { *fill.slot(prod.wrapping_add(k)) = u64::from(k * XSK_FRAME_BYTES) };
        }
        fill.producer()
            .store(prod.wrapping_add(frames), Ordering::Release);
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_COPY,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        let give_up = Instant::now() + BIND_BUSY_WAIT_MAX;
        loop {
            // SAFETY: sa is a valid sockaddr_xdp of the stated length.
            let rc = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_xdp).cast(),
                    std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                return Ok(Queue { fd, rx, fill, umem });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < give_up {
                std::thread::sleep(BIND_BUSY_PAUSE);
                continue;
            }
            let busy = if e.raw_os_error() == Some(libc::EBUSY) {
                " (another AF_XDP socket holds the queue)"
            } else {
                ""
            };
            return Err(fail(
                &format!("binding to RX queue {queue} in copy mode{busy}"),
                e,
            ));
        }
    }

    /// Hand the datagrams in the RX ring to `f`, up to [`TAKE_BATCH`] at a time, then
    /// their frames back to the kernel. Returns the datagrams taken.
    fn take(&mut self, f: &mut impl FnMut(&[&[u8]])) -> usize {
        let prod = self.rx.producer().load(Ordering::Acquire);
        let mut cons = self.rx.consumer().load(Ordering::Relaxed);
        let total = prod.wrapping_sub(cons);
        let mut fill_prod = self.fill.producer().load(Ordering::Relaxed);
        let mut frames: [&[u8]; TAKE_BATCH] = [&[]; TAKE_BATCH];
        while cons != prod {
            let n = prod.wrapping_sub(cons).min(TAKE_BATCH as u32);
            let mut k = 0;
            for j in 0..n {
                // SAFETY: entries cons..prod were published by the kernel (Acquire above).
                let d = unsafe { std::ptr::read(self.rx.slot(cons.wrapping_add(j))) };
                let (addr, len) = (d.addr as usize, d.len as usize);
                if addr.checked_add(len).is_some_and(|e| e <= self.umem.len) {
                    // SAFETY: within the UMEM (checked); the kernel wrote it before
                    // publishing the descriptor and does not touch it until refilled,
                    // which happens after `f` returns.
                    let frame = unsafe { std::slice::from_raw_parts(self.umem.ptr.add(addr), len) };
                    // The frame was written by the CPU that received it: ask for all of
                    // its lines now, so the misses overlap instead of one per reply.
                    crate::endpoints::prefetch_lines(frame.as_ptr(), len);
                    frames[k] = frame;
                    k += 1;
                }
                let base = d.addr & !u64::from(XSK_FRAME_BYTES - 1);
                // The fill ring holds every frame, so it has room for each one taken;
                // the kernel sees these entries only when the producer moves, below.
                // SAFETY: slot within the ring; we are its only producer.
                unsafe { *self.fill.slot(fill_prod.wrapping_add(j)) = base };
            }
            f(&frames[..k]);
            cons = cons.wrapping_add(n);
            fill_prod = fill_prod.wrapping_add(n);
            self.rx.consumer().store(cons, Ordering::Release);
            self.fill.producer().store(fill_prod, Ordering::Release);
        }
        total as usize
    }
}

fn setopt<T>(fd: &OwnedFd, opt: libc::c_int, v: &T, step: &str) -> Result<(), XskError> {
    // SAFETY: v is a valid T of the stated size for the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(os_fail(step));
    }
    Ok(())
}

/// RX queues of `ifname` (ethtool's rx + combined channels); 1 where the driver does
/// not say (lo).
fn rx_queues(ifname: &str) -> usize {
    #[repr(C)]
    #[derive(Default)]
    struct Channels {
        cmd: u32,
        max_rx: u32,
        max_tx: u32,
        max_other: u32,
        max_combined: u32,
        rx_count: u32,
        tx_count: u32,
        other_count: u32,
        combined_count: u32,
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        data: *mut Channels,
        _pad: [u8; 16],
    }
    let mut ch = Channels {
        cmd: ETHTOOL_GCHANNELS,
        ..Default::default()
    };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: &mut ch,
        _pad: [0; 16],
    };
    let n = ifname.len().min(libc::IFNAMSIZ - 1);
    req.name[..n].copy_from_slice(&ifname.as_bytes()[..n]);
    // SAFETY: plain socket(2) for the ioctl.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return 1;
    }
    // SAFETY: s is ours.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: req and ch outlive the call, as SIOCETHTOOL expects.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), SIOCETHTOOL as _, &mut req) };
    if rc != 0 {
        return 1;
    }
    ((ch.rx_count + ch.combined_count) as usize).max(1)
}

/// The program attached to an interface and a socket on each of its RX queues.
/// Detached when dropped.
pub struct XskRx {
    queues: Vec<Queue>,
    obj: Object,
    link: Option<aya::programs::xdp::XdpLinkId>,
    ifname: String,
    port: u16,
    frames: u32,
}

impl XskRx {
    /// Take the udp datagrams to `port` arriving on `ifname` (in the calling thread's
    /// network namespace) off the UDP stack, into sockets of `frames` frames per RX
    /// queue ([`frames_for`]). Nothing stays attached on error.
    pub fn open(ifname: &str, port: u16, frames: u32) -> Result<XskRx, XskError> {
        if port == 0 {
            return Err(Error::Config("udp port 0: nothing to receive".into()));
        }
        if !frames.is_power_of_two() || !(XSK_FRAMES_MIN..=XSK_FRAMES_MAX).contains(&frames) {
            return Err(Error::Config(format!(
                "{frames} frames: a power of two in {XSK_FRAMES_MIN}..={XSK_FRAMES_MAX}"
            )));
        }
        let ifindex = farside_bpfrt::ifindex(ifname)?;
        let nq = rx_queues(ifname);
        if nq > XSK_QUEUES_MAX {
            return Err(Error::Config(format!(
                "{ifname} has {nq} RX queues, AF_XDP receive binds at most {XSK_QUEUES_MAX} \
                 (ethtool -L {ifname} combined {XSK_QUEUES_MAX})"
            )));
        }
        let mut obj = Object::load(LABEL, OBJECT)?;
        obj.load_program::<Xdp>(PROG_NAME)?;
        let mut queues = Vec::with_capacity(nq);
        for q in 0..nq as u32 {
            queues.push(Queue::open(ifindex, q, frames)?);
        }
        {
            let mut socks: XskMap<&mut MapData> = obj.typed_mut(MAP_SOCKS)?;
            for (q, queue) in queues.iter().enumerate() {
                socks
                    .set(q as u32, queue.fd.as_raw_fd(), 0)
                    .map_err(|e| Error::map(LABEL, "adding a socket to the map", &e))?;
            }
            let mut ports: BpfHashMap<&mut MapData, u16, u8> = obj.typed_mut(MAP_PORTS)?;
            ports
                .insert(port.to_be(), 1, 0)
                .map_err(|e| Error::map(LABEL, "adding the port", &e))?;
        }
        let link = obj.attach_xdp(PROG_NAME, ifname, XdpMode::Generic)?;
        Ok(XskRx {
            queues,
            obj,
            link: Some(link),
            ifname: ifname.to_string(),
            port,
            frames,
        })
    }

    /// Hand every datagram waiting in the RX rings to `f` (whole Ethernet frames, up to
    /// [`TAKE_BATCH`] per call, their cache lines already asked for), then the frames
    /// back to the kernel. Returns the datagrams taken.
    pub fn take(&mut self, mut f: impl FnMut(&[&[u8]])) -> usize {
        self.queues.iter_mut().map(|q| q.take(&mut f)).sum()
    }

    /// The sockets' fds, for `ppoll` (POLLIN: the RX ring is not empty).
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.queues.iter().map(|q| q.fd.as_raw_fd())
    }

    /// The interface it receives on.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The udp port whose datagrams it takes.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// RX queues bound.
    pub fn queues(&self) -> usize {
        self.queues.len()
    }

    /// UMEM frames per queue.
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// Run the attached program once on `frame` (an Ethernet frame, as received on RX
    /// queue 0 of the namespace's lo) with `BPF_PROG_TEST_RUN`, for packet tests:
    /// returns the XDP action, [`XDP_PASS`] or [`XDP_REDIRECT`] (to the socket of
    /// queue 0). The frame is not delivered anywhere.
    pub fn test_run(&self, frame: &[u8]) -> io::Result<u32> {
        Ok(self.obj.test_run(PROG_NAME, frame, 0)?.retval)
    }
}

/// XDP actions [`XskRx::test_run`] returns.
pub const XDP_PASS: u32 = 2;
/// See [`XDP_PASS`].
pub const XDP_REDIRECT: u32 = 4;

impl Drop for XskRx {
    fn drop(&mut self) {
        // Detach before the sockets close, so no datagram is redirected to a socket
        // that is going away (dropping the program would detach too).
        if let Some(link) = self.link.take() {
            let _ = self.obj.detach_xdp(PROG_NAME, link, &self.ifname);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORT: u16 = 40_001;

    /// An Ethernet frame of an IPv4 UDP datagram from 10.0.0.7:7000 to PORT.
    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        let ip_len = (20 + 8 + payload.len()) as u16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&ip_len.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&[10, 0, 0, 7, 10, 0, 0, 1]);
        f.extend_from_slice(&7000u16.to_be_bytes());
        f.extend_from_slice(&PORT.to_be_bytes());
        f.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_datagram_to_the_port_is_parsed_with_its_source_and_payload() {
        let mut f = frame(b"reply");
        let (src, payload) = parse_udp4(&f, PORT).expect("ours");
        assert_eq!(src, "10.0.0.7:7000".parse().unwrap());
        assert_eq!(payload, b"reply");
        // Ethernet padding after the IP packet is not payload.
        f.extend_from_slice(&[0xee; 6]);
        assert_eq!(parse_udp4(&f, PORT).unwrap().1, b"reply");
    }

    #[test]
    fn truncated_frames_are_refused() {
        let f = frame(b"reply");
        for n in 0..f.len() {
            assert!(
                parse_udp4(&f[..n], PORT).is_none(),
                "{n} of {} bytes",
                f.len()
            );
        }
    }

    #[test]
    fn options_fragments_other_protocols_ports_and_bad_lengths_are_refused() {
        let good = frame(b"reply");
        let refused = |what: &str, change: &dyn Fn(&mut Vec<u8>)| {
            let mut f = good.clone();
            change(&mut f);
            assert!(parse_udp4(&f, PORT).is_none(), "{what}");
        };
        refused("not IPv4 (ARP)", &|f| {
            f[12..14].copy_from_slice(&[0x08, 0x06])
        });
        refused("IPv6 version", &|f| f[14] = 0x65);
        refused("IP options (ihl 6)", &|f| {
            f[14] = 0x46;
            f.splice(34..34, [1, 1, 1, 1]);
            let l = u16::from_be_bytes([f[16], f[17]]) + 4;
            f[16..18].copy_from_slice(&l.to_be_bytes());
        });
        refused("more fragments", &|f| f[20] = 0x20);
        refused("a fragment's offset", &|f| f[21] = 0x01);
        refused("TCP", &|f| f[23] = 6);
        refused("another port", &|f| {
            f[36..38].copy_from_slice(&(PORT + 1).to_be_bytes())
        });
        refused("IP length past the frame", &|f| {
            let l = u16::from_be_bytes([f[16], f[17]]) + 1;
            f[16..18].copy_from_slice(&l.to_be_bytes());
        });
        refused("IP length shorter than its headers", &|f| {
            f[16..18].copy_from_slice(&27u16.to_be_bytes())
        });
        refused("UDP length off by one", &|f| {
            let l = u16::from_be_bytes([f[38], f[39]]) - 1;
            f[38..40].copy_from_slice(&l.to_be_bytes());
        });
        // DF alone is not a fragment.
        let mut f = good.clone();
        f[20] = 0x40;
        assert!(parse_udp4(&f, PORT).is_some());
    }

    #[test]
    fn rx_flag_parses_udp_and_xsk_with_an_interface_and_refuses_the_rest() {
        assert_eq!("udp".parse::<MonitorRx>(), Ok(MonitorRx::Udp));
        assert_eq!(
            "xsk:eth0".parse::<MonitorRx>(),
            Ok(MonitorRx::Xsk("eth0".into()))
        );
        assert_eq!(MonitorRx::Xsk("lo".into()).to_string(), "xsk:lo");
        for bad in [
            "",
            "xsk",
            "xsk:",
            "xsk:a/b",
            "xsk:0123456789abcdef",
            "tcp",
            "xdp:lo",
        ] {
            assert!(bad.parse::<MonitorRx>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn frames_are_a_power_of_two_within_bounds() {
        assert_eq!(frames_for(0), XSK_FRAMES_MIN);
        assert_eq!(frames_for(16), XSK_FRAMES_MIN);
        assert_eq!(frames_for(1024), 2048);
        assert_eq!(frames_for(1 << 20), XSK_FRAMES_MAX);
    }

    /// The bounds above mirror bpf/xskrx.bpf.c.
    #[test]
    fn bounds_match_the_bpf_program() {
        let src = include_str!("../../../bpf/xskrx.bpf.c");
        assert!(src.contains(&format!("#define XSKRX_QUEUES_MAX {XSK_QUEUES_MAX}\n")));
        assert!(src.contains(&format!("#define XSKRX_PORTS_MAX {XSK_PORTS_MAX}\n")));
    }
}
