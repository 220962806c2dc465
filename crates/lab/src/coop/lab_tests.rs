//! Unit tests of the coop lab's argument checks and point keys.

use super::*;

#[test]
fn keys_put_the_systems_of_one_configuration_together() {
    let a = CoopLabArgs {
        out: "x".into(),
        sweep: SweepFlags::default(),
        hosts: Hosts::Netns,
        nodes: vec![4],
        systems: vec!["rr".into(), "haproxy".into()],
        load: LoadModels::Both,
        clients_per_node: 4,
        rates: vec![1000.0],
        links: vec![10.0, 1.0],
        message_overhead_us: vec![0],
        duration_s: None,
        warmup_s: None,
        cpu_quota_pct: 40,
        disk_latency_us: 5000,
        disk_queue_max: 16,
        cache_bytes: None,
        anchor_max_size_bytes: None,
        repeat: 1,
        trace: None,
        crash_node: None,
        crash_at_s: None,
        crash_down_ms: 1000,
        directory: CoopDirectory::Datagram,
    };
    check_args(&a).unwrap();
    let k = point_keys(&a);
    assert_eq!(k.len(), 2 * 2 * 2);
    assert_eq!(
        (k[0].system.as_str(), k[1].system.as_str()),
        ("rr", "haproxy")
    );
    assert_eq!((k[0].clients, k[2].rate, k[2].clients), (16, 1000.0, 0));
    assert_eq!(k[4].link_gbit, 1.0);
    // The overhead ablation: inside the link, outside load and system.
    let mut o = a.clone();
    o.links = vec![0.0];
    o.message_overhead_us = vec![50, 0];
    check_args(&o).unwrap();
    let ko = point_keys(&o);
    assert_eq!(ko.len(), 2 * 2 * 2);
    assert_eq!(
        (ko[0].message_overhead_us, ko[3].message_overhead_us),
        (50, 50)
    );
    assert_eq!(
        (ko[4].message_overhead_us, ko[4].system.as_str()),
        (0, "rr")
    );
    o.message_overhead_us = vec![0, 1001];
    assert!(check_args(&o).is_err(), "past the bound");
    o.message_overhead_us = vec![];
    assert!(check_args(&o).is_err(), "none");
    let mut b = a.clone();
    b.systems = vec!["press-rdma".into()];
    assert!(check_args(&b).is_err());
    b.systems = vec!["press-xdp".into(), "press-shm".into(), "press-udp".into()];
    check_args(&b).unwrap();
    // Crash mode: a node every count has, a crashable system, a second either side.
    b.crash_node = Some(3);
    check_args(&b).unwrap();
    assert_eq!(crash_at_s(&b), 5, "a third of the 15 s window");
    b.crash_node = Some(4);
    assert!(check_args(&b).is_err(), "4 nodes have no node 4");
    b.crash_node = Some(0);
    b.crash_at_s = Some(15);
    assert!(check_args(&b).is_err(), "no second after the crash");
    b.crash_at_s = Some(0);
    assert!(check_args(&b).is_err(), "no second before the crash");
    b.crash_at_s = None;
    b.crash_down_ms = CRASH_DOWN_MS_MAX + 1;
    assert!(check_args(&b).is_err());
    b.crash_down_ms = 1000;
    // --directory read: press-xdp and press-shm only.
    b.directory = CoopDirectory::Read;
    assert!(check_args(&b).is_err(), "press-udp has no arena to read");
    b.systems = vec!["press-xdp".into(), "press-shm".into()];
    check_args(&b).unwrap();
    // --directory write: press-xdp only (XDP answers the WRITEs).
    b.directory = CoopDirectory::Write;
    assert!(
        check_args(&b).is_err(),
        "press-shm's arena is read-only to peers"
    );
    b.systems = vec!["press-xdp".into()];
    check_args(&b).unwrap();
    b.directory = CoopDirectory::Datagram;
    b.systems = vec!["haproxy".into()];
    assert!(
        check_args(&b).is_err(),
        "the anchor's nodes are not crashed here"
    );
    let mut c = a.clone();
    c.crash_at_s = Some(3);
    assert!(check_args(&c).is_err(), "--crash-at-s alone");
}
