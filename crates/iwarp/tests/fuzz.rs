//! Seeded fuzzing of everything that reads wire bytes: random and mutated input never
//! panics, and lengths claimed by the input are checked before anything is allocated
//! for them (a 65535-byte ULPDU_Length, a 65535-byte PD_Length or a 4 GiB pcap caplen
//! with a few bytes behind it is waited for or refused, never reserved).

mod common;

use common::rng::Rng;
use farside_iwarp::decode::decode_pcap;
use farside_iwarp::mpa::{self, Deframer, MpaConfig, RrFrame, RrKind, Setup};
use farside_iwarp::qp::{Qp, QpConfig};
use farside_iwarp::rdmap::{self, Opcode};
use farside_iwarp::verbs::{Access, Cq, Device};

const ROUNDS: u64 = 3000;

/// A valid FPDU stream to mutate.
fn valid_stream(r: &mut Rng, crc_on: bool) -> Vec<u8> {
    let mut wire = Vec::new();
    for i in 0..r.below(6) + 1 {
        let n = r.below(100) as usize;
        let payload = r.bytes(n);
        let u = rdmap::encode_ulpdu(
            Opcode::Send,
            true,
            farside_iwarp::ddp::Placement::Untagged {
                qn: 0,
                msn: i as u32 + 1,
                mo: 0,
            },
            0,
            &payload,
        );
        mpa::encode_fpdu(&u, crc_on, &mut wire);
    }
    wire
}

fn mutate(r: &mut Rng, mut b: Vec<u8>) -> Vec<u8> {
    for _ in 0..r.below(4) + 1 {
        if b.is_empty() {
            break;
        }
        let i = r.below(b.len() as u64) as usize;
        match r.below(4) {
            0 => b[i] ^= 1 << r.below(8),
            1 => b[i] = r.next_u64() as u8,
            2 => b.truncate(i),
            _ => b.insert(i, r.next_u64() as u8),
        }
    }
    b
}

#[test]
fn deframer_and_parsers_never_panic() {
    for seed in 0..ROUNDS {
        let mut r = Rng(seed);
        let crc_on = r.bool();
        let input = if r.bool() {
            let n = r.below(400) as usize;
            r.bytes(n)
        } else {
            let v = valid_stream(&mut r, crc_on);
            mutate(&mut r, v)
        };
        let mut d = Deframer::new(crc_on);
        for c in input.chunks(r.below(64) as usize + 1) {
            d.push(c);
            while let Ok(Some(f)) = d.next_fpdu() {
                let _ = rdmap::parse(&f.ulpdu);
                let _ = farside_iwarp::ddp::parse_lenient(&f.ulpdu);
            }
        }
        assert!(d.pending() <= input.len());
        let _ = rdmap::parse(&input);
        let _ = RrFrame::parse(RrKind::Request, &input);
        let _ = RrFrame::parse(RrKind::Reply, &input);
    }
}

#[test]
fn claimed_lengths_are_waited_for_or_refused() {
    // ULPDU_Length 65535 with 10 bytes behind it: wait, do not copy.
    let mut d = Deframer::new(true);
    d.push(&[0xff, 0xff, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(d.next_fpdu(), Ok(None));
    assert_eq!(d.pending(), 12);
    // PD_Length 65535: refused at once.
    let mut f = mpa::KEY_REQ.to_vec();
    f.extend_from_slice(&[0, 1, 0xff, 0xff]);
    assert!(RrFrame::parse(RrKind::Request, &f).is_err());
    let mut s = Setup::responder(MpaConfig::default());
    assert!(matches!(s.on_bytes(&f), mpa::SetupStep::Failed { .. }));
    // A pcap record claiming 4 GiB.
    let mut p = vec![
        0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0, 0,
    ];
    p.extend_from_slice(&[0; 8]);
    p.extend_from_slice(&u32::MAX.to_le_bytes());
    p.extend_from_slice(&u32::MAX.to_le_bytes());
    p.extend_from_slice(&[0; 40]);
    let e = decode_pcap(&p).unwrap_err();
    assert!(e.0.contains("caplen"), "{e}");
}

#[test]
fn queue_pair_survives_random_fpdus() {
    for seed in 0..ROUNDS / 3 {
        let mut r = Rng(seed);
        let crc_on = r.bool();
        let mut dev = Device::new(seed);
        let pd = dev.alloc_pd().unwrap();
        let _ = dev.reg_mr(
            pd,
            0,
            256,
            Access::REMOTE_WRITE | Access::REMOTE_READ | Access::LOCAL_WRITE,
        );
        let mut cq = Cq::new(64).unwrap();
        let cfg = QpConfig {
            mpa: MpaConfig {
                crc: crc_on,
                enhanced: false,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut qp = Qp::accept(pd, cfg);
        let mut req = RrFrame::new(RrKind::Request);
        req.crc = crc_on;
        qp.on_bytes(&mut dev, &mut cq, &req.encode());
        let _ = qp.take_tx(&dev, &mut cq);
        // Random ULPDUs with a valid MPA framing: every refusal path of the receiver.
        for _ in 0..r.below(8) + 1 {
            let n = r.below(60) as usize + 14;
            let mut u = r.bytes(n);
            u[0] = (u[0] & 0xc0) | 0x01; // mostly DV 1, to get past the version check
            if r.bool() {
                u[1] = 0x40 | (u[1] & 0x0f); // RV 1
            }
            let mut wire = Vec::new();
            mpa::encode_fpdu(&u, crc_on, &mut wire);
            qp.on_bytes(&mut dev, &mut cq, &mutate(&mut r, wire));
            let _ = qp.take_tx(&dev, &mut cq);
        }
    }
}

#[test]
fn decoder_survives_mutated_captures() {
    let Some(base) = common::testdata("uiwarp.pcap") else {
        return;
    };
    for seed in 0..ROUNDS / 3 {
        let mut r = Rng(seed);
        let input = mutate(&mut r, base.clone());
        let _ = decode_pcap(&input);
    }
}
