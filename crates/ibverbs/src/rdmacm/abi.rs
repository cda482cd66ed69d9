//! librdmacm's public structures (rdma-core 44's `rdma_cma.h`), laid out
//! as the measured sizes and offsets in `../shared/abi/layout.txt` say.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

use crate::abi::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_srq,
};

/// `RDMA_PS_*`.
pub(crate) const RDMA_PS_IPOIB: c_int = 0x0002;
pub(crate) const RDMA_PS_TCP: c_int = 0x0106;
pub(crate) const RDMA_PS_UDP: c_int = 0x0111;
pub(crate) const RDMA_PS_IB: c_int = 0x013f;

/// `enum rdma_cm_event_type`.
pub(crate) mod event {
    use std::ffi::c_int;
    pub(crate) const ADDR_RESOLVED: c_int = 0;
    pub(crate) const ADDR_ERROR: c_int = 1;
    pub(crate) const ROUTE_RESOLVED: c_int = 2;
    pub(crate) const CONNECT_REQUEST: c_int = 4;
    pub(crate) const CONNECT_RESPONSE: c_int = 5;
    pub(crate) const CONNECT_ERROR: c_int = 6;
    pub(crate) const UNREACHABLE: c_int = 7;
    pub(crate) const REJECTED: c_int = 8;
    pub(crate) const ESTABLISHED: c_int = 9;
    pub(crate) const DISCONNECTED: c_int = 10;
    pub(crate) const MULTICAST_JOIN: c_int = 12;
    pub(crate) const MULTICAST_ERROR: c_int = 13;
    pub(crate) const TIMEWAIT_EXIT: c_int = 15;
}

/// `struct ibv_ece` (enhanced connection establishment).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ibv_ece {
    pub(crate) vendor_id: u32,
    pub(crate) options: u32,
    pub(crate) comp_mask: u32,
}

/// `RAI_PASSIVE`.
pub(crate) const RAI_PASSIVE: c_int = 1;

#[repr(C)]
pub(crate) struct rdma_event_channel {
    pub(crate) fd: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct rdma_ib_addr {
    pub(crate) sgid: ibv_gid,
    pub(crate) dgid: ibv_gid,
    pub(crate) pkey: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct rdma_addr {
    pub(crate) src: libc::sockaddr_storage,
    pub(crate) dst: libc::sockaddr_storage,
    pub(crate) ib: rdma_ib_addr,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct rdma_route {
    pub(crate) addr: rdma_addr,
    pub(crate) path_rec: *mut c_void,
    pub(crate) num_paths: c_int,
}

#[repr(C)]
pub(crate) struct rdma_cm_id {
    pub(crate) verbs: *mut ibv_context,
    pub(crate) channel: *mut rdma_event_channel,
    pub(crate) context: *mut c_void,
    pub(crate) qp: *mut ibv_qp,
    pub(crate) route: rdma_route,
    pub(crate) ps: c_int,
    pub(crate) port_num: u8,
    pub(crate) event: *mut rdma_cm_event,
    pub(crate) send_cq_channel: *mut ibv_comp_channel,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq_channel: *mut ibv_comp_channel,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut ibv_srq,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) qp_type: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct rdma_conn_param {
    pub(crate) private_data: *const c_void,
    pub(crate) private_data_len: u8,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) flow_control: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
    pub(crate) srq: u8,
    pub(crate) qp_num: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct rdma_ud_param {
    pub(crate) private_data: *const c_void,
    pub(crate) private_data_len: u8,
    pub(crate) ah_attr: ibv_ah_attr,
    pub(crate) qp_num: u32,
    pub(crate) qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union rdma_event_param {
    pub(crate) conn: rdma_conn_param,
    pub(crate) ud: rdma_ud_param,
}

#[repr(C)]
pub(crate) struct rdma_cm_event {
    pub(crate) id: *mut rdma_cm_id,
    pub(crate) listen_id: *mut rdma_cm_id,
    pub(crate) event: c_int,
    pub(crate) status: c_int,
    pub(crate) param: rdma_event_param,
}

/// `rdma_join_multicast_ex`'s attributes.
#[repr(C)]
pub(crate) struct rdma_cm_join_mc_attr_ex {
    pub(crate) comp_mask: u32,
    pub(crate) join_flags: u32,
    pub(crate) addr: *mut libc::sockaddr,
}

/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`, `_JOIN_FLAGS`.
pub(crate) const JOIN_MC_ATTR_ADDRESS: u32 = 1;
pub(crate) const JOIN_MC_ATTR_JOIN_FLAGS: u32 = 2;
/// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER` (`_FULLMEMBER` is 0).
pub(crate) const MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;

#[repr(C)]
pub(crate) struct rdma_addrinfo {
    pub(crate) ai_flags: c_int,
    pub(crate) ai_family: c_int,
    pub(crate) ai_qp_type: c_int,
    pub(crate) ai_port_space: c_int,
    pub(crate) ai_src_len: libc::socklen_t,
    pub(crate) ai_dst_len: libc::socklen_t,
    pub(crate) ai_src_addr: *mut libc::sockaddr,
    pub(crate) ai_dst_addr: *mut libc::sockaddr,
    pub(crate) ai_src_canonname: *mut c_char,
    pub(crate) ai_dst_canonname: *mut c_char,
    pub(crate) ai_route_len: usize,
    pub(crate) ai_route: *mut c_void,
    pub(crate) ai_connect_len: usize,
    pub(crate) ai_connect: *mut c_void,
    pub(crate) ai_next: *mut Self,
}

// The measured layout (rdma-core 44, x86-64).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<rdma_event_channel>() == 4);
    assert!(size_of::<rdma_ib_addr>() == 40);
    assert!(size_of::<rdma_addr>() == 296);
    assert!(offset_of!(rdma_addr, ib) == 256);
    assert!(size_of::<rdma_route>() == 312);
    assert!(offset_of!(rdma_route, num_paths) == 304);
    assert!(size_of::<rdma_cm_id>() == 416);
    assert!(offset_of!(rdma_cm_id, route) == 32);
    assert!(offset_of!(rdma_cm_id, ps) == 344);
    assert!(offset_of!(rdma_cm_id, port_num) == 348);
    assert!(offset_of!(rdma_cm_id, event) == 352);
    assert!(offset_of!(rdma_cm_id, pd) == 400);
    assert!(offset_of!(rdma_cm_id, qp_type) == 408);
    assert!(size_of::<rdma_conn_param>() == 24);
    assert!(offset_of!(rdma_conn_param, qp_num) == 16);
    assert!(size_of::<rdma_ud_param>() == 56);
    assert!(offset_of!(rdma_ud_param, ah_attr) == 16);
    assert!(offset_of!(rdma_ud_param, qkey) == 52);
    assert!(size_of::<rdma_cm_event>() == 80);
    assert!(offset_of!(rdma_cm_event, param) == 24);
    assert!(size_of::<rdma_cm_join_mc_attr_ex>() == 16);
    assert!(offset_of!(rdma_cm_join_mc_attr_ex, addr) == 8);
    assert!(size_of::<rdma_addrinfo>() == 96);
    assert!(offset_of!(rdma_addrinfo, ai_next) == 88);
    assert!(offset_of!(rdma_addrinfo, ai_connect) == 80);
};
