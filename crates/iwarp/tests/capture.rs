//! The real captures of `shared/testdata/iwarp` (SoftUiWarp against Linux siw), parsed
//! and refused exactly as its README says.

mod common;

use farside_iwarp::decode::decode_pcap;
use farside_iwarp::mpa::{Deframer, RrFrame, RrKind};
use farside_iwarp::pcap;
use farside_iwarp::qp::{Qp, QpConfig, QpState};
use farside_iwarp::rdmap::{self, Body, Opcode};
use farside_iwarp::term::TermCode;
use farside_iwarp::verbs::{Cq, Device};
use serde_json::Value;

fn lines(file: &str) -> Option<Vec<Value>> {
    let bytes = common::testdata(file)?;
    let d = decode_pcap(&bytes).expect("decodes");
    assert!(d.failures.is_empty(), "{:?}", d.failures);
    Some(d.lines)
}

fn client_server_streams(file: &[u8]) -> (pcap::Stream, pcap::Stream) {
    let segs = pcap::read_tcp_segments(file).unwrap();
    let streams = pcap::reassemble(&segs).unwrap();
    let c2s = streams
        .iter()
        .find(|(k, _)| k.0.port() != 9999)
        .map(|(_, s)| s.clone())
        .unwrap();
    let s2c = streams
        .iter()
        .find(|(k, _)| k.0.port() == 9999)
        .map(|(_, s)| s.clone())
        .unwrap();
    (c2s, s2c)
}

#[test]
fn uiwarp_capture_decodes_frame_by_frame() {
    let Some(l) = lines("uiwarp.pcap") else {
        return;
    };
    let summary: Vec<(u64, &str, &str)> = l
        .iter()
        .map(|v| {
            (
                v["frame"].as_u64().unwrap(),
                v["direction"].as_str().unwrap(),
                v["kind"].as_str().unwrap(),
            )
        })
        .collect();
    let i2r = "initiator_to_responder";
    let r2i = "responder_to_initiator";
    assert_eq!(
        summary,
        vec![
            (4, i2r, "mpa_request"),
            (6, r2i, "mpa_reply"),
            (8, i2r, "send"),
            (9, i2r, "send"),
            (10, r2i, "read_request"),
            (12, i2r, "send"),
            (13, i2r, "send"),
        ]
    );
    for v in &l {
        assert!(v.get("refused").is_none(), "{v}");
    }
    for (v, msn) in [(&l[2], 1), (&l[3], 2), (&l[5], 3), (&l[6], 4)] {
        assert_eq!(v["ulpdu_length"], 34);
        assert_eq!(v["pad"], 0);
        assert_eq!(v["crc"], "absent");
        assert_eq!(v["ddp_control"], 0x41);
        assert_eq!(v["rdmap_control"], 0x43);
        assert_eq!(
            (v["qn"].as_u64(), v["msn"].as_u64(), v["mo"].as_u64()),
            (Some(0), Some(msn), Some(0))
        );
        assert_eq!(v["payload_length"], 16);
    }
    let rr = &l[4];
    assert_eq!(rr["ulpdu_length"], 46);
    assert_eq!(
        (rr["qn"].as_u64(), rr["msn"].as_u64(), rr["mo"].as_u64()),
        (Some(1), Some(1), Some(0))
    );
    assert_eq!(rr["sink_stag"], 0x40cc_4300u64);
    assert_eq!(rr["sink_to"], 0x0000_5636_16bb_c670u64);
    assert_eq!(rr["size"], 64);
    assert_eq!(rr["source_stag"], 0xffff_e080u64);
    assert_eq!(rr["source_to"], 0x0000_7fff_ffff_e080u64);
    for v in &l[..2] {
        assert_eq!(
            (v["m"].as_bool(), v["c"].as_bool(), v["r"].as_bool()),
            (Some(false), Some(false), Some(false))
        );
        assert_eq!(v["rev"], 1);
        assert_eq!(v["pd_length"], 0);
    }
}

#[test]
fn uiwarp_streams_deframe_exactly_with_no_leftover() {
    let Some(file) = common::testdata("uiwarp.pcap") else {
        return;
    };
    let (c2s, s2c) = client_server_streams(&file);
    assert_eq!(c2s.bytes.len(), 180);
    assert_eq!(s2c.bytes.len(), 72);
    let (req, n) = RrFrame::parse(RrKind::Request, &c2s.bytes)
        .unwrap()
        .unwrap();
    assert_eq!((n, req.crc, req.markers, req.rev), (20, false, false, 1));
    let (rep, m) = RrFrame::parse(RrKind::Reply, &s2c.bytes).unwrap().unwrap();
    assert_eq!((m, rep.crc, rep.reject), (20, false, false));
    let mut d = Deframer::new(false);
    d.push(&c2s.bytes[20..]);
    let mut msns = Vec::new();
    while let Some(f) = d.next_fpdu().unwrap() {
        let msg = rdmap::parse(&f.ulpdu).unwrap();
        assert_eq!(msg.opcode, Opcode::Send);
        let farside_iwarp::ddp::Placement::Untagged { msn, .. } = msg.placement else {
            panic!()
        };
        msns.push(msn);
    }
    assert_eq!(msns, [1, 2, 3, 4]);
    assert_eq!(d.pending(), 0);
    let mut d = Deframer::new(false);
    d.push(&s2c.bytes[20..]);
    let f = d.next_fpdu().unwrap().unwrap();
    assert!(matches!(
        rdmap::parse(&f.ulpdu).unwrap().body,
        Body::ReadRequest(_)
    ));
    assert_eq!(d.next_fpdu().unwrap(), None);
    assert_eq!(d.pending(), 0);
}

#[test]
fn ethernet_padding_of_the_rsts_never_reaches_the_stream() {
    let Some(file) = common::testdata("uiwarp.pcap") else {
        return;
    };
    let segs = pcap::read_tcp_segments(&file).unwrap();
    let rsts: Vec<_> = segs.iter().filter(|s| s.rst).collect();
    assert_eq!(rsts.len(), 2);
    assert!(rsts
        .iter()
        .all(|s| s.payload.is_empty() && (s.frame == 14 || s.frame == 15)));
    // Had the 6 padding bytes been passed on, the deframer must not emit a message.
    let mut d = Deframer::new(false);
    d.push(&[0; 6]);
    assert!(!matches!(d.next_fpdu(), Ok(Some(_))));
}

#[test]
fn ddp_version_zero_send_is_refused_with_the_right_terminate() {
    let Some(l) = lines("uiwarp-8cdd2a5.pcap") else {
        return;
    };
    let kinds: Vec<&str> = l.iter().map(|v| v["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["mpa_request", "mpa_reply", "send"]);
    assert_eq!(l[0]["frame"], 4);
    assert_eq!(l[1]["frame"], 6);
    let s = &l[2];
    assert_eq!(s["frame"], 8);
    assert_eq!(s["ddp_control"], 0x40);
    assert_eq!(s["dv"], 0);
    assert_eq!(s["refused"]["layer"], 1);
    assert_eq!(s["refused"]["etype"], 2);
    assert_eq!(s["refused"]["ecode"], 6);

    // A responder QP fed the client's bytes answers with exactly that Terminate.
    let file = common::testdata("uiwarp-8cdd2a5.pcap").unwrap();
    let (c2s, _) = client_server_streams(&file);
    let mut dev = Device::new(1);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = Cq::new(16).unwrap();
    let mut cfg = QpConfig::default();
    cfg.mpa.crc = false;
    cfg.mpa.enhanced = false;
    let mut qp = Qp::accept(pd, cfg);
    // The Request, then (after our Reply, as on the wire) the Send.
    qp.on_bytes(&mut dev, &mut cq, &c2s.bytes[..20]);
    qp.on_bytes(&mut dev, &mut cq, &c2s.bytes[20..]);
    assert_eq!(
        *qp.state(),
        QpState::Terminated {
            code: TermCode::DDP_UT_VERSION,
            sent: true
        }
    );
    let tx = qp.take_tx(&dev, &mut cq);
    let (rep, n) = RrFrame::parse(RrKind::Reply, &tx).unwrap().unwrap();
    assert!(!rep.crc && !rep.reject && rep.rev == 1);
    let mut d = Deframer::new(false);
    d.push(&tx[n..]);
    let t = d.next_fpdu().unwrap().unwrap();
    let msg = rdmap::parse(&t.ulpdu).unwrap();
    let Body::Terminate(term) = msg.body else {
        panic!("not a Terminate")
    };
    assert_eq!(term.code, TermCode::DDP_UT_VERSION);
    assert!(
        !term.m && !term.d && !term.r,
        "no header: its layout is unknown"
    );
    assert_eq!(d.next_fpdu().unwrap(), None);
}

#[test]
fn golden_capture_decodes_with_good_crcs() {
    let Some(l) = lines("golden-frames.pcap") else {
        return;
    };
    let kinds: Vec<&str> = l.iter().map(|v| v["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["mpa_request", "mpa_reply", "write", "read_request", "send"]
    );
    assert_eq!(l[0]["c"], true);
    assert_eq!(l[1]["c"], true);
    for v in &l[2..] {
        assert_eq!(v["crc"], "good", "{v}");
    }
    assert_eq!(l[2]["stag"], 0x102);
    assert_eq!(l[2]["to"], 0x1000);
    assert_eq!(l[2]["payload_length"], 13);
}

fn write_capture(ulpdu_fpdus: &[Vec<u8>], crc: bool) -> std::path::PathBuf {
    let mut w = pcap::ConversationWriter::new(
        "10.0.0.1:40000".parse().unwrap(),
        "10.0.0.2:7471".parse().unwrap(),
    );
    let mut req = RrFrame::new(RrKind::Request);
    req.crc = crc;
    let mut rep = RrFrame::new(RrKind::Reply);
    rep.crc = crc;
    w.data(true, &req.encode());
    w.data(false, &rep.encode());
    for f in ulpdu_fpdus {
        w.data(true, f);
    }
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let p = std::env::temp_dir().join(format!("farside-iwarp-{}-{n}.pcap", std::process::id()));
    std::fs::write(&p, w.finish()).unwrap();
    p
}

fn send_fpdu(msn: u32, crc: bool) -> Vec<u8> {
    let u = rdmap::encode_ulpdu(
        Opcode::Send,
        true,
        farside_iwarp::ddp::Placement::Untagged { qn: 0, msn, mo: 0 },
        0,
        b"hello",
    );
    let mut out = Vec::new();
    farside_iwarp::mpa::encode_fpdu(&u, crc, &mut out);
    out
}

fn decode_cli(path: &std::path::Path) -> Result<(), String> {
    use farside_iwarp::cli::{IwarpArgs, IwarpCmd};
    let mut out = Vec::new();
    let r = farside_iwarp::cli::run_to(
        IwarpArgs {
            cmd: IwarpCmd::Decode {
                file: path.to_path_buf(),
            },
        },
        &mut out,
    );
    // One JSON object per line, whatever the outcome.
    for line in String::from_utf8(out).unwrap().lines() {
        assert!(serde_json::from_str::<serde_json::Value>(line)
            .unwrap()
            .is_object());
    }
    r
}

#[test]
fn a_bad_crc_is_reported_not_fatal() {
    let mut bad = send_fpdu(2, true);
    bad[20] ^= 0x20; // a payload byte
    let p = write_capture(&[send_fpdu(1, true), bad, send_fpdu(3, true)], true);
    let d = decode_pcap(&std::fs::read(&p).unwrap()).unwrap();
    let crcs: Vec<&str> = d.lines[2..]
        .iter()
        .map(|l| l["crc"].as_str().unwrap())
        .collect();
    assert_eq!(crcs, ["good", "bad", "good"]);
    assert_eq!(d.lines[3]["refused"]["layer"], 2);
    assert_eq!(d.lines[3]["refused"]["ecode"], 2);
    assert_eq!(decode_cli(&p), Ok(()));
    let _ = std::fs::remove_file(p);
}

#[test]
fn an_undeframable_stream_fails_the_decode() {
    // ULPDU_Length 3: shorter than any DDP header, the framing is lost.
    let p = write_capture(
        &[send_fpdu(1, false), vec![0, 3, 0x41, 0x43, 0, 0, 0, 0]],
        false,
    );
    let d = decode_pcap(&std::fs::read(&p).unwrap()).unwrap();
    assert_eq!(d.lines.last().unwrap()["kind"], "deframe_error");
    assert_eq!(d.failures.len(), 1);
    assert!(decode_cli(&p)
        .unwrap_err()
        .contains("could not be deframed"));
    let _ = std::fs::remove_file(p);
}

#[test]
fn decode_refuses_what_it_cannot_read() {
    let p = std::env::temp_dir().join(format!("farside-iwarp-{}-ng.pcap", std::process::id()));
    std::fs::write(
        &p,
        [
            0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0, 0x4d, 0x3c, 0x2b, 0x1a, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0,
        ],
    )
    .unwrap();
    assert!(decode_cli(&p).unwrap_err().contains("pcapng"));
    let _ = std::fs::remove_file(p);
}

#[test]
fn an_msn_out_of_sequence_is_refused() {
    let p = write_capture(
        &[
            send_fpdu(1, false),
            send_fpdu(3, false),
            send_fpdu(4, false),
        ],
        false,
    );
    let d = decode_pcap(&std::fs::read(&p).unwrap()).unwrap();
    let sends: Vec<&Value> = d.lines.iter().filter(|l| l["kind"] == "send").collect();
    assert!(sends[0].get("refused").is_none());
    assert_eq!(sends[1]["refused"]["ecode"], 3, "MSN 3 where 2 was due");
    assert!(sends[2].get("refused").is_none(), "the expectation follows");
    let _ = std::fs::remove_file(p);
}
