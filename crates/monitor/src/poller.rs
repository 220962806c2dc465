//! The poller: one thread reads many back-ends' regions every period.
//!
//! ```text
//! every period G:
//!   shm slots      read in place (a mapped file: no waiting)
//!   udp slots      no read pending → queue a READ (new seq)
//!                  read pending past its attempt deadline → resend (retry flag, new
//!                  seq) or, after UDP_TRIES attempts, count a failed read
//!   flush          sendmmsg, BATCH_MAX datagrams per call, one socket per family
//!   until G ends   ppoll on the sockets; recvmmsg drains replies as they come
//! ```
//!
//! Every READ carries its own sequence number: `round << SLOT_BITS | slot`, so a reply
//! names its slot in O(1) and is accepted only if it answers one of the attempts of
//! the slot's pending read and comes from the slot's address; anything else (a reply
//! that arrives after its read was given up, a stray datagram) is counted as late and
//! dropped.
//!
//! **Group reads** (`MonitorOptions::group`): every period, the udp slots that can be
//! read by the group (IPv4, the shared read key, an endpoint no other slot has) get
//! ONE READ sent to the group address, `round << SLOT_BITS | GROUP_SLOT`, which every
//! back-end's responder answers from its own region endpoint. A reply to it names no
//! slot: it is matched by its SOURCE address (a map built at start, O(1), no
//! allocation per reply) and accepted only if that slot's pending read was started by
//! a group READ not older than the reply's and not newer than the last one sent (so a
//! back-end that answers a later period's group READ first still completes its read).
//! Unknown sources are counted (`unknown_source`) and dropped with the late ones. A
//! slot without a reply by the attempt deadline is retried like any unicast read: the
//! retry goes UNICAST to that back-end alone (simplest correct choice: a retry to the
//! group would make every back-end answer again for the few that were missed), and
//! after `UDP_TRIES` attempts counts a timed-out read, as today. At most one reply per
//! slot is accepted per read, so a period accepts at most as many group replies as the
//! poller has slots (the table's bound).
//!
//! **AF_XDP receive** (`MonitorOptions::rx`, [`crate::xsk`]): the IPv4 socket still
//! sends every READ and keeps its port, but the replies are taken from AF_XDP RX rings
//! (an XDP program redirects the datagrams to the socket's port there) and handed to
//! the same matching as the socket's; the rings' sockets join the `ppoll` set.
//!
//! A read's timeout and the error and staleness accounting are those of a
//! blocking client (`farside_rmem::UdpClient`: the read timeout split over
//! `UDP_TRIES` attempts; [`crate::watch::WatchState`]), without a thread per back-end.

use crate::endpoints::{prefetch_lines, EndpointIndex, ENDPOINTS_MAX};
use crate::watch::{WatchState, MONITOR_READ_BYTES};
use crate::xsk::{MonitorRx, XskRx};
use crate::{MonitorOptions, PollerStats, ReadStats, Watch, RECONNECT_BACKOFF_MAX};
use farside_region::Words;
use farside_rmem::auth::{open_reply, seal_request_to, ClientKey, SenderState};
use farside_rmem::udp::UDP_TRIES;
use farside_rmem::wire::{encode_request, Op, RepHeader, ReqHeader, Status, FLAG_RETRY};
use farside_rmem::wire::{ENVELOPE_BYTES, REP_HEADER_BYTES, REQ_HEADER_BYTES};
use farside_rmem::{Endpoint, RemoteMemory, RmemError, ShmClient};
use farside_rt::sockaddr::{from_storage, to_storage};
use farside_rt::{mono_ns, Pacer};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Low bits of a READ's sequence number that name its slot: a poller holds at most
/// 2^20 slots, far above the table's bound, and the 44 high bits count rounds (never
/// wrap in practice: 2^44 periods of 1 ms are 550 years).
pub const SLOT_BITS: u32 = 20;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

/// Slot bits of a group READ's sequence number: no slot has this index (slots are
/// fewer than `SLOT_MASK`), so a group reply never names a slot by its seq.
pub const GROUP_SLOT: u64 = SLOT_MASK;

/// Datagrams per `sendmmsg`/`recvmmsg` call: one call moves a batch, and the arrays
/// live on the poller's stack (64 × 512 B of replies).
pub const BATCH_MAX: usize = 64;

/// A READ request padded to its reply's size (servers refuse shorter ones).
const REQ_PADDED_BYTES: usize = ENVELOPE_BYTES + REP_HEADER_BYTES + MONITOR_READ_BYTES;
/// The sealed part of a READ request: envelope and header.
const REQ_SEALED_BYTES: usize = ENVELOPE_BYTES + REQ_HEADER_BYTES;
const _: () = assert!(REQ_PADDED_BYTES >= REQ_SEALED_BYTES);

/// Receive buffer of one datagram: a reply is `ENVELOPE_BYTES + REP_HEADER_BYTES +
/// MONITOR_READ_BYTES` (344 B); anything longer is truncated and refused.
const REPLY_BUF_BYTES: usize = 512;

/// Socket receive buffer per udp slot: a small datagram costs about 1–2 KiB of kernel
/// memory (skb truesize), and at most one read (two replies when a retry crosses a
/// late answer) is in flight per slot; the kernel clamps it to `rmem_max` unless the
/// process may force it.
const RCVBUF_PER_SLOT_BYTES: usize = 4096;

/// How long the poller sleeps between two drains while replies are due (group replies,
/// or at least [`UNICAST_GATHER_MIN`] unicast ones), instead of waking for each
/// datagram: the replies of one period's READs arrive within a round trip or so of each
/// other (tens of µs on a LAN, 50–60 µs across the lab's namespaces), and a wake-up
/// costs about as much as receiving a batch; at most period / this wake-ups per period
/// (10 at 1 ms), and at most this much added to the measured latency of a read (the
/// poller's sockets are left out of `ppoll` meanwhile).
pub const GROUP_GATHER: Duration = Duration::from_micros(100);

/// Unicast reads awaiting their reply from which the poller gathers
/// ([`GROUP_GATHER`]) instead of waking for each reply: with one left, waking for it
/// costs no more than a gather's wake-up and adds no latency; with more, the replies
/// come in however many bursts the back-ends (and the host's scheduling) send them in,
/// and each burst cost a wake-up and a `recvmmsg` (`bench_monitor --backends 64`: 6–11
/// wake-ups per period against 2–3 gathering, 10% less CPU per read).
pub const UNICAST_GATHER_MIN: usize = 2;

/// Shortest attempt timeout, as the blocking udp client's.
const ATTEMPT_TIMEOUT_MIN: Duration = Duration::from_micros(100);

/// The `sendmmsg` arrays, allocated and wired once: a flush writes only the datagrams
/// and their addresses (zeroing 30 KiB of arrays per call cost more than the sends).
struct SendBatch {
    /// Padded READs; the padding stays zero (headers are all the same length).
    bufs: [[u8; REQ_PADDED_BYTES]; BATCH_MAX],
    iov: [libc::iovec; BATCH_MAX],
    msgs: [libc::mmsghdr; BATCH_MAX],
}

/// The `recvmmsg` arrays, allocated and wired once (47 KiB that a drain used to zero
/// on every wake-up).
struct RecvBatch {
    bufs: [[u8; REPLY_BUF_BYTES]; BATCH_MAX],
    addrs: [libc::sockaddr_storage; BATCH_MAX],
    iov: [libc::iovec; BATCH_MAX],
    msgs: [libc::mmsghdr; BATCH_MAX],
}

impl SendBatch {
    fn new() -> Box<SendBatch> {
        // SAFETY: plain data (bytes, pointers, integers); all-zero is a valid value.
        let mut b: Box<SendBatch> = unsafe { Box::new_zeroed().assume_init() };
        for j in 0..BATCH_MAX {
            b.iov[j] = libc::iovec {
                iov_base: b.bufs[j].as_mut_ptr().cast(),
                iov_len: REQ_PADDED_BYTES,
            };
            b.msgs[j].msg_hdr.msg_iov = &mut b.iov[j];
            b.msgs[j].msg_hdr.msg_iovlen = 1;
        }
        b
    }
}

impl RecvBatch {
    fn new() -> Box<RecvBatch> {
        // SAFETY: as for SendBatch.
        let mut b: Box<RecvBatch> = unsafe { Box::new_zeroed().assume_init() };
        for j in 0..BATCH_MAX {
            b.iov[j] = libc::iovec {
                iov_base: b.bufs[j].as_mut_ptr().cast(),
                iov_len: REPLY_BUF_BYTES,
            };
            b.msgs[j].msg_hdr.msg_name = (&mut b.addrs[j] as *mut libc::sockaddr_storage).cast();
            b.msgs[j].msg_hdr.msg_iov = &mut b.iov[j];
            b.msgs[j].msg_hdr.msg_iovlen = 1;
        }
        b
    }
}

enum Kind {
    Shm {
        path: std::path::PathBuf,
        client: Option<Box<ShmClient>>,
        backoff: Duration,
        next_connect: Instant,
    },
    Udp {
        addr: SocketAddr,
        /// `addr` as a C socket address and its length, made once.
        sa: Box<(libc::sockaddr_storage, libc::socklen_t)>,
        /// Index into `Poller::socks`: 0 IPv4, 1 IPv6.
        family: usize,
        /// The key its READs are sealed with and its replies verified under.
        key: ClientKey,
        /// Read by the period's group READ (else by its own unicast READ).
        grouped: bool,
        pending: Option<Pending>,
    },
    Tcp {
        t: Box<crate::tcp::TcpSlot>,
        /// Its entry in `Poller::pollfds`.
        pfd: usize,
    },
}

/// A READ in flight.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// Sequence numbers of its first and latest unicast attempt (a reply to any is
    /// accepted); both 0 while it has had none (a group read not yet retried).
    first_seq: u64,
    seq: u64,
    /// The group READ that started it, 0 if it started unicast.
    group_seq: u64,
    attempt: u32,
    started: Instant,
    deadline: Instant,
}

impl Pending {
    /// Whether a reply with `seq` answers this read: one of its unicast attempts, or a
    /// group READ from the one that started it to `group_last` (the latest sent).
    /// Started by a group READ, neither answered nor retried unicast yet.
    fn awaits_group(&self) -> bool {
        self.group_seq != 0 && self.seq == 0
    }

    fn answers(&self, seq: u64, group_last: u64) -> bool {
        if seq & SLOT_MASK == GROUP_SLOT {
            self.group_seq != 0 && (self.group_seq..=group_last).contains(&seq)
        } else {
            self.seq != 0 && (self.first_seq..=self.seq).contains(&seq)
        }
    }
}

/// The group READ's set-up: where it goes and whose replies are whose.
struct Group {
    /// The group address as a C socket address and its length.
    sa: Box<(libc::sockaddr_storage, libc::socklen_t)>,
    /// Grouped slot by its region endpoint (a reply's source address).
    by_addr: EndpointIndex,
    /// Sequence number of the latest group READ sent (0: none yet).
    last_seq: u64,
    /// The shared read key the group READ is sealed with.
    key: ClientKey,
    /// Reads started by a group READ with no reply and no unicast retry yet: while any
    /// is, the poller gathers replies ([`GROUP_GATHER`]) instead of waking for each.
    waiting: usize,
}

struct Slot<'t> {
    st: WatchState<'t>,
    stats: std::sync::Arc<ReadStats>,
    kind: Kind,
}

/// Reads every slot's region once per period until `stop`.
pub(crate) struct Poller<'t> {
    slots: Vec<Slot<'t>>,
    socks: [Option<UdpSocket>; 2],
    /// The envelopes' sender id (replies must name it) and their sequence numbers.
    env: SenderState,
    round: u64,
    attempt_timeout: Duration,
    stale_after: Duration,
    period: Duration,
    /// Slots whose READ is to be sent, per socket family.
    queue: [Vec<usize>; 2],
    /// Earliest attempt deadline among pending reads (a bound: may be early).
    next_expiry: Option<Instant>,
    /// Reads with a unicast attempt sent and no reply yet (counted again from the slots
    /// each period and at each expiry; a hint for [`GROUP_GATHER`], never for
    /// correctness).
    unicast_waiting: usize,
    stats: std::sync::Arc<PollerStats>,
    scratch: Vec<u8>,
    read_timeout: Duration,
    /// The `ppoll` set: the two udp sockets (fd -1 if none), then one entry per tcp slot.
    pollfds: Vec<libc::pollfd>,
    /// Slot of each `pollfds` entry from 2 on.
    pfd_slot: Vec<usize>,
    send: Box<SendBatch>,
    recv: Box<RecvBatch>,
    /// Group reads, if configured and at least one slot can be read so.
    group: Option<Group>,
    /// AF_XDP receive of the IPv4 socket's replies (`MonitorOptions::rx`), if set up.
    xsk: Option<XskRx>,
    /// Index in `pollfds` of the first AF_XDP socket (after the tcp slots').
    xsk_pfd: usize,
}

impl<'t> Poller<'t> {
    pub(crate) fn new(
        table: &'t dyn Words,
        watches: Vec<(Watch, std::sync::Arc<ReadStats>)>,
        opts: &MonitorOptions,
        stats: std::sync::Arc<PollerStats>,
    ) -> io::Result<Poller<'t>> {
        let mut socks: [Option<UdpSocket>; 2] = [None, None];
        let mut udp_slots = [0usize; 2];
        let mut slots = Vec::with_capacity(watches.len());
        let mut pfd_slot = Vec::new();
        let no_key = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "monitor: no rmem key for {what}: udp and tcp reads are authenticated \
                     (monitor key = \"ID:PATH\", or ?key=ID:PATH on the region)"
                ),
            )
        };
        for (w, rs) in watches {
            let key_of = || -> io::Result<ClientKey> {
                let o = w
                    .region
                    .options(&farside_rmem::ClientOptions {
                        key: opts.key,
                        ..Default::default()
                    })
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                o.key.ok_or_else(|| no_key(&w.region.to_string()))
            };
            let st = WatchState::new(table, w.index, w.name.clone(), w.region.to_string());
            let kind = match &w.region.endpoint {
                Endpoint::Shm(p) => Kind::Shm {
                    path: p.clone(),
                    client: None,
                    backoff: Duration::ZERO,
                    next_connect: Instant::now(),
                },
                Endpoint::Udp(a) => {
                    let family = usize::from(a.is_ipv6());
                    udp_slots[family] += 1;
                    Kind::Udp {
                        addr: *a,
                        sa: Box::new(to_storage(a)),
                        family,
                        key: key_of()?,
                        grouped: false,
                        pending: None,
                    }
                }
                Endpoint::Tcp(a) => {
                    pfd_slot.push(slots.len());
                    Kind::Tcp {
                        t: Box::new(crate::tcp::TcpSlot::new(*a, key_of()?)),
                        pfd: 1 + pfd_slot.len(),
                    }
                }
            };
            slots.push(Slot {
                st,
                stats: rs,
                kind,
            });
        }
        assert!(
            (slots.len() as u64) < GROUP_SLOT,
            "slots beyond the seq's slot bits"
        );
        let group = match opts.group {
            Some(g) => match opts.key {
                Some(k) => group_slots(&mut slots, g, k)?,
                None => return Err(no_key("the group READ")),
            },
            None => None,
        };
        for (family, n) in udp_slots.into_iter().enumerate() {
            if n == 0 {
                continue;
            }
            let bind = if family == 0 { "0.0.0.0:0" } else { "[::]:0" };
            let s = UdpSocket::bind(bind)?;
            s.set_nonblocking(true)?;
            set_rcvbuf(&s, n * RCVBUF_PER_SLOT_BYTES);
            socks[family] = Some(s);
        }
        let xsk = match (&opts.rx, &socks[0]) {
            (MonitorRx::Xsk(ifname), Some(s)) => open_xsk(ifname, s, udp_slots[0], &stats),
            (MonitorRx::Xsk(ifname), None) => {
                log::info!("monitor: no IPv4 udp back-end: AF_XDP receive on {ifname} not used");
                None
            }
            (MonitorRx::Udp, _) => None,
        };
        let xsk_pfd = 2 + pfd_slot.len();
        let mut pollfds = vec![
            libc::pollfd {
                fd: -1,
                events: libc::POLLIN,
                revents: 0,
            };
            xsk_pfd
        ];
        for fd in xsk.iter().flat_map(|x| x.fds()) {
            pollfds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        Ok(Poller {
            slots,
            socks,
            env: SenderState::new(),
            round: 0,
            attempt_timeout: (opts.read_timeout / UDP_TRIES).max(ATTEMPT_TIMEOUT_MIN),
            stale_after: opts.stale_after,
            period: opts.period,
            queue: [Vec::new(), Vec::new()],
            next_expiry: None,
            unicast_waiting: 0,
            stats,
            scratch: Vec::with_capacity(REQ_PADDED_BYTES),
            read_timeout: opts.read_timeout,
            pollfds,
            pfd_slot,
            send: SendBatch::new(),
            recv: RecvBatch::new(),
            group,
            xsk,
            xsk_pfd,
        }
        .with_socket_fds())
    }

    fn with_socket_fds(mut self) -> Self {
        for f in 0..2 {
            if let Some(s) = &self.socks[f] {
                self.pollfds[f].fd = s.as_raw_fd();
            }
        }
        self
    }

    /// Poll until `stop` is set.
    pub(crate) fn run(&mut self, stop: &AtomicBool) {
        let mut pacer = Pacer::new(self.period);
        while !stop.load(Ordering::Relaxed) {
            self.round();
            self.wait_until(pacer.deadline());
            pacer.advance();
            self.stats.periods.fetch_add(1, Ordering::Relaxed);
            self.stats.overruns.store(pacer.overruns, Ordering::Relaxed);
            self.stats
                .cpu_ns
                .store(farside_rt::thread_cpu_ns(), Ordering::Relaxed);
        }
    }

    /// One period's work: read shm slots, start or retry udp reads, send them.
    pub(crate) fn round(&mut self) {
        self.round += 1;
        let now = Instant::now();
        // Grouped slots that started a read: this period's group READ goes out.
        let mut group_started = 0;
        // Group reads that stopped waiting for a group reply (retried or failed).
        let mut group_done = 0;
        // Reads whose unicast attempt stays outstanding (pending, or resent below).
        let mut unicast_waiting = 0;
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            match &mut slot.kind {
                Kind::Shm {
                    path,
                    client,
                    backoff,
                    next_connect,
                } => {
                    read_shm(
                        &mut slot.st,
                        &slot.stats,
                        path,
                        client,
                        backoff,
                        next_connect,
                        self.period,
                    );
                    slot.st.publish(mono_ns(), self.stale_after);
                }
                Kind::Udp {
                    family,
                    grouped,
                    pending,
                    ..
                } => match pending {
                    None if *grouped => {
                        let deadline = now + self.attempt_timeout;
                        *pending = Some(Pending {
                            first_seq: 0,
                            seq: 0,
                            group_seq: (self.round << SLOT_BITS) | GROUP_SLOT,
                            attempt: 0,
                            started: now,
                            deadline,
                        });
                        group_started += 1;
                    }
                    None => self.queue[*family].push(i),
                    Some(p) if now >= p.deadline => {
                        if p.attempt + 1 < UDP_TRIES {
                            unicast_waiting += usize::from(p.seq != 0);
                            self.queue[*family].push(i);
                        } else {
                            group_done += usize::from(p.awaits_group());
                            *pending = None;
                            slot.st.on_error(&RmemError::Timeout);
                            slot.st.publish(mono_ns(), self.stale_after);
                        }
                    }
                    Some(p) => unicast_waiting += usize::from(p.seq != 0),
                },
                Kind::Tcp { t, pfd } => {
                    let seq = (self.round << SLOT_BITS) | i as u64;
                    let done = t.tick(now, seq, self.read_timeout, self.period);
                    let (fd, events) = t.pollfd();
                    self.pollfds[*pfd].fd = fd;
                    self.pollfds[*pfd].events = events;
                    if let Some(d) = done {
                        account_tcp(&mut slot.st, &slot.stats, d, self.stale_after);
                    }
                }
            }
        }
        self.next_expiry = None;
        self.unicast_waiting = unicast_waiting;
        if let Some(g) = &mut self.group {
            g.waiting = (g.waiting + group_started).saturating_sub(group_done);
        }
        if group_started > 0 {
            self.send_group(now);
        }
        for family in 0..2 {
            self.flush(family, now);
        }
    }

    /// Send this period's group READ: one datagram, answered by every grouped slot's
    /// back-end. A send that fails leaves the reads pending: they are retried unicast
    /// at their deadline.
    fn send_group(&mut self, now: Instant) {
        let (Some(g), Some(sock)) = (self.group.as_mut(), self.socks[0].as_ref()) else {
            return;
        };
        let seq = (self.round << SLOT_BITS) | GROUP_SLOT;
        g.last_seq = seq;
        encode_request(
            &mut self.scratch,
            &ReqHeader {
                op: Op::Read as u8,
                flags: 0,
                seq,
                region: 0,
                offset: 0,
                len: MONITOR_READ_BYTES as u32,
            },
            &[],
        );
        let mut buf = [0u8; REQ_PADDED_BYTES];
        let env_seq = self.env.next_seq();
        seal_request_to(&mut buf, &g.key, self.env.sender, env_seq, &self.scratch);
        // SAFETY: buf and the group's sockaddr outlive the call.
        let r = unsafe {
            libc::sendto(
                sock.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
                (&g.sa.0 as *const libc::sockaddr_storage).cast(),
                g.sa.1,
            )
        };
        if r > 0 {
            self.stats.sent.fetch_add(1, Ordering::Relaxed);
            self.stats.group_sent.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats.send_dropped.fetch_add(1, Ordering::Relaxed);
        }
        let deadline = now + self.attempt_timeout;
        self.next_expiry = Some(self.next_expiry.map_or(deadline, |e| e.min(deadline)));
    }

    /// Sleep in `ppoll` until `deadline`, taking replies as they come and retrying or
    /// failing reads whose attempt deadline passes meanwhile.
    fn wait_until(&mut self, deadline: Instant) {
        loop {
            for family in 0..2 {
                self.drain(family);
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            if self.next_expiry.is_some_and(|e| now >= e) {
                self.expire(now);
                continue;
            }
            let mut until = self.next_expiry.map_or(deadline, |e| e.min(deadline));
            // Replies due: sleep through their arrivals (the udp sockets left out of the
            // set) and take them in batches at the next drain.
            let gather = self.gathers();
            if gather {
                until = until.min(now + GROUP_GATHER);
                // With AF_XDP receive the IPv4 socket gets only what the program passes
                // (fragments, IP options) and is read only when `ppoll` finds it
                // readable: it stays in the set, or such replies would wait out the
                // gathers.
                if self.xsk.is_none() {
                    self.pollfds[0].fd = -1;
                }
                self.pollfds[1].fd = -1;
                for p in &mut self.pollfds[self.xsk_pfd..] {
                    p.fd = -1;
                }
            }
            let left = until.saturating_duration_since(now);
            let ts = libc::timespec {
                tv_sec: left.as_secs() as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            };
            // SAFETY: pollfds is a valid array of pollfd (fd -1 entries are ignored); ts
            // outlives the call; no signal mask.
            let ready = unsafe {
                libc::ppoll(
                    self.pollfds.as_mut_ptr(),
                    self.pollfds.len() as libc::nfds_t,
                    &ts,
                    std::ptr::null(),
                )
            };
            self.stats.waits.fetch_add(1, Ordering::Relaxed);
            if gather {
                for f in 0..2 {
                    if let Some(s) = &self.socks[f] {
                        self.pollfds[f].fd = s.as_raw_fd();
                    }
                }
                if let Some(x) = &self.xsk {
                    for (p, fd) in self.pollfds[self.xsk_pfd..].iter_mut().zip(x.fds()) {
                        p.fd = fd;
                    }
                }
            }
            if ready > 0 {
                self.tcp_ready();
            }
        }
    }

    /// Whether the next sleep gathers replies ([`GROUP_GATHER`]): group replies are
    /// due, or at least [`UNICAST_GATHER_MIN`] unicast ones.
    fn gathers(&self) -> bool {
        self.group.as_ref().is_some_and(|g| g.waiting > 0)
            || self.unicast_waiting >= UNICAST_GATHER_MIN
    }

    /// Serve the tcp streams `ppoll` found ready.
    fn tcp_ready(&mut self) {
        for k in 2..self.xsk_pfd {
            let revents = std::mem::take(&mut self.pollfds[k].revents);
            if revents == 0 {
                continue;
            }
            let slot = &mut self.slots[self.pfd_slot[k - 2]];
            let Kind::Tcp { t, .. } = &mut slot.kind else {
                unreachable!("pollfds past 2 are tcp slots")
            };
            let done = t.on_ready(revents);
            let (fd, events) = t.pollfd();
            self.pollfds[k].fd = fd;
            self.pollfds[k].events = events;
            if let Some(d) = done {
                account_tcp(&mut slot.st, &slot.stats, d, self.stale_after);
            }
        }
    }

    /// Retry or fail the pending reads whose attempt deadline passed.
    fn expire(&mut self, now: Instant) {
        self.next_expiry = None;
        self.unicast_waiting = 0;
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            if let Kind::Udp {
                family,
                pending: pending @ Some(_),
                ..
            } = &mut slot.kind
            {
                let p = pending.expect("matched Some");
                if now < p.deadline {
                    self.unicast_waiting += usize::from(p.seq != 0);
                    self.next_expiry =
                        Some(self.next_expiry.map_or(p.deadline, |e| e.min(p.deadline)));
                } else if p.attempt + 1 < UDP_TRIES {
                    self.unicast_waiting += usize::from(p.seq != 0);
                    self.queue[*family].push(i);
                } else {
                    if p.awaits_group() {
                        if let Some(g) = &mut self.group {
                            g.waiting = g.waiting.saturating_sub(1);
                        }
                    }
                    *pending = None;
                    slot.st.on_error(&RmemError::Timeout);
                    slot.st.publish(mono_ns(), self.stale_after);
                }
            }
        }
        for family in 0..2 {
            self.flush(family, now);
        }
    }

    /// Send the queued READs of `family` in batches.
    fn flush(&mut self, family: usize, now: Instant) {
        let queue = std::mem::take(&mut self.queue[family]);
        let Some(fd) = self.socks[family].as_ref().map(|s| s.as_raw_fd()) else {
            self.queue[family] = queue;
            return;
        };
        for chunk in queue.chunks(BATCH_MAX) {
            for (j, &i) in chunk.iter().enumerate() {
                let Kind::Udp {
                    sa, key, pending, ..
                } = &mut self.slots[i].kind
                else {
                    unreachable!("only udp slots are queued")
                };
                let seq = (self.round << SLOT_BITS) | i as u64;
                let (attempt, first_seq, group_seq, started) = match pending {
                    // A group read's first retry is its first unicast attempt.
                    Some(p) if p.seq == 0 => {
                        if let Some(g) = &mut self.group {
                            g.waiting = g.waiting.saturating_sub(usize::from(p.awaits_group()));
                        }
                        self.unicast_waiting += 1;
                        (p.attempt + 1, seq, p.group_seq, p.started)
                    }
                    Some(p) => (p.attempt + 1, p.first_seq, p.group_seq, p.started),
                    None => {
                        self.unicast_waiting += 1;
                        (0, seq, 0, now)
                    }
                };
                encode_request(
                    &mut self.scratch,
                    &ReqHeader {
                        op: Op::Read as u8,
                        flags: if attempt > 0 { FLAG_RETRY } else { 0 },
                        seq,
                        region: 0,
                        offset: 0,
                        len: MONITOR_READ_BYTES as u32,
                    },
                    &[],
                );
                debug_assert_eq!(self.scratch.len(), REQ_HEADER_BYTES);
                let env_seq = self.env.next_seq();
                seal_request_to(
                    &mut self.send.bufs[j],
                    key,
                    self.env.sender,
                    env_seq,
                    &self.scratch,
                );
                let h = &mut self.send.msgs[j].msg_hdr;
                h.msg_name = (&mut sa.0 as *mut libc::sockaddr_storage).cast();
                h.msg_namelen = sa.1;
                let deadline = now + self.attempt_timeout;
                *pending = Some(Pending {
                    first_seq,
                    seq,
                    group_seq,
                    attempt,
                    started,
                    deadline,
                });
                self.next_expiry = Some(self.next_expiry.map_or(deadline, |e| e.min(deadline)));
            }
            let n = chunk.len();
            let msgs = &mut self.send.msgs;
            let mut sent = 0;
            while sent < n {
                // SAFETY: msgs[sent..n] are initialised above and point to live buffers.
                let r = unsafe {
                    libc::sendmmsg(
                        fd,
                        msgs[sent..].as_mut_ptr(),
                        (n - sent) as libc::c_uint,
                        libc::MSG_DONTWAIT,
                    )
                };
                if r > 0 {
                    self.stats.send_calls.fetch_add(1, Ordering::Relaxed);
                    self.stats.sent.fetch_add(r as u64, Ordering::Relaxed);
                    sent += r as usize;
                    continue;
                }
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::WouldBlock {
                    // The rest stays pending and is retried at its deadline.
                    self.stats
                        .send_dropped
                        .fetch_add((n - sent) as u64, Ordering::Relaxed);
                    break;
                }
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // The first unsent datagram failed (e.g. no route): a failed read.
                let slot = &mut self.slots[chunk[sent]];
                if let Kind::Udp { pending, .. } = &mut slot.kind {
                    *pending = None;
                    self.unicast_waiting = self.unicast_waiting.saturating_sub(1);
                }
                slot.st.on_error(&err);
                slot.st.publish(mono_ns(), self.stale_after);
                sent += 1;
            }
            // Replies to the first batch may already be queued: take them before the
            // next batch so the socket buffer never has to hold a whole round.
            self.drain(family);
        }
        let mut queue = queue;
        queue.clear();
        self.queue[family] = queue;
    }

    /// Take every reply waiting in the AF_XDP RX rings, if the poller has them.
    fn drain_xsk(&mut self) {
        let Some(x) = self.xsk.as_mut() else {
            return;
        };
        let port = x.port();
        // Read the clocks once per drain, and only when there is something to time.
        let mut clock = None;
        let (slots, group, stats) = (&mut self.slots, &mut self.group, &*self.stats);
        let waiting = &mut self.unicast_waiting;
        let sender = self.env.sender;
        let stale_after = self.stale_after;
        let n = x.take(|frames| {
            // Parse each frame (its lines were prefetched by `take`), then ask for what
            // matching the batch will touch, then match each reply.
            let mut parsed = [None; crate::xsk::TAKE_BATCH];
            let parsed = &mut parsed[..frames.len()];
            for (p, frame) in parsed.iter_mut().zip(frames) {
                *p = crate::xsk::parse_udp4(frame, port);
            }
            prefetch_replies(slots, group.as_ref(), parsed.iter().flatten().map(|p| &p.0));
            for p in parsed.iter() {
                match p {
                    Some((from, payload)) => {
                        let (now, mono) = *clock.get_or_insert_with(|| (Instant::now(), mono_ns()));
                        let len = payload.len().min(REPLY_BUF_BYTES);
                        let unicast = on_reply(
                            slots,
                            group.as_mut(),
                            sender,
                            stats,
                            stale_after,
                            &payload[..len],
                            payload.len() > REPLY_BUF_BYTES,
                            Some(*from),
                            now,
                            mono,
                        );
                        *waiting = waiting.saturating_sub(usize::from(unicast));
                    }
                    // Not a datagram to our port (the program checks the same): a stray.
                    None => {
                        stats.late.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        if n > 0 {
            self.stats.recv_calls.fetch_add(1, Ordering::Relaxed);
            self.stats.xsk_rx.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Receive every reply waiting on `family`'s socket (and, for IPv4, in the AF_XDP
    /// RX rings).
    fn drain(&mut self, family: usize) {
        if family == 0 && self.xsk.is_some() {
            self.drain_xsk();
            // The replies come through the rings: the socket gets only what the
            // program passes (fragments, IP options), so it is read only when the last
            // `ppoll` found it readable, not with a `recvmmsg` per drain. It stays in
            // the `ppoll` set (outside group gathers), so a datagram there is never
            // left waiting for more than one sleep.
            if std::mem::take(&mut self.pollfds[0].revents) == 0 {
                return;
            }
        }
        let Some(fd) = self.socks[family].as_ref().map(|s| s.as_raw_fd()) else {
            return;
        };
        // Entries the last call filled, whose name lengths the kernel overwrote.
        let mut used = BATCH_MAX;
        loop {
            for m in &mut self.recv.msgs[..used] {
                m.msg_hdr.msg_namelen =
                    std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            }
            // SAFETY: msgs point into the boxed batch's bufs/addrs/iov, which live as
            // long as the poller.
            let r = unsafe {
                libc::recvmmsg(
                    fd,
                    self.recv.msgs.as_mut_ptr(),
                    BATCH_MAX as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r <= 0 {
                return;
            }
            self.stats.recv_calls.fetch_add(1, Ordering::Relaxed);
            self.stats.udp_rx.fetch_add(r as u64, Ordering::Relaxed);
            let now = Instant::now();
            let mono = mono_ns();
            used = r as usize;
            let mut froms = [None; BATCH_MAX];
            for (f, a) in froms.iter_mut().zip(&self.recv.addrs[..used]) {
                // Address and port only: replies are matched against the targets'
                // addresses (`same_peer`) without the source's IPv6 flow label and
                // scope id.
                *f = from_storage(a).map(|a| SocketAddr::new(a.ip(), a.port()));
            }
            for j in 0..used {
                if j % PREFETCH_BATCH == 0 {
                    let chunk = &froms[j..(j + PREFETCH_BATCH).min(used)];
                    prefetch_replies(&self.slots, self.group.as_ref(), chunk.iter().flatten());
                }
                let m = &self.recv.msgs[j];
                let len = (m.msg_len as usize).min(REPLY_BUF_BYTES);
                let truncated = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
                let from = froms[j];
                let unicast = on_reply(
                    &mut self.slots,
                    self.group.as_mut(),
                    self.env.sender,
                    &self.stats,
                    self.stale_after,
                    &self.recv.bufs[j][..len],
                    truncated,
                    from,
                    now,
                    mono,
                );
                self.unicast_waiting = self.unicast_waiting.saturating_sub(usize::from(unicast));
            }
            if used < BATCH_MAX {
                return;
            }
        }
    }
}

/// Replies whose matching is prefetched together on the UDP socket's path: as
/// [`crate::xsk::TAKE_BATCH`], what one batch touches still fits the L1 data cache.
const PREFETCH_BATCH: usize = crate::xsk::TAKE_BATCH;

/// Ask for what matching a batch of group replies from `froms` will touch, in passes so
/// that the cache misses overlap instead of coming one per reply: each source's bucket
/// in the endpoint index; then (the buckets have had a pass to arrive) each slot; then
/// (the slots likewise) the read statistics and the table entry the slot points to.
/// Unicast replies and unknown sources are skipped; a hint, nothing is changed.
fn prefetch_replies<'a>(
    slots: &[Slot<'_>],
    group: Option<&Group>,
    froms: impl Iterator<Item = &'a SocketAddr> + Clone,
) {
    let Some(g) = group else {
        return;
    };
    for f in froms.clone() {
        g.by_addr.prefetch(f);
    }
    // Each source is looked up once; the slots found are kept for the last pass (a
    // batch holds at most PREFETCH_BATCH replies; any beyond are left to the match).
    let mut found: [Option<&Slot<'_>>; PREFETCH_BATCH] = [None; PREFETCH_BATCH];
    let slot_of = |f: &SocketAddr| g.by_addr.get(f).and_then(|i| slots.get(i));
    for (k, slot) in froms.filter_map(slot_of).enumerate() {
        prefetch_lines(slot as *const Slot<'_>, std::mem::size_of::<Slot<'_>>());
        if let Some(e) = found.get_mut(k) {
            *e = Some(slot);
        }
    }
    for slot in found.into_iter().map_while(|s| s) {
        prefetch_lines(
            std::sync::Arc::as_ptr(&slot.stats),
            std::mem::size_of::<ReadStats>(),
        );
        let words = slot.st.entry_words();
        prefetch_lines(words.as_ptr(), std::mem::size_of_val(words));
    }
}

/// Match one datagram to its slot's pending read, or drop it as late. True if it
/// completed a read that had a unicast attempt outstanding.
#[allow(clippy::too_many_arguments)]
fn on_reply(
    slots: &mut [Slot<'_>],
    group: Option<&mut Group>,
    sender: u64,
    stats: &PollerStats,
    stale_after: Duration,
    b: &[u8],
    truncated: bool,
    from: Option<SocketAddr>,
    now: Instant,
    mono: u64,
) -> bool {
    // The op seq names the slot (or the group); nothing is trusted before the tag
    // verified under that slot's key, below.
    let Some(h) = b
        .get(ENVELOPE_BYTES..)
        .and_then(|c| RepHeader::decode(c).ok())
    else {
        stats.late.fetch_add(1, Ordering::Relaxed);
        return false;
    };
    let by_group = h.seq & SLOT_MASK == GROUP_SLOT;
    let i = if by_group {
        // A group reply names its back-end by where it comes from.
        match (group.as_deref(), from) {
            (Some(g), Some(f)) => match g.by_addr.get(&f) {
                Some(i) => i,
                None => {
                    stats.unknown_source.fetch_add(1, Ordering::Relaxed);
                    stats.late.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            },
            _ => {
                stats.late.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
    } else {
        (h.seq & SLOT_MASK) as usize
    };
    let group_last = group.as_deref().map_or(0, |g| g.last_seq);
    let Some(slot) = slots.get_mut(i) else {
        stats.late.fetch_add(1, Ordering::Relaxed);
        return false;
    };
    let Kind::Udp {
        addr, pending, key, ..
    } = &mut slot.kind
    else {
        stats.late.fetch_add(1, Ordering::Relaxed);
        return false;
    };
    // Authentic under the slot's key (the group's, for a group reply: the same key),
    // sent to this poller: else a forgery or another reader's reply.
    let Ok(covered) = open_reply(b, key, sender, 1..=u64::MAX) else {
        stats.unauthentic.fetch_add(1, Ordering::Relaxed);
        stats.late.fetch_add(1, Ordering::Relaxed);
        return false;
    };
    let ours = pending
        .is_some_and(|p| p.answers(h.seq, group_last) && from.is_none_or(|f| same_peer(f, *addr)));
    if !ours {
        stats.late.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    if by_group {
        stats.group_replies.fetch_add(1, Ordering::Relaxed);
    }
    let p = pending.take().expect("ours");
    if p.awaits_group() {
        if let Some(g) = group {
            g.waiting = g.waiting.saturating_sub(1);
        }
    }
    let latency_ns = now.duration_since(p.started).as_nanos() as u64;
    let body = &covered[REP_HEADER_BYTES..];
    if h.status != Status::Ok {
        slot.st.on_error(&RmemError::Refused(h.status));
    } else if truncated
        || h.op != Op::Read as u8
        || h.len as usize != MONITOR_READ_BYTES
        || body.len() < MONITOR_READ_BYTES
    {
        slot.st.on_error(&RmemError::Protocol(format!(
            "reply of {} bytes, op {}, for a {MONITOR_READ_BYTES}-byte READ",
            b.len(),
            h.op
        )));
    } else {
        slot.st
            .on_read(&body[..MONITOR_READ_BYTES], latency_ns, mono, &slot.stats);
    }
    slot.st.publish(mono, stale_after);
    p.seq != 0
}

/// Mark the udp slots the group READ to `group` can read: IPv4, read with the shared
/// `key`, and an endpoint no other slot has (a reply is matched by its source alone).
/// `None` if no slot qualifies. An IPv6 group is refused: the back-ends' XDP program
/// answers IPv4 group reads only.
fn group_slots(
    slots: &mut [Slot<'_>],
    group: SocketAddr,
    key: ClientKey,
) -> io::Result<Option<Group>> {
    if !group.is_ipv4() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("group read address {group}: only IPv4 groups are supported"),
        ));
    }
    let mut by_addr = std::collections::HashMap::new();
    let mut shared = std::collections::HashSet::new();
    for (i, s) in slots.iter().enumerate() {
        if let Kind::Udp {
            addr,
            family: 0,
            key: k,
            ..
        } = &s.kind
        {
            if *k == key && by_addr.insert(*addr, i).is_some() {
                shared.insert(*addr);
            }
        }
    }
    for a in &shared {
        log::warn!("monitor: several back-ends' regions at {a}: read unicast, not by the group");
        by_addr.remove(a);
    }
    if by_addr.is_empty() {
        return Ok(None);
    }
    let entries: Vec<(std::net::SocketAddrV4, usize)> = by_addr
        .iter()
        .filter_map(|(a, &i)| match a {
            SocketAddr::V4(a) => Some((*a, i)),
            SocketAddr::V6(_) => None,
        })
        .collect();
    let by_addr = EndpointIndex::new(&entries).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} grouped back-ends: at most {ENDPOINTS_MAX}",
                entries.len()
            ),
        )
    })?;
    for i in by_addr.slots() {
        if let Kind::Udp { grouped, .. } = &mut slots[i].kind {
            *grouped = true;
        }
    }
    Ok(Some(Group {
        sa: Box::new(to_storage(&group)),
        by_addr,
        last_seq: 0,
        key,
        waiting: 0,
    }))
}

/// Set up AF_XDP receive of `sock`'s replies on `ifname`, or say in one log line why
/// the UDP socket is used instead.
fn open_xsk(
    ifname: &str,
    sock: &UdpSocket,
    udp_slots: usize,
    stats: &PollerStats,
) -> Option<XskRx> {
    let port = match sock.local_addr() {
        Ok(a) => a.port(),
        Err(e) => {
            log::warn!("monitor: AF_XDP receive on {ifname} not used ({e}): replies are read from the UDP socket");
            return None;
        }
    };
    match XskRx::open(ifname, port, crate::xsk::frames_for(udp_slots)) {
        Ok(x) => {
            log::info!(
                "monitor: replies to udp port {port} are taken through AF_XDP on {ifname} \
                 ({} RX queue(s), {} frames each, generic XDP, copy mode)",
                x.queues(),
                x.frames()
            );
            stats.xsk.store(true, Ordering::Relaxed);
            Some(x)
        }
        Err(e) => {
            log::warn!(
                "monitor: AF_XDP receive on {ifname} unavailable ({e}): replies are read from the UDP socket"
            );
            None
        }
    }
}

/// Account a tcp read's outcome and publish.
fn account_tcp(
    st: &mut WatchState<'_>,
    stats: &ReadStats,
    d: crate::tcp::Done,
    stale_after: Duration,
) {
    let now = mono_ns();
    match d {
        crate::tcp::Done::Read(bytes, latency_ns) => st.on_read(&bytes[..], latency_ns, now, stats),
        crate::tcp::Done::Failed(e) => st.on_error(&e),
    }
    st.publish(now, stale_after);
}

/// A same-host shm read, done in place: (re)open with backoff, read, account.
fn read_shm(
    st: &mut WatchState<'_>,
    stats: &ReadStats,
    path: &std::path::Path,
    client: &mut Option<Box<ShmClient>>,
    backoff: &mut Duration,
    next_connect: &mut Instant,
    period: Duration,
) {
    if client.is_none() {
        if Instant::now() < *next_connect {
            return;
        }
        match ShmClient::open(path) {
            Ok(c) => {
                *client = Some(Box::new(c));
                *backoff = Duration::ZERO;
            }
            Err(err) => {
                st.on_error(&err);
                *backoff = (*backoff * 2).clamp(period, RECONNECT_BACKOFF_MAX);
                *next_connect = Instant::now() + *backoff;
                return;
            }
        }
    }
    let c = client.as_mut().expect("opened above");
    let mut bytes = [0u8; MONITOR_READ_BYTES];
    let t0 = Instant::now();
    match c.read(0, &mut bytes) {
        Ok(()) => st.on_read(&bytes, t0.elapsed().as_nanos() as u64, mono_ns(), stats),
        Err(err) => st.on_error(&err),
    }
}

/// Whether a reply from `from` can answer a request sent to `to` (an unspecified or
/// IPv4-mapped address compares by value and port).
fn same_peer(from: SocketAddr, to: SocketAddr) -> bool {
    from == to || (from.port() == to.port() && to.ip().is_unspecified())
}

/// Ask for a receive buffer of `bytes` (forced if the process may; else up to `rmem_max`).
pub(crate) fn set_rcvbuf(s: &UdpSocket, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt with a valid int option value.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return;
        }
    }
}

#[cfg(test)]
#[path = "poller_tests.rs"]
mod tests;
