//! UNSAFE ISLAND (small): the C shim's functions (`shim.c`) behind safe
//! types: the EAL, started once per process; a started port, owned; the
//! frames a burst received, each freed once.

use std::ffi::{CString, c_char, c_int};
use std::io;
use std::sync::Mutex;

/// The shim's port (`struct uroce_dpdk_port`), opaque here.
#[repr(C)]
struct RawPort {
    _private: [u8; 0],
}

/// DPDK's `struct rte_mbuf`, opaque here.
#[repr(C)]
pub(super) struct Mbuf {
    _private: [u8; 0],
}

unsafe extern "C" {
    fn uroce_dpdk_eal_init(argc: c_int, argv: *mut *mut c_char) -> c_int;
    fn uroce_dpdk_port_count() -> u16;
    fn uroce_dpdk_port_by_name(name: *const c_char) -> c_int;
    fn uroce_dpdk_driver(id: u16) -> *const c_char;
    fn uroce_dpdk_close_id(id: u16);
    fn uroce_dpdk_port_start(
        id: u16,
        mbufs: u32,
        mac: *mut u8,
        mtu: *mut u16,
        err: *mut c_int,
    ) -> *mut RawPort;
    fn uroce_dpdk_flush(p: *mut RawPort) -> u32;
    fn uroce_dpdk_port_stop(p: *mut RawPort, close: c_int);
    fn uroce_dpdk_tx(p: *mut RawPort, frame: *const u8, len: u32) -> c_int;
    fn uroce_dpdk_rx(p: *mut RawPort, bufs: *mut *mut Mbuf, n: u16) -> u16;
    fn uroce_dpdk_frame_len(m: *const Mbuf) -> u32;
    fn uroce_dpdk_segment(m: *const Mbuf, i: u32, data: *mut *const u8) -> u32;
    fn uroce_dpdk_free(m: *mut Mbuf);
    fn uroce_dpdk_link_up(p: *const RawPort) -> c_int;
    fn uroce_dpdk_stats(p: *const RawPort, out: *mut u64);
    fn uroce_dpdk_cleanup();
    fn uroce_dpdk_runtime_dir() -> *const c_char;
}

/// The EAL's state in this process: started (with the ports in use), or
/// why it could not be.
static EAL: Mutex<Option<Result<Vec<u16>, String>>> = Mutex::new(None);

/// Starts the EAL with `args` (after a program name) the first time; later
/// calls return the first one's outcome (DPDK starts once per process).
/// Whether this call started it.
pub(super) fn start_eal(args: &[String]) -> io::Result<bool> {
    let mut eal = EAL.lock().unwrap_or_else(|e| e.into_inner());
    let fresh = eal.is_none();
    if fresh {
        let owned: Vec<CString> = std::iter::once("uroce".to_string())
            .chain(args.iter().cloned())
            .map(|a| CString::new(a).unwrap_or_default())
            .collect();
        // rte_eal_init may reorder argv: give it pointers it can keep
        // (leaked: the EAL lives as long as the process).
        let mut argv: Vec<*mut c_char> = owned.into_iter().map(CString::into_raw).collect();
        let argc = argv.len() as c_int;
        let argv_ptr = argv.as_mut_ptr();
        std::mem::forget(argv);
        // SAFETY: argc counts argv's live, NUL-terminated strings; the
        // array and strings are never freed.
        let r = unsafe { uroce_dpdk_eal_init(argc, argv_ptr) };
        *eal = Some(if r == 0 {
            // SAFETY: registers a function that lives for the program.
            unsafe { libc::atexit(eal_at_exit) };
            Ok(Vec::new())
        } else {
            Err(format!("rte_eal_init: {}", io::Error::from_raw_os_error(-r)))
        });
    }
    match eal.as_ref() {
        Some(Err(e)) => Err(io::Error::other(e.clone())),
        _ => Ok(fresh),
    }
}

/// The EAL's run-time directory (once started).
pub(super) fn runtime_dir() -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: no arguments; the EAL returns a pointer to its own
    // NUL-terminated string (or NULL), which lives as long as it.
    let p = unsafe { uroce_dpdk_runtime_dir() };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated, not freed while the EAL lives.
    let s = unsafe { std::ffi::CStr::from_ptr(p) };
    let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(s.to_bytes()));
    (!path.as_os_str().is_empty()).then_some(path)
}

/// The port `name` names: a number, or a device name as the EAL knows it
/// (`net_af_packet0`). `None` if there is no such port.
pub(super) fn port_id(name: &str) -> Option<u16> {
    if let Ok(n) = name.parse::<u16>() {
        // SAFETY: no arguments; the EAL is started.
        return (n < unsafe { uroce_dpdk_port_count() }).then_some(n);
    }
    let c = CString::new(name).ok()?;
    // SAFETY: a live NUL-terminated string.
    let r = unsafe { uroce_dpdk_port_by_name(c.as_ptr()) };
    u16::try_from(r).ok()
}

/// The name of port `id`'s driver (`net_af_packet`, …).
pub(super) fn driver_of(id: u16) -> String {
    // SAFETY: any port number may be asked; the answer is a static string
    // of the driver's (or of the shim's), never NULL.
    let p = unsafe { uroce_dpdk_driver(id) };
    // SAFETY: non-null and NUL-terminated, as above.
    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Closes port `id` unless a backend of this process uses it: a context
/// refused the device lets go of what the port's driver opened at the
/// EAL's start (an af_packet socket would go on taking a share of the
/// interface's frames in its fanout group; a tap queue, the frames the
/// kernel gives it). The port is gone for this process after.
pub(super) fn close_unused(id: u16) {
    let eal = EAL.lock().unwrap_or_else(|e| e.into_inner());
    if matches!(eal.as_ref(), Some(Ok(used)) if !used.contains(&id)) {
        // SAFETY: the EAL is started; a port no backend uses is not in any
        // thread's hands (the lock keeps a start out meanwhile).
        unsafe { uroce_dpdk_close_id(id) };
    }
}

/// A started port, used by one backend (one thread at a time).
#[derive(Debug)]
pub(super) struct Port {
    raw: *mut RawPort,
    id: u16,
}

// SAFETY: the port is used through `&mut self` only (one thread at a
// time), and DPDK's queue calls may come from any thread that does so.
unsafe impl Send for Port {}

impl Port {
    /// Starts port `id` at MTU `mtu` (0: the port's own) with a pool of
    /// `mbufs` buffers: its MAC and MTU. A port one backend of this
    /// process uses is refused (`EBUSY`).
    pub(super) fn start(id: u16, mtu: u16, mbufs: u32) -> io::Result<(Self, [u8; 6], u16)> {
        let mut eal = EAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Ok(used)) = eal.as_mut() else {
            return Err(io::Error::other("the EAL is not started"));
        };
        if used.contains(&id) {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        let (mut mac, mut mtu, mut err) = ([0u8; 6], mtu, 0 as c_int);
        // SAFETY: the out-pointers are live for the call; mac has 6 bytes.
        let raw = unsafe { uroce_dpdk_port_start(id, mbufs, mac.as_mut_ptr(), &mut mtu, &mut err) };
        if raw.is_null() {
            return Err(io::Error::from_raw_os_error(-err));
        }
        used.push(id);
        Ok((Self { raw, id }, mac, mtu))
    }

    /// Queues a copy of `frame` (sent when the burst fills or at
    /// [`Port::flush`]): the frames a full burst could not send, or
    /// `Err` when no buffer was free (the frame is dropped).
    pub(super) fn send(&mut self, frame: &[u8]) -> Result<u32, ()> {
        // SAFETY: a live port; `frame` is read for its length only.
        let r = unsafe { uroce_dpdk_tx(self.raw, frame.as_ptr(), frame.len() as u32) };
        u32::try_from(r).map_err(|_| ())
    }

    /// Sends what is queued: how many frames the port would not take
    /// (dropped).
    pub(super) fn flush(&mut self) -> u32 {
        // SAFETY: a live port.
        unsafe { uroce_dpdk_flush(self.raw) }
    }

    /// Receives up to `bufs.len()` frames into `bufs`: how many.
    pub(super) fn receive(&mut self, bufs: &mut RxBurst) -> usize {
        bufs.free_all();
        let n = bufs.frames.len() as u16;
        // SAFETY: a live port; `frames` holds room for `n` pointers.
        let got = unsafe { uroce_dpdk_rx(self.raw, bufs.frames.as_mut_ptr(), n) };
        bufs.len = usize::from(got);
        bufs.next = 0;
        bufs.len
    }

    /// Whether the link is up.
    pub(super) fn link_up(&self) -> bool {
        // SAFETY: a live port.
        unsafe { uroce_dpdk_link_up(self.raw) == 1 }
    }

    /// The port's counters: received, sent, missed, receive errors,
    /// transmit errors, no buffer to receive into.
    pub(super) fn stats(&self) -> [u64; 6] {
        let mut out = [0u64; 6];
        // SAFETY: a live port; `out` has room for six counters.
        unsafe { uroce_dpdk_stats(self.raw, out.as_mut_ptr()) };
        out
    }
}

impl Port {
    /// Stops the port and closes its device (an AF_XDP port detaches its
    /// XDP program): the process is ending, nothing starts it again.
    pub(super) fn close(self) {
        let this = std::mem::ManuallyDrop::new(self);
        this.stop(true);
    }

    fn stop(&self, close: bool) {
        // SAFETY: a live port, not used after this (drop or close).
        unsafe { uroce_dpdk_port_stop(self.raw, c_int::from(close)) };
        let mut eal = EAL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Ok(used)) = eal.as_mut() {
            used.retain(|&p| p != self.id);
        }
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        self.stop(false);
    }
}

/// At process exit (registered with `atexit` when the EAL starts): if no
/// backend still uses a port, closes them all and releases the EAL (its
/// run-time directory). A port still in use is left alone: its progress
/// thread may be in it.
extern "C" fn eal_at_exit() {
    let mut eal = EAL.lock().unwrap_or_else(|e| e.into_inner());
    if matches!(eal.as_ref(), Some(Ok(used)) if used.is_empty()) {
        // SAFETY: the EAL was started and no port is in use.
        unsafe { uroce_dpdk_cleanup() };
        *eal = Some(Err("the EAL was released at exit".to_string()));
        let own = super::eal::REMOVE_AT_EXIT.lock().ok().and_then(|mut d| d.take());
        if let Some(dir) = own {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The frames of one receive burst, handed out one by one and freed.
#[derive(Debug)]
pub(super) struct RxBurst {
    frames: [*mut Mbuf; 32],
    len: usize,
    next: usize,
}

// SAFETY: the mbufs are owned by this burst alone until freed.
unsafe impl Send for RxBurst {}

impl RxBurst {
    pub(super) fn new() -> Self {
        Self { frames: [std::ptr::null_mut(); 32], len: 0, next: 0 }
    }

    /// Calls `f` with the next frame's bytes (joined into `joined` when
    /// the frame spans several mbufs), then frees it; `None` when the
    /// burst is used up.
    pub(super) fn next<R>(
        &mut self,
        joined: &mut Vec<u8>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        if self.next >= self.len {
            return None;
        }
        let m = self.frames[self.next];
        self.next += 1;
        let mut data: *const u8 = std::ptr::null();
        // SAFETY: a received mbuf, not yet freed; `data` is written.
        let first = unsafe { uroce_dpdk_segment(m, 0, &mut data) } as usize;
        // SAFETY: as above.
        let total = unsafe { uroce_dpdk_frame_len(m) } as usize;
        let r = if first == total {
            // SAFETY: the segment's `first` bytes at `data`, live until
            // the mbuf is freed below.
            f(unsafe { std::slice::from_raw_parts(data, first) })
        } else {
            joined.clear();
            let mut i = 0;
            loop {
                // SAFETY: as above, segment `i` of the same mbuf.
                let n = unsafe { uroce_dpdk_segment(m, i, &mut data) } as usize;
                if n == 0 {
                    break;
                }
                // SAFETY: segment `i`'s `n` bytes at `data`.
                joined.extend_from_slice(unsafe { std::slice::from_raw_parts(data, n) });
                i += 1;
            }
            f(joined)
        };
        // SAFETY: freed once; the slice given to `f` is not used after.
        unsafe { uroce_dpdk_free(m) };
        Some(r)
    }

    /// Frees the frames not handed out.
    fn free_all(&mut self) {
        for &m in &self.frames[self.next..self.len] {
            // SAFETY: received, not handed out, freed once.
            unsafe { uroce_dpdk_free(m) };
        }
        self.len = 0;
        self.next = 0;
    }
}

impl Drop for RxBurst {
    fn drop(&mut self) {
        self.free_all();
    }
}
