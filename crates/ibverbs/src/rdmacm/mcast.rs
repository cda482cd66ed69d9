//! Multicast through the RDMA CM (`rdma_join_multicast`,
//! `rdma_join_multicast_ex`, `rdma_leave_multicast`), as the kernel's CM
//! does it on RoCE: there is no subnet administrator to ask, the group's
//! GID is its IP address (IPv4-mapped for IPv4), its Q_Key is the UDP port
//! space's, and the join completes at once with a MULTICAST_JOIN event
//! whose address vector sends to the group (remote QPN 0xFFFFFF). As
//! librdmacm does, the library attaches the id's QP to the group when that
//! event is read (unless the join was send-only) and detaches it on leave;
//! the attach joins the IP group on the device's sockets, the way the
//! kernel sends an IGMP join.

use std::ffi::{c_int, c_void};
use std::net::IpAddr;

use super::abi::*;
use super::{
    EventBox, IdBox, IdState, UDP_QKEY, ah_toward, event, gid, is_ud, lock, new_event, on_id,
    read_sockaddr, set_ud, uroce_of,
};
use crate::ffi::minus_one;

/// A group joined through an id.
#[derive(Debug)]
pub(super) struct Group {
    ip: IpAddr,
    /// The application's context for the join (the event's private data).
    context: usize,
    /// Joined send-only: the QP is not attached.
    send_only: bool,
    /// The QP the library attached to the group (0: none).
    attached: usize,
}

fn join(
    id: *mut rdma_cm_id,
    addr: *const libc::sockaddr,
    context: usize,
    send_only: bool,
) -> c_int {
    let r = on_id(id, |b| {
        let Some(group) = read_sockaddr(addr).map(|a| a.ip()) else {
            return minus_one(libc::EINVAL);
        };
        if !group.is_multicast() || !is_ud(b) {
            return minus_one(libc::EINVAL);
        }
        let mut st = lock(&b.st);
        // Bound to a device, by `rdma_bind_addr` or address resolution.
        let Some(local) = st.local.filter(|_| st.verbs != 0) else {
            return minus_one(libc::EINVAL);
        };
        if local.is_ipv4() != group.is_ipv4() {
            return minus_one(libc::EINVAL);
        }
        if st.groups.iter().any(|g| g.ip == group) {
            return minus_one(libc::EADDRINUSE);
        }
        st.groups.push(Group { ip: group, context, send_only, attached: 0 });
        b.raise(&mut st, event::MULTICAST_JOIN, 0, Some(group));
        0
    });
    super::sync::then_wait(id, r, &[event::MULTICAST_JOIN])
}

pub(crate) unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    join(id, addr, context as usize, false)
}

pub(crate) unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    // SAFETY: NULL or the caller's readable attributes.
    let Some(a) = (unsafe { attr.as_ref() }) else { return minus_one(libc::EINVAL) };
    let both = JOIN_MC_ATTR_ADDRESS | JOIN_MC_ATTR_JOIN_FLAGS;
    if a.comp_mask & !both != 0 {
        return minus_one(libc::EOPNOTSUPP);
    }
    if a.comp_mask != both || a.join_flags > MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
        return minus_one(libc::EINVAL);
    }
    join(id, a.addr, context as usize, a.join_flags == MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
}

pub(crate) unsafe extern "C" fn rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    on_id(id, |b| {
        let Some(group) = read_sockaddr(addr).map(|a| a.ip()) else {
            return minus_one(libc::EINVAL);
        };
        let mut st = lock(&b.st);
        let Some(i) = st.groups.iter().position(|g| g.ip == group) else {
            return minus_one(libc::EADDRNOTAVAIL);
        };
        let g = st.groups.remove(i);
        detach(b, &g);
        0
    })
}

/// Leaves every group (the id is being destroyed).
pub(super) fn leave_all(b: &IdBox, st: &mut IdState) {
    for g in st.groups.drain(..) {
        detach(b, &g);
    }
}

/// The id's QP is being destroyed: its attachments go with it.
pub(super) fn qp_gone(st: &mut IdState) {
    for g in &mut st.groups {
        g.attached = 0;
    }
}

/// Detaches the QP the library attached, if it is still the id's.
fn detach(b: &IdBox, g: &Group) {
    let qp = b.c().qp;
    if g.attached != 0 && qp as usize == g.attached {
        let mgid = gid(g.ip);
        // SAFETY: the id's live QP and a GID on our stack.
        unsafe { crate::qp::ibv_detach_mcast(qp, &mgid, 0) };
    }
}

/// The application's MULTICAST_JOIN event for `group`, the QP attached
/// (MULTICAST_ERROR if that fails); `None` if the group was left since.
pub(super) fn join_event(b: &IdBox, group: IpAddr) -> Option<Box<EventBox>> {
    let mut st = lock(&b.st);
    let local = st.local?;
    let ctx = uroce_of(st.verbs)?;
    let g = st.groups.iter_mut().find(|g| g.ip == group)?;
    let mut ev = new_event(b.ptr(), event::MULTICAST_JOIN, 0);
    set_ud(&mut ev, &[], ah_toward(&ctx, local.ip(), group), 0xff_ffff, UDP_QKEY);
    ev.ev.param.ud.private_data = g.context as *const c_void;
    let qp = b.c().qp;
    if !g.send_only && !qp.is_null() {
        let mgid = gid(group);
        // SAFETY: the id's live QP and a GID on our stack.
        match unsafe { crate::qp::ibv_attach_mcast(qp, &mgid, 0) } {
            0 => g.attached = qp as usize,
            e => {
                ev.ev.event = event::MULTICAST_ERROR;
                ev.ev.status = -e;
            }
        }
    }
    Some(ev)
}
