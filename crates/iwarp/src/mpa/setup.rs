//! The MPA connection set-up as a state machine (RFC 5044 §7.1, RFC 6581 §5): the
//! negotiation rules are in the parent module's doc.

use super::{IrdOrd, MpaError, RrFrame, RrKind, ENHANCED_PD_LEN, IRD_ORD_MAX, PD_LENGTH_MAX};

/// What one side of the set-up wants.
#[derive(Debug, Clone)]
pub struct MpaConfig {
    /// Ask for CRC (the outcome is CRC if either side asks).
    pub crc: bool,
    /// Use RFC 6581 (Rev 2 with IRD/ORD); else Rev 1.
    pub enhanced: bool,
    /// Inbound Read Requests this side will queue.
    pub ird: u16,
    /// Outbound Read Requests this side wants outstanding.
    pub ord: u16,
    /// Application private data (after the IRD/ORD block).
    pub private_data: Vec<u8>,
}

impl Default for MpaConfig {
    fn default() -> Self {
        MpaConfig {
            crc: true,
            enhanced: true,
            ird: 8,
            ord: 8,
            private_data: Vec::new(),
        }
    }
}

/// The outcome of a successful set-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// CRC on FPDUs in both directions.
    pub crc: bool,
    pub rev: u8,
    /// Inbound Read Requests we queue.
    pub ird: u16,
    /// Outbound Read Requests we may have outstanding.
    pub ord: u16,
    /// The peer's application private data.
    pub peer_private_data: Vec<u8>,
    /// Responder in peer-to-peer mode: wait for the initiator's zero-length Write
    /// before sending.
    pub await_rtr: bool,
}

/// Result of feeding bytes to a [`Setup`].
#[derive(Debug)]
pub enum SetupStep {
    /// Need more bytes.
    Pending,
    /// Established. `send` holds bytes to transmit first (the Reply, for a responder);
    /// `leftover` are bytes after the peer's frame (FPDUs), to be deframed.
    Done {
        negotiated: Negotiated,
        send: Vec<u8>,
        leftover: Vec<u8>,
    },
    /// The set-up failed. `send` holds a rejecting Reply (responder) if one is due.
    Failed { error: MpaError, send: Vec<u8> },
}

/// The MPA set-up of one endpoint, as a state machine: bytes in, a step out.
#[derive(Debug)]
pub struct Setup {
    role: RrKind,
    cfg: MpaConfig,
    buf: Vec<u8>,
    done: bool,
}

impl Setup {
    /// An initiator, and the Request bytes to send on the new TCP connection.
    pub fn initiator(cfg: MpaConfig) -> (Setup, Vec<u8>) {
        let mut f = RrFrame::new(RrKind::Request);
        f.crc = cfg.crc;
        Self::fill(&mut f, &cfg, cfg.ird, cfg.ord, IrdOrd::default());
        let bytes = f.encode();
        (
            Setup {
                role: RrKind::Reply,
                cfg,
                buf: Vec::new(),
                done: false,
            },
            bytes,
        )
    }

    /// A responder, waiting for the Request.
    pub fn responder(cfg: MpaConfig) -> Setup {
        Setup {
            role: RrKind::Request,
            cfg,
            buf: Vec::new(),
            done: false,
        }
    }

    fn fill(f: &mut RrFrame, cfg: &MpaConfig, ird: u16, ord: u16, rtr: IrdOrd) {
        let ulp = &cfg.private_data[..cfg.private_data.len().min(PD_LENGTH_MAX - ENHANCED_PD_LEN)];
        if cfg.enhanced {
            f.rev = 2;
            f.enhanced = true;
            let io = IrdOrd {
                ird: ird.min(IRD_ORD_MAX),
                ord: ord.min(IRD_ORD_MAX),
                ..rtr
            };
            f.private_data = io.encode().to_vec();
            f.private_data.extend_from_slice(ulp);
        } else {
            f.rev = 1;
            f.private_data = ulp.to_vec();
        }
    }

    /// Feed received bytes. After `Done` or `Failed` the set-up is over; feeding more
    /// is a programmer error.
    pub fn on_bytes(&mut self, data: &[u8]) -> SetupStep {
        assert!(!self.done, "MPA set-up fed after it ended");
        // Bounded: a frame is at most RR_HEADER_LEN + PD_LENGTH_MAX, checked by parse
        // before it asks for more; data beyond the frame is handed on as leftover.
        self.buf.extend_from_slice(data);
        let parsed = match RrFrame::parse(self.role, &self.buf) {
            Ok(None) => return SetupStep::Pending,
            Ok(Some(p)) => p,
            Err(error) => {
                self.done = true;
                return SetupStep::Failed {
                    error,
                    send: Vec::new(),
                };
            }
        };
        self.done = true;
        let (frame, used) = parsed;
        let leftover = self.buf.split_off(used);
        match self.role {
            RrKind::Request => self.answer_request(frame, leftover),
            RrKind::Reply => self.take_reply(frame, leftover),
        }
    }

    fn answer_request(&self, req: RrFrame, leftover: Vec<u8>) -> SetupStep {
        let reject = |error: MpaError| {
            let mut rep = RrFrame::new(RrKind::Reply);
            rep.reject = true;
            rep.crc = req.crc;
            rep.rev = if req.rev == 2 { 2 } else { 1 };
            SetupStep::Failed {
                error,
                send: rep.encode(),
            }
        };
        if req.rev == 0 || req.rev > 2 {
            return reject(MpaError::Revision(req.rev));
        }
        if req.markers {
            return reject(MpaError::MarkersRefused);
        }
        if !leftover.is_empty() {
            return reject(MpaError::DataBeforeReply);
        }
        let enhanced = req.rev == 2 && req.enhanced && self.cfg.enhanced;
        let (mut ird, mut ord, mut rtr, mut await_rtr) =
            (self.cfg.ird, self.cfg.ord, IrdOrd::default(), false);
        if req.rev == 2 && req.enhanced {
            let Some(peer) = req.ird_ord() else {
                return reject(MpaError::Enhanced("private data shorter than IRD/ORD"));
            };
            if enhanced {
                ird = peer.ord.min(self.cfg.ird);
                ord = peer.ird.min(self.cfg.ord);
                if peer.p2p {
                    rtr.p2p = true;
                    rtr.write_rtr = true;
                    await_rtr = true;
                }
            }
        }
        let crc = req.crc || self.cfg.crc;
        let mut rep = RrFrame::new(RrKind::Reply);
        rep.crc = crc;
        let cfg = MpaConfig {
            enhanced,
            ..self.cfg.clone()
        };
        Self::fill(&mut rep, &cfg, ird, ord, rtr);
        let peer_private_data = req.ulp_private_data().to_vec();
        SetupStep::Done {
            negotiated: Negotiated {
                crc,
                rev: rep.rev,
                ird,
                ord,
                peer_private_data,
                await_rtr,
            },
            send: rep.encode(),
            leftover,
        }
    }

    fn take_reply(&self, rep: RrFrame, leftover: Vec<u8>) -> SetupStep {
        let fail = |error| SetupStep::Failed {
            error,
            send: Vec::new(),
        };
        if rep.reject {
            return fail(MpaError::Rejected);
        }
        if rep.rev == 0 || rep.rev > 2 {
            return fail(MpaError::Revision(rep.rev));
        }
        if rep.markers {
            return fail(MpaError::MarkersRefused);
        }
        if self.cfg.crc && !rep.crc {
            return fail(MpaError::CrcRefused);
        }
        let (mut ird, mut ord) = (self.cfg.ird, self.cfg.ord);
        if self.cfg.enhanced {
            if rep.rev < 2 || !rep.enhanced {
                return fail(MpaError::Enhanced("Reply is not Rev 2 with E set"));
            }
            let Some(peer) = rep.ird_ord() else {
                return fail(MpaError::Enhanced("private data shorter than IRD/ORD"));
            };
            if peer.ord > self.cfg.ird {
                return fail(MpaError::InsufficientIrd {
                    ird: self.cfg.ird,
                    peer_ord: peer.ord,
                });
            }
            ord = ord.min(peer.ird);
            ird = ird.min(self.cfg.ird);
        }
        SetupStep::Done {
            negotiated: Negotiated {
                crc: rep.crc,
                rev: rep.rev,
                ird,
                ord,
                peer_private_data: rep.ulp_private_data().to_vec(),
                await_rtr: false,
            },
            send: Vec::new(),
            leftover,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(init: MpaConfig, resp: MpaConfig) -> (SetupStep, Option<SetupStep>) {
        let (mut i, req) = Setup::initiator(init);
        let mut r = Setup::responder(resp);
        let rs = r.on_bytes(&req);
        let send = match &rs {
            SetupStep::Done { send, .. } | SetupStep::Failed { send, .. } => send.clone(),
            SetupStep::Pending => panic!("pending"),
        };
        let is = if send.is_empty() {
            None
        } else {
            Some(i.on_bytes(&send))
        };
        (rs, is)
    }

    #[test]
    fn crc_is_used_if_either_side_asks() {
        for (a, b) in [(false, false), (true, false), (false, true), (true, true)] {
            let (rs, is) = run(
                MpaConfig {
                    crc: a,
                    ..Default::default()
                },
                MpaConfig {
                    crc: b,
                    ..Default::default()
                },
            );
            let SetupStep::Done { negotiated: rn, .. } = rs else {
                panic!()
            };
            assert_eq!(rn.crc, a || b);
            let Some(SetupStep::Done {
                negotiated: inn, ..
            }) = is
            else {
                panic!()
            };
            assert_eq!(inn.crc, a || b);
        }
    }

    #[test]
    fn ird_ord_are_negotiated() {
        let (rs, is) = run(
            MpaConfig {
                ird: 4,
                ord: 6,
                ..Default::default()
            },
            MpaConfig {
                ird: 2,
                ord: 3,
                ..Default::default()
            },
        );
        let SetupStep::Done { negotiated: rn, .. } = rs else {
            panic!()
        };
        assert_eq!((rn.ird, rn.ord), (2, 3));
        let Some(SetupStep::Done {
            negotiated: inn, ..
        }) = is
        else {
            panic!()
        };
        assert_eq!((inn.ird, inn.ord), (4, 2));
    }

    #[test]
    fn markers_are_refused_with_a_rejecting_reply() {
        let mut req = RrFrame::new(RrKind::Request);
        req.markers = true;
        let mut r = Setup::responder(MpaConfig::default());
        let SetupStep::Failed { error, send } = r.on_bytes(&req.encode()) else {
            panic!()
        };
        assert_eq!(error, MpaError::MarkersRefused);
        let (rep, _) = RrFrame::parse(RrKind::Reply, &send).unwrap().unwrap();
        assert!(rep.reject && !rep.markers);
    }
}
