//! The responder: checks each request in rxe's order (`check`: PSN, opcode
//! sequence, opcode validity, length; `execute`: resources and R_Key as
//! each operation runs) before any byte is placed, executes it, and queues
//! the response (`respond`: ACK, NAK, READ response, atomic ACK, answers to
//! duplicates) in PSN order. The entry point is `responder_handle` below.

mod check;
mod execute;
mod foreign;
mod respond;

pub(crate) use foreign::ForeignAccess;

use check::PsnCheck;

use std::collections::VecDeque;

use uroce_wire::{NakCode, Psn, RnrTimer, RocePacket, Syndrome};

use super::attr::{QpState, QpType};
use super::{AsyncEvent, Qp};
use crate::Instant;
use crate::memory::Memory;
use crate::srq::Srq;
use crate::stats::DropReason;
use crate::wqe::WcStatus;

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
    /// `pd`: the PD the READ was checked against (an XRC target's comes
    /// from the SRQ each request names).
    Read { psn: Psn, va: u64, rkey: u32, remaining: u32, first: bool, msn: u32, pd: u32 },
}

/// A remembered READ or atomic, for answering duplicates (rxe
/// `resp_res`): READs are re-executed, atomics replayed from the saved
/// result, never performed twice.
#[derive(Debug, Clone, Copy)]
enum RdAtomicRes {
    Read {
        first_psn: Psn,
        last_psn: Psn,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
    /// An ATOMIC WRITE or FLUSH done: a duplicate is answered again
    /// (a zero-length READ response) without doing it twice.
    Done {
        psn: Psn,
    },
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

    /// Whether the only response waiting is a plain ACK (one that may be
    /// held for the application's reply).
    pub(crate) fn lone_ack(&self) -> bool {
        self.final_nak.is_none()
            && self.out.len() == 1
            && matches!(self.out.front(), Some(RespItem::Ack { syndrome: Syndrome::Ack(_), .. }))
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
    pub(in crate::qp) fn responder_handle(
        &mut self,
        now: Instant,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
        srq: Option<&mut Srq>,
    ) {
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
        match self.check_psn(pkt) {
            PsnCheck::Expected => {}
            PsnCheck::Ahead => {
                // A packet was lost. NAK once per gap (IBTA C9-…: PSN
                // sequence error), drop the rest silently.
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
            PsnCheck::Duplicate => {
                // The requester is resending: answer at once.
                self.hold.cancel();
                self.duplicate(pkt, mem);
                return;
            }
        }
        match self.check_request(pkt).and_then(|()| self.execute(pkt, mem, srq)) {
            Ok(()) => {
                self.hold.on_request();
                if pkt.bth().ack_req() && self.resp.lone_ack() {
                    self.hold.on_ack_queued(now, self.attr.timeout.duration());
                }
            }
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
        match self.check_request(pkt).and_then(|()| self.execute(pkt, mem, srq)) {
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
}
