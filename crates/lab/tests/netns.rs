//! `--hosts netns` virtual data-center. The tests that build namespaces need root: they
//! are `#[ignore]`d with that reason, so a plain `cargo test` lists them as ignored (never
//! as passed), and run as root with `cargo test -p farside-lab -- --include-ignored`
//! (`scripts/test.sh` does that when root, as in CI).
//! The tests run one at a time: `clean_all` removes every run's namespaces.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use farside_lab::fabric::netns::{self, NodeSpec, VirtualDc};

static SERIAL: Mutex<()> = Mutex::new(());

/// Fails loudly when a root test was asked to run without root (`--include-ignored`).
fn require_root() {
    assert!(
        netns::is_root(),
        "needs root: run as root (`cargo test -p farside-lab -- --include-ignored`)"
    );
}

fn run_id(tag: &str) -> String {
    format!("t{}{tag}", std::process::id())
}

fn netns_exists(name: &str) -> bool {
    netns::list_netns().unwrap().iter().any(|n| n == name)
}

fn pid_alive(pid: u32) -> bool {
    // A zombie still has /proc/PID; check its state.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let rest = &s[s.rfind(')').unwrap() + 1..];
            rest.split_whitespace().next() != Some("Z")
        })
        .unwrap_or(false)
}

fn wait_dead(pid: u32) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        if !pid_alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn log_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "farside-netns-test-{}-{tag}.log",
        std::process::id()
    ))
}

/// Everything a run made is gone.
fn assert_gone(dc_run: &str, nodes: &[&str], cgroup_dirs: &[PathBuf]) {
    assert!(!netns_exists(&netns::bridge_netns_name(dc_run)));
    for n in nodes {
        let ns = netns::netns_name(dc_run, n);
        assert!(!netns_exists(&ns), "{ns} still exists");
        assert!(!Path::new(netns::NETNS_DIR).join(&ns).exists());
    }
    for d in cgroup_dirs {
        assert!(!d.exists(), "{} still exists", d.display());
        assert!(
            !d.parent().unwrap().exists(),
            "{} still exists",
            d.display()
        );
    }
    assert!(!Path::new(netns::STATE_DIR)
        .join(format!("{dc_run}.json"))
        .exists());
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside-lab -- --include-ignored` as root"]
fn two_nodes_tcp_cgroups_rps_load_and_drop() {
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ehash_before =
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_child_ehash_entries").unwrap_or_default();
    let run = run_id("a");
    // The back-end gets the last CPU (CPU 1 on the 2-CPU machines), the client CPU 0.
    let last = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let be_cpus = last.to_string();
    let be_mask = format!("{:x}", 1u64 << last);
    let t0 = Instant::now();
    let dc = VirtualDc::create(
        &run,
        &[
            NodeSpec::new("cl").cpus("0").rps_cpus("1"),
            NodeSpec::new("be")
                .cpus(&be_cpus)
                .cpu_quota_pct(50)
                .rps_cpus(&be_mask),
        ],
    )
    .unwrap();
    println!("create (2 nodes): {:?}", t0.elapsed());
    assert_eq!(dc.node_ip("cl"), Ipv4Addr::new(10, 77, 0, 10));
    assert_eq!(dc.node_ip("be"), Ipv4Addr::new(10, 77, 0, 11));
    assert_eq!(dc.veth_in_ns("be"), "eth0");
    assert!(dc.netns_path("be").exists());
    assert!(Path::new(netns::STATE_DIR)
        .join(format!("{run}.json"))
        .exists());

    // The sysctl is back; the namespaces got their own small TCP hash.
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_child_ehash_entries").unwrap_or_default(),
        ehash_before
    );
    if !ehash_before.is_empty() {
        let n = dc
            .run_in_ns("be", || {
                std::fs::read_to_string("/proc/sys/net/ipv4/tcp_ehash_entries")
            })
            .unwrap();
        assert_eq!(n.trim(), netns::CHILD_EHASH_ENTRIES.to_string());
    }

    // RPS mask as written, seen through the node's own sysfs.
    let rps = dc
        .run_in_ns_sysfs("be", |sys| {
            std::fs::read_to_string(sys.join("class/net/eth0/queues/rx-0/rps_cpus"))
        })
        .unwrap();
    assert_eq!(
        u64::from_str_radix(rps.trim().replace(',', "").as_str(), 16).unwrap(),
        1u64 << last
    );
    // ... while the process's own /sys is untouched.
    assert!(Path::new("/sys/fs/cgroup").exists());

    // TCP from a thread in `cl` to a listener in `be`.
    let be: SocketAddr = (dc.node_ip("be"), 7777).into();
    let listener = dc.run_in_ns("be", move || TcpListener::bind(be)).unwrap();
    let server = std::thread::spawn(move || {
        let mut got = Vec::new();
        for _ in 0..2 {
            let (mut s, peer) = listener.accept().unwrap();
            let mut buf = String::new();
            s.read_to_string(&mut buf).unwrap();
            got.push((peer.ip(), buf));
        }
        got
    });
    let t1 = Instant::now();
    dc.run_in_ns("cl", move || {
        let mut s = TcpStream::connect_timeout(&be, Duration::from_secs(3))?;
        s.write_all(b"from-thread")
    })
    .unwrap();
    println!(
        "first TCP connect+write across the bridge: {:?}",
        t1.elapsed()
    );

    // ... and from a process spawned in `cl` (bash's /dev/tcp: no external deps).
    let log = log_path("a");
    let mut c = dc
        .spawn_in(
            "cl",
            Path::new("/bin/bash"),
            &[
                "-c".into(),
                format!("printf from-process >/dev/tcp/{}/7777", dc.node_ip("be")),
            ],
            &log,
        )
        .unwrap();
    assert!(
        c.wait().unwrap().success(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let got = server.join().unwrap();
    assert_eq!(got[0], (dc.node_ip("cl").into(), "from-thread".to_string()));
    assert_eq!(
        got[1],
        (dc.node_ip("cl").into(), "from-process".to_string())
    );

    // Nothing was routed in the root namespace.
    let routes = std::process::Command::new("ip")
        .args(["route", "show"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&routes.stdout).contains("10.77.0."));

    // A process spawned in `be` is in its netns, cgroup and cpuset.
    let mut sleeper = dc
        .spawn_in("be", Path::new("/bin/sleep"), &["30".into()], &log)
        .unwrap();
    let pid = sleeper.id();
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        cg.contains(&format!("/farside/{run}/be")),
        "cgroup of the child: {cg}"
    );
    let procs = std::fs::read_to_string(dc.cgroup_dir("be").join("cgroup.procs")).unwrap();
    assert!(procs.lines().any(|l| l == pid.to_string()));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.contains(&format!("Cpus_allowed_list:\t{last}\n")),
        "cpuset not applied: {status}"
    );
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let ino = std::fs::metadata(dc.netns_path("be")).unwrap().ino();
    assert_eq!(ns.to_string_lossy(), format!("net:[{ino}]"));
    // The CPU quota (50 % of one CPU) in the short period.
    let quota = dc
        .cgroup_dirs("be")
        .iter()
        .find_map(|d| {
            std::fs::read_to_string(d.join("cpu.max"))
                .or_else(|_| std::fs::read_to_string(d.join("cpu.cfs_quota_us")))
                .ok()
        })
        .unwrap();
    let (q, period) = netns::cpu_quota_period(50);
    assert!(quota.starts_with(&q.to_string()), "quota {quota}");
    assert_eq!(dc.cpu_stat("be").unwrap().cpu_max, format!("{q} {period}"));

    // Background load: busy processes in the node's cgroup, gone with the handle.
    let load = dc.start_cpu_load("be", 2).unwrap();
    let pids = load.pids();
    assert_eq!(pids.len(), 2);
    std::thread::sleep(Duration::from_millis(50));
    for p in &pids {
        let cg = std::fs::read_to_string(format!("/proc/{p}/cgroup")).unwrap();
        assert!(cg.contains(&format!("/farside/{run}/be")));
    }
    drop(load);
    for p in &pids {
        assert!(!pid_alive(*p), "load process {p} survived");
    }

    // Drop removes everything and kills what is left in the node.
    let dirs: Vec<PathBuf> = dc.cgroup_dirs("be");
    let t2 = Instant::now();
    drop(dc);
    println!("drop: {:?}", t2.elapsed());
    let _ = sleeper.wait();
    assert!(!pid_alive(pid));
    assert_gone(&run, &["cl", "be"], &dirs);
    let _ = std::fs::remove_file(log);
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside-lab -- --include-ignored` as root"]
fn crash_then_clean_all_removes_everything() {
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // clean_all removes every run, running ones too: refuse (loudly) to destroy another
    // process's live lab run, e.g. an experiment on a developer's machine.
    let mut ignore = netns::CleanReport::default();
    let others: Vec<_> = netns::read_states(&mut ignore)
        .into_iter()
        .filter(|(_, s)| {
            s.owner_pid != std::process::id()
                && Path::new(&format!("/proc/{}", s.owner_pid)).exists()
        })
        .map(|(_, s)| format!("{} (pid {})", s.run_id, s.owner_pid))
        .collect();
    assert!(
        others.is_empty(),
        "another lab run is active ({others:?}): this test's clean_all would kill it; \
         run it when no lab runs"
    );
    let run = run_id("c");
    let dc =
        VirtualDc::create(&run, &[NodeSpec::new("n1").cpus("1"), NodeSpec::new("n2")]).unwrap();
    let log = log_path("c");
    let mut sleeper = dc
        .spawn_in("n1", Path::new("/bin/sleep"), &["30".into()], &log)
        .unwrap();
    let dirs = dc.cgroup_dirs("n1");
    // The "crash": nothing is torn down.
    std::mem::forget(dc);
    assert!(netns_exists(&netns::netns_name(&run, "n1")));
    assert!(dirs[0].exists());

    let t = Instant::now();
    let r = netns::clean_all().unwrap();
    println!("clean_all: {:?}\n{r}", t.elapsed());
    assert!(r.errors.is_empty(), "{r}");
    assert!(r.namespaces.contains(&netns::netns_name(&run, "n1")));
    assert!(r.namespaces.contains(&netns::bridge_netns_name(&run)));
    let _ = sleeper.wait();
    assert!(wait_dead(sleeper.id()));
    assert_gone(&run, &["n1", "n2"], &dirs);
    for h in netns::cgroup_hierarchies().unwrap() {
        assert!(!h.mount.join(netns::CGROUP_SUBTREE).exists());
    }
    // Idempotent.
    let again = netns::clean_all().unwrap();
    assert!(again.is_empty(), "{again}");
    let _ = std::fs::remove_file(log);
}

/// Helper for `killed_owner_then_clean_stale`: runs in a child process of the test binary.
#[test]
#[ignore = "helper process of killed_owner_then_clean_stale, not a test of its own"]
#[allow(clippy::zombie_processes)] // killed with its owner, on purpose
fn helper_owner_process() {
    let Ok(run) = std::env::var("FARSIDE_NETNS_TEST_OWNER") else {
        return;
    };
    let dc = VirtualDc::create(&run, &[NodeSpec::new("x")]).unwrap();
    let _c = dc
        .spawn_in(
            "x",
            Path::new("/bin/sleep"),
            &["30".into()],
            Path::new("/dev/null"),
        )
        .unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside-lab -- --include-ignored` as root"]
fn killed_owner_then_clean_stale() {
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = run_id("k");
    let mut owner = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_owner_process",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FARSIDE_NETNS_TEST_OWNER", &run)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = owner.stdout.take().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while !seen.contains("READY") {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "helper exited: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(netns_exists(&netns::netns_name(&run, "x")));
    // A live owner's run is left alone.
    let r = netns::clean_stale().unwrap();
    assert!(!r.namespaces.contains(&netns::netns_name(&run, "x")), "{r}");
    // Crash it.
    owner.kill().unwrap();
    owner.wait().unwrap();
    let r = netns::clean_stale().unwrap();
    println!("clean_stale:\n{r}");
    assert!(r.errors.is_empty(), "{r}");
    let dirs: Vec<PathBuf> = netns::cgroup_hierarchies()
        .unwrap()
        .iter()
        .map(|h| h.mount.join(netns::CGROUP_SUBTREE).join(&run).join("x"))
        .collect();
    assert_gone(&run, &["x"], &dirs);
}

#[test]
fn without_root_nothing_is_created() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = run_id("n");
    let e = VirtualDc::create_as(1000, &run, &[NodeSpec::new("a")]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    assert_eq!(
        e.to_string(),
        "--hosts netns needs root (network namespaces, cgroups); run as root or use --hosts loopback"
    );
    assert!(!Path::new(netns::NETNS_DIR)
        .join(netns::netns_name(&run, "a"))
        .exists());
    assert!(!Path::new(netns::STATE_DIR)
        .join(format!("{run}.json"))
        .exists());
    if let Ok(hs) = netns::cgroup_hierarchies() {
        for h in hs {
            assert!(!h.mount.join(netns::CGROUP_SUBTREE).join(&run).exists());
        }
    }
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside-lab -- --include-ignored` as root"]
fn failed_create_leaves_nothing() {
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let run = run_id("f");
    // CPU 63 does not exist: the cpuset write fails after namespaces and links exist.
    let e =
        VirtualDc::create(&run, &[NodeSpec::new("a"), NodeSpec::new("b").cpus("63")]).unwrap_err();
    println!("expected error: {e}");
    assert!(e.to_string().contains("cpuset.cpus"), "{e}");
    let dirs: Vec<PathBuf> = netns::cgroup_hierarchies()
        .unwrap()
        .iter()
        .map(|h| h.mount.join(netns::CGROUP_SUBTREE).join(&run).join("b"))
        .collect();
    assert_gone(&run, &["a", "b"], &dirs);
    // A run id that is already taken is refused before anything is created.
    let dc = VirtualDc::create(&run, &[NodeSpec::new("a")]).unwrap();
    let e = VirtualDc::create(&run, &[NodeSpec::new("a")]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
    assert!(netns_exists(&netns::netns_name(&run, "a")));
    dc.destroy().unwrap();
    assert_gone(&run, &["a"], &[]);
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside-lab -- --include-ignored` as root"]
fn concurrent_builds_restore_the_tcp_hash_sysctl() {
    // `tcp_child_ehash_entries` is host-wide: runs that build at the same moment must not
    // take each other's temporary value for the one to restore (it was left at 4096).
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = "/proc/sys/net/ipv4/tcp_child_ehash_entries";
    let before = std::fs::read_to_string(path).unwrap_or_default();
    for round in 0..5 {
        let start = std::sync::Arc::new(std::sync::Barrier::new(4));
        let builders: Vec<_> = (0..4)
            .map(|i| {
                let start = start.clone();
                let run = run_id(&format!("c{round}{i}"));
                std::thread::spawn(move || {
                    start.wait();
                    VirtualDc::create(&run, &[NodeSpec::new("n")]).map(drop)
                })
            })
            .collect();
        for b in builders {
            b.join().expect("builder thread").expect("create");
        }
        assert_eq!(
            std::fs::read_to_string(path).unwrap_or_default(),
            before,
            "round {round}: the sysctl was not restored"
        );
    }
}

#[test]
#[ignore = "needs root: run with `cargo test -p farside-lab -- --include-ignored` as root"]
fn the_cfs_slice_is_lowered_while_quota_runs_live_and_restored_after_the_last() {
    // The host's CFS bandwidth slice is lowered for the nodes' quotas while any run with
    // quotas lives, to the rule's value of the smallest quota, and restored by the last run
    // to end, by a teardown or by the clean-up of a crashed run.
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = netns::SLICE_SYSCTL;
    let read = || -> u64 {
        std::fs::read_to_string(path)
            .expect("the CFS bandwidth sysctl (a kernel with CFS bandwidth control)")
            .trim()
            .parse()
            .unwrap()
    };
    let before = read();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let want = |pct| netns::slice_for(netns::cpu_quota_period(pct).0, cpus, before);
    // A run without quotas leaves it alone.
    let plain = VirtualDc::create(&run_id("s0"), &[NodeSpec::new("n")]).unwrap();
    assert_eq!(read(), before);
    drop(plain);
    let a = VirtualDc::create(&run_id("sa"), &[NodeSpec::new("n").cpu_quota_pct(40)]).unwrap();
    assert_eq!(read(), want(40));
    let b = VirtualDc::create(&run_id("sb"), &[NodeSpec::new("n").cpu_quota_pct(20)]).unwrap();
    assert_eq!(read(), want(20).min(want(40)), "the smaller quota's");
    drop(a);
    assert_eq!(read(), want(20).min(want(40)), "b still runs");
    b.destroy().unwrap();
    assert_eq!(read(), before, "restored by the last run");
    // A crashed run's clean-up restores it too.
    let run = run_id("sc");
    let c = VirtualDc::create(&run, &[NodeSpec::new("n").cpu_quota_pct(40)]).unwrap();
    std::mem::forget(c);
    assert_eq!(read(), want(40));
    let r = netns::clean_run_id(&run).unwrap();
    assert!(r.errors.is_empty(), "{r}");
    assert_eq!(read(), before, "{r}");
    if want(40) != before {
        assert_eq!(r.slice_restored, Some(before), "{r}");
        assert!(r
            .to_string()
            .contains("restored kernel.sched_cfs_bandwidth_slice_us"));
    }
}
