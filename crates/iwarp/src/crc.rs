//! CRC32c (Castagnoli), the MPA FPDU CRC (RFC 5044 §4.4 and §8.1, which take it from
//! iSCSI, RFC 3720 §12.1 and Appendix B.4).
//!
//! CRC-32/ISCSI: reflected polynomial 0x82F63B78 (normal form 0x1EDC6F41), initial value
//! 0xFFFFFFFF, input and output reflected, final XOR 0xFFFFFFFF. Computed by the
//! `crc32c` crate (hardware CRC where the CPU has it), the tree's one CRC32c, which the
//! object arena uses too.
//!
//! **Wire order.** MPA transmits the CRC as iSCSI does: the four bytes are the
//! little-endian encoding of the final CRC value ([`to_wire`]). Linux siw writes
//! `put_unaligned_le32(~crc)`; Wireshark shows the wire bytes read big-endian.

/// An incremental CRC32c: [`Crc32c::update`] over the pieces, then [`Crc32c::finish`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Crc32c {
    /// The CRC value of the bytes so far (the crate continues from a final value).
    value: u32,
}

impl Crc32c {
    pub const fn new() -> Self {
        Self { value: 0 }
    }

    pub fn update(&mut self, data: &[u8]) {
        self.value = crc32c::crc32c_append(self.value, data);
    }

    /// The final CRC value (after the final XOR).
    pub fn finish(&self) -> u32 {
        self.value
    }
}

/// CRC32c of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// The four bytes MPA puts on the wire for CRC value `crc`.
pub fn to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// The CRC value carried by the four wire bytes `b`.
pub fn from_wire(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_of_the_catalogue() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn incremental_equals_one_shot() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for cut in [0, 1, 7, 500, 999, 1000] {
            let mut c = Crc32c::new();
            c.update(&data[..cut]);
            c.update(&data[cut..]);
            assert_eq!(c.finish(), crc32c(&data));
        }
    }

    #[test]
    fn wire_order_is_little_endian() {
        assert_eq!(to_wire(0xd173_8846), [0x46, 0x88, 0x73, 0xd1]);
        assert_eq!(from_wire([0x46, 0x88, 0x73, 0xd1]), 0xd173_8846);
    }
}
