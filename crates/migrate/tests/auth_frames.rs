//! The authenticated framing (wire version 3, `wire::Auth`), no root: every message
//! round-trips between two daemons holding the same key; a forged, replayed or
//! wrong-key frame is refused and counted; a target reads nothing of a payload whose
//! envelope does not verify.

use std::io::{self, Cursor, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use farside_auth::mac::{self, Domain, Envelope};
use farside_auth::siphash::SipKey;
use farside_migrate::wire::{
    self, read_message_auth, write_message_auth, Auth, Message, AUTH_ENVELOPE_BYTES, HEADER_BYTES,
};
use farside_migrate::{ControlConn, RepairWindow, TargetOutcome, TcpOptions, TcpState};

const KEY: SipKey = SipKey::from_halves(0x9e37_79b9_7f4a_7c15, 0xbf58_476d_1ce4_e5b9);
const OTHER: SipKey = SipKey::from_halves(0x94d0_49bb_1331_11eb, 0x2545_f491_4f6c_dd1d);

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
        send_queue: (0..5000u32).map(|i| i as u8).collect(),
        unsent_len: 100,
        recv_queue: vec![2; 3000],
    }
}

fn messages() -> Vec<Message> {
    vec![
        Message::Offer(state()),
        Message::OfferCommit(state()),
        Message::Accept,
        Message::Refuse("loaded".into()),
        Message::Commit,
        Message::Restored,
        Message::Failed("no".into()),
        Message::Done,
        Message::Abort,
        Message::Released,
    ]
}

fn sealed(auth: &Auth, m: &Message) -> Vec<u8> {
    let mut b = Vec::new();
    write_message_auth(&mut b, m, Some(auth)).unwrap();
    b
}

fn read(auth: &Auth, bytes: &[u8]) -> io::Result<Message> {
    read_message_auth(&mut Cursor::new(bytes), Some(auth))
}

#[test]
fn every_message_round_trips_under_the_shared_key() {
    let (src, dst) = (Auth::new(KEY), Auth::new(KEY));
    for m in messages() {
        let b = sealed(&src, &m);
        assert_eq!(&b[AUTH_ENVELOPE_BYTES..AUTH_ENVELOPE_BYTES + 4], b"FSMG");
        assert_eq!(b[AUTH_ENVELOPE_BYTES + 4], wire::VERSION_AUTH);
        assert_eq!(read(&dst, &b).unwrap(), m);
    }
    assert_eq!(dst.refused(), 0);
}

#[test]
fn a_forged_frame_is_refused_wherever_it_was_changed() {
    let src = Auth::new(KEY);
    for m in [
        Message::Offer(state()),
        Message::Refuse("x".into()),
        Message::Done,
    ] {
        let good = sealed(&src, &m);
        // Every byte of a short frame, a sample of an OFFER's.
        let step = if good.len() > 200 { 97 } else { 1 };
        for i in (0..good.len()).step_by(step) {
            let dst = Auth::new(KEY);
            let mut b = good.clone();
            b[i] ^= 0x20;
            let r = read(&dst, &b);
            assert!(r.is_err(), "byte {i} of {m:?} changed, still accepted");
            // A change of the payload's lengths may end the read early (truncated);
            // everything the checks see is counted.
            if i < AUTH_ENVELOPE_BYTES + HEADER_BYTES {
                assert_eq!(dst.refused(), 1, "byte {i}");
            }
        }
    }
}

#[test]
fn a_replayed_frame_is_refused() {
    let (src, dst) = (Auth::new(KEY), Auth::new(KEY));
    let b = sealed(&src, &Message::Done);
    assert_eq!(read(&dst, &b).unwrap(), Message::Done);
    let e = read(&dst, &b).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert_eq!(dst.refused(), 1);
}

#[test]
fn a_frame_whose_sequence_clock_is_far_off_is_refused() {
    let dst = Auth::new(KEY);
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // DONE sealed by hand under the right key, with a sequence from long ago (a
    // recording replayed to a receiver that restarted) or from the future.
    let done = |sent_s: u64| {
        let mut header = wire::encode(&Message::Done);
        header[4] = wire::VERSION_AUTH;
        let env = Envelope {
            key_id: Auth::key_id_of(&KEY),
            sender: 99,
            seq: sent_s << 32 | 1,
        };
        let mut b = Vec::new();
        mac::seal(&mut b, Domain::SpecdMigration, &KEY, &env, &header).unwrap();
        b
    };
    let skew = wire::SEQ_CLOCK_SKEW_MAX_S;
    assert!(read(&dst, &done(now_s - skew - 60)).is_err());
    assert!(read(&dst, &done(now_s + skew + 60)).is_err());
    assert_eq!(dst.refused(), 2);
    assert_eq!(read(&dst, &done(now_s)).unwrap(), Message::Done);
}

#[test]
fn a_frame_under_another_key_is_refused() {
    let (src, dst) = (Auth::new(OTHER), Auth::new(KEY));
    assert_ne!(Auth::key_id_of(&KEY), Auth::key_id_of(&OTHER));
    let e = read(&dst, &sealed(&src, &Message::Restored)).unwrap_err();
    assert!(e.to_string().contains("not authentic"), "{e}");
    assert_eq!(dst.refused(), 1);
    // And an unkeyed frame at a keyed receiver.
    let mut plain = Vec::new();
    wire::write_message(&mut plain, &Message::Restored).unwrap();
    plain.extend_from_slice(&[0; AUTH_ENVELOPE_BYTES]);
    assert!(read(&dst, &plain).is_err());
    assert_eq!(dst.refused(), 2);
}

#[test]
fn a_keyed_target_reads_no_payload_behind_a_forged_envelope() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut src = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (t, _) = l.accept().unwrap();
    let target_auth = Arc::new(Auth::new(KEY));
    let mut conn = ControlConn::new(t, Duration::from_secs(2)).unwrap();
    conn.set_auth(Arc::clone(&target_auth));
    // An OFFER sealed under another key: its envelope fails, its 8 KiB payload stays
    // unread in the socket.
    let forged = sealed(&Auth::new(OTHER), &Message::Offer(state()));
    src.write_all(&forged).unwrap();
    let mut admitted = false;
    let out = conn
        .serve_next(
            Duration::from_secs(5),
            |_| {
                admitted = true;
                Ok(())
            },
            |_| panic!("nothing is restored here"),
        )
        .unwrap();
    assert!(
        matches!(&out, Some(TargetOutcome::SourceGone(e)) if e.kind() == io::ErrorKind::InvalidData),
        "{out:?}"
    );
    assert!(!admitted);
    assert!(!conn.reusable(), "the connection ends");
    assert_eq!(target_auth.refused(), 1);
    let mut unread: libc::c_int = 0;
    // SAFETY: FIONREAD into a local int.
    let r = unsafe { libc::ioctl(conn.stream().as_raw_fd(), libc::FIONREAD, &mut unread) };
    assert_eq!(r, 0);
    assert!(
        unread as usize + AUTH_ENVELOPE_BYTES + HEADER_BYTES >= forged.len() - 4096,
        "{unread} of {} bytes left unread",
        forged.len()
    );
}
