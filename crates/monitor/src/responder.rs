//! A gatherd-like udp responder for many regions in one process, for tests and the
//! monitor benchmark: one socket, one thread, the region chosen by the request's key id
//! (each region has its own key id, all with the same random key, kept in a key file of
//! the responder's own temp directory), answered through the same operation code as
//! every real server (`farside_rmem::ops::execute`: tag, replay window, rights). Not a
//! deployment component: a node publishes one region.

use farside_auth::keys::{Keyring, Policy};
use farside_auth::mac::KeyId;
use farside_region::{Header, HeapWords, LoadRecord, RegionWriter, Words, REGION_WORDS};
use farside_rmem::ops::{self, Dedup, OpCounters};
use farside_rmem::wire::{ReqHeader, ENVELOPE_BYTES, REP_BYTES_MAX};
use farside_rmem::{ClientKey, Role, ServerKeys};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the responder's thread looks at its stop flag while idle.
const IDLE_CHECK: Duration = Duration::from_millis(50);

/// Requests taken per `recvmmsg` (and replies per `sendmmsg`): batching keeps one
/// thread ahead of a poller reading 1,024 regions per millisecond.
const BATCH: usize = 64;

/// Receive buffer per request: a padded monitor READ is 312 bytes; longer ones are cut
/// (and refused by the operation's checks).
const REQ_BUF_BYTES: usize = 2048;

/// Region `i`'s key id: distinct per region.
pub fn region_key_id(i: usize) -> u32 {
    i as u32 + 1
}

/// A responder's key: random, in a key file (0600) of its own temp directory, removed
/// when dropped.
struct KeyDir {
    dir: std::path::PathBuf,
    file: std::path::PathBuf,
    key: ClientKey,
}

impl KeyDir {
    fn new() -> std::io::Result<KeyDir> {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "farside-responder-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        let key = farside_rmem::LabKeyset::generate().reader;
        let file = farside_rmem::auth::write_key_file(&dir, "rmem.key", key.key())?;
        Ok(KeyDir { dir, file, key })
    }

    /// `?key=ID:PATH` naming this file under key id `id`.
    fn spec(&self, id: u32) -> String {
        format!("{id}:{}", self.file.display())
    }

    /// A server keyring holding the key as a reader's under `id`.
    fn server(&self, id: u32) -> ServerKeys {
        let mut k = Keyring::new(Policy::Production);
        k.install("reader", KeyId(id), *self.key.key(), Role::Reader.rights())
            .expect("a random key");
        ServerKeys::new(k)
    }
}

impl Drop for KeyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `n` regions behind one udp socket on 127.0.0.1.
pub struct MultiResponder {
    /// Where it answers.
    pub addr: SocketAddr,
    writers: Arc<Mutex<Vec<RegionWriter<Shared>>>>,
    /// Requests answered.
    pub answered: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    keys: KeyDir,
}

/// Region words that a [`RegionWriter`] owns while the responder reads them.
struct Shared(Arc<HeapWords>);

impl Words for Shared {
    fn words(&self) -> &[std::sync::atomic::AtomicU64] {
        self.0.words()
    }
}

impl MultiResponder {
    /// Start answering `n` regions, region `i` publishing `conns_established = i`.
    pub fn spawn(n: usize) -> std::io::Result<MultiResponder> {
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        sock.set_read_timeout(Some(IDLE_CHECK))?;
        crate::poller::set_rcvbuf(&sock, (n * 4096).max(1 << 20));
        let addr = sock.local_addr()?;
        let mut mems = Vec::with_capacity(n);
        let mut writers = Vec::with_capacity(n);
        for i in 0..n {
            let mem = Arc::new(HeapWords::new(REGION_WORDS));
            let header = Header {
                node_id: i as u64,
                generation: farside_region::fresh_generation(),
                period_us: 1000,
                watched_ports: [0; 4],
            };
            let mut w = RegionWriter::init(Shared(mem.clone()), header);
            w.publish(&LoadRecord {
                conns_established: i as u64,
                ..Default::default()
            });
            mems.push(mem);
            writers.push(w);
        }
        let keys = KeyDir::new()?;
        let by_key: HashMap<u32, (usize, ServerKeys)> = (0..n)
            .map(|i| (region_key_id(i), (i, keys.server(region_key_id(i)))))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let (st, ans) = (stop.clone(), answered.clone());
        let thread = std::thread::Builder::new()
            .name("multi-responder".into())
            .spawn(move || {
                let counters = OpCounters::default();
                let dedup = Dedup::new();
                let mut reqs = vec![[0u8; REQ_BUF_BYTES]; BATCH];
                let mut reps: Vec<Vec<u8>> = (0..BATCH)
                    .map(|_| Vec::with_capacity(REP_BYTES_MAX))
                    .collect();
                let fd = sock.as_raw_fd();
                while !st.load(Ordering::Relaxed) {
                    // SAFETY: plain data, all-zero valid.
                    let mut addrs: [libc::sockaddr_storage; BATCH] = unsafe { std::mem::zeroed() };
                    let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
                    let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
                    for j in 0..BATCH {
                        iov[j] = libc::iovec {
                            iov_base: reqs[j].as_mut_ptr().cast(),
                            iov_len: REQ_BUF_BYTES,
                        };
                        msgs[j].msg_hdr.msg_name =
                            (&mut addrs[j] as *mut libc::sockaddr_storage).cast();
                        msgs[j].msg_hdr.msg_namelen =
                            std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                        msgs[j].msg_hdr.msg_iov = &mut iov[j];
                        msgs[j].msg_hdr.msg_iovlen = 1;
                    }
                    // SAFETY: msgs point into reqs/addrs/iov, live for the call. Blocks for
                    // the first datagram (up to the socket's IDLE_CHECK timeout), then takes
                    // what is queued.
                    let r = unsafe {
                        libc::recvmmsg(
                            fd,
                            msgs.as_mut_ptr(),
                            BATCH as libc::c_uint,
                            libc::MSG_WAITFORONE,
                            std::ptr::null_mut(),
                        )
                    };
                    if r <= 0 {
                        continue;
                    }
                    let mut out = 0;
                    let mut out_iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
                    let mut out_msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
                    for j in 0..r as usize {
                        let req = &reqs[j][..(msgs[j].msg_len as usize).min(REQ_BUF_BYTES)];
                        // The key id names the region (verified by `execute`).
                        let Some(id) = req.get(8..12) else {
                            continue;
                        };
                        let id = u32::from_le_bytes(id.try_into().expect("4 bytes"));
                        let Some((i, keys)) = by_key.get(&id) else {
                            continue; // unknown key: no reply, as every server
                        };
                        let rep = &mut reps[out];
                        let status =
                            ops::execute(mems[*i].words(), keys, &counters, &dedup, true, req, rep);
                        if ops::silent(status) {
                            continue;
                        }
                        out_iov[out] = libc::iovec {
                            iov_base: rep.as_mut_ptr().cast(),
                            iov_len: rep.len(),
                        };
                        out_msgs[out].msg_hdr.msg_name = msgs[j].msg_hdr.msg_name;
                        out_msgs[out].msg_hdr.msg_namelen = msgs[j].msg_hdr.msg_namelen;
                        out_msgs[out].msg_hdr.msg_iov = &mut out_iov[out];
                        out_msgs[out].msg_hdr.msg_iovlen = 1;
                        out += 1;
                    }
                    // SAFETY: out_msgs[..out] point to live replies and addresses.
                    unsafe { send_replies(fd, &mut out_msgs[..out], &ans) };
                }
            })?;
        Ok(MultiResponder {
            addr,
            writers: Arc::new(Mutex::new(writers)),
            answered,
            stop,
            thread: Some(thread),
            keys,
        })
    }

    /// Publish a new record in every region (as a gatherer's sample would), region `i`
    /// with `conns_established = i + bump`.
    pub fn publish_all(&self, bump: u64) {
        publish_regions(&self.writers, bump);
    }

    /// `udp:ADDR?key=ID:PATH` of region `i`.
    pub fn target(&self, i: usize) -> farside_rmem::Target {
        farside_rmem::Target::parse(&format!(
            "udp:{}?key={}",
            self.addr,
            self.keys.spec(region_key_id(i))
        ))
        .expect("valid target")
    }
}

impl Drop for MultiResponder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Region `i`'s endpoint address in a [`GroupResponder`]: 127.1.x.y, distinct per
/// region (every 127/8 address is local on Linux's loopback), never 127.0.0.1.
pub fn group_region_ip(i: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(
        127,
        1 + (i / 40_000) as u8,
        (i / 200 % 200) as u8,
        1 + (i % 200) as u8,
    )
}

/// What `n` back-ends answering group reads would send, in one process: one socket on
/// port P (bound to the wildcard address) takes READs addressed to 127.0.0.1:P (the
/// stand-in for the multicast group: the network's fan-out is not what is measured) and
/// answers each with `n` replies, region `i`'s sent FROM its own endpoint
/// `group_region_ip(i):P` (`IP_PKTINFO` sets each reply's source address, so the
/// replies go out in `sendmmsg` batches as a responder per back-end would cost the
/// network, not the poller). A READ addressed to a region's endpoint (a unicast retry)
/// is answered by that region alone. Every region answers the shared read key
/// ([`GroupResponder::key`], key id 1), each with its own replay window as separate
/// back-ends have; region `i` publishes `conns_established = i`.
pub struct GroupResponder {
    /// The group address (where group READs go).
    pub group: SocketAddr,
    writers: Arc<Mutex<Vec<RegionWriter<Shared>>>>,
    shared: Arc<GroupShared>,
    /// Group READs taken.
    pub group_reads: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
    keys: KeyDir,
}

/// Bytes of the control message carrying one `in_pktinfo` (CMSG_SPACE of it).
const PKTINFO_CMSG_BYTES: usize = 32;

/// One reply's control message, aligned as the kernel reads it.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Cmsg([u8; PKTINFO_CMSG_BYTES]);

/// Write a `cmsghdr` with an `in_pktinfo` whose source address is `ip` into `c`.
fn pktinfo_cmsg(c: &mut Cmsg, ip: std::net::Ipv4Addr) {
    // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
    let (space, len) = unsafe {
        (
            libc::CMSG_SPACE(std::mem::size_of::<libc::in_pktinfo>() as u32) as usize,
            libc::CMSG_LEN(std::mem::size_of::<libc::in_pktinfo>() as u32) as usize,
        )
    };
    assert!(
        space <= PKTINFO_CMSG_BYTES,
        "in_pktinfo control message fits"
    );
    let hdr = libc::cmsghdr {
        cmsg_len: len as _,
        cmsg_level: libc::IPPROTO_IP,
        cmsg_type: libc::IP_PKTINFO,
    };
    let info = libc::in_pktinfo {
        ipi_ifindex: 0,
        ipi_spec_dst: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        ipi_addr: libc::in_addr { s_addr: 0 },
    };
    let data = std::mem::size_of::<libc::cmsghdr>();
    // SAFETY: c is 8-aligned and holds a cmsghdr followed by an in_pktinfo (asserted).
    unsafe {
        std::ptr::write_unaligned(c.0.as_mut_ptr().cast(), hdr);
        std::ptr::write_unaligned(c.0.as_mut_ptr().add(data).cast(), info);
    }
}

/// The destination address of a datagram received with `IP_PKTINFO` on, from its
/// control messages.
fn pktinfo_dst(msg: &libc::msghdr) -> Option<std::net::Ipv4Addr> {
    // SAFETY: msg's control buffer was filled by recvmmsg; the CMSG_* walk stays within
    // msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_PKTINFO {
                let info: libc::in_pktinfo = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                return Some(std::net::Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr)));
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    None
}

/// Most threads a [`GroupResponder`] answers one group READ with (each sends a share of
/// the regions' replies on the shared socket); more than the host's CPUs only adds
/// wake-ups.
pub const GROUP_THREADS_MAX: usize = 16;

/// A group READ handed from the receiving thread to the others: the request and where
/// it came from; `seq` counts the READs handed so far (0: none yet).
struct GroupJob {
    seq: u64,
    req: Vec<u8>,
    from: libc::sockaddr_storage,
    from_len: libc::socklen_t,
}

/// What every thread of a [`GroupResponder`] shares.
struct GroupShared {
    sock: UdpSocket,
    mems: Vec<Arc<HeapWords>>,
    /// Per region: as many replay windows as back-ends.
    keys: Vec<ServerKeys>,
    stop: AtomicBool,
    answered: AtomicU64,
    unicast_reads: AtomicU64,
    job: Mutex<GroupJob>,
    job_ready: std::sync::Condvar,
}

/// One thread's reply buffers, allocated once.
struct ReplyBufs {
    counters: OpCounters,
    dedup: Dedup,
    reps: Vec<Vec<u8>>,
    cmsgs: [Cmsg; BATCH],
}

impl ReplyBufs {
    fn new() -> ReplyBufs {
        ReplyBufs {
            counters: OpCounters::default(),
            dedup: Dedup::new(),
            reps: (0..BATCH)
                .map(|_| Vec::with_capacity(REP_BYTES_MAX))
                .collect(),
            cmsgs: [Cmsg([0; PKTINFO_CMSG_BYTES]); BATCH],
        }
    }

    /// Answer `req` (from `from`) for `regions`, each reply from its region's endpoint,
    /// in `sendmmsg` batches of [`BATCH`].
    fn answer(
        &mut self,
        sh: &GroupShared,
        req: &[u8],
        from: &mut libc::sockaddr_storage,
        from_len: libc::socklen_t,
        regions: std::ops::Range<usize>,
    ) {
        let mut start = regions.start;
        while start < regions.end {
            let chunk = start..(start + BATCH).min(regions.end);
            start = chunk.end;
            // SAFETY: plain data, all-zero valid.
            let mut out_iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
            let mut out_msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
            let mut out = 0;
            for i in chunk {
                let rep = &mut self.reps[out];
                let status = ops::execute(
                    sh.mems[i].words(),
                    &sh.keys[i],
                    &self.counters,
                    &self.dedup,
                    true,
                    req,
                    rep,
                );
                if ops::silent(status) {
                    continue;
                }
                pktinfo_cmsg(&mut self.cmsgs[out], group_region_ip(i));
                out_iov[out] = libc::iovec {
                    iov_base: rep.as_mut_ptr().cast(),
                    iov_len: rep.len(),
                };
                let m = &mut out_msgs[out].msg_hdr;
                m.msg_name = (from as *mut libc::sockaddr_storage).cast();
                m.msg_namelen = from_len;
                m.msg_iov = &mut out_iov[out];
                m.msg_iovlen = 1;
                m.msg_control = self.cmsgs[out].0.as_mut_ptr().cast();
                m.msg_controllen = PKTINFO_CMSG_BYTES as _;
                out += 1;
            }
            // SAFETY: out_msgs[..out] point to live replies, the requester's address
            // and control messages.
            unsafe { send_replies(sh.sock.as_raw_fd(), &mut out_msgs[..out], &sh.answered) };
        }
    }
}

/// Thread `k` of `threads`' share of `n` regions.
fn share(n: usize, k: usize, threads: usize) -> std::ops::Range<usize> {
    n * k / threads..n * (k + 1) / threads
}

impl GroupResponder {
    /// Start answering group READs for `n` regions with one thread.
    pub fn spawn(n: usize) -> std::io::Result<GroupResponder> {
        Self::spawn_threads(n, 1)
    }

    /// Start answering group READs for `n` regions with `threads` threads (1 to
    /// [`GROUP_THREADS_MAX`]): the first receives every READ and, for a group READ, hands
    /// it to the others; each sends an equal share of the replies on the same socket,
    /// so that on a host with spare CPUs the replies arrive as from back-ends answering
    /// in parallel (one thread sends them one after another, ~3.6 µs apart here).
    pub fn spawn_threads(n: usize, threads: usize) -> std::io::Result<GroupResponder> {
        if !(1..=GROUP_THREADS_MAX).contains(&threads) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{threads} responder threads: 1 to {GROUP_THREADS_MAX}"),
            ));
        }
        let sock = UdpSocket::bind("0.0.0.0:0")?;
        sock.set_read_timeout(Some(IDLE_CHECK))?;
        crate::poller::set_rcvbuf(&sock, (n * 4096).max(1 << 20));
        let on: libc::c_int = 1;
        // SAFETY: setsockopt with a valid int option value.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_PKTINFO,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let port = sock.local_addr()?.port();
        let group = SocketAddr::from(([127, 0, 0, 1], port));
        let mut mems = Vec::with_capacity(n);
        let mut writers = Vec::with_capacity(n);
        for i in 0..n {
            let mem = Arc::new(HeapWords::new(REGION_WORDS));
            let header = Header {
                node_id: i as u64,
                generation: farside_region::fresh_generation(),
                period_us: 1000,
                watched_ports: [0; 4],
            };
            let mut w = RegionWriter::init(Shared(mem.clone()), header);
            w.publish(&LoadRecord {
                conns_established: i as u64,
                ..Default::default()
            });
            mems.push(mem);
            writers.push(w);
        }
        let by_ip: HashMap<std::net::Ipv4Addr, usize> =
            (0..n).map(|i| (group_region_ip(i), i)).collect();
        let keys = KeyDir::new()?;
        let sh = Arc::new(GroupShared {
            sock,
            mems,
            keys: (0..n).map(|_| keys.server(1)).collect(),
            stop: AtomicBool::new(false),
            answered: AtomicU64::new(0),
            unicast_reads: AtomicU64::new(0),
            // SAFETY: plain data, all-zero valid.
            job: Mutex::new(GroupJob {
                seq: 0,
                req: Vec::new(),
                from: unsafe { std::mem::zeroed() },
                from_len: 0,
            }),
            job_ready: std::sync::Condvar::new(),
        });
        let group_reads = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::with_capacity(threads);
        let s = sh.clone();
        let greads = group_reads.clone();
        handles.push(
            std::thread::Builder::new()
                .name("group-responder".into())
                .spawn(move || receive_loop(&s, n, threads, &by_ip, &greads))?,
        );
        for k in 1..threads {
            let s = sh.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("group-responder{k}"))
                .spawn(move || helper_loop(&s, share(n, k, threads)));
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    sh.stop.store(true, Ordering::Relaxed);
                    sh.job_ready.notify_all();
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(GroupResponder {
            group,
            writers: Arc::new(Mutex::new(writers)),
            shared: sh,
            group_reads,
            threads: handles,
            keys,
        })
    }

    /// The shared read key (key id 1), for `MonitorOptions::key`.
    pub fn key(&self) -> ClientKey {
        self.keys.key
    }

    /// Replies sent.
    pub fn answered(&self) -> u64 {
        self.shared.answered.load(Ordering::Relaxed)
    }

    /// READs taken that were addressed to one region (unicast retries).
    pub fn unicast_reads(&self) -> u64 {
        self.shared.unicast_reads.load(Ordering::Relaxed)
    }

    /// Publish a new record in every region, region `i` with `conns_established = i +
    /// bump`.
    pub fn publish_all(&self, bump: u64) {
        publish_regions(&self.writers, bump);
    }

    /// `udp:IP:PORT` of region `i` (its endpoint; the shared read key).
    pub fn target(&self, i: usize) -> farside_rmem::Target {
        farside_rmem::Target::parse(&format!("udp:{}:{}", group_region_ip(i), self.group.port()))
            .expect("valid target")
    }
}

impl Drop for GroupResponder {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.job_ready.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The receiving thread: every READ, one at a time. A group READ (to 127.0.0.1) is
/// handed to the other threads and answered for this thread's share; a READ to one
/// region's endpoint (a unicast retry) by that region alone.
fn receive_loop(
    sh: &GroupShared,
    n: usize,
    threads: usize,
    by_ip: &HashMap<std::net::Ipv4Addr, usize>,
    group_reads: &AtomicU64,
) {
    let fd = sh.sock.as_raw_fd();
    let mut req = [0u8; REQ_BUF_BYTES];
    let mut bufs = ReplyBufs::new();
    while !sh.stop.load(Ordering::Relaxed) {
        // SAFETY: plain data, all-zero valid.
        let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut ctl = Cmsg([0; PKTINFO_CMSG_BYTES]);
        let mut iov = libc::iovec {
            iov_base: req.as_mut_ptr().cast(),
            iov_len: REQ_BUF_BYTES,
        };
        // SAFETY: plain data, all-zero valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.0.as_mut_ptr().cast();
        msg.msg_controllen = PKTINFO_CMSG_BYTES as _;
        // SAFETY: msg points to live buffers; blocks up to IDLE_CHECK.
        let r = unsafe { libc::recvmsg(fd, &mut msg, 0) };
        if r <= 0 {
            continue;
        }
        let req = &req[..(r as usize).min(REQ_BUF_BYTES)];
        if req.len() < ENVELOPE_BYTES || ReqHeader::decode(&req[ENVELOPE_BYTES..]).is_err() {
            continue;
        }
        let from_len = msg.msg_namelen;
        let regions = match pktinfo_dst(&msg) {
            Some(d) if d == std::net::Ipv4Addr::LOCALHOST => {
                group_reads.fetch_add(1, Ordering::Relaxed);
                if threads > 1 {
                    let mut j = sh.job.lock().unwrap_or_else(|p| p.into_inner());
                    j.seq += 1;
                    j.req.clear();
                    j.req.extend_from_slice(req);
                    j.from = from;
                    j.from_len = from_len;
                    drop(j);
                    sh.job_ready.notify_all();
                }
                share(n, 0, threads)
            }
            Some(d) => match by_ip.get(&d) {
                Some(&i) => {
                    sh.unicast_reads.fetch_add(1, Ordering::Relaxed);
                    i..i + 1
                }
                None => continue,
            },
            None => continue,
        };
        bufs.answer(sh, req, &mut from, from_len, regions);
    }
}

/// Another thread: waits for the group READs the receiving thread hands over and
/// answers `regions` for each.
fn helper_loop(sh: &GroupShared, regions: std::ops::Range<usize>) {
    let mut bufs = ReplyBufs::new();
    let mut seen = 0;
    let mut req = Vec::with_capacity(REQ_BUF_BYTES);
    while !sh.stop.load(Ordering::Relaxed) {
        let j = sh.job.lock().unwrap_or_else(|p| p.into_inner());
        let (j, _) = sh
            .job_ready
            .wait_timeout_while(j, IDLE_CHECK, |j| {
                j.seq == seen && !sh.stop.load(Ordering::Relaxed)
            })
            .unwrap_or_else(|p| p.into_inner());
        if j.seq == seen {
            continue;
        }
        seen = j.seq;
        req.clear();
        req.extend_from_slice(&j.req);
        let (mut from, from_len) = (j.from, j.from_len);
        drop(j);
        bufs.answer(sh, &req, &mut from, from_len, regions.clone());
    }
}

/// Sends every reply in `msgs` with `sendmmsg`, skipping one that fails; counts the sent
/// ones in `answered`.
///
/// # Safety
/// Every header in `msgs` must point to live buffers (reply, address, control).
unsafe fn send_replies(fd: libc::c_int, msgs: &mut [libc::mmsghdr], answered: &AtomicU64) {
    let mut sent = 0;
    while sent < msgs.len() {
        // SAFETY: the caller's contract: msgs[sent..] point to live buffers.
        let k = unsafe {
            libc::sendmmsg(
                fd,
                msgs[sent..].as_mut_ptr(),
                (msgs.len() - sent) as libc::c_uint,
                0,
            )
        };
        if k <= 0 {
            sent += 1; // skip the one that failed
        } else {
            sent += k as usize;
            answered.fetch_add(k as u64, Ordering::Relaxed);
        }
    }
}

/// Region `i` gets a new record with `conns_established = i + bump`.
fn publish_regions<W: Words>(writers: &Mutex<Vec<RegionWriter<W>>>, bump: u64) {
    let mut w = writers.lock().unwrap_or_else(|p| p.into_inner());
    for (i, w) in w.iter_mut().enumerate() {
        w.publish(&LoadRecord {
            conns_established: i as u64 + bump,
            ..Default::default()
        });
    }
}
