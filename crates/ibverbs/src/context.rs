//! `ibv_open_device` / `ibv_close_device`, the ops tables the header's
//! inline verbs call through, and asynchronous events.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex};

use crate::abi::consts::*;
use crate::abi::*;
use crate::ffi::{Kind, guard, is_live, minus_one, null_errno};
use crate::objects::{
    CqBox, CtxBox, DevShared, FUTURE_SLOTS, Objects, QpBox, SrqBox, Ufile, from_c, into_c, live_ctx,
};

pub(crate) unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        let Some((index, entry)) = crate::device::entry_of(dev) else {
            return null_errno(libc::ENODEV);
        };
        let shared = {
            let mut open = entry.open.lock().unwrap_or_else(|e| e.into_inner());
            if open.as_ref().is_some_and(|(shared, _)| shared.ctx.is_inherited()) {
                // The parent's engine, in a forked child: not this
                // process's to use or close (its progress thread and its
                // peers are the parent's). The child opens its own.
                std::mem::forget(open.take());
            }
            match open.as_mut() {
                Some((shared, n)) => {
                    *n += 1;
                    shared.clone()
                }
                None => match entry.cfg.open_shared() {
                    Ok(c) => {
                        let objects = Arc::new(Objects::default());
                        c.set_async_event_router(Some(objects.clone()));
                        let shared = Arc::new(DevShared { ctx: c, objects });
                        *open = Some((shared.clone(), 1));
                        shared
                    }
                    Err(e) => {
                        eprintln!("uroce: {e}");
                        return null_errno(e.errno());
                    }
                },
            }
        };
        make_context(index, entry, shared, command_fd(index), Arc::default())
    })
}

/// A new `ibv_context` of device `index` on its engine `shared`, with
/// `cmd_fd` (closed with it) and the objects of its command file.
pub(crate) fn make_context(
    index: usize,
    entry: &crate::device::DevEntry,
    shared: Arc<DevShared>,
    cmd_fd: Option<std::os::fd::OwnedFd>,
    ufile: Arc<Ufile>,
) -> *mut ibv_context {
    let async_queue = match uroce::AsyncEventQueue::new() {
        Ok(q) => Arc::new(q),
        Err(e) => return null_errno(e.raw_os_error().unwrap_or(libc::EMFILE)),
    };
    shared
        .objects
        .contexts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Arc::downgrade(&async_queue));
    let async_fd = async_queue.as_fd().as_raw_fd();
    // SAFETY: verbs_context is C data (pointers, options of fn
    // pointers, integers); all-zero is valid (NULL everywhere).
    let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
    vctx.query_port = Some(crate::device::query_port);
    vctx.post_srq_ops = Some(crate::srq::post_srq_ops);
    vctx.query_device_ex = Some(crate::device::query_device_ex);
    vctx.create_qp_ex = Some(crate::qp::create_qp_ex);
    vctx.create_cq_ex = Some(crate::cq::create_cq_ex);
    vctx.query_rt_values = Some(crate::device::query_rt_values);
    vctx.alloc_dm = Some(crate::dm::alloc_dm);
    vctx.free_dm = Some(crate::dm::free_dm);
    vctx.reg_dm_mr = Some(crate::dm::reg_dm_mr);
    vctx.advise_mr = Some(crate::pd::advise_mr);
    vctx.alloc_td = Some(crate::pd::alloc_td);
    vctx.dealloc_td = Some(crate::pd::dealloc_td);
    vctx.alloc_parent_domain = Some(crate::pd::alloc_parent_domain);
    vctx.open_xrcd = Some(crate::xrc::open_xrcd);
    vctx.close_xrcd = Some(crate::xrc::close_xrcd);
    vctx.create_srq_ex = Some(crate::srq::create_srq_ex);
    vctx.open_qp = Some(crate::qp::open_qp);
    vctx.get_srq_num = Some(crate::xrc::get_srq_num);
    vctx.modify_cq = Some(crate::cq::modify_cq);
    vctx.ibv_create_flow = crate::flow::create_flow as *mut c_void;
    vctx.ibv_destroy_flow = crate::flow::destroy_flow as *mut c_void;
    vctx.create_wq = crate::wq::create_wq as *mut c_void;
    vctx.modify_wq = crate::wq::modify_wq as *mut c_void;
    vctx.destroy_wq = crate::wq::destroy_wq as *mut c_void;
    vctx.create_rwq_ind_table = crate::wq::create_rwq_ind_table as *mut c_void;
    vctx.destroy_rwq_ind_table = crate::wq::destroy_rwq_ind_table as *mut c_void;
    vctx.sz = size_of::<verbs_context>() + FUTURE_SLOTS * size_of::<*mut c_void>();
    let c = &mut vctx.context;
    c.device = (&raw const *entry.ibv).cast_mut();
    c.ops.poll_cq = Some(crate::cq::poll_cq);
    c.ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    c.ops.post_send = Some(crate::qp::post_send);
    c.ops.post_recv = Some(crate::qp::post_recv);
    c.ops.post_srq_recv = Some(crate::srq::post_srq_recv);
    c.ops.alloc_mw = Some(crate::mw::alloc_mw);
    c.ops.bind_mw = Some(crate::mw::bind_mw);
    c.ops.dealloc_mw = Some(crate::mw::dealloc_mw);
    c.cmd_fd = cmd_fd.as_ref().map_or(-1, |f| f.as_raw_fd());
    c.async_fd = async_fd;
    c.num_comp_vectors = 1;
    c.abi_compat = VERBS_ABI_IS_EXTENDED as *mut c_void;
    let b = into_c(
        CtxBox {
            future: [std::ptr::null_mut(); FUTURE_SLOTS],
            vctx: UnsafeCell::new(vctx),
            dev: shared,
            dev_index: index,
            cmd_fd,
            async_queue,
            ufile,
        },
        Kind::Context,
    );
    // SAFETY: just allocated, live.
    unsafe { (*b).ibv() }
}

/// A descriptor for `ibv_context.cmd_fd`, where programs expect a real
/// one (pyverbs dups it): the device's `/dev/infiniband/uverbs<N>` when
/// `uroce run` provides it, else an empty memory file named after it (so
/// `/proc/self/fd` says which device). uroce takes no commands through it.
fn command_fd(index: usize) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let path = format!("/dev/infiniband/uverbs{index}");
    if let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).open(&path) {
        return Some(f.into());
    }
    let name = std::ffi::CString::new(format!("uroce-uverbs{index}")).ok()?;
    // SAFETY: a NUL-terminated name; the result is a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: a descriptor just created and owned by nobody else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard(-1, || {
        let Some(b) = live_ctx(context) else { return minus_one(libc::EINVAL) };
        let index = b.dev_index;
        let p = std::ptr::from_ref(b).cast_mut();
        // SAFETY: registered as a context ⇒ made by into_c::<CtxBox>.
        drop(unsafe { from_c::<CtxBox>(p, Kind::Context) });
        // The device's engine stays open after its last context closes:
        // a close-then-reopen (ibv_devinfo, test programs) must not race
        // the progress thread's release of the UDP port, and objects an
        // application leaked past the close stay destroyable.
        if let Ok(list) = crate::device::devices() {
            let mut open = list[index].open.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, n)) = open.as_mut() {
                *n = n.saturating_sub(1);
            }
        }
        0
    })
}

pub(crate) unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard(-1, || {
        let Some(b) = live_ctx(context) else { return minus_one(libc::EINVAL) };
        if event.is_null() {
            return minus_one(libc::EINVAL);
        }
        loop {
            let ev = match b.async_queue.pop() {
                Ok(ev) => ev,
                Err(e) => return minus_one(e.raw_os_error().unwrap_or(libc::EIO)),
            };
            // The element, counted as handed out under its map's lock: a
            // destroy takes it out of the map first, then waits for the
            // events handed out to be acknowledged.
            fn hand_out<B>(
                m: &Mutex<HashMap<u32, usize>>,
                k: u32,
                ledger: impl Fn(&B) -> &crate::objects::EventLedger,
            ) -> Option<usize> {
                let map = m.lock().unwrap_or_else(|e| e.into_inner());
                let p = map.get(&k).copied()?;
                // SAFETY: in the map ⇒ a live box of this kind (its destroy
                // removes it under this lock before freeing it).
                ledger(unsafe { &*(p as *const B) }).handed_out();
                Some(p)
            }
            let qp = |qpn| hand_out::<QpBox>(&b.dev.objects.qps, qpn, |q| &q.async_events);
            use uroce::AsyncEvent as E;
            let (element, ty) = match ev {
                E::QpFatal { qpn } => (qp(qpn), IBV_EVENT_QP_FATAL),
                E::QpRequestError { qpn } => (qp(qpn), IBV_EVENT_QP_REQ_ERR),
                E::QpAccessError { qpn } => (qp(qpn), IBV_EVENT_QP_ACCESS_ERR),
                E::SqDrained { qpn } => (qp(qpn), IBV_EVENT_SQ_DRAINED),
                E::QpLastWqeReached { qpn } => (qp(qpn), IBV_EVENT_QP_LAST_WQE_REACHED),
                E::CqError { cq } => (
                    hand_out::<CqBox>(&b.dev.objects.cqs, cq, |c| &c.async_events),
                    IBV_EVENT_CQ_ERR,
                ),
                E::SrqLimitReached { srq } => (
                    hand_out::<SrqBox>(&b.dev.objects.srqs, srq, |s| &s.async_events),
                    IBV_EVENT_SRQ_LIMIT_REACHED,
                ),
                E::PortActive => (Some(1), IBV_EVENT_PORT_ACTIVE),
                E::PortError => (Some(1), IBV_EVENT_PORT_ERR),
            };
            // An event for an object destroyed meanwhile is dropped.
            let Some(element) = element else { continue };
            // SAFETY: the caller passes a writable ibv_async_event.
            unsafe {
                event.write(ibv_async_event { element: element as *mut c_void, event_type: ty })
            };
            return 0;
        }
    })
}

pub(crate) unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard((), || {
        if event.is_null() {
            return;
        }
        // SAFETY: the caller passes an event ibv_get_async_event filled.
        let ev = unsafe { &*event };
        let p = ev.element;
        match ev.event_type {
            IBV_EVENT_CQ_ERR if is_live(p.cast::<CqBox>(), Kind::Cq) => {
                // SAFETY: a live CQ of ours.
                let b = unsafe { &*p.cast::<CqBox>() };
                // SAFETY: its public struct; the counter is informational.
                crate::cq::atomic_add(
                    unsafe { &raw mut (*b.cq.get()).cq.async_events_completed },
                    1,
                );
                b.async_events.acknowledged(1);
            }
            IBV_EVENT_SRQ_LIMIT_REACHED if is_live(p.cast::<SrqBox>(), Kind::Srq) => {
                // SAFETY: a live SRQ of ours.
                let b = unsafe { &*p.cast::<SrqBox>() };
                // SAFETY: its public struct; the counter is informational.
                crate::cq::atomic_add(unsafe { &raw mut (*b.srq.get()).events_completed }, 1);
                b.async_events.acknowledged(1);
            }
            IBV_EVENT_QP_FATAL
            | IBV_EVENT_QP_REQ_ERR
            | IBV_EVENT_QP_ACCESS_ERR
            | IBV_EVENT_SQ_DRAINED
            | IBV_EVENT_QP_LAST_WQE_REACHED
                if is_live(p.cast::<QpBox>(), Kind::Qp) =>
            {
                // SAFETY: a live QP of ours.
                let b = unsafe { &*p.cast::<QpBox>() };
                // SAFETY: its public struct; the counter is informational.
                crate::cq::atomic_add(
                    unsafe { &raw mut (*b.qpx.get()).qp_base.events_completed },
                    1,
                );
                b.async_events.acknowledged(1);
            }
            _ => {}
        }
    });
}
