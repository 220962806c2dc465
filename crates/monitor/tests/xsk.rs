//! AF_XDP receive of the monitor's replies (`MonitorOptions::rx = xsk:IFACE`), on real
//! sockets: each root test runs in a network namespace of its own (`xskt-PID-TAG`,
//! created and deleted by the test) and attaches to that namespace's lo, with a real
//! responder answering there. Run under the root lock:
//! `flock /tmp/farside-root.lock cargo test -p farside-monitor --test xsk`.
//! Without root the namespace tests are skipped (and say so); the fallback tests run.

use farside_monitor::responder::{GroupResponder, MultiResponder};
use farside_monitor::table::{self, EntryStatus};
use farside_monitor::xsk::{parse_udp4, XskRx, XDP_PASS, XDP_REDIRECT, XSK_FRAMES_MIN};
use farside_monitor::{create_table, Monitor, MonitorOptions, MonitorRx, PollerStats, Watch};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Skip (and say so) unless root.
fn need_root(test: &str) -> bool {
    farside_testkit::root_or_skip(test)
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

fn sh(args: &[&str]) -> String {
    let o = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A network namespace of this test, lo up; deleted when dropped.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("xskt-{}-{tag}", std::process::id());
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        sh(&["ip", "-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    /// Run `f` on a thread inside the namespace (threads it starts inherit it).
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                // SAFETY: setns on an fd we hold; changes this thread only.
                let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .expect("the namespace's thread")
        })
    }

    /// The port of the namespace's one UDP socket bound to 0.0.0.0 (the poller's: the
    /// responders and the tests' sockets bind 127.0.0.1).
    fn wildcard_udp_port(&self) -> u16 {
        let out = sh(&["ip", "netns", "exec", &self.name, "ss", "-Huan"]);
        let ports: Vec<u16> = out
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("0.0.0.0:"))
            .filter_map(|p| p.parse().ok())
            .collect();
        assert_eq!(ports.len(), 1, "one wildcard udp socket: {out}");
        ports[0]
    }

    /// Whether an XDP program is attached to the namespace's lo.
    fn xdp_on_lo(&self) -> bool {
        sh(&["ip", "-n", &self.name, "-d", "link", "show", "lo"]).contains("xdp")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// The keys of the servers this file starts itself (the responders hold their own).
fn lab_keys() -> &'static farside_rmem::LabKeyset {
    static K: std::sync::OnceLock<farside_rmem::LabKeyset> = std::sync::OnceLock::new();
    K.get_or_init(farside_rmem::LabKeyset::generate)
}

fn opts(rx: MonitorRx, group: Option<SocketAddr>) -> MonitorOptions {
    MonitorOptions {
        period: Duration::from_millis(5),
        read_timeout: Duration::from_millis(300),
        stale_after: Duration::from_secs(1),
        key: Some(lab_keys().reader),
        nice: 0,
        threads: 0,
        group,
        rx,
    }
}

fn watches(n: usize, target: impl Fn(usize) -> farside_monitor::Target) -> Vec<Watch> {
    (0..n)
        .map(|i| Watch {
            index: i,
            name: format!("b{i}"),
            region: target(i),
        })
        .collect()
}

/// Every entry read and holding region i's `conns_established = i + bump`.
fn all_read(t: &dyn farside_region::Words, n: usize, bump: u64) -> bool {
    (0..n).all(|i| {
        table::read(t, i)
            .is_some_and(|e| e.status == EntryStatus::Ok && e.conns_established == i as u64 + bump)
    })
}

fn counts(p: &PollerStats) -> (bool, u64, u64) {
    (
        p.xsk.load(Ordering::Relaxed),
        p.xsk_rx.load(Ordering::Relaxed),
        p.udp_rx.load(Ordering::Relaxed),
    )
}

/// A datagram between two other sockets on lo gets through while the program is
/// attached (it passes what is not to the poller's port).
fn other_udp_traffic_reaches_its_socket() {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    a.send_to(b"other traffic", b.local_addr().unwrap())
        .unwrap();
    let mut buf = [0u8; 64];
    let (len, from) = b.recv_from(&mut buf).expect("the datagram is passed");
    assert_eq!(
        (&buf[..len], from),
        (&b"other traffic"[..], a.local_addr().unwrap())
    );
}

#[test]
fn every_reply_comes_through_the_ring_other_traffic_passes_and_stop_detaches() {
    if !need_root("every_reply_comes_through_the_ring") {
        return;
    }
    let ns = Netns::new("ring");
    ns.run(|| {
        let n = 16;
        let r = MultiResponder::spawn(n).unwrap();
        let t = create_table(None, n, 5000).unwrap();
        let m = Monitor::start(
            watches(n, |i| r.target(i)),
            t.clone(),
            opts(MonitorRx::Xsk("lo".into()), None),
        )
        .unwrap();
        assert_eq!(m.pollers().len(), 1);
        let p = m.pollers()[0].clone();
        assert!(counts(&p).0, "the poller took the AF_XDP path");
        assert!(ns.xdp_on_lo(), "xskrx attached to lo");
        until("every entry read", || all_read(&*t, n, 0));
        r.publish_all(5);
        until("every entry advanced", || all_read(&*t, n, 5));
        other_udp_traffic_reaches_its_socket();
        let (_, ring, udp) = counts(&p);
        assert!(ring >= 2 * n as u64, "{ring} replies through the ring");
        assert_eq!(udp, 0, "no reply through the UDP socket");
        assert_eq!(p.late.load(Ordering::Relaxed), 0, "no stray");
        // Strays to the poller's port come through the ring too, and are refused and
        // counted as the UDP path does: garbage, and a well-formed reply header from
        // an address that is no back-end's.
        let port = ns.wildcard_udp_port();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        stranger.send_to(b"garbage", ("127.0.0.1", port)).unwrap();
        let mut fake = Vec::new();
        farside_rmem::wire::RepHeader {
            op: farside_rmem::wire::Op::Read as u8,
            status: farside_rmem::wire::Status::Ok,
            seq: 1,
            len: farside_monitor::MONITOR_READ_BYTES as u32,
        }
        .encode(&mut fake);
        fake.resize(fake.len() + farside_monitor::MONITOR_READ_BYTES, 0);
        stranger.send_to(&fake, ("127.0.0.1", port)).unwrap();
        until("both strays counted", || {
            p.late.load(Ordering::Relaxed) == 2
        });
        assert_eq!(counts(&p).2, 0, "strays too came through the ring");
        assert!(all_read(&*t, n, 5), "no entry changed by a stray");
        drop(m);
        assert!(!ns.xdp_on_lo(), "detached when the monitor stops");
        other_udp_traffic_reaches_its_socket();
    });
}

#[test]
fn group_replies_come_through_the_ring() {
    if !need_root("group_replies_come_through_the_ring") {
        return;
    }
    let ns = Netns::new("group");
    ns.run(|| {
        let n = 64;
        let r = GroupResponder::spawn(n).unwrap();
        let t = create_table(None, n, 5000).unwrap();
        let m = Monitor::start(
            watches(n, |i| r.target(i)),
            t.clone(),
            MonitorOptions {
                key: Some(r.key()),
                ..opts(MonitorRx::Xsk("lo".into()), Some(r.group))
            },
        )
        .unwrap();
        let p = m.pollers()[0].clone();
        until("every entry read by the group", || all_read(&*t, n, 0));
        r.publish_all(9);
        until("every entry advanced", || all_read(&*t, n, 9));
        let (xsk, ring, udp) = counts(&p);
        assert!(xsk);
        assert!(p.group_replies.load(Ordering::Relaxed) >= n as u64);
        assert!(ring >= 2 * n as u64, "{ring} replies through the ring");
        assert_eq!(udp, 0);
        drop(m);
        assert!(!ns.xdp_on_lo());
    });
}

/// Datagrams the program passes (here fragments: lo's MTU is below a reply's size)
/// reach the poller's UDP socket, which it still reads in xsk mode.
#[test]
fn fragmented_replies_are_passed_to_the_stack_and_read_from_the_udp_socket() {
    if !need_root("fragmented_replies_are_passed_to_the_stack") {
        return;
    }
    let ns = Netns::new("frag");
    // A reply is 340 bytes of IP: every READ and reply goes out in two fragments.
    sh(&["ip", "-n", &ns.name, "link", "set", "lo", "mtu", "300"]);
    ns.run(|| {
        let n = 4;
        let r = MultiResponder::spawn(n).unwrap();
        let t = create_table(None, n, 5000).unwrap();
        let m = Monitor::start(
            watches(n, |i| r.target(i)),
            t.clone(),
            opts(MonitorRx::Xsk("lo".into()), None),
        )
        .unwrap();
        let p = m.pollers()[0].clone();
        until("every entry read", || all_read(&*t, n, 0));
        r.publish_all(3);
        until("every entry advanced", || all_read(&*t, n, 3));
        let (xsk, ring, udp) = counts(&p);
        assert!(xsk, "the AF_XDP path is set up");
        assert_eq!(ring, 0, "fragments are passed, not redirected");
        assert!(udp >= 2 * n as u64, "{udp} replies through the UDP socket");
    });
}

/// An Ethernet frame (as lo builds it: zero MACs) of an IPv4 UDP datagram to `port`.
fn frame(port: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&[0x08, 0x00]);
    let ip_len = (20 + 8 + payload.len()) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&ip_len.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[127, 0, 0, 1, 127, 0, 0, 1]);
    f.extend_from_slice(&7000u16.to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// A change that makes a good frame one the program must pass.
type Change<'a> = dyn Fn(&mut Vec<u8>) + 'a;

/// The program's verdicts through BPF_PROG_TEST_RUN: only a well-formed IPv4 UDP
/// datagram to the listed port is redirected, everything else passed (never dropped).
#[test]
fn the_program_redirects_only_well_formed_datagrams_to_the_port() {
    if !need_root("the_program_redirects_only_well_formed_datagrams_to_the_port") {
        return;
    }
    let ns = Netns::new("pkt");
    ns.run(|| {
        let port = 40_123;
        let x = XskRx::open("lo", port, XSK_FRAMES_MIN).expect("AF_XDP on the namespace's lo");
        assert!(ns.xdp_on_lo());
        let good = frame(port, &[7u8; 312]);
        assert!(
            parse_udp4(&good, port).is_some(),
            "the frame is well formed"
        );
        assert_eq!(x.test_run(&good).unwrap(), XDP_REDIRECT, "ours");
        let mut padded = good.clone();
        padded.extend_from_slice(&[0; 10]);
        assert_eq!(
            x.test_run(&padded).unwrap(),
            XDP_REDIRECT,
            "Ethernet padding"
        );
        let cases: &[(&str, &Change<'_>)] = &[
            ("another port", &|f| {
                f[36..38].copy_from_slice(&(port + 1).to_be_bytes())
            }),
            ("ARP", &|f| f[12..14].copy_from_slice(&[0x08, 0x06])),
            ("IPv6 ethertype", &|f| {
                f[12..14].copy_from_slice(&[0x86, 0xdd])
            }),
            ("IP options", &|f| {
                f[14] = 0x46;
                f.splice(34..34, [1, 1, 1, 1]);
                let l = u16::from_be_bytes([f[16], f[17]]) + 4;
                f[16..18].copy_from_slice(&l.to_be_bytes());
            }),
            ("more fragments", &|f| f[20] = 0x20),
            ("a fragment's offset", &|f| f[21] = 0x01),
            ("TCP", &|f| f[23] = 6),
            ("IP length past the frame", &|f| {
                let l = u16::from_be_bytes([f[16], f[17]]) + 1;
                f[16..18].copy_from_slice(&l.to_be_bytes());
            }),
            ("UDP length inconsistent", &|f| {
                let l = u16::from_be_bytes([f[38], f[39]]) - 1;
                f[38..40].copy_from_slice(&l.to_be_bytes());
            }),
            ("truncated in the UDP header", &|f| f.truncate(40)),
            ("truncated in the IP header", &|f| f.truncate(30)),
        ];
        for (what, change) in cases {
            let mut f = good.clone();
            change(&mut f);
            assert!(parse_udp4(&f, port).is_none(), "{what}: parser");
            assert_eq!(x.test_run(&f).unwrap(), XDP_PASS, "{what}: program");
        }
        drop(x);
        assert!(!ns.xdp_on_lo(), "detached when dropped");
    });
}

#[test]
fn a_missing_interface_falls_back_to_the_udp_socket() {
    let err = XskRx::open("nosuch0", 40_000, XSK_FRAMES_MIN)
        .err()
        .expect("no such interface");
    assert!(
        err.to_string().contains("no network interface \"nosuch0\""),
        "{err}"
    );
    let n = 4;
    let r = MultiResponder::spawn(n).unwrap();
    let t = create_table(None, n, 5000).unwrap();
    let m = Monitor::start(
        watches(n, |i| r.target(i)),
        t.clone(),
        opts(MonitorRx::Xsk("nosuch0".into()), None),
    )
    .unwrap();
    until("every entry read through the UDP socket", || {
        all_read(&*t, n, 0)
    });
    let (xsk, ring, udp) = counts(&m.pollers()[0]);
    assert!(!xsk, "the UDP path is in use");
    assert_eq!(ring, 0);
    assert!(udp >= n as u64);
}

/// Drop this thread's effective capabilities (threads it starts inherit the sets):
/// what a monitor not run as root has.
fn drop_capabilities() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    /// _LINUX_CAPABILITY_VERSION_3: two Data words (64 capabilities).
    const VERSION_3: u32 = 0x2008_0522;
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget/capset with a v3 header and two data words.
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()), 0);
        d[0].effective = 0;
        d[1].effective = 0;
        assert_eq!(libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()), 0);
    }
}

#[test]
fn without_privilege_the_monitor_falls_back_to_the_udp_socket_and_says_why() {
    if !need_root("without_privilege_the_monitor_falls_back") {
        // Not root: the fallback is what runs anyway (a_missing_interface_... covers it).
        return;
    }
    let ns = Netns::new("nopriv");
    ns.run(|| {
        drop_capabilities();
        let err = XskRx::open("lo", 40_000, XSK_FRAMES_MIN)
            .err()
            .expect("refused without capabilities");
        assert!(err.to_string().contains("run as root"), "{err}");
        let n = 4;
        let r = MultiResponder::spawn(n).unwrap();
        let t = create_table(None, n, 5000).unwrap();
        let m = Monitor::start(
            watches(n, |i| r.target(i)),
            t.clone(),
            opts(MonitorRx::Xsk("lo".into()), None),
        )
        .unwrap();
        until("every entry read through the UDP socket", || {
            all_read(&*t, n, 0)
        });
        let (xsk, ring, udp) = counts(&m.pollers()[0]);
        assert!(!xsk);
        assert_eq!(ring, 0);
        assert!(udp >= n as u64);
        drop(m);
        assert!(!ns.xdp_on_lo(), "nothing attached");
    });
}

/// Region words a [`farside_region::RegionWriter`] owns while a server reads them.
struct Shared(std::sync::Arc<farside_region::HeapWords>);

impl farside_region::Words for Shared {
    fn words(&self) -> &[std::sync::atomic::AtomicU64] {
        farside_region::Words::words(&*self.0)
    }
}

#[test]
fn every_rx_queue_of_a_multi_queue_veth_gets_a_socket_and_the_replies_come_through_the_rings() {
    if !need_root("every_rx_queue_of_a_multi_queue_veth_gets_a_socket") {
        return;
    }
    const QUEUES: &str = "4";
    let (mon, back) = (Netns::new("mq-m"), Netns::new("mq-b"));
    sh(&[
        "ip",
        "-n",
        &mon.name,
        "link",
        "add",
        "xskm0",
        "numtxqueues",
        QUEUES,
        "numrxqueues",
        QUEUES,
        "type",
        "veth",
        "peer",
        "name",
        "xskb0",
        "numtxqueues",
        QUEUES,
        "numrxqueues",
        QUEUES,
        "netns",
        &back.name,
    ]);
    for (ns, dev, addr) in [
        (&mon, "xskm0", "10.77.0.1/24"),
        (&back, "xskb0", "10.77.0.2/24"),
    ] {
        sh(&["ip", "-n", &ns.name, "addr", "add", addr, "dev", dev]);
        sh(&["ip", "-n", &ns.name, "link", "set", dev, "up"]);
    }
    // Back-ends: a user-space server per region, each on its own port (their replies
    // hash to different queues).
    let n = 8;
    let servers = back.run(|| {
        (0..n)
            .map(|i| {
                let mem = std::sync::Arc::new(farside_region::HeapWords::new(
                    farside_region::REGION_WORDS,
                ));
                let mut w = farside_region::RegionWriter::init(
                    Shared(mem.clone()),
                    farside_region::Header {
                        node_id: i as u64,
                        generation: farside_region::fresh_generation(),
                        period_us: 1000,
                        watched_ports: [0; 4],
                    },
                );
                w.publish(&farside_region::LoadRecord {
                    conns_established: i as u64,
                    ..Default::default()
                });
                farside_rmem::udp::UdpServer::spawn(
                    "10.77.0.2:0".parse().unwrap(),
                    mem,
                    lab_keys().server(),
                    Default::default(),
                )
                .unwrap()
            })
            .collect::<Vec<_>>()
    });
    mon.run(|| {
        // Opened again right after a close: the kernel gives the queues back from a
        // work item, binds are retried meanwhile (1 in 10 failed before).
        for _ in 0..20 {
            let x = XskRx::open("xskm0", 40_000, XSK_FRAMES_MIN).unwrap();
            assert_eq!(x.queues(), 4, "a socket per RX queue");
        }
        let t = create_table(None, n, 5000).unwrap();
        let targets = watches(n, |i| {
            farside_monitor::Target::parse(&format!("udp:{}", servers[i].local_addr)).unwrap()
        });
        let m = Monitor::start(
            targets,
            t.clone(),
            opts(MonitorRx::Xsk("xskm0".into()), None),
        )
        .unwrap();
        until("every entry read", || all_read(&*t, n, 0));
        let (xsk, ring, udp) = counts(&m.pollers()[0]);
        assert!(xsk);
        assert!(ring >= n as u64, "{ring} replies through the rings");
        assert_eq!(udp, 0);
        drop(m);
    });
    let link = sh(&["ip", "-n", &mon.name, "-d", "link", "show", "xskm0"]);
    assert!(!link.contains("xdp"), "detached: {link}");
}
