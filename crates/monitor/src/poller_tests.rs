//! Tests of the poller: matching, group reads, keys, gathering.

use super::*;
use crate::table::{self, EntryStatus};
use crate::{create_table, Target};
use farside_rmem::wire::ReqHeader;
use farside_rmem::LabKeyset;

/// The tests' keys: the shared reader key, and another one (a forger's).
fn keys() -> &'static (LabKeyset, LabKeyset) {
    static K: std::sync::OnceLock<(LabKeyset, LabKeyset)> = std::sync::OnceLock::new();
    K.get_or_init(|| (LabKeyset::generate(), LabKeyset::generate()))
}

fn key() -> ClientKey {
    keys().0.reader
}

/// A good reply to `seq` sealed for the poller whose sender id is `sender`.
fn reply(sender: u64, seq: u64, conns: u64) -> Vec<u8> {
    reply_as(&key(), sender, seq, conns)
}

/// A reply to `seq` sealed under `key` for `sender`: a region whose record says
/// `conns_established = conns`.
fn reply_as(key: &ClientKey, sender: u64, seq: u64, conns: u64) -> Vec<u8> {
    let mut rep = vec![0u8; ENVELOPE_BYTES];
    farside_rmem::wire::RepHeader {
        op: Op::Read as u8,
        status: Status::Ok,
        seq,
        len: MONITOR_READ_BYTES as u32,
    }
    .encode(&mut rep);
    let mut mem = farside_region::RegionWriter::init(
        farside_region::HeapWords::new(farside_region::REGION_WORDS),
        farside_region::Header {
            node_id: 1,
            generation: 9,
            period_us: 1000,
            watched_ports: [0; 4],
        },
    );
    mem.publish(&farside_region::LoadRecord {
        conns_established: conns,
        ..Default::default()
    });
    for w in &mem.mem().words()[..MONITOR_READ_BYTES / 8] {
        rep.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    let request = farside_auth::mac::Envelope {
        key_id: key.id,
        sender,
        seq: 1,
    };
    farside_rmem::auth::seal_reply_in_place(&mut rep, key.key(), &request);
    rep
}

fn opts(group: Option<SocketAddr>) -> MonitorOptions {
    MonitorOptions {
        period: Duration::from_millis(1),
        // Attempts of 1 s: nothing expires unless the test says so.
        read_timeout: Duration::from_secs(3),
        stale_after: Duration::from_secs(10),
        key: Some(key()),
        nice: 0,
        threads: 1,
        group,
        rx: MonitorRx::Udp,
    }
}

fn watch(i: usize, target: &str) -> (Watch, std::sync::Arc<ReadStats>) {
    (
        Watch {
            index: i,
            name: format!("b{i}"),
            region: Target::parse(target).unwrap(),
        },
        Default::default(),
    )
}

/// A back-end's socket at its own loopback address (127.1.0.k).
fn backend(k: u8) -> UdpSocket {
    let s = UdpSocket::bind((std::net::Ipv4Addr::new(127, 1, 0, k), 0)).unwrap();
    s.set_nonblocking(true).unwrap();
    s
}

/// Feed `b` from `from` to the poller as if received (and counted, as `drain` does).
fn deliver(p: &mut Poller<'_>, b: &[u8], from: SocketAddr) {
    let unicast = on_reply(
        &mut p.slots,
        p.group.as_mut(),
        p.env.sender,
        &p.stats,
        p.stale_after,
        b,
        false,
        Some(from),
        Instant::now(),
        mono_ns(),
    );
    p.unicast_waiting = p.unicast_waiting.saturating_sub(usize::from(unicast));
}

/// The next request `s` received: its header and its envelope's key id.
fn request(s: &UdpSocket) -> Option<(ReqHeader, u32)> {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match s.recv_from(&mut buf) {
            Ok((n, _)) => {
                let id = u32::from_le_bytes(buf[8..12].try_into().unwrap());
                return Some((ReqHeader::decode(&buf[ENVELOPE_BYTES..n]).unwrap(), id));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

fn nothing_sent_to(s: &UdpSocket) -> bool {
    let mut buf = [0u8; 1024];
    std::thread::sleep(Duration::from_millis(20));
    s.recv_from(&mut buf).is_err()
}

#[test]
fn group_replies_match_by_source_and_late_stray_unknown_ones_are_refused_and_counted() {
    let bs = [backend(1), backend(2), backend(3)];
    let addr = |k: usize| bs[k].local_addr().unwrap();
    let group = UdpSocket::bind("127.0.0.1:0").unwrap();
    group.set_nonblocking(true).unwrap();
    let t = create_table(None, 3, 1000).unwrap();
    let watches = (0..3)
        .map(|k| watch(k, &format!("udp:{}", addr(k))))
        .collect();
    let stats = std::sync::Arc::new(PollerStats::default());
    let o = opts(Some(group.local_addr().unwrap()));
    let mut p = Poller::new(&*t, watches, &o, stats.clone()).unwrap();
    let me = p.env.sender;
    p.round();

    // ONE READ, to the group, with the shared key and the group's slot bits.
    let (req, id) = request(&group).expect("the group READ");
    assert_eq!(req.seq & SLOT_MASK, GROUP_SLOT);
    assert_eq!(id, key().id.0);
    assert!(nothing_sent_to(&group), "one group READ per period");
    assert!(bs.iter().all(nothing_sent_to), "no unicast READ");
    assert_eq!(stats.sent.load(Ordering::Relaxed), 1);
    assert_eq!(stats.group_sent.load(Ordering::Relaxed), 1);
    let waiting = |p: &Poller<'_>| p.group.as_ref().map(|g| g.waiting);
    assert_eq!(waiting(&p), Some(3), "three replies to gather");

    // Back-end 0 answers: its own entry, found by the reply's source.
    // Forged (another key) or for another reader (another sender): refused.
    let forged = reply_as(&keys().1.reader, me, req.seq, 666);
    deliver(&mut p, &forged, addr(0));
    let elsewhere = reply_as(&key(), me ^ 1, req.seq, 666);
    deliver(&mut p, &elsewhere, addr(0));
    assert_eq!(stats.unauthentic.load(Ordering::Relaxed), 2);
    assert_eq!(stats.late.load(Ordering::Relaxed), 2);
    assert!(table::read(&*t, 0).is_none_or(|e| e.status == EntryStatus::Never));
    stats.late.store(0, Ordering::Relaxed);
    deliver(&mut p, &reply(me, req.seq, 10), addr(0));
    let e0 = table::read(&*t, 0).unwrap();
    assert_eq!((e0.status, e0.conns_established), (EntryStatus::Ok, 10));
    assert_eq!(stats.group_replies.load(Ordering::Relaxed), 1);

    let late = |n: u64| assert_eq!(stats.late.load(Ordering::Relaxed), n);
    // The same reply again: its read is done.
    deliver(&mut p, &reply(me, req.seq, 11), addr(0));
    late(1);
    // From an address that is no back-end's endpoint.
    let stranger = SocketAddr::from(([127, 1, 0, 9], addr(1).port()));
    deliver(&mut p, &reply(me, req.seq, 12), stranger);
    late(2);
    assert_eq!(stats.unknown_source.load(Ordering::Relaxed), 1);
    // A back-end's right address but another port.
    let other_port = SocketAddr::from(([127, 1, 0, 2], addr(1).port().wrapping_add(1)));
    deliver(&mut p, &reply(me, req.seq, 12), other_port);
    assert_eq!(stats.unknown_source.load(Ordering::Relaxed), 2);
    // An older group READ's answer, and a unicast seq no attempt was sent with.
    deliver(&mut p, &reply(me, req.seq - (1 << SLOT_BITS), 13), addr(1));
    deliver(&mut p, &reply(me, (req.seq & !SLOT_MASK) | 1, 13), addr(1));
    // A group READ not sent yet.
    deliver(&mut p, &reply(me, req.seq + (1 << SLOT_BITS), 13), addr(1));
    late(6);
    assert!(table::read(&*t, 1).is_none_or(|e| e.status == EntryStatus::Never));
    assert_eq!(waiting(&p), Some(2));
    assert_eq!(stats.group_replies.load(Ordering::Relaxed), 1);

    // The attempt deadline passes: the missing back-ends alone are retried, unicast.
    p.expire(Instant::now() + Duration::from_secs(2));
    assert!(nothing_sent_to(&bs[0]), "back-end 0 answered");
    assert!(nothing_sent_to(&group), "retries never go to the group");
    assert_eq!(
        waiting(&p),
        Some(0),
        "retried: no more group replies to gather"
    );
    let r1 = request(&bs[1]).expect("unicast retry to back-end 1").0;
    let r2 = request(&bs[2]).expect("unicast retry to back-end 2").0;
    assert_eq!(r1.seq & SLOT_MASK, 1);
    assert_eq!(r2.seq & SLOT_MASK, 2);
    assert_ne!(r1.flags & FLAG_RETRY, 0);
    // Either attempt may answer: the retry for 1, the group READ for 2.
    deliver(&mut p, &reply(me, r1.seq, 21), addr(1));
    deliver(&mut p, &reply(me, req.seq, 22), addr(2));
    late(6);
    for (i, c) in [(1, 21), (2, 22)] {
        let e = table::read(&*t, i).unwrap();
        assert_eq!((e.status, e.conns_established), (EntryStatus::Ok, c));
    }
}

/// `ID:PATH` of a key file with key id 77 (a region's own key).
fn own_key_spec() -> String {
    let dir = std::env::temp_dir().join(format!("farside-poller-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = farside_rmem::auth::write_key_file(&dir, "own.key", keys().1.balancer.key());
    format!("77:{}", f.unwrap().display())
}

#[test]
fn a_group_read_unanswered_through_every_attempt_is_a_timed_out_read() {
    let b = backend(4);
    let group = UdpSocket::bind("127.0.0.1:0").unwrap();
    let t = create_table(None, 1, 1000).unwrap();
    let watches = vec![watch(0, &format!("udp:{}", b.local_addr().unwrap()))];
    let o = opts(Some(group.local_addr().unwrap()));
    let mut p = Poller::new(&*t, watches, &o, Default::default()).unwrap();
    p.round();
    let mut later = Instant::now();
    for _ in 0..UDP_TRIES {
        later += Duration::from_secs(2);
        p.expire(later);
    }
    let e = table::read(&*t, 0).unwrap();
    assert_eq!((e.status, e.errors), (EntryStatus::Error, 1));
    // Two unicast retries after the group READ.
    assert!(request(&b).is_some() && request(&b).is_some());
    assert!(nothing_sent_to(&b));
}

#[test]
fn slots_the_group_cannot_read_stay_unicast_and_ipv6_groups_are_refused() {
    let (a, b) = (backend(5), backend(6));
    let group = UdpSocket::bind("127.0.0.1:0").unwrap();
    group.set_nonblocking(true).unwrap();
    let t = create_table(None, 3, 1000).unwrap();
    let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let watches = vec![
        // Its own key: the group READ carries the shared one.
        watch(0, &format!("udp:{aa}?key={}", own_key_spec())),
        // Two regions at one endpoint: a reply's source cannot tell them apart.
        watch(1, &format!("udp:{ba}")),
        watch(2, &format!("udp:{ba}")),
    ];
    let o = opts(Some(group.local_addr().unwrap()));
    let stats = std::sync::Arc::new(PollerStats::default());
    let mut p = Poller::new(&*t, watches, &o, stats.clone()).unwrap();
    p.round();
    assert!(nothing_sent_to(&group));
    assert_eq!(request(&a).map(|r| r.1), Some(77));
    assert!(request(&b).is_some() && request(&b).is_some());
    assert_eq!(stats.group_sent.load(Ordering::Relaxed), 0);

    let v6 = opts(Some("[ff02::1]:7000".parse().unwrap()));
    let err = Poller::new(&*t, Vec::new(), &v6, Default::default())
        .err()
        .expect("an IPv6 group");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn unicast_replies_are_gathered_while_two_or_more_are_awaited() {
    let bs: Vec<UdpSocket> = (7..10).map(backend).collect();
    let t = create_table(None, 3, 1000).unwrap();
    let watches = bs
        .iter()
        .enumerate()
        .map(|(i, b)| watch(i, &format!("udp:{}", b.local_addr().unwrap())))
        .collect();
    let mut p = Poller::new(&*t, watches, &opts(None), Default::default()).unwrap();
    let me = p.env.sender;
    assert!(!p.gathers(), "nothing sent yet");
    p.round();
    let reqs: Vec<ReqHeader> = bs.iter().map(|b| request(b).unwrap().0).collect();
    assert_eq!(p.unicast_waiting, 3);
    assert!(p.gathers());
    let addr = |i: usize| bs[i].local_addr().unwrap();

    deliver(&mut p, &reply(me, reqs[0].seq, 1), addr(0));
    assert_eq!(p.unicast_waiting, 2);
    // Forged, repeated or from elsewhere: no read completes, nothing changes.
    deliver(
        &mut p,
        &reply_as(&keys().1.reader, me, reqs[1].seq, 9),
        addr(1),
    );
    deliver(&mut p, &reply(me, reqs[0].seq, 1), addr(0));
    deliver(&mut p, &reply(me, reqs[1].seq, 9), addr(2));
    assert_eq!(p.unicast_waiting, 2);
    assert!(p.gathers());

    // One left: the poller wakes for it instead of gathering.
    deliver(&mut p, &reply(me, reqs[1].seq, 2), addr(1));
    assert_eq!(p.unicast_waiting, 1);
    assert!(!p.gathers());

    // The next period counts again from the slots: the unanswered read still waits
    // and the two answered ones are read anew.
    p.round();
    assert_eq!(p.unicast_waiting, 3);
    // Its attempts run out: a timed-out read no longer waits.
    let mut later = Instant::now();
    for _ in 0..UDP_TRIES {
        later += Duration::from_secs(2);
        p.expire(later);
    }
    assert_eq!(p.unicast_waiting, 0);
    assert!(!p.gathers());
    let e = table::read(&*t, 2).unwrap();
    assert_eq!((e.status, e.errors), (EntryStatus::Error, 1));
}
