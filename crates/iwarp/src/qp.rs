//! The queue pair: one RDMAP stream (RFC 5040) over one MPA connection, as a sans-I/O
//! state machine. Bytes from TCP go in ([`Qp::on_bytes`]), bytes for TCP come out
//! ([`Qp::take_tx`]), completions land in a [`Cq`] and data in the [`Device`]'s regions.
//!
//! ```text
//!  Connecting ── MPA Request/Reply (mpa::Setup) ──► Rts ── a refusal, sent or received ──► Terminated
//!       └── set-up failed ──► Error                  │     (Terminate FPDU; all WRs flushed)
//! ```
//!
//! **Sending.** Work requests wait in the send queue (SQ) and are cut into DDP segments
//! of at most the MULPDU. A Read needs a credit: at most ORD Read Requests are
//! outstanding (the outbound read queue, ORQ); the SQ stalls behind a Read until a Read
//! Response completes an earlier one (RFC 5040 §6.4, as siw's ORQ fence). Inbound Read
//! Requests wait in the inbound read queue (IRQ, depth IRD) until their Read Responses
//! are sent, ahead of the SQ; a Read Request beyond the IRD is a Terminate
//! (siw: RDMAP, remote operation, catastrophic stream). Bytes wait for the driver in a
//! buffer of at most [`TX_BYTES_MAX`] (the SQ and IRQ hold the rest).
//!
//! **Receiving**, every segment checked before anything is placed (siw `siw_qp_rx.c`):
//! - Write: sink STag/TO against the region (STag, PD, REMOTE_WRITE, wrap, bounds); a
//!   later segment of the same Write must keep its STag and continue its TO. A
//!   zero-length Write is not checked (siw; it is the RFC 6581 RTR message).
//! - Read Response: the ORQ head must exist (else DDP catastrophic), STag and TO must be
//!   the Request's sink and continue where the last segment ended (invalid STag / base
//!   and bounds), and the total must match the Read's size.
//! - Read Request: QN 1 MSN in sequence (DDP untagged "MSN range"), MO 0, IRD, and the
//!   source STag/TO/size against a REMOTE_READ region (RDMAP remote protection codes).
//! - Send: QN 0 MSN in sequence, MO where the message stands, a posted receive (else
//!   "no buffer"), room in it (else "too long").
//! - Terminate: recorded; the queue pair stops.
//!
//! The first refusal sends one Terminate (with the refused segment's headers, as siw's
//! `siw_send_terminate`), flushes every outstanding work request, and stops the QP;
//! later bytes are ignored, and the driver closes the connection.

use crate::ddp::{self, Placement};
use crate::mpa::{self, Deframer, MpaConfig, MpaError, Negotiated, Setup, SetupStep};
use crate::rdmap::{
    self, Body, Opcode, ReadRequest, QN_COUNT, QN_READ_REQUEST, QN_SEND, QN_TERMINATE,
};
use crate::term::TermCode;
use crate::verbs::{Access, Cq, Device, PdId, VerbsError, Wc, WcOpcode, WcStatus};
use std::collections::VecDeque;

/// Deepest send queue.
pub const SQ_DEPTH_MAX: usize = 4096;
/// Deepest receive queue.
pub const RQ_DEPTH_MAX: usize = 4096;
/// Largest IRD / ORD this stack grants (siw: 128 each).
pub const READ_QUEUE_DEPTH_MAX: u16 = 128;
/// Bytes encoded for the driver and not yet taken: beyond it the SQ and IRQ wait.
/// A Terminate is the one message let past it.
pub const TX_BYTES_MAX: usize = 1 << 20;
/// TCP payload per segment when the driver does not say (Ethernet MSS 1460).
pub const EMSS_DEFAULT: usize = 1460;
/// Smallest EMSS taken: a Read Request (18 + 28 B ULPDU) must fit one FPDU.
pub const EMSS_MIN: usize = 64;

/// A scatter/gather element: `len` bytes at `to` of region `stag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub stag: u32,
    pub to: u64,
    pub len: u32,
}

/// A send-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendWr {
    /// RDMA Write of `local` to the peer's `remote_stag` at `remote_to`.
    Write {
        wr_id: u64,
        local: Sge,
        remote_stag: u32,
        remote_to: u64,
    },
    /// RDMA Read of `local.len` bytes from the peer's `remote_stag`/`remote_to` into
    /// `local`.
    Read {
        wr_id: u64,
        local: Sge,
        remote_stag: u32,
        remote_to: u64,
    },
    /// Send of `local`, with Solicited Event if `solicited`, with Invalidate of the
    /// peer's `invalidate` STag if given.
    Send {
        wr_id: u64,
        local: Sge,
        solicited: bool,
        invalidate: Option<u32>,
    },
}

/// A receive-queue work request: one buffer for one inbound Send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sge: Sge,
}

/// Queue pair settings.
#[derive(Debug, Clone)]
pub struct QpConfig {
    /// MPA set-up (CRC, RFC 6581, IRD/ORD wanted).
    pub mpa: MpaConfig,
    /// TCP payload per segment: FPDUs are cut to fit ([`mpa::mulpdu`]).
    pub emss: usize,
    pub sq_depth: usize,
    pub rq_depth: usize,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            mpa: MpaConfig::default(),
            emss: EMSS_DEFAULT,
            sq_depth: 256,
            rq_depth: 256,
        }
    }
}

/// Where the queue pair is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QpState {
    Connecting,
    Rts,
    /// A Terminate went out (`sent`) or came in; the connection is to be closed.
    Terminated {
        code: TermCode,
        sent: bool,
    },
    /// The MPA set-up failed.
    Error(MpaError),
}

/// What happened while bytes were fed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Established(Negotiated),
    SetupFailed(MpaError),
    TerminateSent(TermCode),
    TerminateReceived(TermCode),
}

#[derive(Debug, Clone, Copy)]
struct OrqEntry {
    wr_id: u64,
    sink: Sge,
    placed: u32,
}

#[derive(Debug, Clone, Copy)]
struct RxSend {
    wr: RecvWr,
    received: u32,
}

/// One queue pair. See the module doc.
#[derive(Debug)]
pub struct Qp {
    pd: PdId,
    cfg: QpConfig,
    /// The MPA initiator (only it answers a bad set-up frame with a Terminate).
    initiator: bool,
    state: QpState,
    setup: Option<Setup>,
    negotiated: Option<Negotiated>,
    deframer: Option<Deframer>,
    crc: bool,
    mulpdu: usize,
    tx: Vec<u8>,
    sq: VecDeque<SendWr>,
    rq: VecDeque<RecvWr>,
    orq: VecDeque<OrqEntry>,
    irq: VecDeque<ReadRequest>,
    /// Next MSN to send, per untagged queue.
    tx_msn: [u32; QN_COUNT],
    /// Next MSN expected, per untagged queue.
    rx_msn: [u32; QN_COUNT],
    rx_send: Option<RxSend>,
    /// A Write whose last segment has not arrived: its STag and the TO the next
    /// segment must start at (siw `siw_write_check_ntoh`).
    rx_write: Option<(u32, u64)>,
    /// Responder in RFC 6581 peer-to-peer mode, before the initiator's RTR.
    await_rtr: bool,
}

impl Qp {
    fn new(pd: PdId, mut cfg: QpConfig, initiator: bool, setup: Setup, tx: Vec<u8>) -> Qp {
        cfg.mpa.ird = cfg.mpa.ird.clamp(1, READ_QUEUE_DEPTH_MAX);
        cfg.mpa.ord = cfg.mpa.ord.clamp(1, READ_QUEUE_DEPTH_MAX);
        cfg.sq_depth = cfg.sq_depth.clamp(1, SQ_DEPTH_MAX);
        cfg.rq_depth = cfg.rq_depth.clamp(1, RQ_DEPTH_MAX);
        cfg.emss = cfg.emss.max(EMSS_MIN);
        let mulpdu = mpa::mulpdu(cfg.emss);
        Qp {
            pd,
            cfg,
            initiator,
            state: QpState::Connecting,
            setup: Some(setup),
            negotiated: None,
            deframer: None,
            crc: false,
            mulpdu,
            tx,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            orq: VecDeque::new(),
            irq: VecDeque::new(),
            tx_msn: [1; QN_COUNT],
            rx_msn: [1; QN_COUNT],
            rx_send: None,
            rx_write: None,
            await_rtr: false,
        }
    }

    /// The active side: its MPA Request is the first thing [`Qp::take_tx`] returns.
    pub fn connect(pd: PdId, cfg: QpConfig) -> Qp {
        let (setup, req) = Setup::initiator(cfg.mpa.clone());
        Self::new(pd, cfg, true, setup, req)
    }

    /// The passive side, waiting for the MPA Request.
    pub fn accept(pd: PdId, cfg: QpConfig) -> Qp {
        let setup = Setup::responder(cfg.mpa.clone());
        Self::new(pd, cfg, false, setup, Vec::new())
    }

    pub fn state(&self) -> &QpState {
        &self.state
    }

    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    /// Read Requests outstanding (ORQ) and inbound Read Requests unanswered (IRQ).
    pub fn read_queues(&self) -> (usize, usize) {
        (self.orq.len(), self.irq.len())
    }

    /// Whether the connection should be closed once [`Qp::take_tx`] is drained.
    pub fn is_done(&self) -> bool {
        matches!(self.state, QpState::Terminated { .. } | QpState::Error(_))
    }

    fn check_postable(&self) -> Result<(), VerbsError> {
        match self.state {
            QpState::Connecting | QpState::Rts => Ok(()),
            QpState::Terminated { .. } => Err(VerbsError::QpState("terminated")),
            QpState::Error(_) => Err(VerbsError::QpState("in error")),
        }
    }

    pub fn post_send(&mut self, wr: SendWr) -> Result<(), VerbsError> {
        self.check_postable()?;
        if self.sq.len() >= self.cfg.sq_depth {
            return Err(VerbsError::Full("send queue", self.cfg.sq_depth));
        }
        self.sq.push_back(wr);
        Ok(())
    }

    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), VerbsError> {
        self.check_postable()?;
        if self.rq.len() >= self.cfg.rq_depth {
            return Err(VerbsError::Full("receive queue", self.cfg.rq_depth));
        }
        self.rq.push_back(wr);
        Ok(())
    }

    /// Feed bytes received from TCP.
    pub fn on_bytes(&mut self, dev: &mut Device, cq: &mut Cq, data: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        let data = match self.state {
            QpState::Connecting => {
                let setup = self.setup.as_mut().expect("connecting has a set-up");
                match setup.on_bytes(data) {
                    SetupStep::Pending => return events,
                    SetupStep::Failed { error, send } => {
                        self.setup = None;
                        self.tx.extend_from_slice(&send);
                        // siw's initiator answers a bad Reply or an insufficient IRD
                        // with a Terminate; its responder only rejects or closes.
                        if let Some(code) = error.term_code().filter(|_| self.initiator) {
                            // Before RTS the CRC is not in force (siw sends it zero).
                            let u = rdmap::encode_terminate(code, self.tx_msn[2], &[]);
                            mpa::encode_fpdu(&u, false, &mut self.tx);
                        }
                        self.flush(cq);
                        self.state = QpState::Error(error.clone());
                        events.push(Event::SetupFailed(error));
                        return events;
                    }
                    SetupStep::Done {
                        negotiated,
                        send,
                        leftover,
                    } => {
                        self.setup = None;
                        self.tx.extend_from_slice(&send);
                        self.crc = negotiated.crc;
                        self.await_rtr = negotiated.await_rtr;
                        self.deframer = Some(Deframer::new(negotiated.crc));
                        self.negotiated = Some(negotiated.clone());
                        self.state = QpState::Rts;
                        events.push(Event::Established(negotiated));
                        leftover
                    }
                }
            }
            QpState::Rts => data.to_vec(),
            _ => return events,
        };
        let deframer = self.deframer.as_mut().expect("RTS has a deframer");
        deframer.push(&data);
        while self.state == QpState::Rts {
            let next = self
                .deframer
                .as_mut()
                .expect("RTS has a deframer")
                .next_fpdu();
            match next {
                Ok(None) => break,
                Err(e) => {
                    let code = e.term_code().unwrap_or(TermCode::MPA_FPDU_START);
                    self.terminate(cq, code, &[], &mut events);
                }
                Ok(Some(f)) if f.crc == mpa::CrcVerdict::Bad => {
                    self.terminate(cq, TermCode::MPA_CRC, &f.ulpdu, &mut events);
                }
                Ok(Some(f)) => {
                    if let Err(code) = self.receive(dev, cq, &f.ulpdu, &mut events) {
                        self.terminate(cq, code, &f.ulpdu, &mut events);
                    }
                }
            }
        }
        events
    }

    /// Encode what the IRQ and SQ allow, then hand over every byte waiting for TCP.
    pub fn take_tx(&mut self, dev: &Device, cq: &mut Cq) -> Vec<u8> {
        self.pump(dev, cq);
        std::mem::take(&mut self.tx)
    }

    fn frame(&mut self, ulpdu: &[u8]) {
        mpa::encode_fpdu(ulpdu, self.crc, &mut self.tx);
    }

    /// Segment a message and frame every segment.
    fn emit(&mut self, opcode: Opcode, first: Placement, inval: u32, data: &[u8]) {
        for s in ddp::segments(first, data.len(), self.mulpdu) {
            let u = rdmap::encode_ulpdu(opcode, s.last, s.placement, inval, &data[s.range]);
            self.frame(&u);
        }
    }

    fn complete(cq: &mut Cq, wr_id: u64, opcode: WcOpcode, status: WcStatus, byte_len: u32) {
        cq.push(Wc {
            wr_id,
            opcode,
            status,
            byte_len,
            solicited: false,
            invalidated_stag: None,
        });
    }

    fn pump(&mut self, dev: &Device, cq: &mut Cq) {
        if self.state != QpState::Rts || self.await_rtr {
            return;
        }
        while self.tx.len() < TX_BYTES_MAX {
            if let Some(rr) = self.irq.pop_front() {
                // Checked on arrival; the region may have gone since.
                match dev.read(rr.source_stag, rr.source_to, rr.size as usize) {
                    Ok(data) => {
                        let data = data.to_vec();
                        self.emit(
                            Opcode::ReadResponse,
                            Placement::Tagged {
                                stag: rr.sink_stag,
                                to: rr.sink_to,
                            },
                            0,
                            &data,
                        );
                    }
                    Err(e) => {
                        let mut events = Vec::new();
                        self.terminate(cq, e.rdmap_code(), &[], &mut events);
                        return;
                    }
                }
                continue;
            }
            let Some(wr) = self.sq.front() else { return };
            if matches!(wr, SendWr::Read { .. }) {
                let ord = self.negotiated.as_ref().map_or(1, |n| n.ord.max(1));
                if self.orq.len() >= usize::from(ord) {
                    return; // wait for a credit
                }
            }
            let wr = self.sq.pop_front().expect("front exists");
            match wr {
                SendWr::Write {
                    wr_id,
                    local,
                    remote_stag,
                    remote_to,
                } => match self.local_data(dev, local) {
                    Ok(data) => {
                        self.emit(
                            Opcode::Write,
                            Placement::Tagged {
                                stag: remote_stag,
                                to: remote_to,
                            },
                            0,
                            &data,
                        );
                        Self::complete(cq, wr_id, WcOpcode::Write, WcStatus::Success, local.len);
                    }
                    Err(_) => {
                        Self::complete(cq, wr_id, WcOpcode::Write, WcStatus::LocalProtection, 0)
                    }
                },
                SendWr::Send {
                    wr_id,
                    local,
                    solicited,
                    invalidate,
                } => match self.local_data(dev, local) {
                    Ok(data) => {
                        let opcode = match (solicited, invalidate.is_some()) {
                            (false, false) => Opcode::Send,
                            (false, true) => Opcode::SendInv,
                            (true, false) => Opcode::SendSe,
                            (true, true) => Opcode::SendSeInv,
                        };
                        let msn = self.tx_msn[QN_SEND as usize];
                        self.tx_msn[QN_SEND as usize] = msn.wrapping_add(1);
                        self.emit(
                            opcode,
                            Placement::Untagged {
                                qn: QN_SEND,
                                msn,
                                mo: 0,
                            },
                            invalidate.unwrap_or(0),
                            &data,
                        );
                        Self::complete(cq, wr_id, WcOpcode::Send, WcStatus::Success, local.len);
                    }
                    Err(_) => {
                        Self::complete(cq, wr_id, WcOpcode::Send, WcStatus::LocalProtection, 0)
                    }
                },
                SendWr::Read {
                    wr_id,
                    local,
                    remote_stag,
                    remote_to,
                } => {
                    if dev
                        .check(
                            self.pd,
                            local.stag,
                            local.to,
                            local.len as usize,
                            Access::LOCAL_WRITE,
                        )
                        .is_err()
                    {
                        Self::complete(cq, wr_id, WcOpcode::Read, WcStatus::LocalProtection, 0);
                        continue;
                    }
                    self.orq.push_back(OrqEntry {
                        wr_id,
                        sink: local,
                        placed: 0,
                    });
                    let msn = self.tx_msn[QN_READ_REQUEST as usize];
                    self.tx_msn[QN_READ_REQUEST as usize] = msn.wrapping_add(1);
                    let mut body = Vec::with_capacity(rdmap::READ_REQUEST_LEN);
                    ReadRequest {
                        sink_stag: local.stag,
                        sink_to: local.to,
                        size: local.len,
                        source_stag: remote_stag,
                        source_to: remote_to,
                    }
                    .encode(&mut body);
                    let u = rdmap::encode_ulpdu(
                        Opcode::ReadRequest,
                        true,
                        Placement::Untagged {
                            qn: QN_READ_REQUEST,
                            msn,
                            mo: 0,
                        },
                        0,
                        &body,
                    );
                    self.frame(&u);
                }
            }
        }
    }

    fn local_data(&self, dev: &Device, sge: Sge) -> Result<Vec<u8>, crate::verbs::AccessError> {
        dev.check(self.pd, sge.stag, sge.to, sge.len as usize, Access::NONE)?;
        Ok(dev.read(sge.stag, sge.to, sge.len as usize)?.to_vec())
    }

    /// Check and place one inbound segment.
    fn receive(
        &mut self,
        dev: &mut Device,
        cq: &mut Cq,
        ulpdu: &[u8],
        events: &mut Vec<Event>,
    ) -> Result<(), TermCode> {
        let msg = rdmap::parse(ulpdu).map_err(|r| r.term)?;
        // RFC 6581 P2P: the initiator's first message is the RTR; we asked for a
        // zero-length Write, and take any first message as the go-ahead.
        self.await_rtr = false;
        let last = msg.ddp.last;
        match (msg.opcode, msg.placement, &msg.body) {
            (Opcode::Write, Placement::Tagged { stag, to }, Body::Data(d)) => {
                if let Some((want_stag, want_to)) = self.rx_write {
                    if stag != want_stag {
                        return Err(TermCode::DDP_T_INVALID_STAG);
                    }
                    if to != want_to {
                        return Err(TermCode::DDP_T_BASE_BOUNDS);
                    }
                }
                self.rx_write = if last {
                    None
                } else {
                    Some((stag, to.wrapping_add(d.len() as u64)))
                };
                if d.is_empty() {
                    return Ok(());
                }
                dev.check(self.pd, stag, to, d.len(), Access::REMOTE_WRITE)
                    .map_err(|e| e.ddp_code())?;
                dev.place(stag, to, d);
                Ok(())
            }
            (Opcode::ReadResponse, Placement::Tagged { stag, to }, Body::Data(d)) => {
                let Some(head) = self.orq.front_mut() else {
                    return Err(TermCode::DDP_CATASTROPHIC);
                };
                if stag != head.sink.stag {
                    return Err(TermCode::DDP_T_INVALID_STAG);
                }
                let placed_end = u64::from(head.placed) + d.len() as u64;
                if to != head.sink.to.wrapping_add(u64::from(head.placed))
                    || placed_end > u64::from(head.sink.len)
                    || (last && placed_end != u64::from(head.sink.len))
                {
                    return Err(TermCode::DDP_T_BASE_BOUNDS);
                }
                if !d.is_empty() {
                    dev.check(self.pd, stag, to, d.len(), Access::LOCAL_WRITE)
                        .map_err(|e| e.ddp_code())?;
                    dev.place(stag, to, d);
                }
                head.placed = placed_end as u32;
                if last {
                    let e = self.orq.pop_front().expect("head exists");
                    Self::complete(cq, e.wr_id, WcOpcode::Read, WcStatus::Success, e.placed);
                }
                Ok(())
            }
            (Opcode::ReadRequest, Placement::Untagged { msn, mo, .. }, Body::ReadRequest(rr)) => {
                if msn != self.rx_msn[QN_READ_REQUEST as usize] {
                    return Err(TermCode::DDP_UT_MSN_RANGE);
                }
                if mo != 0 || !last {
                    return Err(TermCode::DDP_UT_INVALID_MO);
                }
                self.rx_msn[QN_READ_REQUEST as usize] = msn.wrapping_add(1);
                let ird = self.negotiated.as_ref().map_or(1, |n| n.ird.max(1));
                if self.irq.len() >= usize::from(ird) {
                    return Err(TermCode::RDMAP_CATASTROPHIC_STREAM);
                }
                dev.check(
                    self.pd,
                    rr.source_stag,
                    rr.source_to,
                    rr.size as usize,
                    Access::REMOTE_READ,
                )
                .map_err(|e| e.rdmap_code())?;
                self.irq.push_back(*rr);
                Ok(())
            }
            (op, Placement::Untagged { msn, mo, .. }, Body::Data(d)) if op.is_send() => {
                if msn != self.rx_msn[QN_SEND as usize] {
                    return Err(TermCode::DDP_UT_MSN_RANGE);
                }
                if self.rx_send.is_none() {
                    if mo != 0 {
                        return Err(TermCode::DDP_UT_INVALID_MO);
                    }
                    let wr = self.rq.pop_front().ok_or(TermCode::DDP_UT_NO_BUFFER)?;
                    self.rx_send = Some(RxSend { wr, received: 0 });
                }
                let cur = self.rx_send.as_mut().expect("set above");
                if mo != cur.received {
                    return Err(TermCode::DDP_UT_INVALID_MO);
                }
                if u64::from(cur.received) + d.len() as u64 > u64::from(cur.wr.sge.len) {
                    return Err(TermCode::DDP_UT_TOO_LONG);
                }
                if !d.is_empty() {
                    let to = cur.wr.sge.to + u64::from(cur.received);
                    dev.check(self.pd, cur.wr.sge.stag, to, d.len(), Access::LOCAL_WRITE)
                        .map_err(|_| TermCode::DDP_CATASTROPHIC)?;
                    dev.place(cur.wr.sge.stag, to, d);
                }
                cur.received += d.len() as u32;
                if last {
                    let done = self.rx_send.take().expect("set above");
                    self.rx_msn[QN_SEND as usize] = msn.wrapping_add(1);
                    let mut invalidated = None;
                    if matches!(op, Opcode::SendInv | Opcode::SendSeInv) {
                        if !dev.invalidate(self.pd, msg.inval_stag) {
                            return Err(TermCode::RDMAP_CANNOT_INVALIDATE);
                        }
                        invalidated = Some(msg.inval_stag);
                    }
                    cq.push(Wc {
                        wr_id: done.wr.wr_id,
                        opcode: WcOpcode::Recv,
                        status: WcStatus::Success,
                        byte_len: done.received,
                        solicited: matches!(op, Opcode::SendSe | Opcode::SendSeInv),
                        invalidated_stag: invalidated,
                    });
                }
                Ok(())
            }
            (Opcode::Terminate, Placement::Untagged { .. }, Body::Terminate(t)) => {
                self.rx_msn[QN_TERMINATE as usize] =
                    self.rx_msn[QN_TERMINATE as usize].wrapping_add(1);
                self.flush(cq);
                self.state = QpState::Terminated {
                    code: t.code,
                    sent: false,
                };
                events.push(Event::TerminateReceived(t.code));
                Ok(())
            }
            // parse() ties opcodes to segment kinds and bodies; nothing else reaches here.
            _ => Err(TermCode::RDMAP_OPCODE),
        }
    }

    /// Send one Terminate for `code` (with the headers of `ulpdu` if the code carries
    /// them), flush, stop.
    fn terminate(&mut self, cq: &mut Cq, code: TermCode, ulpdu: &[u8], events: &mut Vec<Event>) {
        let attached = rdmap::terminated_headers(code, ulpdu);
        let u = rdmap::encode_terminate(code, self.tx_msn[QN_TERMINATE as usize], &attached);
        self.tx_msn[QN_TERMINATE as usize] += 1;
        self.frame(&u);
        self.flush(cq);
        self.state = QpState::Terminated { code, sent: true };
        events.push(Event::TerminateSent(code));
    }

    /// Complete every outstanding work request as flushed.
    fn flush(&mut self, cq: &mut Cq) {
        for wr in self.sq.drain(..) {
            let (wr_id, op) = match wr {
                SendWr::Write { wr_id, .. } => (wr_id, WcOpcode::Write),
                SendWr::Read { wr_id, .. } => (wr_id, WcOpcode::Read),
                SendWr::Send { wr_id, .. } => (wr_id, WcOpcode::Send),
            };
            Self::complete(cq, wr_id, op, WcStatus::Flushed, 0);
        }
        for e in self.orq.drain(..) {
            Self::complete(cq, e.wr_id, WcOpcode::Read, WcStatus::Flushed, 0);
        }
        if let Some(s) = self.rx_send.take() {
            Self::complete(cq, s.wr.wr_id, WcOpcode::Recv, WcStatus::Flushed, 0);
        }
        for r in self.rq.drain(..) {
            Self::complete(cq, r.wr_id, WcOpcode::Recv, WcStatus::Flushed, 0);
        }
        self.irq.clear();
    }
}
