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

use crate::crc::{self, Crc32c};
use std::fmt;

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

/// The maximum ULPDU for an effective MSS of `emss_bytes`, markers off (RFC 5044 §4.3):
/// the largest `U` with `pad4(2 + U) + 4 <= EMSS`.
pub fn mulpdu(emss_bytes: usize) -> usize {
    let room = emss_bytes.saturating_sub(CRC_LEN) & !3;
    room.saturating_sub(HEADER_LEN).clamp(ULPDU_MIN, ULPDU_MAX)
}

/// Pad after `2 + ulpdu_len` bytes to reach a multiple of 4.
pub fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (HEADER_LEN + ulpdu_len) % 4) % 4
}

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

/// What one side of the set-up wants.
#[derive(Debug, Clone)]
pub struct MpaConfig {
    /// Ask for CRC (the outcome is CRC if either side asks).
    pub crc: bool,
    /// Use RFC 6581 (Rev 2 with IRD/ORD); else Rev 1.
    pub enhanced: bool,
    /// Inbound Read Requests this side will queue.
    pub ird: u16,
    /// Outbound Read Requests this side wants outstanding.
    pub ord: u16,
    /// Application private data (after the IRD/ORD block).
    pub private_data: Vec<u8>,
}

impl Default for MpaConfig {
    fn default() -> Self {
        MpaConfig {
            crc: true,
            enhanced: true,
            ird: 8,
            ord: 8,
            private_data: Vec::new(),
        }
    }
}

/// The outcome of a successful set-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// CRC on FPDUs in both directions.
    pub crc: bool,
    pub rev: u8,
    /// Inbound Read Requests we queue.
    pub ird: u16,
    /// Outbound Read Requests we may have outstanding.
    pub ord: u16,
    /// The peer's application private data.
    pub peer_private_data: Vec<u8>,
    /// Responder in peer-to-peer mode: wait for the initiator's zero-length Write
    /// before sending.
    pub await_rtr: bool,
}

/// Result of feeding bytes to a [`Setup`].
#[derive(Debug)]
pub enum SetupStep {
    /// Need more bytes.
    Pending,
    /// Established. `send` holds bytes to transmit first (the Reply, for a responder);
    /// `leftover` are bytes after the peer's frame (FPDUs), to be deframed.
    Done {
        negotiated: Negotiated,
        send: Vec<u8>,
        leftover: Vec<u8>,
    },
    /// The set-up failed. `send` holds a rejecting Reply (responder) if one is due.
    Failed { error: MpaError, send: Vec<u8> },
}

/// The MPA set-up of one endpoint, as a state machine: bytes in, a step out.
#[derive(Debug)]
pub struct Setup {
    role: RrKind,
    cfg: MpaConfig,
    buf: Vec<u8>,
    done: bool,
}

impl Setup {
    /// An initiator, and the Request bytes to send on the new TCP connection.
    pub fn initiator(cfg: MpaConfig) -> (Setup, Vec<u8>) {
        let mut f = RrFrame::new(RrKind::Request);
        f.crc = cfg.crc;
        Self::fill(&mut f, &cfg, cfg.ird, cfg.ord, IrdOrd::default());
        let bytes = f.encode();
        (
            Setup {
                role: RrKind::Reply,
                cfg,
                buf: Vec::new(),
                done: false,
            },
            bytes,
        )
    }

    /// A responder, waiting for the Request.
    pub fn responder(cfg: MpaConfig) -> Setup {
        Setup {
            role: RrKind::Request,
            cfg,
            buf: Vec::new(),
            done: false,
        }
    }

    fn fill(f: &mut RrFrame, cfg: &MpaConfig, ird: u16, ord: u16, rtr: IrdOrd) {
        let ulp = &cfg.private_data[..cfg.private_data.len().min(PD_LENGTH_MAX - ENHANCED_PD_LEN)];
        if cfg.enhanced {
            f.rev = 2;
            f.enhanced = true;
            let io = IrdOrd {
                ird: ird.min(IRD_ORD_MAX),
                ord: ord.min(IRD_ORD_MAX),
                ..rtr
            };
            f.private_data = io.encode().to_vec();
            f.private_data.extend_from_slice(ulp);
        } else {
            f.rev = 1;
            f.private_data = ulp.to_vec();
        }
    }

    /// Feed received bytes. After `Done` or `Failed` the set-up is over; feeding more
    /// is a programmer error.
    pub fn on_bytes(&mut self, data: &[u8]) -> SetupStep {
        assert!(!self.done, "MPA set-up fed after it ended");
        // Bounded: a frame is at most RR_HEADER_LEN + PD_LENGTH_MAX, checked by parse
        // before it asks for more; data beyond the frame is handed on as leftover.
        self.buf.extend_from_slice(data);
        let parsed = match RrFrame::parse(self.role, &self.buf) {
            Ok(None) => return SetupStep::Pending,
            Ok(Some(p)) => p,
            Err(error) => {
                self.done = true;
                return SetupStep::Failed {
                    error,
                    send: Vec::new(),
                };
            }
        };
        self.done = true;
        let (frame, used) = parsed;
        let leftover = self.buf.split_off(used);
        match self.role {
            RrKind::Request => self.answer_request(frame, leftover),
            RrKind::Reply => self.take_reply(frame, leftover),
        }
    }

    fn answer_request(&self, req: RrFrame, leftover: Vec<u8>) -> SetupStep {
        let reject = |error: MpaError| {
            let mut rep = RrFrame::new(RrKind::Reply);
            rep.reject = true;
            rep.crc = req.crc;
            rep.rev = if req.rev == 2 { 2 } else { 1 };
            SetupStep::Failed {
                error,
                send: rep.encode(),
            }
        };
        if req.rev == 0 || req.rev > 2 {
            return reject(MpaError::Revision(req.rev));
        }
        if req.markers {
            return reject(MpaError::MarkersRefused);
        }
        if !leftover.is_empty() {
            return reject(MpaError::DataBeforeReply);
        }
        let enhanced = req.rev == 2 && req.enhanced && self.cfg.enhanced;
        let (mut ird, mut ord, mut rtr, mut await_rtr) =
            (self.cfg.ird, self.cfg.ord, IrdOrd::default(), false);
        if req.rev == 2 && req.enhanced {
            let Some(peer) = req.ird_ord() else {
                return reject(MpaError::Enhanced("private data shorter than IRD/ORD"));
            };
            if enhanced {
                ird = peer.ord.min(self.cfg.ird);
                ord = peer.ird.min(self.cfg.ord);
                if peer.p2p {
                    rtr.p2p = true;
                    rtr.write_rtr = true;
                    await_rtr = true;
                }
            }
        }
        let crc = req.crc || self.cfg.crc;
        let mut rep = RrFrame::new(RrKind::Reply);
        rep.crc = crc;
        let cfg = MpaConfig {
            enhanced,
            ..self.cfg.clone()
        };
        Self::fill(&mut rep, &cfg, ird, ord, rtr);
        let peer_private_data = req.ulp_private_data().to_vec();
        SetupStep::Done {
            negotiated: Negotiated {
                crc,
                rev: rep.rev,
                ird,
                ord,
                peer_private_data,
                await_rtr,
            },
            send: rep.encode(),
            leftover,
        }
    }

    fn take_reply(&self, rep: RrFrame, leftover: Vec<u8>) -> SetupStep {
        let fail = |error| SetupStep::Failed {
            error,
            send: Vec::new(),
        };
        if rep.reject {
            return fail(MpaError::Rejected);
        }
        if rep.rev == 0 || rep.rev > 2 {
            return fail(MpaError::Revision(rep.rev));
        }
        if rep.markers {
            return fail(MpaError::MarkersRefused);
        }
        if self.cfg.crc && !rep.crc {
            return fail(MpaError::CrcRefused);
        }
        let (mut ird, mut ord) = (self.cfg.ird, self.cfg.ord);
        if self.cfg.enhanced {
            if rep.rev < 2 || !rep.enhanced {
                return fail(MpaError::Enhanced("Reply is not Rev 2 with E set"));
            }
            let Some(peer) = rep.ird_ord() else {
                return fail(MpaError::Enhanced("private data shorter than IRD/ORD"));
            };
            if peer.ord > self.cfg.ird {
                return fail(MpaError::InsufficientIrd {
                    ird: self.cfg.ird,
                    peer_ord: peer.ord,
                });
            }
            ord = ord.min(peer.ird);
            ird = ird.min(self.cfg.ird);
        }
        SetupStep::Done {
            negotiated: Negotiated {
                crc: rep.crc,
                rev: rep.rev,
                ird,
                ord,
                peer_private_data: rep.ulp_private_data().to_vec(),
                await_rtr: false,
            },
            send: Vec::new(),
            leftover,
        }
    }
}

/// The CRC verdict of one FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrcVerdict {
    Good,
    Bad,
    /// CRC not negotiated: the field is present but not checked.
    Absent,
}

impl CrcVerdict {
    pub fn name(self) -> &'static str {
        match self {
            CrcVerdict::Good => "good",
            CrcVerdict::Bad => "bad",
            CrcVerdict::Absent => "absent",
        }
    }
}

/// One deframed FPDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fpdu {
    /// The DDP segment.
    pub ulpdu: Vec<u8>,
    pub pad: usize,
    /// The CRC field as received (wire order).
    pub crc_field: [u8; 4],
    pub crc: CrcVerdict,
}

impl Fpdu {
    /// Bytes the FPDU took on the wire.
    pub fn wire_len(&self) -> usize {
        HEADER_LEN + self.ulpdu.len() + self.pad + CRC_LEN
    }
}

/// Frame `ulpdu` as one FPDU onto `out` (pad, then the CRC or zeros).
pub fn encode_fpdu(ulpdu: &[u8], crc_on: bool, out: &mut Vec<u8>) {
    assert!(
        ulpdu.len() <= ULPDU_MAX,
        "ULPDU above 65535 B: segment first"
    );
    let start = out.len();
    out.extend_from_slice(&(ulpdu.len() as u16).to_be_bytes());
    out.extend_from_slice(ulpdu);
    out.extend(std::iter::repeat_n(0u8, pad_len(ulpdu.len())));
    let field = if crc_on {
        crc::to_wire(crc::crc32c(&out[start..]))
    } else {
        [0; 4]
    };
    out.extend_from_slice(&field);
}

/// The receive side of MPA framing: bytes in, FPDUs out, in stream order.
///
/// Holds at most one incomplete FPDU ([`FPDU_MAX`]) plus what was pushed but not yet
/// taken; a length from the wire is checked ([`ULPDU_MIN`]) before anything is
/// copied for it, and an FPDU is only copied out once all its bytes are here.
#[derive(Debug)]
pub struct Deframer {
    crc_on: bool,
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    pos: usize,
    failed: bool,
}

impl Deframer {
    pub fn new(crc_on: bool) -> Self {
        Deframer {
            crc_on,
            buf: Vec::new(),
            pos: 0,
            failed: false,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        if self.pos > 0 && self.pos >= self.buf.len() / 2 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Unconsumed bytes (an incomplete FPDU, or nothing).
    pub fn pending(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next complete FPDU, `Ok(None)` if more bytes are needed. After an error the
    /// stream is lost: every later call returns the same kind of error.
    pub fn next_fpdu(&mut self) -> Result<Option<Fpdu>, MpaError> {
        let rest = &self.buf[self.pos..];
        if rest.len() < HEADER_LEN {
            return Ok(None);
        }
        let ulpdu_length = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        if self.failed || ulpdu_length < ULPDU_MIN {
            self.failed = true;
            return Err(MpaError::UlpduTooShort { ulpdu_length });
        }
        let pad = pad_len(ulpdu_length);
        let total = HEADER_LEN + ulpdu_length + pad + CRC_LEN;
        if rest.len() < total {
            return Ok(None);
        }
        let body = &rest[..total - CRC_LEN];
        let crc_field: [u8; 4] = rest[total - CRC_LEN..total].try_into().expect("4 bytes");
        let crc = if self.crc_on {
            let mut c = Crc32c::new();
            c.update(body);
            if crc::to_wire(c.finish()) == crc_field {
                CrcVerdict::Good
            } else {
                CrcVerdict::Bad
            }
        } else {
            CrcVerdict::Absent
        };
        let f = Fpdu {
            ulpdu: rest[HEADER_LEN..HEADER_LEN + ulpdu_length].to_vec(),
            pad,
            crc_field,
            crc,
        };
        self.pos += total;
        Ok(Some(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mulpdu_fits_the_segment() {
        for emss in [64usize, 536, 1000, 1460, 1461, 1462, 1463, 8960, 65535] {
            let u = mulpdu(emss);
            assert!(HEADER_LEN + u + pad_len(u) + CRC_LEN <= emss, "emss {emss}");
            assert!(HEADER_LEN + u + 1 + pad_len(u + 1) + CRC_LEN > emss || u == ULPDU_MAX);
        }
        assert_eq!(mulpdu(1460), 1454);
    }

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

    fn run(init: MpaConfig, resp: MpaConfig) -> (SetupStep, Option<SetupStep>) {
        let (mut i, req) = Setup::initiator(init);
        let mut r = Setup::responder(resp);
        let rs = r.on_bytes(&req);
        let send = match &rs {
            SetupStep::Done { send, .. } | SetupStep::Failed { send, .. } => send.clone(),
            SetupStep::Pending => panic!("pending"),
        };
        let is = if send.is_empty() {
            None
        } else {
            Some(i.on_bytes(&send))
        };
        (rs, is)
    }

    #[test]
    fn crc_is_used_if_either_side_asks() {
        for (a, b) in [(false, false), (true, false), (false, true), (true, true)] {
            let (rs, is) = run(
                MpaConfig {
                    crc: a,
                    ..Default::default()
                },
                MpaConfig {
                    crc: b,
                    ..Default::default()
                },
            );
            let SetupStep::Done { negotiated: rn, .. } = rs else {
                panic!()
            };
            assert_eq!(rn.crc, a || b);
            let Some(SetupStep::Done {
                negotiated: inn, ..
            }) = is
            else {
                panic!()
            };
            assert_eq!(inn.crc, a || b);
        }
    }

    #[test]
    fn ird_ord_are_negotiated() {
        let (rs, is) = run(
            MpaConfig {
                ird: 4,
                ord: 6,
                ..Default::default()
            },
            MpaConfig {
                ird: 2,
                ord: 3,
                ..Default::default()
            },
        );
        let SetupStep::Done { negotiated: rn, .. } = rs else {
            panic!()
        };
        assert_eq!((rn.ird, rn.ord), (2, 3));
        let Some(SetupStep::Done {
            negotiated: inn, ..
        }) = is
        else {
            panic!()
        };
        assert_eq!((inn.ird, inn.ord), (4, 2));
    }

    #[test]
    fn markers_are_refused_with_a_rejecting_reply() {
        let mut req = RrFrame::new(RrKind::Request);
        req.markers = true;
        let mut r = Setup::responder(MpaConfig::default());
        let SetupStep::Failed { error, send } = r.on_bytes(&req.encode()) else {
            panic!()
        };
        assert_eq!(error, MpaError::MarkersRefused);
        let (rep, _) = RrFrame::parse(RrKind::Reply, &send).unwrap().unwrap();
        assert!(rep.reject && !rep.markers);
    }

    #[test]
    fn short_ulpdu_is_a_framing_error() {
        let mut d = Deframer::new(false);
        d.push(&[0, 0, 0, 0, 0, 0]);
        assert!(d.next_fpdu().is_err());
        let mut d = Deframer::new(false);
        d.push(&[0]);
        assert_eq!(d.next_fpdu(), Ok(None));
    }
}
