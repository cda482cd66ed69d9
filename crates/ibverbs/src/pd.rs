//! Protection domains and memory regions.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::abi::consts::*;
use crate::abi::*;
use crate::ffi::{Kind, guard, is_live, null_errno, set_errno};
use crate::objects::{MrBox, PdBox, Shared, SharedMr, TdBox};
use crate::objects::{from_c, hold, in_use, into_c, lock, release};
use crate::objects::{live_ctx, live_pd};

pub(crate) unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        let pd = match c.uroce().alloc_pd() {
            Ok(pd) => pd,
            Err(e) => return null_errno(e.errno()),
        };
        let handle = c.ufile.add(Shared::Pd(pd.clone()));
        let b = into_c(
            PdBox {
                pd: UnsafeCell::new(ibv_pd { context, handle }),
                inner: pd,
                users: AtomicU32::new(0),
                parent_of: std::ptr::null(),
                td: std::ptr::null(),
                ufile: c.ufile.clone(),
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
        let Some(b) = (unsafe { from_c(pd.cast::<PdBox>(), Kind::Pd) }) else {
            return libc::EINVAL;
        };
        // Destroyed for every wrapper: no longer importable (a parent
        // domain has handle 0, which names nothing).
        // SAFETY: our box's public struct.
        b.ufile.remove(unsafe { (*b.pd.get()).handle });
        // A parent domain lets go of its PD and thread domain.
        if !b.parent_of.is_null() {
            // SAFETY: a parent domain holds its PD (use count).
            release(unsafe { &(*b.parent_of).users });
        }
        if !b.td.is_null() {
            // SAFETY: and its thread domain.
            release(unsafe { &(*b.td).users });
        }
        0
    })
}

/// `verbs_context.alloc_td` (`ibv_alloc_td`): a thread domain, a promise
/// that the objects of a parent domain on it are used by one thread at a
/// time. Accepted; uroce's locks stay (uncontended, they cost little).
pub(crate) unsafe extern "C" fn alloc_td(
    context: *mut ibv_context,
    attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    guard(std::ptr::null_mut(), || {
        if live_ctx(context).is_none() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: NULL or the caller's readable attributes.
        if unsafe { attr.as_ref() }.is_none_or(|a| a.comp_mask != 0) {
            return null_errno(libc::EINVAL);
        }
        let b = TdBox { td: UnsafeCell::new(ibv_td { context }), users: AtomicU32::new(0) };
        into_c(b, Kind::Td).cast()
    })
}

/// `verbs_context.dealloc_td`: EBUSY while a parent domain uses it.
pub(crate) unsafe extern "C" fn dealloc_td(td: *mut ibv_td) -> c_int {
    guard(libc::EIO, || {
        if !is_live(td.cast::<TdBox>(), Kind::Td) {
            return libc::EINVAL;
        }
        // SAFETY: a live thread domain of ours (checked just above).
        if in_use(&unsafe { &*td.cast::<TdBox>() }.users) {
            return libc::EBUSY;
        }
        // SAFETY: registered as Td ⇒ made by into_c::<TdBox>.
        drop(unsafe { from_c(td.cast::<TdBox>(), Kind::Td) });
        0
    })
}

/// `verbs_context.alloc_parent_domain` (`ibv_alloc_parent_domain`): a
/// PD-like object standing for `attr->pd` (same protection domain:
/// regions, QPs and CQs made on it are the PD's), with an optional thread
/// domain. Custom allocators are accepted and not called: uroce's queues
/// are not in memory the application provides.
pub(crate) unsafe extern "C" fn alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        // SAFETY: NULL or the caller's readable attributes.
        let Some(a) = (unsafe { attr.as_ref() }) else { return null_errno(libc::EINVAL) };
        let known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
        if a.comp_mask & !known != 0 {
            return null_errno(libc::EINVAL);
        }
        let Some(p) = live_pd(a.pd) else { return null_errno(libc::EINVAL) };
        // SAFETY: a live PD's public struct.
        if unsafe { (*p.pd.get()).context } != context || !p.parent_of.is_null() {
            // Another device's PD, or a parent domain of a parent domain.
            return null_errno(libc::EINVAL);
        }
        let td = if a.td.is_null() {
            std::ptr::null()
        } else if is_live(a.td.cast::<TdBox>(), Kind::Td)
            // SAFETY: a live thread domain of ours (checked first).
            && unsafe { (*a.td).context } == context
        {
            a.td.cast::<TdBox>().cast_const()
        } else {
            return null_errno(libc::EINVAL);
        };
        hold(&p.users);
        if !td.is_null() {
            // SAFETY: live (checked above).
            hold(unsafe { &(*td).users });
        }
        let b = PdBox {
            pd: UnsafeCell::new(ibv_pd { context, handle: 0 }),
            inner: p.inner.clone(),
            users: AtomicU32::new(0),
            parent_of: std::ptr::from_ref(p),
            td,
            ufile: p.ufile.clone(),
        };
        into_c(b, Kind::Pd).cast()
    })
}

/// `IBV_ACCESS_ON_DEMAND`.
pub(crate) const ON_DEMAND: c_int = 1 << 6;

/// Access flags for uroce: optional bits (relaxed ordering, ...) and the
/// huge-page hint are ignored, as rdma-core's providers do; on-demand
/// paging is the caller's to act on (`reg` does, `reg_dm_mr` refuses it);
/// anything else unknown is EINVAL.
pub(crate) fn mr_access(access: c_int) -> Result<uroce::Access, c_int> {
    let a = access as u32 & !(IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_HUGETLB | ON_DEMAND as u32);
    // IBV_ACCESS_FLUSH_GLOBAL (rdma-core 45) is taken; FLUSH_PERSISTENT is
    // refused by the Rust layer (no persistent memory).
    if a & !(0x3f | uroce::Access::FLUSH_GLOBAL.0 | uroce::Access::FLUSH_PERSISTENT.0) != 0 {
        return Err(libc::EINVAL);
    }
    Ok(uroce::Access(a))
}

fn reg(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_int) -> *mut ibv_mr {
    let Some(p) = live_pd(pd) else { return null_errno(libc::EINVAL) };
    let access_bits = access;
    let access = match mr_access(access) {
        Ok(a) => a,
        Err(e) => return null_errno(e),
    };
    let on_demand = access_bits & ON_DEMAND != 0;
    if addr.is_null() && !(on_demand && len == usize::MAX && iova == 0) {
        // NULL is only implicit on-demand paging's whole address space.
        return null_errno(libc::EINVAL);
    }
    let r = if on_demand && addr.is_null() {
        // SAFETY: the verbs contract: the application gives peers the key
        // and addresses only of memory they may write.
        unsafe { p.inner.register_implicit_on_demand(access) }
    } else if on_demand {
        // SAFETY: as above; on demand, the memory need not even be mapped.
        unsafe { p.inner.register_on_demand(addr as usize, len, iova, access) }
    } else {
        // SAFETY: the verbs contract of ibv_reg_mr: the application keeps
        // `addr..addr+len` mapped until ibv_dereg_mr, which drops the Mr
        // (and revokes its keys) before returning.
        unsafe { p.inner.register_raw_at(addr.cast(), len, iova, access) }
    };
    let mr = match r {
        Ok(mr) => mr,
        Err(e) => return null_errno(e.errno()),
    };
    // SAFETY: a live PD; its context field was set at allocation.
    let context = unsafe { (*p.pd.get()).context };
    let (lkey, rkey) = (mr.lkey(), mr.rkey());
    let inner =
        Arc::new(SharedMr { mr: Mutex::new(Some(mr)), range: Mutex::new((addr as usize, len)) });
    let handle = p.ufile.add(Shared::Mr(inner.clone()));
    let c = ibv_mr { context, pd, addr, length: len, handle, lkey, rkey };
    hold(&p.users);
    let pd_box = AtomicPtr::new(std::ptr::from_ref(p).cast_mut());
    let ufile = p.ufile.clone();
    let b = MrBox { mr: UnsafeCell::new(c), inner, pd: pd_box, dm: std::ptr::null(), ufile };
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

/// `verbs_context.advise_mr` (`ibv_advise_mr`): prefetch advice for
/// ranges of on-demand regions (`IBV_ADVISE_MR_ADVICE_PREFETCH`, `_WRITE`,
/// `_NO_FAULT`, optionally `IBV_ADVISE_MR_FLAG_FLUSH`). Nothing needs
/// faulting in ahead (see `uroce::Pd::advise_prefetch`): the ranges are
/// checked, and EINVAL names a bad one.
pub(crate) unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: c_int,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    guard(libc::EIO, || {
        let Some(p) = live_pd(pd) else { return libc::EINVAL };
        if !(0..=2).contains(&advice) || flags & !1 != 0 || sg_list.is_null() || num_sge == 0 {
            return libc::EINVAL;
        }
        // SAFETY: the caller gives `num_sge` readable SGEs.
        let sges = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) };
        let sgl: Vec<uroce::Sge> = sges
            .iter()
            .map(|s| uroce::Sge { addr: s.addr, length: s.length, lkey: s.lkey })
            .collect();
        p.inner.advise_prefetch(&sgl).map_or_else(|e| e.errno(), |()| 0)
    })
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
/// (`IBV_REREG_MR_ERR_CMD`, errno set). A new translation gives the
/// region new keys, written to `mr->lkey`/`rkey` (a new PD or new rights
/// alone keep them, as rxe and mlx5 do); on failure it stays as it was.
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
        let mut g = lock(&b.inner.mr);
        // Deregistered through another wrapper (an import's).
        let Some(m) = g.as_mut() else { return cmd(libc::EINVAL) };
        if flags & REREG_ACCESS != 0 && (access & ON_DEMAND != 0) != m.on_demand() {
            // A region is pinned or on demand for its whole life.
            return cmd(libc::EINVAL);
        }
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
            *lock(&b.inner.range) = (addr as usize, length);
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
        // The registration ends for every wrapper (its keys fail at once),
        // and is no longer importable.
        drop(lock(&b.inner.mr).take());
        // SAFETY: our box's public struct.
        b.ufile.remove(unsafe { (*b.mr.get()).handle });
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
