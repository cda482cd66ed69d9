//! Queue pairs: create (basic and extended), modify, query, destroy, the
//! `post_send` / `post_recv` ops, and multicast attach.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use uroce::{
    Access, AhAttr, AttrMask, LocalAckTimeout, Mtu, Path, Psn, QpAttr, QpCaps, QpState, QpType,
    RecvWr, RnrTimer, SendFlags, SendWr, Sge, WrOpcode,
};

use crate::abi::consts::*;
use crate::abi::*;
use crate::ffi::{Kind, guard, is_live, null_errno};
use crate::objects::EventLedger;
use crate::objects::live_cq;
use crate::objects::live_ctx;
use crate::objects::live_srq;
use crate::objects::live_xrcd;
use crate::objects::{AhBox, CtxBox, QpBox, SrqBox, XrcdBox, from_c, hold, into_c, obj, release};
use crate::objects::{live_pd, live_pd_ctx};

/// WRs converted per call into the engine.
const POST_BATCH: usize = 16;

/// The send opcodes an extended QP can be asked for (`send_ops_flags`).
const SUPPORTED_SEND_OPS: u64 = IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_ATOMIC_WRITE;

pub(crate) fn live_qp<'a>(qp: *mut ibv_qp) -> Option<&'a QpBox> {
    // SAFETY: dereferenced only once the registry says it is a live QP.
    is_live(qp.cast::<QpBox>(), Kind::Qp).then(|| unsafe { obj::<_, QpBox>(qp) }).flatten()
}

/// Creates a QP from the fields `ibv_qp_init_attr` and
/// `ibv_qp_init_attr_ex` share (the latter starts with the former's
/// fields), and reports the capabilities granted in `a.cap`, as providers
/// do.
fn create(
    c: &CtxBox,
    pd: *mut ibv_pd,
    a: &mut ibv_qp_init_attr,
    ex: bool,
) -> Result<*mut QpBox, c_int> {
    let p = live_pd(pd).ok_or(libc::EINVAL)?;
    let qp_type = match a.qp_type {
        IBV_QPT_RC => QpType::Rc,
        IBV_QPT_UC => QpType::Uc,
        IBV_QPT_UD => QpType::Ud,
        IBV_QPT_XRC_SEND => QpType::XrcSend,
        // XRC targets come from create_qp_ex with an XRC domain.
        IBV_QPT_XRC_RECV => return Err(libc::EINVAL),
        // Raw packet QPs (their frames through a packet socket, which
        // needs CAP_NET_RAW: EPERM without, as from the kernel).
        8 => QpType::RawPacket,
        // Driver QPs.
        0xff => return Err(libc::EOPNOTSUPP),
        _ => return Err(libc::EINVAL),
    };
    let scq = live_cq(a.send_cq).ok_or(libc::EINVAL)?;
    // An XRC initiator receives nothing: it has no receive CQ.
    let rcq = if qp_type == QpType::XrcSend && a.recv_cq.is_null() {
        scq
    } else {
        live_cq(a.recv_cq).ok_or(libc::EINVAL)?
    };
    if !Arc::ptr_eq(&scq.dev, &c.dev) || !Arc::ptr_eq(&rcq.dev, &c.dev) {
        return Err(libc::EINVAL);
    }
    let rcq_held = if a.recv_cq.is_null() { std::ptr::null() } else { std::ptr::from_ref(rcq) };
    let srq = if a.srq.is_null() { None } else { Some(live_srq(a.srq).ok_or(libc::EINVAL)?) };
    let mut cap = a.cap;
    if srq.is_some() {
        cap.max_recv_wr = 0;
        cap.max_recv_sge = 0;
    }
    let caps = QpCaps {
        max_send_wr: cap.max_send_wr,
        max_recv_wr: cap.max_recv_wr,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge,
        max_inline_data: cap.max_inline_data,
    };
    let init = uroce::QpInitAttr {
        send_cq: &scq.inner,
        recv_cq: &rcq.inner,
        cap: caps,
        qp_type,
        sq_sig_all: a.sq_sig_all != 0,
        srq: srq.map(|s| &s.inner),
    };
    let inner = p.inner.create_qp(&init).map_err(|e| e.errno())?;
    cap.max_inline_data = inner.cap().max_inline_data;
    let qpn = inner.qpn();
    // SAFETY: ibv_qp_ex is C data; all-zero is valid (NULL fn pointers,
    // static-initialiser mutex/cond).
    let mut qpx: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let base = &mut qpx.qp_base;
    base.context = c.ibv();
    base.qp_context = a.qp_context;
    base.pd = pd;
    base.send_cq = a.send_cq;
    base.recv_cq = a.recv_cq;
    base.srq = a.srq;
    base.handle = qpn;
    base.qp_num = qpn;
    base.state = QpState::Reset as c_int;
    base.qp_type = a.qp_type;
    crate::qp_ex::fill(&mut qpx);
    let b = into_c(
        QpBox {
            qpx: UnsafeCell::new(qpx),
            inner,
            dev: c.dev.clone(),
            pd: p,
            send_cq: scq,
            recv_cq: rcq_held,
            srq: srq.map_or(std::ptr::null(), |s| s as *const SrqBox),
            xrcd: std::ptr::null(),
            ind_table: std::ptr::null(),
            ex,
            cap,
            sq_sig_all: a.sq_sig_all != 0,
            builder: Mutex::new(crate::wr_batch::Builder::new(&cap)),
            posting: AtomicBool::new(false),
            async_events: EventLedger::default(),
            async_queue: c.async_queue.clone(),
        },
        Kind::Qp,
    );
    hold(&p.users);
    hold(&scq.users);
    if !rcq_held.is_null() {
        hold(&rcq.users);
    }
    if let Some(s) = srq {
        hold(&s.users);
    }
    c.dev.objects.qps.lock().unwrap_or_else(|e| e.into_inner()).insert(qpn, b as usize);
    a.cap = cap;
    Ok(b)
}

pub(crate) unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        let (Some((_, c)), false) = (live_pd_ctx(pd), attr.is_null()) else {
            return null_errno(libc::EINVAL);
        };
        // SAFETY: the caller passes a readable and writable init attr.
        let a = unsafe { &mut *attr };
        create(c, pd, a, false).map_or_else(null_errno, |b| b.cast())
    })
}

/// `verbs_context.create_qp_ex`.
pub(crate) unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        if attr.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: the caller passes a readable and writable init attr.
        let a = unsafe { &mut *attr };
        const CREATE_FLAGS: u32 = 1 << 2;
        const XRCD: u32 = 1 << 1;
        const IND_TABLE: u32 = 0x10;
        const RX_HASH: u32 = 0x20;
        let known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | CREATE_FLAGS | XRCD;
        if a.comp_mask & (IND_TABLE | RX_HASH) != 0 {
            // An RSS QP: raw packet, PD, table and hash; nothing else.
            let all = IND_TABLE | RX_HASH | IBV_QP_INIT_ATTR_PD | CREATE_FLAGS;
            if a.comp_mask & (IND_TABLE | RX_HASH) != IND_TABLE | RX_HASH
                || a.comp_mask & !all != 0
                || a.create_flags != 0
                || a.qp_type != 8
            {
                return null_errno(libc::EINVAL);
            }
            let Some(p) = live_pd(a.pd) else { return null_errno(libc::EINVAL) };
            return match create_rss_qp(c, p, a.rwq_ind_tbl, &a.rx_hash_conf) {
                Ok((inner, table)) => rss_box(c, p, a.pd, inner, table, a.qp_context).cast(),
                Err(e) => null_errno(e),
            };
        }
        if a.qp_type == IBV_QPT_XRC_RECV {
            if a.comp_mask & XRCD == 0 {
                return null_errno(libc::EINVAL);
            }
            return create_xrc_target(c, a.xrcd.cast(), a.qp_context)
                .map_or_else(null_errno, |b| b.cast());
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return null_errno(libc::EINVAL);
        }
        if a.comp_mask & !known != 0 || (a.comp_mask & CREATE_FLAGS != 0 && a.create_flags != 0) {
            return null_errno(libc::EOPNOTSUPP);
        }
        let ex = a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
        if ex && a.send_ops_flags & !SUPPORTED_SEND_OPS != 0 {
            return null_errno(libc::EOPNOTSUPP);
        }
        // SAFETY: a live PD's public struct is readable.
        if live_pd(a.pd).is_none_or(|p| unsafe { (*p.pd.get()).context } != context) {
            return null_errno(libc::EINVAL);
        }
        let pd = a.pd;
        // SAFETY: `ibv_qp_init_attr_ex` begins with `ibv_qp_init_attr`'s
        // fields (same offsets), and create() writes only `cap` back; `a`
        // is not used past this point.
        let common = unsafe { &mut *attr.cast::<ibv_qp_init_attr>() };
        create(c, pd, common, ex).map_or_else(null_errno, |b| b.cast())
    })
}

pub(crate) unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    guard(std::ptr::null_mut(), || match live_qp(qp) {
        Some(b) if b.ex => b.qpx.get(),
        _ => std::ptr::null_mut(),
    })
}

pub(crate) unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_qp(qp) else { return libc::EINVAL };
        // SAFETY: a QP holds its context's device, PD, CQs and SRQ (use
        // counts), so all are live.
        unsafe {
            let mut qps = b.dev.objects.qps.lock().unwrap_or_else(|e| e.into_inner());
            if qps.get(&b.inner.qpn()) == Some(&(qp as usize)) {
                qps.remove(&b.inner.qpn());
            }
            drop(qps);
            // As rdma-core: every async event handed out for it must have
            // been acknowledged first.
            b.async_events.wait_all_acknowledged();
            // An XRC target has none of these but its domain.
            for users in [
                b.pd.as_ref().map(|p| &p.users),
                b.send_cq.as_ref().map(|c| &c.users),
                b.recv_cq.as_ref().map(|c| &c.users),
                b.srq.as_ref().map(|s| &s.users),
                b.xrcd.as_ref().map(|x| &x.users),
                b.ind_table.as_ref().map(|t| &t.users),
            ]
            .into_iter()
            .flatten()
            {
                release(users);
            }
        }
        // SAFETY: registered as a QP ⇒ made by into_c::<QpBox>.
        drop(unsafe { from_c(qp.cast::<QpBox>(), Kind::Qp) });
        0
    })
}

/// The destination of an address vector (RoCE: the GRH's destination GID).
pub(crate) fn av_dest(c: &uroce::Context, ah: &ibv_ah_attr) -> Result<AhAttr, c_int> {
    if ah.is_global == 0 {
        // RoCE has no LIDs: every address vector needs a GRH.
        return Err(libc::EINVAL);
    }
    let tbl = c.query_port(1).map_or(1, |p| p.gid_tbl_len);
    if u32::from(ah.grh.sgid_index) >= tbl {
        return Err(libc::EINVAL);
    }
    let mut a = AhAttr::from_gid(ah.grh.dgid.raw);
    a.port = c.device().socket_addr().port();
    a.sgid_index = ah.grh.sgid_index;
    a.hop_limit = ah.grh.hop_limit;
    a.traffic_class = ah.grh.traffic_class;
    a.flow_label = ah.grh.flow_label & 0xfffff;
    if a.dst.is_unspecified() {
        return Err(libc::EINVAL);
    }
    Ok(a)
}

fn state_of(v: c_int) -> Result<QpState, c_int> {
    u32::try_from(v).ok().and_then(QpState::from_ibv).ok_or(libc::EINVAL)
}

/// uroce's attributes from `ibv_qp_attr`, the fields `mask` names.
fn to_attr(c: &uroce::Context, a: &ibv_qp_attr, mask: AttrMask) -> Result<QpAttr, c_int> {
    let mut q = QpAttr::default();
    if mask.contains(AttrMask::STATE) {
        q.state = state_of(a.qp_state)?;
    }
    if mask.contains(AttrMask::CUR_STATE) {
        q.cur_state = state_of(a.cur_qp_state)?;
    }
    q.access = Access(a.qp_access_flags);
    q.pkey_index = a.pkey_index;
    q.port = a.port_num;
    q.qkey = a.qkey;
    if mask.contains(AttrMask::AV) {
        let d = av_dest(c, &a.ah_attr)?;
        q.path = Some(Path {
            dst: d.dst,
            dst_port: d.port,
            sgid_index: d.sgid_index,
            flow_label: d.flow_label,
            hop_limit: d.hop_limit,
            traffic_class: d.traffic_class,
        });
    }
    if mask.contains(AttrMask::PATH_MTU) {
        q.path_mtu = u32::try_from(a.path_mtu).ok().and_then(Mtu::from_ibv).ok_or(libc::EINVAL)?;
    }
    if mask.contains(AttrMask::TIMEOUT) {
        q.timeout = LocalAckTimeout::new(a.timeout).ok_or(libc::EINVAL)?;
    }
    q.retry_cnt = a.retry_cnt;
    q.rnr_retry = a.rnr_retry;
    q.rq_psn = Psn::new(a.rq_psn & 0xff_ffff);
    q.sq_psn = Psn::new(a.sq_psn & 0xff_ffff);
    q.max_rd_atomic = a.max_rd_atomic;
    q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    q.min_rnr_timer = RnrTimer::from_code(a.min_rnr_timer & 0x1f);
    q.dest_qpn = a.dest_qp_num & 0xff_ffff;
    q.sq_draining_notify = a.en_sqd_async_notify != 0;
    Ok(q)
}

pub(crate) unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_qp(qp) else { return libc::EINVAL };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller passes a readable attribute struct.
        let a = unsafe { &*attr };
        let mask = AttrMask(mask as u32);
        let q = match to_attr(&b.dev.ctx, a, mask) {
            Ok(q) => q,
            Err(e) => return e,
        };
        if let Err(e) = b.inner.modify(&q, mask) {
            return e.errno();
        }
        if mask.contains(AttrMask::STATE) {
            // SAFETY: live QP; rdma-core keeps `qp->state` current.
            unsafe { (*b.qpx.get()).qp_base.state = a.qp_state };
        }
        0
    })
}

/// The GID a path's destination is named by.
fn gid_of(ip: IpAddr) -> ibv_gid {
    ibv_gid { raw: uroce::wire::grh::gid_of(ip) }
}

pub(crate) unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        let Some(b) = live_qp(qp) else { return libc::EINVAL };
        if attr.is_null() || init_attr.is_null() {
            return libc::EINVAL;
        }
        let q = b.inner.query();
        let mut a = ibv_qp_attr {
            qp_state: q.state as c_int,
            cur_qp_state: q.state as c_int,
            path_mtu: q.path_mtu.to_ibv() as c_int,
            qkey: q.qkey,
            rq_psn: q.rq_psn.value(),
            sq_psn: q.sq_psn.value(),
            dest_qp_num: q.dest_qpn,
            qp_access_flags: q.access.0,
            cap: b.cap,
            pkey_index: q.pkey_index,
            en_sqd_async_notify: u8::from(q.sq_draining_notify),
            sq_draining: u8::from(q.state == QpState::SendQueueDrain),
            max_rd_atomic: q.max_rd_atomic,
            max_dest_rd_atomic: q.max_dest_rd_atomic,
            min_rnr_timer: q.min_rnr_timer.code(),
            port_num: q.port,
            timeout: q.timeout.exponent(),
            retry_cnt: q.retry_cnt,
            rnr_retry: q.rnr_retry,
            ..ibv_qp_attr::default()
        };
        if let Some(p) = q.path {
            a.ah_attr = ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: gid_of(p.dst),
                    flow_label: p.flow_label,
                    sgid_index: p.sgid_index,
                    hop_limit: p.hop_limit,
                    traffic_class: p.traffic_class,
                },
                is_global: 1,
                port_num: q.port,
                ..ibv_ah_attr::default()
            };
        }
        // SAFETY: live QP; its public struct is ours to read and update.
        let base = unsafe { &mut (*b.qpx.get()).qp_base };
        base.state = q.state as c_int;
        // SAFETY: the caller passes writable attribute structs.
        unsafe {
            attr.write(a);
            init_attr.write(ibv_qp_init_attr {
                qp_context: base.qp_context,
                send_cq: base.send_cq,
                recv_cq: base.recv_cq,
                srq: base.srq,
                cap: b.cap,
                qp_type: base.qp_type,
                sq_sig_all: c_int::from(b.sq_sig_all),
            });
        }
        0
    })
}

pub(crate) unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: c_int,
    _flags: u32,
) -> c_int {
    // No in-order data placement guarantee is offered (0 = none).
    0
}

/// The SGE list of a C WR as uroce SGEs (same layout: no copy).
///
/// # Safety
/// `list` is NULL or points at `n` (at most `max`) readable `ibv_sge`s that
/// stay valid for the returned lifetime.
unsafe fn sges<'a>(list: *const ibv_sge, n: c_int, max: u32) -> Result<&'a [Sge], c_int> {
    match n {
        0 => Ok(&[]),
        // Counted before the list is read, as rxe does.
        n if n < 0 || n as u32 > max || list.is_null() => Err(libc::EINVAL),
        // SAFETY: per the contract; `Sge` is `repr(C)` like `ibv_sge`.
        n => Ok(unsafe { std::slice::from_raw_parts(list.cast::<Sge>(), n as usize) }),
    }
}

/// The WR's `imm_data` / `invalidate_rkey` as uroce takes it: immediate
/// data is a `__be32` whose bytes go on the wire as they are (uroce takes
/// the value and sends it big-endian), an R_Key to invalidate is a host
/// order number.
pub(crate) fn imm_to_uroce(opcode: WrOpcode, raw: u32) -> u32 {
    match opcode {
        WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm => u32::from_be(raw),
        _ => raw,
    }
}

/// One `ibv_send_wr` as a uroce WR.
///
/// # Safety
/// `w` is a readable WR whose SGE list and AH are valid for `'a`.
unsafe fn send_wr<'a>(
    w: &'a ibv_send_wr,
    qp_type: QpType,
    max_sge: u32,
) -> Result<SendWr<'a>, c_int> {
    let opcode = u32::try_from(w.opcode).ok().and_then(WrOpcode::from_ibv).ok_or(libc::EINVAL)?;
    if matches!(opcode, WrOpcode::AtomicWrite | WrOpcode::Flush) {
        // `struct ibv_send_wr` has no room for their operands: the
        // `ibv_wr_*` API posts them (as rxe's provider takes them).
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let sgl = unsafe { sges(w.sg_list, w.num_sge, max_sge) }?;
    let mut wr = SendWr {
        wr_id: w.wr_id,
        opcode,
        flags: SendFlags(w.send_flags & 0xf),
        sgl,
        imm_or_inv: imm_to_uroce(opcode, w.imm_data),
        xrc_srqn: if qp_type == QpType::XrcSend { w.remote_srqn } else { 0 },
        ..SendWr::default()
    };
    if opcode.is_atomic() {
        // SAFETY: the union member the opcode selects.
        let a = unsafe { w.wr.atomic };
        wr.remote_addr = a.remote_addr;
        wr.rkey = a.rkey;
        wr.compare_add = a.compare_add;
        wr.swap = a.swap;
    } else if qp_type == QpType::Ud {
        // SAFETY: the union member a UD QP uses.
        let u = unsafe { w.wr.ud };
        // SAFETY: per the contract, an AH of ours (or NULL).
        let ah = unsafe { obj::<_, AhBox>(u.ah) }.ok_or(libc::EINVAL)?;
        wr.ud = Some(ah.inner.dest(u.remote_qpn & 0xff_ffff, u.remote_qkey));
    } else {
        // SAFETY: the union member RDMA opcodes use (unused otherwise).
        let r = unsafe { w.wr.rdma };
        wr.remote_addr = r.remote_addr;
        wr.rkey = r.rkey;
    }
    if opcode == WrOpcode::BindMw {
        // SAFETY: the union member a BIND_MW WR uses.
        let b = unsafe { w.ext.bind_mw };
        wr.bind = Some(crate::mw::type2_bind(b.mw, b.rkey, &b.bind_info)?);
    }
    Ok(wr)
}

/// `ops.post_send`.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: a live QP of ours (hot path: no registry).
        let Some(b) = (unsafe { obj::<_, QpBox>(qp) }) else {
            if !bad_wr.is_null() {
                // SAFETY: the caller passes NULL or a writable pointer.
                unsafe { *bad_wr = wr };
            }
            return libc::EINVAL;
        };
        let (qp_type, max_sge) = (b.inner.qp_type(), b.cap.max_send_sge);
        post_chain(
            wr,
            bad_wr,
            SendWr::default(),
            |w| {
                // SAFETY: the caller's WR chain, SGE lists and AHs are
                // readable during the call.
                unsafe { send_wr(w, qp_type, max_sge) }
            },
            // SAFETY: the verbs contract: an inline WR's SGEs point to
            // memory the caller lets us read during the call (no L_Key).
            |wrs| unsafe { b.inner.post_send_unchecked_inline(wrs) },
        )
    })
}

/// `ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract: a live QP of ours (hot path).
        let b = unsafe { obj::<_, QpBox>(qp) };
        let max_sge = b.map_or(0, |b| b.cap.max_recv_sge);
        post_recv_chain(wr, bad_wr, max_sge, |wrs| match b {
            Some(b) => b.inner.post_recv(wrs),
            None => Err(uroce::Error::InvalidArgument("NULL QP")),
        })
    })
}

/// Converts a receive WR chain in batches and hands each to `post`
/// (a QP's or an SRQ's receive queue).
pub(crate) fn post_recv_chain(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    max_sge: u32,
    post: impl Fn(&[RecvWr<'_>]) -> uroce::Result<()>,
) -> c_int {
    post_chain(
        wr,
        bad_wr,
        RecvWr { wr_id: 0, sgl: &[] },
        |w| {
            // SAFETY: the caller's WR chain and SGE lists are readable
            // during the call.
            let sgl = unsafe { sges(w.sg_list, w.num_sge, max_sge) }?;
            Ok(RecvWr { wr_id: w.wr_id, sgl })
        },
        post,
    )
}

/// A link of a C work-request chain.
trait ChainedWr {
    fn next_wr(&self) -> *mut Self;
}

impl ChainedWr for ibv_send_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

impl ChainedWr for ibv_recv_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

/// Walks a C WR chain, converting each WR with `convert` and handing them
/// to `post` in batches (no allocation). WRs before a bad one are posted;
/// the bad one is reported in `bad_wr` with its errno, as providers do.
fn post_chain<'a, C: ChainedWr + 'a, W: Copy>(
    wr: *mut C,
    bad_wr: *mut *mut C,
    empty: W,
    convert: impl Fn(&'a C) -> Result<W, c_int>,
    post: impl Fn(&[W]) -> uroce::Result<()>,
) -> c_int {
    let fail = |w: *mut C, e: c_int| {
        if !bad_wr.is_null() {
            // SAFETY: the caller passes NULL or a writable pointer.
            unsafe { *bad_wr = w };
        }
        e
    };
    // The WR that uroce's error index names.
    let posted = |ptrs: &[*mut C], r: uroce::Result<()>| match r {
        Ok(()) => Ok(()),
        Err(err) => {
            let i = match err {
                uroce::Error::Post { index, .. } => index.min(ptrs.len().saturating_sub(1)),
                _ => 0,
            };
            Err((ptrs.get(i).copied().unwrap_or(wr), err.errno()))
        }
    };
    // One WR (the usual post: perftest, UCX, MPI post one per call):
    // no batch arrays to fill, which cost more than the post itself.
    // SAFETY: the caller's WR chain is readable during the call.
    if let Some(w) = unsafe { wr.as_ref() }
        && w.next_wr().is_null()
    {
        return match convert(w) {
            Ok(x) => match posted(&[wr], post(&[x])) {
                Ok(()) => 0,
                Err((bad, e)) => fail(bad, e),
            },
            Err(e) => fail(wr, e),
        };
    }
    let mut batch = [empty; POST_BATCH];
    let mut ptrs = [std::ptr::null_mut::<C>(); POST_BATCH];
    let mut next = wr;
    while !next.is_null() {
        let mut n = 0;
        while n < POST_BATCH && !next.is_null() {
            // SAFETY: the caller's WR chain is readable during the call.
            let w: &'a C = unsafe { &*next };
            match convert(w) {
                Ok(x) => batch[n] = x,
                Err(e) => {
                    // Post what came before, then report this one.
                    return match posted(&ptrs[..n], post(&batch[..n])) {
                        Ok(()) => fail(next, e),
                        Err((bad, e)) => fail(bad, e),
                    };
                }
            }
            ptrs[n] = next;
            n += 1;
            next = w.next_wr();
        }
        if let Err((bad, e)) = posted(&ptrs[..n], post(&batch[..n])) {
            return fail(bad, e);
        }
    }
    0
}

fn mcast_ip(gid: *const ibv_gid) -> Option<IpAddr> {
    // SAFETY: NULL or a readable GID.
    let g = unsafe { gid.as_ref() }?;
    Some(AhAttr::from_gid(g.raw).dst)
}

pub(crate) unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard(libc::EIO, || {
        let (Some(b), Some(ip)) = (live_qp(qp), mcast_ip(gid)) else { return libc::EINVAL };
        b.inner.attach_mcast(ip).map_or_else(|e| e.errno(), |()| 0)
    })
}

pub(crate) unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard(libc::EIO, || {
        let (Some(b), Some(ip)) = (live_qp(qp), mcast_ip(gid)) else { return libc::EINVAL };
        b.inner.detach_mcast(ip).map_or_else(|e| e.errno(), |()| 0)
    })
}

/// An XRC target QP of domain `xrcd` (`ibv_create_qp_ex` with
/// `IBV_QPT_XRC_RECV`): no PD, CQs or queues.
fn create_xrc_target(
    c: &CtxBox,
    xrcd: *mut ibv_xrcd,
    qp_context: *mut c_void,
) -> Result<*mut QpBox, c_int> {
    let x = live_xrcd(xrcd).ok_or(libc::EINVAL)?;
    // SAFETY: a live domain's public struct.
    if unsafe { (*x.xrcd.get()).context } != c.ibv() {
        return Err(libc::EINVAL);
    }
    let inner = x.inner.create_target_qp().map_err(|e| e.errno())?;
    Ok(target_box(c, x, inner, qp_context))
}

/// `verbs_context.open_qp` (`ibv_open_qp`): another handle to an XRC
/// target QP of a domain, by number; the QP lives while any handle does.
pub(crate) unsafe extern "C" fn open_qp(
    context: *mut ibv_context,
    attr: *mut ibv_qp_open_attr,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        let Some(c) = live_ctx(context) else { return null_errno(libc::EINVAL) };
        if attr.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: the caller passes a readable open attr.
        let a = unsafe { &*attr };
        // rdma-core's checks, then the kernel's (a target QP only).
        if a.comp_mask >= IBV_QP_OPEN_ATTR_RESERVED {
            return null_errno(libc::EOPNOTSUPP);
        }
        let needed = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
        if a.comp_mask & needed != needed || a.qp_type != IBV_QPT_XRC_RECV {
            return null_errno(libc::EINVAL);
        }
        let Some(x) = live_xrcd(a.xrcd) else { return null_errno(libc::EINVAL) };
        // SAFETY: a live domain's public struct.
        if unsafe { (*x.xrcd.get()).context } != context {
            return null_errno(libc::EINVAL);
        }
        let qp_context = if a.comp_mask & IBV_QP_OPEN_ATTR_CONTEXT != 0 {
            a.qp_context
        } else {
            std::ptr::null_mut()
        };
        match x.inner.open_target_qp(a.qp_num) {
            Ok(inner) => target_box(c, x, inner, qp_context).cast(),
            Err(e) => null_errno(e.errno()),
        }
    })
}

/// The C handle of an RSS QP: its PD and indirection table held, no CQs
/// or queues of its own.
fn rss_box(
    c: &CtxBox,
    p: &crate::objects::PdBox,
    pd: *mut ibv_pd,
    inner: uroce::Qp,
    table: *const crate::objects::RwqBox,
    qp_context: *mut c_void,
) -> *mut QpBox {
    crate::objects::hold(&p.users);
    let bare = Bare { qp_type: 8, pd: (pd, p), xrcd: std::ptr::null(), ind_table: table };
    bare_box(c, inner, qp_context, bare)
}

/// What a QP without CQs or queues of its own holds (an XRC target: its
/// domain; an RSS QP: its PD and indirection table).
struct Bare {
    qp_type: c_int,
    pd: (*mut ibv_pd, *const crate::objects::PdBox),
    xrcd: *const XrcdBox,
    ind_table: *const crate::objects::RwqBox,
}

/// The C handle of a QP without CQs or queues of its own; its caller
/// has taken the use counts of what `bare` names.
fn bare_box(c: &CtxBox, inner: uroce::Qp, qp_context: *mut c_void, bare: Bare) -> *mut QpBox {
    let qpn = inner.qpn();
    // SAFETY: ibv_qp_ex is C data; all-zero is valid (NULL fn pointers,
    // static-initialiser mutex/cond).
    let mut qpx: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let base = &mut qpx.qp_base;
    base.context = c.ibv();
    base.qp_context = qp_context;
    base.pd = bare.pd.0;
    base.handle = qpn;
    base.qp_num = qpn;
    base.state = inner.query().state as c_int;
    base.qp_type = bare.qp_type;
    let cap = ibv_qp_cap::default();
    into_c(
        QpBox {
            qpx: UnsafeCell::new(qpx),
            inner,
            dev: c.dev.clone(),
            pd: bare.pd.1,
            send_cq: std::ptr::null(),
            recv_cq: std::ptr::null(),
            srq: std::ptr::null(),
            xrcd: bare.xrcd,
            ind_table: bare.ind_table,
            ex: false,
            cap,
            sq_sig_all: false,
            builder: Mutex::new(crate::wr_batch::Builder::new(&cap)),
            posting: AtomicBool::new(false),
            async_events: EventLedger::default(),
            async_queue: c.async_queue.clone(),
        },
        Kind::Qp,
    )
}

/// The C handle of an XRC target QP (made or opened): no PD, CQs or
/// queues, its domain held.
fn target_box(c: &CtxBox, x: &XrcdBox, inner: uroce::Qp, qp_context: *mut c_void) -> *mut QpBox {
    let qpn = inner.qpn();
    let null = (std::ptr::null_mut(), std::ptr::null());
    let bare = Bare { qp_type: IBV_QPT_XRC_RECV, pd: null, xrcd: x, ind_table: std::ptr::null() };
    let b = bare_box(c, inner, qp_context, bare);
    hold(&x.users);
    // Async events go to the first live handle of the QP.
    c.dev.objects.qps.lock().unwrap_or_else(|e| e.into_inner()).entry(qpn).or_insert(b as usize);
    b
}

/// An RSS raw packet QP of `pd` over indirection table `tbl`, by `hash`
/// (`ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_RX_HASH | _IND_TABLE`).
pub(crate) fn create_rss_qp(
    c: &CtxBox,
    pd: &crate::objects::PdBox,
    tbl: *mut c_void,
    hash: &ibv_rx_hash_conf,
) -> Result<(uroce::Qp, *const crate::objects::RwqBox), c_int> {
    if !is_live(tbl.cast::<crate::objects::RwqBox>(), Kind::RwqIndTable) {
        return Err(libc::EINVAL);
    }
    // SAFETY: a live table of ours (checked just above).
    let t = unsafe { &*tbl.cast::<crate::objects::RwqBox>() };
    const TOEPLITZ: u8 = 1;
    if hash.rx_hash_function != TOEPLITZ {
        return Err(libc::EOPNOTSUPP);
    }
    if hash.rx_hash_key.is_null() && hash.rx_hash_key_len != 0 {
        return Err(libc::EINVAL);
    }
    let key = if hash.rx_hash_key_len == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller gives `rx_hash_key_len` readable key bytes.
        unsafe { std::slice::from_raw_parts(hash.rx_hash_key, usize::from(hash.rx_hash_key_len)) }
            .to_vec()
    };
    let _ = c;
    let qp = pd
        .inner
        .create_rss_qp(&t.inner, uroce::raw::RxHash { fields: hash.rx_hash_fields_mask, key })
        .map_err(|e| e.errno())?;
    hold(&t.users);
    Ok((qp, std::ptr::from_ref(t)))
}
