//! An independent decoder agrees with us: traffic made by two of our queue pairs is
//! written as a pcap, decoded by `tshark` (Wireshark's MPA and DDP/RDMAP dissectors)
//! and by `farside iwarp decode`'s decoder, and the two agree field by field; tshark
//! finds every CRC good.

mod common;

use farside_iwarp::decode::decode_pcap;
use farside_iwarp::mpa::{self, MpaConfig, RrFrame, RrKind};
use farside_iwarp::pcap::ConversationWriter;
use farside_iwarp::qp::{Qp, QpConfig, RecvWr, SendWr, Sge};
use farside_iwarp::verbs::{Access, Cq, Device};
use serde_json::Value;
use std::collections::HashMap;
use std::process::Command;

/// Cuts one direction's bytes into packets of one MPA frame or one FPDU each.
#[derive(Default)]
struct Packetizer {
    buf: Vec<u8>,
    started: bool,
}

impl Packetizer {
    fn push(&mut self, kind: RrKind, data: &[u8]) -> Vec<Vec<u8>> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            let n = if !self.started {
                match RrFrame::parse(kind, &self.buf).unwrap() {
                    Some((_, n)) => n,
                    None => break,
                }
            } else {
                if self.buf.len() < 2 {
                    break;
                }
                let u = usize::from(u16::from_be_bytes([self.buf[0], self.buf[1]]));
                let n = mpa::HEADER_LEN + u + mpa::pad_len(u) + mpa::CRC_LEN;
                if self.buf.len() < n {
                    break;
                }
                n
            };
            self.started = true;
            out.push(self.buf.drain(..n).collect());
        }
        out
    }
}

/// A capture of our two queue pairs doing every operation, and a Terminate at the end.
fn capture(crc: bool) -> Vec<u8> {
    let mc = MpaConfig {
        crc,
        // tshark 4.0 knows MPA Rev 1 only ("Rev field is NOT set to one").
        enhanced: false,
        ird: 4,
        ord: 4,
        private_data: Vec::new(),
    };
    let cfg = QpConfig {
        mpa: mc,
        emss: 1460,
        ..Default::default()
    };
    let (mut da, mut db) = (Device::new(11), Device::new(12));
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (mut ca, mut cb) = (Cq::new(64).unwrap(), Cq::new(64).unwrap());
    let mut a = Qp::connect(pa, cfg.clone());
    let mut b = Qp::accept(pb, cfg);
    let src = da.reg_mr(pa, 0x7000, 4000, Access::LOCAL_WRITE).unwrap();
    da.write(src, 0x7000, &vec![0x5a; 4000]).unwrap();
    let sink = db
        .reg_mr(
            pb,
            0x10_0000,
            4000,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let inv = db.reg_mr(pb, 0, 16, Access::REMOTE_WRITE).unwrap();
    let rbuf = db.reg_mr(pb, 0, 300, Access::LOCAL_WRITE).unwrap();
    for i in 0..3 {
        b.post_recv(RecvWr {
            wr_id: i,
            sge: Sge {
                stag: rbuf,
                to: 100 * i,
                len: 100,
            },
        })
        .unwrap();
    }
    let ops = [
        SendWr::Write {
            wr_id: 1,
            local: Sge {
                stag: src,
                to: 0x7000,
                len: 3000,
            },
            remote_stag: sink,
            remote_to: 0x10_0000,
        },
        SendWr::Read {
            wr_id: 2,
            local: Sge {
                stag: src,
                to: 0x7000,
                len: 2000,
            },
            remote_stag: sink,
            remote_to: 0x10_0100,
        },
        SendWr::Send {
            wr_id: 3,
            local: Sge {
                stag: src,
                to: 0x7000,
                len: 13,
            },
            solicited: false,
            invalidate: None,
        },
        SendWr::Send {
            wr_id: 4,
            local: Sge {
                stag: src,
                to: 0x7000,
                len: 14,
            },
            solicited: true,
            invalidate: None,
        },
        SendWr::Send {
            wr_id: 5,
            local: Sge {
                stag: src,
                to: 0x7000,
                len: 15,
            },
            solicited: false,
            invalidate: Some(inv),
        },
    ];
    // A bad STag, once the rest is done: B answers with a Terminate carrying the DDP
    // header (earlier, it would have flushed the pending Read).
    let bad = SendWr::Write {
        wr_id: 6,
        local: Sge {
            stag: src,
            to: 0x7000,
            len: 8,
        },
        remote_stag: sink ^ 0x80,
        remote_to: 0,
    };
    for op in ops {
        a.post_send(op).unwrap();
    }
    let mut w = ConversationWriter::new(
        "10.0.0.1:40000".parse().unwrap(),
        "10.0.0.2:7471".parse().unwrap(),
    );
    let (mut pka, mut pkb) = (Packetizer::default(), Packetizer::default());
    let mut bad = Some(bad);
    loop {
        let ta = a.take_tx(&da, &mut ca);
        for p in pka.push(RrKind::Request, &ta) {
            w.data(true, &p);
        }
        b.on_bytes(&mut db, &mut cb, &ta);
        let tb = b.take_tx(&db, &mut cb);
        for p in pkb.push(RrKind::Reply, &tb) {
            w.data(false, &p);
        }
        a.on_bytes(&mut da, &mut ca, &tb);
        if ta.is_empty() && tb.is_empty() {
            match bad.take() {
                Some(wr) => a.post_send(wr).unwrap(),
                None => break,
            }
        }
    }
    w.finish()
}

fn tshark_available() -> bool {
    match Command::new("tshark").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            common::skip("tshark not installed (scripts/setup.sh installs it)");
            false
        }
    }
}

const FIELDS: &[&str] = &[
    "frame.number",
    "iwarp_mpa.ulpdulength",
    "iwarp_mpa.crc_check",
    "iwarp_ddp.tagged_flag",
    "iwarp_ddp.last_flag",
    "iwarp_ddp.dv",
    "iwarp_ddp.stag",
    "iwarp_ddp.tagged_offset",
    "iwarp_ddp.qn",
    "iwarp_ddp.msn",
    "iwarp_ddp.mo",
    "iwarp_rdma.version",
    "iwarp_rdma.opcode",
    "iwarp_rdma.inval_stag",
    "iwarp_rdma.sinkstag",
    "iwarp_rdma.sinkto",
    "iwarp_rdma.rdmardsz",
    "iwarp_rdma.srcstag",
    "iwarp_rdma.srcto",
    "iwarp_rdma.term_layer",
    "iwarp_rdma.term_etype_ddp",
    "iwarp_rdma.term_errcode_ddp_tagged",
    "iwarp_rdma.term_hdrct_m",
    "iwarp_rdma.hdrct_d",
    "iwarp_rdma.hdrct_r",
    "iwarp_mpa.crc_flag",
    "iwarp_mpa.rev",
];

/// Our JSON key for each tshark field (frame number and the MPA flags aside).
fn our_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "iwarp_mpa.ulpdulength" => "ulpdu_length",
        "iwarp_mpa.crc_check" => "crc_field",
        "iwarp_ddp.tagged_flag" => "tagged",
        "iwarp_ddp.last_flag" => "last",
        "iwarp_ddp.dv" => "dv",
        "iwarp_ddp.stag" => "stag",
        "iwarp_ddp.tagged_offset" => "to",
        "iwarp_ddp.qn" => "qn",
        "iwarp_ddp.msn" => "msn",
        "iwarp_ddp.mo" => "mo",
        "iwarp_rdma.version" => "rv",
        "iwarp_rdma.opcode" => "opcode",
        "iwarp_rdma.inval_stag" => "inval_stag",
        "iwarp_rdma.sinkstag" => "sink_stag",
        "iwarp_rdma.sinkto" => "sink_to",
        "iwarp_rdma.rdmardsz" => "size",
        "iwarp_rdma.srcstag" => "source_stag",
        "iwarp_rdma.srcto" => "source_to",
        "iwarp_rdma.term_layer" => "layer",
        "iwarp_rdma.term_etype_ddp" => "etype",
        "iwarp_rdma.term_errcode_ddp_tagged" => "ecode",
        "iwarp_rdma.term_hdrct_m" => "m",
        "iwarp_rdma.hdrct_d" => "d",
        "iwarp_rdma.hdrct_r" => "r",
        _ => return None,
    })
}

/// A tshark value as a number: hex with 0x, decimal, or a boolean.
fn num(s: &str) -> u64 {
    match s {
        "True" | "true" => 1,
        "False" | "false" => 0,
        _ => match s.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).unwrap(),
            None => s.parse().unwrap_or_else(|_| panic!("tshark value {s:?}")),
        },
    }
}

fn ours(v: &Value) -> u64 {
    match v {
        Value::Bool(b) => u64::from(*b),
        Value::Number(n) => n.as_u64().unwrap(),
        Value::String(s) => u64::from_str_radix(s, 16).unwrap(),
        _ => panic!("{v}"),
    }
}

fn cross_check(crc: bool) {
    let pcap = capture(crc);
    let dir =
        std::env::temp_dir().join(format!("farside-iwarp-tshark-{}-{crc}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ours.pcap");
    std::fs::write(&path, &pcap).unwrap();

    let decoded = decode_pcap(&pcap).unwrap();
    assert!(decoded.failures.is_empty());
    let by_frame: HashMap<u64, &Value> = decoded
        .lines
        .iter()
        .map(|l| (l["frame"].as_u64().unwrap(), l))
        .collect();
    let kinds: Vec<&str> = decoded
        .lines
        .iter()
        .map(|l| l["kind"].as_str().unwrap())
        .collect();
    for k in [
        "write",
        "read_request",
        "read_response",
        "send",
        "send_se",
        "send_inv",
        "terminate",
    ] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }

    let mut args: Vec<String> = ["--disable-heuristic", "rpcrdma_iwarp", "-r"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(path.display().to_string());
    args.extend(
        ["-T", "fields", "-E", "separator=\t"]
            .iter()
            .map(|s| s.to_string()),
    );
    for f in FIELDS {
        args.push("-e".into());
        args.push(f.to_string());
    }
    let out = Command::new("tshark").args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut fpdus = 0;
    let mut rr_frames = 0;
    let mut compared: HashMap<&str, usize> = HashMap::new();
    for row in text.lines() {
        let cols: Vec<&str> = row.split('\t').collect();
        let frame = num(cols[0]);
        if !cols[25].is_empty() {
            // An MPA Request or Reply.
            rr_frames += 1;
            let ourl = by_frame[&frame];
            assert_eq!(num(cols[25]), ours(&ourl["c"]), "frame {frame} C");
            assert_eq!(num(cols[26]), ours(&ourl["rev"]), "frame {frame} rev");
            continue;
        }
        if cols[1].is_empty() {
            continue; // TCP handshake
        }
        fpdus += 1;
        let ourl = by_frame
            .get(&frame)
            .unwrap_or_else(|| panic!("we have no message in frame {frame}"));
        for (i, f) in FIELDS.iter().enumerate() {
            let Some(key) = our_key(f) else { continue };
            if cols[i].is_empty() {
                continue;
            }
            let theirs = if *f == "iwarp_mpa.crc_check" && !crc {
                0 // tshark shows the (zero) field; ours says "absent"
            } else {
                num(cols[i])
            };
            let mine = ourl
                .get(key)
                .unwrap_or_else(|| panic!("frame {frame}: we have no {key} ({f} = {})", cols[i]));
            assert_eq!(theirs, ours(mine), "frame {frame}: {f} vs our {key}");
            *compared.entry(f).or_default() += 1;
        }
        assert_eq!(ourl["crc"], if crc { "good" } else { "absent" });
    }
    assert_eq!(rr_frames, 2);
    // Every field was seen by tshark at least once (so none was compared vacuously).
    // (Without CRC, tshark shows no CRC field.)
    for f in FIELDS
        .iter()
        .filter(|f| our_key(f).is_some() && (crc || **f != "iwarp_mpa.crc_check"))
    {
        assert!(
            compared.contains_key(f),
            "tshark never showed {f}: {compared:?}"
        );
    }
    let ours_fpdus = decoded
        .lines
        .iter()
        .filter(|l| l.get("ulpdu_length").is_some())
        .count();
    assert_eq!(fpdus, ours_fpdus, "tshark and we see the same FPDUs");

    if crc {
        let out = Command::new("tshark")
            .args(["--disable-heuristic", "rpcrdma_iwarp", "-r"])
            .arg(&path)
            .args(["-O", "iwarp_mpa"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.matches("Good CRC32").count(), fpdus, "{text}");
        assert_eq!(text.matches("Bad CRC32").count(), 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tshark_agrees_field_by_field_with_crc() {
    if tshark_available() {
        cross_check(true);
    }
}

#[test]
fn tshark_agrees_field_by_field_without_crc() {
    if tshark_available() {
        cross_check(false);
    }
}
