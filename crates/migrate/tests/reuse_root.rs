//! A connection that was frozen and thawed (resumed on the source, or restored on the
//! target) must not keep its server from binding the service port again: repair mode
//! off leaves the socket without SO_REUSEADDR, and its TIME_WAIT then blocked a
//! restarted server's `bind` (EADDRINUSE, seen in `lab speculative`). Needs root
//! (TCP_REPAIR): `cargo test -p farside-migrate -- --include-ignored`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use farside_migrate::{close_silently, freeze_and_dump, restore, resume};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Opens a connection to a fresh listener; returns the listener, the server's and
/// the client's ends.
fn connection() -> (TcpListener, TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (l, s, c)
}

/// The server closes first (its end goes to TIME_WAIT once the client closes too),
/// then a new listener binds the same port, as a restarted server does.
fn server_closes_then_rebinds(l: TcpListener, mut s: TcpStream, mut c: TcpStream) {
    let addr = l.local_addr().unwrap();
    s.write_all(b"bye").unwrap();
    drop(s);
    drop(l);
    let mut got = Vec::new();
    c.read_to_end(&mut got).expect("client reads to EOF");
    assert_eq!(got, b"bye");
    drop(c);
    TcpListener::bind(addr).unwrap_or_else(|e| panic!("rebinding {addr}: {e}"));
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn resumed_connection_lets_the_server_rebind_its_port() {
    assert!(is_root(), "needs root");
    let (l, s, c) = connection();
    let st = freeze_and_dump(&s).unwrap();
    resume(&s, &st).unwrap();
    server_closes_then_rebinds(l, s, c);
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn restored_connection_lets_the_server_rebind_its_port() {
    assert!(is_root(), "needs root");
    let (l, s, c) = connection();
    let st = freeze_and_dump(&s).unwrap();
    close_silently(s).unwrap();
    let s = restore(&st).unwrap();
    server_closes_then_rebinds(l, s, c);
}
