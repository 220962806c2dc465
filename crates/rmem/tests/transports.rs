//! The same operations behave the same over every transport.

use farside_region::{HeapWords, MappedWords, Words, REGION_WORDS};
use farside_rmem::relay::{Faults, LossyRelay};
use farside_rmem::wire::{self, Status};
use farside_rmem::*;
use std::sync::Arc;
use std::time::Duration;

use farside_auth::mac::KeyId;
use farside_auth::rights::{words, Grant, OpSet, Rights, Words as WordRange};

/// The words the tests' read-write key may change: the locks and counters (40..64).
const RW_FIRST: usize = 40;
/// Byte offset of the first of them.
const W0: usize = RW_FIRST * 8;

/// A server keyring: the lab's reader (id 1) and balancer (id 2) keys, and a
/// read-write key (id 3) that may WRITE, CAS and FETCH-ADD (any delta) the locks and
/// counters.
struct Keys {
    set: LabKeyset,
    rw: ClientKey,
    server: Arc<ServerKeys>,
}

fn keyset() -> Keys {
    let set = LabKeyset::generate();
    let rw = ClientKey::new(KeyId(3), *LabKeyset::generate().reader.key());
    let server = set.server();
    let rights = Rights::new(
        0,
        &[
            Grant::new(OpSet::READ, words::REGION),
            Grant::new(
                OpSet::MUTATIONS,
                WordRange {
                    name: "locks_and_counters",
                    first: RW_FIRST,
                    end: 64,
                },
            ),
        ],
    )
    .unwrap();
    server.install("rw", rw.id, *rw.key(), rights).unwrap();
    Keys { set, rw, server }
}

fn keys() -> Keys {
    keyset()
}

fn opts(key: ClientKey) -> ClientOptions {
    ClientOptions {
        key: Some(key),
        timeout: Duration::from_millis(500),
        // The shared exercise polls for replies (tcp and udp alike) before sleeping.
        spin: Duration::from_micros(200),
    }
}

/// Runs the shared behaviour script against one client with a read-write key.
fn exercise(c: &mut dyn RemoteMemory) {
    c.write(W0, &7u64.to_le_bytes()).unwrap();
    let mut b = [0u8; 16];
    c.read(W0, &mut b).unwrap();
    assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), 7);
    assert_eq!(
        c.compare_swap(W0, 7, 100).unwrap(),
        7,
        "winning CAS returns expected"
    );
    assert_eq!(
        c.compare_swap(W0, 7, 200).unwrap(),
        100,
        "losing CAS returns current"
    );
    assert_eq!(c.fetch_add(W0, 5).unwrap(), 100);
    c.read(W0, &mut b[..8]).unwrap();
    assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), 105);
    assert!(matches!(
        c.read(4, &mut b),
        Err(RmemError::Refused(Status::Unaligned))
    ));
    assert!(matches!(
        c.read(4096, &mut b),
        Err(RmemError::Refused(Status::OutOfBounds))
    ));
}

#[test]
fn tcp_transport_reads_writes_and_does_atomics_within_each_keys_rights() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let k = keys();
    let srv = TcpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem.clone(),
        k.server.clone(),
        Default::default(),
    )
    .unwrap();
    let mut c = connect(&Endpoint::Tcp(srv.local_addr), &opts(k.rw)).unwrap();
    exercise(&mut *c);
    let mut ro = connect(&Endpoint::Tcp(srv.local_addr), &opts(k.set.reader)).unwrap();
    for r in [
        ro.fetch_add(W0, 1).map(|_| ()),
        ro.compare_swap(W0, 105, 1).map(|_| ()),
        ro.write(W0, &[0; 8]),
    ] {
        assert!(
            matches!(r, Err(RmemError::Refused(Status::ReadOnly))),
            "{r:?}"
        );
    }
    let mut bal = connect(&Endpoint::Tcp(srv.local_addr), &opts(k.set.balancer)).unwrap();
    let served = farside_region::layout::W_ROLE_SERVED * 8;
    assert!(matches!(
        bal.compare_swap(served, 0, 7),
        Err(RmemError::Refused(Status::Protected))
    ));
    assert!(matches!(
        bal.fetch_add(farside_region::layout::W_SHARED_COUNTER * 8, 2),
        Err(RmemError::Refused(Status::ReadOnly))
    ));
    assert_eq!(
        bal.fetch_add(farside_region::layout::W_SHARED_COUNTER * 8, 1)
            .unwrap(),
        0
    );
    // A key the server does not hold: the connection is closed unanswered.
    let mut bad = connect(
        &Endpoint::Tcp(srv.local_addr),
        &opts(LabKeyset::generate().reader),
    )
    .unwrap();
    assert!(bad.read(0, &mut [0; 8]).is_err());
    assert_eq!(word(&mem, farside_region::layout::W_ROLE_SERVED), 0);
}

#[test]
fn udp_transport_reads_writes_and_does_atomics_and_drops_bad_keys() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let k = keys();
    let srv = UdpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem,
        k.server.clone(),
        Default::default(),
    )
    .unwrap();
    let mut c = connect(&Endpoint::Udp(srv.local_addr), &opts(k.rw)).unwrap();
    exercise(&mut *c);
    let mut bad = UdpClient::new(
        srv.local_addr,
        ClientOptions {
            key: Some(LabKeyset::generate().reader),
            timeout: Duration::from_millis(60),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        matches!(bad.read(0, &mut [0; 8]), Err(RmemError::Timeout)),
        "bad key must be dropped, not answered"
    );
}

#[test]
fn udp_retries_every_op_across_request_loss_and_applies_it_once() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let k = keys();
    let srv = UdpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem.clone(),
        k.server.clone(),
        Default::default(),
    )
    .unwrap();
    let mut c = UdpClient::new(
        srv.local_addr,
        ClientOptions {
            key: Some(k.rw),
            timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .unwrap();
    let mut b = [0u8; 8];
    c.read(0, &mut b).expect("a read");
    c.fetch_add(W0 + 8, 1)
        .expect("the first mutation makes the server know this client");
    for _ in 0..3 {
        c.drop_next_sends = 1;
        c.fetch_add(W0 + 8, 1)
            .expect("FADD survives one lost datagram");
    }
    c.drop_next_sends = 1;
    assert_eq!(
        c.compare_swap(W0 + 16, 0, 42).unwrap(),
        0,
        "CAS survives loss"
    );
    assert_eq!(
        word(&mem, RW_FIRST + 1),
        4,
        "each FADD applied exactly once"
    );
}

fn word(mem: &Arc<dyn Words>, i: usize) -> u64 {
    mem.words()[i].load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn a_retry_of_a_first_mutation_never_received_is_refused_as_unknown_not_guessed() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let k = keys();
    let srv = UdpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem.clone(),
        k.server.clone(),
        Default::default(),
    )
    .unwrap();
    let mut c = UdpClient::new(srv.local_addr, opts(k.rw)).unwrap();
    c.drop_next_sends = 1;
    assert!(matches!(
        c.fetch_add(W0 + 8, 1),
        Err(RmemError::Refused(Status::Unknown))
    ));
    assert_eq!(word(&mem, RW_FIRST + 1), 0);
}

#[test]
fn writes_of_agent_owned_words_are_refused_over_every_transport() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let k = keys();
    let any = "127.0.0.1:0".parse().unwrap();
    let t = TcpServer::spawn(any, mem.clone(), k.server.clone(), Default::default()).unwrap();
    let u = UdpServer::spawn(any, mem.clone(), k.server.clone(), Default::default()).unwrap();
    for ep in [Endpoint::Tcp(t.local_addr), Endpoint::Udp(u.local_addr)] {
        let mut c = connect(&ep, &opts(k.rw)).unwrap();
        for (what, r) in [
            ("header", c.write(0, &[1; 8])),
            ("record", c.fetch_add(8 * 13, 1).map(|_| ())),
            ("served role", c.compare_swap(8 * 32, 0, 1).map(|_| ())),
            ("role epoch", c.write(8 * 33, &[1; 8])),
        ] {
            assert!(
                matches!(r, Err(RmemError::Refused(Status::Protected))),
                "{ep} {what}: {r:?}"
            );
        }
    }
    assert!((0..REGION_WORDS).all(|i| word(&mem, i) == 0));
}

#[test]
fn the_udp_server_refuses_unpadded_reads_with_a_reply_no_larger_than_the_request() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let k = keys();
    let u = UdpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem,
        k.server.clone(),
        Default::default(),
    )
    .unwrap();
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut covered = Vec::new();
    wire::encode_request(
        &mut covered,
        &wire::ReqHeader {
            op: wire::Op::Read as u8,
            seq: 1,
            len: 1024,
            ..Default::default()
        },
        &[],
    );
    let mut req = Vec::new();
    farside_rmem::auth::seal_request(&mut req, &k.set.reader, 5, 1, &covered);
    s.send_to(&req, u.local_addr).unwrap();
    let mut buf = [0u8; 2048];
    let n = s.recv(&mut buf).unwrap();
    assert!(
        n <= req.len(),
        "{n}-byte reply to a {}-byte request",
        req.len()
    );
    let body = farside_rmem::auth::open_reply(&buf[..n], &k.set.reader, 5, 1..=1).unwrap();
    assert_eq!(
        wire::RepHeader::decode(body).unwrap().status,
        Status::Unpadded
    );
}

/// Through loss of requests and replies, duplicates and reordering, via the trait:
/// every CAS that returns reports the value it saw when applied (a lost reply never
/// turns a win into a loss), every FETCH-ADD that returns Ok was applied once
/// (distinct old values that account for the final sum), and the last WRITE is the
/// value left (no delayed duplicate of an older write lands after it). Fails on the
/// old code, whose trait CAS reported a retried win as a loss and whose retried
/// datagrams were applied again.
#[test]
fn exactly_once_answers_through_a_lossy_reordering_relay() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let k = keys();
    let srv = UdpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem.clone(),
        k.server.clone(),
        Default::default(),
    )
    .unwrap();
    let faults = Faults {
        drop_req: 15,
        drop_rep: 25,
        dup: 30,
        delay_ms_max: 4,
    };
    let relay = LossyRelay::spawn(srv.local_addr, faults, 0x5eed).unwrap();
    let mut c = UdpClient::new(
        relay.addr,
        ClientOptions {
            key: Some(k.rw),
            timeout: Duration::from_millis(600),
            ..Default::default()
        },
    )
    .unwrap();
    // At ~40% loss per round trip, 12 attempts all fail with p < 2e-5.
    c.tries = 12;
    let mut c: Box<dyn RemoteMemory> = Box::new(c);
    let (mut unknown, mut ok) = (0u64, 0u64);
    // A chain of CASes, each expecting the previous one's value: all must be won.
    let mut cur = 0u64;
    for i in 1..=60u64 {
        match c.compare_swap(W0, cur, i) {
            Ok(old) => {
                assert_eq!(old, cur, "CAS {i} applied once and reported as won");
                cur = i;
            }
            Err(RmemError::Timeout | RmemError::Refused(Status::Unknown)) => {
                unknown += 1;
                cur = word(&mem, RW_FIRST);
            }
            Err(e) => panic!("CAS {i}: {e}"),
        }
    }
    let mut olds = std::collections::BTreeSet::new();
    for _ in 0..60 {
        match c.fetch_add(W0 + 8, 1) {
            Ok(old) => {
                assert!(olds.insert(old), "old value {old} returned twice");
                ok += 1;
            }
            Err(RmemError::Timeout | RmemError::Refused(Status::Unknown)) => unknown += 1,
            Err(e) => panic!("FADD: {e}"),
        }
    }
    let sum = word(&mem, RW_FIRST + 1);
    assert!(
        sum >= ok && sum <= ok + unknown,
        "sum {sum}, {ok} ok, {unknown} unknown"
    );
    let mut last = None;
    for v in 1..=60u64 {
        if c.write(W0 + 16, &v.to_le_bytes()).is_ok() {
            last = Some(v);
        }
    }
    // Let every delayed duplicate arrive, then check no older write overwrote the last.
    std::thread::sleep(Duration::from_millis(faults.delay_ms_max * 4 + 50));
    if let Some(v) = last {
        assert_eq!(
            word(&mem, RW_FIRST + 2),
            v,
            "a delayed duplicate overwrote the newest write"
        );
    }
    assert!(unknown <= 3, "{unknown} operations with unknown outcome");
}

#[test]
fn shm_transport_maps_the_region_file() {
    let dir = std::env::temp_dir().join(format!("farside-rmem-test-{}", std::process::id()));
    let path = dir.join("n.region");
    let _owner = MappedWords::create_file(&path, REGION_WORDS).unwrap();
    let mut c = connect(&Endpoint::Shm(path.clone()), &ClientOptions::default()).unwrap();
    exercise(&mut *c);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn dead_tcp_peer_fails_fast_with_an_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let mut c = connect(&Endpoint::Tcp(addr), &opts(keys().rw)).unwrap();
    assert!(c.read(0, &mut [0; 8]).is_err());
}

#[test]
fn udp_reads_larger_than_a_datagram_are_split_and_whole() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let k = keys();
    for (i, w) in mem.words().iter().enumerate() {
        w.store(i as u64, std::sync::atomic::Ordering::Relaxed);
    }
    let srv = UdpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem,
        k.server.clone(),
        Default::default(),
    )
    .unwrap();
    let mut c = connect(&Endpoint::Udp(srv.local_addr), &opts(k.set.reader)).unwrap();
    let mut b = vec![0u8; 4096];
    c.read(0, &mut b).unwrap();
    for (i, w) in b.chunks_exact(8).enumerate() {
        assert_eq!(u64::from_le_bytes(w.try_into().unwrap()), i as u64);
    }
}

/// Per-back-end keys: a server that holds only its own reader key is read through a
/// target that names the key's file, and drops a reader with another key.
#[test]
fn a_target_reads_with_its_own_key_file() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    mem.words()[1].store(77, std::sync::atomic::Ordering::Relaxed);
    let set = LabKeyset::generate();
    let srv = UdpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem,
        set.server(),
        Default::default(),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("farside-rmem-target-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (reader, _) = set.write_files(&dir).unwrap();
    let o = ClientOptions {
        timeout: Duration::from_millis(100),
        key: Some(LabKeyset::generate().reader),
        ..Default::default()
    };
    let t = Target::parse(&format!(
        "udp:{}?key=1:{}",
        srv.local_addr,
        reader.display()
    ))
    .unwrap();
    let mut b = [0u8; 8];
    connect_target(&t, &o).unwrap().read(8, &mut b).unwrap();
    assert_eq!(u64::from_le_bytes(b), 77);
    let plain = Target::from(Endpoint::Udp(srv.local_addr));
    assert!(matches!(
        connect_target(&plain, &o).unwrap().read(8, &mut b),
        Err(RmemError::Timeout)
    ));
    let _ = std::fs::remove_dir_all(dir);
}

/// A gatherer restart replaces what the shm path names (with XDP: a new map behind a new
/// socket); a shm client re-maps within `SHM_RECHECK` instead of reading the dead
/// region forever.
#[test]
fn a_shm_client_follows_a_replaced_region() {
    let dir = std::env::temp_dir().join(format!("farside-rmem-remap-{}", std::process::id()));
    let path = dir.join("n.region");
    let old = MappedWords::create_file(&path, REGION_WORDS).unwrap();
    old.words()[1].store(1, std::sync::atomic::Ordering::Relaxed);
    let mut c = connect(&Endpoint::Shm(path.clone()), &ClientOptions::default()).unwrap();
    let mut b = [0u8; 8];
    c.read(8, &mut b).unwrap();
    assert_eq!(u64::from_le_bytes(b), 1);
    std::fs::remove_file(&path).unwrap();
    let new = MappedWords::create_file(&path, REGION_WORDS).unwrap();
    new.words()[1].store(2, std::sync::atomic::Ordering::Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        c.read(8, &mut b).unwrap();
        if u64::from_le_bytes(b) == 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never re-mapped");
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The tcp client retries on a new connection with the same (client, seq); the server
/// replays the recorded answer instead of applying the op again. Shown with raw
/// connections: the first attempt's reply is never read (its connection is dropped).
#[test]
fn a_tcp_retry_on_a_new_connection_is_replayed_not_applied_again() {
    use std::io::{Read, Write};
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let k = keys();
    let srv = TcpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem.clone(),
        k.server.clone(),
        Default::default(),
    )
    .unwrap();
    let seq = std::cell::Cell::new(0u64);
    let fadd = |flags: u16| {
        let mut covered = Vec::new();
        wire::encode_request(
            &mut covered,
            &wire::ReqHeader {
                op: wire::Op::FetchAdd as u8,
                flags,
                seq: 5,
                offset: W0 as u32 + 8,
                len: 8,
                ..Default::default()
            },
            &10u64.to_le_bytes(),
        );
        seq.set(seq.get() + 1);
        let mut req = Vec::new();
        farside_rmem::auth::seal_request(&mut req, &k.rw, 0xabc, seq.get(), &covered);
        req
    };
    let exchange = |req: &[u8]| {
        let mut s = std::net::TcpStream::connect(srv.local_addr).unwrap();
        s.write_all(req).unwrap();
        let mut rep = [0u8; wire::ENVELOPE_BYTES + wire::REP_HEADER_BYTES + 8];
        s.read_exact(&mut rep).unwrap();
        wire::u64_at(&rep, wire::ENVELOPE_BYTES + wire::REP_HEADER_BYTES)
    };
    // The same bytes again (a copy, not a retry): refused unanswered, not applied.
    let first = fadd(0);
    assert_eq!(exchange(&first), 0);
    let mut s = std::net::TcpStream::connect(srv.local_addr).unwrap();
    s.write_all(&first).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "a replayed request is answered");
    assert_eq!(
        exchange(&fadd(wire::FLAG_RETRY)),
        0,
        "the first answer, replayed"
    );
    assert_eq!(word(&mem, RW_FIRST + 1), 10, "applied once");
}
