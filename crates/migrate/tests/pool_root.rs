//! Reused control connections (wire version 2: CPU per migration): a
//! [`ControlPool`] sends every migration to a target over one connection, replaces
//! one the target closed, and resends an OFFER once on a fresh connection when the
//! pooled one dies under it. Needs root (TCP_REPAIR):
//! `cargo test -p farside-migrate -- --include-ignored` under flock.
//!
//! Source and target share the loopback namespace, so the hand-over is
//! `CloseBeforeRestore`; every migrated connection must then carry bytes both ways.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use farside_migrate::testkit::is_root;
use farside_migrate::{
    wire, ControlConn, ControlPool, Handover, MigrateConfig, Outcome, Target, TargetOutcome,
};

/// Migrations per scenario: enough to see reuse on every one after the first.
const MIGRATIONS: usize = 5;
/// Bound on each read in these tests.
const READ_BOUND: Duration = Duration::from_secs(10);

fn cfg() -> MigrateConfig {
    MigrateConfig {
        handover: Handover::CloseBeforeRestore,
        ..MigrateConfig::default()
    }
}

/// A fresh connection to a local service: (server end, client end).
fn connection(l: &TcpListener) -> (TcpStream, TcpStream) {
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    c.set_read_timeout(Some(READ_BOUND)).unwrap();
    let (s, _) = l.accept().unwrap();
    (s, c)
}

/// The restored end answers the client: proves the connection survived the move.
fn check_works(mut restored: TcpStream, mut client: TcpStream, i: usize) {
    restored.set_read_timeout(Some(READ_BOUND)).unwrap();
    client.write_all(format!("ping{i}").as_bytes()).unwrap();
    let mut b = [0u8; 5];
    restored.read_exact(&mut b).unwrap();
    assert_eq!(&b, format!("ping{i}").as_bytes());
    restored.write_all(b"pong").unwrap();
    let mut b = [0u8; 4];
    client.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"pong");
}

/// Migrates `MIGRATIONS` connections through `pool` to a target run by `serve`
/// (which hands each restored socket back through the channel); asserts each moved.
fn run(
    pool: &ControlPool,
    target_addr: std::net::SocketAddr,
    restored: &std::sync::mpsc::Receiver<TcpStream>,
) {
    let service = TcpListener::bind("127.0.0.1:0").unwrap();
    for i in 0..MIGRATIONS {
        let (s, c) = connection(&service);
        match pool.migrate_with(s, target_addr, &cfg(), || Ok(())) {
            Outcome::Migrated(_) => {}
            Outcome::ResumedOnSource { reason, .. } => panic!("migration {i} stayed: {reason:?}"),
            Outcome::Lost(e) => panic!("migration {i} lost: {e}"),
        }
        let r = restored.recv_timeout(READ_BOUND).expect("restored socket");
        check_works(r, c, i);
    }
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn pooled_migrations_share_one_control_connection() {
    assert!(is_root(), "needs root");
    let mut target = Target::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = target.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = thread::spawn(move || {
        for _ in 0..MIGRATIONS {
            let o = target
                .serve_next(|_| Ok(()), |s| tx.send(s).unwrap())
                .unwrap();
            assert!(matches!(o, TargetOutcome::Restored { .. }), "{o:?}");
        }
    });
    let pool = ControlPool::new(2).unwrap();
    run(&pool, addr, &rx);
    t.join().unwrap();
    assert_eq!(pool.opened(), 1, "one connection for every migration");
    assert_eq!(pool.reused(), MIGRATIONS as u64 - 1);
    assert_eq!(pool.stale(), 0);
    assert_eq!(pool.idle(), 1);
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn a_pooled_connection_the_target_closed_is_replaced() {
    assert!(is_root(), "needs root");
    // serve_one closes each connection after its offer (a version-1-style target).
    let target = Target::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = target.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = thread::spawn(move || {
        for _ in 0..MIGRATIONS {
            let o = target
                .serve_one(|_| Ok(()), |s| tx.send(s).unwrap())
                .unwrap();
            assert!(matches!(o, TargetOutcome::Restored { .. }), "{o:?}");
        }
    });
    let pool = ControlPool::new(2).unwrap();
    run(&pool, addr, &rx);
    t.join().unwrap();
    assert_eq!(
        pool.opened(),
        MIGRATIONS as u64,
        "a new connection each time"
    );
    // Each time but the first, the pooled connection was found closed: by the peek
    // before its use, or (if the target had not closed it yet) when its OFFER failed
    // and was resent on a fresh connection.
    assert_eq!(pool.stale(), MIGRATIONS as u64 - 1);
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn an_offer_on_a_pooled_connection_that_dies_is_resent_on_a_fresh_one() {
    assert!(is_root(), "needs root");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = thread::spawn(move || {
        // First connection: one offer served, then the target "dies" with the
        // connection open after reading the next OFFER's header (the source's liveness
        // peek saw nothing wrong).
        let (c, _) = listener.accept().unwrap();
        let mut conn = ControlConn::new(c, Duration::from_secs(2)).unwrap();
        let o = conn
            .serve_next(READ_BOUND, |_| Ok(()), |s| tx.send(s).unwrap())
            .unwrap();
        assert!(matches!(o, Some(TargetOutcome::Restored { .. })), "{o:?}");
        let mut raw = conn.stream().try_clone().unwrap();
        let mut h = [0u8; wire::HEADER_BYTES];
        raw.read_exact(&mut h).unwrap();
        drop(raw);
        drop(conn);
        // The resent OFFER arrives on a new connection.
        let (c, _) = listener.accept().unwrap();
        let mut conn = ControlConn::new(c, Duration::from_secs(2)).unwrap();
        for _ in 1..MIGRATIONS {
            let o = conn
                .serve_next(READ_BOUND, |_| Ok(()), |s| tx.send(s).unwrap())
                .unwrap();
            assert!(matches!(o, Some(TargetOutcome::Restored { .. })), "{o:?}");
        }
    });
    let pool = ControlPool::new(2).unwrap();
    run(&pool, addr, &rx);
    t.join().unwrap();
    assert_eq!(pool.opened(), 2);
    assert_eq!(pool.stale(), 1, "the dead connection was replaced once");
    assert_eq!(pool.reused(), MIGRATIONS as u64 - 1);
}
