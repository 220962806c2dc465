//! `--adopt-socket`: connections handed over by SCM_RIGHTS are served like accepted
//! ones (keep-alive, POST /digest), bad datagrams are dropped without harm, and the
//! listener keeps working beside the adoption socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::Duration;

use farside_backend::{adopt, generated_byte, spawn, BackendArgs};

const TIMEOUT: Duration = Duration::from_secs(10);

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("farside-adopt-{}-{name}", std::process::id()))
}

fn fnv(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Reads one response: (status line, headers lower-cased, body).
fn read_response(r: &mut impl BufRead) -> (String, Vec<(String, String)>, Vec<u8>) {
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let mut headers = Vec::new();
    loop {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        if l == "\r\n" {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).unwrap();
    (status, headers, body)
}

/// A connected pair: (client side, server side).
fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

#[test]
fn adopted_connections_are_served_with_keep_alive_and_post_digest() {
    let path = temp_path("serve");
    let (addr, handle) = spawn(BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        workers: 2,
        adopt_socket: Some(path.clone()),
        ..BackendArgs::default()
    })
    .unwrap();
    let via = UnixDatagram::unbound().unwrap();
    let (client, server_side) = pair();
    client.set_read_timeout(Some(TIMEOUT)).unwrap();
    // Request bytes already queued before the hand-over are served too.
    let post: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut w = client.try_clone().unwrap();
    w.write_all(b"GET /files/70000 HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    adopt::send(&via, &path, server_side.as_raw_fd(), TIMEOUT).unwrap();
    drop(server_side);
    let body = post.clone();
    let writer = std::thread::spawn(move || {
        write!(
            w,
            "POST /digest HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        w.write_all(&body).unwrap();
        w.write_all(b"GET /files/5 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
    });
    let mut r = BufReader::new(client);
    let (status, headers, body) = read_response(&mut r);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(headers
        .iter()
        .any(|(k, v)| k == "x-farside-backend" && *v == addr.to_string()));
    assert_eq!(body.len(), 70_000);
    assert!(body
        .iter()
        .enumerate()
        .all(|(i, &b)| b == generated_byte(i as u64)));
    let (status, _, body) = read_response(&mut r);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(
        String::from_utf8(body).unwrap(),
        format!(
            "fnv1a64={:016x} bytes={}\n",
            fnv(post.iter().copied()),
            post.len()
        )
    );
    let (status, _, body) = read_response(&mut r);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body.len(), 5);
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "server closed after Connection: close");
    writer.join().unwrap();

    // The listener still serves beside the adoption socket.
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(TIMEOUT)).unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (status, _, _) = read_response(&mut BufReader::new(c));
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    handle.stop();
    assert!(!path.exists(), "adoption socket removed on stop");
}

#[test]
fn bad_adoption_datagrams_are_dropped_and_serving_goes_on() {
    let path = temp_path("bad");
    let (_addr, handle) = spawn(BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        workers: 1,
        adopt_socket: Some(path.clone()),
        ..BackendArgs::default()
    })
    .unwrap();
    let via = UnixDatagram::unbound().unwrap();
    // No descriptor at all.
    via.send_to(b"A", &path).unwrap();
    // A descriptor that is not a TCP socket (a UDP socket): closed, not served.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    adopt::send(&via, &path, udp.as_raw_fd(), TIMEOUT).unwrap();
    // Then a good one.
    let (client, server_side) = pair();
    client.set_read_timeout(Some(TIMEOUT)).unwrap();
    adopt::send(&via, &path, server_side.as_raw_fd(), TIMEOUT).unwrap();
    drop(server_side);
    let mut w = client.try_clone().unwrap();
    w.write_all(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (status, _, body) = read_response(&mut BufReader::new(client));
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body, b"ok\n");
    handle.stop();
}

#[test]
fn post_to_other_paths_is_still_not_implemented() {
    let (addr, handle) = spawn(BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        workers: 1,
        ..BackendArgs::default()
    })
    .unwrap();
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(TIMEOUT)).unwrap();
    c.write_all(b"POST /upload HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let (status, _, _) = read_response(&mut BufReader::new(c));
    assert!(status.starts_with("HTTP/1.1 501"), "{status}");
    handle.stop();
}
