//! UNSAFE ISLAND (a few syscalls): the progress thread's scheduling.
//!
//! It asks Linux's scheduler (EEVDF, 6.12 and later) for short time
//! slices: a thread with a short requested slice gets an early virtual
//! deadline when it wakes, so it preempts a busy-polling application
//! thread at once instead of waiting out that thread's slice
//! (milliseconds). That matters when an application spins on memory
//! without calling into uroce (perftest's ib_write_lat) and only the
//! progress thread can place the peer's WRITE. Unprivileged; older
//! kernels ignore the request. And it moves to another CPU when it keeps
//! sharing one with a busy thread (see [`move_to_another_cpu`]).

/// `struct sched_attr`, the fields of its first version (48 bytes).
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// Requests slices of `slice_ns` for the calling thread, keeping its
/// policy (SCHED_OTHER) and nice value. Returns whether the kernel
/// accepted.
pub(crate) fn request_short_slice(slice_ns: u64) -> bool {
    // SAFETY: gettid and getpriority take no pointers.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::id_t;
    // SAFETY: as above (errno is not consulted: -1 is a valid nice value,
    // and a failure just leaves nice 0 requested, which the kernel
    // refuses without privilege rather than applying wrongly).
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
    let attr = SchedAttr {
        size: size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice,
        priority: 0,
        runtime: slice_ns,
        deadline: 0,
        period: 0,
    };
    // SAFETY: sched_setattr(tid, &attr, 0) reads `attr.size` bytes of a
    // live, correctly laid out struct.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) == 0 }
}

/// Moves the calling thread to another CPU of its affinity mask, leaving
/// the mask as it was: the mask without the current CPU, which the kernel
/// honours at once by migrating the thread, then the mask again, which
/// lets the thread stay where it now is. Only when no more tasks are
/// runnable than the mask has CPUs: this thread shares its CPU, so
/// another is idle (with more, every CPU is busy and a move would only
/// crowd another). Returns whether it moved.
///
/// Why: the scheduler puts a thread woken by a local sender on the
/// sender's CPU, and its balancer leaves a thread that ran within the
/// last half millisecond where it is; a progress thread taking turns with
/// a busy-polling application on one CPU stays there while the other CPU
/// idles (see the README's "Stalls of the progress thread"), and so do
/// two applications' polling threads (an application thread moves itself
/// from within its poll, never another thread).
pub(crate) fn move_to_another_cpu() -> bool {
    // SAFETY: sched_getcpu takes no arguments.
    let Ok(here) = usize::try_from(unsafe { libc::sched_getcpu() }) else { return false };
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity(0, size, &mask) writes at most `size`
    // bytes into a live cpu_set_t of that size.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut mask) } != 0 {
        return false;
    }
    let mut others = mask;
    // SAFETY: the CPU_* helpers index within the set (they check the CPU
    // number against its size).
    let (allowed, movable) = unsafe {
        libc::CPU_CLR(here, &mut others);
        (
            libc::CPU_COUNT(&mask) as u32,
            libc::CPU_ISSET(here, &mask) && libc::CPU_COUNT(&others) > 0,
        )
    };
    if !movable || runnable_tasks().is_none_or(|n| n > allowed) {
        return false;
    }
    // SAFETY: sched_setaffinity(0, size, &set) reads a live cpu_set_t.
    let moved =
        unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const others) } == 0;
    // SAFETY: as above; the original mask back whether or not it moved.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const mask) };
    moved
}

/// The CPU the calling thread runs on (for the timeline, and in a local
/// path doorbell).
pub(crate) fn current_cpu() -> u64 {
    // SAFETY: sched_getcpu takes no arguments.
    unsafe { libc::sched_getcpu() }.max(0) as u64
}

/// The number of runnable tasks on the system (the fourth field of
/// `/proc/loadavg`, "running/total"), the caller included.
fn runnable_tasks() -> Option<u32> {
    use std::os::unix::fs::FileExt;
    thread_local! {
        static LOADAVG: Option<std::fs::File> = std::fs::File::open("/proc/loadavg").ok();
    }
    let mut buf = [0u8; 128];
    let n = LOADAVG.with(|f| f.as_ref()?.read_at(&mut buf, 0).ok())?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
}
