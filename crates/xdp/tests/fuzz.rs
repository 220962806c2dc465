//! Randomized packet fuzz of the XDP program through BPF_PROG_TEST_RUN (root only).
//! Valid requests of every kind are mutated (bytes flipped anywhere, header fields set
//! to random or boundary values, keys swapped, frames cut or extended) and run through
//! the program. After every packet:
//! - no word outside the control words changed, and none at all unless the packet
//!   carried the read-write key;
//! - a packet is answered (XDP_TX) only if it carried a known key, was addressed to the
//!   node's IP and port, and the reply is no longer than the request (no reflection)
//!   with correct checksums;
//! - the program never aborts.
//!
//! CI runs `FUZZ_PACKETS_CI` packets. The benchmark run (10^6 packets) is ignored by
//! default:
//!
//! ```text
//! sudo -E cargo test -p farside-xdp --test fuzz -- --ignored --nocapture
//! ```

mod common;

use common::*;
use farside_rmem::wire::{self, FLAG_RETRY};
use farside_xdp::{action, TestProgram};
use std::sync::atomic::Ordering;

const PORT: u16 = 7078;
/// Packets per CI run: about a second of BPF_PROG_TEST_RUN in a debug build.
const FUZZ_PACKETS_CI: u64 = 50_000;
/// Shortest frame BPF_PROG_TEST_RUN accepts.
const ETH_HEADER_BYTES: usize = 14;
/// Packets per benchmark run (the issue's bound).
const FUZZ_PACKETS_BENCH: u64 = 1_000_000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Valid requests to start from: every op, both keys, with and without client ids.
fn seeds() -> Vec<Vec<u8>> {
    let (ro, rw, stranger) = (keys().ro, keys().rw, keys().stranger);
    let (ro, rw) = (&ro, &rw);
    let mk = |op: u8,
              key: &farside_rmem::ClientKey,
              offset: u32,
              len: u32,
              client: u64,
              flags: u16,
              p: &[u8]| {
        let mut b = seal(key, client, &covered(op, flags, 1000, 0, offset, len, p));
        if op == 1 {
            b.resize(
                b.len()
                    .max(wire::ENVELOPE_BYTES + wire::REP_HEADER_BYTES + len as usize),
                0,
            );
        }
        frame(Shape::to_port(PORT), &b)
    };
    let mut cas = 5u64.to_le_bytes().to_vec();
    cas.extend_from_slice(&6u64.to_le_bytes());
    vec![
        mk(1, ro, 0, 192, 0, 0, &[]),
        mk(1, rw, 256, 256, 7, 0, &[]),
        mk(2, rw, 256, 64, 7, 0, &[9; 64]),
        mk(2, rw, 264, 8, 0, 0, &[9; 8]),
        mk(3, rw, 320, 8, 7, 0, &cas),
        mk(3, rw, 320, 8, 8, FLAG_RETRY, &cas),
        mk(4, rw, 384, 8, 7, 0, &1u64.to_le_bytes()),
        mk(4, ro, 384, 8, 0, 0, &1u64.to_le_bytes()),
        mk(2, &stranger, 320, 8, 7, 0, &[1; 8]),
    ]
}

fn mutate(r: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut f = seed.to_vec();
    // Offsets of the rmem header fields in the frame: 42 + wire offset.
    const FIELDS: [(usize, usize); 9] = [
        (42, 4), // magic
        (46, 1), // version
        (47, 1), // op
        (48, 2), // flags
        (50, 8), // seq
        (58, 8), // key
        (66, 4), // region
        (70, 4), // offset
        (74, 4), // len
    ];
    for _ in 0..1 + r.below(4) {
        match r.below(7) {
            0 | 1 => {
                let i = r.below(f.len() as u64) as usize;
                f[i] ^= 1 << r.below(8);
            }
            2 => {
                let i = r.below(f.len() as u64) as usize;
                f[i] = r.next() as u8;
            }
            3 => {
                let (at, n) = FIELDS[r.below(FIELDS.len() as u64) as usize];
                let v: u64 = match r.below(5) {
                    0 => 0,
                    1 => u64::MAX,
                    2 => r.below(4200),
                    3 => 4096 - 8 * r.below(4),
                    _ => r.next(),
                };
                if at + n <= f.len() {
                    f[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
                }
            }
            4 => {
                // Another key id (a known one, or any): the tag no longer verifies.
                let id = [keys().ro.id.0, keys().rw.id.0, r.next() as u32][r.below(3) as usize];
                if f.len() >= 54 {
                    f[50..54].copy_from_slice(&id.to_le_bytes());
                }
            }
            5 => {
                // BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet header.
                let n = r.below(f.len() as u64 + 1) as usize;
                f.truncate(n.max(ETH_HEADER_BYTES));
            }
            _ => f.extend((0..r.below(64)).map(|_| r.next() as u8)),
        }
    }
    f
}

fn fuzz(packets: u64, seed: u64) {
    let mut prog = TestProgram::load(PORT, &keyring()).expect("load");
    prog.set_node_addr(Some(IP_SERVER.into())).unwrap();
    let region = prog.region();
    for (i, w) in region.words().iter().enumerate() {
        w.store(
            0x0101_0101_0101_0101u64.wrapping_mul(i as u64 + 3),
            Ordering::SeqCst,
        );
    }
    let snapshot = || -> Vec<u64> {
        region
            .words()
            .iter()
            .map(|w| w.load(Ordering::SeqCst))
            .collect()
    };
    let protected = |s: &[u64]| -> Vec<u64> {
        s.iter()
            .enumerate()
            .filter(|(i, _)| {
                farside_auth::rights::AGENT_OWNED
                    .iter()
                    .any(|o| o.covers(*i, *i + 1))
            })
            .map(|(_, v)| *v)
            .collect()
    };
    let fixed = protected(&snapshot());
    let seeds = seeds();
    let mut r = Rng(seed | 1);
    let (mut answered, mut passed, mut dropped) = (0u64, 0u64, 0u64);
    for n in 0..packets {
        let pick = r.below(seeds.len() as u64) as usize;
        let f = mutate(&mut r, &seeds[pick]);
        let before = snapshot();
        let (verdict, out) = prog.run(&f);
        let after = snapshot();
        assert_ne!(verdict, action::ABORTED, "packet {n} aborted: {f:02x?}");
        // The key id as the program would read it (if the frame carries an envelope).
        let key = (f.len() >= 54).then(|| u32::from_le_bytes(f[50..54].try_into().unwrap()));
        let (ro_id, rw_id, bal_id) = (keys().ro.id.0, keys().rw.id.0, keys().bal.id.0);
        if after != before {
            assert!(
                key == Some(rw_id) || key == Some(bal_id),
                "packet {n} changed memory without a key that may"
            );
            assert_eq!(
                protected(&after),
                fixed,
                "packet {n} changed a protected word"
            );
        }
        match verdict {
            action::TX => {
                answered += 1;
                assert!(
                    key == Some(ro_id) || key == Some(rw_id),
                    "packet {n}: answered a bad key: {f:02x?}"
                );
                // The reply verifies under the request's key (sealed, bound to it).
                let k = if key == Some(ro_id) {
                    keys().ro
                } else {
                    keys().rw
                };
                assert!(
                    farside_rmem::auth::open_reply(
                        &out[42..],
                        &k,
                        u64::from_le_bytes(f[58..66].try_into().unwrap()),
                        1..=u64::MAX
                    )
                    .is_ok(),
                    "packet {n}: reply does not verify"
                );
                assert_eq!(
                    &f[30..34],
                    &IP_SERVER,
                    "packet {n}: answered another host's packet"
                );
                assert!(
                    out.len() <= f.len(),
                    "packet {n}: {}-byte reply to {} bytes",
                    out.len(),
                    f.len()
                );
                let dport = u16::from_be_bytes([f[36], f[37]]);
                assert_eq!(dport, PORT, "packet {n}: answered another port");
                // Well-formed reply with correct checksums (as sent, before mutation the
                // request's addresses are the standard ones; mutations of those pass).
                if f[26..30] == IP_CLIENT && f[34..36] == PORT_CLIENT.to_be_bytes() {
                    check_reply(&format!("packet {n}"), &f, &out, PORT);
                }
            }
            action::PASS => {
                passed += 1;
                assert_eq!(out, f, "packet {n}: passed frame changed");
            }
            _ => dropped += 1,
        }
    }
    let mut e = std::io::stderr();
    use std::io::Write;
    let _ = writeln!(
        e,
        "xdp fuzz: {packets} packets: {answered} answered, {passed} passed, {dropped} dropped"
    );
    assert!(
        answered > 0 && passed > 0 && dropped > 0,
        "the mutations reach every verdict"
    );
}

#[test]
fn fuzzed_packets_change_no_agent_owned_word_and_get_no_reply_unless_authentic() {
    if !need_root("fuzzed_packets_change_no_agent_owned_word_and_get_no_reply_unless_authentic") {
        return;
    }
    fuzz(FUZZ_PACKETS_CI, 0x0ddba11);
}

/// The benchmark-size run (10^6 packets); see the module docs for the command.
#[test]
#[ignore]
fn fuzz_a_million_packets() {
    if !need_root("fuzz_a_million_packets") {
        return;
    }
    fuzz(FUZZ_PACKETS_BENCH, farside_rmem::random_u64());
}
