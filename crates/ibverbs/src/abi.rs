//! `#[repr(C)]` mirrors of rdma-core 44's `<infiniband/verbs.h>` structs
//! (x86_64). Applications compiled against those headers read and write
//! these bytes directly, and the header's static-inline verbs call through
//! the function pointers in them, so every size and offset must match; the
//! tests at the bottom compare each with the numbers measured from the real
//! header (`tests/layout.txt`, from `../shared/abi/layout.c`).
//!
//! Names follow the C fields so that a reader can hold this file next to
//! the header. Only plain data here: no code, no `unsafe`.

#![allow(non_camel_case_types, non_snake_case, missing_docs, clippy::use_self)]

use core::ffi::{c_char, c_int, c_uint, c_void};

/// `pthread_mutex_t` on glibc x86_64; all-zero is `PTHREAD_MUTEX_INITIALIZER`.
pub type PthreadMutex = [u64; 5];
/// `pthread_cond_t` on glibc x86_64; all-zero is `PTHREAD_COND_INITIALIZER`.
pub type PthreadCond = [u64; 6];

/// What `ibv_context.abi_compat` holds for an extended (`verbs_context`)
/// context (`__VERBS_ABI_IS_EXTENDED`).
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

#[repr(C)]
pub struct ibv_device {
    pub _ops: [*mut c_void; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, c_int) -> *mut ibv_mw;
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int;
pub type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;

/// `struct ibv_context_ops`: the `_compat_*` slots are unused by the
/// header (the exported functions are called instead).
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: *mut c_void,
    pub _compat_query_port: *mut c_void,
    pub _compat_alloc_pd: *mut c_void,
    pub _compat_dealloc_pd: *mut c_void,
    pub _compat_reg_mr: *mut c_void,
    pub _compat_rereg_mr: *mut c_void,
    pub _compat_dereg_mr: *mut c_void,
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    pub _compat_create_cq: *mut c_void,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyFn>,
    pub _compat_cq_event: *mut c_void,
    pub _compat_resize_cq: *mut c_void,
    pub _compat_destroy_cq: *mut c_void,
    pub _compat_create_srq: *mut c_void,
    pub _compat_modify_srq: *mut c_void,
    pub _compat_query_srq: *mut c_void,
    pub _compat_destroy_srq: *mut c_void,
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_create_qp: *mut c_void,
    pub _compat_query_qp: *mut c_void,
    pub _compat_modify_qp: *mut c_void,
    pub _compat_destroy_qp: *mut c_void,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: *mut c_void,
    pub _compat_destroy_ah: *mut c_void,
    pub _compat_attach_mcast: *mut c_void,
    pub _compat_detach_mcast: *mut c_void,
    pub _compat_async_event: *mut c_void,
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: PthreadMutex,
    pub abi_compat: *mut c_void,
}

pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
pub type QueryDeviceExFn = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;
pub type AdviseMrFn = unsafe extern "C" fn(*mut ibv_pd, c_int, u32, *mut ibv_sge, u32) -> c_int;
pub type RegDmMrFn =
    unsafe extern "C" fn(*mut ibv_pd, *mut ibv_dm, u64, usize, c_uint) -> *mut ibv_mr;
pub type AllocDmFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_alloc_dm_attr) -> *mut ibv_dm;
pub type QueryRtValuesFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int;
pub type CreateCqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;

/// `struct verbs_context`: extended ops at negative offsets from the
/// `ibv_context` the application holds. Slots we do not implement stay
/// NULL, which the header's inline wrappers turn into EOPNOTSUPP.
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: Option<AdviseMrFn>,
    pub alloc_null_mr: *mut c_void,
    pub read_counters: *mut c_void,
    pub attach_counters_point_flow: *mut c_void,
    pub create_counters: *mut c_void,
    pub destroy_counters: *mut c_void,
    pub reg_dm_mr: Option<RegDmMrFn>,
    pub alloc_dm: Option<AllocDmFn>,
    pub free_dm: Option<unsafe extern "C" fn(*mut ibv_dm) -> c_int>,
    pub modify_flow_action_esp: *mut c_void,
    pub destroy_flow_action: *mut c_void,
    pub create_flow_action_esp: *mut c_void,
    pub modify_qp_rate_limit: *mut c_void,
    pub alloc_parent_domain: Option<
        unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd,
    >,
    pub dealloc_td: Option<unsafe extern "C" fn(*mut ibv_td) -> c_int>,
    pub alloc_td:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_td_init_attr) -> *mut ibv_td>,
    pub modify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, *mut ibv_modify_cq_attr) -> c_int>,
    pub post_srq_ops:
        Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_ops_wr, *mut *mut ibv_ops_wr) -> c_int>,
    pub destroy_rwq_ind_table: *mut c_void,
    pub create_rwq_ind_table: *mut c_void,
    pub destroy_wq: *mut c_void,
    pub modify_wq: *mut c_void,
    pub create_wq: *mut c_void,
    pub query_rt_values: Option<QueryRtValuesFn>,
    pub create_cq_ex: Option<CreateCqExFn>,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    pub ibv_destroy_flow: *mut c_void,
    pub ABI_placeholder2: *mut c_void,
    pub ibv_create_flow: *mut c_void,
    pub ABI_placeholder1: *mut c_void,
    pub open_qp:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_open_attr) -> *mut ibv_qp>,
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Option<unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int>,
    pub create_srq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq>,
    pub open_xrcd:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd>,
    pub close_xrcd: Option<unsafe extern "C" fn(*mut ibv_xrcd) -> c_int>,
    pub _ABI_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    pub type_: c_int,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: PthreadMutex,
    pub cond: PthreadCond,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

type CqEx = *mut ibv_cq_ex;

/// `struct ibv_cq_ex`: an `ibv_cq` followed by the iterator-style poll API.
#[repr(C)]
pub struct ibv_cq_ex {
    pub cq: ibv_cq,
    pub comp_mask: u32,
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(CqEx, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(CqEx) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(CqEx)>,
    pub read_opcode: Option<unsafe extern "C" fn(CqEx) -> c_int>,
    pub read_vendor_err: Option<unsafe extern "C" fn(CqEx) -> u32>,
    pub read_byte_len: Option<unsafe extern "C" fn(CqEx) -> u32>,
    pub read_imm_data: Option<unsafe extern "C" fn(CqEx) -> u32>,
    pub read_qp_num: Option<unsafe extern "C" fn(CqEx) -> u32>,
    pub read_src_qp: Option<unsafe extern "C" fn(CqEx) -> u32>,
    pub read_wc_flags: Option<unsafe extern "C" fn(CqEx) -> c_uint>,
    pub read_slid: Option<unsafe extern "C" fn(CqEx) -> u32>,
    pub read_sl: Option<unsafe extern "C" fn(CqEx) -> u8>,
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(CqEx) -> u8>,
    pub read_completion_ts: Option<unsafe extern "C" fn(CqEx) -> u64>,
    pub read_cvlan: Option<unsafe extern "C" fn(CqEx) -> u16>,
    pub read_flow_tag: Option<unsafe extern "C" fn(CqEx) -> u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(CqEx, *mut ibv_wc_tm_info)>,
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(CqEx) -> u64>,
}

#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: PthreadMutex,
    pub cond: PthreadCond,
    pub events_completed: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_srq_init_attr_ex`: `ibv_srq_init_attr` first, then the
/// extended fields.
#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: c_int,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub cq: *mut ibv_cq,
    pub tm_cap: [u32; 2],
}

/// `struct ibv_ops_wr`: a tag matching list operation.
#[repr(C)]
pub struct ibv_ops_wr {
    pub wr_id: u64,
    pub next: *mut ibv_ops_wr,
    pub opcode: c_int,
    pub flags: c_int,
    pub unexpected_cnt: u32,
    pub handle: u32,
    pub recv_wr_id: u64,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub tag: u64,
    pub mask: u64,
}

/// `struct ibv_wc_tm_info`.
#[repr(C)]
pub struct ibv_wc_tm_info {
    pub tag: u64,
    pub priv_: u32,
}

// rdma-core 44's verbs.h on LP64 (not in the measured layout file).
const _: () = {
    assert!(size_of::<ibv_ops_wr>() == 72);
    assert!(std::mem::offset_of!(ibv_ops_wr, unexpected_cnt) == 24);
    assert!(std::mem::offset_of!(ibv_ops_wr, recv_wr_id) == 32);
    assert!(std::mem::offset_of!(ibv_ops_wr, num_sge) == 48);
    assert!(std::mem::offset_of!(ibv_ops_wr, tag) == 56);
    assert!(size_of::<ibv_wc_tm_info>() == 16);
    assert!(size_of::<ibv_srq_init_attr_ex>() == 64);
    assert!(std::mem::offset_of!(ibv_srq_init_attr_ex, comp_mask) == 20);
    assert!(std::mem::offset_of!(ibv_srq_init_attr_ex, pd) == 32);
    assert!(std::mem::offset_of!(ibv_srq_init_attr_ex, tm_cap) == 56);
};

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: PthreadMutex,
    pub cond: PthreadCond,
    pub events_completed: u32,
}

type QpEx = *mut ibv_qp_ex;

/// `struct ibv_qp_ex`: an `ibv_qp` followed by the builder-style post
/// API. The application writes `wr_id` and `wr_flags` before each opcode
/// call.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(QpEx, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(QpEx, u32, u64, u64)>,
    pub wr_bind_mw: Option<unsafe extern "C" fn(QpEx, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(QpEx, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(QpEx, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(QpEx, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(QpEx, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(QpEx)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(QpEx, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(QpEx, u32)>,
    pub wr_send_tso: Option<unsafe extern "C" fn(QpEx, *mut c_void, u16, u16)>,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(QpEx, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(QpEx, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(QpEx, *mut c_void, usize)>,
    pub wr_set_inline_data_list: Option<unsafe extern "C" fn(QpEx, usize, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(QpEx, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(QpEx, usize, *const ibv_sge)>,
    pub wr_start: Option<unsafe extern "C" fn(QpEx)>,
    pub wr_complete: Option<unsafe extern "C" fn(QpEx) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(QpEx)>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(QpEx, u32, u64, *const c_void)>,
}

#[repr(C)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

#[repr(C)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `union ibv_gid`: 16 bytes, 8-aligned (it overlays two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: wr_rdma,
    pub atomic: wr_atomic,
    pub ud: wr_ud,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_tso {
    pub hdr: *mut c_void,
    pub hdr_sz: u16,
    pub mss: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_ext {
    pub bind_mw: wr_bind_mw,
    pub tso: wr_tso,
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// `imm_data` (network order) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    pub ext: ibv_send_wr_ext,
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

/// `struct ibv_device_attr_ex`: the extensions uroce reports are named,
/// the rest kept as bytes (all zero).
#[repr(C)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub _pad: u32,
    pub odp_caps: [u64; 3],
    pub completion_timestamp_mask: u64,
    /// kHz.
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    /// TSO, RSS, WQ, packet pacing and raw packet capabilities (none).
    pub _ext: [u8; 60],
    /// `ibv_tm_caps`: `max_rndv_hdr_size`, `max_num_tags`, `flags`,
    /// `max_ops`, `max_sge`.
    pub tm_caps: [u32; 5],
    /// `max_cq_count`, `max_cq_period` (µs).
    pub cq_mod_caps: [u16; 2],
    pub _pad2: u32,
    pub max_dm_size: u64,
    pub _ext2: [u8; 8],
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_modify_cq_attr` (`ibv_modify_cq`).
#[repr(C)]
pub struct ibv_modify_cq_attr {
    pub attr_mask: u32,
    pub cq_count: u16,
    /// µs.
    pub cq_period: u16,
}

/// `IBV_CQ_ATTR_MODERATE`.
pub const IBV_CQ_ATTR_MODERATE: u32 = 1;

/// `struct ibv_xrcd`: an XRC domain.
#[repr(C)]
pub struct ibv_xrcd {
    pub context: *mut ibv_context,
}

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct ibv_xrcd_init_attr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

/// `struct ibv_qp_open_attr` (`ibv_open_qp`).
#[repr(C)]
pub struct ibv_qp_open_attr {
    pub comp_mask: u32,
    pub qp_num: u32,
    pub xrcd: *mut ibv_xrcd,
    pub qp_context: *mut c_void,
    pub qp_type: c_int,
}

/// `IBV_QP_OPEN_ATTR_NUM`, `_XRCD`, `_CONTEXT`, `_TYPE`, `_RESERVED`.
pub const IBV_QP_OPEN_ATTR_NUM: u32 = 1;
pub const IBV_QP_OPEN_ATTR_XRCD: u32 = 1 << 1;
pub const IBV_QP_OPEN_ATTR_CONTEXT: u32 = 1 << 2;
pub const IBV_QP_OPEN_ATTR_TYPE: u32 = 1 << 3;
pub const IBV_QP_OPEN_ATTR_RESERVED: u32 = 1 << 4;

/// `IBV_XRCD_INIT_ATTR_FD`, `_OFLAGS`.
pub const IBV_XRCD_INIT_ATTR_FD: u32 = 1;
pub const IBV_XRCD_INIT_ATTR_OFLAGS: u32 = 2;

/// `struct ibv_td`: a thread domain.
#[repr(C)]
pub struct ibv_td {
    pub context: *mut ibv_context,
}

/// `struct ibv_td_init_attr`.
#[repr(C)]
pub struct ibv_td_init_attr {
    pub comp_mask: u32,
}

/// `struct ibv_parent_domain_init_attr`.
#[repr(C)]
pub struct ibv_parent_domain_init_attr {
    pub pd: *mut ibv_pd,
    pub td: *mut ibv_td,
    pub comp_mask: u32,
    pub alloc: *mut c_void,
    pub free: *mut c_void,
    pub pd_context: *mut c_void,
}

/// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`, `_PD_CONTEXT`.
pub const IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS: u32 = 1;
pub const IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT: u32 = 2;

/// `struct ibv_dm`: device memory, reached through its copy functions.
#[repr(C)]
pub struct ibv_dm {
    pub context: *mut ibv_context,
    pub memcpy_to_dm: Option<unsafe extern "C" fn(*mut ibv_dm, u64, *const c_void, usize) -> c_int>,
    pub memcpy_from_dm: Option<unsafe extern "C" fn(*mut c_void, *mut ibv_dm, u64, usize) -> c_int>,
    pub comp_mask: u32,
    pub handle: u32,
}

/// `struct ibv_alloc_dm_attr`.
#[repr(C)]
pub struct ibv_alloc_dm_attr {
    pub length: usize,
    pub log_align_req: u32,
    pub comp_mask: u32,
}

/// `struct ibv_values_ex` (`ibv_query_rt_values_ex`).
#[repr(C)]
pub struct ibv_values_ex {
    pub comp_mask: u32,
    pub raw_clock: libc::timespec,
}

/// `IBV_VALUES_MASK_RAW_CLOCK`.
pub const IBV_VALUES_MASK_RAW_CLOCK: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// The bytes of `ibv_port_attr` the exported `ibv_query_port` writes (the
/// old `struct _compat_ibv_port_attr`, everything before `port_cap_flags2`).
pub const COMPAT_PORT_ATTR_LEN: usize = 48;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

#[repr(C)]
pub struct ibv_async_event {
    /// `element`: a CQ, QP, SRQ or WQ pointer, or a port number.
    pub element: *mut c_void,
    pub event_type: c_int,
}

/// Constants of `verbs.h` enums used by the implementation.
pub mod consts {
    use core::ffi::c_int;

    pub const IBV_NODE_CA: c_int = 1;
    pub const IBV_TRANSPORT_IB: c_int = 0;
    pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
    pub const IBV_PORT_DOWN: c_int = 1;
    pub const IBV_PORT_ACTIVE: c_int = 4;
    pub const IBV_ATOMIC_NONE: c_int = 0;
    pub const IBV_ATOMIC_GLOB: c_int = 2;

    pub const IBV_QPT_RC: c_int = 2;
    pub const IBV_QPT_UC: c_int = 3;
    pub const IBV_QPT_UD: c_int = 4;
    pub const IBV_QPT_XRC_SEND: c_int = 9;
    pub const IBV_QPT_XRC_RECV: c_int = 10;

    pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
    pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

    pub const IBV_QP_EX_WITH_RDMA_WRITE: u64 = 1 << 0;
    pub const IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
    pub const IBV_QP_EX_WITH_SEND: u64 = 1 << 2;
    pub const IBV_QP_EX_WITH_SEND_WITH_IMM: u64 = 1 << 3;
    pub const IBV_QP_EX_WITH_RDMA_READ: u64 = 1 << 4;
    pub const IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
    pub const IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
    pub const IBV_QP_EX_WITH_LOCAL_INV: u64 = 1 << 7;
    pub const IBV_QP_EX_WITH_BIND_MW: u64 = 1 << 8;
    pub const IBV_QP_EX_WITH_SEND_WITH_INV: u64 = 1 << 9;
    pub const IBV_QP_EX_WITH_ATOMIC_WRITE: u64 = 1 << 12;

    pub const IBV_SEND_INLINE: u32 = 1 << 3;

    pub const IBV_SRQ_MAX_WR: c_int = 1 << 0;
    pub const IBV_SRQ_LIMIT: c_int = 1 << 1;

    pub const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
    pub const IBV_CQ_INIT_ATTR_MASK_PD: u32 = 1 << 1;
    pub const IBV_WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
    pub const IBV_WC_EX_WITH_IMM: u64 = 1 << 1;
    pub const IBV_WC_EX_WITH_QP_NUM: u64 = 1 << 2;
    pub const IBV_WC_EX_WITH_SRC_QP: u64 = 1 << 3;
    pub const IBV_WC_EX_WITH_SLID: u64 = 1 << 4;
    pub const IBV_WC_EX_WITH_SL: u64 = 1 << 5;
    pub const IBV_WC_EX_WITH_DLID_PATH_BITS: u64 = 1 << 6;
    pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;
    pub const IBV_WC_EX_WITH_TM_INFO: u64 = 1 << 10;
    pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;
    /// The `wc_flags` an extended CQ of ours can report (no completion
    /// timestamps: `query_device_ex` reports no timestamp clock).
    pub const SUPPORTED_WC_EX: u64 = IBV_WC_EX_WITH_BYTE_LEN
        | IBV_WC_EX_WITH_IMM
        | IBV_WC_EX_WITH_QP_NUM
        | IBV_WC_EX_WITH_SRC_QP
        | IBV_WC_EX_WITH_SLID
        | IBV_WC_EX_WITH_SL
        | IBV_WC_EX_WITH_DLID_PATH_BITS
        | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
        | IBV_WC_EX_WITH_TM_INFO
        | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

    /// Access bits rdma-core defines as optional: a provider that does not
    /// know one ignores it (`IBV_ACCESS_OPTIONAL_RANGE`).
    pub const IBV_ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;
    /// `IBV_ACCESS_HUGETLB`: a hint, ignored.
    pub const IBV_ACCESS_HUGETLB: u32 = 1 << 7;

    pub const IBV_EVENT_CQ_ERR: c_int = 0;
    pub const IBV_EVENT_QP_FATAL: c_int = 1;
    pub const IBV_EVENT_QP_REQ_ERR: c_int = 2;
    pub const IBV_EVENT_QP_ACCESS_ERR: c_int = 3;
    pub const IBV_EVENT_SQ_DRAINED: c_int = 5;
    pub const IBV_EVENT_PORT_ACTIVE: c_int = 9;
    pub const IBV_EVENT_PORT_ERR: c_int = 10;
    pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;
    pub const IBV_EVENT_QP_LAST_WQE_REACHED: c_int = 16;

    /// `enum ibv_gid_type` (in `ibv_gid_entry`).
    pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
    /// `enum ibv_gid_type_sysfs` (what `ibv_query_gid_type` returns).
    pub const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};
    use std::collections::HashMap;

    /// `struct name` → (size, fields name → (offset, size)) from the
    /// measured layout.
    fn measured() -> HashMap<String, (usize, usize, HashMap<String, usize>)> {
        let text = include_str!("../tests/layout.txt");
        let mut out = HashMap::new();
        let mut cur: Option<String> = None;
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.first() == Some(&"struct") && w.get(2) == Some(&"size") {
                let size = w[3].parse().unwrap();
                let align = w[5].parse().unwrap();
                cur = Some(w[1].to_string());
                out.insert(w[1].to_string(), (size, align, HashMap::new()));
            } else if let (Some(c), Some(&"off")) = (&cur, w.get(1)) {
                out.get_mut(c).unwrap().2.insert(w[0].to_string(), w[2].parse().unwrap());
            } else if w.is_empty() {
                cur = None;
            }
        }
        out
    }

    macro_rules! check {
        ($m:expr, $ty:ident { $($c:literal => $($f:ident).+),* $(,)? }) => {{
            let (size, align, fields) = $m.get(stringify!($ty)).expect(stringify!($ty));
            assert_eq!(size_of::<$ty>(), *size, "sizeof {}", stringify!($ty));
            assert_eq!(align_of::<$ty>(), *align, "alignof {}", stringify!($ty));
            $(
                let want = fields.get($c).unwrap_or_else(|| panic!("{}.{} not measured", stringify!($ty), $c));
                assert_eq!(offset_of!($ty, $($f).+), *want, "{}.{}", stringify!($ty), $c);
            )*
        }};
    }

    #[test]
    fn layouts_match_rdma_core_44() {
        let m = measured();
        check!(m, ibv_device { "node_type" => node_type, "transport_type" => transport_type,
            "name" => name, "dev_name" => dev_name, "dev_path" => dev_path, "ibdev_path" => ibdev_path });
        check!(m, ibv_context_ops { "alloc_mw" => alloc_mw, "bind_mw" => bind_mw,
            "dealloc_mw" => dealloc_mw, "poll_cq" => poll_cq, "req_notify_cq" => req_notify_cq,
            "post_srq_recv" => post_srq_recv, "post_send" => post_send, "post_recv" => post_recv,
            "_compat_async_event" => _compat_async_event });
        check!(m, ibv_context { "device" => device, "ops" => ops, "cmd_fd" => cmd_fd,
            "async_fd" => async_fd, "ops.post_recv" => ops.post_recv });
        check!(m, verbs_context { "query_port" => query_port, "create_cq_ex" => create_cq_ex,
            "query_device_ex" => query_device_ex, "create_qp_ex" => create_qp_ex,
            "close_xrcd" => close_xrcd, "sz" => sz, "context" => context, "priv" => priv_,
            "_ABI_placeholder3" => _ABI_placeholder3, "open_xrcd" => open_xrcd,
            "open_qp" => open_qp });
        check!(m, ibv_pd { "context" => context, "handle" => handle });
        check!(m, ibv_mr { "addr" => addr, "length" => length, "handle" => handle,
            "lkey" => lkey, "rkey" => rkey });
        check!(m, ibv_mw { "rkey" => rkey, "handle" => handle, "type" => type_ });
        check!(m, ibv_dm { "context" => context, "memcpy_to_dm" => memcpy_to_dm,
            "memcpy_from_dm" => memcpy_from_dm, "comp_mask" => comp_mask, "handle" => handle });
        check!(m, ibv_alloc_dm_attr { "length" => length, "log_align_req" => log_align_req,
            "comp_mask" => comp_mask });
        check!(m, ibv_values_ex { "comp_mask" => comp_mask, "raw_clock" => raw_clock });
        check!(m, ibv_td { "context" => context });
        check!(m, ibv_modify_cq_attr { "attr_mask" => attr_mask, "moderate" => cq_count });
        check!(m, ibv_xrcd { "context" => context });
        check!(m, ibv_xrcd_init_attr { "comp_mask" => comp_mask, "fd" => fd, "oflags" => oflags });
        check!(m, ibv_qp_open_attr { "comp_mask" => comp_mask, "qp_num" => qp_num,
            "xrcd" => xrcd, "qp_context" => qp_context, "qp_type" => qp_type });
        check!(m, ibv_parent_domain_init_attr { "pd" => pd, "td" => td, "comp_mask" => comp_mask,
            "alloc" => alloc, "free" => free, "pd_context" => pd_context });
        check!(m, ibv_comp_channel { "fd" => fd, "refcnt" => refcnt });
        check!(m, ibv_cq { "channel" => channel, "cq_context" => cq_context, "handle" => handle,
            "cqe" => cqe, "mutex" => mutex, "cond" => cond,
            "comp_events_completed" => comp_events_completed,
            "async_events_completed" => async_events_completed });
        check!(m, ibv_cq_ex { "comp_mask" => comp_mask, "status" => status, "wr_id" => wr_id,
            "start_poll" => start_poll, "next_poll" => next_poll, "end_poll" => end_poll,
            "read_opcode" => read_opcode, "read_byte_len" => read_byte_len,
            "read_wc_flags" => read_wc_flags, "read_completion_ts" => read_completion_ts,
            "read_tm_info" => read_tm_info,
            "read_completion_wallclock_ns" => read_completion_wallclock_ns });
        check!(m, ibv_cq_init_attr_ex { "cqe" => cqe, "cq_context" => cq_context,
            "channel" => channel, "comp_vector" => comp_vector, "wc_flags" => wc_flags,
            "comp_mask" => comp_mask, "flags" => flags, "parent_domain" => parent_domain });
        check!(m, ibv_qp { "pd" => pd, "send_cq" => send_cq, "recv_cq" => recv_cq, "srq" => srq,
            "handle" => handle, "qp_num" => qp_num, "state" => state, "qp_type" => qp_type,
            "mutex" => mutex, "cond" => cond, "events_completed" => events_completed });
        check!(m, ibv_qp_ex { "qp_base" => qp_base, "comp_mask" => comp_mask, "wr_id" => wr_id,
            "wr_flags" => wr_flags, "wr_atomic_cmp_swp" => wr_atomic_cmp_swp,
            "wr_atomic_fetch_add" => wr_atomic_fetch_add, "wr_bind_mw" => wr_bind_mw,
            "wr_local_inv" => wr_local_inv, "wr_rdma_read" => wr_rdma_read,
            "wr_rdma_write" => wr_rdma_write, "wr_rdma_write_imm" => wr_rdma_write_imm,
            "wr_send" => wr_send, "wr_send_imm" => wr_send_imm, "wr_send_inv" => wr_send_inv,
            "wr_send_tso" => wr_send_tso, "wr_set_ud_addr" => wr_set_ud_addr,
            "wr_set_xrc_srqn" => wr_set_xrc_srqn, "wr_set_inline_data" => wr_set_inline_data,
            "wr_set_inline_data_list" => wr_set_inline_data_list, "wr_set_sge" => wr_set_sge,
            "wr_set_sge_list" => wr_set_sge_list, "wr_start" => wr_start,
            "wr_complete" => wr_complete, "wr_abort" => wr_abort,
            "wr_atomic_write" => wr_atomic_write });
        check!(m, ibv_qp_cap { "max_send_wr" => max_send_wr, "max_inline_data" => max_inline_data });
        check!(m, ibv_qp_init_attr { "srq" => srq, "cap" => cap, "qp_type" => qp_type,
            "sq_sig_all" => sq_sig_all });
        check!(m, ibv_qp_init_attr_ex { "cap" => cap, "qp_type" => qp_type,
            "comp_mask" => comp_mask, "pd" => pd, "xrcd" => xrcd, "create_flags" => create_flags,
            "max_tso_header" => max_tso_header, "rwq_ind_tbl" => rwq_ind_tbl,
            "rx_hash_conf" => rx_hash_conf, "source_qpn" => source_qpn,
            "send_ops_flags" => send_ops_flags });
        check!(m, ibv_global_route { "dgid" => dgid, "flow_label" => flow_label,
            "sgid_index" => sgid_index, "hop_limit" => hop_limit, "traffic_class" => traffic_class });
        check!(m, ibv_ah_attr { "grh" => grh, "dlid" => dlid, "sl" => sl,
            "src_path_bits" => src_path_bits, "static_rate" => static_rate,
            "is_global" => is_global, "port_num" => port_num });
        check!(m, ibv_qp_attr { "qp_state" => qp_state, "cur_qp_state" => cur_qp_state,
            "path_mtu" => path_mtu, "path_mig_state" => path_mig_state, "qkey" => qkey,
            "rq_psn" => rq_psn, "sq_psn" => sq_psn, "dest_qp_num" => dest_qp_num,
            "qp_access_flags" => qp_access_flags, "cap" => cap, "ah_attr" => ah_attr,
            "ah_attr.grh.dgid" => ah_attr.grh.dgid, "ah_attr.grh.sgid_index" => ah_attr.grh.sgid_index,
            "ah_attr.dlid" => ah_attr.dlid, "ah_attr.is_global" => ah_attr.is_global,
            "ah_attr.port_num" => ah_attr.port_num, "alt_ah_attr" => alt_ah_attr,
            "pkey_index" => pkey_index, "alt_pkey_index" => alt_pkey_index,
            "en_sqd_async_notify" => en_sqd_async_notify, "sq_draining" => sq_draining,
            "max_rd_atomic" => max_rd_atomic, "max_dest_rd_atomic" => max_dest_rd_atomic,
            "min_rnr_timer" => min_rnr_timer, "port_num" => port_num, "timeout" => timeout,
            "retry_cnt" => retry_cnt, "rnr_retry" => rnr_retry, "alt_port_num" => alt_port_num,
            "alt_timeout" => alt_timeout, "rate_limit" => rate_limit });
        check!(m, ibv_srq { "pd" => pd, "handle" => handle, "mutex" => mutex, "cond" => cond,
            "events_completed" => events_completed });
        check!(m, ibv_srq_attr { "max_wr" => max_wr, "max_sge" => max_sge, "srq_limit" => srq_limit });
        check!(m, ibv_srq_init_attr { "srq_context" => srq_context, "attr" => attr });
        check!(m, ibv_ah { "pd" => pd, "handle" => handle });
        check!(m, ibv_sge { "addr" => addr, "length" => length, "lkey" => lkey });
        check!(m, ibv_send_wr { "wr_id" => wr_id, "next" => next, "sg_list" => sg_list,
            "num_sge" => num_sge, "opcode" => opcode, "send_flags" => send_flags,
            "imm_data" => imm_data, "wr.rdma.remote_addr" => wr.rdma.remote_addr,
            "wr.rdma.rkey" => wr.rdma.rkey, "wr.atomic.compare_add" => wr.atomic.compare_add,
            "wr.atomic.swap" => wr.atomic.swap, "wr.atomic.rkey" => wr.atomic.rkey,
            "wr.ud.ah" => wr.ud.ah, "wr.ud.remote_qpn" => wr.ud.remote_qpn,
            "wr.ud.remote_qkey" => wr.ud.remote_qkey, "qp_type.xrc.remote_srqn" => remote_srqn,
            "bind_mw.mw" => ext.bind_mw.mw, "bind_mw.rkey" => ext.bind_mw.rkey,
            "bind_mw.bind_info" => ext.bind_mw.bind_info, "tso.hdr_sz" => ext.tso.hdr_sz,
            "tso.mss" => ext.tso.mss });
        check!(m, ibv_mw_bind_info { "mr" => mr, "addr" => addr, "length" => length,
            "mw_access_flags" => mw_access_flags });
        check!(m, ibv_recv_wr { "wr_id" => wr_id, "next" => next, "sg_list" => sg_list,
            "num_sge" => num_sge });
        check!(m, ibv_wc { "wr_id" => wr_id, "status" => status, "opcode" => opcode,
            "vendor_err" => vendor_err, "byte_len" => byte_len, "imm_data" => imm_data,
            "qp_num" => qp_num, "src_qp" => src_qp, "wc_flags" => wc_flags,
            "pkey_index" => pkey_index, "slid" => slid, "sl" => sl,
            "dlid_path_bits" => dlid_path_bits });
        check!(m, ibv_device_attr { "fw_ver" => fw_ver, "node_guid" => node_guid,
            "max_mr_size" => max_mr_size, "vendor_id" => vendor_id,
            "vendor_part_id" => vendor_part_id, "max_qp" => max_qp,
            "device_cap_flags" => device_cap_flags, "max_qp_rd_atom" => max_qp_rd_atom,
            "max_qp_init_rd_atom" => max_qp_init_rd_atom, "atomic_cap" => atomic_cap,
            "max_mw" => max_mw, "max_ah" => max_ah, "max_srq_sge" => max_srq_sge,
            "max_pkeys" => max_pkeys, "local_ca_ack_delay" => local_ca_ack_delay,
            "phys_port_cnt" => phys_port_cnt });
        check!(m, ibv_device_attr_ex { "orig_attr" => orig_attr, "comp_mask" => comp_mask,
            "odp_caps" => odp_caps, "completion_timestamp_mask" => completion_timestamp_mask,
            "hca_core_clock" => hca_core_clock, "device_cap_flags_ex" => device_cap_flags_ex,
            "cq_mod_caps" => cq_mod_caps, "max_dm_size" => max_dm_size,
            "xrc_odp_caps" => xrc_odp_caps, "tm_caps" => tm_caps,
            "phys_port_cnt_ex" => phys_port_cnt_ex });
        check!(m, ibv_port_attr { "state" => state, "max_mtu" => max_mtu,
            "active_mtu" => active_mtu, "gid_tbl_len" => gid_tbl_len,
            "port_cap_flags" => port_cap_flags, "max_msg_sz" => max_msg_sz,
            "pkey_tbl_len" => pkey_tbl_len, "lid" => lid, "lmc" => lmc,
            "active_width" => active_width, "active_speed" => active_speed,
            "phys_state" => phys_state, "link_layer" => link_layer, "flags" => flags,
            "port_cap_flags2" => port_cap_flags2 });
        check!(m, ibv_gid_entry { "gid" => gid, "gid_index" => gid_index, "port_num" => port_num,
            "gid_type" => gid_type, "ndev_ifindex" => ndev_ifindex });
        check!(m, ibv_async_event { "event_type" => event_type });
    }
}
