//! Receive work queues and RSS (`ibv_create_wq`, `ibv_modify_wq`,
//! `ibv_destroy_wq`, `ibv_post_wq_recv`, `ibv_create_rwq_ind_table`,
//! `ibv_destroy_rwq_ind_table`, and RSS raw packet QPs through
//! `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_RX_HASH | _IND_TABLE`, made
//! in `qp.rs`) over `uroce::Wq`, `uroce::RwqIndTable` and
//! `Pd::create_rss_qp`. The C structs and boxes are in `objects.rs`.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicU32;

use uroce::raw::WqState;

use crate::abi::*;
use crate::ffi::{Kind, guard, is_live, null_errno};
use crate::objects::{IbvRwqIndTable, IbvWq, RwqBox, WqBox};
use crate::objects::{from_c, hold, in_use, into_c, live_ctx, live_pd, obj, release};

/// `struct ibv_wq_init_attr`.
#[repr(C)]
struct WqInitAttr {
    wq_context: *mut c_void,
    wq_type: c_int,
    max_wr: u32,
    max_sge: u32,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    comp_mask: u32,
    create_flags: u32,
}

/// `struct ibv_wq_attr`.
#[repr(C)]
struct WqAttr {
    attr_mask: u32,
    wq_state: c_int,
    curr_wq_state: c_int,
    flags: u32,
    flags_mask: u32,
}

/// `struct ibv_rwq_ind_table_init_attr`.
#[repr(C)]
struct RwqInitAttr {
    log_ind_tbl_size: u32,
    ind_tbl: *mut *mut IbvWq,
    comp_mask: u32,
}

const WQT_RQ: c_int = 0;
const WQ_ATTR_STATE: u32 = 1;
const WQ_ATTR_CURR_STATE: u32 = 2;

fn live_wq<'a>(wq: *mut IbvWq) -> Option<&'a WqBox> {
    // SAFETY: dereferenced only once the registry says it is live.
    is_live(wq.cast::<WqBox>(), Kind::Wq).then(|| unsafe { obj::<_, WqBox>(wq) }).flatten()
}

/// `verbs_context.create_wq`.
pub(crate) unsafe extern "C" fn create_wq(
    context: *mut ibv_context,
    attr: *mut c_void,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        // SAFETY: NULL or the caller's readable attributes.
        let Some(a) = (unsafe { attr.cast::<WqInitAttr>().as_ref() }) else {
            return null_errno(libc::EINVAL);
        };
        if a.wq_type != WQT_RQ || a.comp_mask != 0 || a.create_flags != 0 {
            return null_errno(if a.wq_type != WQT_RQ { libc::EINVAL } else { libc::EOPNOTSUPP });
        }
        let (Some(p), Some(q)) = (live_pd(a.pd), crate::objects::live_cq(a.cq)) else {
            return null_errno(libc::EINVAL);
        };
        let wq = match p.inner.create_wq(&q.inner, a.max_wr, a.max_sge) {
            Ok(w) => w,
            Err(e) => return null_errno(e.errno()),
        };
        hold(&p.users);
        hold(&q.users);
        let wqn = wq.wqn();
        let pub_wq = IbvWq {
            context,
            wq_context: a.wq_context,
            pd: a.pd,
            cq: a.cq,
            wq_num: wqn,
            handle: wqn,
            state: 0,
            wq_type: WQT_RQ,
            post_recv: Some(post_wq_recv),
            mutex: [0; 5],
            cond: [0; 6],
            events_completed: 0,
            comp_mask: 0,
        };
        let _ = c;
        let b = WqBox {
            wq: UnsafeCell::new(pub_wq),
            inner: wq,
            pd: std::ptr::from_ref(p),
            cq: std::ptr::from_ref(q),
            users: AtomicU32::new(0),
        };
        into_c(b, Kind::Wq).cast()
    })
}

/// `verbs_context.modify_wq`: the state (RESET, RDY, ERR), as the kernel
/// takes it.
pub(crate) unsafe extern "C" fn modify_wq(wq: *mut c_void, attr: *mut c_void) -> c_int {
    guard(libc::EIO, || {
        let Some(w) = live_wq(wq.cast()) else { return libc::EINVAL };
        // SAFETY: NULL or the caller's readable attributes.
        let Some(a) = (unsafe { attr.cast::<WqAttr>().as_ref() }) else { return libc::EINVAL };
        if a.attr_mask & !(WQ_ATTR_STATE | WQ_ATTR_CURR_STATE) != 0 {
            return libc::EOPNOTSUPP;
        }
        if a.attr_mask & WQ_ATTR_STATE == 0 {
            return 0;
        }
        let state = match a.wq_state {
            0 => WqState::Reset,
            1 => WqState::Ready,
            2 => WqState::Error,
            _ => return libc::EINVAL,
        };
        match w.inner.modify(state) {
            Ok(()) => {
                // SAFETY: our box's public struct.
                unsafe { (*w.wq.get()).state = a.wq_state };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_wq.post_recv` (`ibv_post_wq_recv`).
unsafe extern "C" fn post_wq_recv(
    wq: *mut IbvWq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        let w = live_wq(wq);
        let max_sge = u32::MAX;
        crate::qp::post_recv_chain(wr, bad_wr, max_sge, |wrs| match w {
            Some(w) => w.inner.post_recv(wrs),
            None => Err(uroce::Error::InvalidArgument("not a WQ")),
        })
    })
}

/// `verbs_context.destroy_wq`: EBUSY while an indirection table names it.
pub(crate) unsafe extern "C" fn destroy_wq(wq: *mut c_void) -> c_int {
    guard(libc::EIO, || {
        let Some(w) = live_wq(wq.cast()) else { return libc::EINVAL };
        if in_use(&w.users) {
            return libc::EBUSY;
        }
        // SAFETY: a WQ holds its PD and CQ (use counts).
        unsafe {
            release(&(*w.pd).users);
            release(&(*w.cq).users);
        }
        // SAFETY: registered as a WQ ⇒ made by into_c::<WqBox>.
        drop(unsafe { from_c(wq.cast::<WqBox>(), Kind::Wq) });
        0
    })
}

/// `verbs_context.create_rwq_ind_table`.
pub(crate) unsafe extern "C" fn create_rwq_ind_table(
    context: *mut ibv_context,
    attr: *mut c_void,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        // SAFETY: NULL or the caller's readable attributes.
        let Some(a) = (unsafe { attr.cast::<RwqInitAttr>().as_ref() }) else {
            return null_errno(libc::EINVAL);
        };
        if a.comp_mask != 0 {
            return null_errno(libc::EOPNOTSUPP);
        }
        if a.log_ind_tbl_size > 16 || a.ind_tbl.is_null() {
            return null_errno(libc::EINVAL);
        }
        let n = 1usize << a.log_ind_tbl_size;
        // SAFETY: the caller gives 2^log_ind_tbl_size WQ pointers.
        let list = unsafe { std::slice::from_raw_parts(a.ind_tbl, n) };
        let mut boxes = Vec::with_capacity(n);
        for &w in list {
            match live_wq(w) {
                Some(b) => boxes.push(b),
                None => return null_errno(libc::EINVAL),
            }
        }
        let wqs: Vec<uroce::Wq> = boxes.iter().map(|b| b.inner.clone()).collect();
        let inner = match c.uroce().create_rwq_ind_table(&wqs) {
            Ok(t) => t,
            Err(e) => return null_errno(e.errno()),
        };
        for b in &boxes {
            hold(&b.users);
        }
        let b = RwqBox {
            tbl: UnsafeCell::new(IbvRwqIndTable {
                context,
                ind_tbl_handle: 0,
                ind_tbl_num: 0,
                comp_mask: 0,
            }),
            inner,
            wqs: boxes.iter().map(|b| std::ptr::from_ref(*b)).collect(),
            users: AtomicU32::new(0),
        };
        let p = into_c(b, Kind::RwqIndTable);
        // SAFETY: just made; its public struct is ours to fill.
        unsafe {
            let id = p as usize as u32;
            (*(*p).tbl.get()).ind_tbl_handle = id as c_int;
            (*(*p).tbl.get()).ind_tbl_num = id as c_int;
        }
        p.cast()
    })
}

/// `verbs_context.destroy_rwq_ind_table`: EBUSY while an RSS QP uses it.
pub(crate) unsafe extern "C" fn destroy_rwq_ind_table(tbl: *mut c_void) -> c_int {
    guard(libc::EIO, || {
        if !is_live(tbl.cast::<RwqBox>(), Kind::RwqIndTable) {
            return libc::EINVAL;
        }
        // SAFETY: a live table of ours (checked just above).
        let t = unsafe { &*tbl.cast::<RwqBox>() };
        if in_use(&t.users) {
            return libc::EBUSY;
        }
        for &w in &t.wqs {
            // SAFETY: a table holds its WQs (use counts).
            release(unsafe { &(*w).users });
        }
        // SAFETY: registered ⇒ made by into_c::<RwqBox>.
        drop(unsafe { from_c(tbl.cast::<RwqBox>(), Kind::RwqIndTable) });
        0
    })
}
