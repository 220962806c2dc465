//! RDMAP: the RDMA Protocol (RFC 5040), the operations carried in DDP segments.
//!
//! The RDMAP control byte (RFC 5040 §4.2) is `RV (2) | rsvd (2) | Opcode (4)` with
//! `RV = 1`. Opcodes and where they travel (RFC 5040 §4.2, §4.3, §5):
//!
//! | opcode | message | DDP | QN |
//! |---:|---|---|---:|
//! | 0 | RDMA Write | tagged: sink STag/TO | |
//! | 1 | RDMA Read Request | untagged, 28 B body: sink STag, sink TO, size, source STag, source TO (§4.4) | 1 |
//! | 2 | RDMA Read Response | tagged: the Request's sink STag/TO | |
//! | 3 / 5 | Send / Send with Solicited Event | untagged | 0 |
//! | 4 / 6 | Send with Invalidate (/ and SE): RsvdULP holds the STag to invalidate | untagged | 0 |
//! | 7 | Terminate: control word, then the terminated DDP/RDMAP headers (§4.8) | untagged | 2 |
//!
//! [`parse`] checks what can be checked without state, in Linux siw's order: DDP
//! version, RDMAP version, opcode (known, and tagged exactly when it must be), QN, and
//! the fixed-size bodies. MSN, MO, STags and credits need the queue pair's state and are
//! checked in [`crate::qp`].

use crate::ddp::{self, Placement};
use crate::term::TermCode;

/// RDMAP version (RFC 5040 §4.2).
pub const RDMAP_VERSION: u8 = 1;
/// Body of a Read Request (RFC 5040 §4.4).
pub const READ_REQUEST_LEN: usize = 28;
/// The Terminate Control word.
pub const TERM_CTRL_LEN: usize = 4;
/// Untagged queues (RFC 5040 §5.1, siw `rdmap_untagged_qn`).
pub const QN_SEND: u32 = 0;
pub const QN_READ_REQUEST: u32 = 1;
pub const QN_TERMINATE: u32 = 2;
/// Number of untagged queues.
pub const QN_COUNT: usize = 3;

/// RDMAP opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    Write = 0,
    ReadRequest = 1,
    ReadResponse = 2,
    Send = 3,
    SendInv = 4,
    SendSe = 5,
    SendSeInv = 6,
    Terminate = 7,
}

impl Opcode {
    pub fn from_u8(v: u8) -> Option<Opcode> {
        Some(match v {
            0 => Opcode::Write,
            1 => Opcode::ReadRequest,
            2 => Opcode::ReadResponse,
            3 => Opcode::Send,
            4 => Opcode::SendInv,
            5 => Opcode::SendSe,
            6 => Opcode::SendSeInv,
            7 => Opcode::Terminate,
            _ => return None,
        })
    }

    /// The decoder's `kind`.
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Write => "write",
            Opcode::ReadRequest => "read_request",
            Opcode::ReadResponse => "read_response",
            Opcode::Send => "send",
            Opcode::SendInv => "send_inv",
            Opcode::SendSe => "send_se",
            Opcode::SendSeInv => "send_se_inv",
            Opcode::Terminate => "terminate",
        }
    }

    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }

    pub fn is_send(self) -> bool {
        matches!(
            self,
            Opcode::Send | Opcode::SendInv | Opcode::SendSe | Opcode::SendSeInv
        )
    }

    /// The untagged queue the opcode travels on.
    pub fn qn(self) -> Option<u32> {
        match self {
            Opcode::ReadRequest => Some(QN_READ_REQUEST),
            Opcode::Terminate => Some(QN_TERMINATE),
            o if o.is_send() => Some(QN_SEND),
            _ => None,
        }
    }

    /// The control byte with RV = 1.
    pub fn ctrl_byte(self) -> u8 {
        (RDMAP_VERSION << 6) | self as u8
    }
}

/// Body of an RDMA Read Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub size: u32,
    pub source_stag: u32,
    pub source_to: u64,
}

impl ReadRequest {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.sink_stag.to_be_bytes());
        out.extend_from_slice(&self.sink_to.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.source_stag.to_be_bytes());
        out.extend_from_slice(&self.source_to.to_be_bytes());
    }

    fn decode(b: &[u8]) -> ReadRequest {
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4"));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8"));
        ReadRequest {
            sink_stag: u32_at(0),
            sink_to: u64_at(4),
            size: u32_at(12),
            source_stag: u32_at(16),
            source_to: u64_at(20),
        }
    }
}

/// The Terminate Control word (RFC 5040 §4.8) and what follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminate<'a> {
    pub code: TermCode,
    /// `M`: the DDP Segment Length field is valid.
    pub m: bool,
    /// `D`: the terminated DDP header is included.
    pub d: bool,
    /// `R`: the terminated RDMAP header is included.
    pub r: bool,
    /// The 13 reserved bits.
    pub reserved: u16,
    /// DDP Segment Length (2 B) and the terminated headers, as received.
    pub attached: &'a [u8],
}

impl Terminate<'_> {
    /// DDP Segment Length of the terminated segment, if `M` says it is valid.
    pub fn ddp_segment_length(&self) -> Option<u16> {
        if self.m {
            self.attached
                .get(..2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
        } else {
            None
        }
    }

    pub fn encode_ctrl(&self) -> [u8; 4] {
        let w: u32 = (u32::from(self.code.to_bits()) << 16)
            | (if self.m { 0x8000 } else { 0 })
            | (if self.d { 0x4000 } else { 0 })
            | (if self.r { 0x2000 } else { 0 })
            | u32::from(self.reserved & 0x1fff);
        w.to_be_bytes()
    }
}

/// What an RDMAP message carries beyond its headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body<'a> {
    /// Write, Read Response and Sends: the data.
    Data(&'a [u8]),
    ReadRequest(ReadRequest),
    Terminate(Terminate<'a>),
}

/// One parsed DDP segment with its RDMAP header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    pub opcode: Opcode,
    pub ddp: ddp::Control,
    pub rdmap_ctrl: u8,
    pub placement: Placement,
    /// Untagged RsvdULP: the Invalidate STag of a Send with Invalidate (else 0).
    pub inval_stag: u32,
    pub body: Body<'a>,
}

impl Message<'_> {
    /// Payload bytes: data, or the body after the headers.
    pub fn payload_len(&self) -> usize {
        match &self.body {
            Body::Data(d) => d.len(),
            Body::ReadRequest(_) => READ_REQUEST_LEN,
            Body::Terminate(t) => TERM_CTRL_LEN + t.attached.len(),
        }
    }
}

/// Why a ULPDU was refused: the Terminate that answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub term: TermCode,
    pub why: &'static str,
}

fn refuse(term: TermCode, why: &'static str) -> Refusal {
    Refusal { term, why }
}

/// Parse one ULPDU (a DDP segment) into an RDMAP message; see the module doc for what
/// is checked.
pub fn parse(ulpdu: &[u8]) -> Result<Message<'_>, Refusal> {
    let seg = ddp::parse(ulpdu).map_err(|r| refuse(r.term, r.why))?;
    let rv = seg.rdmap_ctrl >> 6;
    if rv != RDMAP_VERSION {
        return Err(refuse(TermCode::RDMAP_VERSION, "invalid RDMAP version"));
    }
    let Some(opcode) = Opcode::from_u8(seg.rdmap_ctrl & 0x0f) else {
        return Err(refuse(TermCode::RDMAP_OPCODE, "unknown RDMAP opcode"));
    };
    if opcode.is_tagged() != seg.ctrl.tagged {
        return Err(refuse(
            TermCode::RDMAP_OPCODE,
            "opcode in the wrong kind of DDP segment",
        ));
    }
    if let (Some(want), Placement::Untagged { qn, .. }) = (opcode.qn(), seg.placement) {
        if qn != want {
            return Err(refuse(
                TermCode::DDP_UT_INVALID_QN,
                "invalid QN for the opcode",
            ));
        }
    }
    let body = match opcode {
        Opcode::ReadRequest => {
            if seg.payload.len() != READ_REQUEST_LEN {
                return Err(refuse(
                    TermCode::DDP_CATASTROPHIC,
                    "Read Request body is not 28 B",
                ));
            }
            Body::ReadRequest(ReadRequest::decode(seg.payload))
        }
        Opcode::Terminate => {
            if seg.payload.len() < TERM_CTRL_LEN {
                return Err(refuse(
                    TermCode::DDP_CATASTROPHIC,
                    "Terminate shorter than 4 B",
                ));
            }
            let w = u32::from_be_bytes(seg.payload[..4].try_into().expect("4"));
            Body::Terminate(Terminate {
                code: TermCode {
                    layer: (w >> 28) as u8,
                    etype: ((w >> 24) & 0xf) as u8,
                    ecode: ((w >> 16) & 0xff) as u8,
                },
                m: w & 0x8000 != 0,
                d: w & 0x4000 != 0,
                r: w & 0x2000 != 0,
                reserved: (w & 0x1fff) as u16,
                attached: &seg.payload[4..],
            })
        }
        _ => Body::Data(seg.payload),
    };
    Ok(Message {
        opcode,
        ddp: seg.ctrl,
        rdmap_ctrl: seg.rdmap_ctrl,
        placement: seg.placement,
        inval_stag: if matches!(opcode, Opcode::SendInv | Opcode::SendSeInv) {
            seg.rsvd_ulp
        } else {
            0
        },
        body,
    })
}

/// Build one ULPDU: the DDP header for `placement` (with `last`), the RDMAP control
/// byte of `opcode`, `inval_stag` in an untagged RsvdULP, then `payload`.
pub fn encode_ulpdu(
    opcode: Opcode,
    last: bool,
    placement: Placement,
    inval_stag: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(ddp::UNTAGGED_HDR_LEN + payload.len());
    ddp::encode_header(last, opcode.ctrl_byte(), inval_stag, placement, &mut out);
    out.extend_from_slice(payload);
    out
}

/// The ULPDU of a Terminate with `code`, MSN `msn`, and `terminated` (DDP Segment
/// Length plus the headers of the refused segment, or empty). Flags follow siw's
/// `siw_send_terminate`: DDP errors carry the DDP header (`M`, `D`) unless the version
/// made the layout unknown; RDMAP remote-protection errors carry the RDMAP header too
/// (`R`); RDMAP catastrophic, MPA, version and opcode errors carry nothing.
pub fn encode_terminate(code: TermCode, msn: u32, terminated: &[u8]) -> Vec<u8> {
    let (m, d, r) = if terminated.is_empty() {
        // Nothing readable to attach (the segment was shorter than its header).
        (false, false, false)
    } else {
        terminate_flags(code)
    };
    let attached: &[u8] = if m { terminated } else { &[] };
    let t = Terminate {
        code,
        m,
        d,
        r,
        reserved: 0,
        attached,
    };
    let mut payload = t.encode_ctrl().to_vec();
    payload.extend_from_slice(attached);
    encode_ulpdu(
        Opcode::Terminate,
        true,
        Placement::Untagged {
            qn: QN_TERMINATE,
            msn,
            mo: 0,
        },
        0,
        &payload,
    )
}

/// The `M`, `D`, `R` flags siw sets for a Terminate with `code`.
pub fn terminate_flags(code: TermCode) -> (bool, bool, bool) {
    let no_layout = code == TermCode::DDP_T_VERSION
        || code == TermCode::DDP_UT_VERSION
        || code == TermCode::RDMAP_VERSION
        || code == TermCode::RDMAP_OPCODE;
    match code.layer {
        _ if no_layout => (false, false, false),
        1 => (true, true, false),
        0 if code.etype == 1 => (true, true, true),
        0 if code.etype == 2 => (true, true, false),
        _ => (false, false, false),
    }
}

/// The bytes a Terminate attaches for the refused `ulpdu`: its DDP Segment Length
/// (the payload length after the headers) and its headers, DDP only or with the
/// RDMAP header as [`terminate_flags`] says.
pub fn terminated_headers(code: TermCode, ulpdu: &[u8]) -> Vec<u8> {
    let (m, _, r) = terminate_flags(code);
    if !m {
        return Vec::new();
    }
    let Some(seg) = ddp::parse_lenient(ulpdu) else {
        return Vec::new();
    };
    let ddp_len = if seg.ctrl.tagged {
        ddp::TAGGED_HDR_LEN
    } else {
        ddp::UNTAGGED_HDR_LEN
    };
    let rdmap_extra = if r && (seg.rdmap_ctrl & 0x0f) == Opcode::ReadRequest as u8 {
        READ_REQUEST_LEN.min(ulpdu.len() - ddp_len)
    } else {
        0
    };
    let hdr_len = ddp_len + rdmap_extra;
    let seg_len = (ulpdu.len() - hdr_len) as u16;
    let mut out = seg_len.to_be_bytes().to_vec();
    out.extend_from_slice(&ulpdu[..hdr_len]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminate_round_trips() {
        let u = encode_terminate(TermCode::DDP_UT_VERSION, 1, &[]);
        assert_eq!(u.len(), ddp::UNTAGGED_HDR_LEN + 4);
        let m = parse(&u).unwrap();
        let Body::Terminate(t) = m.body else { panic!() };
        assert_eq!(t.code, TermCode::DDP_UT_VERSION);
        assert!(!t.m && !t.d && !t.r);
        assert_eq!(
            m.placement,
            Placement::Untagged {
                qn: 2,
                msn: 1,
                mo: 0
            }
        );
    }

    #[test]
    fn opcode_in_wrong_segment_kind_is_refused() {
        let u = encode_ulpdu(
            Opcode::Send,
            true,
            Placement::Tagged { stag: 1, to: 0 },
            0,
            b"x",
        );
        assert_eq!(parse(&u).unwrap_err().term, TermCode::RDMAP_OPCODE);
    }

    #[test]
    fn rdmap_version_and_opcode_are_checked() {
        let mut u = encode_ulpdu(
            Opcode::Send,
            true,
            Placement::Untagged {
                qn: 0,
                msn: 1,
                mo: 0,
            },
            0,
            b"",
        );
        u[1] = 0x03; // RV 0
        assert_eq!(parse(&u).unwrap_err().term, TermCode::RDMAP_VERSION);
        u[1] = 0x48; // opcode 8
        assert_eq!(parse(&u).unwrap_err().term, TermCode::RDMAP_OPCODE);
    }
}
