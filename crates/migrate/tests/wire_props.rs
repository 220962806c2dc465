//! Property tests of the wire format (no root): seeded random states and messages
//! round-trip exactly; truncated, extended, corrupted or oversized input is refused
//! with an error, never a panic or an unbounded allocation.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use farside_migrate::wire::{
    self, decode, encode, Message, HEADER_BYTES, PAYLOAD_BYTES_MAX, REASON_BYTES_MAX,
};
use farside_migrate::{RepairWindow, TcpOptions, TcpState, WireError, QUEUE_BYTES_MAX};

/// Random cases per property: enough to hit every optional field many times, fast
/// in a debug build.
const CASES: usize = 2_000;
/// Largest random queue: exercises lengths across several bytes of the length field
/// without slowing the suite.
const QUEUE_BYTES_TEST_MAX: usize = 3_000;

/// xorshift64*: deterministic, so a failure reproduces from its case number.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn u32(&mut self) -> u32 {
        self.next() as u32
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn addr(r: &mut Rng, v4: bool) -> SocketAddr {
    if v4 {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(r.u32()), r.next() as u16))
    } else {
        SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from((u128::from(r.next()) << 64) | u128::from(r.next())),
            r.next() as u16,
            r.u32() & 0x000f_ffff,
            r.u32(),
        ))
    }
}

fn state(r: &mut Rng) -> TcpState {
    let v4 = r.below(2) == 0;
    let send_len = if r.below(4) == 0 {
        0
    } else {
        r.below(QUEUE_BYTES_TEST_MAX as u64) as usize
    };
    let recv_len = if r.below(4) == 0 {
        0
    } else {
        r.below(QUEUE_BYTES_TEST_MAX as u64) as usize
    };
    let snd_wnd = r.u32() >> 1;
    TcpState {
        local: addr(r, v4),
        remote: addr(r, v4),
        snd_seq: r.u32(),
        rcv_seq: r.u32(),
        options: TcpOptions {
            mss: 1 + r.below(65_535) as u16,
            wscale: (r.below(2) == 0).then(|| (r.below(15) as u8, r.below(15) as u8)),
            sack: r.below(2) == 0,
            timestamps: r.below(2) == 0,
        },
        timestamp: r.u32(),
        window: RepairWindow {
            snd_wl1: r.u32(),
            snd_wnd,
            max_window: snd_wnd + (r.u32() >> 1),
            rcv_wnd: r.u32(),
            rcv_wup: r.u32(),
        },
        sndbuf: r.u32(),
        rcvbuf: r.u32(),
        send_queue: r.bytes(send_len),
        unsent_len: r.below(send_len as u64 + 1) as u32,
        recv_queue: r.bytes(recv_len),
    }
}

fn message(r: &mut Rng) -> Message {
    let text = |r: &mut Rng| {
        let n = r.below(REASON_BYTES_MAX as u64 + 1) as usize;
        (0..n)
            .map(|_| (b'a' + r.below(26) as u8) as char)
            .collect::<String>()
    };
    match r.below(10) {
        0 => Message::Offer(state(r)),
        9 => Message::Released,
        7 => Message::OfferCommit(state(r)),
        1 => Message::Accept,
        2 => Message::Refuse(text(r)),
        3 => Message::Commit,
        4 => Message::Restored,
        5 => Message::Done,
        6 => Message::Abort,
        _ => Message::Failed(text(r)),
    }
}

#[test]
fn random_messages_round_trip_exactly() {
    let mut r = Rng(0x5eed_0001);
    for case in 0..CASES {
        let m = message(&mut r);
        let frame = encode(&m);
        assert_eq!(decode(&frame), Ok(m.clone()), "case {case}");
        // The stream reader agrees with the slice decoder.
        let got = wire::read_message(&mut io::Cursor::new(&frame)).expect("read_message");
        assert_eq!(got, m, "case {case}");
    }
}

#[test]
fn every_truncation_is_refused() {
    let mut r = Rng(0x5eed_0002);
    for case in 0..50 {
        let frame = encode(&message(&mut r));
        for cut in 0..frame.len() {
            assert_eq!(
                decode(&frame[..cut]),
                Err(WireError::Truncated),
                "case {case}, cut at {cut} of {}",
                frame.len()
            );
            let e = wire::read_message(&mut io::Cursor::new(&frame[..cut])).unwrap_err();
            assert_eq!(
                e.kind(),
                io::ErrorKind::UnexpectedEof,
                "case {case} cut {cut}"
            );
        }
    }
}

#[test]
fn trailing_bytes_are_refused() {
    let mut r = Rng(0x5eed_0003);
    for _ in 0..200 {
        let mut frame = encode(&message(&mut r));
        frame.push(r.next() as u8);
        assert_eq!(decode(&frame), Err(WireError::Trailing(1)));
    }
}

#[test]
fn corrupted_frames_never_panic_and_accepted_ones_are_canonical() {
    let mut r = Rng(0x5eed_0004);
    for _ in 0..CASES {
        let mut frame = encode(&message(&mut r));
        for _ in 0..1 + r.below(3) {
            let i = r.below(frame.len() as u64) as usize;
            frame[i] ^= 1 << r.below(8);
        }
        // The stream reader (which reads an OFFER's queues straight into their
        // buffers) accepts exactly what the slice decoder accepts, when it reads the
        // whole input (a corrupted length can end a frame early: a stream leaves the
        // rest for the next frame, the slice decoder calls it trailing bytes).
        let mut cur = io::Cursor::new(&frame);
        let streamed = wire::read_message(&mut cur);
        let whole = streamed.is_ok() && cur.position() == frame.len() as u64;
        assert_eq!(whole, decode(&frame).is_ok());
        if let Ok(m) = decode(&frame) {
            // Whatever decodes is valid and encodes back to the same bytes: the
            // format has one encoding per message, so no ambiguity to exploit.
            if let Message::Offer(st) = &m {
                assert!(st.validate().is_ok());
            }
            assert_eq!(encode(&m), frame);
            assert_eq!(streamed.unwrap(), m);
        }
    }
}

/// Takes at most 7 bytes per write: exercises the vectored writer's partial writes.
struct Dribble(Vec<u8>);

impl io::Write for Dribble {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = b.len().min(7);
        self.0.extend_from_slice(&b[..n]);
        Ok(n)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match bufs.iter().find(|b| !b.is_empty()) {
            Some(b) => self.write(b),
            None => Ok(0),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_vectored_offer_writer_sends_the_canonical_frame() {
    let mut r = Rng(0x5eed_0006);
    for case in 0..200 {
        let st = state(&mut r);
        let frame = encode(&Message::Offer(st.clone()));
        let mut whole = Vec::new();
        wire::write_offer(&mut whole, &st).unwrap();
        assert_eq!(whole, frame, "case {case}");
        let mut d = Dribble(Vec::new());
        wire::write_message(&mut d, &Message::Offer(st)).unwrap();
        assert_eq!(d.0, frame, "case {case} in 7-byte writes");
    }
}

#[test]
fn another_wire_version_is_refused_with_both_versions_named() {
    let mut frame = encode(&Message::Accept);
    frame[4] = 1;
    let e = wire::read_message(&mut io::Cursor::new(&frame)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    let text = e.to_string();
    assert!(
        text.contains("version 1") && text.contains(&format!("speaks {}", wire::VERSION)),
        "{text}"
    );
}

#[test]
fn a_target_answers_a_version_1_source_with_a_refusal_naming_the_versions() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut src = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    src.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let (c, _) = l.accept().unwrap();
    // An OFFER as a version-1 source frames it.
    let mut r = Rng(0x5eed_0007);
    let mut frame = encode(&Message::Offer(state(&mut r)));
    frame[4] = 1;
    io::Write::write_all(&mut src, &frame).unwrap();
    let mut conn =
        farside_migrate::ControlConn::new(c, std::time::Duration::from_secs(10)).unwrap();
    let o = conn
        .serve_next(
            std::time::Duration::from_secs(10),
            |_| panic!("a version-1 offer must not reach admission"),
            |_| unreachable!(),
        )
        .unwrap();
    match o {
        Some(farside_migrate::TargetOutcome::SourceGone(e)) => {
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}")
        }
        o => panic!("{o:?}"),
    }
    assert!(!conn.reusable());
    match wire::read_message(&mut src).unwrap() {
        Message::Refuse(text) => assert!(
            text.contains("version 1") && text.contains(&format!("speaks {}", wire::VERSION)),
            "{text}"
        ),
        m => panic!("{m:?}"),
    }
}

#[test]
fn random_garbage_never_panics() {
    let mut r = Rng(0x5eed_0005);
    for _ in 0..CASES {
        let n = r.below(200) as usize;
        let mut g = r.bytes(n);
        if r.below(2) == 0 && g.len() >= 6 {
            // A valid header prefix, to get past the magic into the payload checks.
            g[..4].copy_from_slice(&wire::MAGIC);
            g[4] = wire::VERSION;
            g[5] = 1 + r.below(10) as u8;
        }
        let _ = decode(&g);
    }
}

fn header(kind: u8, len: u32) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..4].copy_from_slice(&wire::MAGIC);
    h[4] = wire::VERSION;
    h[5] = kind;
    h[6..].copy_from_slice(&len.to_be_bytes());
    h
}

#[test]
fn header_checks_refuse_bad_magic_version_kind_and_oversize() {
    let mut h = header(2, 0);
    h[0] = b'X';
    assert_eq!(wire::decode_header(&h), Err(WireError::Magic));
    let mut h = header(2, 0);
    h[4] = wire::VERSION + 1;
    assert_eq!(
        wire::decode_header(&h),
        Err(WireError::Version(wire::VERSION + 1))
    );
    assert_eq!(wire::decode_header(&header(0, 0)), Err(WireError::Kind(0)));
    // 10 is RELEASED (version 3), 11 nothing.
    assert!(wire::decode_header(&header(10, 0)).is_ok());
    assert_eq!(
        wire::decode_header(&header(11, 0)),
        Err(WireError::Kind(11))
    );
    assert!(matches!(
        wire::decode_header(&header(9, PAYLOAD_BYTES_MAX as u32 + 1)),
        Err(WireError::TooLarge(..))
    ));
    // Payload-less kinds carry no payload; reasons and offers are bounded.
    assert!(matches!(
        wire::decode_header(&header(2, 1)),
        Err(WireError::TooLarge(..))
    ));
    assert!(matches!(
        wire::decode_header(&header(3, REASON_BYTES_MAX as u32 + 1)),
        Err(WireError::TooLarge(..))
    ));
    assert!(matches!(
        wire::decode_header(&header(1, PAYLOAD_BYTES_MAX as u32 + 1)),
        Err(WireError::TooLarge(..))
    ));
    // A stream announcing 4 GiB is refused from its header, before any allocation.
    let e = wire::read_message(&mut io::Cursor::new(header(1, u32::MAX))).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
}

/// Encodes `st` and lets `mutate` edit the OFFER payload bytes (offsets for IPv4).
fn offer_with(st: &TcpState, mutate: impl FnOnce(&mut Vec<u8>)) -> Result<Message, WireError> {
    let frame = encode(&Message::Offer(st.clone()));
    let mut payload = frame[HEADER_BYTES..].to_vec();
    mutate(&mut payload);
    wire::decode_payload(1, &payload)
}

#[test]
fn invalid_state_fields_are_refused() {
    let mut r = Rng(0x5eed_0006);
    let mut st = state(&mut r);
    st.local = "10.0.0.1:80".parse().unwrap();
    st.remote = "10.0.0.2:5000".parse().unwrap();
    st.options.wscale = Some((7, 7));
    st.send_queue = vec![1, 2, 3];
    st.unsent_len = 1;
    // IPv4 layout: family 1, two addrs 2*6, three seqs 12 → mss at 25, flags 27,
    // wscales 28/29, window 30..50, bufs 50..58, unsent 58..62, send_len 62..66.
    assert!(matches!(
        offer_with(&st, |p| p[0] = 5),
        Err(WireError::Invalid(_))
    ));
    assert!(matches!(
        offer_with(&st, |p| p[27] |= 0x80),
        Err(WireError::Invalid(_))
    ));
    assert!(matches!(
        offer_with(&st, |p| p[28] = 15),
        Err(WireError::Invalid(_))
    ));
    assert!(matches!(
        offer_with(&st, |p| p[27] &= !1),
        Err(WireError::Invalid(_))
    )); // window scales present without the flag
    assert!(matches!(
        offer_with(&st, |p| p[25..27].copy_from_slice(&[0, 0])),
        Err(WireError::Invalid(_))
    )); // MSS 0
    assert!(matches!(
        offer_with(&st, |p| p[58..62].copy_from_slice(&4u32.to_be_bytes())),
        Err(WireError::Invalid(_))
    )); // more unsent bytes than queued
    assert!(matches!(
        offer_with(&st, |p| p[62..66]
            .copy_from_slice(&(QUEUE_BYTES_MAX as u32 + 1).to_be_bytes())),
        Err(WireError::TooLarge(..))
    ));
    assert!(matches!(
        offer_with(&st, |p| {
            p[34..38].copy_from_slice(&u32::MAX.to_be_bytes()); // snd_wnd
            p[38..42].copy_from_slice(&0u32.to_be_bytes()); // max_window
        }),
        Err(WireError::Invalid(_))
    ));
    assert!(matches!(
        wire::decode_payload(3, &[0xff, 0xfe]),
        Err(WireError::Invalid(_))
    )); // reason not UTF-8
    assert_eq!(offer_with(&st, |_| {}), Ok(Message::Offer(st.clone())));
}
