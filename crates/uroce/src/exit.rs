//! Running hooks when the process exits (`atexit`) and when it forks
//! (`pthread_atfork`): the `unsafe` calls they take, kept here.

/// Registers `hook` to run at process exit (`exit`, or a return from
/// `main`; not `_exit` or a fatal signal). The hook must not panic: it
/// runs from C.
pub(crate) fn register(hook: extern "C" fn()) -> bool {
    // SAFETY: `atexit` stores a plain function pointer, valid for the
    // whole process (a `fn` item, never unloaded while the library is in
    // use); it takes no other argument.
    unsafe { libc::atexit(hook) == 0 }
}

/// Registers fork handlers (`pthread_atfork`): `prepare` runs in the
/// forking thread before the fork, `parent` in it after, `child` in the
/// child's only thread (where a lock another thread held at the fork
/// stays locked for ever: it touches atomics, and locks `prepare` left
/// unlocked). None may panic: they run from C.
pub(crate) fn on_fork(
    prepare: extern "C" fn(),
    parent: extern "C" fn(),
    child: extern "C" fn(),
) -> bool {
    // SAFETY: plain function pointers, valid for the whole process (`fn`
    // items of this library, which is never unloaded while in use).
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) == 0 }
}

/// Forks this process descends from since the library loaded: bumped in
/// each child (by the context's fork handler). A context opened in an
/// earlier generation belongs to the parent: its progress thread, its
/// locks' holders and its peers are the parent's, so the child neither
/// uses nor closes it, and opens the device afresh (as a child process
/// opening a kernel device gets its own context).
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The current process generation (see [`GENERATION`]).
pub(crate) fn generation() -> u64 {
    GENERATION.load(std::sync::atomic::Ordering::Acquire)
}

/// Starts a new generation: in a forked child, first thing.
pub(crate) fn new_generation() {
    GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}
