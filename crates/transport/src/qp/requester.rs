//! The requester: turns send WQEs into request packets (segmentation, PSN
//! assignment, the READ/atomic limit, fences, the send window) and restarts
//! from the oldest unacknowledged PSN when the completer asks (go-back-N).

use uroce_wire::{AtomicEthRepr, BthRepr, FethRepr, Opcode, RethRepr, RocePacketRepr};

use super::attr::{Access, QpState, QpType};
use super::{AsyncEvent, DEFAULT_PKEY, MAX_PKTS_PER_ACK, Qp};
use crate::Instant;
use crate::memory::{Key, Memory};
use crate::queue::sgl_pieces;
use crate::wqe::{SendFlags, WcStatus, WrOpcode};

/// Number of packets (PSNs) a message of `len` bytes takes at `mtu`.
pub(crate) fn packets(len: u32, mtu: u32) -> u32 {
    len.div_ceil(mtu).max(1)
}

/// Tail probes in a row (1, 3, 7 and 15 ms after the last progress, at
/// the shortest timeout) before a probe goes back over the window anyway:
/// the safety net should the path have lost packets after all and the
/// peer's NAK been lost too (with no Local ACK Timeout, nothing else
/// would resend them).
const TAIL_PROBES: u32 = 4;

impl Qp {
    /// Builds the next request packet into `buf`.
    pub(super) fn requester_poll(
        &mut self,
        now: Instant,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<usize> {
        if !matches!(self.state, QpState::ReadyToSend | QpState::SendQueueDrain) {
            return None;
        }
        if self.req.rnr_wait_until.is_some_and(|t| now < t) {
            return None;
        }
        let mut idx = self.sq.tx;
        if idx == self.sq.head {
            return None;
        }
        // Local operations (bind, local invalidate) run in order, once every
        // earlier WR has completed, and send nothing.
        while matches!(self.sq.get(idx).opcode, WrOpcode::BindMw | WrOpcode::LocalInv) {
            if self.sq.comp != idx || self.state == QpState::SendQueueDrain {
                return None;
            }
            self.run_local_op(idx, mem);
            if self.state == QpState::Error {
                return None;
            }
            idx = self.sq.tx;
            if idx == self.sq.head {
                return None;
            }
        }
        let mtu = self.mtu();
        let mut wqe = *self.sq.get(idx);
        if !wqe.assigned {
            if self.state == QpState::SendQueueDrain {
                return None;
            }
            if wqe.flags.contains(SendFlags::FENCE) && self.req.rd_atomic_inflight > 0 {
                return None;
            }
            if wqe.opcode.is_read_or_atomic()
                && self.req.rd_atomic_inflight >= u32::from(self.attr.max_rd_atomic.max(1))
            {
                return None;
            }
            // Local protection is checked before anything is sent: a bad
            // lkey completes the WQE with LOC_PROT_ERR (IBTA C10-…).
            if !wqe.inline && !self.local_sgl_ok(idx, mem) {
                self.complete_send_error(idx, WcStatus::LocProtErr);
                return None;
            }
            wqe.first_psn = self.req.next_psn;
            wqe.npsn = match wqe.opcode {
                WrOpcode::AtomicCmpAndSwp
                | WrOpcode::AtomicFetchAndAdd
                | WrOpcode::AtomicWrite
                | WrOpcode::Flush => 1,
                _ => packets(wqe.length, mtu),
            };
            wqe.assigned = true;
            if wqe.opcode.is_read_or_atomic() {
                wqe.counted = true;
                self.req.rd_atomic_inflight += 1;
            }
            self.req.next_psn = self.req.next_psn.add(wqe.npsn);
            *self.sq.get_mut(idx) = wqe;
        }
        let pkt = self.sq.tx_pkt;
        let psn = wqe.first_psn.add(pkt);
        // The send window: never more than `cwnd` PSNs past the oldest
        // unacknowledged one. A READ's responses count whole (the responder
        // streams them unasked), so it waits until its last response PSN
        // fits, unless it is the oldest outstanding request.
        let end = if wqe.opcode == WrOpcode::RdmaRead { wqe.last_psn() } else { psn };
        if psn != self.comp.psn
            && self.req.probe != Some(psn)
            && end.diff(self.comp.psn) >= self.req.rec.cwnd().clamp(1, 1 << 22) as i32
        {
            return None;
        }
        let len = self.build_request(now, idx, pkt, mem, buf)?;
        self.req.probe = None;
        if wqe.opcode.is_read_or_atomic() || pkt + 1 >= wqe.npsn {
            self.sq.tx += 1;
            self.sq.tx_pkt = 0;
        } else {
            self.sq.tx_pkt += 1;
        }
        if self.init.qp_type == QpType::Uc {
            // UC completes a WQE once its last packet is on the wire
            // (IBTA §9.8.1: no acknowledgement exists).
            self.comp.psn = psn.next();
            if self.sq.tx_pkt == 0 {
                self.complete_sent_uc();
            }
            return Some(len);
        }
        if self.req.timer.is_none() {
            self.arm_timer(now);
        }
        Some(len)
    }

    /// Arms the retransmission timer from `now`: the probe timeout from
    /// the round-trip estimate, or the retry deadline if that comes first
    /// (set to the Local ACK Timeout from now if none is running).
    pub(crate) fn arm_timer(&mut self, now: Instant) {
        let limit = self.attr.timeout.duration();
        if self.req.retry_at.is_none() {
            self.req.retry_at = limit.map(|d| now.saturating_add(d));
        }
        let probe = now.saturating_add(self.req.rec.rto(limit));
        self.req.timer = Some(self.req.retry_at.map_or(probe, |r| r.min(probe)));
    }

    fn local_sgl_ok(&self, idx: u64, mem: &dyn Memory) -> bool {
        let w = self.sq.get(idx);
        // READ and atomic results are written into the SGEs: they need
        // LOCAL_WRITE; SEND/WRITE only read them.
        let access = if w.opcode.is_read_or_atomic() { Access::LOCAL_WRITE } else { Access::NONE };
        self.sq.sgl(idx).iter().all(|s| {
            s.length == 0
                || mem
                    .check(Key::Local(s.lkey), self.me(), s.addr, u64::from(s.length), access)
                    .is_ok()
        })
    }

    /// Writes packet `pkt` of WQE `idx` (for READ: the request resuming at
    /// response packet `pkt`).
    fn build_request(
        &mut self,
        now: Instant,
        idx: u64,
        pkt: u32,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<usize> {
        let wqe = *self.sq.get(idx);
        let mtu = self.mtu();
        let first = pkt == 0;
        let last = pkt + 1 >= wqe.npsn;
        let psn = wqe.first_psn.add(pkt);
        let offset = pkt * mtu;
        let mut repr = RocePacketRepr {
            bth: BthRepr {
                pkey: DEFAULT_PKEY,
                dest_qpn: self.attr.dest_qpn,
                psn,
                ..BthRepr::default()
            },
            ..RocePacketRepr::default()
        };
        let mut payload_len = 0u32;
        let imm = matches!(wqe.opcode, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
        match wqe.opcode {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => {
                payload_len = (wqe.length - offset).min(mtu);
                let inv = wqe.opcode == WrOpcode::SendWithInv;
                repr.bth.opcode = match (first, last, imm, inv) {
                    (true, true, _, true) => Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
                    (false, true, _, true) => Opcode::RC_SEND_LAST_WITH_INVALIDATE,
                    (true, true, false, _) => Opcode::RC_SEND_ONLY,
                    (true, true, true, _) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
                    (true, false, _, _) => Opcode::RC_SEND_FIRST,
                    (false, false, _, _) => Opcode::RC_SEND_MIDDLE,
                    (false, true, false, _) => Opcode::RC_SEND_LAST,
                    (false, true, true, _) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
                };
                if last && imm {
                    repr.immdt = Some(wqe.imm_or_inv);
                }
                if last && inv {
                    repr.ieth = Some(wqe.imm_or_inv);
                }
            }
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => {
                payload_len = (wqe.length - offset).min(mtu);
                repr.bth.opcode = match (first, last, imm) {
                    (true, true, false) => Opcode::RC_RDMA_WRITE_ONLY,
                    (true, true, true) => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                    (true, false, _) => Opcode::RC_RDMA_WRITE_FIRST,
                    (false, false, _) => Opcode::RC_RDMA_WRITE_MIDDLE,
                    (false, true, false) => Opcode::RC_RDMA_WRITE_LAST,
                    (false, true, true) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
                };
                if first {
                    repr.reth =
                        Some(RethRepr { va: wqe.remote_addr, rkey: wqe.rkey, dma_len: wqe.length });
                }
                if last && imm {
                    repr.immdt = Some(wqe.imm_or_inv);
                }
            }
            WrOpcode::RdmaRead => {
                repr.bth.opcode = Opcode::RC_RDMA_READ_REQUEST;
                let off = offset.min(wqe.length);
                repr.reth = Some(RethRepr {
                    va: wqe.remote_addr.wrapping_add(u64::from(off)),
                    rkey: wqe.rkey,
                    dma_len: wqe.length - off,
                });
                repr.bth.ack_req = true;
            }
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                let cas = wqe.opcode == WrOpcode::AtomicCmpAndSwp;
                repr.bth.opcode = if cas { Opcode::RC_COMPARE_SWAP } else { Opcode::RC_FETCH_ADD };
                repr.atomic_eth = Some(AtomicEthRepr {
                    va: wqe.remote_addr,
                    rkey: wqe.rkey,
                    swap_add: if cas { wqe.swap } else { wqe.compare_add },
                    compare: if cas { wqe.compare_add } else { 0 },
                });
                repr.bth.ack_req = true;
            }
            WrOpcode::AtomicWrite => {
                // RETH for 8 bytes, the value as the payload (IBA 1.5).
                repr.bth.opcode = Opcode::RC_ATOMIC_WRITE;
                repr.reth = Some(RethRepr { va: wqe.remote_addr, rkey: wqe.rkey, dma_len: 8 });
                payload_len = 8;
                repr.bth.ack_req = true;
            }
            WrOpcode::Flush => {
                repr.bth.opcode = Opcode::RC_FLUSH;
                repr.feth = Some(FethRepr {
                    placement: (wqe.imm_or_inv & 0xf) as u8,
                    selectivity: ((wqe.imm_or_inv >> 4) & 0x3) as u8,
                });
                repr.reth =
                    Some(RethRepr { va: wqe.remote_addr, rkey: wqe.rkey, dma_len: wqe.length });
                repr.bth.ack_req = true;
            }
            WrOpcode::LocalInv | WrOpcode::BindMw => return None,
        }
        let is_data = !wqe.opcode.awaits_response();
        if self.init.qp_type == QpType::Uc {
            // Same operation codes, UC transport bits; UC asks for no ACKs.
            repr.bth.opcode = uroce_wire::Opcode(repr.bth.opcode.0 | 0x20);
        }
        if self.init.qp_type == QpType::XrcSend {
            // XRC transport bits, and the target SRQ in an XRCETH.
            repr.bth.opcode = uroce_wire::Opcode(repr.bth.opcode.0 | 0xa0);
            repr.xrceth = Some(wqe.xrc_srqn);
        }
        if is_data {
            // Ask for an ACK on a message's last packet, on the packet that
            // fills the window (nothing more may be sent until one comes),
            // and every half window, so that ACKs keep the window moving.
            self.req.noack_pkts += 1;
            let cwnd = self.req.rec.cwnd();
            let fills_window = psn.next().diff(self.comp.psn) >= cwnd as i32;
            let every = (cwnd / 2).clamp(1, MAX_PKTS_PER_ACK);
            if last || fills_window || self.req.noack_pkts >= every {
                repr.bth.ack_req = true;
            }
            if last && wqe.flags.contains(SendFlags::SOLICITED) {
                repr.bth.solicited = true;
            }
        }
        if self.req.ack_next {
            self.req.ack_next = false;
            repr.bth.ack_req = true;
        }
        if self.init.qp_type == QpType::Uc {
            repr.bth.ack_req = false;
        }
        if repr.bth.ack_req {
            self.req.noack_pkts = 0;
            if !psn.is_before(self.req.sent_high) {
                self.req.rec.on_sent(psn, now);
            }
        }
        repr.bth.pad = BthRepr::pad_for(payload_len as usize);
        let hl = repr.emit_headers(buf).ok()?;
        let total = repr.packet_len(payload_len as usize);
        if buf.len() < total {
            return None;
        }
        let payload = &mut buf[hl..hl + payload_len as usize];
        if wqe.opcode == WrOpcode::AtomicWrite {
            payload.copy_from_slice(&wqe.compare_add.to_ne_bytes());
        } else if wqe.inline {
            let data = self.sq.inline_data(idx);
            payload.copy_from_slice(&data[offset as usize..(offset + payload_len) as usize]);
        } else if payload_len > 0 {
            let mut at = 0usize;
            let mut ok = true;
            for (sge, off, l) in
                sgl_pieces(self.sq.sgl(idx), u64::from(offset), u64::from(payload_len))
            {
                let dst = &mut payload[at..at + l as usize];
                if mem.read(Key::Local(sge.lkey), self.me(), sge.addr + off, dst).is_err() {
                    ok = false;
                    break;
                }
                at += l as usize;
            }
            if !ok {
                // Deregistered after the check: a local protection error.
                self.complete_send_error(idx, WcStatus::LocProtErr);
                return None;
            }
        }
        buf[hl + payload_len as usize..total].fill(0);
        let end =
            if wqe.opcode == WrOpcode::RdmaRead { wqe.first_psn.add(wqe.npsn) } else { psn.next() };
        if psn.is_before(self.req.sent_high) {
            self.stats.retransmitted_pkts += 1;
        }
        if end.is_after(self.req.sent_high) {
            self.req.sent_high = end;
        }
        if first && is_data {
            self.stats.rdma_sends +=
                u64::from(matches!(wqe.opcode, WrOpcode::Send | WrOpcode::SendWithImm));
        }
        Some(total)
    }

    /// Performs the bind or local invalidate at the head of the send queue
    /// and completes it (an error completes it in error and fails the QP).
    fn run_local_op(&mut self, idx: u64, mem: &dyn Memory) {
        let w = *self.sq.get(idx);
        let result = match (w.opcode, w.bind) {
            (WrOpcode::BindMw, Some(b)) => {
                mem.bind_mw(self.me(), &b).map(|_| ()).map_err(|_| WcStatus::MwBindErr)
            }
            (WrOpcode::LocalInv, _) => {
                mem.invalidate(self.me(), w.imm_or_inv, false).map_err(|_| WcStatus::LocProtErr)
            }
            _ => Err(WcStatus::LocQpOpErr),
        };
        self.sq.tx = idx + 1;
        self.sq.tx_pkt = 0;
        match result {
            Ok(()) => self.complete_sent_uc(),
            Err(status) => self.complete_send_error(idx, status),
        }
    }

    /// Completes the oldest WQE of a UC or UD QP, sent in full (nothing
    /// acknowledges it).
    pub(crate) fn complete_sent_uc(&mut self) {
        let idx = self.sq.comp;
        let w = *self.sq.get(idx);
        if w.signaled {
            let mut c = crate::wqe::Completion::new(
                w.wr_id,
                WcStatus::Success,
                w.opcode.wc_opcode(),
                self.init.qpn,
                false,
            );
            c.byte_len = w.length;
            self.push_completion(c);
        }
        self.sq.comp += 1;
        self.check_drained();
    }

    /// Completes WQE `idx` (the oldest) with an error and moves the QP to
    /// ERR, flushing the rest.
    pub(crate) fn complete_send_error(&mut self, idx: u64, status: WcStatus) {
        debug_assert_eq!(idx, self.sq.comp);
        let w = *self.sq.get(idx);
        self.sq.comp += 1;
        if w.internal == crate::queue::Internal::No {
            let mut c = crate::wqe::Completion::new(
                w.wr_id,
                status,
                w.opcode.wc_opcode(),
                self.init.qpn,
                false,
            );
            c.byte_len = 0;
            self.push_completion(c);
        } else {
            self.internal_done(&w, status);
        }
        if self.sq.tx < self.sq.comp {
            self.sq.tx = self.sq.comp;
            self.sq.tx_pkt = 0;
        }
        self.stats.send_err += 1;
        self.fail(AsyncEvent::QpFatal);
    }

    /// A probe on a path that loses nothing (see `ReqState::lossless`):
    /// resend only the newest packet sent, asking for an ACK (past the
    /// window). The peer has everything, or will once it reads on (it was
    /// descheduled: on a busy host of two cores, several milliseconds),
    /// and answers this duplicate with one ACK for the whole window. A
    /// go-back would resend up to 128 packets it already has, and halve
    /// the window, per scheduler hiccup. Were a packet lost after all
    /// (the path changed), the probe arrives out of sequence and the
    /// peer's PSN sequence NAK starts the go-back; failing that, the probe
    /// after [`TAIL_PROBES`] of them does. False if nothing can be resent
    /// alone (no packet sent, or a READ or atomic last).
    fn tail_probe(&mut self) -> bool {
        let (tx, tx_pkt) = (self.sq.tx, self.sq.tx_pkt);
        let (idx, pkt) = if tx_pkt > 0 {
            (tx, tx_pkt - 1)
        } else if tx > self.sq.comp {
            let w = self.sq.get(tx - 1);
            let last = if w.opcode.is_read_or_atomic() { 0 } else { w.npsn.saturating_sub(1) };
            (tx - 1, last)
        } else {
            return false;
        };
        let w = *self.sq.get(idx);
        if !w.assigned || w.opcode.is_read_or_atomic() {
            // A READ or atomic: the responder answers its resend from the
            // replay cache in full, and a partly answered READ resumes
            // where its responses stopped: the go-back's job.
            return false;
        }
        self.sq.tx = idx;
        self.sq.tx_pkt = pkt;
        self.req.probe = Some(w.first_psn.add(pkt));
        self.req.ack_next = true;
        self.req.rec.on_retransmit();
        self.stats.retransmits += 1;
        true
    }

    /// Go-back-N: resend from the oldest unacknowledged PSN.
    pub(crate) fn go_back(&mut self) {
        let idx = self.sq.comp;
        if idx == self.sq.head {
            return;
        }
        let w = *self.sq.get(idx);
        self.sq.tx = idx;
        self.sq.tx_pkt = if w.assigned {
            self.comp.psn.distance_from(w.first_psn).min(w.npsn.saturating_sub(1))
        } else {
            0
        };
        self.req.ack_next = true;
        self.req.probe = None;
        self.req.rec.on_retransmit();
        self.stats.retransmits += 1;
    }

    /// The retransmission timer fired. At the retry deadline (the Local
    /// ACK Timeout without progress) a transport retry is spent, or the WR
    /// fails with RETRY_EXC_ERR once `retry_cnt` are; before it, the timer
    /// was a probe from the round-trip estimate: resend, spending nothing.
    pub(crate) fn retransmit_timeout(&mut self, now: Instant) {
        if self.sq.comp == self.sq.tx && self.sq.tx_pkt == 0 {
            self.req.retry_at = None;
            return; // nothing outstanding
        }
        if !matches!(self.state, QpState::ReadyToSend | QpState::SendQueueDrain) {
            return;
        }
        if self.req.retry_at.is_some_and(|r| r <= now) {
            self.req.rec.on_timeout();
            self.stats.local_ack_timeout_err += 1;
            self.req.retry_at = None;
            self.retry_or_fail(now);
        } else if self.req.lossless
            && self.req.rec.timeouts_in_run() < TAIL_PROBES
            && self.tail_probe()
        {
            self.req.rec.on_tail_probe();
            self.stats.rto_probes += 1;
        } else {
            self.req.rec.on_probe();
            self.stats.rto_probes += 1;
            self.go_back();
        }
        if matches!(self.state, QpState::ReadyToSend | QpState::SendQueueDrain) {
            self.arm_timer(now);
        }
    }

    /// Goes back after a NAK or a gap in responses. A NAK proves the peer
    /// alive, so only every [`NAK_RETRIES_PER_RETRY`]th such restart without
    /// progress spends a transport retry; the budget still runs out against
    /// a peer that NAKs for ever, and timeouts spend it one by one. (Linux
    /// rxe spends one per NAK but treats `retry_cnt` 7 as infinite; with the
    /// spec's finite 7, random loss on long READs would exhaust it.)
    pub(crate) fn retry_after_nak(&mut self, now: Instant) {
        self.req.nak_streak += 1;
        if self.req.nak_streak.is_multiple_of(super::NAK_RETRIES_PER_RETRY) {
            self.retry_or_fail(now);
        } else {
            self.go_back();
        }
    }

    /// Spends one transport retry and goes back, or fails.
    pub(crate) fn retry_or_fail(&mut self, _now: Instant) {
        if self.req.retry_left == 0 {
            self.stats.retry_exceeded_err += 1;
            let idx = self.sq.comp;
            self.complete_send_error(idx, WcStatus::RetryExcErr);
            return;
        }
        self.req.retry_left -= 1;
        self.stats.completer_retry_err += 1;
        self.go_back();
    }
}
