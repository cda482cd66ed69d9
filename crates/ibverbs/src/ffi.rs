//! The C boundary's helpers: no panic escapes ([`guard`]), `errno`, and a
//! registry of live objects that lets the control path reject pointers it
//! never handed out or already destroyed (double destroy, wrong object
//! type) with EINVAL instead of touching freed memory.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

/// Runs `f`; a panic becomes `on_panic` (with `errno = EIO`), never an
/// unwind into C.
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// NULL with `errno = e`: how constructors fail.
pub(crate) fn null_errno<T>(e: i32) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// -1 with `errno = e`: how `ibv_query_gid`-style calls fail.
pub(crate) fn minus_one(e: i32) -> i32 {
    set_errno(e);
    -1
}

/// Object kinds in the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Context,
    Pd,
    Mr,
    Mw,
    Dm,
    Td,
    Xrcd,
    Cq,
    Channel,
    Qp,
    Srq,
    Ah,
    CmChannel,
    CmId,
    CmEvent,
    Flow,
    Wq,
    RwqIndTable,
}

static LIVE: Mutex<Option<HashMap<usize, Kind>>> = Mutex::new(None);

fn live() -> std::sync::MutexGuard<'static, Option<HashMap<usize, Kind>>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records a new object.
pub(crate) fn register<T>(p: *const T, kind: Kind) {
    live().get_or_insert_with(HashMap::new).insert(p as usize, kind);
}

/// Whether `p` is a live object of `kind`.
pub(crate) fn is_live<T>(p: *const T, kind: Kind) -> bool {
    live().as_ref().and_then(|m| m.get(&(p as usize))) == Some(&kind)
}

/// The first `Some` that `f` gives for the address of a live object of
/// `kind`; `f` runs with the registry locked, so the object it looks at
/// cannot be destroyed meanwhile.
pub(crate) fn find_live<R>(kind: Kind, mut f: impl FnMut(usize) -> Option<R>) -> Option<R> {
    let g = live();
    g.as_ref()?.iter().filter(|(_, k)| **k == kind).find_map(|(p, _)| f(*p))
}

/// Forgets an object; false if it was not a live object of `kind`.
pub(crate) fn unregister<T>(p: *const T, kind: Kind) -> bool {
    let mut g = live();
    let Some(m) = g.as_mut() else { return false };
    if m.get(&(p as usize)) == Some(&kind) {
        m.remove(&(p as usize));
        true
    } else {
        false
    }
}

/// Copies `s` into a fixed C char array, NUL-terminated and truncated.
pub(crate) fn copy_cstr(dst: &mut [core::ffi::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as core::ffi::c_char;
    }
    if let Some(d) = dst.get_mut(n) {
        *d = 0;
    }
}
