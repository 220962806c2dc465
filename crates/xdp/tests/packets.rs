//! Packet tests through BPF_PROG_TEST_RUN, table-driven (Katran style): each case is a
//! description, an input frame and the expected verdict. Replies are checked for
//! swapped addresses, correct IP and UDP checksums, and their payload is compared
//! byte for byte with `farside_rmem::ops::execute` run on a copy of the region (the
//! reference semantics). Memory is compared with the reference after every case, so a
//! refused request that touched memory fails.

mod common;

use common::*;
use farside_region::{HeapWords, Words};
use farside_rmem::ops::{self, OpCounters};
use farside_rmem::wire::{self, ReqHeader, Status, ENVELOPE_BYTES, REQ_MAGIC};
use farside_rmem::{ClientKey, ServerKeys};
use farside_xdp::{action, TestProgram, XDP_READ_BYTES_MAX};
use std::sync::atomic::Ordering;

const PORT: u16 = 7077;
const SEQ: u64 = 0x0102_0304_0506_0708;

/// What the program must do with a case.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Whatever `ops::execute` does: reply (XDP_TX) with its bytes, or XDP_DROP for
    /// the silent statuses (the udp servers' rule).
    Reference,
    /// XDP-specific refusal (READ over XDP_READ_BYTES_MAX): reply with this status.
    Refused(Status),
    /// Not ours: XDP_PASS, frame unchanged.
    Pass,
    /// Ours but unanswerable (garbage to our port): XDP_DROP.
    Drop,
}

struct Case {
    what: &'static str,
    frame: Vec<u8>,
    expect: Expect,
}

fn k() -> &'static TestKeys {
    keys()
}

/// A sealed request (sender 0x5e). READs up to the XDP limit are padded to their
/// reply's size, as clients must (see `unpadded`).
fn req(op: u8, key: &ClientKey, region: u32, offset: u32, len: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = unpadded(op, key, region, offset, len, payload);
    if op == 1 && len as usize <= XDP_READ_BYTES_MAX {
        b.resize(
            b.len()
                .max(ENVELOPE_BYTES + wire::REP_HEADER_BYTES + len as usize),
            0,
        );
    }
    b
}

/// Every request of sender 0x5e gets the next op seq (a repeated one would be a retry
/// of a mutation, answered from the dedup record).
fn unpadded(
    op: u8,
    key: &ClientKey,
    region: u32,
    offset: u32,
    len: u32,
    payload: &[u8],
) -> Vec<u8> {
    static OP_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(SEQ);
    let seq = OP_SEQ.fetch_add(1, Ordering::Relaxed);
    seal(
        key,
        0x5e,
        &covered(op, 0, seq, region, offset, len, payload),
    )
}

/// A mutation of client (sender) `client` with op seq `seq` on word 40 (a lock word).
fn mutation(op: u8, client: u64, seq: u64, retry: bool, payload: &[u8]) -> Vec<u8> {
    let flags = if retry { wire::FLAG_RETRY } else { 0 };
    seal(
        &k().rw,
        client,
        &covered(op, flags, seq, 0, 320, 8, payload),
    )
}

fn to_us(payload: &[u8]) -> Vec<u8> {
    frame(Shape::to_port(PORT), payload)
}

fn cas_args(expected: u64, new: u64) -> Vec<u8> {
    let mut v = expected.to_le_bytes().to_vec();
    v.extend_from_slice(&new.to_le_bytes());
    v
}

/// Initial word i of the region: distinct, non-zero bytes everywhere.
fn pattern(i: usize) -> u64 {
    0x1111_1111_1111_1111u64.wrapping_mul(i as u64 + 1) ^ 0xa5
}

fn cases() -> Vec<Case> {
    let c = |what, frame, expect| Case {
        what,
        frame,
        expect,
    };
    let max = XDP_READ_BYTES_MAX as u32;
    let mut c_magic = covered(1, 0, SEQ, 0, 0, 8, &[]);
    c_magic[0] ^= 0xff;
    let bad_magic = seal(&k().ro, 0x5e, &c_magic);
    let mut c_version = covered(1, 0, SEQ, 0, 0, 8, &[]);
    c_version[4] = 2;
    let bad_version = seal(&k().ro, 0x5e, &c_version);
    let copied = req(4, &k().bal, 0, 8 * 48, 8, &1u64.to_le_bytes());
    let mut forged = req(4, &k().bal, 0, 8 * 48, 8, &1u64.to_le_bytes());
    forged[3] ^= 0x10;
    let with = |f: fn(&mut Shape), payload: &[u8]| {
        let mut s = Shape::to_port(PORT);
        f(&mut s);
        frame(s, payload)
    };
    let read8 = req(1, &k().ro, 0, 8, 8, &[]);
    vec![
        // Authentication, replay and rights (farside_auth).
        c(
            "a balancer's fetch-add by 1",
            to_us(&copied),
            Expect::Reference,
        ),
        c(
            "the same datagram again: a copy",
            to_us(&copied),
            Expect::Reference,
        ),
        c("a forged tag", to_us(&forged), Expect::Reference),
        c(
            "a balancer's fetch-add by 2",
            to_us(&req(4, &k().bal, 0, 8 * 48, 8, &2u64.to_le_bytes())),
            Expect::Reference,
        ),
        c(
            "a balancer's cas of the served role",
            to_us(&req(3, &k().bal, 0, 8 * 32, 8, &cas_args(0, 7))),
            Expect::Reference,
        ),
        c(
            "a balancer's cas of the wanted role",
            to_us(&req(3, &k().bal, 0, 8 * 34, 8, &cas_args(pattern(34), 7))),
            Expect::Reference,
        ),
        c(
            "a balancer's write of a lock",
            to_us(&req(2, &k().bal, 0, 8 * 40, 8, &[1; 8])),
            Expect::Reference,
        ),
        c(
            "a reader's cas of a lock",
            to_us(&req(3, &k().ro, 0, 8 * 40, 8, &cas_args(pattern(40), 7))),
            Expect::Reference,
        ),
        c(
            "a reader's write of a lock",
            to_us(&req(2, &k().ro, 0, 8 * 40, 8, &[1; 8])),
            Expect::Reference,
        ),
        c(
            "a write of the role error",
            to_us(&req(2, &k().rw, 0, 8 * 35, 8, &[1; 8])),
            Expect::Reference,
        ),
        // Operations.
        c("read 8 bytes", to_us(&read8), Expect::Reference),
        c(
            "read 192 bytes",
            to_us(&req(1, &k().ro, 0, 64, 192, &[])),
            Expect::Reference,
        ),
        c(
            "read the XDP maximum",
            to_us(&req(1, &k().ro, 0, 8, max, &[])),
            Expect::Reference,
        ),
        c(
            "read the last word",
            to_us(&req(1, &k().ro, 0, 4088, 8, &[])),
            Expect::Reference,
        ),
        c(
            "write 8 bytes",
            to_us(&req(2, &k().rw, 0, 272, 8, &7u64.to_le_bytes())),
            Expect::Reference,
        ),
        c(
            "write the locks and counters",
            to_us(&req(2, &k().rw, 0, 288, 224, &[0x5a; 224])),
            Expect::Reference,
        ),
        c(
            "read back the write",
            to_us(&req(1, &k().rw, 0, 248, 272, &[])),
            Expect::Reference,
        ),
        c(
            "cas that wins",
            to_us(&req(
                3,
                &k().rw,
                0,
                328,
                8,
                &cas_args(0x5a5a_5a5a_5a5a_5a5a, 99),
            )),
            Expect::Reference,
        ),
        c(
            "cas that loses",
            to_us(&req(
                3,
                &k().rw,
                0,
                264,
                8,
                &cas_args(0x5a5a_5a5a_5a5a_5a5a, 100),
            )),
            Expect::Reference,
        ),
        c(
            "fetch-add",
            to_us(&req(4, &k().rw, 0, 288, 8, &5u64.to_le_bytes())),
            Expect::Reference,
        ),
        c(
            "fetch-add wraps",
            to_us(&req(4, &k().rw, 0, 288, 8, &u64::MAX.to_le_bytes())),
            Expect::Reference,
        ),
        c(
            "read with a read-write key",
            to_us(&req(1, &k().rw, 0, 16, 24, &[])),
            Expect::Reference,
        ),
        c(
            "request without UDP checksum",
            with(|s| s.no_udp_checksum = true, &read8),
            Expect::Reference,
        ),
        c(
            "Ethernet padding after the datagram",
            with(|s| s.trailer = 20, &read8),
            Expect::Reference,
        ),
        // Exactly once: client 0xc1's mutations, retries, duplicates (the reference runs
        // the same sequence through ops::Dedup).
        c(
            "fetch-add of a new client",
            to_us(&mutation(4, 0xc1, 10, false, &3u64.to_le_bytes())),
            Expect::Reference,
        ),
        c(
            "its retry: replayed, not added again",
            to_us(&mutation(4, 0xc1, 10, true, &3u64.to_le_bytes())),
            Expect::Reference,
        ),
        c(
            "a plain duplicate: replayed too",
            to_us(&mutation(4, 0xc1, 10, false, &3u64.to_le_bytes())),
            Expect::Reference,
        ),
        c(
            "the next cas",
            to_us(&mutation(
                3,
                0xc1,
                11,
                false,
                &cas_args(0x5a5a_5a5a_5a5a_5a5a + 3, 7),
            )),
            Expect::Reference,
        ),
        c(
            "its retry reports the win",
            to_us(&mutation(
                3,
                0xc1,
                11,
                true,
                &cas_args(0x5a5a_5a5a_5a5a_5a5a + 3, 7),
            )),
            Expect::Reference,
        ),
        c(
            "a delayed duplicate of seq 10: dropped",
            to_us(&mutation(4, 0xc1, 10, false, &3u64.to_le_bytes())),
            Expect::Reference,
        ),
        c(
            "a write of the same client",
            to_us(&mutation(2, 0xc1, 12, false, &9u64.to_le_bytes())),
            Expect::Reference,
        ),
        c(
            "its retry: replayed",
            to_us(&mutation(2, 0xc1, 12, true, &9u64.to_le_bytes())),
            Expect::Reference,
        ),
        c(
            "a delayed older write: dropped, the newer value stays",
            to_us(&mutation(2, 0xc1, 11, false, &1u64.to_le_bytes())),
            Expect::Reference,
        ),
        c(
            "a retry from a client never seen: unknown",
            to_us(&mutation(4, 0xc2, 1, true, &1u64.to_le_bytes())),
            Expect::Reference,
        ),
        // Refusals answered with a status.
        c(
            "write over the header",
            to_us(&req(2, &k().rw, 0, 0, 8, &[1; 8])),
            Expect::Reference,
        ),
        c(
            "cas on the load record",
            to_us(&req(3, &k().rw, 0, 8 * 13, 8, &cas_args(0, 1))),
            Expect::Reference,
        ),
        c(
            "fetch-add in scratch",
            to_us(&req(4, &k().rw, 0, 512, 8, &[1; 8])),
            Expect::Reference,
        ),
        c(
            "write running past the control words",
            to_us(&req(2, &k().rw, 0, 504, 16, &[1; 16])),
            Expect::Reference,
        ),
        c(
            "write of the whole control area",
            to_us(&req(2, &k().rw, 0, 256, 256, &[1; 256])),
            Expect::Reference,
        ),
        c(
            "unpadded read",
            to_us(&unpadded(1, &k().ro, 0, 0, 192, &[])),
            Expect::Reference,
        ),
        c(
            "unknown op 9",
            to_us(&req(9, &k().ro, 0, 0, 8, &[])),
            Expect::Reference,
        ),
        c(
            "op 0",
            to_us(&req(0, &k().ro, 0, 0, 8, &[])),
            Expect::Reference,
        ),
        c(
            "region 1",
            to_us(&req(1, &k().ro, 1, 0, 8, &[])),
            Expect::Reference,
        ),
        c(
            "zero-length read",
            to_us(&req(1, &k().ro, 0, 0, 0, &[])),
            Expect::Reference,
        ),
        c(
            "zero-length write",
            to_us(&req(2, &k().rw, 0, 0, 0, &[])),
            Expect::Reference,
        ),
        c(
            "atomic of 16 bytes",
            to_us(&req(4, &k().rw, 0, 8, 16, &[1; 8])),
            Expect::Reference,
        ),
        c(
            "cas of 0 bytes",
            to_us(&req(3, &k().rw, 0, 8, 0, &cas_args(0, 1))),
            Expect::Reference,
        ),
        c(
            "unaligned offset",
            to_us(&req(1, &k().ro, 0, 4, 8, &[])),
            Expect::Reference,
        ),
        c(
            "unaligned len",
            to_us(&req(1, &k().ro, 0, 0, 12, &[])),
            Expect::Reference,
        ),
        c(
            "unaligned write",
            to_us(&req(2, &k().rw, 0, 0, 12, &[1; 12])),
            Expect::Reference,
        ),
        c(
            "unaligned fetch-add",
            to_us(&req(4, &k().rw, 0, 12, 8, &[1; 8])),
            Expect::Reference,
        ),
        c(
            "read past the end",
            to_us(&req(1, &k().ro, 0, 4088, 16, &[])),
            Expect::Reference,
        ),
        c(
            "offset near u32::MAX",
            to_us(&req(1, &k().ro, 0, 0xffff_fff8, 8, &[])),
            Expect::Reference,
        ),
        c(
            "write past the end",
            to_us(&req(2, &k().rw, 0, 4064, 64, &[3; 64])),
            Expect::Reference,
        ),
        c(
            "cas past the end",
            to_us(&req(3, &k().rw, 0, 4096, 8, &cas_args(0, 1))),
            Expect::Reference,
        ),
        c(
            "write with a read-only key",
            to_us(&req(2, &k().ro, 0, 8, 8, &[1; 8])),
            Expect::Reference,
        ),
        c(
            "cas with a read-only key",
            to_us(&req(3, &k().ro, 0, 24, 8, &cas_args(99, 1))),
            Expect::Reference,
        ),
        c(
            "fetch-add with a read-only key",
            to_us(&req(4, &k().ro, 0, 32, 8, &[1; 8])),
            Expect::Reference,
        ),
        c(
            "read over the XDP maximum",
            to_us(&req(1, &k().ro, 0, 0, max + 8, &[])),
            Expect::Refused(Status::BadLength),
        ),
        c(
            "read of the whole region",
            to_us(&req(1, &k().ro, 0, 0, 4096, &[])),
            Expect::Refused(Status::BadLength),
        ),
        // Dropped without a reply.
        c(
            "unknown key",
            to_us(&req(1, &k().stranger, 0, 0, 8, &[])),
            Expect::Reference,
        ),
        c(
            "unknown key with a bad op",
            to_us(&req(9, &k().stranger, 0, 0, 8, &[])),
            Expect::Reference,
        ),
        c("truncated header", to_us(&read8[..20]), Expect::Reference),
        c("empty datagram", to_us(&[]), Expect::Reference),
        c("wrong magic", to_us(&bad_magic), Expect::Reference),
        c("wrong version", to_us(&bad_version), Expect::Reference),
        c(
            "cas payload truncated",
            to_us(&req(3, &k().rw, 0, 8, 8, &[0; 8])),
            Expect::Reference,
        ),
        c(
            "write payload truncated",
            to_us(&req(2, &k().rw, 0, 8, 16, &[1; 8])),
            Expect::Reference,
        ),
        c(
            "fetch-add without payload",
            to_us(&req(4, &k().rw, 0, 8, 8, &[])),
            Expect::Reference,
        ),
        c(
            "huge write, short payload",
            to_us(&req(2, &k().rw, 0, 0, 8192, &[1; 64])),
            Expect::Reference,
        ),
        c("garbage to our port", to_us(&[0x42; 100]), Expect::Drop),
        // Not ours: passed to the stack unchanged.
        c(
            "other port",
            frame(Shape::to_port(PORT + 1), &read8),
            Expect::Pass,
        ),
        c("TCP", with(|s| s.proto = 6, &read8), Expect::Pass),
        c(
            "ARP ethertype",
            with(|s| s.ethertype = 0x0806, &read8),
            Expect::Pass,
        ),
        c(
            "IPv6 ethertype",
            with(|s| s.ethertype = 0x86dd, &read8),
            Expect::Pass,
        ),
        c(
            "IP options",
            with(|s| s.ip_option_words = 1, &read8),
            Expect::Pass,
        ),
        c(
            "first fragment (MF)",
            with(|s| s.frag_off = 0x2000, &read8),
            Expect::Pass,
        ),
        c(
            "later fragment (offset)",
            with(|s| s.frag_off = 0x0010, &read8),
            Expect::Pass,
        ),
        c(
            "UDP length beyond IP length",
            with(|s| s.udp_len_extra = 8, &read8),
            Expect::Pass,
        ),
        c(
            "UDP length under 8",
            with(|s| s.udp_len_extra = -68 /* 72 -> 4 */, &read8),
            Expect::Pass,
        ),
        c(
            "truncated IP packet",
            to_us(&read8)[..60].to_vec(),
            Expect::Pass,
        ),
        c(
            "garbage frame",
            (0..64u8).map(|i| i.wrapping_mul(37)).collect(),
            Expect::Pass,
        ),
        c("bare Ethernet header", vec![0xff; 14], Expect::Pass),
        c("IP header only", to_us(&read8)[..34].to_vec(), Expect::Pass),
    ]
}

/// The UDP payload of a frame built by `frame` (no IP options, no trailer).
fn payload_of(frame: &[u8]) -> &[u8] {
    let tot = u16::from_be_bytes([frame[16], frame[17]]) as usize;
    &frame[42..14 + tot]
}

fn snapshot(w: &dyn Words) -> Vec<u64> {
    w.words().iter().map(|a| a.load(Ordering::SeqCst)).collect()
}

#[test]
fn every_case_matches_the_reference_semantics() {
    if !need_root("every_case_matches_the_reference_semantics") {
        return;
    }
    let prog = TestProgram::load(PORT, &keyring()).expect("load");
    let region = prog.region();
    for (i, w) in region.words().iter().enumerate() {
        w.store(pattern(i), Ordering::SeqCst);
    }
    let reference = HeapWords::new(512);
    for (i, w) in reference.words().iter().enumerate() {
        w.store(pattern(i), Ordering::SeqCst);
    }
    let keys = ServerKeys::new(keyring());
    let ref_counters = OpCounters::default();
    let ref_dedup = ops::Dedup::new();
    let mut extra_ops = [0u64; 5];
    let mut extra_status = [0u64; wire::STATUS_COUNT];
    let mut ref_reply = Vec::new();

    for case in cases() {
        let what = case.what;
        let before = snapshot(&*region);
        let (verdict, out) = prog.run(&case.frame);
        match case.expect {
            Expect::Pass => {
                assert_eq!(verdict, action::PASS, "{what}: verdict");
                assert_eq!(out, case.frame, "{what}: passed frame must be unchanged");
            }
            Expect::Drop => {
                assert_eq!(verdict, action::DROP, "{what}: verdict");
                extra_ops[0] += 1;
                extra_status[Status::BadKey as usize] += 1;
            }
            Expect::Refused(st) => {
                assert_eq!(verdict, action::TX, "{what}: verdict");
                let got = check_reply(what, &case.frame, &out, PORT);
                let p = payload_of(&case.frame);
                let h = ReqHeader::decode(&p[ENVELOPE_BYTES..]).unwrap();
                let mut want = vec![0u8; ENVELOPE_BYTES];
                wire::RepHeader {
                    op: h.op,
                    status: st,
                    seq: h.seq,
                    len: 0,
                }
                .encode(&mut want);
                let env = farside_auth::mac::parse(p).unwrap().envelope;
                let key = keyring().get(env.key_id).unwrap().key;
                farside_rmem::auth::seal_reply_in_place(&mut want, &key, &env);
                assert_eq!(got, want, "{what}: reply bytes");
                extra_ops[h.op as usize] += 1;
                extra_status[st as usize] += 1;
            }
            Expect::Reference => {
                let st = ops::execute(
                    reference.words(),
                    &keys,
                    &ref_counters,
                    &ref_dedup,
                    true,
                    payload_of(&case.frame),
                    &mut ref_reply,
                );
                if ops::silent(st) {
                    assert_eq!(verdict, action::DROP, "{what}: verdict (reference {st:?})");
                } else {
                    assert_eq!(verdict, action::TX, "{what}: verdict (reference {st:?})");
                    let got = check_reply(what, &case.frame, &out, PORT);
                    assert_eq!(got, ref_reply, "{what}: reply bytes (reference {st:?})");
                    assert_eq!(
                        got[16..32],
                        payload_of(&case.frame)[16..32],
                        "{what}: the request's sender and seq echoed"
                    );
                    let rep = &got[ENVELOPE_BYTES..];
                    assert_eq!(
                        u64::from_le_bytes(rep[8..16].try_into().unwrap()),
                        ReqHeader::decode(&payload_of(&case.frame)[ENVELOPE_BYTES..])
                            .unwrap()
                            .seq,
                        "{what}: op seq echoed"
                    );
                }
                if st != Status::Ok {
                    assert_eq!(
                        snapshot(&*region),
                        before,
                        "{what}: refused request touched memory"
                    );
                }
            }
        }
        if case.expect != Expect::Reference {
            assert_eq!(snapshot(&*region), before, "{what}: memory changed");
        }
        assert_eq!(
            snapshot(&*region),
            snapshot(&reference),
            "{what}: memory differs from the reference"
        );
    }

    let (ops, status) = prog.counters();
    for i in 0..5 {
        assert_eq!(
            ops[i],
            ref_counters.ops[i].load(Ordering::Relaxed) + extra_ops[i],
            "ops counter {i}"
        );
    }
    for i in 0..wire::STATUS_COUNT {
        assert_eq!(
            status[i],
            ref_counters.status[i].load(Ordering::Relaxed) + extra_status[i],
            "status counter {i} ({})",
            Status::ALL[i].name()
        );
    }
    assert_eq!(prog.aborted(), 0, "no reply failed to build");
}

#[test]
fn a_program_without_keys_drops_everything_of_ours() {
    if !need_root("a_program_without_keys_drops_everything_of_ours") {
        return;
    }
    let empty = farside_auth::keys::Keyring::new(farside_auth::keys::Policy::Production);
    let prog = TestProgram::load(PORT, &empty).expect("load");
    let (v, _) = prog.run(&to_us(&req(1, &k().ro, 0, 0, 8, &[])));
    assert_eq!(v, action::DROP);
    let (v, _) = prog.run(&frame(
        Shape::to_port(PORT + 1),
        &req(1, &k().ro, 0, 0, 8, &[]),
    ));
    assert_eq!(v, action::PASS);
    let (_, status) = prog.counters();
    assert_eq!(status[Status::BadKey as usize], 1);
}

#[test]
fn read_sees_plain_stores_and_atomics_are_visible_to_user_space() {
    if !need_root("read_sees_plain_stores_and_atomics_are_visible_to_user_space") {
        return;
    }
    let prog = TestProgram::load(PORT, &keyring()).expect("load");
    let region = prog.region();
    region.words()[100].store(41, Ordering::Release);
    region.words()[50].store(41, Ordering::Release);
    let (v, out) = prog.run(&to_us(&req(4, &k().rw, 0, 400, 8, &1u64.to_le_bytes())));
    assert_eq!(v, action::TX);
    let rep = check_reply(
        "fadd",
        &to_us(&req(4, &k().rw, 0, 400, 8, &1u64.to_le_bytes())),
        &out,
        PORT,
    );
    assert_eq!(wire::u64_at(&rep, ENVELOPE_BYTES + 24), 41);
    assert_eq!(region.words()[50].load(Ordering::Acquire), 42);
    let (v, out) = prog.run(&to_us(&req(1, &k().rw, 0, 800, 8, &[])));
    assert_eq!(v, action::TX);
    let rep = check_reply("read", &to_us(&req(1, &k().rw, 0, 800, 8, &[])), &out, PORT);
    assert_eq!(
        wire::u64_at(&rep, ENVELOPE_BYTES + 24),
        41,
        "a plain store seen by a READ"
    );
    assert_eq!(REQ_MAGIC, u32::from_le_bytes(*b"FSRM"));
}

#[test]
fn datagrams_to_another_address_are_passed_not_answered() {
    if !need_root("datagrams_to_another_address_are_passed_not_answered") {
        return;
    }
    let mut prog = TestProgram::load(PORT, &keyring()).expect("load");
    // A new request each time (the same datagram again would be a copy).
    let read = || to_us(&req(1, &k().ro, 0, 0, 8, &[]));
    assert_eq!(
        prog.run(&read()).0,
        action::TX,
        "any address until one is set"
    );
    prog.set_node_addr(Some(IP_SERVER.into())).unwrap();
    assert_eq!(prog.run(&read()).0, action::TX, "to the node's address");
    let read = read();
    prog.set_node_addr(Some([10, 0, 0, 9].into())).unwrap();
    let (v, out) = prog.run(&read);
    assert_eq!(v, action::PASS, "to another host's address");
    assert_eq!(out, read);
}

/// The group of the group-read tests and a frame to it (its multicast MAC and address).
const GROUP: [u8; 4] = [239, 1, 2, 3];

fn to_group(payload: &[u8]) -> Vec<u8> {
    frame_to(Shape::to_port(PORT), payload, group_mac(GROUP), GROUP)
}

/// A program serving `RO` and `RW`, the node at IP_SERVER / MAC_SERVER, group on.
fn group_program() -> TestProgram {
    let mut prog = TestProgram::load(PORT, &keyring()).expect("load");
    prog.set_node_addr(Some(IP_SERVER.into())).unwrap();
    prog.set_group_read(Some(GROUP.into()), MAC_SERVER).unwrap();
    prog
}

#[test]
fn a_group_read_is_answered_from_the_nodes_own_address_and_mac() {
    if !need_root("a_group_read_is_answered_from_the_nodes_own_address_and_mac") {
        return;
    }
    // The unicast twin of each group READ goes to a second program (the same
    // datagram twice to one program would be a copy).
    let (prog, twin) = (group_program(), group_program());
    prog.region().words()[3].store(0x77, Ordering::Release);
    twin.region().words()[3].store(0x77, Ordering::Release);
    for (what, payload) in [
        (
            "read of the monitor's size",
            req(1, &k().ro, 0, 0, 288, &[]),
        ),
        ("read with a read-write key", req(1, &k().rw, 0, 16, 8, &[])),
        ("refused read (unaligned)", req(1, &k().ro, 0, 0, 12, &[])),
    ] {
        let group = to_group(&payload);
        let unicast = to_us(&payload);
        let (v, out) = prog.run(&group);
        assert_eq!(v, action::TX, "{what}");
        // Byte for byte the unicast reply: from IP_SERVER / MAC_SERVER / PORT to the
        // client, checksums over the node's address.
        let (_, want) = twin.run(&unicast);
        assert_eq!(out, want, "{what}: the unicast reply");
        check_reply(what, &unicast, &out, PORT);
    }
    let (_, out) = prog.run(&to_group(&req(1, &k().ro, 0, 24, 8, &[])));
    let rep = check_reply("read", &to_us(&req(1, &k().ro, 0, 24, 8, &[])), &out, PORT);
    assert_eq!(wire::u64_at(&rep, ENVELOPE_BYTES + 24), 0x77);
    // The key check is unchanged: an unknown key gets nothing.
    assert_eq!(
        prog.run(&to_group(&req(1, &k().stranger, 0, 0, 8, &[]))).0,
        action::DROP
    );
}

#[test]
fn group_writes_and_atomics_are_dropped_and_touch_nothing() {
    if !need_root("group_writes_and_atomics_are_dropped_and_touch_nothing") {
        return;
    }
    let prog = group_program();
    let region = prog.region();
    region.words()[40].store(5, Ordering::Release);
    let before: Vec<u64> = region
        .words()
        .iter()
        .map(|w| w.load(Ordering::Acquire))
        .collect();
    for (what, payload) in [
        ("write", req(2, &k().rw, 0, 320, 8, &9u64.to_le_bytes())),
        (
            "cas",
            req(
                3,
                &k().rw,
                0,
                320,
                8,
                &[5u64.to_le_bytes(), 6u64.to_le_bytes()].concat(),
            ),
        ),
        ("fadd", req(4, &k().rw, 0, 320, 8, &1u64.to_le_bytes())),
        ("unknown op", req(9, &k().rw, 0, 320, 8, &[])),
    ] {
        let (v, _) = prog.run(&to_group(&payload));
        assert_eq!(v, action::DROP, "group {what}");
        // The same to the node's own address is applied (the test's control).
        assert_ne!(prog.run(&to_us(&payload)).0, action::DROP, "unicast {what}");
    }
    // Only the unicast ones changed memory: replay them on the reference.
    let after: Vec<u64> = region
        .words()
        .iter()
        .map(|w| w.load(Ordering::Acquire))
        .collect();
    assert_eq!(
        after[40],
        9 + 1,
        "write 9 (the cas expected 5: no swap), fadd 1"
    );
    assert_eq!(before[..40], after[..40]);
}

#[test]
fn group_reads_are_passed_when_off_unconfigured_or_not_to_the_group_mac() {
    if !need_root("group_reads_are_passed_when_off_unconfigured_or_not_to_the_group_mac") {
        return;
    }
    let read = to_group(&req(1, &k().ro, 0, 0, 8, &[]));
    let pass = |prog: &TestProgram, f: &[u8], what: &str| {
        let (v, out) = prog.run(f);
        assert_eq!(v, action::PASS, "{what}");
        assert_eq!(out, f, "{what}: frame unchanged");
    };
    let mut prog = group_program();
    assert_eq!(prog.run(&read).0, action::TX, "on and configured");
    // The group's address in a frame to the node's own MAC (or another group's).
    pass(
        &prog,
        &frame_to(
            Shape::to_port(PORT),
            &req(1, &k().ro, 0, 0, 8, &[]),
            MAC_SERVER,
            GROUP,
        ),
        "unicast MAC",
    );
    pass(
        &prog,
        &frame_to(
            Shape::to_port(PORT),
            &req(1, &k().ro, 0, 0, 8, &[]),
            group_mac([239, 1, 2, 4]),
            GROUP,
        ),
        "another group's MAC",
    );
    // Reply source unknown: the node's MAC, then its address.
    prog.set_group_read(Some(GROUP.into()), [0; 6]).unwrap();
    pass(&prog, &read, "no node MAC");
    prog.set_group_read(Some(GROUP.into()), MAC_SERVER).unwrap();
    prog.set_node_addr(None).unwrap();
    pass(&prog, &read, "no node address");
    // Off.
    prog.set_node_addr(Some(IP_SERVER.into())).unwrap();
    prog.set_group_read(None, MAC_SERVER).unwrap();
    pass(&prog, &read, "group reads off");
    // Off by default.
    let fresh = TestProgram::load(PORT, &keyring()).expect("load");
    pass(&fresh, &read, "a fresh program");
    // Only a multicast group can be configured.
    assert!(prog
        .set_group_read(Some([10, 0, 0, 1].into()), MAC_SERVER)
        .is_err());
}

/// Rotation in the kernel: a balancer's new key (another id) verifies beside the
/// current one; once the old id is revoked, requests under it get no reply, and the
/// new key keeps working. Rights follow each key.
#[test]
fn a_rotated_key_verifies_beside_the_old_one_until_revoked() {
    if !need_root("a_rotated_key_verifies_beside_the_old_one_until_revoked") {
        return;
    }
    let mut ring = keyring();
    let new = ClientKey::new(farside_auth::mac::KeyId(12), *k().stranger.key());
    ring.install(
        "balancer",
        new.id,
        *new.key(),
        farside_rmem::Role::Balancer.rights(),
    )
    .unwrap();
    let mut prog = TestProgram::load(PORT, &ring).expect("load");
    let fadd = |key: &ClientKey| to_us(&req(4, key, 0, 8 * 48, 8, &1u64.to_le_bytes()));
    assert_eq!(prog.run(&fadd(&k().bal)).0, action::TX, "the old key");
    assert_eq!(prog.run(&fadd(&new)).0, action::TX, "the new key");
    assert!(prog.revoke_key(k().bal.id.0).unwrap());
    assert_eq!(prog.run(&fadd(&k().bal)).0, action::DROP, "revoked");
    assert_eq!(prog.run(&fadd(&new)).0, action::TX, "the new key still");
    assert_eq!(prog.region().words()[48].load(Ordering::Acquire), 3);
    // The new key's rights are a balancer's: no write of the served role.
    let (v, out) = prog.run(&to_us(&req(3, &new, 0, 8 * 32, 8, &cas_args(0, 1))));
    assert_eq!(v, action::TX);
    let rep = check_reply(
        "cas",
        &to_us(&req(3, &new, 0, 8 * 32, 8, &cas_args(0, 1))),
        &out,
        PORT,
    );
    let body = farside_rmem::auth::open_reply(&rep, &new, 0x5e, 1..=u64::MAX).unwrap();
    assert_eq!(
        wire::RepHeader::decode(body).unwrap().status,
        Status::Protected
    );
}
