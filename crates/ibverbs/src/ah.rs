//! Address handles, and building them from a received UD completion.

use std::cell::UnsafeCell;
use std::ffi::c_int;

use uroce::{Completion, WcFlags, WcOpcode, WcStatus};

use crate::abi::*;
use crate::ffi::{Kind, guard, minus_one, null_errno};
use crate::objects::live_pd;
use crate::objects::{AhBox, ctx, from_c, hold, into_c, release};

pub(crate) unsafe extern "C" fn ibv_create_ah(
    pd: *mut ibv_pd,
    attr: *mut ibv_ah_attr,
) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        let Some((p, c)) = crate::objects::live_pd_ctx(pd) else { return null_errno(libc::EINVAL) };
        let context = c.ibv();
        // SAFETY: NULL or a readable attribute struct.
        let Some(a) = (unsafe { attr.as_ref() }) else { return null_errno(libc::EINVAL) };
        let dest = match crate::qp::av_dest(c.uroce(), a) {
            Ok(d) => d,
            Err(e) => return null_errno(e),
        };
        let inner = match p.inner.create_ah(&dest) {
            Ok(ah) => ah,
            Err(e) => return null_errno(e.errno()),
        };
        hold(&p.users);
        let b = into_c(
            AhBox { ah: UnsafeCell::new(ibv_ah { context, pd, handle: 0 }), inner, pd: p },
            Kind::Ah,
        );
        b.cast()
    })
}

pub(crate) unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: registered as an AH ⇒ made by into_c::<AhBox>.
        let Some(b) = (unsafe { from_c(ah.cast::<AhBox>(), Kind::Ah) }) else {
            return libc::EINVAL;
        };
        // SAFETY: an AH holds its PD (use count).
        release(unsafe { &(*b.pd).users });
        0
    })
}

/// `ibv_init_ah_from_wc`: the address vector that answers the sender of a
/// UD receive, from the GRH area at the start of its buffer.
pub(crate) unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut u8,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: verbs contract.
        let Some(dev) = (unsafe { ctx(context) }) else { return minus_one(libc::EINVAL) };
        if port != 1 {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: NULL or readable/writable structs from the caller.
        let (Some(w), Some(out)) = (unsafe { wc.as_ref() }, unsafe { ah_attr.as_mut() }) else {
            return minus_one(libc::EINVAL);
        };
        if grh.is_null() {
            return minus_one(libc::EINVAL);
        }
        *out = ibv_ah_attr {
            dlid: w.slid,
            sl: w.sl,
            src_path_bits: w.dlid_path_bits,
            port_num: port,
            ..ibv_ah_attr::default()
        };
        if w.wc_flags & WcFlags::GRH.0 == 0 {
            // No GRH: an address vector without one, as rdma-core fills it.
            return 0;
        }
        // SAFETY: the GRH area is the first 40 bytes of the receive buffer.
        let area = unsafe { &*grh.cast::<[u8; uroce::wire::GRH_LEN]>() };
        let mut c = Completion::new(w.wr_id, WcStatus::Success, WcOpcode::Recv, w.qp_num, true);
        c.flags = WcFlags(w.wc_flags);
        let a = match uroce::AhAttr::from_wc(&c, area) {
            Ok(a) if !a.dst.is_multicast() => a,
            Ok(_) => return minus_one(libc::EINVAL),
            Err(e) => return minus_one(e.errno()),
        };
        // The reply leaves from the GID the datagram came to.
        let sgid_index = uroce::wire::grh::GrhInfo::parse(area)
            .ok()
            .and_then(|g| dev.uroce().gid_index_of(g.dst))
            .and_then(|i| u8::try_from(i).ok())
            .unwrap_or(0);
        *out = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid { raw: uroce::wire::grh::gid_of(a.dst) },
                flow_label: a.flow_label,
                sgid_index,
                hop_limit: a.hop_limit,
                traffic_class: a.traffic_class,
            },
            dlid: w.slid,
            sl: w.sl,
            src_path_bits: w.dlid_path_bits,
            static_rate: 0,
            is_global: 1,
            port_num: port,
        };
        0
    })
}

pub(crate) unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut u8,
    port: u8,
) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        let Some(p) = live_pd(pd) else { return null_errno(libc::EINVAL) };
        let mut attr = ibv_ah_attr::default();
        // SAFETY: a live PD's context is one of ours; the rest is the
        // caller's, checked by ibv_init_ah_from_wc.
        let r = unsafe { ibv_init_ah_from_wc((*p.pd.get()).context, port, wc, grh, &mut attr) };
        if r != 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: as above.
        unsafe { ibv_create_ah(pd, &mut attr) }
    })
}
