//! The front-end live, in network namespaces on one bridged LAN (client, front-end,
//! two back-ends; see `common/mod.rs`): the program attached to the front-end's
//! interface, real TCP through it, replies straight from the back-ends (L2 DSR).
//! Root only: `flock /tmp/farside-root.lock cargo test -p farside-frontend --
//! --include-ignored`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::session::{self, AWAIT_MAX, STALL_MAX};
use common::{need_root, Lan, NsRef, A_IP, B_IP, FE_IF, FE_IP, VIP};
use farside_frontend::fmove::MoveClient;
use farside_frontend::{control, table, Frontend};
use farside_migrate::{migrate_with, Fallback, MigrateConfig, Outcome, Target, TargetOutcome};

/// The key the control port's requests are sealed with.
const CONTROL_KEY: farside_frontend::fmove::MoveKey = farside_frontend::fmove::MoveKey {
    id: farside_auth::mac::KeyId(1),
    key: farside_auth::siphash::SipKey::from_halves(0x7e57_0000_0000_0001, 0x7e57_0000_0000_0002),
};

/// Connections in the split test.
const CONNS: usize = 1000;
/// Bytes the client sends per round; two rounds per connection.
const ROUND_BYTES: usize = 8192;
/// Allowed distance of back-end A's share from 75 %: one standard deviation of the
/// share of 1,000 hashed flows is 1.4 %; 5 % is more than 3.5 of them.
const SHARE_TOLERANCE: f64 = 0.05;

fn attach(r: &NsRef, wa: u32, wb: u32) -> Frontend {
    let r = r.clone();
    thread::spawn(move || {
        r.enter("f");
        Frontend::attach(FE_IF, VIP, &Lan::backends(wa, wb)).expect("attach")
    })
    .join()
    .expect("attach thread")
}

/// A back-end's service on the VIP in namespace `which`: per connection, two rounds
/// of `<id>\n` + ROUND_BYTES of pattern `id`, each answered `<name> <id> <bad bytes>`.
/// Stops when `stop` is set. Returns once the listener is bound (a client that
/// connected earlier was refused: CI saw "connection 0: Connection refused").
fn serve_rounds(r: NsRef, which: &'static str, stop: Arc<AtomicBool>) -> thread::JoinHandle<usize> {
    let (bound_tx, bound_rx) = mpsc::channel();
    let h = thread::spawn(move || {
        r.enter(which);
        let l = TcpListener::bind(SocketAddr::V4(VIP)).expect("bind VIP");
        l.set_nonblocking(true).unwrap();
        bound_tx.send(()).unwrap();
        let mut served = 0;
        while !stop.load(Ordering::SeqCst) {
            let s = match l.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) => panic!("accept: {e}"),
            };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(AWAIT_MAX)).unwrap();
            let mut w = s.try_clone().unwrap();
            let mut rd = BufReader::new(s);
            for _ in 0..2 {
                let mut line = String::new();
                rd.read_line(&mut line).expect("id line");
                let id: u64 = line.trim().parse().expect("id");
                let mut buf = vec![0u8; ROUND_BYTES];
                rd.read_exact(&mut buf).expect("round bytes");
                let bad = buf
                    .iter()
                    .enumerate()
                    .filter(|&(i, &b)| b != session::pat(id, i))
                    .count();
                writeln!(w, "{which} {id} {bad}").unwrap();
            }
            let mut rest = Vec::new();
            rd.read_to_end(&mut rest).expect("client close");
            assert!(rest.is_empty());
            served += 1;
        }
        served
    });
    bound_rx
        .recv_timeout(AWAIT_MAX)
        .expect("back-end listening on the VIP");
    h
}

#[test]
#[ignore = "needs root (netns, BPF): flock /tmp/farside-root.lock cargo test -p farside-frontend -- --include-ignored"]
fn thousand_connections_split_75_25_and_each_stays_on_one_backend() {
    need_root();
    let lan = Lan::setup('x');
    let r = lan.r.clone();
    let fe = attach(&r, 75, 25);
    let t = fe.table().unwrap();
    let key = fe.hash_key();
    let stop = Arc::new(AtomicBool::new(false));
    let servers = [
        serve_rounds(r.clone(), "a", stop.clone()),
        serve_rounds(r.clone(), "b", stop.clone()),
    ];
    let rc = r.clone();
    let client = thread::spawn(move || {
        rc.enter("c");
        let mut on_a = 0usize;
        for id in 0..CONNS as u64 {
            let s = TcpStream::connect_timeout(&SocketAddr::V4(VIP), AWAIT_MAX)
                .unwrap_or_else(|e| panic!("connection {id}: {e}"));
            s.set_read_timeout(Some(AWAIT_MAX)).unwrap();
            let SocketAddr::V4(local) = s.local_addr().unwrap() else {
                unreachable!()
            };
            let want = ["a", "b"][table::backend_for(&t, &key, local, VIP) as usize];
            let mut w = s.try_clone().unwrap();
            let mut rd = BufReader::new(s);
            for round in 0..2 {
                let body: Vec<u8> = (0..ROUND_BYTES).map(|i| session::pat(id, i)).collect();
                w.write_all(format!("{id}\n").as_bytes()).unwrap();
                w.write_all(&body).unwrap();
                let mut line = String::new();
                rd.read_line(&mut line)
                    .unwrap_or_else(|e| panic!("connection {id} round {round}: {e}"));
                assert_eq!(
                    line.trim(),
                    format!("{want} {id} 0"),
                    "connection {id} from {local}, round {round}: served by the hashed back-end, every byte intact"
                );
            }
            on_a += usize::from(want == "a");
        }
        on_a
    });
    let on_a = client.join().expect("client");
    stop.store(true, Ordering::SeqCst);
    let served: Vec<usize> = servers.map(|h| h.join().expect("server")).into();
    assert_eq!(served, vec![on_a, CONNS - on_a]);
    let share = on_a as f64 / CONNS as f64;
    eprintln!(
        "75/25: {on_a} of {CONNS} connections on A ({:.1} %)",
        share * 100.0
    );
    assert!((share - 0.75).abs() < SHARE_TOLERANCE, "share {share}");
    let s = fe.stats().unwrap();
    eprintln!("front-end: {s}");
    assert_eq!(s.backends[0].new_flows as usize, on_a);
    assert_eq!(s.backends[1].new_flows as usize, CONNS - on_a);
    assert_eq!(s.counters["nonsyn_miss"], 0);
    assert_eq!(s.counters["malformed"], 0);
    assert_eq!(s.flows, CONNS);
    drop(fe);
    drop(lan);
}

/// The front-end's one-sided MOVE port in these tests.
const MOVE_PORT: u16 = 7400;
/// A client address no flow has.
const CLIENT_IP_PROBE: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 78, 9, 9);

/// How the front-end's flip goes in [`migrate_through_frontend`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flip {
    /// `MOVE` over the control port.
    Moved,
    /// The one-sided MOVE: a UDP datagram from A answered by the front-end's tc
    /// program; no control server exists at all.
    MovedUdp,
    /// The one-sided MOVE with the front-end's move port off: the front-end's stack
    /// answers ICMP port unreachable, `move_flow` fails, the migration must complete
    /// on the source.
    UdpMoveOff,
    /// The front-end's control port is gone (front-end process died): `move_flow`
    /// fails, the migration must complete on the source.
    ControlPortDown,
}

/// An HTTP/1.1 keep-alive session established through the front-end to A (every new
/// flow goes to A), migrated to B with `migrate_with` (`CloseAfterRestore`) whose
/// `move_flow` is the control client's `MOVE`. Checks every byte (client and
/// server), the stall bound, and where the flow entry points afterwards.
fn migrate_through_frontend(which: char, flip: Flip) {
    need_root();
    let lan = Lan::setup(which);
    let r = lan.r.clone();
    // Every new flow to A; B gets flows only by MOVE.
    let mut fe = attach(&r, 1, 0);
    if flip == Flip::MovedUdp {
        fe.set_move_udp(FE_IP, MOVE_PORT).unwrap();
    }
    let fe = Arc::new(Mutex::new(fe));
    let rf = r.clone();
    let fe2 = fe.clone();
    let server = thread::spawn(move || {
        rf.enter("f");
        control::Server::start(SocketAddr::new(FE_IP.into(), 0), fe2, CONTROL_KEY).expect("control")
    })
    .join()
    .unwrap();
    let control_addr = server.local_addr();
    let server = match flip {
        Flip::Moved => Some(server),
        Flip::ControlPortDown | Flip::MovedUdp | Flip::UdpMoveOff => {
            drop(server);
            None
        }
    };

    // Target back-end B: migration listener on its LAN address.
    let (target_addr_tx, target_addr_rx) = mpsc::channel();
    let (big_sent_tx, big_sent_rx) = mpsc::channel::<usize>();
    let rb = r.clone();
    let target_thread = thread::spawn(move || {
        rb.enter("b");
        let target = Target::bind(SocketAddr::new(B_IP.into(), 0)).unwrap();
        target_addr_tx.send(target.local_addr().unwrap()).unwrap();
        let mut restored = None;
        let outcome = target
            .serve_one(|_| Ok(()), |s| restored = Some(s))
            .unwrap();
        if let Some(s) = restored {
            session::finish_serving(s, big_sent_rx.recv_timeout(AWAIT_MAX).unwrap());
        }
        outcome
    });
    let target_addr = target_addr_rx.recv_timeout(AWAIT_MAX).unwrap();

    // Source back-end A: the service on the VIP; migrates with the front-end's MOVE.
    let (ready_tx, ready_rx) = mpsc::channel();
    let (signal, migrated) = mpsc::channel();
    let ra = r.clone();
    let source_thread = thread::spawn(move || {
        ra.enter("a");
        let listener = TcpListener::bind(SocketAddr::V4(VIP)).unwrap();
        ready_tx.send(()).unwrap();
        let (s, big_sent) = session::source_prefix(&listener);
        let SocketAddr::V4(peer) = s.peer_addr().unwrap() else {
            unreachable!()
        };
        let mut fe_client = match flip {
            Flip::Moved => {
                let mut c = control::Client::connect(control_addr)
                    .expect("control port")
                    .with_key(CONTROL_KEY);
                assert_eq!(c.flow(peer).unwrap(), Some((A_IP, false)));
                Some(c)
            }
            Flip::ControlPortDown | Flip::MovedUdp | Flip::UdpMoveOff => None,
        };
        // The one-sided MOVE's client, from A's namespace: its source is A's address.
        let mut mover = MoveClient::connect(SocketAddrV4::new(FE_IP, MOVE_PORT)).unwrap();
        assert_eq!(mover.local_ip(), A_IP);
        let cfg = MigrateConfig::default(); // CloseAfterRestore
        let outcome = migrate_with(s, target_addr, &cfg, || match flip {
            Flip::MovedUdp | Flip::UdpMoveOff => mover.move_flow(peer, B_IP),
            Flip::Moved | Flip::ControlPortDown => match fe_client.as_mut() {
                Some(c) => c.move_flow(peer, B_IP),
                None => control::Client::connect(control_addr)?
                    .with_key(CONTROL_KEY)
                    .move_flow(peer, B_IP),
            },
        });
        match (flip, outcome) {
            (Flip::Moved | Flip::MovedUdp, Outcome::Migrated(t)) => {
                eprintln!(
                    "migrated through the front-end: dump {:?}, total {:?}, {} queued bytes",
                    t.dump, t.total, t.state_bytes
                );
                big_sent_tx.send(big_sent).unwrap();
                signal.send(()).unwrap();
            }
            (
                Flip::ControlPortDown | Flip::UdpMoveOff,
                Outcome::ResumedOnSource {
                    sock,
                    reason: Fallback::FlowNotMoved(e),
                },
            ) => {
                eprintln!("flow not moved ({e}): the connection completes on the source");
                signal.send(()).unwrap();
                session::finish_serving(sock, big_sent);
            }
            (_, outcome) => panic!("unexpected outcome {outcome:?}"),
        }
        drop(listener);
        peer
    });

    ready_rx.recv_timeout(AWAIT_MAX).unwrap();
    let rc = r.clone();
    let client = thread::spawn(move || {
        rc.enter("c");
        session::run_client(SocketAddr::V4(VIP), migrated)
    });
    let report = client.join().expect("client");
    let peer: SocketAddrV4 = source_thread.join().expect("source");
    let outcome = target_thread.join().expect("target");
    eprintln!("client's longest read wait {:?}", report.longest_read_wait);
    assert!(report.longest_read_wait < STALL_MAX);
    let fe = fe.lock().unwrap();
    let s = fe.stats().unwrap();
    eprintln!("front-end: {s}");
    assert_eq!(s.backends[0].new_flows, 1);
    assert_eq!(s.counters["nonsyn_miss"], 0);
    match flip {
        Flip::Moved | Flip::MovedUdp => {
            assert!(
                matches!(outcome, TargetOutcome::Restored { .. }),
                "{outcome:?}"
            );
            assert_eq!(fe.flow(peer).unwrap(), Some((B_IP, false)));
            assert!(s.backends[1].packets > 0, "B got the flow's later packets");
            let (moved, via_udp) = (s.counters["moved"], flip == Flip::MovedUdp);
            assert_eq!(
                moved,
                u64::from(via_udp),
                "moved by the tc program iff one-sided"
            );
            if via_udp {
                for k in [
                    "move_already",
                    "move_not_owner",
                    "move_not_found",
                    "move_refused",
                    "move_malformed",
                ] {
                    assert_eq!(s.counters[k], 0, "{k}");
                }
            }
        }
        Flip::ControlPortDown | Flip::UdpMoveOff => {
            assert!(matches!(outcome, TargetOutcome::Aborted), "{outcome:?}");
            assert_eq!(fe.flow(peer).unwrap(), Some((A_IP, false)));
            assert_eq!(s.backends[1].packets, 0, "nothing ever went to B");
        }
    }
    drop(fe);
    drop(server);
    drop(lan);
}

#[test]
#[ignore = "needs root (netns, BPF, TCP_REPAIR): flock /tmp/farside-root.lock cargo test -p farside-frontend -- --include-ignored"]
fn connection_migrated_between_backends_through_the_frontend_keeps_every_byte() {
    migrate_through_frontend('y', Flip::Moved);
}

#[test]
#[ignore = "needs root (netns, BPF, TCP_REPAIR): flock /tmp/farside-root.lock cargo test -p farside-frontend -- --include-ignored"]
fn frontend_unreachable_at_the_flip_completes_on_the_source() {
    migrate_through_frontend('z', Flip::ControlPortDown);
}

#[test]
#[ignore = "needs root (netns, BPF, TCP_REPAIR): flock /tmp/farside-root.lock cargo test -p farside-frontend -- --include-ignored"]
fn connection_migrated_with_the_one_sided_move_keeps_every_byte() {
    migrate_through_frontend('u', Flip::MovedUdp);
}

#[test]
#[ignore = "needs root (netns, BPF, TCP_REPAIR): flock /tmp/farside-root.lock cargo test -p farside-frontend -- --include-ignored"]
fn one_sided_move_unanswered_completes_on_the_source() {
    migrate_through_frontend('v', Flip::UdpMoveOff);
}

/// Requests in [`one_sided_move_is_answered_on_the_lan_without_a_process`].
const PROBES: u64 = 100;

/// The one-sided MOVE live on the LAN, many times: every request from A is answered
/// by the tc program (no process, no control server), a request from A for a flow it
/// does not own is refused, and the reply's timing is reported: on veth/bridge the
/// reply is normally queued before `send` returns (informative: on a busy machine
/// softirqs may be deferred to ksoftirqd).
#[test]
#[ignore = "needs root (netns, BPF): flock /tmp/farside-root.lock cargo test -p farside-frontend -- --include-ignored"]
fn one_sided_move_is_answered_on_the_lan_without_a_process() {
    use farside_frontend::fmove::{MoveRequest, MoveStatus, MSG_BYTES};
    need_root();
    let lan = Lan::setup('w');
    let r = lan.r.clone();
    let mut fe = attach(&r, 1, 0);
    fe.set_move_udp(FE_IP, MOVE_PORT).unwrap();
    let ra = r.clone();
    let (immediate, refused) = thread::spawn(move || {
        ra.enter("a");
        let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        sock.connect(SocketAddrV4::new(FE_IP, MOVE_PORT)).unwrap();
        let mut immediate = 0u64;
        let mut buf = [0u8; 64];
        for seq in 0..PROBES {
            // A flow the front-end has never seen: NOT_FOUND, nothing written.
            let req = MoveRequest {
                seq,
                client: SocketAddrV4::new(std::net::Ipv4Addr::new(10, 78, 9, 1), 1000 + seq as u16),
                expected: A_IP,
                next: B_IP,
            };
            sock.send(&req.encode()).unwrap();
            sock.set_nonblocking(true).unwrap();
            let n = match sock.recv(&mut buf) {
                Ok(n) => {
                    immediate += 1;
                    n
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    sock.set_nonblocking(false).unwrap();
                    sock.set_read_timeout(Some(AWAIT_MAX)).unwrap();
                    sock.recv(&mut buf).expect("a reply")
                }
                Err(e) => panic!("recv: {e}"),
            };
            sock.set_nonblocking(false).unwrap();
            assert_eq!(n, MSG_BYTES);
            assert_eq!(req.match_reply(&buf[..n]), Some(MoveStatus::NotFound));
        }
        // A's request naming B as the expected owner is refused (dropped): no reply.
        let mut c = MoveClient::connect(SocketAddrV4::new(FE_IP, MOVE_PORT)).unwrap();
        let e = c
            .request(
                SocketAddrV4::new(std::net::Ipv4Addr::new(10, 78, 9, 1), 999),
                B_IP,
                A_IP,
            )
            .unwrap_err();
        (immediate, e.kind() == std::io::ErrorKind::TimedOut)
    })
    .join()
    .expect("requester");
    eprintln!("one-sided MOVE: {immediate} of {PROBES} replies already queued when send returned");
    assert!(refused, "a request from a non-owner gets no reply");
    let s = fe.stats().unwrap();
    assert_eq!(s.counters["move_not_found"], PROBES);
    assert_eq!(
        s.counters["move_refused"],
        farside_frontend::fmove::ATTEMPTS as u64
    );
    assert_eq!(s.counters["move_malformed"], 0);
    assert_eq!(s.flows, 0, "nothing written");
    drop(fe);
    drop(lan);
}

/// A fresh directory `<tag>-<pid>` under the temp dir holding `move.key`: a random key
/// as 32 hex digits, mode 0600 (what `--key-file` accepts). (dir, key file, key).
fn key_file(
    tag: &str,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    farside_auth::siphash::SipKey,
) {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("move.key");
    let key = farside_frontend::table::random_hash_key().unwrap();
    let hex: String = key.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{hex}"))
        .unwrap();
    (dir, path, key)
}

/// `farside frontend`'s flags (`cli::run` in the front-end's namespace): the one-sided
/// MOVE answers on --control's IP and port number by default, on the interface's
/// address with --move-udp-port and no --control, and not at all with port 0.
#[test]
#[ignore = "needs root (netns, BPF): flock /tmp/farside-root.lock cargo test -p farside-frontend -- --include-ignored"]
fn farside_frontend_flags_place_the_one_sided_move() {
    use farside_frontend::cli::{run, FrontendArgs};
    use farside_frontend::fmove::{MoveKey, MoveStatus};
    need_root();
    let lan = Lan::setup('t');
    let r = lan.r.clone();
    // A TCP --control needs --key-file (which then seals the MOVE too).
    let (dir, path, key) = key_file("fe-place");
    let sealed = MoveKey {
        id: farside_auth::mac::KeyId(1),
        key,
    };
    // (--control, --move-udp-port, where a MOVE must be answered, or refused at).
    let cases: [(Option<SocketAddr>, Option<u16>, SocketAddrV4, bool); 4] = [
        (
            Some(SocketAddr::new(FE_IP.into(), 7410)),
            None,
            SocketAddrV4::new(FE_IP, 7410),
            true,
        ),
        (None, Some(7411), SocketAddrV4::new(FE_IP, 7411), true),
        (
            Some(SocketAddr::new(FE_IP.into(), 7412)),
            Some(7413),
            SocketAddrV4::new(FE_IP, 7413),
            true,
        ),
        (
            Some(SocketAddr::new(FE_IP.into(), 7414)),
            Some(0),
            SocketAddrV4::new(FE_IP, 7414),
            false,
        ),
    ];
    for (control, move_udp_port, at, answered) in cases {
        let args = FrontendArgs {
            iface: Some(FE_IF.into()),
            vip: Some(VIP),
            backends: Lan::backends(1, 1).to_vec(),
            control: control.map(Into::into),
            move_udp_port,
            key_file: Some(path.clone()),
            key_id: 1,
            move_iface: None,
            pin_maps: Some(false),
            pin_root: farside_frontend::pin::PIN_ROOT.into(),
            duration_s: None,
            detach: None,
        };
        let (rf, ra) = (r.clone(), r.clone());
        thread::spawn(move || {
            rf.enter("f");
            run(args, move |_| {
                let got = thread::spawn(move || {
                    ra.enter("a");
                    let mut c = MoveClient::connect(at).unwrap().with_key(sealed);
                    c.request(SocketAddrV4::new(CLIENT_IP_PROBE, 1), A_IP, B_IP)
                })
                .join()
                .unwrap();
                match (answered, got) {
                    (true, Ok(s)) => assert_eq!(s, MoveStatus::NotFound),
                    (false, Err(e)) => {
                        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}")
                    }
                    (a, g) => {
                        panic!("{control:?} {move_udp_port:?} at {at}: answered {a}, got {g:?}")
                    }
                }
            })
            .unwrap();
        })
        .join()
        .expect("farside frontend");
    }
    let _ = std::fs::remove_dir_all(&dir);
    drop(lan);
}

/// `farside frontend --key-file`: the one-sided MOVE must be sealed. Live from A: a
/// request sealed under the key is answered (sealed, verified by the client); an
/// unsealed one, or one sealed under another key, gets no reply and is counted.
#[test]
#[ignore = "needs root (netns, BPF): flock /tmp/farside-root.lock cargo test -p farside-frontend -- --include-ignored"]
fn farside_frontend_with_a_key_file_answers_only_sealed_moves() {
    use farside_auth::mac::KeyId;
    use farside_auth::siphash::SipKey;
    use farside_frontend::cli::{run, FrontendArgs};
    use farside_frontend::fmove::{MoveKey, MoveStatus};
    need_root();
    let lan = Lan::setup('k');
    let r = lan.r.clone();
    let (dir, path, key) = key_file("fe-key");
    let at = SocketAddrV4::new(FE_IP, 7420);
    let args = FrontendArgs {
        iface: Some(FE_IF.into()),
        vip: Some(VIP),
        backends: Lan::backends(1, 1).to_vec(),
        control: None,
        move_udp_port: Some(at.port()),
        key_file: Some(path.clone()),
        key_id: 9,
        move_iface: Some(FE_IF.into()),
        pin_maps: Some(false),
        pin_root: farside_frontend::pin::PIN_ROOT.into(),
        duration_s: None,
        detach: None,
    };
    let (rf, ra) = (r.clone(), r.clone());
    thread::spawn(move || {
        rf.enter("f");
        run(args, move |_| {
            thread::spawn(move || {
                ra.enter("a");
                let probe = SocketAddrV4::new(CLIENT_IP_PROBE, 1);
                let good = MoveKey { id: KeyId(9), key };
                let mut sealed = MoveClient::connect(at).unwrap().with_key(good);
                for _ in 0..3 {
                    assert_eq!(
                        sealed.request(probe, A_IP, B_IP).unwrap(),
                        MoveStatus::NotFound
                    );
                }
                let mut plain = MoveClient::connect(at).unwrap();
                let e = plain.request(probe, A_IP, B_IP).unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
                let wrong = MoveKey {
                    id: KeyId(9),
                    key: SipKey::from_halves(1, 2),
                };
                let mut forger = MoveClient::connect(at).unwrap().with_key(wrong);
                let e = forger.request(probe, A_IP, B_IP).unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
            })
            .join()
            .unwrap();
        })
        .unwrap();
    })
    .join()
    .expect("farside frontend");
    let _ = std::fs::remove_dir_all(&dir);
    drop(lan);
}

/// `farside frontend --pin-maps`: a connection opened through one front-end process
/// keeps its back-end through a second one started on the pinned maps, even with
/// weights that now send every new flow elsewhere (without the pinned entry its next
/// packet would be hashed to B, which answers RST).
#[test]
#[ignore = "needs root (netns, BPF, mount): flock /tmp/farside-root.lock cargo test -p farside-frontend -- --include-ignored"]
fn a_restarted_frontend_on_pinned_maps_keeps_a_live_connection_on_its_backend() {
    use farside_frontend::cli::{run, FrontendArgs};
    need_root();
    let lan = Lan::setup('p');
    let r = lan.r.clone();
    /// The bpffs of this test, unmounted even if it panics.
    struct Mounted(std::path::PathBuf);
    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let root = std::env::temp_dir().join(format!("fe-pin-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "bpf", "bpf"])
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success(), "mount -t bpf");
    let mounted = Mounted(root.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let servers = [
        serve_rounds(r.clone(), "a", stop.clone()),
        serve_rounds(r.clone(), "b", stop.clone()),
    ];
    let args = |wa, wb| FrontendArgs {
        iface: Some(FE_IF.into()),
        vip: Some(VIP),
        backends: Lan::backends(wa, wb).to_vec(),
        control: None,
        move_udp_port: None,
        key_file: None,
        key_id: 1,
        move_iface: None,
        pin_maps: Some(true),
        pin_root: root.clone(),
        duration_s: None,
        detach: None,
    };
    // One front-end process's life: start, signal, wait for the word to stop.
    let life = |a: FrontendArgs| {
        let (up_tx, up_rx) = mpsc::channel();
        let (down_tx, down_rx) = mpsc::channel::<()>();
        let rf = r.clone();
        let h = thread::spawn(move || {
            rf.enter("f");
            run(a, move |_| {
                up_tx.send(()).unwrap();
                let _ = down_rx.recv();
            })
            .unwrap();
        });
        up_rx.recv_timeout(AWAIT_MAX).expect("front-end up");
        (h, down_tx)
    };
    let (step_tx, step_rx) = mpsc::channel::<()>();
    let (said_tx, said_rx) = mpsc::channel::<String>();
    let rc = r.clone();
    let client = thread::spawn(move || {
        rc.enter("c");
        let s = TcpStream::connect_timeout(&SocketAddr::V4(VIP), AWAIT_MAX).unwrap();
        s.set_read_timeout(Some(AWAIT_MAX)).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut rd = BufReader::new(s);
        for _ in 0..2 {
            step_rx.recv().unwrap();
            let body: Vec<u8> = (0..ROUND_BYTES).map(|i| session::pat(7, i)).collect();
            w.write_all(b"7\n").unwrap();
            w.write_all(&body).unwrap();
            let mut line = String::new();
            rd.read_line(&mut line).unwrap();
            said_tx.send(line.trim().to_string()).unwrap();
        }
    });
    // First life: every new flow to A.
    let (h, down) = life(args(1, 0));
    step_tx.send(()).unwrap();
    assert_eq!(said_rx.recv_timeout(AWAIT_MAX).unwrap(), "a 7 0");
    down.send(()).unwrap();
    h.join().expect("first front-end");
    // Second life: every new flow to B; the pinned entry keeps the connection on A.
    let (h, down) = life(args(0, 1));
    step_tx.send(()).unwrap();
    assert_eq!(
        said_rx.recv_timeout(AWAIT_MAX).unwrap(),
        "a 7 0",
        "the connection stayed on A"
    );
    client.join().expect("client");
    down.send(()).unwrap();
    h.join().expect("second front-end");
    stop.store(true, Ordering::SeqCst);
    for s in servers {
        let _ = s.join();
    }
    drop(mounted);
    drop(lan);
}
