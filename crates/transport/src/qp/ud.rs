//! Unreliable Datagram (IBTA §9.8.2): one packet per message, a DETH with
//! the Q_Key and source QP, no connection, no ACKs. Receives get the
//! 40-byte GRH area first (the IP header, as RoCE providers put it there),
//! then the payload.

use core::net::IpAddr;

use uroce_wire::udp::{LinuxIpHeader, rxe_ud_sport};
use uroce_wire::{BthRepr, DethRepr, GRH_LEN, Opcode, RocePacket, RocePacketRepr, grh};

use super::attr::QpState;
use super::{DEFAULT_PKEY, Qp, Transmit};
use crate::memory::{Key, Memory};
use crate::queue::sgl_pieces;
use crate::srq::Srq;
use crate::stats::DropReason;
use crate::wqe::{Completion, SendFlags, WcFlags, WcOpcode, WcStatus, WrOpcode};

impl Qp {
    /// Builds the next UD send. The WQE completes as soon as it is sent.
    pub(super) fn ud_poll(&mut self, mem: &dyn Memory, buf: &mut [u8]) -> Option<Transmit> {
        if !matches!(self.state, QpState::ReadyToSend | QpState::SendQueueDrain) {
            return None;
        }
        let idx = self.sq.tx;
        if idx == self.sq.head {
            return None;
        }
        let wqe = *self.sq.get(idx);
        let ud = wqe.ud?;
        // Q_Keys with the high bit set mean "the QP's own Q_Key".
        let qkey = if ud.remote_qkey & 0x8000_0000 != 0 { self.attr.qkey } else { ud.remote_qkey };
        let imm = wqe.opcode == WrOpcode::SendWithImm;
        let repr = RocePacketRepr {
            bth: BthRepr {
                opcode: if imm {
                    Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                } else {
                    Opcode::UD_SEND_ONLY
                },
                solicited: wqe.flags.contains(SendFlags::SOLICITED),
                pad: BthRepr::pad_for(wqe.length as usize),
                pkey: DEFAULT_PKEY,
                dest_qpn: ud.remote_qpn,
                psn: self.req.next_psn,
                ..BthRepr::default()
            },
            deth: Some(DethRepr { qkey, src_qpn: self.init.qpn }),
            immdt: imm.then_some(wqe.imm_or_inv),
            ..RocePacketRepr::default()
        };
        let hl = repr.emit_headers(buf).ok()?;
        let n = wqe.length as usize;
        let total = repr.packet_len(n);
        if buf.len() < total {
            return None;
        }
        if wqe.inline {
            buf[hl..hl + n].copy_from_slice(self.sq.inline_data(idx));
        } else {
            let mut at = hl;
            let mut ok = true;
            for (sge, off, l) in sgl_pieces(self.sq.sgl(idx), 0, n as u64) {
                if mem
                    .read(
                        Key::Local(sge.lkey),
                        self.me(),
                        sge.addr + off,
                        &mut buf[at..at + l as usize],
                    )
                    .is_err()
                {
                    ok = false;
                    break;
                }
                at += l as usize;
            }
            if !ok {
                self.complete_send_error(idx, WcStatus::LocProtErr);
                return None;
            }
        }
        buf[hl + n..total].fill(0);
        self.req.next_psn = self.req.next_psn.next();
        self.sq.tx += 1;
        self.complete_sent_uc();
        Some(Transmit {
            len: total,
            dst: ud.dst,
            dst_port: ud.dst_port,
            src_port: rxe_ud_sport(self.init.qpn),
            sgid_index: ud.sgid_index,
            traffic_class: ud.traffic_class,
        })
    }

    /// Receives a UD SEND: Q_Key check, a receive WQE, the GRH area and the
    /// payload. Nothing is ever sent back.
    pub(super) fn ud_receive(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
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
        let Some(deth) = pkt.deth() else { return };
        // IBTA C10-15: a Q_Key mismatch drops the datagram silently.
        if deth.qkey() != self.attr.qkey {
            self.stats.drop(DropReason::QkeyViolation);
            return;
        }
        if !self.take_recv(srq) {
            // No receive WQE: UD drops (there is no RNR on UD).
            self.stats.drop(DropReason::NoReceiveWqe);
            return;
        }
        let data = pkt.payload();
        let total = GRH_LEN + data.len();
        let mut c = Completion::new(
            self.recv_cur.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            self.init.qpn,
            true,
        );
        c.src_qp = deth.src_qpn();
        c.solicited = pkt.bth().solicited();
        c.sl = if src.is_ipv4() { Completion::SL_ROCE_IPV4 } else { Completion::SL_ROCE_IPV6 };
        if total as u64 > self.recv_cur.length {
            c.status = WcStatus::LocLenErr;
        } else {
            let g = grh_for(src, dst, pkt.as_bytes().len());
            if self.scatter_cur(0, &g, mem) && self.scatter_cur(GRH_LEN as u64, data, mem) {
                c.byte_len = total as u32;
                c.flags = WcFlags::GRH;
                if let Some(imm) = pkt.immdt() {
                    c.imm_or_inv = imm.imm();
                    c.flags = WcFlags(WcFlags::GRH.0 | WcFlags::WITH_IMM.0);
                }
                self.stats.rdma_recvs += 1;
            } else {
                c.status = WcStatus::LocProtErr;
            }
        }
        self.recv_cur.active = false;
        self.push_completion(c);
    }
}

/// The GRH area for a datagram from `src` to `dst` whose RoCE packet is
/// `roce_len` bytes: the IP header as the sender's kernel built it (TTL,
/// TOS and flow label are not visible to a socket: Linux's defaults).
fn grh_for(src: IpAddr, dst: IpAddr, roce_len: usize) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    match LinuxIpHeader::new(src, dst, 8 + roce_len, 0) {
        LinuxIpHeader::V4(b) => grh::write_ipv4(&mut g, &b),
        LinuxIpHeader::V6(b) => grh::write_ipv6(&mut g, &b),
    }
    g
}
