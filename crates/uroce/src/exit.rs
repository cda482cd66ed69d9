//! Running a hook when the process exits (`atexit`): the one `unsafe`
//! call it takes, kept here.

/// Registers `hook` to run at process exit (`exit`, or a return from
/// `main`; not `_exit` or a fatal signal). The hook must not panic: it
/// runs from C.
pub(crate) fn register(hook: extern "C" fn()) -> bool {
    // SAFETY: `atexit` stores a plain function pointer, valid for the
    // whole process (a `fn` item, never unloaded while the library is in
    // use); it takes no other argument.
    unsafe { libc::atexit(hook) == 0 }
}
