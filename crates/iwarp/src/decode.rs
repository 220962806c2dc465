//! `farside iwarp decode`: every MPA set-up frame and DDP/RDMAP message of a capture,
//! one JSON object per line, in frame order.
//!
//! For each TCP connection whose one direction starts with an MPA Request, the Request
//! and the Reply are read from the two reassembled directions, the Reply's `C` flag
//! decides whether FPDU CRCs are checked, and both directions are deframed. Each line
//! has `frame` (the frame that completed the message), `direction`
//! (`initiator_to_responder` or `responder_to_initiator`), `src`, `dst`, `offset` (in
//! its direction's byte stream) and `kind`; then every header field under its RFC name.
//!
//! A message the receiver must refuse is still printed, with a `refused` object naming
//! the Terminate that answers it (`layer`, `etype`, `ecode`, `error`, `reason`): a bad
//! CRC, a header the stateless checks of [`rdmap::parse`] refuse, or an untagged
//! segment out of MSN/MO sequence on its queue. Only a stream that
//! cannot be deframed (a bad MPA key, an FPDU shorter than a DDP header, a hole in the
//! capture) makes the run fail; its line has kind `deframe_error`.

use crate::ddp::{self, Placement};
use crate::mpa::{self, Deframer, RrFrame, RrKind};
use crate::pcap::{self, Direction, Stream};
use crate::rdmap::{self, Body};
use crate::term::TermCode;
use serde_json::{json, Map, Value};

/// The decoder's output: lines in frame order, and whether every stream deframed.
#[derive(Debug, Default)]
pub struct Decoded {
    pub lines: Vec<Value>,
    /// Streams that could not be deframed (one message each).
    pub failures: Vec<String>,
}

/// Decode a classic pcap held in memory.
pub fn decode_pcap(file: &[u8]) -> Result<Decoded, pcap::PcapError> {
    let segs = pcap::read_tcp_segments(file)?;
    let streams = pcap::reassemble(&segs)?;
    let mut keys: Vec<&Direction> = streams.keys().collect();
    keys.sort_by_key(|k| streams[*k].first_frame);
    let mut out = Decoded::default();
    let mut seen = std::collections::HashSet::new();
    let mut lines: Vec<(u64, usize, Value)> = Vec::new();
    for key in keys {
        let rev = (key.1, key.0);
        if seen.contains(key) || seen.contains(&rev) {
            continue;
        }
        let a = &streams[key];
        let empty = Stream::default();
        let b = streams.get(&rev).unwrap_or(&empty);
        let (ini_key, ini, res) = if starts_with_request(a) {
            (*key, a, b)
        } else if starts_with_request(b) {
            (rev, b, a)
        } else {
            continue; // not MPA
        };
        seen.insert(*key);
        seen.insert(rev);
        decode_connection(ini_key, ini, res, &mut lines, &mut out.failures);
    }
    lines.sort_by_key(|(frame, seq, _)| (*frame, *seq));
    out.lines = lines.into_iter().map(|(_, _, v)| v).collect();
    Ok(out)
}

fn starts_with_request(s: &Stream) -> bool {
    let n = s.bytes.len().min(16);
    n > 0 && s.bytes[..n] == mpa::KEY_REQ[..n]
}

struct Ctx<'a> {
    dir: &'static str,
    src: String,
    dst: String,
    stream: &'a Stream,
}

impl Ctx<'_> {
    fn line(&self, offset: usize, end: usize, kind: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(
            "frame".into(),
            json!(self.stream.frame_of(end.saturating_sub(1).max(offset))),
        );
        m.insert("direction".into(), json!(self.dir));
        m.insert("src".into(), json!(self.src));
        m.insert("dst".into(), json!(self.dst));
        m.insert("offset".into(), json!(offset));
        m.insert("kind".into(), json!(kind));
        m
    }
}

fn decode_connection(
    ini_key: Direction,
    ini: &Stream,
    res: &Stream,
    lines: &mut Vec<(u64, usize, Value)>,
    failures: &mut Vec<String>,
) {
    let ci = Ctx {
        dir: "initiator_to_responder",
        src: ini_key.0.to_string(),
        dst: ini_key.1.to_string(),
        stream: ini,
    };
    let cr = Ctx {
        dir: "responder_to_initiator",
        src: ini_key.1.to_string(),
        dst: ini_key.0.to_string(),
        stream: res,
    };
    let mut seq = lines.len();
    let mut push = |lines: &mut Vec<(u64, usize, Value)>, m: Map<String, Value>| {
        let frame = m["frame"].as_u64().unwrap_or(0);
        seq += 1;
        lines.push((frame, seq, Value::Object(m)));
    };
    let req = read_rr(&ci, RrKind::Request, lines, &mut push, failures);
    let rep = if req.is_some() {
        read_rr(&cr, RrKind::Reply, lines, &mut push, failures)
    } else {
        None
    };
    // The Reply's C is the outcome for both directions (RFC 5044 §7.1).
    let crc_on = rep.as_ref().map(|(f, _)| f.crc);
    for (ctx, start) in [
        (&ci, req.as_ref().map(|r| r.1)),
        (&cr, rep.as_ref().map(|r| r.1)),
    ] {
        let (Some(start), Some(crc_on)) = (start, crc_on) else {
            continue;
        };
        deframe(ctx, start, crc_on, lines, &mut push, failures);
    }
}

type Push<'p> = dyn FnMut(&mut Vec<(u64, usize, Value)>, Map<String, Value>) + 'p;

fn read_rr(
    ctx: &Ctx<'_>,
    kind: RrKind,
    lines: &mut Vec<(u64, usize, Value)>,
    push: &mut Push<'_>,
    failures: &mut Vec<String>,
) -> Option<(RrFrame, usize)> {
    let s = &ctx.stream.bytes;
    match RrFrame::parse(kind, s) {
        Ok(Some((f, n))) => {
            let mut m = ctx.line(
                0,
                n,
                if kind == RrKind::Request {
                    "mpa_request"
                } else {
                    "mpa_reply"
                },
            );
            m.insert("m".into(), json!(f.markers));
            m.insert("c".into(), json!(f.crc));
            m.insert("r".into(), json!(f.reject));
            m.insert("enhanced".into(), json!(f.enhanced));
            m.insert("rev".into(), json!(f.rev));
            m.insert("pd_length".into(), json!(f.private_data.len()));
            if let Some(io) = f.ird_ord() {
                m.insert("ird".into(), json!(io.ird));
                m.insert("ord".into(), json!(io.ord));
                m.insert("p2p".into(), json!(io.p2p));
                m.insert("write_rtr".into(), json!(io.write_rtr));
                m.insert("read_rtr".into(), json!(io.read_rtr));
                m.insert("zero_length_rtr".into(), json!(io.zero_len_rtr));
            }
            m.insert("payload_length".into(), json!(f.ulp_private_data().len()));
            let refusal = if f.markers {
                Some("markers are not supported")
            } else if f.rev == 0 || f.rev > 2 {
                Some("MPA revision not supported")
            } else {
                None
            };
            if let Some(why) = refusal {
                m.insert("refused".into(), json!({ "error": why }));
            }
            push(lines, m);
            Some((f, n))
        }
        Ok(None) => {
            if !s.is_empty() {
                let mut m = ctx.line(0, s.len(), "incomplete");
                m.insert("bytes".into(), json!(s.len()));
                push(lines, m);
            }
            None
        }
        Err(e) => {
            let mut m = ctx.line(0, s.len().min(mpa::RR_HEADER_LEN), "deframe_error");
            m.insert("error".into(), json!(e.to_string()));
            push(lines, m);
            failures.push(format!("{} -> {}: {e}", ctx.src, ctx.dst));
            None
        }
    }
}

fn deframe(
    ctx: &Ctx<'_>,
    start: usize,
    crc_on: bool,
    lines: &mut Vec<(u64, usize, Value)>,
    push: &mut Push<'_>,
    failures: &mut Vec<String>,
) {
    let end_of_data = ctx.stream.gap_after.unwrap_or(ctx.stream.bytes.len());
    let mut d = Deframer::new(crc_on);
    d.push(&ctx.stream.bytes[start..end_of_data]);
    let mut off = start;
    let mut seq = Sequence::default();
    loop {
        match d.next_fpdu() {
            Ok(Some(f)) => {
                let end = off + f.wire_len();
                let mut m = fpdu_line(ctx, off, end, &f);
                if !m.contains_key("refused") {
                    if let Err(term) = seq.check(&f.ulpdu) {
                        m.insert("refused".into(), refused(term, "out of sequence"));
                    }
                }
                push(lines, m);
                off = end;
            }
            Ok(None) => break,
            Err(e) => {
                let mut m = ctx.line(off, off + 2, "deframe_error");
                m.insert("error".into(), json!(e.to_string()));
                push(lines, m);
                failures.push(format!("{} -> {}: {e}", ctx.src, ctx.dst));
                return;
            }
        }
    }
    if d.pending() > 0 {
        let mut m = ctx.line(off, end_of_data, "incomplete");
        m.insert("bytes".into(), json!(d.pending()));
        push(lines, m);
    }
    if let Some(at) = ctx.stream.gap_after {
        let mut m = ctx.line(at, at, "deframe_error");
        m.insert("error".into(), json!("segment missing from the capture"));
        push(lines, m);
        failures.push(format!(
            "{} -> {}: hole in the capture at byte {at}",
            ctx.src, ctx.dst
        ));
    }
}

/// The receiver's view of one direction's untagged queues: the MSN each queue expects
/// next and the MO its current message has reached (RFC 5041 §5.2; siw
/// `siw_send_check_ntoh`). Out-of-sequence segments are refused as the receiver would;
/// the expectation then follows the segment seen, so one loss is reported once.
#[derive(Default)]
struct Sequence {
    /// (expected MSN, MO reached) per queue; MSNs start at 1.
    queues: [Option<(u32, u32)>; rdmap::QN_COUNT],
}

impl Sequence {
    fn check(&mut self, ulpdu: &[u8]) -> Result<(), TermCode> {
        let Ok(msg) = rdmap::parse(ulpdu) else {
            return Ok(()); // refused already
        };
        let Placement::Untagged { qn, msn, mo } = msg.placement else {
            return Ok(());
        };
        // Terminates: siw always sends MSN 1, and there is at most one.
        if qn == rdmap::QN_TERMINATE {
            return Ok(());
        }
        let slot = &mut self.queues[qn as usize];
        let (want_msn, want_mo) = slot.unwrap_or((1, 0));
        let len = msg.payload_len() as u32;
        let verdict = if msn != want_msn {
            Err(TermCode::DDP_UT_MSN_RANGE)
        } else if mo != want_mo {
            Err(TermCode::DDP_UT_INVALID_MO)
        } else {
            Ok(())
        };
        *slot = Some(if msg.ddp.last {
            (msn.wrapping_add(1), 0)
        } else {
            (msn, mo.wrapping_add(len))
        });
        verdict
    }
}

fn refused(term: TermCode, why: &str) -> Value {
    json!({
        "layer": term.layer,
        "etype": term.etype,
        "ecode": term.ecode,
        "error": term.describe(),
        "reason": why,
    })
}

/// The JSON line of one FPDU.
pub fn fpdu_line(
    ctx_dir: &impl LineCtx,
    off: usize,
    end: usize,
    f: &mpa::Fpdu,
) -> Map<String, Value> {
    let u = &f.ulpdu;
    let parsed = rdmap::parse(u);
    let lenient = ddp::parse_lenient(u);
    let kind = match (&parsed, &lenient) {
        (Ok(m), _) => m.opcode.name(),
        (Err(_), Some(s)) => rdmap::Opcode::from_u8(s.rdmap_ctrl & 0x0f)
            .map(|o| o.name())
            .unwrap_or("unknown"),
        _ => "unknown",
    };
    let mut m = ctx_dir.new_line(off, end, kind);
    m.insert("ulpdu_length".into(), json!(u.len()));
    m.insert("pad".into(), json!(f.pad));
    m.insert("crc".into(), json!(f.crc.name()));
    m.insert(
        "crc_field".into(),
        json!(format!("{:08x}", u32::from_be_bytes(f.crc_field))),
    );
    if let Some(s) = &lenient {
        m.insert("ddp_control".into(), json!(u[0]));
        m.insert("tagged".into(), json!(s.ctrl.tagged));
        m.insert("last".into(), json!(s.ctrl.last));
        m.insert("dv".into(), json!(s.ctrl.dv));
        m.insert("rdmap_control".into(), json!(s.rdmap_ctrl));
        m.insert("rv".into(), json!(s.rdmap_ctrl >> 6));
        m.insert("opcode".into(), json!(s.rdmap_ctrl & 0x0f));
        match s.placement {
            Placement::Tagged { stag, to } => {
                m.insert("stag".into(), json!(stag));
                m.insert("to".into(), json!(to));
            }
            Placement::Untagged { qn, msn, mo } => {
                m.insert("qn".into(), json!(qn));
                m.insert("msn".into(), json!(msn));
                m.insert("mo".into(), json!(mo));
            }
        }
        m.insert("payload_length".into(), json!(s.payload.len()));
    }
    match &parsed {
        Ok(msg) => {
            if matches!(
                msg.opcode,
                rdmap::Opcode::SendInv | rdmap::Opcode::SendSeInv
            ) {
                m.insert("inval_stag".into(), json!(msg.inval_stag));
            }
            match &msg.body {
                Body::Data(_) => {}
                Body::ReadRequest(rr) => {
                    m.insert("sink_stag".into(), json!(rr.sink_stag));
                    m.insert("sink_to".into(), json!(rr.sink_to));
                    m.insert("size".into(), json!(rr.size));
                    m.insert("source_stag".into(), json!(rr.source_stag));
                    m.insert("source_to".into(), json!(rr.source_to));
                    m.insert("payload_length".into(), json!(0));
                }
                Body::Terminate(t) => {
                    m.insert("layer".into(), json!(t.code.layer));
                    m.insert("etype".into(), json!(t.code.etype));
                    m.insert("ecode".into(), json!(t.code.ecode));
                    m.insert("error".into(), json!(t.code.describe()));
                    m.insert("m".into(), json!(t.m));
                    m.insert("d".into(), json!(t.d));
                    m.insert("r".into(), json!(t.r));
                    if let Some(l) = t.ddp_segment_length() {
                        m.insert("ddp_segment_length".into(), json!(l));
                    }
                    m.insert("payload_length".into(), json!(t.attached.len()));
                }
            }
            if f.crc == mpa::CrcVerdict::Bad {
                m.insert(
                    "refused".into(),
                    refused(TermCode::MPA_CRC, "CRC does not match"),
                );
            }
        }
        Err(r) => {
            let term = if f.crc == mpa::CrcVerdict::Bad {
                TermCode::MPA_CRC
            } else {
                r.term
            };
            m.insert("refused".into(), refused(term, r.why));
        }
    }
    m
}

/// Where [`fpdu_line`] takes the common keys from (so tests can decode a bare stream).
pub trait LineCtx {
    fn new_line(&self, offset: usize, end: usize, kind: &str) -> Map<String, Value>;
}

impl LineCtx for Ctx<'_> {
    fn new_line(&self, offset: usize, end: usize, kind: &str) -> Map<String, Value> {
        self.line(offset, end, kind)
    }
}

/// A context with no capture behind it: `frame` is 0, `direction` as given.
pub struct BareCtx(pub &'static str);

impl LineCtx for BareCtx {
    fn new_line(&self, offset: usize, _end: usize, kind: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("frame".into(), json!(0));
        m.insert("direction".into(), json!(self.0));
        m.insert("offset".into(), json!(offset));
        m.insert("kind".into(), json!(kind));
        m
    }
}
