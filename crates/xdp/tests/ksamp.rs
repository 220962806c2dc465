//! The kernel-resident sampler (root only; skipped otherwise): with no user-space
//! writer at all, the load record in the region map advances every period and its
//! connection counts follow connects, accepts and closes on the watched port. Read with
//! the normal reader (`Snapshot::read_local` on the map's mapping, as shm readers do).
//! Run under `flock /tmp/farside-root.lock`.

mod common;

use common::need_root;
use farside_region::{Header, LoadRecord, RegionWriter, Snapshot, Words};
use farside_xdp::{PortCounts, TestProgram};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Shared(Arc<dyn Words>);
impl Words for Shared {
    fn words(&self) -> &[AtomicU64] {
        self.0.words()
    }
}

/// A loaded program whose region has a header and a first record, as gatherd leaves it.
fn program_with_header(port: u16) -> (TestProgram, Arc<dyn Words>) {
    let p = TestProgram::load(
        9,
        &farside_auth::keys::Keyring::new(farside_auth::keys::Policy::Production),
    )
    .expect("load");
    let region = p.region();
    let mut w = RegionWriter::init(
        Shared(region.clone()),
        Header {
            node_id: 5,
            generation: 77,
            period_us: 1000,
            watched_ports: [port, 0, 0, 0],
        },
    );
    w.publish(&LoadRecord::default());
    (p, region)
}

fn snapshot(region: &Arc<dyn Words>) -> Snapshot {
    Snapshot::read_local(&Shared(region.clone()), 100).expect("a valid record")
}

/// Wait until the record satisfies `ok` (the kernel publishes every ms).
fn await_record(region: &Arc<dyn Words>, what: &str, ok: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = snapshot(region);
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: last record {s:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn kernel_sampler_publishes_backlog_and_connections_without_user_space() {
    if !need_root("kernel_sampler_publishes_backlog_and_connections_without_user_space") {
        return;
    }
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    // Noise on another port must not count.
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let _noise: Vec<_> = (0..2)
        .map(|_| TcpStream::connect(other.local_addr().unwrap()).unwrap())
        .collect();
    let (mut p, region) = program_with_header(port);
    let first = snapshot(&region);
    assert_eq!(first.seq, 1);
    let _stats = farside_xdp::enable_bpf_stats().expect("BPF_ENABLE_STATS");
    p.start_kernel_sampler(&[port], Duration::from_millis(1), &mut || {
        Ok(vec![PortCounts::default()])
    })
    .expect("kernel sampler");

    // The sequence advances although nothing in user space writes the region.
    let a = await_record(&region, "sequence advances", |s| s.seq > first.seq + 5);
    assert_eq!(a.header.node_id, 5, "the header gatherd wrote is kept");
    assert_eq!(a.header.generation, 77);
    assert!(a.load.sample_mono_ns > 0 && a.load.ncpu >= 1, "{a:?}");
    assert_eq!(
        a.load.flags,
        farside_region::layout::FLAG_CONNS | farside_region::layout::FLAG_QUEUE_DELAY,
        "counts and queueing delay valid; no PSI, memory or inflight in the kernel record"
    );
    assert_eq!(a.load.queue_delay_us, 0, "nothing waits");
    assert_eq!(a.load.conns_lag_ns(), 0, "counts are current");
    assert_eq!(a.load.conns_established, 0);
    assert_eq!(a.load.accept_backlog, 0);

    // The same port in another network namespace (another lab node) does not count.
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let foreign = std::thread::spawn(move || {
        // SAFETY: unshare affects this thread only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let up = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("ip");
        assert!(up.success());
        let fl = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let c: Vec<_> = (0..2)
            .map(|_| TcpStream::connect(fl.local_addr().unwrap()).unwrap())
            .collect();
        tx.send(()).unwrap();
        done_rx.recv().unwrap();
        drop((c, fl));
    });
    rx.recv().unwrap();
    let b = snapshot(&region);
    let c = await_record(&region, "advances", |s| s.seq > b.seq + 5);
    assert_eq!(
        (c.load.conns_established, c.load.accept_backlog),
        (0, 0),
        "another namespace's sockets counted"
    );
    done_tx.send(()).unwrap();
    foreign.join().unwrap();

    // N connections queued, not accepted: backlog N, established N (server side).
    const N: u64 = 3;
    // Taken before the first connect: the head's age counts from its arrival.
    let queued_at = std::time::Instant::now();
    let clients: Vec<TcpStream> = (0..N)
        .map(|_| TcpStream::connect(l.local_addr().unwrap()).unwrap())
        .collect();
    await_record(&region, "backlog N", |s| {
        s.load.accept_backlog == N && s.load.conns_established == N
    });
    // The queue's head has waited since it was queued: its age grows with the clock.
    const WAIT: Duration = Duration::from_millis(30);
    let waited = await_record(&region, "queueing delay of the head", |s| {
        s.load.queue_delay_us >= WAIT.as_micros() as u64
    });
    let bound = queued_at.elapsed().as_micros() as u64;
    assert!(
        waited.load.queue_delay_us <= bound,
        "head age {} µs > {bound} µs since the first connect",
        waited.load.queue_delay_us
    );

    // Accept one: backlog N-1, still N established; the new head arrived later, so the
    // delay is not older than the first connection's wait.
    let (served, _) = l.accept().unwrap();
    let after = await_record(&region, "accept lowers the backlog", |s| {
        s.load.accept_backlog == N - 1 && s.load.conns_established == N
    });
    assert!(after.load.queue_delay_us > 0, "{after:?}");
    // Accept the rest: nothing waits, the delay reads 0.
    let rest: Vec<_> = (0..N - 1).map(|_| l.accept().unwrap().0).collect();
    await_record(&region, "empty queue, no delay", |s| {
        s.load.accept_backlog == 0 && s.load.queue_delay_us == 0
    });
    drop(rest);
    // Those closed server-side leave ESTABLISHED; queue N - 1 new ones for what follows.
    let mut clients: Vec<TcpStream> = clients
        .into_iter()
        .take(1)
        .chain((0..N - 1).map(|_| TcpStream::connect(l.local_addr().unwrap()).unwrap()))
        .collect();
    await_record(&region, "re-queued", |s| {
        s.load.accept_backlog == N - 1 && s.load.conns_established == N
    });

    // Close it (server side leaves ESTABLISHED): N-1 established.
    drop(served);
    drop(clients.remove(0));
    await_record(&region, "close lowers established", |s| {
        s.load.accept_backlog == N - 1 && s.load.conns_established == N - 1
    });

    // Clients that close while queued stay in the backlog until accepted (as the
    // kernel's sk_ack_backlog does), but leave ESTABLISHED.
    drop(clients);
    await_record(&region, "queued clients closed", |s| {
        s.load.conns_established == 0 && s.load.accept_backlog == N - 1
    });
    // The listener closes: its queue is flushed.
    drop(l);
    await_record(&region, "closed listener", |s| s.load.accept_backlog == 0);
    // A new listener on the port is learnt again (the closed one's entry was freed and
    // left the tick's set): its queue is read live, with its head's age.
    let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let queued: Vec<_> = (0..2)
        .map(|_| TcpStream::connect(l.local_addr().unwrap()).unwrap())
        .collect();
    await_record(&region, "a new listener read", |s| {
        s.load.accept_backlog == 2 && s.load.queue_delay_us > 0
    });
    let accepted = l.accept().unwrap();
    await_record(&region, "its accept seen", |s| s.load.accept_backlog == 1);
    drop((accepted, queued, l));

    let costs = p.kernel_sampler_costs().expect("running");
    assert!(costs.tick.run_count > 0, "{costs:?}");
    assert!(costs.state.run_count > 0, "{costs:?}");
    assert!(costs.ready.run_count > 0, "{costs:?}");
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "kernel sampler cost: tick {:.0} ns/run x {} CPUs = {:.0} ns per record; state {:.0} ns/event; data-ready {:.0} ns/event",
        costs.tick.ns_per_run(),
        costs.cpus,
        costs.tick_ns_per_sample(),
        costs.state.ns_per_run(),
        costs.ready.ns_per_run()
    );

    // Stopped: the record stops advancing.
    p.stop_kernel_sampler();
    let s1 = snapshot(&region);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        snapshot(&region).seq,
        s1.seq,
        "stopped sampler still writes"
    );
}

#[test]
fn kernel_sampler_starts_from_the_seeded_counts() {
    if !need_root("kernel_sampler_starts_from_the_seeded_counts") {
        return;
    }
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let _queued: Vec<_> = (0..2)
        .map(|_| TcpStream::connect(l.local_addr().unwrap()).unwrap())
        .collect();
    let (mut p, region) = program_with_header(port);
    p.start_kernel_sampler(&[port], Duration::from_millis(1), &mut || {
        Ok(vec![PortCounts {
            established: 2,
            backlog: 2,
        }])
    })
    .unwrap();
    await_record(&region, "seeded", |s| {
        s.load.accept_backlog == 2 && s.load.conns_established == 2
    });
    // A new connection makes the listener known: its queue is read from then on, so
    // accepts show at once.
    let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    await_record(&region, "listener learnt", |s| {
        s.load.accept_backlog == 3 && s.load.conns_established == 3
    });
    let _s = l.accept().unwrap();
    await_record(&region, "accept after the seed", |s| {
        s.load.accept_backlog == 2 && s.load.conns_established == 3
    });
    // Refusals: too many ports, too short a period.
    let (mut q, _) = program_with_header(port);
    let e = q
        .start_kernel_sampler(&[1, 2, 3, 4, 5], Duration::from_millis(1), &mut || {
            Ok(vec![])
        })
        .unwrap_err();
    assert!(e.to_string().contains("at most 4"), "{e}");
    let e = q
        .start_kernel_sampler(&[1], Duration::from_micros(10), &mut || Ok(vec![]))
        .unwrap_err();
    assert!(e.to_string().contains("period"), "{e}");
}

/// The sampler needs BPF, not XDP: on the maps loaded for it alone
/// (`XdpResponder::load_for_sampler`, never attachable) it publishes the record into
/// the region map, and the object's program statistics list its programs only.
#[test]
fn kernel_sampler_runs_on_maps_loaded_without_xdp() {
    if !need_root("kernel_sampler_runs_on_maps_loaded_without_xdp") {
        return;
    }
    let mut x = farside_xdp::XdpResponder::load_for_sampler().expect("load");
    assert!(!x.serves_udp());
    let e = x
        .attach_to("lo", farside_xdp::XdpMode::Generic)
        .unwrap_err();
    assert!(e.to_string().contains("not attachable"), "{e}");
    let region = x.region();
    RegionWriter::init(
        Shared(region.clone()),
        Header {
            node_id: 8,
            generation: 1,
            period_us: 1000,
            watched_ports: [0; 4],
        },
    )
    .publish(&LoadRecord::default());
    let a = snapshot(&region);
    x.start_kernel_sampler(&[], Duration::from_millis(1), &mut || Ok(vec![]))
        .unwrap();
    await_record(&region, "advances", |s| s.seq > a.seq + 10);
    let names: Vec<&str> = x.program_stats().iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["ksamp_tick", "ksamp_state", "ksamp_ready"]);
    assert!(x.kernel_sampler_costs().is_some());
}
