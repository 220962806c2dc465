//! The request/reply format shared by the `tcp` and `udp` transports (and the XDP
//! responder in `bpf/`). Little-endian, fixed headers. Every request and every reply is
//! an authenticated message of crate `farside_auth` (`mac`): a 32-byte envelope, then
//! the header and payload the envelope's tag covers.
//!
//! ```text
//! request = envelope (domain rmem_request) + REQ_HEADER_BYTES (32) + payload [+ padding]
//!   envelope: 0 u64 tag  8 u32 key id  12 u32 len (header + payload)  16 u64 sender  24 u64 seq
//!   0  u32 magic "FSRM"     4 u8 version   5 u8 op   6 u16 flags (FLAG_RETRY)
//!   8  u64 op seq (the operation's; a retry repeats it, the envelope's seq is new)
//!  16  u32 region id       20 u32 offset (bytes, 8-aligned)
//!  24  u32 len (bytes)     28 u32 reserved (0)
//!  32  payload: WRITE: len bytes; CAS: expected u64, new u64; FADD: delta u64
//! reply = envelope (domain rmem_reply) + REP_HEADER_BYTES (24) + payload
//!   envelope: the request's key id, sender and seq (the reply is bound to the request
//!   it answers), len of header + payload, tag under the same key
//!   0  u32 magic "FSRP"     4 u8 version   5 u8 op   6 u8 status  7 u8 reserved
//!   8  u64 op seq          16 u32 payload len        20 u32 reserved
//!  24  payload: READ: len bytes; CAS/FADD: old value u64; WRITE: none
//! ```
//!
//! The client is the envelope's `sender` (random per client): servers apply every
//! WRITE, CAS and FETCH-ADD at most once per (sender, op seq) and replay the recorded
//! reply to a retry (see `ops::Dedup`); the envelope's `seq` is new for every datagram,
//! so a copy of a datagram is refused by the replay window (`farside_auth::replay`)
//! before anything is looked at. Over udp a READ request must be at least as long as its
//! reply (pad it with zeros after the covered bytes; servers ignore them), so no server
//! answers a small datagram with a large one.

/// `b"FSRM"` little-endian.
pub const REQ_MAGIC: u32 = u32::from_le_bytes(*b"FSRM");
/// `b"FSRP"` little-endian.
pub const REP_MAGIC: u32 = u32::from_le_bytes(*b"FSRP");
/// Version 2 added the client id and the retry flag; version 3 the authenticated
/// envelope (which names the key and the client, so the header no longer does).
pub const VERSION: u8 = 3;
/// The envelope in front of every request and reply (`farside_auth::mac`).
pub const ENVELOPE_BYTES: usize = farside_auth::mac::ENVELOPE_BYTES;
pub const REQ_HEADER_BYTES: usize = 32;
/// Request flag: this datagram repeats an earlier attempt of the same (client, op seq).
pub const FLAG_RETRY: u16 = 1;
pub const REP_HEADER_BYTES: usize = 24;
/// Largest READ or WRITE in one operation: one region.
pub const OP_BYTES_MAX: usize = farside_region::REGION_BYTES;
/// Largest request on the wire (envelope included).
pub const REQ_BYTES_MAX: usize = ENVELOPE_BYTES + REQ_HEADER_BYTES + OP_BYTES_MAX;
/// Largest reply on the wire (envelope included).
pub const REP_BYTES_MAX: usize = ENVELOPE_BYTES + REP_HEADER_BYTES + OP_BYTES_MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Read = 1,
    Write = 2,
    CompareSwap = 3,
    FetchAdd = 4,
}

impl Op {
    pub fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::CompareSwap,
            4 => Op::FetchAdd,
            _ => return None,
        })
    }

    /// Payload bytes a request of this op carries after the header.
    pub fn req_payload_len(self, len: u32) -> usize {
        match self {
            Op::Read => 0,
            Op::Write => len as usize,
            Op::CompareSwap => 16,
            Op::FetchAdd => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::CompareSwap => "compare_swap",
            Op::FetchAdd => "fetch_add",
        }
    }
}

/// Outcome of one operation, as carried in a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    /// Unknown key id, or a tag that does not verify: never answered (no server knows
    /// whom it would answer), counted.
    BadKey = 1,
    /// Offset + len beyond the region.
    OutOfBounds = 2,
    /// Offset or len not a multiple of 8.
    Unaligned = 3,
    /// Unknown op code.
    BadOp = 4,
    /// The key's rights do not grant this operation on these words
    /// (`farside_auth::rights`: not granted, or a FETCH-ADD delta over the grant's).
    ReadOnly = 5,
    /// len over `OP_BYTES_MAX`, zero, or not 8 for an atomic.
    BadLength = 6,
    /// Truncated, wrong magic or version.
    Malformed = 7,
    /// Unknown region id.
    NoRegion = 8,
    /// WRITE/CAS/FADD of a word only the node's agent writes (header, load record,
    /// served role, epoch, error: `farside_auth::rights::AGENT_OWNED`).
    Protected = 9,
    /// A retry whose first attempt the server has no record of (never received, or its
    /// record was evicted): not applied now, and the first attempt's fate is unknown.
    Unknown = 10,
    /// Older than the client's last applied operation: a delayed duplicate, dropped
    /// (datagram servers send no reply).
    Stale = 11,
    /// A datagram READ shorter than its reply (pad it): refused so that no server
    /// answers a small request with a reply many times its size.
    Unpadded = 12,
    /// An authentic request whose envelope (key id, sender, seq) was accepted before, or
    /// is too old for the replay window: a copy, never acted on nor answered.
    Replayed = 13,
}

impl Status {
    pub fn from_u8(v: u8) -> Status {
        match v {
            0 => Status::Ok,
            1 => Status::BadKey,
            2 => Status::OutOfBounds,
            3 => Status::Unaligned,
            4 => Status::BadOp,
            5 => Status::ReadOnly,
            6 => Status::BadLength,
            8 => Status::NoRegion,
            9 => Status::Protected,
            10 => Status::Unknown,
            11 => Status::Stale,
            12 => Status::Unpadded,
            13 => Status::Replayed,
            _ => Status::Malformed,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::BadKey => "bad_key",
            Status::OutOfBounds => "out_of_bounds",
            Status::Unaligned => "unaligned",
            Status::BadOp => "bad_op",
            Status::ReadOnly => "read_only",
            Status::BadLength => "bad_length",
            Status::Malformed => "malformed",
            Status::NoRegion => "no_region",
            Status::Protected => "protected",
            Status::Unknown => "unknown_outcome",
            Status::Stale => "stale_duplicate",
            Status::Unpadded => "unpadded",
            Status::Replayed => "replayed",
        }
    }

    pub const ALL: [Status; STATUS_COUNT] = [
        Status::Ok,
        Status::BadKey,
        Status::OutOfBounds,
        Status::Unaligned,
        Status::BadOp,
        Status::ReadOnly,
        Status::BadLength,
        Status::Malformed,
        Status::NoRegion,
        Status::Protected,
        Status::Unknown,
        Status::Stale,
        Status::Unpadded,
        Status::Replayed,
    ];
}

/// Number of status codes (counter slots per status).
pub const STATUS_COUNT: usize = 14;

/// A decoded request header (the bytes after the envelope). The payload follows in
/// the same buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReqHeader {
    pub op: u8,
    /// `FLAG_*` bits.
    pub flags: u16,
    /// The operation's sequence number (a retry repeats it).
    pub seq: u64,
    pub region: u32,
    pub offset: u32,
    pub len: u32,
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

pub fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

impl ReqHeader {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&REQ_MAGIC.to_le_bytes());
        out.push(VERSION);
        out.push(self.op);
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.region.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
    }

    /// Decode the fixed header. `Err(Malformed)` on short input, bad magic or version.
    pub fn decode(b: &[u8]) -> Result<ReqHeader, Status> {
        if b.len() < REQ_HEADER_BYTES || u32_at(b, 0) != REQ_MAGIC || b[4] != VERSION {
            return Err(Status::Malformed);
        }
        Ok(ReqHeader {
            op: b[5],
            flags: u16::from_le_bytes([b[6], b[7]]),
            seq: u64_at(b, 8),
            region: u32_at(b, 16),
            offset: u32_at(b, 20),
            len: u32_at(b, 24),
        })
    }
}

/// A decoded reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepHeader {
    pub op: u8,
    pub status: Status,
    pub seq: u64,
    pub len: u32,
}

impl RepHeader {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&REP_MAGIC.to_le_bytes());
        out.push(VERSION);
        out.push(self.op);
        out.push(self.status as u8);
        out.push(0);
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
    }

    pub fn decode(b: &[u8]) -> Result<RepHeader, Status> {
        if b.len() < REP_HEADER_BYTES || u32_at(b, 0) != REP_MAGIC || b[4] != VERSION {
            return Err(Status::Malformed);
        }
        Ok(RepHeader {
            op: b[5],
            status: Status::from_u8(b[6]),
            seq: u64_at(b, 8),
            len: u32_at(b, 16),
        })
    }
}

/// Encode a request's covered bytes (header + payload) into `out` (cleared first); the
/// envelope goes in front of them (`crate::auth::seal_request`).
pub fn encode_request(out: &mut Vec<u8>, h: &ReqHeader, payload: &[u8]) {
    out.clear();
    h.encode(out);
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_have_documented_sizes() {
        let h = ReqHeader {
            op: 3,
            flags: FLAG_RETRY,
            seq: 9,
            region: 0,
            offset: 256,
            len: 8,
        };
        let mut b = Vec::new();
        h.encode(&mut b);
        assert_eq!(b.len(), REQ_HEADER_BYTES);
        assert_eq!(ReqHeader::decode(&b), Ok(h));
        let r = RepHeader {
            op: 1,
            status: Status::ReadOnly,
            seq: 9,
            len: 0,
        };
        let mut b = Vec::new();
        r.encode(&mut b);
        assert_eq!(b.len(), REP_HEADER_BYTES);
        assert_eq!(RepHeader::decode(&b), Ok(r));
    }

    #[test]
    fn truncated_or_foreign_headers_are_malformed() {
        assert_eq!(ReqHeader::decode(&[0u8; 10]), Err(Status::Malformed));
        assert_eq!(ReqHeader::decode(&[0u8; 32]), Err(Status::Malformed));
    }

    /// Bounded fuzz (runs in CI): random and mutated headers never panic either decoder;
    /// what decodes re-encodes to the same bytes (nothing is silently reinterpreted).
    #[test]
    fn decoders_survive_random_and_mutated_bytes() {
        // Inputs per decoder; milliseconds.
        const CASES: u32 = 50_000;
        let mut x = 0x853c_49e6_748f_ea9bu64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut valid = Vec::new();
        ReqHeader {
            op: 3,
            seq: 1,
            len: 8,
            ..Default::default()
        }
        .encode(&mut valid);
        for n in 0..CASES {
            let b: Vec<u8> = if n % 2 == 0 {
                (0..rnd() % 64).map(|_| rnd() as u8).collect()
            } else {
                let mut m = valid.clone();
                let i = (rnd() % m.len() as u64) as usize;
                m[i] = rnd() as u8;
                m
            };
            if let Ok(h) = ReqHeader::decode(&b) {
                let mut again = Vec::new();
                h.encode(&mut again);
                // Bytes 28..32 are reserved (ignored on decode, zero on encode).
                assert_eq!(again[..28], b[..28]);
            }
            if let Ok(h) = RepHeader::decode(&b) {
                assert!(Status::ALL.contains(&h.status));
                if h.status as u8 == b[6] {
                    let mut again = Vec::new();
                    h.encode(&mut again);
                    assert_eq!(again[..7], b[..7]);
                    assert_eq!(again[8..20], b[8..20]);
                }
            }
        }
    }
}
