//! The source side's migrators accept on the admission listener themselves (
//! no acceptor thread and channel hop, one wake-up less per migratory connection),
//! and a stop wakes every migrator blocked in accept(2) (no root: no steering, no
//! migration; every arrival finds the server's queue below Q and is handed to the
//! local server through the relay, counted `stale_local`).
//!
//! One test in this file: it counts the process's `specd-*` threads.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use farside_migrate::Handover;
use farside_specd::handoff::{HandOff, Handoff};
use farside_specd::source::{Peer, SourceConfig, SourceDaemon};
use farside_specd::steer::NoSteer;
use farside_specd::window::WindowConfig;

const BOUND: Duration = Duration::from_secs(20);
const MIGRATORS: usize = 8;
const CLIENTS: usize = 16;
/// Arrivals one after the other (wake-ups counted).
const SEQUENTIAL: usize = 10;

/// Names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect()
}

/// Voluntary context switches (sleeps) of the `specd-mig*` threads, summed.
fn mig_voluntary_switches() -> u64 {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("specd-mig"))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|st| {
            st.lines()
                .filter(|l| l.starts_with("voluntary_ctxt_switches"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// A client through the source: "hello" comes back from the echo behind the relay.
fn echo_once(addr: std::net::SocketAddr) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(BOUND)).unwrap();
    c.write_all(b"hello").unwrap();
    let mut b = [0u8; 5];
    c.read_exact(&mut b).expect("served through the relay");
    assert_eq!(&b, b"hello");
}

fn count(names: &[String], prefix: &str) -> usize {
    names.iter().filter(|n| n.starts_with(prefix)).count()
}

#[test]
fn migrators_accept_themselves_and_a_stop_wakes_every_one() {
    // The local server: an empty accept queue (below Q), so every arrival is "server".
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    // Behind the relay: an echo server.
    let sink = TcpListener::bind("127.0.0.1:0").unwrap();
    let sink_addr = sink.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in sink.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut b = [0u8; 5];
                if s.read_exact(&mut b).is_ok() {
                    let _ = s.write_all(&b);
                }
            });
        }
    });
    let notify = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let source = SourceDaemon::start(
        SourceConfig {
            accept: "127.0.0.1:0".parse().unwrap(),
            notify,
            window: WindowConfig::new(2, 4),
            server_port: server.local_addr().unwrap().port(),
            steer: None,
            // Never reached: nothing is migratory here.
            peers: vec![Peer::parse("daemon=127.0.0.1:1").unwrap()],
            migrators: MIGRATORS,
            poll: Duration::from_millis(5),
            poll_steer: false,
            no_room: Default::default(),
            peer_poll: Duration::from_millis(5),
            handover: Handover::CloseAfterRestore,
            affinity: None,
            gate_on_peer_load: false,
            auth: None,
            own_backend: None,
        },
        HandOff::new(Handoff::Relay(sink_addr)).unwrap(),
        Box::new(NoSteer),
    )
    .unwrap();
    // Awaited: a new thread carries its creator's name until it runs.
    let t0 = std::time::Instant::now();
    while count(&thread_names(), "specd-mig") < MIGRATORS {
        assert!(t0.elapsed() < BOUND, "{:?}", thread_names());
        std::thread::sleep(Duration::from_millis(1));
    }
    let names = thread_names();
    assert_eq!(count(&names, "specd-mig"), MIGRATORS, "{names:?}");
    assert_eq!(
        count(&names, "specd-accept"),
        0,
        "no acceptor thread: {names:?}"
    );
    // One arrival wakes one migrator (accept's exclusive wait), not all of them (as a
    // poll on the listener from every migrator would): voluntary context switches of
    // the migrators over sequential arrivals, each served before the next.
    let before = mig_voluntary_switches();
    for _ in 0..SEQUENTIAL {
        echo_once(source.accept_addr());
    }
    let woke = mig_voluntary_switches() - before;
    eprintln!("{woke} migrator sleeps over {SEQUENTIAL} sequential arrivals");
    assert!(
        woke <= 3 * SEQUENTIAL as u64,
        "{woke} migrator wake-ups for {SEQUENTIAL} arrivals ({MIGRATORS} migrators)"
    );
    // Concurrent arrivals, each decided and handed by whichever migrator accepted it.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let addr = source.accept_addr();
            std::thread::spawn(move || echo_once(addr))
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    let st = source.stats();
    let all = (SEQUENTIAL + CLIENTS) as u64;
    assert_eq!(st.accepted.load(Ordering::Relaxed), all);
    assert_eq!(st.stale_local.load(Ordering::Relaxed), all);
    assert_eq!(st.migrated.load(Ordering::Relaxed), 0);
    let v: serde_json::Value = serde_json::from_str(&source.summary_json()).unwrap();
    assert_eq!(v["flow_drain"]["deferred"], 0, "{}", v["flow_drain"]);
    assert_eq!(v["window"]["in_flight"], 0);
    assert_eq!(v["control"]["opened"], 0, "no migration: {}", v["control"]);
    // The stop shuts the listener down, which wakes every migrator blocked in accept
    // (there is no timeout to fall back on: a thread not woken would hang the join).
    let (done_tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        source.stop();
        done_tx.send(()).unwrap();
    });
    let t0 = std::time::Instant::now();
    done.recv_timeout(BOUND)
        .expect("stop hung: a migrator blocked in accept was not woken");
    eprintln!("stop took {:?}", t0.elapsed());
    // A joined thread can stay listed a moment (its exit finishes after the join).
    let left = |names: &[String]| {
        ["specd-mig", "specd-poll", "specd-notified"]
            .iter()
            .map(|t| count(names, t))
            .sum::<usize>()
    };
    while left(&thread_names()) > 0 {
        assert!(t0.elapsed() < BOUND, "threads left: {:?}", thread_names());
        std::thread::sleep(Duration::from_millis(1));
    }
}
