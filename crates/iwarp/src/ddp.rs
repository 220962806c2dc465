//! DDP: Direct Data Placement (RFC 5041), the header of every MPA ULPDU.
//!
//! ```text
//! tagged (14 B, RFC 5041 §4.2):   |T L rsvd DV| RsvdULP (8) | STag (32) | TO (64)
//! untagged (18 B, RFC 5041 §4.3): |T L rsvd DV| RsvdULP (40)| QN (32) | MSN (32) | MO (32)
//! ```
//! The control byte holds `T` (tagged), `L` (last segment of the message), four
//! reserved bits and the 2-bit DDP version `DV`, which must be 1. RDMAP uses the first
//! byte of RsvdULP as its own control byte, and an untagged segment's remaining 4 bytes
//! as the Send-with-Invalidate STag.
//!
//! A **tagged** segment is placed at `TO` in the buffer named by `STag`; an **untagged**
//! one at offset `MO` of the `MSN`-th message of queue `QN` (RFC 5041 §5). A message
//! is cut into segments of at most the MULPDU ([`segments`]): each tagged segment
//! carries its own TO, each untagged one the same QN/MSN and its own MO, and only the
//! last has `L` set. The checks of a segment against the receiver's buffers are in
//! [`crate::qp`]; this module only reads and writes the bytes.

use crate::term::TermCode;

/// DDP version this stack speaks (RFC 5041 §4.2).
pub const DDP_VERSION: u8 = 1;
/// Tagged header length, control byte to TO.
pub const TAGGED_HDR_LEN: usize = 14;
/// Untagged header length, control byte to MO.
pub const UNTAGGED_HDR_LEN: usize = 18;

const CTRL_T: u8 = 0x80;
const CTRL_L: u8 = 0x40;
const CTRL_RSVD: u8 = 0x3c;
const CTRL_DV: u8 = 0x03;

/// The DDP control byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    pub tagged: bool,
    pub last: bool,
    /// The 4 reserved bits (must be sent as 0, ignored on receipt).
    pub rsvd: u8,
    pub dv: u8,
}

impl Control {
    pub fn from_byte(b: u8) -> Self {
        Control {
            tagged: b & CTRL_T != 0,
            last: b & CTRL_L != 0,
            rsvd: (b & CTRL_RSVD) >> 2,
            dv: b & CTRL_DV,
        }
    }

    pub fn to_byte(self) -> u8 {
        (if self.tagged { CTRL_T } else { 0 })
            | (if self.last { CTRL_L } else { 0 })
            | ((self.rsvd << 2) & CTRL_RSVD)
            | (self.dv & CTRL_DV)
    }
}

/// The placement part of a DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Tagged { stag: u32, to: u64 },
    Untagged { qn: u32, msn: u32, mo: u32 },
}

/// A parsed DDP segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment<'a> {
    pub ctrl: Control,
    /// First byte of RsvdULP: the RDMAP control byte.
    pub rdmap_ctrl: u8,
    /// Untagged only: the other 4 bytes of RsvdULP (RDMAP: Invalidate STag).
    pub rsvd_ulp: u32,
    pub placement: Placement,
    pub payload: &'a [u8],
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Why DDP refused a segment: the Terminate code and what we could read of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdpRefusal {
    pub term: TermCode,
    pub why: &'static str,
}

/// Read the DDP header of `ulpdu`, ignoring the version (see [`parse`]): for reports on
/// a segment that is refused. `None` if the bytes are too few for its kind of header.
pub fn parse_lenient(ulpdu: &[u8]) -> Option<Segment<'_>> {
    let ctrl = Control::from_byte(*ulpdu.first()?);
    let rdmap_ctrl = *ulpdu.get(1)?;
    if ctrl.tagged {
        if ulpdu.len() < TAGGED_HDR_LEN {
            return None;
        }
        Some(Segment {
            ctrl,
            rdmap_ctrl,
            rsvd_ulp: 0,
            placement: Placement::Tagged {
                stag: be32(ulpdu, 2),
                to: be64(ulpdu, 6),
            },
            payload: &ulpdu[TAGGED_HDR_LEN..],
        })
    } else {
        if ulpdu.len() < UNTAGGED_HDR_LEN {
            return None;
        }
        Some(Segment {
            ctrl,
            rdmap_ctrl,
            rsvd_ulp: be32(ulpdu, 2),
            placement: Placement::Untagged {
                qn: be32(ulpdu, 6),
                msn: be32(ulpdu, 10),
                mo: be32(ulpdu, 14),
            },
            payload: &ulpdu[UNTAGGED_HDR_LEN..],
        })
    }
}

/// Parse the DDP header of `ulpdu`. Refuses (as siw's `siw_get_hdr`) a DDP version
/// other than 1 with the tagged or untagged "invalid DDP version" code, and a segment
/// too short for its header as a catastrophic DDP error.
pub fn parse(ulpdu: &[u8]) -> Result<Segment<'_>, DdpRefusal> {
    let Some(&c) = ulpdu.first() else {
        return Err(DdpRefusal {
            term: TermCode::DDP_CATASTROPHIC,
            why: "empty ULPDU",
        });
    };
    let ctrl = Control::from_byte(c);
    if ctrl.dv != DDP_VERSION {
        return Err(DdpRefusal {
            term: if ctrl.tagged {
                TermCode::DDP_T_VERSION
            } else {
                TermCode::DDP_UT_VERSION
            },
            why: "invalid DDP version",
        });
    }
    parse_lenient(ulpdu).ok_or(DdpRefusal {
        term: TermCode::DDP_CATASTROPHIC,
        why: "ULPDU shorter than its DDP header",
    })
}

/// Write a DDP header (DV = 1) for `placement` onto `out`.
pub fn encode_header(
    last: bool,
    rdmap_ctrl: u8,
    rsvd_ulp: u32,
    placement: Placement,
    out: &mut Vec<u8>,
) {
    let tagged = matches!(placement, Placement::Tagged { .. });
    out.push(
        Control {
            tagged,
            last,
            rsvd: 0,
            dv: DDP_VERSION,
        }
        .to_byte(),
    );
    out.push(rdmap_ctrl);
    match placement {
        Placement::Tagged { stag, to } => {
            out.extend_from_slice(&stag.to_be_bytes());
            out.extend_from_slice(&to.to_be_bytes());
        }
        Placement::Untagged { qn, msn, mo } => {
            out.extend_from_slice(&rsvd_ulp.to_be_bytes());
            out.extend_from_slice(&qn.to_be_bytes());
            out.extend_from_slice(&msn.to_be_bytes());
            out.extend_from_slice(&mo.to_be_bytes());
        }
    }
}

/// One segment of a message cut by [`segments`]: its placement, whether it is the
/// last, and the range of the message's payload it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentPlan {
    pub placement: Placement,
    pub last: bool,
    pub range: std::ops::Range<usize>,
}

/// Cut a message of `len` payload bytes starting at `first` into DDP segments whose
/// ULPDU (header and payload) is at most `mulpdu` bytes. A zero-length message is one
/// segment. Tagged segments advance the TO, untagged ones the MO.
pub fn segments(first: Placement, len: usize, mulpdu: usize) -> Vec<SegmentPlan> {
    let hdr = match first {
        Placement::Tagged { .. } => TAGGED_HDR_LEN,
        Placement::Untagged { .. } => UNTAGGED_HDR_LEN,
    };
    assert!(mulpdu > hdr, "MULPDU {mulpdu} cannot hold a DDP header");
    let step = mulpdu - hdr;
    let mut out = Vec::with_capacity(len / step + 1);
    let mut off = 0usize;
    loop {
        let n = step.min(len - off);
        let placement = match first {
            Placement::Tagged { stag, to } => Placement::Tagged {
                stag,
                to: to.wrapping_add(off as u64),
            },
            Placement::Untagged { qn, msn, mo } => Placement::Untagged {
                qn,
                msn,
                mo: mo.wrapping_add(off as u32),
            },
        };
        out.push(SegmentPlan {
            placement,
            last: off + n == len,
            range: off..off + n,
        });
        off += n;
        if off == len {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_byte_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(Control::from_byte(b).to_byte(), b);
        }
        let c = Control::from_byte(0xc1);
        assert!(c.tagged && c.last && c.dv == 1);
    }

    #[test]
    fn version_zero_is_refused_by_kind() {
        let mut u = vec![0x40, 0x43];
        u.extend_from_slice(&[0; 16]);
        assert_eq!(parse(&u).unwrap_err().term, TermCode::DDP_UT_VERSION);
        u[0] = 0xc0;
        assert_eq!(parse(&u).unwrap_err().term, TermCode::DDP_T_VERSION);
    }

    #[test]
    fn segments_cover_the_message() {
        let plans = segments(
            Placement::Untagged {
                qn: 0,
                msn: 1,
                mo: 0,
            },
            100,
            18 + 30,
        );
        assert_eq!(plans.len(), 4);
        assert_eq!(plans[3].range, 90..100);
        assert!(plans[3].last && !plans[2].last);
        assert_eq!(
            plans[2].placement,
            Placement::Untagged {
                qn: 0,
                msn: 1,
                mo: 60
            }
        );
        let z = segments(Placement::Tagged { stag: 1, to: 5 }, 0, 100);
        assert_eq!(z.len(), 1);
        assert!(z[0].last);
    }
}
