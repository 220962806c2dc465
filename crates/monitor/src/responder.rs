//! A gatherd-like udp responder for many regions in one process, for tests and the
//! monitor benchmark: one socket, one thread, the region chosen by the request's key
//! (each region has its own read key), answered through the same operation code as
//! every real server (`farside_rmem::ops::execute`). Not a deployment component: a
//! node publishes one region.

use farside_region::{Header, HeapWords, LoadRecord, RegionWriter, Words, REGION_WORDS};
use farside_rmem::ops::{self, AccessKeys, Dedup, OpCounters, Perm};
use farside_rmem::wire::{ReqHeader, REP_BYTES_MAX};
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

/// Region `i`'s read key: distinct per region, never the default key.
pub fn region_key(i: usize) -> u64 {
    0x5eed_0000_0000_0000 | i as u64
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
        let by_key: HashMap<u64, (usize, AccessKeys)> = (0..n)
            .map(|i| {
                let k = region_key(i);
                (k, (i, AccessKeys::new().with(k, Perm::ReadOnly)))
            })
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
                        let Ok(h) = ReqHeader::decode(req) else {
                            continue;
                        };
                        let Some((i, keys)) = by_key.get(&h.key) else {
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
                    let mut sent = 0;
                    while sent < out {
                        // SAFETY: out_msgs[sent..out] point to live replies and addresses.
                        let k = unsafe {
                            libc::sendmmsg(
                                fd,
                                out_msgs[sent..].as_mut_ptr(),
                                (out - sent) as libc::c_uint,
                                0,
                            )
                        };
                        if k <= 0 {
                            sent += 1; // skip the one that failed
                        } else {
                            sent += k as usize;
                            ans.fetch_add(k as u64, Ordering::Relaxed);
                        }
                    }
                }
            })?;
        Ok(MultiResponder {
            addr,
            writers: Arc::new(Mutex::new(writers)),
            answered,
            stop,
            thread: Some(thread),
        })
    }

    /// Publish a new record in every region (as a gatherer's sample would), region `i`
    /// with `conns_established = i + bump`.
    pub fn publish_all(&self, bump: u64) {
        let mut w = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        for (i, w) in w.iter_mut().enumerate() {
            w.publish(&LoadRecord {
                conns_established: i as u64 + bump,
                ..Default::default()
            });
        }
    }

    /// `udp:ADDR?key=HEX` of region `i`.
    pub fn target(&self, i: usize) -> farside_rmem::Target {
        farside_rmem::Target::parse(&format!("udp:{}?key={:x}", self.addr, region_key(i)))
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
