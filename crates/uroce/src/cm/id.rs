//! Connection manager ids, as librdmacm's `rdma_cm_id` in Rust: an
//! [`EventChannel`] with a descriptor, and [`CmId`]s on it that bind,
//! resolve an address and a route, listen, connect, accept, reject,
//! disconnect, join multicast groups and answer `init_qp_attr`; RC ids
//! (`PortSpace::Tcp`, `Ib`) connect through REQ/REP/RTU, UD ids
//! (`PortSpace::Udp`) find the peer's serving QP by SIDR. Every step
//! reports through the channel, as in rdma_cm: an id's calls return at
//! once and its outcome comes as an [`Event`].
//!
//! Like librdmacm, an id whose QP the library made ([`CmId::create_qp`])
//! has that QP moved for it: to INIT when made (RTS for UD), to RTR and
//! RTS when the peer's reply or request is in, to the error state on
//! disconnect; an application that makes its own QP moves it with
//! [`CmId::init_qp_attr`] and gives its number in [`ConnParam::qp_num`].
//!
//! Ids share the process's port table (`cm::ports`) with librdmacm's, so
//! a Rust id and a C one never hold the same port. Not here: ECE, and
//! synchronous ids (a blocking wrapper: [`crate::Context::cm_listen`] and
//! [`crate::Context::cm_connect`]).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use uroce_transport::cm::{CmEvent as AgentEvent, Ece, QpOffer};
use uroce_wire::cm::{CmaHeader, port_space, rdma_cm_service_id};

use super::ports::{self, BindOptions};
use super::{ACCESS as RC_ACCESS, CmChannel, CmChannelEvent, psn_for};
use crate::context::Context;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::verbs::{Pd, Qp, QpInitAttr};
use crate::{AhAttr, AttrMask, Mtu, Path, Psn, QpAttr, QpState, QpType};

/// The Q_Key of the RDMA CM's UDP port space (and its multicast groups).
pub const UDP_QKEY: u32 = 0x0123_4567;
/// The multicast QPN an address vector to a group names.
const MULTICAST_QPN: u32 = 0xff_ffff;
/// Local ACK Timeout unless the id sets one: 19 (4.096 µs × 2^19 ≈ 2.1 s
/// before a retry is spent), what Linux's CM puts in its REQ over RoCE
/// (`rping_cm.pcap`). Losses are repaired sooner, by probes timed from
/// the round trip; this is the budget a starved peer gets (seven retries),
/// and 67 ms (14) ran out on a loaded machine.
pub(crate) const ACK_TIMEOUT: u8 = 19;
/// The CM's response timeout (2^20 × 4.096 µs ≈ 4.3 s) and retries, as
/// librdmacm's.
const CM_RESPONSE_TIMEOUT: u8 = 20;
const CM_MAX_RETRIES: u8 = 15;

/// The RDMA CM port space of an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSpace {
    /// Reliable connections (`RDMA_PS_TCP`).
    Tcp,
    /// Reliable connections of the IB port space (`RDMA_PS_IB`), served
    /// as TCP ones, as librdmacm's are here.
    Ib,
    /// Unreliable datagrams (`RDMA_PS_UDP`): SIDR and multicast.
    Udp,
}

impl PortSpace {
    /// The port space number in service IDs and the port table.
    fn wire(self) -> u16 {
        match self {
            Self::Tcp | Self::Ib => port_space::TCP,
            Self::Udp => port_space::UDP,
        }
    }
}

/// A connection's parameters (`rdma_conn_param`): what `connect` and
/// `accept` ask for, and what a request or reply event reports of the
/// peer (its initiator depth as our responder resources and the other
/// way round, as rdma_cm reports them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParam {
    /// READs and atomics the peer may have in flight toward us.
    pub responder_resources: u8,
    /// READs and atomics we may have in flight toward the peer.
    pub initiator_depth: u8,
    /// Transport retries (at most 7).
    pub retry_count: u8,
    /// RNR retries (7: forever).
    pub rnr_retry_count: u8,
    /// The QP takes receives from an SRQ.
    pub srq: bool,
    /// The QP's number when the id has no QP of its own.
    pub qp_num: u32,
}

impl ConnParam {
    /// With 255 (`RDMA_MAX_RESP_RES`, `RDMA_MAX_INIT_DEPTH`) as the
    /// device's most, as librdmacm reads it.
    fn resolved(&self) -> Self {
        let most = crate::limits::MAX_QP_RD_ATOM.min(u32::from(u8::MAX - 1)) as u8;
        let pick = |v: u8| if v == u8::MAX { most } else { v };
        Self {
            responder_resources: pick(self.responder_resources),
            initiator_depth: pick(self.initiator_depth),
            ..*self
        }
    }
}

impl Default for ConnParam {
    fn default() -> Self {
        Self {
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

/// Where a UD id's datagrams go (`rdma_ud_param`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdParam {
    /// The address vector toward the peer (or the group).
    pub ah: AhAttr,
    /// The serving QP (0xFFFFFF for a multicast group).
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

/// What an [`Event`] reports (`enum rdma_cm_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// The destination's device is found; the id is bound to it.
    AddrResolved,
    /// No device reaches the destination (status -ENODEV).
    AddrError,
    /// The route is resolved; the id may connect.
    RouteResolved,
    /// A request to a listening id: the event's `id` is a new id for the
    /// connection, `listen_id` the listener.
    ConnectRequest,
    /// The peer accepted and the id has no QP of its own: move the QP
    /// with [`CmId::init_qp_attr`], then [`CmId::establish`].
    ConnectResponse,
    /// Connecting failed here (status: the negative errno).
    ConnectError,
    /// The peer did not answer (status -ETIMEDOUT, or a SIDR status).
    Unreachable,
    /// The peer refused (status: the REJ reason, 8 when nobody listens).
    Rejected,
    /// The connection is up (a UD id: the peer's QP is in `ud`).
    Established,
    /// The connection is down (either side's DREQ).
    Disconnected,
    /// A multicast join completed (`ud` sends to the group).
    MulticastJoin,
    /// A multicast join failed (status: the negative errno).
    MulticastError,
    /// The connection's TimeWait is over: its QP may be reused.
    TimewaitExit,
}

/// An event on an [`EventChannel`] (`struct rdma_cm_event`).
#[derive(Debug)]
pub struct Event {
    /// The id it is for (for a request: the new connection's).
    pub id: CmId,
    /// For a request: the listening id.
    pub listen_id: Option<CmId>,
    /// What happened.
    pub event: EventType,
    /// 0, the REJ reason, a SIDR status or a negative errno (as rdma_cm).
    pub status: i32,
    /// The peer's connection parameters (requests, replies).
    pub param: ConnParam,
    /// UD ids: where to send.
    pub ud: Option<UdParam>,
    /// The peer's private data (a request's without the RDMA CM header).
    pub private_data: Vec<u8>,
}

impl Event {
    fn new(id: CmId, event: EventType, status: i32) -> Self {
        Self {
            id,
            listen_id: None,
            event,
            status,
            param: ConnParam::default(),
            ud: None,
            private_data: Vec::new(),
        }
    }
}

/// An event channel (`rdma_event_channel`): the events of its ids, behind
/// a descriptor that is readable while events wait. The devices' progress
/// threads fill it. Read it from one thread at a time: a request's new id
/// is registered as its event is read, so a second reader could take that
/// connection's next event before the id exists.
#[derive(Clone)]
pub struct EventChannel {
    shared: Arc<Shared>,
}

struct Shared {
    ch: CmChannel,
    devices: Vec<Slot>,
    reg: Mutex<Registry>,
}

/// A device the channel's ids may use, opened on first use.
struct Slot {
    device: Device,
    ctx: Mutex<Option<Context>>,
}

/// Which id each connection, listen and local event belongs to.
#[derive(Default)]
struct Registry {
    /// By (context key, CM connection ID).
    conns: HashMap<(u64, u32), Weak<IdInner>>,
    /// By (context key, service ID).
    listens: HashMap<(u64, u64), Weak<IdInner>>,
    /// Events the ids raised themselves, in order (each with a wake-up
    /// on the channel).
    local: VecDeque<LocalEvent>,
}

struct LocalEvent {
    id: Weak<IdInner>,
    event: EventType,
    status: i32,
    group: Option<IpAddr>,
}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel").field("fd", &self.as_raw_fd()).finish()
    }
}

impl EventChannel {
    /// A channel whose ids use the process's configured devices
    /// ([`crate::devices`]), each opened once per process
    /// ([`Device::open_shared`]) when an id first needs it.
    ///
    /// # Errors
    /// No devices are configured, or the eventfd could not be made.
    pub fn new() -> Result<Self> {
        Self::build(crate::devices()?.into_iter().map(|d| (d, None)).collect())
    }

    /// A channel whose ids use these open contexts (their devices' own
    /// addresses).
    ///
    /// # Errors
    /// The eventfd could not be made.
    pub fn with_contexts(contexts: &[Context]) -> Result<Self> {
        Self::build(contexts.iter().map(|c| (c.device().clone(), Some(c.clone()))).collect())
    }

    fn build(devices: Vec<(Device, Option<Context>)>) -> Result<Self> {
        let devices = devices
            .into_iter()
            .map(|(device, ctx)| Slot { device, ctx: Mutex::new(ctx) })
            .collect();
        Ok(Self {
            shared: Arc::new(Shared {
                ch: CmChannel::new()?,
                devices,
                reg: Mutex::new(Registry::default()),
            }),
        })
    }

    /// A new id on this channel (`rdma_create_id`).
    pub fn create_id(&self, ps: PortSpace) -> CmId {
        CmId(Arc::new(IdInner { chan: self.clone(), ps, st: Mutex::new(IdState::default()) }))
    }

    /// The next event: blocks while none waits, unless the channel is
    /// non-blocking (then an [`Error::Io`] of kind `WouldBlock`).
    ///
    /// # Errors
    /// `WouldBlock`, or the descriptor's error.
    pub fn get_event(&self) -> Result<Event> {
        loop {
            let raw = self.shared.ch.get().map_err(Error::Io)?;
            if let Some(e) = self.translate(raw) {
                return Ok(e);
            }
        }
    }

    /// The next event, waiting at most `timeout`.
    ///
    /// # Errors
    /// The descriptor's error.
    pub fn get_event_timeout(&self, timeout: Duration) -> Result<Option<Event>> {
        let end = std::time::Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            let Some(raw) = self.shared.ch.get_timeout(left).map_err(Error::Io)? else {
                return Ok(None);
            };
            if let Some(e) = self.translate(raw) {
                return Ok(Some(e));
            }
        }
    }

    /// Sets or clears `O_NONBLOCK` on the descriptor.
    ///
    /// # Errors
    /// `fcntl`'s.
    pub fn set_nonblocking(&self, on: bool) -> Result<()> {
        self.shared.ch.set_nonblocking(on).map_err(Error::Io)
    }

    /// The raw channel underneath.
    #[cfg(feature = "tokio")]
    pub(super) fn raw(&self) -> &CmChannel {
        &self.shared.ch
    }

    fn reg(&self) -> MutexGuard<'_, Registry> {
        self.shared.reg.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The addresses of the channel's devices, in order.
    fn addresses(&self) -> Vec<IpAddr> {
        self.shared.devices.iter().map(|s| s.device.socket_addr().ip()).collect()
    }

    /// Device `index`'s context, opened on first use.
    fn context(&self, index: usize) -> Result<Context> {
        let slot = &self.shared.devices[index];
        let mut g = slot.ctx.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = &*g {
            return Ok(c.clone());
        }
        let c = slot.device.open_shared()?;
        *g = Some(c.clone());
        Ok(c)
    }

    /// The open context tagged `key`.
    fn context_by_key(&self, key: u64) -> Option<Context> {
        self.shared.devices.iter().find_map(|s| {
            let g = s.ctx.lock().unwrap_or_else(|e| e.into_inner());
            g.as_ref().filter(|c| c.key() == key).cloned()
        })
    }

    /// Queues an event of an id's own, with its wake-up.
    fn raise(&self, id: &CmId, event: EventType, status: i32, group: Option<IpAddr>) {
        let mut reg = self.reg();
        reg.local.push_back(LocalEvent { id: Arc::downgrade(&id.0), event, status, group });
        self.shared.ch.push_user(0);
    }

    /// The application's event for a raw one; `None` for one of an id
    /// that is gone, or a request refused before it reaches anyone.
    pub(super) fn translate(&self, raw: CmChannelEvent) -> Option<Event> {
        match raw {
            CmChannelEvent::User(_) => {
                let l = self.reg().local.pop_front()?;
                let id = CmId(l.id.upgrade()?);
                match l.group {
                    Some(g) if l.event == EventType::MulticastJoin => id.join_event(g),
                    _ => Some(Event::new(id, l.event, l.status)),
                }
            }
            CmChannelEvent::Cm { ctx, event } => match event {
                AgentEvent::ConnectRequest { id, from, req, .. } => {
                    let sid = req.service_id;
                    self.request(ctx, id, sid, from, Request::Rc(req))
                }
                AgentEvent::SidrRequest { id, from, req } => {
                    let sid = req.service_id;
                    self.request(ctx, id, sid, from, Request::Ud(req))
                }
                other => {
                    let weak = self.reg().conns.get(&(ctx, other.id())).cloned();
                    CmId(weak?.upgrade()?).conn_event(ctx, other)
                }
            },
        }
    }

    /// A request to a listening id: a new id for it, bound where the
    /// request was addressed.
    fn request(&self, key: u64, cm: u32, sid: u64, from: IpAddr, req: Request) -> Option<Event> {
        let listener = self.reg().listens.get(&(key, sid)).and_then(Weak::upgrade);
        let ctx = self.context_by_key(key)?;
        let refuse = |ctx: &Context| {
            let _ = match req {
                Request::Rc(_) => ctx.cm_reject(cm, &[]),
                Request::Ud(_) => ctx.cm_sidr_reply(cm, 2, 0, 0, &[]),
            };
        };
        // As the kernel's CM: a request whose rdma_cm header is not one,
        // or names an address that is not this device's, never reaches
        // the application.
        let hdr = CmaHeader::parse(req.private_data())
            .filter(|h| h.version == 0 && ctx.gid_index_of(h.dst).is_some());
        let (Some(listener), Some(hdr)) = (listener.map(CmId), hdr) else {
            refuse(&ctx);
            return None;
        };
        let Some(index) =
            listener.lock().listening.iter().find(|l| l.ctx.key() == key).map(|l| l.index)
        else {
            refuse(&ctx);
            return None;
        };
        let port = listener.lock().local.map_or(0, |l| l.port());
        let id = self.create_id(listener.0.ps);
        {
            let mut st = id.lock();
            st.dev = Some((index, ctx.clone()));
            st.local = Some(SocketAddr::new(hdr.dst, port));
            st.remote = Some(SocketAddr::new(from, hdr.src_port));
            st.conn = Some(cm);
            st.opts = listener.lock().opts;
            // Chosen now, as the kernel chooses it with the id: a QP moved
            // to RTS (init_qp_attr) before `accept` sends from the PSN the
            // REP names.
            st.my_psn = psn_for(cm ^ qpn_of(&req));
        }
        self.reg().conns.insert((key, cm), Arc::downgrade(&id.0));
        let mut ev = Event::new(id.clone(), EventType::ConnectRequest, 0);
        ev.listen_id = Some(listener);
        ev.private_data = req.private_data().get(CmaHeader::LEN..).unwrap_or(&[]).to_vec();
        match req {
            Request::Ud(_) => {
                ev.ud = Some(UdParam { ah: id.ah_toward(&ctx, from), qp_num: 0, qkey: 0 });
            }
            Request::Rc(req) => {
                ev.param = peer_param(
                    req.initiator_depth,
                    req.responder_resources,
                    req.rnr_retry_count,
                    req.retry_count,
                    req.srq,
                    req.local_qpn,
                );
                id.lock().peer = Some(Peer {
                    qpn: req.local_qpn,
                    psn: req.starting_psn,
                    responder_resources: req.responder_resources,
                    initiator_depth: req.initiator_depth,
                    rnr_retry: req.rnr_retry_count,
                    retry: Some(req.retry_count),
                    path_mtu: req.path_mtu,
                });
            }
        }
        Some(ev)
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.ch.as_fd()
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.shared.ch.as_raw_fd()
    }
}

/// The requester's QP number in a request (0 for SIDR).
fn qpn_of(req: &Request) -> u32 {
    match req {
        Request::Rc(r) => r.local_qpn,
        Request::Ud(_) => 0,
    }
}

/// A request to a listening id: a connection's REQ or a UD id's SIDR.
enum Request {
    Rc(Box<uroce_wire::cm::Req>),
    Ud(Box<uroce_wire::cm::SidrReq>),
}

impl Request {
    fn private_data(&self) -> &[u8] {
        match self {
            Self::Rc(r) => &r.private_data,
            Self::Ud(r) => &r.private_data,
        }
    }
}

/// The peer's connection parameters as an event reports them.
fn peer_param(resp: u8, init: u8, rnr: u8, retry: u8, srq: bool, qp_num: u32) -> ConnParam {
    ConnParam {
        responder_resources: resp,
        initiator_depth: init,
        retry_count: retry,
        rnr_retry_count: rnr,
        srq,
        qp_num,
    }
}

/// A connection manager id (`rdma_cm_id`). Clones share it; when the
/// last goes, its connection is ended (a DREQ, or a REJ for a request not
/// yet answered), its listens and port released and its groups left.
#[derive(Clone)]
pub struct CmId(Arc<IdInner>);

struct IdInner {
    chan: EventChannel,
    ps: PortSpace,
    st: Mutex<IdState>,
}

#[derive(Default)]
struct IdState {
    /// The device (index in the channel) and its context, once bound.
    dev: Option<(usize, Context)>,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    /// The CM connection (or SIDR request) on `dev`'s context.
    conn: Option<u32>,
    listening: Vec<Listen>,
    qp: Option<Arc<Qp>>,
    /// The peer's numbers, from its REQ or REP.
    peer: Option<Peer>,
    my_psn: u32,
    /// What `connect`/`accept` asked for.
    param: ConnParam,
    opts: IdOptions,
    groups: Vec<Group>,
    /// The connection was established (a disconnect means something).
    connected: bool,
}

struct Listen {
    index: usize,
    ctx: Context,
    sid: u64,
}

/// What the id's setters set (`rdma_set_option`).
#[derive(Debug, Default, Clone, Copy)]
struct IdOptions {
    tos: Option<u8>,
    ack_timeout: Option<u8>,
    bind: BindOptions,
}

#[derive(Debug, Clone, Copy)]
struct Peer {
    qpn: u32,
    psn: u32,
    responder_resources: u8,
    initiator_depth: u8,
    rnr_retry: u8,
    /// The requester's transport retries (a passive QP uses them).
    retry: Option<u8>,
    path_mtu: u8,
}

struct Group {
    ip: IpAddr,
    send_only: bool,
    attached: bool,
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("CmId")
            .field("ps", &self.0.ps)
            .field("local", &st.local)
            .field("remote", &st.remote)
            .finish_non_exhaustive()
    }
}

impl PartialEq for CmId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CmId {}

impl CmId {
    fn lock(&self) -> MutexGuard<'_, IdState> {
        self.0.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The id's name in the port table.
    fn key(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.0.ps
    }

    /// The channel the id reports to.
    pub fn channel(&self) -> &EventChannel {
        &self.0.chan
    }

    /// The device context the id is bound to, once it is.
    pub fn context(&self) -> Option<Context> {
        self.lock().dev.as_ref().map(|(_, c)| c.clone())
    }

    /// The local address (`rdma_get_local_addr`), once bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.lock().local
    }

    /// The peer's address (`rdma_get_peer_addr`), once known.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.lock().remote
    }

    /// The id's QP, if the library made it ([`CmId::create_qp`]).
    pub fn qp(&self) -> Option<Arc<Qp>> {
        self.lock().qp.clone()
    }

    /// Sets the IP type of service of the id's connection
    /// (`RDMA_OPTION_ID_TOS`): its address vector's traffic class and its
    /// REQ's.
    pub fn set_tos(&self, tos: u8) {
        self.lock().opts.tos = Some(tos);
    }

    /// Sets the QP's Local ACK Timeout, 4.096 µs × 2^`code`
    /// (`RDMA_OPTION_ID_ACK_TIMEOUT`, at most 31).
    pub fn set_ack_timeout(&self, code: u8) {
        self.lock().opts.ack_timeout = Some(code.min(31));
    }

    /// Lets the id share its port with other REUSEADDR ids until one
    /// listens (`RDMA_OPTION_ID_REUSEADDR`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] once the id is bound (clearing it is
    /// allowed until it listens).
    pub fn set_reuseaddr(&self, on: bool) -> Result<()> {
        let mut st = self.lock();
        if st.local.is_some() && (on || !st.listening.is_empty()) {
            return Err(Error::InvalidArgument("REUSEADDR is set before binding"));
        }
        st.opts.bind.reuseaddr = on;
        Ok(())
    }

    /// An IPv6 wildcard id covers IPv6 devices only
    /// (`RDMA_OPTION_ID_AFONLY`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] once the id is bound.
    pub fn set_afonly(&self, on: bool) -> Result<()> {
        let mut st = self.lock();
        if st.local.is_some() {
            return Err(Error::InvalidArgument("AFONLY is set before binding"));
        }
        st.opts.bind.afonly = on;
        Ok(())
    }

    /// Binds the id to a local address and port (`rdma_bind_addr`): a
    /// device's address binds the id to that device, a wildcard to none
    /// (a listen then covers every device of its family); port 0 picks a
    /// free one.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (bound already), [`Error::NoDevice`]
    /// (an address of this host no device has), [`Error::AddrNotAvailable`],
    /// [`Error::InUse`].
    pub fn bind_addr(&self, mut addr: SocketAddr) -> Result<()> {
        let mut st = self.lock();
        if st.local.is_some() {
            return Err(Error::InvalidArgument("the id is bound already"));
        }
        let index = if addr.ip().is_unspecified() {
            None
        } else {
            let addrs = self.0.chan.addresses();
            Some(
                ports::device_for(&addrs, Some(addr.ip()), addr.ip())
                    .ok_or_else(|| ports::unbindable(addr.ip()))?,
            )
        };
        let dev = index.map(|i| self.0.chan.context(i).map(|c| (i, c))).transpose()?;
        ports::port_table().claim(self.key(), self.0.ps.wire(), &mut addr, st.opts.bind)?;
        st.dev = dev;
        st.local = Some(addr);
        Ok(())
    }

    /// Resolves `dst` to a device (`rdma_resolve_addr`): the one with
    /// `src`'s address (or the bound one), else the one the kernel would
    /// send from. The outcome comes as `AddrResolved` (the id is then
    /// bound to that device, on a free port if it had none) or
    /// `AddrError`.
    ///
    /// # Errors
    /// [`Error::InUse`] and the like when binding to the device's address
    /// fails.
    pub fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr) -> Result<()> {
        let mut st = self.lock();
        // Once bound, the bound address is the source (as the kernel's).
        let src = st.local.or(src);
        let addrs = self.0.chan.addresses();
        let Some(index) = ports::device_for(&addrs, src.map(|s| s.ip()), dst.ip()) else {
            drop(st);
            self.0.chan.raise(self, EventType::AddrError, -libc::ENODEV, None);
            return Ok(());
        };
        let ctx = self.0.chan.context(index)?;
        let mut local = SocketAddr::new(addrs[index], src.map_or(0, |s| s.port()));
        match st.local {
            Some(l) if !l.ip().is_unspecified() => local = l,
            Some(l) => local.set_port(l.port()),
            None => {
                ports::port_table().claim(
                    self.key(),
                    self.0.ps.wire(),
                    &mut local,
                    st.opts.bind,
                )?;
            }
        }
        st.dev = Some((index, ctx));
        st.local = Some(local);
        st.remote = Some(dst);
        drop(st);
        self.0.chan.raise(self, EventType::AddrResolved, 0, None);
        Ok(())
    }

    /// Resolves the route to the resolved address (`rdma_resolve_route`):
    /// on RoCE the path is the two GIDs, so `RouteResolved` comes at once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] before the address is resolved.
    pub fn resolve_route(&self) -> Result<()> {
        let st = self.lock();
        if st.local.is_none() || st.remote.is_none() || st.dev.is_none() {
            return Err(Error::InvalidArgument("resolve the address first"));
        }
        drop(st);
        self.0.chan.raise(self, EventType::RouteResolved, 0, None);
        Ok(())
    }

    /// Listens for requests on the bound port (`rdma_listen`): on the
    /// bound device, or on every device of the wildcard's family.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (not bound), [`Error::InUse`] (another
    /// id or process listens there), [`Error::NoDevice`].
    pub fn listen(&self) -> Result<()> {
        let mut st = self.lock();
        let Some(local) = st.local else {
            return Err(Error::InvalidArgument("bind the id before listening"));
        };
        if !st.listening.is_empty() {
            return Ok(());
        }
        let space = self.0.ps.wire();
        let mut bind = st.opts.bind;
        ports::port_table().listen(self.key(), space, local, &mut bind)?;
        st.opts.bind = bind;
        let sid = rdma_cm_service_id(space, local.port());
        let addrs = self.0.chan.addresses();
        let chosen: Vec<usize> = match &st.dev {
            Some((i, _)) => vec![*i],
            None => (0..addrs.len())
                .filter(|&i| ports::listens_on(local.ip(), bind.afonly, addrs[i]))
                .collect(),
        };
        let mut reg = self.0.chan.reg();
        for index in chosen {
            let r = self.0.chan.context(index).and_then(|ctx| {
                ctx.cm_listen_on(sid, &self.0.chan.shared.ch)?;
                Ok(ctx)
            });
            let ctx = match r {
                Ok(ctx) => ctx,
                Err(e) => {
                    for l in st.listening.drain(..) {
                        l.ctx.cm_unlisten(l.sid);
                        reg.listens.remove(&(l.ctx.key(), l.sid));
                    }
                    return Err(e);
                }
            };
            reg.listens.insert((ctx.key(), sid), Arc::downgrade(&self.0));
            st.listening.push(Listen { index, ctx, sid });
        }
        if st.listening.is_empty() {
            return Err(Error::NoDevice(format!("no uroce device listens on {local}")));
        }
        Ok(())
    }

    /// Creates the id's QP on its device (`rdma_create_qp`): `attr`'s type
    /// must be RC for a connection's id and UD for a UDP one. An RC QP is
    /// moved to INIT, a UD QP to RTS with the port space's Q_Key; the
    /// library moves it from there.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (no device yet, a QP already, the wrong
    /// type, a PD of another device), or creating or moving the QP.
    pub fn create_qp(&self, pd: &Pd, attr: &QpInitAttr<'_>) -> Result<Arc<Qp>> {
        let mut st = self.lock();
        let Some((_, ctx)) = &st.dev else {
            return Err(Error::InvalidArgument("resolve or bind the id to a device first"));
        };
        if st.qp.is_some() {
            return Err(Error::InvalidArgument("the id has a QP already"));
        }
        if !pd.on(ctx) {
            return Err(Error::InvalidArgument("the PD is on another device"));
        }
        let want = if self.0.ps == PortSpace::Udp { QpType::Ud } else { QpType::Rc };
        if attr.qp_type != want {
            return Err(Error::InvalidArgument("the QP type does not fit the port space"));
        }
        let qp = Arc::new(pd.create_qp(attr)?);
        if want == QpType::Ud {
            crate::activate_ud(&qp, UDP_QKEY, psn_for(qp.qpn()))?;
        } else {
            let (a, mask) = init_attr(self.0.ps);
            qp.modify(&a, mask)?;
        }
        st.qp = Some(qp.clone());
        Ok(qp)
    }

    /// Forgets the id's QP (`rdma_destroy_qp`); it is destroyed when the
    /// caller's handles go too.
    pub fn destroy_qp(&self) {
        let mut st = self.lock();
        let groups = std::mem::take(&mut st.groups);
        for g in &groups {
            st.detach(g);
        }
        st.groups = groups.into_iter().map(|g| Group { attached: false, ..g }).collect();
        st.qp = None;
    }

    /// The attributes that move a QP of this id to `state`
    /// (`rdma_init_qp_attr`): INIT from the port space, RTR and RTS from
    /// the peer's request or reply.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another state, or RTR/RTS before
    /// the peer's numbers are known.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, AttrMask)> {
        let st = self.lock();
        match state {
            QpState::Init => Ok(init_attr(self.0.ps)),
            QpState::ReadyToReceive | QpState::ReadyToSend if self.0.ps == PortSpace::Udp => {
                let a = QpAttr { state, sq_psn: Psn::new(st.my_psn), ..QpAttr::default() };
                let extra =
                    if state == QpState::ReadyToSend { AttrMask::SQ_PSN } else { AttrMask::NONE };
                Ok((a, AttrMask::STATE | extra))
            }
            QpState::ReadyToReceive | QpState::ReadyToSend => st
                .transition(state)
                .ok_or(Error::InvalidArgument("the peer's numbers are not known yet")),
            _ => Err(Error::InvalidArgument("init_qp_attr answers INIT, RTR and RTS")),
        }
    }

    /// Connects (`rdma_connect`): an RC id sends a REQ with its QP (or
    /// `param.qp_num`) and up to 56 bytes of private data, and reports
    /// `Established` (its QP moved) or `ConnectResponse` (no QP of its
    /// own), `Rejected` or `Unreachable`; a UD id asks the peer which QP
    /// serves the port (SIDR, up to 180 bytes) and reports `Established`
    /// with it in `ud`, or `Unreachable`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`]: the route is not resolved, the private
    /// data is too long, or a connection is already under way.
    pub fn connect(&self, param: &ConnParam, private_data: &[u8]) -> Result<()> {
        let mut st = self.lock();
        let (Some(local), Some(remote), Some((_, ctx))) = (st.local, st.remote, st.dev.clone())
        else {
            return Err(Error::InvalidArgument("resolve the route before connecting"));
        };
        if st.conn.is_some() {
            return Err(Error::InvalidArgument("the id is connecting or connected already"));
        }
        let hdr =
            CmaHeader { version: 0, src_port: local.port(), src: local.ip(), dst: remote.ip() };
        let key = ctx.key();
        let ch = &self.0.chan.shared.ch;
        if self.0.ps == PortSpace::Udp {
            if private_data.len() > 216 - CmaHeader::LEN {
                return Err(Error::InvalidArgument("SIDR private data is at most 180 bytes"));
            }
            let mut pd = [0u8; 216];
            hdr.emit(&mut pd);
            pd[CmaHeader::LEN..][..private_data.len()].copy_from_slice(private_data);
            let sid = rdma_cm_service_id(port_space::UDP, remote.port());
            let used = CmaHeader::LEN + private_data.len();
            // Registered before the answer can be read.
            let mut reg = self.0.chan.reg();
            let cm = ctx.cm_sidr_request(remote.ip(), sid, &pd[..used], ch);
            reg.conns.insert((key, cm), Arc::downgrade(&self.0));
            st.conn = Some(cm);
            return Ok(());
        }
        if private_data.len() > 92 - CmaHeader::LEN {
            return Err(Error::InvalidArgument("REQ private data is at most 56 bytes"));
        }
        let (qpn, srq) =
            st.qp.as_ref().map_or((param.qp_num, param.srq), |q| (q.qpn(), q.uses_srq()));
        st.my_psn = psn_for(qpn);
        let param = param.resolved();
        st.param = param;
        let mut pd = [0u8; 92];
        hdr.emit(&mut pd);
        pd[CmaHeader::LEN..][..private_data.len()].copy_from_slice(private_data);
        let offer = QpOffer {
            qpn,
            starting_psn: st.my_psn,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq,
            ece: Ece::default(),
        };
        let args = super::request_args(
            local.ip(),
            remote.ip(),
            rdma_cm_service_id(self.0.ps.wire(), remote.port()),
            offer,
            super::PathOptions {
                retry_count: param.retry_count.min(7),
                traffic_class: st.opts.tos.unwrap_or(0),
                ack_timeout: st.opts.ack_timeout.unwrap_or(ACK_TIMEOUT),
                response_timeout: CM_RESPONSE_TIMEOUT,
                max_cm_retries: CM_MAX_RETRIES,
            },
            pd,
        );
        let mut reg = self.0.chan.reg();
        let cm = ctx.cm_request(&args, ch);
        reg.conns.insert((key, cm), Arc::downgrade(&self.0));
        st.conn = Some(cm);
        Ok(())
    }

    /// Accepts the request this id was made for (`rdma_accept`): an RC id
    /// moves its QP (if the library made it) to RTR and RTS and replies
    /// with up to 196 bytes of private data, `Established` following the
    /// requester's RTU; a UD id answers the SIDR request with its QP (or
    /// `param.qp_num`) and the port space's Q_Key.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an id that is not a request's, or
    /// a QP transition's error (the request is then refused).
    pub fn accept(&self, param: &ConnParam, private_data: &[u8]) -> Result<()> {
        let mut st = self.lock();
        let (Some(cm), Some((_, ctx))) = (st.conn, st.dev.clone()) else {
            return Err(Error::InvalidArgument("the id has no request to accept"));
        };
        let qpn = st.qp.as_ref().map_or(param.qp_num, |q| q.qpn());
        if self.0.ps == PortSpace::Udp {
            if private_data.len() > 136 {
                return Err(Error::InvalidArgument("SIDR reply private data is at most 136 bytes"));
            }
            let r = ctx.cm_sidr_reply(cm, 0, qpn, UDP_QKEY, private_data);
            self.0.chan.reg().conns.remove(&(ctx.key(), cm));
            st.conn = None;
            return r;
        }
        if private_data.len() > 196 {
            return Err(Error::InvalidArgument("REP private data is at most 196 bytes"));
        }
        let Some(peer) = st.peer else {
            return Err(Error::InvalidArgument("the id has no request to accept"));
        };
        st.param = param.resolved();
        if let Some(qp) = st.qp.clone()
            && let Err(e) = st.move_qp(&qp)
        {
            let _ = ctx.cm_reject(cm, &[]);
            return Err(e);
        }
        let srq = st.qp.as_ref().map_or(param.srq, |q| q.uses_srq());
        let offer = QpOffer {
            qpn,
            starting_psn: st.my_psn,
            responder_resources: st.param.responder_resources.min(peer.initiator_depth),
            initiator_depth: st.param.initiator_depth.min(peer.responder_resources),
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq,
            ece: Ece::default(),
        };
        ctx.cm_accept(cm, &offer, private_data)
    }

    /// Refuses the request this id was made for (`rdma_reject`): a REJ
    /// with the consumer's reason (28) and up to 148 bytes of private
    /// data, or for a UD id a SIDR reply saying "rejected".
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an id with no request to refuse.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let st = self.lock();
        let (Some(cm), Some((_, ctx))) = (st.conn, st.dev.clone()) else {
            return Err(Error::InvalidArgument("the id has no request to reject"));
        };
        if private_data.len() > 148 {
            return Err(Error::InvalidArgument("REJ private data is at most 148 bytes"));
        }
        let r = if self.0.ps == PortSpace::Udp {
            ctx.cm_sidr_reply(cm, 2, 0, 0, private_data)
        } else {
            ctx.cm_reject(cm, private_data)
        };
        if r.is_ok() {
            self.0.chan.reg().conns.remove(&(ctx.key(), cm));
        }
        r
    }

    /// Sends the RTU after a `ConnectResponse` (`rdma_establish`), the
    /// application's QP in RTS.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when no reply waits for it.
    pub fn establish(&self) -> Result<()> {
        let st = self.lock();
        let (Some(cm), Some((_, ctx))) = (st.conn, st.dev.clone()) else {
            return Err(Error::InvalidArgument("the id is not connecting"));
        };
        ctx.cm_establish(cm)
    }

    /// Disconnects (`rdma_disconnect`): the id's QP to the error state
    /// (its work flushed) and a DREQ; `Disconnected` follows. Nothing is
    /// sent when the peer disconnected first.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an id never connected.
    pub fn disconnect(&self) -> Result<()> {
        let st = self.lock();
        let (Some(cm), Some((_, ctx)), true) = (st.conn, st.dev.clone(), st.connected) else {
            return Err(Error::InvalidArgument("the id is not connected"));
        };
        if let Some(qp) = &st.qp {
            let a = QpAttr { state: QpState::Error, ..QpAttr::default() };
            qp.modify(&a, AttrMask::STATE)?;
        }
        let _ = ctx.cm_disconnect(cm);
        Ok(())
    }

    /// Joins multicast group `group` (`rdma_join_multicast`, or `_ex`
    /// send-only): as the kernel's CM on RoCE, the group's GID is its
    /// address and the join completes at once; `MulticastJoin` carries
    /// the address vector to the group, and the id's QP (unless
    /// `send_only`) is attached when that event is read.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`]: not a multicast address, not a UD id,
    /// no device yet, or another family than the id's;
    /// [`Error::InUse`] for a group joined already.
    pub fn join_multicast(&self, group: IpAddr, send_only: bool) -> Result<()> {
        let mut st = self.lock();
        if !group.is_multicast() || self.0.ps != PortSpace::Udp {
            return Err(Error::InvalidArgument("a UD id joins a multicast address"));
        }
        let Some(local) = st.local.filter(|_| st.dev.is_some()) else {
            return Err(Error::InvalidArgument("bind the id to a device first"));
        };
        if local.is_ipv4() != group.is_ipv4() {
            return Err(Error::InvalidArgument("the group is of another family"));
        }
        if st.groups.iter().any(|g| g.ip == group) {
            return Err(Error::InUse("the group is joined already"));
        }
        st.groups.push(Group { ip: group, send_only, attached: false });
        drop(st);
        self.0.chan.raise(self, EventType::MulticastJoin, 0, Some(group));
        Ok(())
    }

    /// Leaves `group` (`rdma_leave_multicast`), detaching the QP the join
    /// attached.
    ///
    /// # Errors
    /// [`Error::AddrNotAvailable`] for a group not joined.
    pub fn leave_multicast(&self, group: IpAddr) -> Result<()> {
        let mut st = self.lock();
        let Some(i) = st.groups.iter().position(|g| g.ip == group) else {
            return Err(Error::AddrNotAvailable("the group is not joined"));
        };
        let g = st.groups.remove(i);
        st.detach(&g);
        Ok(())
    }

    /// The `MulticastJoin` event for `group`, the QP attached
    /// (`MulticastError` if that fails); `None` if the group was left.
    fn join_event(&self, group: IpAddr) -> Option<Event> {
        let mut st = self.lock();
        let ctx = st.dev.as_ref()?.1.clone();
        let qp = st.qp.clone();
        let g = st.groups.iter_mut().find(|g| g.ip == group)?;
        let mut kind = EventType::MulticastJoin;
        let mut status = 0;
        if let Some(qp) = qp.filter(|_| !g.send_only) {
            match qp.attach_mcast(group) {
                Ok(()) => g.attached = true,
                Err(e) => {
                    kind = EventType::MulticastError;
                    status = -e.errno();
                }
            }
        }
        let tos = st.opts.tos;
        drop(st);
        let mut ev = Event::new(self.clone(), kind, status);
        let mut ah = self.ah_toward(&ctx, group);
        ah.traffic_class = tos.unwrap_or(0);
        ev.ud = Some(UdParam { ah, qp_num: MULTICAST_QPN, qkey: UDP_QKEY });
        Some(ev)
    }

    /// The address vector from the id's local address to `peer`.
    fn ah_toward(&self, ctx: &Context, peer: IpAddr) -> AhAttr {
        let st = self.lock();
        let local = st.local.map_or(ctx.device().socket_addr().ip(), |l| l.ip());
        AhAttr {
            port: ctx.device().socket_addr().port(),
            sgid_index: ctx.gid_index_of(local).map_or(0, |i| i as u8),
            traffic_class: st.opts.tos.unwrap_or(0),
            ..AhAttr::new(peer)
        }
    }

    /// The event for one of the id's connection's.
    fn conn_event(&self, key: u64, event: AgentEvent) -> Option<Event> {
        let mut st = self.lock();
        let ctx = st.dev.as_ref()?.1.clone();
        let me = self.clone();
        let ev = match event {
            AgentEvent::ConnectReply { id: cm, rep, .. } => {
                let remote = st.remote?.ip();
                st.peer = Some(Peer {
                    qpn: rep.local_qpn,
                    psn: rep.starting_psn,
                    responder_resources: rep.responder_resources,
                    initiator_depth: rep.initiator_depth,
                    rnr_retry: rep.rnr_retry_count,
                    retry: None,
                    path_mtu: if remote.is_loopback() { 5 } else { 3 },
                });
                st.connected = true;
                let (kind, status) = match st.qp.clone() {
                    None => (EventType::ConnectResponse, 0),
                    Some(qp) => match st.move_qp(&qp).and_then(|()| ctx.cm_establish(cm)) {
                        Ok(()) => (EventType::Established, 0),
                        Err(e) => {
                            let _ = ctx.cm_reject(cm, &[]);
                            (EventType::ConnectError, -e.errno())
                        }
                    },
                };
                let mut ev = Event::new(me, kind, status);
                ev.param = peer_param(
                    rep.initiator_depth,
                    rep.responder_resources,
                    rep.rnr_retry_count,
                    0,
                    rep.srq,
                    rep.local_qpn,
                );
                ev.private_data = rep.private_data.to_vec();
                ev
            }
            AgentEvent::Established { .. } => {
                st.connected = true;
                Event::new(me, EventType::Established, 0)
            }
            AgentEvent::Rejected { id: cm, reason, private_data } => {
                self.0.chan.reg().conns.remove(&(key, cm));
                let mut ev = Event::new(me, EventType::Rejected, i32::from(reason));
                ev.private_data = private_data.to_vec();
                ev
            }
            AgentEvent::SidrReply { id: cm, rep } => {
                st.conn = None;
                self.0.chan.reg().conns.remove(&(key, cm));
                if rep.status != 0 {
                    return Some(Event::new(me, EventType::Unreachable, i32::from(rep.status)));
                }
                let remote = st.remote?.ip();
                drop(st);
                let mut ev = Event::new(me, EventType::Established, 0);
                ev.ud = Some(UdParam {
                    ah: self.ah_toward(&ctx, remote),
                    qp_num: rep.qpn,
                    qkey: rep.qkey,
                });
                ev.private_data = rep.private_data.to_vec();
                ev
            }
            AgentEvent::Unreachable { id: cm } => {
                self.0.chan.reg().conns.remove(&(key, cm));
                Event::new(me, EventType::Unreachable, -libc::ETIMEDOUT)
            }
            AgentEvent::DisconnectRequest { .. } | AgentEvent::Disconnected { .. } => {
                Event::new(me, EventType::Disconnected, 0)
            }
            AgentEvent::TimeWaitExit { id: cm } => {
                // The CM forgets the connection; the id stays as it is.
                self.0.chan.reg().conns.remove(&(key, cm));
                Event::new(me, EventType::TimewaitExit, 0)
            }
            AgentEvent::ConnectRequest { .. } | AgentEvent::SidrRequest { .. } => return None,
        };
        Some(ev)
    }
}

/// The attributes that move a QP of port space `ps` to INIT.
fn init_attr(ps: PortSpace) -> (QpAttr, AttrMask) {
    let mut a = QpAttr { state: QpState::Init, port: 1, ..QpAttr::default() };
    let base = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
    if ps == PortSpace::Udp {
        a.qkey = UDP_QKEY;
        (a, base | AttrMask::QKEY)
    } else {
        a.access = RC_ACCESS;
        (a, base | AttrMask::ACCESS_FLAGS)
    }
}

impl IdState {
    /// The attributes that move an RC QP to RTR or RTS with the peer's
    /// numbers; `None` before they are known.
    fn transition(&self, to: QpState) -> Option<(QpAttr, AttrMask)> {
        let (local, remote, peer) = (self.local?, self.remote?, self.peer?);
        let ctx = &self.dev.as_ref()?.1;
        let mut a = QpAttr { state: to, ..QpAttr::default() };
        if to == QpState::ReadyToReceive {
            a.path = Some(Path {
                dst: remote.ip(),
                dst_port: ctx.device().socket_addr().port(),
                sgid_index: ctx.gid_index_of(local.ip()).map_or(0, |i| i as u8),
                flow_label: 0,
                hop_limit: 64,
                traffic_class: self.opts.tos.unwrap_or(0),
            });
            a.path_mtu = Mtu::from_ibv(u32::from(peer.path_mtu)).unwrap_or(Mtu::Mtu1024);
            a.dest_qpn = peer.qpn;
            a.rq_psn = Psn::new(peer.psn);
            a.max_dest_rd_atomic = self.param.responder_resources.min(peer.initiator_depth).max(1);
            a.min_rnr_timer = crate::RnrTimer::from_code(12);
            let mask = AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER;
            Some((a, mask))
        } else {
            a.sq_psn = Psn::new(self.my_psn);
            a.timeout =
                crate::LocalAckTimeout::saturating(self.opts.ack_timeout.unwrap_or(ACK_TIMEOUT));
            a.retry_cnt = peer.retry.unwrap_or(self.param.retry_count).min(7);
            a.rnr_retry = peer.rnr_retry.min(7);
            a.max_rd_atomic = self.param.initiator_depth.min(peer.responder_resources).max(1);
            let mask = AttrMask::STATE
                | AttrMask::SQ_PSN
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC;
            Some((a, mask))
        }
    }

    /// Moves the id's QP to RTR, then RTS.
    fn move_qp(&self, qp: &Qp) -> Result<()> {
        for to in [QpState::ReadyToReceive, QpState::ReadyToSend] {
            let (a, mask) =
                self.transition(to).ok_or(Error::InvalidArgument("the peer is not known"))?;
            qp.modify(&a, mask)?;
        }
        Ok(())
    }

    /// Detaches the QP a join attached.
    fn detach(&self, g: &Group) {
        if g.attached
            && let Some(qp) = &self.qp
        {
            let _ = qp.detach_mcast(g.ip);
        }
    }
}

impl Drop for IdInner {
    fn drop(&mut self) {
        let st = self.st.get_mut().unwrap_or_else(|e| e.into_inner());
        let mut reg = self.chan.reg();
        // Only a connection the agent still knows (its events still
        // registered) is ended and detached.
        let known = |ctx: &Context, cm: u32| reg.conns.contains_key(&(ctx.key(), cm));
        if let (Some(cm), Some((_, ctx))) = (st.conn.take(), &st.dev)
            && known(ctx, cm)
        {
            // Connected: a DREQ; a request not yet answered: a REJ (as
            // rdma-core's destroy does), so the peer is not left waiting.
            if ctx.cm_disconnect(cm).is_err() && ctx.cm_reject(cm, &[]).is_err() {
                let _ = ctx.cm_sidr_reply(cm, 2, 0, 0, &[]);
            }
            ctx.cm_route(cm, None);
            reg.conns.remove(&(ctx.key(), cm));
        }
        for l in st.listening.drain(..) {
            l.ctx.cm_unlisten(l.sid);
            reg.listens.remove(&(l.ctx.key(), l.sid));
        }
        drop(reg);
        for g in std::mem::take(&mut st.groups) {
            st.detach(&g);
        }
        ports::port_table().release(std::ptr::from_mut(self) as usize);
    }
}
