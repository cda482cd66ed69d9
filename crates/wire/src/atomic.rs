//! Atomic Extended Transport Header (IBTA §9.3.4, 28 bytes) and Atomic
//! Acknowledge ETH (§9.5.4, 8 bytes).

use crate::field::{be32, be64, set_be32, set_be64};
use crate::view::header_view;

header_view!(
    /// A view over an AtomicETH.
    AtomicEth,
    28
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Remote virtual address (must be 8-byte aligned).
    pub fn va(&self) -> u64 {
        be64(self.raw(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        be32(self.raw(), 8)
    }
    /// Swap data (CmpSwap) or add data (FetchAdd).
    pub fn swap_add(&self) -> u64 {
        be64(self.raw(), 12)
    }
    /// Compare data (CmpSwap only).
    pub fn compare(&self) -> u64 {
        be64(self.raw(), 20)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        set_be64(self.raw_mut(), 0, v);
    }
    /// Sets the R_Key.
    pub fn set_rkey(&mut self, v: u32) {
        set_be32(self.raw_mut(), 8, v);
    }
    /// Sets the swap/add data.
    pub fn set_swap_add(&mut self, v: u64) {
        set_be64(self.raw_mut(), 12, v);
    }
    /// Sets the compare data.
    pub fn set_compare(&mut self, v: u64) {
        set_be64(self.raw_mut(), 20, v);
    }
}

/// AtomicETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap (CmpSwap) or add (FetchAdd) operand.
    pub swap_add: u64,
    /// Compare operand.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads an AtomicETH.
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicEth<T>) -> Self {
        Self { va: h.va(), rkey: h.rkey(), swap_add: h.swap_add(), compare: h.compare() }
    }
    /// Writes an AtomicETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicEth<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_swap_add(self.swap_add);
        h.set_compare(self.compare);
    }
}

header_view!(
    /// A view over an AtomicAckETH.
    AtomicAckEth,
    8
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// The value at the target address before the operation.
    pub fn orig(&self) -> u64 {
        be64(self.raw(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets the original remote data.
    pub fn set_orig(&mut self, v: u64) {
        set_be64(self.raw_mut(), 0, v);
    }
}

/// AtomicAckETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEthRepr {
    /// Original remote data.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Reads an AtomicAckETH.
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicAckEth<T>) -> Self {
        Self { orig: h.orig() }
    }
    /// Writes an AtomicAckETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicAckEth<T>) {
        h.set_orig(self.orig);
    }
}
