//! MPA framing of DDP segments (RFC 5044 §4): FPDUs out ([`encode_fpdu`]) and in
//! ([`Deframer`]), with the CRC32c of §4.4 (wire order in [`crate::crc`]).

use super::{MpaError, CRC_LEN, HEADER_LEN, ULPDU_MAX, ULPDU_MIN};
use crate::crc::{self, Crc32c};

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
/// Holds at most one incomplete FPDU ([`super::FPDU_MAX`]) plus what was pushed but not yet
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
    fn short_ulpdu_is_a_framing_error() {
        let mut d = Deframer::new(false);
        d.push(&[0, 0, 0, 0, 0, 0]);
        assert!(d.next_fpdu().is_err());
        let mut d = Deframer::new(false);
        d.push(&[0]);
        assert_eq!(d.next_fpdu(), Ok(None));
    }
}
