//! UNSAFE ISLAND (one syscall): ask Linux's scheduler (EEVDF, 6.12 and
//! later) for short time slices for the progress thread. A thread with a
//! short requested slice gets an early virtual deadline when it wakes, so
//! it preempts a busy-polling application thread at once instead of
//! waiting out that thread's slice (milliseconds). That matters when an
//! application spins on memory without calling into uroce (perftest's
//! ib_write_lat) and only the progress thread can place the peer's WRITE.
//! Unprivileged; older kernels ignore the request.

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
