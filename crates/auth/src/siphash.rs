//! SipHash-2-4 with a 64-bit output (Aumasson and Bernstein, "SipHash: a fast
//! short-input PRF", 2012), written out so the BPF programs (`bpf/auth_siphash.h`) and
//! this crate compute the same function from the same description.
//!
//! SipHash is a pseudo-random function keyed with 128 bits: without the key an attacker
//! who sees any number of (message, tag) pairs of their choice cannot forge the tag of
//! a new message with probability better than about 2^-64 per attempt, which is what a
//! message authentication code must guarantee. It was designed for short inputs, which
//! is what control messages are: a few tens of bytes of header.
//!
//! Cost, for a message of `n` bytes: `floor(n / 8) + 1` compression blocks of two
//! SipRounds each, then four finalisation rounds, i.e. `2 * floor(n / 8) + 6` SipRounds.
//! One SipRound is 14 operations on 64-bit words (4 additions, 4 xors, 6 rotations):
//! 84 operations for an empty message, 196 for a 32-byte one, 308 for 64 bytes.
//! Measured on the development VM (2 shared cores, release build): 47 ns for 8 bytes,
//! 118 ns for 64, 1.8 µs for 1424. BPF has no rotate instruction (a rotation is 3 to 4
//! instructions): as clang compiles `bpf/auth_siphash.h`, one 8-byte block is 90
//! instructions (two SipRounds, the load, the bounds check), the tail and the
//! finalisation about 200, so an 8-byte label and a 64-byte message run about 1,000
//! instructions. Measured in the kernel (`bpf/auth_test.bpf.c` through
//! BPF_PROG_TEST_RUN, run overhead included): 81 ns for the label alone, 139 ns with a
//! 64-byte message, 1.26 µs with 1424 bytes, about 6.6 ns per further 8 bytes. The
//! verifier walks the bounded loop once per possible length: about 40,000 instructions
//! processed per inlined copy of the loop for a bound of 1456 bytes (`auth_test`
//! inlines two: 80,000), far under its limit of one million.
//!
//! Only SipHash-2-4 is provided: its reduced-round variant SipHash-1-3 would halve the
//! compression cost, but it has a thinner security margin and no reference vectors in
//! the paper's repository, and 2-4 fits the BPF budget for the message sizes in use.

use std::fmt;

/// A 128-bit SipHash key, as the two little-endian 64-bit halves of its 16 bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SipKey {
    k0: u64,
    k1: u64,
}

impl SipKey {
    /// Key bytes in the paper's order: `k0` is bytes 0..8 read little-endian.
    pub const fn from_bytes(b: [u8; 16]) -> SipKey {
        let mut k0 = 0u64;
        let mut k1 = 0u64;
        let mut i = 0;
        while i < 8 {
            k0 |= (b[i] as u64) << (8 * i);
            k1 |= (b[i + 8] as u64) << (8 * i);
            i += 1;
        }
        SipKey { k0, k1 }
    }

    pub const fn from_halves(k0: u64, k1: u64) -> SipKey {
        SipKey { k0, k1 }
    }

    /// `(k0, k1)`: what a BPF map holding the key stores.
    pub const fn halves(&self) -> (u64, u64) {
        (self.k0, self.k1)
    }

    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.k0.to_le_bytes());
        b[8..].copy_from_slice(&self.k1.to_le_bytes());
        b
    }
}

/// Never prints key material (logs and panics include `Debug` output).
impl fmt::Debug for SipKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SipKey(..)")
    }
}

/// Incremental SipHash-2-4: [`write`](Sip24::write) any number of slices, then
/// [`finish`](Sip24::finish). The result equals [`siphash24`] of their concatenation.
#[derive(Clone)]
pub struct Sip24 {
    v: [u64; 4],
    /// Bytes written not yet compressed (the low `tail_len` bytes, little-endian).
    tail: u64,
    tail_len: usize,
    /// Total bytes written (only its low 8 bits enter the hash, as the paper says).
    len: u64,
}

/// One SipRound (a `const fn`, so the domains' label blocks are hashed at compile time too).
#[inline(always)]
const fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13);
    v[1] ^= v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17);
    v[1] ^= v[2];
    v[2] = v[2].rotate_left(32);
}

impl Sip24 {
    pub fn new(key: &SipKey) -> Sip24 {
        Sip24 {
            v: [
                key.k0 ^ 0x736f_6d65_7073_6575, // "somepseu"
                key.k1 ^ 0x646f_7261_6e64_6f6d, // "dorandom"
                key.k0 ^ 0x6c79_6765_6e65_7261, // "lygenera"
                key.k1 ^ 0x7465_6462_7974_6573, // "tedbytes"
            ],
            tail: 0,
            tail_len: 0,
            len: 0,
        }
    }

    #[inline(always)]
    fn compress(&mut self, m: u64) {
        self.v[3] ^= m;
        sip_round(&mut self.v);
        sip_round(&mut self.v);
        self.v[0] ^= m;
    }

    pub fn write(&mut self, mut msg: &[u8]) {
        self.len = self.len.wrapping_add(msg.len() as u64);
        // Complete a pending partial block first.
        while self.tail_len > 0 && !msg.is_empty() {
            self.tail |= u64::from(msg[0]) << (8 * self.tail_len);
            self.tail_len += 1;
            msg = &msg[1..];
            if self.tail_len == 8 {
                let m = self.tail;
                self.compress(m);
                self.tail = 0;
                self.tail_len = 0;
            }
        }
        if self.tail_len > 0 {
            return; // `msg` ended inside the pending block
        }
        let mut blocks = msg.chunks_exact(8);
        for b in &mut blocks {
            self.compress(u64::from_le_bytes(b.try_into().expect("8 bytes")));
        }
        for (i, &byte) in blocks.remainder().iter().enumerate() {
            self.tail |= u64::from(byte) << (8 * i);
        }
        self.tail_len = blocks.remainder().len();
    }

    /// Same as writing `w.to_le_bytes()`.
    pub fn write_u64(&mut self, w: u64) {
        self.write(&w.to_le_bytes());
    }

    pub fn finish(mut self) -> u64 {
        let last = (self.len << 56) | self.tail;
        self.compress(last);
        self.v[2] ^= 0xff;
        for _ in 0..4 {
            sip_round(&mut self.v);
        }
        self.v[0] ^ self.v[1] ^ self.v[2] ^ self.v[3]
    }
}

/// SipHash-2-4 of `msg` under `key`, the 64-bit output as the paper's reference code
/// returns it (its 8 output bytes read little-endian).
pub fn siphash24(key: &SipKey, msg: &[u8]) -> u64 {
    let mut h = Sip24::new(key);
    h.write(msg);
    h.finish()
}

/// SipHash-2-4 after whole 8-byte blocks, as a value: the hot paths' form. A
/// [`crate::mac::TagKey`] keeps the state after the key and a domain label, so each tag
/// starts there (two SipRounds fewer than hashing the label again, no key set-up);
/// the envelope's fields are absorbed as words, never through a byte buffer; the
/// message in 8-byte blocks and one tail. No allocation, no branch per byte.
///
/// `Prefix::new(k).block(a).block(b).finish(m)` equals `siphash24(k, a ‖ b ‖ m)` (the
/// words little-endian); the tests check it against [`siphash24`] and the reference
/// vectors.
#[derive(Clone, Copy)]
pub struct Prefix {
    v: [u64; 4],
    /// Bytes absorbed so far (a multiple of 8).
    len: u64,
}

/// Never prints the state (it is derived from the key).
impl fmt::Debug for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Prefix(..)")
    }
}

impl Prefix {
    pub const fn new(key: &SipKey) -> Prefix {
        Prefix {
            v: [
                key.k0 ^ 0x736f_6d65_7073_6575,
                key.k1 ^ 0x646f_7261_6e64_6f6d,
                key.k0 ^ 0x6c79_6765_6e65_7261,
                key.k1 ^ 0x7465_6462_7974_6573,
            ],
            len: 0,
        }
    }

    /// [`Prefix::block`] in a `const` context (a domain's label block at compile time).
    #[must_use]
    pub const fn block_const(self, m: u64) -> Prefix {
        let mut v = self.v;
        v[3] ^= m;
        let mut r = 0;
        while r < 2 {
            sip_round(&mut v);
            r += 1;
        }
        v[0] ^= m;
        Prefix {
            v,
            len: self.len.wrapping_add(8),
        }
    }

    /// Absorb one 8-byte block, given as its little-endian word.
    #[inline(always)]
    #[must_use]
    pub fn block(mut self, m: u64) -> Prefix {
        self.v[3] ^= m;
        sip_round(&mut self.v);
        sip_round(&mut self.v);
        self.v[0] ^= m;
        self.len = self.len.wrapping_add(8);
        self
    }

    /// Absorb `msg` and return the hash of everything absorbed.
    #[inline]
    pub fn finish(self, msg: &[u8]) -> u64 {
        let mut s = self;
        let mut blocks = msg.chunks_exact(8);
        for b in &mut blocks {
            s = s.block(u64::from_le_bytes(b.try_into().expect("8 bytes")));
        }
        let rest = blocks.remainder();
        let mut tail = [0u8; 8];
        tail[..rest.len()].copy_from_slice(rest);
        let total = s.len.wrapping_add(rest.len() as u64);
        let mut v = s.v;
        let last = (total << 56) | u64::from_le_bytes(tail);
        v[3] ^= last;
        sip_round(&mut v);
        sip_round(&mut v);
        v[0] ^= last;
        v[2] ^= 0xff;
        sip_round(&mut v);
        sip_round(&mut v);
        sip_round(&mut v);
        sip_round(&mut v);
        v[0] ^ v[1] ^ v[2] ^ v[3]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `vectors_sip64` of `vectors.h` in github.com/veorq/SipHash (the paper's Appendix
    /// A generalised): entry `i` is SipHash-2-4 with key `00 01 .. 0f` of the message
    /// `00 01 .. (i-1)`, its 8 bytes read little-endian.
    #[rustfmt::skip]
    pub(crate) const VECTORS_SIP64: [u64; 64] = [
        0x726fdb47dd0e0e31, 0x74f839c593dc67fd, 0x0d6c8009d9a94f5a, 0x85676696d7fb7e2d,
        0xcf2794e0277187b7, 0x18765564cd99a68d, 0xcbc9466e58fee3ce, 0xab0200f58b01d137,
        0x93f5f5799a932462, 0x9e0082df0ba9e4b0, 0x7a5dbbc594ddb9f3, 0xf4b32f46226bada7,
        0x751e8fbc860ee5fb, 0x14ea5627c0843d90, 0xf723ca908e7af2ee, 0xa129ca6149be45e5,
        0x3f2acc7f57c29bdb, 0x699ae9f52cbe4794, 0x4bc1b3f0968dd39c, 0xbb6dc91da77961bd,
        0xbed65cf21aa2ee98, 0xd0f2cbb02e3b67c7, 0x93536795e3a33e88, 0xa80c038ccd5ccec8,
        0xb8ad50c6f649af94, 0xbce192de8a85b8ea, 0x17d835b85bbb15f3, 0x2f2e6163076bcfad,
        0xde4daaaca71dc9a5, 0xa6a2506687956571, 0xad87a3535c49ef28, 0x32d892fad841c342,
        0x7127512f72f27cce, 0xa7f32346f95978e3, 0x12e0b01abb051238, 0x15e034d40fa197ae,
        0x314dffbe0815a3b4, 0x027990f029623981, 0xcadcd4e59ef40c4d, 0x9abfd8766a33735c,
        0x0e3ea96b5304a7d0, 0xad0c42d6fc585992, 0x187306c89bc215a9, 0xd4a60abcf3792b95,
        0xf935451de4f21df2, 0xa9538f0419755787, 0xdb9acddff56ca510, 0xd06c98cd5c0975eb,
        0xe612a3cb9ecba951, 0xc766e62cfcadaf96, 0xee64435a9752fe72, 0xa192d576b245165a,
        0x0a8787bf8ecb74b2, 0x81b3e73d20b49b6f, 0x7fa8220ba3b2ecea, 0x245731c13ca42499,
        0xb78dbfaf3a8d83bd, 0xea1ad565322a1a0b, 0x60e61c23a3795013, 0x6606d7e446282b93,
        0x6ca4ecb15c5f91e1, 0x9f626da15c9625f3, 0xe51b38608ef25f57, 0x958a324ceb064572,
    ];

    pub(crate) const VECTOR_KEY: [u8; 16] = [
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
        0x0f,
    ];

    /// splitmix64: seeded, no dependency.
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    #[test]
    fn matches_the_papers_64_reference_vectors() {
        let key = SipKey::from_bytes(VECTOR_KEY);
        let msg: Vec<u8> = (0..64u8).collect();
        for (i, &want) in VECTORS_SIP64.iter().enumerate() {
            assert_eq!(siphash24(&key, &msg[..i]), want, "message of {i} bytes");
        }
    }

    #[test]
    fn incremental_writes_equal_one_write_at_any_split() {
        let key = SipKey::from_bytes(VECTOR_KEY);
        let msg: Vec<u8> = (0..64u8).collect();
        for n in 0..=msg.len() {
            for cut_a in 0..=n {
                for cut_b in cut_a..=n {
                    let mut h = Sip24::new(&key);
                    h.write(&msg[..cut_a]);
                    h.write(&msg[cut_a..cut_b]);
                    h.write(&msg[cut_b..n]);
                    assert_eq!(
                        h.finish(),
                        siphash24(&key, &msg[..n]),
                        "{n} at {cut_a},{cut_b}"
                    );
                }
            }
        }
    }

    /// The standard library's (deprecated, still shipped) `SipHasher` is SipHash-2-4:
    /// a second, independent implementation to compare random keys and messages with.
    #[test]
    #[allow(deprecated)]
    fn agrees_with_std_siphasher_on_random_keys_and_messages() {
        use std::hash::Hasher;
        let mut rng = Rng(0x5eed);
        for _ in 0..2000 {
            let (k0, k1) = (rng.next(), rng.next());
            let len = rng.below(300) as usize;
            let msg = rng.bytes(len);
            let mut std_h = std::hash::SipHasher::new_with_keys(k0, k1);
            std_h.write(&msg);
            assert_eq!(
                siphash24(&SipKey::from_halves(k0, k1), &msg),
                std_h.finish(),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn the_prefix_form_matches_the_reference_vectors_at_every_split() {
        let key = SipKey::from_bytes(VECTOR_KEY);
        let msg: Vec<u8> = (0..64u8).collect();
        for (n, &want) in VECTORS_SIP64.iter().enumerate() {
            // Every whole-block prefix absorbed as words, the rest as bytes.
            for words in 0..=n / 8 {
                let mut p = Prefix::new(&key);
                for w in msg[..8 * words].chunks_exact(8) {
                    p = p.block(u64::from_le_bytes(w.try_into().unwrap()));
                }
                assert_eq!(
                    p.finish(&msg[8 * words..n]),
                    want,
                    "{n} bytes, {words} words"
                );
            }
        }
    }

    #[test]
    fn the_prefix_form_agrees_with_the_incremental_one_on_random_input() {
        let mut rng = Rng(0xb10c);
        for _ in 0..3000 {
            let key = SipKey::from_halves(rng.next(), rng.next());
            let words: Vec<u64> = (0..rng.below(6)).map(|_| rng.next()).collect();
            let n = rng.below(300) as usize;
            let msg = rng.bytes(n);
            let mut p = Prefix::new(&key);
            let mut all = Vec::new();
            for (i, &w) in words.iter().enumerate() {
                // The const form of a block is the same block.
                p = if i % 2 == 0 {
                    p.block(w)
                } else {
                    p.block_const(w)
                };
                all.extend_from_slice(&w.to_le_bytes());
            }
            all.extend_from_slice(&msg);
            assert_eq!(p.finish(&msg), siphash24(&key, &all));
        }
        assert_eq!(
            format!("{:?}", Prefix::new(&SipKey::from_halves(1, 2))),
            "Prefix(..)"
        );
    }

    #[test]
    fn key_bytes_round_trip_and_debug_hides_them() {
        let key = SipKey::from_bytes(VECTOR_KEY);
        assert_eq!(key.to_bytes(), VECTOR_KEY);
        assert_eq!(key.halves(), (0x0706050403020100, 0x0f0e0d0c0b0a0908));
        assert_eq!(format!("{key:?}"), "SipKey(..)");
    }
}
