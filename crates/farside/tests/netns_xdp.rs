//! Across network namespaces (root only: `#[ignore]`d with that reason; CI runs it as
//! root through `scripts/test.sh`, which passes `--include-ignored`): a back-end node's gatherd answers
//! one-sided reads with its XDP responder, and a proxy's monitor in another node follows
//! the load record over udp, then sees it go stale when the gatherd dies.

use farside_lab::fabric::netns::{is_root, NodeSpec, VirtualDc};
use farside_lab::fabric::procs::Child;
use farside_proxy::config::{BackendConfig, ProxyConfig};
use farside_proxy::control::{Control, Load};
use farside_proxy::gate::Reject;
use std::time::{Duration, Instant};

mod common;
use common::exe;

#[test]
#[ignore = "needs root: run with `cargo test -p farside -- --include-ignored` as root"]
fn monitor_follows_a_gatherer_over_xdp_across_namespaces() {
    assert!(
        is_root(),
        "needs root: run as root (`cargo test -p farside -- --include-ignored`)"
    );
    let run_id = format!("t{}", std::process::id() % 100_000);
    let dc = VirtualDc::create(&run_id, &[NodeSpec::new("back"), NodeSpec::new("front")]).unwrap();
    let ip = dc.node_ip("back");
    let logs = std::env::temp_dir().join(format!("farside-netns-xdp-{run_id}"));
    std::fs::create_dir_all(&logs).unwrap();
    let (reader, _) = farside_rmem::LabKeyset::generate()
        .write_files(&logs)
        .unwrap();
    let args: Vec<String> = ["gatherd", "--no-shm", "--udp-listen", &format!("{ip}:7002")]
        .iter()
        .map(|s| s.to_string())
        .chain([
            "--xdp-iface".into(),
            dc.veth_in_ns("back"),
            "--xdp-mode".into(),
            "generic".into(),
            "--rmem-key".into(),
            format!("reader:1:{}", reader.display()),
        ])
        .collect();
    let log = logs.join("gatherd.log");
    let c = dc.spawn_in("back", exe(), &args, &log).unwrap();
    let mut g = Child::adopt("gatherd", c, log.clone());

    let mut cfg = ProxyConfig::simple(
        "127.0.0.1:1".parse().unwrap(),
        vec![BackendConfig {
            addr: format!("{ip}:80").parse().unwrap(),
            site: String::new(),
            region: Some(format!("udp:{ip}:7002?key=1:{}", reader.display())),
            limit: None,
            maxconn: None,
        }],
    );
    cfg.admission.enabled = true;
    cfg.admission.stale_after_ms = 50;
    // What this test checks is the view going stale when the gatherer dies; `reject`
    // makes that visible as StaleLoad (the default `local` keeps admitting up to the
    // last safe level, tested in admission_defaults.rs).
    cfg.admission.on_stale = farside_proxy::config::StalePolicy::Reject;
    cfg.monitor.period_us = 500;
    // Monitor threads inherit the namespace of the thread that starts them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let ctl = loop {
        let c = dc.run_in_ns("front", || Control::new(&cfg)).unwrap();
        if matches!(c.load(0, farside_rmem::mono_ns()), Load::Known(_)) {
            break c;
        }
        g.check_alive().unwrap();
        assert!(
            Instant::now() < deadline,
            "monitor never read the region over udp"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(ctl.decide_accept(), Ok(()));
    // The region is readable the moment the program is attached, which can be just
    // before gatherd logs it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains("XDP responder on eth0 (generic mode)") {
            break;
        }
        assert!(
            Instant::now() < deadline && !text.contains("from user space"),
            "gatherd attached XDP:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // The gatherd dies: XDP detaches and the record stops advancing; fail safe.
    g.stop();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ctl.decide_accept() != Err(Reject::StaleLoad) {
        assert!(Instant::now() < deadline, "dead gatherer never went stale");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(ctl);
    drop(dc);
    let _ = std::fs::remove_dir_all(logs);
}
