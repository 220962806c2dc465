//! Load generator behaviour against farside-backend and tiny misbehaving
//! servers, all on loopback port 0.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use farside_loadgen::{
    run, write_docroot, LoadgenArgs, PathMode, Rng, Trace, TraceKind, WorldCupTrace, ZipfSampler,
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

/// Reads one request head (up to the blank line); false on EOF.
fn read_request(s: &mut TcpStream) -> bool {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => return false,
        }
    }
    true
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
    let s = run(&a).unwrap();
    assert_eq!(
        (s.attempts, s.served, s.dropped_503, s.failures),
        (50, 0, 50, 0)
    );
    assert!((s.drop_rate - 1.0).abs() < 1e-9);
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
    let t0 = Instant::now();
    let s = run(&a).unwrap();
    assert!(t0.elapsed() < Duration::from_millis(1600));
    assert_eq!(s.served, 0);
    assert!(s.failures >= 12, "{s}");
    assert_eq!(s.failure_kinds.timeouts, s.failures);
    for line in std::fs::read_to_string(&out).unwrap().lines().skip(1) {
        let latency_us: u64 = line.split(',').nth(1).unwrap().parse().unwrap();
        assert!((200_000..300_000).contains(&latency_us), "{line}");
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

#[test]
fn open_loop_sends_at_the_requested_rate() {
    let h = backend(4, None);
    let mut a = args_for(h.addr());
    a.rate = Some(200.0);
    a.duration_s = 1.0;
    let s = run(&a).unwrap();
    assert_eq!(s.mode, "open");
    assert!((180..=205).contains(&s.attempts), "{s}");
    assert_eq!(s.served, s.attempts);
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
fn worldcup_against_generated_backend_is_all_served() {
    let h = backend(4, None);
    let mut a = args_for(h.addr());
    a.trace = TraceKind::Worldcup;
    a.requests = Some(500);
    let s = run(&a).unwrap();
    assert_eq!((s.served, s.failures), (500, 0), "{s}");
}
