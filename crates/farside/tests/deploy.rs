//! The shipped deployment files (`deploy/`): the example configurations pass
//! `farside proxy --check-config` and `farside gatherd --check`, the checks report every
//! error with exit status 2 and bind nothing, the unit files verify, and (root only:
//! `#[ignore]`d with that reason; `scripts/test.sh` passes `--include-ignored` as root)
//! `deploy/walkthrough.sh` runs the units' Exec lines end to end in network namespaces.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{exe, Dir};

/// The repository's `deploy/` directory.
fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn farside(args: &[&str]) -> Output {
    Command::new(exe()).args(args).output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `GATHERD_FLAGS` of a shipped env file, split as systemd splits an unquoted `$VAR`.
fn gatherd_flags(env_file: &Path) -> Vec<String> {
    let s = std::fs::read_to_string(env_file).unwrap();
    let v = s
        .lines()
        .find_map(|l| l.strip_prefix("GATHERD_FLAGS="))
        .unwrap_or_else(|| panic!("{}: no GATHERD_FLAGS", env_file.display()));
    v.trim_matches('"')
        .split_whitespace()
        .map(String::from)
        .collect()
}

#[test]
fn shipped_proxy_config_checks_ok_with_its_summary() {
    let f = deploy_dir().join("proxy.toml");
    let o = farside(&["proxy", "--check-config", f.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    for want in [
        "OK: listen 0.0.0.0:80, admin 127.0.0.1:9100, 2 back-end(s)",
        "[10.0.0.11:80 via udp:10.0.0.11:7000?key=(set)]",
        "[10.0.0.12:80 via udp:10.0.0.12:7000?key=(set)]",
        "admission on: metric delay, limit 10000 by the metric's default rule, target delay 250 ms \
         (half the queue timeout)",
    ] {
        assert!(out.contains(want), "`{want}` not in: {out}");
    }
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    assert!(
        !out.contains("5ec7e7a11d00d1e5"),
        "keys are not printed: {out}"
    );
}

#[test]
fn check_config_lists_every_error_and_exits_2() {
    let dir = Dir::new("check-bad");
    let f = dir.0.join("bad.toml");
    std::fs::write(
        &f,
        "listen = \"127.0.0.1:8000\"\nworkers = 0\n[http]\nheader_timeout_ms = 0\n\
         [[backend]]\naddr = \"10.0.0.11:80\"\nregion = \"ftp:10.0.0.11:7000\"\n",
    )
    .unwrap();
    let o = farside(&["proxy", "--check-config", f.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(out.is_empty(), "{out}");
    for key in [
        "`workers`",
        "`http.header_timeout_ms`",
        "`backend[0].region`",
    ] {
        assert!(err.contains(key), "{key} not in: {err}");
    }
    assert!(err.contains("3 error(s)"), "{err}");

    // A file that does not parse is one error, named with the file.
    std::fs::write(&f, "listen = 3\n").unwrap();
    let o = farside(&["proxy", "--check-config", f.to_str().unwrap()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("bad.toml"), "{err}");
}

#[test]
fn check_config_merges_the_flags_as_the_proxy_does_and_binds_nothing() {
    // The listen address is taken: a proxy would fail to bind it, the check does not try.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap();
    let dir = Dir::new("check-flags");
    let f = dir.0.join("conns.toml");
    std::fs::write(
        &f,
        format!(
            "listen = \"{addr}\"\n[admission]\nenabled = true\nmetric = \"conns\"\n\
             [[backend]]\naddr = \"10.0.0.11:80\"\nregion = \"udp:10.0.0.11:7000\"\n"
        ),
    )
    .unwrap();
    let path = f.to_str().unwrap();
    // Metric `conns` has no default limit: the file alone is refused...
    let o = farside(&["proxy", "--check-config", path]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("`admission.limit`"), "{err}");
    // ...and a flag beside it repairs it, as it would for `--config` (flags over the file,
    // then one validation).
    let o = farside(&["proxy", "--check-config", path, "--limit", "18"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("metric conns, limit 18,"), "{out}");
    assert!(out.contains(&format!("listen {addr}")), "{out}");
    // --check-config names the file; --config beside it is a usage error.
    let o = farside(&["proxy", "--check-config", path, "--config", path]);
    assert_eq!(o.status.code(), Some(2));
    drop(held);
}

#[test]
fn shipped_gatherd_flags_check_ok_and_bad_flags_exit_2() {
    let mut envs: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "env"))
        .collect();
    envs.sort();
    assert_eq!(envs.len(), 2, "one env file per back-end: {envs:?}");
    for env in &envs {
        // The hosts' NIC is eth0; this machine's may be named otherwise: check with lo.
        let flags: Vec<String> = gatherd_flags(env)
            .into_iter()
            .map(|a| if a == "eth0" { "lo".into() } else { a })
            .collect();
        let mut args = vec!["gatherd"];
        args.extend(flags.iter().map(String::as_str));
        args.push("--check");
        let o = farside(&args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{}: {out}{err}", env.display());
        assert!(out.contains("answered by XDP on lo (auto mode)"), "{out}");
        assert!(out.contains("watching port(s) [80]"), "{out}");
    }
    let o = farside(&[
        "gatherd",
        "--xdp-iface",
        "no-such-if0",
        "--period-us",
        "5",
        "--check",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for want in [
        "--period-us",
        "needs --udp-listen",
        "no-such-if0: no such interface",
        "3 error(s)",
    ] {
        assert!(err.contains(want), "`{want}` not in: {err}");
    }
}

#[test]
fn unit_files_verify_and_run_the_checks_first() {
    let units = ["farside-gatherd.service", "farside-proxy.service"];
    for u in units {
        let s = std::fs::read_to_string(deploy_dir().join(u)).unwrap();
        for want in [
            "DynamicUser=yes",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "Restart=on-failure",
            "KillSignal=SIGTERM",
        ] {
            assert!(s.contains(want), "{u}: no {want}");
        }
        let pre = s
            .lines()
            .find_map(|l| l.strip_prefix("ExecStartPre="))
            .unwrap_or_else(|| panic!("{u}: no ExecStartPre"));
        assert!(pre.contains("--check"), "{u}: {pre}");
    }
    let Ok(v) = Command::new("systemd-analyze").arg("--version").output() else {
        farside_testkit::skip(
            "the units' `systemd-analyze verify`",
            "systemd-analyze is not installed (apt-get install systemd)",
        );
        return;
    };
    assert!(v.status.success());
    // verify checks that the Exec binaries exist: point them at the binary under test.
    let dir = Dir::new("units");
    let mut paths = Vec::new();
    for u in units {
        let s = std::fs::read_to_string(deploy_dir().join(u)).unwrap();
        let p = dir.0.join(u);
        std::fs::write(
            &p,
            s.replace("/usr/local/bin/farside", exe().to_str().unwrap()),
        )
        .unwrap();
        paths.push(p);
    }
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success() && err.trim().is_empty(), "{out}{err}");
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside -- --include-ignored` as root"]
fn walkthrough_runs_the_units_commands_across_namespaces() {
    assert!(
        farside_lab::fabric::netns::is_root(),
        "needs root: run as root (`cargo test -p farside -- --include-ignored`)"
    );
    if let Err(e) = farside_lab::nginx::find_binary() {
        farside_testkit::skip(
            "walkthrough_runs_the_units_commands_across_namespaces",
            &e.to_string(),
        );
        return;
    }
    let o = Command::new("bash")
        .arg(deploy_dir().join("walkthrough.sh"))
        .arg(exe())
        .output()
        .unwrap();
    let (out, err) = text(&o);
    println!("{out}");
    assert!(o.status.success(), "walkthrough failed:\n{out}\n{err}");
    for want in [
        "requests answered 200 through the proxy",
        "checks decided below_limit on fresh load",
        "SIGHUP applied",
        "exited 0",
        "walkthrough: OK",
    ] {
        assert!(out.contains(want), "`{want}` not in:\n{out}");
    }
}
