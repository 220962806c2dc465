//! Tests of a whole gatherer ([`Gatherd::start`]): publishing over every transport,
//! the user-space fallbacks, the metrics endpoint, and (root) the XDP responder and the
//! kernel sampler in a private network namespace.

use super::*;
use crate::testutil::{in_private_netns, reader_opts, test_keys, tmp_region};
use crate::{SamplerChoice, XdpChoice};
use farside_region::Snapshot;
use farside_rmem::wire::Status;
use farside_rmem::{connect, ClientOptions, Endpoint};
use std::time::Instant;

#[test]
fn publishes_advancing_records_over_shm_and_tcp() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let args = GatherdArgs {
        node_id: 3,
        period_us: 500,
        watch_ports: vec![port],
        shm: Some(tmp_region("adv")),
        tcp_listen: Some("127.0.0.1:0".parse().unwrap()),
        rmem_keys: test_keys().specs.clone(),
        ..Default::default()
    };
    let g = Gatherd::start(&args).unwrap();
    let mut bytes = [0u8; farside_region::SNAPSHOT_BYTES];
    let opts = reader_opts();
    for ep in [
        Endpoint::Shm(args.shm_path().unwrap()),
        Endpoint::Tcp(g.tcp_addr.unwrap()),
    ] {
        let mut c = connect(&ep, &opts).unwrap();
        // A read may race the writer: the seqlock says so (Torn) and the reader
        // reads again, as the monitor does on its next period.
        let mut read_whole = |bytes: &mut [u8; farside_region::SNAPSHOT_BYTES]| loop {
            c.read(0, bytes).unwrap();
            match Snapshot::decode(bytes) {
                Err(farside_region::RegionError::Torn) => continue,
                other => break other.unwrap(),
            }
        };
        let a = read_whole(&mut bytes);
        assert_eq!(a.header.node_id, 3);
        assert_eq!(a.header.watched_ports[0], port);
        assert_eq!(
            a.load.accept_backlog, 1,
            "{ep}: one connection waits in the backlog"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let b = read_whole(&mut bytes);
            if b.seq > a.seq && b.load.sample_mono_ns > a.load.sample_mono_ns {
                break;
            }
            assert!(Instant::now() < deadline, "{ep}: sequence never advanced");
            std::thread::yield_now();
        }
    }
    // Before the path goes: with the kernel sampler it is the map's fd socket, whose
    // server is woken at exit by a connection to it.
    drop(g);
    let _ = std::fs::remove_file(args.shm_path().unwrap());
}

#[test]
fn stopped_gatherer_leaves_a_record_that_stops_advancing() {
    let args = GatherdArgs {
        shm: Some(tmp_region("stop")),
        ..Default::default()
    };
    let mut g = Gatherd::start(&args).unwrap();
    g.stop();
    // The region file, or the BPF region map where the kernel sampler runs.
    let mem = farside_rmem::map_region(&args.shm_path().unwrap(), REGION_WORDS).unwrap();
    let a = Snapshot::read_local(&mem, 3).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let b = Snapshot::read_local(&mem, 3).unwrap();
    assert_eq!(a.seq, b.seq);
    drop(g);
    let _ = std::fs::remove_file(args.shm_path().unwrap());
}

#[test]
fn the_user_space_server_answers_group_reads_from_the_nodes_address() {
    use farside_rmem::wire::{self, Op, RepHeader, ReqHeader};
    let group: std::net::Ipv4Addr = "239.77.3.4".parse().unwrap();
    let args = GatherdArgs {
        no_shm: true,
        udp_listen: Some("0.0.0.0:0".parse().unwrap()),
        rmem_keys: test_keys().specs.clone(),
        // The interface the group is joined on; no XDP (user space answers).
        xdp_iface: Some("lo".into()),
        xdp_mode: XdpChoice::Off,
        group_read: Some(group),
        ..Default::default()
    };
    let g = Gatherd::start(&args).unwrap();
    assert_eq!(g.udp_server, "user-space");
    let port = g.udp_addr.unwrap().port();
    let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    c.set_multicast_loop_v4(true).unwrap();
    // Multicast out on loopback (where the server joined).
    let lo = libc::in_addr {
        s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
    };
    // SAFETY: setsockopt with an in_addr value.
    let rc = unsafe {
        use std::os::fd::AsRawFd;
        libc::setsockopt(
            c.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_IF,
            (&lo as *const libc::in_addr).cast(),
            std::mem::size_of::<libc::in_addr>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    c.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut covered = Vec::new();
    wire::encode_request(
        &mut covered,
        &ReqHeader {
            op: Op::Read as u8,
            seq: 7,
            len: 64,
            ..Default::default()
        },
        &[],
    );
    let reader = test_keys().set.reader;
    // Envelope seqs as a client's Sequencer sends them (above the start's clock floor).
    let env_seq = std::cell::Cell::new(farside_auth::floor::clock_seq(
        farside_auth::replay::Sequencer::unix_s(),
    ));
    let req = || {
        // A new envelope per attempt: the same datagram twice would be a copy.
        env_seq.set(env_seq.get() + 1);
        let mut b = Vec::new();
        farside_rmem::auth::seal_request(&mut b, &reader, 0xbeef, env_seq.get(), &covered);
        b.resize(
            b.len()
                .max(wire::ENVELOPE_BYTES + wire::REP_HEADER_BYTES + 64),
            0,
        );
        b
    };
    let mut buf = [0u8; 512];
    // The first sample may not be published yet: ask until a good reply (bounded).
    let mut answered = None;
    for _ in 0..20 {
        c.send_to(&req(), (group, port)).unwrap();
        if let Ok((n, from)) = c.recv_from(&mut buf) {
            let body = farside_rmem::auth::open_reply(&buf[..n], &reader, 0xbeef, 1..=u64::MAX)
                .expect("a reply sealed under the reader's key");
            answered = Some((from, RepHeader::decode(body).unwrap()));
            break;
        }
    }
    let (from, h) = answered.expect("a reply to the group READ");
    assert_eq!(from, SocketAddr::from(([127, 0, 0, 1], port)));
    assert_eq!((h.seq, h.status), (7, Status::Ok));
}

#[test]
fn invalid_arguments_are_refused_with_the_flag_named() {
    let e = Gatherd::start(&GatherdArgs {
        period_us: 10,
        no_shm: true,
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("--period-us"), "{e}");
    let e = Gatherd::start(&GatherdArgs {
        watch_ports: vec![1, 2, 3, 4, 5],
        no_shm: true,
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("--watch-port"), "{e}");
}

#[test]
fn metrics_endpoint_reports_samples_and_op_counters() {
    let args = GatherdArgs {
        no_shm: true,
        // The user sampler's own metrics (the kernel sampler's: see below).
        sampler: SamplerChoice::User,
        tcp_listen: Some("127.0.0.1:0".parse().unwrap()),
        rmem_keys: test_keys().specs.clone(),
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..Default::default()
    };
    let g = Gatherd::start(&args).unwrap();
    let mut c = connect(&Endpoint::Tcp(g.tcp_addr.unwrap()), &reader_opts()).unwrap();
    c.read(0, &mut [0u8; 64]).unwrap();
    let _ = c.read(4, &mut [0u8; 8]);
    let addr = g.metrics_addr().unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(body.contains("farside_gatherd_samples_total"), "{body}");
    assert!(
        body.contains("farside_gatherd_sampler{mode=\"user\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("farside_gatherd_field_cost_ns_sum{field=\"cpu\"}"),
        "{body}"
    );
    assert!(
        body.contains("farside_gatherd_user_ops_total{op=\"read\"} 2"),
        "{body}"
    );
    assert!(
        body.contains("farside_gatherd_user_replies_total{status=\"unaligned\"} 1"),
        "{body}"
    );
}

#[test]
fn without_xdp_the_udp_server_falls_back_to_user_space_and_says_so() {
    let args = GatherdArgs {
        no_shm: true,
        udp_listen: Some("127.0.0.1:0".parse().unwrap()),
        rmem_keys: test_keys().specs.clone(),
        ..Default::default()
    };
    // No interface named: user space, port 0 allowed.
    let g = Gatherd::start(&args).unwrap();
    assert_eq!(g.udp_server, "user-space");
    // The kernel sampler needs BPF, not XDP (root here: see the tests below).
    let bpf = farside_bpfrt::is_root();
    assert_eq!(g.sampler, if bpf { "kernel" } else { "user" });
    if !bpf {
        let e = Gatherd::start(&GatherdArgs {
            sampler: SamplerChoice::Kernel,
            ..args.clone()
        })
        .err()
        .unwrap();
        assert!(e.to_string().contains("--sampler kernel"), "{e}");
    }
    // An interface XDP cannot use (does not exist), auto mode: falls back.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let args = GatherdArgs {
        udp_listen: Some(format!("127.0.0.1:{port}").parse().unwrap()),
        rmem_keys: test_keys().specs.clone(),
        xdp_iface: Some("nosuchif0".into()),
        ..args
    };
    let g2 = Gatherd::start(&args).unwrap();
    assert_eq!(g2.udp_server, "user-space");
    let mut c = connect(&Endpoint::Udp(g2.udp_addr.unwrap()), &reader_opts()).unwrap();
    let mut bytes = [0u8; farside_region::SNAPSHOT_BYTES];
    c.read(0, &mut bytes).unwrap();
    Snapshot::decode(&bytes).expect("a valid record over the fallback");
    drop(g2);
    // Asked explicitly for native XDP: an error, not a silent fallback.
    let e = Gatherd::start(&GatherdArgs {
        xdp_mode: XdpChoice::Native,
        ..args
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("xdp-mode"), "{e}");
}

/// The body of one scrape of gatherd's metrics endpoint.
fn scrape(addr: SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// The value of the sample `series` (name and labels, exactly as rendered) in a scrape.
fn sample_value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The kernel sampler without XDP (root): no `--xdp-iface`, `--sampler auto`; the
/// kernel sampler publishes (the start-up says so, the metrics too), gatherd runs no
/// sampling thread, the shm path hands out the BPF region map, and the record read
/// there advances and carries the watched port's accept queue.
#[test]
#[ignore = "needs root: BPF (the kernel sampler), a network namespace"]
fn without_xdp_the_kernel_sampler_publishes_where_bpf_is_available() {
    use std::os::unix::fs::FileTypeExt;
    assert!(farside_bpfrt::is_root(), "needs root");
    let shm = tmp_region("ksamp-noxdp");
    let shm2 = shm.clone();
    in_private_netns(move || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let args = GatherdArgs {
            node_id: 6,
            shm: Some(shm2.clone()),
            watch_ports: vec![port],
            tcp_listen: Some("127.0.0.1:0".parse().unwrap()),
            rmem_keys: test_keys().specs.clone(),
            metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(args.sampler, SamplerChoice::Auto);
        assert!(args.xdp_iface.is_none());
        let g = Gatherd::start(&args).unwrap();
        assert_eq!(g.sampler, "kernel", "{:?}", g.sampler_reason);
        assert_eq!(g.sampler_reason, None);
        assert!(g.thread.is_none(), "no sampling thread");
        assert_eq!(g.udp_server, "off");
        assert!(
            std::fs::metadata(&shm2).unwrap().file_type().is_socket(),
            "shm readers are handed the BPF map"
        );
        let user_samples = g.stats.samples.load(Ordering::Relaxed);
        let mem = farside_rmem::map_region(&shm2, REGION_WORDS).unwrap();
        let read = || loop {
            match Snapshot::read_local(&mem, 10) {
                Ok(s) => break s,
                Err(farside_region::RegionError::Torn) => continue,
                Err(e) => panic!("{e:?}"),
            }
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let a = loop {
            let a = read();
            if a.load.accept_backlog == 1 && a.load.conns_established == 1 {
                break a;
            }
            assert!(Instant::now() < deadline, "seeded: {a:?}");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(a.header.node_id, 6);
        loop {
            let b = read();
            if b.seq > a.seq + 10 && b.load.sample_mono_ns > a.load.sample_mono_ns {
                break;
            }
            assert!(Instant::now() < deadline, "sequence never advanced: {b:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            g.stats.samples.load(Ordering::Relaxed),
            user_samples,
            "no user-space sample after the handover"
        );
        // tcp serves the same words.
        let mut c = connect(&Endpoint::Tcp(g.tcp_addr.unwrap()), &reader_opts()).unwrap();
        let mut bytes = [0u8; farside_region::SNAPSHOT_BYTES];
        c.read(0, &mut bytes).unwrap();
        assert_eq!(Snapshot::decode(&bytes).unwrap().header.node_id, 6);
        let body = scrape(g.metrics_addr().unwrap());
        assert!(
            body.contains("farside_gatherd_sampler{mode=\"kernel\"} 1"),
            "{body}"
        );
        assert!(
            body.contains("farside_gatherd_bpf_run_count_total{prog=\"ksamp_tick\"}"),
            "{body}"
        );
        assert!(
            !body.contains("farside_gatherd_xdp_ops_total"),
            "no XDP responder: {body}"
        );
        assert!(
            g.summary().starts_with("sampler=kernel "),
            "{}",
            g.summary()
        );
    });
    let _ = std::fs::remove_file(shm);
}

/// Without privilege for BPF (root drops it: this thread, and the threads gatherd
/// spawns from it, run as nobody with no capabilities) `--sampler auto` falls back to
/// the user-space sampler and says why (`sampler_reason` is the logged reason), the
/// region is the shm file as ever, and `--sampler kernel` is an error naming BPF.
#[test]
#[ignore = "needs root: drops to an unprivileged user"]
fn without_bpf_the_user_sampler_publishes_and_the_reason_is_given() {
    assert!(farside_bpfrt::is_root(), "needs root");
    let shm = tmp_region("ksamp-nobpf");
    let shm2 = shm.clone();
    std::thread::spawn(move || {
        const NOBODY: libc::c_long = 65534;
        // SAFETY: the raw system calls change this thread's credentials only (glibc's
        // wrappers would change every thread's); all ids non-zero clears the
        // capabilities.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
                0
            );
            assert_eq!(
                libc::syscall(libc::SYS_setresgid, NOBODY, NOBODY, NOBODY),
                0
            );
            assert_eq!(
                libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY),
                0
            );
        }
        let args = GatherdArgs {
            shm: Some(shm2.clone()),
            period_us: 500,
            ..Default::default()
        };
        let g = Gatherd::start(&args).unwrap();
        assert_eq!(g.sampler, "user");
        let why = g.sampler_reason.clone().unwrap_or_default();
        assert!(why.contains("needs BPF"), "{why}");
        assert!(g.thread.is_some(), "the sampling thread runs");
        assert!(
            std::fs::metadata(&shm2).unwrap().is_file(),
            "the region file"
        );
        let mem = MappedWords::open_file(&shm2, REGION_WORDS).unwrap();
        let a = Snapshot::read_local(&mem, 10).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Snapshot::read_local(&mem, 10).map_or(true, |b| b.seq <= a.seq) {
            assert!(Instant::now() < deadline, "sequence never advanced");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(g.summary().starts_with("sampler=user "), "{}", g.summary());
        drop(g);
        let e = Gatherd::start(&GatherdArgs {
            sampler: SamplerChoice::Kernel,
            ..args
        })
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("--sampler kernel") && e.contains("needs BPF"),
            "{e}"
        );
    })
    .join()
    .unwrap();
    let _ = std::fs::remove_file(shm);
}

/// `--bpf-stats` (root): the kernel's run-time statistics are on while gatherd runs,
/// and the kernel sampler's run time and count are in the metrics and grow.
#[test]
#[ignore = "needs root: BPF (the kernel sampler, BPF_ENABLE_STATS)"]
fn with_bpf_stats_the_kernel_share_is_in_the_metrics_and_grows() {
    assert!(farside_bpfrt::is_root(), "needs root");
    let g = Gatherd::start(&GatherdArgs {
        no_shm: true,
        sampler: SamplerChoice::Kernel,
        bpf_stats: true,
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(g.sampler, "kernel");
    let addr = g.metrics_addr().unwrap();
    let time = "farside_gatherd_bpf_run_time_seconds_total{prog=\"ksamp_tick\"}";
    let count = "farside_gatherd_bpf_run_count_total{prog=\"ksamp_tick\"}";
    let read = || {
        let body = scrape(addr);
        assert_eq!(
            sample_value(&body, "farside_gatherd_bpf_stats_enabled"),
            Some(1.0),
            "{body}"
        );
        let v = (sample_value(&body, time), sample_value(&body, count));
        (
            v.0.unwrap_or_else(|| panic!("{body}")),
            v.1.unwrap_or_else(|| panic!("{body}")),
        )
    };
    std::thread::sleep(Duration::from_millis(50));
    let (t0, n0) = read();
    std::thread::sleep(Duration::from_millis(200));
    let (t1, n1) = read();
    assert!(n1 > n0, "runs grow: {n0} -> {n1}");
    assert!(t1 > t0, "run time grows: {t0} -> {t1}");
    // One tick per CPU per period: 200 ms at 1 ms is hundreds of runs.
    assert!(n1 - n0 >= 50.0, "{n0} -> {n1}");
    let per_run_ns = (t1 - t0) * 1e9 / (n1 - n0);
    assert!(
        per_run_ns > 0.0 && per_run_ns < 1e6,
        "{per_run_ns} ns per run"
    );
    assert!(g.summary().contains(" bpf_cpu_pct="), "{}", g.summary());
}

/// The stale bound of the restart test: a proxy's default `admission.stale_after_ms`.
const RESTART_STALE_AFTER: Duration = Duration::from_millis(100);

/// A gatherd killed and restarted (root: a private netns, XDP on lo, the kernel
/// sampler if it loads): counted from the new process's exec, a record of the new
/// generation younger than `stale_after` is read over udp within 2 × `stale_after`,
/// and from then on every read is fresh through the XDP attach and the sampler
/// handover. The gatherds are this test binary re-run with `FARSIDE_RESTART_CHILD`.
#[test]
#[ignore = "needs root: a network namespace, XDP on lo"]
fn a_restarted_gatherd_is_fresh_within_two_stale_bounds_of_its_exec() {
    const NAME: &str =
        "daemon::tests::a_restarted_gatherd_is_fresh_within_two_stale_bounds_of_its_exec";
    const PORT: u16 = 17081;
    const READY: &str = "FARSIDE-GATHERD-STARTED";
    if std::env::var_os("FARSIDE_RESTART_CHILD").is_some() {
        // The parent's reader key (this process's own test keys are other keys).
        let spec = std::env::var("FARSIDE_RESTART_KEY").expect("the parent's key");
        let g = Gatherd::start(&GatherdArgs {
            no_shm: true,
            udp_listen: Some(SocketAddr::from(([127, 0, 0, 1], PORT))),
            rmem_keys: vec![spec.parse().unwrap()],
            xdp_iface: Some("lo".into()),
            xdp_mode: XdpChoice::Generic,
            ..Default::default()
        })
        .unwrap();
        println!("{READY} {} {}", g.udp_server, format_stages(&g.startup));
        // Until the parent kills this process.
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root");
    in_private_netns(|| {
        use std::io::BufRead;
        let spawn = || {
            let mut c = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    NAME,
                    "--include-ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("FARSIDE_RESTART_CHILD", "1")
                .env(
                    "FARSIDE_RESTART_KEY",
                    format!("reader:1:{}", test_keys().reader_file.display()),
                )
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let out = std::io::BufReader::new(c.stdout.take().unwrap());
            // The readiness line, read on a thread so the parent polls meanwhile.
            let ready = std::thread::spawn(move || {
                out.lines()
                    .map_while(Result::ok)
                    .find(|l| l.contains(READY))
            });
            (c, ready)
        };
        let mut udp = connect(
            &Endpoint::Udp(SocketAddr::from(([127, 0, 0, 1], PORT))),
            &ClientOptions {
                timeout: Duration::from_millis(10),
                ..reader_opts()
            },
        )
        .unwrap();
        let mut read = || {
            let mut bytes = [0u8; farside_region::SNAPSHOT_BYTES];
            udp.read(0, &mut bytes).ok()?;
            Snapshot::decode(&bytes).ok()
        };
        let age = |s: &Snapshot| {
            Duration::from_nanos(farside_rt::mono_ns().saturating_sub(s.load.sample_mono_ns))
        };
        let (mut a, ready_a) = spawn();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready_a.is_finished() {
            if Instant::now() > deadline {
                let _ = a.kill();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let line = ready_a.join().unwrap().expect("first gatherd started");
        assert!(line.contains("xdp-generic"), "{line}");
        let old = read().expect("first gatherd answers").header.generation;
        a.kill().unwrap();
        a.wait().unwrap();
        let t0 = Instant::now();
        let (mut b, ready_b) = spawn();
        let fresh_at = loop {
            if let Some(s) = read() {
                if s.header.generation != old && age(&s) < RESTART_STALE_AFTER {
                    break t0.elapsed();
                }
            }
            if t0.elapsed() > Duration::from_secs(5) {
                let _ = b.kill();
                panic!("the restarted gatherd never served a fresh record");
            }
            // A reader's poll, not a spin: the machine's CPUs start the gatherd.
            std::thread::sleep(Duration::from_millis(1));
        };
        // Fresh through the XDP attach and the sampler's handover, and some time after.
        let mut worst = Duration::ZERO;
        let mut reads = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !ready_b.is_finished() || reads < 200 {
            if let Some(s) = read() {
                worst = worst.max(age(&s));
                reads += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
            assert!(
                Instant::now() < deadline,
                "the restarted gatherd never started"
            );
        }
        let line = ready_b.join().unwrap().expect("restarted gatherd started");
        let _ = b.kill();
        let _ = b.wait();
        eprintln!("fresh {fresh_at:?} after exec; worst age after {worst:?}; {line}");
        assert!(
            fresh_at < 2 * RESTART_STALE_AFTER,
            "fresh only {fresh_at:?} after the exec ({line})"
        );
        assert!(line.contains("xdp-generic"), "{line}");
        assert!(
            worst < RESTART_STALE_AFTER,
            "a stale record ({worst:?}) during the handover ({line})"
        );
    });
}

/// The kernel sampler (root; skipped otherwise): with XDP, the record read over udp
/// (answered by XDP) and shm follows the watched port's accept queue and
/// connections, and its sequence advances although gatherd runs no sampling thread
/// (no user-space sample is taken after the start-up's handover).
#[test]
fn kernel_sampler_publishes_without_a_sampling_thread() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped: needs root");
        return;
    }
    let shm = tmp_region("ksamp");
    let shm2 = shm.clone();
    in_private_netns(move || {
        use std::net::{TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // Two connections queued before gatherd starts: the seed counts them.
        let mut clients: Vec<TcpStream> = (0..2)
            .map(|_| TcpStream::connect(l.local_addr().unwrap()).unwrap())
            .collect();
        let args = GatherdArgs {
            node_id: 4,
            shm: Some(shm2.clone()),
            watch_ports: vec![port],
            udp_listen: Some("127.0.0.1:17078".parse().unwrap()),
            rmem_keys: test_keys().specs.clone(),
            xdp_iface: Some("lo".into()),
            xdp_mode: XdpChoice::Generic,
            sampler: SamplerChoice::Kernel,
            ..Default::default()
        };
        let g = Gatherd::start(&args).unwrap();
        assert_eq!(g.sampler, "kernel");
        assert!(g.thread.is_none(), "no sampling thread");
        // The user-space thread sampled only until the handover.
        let user_samples = g.stats.samples.load(Ordering::Relaxed);
        let mut udp = connect(
            &Endpoint::Udp(g.udp_addr.unwrap()),
            &ClientOptions {
                timeout: Duration::from_millis(500),
                ..reader_opts()
            },
        )
        .unwrap();
        let mem = farside_rmem::map_region(&shm2, REGION_WORDS).unwrap();
        let read_udp = |c: &mut Box<dyn farside_rmem::RemoteMemory>| loop {
            let mut bytes = [0u8; farside_region::SNAPSHOT_BYTES];
            c.read(0, &mut bytes).unwrap();
            match Snapshot::decode(&bytes) {
                Err(farside_region::RegionError::Torn) => continue,
                other => break other.unwrap(),
            }
        };
        let mut await_both = |what: &str, ok: &dyn Fn(&Snapshot) -> bool| {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let (a, b) = (read_udp(&mut udp), Snapshot::read_local(&mem, 10).unwrap());
                if ok(&a) && ok(&b) {
                    return a;
                }
                assert!(Instant::now() < deadline, "{what}: udp {a:?} shm {b:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let first = await_both("seeded", &|s| {
            s.load.accept_backlog == 2 && s.load.conns_established == 2
        });
        assert_eq!(first.header.node_id, 4);
        // A third connection: the listener is learnt, its queue read directly.
        clients.push(TcpStream::connect(l.local_addr().unwrap()).unwrap());
        await_both("third queued", &|s| {
            s.load.accept_backlog == 3 && s.load.conns_established == 3
        });
        let (served, _) = l.accept().unwrap();
        await_both("accepted", &|s| {
            s.load.accept_backlog == 2 && s.load.conns_established == 3
        });
        drop(served);
        await_both("closed", &|s| {
            s.load.accept_backlog == 2 && s.load.conns_established == 2
        });
        // The sequence advances with no user-space sample taken.
        let a = await_both("any", &|_| true);
        await_both("sequence advances", &|s| s.seq > a.seq + 10);
        assert_eq!(g.stats.samples.load(Ordering::Relaxed), user_samples);
        assert!(
            g.summary().starts_with("sampler=kernel "),
            "{}",
            g.summary()
        );
        let mut g = g;
        g.stop();
        let s1 = Snapshot::read_local(&mem, 10).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            Snapshot::read_local(&mem, 10).unwrap().seq,
            s1.seq,
            "a stopped gatherer's record stops advancing"
        );
        drop(clients);
    });
    let _ = std::fs::remove_file(shm);
}

/// Literally "no user process publishes" (root; skipped otherwise): a gatherd with
/// the kernel sampler runs in a child process (this test binary, re-run with
/// `FARSIDE_KSAMP_CHILD` set); the child is stopped with SIGSTOP, and the record,
/// mapped here through the child's shm socket, keeps advancing.
#[test]
fn kernel_sampler_record_advances_while_gatherd_is_sigstopped() {
    const NAME: &str = "daemon::tests::kernel_sampler_record_advances_while_gatherd_is_sigstopped";
    if let Some(path) = std::env::var_os("FARSIDE_KSAMP_CHILD") {
        in_private_netns(move || {
            let ready = PathBuf::from(format!("{}.started", path.to_string_lossy()));
            let _g = Gatherd::start(&GatherdArgs {
                shm: Some(PathBuf::from(path)),
                udp_listen: Some("127.0.0.1:17079".parse().unwrap()),
                rmem_keys: test_keys().specs.clone(),
                xdp_iface: Some("lo".into()),
                xdp_mode: XdpChoice::Generic,
                sampler: SamplerChoice::Kernel,
                ..Default::default()
            })
            .unwrap();
            // The socket answers from the start-up's first milliseconds, the kernel
            // sampler only once `start` returns: say so.
            std::fs::write(&ready, b"").unwrap();
            // Until the parent kills this process.
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped: needs root");
        return;
    }
    let shm = tmp_region("sigstop");
    let _ = std::fs::remove_file(&shm);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--test-threads=1"])
        .env("FARSIDE_KSAMP_CHILD", &shm)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + Duration::from_secs(20);
    // The socket is served early in the start-up; the kernel sampler runs once the
    // child says it started.
    let started = PathBuf::from(format!("{}.started", shm.display()));
    let _ = std::fs::remove_file(&started);
    let mem = loop {
        if started.exists() {
            if let Ok(m) = farside_rmem::map_region(&shm, REGION_WORDS) {
                break m;
            }
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("the child gatherd never served {}", shm.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('T')
        })
    };
    while !stopped() {
        assert!(Instant::now() < deadline, "child never stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
    let a = Snapshot::read_local(&mem, 10).unwrap();
    let advanced = loop {
        let b = Snapshot::read_local(&mem, 10).unwrap();
        if b.seq > a.seq + 10 || Instant::now() > deadline {
            break b;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let still_stopped = stopped();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = child.wait();
    let _ = std::fs::remove_file(&shm);
    let _ = std::fs::remove_file(&started);
    assert!(still_stopped, "the child ran during the check");
    assert!(
        advanced.seq > a.seq + 10,
        "record stopped at {} with gatherd stopped",
        advanced.seq
    );
}

/// Exactly-once through the trait against the XDP program (answering in the kernel):
/// requests and replies lost, duplicated and reordered by a relay. Every CAS of a
/// chain is reported won, every Ok FETCH-ADD returned a distinct old value and the
/// sum accounts for them, and no delayed duplicate of an older WRITE lands last.
fn xdp_answers_exactly_once_through_a_lossy_relay(g: &Gatherd, key: farside_rmem::ClientKey) {
    use farside_rmem::relay::{Faults, LossyRelay};
    use farside_rmem::{RmemError, UdpClient};
    const CAS_WORD: usize = farside_region::layout::W_LOCK_BASE + 1;
    const ADD_WORD: usize = farside_region::layout::W_COUNTER_BASE + 1;
    let faults = Faults {
        drop_req: 15,
        drop_rep: 25,
        dup: 30,
        delay_ms_max: 3,
    };
    let relay = LossyRelay::spawn(g.udp_addr.unwrap(), faults, 0xfa11).unwrap();
    let region = g.xdp.as_ref().unwrap().region();
    let word = |i: usize| region.words()[i].load(Ordering::Acquire);
    let mut c = UdpClient::new(
        relay.addr,
        ClientOptions {
            key: Some(key),
            timeout: Duration::from_millis(600),
            ..Default::default()
        },
    )
    .unwrap();
    // At ~40% loss per round trip, 12 attempts all fail with p < 2e-5.
    c.tries = 12;
    let mut c: Box<dyn farside_rmem::RemoteMemory> = Box::new(c);
    let before = g.xdp.as_ref().unwrap().counters().1;
    let mut unknown = 0u64;
    let mut cur = word(CAS_WORD);
    for i in 1..=30u64 {
        match c.compare_swap(CAS_WORD * 8, cur, cur + 1) {
            Ok(old) => {
                assert_eq!(old, cur, "CAS {i} reported as won");
                cur += 1;
            }
            Err(RmemError::Timeout | RmemError::Refused(Status::Unknown)) => {
                unknown += 1;
                cur = word(CAS_WORD);
            }
            Err(e) => panic!("CAS {i}: {e}"),
        }
    }
    let start = word(ADD_WORD);
    let (mut ok, mut olds) = (0u64, std::collections::BTreeSet::new());
    for _ in 0..30 {
        match c.fetch_add(ADD_WORD * 8, 1) {
            Ok(old) => {
                assert!(olds.insert(old), "old value {old} returned twice");
                ok += 1;
            }
            Err(RmemError::Timeout | RmemError::Refused(Status::Unknown)) => unknown += 1,
            Err(e) => panic!("FADD: {e}"),
        }
    }
    let added = word(ADD_WORD) - start;
    assert!(
        added >= ok && added <= ok + unknown,
        "{added} added, {ok} ok"
    );
    // (A balancer key writes nothing; the WRITE half of exactly-once is checked by
    // farside-rmem's lossy relay test and the XDP packet tests.)
    assert!(unknown <= 3, "{unknown} operations with unknown outcome");
    let after = g.xdp.as_ref().unwrap().counters().1;
    assert!(
        after[Status::Ok as usize] > before[Status::Ok as usize] + 40,
        "answered in the kernel"
    );
}

/// One memory (needs root; skipped otherwise): with XDP
/// attached, a CAS over udp (answered in the kernel) is seen over tcp and shm, and
/// atomics over tcp and shm are seen over udp. Fails on the old code, where tcp and
/// shm served the shm file and XDP the BPF map.
#[test]
fn with_xdp_every_transport_operates_on_the_same_words() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped: needs root");
        return;
    }
    const LOCK: usize = farside_region::layout::W_LOCK_BASE * 8;
    const COUNTER: usize = farside_region::layout::W_COUNTER_BASE * 8;
    let shm = tmp_region("onemem");
    let shm2 = shm.clone();
    in_private_netns(move || {
        let args = GatherdArgs {
            node_id: 9,
            shm: Some(shm2.clone()),
            tcp_listen: Some("127.0.0.1:0".parse().unwrap()),
            udp_listen: Some("127.0.0.1:17077".parse().unwrap()),
            rmem_keys: test_keys().specs.clone(),
            xdp_iface: Some("lo".into()),
            xdp_mode: XdpChoice::Generic,
            ..Default::default()
        };
        let g = Gatherd::start(&args).unwrap();
        assert_eq!(g.udp_server, "xdp-generic");
        let bal = test_keys().set.balancer;
        let opts = ClientOptions {
            key: Some(bal),
            timeout: Duration::from_millis(500),
            ..Default::default()
        };
        let mut udp = connect(&Endpoint::Udp(g.udp_addr.unwrap()), &opts).unwrap();
        let mut tcp = connect(&Endpoint::Tcp(g.tcp_addr.unwrap()), &opts).unwrap();
        let mut shm = connect(&Endpoint::Shm(shm2.clone()), &opts).unwrap();
        let read = |c: &mut Box<dyn farside_rmem::RemoteMemory>, off: usize| {
            let mut b = [0u8; 8];
            c.read(off, &mut b).unwrap();
            u64::from_le_bytes(b)
        };
        let before = g.xdp.as_ref().unwrap().counters().0;
        assert_eq!(udp.compare_swap(LOCK, 0, 0xA1).unwrap(), 0);
        assert_eq!(read(&mut tcp, LOCK), 0xA1, "udp CAS seen over tcp");
        assert_eq!(read(&mut shm, LOCK), 0xA1, "udp CAS seen over shm");
        assert_eq!(tcp.fetch_add(COUNTER, 1).unwrap(), 0);
        assert_eq!(shm.compare_swap(LOCK, 0xA1, 0xB2).unwrap(), 0xA1);
        assert_eq!(read(&mut udp, COUNTER), 1, "tcp FADD seen over udp");
        assert_eq!(read(&mut udp, LOCK), 0xB2, "shm CAS seen over udp");
        let after = g.xdp.as_ref().unwrap().counters().0;
        assert!(
            after[3] > before[3] && after[1] > before[1],
            "udp CAS and READs answered in the kernel: {before:?} -> {after:?}"
        );
        // The load record is published once, into the map: shm readers see it advance.
        let mem = farside_rmem::map_region(&shm2, REGION_WORDS).unwrap();
        let a = Snapshot::read_local(&mem, 3).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Snapshot::read_local(&mem, 3).unwrap().seq == a.seq {
            assert!(Instant::now() < deadline, "record never advanced over shm");
            std::thread::sleep(Duration::from_millis(1));
        }
        xdp_answers_exactly_once_through_a_lossy_relay(&g, bal);
        drop(g);
        assert!(!shm2.exists(), "the shm socket goes with the gatherer");
    });
    let _ = std::fs::remove_file(shm);
}

/// A local user who plants a symlink where the region's directory goes (or, root only
/// here, a file of theirs at the region's name) does not steer where gatherd creates or
/// removes its region file: start-up refuses with the reason, and nothing lands in the
/// directory the symlink names.
#[test]
fn a_planted_symlink_or_foreign_file_is_refused_not_followed() {
    let base = std::env::temp_dir().join(format!("farside-gatherd-plant-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let elsewhere = base.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let planted = base.join("farside");
    std::os::unix::fs::symlink(&elsewhere, &planted).unwrap();
    let args = GatherdArgs {
        shm: Some(planted.join("node1.region")),
        period_us: 500,
        ..Default::default()
    };
    // Another user's symlink (root here hands it to nobody; a symlink of our own is a
    // safe transition and followed).
    if farside_testkit::root_or_skip(
        "a_planted_symlink_or_foreign_file_is_refused_not_followed (symlink)",
    ) {
        std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
        let e = Gatherd::start(&args).err().expect("refused").to_string();
        assert!(e.contains("a symlink owned by uid 65534"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "{e}");
    }
    if farside_testkit::root_or_skip(
        "a_planted_symlink_or_foreign_file_is_refused_not_followed (foreign file)",
    ) {
        let theirs = base.join("node1.region");
        std::fs::write(&theirs, b"theirs").unwrap();
        std::os::unix::fs::lchown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = Gatherd::start(&GatherdArgs {
            shm: Some(theirs.clone()),
            ..args
        })
        .err()
        .expect("refused")
        .to_string();
        assert!(e.contains("uid 65534"), "{e}");
        assert_eq!(std::fs::read(&theirs).unwrap(), b"theirs");
    }
    std::fs::remove_dir_all(&base).unwrap();
}

/// A gatherd restart keeps the node's role (the site it was moved to, not
/// `--role-initial`) and its boot epoch (persisted in `--role-state`), and the role
/// versions of the new life are above every version of the earlier ones: a balancer's
/// CAS that expects a value read before the restart fails.
#[test]
fn a_restarted_gatherd_keeps_its_role_and_versions_never_go_back() {
    use farside_reconf::words::{W_ROLE_EPOCH, W_ROLE_SERVED, W_ROLE_WANTED};
    use farside_reconf::Role;
    use std::sync::atomic::Ordering::SeqCst;
    let dir = std::env::temp_dir().join(format!("farside-gatherd-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let args = GatherdArgs {
        node_id: 4,
        period_us: 500,
        shm: Some(dir.join("run/node4.region")),
        role: role::RoleArgs {
            role_apply_cmd: Some("true".into()),
            role_state: Some(dir.join("state/node4.state")),
            role_poll_ms: 1,
            role_apply_timeout_ms: 10_000,
            role_drain_ms: 0,
            role_retry_ms: 1000,
            ..Default::default()
        },
        ..Default::default()
    };
    let word = |m: &farside_region::MappedWords, w: usize| m.words()[w].load(SeqCst);
    let wait_served = |m: &farside_region::MappedWords, r: Role| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while word(m, W_ROLE_SERVED) != r.0 {
            assert!(Instant::now() < deadline, "served never became {r:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let g = Gatherd::start(&args).unwrap();
    let m = farside_rmem::map_region(&args.shm_path().unwrap(), REGION_WORDS).unwrap();
    let first = Role(word(&m, W_ROLE_SERVED));
    assert_eq!(first, Role::new(0, 1), "a first start is as ever");
    assert_eq!(g.role.as_ref().unwrap().started.boot_epoch, 1);
    // A balancer moves the node to site 2.
    let moved = first.moved_to(2);
    m.words()[W_ROLE_WANTED]
        .compare_exchange(first.0, moved.0, SeqCst, SeqCst)
        .unwrap();
    wait_served(&m, moved);
    let epoch = word(&m, W_ROLE_EPOCH);
    let mut seen = vec![first, moved];
    drop(m);
    drop(g);
    for boot in 2..=3u64 {
        let g = Gatherd::start(&args).unwrap();
        let m = farside_rmem::map_region(&args.shm_path().unwrap(), REGION_WORDS).unwrap();
        let now = Role(word(&m, W_ROLE_SERVED));
        assert_eq!(now.site(), 2, "boot {boot}: still the site it was moved to");
        assert_eq!(word(&m, W_ROLE_WANTED), now.0);
        assert!(
            word(&m, W_ROLE_EPOCH) > epoch,
            "boot {boot}: ROLE_EPOCH went back"
        );
        assert_eq!(g.role.as_ref().unwrap().started.boot_epoch, boot);
        assert!(
            now.version() >= role::state::version_base(boot),
            "boot {boot}: {now:?}"
        );
        for old in &seen {
            assert!(
                now.version() > old.version(),
                "boot {boot}: {now:?} after {old:?}"
            );
            // A CAS from before the restart (expecting what it read then) fails.
            let stale = old.moved_to(5);
            assert!(m.words()[W_ROLE_WANTED]
                .compare_exchange(old.0, stale.0, SeqCst, SeqCst)
                .is_err());
        }
        // A fence in this life: the next life starts above it too.
        let fenced = Role(m.words()[W_ROLE_WANTED].fetch_add(1, SeqCst) + 1);
        wait_served(&m, fenced);
        seen.extend([now, fenced]);
        drop(m);
        drop(g);
    }
    let text = std::fs::read_to_string(dir.join("state/node4.state")).unwrap();
    assert!(text.contains("boot_epoch 3\nsite 2\n"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
