//! The responder's execution of a checked request: SEND into a receive
//! WQE, RDMA WRITE into memory, READ and atomics queued as responses, each
//! access checked by `Memory` before a byte moves; the expected PSN moves
//! on and ACKs are coalesced (`accept`).

use uroce_wire::{NakCode, Operation, RocePacket};

use super::{InMsg, MAX_QUEUED_RD_ATOMIC, RdAtomicRes, Reject, RespItem};
use crate::memory::{AccessError, AtomicOp, Key, Memory};
use crate::qp::Qp;
use crate::qp::attr::Access;
use crate::qp::requester::packets;
use crate::queue::sgl_pieces;
use crate::srq::Srq;
use crate::wqe::{Completion, WcFlags, WcOpcode, WcStatus};

impl Qp {
    /// Runs a request that passed [`Qp::check_request`]: places data,
    /// takes receive WQEs, performs READs and atomics (each checks its
    /// R_Key, rights and bounds through `Memory` first).
    pub(super) fn execute(
        &mut self,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
        srq: Option<&mut Srq>,
    ) -> Result<(), Reject> {
        match pkt.info().operation {
            Operation::Send => self.exec_send(pkt, mem, srq),
            Operation::RdmaWrite => self.exec_write(pkt, mem, srq),
            Operation::RdmaReadRequest => self.exec_read(pkt, mem),
            Operation::AtomicWrite => self.exec_atomic_write(pkt, mem),
            Operation::Flush => self.exec_flush(pkt, mem),
            _ => self.exec_atomic(pkt, mem),
        }
    }

    /// ATOMIC WRITE (IBA 1.5): 8 bytes stored at once at an 8-aligned
    /// address of a region granting REMOTE_WRITE, answered (and replayed
    /// for a duplicate) by a zero-length READ response, as rxe does.
    pub(super) fn exec_atomic_write(
        &mut self,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
    ) -> Result<(), Reject> {
        let Some(reth) = pkt.reth() else {
            return Err(Reject::INVALID_REQUEST);
        };
        let data = pkt.payload();
        // It takes a READ/atomic resource: none offered, none taken (rxe).
        if reth.dma_len() != 8
            || data.len() != 8
            || self.attr.max_dest_rd_atomic == 0
            || self.rd_atomic_queued() >= MAX_QUEUED_RD_ATOMIC
        {
            return Err(Reject::INVALID_REQUEST);
        }
        let value = u64::from_ne_bytes(data.try_into().map_err(|_| Reject::INVALID_REQUEST)?);
        match mem.atomic(reth.rkey(), self.me(), reth.va(), AtomicOp::Write { value }) {
            Ok(_) => {}
            Err(AccessError::Misaligned) => return Err(Reject::INVALID_REQUEST),
            Err(_) => return Err(Reject::Fatal { code: NakCode::RemoteAccessError, recv: None }),
        }
        self.answer_done(pkt);
        Ok(())
    }

    /// FLUSH (IBA 1.5): the range (or, selectivity "region", the key's
    /// whole region) must be the QP's and grant the placement types asked
    /// for; then earlier WRITEs are visible to every later reader (they
    /// were placed in PSN order, with the CPU's own stores; a fence orders
    /// them for readers on other CPUs). Answered as an ATOMIC WRITE.
    pub(super) fn exec_flush(
        &mut self,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
    ) -> Result<(), Reject> {
        let (Some(reth), Some(feth)) = (pkt.reth(), pkt.feth()) else {
            return Err(Reject::INVALID_REQUEST);
        };
        let rights = super::check::flush_rights(feth.placement()).ok_or(Reject::INVALID_REQUEST)?;
        if self.rd_atomic_queued() >= MAX_QUEUED_RD_ATOMIC || feth.selectivity() > 1 {
            return Err(Reject::INVALID_REQUEST);
        }
        // Selectivity "region" names the region by its key alone (rxe
        // skips the range); "range" is checked as a WRITE's would be.
        let ok = if feth.selectivity() == 0 {
            let len = u64::from(reth.dma_len());
            mem.check(Key::Remote(reth.rkey()), self.me(), reth.va(), len, rights).is_ok()
        } else {
            mem.check_region(reth.rkey(), self.me(), rights).is_ok()
        };
        if !ok {
            return Err(Reject::Fatal { code: NakCode::RemoteAccessError, recv: None });
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.answer_done(pkt);
        Ok(())
    }

    /// Queues the zero-length READ response that answers an ATOMIC WRITE
    /// or FLUSH, and remembers it for a duplicate.
    fn answer_done(&mut self, pkt: &RocePacket<&[u8]>) {
        let psn = pkt.bth().psn();
        self.remember(RdAtomicRes::Done { psn });
        self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
        let msn = self.resp.msn;
        self.resp.push_out(RespItem::Read {
            psn,
            va: 0,
            rkey: 0,
            remaining: 0,
            first: true,
            msn,
            pd: 0,
        });
        self.accept(pkt, 1);
    }

    pub(super) fn accept(&mut self, pkt: &RocePacket<&[u8]>, npsn: u32) {
        self.resp.epsn = self.resp.epsn.add(npsn);
        self.resp.nak_sent = false;
        if self.init.qp_type.is_reliable()
            && pkt.bth().ack_req()
            && !matches!(
                pkt.info().operation,
                Operation::RdmaReadRequest
                    | Operation::CompareSwap
                    | Operation::FetchAdd
                    | Operation::AtomicWrite
                    | Operation::Flush
            )
        {
            let psn = self.resp.epsn.sub(1);
            if self.resp.push_ack(psn) {
                self.stats.ack_deferred += 1;
            }
        }
    }

    pub(super) fn exec_send(
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
        // First or only: a receive WQE must be waiting (on a tag matching
        // SRQ, a tagged buffer may take the message instead).
        if offset == 0 && !matches!(self.resp.in_msg, InMsg::Send { .. }) {
            let taken = match srq {
                Some(s) if s.tm().is_some() => self.take_tm_recv(pkt, s),
                other => self.take_recv(other),
            };
            if !taken {
                return Err(Reject::Rnr);
            }
        }
        let data = pkt.payload();
        let skip = self.recv_cur.skip;
        if (offset + data.len() as u64).saturating_sub(skip) > self.recv_cur.length {
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
            if let Some(tm) = self.recv_cur.tm {
                self.end_tm_message(&tm, total.saturating_sub(skip));
                self.accept(pkt, 1);
                return Ok(());
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
    pub(in crate::qp) fn take_recv(&mut self, srq: Option<&mut Srq>) -> bool {
        if self.recv_cur.active {
            return true;
        }
        match srq {
            Some(srq) => srq.pop_into(&mut self.recv_cur),
            None => self.rq.pop_into(&mut self.recv_cur),
        }
    }

    /// Completes a message received on a tag matching SRQ (`placed`
    /// bytes of it in its buffer) and, for a matched rendezvous request,
    /// starts the READ of its data.
    fn end_tm_message(&mut self, tm: &crate::queue::TmCur, placed: u64) {
        let c = self.tm_completion(tm, placed);
        self.recv_cur.active = false;
        self.push_completion(c);
        self.resp.in_msg = InMsg::None;
        self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
        self.stats.rdma_recvs += 1;
        if let Some(rvh) = tm.rndv {
            self.start_rendezvous(tm, rvh);
        }
    }

    /// Writes `data`, the message's bytes from `offset`, into the taken
    /// receive WQE (past the bytes it skips: a tag matching header).
    pub(in crate::qp) fn scatter_cur(&self, offset: u64, data: &[u8], mem: &dyn Memory) -> bool {
        let skip = self.recv_cur.skip;
        let start = skip.saturating_sub(offset).min(data.len() as u64) as usize;
        let (offset, data) = ((offset + start as u64).saturating_sub(skip), &data[start..]);
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
    pub(in crate::qp) fn complete_recv_error(&mut self, status: WcStatus) {
        if self.recv_cur.active {
            self.recv_cur.active = false;
            // A tag matching SRQ's buffer ends as what it received.
            let opcode = self.recv_cur.tm.map_or(WcOpcode::Recv, |t| t.opcode);
            let c = Completion::new(self.recv_cur.wr_id, status, opcode, self.init.qpn, true);
            self.push_completion(c);
        }
    }

    pub(super) fn exec_write(
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

    pub(super) fn exec_read(
        &mut self,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
    ) -> Result<(), Reject> {
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
        let pd = self.me().pd;
        self.resp.push_out(RespItem::Read { psn, va, rkey, remaining: len, first: true, msn, pd });
        self.accept(pkt, npsn);
        Ok(())
    }

    pub(super) fn exec_atomic(
        &mut self,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
    ) -> Result<(), Reject> {
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
    pub(super) fn rd_atomic_queued(&self) -> usize {
        self.resp.out_rd_atomic
    }

    pub(super) fn remember(&mut self, r: RdAtomicRes) {
        let cap = usize::from(self.attr.max_dest_rd_atomic.max(1)).min(self.resp.res_cap);
        while self.resp.res.len() >= cap {
            self.resp.res.pop_front();
        }
        self.resp.res.push_back(r);
    }
}
