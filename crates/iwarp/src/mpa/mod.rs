//! MPA: Marker PDU Aligned framing for TCP (RFC 5044), with the enhanced connection
//! set-up of RFC 6581.
//!
//! ## Connection set-up (RFC 5044 §7.1, RFC 6581 §5)
//! After the TCP handshake the initiator sends an MPA Request and the responder answers
//! with an MPA Reply; only then does either side send FPDUs. Both frames are
//!
//! ```text
//! Key (16 B: "MPA ID Req Frame" / "MPA ID Rep Frame")
//! | M C R E . . . . | Rev (8) |  PD_Length (16)  | Private Data (PD_Length B)
//! ```
//! `M` asks for markers, `C` for CRC, `R` (Reply only) rejects, `E` (Rev 2, RFC 6581)
//! says the private data starts with IRD (16) and ORD (16), whose top two bits carry the
//! peer-to-peer ready-to-receive (RTR) flags.
//!
//! Negotiation, as Linux siw (`siw_cm.c`) does it:
//! - **Markers are refused.** A Request with `M=1` is answered with a Reply `R=1, M=0`
//!   and the connection is not established; a Reply with `M=1` fails the set-up. MPA
//!   markers (a 4-byte FPDU pointer every 512 B of the stream) exist for middleboxes that
//!   resegment TCP; no peer we talk to (siw, the RNICs of the seed paper's era in their
//!   default mode) needs them, and refusing keeps the deframer simple and exact.
//! - **CRC** is used if either side asks (RFC 5044 §7.1: "MUST use CRC if the peer
//!   requests it"): the Reply's `C` is the outcome for both directions. An initiator
//!   that asked for CRC fails the set-up on a Reply with `C=0`.
//! - **Revision** 1 and 2 are accepted (siw also takes 0, a pre-RFC draft; we refuse it).
//!   With Rev 2 and `E=1` (enhanced), the responder takes its IRD from the initiator's
//!   ORD and its ORD from the initiator's IRD, each capped by its own limit; the
//!   initiator lowers its ORD to the responder's IRD (always safe) and refuses a
//!   responder ORD above its own IRD with a Terminate "insufficient IRD" (siw's strict
//!   rule). Peer-to-peer RTR: a responder that is asked for it selects a zero-length
//!   RDMA Write RTR and waits for it before sending; we never ask for it as initiator.
//!
//! ## FPDUs (RFC 5044 §4)
//! ```text
//! ULPDU_Length (16) | ULPDU (DDP segment) | pad to 4 B | CRC32c (32)
//! ```
//! The CRC covers length, ULPDU and pad; with `C=0` the field is still sent, as zeros,
//! and not checked. The CRC's wire order is little-endian (see [`crate::crc`]).
//! A sender segments so that each FPDU fits the TCP segment: the maximum ULPDU
//! ([`mulpdu`]) is the EMSS less the MPA header, pad and CRC (RFC 5044 §4.3, no markers).

use std::fmt;

mod fpdu;
mod setup;

pub use fpdu::{encode_fpdu, mulpdu, pad_len, CrcVerdict, Deframer, Fpdu};
pub use setup::{MpaConfig, Negotiated, Setup, SetupStep};

/// The key of an MPA Request.
pub const KEY_REQ: &[u8; 16] = b"MPA ID Req Frame";
/// The key of an MPA Reply.
pub const KEY_REP: &[u8; 16] = b"MPA ID Rep Frame";
/// Key, flags, revision and PD_Length.
pub const RR_HEADER_LEN: usize = 20;
/// Largest private data an MPA Request or Reply may carry (RFC 5044 §7.1: 512 B).
pub const PD_LENGTH_MAX: usize = 512;
/// RFC 6581 IRD/ORD block at the head of the private data.
pub const ENHANCED_PD_LEN: usize = 4;
/// IRD and ORD are 14-bit (RFC 6581 §5): the top two bits are RTR flags.
pub const IRD_ORD_MAX: u16 = 0x3fff;
/// ULPDU_Length field.
pub const HEADER_LEN: usize = 2;
/// CRC field.
pub const CRC_LEN: usize = 4;
/// Smallest ULPDU that can be a DDP segment (the 14 B tagged header). A shorter one
/// is a framing error: nothing that follows can be trusted.
pub const ULPDU_MIN: usize = crate::ddp::TAGGED_HDR_LEN;
/// Largest ULPDU: ULPDU_Length is 16 bits.
pub const ULPDU_MAX: usize = u16::MAX as usize;
/// Largest FPDU on the wire.
pub const FPDU_MAX: usize = HEADER_LEN + ULPDU_MAX + 3 + CRC_LEN;

const FLAG_M: u8 = 0x80;
const FLAG_C: u8 = 0x40;
const FLAG_R: u8 = 0x20;
const FLAG_E: u8 = 0x10;
const IRD_P2P: u16 = 0x8000;
const IRD_ZERO_LEN_RTR: u16 = 0x4000;
const ORD_WRITE_RTR: u16 = 0x8000;
const ORD_READ_RTR: u16 = 0x4000;

/// Why MPA refused a frame or a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MpaError {
    /// The first 16 bytes are not the key expected.
    BadKey { expected: &'static str },
    /// PD_Length above [`PD_LENGTH_MAX`].
    PrivateDataTooLong { pd_length: usize },
    /// Revision other than 1 or 2.
    Revision(u8),
    /// Markers asked for: refused (see the module doc).
    MarkersRefused,
    /// The peer rejected the connection (Reply with `R=1`).
    Rejected,
    /// We asked for CRC and the Reply said `C=0`.
    CrcRefused,
    /// Enhanced set-up with private data shorter than IRD/ORD, or a Rev 2 Reply
    /// without `E` to an enhanced Request.
    Enhanced(&'static str),
    /// RFC 6581: the responder's ORD exceeds our IRD.
    InsufficientIrd { ird: u16, peer_ord: u16 },
    /// Bytes after the Request before the Reply was sent (RFC 5044 §7.1.1: the
    /// initiator waits).
    DataBeforeReply,
    /// An FPDU whose ULPDU_Length is below [`ULPDU_MIN`].
    UlpduTooShort { ulpdu_length: usize },
}

impl MpaError {
    /// The Terminate that reports this error, if one is sent (siw sends none for a
    /// frame it merely rejects or a connection it refuses).
    pub fn term_code(&self) -> Option<crate::term::TermCode> {
        use crate::term::TermCode;
        match self {
            MpaError::BadKey { .. } => Some(TermCode::MPA_INVALID_REQ_RESP),
            MpaError::InsufficientIrd { .. } => Some(TermCode::MPA_INSUFFICIENT_IRD),
            MpaError::UlpduTooShort { .. } => Some(TermCode::MPA_FPDU_START),
            _ => None,
        }
    }
}

impl fmt::Display for MpaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MpaError::BadKey { expected } => write!(f, "MPA key is not {expected:?}"),
            MpaError::PrivateDataTooLong { pd_length } => {
                write!(f, "MPA PD_Length {pd_length} above {PD_LENGTH_MAX}")
            }
            MpaError::Revision(r) => write!(f, "MPA revision {r} not supported (1 or 2)"),
            MpaError::MarkersRefused => write!(f, "MPA markers asked for: not supported"),
            MpaError::Rejected => write!(f, "MPA Reply rejects the connection"),
            MpaError::CrcRefused => write!(f, "MPA Reply refuses the CRC we asked for"),
            MpaError::Enhanced(why) => write!(f, "MPA enhanced set-up: {why}"),
            MpaError::InsufficientIrd { ird, peer_ord } => {
                write!(f, "MPA peer ORD {peer_ord} exceeds our IRD {ird}")
            }
            MpaError::DataBeforeReply => write!(f, "data after the MPA Request before the Reply"),
            MpaError::UlpduTooShort { ulpdu_length } => write!(
                f,
                "FPDU ULPDU_Length {ulpdu_length} below the {ULPDU_MIN} B DDP header"
            ),
        }
    }
}

impl std::error::Error for MpaError {}

/// RFC 6581's IRD/ORD block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IrdOrd {
    pub ird: u16,
    pub ord: u16,
    /// `A`: peer-to-peer mode (an RTR message precedes the responder's first FPDU).
    pub p2p: bool,
    /// `B`: zero-length Send RTR.
    pub zero_len_rtr: bool,
    /// `C`: zero-length RDMA Write RTR.
    pub write_rtr: bool,
    /// `D`: zero-length RDMA Read RTR.
    pub read_rtr: bool,
}

impl IrdOrd {
    pub fn encode(&self) -> [u8; 4] {
        let ird = (self.ird & IRD_ORD_MAX)
            | if self.p2p { IRD_P2P } else { 0 }
            | if self.zero_len_rtr {
                IRD_ZERO_LEN_RTR
            } else {
                0
            };
        let ord = (self.ord & IRD_ORD_MAX)
            | if self.write_rtr { ORD_WRITE_RTR } else { 0 }
            | if self.read_rtr { ORD_READ_RTR } else { 0 };
        let mut b = [0u8; 4];
        b[..2].copy_from_slice(&ird.to_be_bytes());
        b[2..].copy_from_slice(&ord.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<IrdOrd> {
        let ird = u16::from_be_bytes(b.get(..2)?.try_into().ok()?);
        let ord = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
        Some(IrdOrd {
            ird: ird & IRD_ORD_MAX,
            ord: ord & IRD_ORD_MAX,
            p2p: ird & IRD_P2P != 0,
            zero_len_rtr: ird & IRD_ZERO_LEN_RTR != 0,
            write_rtr: ord & ORD_WRITE_RTR != 0,
            read_rtr: ord & ORD_READ_RTR != 0,
        })
    }
}

/// Request or Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RrKind {
    Request,
    Reply,
}

/// An MPA Request or Reply frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RrFrame {
    pub kind: RrKind,
    pub markers: bool,
    pub crc: bool,
    pub reject: bool,
    pub enhanced: bool,
    /// The four reserved flag bits below `E`, as received.
    pub reserved: u8,
    pub rev: u8,
    /// The whole private data (with `E`, its first 4 bytes are the IRD/ORD block).
    pub private_data: Vec<u8>,
}

impl RrFrame {
    pub fn new(kind: RrKind) -> Self {
        RrFrame {
            kind,
            markers: false,
            crc: false,
            reject: false,
            enhanced: false,
            reserved: 0,
            rev: 1,
            private_data: Vec::new(),
        }
    }

    /// The IRD/ORD block, if the frame is enhanced and carries one.
    pub fn ird_ord(&self) -> Option<IrdOrd> {
        if self.enhanced {
            IrdOrd::decode(&self.private_data)
        } else {
            None
        }
    }

    /// The private data after the IRD/ORD block (the application's part).
    pub fn ulp_private_data(&self) -> &[u8] {
        if self.enhanced && self.private_data.len() >= ENHANCED_PD_LEN {
            &self.private_data[ENHANCED_PD_LEN..]
        } else {
            &self.private_data
        }
    }

    pub fn flags(&self) -> u8 {
        (if self.markers { FLAG_M } else { 0 })
            | (if self.crc { FLAG_C } else { 0 })
            | (if self.reject { FLAG_R } else { 0 })
            | (if self.enhanced { FLAG_E } else { 0 })
            | (self.reserved & 0x0f)
    }

    /// Wire bytes. Private data beyond [`PD_LENGTH_MAX`] is a programmer error.
    pub fn encode(&self) -> Vec<u8> {
        assert!(
            self.private_data.len() <= PD_LENGTH_MAX,
            "MPA private data too long"
        );
        let mut out = Vec::with_capacity(RR_HEADER_LEN + self.private_data.len());
        out.extend_from_slice(match self.kind {
            RrKind::Request => KEY_REQ,
            RrKind::Reply => KEY_REP,
        });
        out.push(self.flags());
        out.push(self.rev);
        out.extend_from_slice(&(self.private_data.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.private_data);
        out
    }

    /// Parse a frame of `kind` at the start of `buf`: `Ok(None)` until it is complete,
    /// else the frame and the bytes it took. Checks the key and PD_Length (before any
    /// allocation); the flags are left to the negotiation.
    pub fn parse(kind: RrKind, buf: &[u8]) -> Result<Option<(RrFrame, usize)>, MpaError> {
        let key = match kind {
            RrKind::Request => KEY_REQ,
            RrKind::Reply => KEY_REP,
        };
        let n = buf.len().min(key.len());
        if buf[..n] != key[..n] {
            return Err(MpaError::BadKey {
                expected: if kind == RrKind::Request {
                    "MPA ID Req Frame"
                } else {
                    "MPA ID Rep Frame"
                },
            });
        }
        if buf.len() < RR_HEADER_LEN {
            return Ok(None);
        }
        let flags = buf[16];
        let rev = buf[17];
        let pd_length = usize::from(u16::from_be_bytes([buf[18], buf[19]]));
        if pd_length > PD_LENGTH_MAX {
            return Err(MpaError::PrivateDataTooLong { pd_length });
        }
        let total = RR_HEADER_LEN + pd_length;
        if buf.len() < total {
            return Ok(None);
        }
        let f = RrFrame {
            kind,
            markers: flags & FLAG_M != 0,
            crc: flags & FLAG_C != 0,
            reject: flags & FLAG_R != 0,
            enhanced: flags & FLAG_E != 0,
            reserved: flags & 0x0f,
            rev,
            private_data: buf[RR_HEADER_LEN..total].to_vec(),
        };
        Ok(Some((f, total)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_reply_round_trip() {
        let mut f = RrFrame::new(RrKind::Request);
        f.crc = true;
        f.enhanced = true;
        f.rev = 2;
        f.private_data = IrdOrd {
            ird: 4,
            ord: 3,
            p2p: true,
            write_rtr: true,
            ..Default::default()
        }
        .encode()
        .to_vec();
        let b = f.encode();
        let (g, n) = RrFrame::parse(RrKind::Request, &b).unwrap().unwrap();
        assert_eq!(n, b.len());
        assert_eq!(g, f);
        assert_eq!(g.ird_ord().unwrap().ird, 4);
        for cut in 0..b.len() {
            assert!(RrFrame::parse(RrKind::Request, &b[..cut])
                .unwrap()
                .is_none());
        }
    }
}
