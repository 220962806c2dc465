//! `farside frontend` as a user runs it: clear errors for bad flags (no root), and
//! (root) attach to a veth in a fresh network namespace, answer the
//! control port, print the counters and exit 0 at SIGTERM, leaving nothing to detach.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use farside_frontend::control::Client;

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_farside")
}

/// Run `farside frontend ARGS`; (success, stderr).
fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(exe())
        .arg("frontend")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_are_refused_with_a_clear_message() {
    let b = "02:00:00:00:00:0b@10.0.0.11=75";
    for (args, says) in [
        (
            vec!["--iface", "lo", "--vip", "10.0.0.100:80"],
            "at least one --backend",
        ),
        (
            vec![
                "--iface",
                "lo",
                "--vip",
                "10.0.0.100:80",
                "--backend",
                "10.0.0.11=75",
            ],
            "MAC@IP=WEIGHT",
        ),
        (
            vec!["--iface", "lo", "--vip", "10.0.0.100:0", "--backend", b],
            "port 0",
        ),
        (
            vec![
                "--iface",
                "lo",
                "--vip",
                "10.0.0.100:80",
                "--backend",
                b,
                "--backend",
                b,
            ],
            "twice",
        ),
        (
            vec![
                "--iface",
                "lo",
                "--vip",
                "10.0.0.100:80",
                "--backend",
                "02:00:00:00:00:0b@10.0.0.11=0",
            ],
            "every weight is 0",
        ),
        (vec!["--vip", "10.0.0.100:80", "--backend", b], "--iface"),
        (
            vec![
                "--iface",
                "lo",
                "--vip",
                "10.0.0.100:80",
                "--backend",
                b,
                "--control",
                "127.0.0.1:7400",
            ],
            "needs the front-end's key",
        ),
        (
            vec![
                "--iface",
                "no-such-if0",
                "--vip",
                "10.0.0.100:80",
                "--backend",
                b,
            ],
            "no network interface",
        ),
    ] {
        let (ok, err) = run(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn sh(args: &[&str]) {
    let st = Command::new(args[0]).args(&args[1..]).status().unwrap();
    assert!(st.success(), "{args:?}");
}

#[test]
#[ignore = "needs root (netns, BPF): cargo test -p farside --test frontend_cli -- --include-ignored"]
fn runs_serves_control_and_reports_at_sigterm() {
    assert!(farside_frontend::is_root(), "needs root");
    let ns = Ns(format!("fecli{}", std::process::id() % 100_000));
    sh(&["ip", "netns", "add", &ns.0]);
    // A veth pair (no dummy module on every kernel); the front-end on one end.
    sh(&[
        "ip", "-n", &ns.0, "link", "add", "d0", "type", "veth", "peer", "name", "d1",
    ]);
    sh(&["ip", "-n", &ns.0, "link", "set", "d0", "up"]);
    sh(&["ip", "-n", &ns.0, "link", "set", "lo", "up"]);
    // The TCP control port's key, in a 0600 file.
    let key_dir = std::env::temp_dir().join(format!("fecli-key-{}", std::process::id()));
    std::fs::create_dir_all(&key_dir).unwrap();
    let key_path = key_dir.join("frontend.key");
    let key = farside_frontend::table::random_hash_key().unwrap();
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let text: String = key.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&key_path)
            .unwrap();
        writeln!(f, "{text}").unwrap();
    }
    // The key as the front-end reads it (`--key-id` 1 is the default).
    let loaded = farside_auth::keys::load_key(
        "frontend-move",
        Some(&key_path),
        farside_auth::keys::Policy::Production,
    )
    .unwrap();
    assert_eq!(loaded.key.halves(), key.halves());
    let key = farside_frontend::fmove::MoveKey {
        id: farside_auth::mac::KeyId(1),
        key: loaded.key,
    };
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.0, exe(), "frontend", "--iface", "d0"])
        .args(["--vip", "10.9.0.100:80", "--control", "127.0.0.1:0"])
        .arg("--key-file")
        .arg(&key_path)
        .args(["--backend", "02:00:00:00:00:0b@10.9.0.11=67"])
        .args(["--backend", "02:00:00:00:00:0c@10.9.0.12=33"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The control address is in the start-up log line.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let t0 = Instant::now();
    let control: SocketAddr = loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "exited early");
        if let Some(a) = line.split("control on ").nth(1) {
            break a.trim().parse().unwrap();
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no start-up line");
    };
    // The control port lives on the namespace's loopback: talk from a thread in it.
    let nsname = ns.0.clone();
    let stats = std::thread::spawn(move || {
        let f = std::fs::File::open(format!("/run/netns/{nsname}")).unwrap();
        // SAFETY: setns on an open netns fd; this thread only.
        assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
        // Without the key the port refuses; with it, it serves.
        let e = Client::connect(control).unwrap().stats().unwrap_err();
        assert!(e.to_string().contains("not an AUTH line"), "{e}");
        let mut c = Client::connect(control).unwrap().with_key(key);
        let client = SocketAddrV4::new(Ipv4Addr::new(10, 9, 9, 1), 40_000);
        assert_eq!(c.flow(client).unwrap(), None);
        c.move_flow(client, Ipv4Addr::new(10, 9, 0, 12)).unwrap();
        assert_eq!(
            c.flow(client).unwrap(),
            Some((Ipv4Addr::new(10, 9, 0, 12), false))
        );
        c.hold(client).unwrap();
        assert_eq!(
            c.flow(client).unwrap(),
            Some((Ipv4Addr::new(10, 9, 0, 12), true))
        );
        c.release(client).unwrap();
        let e = c
            .move_flow(client, Ipv4Addr::new(10, 9, 0, 99))
            .unwrap_err();
        assert!(e.to_string().contains("no back-end 10.9.0.99"), "{e}");
        c.set_weights(&[
            (Ipv4Addr::new(10, 9, 0, 11), 75),
            (Ipv4Addr::new(10, 9, 0, 12), 25),
        ])
        .unwrap();
        let e = c.request("JUMP").unwrap_err();
        assert!(e.to_string().contains("unknown request"), "{e}");
        let e = c.request("MOVE 1.2.3.4:5").unwrap_err();
        assert!(e.to_string().contains("takes 2 argument"), "{e}");
        c.stats().unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(stats.flows, 1);
    assert_eq!(stats.backends[0].weight, 75);
    // SAFETY: signalling our own child (`ip netns exec` execs farside in place).
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&key_dir);
    assert!(out.status.success(), "exit {:?}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("backend 10.9.0.11 (02:00:00:00:00:0b) weight 75"),
        "{stdout}"
    );
    assert!(stdout.contains("flows 1"), "{stdout}");
    // Nothing left attached: --detach finds nothing.
    let o = Command::new("ip")
        .args(["netns", "exec", &ns.0, exe(), "frontend", "--detach", "d0"])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("nothing to detach"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}
