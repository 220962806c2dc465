//! The acknowledged end of a migration (wire version 3): a source counts a connection
//! migrated only when the target answers DONE with RELEASED. A target that answers
//! FAILED, or nothing, leaves the connection with the source, which takes the flow
//! back and resumes it. The "target" here speaks the protocol by hand and restores
//! nothing (so source and target share the namespace). Needs root (TCP_REPAIR):
//! `cargo test -p farside-migrate -- --include-ignored`.

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::Duration;

use farside_migrate::proto::migrate_with_back;
use farside_migrate::testkit::{await_cond, inq, is_root};
use farside_migrate::wire::{self, read_message, write_message, Message};
use farside_migrate::{Fallback, MigrateConfig, Outcome};

/// The sources' reply timeout here.
const REPLY_TIMEOUT: Duration = Duration::from_secs(1);

/// What the hand-made target does after DONE.
#[derive(Clone, Copy)]
enum AfterDone {
    Released,
    Failed,
    Silent,
    /// No DONE awaited: RESTORED is trickled a byte every 300 ms.
    TrickleRestored,
}

/// Serves one OFFER_COMMIT: RESTORED (without restoring), then `after` to DONE.
fn fake_target(after: AfterDone) -> (std::net::SocketAddr, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || {
        let (c, _) = l.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut w = c.try_clone().unwrap();
        let mut r = BufReader::new(c);
        assert!(matches!(
            read_message(&mut r).unwrap(),
            Message::OfferCommit(_)
        ));
        if let AfterDone::TrickleRestored = after {
            for b in wire::encode(&Message::Restored) {
                if w.write_all(&[b]).is_err() {
                    return;
                }
                thread::sleep(Duration::from_millis(300));
            }
            return;
        }
        write_message(&mut w, &Message::Restored).unwrap();
        assert_eq!(read_message(&mut r).unwrap(), Message::Done);
        match after {
            AfterDone::Released => write_message(&mut w, &Message::Released).unwrap(),
            AfterDone::Failed => {
                write_message(&mut w, &Message::Failed("release failed".into())).unwrap()
            }
            // Closes without a word.
            AfterDone::Silent | AfterDone::TrickleRestored => {}
        }
    });
    (addr, t)
}

/// Migrates a connection with a request queued to the hand-made target; returns the
/// outcome, the client and the flow moves (there, back).
fn run(after: AfterDone) -> (Outcome, TcpStream, u32, u32) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (s, _) = l.accept().unwrap();
    client.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    await_cond("the request queued", || inq(&s).unwrap() > 0);
    let (target, t) = fake_target(after);
    let (there, back) = (AtomicU32::new(0), AtomicU32::new(0));
    let cfg = MigrateConfig {
        reply_timeout: REPLY_TIMEOUT,
        ..MigrateConfig::default()
    };
    let outcome = migrate_with_back(
        s,
        target,
        &cfg,
        || {
            there.fetch_add(1, Ordering::SeqCst);
            Ok(())
        },
        || {
            back.fetch_add(1, Ordering::SeqCst);
            Ok(())
        },
    );
    t.join().unwrap();
    (outcome, client, there.into_inner(), back.into_inner())
}

/// The connection resumed on the source still carries both ways.
fn works(mut s: TcpStream, mut client: TcpStream) {
    let mut b = [0u8; 16];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"GET / HTTP/1.1\r\n");
    s.write_all(b"ok").unwrap();
    let mut r = [0u8; 2];
    client.read_exact(&mut r).unwrap();
    assert_eq!(&r, b"ok");
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn released_is_a_migration() {
    assert!(is_root(), "needs root");
    let (outcome, _client, there, back) = run(AfterDone::Released);
    assert!(matches!(outcome, Outcome::Migrated(_)), "{outcome:?}");
    assert_eq!((there, back), (1, 0));
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn failed_after_done_takes_the_flow_back_and_resumes() {
    assert!(is_root(), "needs root");
    let (outcome, client, there, back) = run(AfterDone::Failed);
    assert_eq!((there, back), (1, 1));
    match outcome {
        Outcome::ResumedOnSource {
            sock,
            reason: Fallback::RestoreFailed(r),
        } => {
            assert!(r.contains("release failed"));
            works(sock, client);
        }
        other => panic!("expected a fall-back, got {other:?}"),
    }
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn no_answer_after_done_takes_the_flow_back_and_resumes() {
    assert!(is_root(), "needs root");
    let (outcome, client, there, back) = run(AfterDone::Silent);
    assert_eq!((there, back), (1, 1));
    match outcome {
        Outcome::ResumedOnSource {
            sock,
            reason: Fallback::TargetGone(e),
        } => {
            assert!(e.to_string().contains("RELEASED"), "{e}");
            works(sock, client);
        }
        other => panic!("expected a fall-back, got {other:?}"),
    }
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn a_trickled_reply_is_cut_at_twice_the_reply_timeout() {
    assert!(is_root(), "needs root");
    let t0 = std::time::Instant::now();
    let (outcome, client, there, back) = run(AfterDone::TrickleRestored);
    // Each byte within the per-read bound, the whole RESTORED (3 s) not.
    assert!(t0.elapsed() < REPLY_TIMEOUT * 2 + Duration::from_secs(2));
    assert_eq!((there, back), (0, 0));
    match outcome {
        Outcome::ResumedOnSource {
            sock,
            reason: Fallback::TargetGone(e),
        } => {
            // The deadline's own check, or the last recv's (lowered) timeout.
            assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ),
                "{e}"
            );
            works(sock, client);
        }
        other => panic!("expected a fall-back, got {other:?}"),
    }
}
