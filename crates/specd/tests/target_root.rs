//! The target side with the real hand-off (needs CAP_NET_ADMIN for TCP_REPAIR): run
//! as root with `cargo test -p farside-specd -- --include-ignored`.
//!
//! A client opens an HTTP/1.1 keep-alive session to a source socket and pipelines
//! `GET /files/4194304` (4 MiB), a `POST /digest` with an 8 MiB body and
//! `GET /files/5`; the source (standing in for the daemon's admission listener)
//! accepts, lets request bytes pile up in its receive queue and migrates the
//! connection to a [`TargetDaemon`], which restores it and hands it to a real
//! `farside backend` through `--adopt-socket`. The back-end serves the whole session:
//! the client checks every response byte, the server's digest of the upload, that
//! the responses came from that back-end, and that no read waited longer than
//! [`STALL_MAX`]. The same session through the relay hand-off (the way to an
//! unmodified server such as nginx) is checked the same way. The refusal case runs the same session through the source's
//! fall-back (hand-off to its local server) and checks the target's notification.
//!
//! Source and target share this network namespace, so the migration uses
//! `Handover::CloseBeforeRestore` (the restore would collide with the source's
//! 4-tuple otherwise); the cross-namespace deployment order is tested in
//! `speculative_root.rs`.

use std::io::{BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use farside_auth::siphash::SipKey;
use farside_backend::{generated_byte, BackendArgs};
use farside_migrate::testkit::session::{
    connect_small_rcvbuf, read_body_checked, read_head_full as read_head, write_pattern, ReadWaits,
    AWAIT_MAX, BIG_BYTES, INQ_BEFORE_MIGRATE, POST_BYTES, SEED_POST, STALL_MAX,
};
use farside_migrate::testkit::{await_cond, inq, is_root, pattern_digest};
use farside_migrate::wire::Auth;
use farside_migrate::{migrate, migrate_with, Fallback, Handover, MigrateConfig, Outcome};
use farside_specd::handoff::{HandOff, Handoff};
use farside_specd::notify;
use farside_specd::target::{OfferRules, TargetConfig, TargetDaemon};

struct ClientReport {
    longest_read_wait: Duration,
    served_by: String,
}

/// The client: a writer thread pipelines the three requests; the reader checks every
/// response byte and the upload's digest.
fn run_client(addr: SocketAddr) -> ClientReport {
    let s = connect_small_rcvbuf(addr);
    s.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    s.set_write_timeout(Some(AWAIT_MAX)).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = thread::spawn(move || {
        write!(w, "GET /files/{BIG_BYTES} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        write!(
            w,
            "POST /digest HTTP/1.1\r\nHost: t\r\nContent-Length: {POST_BYTES}\r\n\r\n"
        )
        .unwrap();
        write_pattern(&mut w, SEED_POST, POST_BYTES).expect("POST body write (reset?)");
        w.write_all(b"GET /files/5 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
    });
    let mut r = BufReader::with_capacity(64 << 10, s);
    let (status, headers, len) = read_head(&mut r);
    // The first wait includes the migration itself; count the waits after it.
    let mut waits = ReadWaits::new();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(len, BIG_BYTES);
    let served_by = headers
        .iter()
        .find(|(k, _)| k == "x-farside-backend")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    read_body_checked(&mut r, len, |i| generated_byte(i as u64), &mut waits);
    let (status, _, len) = read_head(&mut r);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let mut digest = vec![0u8; len];
    r.read_exact(&mut digest).expect("response 2");
    waits.note();
    assert_eq!(
        String::from_utf8(digest).unwrap(),
        format!(
            "fnv1a64={:016x} bytes={POST_BYTES}\n",
            pattern_digest(SEED_POST, POST_BYTES)
        ),
        "the server's digest of the upload"
    );
    let (status, _, len) = read_head(&mut r);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let mut small = vec![0u8; len];
    r.read_exact(&mut small).expect("response 3");
    waits.note();
    assert_eq!(small, (0..5).map(generated_byte).collect::<Vec<_>>());
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).expect("server's close");
    assert!(rest.is_empty());
    writer.join().expect("client writer");
    ClientReport {
        longest_read_wait: waits.longest,
        served_by,
    }
}

/// The migration key of the authenticated tests, and another.
const KEY: SipKey = SipKey::from_halves(0x9e37_79b9_7f4a_7c15, 0xbf58_476d_1ce4_e5b9);
const OTHER_KEY: SipKey = SipKey::from_halves(0x94d0_49bb_1331_11eb, 0x2545_f491_4f6c_dd1d);

/// The offers of a single-host test: its connections are to `listener`, from a
/// loopback client.
fn loopback_service(listener: &TcpListener) -> OfferRules {
    OfferRules {
        service_ip: None,
        service_port: listener.local_addr().unwrap().port(),
        cluster: Vec::new(),
        loopback: true,
    }
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("farside-specd-{}-{name}", std::process::id()))
}

fn backend(adopt: &Path) -> (SocketAddr, farside_backend::Handle) {
    farside_backend::spawn(BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        workers: 2,
        adopt_socket: Some(adopt.to_path_buf()),
        ..BackendArgs::default()
    })
    .expect("backend")
}

/// Accepts the client and waits until request bytes pile up in the receive queue.
fn source_accept(listener: &TcpListener) -> TcpStream {
    let (s, _) = listener.accept().unwrap();
    await_cond("request bytes queued on the source", || {
        inq(&s).unwrap() >= INQ_BEFORE_MIGRATE
    });
    s
}

/// Migrates the session to a [`TargetDaemon`] handing over with `relay` (else by
/// adoption) to a real `farside backend`, and checks it end to end.
fn migrated_session(relay: bool) {
    migrated_session_with(
        if relay { "relay" } else { "adopt" },
        relay,
        None,
        Duration::ZERO,
    );
}

/// [`migrated_session`], with the authenticated framing if `auth` (one key for
/// both roles, as in one daemon), and a flow move that takes `flow_delay`.
/// `name`: the adoption socket's, one per test (tests run at once).
fn migrated_session_with(name: &str, relay: bool, auth: Option<Arc<Auth>>, flow_delay: Duration) {
    assert!(is_root(), "needs root");
    let adopt = temp_path(name);
    let (backend_addr, backend) = backend(&adopt);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = TargetDaemon::start(TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        server_port: backend_addr.port(),
        admit_queue_max: 64,
        handoff: if relay {
            Handoff::Relay(backend_addr)
        } else {
            Handoff::Adopt(adopt.clone())
        },
        threads: 2,
        peers: Vec::new(),
        allow: vec![Ipv4Addr::LOCALHOST.into()],
        auth: auth.clone(),
        offers: loopback_service(&listener),
    })
    .expect("target daemon");
    let addr = listener.local_addr().unwrap();
    let client = thread::spawn(move || run_client(addr));
    let s = source_accept(&listener);
    let cfg = MigrateConfig {
        handover: Handover::CloseBeforeRestore,
        auth: auth.clone(),
        ..MigrateConfig::default()
    };
    let moved = || {
        thread::sleep(flow_delay);
        Ok(())
    };
    match migrate_with(s, target.addr(), &cfg, moved) {
        Outcome::Migrated(t) => eprintln!(
            "migrated: dump {:?}, total {:?}, {} queued bytes",
            t.dump, t.total, t.state_bytes
        ),
        other => panic!("expected a migration, got {other:?}"),
    }
    let report = client.join().expect("client");
    eprintln!(
        "target: {}; client's longest read wait {:?}",
        target.summary_json(),
        report.longest_read_wait
    );
    assert_eq!(report.served_by, backend_addr.to_string());
    assert!(report.longest_read_wait < STALL_MAX + flow_delay);
    let st = target.stats();
    assert_eq!(st.restored.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(st.cpu_us.lock().unwrap().count, 1);
    let h = target.handoff_stats();
    assert_eq!(h.handed.load(std::sync::atomic::Ordering::Relaxed), 1);
    if relay {
        // The upload, the three requests and the three responses went through it.
        assert!(
            h.relayed_bytes.load(std::sync::atomic::Ordering::Relaxed)
                > (POST_BYTES + BIG_BYTES) as u64
        );
    }
    if let Some(a) = &auth {
        assert_eq!(a.refused(), 0, "every frame verified");
    }
    target.stop();
    backend.stop();
}

#[test]
#[ignore = "needs root (TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn migrated_session_is_served_by_farside_backend_through_adoption() {
    migrated_session(false);
}

#[test]
#[ignore = "needs root (TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn an_authenticated_migration_is_served_by_farside_backend() {
    migrated_session_with(
        "adopt-keyed",
        false,
        Some(Arc::new(Auth::new(KEY))),
        Duration::ZERO,
    );
}

#[test]
#[ignore = "needs root (TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn a_flow_move_slower_than_the_reply_timeout_still_migrates() {
    // The front-end's MOVE and its retry take seconds: the target keeps its copy for
    // DONE longer than a reply's bound, and acknowledges it.
    migrated_session_with(
        "adopt-slow-flow",
        false,
        None,
        farside_migrate::proto::REPLY_TIMEOUT_DEFAULT + Duration::from_secs(1),
    );
}

#[test]
#[ignore = "needs root (TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn a_source_with_another_key_is_not_restored_and_keeps_its_connection() {
    assert!(is_root(), "needs root");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target_auth = Arc::new(Auth::new(KEY));
    let target = TargetDaemon::start(TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        server_port: listener.local_addr().unwrap().port(),
        admit_queue_max: 64,
        handoff: Handoff::Relay("127.0.0.1:9".parse().unwrap()),
        threads: 1,
        peers: Vec::new(),
        allow: vec![Ipv4Addr::LOCALHOST.into()],
        auth: Some(Arc::clone(&target_auth)),
        offers: loopback_service(&listener),
    })
    .expect("target daemon");
    let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (s, _) = listener.accept().unwrap();
    client.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    await_cond("the request queued", || inq(&s).unwrap() > 0);
    let cfg = MigrateConfig {
        auth: Some(Arc::new(Auth::new(OTHER_KEY))),
        ..MigrateConfig::default()
    };
    let mut s = match migrate(s, target.addr(), &cfg) {
        Outcome::ResumedOnSource {
            sock,
            reason: Fallback::TargetGone(e),
        } => {
            eprintln!("resumed on the source: {e}");
            sock
        }
        other => panic!("expected a fall-back, got {other:?}"),
    };
    // The connection is intact on the source.
    let mut b = [0u8; 16];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"GET / HTTP/1.1\r\n");
    s.write_all(b"ok").unwrap();
    let mut r = [0u8; 2];
    client.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    client.read_exact(&mut r).unwrap();
    assert_eq!(&r, b"ok");
    await_cond("the forged frame counted", || target_auth.refused() == 1);
    assert_eq!(target.stats().restored.load(Ordering::Relaxed), 0);
    target.stop();
}

#[test]
#[ignore = "needs root (TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn migrated_session_is_served_by_an_unmodified_server_through_the_relay() {
    migrated_session(true);
}

#[test]
#[ignore = "needs root (TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn refused_migration_is_served_on_the_source_and_the_target_notifies_when_it_can_take() {
    assert!(is_root(), "needs root");
    let adopt = temp_path("adopt-refuse");
    let (backend_addr, backend) = backend(&adopt);
    // The target's load: a server socket whose accept queue the test fills and drains.
    let loaded = TcpListener::bind("127.0.0.1:0").unwrap();
    let waiting: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(loaded.local_addr().unwrap()).unwrap())
        .collect();
    // The source daemon's notification socket.
    let source_notify = UdpSocket::bind("127.0.0.1:0").unwrap();
    source_notify.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = TargetDaemon::start(TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        server_port: loaded.local_addr().unwrap().port(),
        admit_queue_max: 2,
        handoff: Handoff::Adopt(adopt.clone()),
        threads: 1,
        peers: vec![source_notify.local_addr().unwrap()],
        allow: vec![Ipv4Addr::LOCALHOST.into()],
        auth: None,
        offers: loopback_service(&listener),
    })
    .expect("target daemon");
    let addr = listener.local_addr().unwrap();
    let client = thread::spawn(move || run_client(addr));
    let s = source_accept(&listener);
    let cfg = MigrateConfig {
        handover: Handover::CloseBeforeRestore,
        ..MigrateConfig::default()
    };
    let local = HandOff::new(Handoff::Adopt(adopt.clone())).unwrap();
    match migrate(s, target.addr(), &cfg) {
        Outcome::ResumedOnSource {
            sock,
            reason: Fallback::Refused(r),
        } => {
            eprintln!("refused: {r}");
            // The source's fall-back: its own server serves the connection.
            local.hand(sock).expect("local hand-off");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let report = client.join().expect("client");
    assert_eq!(report.served_by, backend_addr.to_string());
    assert!(report.longest_read_wait < STALL_MAX);
    // No notification while the target is still loaded.
    source_notify
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut b = [0u8; 16];
    assert!(
        source_notify.recv_from(&mut b).is_err(),
        "notified while loaded"
    );
    // Drain the target's accept queue: it can take again and says so.
    let accepted: Vec<_> = waiting.iter().map(|_| loaded.accept().unwrap()).collect();
    source_notify.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    let (n, from) = source_notify.recv_from(&mut b).expect("notification");
    assert!(notify::is_can_take(&b[..n]), "{:?}", &b[..n]);
    assert_eq!(from.ip(), target.addr().ip());
    let st = target.stats();
    // The daemon counts a notification after sending it: await the count.
    await_cond("the notification counted", || {
        st.notifications.load(std::sync::atomic::Ordering::Relaxed) >= 1
    });
    eprintln!("target: {}", target.summary_json());
    assert_eq!(st.refused.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(
        st.notifications.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    drop(accepted);
    target.stop();
    backend.stop();
}

/// One short request migrated through `pool` (a source's pooled control connections)
/// to `target` and answered by the back-end behind it.
fn migrate_one_request(
    pool: &farside_migrate::ControlPool,
    target: SocketAddr,
    listener: &TcpListener,
) -> Result<(), String> {
    let addr = listener.local_addr().unwrap();
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    c.write_all(b"GET /files/5 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (s, _) = listener.accept().unwrap();
    await_cond("request queued on the source", || inq(&s).unwrap() > 0);
    let cfg = MigrateConfig {
        handover: Handover::CloseBeforeRestore,
        ..MigrateConfig::default()
    };
    match pool.migrate_with(s, target, &cfg, || Ok(())) {
        Outcome::Migrated(_) => {}
        Outcome::ResumedOnSource { reason, .. } => return Err(format!("stayed: {reason:?}")),
        Outcome::Lost(e) => return Err(format!("lost: {e}")),
    }
    let mut resp = Vec::new();
    c.read_to_end(&mut resp).expect("response");
    let resp = String::from_utf8_lossy(&resp);
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    Ok(())
}

#[test]
#[ignore = "needs root (TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn an_idle_pooled_connection_gives_its_thread_to_another_source() {
    assert!(is_root(), "needs root");
    let adopt = temp_path("adopt-yield");
    let (backend_addr, backend) = backend(&adopt);
    // One thread: source A's idle pooled connection holds it after A's migration.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = TargetDaemon::start(TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        server_port: backend_addr.port(),
        admit_queue_max: 64,
        handoff: Handoff::Adopt(adopt.clone()),
        threads: 1,
        peers: Vec::new(),
        allow: vec![Ipv4Addr::LOCALHOST.into()],
        auth: None,
        offers: loopback_service(&listener),
    })
    .expect("target daemon");
    let (a, b) = (
        farside_migrate::ControlPool::default(),
        farside_migrate::ControlPool::default(),
    );
    migrate_one_request(&a, target.addr(), &listener).expect("A's first migration");
    assert_eq!(a.idle(), 1, "A keeps its connection");
    // Source B: without the thread giving up A's idle connection, B's OFFER would
    // wait in the listen backlog until its reply timeout and fall back.
    migrate_one_request(&b, target.addr(), &listener).expect("B's migration");
    // A's pooled connection was closed for B: A notices and reconnects.
    migrate_one_request(&a, target.addr(), &listener).expect("A's second migration");
    assert_eq!((a.opened(), a.stale()), (2, 1));
    assert_eq!(b.opened(), 1);
    // Counted once the hand-off returns, which may be after the client's response.
    await_cond("three restores counted", || {
        target
            .stats()
            .restored
            .load(std::sync::atomic::Ordering::Relaxed)
            == 3
    });
    target.stop();
    backend.stop();
}

/// The kernel's bound on a datagram socket's queue (the adoption channel).
fn max_dgram_qlen() -> usize {
    std::fs::read_to_string("/proc/sys/net/unix/max_dgram_qlen")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(10)
}

/// A connection with one short request (`Connection: close`) queued on the source
/// side: (client, source socket).
fn short_request(listener: &TcpListener) -> (TcpStream, TcpStream) {
    let mut c = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    c.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    c.write_all(b"GET /files/5 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (s, _) = listener.accept().unwrap();
    await_cond("request queued on the source", || inq(&s).unwrap() > 0);
    (c, s)
}

fn response(c: &mut TcpStream) -> String {
    let mut resp = Vec::new();
    let _ = c.read_to_end(&mut resp);
    String::from_utf8_lossy(&resp).into_owned()
}

#[test]
#[ignore = "needs root (TCP_REPAIR): cargo test -p farside-specd -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn an_offer_is_refused_while_the_servers_adoption_channel_is_full_and_taken_once_it_drains() {
    assert!(is_root(), "needs root");
    let adopt = temp_path("adopt-full");
    let (_, backend) = backend(&adopt);
    // The back-end's two workers held and its adoption queue full: connections
    // whose clients have not asked yet (handed by the source side's hand-off).
    let local = HandOff::new(Handoff::Adopt(adopt.clone())).unwrap();
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut idle: Vec<TcpStream> = (0..max_dgram_qlen() + 5)
        .map(|_| {
            let c = TcpStream::connect(front.local_addr().unwrap()).unwrap();
            c.set_read_timeout(Some(AWAIT_MAX)).unwrap();
            local.hand(front.accept().unwrap().0).unwrap();
            c
        })
        .collect();
    await_cond("the adoption queue full", || local.pending() > 0);
    // The target's load: an empty accept queue, far under its bound, so only the
    // full adoption channel can refuse.
    let load = TcpListener::bind("127.0.0.1:0").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = TargetDaemon::start(TargetConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        server_port: load.local_addr().unwrap().port(),
        admit_queue_max: 64,
        handoff: Handoff::Adopt(adopt.clone()),
        threads: 1,
        peers: Vec::new(),
        allow: vec![Ipv4Addr::LOCALHOST.into()],
        auth: None,
        offers: loopback_service(&listener),
    })
    .expect("target daemon");
    let cfg = MigrateConfig {
        handover: Handover::CloseBeforeRestore,
        ..MigrateConfig::default()
    };
    // Restored, it would wait for a worker in the hand-off queue and be reset past
    // its bound: refused, it resumes on the source, whose local hand-off queues it.
    let (mut c1, s1) = short_request(&listener);
    match migrate(s1, target.addr(), &cfg) {
        Outcome::ResumedOnSource {
            sock,
            reason: Fallback::Refused(r),
        } => {
            assert!(r.contains("adoption channel is full"), "{r}");
            local.hand(sock).expect("local hand-off");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The server drains: everyone is served.
    for c in &mut idle {
        c.write_all(b"GET /files/5 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
    }
    for (i, c) in idle.iter_mut().enumerate() {
        let r = response(c);
        assert!(r.starts_with("HTTP/1.1 200"), "idle client {i}: {r}");
    }
    let r = response(&mut c1);
    assert!(r.starts_with("HTTP/1.1 200"), "refused client: {r}");
    // With room again, the next offer is taken and served.
    await_cond("the local hand-off drained", || local.pending() == 0);
    let (mut c2, s2) = short_request(&listener);
    match migrate(s2, target.addr(), &cfg) {
        Outcome::Migrated(_) => {}
        other => panic!("expected a migration, got {other:?}"),
    }
    let r = response(&mut c2);
    assert!(r.starts_with("HTTP/1.1 200"), "migrated client: {r}");
    eprintln!("target: {}", target.summary_json());
    let o = std::sync::atomic::Ordering::Relaxed;
    let h = target.handoff_stats();
    assert_eq!(h.handed.load(o), 1);
    assert_eq!(h.closed(), 0);
    assert_eq!(target.stats().refused.load(o), 1);
    assert_eq!(local.stats().closed(), 0);
    target.stop();
    backend.stop();
}
