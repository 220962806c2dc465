//! The monitor end to end over real sockets: many regions behind one responder, a
//! silent server, a late reply.

use super::*;
use crate::responder::MultiResponder;
use crate::table::{self, EntryStatus};
use std::net::UdpSocket;
use std::time::Instant;

/// The keys of the tests' own tcp servers (the responders hold their own).
fn lab_keys() -> &'static farside_rmem::LabKeyset {
    static K: std::sync::OnceLock<farside_rmem::LabKeyset> = std::sync::OnceLock::new();
    K.get_or_init(farside_rmem::LabKeyset::generate)
}

fn opts(threads: usize) -> MonitorOptions {
    MonitorOptions {
        period: Duration::from_millis(1),
        read_timeout: Duration::from_millis(30),
        stale_after: Duration::from_millis(100),
        key: Some(lab_keys().reader),
        nice: 0,
        threads,
        group: None,
        rx: crate::MonitorRx::Udp,
    }
}

/// Wait until `f` holds, at most 60 s (tests run at idle priority on a shared machine).
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting: {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn one_poller_reads_a_thousand_regions_each_into_its_own_entry() {
    let n = table::TABLE_BACKENDS_MAX;
    let r = MultiResponder::spawn(n).unwrap();
    let t = create_table(None, n, 1000).unwrap();
    let watches = (0..n)
        .map(|i| Watch {
            index: i,
            name: format!("b{i}"),
            region: r.target(i),
        })
        .collect();
    // 20 ms: the test's responder is one thread on a shared machine, and a read it
    // drops only delays this test (entries keep their last good values).
    let o = MonitorOptions {
        period: Duration::from_millis(20),
        ..opts(0)
    };
    let m = Monitor::start(watches, t.clone(), o).unwrap();
    assert_eq!(m.pollers().len(), 2, "1,024 back-ends: one poller per 512");
    let good = |bump: u64| {
        (0..n).all(|i| {
            table::read(&*t, i).is_some_and(|e| {
                e.status != EntryStatus::Never && e.conns_established == i as u64 + bump
            })
        })
    };
    until("every entry read", || good(0));
    // A new sample everywhere reaches every entry, each still its own region's.
    r.publish_all(1000);
    until("every entry advanced", || good(1000));
    assert!(m.stats(n - 1).is_some_and(|s| s.read.count() > 0));
    assert!(m.stats(n).is_none());
}

#[test]
fn a_silent_server_counts_failed_reads_and_goes_stale_while_others_stay_fresh() {
    let r = MultiResponder::spawn(1).unwrap();
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let t = create_table(None, 2, 1000).unwrap();
    let watches = vec![
        Watch {
            index: 0,
            name: "ok".into(),
            region: r.target(0),
        },
        Watch {
            index: 1,
            name: "silent".into(),
            region: Target::parse(&format!("udp:{}", silent.local_addr().unwrap())).unwrap(),
        },
    ];
    let _m = Monitor::start(watches, t.clone(), opts(1)).unwrap();
    until("failed reads counted", || {
        table::read(&*t, 1).is_some_and(|e| e.status == EntryStatus::Error && e.errors >= 2)
    });
    assert_eq!(table::read(&*t, 0).map(|e| e.status), Some(EntryStatus::Ok));
}

#[test]
fn a_reply_after_its_read_was_given_up_is_dropped_and_the_next_read_counts() {
    use farside_rmem::wire::{RepHeader, ReqHeader, Status, ENVELOPE_BYTES};
    // A hand-driven server: it answers its first request only after the read's whole
    // timeout (three attempts), then answers promptly.
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let t = create_table(None, 1, 1000).unwrap();
    let watches = vec![Watch {
        index: 0,
        name: "slow".into(),
        region: Target::parse(&format!("udp:{}", server.local_addr().unwrap())).unwrap(),
    }];
    let m = Monitor::start(watches, t.clone(), opts(1)).unwrap();
    let mut buf = [0u8; 2048];
    let (_, peer) = server.recv_from(&mut buf).unwrap();
    let envelope = |b: &[u8]| farside_auth::mac::Envelope {
        key_id: farside_auth::mac::KeyId(u32::from_le_bytes(b[8..12].try_into().unwrap())),
        sender: u64::from_le_bytes(b[16..24].try_into().unwrap()),
        seq: u64::from_le_bytes(b[24..32].try_into().unwrap()),
    };
    let first_env = envelope(&buf);
    let first = ReqHeader::decode(&buf[ENVELOPE_BYTES..]).unwrap();
    until("the first read given up", || {
        table::read(&*t, 0).is_some_and(|e| e.errors >= 1)
    });
    let reply = |seq: u64, request: farside_auth::mac::Envelope| {
        let mut rep = vec![0u8; ENVELOPE_BYTES];
        RepHeader {
            op: first.op,
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
            conns_established: 77,
            ..Default::default()
        });
        for w in &mem.mem().words()[..MONITOR_READ_BYTES / 8] {
            rep.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        farside_rmem::auth::seal_reply_in_place(&mut rep, lab_keys().reader.key(), &request);
        rep
    };
    server.send_to(&reply(first.seq, first_env), peer).unwrap();
    until("the late reply dropped", || {
        m.pollers()[0].late.load(Ordering::Relaxed) >= 1
    });
    assert_ne!(
        table::read(&*t, 0).map(|e| e.conns_established),
        Some(77),
        "a late reply is never published"
    );
    // Answer the reads still coming, promptly: the entry turns good.
    server
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    until("a prompt reply counted", || {
        if let Ok((_, p)) = server.recv_from(&mut buf) {
            let h = ReqHeader::decode(&buf[ENVELOPE_BYTES..]).unwrap();
            server.send_to(&reply(h.seq, envelope(&buf)), p).unwrap();
        }
        table::read(&*t, 0)
            .is_some_and(|e| e.status == EntryStatus::Ok && e.conns_established == 77)
    });
}

#[test]
fn poller_threads_follow_the_stated_rule() {
    assert_eq!(poller_threads(0, 0), 1);
    assert_eq!(poller_threads(16, 0), 1);
    assert_eq!(poller_threads(512, 0), 1);
    assert_eq!(poller_threads(513, 0), 2);
    assert_eq!(poller_threads(1024, 0), 2);
    assert_eq!(poller_threads(1024, 3), 3);
    assert_eq!(poller_threads(2, 8), 2, "never more threads than back-ends");
    assert_eq!(poller_threads(100_000, 0), MONITOR_THREADS_MAX);
}

#[test]
fn tables_are_sized_from_the_back_ends_and_refuse_beyond_the_bound() {
    let t = create_table(None, 3, 1000).unwrap();
    assert_eq!(t.words().len(), table::table_words(3));
    let err = create_table(None, table::TABLE_BACKENDS_MAX + 1, 1000)
        .err()
        .expect("beyond the bound");
    assert!(err.to_string().contains("at most 1024"), "{err}");
}

/// A region in shared words behind gatherd's own tcp server, with `conns` published.
fn tcp_region(conns: u64) -> (farside_rmem::TcpServer, Arc<dyn Words>) {
    use farside_region::{Header, HeapWords, LoadRecord, RegionWriter, REGION_WORDS};
    use farside_rmem::ops::OpCounters;
    struct Shared(Arc<HeapWords>);
    impl Words for Shared {
        fn words(&self) -> &[std::sync::atomic::AtomicU64] {
            self.0.words()
        }
    }
    let mem = Arc::new(HeapWords::new(REGION_WORDS));
    let mut w = RegionWriter::init(
        Shared(mem.clone()),
        Header {
            node_id: 3,
            generation: 5,
            period_us: 1000,
            watched_ports: [0; 4],
        },
    );
    w.publish(&LoadRecord {
        conns_established: conns,
        ..Default::default()
    });
    let words: Arc<dyn Words> = mem;
    let keys = lab_keys().server();
    let s = farside_rmem::TcpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        words.clone(),
        keys,
        Arc::new(OpCounters::default()),
    )
    .unwrap();
    (s, words)
}

#[test]
fn tcp_regions_are_read_by_the_poller_with_udp_ones_and_a_dead_server_fails_alone() {
    let (s1, _m1) = tcp_region(41);
    let (s2, _m2) = tcp_region(42);
    let r = MultiResponder::spawn(1).unwrap();
    // A port nothing listens on: connect refused, backoff, counted.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let tcp = |a: std::net::SocketAddr| Target::parse(&format!("tcp:{a}")).unwrap();
    let watches = vec![
        Watch {
            index: 0,
            name: "t1".into(),
            region: tcp(s1.local_addr),
        },
        Watch {
            index: 1,
            name: "u".into(),
            region: r.target(0),
        },
        Watch {
            index: 2,
            name: "t2".into(),
            region: tcp(s2.local_addr),
        },
        Watch {
            index: 3,
            name: "dead".into(),
            region: tcp(dead_addr),
        },
    ];
    let t = create_table(None, 4, 1000).unwrap();
    let m = Monitor::start(watches, t.clone(), opts(0)).unwrap();
    assert_eq!(
        m.pollers().len(),
        1,
        "tcp regions need no thread of their own"
    );
    until("tcp and udp entries read", || {
        [(0, 41), (1, 0), (2, 42)].iter().all(|&(i, v)| {
            table::read(&*t, i)
                .is_some_and(|e| e.status == EntryStatus::Ok && e.conns_established == v)
        })
    });
    until("the dead server's reads fail", || {
        table::read(&*t, 3).is_some_and(|e| e.status == EntryStatus::Error && e.errors >= 2)
    });
    // Reads keep succeeding on the live streams (one stream each, many reads).
    let before = m.stats(0).unwrap().read.count();
    until("more tcp reads", || {
        m.stats(0).unwrap().read.count() > before + 10
    });
}

/// Watches of the `n` regions of `r`, and options reading them by group every 5 ms.
fn group_watches(r: &crate::responder::GroupResponder, n: usize) -> (Vec<Watch>, MonitorOptions) {
    let watches = (0..n)
        .map(|i| Watch {
            index: i,
            name: format!("b{i}"),
            region: r.target(i),
        })
        .collect();
    let o = MonitorOptions {
        period: Duration::from_millis(5),
        group: Some(r.group),
        key: Some(r.key()),
        ..opts(1)
    };
    (watches, o)
}

/// Whether entries `0..n` of `t` are fresh and hold region `i`'s record (`i + bump`).
fn entries_hold(t: &dyn farside_region::Words, n: usize, bump: u64) -> bool {
    (0..n).all(|i| {
        table::read(t, i)
            .is_some_and(|e| e.status == EntryStatus::Ok && e.conns_established == i as u64 + bump)
    })
}

#[test]
fn group_reads_fill_every_entry_with_one_read_per_period_and_a_silent_back_end_times_out() {
    use crate::responder::{group_region_ip, GroupResponder};
    let n = 64;
    let r = GroupResponder::spawn(n).unwrap();
    let t = create_table(None, n + 1, 1000).unwrap();
    let (mut watches, o) = group_watches(&r, n);
    // A grouped back-end that never answers (the responder knows no region there).
    let silent = format!("udp:{}:{}", group_region_ip(n + 1000), r.group.port());
    watches.push(Watch {
        index: n,
        name: "silent".into(),
        region: Target::parse(&silent).unwrap(),
    });
    let m = Monitor::start(watches, t.clone(), o).unwrap();
    let good = |bump: u64| entries_hold(&*t, n, bump);
    until("every entry read by the group", || good(0));
    r.publish_all(1000);
    until("every entry advanced", || good(1000));
    until("the silent back-end's reads time out", || {
        table::read(&*t, n).is_some_and(|e| e.status == EntryStatus::Error && e.errors >= 2)
    });
    // Replies to the group READs come in (a starved poller may retry some reads
    // unicast; `poller::tests` counts the datagrams of one period exactly).
    let p = &m.pollers()[0];
    until("group replies from every back-end", || {
        p.group_replies.load(Ordering::Relaxed) >= 3 * n as u64
    });
    assert!(p.group_sent.load(Ordering::Relaxed) > 0);
    assert!(r.group_reads.load(Ordering::Relaxed) > 0);
}

#[test]
fn a_group_read_answered_by_several_responder_threads_reaches_every_back_end_once() {
    use crate::responder::{GroupResponder, GROUP_THREADS_MAX};
    assert!(GroupResponder::spawn_threads(4, 0).is_err());
    assert!(GroupResponder::spawn_threads(4, GROUP_THREADS_MAX + 1).is_err());
    // 67 regions over 3 threads: unequal shares (22, 22, 23), none left out.
    let n = 67;
    let r = GroupResponder::spawn_threads(n, 3).unwrap();
    let t = create_table(None, n, 1000).unwrap();
    let (watches, o) = group_watches(&r, n);
    let m = Monitor::start(watches, t.clone(), o).unwrap();
    let good = |bump: u64| entries_hold(&*t, n, bump);
    until("every entry read by the group", || good(0));
    r.publish_all(7);
    until("every entry advanced", || good(7));
    drop(m);
    // Every group READ got one reply per region, from whichever thread owns it, and
    // every unicast retry one: nothing twice, nothing left out.
    assert!(r.group_reads.load(Ordering::Relaxed) > 0);
    until("the last READ's replies all sent", || {
        r.answered() == n as u64 * r.group_reads.load(Ordering::Relaxed) + r.unicast_reads()
    });
}
