//! Two endpoints over real TCP on 127.0.0.1 (port 0): MPA set-up with CRC on and off,
//! Write, Read with ORD/IRD credits, Send and Send-SE, and a Terminate on a bad STag.

use farside_iwarp::mpa::MpaConfig;
use farside_iwarp::qp::{Event, QpConfig, QpState, RecvWr, SendWr, Sge};
use farside_iwarp::tcp::Endpoint;
use farside_iwarp::term::TermCode;
use farside_iwarp::verbs::{Access, Cq, Device, WcOpcode, WcStatus};
use std::net::TcpListener;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

fn cfg(crc: bool, ird: u16, ord: u16) -> QpConfig {
    QpConfig {
        mpa: MpaConfig {
            crc,
            enhanced: true,
            ird,
            ord,
            private_data: Vec::new(),
        },
        emss: 1460,
        ..Default::default()
    }
}

/// (initiator, responder)
fn pair(ci: QpConfig, cr: QpConfig) -> (Endpoint, Endpoint) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut dev = Device::with_random_keys();
        let pd = dev.alloc_pd().unwrap();
        Endpoint::accept(&l, dev, pd, cr, Cq::new(256).unwrap()).unwrap()
    });
    let mut dev = Device::with_random_keys();
    let pd = dev.alloc_pd().unwrap();
    let c = Endpoint::connect(addr, dev, pd, ci, Cq::new(256).unwrap()).unwrap();
    (c, server.join().unwrap())
}

/// Every device here has one protection domain, the first allocated.
fn pd(_ep: &Endpoint) -> farside_iwarp::verbs::PdId {
    farside_iwarp::verbs::PdId(1)
}

#[test]
fn loopback_write_read_send_with_crc_on_and_off() {
    for crc in [true, false] {
        let (c, s) = pair(cfg(crc, 4, 4), cfg(false, 2, 4));
        assert!(matches!(c.events()[0], Event::Established(ref n) if n.crc == crc));
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let src = c.with(|d, _| {
            let st = d
                .reg_mr(pd(&c), 0x10_0000, data.len(), Access::NONE)
                .unwrap();
            d.write(st, 0x10_0000, &data).unwrap();
            st
        });
        let sink = s.with(|d, _| {
            d.reg_mr(
                pd(&s),
                0,
                data.len(),
                Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap()
        });
        // Write 100 kB (segmented at the MULPDU), then Send-SE a note behind it.
        let note = s.with(|d, qp| {
            let r = d.reg_mr(pd(&s), 0, 64, Access::LOCAL_WRITE).unwrap();
            qp.post_recv(RecvWr {
                wr_id: 7,
                sge: Sge {
                    stag: r,
                    to: 0,
                    len: 64,
                },
            })
            .unwrap();
            qp.post_recv(RecvWr {
                wr_id: 8,
                sge: Sge {
                    stag: r,
                    to: 32,
                    len: 32,
                },
            })
            .unwrap();
            r
        });
        c.post_send(SendWr::Write {
            wr_id: 1,
            local: Sge {
                stag: src,
                to: 0x10_0000,
                len: data.len() as u32,
            },
            remote_stag: sink,
            remote_to: 0,
        })
        .unwrap();
        c.post_send(SendWr::Send {
            wr_id: 2,
            local: Sge {
                stag: src,
                to: 0x10_0000,
                len: 16,
            },
            solicited: false,
            invalidate: None,
        })
        .unwrap();
        c.post_send(SendWr::Send {
            wr_id: 3,
            local: Sge {
                stag: src,
                to: 0x10_0010,
                len: 16,
            },
            solicited: true,
            invalidate: None,
        })
        .unwrap();
        let r1 = s.wait_wc(WAIT).expect("recv completion");
        assert_eq!(
            (r1.wr_id, r1.opcode, r1.byte_len, r1.solicited),
            (7, WcOpcode::Recv, 16, false)
        );
        let r2 = s.wait_wc(WAIT).expect("recv completion");
        assert_eq!((r2.wr_id, r2.solicited), (8, true));
        // The Write was placed before the Sends that followed it.
        s.with(|d, _| {
            assert_eq!(d.read(sink, 0, data.len()).unwrap(), &data[..]);
            assert_eq!(d.read(note, 0, 16).unwrap(), &data[..16]);
            assert_eq!(d.read(note, 32, 16).unwrap(), &data[16..32]);
        });
        for id in 1..=3 {
            assert_eq!(c.wait_wc(WAIT).unwrap().wr_id, id);
        }

        // Read it back in 4 pieces; the responder's IRD is 2, so the initiator's ORD is 2.
        assert_eq!(c.with(|_, qp| qp.negotiated().unwrap().ord), 2);
        let back = c.with(|d, _| {
            d.reg_mr(pd(&c), 0, data.len(), Access::LOCAL_WRITE)
                .unwrap()
        });
        let piece = data.len() / 4;
        for i in 0..4 {
            c.post_send(SendWr::Read {
                wr_id: 10 + i as u64,
                local: Sge {
                    stag: back,
                    to: (i * piece) as u64,
                    len: piece as u32,
                },
                remote_stag: sink,
                remote_to: (i * piece) as u64,
            })
            .unwrap();
        }
        assert!(c.with(|_, qp| qp.read_queues().0) <= 2);
        for i in 0..4 {
            let wc = c.wait_wc(WAIT).expect("read completion");
            assert_eq!(
                (wc.wr_id, wc.opcode, wc.status),
                (10 + i, WcOpcode::Read, WcStatus::Success)
            );
        }
        c.with(|d, _| assert_eq!(d.read(back, 0, data.len()).unwrap(), &data[..]));
        assert_eq!(c.state(), QpState::Rts);
        assert_eq!(s.state(), QpState::Rts);
    }
}

#[test]
fn loopback_write_to_a_bad_stag_is_terminated_and_closed() {
    let (c, s) = pair(cfg(true, 4, 4), cfg(true, 4, 4));
    let src = c.with(|d, _| d.reg_mr(pd(&c), 0, 64, Access::NONE).unwrap());
    let sink = s.with(|d, _| d.reg_mr(pd(&s), 0, 64, Access::REMOTE_WRITE).unwrap());
    c.post_send(SendWr::Write {
        wr_id: 1,
        local: Sge {
            stag: src,
            to: 0,
            len: 64,
        },
        remote_stag: sink ^ 0xff, // right index, wrong key
        remote_to: 0,
    })
    .unwrap();
    let code = TermCode::DDP_T_INVALID_STAG;
    assert!(s.wait_until(WAIT, |st, _| *st
        == QpState::Terminated { code, sent: true }));
    assert!(c.wait_until(WAIT, |st, _| *st
        == QpState::Terminated { code, sent: false }));
    assert!(c.events().contains(&Event::TerminateReceived(code)));
    // Both sides close the connection after the Terminate.
    let closed = |ep: &Endpoint| {
        let t = std::time::Instant::now();
        while !ep.is_closed() && t.elapsed() < WAIT {
            std::thread::sleep(Duration::from_millis(5));
        }
        ep.is_closed()
    };
    assert!(closed(&c) && closed(&s));
    assert!(c
        .post_send(SendWr::Send {
            wr_id: 2,
            local: Sge {
                stag: src,
                to: 0,
                len: 1
            },
            solicited: false,
            invalidate: None
        })
        .is_err());
}

#[test]
fn loopback_sends_both_ways_at_once_arrive_in_order() {
    const N: u64 = 100;
    const LEN: usize = 3000; // three FPDUs each
    let (c, s) = pair(cfg(true, 4, 4), cfg(true, 4, 4));
    let setup = |ep: &Endpoint, tag: u8| {
        ep.with(|d, qp| {
            let src = d.reg_mr(pd(ep), 0, LEN * N as usize, Access::NONE).unwrap();
            for i in 0..N as usize {
                d.write(src, (i * LEN) as u64, &vec![tag ^ i as u8; LEN])
                    .unwrap();
            }
            let dst = d
                .reg_mr(pd(ep), 0, LEN * N as usize, Access::LOCAL_WRITE)
                .unwrap();
            for i in 0..N {
                let sge = Sge {
                    stag: dst,
                    to: i * LEN as u64,
                    len: LEN as u32,
                };
                qp.post_recv(RecvWr {
                    wr_id: 1000 + i,
                    sge,
                })
                .unwrap();
            }
            (src, dst)
        })
    };
    let (csrc, cdst) = setup(&c, 0xa0);
    let (ssrc, sdst) = setup(&s, 0x50);
    std::thread::scope(|sc| {
        for (ep, src) in [(&c, csrc), (&s, ssrc)] {
            sc.spawn(move || {
                for i in 0..N {
                    let local = Sge {
                        stag: src,
                        to: i * LEN as u64,
                        len: LEN as u32,
                    };
                    ep.post_send(SendWr::Send {
                        wr_id: i,
                        local,
                        solicited: false,
                        invalidate: None,
                    })
                    .unwrap();
                }
            });
        }
    });
    for (ep, dst, peer_tag) in [(&c, cdst, 0x50u8), (&s, sdst, 0xa0u8)] {
        let mut recvs = 0;
        let mut sends = 0;
        while recvs < N || sends < N {
            let wc = ep.wait_wc(WAIT).expect("completion");
            assert_eq!(wc.status, WcStatus::Success);
            if wc.opcode == WcOpcode::Recv {
                assert_eq!(wc.wr_id, 1000 + recvs, "receives complete in order");
                recvs += 1;
            } else {
                assert_eq!(wc.wr_id, sends);
                sends += 1;
            }
        }
        ep.with(|d, _| {
            for i in 0..N as usize {
                assert_eq!(
                    d.read(dst, (i * LEN) as u64, LEN).unwrap(),
                    &vec![peer_tag ^ i as u8; LEN][..]
                );
            }
        });
        assert_eq!(ep.state(), QpState::Rts);
    }
}

/// A Write completes when the driver's writer takes it, not when it is on the wire:
/// `drain` sends it before the endpoint is dropped, so the peer gets all of it.
#[test]
fn drain_then_drop_delivers_everything_posted() {
    for _ in 0..20 {
        let (c, s) = pair(cfg(true, 4, 4), cfg(true, 4, 4));
        let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 253) as u8).collect();
        let sink = s.with(|d, _| {
            d.reg_mr(pd(&s), 0, data.len(), Access::REMOTE_WRITE)
                .unwrap()
        });
        let note = s.with(|d, qp| {
            let r = d.reg_mr(pd(&s), 0, 8, Access::LOCAL_WRITE).unwrap();
            qp.post_recv(RecvWr {
                wr_id: 9,
                sge: Sge {
                    stag: r,
                    to: 0,
                    len: 8,
                },
            })
            .unwrap();
            r
        });
        let src = c.with(|d, qp| {
            let st = d.reg_mr(pd(&c), 0, data.len(), Access::NONE).unwrap();
            d.write(st, 0, &data).unwrap();
            for (wr_id, wr) in [
                (
                    1,
                    SendWr::Write {
                        wr_id: 1,
                        local: Sge {
                            stag: st,
                            to: 0,
                            len: data.len() as u32,
                        },
                        remote_stag: sink,
                        remote_to: 0,
                    },
                ),
                (
                    2,
                    SendWr::Send {
                        wr_id: 2,
                        local: Sge {
                            stag: st,
                            to: 0,
                            len: 8,
                        },
                        solicited: true,
                        invalidate: None,
                    },
                ),
            ] {
                qp.post_send(wr)
                    .unwrap_or_else(|e| panic!("post {wr_id}: {e}"));
            }
            st
        });
        let _ = src;
        for _ in 0..2 {
            assert_eq!(c.wait_wc(WAIT).unwrap().status, WcStatus::Success);
        }
        assert!(c.drain(WAIT));
        drop(c);
        let wc = s.wait_wc(WAIT).expect("the Send behind the Write arrives");
        assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
        s.with(|d, _| {
            assert_eq!(d.read(sink, 0, data.len()).unwrap(), &data[..]);
            assert_eq!(d.read(note, 0, 8).unwrap(), &data[..8]);
        });
    }
}
