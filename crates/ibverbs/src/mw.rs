//! Memory windows: `ops.alloc_mw` / `bind_mw` / `dealloc_mw` (type 1,
//! bound with `ibv_bind_mw`), and the bind of a type 2 window carried by a
//! `IBV_WR_BIND_MW` work request or `ibv_wr_bind_mw`.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::Ordering;

use uroce::{Access, MwBind, MwType, SendFlags, SendWr, WrOpcode};

use crate::abi::*;
use crate::ffi::{Kind, guard, is_live, null_errno};
use crate::objects::live_pd;
use crate::objects::{MrBox, MwBox, QpBox, from_c, hold, into_c, lock, obj, release};

/// `ops.alloc_mw`.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, ty: c_int) -> *mut ibv_mw {
    guard(std::ptr::null_mut(), || {
        let Some(p) = live_pd(pd) else { return null_errno(libc::EINVAL) };
        let kind = match ty {
            1 => MwType::Type1,
            2 => MwType::Type2,
            _ => return null_errno(libc::EINVAL),
        };
        let inner = match p.inner.alloc_mw(kind) {
            Ok(mw) => mw,
            Err(e) => return null_errno(e.errno()),
        };
        let rkey = inner.rkey();
        // SAFETY: a live PD's public struct is readable.
        let context = unsafe { (*p.pd.get()).context };
        let c = ibv_mw { context, pd, rkey, handle: rkey, type_: ty };
        hold(&p.users);
        into_c(MwBox { mw: UnsafeCell::new(c), inner, pd: p }, Kind::Mw).cast()
    })
}

/// `ops.dealloc_mw`.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: registered as an MW ⇒ made by into_c::<MwBox>.
        let Some(b) = (unsafe { from_c(mw.cast::<MwBox>(), Kind::Mw) }) else {
            return libc::EINVAL;
        };
        // SAFETY: a window holds its PD (use count).
        release(unsafe { &(*b.pd).users });
        0
    })
}

/// The window and region of a bind, checked: both ours, same PD, the
/// range inside the region.
fn bind_parts<'a>(
    mw: *mut ibv_mw,
    info: &ibv_mw_bind_info,
) -> Result<(&'a MwBox, &'a MrBox, usize), c_int> {
    if !is_live(mw.cast::<MwBox>(), Kind::Mw) || !is_live(info.mr.cast::<MrBox>(), Kind::Mr) {
        return Err(libc::EINVAL);
    }
    // SAFETY: both live objects of ours (checked just above).
    let (w, r) = unsafe { (&*mw.cast::<MwBox>(), &*info.mr.cast::<MrBox>()) };
    if !std::ptr::eq(w.pd, r.pd.load(Ordering::Acquire)) {
        return Err(libc::EPERM);
    }
    let g = lock(&r.inner.mr);
    // Deregistered through another wrapper.
    let m = g.as_ref().ok_or(libc::EINVAL)?;
    let offset = info.addr.checked_sub(m.addr()).ok_or(libc::EINVAL)?;
    let end = offset.checked_add(info.length).ok_or(libc::EINVAL)?;
    if end > m.len() as u64 {
        return Err(libc::EINVAL);
    }
    Ok((w, r, offset as usize))
}

/// `ops.bind_mw`: binds a type 1 window (the header's `ibv_bind_mw` has
/// checked the type and the PD) and updates `mw->rkey`.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: NULL or a QP of ours.
        let (Some(q), false) = (unsafe { obj::<_, QpBox>(qp) }, bind.is_null()) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller passes a readable bind description.
        let b = unsafe { &*bind };
        if !is_live(mw.cast::<MwBox>(), Kind::Mw) {
            return libc::EINVAL;
        }
        // SAFETY: a live window of ours (checked just above).
        let w = unsafe { &*mw.cast::<MwBox>() };
        if w.inner.kind() != MwType::Type1 {
            return libc::EINVAL;
        }
        let bind = if b.bind_info.mr.is_null() {
            // No region: an unbind (the header has checked that address
            // and length are 0).
            if b.bind_info.addr != 0 || b.bind_info.length != 0 {
                return libc::EINVAL;
            }
            w.inner.unbind_info()
        } else {
            let (w, r, offset) = match bind_parts(mw, &b.bind_info) {
                Ok(p) => p,
                Err(e) => return e,
            };
            let access = Access(b.bind_info.mw_access_flags);
            let len = b.bind_info.length as usize;
            let g = lock(&r.inner.mr);
            let Some(m) = g.as_ref() else { return libc::EINVAL };
            match w.inner.bind_info(m, offset, len, access) {
                Ok(bind) => bind,
                Err(e) => return e.errno(),
            }
        };
        // Posted as the application asked: signaled (or fenced) or not.
        let wr = SendWr {
            wr_id: b.wr_id,
            opcode: WrOpcode::BindMw,
            flags: SendFlags(b.send_flags & 0xf),
            bind: Some(bind),
            ..SendWr::default()
        };
        match q.inner.post_send(&[wr]) {
            Ok(()) => {
                // SAFETY: a live window; rkey is ours to update.
                unsafe { (*w.mw.get()).rkey = bind.new_rkey };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// The bind of a type 2 window to `new_rkey` (an `IBV_WR_BIND_MW` WR or
/// `ibv_wr_bind_mw`); records the new R_Key in `mw->rkey`.
pub(crate) fn type2_bind(
    mw: *mut ibv_mw,
    new_rkey: u32,
    info: &ibv_mw_bind_info,
) -> Result<MwBind, c_int> {
    let (w, r, _) = bind_parts(mw, info)?;
    let bind = MwBind {
        mw_rkey: w.inner.rkey(),
        new_rkey,
        mr_lkey: lock(&r.inner.mr).as_ref().ok_or(libc::EINVAL)?.lkey(),
        addr: info.addr,
        length: info.length,
        access: Access(info.mw_access_flags),
    };
    // SAFETY: a live window.
    unsafe { (*w.mw.get()).rkey = new_rkey };
    Ok(bind)
}
