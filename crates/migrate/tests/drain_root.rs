//! The source's flow drain through a [`ControlPool`]'s reaper (root: netns,
//! TCP_REPAIR): `cargo test -p farside-migrate -- --include-ignored` as root under
//! `flock /tmp/farside-root.lock`.
//!
//! Three namespaces (client `c`, source `a`, target `b`), `CloseAfterRestore` (the
//! deployment's order), each flow moved by a per-flow policy rule in `c`. A migrated
//! connection's source socket stays open and frozen until its drain deadline, the
//! migration returns before it, the reaper closes it after it, and the client sees
//! neither a FIN nor a RST from it (its connection keeps working with the target
//! after the close). With the reaper's queue full the migrating thread drains inline
//! (counted); dropping the pool closes a pending socket at once, silently too.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use farside_migrate::testkit::netns::{Netns, NetnsSpec, NsRef};
use farside_migrate::testkit::{await_within, is_root};
use farside_migrate::{ControlPool, MigrateConfig, Outcome, Target};

const VIP: &str = "10.76.0.100";
const CLIENT_IP: &str = "10.76.9.1";
const B_IP: &str = "10.76.2.2";
const VIP_PORT: u16 = 8080;
const TABLE_B: u32 = 103;
const BOUND: Duration = Duration::from_secs(20);

/// The namespaces; `suffix` keeps this file's tests (run in parallel) apart.
fn netns(suffix: &str) -> Netns {
    Netns::setup(NetnsSpec {
        // Not the lab's `fs…` names; the pid keeps parallel runs apart.
        tag: format!("dr{}{suffix}", std::process::id() % 100_000),
        vip: VIP.parse().unwrap(),
        client_ip: CLIENT_IP.parse().unwrap(),
        a_ip: "10.76.2.1".parse().unwrap(),
        b_ip: B_IP.parse().unwrap(),
        table_b: Some(TABLE_B),
    })
    .expect("namespaces")
}

/// What descriptor `fd` of this process is now (`socket:[inode]`), if open.
fn fd_target(fd: i32) -> Option<String> {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .ok()
        .map(|p| p.display().to_string())
}

/// One ping-pong: the client sends `msg`, `server` reads it and answers it back.
fn ping(client: &mut TcpStream, server: &mut TcpStream, msg: &[u8]) {
    client.write_all(msg).unwrap();
    let mut b = vec![0u8; msg.len()];
    server.read_exact(&mut b).expect("server read");
    assert_eq!(b, msg);
    server.write_all(msg).unwrap();
    client.read_exact(&mut b).expect("client read (no reset)");
    assert_eq!(b, msg);
}

/// Nothing more reaches the client within `wait`: no FIN, no RST, no byte.
fn client_hears_nothing(client: &mut TcpStream, wait: Duration) {
    client.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 8];
    match client.read(&mut b) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        other => panic!("the client heard something: {other:?}"),
    }
    client.set_read_timeout(Some(BOUND)).unwrap();
}

struct Lab {
    ns: NsRef,
    listener: TcpListener,
    target: SocketAddr,
    restored: mpsc::Receiver<TcpStream>,
}

impl Lab {
    /// The target (serving offers in `b`, restored sockets sent back) and the
    /// source's listener (in `a`; the calling thread is moved into `a`).
    fn start(ns: &NsRef, offers: usize) -> Lab {
        let (addr_tx, addr_rx) = mpsc::channel();
        let (tx, restored) = mpsc::channel();
        let nsb = ns.clone();
        thread::spawn(move || {
            nsb.enter("b").unwrap();
            let mut t = Target::bind(format!("{B_IP}:0").parse().unwrap()).unwrap();
            addr_tx.send(t.local_addr().unwrap()).unwrap();
            for _ in 0..offers {
                let _ = t.serve_next(|_| Ok(()), |s| tx.send(s).unwrap());
            }
        });
        let target = addr_rx.recv_timeout(BOUND).unwrap();
        ns.enter("a").unwrap();
        let listener = TcpListener::bind(format!("{VIP}:{VIP_PORT}")).unwrap();
        Lab {
            ns: ns.clone(),
            listener,
            target,
            restored,
        }
    }

    /// A client connection (made in `c`) and the source's end, one ping done.
    fn connection(&self) -> (TcpStream, TcpStream) {
        let nsc = self.ns.clone();
        let mut c = thread::spawn(move || {
            nsc.enter("c").unwrap();
            TcpStream::connect(format!("{VIP}:{VIP_PORT}")).unwrap()
        })
        .join()
        .unwrap();
        c.set_read_timeout(Some(BOUND)).unwrap();
        let (mut s, _) = self.listener.accept().unwrap();
        s.set_read_timeout(Some(BOUND)).unwrap();
        ping(&mut c, &mut s, b"on the source");
        (c, s)
    }

    /// Migrates `s` through `pool` (the client's flow moved by a policy rule);
    /// returns how long `migrate_with` took.
    fn migrate(&self, pool: &ControlPool, s: TcpStream, drain: Duration) -> Duration {
        let sport = s.peer_addr().unwrap().port();
        let cfg = MigrateConfig {
            flow_drain: drain,
            ..MigrateConfig::default()
        };
        let t0 = Instant::now();
        let outcome = pool.migrate_with(s, self.target, &cfg, || {
            self.ns.try_ip(
                "c",
                &format!("rule add from {CLIENT_IP} sport {sport} ipproto tcp lookup {TABLE_B}"),
            )
        });
        let took = t0.elapsed();
        assert!(matches!(outcome, Outcome::Migrated(_)), "{outcome:?}");
        took
    }

    fn restored(&self) -> TcpStream {
        let s = self.restored.recv_timeout(BOUND).expect("handed over");
        s.set_read_timeout(Some(BOUND)).unwrap();
        s
    }
}

#[test]
#[ignore = "needs root (netns, TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root under flock /tmp/farside-root.lock"]
fn the_source_stays_frozen_until_the_drain_deadline_then_closes_silently() {
    assert!(is_root(), "needs root");
    let guard = netns("f");
    let lab = Lab::start(&guard.r, 1);
    let pool = ControlPool::new(1).unwrap();
    let drain = Duration::from_millis(1500);
    let (mut c, s) = lab.connection();
    let fd = s.as_raw_fd();
    let sock_name = fd_target(fd).unwrap();
    let took = lab.migrate(&pool, s, drain);
    let migrated_at = Instant::now();
    // The outcome did not wait for the drain (the old code slept it here).
    assert!(
        took < drain,
        "migrate_with took {took:?}, the drain is {drain:?}"
    );
    let d = pool.drain_stats();
    assert_eq!((d.deferred, d.inline, d.pending), (1, 0, 1), "{d:?}");
    // Still open, frozen: the same socket behind the descriptor.
    assert_eq!(fd_target(fd).as_deref(), Some(sock_name.as_str()));
    let mut t = lab.restored();
    ping(&mut c, &mut t, b"on the target, source still draining");
    assert!(
        migrated_at.elapsed() < drain,
        "the machine was too slow to check before the deadline"
    );
    assert_eq!(fd_target(fd).as_deref(), Some(sock_name.as_str()));
    // Closed after the deadline (within the coalescing slack plus scheduling).
    assert!(await_within(BOUND, || fd_target(fd).as_deref()
        != Some(sock_name.as_str())));
    assert!(
        migrated_at.elapsed() >= drain - Duration::from_millis(5),
        "closed {:?} after the migration, before its drain",
        migrated_at.elapsed()
    );
    let d = pool.drain_stats();
    assert_eq!((d.closed, d.pending), (1, 0), "{d:?}");
    // The close was silent: the connection goes on with the target.
    client_hears_nothing(&mut c, Duration::from_millis(300));
    ping(&mut c, &mut t, b"after the source closed");
}

#[test]
#[ignore = "needs root (netns, TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root under flock /tmp/farside-root.lock"]
fn a_full_drain_queue_drains_inline_and_dropping_the_pool_closes_pending() {
    assert!(is_root(), "needs root");
    let guard = netns("q");
    let lab = Lab::start(&guard.r, 3);
    // One pending socket at most.
    let pool = ControlPool::with_drain(1, 1).unwrap();
    assert!(ControlPool::with_drain(1, 0).is_err());
    let long = Duration::from_secs(3600);
    let (mut c1, s1) = lab.connection();
    let (fd1, name1) = (s1.as_raw_fd(), fd_target(s1.as_raw_fd()).unwrap());
    assert!(lab.migrate(&pool, s1, long) < Duration::from_secs(60));
    let mut t1 = lab.restored();
    // The queue is full: the next migration drains in the migrating thread.
    let inline = Duration::from_millis(400);
    let (mut c2, s2) = lab.connection();
    let (fd2, name2) = (s2.as_raw_fd(), fd_target(s2.as_raw_fd()).unwrap());
    let took = lab.migrate(&pool, s2, inline);
    assert!(took >= inline, "inline drain: {took:?}");
    assert_ne!(fd_target(fd2), Some(name2), "closed before returning");
    let d = pool.drain_stats();
    assert_eq!((d.deferred, d.inline, d.pending), (1, 1, 1), "{d:?}");
    let mut t2 = lab.restored();
    client_hears_nothing(&mut c2, Duration::from_millis(200));
    ping(&mut c2, &mut t2, b"second, drained inline");
    // Dropping the pool closes the pending socket now, not in an hour, silently.
    assert_eq!(fd_target(fd1).as_deref(), Some(name1.as_str()));
    let t0 = Instant::now();
    drop(pool);
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_ne!(fd_target(fd1), Some(name1));
    client_hears_nothing(&mut c1, Duration::from_millis(200));
    ping(&mut c1, &mut t1, b"first, closed by the pool's drop");
}
