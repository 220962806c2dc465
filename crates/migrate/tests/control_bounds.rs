//! The target's bounds on what a peer sends (no root: no offer here gets as far as a
//! restore): a message that trickles in is cut at its deadline, a length on the wire
//! is not trusted (the budget is reserved, the bytes are not allocated until they
//! arrive), and an offer that does not fit the memory budget is refused unread.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farside_migrate::proto::OfferBudget;
use farside_migrate::wire::{self, Message, HEADER_BYTES, PAYLOAD_BYTES_MAX};
use farside_migrate::{
    ControlConn, RepairWindow, TargetOutcome, TcpOptions, TcpState, QUEUE_BYTES_MAX,
};

/// Bound on each awaited result here.
const AWAIT_MAX: Duration = Duration::from_secs(10);
/// The deadline per message the tests give their connections.
const DEADLINE: Duration = Duration::from_millis(400);
/// Where the send queue's length sits in an IPv4 OFFER frame (header, family,
/// two addresses, seqs and timestamp, options, window, buffers, unsent length).
const SEND_LEN_AT: usize = HEADER_BYTES + 1 + 2 * 6 + 3 * 4 + 5 + 5 * 4 + 3 * 4;

fn state() -> TcpState {
    TcpState {
        local: "10.0.0.1:80".parse().unwrap(),
        remote: "192.0.2.7:40000".parse().unwrap(),
        snd_seq: 1000,
        rcv_seq: 2000,
        options: TcpOptions {
            mss: 1460,
            wscale: Some((7, 7)),
            sack: true,
            timestamps: true,
        },
        timestamp: 5,
        window: RepairWindow {
            snd_wl1: 2000,
            snd_wnd: 65535,
            max_window: 65535,
            rcv_wnd: 65535,
            rcv_wup: 2000,
        },
        sndbuf: 1 << 16,
        rcvbuf: 1 << 16,
        send_queue: vec![1; 100],
        unsent_len: 0,
        recv_queue: vec![2; 100],
    }
}

/// A connected pair: (source end, target's ControlConn with the test deadline).
fn pair() -> (TcpStream, ControlConn, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let src = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (t, peer) = l.accept().unwrap();
    let mut conn = ControlConn::new(t, Duration::from_secs(1)).unwrap();
    conn.set_message_deadline(DEADLINE);
    (src, conn, peer)
}

fn serve(conn: &mut ControlConn) -> (Option<TargetOutcome>, Duration, bool) {
    let t0 = Instant::now();
    let mut admitted = false;
    let out = conn
        .serve_next(
            AWAIT_MAX,
            |_| {
                admitted = true;
                Err("test".into())
            },
            |_| panic!("nothing is restored here"),
        )
        .unwrap();
    (out, t0.elapsed(), admitted)
}

fn timed_out(out: &Option<TargetOutcome>) -> bool {
    matches!(out, Some(TargetOutcome::SourceGone(e))
        if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock))
}

#[test]
fn a_trickling_sender_is_cut_at_the_message_deadline() {
    let (mut src, mut conn, _) = pair();
    let frame = wire::encode(&Message::Offer(state()));
    let trickle = std::thread::spawn(move || {
        // A byte every 50 ms: each recv is well within the per-read bound, the
        // whole frame (≈ 280 bytes) would take 14 s.
        for b in frame {
            if src.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let budget = Arc::new(OfferBudget::new(1 << 20));
    conn.set_budget(Arc::clone(&budget));
    let (out, took, admitted) = serve(&mut conn);
    assert!(timed_out(&out), "{out:?}");
    assert!(!admitted);
    assert!(
        took >= DEADLINE && took < DEADLINE + Duration::from_secs(2),
        "{took:?}"
    );
    assert!(!conn.reusable());
    assert_eq!(budget.used(), 0, "the reservation is given back");
    drop(conn);
    trickle.join().unwrap();
}

#[test]
fn a_lying_length_reserves_the_budget_but_allocates_nothing_it_was_not_sent() {
    let (mut src, mut conn, _) = pair();
    // An OFFER claiming a 32 MiB send queue, of which 10 bytes come.
    let mut frame = wire::encode(&Message::Offer(state()));
    frame.truncate(SEND_LEN_AT + 4);
    let claim = QUEUE_BYTES_MAX;
    frame[SEND_LEN_AT..SEND_LEN_AT + 4].copy_from_slice(&(claim as u32).to_be_bytes());
    let len = (SEND_LEN_AT + 4 - HEADER_BYTES) + claim + 4;
    frame[6..10].copy_from_slice(&(len as u32).to_be_bytes());
    frame.extend_from_slice(&[0; 10]);
    src.write_all(&frame).unwrap();
    let budget = Arc::new(OfferBudget::new(PAYLOAD_BYTES_MAX));
    conn.set_budget(Arc::clone(&budget));
    let watch = {
        let budget = Arc::clone(&budget);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while budget.used() == 0 && t0.elapsed() < AWAIT_MAX {
                std::thread::sleep(Duration::from_millis(1));
            }
            budget.used()
        })
    };
    let (out, took, admitted) = serve(&mut conn);
    assert!(timed_out(&out), "{out:?}");
    assert!(!admitted);
    assert!(took < DEADLINE + Duration::from_secs(2), "{took:?}");
    assert_eq!(
        watch.join().unwrap(),
        len,
        "the announced length was reserved"
    );
    assert_eq!(budget.used(), 0, "and given back");
}

#[test]
fn an_offer_over_the_memory_budget_is_refused_unread() {
    let (mut src, mut conn, _) = pair();
    let frame = wire::encode(&Message::Offer(state()));
    src.write_all(&frame).unwrap();
    let budget = Arc::new(OfferBudget::new(100));
    conn.set_budget(Arc::clone(&budget));
    let (out, _, admitted) = serve(&mut conn);
    assert!(
        matches!(&out, Some(TargetOutcome::Refused(r)) if r.contains("budget")),
        "{out:?}"
    );
    assert!(!admitted);
    assert!(!conn.reusable(), "the unread payload ends the connection");
    assert_eq!(budget.refused(), 1);
    assert_eq!(budget.used(), 0);
    src.set_read_timeout(Some(AWAIT_MAX)).unwrap();
    let mut h = [0u8; HEADER_BYTES];
    src.read_exact(&mut h).unwrap();
    let (kind, n) = wire::decode_header(&h).unwrap();
    let mut rest = vec![0u8; n];
    src.read_exact(&mut rest).unwrap();
    assert!(matches!(
        wire::decode_payload(kind, &rest),
        Ok(Message::Refuse(_))
    ));
}
