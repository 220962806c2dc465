//! The verbs back-end (feature `verbs`): rdma-core loaded at run time, the host's
//! devices probed, and the fallback to the software stack where there is none; over a
//! device, server-writes and client-reads to a software-iWARP client, and a Write and a
//! Read between two verbs endpoints. A test that needs a device says so and counts as
//! skipped where there is none (`scripts/test.sh` runs these without FARSIDE_NO_SKIP:
//! CI has no RDMA device).
//!
//! On a host with siw (`modprobe siw; rdma link add siw0 type siw netdev lo`) or rxe,
//! every test here runs; `FARSIDE_RDMA_ADDR` names the address of the device's
//! interface (default 127.0.0.1, siw on lo).
#![cfg(feature = "verbs")]

mod common;

use farside_iwarp::verbs::{Access, WcOpcode, WcStatus};
use farside_rdmahttp::caps::Caps;
use farside_rdmahttp::client::{get, GetOptions, Via};
use farside_rdmahttp::header::{Mode, NAME};
use farside_rdmahttp::link::Backend;
use farside_rdmahttp::registration::{FileKey, Registration};
use farside_rdmahttp::server::{Server, Session};
use farside_verbs::{DeviceInfo, Listener, Transport};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

/// The host's devices; a skip (and `None`) if rdma-core is not installed.
fn devices_or_skip(test: &str) -> Option<Vec<DeviceInfo>> {
    match farside_verbs::devices() {
        Ok(d) => Some(d),
        Err(e) => {
            farside_testkit::skip(test, &e.to_string());
            None
        }
    }
}

/// A device of `transport` (any with `None`), or a skip saying there is none.
fn device_or_skip(test: &str, transport: Option<Transport>) -> Option<DeviceInfo> {
    let devs = devices_or_skip(test)?;
    let found = devs
        .iter()
        .find(|d| transport.is_none_or(|t| d.transport == t))
        .cloned();
    if found.is_none() {
        let want = transport.map_or("RDMA".to_string(), |t| t.to_string());
        farside_testkit::skip(
            test,
            &format!(
                "no {want} device here ({} devices: {:?}; modprobe siw && rdma link add siw0 type siw netdev lo)",
                devs.len(),
                devs.iter().map(|d| &d.name).collect::<Vec<_>>()
            ),
        );
    }
    found
}

fn rdma_ip() -> std::net::IpAddr {
    std::env::var("FARSIDE_RDMA_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or([127, 0, 0, 1].into())
}

fn key(len: usize) -> FileKey {
    FileKey {
        dev: 1,
        ino: 2,
        size: len as u64,
        mtime_ns: 3,
    }
}

/// Serves `body` to `requests` GETs with an `RDMA:` field, one per connection,
/// answering as the back-end does (a declined transfer sends the body).
fn serve(
    server: Arc<Server>,
    body: Vec<u8>,
    requests: usize,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind((rdma_ip(), 0)).unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        for _ in 0..requests {
            let (mut s, peer) = l.accept().unwrap();
            let (_, field) = common::read_head(&mut s);
            let mut session = Session::default();
            match server.serve(
                &mut session,
                peer.ip(),
                field.as_bytes(),
                &body,
                Some(key(body.len())),
            ) {
                Ok(moved) => write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n{NAME}: {}\r\n\r\n",
                    moved.response()
                )
                .unwrap(),
                Err(d) => {
                    write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{NAME}: declined, reason={}\r\n\r\n",
                        body.len(),
                        d.token()
                    )
                    .unwrap();
                    s.write_all(&body).unwrap();
                }
            }
            server.after_answer(&mut session);
        }
    });
    (addr, t)
}

fn body(n: u32) -> Vec<u8> {
    (0..n).map(|i| (i * 13 % 251) as u8).collect()
}

fn fetch(addr: SocketAddr, mode: Mode) -> farside_rdmahttp::client::Fetched {
    get(
        &format!("http://{addr}/f"),
        &GetOptions {
            mode: Some(mode),
            maxlen: 1 << 20,
            timeout: WAIT,
        },
    )
    .unwrap()
}

#[test]
fn without_a_device_the_server_falls_back_to_the_software_stack() {
    let test = "without_a_device_the_server_falls_back_to_the_software_stack";
    let Some(devs) = devices_or_skip(test) else {
        return;
    };
    if !devs.is_empty() {
        farside_testkit::skip(test, "this host has an RDMA device: nothing falls back");
        return;
    }
    let (server, why) = Server::new(Caps::default(), Registration::Dynamic).with_verbs(None);
    let why = why.unwrap_err();
    assert!(
        why.contains("no RDMA device") && why.contains("0 devices"),
        "{why}"
    );
    assert_eq!(server.backend(), &Backend::Software);
    let (server, why) =
        Server::new(Caps::default(), Registration::Dynamic).with_verbs(Some("siw0".into()));
    assert!(why.unwrap_err().contains("\"siw0\""));
    assert_eq!(server.backend(), &Backend::Software);
    // Both modes still move the body by RDMA, over the software stack.
    let server = Arc::new(server);
    let body = body(200_000);
    let (addr, t) = serve(Arc::clone(&server), body.clone(), 2);
    let got = fetch(addr, Mode::ServerWrites);
    assert!(matches!(got.via, Via::ServerWrites), "{:?}", got.via);
    assert!(got.body == body);
    let got = fetch(addr, Mode::ClientReads);
    assert!(matches!(got.via, Via::ClientReads), "{:?}", got.via);
    assert!(got.body == body);
    t.join().unwrap();
    assert_eq!(server.budget().registered_bytes(), 0);
}

/// A server on an iWARP device (siw or an RNIC) moves bodies to the software-iWARP
/// client, in both modes and every registration strategy: the device runs MPA/DDP/RDMAP
/// against `farside_iwarp` as the seed paper's RNIC did against its software clients.
#[test]
fn an_iwarp_device_serves_software_iwarp_clients() {
    let test = "an_iwarp_device_serves_software_iwarp_clients";
    let Some(dev) = device_or_skip(test, Some(Transport::Iwarp)) else {
        return;
    };
    for registration in [
        Registration::Dynamic,
        Registration::Static,
        Registration::Cache,
    ] {
        let (server, why) =
            Server::new(Caps::default(), registration).with_verbs(Some(dev.name.clone()));
        why.unwrap();
        assert_eq!(
            server.backend(),
            &Backend::Verbs {
                device: Some(dev.name.clone())
            }
        );
        let server = Arc::new(server);
        let body = body(300_000);
        let (addr, t) = serve(Arc::clone(&server), body.clone(), 4);
        for i in 0..4 {
            let mode = [Mode::ServerWrites, Mode::ClientReads][i % 2];
            let got = fetch(addr, mode);
            assert!(
                matches!(got.via, Via::ServerWrites | Via::ClientReads),
                "{:?}",
                got.via
            );
            assert!(got.body == body, "{registration:?} round {i}");
        }
        t.join().unwrap();
        assert_eq!(server.budget().transfers(), 0);
    }
}

/// Two verbs endpoints on one device: the connector Writes a region and Sends behind
/// it, then Reads the acceptor's region; every byte checked, bounds refused locally.
#[test]
fn write_send_and_read_between_two_verbs_endpoints() {
    let test = "write_send_and_read_between_two_verbs_endpoints";
    if device_or_skip(test, None).is_none() {
        return;
    }
    let listener = Listener::bind(SocketAddr::new(rdma_ip(), 0)).unwrap();
    let at = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let src_bytes: Arc<[u8]> = Arc::from(body(64 << 10));
    let expect = src_bytes.clone();
    let acceptor = std::thread::spawn(move || {
        let (conn, recv) = listener.accept(WAIT, &[(7, 8), (8, 8)]).unwrap();
        let sink = conn.reg_mr(64 << 10, Access::REMOTE_WRITE).unwrap();
        let src = conn
            .reg_shared(expect.clone(), Access::REMOTE_READ)
            .unwrap();
        tx.send((
            (sink, conn.remote_to(sink).unwrap()),
            (src, conn.remote_to(src).unwrap()),
        ))
        .unwrap();
        let wc = conn.wait_wc(WAIT).expect("the Send arrives");
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (7, WcOpcode::Recv, WcStatus::Success)
        );
        let len = u64::from_be_bytes(conn.read(recv.unwrap(), 0, 8).unwrap().try_into().unwrap());
        assert_eq!(
            conn.read(sink, 0, len as usize).unwrap(),
            &expect[..len as usize]
        );
        // The connector says done once its Read finished: only then may the region go.
        let wc = conn.wait_wc(WAIT).expect("done arrives");
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (8, WcOpcode::Recv, WcStatus::Success)
        );
    });
    let conn = farside_verbs::Conn::connect(at, None, WAIT).unwrap();
    let ((sink, sink_to), (src, src_to)) = rx.recv_timeout(WAIT).unwrap();
    let mine = conn.reg_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    conn.write(mine, 0, &src_bytes).unwrap();
    let note = conn.reg_mr(8, Access::NONE).unwrap();
    conn.write(note, 0, &(40_000u64).to_be_bytes()).unwrap();
    assert!(
        conn.post_write(1, mine, 60_000, 10_000, sink, sink_to)
            .is_err(),
        "past the region"
    );
    conn.post_write(1, mine, 0, 40_000, sink, sink_to).unwrap();
    conn.post_send(2, note, 0, 8, true).unwrap();
    for want in [(1, WcOpcode::Write), (2, WcOpcode::Send)] {
        let wc = conn.wait_wc(WAIT).unwrap();
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (want.0, want.1, WcStatus::Success)
        );
    }
    let back = conn.reg_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    conn.post_read(3, back, 0, 64 << 10, src, src_to).unwrap();
    let wc = conn.wait_wc(WAIT).unwrap();
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (3, WcOpcode::Read, WcStatus::Success)
    );
    assert_eq!(conn.read(back, 0, 64 << 10).unwrap(), &src_bytes[..]);
    conn.post_send(4, note, 0, 8, false).unwrap();
    let wc = conn.wait_wc(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::Success));
    drop(conn);
    acceptor.join().unwrap();
}
