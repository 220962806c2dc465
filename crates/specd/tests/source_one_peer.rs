//! With a single peer the source has nothing to rank: a migration reads no region
//! (the lab's pair: one `--peer ...,region=udp:...`; each read was a UDP round trip,
//! a sleep and a wake-up of the migrator per migration). No steering; the server's
//! queue is held at Q so the arrival is migratory; the peer's daemon address refuses
//! connections, so the migration falls back to the local server (through the relay),
//! and the peer's "region" is a UDP socket of the test that counts the reads it gets.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::Ordering;
use std::time::Duration;

use farside_migrate::Handover;
use farside_specd::handoff::{HandOff, Handoff};
use farside_specd::source::{Peer, SourceConfig, SourceDaemon};
use farside_specd::steer::NoSteer;
use farside_specd::window::WindowConfig;

const BOUND: Duration = Duration::from_secs(20);

#[test]
fn a_single_peer_is_chosen_without_reading_its_region() {
    // The local server: its accept queue held at Q = 2.
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let _queued: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(server.local_addr().unwrap()).unwrap())
        .collect();
    let sink = TcpListener::bind("127.0.0.1:0").unwrap();
    let sink_addr = sink.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = sink.accept() {
            let mut b = [0u8; 5];
            if s.read_exact(&mut b).is_ok() {
                let _ = s.write_all(&b);
            }
        }
    });
    let region = UdpSocket::bind("127.0.0.1:0").unwrap();
    region.set_nonblocking(true).unwrap();
    // A daemon address nobody listens on.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let notify = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let source = SourceDaemon::start(
        SourceConfig {
            accept: "127.0.0.1:0".parse().unwrap(),
            notify,
            window: WindowConfig::new(2, 4),
            server_port: server.local_addr().unwrap().port(),
            steer: None,
            peers: vec![Peer::parse(&format!(
                "daemon={closed},region=udp:{}",
                region.local_addr().unwrap()
            ))
            .unwrap()],
            migrators: 2,
            poll: Duration::from_millis(5),
            poll_steer: false,
            no_room: Default::default(),
            // Every read would be fresh.
            peer_poll: Duration::from_nanos(1),
            handover: Handover::CloseAfterRestore,
            affinity: None,
            gate_on_peer_load: false,
            auth: None,
            own_backend: None,
        },
        HandOff::new(Handoff::Relay(sink_addr)).unwrap(),
        Box::new(NoSteer),
    )
    .unwrap();
    let mut c = TcpStream::connect(source.accept_addr()).unwrap();
    c.set_read_timeout(Some(BOUND)).unwrap();
    c.write_all(b"hello").unwrap();
    let mut b = [0u8; 5];
    c.read_exact(&mut b)
        .expect("served on the source after the failed migration");
    assert_eq!(&b, b"hello");
    assert_eq!(
        source.window().stats().migratory,
        1,
        "the arrival was migratory"
    );
    assert_eq!(source.stats().fell_back.load(Ordering::Relaxed), 1);
    let mut d = [0u8; 64];
    let got = region.recv_from(&mut d);
    assert!(
        matches!(&got, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the single peer's region was read: {got:?}"
    );
    source.stop();
}
