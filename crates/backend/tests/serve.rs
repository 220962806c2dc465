//! Behaviour of the test back-end over real loopback sockets (port 0).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use farside_backend::{generated_byte, spawn, BackendArgs, Handle};

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
