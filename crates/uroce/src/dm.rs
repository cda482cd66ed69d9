//! Device memory (`ibv_alloc_dm`): memory "on the device" that the
//! application reaches only by copying (`ibv_memcpy_to_dm` /
//! `ibv_memcpy_from_dm`) and that peers reach through a zero-based memory
//! region on it (`ibv_reg_dm_mr`). On a NIC it is on-chip SRAM, faster to
//! reach from the wire than host memory; a software device has only host
//! memory, so a page-aligned host buffer stands in for it, with the same
//! rules (no direct access, copies bounds-checked, the memory kept while a
//! region names it).

use std::sync::Arc;

use crate::context::{Context, Inner};
use crate::error::{Error, Result};
use crate::limits;
use crate::mr::OwnedBuf;

/// A device memory allocation. Cloning shares it; a memory region on it
/// keeps it alive.
#[derive(Clone)]
pub struct Dm {
    inner: Arc<DmInner>,
}

struct DmInner {
    ctx: Arc<Inner>,
    buf: OwnedBuf,
    len: usize,
}

impl std::fmt::Debug for Dm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Dm({} bytes)", self.inner.len)
    }
}

impl Context {
    /// Allocates `len` zeroed bytes of device memory (`ibv_alloc_dm`;
    /// host memory stands in for on-chip memory, see [`Dm`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0; [`Error::Limit`] above
    /// `max_dm_size`.
    pub fn alloc_dm(&self, len: usize) -> Result<Dm> {
        if len == 0 {
            return Err(Error::InvalidArgument("zero-length device memory"));
        }
        if len as u64 > limits::MAX_DM_SIZE {
            return Err(Error::Limit("max_dm_size"));
        }
        let buf = OwnedBuf::new(len).ok_or(Error::Limit("out of memory"))?;
        Ok(Dm { inner: Arc::new(DmInner { ctx: self.inner.clone(), buf, len }) })
    }
}

/// The unit of device memory copies: offsets and lengths are multiples of
/// it, as on mlx5, whose on-chip memory is reached in 4-byte words
/// (rdma-core's tests expect an unaligned copy to fail).
pub const DM_ALIGNMENT: usize = 4;

fn aligned(offset: usize, len: usize) -> Result<()> {
    if !offset.is_multiple_of(DM_ALIGNMENT) || !len.is_multiple_of(DM_ALIGNMENT) {
        return Err(Error::InvalidArgument("device memory is copied in 4-byte words"));
    }
    Ok(())
}

impl Dm {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether it is empty (never: an allocation has at least a byte).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Copies `data` in at `offset` (`ibv_memcpy_to_dm`), both multiples
    /// of [`DM_ALIGNMENT`] bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unaligned; [`Error::OutOfBounds`] past
    /// the end.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        aligned(offset, data.len())?;
        // Under the context's lock: a peer's WRITE lands under it too.
        let _d = self.inner.ctx.lock();
        self.inner.buf.copy_in(self.inner.len, offset, data).then_some(()).ok_or(Error::OutOfBounds)
    }

    /// Copies out from `offset` (`ibv_memcpy_from_dm`), both multiples of
    /// [`DM_ALIGNMENT`] bytes.
    ///
    /// # Errors
    /// As [`Dm::write`].
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        aligned(offset, out.len())?;
        let _d = self.inner.ctx.lock();
        self.inner.buf.copy_out(self.inner.len, offset, out).then_some(()).ok_or(Error::OutOfBounds)
    }

    /// The context it was allocated on.
    pub(crate) fn ctx(&self) -> &Arc<Inner> {
        &self.inner.ctx
    }

    /// Where its bytes are, for a registration on it.
    pub(crate) fn ptr(&self) -> std::ptr::NonNull<u8> {
        self.inner.buf.ptr()
    }
}
