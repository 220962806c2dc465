//! The same operations behave the same over every transport.

use farside_region::{HeapWords, MappedWords, Words, REGION_WORDS};
use farside_rmem::wire::Status;
use farside_rmem::*;
use std::sync::Arc;
use std::time::Duration;

const RW_KEY: u64 = 0xfeed_f00d;

fn keys() -> AccessKeys {
    AccessKeys::new()
        .with(DEFAULT_READ_KEY, Perm::ReadOnly)
        .with(RW_KEY, Perm::ReadWrite)
}

fn opts(key: u64) -> ClientOptions {
    ClientOptions {
        key,
        timeout: Duration::from_millis(500),
        // The shared exercise polls for replies (tcp and udp alike) before sleeping.
        spin: Duration::from_micros(200),
    }
}

/// Runs the shared behaviour script against one client with a read-write key.
fn exercise(c: &mut dyn RemoteMemory) {
    c.write(256, &7u64.to_le_bytes()).unwrap();
    let mut b = [0u8; 16];
    c.read(256, &mut b).unwrap();
    assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), 7);
    assert_eq!(
        c.compare_swap(256, 7, 100).unwrap(),
        7,
        "winning CAS returns expected"
    );
    assert_eq!(
        c.compare_swap(256, 7, 200).unwrap(),
        100,
        "losing CAS returns current"
    );
    assert_eq!(c.fetch_add(256, 5).unwrap(), 100);
    c.read(256, &mut b[..8]).unwrap();
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
fn tcp_transport_reads_writes_and_does_atomics() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let srv = TcpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem,
        keys(),
        Default::default(),
    )
    .unwrap();
    let mut c = connect(&Endpoint::Tcp(srv.local_addr), &opts(RW_KEY)).unwrap();
    exercise(&mut *c);
    let mut ro = connect(&Endpoint::Tcp(srv.local_addr), &opts(DEFAULT_READ_KEY)).unwrap();
    assert!(matches!(
        ro.fetch_add(256, 1),
        Err(RmemError::Refused(Status::ReadOnly))
    ));
    let mut bad = connect(&Endpoint::Tcp(srv.local_addr), &opts(1)).unwrap();
    assert!(matches!(
        bad.read(0, &mut [0; 8]),
        Err(RmemError::Refused(Status::BadKey))
    ));
}

#[test]
fn udp_transport_reads_writes_and_does_atomics_and_drops_bad_keys() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let srv = UdpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem,
        keys(),
        Default::default(),
    )
    .unwrap();
    let mut c = connect(&Endpoint::Udp(srv.local_addr), &opts(RW_KEY)).unwrap();
    exercise(&mut *c);
    let mut bad = UdpClient::new(
        srv.local_addr,
        ClientOptions {
            key: 1,
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
fn udp_retries_reads_and_cas_across_loss_but_not_fetch_add() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let srv = UdpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem.clone(),
        keys(),
        Default::default(),
    )
    .unwrap();
    let mut c = UdpClient::new(
        srv.local_addr,
        ClientOptions {
            key: RW_KEY,
            timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .unwrap();
    c.drop_next_sends = 1;
    let mut b = [0u8; 8];
    c.read(0, &mut b).expect("read survives one lost datagram");
    c.drop_next_sends = 1;
    assert_eq!(
        c.compare_swap_retrying(512, 0, 42).unwrap(),
        0,
        "CAS survives loss"
    );
    c.drop_next_sends = 1;
    assert!(
        matches!(c.fetch_add(512, 1), Err(RmemError::Timeout)),
        "FADD is not retried"
    );
    assert_eq!(
        mem.words()[64].load(std::sync::atomic::Ordering::Relaxed),
        42,
        "FADD not applied twice or at all"
    );
}

#[test]
fn udp_cas_whose_reply_was_lost_is_reported_as_won() {
    // First attempt applied, reply lost: simulate by applying it through a second client.
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    let srv = UdpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem,
        keys(),
        Default::default(),
    )
    .unwrap();
    let mut a = UdpClient::new(srv.local_addr, opts(RW_KEY)).unwrap();
    a.compare_swap(512, 0, 0xA1).unwrap();
    // The retry sees old == new: won.
    assert_eq!(a.compare_swap_retrying(512, 0, 0xA1).unwrap(), 0);
    // A different owner sees old == someone else's value: lost.
    assert_eq!(a.compare_swap_retrying(512, 0, 0xB2).unwrap(), 0xA1);
}

#[test]
fn shm_transport_maps_the_region_file() {
    let dir = std::env::temp_dir().join(format!("farside-rmem-test-{}", std::process::id()));
    let path = dir.join("n.region");
    let _owner = MappedWords::create_file(&path, REGION_WORDS).unwrap();
    let mut c = connect(&Endpoint::Shm(path.clone()), &opts(RW_KEY)).unwrap();
    exercise(&mut *c);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn dead_tcp_peer_fails_fast_with_an_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let mut c = connect(&Endpoint::Tcp(addr), &opts(RW_KEY)).unwrap();
    assert!(c.read(0, &mut [0; 8]).is_err());
}

#[test]
fn udp_reads_larger_than_a_datagram_are_split_and_whole() {
    let mem: Arc<dyn Words> = Arc::new(HeapWords::new(REGION_WORDS));
    for (i, w) in mem.words().iter().enumerate() {
        w.store(i as u64, std::sync::atomic::Ordering::Relaxed);
    }
    let srv = UdpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem,
        keys(),
        Default::default(),
    )
    .unwrap();
    let mut c = connect(&Endpoint::Udp(srv.local_addr), &opts(DEFAULT_READ_KEY)).unwrap();
    let mut b = vec![0u8; 4096];
    c.read(0, &mut b).unwrap();
    for (i, w) in b.chunks_exact(8).enumerate() {
        assert_eq!(u64::from_le_bytes(w.try_into().unwrap()), i as u64);
    }
}
