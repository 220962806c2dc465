//! The Terminate vocabulary: which layer refused a message, and why (RFC 5040 §4.8,
//! the Terminate Control field: Layer 4 bits, EType 4 bits, Error Code 8 bits).
//!
//! Every refusal in this crate is one [`TermCode`]; the codes and the choice among them
//! follow Linux siw (`drivers/infiniband/sw/siw/iwarp.h`, `siw_qp_rx.c`), which is the
//! software peer we interoperate with. Where siw departs from the RFCs, the constant's
//! doc says so.

use std::fmt;

/// The layer that detected the error (RFC 5040 §4.8, "Layer").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// RDMAP (RFC 5040).
    Rdmap = 0,
    /// DDP (RFC 5041).
    Ddp = 1,
    /// The lower layer protocol: MPA (RFC 5044).
    Llp = 2,
}

impl Layer {
    pub fn from_u8(v: u8) -> Option<Layer> {
        match v {
            0 => Some(Layer::Rdmap),
            1 => Some(Layer::Ddp),
            2 => Some(Layer::Llp),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Layer::Rdmap => "rdmap",
            Layer::Ddp => "ddp",
            Layer::Llp => "llp",
        }
    }
}

/// One Terminate reason: layer, error type and error code as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermCode {
    /// Raw 4-bit layer (see [`Layer`]; a received Terminate may carry any value).
    pub layer: u8,
    pub etype: u8,
    pub ecode: u8,
}

// RFC 5040 §4.8 / RFC 5041 §7.2 error types.
const RDMAP_ETYPE_CATASTROPHIC: u8 = 0;
const RDMAP_ETYPE_REMOTE_PROTECTION: u8 = 1;
const RDMAP_ETYPE_REMOTE_OPERATION: u8 = 2;
const DDP_ETYPE_CATASTROPHIC: u8 = 0;
const DDP_ETYPE_TAGGED: u8 = 1;
const DDP_ETYPE_UNTAGGED: u8 = 2;
const LLP_ETYPE_MPA: u8 = 0;

const fn code(layer: Layer, etype: u8, ecode: u8) -> TermCode {
    TermCode {
        layer: layer as u8,
        etype,
        ecode,
    }
}

impl TermCode {
    // ---- RDMAP (layer 0) ----
    /// Local catastrophic error (the QP is torn down; siw sends no header with it).
    pub const RDMAP_CATASTROPHIC: TermCode = code(Layer::Rdmap, RDMAP_ETYPE_CATASTROPHIC, 0xff);
    /// Remote protection: invalid STag (a Read Request's source STag).
    pub const RDMAP_INVALID_STAG: TermCode =
        code(Layer::Rdmap, RDMAP_ETYPE_REMOTE_PROTECTION, 0x00);
    /// Remote protection: base or bounds violation.
    pub const RDMAP_BASE_BOUNDS: TermCode = code(Layer::Rdmap, RDMAP_ETYPE_REMOTE_PROTECTION, 0x01);
    /// Remote protection: access rights violation.
    pub const RDMAP_ACCESS_RIGHTS: TermCode =
        code(Layer::Rdmap, RDMAP_ETYPE_REMOTE_PROTECTION, 0x02);
    /// Remote protection: STag not associated with this RDMAP stream (other PD).
    pub const RDMAP_STAG_NOT_ASSOC: TermCode =
        code(Layer::Rdmap, RDMAP_ETYPE_REMOTE_PROTECTION, 0x03);
    /// Remote protection: TO wrap.
    pub const RDMAP_TO_WRAP: TermCode = code(Layer::Rdmap, RDMAP_ETYPE_REMOTE_PROTECTION, 0x04);
    /// Remote operation: invalid RDMAP version.
    pub const RDMAP_VERSION: TermCode = code(Layer::Rdmap, RDMAP_ETYPE_REMOTE_OPERATION, 0x05);
    /// Remote operation: unexpected opcode.
    pub const RDMAP_OPCODE: TermCode = code(Layer::Rdmap, RDMAP_ETYPE_REMOTE_OPERATION, 0x06);
    /// Remote operation: catastrophic error localised to this stream (siw: a Read
    /// Request beyond the IRD).
    pub const RDMAP_CATASTROPHIC_STREAM: TermCode =
        code(Layer::Rdmap, RDMAP_ETYPE_REMOTE_OPERATION, 0x07);
    /// Remote operation: unable to invalidate the STag of a Send with Invalidate.
    pub const RDMAP_CANNOT_INVALIDATE: TermCode =
        code(Layer::Rdmap, RDMAP_ETYPE_REMOTE_OPERATION, 0x09);

    // ---- DDP (layer 1) ----
    /// Catastrophic DDP error (siw: a Read Response with no Read outstanding).
    pub const DDP_CATASTROPHIC: TermCode = code(Layer::Ddp, DDP_ETYPE_CATASTROPHIC, 0x00);
    /// Tagged buffer: invalid STag. siw also uses it for missing access rights ("RFC
    /// 5041 lacks an ecode for insufficient access permissions").
    pub const DDP_T_INVALID_STAG: TermCode = code(Layer::Ddp, DDP_ETYPE_TAGGED, 0x00);
    /// Tagged buffer: base or bounds violation.
    pub const DDP_T_BASE_BOUNDS: TermCode = code(Layer::Ddp, DDP_ETYPE_TAGGED, 0x01);
    /// Tagged buffer: STag not associated with this DDP stream (other PD).
    pub const DDP_T_STAG_NOT_ASSOC: TermCode = code(Layer::Ddp, DDP_ETYPE_TAGGED, 0x02);
    /// Tagged buffer: TO wrap.
    pub const DDP_T_TO_WRAP: TermCode = code(Layer::Ddp, DDP_ETYPE_TAGGED, 0x03);
    /// Tagged buffer: invalid DDP version.
    pub const DDP_T_VERSION: TermCode = code(Layer::Ddp, DDP_ETYPE_TAGGED, 0x04);
    /// Untagged buffer: invalid QN.
    pub const DDP_UT_INVALID_QN: TermCode = code(Layer::Ddp, DDP_ETYPE_UNTAGGED, 0x01);
    /// Untagged buffer: invalid MSN, no buffer available (no receive posted).
    pub const DDP_UT_NO_BUFFER: TermCode = code(Layer::Ddp, DDP_ETYPE_UNTAGGED, 0x02);
    /// Untagged buffer: invalid MSN, MSN range not valid.
    pub const DDP_UT_MSN_RANGE: TermCode = code(Layer::Ddp, DDP_ETYPE_UNTAGGED, 0x03);
    /// Untagged buffer: invalid MO.
    pub const DDP_UT_INVALID_MO: TermCode = code(Layer::Ddp, DDP_ETYPE_UNTAGGED, 0x04);
    /// Untagged buffer: DDP message too long for the available buffer. RFC 5041 §7.2;
    /// siw reports "no buffer" (0x02) here instead, we follow the RFC's specific code.
    pub const DDP_UT_TOO_LONG: TermCode = code(Layer::Ddp, DDP_ETYPE_UNTAGGED, 0x05);
    /// Untagged buffer: invalid DDP version.
    pub const DDP_UT_VERSION: TermCode = code(Layer::Ddp, DDP_ETYPE_UNTAGGED, 0x06);

    // ---- LLP = MPA (layer 2) ----
    /// MPA: received CRC error.
    pub const MPA_CRC: TermCode = code(Layer::Llp, LLP_ETYPE_MPA, 0x02);
    /// MPA: marker / FPDU start error (a malformed FPDU: the stream cannot be deframed).
    pub const MPA_FPDU_START: TermCode = code(Layer::Llp, LLP_ETYPE_MPA, 0x03);
    /// MPA: invalid Request or Reply frame.
    pub const MPA_INVALID_REQ_RESP: TermCode = code(Layer::Llp, LLP_ETYPE_MPA, 0x04);
    /// MPA (RFC 6581): the initiator's IRD is insufficient for the responder's ORD.
    pub const MPA_INSUFFICIENT_IRD: TermCode = code(Layer::Llp, LLP_ETYPE_MPA, 0x06);
    /// MPA (RFC 6581): no matching ready-to-receive mode.
    pub const MPA_NO_MATCHING_RTR: TermCode = code(Layer::Llp, LLP_ETYPE_MPA, 0x07);

    /// The layer, if it is one RFC 5040 defines.
    pub fn layer(&self) -> Option<Layer> {
        Layer::from_u8(self.layer)
    }

    /// One line for humans (and the decoder's `error` key).
    pub fn describe(&self) -> &'static str {
        match (self.layer, self.etype, self.ecode) {
            (0, 0, _) => "RDMAP local catastrophic error",
            (0, 1, 0x00) => "RDMAP invalid STag",
            (0, 1, 0x01) => "RDMAP base or bounds violation",
            (0, 1, 0x02) => "RDMAP access rights violation",
            (0, 1, 0x03) => "RDMAP STag not associated with RDMAP stream",
            (0, 1, 0x04) => "RDMAP TO wrap",
            (0, 2, 0x05) => "RDMAP invalid RDMAP version",
            (0, 2, 0x06) => "RDMAP unexpected opcode",
            (0, 2, 0x07) => "RDMAP catastrophic error localized to stream",
            (0, 2, 0x08) => "RDMAP catastrophic error global",
            (0, 2, 0x09) => "RDMAP STag cannot be invalidated",
            (1, 0, _) => "DDP local catastrophic error",
            (1, 1, 0x00) => "DDP tagged invalid STag",
            (1, 1, 0x01) => "DDP tagged base or bounds violation",
            (1, 1, 0x02) => "DDP tagged STag not associated with DDP stream",
            (1, 1, 0x03) => "DDP tagged TO wrap",
            (1, 1, 0x04) => "DDP tagged invalid DDP version",
            (1, 2, 0x01) => "DDP untagged invalid QN",
            (1, 2, 0x02) => "DDP untagged invalid MSN, no buffer available",
            (1, 2, 0x03) => "DDP untagged invalid MSN, MSN range not valid",
            (1, 2, 0x04) => "DDP untagged invalid MO",
            (1, 2, 0x05) => "DDP untagged message too long for available buffer",
            (1, 2, 0x06) => "DDP untagged invalid DDP version",
            (2, 0, 0x01) => "MPA TCP connection lost",
            (2, 0, 0x02) => "MPA received CRC error",
            (2, 0, 0x03) => "MPA received marker or FPDU start error",
            (2, 0, 0x04) => "MPA invalid Request or Reply frame",
            (2, 0, 0x05) => "MPA local catastrophic error",
            (2, 0, 0x06) => "MPA insufficient IRD",
            (2, 0, 0x07) => "MPA no matching RTR",
            _ => "unknown error",
        }
    }

    /// The Terminate Control word's top 16 bits (layer, etype, ecode).
    pub fn to_bits(&self) -> u16 {
        (u16::from(self.layer & 0xf) << 12)
            | (u16::from(self.etype & 0xf) << 8)
            | u16::from(self.ecode)
    }
}

impl fmt::Display for TermCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (layer {}, etype {}, ecode {:#04x})",
            self.describe(),
            self.layer,
            self.etype,
            self.ecode
        )
    }
}
