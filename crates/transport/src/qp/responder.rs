//! The responder: checks each request in rxe's order (PSN, opcode sequence,
//! opcode validity, resources, length, R_Key) before any byte is placed,
//! then executes it and queues the response (ACK, NAK, READ response,
//! atomic ACK) in PSN order.

use std::collections::VecDeque;

use uroce_wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, NakCode, Opcode, Operation, Position, Psn, RnrTimer,
    RocePacket, RocePacketRepr, Syndrome,
};

use super::attr::{Access, QpState, QpType};
use super::requester::packets;
use super::{AsyncEvent, DEFAULT_PKEY, Qp};
use crate::Instant;
use crate::memory::{AccessError, AtomicOp, Key, Memory};
use crate::queue::sgl_pieces;
use crate::srq::Srq;
use crate::stats::DropReason;
use crate::wqe::{Completion, WcFlags, WcOpcode, WcStatus};

/// READ responses and atomic ACKs that may wait to be sent. A conforming
/// requester keeps at most `max_rd_atomic` (≤ our `max_dest_rd_atomic`)
/// outstanding, but duplicates it resends are answered too; a peer that
/// floods beyond this bound gets an invalid-request NAK instead of growing
/// our queue.
const MAX_QUEUED_RD_ATOMIC: usize = 4 * crate::RC_MAX_RD_ATOMIC as usize + 16;

/// A response waiting to be sent.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RespItem {
    /// ACK, RNR NAK or NAK for `psn`.
    Ack { psn: Psn, syndrome: Syndrome, msn: u32 },
    /// ATOMIC ACKNOWLEDGE.
    AtomicAck { psn: Psn, orig: u64, msn: u32 },
    /// READ response packets still to send.
    Read { psn: Psn, va: u64, rkey: u32, remaining: u32, first: bool, msn: u32 },
}

/// A remembered READ or atomic, for answering duplicates (rxe
/// `resp_res`): READs are re-executed, atomics replayed from the saved
/// result, never performed twice.
#[derive(Debug, Clone, Copy)]
enum RdAtomicRes {
    Read { first_psn: Psn, last_psn: Psn },
    Atomic { psn: Psn, orig: u64 },
}

/// A message being received across packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InMsg {
    None,
    Send { offset: u64 },
    Write { va: u64, rkey: u32, remaining: u32, total: u32 },
}

/// Responder state (rxe `qp->resp`).
#[derive(Debug)]
pub(crate) struct RespState {
    /// Next expected PSN.
    pub(crate) epsn: Psn,
    /// Message sequence number: messages completed.
    msn: u32,
    /// A PSN-sequence NAK (or RNR NAK) was sent for the current gap; stay
    /// silent until the expected PSN arrives.
    nak_sent: bool,
    in_msg: InMsg,
    out: VecDeque<RespItem>,
    /// READ responses and atomic ACKs in `out` (kept, not counted per
    /// request: a peer may queue hundreds).
    out_rd_atomic: usize,
    res: VecDeque<RdAtomicRes>,
    res_cap: usize,
    /// A NAK that ends the connection, sent even though the QP is in ERR.
    final_nak: Option<(Psn, Syndrome, u32)>,
}

impl RespState {
    pub(crate) fn new(max_rd_atomic: usize) -> Self {
        Self {
            epsn: Psn::new(0),
            msn: 0,
            nak_sent: false,
            in_msg: InMsg::None,
            out: VecDeque::with_capacity(2 * max_rd_atomic + 4),
            out_rd_atomic: 0,
            res: VecDeque::with_capacity(max_rd_atomic),
            res_cap: max_rd_atomic,
            final_nak: None,
        }
    }

    pub(crate) fn reset(&mut self, epsn: Psn) {
        self.epsn = epsn;
        self.msn = 0;
        self.nak_sent = false;
        self.in_msg = InMsg::None;
        self.out.clear();
        self.out_rd_atomic = 0;
        self.res.clear();
    }

    /// Drops queued responses on entering ERR (keeping the final NAK).
    pub(crate) fn abort(&mut self) {
        self.out.clear();
        self.out_rd_atomic = 0;
        self.in_msg = InMsg::None;
    }

    /// Queues a response.
    fn push_out(&mut self, item: RespItem) {
        self.out_rd_atomic += usize::from(!matches!(item, RespItem::Ack { .. }));
        self.out.push_back(item);
    }

    /// Takes the oldest queued response.
    fn pop_out(&mut self) -> Option<RespItem> {
        let item = self.out.pop_front()?;
        self.out_rd_atomic -= usize::from(!matches!(item, RespItem::Ack { .. }));
        Some(item)
    }

    /// Queues an ACK, coalescing with an ACK already waiting at the tail:
    /// the newer one acknowledges everything the older did. Returns whether
    /// it was coalesced (an ACK deferred).
    fn push_ack(&mut self, psn: Psn) -> bool {
        let msn = self.msn;
        if let Some(RespItem::Ack { psn: p, syndrome: Syndrome::Ack(_), msn: m }) =
            self.out.back_mut()
        {
            if psn.is_after(*p) {
                *p = psn;
                *m = msn;
            }
            return true;
        }
        self.push_out(RespItem::Ack { psn, syndrome: Syndrome::ACK, msn });
        false
    }
}

/// What a failed check asks for (rxe's error classes).
enum Reject {
    /// Send an RNR NAK and wait for a retry.
    Rnr,
    /// NAK with `code` and move the QP to ERR; `recv` completes the receive
    /// WQE in progress with that status.
    Fatal { code: NakCode, recv: Option<WcStatus> },
}

impl Reject {
    /// The malformed or impossible request: NAK Invalid Request, no
    /// receive WQE involved.
    const INVALID_REQUEST: Self = Self::Fatal { code: NakCode::InvalidRequest, recv: None };
}

impl Qp {
    pub(super) fn responder_handle(
        &mut self,
        now: Instant,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
        srq: Option<&mut Srq>,
    ) {
        let _ = now;
        if !matches!(
            self.state,
            QpState::ReadyToReceive | QpState::ReadyToSend | QpState::SendQueueDrain
        ) {
            self.stats.drop(DropReason::QpState);
            return;
        }
        if self.init.qp_type == QpType::Uc {
            self.uc_responder(pkt, mem, srq);
            return;
        }
        let psn = pkt.bth().psn();
        let d = psn.diff(self.resp.epsn);
        if d > 0 {
            // Ahead of what we expect: a packet was lost. NAK once per gap
            // (IBTA C9-…: PSN sequence error), drop the rest silently.
            self.stats.drop(DropReason::OutOfSequence);
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                self.stats.send_seq_err += 1;
                let (epsn, msn) = (self.resp.epsn, self.resp.msn);
                self.resp.push_out(RespItem::Ack {
                    psn: epsn,
                    syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                    msn,
                });
            }
            return;
        }
        if d < 0 {
            self.duplicate(pkt, mem);
            return;
        }
        match self.check_and_execute(pkt, mem, srq) {
            Ok(()) => {}
            Err(Reject::Rnr) => {
                self.stats.send_rnr_err += 1;
                // Later packets of this burst are dropped quietly too: the
                // RNR NAK already told the requester where to resume.
                self.resp.nak_sent = true;
                let (epsn, msn) = (self.resp.epsn, self.resp.msn);
                let timer: RnrTimer = self.attr.min_rnr_timer;
                self.resp.push_out(RespItem::Ack {
                    psn: epsn,
                    syndrome: Syndrome::RnrNak(timer),
                    msn,
                });
            }
            Err(Reject::Fatal { code, recv }) => {
                if let Some(status) = recv {
                    self.complete_recv_error(status);
                }
                self.resp.final_nak = Some((self.resp.epsn, Syndrome::Nak(code), self.resp.msn));
                let ev = if code == NakCode::RemoteAccessError {
                    AsyncEvent::QpAccessError
                } else {
                    AsyncEvent::QpRequestError
                };
                self.fail(ev);
            }
        }
    }

    /// UC (IBTA §9.8.1): no ACKs and no retries. A PSN ahead of the
    /// expected one means packets were lost: the message in progress is
    /// abandoned (its receive WQE is kept for the next message) and the
    /// responder resynchronises on this PSN; MIDDLE and LAST packets of an
    /// abandoned message fail the sequence check and are dropped until the
    /// next FIRST or ONLY. Errors drop the message silently, except those
    /// local to the receive WQE, which complete it in error.
    fn uc_responder(&mut self, pkt: &RocePacket<&[u8]>, mem: &dyn Memory, srq: Option<&mut Srq>) {
        let psn = pkt.bth().psn();
        let d = psn.diff(self.resp.epsn);
        if d < 0 {
            // Behind the expected PSN: a duplicate or a straggler. UC never
            // resends, so it can only be a copy of something already seen
            // (or given up on): never deliver it twice.
            self.stats.duplicate_request += 1;
            return;
        }
        if d > 0 {
            self.stats.out_of_seq_request += 1;
            self.resp.in_msg = InMsg::None;
            self.resp.epsn = psn;
        }
        match self.check_and_execute(pkt, mem, srq) {
            Ok(()) => {}
            Err(Reject::Fatal { recv: Some(status), .. }) => {
                self.complete_recv_error(status);
                self.fail(AsyncEvent::QpFatal);
            }
            Err(Reject::Rnr | Reject::Fatal { recv: None, .. }) => {
                self.stats.drop(DropReason::UcMessageDropped);
                self.resp.in_msg = InMsg::None;
                self.resp.epsn = psn.next();
            }
        }
    }

    fn check_and_execute(
        &mut self,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
        srq: Option<&mut Srq>,
    ) -> Result<(), Reject> {
        let info = pkt.info();
        let invalid = Reject::INVALID_REQUEST;
        // Opcode sequence (IBTA §9.7.5.1.3 / C9-…): a message in progress
        // continues with MIDDLE/LAST of the same operation; otherwise only
        // FIRST/ONLY may start one.
        let continues = matches!(info.position, Position::Middle | Position::Last);
        match (self.resp.in_msg, info.operation, continues) {
            (InMsg::None, _, false) => {}
            (InMsg::Send { .. }, Operation::Send, true) => {}
            (InMsg::Write { .. }, Operation::RdmaWrite, true) => {}
            _ => return Err(invalid),
        }
        // Opcode validity: the QP must allow the remote operation.
        let qp_access = self.attr.access;
        let needed = match info.operation {
            Operation::Send => Access::NONE,
            Operation::RdmaWrite => Access::REMOTE_WRITE,
            Operation::RdmaReadRequest => Access::REMOTE_READ,
            Operation::CompareSwap | Operation::FetchAdd => Access::REMOTE_ATOMIC,
            _ => return Err(invalid),
        };
        if !qp_access.contains(needed) {
            return Err(invalid);
        }
        // Length (packet level): FIRST and MIDDLE carry exactly one MTU;
        // LAST and ONLY at most one.
        let mtu = self.mtu();
        let plen = pkt.payload_len() as u32;
        let len_ok = match info.position {
            Position::First | Position::Middle => plen == mtu,
            Position::Last => plen <= mtu && plen > 0,
            Position::Only => plen <= mtu,
        };
        if !len_ok && matches!(info.operation, Operation::Send | Operation::RdmaWrite) {
            return Err(invalid);
        }
        match info.operation {
            Operation::Send => self.exec_send(pkt, mem, srq),
            Operation::RdmaWrite => self.exec_write(pkt, mem, srq),
            Operation::RdmaReadRequest => self.exec_read(pkt, mem),
            _ => self.exec_atomic(pkt, mem),
        }
    }

    fn accept(&mut self, pkt: &RocePacket<&[u8]>, npsn: u32) {
        self.resp.epsn = self.resp.epsn.add(npsn);
        self.resp.nak_sent = false;
        if self.init.qp_type == QpType::Rc
            && pkt.bth().ack_req()
            && pkt.info().operation != Operation::RdmaReadRequest
            && !matches!(pkt.info().operation, Operation::CompareSwap | Operation::FetchAdd)
        {
            let psn = self.resp.epsn.sub(1);
            if self.resp.push_ack(psn) {
                self.stats.ack_deferred += 1;
            }
        }
    }

    fn exec_send(
        &mut self,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
        srq: Option<&mut Srq>,
    ) -> Result<(), Reject> {
        let info = pkt.info();
        let offset = match self.resp.in_msg {
            InMsg::Send { offset } => offset,
            _ => 0,
        };
        // First or only: a receive WQE must be waiting.
        if offset == 0 && !matches!(self.resp.in_msg, InMsg::Send { .. }) && !self.take_recv(srq) {
            return Err(Reject::Rnr);
        }
        let data = pkt.payload();
        if offset + data.len() as u64 > self.recv_cur.length {
            return Err(Reject::Fatal {
                code: NakCode::InvalidRequest,
                recv: Some(WcStatus::LocLenErr),
            });
        }
        if !self.scatter_cur(offset, data, mem) {
            return Err(Reject::Fatal {
                code: NakCode::RemoteOperationalError,
                recv: Some(WcStatus::LocProtErr),
            });
        }
        let total = offset + data.len() as u64;
        if info.ends_message() {
            // SEND with invalidate: the R_Key in the IETH stops working now
            // (IBTA §10.6.7.2.3); a key that cannot be invalidated is an
            // invalid request.
            if let Some(ieth) = pkt.ieth()
                && mem.invalidate(self.me(), ieth.rkey(), true).is_err()
            {
                return Err(Reject::Fatal {
                    code: NakCode::InvalidRequest,
                    recv: Some(WcStatus::LocProtErr),
                });
            }
            let mut c = Completion::new(
                self.recv_cur.wr_id,
                WcStatus::Success,
                WcOpcode::Recv,
                self.init.qpn,
                true,
            );
            c.byte_len = total as u32;
            c.src_qp = self.attr.dest_qpn;
            c.solicited = pkt.bth().solicited();
            if let Some(imm) = pkt.immdt() {
                c.imm_or_inv = imm.imm();
                c.flags = WcFlags::WITH_IMM;
            }
            if let Some(ieth) = pkt.ieth() {
                c.imm_or_inv = ieth.rkey();
                c.flags = WcFlags::WITH_INV;
            }
            self.recv_cur.active = false;
            self.push_completion(c);
            self.resp.in_msg = InMsg::None;
            self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
            self.stats.rdma_recvs += 1;
        } else {
            self.resp.in_msg = InMsg::Send { offset: total };
        }
        self.accept(pkt, 1);
        Ok(())
    }

    /// Makes sure a receive WQE is taken for the message starting now:
    /// the one already taken (a UC message abandoned midway leaves it for
    /// the next), else the oldest of the SRQ or the QP's own queue.
    pub(super) fn take_recv(&mut self, srq: Option<&mut Srq>) -> bool {
        if self.recv_cur.active {
            return true;
        }
        match srq {
            Some(srq) => srq.pop_into(&mut self.recv_cur),
            None => self.rq.pop_into(&mut self.recv_cur),
        }
    }

    /// Writes `data` into the taken receive WQE at `offset`.
    pub(super) fn scatter_cur(&self, offset: u64, data: &[u8], mem: &dyn Memory) -> bool {
        let mut at = 0usize;
        for (sge, off, l) in sgl_pieces(&self.recv_cur.sges, offset, data.len() as u64) {
            let chunk = &data[at..at + l as usize];
            if mem.write(Key::Local(sge.lkey), self.me(), sge.addr + off, chunk).is_err() {
                return false;
            }
            at += l as usize;
        }
        at == data.len()
    }

    /// Completes the taken receive WQE (if any) with an error.
    pub(super) fn complete_recv_error(&mut self, status: WcStatus) {
        if self.recv_cur.active {
            self.recv_cur.active = false;
            let c =
                Completion::new(self.recv_cur.wr_id, status, WcOpcode::Recv, self.init.qpn, true);
            self.push_completion(c);
        }
    }

    fn exec_write(
        &mut self,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
        srq: Option<&mut Srq>,
    ) -> Result<(), Reject> {
        let info = pkt.info();
        let data = pkt.payload();
        let (va, rkey, remaining, total) = match self.resp.in_msg {
            InMsg::Write { va, rkey, remaining, total } => (va, rkey, remaining, total),
            _ => {
                let Some(reth) = pkt.reth() else {
                    return Err(Reject::INVALID_REQUEST);
                };
                (reth.va(), reth.rkey(), reth.dma_len(), reth.dma_len())
            }
        };
        // Message level length: never more than the RETH announced, and the
        // last packet ends exactly there.
        let plen = data.len() as u32;
        if plen > remaining || (info.ends_message() && plen != remaining) {
            return Err(Reject::INVALID_REQUEST);
        }
        let with_imm = pkt.immdt().is_some();
        if with_imm && !self.take_recv(srq) {
            return Err(Reject::Rnr);
        }
        if info.starts_message() && remaining > 0 {
            // R_Key, PD, rights and bounds for the whole message, before
            // the first byte (IBTA C9-…: checked on the first packet).
            let r = mem.check(
                Key::Remote(rkey),
                self.me(),
                va,
                u64::from(remaining),
                Access::REMOTE_WRITE,
            );
            if r.is_err() {
                return Err(Reject::Fatal { code: NakCode::RemoteAccessError, recv: None });
            }
        }
        if plen > 0 && mem.write(Key::Remote(rkey), self.me(), va, data).is_err() {
            return Err(Reject::Fatal { code: NakCode::RemoteAccessError, recv: None });
        }
        if info.ends_message() {
            self.resp.in_msg = InMsg::None;
            self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
            if let Some(imm) = pkt.immdt() {
                self.recv_cur.active = false;
                let mut c = Completion::new(
                    self.recv_cur.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    self.init.qpn,
                    true,
                );
                c.imm_or_inv = imm.imm();
                c.flags = WcFlags::WITH_IMM;
                c.src_qp = self.attr.dest_qpn;
                c.solicited = pkt.bth().solicited();
                // byte_len of a WRITE with immediate is the write's length.
                c.byte_len = total;
                self.push_completion(c);
            }
        } else {
            self.resp.in_msg = InMsg::Write {
                va: va.wrapping_add(u64::from(plen)),
                rkey,
                remaining: remaining - plen,
                total,
            };
        }
        self.accept(pkt, 1);
        Ok(())
    }

    fn exec_read(&mut self, pkt: &RocePacket<&[u8]>, mem: &dyn Memory) -> Result<(), Reject> {
        let Some(reth) = pkt.reth() else {
            return Err(Reject::INVALID_REQUEST);
        };
        if self.rd_atomic_queued() >= MAX_QUEUED_RD_ATOMIC {
            // Far more outstanding READs/atomics than any QP may have.
            return Err(Reject::INVALID_REQUEST);
        }
        let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len());
        if len > 1 << 31 {
            return Err(Reject::INVALID_REQUEST);
        }
        if len > 0
            && mem
                .check(Key::Remote(rkey), self.me(), va, u64::from(len), Access::REMOTE_READ)
                .is_err()
        {
            return Err(Reject::Fatal { code: NakCode::RemoteAccessError, recv: None });
        }
        let psn = pkt.bth().psn();
        let npsn = packets(len, self.mtu());
        self.remember(RdAtomicRes::Read { first_psn: psn, last_psn: psn.add(npsn - 1) });
        self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
        let msn = self.resp.msn;
        self.resp.push_out(RespItem::Read { psn, va, rkey, remaining: len, first: true, msn });
        self.accept(pkt, npsn);
        Ok(())
    }

    fn exec_atomic(&mut self, pkt: &RocePacket<&[u8]>, mem: &dyn Memory) -> Result<(), Reject> {
        let Some(a) = pkt.atomic_eth() else {
            return Err(Reject::INVALID_REQUEST);
        };
        if self.rd_atomic_queued() >= MAX_QUEUED_RD_ATOMIC {
            return Err(Reject::INVALID_REQUEST);
        }
        let op = if pkt.info().operation == Operation::CompareSwap {
            AtomicOp::CompareSwap { compare: a.compare(), swap: a.swap_add() }
        } else {
            AtomicOp::FetchAdd { add: a.swap_add() }
        };
        let orig = match mem.atomic(a.rkey(), self.me(), a.va(), op) {
            Ok(v) => v,
            // A misaligned atomic is an invalid request (rxe), the rest are
            // access errors.
            Err(AccessError::Misaligned) => {
                return Err(Reject::INVALID_REQUEST);
            }
            Err(_) => return Err(Reject::Fatal { code: NakCode::RemoteAccessError, recv: None }),
        };
        let psn = pkt.bth().psn();
        self.remember(RdAtomicRes::Atomic { psn, orig });
        self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
        let msn = self.resp.msn;
        self.resp.push_out(RespItem::AtomicAck { psn, orig, msn });
        self.accept(pkt, 1);
        Ok(())
    }

    /// READ responses and atomic ACKs waiting to be sent.
    fn rd_atomic_queued(&self) -> usize {
        self.resp.out_rd_atomic
    }

    fn remember(&mut self, r: RdAtomicRes) {
        let cap = usize::from(self.attr.max_dest_rd_atomic.max(1)).min(self.resp.res_cap);
        while self.resp.res.len() >= cap {
            self.resp.res.pop_front();
        }
        self.resp.res.push_back(r);
    }

    /// A request with a PSN before the expected one: the requester resent
    /// it because an ACK or response was lost.
    fn duplicate(&mut self, pkt: &RocePacket<&[u8]>, mem: &dyn Memory) {
        self.stats.duplicate_request += 1;
        let psn = pkt.bth().psn();
        match pkt.info().operation {
            Operation::RdmaReadRequest => {
                let found = self.resp.res.iter().any(|r| {
                    matches!(*r, RdAtomicRes::Read { first_psn, last_psn }
                        if !psn.is_before(first_psn) && !psn.is_after(last_psn))
                });
                let Some(reth) = pkt.reth().filter(|_| found) else {
                    self.stats.drop(DropReason::StaleDuplicate);
                    return;
                };
                // Re-execute from the resent request's own RETH (it may
                // resume in the middle), re-checking the R_Key.
                let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len());
                if len > 0
                    && mem
                        .check(
                            Key::Remote(rkey),
                            self.me(),
                            va,
                            u64::from(len),
                            Access::REMOTE_READ,
                        )
                        .is_err()
                {
                    self.stats.drop(DropReason::StaleDuplicate);
                    return;
                }
                let msn = self.resp.msn;
                let item = RespItem::Read { psn, va, rkey, remaining: len, first: true, msn };
                // If that READ is still being answered, restart its stream
                // from the resent request instead of sending it twice (one
                // stream per READ, as rxe keeps one resource per READ).
                let range = self.resp.res.iter().find_map(|r| match *r {
                    RdAtomicRes::Read { first_psn, last_psn }
                        if !psn.is_before(first_psn) && !psn.is_after(last_psn) =>
                    {
                        Some((first_psn, last_psn))
                    }
                    _ => None,
                });
                let streaming = self.resp.out.iter_mut().find(|i| match (i, range) {
                    (RespItem::Read { psn: p, .. }, Some((f, l))) => {
                        !p.is_before(f) && !p.is_after(l)
                    }
                    _ => false,
                });
                if let Some(slot) = streaming {
                    *slot = item;
                } else if self.rd_atomic_queued() < MAX_QUEUED_RD_ATOMIC {
                    self.resp.push_out(item);
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let saved = self.resp.res.iter().find_map(|r| match *r {
                    RdAtomicRes::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                match saved {
                    Some(orig)
                        if self.rd_atomic_queued()
                            < usize::from(self.attr.max_dest_rd_atomic.max(1)) =>
                    {
                        let msn = self.resp.msn;
                        self.resp.push_out(RespItem::AtomicAck { psn, orig, msn });
                    }
                    _ => self.stats.drop(DropReason::StaleDuplicate),
                }
            }
            _ => {
                // SEND/WRITE already placed: acknowledge what we have, when
                // asked (a resent window would otherwise draw one ACK per
                // packet; the requester asks on the first packet after a
                // go-back and on each message's last).
                if pkt.bth().ack_req() {
                    let last = self.dup_ack_psn(psn);
                    if self.resp.push_ack(last) {
                        self.stats.ack_deferred += 1;
                    }
                }
            }
        }
    }

    /// The PSN to acknowledge for a duplicate SEND/WRITE at `dup`: the
    /// last one received, but never the PSN of a READ or atomic executed
    /// after `dup` (IBTA §9.7.5.1.1: only its response completes it; an
    /// rxe requester takes a plain ACK at an atomic's PSN as its completion
    /// and loses the result). Those are answered when their own resent
    /// requests arrive, from the replay cache. Every READ/atomic the
    /// requester has not completed is in that cache, since it keeps at most
    /// `max_rd_atomic` ≤ `max_dest_rd_atomic` outstanding.
    fn dup_ack_psn(&self, dup: Psn) -> Psn {
        let mut last = self.resp.epsn.sub(1);
        for r in &self.resp.res {
            let first = match *r {
                RdAtomicRes::Read { first_psn, .. } => first_psn,
                RdAtomicRes::Atomic { psn, .. } => psn,
            };
            if first.is_after(dup) && !first.is_after(last) {
                last = first.sub(1);
            }
        }
        last
    }

    /// Builds the next response packet.
    pub(super) fn responder_poll(&mut self, mem: &dyn Memory, buf: &mut [u8]) -> Option<usize> {
        if let Some((psn, syndrome, msn)) = self.resp.final_nak.take() {
            return self.build_ack(psn, syndrome, msn, None, buf);
        }
        if !matches!(
            self.state,
            QpState::ReadyToReceive | QpState::ReadyToSend | QpState::SendQueueDrain
        ) {
            return None;
        }
        let item = *self.resp.out.front()?;
        match item {
            RespItem::Ack { psn, syndrome, msn } => {
                self.resp.pop_out();
                self.stats.acks_sent += 1;
                self.build_ack(psn, syndrome, msn, None, buf)
            }
            RespItem::AtomicAck { psn, orig, msn } => {
                self.resp.pop_out();
                self.build_ack(psn, Syndrome::ACK, msn, Some(orig), buf)
            }
            RespItem::Read { psn, va, rkey, remaining, first, msn } => {
                let mtu = self.mtu();
                let n = remaining.min(mtu);
                let last = remaining <= mtu;
                let opcode = match (first, last) {
                    (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                };
                let repr = RocePacketRepr {
                    bth: BthRepr {
                        opcode,
                        pkey: DEFAULT_PKEY,
                        dest_qpn: self.attr.dest_qpn,
                        psn,
                        pad: BthRepr::pad_for(n as usize),
                        ..BthRepr::default()
                    },
                    aeth: (first || last).then_some(AethRepr { syndrome: Syndrome::ACK, msn }),
                    ..RocePacketRepr::default()
                };
                let hl = repr.emit_headers(buf).ok()?;
                let total = repr.packet_len(n as usize);
                if buf.len() < total {
                    return None;
                }
                if n > 0
                    && mem
                        .read(Key::Remote(rkey), self.me(), va, &mut buf[hl..hl + n as usize])
                        .is_err()
                {
                    // The region went away under a READ in progress.
                    self.resp.pop_out();
                    self.resp.final_nak = None;
                    return self.build_ack(
                        psn,
                        Syndrome::Nak(NakCode::RemoteAccessError),
                        msn,
                        None,
                        buf,
                    );
                }
                buf[hl + n as usize..total].fill(0);
                if last {
                    self.resp.pop_out();
                } else if let Some(RespItem::Read {
                    psn: p, va: v, remaining: r, first: f, ..
                }) = self.resp.out.front_mut()
                {
                    *p = p.next();
                    *v = v.wrapping_add(u64::from(n));
                    *r -= n;
                    *f = false;
                }
                Some(total)
            }
        }
    }

    fn build_ack(
        &self,
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
        orig: Option<u64>,
        buf: &mut [u8],
    ) -> Option<usize> {
        let repr = RocePacketRepr {
            bth: BthRepr {
                opcode: if orig.is_some() {
                    Opcode::RC_ATOMIC_ACKNOWLEDGE
                } else {
                    Opcode::RC_ACKNOWLEDGE
                },
                pkey: DEFAULT_PKEY,
                dest_qpn: self.attr.dest_qpn,
                psn,
                ..BthRepr::default()
            },
            aeth: Some(AethRepr { syndrome, msn }),
            atomic_ack_eth: orig.map(|orig| AtomicAckEthRepr { orig }),
            ..RocePacketRepr::default()
        };
        repr.emit(buf, &[]).ok()
    }
}
