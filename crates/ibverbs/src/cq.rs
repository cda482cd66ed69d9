//! Completion channels and completion queues: create/destroy, the
//! `poll_cq` / `req_notify_cq` ops, events, and the extended CQ's
//! iterator-style poll (`ibv_start_poll` ...).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::abi::consts::*;
use crate::abi::*;
use crate::ffi::{Kind, guard, is_live, minus_one, null_errno};
use crate::objects::{
    ChannelBox, CqBox, EventLedger, enter, from_c, hold, in_use, into_c, leave, obj, release,
};
use crate::objects::{live_cq, live_ctx};
use uroce::{Completion, WcOpcode, WcStatus};

const EMPTY: Completion = Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn live_channel<'a>(ch: *mut ibv_comp_channel) -> Option<&'a ChannelBox> {
    // SAFETY: dereferenced only once the registry says it is a live channel.
    is_live(ch.cast::<ChannelBox>(), Kind::Channel)
        .then(|| unsafe { obj::<_, ChannelBox>(ch) })
        .flatten()
}

pub(crate) unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        let ch = match c.uroce().create_comp_channel() {
            Ok(ch) => ch,
            Err(e) => return null_errno(e.errno()),
        };
        let fd = ch.as_raw_fd();
        into_c(
            ChannelBox {
                ch: UnsafeCell::new(ibv_comp_channel { context, fd, refcnt: 0 }),
                inner: ch,
                cqs: Mutex::new(HashMap::new()),
                users: AtomicU32::new(0),
            },
            Kind::Channel,
        )
        .cast()
    })
}

pub(crate) unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_channel(ch) else { return libc::EINVAL };
        if in_use(&b.users) {
            return libc::EBUSY;
        }
        // SAFETY: registered as a channel ⇒ made by into_c::<ChannelBox>.
        drop(unsafe { from_c(ch.cast::<ChannelBox>(), Kind::Channel) });
        0
    })
}

/// Creates a CQ box; `ex` fills the extended poll functions.
fn create(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut CqBox {
    let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
    if cqe < 1 || comp_vector != 0 {
        return null_errno(libc::EINVAL);
    }
    let chan = if channel.is_null() {
        None
    } else {
        match live_channel(channel) {
            Some(ch) => Some(ch),
            None => return null_errno(libc::EINVAL),
        }
    };
    let cq = match c.uroce().create_cq_with(cqe as u32, chan.map(|ch| &ch.inner)) {
        Ok(cq) => cq,
        Err(e) => return null_errno(e.errno()),
    };
    let handle = cq.handle();
    // SAFETY: ibv_cq_ex is C data; all-zero is valid (NULL fn pointers,
    // zeroed mutex/cond = their static initialisers).
    let mut pub_cq: ibv_cq_ex = unsafe { std::mem::zeroed() };
    pub_cq.cq.context = context;
    pub_cq.cq.channel = channel;
    pub_cq.cq.cq_context = cq_context;
    pub_cq.cq.handle = handle;
    pub_cq.cq.cqe = cq.cqe() as c_int;
    pub_cq.start_poll = Some(start_poll);
    pub_cq.next_poll = Some(next_poll);
    pub_cq.end_poll = Some(end_poll);
    pub_cq.read_opcode = Some(read_opcode);
    pub_cq.read_vendor_err = Some(read_vendor_err);
    pub_cq.read_byte_len = Some(read_byte_len);
    pub_cq.read_imm_data = Some(read_imm_data);
    pub_cq.read_qp_num = Some(read_qp_num);
    pub_cq.read_src_qp = Some(read_src_qp);
    pub_cq.read_wc_flags = Some(read_wc_flags);
    pub_cq.read_slid = Some(read_slid);
    pub_cq.read_sl = Some(read_sl);
    pub_cq.read_dlid_path_bits = Some(read_dlid_path_bits);
    pub_cq.read_completion_ts = Some(read_completion_ts);
    pub_cq.read_completion_wallclock_ns = Some(read_completion_wallclock_ns);
    pub_cq.read_tm_info = Some(read_tm_info);
    let b = into_c(
        CqBox {
            cq: UnsafeCell::new(pub_cq),
            inner: cq,
            dev: c.dev.clone(),
            channel: chan.map_or(std::ptr::null(), |c| c as *const ChannelBox),
            users: AtomicU32::new(0),
            events: EventLedger::default(),
            async_events: EventLedger::default(),
            async_queue: c.async_queue.clone(),
            cursor: Mutex::new(EMPTY),
            polling: AtomicBool::new(false),
        },
        Kind::Cq,
    );
    if let Some(ch) = chan {
        hold(&ch.users);
        // SAFETY: a live channel; refcnt mirrors our count for C readers.
        atomic_add(unsafe { &raw mut (*ch.ch.get()).refcnt }, 1);
        lock(&ch.cqs).insert(handle, b as usize);
    }
    lock(&c.dev.objects.cqs).insert(handle, b as usize);
    b
}

pub(crate) unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(std::ptr::null_mut(), || create(context, cqe, cq_context, channel, comp_vector).cast())
}

/// `verbs_context.create_cq_ex`.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(std::ptr::null_mut(), || {
        if attr.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: the caller passes a readable attribute struct.
        let a = unsafe { &*attr };
        if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
            return null_errno(libc::EINVAL);
        }
        let flags = if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 { a.flags } else { 0 };
        // SINGLE_THREADED (bit 0) is a hint; anything else is unsupported.
        if a.wc_flags & !SUPPORTED_WC_EX != 0 || flags & !1 != 0 {
            return null_errno(libc::EOPNOTSUPP);
        }
        // A parent domain of this context may be named (its allocators
        // are not needed: the ring is uroce's own memory); a plain PD not.
        if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0
            && !crate::objects::live_pd(a.parent_domain).is_some_and(|p| {
                // SAFETY: a live PD's public struct.
                !p.parent_of.is_null() && unsafe { (*p.pd.get()).context } == context
            })
        {
            return null_errno(libc::EINVAL);
        }
        let Ok(cqe) = c_int::try_from(a.cqe) else { return null_errno(libc::EINVAL) };
        create(context, cqe, a.cq_context, a.channel, a.comp_vector as c_int).cast()
    })
}

/// `verbs_context.modify_cq` (`ibv_modify_cq`): event moderation, the
/// only attribute there is.
pub(crate) unsafe extern "C" fn modify_cq(cq: *mut ibv_cq, attr: *mut ibv_modify_cq_attr) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_cq(cq) else { return libc::EINVAL };
        // SAFETY: NULL or the caller's readable attributes.
        let Some(a) = (unsafe { attr.as_ref() }) else { return libc::EINVAL };
        if a.attr_mask != IBV_CQ_ATTR_MODERATE {
            return libc::EINVAL;
        }
        b.inner.moderate(a.cq_count, a.cq_period).map_or_else(|e| e.errno(), |()| 0)
    })
}

/// `ibv_resize_cq`: grows or shrinks the CQ with completions waiting
/// (they stay); EINVAL for fewer entries than wait, as rxe. `cq->cqe`
/// becomes the new size.
pub(crate) unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_cq(cq) else { return libc::EINVAL };
        let Ok(n) = u32::try_from(cqe) else { return libc::EINVAL };
        if let Err(e) = b.inner.resize(n) {
            return e.errno();
        }
        // SAFETY: a live CQ's public struct; the application reads it only
        // between calls (the verbs contract).
        unsafe { (*b.cq.get()).cq.cqe = b.inner.cqe() as c_int };
        0
    })
}

pub(crate) unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_cq(cq) else { return libc::EINVAL };
        if in_use(&b.users) {
            return libc::EBUSY;
        }
        let handle = b.inner.handle();
        if !b.channel.is_null() {
            // SAFETY: a CQ holds its channel (use count), so it is live.
            let ch = unsafe { &*b.channel };
            // First out of the channel's map: no event can be handed out
            // for it from now on.
            lock(&ch.cqs).remove(&handle);
            release(&ch.users);
            // SAFETY: live channel, as above.
            atomic_add(unsafe { &raw mut (*ch.ch.get()).refcnt }, -1);
        }
        // No async event can be handed out for it from now on.
        lock(&b.dev.objects.cqs).remove(&handle);
        // As rdma-core: wait until every event handed out was acknowledged.
        b.events.wait_all_acknowledged();
        b.async_events.wait_all_acknowledged();
        // SAFETY: registered as a CQ ⇒ made by into_c::<CqBox>.
        drop(unsafe { from_c(cq.cast::<CqBox>(), Kind::Cq) });
        0
    })
}

/// Adds to a counter in a C-visible struct atomically (rdma-core updates
/// these under a mutex; other threads may be reading them).
pub(crate) fn atomic_add<T: AtomicCounter>(p: *mut T, by: i32) {
    T::add(p, by);
}

/// The `int` / `uint32_t` counters of the public structs.
pub(crate) trait AtomicCounter {
    fn add(p: *mut Self, by: i32);
}

impl AtomicCounter for c_int {
    fn add(p: *mut Self, by: i32) {
        // SAFETY: callers pass a field of a live object of ours, aligned
        // for an i32, that is only ever updated atomically.
        unsafe { std::sync::atomic::AtomicI32::from_ptr(p) }.fetch_add(by, Ordering::AcqRel);
    }
}

impl AtomicCounter for u32 {
    fn add(p: *mut Self, by: i32) {
        // SAFETY: as for c_int.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(p) }
            .fetch_add(by as Self, Ordering::AcqRel);
    }
}

/// `wc.imm_data`: immediate data as the `__be32` it arrived as (the wire
/// bytes), an invalidated R_Key as a host order number.
fn imm_to_c(c: &Completion) -> u32 {
    match c.opcode {
        // Their application context is read with `ibv_wc_read_tm_info`.
        uroce::WcOpcode::TmRecv | uroce::WcOpcode::TmNoTag => 0,
        _ if c.flags.contains(uroce::WcFlags::WITH_IMM) => c.imm_or_inv.to_be(),
        _ => c.imm_or_inv,
    }
}

/// `ibv_wc` from a uroce completion.
pub(crate) fn to_wc(c: &Completion) -> ibv_wc {
    ibv_wc {
        wr_id: c.wr_id,
        status: c.status as c_int,
        opcode: c.opcode as c_int,
        vendor_err: c.vendor_err,
        byte_len: c.byte_len,
        imm_data: imm_to_c(c),
        qp_num: c.qp_num,
        src_qp: c.src_qp,
        wc_flags: c.flags.0,
        pkey_index: 0,
        slid: 0,
        sl: c.sl,
        dlid_path_bits: 0,
    }
}

/// `ops.poll_cq`: up to `n` completions into `wc`; a negative value once
/// the CQ has overflowed.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        // SAFETY: verbs contract: a live CQ of ours (hot path: no registry).
        let Some(b) = (unsafe { obj::<_, CqBox>(cq) }) else { return -1 };
        if n <= 0 || wc.is_null() {
            return 0;
        }
        let mut got = 0usize;
        let polled = b.inner.poll_with(n as usize, |c| {
            // SAFETY: the caller gives `n` writable ibv_wc slots, and
            // `poll_with` hands over at most `n` completions.
            unsafe { wc.add(got).write(to_wc(c)) };
            got += 1;
        });
        if polled.is_err() {
            return -1;
        }
        got as c_int
    })
}

/// `ops.req_notify_cq`. Arming a CQ without a channel is accepted (the
/// event has nowhere to go), as the kernel does.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract (hot path).
        let Some(b) = (unsafe { obj::<_, CqBox>(cq) }) else { return libc::EINVAL };
        if b.channel.is_null() {
            return 0;
        }
        match b.inner.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

pub(crate) unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        let Some(ch) = live_channel(channel) else { return minus_one(libc::EINVAL) };
        if cq_out.is_null() || cq_context.is_null() {
            return minus_one(libc::EINVAL);
        }
        loop {
            let handle = match ch.inner.get_event() {
                Ok(h) => h,
                Err(e) => return minus_one(e.raw_os_error().unwrap_or(libc::EIO)),
            };
            let cqs = lock(&ch.cqs);
            // An event of a CQ destroyed meanwhile is dropped.
            let Some(&p) = cqs.get(&handle) else { continue };
            // SAFETY: in the channel's map ⇒ a live CQ (destroy removes it
            // under this lock before freeing).
            let b = unsafe { &*(p as *const CqBox) };
            b.events.handed_out();
            // SAFETY: still live (in the map, under its lock).
            let context = unsafe { (*b.cq.get()).cq.cq_context };
            drop(cqs);
            // SAFETY: the caller passes writable out pointers. The CQ stays
            // live until this event is acknowledged (ibv_destroy_cq waits).
            unsafe {
                *cq_out = p as *mut ibv_cq;
                *cq_context = context;
            }
            return 0;
        }
    })
}

pub(crate) unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    guard((), || {
        let Some(b) = live_cq(cq) else { return };
        b.inner.ack_events(nevents);
        // SAFETY: a live CQ; the field is informational for C readers.
        atomic_add(unsafe { &raw mut (*b.cq.get()).cq.comp_events_completed }, nevents as i32);
        b.events.acknowledged(u64::from(nevents));
    });
}

// The extended CQ's iterator. `start_poll` / `next_poll` load the next
// completion into the cursor (ENOENT when there is none) and publish
// `status` / `wr_id`; the `read_*` functions read the cursor.

fn load_next(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: verbs contract: a live CQ of ours.
    let Some(b) = (unsafe { obj::<_, CqBox>(cq) }) else { return libc::EINVAL };
    let mut one = [EMPTY];
    match b.inner.poll(&mut one) {
        Ok(1) => {
            *lock(&b.cursor) = one[0];
            // SAFETY: live CQ; these fields are ours to publish.
            unsafe {
                (*b.cq.get()).status = one[0].status as c_int;
                (*b.cq.get()).wr_id = one[0].wr_id;
            }
            0
        }
        Ok(_) => libc::ENOENT,
        Err(e) => e.errno(),
    }
}

/// Starts a poll: on success the CQ stays locked until `end_poll`; on
/// ENOENT or an error it is released (and `end_poll` must not be called).
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: NULL or a readable attribute.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    guard(libc::EIO, || {
        // SAFETY: verbs contract: a live CQ of ours.
        let Some(b) = (unsafe { obj::<_, CqBox>(cq) }) else { return libc::EINVAL };
        enter(&b.polling);
        let r = load_next(cq);
        if r != 0 {
            leave(&b.polling);
        }
        r
    })
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || load_next(cq))
}

unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: verbs contract: a live CQ of ours.
    if let Some(b) = unsafe { obj::<_, CqBox>(cq) } {
        leave(&b.polling);
    }
}

fn cursor(cq: *mut ibv_cq_ex) -> Completion {
    // SAFETY: verbs contract: a live CQ of ours.
    unsafe { obj::<_, CqBox>(cq) }.map_or(EMPTY, |b| *lock(&b.cursor))
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> c_int {
    guard(0, || cursor(cq).opcode as c_int)
}
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || cursor(cq).vendor_err)
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || cursor(cq).byte_len)
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || imm_to_c(&cursor(cq)))
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || cursor(cq).qp_num)
}
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    guard(0, || cursor(cq).src_qp)
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    guard(0, || cursor(cq).flags.0)
}
/// A tag matching completion's tag and application context.
unsafe extern "C" fn read_tm_info(cq: *mut ibv_cq_ex, info: *mut ibv_wc_tm_info) {
    guard((), || {
        let c = cursor(cq);
        let tm = matches!(c.opcode, uroce::WcOpcode::TmRecv | uroce::WcOpcode::TmNoTag);
        let (tag, priv_) = if tm { (c.tm_tag, c.imm_or_inv) } else { (0, 0) };
        // SAFETY: NULL or the caller's writable `ibv_wc_tm_info`.
        if let Some(i) = unsafe { info.as_mut() } {
            *i = ibv_wc_tm_info { tag, priv_ };
        }
    })
}
unsafe extern "C" fn read_slid(_: *mut ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    guard(0, || cursor(cq).sl)
}
unsafe extern "C" fn read_dlid_path_bits(_: *mut ibv_cq_ex) -> u8 {
    0
}
/// Nanoseconds on the device clock (`hca_core_clock` is 1 GHz).
unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    guard(0, || cursor(cq).timestamp)
}
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    guard(0, || {
        // SAFETY: verbs contract: a live CQ of ours.
        let Some(b) = (unsafe { obj::<_, CqBox>(cq) }) else { return 0 };
        let ts = lock(&b.cursor).timestamp;
        b.inner.wallclock_ns(ts)
    })
}
