//! Sites and roles on real processes (issue 11 items 1, 2): `farside backend` serving
//! co-hosted sites, `farside gatherd`'s node agent applying the role a remote CAS on
//! ROLE_WANTED asks for (over the tcp rmem transport), and a failing apply keeping the
//! old role.

mod common;

use common::{eventually, free_addr, get_raw, metrics_raw, spawn, strings, Dir};
use farside_lab::procs::Child;
use farside_reconf::words::{W_ROLE_EPOCH, W_ROLE_ERROR, W_ROLE_SERVED, W_ROLE_WANTED};
use farside_reconf::Role;
use farside_rmem::{connect, ClientOptions, Endpoint, RemoteMemory};
use std::net::SocketAddr;
use std::time::Duration;

const RW_KEY: u64 = 0x5eed_0011;
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
        "--rw-key",
        &format!("{RW_KEY:x}"),
        "--metrics-listen",
        &metrics.to_string(),
        "--role-sites",
        "alpha,beta,gamma",
        "--role-poll-ms",
        "2",
    ]);
    args.extend(
        role_flags
            .iter()
            .map(|f| f.replace("{control}", control.to_str().unwrap())),
    );
    let mut g = spawn("gatherd", &args, dir);
    g.wait_port(tcp).unwrap();
    let opts = ClientOptions {
        key: RW_KEY,
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
