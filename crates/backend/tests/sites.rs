//! Co-hosted sites: one site served at a time, switched over the control socket.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use farside_backend::{spawn, BackendArgs};
use farside_reconf::sites::{query_site, request_site};

const T: Duration = Duration::from_secs(5);

/// GET `path` on a fresh connection; returns (status, X-Farside-Site, body).
fn get(addr: SocketAddr, path: &str) -> (u16, Option<String>, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    let site = head
        .lines()
        .find_map(|l| l.strip_prefix("X-Farside-Site: "))
        .map(str::to_owned);
    (status, site, body.to_owned())
}

fn sites_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("farside-sites-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for site in ["alpha", "beta"] {
        std::fs::create_dir_all(dir.join(site)).unwrap();
        std::fs::write(dir.join(site).join("index.html"), format!("site {site}\n")).unwrap();
    }
    dir
}

#[test]
fn switches_site_at_run_time_over_the_control_socket() {
    let dir = sites_dir("switch");
    let control = dir.join("control.sock");
    let args = BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        sites_root: Some(dir.clone()),
        site: Some("alpha".into()),
        control: Some(control.clone()),
        workers: 2,
        ..BackendArgs::default()
    };
    let (addr, handle) = spawn(args).unwrap();
    assert_eq!(
        get(addr, "/"),
        (200, Some("alpha".into()), "site alpha\n".into())
    );
    assert_eq!(query_site(&control, T).unwrap(), "alpha");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&control).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "only this user may switch sites");
    }

    request_site(&control, "beta", T).unwrap();
    // Every request routed after the reply is served from the new site.
    assert_eq!(
        get(addr, "/"),
        (200, Some("beta".into()), "site beta\n".into())
    );
    assert_eq!(handle.site().as_deref(), Some("beta"));

    // Bad input: refused with a clear error, the old site stays.
    for bad in ["gamma", "..", "a/b", "control.sock", &"x".repeat(200)] {
        let err = request_site(&control, bad, T).unwrap_err();
        assert!(err.contains("err"), "{bad}: {err}");
    }
    assert_eq!(get(addr, "/").1.as_deref(), Some("beta"));
    // One site's files only: no path reaches the other site's directory.
    assert_eq!(get(addr, "/../alpha/index.html").0, 400);

    handle.stop();
    assert!(!control.exists(), "the socket file is removed on stop");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_sites_configuration_is_refused() {
    let dir = sites_dir("bad");
    let base = BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        sites_root: Some(dir.clone()),
        workers: 1,
        ..BackendArgs::default()
    };
    let no_site = spawn(base.clone()).err().unwrap().to_string();
    assert!(no_site.contains("--site"), "{no_site}");
    let unknown = spawn(BackendArgs {
        site: Some("gamma".into()),
        ..base.clone()
    })
    .err()
    .unwrap()
    .to_string();
    assert!(unknown.contains("gamma"), "{unknown}");
    let both = spawn(BackendArgs {
        site: Some("alpha".into()),
        root: Some(dir.clone()),
        ..base
    })
    .err()
    .unwrap()
    .to_string();
    assert!(both.contains("--root"), "{both}");
    std::fs::remove_dir_all(&dir).unwrap();
}
