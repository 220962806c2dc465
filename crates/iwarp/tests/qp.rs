//! Two queue pairs wired back to back without sockets: set-up, every operation, and
//! every placement refusal answered by its Terminate.

use farside_iwarp::mpa::MpaConfig;
use farside_iwarp::qp::{Event, Qp, QpConfig, QpState, RecvWr, SendWr, Sge};
use farside_iwarp::term::TermCode;
use farside_iwarp::verbs::{Access, Cq, Device, PdId, WcOpcode, WcStatus};

struct Side {
    dev: Device,
    pd: PdId,
    cq: Cq,
    qp: Qp,
    events: Vec<Event>,
}

struct Pair {
    a: Side,
    b: Side,
}

fn side(seed: u64, active: bool, cfg: QpConfig) -> Side {
    let mut dev = Device::new(seed);
    let pd = dev.alloc_pd().unwrap();
    let qp = if active {
        Qp::connect(pd, cfg)
    } else {
        Qp::accept(pd, cfg)
    };
    Side {
        dev,
        pd,
        cq: Cq::new(64).unwrap(),
        qp,
        events: Vec::new(),
    }
}

impl Pair {
    fn new(ca: QpConfig, cb: QpConfig) -> Pair {
        let mut p = Pair {
            a: side(1, true, ca),
            b: side(2, false, cb),
        };
        p.run();
        p
    }

    /// Move bytes both ways until neither side has any; count the rounds.
    fn run(&mut self) -> usize {
        let mut rounds = 0;
        loop {
            let ta = self.a.qp.take_tx(&self.a.dev, &mut self.a.cq);
            let tb = self.b.qp.take_tx(&self.b.dev, &mut self.b.cq);
            if ta.is_empty() && tb.is_empty() {
                return rounds;
            }
            rounds += 1;
            // Deliver in small pieces: the deframer must not care.
            for c in ta.chunks(7) {
                let e = self.b.qp.on_bytes(&mut self.b.dev, &mut self.b.cq, c);
                self.b.events.extend(e);
            }
            for c in tb.chunks(5) {
                let e = self.a.qp.on_bytes(&mut self.a.dev, &mut self.a.cq, c);
                self.a.events.extend(e);
            }
        }
    }
}

fn cfg(crc: bool, ird: u16, ord: u16) -> QpConfig {
    QpConfig {
        mpa: MpaConfig {
            crc,
            enhanced: true,
            ird,
            ord,
            private_data: b"farside".to_vec(),
        },
        emss: 100, // small FPDUs: every message is segmented
        ..Default::default()
    }
}

fn established(p: &Pair) -> bool {
    matches!(p.a.events.first(), Some(Event::Established(_)))
        && matches!(p.b.events.first(), Some(Event::Established(_)))
}

#[test]
fn set_up_with_crc_on_and_off_then_write_read_send() {
    for crc in [true, false] {
        let mut p = Pair::new(cfg(crc, 4, 4), cfg(false, 4, 4));
        assert!(established(&p));
        assert_eq!(p.a.qp.negotiated().unwrap().crc, crc);
        assert_eq!(p.b.qp.negotiated().unwrap().peer_private_data, b"farside");

        let src =
            p.a.dev
                .reg_mr(p.a.pd, 0x1000, 1000, Access::LOCAL_WRITE)
                .unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        p.a.dev.write(src, 0x1000, &data).unwrap();
        let sink =
            p.b.dev
                .reg_mr(p.b.pd, 0, 1000, Access::REMOTE_WRITE | Access::REMOTE_READ)
                .unwrap();
        p.a.qp
            .post_send(SendWr::Write {
                wr_id: 1,
                local: Sge {
                    stag: src,
                    to: 0x1000,
                    len: 1000,
                },
                remote_stag: sink,
                remote_to: 0,
            })
            .unwrap();
        p.run();
        assert_eq!(p.b.dev.read(sink, 0, 1000).unwrap(), &data[..]);
        let wc = p.a.cq.poll().unwrap();
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (1, WcOpcode::Write, WcStatus::Success)
        );

        // Read it back into another region of A.
        let back =
            p.a.dev
                .reg_mr(p.a.pd, 0, 1000, Access::LOCAL_WRITE)
                .unwrap();
        p.a.qp
            .post_send(SendWr::Read {
                wr_id: 2,
                local: Sge {
                    stag: back,
                    to: 0,
                    len: 1000,
                },
                remote_stag: sink,
                remote_to: 0,
            })
            .unwrap();
        p.run();
        let wc = p.a.cq.poll().unwrap();
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status, wc.byte_len),
            (2, WcOpcode::Read, WcStatus::Success, 1000)
        );
        assert_eq!(p.a.dev.read(back, 0, 1000).unwrap(), &data[..]);

        // Send and Send-SE into posted receives.
        let rbuf = p.b.dev.reg_mr(p.b.pd, 0, 512, Access::LOCAL_WRITE).unwrap();
        for i in 0..2 {
            p.b.qp
                .post_recv(RecvWr {
                    wr_id: 10 + i,
                    sge: Sge {
                        stag: rbuf,
                        to: 256 * i,
                        len: 256,
                    },
                })
                .unwrap();
        }
        for (i, se) in [(0u64, false), (1, true)] {
            p.a.qp
                .post_send(SendWr::Send {
                    wr_id: 20 + i,
                    local: Sge {
                        stag: src,
                        to: 0x1000,
                        len: 200,
                    },
                    solicited: se,
                    invalidate: None,
                })
                .unwrap();
        }
        p.run();
        for i in 0..2u64 {
            let wc = p.b.cq.poll().unwrap();
            assert_eq!(
                (wc.wr_id, wc.opcode, wc.byte_len, wc.solicited),
                (10 + i, WcOpcode::Recv, 200, i == 1)
            );
            assert_eq!(p.b.dev.read(rbuf, 256 * i, 200).unwrap(), &data[..200]);
        }
        assert_eq!(*p.a.qp.state(), QpState::Rts);
        assert_eq!(*p.b.qp.state(), QpState::Rts);
    }
}

#[test]
fn reads_wait_for_ord_credits() {
    // A may have 1 Read outstanding (B's IRD is 1).
    let mut p = Pair::new(cfg(true, 4, 4), cfg(true, 1, 4));
    assert_eq!(p.a.qp.negotiated().unwrap().ord, 1);
    let src = p.b.dev.reg_mr(p.b.pd, 0, 64, Access::REMOTE_READ).unwrap();
    let sink =
        p.a.dev
            .reg_mr(p.a.pd, 0, 64 * 3, Access::LOCAL_WRITE)
            .unwrap();
    for i in 0..3u64 {
        p.a.qp
            .post_send(SendWr::Read {
                wr_id: i,
                local: Sge {
                    stag: sink,
                    to: 64 * i,
                    len: 64,
                },
                remote_stag: src,
                remote_to: 0,
            })
            .unwrap();
    }
    let _ = p.a.qp.take_tx(&p.a.dev, &mut p.a.cq);
    assert_eq!(
        p.a.qp.read_queues().0,
        1,
        "only one Read Request may be outstanding"
    );
    // Now with delivery: each Read Response returns a credit.
    let mut p = Pair::new(cfg(true, 4, 4), cfg(true, 1, 4));
    let src = p.b.dev.reg_mr(p.b.pd, 0, 64, Access::REMOTE_READ).unwrap();
    let sink =
        p.a.dev
            .reg_mr(p.a.pd, 0, 64 * 3, Access::LOCAL_WRITE)
            .unwrap();
    for i in 0..3u64 {
        p.a.qp
            .post_send(SendWr::Read {
                wr_id: i,
                local: Sge {
                    stag: sink,
                    to: 64 * i,
                    len: 64,
                },
                remote_stag: src,
                remote_to: 0,
            })
            .unwrap();
    }
    let rounds = p.run();
    assert!(rounds >= 3, "one Read per round trip: {rounds}");
    for i in 0..3 {
        assert_eq!(p.a.cq.poll().unwrap().wr_id, i);
    }
    assert_eq!(*p.b.qp.state(), QpState::Rts);
}

fn refused(p: &mut Pair, wr: SendWr, expect: TermCode) {
    p.a.qp.post_send(wr).unwrap();
    p.run();
    assert_eq!(
        *p.b.qp.state(),
        QpState::Terminated {
            code: expect,
            sent: true
        }
    );
    assert_eq!(
        *p.a.qp.state(),
        QpState::Terminated {
            code: expect,
            sent: false
        }
    );
    assert!(p.a.events.contains(&Event::TerminateReceived(expect)));
}

#[test]
fn write_to_a_bad_stag_is_terminated() {
    let mut p = Pair::new(cfg(true, 4, 4), cfg(true, 4, 4));
    let src = p.a.dev.reg_mr(p.a.pd, 0, 64, Access::NONE).unwrap();
    let sink = p.b.dev.reg_mr(p.b.pd, 0, 64, Access::REMOTE_WRITE).unwrap();
    let local = Sge {
        stag: src,
        to: 0,
        len: 64,
    };
    refused(
        &mut p,
        SendWr::Write {
            wr_id: 1,
            local,
            remote_stag: sink ^ 0x01,
            remote_to: 0,
        },
        TermCode::DDP_T_INVALID_STAG,
    );
}

#[test]
fn each_placement_failure_has_its_terminate() {
    type Case = (&'static str, fn(u32, Sge) -> SendWr, Access, TermCode);
    let cases: &[Case] = &[
        (
            "write out of bounds",
            |s, l| SendWr::Write {
                wr_id: 1,
                local: l,
                remote_stag: s,
                remote_to: 1,
            },
            Access::REMOTE_WRITE,
            TermCode::DDP_T_BASE_BOUNDS,
        ),
        (
            "write without rights",
            |s, l| SendWr::Write {
                wr_id: 1,
                local: l,
                remote_stag: s,
                remote_to: 0,
            },
            Access::REMOTE_READ,
            TermCode::DDP_T_INVALID_STAG,
        ),
        (
            "write with TO wrap",
            |s, l| SendWr::Write {
                wr_id: 1,
                local: l,
                remote_stag: s,
                remote_to: u64::MAX - 1,
            },
            Access::REMOTE_WRITE,
            TermCode::DDP_T_TO_WRAP,
        ),
        (
            "read without rights",
            |s, l| SendWr::Read {
                wr_id: 1,
                local: l,
                remote_stag: s,
                remote_to: 0,
            },
            Access::REMOTE_WRITE,
            TermCode::RDMAP_ACCESS_RIGHTS,
        ),
        (
            "read out of bounds",
            |s, l| SendWr::Read {
                wr_id: 1,
                local: l,
                remote_stag: s,
                remote_to: 8,
            },
            Access::REMOTE_READ,
            TermCode::RDMAP_BASE_BOUNDS,
        ),
        (
            "read of a bad STag",
            |s, l| SendWr::Read {
                wr_id: 1,
                local: l,
                remote_stag: s + 0x100,
                remote_to: 0,
            },
            Access::REMOTE_READ,
            TermCode::RDMAP_INVALID_STAG,
        ),
        (
            "send without a receive",
            |_, l| SendWr::Send {
                wr_id: 1,
                local: l,
                solicited: false,
                invalidate: None,
            },
            Access::NONE,
            TermCode::DDP_UT_NO_BUFFER,
        ),
    ];
    for (what, wr, access, code) in cases {
        let mut p = Pair::new(cfg(true, 4, 4), cfg(true, 4, 4));
        let src = p.a.dev.reg_mr(p.a.pd, 0, 64, Access::LOCAL_WRITE).unwrap();
        let sink = p.b.dev.reg_mr(p.b.pd, 0, 64, *access).unwrap();
        p.a.qp
            .post_send(wr(
                sink,
                Sge {
                    stag: src,
                    to: 0,
                    len: 64,
                },
            ))
            .unwrap();
        p.run();
        assert_eq!(
            *p.b.qp.state(),
            QpState::Terminated {
                code: *code,
                sent: true
            },
            "{what}"
        );
        assert!(
            p.a.events.contains(&Event::TerminateReceived(*code)),
            "{what}"
        );
    }
}

#[test]
fn send_longer_than_the_receive_is_too_long() {
    let mut p = Pair::new(cfg(false, 4, 4), cfg(false, 4, 4));
    let src = p.a.dev.reg_mr(p.a.pd, 0, 300, Access::NONE).unwrap();
    let rbuf = p.b.dev.reg_mr(p.b.pd, 0, 100, Access::LOCAL_WRITE).unwrap();
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 5,
            sge: Sge {
                stag: rbuf,
                to: 0,
                len: 100,
            },
        })
        .unwrap();
    refused(
        &mut p,
        SendWr::Send {
            wr_id: 1,
            local: Sge {
                stag: src,
                to: 0,
                len: 300,
            },
            solicited: false,
            invalidate: None,
        },
        TermCode::DDP_UT_TOO_LONG,
    );
    let wc = p.b.cq.poll().unwrap();
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::Flushed));
}

#[test]
fn a_responder_asked_for_markers_rejects() {
    let mut ca = cfg(true, 4, 4);
    ca.mpa.enhanced = false;
    let mut p = Pair {
        a: side(1, true, ca),
        b: side(2, false, cfg(true, 4, 4)),
    };
    // Set M in A's Request before it leaves.
    let mut req = p.a.qp.take_tx(&p.a.dev, &mut p.a.cq);
    req[16] |= 0x80;
    let e = p.b.qp.on_bytes(&mut p.b.dev, &mut p.b.cq, &req);
    assert!(matches!(
        e[0],
        Event::SetupFailed(farside_iwarp::mpa::MpaError::MarkersRefused)
    ));
    let rep = p.b.qp.take_tx(&p.b.dev, &mut p.b.cq);
    let e = p.a.qp.on_bytes(&mut p.a.dev, &mut p.a.cq, &rep);
    assert!(matches!(
        e[0],
        Event::SetupFailed(farside_iwarp::mpa::MpaError::Rejected)
    ));
}

#[test]
fn insufficient_ird_is_terminated_by_the_initiator() {
    // Our responder never claims an ORD above the initiator's IRD (it takes the
    // minimum), so a peer that does is simulated by rewriting the Reply's ORD.
    let mut p = Pair {
        a: side(1, true, cfg(true, 1, 4)),
        b: side(2, false, cfg(true, 4, 4)),
    };
    let req = p.a.qp.take_tx(&p.a.dev, &mut p.a.cq);
    p.b.qp.on_bytes(&mut p.b.dev, &mut p.b.cq, &req);
    let mut rep = p.b.qp.take_tx(&p.b.dev, &mut p.b.cq);
    rep[22..24].copy_from_slice(&9u16.to_be_bytes()); // ORD 9 > A's IRD 1
    let e = p.a.qp.on_bytes(&mut p.a.dev, &mut p.a.cq, &rep);
    assert!(matches!(
        e[0],
        Event::SetupFailed(farside_iwarp::mpa::MpaError::InsufficientIrd { .. })
    ));
    let t = p.a.qp.take_tx(&p.a.dev, &mut p.a.cq);
    let mut d = farside_iwarp::mpa::Deframer::new(false);
    d.push(&t);
    let f = d.next_fpdu().unwrap().unwrap();
    let m = farside_iwarp::rdmap::parse(&f.ulpdu).unwrap();
    let farside_iwarp::rdmap::Body::Terminate(t) = m.body else {
        panic!()
    };
    assert_eq!(t.code, TermCode::MPA_INSUFFICIENT_IRD);
}

#[test]
fn a_peer_to_peer_responder_waits_for_the_rtr() {
    // The initiator asks for P2P with a zero-length Write RTR (RFC 6581 §6); ours never
    // does on its own, so the Request is rewritten and the RTR posted by hand.
    let mut p = Pair {
        a: side(1, true, cfg(true, 4, 4)),
        b: side(2, false, cfg(true, 4, 4)),
    };
    let mut req = p.a.qp.take_tx(&p.a.dev, &mut p.a.cq);
    req[20] |= 0x80; // IRD: P2P
    req[22] |= 0x80; // ORD: Write RTR
    p.b.qp.on_bytes(&mut p.b.dev, &mut p.b.cq, &req);
    assert!(p.b.qp.negotiated().unwrap().await_rtr);
    let rep = p.b.qp.take_tx(&p.b.dev, &mut p.b.cq);
    let (r, _) = farside_iwarp::mpa::RrFrame::parse(farside_iwarp::mpa::RrKind::Reply, &rep)
        .unwrap()
        .unwrap();
    let io = r.ird_ord().unwrap();
    assert!(io.p2p && io.write_rtr && !io.read_rtr);
    p.a.qp.on_bytes(&mut p.a.dev, &mut p.a.cq, &rep);
    // B's Send waits for the RTR.
    let src = p.b.dev.reg_mr(p.b.pd, 0, 8, Access::NONE).unwrap();
    let rbuf = p.a.dev.reg_mr(p.a.pd, 0, 8, Access::LOCAL_WRITE).unwrap();
    p.a.qp
        .post_recv(RecvWr {
            wr_id: 1,
            sge: Sge {
                stag: rbuf,
                to: 0,
                len: 8,
            },
        })
        .unwrap();
    let send = SendWr::Send {
        wr_id: 2,
        local: Sge {
            stag: src,
            to: 0,
            len: 8,
        },
        solicited: false,
        invalidate: None,
    };
    p.b.qp.post_send(send).unwrap();
    assert!(
        p.b.qp.take_tx(&p.b.dev, &mut p.b.cq).is_empty(),
        "nothing before the RTR"
    );
    let a_src = p.a.dev.reg_mr(p.a.pd, 0, 1, Access::NONE).unwrap();
    let rtr = SendWr::Write {
        wr_id: 3,
        local: Sge {
            stag: a_src,
            to: 0,
            len: 0,
        },
        remote_stag: 1,
        remote_to: 0,
    };
    p.a.qp.post_send(rtr).unwrap();
    p.run();
    let wc = p.a.cq.poll().unwrap(); // the RTR Write
    assert_eq!(wc.wr_id, 3);
    let wc = p.a.cq.poll().unwrap();
    assert_eq!((wc.wr_id, wc.opcode, wc.byte_len), (1, WcOpcode::Recv, 8));
}
