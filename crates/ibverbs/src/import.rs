//! Sharing objects between contexts by handle (`ibv_import_device`,
//! `ibv_import_pd`, `_mr`, `_dm` and their `ibv_unimport_*`): a context
//! imported from a `dup` of another's `cmd_fd` shares that command file's
//! objects, and a PD, MR or DM of the file is wrapped again by its handle
//! (`pd->handle`, ...) in the importing context. As with the kernel's
//! objects, the object is one: any wrapper's destroy call ends it for all
//! (an MR's keys fail at once), and an unimport frees only the wrapper.
//!
//! uroce's objects live in the process that made them, so only the
//! command descriptor of a context of this process can be imported;
//! another's (passed over a Unix socket) is EOPNOTSUPP, what rdma-core
//! answers for a device without imports.

use std::ffi::c_int;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::AtomicPtr;

use crate::abi::*;
use crate::context::make_context;
use crate::ffi::{Kind, find_live, guard, null_errno, unregister};
use crate::objects::{CtxBox, DmBox, MrBox, PdBox, Shared, from_c, hold, in_use, into_c, lock};
use crate::objects::{live_ctx, live_pd, release};

/// Whether descriptors `a` and `b` are one open file (`kcmp`), `None`
/// where the kernel cannot tell.
fn same_open_file(a: RawFd, b: RawFd) -> Option<bool> {
    let pid = std::process::id() as libc::pid_t;
    const KCMP_FILE: libc::c_int = 0;
    // SAFETY: kcmp compares two descriptors of this process; no memory
    // is passed.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, a, b) };
    (r >= 0).then_some(r == 0)
}

/// The device and inode of descriptor `fd`.
fn inode(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: `st` is a plain C struct, written by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live buffer of the struct's size.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// What an imported context is made of: the original's device, engine
/// and command file's objects.
struct Found {
    index: usize,
    dev: Arc<crate::objects::DevShared>,
    ufile: Arc<crate::objects::Ufile>,
}

/// The live context whose `cmd_fd` is the open file `fd` is: by `kcmp`,
/// or, where the kernel has no `kcmp`, by inode if exactly one context's
/// file has it (under `uroce run` every context's is `/dev/null`).
fn context_of(fd: RawFd) -> Option<Found> {
    let mut by_inode = Vec::new();
    let want = inode(fd)?;
    let exact = find_live(Kind::Context, |p| {
        // SAFETY: a live context (the registry is locked while we look).
        let c = unsafe { &*(p as *const CtxBox) };
        let own = c.cmd_fd.as_ref().map(std::os::fd::AsRawFd::as_raw_fd)?;
        let found = || Found { index: c.dev_index, dev: c.dev.clone(), ufile: c.ufile.clone() };
        match same_open_file(own, fd) {
            Some(true) => Some(found()),
            Some(false) => None,
            None => {
                if inode(own) == Some(want) {
                    by_inode.push(found());
                }
                None
            }
        }
    });
    exact.or_else(|| (by_inode.len() == 1).then(|| by_inode.pop()).flatten())
}

pub(crate) unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        let Some(found) = context_of(cmd_fd) else {
            return null_errno(libc::EOPNOTSUPP);
        };
        let Ok(list) = crate::device::devices() else { return null_errno(libc::ENODEV) };
        let entry = &list[found.index];
        {
            // One more context on the engine (see ibv_close_device).
            let mut open = lock(&entry.open);
            match open.as_mut() {
                Some((shared, n)) if Arc::ptr_eq(shared, &found.dev) => *n += 1,
                _ => return null_errno(libc::EOPNOTSUPP),
            }
        }
        // SAFETY: the caller hands the descriptor over; the context
        // closes it (ibv_close_device), as rdma-core's import does.
        let fd = unsafe { OwnedFd::from_raw_fd(cmd_fd) };
        make_context(found.index, entry, found.dev, Some(fd), found.ufile)
    })
}

pub(crate) unsafe extern "C" fn ibv_import_pd(
    context: *mut ibv_context,
    pd_handle: u32,
) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        let Some(Shared::Pd(pd)) = c.ufile.get(pd_handle) else {
            return null_errno(libc::ENOENT);
        };
        let b = PdBox {
            pd: std::cell::UnsafeCell::new(ibv_pd { context, handle: pd_handle }),
            inner: pd,
            users: Default::default(),
            parent_of: std::ptr::null(),
            td: std::ptr::null(),
            ufile: c.ufile.clone(),
        };
        into_c(b, Kind::Pd).cast()
    })
}

/// Frees the wrapper only. One that objects still name (an imported MR,
/// a QP) is retired instead: no verb takes it any more, and its memory
/// stays for those objects' destroy calls to read.
pub(crate) unsafe extern "C" fn ibv_unimport_pd(pd: *mut ibv_pd) {
    guard((), || {
        let Some(b) = live_pd(pd) else { return };
        if in_use(&b.users) {
            unregister(pd.cast::<PdBox>(), Kind::Pd);
            return;
        }
        // SAFETY: registered as a PD ⇒ made by into_c::<PdBox>.
        drop(unsafe { from_c(pd.cast::<PdBox>(), Kind::Pd) });
    });
}

pub(crate) unsafe extern "C" fn ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        let Some(p) = live_pd(pd) else { return null_errno(libc::EINVAL) };
        let Some(Shared::Mr(shared)) = p.ufile.get(mr_handle) else {
            return null_errno(libc::ENOENT);
        };
        let (lkey, rkey) = match lock(&shared.mr).as_ref() {
            Some(m) => (m.lkey(), m.rkey()),
            None => return null_errno(libc::ENOENT),
        };
        let (addr, length) = *lock(&shared.range);
        // SAFETY: a live PD's public struct.
        let context = unsafe { (*p.pd.get()).context };
        let c = ibv_mr { context, pd, addr: addr as *mut _, length, handle: mr_handle, lkey, rkey };
        hold(&p.users);
        let b = MrBox {
            mr: std::cell::UnsafeCell::new(c),
            inner: shared,
            pd: AtomicPtr::new(std::ptr::from_ref(p).cast_mut()),
            dm: std::ptr::null(),
            ufile: p.ufile.clone(),
        };
        into_c(b, Kind::Mr).cast()
    })
}

/// Frees the wrapper only: the registration stays (for its other
/// wrappers), and the wrapper's PD is let go.
pub(crate) unsafe extern "C" fn ibv_unimport_mr(mr: *mut ibv_mr) {
    guard((), || {
        // SAFETY: registered as an MR ⇒ made by into_c::<MrBox>.
        let Some(b) = (unsafe { from_c(mr.cast::<MrBox>(), Kind::Mr) }) else { return };
        // SAFETY: an MR holds its PD (use count), so the PD is live.
        release(unsafe { &(*b.pd.load(std::sync::atomic::Ordering::Acquire)).users });
        if !b.dm.is_null() {
            // SAFETY: a region holds its device memory (use count).
            release(unsafe { &(*b.dm).users });
        }
    });
}

pub(crate) unsafe extern "C" fn ibv_import_dm(
    context: *mut ibv_context,
    dm_handle: u32,
) -> *mut ibv_dm {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        let Some(Shared::Dm(dm)) = c.ufile.get(dm_handle) else {
            return null_errno(libc::ENOENT);
        };
        crate::dm::wrap(context, dm, dm_handle, c.ufile.clone())
    })
}

/// Frees the wrapper only (retired, as a PD's, while regions name it).
pub(crate) unsafe extern "C" fn ibv_unimport_dm(dm: *mut ibv_dm) {
    guard((), || {
        if !crate::ffi::is_live(dm.cast::<DmBox>(), Kind::Dm) {
            return;
        }
        // SAFETY: a live device memory of ours (checked just above).
        if in_use(&unsafe { &*dm.cast::<DmBox>() }.users) {
            unregister(dm.cast::<DmBox>(), Kind::Dm);
            return;
        }
        // SAFETY: registered as Dm ⇒ made by into_c::<DmBox>.
        drop(unsafe { from_c(dm.cast::<DmBox>(), Kind::Dm) });
    });
}
