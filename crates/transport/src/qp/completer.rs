//! The completer: consumes ACKs, NAKs, READ responses and atomic ACKs,
//! places returned data, completes send WQEs strictly in order, and decides
//! when the requester must go back (go-back-N) or give up.

use uroce_wire::{NakCode, Operation, Psn, RnrTimer, RocePacket, Syndrome};

use super::Qp;
use super::attr::QpState;
use crate::Instant;
use crate::memory::{Key, Memory};
use crate::queue::sgl_pieces;
use crate::stats::DropReason;
use crate::wqe::{Completion, WcStatus};

impl Qp {
    pub(super) fn completer_handle(
        &mut self,
        now: Instant,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
    ) {
        if !matches!(self.state, QpState::ReadyToSend | QpState::SendQueueDrain) {
            self.stats.drop(DropReason::QpState);
            return;
        }
        let psn = pkt.bth().psn();
        // A response must be for a PSN we have sent; anything at or after
        // the next unassigned PSN is forged or misrouted.
        if !psn.is_before(self.req.next_psn) {
            self.stats.drop(DropReason::UnexpectedResponse);
            return;
        }
        match pkt.info().operation {
            Operation::Acknowledge => {
                let Some(aeth) = pkt.aeth() else { return };
                match aeth.syndrome() {
                    Syndrome::Ack(_) => self.on_ack(now, psn),
                    Syndrome::RnrNak(t) => self.on_rnr_nak(now, psn, t),
                    Syndrome::Nak(NakCode::PsnSequenceError) => self.on_seq_nak(now, psn),
                    Syndrome::Nak(code) => self.on_fatal_nak(now, psn, code),
                    Syndrome::Reserved(_) => self.stats.drop(DropReason::Malformed),
                }
            }
            Operation::AtomicAcknowledge => {
                let orig = pkt.atomic_ack_eth().map_or(0, |a| a.orig());
                self.on_atomic_ack(now, psn, orig, mem);
            }
            Operation::RdmaReadResponse => self.on_read_response(now, pkt, mem),
            _ => self.stats.drop(DropReason::UnexpectedResponse),
        }
        self.check_drained();
    }

    /// Whether anything has been sent and not yet completed.
    fn outstanding(&self) -> bool {
        self.sq.comp < self.sq.tx || (self.sq.comp == self.sq.tx && self.sq.tx_pkt > 0)
    }

    /// Forward progress: the retry budgets start again and the timer is
    /// re-armed from now.
    fn on_progress(&mut self, now: Instant) {
        let acked = self.comp.psn.diff(self.req.acked_psn);
        if acked > 0 {
            self.req.rec.on_acked(acked as u32);
            self.req.acked_psn = self.comp.psn;
        }
        self.req.rec.on_ack_through(self.comp.psn, now);
        self.req.retry_left = self.attr.retry_cnt;
        self.req.rnr_left = self.attr.rnr_retry;
        self.req.nak_streak = 0;
        self.comp.gap_retry_pending = false;
        self.req.retry_at = None;
        if self.outstanding() {
            self.arm_timer(now);
        } else {
            self.req.timer = None;
        }
    }

    /// A response that proves the peer alive without moving anything (a
    /// duplicate or out-of-order READ response: it is still streaming what
    /// we asked for): the timers start again, the retry budget does not.
    fn on_alive(&mut self, now: Instant) {
        if self.outstanding() && self.req.rnr_wait_until.is_none() {
            self.req.retry_at = None;
            self.arm_timer(now);
        }
    }

    /// Completes the oldest WQE successfully.
    fn complete_ok(&mut self) {
        let idx = self.sq.comp;
        let w = *self.sq.get(idx);
        if w.signaled {
            let mut c = Completion::new(
                w.wr_id,
                WcStatus::Success,
                w.opcode.wc_opcode(),
                self.init.qpn,
                false,
            );
            c.byte_len = w.length;
            self.push_completion(c);
        }
        if w.counted {
            self.req.rd_atomic_inflight = self.req.rd_atomic_inflight.saturating_sub(1);
        }
        let next = w.last_psn().next();
        if next.is_after(self.comp.psn) {
            self.comp.psn = next;
        }
        self.sq.comp += 1;
        if self.sq.tx < self.sq.comp {
            self.sq.tx = self.sq.comp;
            self.sq.tx_pkt = 0;
        }
        if w.internal != crate::queue::Internal::No {
            self.internal_done(&w, WcStatus::Success);
        }
    }

    /// Completes every SEND/WRITE WQE that `psn` acknowledges, in order.
    /// Returns whether anything moved, and whether a READ or atomic whose
    /// responses never arrived lies inside the acknowledged range.
    fn complete_through(&mut self, psn: Psn) -> (bool, bool) {
        let mut progress = false;
        while self.sq.comp < self.sq.head {
            let w = *self.sq.get(self.sq.comp);
            if !w.assigned {
                break;
            }
            if w.opcode.awaits_response() {
                // Only its responses complete it; an ACK at or beyond its
                // PSNs means those responses were lost (implicit NAK).
                return (progress, !psn.is_before(w.first_psn));
            }
            if w.last_psn().is_after(psn) {
                if psn.next().is_after(self.comp.psn) {
                    self.comp.psn = psn.next();
                    progress = true;
                }
                break;
            }
            self.complete_ok();
            progress = true;
        }
        (progress, false)
    }

    /// A NAK names the PSN the responder expects: resume there, if it lies
    /// inside the oldest WQE and that WQE is a SEND or WRITE. (A READ or
    /// atomic at the head resumes from its own progress: the NAK beyond it
    /// means its responses were lost.)
    fn nak_resume_at(&mut self, psn: Psn) {
        if self.sq.comp == self.sq.head {
            return;
        }
        let w = *self.sq.get(self.sq.comp);
        if w.assigned
            && !w.opcode.awaits_response()
            && psn.is_after(self.comp.psn)
            && !psn.is_after(w.last_psn())
        {
            self.comp.psn = psn;
        }
    }

    fn on_ack(&mut self, now: Instant, psn: Psn) {
        let (progress, lost_response) = self.complete_through(psn);
        if progress {
            self.on_progress(now);
        }
        if lost_response && !self.comp.gap_retry_pending {
            self.comp.gap_retry_pending = true;
            self.retry_after_nak(now);
        }
    }

    fn on_rnr_nak(&mut self, now: Instant, psn: Psn, timer: RnrTimer) {
        self.stats.rcvd_rnr_err += 1;
        let (progress, _) = self.complete_through(psn.sub(1));
        if progress {
            self.on_progress(now);
        }
        if self.sq.comp == self.sq.head {
            return;
        }
        // rnr_retry 7 means retry for ever (IBTA C9-…).
        if self.attr.rnr_retry != 7 {
            if self.req.rnr_left == 0 {
                self.stats.retry_rnr_exceeded_err += 1;
                let idx = self.sq.comp;
                self.complete_send_error(idx, WcStatus::RnrRetryExcErr);
                return;
            }
            self.req.rnr_left -= 1;
        }
        self.nak_resume_at(psn);
        self.req.rnr_wait_until = Some(now.saturating_add(timer.duration()));
        // The peer answered: the retry deadline starts again after the wait.
        self.req.timer = None;
        self.req.retry_at = None;
        self.go_back();
    }

    fn on_seq_nak(&mut self, now: Instant, psn: Psn) {
        self.stats.rcvd_seq_err += 1;
        let (progress, _) = self.complete_through(psn.sub(1));
        if progress {
            self.on_progress(now);
        }
        self.nak_resume_at(psn);
        if self.sq.comp == self.sq.head || (self.comp.gap_retry_pending && !progress) {
            return;
        }
        self.comp.gap_retry_pending = true;
        // Loss: resend less at once (multiplicative decrease).
        self.req.rec.on_loss();
        self.retry_after_nak(now);
    }

    fn on_fatal_nak(&mut self, now: Instant, psn: Psn, code: NakCode) {
        let (progress, _) = self.complete_through(psn.sub(1));
        if progress {
            self.on_progress(now);
        }
        if self.sq.comp == self.sq.head {
            return;
        }
        let status = match code {
            NakCode::InvalidRequest | NakCode::InvalidRdRequest => WcStatus::RemInvReqErr,
            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
            NakCode::RemoteOperationalError => WcStatus::RemOpErr,
            NakCode::PsnSequenceError | NakCode::Reserved(_) => WcStatus::BadRespErr,
        };
        let idx = self.sq.comp;
        self.complete_send_error(idx, status);
    }

    fn on_atomic_ack(&mut self, now: Instant, psn: Psn, orig: u64, mem: &dyn Memory) {
        let (progress, _) = self.complete_through(psn.sub(1));
        if progress {
            self.on_progress(now);
        }
        let idx = self.sq.comp;
        if idx == self.sq.head {
            self.stats.drop(DropReason::UnexpectedResponse);
            return;
        }
        let w = *self.sq.get(idx);
        if !(w.assigned && w.opcode.is_atomic() && w.first_psn == psn) {
            self.stats.drop(DropReason::UnexpectedResponse);
            return;
        }
        // The original value lands in the local buffer in host order, as
        // verbs atomics work on native 64-bit integers.
        if !self.scatter_local(idx, 0, &orig.to_ne_bytes(), mem) {
            self.complete_send_error(idx, WcStatus::LocProtErr);
            return;
        }
        self.complete_ok();
        self.on_progress(now);
    }

    fn on_read_response(&mut self, now: Instant, pkt: &RocePacket<&[u8]>, mem: &dyn Memory) {
        let psn = pkt.bth().psn();
        if pkt.aeth().is_some_and(|a| !matches!(a.syndrome(), Syndrome::Ack(_))) {
            self.stats.drop(DropReason::Malformed);
            return;
        }
        let (progress, _) = self.complete_through(psn.sub(1));
        if progress {
            self.on_progress(now);
        }
        let idx = self.sq.comp;
        if idx == self.sq.head {
            self.stats.drop(DropReason::UnexpectedResponse);
            return;
        }
        let w = *self.sq.get(idx);
        // READs, and ATOMIC WRITE and FLUSH (answered by one zero-length
        // READ response, as rxe answers them).
        let answered_by_read = matches!(
            w.opcode,
            crate::wqe::WrOpcode::RdmaRead
                | crate::wqe::WrOpcode::AtomicWrite
                | crate::wqe::WrOpcode::Flush
        );
        let in_range = w.assigned
            && answered_by_read
            && !psn.is_before(w.first_psn)
            && !psn.is_after(w.last_psn());
        if !in_range || psn.is_before(self.comp.psn) {
            // A duplicate, or a response to a later READ behind a gap: the
            // responder is alive and streaming.
            self.stats.drop(DropReason::UnexpectedResponse);
            if w.assigned && answered_by_read {
                self.on_alive(now);
            }
            return;
        }
        if psn.is_after(self.comp.psn) {
            // Responses were lost: go back once to the first missing one.
            self.stats.drop(DropReason::OutOfSequence);
            if !self.comp.gap_retry_pending {
                self.comp.gap_retry_pending = true;
                self.req.rec.on_loss();
                self.retry_after_nak(now);
            } else {
                self.on_alive(now);
            }
            return;
        }
        if w.opcode != crate::wqe::WrOpcode::RdmaRead {
            if !pkt.payload().is_empty() {
                self.complete_send_error(idx, WcStatus::BadRespErr);
                return;
            }
            self.comp.psn = psn.next();
            self.complete_ok();
            self.on_progress(now);
            return;
        }
        let mtu = self.mtu();
        let offset = psn.distance_from(w.first_psn) * mtu;
        let want = (w.length - offset).min(mtu) as usize;
        let data = pkt.payload();
        if data.len() != want {
            self.complete_send_error(idx, WcStatus::BadRespErr);
            return;
        }
        if !self.scatter_local(idx, u64::from(offset), data, mem) {
            self.complete_send_error(idx, WcStatus::LocProtErr);
            return;
        }
        self.comp.psn = psn.next();
        if offset as usize + want >= w.length as usize {
            self.complete_ok();
        }
        self.on_progress(now);
    }

    /// Writes `data` into send WQE `idx`'s SGEs at `offset`.
    fn scatter_local(&self, idx: u64, offset: u64, data: &[u8], mem: &dyn Memory) -> bool {
        let mut at = 0usize;
        for (sge, off, l) in sgl_pieces(self.sq.sgl(idx), offset, data.len() as u64) {
            let chunk = &data[at..at + l as usize];
            if mem.write(Key::Local(sge.lkey), self.me(), sge.addr + off, chunk).is_err() {
                return false;
            }
            at += l as usize;
        }
        at == data.len()
    }
}
