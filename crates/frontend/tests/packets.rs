//! Packet cases through BPF_PROG_TEST_RUN (root: loading BPF needs CAP_BPF): a table
//! of frames (description, frame, expected verdict, expected output), the flow
//! table's behaviour (follow, move, hold and its expiry, non-SYN miss routed without
//! an entry, moved flows out of the LRU's reach, a full moved-flow table), the weighted split, the
//! hash agreeing with `farside_frontend::table`, and refusals of what cannot be
//! verified (truncated headers, bad lengths, IP options, fragments).
//! Run: `cargo test -p farside-frontend -- --include-ignored` as root.

use std::net::{Ipv4Addr, SocketAddrV4};

use farside_frontend::{table, verdict, BackendSpec, Frontend, SLOTS};

const FE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xfe, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xc1, 0x01];
const A_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xaa, 0x01];
const B_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xbb, 0x01];
const A_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 11);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 12);
const VIP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 100), 80);
const CLIENT: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 1), 40_000);
const IFINDEX: u32 = 1;

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const SYNACK: u8 = 0x12;

fn load(wa: u32, wb: u32) -> Frontend {
    let backends = [
        BackendSpec {
            mac: A_MAC,
            ip: A_IP,
            weight: wa,
        },
        BackendSpec {
            mac: B_MAC,
            ip: B_IP,
            weight: wb,
        },
    ];
    Frontend::load(VIP, &backends, FE_MAC, IFINDEX).expect("load (root?)")
}

/// How to shape a frame.
#[derive(Clone, Copy)]
struct Shape {
    dst_mac: [u8; 6],
    ethertype: u16,
    dst: SocketAddrV4,
    src: SocketAddrV4,
    proto: u8,
    ip_option_words: u8,
    ihl_override: Option<u8>,
    frag_off: u16,
    /// Added to the IP total length field.
    tot_len_extra: i32,
    tcp_flags: u8,
    doff: u8,
    payload: usize,
    /// Bytes cut from the end of the frame.
    cut: usize,
}

impl Shape {
    fn tcp(flags: u8) -> Shape {
        Shape {
            dst_mac: FE_MAC,
            ethertype: 0x0800,
            dst: VIP,
            src: CLIENT,
            proto: 6,
            ip_option_words: 0,
            ihl_override: None,
            frag_off: 0x4000,
            tot_len_extra: 0,
            tcp_flags: flags,
            doff: 5,
            payload: 0,
            cut: 0,
        }
    }
}

fn frame(s: Shape) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&s.dst_mac);
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&s.ethertype.to_be_bytes());
    let ihl = 5 + s.ip_option_words;
    let l4 = if s.proto == 6 { 20 } else { 8 };
    let tot = ihl as usize * 4 + l4 + s.payload;
    f.push(0x40 | s.ihl_override.unwrap_or(ihl));
    f.push(0);
    f.extend_from_slice(&((tot as i32 + s.tot_len_extra) as u16).to_be_bytes());
    f.extend_from_slice(&[0x12, 0x34]);
    f.extend_from_slice(&s.frag_off.to_be_bytes());
    f.push(64);
    f.push(s.proto);
    f.extend_from_slice(&[0, 0]); // checksum: the program never reads it
    f.extend_from_slice(&s.src.ip().octets());
    f.extend_from_slice(&s.dst.ip().octets());
    f.extend(std::iter::repeat_n(1u8, s.ip_option_words as usize * 4));
    f.extend_from_slice(&s.src.port().to_be_bytes());
    f.extend_from_slice(&s.dst.port().to_be_bytes());
    if s.proto == 6 {
        f.extend_from_slice(&1u32.to_be_bytes()); // seq
        f.extend_from_slice(&0u32.to_be_bytes()); // ack
        f.push(s.doff << 4);
        f.push(s.tcp_flags);
        f.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
    } else {
        f.extend_from_slice(&[0, 8, 0, 0]);
    }
    f.extend(std::iter::repeat_n(0xabu8, s.payload));
    f.truncate(f.len() - s.cut);
    f
}

fn run(fe: &Frontend, f: &[u8]) -> (u32, Vec<u8>) {
    fe.test_run(f).expect("test run")
}

/// Forwarded to `mac`: only the Ethernet addresses changed.
fn assert_forwarded(what: &str, input: &[u8], (v, out): (u32, Vec<u8>), mac: [u8; 6]) {
    assert_eq!(v, verdict::REDIRECT, "{what}: verdict");
    assert_eq!(&out[0..6], &mac, "{what}: dst MAC");
    assert_eq!(&out[6..12], &FE_MAC, "{what}: src MAC");
    assert_eq!(
        &out[12..],
        &input[12..],
        "{what}: rest of the frame unchanged"
    );
}

fn counter(fe: &Frontend, name: &str) -> u64 {
    fe.stats().unwrap().counters[name]
}

fn mac_of(b: u32) -> [u8; 6] {
    [A_MAC, B_MAC][b as usize]
}

fn need_root() -> bool {
    assert!(
        farside_frontend::is_root(),
        "needs root (run with sudo / as root)"
    );
    true
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn new_flow_is_hashed_then_followed_moved_and_held() {
    need_root();
    let fe = load(75, 25);
    let t = fe.table().unwrap();
    let ids = [A_IP, B_IP].map(|ip| u64::from(u32::from(ip)));
    assert_eq!(t, table::fill_table(&ids, &[75, 25], SLOTS).unwrap());
    let b = table::backend_for(&t, &fe.hash_key(), CLIENT, VIP);
    let syn = frame(Shape::tcp(SYN));
    assert_forwarded("SYN", &syn, run(&fe, &syn), mac_of(b));
    assert_eq!(
        fe.flow(CLIENT).unwrap(),
        Some(([A_IP, B_IP][b as usize], false))
    );
    let data = frame(Shape {
        payload: 100,
        ..Shape::tcp(ACK)
    });
    assert_forwarded("ACK with data", &data, run(&fe, &data), mac_of(b));
    let s = fe.stats().unwrap();
    assert_eq!(s.backends[b as usize].packets, 2);
    assert_eq!(s.backends[b as usize].new_flows, 1);
    assert_eq!(s.flows, 1);
    assert_eq!(s.counters["nonsyn_miss"], 0);

    // MOVE: later packets follow the entry to the other back-end.
    let mut fe = fe;
    let other = 1 - b;
    fe.move_flow(CLIENT, [A_IP, B_IP][other as usize]).unwrap();
    assert_forwarded("after MOVE", &data, run(&fe, &data), mac_of(other));
    // HOLD drops, RELEASE resumes; MOVE releases too.
    fe.set_held(CLIENT, true).unwrap();
    assert_eq!(run(&fe, &data).0, verdict::DROP);
    assert_eq!(counter(&fe, "held"), 1);
    fe.set_held(CLIENT, false).unwrap();
    assert_forwarded("after RELEASE", &data, run(&fe, &data), mac_of(other));
    fe.set_held(CLIENT, true).unwrap();
    fe.move_flow(CLIENT, [A_IP, B_IP][b as usize]).unwrap();
    assert_forwarded("MOVE of a held flow", &data, run(&fe, &data), mac_of(b));
    // A SYN that finds an entry (a reused 4-tuple) is placed by the hash, not by the
    // entry an earlier connection left, and the entry is rewritten (counted).
    fe.move_flow(CLIENT, [A_IP, B_IP][other as usize]).unwrap();
    assert_forwarded("SYN hit", &syn, run(&fe, &syn), mac_of(b));
    assert_eq!(counter(&fe, "syn_hit"), 1);
    assert_eq!(
        fe.flow(CLIENT).unwrap(),
        Some(([A_IP, B_IP][b as usize], false))
    );
    assert_eq!(fe.stats().unwrap().backends[b as usize].new_flows, 2);
    // A held entry still drops a SYN.
    fe.set_held(CLIENT, true).unwrap();
    assert_eq!(run(&fe, &syn).0, verdict::DROP);
    fe.set_held(CLIENT, false).unwrap();
    // Unknown back-end, unknown flow.
    assert!(fe.move_flow(CLIENT, Ipv4Addr::new(10, 0, 0, 99)).is_err());
    let stranger = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 2), 1);
    assert!(fe.set_held(stranger, true).is_err());
    assert_eq!(fe.flow(stranger).unwrap(), None);
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn non_syn_miss_uses_the_same_hash_and_is_not_recorded() {
    need_root();
    let fe = load(67, 33);
    let t = fe.table().unwrap();
    let ack = frame(Shape::tcp(ACK));
    let b = table::backend_for(&t, &fe.hash_key(), CLIENT, VIP);
    assert_forwarded("ACK, no entry", &ack, run(&fe, &ack), mac_of(b));
    assert_eq!(counter(&fe, "nonsyn_miss"), 1);
    let s = fe.stats().unwrap();
    assert_eq!(s.backends[b as usize].new_flows, 0, "not a new flow");
    assert_eq!(s.flows, 0, "only a SYN makes an entry");
    assert_eq!(fe.flow(CLIENT).unwrap(), None);
    // A SYN-ACK is not a new flow either.
    let c2 = SocketAddrV4::new(*CLIENT.ip(), 40_001);
    let synack = frame(Shape {
        src: c2,
        ..Shape::tcp(SYNACK)
    });
    assert_forwarded(
        "SYN-ACK",
        &synack,
        run(&fe, &synack),
        mac_of(table::backend_for(&t, &fe.hash_key(), c2, VIP)),
    );
    assert_eq!(counter(&fe, "nonsyn_miss"), 2);
    assert_eq!(fe.stats().unwrap().flows, 0);
}

/// Packets of unknown flows (a spoofed flood) take no place in the flow table; a
/// moved flow lives in the moved-flow table, which SYNs of more flows than the LRU
/// holds cannot evict.
#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn unknown_flows_insert_nothing_and_moved_flows_survive_lru_pressure() {
    need_root();
    let mut fe = load(1, 1);
    let t = fe.table().unwrap();
    let syn = frame(Shape::tcp(SYN));
    let b = table::backend_for(&t, &fe.hash_key(), CLIENT, VIP);
    assert_forwarded("SYN", &syn, run(&fe, &syn), mac_of(b));
    let other = 1 - b;
    fe.move_flow(CLIENT, [A_IP, B_IP][other as usize]).unwrap();
    assert!(fe.is_moved(CLIENT).unwrap());
    let client_n = |i: u32| {
        SocketAddrV4::new(
            Ipv4Addr::from(0x0a80_0000 | (i >> 14)),
            (i & 0x3fff) as u16 + 1024,
        )
    };
    // 2,000 ACKs of unknown flows: routed by hash, nothing recorded.
    for i in 0..2000 {
        let f = frame(Shape {
            src: client_n(i),
            ..Shape::tcp(ACK)
        });
        assert_eq!(run(&fe, &f).0, verdict::REDIRECT);
    }
    let s = fe.stats().unwrap();
    assert_eq!(s.counters["nonsyn_miss"], 2000);
    assert_eq!((s.flows, s.moved_flows), (1, 1), "only the moved flow");
    // SYNs of more flows than the flow table holds: the LRU evicts, the moved flow stays.
    let n = farside_frontend::FLOWS_MAX as u32 + 4096;
    for i in 0..n {
        let f = frame(Shape {
            src: client_n(i),
            ..Shape::tcp(SYN)
        });
        assert_eq!(run(&fe, &f).0, verdict::REDIRECT);
    }
    let s = fe.stats().unwrap();
    assert!(s.flows <= farside_frontend::FLOWS_MAX + 1, "{}", s.flows);
    assert_eq!(s.moved_flows, 1);
    data_to(
        &fe,
        CLIENT,
        mac_of(other),
        "moved flow after the LRU turned over",
    );
}

/// The moved-flow table is bounded: past `MOVED_MAX` a MOVE (control or one-sided)
/// is refused and counted, nothing is written, the flow stays where it was; sweeping
/// idle moved flows makes room again.
#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn a_full_moved_table_refuses_moves_and_the_sweep_frees_it() {
    need_root();
    let mut fe = load_move();
    let c = client(1);
    open_flow(&fe, c);
    for i in 0..farside_frontend::MOVED_MAX as u32 {
        let other = SocketAddrV4::new(
            Ipv4Addr::from(0x0a90_0000 | (i >> 14)),
            (i & 0x3fff) as u16 + 1,
        );
        fe.move_flow(other, B_IP).unwrap();
    }
    assert_eq!(fe.stats().unwrap().moved_flows, farside_frontend::MOVED_MAX);
    let r = MoveRequest {
        seq: 1,
        client: c,
        expected: A_IP,
        next: B_IP,
    };
    assert_eq!(move_reply(&fe, A_MAC, A_IP, &r, true), MoveStatus::Full);
    assert_eq!(fe.flow(c).unwrap(), Some((A_IP, false)), "not moved");
    let e = fe.move_flow(c, B_IP).unwrap_err();
    assert!(e.to_string().contains("moved-flow table is full"), "{e}");
    assert_eq!(counter(&fe, "move_full"), 2);
    data_to(&fe, c, A_MAC, "a refused move leaves the flow where it was");
    // Nothing is idle for an hour yet; everything is idle for 0 s.
    assert_eq!(
        fe.expire_moved(std::time::Duration::from_secs(3600))
            .unwrap(),
        0
    );
    let removed = fe.expire_moved(std::time::Duration::ZERO).unwrap();
    assert_eq!(removed, farside_frontend::MOVED_MAX);
    let r = MoveRequest { seq: 2, ..r };
    assert_eq!(move_reply(&fe, A_MAC, A_IP, &r, true), MoveStatus::Moved);
    assert!(fe.is_moved(c).unwrap());
    data_to(&fe, c, B_MAC, "moved once there was room");
}

/// A hold ends by itself: after its time the flow is forwarded again (counted
/// `hold_expired`); holds longer than `HOLD_TTL_MAX` are refused.
#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn a_hold_expires_by_itself() {
    need_root();
    let mut fe = load(1, 0);
    let syn = frame(Shape::tcp(SYN));
    assert_forwarded("SYN", &syn, run(&fe, &syn), A_MAC);
    let data = frame(Shape {
        payload: 10,
        ..Shape::tcp(ACK)
    });
    let ttl = std::time::Duration::from_millis(50);
    fe.set_hold(CLIENT, Some(ttl)).unwrap();
    assert_eq!(fe.flow(CLIENT).unwrap(), Some((A_IP, true)));
    assert_eq!(run(&fe, &data).0, verdict::DROP);
    std::thread::sleep(ttl + std::time::Duration::from_millis(10));
    assert_eq!(fe.flow(CLIENT).unwrap(), Some((A_IP, false)), "hold over");
    assert_forwarded("after the hold's time", &data, run(&fe, &data), A_MAC);
    assert_eq!(counter(&fe, "hold_expired"), 1);
    assert_eq!(counter(&fe, "held"), 1);
    // The default hold is bounded too, and too long a hold is refused.
    fe.set_held(CLIENT, true).unwrap();
    assert_eq!(run(&fe, &data).0, verdict::DROP);
    fe.set_held(CLIENT, false).unwrap();
    assert!(fe
        .set_hold(
            CLIENT,
            Some(farside_frontend::HOLD_TTL_MAX + std::time::Duration::from_secs(1))
        )
        .is_err());
    assert_eq!(farside_frontend::HOLD_TTL_DEFAULT.as_secs(), 5);
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn weighted_split_of_new_flows_matches_the_user_space_hash() {
    need_root();
    for (wa, wb) in [(75, 25), (67, 33)] {
        let mut fe = load(wa, wb);
        let t = fe.table().unwrap();
        let mut n = [0u64; 2];
        for i in 0..4000u32 {
            let c = SocketAddrV4::new(
                Ipv4Addr::from(0x0a00_0900 | (i % 200)),
                20_000 + (i / 200) as u16 * 7,
            );
            let f = frame(Shape {
                src: c,
                ..Shape::tcp(SYN)
            });
            let want = table::backend_for(&t, &fe.hash_key(), c, VIP);
            assert_forwarded("SYN", &f, run(&fe, &f), mac_of(want));
            n[want as usize] += 1;
        }
        let s = fe.stats().unwrap();
        assert_eq!(s.backends[0].new_flows, n[0]);
        assert_eq!(s.backends[1].new_flows, n[1]);
        let share = n[0] as f64 / 4000.0;
        let want = f64::from(wa) / f64::from(wa + wb);
        // 4,000 flows: one standard deviation of the share is ~0.7 %; 3 % is > 4 sd.
        assert!((share - want).abs() < 0.03, "{wa}/{wb}: share {share}");
        // New weights change where new flows go, not existing entries.
        fe.set_weights(&[(A_IP, 0)]).unwrap();
        let old = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 0), 20_000);
        let before = fe.flow(old).unwrap().unwrap().0;
        let f = frame(Shape {
            src: old,
            ..Shape::tcp(ACK)
        });
        assert_forwarded(
            "existing flow after WEIGHTS",
            &f,
            run(&fe, &f),
            if before == A_IP { A_MAC } else { B_MAC },
        );
        let fresh = frame(Shape {
            src: SocketAddrV4::new(Ipv4Addr::new(10, 0, 8, 1), 1234),
            ..Shape::tcp(SYN)
        });
        assert_forwarded("new flow after A=0", &fresh, run(&fe, &fresh), B_MAC);
    }
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn what_is_not_ours_passes_and_what_cannot_be_verified_is_dropped() {
    need_root();
    let fe = load(1, 1);
    let other_mac = [0x02, 0, 0, 0, 0x99, 0x99];
    let base = Shape::tcp(SYN);
    // (description, frame, verdict, counter that must grow)
    let cases: Vec<(&str, Vec<u8>, u32, &str)> = vec![
        (
            "other port",
            frame(Shape {
                dst: SocketAddrV4::new(*VIP.ip(), 81),
                ..base
            }),
            verdict::PASS,
            "passed",
        ),
        (
            "other address",
            frame(Shape {
                dst: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 80),
                ..base
            }),
            verdict::PASS,
            "passed",
        ),
        (
            "UDP to the VIP",
            frame(Shape { proto: 17, ..base }),
            verdict::PASS,
            "passed",
        ),
        (
            "IPv6 ethertype",
            frame(Shape {
                ethertype: 0x86dd,
                ..base
            }),
            verdict::PASS,
            "passed",
        ),
        (
            "ARP ethertype",
            frame(Shape {
                ethertype: 0x0806,
                ..base
            }),
            verdict::PASS,
            "passed",
        ),
        (
            "another host's MAC",
            frame(Shape {
                dst_mac: other_mac,
                ..base
            }),
            verdict::PASS,
            "passed",
        ),
        (
            "TCP header truncated",
            frame(Shape { cut: 10, ..base }),
            verdict::DROP,
            "malformed",
        ),
        (
            "total length beyond the frame",
            frame(Shape {
                tot_len_extra: 1,
                ..base
            }),
            verdict::DROP,
            "malformed",
        ),
        (
            "total length below IP + TCP",
            frame(Shape {
                tot_len_extra: -1,
                ..base
            }),
            verdict::DROP,
            "malformed",
        ),
        (
            "IHL 4",
            frame(Shape {
                ihl_override: Some(4),
                ..base
            }),
            verdict::DROP,
            "malformed",
        ),
        (
            "TCP data offset 4",
            frame(Shape { doff: 4, ..base }),
            verdict::DROP,
            "malformed",
        ),
        (
            "TCP data offset beyond the packet",
            frame(Shape { doff: 15, ..base }),
            verdict::DROP,
            "malformed",
        ),
        (
            "IP options",
            frame(Shape {
                ip_option_words: 2,
                ..base
            }),
            verdict::DROP,
            "ip_options",
        ),
        (
            "first fragment (MF)",
            frame(Shape {
                frag_off: 0x2000,
                ..base
            }),
            verdict::DROP,
            "fragment",
        ),
        (
            "later fragment (offset)",
            frame(Shape {
                frag_off: 0x0010,
                ..base
            }),
            verdict::DROP,
            "fragment",
        ),
    ];
    for (what, f, want, counter_name) in cases {
        let before = counter(&fe, counter_name);
        let (v, out) = run(&fe, &f);
        assert_eq!(v, want, "{what}: verdict");
        assert_eq!(out, f, "{what}: frame untouched");
        assert_eq!(
            counter(&fe, counter_name),
            before + 1,
            "{what}: {counter_name}"
        );
    }
    let s = fe.stats().unwrap();
    assert_eq!(s.flows, 0, "nothing recorded");
    assert!(
        s.backends.iter().all(|b| b.packets == 0),
        "nothing forwarded"
    );
    // A frame shorter than its IPv4 header never reaches the program in a test run
    // (the kernel refuses it, EINVAL); the program's bounds check drops it on a
    // live interface (FE_CNT_MALFORMED).
    assert!(fe.test_run(&frame(Shape { cut: 30, ..base })).is_err());
    // Ethernet padding after a well-formed packet is fine.
    let mut padded = frame(base);
    padded.extend_from_slice(&[0; 6]);
    assert_eq!(run(&fe, &padded).0, verdict::REDIRECT);
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn per_packet_cost_is_reported() {
    need_root();
    let fe = load(75, 25);
    let data = frame(Shape {
        payload: 1000,
        ..Shape::tcp(ACK)
    });
    run(&fe, &data);
    let (v, ns) = fe.test_run_mean_ns(&data, 10_000).unwrap();
    assert_eq!(v, verdict::REDIRECT);
    // Informative only (busy machine): the flow-table hit path.
    eprintln!("flow-table hit: {ns} ns per packet (BPF_PROG_TEST_RUN, 10,000 runs)");
}

// ---- The one-sided MOVE (UDP to the front-end's own address, answered in the kernel).

use farside_frontend::fmove::{MoveRequest, MoveStatus, MSG_BYTES, OP_REPLY};

const FE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const MOVE_PORT: u16 = 7400;
const REQ_PORT: u16 = 45_678;
const C_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xcc, 0x01];
const C_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 13);

/// A front-end of A, B, C (weights 1, 0, 0: every new flow to A) answering MOVE.
fn load_move() -> Frontend {
    let backends = [(A_MAC, A_IP, 1), (B_MAC, B_IP, 0), (C_MAC, C_IP, 0)]
        .map(|(mac, ip, weight)| BackendSpec { mac, ip, weight });
    let mut fe = Frontend::load(VIP, &backends, FE_MAC, IFINDEX).expect("load (root?)");
    fe.set_move_udp(FE_IP, MOVE_PORT).unwrap();
    assert_eq!(fe.move_udp(), Some(SocketAddrV4::new(FE_IP, MOVE_PORT)));
    fe
}

/// How to shape a MOVE datagram.
#[derive(Clone)]
struct MoveShape {
    src_mac: [u8; 6],
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    dport: u16,
    payload: Vec<u8>,
    ip_option_words: u8,
    frag_off: u16,
    /// Compute the UDP checksum (else 0: none).
    udp_csum: bool,
}

impl MoveShape {
    fn from(src_mac: [u8; 6], src_ip: Ipv4Addr, req: &MoveRequest) -> MoveShape {
        MoveShape {
            src_mac,
            src_ip,
            dst_ip: FE_IP,
            dport: MOVE_PORT,
            payload: req.encode().to_vec(),
            ip_option_words: 0,
            frag_off: 0x4000,
            udp_csum: true,
        }
    }
}

fn csum_fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn sum16(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

/// The UDP checksum of `udp` (header with its checksum field, and data) between
/// `src` and `dst`: 0 when the field is right (or 0 = none).
fn udp_csum_check(src: &[u8], dst: &[u8], udp: &[u8]) -> u16 {
    let pseudo = sum16(src) + sum16(dst) + 17 + udp.len() as u32;
    csum_fold(pseudo + sum16(udp))
}

fn move_frame(s: &MoveShape) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&FE_MAC);
    f.extend_from_slice(&s.src_mac);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let ihl = 5 + s.ip_option_words;
    let udp_len = 8 + s.payload.len();
    let tot = ihl as usize * 4 + udp_len;
    let ip_start = f.len();
    f.push(0x40 | ihl);
    f.push(0);
    f.extend_from_slice(&(tot as u16).to_be_bytes());
    f.extend_from_slice(&[0x12, 0x34]);
    f.extend_from_slice(&s.frag_off.to_be_bytes());
    f.push(64);
    f.push(17);
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&s.src_ip.octets());
    f.extend_from_slice(&s.dst_ip.octets());
    f.extend(std::iter::repeat_n(1u8, s.ip_option_words as usize * 4));
    let ip_csum = csum_fold(sum16(&f[ip_start..]));
    f[ip_start + 10..ip_start + 12].copy_from_slice(&ip_csum.to_be_bytes());
    let udp_start = f.len();
    f.extend_from_slice(&REQ_PORT.to_be_bytes());
    f.extend_from_slice(&s.dport.to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&s.payload);
    if s.udp_csum {
        let mut c = udp_csum_check(&s.src_ip.octets(), &s.dst_ip.octets(), &f[udp_start..]);
        if c == 0 {
            c = 0xffff;
        }
        f[udp_start + 6..udp_start + 8].copy_from_slice(&c.to_be_bytes());
    }
    f
}

/// Runs a well-formed MOVE `req` sent by `(mac, ip)` and checks the reply frame: back
/// to the sender (MACs, IPs, ports swapped), IP checksum unchanged and valid, UDP
/// checksum valid (or still 0), the payload the reply to `req`. Returns its status.
fn move_reply(
    fe: &Frontend,
    mac: [u8; 6],
    ip: Ipv4Addr,
    req: &MoveRequest,
    csum: bool,
) -> MoveStatus {
    let shape = MoveShape {
        udp_csum: csum,
        ..MoveShape::from(mac, ip, req)
    };
    let f = move_frame(&shape);
    let (v, out) = run(fe, &f);
    assert_eq!(v, verdict::REDIRECT, "MOVE answered and sent back out");
    assert_eq!(out.len(), f.len());
    assert_eq!(&out[0..6], &mac, "to the requester's MAC");
    assert_eq!(&out[6..12], &FE_MAC, "from the front-end's");
    assert_eq!(
        &out[12..26],
        &f[12..26],
        "IP header up to the addresses unchanged"
    );
    assert_eq!(&out[26..30], &FE_IP.octets());
    assert_eq!(&out[30..34], &ip.octets());
    assert_eq!(csum_fold(sum16(&out[14..34])), 0, "IP checksum still right");
    assert_eq!(&out[34..36], &MOVE_PORT.to_be_bytes());
    assert_eq!(&out[36..38], &REQ_PORT.to_be_bytes());
    if csum {
        assert_eq!(
            udp_csum_check(&out[26..30], &out[30..34], &out[34..]),
            0,
            "UDP checksum fixed"
        );
    } else {
        assert_eq!(&out[40..42], &[0, 0], "no UDP checksum stays none");
    }
    let payload = &out[42..];
    assert_eq!(payload.len(), MSG_BYTES);
    assert_eq!(payload[5], OP_REPLY);
    req.match_reply(payload).expect("the reply to this request")
}

fn client(n: u8) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, n), 40_000 + u16::from(n))
}

/// Opens `c`'s flow (a SYN: every new flow goes to A).
fn open_flow(fe: &Frontend, c: SocketAddrV4) {
    let syn = frame(Shape {
        src: c,
        ..Shape::tcp(SYN)
    });
    assert_forwarded("SYN", &syn, run(fe, &syn), A_MAC);
}

fn data_to(fe: &Frontend, c: SocketAddrV4, mac: [u8; 6], what: &str) {
    let d = frame(Shape {
        src: c,
        payload: 100,
        ..Shape::tcp(ACK)
    });
    assert_forwarded(what, &d, run(fe, &d), mac);
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn one_sided_move_moved_already_not_owner_not_found() {
    need_root();
    let mut fe = load_move();
    let c = client(1);
    open_flow(&fe, c);
    let req = |seq, expected, next| MoveRequest {
        seq,
        client: c,
        expected,
        next,
    };

    // MOVED: A gives the flow to B; its next packets go to B.
    let r = req(7, A_IP, B_IP);
    assert_eq!(move_reply(&fe, A_MAC, A_IP, &r, true), MoveStatus::Moved);
    assert_eq!(fe.flow(c).unwrap(), Some((B_IP, false)));
    data_to(&fe, c, B_MAC, "after MOVED");
    assert_eq!(counter(&fe, "moved"), 1);

    // ALREADY: the same request again (its reply was lost); a checksum-less one too.
    assert_eq!(move_reply(&fe, A_MAC, A_IP, &r, true), MoveStatus::Already);
    assert_eq!(move_reply(&fe, A_MAC, A_IP, &r, false), MoveStatus::Already);
    assert_eq!(counter(&fe, "move_already"), 2);
    assert_eq!(fe.flow(c).unwrap(), Some((B_IP, false)));

    // A held flow is released by its move (MOVED and ALREADY alike).
    fe.set_held(c, true).unwrap();
    assert_eq!(
        move_reply(&fe, B_MAC, B_IP, &req(8, B_IP, A_IP), true),
        MoveStatus::Moved
    );
    assert_eq!(fe.flow(c).unwrap(), Some((A_IP, false)));
    fe.set_held(c, true).unwrap();
    assert_eq!(
        move_reply(&fe, B_MAC, B_IP, &req(9, B_IP, A_IP), true),
        MoveStatus::Already
    );
    assert_eq!(fe.flow(c).unwrap(), Some((A_IP, false)));
    data_to(&fe, c, A_MAC, "after a held flow's move");

    // NOT_OWNER: the entry names A; B asks to give it to C: nothing changes.
    assert_eq!(
        move_reply(&fe, B_MAC, B_IP, &req(10, B_IP, C_IP), true),
        MoveStatus::NotOwner
    );
    assert_eq!(fe.flow(c).unwrap(), Some((A_IP, false)));
    assert_eq!(counter(&fe, "move_not_owner"), 1);

    // NOT_FOUND: no entry (evicted, never seen): nothing is written.
    let stranger = client(2);
    let r = MoveRequest {
        seq: 11,
        client: stranger,
        expected: A_IP,
        next: B_IP,
    };
    assert_eq!(move_reply(&fe, A_MAC, A_IP, &r, true), MoveStatus::NotFound);
    assert_eq!(fe.flow(stranger).unwrap(), None);
    assert_eq!(counter(&fe, "move_not_found"), 1);
    let s = fe.stats().unwrap();
    assert_eq!(s.counters["move_malformed"], 0);
    assert_eq!(s.counters["move_refused"], 0);
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn bad_move_requests_are_dropped_or_passed_and_forwarding_is_unchanged() {
    need_root();
    let mut fe = load_move();
    let c = client(1);
    open_flow(&fe, c);
    let good = MoveRequest {
        seq: 1,
        client: c,
        expected: A_IP,
        next: B_IP,
    };
    let base = MoveShape::from(A_MAC, A_IP, &good);
    let with_payload = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut s = base.clone();
        f(&mut s.payload);
        s
    };
    let unknown = Ipv4Addr::new(10, 0, 0, 99);
    let cases: Vec<(&str, MoveShape, u32, &str)> = vec![
        (
            "bad magic",
            with_payload(&|p| p[0] ^= 1),
            verdict::DROP,
            "move_malformed",
        ),
        (
            "version 2",
            with_payload(&|p| p[4] = 2),
            verdict::DROP,
            "move_malformed",
        ),
        (
            "op reply",
            with_payload(&|p| p[5] = OP_REPLY),
            verdict::DROP,
            "move_malformed",
        ),
        (
            "status set",
            with_payload(&|p| p[7] = 1),
            verdict::DROP,
            "move_malformed",
        ),
        (
            "reserved set",
            with_payload(&|p| p[23] = 1),
            verdict::DROP,
            "move_malformed",
        ),
        (
            "one byte short",
            with_payload(&|p| {
                p.pop();
            }),
            verdict::DROP,
            "move_malformed",
        ),
        (
            "one byte long",
            with_payload(&|p| p.push(0)),
            verdict::DROP,
            "move_malformed",
        ),
        (
            "empty",
            with_payload(&|p| p.clear()),
            verdict::DROP,
            "move_malformed",
        ),
        (
            "IP options",
            MoveShape {
                ip_option_words: 2,
                ..base.clone()
            },
            verdict::DROP,
            "move_malformed",
        ),
        (
            "first fragment (MF)",
            MoveShape {
                frag_off: 0x2000,
                ..base.clone()
            },
            verdict::DROP,
            "move_malformed",
        ),
        (
            "sender is not the expected back-end",
            MoveShape {
                src_mac: B_MAC,
                src_ip: B_IP,
                ..base.clone()
            },
            verdict::DROP,
            "move_refused",
        ),
        (
            "expected back-end not configured",
            MoveShape::from(
                A_MAC,
                unknown,
                &MoveRequest {
                    expected: unknown,
                    ..good
                },
            ),
            verdict::DROP,
            "move_refused",
        ),
        (
            "new back-end not configured",
            MoveShape::from(
                A_MAC,
                A_IP,
                &MoveRequest {
                    next: unknown,
                    ..good
                },
            ),
            verdict::DROP,
            "move_refused",
        ),
        (
            "later fragment (no port to read)",
            MoveShape {
                frag_off: 0x0010,
                ..base.clone()
            },
            verdict::PASS,
            "passed",
        ),
        (
            "another UDP port of the front-end",
            MoveShape {
                dport: MOVE_PORT + 1,
                ..base.clone()
            },
            verdict::PASS,
            "passed",
        ),
        (
            "another address",
            MoveShape {
                dst_ip: Ipv4Addr::new(10, 0, 0, 3),
                ..base.clone()
            },
            verdict::PASS,
            "passed",
        ),
    ];
    for (what, shape, want, counter_name) in cases {
        let f = move_frame(&shape);
        let before = counter(&fe, counter_name);
        let (v, out) = run(&fe, &f);
        assert_eq!(v, want, "{what}: verdict");
        assert_eq!(out, f, "{what}: frame untouched");
        assert_eq!(
            counter(&fe, counter_name),
            before + 1,
            "{what}: {counter_name}"
        );
        assert_eq!(
            fe.flow(c).unwrap(),
            Some((A_IP, false)),
            "{what}: flow unchanged"
        );
    }
    let s = fe.stats().unwrap();
    for k in ["moved", "move_already", "move_not_owner", "move_not_found"] {
        assert_eq!(s.counters[k], 0, "{k}");
    }
    // TCP to the front-end's address and move port is not a MOVE: passed.
    let tcp = frame(Shape {
        dst: SocketAddrV4::new(FE_IP, MOVE_PORT),
        ..Shape::tcp(SYN)
    });
    assert_eq!(run(&fe, &tcp), (verdict::PASS, tcp.clone()));
    // Forwarding is as before with the MOVE on: the flow still goes to A.
    data_to(&fe, c, A_MAC, "forwarding with MOVE on");
    // MOVE off (port 0): the datagram is the stack's, and nothing moves.
    fe.set_move_udp(FE_IP, 0).unwrap();
    assert_eq!(fe.move_udp(), None);
    let f = move_frame(&base);
    assert_eq!(run(&fe, &f), (verdict::PASS, f.clone()));
    assert_eq!(fe.flow(c).unwrap(), Some((A_IP, false)));
    assert!(fe.set_move_udp(Ipv4Addr::UNSPECIFIED, MOVE_PORT).is_err());
}

/// The flow hash's key is drawn per start (getrandom), not a constant: two front-ends
/// place the same flows differently, each exactly where its own key says.
#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn the_flow_hash_key_is_secret_and_drawn_per_start() {
    need_root();
    let (f1, f2) = (load(1, 1), load(1, 1));
    assert_ne!(f1.hash_key(), f2.hash_key());
    let t = f1.table().unwrap();
    let mut differ = 0;
    for i in 0..64u32 {
        let c = SocketAddrV4::new(Ipv4Addr::new(10, 0, 7, i as u8), 30_000 + i as u16);
        let f = frame(Shape {
            src: c,
            ..Shape::tcp(SYN)
        });
        let (b1, b2) = (
            table::backend_for(&t, &f1.hash_key(), c, VIP),
            table::backend_for(&t, &f2.hash_key(), c, VIP),
        );
        assert_forwarded("SYN, first", &f, run(&f1, &f), mac_of(b1));
        assert_forwarded("SYN, second", &f, run(&f2, &f), mac_of(b2));
        differ += u32::from(b1 != b2);
    }
    // Half of 64 flows land differently on average; none would with a public seed.
    assert!(differ > 8, "{differ} of 64 placed differently");
}

// ---- The authenticated one-sided MOVE (a key installed: `--key-file`).

use farside_auth::mac::KeyId;
use farside_auth::siphash::SipKey;
use farside_frontend::fmove::{MoveKey, SEALED_BYTES};

const MOVE_KEY: MoveKey = MoveKey {
    id: KeyId(7),
    key: SipKey::from_halves(0x0f1e_2d3c_4b5a_6978, 0x8796_a5b4_c3d2_e1f0),
};

/// A front-end answering only MOVEs sealed under [`MOVE_KEY`].
fn load_sealed_move() -> Frontend {
    let mut fe = load_move();
    fe.add_move_key(MOVE_KEY.id, MOVE_KEY.key).unwrap();
    assert!(fe.move_authenticated());
    fe
}

/// Runs a MOVE with `payload` from A and, if answered, checks the reply frame as
/// [`move_reply`] does and returns it: verdict and the reply's payload.
fn run_sealed(fe: &Frontend, payload: Vec<u8>) -> (u32, Vec<u8>) {
    let shape = MoveShape {
        payload,
        ..MoveShape::from(
            A_MAC,
            A_IP,
            &MoveRequest {
                seq: 0,
                client: client(1),
                expected: A_IP,
                next: B_IP,
            },
        )
    };
    let f = move_frame(&shape);
    let (v, out) = run(fe, &f);
    if v != verdict::REDIRECT {
        assert_eq!(out, f, "a dropped MOVE is untouched");
        return (v, Vec::new());
    }
    assert_eq!(&out[0..6], &A_MAC);
    assert_eq!(&out[6..12], &FE_MAC);
    assert_eq!(&out[26..30], &FE_IP.octets());
    assert_eq!(&out[30..34], &A_IP.octets());
    assert_eq!(csum_fold(sum16(&out[14..34])), 0, "IP checksum still right");
    assert_eq!(
        udp_csum_check(&out[26..30], &out[30..34], &out[34..]),
        0,
        "UDP checksum fixed for the new tag, sender and status"
    );
    (v, out[42..].to_vec())
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn sealed_moves_are_verified_replayed_ones_and_forgeries_dropped() {
    need_root();
    let fe = load_sealed_move();
    // Envelope sequences as senders make them: above the clock floor of the load.
    let base = farside_auth::floor::clock_seq(farside_auth::replay::Sequencer::unix_s());
    let c = client(1);
    open_flow(&fe, c);
    let req = MoveRequest {
        seq: 5,
        client: c,
        expected: A_IP,
        next: B_IP,
    };
    // Authentic: moved; the reply is sealed by the front-end and echoes the sequence.
    let good = req.seal(&MOVE_KEY, A_IP, base + 1000);
    let (v, reply) = run_sealed(&fe, good.clone());
    assert_eq!(v, verdict::REDIRECT);
    assert_eq!(reply.len(), SEALED_BYTES);
    assert_eq!(
        req.match_sealed_reply(&MOVE_KEY, FE_IP, base + 1000, &reply),
        Some(MoveStatus::Moved)
    );
    assert_eq!(fe.flow(c).unwrap(), Some((B_IP, false)));
    data_to(&fe, c, B_MAC, "after the sealed MOVE");

    let back = MoveRequest {
        seq: 6,
        client: c,
        expected: B_IP,
        next: A_IP,
    };
    let mut forged_tag = back.seal(&MOVE_KEY, B_IP, base + 1001);
    forged_tag[0] ^= 1;
    let mut forged_msg = req.seal(&MOVE_KEY, A_IP, base + 1002);
    forged_msg[SEALED_BYTES - 1] ^= 1;
    let mut unknown_key = req.seal(&MOVE_KEY, A_IP, base + 1003);
    unknown_key[8] = 8;
    let other_key = MoveKey {
        id: MOVE_KEY.id,
        key: SipKey::from_halves(1, 2),
    };
    // (description, payload, verdict, counter that must grow)
    let cases: Vec<(&str, Vec<u8>, u32, &str)> = vec![
        (
            "the same datagram again (replay)",
            good.clone(),
            verdict::DROP,
            "move_replay",
        ),
        (
            "an older sequence",
            req.seal(&MOVE_KEY, A_IP, base + 999),
            verdict::DROP,
            "move_replay",
        ),
        (
            "unsealed (32 bytes)",
            req.encode().to_vec(),
            verdict::DROP,
            "move_unauth",
        ),
        (
            "a flipped tag bit",
            forged_tag,
            verdict::DROP,
            "move_unauth",
        ),
        (
            "a flipped message bit",
            forged_msg,
            verdict::DROP,
            "move_unauth",
        ),
        (
            "an unknown key id",
            unknown_key,
            verdict::DROP,
            "move_unauth",
        ),
        (
            "sealed under another key",
            req.seal(&other_key, A_IP, base + 1004),
            verdict::DROP,
            "move_unauth",
        ),
        (
            "sender is not the expected back-end",
            req.seal(&MOVE_KEY, C_IP, base + 1005),
            verdict::DROP,
            "move_refused",
        ),
        (
            "sequence 0",
            req.seal(&MOVE_KEY, A_IP, 0),
            verdict::DROP,
            "move_replay",
        ),
        (
            "a sequence of a second before the load (at or below fe_move_floor)",
            req.seal(&MOVE_KEY, A_IP, fe.move_seq_floor().unwrap()),
            verdict::DROP,
            "move_replay",
        ),
    ];
    for (what, payload, want, counter_name) in cases {
        let before = counter(&fe, counter_name);
        assert_eq!(run_sealed(&fe, payload).0, want, "{what}: verdict");
        assert_eq!(
            counter(&fe, counter_name),
            before + 1,
            "{what}: {counter_name}"
        );
        assert_eq!(
            fe.flow(c).unwrap(),
            Some((B_IP, false)),
            "{what}: flow unchanged"
        );
    }
    // A newer sequence of A is fine (ALREADY); B's own sequences are its own.
    let (_, reply) = run_sealed(&fe, req.seal(&MOVE_KEY, A_IP, base + 2000));
    assert_eq!(
        req.match_sealed_reply(&MOVE_KEY, FE_IP, base + 2000, &reply),
        Some(MoveStatus::Already)
    );
    let shape = MoveShape {
        payload: back.seal(&MOVE_KEY, B_IP, base + 5),
        ..MoveShape::from(B_MAC, B_IP, &back)
    };
    let (v, out) = run(&fe, &move_frame(&shape));
    assert_eq!(v, verdict::REDIRECT);
    assert_eq!(
        back.match_sealed_reply(&MOVE_KEY, FE_IP, base + 5, &out[42..]),
        Some(MoveStatus::Moved)
    );
    assert_eq!(fe.flow(c).unwrap(), Some((A_IP, false)));
}

/// A sealed MOVE captured before the front-end restarted is refused after it: the new
/// program's fe_replay is empty (no pinned maps), but the loader seeded fe_move_floor
/// with the clock floor of its start and senders seal with clock sequences. A fresh
/// MOVE of the same sender is answered.
#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn a_move_captured_before_a_restart_is_refused_after_it() {
    use farside_auth::replay::Sequencer;
    need_root();
    let fe = load_sealed_move();
    let start_floor = fe.move_seq_floor().unwrap();
    assert_eq!(start_floor % (1 << 32), (1 << 32) - 1, "a second's edge");
    let c = client(1);
    open_flow(&fe, c);
    let req = MoveRequest {
        seq: 5,
        client: c,
        expected: A_IP,
        next: B_IP,
    };
    let env_seq = farside_frontend::fmove::next_envelope_seq();
    assert!(env_seq > start_floor);
    let captured = req.seal(&MOVE_KEY, A_IP, env_seq);
    assert_eq!(run_sealed(&fe, captured.clone()).0, verdict::REDIRECT);
    assert_eq!(fe.flow(c).unwrap(), Some((B_IP, false)));
    drop(fe);

    // The restart, in a later second than the capture was sealed in (awaited: at
    // most a second).
    let sealed_s = env_seq >> farside_auth::replay::SEQ_COUNT_BITS;
    while Sequencer::unix_s() <= sealed_s {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let fe = load_sealed_move();
    assert!(
        fe.move_seq_floor().unwrap() >= env_seq,
        "the floor passed the capture"
    );
    open_flow(&fe, c);
    let before = counter(&fe, "move_replay");
    assert_eq!(run_sealed(&fe, captured).0, verdict::DROP, "the replay");
    assert_eq!(counter(&fe, "move_replay"), before + 1);
    assert_eq!(fe.flow(c).unwrap(), Some((A_IP, false)), "not moved");
    let fresh = req.seal(
        &MOVE_KEY,
        A_IP,
        farside_frontend::fmove::next_envelope_seq(),
    );
    assert_eq!(run_sealed(&fe, fresh).0, verdict::REDIRECT, "a fresh MOVE");
    assert_eq!(fe.flow(c).unwrap(), Some((B_IP, false)));
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn a_move_is_answered_only_on_the_move_interface() {
    need_root();
    let mut fe = load_move();
    let c = client(1);
    open_flow(&fe, c);
    // The cluster-facing interface is another one (index 999): MOVE on this one is
    // dropped and counted; routing the VIP here goes on.
    fe.set_move_ifindex(999, [0x02, 0, 0, 0, 0xfe, 0x99])
        .unwrap();
    let r = MoveRequest {
        seq: 1,
        client: c,
        expected: A_IP,
        next: B_IP,
    };
    let f = move_frame(&MoveShape::from(A_MAC, A_IP, &r));
    assert_eq!(run(&fe, &f), (verdict::DROP, f.clone()));
    assert_eq!(counter(&fe, "move_wrong_iface"), 1);
    assert_eq!(fe.flow(c).unwrap(), Some((A_IP, false)));
    data_to(&fe, c, A_MAC, "routing on the client-facing interface");
    // Back on this interface (the default): answered.
    fe.set_move_ifindex(IFINDEX, FE_MAC).unwrap();
    assert_eq!(move_reply(&fe, A_MAC, A_IP, &r, true), MoveStatus::Moved);
}

// ---- Pinned maps: a restart keeps flows.

/// A bpffs mounted on a fresh directory for one test, unmounted on drop (the
/// machine's /sys/fs/bpf may not be one).
struct Bpffs(std::path::PathBuf);

impl Bpffs {
    fn mount(tag: &str) -> Bpffs {
        let p = std::env::temp_dir().join(format!("fe-bpffs-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&p)
            .status()
            .unwrap();
        assert!(st.success(), "mount -t bpf");
        assert!(farside_frontend::pin::is_bpffs(&p));
        Bpffs(p)
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn load_pinned(
    backends: &[(Ipv4Addr, [u8; 6])],
    dir: &std::path::Path,
) -> (Frontend, farside_frontend::pin::Restored) {
    let specs: Vec<BackendSpec> = backends
        .iter()
        .map(|&(ip, mac)| BackendSpec { mac, ip, weight: 1 })
        .collect();
    Frontend::load_pinned(VIP, &specs, FE_MAC, IFINDEX, Some(dir)).expect("load (root?)")
}

/// A front-end restarted on pinned maps keeps every flow where it was (SYN-made and
/// moved), its hash key (flows without an entry hash as before) and its replay state;
/// pins of other back-ends are discarded, not misread.
#[test]
#[ignore = "needs root (BPF, mount): cargo test -p farside-frontend -- --include-ignored"]
fn a_restart_on_pinned_maps_keeps_every_flow_on_its_backend() {
    need_root();
    let fs = Bpffs::mount("restart");
    let dir = farside_frontend::pin::pin_dir(&fs.0, "lan0");
    let ab = [(A_IP, A_MAC), (B_IP, B_MAC)];
    let (mut fe, r) = load_pinned(&ab, &dir);
    assert_eq!(
        r,
        farside_frontend::pin::Restored::default(),
        "nothing pinned yet"
    );
    for name in farside_frontend::pin::PINNED_MAPS {
        assert!(dir.join(name).exists(), "{name} pinned");
    }
    let t = fe.table().unwrap();
    let key = fe.hash_key();
    // 40 flows opened by SYNs, one of them moved to the other back-end.
    let flows: Vec<SocketAddrV4> = (0..40).map(|i| client(i + 1)).collect();
    for &c in &flows {
        let syn = frame(Shape {
            src: c,
            ..Shape::tcp(SYN)
        });
        run(&fe, &syn);
    }
    let where_ = |c: SocketAddrV4| table::backend_for(&t, &key, c, VIP);
    let moved = flows[0];
    let moved_to = 1 - where_(moved);
    fe.move_flow(moved, [A_IP, B_IP][moved_to as usize])
        .unwrap();
    drop(fe); // the process ends; the pins stay

    let (fe, r) = load_pinned(&ab, &dir);
    assert_eq!(r.hash_key, Some(key), "the hash key is kept");
    assert_eq!((r.flows, r.moved, r.discarded), (39, 1, false));
    assert_eq!(fe.hash_key(), key);
    data_to(
        &fe,
        moved,
        mac_of(moved_to),
        "the moved flow after the restart",
    );
    assert!(fe.is_moved(moved).unwrap());
    for &c in &flows[1..] {
        data_to(&fe, c, mac_of(where_(c)), "a flow after the restart");
    }
    assert_eq!(counter(&fe, "nonsyn_miss"), 0, "every flow found its entry");
    drop(fe);

    // Other back-ends: the pinned indices would name other hosts: discarded.
    let ac = [(A_IP, A_MAC), (C_IP, C_MAC)];
    let (fe, r) = load_pinned(&ac, &dir);
    assert!(r.discarded);
    assert_eq!((r.flows, r.moved, r.hash_key), (0, 0, None));
    assert_ne!(fe.hash_key(), key);
    assert_eq!(fe.flow(moved).unwrap(), None);
    drop(fe);
    farside_frontend::pin::unpin(&dir).unwrap();
    assert!(!dir.exists());
}

/// End to end through the program: a weight change 75/25 -> 67/33 re-places about 8 %
/// of new flows (the least possible), not the ~42 % the round-robin table moved.
#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn a_weight_change_re_places_few_new_flows() {
    need_root();
    let mut fe = load(75, 25);
    let flows: Vec<SocketAddrV4> = (0..2000u32)
        .map(|i| SocketAddrV4::new(Ipv4Addr::from(0x0a05_0000 | i), 40_000 + (i % 1000) as u16))
        .collect();
    let place = |fe: &Frontend| -> Vec<Vec<u8>> {
        flows
            .iter()
            .map(|&c| {
                let f = frame(Shape {
                    src: c,
                    ..Shape::tcp(SYN)
                });
                run(fe, &f).1[0..6].to_vec()
            })
            .collect()
    };
    let before = place(&fe);
    fe.set_weights(&[(A_IP, 67), (B_IP, 33)]).unwrap();
    let after = place(&fe);
    let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    let share = moved as f64 / flows.len() as f64;
    eprintln!(
        "75/25 -> 67/33: {moved} of {} new flows placed elsewhere",
        flows.len()
    );
    assert!((0.04..0.13).contains(&share), "{share}");
}
