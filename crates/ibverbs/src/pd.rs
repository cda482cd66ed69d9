//! Protection domains and memory regions.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use crate::abi::consts::*;
use crate::abi::*;
use crate::ffi::{Kind, guard, is_live, null_errno, set_errno};
use crate::objects::{MrBox, PdBox, from_c, hold, in_use, into_c, lock, release};
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
pub(crate) fn mr_access(access: c_int) -> Result<uroce::Access, c_int> {
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
    let pd_box = AtomicPtr::new(std::ptr::from_ref(p).cast_mut());
    let b =
        MrBox { mr: UnsafeCell::new(c), inner: Mutex::new(mr), pd: pd_box, dm: std::ptr::null() };
    let b = into_c(b, Kind::Mr);
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

/// `enum ibv_rereg_mr_flags`.
const REREG_TRANSLATION: c_int = 1;
const REREG_PD: c_int = 2;
const REREG_ACCESS: c_int = 4;
/// `IBV_REREG_MR_ERR_INPUT` and `IBV_REREG_MR_ERR_CMD`.
const REREG_ERR_INPUT: c_int = -1;
const REREG_ERR_CMD: c_int = -4;

/// `ibv_rereg_mr`: a new translation (`addr`, `length`; the IOVA is the
/// address), PD or rights for a region, as libibverbs checks its input
/// (`IBV_REREG_MR_ERR_INPUT`) and the kernel the command
/// (`IBV_REREG_MR_ERR_CMD`, errno set). The region gets new keys, written
/// to `mr->lkey`/`rkey`; on failure it stays as it was.
pub(crate) unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    guard(REREG_ERR_CMD, || {
        let input = |e| {
            set_errno(e);
            REREG_ERR_INPUT
        };
        let cmd = |e| {
            set_errno(e);
            REREG_ERR_CMD
        };
        if !is_live(mr.cast::<MrBox>(), Kind::Mr) {
            return input(libc::EINVAL);
        }
        // SAFETY: a live MR of ours (checked just above).
        let b = unsafe { &*mr.cast::<MrBox>() };
        if !b.dm.is_null() {
            // Only plain regions (IBV_MR_TYPE_MR) are registered again.
            return input(libc::EINVAL);
        }
        let all = REREG_TRANSLATION | REREG_PD | REREG_ACCESS;
        if flags & !all != 0
            || (flags & REREG_TRANSLATION != 0 && (length == 0 || addr.is_null()))
            || (access != 0 && flags & REREG_ACCESS == 0)
        {
            return input(libc::EINVAL);
        }
        if flags == 0 {
            // The kernel refuses a rereg that changes nothing.
            return cmd(libc::EINVAL);
        }
        let new_pd = if flags & REREG_PD != 0 {
            match live_pd(pd) {
                // SAFETY: a live PD's and a live MR's public structs.
                Some(p) if unsafe { (*p.pd.get()).context == (*b.mr.get()).context } => Some(p),
                _ => return cmd(libc::EINVAL),
            }
        } else {
            None
        };
        let rights = if flags & REREG_ACCESS != 0 {
            match mr_access(access) {
                Ok(a) => Some(a),
                Err(e) => return cmd(e),
            }
        } else {
            None
        };
        let mut m = lock(&b.inner);
        let r = if flags & REREG_TRANSLATION != 0 {
            // SAFETY: the verbs contract: the application keeps the new
            // range mapped until the region is deregistered or registered
            // again.
            unsafe {
                m.rereg_translation(
                    new_pd.map(|p| &p.inner),
                    addr.cast(),
                    length,
                    addr as u64,
                    rights,
                )
            }
        } else {
            m.rereg(new_pd.map(|p| &p.inner), rights)
        };
        if let Err(e) = r {
            return cmd(e.errno());
        }
        // SAFETY: a live MR's public struct, ours to update.
        let c = unsafe { &mut *b.mr.get() };
        (c.lkey, c.rkey) = (m.lkey(), m.rkey());
        if flags & REREG_TRANSLATION != 0 {
            (c.addr, c.length) = (addr, length);
        }
        if let Some(p) = new_pd {
            hold(&p.users);
            let old = b.pd.swap(std::ptr::from_ref(p).cast_mut(), Ordering::AcqRel);
            // SAFETY: an MR holds its PD (use count), so the old one is live.
            release(unsafe { &(*old).users });
            c.pd = pd;
        }
        0
    })
}

pub(crate) unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: registered as an MR ⇒ made by into_c::<MrBox>.
        let Some(b) = (unsafe { from_c(mr.cast::<MrBox>(), Kind::Mr) }) else {
            return libc::EINVAL;
        };
        // SAFETY: an MR holds its PD (use count), so the PD is live.
        release(unsafe { &(*b.pd.load(Ordering::Acquire)).users });
        if !b.dm.is_null() {
            // SAFETY: a region holds its device memory (use count).
            release(unsafe { &(*b.dm).users });
        }
        drop(b);
        0
    })
}
