//! The `migrate_many` bench's code on a few connections (root: netns, TCP_REPAIR):
//! `flock /tmp/farside-root.lock cargo test -p farside-migrate -- --include-ignored`.

use std::time::Duration;

use farside_migrate::testkit::{is_root, many};

/// Connections: enough for every size pair (16) three times over, fast (< 10 s).
const CONNECTIONS: usize = 50;

#[test]
#[ignore = "needs root (netns, TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root under flock /tmp/farside-root.lock"]
fn fifty_connections_migrate_between_namespaces_with_every_byte_once() {
    assert!(is_root(), "needs root");
    let mut cfg = many::ManyConfig::new(CONNECTIONS);
    cfg.concurrency = 8;
    cfg.conn_timeout = Duration::from_secs(20);
    cfg.deadline = Duration::from_secs(60);
    cfg.progress_every = 0;
    cfg.tag = format!("mt{}", std::process::id() % 100_000);
    let r = many::run(cfg.clone()).expect("bench run");
    eprintln!("{}", r.to_json(&cfg));
    assert_eq!(r.attempted, CONNECTIONS as u64);
    assert_eq!(r.migrated, CONNECTIONS as u64, "errors: {:?}", r.errors);
    assert_eq!((r.lost, r.failed), (0, 0), "errors: {:?}", r.errors);
    assert_eq!(r.bytes_lost + r.bytes_bad, 0);
    let expected: usize = (0..CONNECTIONS)
        .map(|id| many::sizes(id).0 + many::sizes(id).1)
        .sum();
    assert_eq!(r.bytes_checked, expected as u64);
    assert_eq!(r.flow_rules_left, 0);
    assert_eq!(r.latency_us.len(), CONNECTIONS);
    assert_eq!(r.target_cpu_us.len(), CONNECTIONS);
}
