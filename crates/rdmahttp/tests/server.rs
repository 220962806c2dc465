//! The server side against the client over loopback, with a minimal HTTP server in the
//! test: the registration cache hits, and every transfer gives its budget back.

mod common;

use farside_rdmahttp::caps::Caps;
use farside_rdmahttp::client::{get, GetOptions, Via};
use farside_rdmahttp::header::{Mode, NAME};
use farside_rdmahttp::registration::{FileKey, Registration};
use farside_rdmahttp::server::{Server, Session};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

/// Serves `body` (as the file `key`) to `requests` GETs, one per connection.
fn serve(
    server: Arc<Server>,
    body: Vec<u8>,
    key: FileKey,
    requests: usize,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        for _ in 0..requests {
            let (mut s, peer) = l.accept().unwrap();
            let (_, field) = common::read_head(&mut s);
            let mut session = Session::default();
            let moved = server
                .serve(&mut session, peer.ip(), field.as_bytes(), &body, Some(key))
                .unwrap();
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n{NAME}: {}\r\n\r\n",
                moved.response()
            )
            .unwrap();
            server.after_answer(&mut session);
        }
    });
    (addr, t)
}

#[test]
fn the_cache_hits_and_every_transfer_gives_its_budget_back() {
    for registration in [
        Registration::Dynamic,
        Registration::Static,
        Registration::Cache,
    ] {
        one_strategy(registration);
    }
}

fn one_strategy(registration: Registration) {
    let caps = Caps::default();
    let server = Arc::new(Server::new(caps, registration));
    let body: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let key = FileKey {
        dev: 1,
        ino: 2,
        size: body.len() as u64,
        mtime_ns: 3,
    };
    let (addr, t) = serve(Arc::clone(&server), body.clone(), key, 6);
    for i in 0..6 {
        let mode = if i % 2 == 0 {
            Mode::ServerWrites
        } else {
            Mode::ClientReads
        };
        let got = get(
            &format!("http://{addr}/f"),
            &GetOptions {
                mode: Some(mode),
                maxlen: 1 << 20,
                timeout: Duration::from_secs(5),
            },
        )
        .unwrap();
        assert!(matches!(got.via, Via::ServerWrites | Via::ClientReads));
        assert!(got.body == body, "round {i}");
    }
    // The server thread finishes the last transfer after the client has its body.
    t.join().unwrap();
    assert_eq!(server.budget().transfers(), 0, "{registration:?}");
    if registration == Registration::Cache {
        assert_eq!(server.cache_stats(), (5, 1, 1));
        assert_eq!(
            server.budget().registered_bytes(),
            body.len() as u64,
            "the file only"
        );
    } else {
        // Static regions went with their connections (one per request here).
        assert_eq!(server.cache_stats(), (0, 0, 0));
        assert_eq!(server.budget().registered_bytes(), 0, "{registration:?}");
    }
}
