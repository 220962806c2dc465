//! The semantics of the four operations on a region, in one place. The shm transport,
//! the tcp server and the udp fallback server all call [`execute`] (shm:
//! [`execute_local`]); the XDP responder in `bpf/` implements the same checks in the
//! same order, and the packet tests compare the two.
//!
//! Checks, in order (the first that fails decides the status; memory is untouched):
//! 1. envelope well formed, its key known, its tag right → `BadKey`   (never answered)
//! 2. envelope (key id, sender, seq) not seen before     → `Replayed` (never answered)
//! 3. header well formed (magic, version)                → `Malformed` (never answered)
//! 4. op known → `BadOp`
//! 5. whole payload present → `Malformed` (never answered)
//! 6. the key's rights (`farside_auth::rights::check`, in its order): region →
//!    `NoRegion`; len (> 0, atomics 8) → `BadLength`; offset and len multiples of 8 →
//!    `Unaligned`; within the region → `OutOfBounds`; a mutation of an agent-owned word
//!    → `Protected`; not granted, or a FETCH-ADD delta over the grant's → `ReadOnly`
//! 7. datagram servers only: a READ request shorter than its reply → `Unpadded`
//!
//! Then, for WRITE/CAS/FADD, duplicate detection per client (the envelope's sender,
//! which its tag vouches for) ([`Dedup`]): every mutation is applied at most once, and
//! a retry of the last one is answered with the recorded reply, so the client learns
//! the one true outcome.
//! - op seq equal to the client's last applied one → replay its reply (`Ok`, same old value)
//! - op seq older → `Stale`: a delayed duplicate, not applied (datagram servers stay silent)
//! - a retry (FLAG_RETRY) of a client with no record → `Unknown`, not applied
//! - otherwise apply and record
//!
//! READs are never recorded (they are idempotent and a reply carries the current words).
//! Every answered reply is sealed under the request's key, bound to its envelope
//! (`crate::auth::seal_reply_prepared`).

use crate::auth::{seal_reply_prepared, ServerKeys};
use crate::wire::*;
use farside_auth::rights::{self, Access, Rights};
use farside_region::mem::{copy_words_in, copy_words_out};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Clients whose last mutation a server remembers. A client forgotten (the least
/// recently used is evicted when a new one arrives) gets `Unknown` for a retry; 1024
/// covers every balancer and monitor of a cluster with room to spare, at 32 bytes each.
/// Mirrored by `RMEM_DEDUP_CLIENTS_MAX` in bpf/rmem_consts.h (max_entries of the XDP map).
pub const DEDUP_CLIENTS_MAX: usize = 1024;
/// Operations remembered per client: one, because a client has at most one operation
/// outstanding (every transport's client waits for the reply or gives up before it
/// sends the next seq). Mirrored by `RMEM_DEDUP_WINDOW` in bpf/rmem_consts.h.
pub const DEDUP_WINDOW: usize = 1;

/// The last applied mutation of one client.
#[derive(Debug, Clone, Copy)]
struct Slot {
    seq: u64,
    /// The old value a CAS/FADD returned (0 for WRITE).
    old: u64,
    /// For least-recently-used eviction.
    used: u64,
}

/// Duplicate detection for mutations, keyed by client id (see the module docs). One
/// per server process; gatherd shares one between its tcp and udp servers.
#[derive(Debug, Default)]
pub struct Dedup {
    inner: Mutex<DedupInner>,
}

#[derive(Debug, Default)]
struct DedupInner {
    slots: HashMap<u64, Slot>,
    clock: u64,
    /// Datagram mutations belong to another table (the XDP program's) since
    /// [`Dedup::hand_over_datagrams`]: they are dropped here, never applied.
    datagrams_handed_over: bool,
}

enum Seen {
    New,
    Replay(u64),
    Refuse(Status),
}

impl DedupInner {
    fn classify(&mut self, client: u64, seq: u64, retry: bool) -> Seen {
        self.clock += 1;
        let now = self.clock;
        match self.slots.get_mut(&client) {
            Some(s) => {
                s.used = now;
                match seq.wrapping_sub(s.seq) as i64 {
                    0 => Seen::Replay(s.old),
                    d if d < 0 => Seen::Refuse(Status::Stale),
                    _ => Seen::New,
                }
            }
            None if retry => Seen::Refuse(Status::Unknown),
            None => Seen::New,
        }
    }

    fn record(&mut self, client: u64, seq: u64, old: u64) {
        if !self.slots.contains_key(&client) && self.slots.len() >= DEDUP_CLIENTS_MAX {
            if let Some(victim) = self
                .slots
                .iter()
                .min_by_key(|(_, s)| s.used)
                .map(|(k, _)| *k)
            {
                self.slots.remove(&victim);
            }
        }
        let used = self.clock;
        self.slots.insert(client, Slot { seq, old, used });
    }
}

impl Dedup {
    pub fn new() -> Self {
        Self::default()
    }

    /// Hand datagram mutations over to another table (gatherd: the XDP program's
    /// dedup map, which it seeds with the returned `(client, seq, old)` entries before
    /// attaching the program). From the return on, a WRITE/CAS/FETCH-ADD of a client
    /// with an id that arrives in a datagram is not applied here and gets no reply
    /// (counted `Stale`); its retry is answered by the table's new owner, which knows
    /// every mutation applied here, so none is applied twice across the handover. The
    /// lock the operations hold makes the cut exact: a mutation in progress when this
    /// is called is recorded in the returned entries. Mutations over streams (tcp) and
    /// anonymous ones are unaffected.
    pub fn hand_over_datagrams(&self) -> Vec<(u64, u64, u64)> {
        let mut d = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        d.datagrams_handed_over = true;
        d.slots.iter().map(|(&c, s)| (c, s.seq, s.old)).collect()
    }

    /// Undo [`Dedup::hand_over_datagrams`] (the new owner never took over: gatherd's
    /// XDP attach failed). Nothing was applied in between, so this table is complete.
    pub fn take_back_datagrams(&self) {
        let mut d = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        d.datagrams_handed_over = false;
    }

    /// Clients currently remembered.
    pub fn clients(&self) -> usize {
        self.inner.lock().map(|g| g.slots.len()).unwrap_or(0)
    }
}

/// Per-op and per-status counters, shown by gatherd's metrics.
#[derive(Default)]
pub struct OpCounters {
    /// Indexed by op code (1..=4); 0 counts unknown ops.
    pub ops: [AtomicU64; 5],
    /// Indexed by `Status as u8`.
    pub status: [AtomicU64; STATUS_COUNT],
}

impl OpCounters {
    pub fn count(&self, op: u8, st: Status) {
        let i = if (1..=4).contains(&op) {
            op as usize
        } else {
            0
        };
        self.ops[i].fetch_add(1, Ordering::Relaxed);
        self.status[st as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Report `{prefix}_ops_total{op}` and `{prefix}_replies_total{status}` to the
    /// scrape's encoder.
    pub fn render(&self, prefix: &str, enc: &mut farside_admin::Encoder) {
        let ops = format!("{prefix}_ops_total");
        for (i, name) in ["unknown", "read", "write", "compare_swap", "fetch_add"]
            .iter()
            .enumerate()
        {
            enc.counter(
                &ops,
                "Remote-memory requests by operation.",
                &[("op", name)],
                self.ops[i].load(Ordering::Relaxed),
            );
        }
        let replies = format!("{prefix}_replies_total");
        for st in Status::ALL {
            enc.counter(
                &replies,
                "Remote-memory replies by status.",
                &[("status", st.name())],
                self.status[st as usize].load(Ordering::Relaxed),
            );
        }
    }
}

/// Map a refusal of `farside_auth::rights::check` to its wire status.
pub fn rights_status(r: rights::Refusal) -> Status {
    match r {
        rights::Refusal::WrongRegion { .. } => Status::NoRegion,
        rights::Refusal::BadLength { .. } => Status::BadLength,
        rights::Refusal::Unaligned { .. } => Status::Unaligned,
        rights::Refusal::OutOfBounds { .. } => Status::OutOfBounds,
        rights::Refusal::AgentOwned { .. } => Status::Protected,
        rights::Refusal::NotGranted { .. } | rights::Refusal::DeltaTooLarge { .. } => {
            Status::ReadOnly
        }
    }
}

/// Check a request's covered bytes (`req`, after the envelope) against rules 3 to 7
/// under `rights`; `datagram_bytes`: the whole datagram's length (rule 7), `None` for
/// streams. On success returns the decoded header, whose offset and len are then within
/// `region_bytes`.
pub fn check(
    req: &[u8],
    rights: &Rights,
    region_bytes: usize,
    datagram_bytes: Option<usize>,
) -> Result<ReqHeader, (u8, u64, Status)> {
    let (h, op, access) = decode_access(req)?;
    let fail = |s| (h.op, h.seq, s);
    rights::check(rights, h.region, access, h.offset as u64, h.len as u64)
        .map_err(|r| fail(rights_status(r)))?;
    let len = h.len as usize;
    if op == Op::Write && len > OP_BYTES_MAX {
        return Err(fail(Status::BadLength));
    }
    if h.offset as usize + len > region_bytes {
        return Err(fail(Status::OutOfBounds));
    }
    if let Some(n) = datagram_bytes {
        if op == Op::Read && n < ENVELOPE_BYTES + REP_HEADER_BYTES + len {
            return Err(fail(Status::Unpadded));
        }
    }
    Ok(h)
}

/// Rules 3 and 4 of [`check`] and [`check_arena`]: the header decoded, its op known and
/// its payload present; returns the header, the op and the access the rights are asked
/// for (a FETCH-ADD's with its delta).
fn decode_access(req: &[u8]) -> Result<(ReqHeader, Op, Access), (u8, u64, Status)> {
    let h = ReqHeader::decode(req).map_err(|s| (0, 0, s))?;
    let fail = |s| (h.op, h.seq, s);
    let op = Op::from_u8(h.op).ok_or(fail(Status::BadOp))?;
    if req.len() < REQ_HEADER_BYTES + op.req_payload_len(h.len).min(OP_BYTES_MAX) {
        return Err(fail(Status::Malformed));
    }
    let access = match op {
        Op::Read => Access::Read,
        Op::Write => Access::Write,
        Op::CompareSwap => Access::CompareSwap,
        Op::FetchAdd => Access::FetchAdd {
            delta: u64_at(req, REQ_HEADER_BYTES),
        },
    };
    Ok((h, op, access))
}

/// Where a chunked region (an object arena) lies for [`check_arena`]: its chunk size,
/// the declared bound on chunks and the chunks the node's map has.
#[derive(Debug, Clone, Copy)]
pub struct Chunked {
    pub chunk_bytes: usize,
    pub chunks_max: usize,
    pub chunks: usize,
}

/// The XDP responder's rule for a one-chunk request to a chunked region (an object
/// arena; no user-space server holds one, so this is the reference the packet tests
/// compare the program with): the covered bytes `req` after the envelope, under
/// `rights`, in a datagram of `datagram_bytes`. Rules 3 to 5 as [`check`], then
/// `farside_auth::rights::check_chunks` (region, READ or WRITE, len, alignment, one
/// chunk, READ grant or a WRITE chunk grant), then a READ request shorter than its reply
/// → `Unpadded`, then a chunk beyond the node's map → `OutOfBounds`.
pub fn check_arena(
    req: &[u8],
    rights: &Rights,
    arena: Chunked,
    datagram_bytes: usize,
) -> Result<ReqHeader, (u8, u64, Status)> {
    let (h, op, access) = decode_access(req)?;
    let fail = |s| (h.op, h.seq, s);
    rights::check_chunks(
        rights,
        h.region,
        access,
        h.offset as u64,
        h.len as u64,
        arena.chunk_bytes as u64,
        arena.chunks_max as u64,
    )
    .map_err(|r| fail(rights_status(r)))?;
    let len = h.len as usize;
    if op == Op::Read && datagram_bytes < ENVELOPE_BYTES + REP_HEADER_BYTES + len {
        return Err(fail(Status::Unpadded));
    }
    if h.offset as usize / arena.chunk_bytes >= arena.chunks {
        return Err(fail(Status::OutOfBounds));
    }
    Ok(h)
}

/// True if a server must not answer a request that got `status`: requests that are not
/// authentic or are copies (`BadKey`, `Replayed`: the sender may not be a client at all,
/// and an answer would amplify), malformed ones, and stale duplicates (the client has
/// moved on).
pub fn silent(status: Status) -> bool {
    matches!(
        status,
        Status::BadKey | Status::Malformed | Status::Stale | Status::Replayed
    )
}

/// Execute one request (envelope, header, payload, padding) on `words` and write the
/// whole sealed reply into `reply` (cleared first). Returns the status. `BadKey` and
/// `Replayed` leave `reply` empty; datagram servers send nothing for any [`silent`]
/// status.
/// `datagram`: the request came in a datagram (rule 7).
pub fn execute(
    words: &[AtomicU64],
    keys: &ServerKeys,
    counters: &OpCounters,
    dedup: &Dedup,
    datagram: bool,
    req: &[u8],
    reply: &mut Vec<u8>,
) -> Status {
    reply.clear();
    let acc = match keys.receive(req) {
        Ok(a) => a,
        Err(st) => {
            // The op byte is not authentic: counted as unknown.
            counters.count(0, st);
            return st;
        }
    };
    let covered = &req[ENVELOPE_BYTES..ENVELOPE_BYTES + acc.len];
    reply.resize(ENVELOPE_BYTES, 0);
    let st = execute_covered(
        words,
        &acc.rights,
        acc.envelope.sender,
        counters,
        dedup,
        datagram.then_some(req.len()),
        covered,
        reply,
    );
    seal_reply_prepared(reply, &acc.reply_key, &acc.envelope);
    st
}

/// A same-host operation (shm): no envelope, [`crate::auth::local_rights`], `client`
/// for duplicate detection. `reply` gets the reply header and payload only.
pub fn execute_local(
    words: &[AtomicU64],
    rights: &Rights,
    client: u64,
    counters: &OpCounters,
    dedup: &Dedup,
    req: &[u8],
    reply: &mut Vec<u8>,
) -> Status {
    reply.clear();
    execute_covered(words, rights, client, counters, dedup, None, req, reply)
}

/// Rules 3 to 7, duplicate detection and the operation; appends the reply header and
/// payload to `reply`.
#[allow(clippy::too_many_arguments)]
fn execute_covered(
    words: &[AtomicU64],
    rights: &Rights,
    client: u64,
    counters: &OpCounters,
    dedup: &Dedup,
    datagram_bytes: Option<usize>,
    req: &[u8],
    reply: &mut Vec<u8>,
) -> Status {
    let refuse = |reply: &mut Vec<u8>, op: u8, seq: u64, st: Status| {
        RepHeader {
            op,
            status: st,
            seq,
            len: 0,
        }
        .encode(reply);
        counters.count(op, st);
        st
    };
    let h = match check(req, rights, words.len() * 8, datagram_bytes) {
        Ok(h) => h,
        Err((op, seq, st)) => return refuse(reply, op, seq, st),
    };
    let op = Op::from_u8(h.op).expect("checked");
    if op != Op::Read {
        // Held across the operation: decide, apply and record as one step.
        let mut d = dedup.inner.lock().unwrap_or_else(|p| p.into_inner());
        if datagram_bytes.is_some() && d.datagrams_handed_over {
            // Another table owns datagram mutations (`Dedup::hand_over_datagrams`).
            return refuse(reply, h.op, h.seq, Status::Stale);
        }
        match d.classify(client, h.seq, h.flags & FLAG_RETRY != 0) {
            Seen::Refuse(st) => return refuse(reply, h.op, h.seq, st),
            Seen::Replay(old) => {
                let len = if op == Op::Write { 0 } else { 8 };
                RepHeader {
                    op: h.op,
                    status: Status::Ok,
                    seq: h.seq,
                    len,
                }
                .encode(reply);
                if len == 8 {
                    reply.extend_from_slice(&old.to_le_bytes());
                }
                counters.count(h.op, Status::Ok);
                return Status::Ok;
            }
            Seen::New => {
                let start = reply.len();
                let st = apply(words, &h, op, req, reply);
                let old = if op == Op::Write {
                    0
                } else {
                    u64_at(reply, start + REP_HEADER_BYTES)
                };
                d.record(client, h.seq, old);
                counters.count(h.op, st);
                return st;
            }
        }
    }
    let st = apply(words, &h, op, req, reply);
    counters.count(h.op, st);
    st
}

/// Apply a checked request and encode its reply.
fn apply(words: &[AtomicU64], h: &ReqHeader, op: Op, req: &[u8], reply: &mut Vec<u8>) -> Status {
    let first = h.offset as usize / 8;
    let payload = &req[REQ_HEADER_BYTES..];
    let len = match op {
        Op::Read => h.len,
        Op::Write => 0,
        Op::CompareSwap | Op::FetchAdd => 8,
    };
    RepHeader {
        op: h.op,
        status: Status::Ok,
        seq: h.seq,
        len,
    }
    .encode(reply);
    match op {
        Op::Read => {
            let start = reply.len();
            reply.resize(start + h.len as usize, 0);
            copy_words_out(words, first, &mut reply[start..]);
        }
        Op::Write => copy_words_in(words, first, &payload[..h.len as usize]),
        Op::CompareSwap => {
            let (expected, new) = (u64_at(payload, 0), u64_at(payload, 8));
            let old = match words[first].compare_exchange(
                expected,
                new,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(v) | Err(v) => v,
            };
            reply.extend_from_slice(&old.to_le_bytes());
        }
        Op::FetchAdd => {
            let old = words[first].fetch_add(u64_at(payload, 0), Ordering::AcqRel);
            reply.extend_from_slice(&old.to_le_bytes());
        }
    }
    Status::Ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{seal_request, ClientKey, LabKeyset};
    use farside_auth::mac::{self, Domain};
    use farside_region::layout::*;
    use farside_region::{HeapWords, Words};

    /// A client: its key, sender id and envelope seqs.
    struct C {
        key: ClientKey,
        sender: u64,
        seq: u64,
    }

    impl C {
        fn new(key: ClientKey, sender: u64) -> C {
            C {
                key,
                sender,
                seq: 0,
            }
        }

        /// A sealed request: op, op seq, retry flag, offset, len, payload, padded for READs.
        fn req(
            &mut self,
            op: u8,
            op_seq: u64,
            retry: bool,
            offset: u32,
            len: u32,
            payload: &[u8],
        ) -> Vec<u8> {
            let mut covered = Vec::new();
            encode_request(
                &mut covered,
                &ReqHeader {
                    op,
                    flags: if retry { FLAG_RETRY } else { 0 },
                    seq: op_seq,
                    region: 0,
                    offset,
                    len,
                },
                payload,
            );
            self.seq += 1;
            let mut b = Vec::new();
            seal_request(&mut b, &self.key, self.sender, self.seq, &covered);
            if op == 1 {
                b.resize(
                    b.len()
                        .max(ENVELOPE_BYTES + REP_HEADER_BYTES + len as usize),
                    0,
                );
            }
            b
        }
    }

    struct Server {
        mem: HeapWords,
        keys: std::sync::Arc<ServerKeys>,
        c: OpCounters,
        d: Dedup,
    }

    impl Server {
        fn new(set: &LabKeyset) -> Server {
            let mem = HeapWords::new(512);
            mem.words()[W_ROLE_WANTED].store(5, Ordering::Relaxed);
            Server {
                mem,
                keys: set.server(),
                c: OpCounters::default(),
                d: Dedup::new(),
            }
        }

        /// (status, reply's covered bytes if it was sealed)
        fn run(&self, datagram: bool, req: &[u8]) -> (Status, Vec<u8>) {
            let mut reply = Vec::new();
            let st = execute(
                self.mem.words(),
                &self.keys,
                &self.c,
                &self.d,
                datagram,
                req,
                &mut reply,
            );
            (st, reply)
        }

        fn word(&self, w: usize) -> u64 {
            self.mem.words()[w].load(Ordering::Relaxed)
        }
    }

    fn cas(expected: u64, new: u64) -> Vec<u8> {
        let mut p = expected.to_le_bytes().to_vec();
        p.extend_from_slice(&new.to_le_bytes());
        p
    }

    fn w(word: usize) -> u32 {
        (word * 8) as u32
    }

    /// Every refusal, table-driven: (what, request, expected status). Memory untouched.
    #[test]
    fn every_refusal_leaves_memory_untouched() {
        let set = LabKeyset::generate();
        let s = Server::new(&set);
        let (mut rd, mut bal) = (C::new(set.reader, 1), C::new(set.balancer, 2));
        let forged = {
            let mut r = bal.req(3, 1, false, w(W_ROLE_WANTED), 8, &cas(5, 9));
            r[0] ^= 1;
            r
        };
        let other_key = {
            let mut c = C::new(LabKeyset::generate().balancer, 2);
            c.req(3, 1, false, w(W_ROLE_WANTED), 8, &cas(5, 9))
        };
        let cases: Vec<(&str, Vec<u8>, Status)> = vec![
            (
                "truncated envelope",
                rd.req(1, 1, false, 0, 8, &[])[..20].to_vec(),
                Status::BadKey,
            ),
            ("forged tag", forged, Status::BadKey),
            ("a key of another keyring", other_key, Status::BadKey),
            ("unknown op", rd.req(9, 1, false, 0, 8, &[]), Status::BadOp),
            (
                "zero-length read",
                rd.req(1, 1, false, 0, 0, &[]),
                Status::BadLength,
            ),
            (
                "oversized read",
                rd.req(1, 1, false, 0, 8192, &[]),
                Status::OutOfBounds,
            ),
            (
                "atomic len 16",
                bal.req(4, 1, false, w(W_SHARED_COUNTER), 16, &[0; 8]),
                Status::BadLength,
            ),
            (
                "unaligned offset",
                rd.req(1, 1, false, 4, 8, &[]),
                Status::Unaligned,
            ),
            (
                "unaligned len",
                rd.req(1, 1, false, 0, 12, &[]),
                Status::Unaligned,
            ),
            (
                "out of bounds",
                rd.req(1, 1, false, 4088, 16, &[]),
                Status::OutOfBounds,
            ),
            (
                "cas with a reader's key",
                rd.req(3, 1, false, w(W_ROLE_WANTED), 8, &cas(5, 9)),
                Status::ReadOnly,
            ),
            (
                "write with a reader's key",
                rd.req(2, 1, false, w(W_ROLE_WANTED), 8, &[1; 8]),
                Status::ReadOnly,
            ),
            (
                "a balancer's write",
                bal.req(2, 1, false, w(W_ROLE_WANTED), 8, &[1; 8]),
                Status::ReadOnly,
            ),
            (
                "a balancer's cas of the served role",
                bal.req(3, 1, false, w(W_ROLE_SERVED), 8, &cas(0, 9)),
                Status::Protected,
            ),
            (
                "a balancer's fetch-add by 2",
                bal.req(4, 1, false, w(W_SHARED_COUNTER), 8, &2u64.to_le_bytes()),
                Status::ReadOnly,
            ),
            (
                "a balancer's fetch-add by -1",
                bal.req(4, 1, false, w(W_SHARED_COUNTER), 8, &u64::MAX.to_le_bytes()),
                Status::ReadOnly,
            ),
            (
                "cas payload truncated",
                bal.req(3, 1, false, w(W_ROLE_WANTED), 8, &[0; 8]),
                Status::Malformed,
            ),
            (
                "cas on the load record",
                bal.req(3, 1, false, w(13), 8, &cas(0, 1)),
                Status::Protected,
            ),
            (
                "fetch-add in scratch",
                bal.req(4, 1, false, w(64), 8, &1u64.to_le_bytes()),
                Status::ReadOnly,
            ),
            (
                "unpadded datagram read",
                {
                    let mut r = rd.req(1, 1, false, 0, 64, &[]);
                    r.truncate(ENVELOPE_BYTES + REQ_HEADER_BYTES);
                    r
                },
                Status::Unpadded,
            ),
        ];
        let before: Vec<u64> = (0..512).map(|i| s.word(i)).collect();
        for (what, r, want) in cases {
            let (got, reply) = s.run(true, &r);
            assert_eq!(got, want, "{what}");
            if silent(want) {
                continue;
            }
            let o = mac::open(Domain::RmemReply, &reply, |_| {
                None::<farside_auth::siphash::SipKey>
            });
            assert!(o.is_err(), "replies open only under the key");
            let h = RepHeader::decode(&reply[ENVELOPE_BYTES..]).unwrap();
            assert_eq!((h.status, h.len), (want, 0), "{what}");
        }
        let after: Vec<u64> = (0..512).map(|i| s.word(i)).collect();
        assert_eq!(before, after, "a refusal touched memory");
        // Nothing was answered to the forgeries: counted as unknown ops with BadKey.
        assert_eq!(
            s.c.status[Status::BadKey as usize].load(Ordering::Relaxed),
            3
        );
    }

    #[test]
    fn a_replayed_request_is_refused_and_not_applied_again() {
        let set = LabKeyset::generate();
        let s = Server::new(&set);
        let mut bal = C::new(set.balancer, 2);
        let r = bal.req(4, 1, false, w(W_SHARED_COUNTER), 8, &1u64.to_le_bytes());
        assert_eq!(s.run(true, &r).0, Status::Ok);
        assert_eq!(s.run(true, &r).0, Status::Replayed);
        assert_eq!(s.run(false, &r).0, Status::Replayed);
        let c = bal.req(3, 2, false, w(W_ROLE_WANTED), 8, &cas(5, 6));
        assert_eq!(s.run(true, &c).0, Status::Ok);
        s.mem.words()[W_ROLE_WANTED].store(5, Ordering::Relaxed);
        assert_eq!(s.run(true, &c).0, Status::Replayed, "a replayed CAS");
        assert_eq!((s.word(W_SHARED_COUNTER), s.word(W_ROLE_WANTED)), (1, 5));
    }

    #[test]
    fn replies_are_sealed_under_the_requests_key_and_bound_to_its_envelope() {
        let set = LabKeyset::generate();
        let s = Server::new(&set);
        let mut rd = C::new(set.reader, 77);
        let r = rd.req(1, 9, false, w(W_ROLE_WANTED), 8, &[]);
        let (st, reply) = s.run(true, &r);
        assert_eq!(st, Status::Ok);
        assert!(reply.len() <= r.len(), "no reflection");
        let body = crate::auth::open_reply(&reply, &set.reader, 77, rd.seq..=rd.seq).unwrap();
        let h = RepHeader::decode(body).unwrap();
        assert_eq!((h.seq, h.len, u64_at(body, REP_HEADER_BYTES)), (9, 8, 5));
        // Another sender, another attempt, another key: not this client's reply.
        use crate::auth::ReplyRefusal;
        assert_eq!(
            crate::auth::open_reply(&reply, &set.reader, 78, rd.seq..=rd.seq),
            Err(ReplyRefusal::NotOurs)
        );
        assert_eq!(
            crate::auth::open_reply(&reply, &set.reader, 77, 0..=rd.seq - 1),
            Err(ReplyRefusal::NotOurs)
        );
        assert_eq!(
            crate::auth::open_reply(&reply, &set.balancer, 77, rd.seq..=rd.seq),
            Err(ReplyRefusal::NotAuthentic)
        );
        // The request itself never opens as a reply (domains differ).
        assert_eq!(
            crate::auth::open_reply(&r, &set.reader, 77, rd.seq..=rd.seq),
            Err(ReplyRefusal::NotAuthentic)
        );
    }

    #[test]
    fn a_rotated_key_verifies_beside_the_current_one_until_revoked() {
        let set = LabKeyset::generate();
        let s = Server::new(&set);
        let new = LabKeyset::generate().balancer;
        let new = ClientKey::new(farside_auth::mac::KeyId(12), *new.key());
        s.keys
            .install(
                "balancer",
                new.id,
                *new.key(),
                crate::auth::Role::Balancer.rights(),
            )
            .unwrap();
        let (mut old_c, mut new_c) = (C::new(set.balancer, 5), C::new(new, 6));
        let one = 1u64.to_le_bytes();
        assert_eq!(
            s.run(true, &old_c.req(4, 1, false, w(W_SHARED_COUNTER), 8, &one))
                .0,
            Status::Ok
        );
        assert_eq!(
            s.run(true, &new_c.req(4, 1, false, w(W_SHARED_COUNTER), 8, &one))
                .0,
            Status::Ok
        );
        assert!(s.keys.revoke(set.balancer.id));
        assert_eq!(
            s.run(true, &old_c.req(4, 2, false, w(W_SHARED_COUNTER), 8, &one))
                .0,
            Status::BadKey
        );
        assert_eq!(
            s.run(true, &new_c.req(4, 2, false, w(W_SHARED_COUNTER), 8, &one))
                .0,
            Status::Ok
        );
        assert_eq!(s.word(W_SHARED_COUNTER), 3);
    }

    #[test]
    fn atomics_return_the_old_value() {
        let set = LabKeyset::generate();
        let s = Server::new(&set);
        let mut bal = C::new(set.balancer, 3);
        let old = |r: &(Status, Vec<u8>)| u64_at(&r.1, ENVELOPE_BYTES + REP_HEADER_BYTES);
        let r = s.run(false, &bal.req(3, 1, false, w(W_SITE_LOCK), 8, &cas(0, 42)));
        assert_eq!((r.0, old(&r)), (Status::Ok, 0));
        // The same expected value again fails and reports the current value.
        let r = s.run(false, &bal.req(3, 2, false, w(W_SITE_LOCK), 8, &cas(0, 43)));
        assert_eq!((r.0, old(&r)), (Status::Ok, 42));
        let r = s.run(
            false,
            &bal.req(4, 3, false, w(W_SHARED_COUNTER), 8, &1u64.to_le_bytes()),
        );
        assert_eq!((r.0, old(&r)), (Status::Ok, 0));
        let r = s.run(false, &bal.req(1, 4, false, w(W_SITE_LOCK), 16, &[]));
        assert_eq!(RepHeader::decode(&r.1[ENVELOPE_BYTES..]).unwrap().len, 16);
        assert_eq!(old(&r), 42);
        assert_eq!(s.c.ops[3].load(Ordering::Relaxed), 2);
    }

    #[test]
    fn mutations_apply_once_and_retries_replay_the_first_answer() {
        let set = LabKeyset::generate();
        let s = Server::new(&set);
        let one = 1u64.to_le_bytes();
        let at = w(W_SHARED_COUNTER);
        let run = |c: &mut C, op_seq: u64, retry: bool| {
            let r = s.run(true, &c.req(4, op_seq, retry, at, 8, &one));
            let old = (r.1.len() == ENVELOPE_BYTES + REP_HEADER_BYTES + 8)
                .then(|| u64_at(&r.1, ENVELOPE_BYTES + REP_HEADER_BYTES));
            (r.0, old)
        };
        let mut a = C::new(set.balancer, 9);
        assert_eq!(run(&mut a, 100, false), (Status::Ok, Some(0)));
        // The reply was lost: the retry (a new envelope) gets the same answer.
        assert_eq!(run(&mut a, 100, true), (Status::Ok, Some(0)));
        assert_eq!(run(&mut a, 101, false), (Status::Ok, Some(1)));
        // A delayed duplicate of op 100 (resealed by its sender) after 101: not applied.
        assert_eq!(run(&mut a, 100, false).0, Status::Stale);
        // Another client is independent; a retry from a client never seen is refused.
        let mut b = C::new(set.balancer, 7);
        assert_eq!(run(&mut b, 5, false), (Status::Ok, Some(2)));
        let mut c = C::new(set.balancer, 8);
        assert_eq!(run(&mut c, 5, true).0, Status::Unknown);
        assert_eq!(s.word(W_SHARED_COUNTER), 3);
        assert_eq!(s.d.clients(), 2, "clients 9 and 7");
    }

    #[test]
    fn handed_over_datagram_mutations_are_dropped_unapplied_until_taken_back() {
        let set = LabKeyset::generate();
        let s = Server::new(&set);
        let one = 1u64.to_le_bytes();
        let at = w(W_SHARED_COUNTER);
        let mut a = C::new(set.balancer, 9);
        assert_eq!(
            s.run(true, &a.req(4, 100, false, at, 8, &one)).0,
            Status::Ok
        );
        assert_eq!(s.d.hand_over_datagrams(), vec![(9, 100, 0)]);
        let st = s.run(true, &a.req(4, 101, false, at, 8, &one)).0;
        assert!(silent(st), "{st:?}");
        let mut b = C::new(set.balancer, 7);
        assert_eq!(s.run(false, &b.req(4, 1, false, at, 8, &one)).0, Status::Ok);
        assert_eq!(s.run(true, &b.req(1, 2, false, at, 8, &[])).0, Status::Ok);
        assert_eq!(s.word(W_SHARED_COUNTER), 2);
        s.d.take_back_datagrams();
        assert_eq!(s.run(true, &a.req(4, 101, true, at, 8, &one)).0, Status::Ok);
        assert_eq!(s.word(W_SHARED_COUNTER), 3);
    }

    #[test]
    fn the_client_table_is_bounded_and_forgets_the_least_recently_used() {
        let set = LabKeyset::generate();
        let s = Server::new(&set);
        let one = 1u64.to_le_bytes();
        let at = w(W_SHARED_COUNTER);
        for client in 1..=DEDUP_CLIENTS_MAX as u64 + 1 {
            let mut c = C::new(set.balancer, client);
            s.run(true, &c.req(4, 1, false, at, 8, &one));
        }
        assert_eq!(s.d.clients(), DEDUP_CLIENTS_MAX);
        let mut c = C::new(set.balancer, 1);
        c.seq = 10;
        assert_eq!(
            s.run(true, &c.req(4, 1, true, at, 8, &one)).0,
            Status::Unknown
        );
    }

    #[test]
    fn local_operations_follow_the_local_rights() {
        let mem = HeapWords::new(512);
        let (c, d) = (OpCounters::default(), Dedup::new());
        let rights = crate::auth::local_rights();
        let mut reply = Vec::new();
        let mut req = |op: u8, word: usize, payload: &[u8]| {
            let mut b = Vec::new();
            encode_request(
                &mut b,
                &ReqHeader {
                    op,
                    seq: 1,
                    region: 0,
                    offset: w(word),
                    len: 8,
                    ..Default::default()
                },
                payload,
            );
            execute_local(mem.words(), &rights, 1, &c, &d, &b, &mut reply)
        };
        assert_eq!(req(2, W_ROLE_SERVED, &[1; 8]), Status::Protected);
        assert_eq!(req(2, W_SEQ_HEAD, &[1; 8]), Status::Protected);
        assert_eq!(req(1, W_SEQ_HEAD, &[]), Status::Ok);
    }

    /// Bounded fuzz (runs in CI): random and mutated requests never panic `execute`,
    /// never change an agent-owned word, and no datagram is answered with a reply longer
    /// than itself (no reflection).
    #[test]
    fn random_and_mutated_requests_never_escape_their_bounds() {
        // Requests; a fraction of a second.
        const CASES: u32 = 20_000;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let set = LabKeyset::generate();
        let s = Server::new(&set);
        for (i, wd) in s.mem.words().iter().enumerate() {
            wd.store(i as u64 * 3 + 1, Ordering::Relaxed);
        }
        let owned = |m: &HeapWords| -> Vec<u64> {
            (0..512)
                .filter(|&i| rights::AGENT_OWNED.iter().any(|o| o.covers(i, i + 1)))
                .map(|i| m.words()[i].load(Ordering::Relaxed))
                .collect()
        };
        let before = owned(&s.mem);
        let mut bal = C::new(set.balancer, 3);
        for n in 0..CASES {
            let op = (rnd() % 5) as u8;
            let len = [0, 8, 16, 12, (rnd() % 5000) as u32][(rnd() % 5) as usize];
            let offset = (rnd() % 4200) as u32 & !(if rnd() % 2 == 0 { 7 } else { 0 });
            let payload: Vec<u8> = (0..rnd() % 40).map(|_| rnd() as u8).collect();
            let mut r = bal.req(op, n as u64, rnd() % 2 == 0, offset, len, &payload);
            if rnd() % 4 == 0 {
                let i = (rnd() % r.len() as u64) as usize;
                r[i] = rnd() as u8;
            }
            let (st, reply) = s.run(true, &r);
            if !silent(st) {
                assert!(
                    reply.len() <= r.len().max(ENVELOPE_BYTES + REP_HEADER_BYTES + 8),
                    "{}-byte reply to {} bytes",
                    reply.len(),
                    r.len()
                );
                let h = RepHeader::decode(&reply[ENVELOPE_BYTES..]).unwrap();
                assert_eq!(h.status, st);
            }
        }
        assert_eq!(owned(&s.mem), before, "an agent-owned word changed");
    }
}
