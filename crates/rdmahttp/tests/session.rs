//! A client session against the server side over loopback, with a minimal keep-alive
//! HTTP server in the test: one HTTP connection and one RDMA connection carry every
//! request, a declined request goes over TCP without breaking the RDMA connection, and
//! the set-up is reported once.

mod common;

use farside_rdmahttp::caps::Caps;
use farside_rdmahttp::client::{GetOptions, Via};
use farside_rdmahttp::header::{Mode, NAME};
use farside_rdmahttp::registration::Registration;
use farside_rdmahttp::server::{Server, Session as ServerSession};
use farside_rdmahttp::session::Session;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

/// Serves `requests` GETs on one keep-alive connection: `/small` is declined as too
/// large for RDMA (the body goes in the answer), anything else is `body` by RDMA.
fn serve(
    registration: Registration,
    body: Vec<u8>,
    requests: usize,
) -> (SocketAddr, std::thread::JoinHandle<usize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let server = Server::new(Caps::default(), registration);
        let (mut s, peer) = l.accept().unwrap();
        let mut session = ServerSession::default();
        let mut by_rdma = 0;
        for _ in 0..requests {
            let (head, field) = common::read_head(&mut s);
            assert!(!head.contains("Connection: close"), "{head}");
            if head.starts_with("GET /small ") {
                write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n{NAME}: declined, reason=too-large\r\n\r\nabc"
                )
                .unwrap();
                continue;
            }
            let moved = server
                .serve(&mut session, peer.ip(), field.as_bytes(), &body, None)
                .unwrap();
            by_rdma += 1;
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n{NAME}: {}\r\n\r\n",
                moved.response()
            )
            .unwrap();
            server.after_answer(&mut session);
        }
        by_rdma
    });
    (addr, t)
}

fn one_session(mode: Mode, registration: Registration) {
    let body: Vec<u8> = (0..200_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let paths = ["/f", "/f", "/small", "/f", "/f"];
    let (addr, t) = serve(registration, body.clone(), paths.len());
    let opts = GetOptions {
        mode: Some(mode),
        maxlen: 1 << 20,
        timeout: Duration::from_secs(5),
    };
    let mut c = Session::new(addr, "test", opts, true);
    for (i, p) in paths.iter().enumerate() {
        let got = c.get(p).unwrap();
        assert_eq!(got.http_connect, i == 0, "request {i}");
        assert_eq!(got.rdma_connect.is_some(), i == 0, "request {i}");
        if *p == "/small" {
            assert_eq!(got.fetched.body, b"abc");
            assert!(matches!(got.fetched.via, Via::Tcp(Some(_))));
        } else {
            assert!(got.fetched.body == body, "request {i}");
            let want = match mode {
                Mode::ServerWrites => Via::ServerWrites,
                Mode::ClientReads => Via::ClientReads,
            };
            assert_eq!(got.fetched.via, want);
        }
    }
    assert_eq!(
        c.rdma_connections(),
        1,
        "one RDMA connection for the session"
    );
    drop(c);
    assert_eq!(t.join().unwrap(), 4);
}

#[test]
fn one_rdma_connection_carries_every_request_of_a_session() {
    one_session(Mode::ServerWrites, Registration::Dynamic);
    one_session(Mode::ServerWrites, Registration::Static);
    one_session(Mode::ClientReads, Registration::Cache);
}
