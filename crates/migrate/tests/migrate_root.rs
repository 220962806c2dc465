//! Live migration of a real connection on loopback (needs CAP_NET_ADMIN for
//! TCP_REPAIR): run as root with `cargo test -p farside-migrate -- --include-ignored`.
//!
//! Every scenario runs the kit's HTTP/1.1 keep-alive session
//! (`farside_migrate::testkit::session`): the client sends
//! `GET /big` (a 4 MiB response), then at once a `POST` with an 8 MiB body, then
//! `GET /small`. The source server answers the GET only partly (the client's small
//! receive buffer leaves unsent and unacknowledged bytes in the send queue), waits
//! until POST bytes sit in its receive queue, and migrates while the client keeps
//! sending. Whoever ends up with the connection (target, or source after a
//! fall-back) finishes the response and serves the rest. The client checks every
//! response byte against the pattern, the server every POST byte, both compare
//! digests; no read may fail (no reset) and no read may wait longer than
//! [`STALL_MAX`].
//!
//! Same network namespace: the target's restore would collide with the source's
//! 4-tuple, so the successful path uses `Handover::CloseBeforeRestore` (source closed
//! silently after the dump, before COMMIT).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use farside_migrate::testkit::netns::{Netns, NetnsSpec};
use farside_migrate::testkit::session::{
    finish_serving, run_client, source_prefix, ClientReport, AWAIT_MAX, STALL_MAX,
};
use farside_migrate::testkit::{await_cond, inq, is_root};
use farside_migrate::{
    freeze_and_dump, migrate, migrate_with, wire, DumpError, Fallback, Handover, MigrateConfig,
    Outcome, Target, TargetOutcome,
};

/// How the target behaves.
enum TargetKind {
    /// `farside_migrate::Target`, admitting everything.
    Real,
    /// `Target`, admitting everything, but the source's front-end flow update fails.
    RealFlowUpdateLost,
    /// `Target`, refusing.
    Refusing,
    /// Reads the OFFER header and part of its payload, then dies.
    DiesDuringOffer,
    /// Accepts, reads COMMIT, then dies without an answer.
    DiesAfterCommit,
}

/// Runs the session through one migration attempt; returns the source's outcome
/// (with the socket moved out) and the client's report.
fn scenario(kind: TargetKind, handover: Handover) -> (Result<(), Fallback>, ClientReport) {
    scenario_with(kind, handover, Holder::None)
}

/// How long the child of [`fork_fd_holder`] keeps its copies of the parent's
/// descriptors: far longer than a hand-over on loopback (a few milliseconds), so the
/// source's close and the target's restore both fall inside it.
const FD_HOLDER_LIFE: Duration = Duration::from_millis(1500);

/// Descriptors the child of [`fork_fd_holder`] looks at (3..this): far above the
/// few dozen this test process has open at once.
const FD_SCAN_MAX: libc::c_int = 4096;

/// Forks a child that holds a copy of the descriptor of each connection whose local
/// address is `local` (IPv4), as any `fork`/`posix_spawn` holds every descriptor
/// until its `exec` closes them (the tests' `ip` commands did, from other test
/// threads), for [`FD_HOLDER_LIFE`], then exits; returns its pid. It closes its
/// copies of every other descriptor at once, so the other tests running in this
/// process meanwhile see their closes happen (a listener they rebind, a peer's EOF).
fn fork_fd_holder(local: SocketAddr) -> libc::pid_t {
    let SocketAddr::V4(want) = local else {
        panic!("the holder matches IPv4 addresses only: {local}")
    };
    let (want_ip, want_port) = (u32::from(*want.ip()).to_be(), want.port().to_be());
    // SAFETY: the child calls only async-signal-safe functions (getsockname,
    // getpeername, close, poll, _exit) on its own stack variables.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        for fd in 3..FD_SCAN_MAX {
            // SAFETY: as above; `sa`/`len` are live locals of the sizes passed.
            unsafe {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                let p = (&mut sa as *mut libc::sockaddr_in).cast();
                let is_local = libc::getsockname(fd, p, &mut len) == 0
                    && libc::c_int::from(sa.sin_family) == libc::AF_INET
                    && sa.sin_addr.s_addr == want_ip
                    && sa.sin_port == want_port;
                let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                if !(is_local && libc::getpeername(fd, p, &mut len) == 0) {
                    libc::close(fd);
                }
            }
        }
        // SAFETY: poll with no descriptors is a sleep; then leave without unwinding.
        unsafe {
            libc::poll(
                std::ptr::null_mut(),
                0,
                FD_HOLDER_LIFE.as_millis() as libc::c_int,
            );
            libc::_exit(0);
        }
    }
    pid
}

/// When [`scenario_with`] forks a [`fork_fd_holder`].
#[derive(Clone, Copy, PartialEq)]
enum Holder {
    /// No child.
    None,
    /// Just before the migration: the child holds the source's connection.
    BeforeMigration,
    /// In `move_flow`: the child holds the target's restored copy (same process).
    AtFlowMove,
}

/// [`scenario`] with a forked child holding a copy of the connection's descriptor
/// (whoever has it) from the point `holder` names until it exits.
fn scenario_with(
    kind: TargetKind,
    handover: Handover,
    holder: Holder,
) -> (Result<(), Fallback>, ClientReport) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (to_target_server, target_server_rx) = mpsc::channel::<TcpStream>();
    let target = Target::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let target_addr = target.local_addr().unwrap();
    let flow_lost = matches!(kind, TargetKind::RealFlowUpdateLost);
    let target_thread = thread::spawn(move || match kind {
        TargetKind::Real | TargetKind::RealFlowUpdateLost => Some(
            target
                .serve_one(|_| Ok(()), |s| to_target_server.send(s).unwrap())
                .unwrap(),
        ),
        TargetKind::Refusing => Some(
            target
                .serve_one(|_| Err("window closed".into()), |_| unreachable!())
                .unwrap(),
        ),
        TargetKind::DiesDuringOffer => {
            let listener = target_listener(target);
            let (mut c, _) = listener.accept().unwrap();
            let mut part = [0u8; wire::HEADER_BYTES + 16];
            c.read_exact(&mut part).unwrap();
            drop(c); // dies mid-transfer
            None
        }
        TargetKind::DiesAfterCommit => {
            let listener = target_listener(target);
            let (mut c, _) = listener.accept().unwrap();
            assert!(matches!(
                wire::read_message(&mut c).unwrap(),
                wire::Message::Offer(_)
            ));
            wire::write_message(&mut c, &wire::Message::Accept).unwrap();
            assert_eq!(wire::read_message(&mut c).unwrap(), wire::Message::Commit);
            drop(c);
            None
        }
    });
    let (signal, migrated) = mpsc::channel();
    let client = thread::spawn(move || run_client(addr, migrated));

    let (s, big_sent) = source_prefix(&listener);

    let cfg = MigrateConfig {
        handover,
        ..MigrateConfig::default()
    };
    let mut child = (holder == Holder::BeforeMigration).then(|| fork_fd_holder(addr));
    let outcome = migrate_with(s, target_addr, &cfg, || {
        if holder == Holder::AtFlowMove {
            child = Some(fork_fd_holder(addr));
        }
        if flow_lost {
            Err(io::Error::other("front-end map update lost"))
        } else {
            Ok(())
        }
    });
    let result = match outcome {
        Outcome::Migrated(t) => {
            eprintln!(
                "migrated: dump {:?}, total {:?}, {} queued bytes shipped",
                t.dump, t.total, t.state_bytes
            );
            signal.send(()).unwrap();
            let restored = target_server_rx.recv_timeout(AWAIT_MAX).expect("handoff");
            finish_serving(restored, big_sent);
            Ok(())
        }
        Outcome::ResumedOnSource { sock, reason } => {
            eprintln!("resumed on source: {reason:?}");
            signal.send(()).unwrap();
            finish_serving(sock, big_sent);
            Err(reason)
        }
        Outcome::Lost(e) => panic!("connection lost: {e}"),
    };
    if let Some(pid) = child {
        // SAFETY: reaps the child forked above.
        let r = unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        assert_eq!(r, pid, "waitpid: {}", io::Error::last_os_error());
    }
    let report = client.join().expect("client");
    let target_outcome = target_thread.join().expect("target");
    eprintln!(
        "target: {target_outcome:?}; client's longest read wait {:?}",
        report.longest_read_wait
    );
    assert!(
        report.longest_read_wait < STALL_MAX,
        "client stalled {:?}",
        report.longest_read_wait
    );
    (result, report)
}

/// The raw listener inside a `Target` for the fake targets (rebinding its port).
fn target_listener(target: Target) -> TcpListener {
    let addr = target.local_addr().unwrap();
    drop(target);
    TcpListener::bind(addr).unwrap()
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn migrated_keepalive_session_with_large_post_arrives_once_in_order() {
    assert!(is_root(), "needs root");
    let (r, _) = scenario(TargetKind::Real, Handover::CloseBeforeRestore);
    assert!(r.is_ok(), "expected a migration, got {r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn migration_succeeds_while_a_forked_child_holds_the_source_descriptor() {
    assert!(is_root(), "needs root");
    // The source's close drops its descriptor, but the socket lives on while another
    // process has a copy of it: it must still leave the established hash at once, or
    // the target's restore of the 4-tuple fails (EADDRNOTAVAIL) and the migration
    // falls back (the same-namespace tests' flake, whenever another test thread
    // spawned a command at that moment).
    let (r, _) = scenario_with(
        TargetKind::Real,
        Handover::CloseBeforeRestore,
        Holder::BeforeMigration,
    );
    assert!(r.is_ok(), "expected a migration, got {r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn lost_flow_update_completes_on_source_while_a_forked_child_holds_the_target_copy() {
    assert!(is_root(), "needs root");
    // The target's discarded copy must leave the established hash at once too, or the
    // source's local restore of its dump fails and the connection is lost.
    let (r, _) = scenario_with(
        TargetKind::RealFlowUpdateLost,
        Handover::CloseBeforeRestore,
        Holder::AtFlowMove,
    );
    assert!(matches!(r, Err(Fallback::FlowNotMoved(_))), "{r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn refused_migration_completes_on_source() {
    assert!(is_root(), "needs root");
    let (r, _) = scenario(TargetKind::Refusing, Handover::CloseBeforeRestore);
    assert!(
        matches!(r, Err(Fallback::Refused(ref s)) if s == "window closed"),
        "{r:?}"
    );
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn refused_offer_commit_completes_on_source() {
    assert!(is_root(), "needs root");
    // CloseAfterRestore sends OFFER_COMMIT: a refusal comes instead of RESTORED.
    let (r, _) = scenario(TargetKind::Refusing, Handover::CloseAfterRestore);
    assert!(
        matches!(r, Err(Fallback::Refused(ref s)) if s == "window closed"),
        "{r:?}"
    );
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn lost_flow_update_completes_on_source() {
    assert!(is_root(), "needs root");
    // The target restored (frozen), the flow could not be moved: ABORT, the target
    // discards its copy, the source restores its dump (it had closed before COMMIT).
    let (r, _) = scenario(TargetKind::RealFlowUpdateLost, Handover::CloseBeforeRestore);
    assert!(matches!(r, Err(Fallback::FlowNotMoved(_))), "{r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn target_dead_during_offer_completes_on_source() {
    assert!(is_root(), "needs root");
    let (r, _) = scenario(TargetKind::DiesDuringOffer, Handover::CloseAfterRestore);
    assert!(matches!(r, Err(Fallback::TargetGone(_))), "{r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn target_dead_after_commit_completes_on_source_from_the_dump() {
    assert!(is_root(), "needs root");
    // The source closed its socket before COMMIT: the fall-back restores the dump.
    let (r, _) = scenario(TargetKind::DiesAfterCommit, Handover::CloseBeforeRestore);
    assert!(matches!(r, Err(Fallback::TargetGone(_))), "{r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn failed_restore_on_target_completes_on_source() {
    assert!(is_root(), "needs root");
    // CloseAfterRestore in one namespace: the source still holds the 4-tuple, so the
    // target's restore fails (address in use) and reports FAILED.
    let (r, _) = scenario(TargetKind::Real, Handover::CloseAfterRestore);
    assert!(matches!(r, Err(Fallback::RestoreFailed(_))), "{r:?}");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn unreachable_target_completes_on_source() {
    assert!(is_root(), "needs root");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let mut c = TcpStream::connect(addr).unwrap();
    let (s, _) = listener.accept().unwrap();
    c.write_all(b"hello").unwrap();
    await_cond("request bytes", || inq(&s).unwrap() == 5);
    let Outcome::ResumedOnSource { mut sock, reason } =
        migrate(s, dead_addr, &MigrateConfig::default())
    else {
        panic!("expected a fall-back");
    };
    assert!(
        matches!(reason, Fallback::TargetUnreachable(_)),
        "{reason:?}"
    );
    assert_resumed_socket_works(&mut sock, &mut c, b"hello");
}

/// After a refusal or fall-back the socket still carries data both ways: the
/// queued bytes `queued` are still there and nothing is duplicated.
fn assert_resumed_socket_works(server: &mut TcpStream, client: &mut TcpStream, queued: &[u8]) {
    server.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    client.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    let mut got = vec![0u8; queued.len()];
    server.read_exact(&mut got).unwrap();
    assert_eq!(got, queued);
    client.write_all(b"more").unwrap();
    let mut more = [0u8; 4];
    server.read_exact(&mut more).unwrap();
    assert_eq!(&more, b"more");
    server.write_all(b"reply").unwrap();
    let mut reply = [0u8; 5];
    client.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"reply");
}

fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (s, _) = listener.accept().unwrap();
    (c, s)
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn socket_not_established_is_refused_and_keeps_working() {
    assert!(is_root(), "needs root");
    let (mut c, mut s) = pair();
    c.write_all(b"last words").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    await_cond("the FIN (CLOSE_WAIT)", || {
        matches!(freeze_and_dump(&s), Err(DumpError::NotEstablished(8)))
    });
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    assert_eq!(all, b"last words");
    s.write_all(b"bye").unwrap();
    let mut bye = [0u8; 3];
    c.read_exact(&mut bye).unwrap();
    assert_eq!(&bye, b"bye");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn urgent_data_is_refused_and_socket_keeps_working() {
    assert!(is_root(), "needs root");
    let (mut c, mut s) = pair();
    c.write_all(b"ab").unwrap();
    // SAFETY: send one byte as urgent data.
    let r = unsafe { libc::send(c.as_raw_fd(), b"u".as_ptr().cast(), 1, libc::MSG_OOB) };
    assert_eq!(r, 1);
    await_cond("the urgent byte", || {
        let mut b = [0u8; 1];
        // SAFETY: peek one urgent byte into a live buffer.
        let r = unsafe {
            libc::recv(
                s.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_OOB | libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        r == 1
    });
    assert!(matches!(freeze_and_dump(&s), Err(DumpError::UrgentData)));
    assert_resumed_socket_works(&mut s, &mut c, b"ab");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn listening_and_udp_sockets_are_refused() {
    assert!(is_root(), "needs root");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    // SAFETY: the duplicate is owned by the TcpStream (a listener viewed as a stream).
    let l = unsafe { TcpStream::from_raw_fd(libc::dup(listener.as_raw_fd())) };
    assert!(matches!(
        freeze_and_dump(&l),
        Err(DumpError::NotEstablished(10))
    ));
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // SAFETY: as above, for a UDP socket.
    let u = unsafe { TcpStream::from_raw_fd(libc::dup(udp.as_raw_fd())) };
    assert!(matches!(freeze_and_dump(&u), Err(DumpError::NotTcp)));
}

const VIP: &str = "10.77.0.100";
const CLIENT_IP: &str = "10.77.9.1";
const VIP_PORT: u16 = 8080;

/// Client `c`, source back-end `a`, target back-end `b` (the kit's namespaces; the
/// front-end's flow entry is a /32 route in `c`, replaced at the move).
fn netns() -> Netns {
    Netns::setup(NetnsSpec {
        // Not the lab's `fs…` names; the pid keeps parallel runs apart.
        tag: format!("mg{}", std::process::id() % 100_000),
        vip: VIP.parse().unwrap(),
        client_ip: CLIENT_IP.parse().unwrap(),
        a_ip: "10.77.2.1".parse().unwrap(),
        b_ip: "10.77.2.2".parse().unwrap(),
        table_b: None,
    })
    .expect("namespaces")
}

#[test]
#[ignore = "needs root (netns, TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root under flock /tmp/farside-root.lock"]
fn migrated_across_namespaces_with_flow_moved_after_restore() {
    assert!(is_root(), "needs root");
    let guard = netns();
    let ns = guard.r.clone();
    let vip: SocketAddr = format!("{VIP}:{VIP_PORT}").parse().unwrap();

    // Target back-end `b`: control listener on the cluster network; the restored
    // connection finishes the session there.
    let (target_addr_tx, target_addr_rx) = mpsc::channel();
    let (big_sent_tx, big_sent_rx) = mpsc::channel::<usize>();
    let nsb = ns.clone();
    let target_thread = thread::spawn(move || {
        nsb.enter("b").unwrap();
        let target = Target::bind("10.77.2.2:0".parse().unwrap()).unwrap();
        target_addr_tx.send(target.local_addr().unwrap()).unwrap();
        let mut restored = None;
        let outcome = target
            .serve_one(|_| Ok(()), |s| restored = Some(s))
            .unwrap();
        let s = restored.unwrap_or_else(|| panic!("not handed over: {outcome:?}"));
        finish_serving(s, big_sent_rx.recv_timeout(AWAIT_MAX).unwrap());
        outcome
    });
    let target_addr = target_addr_rx.recv_timeout(AWAIT_MAX).unwrap();

    // Source back-end `a`: the service on the VIP.
    let (ready_tx, ready_rx) = mpsc::channel();
    let (signal, migrated) = mpsc::channel();
    let nsa = ns.clone();
    let source_thread = thread::spawn(move || {
        nsa.enter("a").unwrap();
        let listener = TcpListener::bind(vip).unwrap();
        ready_tx.send(()).unwrap();
        let (s, big_sent) = source_prefix(&listener);
        let cfg = MigrateConfig::default(); // CloseAfterRestore: the deployment's order
        let outcome = migrate_with(s, target_addr, &cfg, || {
            // The front-end flip, after the restore and before the source closes.
            nsa.ip(
                "c",
                &format!("route replace {VIP}/32 dev {}cb src {CLIENT_IP}", nsa.tag),
            );
            Ok(())
        });
        let Outcome::Migrated(t) = outcome else {
            panic!("expected a migration, got {outcome:?}");
        };
        eprintln!(
            "migrated across namespaces: dump {:?}, total {:?}, {} queued bytes",
            t.dump, t.total, t.state_bytes
        );
        big_sent_tx.send(big_sent).unwrap();
        signal.send(()).unwrap();
        // The source's service stays up (its listener still answers on the VIP).
        drop(listener);
    });

    ready_rx.recv_timeout(AWAIT_MAX).unwrap();
    let nsc = ns.clone();
    let client = thread::spawn(move || {
        nsc.enter("c").unwrap();
        run_client(vip, migrated)
    });
    let report = client.join().expect("client");
    source_thread.join().expect("source");
    let outcome = target_thread.join().expect("target");
    assert!(
        matches!(outcome, TargetOutcome::Restored { .. }),
        "{outcome:?}"
    );
    eprintln!("client's longest read wait {:?}", report.longest_read_wait);
    assert!(report.longest_read_wait < STALL_MAX);
}
