//! The target side's bounds on its peers (no root: the "sources" are plain
//! connections that send nothing or garbage): with several peers, one peer holds at
//! most its share of the serving threads; the rest of its connections are closed at
//! once, before anything is read.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use farside_specd::handoff::Handoff;
use farside_specd::target::{per_peer_max, TargetConfig, TargetDaemon, PEER_RESERVE_THREADS};

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
    })
    .unwrap();
    let share = per_peer_max(threads, 2);
    assert_eq!(share, 2);
    let mut held: Vec<TcpStream> = (0..share)
        .map(|_| TcpStream::connect(target.addr()).unwrap())
        .collect();
    let mut over = TcpStream::connect(target.addr()).unwrap();
    let t0 = Instant::now();
    while !closed(&mut over, Duration::from_millis(50)) {
        assert!(
            t0.elapsed() < BOUND,
            "the connection over the share stays open"
        );
    }
    assert_eq!(target.stats().over_peer_cap.load(Ordering::Relaxed), 1);
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
