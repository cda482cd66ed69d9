//! Shared receive queues.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::AtomicU32;

use crate::abi::consts::*;
use crate::abi::*;
use crate::ffi::{Kind, guard, null_errno};
use crate::objects::{SrqBox, from_c, hold, in_use, into_c, live_srq, obj, release};

pub(crate) unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(std::ptr::null_mut(), || {
        let (Some((p, c)), false) = (crate::objects::live_pd_ctx(pd), init.is_null()) else {
            return null_errno(libc::EINVAL);
        };
        let context = c.ibv();
        // SAFETY: the caller passes a readable and writable init attr.
        let a = unsafe { &mut *init };
        let attr = uroce::SrqAttr {
            max_wr: a.attr.max_wr,
            max_sge: a.attr.max_sge,
            srq_limit: a.attr.srq_limit,
        };
        let inner = match c.uroce().create_srq(&attr) {
            Ok(s) => s,
            Err(e) => return null_errno(e.errno()),
        };
        let got = inner.query();
        a.attr.max_wr = got.max_wr;
        a.attr.max_sge = got.max_sge;
        let handle = inner.handle();
        // SAFETY: ibv_srq is C data; all-zero is valid.
        let mut s: ibv_srq = unsafe { std::mem::zeroed() };
        s.context = context;
        s.srq_context = a.srq_context;
        s.pd = pd;
        s.handle = handle;
        let b = into_c(
            SrqBox {
                srq: UnsafeCell::new(s),
                inner,
                dev: c.dev.clone(),
                max_sge: got.max_sge,
                pd: p,
                users: AtomicU32::new(0),
                xrcd: std::ptr::null(),
                cq: std::ptr::null(),
            },
            Kind::Srq,
        );
        hold(&p.users);
        c.dev.srqs.lock().unwrap_or_else(|e| e.into_inner()).insert(handle, b as usize);
        b.cast()
    })
}

pub(crate) unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_srq(srq) else { return libc::EINVAL };
        if attr.is_null() || mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
            return libc::EINVAL;
        }
        // SAFETY: the caller passes a readable attribute struct.
        let a = unsafe { *attr };
        if mask & IBV_SRQ_MAX_WR != 0 {
            // A limit set with it is checked against the new size (rxe).
            if mask & IBV_SRQ_LIMIT != 0 && a.srq_limit > a.max_wr {
                return libc::EINVAL;
            }
            if let Err(e) = b.inner.resize(a.max_wr) {
                return e.errno();
            }
        }
        if mask & IBV_SRQ_LIMIT != 0
            && let Err(e) = b.inner.arm_limit(a.srq_limit)
        {
            return e.errno();
        }
        0
    })
}

pub(crate) unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_srq(srq) else { return libc::EINVAL };
        if attr.is_null() {
            return libc::EINVAL;
        }
        let q = b.inner.query();
        // SAFETY: the caller passes a writable attribute struct.
        unsafe {
            attr.write(ibv_srq_attr {
                max_wr: q.max_wr,
                max_sge: q.max_sge,
                srq_limit: q.srq_limit,
            })
        };
        0
    })
}

pub(crate) unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_srq(srq) else { return libc::EINVAL };
        if in_use(&b.users) {
            return libc::EBUSY;
        }
        // SAFETY: an SRQ holds its PD (use count), an XRC SRQ its domain
        // and CQ too.
        unsafe {
            release(&(*b.pd).users);
            if !b.xrcd.is_null() {
                release(&(*b.xrcd).users);
            }
            if !b.cq.is_null() {
                release(&(*b.cq).users);
            }
        }
        b.dev.srqs.lock().unwrap_or_else(|e| e.into_inner()).remove(&b.inner.handle());
        // SAFETY: registered as an SRQ ⇒ made by into_c::<SrqBox>.
        drop(unsafe { from_c(srq.cast::<SrqBox>(), Kind::Srq) });
        0
    })
}

/// `ops.post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: a live SRQ of ours (hot path).
        let b = unsafe { obj::<_, SrqBox>(srq) };
        let max_sge = b.map_or(0, |b| b.max_sge);
        crate::qp::post_recv_chain(wr, bad_wr, max_sge, |wrs| match b {
            Some(b) => b.inner.post_recv(wrs),
            None => Err(uroce::Error::InvalidArgument("NULL SRQ")),
        })
    })
}
