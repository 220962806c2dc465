//! The one-sided reader of a server's object arena: fetches an object with rmem READs of
//! the arena region (`farside_arena::layout::ARENA_REGION`), answered by the server's
//! XDP responder in the kernel, so no server process is scheduled for the body.
//!
//! ```text
//!  hint (from the HTTP answer, or an index lookup) ─► plan: the slot's chunk READs
//!  READ 0 (seq_head) alone ─► READs 1..n-2 pipelined, at most READ_WINDOW in flight
//!  (bulk: several chunks per READ) ─► READ n-1 (seq_tail) alone
//!  ─► seqlock + url hash + CRC32c check
//!        torn ─► again, at most READ_RETRY_MAX times; stale / corrupt ─► error
//! ```
//!
//! The middle READs are **bulk** READs (`farside_arena::layout::FLAG_BULK`) unless the
//! reader is told otherwise ([`ArenaReader::set_bulk_chunks`]): each spans as many
//! chunks as one reply datagram carries on the path (the socket's IP MTU:
//! `bulk_chunks_for_mtu`, one chunk on a 1,500-byte link, six on a 9,000-byte one), and
//! its reply's tag covers the reply's envelope and header, not the body. The head READ
//! (`seq_head`, url hash, length, CRC32c) and the tail READ (`seq_tail`) are always
//! whole-tagged, and the object is accepted only once the CRC32c over the url hash,
//! length and every body byte verifies: `docs/rdma-http.md` (Arena-reads, "Bulk READs")
//! says what that keeps and what it trades.
//!
//! The order is what the seqlock argument needs (`farside_arena::slot`): the head word
//! is read before any other READ is issued, the tail word after every other was answered.
//! Every request is sealed under the client's arena reader key, padded to its reply's size
//! (the responder never answers with more bytes than it got), and every reply must open
//! under that key, for this sender and one of this fetch's envelope seqs, with status Ok
//! and exactly the bytes asked. A READ unanswered for [`READ_RTO`] is sent again as a
//! new request (a new envelope seq: the replay window refuses a copy), at most
//! [`READ_RESENDS_MAX`] times per READ.

use crate::header::ArenaHint;
use farside_arena::index::{lookup_in_window, probe_window};
use farside_arena::layout::{
    bulk_chunks_for_mtu, ARENA_REGION, BULK_CHUNKS_MAX, CHUNK_BYTES, CLASS_COUNT, FLAG_BULK,
    READ_RETRY_MAX,
};
use farside_arena::slot::SlotRef;
use farside_arena::{chunk_reads, Bucket, ObjectRead, ReadError, SLOTS_BASE};
use farside_auth::mac::{self, Domain, TagKey};
use farside_rmem::auth::{seal_request_to, SenderState};
use farside_rmem::wire::{self, RepHeader, ReqHeader, Status, ENVELOPE_BYTES};
use farside_rmem::ClientKey;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// READs in flight at once. Rule: 64 replies of 1.5 kB (96 kB) fit the socket's
/// receive buffer (we ask for [`RECV_BUFFER_BYTES`]) and a veth or NIC ring of 256, so a
/// window never overruns a buffer it depends on; 64 x 1,400 B per round trip is ~90 MB/s
/// even at a 1 ms round trip.
pub const READ_WINDOW: usize = 64;
/// Bytes of READs in flight at once (with [`READ_WINDOW`], whichever binds first). Rule:
/// about the bytes 64 one-chunk READs keep in flight (90 kB), so a window of bulk READs
/// (15 of 8,400 B) needs no more socket buffer or ring than the one-chunk window did,
/// and 15 clients' windows together (225 frames) stay far below a CPU's receive
/// backlog (`netdev_max_backlog`, 1,000 by default).
pub const READ_WINDOW_BYTES: usize = 128 << 10;
/// Time a READ may go unanswered before it is sent again. Rule: an XDP answer takes
/// microseconds even on a loaded host (softirq, not the scheduler); 20 ms is far above
/// any queueing on one link and short enough that a lost datagram costs little.
pub const READ_RTO: Duration = Duration::from_millis(20);
/// Times one READ is sent again before the fetch fails. Rule: 8 losses of the same
/// datagram in a row mean the path or the responder is gone, not congested.
pub const READ_RESENDS_MAX: u32 = 8;
/// Receive buffer the reader asks for (the kernel may cap it at `rmem_max`).
pub const RECV_BUFFER_BYTES: usize = 1 << 20;
/// Replies one `recvmmsg` takes. Rule: a bulk window (15 READs) in one wake-up, and 16
/// one-chunk replies; more only grows the buffers (16 x 8.5 kB per reader).
pub const RECV_BATCH: usize = 16;
/// Largest reply datagram a reader takes: a bulk READ's (envelope, header, body).
const REPLY_BYTES_MAX: usize =
    ENVELOPE_BYTES + wire::REP_HEADER_BYTES + farside_arena::layout::BULK_READ_BYTES_MAX;
/// Largest object a fetch accepts (the arena's largest slot).
pub const FETCH_BYTES_MAX: u64 = farside_arena::layout::SLOT_OBJECT_BYTES_MAX as u64;

/// Why a fetch failed (the caller then asks for the body over TCP).
#[derive(Debug)]
pub enum FetchError {
    Io(io::Error),
    /// A READ went unanswered after [`READ_RESENDS_MAX`] resends.
    Lost {
        offset: usize,
    },
    /// The responder refused a READ (wrong key, bounds...).
    Refused {
        offset: usize,
        status: Status,
    },
    /// The hint names no possible slot or a length over the bound.
    BadHint,
    /// The object did not validate (stale, corrupt, or torn every time).
    Invalid(ReadError),
    /// The url is not in the index.
    NotIndexed,
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::Io(e) => write!(f, "arena read: {e}"),
            FetchError::Lost { offset } => write!(
                f,
                "arena READ at {offset} unanswered after {READ_RESENDS_MAX} resends"
            ),
            FetchError::Refused { offset, status } => {
                write!(f, "arena READ at {offset} refused: {}", status.name())
            }
            FetchError::BadHint => f.write_str("arena hint names no slot"),
            FetchError::Invalid(e) => write!(f, "arena object invalid: {e}"),
            FetchError::NotIndexed => f.write_str("object not in the arena index"),
        }
    }
}

impl std::error::Error for FetchError {}

impl From<io::Error> for FetchError {
    fn from(e: io::Error) -> FetchError {
        FetchError::Io(e)
    }
}

/// What one fetch cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchStats {
    /// READ requests sent (resends included).
    pub reads: u64,
    pub resends: u64,
    /// Whole-object re-reads after a torn read.
    pub torn: u32,
}

/// One READ of a fetch: arena offset, length, and whether it is a bulk READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Read {
    offset: usize,
    len: usize,
    bulk: bool,
}

/// A reader of one server's arena: a udp socket to its responder, a key, a sender.
pub struct ArenaReader {
    sock: UdpSocket,
    key: ClientKey,
    reply_tag: TagKey,
    sender: SenderState,
    op_seq: u64,
    /// Chunks per bulk READ; 0: no bulk READs (every READ one chunk, whole-tagged).
    bulk_chunks: usize,
    /// Receive buffers of one `recvmmsg`, each a whole reply.
    bufs: Vec<Vec<u8>>,
}

impl ArenaReader {
    /// A reader of the responder at `server` (its address and arena port).
    pub fn connect(server: SocketAddr, key: ClientKey) -> io::Result<ArenaReader> {
        let bind: SocketAddr = if server.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal")
        } else {
            "[::]:0".parse().expect("literal")
        };
        let sock = UdpSocket::bind(bind)?;
        sock.connect(server)?;
        set_recv_buffer(&sock, RECV_BUFFER_BYTES);
        let bulk_chunks = bulk_chunks_for_mtu(path_mtu(&sock));
        Ok(ArenaReader {
            sock,
            reply_tag: TagKey::new(Domain::RmemReply, key.key()),
            key,
            sender: SenderState::new(),
            op_seq: 0,
            bulk_chunks,
            bufs: vec![vec![0; wire::REP_BYTES_MAX.max(REPLY_BYTES_MAX)]; RECV_BATCH],
        })
    }

    /// Chunks per bulk READ (0: bulk READs off). Set at connect from the path's MTU.
    pub fn bulk_chunks(&self) -> usize {
        self.bulk_chunks
    }

    /// Chunks per bulk READ, at most `BULK_CHUNKS_MAX`; 0 turns bulk READs off (every
    /// READ one chunk with its body under the tag, for a responder without them or a
    /// reader that wants every reply's body authenticated on its own).
    pub fn set_bulk_chunks(&mut self, chunks: usize) {
        self.bulk_chunks = chunks.min(BULK_CHUNKS_MAX);
    }

    /// The key id this reader seals under.
    pub fn key_id(&self) -> u32 {
        self.key.id.0
    }

    /// The responder this reader talks to.
    pub fn server(&self) -> io::Result<SocketAddr> {
        self.sock.peer_addr()
    }

    /// Fetches the object a hint names, validated; at most `maxlen` bytes.
    pub fn fetch(
        &mut self,
        hint: &ArenaHint,
        maxlen: u64,
    ) -> Result<(Vec<u8>, FetchStats), FetchError> {
        self.fetch_versioned(hint, maxlen)
            .map(|(_, body, stats)| (body, stats))
    }

    /// Resolves a published name (an alias bucket: `farside_arena::ArenaMap::publish`)
    /// with one index READ and fetches its object, accepted only if the slot still
    /// holds the version the alias names (a republished or replaced object reads as
    /// [`ReadError::Stale`]). The reader's key must open the arena (a grant).
    pub fn fetch_published(
        &mut self,
        alias_hash: u64,
        port: u16,
        maxlen: u64,
    ) -> Result<(Vec<u8>, FetchStats), FetchError> {
        let b = self.lookup(alias_hash)?;
        if b.object == 0 {
            return Err(FetchError::NotIndexed);
        }
        let class =
            farside_arena::layout::class_for_len(b.len as usize).ok_or(FetchError::BadHint)?;
        let hint = ArenaHint {
            port,
            key: self.key.id.0,
            slot: b.offset.into(),
            class: class as u8,
            hash: b.object,
            len: b.len.into(),
        };
        let (version, body, stats) = self.fetch_versioned(&hint, maxlen)?;
        if version != b.version {
            return Err(FetchError::Invalid(ReadError::Stale));
        }
        Ok((body, stats))
    }

    /// As [`Self::fetch`], with the version the object was read at.
    pub fn fetch_versioned(
        &mut self,
        hint: &ArenaHint,
        maxlen: u64,
    ) -> Result<(u64, Vec<u8>, FetchStats), FetchError> {
        let class = hint.class as usize;
        if class >= CLASS_COUNT || hint.len > maxlen.min(FETCH_BYTES_MAX) {
            return Err(FetchError::BadHint);
        }
        let slot = SlotRef {
            offset: usize::try_from(hint.slot).map_err(|_| FetchError::BadHint)?,
            class,
        };
        let mut read =
            ObjectRead::for_slot(slot, hint.hash, hint.len as usize).ok_or(FetchError::BadHint)?;
        let mut stats = FetchStats::default();
        loop {
            let plan: Vec<(usize, usize)> = read
                .plan()
                .into_iter()
                .map(|(o, l)| (SLOTS_BASE + o, l))
                .collect();
            let n = plan.len();
            let mut phases = vec![(0, 1, false)];
            if n > 2 {
                phases.push((1, n - 1, self.bulk_chunks > 0));
            }
            if n > 1 {
                phases.push((n - 1, n, false));
            }
            for (a, b, bulk) in phases {
                let groups = group_reads(&plan[a..b], if bulk { self.bulk_chunks } else { 0 });
                let reads: Vec<Read> = groups.iter().map(|g| g.0).collect();
                let replies = self.read_many(&reads, &mut stats)?;
                for ((_, members), bytes) in groups.iter().zip(replies) {
                    let mut at = 0;
                    for &i in members {
                        let len = plan[a + i].1;
                        read.feed_at(a + i, &bytes[at..at + len]);
                        at += len;
                    }
                }
            }
            match read.finish() {
                Ok((version, body)) => return Ok((version, body, stats)),
                Err(ReadError::Torn) if stats.torn < READ_RETRY_MAX => {
                    stats.torn += 1;
                    read.restart();
                }
                Err(e) => return Err(FetchError::Invalid(e)),
            }
        }
    }

    /// Looks `url_hash` up in the arena's index (its probe window, READ by chunk).
    pub fn lookup(&mut self, url_hash: u64) -> Result<Bucket, FetchError> {
        let mut stats = FetchStats::default();
        let reads: Vec<Read> = probe_window(url_hash)
            .into_iter()
            .flat_map(|(o, l)| chunk_reads(o, l))
            .map(|(offset, len)| Read {
                offset,
                len,
                bulk: false,
            })
            .collect();
        let window: Vec<u8> = self.read_many(&reads, &mut stats)?.concat();
        lookup_in_window(&window, url_hash).ok_or(FetchError::NotIndexed)
    }

    /// READs `reads` (each within one chunk, or a bulk READ), at most [`READ_WINDOW`]
    /// and [`READ_WINDOW_BYTES`] in flight, resent on loss; their bytes in order. The
    /// READs that fit the window go out in one `sendmmsg`, and every wake-up takes all
    /// the replies waiting, up to [`RECV_BATCH`], in one `recvmmsg`.
    fn read_many(
        &mut self,
        reads: &[Read],
        stats: &mut FetchStats,
    ) -> Result<Vec<Vec<u8>>, FetchError> {
        let mut got: Vec<Option<Vec<u8>>> = vec![None; reads.len()];
        // Envelope seq -> READ index; per READ: (last sent at, resends); sends in order.
        let mut inflight: HashMap<u64, usize> = HashMap::new();
        let mut sent: Vec<(Instant, u32)> = vec![(Instant::now(), 0); reads.len()];
        let mut order: VecDeque<(Instant, usize)> = VecDeque::new();
        let (mut next, mut done, mut outstanding) = (0usize, 0usize, 0usize);
        let mut in_flight_bytes = 0usize;
        let mut first_seq = u64::MAX;
        let mut last_seq = 0u64;
        while done < reads.len() {
            let mut batch = Vec::new();
            while outstanding < READ_WINDOW
                && next < reads.len()
                && (outstanding == 0 || in_flight_bytes + reads[next].len <= READ_WINDOW_BYTES)
            {
                in_flight_bytes += reads[next].len;
                batch.push(next);
                next += 1;
                outstanding += 1;
            }
            if !batch.is_empty() {
                let seqs = self.send_batch(reads, &batch)?;
                let at = Instant::now();
                for (&i, s) in batch.iter().zip(seqs) {
                    stats.reads += 1;
                    first_seq = first_seq.min(s);
                    last_seq = s;
                    inflight.insert(s, i);
                    sent[i] = (at, 0);
                    order.push_back((at, i));
                }
            }
            // The oldest READ still waiting (entries answered or resent since are dropped).
            while let Some(&(at, i)) = order.front() {
                if got[i].is_some() || sent[i].0 != at {
                    order.pop_front();
                } else {
                    break;
                }
            }
            let Some(&(at, i)) = order.front() else {
                continue;
            };
            let now = Instant::now();
            let wait = (at + READ_RTO).saturating_duration_since(now);
            if wait.is_zero() {
                order.pop_front();
                let resends = sent[i].1;
                if resends >= READ_RESENDS_MAX {
                    return Err(FetchError::Lost {
                        offset: reads[i].offset,
                    });
                }
                let s = self.send_batch(reads, &[i])?[0];
                stats.reads += 1;
                stats.resends += 1;
                last_seq = s;
                inflight.insert(s, i);
                sent[i] = (now, resends + 1);
                order.push_back((now, i));
                continue;
            }
            self.sock.set_read_timeout(Some(wait))?;
            let lens = match self.recv_batch() {
                Ok(lens) => lens,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(e.into()),
            };
            for (b, &n) in lens.iter().enumerate() {
                let reply = &self.bufs[b][..n];
                let Some((i, data)) = self.open(reply, reads, &inflight, first_seq..=last_seq)?
                else {
                    continue;
                };
                if got[i].is_some() {
                    continue; // a late answer to a resent READ
                }
                got[i] = Some(data);
                done += 1;
                outstanding -= 1;
                in_flight_bytes -= reads[i].len;
            }
        }
        Ok(got.into_iter().map(|g| g.expect("all done")).collect())
    }

    /// One reply datagram: the READ it answers and its bytes, `None` if it is not an
    /// authentic answer to one of `inflight`'s READs (ignored), or the refusal.
    fn open(
        &self,
        reply: &[u8],
        reads: &[Read],
        inflight: &HashMap<u64, usize>,
        seqs: std::ops::RangeInclusive<u64>,
    ) -> Result<Option<(usize, Vec<u8>)>, FetchError> {
        let Ok(parsed) = mac::parse(reply) else {
            return Ok(None);
        };
        if parsed.envelope.key_id != self.key.id
            || parsed.envelope.sender != self.sender.sender
            || !seqs.contains(&parsed.envelope.seq)
        {
            return Ok(None);
        }
        let Ok(opened) = self.reply_tag.verify(&parsed) else {
            return Ok(None);
        };
        let Some(&i) = inflight.get(&opened.envelope.seq) else {
            return Ok(None);
        };
        let Ok(h) = RepHeader::decode(opened.message) else {
            return Ok(None);
        };
        if h.status != Status::Ok {
            return Err(FetchError::Refused {
                offset: reads[i].offset,
                status: h.status,
            });
        }
        let want = reads[i].len;
        let covered = &opened.message[wire::REP_HEADER_BYTES..];
        // A whole-tagged body always; an untagged one only for a bulk READ.
        let data = if covered.len() == want {
            covered
        } else if reads[i].bulk && covered.is_empty() && opened.trailing.len() == want {
            opened.trailing
        } else {
            return Ok(None);
        };
        if h.len as usize != want {
            return Ok(None);
        }
        Ok(Some((i, data.to_vec())))
    }

    /// Sends the READs `which` of `reads` (sealed, padded) in as few `sendmmsg` calls
    /// as the kernel takes; their envelope seqs, in order.
    fn send_batch(&mut self, reads: &[Read], which: &[usize]) -> io::Result<Vec<u64>> {
        use std::os::fd::AsRawFd;
        let mut datagrams: Vec<Vec<u8>> = Vec::with_capacity(which.len());
        let mut seqs = Vec::with_capacity(which.len());
        for &i in which {
            let mut out =
                vec![0u8; ENVELOPE_BYTES + wire::REP_HEADER_BYTES + reads[i].len.max(CHUNK_BYTES)];
            let (seq, n) = self.seal(reads[i], &mut out);
            out.truncate(n);
            datagrams.push(out);
            seqs.push(seq);
        }
        let mut iovs: Vec<libc::iovec> = datagrams
            .iter_mut()
            .map(|d| libc::iovec {
                iov_base: d.as_mut_ptr().cast(),
                iov_len: d.len(),
            })
            .collect();
        let mut msgs = mmsg_headers(&mut iovs);
        let mut from = 0;
        while from < msgs.len() {
            // SAFETY: a connected socket; msgs[from..] valid headers over live buffers.
            let r = unsafe {
                libc::sendmmsg(
                    self.sock.as_raw_fd(),
                    msgs[from..].as_mut_ptr(),
                    (msgs.len() - from) as libc::c_uint,
                    0,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            from += r as usize;
        }
        Ok(seqs)
    }

    /// Waits (the socket's read timeout) for one reply and takes every other already
    /// queued, up to [`RECV_BATCH`], into `self.bufs`; their lengths.
    fn recv_batch(&mut self) -> io::Result<Vec<usize>> {
        use std::os::fd::AsRawFd;
        let mut iovs: Vec<libc::iovec> = self
            .bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let mut msgs = mmsg_headers(&mut iovs);
        // SAFETY: a bound socket; msgs valid headers over self.bufs, which outlive the call.
        let r = unsafe {
            libc::recvmmsg(
                self.sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                msgs.len() as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(msgs[..r as usize]
            .iter()
            .map(|m| m.msg_len as usize)
            .collect())
    }

    /// Seals one arena READ into `out`, padded to its reply's size (the responder never
    /// answers with more): its envelope seq and the datagram's length.
    fn seal(&mut self, read: Read, out: &mut [u8]) -> (u64, usize) {
        let Read { offset, len, bulk } = read;
        self.op_seq += 1;
        let mut covered = Vec::with_capacity(wire::REQ_HEADER_BYTES);
        ReqHeader {
            op: wire::Op::Read as u8,
            flags: if bulk { FLAG_BULK } else { 0 },
            seq: self.op_seq,
            region: ARENA_REGION,
            offset: offset as u32,
            len: len as u32,
        }
        .encode(&mut covered);
        let env_seq = self.sender.next_seq();
        let n = seal_request_to(out, &self.key, self.sender.sender, env_seq, &covered);
        let padded = (ENVELOPE_BYTES + wire::REP_HEADER_BYTES + len).max(n);
        out[n..padded].fill(0);
        (env_seq, padded)
    }
}

/// Groups the READs of `plan` (one chunk each, ascending) into bulk READs of at most
/// `chunks` contiguous, word-sized READs; with `chunks` 0 every READ stays alone and
/// whole-tagged. Each group: its READ and the plan indices it covers, in order.
fn group_reads(plan: &[(usize, usize)], chunks: usize) -> Vec<(Read, Vec<usize>)> {
    let mut out: Vec<(Read, Vec<usize>)> = Vec::new();
    for (i, &(offset, len)) in plan.iter().enumerate() {
        if let Some((r, members)) = out.last_mut() {
            if chunks > 0
                && members.len() < chunks
                && r.offset + r.len == offset
                && r.len % 8 == 0
                && len % 8 == 0
            {
                r.len += len;
                members.push(i);
                continue;
            }
        }
        let bulk = chunks > 0 && offset % CHUNK_BYTES == 0 && len % 8 == 0;
        out.push((Read { offset, len, bulk }, vec![i]));
    }
    out
}

/// The IP MTU of a connected socket's path (`IP_MTU` / `IPV6_MTU`), or 1,500 if the
/// kernel does not say.
fn path_mtu(sock: &UdpSocket) -> usize {
    use std::os::fd::AsRawFd;
    let v6 = sock.peer_addr().is_ok_and(|a| a.is_ipv6());
    let (level, name) = if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU)
    };
    let mut v: libc::c_int = 0;
    let mut n = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid socket, an int and its length.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut n,
        )
    };
    if r == 0 && v > 0 {
        v as usize
    } else {
        1500
    }
}

/// One message header per iovec, for `sendmmsg` / `recvmmsg`: no address, no control
/// data. The headers point into `iovs`, which must outlive every call that uses them.
fn mmsg_headers(iovs: &mut [libc::iovec]) -> Vec<libc::mmsghdr> {
    iovs.iter_mut()
        .map(|iov| {
            // SAFETY: a zeroed mmsghdr is valid (null name, no control, no iovecs).
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect()
}

/// Asks for a `bytes` receive buffer (SO_RCVBUF, capped by `rmem_max`); best effort: a
/// refusal leaves the default, and a reader resends what the socket dropped.
pub fn set_recv_buffer(sock: &UdpSocket, bytes: usize) {
    use std::os::fd::AsRawFd;
    let v = bytes as libc::c_int;
    // SAFETY: a valid socket and an int option; a refusal only leaves the default.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn middle_reads_are_grouped_into_bulk_reads_of_contiguous_chunks() {
        let c = CHUNK_BYTES;
        // Seven whole chunks and a partial one, then a tail word elsewhere.
        let mut plan: Vec<(usize, usize)> = (0..7).map(|i| (10 * c + i * c, c)).collect();
        plan.push((17 * c, 200));
        plan.push((40 * c - 8, 8));
        let g = group_reads(&plan, 3);
        let shape: Vec<(usize, usize, bool, Vec<usize>)> = g
            .iter()
            .map(|(r, m)| (r.offset, r.len, r.bulk, m.clone()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (10 * c, 3 * c, true, vec![0, 1, 2]),
                (13 * c, 3 * c, true, vec![3, 4, 5]),
                (16 * c, c + 200, true, vec![6, 7]),
                // Not at a chunk boundary: a one-chunk READ, whole-tagged.
                (40 * c - 8, 8, false, vec![8]),
            ]
        );
        // Off: every READ alone and whole-tagged.
        let g = group_reads(&plan, 0);
        assert_eq!(g.len(), plan.len());
        assert!(g.iter().all(|(r, m)| !r.bulk && m.len() == 1));
        // A READ that is not whole words is never merged.
        let odd = [(0, c), (c, 12), (2 * c, c)];
        let g = group_reads(&odd, 6);
        assert_eq!(g.len(), 3);
        assert!(!g[1].0.bulk);
    }
}
