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

use crate::wire::*;
use farside_region::mem::{copy_words_in, copy_words_out};
use std::sync::atomic::{AtomicU64, Ordering};

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
    pub status: [AtomicU64; 9],
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

    pub fn render(&self, prefix: &str, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(out, "# TYPE {prefix}_ops_total counter");
        for (i, name) in ["unknown", "read", "write", "compare_swap", "fetch_add"]
            .iter()
            .enumerate()
        {
            let v = self.ops[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{prefix}_ops_total{{op=\"{name}\"}} {v}");
        }
        let _ = writeln!(out, "# TYPE {prefix}_replies_total counter");
        for st in Status::ALL {
            let v = self.status[st as usize].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{prefix}_replies_total{{status=\"{}\"}} {v}",
                st.name()
            );
        }
    }
}

/// Check a request against the rules above. On success returns the decoded header.
pub fn check(
    req: &[u8],
    keys: &AccessKeys,
    region_bytes: usize,
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
    Ok(h)
}

/// Execute one request on `words` and write the whole reply into `reply` (cleared
/// first). Returns the status. For `BadKey` the reply is still built; datagram servers
/// drop it instead of sending it.
pub fn execute(
    words: &[AtomicU64],
    keys: &AccessKeys,
    counters: &OpCounters,
    req: &[u8],
    reply: &mut Vec<u8>,
) -> Status {
    reply.clear();
    let h = match check(req, keys, words.len() * 8) {
        Ok(h) => h,
        Err((op, seq, st)) => {
            RepHeader {
                op,
                status: st,
                seq,
                len: 0,
            }
            .encode(reply);
            counters.count(op, st);
            return st;
        }
    };
    let op = Op::from_u8(h.op).expect("checked");
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
    counters.count(h.op, Status::Ok);
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
                region: 0,
                offset,
                len,
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
        ];
        let mut reply = Vec::new();
        for (what, r, want) in cases {
            let got = execute(mem.words(), &keys, &c, &r, &mut reply);
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
            &req(3, RW, 256, 8, &cas),
            &mut reply,
        );
        assert_eq!(u64_at(&reply, REP_HEADER_BYTES), 42);
        execute(
            mem.words(),
            &keys,
            &c,
            &req(4, RW, 256, 8, &3u64.to_le_bytes()),
            &mut reply,
        );
        assert_eq!(u64_at(&reply, REP_HEADER_BYTES), 42);
        assert_eq!(mem.words()[32].load(Ordering::Relaxed), 45);
        execute(
            mem.words(),
            &keys,
            &c,
            &req(1, RW, 256, 16, &[]),
            &mut reply,
        );
        assert_eq!(RepHeader::decode(&reply).unwrap().len, 16);
        assert_eq!(u64_at(&reply, REP_HEADER_BYTES), 45);
        assert_eq!(c.ops[3].load(Ordering::Relaxed), 2);
    }
}
