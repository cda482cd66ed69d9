//! XRC in the C ABI (`ibv_open_xrcd`, `ibv_close_xrcd`, XRC SRQs through
//! `ibv_create_srq_ex`, `ibv_get_srq_num`, XRC target QPs through
//! `ibv_create_qp_ex`) over `uroce::Xrcd`. Opening the same file twice in
//! a process gives the same domain, as the kernel keys domains by inode
//! (processes sharing a device do not share domains yet).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicU32;
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::abi::consts::IBV_QPT_XRC_RECV;
use crate::abi::*;
use crate::ffi::{Kind, guard, is_live, null_errno};
use crate::objects::{
    CtxBox, QpBox, SrqBox, XrcdBox, from_c, hold, in_use, into_c, live_cq, live_ctx, live_pd,
    live_srq, obj,
};

/// `IBV_SRQ_INIT_ATTR_*` and `IBV_SRQT_*`.
const SRQ_TYPE: u32 = 1;
const SRQ_PD: u32 = 2;
const SRQ_XRCD: u32 = 4;
const SRQ_CQ: u32 = 8;
const SRQT_BASIC: c_int = 0;
const SRQT_XRC: c_int = 1;

/// Domains opened by file: (device, inode) → the domain and its opens.
type FileDomains = HashMap<(usize, u64, u64), (uroce::Xrcd, usize)>;

fn by_file() -> MutexGuard<'static, FileDomains> {
    static MAP: LazyLock<Mutex<FileDomains>> = LazyLock::new(Mutex::default);
    MAP.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) unsafe extern "C" fn open_xrcd(
    context: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        // SAFETY: NULL or the caller's readable attributes.
        let Some(a) = (unsafe { attr.as_ref() }) else { return null_errno(libc::EINVAL) };
        let all = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
        // Both are required (rdma-core's ibv_cmd_open_xrcd).
        if a.comp_mask != all {
            return null_errno(libc::EINVAL);
        }
        let oflags = a.oflags;
        let file = if a.fd == -1 {
            None
        } else {
            // SAFETY: all-zero is a valid `stat`.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat writes one `stat` into ours, for any descriptor.
            if unsafe { libc::fstat(a.fd, &mut st) } != 0 {
                return null_errno(libc::EBADF);
            }
            Some((st.st_dev, st.st_ino))
        };
        let inner = match file {
            None => c.uroce().open_xrcd(),
            Some((dev, ino)) => {
                let key = (std::sync::Arc::as_ptr(&c.dev) as usize, dev, ino);
                let mut map = by_file();
                // The kernel's answers: EINVAL for an existing domain with
                // O_EXCL, EAGAIN for a missing one without O_CREAT.
                match map.get_mut(&key) {
                    Some(_) if oflags & libc::O_EXCL != 0 => return null_errno(libc::EINVAL),
                    Some((x, opens)) => {
                        *opens += 1;
                        Ok(x.clone())
                    }
                    None if oflags & libc::O_CREAT == 0 => return null_errno(libc::EAGAIN),
                    None => c.uroce().open_xrcd().inspect(|x| {
                        map.insert(key, (x.clone(), 1));
                    }),
                }
            }
        };
        let inner = match inner {
            Ok(x) => x,
            Err(e) => return null_errno(e.errno()),
        };
        let b = XrcdBox {
            xrcd: UnsafeCell::new(ibv_xrcd { context }),
            inner,
            file: file.map(|(d, i)| (std::sync::Arc::as_ptr(&c.dev) as usize, d, i)),
            users: AtomicU32::new(0),
        };
        into_c(b, Kind::Xrcd).cast()
    })
}

pub(crate) unsafe extern "C" fn close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_xrcd(xrcd) else { return libc::EINVAL };
        if in_use(&b.users) {
            return libc::EBUSY;
        }
        // The key it was opened by (its context may be closed already).
        if let Some(key) = b.file {
            let mut map = by_file();
            if let Some((_, opens)) = map.get_mut(&key) {
                *opens -= 1;
                if *opens == 0 {
                    map.remove(&key);
                }
            }
        }
        // SAFETY: registered as Xrcd ⇒ made by into_c::<XrcdBox>.
        drop(unsafe { from_c(xrcd.cast::<XrcdBox>(), Kind::Xrcd) });
        0
    })
}

fn live_xrcd<'a>(xrcd: *mut ibv_xrcd) -> Option<&'a XrcdBox> {
    // SAFETY: dereferenced only once the registry says it is live.
    is_live(xrcd.cast::<XrcdBox>(), Kind::Xrcd)
        .then(|| unsafe { obj::<_, XrcdBox>(xrcd) })
        .flatten()
}

/// `verbs_context.create_srq_ex`: a basic SRQ (as `ibv_create_srq`) or an
/// XRC one (domain, CQ and PD given); tag matching is not there.
pub(crate) unsafe extern "C" fn create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        // SAFETY: NULL or the caller's readable and writable attributes.
        let Some(a) = (unsafe { attr.as_mut() }) else { return null_errno(libc::EINVAL) };
        if a.comp_mask & !(SRQ_TYPE | SRQ_PD | SRQ_XRCD | SRQ_CQ) != 0 {
            return null_errno(libc::EOPNOTSUPP);
        }
        let srq_type = if a.comp_mask & SRQ_TYPE != 0 { a.srq_type } else { SRQT_BASIC };
        if a.comp_mask & SRQ_PD == 0 {
            return null_errno(libc::EINVAL);
        }
        if srq_type == SRQT_BASIC {
            // SAFETY: `ibv_srq_init_attr_ex` begins with `ibv_srq_init_attr`.
            return unsafe { crate::srq::ibv_create_srq(a.pd, attr.cast()) };
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
        let got = inner.query();
        a.attr.max_wr = got.max_wr;
        a.attr.max_sge = got.max_sge;
        let handle = inner.handle();
        // SAFETY: ibv_srq is C data; all-zero is valid.
        let mut s: ibv_srq = unsafe { std::mem::zeroed() };
        s.context = context;
        s.srq_context = a.srq_context;
        s.pd = a.pd;
        s.handle = handle;
        let b = into_c(
            SrqBox {
                srq: UnsafeCell::new(s),
                inner,
                dev: c.dev.clone(),
                max_sge: got.max_sge,
                pd: p,
                users: AtomicU32::new(0),
                xrcd: x,
                cq: q,
            },
            Kind::Srq,
        );
        hold(&p.users);
        hold(&x.users);
        hold(&q.users);
        c.dev.srqs.lock().unwrap_or_else(|e| e.into_inner()).insert(handle, b as usize);
        b.cast()
    })
}

/// `verbs_context.get_srq_num`: the number XRC requests name the SRQ by.
pub(crate) unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_srq(srq) else { return libc::EINVAL };
        // SAFETY: NULL or the caller's writable number.
        match unsafe { srq_num.as_mut() } {
            Some(n) => {
                *n = b.inner.handle();
                0
            }
            None => libc::EINVAL,
        }
    })
}

/// An XRC target QP of domain `xrcd` (`ibv_create_qp_ex` with
/// `IBV_QPT_XRC_RECV`): no PD, CQs or queues.
pub(crate) fn create_target(
    c: &CtxBox,
    xrcd: *mut ibv_xrcd,
    qp_context: *mut c_void,
) -> Result<*mut QpBox, c_int> {
    let x = live_xrcd(xrcd).ok_or(libc::EINVAL)?;
    // SAFETY: a live domain's public struct.
    if unsafe { (*x.xrcd.get()).context } != c.ibv() {
        return Err(libc::EINVAL);
    }
    let inner = x.inner.create_target_qp().map_err(|e| e.errno())?;
    let qpn = inner.qpn();
    // SAFETY: ibv_qp_ex is C data; all-zero is valid (NULL fn pointers,
    // static-initialiser mutex/cond).
    let mut qpx: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let base = &mut qpx.qp_base;
    base.context = c.ibv();
    base.qp_context = qp_context;
    base.handle = qpn;
    base.qp_num = qpn;
    base.state = uroce::QpState::Reset as c_int;
    base.qp_type = IBV_QPT_XRC_RECV;
    let cap = ibv_qp_cap::default();
    let b = into_c(
        QpBox {
            qpx: UnsafeCell::new(qpx),
            inner,
            dev: c.dev.clone(),
            pd: std::ptr::null(),
            send_cq: std::ptr::null(),
            recv_cq: std::ptr::null(),
            srq: std::ptr::null(),
            xrcd: x,
            ex: false,
            cap,
            sq_sig_all: false,
            builder: Mutex::new(crate::wr_batch::Builder::new(&cap)),
            posting: std::sync::atomic::AtomicBool::new(false),
        },
        Kind::Qp,
    );
    hold(&x.users);
    c.dev.qps.lock().unwrap_or_else(|e| e.into_inner()).insert(qpn, b as usize);
    Ok(b)
}
