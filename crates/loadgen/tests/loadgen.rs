//! Load generator behaviour against farside-backend and tiny misbehaving
//! servers, all on loopback port 0.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farside_loadgen::{
    backoff_delay, run, write_docroot, ArrivalGen, Arrivals, LoadgenArgs, OnReject, PathMode, Rng,
    Summary, Trace, TraceKind, WorldCupTrace, ZipfSampler,
};

fn backend(workers: usize, root: Option<std::path::PathBuf>) -> farside_backend::Handle {
    let args = farside_backend::BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        workers,
        root,
        ..Default::default()
    };
    farside_backend::spawn(args).unwrap().1
}

fn args_for(addr: SocketAddr) -> LoadgenArgs {
    let mut a = LoadgenArgs::new(addr.to_string());
    a.quiet = true;
    a.warmup_s = 0.0;
    a.duration_s = 10.0;
    a
}

/// A server whose every connection is handled by `handler` on its own thread.
fn misbehaving_server(handler: fn(TcpStream)) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || handler(stream));
        }
    });
    addr
}

/// A server whose connections are handled by `handler` on their own
/// threads; returns its address and the count of accepted connections.
fn counting_server(
    handler: impl Fn(TcpStream) + Send + Sync + 'static,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (count, handler) = (Arc::clone(&accepted), Arc::new(handler));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            let h = Arc::clone(&handler);
            std::thread::spawn(move || h(stream));
        }
    });
    (addr, accepted)
}

/// Reads one request head (up to the blank line); false on EOF.
fn read_request(s: &mut TcpStream) -> bool {
    read_head(s).is_some()
}

/// Reads one request head (up to the blank line); None on EOF.
fn read_head(s: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Answers every request on a connection with a 16-byte 200 after `delay`.
fn slow_handler(delay: Duration) -> impl Fn(TcpStream) + Send + Sync + 'static {
    move |mut s| {
        while read_request(&mut s) {
            std::thread::sleep(delay);
            if s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n0123456789abcdef")
                .is_err()
            {
                return;
            }
        }
    }
}

/// Answers every request with a keep-alive 503.
fn reject_all(mut s: TcpStream) {
    while read_request(&mut s) {
        let resp = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy";
        if s.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("farside-loadgen-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn closed_loop_records_every_request_with_correct_stats() {
    let h = backend(4, None);
    let dir = temp_dir("closed");
    let out = dir.join("records.csv");
    let mut a = args_for(h.addr());
    a.clients = 8;
    a.requests = Some(300);
    a.out = Some(out.clone());
    let s = run(&a).unwrap();
    assert_eq!(s.attempts, 300);
    assert_eq!(s.served, 300);
    assert_eq!((s.dropped_503, s.failures), (0, 0));
    assert_eq!(s.bytes, 300 * 16384);
    assert!(s.avg_ms > 0.0 && s.p50_ms <= s.p90_ms && s.p90_ms <= s.p99_ms && s.p99_ms <= s.max_ms);
    assert!(s.tps > 0.0 && s.duration_s < 10.0);
    assert_eq!(s.series.iter().map(|x| x.served).sum::<u64>(), 300);
    let csv = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "start_us,latency_us,status,bytes,outcome");
    assert_eq!(lines.len(), 301);
    assert!(lines[1..].iter().all(|l| l.ends_with(",200,16384,served")));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn duration_bounds_the_run_and_warmup_is_excluded() {
    let h = backend(2, None);
    let mut a = args_for(h.addr());
    a.clients = 2;
    a.warmup_s = 0.3;
    a.duration_s = 1.0;
    a.no_keepalive = true;
    let t0 = Instant::now();
    let s = run(&a).unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1300) && took < Duration::from_millis(2500),
        "{took:?}"
    );
    assert!(s.served > 10 && s.failures == 0, "{s}");
    assert_eq!(s.series.len(), 1);
    assert!((s.tps - s.served as f64).abs() < 1e-9);
}

#[test]
fn status_503_counts_as_dropped_not_served() {
    let addr = misbehaving_server(|mut s| {
        while read_request(&mut s) {
            let body = "overloaded";
            let resp = format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if s.write_all(resp.as_bytes()).is_err() {
                return;
            }
        }
    });
    let mut a = args_for(addr);
    a.clients = 2;
    a.requests = Some(50);
    a.on_reject = Some(OnReject::Retry);
    let s = run(&a).unwrap();
    assert_eq!(
        (s.attempts, s.served, s.dropped_503, s.failures),
        (50, 0, 50, 0)
    );
    assert!((s.drop_rate - 1.0).abs() < 1e-9);
    assert!((s.reject_rate - 1.0).abs() < 1e-9);
    // The time to a 503 has its own statistics.
    assert!(
        s.reject_avg_ms > 0.0 && s.reject_p50_ms <= s.reject_p99_ms,
        "{s}"
    );
    assert_eq!((s.p50_ms, s.avg_ms), (0.0, 0.0));
    assert_eq!(s.client_success_users, 2);
    assert_eq!(s.client_success_avg, 0.0);
}

#[test]
fn chunked_and_close_delimited_bodies_are_read_fully() {
    let addr = misbehaving_server(|mut s| {
        if read_request(&mut s) {
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n",
            );
        }
        if read_request(&mut s) {
            let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\n1234567");
        }
    });
    let mut a = args_for(addr);
    a.clients = 1;
    a.requests = Some(2);
    let s = run(&a).unwrap();
    assert_eq!((s.served, s.failures), (2, 0), "{s}");
    assert_eq!(s.bytes, 15 + 7);
}

#[test]
fn connection_resets_are_failures() {
    let addr = misbehaving_server(|s| {
        let mut s = s;
        read_request(&mut s);
        // SO_LINGER 0: close() sends RST.
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        use std::os::fd::AsRawFd;
        // SAFETY: valid socket fd and a correctly sized linger struct.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
    });
    let mut a = args_for(addr);
    a.clients = 2;
    a.requests = Some(40);
    let s = run(&a).unwrap();
    assert_eq!((s.attempts, s.served, s.failures), (40, 0, 40), "{s}");
    assert_eq!(s.failure_kinds.io_errors, 40);
}

#[test]
fn silent_server_times_out_within_the_timeout() {
    let addr = misbehaving_server(|mut s| {
        read_request(&mut s);
        std::thread::sleep(Duration::from_secs(5));
    });
    let dir = temp_dir("timeout");
    let out = dir.join("r.csv");
    let mut a = args_for(addr);
    a.clients = 3;
    a.timeout_ms = 200;
    a.duration_s = 1.0;
    a.out = Some(out.clone());
    // The server holds every connection for 5 s without answering: a run that waited
    // for it (rather than for its own timeout) would last that long, and a request
    // that ended any other way would not be a timeout of at least 200 ms.
    let server_hold = Duration::from_secs(5);
    let t0 = Instant::now();
    let s = run(&a).unwrap();
    assert!(t0.elapsed() < server_hold, "the run waited for the server");
    assert_eq!(s.served, 0);
    // Each client went on after a timeout (two 200 ms timeouts fit in the 1 s run).
    assert!(s.failures >= 2 * 3, "{s}");
    assert_eq!(s.failure_kinds.timeouts, s.failures);
    for line in std::fs::read_to_string(&out).unwrap().lines().skip(1) {
        let latency_us: u64 = line.split(',').nth(1).unwrap().parse().unwrap();
        assert!(
            (200_000..server_hold.as_micros() as u64).contains(&latency_us),
            "{line}"
        );
        assert!(line.ends_with(",timeout"));
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn refused_connections_are_connect_failures() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut a = args_for(addr);
    a.clients = 1;
    a.duration_s = 0.3;
    let s = run(&a).unwrap();
    assert!(
        s.failures > 0 && s.failures == s.failure_kinds.connect_errors,
        "{s}"
    );
    // The connect backoff keeps a refused client from spinning.
    assert!(s.failures < 60, "{s}");
}

/// A listener with the smallest accept queue (listen backlog 0: one connection), never
/// accepting: once one connection waits in it, Linux drops every further SYN.
fn full_listener() -> (std::os::fd::OwnedFd, SocketAddr, TcpStream) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor owned here; sockaddr_in is zeroed
    // and then filled with loopback, port 0.
    let (fd, addr) = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let fd = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        assert_eq!(
            libc::bind(raw, (&sa as *const libc::sockaddr_in).cast(), len),
            0
        );
        assert_eq!(libc::listen(raw, 0), 0);
        let mut got = len;
        assert_eq!(
            libc::getsockname(raw, (&mut sa as *mut libc::sockaddr_in).cast(), &mut got),
            0
        );
        (
            fd,
            SocketAddr::from(([127, 0, 0, 1], u16::from_be(sa.sin_port))),
        )
    };
    let held = TcpStream::connect(addr).unwrap();
    (fd, addr, held)
}

#[test]
fn unanswered_connects_are_abandoned_at_the_connect_timeout() {
    let (_listener, addr, _held) = full_listener();
    let mut a = args_for(addr);
    a.clients = 1;
    a.timeout_ms = 5000;
    a.connect_timeout_ms = 200;
    a.duration_s = 1.0;
    let t0 = Instant::now();
    let s = run(&a).unwrap();
    // Without the connect timeout each attempt would wait for SYN retransmissions
    // (1 s, 3 s) up to the 5 s request timeout.
    assert!(t0.elapsed() < Duration::from_secs(3), "{s}");
    assert!(s.failure_kinds.connect_timeouts >= 3, "{s}");
    assert_eq!(s.failures, s.failure_kinds.connect_timeouts, "{s}");
    assert_eq!(s.failure_kinds.timeouts, 0, "{s}");

    a.connect_timeout_ms = a.timeout_ms;
    let e = run(&a).unwrap_err().to_string();
    assert!(e.contains("--connect-timeout-ms"), "{e}");
}

#[test]
fn open_loop_sends_at_the_requested_rate() {
    let h = backend(4, None);
    let mut a = args_for(h.addr());
    a.rate = Some(200.0);
    a.arrivals = Arrivals::Uniform;
    a.duration_s = 1.0;
    let s = run(&a).unwrap();
    assert_eq!(s.mode, "open");
    assert_eq!(s.arrivals.as_deref(), Some("uniform"));
    assert!((180..=205).contains(&s.started), "{s}");
    assert_eq!(s.served + s.inflight_at_end, s.started);
    // Poisson (the default): the count the seeded generator gives for the
    // window, give or take requests that the loaded machine delays.
    let mut gen = ArrivalGen::new(Arrivals::Poisson, 200.0, a.seed);
    let (mut t, mut expected) = (gen.next_gap_s(), 0u64);
    while t < 1.0 {
        expected += 1;
        t += gen.next_gap_s();
    }
    a.arrivals = Arrivals::Poisson;
    let p = run(&a).unwrap();
    assert_eq!(p.arrivals.as_deref(), Some("poisson"));
    assert!(
        p.started.abs_diff(expected) <= 10,
        "{p} expected {expected}"
    );
    assert!((p.offered_rps - p.started as f64).abs() < 1e-9);
}

#[test]
fn zipf_sampler_follows_alpha() {
    let z = ZipfSampler::new(1000, 0.9);
    let mut rng = Rng::new(42);
    let n = 200_000;
    let mut counts = vec![0u32; 1001];
    for _ in 0..n {
        counts[z.sample(&mut rng)] += 1;
    }
    let harmonic: f64 = (1..=1000).map(|k| 1.0 / (k as f64).powf(0.9)).sum();
    let theory1 = 1.0 / harmonic;
    assert!((z.probability(1) - theory1).abs() < 1e-12);
    let share1 = counts[1] as f64 / n as f64;
    assert!(
        (share1 - theory1).abs() / theory1 < 0.03,
        "{share1} vs {theory1}"
    );
    let share10 = counts[10] as f64 / n as f64;
    let theory10 = theory1 / 10f64.powf(0.9);
    assert!(
        (share10 - theory10).abs() / theory10 < 0.1,
        "{share10} vs {theory10}"
    );
    assert_eq!(counts[0], 0);
}

#[test]
fn worldcup_trace_loads_with_its_distinct_urls() {
    let path = farside_loadgen::find_data_file(farside_loadgen::trace::WORLDCUP_FILE).unwrap();
    let wc = WorldCupTrace::load(&path).unwrap();
    assert_eq!(wc.sequence.len() as u64 + wc.rows_skipped, 199_999);
    assert!((2700..=2740).contains(&wc.urls.len()), "{}", wc.urls.len());
    assert!(wc.rows_skipped < 100, "{}", wc.rows_skipped);
    let max = *wc.sizes.iter().max().unwrap();
    assert!((2_500_000..3_500_000).contains(&max), "{max}");
    let trace = Trace::worldcup(wc, PathMode::Generated);
    let mut rng = Rng::new(1);
    let first = trace.next(&mut rng);
    assert!(trace.objects[first].target.starts_with("/files/"));
}

#[test]
fn bad_trace_rows_are_skipped_and_counted() {
    let dir = temp_dir("badrows");
    let path = dir.join("t.csv.gz");
    let text = "timestamp,client_id,url,status,size\n\
                1,1,/a.html,200,100\n\
                x,1,/b.html,200,100\n\
                2,1,/b.html,200\n\
                3,1,nourl,200,5\n\
                4,2,/a.html,304,-\n\
                5,2,/c.gif,200,notasize\n\
                6,3,/c.gif,200,7,extra\n\
                7,3,/c.gif,200,70\n";
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&path).unwrap(),
        flate2::Compression::fast(),
    );
    enc.write_all(text.as_bytes()).unwrap();
    enc.finish().unwrap();
    let wc = WorldCupTrace::load(&path).unwrap();
    assert_eq!(wc.rows_skipped, 5);
    assert_eq!(wc.urls, vec!["/a.html", "/c.gif"]);
    assert_eq!(wc.sizes, vec![100, 70]);
    assert_eq!(wc.sequence, vec![0, 0, 1]);
    let missing = WorldCupTrace::load(&dir.join("nope.csv.gz"));
    assert!(missing.is_err());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn docroot_written_for_a_trace_serves_every_request() {
    let dir = temp_dir("docroot");
    let trace = Trace::zipf(50, 0.9, PathMode::Docroot);
    let report = write_docroot(&trace, &dir).unwrap();
    assert_eq!((report.files_written, report.files_skipped), (50, 0));
    // Stamped with the date conditional GETs carry, so exact-match servers answer 304.
    let mtime = std::fs::metadata(dir.join("zipf/1.html"))
        .unwrap()
        .modified()
        .unwrap();
    let mtime_s = mtime
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(mtime_s, farside_loadgen::trace::CONDITIONAL_MTIME_UNIX_S);
    let h = backend(2, Some(dir.clone()));
    let out = dir.join("../farside-loadgen-docroot-records.csv");
    let mut a = args_for(h.addr());
    a.trace = TraceKind::Zipf;
    a.zipf_files = 50;
    a.paths = PathMode::Docroot;
    a.requests = Some(200);
    a.out = Some(out.clone());
    let s = run(&a).unwrap();
    assert_eq!(s.served, 200);
    let csv = std::fs::read_to_string(&out).unwrap();
    assert!(csv.lines().skip(1).all(|l| l.contains(",200,")));
    // Generated mode against a root-less backend: same sizes.
    let h2 = backend(2, None);
    let mut b = args_for(h2.addr());
    b.trace = TraceKind::Zipf;
    b.zipf_files = 50;
    b.requests = Some(200);
    let s2 = run(&b).unwrap();
    assert_eq!(s2.served, 200);
    std::fs::remove_file(out).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn check_root_counts_every_body_that_is_not_its_file() {
    let dir = temp_dir("check-root");
    let trace = Trace::zipf(20, 0.0, PathMode::Docroot);
    write_docroot(&trace, &dir).unwrap();
    // The copy the clients check against differs from the served file in one byte of
    // one object: only requests for that object are wrong.
    let copy = temp_dir("check-root-copy");
    write_docroot(&trace, &copy).unwrap();
    let mut body = std::fs::read(copy.join("zipf/3.html")).unwrap();
    let mid = body.len() / 2;
    body[mid] ^= 1;
    std::fs::write(copy.join("zipf/3.html"), body).unwrap();
    let h = backend(2, Some(dir.clone()));
    let mut a = args_for(h.addr());
    a.trace = TraceKind::Zipf;
    a.zipf_files = 20;
    a.zipf_alpha = 0.0;
    a.paths = PathMode::Docroot;
    a.requests = Some(400);
    a.check_root = Some(dir.clone());
    let s = run(&a).unwrap();
    assert_eq!((s.served, s.failure_kinds.wrong_bodies), (400, 0), "{s}");
    a.check_root = Some(copy.clone());
    let s = run(&a).unwrap();
    let wrong = s.failure_kinds.wrong_bodies;
    // Uniform over 20 objects: object 3 is asked for 20 of 400 times on average.
    assert!(wrong > 0 && wrong < 100, "{wrong} wrong of 400: {s}");
    assert_eq!(s.served + wrong, 400, "{s}");
    assert_eq!(s.failures, wrong, "{s}");
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_dir_all(copy).unwrap();
}

#[test]
fn worldcup_against_generated_backend_is_all_served() {
    let h = backend(4, None);
    let mut a = args_for(h.addr());
    a.trace = TraceKind::Worldcup;
    a.requests = Some(500);
    let s = run(&a).unwrap();
    assert_eq!((s.served, s.failures), (500, 0), "{s}");
}

#[test]
fn completion_window_accounting_obeys_littles_law() {
    // 200 ms responses, 50 ms think: each client completes a request every
    // 250 ms. The warm-up ends mid-request, so counting by start time (the
    // old accounting) loses the requests that straddle it and the one in
    // flight at the end: 3 of 4 per client and second (-25%).
    let (addr, _) = counting_server(slow_handler(Duration::from_millis(200)));
    let mut a = args_for(addr);
    a.clients = 8;
    a.think_ms = 50;
    a.warmup_s = 0.3;
    a.duration_s = 2.0;
    let s = run(&a).unwrap();
    assert_eq!((s.dropped_503, s.failures), (0, 0), "{s}");
    let cycle_s = (s.avg_ms + a.think_ms as f64) / 1000.0;
    let little = a.clients as f64 / cycle_s;
    // The window's two ends cut each client's cycle of R + Z at an arbitrary phase, so
    // a client completes one request more or less in it than Little's law's mean: the
    // bound is one cycle in the window (12.5 % here), well inside the old accounting's
    // -25 %, and it holds however slow a busy host makes the responses.
    let bound = cycle_s / a.duration_s;
    assert!(
        (s.tps - little).abs() / little < bound,
        "tps {} vs N/(R+Z) {little} (bound {bound}): {s}",
        s.tps
    );
    assert_eq!(s.series.iter().map(|x| x.served).sum::<u64>(), s.served);
    assert!((s.goodput_rps - s.tps).abs() < 1e-9);
    assert_eq!(s.client_success_users, 8);
    assert_eq!((s.client_success_min, s.client_success_avg), (1.0, 1.0));
}

#[test]
fn requests_in_flight_at_the_end_are_reported_not_dropped_silently() {
    // 400 ms responses in a 1 s window: completions at 0.4 s and 0.8 s,
    // the third request is in flight when the run ends.
    let (addr, _) = counting_server(slow_handler(Duration::from_millis(400)));
    let mut a = args_for(addr);
    a.clients = 3;
    a.duration_s = 1.0;
    let s = run(&a).unwrap();
    assert_eq!(s.served, 6, "{s}");
    assert_eq!(s.inflight_at_end, 3, "{s}");
    assert_eq!(s.started, 9, "{s}");
    assert_eq!(s.started, s.attempts + s.inflight_at_end);
}

#[test]
fn backoff_is_full_jitter_within_its_bounds() {
    let base = Duration::from_millis(50);
    let cap = Duration::from_millis(2000);
    let mut rng = Rng::new(3);
    for k in 0..8u32 {
        let bound = (base * 2u32.pow(k)).min(cap);
        let draws: Vec<Duration> = (0..4000)
            .map(|_| backoff_delay(k, None, base, cap, &mut rng))
            .collect();
        assert!(draws.iter().all(|d| *d <= bound), "k={k}");
        let (min, max) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
        // Uniform over the whole range, not a fixed pause.
        assert!(
            *min < bound / 50 && *max > bound * 49 / 50,
            "k={k} {min:?} {max:?}"
        );
        let mean = draws.iter().sum::<Duration>() / draws.len() as u32;
        let half = bound / 2;
        assert!(mean.abs_diff(half) < bound / 20, "k={k} mean {mean:?}");
    }
    // Retry-After sets the range, still capped.
    for (ra, bound) in [(1, 1000), (10, 2000)] {
        let ra = Some(Duration::from_secs(ra));
        let bound = Duration::from_millis(bound);
        let draws: Vec<Duration> = (0..2000)
            .map(|_| backoff_delay(0, ra, base, cap, &mut rng))
            .collect();
        assert!(draws.iter().all(|d| *d <= bound));
        assert!(*draws.iter().max().unwrap() > bound * 49 / 50);
    }
}

#[test]
fn leave_replaces_the_user_and_retry_keeps_the_connection() {
    let (addr, accepted) = counting_server(reject_all);
    let mut a = args_for(addr);
    a.clients = 2;
    a.requests = Some(40);
    a.on_reject = Some(OnReject::Leave);
    let s = run(&a).unwrap();
    assert_eq!((s.dropped_503, s.users_left), (40, 40), "{s}");
    assert_eq!(s.on_reject, "leave");
    // Each user sent one request on its own connection, then gave up.
    assert_eq!(accepted.load(Ordering::SeqCst), 40);
    assert_eq!(s.client_success_users, 40);

    let (addr, accepted) = counting_server(reject_all);
    let mut b = args_for(addr);
    b.clients = 2;
    b.requests = Some(40);
    b.on_reject = Some(OnReject::Retry);
    let s = run(&b).unwrap();
    assert_eq!((s.dropped_503, s.users_left), (40, 0), "{s}");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[test]
fn backoff_is_the_default_and_slows_rejected_clients() {
    let (addr, _) = counting_server(reject_all);
    let mut a = args_for(addr);
    a.clients = 2;
    a.duration_s = 1.0;
    let s = run(&a).unwrap();
    assert_eq!(s.on_reject, "backoff");
    // Without back-off two clients get thousands of 503s per second on
    // loopback; with a 50 ms base doubling to 2 s, a few dozen at most.
    assert!(s.dropped_503 > 2 && s.dropped_503 < 60, "{s}");
    // The deprecated flag still works: a fixed pause.
    let mut b = args_for(addr);
    b.clients = 2;
    b.duration_s = 0.5;
    b.reject_think_ms = Some(100);
    let s = run(&b).unwrap();
    assert_eq!(s.on_reject, "fixed");
    assert!((8..=12).contains(&s.dropped_503), "{s}");
    b.on_reject = Some(OnReject::Leave);
    assert!(run(&b).is_err());
}

#[test]
fn poisson_arrivals_have_the_rate_and_exponential_gaps() {
    let rate = 250.0;
    let mut gen = ArrivalGen::new(Arrivals::Poisson, rate, 7);
    let gaps: Vec<f64> = (0..200_000).map(|_| gen.next_gap_s()).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    assert!((mean * rate - 1.0).abs() < 0.01, "mean gap {mean}");
    // Exponential: sd equals the mean; P(gap > mean) = 1/e.
    let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
    assert!((var.sqrt() / mean - 1.0).abs() < 0.02);
    let above = gaps.iter().filter(|g| **g > mean).count() as f64 / gaps.len() as f64;
    assert!((above - (-1.0f64).exp()).abs() < 0.01, "{above}");
    // Arrivals per second: Poisson(rate), so the variance equals the mean.
    let mut per_s = vec![0u32; 800];
    let mut t = 0.0;
    for g in &gaps {
        t += g;
        if (t as usize) < per_s.len() {
            per_s[t as usize] += 1;
        }
    }
    let m = per_s.iter().map(|c| *c as f64).sum::<f64>() / per_s.len() as f64;
    let v = per_s.iter().map(|c| (*c as f64 - m).powi(2)).sum::<f64>() / per_s.len() as f64;
    assert!(
        (m / rate - 1.0).abs() < 0.01 && (v / m - 1.0).abs() < 0.15,
        "{m} {v}"
    );
    // Seeded: the same seed, the same arrivals; another seed, others.
    let mut again = ArrivalGen::new(Arrivals::Poisson, rate, 7);
    assert_eq!(again.next_gap_s(), gaps[0]);
    let mut other = ArrivalGen::new(Arrivals::Poisson, rate, 8);
    assert_ne!(other.next_gap_s(), gaps[0]);
    let mut uniform = ArrivalGen::new(Arrivals::Uniform, rate, 7);
    assert_eq!(uniform.next_gap_s(), 1.0 / rate);
}

#[test]
fn open_loop_users_leave_on_rejection_and_overflow_is_counted() {
    let (addr, accepted) = counting_server(reject_all);
    let mut a = args_for(addr);
    a.rate = Some(100.0);
    a.session_requests = 3;
    a.duration_s = 0.5;
    let s = run(&a).unwrap();
    assert!(s.dropped_503 > 20, "{s}");
    // One request per user: rejected at once, the user leaves.
    assert_eq!(s.users_left, s.dropped_503);
    assert_eq!(s.skipped_after_leave, 2 * s.users_left);
    assert_eq!(accepted.load(Ordering::SeqCst) as u64, s.started);

    // One user at a time against 300 ms responses: most arrivals are shed.
    let (addr, _) = counting_server(slow_handler(Duration::from_millis(300)));
    let mut b = args_for(addr);
    b.rate = Some(100.0);
    b.open_users_max = 1;
    b.duration_s = 0.7;
    let s = run(&b).unwrap();
    assert!(s.shed_by_client > 30, "{s}");
    assert_eq!(s.shed_by_client, s.failure_kinds.overflow);
    assert!(s.served <= 3, "{s}");
    assert_eq!(s.started, s.attempts + s.inflight_at_end);
}

/// Writes a small World Cup-format trace: (time, client, url, status, size).
fn tiny_trace(tag: &str, rows: &[(u64, u64, &str, u16, u64)]) -> std::path::PathBuf {
    let dir = temp_dir(tag);
    let path = dir.join("t.csv");
    let mut text = String::from("timestamp,client_id,url,status,size\n");
    for (t, c, u, st, sz) in rows {
        text.push_str(&format!("{t},{c},{u},{st},{sz}\n"));
    }
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn worldcup_start_row_is_seeded_over_the_whole_sample() {
    let mut a = LoadgenArgs::new("127.0.0.1:1");
    a.trace = TraceKind::Worldcup;
    let starts: Vec<usize> = (1..=40)
        .map(|seed| {
            a.seed = seed;
            a.build_trace().unwrap().start_row()
        })
        .collect();
    a.seed = 1;
    let t1 = a.build_trace().unwrap();
    assert_eq!(t1.start_row(), starts[0], "same seed, same start");
    assert_ne!(starts[0], starts[1], "another seed, another start");
    let rows = t1.replay_rows();
    assert!(rows > 199_000);
    // Spread over the whole sample, not its first few thousand rows.
    assert!(*starts.iter().max().unwrap() > rows * 3 / 4, "{starts:?}");
    assert!(*starts.iter().min().unwrap() < rows / 4, "{starts:?}");
    let mut rng = Rng::new(0);
    a.seed = 2;
    let t2 = a.build_trace().unwrap();
    let firsts = |t: &Trace, rng: &mut Rng| (0..20).map(|_| t.next(rng)).collect::<Vec<_>>();
    assert_ne!(firsts(&t1, &mut rng), firsts(&t2, &mut rng));
}

#[test]
fn worldcup_replay_keeps_timing_sessions_and_sends_conditional_gets() {
    let path = tiny_trace(
        "wc304",
        &[
            (100, 7, "/a.html", 200, 10),
            (100, 7, "/b.gif", 304, 0),
            (101, 9, "/a.html", 304, 0),
            (102, 9, "/c.gif", 200, 5),
        ],
    );
    let wc = WorldCupTrace::load(&path).unwrap();
    assert_eq!(wc.not_modified, vec![false, true, true, false]);
    assert_eq!(wc.clients, vec![0, 0, 1, 1]);
    // Timing: rows of one logged second spread over it; the replay wraps
    // after the last row's second.
    let trace = Trace::worldcup(wc, PathMode::Generated);
    let offsets: Vec<u64> = (0..8)
        .map(|k| trace.replay_row(k).unwrap().offset_ms)
        .collect();
    assert_eq!(offsets, vec![0, 500, 1000, 2000, 3000, 3500, 4000, 5000]);
    assert!((trace.replay_rate().unwrap() - 4.0 / 3.0).abs() < 1e-9);

    // Closed loop: one client replays trace client 7's session, then 9's,
    // each on a new connection; the 304 rows go out with If-Modified-Since.
    let conditional = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&conditional);
    let (addr, accepted) = counting_server(move |mut s| {
        while let Some(head) = read_head(&mut s) {
            let resp: &[u8] = if head.contains("If-Modified-Since: Thu, 30 Apr 1998") {
                seen.fetch_add(1, Ordering::SeqCst);
                b"HTTP/1.1 304 Not Modified\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            };
            if s.write_all(resp).is_err() {
                return;
            }
        }
    });
    let mut a = args_for(addr);
    a.trace = TraceKind::Worldcup;
    a.trace_file = Some(path.clone());
    a.clients = 1;
    a.requests = Some(4);
    let s = run(&a).unwrap();
    assert_eq!((s.served, s.failures), (4, 0), "{s}");
    assert_eq!((s.conditional_requests, s.not_modified), (2, 2), "{s}");
    assert_eq!(conditional.load(Ordering::SeqCst), 2);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "one connection per session"
    );

    // Open loop: the logged timing at 10x from the seeded start row.
    let mut b = args_for(addr);
    b.trace = TraceKind::Worldcup;
    b.trace_file = Some(path.clone());
    b.time_scale = Some(10.0);
    b.duration_s = 0.575;
    let seeded = b.build_trace().unwrap();
    let due: Vec<_> = (0..)
        .map(|k| seeded.replay_row(k).unwrap())
        .take_while(|r| (r.offset_ms as f64) / 10.0 < 575.0)
        .collect();
    assert!(due.len() >= 7);
    let s = run(&b).unwrap();
    assert_eq!(s.arrivals.as_deref(), Some("trace"));
    assert_eq!((s.mode.as_str(), s.time_scale), ("open", Some(10.0)));
    assert_eq!(s.started, due.len() as u64, "{s}");
    assert_eq!(s.served + s.inflight_at_end, s.started, "{s}");
    let due_conditional = due.iter().filter(|r| r.pick.conditional).count() as u64;
    assert_eq!(s.conditional_requests, due_conditional);
    // --rate picks the time scale whose average rate it is (4 rows / 3 s).
    b.time_scale = None;
    b.rate = Some(40.0 / 3.0);
    b.duration_s = 0.2;
    let s = run(&b).unwrap();
    assert!((s.time_scale.unwrap() - 10.0).abs() < 1e-9, "{s}");
    assert!((s.rate.unwrap() - 40.0 / 3.0).abs() < 1e-9);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn repeated_runs_merge_exactly() {
    let h = backend(4, None);
    let mut a = args_for(h.addr());
    a.clients = 4;
    a.requests = Some(200);
    let r1 = run(&a).unwrap();
    a.seed = 2;
    let r2 = run(&a).unwrap();
    let m = Summary::merge(&[r1.clone(), r2.clone()]).unwrap();
    assert_eq!(m.runs, 2);
    assert_eq!(m.served, r1.served + r2.served);
    assert!((m.duration_s - (r1.duration_s + r2.duration_s)).abs() < 1e-9);
    assert!((m.tps - m.served as f64 / m.duration_s).abs() < 1e-6);
    let lo = r1.p99_ms.min(r2.p99_ms);
    let hi = r1.p99_ms.max(r2.p99_ms);
    assert!(m.p99_ms >= lo && m.p99_ms <= hi, "{} {lo} {hi}", m.p99_ms);
    assert_eq!(
        farside_loadgen::summary::decode_hist(&m.latency_hist_v2)
            .unwrap()
            .len(),
        m.served
    );
    assert_eq!(m.series.len(), r1.series.len() + r2.series.len());
    // Round trip through JSON (as the lab stores repeats).
    let json = serde_json::to_string(&r1).unwrap();
    let back: Summary = serde_json::from_str(&json).unwrap();
    assert_eq!(back.latency_hist_v2, r1.latency_hist_v2);
    let m2 = Summary::merge(&[back, r2]).unwrap();
    assert_eq!((m2.served, m2.p99_ms), (m.served, m.p99_ms));
    assert!(Summary::merge(&[]).is_err());
}

#[test]
fn random_source_ports_spread_over_the_ephemeral_range() {
    let ports = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&ports);
    let (addr, _) = counting_server(move |mut s| {
        seen.lock().unwrap().push(s.peer_addr().unwrap().port());
        if read_request(&mut s) {
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    let mut a = args_for(addr);
    a.clients = 4;
    a.no_keepalive = true;
    a.requests = Some(400);
    a.source_ports = farside_loadgen::SourcePorts::Random;
    let s = run(&a).unwrap();
    assert_eq!(s.served, 400, "{s}");
    assert_eq!(s.source_ports, "random");
    let picker = farside_loadgen::PortPicker::from_host(1).unwrap();
    let (lo, hi) = picker.range();
    let ports = ports.lock().unwrap().clone();
    assert_eq!(ports.len(), 400);
    assert!(ports.iter().all(|p| (lo..=hi).contains(p)), "{ports:?}");
    // Uniform over the range: each quarter holds about 100 of the 400 (the kernel's
    // own choice walks the range in steps of two, all 400 in one short stretch).
    let span = u32::from(hi - lo) + 1;
    let mut quarters = [0u32; 4];
    for p in &ports {
        quarters[(u32::from(p - lo) * 4 / span) as usize] += 1;
    }
    assert!(
        quarters.iter().all(|&q| (60..=140).contains(&q)),
        "{quarters:?}"
    );
}

#[test]
fn an_open_loop_run_closes_every_connection_it_leaves_unanswered_when_it_ends() {
    // A server that takes every connection and never answers: whatever the run sent is
    // still outstanding when it ends. The run must abandon all of it (close each
    // connection) before it returns, so nothing it started can load the server after it
    // (the lab's next point would queue behind it).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted: Arc<std::sync::Mutex<Vec<TcpStream>>> = Arc::default();
    let acc = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            acc.lock().unwrap().push(s);
        }
    });
    let mut a = args_for(addr);
    a.rate = Some(200.0);
    a.duration_s = 0.5;
    a.timeout_ms = 60_000;
    let s = run(&a).unwrap();
    assert_eq!(s.served, 0, "{s}");
    assert!(s.inflight_at_end > 0, "{s}");
    // A last connection of our own: once the acceptor has it, it has taken every
    // connection the run made before it (one accept queue, in order).
    let sentinel = TcpStream::connect(addr).unwrap();
    let me = sentinel.local_addr().unwrap();
    let theirs = loop {
        let mut v = accepted.lock().unwrap();
        if let Some(i) = v.iter().position(|c| c.peer_addr().ok() == Some(me)) {
            v.remove(i);
            break std::mem::take(&mut *v);
        }
        drop(v);
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        theirs.len() as u64 >= s.inflight_at_end,
        "{} {s}",
        theirs.len()
    );
    for mut c in theirs {
        // Its request (if the run got to send it), then end of stream: the client closed
        // it. A connection left open would block here until the (generous) bound.
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = [0u8; 4096];
        let mut got = 0;
        loop {
            match c.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => panic!("connection still open after the run ({got} bytes read): {e}"),
            }
        }
    }
}
