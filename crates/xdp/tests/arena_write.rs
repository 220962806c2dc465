//! Arena WRITEs through BPF_PROG_TEST_RUN: a key with a chunk grant
//! (`Rights::chunk_writer`, a peer's slot) writes inside its chunks and nowhere else;
//! every verdict of the program (status, and the bytes it stored or did not store)
//! equals `farside_rmem::ops::check_arena`, the reference rule, over a table of
//! granted and refused requests; a repeated mutation (same client and op seq, a new
//! envelope) replays the recorded reply and is not applied again, a copied datagram
//! is dropped by the replay window, memory untouched.

mod common;

use common::*;
use farside_arena::layout::{ARENA_CHUNKS_MAX, ARENA_REGION, CHUNK_BYTES, FLAG_BULK};
use farside_auth::keys::Keyring;
use farside_auth::mac::KeyId;
use farside_auth::rights::Rights;
use farside_rmem::ops::{self, Chunked};
use farside_rmem::wire::{self, RepHeader, Status, ENVELOPE_BYTES};
use farside_rmem::ClientKey;
use farside_xdp::{action, TestProgram};

const PORT: u16 = 7079;
/// Chunks of the test arena.
const CHUNKS: u32 = 6;
/// Peer A's slot: chunk 2; peer B's: chunks 3 and 4.
const SLOT_A: (usize, usize) = (2, 3);
const SLOT_B: (usize, usize) = (3, 5);

struct Keys {
    reader: ClientKey,
    a: ClientKey,
    b: ClientKey,
}

fn keys_w() -> &'static Keys {
    static K: std::sync::OnceLock<Keys> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let (s, t) = (
            farside_rmem::LabKeyset::generate(),
            farside_rmem::LabKeyset::generate(),
        );
        Keys {
            reader: ClientKey::new(KeyId(7), *s.reader.key()),
            a: ClientKey::new(KeyId(11), *s.balancer.key()),
            b: ClientKey::new(KeyId(12), *t.reader.key()),
        }
    })
}

fn ring() -> Keyring {
    let k = keys_w();
    let mut r = keyring();
    r.install(
        "arena-reader",
        k.reader.id,
        *k.reader.key(),
        Rights::reader(ARENA_REGION),
    )
    .unwrap();
    let w = |(f, e): (usize, usize)| Rights::chunk_writer(ARENA_REGION, f, e).unwrap();
    r.install("slot-a", k.a.id, *k.a.key(), w(SLOT_A)).unwrap();
    r.install("slot-b", k.b.id, *k.b.key(), w(SLOT_B)).unwrap();
    r
}

/// A sealed arena request of `sender` with op seq `seq`: a WRITE carries `len` bytes of
/// `fill`, a READ is padded to its reply.
#[allow(clippy::too_many_arguments)]
fn req(
    key: &ClientKey,
    sender: u64,
    op: u8,
    flags: u16,
    seq: u64,
    offset: u32,
    len: u32,
    fill: u8,
) -> Vec<u8> {
    let payload = if op == 2 {
        (0..len).map(|i| fill ^ i as u8).collect()
    } else if op == 3 {
        vec![0; 16]
    } else if op == 4 {
        vec![0; 8]
    } else {
        vec![]
    };
    let mut b = seal(
        key,
        sender,
        &covered(op, flags, seq, ARENA_REGION, offset, len, &payload),
    );
    if op == 1 {
        let n = ENVELOPE_BYTES + wire::REP_HEADER_BYTES + len as usize;
        b.resize(b.len().max(n), 0);
    }
    b
}

/// Runs `r`; the reply's header (opened under `key`, sender `sender`), or None if the
/// program dropped it.
fn run(prog: &TestProgram, key: &ClientKey, sender: u64, r: &[u8]) -> Option<RepHeader> {
    let f = frame(Shape::to_port(PORT), r);
    let (act, out) = prog.run(&f);
    if act == action::DROP {
        return None;
    }
    assert_eq!(act, action::TX, "answered in the kernel");
    let payload = check_reply("arena write", &f, &out, PORT);
    let covered = farside_rmem::auth::open_reply(&payload, key, sender, 1..=u64::MAX)
        .expect("sealed under the request's key")
        .to_vec();
    Some(RepHeader::decode(&covered).unwrap())
}

fn arena_bytes(prog: &TestProgram) -> Vec<u8> {
    prog.arena().lock().unwrap().bytes_mut().to_vec()
}

fn fill_pattern(prog: &TestProgram) {
    let mem = prog.arena();
    let mut mem = mem.lock().unwrap();
    mem.bytes_mut()
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i * 7) as u8);
}

#[test]
fn every_arena_verdict_matches_the_reference_rule() {
    if !need_root("every_arena_verdict_matches_the_reference_rule") {
        return;
    }
    let prog = TestProgram::load_with_arena(PORT, &ring(), CHUNKS).expect("load");
    fill_pattern(&prog);
    let mut reference = arena_bytes(&prog);
    let k = keys_w();
    let ring = ring();
    let c = CHUNK_BYTES as u32;
    let (a0, b0) = (SLOT_A.0 as u32 * c, SLOT_B.0 as u32 * c);
    let geometry = Chunked {
        chunk_bytes: CHUNK_BYTES,
        chunks_max: ARENA_CHUNKS_MAX,
        chunks: CHUNKS as usize,
    };
    // (what, key, op, flags, offset, len); each sent by its own sender with op seq 1.
    let cases: Vec<(&str, ClientKey, u8, u16, u32, u32)> = vec![
        ("A writes its slot's first word", k.a, 2, 0, a0, 8),
        ("A writes its whole slot", k.a, 2, 0, a0, c),
        ("A writes inside its slot", k.a, 2, 0, a0 + 16, 512),
        ("B writes its second chunk", k.b, 2, 0, b0 + c + 8, 64),
        ("A writes B's slot", k.a, 2, 0, b0, 8),
        ("B writes A's slot", k.b, 2, 0, a0 + 8, 8),
        ("A writes below its slot", k.a, 2, 0, a0 - 8, 8),
        ("A writes across its slot's end", k.a, 2, 0, a0 + c - 8, 16),
        ("B writes across its two chunks", k.b, 2, 0, b0 + c - 8, 16),
        ("A writes unaligned", k.a, 2, 0, a0 + 4, 8),
        ("A writes nothing", k.a, 2, 0, a0, 0),
        (
            "A writes beyond the declared bound",
            k.a,
            2,
            0,
            u32::MAX - 7,
            8,
        ),
        ("A reads its own slot", k.a, 1, 0, a0, 8),
        ("A does CAS on its slot", k.a, 3, 0, a0, 8),
        ("A does FETCH-ADD on its slot", k.a, 4, 0, a0, 8),
        ("the reader writes", k.reader, 2, 0, a0, 8),
        ("the reader reads A's slot", k.reader, 1, 0, a0, 64),
        ("a control key writes the arena", keys().rw, 2, 0, a0, 8),
    ];
    for (i, (what, key, op, flags, offset, len)) in cases.into_iter().enumerate() {
        let sender = 0x1000 + i as u64;
        let r = req(&key, sender, op, flags, 1, offset, len, i as u8);
        let entry = ring.get(key.id).unwrap();
        let want = ops::check_arena(&r[ENVELOPE_BYTES..], &entry.rights, geometry, r.len());
        let got = run(&prog, &key, sender, &r).unwrap_or_else(|| panic!("{what}: answered"));
        match want {
            Ok(h) => {
                assert_eq!(got.status, Status::Ok, "{what}");
                if op == 2 {
                    let o = h.offset as usize;
                    let body = &r[ENVELOPE_BYTES + wire::REQ_HEADER_BYTES..];
                    reference[o..o + len as usize].copy_from_slice(&body[..len as usize]);
                    assert_eq!(got.len, 0, "{what}: a WRITE's reply carries nothing");
                } else {
                    assert_eq!(got.len, len, "{what}");
                }
            }
            Err((_, _, st)) => {
                assert_ne!(st, Status::Ok);
                assert_eq!(got.status, st, "{what}: the reference's refusal");
                assert_eq!(got.len, 0, "{what}: header-only refusal");
            }
        }
        assert_eq!(
            arena_bytes(&prog),
            reference,
            "{what}: memory as the reference"
        );
    }
    // A WRITE longer than a chunk is longer than the program authenticates at all
    // (RMEM_SIPHASH_BYTES_MAX): dropped unanswered.
    let r = req(&k.a, 0x2001, 2, 0, 1, a0, c + 8, 1);
    assert!(run(&prog, &k.a, 0x2001, &r).is_none(), "WRITE over a chunk");
    // A bulk WRITE is never allowed, even inside the slot.
    let r = req(&k.a, 0x2000, 2, FLAG_BULK, 1, a0, 8, 1);
    let got = run(&prog, &k.a, 0x2000, &r).unwrap();
    assert_eq!(got.status, Status::ReadOnly, "bulk WRITE");
    assert_eq!(arena_bytes(&prog), reference, "bulk WRITE stored nothing");
}

#[test]
fn a_repeated_write_replays_its_reply_and_a_copy_is_dropped() {
    if !need_root("a_repeated_write_replays_its_reply_and_a_copy_is_dropped") {
        return;
    }
    let prog = TestProgram::load_with_arena(PORT, &ring(), CHUNKS).expect("load");
    let k = keys_w();
    let a0 = (SLOT_A.0 * CHUNK_BYTES) as u32;
    let sender = 0x3000;
    // The seqlock writer's three phases: seq odd, record, seq even.
    let phases: [(u32, Vec<u8>); 3] = [
        (a0, 1u64.to_le_bytes().to_vec()),
        (a0 + 8, (0..64u8).collect()),
        (a0, 2u64.to_le_bytes().to_vec()),
    ];
    for (i, (offset, bytes)) in phases.iter().enumerate() {
        let b = seal(
            &k.a,
            sender,
            &covered(
                2,
                0,
                10 + i as u64,
                ARENA_REGION,
                *offset,
                bytes.len() as u32,
                bytes,
            ),
        );
        let h = run(&prog, &k.a, sender, &b).expect("answered");
        assert_eq!((h.status, h.seq), (Status::Ok, 10 + i as u64), "phase {i}");
    }
    let mem = arena_bytes(&prog);
    let o = a0 as usize;
    assert_eq!(mem[o..o + 8], 2u64.to_le_bytes());
    assert_eq!(mem[o + 8..o + 72], (0..64u8).collect::<Vec<_>>()[..]);

    // The owner rewrites word 0; a retry of the last WRITE (op seq 12, a new envelope)
    // is answered from the dedup record and not applied again.
    {
        let m = prog.arena();
        let mut m = m.lock().unwrap();
        m.bytes_mut()[o..o + 8].copy_from_slice(&7u64.to_le_bytes());
    }
    let retry = seal(
        &k.a,
        sender,
        &covered(
            2,
            wire::FLAG_RETRY,
            12,
            ARENA_REGION,
            a0,
            8,
            &2u64.to_le_bytes(),
        ),
    );
    let h = run(&prog, &k.a, sender, &retry).expect("replayed");
    assert_eq!((h.status, h.seq), (Status::Ok, 12));
    assert_eq!(
        arena_bytes(&prog)[o..o + 8],
        7u64.to_le_bytes(),
        "not applied again"
    );
    // An older op seq: a delayed duplicate, dropped unapplied.
    let old = seal(
        &k.a,
        sender,
        &covered(2, 0, 11, ARENA_REGION, a0 + 8, 8, &[0xee; 8]),
    );
    assert!(run(&prog, &k.a, sender, &old).is_none(), "stale: dropped");
    // The very same datagram again: the replay window drops it.
    assert!(
        run(&prog, &k.a, sender, &retry).is_none(),
        "a copy: dropped"
    );
    let after = arena_bytes(&prog);
    assert_eq!(after[o..o + 8], 7u64.to_le_bytes());
    assert_eq!(after[o + 8..o + 72], (0..64u8).collect::<Vec<_>>()[..]);
}
