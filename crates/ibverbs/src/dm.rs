//! Device memory (`ibv_alloc_dm`, `ibv_free_dm`, `ibv_memcpy_to_dm`,
//! `ibv_memcpy_from_dm`, `ibv_reg_dm_mr`) over `uroce::Dm`: host memory
//! standing in for on-chip memory, registered zero-based as the kernel
//! requires (`IBV_ACCESS_ZERO_BASED`).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU32};

use crate::abi::*;
use crate::ffi::{Kind, guard, is_live, null_errno};
use crate::objects::{DmBox, MrBox, Shared, SharedMr, Ufile};
use crate::objects::{from_c, hold, in_use, into_c, live_ctx, live_pd, obj};

/// `IBV_ACCESS_ZERO_BASED`: the region's addresses start at 0.
const ZERO_BASED: c_uint = 1 << 5;

pub(crate) unsafe extern "C" fn alloc_dm(
    context: *mut ibv_context,
    attr: *mut ibv_alloc_dm_attr,
) -> *mut ibv_dm {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        // SAFETY: NULL or the caller's readable attributes.
        let Some(a) = (unsafe { attr.as_ref() }) else { return null_errno(libc::EINVAL) };
        // No alignment beyond a page is promised (log_align_req up to 12).
        if a.comp_mask != 0 || a.log_align_req > 12 {
            return null_errno(libc::EINVAL);
        }
        let dm = match c.uroce().alloc_dm(a.length) {
            Ok(d) => d,
            Err(e) => return null_errno(e.errno()),
        };
        let handle = c.ufile.add(Shared::Dm(dm.clone()));
        wrap(context, dm, handle, c.ufile.clone())
    })
}

/// An `ibv_dm` of context `context` for `dm` (allocated, or imported).
pub(crate) fn wrap(
    context: *mut ibv_context,
    dm: uroce::Dm,
    handle: u32,
    ufile: std::sync::Arc<Ufile>,
) -> *mut ibv_dm {
    let pub_dm = ibv_dm {
        context,
        memcpy_to_dm: Some(memcpy_to_dm),
        memcpy_from_dm: Some(memcpy_from_dm),
        comp_mask: 0,
        handle,
    };
    let b = DmBox { dm: UnsafeCell::new(pub_dm), inner: dm, users: AtomicU32::new(0), ufile };
    into_c(b, Kind::Dm).cast()
}

/// EBUSY while a memory region is registered on it, as the kernel's.
pub(crate) unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> c_int {
    guard(libc::EIO, || {
        if !is_live(dm.cast::<DmBox>(), Kind::Dm) {
            return libc::EINVAL;
        }
        // SAFETY: a live device memory of ours (checked just above).
        if in_use(&unsafe { &*dm.cast::<DmBox>() }.users) {
            return libc::EBUSY;
        }
        // SAFETY: registered as Dm ⇒ made by into_c::<DmBox>.
        if let Some(b) = unsafe { from_c(dm.cast::<DmBox>(), Kind::Dm) } {
            // Freed for every wrapper: no longer importable.
            // SAFETY: our box's public struct.
            b.ufile.remove(unsafe { (*b.dm.get()).handle });
        }
        0
    })
}

fn live_dm<'a>(dm: *mut ibv_dm) -> Option<&'a DmBox> {
    // SAFETY: dereferenced only once the registry says it is live.
    is_live(dm.cast::<DmBox>(), Kind::Dm).then(|| unsafe { obj::<_, DmBox>(dm) }).flatten()
}

/// Checks a copy's arguments, then runs it: 0, or the errno.
fn dm_copy(
    dm: *mut ibv_dm,
    offset: u64,
    host: bool,
    length: usize,
    copy: impl FnOnce(&uroce::Dm, usize) -> uroce::Result<()>,
) -> c_int {
    guard(libc::EIO, || {
        let Some(d) = live_dm(dm) else { return libc::EINVAL };
        if length == 0 {
            return 0;
        }
        let Ok(off) = usize::try_from(offset) else { return libc::EINVAL };
        if !host {
            return libc::EINVAL;
        }
        copy(&d.inner, off).map_or_else(|e| e.errno(), |()| 0)
    })
}

unsafe extern "C" fn memcpy_to_dm(
    dm: *mut ibv_dm,
    offset: u64,
    host: *const c_void,
    length: usize,
) -> c_int {
    dm_copy(dm, offset, !host.is_null(), length, |d, off| {
        // SAFETY: the caller gives `length` readable bytes at `host`
        // (not NULL: checked by `dm_copy` before this runs).
        let src = unsafe { std::slice::from_raw_parts(host.cast::<u8>(), length) };
        d.write(off, src)
    })
}

unsafe extern "C" fn memcpy_from_dm(
    host: *mut c_void,
    dm: *mut ibv_dm,
    offset: u64,
    length: usize,
) -> c_int {
    dm_copy(dm, offset, !host.is_null(), length, |d, off| {
        // SAFETY: the caller gives `length` writable bytes at `host`.
        let dst = unsafe { std::slice::from_raw_parts_mut(host.cast::<u8>(), length) };
        d.read(off, dst)
    })
}

/// `ibv_reg_dm_mr`: zero-based only (EINVAL without
/// `IBV_ACCESS_ZERO_BASED`, as the kernel); the region holds its device
/// memory (`ibv_free_dm` is EBUSY until it is deregistered).
pub(crate) unsafe extern "C" fn reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        let (Some(p), Some(d)) = (live_pd(pd), live_dm(dm)) else {
            return null_errno(libc::EINVAL);
        };
        if access & ZERO_BASED == 0 || access & crate::pd::ON_DEMAND as c_uint != 0 {
            return null_errno(libc::EINVAL);
        }
        let rights = match crate::pd::mr_access((access & !ZERO_BASED) as c_int) {
            Ok(a) => a,
            Err(e) => return null_errno(e),
        };
        let Ok(off) = usize::try_from(offset) else { return null_errno(libc::EINVAL) };
        let mr = match p.inner.reg_dm_mr(&d.inner, off, length, rights) {
            Ok(m) => m,
            Err(e) => return null_errno(e.errno()),
        };
        // SAFETY: a live PD; its context field was set at allocation.
        let context = unsafe { (*p.pd.get()).context };
        let (lkey, rkey) = (mr.lkey(), mr.rkey());
        let inner = std::sync::Arc::new(SharedMr {
            mr: Mutex::new(Some(mr)),
            range: Mutex::new((0, length)),
        });
        let handle = p.ufile.add(Shared::Mr(inner.clone()));
        let c = ibv_mr { context, pd, addr: std::ptr::null_mut(), length, handle, lkey, rkey };
        hold(&p.users);
        hold(&d.users);
        let b = MrBox {
            mr: UnsafeCell::new(c),
            inner,
            pd: AtomicPtr::new(std::ptr::from_ref(p).cast_mut()),
            dm: std::ptr::from_ref(d),
            ufile: p.ufile.clone(),
        };
        into_c(b, Kind::Mr).cast()
    })
}
