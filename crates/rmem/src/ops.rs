//! The semantics of the four operations on a region, in one place. The shm transport,
//! the tcp server and the udp fallback server all call [`execute`]; the XDP responder in
//! `bpf/` implements the same checks in the same order, and the packet tests compare the
//! two.
//!
//! Checks, in order (the first that fails decides the status; memory is untouched):
//! 1. header well formed (magic, version, whole payload present) → `Malformed`
//! 2. access key known → `BadKey`
//! 3. op known → `BadOp`
//! 4. region id known (only region 0 today) → `NoRegion`
//! 5. len: READ/WRITE 1..=OP_BYTES_MAX, atomics exactly 8 → `BadLength`
//! 6. offset and len multiples of 8 → `Unaligned`
//! 7. offset + len within the region → `OutOfBounds`
//! 8. WRITE/CAS/FADD need a read-write key → `ReadOnly`
//! 9. WRITE/CAS/FADD only within the control words (`layout::WRITABLE_*`) → `Protected`
//! 10. datagram servers only: a READ request shorter than its reply → `Unpadded`
//!
//! Then, for WRITE/CAS/FADD of a client with an id (not 0), duplicate detection
//! ([`Dedup`]): every mutation is applied at most once, and a retry of the last one is
//! answered with the recorded reply, so the client learns the one true outcome.
//! - seq equal to the client's last applied seq → replay its reply (`Ok`, same old value)
//! - seq older → `Stale`: a delayed duplicate, not applied (datagram servers stay silent)
//! - a retry (FLAG_RETRY) of a client with no record → `Unknown`, not applied
//! - otherwise apply and record
//!
//! READs are never recorded (they are idempotent and a reply carries the current words).

use crate::wire::*;
use farside_region::layout::{WRITABLE_END_WORD, WRITABLE_FIRST_WORD};
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

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perm {
    ReadOnly,
    ReadWrite,
}

/// Most access keys one server holds.
pub const KEYS_MAX: usize = 8;

/// The keys a server accepts (at most `KEYS_MAX`).
#[derive(Debug, Clone, Default)]
pub struct AccessKeys(Vec<(u64, Perm)>);

impl AccessKeys {
    pub fn new() -> Self {
        AccessKeys(Vec::new())
    }

    pub fn with(mut self, key: u64, perm: Perm) -> Self {
        assert!(self.0.len() < KEYS_MAX, "at most {KEYS_MAX} access keys");
        self.0.retain(|(k, _)| *k != key);
        self.0.push((key, perm));
        self
    }

    pub fn perm(&self, key: u64) -> Option<Perm> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, p)| *p)
    }

    pub fn iter(&self) -> impl Iterator<Item = &(u64, Perm)> {
        self.0.iter()
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
    fn count(&self, op: u8, st: Status) {
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

/// Check a request against the rules above (`datagram`: rule 10 applies). On success
/// returns the decoded header, whose offset and len are then within `region_bytes`.
pub fn check(
    req: &[u8],
    keys: &AccessKeys,
    region_bytes: usize,
    datagram: bool,
) -> Result<ReqHeader, (u8, u64, Status)> {
    let h = ReqHeader::decode(req).map_err(|s| (0, 0, s))?;
    let fail = |s| (h.op, h.seq, s);
    let perm = keys.perm(h.key).ok_or(fail(Status::BadKey))?;
    let op = Op::from_u8(h.op).ok_or(fail(Status::BadOp))?;
    if req.len() < REQ_HEADER_BYTES + op.req_payload_len(h.len).min(OP_BYTES_MAX) {
        return Err(fail(Status::Malformed));
    }
    if h.region != 0 {
        return Err(fail(Status::NoRegion));
    }
    let len = h.len as usize;
    let len_ok = match op {
        Op::Read | Op::Write => (1..=OP_BYTES_MAX).contains(&len),
        Op::CompareSwap | Op::FetchAdd => len == 8,
    };
    if !len_ok {
        return Err(fail(Status::BadLength));
    }
    if !h.offset.is_multiple_of(8) || !len.is_multiple_of(8) {
        return Err(fail(Status::Unaligned));
    }
    if h.offset as usize + len > region_bytes {
        return Err(fail(Status::OutOfBounds));
    }
    if op != Op::Read && perm != Perm::ReadWrite {
        return Err(fail(Status::ReadOnly));
    }
    let first = h.offset as usize / 8;
    if op != Op::Read && (first < WRITABLE_FIRST_WORD || first + len / 8 > WRITABLE_END_WORD) {
        return Err(fail(Status::Protected));
    }
    if datagram && op == Op::Read && req.len() < REP_HEADER_BYTES + len {
        return Err(fail(Status::Unpadded));
    }
    Ok(h)
}

/// True if a datagram server must not answer a request that got `status`: bad keys and
/// malformed requests (the sender may not be a client at all) and stale duplicates (the
/// client has moved on).
pub fn silent(status: Status) -> bool {
    matches!(status, Status::BadKey | Status::Malformed | Status::Stale)
}

/// Execute one request on `words` and write the whole reply into `reply` (cleared
/// first). Returns the status. For the [`silent`] statuses the reply is still built;
/// datagram servers drop it instead of sending it. `datagram`: the request came in a
/// datagram (rule 10).
pub fn execute(
    words: &[AtomicU64],
    keys: &AccessKeys,
    counters: &OpCounters,
    dedup: &Dedup,
    datagram: bool,
    req: &[u8],
    reply: &mut Vec<u8>,
) -> Status {
    reply.clear();
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
    let h = match check(req, keys, words.len() * 8, datagram) {
        Ok(h) => h,
        Err((op, seq, st)) => return refuse(reply, op, seq, st),
    };
    let op = Op::from_u8(h.op).expect("checked");
    if op != Op::Read && h.client != 0 {
        // Held across the operation: decide, apply and record as one step.
        let mut d = dedup.inner.lock().unwrap_or_else(|p| p.into_inner());
        if datagram && d.datagrams_handed_over {
            // Another table owns datagram mutations (`Dedup::hand_over_datagrams`).
            return refuse(reply, h.op, h.seq, Status::Stale);
        }
        match d.classify(h.client, h.seq, h.flags & FLAG_RETRY != 0) {
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
                let st = apply(words, &h, op, req, reply);
                let old = if op == Op::Write {
                    0
                } else {
                    u64_at(reply, REP_HEADER_BYTES)
                };
                d.record(h.client, h.seq, old);
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
    use farside_region::{HeapWords, Words};

    const RO: u64 = 0x1111;
    const RW: u64 = 0x2222;

    fn req(op: u8, key: u64, offset: u32, len: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        encode_request(
            &mut b,
            &ReqHeader {
                op,
                seq: 77,
                key,
                offset,
                len,
                ..Default::default()
            },
            payload,
        );
        b
    }

    /// Every refusal, table-driven: (what, request, expected status). Memory must be untouched.
    #[test]
    fn every_refusal_leaves_memory_untouched() {
        let mem = HeapWords::new(512);
        mem.words()[1].store(5, Ordering::Relaxed);
        let keys = AccessKeys::new()
            .with(RO, Perm::ReadOnly)
            .with(RW, Perm::ReadWrite);
        let c = OpCounters::default();
        let mut cas = 5u64.to_le_bytes().to_vec();
        cas.extend_from_slice(&9u64.to_le_bytes());
        let cases: Vec<(&str, Vec<u8>, Status)> = vec![
            (
                "truncated header",
                req(1, RO, 0, 8, &[])[..20].to_vec(),
                Status::Malformed,
            ),
            ("wrong key", req(1, 0x9999, 0, 8, &[]), Status::BadKey),
            ("unknown op", req(9, RO, 0, 8, &[]), Status::BadOp),
            ("zero-length read", req(1, RO, 0, 0, &[]), Status::BadLength),
            (
                "oversized read",
                req(1, RO, 0, 8192, &[]),
                Status::BadLength,
            ),
            (
                "atomic len 16",
                req(4, RW, 8, 16, &[0; 8]),
                Status::BadLength,
            ),
            ("unaligned offset", req(1, RO, 4, 8, &[]), Status::Unaligned),
            ("unaligned len", req(1, RO, 0, 12, &[]), Status::Unaligned),
            (
                "out of bounds",
                req(1, RO, 4090 / 8 * 8, 16, &[]),
                Status::OutOfBounds,
            ),
            (
                "cas with read-only key",
                req(3, RO, 8, 8, &cas),
                Status::ReadOnly,
            ),
            (
                "write with read-only key",
                req(2, RO, 8, 8, &[1; 8]),
                Status::ReadOnly,
            ),
            (
                "cas payload truncated",
                req(3, RW, 8, 8, &cas[..8]),
                Status::Malformed,
            ),
            (
                "write payload truncated",
                req(2, RW, 8, 16, &[1; 8]),
                Status::Malformed,
            ),
            (
                "write over the header",
                req(2, RW, 8, 8, &[1; 8]),
                Status::Protected,
            ),
            (
                "cas on the load record",
                req(3, RW, 8 * 13, 8, &cas),
                Status::Protected,
            ),
            (
                "fetch-add in scratch",
                req(4, RW, 8 * 64, 8, &[1; 8]),
                Status::Protected,
            ),
            (
                "write running past the control words",
                req(2, RW, 8 * 63, 16, &[1; 16]),
                Status::Protected,
            ),
            (
                "unpadded datagram read",
                req(1, RO, 0, 64, &[]),
                Status::Unpadded,
            ),
        ];
        let mut reply = Vec::new();
        for (what, r, want) in cases {
            let got = execute(mem.words(), &keys, &c, &Dedup::new(), true, &r, &mut reply);
            assert_eq!(got, want, "{what}");
            let rep = RepHeader::decode(&reply).unwrap();
            assert_eq!((rep.status, rep.len), (want, 0), "{what}");
            assert_eq!(
                mem.words()[1].load(Ordering::Relaxed),
                5,
                "{what} touched memory"
            );
        }
    }

    #[test]
    fn atomics_return_the_old_value() {
        let mem = HeapWords::new(512);
        let keys = AccessKeys::new().with(RW, Perm::ReadWrite);
        let c = OpCounters::default();
        let mut reply = Vec::new();
        let mut cas = 0u64.to_le_bytes().to_vec();
        cas.extend_from_slice(&42u64.to_le_bytes());
        assert_eq!(
            execute(
                mem.words(),
                &keys,
                &c,
                &Dedup::new(),
                false,
                &req(3, RW, 256, 8, &cas),
                &mut reply
            ),
            Status::Ok
        );
        assert_eq!(u64_at(&reply, REP_HEADER_BYTES), 0);
        // Second CAS with the same expected value fails and reports the current value.
        execute(
            mem.words(),
            &keys,
            &c,
            &Dedup::new(),
            false,
            &req(3, RW, 256, 8, &cas),
            &mut reply,
        );
        assert_eq!(u64_at(&reply, REP_HEADER_BYTES), 42);
        execute(
            mem.words(),
            &keys,
            &c,
            &Dedup::new(),
            false,
            &req(4, RW, 256, 8, &3u64.to_le_bytes()),
            &mut reply,
        );
        assert_eq!(u64_at(&reply, REP_HEADER_BYTES), 42);
        assert_eq!(mem.words()[32].load(Ordering::Relaxed), 45);
        execute(
            mem.words(),
            &keys,
            &c,
            &Dedup::new(),
            false,
            &req(1, RW, 256, 16, &[]),
            &mut reply,
        );
        assert_eq!(RepHeader::decode(&reply).unwrap().len, 16);
        assert_eq!(u64_at(&reply, REP_HEADER_BYTES), 45);
        assert_eq!(c.ops[3].load(Ordering::Relaxed), 2);
    }

    fn client_req(op: u8, client: u64, seq: u64, retry: bool, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        encode_request(
            &mut b,
            &ReqHeader {
                op,
                flags: if retry { FLAG_RETRY } else { 0 },
                seq,
                key: RW,
                offset: 256,
                len: 8,
                client,
                ..Default::default()
            },
            payload,
        );
        b
    }

    #[test]
    fn mutations_apply_once_and_retries_replay_the_first_answer() {
        let mem = HeapWords::new(512);
        let keys = AccessKeys::new().with(RW, Perm::ReadWrite);
        let (c, d) = (OpCounters::default(), Dedup::new());
        let mut reply = Vec::new();
        let mut run = |r: &[u8]| {
            let st = execute(mem.words(), &keys, &c, &d, true, r, &mut reply);
            let old = (reply.len() == REP_HEADER_BYTES + 8).then(|| u64_at(&reply, 24));
            (st, old)
        };
        let one = 1u64.to_le_bytes();
        assert_eq!(
            run(&client_req(4, 9, 100, false, &one)),
            (Status::Ok, Some(0))
        );
        // The reply was lost: the retry gets the same answer, not a second add.
        assert_eq!(
            run(&client_req(4, 9, 100, true, &one)),
            (Status::Ok, Some(0))
        );
        assert_eq!(
            run(&client_req(4, 9, 101, false, &one)),
            (Status::Ok, Some(1))
        );
        // A delayed duplicate of seq 100 arrives after 101: dropped, not applied.
        assert_eq!(run(&client_req(4, 9, 100, false, &one)).0, Status::Stale);
        // Another client is independent; a retry from a client never seen is refused.
        assert_eq!(
            run(&client_req(4, 7, 5, false, &one)),
            (Status::Ok, Some(2))
        );
        assert_eq!(run(&client_req(4, 8, 5, true, &one)).0, Status::Unknown);
        // Anonymous clients (id 0) are not tracked.
        assert_eq!(
            run(&client_req(4, 0, 5, false, &one)),
            (Status::Ok, Some(3))
        );
        assert_eq!(
            run(&client_req(4, 0, 5, false, &one)),
            (Status::Ok, Some(4))
        );
        assert_eq!(mem.words()[32].load(Ordering::Relaxed), 5);
        // Sequence numbers wrap: u64::MAX then 0 is "newer".
        assert_eq!(run(&client_req(4, 11, u64::MAX, false, &one)).0, Status::Ok);
        assert_eq!(run(&client_req(4, 11, 0, false, &one)).0, Status::Ok);
        assert_eq!(d.clients(), 3, "clients 9, 7 and 11");
    }

    #[test]
    fn handed_over_datagram_mutations_are_dropped_unapplied_until_taken_back() {
        let mem = HeapWords::new(512);
        let keys = AccessKeys::new().with(RW, Perm::ReadWrite);
        let (c, d) = (OpCounters::default(), Dedup::new());
        let mut reply = Vec::new();
        let one = 1u64.to_le_bytes();
        let mut run =
            |datagram: bool, r: &[u8]| execute(mem.words(), &keys, &c, &d, datagram, r, &mut reply);
        assert_eq!(run(true, &client_req(4, 9, 100, false, &one)), Status::Ok);
        let entries = d.hand_over_datagrams();
        assert_eq!(
            entries,
            vec![(9, 100, 0)],
            "the applied mutation and its old value"
        );
        // Datagram mutations: dropped (a silent status), memory untouched.
        let st = run(true, &client_req(4, 9, 101, false, &one));
        assert!(silent(st), "{st:?}");
        // Streams and reads are unaffected.
        assert_eq!(run(false, &client_req(4, 7, 1, false, &one)), Status::Ok);
        assert_eq!(run(true, &req(1, RW, 256, 8, &[])), Status::Ok);
        assert_eq!(mem.words()[32].load(Ordering::Relaxed), 2);
        d.take_back_datagrams();
        assert_eq!(run(true, &client_req(4, 9, 101, true, &one)), Status::Ok);
        assert_eq!(mem.words()[32].load(Ordering::Relaxed), 3);
    }

    #[test]
    fn the_client_table_is_bounded_and_forgets_the_least_recently_used() {
        let mem = HeapWords::new(512);
        let keys = AccessKeys::new().with(RW, Perm::ReadWrite);
        let (c, d) = (OpCounters::default(), Dedup::new());
        let mut reply = Vec::new();
        let one = 1u64.to_le_bytes();
        for client in 1..=DEDUP_CLIENTS_MAX as u64 + 1 {
            let r = client_req(4, client, 1, false, &one);
            execute(mem.words(), &keys, &c, &d, true, &r, &mut reply);
        }
        assert_eq!(d.clients(), DEDUP_CLIENTS_MAX);
        // Client 1 was evicted: its retry is refused as unknown rather than applied twice.
        let r = client_req(4, 1, 1, true, &one);
        assert_eq!(
            execute(mem.words(), &keys, &c, &d, true, &r, &mut reply),
            Status::Unknown
        );
    }

    /// Bounded fuzz (runs in CI): random and mutated requests never panic `execute`,
    /// never change a word outside the control words, a request it accepts has its
    /// offset and length within the region, and no datagram is answered with a reply
    /// longer than itself (no reflection).
    #[test]
    fn random_and_mutated_requests_never_escape_their_bounds() {
        // Requests per kind; a fraction of a second.
        const CASES: u32 = 50_000;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mem = HeapWords::new(512);
        for (i, w) in mem.words().iter().enumerate() {
            w.store(i as u64 * 3 + 1, Ordering::Relaxed);
        }
        let outside = |m: &HeapWords| -> Vec<u64> {
            m.words()
                .iter()
                .enumerate()
                .filter(|(i, _)| !(WRITABLE_FIRST_WORD..WRITABLE_END_WORD).contains(i))
                .map(|(_, w)| w.load(Ordering::Relaxed))
                .collect()
        };
        let before = outside(&mem);
        let keys = AccessKeys::new()
            .with(RO, Perm::ReadOnly)
            .with(RW, Perm::ReadWrite);
        let (c, d) = (OpCounters::default(), Dedup::new());
        let mut reply = Vec::new();
        let seeds: Vec<Vec<u8>> = vec![
            req(1, RO, 0, 192, &[0; 216]),
            req(2, RW, 256, 16, &[7; 16]),
            req(3, RW, 264, 8, &[1; 16]),
            req(4, RW, 272, 8, &[2; 8]),
        ];
        for n in 0..CASES {
            let r: Vec<u8> = if n % 2 == 0 {
                let len = (rnd() % 300) as usize;
                (0..len).map(|_| rnd() as u8).collect()
            } else {
                let mut m = seeds[(rnd() % 4) as usize].clone();
                for _ in 0..1 + rnd() % 3 {
                    let i = (rnd() % 48) as usize;
                    m[i] = rnd() as u8;
                }
                let keep = m.len() - (rnd() % 8) as usize;
                m.truncate(keep);
                m
            };
            if let Ok(h) = check(&r, &keys, 4096, true) {
                assert!(h.offset as u64 + h.len as u64 <= 4096, "{h:?}");
                assert!(h.offset % 8 == 0 && h.len % 8 == 0 && h.len > 0, "{h:?}");
            }
            let datagram = n % 3 != 0;
            let st = execute(mem.words(), &keys, &c, &d, datagram, &r, &mut reply);
            let rep = RepHeader::decode(&reply).expect("every request gets a reply built");
            assert_eq!(rep.status, st);
            assert_eq!(reply.len(), REP_HEADER_BYTES + rep.len as usize);
            if datagram && !silent(st) {
                assert!(
                    reply.len() <= r.len(),
                    "{}-byte reply to {} bytes",
                    reply.len(),
                    r.len()
                );
            }
        }
        assert_eq!(
            outside(&mem),
            before,
            "a word outside the control area changed"
        );
    }
}
