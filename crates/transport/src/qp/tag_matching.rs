//! A QP whose receives come from a tag matching SRQ (see [`crate::tm`]):
//! where a SEND lands (a tagged buffer or a plain WQE), what its
//! completion says, and the rendezvous the responder runs itself: the
//! READ of the requester's data through the QP's own send queue, then the
//! FIN, each an internal WQE that completes on the receive side or not at
//! all.

use uroce_wire::{Position, RocePacket};

use super::Qp;
use super::attr::QpState;
use crate::queue::{Internal, SendQueue, SendWqe, TmCur};
use crate::srq::Srq;
use crate::tm::{MAX_RNDV_HDR, RNDV_SLOTS, Rvh, TMH_LEN, Tmh, TmhOp};
use crate::wqe::{Completion, Sge, WcFlags, WcOpcode, WcStatus, WrOpcode};

impl Qp {
    /// Keeps send queue slots for rendezvous READs and FINs (a QP attached
    /// to a tag matching SRQ may have no send queue of its own: the test
    /// suite's has `max_send_wr` 0), with room for a FIN's inline header.
    /// Only while the queue is empty (at creation and reset).
    pub fn reserve_rendezvous(&mut self) {
        if self.req.tm_reserved > 0 || self.sq.len() > 0 {
            return;
        }
        let c = self.init.caps;
        self.sq = SendQueue::new(
            c.max_send_wr.max(1) as usize + RNDV_SLOTS as usize,
            c.max_send_sge.max(1) as usize,
            (c.max_inline_data as usize).max(TMH_LEN),
        );
        self.req.tm_reserved = RNDV_SLOTS;
    }

    /// Send queue slots the application may use (the rest are kept for
    /// rendezvous) and how many it does.
    pub(super) fn sq_room(&self) -> bool {
        let used = self.sq.len() - self.req.tm_inflight as usize;
        used < self.sq.capacity() - self.req.tm_reserved as usize
    }

    /// Takes what the message starting with `pkt` lands in, on tag
    /// matching SRQ `srq`: the oldest tagged buffer it matches (an EAGER
    /// or rendezvous request with a tag), else a plain WQE (unexpected,
    /// counted; or not tagged). False when it needs a plain WQE and none
    /// is posted (RNR).
    pub(super) fn take_tm_recv(&mut self, pkt: &RocePacket<&[u8]>, srq: &mut Srq) -> bool {
        if self.recv_cur.active {
            return true;
        }
        let payload = pkt.payload();
        let tmh = Tmh::parse(payload);
        let single = matches!(pkt.info().position, Position::Only);
        let tagged = tmh.filter(|t| t.op == TmhOp::Eager as u8 || t.op == TmhOp::Rndv as u8);
        if let Some(t) = tagged {
            // A rendezvous the QP can run: one packet with its RVH, a send
            // queue that works and a slot for it.
            let rvh = (t.op == TmhOp::Rndv as u8).then(|| Rvh::parse(payload)).flatten();
            let runnable = rvh.is_some()
                && single
                && payload.len() as u32 <= MAX_RNDV_HDR
                && self.state == QpState::ReadyToSend
                && self.attr.max_rd_atomic > 0
                && self.req.tm_inflight < self.req.tm_reserved;
            let wanted = t.op == TmhOp::Eager as u8 || runnable;
            let matched = srq.tm_mut().filter(|_| wanted).and_then(|l| l.take_match(t.tag));
            if let Some(m) = matched {
                self.take_tagged(m.recv_wr_id, m.sge, t, rvh, single);
                return true;
            }
            if !srq.pop_into(&mut self.recv_cur) {
                return false;
            }
            let sync_req = srq.tm_mut().is_some_and(|l| l.unexpected());
            self.recv_cur.tm = Some(TmCur {
                opcode: WcOpcode::TmRecv,
                flags: if sync_req { WcFlags::TM_SYNC_REQ } else { WcFlags::NONE },
                status: WcStatus::Success,
                tag: 0,
                app_ctx: 0,
                rndv: None,
            });
            return true;
        }
        // Not tagged (NO_TAG, a FIN, too short for a header): whole, into
        // a plain WQE.
        if !srq.pop_into(&mut self.recv_cur) {
            return false;
        }
        self.recv_cur.tm = Some(TmCur {
            opcode: WcOpcode::TmNoTag,
            flags: WcFlags::NONE,
            status: WcStatus::Success,
            tag: 0,
            app_ctx: 0,
            rndv: None,
        });
        true
    }

    /// The message lands in a tagged buffer: an EAGER one's data after its
    /// header; a rendezvous request's not at all (its data is READ after
    /// it), unless the buffer is too short for that data: then the request
    /// itself is placed and software finishes the transfer
    /// (`IBV_WC_TM_RNDV_INCOMPLETE`).
    fn take_tagged(
        &mut self,
        recv_wr_id: u64,
        sge: Option<Sge>,
        t: Tmh,
        rvh: Option<Rvh>,
        single: bool,
    ) {
        let cur = &mut self.recv_cur;
        cur.active = true;
        cur.wr_id = recv_wr_id;
        cur.sges.clear();
        cur.sges.extend(sge);
        cur.length = sge.map_or(0, |s| u64::from(s.length));
        let mut tm = TmCur {
            opcode: WcOpcode::TmRecv,
            flags: WcFlags(WcFlags::TM_MATCH.0 | WcFlags::TM_DATA_VALID.0),
            status: WcStatus::Success,
            tag: t.tag,
            app_ctx: t.app_ctx,
            rndv: None,
        };
        cur.skip = TMH_LEN as u64;
        match rvh {
            Some(r) if u64::from(r.len) <= cur.length => {
                cur.skip = u64::MAX;
                tm.flags = WcFlags::TM_MATCH;
                tm.rndv = Some(r);
            }
            Some(_) => {
                cur.skip = 0;
                tm.flags = WcFlags::TM_MATCH;
                tm.status = WcStatus::TmRndvIncomplete;
            }
            None if !single => {
                // A message of several packets: the match is reported now,
                // the data at its end (as mlx5 does).
                let mut c = self.tm_completion(&tm, 0);
                c.flags = WcFlags::TM_MATCH;
                self.push_completion(c);
                tm.flags = WcFlags::TM_DATA_VALID;
                tm.tag = 0;
                tm.app_ctx = 0;
            }
            None => {}
        }
        self.recv_cur.tm = Some(tm);
    }

    /// The receive completion a tag matching message ends with.
    pub(super) fn tm_completion(&self, tm: &TmCur, byte_len: u64) -> Completion {
        let mut c = Completion::new(self.recv_cur.wr_id, tm.status, tm.opcode, self.init.qpn, true);
        c.flags = tm.flags;
        c.byte_len = byte_len as u32;
        c.tm_tag = tm.tag;
        c.imm_or_inv = tm.app_ctx;
        c.src_qp = self.attr.dest_qpn;
        c
    }

    /// After a matched rendezvous request: READs the requester's data
    /// into the tagged buffer the request took.
    pub(super) fn start_rendezvous(&mut self, tm: &TmCur, rvh: Rvh) {
        let sge = self.recv_cur.sges.first().map(|s| Sge { length: rvh.len, ..*s });
        let wqe = SendWqe {
            wr_id: self.recv_cur.wr_id,
            opcode: WrOpcode::RdmaRead,
            remote_addr: rvh.va,
            rkey: rvh.rkey,
            length: rvh.len,
            num_sge: u32::from(sge.is_some() && rvh.len > 0),
            compare_add: tm.tag,
            swap: u64::from(tm.app_ctx),
            internal: Internal::TmRead,
            ..SendWqe::EMPTY
        };
        let one = [sge.unwrap_or_default()];
        self.sq.push(wqe, &one[..wqe.num_sge as usize], None);
        self.req.tm_inflight += 1;
        self.publish_gauge();
    }

    /// An internal WQE ended with `status` (it left the send queue): a
    /// rendezvous READ completes its tagged buffer and, on success, sends
    /// the FIN; a FIN ends silently.
    pub(super) fn internal_done(&mut self, w: &SendWqe, status: WcStatus) {
        self.req.tm_inflight = self.req.tm_inflight.saturating_sub(1);
        if w.internal != Internal::TmRead {
            return;
        }
        let mut c = Completion::new(w.wr_id, status, WcOpcode::TmRecv, self.init.qpn, true);
        c.flags = WcFlags::TM_DATA_VALID;
        c.byte_len = if status == WcStatus::Success { w.length } else { 0 };
        c.src_qp = self.attr.dest_qpn;
        self.push_completion(c);
        if status != WcStatus::Success || self.state != QpState::ReadyToSend {
            return;
        }
        // The FIN: the request's header with the FIN opcode, alone.
        let fin = Tmh { op: TmhOp::Fin as u8, app_ctx: w.swap as u32, tag: w.compare_add };
        let wqe = SendWqe {
            wr_id: w.wr_id,
            opcode: WrOpcode::Send,
            length: TMH_LEN as u32,
            inline: true,
            internal: Internal::TmFin,
            ..SendWqe::EMPTY
        };
        self.sq.push(wqe, &[], Some(&fin.encode()));
        self.req.tm_inflight += 1;
    }
}
