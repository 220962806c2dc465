//! The golden frames of `golden-frames.md` (RFC layouts, CRC on), rebuilt byte for byte
//! by our encoders and parsed back field by field; the CRC32c vectors.

mod common;

use common::{hex, to_hex};
use farside_iwarp::crc;
use farside_iwarp::ddp::Placement;
use farside_iwarp::mpa::{self, CrcVerdict, Deframer, RrFrame, RrKind};
use farside_iwarp::rdmap::{self, Body, Opcode, ReadRequest};

const G_WRITE: &str = "001bc14000000102000000000000100068656c6c6f2c20695741525021000000468873d1";
const G_RREQ: &str = "002e41410000000000000001000000010000000000000203000000000000200000001000000001020000000000001000ca083bb7";
const G_SEND: &str = "0018414300000000000000000000000100000000444f4e450d0a00009bc4e2a8";
const G_SEND_NO_CRC: &str = "0018414300000000000000000000000100000000444f4e450d0a000000000000";

fn fpdu(ulpdu: &[u8], crc_on: bool) -> Vec<u8> {
    let mut out = Vec::new();
    mpa::encode_fpdu(ulpdu, crc_on, &mut out);
    out
}

fn g_write() -> Vec<u8> {
    let u = rdmap::encode_ulpdu(
        Opcode::Write,
        true,
        Placement::Tagged {
            stag: 0x102,
            to: 0x1000,
        },
        0,
        b"hello, iWARP!",
    );
    fpdu(&u, true)
}

fn g_rreq() -> Vec<u8> {
    let mut body = Vec::new();
    ReadRequest {
        sink_stag: 0x203,
        sink_to: 0x2000,
        size: 4096,
        source_stag: 0x102,
        source_to: 0x1000,
    }
    .encode(&mut body);
    let u = rdmap::encode_ulpdu(
        Opcode::ReadRequest,
        true,
        Placement::Untagged {
            qn: 1,
            msn: 1,
            mo: 0,
        },
        0,
        &body,
    );
    fpdu(&u, true)
}

fn g_send(crc_on: bool) -> Vec<u8> {
    let u = rdmap::encode_ulpdu(
        Opcode::Send,
        true,
        Placement::Untagged {
            qn: 0,
            msn: 1,
            mo: 0,
        },
        0,
        b"DONE\r\n",
    );
    fpdu(&u, crc_on)
}

#[test]
fn golden_frames_are_built_byte_for_byte() {
    assert_eq!(to_hex(&g_write()), G_WRITE);
    assert_eq!(to_hex(&g_rreq()), G_RREQ);
    assert_eq!(to_hex(&g_send(true)), G_SEND);
    assert_eq!(to_hex(&g_send(false)), G_SEND_NO_CRC);
}

#[test]
fn golden_frames_parse_field_by_field() {
    let mut d = Deframer::new(true);
    d.push(&hex(G_WRITE));
    d.push(&hex(G_RREQ));
    d.push(&hex(G_SEND));
    let w = d.next_fpdu().unwrap().unwrap();
    assert_eq!((w.pad, w.crc), (3, CrcVerdict::Good));
    let m = rdmap::parse(&w.ulpdu).unwrap();
    assert_eq!(m.opcode, Opcode::Write);
    assert!(m.ddp.tagged && m.ddp.last && m.ddp.dv == 1);
    assert_eq!(
        m.placement,
        Placement::Tagged {
            stag: 0x102,
            to: 0x1000
        }
    );
    assert_eq!(m.body, Body::Data(b"hello, iWARP!"));

    let r = d.next_fpdu().unwrap().unwrap();
    assert_eq!((r.pad, r.crc), (0, CrcVerdict::Good));
    let m = rdmap::parse(&r.ulpdu).unwrap();
    assert_eq!(m.opcode, Opcode::ReadRequest);
    assert_eq!(
        m.placement,
        Placement::Untagged {
            qn: 1,
            msn: 1,
            mo: 0
        }
    );
    let Body::ReadRequest(rr) = m.body else {
        panic!("not a Read Request")
    };
    assert_eq!(
        (
            rr.sink_stag,
            rr.sink_to,
            rr.size,
            rr.source_stag,
            rr.source_to
        ),
        (0x203, 0x2000, 4096, 0x102, 0x1000)
    );

    let s = d.next_fpdu().unwrap().unwrap();
    assert_eq!((s.pad, s.crc), (2, CrcVerdict::Good));
    let m = rdmap::parse(&s.ulpdu).unwrap();
    assert_eq!(m.opcode, Opcode::Send);
    assert_eq!(
        m.placement,
        Placement::Untagged {
            qn: 0,
            msn: 1,
            mo: 0
        }
    );
    assert_eq!(m.body, Body::Data(b"DONE\r\n"));
    assert_eq!(d.next_fpdu().unwrap(), None);
    assert_eq!(d.pending(), 0);
}

#[test]
fn one_flipped_byte_gives_a_bad_crc() {
    for i in 0..hex(G_SEND).len() {
        let mut b = hex(G_SEND);
        b[i] ^= 0x01;
        let mut d = Deframer::new(true);
        d.push(&b);
        match d.next_fpdu() {
            Ok(Some(f)) => assert_eq!(f.crc, CrcVerdict::Bad, "byte {i}"),
            // A flip in ULPDU_Length changes the framing instead.
            Ok(None) | Err(_) => assert!(i < 2, "byte {i}"),
        }
    }
}

#[test]
fn crc_off_is_absent_and_not_checked() {
    let mut d = Deframer::new(false);
    d.push(&hex(G_SEND)); // a real CRC is not checked either
    assert_eq!(d.next_fpdu().unwrap().unwrap().crc, CrcVerdict::Absent);
}

#[test]
fn mpa_request_and_reply_of_the_golden_stream() {
    let mut req = RrFrame::new(RrKind::Request);
    req.crc = true;
    assert_eq!(
        to_hex(&req.encode()),
        format!("{}40010000", to_hex(mpa::KEY_REQ))
    );
    let mut rep = RrFrame::new(RrKind::Reply);
    rep.crc = true;
    assert_eq!(
        to_hex(&rep.encode()),
        format!("{}40010000", to_hex(mpa::KEY_REP))
    );
}

/// The vectors are kept here too, so they run without the shared material.
const VECTORS: &[(&str, &str)] = &[
    ("0000000000000000000000000000000000000000000000000000000000000000", "aa36918a"),
    ("ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", "43aba862"),
    ("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", "4e79dd46"),
    ("1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100", "5cdb3f11"),
    ("01c000000000000000000000000000001400000000000400000000140000001828000000000000000200000000000000", "563a96d9"),
    ("313233343536373839", "839206e3"),
    ("", "00000000"),
];

#[test]
fn crc32c_vectors_in_wire_order() {
    for (input, wire) in VECTORS {
        assert_eq!(
            to_hex(&crc::to_wire(crc::crc32c(&hex(input)))),
            *wire,
            "{input}"
        );
    }
}

#[test]
fn crc32c_vectors_of_the_shared_file() {
    let Some(text) = common::testdata("crc32c-vectors.txt") else {
        return;
    };
    let text = String::from_utf8(text).unwrap();
    let mut n = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split('\t').collect();
        let input = if f[2] == "-" { Vec::new() } else { hex(f[2]) };
        assert_eq!(input.len(), f[1].parse::<usize>().unwrap(), "{}", f[0]);
        let c = crc::crc32c(&input);
        assert_eq!(format!("{c:#010x}"), f[3], "{}", f[0]);
        assert_eq!(to_hex(&crc::to_wire(c)), f[4], "{}", f[0]);
        n += 1;
    }
    assert_eq!(n, 10);
}

#[test]
fn golden_capture_is_rebuilt_byte_for_byte() {
    let Some(want) = common::testdata("golden-frames.pcap") else {
        return;
    };
    let a = "10.0.0.1:40000".parse().unwrap();
    let b = "10.0.0.2:7471".parse().unwrap();
    let mut w = farside_iwarp::pcap::ConversationWriter::new(a, b);
    let mut req = RrFrame::new(RrKind::Request);
    req.crc = true;
    let mut rep = RrFrame::new(RrKind::Reply);
    rep.crc = true;
    w.data(true, &req.encode());
    w.data(false, &rep.encode());
    w.data(true, &g_write());
    w.data(false, &g_rreq());
    w.data(true, &g_send(true));
    assert_eq!(to_hex(&w.finish()), to_hex(&want));
}
