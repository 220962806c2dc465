//! The target side's bounds on its peers (no root: the "sources" are plain
//! connections that send nothing or garbage): with several peers, one peer holds at
//! most its share of the serving threads; the rest of its connections are closed at
//! once, before anything is read; a host that is not a peer is closed before
//! anything is read; an offer not to the service, or from a client that is this host
//! or the cluster, is refused.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use farside_migrate::{RepairWindow, TcpOptions, TcpState};
use farside_specd::handoff::Handoff;
use farside_specd::target::{
    per_peer_max, OfferRules, TargetConfig, TargetDaemon, PEER_RESERVE_THREADS,
};

const BOUND: Duration = Duration::from_secs(20);

/// Whether `c` sees EOF (or a reset) within `wait`.
fn closed(c: &mut TcpStream, wait: Duration) -> bool {
    c.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 16];
    match c.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[test]
fn the_share_of_one_peer_leaves_threads_to_the_others() {
    assert_eq!(per_peer_max(32, 0), 32);
    assert_eq!(per_peer_max(32, 1), 32);
    assert_eq!(per_peer_max(32, 2), 32 - PEER_RESERVE_THREADS);
    assert_eq!(per_peer_max(4, 100), 1);
}

#[test]
fn a_peer_over_its_share_is_closed_at_once() {
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let threads = 4;
    // Two peers: 127.0.0.1 (the connections below) and another.
    let peers = vec![
        "127.0.0.1:1".parse().unwrap(),
        "192.0.2.1:7000".parse().unwrap(),
    ];
    let target = TargetDaemon::start(TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        server_port: server.local_addr().unwrap().port(),
        admit_queue_max: 64,
        handoff: Handoff::Relay("127.0.0.1:9".parse().unwrap()),
        threads,
        peers,
        allow: vec![Ipv4Addr::LOCALHOST.into()],
        auth: None,
        offers: OfferRules {
            service_ip: None,
            service_port: 80,
            cluster: Vec::new(),
            loopback: true,
        },
    })
    .unwrap();
    let share = per_peer_max(threads, 2);
    assert_eq!(share, 2);
    // Every thread in accept first, and the connections within the share taken before
    // the one over it arrives: a source that finds no thread free makes an idle one
    // give its connection up (a different closing, not this test's).
    let free_is = |n: u32, what: &str| {
        let t0 = Instant::now();
        while target.free_threads() != n {
            assert!(
                t0.elapsed() < BOUND,
                "{what}: {} free",
                target.free_threads()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    free_is(threads as u32, "every thread in accept");
    let mut held: Vec<TcpStream> = (0..share)
        .map(|_| TcpStream::connect(target.addr()).unwrap())
        .collect();
    free_is(
        threads as u32 - share as u32,
        "the connections within the share taken",
    );
    let mut over = TcpStream::connect(target.addr()).unwrap();
    let t0 = Instant::now();
    while !closed(&mut over, Duration::from_millis(50)) {
        assert!(
            t0.elapsed() < BOUND,
            "the connection over the share stays open"
        );
    }
    assert_eq!(
        target.stats().over_peer_cap.load(Ordering::Relaxed),
        1,
        "not allowed {} after {:?}",
        target.stats().not_allowed.load(Ordering::Relaxed),
        t0.elapsed()
    );
    for c in &mut held {
        assert!(
            !closed(c, Duration::from_millis(20)),
            "a connection within the share was closed"
        );
    }
    // One given back: the next is taken.
    drop(held.pop());
    let t0 = Instant::now();
    loop {
        let mut next = TcpStream::connect(target.addr()).unwrap();
        if !closed(&mut next, Duration::from_millis(100)) {
            break;
        }
        assert!(t0.elapsed() < BOUND, "a freed share is not taken again");
    }
    target.stop();
}

#[test]
fn a_host_that_is_not_a_peer_is_closed_before_anything_is_read() {
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = TargetDaemon::start(TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        server_port: server.local_addr().unwrap().port(),
        admit_queue_max: 64,
        handoff: Handoff::Relay("127.0.0.1:9".parse().unwrap()),
        threads: 2,
        peers: vec!["192.0.2.1:7000".parse().unwrap()],
        // Only the peer's address: this test's loopback connections are strangers.
        allow: vec!["192.0.2.1".parse().unwrap()],
        auth: None,
        offers: OfferRules {
            service_ip: None,
            service_port: 80,
            cluster: Vec::new(),
            loopback: true,
        },
    })
    .unwrap();
    let mut c = TcpStream::connect(target.addr()).unwrap();
    // An OFFER's worth of bytes, never read.
    c.write_all(&[0u8; 4096]).unwrap();
    let t0 = Instant::now();
    while !closed(&mut c, Duration::from_millis(50)) {
        assert!(t0.elapsed() < BOUND, "a stranger's connection stays open");
    }
    assert_eq!(target.stats().not_allowed.load(Ordering::Relaxed), 1);
    assert_eq!(target.stats().offers.load(Ordering::Relaxed), 0);
    target.stop();
}

fn offered(local: &str, remote: &str) -> TcpState {
    TcpState {
        local: local.parse().unwrap(),
        remote: remote.parse().unwrap(),
        snd_seq: 1,
        rcv_seq: 1,
        options: TcpOptions {
            mss: 1460,
            wscale: None,
            sack: false,
            timestamps: false,
        },
        timestamp: 0,
        window: RepairWindow {
            snd_wl1: 1,
            snd_wnd: 1000,
            max_window: 1000,
            rcv_wnd: 1000,
            rcv_wup: 1,
        },
        sndbuf: 0,
        rcvbuf: 0,
        send_queue: Vec::new(),
        unsent_len: 0,
        recv_queue: Vec::new(),
    }
}

#[test]
fn an_offer_must_be_to_the_service_from_a_client() {
    let vip = OfferRules {
        service_ip: Some("10.0.0.100".parse().unwrap()),
        service_port: 80,
        cluster: vec!["10.0.0.2".parse().unwrap(), "10.0.0.3".parse().unwrap()],
        loopback: false,
    };
    let ok = |r: &OfferRules, l: &str, c: &str| r.check(&offered(l, c)).is_ok();
    assert!(ok(&vip, "10.0.0.100:80", "192.0.2.7:40000"));
    // Another local address or port: the restore would bind anything (FREEBIND).
    assert!(!ok(&vip, "10.0.0.101:80", "192.0.2.7:40000"));
    assert!(!ok(&vip, "10.0.0.100:22", "192.0.2.7:40000"));
    assert!(!ok(&vip, "127.0.0.1:80", "192.0.2.7:40000"));
    // A client "from" this host, a peer, nowhere or a group.
    assert!(!ok(&vip, "10.0.0.100:80", "127.0.0.1:40000"));
    assert!(!ok(&vip, "10.0.0.100:80", "10.0.0.3:40000"));
    assert!(!ok(&vip, "10.0.0.100:80", "0.0.0.0:40000"));
    assert!(!ok(&vip, "10.0.0.100:80", "224.0.0.1:40000"));
    assert!(!ok(&vip, "10.0.0.100:80", "255.255.255.255:40000"));
    assert!(!ok(&vip, "10.0.0.100:80", "192.0.2.7:0"));
    assert!(!ok(&vip, "[::1]:80", "[2001:db8::7]:40000"));
    let any = OfferRules {
        service_ip: None,
        ..vip.clone()
    };
    assert!(ok(&any, "10.0.0.5:80", "192.0.2.7:40000"));
    assert!(ok(&any, "[2001:db8::1]:80", "[2001:db8::7]:40000"));
    assert!(!ok(&any, "127.0.0.1:80", "192.0.2.7:40000"));
    assert!(!ok(&any, "[::ffff:127.0.0.1]:80", "192.0.2.7:40000"));
    assert!(!ok(&any, "[2001:db8::1]:80", "[::1]:40000"));
    let single_host = OfferRules {
        loopback: true,
        ..any
    };
    assert!(ok(&single_host, "127.0.0.1:80", "127.0.0.1:40000"));
}
