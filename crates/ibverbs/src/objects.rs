//! What the pointers handed to C point at: each object is one allocation
//! that starts with rdma-core's public struct (which the application reads
//! and whose function pointers the header's inline verbs call) followed by
//! uroce's handle and our bookkeeping. `from_*` turns the C pointer back
//! into the Rust object; their single contract is the verbs contract: the
//! pointer is one this library returned and the application has not
//! destroyed it.
//!
//! The public structs sit in `UnsafeCell`s (same layout): the application
//! may write them (`qp_ex->wr_id`, `cq->cq_context`, ...) while we hold
//! shared references to the box, so Rust code reaches them only through
//! raw pointers.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

use crate::abi::*;
use crate::ffi::{Kind, is_live};

/// Zeroed pointer slots allocated before each `verbs_context`, so that a
/// binary built against newer headers (with more ops at lower addresses)
/// reads NULL, i.e. "unsupported", for ops it knows and we do not.
pub(crate) const FUTURE_SLOTS: usize = 32;

/// A device opened once per process, shared by every `ibv_context` on it:
/// one engine, one UDP socket, one QPN space (as a real device).
pub(crate) struct DevShared {
    pub(crate) ctx: uroce::Context,
    /// Its objects that async events name, and where those events go.
    pub(crate) objects: Arc<Objects>,
}

/// A device's C objects that async events name (QPN → QP, CQ handle → CQ,
/// SRQ handle → SRQ) and its contexts' event queues. It routes the
/// engine's events as the kernel does: an object's to the queue of the
/// `ibv_context` that created it, a port's to every context. The engine
/// routes with its driver held, so no code holds these locks while it
/// calls into the uroce context.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    pub(crate) qps: Mutex<HashMap<u32, usize>>,
    pub(crate) cqs: Mutex<HashMap<u32, usize>>,
    pub(crate) srqs: Mutex<HashMap<u32, usize>>,
    /// Each open context's queue.
    pub(crate) contexts: Mutex<Vec<Weak<uroce::AsyncEventQueue>>>,
}

impl Objects {
    /// The queue of the context that created the object `key` of `map`.
    fn queue_of<B>(
        map: &Mutex<HashMap<u32, usize>>,
        key: u32,
        queue: impl Fn(&B) -> &Arc<uroce::AsyncEventQueue>,
    ) -> Option<Arc<uroce::AsyncEventQueue>> {
        let map = lock(map);
        let p = *map.get(&key)?;
        // SAFETY: in the map ⇒ a live box of this kind (its destroy
        // removes it under this lock before freeing it).
        Some(queue(unsafe { &*(p as *const B) }).clone())
    }
}

impl uroce::AsyncEventRouter for Objects {
    fn route(&self, event: &uroce::AsyncEvent) -> bool {
        use uroce::AsyncEvent as E;
        let qp = |qpn| Self::queue_of::<QpBox>(&self.qps, qpn, |b| &b.async_queue);
        let queue = match *event {
            E::QpFatal { qpn }
            | E::QpRequestError { qpn }
            | E::QpAccessError { qpn }
            | E::SqDrained { qpn }
            | E::QpLastWqeReached { qpn } => qp(qpn),
            E::CqError { cq } => Self::queue_of::<CqBox>(&self.cqs, cq, |b| &b.async_queue),
            E::SrqLimitReached { srq } => {
                Self::queue_of::<SrqBox>(&self.srqs, srq, |b| &b.async_queue)
            }
            E::PortActive | E::PortError => {
                let mut contexts = lock(&self.contexts);
                contexts.retain(|q| q.strong_count() > 0);
                contexts.iter().filter_map(Weak::upgrade).for_each(|q| q.push(*event));
                return !contexts.is_empty();
            }
        };
        // Not a C object's (the Rust API's, on the same engine): the
        // engine keeps it.
        queue.map(|q| q.push(*event)).is_some()
    }
}

/// An `ibv_context`.
#[repr(C)]
pub(crate) struct CtxBox {
    pub(crate) future: [*mut c_void; FUTURE_SLOTS],
    pub(crate) vctx: UnsafeCell<verbs_context>,
    pub(crate) dev: Arc<DevShared>,
    pub(crate) dev_index: usize,
    /// `ibv_context.cmd_fd`, closed with the context.
    pub(crate) cmd_fd: Option<std::os::fd::OwnedFd>,
    /// Its async events (`ibv_context.async_fd`), as the kernel keeps them
    /// per context: its objects' and the port's.
    pub(crate) async_queue: Arc<uroce::AsyncEventQueue>,
    /// Its objects by handle, shared with the contexts imported from its
    /// command file (`ibv_import_device`).
    pub(crate) ufile: Arc<Ufile>,
}

/// The objects of one command file by handle, what `ibv_import_pd`,
/// `_mr` and `_dm` find: the kernel keeps them per open uverbs file, and
/// contexts imported from a file (`ibv_import_device` of a `dup` of its
/// `cmd_fd`) share them. Handles are unique in the process (never 0, the
/// handle of what cannot be imported, such as a parent domain), so a
/// handle of another file finds nothing rather than something else.
#[derive(Default)]
pub(crate) struct Ufile {
    objects: Mutex<HashMap<u32, Shared>>,
}

/// What an importer's new wrapper of an object shares with the others.
#[derive(Clone)]
pub(crate) enum Shared {
    Pd(uroce::Pd),
    Mr(Arc<SharedMr>),
    Dm(uroce::Dm),
}

/// A memory region's registration, shared by its wrappers (the original
/// and its imports): any of them deregisters it for all, as the kernel's
/// one object is destroyed by any handle's `ibv_dereg_mr`.
pub(crate) struct SharedMr {
    /// `None` once deregistered.
    pub(crate) mr: Mutex<Option<uroce::Mr>>,
    /// The `ibv_mr.addr` and `length` an import reports.
    pub(crate) range: Mutex<(usize, usize)>,
}

impl Ufile {
    /// Records `object` under a new handle.
    pub(crate) fn add(&self, object: Shared) -> u32 {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let handle = NEXT.fetch_add(1, Ordering::Relaxed).max(1);
        lock(&self.objects).insert(handle, object);
        handle
    }

    /// The object of `handle` (destroyed objects are not found).
    pub(crate) fn get(&self, handle: u32) -> Option<Shared> {
        lock(&self.objects).get(&handle).cloned()
    }

    /// Forgets the object of `handle` (destroyed).
    pub(crate) fn remove(&self, handle: u32) {
        lock(&self.objects).remove(&handle);
    }
}

impl CtxBox {
    /// The `ibv_context` inside.
    pub(crate) fn ibv(&self) -> *mut ibv_context {
        // SAFETY: a place computation inside our own allocation; no read.
        unsafe { &raw mut (*self.vctx.get()).context }
    }
    pub(crate) fn uroce(&self) -> &uroce::Context {
        &self.dev.ctx
    }
}

/// The context behind an `ibv_context` pointer.
///
/// # Safety
/// `p` is NULL or a context this library returned and has not closed.
pub(crate) unsafe fn ctx<'a>(p: *mut ibv_context) -> Option<&'a CtxBox> {
    if p.is_null() {
        return None;
    }
    let off = core::mem::offset_of!(CtxBox, vctx) + core::mem::offset_of!(verbs_context, context);
    // SAFETY: per the contract `p` points `off` bytes into a live CtxBox.
    Some(unsafe { &*p.cast::<u8>().sub(off).cast::<CtxBox>() })
}

/// An `ibv_pd`.
#[repr(C)]
pub(crate) struct PdBox {
    pub(crate) pd: UnsafeCell<ibv_pd>,
    pub(crate) inner: uroce::Pd,
    /// MRs, QPs, SRQs and AHs on this PD: deallocating it before them is
    /// EBUSY, as the kernel answers.
    pub(crate) users: AtomicU32,
    /// A parent domain (`ibv_alloc_parent_domain`): the PD it stands for
    /// (whose protection domain it shares) and its thread domain, each
    /// held while it lives; null for a plain PD.
    pub(crate) parent_of: *const Self,
    pub(crate) td: *const TdBox,
    /// Its command file's objects (its handle is there, unless it is a
    /// parent domain).
    pub(crate) ufile: Arc<Ufile>,
}

/// An `ibv_td`.
#[repr(C)]
pub(crate) struct TdBox {
    pub(crate) td: UnsafeCell<ibv_td>,
    /// Parent domains on it.
    pub(crate) users: AtomicU32,
}

/// Locks `m`, recovering from a panic elsewhere (no panic crosses into C,
/// and each holder leaves the value consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An `ibv_mr`.
#[repr(C)]
pub(crate) struct MrBox {
    pub(crate) mr: UnsafeCell<ibv_mr>,
    /// The registration, shared with the region's imports; locked only to
    /// change it (`ibv_rereg_mr`), end it or read it.
    pub(crate) inner: Arc<SharedMr>,
    /// Its command file's objects.
    pub(crate) ufile: Arc<Ufile>,
    /// Its PD (changed by `ibv_rereg_mr`).
    pub(crate) pd: AtomicPtr<PdBox>,
    /// The device memory it is registered on (`ibv_reg_dm_mr`), else null.
    pub(crate) dm: *const DmBox,
}

/// An `ibv_dm`.
#[repr(C)]
pub(crate) struct DmBox {
    pub(crate) dm: UnsafeCell<ibv_dm>,
    pub(crate) inner: uroce::Dm,
    /// Memory regions on it.
    pub(crate) users: AtomicU32,
    /// Its command file's objects.
    pub(crate) ufile: Arc<Ufile>,
}

/// An `ibv_mw`.
#[repr(C)]
pub(crate) struct MwBox {
    pub(crate) mw: UnsafeCell<ibv_mw>,
    pub(crate) inner: uroce::Mw,
    pub(crate) pd: *const PdBox,
}

/// An `ibv_comp_channel`.
#[repr(C)]
pub(crate) struct ChannelBox {
    pub(crate) ch: UnsafeCell<ibv_comp_channel>,
    pub(crate) inner: uroce::CompChannel,
    /// CQ handle → CQ, to turn an event back into the `ibv_cq`.
    pub(crate) cqs: Mutex<HashMap<u32, usize>>,
    pub(crate) users: AtomicU32,
}

/// Events handed out for an object and acknowledged: its destroy call
/// waits until every event handed out was acknowledged, as rdma-core's do
/// (completion events of a CQ; async events of a QP, CQ or SRQ).
#[derive(Default)]
pub(crate) struct EventLedger {
    pub(crate) counts: Mutex<(u64, u64)>,
    pub(crate) acked: Condvar,
}

impl EventLedger {
    /// One more event handed out.
    pub(crate) fn handed_out(&self) {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
    }

    /// `n` more acknowledged.
    pub(crate) fn acknowledged(&self, n: u64) {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).1 += n;
        self.acked.notify_all();
    }

    /// Waits until every event handed out was acknowledged.
    pub(crate) fn wait_all_acknowledged(&self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        while counts.1 < counts.0 {
            counts = self.acked.wait(counts).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// An `ibv_cq` (always an `ibv_cq_ex`, so `ibv_cq_ex_to_cq` casts work).
#[repr(C)]
pub(crate) struct CqBox {
    pub(crate) cq: UnsafeCell<ibv_cq_ex>,
    pub(crate) inner: uroce::Cq,
    /// The device (not the context: closing a context with live objects
    /// must leave them destroyable).
    pub(crate) dev: Arc<DevShared>,
    pub(crate) channel: *const ChannelBox,
    pub(crate) users: AtomicU32,
    pub(crate) events: EventLedger,
    /// Its async events (`IBV_EVENT_CQ_ERR`).
    pub(crate) async_events: EventLedger,
    /// Where they go: the creating context's queue.
    pub(crate) async_queue: Arc<uroce::AsyncEventQueue>,
    /// The completion an extended CQ's `start_poll`/`next_poll` stopped at.
    pub(crate) cursor: Mutex<uroce::Completion>,
    /// Held from a successful `start_poll` to `end_poll`.
    pub(crate) polling: AtomicBool,
}

/// An `ibv_srq`.
#[repr(C)]
pub(crate) struct SrqBox {
    pub(crate) srq: UnsafeCell<ibv_srq>,
    pub(crate) inner: uroce::Srq,
    pub(crate) dev: Arc<DevShared>,
    /// SGEs per receive WR (checked before a WR's list is read).
    pub(crate) max_sge: u32,
    pub(crate) pd: *const PdBox,
    pub(crate) users: AtomicU32,
    /// An XRC SRQ's domain and CQ (held while it lives), else null.
    pub(crate) xrcd: *const XrcdBox,
    pub(crate) cq: *const CqBox,
    /// Its async events (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    pub(crate) async_events: EventLedger,
    /// Where they go: the creating context's queue.
    pub(crate) async_queue: Arc<uroce::AsyncEventQueue>,
}

/// An `ibv_xrcd`.
#[repr(C)]
pub(crate) struct XrcdBox {
    pub(crate) xrcd: UnsafeCell<ibv_xrcd>,
    pub(crate) inner: uroce::Xrcd,
    /// The (device, file) key it was opened by (shared with other opens
    /// of the file), if any.
    pub(crate) file: Option<(usize, u64, u64)>,
    /// XRC SRQs and target QPs in it.
    pub(crate) users: AtomicU32,
}

/// An `ibv_ah`.
#[repr(C)]
pub(crate) struct AhBox {
    pub(crate) ah: UnsafeCell<ibv_ah>,
    pub(crate) inner: uroce::Ah,
    pub(crate) pd: *const PdBox,
}

/// An `ibv_qp` (always an `ibv_qp_ex`).
#[repr(C)]
pub(crate) struct QpBox {
    pub(crate) qpx: UnsafeCell<ibv_qp_ex>,
    pub(crate) inner: uroce::Qp,
    pub(crate) dev: Arc<DevShared>,
    pub(crate) pd: *const PdBox,
    pub(crate) send_cq: *const CqBox,
    pub(crate) recv_cq: *const CqBox,
    pub(crate) srq: *const SrqBox,
    /// An XRC target's domain, else null.
    pub(crate) xrcd: *const XrcdBox,
    /// An RSS QP's indirection table, else null.
    pub(crate) ind_table: *const RwqBox,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: `ibv_qp_to_qp_ex`
    /// answers for it.
    pub(crate) ex: bool,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) sq_sig_all: bool,
    pub(crate) builder: Mutex<crate::wr_batch::Builder>,
    /// Held from `ibv_wr_start` to `ibv_wr_complete` / `ibv_wr_abort`.
    pub(crate) posting: AtomicBool,
    /// Its async events.
    pub(crate) async_events: EventLedger,
    /// Where they go: the creating context's queue.
    pub(crate) async_queue: Arc<uroce::AsyncEventQueue>,
}

/// Turns a C object pointer back into its box (the public struct is the
/// box's first field).
///
/// # Safety
/// `p` is NULL or an object of type `B` this library returned and the
/// application has not destroyed.
pub(crate) unsafe fn obj<'a, C, B>(p: *mut C) -> Option<&'a B> {
    // SAFETY: per the contract, `p` is the start of a live `B`.
    unsafe { p.cast::<B>().as_ref() }
}

/// Gives ownership of `b` to C: registers it and returns its address.
pub(crate) fn into_c<B>(b: B, kind: crate::ffi::Kind) -> *mut B {
    let p = Box::into_raw(Box::new(b));
    crate::ffi::register(p, kind);
    p
}

/// Takes ownership back from C for destruction, if `p` is a live object
/// of `kind`.
///
/// # Safety
/// If `p` is registered as `kind` it was made by [`into_c`] with type `B`.
pub(crate) unsafe fn from_c<B>(p: *mut B, kind: crate::ffi::Kind) -> Option<Box<B>> {
    if p.is_null() || !crate::ffi::unregister(p, kind) {
        return None;
    }
    // SAFETY: registered as `kind` ⇒ made by `into_c::<B>` and not yet freed.
    Some(unsafe { Box::from_raw(p) })
}

/// Increments a use count (an object now depends on its parent).
pub(crate) fn hold(users: &AtomicU32) {
    users.fetch_add(1, Ordering::AcqRel);
}

/// Decrements a use count.
pub(crate) fn release(users: &AtomicU32) {
    users.fetch_sub(1, Ordering::AcqRel);
}

/// Enters a critical section that spans several C calls (`ibv_wr_start`
/// … `ibv_wr_complete`, `ibv_start_poll` … `ibv_end_poll`): a flag, since
/// no guard can be held across calls.
pub(crate) fn enter(busy: &AtomicBool) {
    while busy.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        std::thread::yield_now();
    }
}

/// Leaves a section entered with [`enter`].
pub(crate) fn leave(busy: &AtomicBool) {
    busy.store(false, Ordering::Release);
}

/// Whether anything still depends on an object.
pub(crate) fn in_use(users: &AtomicU32) -> bool {
    users.load(Ordering::Acquire) != 0
}

// Live handle lookups: a C pointer is turned into its box only once the
// registry (`crate::ffi::is_live`) confirms it names a live object of
// that kind. Every verb module finds its arguments here, so the modules
// need not import each other.

/// The box of an XRC domain pointer, if it is a live one.
pub(crate) fn live_xrcd<'a>(xrcd: *mut ibv_xrcd) -> Option<&'a XrcdBox> {
    // SAFETY: dereferenced only once the registry says it is live.
    is_live(xrcd.cast::<XrcdBox>(), Kind::Xrcd)
        .then(|| unsafe { obj::<_, XrcdBox>(xrcd) })
        .flatten()
}

/// The box of a context pointer, if it is a live context.
pub(crate) fn live_ctx<'a>(context: *mut ibv_context) -> Option<&'a CtxBox> {
    // SAFETY: only dereferenced after the registry confirms it is live.
    let b = unsafe { ctx(context) }?;
    is_live(std::ptr::from_ref(b), Kind::Context).then_some(b)
}

pub(crate) fn live_cq<'a>(cq: *mut ibv_cq) -> Option<&'a CqBox> {
    // SAFETY: dereferenced only once the registry says it is a live CQ.
    is_live(cq.cast::<CqBox>(), Kind::Cq).then(|| unsafe { obj::<_, CqBox>(cq) }).flatten()
}

/// The box of a PD pointer, if it is a live PD.
pub(crate) fn live_pd<'a>(pd: *mut ibv_pd) -> Option<&'a PdBox> {
    // SAFETY: dereferenced only once the registry says it is a live PD.
    is_live(pd.cast::<PdBox>(), Kind::Pd).then(|| unsafe { obj::<_, PdBox>(pd) }).flatten()
}

/// A live PD and the live context it was allocated on.
pub(crate) fn live_pd_ctx<'a>(pd: *mut ibv_pd) -> Option<(&'a PdBox, &'a CtxBox)> {
    let p = live_pd(pd)?;
    // SAFETY: a live PD's public struct is readable.
    let c = live_ctx(unsafe { (*p.pd.get()).context })?;
    Some((p, c))
}

pub(crate) fn live_srq<'a>(srq: *mut ibv_srq) -> Option<&'a SrqBox> {
    // SAFETY: dereferenced only once the registry says it is a live SRQ.
    is_live(srq.cast::<SrqBox>(), Kind::Srq).then(|| unsafe { obj::<_, SrqBox>(srq) }).flatten()
}

/// `struct ibv_wq` (152 bytes; rdma-core's inline `ibv_create_wq`
/// initialises the mutex and condition variable).
#[repr(C)]
pub(crate) struct IbvWq {
    pub(crate) context: *mut ibv_context,
    pub(crate) wq_context: *mut c_void,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) cq: *mut ibv_cq,
    pub(crate) wq_num: u32,
    pub(crate) handle: u32,
    pub(crate) state: c_int,
    pub(crate) wq_type: c_int,
    pub(crate) post_recv:
        Option<unsafe extern "C" fn(*mut Self, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub(crate) mutex: [u64; 5],
    pub(crate) cond: [u64; 6],
    pub(crate) events_completed: u32,
    pub(crate) comp_mask: u32,
}

const _: () = {
    assert!(size_of::<IbvWq>() == 152);
    assert!(std::mem::offset_of!(IbvWq, post_recv) == 48);
    assert!(std::mem::offset_of!(IbvWq, mutex) == 56);
    assert!(std::mem::offset_of!(IbvWq, cond) == 96);
    assert!(std::mem::offset_of!(IbvWq, events_completed) == 144);
};

/// `struct ibv_rwq_ind_table`.
#[repr(C)]
pub(crate) struct IbvRwqIndTable {
    pub(crate) context: *mut ibv_context,
    pub(crate) ind_tbl_handle: c_int,
    pub(crate) ind_tbl_num: c_int,
    pub(crate) comp_mask: u32,
}

/// An `ibv_wq`.
#[repr(C)]
pub(crate) struct WqBox {
    pub(crate) wq: UnsafeCell<IbvWq>,
    pub(crate) inner: uroce::Wq,
    pub(crate) pd: *const PdBox,
    pub(crate) cq: *const CqBox,
    /// Indirection tables naming it: destroying it is EBUSY meanwhile.
    pub(crate) users: AtomicU32,
}

/// An `ibv_rwq_ind_table`.
#[repr(C)]
pub(crate) struct RwqBox {
    pub(crate) tbl: UnsafeCell<IbvRwqIndTable>,
    pub(crate) inner: uroce::RwqIndTable,
    pub(crate) wqs: Vec<*const WqBox>,
    /// RSS QPs on it.
    pub(crate) users: AtomicU32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use uroce::{AsyncEvent, AsyncEventRouter};

    #[test]
    fn port_events_reach_every_open_context_and_unknown_objects_stay() {
        let objects = Objects::default();
        assert!(!objects.route(&AsyncEvent::PortError), "no context: the engine keeps it");
        let (a, b) = (
            Arc::new(uroce::AsyncEventQueue::new().unwrap()),
            Arc::new(uroce::AsyncEventQueue::new().unwrap()),
        );
        objects.contexts.lock().unwrap().extend([Arc::downgrade(&a), Arc::downgrade(&b)]);
        assert!(objects.route(&AsyncEvent::PortActive));
        assert_eq!(
            (a.pop().unwrap(), b.pop().unwrap()),
            (AsyncEvent::PortActive, AsyncEvent::PortActive)
        );
        drop(b);
        assert!(objects.route(&AsyncEvent::PortError));
        assert_eq!(a.pop().unwrap(), AsyncEvent::PortError);
        assert_eq!(objects.contexts.lock().unwrap().len(), 1, "a closed context is forgotten");
        // An object no C handle names (the Rust API's, on the same engine).
        assert!(!objects.route(&AsyncEvent::QpFatal { qpn: 7 }));
        assert!(!objects.route(&AsyncEvent::CqError { cq: 7 }));
        assert!(a.is_empty());
    }
}
