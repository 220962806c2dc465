//! Sites and roles on real processes: `farside backend` serving
//! co-hosted sites, `farside gatherd`'s node agent applying the role a remote CAS on
//! ROLE_WANTED asks for (over the tcp rmem transport), and a failing apply keeping the
//! old role.

mod common;

use common::{eventually, free_addr, get_raw, metrics_raw, spawn, strings, Dir};
use farside_lab::fabric::procs::Child;
use farside_reconf::words::{W_ROLE_EPOCH, W_ROLE_ERROR, W_ROLE_SERVED, W_ROLE_WANTED};
use farside_reconf::Role;
use farside_rmem::{connect, ClientOptions, Endpoint, RemoteMemory};
use std::net::SocketAddr;
use std::time::Duration;

/// The balancer's rmem key (random) and its key file.
fn keys() -> &'static (farside_rmem::LabKeyset, std::path::PathBuf) {
    static K: std::sync::OnceLock<(farside_rmem::LabKeyset, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    K.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("farside-reconf-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let set = farside_rmem::LabKeyset::generate();
        let (_, b) = set.write_files(&dir).unwrap();
        (set, b)
    })
}

/// `ID:PATH` of the balancer key (the proxy reads the regions with it).
fn spec() -> String {
    format!("2:{}", keys().1.display())
}
const WAIT: Duration = Duration::from_secs(10);

fn word(c: &mut Box<dyn RemoteMemory>, w: usize) -> u64 {
    let mut b = [0u8; 8];
    c.read(w * 8, &mut b).unwrap();
    u64::from_le_bytes(b)
}

fn site_of(addr: SocketAddr) -> String {
    let r = get_raw(addr, "/");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    r.lines()
        .find_map(|l| l.strip_prefix("X-Farside-Site: "))
        .unwrap()
        .to_owned()
}

/// A back-end with sites `alpha`, `beta` (and no `gamma`) serving `alpha`, and a
/// gatherd whose agent drives it through `role_flags`.
struct Node {
    _backend: Child,
    _gatherd: Child,
    http: SocketAddr,
    rmem: Box<dyn RemoteMemory>,
    metrics: SocketAddr,
    /// The gatherd's rmem tcp address.
    tcp: SocketAddr,
}

fn start_node(dir: &Dir, role_flags: &[&str]) -> Node {
    for s in ["alpha", "beta"] {
        let d = dir.0.join("sites").join(s);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("index.html"), format!("{s}\n")).unwrap();
    }
    let http = free_addr();
    let control = dir.0.join("control.sock");
    let mut be = spawn(
        "backend",
        &strings(&[
            "backend",
            "--listen",
            &http.to_string(),
            "--workers",
            "2",
            "--sites-root",
            dir.0.join("sites").to_str().unwrap(),
            "--site",
            "alpha",
            "--control",
            control.to_str().unwrap(),
        ]),
        dir,
    );
    be.wait_port(http).unwrap();
    let (tcp, metrics) = (free_addr(), free_addr());
    let mut args = strings(&[
        "gatherd",
        "--no-shm",
        "--tcp-listen",
        &tcp.to_string(),
        "--rmem-key",
        &format!("balancer:2:{}", keys().1.display()),
        "--metrics-listen",
        &metrics.to_string(),
        "--role-sites",
        "alpha,beta,gamma",
        "--role-poll-ms",
        "2",
        // Each node's own state (a first start: site --role-initial, version 1).
        "--role-state",
        dir.0.join("node.state").to_str().unwrap(),
    ]);
    args.extend(
        role_flags
            .iter()
            .map(|f| f.replace("{control}", control.to_str().unwrap())),
    );
    let mut g = spawn("gatherd", &args, dir);
    g.wait_port(tcp).unwrap();
    let opts = ClientOptions {
        key: Some(keys().0.balancer),
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let rmem = connect(&Endpoint::Tcp(tcp), &opts).unwrap();
    Node {
        _backend: be,
        _gatherd: g,
        http,
        rmem,
        metrics,
        tcp,
    }
}

#[test]
fn remote_cas_on_role_wanted_switches_the_backends_site() {
    let dir = Dir::new("switch");
    let mut n = start_node(&dir, &["--role-backend-control", "{control}"]);
    let initial = Role::new(0, 1);
    assert_eq!(word(&mut n.rmem, W_ROLE_SERVED), initial.0);
    assert_eq!(word(&mut n.rmem, W_ROLE_WANTED), initial.0);
    assert_eq!(site_of(n.http), "alpha");

    // A balancer's move: CAS ROLE_WANTED from the exact value read to (beta, v + 1).
    let moved = initial.moved_to(1);
    assert_eq!(
        n.rmem
            .compare_swap(W_ROLE_WANTED * 8, initial.0, moved.0)
            .unwrap(),
        initial.0
    );
    eventually("ROLE_SERVED = the moved role", WAIT, || {
        word(&mut n.rmem, W_ROLE_SERVED) == moved.0
    });
    // Once served is published, the back-end answers with the new site's content.
    assert_eq!(site_of(n.http), "beta");
    assert!(get_raw(n.http, "/").ends_with("beta\n"));
    assert_eq!(word(&mut n.rmem, W_ROLE_EPOCH), 2);
    assert_eq!(word(&mut n.rmem, W_ROLE_ERROR), 0);
    let m = metrics_raw(n.metrics);
    assert!(m.contains("farside_gatherd_role_switches_total 1"), "{m}");
    assert!(m.contains("farside_gatherd_role_served_site 1"), "{m}");
    assert!(m.contains("farside_gatherd_role_switch_ms_count 1"), "{m}");

    // A fence (FETCH-ADD 1): same site, new version, republished without a switch.
    n.rmem.fetch_add(W_ROLE_WANTED * 8, 1).unwrap();
    eventually("fence republished", WAIT, || {
        word(&mut n.rmem, W_ROLE_SERVED) == moved.0 + 1
    });
    assert_eq!(word(&mut n.rmem, W_ROLE_EPOCH), 2);
}

#[test]
fn failing_apply_keeps_the_old_role_and_reports_it() {
    let dir = Dir::new("fail");
    let mut n = start_node(&dir, &["--role-backend-control", "{control}"]);
    let initial = Role::new(0, 1);
    // Site 2 (`gamma`) has no directory on the back-end: the switch is refused.
    let bad = initial.moved_to(2);
    n.rmem
        .compare_swap(W_ROLE_WANTED * 8, initial.0, bad.0)
        .unwrap();
    eventually("ROLE_ERROR = the failed role", WAIT, || {
        word(&mut n.rmem, W_ROLE_ERROR) == bad.0
    });
    assert_eq!(word(&mut n.rmem, W_ROLE_SERVED), initial.0, "old role kept");
    assert_eq!(site_of(n.http), "alpha", "old site still served");
    let m = metrics_raw(n.metrics);
    assert!(
        m.contains("farside_gatherd_role_apply_failures_total 1"),
        "{m}"
    );

    // Moving it on to a site that exists works and clears the error.
    let good = bad.moved_to(1);
    n.rmem
        .compare_swap(W_ROLE_WANTED * 8, bad.0, good.0)
        .unwrap();
    eventually("ROLE_SERVED = beta", WAIT, || {
        word(&mut n.rmem, W_ROLE_SERVED) == good.0
    });
    assert_eq!(word(&mut n.rmem, W_ROLE_ERROR), 0);
    assert_eq!(site_of(n.http), "beta");
}

/// The nginx path: a generated include and a command (here a shell stand-in for
/// `nginx -s reload` that fails for one site); a failure restores the old include.
#[test]
fn apply_command_writes_the_include_and_restores_it_on_failure() {
    let dir = Dir::new("cmd");
    let include = dir.0.join("site.conf");
    let sites = dir.0.join("sites");
    let cmd = "test {site} != gamma || { echo reload failed >&2; exit 3; }";
    let mut n = start_node(
        &dir,
        &[
            "--role-apply-cmd",
            cmd,
            "--role-include",
            include.to_str().unwrap(),
            "--role-sites-root",
            sites.to_str().unwrap(),
        ],
    );
    let inc = || std::fs::read_to_string(&include).unwrap();
    assert_eq!(inc(), format!("root {};\n", sites.join("alpha").display()));
    let initial = Role::new(0, 1);
    let to_beta = initial.moved_to(1);
    n.rmem
        .compare_swap(W_ROLE_WANTED * 8, initial.0, to_beta.0)
        .unwrap();
    eventually("served beta", WAIT, || {
        word(&mut n.rmem, W_ROLE_SERVED) == to_beta.0
    });
    assert_eq!(inc(), format!("root {};\n", sites.join("beta").display()));
    let to_gamma = to_beta.moved_to(2);
    n.rmem
        .compare_swap(W_ROLE_WANTED * 8, to_beta.0, to_gamma.0)
        .unwrap();
    eventually("error reported", WAIT, || {
        word(&mut n.rmem, W_ROLE_ERROR) == to_gamma.0
    });
    assert_eq!(word(&mut n.rmem, W_ROLE_SERVED), to_beta.0);
    assert_eq!(
        inc(),
        format!("root {};\n", sites.join("beta").display()),
        "include restored"
    );
}

/// `GET /` through the proxy with `Host: host`: (status, X-Farside-Backend, X-Farside-Site
/// or the proxy's reason).
fn via_proxy(proxy: SocketAddr, host: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let header = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or("")
            .to_owned()
    };
    let site = if status == 200 {
        header("X-Farside-Site: ")
    } else {
        out.split("\r\n\r\n").nth(1).unwrap_or("").trim().to_owned()
    };
    (status, header("X-Farside-Backend: "), site)
}

/// End to end: two back-ends, three sites; a remote CAS moves one
/// back-end's role; the proxy routes by the served role only.
#[test]
fn proxy_routes_each_site_only_to_backends_serving_it() {
    let (da, db, dp) = (
        Dir::new("route-a"),
        Dir::new("route-b"),
        Dir::new("route-p"),
    );
    let ctl = [
        "--role-backend-control",
        "{control}",
        "--role-drain-ms",
        "30",
    ];
    let mut a = start_node(&da, &ctl);
    let mut b_flags = ctl.to_vec();
    b_flags.extend(["--role-initial", "1"]);
    let b = start_node(&db, &b_flags);
    let (listen, admin) = (free_addr(), free_addr());
    let cfg = dp.0.join("proxy.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"listen = "{listen}"
admin_listen = "{admin}"
[balance]
policy = "round-robin"
[[backend]]
addr = "{}"
region = "tcp:{}?key={}"
[[backend]]
addr = "{}"
region = "tcp:{}?key={}"
[[sites]]
name = "alpha"
hosts = ["alpha.test"]
[[sites]]
name = "beta"
hosts = ["beta.test", "www.beta.test"]
[[sites]]
name = "gamma"
hosts = ["gamma.test"]
"#,
            a.http,
            a.tcp,
            spec(),
            b.http,
            b.tcp,
            spec()
        ),
    )
    .unwrap();
    let mut p = spawn(
        "proxy",
        &strings(&["proxy", "--config", cfg.to_str().unwrap()]),
        &dp,
    );
    p.wait_port(listen).unwrap();
    let (an, bn) = (a.http.to_string(), b.http.to_string());
    for _ in 0..6 {
        assert_eq!(
            via_proxy(listen, "alpha.test"),
            (200, an.clone(), "alpha".into())
        );
        assert_eq!(
            via_proxy(listen, "beta.test:80"),
            (200, bn.clone(), "beta".into())
        );
        let g = via_proxy(listen, "gamma.test");
        assert_eq!((g.0, g.2.as_str()), (503, "site_unserved"), "{g:?}");
    }

    // A's reload of gamma fails (no such directory): it keeps alpha, gamma stays unserved.
    let (a0, to_gamma) = (Role::new(0, 1), Role::new(0, 1).moved_to(2));
    a.rmem
        .compare_swap(W_ROLE_WANTED * 8, a0.0, to_gamma.0)
        .unwrap();
    eventually("A reports the failed role", WAIT, || {
        word(&mut a.rmem, W_ROLE_ERROR) == to_gamma.0
    });
    eventually("A serves alpha again after the failed apply", WAIT, || {
        via_proxy(listen, "alpha.test").0 == 200
    });
    for _ in 0..6 {
        assert_eq!(via_proxy(listen, "gamma.test").0, 503);
        assert_eq!(
            via_proxy(listen, "alpha.test"),
            (200, an.clone(), "alpha".into())
        );
    }

    // Move A to beta while clients keep asking for both sites: every answer comes from a
    // back-end serving the asked site (A answers beta only once its served word says so)
    // or is a 503 site_unserved for alpha once nobody serves it.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen_a_beta = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watcher = {
        let (stop, an, seen) = (stop.clone(), an.clone(), seen_a_beta.clone());
        std::thread::spawn(move || {
            let (mut a_beta, mut n) = (0, 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Two beta requests a round: with one, the round robin's parity could send
                // every beta request of the watcher to the same back-end.
                for host in ["alpha.test", "beta.test", "beta.test"] {
                    let want = &host[..host.len() - 5];
                    let (st, be, site) = via_proxy(listen, host);
                    n += 1;
                    match st {
                        200 => assert_eq!(site, want, "{host} answered by {be} serving {site}"),
                        503 => assert_eq!((host, site.as_str()), ("alpha.test", "site_unserved")),
                        _ => panic!("{host}: status {st}"),
                    }
                    if host == "beta.test" && be == an {
                        a_beta += 1;
                        seen.store(a_beta, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
            (a_beta, n)
        })
    };
    let to_beta = to_gamma.moved_to(1);
    a.rmem
        .compare_swap(W_ROLE_WANTED * 8, to_gamma.0, to_beta.0)
        .unwrap();
    eventually("A serves beta", WAIT, || {
        word(&mut a.rmem, W_ROLE_SERVED) == to_beta.0
    });
    // Round robin over both beta back-ends: A gets beta requests from now on.
    eventually("beta requests reach A", WAIT, || {
        via_proxy(listen, "beta.test").1 == an
    });
    // Until the watcher itself saw A answer beta (bounded), not a fixed window.
    eventually("the watcher's beta requests reach A", WAIT, || {
        seen_a_beta.load(std::sync::atomic::Ordering::Relaxed) > 0
    });
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (a_beta, n) = watcher.join().expect("no misrouted request");
    assert!(a_beta > 0 && n > 20, "{a_beta} of {n}");
    let al = via_proxy(listen, "alpha.test");
    assert_eq!((al.0, al.2.as_str()), (503, "site_unserved"));
    let m = metrics_raw(admin);
    assert!(
        m.contains(r#"farside_proxy_site_backends{site="beta"} 2"#),
        "{m}"
    );
    assert!(
        m.contains(r#"farside_proxy_site_backends{site="alpha"} 0"#),
        "{m}"
    );
    assert!(
        m.contains(r#"farside_proxy_site_unserved_total{site="gamma"}"#),
        "{m}"
    );
}
