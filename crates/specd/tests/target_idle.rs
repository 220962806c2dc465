//! The target side's threads with idle control connections (a source's pooled
//! connections waiting for their next OFFER) do not all wake when another source
//! connects while a thread waits in accept: that thread takes it (accept's exclusive
//! wait), the idle ones sleep on. With no thread free, an idle one gives its
//! connection up for the newcomer (as before). A stop wakes them all at once. No root:
//! the "sources" are plain connections that send nothing.
//!
//! One test in this file: it reads the process's `specd-target*` threads.

use std::io::Read;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use farside_specd::handoff::Handoff;
use farside_specd::target::{OfferRules, TargetConfig, TargetDaemon};

const BOUND: Duration = Duration::from_secs(20);

/// (voluntary context switches summed, threads in poll, threads in accept) of the
/// `specd-target*` threads.
fn targets() -> (u64, usize, usize) {
    let (mut sw, mut polling, mut accepting) = (0, 0, 0);
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("specd-target") {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        sw += status
            .lines()
            .filter(|l| l.starts_with("voluntary_ctxt_switches"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .sum::<u64>();
        let nr: i64 = std::fs::read_to_string(t.path().join("syscall"))
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(-1);
        if nr == libc::SYS_poll || nr == libc::SYS_ppoll {
            polling += 1;
        } else if nr == libc::SYS_accept || nr == libc::SYS_accept4 {
            accepting += 1;
        }
    }
    (sw, polling, accepting)
}

/// Awaits `polling` threads in poll and `accepting` in accept.
fn await_threads(polling: usize, accepting: usize) {
    let t0 = Instant::now();
    loop {
        let (_, p, a) = targets();
        if (p, a) == (polling, accepting) {
            return;
        }
        assert!(
            t0.elapsed() < BOUND,
            "{p} polling, {a} accepting; awaited {polling}, {accepting}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether `c` sees EOF (its target thread gave it up) within `wait`.
fn closed(c: &mut TcpStream, wait: Duration) -> bool {
    c.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 16];
    matches!(c.read(&mut b), Ok(0))
}

fn start(threads: usize) -> (TargetDaemon, TcpListener) {
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = TargetDaemon::start(TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        server_port: server.local_addr().unwrap().port(),
        admit_queue_max: 64,
        handoff: Handoff::Relay("127.0.0.1:9".parse().unwrap()),
        threads,
        peers: Vec::new(),
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
    (target, server)
}

#[test]
fn a_new_source_wakes_one_thread_not_every_idle_one() {
    // No thread free: an idle connection makes room for the next source (its thread
    // closes it and accepts the newcomer), as before.
    let (target, _server) = start(2);
    let connect = || TcpStream::connect(target.addr()).unwrap();
    await_threads(0, 2);
    let mut held: Vec<TcpStream> = (0..2).map(|_| connect()).collect();
    await_threads(2, 0);
    let _third = connect();
    let t0 = Instant::now();
    while !held
        .iter_mut()
        .any(|c| closed(c, Duration::from_millis(20)))
    {
        assert!(t0.elapsed() < BOUND, "no idle connection made room");
    }
    await_threads(2, 0);
    target.stop();

    // Threads free: a new source wakes the one in accept only.
    let (target, _server) = start(6);
    let connect = || TcpStream::connect(target.addr()).unwrap();
    await_threads(0, 6);
    // Four idle control connections: four threads wait on them, two in accept.
    let idle: Vec<TcpStream> = (0..4).map(|_| connect()).collect();
    await_threads(4, 2);
    let (before, _, _) = targets();
    let fifth = connect();
    await_threads(5, 1);
    // A window longer than the old code's 10 ms recheck, so that its idle threads'
    // wake-ups would all be counted.
    std::thread::sleep(Duration::from_millis(50));
    let (after, _, _) = targets();
    // The accepting thread woke and sleeps again in poll: 1. The old code's idle
    // threads watched the listener and each woke as well: 5 measured.
    assert!(
        after - before <= 2,
        "{} wake-ups of the target's threads for one new source",
        after - before
    );
    // A stop wakes every thread at once, those watching their idle connection too
    // (not after their 3 s idle bound).
    let t0 = Instant::now();
    target.stop();
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "stop took {:?}",
        t0.elapsed()
    );
    drop((idle, fifth));
}
