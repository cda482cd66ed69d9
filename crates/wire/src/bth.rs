//! Base Transport Header (IBTA §9.2, 12 bytes).
//!
//! ```text
//!  byte 0      opcode
//!  byte 1      SE(7) M(6) PadCnt(5:4) TVer(3:0)
//!  bytes 2-3   P_Key
//!  byte 4      FECN(7) BECN(6) reserved(5:0)   (masked to 0xff in the ICRC)
//!  bytes 5-7   DestQP
//!  byte 8      AckReq(7) reserved(6:0)
//!  bytes 9-11  PSN
//! ```

use crate::field::{be16, be24, set_be16, set_be24};
use crate::view::header_view;
use crate::{Opcode, Psn, Result, WireError};

header_view!(
    /// A view over a BTH.
    Bth,
    12
);

/// The only transport header version defined (IBTA §9.2.1: TVer = 0).
pub const BTH_TVER: u8 = 0;

impl<T: AsRef<[u8]>> Bth<T> {
    /// Opcode.
    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode(self.raw()[0])
    }
    /// Solicited event.
    #[inline]
    pub fn solicited(&self) -> bool {
        self.raw()[1] & 0x80 != 0
    }
    /// Migration request.
    #[inline]
    pub fn mig_req(&self) -> bool {
        self.raw()[1] & 0x40 != 0
    }
    /// Number of pad bytes before the ICRC (0–3).
    #[inline]
    pub fn pad(&self) -> u8 {
        (self.raw()[1] >> 4) & 0x3
    }
    /// Transport header version.
    #[inline]
    pub fn tver(&self) -> u8 {
        self.raw()[1] & 0xf
    }
    /// Partition key.
    #[inline]
    pub fn pkey(&self) -> u16 {
        be16(self.raw(), 2)
    }
    /// Forward explicit congestion notification.
    #[inline]
    pub fn fecn(&self) -> bool {
        self.raw()[4] & 0x80 != 0
    }
    /// Backward explicit congestion notification.
    #[inline]
    pub fn becn(&self) -> bool {
        self.raw()[4] & 0x40 != 0
    }
    /// Destination QP number (24 bits).
    #[inline]
    pub fn dest_qpn(&self) -> u32 {
        be24(self.raw(), 5)
    }
    /// Acknowledge request.
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.raw()[8] & 0x80 != 0
    }
    /// Packet sequence number.
    #[inline]
    pub fn psn(&self) -> Psn {
        Psn::new(be24(self.raw(), 9))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    /// Sets the opcode.
    pub fn set_opcode(&mut self, op: Opcode) {
        self.raw_mut()[0] = op.0;
    }
    /// Sets SE, M, PadCnt and TVer together (`pad` is masked to 2 bits).
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad: u8) {
        self.raw_mut()[1] =
            (u8::from(solicited) << 7) | (u8::from(mig_req) << 6) | ((pad & 0x3) << 4) | BTH_TVER;
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, pkey: u16) {
        set_be16(self.raw_mut(), 2, pkey);
    }
    /// Sets FECN/BECN (reserved bits cleared).
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.raw_mut()[4] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }
    /// Sets the destination QP (low 24 bits).
    pub fn set_dest_qpn(&mut self, qpn: u32) {
        set_be24(self.raw_mut(), 5, qpn & 0xff_ffff);
    }
    /// Sets AckReq (reserved bits cleared).
    pub fn set_ack_req(&mut self, ack_req: bool) {
        self.raw_mut()[8] = u8::from(ack_req) << 7;
    }
    /// Sets the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        set_be24(self.raw_mut(), 9, psn.value());
    }
}

/// A BTH's fields, for emission. Reserved bits are not carried: they are
/// ignored on parse and sent as zero (IBTA §9.2: "reserved fields shall be
/// transmitted as zero and ignored on receipt").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad byte count (0–3).
    pub pad: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QP number (24 bits).
    pub dest_qpn: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl Default for Opcode {
    fn default() -> Self {
        Self::RC_SEND_ONLY
    }
}

impl BthRepr {
    /// Reads a BTH.
    ///
    /// # Errors
    /// [`WireError::BadVersion`] if TVer is not 0 (rxe drops such packets).
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<Self> {
        if bth.tver() != BTH_TVER {
            return Err(WireError::BadVersion);
        }
        Ok(Self::parse_fields(bth))
    }

    /// Reads a BTH's fields without checking TVer (for views that were
    /// already checked, such as [`crate::RocePacket`]).
    pub fn parse_fields<T: AsRef<[u8]>>(bth: &Bth<T>) -> Self {
        Self {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad: bth.pad(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qpn: bth.dest_qpn(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        }
    }

    /// Writes every byte of the BTH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        bth.set_opcode(self.opcode);
        bth.set_flags(self.solicited, self.mig_req, self.pad);
        bth.set_pkey(self.pkey);
        bth.set_ecn(self.fecn, self.becn);
        bth.set_dest_qpn(self.dest_qpn);
        bth.set_ack_req(self.ack_req);
        bth.set_psn(self.psn);
    }

    /// The pad count that aligns a payload of `len` bytes to 4.
    pub const fn pad_for(len: usize) -> u8 {
        ((4 - (len & 3)) & 3) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rxe_read_request_bth() {
        // From read_bw.pcap: RC RDMA READ request, QPN 0x19, PSN 0xb7f08e.
        let b = [0x0c, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x19, 0x80, 0xb7, 0xf0, 0x8e];
        let r = BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.opcode, Opcode::RC_RDMA_READ_REQUEST);
        assert_eq!(r.dest_qpn, 0x19);
        assert!(r.ack_req);
        assert_eq!(r.psn, Psn::new(0xb7f08e));
        let mut out = [0u8; 12];
        r.emit(&mut Bth::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
    }

    #[test]
    fn short_and_bad_version() {
        assert_eq!(Bth::new_checked(&[0u8; 11][..]), Err(WireError::Truncated));
        let mut b = [0u8; 12];
        b[1] = 1;
        assert_eq!(BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()), Err(WireError::BadVersion));
    }

    #[test]
    fn pad_for() {
        assert_eq!(BthRepr::pad_for(0), 0);
        assert_eq!(BthRepr::pad_for(1), 3);
        assert_eq!(BthRepr::pad_for(2), 2);
        assert_eq!(BthRepr::pad_for(7), 1);
    }
}
