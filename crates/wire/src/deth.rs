//! Datagram Extended Transport Header (IBTA §9.3.2, 8 bytes): Q_Key and
//! source QP of UD (and RD) requests.

use crate::field::{be24, be32, set_be24, set_be32};
use crate::view::header_view;

header_view!(
    /// A view over a DETH.
    Deth,
    8
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        be32(self.raw(), 0)
    }
    /// Source QP number (24 bits; byte 4 is reserved).
    pub fn src_qpn(&self) -> u32 {
        be24(self.raw(), 5)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, v: u32) {
        set_be32(self.raw_mut(), 0, v);
    }
    /// Sets the source QP (reserved byte cleared).
    pub fn set_src_qpn(&mut self, v: u32) {
        self.raw_mut()[4] = 0;
        set_be24(self.raw_mut(), 5, v & 0xff_ffff);
    }
}

/// DETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP number.
    pub src_qpn: u32,
}

impl DethRepr {
    /// Reads a DETH.
    pub fn parse<T: AsRef<[u8]>>(h: &Deth<T>) -> Self {
        Self { qkey: h.qkey(), src_qpn: h.src_qpn() }
    }
    /// Writes a DETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Deth<T>) {
        h.set_qkey(self.qkey);
        h.set_src_qpn(self.src_qpn);
    }
}
