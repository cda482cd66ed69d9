//! The 4-byte extension headers: ImmDt (§9.3.5), IETH (§9.3.6), RDETH
//! (§9.3.1), XRCETH (§9.3.7) and FETH (IBA 1.5 FLUSH).

use crate::field::{be24, be32, set_be24, set_be32};
use crate::view::header_view;

header_view!(
    /// A view over an ImmDt header.
    ImmDt,
    4
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// Immediate data, as the 4 bytes on the wire read big-endian. Verbs hand
    /// it to the application unchanged (`imm_data` is in network order).
    pub fn imm(&self) -> u32 {
        be32(self.raw(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets the immediate data.
    pub fn set_imm(&mut self, v: u32) {
        set_be32(self.raw_mut(), 0, v);
    }
}

header_view!(
    /// A view over an IETH.
    Ieth,
    4
);

impl<T: AsRef<[u8]>> Ieth<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        be32(self.raw(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, v: u32) {
        set_be32(self.raw_mut(), 0, v);
    }
}

header_view!(
    /// A view over an RDETH.
    Rdeth,
    4
);

impl<T: AsRef<[u8]>> Rdeth<T> {
    /// End-to-end context (24 bits).
    pub fn eecn(&self) -> u32 {
        be24(self.raw(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Rdeth<T> {
    /// Sets the EE context (reserved byte cleared).
    pub fn set_eecn(&mut self, v: u32) {
        self.raw_mut()[0] = 0;
        set_be24(self.raw_mut(), 1, v & 0xff_ffff);
    }
}

header_view!(
    /// A view over an XRCETH.
    XrcEth,
    4
);

impl<T: AsRef<[u8]>> XrcEth<T> {
    /// Target XRC SRQ number (24 bits).
    pub fn xrc_srqn(&self) -> u32 {
        be24(self.raw(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> XrcEth<T> {
    /// Sets the XRC SRQ number (reserved byte cleared).
    pub fn set_xrc_srqn(&mut self, v: u32) {
        self.raw_mut()[0] = 0;
        set_be24(self.raw_mut(), 1, v & 0xff_ffff);
    }
}

header_view!(
    /// A view over a FETH.
    Feth,
    4
);

impl<T: AsRef<[u8]>> Feth<T> {
    /// Selectivity level (bits 5:4).
    pub fn selectivity(&self) -> u8 {
        ((be32(self.raw(), 0) >> 4) & 0x3) as u8
    }
    /// Placement type (bits 3:0).
    pub fn placement(&self) -> u8 {
        (be32(self.raw(), 0) & 0xf) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Feth<T> {
    /// Sets selectivity level and placement type (reserved bits cleared).
    pub fn set(&mut self, selectivity: u8, placement: u8) {
        let v = (u32::from(selectivity & 0x3) << 4) | u32::from(placement & 0xf);
        set_be32(self.raw_mut(), 0, v);
    }
}

/// FETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FethRepr {
    /// Selectivity level (2 bits).
    pub selectivity: u8,
    /// Placement type (4 bits).
    pub placement: u8,
}
