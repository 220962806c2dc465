//! Behaviour of the test back-end over real loopback sockets (port 0).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use farside_backend::{
    generated_byte, spawn, BackendArgs, Handle, CPU_NS_PER_BYTE_DEFAULT, CPU_US_PER_REQUEST_DEFAULT,
};

fn start(workers: usize) -> (SocketAddr, Handle) {
    let args = BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        workers,
        header_timeout_ms: 2000,
        ..BackendArgs::default()
    };
    spawn(args).expect("spawn backend")
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one response framed by Content-Length (the back-end always sends it).
fn read_reply(s: &mut TcpStream, head_only: bool) -> Reply {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).unwrap();
        assert_eq!(
            n,
            1,
            "connection closed mid-head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.push(byte[0]);
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    resp.parse(&buf).unwrap();
    let status = resp.code.unwrap();
    let headers: Vec<(String, String)> = resp
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .unwrap()
        .1
        .parse()
        .unwrap();
    let mut body = vec![0u8; if head_only { 0 } else { len }];
    s.read_exact(&mut body).unwrap();
    Reply {
        status,
        headers,
        body,
    }
}

fn get(s: &mut TcpStream, path: &str) -> Reply {
    write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    read_reply(s, false)
}

#[test]
fn serves_generated_file_with_correct_length_and_content() {
    let (addr, _h) = start(2);
    let mut s = connect(addr);
    let r = get(&mut s, "/file16k");
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 16384);
    assert!(r
        .body
        .iter()
        .enumerate()
        .all(|(i, b)| *b == generated_byte(i as u64)));
    assert_eq!(
        r.header("X-Farside-Backend"),
        Some(addr.to_string().as_str())
    );
    let r = get(&mut s, "/files/100000/zipf-7");
    assert_eq!(r.body.len(), 100_000);
    let r = get(&mut s, "/files/0");
    assert_eq!((r.status, r.body.len()), (200, 0));
}

#[test]
fn serves_static_file_from_root_and_rejects_traversal() {
    let dir = std::env::temp_dir().join(format!("farside-backend-test-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/a.html"), vec![b'x'; 70_000]).unwrap();
    std::fs::write(dir.join("index.html"), b"home").unwrap();
    let args = BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        root: Some(dir.clone()),
        workers: 1,
        ..BackendArgs::default()
    };
    let (addr, _h) = spawn(args).unwrap();
    let mut s = connect(addr);
    let r = get(&mut s, "/sub/a.html");
    assert_eq!((r.status, r.body.len()), (200, 70_000));
    assert_eq!(r.header("Content-Type"), Some("text/html"));
    let r = get(&mut s, "/sub/%61.html?x=1");
    assert_eq!((r.status, r.body.len()), (200, 70_000));
    assert_eq!(get(&mut s, "/").body, b"home");
    assert_eq!(get(&mut s, "/nope.html").status, 404);
    assert_eq!(get(&mut s, "/sub/../../etc/passwd").status, 400);
    let mut s = connect(addr);
    assert_eq!(get(&mut s, "/sub/%2e%2e/%2e%2e/etc/passwd").status, 400);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn keep_alive_serves_three_requests_on_one_connection() {
    let (addr, _h) = start(1);
    let mut s = connect(addr);
    for _ in 0..3 {
        let r = get(&mut s, "/files/10");
        assert_eq!((r.status, r.body.len()), (200, 10));
        assert_eq!(r.header("Connection"), Some("keep-alive"));
    }
    // HEAD: same headers, no body.
    write!(s, "HEAD /file16k HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let r = read_reply(&mut s, true);
    assert_eq!(r.header("Content-Length"), Some("16384"));
    assert_eq!(get(&mut s, "/healthz").status, 200);
}

#[test]
fn keepalive_max_closes_connection() {
    let args = BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        keepalive_max: 2,
        ..BackendArgs::default()
    };
    let (addr, _h) = spawn(args).unwrap();
    let mut s = connect(addr);
    assert_eq!(
        get(&mut s, "/healthz").header("Connection"),
        Some("keep-alive")
    );
    assert_eq!(get(&mut s, "/healthz").header("Connection"), Some("close"));
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).unwrap(), 0);
}

#[test]
fn error_statuses() {
    let (addr, _h) = start(2);
    let mut s = connect(addr);
    s.write_all(b"GARBAGE\r\n\r\n").unwrap();
    assert_eq!(read_reply(&mut s, false).status, 400);

    let mut s = connect(addr);
    let big = format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(20_000));
    // The server may close before reading everything; ignore write errors.
    let _ = s.write_all(big.as_bytes());
    assert_eq!(read_reply(&mut s, false).status, 431);

    let mut s = connect(addr);
    assert_eq!(get(&mut s, "/missing").status, 404);
    assert_eq!(get(&mut s, "/files/notanumber").status, 404);

    let mut s = connect(addr);
    s.write_all(b"BREW /pot HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut s, false).status, 501);
}

#[test]
fn one_worker_makes_second_connection_wait() {
    let (addr, _h) = start(1);
    let mut first = connect(addr);
    assert_eq!(get(&mut first, "/healthz").status, 200);
    // The only worker now holds `first` (kept alive). A second connection is
    // accepted by the kernel into the backlog but not served.
    let mut second = connect(addr);
    second
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    second
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut byte = [0u8; 1];
    let err = second.read(&mut byte).unwrap_err();
    assert!(matches!(
        err.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ));
    // Closing the first frees the worker, which then serves the second.
    drop(first);
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(read_reply(&mut second, false).status, 200);
}

#[test]
fn cgi_work_burns_at_least_the_requested_cpu() {
    let (addr, _h) = start(1);
    let mut s = connect(addr);
    let t0 = Instant::now();
    let r = get(&mut s, "/cgi/work?us=30000");
    assert_eq!(r.status, 200);
    assert!(t0.elapsed() >= Duration::from_millis(30));
    let text = String::from_utf8(r.body).unwrap();
    let burned: u64 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(burned >= 30_000, "{text}");
    assert_eq!(get(&mut s, "/cgi/work?us=bogus").status, 400);
}

#[test]
fn stop_returns_even_with_idle_keepalive_connection() {
    let (addr, h) = start(2);
    let mut s = connect(addr);
    assert_eq!(get(&mut s, "/healthz").status, 200);
    let t0 = Instant::now();
    h.stop();
    assert!(t0.elapsed() < Duration::from_secs(1));
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).unwrap_or(0), 0);
}

/// A fresh docroot under the system temp dir, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "farside-backend-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start_root(
    root: &std::path::Path,
    per_request_us: u64,
    per_byte_ns: f64,
) -> (SocketAddr, Handle) {
    let args = BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        root: Some(root.to_path_buf()),
        workers: 1,
        cpu_us_per_request: per_request_us,
        cpu_ns_per_byte: per_byte_ns,
        header_timeout_ms: 2000,
        ..BackendArgs::default()
    };
    spawn(args).expect("spawn backend")
}

/// Bytes that differ from `write_docroot`'s alphabet and between seeds.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn cpu_us(r: &Reply) -> u64 {
    r.header("X-Farside-Cpu-Us")
        .expect("X-Farside-Cpu-Us header")
        .parse()
        .unwrap()
}

/// Median of the CPU µs the server reports for `n` GETs of `path`.
fn median_cpu_us(s: &mut TcpStream, path: &str, n: usize) -> u64 {
    let mut v: Vec<u64> = (0..n)
        .map(|_| {
            let r = get(s, path);
            assert_eq!(r.status, 200, "{path}");
            cpu_us(&r)
        })
        .collect();
    v.sort_unstable();
    v[n / 2]
}

#[test]
fn cpu_cost_grows_with_the_bytes_served() {
    let dir = TempDir::new("cost");
    std::fs::write(dir.0.join("small"), noise(1024, 1)).unwrap();
    std::fs::write(dir.0.join("large"), noise(1 << 20, 2)).unwrap();

    // The model: 100 µs + 20 ns/B, so 1 MiB costs ≥ 100 + 20,971 µs.
    let (addr, _h) = start_root(&dir.0, 100, 20.0);
    let mut s = connect(addr);
    let small = median_cpu_us(&mut s, "/small", 3);
    let large = median_cpu_us(&mut s, "/large", 3);
    assert!((100..2_000).contains(&small), "small {small} µs");
    assert!(large >= 100 + 20_971, "large {large} µs");
    // HEAD sends no body: the per-request part only.
    write!(s, "HEAD /large HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let head = read_reply(&mut s, true);
    assert_eq!(head.header("Content-Length"), Some("1048576"));
    assert!(
        (100..2_000).contains(&cpu_us(&head)),
        "HEAD {}",
        cpu_us(&head)
    );

    // With no emulated cost, reading 1 MiB from disk is still real work.
    let (addr, _h) = start_root(&dir.0, 0, 0.0);
    let mut s = connect(addr);
    let small = median_cpu_us(&mut s, "/small", 5);
    let large = median_cpu_us(&mut s, "/large", 5);
    assert!(
        large > small,
        "read cost: large {large} µs, small {small} µs"
    );
}

#[test]
fn static_and_cgi_requests_report_a_hundredfold_cost_difference() {
    let dir = TempDir::new("mixed");
    std::fs::write(dir.0.join("file16k"), noise(16 * 1024, 3)).unwrap();
    // The default cost model: a static file costs what serving it really costs.
    let (addr, _h) = start_root(&dir.0, CPU_US_PER_REQUEST_DEFAULT, CPU_NS_PER_BYTE_DEFAULT);
    let mut s = connect(addr);
    let static_us = median_cpu_us(&mut s, "/file16k", 5);
    let r = get(&mut s, "/cgi/work?us=5000");
    assert_eq!(r.status, 200);
    let cgi_us = cpu_us(&r);
    assert!(cgi_us >= 5000, "cgi {cgi_us} µs");
    // ≈ 30 µs against 5 ms; a busy machine may inflate the static side's cache misses.
    assert!(
        cgi_us >= 20 * static_us,
        "static {static_us} µs, cgi {cgi_us} µs"
    );
}

#[test]
fn files_are_read_from_disk_byte_exact_on_every_request() {
    let dir = TempDir::new("exact");
    // Empty, buffered, and larger than the 1 MiB buffer (streamed in chunks).
    let sizes = [0usize, 1000, 200_000, (1 << 20) + 12_345];
    for (i, n) in sizes.iter().enumerate() {
        std::fs::write(dir.0.join(format!("f{i}")), noise(*n, i as u64)).unwrap();
    }
    let (addr, _h) = start_root(&dir.0, 0, 0.0);
    let mut s = connect(addr);
    for (i, n) in sizes.iter().enumerate() {
        let r = get(&mut s, &format!("/f{i}"));
        assert_eq!(r.status, 200);
        assert!(r.body == noise(*n, i as u64), "f{i} differs");
    }
    // Same size, new content: the server reads the file again, it caches nothing.
    for (i, n) in sizes.iter().enumerate() {
        std::fs::write(dir.0.join(format!("f{i}")), noise(*n, 100 + i as u64)).unwrap();
        let r = get(&mut s, &format!("/f{i}"));
        assert!(r.body == noise(*n, 100 + i as u64), "f{i} not re-read");
    }
}

#[test]
fn if_modified_since_not_older_than_the_file_gives_304_without_body() {
    let dir = TempDir::new("ims");
    let path = dir.0.join("page.html");
    std::fs::write(&path, noise(5000, 4)).unwrap();
    let mtime = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000); // 2023-11-14 22:13:20
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let (addr, _h) = start_root(&dir.0, 0, 0.0);
    let mut s = connect(addr);
    let r = get(&mut s, "/page.html");
    assert_eq!(r.status, 200);
    let last_modified = r.header("Last-Modified").unwrap().to_string();
    assert_eq!(last_modified, "Tue, 14 Nov 2023 22:13:20 GMT");

    let conditional = |s: &mut TcpStream, since: &str| {
        write!(
            s,
            "GET /page.html HTTP/1.1\r\nHost: t\r\nIf-Modified-Since: {since}\r\n\r\n"
        )
        .unwrap();
        // A 304 carries no Content-Length and no body: read the head only.
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            assert_eq!(s.read(&mut byte).unwrap(), 1);
            buf.push(byte[0]);
        }
        let head = String::from_utf8(buf).unwrap();
        let status: u16 = head[9..12].parse().unwrap();
        if status == 200 {
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .unwrap()
                .parse()
                .unwrap();
            let mut body = vec![0u8; len];
            s.read_exact(&mut body).unwrap();
        }
        (status, head)
    };
    // Same date, a later one, and the obsolete asctime form: not modified.
    for since in [
        last_modified.as_str(),
        "Wed, 15 Nov 2023 00:00:00 GMT",
        "Tue Nov 14 22:13:20 2023",
    ] {
        let (status, head) = conditional(&mut s, since);
        assert_eq!(status, 304, "{since}: {head}");
        assert!(!head.contains("Content-Length"), "{head}");
        assert!(head.contains("Last-Modified: Tue, 14 Nov 2023 22:13:20 GMT"));
    }
    // One second earlier, or an invalid date (ignored): the full file.
    for since in ["Tue, 14 Nov 2023 22:13:19 GMT", "last tuesday"] {
        assert_eq!(conditional(&mut s, since).0, 200, "{since}");
    }
    // The connection's framing survived the 304s.
    assert_eq!(get(&mut s, "/page.html").body, noise(5000, 4));
    // A modified file is sent again.
    std::fs::write(&path, noise(5000, 5)).unwrap();
    assert_eq!(conditional(&mut s, &last_modified).0, 200);
}

#[test]
fn bad_paths_are_refused() {
    let dir = TempDir::new("paths");
    let root = dir.0.join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(dir.0.join("secret"), b"outside").unwrap();
    std::fs::write(root.join("sub/ok"), b"inside").unwrap();
    std::os::unix::fs::symlink(dir.0.join("secret"), root.join("escape")).unwrap();
    std::os::unix::fs::symlink(root.join("sub/ok"), root.join("alias")).unwrap();
    let (addr, _h) = start_root(&root, 0, 0.0);
    for (path, status) in [
        ("/../secret", 400),
        ("/sub/../../secret", 400),
        ("/%2e%2e/secret", 400),
        ("/sub/%2E%2e/%2e%2E/secret", 400),
        ("/sub/..%2f..%2fsecret", 400),
        ("/sub/%00ok", 400),
        ("/sub/%zz", 400),
        ("/escape", 403),
        ("/alias", 200),
        ("/sub/ok", 200),
        ("/sub/./ok", 200),
    ] {
        // Refusals close the connection: one connection per request.
        let mut s = connect(addr);
        let r = get(&mut s, path);
        assert_eq!(r.status, status, "{path}");
        assert!(r.body != b"outside", "{path}");
    }
}

#[test]
fn static_cpu_us_is_the_deprecated_name_of_cpu_us_per_request() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BackendArgs,
    }
    let cli = Cli::try_parse_from(["t", "--static-cpu-us", "77"]).unwrap();
    assert_eq!(cli.args.cpu_us_per_request, 77);
    let cli =
        Cli::try_parse_from(["t", "--cpu-us-per-request", "5", "--cpu-ns-per-byte", "3"]).unwrap();
    assert_eq!(
        (cli.args.cpu_us_per_request, cli.args.cpu_ns_per_byte),
        (5, 3.0)
    );
    let cli = Cli::try_parse_from(["t", "--cpu-ns-per-byte", "0.37"]).unwrap();
    assert_eq!(cli.args.cpu_ns_per_byte, 0.37);
    for bad in ["5000", "-1", "NaN", "inf"] {
        let flag = format!("--cpu-ns-per-byte={bad}");
        let cli = Cli::try_parse_from(["t", flag.as_str()]).unwrap();
        let err = cli.args.validate().unwrap_err();
        assert!(err.contains("--cpu-ns-per-byte"), "{bad}: {err}");
    }
}
