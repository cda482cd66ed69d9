//! Protection domains and memory regions.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicU32;

use crate::abi::consts::*;
use crate::abi::*;
use crate::ffi::{Kind, guard, null_errno, set_errno};
use crate::objects::{MrBox, PdBox, from_c, hold, in_use, into_c, release};
use crate::objects::{live_ctx, live_pd};

pub(crate) unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        let pd = match c.uroce().alloc_pd() {
            Ok(pd) => pd,
            Err(e) => return null_errno(e.errno()),
        };
        let b = into_c(
            PdBox {
                pd: UnsafeCell::new(ibv_pd { context, handle: 0 }),
                inner: pd,
                users: AtomicU32::new(0),
            },
            Kind::Pd,
        );
        b.cast()
    })
}

pub(crate) unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_pd(pd) else { return libc::EINVAL };
        if in_use(&b.users) {
            return libc::EBUSY;
        }
        // SAFETY: registered as a PD ⇒ made by into_c::<PdBox>.
        drop(unsafe { from_c(pd.cast::<PdBox>(), Kind::Pd) });
        0
    })
}

/// Access flags for uroce: optional bits (relaxed ordering, ...) and the
/// huge-page hint are ignored, as rdma-core's providers do; on-demand
/// paging is EOPNOTSUPP; anything else unknown is EINVAL.
fn mr_access(access: c_int) -> Result<uroce::Access, c_int> {
    let a = access as u32 & !(IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_HUGETLB);
    const ON_DEMAND: u32 = 1 << 6;
    if a & ON_DEMAND != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if a & !0x3f != 0 {
        return Err(libc::EINVAL);
    }
    Ok(uroce::Access(a))
}

fn reg(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_int) -> *mut ibv_mr {
    let Some(p) = live_pd(pd) else { return null_errno(libc::EINVAL) };
    let access = match mr_access(access) {
        Ok(a) => a,
        Err(e) => return null_errno(e),
    };
    if addr.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the verbs contract of ibv_reg_mr: the application keeps
    // `addr..addr+len` mapped until ibv_dereg_mr, which drops the Mr (and
    // revokes its keys) before returning.
    let mr = match unsafe { p.inner.register_raw_at(addr.cast(), len, iova, access) } {
        Ok(mr) => mr,
        Err(e) => return null_errno(e.errno()),
    };
    // SAFETY: a live PD; its context field was set at allocation.
    let context = unsafe { (*p.pd.get()).context };
    let c = ibv_mr {
        context,
        pd,
        addr,
        length: len,
        handle: mr.lkey(),
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    };
    hold(&p.users);
    let b = into_c(MrBox { mr: UnsafeCell::new(c), inner: mr, pd: p }, Kind::Mr);
    b.cast()
}

pub(crate) unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || reg(pd, addr, length, addr as u64, access))
}

pub(crate) unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || reg(pd, addr, length, iova, access))
}

pub(crate) unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || reg(pd, addr, length, iova, access as c_int))
}

pub(crate) unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    // No device memory to import a dma-buf into.
    null_errno(libc::EOPNOTSUPP)
}

/// `ibv_rereg_mr`: not supported; returns `IBV_REREG_MR_ERR_CMD` with
/// `errno = EOPNOTSUPP` and leaves the region as it was.
pub(crate) unsafe extern "C" fn ibv_rereg_mr(
    _mr: *mut ibv_mr,
    _flags: c_int,
    _pd: *mut ibv_pd,
    _addr: *mut c_void,
    _length: usize,
    _access: c_int,
) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -4
}

pub(crate) unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: registered as an MR ⇒ made by into_c::<MrBox>.
        let Some(b) = (unsafe { from_c(mr.cast::<MrBox>(), Kind::Mr) }) else {
            return libc::EINVAL;
        };
        // SAFETY: an MR holds its PD (use count), so the PD is live.
        release(unsafe { &(*b.pd).users });
        drop(b);
        0
    })
}
