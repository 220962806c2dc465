//! Group READs end to end (root): two back-end namespaces on a bridge, each with the
//! XDP responder attached (generic mode) to its veth end and configured as gatherd
//! configures it (`set_node_addr`, `set_group_read`), nothing listening on the port.
//! ONE READ to the multicast group from the root namespace (the monitor's side of the
//! bridge) gets two replies, one from each back-end's own address, each its own
//! region's words; a WRITE to the group gets none and changes nothing. Then the
//! monitor itself (`MonitorOptions::group`) reads both back-ends with group READs.

mod common;

use common::sh;

use common::{covered, group_mac, keyring, keys, need_root, seal};
use farside_rmem::wire::{self, Op, RepHeader, Status};
use farside_xdp::{XdpMode, XdpResponder};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const PORT: u16 = 7311;

/// A bridge in the root namespace and `n` back-end namespaces on it, removed on drop.
struct Lan {
    bridge: String,
    /// Per back-end: (namespace, its veth end, the root's veth end, address, MAC).
    backends: Vec<(String, String, String, Ipv4Addr, [u8; 6])>,
    ip_root: Ipv4Addr,
}

impl Lan {
    fn new(n: u8) -> Lan {
        let pid = std::process::id();
        let tag = pid % 10_000;
        let subnet = [10, 180, (pid % 250) as u8];
        let mut lan = Lan {
            bridge: format!("fgb{tag}"),
            backends: Vec::new(),
            ip_root: Ipv4Addr::new(subnet[0], subnet[1], subnet[2], 1),
        };
        for k in 0..n {
            lan.backends.push((
                format!("fsxdpg-{pid}-{k}"),
                format!("fgn{tag}{k}"),
                format!("fgr{tag}{k}"),
                Ipv4Addr::new(subnet[0], subnet[1], subnet[2], 2 + k),
                [0x02, 0, 0, 0x0a, subnet[2], 2 + k],
            ));
        }
        lan.setup().unwrap_or_else(|e| panic!("network setup: {e}"));
        lan
    }

    fn setup(&self) -> Result<(), String> {
        let br = &self.bridge;
        sh(&["ip", "link", "add", br, "type", "bridge"])?;
        // Flood the group to every port (no IGMP snooping state to wait for).
        sh(&[
            "ip",
            "link",
            "set",
            br,
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ])?;
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.ip_root),
            "dev",
            br,
        ])?;
        sh(&["ip", "link", "set", br, "up"])?;
        for (ns, vn, vr, ip, mac) in &self.backends {
            let mac = mac
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":");
            sh(&["ip", "netns", "add", ns])?;
            sh(&[
                "ip", "link", "add", vr, "type", "veth", "peer", "name", vn, "netns", ns,
            ])?;
            sh(&["ip", "link", "set", vr, "master", br])?;
            sh(&["ip", "link", "set", vr, "up"])?;
            sh(&["ip", "-n", ns, "link", "set", vn, "address", &mac])?;
            sh(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                vn,
            ])?;
            sh(&["ip", "-n", ns, "link", "set", vn, "up"])?;
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// Run `f` on a thread inside namespace `ns`.
    fn inside<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{ns}");
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("open netns");
            // SAFETY: setns on this (fresh, short-lived) thread only.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("namespace thread")
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for (ns, _, vr, _, _) in &self.backends {
            let _ = sh(&["ip", "link", "del", vr]);
            let _ = sh(&["ip", "netns", "del", ns]);
        }
        let _ = sh(&["ip", "link", "del", &self.bridge]);
    }
}

/// A sealed request (sender 0x5e, a new envelope seq each), READs padded.
fn request(
    op: Op,
    seq: u64,
    key: &farside_rmem::ClientKey,
    offset: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut b = seal(key, 0x5e, &covered(op as u8, 0, seq, 0, offset, 8, payload));
    b.resize(
        b.len()
            .max(wire::ENVELOPE_BYTES + wire::REP_HEADER_BYTES + 8),
        0,
    );
    b
}

/// Every reply that arrives on `s` within `wait`: (source, header, first word).
fn replies(s: &UdpSocket, wait: Duration) -> Vec<(SocketAddr, RepHeader, u64)> {
    let mut out = Vec::new();
    let end = Instant::now() + wait;
    let mut buf = [0u8; 512];
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let Ok((n, from)) = s.recv_from(&mut buf) else {
            break;
        };
        // Sealed under one of the tests' keys for sender 0x5e.
        let k = keys();
        let body = [k.ro, k.rw]
            .iter()
            .find_map(|key| farside_rmem::auth::open_reply(&buf[..n], key, 0x5e, 1..=u64::MAX).ok())
            .expect("a sealed reply")
            .to_vec();
        let h = RepHeader::decode(&body).expect("a reply");
        let w = if body.len() >= wire::REP_HEADER_BYTES + 8 {
            wire::u64_at(&body, wire::REP_HEADER_BYTES)
        } else {
            0
        };
        out.push((from, h, w));
    }
    out
}

#[test]
fn one_group_read_is_answered_by_every_back_ends_xdp_from_its_own_address() {
    if !need_root("one_group_read_is_answered_by_every_back_ends_xdp_from_its_own_address") {
        return;
    }
    let group = Ipv4Addr::new(239, 181, (std::process::id() % 250) as u8, 7);
    assert_eq!(group_mac(group.octets())[..3], [0x01, 0x00, 0x5e]);
    let lan = Lan::new(2);
    let mut responders = Vec::new();
    for (k, (ns, vn, _, ip, mac)) in lan.backends.iter().cloned().enumerate() {
        let x = Lan::inside(&ns, move || {
            let mut x = XdpResponder::load(PORT, &keyring()).unwrap_or_else(|e| panic!("{e}"));
            x.set_node_addr(Some(ip)).unwrap();
            x.set_group_read(Some(group), mac).unwrap();
            x.attach_to(&vn, XdpMode::Generic)
                .unwrap_or_else(|e| panic!("{e}"));
            x
        });
        // Word 5 says which back-end answered; word 40 (writable) starts at 0.
        x.region().words()[5].store(100 + k as u64, Ordering::Release);
        responders.push(x);
    }

    // The monitor's socket: the group's datagrams go out on the bridge.
    let s = UdpSocket::bind((lan.ip_root, 0)).unwrap();
    let ifaddr = libc::in_addr {
        s_addr: u32::from_ne_bytes(lan.ip_root.octets()),
    };
    // SAFETY: setsockopt with an in_addr value.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_IF,
            (&ifaddr as *const libc::in_addr).cast(),
            std::mem::size_of::<libc::in_addr>() as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "IP_MULTICAST_IF: {}",
        std::io::Error::last_os_error()
    );
    s.set_multicast_ttl_v4(1).unwrap();
    let to = SocketAddr::from((group, PORT));

    // The generic-mode attach may take a moment to see traffic: ask until answered.
    let mut got = Vec::new();
    for seq in 1..=20u64 {
        s.send_to(&request(Op::Read, seq, &keys().ro, 40, &[]), to)
            .unwrap();
        got = replies(&s, Duration::from_millis(300));
        got.retain(|(_, h, _)| h.seq == seq);
        if got.len() >= 2 {
            break;
        }
    }
    let mut from: Vec<(SocketAddr, u64)> = got
        .iter()
        .map(|(a, h, w)| {
            assert_eq!(h.status, Status::Ok);
            (*a, *w)
        })
        .collect();
    from.sort();
    let want: Vec<(SocketAddr, u64)> = lan
        .backends
        .iter()
        .enumerate()
        .map(|(k, b)| (SocketAddr::from((b.3, PORT)), 100 + k as u64))
        .collect();
    assert_eq!(from, want, "one reply per back-end, from its own address");

    // A WRITE to the group: no reply, nothing written.
    s.send_to(
        &request(Op::Write, 99, &keys().rw, 320, &7u64.to_le_bytes()),
        to,
    )
    .unwrap();
    assert!(replies(&s, Duration::from_millis(300)).is_empty());
    for x in &responders {
        assert_eq!(x.region().words()[40].load(Ordering::Acquire), 0);
    }

    // The monitor: one group READ per period, each back-end's entry from its reply.
    monitor_reads_by_group(&lan, &responders, group);
}

/// Region words of a responder, for a writer.
struct Shared(std::sync::Arc<dyn farside_region::Words>);

impl farside_region::Words for Shared {
    fn words(&self) -> &[std::sync::atomic::AtomicU64] {
        self.0.words()
    }
}

fn monitor_reads_by_group(lan: &Lan, responders: &[XdpResponder], group: Ipv4Addr) {
    use farside_monitor::table::{self, EntryStatus};
    use farside_monitor::{create_table, Monitor, MonitorOptions, Target, Watch};
    // A region in each back-end, back-end k publishing conns_established = 500 + k.
    let _writers: Vec<_> = responders
        .iter()
        .enumerate()
        .map(|(k, x)| {
            let mut w = farside_region::RegionWriter::init(
                Shared(x.region()),
                farside_region::Header {
                    node_id: k as u64,
                    generation: 1 + k as u64,
                    period_us: 1000,
                    watched_ports: [0; 4],
                },
            );
            w.publish(&farside_region::LoadRecord {
                conns_established: 500 + k as u64,
                ..Default::default()
            });
            w
        })
        .collect();
    // The poller's socket has no multicast interface: route the group to the bridge
    // (removed with the bridge).
    sh(&[
        "ip",
        "route",
        "add",
        &format!("{group}/32"),
        "dev",
        &lan.bridge,
    ])
    .unwrap();
    let t = create_table(None, lan.backends.len(), 1000).unwrap();
    let watches = lan
        .backends
        .iter()
        .enumerate()
        .map(|(k, b)| Watch {
            index: k,
            name: b.0.clone(),
            region: Target::parse(&format!("udp:{}:{PORT}", b.3)).unwrap(),
        })
        .collect();
    let m = Monitor::start(
        watches,
        t.clone(),
        MonitorOptions {
            period: Duration::from_millis(5),
            read_timeout: Duration::from_millis(300),
            stale_after: Duration::from_secs(1),
            key: Some(keys().ro),
            nice: 0,
            threads: 0,
            group: Some(SocketAddr::from((group, PORT))),
            rx: Default::default(),
        },
    )
    .unwrap();
    let p = &m.pollers()[0];
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let read = (0..lan.backends.len()).all(|k| {
            table::read(&*t, k).is_some_and(|e| {
                e.status == EntryStatus::Ok && e.conns_established == 500 + k as u64
            })
        });
        if read && p.group_replies.load(Ordering::Relaxed) >= 20 {
            break;
        }
        assert!(
            Instant::now() < end,
            "monitor group reads: {p:?}, entries {:?}",
            (0..lan.backends.len())
                .map(|k| table::read(&*t, k).map(|e| (e.status, e.conns_established)))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(p.unknown_source.load(Ordering::Relaxed), 0);
    assert!(p.group_sent.load(Ordering::Relaxed) > 0);
}
