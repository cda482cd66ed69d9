//! Protection domains, memory regions, completion queues and queue pairs.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use uroce_transport::{
    Access, AttrMask, Completion, MwBind, MwType, QpAttr, QpCaps, QpInit, QpType, RecvWr,
    SendFlags, SendWr, Sge, WrOpcode,
};

use crate::context::{Context, Inner};
use crate::error::{Error, Result};
use crate::limits;
use crate::mr::OwnedBuf;
use crate::staging::{Gather, QpPost};

/// A protection domain (`ibv_pd`): MRs and QPs of one PD only work together.
#[derive(Clone)]
pub struct Pd {
    ctx: Arc<Inner>,
    handle: u32,
    _life: Arc<PdLife>,
}

/// A PD's place among the context's live ones, given back by its last
/// handle.
struct PdLife {
    ctx: Arc<Inner>,
    handle: u32,
}

impl Pd {
    /// The PD's number (`rdma res show pd`'s `pdn`).
    pub fn handle(&self) -> u32 {
        self.handle
    }
}

impl Drop for PdLife {
    fn drop(&mut self) {
        self.ctx.pds.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.handle);
    }
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pd({})", self.handle)
    }
}

impl Context {
    /// Allocates a protection domain (`ibv_alloc_pd`).
    ///
    /// # Errors
    /// [`Error::Limit`] past `max_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let mut e = self.inner.lock();
        let mut pds = self.inner.pds.lock().unwrap_or_else(|e| e.into_inner());
        if pds.len() as u32 >= limits::MAX_PD {
            return Err(Error::Limit("max_pd"));
        }
        // Numbers go on (a freed one is not reused soon), past 0 and live
        // ones when they wrap.
        let mut handle = e.next_pd;
        while handle == 0 || pds.contains(&handle) {
            handle = handle.wrapping_add(1);
        }
        e.next_pd = handle.wrapping_add(1);
        pds.insert(handle);
        drop((pds, e));
        let ctx = self.inner.clone();
        Ok(Pd { ctx: ctx.clone(), handle, _life: Arc::new(PdLife { ctx, handle }) })
    }

    /// Creates a completion queue of `cqe` entries (`ibv_create_cq`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 or more than `max_cqe` entries,
    /// [`Error::Limit`] past `max_cq`.
    pub fn create_cq(&self, cqe: u32) -> Result<Cq> {
        self.create_cq_with(cqe, None)
    }

    /// Creates a completion queue that reports to `channel` once armed
    /// with [`Cq::req_notify`] (`ibv_create_cq` with a channel).
    ///
    /// # Errors
    /// As [`Context::create_cq`].
    pub fn create_cq_with(&self, cqe: u32, channel: Option<&crate::CompChannel>) -> Result<Cq> {
        if cqe == 0 || cqe > limits::MAX_CQE {
            return Err(Error::InvalidArgument("cqe out of range"));
        }
        let mut e = self.inner.lock();
        if e.ep.cq_count() as u32 >= limits::MAX_CQ {
            return Err(Error::Limit("max_cq"));
        }
        let id = e.create_cq(cqe as usize, channel.map(|c| c.events.clone()));
        let ring = e.ep.cq(id).expect("just created").clone();
        let inner = CqInner { ctx: self.inner.clone(), id, ring, channel: channel.is_some() };
        Ok(Cq { inner: Arc::new(inner) })
    }
}

/// A registered memory region (`ibv_mr`).
///
/// Registered memory is shared with the network: a peer may write it at any
/// time its access flags allow. uroce therefore never hands out Rust
/// references to it. Owned regions ([`Pd::alloc_mr`]) are read and written
/// by copying ([`Mr::write`], [`Mr::read`]); whether a peer's WRITE has
/// landed is learned from a completion or an application-level protocol,
/// exactly as with an RDMA NIC. Deregistration (dropping the `Mr`) revokes
/// the keys at once, before the memory is freed.
pub struct Mr {
    ctx: Arc<Inner>,
    key: u32,
    addr: u64,
    len: usize,
    access: Access,
    /// Freed after the keys are revoked (field order does not matter: the
    /// Drop impl deregisters first).
    _owned: Option<OwnedBuf>,
    /// The device memory a region on it keeps alive.
    _dm: Option<crate::Dm>,
    /// Registered on demand (its memory need not be mapped).
    on_demand: bool,
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mr(key {:#x}, addr {:#x}, len {})", self.key, self.addr, self.len)
    }
}

fn check_access(access: Access) -> Result<()> {
    // IBTA C10-…: remote write or atomic access needs local write.
    let needs_local = Access(Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0);
    if access.0 & needs_local.0 != 0 && !access.contains(Access::LOCAL_WRITE) {
        return Err(Error::InvalidArgument("REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE"));
    }
    if access.contains(Access::FLUSH_PERSISTENT) {
        // Host memory is not persistent (rxe refuses it on non-pmem too).
        return Err(Error::InvalidArgument("FLUSH_PERSISTENT needs persistent memory"));
    }
    if access.0 & !(0x3f | Access::FLUSH_GLOBAL.0) != 0 {
        return Err(Error::InvalidArgument("unsupported access flags"));
    }
    Ok(())
}

impl Pd {
    /// Whether the PD belongs to `ctx`.
    pub(crate) fn on(&self, ctx: &Context) -> bool {
        Arc::ptr_eq(&self.ctx, &ctx.inner)
    }

    /// The context's count of live address handles.
    pub(crate) fn ah_count(&self) -> &std::sync::atomic::AtomicU32 {
        &self.ctx.ah_count
    }

    /// Readies source GID `index` for sending to `dst` (an AH names it).
    pub(crate) fn source_for(&self, index: u8, dst: std::net::IpAddr) -> Result<std::net::IpAddr> {
        self.ctx.lock().source_for(index, dst)
    }

    /// Allocates `len` zeroed bytes and registers them (the safe way to get
    /// RDMA memory).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad access flags or a zero length,
    /// [`Error::Limit`] past `max_mr` / `max_mr_size` or out of memory.
    #[allow(unsafe_code)]
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<Mr> {
        check_access(access)?;
        if len == 0 {
            return Err(Error::InvalidArgument("zero-length region"));
        }
        if len as u64 > limits::MAX_MR_SIZE {
            return Err(Error::Limit("max_mr_size"));
        }
        let buf = OwnedBuf::new(len).ok_or(Error::Limit("out of memory"))?;
        let ptr = buf.ptr();
        // SAFETY: `buf` lives in the returned Mr and is freed only after
        // Drop revokes the key.
        let mut mr = unsafe { self.register_raw(ptr.as_ptr(), len, access)? };
        mr._owned = Some(buf);
        Ok(mr)
    }

    /// Registers memory the caller owns (`ibv_reg_mr`). The region's
    /// address (what SGEs and peers name) is `ptr`'s value.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes until the returned
    /// `Mr` is dropped, and must not be moved or freed before. While it is
    /// registered with remote write or atomic access, a peer may change it
    /// at any time: do not hold Rust references (`&`/`&mut`) to those bytes
    /// across such writes; use raw pointers or copies.
    ///
    /// # Errors
    /// As [`Pd::alloc_mr`]; [`Error::InvalidArgument`] for a null pointer.
    #[allow(unsafe_code)]
    pub unsafe fn register_raw(&self, ptr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.register_raw_at(ptr, len, ptr as u64, access) }
    }

    /// [`Pd::register_raw`] with the region named by `iova` instead of its
    /// address (`ibv_reg_mr_iova`): SGEs and peers address byte `i` of the
    /// region as `iova + i`.
    ///
    /// # Safety
    /// As [`Pd::register_raw`].
    ///
    /// # Errors
    /// As [`Pd::register_raw`]; [`Error::InvalidArgument`] if
    /// `iova + len` overflows.
    #[allow(unsafe_code)]
    pub unsafe fn register_raw_at(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Mr> {
        check_access(access)?;
        if iova.checked_add(len as u64).is_none() {
            return Err(Error::InvalidArgument("iova + length overflows"));
        }
        let nn = NonNull::new(ptr).ok_or(Error::InvalidArgument("null address"))?;
        if len as u64 > limits::MAX_MR_SIZE {
            return Err(Error::Limit("max_mr_size"));
        }
        let mut e = self.ctx.lock();
        if e.mem.len() as u32 >= limits::MAX_MR {
            return Err(Error::Limit("max_mr"));
        }
        let addr = iova;
        // SAFETY: forwarded from this function's contract.
        let key = unsafe { e.mem.register(nn, len, addr, self.handle, access) };
        Ok(Mr {
            ctx: self.ctx.clone(),
            key,
            addr,
            len,
            access,
            _owned: None,
            _dm: None,
            on_demand: false,
        })
    }

    /// Registers `len` bytes at host address `addr` on demand (`ibv_reg_mr`
    /// with `IBV_ACCESS_ON_DEMAND`), named by peers and SGEs at `iova`:
    /// nothing is touched or pinned, and the memory need not be mapped. An
    /// access to a page that is not mapped (or, writing, not writable)
    /// when it happens ends as an access error (a remote access error for
    /// a peer, a local protection error for a local WR), never a fault; a
    /// page mapped later is reached then.
    ///
    /// # Safety
    /// While it is registered, no Rust reference may point into the range
    /// (peers write it at any time).
    ///
    /// # Errors
    /// As [`Pd::register_raw_at`].
    #[allow(unsafe_code)]
    pub unsafe fn register_on_demand(
        &self,
        addr: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Mr> {
        check_access(access)?;
        if len == 0 || iova.checked_add(len as u64).is_none() || addr.checked_add(len).is_none() {
            return Err(Error::InvalidArgument("empty range, or its end overflows"));
        }
        if len as u64 > limits::MAX_MR_SIZE {
            return Err(Error::Limit("max_mr_size"));
        }
        self.on_demand(addr, len, iova, access)
    }

    /// Registers the whole address space on demand (implicit on-demand
    /// paging: `ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND)`):
    /// IOVAs are host addresses, and every access is checked as in
    /// [`Pd::register_on_demand`].
    ///
    /// # Safety
    /// As [`Pd::register_on_demand`], for all memory the peers are given
    /// the key and addresses of.
    ///
    /// # Errors
    /// As [`Pd::register_raw_at`].
    #[allow(unsafe_code)]
    pub unsafe fn register_implicit_on_demand(&self, access: Access) -> Result<Mr> {
        check_access(access)?;
        self.on_demand(0, usize::MAX, 0, access)
    }

    /// Advises that the ranges of on-demand regions in `sgl` will be
    /// accessed soon (`ibv_advise_mr` prefetch). Nothing needs faulting in
    /// ahead here (each access goes through the kernel when it happens),
    /// so this checks the ranges and returns.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty list or a range that is not
    /// in an on-demand region of this PD.
    pub fn advise_prefetch(&self, sgl: &[Sge]) -> Result<()> {
        let e = self.ctx.lock();
        if sgl.is_empty() || !sgl.iter().all(|s| e.mem.on_demand_range(self.handle, s)) {
            return Err(Error::InvalidArgument("not a range of an on-demand region of this PD"));
        }
        Ok(())
    }

    fn on_demand(&self, addr: usize, len: usize, iova: u64, access: Access) -> Result<Mr> {
        let mut e = self.ctx.lock();
        if e.mem.len() as u32 >= limits::MAX_MR {
            return Err(Error::Limit("max_mr"));
        }
        let key = e.mem.register_on_demand(addr, len, iova, self.handle, access);
        let ctx = self.ctx.clone();
        Ok(Mr { ctx, key, addr: iova, len, access, _owned: None, _dm: None, on_demand: true })
    }

    /// Registers `len` bytes of device memory `dm` from `offset`
    /// (`ibv_reg_dm_mr`): zero-based, so peers and SGEs name its bytes
    /// from address 0. The region keeps `dm` alive.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for device memory of another context, a
    /// range outside it, or rights that do not go together.
    #[allow(unsafe_code)]
    pub fn reg_dm_mr(
        &self,
        dm: &crate::Dm,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Mr> {
        if !Arc::ptr_eq(dm.ctx(), &self.ctx) {
            return Err(Error::InvalidArgument("device memory of another context"));
        }
        // An empty region is allowed, as the kernel allows it.
        if offset.checked_add(len).is_none_or(|e| e > dm.len()) {
            return Err(Error::InvalidArgument("the range is outside the device memory"));
        }
        // SAFETY: `offset + len` is within `dm`'s buffer (checked above),
        // which the returned Mr keeps alive (`_dm`) past its keys' end.
        let mut mr =
            unsafe { self.register_raw_at(dm.ptr().as_ptr().add(offset), len, 0, access)? };
        mr._dm = Some(dm.clone());
        Ok(mr)
    }

    /// Creates a queue pair (`ibv_create_qp`): RC, UC or UD.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for CQs or an SRQ of another context, or
    /// capabilities above the device limits; [`Error::Limit`] past
    /// `max_qp`.
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<Qp> {
        let c = init.cap;
        if c.max_send_wr > limits::MAX_QP_WR
            || c.max_recv_wr > limits::MAX_QP_WR
            || c.max_send_sge > limits::MAX_SGE
            || c.max_recv_sge > limits::MAX_SGE
            || c.max_inline_data > limits::MAX_INLINE
        {
            return Err(Error::InvalidArgument("QP capabilities above device limits"));
        }
        if !Arc::ptr_eq(&init.send_cq.inner.ctx, &self.ctx)
            || !Arc::ptr_eq(&init.recv_cq.inner.ctx, &self.ctx)
        {
            return Err(Error::InvalidArgument("CQ belongs to another context"));
        }
        if init.srq.is_some_and(|s| !Arc::ptr_eq(&s.inner.ctx, &self.ctx)) {
            return Err(Error::InvalidArgument("SRQ belongs to another context"));
        }
        // A send WQE holds its SGEs or its inline bytes in one place, so
        // the inline room is at least the SGEs' (16 bytes each), as rxe
        // grants it: programs that ask for no inline data and post small
        // inline SENDs (rdma_xclient) work as on rxe and NICs.
        let c = QpCaps {
            max_inline_data: c.max_inline_data.max(c.max_send_sge * 16).min(limits::MAX_INLINE),
            ..c
        };
        let mut e = self.ctx.lock();
        if e.ep.qp_count() as u32 >= limits::MAX_QP {
            return Err(Error::Limit("max_qp"));
        }
        let qpn = e.ep.alloc_qpn();
        if init.qp_type == QpType::RawPacket {
            return self.create_raw_qp(&mut e, qpn, init, c);
        }
        let qp_init = QpInit {
            qpn,
            qp_type: init.qp_type,
            pd: self.handle,
            caps: c,
            sq_sig_all: init.sq_sig_all,
            max_unacked_psns: limits::SEND_WINDOW_PSNS,
            port_mtu: self.ctx.device.port_attr().active_mtu,
            // An XRC initiator has no receive queue at all.
            uses_srq: init.srq.is_some() || init.qp_type == QpType::XrcSend,
        };
        let qp = uroce_transport::Qp::new(qp_init);
        let post = Arc::new(QpPost::new(qp_init, qp.gauge()));
        let srq = init.srq.map(|s| s.inner.id);
        e.ep.add_qp(qp, init.send_cq.inner.id, init.recv_cq.inner.id, srq);
        Ok(Qp {
            ctx: self.ctx.clone(),
            qpn,
            post,
            cap: c,
            qp_type: init.qp_type,
            _pd: Some(self.clone()),
            _cqs: vec![init.send_cq.clone(), init.recv_cq.clone()],
            _srq: init.srq.cloned(),
            _xrcd: None,
            target: None,
            remote: None,
            _table: None,
        })
    }
}

impl Pd {
    /// A raw packet QP (see `crate::raw`) numbered `qpn`: its packet
    /// socket on the device's interface needs `CAP_NET_RAW`.
    fn create_raw_qp(
        &self,
        e: &mut crate::driver::Driver,
        qpn: u32,
        init: &QpInitAttr<'_>,
        c: QpCaps,
    ) -> Result<Qp> {
        if init.srq.is_some() {
            return Err(Error::InvalidArgument("a raw packet QP takes no SRQ"));
        }
        let raw = crate::raw::RawInit {
            qpn,
            pd: self.handle,
            send_cq: init.send_cq.inner.id,
            recv_cq: init.recv_cq.inner.id,
            sq_sig_all: init.sq_sig_all,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline: c.max_inline_data,
            rq_depth: c.max_recv_wr,
        };
        let cqs = vec![init.send_cq.clone(), init.recv_cq.clone()];
        self.add_raw_qp(e, raw, None, c, cqs)
    }

    /// Adds raw QP `raw` to the driver (with `rss`, an RSS QP: its
    /// indirection table and hash) and makes its handle, which keeps
    /// `cqs` and the table alive.
    fn add_raw_qp(
        &self,
        e: &mut crate::driver::Driver,
        raw: crate::raw::RawInit,
        rss: Option<(&RwqIndTable, crate::raw::RxHash)>,
        caps: QpCaps,
        cqs: Vec<Cq>,
    ) -> Result<Qp> {
        let ip = self.ctx.device.socket_addr().ip();
        let ifindex = crate::netif::index_of(ip)
            .ok_or(Error::InvalidArgument("the device's address is on no interface"))?;
        let table = rss.as_ref().map(|(t, _)| (*t).clone());
        let added = match rss {
            Some((t, hash)) => {
                let wqns = t.inner.wqs.iter().map(|w| w.inner.wqn).collect();
                e.raw.create_rss(ifindex, raw, wqns, hash)
            }
            None => e.raw.create(ifindex, raw),
        };
        added.map_err(|source| Error::Open {
            device: self.ctx.device.name().to_string(),
            addr: self.ctx.device.socket_addr(),
            source,
        })?;
        // Its posting state stands unused: raw posts go to the raw module.
        let qp_init = QpInit {
            qpn: raw.qpn,
            qp_type: QpType::RawPacket,
            pd: self.handle,
            caps,
            sq_sig_all: raw.sq_sig_all,
            max_unacked_psns: limits::SEND_WINDOW_PSNS,
            port_mtu: self.ctx.device.port_attr().active_mtu,
            uses_srq: table.is_some(),
        };
        let post = Arc::new(QpPost::new(qp_init, uroce_transport::Qp::new(qp_init).gauge()));
        Ok(Qp {
            ctx: self.ctx.clone(),
            qpn: raw.qpn,
            post,
            cap: caps,
            qp_type: QpType::RawPacket,
            _pd: Some(self.clone()),
            _cqs: cqs,
            _srq: None,
            _xrcd: None,
            target: None,
            remote: None,
            _table: table,
        })
    }
}

/// A receive work queue (`ibv_wq`, type RQ): receives for RSS QPs
/// ([`Pd::create_rss_qp`]) whose indirection tables name it, completed on
/// its CQ. Cloning shares it.
#[derive(Clone)]
pub struct Wq {
    inner: Arc<WqInner>,
}

struct WqInner {
    ctx: Arc<Inner>,
    wqn: u32,
    _pd: Pd,
    _cq: Cq,
}

impl Drop for WqInner {
    fn drop(&mut self) {
        self.ctx.lock().raw.destroy_wq(self.wqn);
    }
}

impl std::fmt::Debug for Wq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Wq({:#x})", self.inner.wqn)
    }
}

impl Pd {
    /// A receive work queue of `max_wr` WQEs of `max_sge` entries, its
    /// completions on `cq` (`ibv_create_wq`); it starts in RESET.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a CQ of another context or sizes
    /// above the device's limits.
    pub fn create_wq(&self, cq: &Cq, max_wr: u32, max_sge: u32) -> Result<Wq> {
        if !Arc::ptr_eq(&cq.inner.ctx, &self.ctx) {
            return Err(Error::InvalidArgument("CQ belongs to another context"));
        }
        if max_wr == 0 || max_wr > limits::MAX_QP_WR || max_sge > limits::MAX_SGE {
            return Err(Error::InvalidArgument("WQ sizes out of range"));
        }
        let mut e = self.ctx.lock();
        let wqn = e.ep.alloc_qpn();
        e.raw.create_wq(wqn, self.handle, cq.inner.id, max_wr, max_sge.max(1));
        let inner = WqInner { ctx: self.ctx.clone(), wqn, _pd: self.clone(), _cq: cq.clone() };
        Ok(Wq { inner: Arc::new(inner) })
    }

    /// A receive-only raw packet QP that spreads the frames its flow rules
    /// take over `table`'s work queues by `hash` (an RSS QP:
    /// `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_RX_HASH` and `_IND_TABLE`).
    /// It receives at once; it has no states to move through and sends
    /// nothing.
    ///
    /// # Errors
    /// As a raw packet QP's creation ([`Pd::create_qp`]), and
    /// [`Error::InvalidArgument`] for a table of another context.
    pub fn create_rss_qp(&self, table: &RwqIndTable, hash: crate::raw::RxHash) -> Result<Qp> {
        if !Arc::ptr_eq(&table.inner.ctx, &self.ctx) {
            return Err(Error::InvalidArgument("indirection table of another context"));
        }
        let mut e = self.ctx.lock();
        let qpn = e.ep.alloc_qpn();
        let none = u32::MAX;
        let raw = crate::raw::RawInit {
            qpn,
            pd: self.handle,
            send_cq: none,
            recv_cq: none,
            sq_sig_all: false,
            max_send_sge: 0,
            max_recv_sge: 0,
            max_inline: 0,
            rq_depth: 0,
        };
        let caps = QpCaps {
            max_send_wr: 0,
            max_recv_wr: 0,
            max_send_sge: 0,
            max_recv_sge: 0,
            max_inline_data: 0,
        };
        self.add_raw_qp(&mut e, raw, Some((table, hash)), caps, Vec::new())
    }
}

impl Wq {
    /// Its number (`ibv_wq.wq_num`; completions carry it as `qp_num`).
    pub fn wqn(&self) -> u32 {
        self.inner.wqn
    }

    /// Moves it to `state` (`ibv_modify_wq`); to ERR its receives are
    /// flushed, to RESET dropped.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if it is gone.
    pub fn modify(&self, state: crate::raw::WqState) -> Result<()> {
        let mut e = self.inner.ctx.lock();
        let now = e.now();
        let d = &mut *e;
        let mut cqs = crate::driver::CqsAt { ep: &mut d.ep, now };
        let done = d.raw.modify_wq(self.inner.wqn, state, &mut cqs);
        d.forward_events();
        done.then_some(()).ok_or(Error::InvalidArgument("WQ destroyed"))
    }

    /// Its state.
    pub fn state(&self) -> crate::raw::WqState {
        self.inner.ctx.lock().raw.wq_state(self.inner.wqn).unwrap_or(crate::raw::WqState::Error)
    }

    /// Posts receive WRs (`ibv_post_wq_recv`).
    ///
    /// # Errors
    /// [`Error::Post`] naming the first WR that was not posted.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let r = self.inner.ctx.lock().raw.post_wq_recv(self.inner.wqn, wrs);
        r.map_err(|(index, error)| Error::Post { index, error })
    }
}

/// A receive work queue indirection table (`ibv_rwq_ind_table`): the work
/// queues an RSS QP's hash chooses among, a power of two of them.
/// Cloning shares it; it keeps its work queues alive.
#[derive(Clone)]
pub struct RwqIndTable {
    inner: Arc<RwqInner>,
}

struct RwqInner {
    ctx: Arc<Inner>,
    wqs: Vec<Wq>,
}

impl std::fmt::Debug for RwqIndTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RwqIndTable({} WQs)", self.inner.wqs.len())
    }
}

impl Context {
    /// An indirection table of `wqs` (`ibv_create_rwq_ind_table`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless their number is a power of two
    /// (and at most 2^16) and they are all of this context.
    pub fn create_rwq_ind_table(&self, wqs: &[Wq]) -> Result<RwqIndTable> {
        if !wqs.len().is_power_of_two() || wqs.len() > 1 << 16 {
            return Err(Error::InvalidArgument("a power of two of work queues"));
        }
        if wqs.iter().any(|w| !Arc::ptr_eq(&w.inner.ctx, &self.inner)) {
            return Err(Error::InvalidArgument("a work queue of another context"));
        }
        let inner = RwqInner { ctx: self.inner.clone(), wqs: wqs.to_vec() };
        Ok(RwqIndTable { inner: Arc::new(inner) })
    }
}

impl RwqIndTable {
    /// How many work queues it names.
    pub fn len(&self) -> usize {
        self.inner.wqs.len()
    }

    /// Whether it names none (never: a table has at least one).
    pub fn is_empty(&self) -> bool {
        self.inner.wqs.is_empty()
    }
}

/// A flow rule on a raw packet QP (`ibv_create_flow`): frames it matches
/// go to the QP while it lives (see [`crate::raw`]).
pub struct Flow {
    ctx: Arc<Inner>,
    id: u32,
}

impl std::fmt::Debug for Flow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flow({})", self.id)
    }
}

impl Flow {
    /// Its handle (unique among the context's rules).
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        self.ctx.lock().raw.remove_rule(self.id);
    }
}

impl Qp {
    /// Steers the frames `attr` matches to this raw packet QP
    /// (`ibv_create_flow`); the rule lasts as long as the returned
    /// [`Flow`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a QP of another type.
    pub fn create_flow(&self, attr: crate::raw::FlowAttr) -> Result<Flow> {
        if self.qp_type != QpType::RawPacket {
            return Err(Error::InvalidArgument("flow rules steer to raw packet QPs"));
        }
        let id = self.ctx.lock().raw.add_rule(self.qpn, attr);
        let id = id.ok_or(Error::InvalidArgument("QP destroyed"))?;
        Ok(Flow { ctx: self.ctx.clone(), id })
    }

    /// The CQs a raw QP completes on.
    fn raw_cqs(&self) -> [u32; 2] {
        let id = |i: usize| self._cqs.get(i).map_or(u32::MAX, |c| c.inner.id);
        [id(0), id(1)]
    }
}

/// An XRC domain (`ibv_xrcd`): XRC SRQs and XRC target QPs of one domain
/// work together. An initiator QP (`QpType::XrcSend`, made on a PD) sends
/// each WR to an SRQ of the peer's domain, named by
/// [`SendWr::xrc_srqn`](crate::SendWr); the peer's target QP
/// ([`Xrcd::create_target_qp`]) takes it into that SRQ, whose PD checks
/// the memory accesses and whose CQ gets the completion. Cloning shares
/// the domain; its SRQs and target QPs keep it alive.
#[derive(Clone)]
pub struct Xrcd {
    inner: Arc<XrcdInner>,
}

struct XrcdInner {
    ctx: Arc<Inner>,
    id: u32,
    /// Its target QPs by number, for [`Xrcd::open_target_qp`]; each lives
    /// while any handle to it does.
    targets: Mutex<HashMap<u32, Weak<SharedTarget>>>,
    /// The table of a domain that other processes of the device share
    /// ([`Context::open_shared_xrcd`]), and the lookups in it.
    shared: Option<Arc<crate::xrc_share::Table>>,
    domain: Option<Arc<crate::xrc_share::Domain>>,
}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        if self.shared.is_some() {
            // Target QPs kept for other processes' handles keep it shared.
            let mut d = self.ctx.lock();
            if d.opens.domain_closed(self.id) {
                d.ep.unshare_xrcd(self.id);
            }
        }
    }
}

/// An XRC target QP's life, shared by every handle to it (the one that
/// created it and those that opened it): the last one destroys it, as
/// the kernel destroys a shared QP when its last handle closes.
struct SharedTarget {
    ctx: Arc<Inner>,
    qpn: u32,
    post: Arc<QpPost>,
}

/// An XRC target QP's creation attributes: no PD, CQs or queues.
fn target_init(ctx: &Inner, qpn: u32) -> QpInit {
    let none = QpCaps {
        max_send_wr: 0,
        max_recv_wr: 0,
        max_send_sge: 0,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    QpInit {
        qpn,
        qp_type: QpType::XrcRecv,
        pd: 0,
        caps: none,
        sq_sig_all: false,
        max_unacked_psns: limits::SEND_WINDOW_PSNS,
        port_mtu: ctx.device.port_attr().active_mtu,
        uses_srq: true,
    }
}

impl Drop for SharedTarget {
    fn drop(&mut self) {
        // Other processes' handles may hold it still (`xrc_open`).
        self.ctx.lock().target_dropped(self.qpn);
    }
}

/// Another process's XRC target QP as a handle here holds it
/// (`ibv_open_qp` across processes, see `xrc_open`): requests to the
/// creator's context, from a number of this context's (`proxy`), listed
/// in the domain's table while the handle lives.
struct RemoteTarget {
    ctx: Arc<Inner>,
    qpn: u32,
    proxy: u32,
    _listing: Arc<dyn uroce_transport::SharedSrq>,
    /// One request at a time (the creator remembers one answer per
    /// proxy, for a request asked again).
    calls: Mutex<()>,
}

impl RemoteTarget {
    /// Asks the creator, again every 50 ms, for up to 2 s.
    fn call(
        &self,
        op: crate::xrc_open::Op,
        word: u32,
        attr: Option<QpAttr>,
    ) -> Result<crate::xrc_open::Message> {
        use std::time::{Duration, Instant as StdInstant};
        let _one = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let start = StdInstant::now();
        let mut id = 0;
        let mut asked = start - Duration::from_secs(1);
        loop {
            let now = StdInstant::now();
            {
                let mut e = self.ctx.lock();
                if now.duration_since(asked) >= Duration::from_millis(50) {
                    id = e.control_request((self.qpn, self.proxy), id, op, (word, attr));
                    asked = now;
                }
                e.progress();
                if let Some(m) = e.take_reply(id) {
                    return match m.errno {
                        0 => Ok(m),
                        errno => Err(Error::Io(std::io::Error::from_raw_os_error(errno))),
                    };
                }
            }
            if now.duration_since(start) > Duration::from_secs(2) {
                self.ctx.lock().forget_request(id);
                return Err(Error::Io(std::io::Error::from_raw_os_error(libc::ETIMEDOUT)));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        self.call(crate::xrc_open::Op::Modify, mask.0, Some(*attr)).map(|_| ())
    }

    fn query(&self) -> Result<QpAttr> {
        let m = self.call(crate::xrc_open::Op::Query, 0, None)?;
        m.attr.ok_or(Error::InvalidArgument("no attributes in the answer"))
    }
}

impl Drop for RemoteTarget {
    fn drop(&mut self) {
        self.ctx.lock().close_proxy(self.qpn, self.proxy);
    }
}

impl std::fmt::Debug for Xrcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Xrcd({})", self.inner.id)
    }
}

impl Context {
    /// Opens a new XRC domain (`ibv_open_xrcd`).
    ///
    /// # Errors
    /// None here yet; the signature leaves room for a shared domain's.
    pub fn open_xrcd(&self) -> Result<Xrcd> {
        Ok(self.xrcd_with(None))
    }

    fn xrcd_with(&self, shared: Option<Arc<crate::xrc_share::Table>>) -> Xrcd {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let targets = Mutex::new(HashMap::new());
        let domain = shared.as_ref().map(|t| Arc::new(crate::xrc_share::Domain::new(t.clone())));
        if let Some(d) = &domain {
            self.inner.lock().ep.share_xrcd(id, d.clone());
        }
        let inner = XrcdInner { ctx: self.inner.clone(), id, targets, shared, domain };
        Xrcd { inner: Arc::new(inner) }
    }

    /// Opens the XRC domain of `file` (`ibv_open_xrcd` with its `fd`),
    /// shared with the other processes of this device that open the same
    /// file, as the kernel shares it: an initiator may name any of their
    /// SRQs of the domain through a target QP of any of them (a message
    /// for another process's SRQ is relayed to it; SENDs only, see the
    /// README). `create` and `exclusive` are `O_CREAT` and `O_EXCL`
    /// against the other processes' opens. Each call opens a domain of its
    /// own in this process: the drop-in library keeps one per file.
    ///
    /// # Errors
    /// `EAGAIN` ([`Error::Io`]) when no process has it open and `create`
    /// is false, `EINVAL` when one has and `exclusive` is set; I/O errors
    /// of the table file.
    pub fn open_shared_xrcd(
        &self,
        file: &std::fs::File,
        create: bool,
        exclusive: bool,
    ) -> Result<Xrcd> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata().map_err(Error::Io)?;
        let addr = self.inner.device.socket_addr();
        let (table, opened) =
            crate::xrc_share::Table::open(addr, m.dev(), m.ino()).map_err(Error::Io)?;
        let errno = match opened {
            crate::xrc_share::Opened::New if !create => Some(libc::EAGAIN),
            crate::xrc_share::Opened::Existing if exclusive => Some(libc::EINVAL),
            _ => None,
        };
        if let Some(e) = errno {
            return Err(Error::Io(std::io::Error::from_raw_os_error(e)));
        }
        Ok(self.xrcd_with(Some(Arc::new(table))))
    }
}

impl Xrcd {
    /// Creates an XRC SRQ of this domain (`ibv_create_srq_ex` with
    /// `IBV_SRQT_XRC`): requests that name it ([`Srq::handle`], the
    /// SRQ number) take its WQEs; `pd` checks their memory accesses, and
    /// their completions go to `cq`.
    ///
    /// # Errors
    /// As [`Context::create_srq`]; [`Error::InvalidArgument`] for a PD or
    /// CQ of another context.
    pub fn create_srq(&self, pd: &Pd, cq: &Cq, attr: &SrqAttr) -> Result<Srq> {
        if !Arc::ptr_eq(&pd.ctx, &self.inner.ctx) || !Arc::ptr_eq(&cq.inner.ctx, &self.inner.ctx) {
            return Err(Error::InvalidArgument("PD or CQ of another context"));
        }
        attr.check_size()?;
        let xrc = uroce_transport::XrcSrq { xrcd: self.inner.id, pd: pd.handle, cq: cq.inner.id };
        let mut srq = uroce_transport::Srq::new_xrc(attr.max_wr, attr.max_sge, xrc);
        srq.arm(attr.srq_limit).map_err(|_| Error::InvalidArgument("srq_limit above max_wr"))?;
        let mut e = self.inner.ctx.lock();
        if e.ep.srq_count() as u32 >= limits::MAX_SRQ {
            return Err(Error::Limit("max_srq"));
        }
        let gauge = srq.gauge();
        let id = e.ep.add_srq(srq);
        if let Some(table) = &self.inner.shared {
            // Listed under its number, which other processes' initiators
            // name: its WQEs are taken against claims from now on.
            let Some(claims) = table.register(id) else {
                e.ep.remove_srq(id);
                return Err(Error::Limit("XRC SRQs in a shared domain"));
            };
            if let Some(s) = e.ep.srq_mut(id) {
                s.set_shared(claims);
            }
        }
        let post = Arc::new(crate::staging::SrqPost::new(id, attr.max_wr, attr.max_sge, gauge));
        let keep = (cq.clone(), self.clone());
        let ctx = self.inner.ctx.clone();
        Ok(Srq { inner: Arc::new(SrqInner { ctx, id, post, _xrc: Some(keep), tm: None }) })
    }

    /// Creates an XRC target QP of this domain (`ibv_create_qp_ex` with
    /// `IBV_QPT_XRC_RECV`): no PD, CQs or queues of its own. Connect it
    /// to the peer's initiator as any RC QP (it sends only responses).
    ///
    /// # Errors
    /// [`Error::Limit`] past `max_qp`.
    pub fn create_target_qp(&self) -> Result<Qp> {
        let ctx = &self.inner.ctx;
        let mut e = ctx.lock();
        if e.ep.qp_count() as u32 >= limits::MAX_QP {
            return Err(Error::Limit("max_qp"));
        }
        let qpn = e.ep.alloc_qpn();
        let qp_init = target_init(ctx, qpn);
        let qp = uroce_transport::Qp::new(qp_init);
        let post = Arc::new(QpPost::new(qp_init, qp.gauge()));
        e.ep.add_xrc_target(qp, self.inner.id);
        // Listed for the domain's other processes to open (a full table:
        // not openable elsewhere).
        if let (Some(table), Some(domain)) = (&self.inner.shared, &self.inner.domain)
            && let Some(listing) = table.register(crate::xrc_open::TARGET_TAG | qpn)
        {
            e.share_target((self.inner.id, qpn), listing, domain.clone());
        }
        drop(e);
        let life = Arc::new(SharedTarget { ctx: ctx.clone(), qpn, post });
        let mut targets = self.inner.targets.lock().unwrap_or_else(|e| e.into_inner());
        targets.retain(|_, t| t.strong_count() > 0);
        targets.insert(qpn, Arc::downgrade(&life));
        Ok(self.target_handle(life))
    }

    /// Whether target QPs of this domain that no handle here holds any
    /// more are kept for other processes' handles (`ibv_open_qp`): the
    /// kernel refuses to close a domain a QP still uses (`EBUSY`).
    pub fn kept_for_others(&self) -> bool {
        self.inner.ctx.lock().opens.keeps_domain(self.inner.id)
    }

    /// Opens another handle to this domain's target QP `qpn`
    /// (`ibv_open_qp`): it modifies, queries and keeps the QP alive as the
    /// creator's handle does, and the QP is destroyed with the last handle.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the domain has no live target QP of
    /// that number.
    pub fn open_target_qp(&self, qpn: u32) -> Result<Qp> {
        let targets = self.inner.targets.lock().unwrap_or_else(|e| e.into_inner());
        let life = targets.get(&qpn).and_then(Weak::upgrade);
        drop(targets);
        match life {
            Some(life) => Ok(self.target_handle(life)),
            None => self.open_remote_target(qpn),
        }
    }

    /// [`Xrcd::open_target_qp`] of another process's target QP of a shared
    /// domain: a proxy (see `xrc_open`).
    fn open_remote_target(&self, qpn: u32) -> Result<Qp> {
        use crate::xrc_open::{OPENER_TAG, Op, TARGET_TAG};
        let none = Error::InvalidArgument("no target QP of that number in the domain");
        let (Some(table), Some(domain)) = (&self.inner.shared, &self.inner.domain) else {
            return Err(none);
        };
        if qpn & (TARGET_TAG | OPENER_TAG) != 0 || !domain.listed_alive(TARGET_TAG | qpn) {
            return Err(none);
        }
        let ctx = self.inner.ctx.clone();
        let proxy = {
            let mut e = ctx.lock();
            let proxy = e.ep.alloc_qpn();
            // No QP or SRQ gets it while the proxy answers to it.
            e.ep.hold_qpn(proxy);
            proxy
        };
        let Some(listing) = table.register(OPENER_TAG | proxy) else {
            ctx.lock().ep.release_qpn(proxy);
            return Err(Error::Limit("XRC SRQs and target QPs in a shared domain"));
        };
        let calls = Mutex::new(());
        let remote = RemoteTarget { ctx: ctx.clone(), qpn, proxy, _listing: listing, calls };
        remote.call(Op::Open, 0, None)?;
        // Nothing is ever posted to a target QP: an idle posting state.
        let gauge = Arc::new(uroce_transport::QueueGauge::default());
        let post = Arc::new(QpPost::new(target_init(&ctx, qpn), gauge));
        let mut handle = self.target_handle_of(ctx, qpn, post);
        handle.remote = Some(Arc::new(remote));
        Ok(handle)
    }

    fn target_handle(&self, life: Arc<SharedTarget>) -> Qp {
        let mut qp = self.target_handle_of(life.ctx.clone(), life.qpn, life.post.clone());
        qp.target = Some(life);
        qp
    }

    fn target_handle_of(&self, ctx: Arc<Inner>, qpn: u32, post: Arc<QpPost>) -> Qp {
        Qp {
            ctx,
            qpn,
            post,
            cap: QpCaps {
                max_send_wr: 0,
                max_recv_wr: 0,
                max_send_sge: 0,
                max_recv_sge: 0,
                max_inline_data: 0,
            },
            qp_type: QpType::XrcRecv,
            _pd: None,
            _cqs: Vec::new(),
            _srq: None,
            _xrcd: Some(self.clone()),
            target: None,
            remote: None,
            _table: None,
        }
    }
}

impl Mr {
    /// Whether it was registered on demand ([`Pd::register_on_demand`]).
    pub fn on_demand(&self) -> bool {
        self.on_demand
    }

    /// Moves the region to `pd` and/or gives it `access` (`ibv_rereg_mr`
    /// with `IBV_REREG_MR_CHANGE_PD` / `_ACCESS`) in place: its keys stay
    /// (as rxe and mlx5 keep them; a peer that holds the rkey goes on
    /// using it, under the new rights).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for rights that do not go together or a
    /// PD of another context.
    pub fn rereg(&mut self, pd: Option<&Pd>, access: Option<Access>) -> Result<()> {
        self.rereg_with(pd, None, access)
    }

    /// [`Mr::rereg`] that also registers another range of memory
    /// (`IBV_REREG_MR_CHANGE_TRANSLATION`): `len` bytes at `ptr`, named by
    /// peers at `iova`. An owned region's buffer is freed, its keys
    /// revoked first.
    ///
    /// # Safety
    /// As [`Pd::register_raw_at`]: `ptr..ptr+len` stays valid for reads
    /// and writes until this region is dropped or registered again.
    ///
    /// # Errors
    /// As [`Mr::rereg`], and as [`Pd::register_raw_at`] for the range.
    #[allow(unsafe_code)]
    pub unsafe fn rereg_translation(
        &mut self,
        pd: Option<&Pd>,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Option<Access>,
    ) -> Result<()> {
        let nn = NonNull::new(ptr).ok_or(Error::InvalidArgument("null address"))?;
        if len == 0 || iova.checked_add(len as u64).is_none() {
            return Err(Error::InvalidArgument("empty range, or iova + length overflows"));
        }
        if len as u64 > limits::MAX_MR_SIZE {
            return Err(Error::Limit("max_mr_size"));
        }
        self.rereg_with(pd, Some((nn, len, iova)), access)?;
        // The old buffer's keys are revoked: it may go.
        self._owned = None;
        Ok(())
    }

    #[allow(unsafe_code)]
    fn rereg_with(
        &mut self,
        pd: Option<&Pd>,
        range: Option<(NonNull<u8>, usize, u64)>,
        access: Option<Access>,
    ) -> Result<()> {
        if let Some(a) = access {
            check_access(a)?;
        }
        if pd.is_some_and(|p| !Arc::ptr_eq(&p.ctx, &self.ctx)) {
            return Err(Error::InvalidArgument("the PD is on another context"));
        }
        let mut e = self.ctx.lock();
        // SAFETY: a new range comes from `rereg_translation`, whose caller
        // keeps it valid until the key is removed; otherwise the region's
        // memory stays what it was, under the same guarantee.
        let key = unsafe { e.mem.reregister(self.key, range, pd.map(|p| p.handle), access) }
            .ok_or(Error::InvalidArgument("the region is not registered"))?;
        self.key = key;
        if let Some((_, len, iova)) = range {
            (self.len, self.addr) = (len, iova);
        }
        if let Some(a) = access {
            self.access = a;
        }
        Ok(())
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.key
    }
    /// The remote key (equal to the local key, as in rxe).
    pub fn rkey(&self) -> u32 {
        self.key
    }
    /// The region's address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }
    /// An SGE for `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`].
    pub fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        if offset.checked_add(len as usize).is_none_or(|e| e > self.len) {
            return Err(Error::OutOfBounds);
        }
        Ok(Sge { addr: self.addr + offset as u64, length: len, lkey: self.key })
    }
    /// Copies `data` into the region at `offset`.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`].
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        if self.ctx.lock().mem.app_write(self.key, offset, data) {
            Ok(())
        } else {
            Err(Error::OutOfBounds)
        }
    }
    /// Copies bytes at `offset` out of the region.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`].
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        if self.ctx.lock().mem.app_read(self.key, offset, out) {
            Ok(())
        } else {
            Err(Error::OutOfBounds)
        }
    }
    /// Reads the whole region into a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        let _ = self.read(0, &mut v);
        v
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.ctx.lock().mem.deregister(self.key);
        // `_owned` (if any) is freed after this, with the key revoked.
    }
}

struct CqInner {
    ctx: Arc<Inner>,
    id: u32,
    /// The ring, shared with the endpoint: polled, armed and acknowledged
    /// without the context's lock.
    ring: uroce_transport::SharedCq,
    /// Made with a completion channel (arming needs one).
    channel: bool,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        self.ctx.lock().destroy_cq(self.id);
    }
}

/// A completion queue (`ibv_cq`). Cloning shares the queue; QPs keep their
/// CQs alive.
#[derive(Clone)]
pub struct Cq {
    inner: Arc<CqInner>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cq({}, {} entries)", self.inner.id, self.cqe())
    }
}

impl Cq {
    /// The handle events name this CQ by.
    pub fn handle(&self) -> u32 {
        self.inner.id
    }

    /// Capacity.
    pub fn cqe(&self) -> u32 {
        self.inner.ring.lock().capacity() as u32
    }

    /// The wall-clock time (nanoseconds since the Unix epoch) of a
    /// completion timestamp of this CQ (see [`Context::wallclock_ns`]).
    pub fn wallclock_ns(&self, timestamp: u64) -> u64 {
        self.inner.ctx.wallclock_ns(timestamp)
    }

    /// Moderates the CQ's events (`ibv_modify_cq` with
    /// `IBV_CQ_ATTR_MODERATE`): once armed, it notifies after `count`
    /// completions, or `period_us` microseconds after the first of them,
    /// whichever comes first (count 1 and period 0: every completion).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a period above `max_cq_period`.
    pub fn moderate(&self, count: u16, period_us: u16) -> Result<()> {
        if period_us > limits::MAX_CQ_PERIOD_US {
            return Err(Error::InvalidArgument("moderation period above max_cq_period"));
        }
        let period = std::time::Duration::from_micros(u64::from(period_us));
        let mut e = self.inner.ctx.lock();
        if e.ep.moderate_cq(self.inner.id, count, period) {
            Ok(())
        } else {
            Err(Error::InvalidArgument("CQ destroyed"))
        }
    }

    /// Completions waiting to be polled (not a verbs call: for monitoring
    /// and tests).
    pub fn pending(&self) -> usize {
        self.inner.ring.lock().len()
    }

    /// Resizes the CQ to `cqe` entries (`ibv_resize_cq`), growing or
    /// shrinking it with completions waiting; they stay, in order.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0, more than `max_cqe`, or fewer
    /// entries than completions wait (as rxe refuses them).
    pub fn resize(&self, cqe: u32) -> Result<()> {
        if cqe == 0 || cqe > limits::MAX_CQE {
            return Err(Error::InvalidArgument("cqe out of range"));
        }
        // Completions the device has made count, though a progress pass
        // has not moved them to the ring yet (rdma-core's test posts
        // sends and shrinks the CQ below their completions at once).
        self.inner.ctx.lock().progress();
        if self.inner.ring.lock().resize(cqe as usize) {
            Ok(())
        } else {
            Err(Error::InvalidArgument("more completions wait than the new size holds"))
        }
    }

    /// Arms the CQ (`ibv_req_notify_cq`): the next completion (with
    /// `solicited_only`, the next solicited receive or error completion)
    /// raises one event on the CQ's channel. Completions already queued do
    /// not: poll again after arming, as verbs programs do.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the CQ has no channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if !self.inner.channel {
            return Err(Error::InvalidArgument("CQ has no completion channel"));
        }
        self.inner.ring.lock().arm(solicited_only);
        // Arming means the caller is about to sleep on the channel.
        self.inner.ctx.activity.release();
        Ok(())
    }

    /// Acknowledges `n` events taken from the channel for this CQ
    /// (`ibv_ack_cq_events`).
    pub fn ack_events(&self, n: u32) {
        self.inner.ring.lock().ack_events(u64::from(n));
    }

    /// Events raised and not yet acknowledged.
    pub fn unacked_events(&self) -> u64 {
        self.inner.ring.lock().unacked_events()
    }

    /// Fills `out` with completions, oldest first, and returns how many
    /// (`ibv_poll_cq`). Drives progress inline first, unless the ring
    /// already holds enough or another thread is driving it (the progress
    /// thread in a pass, another poller): a poll never waits for the
    /// context's lock.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] once the CQ has overflowed (a completion
    /// was lost: the CQ is in error, as `IBV_EVENT_CQ_ERR` reports).
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let mut n = 0;
        self.poll_with(out.len(), |c| {
            out[n] = *c;
            n += 1;
        })
    }

    /// [`Cq::poll`] handing each completion (up to `max`, oldest first)
    /// to `sink` straight from the CQ's ring, for callers that keep
    /// completions in a layout of their own (the C ABI's `ibv_wc`): one
    /// copy fewer, and no array of placeholders to fill first. `sink`
    /// runs with the CQ's ring locked: it must not call into uroce.
    ///
    /// # Errors
    /// As [`Cq::poll`].
    pub fn poll_with(&self, max: usize, mut sink: impl FnMut(&Completion)) -> Result<usize> {
        let ctx = &self.inner.ctx;
        let wall_ns = ctx.activity.wall_ns();
        // A ring that can fill the caller's array needs no progress pass
        // (and its receive system call) first.
        let enough = self.inner.ring.lock().len() >= max;
        match (!enough).then(|| ctx.try_lock()).flatten() {
            Some(mut e) => ctx.app_progress_at(&mut e, wall_ns),
            // Enough already, or a pass is under way elsewhere: what it
            // completes is on the ring for this poll or the next. The
            // mark still tells the progress thread an application polls.
            None => ctx.activity.touch_at(wall_ns),
        }
        let mut cq = self.inner.ring.lock();
        if cq.overflowed() {
            return Err(Error::InvalidArgument("CQ overrun: completions were lost"));
        }
        let mut n = 0;
        while n < max {
            let Some(c) = cq.pop() else { break };
            sink(&c);
            n += 1;
        }
        drop(cq);
        if n > 0 {
            crate::timeline::event("poll", n as u64, 0);
        }
        ctx.activity.after_poll(wall_ns, n);
        Ok(n)
    }
}

/// What [`Pd::create_qp`] needs (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr<'a> {
    /// CQ for send completions.
    pub send_cq: &'a Cq,
    /// CQ for receive completions.
    pub recv_cq: &'a Cq,
    /// Queue sizes.
    pub cap: QpCaps,
    /// Transport type.
    pub qp_type: QpType,
    /// Every send WR is signaled.
    pub sq_sig_all: bool,
    /// Take receives from this shared receive queue (`cap.max_recv_*`
    /// are then ignored).
    pub srq: Option<&'a Srq>,
}

/// A queue pair (`ibv_qp`).
pub struct Qp {
    ctx: Arc<Inner>,
    qpn: u32,
    /// Its posting state: where WRs wait while the driver is busy.
    post: Arc<QpPost>,
    /// The queue sizes granted (`ibv_create_qp` writes them back).
    cap: QpCaps,
    qp_type: QpType,
    /// What it keeps alive: its PD, CQs and SRQ (an XRC target: its
    /// domain only).
    _pd: Option<Pd>,
    _cqs: Vec<Cq>,
    _srq: Option<Srq>,
    _xrcd: Option<Xrcd>,
    /// An XRC target's shared life: it destroys the QP, not this handle.
    target: Option<Arc<SharedTarget>>,
    /// Another process's XRC target QP, opened here: a proxy.
    remote: Option<Arc<RemoteTarget>>,
    /// An RSS QP's indirection table.
    _table: Option<RwqIndTable>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Qp({:#x})", self.qpn)
    }
}

impl Qp {
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Whether the QP takes its receives from an SRQ.
    pub fn uses_srq(&self) -> bool {
        self._srq.is_some()
    }

    /// An XRC target QP's domain.
    pub fn xrcd(&self) -> Option<&Xrcd> {
        self._xrcd.as_ref()
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The queue sizes granted: those asked for, with at least 16 inline
    /// bytes per send SGE (as rxe grants them).
    pub fn cap(&self) -> QpCaps {
        self.cap
    }

    /// The source GID index for reaching `peer`: the first GID of the
    /// peer's address family and scope (index 0, the device's address,
    /// when it suits), or 0 when none does.
    pub fn gid_index_for(&self, peer: std::net::IpAddr) -> u8 {
        self.ctx.lock().gid_for(peer).and_then(|i| u8::try_from(i).ok()).unwrap_or(0)
    }

    /// Modifies attributes and state (`ibv_modify_qp`).
    ///
    /// # Errors
    /// [`Error::Modify`] (EINVAL) for a wrong transition, mask or value.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        if let Some(r) = &self.remote {
            return r.modify(attr, mask);
        }
        let mut e = self.ctx.lock();
        if self.qp_type == QpType::RawPacket {
            let now = e.now();
            let d = &mut *e;
            let mut cqs = crate::driver::CqsAt { ep: &mut d.ep, now };
            d.raw.modify(self.qpn, attr, mask, &mut cqs)?;
            if mask.contains(AttrMask::STATE) && attr.state == uroce_transport::QpState::Reset {
                d.ep.purge_cq_completions(self.raw_cqs(), self.qpn);
            }
            d.forward_events();
            return Ok(());
        }
        e.modify_qp(self.qpn, attr, mask)
    }

    /// Current attributes (`ibv_query_qp`).
    pub fn query(&self) -> QpAttr {
        if let Some(r) = &self.remote {
            // Its creator gone: as a QP in the error state.
            let error = QpAttr { state: uroce_transport::QpState::Error, ..QpAttr::default() };
            return r.query().unwrap_or(error);
        }
        let e = self.ctx.lock();
        if let Some((state, port)) = e.raw.query(self.qpn) {
            return QpAttr { state, port, ..QpAttr::default() };
        }
        e.ep.qp(self.qpn).map(|q| q.attr()).unwrap_or_default()
    }

    /// Send WRs the send queue takes now: its depth less the WQEs it holds
    /// (as of the completions that reached the CQ) and those posted while
    /// the context was busy. A batch that must go whole (`ibv_wr_complete`)
    /// checks it first.
    pub fn send_queue_room(&self) -> u32 {
        self.post.send_room()
    }

    /// Posts send WRs and starts sending at once (`ibv_post_send`).
    ///
    /// # Errors
    /// [`Error::Post`] naming the first WR that was not posted.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.post_with(wrs, None)
    }

    /// Posts `wrs` at once if no other thread holds the driver (after the
    /// WRs staged before them), else stages them for whoever holds it
    /// (see `staging`): a post never waits for a progress pass. `gather`
    /// reads an inline WR's gather list without a key (the C contract);
    /// without it such WRs are read through the key table, under the
    /// driver.
    fn post_with(&self, wrs: &[SendWr<'_>], gather: Option<Gather<'_>>) -> Result<()> {
        if self.qp_type == QpType::RawPacket {
            let mut e = self.ctx.lock();
            let now = e.now();
            let d = &mut *e;
            let mut cqs = crate::driver::CqsAt { ep: &mut d.ep, now };
            // Only INLINE WRs read their gather lists without a key check.
            let unchecked = crate::mr::UncheckedInline(&d.mem);
            let inline = gather.map(|_| &unchecked as &dyn uroce_transport::Memory);
            let r = d.raw.post_send(self.qpn, wrs, &d.mem, inline, &mut cqs);
            d.forward_events();
            return r.map_err(|(index, error)| Error::Post { index, error });
        }
        let keyed_gather = gather.is_none()
            && wrs.iter().any(|w| {
                w.flags.contains(SendFlags::INLINE)
                    && w.inline_data.is_none()
                    && !w.opcode.is_read_or_atomic()
            });
        let mut e = if keyed_gather {
            self.ctx.lock()
        } else if let Some(e) = self.ctx.try_lock() {
            e
        } else {
            // Without a gather function, no WR here reads its gather list.
            let (r, list) = self.post.stage(wrs, gather.unwrap_or(&|_, _| {}));
            if list {
                self.ctx.list_staged(crate::staging::Staged::Qp(self.post.clone()));
            }
            return r.map_err(|(index, error)| Error::Post { index, error });
        };
        let (wall_ns, now) = self.ctx.clock(&e);
        let eng = &mut *e;
        let (ep, mem) = (&mut eng.ep, &eng.mem);
        let qpn = self.qpn;
        let (r, staged) = self.post.post_after_staged(ep, now, |ep| {
            let qp = ep.qp_mut(qpn).ok_or(Error::InvalidArgument("QP destroyed"))?;
            let r = match gather {
                Some(_) => qp.post_send_gather(now, wrs, &crate::mr::UncheckedInline(mem)),
                None => qp.post_send_gather(now, wrs, mem),
            };
            Ok::<_, Error>((r, qp.take_awaited_post()))
        });
        eng.deferred_posts += staged;
        let (r, awaited) = r?;
        self.ctx.doorbell(&mut e, awaited, wall_ns, now);
        r.map_err(|(index, error)| Error::Post { index, error })
    }

    /// [`Qp::post_send`] with the C verbs contract for `INLINE` WRs: their
    /// gather lists are read as plain addresses of this process, without
    /// L_Key checks (`ibv_post_send`; the drop-in library posts this way).
    ///
    /// # Safety
    /// Every SGE of every `INLINE` WR without [`SendWr::inline_data`] (and
    /// not a READ or atomic) names `length` bytes readable for the duration
    /// of the call.
    ///
    /// # Errors
    /// [`Error::Post`] naming the first WR that was not posted.
    #[allow(unsafe_code)]
    pub unsafe fn post_send_unchecked_inline(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        // SAFETY: this function's contract: an inline WR's gather entries
        // name readable memory of this process for the call's duration.
        let gather = |sge: &Sge, out: &mut [u8]| unsafe {
            crate::mr::copy_from_process(sge.addr, out);
        };
        self.post_with(wrs, Some(&gather))
    }

    /// Posts receive WRs (`ibv_post_recv`).
    ///
    /// # Errors
    /// [`Error::Post`] naming the first WR that was not posted.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.qp_type == QpType::RawPacket {
            let r = self.ctx.lock().raw.post_recv(self.qpn, wrs);
            return r.map_err(|(index, error)| Error::Post { index, error });
        }
        // As a send post: at once if the driver is free, else staged.
        let Some(mut e) = self.ctx.try_lock() else {
            let (r, list) = self.post.stage_recv(wrs);
            if list {
                self.ctx.list_staged(crate::staging::Staged::Qp(self.post.clone()));
            }
            return r.map_err(|(index, error)| Error::Post { index, error });
        };
        let now = e.now();
        let eng = &mut *e;
        let qpn = self.qpn;
        let (r, staged) = self.post.post_after_staged(&mut eng.ep, now, |ep| {
            let qp = ep.qp_mut(qpn).ok_or(Error::InvalidArgument("QP destroyed"))?;
            Ok::<_, Error>(qp.post_recv(wrs))
        });
        eng.deferred_posts += staged;
        r?.map_err(|(index, error)| Error::Post { index, error })
    }

    /// This QP's counters.
    pub fn stats(&self) -> uroce_transport::Stats {
        self.ctx.lock().ep.qp(self.qpn).map(|q| *q.stats()).unwrap_or_default()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // Device totals keep what destroyed QPs counted (as rxe's do).
        if self.qp_type == QpType::RawPacket {
            self.ctx.lock().raw.destroy(self.qpn);
        } else if self.target.is_none() && self.remote.is_none() {
            self.ctx.lock().destroy_qp(self.qpn);
        }
    }
}

impl Qp {
    /// Attaches this UD QP to multicast group `gid` (`ibv_attach_mcast`):
    /// an IPv4 (or IPv4-mapped) or IPv6 multicast address. Datagrams sent
    /// to the group with remote QPN 0xFFFFFF reach every attached QP.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a non-UD QP or a non-multicast
    /// address; [`Error::Limit`] past the device's group limits; an I/O
    /// error joining the group.
    pub fn attach_mcast(&self, gid: std::net::IpAddr) -> Result<()> {
        let gid = crate::AhAttr::from_gid(crate::wire::grh::gid_of(gid)).dst;
        if self.qp_type != QpType::Ud || !gid.is_multicast() {
            return Err(Error::InvalidArgument("multicast needs a UD QP and a multicast GID"));
        }
        let mut e = self.ctx.lock();
        let (groups, here) = e.ep.mcast_counts(gid);
        if (here == 0 && groups as u32 >= limits::MAX_MCAST_GRP)
            || here as u32 >= limits::MAX_MCAST_QP_ATTACH
        {
            return Err(Error::Limit("multicast groups"));
        }
        e.attach(self.qpn, gid).map_err(Error::Io)
    }

    /// Detaches this QP from group `gid` (`ibv_detach_mcast`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if it was not attached.
    pub fn detach_mcast(&self, gid: std::net::IpAddr) -> Result<()> {
        let gid = crate::AhAttr::from_gid(crate::wire::grh::gid_of(gid)).dst;
        if self.ctx.lock().detach(self.qpn, gid) {
            Ok(())
        } else {
            Err(Error::InvalidArgument("not attached"))
        }
    }
}

struct SrqInner {
    ctx: Arc<Inner>,
    id: u32,
    /// Its posting state: where receive WRs wait while the driver is busy.
    post: Arc<crate::staging::SrqPost>,
    /// An XRC SRQ's CQ and domain, kept alive with it.
    _xrc: Option<(Cq, Xrcd)>,
    /// A tag matching SRQ's.
    tm: Option<TmSrq>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        self.ctx.lock().ep.remove_srq(self.id);
    }
}

/// A shared receive queue (`ibv_srq`). Cloning shares it; QPs attached to
/// it keep it alive.
#[derive(Clone)]
pub struct Srq {
    inner: Arc<SrqInner>,
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Srq({})", self.inner.id)
    }
}

/// `ibv_srq_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Capacity in WQEs.
    pub max_wr: u32,
    /// SGEs per WQE.
    pub max_sge: u32,
    /// Armed low-water mark (0: disarmed).
    pub srq_limit: u32,
}

impl SrqAttr {
    /// Sizes of 0 or above the device's limits are refused.
    fn check_size(&self) -> Result<()> {
        let wr = (1..=limits::MAX_SRQ_WR).contains(&self.max_wr);
        let sge = (1..=limits::MAX_SGE).contains(&self.max_sge);
        if wr && sge { Ok(()) } else { Err(Error::InvalidArgument("SRQ size out of range")) }
    }
}

impl Context {
    /// Creates a shared receive queue (`ibv_create_srq`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for sizes of 0 or above the device limits,
    /// or a limit above `max_wr`; [`Error::Limit`] past `max_srq`.
    pub fn create_srq(&self, attr: &SrqAttr) -> Result<Srq> {
        attr.check_size()?;
        self.install_srq(uroce_transport::Srq::new(attr.max_wr, attr.max_sge), attr, None)
    }

    /// Arms `srq`'s limit and adds it to the device (a basic or tag
    /// matching SRQ, `tm` keeping the latter's CQ).
    fn install_srq(
        &self,
        mut srq: uroce_transport::Srq,
        attr: &SrqAttr,
        tm: Option<TmSrq>,
    ) -> Result<Srq> {
        srq.arm(attr.srq_limit).map_err(|_| Error::InvalidArgument("srq_limit above max_wr"))?;
        let mut e = self.inner.lock();
        if e.ep.srq_count() as u32 >= limits::MAX_SRQ {
            return Err(Error::Limit("max_srq"));
        }
        let gauge = srq.gauge();
        let id = e.ep.add_srq(srq);
        let post = Arc::new(crate::staging::SrqPost::new(id, attr.max_wr, attr.max_sge, gauge));
        Ok(Srq { inner: Arc::new(SrqInner { ctx: self.inner.clone(), id, post, _xrc: None, tm }) })
    }
}

impl Context {
    /// Creates a tag matching SRQ (`ibv_create_srq_ex` with
    /// `IBV_SRQT_TM`): besides plain receive WQEs it keeps up to
    /// `max_tags` tagged buffers ([`Srq::post_ops`]); its receives and
    /// list operations complete on `cq` (see `uroce_transport::tm`).
    ///
    /// # Errors
    /// As [`Context::create_srq`], and [`Error::InvalidArgument`] for
    /// `max_tags` of 0 or above `tm_max_num_tags`, or a CQ of another
    /// context.
    pub fn create_tm_srq(&self, cq: &Cq, attr: &SrqAttr, max_tags: u32) -> Result<Srq> {
        if !Arc::ptr_eq(&cq.inner.ctx, &self.inner) {
            return Err(Error::InvalidArgument("CQ of another context"));
        }
        if max_tags == 0 || max_tags > uroce_transport::tm::MAX_TAGS {
            return Err(Error::InvalidArgument("max_num_tags out of range"));
        }
        attr.check_size()?;
        let srq = uroce_transport::Srq::new_tm(attr.max_wr, attr.max_sge, max_tags, cq.inner.id);
        self.install_srq(srq, attr, Some(TmSrq { _cq: cq.clone() }))
    }
}

/// What a tag matching SRQ keeps alive: the CQ it completes on.
struct TmSrq {
    _cq: Cq,
}

impl Srq {
    /// The handle events name this SRQ by.
    pub fn handle(&self) -> u32 {
        self.inner.id
    }

    /// Whether this is a tag matching SRQ.
    pub fn is_tag_matching(&self) -> bool {
        self.inner.tm.is_some()
    }

    /// Runs tag matching list operations (`ibv_post_srq_ops`), in order:
    /// each ADD's handle is written to `handles` at its index (a DEL names
    /// one); the operations asked to be signaled complete on the SRQ's CQ.
    ///
    /// # Errors
    /// [`Error::Post`] naming the first operation not run: `InvalidOpcode`
    /// (EINVAL) on an SRQ without tag matching, `QueueFull` (ENOMEM) for
    /// an ADD to a full list.
    pub fn post_ops(
        &self,
        ops: &[uroce_transport::tm::OpsWr],
        handles: &mut [Option<u32>],
    ) -> Result<()> {
        let ctx = &self.inner.ctx;
        let mut e = ctx.lock();
        let now = e.now();
        let r = e.ep.post_srq_ops(now, self.inner.id, ops, handles);
        // Completions (and their channel's events) go out now.
        ctx.app_progress(&mut e);
        r.map_err(|(index, error)| Error::Post { index, error })
    }

    /// Posts receive WRs (`ibv_post_srq_recv`).
    ///
    /// # Errors
    /// [`Error::Post`] naming the first WR that was not posted.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        // As a QP's posts: at once if the driver is free (after the WRs
        // staged before), else staged for whoever holds it (`staging`).
        let ctx = &self.inner.ctx;
        let mut e = match ctx.try_lock() {
            Some(e) => e,
            None => match self.inner.post.stage(wrs) {
                Some((r, list)) => {
                    if list {
                        ctx.list_staged(crate::staging::Staged::Srq(self.inner.post.clone()));
                    }
                    return r.map_err(|(index, error)| Error::Post { index, error });
                }
                // The SRQ outgrew its staging ring: wait for the driver.
                None => ctx.lock(),
            },
        };
        let id = self.inner.id;
        self.inner.post.post_after_staged(&mut e.ep, |ep| {
            let srq = ep.srq_mut(id).ok_or(Error::InvalidArgument("SRQ destroyed"))?;
            srq.post_recv(wrs).map_err(|(index, error)| Error::Post { index, error })
        })
    }

    /// Resizes the SRQ to `max_wr` WQEs (`ibv_modify_srq` with
    /// `IBV_SRQ_MAX_WR`), keeping the WQEs posted.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0, more than `max_srq_wr`, fewer
    /// than are posted, or fewer than the armed limit.
    pub fn resize(&self, max_wr: u32) -> Result<()> {
        if max_wr > limits::MAX_SRQ_WR {
            return Err(Error::InvalidArgument("max_wr above max_srq_wr"));
        }
        let mut e = self.inner.ctx.lock();
        let srq = e.ep.srq_mut(self.inner.id).ok_or(Error::InvalidArgument("SRQ destroyed"))?;
        srq.resize(max_wr)
            .map_err(|_| Error::InvalidArgument("max_wr below the WQEs posted or the limit"))
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`); 0
    /// disarms.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a limit above `max_wr`.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let mut e = self.inner.ctx.lock();
        let srq = e.ep.srq_mut(self.inner.id).ok_or(Error::InvalidArgument("SRQ destroyed"))?;
        srq.arm(limit).map_err(|_| Error::InvalidArgument("srq_limit above max_wr"))
    }

    /// Current attributes (`ibv_query_srq`).
    pub fn query(&self) -> SrqAttr {
        let e = self.inner.ctx.lock();
        e.ep.srq(self.inner.id).map_or(SrqAttr { max_wr: 0, max_sge: 0, srq_limit: 0 }, |s| {
            SrqAttr { max_wr: s.max_wr(), max_sge: s.max_sge(), srq_limit: s.limit() }
        })
    }

    /// WQEs posted and not yet taken.
    pub fn len(&self) -> usize {
        self.inner.ctx.lock().ep.srq(self.inner.id).map_or(0, |s| s.len())
    }

    /// Whether no WQE is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A memory window (`ibv_mw`): remote access to part of a region under its
/// own R_Key and rights, bound with [`Qp::bind_mw`] (type 1) or a
/// `BindMw` work request (type 2).
pub struct Mw {
    ctx: Arc<Inner>,
    key: u32,
    kind: MwType,
    _pd: Pd,
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mw({:?}, rkey {:#x})", self.kind, self.rkey())
    }
}

/// The next R_Key of a window: same index, next key byte (`ibv_inc_rkey`).
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

impl Pd {
    /// Allocates an unbound memory window (`ibv_alloc_mw`).
    ///
    /// # Errors
    /// [`Error::Limit`] past `max_mw`.
    pub fn alloc_mw(&self, kind: MwType) -> Result<Mw> {
        let mut e = self.ctx.lock();
        if e.mem.windows_len() as u32 >= limits::MAX_MW {
            return Err(Error::Limit("max_mw"));
        }
        let key = e.mem.alloc_mw(self.handle, kind);
        Ok(Mw { ctx: self.ctx.clone(), key, kind, _pd: self.clone() })
    }
}

impl Mw {
    /// The window's current R_Key (it changes with every bind).
    pub fn rkey(&self) -> u32 {
        self.ctx.lock().mem.mw_rkey(self.key).unwrap_or(self.key)
    }

    /// Type 1 or type 2.
    pub fn kind(&self) -> MwType {
        self.kind
    }

    /// The `bind` of a type 2 `BindMw` work request over `len` bytes of
    /// `mr` at `offset`, giving the window the R_Key [`inc_rkey`] of its
    /// current one.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a range outside the region.
    pub fn bind_info(&self, mr: &Mr, offset: usize, len: usize, access: Access) -> Result<MwBind> {
        if offset.checked_add(len).is_none_or(|e| e > mr.len()) {
            return Err(Error::OutOfBounds);
        }
        let cur = self.rkey();
        Ok(MwBind {
            mw_rkey: cur,
            new_rkey: inc_rkey(cur),
            mr_lkey: mr.lkey(),
            addr: mr.addr() + offset as u64,
            length: len as u64,
            access,
        })
    }
}

impl Mw {
    /// The description of an unbind (a zero-length bind, no region): the
    /// window gets its next R_Key and covers nothing.
    pub fn unbind_info(&self) -> MwBind {
        let cur = self.rkey();
        MwBind {
            mw_rkey: cur,
            new_rkey: inc_rkey(cur),
            mr_lkey: 0,
            addr: 0,
            length: 0,
            access: Access(0),
        }
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        self.ctx.lock().mem.dealloc_mw(self.key);
    }
}

impl Qp {
    /// Binds a type 1 window over `len` bytes of `mr` at `offset`
    /// (`ibv_bind_mw`): posts the bind on this QP's send queue (it runs
    /// after the WRs before it and completes as `BindMw`) and returns the
    /// window's new R_Key. A length of 0 unbinds.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a type 2 window; [`Error::OutOfBounds`];
    /// [`Error::Post`].
    pub fn bind_mw(
        &self,
        mw: &Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: Access,
        wr_id: u64,
    ) -> Result<u32> {
        if mw.kind != MwType::Type1 {
            return Err(Error::InvalidArgument(
                "ibv_bind_mw binds type 1 windows; post a BindMw WR for type 2",
            ));
        }
        let bind = mw.bind_info(mr, offset, len, access)?;
        self.post_type1_bind(bind, wr_id)
    }

    /// Unbinds a type 1 window (`ibv_bind_mw` with no region and length
    /// 0): posted like a bind; its old R_Key fails from then on. Returns
    /// the window's new R_Key.
    ///
    /// # Errors
    /// As [`Qp::bind_mw`].
    pub fn unbind_mw(&self, mw: &Mw, wr_id: u64) -> Result<u32> {
        if mw.kind != MwType::Type1 {
            return Err(Error::InvalidArgument("only type 1 windows unbind this way"));
        }
        self.post_type1_bind(mw.unbind_info(), wr_id)
    }

    fn post_type1_bind(&self, bind: MwBind, wr_id: u64) -> Result<u32> {
        let wr = SendWr {
            wr_id,
            opcode: WrOpcode::BindMw,
            flags: SendFlags::SIGNALED,
            bind: Some(bind),
            ..SendWr::default()
        };
        self.post_send(&[wr])?;
        Ok(bind.new_rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A poll takes what its ring holds while another thread holds the
    /// context (a progress pass, a post): it never waits for it.
    #[test]
    fn a_poll_does_not_wait_for_the_context() {
        let (ctx, cq, qp, mr) = super::staging_tests::self_connected(4);
        qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[mr.sge(0, 64).unwrap()] }]).unwrap();
        let wr = SendWr {
            wr_id: 2,
            flags: SendFlags::INLINE,
            inline_data: Some(b"ping"),
            ..SendWr::default()
        };
        qp.post_send(&[wr]).unwrap();
        // Both completions onto the ring, none polled.
        let t = std::time::Instant::now();
        while cq.inner.ring.lock().len() < 2 {
            ctx.inner.lock().progress();
            assert!(t.elapsed() < Duration::from_secs(10), "no completions");
        }
        let poller = cq.clone();
        let got = super::staging_tests::while_held(&ctx, move || {
            let mut wc = [Completion::new(
                0,
                uroce_transport::WcStatus::Success,
                uroce_transport::WcOpcode::Send,
                0,
                false,
            ); 4];
            poller.poll(&mut wc).map(|n| wc[..n].iter().map(|c| c.wr_id).collect::<Vec<_>>())
        });
        let mut ids = got.unwrap();
        ids.sort_unstable();
        assert_eq!(ids, [1, 2]);
    }
}

#[cfg(test)]
mod staging_tests {
    use super::*;
    use std::time::Duration;

    /// A receive posted while another thread holds the context is staged
    /// (checked against the receive queue's room) and takes the next SEND.
    #[test]
    fn a_receive_post_does_not_wait_for_the_context() {
        let (ctx, cq, qp, mr) = self_connected(4);
        let qp = Arc::new(qp);
        let (poster, sge) = (qp.clone(), mr.sge(100, 64).unwrap());
        let (staged, full) = while_held(&ctx, move || {
            let r = |i| RecvWr { wr_id: i, sgl: std::slice::from_ref(&sge) };
            let staged = poster.post_recv(&[r(7)]);
            let many: Vec<RecvWr<'_>> = (10..30).map(r).collect();
            (staged, poster.post_recv(&many))
        });
        staged.unwrap();
        // The receive queue holds 16: 1 + 15 fit.
        queue_full_at(&full, 15);
        let send = SendWr {
            wr_id: 1,
            flags: SendFlags::INLINE,
            inline_data: Some(b"hi"),
            ..SendWr::default()
        };
        qp.post_send(&[send]).unwrap();
        let mut got = Vec::new();
        while got.len() < 2 {
            let c = crate::testing::wait_completion(&cq);
            assert_eq!(c.status, uroce_transport::WcStatus::Success, "{c:?}");
            got.push((c.wr_id, c.is_recv, c.byte_len));
        }
        got.sort_unstable();
        assert_eq!(got, [(1, false, 2), (7, true, 2)]);
        let mut bytes = [0u8; 2];
        mr.read(100, &mut bytes).unwrap();
        assert_eq!(&bytes, b"hi");
    }

    /// An SRQ post while another thread holds the context is staged too
    /// (checked against the SRQ's room as its gauge shows it, staged WRs
    /// included) and takes the next SEND of a QP on the SRQ, in post order.
    #[test]
    fn an_srq_post_does_not_wait_for_the_context() {
        let port = crate::testing::free_port();
        let ctx = crate::testing::open("127.0.0.1", port);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let srq = ctx.create_srq(&SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }).unwrap();
        let cap = QpCaps {
            max_send_wr: 4,
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 0,
            max_inline_data: 16,
        };
        let attr = QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: Some(&srq),
        };
        let qp = pd.create_qp(&attr).unwrap();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let mr = pd.alloc_mr(4096, all).unwrap();
        crate::connect(&qp, "127.0.0.1".parse().unwrap(), port, qp.qpn(), 1, 1, all).unwrap();
        // One WQE posted directly first: the staged ones come after it.
        srq.post_recv(&[RecvWr { wr_id: 1, sgl: &[mr.sge(0, 64).unwrap()] }]).unwrap();
        let (poster, sge) = (srq.clone(), mr.sge(100, 64).unwrap());
        let (staged, full) = while_held(&ctx, move || {
            let r = |i| RecvWr { wr_id: i, sgl: std::slice::from_ref(&sge) };
            let staged = poster.post_recv(&[r(2)]);
            let many: Vec<RecvWr<'_>> = (10..20).map(r).collect();
            (staged, poster.post_recv(&many))
        });
        staged.unwrap();
        // 8 WQEs: 1 posted + 1 staged + 6 fit.
        queue_full_at(&full, 6);
        for (i, text) in [b"one", b"two"].into_iter().enumerate() {
            let send = SendWr {
                wr_id: 50 + i as u64,
                flags: SendFlags::INLINE,
                inline_data: Some(text),
                ..SendWr::default()
            };
            qp.post_send(&[send]).unwrap();
        }
        let mut recvs = Vec::new();
        while recvs.len() < 2 {
            let c = crate::testing::wait_completion(&cq);
            assert_eq!(c.status, uroce_transport::WcStatus::Success, "{c:?}");
            if c.is_recv {
                recvs.push(c.wr_id);
            }
        }
        assert_eq!(recvs, [1, 2], "the direct post, then the staged one");
        let mut bytes = [0u8; 3];
        mr.read(100, &mut bytes).unwrap();
        assert_eq!(&bytes, b"two");
    }

    /// Runs `f` on another thread while this one holds `ctx`'s driver;
    /// panics if `f` waited for it (no result within 5 s).
    pub(super) fn while_held<T: Send + 'static>(
        ctx: &Context,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let held = ctx.inner.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        let got = rx.recv_timeout(Duration::from_secs(5));
        drop(held);
        got.expect("the call waited for the context")
    }

    /// `r` failed with a full queue at WR `index`.
    fn queue_full_at(r: &Result<()>, index: usize) {
        let full = uroce_transport::PostError::QueueFull;
        assert!(
            matches!(r, Err(Error::Post { index: i, error }) if *i == index && *error == full),
            "{r:?}"
        );
    }

    /// A receive staged while a pass holds the driver is in its QP before
    /// that same pass delivers a SEND the peer made after the post
    /// returned: on UC, a message with no receive WQE would be dropped.
    #[test]
    fn a_staged_receive_is_there_for_the_send_that_follows_it() {
        let port = crate::testing::free_port();
        let uc = |addr: &str| {
            let ctx = crate::testing::open(addr, port);
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(16).unwrap();
            let cap = QpCaps {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 16,
            };
            let qp = pd
                .create_qp(&QpInitAttr {
                    send_cq: &cq,
                    recv_cq: &cq,
                    cap,
                    qp_type: QpType::Uc,
                    sq_sig_all: true,
                    srq: None,
                })
                .unwrap();
            let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
            (ctx, cq, qp, mr)
        };
        let (actx, acq, aqp, _amr) = uc("127.0.0.1");
        let (bctx, bcq, bqp, bmr) = uc("127.0.0.2");
        let (a_ip, b_ip) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        crate::connect(&aqp, b_ip, port, bqp.qpn(), 1, 2, Access::LOCAL_WRITE).unwrap();
        crate::connect(&bqp, a_ip, port, aqp.qpn(), 2, 1, Access::LOCAL_WRITE).unwrap();
        let (poster, sge) = (Arc::new(bqp), bmr.sge(0, 64).unwrap());
        let p = poster.clone();
        // The test thread is B's progress pass: it holds B's driver
        // (taken after the QP, so that a failure drops it first).
        let mut pass = bctx.inner.lock();
        std::thread::spawn(move || p.post_recv(&[RecvWr { wr_id: 9, sgl: &[sge] }]))
            .join()
            .unwrap()
            .unwrap();
        // Only now does A send.
        let send = SendWr {
            wr_id: 1,
            flags: SendFlags::INLINE,
            inline_data: Some(b"after"),
            ..SendWr::default()
        };
        aqp.post_send(&[send]).unwrap();
        assert_eq!(crate::testing::wait_completion(&acq).wr_id, 1);
        let t = std::time::Instant::now();
        while bcq.inner.ring.lock().is_empty() {
            pass.progress();
            assert!(t.elapsed() < Duration::from_secs(5), "the SEND found no receive");
        }
        drop(pass);
        let c = crate::testing::wait_completion(&bcq);
        assert_eq!((c.wr_id, c.byte_len, c.status), (9, 5, uroce_transport::WcStatus::Success));
        drop(actx);
    }

    /// An RC QP connected to itself on 127.0.0.1, `depth` send WRs deep,
    /// with a 4 KiB region.
    pub(super) fn self_connected(depth: u32) -> (Context, Cq, Qp, Mr) {
        let port = crate::testing::free_port();
        let ctx = crate::testing::open("127.0.0.1", port);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let cap = QpCaps {
            max_send_wr: depth,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 16,
        };
        let qp = crate::testing::rc_qp(&pd, &cq, cap, true);
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let mr = pd.alloc_mr(4096, all).unwrap();
        let local = "127.0.0.1".parse().unwrap();
        crate::connect(&qp, local, port, qp.qpn(), 1, 1, all).unwrap();
        (ctx, cq, qp, mr)
    }

    fn write(mr: &Mr, i: u64, byte: &'static [u8]) -> SendWr<'static> {
        SendWr {
            wr_id: i,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::INLINE,
            inline_data: Some(byte),
            remote_addr: mr.addr() + i,
            rkey: mr.rkey(),
            ..SendWr::default()
        }
    }

    /// Posts made while another thread holds the context are staged at
    /// once (the poster does not wait), checked against the send queue's
    /// room, and leave in post order once the context is free.
    #[test]
    fn a_post_does_not_wait_for_the_context() {
        let (ctx, cq, qp, mr) = self_connected(4);
        let qp = Arc::new(qp);
        let (poster, m) = (qp.clone(), (mr.addr(), mr.rkey()));
        let (staged, full) = while_held(&ctx, move || {
            let w = |i: u64| SendWr {
                wr_id: i,
                opcode: WrOpcode::RdmaWrite,
                flags: SendFlags::INLINE,
                inline_data: Some(b"s"),
                remote_addr: m.0 + i,
                rkey: m.1,
                ..SendWr::default()
            };
            let staged = poster.post_send(&[w(0), w(1)]);
            // The send queue holds 4: the fifth WR does not fit.
            (staged, poster.post_send(&[w(2), w(3), w(4)]))
        });
        staged.unwrap();
        queue_full_at(&full, 2);
        let mut order = Vec::new();
        for _ in 0..4 {
            let c = crate::testing::wait_completion(&cq);
            assert_eq!(c.status, uroce_transport::WcStatus::Success, "{c:?}");
            order.push(c.wr_id);
        }
        assert_eq!(order, [0, 1, 2, 3]);
        // Room again: a direct post.
        qp.post_send(&[write(&mr, 5, b"d")]).unwrap();
        assert_eq!(crate::testing::wait_completion(&cq).wr_id, 5);
        let mut bytes = [0u8; 6];
        mr.read(0, &mut bytes).unwrap();
        assert_eq!(&bytes, b"ssss\0d");
    }
}
