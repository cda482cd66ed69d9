//! The responder's answers: duplicates (re-executed READs, replayed
//! atomics, ACKs that never cover a later READ or atomic), and the queue of
//! ACKs, NAKs, READ responses and atomic ACKs sent in PSN order.

use uroce_wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, NakCode, Opcode, Operation, Psn, RocePacket,
    RocePacketRepr, Syndrome,
};

use super::{MAX_QUEUED_RD_ATOMIC, RdAtomicRes, RespItem};
use crate::memory::{Key, Memory};
use crate::qp::attr::{Access, QpState};
use crate::qp::{DEFAULT_PKEY, Qp};
use crate::stats::DropReason;

/// An RC response opcode in the XRC transport's class for an XRC target
/// (the same operation codes, transport bits 101).
fn xrc_if(t: crate::qp::attr::QpType, op: Opcode) -> Opcode {
    if t == crate::qp::attr::QpType::XrcRecv { Opcode(op.0 | 0xa0) } else { op }
}

impl Qp {
    /// A request with a PSN before the expected one: the requester resent
    /// it because an ACK or response was lost.
    pub(super) fn duplicate(&mut self, pkt: &RocePacket<&[u8]>, mem: &dyn Memory) {
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
                let pd = self.me().pd;
                let item = RespItem::Read { psn, va, rkey, remaining: len, first: true, msn, pd };
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
            Operation::AtomicWrite | Operation::Flush => {
                let done = self
                    .resp
                    .res
                    .iter()
                    .any(|r| matches!(*r, RdAtomicRes::Done { psn: p } if p == psn));
                if done && self.rd_atomic_queued() < MAX_QUEUED_RD_ATOMIC {
                    let msn = self.resp.msn;
                    let item = RespItem::Read {
                        psn,
                        va: 0,
                        rkey: 0,
                        remaining: 0,
                        first: true,
                        msn,
                        pd: 0,
                    };
                    self.resp.push_out(item);
                } else {
                    self.stats.drop(DropReason::StaleDuplicate);
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
    pub(super) fn dup_ack_psn(&self, dup: Psn) -> Psn {
        let mut last = self.resp.epsn.sub(1);
        for r in &self.resp.res {
            let first = match *r {
                RdAtomicRes::Read { first_psn, .. } => first_psn,
                RdAtomicRes::Atomic { psn, .. } | RdAtomicRes::Done { psn } => psn,
            };
            if first.is_after(dup) && !first.is_after(last) {
                last = first.sub(1);
            }
        }
        last
    }

    /// Builds the next response packet.
    pub(in crate::qp) fn responder_poll(
        &mut self,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<usize> {
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
            RespItem::Read { psn, va, rkey, remaining, first, msn, pd } => {
                let mtu = self.mtu();
                let n = remaining.min(mtu);
                let last = remaining <= mtu;
                let opcode = xrc_if(
                    self.init.qp_type,
                    match (first, last) {
                        (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                        (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                        (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                        (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    },
                );
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
                        .read(
                            Key::Remote(rkey),
                            crate::memory::Accessor { pd, qpn: self.init.qpn },
                            va,
                            &mut buf[hl..hl + n as usize],
                        )
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

    pub(super) fn build_ack(
        &self,
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
        orig: Option<u64>,
        buf: &mut [u8],
    ) -> Option<usize> {
        let repr = RocePacketRepr {
            bth: BthRepr {
                opcode: xrc_if(
                    self.init.qp_type,
                    if orig.is_some() {
                        Opcode::RC_ATOMIC_ACKNOWLEDGE
                    } else {
                        Opcode::RC_ACKNOWLEDGE
                    },
                ),
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
