//! The BPF SipHash (`bpf/auth_siphash.h`, run by the test-only `bpf/auth_test.bpf.c`
//! through BPF_PROG_TEST_RUN) computes the same tags as `farside_auth::siphash`: on the
//! paper's reference messages, on random keys and messages up to the program's bound,
//! with and without a domain label absorbed first (how an envelope's tag is made). Also
//! prints what the verifier processed and the run time per message size (the cost the
//! module docs state). Needs root (loading a program).

use aya::programs::Xdp;
use farside_auth::siphash::{siphash24, Sip24, SipKey};
use std::os::fd::AsFd;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/auth_test.bpf.o"));

/// `AUTH_SIPHASH_BYTES_MAX` of `bpf/auth_test.bpf.c`.
const MESSAGE_BYTES_MAX: usize = 1456;
/// Bytes of the test frame's header (`struct auth_test_frame`).
const FRAME_HEADER_BYTES: usize = 40;
const FLAG_LABEL: u32 = 1;
const FLAG_ENVELOPE: u32 = 2;

const XDP_ABORTED: u32 = 0;
const XDP_DROP: u32 = 1;
const XDP_TX: u32 = 3;

struct Program {
    _ebpf: aya::Ebpf,
    fd: std::os::fd::OwnedFd,
    verified_insns: Option<u32>,
    xlated_insns: Option<u32>,
}

fn load() -> Program {
    let mut ebpf = aya::EbpfLoader::new()
        .btf(None)
        .load(OBJECT)
        .expect("parse the object");
    let prog: &mut Xdp = ebpf
        .program_mut("auth_test")
        .expect("program auth_test")
        .try_into()
        .expect("an XDP program");
    prog.load().expect("the verifier accepts auth_test");
    let info = prog.info().expect("program info");
    let fd = prog
        .fd()
        .expect("loaded")
        .as_fd()
        .try_clone_to_owned()
        .expect("dup the program fd");
    Program {
        verified_insns: info.verified_instruction_count(),
        xlated_insns: info.size_translated().map(|b| b / 8),
        fd,
        _ebpf: ebpf,
    }
}

fn frame(key: &SipKey, label: Option<u64>, len: u32, msg: &[u8]) -> Vec<u8> {
    let (k0, k1) = key.halves();
    let mut f = Vec::with_capacity(FRAME_HEADER_BYTES + msg.len());
    f.extend_from_slice(&k0.to_le_bytes());
    f.extend_from_slice(&k1.to_le_bytes());
    f.extend_from_slice(&label.unwrap_or(0).to_le_bytes());
    f.extend_from_slice(&len.to_le_bytes());
    let flags = if label.is_some() { FLAG_LABEL } else { 0 };
    f.extend_from_slice(&flags.to_le_bytes());
    f.extend_from_slice(&0u64.to_le_bytes());
    f.extend_from_slice(msg);
    f
}

impl Program {
    /// `(verdict, tag written, kernel run time ns)`.
    fn run(&self, frame: &[u8]) -> (u32, u64, u32) {
        let mut out = vec![0u8; frame.len()];
        let r = farside_bpfbuild::prog_test_run(self.fd.as_fd(), frame, &mut out)
            .expect("BPF_PROG_TEST_RUN");
        let tag = if out.len() >= FRAME_HEADER_BYTES {
            u64::from_le_bytes(out[32..40].try_into().unwrap())
        } else {
            0
        };
        (r.retval, tag, r.duration_ns)
    }

    fn tag(&self, key: &SipKey, label: Option<u64>, msg: &[u8]) -> u64 {
        let (verdict, tag, _) = self.run(&frame(key, label, msg.len() as u32, msg));
        assert_eq!(verdict, XDP_TX, "{} bytes", msg.len());
        tag
    }
}

fn rust_tag(key: &SipKey, label: Option<u64>, msg: &[u8]) -> u64 {
    let mut h = Sip24::new(key);
    if let Some(l) = label {
        h.write_u64(l);
    }
    h.write(msg);
    h.finish()
}

/// splitmix64: seeded, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

const VECTOR_KEY: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

#[test]
#[ignore = "needs root"]
fn bpf_siphash_matches_the_reference_vectors() {
    let p = load();
    let key = SipKey::from_bytes(VECTOR_KEY);
    let msg: Vec<u8> = (0..64u8).collect();
    for n in 0..64 {
        assert_eq!(
            p.tag(&key, None, &msg[..n]),
            siphash24(&key, &msg[..n]),
            "{n} bytes"
        );
    }
    // First and last entries of vectors.h, literally (siphash.rs checks all 64).
    assert_eq!(p.tag(&key, None, &[]), 0x726fdb47dd0e0e31);
    assert_eq!(p.tag(&key, None, &msg[..63]), 0x958a324ceb064572);
}

#[test]
#[ignore = "needs root"]
fn bpf_siphash_matches_rust_on_random_keys_messages_and_labels() {
    let p = load();
    let mut rng = Rng(0xa117);
    for i in 0..3000 {
        let key = SipKey::from_halves(rng.next(), rng.next());
        // Mostly short (headers), some up to the bound.
        let len = if i % 4 == 0 {
            (rng.next() % (MESSAGE_BYTES_MAX as u64 + 1)) as usize
        } else {
            (rng.next() % 130) as usize
        };
        let msg: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let label = (i % 2 == 0).then(|| rng.next());
        assert_eq!(
            p.tag(&key, label, &msg),
            rust_tag(&key, label, &msg),
            "{len} bytes, label {label:?}"
        );
    }
}

/// What an XDP program verifying an envelope computes: the domain label, then the frame
/// from the envelope's byte 8 (`mac::COVERED_OFFSET`) to the end of the covered message.
#[test]
#[ignore = "needs root"]
fn bpf_tags_of_sealed_envelopes_match_the_envelope() {
    use farside_auth::mac::{self, Domain, Envelope, KeyId, COVERED_OFFSET};
    let p = load();
    let mut rng = Rng(0xe7e1);
    for i in 0..600 {
        let key = SipKey::from_halves(rng.next(), rng.next());
        let domain = Domain::ALL[i % Domain::ALL.len()];
        let env = Envelope {
            key_id: KeyId(rng.next() as u32),
            sender: rng.next(),
            seq: rng.next(),
        };
        let len = (rng.next() % 100) as usize;
        let msg: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let mut sealed = Vec::new();
        mac::seal(&mut sealed, domain, &key, &env, &msg).unwrap();
        let want = u64::from_le_bytes(sealed[..8].try_into().unwrap());
        assert_eq!(
            p.tag(&key, Some(domain.label()), &sealed[COVERED_OFFSET..]),
            want,
            "{} with {len} bytes",
            domain.name()
        );
    }
}

/// `auth_envelope_tag` verifies sealed envelopes as a BPF receiver would: authentic ones
/// pass, any flipped bit of the covered bytes, a wrong label or key fails, and an
/// envelope whose length runs past the frame is dropped without reading beyond it.
#[test]
#[ignore = "needs root"]
fn bpf_verifies_envelopes_as_the_rust_receiver_does() {
    use farside_auth::mac::{self, Domain, Envelope, KeyId, ENVELOPE_BYTES};
    let p = load();
    let mut rng = Rng(0x0e1f);
    let verify = |key: &SipKey, label: u64, sealed: &[u8]| {
        let mut f = frame(key, Some(label), 0, sealed);
        f[28..32].copy_from_slice(&FLAG_ENVELOPE.to_le_bytes());
        p.run(&f).0
    };
    for i in 0..300 {
        let key = SipKey::from_halves(rng.next(), rng.next());
        let domain = Domain::ALL[i % Domain::ALL.len()];
        let env = Envelope {
            key_id: KeyId(rng.next() as u32),
            sender: rng.next(),
            seq: rng.next(),
        };
        let len = (rng.next() % 100) as usize;
        let msg: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let mut sealed = Vec::new();
        mac::seal(&mut sealed, domain, &key, &env, &msg).unwrap();
        assert_eq!(verify(&key, domain.label(), &sealed), XDP_TX, "{len} bytes");
        // Padding after the covered message changes nothing.
        let mut padded = sealed.clone();
        padded.extend_from_slice(&[0xee; 24]);
        assert_eq!(verify(&key, domain.label(), &padded), XDP_TX);
        // Any covered bit flipped (except len, which may then run past the frame).
        let byte = (rng.next() as usize) % sealed.len();
        let mut bad = sealed.clone();
        bad[byte] ^= 1 << (rng.next() % 8);
        assert_eq!(verify(&key, domain.label(), &bad), XDP_DROP, "byte {byte}");
        let other = Domain::ALL[(i + 1) % Domain::ALL.len()];
        assert_eq!(verify(&key, other.label(), &sealed), XDP_DROP);
        let wrong = SipKey::from_halves(rng.next(), rng.next());
        assert_eq!(verify(&wrong, domain.label(), &sealed), XDP_DROP);
        // Truncated: the envelope, or its covered message, runs past the frame.
        let cut = (rng.next() as usize) % sealed.len();
        assert_eq!(verify(&key, domain.label(), &sealed[..cut]), XDP_DROP);
    }
    // A length over the bound is refused before anything is read.
    let key = SipKey::from_bytes(VECTOR_KEY);
    let mut huge = vec![0u8; ENVELOPE_BYTES + 64];
    huge[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(verify(&key, 1, &huge), XDP_DROP);
}

#[test]
#[ignore = "needs root"]
fn bpf_siphash_refuses_lengths_over_its_bound_or_the_frame() {
    let p = load();
    let key = SipKey::from_bytes(VECTOR_KEY);
    let msg = vec![7u8; MESSAGE_BYTES_MAX + 8];
    // Over the bound, although the bytes are there.
    let f = frame(&key, None, MESSAGE_BYTES_MAX as u32 + 1, &msg);
    assert_eq!(p.run(&f).0, XDP_DROP);
    // Exactly the bound: hashed.
    let f = frame(&key, None, MESSAGE_BYTES_MAX as u32, &msg);
    assert_eq!(p.run(&f).0, XDP_TX);
    // A length beyond the frame, in whole blocks and in the tail.
    for (len, have) in [(64u32, 56usize), (61, 60), (5, 0)] {
        let f = frame(&key, None, len, &msg[..have]);
        let (verdict, tag, _) = p.run(&f);
        assert_eq!((verdict, tag), (XDP_DROP, 0), "len {len} with {have} bytes");
    }
    // Shorter than the frame header.
    assert_eq!(p.run(&[0u8; 20]).0, XDP_ABORTED);
}

/// Not a check: prints the verifier's count and the kernel-measured run time per size
/// (`cargo test -p farside-auth -- --include-ignored --nocapture bpf_siphash_cost`).
#[test]
#[ignore = "needs root"]
fn bpf_siphash_cost() {
    let p = load();
    eprintln!(
        "auth_test: verifier processed {:?} instructions; program is {:?} instructions",
        p.verified_insns, p.xlated_insns
    );
    let key = SipKey::from_bytes(VECTOR_KEY);
    for len in [0usize, 8, 32, 64, 88, 128, 512, 1424] {
        let f = frame(&key, Some(1), len as u32, &vec![1u8; len]);
        let runs = 2000u64;
        let total: u64 = (0..runs).map(|_| u64::from(p.run(&f).2)).sum();
        eprintln!(
            "auth_test: {len:5} bytes + 8-byte label: {:5} ns per run (BPF_PROG_TEST_RUN, mean of {runs})",
            total / runs
        );
    }
    assert!(p.verified_insns.is_none_or(|n| n < 1_000_000));
}
