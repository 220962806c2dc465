//! The proxy's reconfiguration driver over real rmem tcp regions: an overloaded site
//! gets a node from a site that can spare one, and the peer balancer's counter is bumped.

use farside_proxy::config::{BackendConfig, ProxyConfig, ReconfConfig, SiteConfig};
use farside_proxy::reconf::ReconfDriver;
use farside_reconf::words::{W_ROLE_SERVED, W_ROLE_WANTED, W_SHARED_COUNTER};
use farside_reconf::Role;
use farside_region::{HeapWords, Words};
use farside_rmem::{LabKeyset, OpCounters, TcpServer};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The balancers' keys (random) and the balancer key's file, `ID:PATH`.
fn keys() -> &'static (LabKeyset, String) {
    static K: std::sync::OnceLock<(LabKeyset, String)> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let set = LabKeyset::generate();
        let dir =
            std::env::temp_dir().join(format!("farside-reconf-driver-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (_, b) = set.write_files(&dir).unwrap();
        let spec = format!("{}:{}", LabKeyset::BALANCER_ID, b.display());
        (set, spec)
    })
}

fn region() -> (Arc<HeapWords>, TcpServer) {
    let mem = Arc::new(HeapWords::new(farside_region::REGION_WORDS));
    let srv = TcpServer::spawn(
        "127.0.0.1:0".parse().unwrap(),
        mem.clone(),
        keys().0.server(),
        Arc::new(OpCounters::default()),
    )
    .unwrap();
    (mem, srv)
}

#[test]
fn driver_moves_a_node_to_the_overloaded_site() {
    // Site a: nodes 0 (anchor), 2; site b: nodes 1 (anchor), 3, overloaded.
    let nodes: Vec<_> = (0..4).map(|_| region()).collect();
    for (n, site, load) in [
        (0, 0, 100_000),
        (1, 1, 950_000),
        (2, 0, 100_000),
        (3, 1, 950_000),
    ] {
        let w = nodes[n].0.words();
        let r = Role::new(site, 1).0;
        w[W_ROLE_WANTED].store(r, Ordering::Relaxed);
        w[W_ROLE_SERVED].store(r, Ordering::Relaxed);
        w[farside_region::layout::W_CPU_UTIL_PPM].store(load, Ordering::Relaxed);
    }
    let peer = region();
    let backends = nodes
        .iter()
        .enumerate()
        .map(|(i, (_, s))| BackendConfig {
            addr: format!("127.0.0.1:{}", 9000 + i).parse().unwrap(),
            site: String::new(),
            region: Some(format!("tcp:{}", s.local_addr)),
            limit: None,
            maxconn: None,
        })
        .collect();
    let mut cfg = ProxyConfig::simple("127.0.0.1:0".parse().unwrap(), backends);
    cfg.sites = vec![
        SiteConfig {
            name: "a".into(),
            hosts: vec!["a.test".into()],
            id: None,
            anchor: Some(0),
        },
        SiteConfig {
            name: "b".into(),
            hosts: vec!["b.test".into()],
            id: None,
            anchor: Some(1),
        },
    ];
    cfg.reconf = ReconfConfig {
        enabled: true,
        balancer_id: 0,
        balancers: vec![
            "tcp:127.0.0.1:1".into(),
            format!("tcp:{}", peer.1.local_addr),
        ],
        region_listen: Some("127.0.0.1:0".parse().unwrap()),
        key: keys().1.clone(),
        sensitivity_ms: 20,
        history_ms: 0,
        ..ReconfConfig::default()
    };
    cfg.validate().unwrap();
    let d = ReconfDriver::start(&cfg).unwrap().expect("enabled");
    let deadline = Instant::now() + Duration::from_secs(10);
    let moved = Role::new(1, 2).0;
    while nodes[2].0.words()[W_ROLE_WANTED].load(Ordering::Relaxed) != moved {
        assert!(Instant::now() < deadline, "node 2 never moved");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Anchors and the overloaded site's own node stay.
    assert_eq!(
        nodes[0].0.words()[W_ROLE_WANTED].load(Ordering::Relaxed),
        Role::new(0, 1).0
    );
    assert_eq!(
        nodes[3].0.words()[W_ROLE_WANTED].load(Ordering::Relaxed),
        Role::new(1, 1).0
    );
    while peer.0.words()[W_SHARED_COUNTER].load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "peer counter never bumped");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Stats reach the metrics once the round has been published.
    let text = loop {
        let s = d.stats();
        let text = farside_admin::scrape_text(&move |enc: &mut farside_admin::Encoder| {
            farside_proxy::reconf::render(&s, enc)
        });
        if text.contains("farside_reconf_moves_total 1") {
            break text;
        }
        assert!(Instant::now() < deadline, "{text}");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        text.contains("farside_reconf_lock_acquired_total 1"),
        "{text}"
    );
}

#[test]
fn reconf_config_errors_name_the_key() {
    let mut cfg = ProxyConfig::from_toml_str(
        r#"listen = "127.0.0.1:0"
[[backend]]
addr = "127.0.0.1:9000"
region = "tcp:127.0.0.1:7001"
[[sites]]
name = "a"
hosts = ["a.test"]
[reconf]
enabled = true
key = "2:/etc/farside/rmem-2.key"
balancers = ["tcp:127.0.0.1:7100"]
region_listen = "127.0.0.1:0"
"#,
    )
    .unwrap_err();
    assert_eq!(cfg.key, "sites[0].anchor", "{cfg}");
    cfg = ProxyConfig::from_toml_str(
        r#"listen = "127.0.0.1:0"
[[backend]]
addr = "127.0.0.1:9000"
region = "tcp:127.0.0.1:7001"
[[sites]]
name = "a"
hosts = ["a.test"]
anchor = 0
[reconf]
enabled = true
key = "zz"
"#,
    )
    .unwrap_err();
    assert_eq!(cfg.key, "reconf.key", "{cfg}");
}
