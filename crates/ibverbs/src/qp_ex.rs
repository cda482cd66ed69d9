//! The extended QP's builder-style post API (`ibv_wr_start`, one opcode
//! call per WR after the application sets `qpx->wr_id` / `qpx->wr_flags`,
//! `ibv_wr_set_sge` / `_inline_data` / `_ud_addr`, `ibv_wr_complete`).
//! WRs collect in the QP's [`Builder`] and go to the engine together at
//! `ibv_wr_complete`; its buffers keep their capacity, so a steady stream
//! of posts allocates nothing.

use std::ffi::{c_int, c_void};

use uroce::{SendFlags, SendWr, Sge, WrOpcode};

use crate::abi::*;
use crate::ffi::guard;
use crate::objects::{AhBox, QpBox, enter, leave, obj};
use crate::wr_batch::{Builder, Pending};

/// Fills the function pointers of a new QP's `ibv_qp_ex`.
pub(crate) fn fill(q: &mut ibv_qp_ex) {
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_bind_mw = Some(wr_bind_mw);
    q.wr_local_inv = Some(wr_local_inv);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_send_inv = Some(wr_send_inv);
    q.wr_send_tso = Some(wr_send_tso);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
    q.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
    q.wr_atomic_write = Some(wr_atomic_write);
}

/// Runs `f` on the QP's builder (nothing if `qp` is NULL).
fn with(qp: *mut ibv_qp_ex, f: impl FnOnce(&QpBox, &mut Builder)) {
    guard((), || {
        // SAFETY: verbs contract: a live QP of ours (hot path).
        let Some(b) = (unsafe { obj::<_, QpBox>(qp) }) else { return };
        let mut builder = b.builder.lock().unwrap_or_else(|e| e.into_inner());
        f(b, &mut builder);
    });
}

/// Starts a WR of `opcode` with the `wr_id` / `wr_flags` the application
/// just stored in the QP.
fn begin(qp: *mut ibv_qp_ex, opcode: WrOpcode, set: impl FnOnce(&mut Pending)) {
    with(qp, |b, bl| {
        // SAFETY: a live QP; the application wrote these two fields.
        let (wr_id, flags) = unsafe { ((*b.qpx.get()).wr_id, (*b.qpx.get()).wr_flags) };
        let mut p = Pending {
            wr_id,
            flags: SendFlags(flags & 0xf),
            opcode,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            imm: 0,
            ud: None,
            bind: None,
            xrc_srqn: 0,
            sge: (bl.sges.len(), 0),
            inline: None,
        };
        set(&mut p);
        bl.wrs.push(p);
    });
}

/// Applies `f` to the WR being built (an error if there is none).
fn last(qp: *mut ibv_qp_ex, f: impl FnOnce(&mut Builder, usize)) {
    with(qp, |_, bl| match bl.wrs.len() {
        0 => bl.err = libc::EINVAL,
        n => f(bl, n - 1),
    });
}

/// Opens the QP's posting section (other threads' `ibv_wr_start` wait
/// until this one's `ibv_wr_complete` or `ibv_wr_abort`).
unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    guard((), || {
        // SAFETY: verbs contract: a live QP of ours (hot path).
        if let Some(b) = unsafe { obj::<_, QpBox>(qp) } {
            enter(&b.posting);
        }
    });
    with(qp, |_, bl| bl.clear());
}

/// Closes the posting section.
fn end(qp: *mut ibv_qp_ex) {
    // SAFETY: verbs contract: a live QP of ours (hot path).
    if let Some(b) = unsafe { obj::<_, QpBox>(qp) } {
        leave(&b.posting);
    }
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    with(qp, |_, bl| bl.clear());
    end(qp);
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    // Stays EIO if the post panics (with() swallows the panic).
    let mut ret = libc::EIO;
    with(qp, |b, bl| {
        ret = complete(b, bl);
        bl.clear();
    });
    end(qp);
    ret
}

/// Posts the builder's WRs in batches.
fn complete(b: &QpBox, bl: &Builder) -> c_int {
    if bl.err != 0 {
        return bl.err;
    }
    // All or nothing, as a NIC's provider does it: a batch the send
    // queue cannot take whole is refused (ENOMEM) and nothing is posted.
    if bl.wrs.len() > b.inner.send_queue_room() as usize {
        return libc::ENOMEM;
    }
    const BATCH: usize = 16;
    let mut batch = [SendWr::default(); BATCH];
    for chunk in bl.wrs.chunks(BATCH) {
        for (slot, p) in batch.iter_mut().zip(chunk) {
            let (s, n) = p.sge;
            let inline = p.inline.map(|(s, n)| &bl.bytes[s..s + n]);
            *slot = SendWr {
                wr_id: p.wr_id,
                opcode: p.opcode,
                flags: if inline.is_some() { p.flags | SendFlags::INLINE } else { p.flags },
                sgl: &bl.sges[s..s + n],
                inline_data: inline,
                imm_or_inv: p.imm,
                remote_addr: p.remote_addr,
                rkey: p.rkey,
                compare_add: p.compare_add,
                swap: p.swap,
                ud: p.ud,
                bind: p.bind,
                // rdma-core 44 has no ibv_wr_flush (it came in 45).
                flush: None,
                xrc_srqn: p.xrc_srqn,
            };
        }
        if let Err(e) = b.inner.post_send(&batch[..chunk.len()]) {
            return e.errno();
        }
    }
    0
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    begin(qp, WrOpcode::Send, |_| {});
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    begin(qp, WrOpcode::SendWithImm, |p| p.imm = u32::from_be(imm));
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    begin(qp, WrOpcode::SendWithInv, |p| p.imm = rkey);
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(qp, WrOpcode::RdmaWrite, |p| (p.rkey, p.remote_addr) = (rkey, addr));
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    begin(qp, WrOpcode::RdmaWriteWithImm, |p| {
        (p.rkey, p.remote_addr, p.imm) = (rkey, addr, u32::from_be(imm));
    });
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(qp, WrOpcode::RdmaRead, |p| (p.rkey, p.remote_addr) = (rkey, addr));
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    cmp: u64,
    swap: u64,
) {
    begin(qp, WrOpcode::AtomicCmpAndSwp, |p| {
        (p.rkey, p.remote_addr, p.compare_add, p.swap) = (rkey, addr, cmp, swap);
    });
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    begin(qp, WrOpcode::AtomicFetchAndAdd, |p| {
        (p.rkey, p.remote_addr, p.compare_add) = (rkey, addr, add)
    });
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    begin(qp, WrOpcode::LocalInv, |p| p.imm = rkey);
}

/// Opcodes the transport does not have: the batch fails at
/// `ibv_wr_complete` with EOPNOTSUPP.
fn unsupported(qp: *mut ibv_qp_ex) {
    with(qp, |_, bl| bl.err = libc::EOPNOTSUPP);
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    // SAFETY: NULL or a readable bind description from the caller.
    let bind = match unsafe { info.as_ref() } {
        Some(i) => crate::mw::type2_bind(mw, rkey, i),
        None => Err(libc::EINVAL),
    };
    match bind {
        Ok(b) => begin(qp, WrOpcode::BindMw, |p| p.bind = Some(b)),
        Err(e) => with(qp, |_, bl| bl.err = e),
    }
}

unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _: *mut c_void, _: u16, _: u16) {
    unsupported(qp);
}

/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr` stored at once at
/// `addr` (IBA 1.5 ATOMIC WRITE).
unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    atomic_wr: *const c_void,
) {
    if atomic_wr.is_null() {
        with(qp, |_, bl| bl.err = libc::EINVAL);
        return;
    }
    // SAFETY: the caller gives 8 readable bytes at `atomic_wr`.
    let value = unsafe { atomic_wr.cast::<u64>().read_unaligned() };
    begin(qp, WrOpcode::AtomicWrite, |p| {
        (p.rkey, p.remote_addr, p.compare_add) = (rkey, addr, value);
    });
}

/// `ibv_wr_set_xrc_srqn`: the target SRQ of the WR just started.
unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, srqn: u32) {
    last(qp, |bl, i| bl.wrs[i].xrc_srqn = srqn);
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    last(qp, |bl, i| {
        // SAFETY: verbs contract: NULL or an AH of ours.
        match unsafe { obj::<_, AhBox>(ah) } {
            Some(a) => bl.wrs[i].ud = Some(a.inner.dest(qpn & 0xff_ffff, qkey)),
            None => bl.err = libc::EINVAL,
        }
    });
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    last(qp, |bl, i| {
        let start = bl.sges.len();
        bl.sges.push(Sge { addr, length, lkey });
        bl.wrs[i].sge = (start, 1);
        bl.wrs[i].inline = None;
    });
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    last(qp, |bl, i| {
        if n > 0 && list.is_null() {
            bl.err = libc::EINVAL;
            return;
        }
        let start = bl.sges.len();
        for k in 0..n {
            // SAFETY: the caller passes `n` readable SGEs.
            let s = unsafe { *list.add(k) };
            bl.sges.push(Sge { addr: s.addr, length: s.length, lkey: s.lkey });
        }
        bl.wrs[i].sge = (start, n);
        bl.wrs[i].inline = None;
    });
}

/// Appends inline bytes to WR `i`.
fn push_inline(bl: &mut Builder, i: usize, addr: *const c_void, len: usize) {
    if len > 0 && addr.is_null() {
        bl.err = libc::EINVAL;
        return;
    }
    let start = bl.wrs[i].inline.map_or(bl.bytes.len(), |(s, _)| s);
    if len > 0 {
        // SAFETY: the caller passes `len` readable bytes at `addr`.
        let src = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) };
        bl.bytes.extend_from_slice(src);
    }
    bl.wrs[i].inline = Some((start, bl.bytes.len() - start));
    bl.wrs[i].sge = (bl.sges.len(), 0);
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    last(qp, |bl, i| {
        bl.wrs[i].inline = None;
        push_inline(bl, i, addr, len);
    });
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    last(qp, |bl, i| {
        if n > 0 && list.is_null() {
            bl.err = libc::EINVAL;
            return;
        }
        bl.wrs[i].inline = None;
        push_inline(bl, i, std::ptr::null(), 0);
        for k in 0..n {
            // SAFETY: the caller passes `n` readable buffers.
            let d = unsafe { &*list.add(k) };
            push_inline(bl, i, d.addr, d.length);
        }
    });
}
