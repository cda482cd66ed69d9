//! The driver of one context: the clock, the backend, the ICRC (computed
//! on send, checked on receive with IPv4-ID recovery), GSO runs, the GID
//! table and the port's state, around the sans-IO [`Endpoint`] that holds
//! the protocol state (QPs, CQs, SRQs, demux, events). Everything here runs
//! under the context's lock.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant as StdInstant;
use uroce_transport::fastmap::FastMap;

use uroce_transport::cm::{CmAgent, CmEvent};
use uroce_transport::{Endpoint, Instant, Stats};
use uroce_wire::icrc::{self, ipv4_id::IdSolver};
use uroce_wire::udp::{LinuxIpHeader, UdpRepr};
use uroce_wire::{RocePacket, WireError};

use crate::backend::Backend;
use crate::channel::EventQueue;
use crate::gid::GidTable;
use crate::mr::MemTable;

/// An asynchronous event (`ibv_async_event`).
pub use uroce_transport::DeviceEvent as AsyncEvent;

/// How a peer fills its IPv4 identification field, learned from its first
/// valid packet: ID 0 (uroce, or any DF sender on an unconnected socket), or
/// a counter (Linux rxe) whose last value we track.
#[derive(Debug, Clone, Copy)]
enum PeerIds {
    Zero,
    Counter(u16),
}

/// What the driver knows of a received packet's IPv4 identification.
#[derive(Debug, Clone, Copy)]
enum IpId {
    /// The backend saw it in the header.
    Seen(u16),
    /// Unknown (a UDP socket's datagram); the packet's index in its GRO
    /// run, which is the ID a uroce sender's GSO gave it.
    Index(u16),
    /// No IP header at all: the packet came through memory (the local
    /// path), without an ICRC to check.
    Local,
}

/// The IP IDs a uroce peer's GSO run gives its segments: 0 to the
/// longest run less one (the `udp` backend's 64 segments per send).
const GSO_RUN_IDS: usize = 64;

/// How far ahead of the newest seen ID a counting peer's next ID may be.
const ID_AHEAD: i16 = 4096;
/// How far behind it (reordering).
const ID_BEHIND: i16 = 1024;

pub(crate) struct Driver {
    /// The protocol state.
    pub(crate) ep: Endpoint,
    pub(crate) mem: MemTable,
    /// Completion channels, by CQ handle.
    pub(crate) channels: FastMap<u32, Arc<EventQueue<u32>>>,
    /// Whether the port is active, and when it was last checked.
    pub(crate) port_up: bool,
    port_checked: Option<Instant>,
    /// The fingerprint (count, hash) of the CM connections last
    /// published (`publish_connections`).
    conns_published: (u64, u64),
    backend: Box<dyn Backend>,
    origin: StdInstant,
    pub(crate) next_pd: u32,
    buf: Vec<u8>,
    txbuf: Vec<u8>,
    solvers: FastMap<usize, IdSolver>,
    /// Asynchronous events not yet read.
    pub(crate) events: Arc<EventQueue<AsyncEvent>>,
    /// Where async events go before `events` (a C library's contexts).
    pub(crate) router: Option<Arc<dyn crate::channel::AsyncEventRouter>>,
    peers: FastMap<IpAddr, PeerIds>,
    /// Port 1's GID table (the local addresses QPs may send from).
    gids: GidTable,
    /// Posts queued without a transmit pass since the last one (see
    /// `Inner::doorbell`).
    pub(crate) deferred_posts: u32,
    /// The context's QPs with staged posts (see `staging`), and an empty
    /// list to swap with it.
    pub(crate) staged: Arc<crate::staging::StagedList>,
    staged_spare: Vec<crate::staging::Staged>,
    /// Destinations the backend reported unreachable (reused buffer).
    gone: Vec<SocketAddr>,
    /// The connection manager on QP1, once the application uses it.
    pub(crate) cm: Option<CmDriver>,
    /// A tag unique to this driver in the process (`Context::key`).
    pub(crate) key: u64,
    /// Raw packet QPs, their flow rules and their packet socket.
    pub(crate) raw: crate::raw::RawQps,
    /// XRC target QPs opened across processes (`xrc_open`).
    pub(crate) opens: crate::xrc_open::Opens,
}

/// Raw QPs' completions onto the endpoint's CQs, at `now`.
pub(crate) struct CqsAt<'a> {
    pub(crate) ep: &'a mut Endpoint,
    pub(crate) now: Instant,
}

impl crate::raw::CqSink for CqsAt<'_> {
    fn complete(&mut self, cq: u32, c: uroce_transport::Completion) {
        self.ep.complete(cq, c, self.now);
    }
}

/// The context's connection manager: the protocol agent, and the events
/// it raised that no caller has taken yet.
pub(crate) struct CmDriver {
    pub(crate) agent: CmAgent,
    pub(crate) events: std::collections::VecDeque<CmEvent>,
    /// Event channels by connection ID (`uroce::cm::CmChannel`): events
    /// of a routed connection go there instead of `events`.
    pub(crate) routes: FastMap<u32, CmRoute>,
    /// Event channels by listened service ID: its requests go there, and
    /// the new connection is routed to the same channel.
    pub(crate) listeners: FastMap<u64, CmRoute>,
    /// This context's tag on routed events (`Context::key`).
    pub(crate) key: u64,
    /// Connections whose owner is gone (`Context::cm_route(id, None)`):
    /// their remaining events are dropped, a late reply refused.
    pub(crate) detached: FastMap<u32, ()>,
}

/// Where a routed connection's events go.
pub(crate) type CmRoute = Arc<crate::channel::LevelQueue<CmChannelEvent>>;

/// An event on a CM event channel.
#[derive(Debug)]
pub enum CmChannelEvent {
    /// A connection manager event of the context tagged `ctx`.
    Cm {
        /// `Context::key` of the context it happened on.
        ctx: u64,
        /// The event.
        event: CmEvent,
    },
    /// An event the channel's owner queued itself (address and route
    /// resolution, which complete at once).
    User(u64),
}

impl Driver {
    /// `origin`: the context's clock (shared with its `Activity`, so that
    /// one clock read serves both on the post and poll paths).
    pub(crate) fn new(
        backend: Box<dyn Backend>,
        events: Arc<EventQueue<AsyncEvent>>,
        origin: StdInstant,
    ) -> Self {
        let primary = backend.local().ip();
        let gids = GidTable::for_device(primary, backend.on_host());
        let mut ep = Endpoint::new();
        let (base, start) = backend.qpn_range();
        ep.set_qpn_range(base, 1 << crate::backend::QPN_RANGE_BITS, start);
        ep.set_local_port(backend.local().port());
        ep.set_relay_secret(backend.relay_secret());
        Self {
            ep,
            mem: MemTable::default(),
            channels: FastMap::default(),
            port_up: true,
            port_checked: None,
            conns_published: (0, 0),
            backend,
            origin,
            next_pd: 1,
            buf: vec![0; 65536],
            txbuf: vec![0; 65536 + 8192],
            solvers: FastMap::default(),
            events,
            router: None,
            peers: FastMap::default(),
            gids,
            deferred_posts: 0,
            staged: Arc::default(),
            staged_spare: Vec::new(),
            gone: Vec::new(),
            cm: None,
            key: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
            raw: crate::raw::RawQps::default(),
            opens: crate::xrc_open::Opens::default(),
        }
    }

    /// Receives raw packet QPs' frames; whether any came.
    fn receive_raw(&mut self, now: Instant) -> bool {
        let mut cqs = CqsAt { ep: &mut self.ep, now };
        self.raw.poll(64, &self.mem, &mut cqs)
    }

    /// The descriptors the progress thread sleeps on: the backend's and
    /// the raw QPs' packet socket.
    pub(crate) fn sleep_fds(&self) -> Vec<i32> {
        let mut fds = self.backend.raw_fds();
        fds.extend(self.raw.raw_fd());
        fds
    }

    /// Starts the connection manager (idempotent): QP1's datagrams go to
    /// it from now on.
    pub(crate) fn cm(&mut self) -> &mut CmDriver {
        if self.cm.is_none() {
            self.ep.enable_gsi(256);
            let guid = crate::device::guid_of(self.backend.local().ip());
            let seed = self.origin.elapsed().as_nanos() as u64 ^ u64::from(std::process::id());
            let mut agent = CmAgent::new(guid, seed);
            if let Some((prefix, bits)) = self.backend.cm_id_prefix() {
                agent.set_id_prefix(prefix, bits);
            }
            self.cm = Some(CmDriver {
                agent,
                events: std::collections::VecDeque::new(),
                routes: FastMap::default(),
                listeners: FastMap::default(),
                key: self.key,
                detached: FastMap::default(),
            });
        }
        self.cm.as_mut().expect("just set")
    }

    /// Tells the backend which ports the CM listens on (after a listen or
    /// an unlisten), so that a shared address steers their requests here.
    /// `false` when another context on the address listens on one of them.
    pub(crate) fn cm_listens_changed(&mut self) -> bool {
        let ports: Vec<u16> = self
            .cm
            .as_ref()
            .map(|cm| cm.agent.listened().iter().map(|&s| s as u16).collect())
            .unwrap_or_default();
        self.backend.set_listening(&ports)
    }

    /// Starts listening on `service_id`, unless this context or another
    /// one sharing the address already does.
    pub(crate) fn cm_listen(&mut self, service_id: u64) -> crate::Result<()> {
        let in_use = || crate::Error::InUse("the port is already listened on");
        self.cm().agent.listen(service_id).map_err(|_| in_use())?;
        if !self.cm_listens_changed() {
            self.cm().agent.unlisten(service_id);
            return Err(in_use());
        }
        Ok(())
    }

    /// Feeds QP1's datagrams to the CM, runs its timers, and queues what
    /// it sends on QP1.
    fn drive_cm(&mut self, now: Instant) -> bool {
        let Some(cm) = self.cm.as_mut() else { return false };
        let mut work = false;
        while let Some(d) = self.ep.poll_gsi() {
            work = true;
            let Ok(pkt) = RocePacket::new_checked(&d.bytes[..]) else { continue };
            if let Ok(mad) = uroce_wire::cm::CmMad::parse(pkt.payload()) {
                cm.agent.handle(now, d.from, &mad);
            }
        }
        if cm.agent.poll_timeout().is_some_and(|t| t <= now) {
            if cm.agent.orphan_due(now) {
                cm.agent.set_listened_elsewhere(&self.backend.listened_elsewhere());
            }
            cm.agent.handle_timeout(now);
            work = true;
        }
        while let Some(e) = cm.agent.poll_event() {
            work = true;
            // The end of TimeWait goes to the connection's channel
            // (librdmacm's RDMA_CM_EVENT_TIMEWAIT_EXIT) and ends its
            // route; a connection without one (the listener/connect calls)
            // has nobody to tell, and its events would pile up.
            if matches!(e, CmEvent::TimeWaitExit { .. }) {
                cm.detached.remove(&e.id());
                if let Some(q) = cm.routes.remove(&e.id()) {
                    q.push(CmChannelEvent::Cm { ctx: cm.key, event: e });
                }
                continue;
            }
            if cm.detached.contains_key(&e.id()) {
                // The ends of a connection the agent forgets at once.
                match e {
                    CmEvent::ConnectReply { id, .. } => {
                        let _ = cm.agent.reject(id, &[]);
                        cm.detached.remove(&id);
                    }
                    CmEvent::Rejected { id, .. }
                    | CmEvent::Unreachable { id }
                    | CmEvent::SidrReply { id, .. } => {
                        cm.detached.remove(&id);
                    }
                    _ => {}
                }
                continue;
            }
            let listened = match &e {
                CmEvent::ConnectRequest { id, req, .. } => Some((*id, req.service_id)),
                CmEvent::SidrRequest { id, req, .. } => Some((*id, req.service_id)),
                _ => None,
            };
            let route = match listened {
                Some((id, service_id)) => {
                    let r = cm.listeners.get(&service_id).cloned();
                    if let Some(r) = &r {
                        cm.routes.insert(id, r.clone());
                    }
                    r
                }
                None => cm.routes.get(&e.id()).cloned(),
            };
            // The agent forgets a connection at these: so does the route.
            if matches!(
                e,
                CmEvent::Rejected { .. } | CmEvent::Unreachable { .. } | CmEvent::SidrReply { .. }
            ) {
                cm.routes.remove(&e.id());
            }
            match route {
                Some(q) => q.push(CmChannelEvent::Cm { ctx: cm.key, event: e }),
                None => cm.events.push_back(e),
            }
        }
        work |= self.queue_cm_mads();
        work
    }

    /// Queues the CM's outgoing MADs on QP1. Whether there were any.
    fn queue_cm_mads(&mut self) -> bool {
        let Some(cm) = self.cm.as_mut() else { return false };
        let mut out = Vec::new();
        while let Some((to, mad)) = cm.agent.poll_transmit() {
            let mut b = [0u8; uroce_wire::cm::MAD_LEN];
            mad.emit(&mut b);
            out.push((to, b));
        }
        // Peers listen on the device's own port (4791 but in tests).
        let port = self.backend.local().port();
        let any = !out.is_empty();
        for (to, b) in out {
            let sgid = self.cm_source_gid(to);
            self.ep.send_gsi(to, port, sgid, &b);
        }
        any
    }

    /// The GID a CM datagram to `to` leaves from: the first of the peer's
    /// family and scope, if it can be bound; else GID 0.
    fn cm_source_gid(&mut self, to: IpAddr) -> u8 {
        let sgid = self.gid_for(to).and_then(|i| u8::try_from(i).ok()).unwrap_or(0);
        if self.source_for(sgid, to).is_ok() { sgid } else { 0 }
    }

    /// At process exit: every CM connection still up is disconnected
    /// (the peer would otherwise wait for a DREQ no one sends).
    pub(crate) fn cm_disconnect_all(&mut self) {
        let now = self.now();
        if let Some(cm) = self.cm.as_mut()
            && cm.agent.disconnect_all(now) > 0
        {
            self.send_cm_now();
        }
    }

    /// Sends what an application call gave the CM to send, now: a DREQ
    /// from a process about to exit must not wait for the next pass.
    pub(crate) fn send_cm_now(&mut self) {
        if self.queue_cm_mads() {
            self.transmit_now();
        }
    }

    /// See [`Backend::prepare_sleep`].
    /// See [`Backend::take_waker_cpu`].
    pub(crate) fn take_waker_cpu(&mut self) -> Option<u64> {
        self.backend.take_waker_cpu()
    }

    pub(crate) fn prepare_sleep(&mut self) -> bool {
        self.backend.prepare_sleep()
    }

    /// Whether packets to `qpn` at `dst` go through memory (see
    /// `Backend::is_local`).
    pub(crate) fn is_local(&mut self, dst: std::net::SocketAddr, qpn: u32) -> bool {
        self.backend.is_local(dst, qpn)
    }

    /// See [`Backend::at_exit`].
    pub(crate) fn at_exit(&mut self) {
        self.backend.at_exit();
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// The clock: real time, or a simulated network's (possibly virtual)
    /// time.
    pub(crate) fn now(&self) -> Instant {
        self.now_at(self.origin.elapsed().as_nanos() as u64)
    }

    /// The protocol's time for `wall_ns` read on the context's clock
    /// (nanoseconds since its origin): the backend's virtual clock if it
    /// has one.
    pub(crate) fn now_at(&self, wall_ns: u64) -> Instant {
        self.backend.clock().unwrap_or_else(|| Instant::from_nanos(wall_ns + 1))
    }

    /// Creates a CQ of `cap` entries, notifying `channel` when armed.
    pub(crate) fn create_cq(&mut self, cap: usize, channel: Option<Arc<EventQueue<u32>>>) -> u32 {
        let id = self.ep.create_cq(cap);
        if let Some(ch) = channel {
            self.channels.insert(id, ch);
        }
        id
    }

    /// Destroys a CQ.
    pub(crate) fn destroy_cq(&mut self, id: u32) {
        self.ep.destroy_cq(id);
        self.channels.remove(&id);
    }

    /// Receives, runs timers, transmits and moves completions. Returns
    /// whether anything happened.
    pub(crate) fn progress(&mut self) -> bool {
        self.progress_at(self.now())
    }

    /// [`Driver::progress`] at a time the caller read.
    pub(crate) fn progress_at(&mut self, now: Instant) -> bool {
        self.housekeeping(now);
        self.backend.tick(now.as_nanos());
        self.end_leftovers();
        let probes = self.ep.stats.rto_probes;
        let received = self.receive(now, 256);
        let mut work = received > 0 || self.receive_raw(now);
        if self.ep.poll_timeout().is_some_and(|t| t <= now) {
            work |= self.ep.handle_timeout(now) > 0;
        }
        if crate::timeline::on() && self.ep.stats.rto_probes != probes {
            crate::timeline::event("probe", self.ep.stats.rto_probes - probes, 0);
        }
        work |= self.drive_cm(now);
        if self.opens.any() {
            let mut opens = std::mem::take(&mut self.opens);
            work |= opens.drive(self);
            self.opens = opens;
        }
        let sent = self.transmit(now);
        work |= sent > 0;
        work |= self.forward_events();
        crate::timeline::event("pass", received as u64, sent as u64);
        work
    }

    /// Sends the work a burst of posts left queued, if any.
    pub(crate) fn flush_posts(&mut self) {
        if self.deferred_posts > 0 {
            self.transmit_now();
        }
    }

    /// Sends what is ready (after a post), without a receive pass.
    pub(crate) fn transmit_now(&mut self) {
        self.transmit_at(self.now());
    }

    /// [`Driver::transmit_now`] at a time the caller read.
    pub(crate) fn transmit_at(&mut self, now: Instant) {
        let sent = self.transmit(now);
        crate::timeline::event("transmit", sent as u64, 0);
        self.forward_events();
    }

    /// Hands the endpoint's events to their descriptors: async events to
    /// the context's queue, CQ notifications to the CQs' channels.
    pub(crate) fn forward_events(&mut self) -> bool {
        while let Some(e) = self.ep.poll_event() {
            if self.opens.any() {
                let opens = std::mem::take(&mut self.opens);
                opens.forward(self, &e);
                self.opens = opens;
            }
            if !self.router.as_ref().is_some_and(|r| r.route(&e)) {
                self.events.push(e);
            }
        }
        while let Some(cq) = self.ep.poll_cq_notify() {
            if let Some(ch) = self.channels.get(&cq) {
                ch.push(cq);
            }
        }
        self.ep.take_moved()
    }

    /// Every 100 ms: looks at the device's interface and republishes the
    /// CM's connections if they changed.
    fn housekeeping(&mut self, now: Instant) {
        const EVERY: u64 = 100_000_000;
        if self.port_checked.is_some_and(|t| now.as_nanos() < t.as_nanos() + EVERY) {
            return;
        }
        self.port_checked = Some(now);
        if self.opens.any() {
            let mut opens = std::mem::take(&mut self.opens);
            opens.check_openers(self);
            self.opens = opens;
        }
        self.publish_connections();
        self.check_port();
    }

    /// Lists the CM's established connections where another context of
    /// the device finds them if this one dies without ending them
    /// (`Leftover`); rewritten only when they changed. A connection made
    /// less than 100 ms before a SIGKILL may be missing.
    fn publish_connections(&mut self) {
        let Some(cm) = self.cm.as_ref() else { return };
        let (mut count, mut sum) = (0u64, 0u64);
        for c in cm.agent.connected() {
            count += 1;
            let key = u64::from(c.local_id) << 32 | u64::from(c.remote_id ^ c.remote_qpn);
            sum = sum.wrapping_add(key.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        let fingerprint = (count, sum);
        if fingerprint == self.conns_published {
            return;
        }
        let conns: Vec<_> = cm.agent.connected().collect();
        if self.backend.publish_connections(&conns) {
            self.conns_published = fingerprint;
        }
    }

    /// Sends the DREQs of connections that dead contexts of the device
    /// left up (their slots taken back by this one, `Leftover`): the
    /// kernel CM sends them when a process's cm_ids die with it. Each goes
    /// twice, since nobody resends it.
    fn end_leftovers(&mut self) {
        let leftovers = self.backend.take_leftovers();
        if leftovers.is_empty() {
            return;
        }
        let port = self.backend.local().port();
        for l in &leftovers {
            let mut b = [0u8; uroce_wire::cm::MAD_LEN];
            l.dreq().emit(&mut b);
            let sgid = self.cm_source_gid(l.peer);
            for _ in 0..2 {
                self.ep.send_gsi(l.peer, port, sgid, &b);
            }
        }
    }

    /// Raises PORT_ERR when the device's interface goes down and
    /// PORT_ACTIVE when it comes back; forgets GIDs whose address went.
    fn check_port(&mut self) {
        if !self.backend.on_host() {
            return;
        }
        let primary = self.backend.local().ip();
        let ifaddrs = crate::netif::all();
        for gone in self.gids.refresh(&crate::netif::siblings_in(&ifaddrs, primary)) {
            self.backend.unbind_local(gone);
        }
        let up = crate::netif::link_up_in(&ifaddrs, primary);
        if up != self.port_up {
            self.port_up = up;
            self.ep.stats.link_downed += u64::from(!up);
            self.ep.push_event(if up { AsyncEvent::PortActive } else { AsyncEvent::PortError });
        }
    }

    /// GID `index` of port 1: `None` for an empty slot or past the end.
    pub(crate) fn gid(&self, index: usize) -> Option<IpAddr> {
        self.gids.get(index)
    }

    /// The GID table's length (`gid_tbl_len`).
    pub(crate) fn gid_len(&self) -> usize {
        self.gids.len()
    }

    /// The GID table's entries.
    pub(crate) fn gid_entries(&self) -> Vec<(u32, IpAddr)> {
        self.gids.entries()
    }

    /// The GID index holding local address `addr`.
    pub(crate) fn gid_index_of(&self, addr: IpAddr) -> Option<usize> {
        self.gids.index_of(addr)
    }

    /// Makes GID `index` usable as a source (binds its address): before a
    /// QP or AH names it, and when a program reads it to tell a peer.
    ///
    /// # Errors
    /// `InvalidInput` for an empty slot; the bind's error otherwise (the
    /// address taken by another device or process).
    pub(crate) fn use_gid(&mut self, index: usize) -> std::io::Result<IpAddr> {
        let ip = self.gids.get(index).ok_or(std::io::ErrorKind::InvalidInput)?;
        self.backend.bind_local(ip)?;
        Ok(ip)
    }

    /// The GID index to reach `peer` from: the first whose address is of
    /// the peer's family and scope (link-local for a link-local peer).
    pub(crate) fn gid_for(&self, peer: IpAddr) -> Option<usize> {
        let ll = crate::gid::is_link_local(peer);
        (0..self.gids.len()).find(|&i| {
            self.gids.get(i).is_some_and(|a| {
                a.is_ipv4() == peer.is_ipv4() && crate::gid::is_link_local(a) == ll
            })
        })
    }

    /// [`Driver::use_gid`] for a path or AH that sends to `dst`: the GID
    /// must hold an address of `dst`'s family.
    pub(crate) fn source_for(&mut self, index: u8, dst: IpAddr) -> crate::Result<IpAddr> {
        // Every check before the bind: a request that fails binds nothing.
        let src = self.gid(usize::from(index)).ok_or(crate::Error::InvalidArgument("GID index"))?;
        if src.is_ipv4() != dst.is_ipv4() {
            return Err(crate::Error::InvalidArgument(
                "destination address family differs from the source GID's",
            ));
        }
        self.use_gid(usize::from(index)).map_err(crate::Error::Io)
    }

    /// The earliest QP deadline.
    pub(crate) fn next_deadline(&mut self) -> Option<Instant> {
        let cm = self.cm.as_ref().and_then(|c| c.agent.poll_timeout());
        [self.ep.poll_timeout(), cm].into_iter().flatten().min()
    }

    /// Moves the WRs posted meanwhile by other threads into their QPs
    /// (see `staging`); they count as posts waiting for a transmit.
    pub(crate) fn take_staged(&mut self, now: Instant) {
        self.deferred_posts += self.staged.take(&mut self.staged_spare, &mut self.ep, now);
    }

    fn receive(&mut self, now: Instant, budget: usize) -> usize {
        let mut n = 0;
        let mut buf = std::mem::take(&mut self.buf);
        while n < budget {
            if let Ok(Some(r)) = self.backend.recv(&mut buf) {
                // A receive posted before the peer sent this is there for
                // it (see `staging`).
                self.take_staged(now);
                // With GRO, one read holds a run of packets of `seg` bytes
                // (the last possibly shorter), the i-th sent with IP ID i.
                for (i, pkt) in buf[..r.len].chunks(r.seg.max(1)).enumerate() {
                    n += 1;
                    let id = match (r.local, r.ip_id) {
                        (true, _) => IpId::Local,
                        (false, Some(id)) => IpId::Seen(id),
                        (false, None) => IpId::Index(i as u16),
                    };
                    self.deliver(now, r.from, r.to, pkt, id);
                }
            } else if let Some((len, from, group)) = self.backend.recv_group(&mut buf) {
                self.take_staged(now);
                n += 1;
                self.deliver(now, from, group, &buf[..len], IpId::Index(0));
            } else {
                break;
            }
        }
        self.buf = buf;
        // Peers whose port is closed (their process is gone): the CM's
        // requests to them end now (`CmAgent::peer_gone`). Read even
        // without a CM: a pending error would keep the sockets readable.
        self.backend.unreachable(&mut self.gone);
        if !self.gone.is_empty() {
            let port = self.backend.local().port();
            if let Some(cm) = self.cm.as_mut() {
                for a in self.gone.iter().filter(|a| a.port() == port) {
                    cm.agent.peer_gone(now, a.ip());
                    n += 1;
                }
            }
            self.gone.clear();
        }
        n
    }

    fn deliver(&mut self, now: Instant, from: SocketAddr, to: IpAddr, bytes: &[u8], id: IpId) {
        let pkt = match RocePacket::new_checked(bytes) {
            Ok(p) => p,
            Err(_) => {
                self.ep.stats.drop_malformed += 1;
                return;
            }
        };
        if self.icrc_ok(from, to, &pkt, id).is_err() {
            self.ep.stats.icrc_errors += 1;
            return;
        }
        self.ep.handle_datagram(now, from.ip(), to, &pkt, &self.mem);
    }

    /// Attaches a UD QP to a multicast group, joining it on first use.
    pub(crate) fn attach(&mut self, qpn: u32, group: IpAddr) -> std::io::Result<()> {
        if self.ep.mcast_counts(group).1 == 0 {
            self.backend.join(group)?;
        }
        self.ep.attach(qpn, group);
        Ok(())
    }

    /// Detaches a QP; the group is left when its last QP goes.
    pub(crate) fn detach(&mut self, qpn: u32, group: IpAddr) -> bool {
        let (found, empty) = self.ep.detach(qpn, group);
        if empty {
            self.backend.leave(group);
        }
        found
    }

    /// Destroys a QP: its multicast groups left empty are left, its
    /// counters join the device's.
    /// Sends the ACKs that QP `qpn` (every QP, with `None`) holds for the
    /// application's reply, before the QP changes state, is destroyed or
    /// the process exits (see `Qp::release_held_ack`).
    pub(crate) fn send_held_acks(&mut self, qpn: Option<u32>) {
        let mut any = false;
        match qpn {
            Some(q) => any = self.ep.qp_mut(q).is_some_and(|qp| qp.release_held_ack()),
            None => {
                let held: Vec<u32> =
                    self.ep.qps().filter(|q| q.holds_ack()).map(|q| q.qpn()).collect();
                for q in held {
                    any |= self.ep.qp_mut(q).is_some_and(|qp| qp.release_held_ack());
                }
            }
        }
        if any {
            self.transmit_now();
        }
    }

    /// Modifies QP `qpn` (not a raw packet QP): `ibv_modify_qp`, from a
    /// handle here or an opener's in another process.
    pub(crate) fn modify_qp(
        &mut self,
        qpn: u32,
        attr: &uroce_transport::QpAttr,
        mask: uroce_transport::AttrMask,
    ) -> crate::Result<()> {
        use uroce_transport::{AttrMask, QpState};
        if mask.contains(AttrMask::AV)
            && let Some(p) = attr.path
        {
            self.source_for(p.sgid_index, p.dst)?;
        }
        // An ACK held for a reply leaves before the QP changes (a move to
        // ERR or RESET would drop it).
        self.send_held_acks(Some(qpn));
        let now = self.now();
        let qp = self.ep.qp_mut(qpn).ok_or(crate::Error::InvalidArgument("QP destroyed"))?;
        let was = qp.attr().state;
        qp.modify(now, attr, mask)?;
        let a = qp.attr();
        if a.state == QpState::Reset && was != a.state {
            self.ep.purge_completions(qpn);
        }
        if matches!(a.state, QpState::Reset | QpState::Error) && was != a.state {
            // An XRC target's requests out to other processes end with it.
            self.ep.xrc_target_reset(qpn);
        }
        if matches!(a.state, QpState::ReadyToReceive | QpState::ReadyToSend)
            && let Some(p) = a.path
        {
            // Through memory nothing is lost: a late ACK is a late peer.
            let to = std::net::SocketAddr::new(p.dst, p.dst_port);
            let lossless = self.is_local(to, a.dest_qpn);
            if let Some(qp) = self.ep.qp_mut(qpn) {
                qp.set_lossless_path(lossless);
            }
        }
        Ok(())
    }

    /// Lists target QP `qpn` of a shared domain for other processes to
    /// open (`xrc_open`).
    pub(crate) fn share_target(
        &mut self,
        at: (u32, u32),
        listing: Arc<dyn uroce_transport::SharedSrq>,
        domain: Arc<crate::xrc_share::Domain>,
    ) {
        self.opens.share_target(&mut self.ep, at, listing, domain);
    }

    /// The last handle of this process to target QP `qpn` went: it is
    /// destroyed, unless other processes' handles hold it.
    pub(crate) fn target_dropped(&mut self, qpn: u32) {
        if self.opens.target_dropped(&mut self.ep, qpn) {
            self.destroy_qp(qpn);
        }
    }

    /// As an opener: sends a request to another process's target QP
    /// (`xrc_open`); returns its ID.
    pub(crate) fn control_request(
        &mut self,
        at: (u32, u32),
        id: u32,
        op: crate::xrc_open::Op,
        (word, attr): (u32, Option<uroce_transport::QpAttr>),
    ) -> u32 {
        let mut opens = std::mem::take(&mut self.opens);
        let id = opens.request(self, at, id, (op, word, attr));
        self.opens = opens;
        self.transmit_now();
        id
    }

    /// As an opener: the answer to request `id`, once in.
    pub(crate) fn take_reply(&mut self, id: u32) -> Option<crate::xrc_open::Message> {
        self.opens.take_reply(id)
    }

    /// As an opener: request `id` is given up (an answer coming later is
    /// dropped).
    pub(crate) fn forget_request(&mut self, id: u32) {
        self.opens.forget_request(id);
    }

    /// As an opener: a proxy's handle went; its number is free again.
    pub(crate) fn close_proxy(&mut self, target: u32, proxy: u32) {
        let mut opens = std::mem::take(&mut self.opens);
        opens.close(self, target, proxy);
        self.opens = opens;
        self.transmit_now();
        self.ep.release_qpn(proxy);
    }

    /// Destroys a QP. Work it was posted and that a burst left queued
    /// leaves first: a post is a doorbell, and a program that posts
    /// unsignaled UD sends and then destroys the QP (mckey's sender)
    /// expects them on the wire, as a NIC would have put them.
    pub(crate) fn destroy_qp(&mut self, qpn: u32) {
        self.flush_posts();
        self.send_held_acks(Some(qpn));
        if let Some((_, groups)) = self.ep.remove_qp(qpn) {
            for g in groups {
                self.backend.leave(g);
            }
        }
    }

    /// The IP and UDP headers the sender's kernel put around a datagram we
    /// received, as far as the ICRC covers them.
    fn rx_headers(
        &self,
        from: SocketAddr,
        to: IpAddr,
        len: usize,
        ident: u16,
    ) -> (LinuxIpHeader, [u8; 8]) {
        let local = self.backend.local();
        let udp = UdpRepr {
            src_port: from.port(),
            dst_port: local.port(),
            payload_len: len,
            checksum: 0,
        };
        let ip = LinuxIpHeader::new(from.ip(), to, 8 + len, ident);
        (ip, udp.to_bytes().unwrap_or([0; 8]))
    }

    /// Verifies the ICRC of a received packet. For IPv4 the sender's IP ID
    /// is invisible to a UDP socket: see [`PeerIds`] and
    /// `uroce_wire::icrc::ipv4_id` for how it is recovered and how strong
    /// the check then is.
    fn icrc_ok(
        &mut self,
        from: SocketAddr,
        to: IpAddr,
        pkt: &RocePacket<&[u8]>,
        id: IpId,
    ) -> Result<(), WireError> {
        let len = pkt.as_bytes().len();
        let index = match id {
            IpId::Local => return Ok(()),
            IpId::Seen(ident) => {
                // The backend saw the header: one CRC, nothing to recover.
                let (ip, udp) = self.rx_headers(from, to, len, ident);
                let ok = icrc::compute(ip.icrc(), &udp, pkt.covered()) == pkt.icrc();
                return if ok { Ok(()) } else { Err(WireError::IcrcMismatch) };
            }
            IpId::Index(i) => i,
        };
        let (ip, udp) = self.rx_headers(from, to, len, 0);
        let computed = icrc::compute(ip.icrc(), &udp, pkt.covered());
        let peer = self.peers.get(&from.ip()).copied();
        if computed == pkt.icrc() {
            // ID 0: a uroce sender (or the first packet of a GSO run).
            if peer.is_none() {
                self.peers.insert(from.ip(), PeerIds::Zero);
            }
            return Ok(());
        }
        if !from.is_ipv4() {
            // No ID to recover over IPv6.
            return Err(WireError::IcrcMismatch);
        }
        // The ICRC is linear in the IP ID: one CRC and a small solve tell
        // which ID the sender used, instead of a CRC per candidate ID.
        let covered = pkt.covered().len();
        let solver = self.solvers.entry(covered).or_insert_with(|| IdSolver::new(covered));
        let id = solver.solve(computed ^ pkt.icrc()).ok_or(WireError::IcrcMismatch)?;
        if index > 0 && id == index {
            // Segment `index` of a uroce GSO run carries IP ID `index`.
            if peer.is_none() {
                self.peers.insert(from.ip(), PeerIds::Zero);
            }
            return Ok(());
        }
        if matches!(peer, Some(PeerIds::Zero)) {
            // A uroce peer's segment that came apart from its run: the
            // run was cut into datagrams on the way (software GSO on an
            // interface without UDP segmentation offload, or a NIC's,
            // with no GRO before our socket), so segment i arrives alone
            // with IP ID i.
            return if usize::from(id) < GSO_RUN_IDS {
                Ok(())
            } else {
                Err(WireError::IcrcMismatch)
            };
        }
        let next = match peer {
            Some(PeerIds::Counter(last)) => {
                // rxe counts up per packet; allow some reordering behind the
                // newest ID and a burst of unseen packets ahead of it.
                let d = id.wrapping_sub(last) as i16;
                if !(-ID_BEHIND..=ID_AHEAD).contains(&d) {
                    return Err(WireError::IcrcMismatch);
                }
                if d > 0 { id } else { last }
            }
            _ => id,
        };
        self.peers.insert(from.ip(), PeerIds::Counter(next));
        Ok(())
    }

    /// Sends what every QP has ready. Runs of equal-sized packets to one
    /// peer leave as one GSO send; packet `i` of a run gets its ICRC over IP
    /// ID `i`, which is what the kernel's segmentation puts on the wire.
    fn transmit(&mut self, now: Instant) -> usize {
        self.deferred_posts = 0;
        let mut sent = 0;
        let limits = self.backend.batch();
        let mut batch = std::mem::take(&mut self.txbuf);
        let mut run = Run::default();
        loop {
            if run.count > 0 && batch.len() - run.off < 4096 + 256 {
                run.flush(self.backend.as_mut(), &batch, &mut self.ep.stats);
            }
            let Some(t) = self.ep.poll_transmit(now, &self.mem, &mut batch[run.off..]) else {
                break;
            };
            sent += 1;
            let dst = SocketAddr::new(t.dst, t.dst_port);
            let Some(src) = self.gids.get(usize::from(t.sgid_index)) else {
                // Its GID went away: the packet is lost (and resent).
                self.ep.stats.send_err += 1;
                continue;
            };
            // Multicast goes one datagram per send: Linux delivered none of
            // a GSO send's segments to the group's sockets here (measured,
            // loopback), so a burst to a group would vanish whole.
            let single = limits.segments <= 1 || t.dst.is_multicast();
            // A run goes to one QP: on a shared address the receiving
            // kernel steers a GSO run whole, by its first packet's QPN.
            let qpn = crate::backend::dest_qpn(&batch[run.off..run.off + t.len]);
            let wanted = if t.src_port == 0 { self.backend.local().port() } else { t.src_port };
            let sport = self.backend.source_port(dst, wanted);
            let joins = run.count > 0
                && !single
                && run.src == src
                && run.sport == sport
                && run.dst == Some(dst)
                && run.qpn == qpn
                && run.tos == t.traffic_class
                && t.len <= run.seg
                && run.count < limits.segments
                && run.off + t.len <= limits.bytes;
            if !joins && run.count > 0 {
                let start = run.off;
                run.flush(self.backend.as_mut(), &batch, &mut self.ep.stats);
                batch.copy_within(start..start + t.len, 0);
            }
            if run.count == 0 {
                run.seg = t.len;
                run.src = src;
                run.sport = sport;
                run.dst = Some(dst);
                run.qpn = qpn;
                run.tos = t.traffic_class;
                run.local = self.backend.is_local(dst, qpn);
            }
            let at = run.off;
            let pkt = &mut batch[at..at + t.len];
            if run.local {
                // Through memory: no ICRC (see `backend::shm`).
                pkt[t.len - 4..].fill(0);
            } else {
                let udp = UdpRepr {
                    src_port: sport,
                    dst_port: t.dst_port,
                    payload_len: t.len,
                    checksum: 0,
                };
                let ip = LinuxIpHeader::new(src, t.dst, 8 + t.len, run.count as u16);
                let udp = udp.to_bytes().unwrap_or([0; 8]);
                let c = icrc::compute(ip.icrc(), &udp, &pkt[..t.len - 4]);
                pkt[t.len - 4..].copy_from_slice(&c.to_le_bytes());
            }
            run.off += t.len;
            run.count += 1;
            if t.len < run.seg || single {
                // A shorter packet can only end a GSO run.
                run.flush(self.backend.as_mut(), &batch, &mut self.ep.stats);
            }
        }
        if run.count > 0 {
            run.flush(self.backend.as_mut(), &batch, &mut self.ep.stats);
        }
        if sent > 0 {
            self.backend.flush();
        }
        self.txbuf = batch;
        sent
    }
}

/// Packets gathered for one (GSO) send.
struct Run {
    src: IpAddr,
    /// The UDP source port (see `Backend::source_port`).
    sport: u16,
    dst: Option<SocketAddr>,
    qpn: u32,
    /// The destination is reached through memory (no ICRC).
    local: bool,
    tos: u8,
    seg: usize,
    off: usize,
    count: usize,
}

impl Run {
    fn flush(&mut self, backend: &mut dyn Backend, batch: &[u8], stats: &mut Stats) {
        if let Some(dst) = self.dst
            && self.count > 0
            && backend
                .send(
                    SocketAddr::new(self.src, self.sport),
                    dst,
                    &batch[..self.off],
                    self.seg,
                    self.tos,
                )
                .is_err()
        {
            stats.send_err += self.count as u64;
        }
        *self = Self::default();
    }
}

impl Default for Run {
    fn default() -> Self {
        Self {
            src: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            sport: 0,
            dst: None,
            qpn: 0,
            local: false,
            tos: 0,
            seg: 0,
            off: 0,
            count: 0,
        }
    }
}

impl crate::xrc_open::Host for Driver {
    fn endpoint(&mut self) -> &mut Endpoint {
        &mut self.ep
    }

    fn control_addr(&self) -> (IpAddr, u8) {
        let ip = self.backend.local().ip();
        (ip, self.gid_index_of(ip).unwrap_or(0) as u8)
    }

    fn modify_qp(
        &mut self,
        qpn: u32,
        attr: &uroce_transport::QpAttr,
        mask: uroce_transport::AttrMask,
    ) -> crate::Result<()> {
        Self::modify_qp(self, qpn, attr, mask)
    }

    fn destroy_qp(&mut self, qpn: u32) {
        Self::destroy_qp(self, qpn);
    }
}
