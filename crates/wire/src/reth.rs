//! RDMA Extended Transport Header (IBTA §9.3.3, 16 bytes): virtual address,
//! R_Key and DMA length of an RDMA WRITE / READ request.

use crate::field::{be32, be64, set_be32, set_be64};
use crate::view::header_view;

header_view!(
    /// A view over a RETH.
    Reth,
    16
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        be64(self.raw(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        be32(self.raw(), 8)
    }
    /// Length of the whole message in bytes.
    pub fn dma_len(&self) -> u32 {
        be32(self.raw(), 12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        set_be64(self.raw_mut(), 0, v);
    }
    /// Sets the R_Key.
    pub fn set_rkey(&mut self, v: u32) {
        set_be32(self.raw_mut(), 8, v);
    }
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        set_be32(self.raw_mut(), 12, v);
    }
}

/// RETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length.
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads a RETH.
    pub fn parse<T: AsRef<[u8]>>(h: &Reth<T>) -> Self {
        Self { va: h.va(), rkey: h.rkey(), dma_len: h.dma_len() }
    }
    /// Writes a RETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Reth<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_dma_len(self.dma_len);
    }
}
