//! `librdmacm.so.1` (the same file as `libibverbs.so.1`): the RDMA
//! connection manager's C API over `uroce::cm`'s event channels, for
//! reliable-connected ids (`RDMA_PS_TCP`, and `RDMA_PS_IB` served alike) and
//! UD ids (`RDMA_PS_UDP`, whose peer QP is found by SIDR).
//!
//! As rdma-core's librdmacm does over the kernel, the library moves the
//! QP itself: to INIT when `rdma_create_qp` makes it (a UD QP straight to
//! RTS with the RDMA CM's Q_Key), to RTR and RTS when the peer's reply
//! arrives (active side, inside `rdma_get_cm_event`, before it reports
//! ESTABLISHED and sends the RTU) or in `rdma_accept` (passive side), to
//! ERR in `rdma_disconnect`. Address resolution maps the destination to the
//! uroce device that reaches it (the bound source address's device, else
//! the kernel's source address for that destination, else the only device
//! of that family) and completes at once, as route resolution does. The
//! peer's RoCE UDP port is taken to be this device's (4791 in real use).
//!
//! Synchronous ids (created without a channel) and `rdma_create_ep` are
//! in `sync`.
//!
//! Multicast joins are in `mcast`.
//!
//! IPoIB ids are made, and refused where they would need an InfiniBand
//! link (binding to an address, resolving, listening), as the kernel's CM
//! refuses them on RoCE.
//!
//! ECE (`rdma_set_local_ece`, `rdma_get_remote_ece`, `rdma_reject_ece`)
//! rides in the REQ and REP as Linux's CM carries it; uroce's QPs have no
//! vendor options, so an id whose QP the library makes offers none, as on
//! rxe.
//!
//! Not yet: the rsocket calls (ENOSYS, `rsocket`).

mod abi;
mod mcast;
mod options;
mod rsocket;
mod sync;

pub(crate) use mcast::{rdma_join_multicast, rdma_join_multicast_ex, rdma_leave_multicast};
pub(crate) use options::rdma_set_option;
pub(crate) use rsocket::*;
pub(crate) use sync::{
    rdma_accept, rdma_connect, rdma_create_ep, rdma_destroy_ep, rdma_get_request,
    rdma_resolve_addr, rdma_resolve_route,
};

use std::cell::UnsafeCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Mutex, MutexGuard};

use uroce::cm::{AgentEvent, CmChannel, CmChannelEvent, Ece, Offer};
use uroce::wire::cm::{CmaHeader, Req, SidrReq, port_space, rdma_cm_service_id, rej_reason};

use self::abi::*;
use crate::abi::*;
use crate::ffi::{Kind, guard, is_live, minus_one, null_errno, register, set_errno, unregister};

// ---- ibv_qp_attr masks and values librdmacm sets ----
const QP_STATE: c_int = 1;
const QP_ACCESS_FLAGS: c_int = 1 << 3;
const QP_PKEY_INDEX: c_int = 1 << 4;
const QP_PORT: c_int = 1 << 5;
const QP_AV: c_int = 1 << 7;
const QP_PATH_MTU: c_int = 1 << 8;
const QP_TIMEOUT: c_int = 1 << 9;
const QP_RETRY_CNT: c_int = 1 << 10;
const QP_RNR_RETRY: c_int = 1 << 11;
const QP_RQ_PSN: c_int = 1 << 12;
const QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const QP_MIN_RNR_TIMER: c_int = 1 << 15;
const QP_SQ_PSN: c_int = 1 << 16;
const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const QP_DEST_QPN: c_int = 1 << 20;
const QPS_INIT: c_int = 1;
const QPS_RTR: c_int = 2;
const QPS_RTS: c_int = 3;
const QPS_ERR: c_int = 6;
const QP_QKEY: c_int = 1 << 6;
const QPT_RC: c_int = 2;
const QPT_UD: c_int = 4;
const QPT_XRC_SEND: c_int = 9;
const QPT_XRC_RECV: c_int = 10;
/// `IBV_QP_INIT_ATTR_XRCD`.
const QP_INIT_ATTR_XRCD: u32 = 1 << 1;
/// `IBV_SRQ_INIT_ATTR_TYPE`, `_PD`, `_XRCD`, `_CQ`; `IBV_SRQT_BASIC`,
/// `_XRC`.
const SRQ_ATTR_TYPE: u32 = 1;
const SRQ_ATTR_PD: u32 = 1 << 1;
const SRQ_ATTR_XRCD: u32 = 1 << 2;
const SRQ_ATTR_CQ: u32 = 1 << 3;
const SRQT_BASIC: c_int = 0;
const SRQT_XRC: c_int = 1;
/// The Q_Key of the RDMA CM's UD ids (`RDMA_UDP_QKEY`).
const UDP_QKEY: u32 = uroce::cm::UDP_QKEY;
/// Remote rights of a connected QP (the kernel CM's for RC).
const RC_ACCESS: u32 = 1 | 2 | 4 | 8;
/// READs/atomics in flight when the application asks for none.
const RD_ATOMIC_MAX: u8 = 16;
/// The Local ACK Timeout librdmacm's QPs get (the kernel CM's for RoCE,
/// see `uroce::cm`'s).
const ACK_TIMEOUT: u8 = 19;
/// REQ response timeout (4.096 µs × 2^20 ≈ 4.3 s) and tries, as the
/// kernel's RDMA CM (`CMA_CM_RESPONSE_TIMEOUT`, `CMA_MAX_CM_RETRIES`).
const CM_RESPONSE_TIMEOUT: u8 = 20;
const CM_MAX_RETRIES: u8 = 15;

// ---- objects ----

/// An `rdma_event_channel`: the C struct first.
#[repr(C)]
struct ChannelBox {
    c: rdma_event_channel,
    ch: CmChannel,
}

/// An `rdma_cm_id`: the C struct first, then the library's state.
#[repr(C)]
struct IdBox {
    id: UnsafeCell<rdma_cm_id>,
    /// The `ibv_sa_path_rec` `route.path_rec` points to (GIDs only).
    path: UnsafeCell<[u8; 64]>,
    st: Mutex<IdState>,
}

#[derive(Default)]
struct IdState {
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    /// The device context (`ibv_context`) the id is bound to, once known.
    verbs: usize,
    /// The connection manager's ID of this connection, on `ctx_key`.
    conn: Option<(uroce::Context, u32)>,
    /// Listening: the contexts and service ID.
    listening: Vec<(uroce::Context, u64)>,
    /// The request a passive id answers.
    req: Option<Box<Req>>,
    /// The peer's numbers, from its REQ or REP.
    peer: Option<Peer>,
    /// Our QP's starting PSN.
    my_psn: u32,
    /// What the application asked for in `rdma_connect`/`rdma_accept`.
    param: ConnParam,
    /// ESTABLISHED reported.
    established: bool,
    /// A synchronous id (created without a channel): calls wait for their
    /// outcome on the id's own channel (see `sync`).
    sync: bool,
    /// A passive endpoint's QP attributes and PD (`rdma_create_ep`), for
    /// the QP of each request `rdma_get_request` hands out.
    ep_attr: Option<(ibv_qp_init_attr, usize)>,
    /// CQs and completion channels the library made for the QP (destroyed
    /// with it).
    own_cqs: Vec<(usize, usize)>,
    /// Events the library raises itself (address and route resolution,
    /// multicast joins).
    local_events: VecDeque<LocalEvent>,
    /// Multicast groups joined through this id.
    groups: Vec<mcast::Group>,
    /// What `rdma_set_option` set.
    opts: options::Options,
    /// ECE: ours (`rdma_set_local_ece`, or the QP's when the library made
    /// it) and the peer's (from its REQ or REP), as librdmacm keeps them.
    local_ece: Ece,
    remote_ece: Ece,
}

/// An event the library raises itself; `group`: the multicast group a
/// join event is for.
#[derive(Debug, Clone, Copy)]
struct LocalEvent {
    kind: c_int,
    status: c_int,
    group: Option<IpAddr>,
}

impl IdBox {
    /// Queues an event of the library's own for this id.
    fn raise(&self, st: &mut IdState, kind: c_int, status: c_int, group: Option<IpAddr>) {
        st.local_events.push_back(LocalEvent { kind, status, group });
        if let Some(ch) = self.channel() {
            ch.ch.push_user(self.ptr() as u64);
        }
    }
}

/// What the peer's REQ or REP says its QP is and wants.
#[derive(Debug, Clone, Copy)]
struct Peer {
    qpn: u32,
    psn: u32,
    responder_resources: u8,
    initiator_depth: u8,
    /// RNR retries toward the peer.
    rnr_retry: u8,
    path_mtu: u8,
}

#[derive(Debug, Default, Clone, Copy)]
struct ConnParam {
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
}

/// An `rdma_cm_event` and the private data it points to.
#[repr(C)]
struct EventBox {
    ev: rdma_cm_event,
    data: [u8; 256],
}

/// Connections and listens by (context key, CM ID / service ID), to the
/// `IdBox` they belong to.
#[derive(Default)]
struct Registry {
    conns: HashMap<(u64, u32), usize>,
    listens: HashMap<(u64, u64), usize>,
    /// Each device context's XRC domain, opened for the first XRC id
    /// that needs one and kept (librdmacm keeps one per device).
    xrcds: HashMap<usize, usize>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    f(registry().get_or_insert_with(Registry::default))
}

/// Held while an event is turned into the application's (which names
/// ids) and while an id is destroyed, so the two never overlap.
fn translating() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

fn lock(st: &Mutex<IdState>) -> MutexGuard<'_, IdState> {
    st.lock().unwrap_or_else(|e| e.into_inner())
}

fn live_id<'a>(id: *mut rdma_cm_id) -> Option<&'a IdBox> {
    // SAFETY: dereferenced only once the registry says it is a live id.
    is_live(id.cast::<IdBox>(), Kind::CmId).then(|| unsafe { &*id.cast::<IdBox>() })
}

/// Runs `f` on a live id, EINVAL for a pointer that is not one; no panic
/// crosses into C.
fn on_id(id: *mut rdma_cm_id, f: impl FnOnce(&IdBox) -> c_int) -> c_int {
    guard(-1, || match live_id(id) {
        Some(b) => f(b),
        None => minus_one(libc::EINVAL),
    })
}

fn live_channel<'a>(ch: *mut rdma_event_channel) -> Option<&'a ChannelBox> {
    // SAFETY: as above.
    is_live(ch.cast::<ChannelBox>(), Kind::CmChannel).then(|| unsafe { &*ch.cast::<ChannelBox>() })
}

impl IdBox {
    /// The C struct, for writing. The application reads it only between
    /// our calls (rdma-core's contract), so no C reader races a write.
    #[allow(clippy::mut_from_ref)]
    fn c(&self) -> &mut rdma_cm_id {
        // SAFETY: see above; the pointer is live as long as `self`.
        unsafe { &mut *self.id.get() }
    }

    fn ptr(&self) -> *mut rdma_cm_id {
        self.id.get()
    }

    fn channel(&self) -> Option<&ChannelBox> {
        live_channel(self.c().channel)
    }
}

// ---- addresses ----

/// Reads a `sockaddr` (IPv4 or IPv6).
fn read_sockaddr(p: *const libc::sockaddr) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a sockaddr; its family says how long.
    let family = c_int::from(unsafe { (*p).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let a = unsafe { &*p.cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let a = unsafe { &*p.cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Writes `a` into a `sockaddr_storage`.
fn write_sockaddr(dst: &mut libc::sockaddr_storage, a: SocketAddr) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    *dst = unsafe { std::mem::zeroed() };
    let p = std::ptr::from_mut(dst);
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any
            // sockaddr.
            let s = unsafe { &mut *p.cast::<libc::sockaddr_in>() };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above.
            let s = unsafe { &mut *p.cast::<libc::sockaddr_in6>() };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            s.sin6_scope_id = v6.scope_id();
        }
    }
}

/// The RDMA CM port space of an id (IB ids are served as TCP ones).
fn space_of(b: &IdBox) -> u16 {
    if is_ud(b) { port_space::UDP } else { port_space::TCP }
}

fn is_ud(b: &IdBox) -> bool {
    b.c().ps == RDMA_PS_UDP
}

fn gid(ip: IpAddr) -> ibv_gid {
    ibv_gid { raw: uroce::wire::grh::gid_of(ip) }
}

/// The index of the configured device that reaches `dst` from `src`.
fn device_for(src: Option<IpAddr>, dst: IpAddr) -> Option<usize> {
    let devs = crate::device::devices().ok()?;
    let addrs: Vec<IpAddr> = devs.iter().map(|d| d.cfg.socket_addr().ip()).collect();
    uroce::cm::ports::device_for(&addrs, src, dst)
}

/// The `ibv_context` librdmacm uses for device `index`: opened once and
/// kept for the process (as rdma-core's `cma_dev`s).
fn device_context(index: usize) -> Option<*mut ibv_context> {
    static OPENED: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);
    let mut g = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(&p) = map.get(&index) {
        return Some(p as *mut ibv_context);
    }
    let devs = crate::device::devices().ok()?;
    let dev = (&raw const *devs.get(index)?.ibv).cast_mut();
    // SAFETY: one of our own live `ibv_device`s.
    let c = unsafe { crate::context::ibv_open_device(dev) };
    if c.is_null() {
        return None;
    }
    map.insert(index, c as usize);
    Some(c)
}

/// The PD a QP made without one gets: one per device context, kept for
/// the process (rdma-core's `cma_dev` PD), not one per connection.
fn default_pd(verbs: *mut ibv_context) -> *mut ibv_pd {
    static PDS: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);
    let mut g = PDS.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(&pd) = map.get(&(verbs as usize)) {
        return pd as *mut ibv_pd;
    }
    // SAFETY: a live context of ours (the id's device context).
    let pd = unsafe { crate::pd::ibv_alloc_pd(verbs) };
    if !pd.is_null() {
        map.insert(verbs as usize, pd as usize);
    }
    pd
}

/// The device's XRC domain for ids that bring none (librdmacm's
/// `ucma_get_xrcd`: a private domain, no file).
fn device_xrcd(verbs: *mut ibv_context) -> *mut ibv_xrcd {
    with_registry(|r| {
        if let Some(&x) = r.xrcds.get(&(verbs as usize)) {
            return x as *mut ibv_xrcd;
        }
        let mut attr = ibv_xrcd_init_attr {
            comp_mask: IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
            fd: -1,
            oflags: libc::O_CREAT,
        };
        // SAFETY: a live context of ours and a live attribute struct.
        let x = unsafe { crate::xrc::open_xrcd(verbs, &raw mut attr) };
        if !x.is_null() {
            r.xrcds.insert(verbs as usize, x as usize);
        }
        x
    })
}

fn uroce_of(verbs: usize) -> Option<uroce::Context> {
    crate::objects::live_ctx(verbs as *mut ibv_context).map(|c| c.uroce().clone())
}

/// Gives `b` device context `verbs`, port 1 and the device's PD, as
/// librdmacm fills `id->verbs` and `id->pd` once an id has a device
/// (UCX creates its placeholder QP on `id->pd`).
fn attach_device(b: &IdBox, st: &mut IdState, verbs: *mut ibv_context) {
    st.verbs = verbs as usize;
    let c = b.c();
    c.verbs = verbs;
    c.port_num = 1;
    if c.pd.is_null() {
        c.pd = default_pd(verbs);
    }
}

/// Binds `b` to local address `local` on device `index` (fills the C
/// struct's verbs, port and source address).
fn bind_to(b: &IdBox, st: &mut IdState, index: Option<usize>, local: SocketAddr) -> c_int {
    if let Some(i) = index {
        let Some(verbs) = device_context(i) else { return libc::ENODEV };
        attach_device(b, st, verbs);
    }
    st.local = Some(local);
    write_sockaddr(&mut b.c().route.addr.src, local);
    b.c().route.addr.ib.sgid = gid(local.ip());
    b.c().route.addr.ib.pkey = 0xffff;
    0
}

/// Takes `local`'s port for `b` in its port space (an unused one if it
/// names none), with the kernel's conflict rules (see `options`).
fn claim_port(b: &IdBox, st: &IdState, local: &mut SocketAddr) -> Result<(), c_int> {
    uroce::cm::ports::port_table()
        .claim(b.ptr() as usize, space_of(b), local, st.opts.bind())
        .map_err(|e| e.errno())
}

fn set_remote(b: &IdBox, st: &mut IdState, remote: SocketAddr) {
    st.remote = Some(remote);
    write_sockaddr(&mut b.c().route.addr.dst, remote);
    b.c().route.addr.ib.dgid = gid(remote.ip());
}

// ---- event channels ----

pub(crate) unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(std::ptr::null_mut(), || {
        let ch = match CmChannel::new() {
            Ok(c) => c,
            Err(e) => return null_errno(e.errno()),
        };
        let fd = ch.as_fd().as_raw_fd();
        let b = Box::into_raw(Box::new(ChannelBox { c: rdma_event_channel { fd }, ch }));
        register(b, Kind::CmChannel);
        destroyed_channels().retain(|&a| a != b as usize);
        b.cast()
    })
}

/// The addresses of the channels destroyed last (see `rdma_get_cm_event`).
fn destroyed_channels() -> MutexGuard<'static, VecDeque<usize>> {
    static D: Mutex<VecDeque<usize>> = Mutex::new(VecDeque::new());
    D.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        if unregister(channel.cast::<ChannelBox>(), Kind::CmChannel) {
            let mut d = destroyed_channels();
            if d.len() == 64 {
                d.pop_front();
            }
            d.push_back(channel as usize);
            drop(d);
            // SAFETY: allocated by rdma_create_event_channel, now forgotten.
            drop(unsafe { Box::from_raw(channel.cast::<ChannelBox>()) });
        }
    });
}

// ---- ids ----

pub(crate) unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    guard(-1, || {
        if id.is_null() || (!channel.is_null() && live_channel(channel).is_none()) {
            return minus_one(libc::EINVAL);
        }
        if !matches!(ps, RDMA_PS_TCP | RDMA_PS_IB | RDMA_PS_UDP | RDMA_PS_IPOIB) {
            return minus_one(libc::EINVAL);
        }
        // Without a channel the id is synchronous, on a channel of its own.
        let sync = channel.is_null();
        let channel = if sync {
            // SAFETY: our own call.
            let own = unsafe { rdma_create_event_channel() };
            if own.is_null() {
                return -1;
            }
            own
        } else {
            channel
        };
        let b = new_id(channel, context, ps);
        if let Some(idb) = live_id(b) {
            lock(&idb.st).sync = sync;
        }
        // SAFETY: the caller passes a writable pointer.
        unsafe { *id = b };
        0
    })
}

fn new_id(channel: *mut rdma_event_channel, context: *mut c_void, ps: c_int) -> *mut rdma_cm_id {
    // SAFETY: rdma_cm_id is C data; all-zero (NULL pointers) is valid.
    let mut c: rdma_cm_id = unsafe { std::mem::zeroed() };
    c.channel = channel;
    c.context = context;
    c.ps = ps;
    c.qp_type = if matches!(ps, RDMA_PS_UDP | RDMA_PS_IPOIB) { QPT_UD } else { QPT_RC };
    let b = Box::into_raw(Box::new(IdBox {
        id: UnsafeCell::new(c),
        path: UnsafeCell::new([0; 64]),
        st: Mutex::new(IdState::default()),
    }));
    register(b, Kind::CmId);
    b.cast()
}

pub(crate) unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        // Not while another thread turns an event into one naming this id.
        let _g = translating();
        let Some(b) = live_id(id) else { return minus_one(libc::EINVAL) };
        {
            let mut st = lock(&b.st);
            // Events still waiting for it are withdrawn: no reader wakes
            // for an id that is gone.
            if let Some(ch) = b.channel() {
                let conn = st.conn.as_ref().map(|(c, cm)| (c.key(), *cm));
                let listens: Vec<(u64, u64)> =
                    st.listening.iter().map(|(c, sid)| (c.key(), *sid)).collect();
                ch.ch.retain(|e| match e {
                    CmChannelEvent::User(tag) => *tag != id as u64,
                    CmChannelEvent::Cm { ctx, event } => {
                        let request_for = match event {
                            AgentEvent::ConnectRequest { req, .. } => Some(req.service_id),
                            AgentEvent::SidrRequest { req, .. } => Some(req.service_id),
                            _ => None,
                        };
                        conn != Some((*ctx, event.id()))
                            && request_for.is_none_or(|sid| !listens.contains(&(*ctx, sid)))
                    }
                });
            }
            forget_id(&mut st);
            mcast::leave_all(b, &mut st);
            uroce::cm::ports::port_table().release(id as usize);
        }
        let own = if lock(&b.st).sync { b.c().channel } else { std::ptr::null_mut() };
        release_event(b.c());
        unregister(id.cast::<IdBox>(), Kind::CmId);
        // SAFETY: allocated by new_id and no longer registered.
        drop(unsafe { Box::from_raw(id.cast::<IdBox>()) });
        if !own.is_null() {
            // SAFETY: the synchronous id's own channel, used by nobody else.
            unsafe { rdma_destroy_event_channel(own) };
        }
        0
    })
}

/// Disconnects (a DREQ if still connected) and forgets the id's
/// connection and listens.
fn forget_id(st: &mut IdState) {
    if let Some((ctx, cm)) = st.conn.take() {
        // Connected: a DREQ; a request not yet answered: a REJ (as
        // rdma-core's destroy does), so the peer is not left waiting.
        if ctx.cm_disconnect(cm).is_err() && ctx.cm_reject(cm, &[]).is_err() {
            let _ = ctx.cm_sidr_reply(cm, 2, 0, 0, &[]);
        }
        ctx.cm_route(cm, None);
        let key = ctx.key();
        with_registry(|r| r.conns.remove(&(key, cm)));
    }
    for (ctx, sid) in st.listening.drain(..) {
        ctx.cm_unlisten(sid);
        let key = ctx.key();
        with_registry(|r| r.listens.remove(&(key, sid)));
    }
}

pub(crate) unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard(-1, || {
        let (Some(b), Some(ch)) = (live_id(id), live_channel(channel)) else {
            return minus_one(libc::EINVAL);
        };
        let mut st = lock(&b.st);
        if !st.listening.is_empty() {
            return minus_one(libc::EINVAL);
        }
        if let Some((ctx, cm)) = &st.conn {
            ctx.cm_route(*cm, Some(&ch.ch));
        }
        // A synchronous id becomes asynchronous (as in rdma-core): its
        // calls no longer wait, their events go to the new channel
        // (libfabric's verbs provider resolves an id synchronously, then
        // moves it to its event queue and connects), and its own channel
        // goes.
        let own = if st.sync { b.c().channel } else { std::ptr::null_mut() };
        if st.sync {
            release_event(b.c());
        }
        st.sync = false;
        // Events the library raised before the move wake the new
        // channel's reader, and no longer the old one's.
        if let Some(old) = b.channel() {
            let tag = b.ptr() as u64;
            old.ch.retain(|e| !matches!(e, CmChannelEvent::User(t) if *t == tag));
        }
        b.c().channel = channel;
        for _ in 0..st.local_events.len() {
            ch.ch.push_user(b.ptr() as u64);
        }
        drop(st);
        if !own.is_null() && own != channel {
            // SAFETY: the synchronous id's own channel, used by nobody else.
            unsafe { rdma_destroy_event_channel(own) };
        }
        0
    })
}

pub(crate) unsafe extern "C" fn rdma_bind_addr(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard(-1, || {
        let (Some(b), Some(mut a)) = (live_id(id), read_sockaddr(addr)) else {
            return minus_one(libc::EINVAL);
        };
        let mut st = lock(&b.st);
        if st.local.is_some() {
            // Bound already (kernel: only an idle id binds).
            return minus_one(libc::EINVAL);
        }
        if b.c().ps == RDMA_PS_IPOIB && !a.ip().is_unspecified() {
            // As the kernel's CM on RoCE: IPoIB needs an InfiniBand link.
            return minus_one(libc::EINVAL);
        }
        let index = if a.ip().is_unspecified() {
            None
        } else {
            match device_for(Some(a.ip()), a.ip()) {
                Some(i) => Some(i),
                // As the kernel's CM: an address of this host that no
                // device has is ENODEV (no RDMA device on that interface:
                // 127.0.0.1 when uroce0 is elsewhere), any other
                // EADDRNOTAVAIL.
                None => return minus_one(uroce::cm::ports::unbindable(a.ip()).errno()),
            }
        };
        if let Err(e) = claim_port(b, &st, &mut a) {
            return minus_one(e);
        }
        match bind_to(b, &mut st, index, a) {
            0 => 0,
            e => minus_one(e),
        }
    })
}

unsafe extern "C" fn rdma_resolve_addr_start(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        let (Some(b), Some(dst)) = (live_id(id), read_sockaddr(dst)) else {
            return minus_one(libc::EINVAL);
        };
        if b.c().ps == RDMA_PS_IPOIB {
            // As the kernel's CM on RoCE: IPoIB needs an InfiniBand link.
            return minus_one(libc::EINVAL);
        }
        let mut st = lock(&b.st);
        let src = read_sockaddr(src).or(st.local);
        let Some(index) = device_for(src.map(|s| s.ip()), dst.ip()) else {
            // As the kernel's CM reports it: address resolution ends in
            // ADDR_ERROR (-ENODEV), not in a failed call.
            eprintln!("uroce: no uroce device reaches {}", dst.ip());
            b.raise(&mut st, event::ADDR_ERROR, -libc::ENODEV, None);
            return 0;
        };
        let Ok(devs) = crate::device::devices() else { return minus_one(libc::ENODEV) };
        let mut local =
            SocketAddr::new(devs[index].cfg.socket_addr().ip(), src.map_or(0, |s| s.port()));
        if st.local.is_none()
            && let Err(e) = claim_port(b, &st, &mut local)
        {
            return minus_one(e);
        }
        if let e @ 1.. = bind_to(b, &mut st, Some(index), local) {
            return minus_one(e);
        }
        set_remote(b, &mut st, dst);
        b.raise(&mut st, event::ADDR_RESOLVED, 0, None);
        0
    })
}

unsafe extern "C" fn rdma_resolve_route_start(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    on_id(id, |b| {
        let mut st = lock(&b.st);
        let (Some(l), Some(r)) = (st.local, st.remote) else { return minus_one(libc::EINVAL) };
        // One path: the GIDs (what an `ibv_sa_path_rec` starts with).
        // SAFETY: the id's own 64-byte buffer.
        let path = unsafe { &mut *b.path.get() };
        path[..16].copy_from_slice(&uroce::wire::grh::gid_of(r.ip()));
        path[16..32].copy_from_slice(&uroce::wire::grh::gid_of(l.ip()));
        b.c().route.path_rec = path.as_mut_ptr().cast();
        b.c().route.num_paths = 1;
        b.raise(&mut st, event::ROUTE_RESOLVED, 0, None);
        0
    })
}

pub(crate) unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    on_id(id, |b| {
        let Some(ch) = b.channel() else { return minus_one(libc::EINVAL) };
        let mut st = lock(&b.st);
        let Some(local) = st.local else { return minus_one(libc::EINVAL) };
        if b.c().ps == RDMA_PS_IPOIB {
            // No RoCE device serves the IPoIB port space.
            return minus_one(libc::ENODEV);
        }
        let space = space_of(b);
        let mut opts = st.opts.bind();
        if let Err(e) = uroce::cm::ports::port_table().listen(id as usize, space, local, &mut opts)
        {
            return minus_one(e.errno());
        }
        st.opts.reuseaddr = opts.reuseaddr;
        let sid = rdma_cm_service_id(space, local.port());
        // A wildcard address listens on every device of its family (an
        // IPv6 one on IPv4 devices too, unless AFONLY).
        let contexts: Vec<usize> = if st.verbs != 0 {
            vec![st.verbs]
        } else {
            let Ok(devs) = crate::device::devices() else { return minus_one(libc::ENODEV) };
            (0..devs.len())
                .filter(|&i| {
                    let dev = devs[i].cfg.socket_addr().ip();
                    uroce::cm::ports::listens_on(local.ip(), st.opts.afonly, dev)
                })
                .filter_map(device_context)
                .map(|c| c as usize)
                .collect()
        };
        for verbs in contexts {
            let Some(ctx) = uroce_of(verbs) else { continue };
            if let Err(e) = ctx.cm_listen_on(sid, &ch.ch) {
                forget_id(&mut st);
                return minus_one(e.errno());
            }
            let key = ctx.key();
            with_registry(|r| r.listens.insert((key, sid), id as usize));
            st.listening.push((ctx, sid));
        }
        if st.listening.is_empty() {
            return minus_one(libc::ENODEV);
        }
        0
    })
}

// ---- QPs ----

/// Creates the id's CQs and PD when the application gave none (as
/// librdmacm does), and returns the PD to use.
fn complete_qp_attr(b: &IdBox, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> *mut ibv_pd {
    let c = b.c();
    let pd = if pd.is_null() {
        if c.pd.is_null() {
            c.pd = default_pd(c.verbs);
        }
        c.pd
    } else {
        pd
    };
    // Each CQ the library makes gets a completion channel of its own, as
    // librdmacm's do (`rdma_get_send_comp` and friends wait on them).
    let mut st = lock(&b.st);
    let mut made = [std::ptr::null_mut::<ibv_comp_channel>(); 2];
    let wants = [attr.cap.max_send_wr, attr.cap.max_recv_wr];
    // An XRC initiator has no receive queue, a target no queues at all:
    // a CQ only where it asks for work requests (the target's receive CQ
    // is for the XRC SRQ `rdma_create_srq` makes next), as librdmacm.
    let needed = match attr.qp_type {
        QPT_XRC_SEND => [true, wants[1] > 0],
        QPT_XRC_RECV => [false, wants[1] > 0],
        _ => [true, true],
    };
    for (i, cq) in [&mut attr.send_cq, &mut attr.recv_cq].into_iter().enumerate() {
        if cq.is_null() && needed[i] {
            let n = c_int::try_from(wants[i].max(1)).unwrap_or(c_int::MAX);
            // SAFETY: a live context of ours.
            let ch = unsafe { crate::cq::ibv_create_comp_channel(c.verbs) };
            // SAFETY: a live context of ours and its new channel.
            *cq = unsafe { crate::cq::ibv_create_cq(c.verbs, n, std::ptr::null_mut(), ch, 0) };
            made[i] = ch;
            st.own_cqs.push((*cq as usize, ch as usize));
        }
    }
    c.send_cq = attr.send_cq;
    c.recv_cq = attr.recv_cq;
    c.send_cq_channel = made[0];
    c.recv_cq_channel = made[1];
    pd
}

/// Moves a new QP to INIT with the rights librdmacm gives.
fn qp_to_init(qp: *mut ibv_qp) -> c_int {
    let attr = ibv_qp_attr {
        qp_state: QPS_INIT,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: RC_ACCESS,
        ..ibv_qp_attr::default()
    };
    let mask = QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS;
    // SAFETY: a live QP of ours and a live attribute struct.
    unsafe { crate::qp::ibv_modify_qp(qp, (&raw const attr).cast_mut(), mask) }
}

/// A UD QP is ready at once (INIT with the RDMA CM's Q_Key, RTR, RTS),
/// as librdmacm makes it.
fn ud_qp_to_rts(qp: *mut ibv_qp) -> c_int {
    // SAFETY: a live QP of ours.
    let psn = uroce::cm::starting_psn(unsafe { (*qp).qp_num });
    let steps = [
        (
            ibv_qp_attr { qp_state: QPS_INIT, port_num: 1, qkey: UDP_QKEY, ..Default::default() },
            QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY,
        ),
        (ibv_qp_attr { qp_state: QPS_RTR, ..Default::default() }, QP_STATE),
        (
            ibv_qp_attr { qp_state: QPS_RTS, sq_psn: psn, ..Default::default() },
            QP_STATE | QP_SQ_PSN,
        ),
    ];
    for (attr, mask) in steps {
        // SAFETY: a live QP and a live attribute struct.
        let r = unsafe { crate::qp::ibv_modify_qp(qp, (&raw const attr).cast_mut(), mask) };
        if r != 0 {
            return r;
        }
    }
    0
}

pub(crate) unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    on_id(id, |b| {
        if attr.is_null() || b.c().verbs.is_null() {
            return minus_one(libc::EINVAL);
        }
        // As librdmacm: the extended call with the PD, its attributes
        // written back.
        // SAFETY: ibv_qp_init_attr_ex is C data; all-zero is valid.
        let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: the extended attributes begin with the basic ones (same
        // fields, same offsets); the caller's struct is readable.
        unsafe { std::ptr::copy_nonoverlapping(attr, (&raw mut ex).cast(), 1) };
        ex.comp_mask = crate::abi::consts::IBV_QP_INIT_ATTR_PD;
        ex.pd = if pd.is_null() { b.c().pd } else { pd };
        // SAFETY: our own call on a live id and a live struct.
        let r = unsafe { rdma_create_qp_ex(id, &raw mut ex) };
        // SAFETY: as above, back into the caller's writable struct.
        unsafe { std::ptr::copy_nonoverlapping((&raw const ex).cast(), attr, 1) };
        r
    })
}

pub(crate) unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    on_id(id, |b| {
        if attr.is_null() || b.c().verbs.is_null() {
            return minus_one(libc::EINVAL);
        }
        if !b.c().qp.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: the caller passes a writable extended attribute struct.
        let a = unsafe { &mut *attr };
        // No type given: the id's (rdma_create_ep's callers leave it 0).
        if a.qp_type == 0 {
            a.qp_type = b.c().qp_type;
        }
        let given = if a.comp_mask & crate::abi::consts::IBV_QP_INIT_ATTR_PD != 0 {
            a.pd
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: the extended attributes begin with the basic ones (same
        // fields, same offsets).
        let common = unsafe { &mut *attr.cast::<ibv_qp_init_attr>() };
        a.pd = complete_qp_attr(b, given, common);
        a.comp_mask |= crate::abi::consts::IBV_QP_INIT_ATTR_PD;
        if a.qp_type == QPT_XRC_RECV && (a.comp_mask & QP_INIT_ATTR_XRCD == 0 || a.xrcd.is_null()) {
            a.xrcd = device_xrcd(b.c().verbs).cast();
            if a.xrcd.is_null() {
                return -1; // errno set by ibv_open_xrcd
            }
            a.comp_mask |= QP_INIT_ATTR_XRCD;
        }
        if a.srq.is_null() && a.qp_type != QPT_XRC_RECV {
            a.srq = b.c().srq;
        }
        // SAFETY: the id's context and the caller's attributes.
        let qp = unsafe { crate::qp::create_qp_ex(b.c().verbs, attr) };
        finish_create_qp(b, qp, a.pd, a.srq, a.qp_type)
    })
}

fn finish_create_qp(
    b: &IdBox,
    qp: *mut ibv_qp,
    pd: *mut ibv_pd,
    srq: *mut ibv_srq,
    qp_type: c_int,
) -> c_int {
    if qp.is_null() {
        return -1; // errno set by ibv_create_qp
    }
    let ready = if qp_type == QPT_UD { ud_qp_to_rts(qp) } else { qp_to_init(qp) };
    if let e @ 1.. = ready {
        // SAFETY: the QP just made.
        unsafe { crate::qp::ibv_destroy_qp(qp) };
        return minus_one(e);
    }
    let c = b.c();
    c.qp = qp;
    c.pd = pd;
    c.srq = srq;
    c.qp_type = qp_type;
    // librdmacm takes the id's ECE from the QP it makes (`ibv_query_ece`);
    // uroce's QPs have no vendor options (EOPNOTSUPP, as rxe's), so the
    // id offers none and answers a REQ's ECE with none.
    lock(&b.st).local_ece = Ece::default();
    0
}

pub(crate) unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        let Some(b) = live_id(id) else { return };
        let qp = std::mem::replace(&mut b.c().qp, std::ptr::null_mut());
        if !qp.is_null() {
            // SAFETY: the QP rdma_create_qp made.
            unsafe { crate::qp::ibv_destroy_qp(qp) };
        }
        mcast::qp_gone(&mut lock(&b.st));
        // The CQs and channels the library made for it go with it, but an
        // XRC target's while its SRQ uses them (rdma_destroy_srq's then).
        let c = b.c();
        if c.qp_type != QPT_XRC_RECV || c.srq.is_null() {
            destroy_own_cqs(b);
        }
    });
}

/// Destroys the CQs and channels the library made for the id.
fn destroy_own_cqs(b: &IdBox) {
    let own = std::mem::take(&mut lock(&b.st).own_cqs);
    for (cq, ch) in own {
        // SAFETY: objects the library made, used by the id alone.
        unsafe {
            crate::cq::ibv_destroy_cq(cq as *mut ibv_cq);
            crate::cq::ibv_destroy_comp_channel(ch as *mut ibv_comp_channel);
        }
    }
    let c = b.c();
    (c.send_cq, c.recv_cq) = (std::ptr::null_mut(), std::ptr::null_mut());
    (c.send_cq_channel, c.recv_cq_channel) = (std::ptr::null_mut(), std::ptr::null_mut());
}

/// The attributes of the next transition (RTR or RTS) of `b`'s QP for the
/// connection in `st`, from the peer's numbers.
fn transition_attr(b: &IdBox, st: &IdState, to: c_int) -> Option<(ibv_qp_attr, c_int)> {
    let (remote, local) = (st.remote?, st.local?);
    let (peer_qpn, peer_psn, peer_resp, peer_init, peer_rnr, mtu) = peer_numbers(st)?;
    let mut a = ibv_qp_attr { qp_state: to, ..ibv_qp_attr::default() };
    if to == QPS_RTR {
        let ctx = uroce_of(st.verbs)?;
        a.path_mtu = c_int::from(mtu);
        a.dest_qp_num = peer_qpn;
        a.rq_psn = peer_psn;
        a.max_dest_rd_atomic = st.param.responder_resources.min(peer_init).max(1);
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.dgid = gid(remote.ip());
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.grh.traffic_class = st.opts.tos.unwrap_or(0);
        a.ah_attr.grh.sgid_index = ctx.gid_index_of(local.ip()).map_or(0, |i| i as u8);
        // The kernel CM's masks per type: an XRC initiator takes no
        // requests, so no responder resources or RNR timer.
        let mut mask = QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN;
        if b.c().qp_type != QPT_XRC_SEND {
            mask |= QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER;
        }
        Some((a, mask))
    } else {
        a.sq_psn = st.my_psn;
        a.timeout = st.opts.ack_timeout.unwrap_or(ACK_TIMEOUT);
        a.retry_cnt = st.param.retry_count.min(7);
        a.rnr_retry = peer_rnr.min(7);
        a.max_rd_atomic = st.param.initiator_depth.min(peer_resp).max(1);
        // An XRC target sends no requests: only its ACK timeout.
        let mask = if b.c().qp_type == QPT_XRC_RECV {
            QP_STATE | QP_SQ_PSN | QP_TIMEOUT
        } else {
            QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC
        };
        Some((a, mask))
    }
}

fn peer_numbers(st: &IdState) -> Option<(u32, u32, u8, u8, u8, u8)> {
    let p = st.peer?;
    Some((p.qpn, p.psn, p.responder_resources, p.initiator_depth, p.rnr_retry, p.path_mtu))
}

/// Moves `b`'s QP to RTR, then RTS.
fn connect_qp(b: &IdBox, st: &IdState) -> c_int {
    let qp = b.c().qp;
    for to in [QPS_RTR, QPS_RTS] {
        let Some((attr, mask)) = transition_attr(b, st, to) else { return libc::EINVAL };
        // SAFETY: the id's live QP and a live attribute struct.
        let r = unsafe { crate::qp::ibv_modify_qp(qp, (&raw const attr).cast_mut(), mask) };
        if r != 0 {
            return r;
        }
    }
    0
}

fn conn_param(p: *const rdma_conn_param) -> (ConnParam, &'static [u8], u32) {
    if p.is_null() {
        let d = ConnParam {
            responder_resources: RD_ATOMIC_MAX,
            initiator_depth: RD_ATOMIC_MAX,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        return (d, &[], 0);
    }
    // SAFETY: the caller passes a readable rdma_conn_param.
    let p = unsafe { &*p };
    let data: &[u8] = if p.private_data.is_null() || p.private_data_len == 0 {
        &[]
    } else {
        // SAFETY: the caller promises private_data_len readable bytes.
        unsafe {
            std::slice::from_raw_parts(p.private_data.cast(), usize::from(p.private_data_len))
        }
    };
    // RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH (255) ask for the device's
    // most, as librdmacm maps them (libfabric's verbs provider sends both).
    let device_most = uroce::limits::MAX_QP_RD_ATOM.min(u32::from(u8::MAX - 1)) as u8;
    let most = |v: u8| if v == u8::MAX { device_most } else { v };
    let c = ConnParam {
        responder_resources: most(p.responder_resources),
        initiator_depth: most(p.initiator_depth),
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
    };
    (c, data, p.qp_num)
}

unsafe extern "C" fn rdma_connect_start(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    on_id(id, |b| {
        let Some(ch) = b.channel() else { return minus_one(libc::EINVAL) };
        let (cp, data, qp_num) = conn_param(param);
        let mut st = lock(&b.st);
        let (Some(local), Some(remote), Some(ctx)) = (st.local, st.remote, uroce_of(st.verbs))
        else {
            return minus_one(libc::EINVAL);
        };
        if data.len() > 92 - CmaHeader::LEN {
            return minus_one(libc::EINVAL);
        }
        if is_ud(b) {
            // UD: ask which QP serves the port (SIDR); no connection.
            if data.len() > 216 - CmaHeader::LEN {
                return minus_one(libc::EINVAL);
            }
            let mut pd = [0u8; 216];
            CmaHeader { version: 0, src_port: local.port(), src: local.ip(), dst: remote.ip() }
                .emit(&mut pd);
            pd[CmaHeader::LEN..CmaHeader::LEN + data.len()].copy_from_slice(data);
            let sid = rdma_cm_service_id(port_space::UDP, remote.port());
            let used = CmaHeader::LEN + data.len();
            let key = ctx.key();
            let cm = with_registry(|r| {
                let cm = ctx.cm_sidr_request(remote.ip(), sid, &pd[..used], &ch.ch);
                r.conns.insert((key, cm), id as usize);
                cm
            });
            st.conn = Some((ctx, cm));
            return 0;
        }
        let c = b.c();
        let qpn = if c.qp.is_null() {
            qp_num
        } else {
            // SAFETY: the id's live QP.
            unsafe { (*c.qp).qp_num }
        };
        st.my_psn = uroce::cm::starting_psn(qpn);
        st.param = cp;
        let mut pd = [0u8; 92];
        CmaHeader { version: 0, src_port: local.port(), src: local.ip(), dst: remote.ip() }
            .emit(&mut pd);
        pd[CmaHeader::LEN..CmaHeader::LEN + data.len()].copy_from_slice(data);
        let offer = Offer {
            qpn,
            starting_psn: st.my_psn,
            responder_resources: cp.responder_resources,
            initiator_depth: cp.initiator_depth,
            rnr_retry_count: cp.rnr_retry_count.min(7),
            srq: !c.srq.is_null(),
            ece: st.local_ece,
        };
        let path = uroce::cm::PathOptions {
            retry_count: cp.retry_count.min(7),
            traffic_class: st.opts.tos.unwrap_or(0),
            ack_timeout: st.opts.ack_timeout.unwrap_or(ACK_TIMEOUT),
            response_timeout: CM_RESPONSE_TIMEOUT,
            max_cm_retries: CM_MAX_RETRIES,
        };
        let sid = rdma_cm_service_id(space_of(b), remote.port());
        let mut args = uroce::cm::request_args(local.ip(), remote.ip(), sid, offer, path, pd);
        if c.qp_type == QPT_XRC_SEND {
            args.transport_service_type = uroce::cm::XRC_TRANSPORT;
        }
        // Registered before the request leaves: another thread may be
        // waiting on the channel for the reply.
        let key = ctx.key();
        let cm = with_registry(|r| {
            let cm = ctx.cm_request(&args, &ch.ch);
            r.conns.insert((key, cm), id as usize);
            cm
        });
        st.conn = Some((ctx, cm));
        0
    })
}

unsafe extern "C" fn rdma_accept_start(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    on_id(id, |b| {
        let (cp, data, qp_num) = conn_param(param);
        let mut st = lock(&b.st);
        let Some((ctx, cm)) = st.conn.clone() else { return minus_one(libc::EINVAL) };
        if is_ud(b) {
            // The reply names our UD QP; there is no connection after it.
            let qp = b.c().qp;
            // SAFETY: the id's live QP, if any.
            let qpn = if qp.is_null() { qp_num } else { unsafe { (*qp).qp_num } };
            let r = ctx.cm_sidr_reply(cm, 0, qpn, UDP_QKEY, data);
            let key = ctx.key();
            with_registry(|reg| reg.conns.remove(&(key, cm)));
            st.conn = None;
            return match r {
                Ok(()) => 0,
                Err(e) => minus_one(e.errno()),
            };
        }
        if st.req.is_none() {
            return minus_one(libc::EINVAL);
        }
        let c = b.c();
        let qpn = if c.qp.is_null() {
            qp_num
        } else {
            // SAFETY: the id's live QP.
            unsafe { (*c.qp).qp_num }
        };
        st.param = cp;
        if !c.qp.is_null() {
            let r = connect_qp(b, &st);
            if r != 0 {
                let _ = ctx.cm_reject(cm, &[]);
                return minus_one(r);
            }
        }
        let req = st.req.as_ref().map(|r| (r.initiator_depth, r.responder_resources));
        let (peer_init, peer_resp) = req.unwrap_or((0, 0));
        let offer = Offer {
            qpn,
            starting_psn: st.my_psn,
            responder_resources: cp.responder_resources.min(peer_init),
            initiator_depth: cp.initiator_depth.min(peer_resp),
            rnr_retry_count: cp.rnr_retry_count.min(7),
            srq: !c.srq.is_null(),
            // The requester's vendor, with our options (librdmacm's REP).
            ece: Ece { vendor_id: st.remote_ece.vendor_id, options: st.local_ece.options },
        };
        match ctx.cm_accept(cm, &offer, data) {
            Ok(()) => 0,
            Err(e) => minus_one(e.errno()),
        }
    })
}

pub(crate) unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    // SAFETY: as the caller's.
    unsafe { reject_for(id, data, len, rej_reason::CONSUMER_DEFINED) }
}

/// `rdma_reject_ece`: refuses a request whose ECE options the QP cannot
/// do (REJ reason 35, "vendor option not supported").
pub(crate) unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    // SAFETY: as the caller's.
    unsafe { reject_for(id, data, len, rej_reason::VENDOR_OPTION_NOT_SUPPORTED) }
}

/// A REJ with `reason` (a UD id's SIDR reply says "rejected" whatever the
/// reason, as the kernel's).
///
/// # Safety
/// `data` points to `len` readable bytes (or is null).
unsafe fn reject_for(id: *mut rdma_cm_id, data: *const c_void, len: u8, reason: u16) -> c_int {
    on_id(id, |b| {
        let st = lock(&b.st);
        let Some((ctx, cm)) = &st.conn else { return minus_one(libc::EINVAL) };
        let data: &[u8] = if data.is_null() || len == 0 {
            &[]
        } else {
            // SAFETY: the caller promises `len` readable bytes.
            unsafe { std::slice::from_raw_parts(data.cast(), usize::from(len)) }
        };
        // SIDR refuses with status 2 (rejected by the service).
        let r = if is_ud(b) {
            ctx.cm_sidr_reply(*cm, 2, 0, 0, data)
        } else {
            ctx.cm_reject_for(*cm, reason, data)
        };
        match r {
            Ok(()) => 0,
            Err(e) => minus_one(e.errno()),
        }
    })
}

pub(crate) unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    on_id(id, |b| {
        let mut st = lock(&b.st);
        let Some((ctx, cm)) = st.conn.clone() else { return minus_one(libc::EINVAL) };
        st.established = true;
        match ctx.cm_establish(cm) {
            Ok(()) => 0,
            Err(e) => minus_one(e.errno()),
        }
    })
}

/// Moves `qp` to the error state (its outstanding work flushed).
///
/// # Safety
/// `qp` is a live QP.
unsafe fn qp_to_error(qp: *mut ibv_qp) {
    let attr = ibv_qp_attr { qp_state: QPS_ERR, ..ibv_qp_attr::default() };
    // SAFETY: the caller's live QP and a live attribute struct.
    unsafe { crate::qp::ibv_modify_qp(qp, (&raw const attr).cast_mut(), QP_STATE) };
}

pub(crate) unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    on_id(id, |b| {
        let st = lock(&b.st);
        let Some((ctx, cm)) = &st.conn else { return minus_one(libc::EINVAL) };
        let qp = b.c().qp;
        if !qp.is_null() {
            // SAFETY: the id's live QP.
            unsafe { qp_to_error(qp) };
        }
        // The peer may have disconnected first (its DREQ answered): then
        // there is nothing more to send.
        let sent = ctx.cm_disconnect(*cm).is_ok();
        let sync = st.sync;
        drop(st);
        // A synchronous id waits for DISCONNECTED, as librdmacm's does:
        // the DREP (or the DREQ's last timeout) for our DREQ, or the one
        // the peer's DREQ raised, still waiting on the id's own channel.
        // Nothing to wait for once that was taken (a second call).
        if sync && (sent || disconnect_waits(b)) {
            sync::complete(b, &[event::DISCONNECTED])
        } else {
            0
        }
    })
}

/// Whether the id's channel holds the event of a disconnection not yet
/// read (the channel is left as it was).
fn disconnect_waits(b: &IdBox) -> bool {
    let mut found = false;
    if let Some(ch) = b.channel() {
        ch.ch.retain(|e| {
            found |= matches!(
                e,
                CmChannelEvent::Cm {
                    event: AgentEvent::DisconnectRequest { .. } | AgentEvent::Disconnected { .. },
                    ..
                }
            );
            true
        });
    }
    found
}

pub(crate) unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    on_id(id, |b| {
        if attr.is_null() || mask.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: the caller passes writable structs.
        let (attr, mask) = unsafe { (&mut *attr, &mut *mask) };
        let st = lock(&b.st);
        let to = if attr.qp_state == 0 { QPS_INIT } else { attr.qp_state };
        if to == QPS_INIT {
            *attr = ibv_qp_attr {
                qp_state: QPS_INIT,
                port_num: 1,
                qp_access_flags: RC_ACCESS,
                ..ibv_qp_attr::default()
            };
            *mask = QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS;
            return 0;
        }
        match transition_attr(b, &st, to) {
            Some((a, m)) => {
                *attr = a;
                *mask = m;
                0
            }
            None => minus_one(libc::EINVAL),
        }
    })
}

fn port_of(s: &libc::sockaddr_storage) -> u16 {
    read_sockaddr(std::ptr::from_ref(s).cast()).map_or(0, |a| a.port().to_be())
}

pub(crate) unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || live_id(id).map_or(0, |b| port_of(&b.c().route.addr.src)))
}

pub(crate) unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || live_id(id).map_or(0, |b| port_of(&b.c().route.addr.dst)))
}

// ---- events ----

pub(crate) unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard(-1, || {
        let Some(ch) = live_channel(channel) else {
            if destroyed_channels().contains(&(channel as usize)) {
                // Destroyed under a reader's feet: rdma-core 44's rping
                // destroys its channel while its CM thread may still call
                // in. Over the kernel that reader stays blocked in read(2)
                // until the process ends; so does this one, rather than
                // fail and make the program exit with an error.
                loop {
                    std::thread::park();
                }
            }
            return minus_one(libc::EINVAL);
        };
        if event.is_null() {
            return minus_one(libc::EINVAL);
        }
        match next_event(ch, channel) {
            Ok(ev) => {
                let p = Box::into_raw(ev);
                register(p, Kind::CmEvent);
                // SAFETY: the caller passes a writable pointer.
                unsafe { *event = p.cast() };
                0
            }
            Err(errno) => minus_one(errno),
        }
    })
}

/// The next event of `ch` the application sees (waiting for one if the
/// channel blocks), or the errno of the wait.
fn next_event(ch: &ChannelBox, channel: *mut rdma_event_channel) -> Result<Box<EventBox>, c_int> {
    // The queue itself, not the box: the channel may be destroyed while
    // this waits (the box freed), and the wait must not touch it after.
    let queue = ch.ch.clone();
    loop {
        let raw = queue.get().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        let _g = translating();
        if let Some(ev) = translate(channel, raw) {
            return Ok(ev);
        }
    }
}

pub(crate) unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || {
        if !unregister(event.cast::<EventBox>(), Kind::CmEvent) {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: allocated by rdma_get_cm_event, now forgotten.
        drop(unsafe { Box::from_raw(event.cast::<EventBox>()) });
        0
    })
}

/// Makes `ev` the id's current event (`id->event`), acknowledging the
/// one it held, as librdmacm's synchronous calls do: a program reads the
/// peer's private data and parameters there after `rdma_connect`,
/// `rdma_accept` or `rdma_get_request`.
fn keep_event(id: &mut rdma_cm_id, ev: Box<EventBox>) {
    release_event(id);
    let p = Box::into_raw(ev);
    register(p, Kind::CmEvent);
    id.event = p.cast();
}

/// Acknowledges the id's current event, if it holds one (an id's
/// destruction, a synchronous id's next call or migration).
fn release_event(id: &mut rdma_cm_id) {
    let old = std::mem::replace(&mut id.event, std::ptr::null_mut());
    if !old.is_null() {
        // SAFETY: an event keep_event registered; one the application
        // acknowledged itself is refused (EINVAL) rather than freed twice.
        unsafe { rdma_ack_cm_event(old) };
    }
}

fn new_event(id: *mut rdma_cm_id, kind: c_int, status: c_int) -> Box<EventBox> {
    // SAFETY: all-zero is a valid rdma_cm_event (NULL pointers, zeros).
    let ev = unsafe { std::mem::zeroed() };
    let mut b: Box<EventBox> = Box::new(EventBox { ev, data: [0; 256] });
    b.ev.id = id;
    b.ev.event = kind;
    b.ev.status = status;
    b
}

/// Fills the event's connection parameters (`c`, its private data
/// pointer and length aside), the private data copied into the event
/// (valid until it is acknowledged).
fn set_conn(b: &mut EventBox, data: &[u8], c: rdma_conn_param) {
    let n = data.len().min(b.data.len());
    b.data[..n].copy_from_slice(&data[..n]);
    b.ev.param.conn = rdma_conn_param {
        private_data: b.data.as_ptr().cast(),
        private_data_len: n as u8,
        flow_control: 1,
        ..c
    };
}

/// Connection parameters without private data.
fn conn(resp: u8, init: u8, rnr: u8, retry: u8, srq: bool, qp_num: u32) -> rdma_conn_param {
    rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: resp,
        initiator_depth: init,
        flow_control: 1,
        retry_count: retry,
        rnr_retry_count: rnr,
        srq: u8::from(srq),
        qp_num,
    }
}

/// The application's event for a channel event, or `None` for one it
/// does not see (an id destroyed meanwhile, the active side's second
/// Established).
fn translate(channel: *mut rdma_event_channel, raw: CmChannelEvent) -> Option<Box<EventBox>> {
    match raw {
        CmChannelEvent::User(tag) => {
            let id = tag as *mut rdma_cm_id;
            let b = live_id(id)?;
            let e = lock(&b.st).local_events.pop_front()?;
            match e.group {
                Some(group) => mcast::join_event(b, group),
                None => Some(new_event(id, e.kind, e.status)),
            }
        }
        CmChannelEvent::Cm {
            ctx,
            event: AgentEvent::ConnectRequest { id: cm, from, req, ece },
        } => {
            let sid = req.service_id;
            let listener = with_registry(|r| r.listens.get(&(ctx, sid)).copied())?;
            let lb = live_id(listener as *mut rdma_cm_id)?;
            connect_request(channel, lb, ctx, cm, from, Request::Rc(req, ece))
        }
        CmChannelEvent::Cm { ctx, event: AgentEvent::SidrRequest { id: cm, from, req } } => {
            let sid = req.service_id;
            let listener = with_registry(|r| r.listens.get(&(ctx, sid)).copied())?;
            let lb = live_id(listener as *mut rdma_cm_id)?;
            connect_request(channel, lb, ctx, cm, from, Request::Ud(req))
        }
        CmChannelEvent::Cm { ctx, event } => {
            let cm = event.id();
            let id = with_registry(|r| r.conns.get(&(ctx, cm)).copied())? as *mut rdma_cm_id;
            let b = live_id(id)?;
            conn_event(id, b, event)
        }
    }
}

/// A request to a listening id: a connection's (REQ, with its ECE) or a
/// UD id's (SIDR).
enum Request {
    Rc(Box<Req>, Ece),
    Ud(Box<SidrReq>),
}

impl Request {
    fn private_data(&self) -> &[u8] {
        match self {
            Self::Rc(r, _) => &r.private_data,
            Self::Ud(r) => &r.private_data,
        }
    }
}

/// The address vector from `local` to `peer` (port 1, with a GRH).
fn ah_toward(ctx: &uroce::Context, local: IpAddr, peer: IpAddr) -> ibv_ah_attr {
    let mut ah = ibv_ah_attr { is_global: 1, port_num: 1, ..Default::default() };
    ah.grh.dgid = gid(peer);
    ah.grh.hop_limit = 64;
    ah.grh.sgid_index = ctx.gid_index_of(local).map_or(0, |i| i as u8);
    ah
}

/// Fills a UD event's parameters, the private data copied into it.
fn set_ud(b: &mut EventBox, data: &[u8], ah: ibv_ah_attr, qpn: u32, qkey: u32) {
    let n = data.len().min(b.data.len());
    b.data[..n].copy_from_slice(&data[..n]);
    b.ev.param.ud = rdma_ud_param {
        private_data: b.data.as_ptr().cast(),
        private_data_len: n as u8,
        ah_attr: ah,
        qp_num: qpn,
        qkey,
    };
}

/// A request to a listening id: a new id for the connection, on the
/// listener's channel and device.
fn connect_request(
    channel: *mut rdma_event_channel,
    lb: &IdBox,
    key: u64,
    cm: u32,
    from: IpAddr,
    req: Request,
) -> Option<Box<EventBox>> {
    let lst = lock(&lb.st);
    let (ctx, _) = lst.listening.iter().find(|(c, _)| c.key() == key)?.clone();
    let local_port = lst.local.map_or(0, |l| l.port());
    drop(lst);
    // As the kernel's CM: a request whose rdma_cm header is not one
    // (version 0, IPv4 or IPv6) or names an address that is not this
    // device's is refused (REJ, consumer-defined; SIDR: rejected) and
    // never reaches the application.
    let Some(hdr) = CmaHeader::parse(req.private_data())
        .filter(|h| h.version == 0 && ctx.gid_index_of(h.dst).is_some())
    else {
        let _ = match req {
            Request::Rc(..) => ctx.cm_reject(cm, &[]),
            Request::Ud(_) => ctx.cm_sidr_reply(cm, 2, 0, 0, &[]),
        };
        return None;
    };
    // As the kernel's RDMA CM: an XRC request reaches only an XRC target
    // listener and the others only the others (else REJ, consumer-defined).
    let lc = lb.c();
    if let Request::Rc(req, _) = &req {
        let xrc = req.transport_service_type == uroce::cm::XRC_TRANSPORT;
        if xrc != (lc.qp_type == QPT_XRC_RECV) {
            let _ = ctx.cm_reject(cm, &[]);
            return None;
        }
    }
    let id = new_id(channel, lc.context, lc.ps);
    let b = live_id(id)?;
    b.c().qp_type = lc.qp_type;
    let mut st = lock(&b.st);
    let verbs = (0..crate::device::devices().map_or(0, <[_]>::len))
        .filter_map(device_context)
        .find(|&c| uroce_of(c as usize).is_some_and(|u| u.key() == key));
    let local_ip = hdr.dst;
    let _ = bind_to(b, &mut st, None, SocketAddr::new(local_ip, local_port));
    if let Some(v) = verbs {
        attach_device(b, &mut st, v);
    }
    set_remote(b, &mut st, SocketAddr::new(from, hdr.src_port));
    let mut ev = new_event(id, event::CONNECT_REQUEST, 0);
    ev.ev.listen_id = lb.ptr();
    let data = req.private_data().get(CmaHeader::LEN..).unwrap_or(&[]).to_vec();
    let data = &data[..];
    let req = match req {
        Request::Ud(_) => {
            let ah = ah_toward(&ctx, local_ip, from);
            set_ud(&mut ev, data, ah, 0, 0);
            st.conn = Some((ctx, cm));
            with_registry(|r| r.conns.insert((key, cm), id as usize));
            return Some(ev);
        }
        Request::Rc(req, ece) => {
            st.remote_ece = ece;
            req
        }
    };
    let c = conn(
        req.initiator_depth,
        req.responder_resources,
        req.rnr_retry_count,
        req.retry_count,
        req.srq,
        req.local_qpn,
    );
    set_conn(&mut ev, data, c);
    st.peer = Some(Peer {
        qpn: req.local_qpn,
        psn: req.starting_psn,
        responder_resources: req.responder_resources,
        initiator_depth: req.initiator_depth,
        rnr_retry: req.rnr_retry_count,
        path_mtu: req.path_mtu,
    });
    // Our starting PSN is chosen now, as the kernel chooses it with the
    // id: an application that moves its own QP to RTS (init_qp_attr)
    // before rdma_accept sends from the PSN the REP will name.
    st.my_psn = uroce::cm::starting_psn(cm ^ req.local_qpn);
    st.req = Some(req);
    st.conn = Some((ctx, cm));
    with_registry(|r| r.conns.insert((key, cm), id as usize));
    Some(ev)
}

/// An event of an id's connection.
fn conn_event(id: *mut rdma_cm_id, b: &IdBox, event: AgentEvent) -> Option<Box<EventBox>> {
    let mut st = lock(&b.st);
    match event {
        AgentEvent::ConnectReply { id: cm, rep, ece } => {
            st.peer = Some(Peer {
                qpn: rep.local_qpn,
                psn: rep.starting_psn,
                responder_resources: rep.responder_resources,
                initiator_depth: rep.initiator_depth,
                rnr_retry: rep.rnr_retry_count,
                path_mtu: st.remote.map_or(3, |r| if r.ip().is_loopback() { 5 } else { 3 }),
            });
            let ctx = st.conn.as_ref().map(|(c, _)| c.clone())?;
            let mut kind = event::CONNECT_RESPONSE;
            let mut status = 0;
            if b.c().qp.is_null() {
                // The application moves its own QP: it reads the answer
                // with rdma_get_remote_ece.
                st.remote_ece = ece;
            } else if ece.vendor_id != 0 && ece.vendor_id != st.local_ece.vendor_id {
                // An answer from another vendor than the one asked: the
                // handshake went wrong (librdmacm's check).
                let _ = ctx.cm_reject(cm, &[]);
                // SAFETY: the id's live QP.
                unsafe { qp_to_error(b.c().qp) };
                kind = event::CONNECT_ERROR;
                status = -libc::EINVAL;
            } else {
                st.remote_ece.vendor_id = ece.vendor_id;
                let r = connect_qp(b, &st);
                if r != 0 {
                    let _ = ctx.cm_reject(cm, &[]);
                    kind = event::CONNECT_ERROR;
                    status = -r;
                } else {
                    st.established = true;
                    if ctx.cm_establish(cm).is_err() {
                        kind = event::CONNECT_ERROR;
                        status = -libc::EINVAL;
                    } else {
                        kind = event::ESTABLISHED;
                    }
                }
            }
            let mut ev = new_event(id, kind, status);
            let c = conn(
                rep.initiator_depth,
                rep.responder_resources,
                rep.rnr_retry_count,
                0,
                rep.srq,
                rep.local_qpn,
            );
            set_conn(&mut ev, &rep.private_data, c);
            Some(ev)
        }
        AgentEvent::Established { .. } => {
            st.established = true;
            Some(new_event(id, event::ESTABLISHED, 0))
        }
        AgentEvent::Rejected { reason, private_data, .. } => {
            let mut ev = new_event(id, event::REJECTED, c_int::from(reason));
            set_conn(&mut ev, &private_data[..], conn(0, 0, 0, 0, false, 0));
            Some(ev)
        }
        AgentEvent::SidrReply { id: cm, rep } => {
            let ctx = st.conn.take().map(|(c, _)| c)?;
            with_registry(|r| r.conns.remove(&(ctx.key(), cm)));
            if rep.status != 0 {
                return Some(new_event(id, event::UNREACHABLE, c_int::from(rep.status)));
            }
            let (l, r) = (st.local?.ip(), st.remote?.ip());
            let mut ev = new_event(id, event::ESTABLISHED, 0);
            set_ud(&mut ev, &rep.private_data, ah_toward(&ctx, l, r), rep.qpn, rep.qkey);
            Some(ev)
        }
        AgentEvent::Unreachable { .. } => Some(new_event(id, event::UNREACHABLE, -libc::ETIMEDOUT)),
        AgentEvent::DisconnectRequest { .. } | AgentEvent::Disconnected { .. } => {
            Some(new_event(id, event::DISCONNECTED, 0))
        }
        AgentEvent::TimeWaitExit { id: cm } => {
            // The CM forgets the connection; the id keeps it (a late
            // rdma_disconnect still returns 0, as the kernel's).
            if let Some((ctx, _)) = &st.conn {
                let key = ctx.key();
                with_registry(|r| r.conns.remove(&(key, cm)));
            }
            Some(new_event(id, event::TIMEWAIT_EXIT, 0))
        }
        AgentEvent::ConnectRequest { .. } | AgentEvent::SidrRequest { .. } => None,
    }
}

// ---- address information ----

/// A `calloc`'d copy of the socket address `addr` (`len` bytes), for an
/// `rdma_addrinfo` that `rdma_freeaddrinfo` frees.
fn copy_addr(addr: SocketAddr) -> Option<(*mut libc::sockaddr, libc::socklen_t)> {
    let len = if addr.is_ipv4() {
        size_of::<libc::sockaddr_in>()
    } else {
        size_of::<libc::sockaddr_in6>()
    };
    // SAFETY: calloc of a whole sockaddr_storage (freed by
    // rdma_freeaddrinfo); written only when it succeeded.
    unsafe {
        let sa =
            libc::calloc(1, size_of::<libc::sockaddr_storage>()).cast::<libc::sockaddr_storage>();
        if sa.is_null() {
            return None;
        }
        write_sockaddr(&mut *sa, addr);
        Some((sa.cast(), len as libc::socklen_t))
    }
}

/// The first address `getaddrinfo` gives for `node`/`service`.
fn resolve(
    node: *const c_char,
    service: *const c_char,
    family: c_int,
    passive: bool,
) -> Result<SocketAddr, c_int> {
    // SAFETY: all-zero is a valid addrinfo.
    let mut h: libc::addrinfo = unsafe { std::mem::zeroed() };
    h.ai_family = family;
    h.ai_socktype = libc::SOCK_STREAM;
    h.ai_flags = if passive { libc::AI_PASSIVE } else { 0 };
    let mut out: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: C strings from the caller (or NULL), live hints, out.
    let r = unsafe { libc::getaddrinfo(node, service, &raw const h, &raw mut out) };
    if r != 0 || out.is_null() {
        // rdma_getaddrinfo reports getaddrinfo's EAI_* codes directly.
        set_errno(libc::EADDRNOTAVAIL);
        return Err(if r != 0 { r } else { -1 });
    }
    // SAFETY: getaddrinfo succeeded: `out` is a list of at least one.
    let addr = read_sockaddr(unsafe { &*out }.ai_addr);
    // SAFETY: the list getaddrinfo made.
    unsafe { libc::freeaddrinfo(out) };
    addr.ok_or_else(|| minus_one(libc::EAFNOSUPPORT))
}

/// rdma-core's rules: `node`/`service` resolve to the destination (the
/// source with `RAI_PASSIVE`); without them, the hints' destination is
/// taken; a source the hints give is kept when resolution set none
/// (libfabric's verbs provider names both ends through the hints).
pub(crate) unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: NULL or the caller's readable hints.
        let hints = unsafe { hints.as_ref() };
        let flags = hints.map_or(0, |h| h.ai_flags);
        let passive = flags & RAI_PASSIVE != 0;
        let hint_addr = |p: *mut libc::sockaddr, len: libc::socklen_t| {
            if p.is_null() || len == 0 { None } else { read_sockaddr(p) }
        };
        let (mut src, mut dst) = (None, None);
        if !node.is_null() || !service.is_null() {
            let addr = match resolve(node, service, hints.map_or(0, |h| h.ai_family), passive) {
                Ok(a) => a,
                Err(r) => return r,
            };
            if passive { src = Some(addr) } else { dst = Some(addr) }
        } else {
            dst = hints.and_then(|h| hint_addr(h.ai_dst_addr, h.ai_dst_len));
        }
        if src.is_none() {
            src = hints.and_then(|h| hint_addr(h.ai_src_addr, h.ai_src_len));
        }
        let Some(first) = src.or(dst) else { return minus_one(libc::EINVAL) };
        // SAFETY: calloc'd, freed by rdma_freeaddrinfo.
        let ai = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
        if ai.is_null() {
            return minus_one(libc::ENOMEM);
        }
        // SAFETY: just allocated and zeroed; every pointer stored is a
        // calloc'd copy that rdma_freeaddrinfo frees (NULL if it failed).
        unsafe {
            let a = &mut *ai;
            a.ai_flags = flags;
            a.ai_family = if first.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
            a.ai_qp_type = hints.map_or(2, |h| if h.ai_qp_type == 0 { 2 } else { h.ai_qp_type });
            a.ai_port_space = hints.map_or(RDMA_PS_TCP, |h| {
                if h.ai_port_space == 0 { RDMA_PS_TCP } else { h.ai_port_space }
            });
            *res = ai;
            for (addr, ptr, len) in [
                (src, &mut a.ai_src_addr, &mut a.ai_src_len),
                (dst, &mut a.ai_dst_addr, &mut a.ai_dst_len),
            ] {
                let Some(addr) = addr else { continue };
                let Some((p, l)) = copy_addr(addr) else {
                    rdma_freeaddrinfo(ai);
                    *res = std::ptr::null_mut();
                    return minus_one(libc::ENOMEM);
                };
                *ptr = p;
                *len = l;
            }
        }
        0
    })
}

pub(crate) unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a list rdma_getaddrinfo calloc'd.
        unsafe {
            let next = (*p).ai_next;
            libc::free((*p).ai_src_addr.cast());
            libc::free((*p).ai_dst_addr.cast());
            libc::free((*p).ai_src_canonname.cast());
            libc::free((*p).ai_dst_canonname.cast());
            libc::free((*p).ai_route);
            libc::free((*p).ai_connect);
            libc::free(p.cast());
            p = next;
        }
    }
}

pub(crate) unsafe extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    let s: &'static str = match event {
        0 => "RDMA_CM_EVENT_ADDR_RESOLVED\0",
        1 => "RDMA_CM_EVENT_ADDR_ERROR\0",
        2 => "RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        3 => "RDMA_CM_EVENT_ROUTE_ERROR\0",
        4 => "RDMA_CM_EVENT_CONNECT_REQUEST\0",
        5 => "RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        6 => "RDMA_CM_EVENT_CONNECT_ERROR\0",
        7 => "RDMA_CM_EVENT_UNREACHABLE\0",
        8 => "RDMA_CM_EVENT_REJECTED\0",
        9 => "RDMA_CM_EVENT_ESTABLISHED\0",
        10 => "RDMA_CM_EVENT_DISCONNECTED\0",
        11 => "RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        12 => "RDMA_CM_EVENT_MULTICAST_JOIN\0",
        13 => "RDMA_CM_EVENT_MULTICAST_ERROR\0",
        14 => "RDMA_CM_EVENT_ADDR_CHANGE\0",
        15 => "RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => "UNKNOWN EVENT\0",
    };
    s.as_ptr().cast()
}

// ---- devices, SRQs, and what is refused cleanly ----

/// `rdma_get_devices`: every device's context (the ones the ids use),
/// NULL-terminated, in a malloc'd array `rdma_free_devices` frees.
pub(crate) unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        let n = crate::device::devices().map_or(0, <[_]>::len);
        let list: Vec<*mut ibv_context> = (0..n).filter_map(device_context).collect();
        // SAFETY: malloc of (len + 1) pointers; NULL is handled.
        let arr = unsafe { libc::malloc((list.len() + 1) * size_of::<*mut ibv_context>()) }
            .cast::<*mut ibv_context>();
        if arr.is_null() {
            return null_errno(libc::ENOMEM);
        }
        for (i, c) in list.iter().enumerate() {
            // SAFETY: i < len + 1 slots allocated above.
            unsafe { arr.add(i).write(*c) };
        }
        // SAFETY: the last slot.
        unsafe { arr.add(list.len()).write(std::ptr::null_mut()) };
        if !num.is_null() {
            // SAFETY: the caller passes NULL or a writable int.
            unsafe { *num = list.len() as c_int };
        }
        arr
    })
}

/// `rdma_free_devices`: the array only (the contexts stay, as rdma-core's).
pub(crate) unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: NULL or an array rdma_get_devices malloc'd.
    unsafe { libc::free(list.cast()) };
}

/// `rdma_create_srq`: as librdmacm, the extended call with the PD: an XRC
/// SRQ for an XRC target id, a basic one otherwise.
pub(crate) unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    on_id(id, |b| {
        if attr.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: ibv_srq_init_attr_ex is C data; all-zero is valid.
        let mut ex: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: the extended attributes begin with the basic ones; the
        // caller's struct is readable.
        unsafe { std::ptr::copy_nonoverlapping(attr, (&raw mut ex).cast(), 1) };
        ex.comp_mask = SRQ_ATTR_TYPE | SRQ_ATTR_PD;
        ex.srq_type = if b.c().qp_type == QPT_XRC_RECV { SRQT_XRC } else { SRQT_BASIC };
        ex.pd = pd;
        // SAFETY: our own call on a live id and a live struct.
        let r = unsafe { rdma_create_srq_ex(id, &raw mut ex) };
        // SAFETY: back into the caller's writable struct.
        unsafe { std::ptr::copy_nonoverlapping((&raw const ex).cast(), attr, 1) };
        r
    })
}

/// `rdma_create_srq_ex`: an SRQ recorded in `id->srq` for the id's QP (a
/// type is required, as librdmacm requires it). The PD defaults to the
/// id's (the device's default one if it has none); an XRC SRQ's domain to
/// the device's and its CQ to the id's receive CQ, made if need be.
pub(crate) unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    on_id(id, |b| {
        // SAFETY: the caller's writable attributes, if not null.
        let Some(a) = (unsafe { attr.as_mut() }) else { return minus_one(libc::EINVAL) };
        let c = b.c();
        if a.comp_mask & SRQ_ATTR_TYPE == 0 || c.verbs.is_null() {
            return minus_one(libc::EINVAL);
        }
        if a.comp_mask & SRQ_ATTR_PD == 0 || a.pd.is_null() {
            if c.pd.is_null() {
                c.pd = default_pd(c.verbs);
            }
            a.pd = c.pd;
            a.comp_mask |= SRQ_ATTR_PD;
        }
        if a.srq_type == SRQT_XRC {
            if a.comp_mask & SRQ_ATTR_XRCD == 0 || a.xrcd.is_null() {
                a.xrcd = device_xrcd(c.verbs).cast();
                if a.xrcd.is_null() {
                    return -1; // errno set by ibv_open_xrcd
                }
            }
            if a.comp_mask & SRQ_ATTR_CQ == 0 || a.cq.is_null() {
                if c.recv_cq.is_null() {
                    own_recv_cq(b, a.attr.max_wr);
                }
                a.cq = c.recv_cq;
            }
            a.comp_mask |= SRQ_ATTR_XRCD | SRQ_ATTR_CQ;
        }
        // SAFETY: our own call on the id's context and the attributes.
        let srq = unsafe { crate::srq::create_srq_ex(c.verbs, attr) };
        if srq.is_null() {
            if c.qp.is_null() {
                destroy_own_cqs(b);
            }
            return -1; // errno set by ibv_create_srq_ex
        }
        c.srq = srq;
        0
    })
}

/// Makes the id a receive CQ of `n` entries with a channel of its own.
fn own_recv_cq(b: &IdBox, n: u32) {
    let c = b.c();
    // SAFETY: a live context of ours.
    let ch = unsafe { crate::cq::ibv_create_comp_channel(c.verbs) };
    let n = c_int::try_from(n.max(1)).unwrap_or(c_int::MAX);
    // SAFETY: a live context of ours and its new channel.
    let cq = unsafe { crate::cq::ibv_create_cq(c.verbs, n, std::ptr::null_mut(), ch, 0) };
    lock(&b.st).own_cqs.push((cq as usize, ch as usize));
    c.recv_cq = cq;
    c.recv_cq_channel = ch;
}

/// `rdma_destroy_srq`: the SRQ `rdma_create_srq` made, and the CQs the
/// library made if no QP is left to use them (as librdmacm).
pub(crate) unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        let Some(b) = live_id(id) else { return };
        let srq = std::mem::replace(&mut b.c().srq, std::ptr::null_mut());
        if !srq.is_null() {
            // SAFETY: the SRQ rdma_create_srq made.
            unsafe { crate::srq::ibv_destroy_srq(srq) };
        }
        if b.c().qp.is_null() {
            destroy_own_cqs(b);
        }
    });
}

/// `rdma_notify`: an async event the application saw on the id's QP;
/// the CM needs nothing from it on RoCE (the kernel's uses it to learn
/// that the first packet arrived before the RTU, which ours learns from
/// the RTU's retries).
pub(crate) unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    on_id(id, |_| 0)
}

/// `rdma_set_local_ece`: the ECE an id whose QP the application makes
/// itself offers in its REQ (or answers in its REP). EINVAL once the id
/// has a QP, for a null or vendor-less ECE, or unknown `comp_mask` bits,
/// as librdmacm.
pub(crate) unsafe extern "C" fn rdma_set_local_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    on_id(id, |b| {
        // SAFETY: the caller's ECE, if not null.
        let Some(e) = (unsafe { ece.as_ref() }) else { return minus_one(libc::EINVAL) };
        if !b.c().qp.is_null() || e.vendor_id == 0 || e.comp_mask != 0 {
            return minus_one(libc::EINVAL);
        }
        lock(&b.st).local_ece = Ece { vendor_id: e.vendor_id, options: e.options };
        0
    })
}

/// `rdma_get_remote_ece`: the ECE of the peer's REQ (passive side) or REP
/// (active side, when the application moves its own QP); zero when it
/// sent none. EINVAL once the id has a QP, as librdmacm.
pub(crate) unsafe extern "C" fn rdma_get_remote_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    on_id(id, |b| {
        // SAFETY: the caller's ECE, if not null.
        let Some(e) = (unsafe { ece.as_mut() }) else { return minus_one(libc::EINVAL) };
        if !b.c().qp.is_null() {
            return minus_one(libc::EINVAL);
        }
        let r = lock(&b.st).remote_ece;
        *e = ibv_ece { vendor_id: r.vendor_id, options: r.options, comp_mask: 0 };
        0
    })
}
