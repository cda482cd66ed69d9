//! One-line, tcpdump-style descriptions of RoCEv2 packets, shared by
//! `uroce decode` and the transport's trace logs.

use core::fmt;

use crate::{RocePacket, Transport};

impl<T: AsRef<[u8]>> fmt::Display for RocePacket<T> {
    /// `RC SEND_ONLY qp 0x000011 psn 0x123456 ack-req pkey 0xffff … len 64`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bth = self.bth();
        let info = self.info();
        write!(f, "{} qp {:#08x} psn {:#08x}", bth.opcode(), bth.dest_qpn(), bth.psn().value())?;
        if bth.ack_req() {
            f.write_str(" ack-req")?;
        }
        if bth.solicited() {
            f.write_str(" se")?;
        }
        if bth.mig_req() {
            f.write_str(" mig")?;
        }
        if bth.fecn() {
            f.write_str(" fecn")?;
        }
        if bth.becn() {
            f.write_str(" becn")?;
        }
        if bth.pad() != 0 {
            write!(f, " pad {}", bth.pad())?;
        }
        write!(f, " pkey {:#06x}", bth.pkey())?;
        if let Some(h) = self.rdeth() {
            write!(f, " RDETH eecn {:#08x}", h.eecn())?;
        }
        if let Some(h) = self.deth() {
            write!(f, " DETH qkey {:#010x} src-qp {:#08x}", h.qkey(), h.src_qpn())?;
        }
        if let Some(h) = self.xrceth() {
            write!(f, " XRCETH srq {:#08x}", h.xrc_srqn())?;
        }
        if let Some(h) = self.feth() {
            write!(f, " FETH sel {} plt {}", h.selectivity(), h.placement())?;
        }
        if let Some(h) = self.reth() {
            write!(f, " RETH va {:#x} rkey {:#x} dlen {}", h.va(), h.rkey(), h.dma_len())?;
        }
        if let Some(h) = self.atomic_eth() {
            write!(
                f,
                " AtomicETH va {:#x} rkey {:#x} swap/add {:#x} compare {:#x}",
                h.va(),
                h.rkey(),
                h.swap_add(),
                h.compare()
            )?;
        }
        if let Some(h) = self.aeth() {
            write!(f, " AETH {} msn {}", h.syndrome(), h.msn())?;
        }
        if let Some(h) = self.atomic_ack_eth() {
            write!(f, " AtomicAckETH orig {:#x}", h.orig())?;
        }
        if let Some(h) = self.immdt() {
            write!(f, " imm {:#010x}", h.imm())?;
        }
        if let Some(h) = self.ieth() {
            write!(f, " inv-rkey {:#x}", h.rkey())?;
        }
        if info.has_payload && info.transport != Transport::Cnp {
            write!(f, " len {}", self.payload_len())?;
        }
        // A MAD to QP1 (the GSI): the connection manager's message.
        if bth.dest_qpn() == 1
            && self.deth().is_some_and(|d| d.qkey() == crate::cm::CM_QKEY)
            && let Ok(mad) = crate::cm::CmMad::parse(self.payload())
        {
            write!(f, " {mad}")?;
        }
        Ok(())
    }
}
