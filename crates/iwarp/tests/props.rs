//! Property round-trips over seeded random inputs: every header we write parses back
//! to what we wrote, and deframing does not depend on how TCP cut the stream.

mod common;

use common::rng::Rng;
use farside_iwarp::ddp::{self, Placement};
use farside_iwarp::mpa::{self, CrcVerdict, Deframer, IrdOrd, RrFrame, RrKind};
use farside_iwarp::rdmap::{self, Body, Opcode, ReadRequest, QN_SEND};
use farside_iwarp::term::TermCode;

const CASES: u64 = 2000;

fn random_message(r: &mut Rng) -> (Opcode, bool, Placement, u32, Vec<u8>) {
    let op = Opcode::from_u8(r.below(7) as u8).unwrap(); // not Terminate
    let last = r.bool();
    let placement = if op.is_tagged() {
        Placement::Tagged {
            stag: r.next_u64() as u32,
            to: r.next_u64(),
        }
    } else {
        Placement::Untagged {
            qn: op.qn().unwrap(),
            msn: r.next_u64() as u32,
            mo: r.next_u64() as u32,
        }
    };
    let inval = if matches!(op, Opcode::SendInv | Opcode::SendSeInv) {
        r.next_u64() as u32
    } else {
        0
    };
    let payload = if op == Opcode::ReadRequest {
        let mut b = Vec::new();
        ReadRequest {
            sink_stag: r.next_u64() as u32,
            sink_to: r.next_u64(),
            size: r.next_u64() as u32,
            source_stag: r.next_u64() as u32,
            source_to: r.next_u64(),
        }
        .encode(&mut b);
        b
    } else {
        let n = r.below(300) as usize;
        r.bytes(n)
    };
    (op, last, placement, inval, payload)
}

#[test]
fn every_message_round_trips_through_fpdu_and_parse() {
    for seed in 0..CASES {
        let mut r = Rng(seed);
        let (op, last, placement, inval, payload) = random_message(&mut r);
        let u = rdmap::encode_ulpdu(op, last, placement, inval, &payload);
        let crc_on = r.bool();
        let mut wire = Vec::new();
        mpa::encode_fpdu(&u, crc_on, &mut wire);
        assert_eq!(wire.len() % 4, 0, "seed {seed}: FPDUs are 4-byte aligned");
        let mut d = Deframer::new(crc_on);
        d.push(&wire);
        let f = d.next_fpdu().unwrap().unwrap();
        assert_eq!(
            f.crc,
            if crc_on {
                CrcVerdict::Good
            } else {
                CrcVerdict::Absent
            }
        );
        assert_eq!(f.ulpdu, u);
        let m = rdmap::parse(&f.ulpdu).unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
        assert_eq!(
            (m.opcode, m.ddp.last, m.placement, m.inval_stag),
            (op, last, placement, inval),
            "seed {seed}"
        );
        match m.body {
            Body::Data(d) => assert_eq!(d, &payload[..]),
            Body::ReadRequest(rr) => {
                let mut b = Vec::new();
                rr.encode(&mut b);
                assert_eq!(b, payload);
            }
            Body::Terminate(_) => panic!("no Terminate generated"),
        }
    }
}

#[test]
fn deframing_does_not_depend_on_segment_boundaries() {
    for seed in 0..200 {
        let mut r = Rng(seed);
        let crc_on = r.bool();
        let mut wire = Vec::new();
        let mut ulpdus = Vec::new();
        for _ in 0..r.below(20) + 1 {
            let (op, last, placement, inval, payload) = random_message(&mut r);
            let u = rdmap::encode_ulpdu(op, last, placement, inval, &payload);
            mpa::encode_fpdu(&u, crc_on, &mut wire);
            ulpdus.push(u);
        }
        let mut d = Deframer::new(crc_on);
        let mut got = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            let n = (r.below(97) as usize + 1).min(wire.len() - at);
            d.push(&wire[at..at + n]);
            at += n;
            while let Some(f) = d.next_fpdu().unwrap() {
                got.push(f.ulpdu);
            }
        }
        assert_eq!(got, ulpdus, "seed {seed}");
        assert_eq!(d.pending(), 0);
    }
}

#[test]
fn mpa_frames_round_trip() {
    for seed in 0..CASES {
        let mut r = Rng(seed);
        let mut f = RrFrame::new(if r.bool() {
            RrKind::Request
        } else {
            RrKind::Reply
        });
        f.markers = r.bool();
        f.crc = r.bool();
        f.reject = r.bool();
        f.enhanced = r.bool();
        f.reserved = r.below(16) as u8;
        f.rev = r.below(256) as u8;
        let n = r.below(mpa::PD_LENGTH_MAX as u64 + 1) as usize;
        f.private_data = r.bytes(n);
        let b = f.encode();
        let (g, used) = RrFrame::parse(f.kind, &b).unwrap().unwrap();
        assert_eq!((g, used), (f, b.len()), "seed {seed}");
        let io = IrdOrd {
            ird: r.below(0x4000) as u16,
            ord: r.below(0x4000) as u16,
            p2p: r.bool(),
            zero_len_rtr: r.bool(),
            write_rtr: r.bool(),
            read_rtr: r.bool(),
        };
        assert_eq!(IrdOrd::decode(&io.encode()), Some(io));
    }
}

#[test]
fn segments_reassemble_to_the_message() {
    for seed in 0..CASES {
        let mut r = Rng(seed);
        let len = r.below(5000) as usize;
        let mulpdu = ddp::UNTAGGED_HDR_LEN + 1 + r.below(1500) as usize;
        let tagged = r.bool();
        let first = if tagged {
            Placement::Tagged {
                stag: 7,
                to: r.next_u64() >> 1,
            }
        } else {
            Placement::Untagged {
                qn: QN_SEND,
                msn: 3,
                mo: 0,
            }
        };
        let plans = ddp::segments(first, len, mulpdu);
        let mut next = 0;
        for (i, p) in plans.iter().enumerate() {
            assert_eq!(p.range.start, next);
            assert_eq!(p.last, i == plans.len() - 1);
            let hdr = if tagged {
                ddp::TAGGED_HDR_LEN
            } else {
                ddp::UNTAGGED_HDR_LEN
            };
            assert!(hdr + p.range.len() <= mulpdu, "seed {seed}");
            match (first, p.placement) {
                (Placement::Tagged { to, .. }, Placement::Tagged { to: t, .. }) => {
                    assert_eq!(t, to + next as u64)
                }
                (Placement::Untagged { .. }, Placement::Untagged { mo, msn, .. }) => {
                    assert_eq!((mo as usize, msn), (next, 3))
                }
                _ => panic!("kind changed"),
            }
            next = p.range.end;
        }
        assert_eq!(next, len);
    }
}

#[test]
fn terminates_round_trip_with_their_flags() {
    let codes = [
        TermCode::DDP_T_INVALID_STAG,
        TermCode::DDP_T_BASE_BOUNDS,
        TermCode::DDP_UT_NO_BUFFER,
        TermCode::DDP_UT_VERSION,
        TermCode::RDMAP_ACCESS_RIGHTS,
        TermCode::RDMAP_OPCODE,
        TermCode::RDMAP_CATASTROPHIC_STREAM,
        TermCode::MPA_CRC,
    ];
    let refused = rdmap::encode_ulpdu(
        Opcode::Write,
        true,
        Placement::Tagged {
            stag: 0x1234,
            to: 9,
        },
        0,
        b"abc",
    );
    for code in codes {
        let att = rdmap::terminated_headers(code, &refused);
        let u = rdmap::encode_terminate(code, 1, &att);
        let m = rdmap::parse(&u).unwrap();
        let Body::Terminate(t) = m.body else { panic!() };
        assert_eq!(t.code, code);
        assert_eq!((t.m, t.d, t.r), rdmap::terminate_flags(code));
        if t.m {
            assert_eq!(t.ddp_segment_length(), Some(3));
            assert_eq!(&t.attached[2..], &refused[..ddp::TAGGED_HDR_LEN]);
        } else {
            assert!(t.attached.is_empty());
        }
    }
}
