//! Synchronous ids (`rdma_create_id` without a channel) and the endpoint
//! calls built on them (`rdma_create_ep`, `rdma_get_request`,
//! `rdma_destroy_ep`): such an id gets a channel of its own, and each call
//! that would raise an event waits for it and returns its outcome, as
//! rdma-core's librdmacm does.

use std::ffi::c_int;

use super::abi::*;
use super::{
    IdBox, event, keep_event, live_id, lock, next_event, on_id, rdma_accept_start,
    rdma_connect_start, rdma_resolve_addr_start, rdma_resolve_route_start, release_event,
};
use crate::abi::*;
use crate::ffi::{guard, minus_one, set_errno};

/// Waits on `b`'s own channel for the outcome of the call just made: 0
/// for one of `want`, else -1 with the errno the event means. The event
/// stays in `id->event` until the id's next call or its end (librdmacm's
/// `ucma_complete`): the peer's private data is read there.
pub(super) fn complete(b: &IdBox, want: &[c_int]) -> c_int {
    let Some(ch) = b.channel() else { return minus_one(libc::EINVAL) };
    // The previous call's event goes first (librdmacm acknowledges it
    // before it waits).
    release_event(b.c());
    let ev = match next_event(ch, b.c().channel) {
        Ok(ev) => ev,
        Err(errno) => return minus_one(errno),
    };
    let (kind, status) = (ev.ev.event, ev.ev.status);
    keep_event(b.c(), ev);
    if want.contains(&kind) && status == 0 {
        return 0;
    }
    let errno = match kind {
        event::REJECTED => libc::ECONNREFUSED,
        event::UNREACHABLE => libc::ETIMEDOUT,
        _ if status < 0 => -status,
        _ => libc::EIO,
    };
    minus_one(errno)
}

/// Runs `start` and, for a synchronous id, waits for `want`.
pub(super) fn then_wait(id: *mut rdma_cm_id, r: c_int, want: &[c_int]) -> c_int {
    if r != 0 {
        return r;
    }
    on_id(id, |b| if lock(&b.st).sync { complete(b, want) } else { 0 })
}

pub(crate) unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    let r = unsafe { rdma_resolve_addr_start(id, src, dst, timeout_ms) };
    then_wait(id, r, &[event::ADDR_RESOLVED])
}

pub(crate) unsafe extern "C" fn rdma_resolve_route(
    id: *mut rdma_cm_id,
    timeout_ms: c_int,
) -> c_int {
    // SAFETY: as above.
    let r = unsafe { rdma_resolve_route_start(id, timeout_ms) };
    then_wait(id, r, &[event::ROUTE_RESOLVED])
}

pub(crate) unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    // SAFETY: as above.
    let r = unsafe { rdma_connect_start(id, param) };
    then_wait(id, r, &[event::ESTABLISHED, event::CONNECT_RESPONSE])
}

pub(crate) unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    // SAFETY: as above.
    let r = unsafe { rdma_accept_start(id, param) };
    // A UD id's accept (the SIDR reply) ends there.
    let ud = on_id(id, |b| c_int::from(super::is_ud(b)));
    if ud == 1 { r } else { then_wait(id, r, &[event::ESTABLISHED]) }
}

/// The first address of `res`, by its side (`RAI_PASSIVE`: the source).
fn addr_of(res: &rdma_addrinfo) -> (*mut libc::sockaddr, *mut libc::sockaddr) {
    (res.ai_src_addr, res.ai_dst_addr)
}

pub(crate) unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        if id.is_null() || res.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: the caller passes a list rdma_getaddrinfo made.
        let res = unsafe { &*res };
        let mut new: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: our own call, a writable out pointer.
        if unsafe {
            super::rdma_create_id(
                std::ptr::null_mut(),
                &raw mut new,
                std::ptr::null_mut(),
                res.ai_port_space,
            )
        } != 0
        {
            return -1;
        }
        // The id's QP type is the address information's (XRC ids too).
        if res.ai_qp_type != 0 {
            on_id(new, |b| {
                b.c().qp_type = res.ai_qp_type;
                0
            });
        }
        let (src, dst) = addr_of(res);
        let r = if res.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: our own call on the id just made.
            let r = unsafe { super::rdma_bind_addr(new, src) };
            if r == 0 && !qp_init_attr.is_null() {
                // Each request's QP is made from these (rdma_get_request).
                // SAFETY: the caller's readable attributes, copied.
                let attr = unsafe { std::ptr::read(qp_init_attr) };
                on_id(new, |b| {
                    lock(&b.st).ep_attr = Some((attr, pd as usize));
                    0
                });
            }
            r
        } else {
            // SAFETY: our own calls on the id just made.
            let mut r = unsafe { rdma_resolve_addr(new, src, dst, 2000) };
            if r == 0 {
                // SAFETY: as above.
                r = unsafe { rdma_resolve_route(new, 2000) };
            }
            if r == 0 && !qp_init_attr.is_null() {
                // SAFETY: as above; the caller's attributes.
                r = unsafe { super::rdma_create_qp(new, pd, qp_init_attr) };
            }
            r
        };
        if r != 0 {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
            // SAFETY: the id just made.
            unsafe { rdma_destroy_ep(new) };
            set_errno(e);
            return -1;
        }
        // SAFETY: the caller's writable out pointer.
        unsafe { *id = new };
        0
    })
}

pub(crate) unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        if live_id(id).is_none() {
            return;
        }
        // SAFETY: a live id of ours.
        unsafe {
            super::rdma_destroy_qp(id);
            super::rdma_destroy_srq(id);
            super::rdma_destroy_id(id);
        }
    });
}

pub(crate) unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return minus_one(libc::EINVAL);
        }
        let Some(lb) = live_id(listen) else { return minus_one(libc::EINVAL) };
        let (sync, ep_attr) = {
            let st = lock(&lb.st);
            // SAFETY: a plain C struct, copied bit for bit.
            let attr = st.ep_attr.as_ref().map(|(a, pd)| (unsafe { std::ptr::read(a) }, *pd));
            (st.sync, attr)
        };
        if !sync {
            return minus_one(libc::EINVAL);
        }
        let Some(ch) = lb.channel() else { return minus_one(libc::EINVAL) };
        let channel = lb.c().channel;
        release_event(lb.c());
        let request = loop {
            match next_event(ch, channel) {
                Ok(ev) if ev.ev.event == event::CONNECT_REQUEST => break ev,
                Ok(_) => {}
                Err(errno) => return minus_one(errno),
            }
        };
        let child = request.ev.id;
        // The new id is synchronous too, on a channel of its own.
        // SAFETY: our own call.
        let own = unsafe { super::rdma_create_event_channel() };
        // SAFETY: our own call on the live child and channel.
        if own.is_null() || unsafe { super::rdma_migrate_id(child, own) } != 0 {
            return minus_one(libc::ENOMEM);
        }
        // The request stays in the new id's `event` (its private data and
        // parameters are read there), as librdmacm hands it over.
        on_id(child, |b| {
            lock(&b.st).sync = true;
            keep_event(b.c(), request);
            0
        });
        if let Some((mut attr, pd)) = ep_attr {
            // SAFETY: our own call; a copy of the endpoint's attributes.
            let r = unsafe {
                super::rdma_create_qp(
                    child,
                    pd as *mut ibv_pd,
                    (&raw mut attr).cast::<ibv_qp_init_attr>(),
                )
            };
            if r != 0 {
                return -1;
            }
        }
        // SAFETY: the caller's writable out pointer.
        unsafe { *id = child };
        0
    })
}
