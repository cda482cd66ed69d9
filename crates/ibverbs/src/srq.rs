//! Shared receive queues.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::AtomicU32;

use crate::abi::consts::*;
use crate::abi::*;
use crate::ffi::{Kind, guard, null_errno};
use crate::objects::{
    CqBox, CtxBox, EventLedger, PdBox, SrqBox, XrcdBox, from_c, hold, in_use, into_c, live_cq,
    live_ctx, live_pd, live_srq, live_xrcd, obj, release,
};

pub(crate) unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(std::ptr::null_mut(), || {
        let (Some((p, c)), false) = (crate::objects::live_pd_ctx(pd), init.is_null()) else {
            return null_errno(libc::EINVAL);
        };
        // SAFETY: the caller passes a readable and writable init attr.
        let a = unsafe { &mut *init };
        let attr = uroce::SrqAttr {
            max_wr: a.attr.max_wr,
            max_sge: a.attr.max_sge,
            srq_limit: a.attr.srq_limit,
        };
        match c.uroce().create_srq(&attr) {
            Ok(inner) => srq_box(c, a, pd, inner, p, (None, None)).cast(),
            Err(e) => null_errno(e.errno()),
        }
    })
}

/// The C handle of a new SRQ (basic, XRC with its domain and CQ, or tag
/// matching with its CQ): the granted sizes written back to `a`, what it
/// uses held.
fn srq_box(
    c: &CtxBox,
    a: &mut ibv_srq_init_attr,
    pd: *mut ibv_pd,
    inner: uroce::Srq,
    p: &PdBox,
    (xrcd, cq): (Option<&XrcdBox>, Option<&CqBox>),
) -> *mut SrqBox {
    let got = inner.query();
    a.attr.max_wr = got.max_wr;
    a.attr.max_sge = got.max_sge;
    let handle = inner.handle();
    // SAFETY: ibv_srq is C data; all-zero is valid.
    let mut s: ibv_srq = unsafe { std::mem::zeroed() };
    s.context = c.ibv();
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
            xrcd: xrcd.map_or(std::ptr::null(), std::ptr::from_ref),
            cq: cq.map_or(std::ptr::null(), std::ptr::from_ref),
            async_events: EventLedger::default(),
            async_queue: c.async_queue.clone(),
        },
        Kind::Srq,
    );
    hold(&p.users);
    if let Some(x) = xrcd {
        hold(&x.users);
    }
    if let Some(q) = cq {
        hold(&q.users);
    }
    c.dev.objects.srqs.lock().unwrap_or_else(|e| e.into_inner()).insert(handle, b as usize);
    b
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
        b.dev.objects.srqs.lock().unwrap_or_else(|e| e.into_inner()).remove(&b.inner.handle());
        // As rdma-core: every async event handed out for it acknowledged.
        b.async_events.wait_all_acknowledged();
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

/// `IBV_SRQ_INIT_ATTR_*` and `IBV_SRQT_*`.
const SRQ_TYPE: u32 = 1;
const SRQ_PD: u32 = 2;
const SRQ_XRCD: u32 = 4;
const SRQ_CQ: u32 = 8;
const SRQ_TM: u32 = 16;
const SRQT_BASIC: c_int = 0;
const SRQT_XRC: c_int = 1;
const SRQT_TM: c_int = 2;

/// `verbs_context.create_srq_ex`: a basic SRQ (as `ibv_create_srq`), an
/// XRC one (domain, CQ and PD given) or a tag matching one (CQ, PD and
/// its list's size given).
pub(crate) unsafe extern "C" fn create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        // SAFETY: NULL or the caller's readable and writable attributes.
        let Some(a) = (unsafe { attr.as_mut() }) else { return null_errno(libc::EINVAL) };
        if a.comp_mask & !(SRQ_TYPE | SRQ_PD | SRQ_XRCD | SRQ_CQ | SRQ_TM) != 0 {
            return null_errno(libc::EOPNOTSUPP);
        }
        let srq_type = if a.comp_mask & SRQ_TYPE != 0 { a.srq_type } else { SRQT_BASIC };
        if a.comp_mask & SRQ_PD == 0 {
            return null_errno(libc::EINVAL);
        }
        if srq_type == SRQT_BASIC {
            // SAFETY: `ibv_srq_init_attr_ex` begins with `ibv_srq_init_attr`.
            return unsafe { ibv_create_srq(a.pd, attr.cast()) };
        }
        if srq_type == SRQT_TM {
            return create_tm_srq(c, a);
        }
        if srq_type != SRQT_XRC {
            return null_errno(libc::EOPNOTSUPP);
        }
        if a.comp_mask & (SRQ_XRCD | SRQ_CQ) != SRQ_XRCD | SRQ_CQ {
            return null_errno(libc::EINVAL);
        }
        let (Some(p), Some(x), Some(q)) = (live_pd(a.pd), live_xrcd(a.xrcd.cast()), live_cq(a.cq))
        else {
            return null_errno(libc::EINVAL);
        };
        // All of this context's device.
        // SAFETY: live objects' public structs.
        let same =
            unsafe { (*p.pd.get()).context == context && (*x.xrcd.get()).context == context }
                && std::sync::Arc::ptr_eq(&q.dev, &c.dev);
        if !same {
            return null_errno(libc::EINVAL);
        }
        let attr_in = uroce::SrqAttr {
            max_wr: a.attr.max_wr,
            max_sge: a.attr.max_sge,
            srq_limit: a.attr.srq_limit,
        };
        let inner = match x.inner.create_srq(&p.inner, &q.inner, &attr_in) {
            Ok(s) => s,
            Err(e) => return null_errno(e.errno()),
        };
        let pd = a.pd;
        // SAFETY: `ibv_srq_init_attr_ex` begins with `ibv_srq_init_attr`;
        // `a` is not used past this point.
        let basic = unsafe { &mut *attr.cast::<ibv_srq_init_attr>() };
        srq_box(c, basic, pd, inner, p, (Some(x), Some(q))).cast()
    })
}

/// A tag matching SRQ (`IBV_SRQT_TM`): CQ and list size required, as
/// libibverbs checks them (`max_num_tags` above 0).
fn create_tm_srq(c: &CtxBox, a: &mut ibv_srq_init_attr_ex) -> *mut ibv_srq {
    if a.comp_mask & (SRQ_CQ | SRQ_TM) != SRQ_CQ | SRQ_TM || a.tm_cap[0] == 0 {
        return null_errno(libc::EINVAL);
    }
    let (Some(p), Some(q)) = (live_pd(a.pd), live_cq(a.cq)) else {
        return null_errno(libc::EINVAL);
    };
    // SAFETY: a live PD's public struct.
    let same =
        unsafe { (*p.pd.get()).context } == c.ibv() && std::sync::Arc::ptr_eq(&q.dev, &c.dev);
    if !same || a.tm_cap[1] > uroce::transport::tm::MAX_OPS {
        return null_errno(libc::EINVAL);
    }
    let attr_in = uroce::SrqAttr {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge,
        srq_limit: a.attr.srq_limit,
    };
    let inner = match c.uroce().create_tm_srq(&q.inner, &attr_in, a.tm_cap[0]) {
        Ok(s) => s,
        Err(e) => return null_errno(e.errno()),
    };
    let pd = a.pd;
    let attr: *mut ibv_srq_init_attr_ex = a;
    // SAFETY: `ibv_srq_init_attr_ex` begins with `ibv_srq_init_attr`.
    let basic = unsafe { &mut *attr.cast::<ibv_srq_init_attr>() };
    srq_box(c, basic, pd, inner, p, (None, Some(q))).cast()
}

/// `IBV_WR_TAG_*` and `IBV_OPS_*`.
const TAG_ADD: c_int = 0;
const TAG_DEL: c_int = 1;
const TAG_SYNC: c_int = 2;
const OPS_SIGNALED: c_int = 1;
const OPS_TM_SYNC: c_int = 2;

/// `verbs_context.post_srq_ops` (`ibv_post_srq_ops`): the chain's list
/// operations in order; an ADD's handle written back to its WR. On error,
/// `*bad_op` is the first operation not run (those before it ran).
pub(crate) unsafe extern "C" fn post_srq_ops(
    srq: *mut ibv_srq,
    op: *mut ibv_ops_wr,
    bad_op: *mut *mut ibv_ops_wr,
) -> c_int {
    guard(libc::EIO, || {
        let mut cur = op;
        let fail = |at: *mut ibv_ops_wr, errno: c_int| {
            if !bad_op.is_null() {
                // SAFETY: the caller's writable out-pointer.
                unsafe { *bad_op = at };
            }
            errno
        };
        let Some(b) = live_srq(srq) else { return fail(cur, libc::EINVAL) };
        if !b.inner.is_tag_matching() {
            return fail(cur, libc::EINVAL);
        }
        while !cur.is_null() {
            // SAFETY: a chain of the caller's readable and writable WRs.
            let w = unsafe { &mut *cur };
            let Some(one) = ops_wr(w) else { return fail(cur, libc::EINVAL) };
            let mut handle = [None];
            if let Err(e) = b.inner.post_ops(&[one], &mut handle) {
                return fail(cur, e.errno());
            }
            if let [Some(h)] = handle {
                w.handle = h;
            }
            cur = w.next;
        }
        0
    })
}

/// One `ibv_ops_wr` in uroce's terms; `None` for a bad opcode or more
/// than one SGE (`max_sge` is 1).
fn ops_wr(w: &ibv_ops_wr) -> Option<uroce::transport::tm::OpsWr> {
    use uroce::transport::tm::{OpsWr, TmOp};
    let op = match w.opcode {
        TAG_ADD => {
            let sge = match w.num_sge {
                0 => None,
                // SAFETY: `num_sge` readable SGEs at `sg_list`.
                1 if !w.sg_list.is_null() => Some(unsafe { *w.sg_list }),
                _ => return None,
            };
            let sge = sge.map(|s| uroce::Sge { addr: s.addr, length: s.length, lkey: s.lkey });
            TmOp::Add { recv_wr_id: w.recv_wr_id, sge, tag: w.tag, mask: w.mask }
        }
        TAG_DEL => TmOp::Del { handle: w.handle },
        TAG_SYNC => TmOp::Sync,
        _ => return None,
    };
    Some(OpsWr {
        wr_id: w.wr_id,
        op,
        signaled: w.flags & OPS_SIGNALED != 0,
        sync: w.flags & OPS_TM_SYNC != 0,
        unexpected_cnt: w.unexpected_cnt,
    })
}
