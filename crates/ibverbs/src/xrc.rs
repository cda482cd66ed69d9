//! XRC domains in the C ABI (`ibv_open_xrcd`, `ibv_close_xrcd`) and
//! `ibv_get_srq_num`, over `uroce::Xrcd` (XRC SRQs are made in `srq`,
//! target QPs in `qp`). Opening the same file twice in
//! a process gives the same domain, as the kernel keys domains by inode;
//! processes sharing a device share it too (`uroce::Context::
//! open_shared_xrcd`).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::AtomicU32;
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::abi::*;
use crate::ffi::{Kind, guard, null_errno};
use crate::objects::{XrcdBox, from_c, in_use, into_c, live_ctx, live_srq, live_xrcd};

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
                    None => {
                        // SAFETY: `a.fd` is the caller's open descriptor
                        // (fstat said so above), borrowed for this call
                        // only: duplicated, and the copy closed after.
                        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(a.fd) };
                        let Ok(file) = fd.try_clone_to_owned().map(std::fs::File::from) else {
                            return null_errno(libc::EBADF);
                        };
                        let create = oflags & libc::O_CREAT != 0;
                        let exclusive = oflags & libc::O_EXCL != 0;
                        c.uroce().open_shared_xrcd(&file, create, exclusive).inspect(|x| {
                            map.insert(key, (x.clone(), 1));
                        })
                    }
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
        // Its objects here, or a target QP of its kept for another
        // process's handles, use it.
        if in_use(&b.users) || b.inner.kept_for_others() {
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
