//! The RDMA connection manager: connecting QPs through the CM on QP1, the
//! way librdmacm's users connect. On the wire it is the IBTA CM as Linux
//! speaks it (REQ, REP, RTU; DREQ, DREP; SIDR for UD), with the RDMA CM's
//! service IDs per port space and its private-data header, so the peer
//! can be another uroce process, a librdmacm program on uroce's drop-in
//! library, or a kernel rxe host. The protocol is
//! `uroce_transport::cm::CmAgent`; this module is its API, in three
//! layers:
//!
//! - [`EventChannel`] and [`CmId`]: librdmacm's model (`rdma_cm_id`) in
//!   Rust: bind, resolve, listen, connect, accept, reject, disconnect, UD
//!   ids and multicast, every outcome an [`Event`] on the channel (with
//!   `tokio`: `AsyncEventChannel`);
//! - [`Context::cm_listen`] / [`CmListener::accept`] and
//!   [`Context::cm_connect`], blocking calls that hand back a connected
//!   QP, as `TcpListener`/`TcpStream` do (with `tokio`: their futures);
//! - [`CmChannel`] and `Context::cm_*`: connections whose raw agent events
//!   go to a channel, the QP moves left to the caller (what librdmacm and
//!   the ids above are built on).
//!
//! The blocking calls' waits poll the context (connection setup is not a
//! hot path).

mod id;
pub mod ports;

pub use id::{CmId, ConnParam, Event, EventChannel, EventType, PortSpace, UDP_QKEY, UdParam};

use std::net::IpAddr;
use std::time::{Duration, Instant as StdInstant};

use uroce_transport::cm::{CmEvent, ConnectArgs, QpOffer, RESPONSE_TIMEOUT};
use uroce_wire::cm::{CmPath, CmaHeader, port_space, rdma_cm_service_id};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::verbs::Qp;
use crate::{Access, QpType};

/// The rights a connected QP gets (rdma_cm's: everything remote).
const ACCESS: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);
/// READs and atomics in flight each way (what `uroce::connect` sets).
const RD_ATOMIC: u8 = 16;

/// A port listened on ([`Context::cm_listen`]).
#[derive(Debug)]
pub struct CmListener {
    ctx: Context,
    service_id: u64,
}

/// A connection the CM set up: its QP is in RTS.
#[derive(Debug)]
pub struct CmConnection {
    ctx: Context,
    id: u32,
    peer: IpAddr,
    remote_qpn: u32,
    private_data: Vec<u8>,
}

impl CmConnection {
    /// The peer's address.
    pub fn peer(&self) -> IpAddr {
        self.peer
    }

    /// The peer's QP number.
    pub fn remote_qpn(&self) -> u32 {
        self.remote_qpn
    }

    /// The private data the peer sent with its request or reply (for a
    /// request, after the RDMA CM's 36-byte header).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Disconnects: sends a DREQ and waits up to `timeout` for the DREP
    /// (the QP is the caller's to move to the error state and destroy).
    ///
    /// # Errors
    /// [`Error::TimedOut`] when no DREP came.
    pub fn disconnect(self, timeout: Duration) -> Result<()> {
        {
            let mut d = self.ctx.inner.lock();
            let now = d.now();
            d.cm().agent.disconnect(now, self.id).map_err(|_| {
                Error::InvalidArgument("the connection is not established (the peer disconnected?)")
            })?;
        }
        let id = self.id;
        match wait(&self.ctx, timeout, |e| match e {
            CmEvent::Disconnected { id: i } | CmEvent::DisconnectRequest { id: i } => *i == id,
            _ => false,
        })? {
            Some(_) => Ok(()),
            None => Err(Error::TimedOut("waiting for the peer's DREP")),
        }
    }

    /// Waits up to `timeout` for the peer to disconnect; true if it did.
    ///
    /// # Errors
    /// As a context poll.
    pub fn wait_disconnect(&self, timeout: Duration) -> Result<bool> {
        let id = self.id;
        Ok(wait(
            &self.ctx,
            timeout,
            |e| matches!(e, CmEvent::DisconnectRequest { id: i } if *i == id),
        )?
        .is_some())
    }
}

/// The path and timing choices of a REQ.
#[derive(Debug, Clone, Copy)]
pub struct PathOptions {
    /// Transport retries the QPs make (at most 7).
    pub retry_count: u8,
    /// The connection's traffic class (the IP TOS).
    pub traffic_class: u8,
    /// The QPs' Local ACK Timeout code.
    pub ack_timeout: u8,
    /// The CM's response timeout, 4.096 µs × 2^code per try.
    pub response_timeout: u8,
    /// The CM's retries of a MAD.
    pub max_cm_retries: u8,
}

/// A REQ from `local` to `peer` for `service_id`, offering `qp`, with
/// `private_data` (the RDMA CM header first).
pub fn request_args(
    local: IpAddr,
    peer: IpAddr,
    service_id: u64,
    qp: QpOffer,
    path: PathOptions,
    private_data: [u8; 92],
) -> ConnectArgs {
    ConnectArgs {
        peer,
        service_id,
        qp,
        transport_service_type: 0,
        retry_count: path.retry_count,
        path_mtu: if peer.is_loopback() { 5 } else { 3 },
        path: CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: uroce_wire::grh::gid_of(local),
            remote_gid: uroce_wire::grh::gid_of(peer),
            hop_limit: 64,
            traffic_class: path.traffic_class,
            local_ack_timeout: path.ack_timeout,
            ..CmPath::default()
        },
        response_timeout: path.response_timeout,
        max_cm_retries: path.max_cm_retries,
        private_data,
    }
}

/// Takes the first pending CM event `pick` accepts, driving progress
/// until one comes or `timeout` passes.
fn wait(
    ctx: &Context,
    timeout: Duration,
    mut pick: impl FnMut(&CmEvent) -> bool,
) -> Result<Option<CmEvent>> {
    let start = StdInstant::now();
    loop {
        {
            let mut d = ctx.inner.lock();
            d.progress();
            let cm = d.cm();
            if let Some(i) = cm.events.iter().position(&mut pick) {
                return Ok(cm.events.remove(i));
            }
        }
        if start.elapsed() >= timeout {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// A starting PSN that differs per QP and per run (a reused QPN must not
/// start where its previous connection's stale packets might be).
fn psn_for(qpn: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (qpn.wrapping_mul(0x9e37_79b9) ^ t ^ std::process::id().rotate_left(11)) & 0xff_ffff
}

fn check_qp(qp: &Qp) -> Result<()> {
    if qp.qp_type() != QpType::Rc {
        return Err(Error::InvalidArgument("the CM connects RC QPs"));
    }
    Ok(())
}

impl Context {
    /// Listens for connection requests to `port` (the RDMA CM's TCP port
    /// space), as `rdma_bind_addr` + `rdma_listen`.
    ///
    /// # Errors
    /// [`Error::InUse`] when the port is already listened on.
    pub fn cm_listen(&self, port: u16) -> Result<CmListener> {
        let service_id = rdma_cm_service_id(port_space::TCP, port);
        self.inner.lock().cm_listen(service_id)?;
        Ok(CmListener { ctx: self.clone(), service_id })
    }

    /// Connects `qp` (an RC QP in RESET) to whoever listens on `port` at
    /// `peer`, sending `private_data` (at most 56 bytes: the RDMA CM's
    /// header takes 36 of the REQ's 92), as `rdma_connect`. Returns once
    /// the QP is in RTS and the RTU is sent.
    ///
    /// # Errors
    /// [`Error::Rejected`] (nobody listens, or the peer refused),
    /// [`Error::TimedOut`], or a QP transition's error.
    pub fn cm_connect(
        &self,
        qp: &Qp,
        peer: IpAddr,
        port: u16,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<CmConnection> {
        let (args, my_psn) = self.request_args(qp, peer, port, private_data)?;
        let id = {
            let mut d = self.inner.lock();
            let now = d.now();
            d.cm().agent.connect(now, &args)
        };
        let ev = wait(self, timeout, |e| match e {
            CmEvent::ConnectReply { id: i, .. }
            | CmEvent::Rejected { id: i, .. }
            | CmEvent::Unreachable { id: i } => *i == id,
            _ => false,
        })?;
        let rep = match ev {
            Some(CmEvent::ConnectReply { rep, .. }) => rep,
            Some(CmEvent::Rejected { reason, private_data, .. }) => {
                return Err(Error::Rejected { reason, private_data: private_data.to_vec() });
            }
            Some(_) => return Err(Error::TimedOut("the peer's CM did not answer")),
            None => return Err(Error::TimedOut("waiting for the peer's reply")),
        };
        self.complete_connect(qp, id, peer, my_psn, &rep)
    }

    /// The REQ for `qp` to `peer`'s `port`, and our starting PSN.
    fn request_args(
        &self,
        qp: &Qp,
        peer: IpAddr,
        port: u16,
        private_data: &[u8],
    ) -> Result<(ConnectArgs, u32)> {
        check_qp(qp)?;
        if private_data.len() > 92 - CmaHeader::LEN {
            return Err(Error::InvalidArgument("REQ private data is at most 56 bytes"));
        }
        let me = self.device().socket_addr();
        let mut pd = [0u8; 92];
        CmaHeader { version: 0, src_port: 0, src: me.ip(), dst: peer }.emit(&mut pd);
        pd[CmaHeader::LEN..CmaHeader::LEN + private_data.len()].copy_from_slice(private_data);
        let my_psn = psn_for(qp.qpn());
        let offer = QpOffer {
            qpn: qp.qpn(),
            starting_psn: my_psn,
            responder_resources: RD_ATOMIC,
            initiator_depth: RD_ATOMIC,
            rnr_retry_count: 7,
            srq: false,
            ece: Ece::default(),
        };
        let path = PathOptions {
            retry_count: 7,
            traffic_class: 0,
            ack_timeout: id::ACK_TIMEOUT,
            // 2^16 × 4.096 µs ≈ 268 ms per try, as many tries as fit.
            response_timeout: 16,
            max_cm_retries: 15,
        };
        let service_id = rdma_cm_service_id(port_space::TCP, port);
        let args = request_args(me.ip(), peer, service_id, offer, path, pd);
        Ok((args, my_psn))
    }

    /// The reply came: `qp` to RTS, then the RTU.
    fn complete_connect(
        &self,
        qp: &Qp,
        id: u32,
        peer: IpAddr,
        my_psn: u32,
        rep: &uroce_wire::cm::Rep,
    ) -> Result<CmConnection> {
        let port = self.device().socket_addr().port();
        if let Err(e) =
            crate::connect(qp, peer, port, rep.local_qpn, my_psn, rep.starting_psn, ACCESS)
        {
            let _ = self.inner.lock().cm().agent.reject(id, &[]);
            return Err(e);
        }
        self.inner
            .lock()
            .cm()
            .agent
            .establish(id)
            .map_err(|_| Error::InvalidArgument("CM state"))?;
        self.inner.lock().send_cm_now();
        Ok(CmConnection {
            ctx: self.clone(),
            id,
            peer,
            remote_qpn: rep.local_qpn,
            private_data: rep.private_data.to_vec(),
        })
    }
}

impl CmListener {
    /// Waits up to `timeout` for a connection request, connects `qp` (an
    /// RC QP in RESET) to the requester's QP and replies with
    /// `private_data` (at most 196 bytes), as `rdma_get_request` +
    /// `rdma_accept`; returns once the requester's RTU arrived.
    ///
    /// # Errors
    /// [`Error::TimedOut`] (no request, or no RTU), or a QP transition's
    /// error (the request is then refused).
    pub fn accept(&self, qp: &Qp, private_data: &[u8], timeout: Duration) -> Result<CmConnection> {
        check_qp(qp)?;
        if private_data.len() > 196 {
            return Err(Error::InvalidArgument("REP private data is at most 196 bytes"));
        }
        let service = self.service_id;
        let Some(CmEvent::ConnectRequest { id, from, req, .. }) = wait(
            &self.ctx,
            timeout,
            |e| matches!(e, CmEvent::ConnectRequest { req, .. } if req.service_id == service),
        )?
        else {
            return Err(Error::TimedOut("waiting for a connection request"));
        };
        answer_request(&self.ctx, qp, id, from, &req, private_data)?;
        let ev = wait(&self.ctx, timeout, |e| match e {
            CmEvent::Established { id: i } | CmEvent::Unreachable { id: i } => *i == id,
            _ => false,
        })?;
        match ev {
            Some(CmEvent::Established { .. }) => Ok(CmConnection {
                ctx: self.ctx.clone(),
                id,
                peer: from,
                remote_qpn: req.local_qpn,
                private_data: req.private_data[CmaHeader::LEN..].to_vec(),
            }),
            _ => Err(Error::TimedOut("waiting for the requester's RTU")),
        }
    }
}

/// Connects `qp` to the requester of `req` and sends the REP.
fn answer_request(
    ctx: &Context,
    qp: &Qp,
    id: u32,
    from: IpAddr,
    req: &uroce_wire::cm::Req,
    private_data: &[u8],
) -> Result<()> {
    let port = ctx.device().socket_addr().port();
    let my_psn = psn_for(qp.qpn());
    if let Err(e) = crate::connect(qp, from, port, req.local_qpn, my_psn, req.starting_psn, ACCESS)
    {
        let _ = ctx.inner.lock().cm().agent.reject(id, &[]);
        return Err(e);
    }
    let offer = QpOffer {
        qpn: qp.qpn(),
        starting_psn: my_psn,
        responder_resources: RD_ATOMIC.min(req.initiator_depth),
        initiator_depth: RD_ATOMIC.min(req.responder_resources),
        rnr_retry_count: 7,
        srq: false,
        ece: Ece::default(),
    };
    let mut d = ctx.inner.lock();
    let now = d.now();
    let r = d
        .cm()
        .agent
        .accept(now, id, &offer, private_data)
        .map_err(|_| Error::InvalidArgument("CM state"));
    d.send_cm_now();
    r
}

impl Drop for CmConnection {
    /// Dropping a connection disconnects it (a DREQ, if it is still
    /// established, as `rdma_destroy_id` does) and forgets its pending
    /// events, so that a long-lived context does not collect them.
    fn drop(&mut self) {
        let mut d = self.ctx.inner.lock();
        let now = d.now();
        let cm = d.cm();
        let _ = cm.agent.disconnect(now, self.id);
        let id = self.id;
        cm.events.retain(|e| e.id() != id);
        d.send_cm_now();
    }
}

impl Drop for CmListener {
    fn drop(&mut self) {
        let mut d = self.ctx.inner.lock();
        d.cm().agent.unlisten(self.service_id);
        d.cm_listens_changed();
    }
}

/// How long the CM waits for its peer's answers by default (the RDMA
/// CM's response timeout).
pub fn default_response_timeout() -> Duration {
    uroce_transport::cm::cm_timeout(RESPONSE_TIMEOUT)
}

// ---- the event-channel layer (what librdmacm is built on) ----

#[cfg(feature = "tokio")]
#[allow(unsafe_code)]
mod async_cm;
#[cfg(feature = "tokio")]
pub use async_cm::{AsyncCmChannel, AsyncEventChannel};

pub use crate::driver::CmChannelEvent;
pub use uroce_transport::cm::{
    CmEvent as AgentEvent, ConnectArgs as RequestArgs, Ece, QpOffer as Offer, XRC_TRANSPORT,
};

/// A CM event channel (`rdma_event_channel`): the events of the
/// connections and listens routed to it, plus events its owner queues
/// itself, behind a descriptor that is readable while events wait. The
/// contexts' progress threads fill it; nothing needs to poll.
#[derive(Clone, Debug)]
pub struct CmChannel {
    queue: std::sync::Arc<crate::channel::LevelQueue<CmChannelEvent>>,
}

impl CmChannel {
    /// A new, blocking channel.
    ///
    /// # Errors
    /// The eventfd could not be created.
    pub fn new() -> Result<Self> {
        let q = crate::channel::LevelQueue::new().map_err(Error::Io)?;
        Ok(Self { queue: std::sync::Arc::new(q) })
    }

    /// The next event: blocks while none waits, unless the channel is
    /// non-blocking (then `WouldBlock`).
    ///
    /// # Errors
    /// `WouldBlock`, `Interrupted` (a caught signal whose handler lacks
    /// `SA_RESTART`), or the descriptor's error.
    pub fn get(&self) -> std::io::Result<CmChannelEvent> {
        self.queue.pop()
    }

    /// The next event, waiting at most `timeout`.
    ///
    /// # Errors
    /// The descriptor's error.
    pub fn get_timeout(&self, timeout: Duration) -> std::io::Result<Option<CmChannelEvent>> {
        let end = std::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.queue.try_pop() {
                return Ok(Some(e));
            }
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || !self.queue.wait_readable(left)? {
                return Ok(None);
            }
        }
    }

    /// Withdraws the waiting events `keep` rejects (those of a connection
    /// being destroyed): a reader is never woken for them.
    pub fn retain(&self, keep: impl FnMut(&CmChannelEvent) -> bool) {
        self.queue.retain(keep);
    }

    /// Sets or clears `O_NONBLOCK` on the descriptor.
    ///
    /// # Errors
    /// `fcntl`'s.
    pub fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        self.queue.set_nonblocking(on)
    }

    /// Queues an event of the owner's own (`CmChannelEvent::User`).
    pub fn push_user(&self, tag: u64) {
        self.queue.push(CmChannelEvent::User(tag));
    }

    /// Events waiting.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }
}

impl std::os::fd::AsFd for CmChannel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.queue.as_fd()
    }
}

impl std::os::fd::AsRawFd for CmChannel {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.queue.as_fd().as_raw_fd()
    }
}

/// A starting PSN for QP `qpn` that differs per run (the CM's choice).
pub fn starting_psn(qpn: u32) -> u32 {
    psn_for(qpn)
}

impl Context {
    /// This context's tag on [`CmChannelEvent::Cm`] events.
    pub fn key(&self) -> u64 {
        self.inner.lock().key
    }

    /// Listens for requests to `service_id`, their events (and those of
    /// the connections they start) going to `channel`.
    ///
    /// # Errors
    /// [`Error::InUse`] when the service is already listened on.
    pub fn cm_listen_on(&self, service_id: u64, channel: &CmChannel) -> Result<()> {
        let mut d = self.inner.lock();
        d.cm_listen(service_id)?;
        d.cm().listeners.insert(service_id, channel.queue.clone());
        Ok(())
    }

    /// Stops listening on `service_id`.
    pub fn cm_unlisten(&self, service_id: u64) {
        let mut d = self.inner.lock();
        let cm = d.cm();
        cm.agent.unlisten(service_id);
        cm.listeners.remove(&service_id);
        d.cm_listens_changed();
    }

    /// Sends a connection request; the connection's events go to
    /// `channel`. Returns its ID.
    pub fn cm_request(&self, args: &RequestArgs, channel: &CmChannel) -> u32 {
        let mut d = self.inner.lock();
        let now = d.now();
        let cm = d.cm();
        let id = cm.agent.connect(now, args);
        cm.routes.insert(id, channel.queue.clone());
        d.send_cm_now();
        id
    }

    /// Accepts request `id` with the local QP's `offer` (the QP already in
    /// RTR or RTS) and up to 196 bytes of private data.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown ID or one in another
    /// state.
    pub fn cm_accept(&self, id: u32, offer: &Offer, private_data: &[u8]) -> Result<()> {
        let mut d = self.inner.lock();
        let now = d.now();
        let r = d
            .cm()
            .agent
            .accept(now, id, offer, private_data)
            .map_err(|_| Error::InvalidArgument("no connection request to accept"));
        d.send_cm_now();
        r
    }

    /// Refuses request `id` (a REJ, consumer reason, with private data).
    ///
    /// # Errors
    /// As [`Context::cm_accept`].
    pub fn cm_reject(&self, id: u32, private_data: &[u8]) -> Result<()> {
        self.cm_reject_for(id, uroce_wire::cm::rej_reason::CONSUMER_DEFINED, private_data)
    }

    /// Refuses request `id` with REJ reason `reason`: the consumer's (28)
    /// or "vendor option not supported" (35, an ECE the QP cannot do).
    ///
    /// # Errors
    /// As [`Context::cm_accept`].
    pub fn cm_reject_for(&self, id: u32, reason: u16, private_data: &[u8]) -> Result<()> {
        let mut d = self.inner.lock();
        let r = d
            .cm()
            .agent
            .reject_for(id, reason, private_data)
            .map_err(|_| Error::InvalidArgument("no connection request to reject"));
        if r.is_ok() {
            // The agent forgets a refused request: so does its route.
            d.cm().routes.remove(&id);
        }
        d.send_cm_now();
        r
    }

    /// Sends the RTU for reply `id` (the local QP is in RTS).
    ///
    /// # Errors
    /// As [`Context::cm_accept`].
    pub fn cm_establish(&self, id: u32) -> Result<()> {
        let mut d = self.inner.lock();
        let r = d
            .cm()
            .agent
            .establish(id)
            .map_err(|_| Error::InvalidArgument("no connection reply to establish"));
        d.send_cm_now();
        r
    }

    /// Sends a DREQ for connection `id`.
    ///
    /// # Errors
    /// As [`Context::cm_accept`] (not established, or already
    /// disconnecting).
    pub fn cm_disconnect(&self, id: u32) -> Result<()> {
        let mut d = self.inner.lock();
        let now = d.now();
        let r = d
            .cm()
            .agent
            .disconnect(now, id)
            .map_err(|_| Error::InvalidArgument("the connection is not established"));
        d.send_cm_now();
        r
    }

    /// Asks `peer` which UD QP serves `service_id` (SIDR), with up to 216
    /// bytes of private data; the answer goes to `channel`. Returns the
    /// request's ID.
    pub fn cm_sidr_request(
        &self,
        peer: IpAddr,
        service_id: u64,
        private_data: &[u8],
        channel: &CmChannel,
    ) -> u32 {
        let mut d = self.inner.lock();
        let now = d.now();
        let cm = d.cm();
        let id = cm.agent.sidr_request(now, peer, service_id, private_data, 16, 15);
        cm.routes.insert(id, channel.queue.clone());
        d.send_cm_now();
        id
    }

    /// Answers SIDR request `id` (`status` 0: served by UD QP `qpn` with
    /// `qkey`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown or answered request.
    pub fn cm_sidr_reply(
        &self,
        id: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<()> {
        let mut d = self.inner.lock();
        let r = d
            .cm()
            .agent
            .sidr_reply(id, status, qpn, qkey, private_data)
            .map_err(|_| Error::InvalidArgument("no SIDR request to answer"));
        d.cm().routes.remove(&id);
        d.send_cm_now();
        r
    }

    /// Sends connection `id`'s events back to the context's own queue (the
    /// one the blocking calls of this module wait on).
    #[cfg(feature = "tokio")]
    fn cm_unroute(&self, id: u32) {
        self.inner.lock().cm().routes.remove(&id);
    }

    /// Routes connection `id`'s events to `channel`, or (with `None`)
    /// forgets them.
    pub fn cm_route(&self, id: u32, channel: Option<&CmChannel>) {
        let mut d = self.inner.lock();
        let cm = d.cm();
        match channel {
            Some(c) => {
                cm.routes.insert(id, c.queue.clone());
            }
            None => {
                cm.routes.remove(&id);
                cm.events.retain(|e| e.id() != id);
                cm.detached.insert(id, ());
            }
        }
    }
}

// ---- the listener and connect calls as futures (feature `tokio`) ----

/// A port listened on, whose requests are awaited
/// ([`Context::cm_listen_async`]).
#[cfg(feature = "tokio")]
#[derive(Debug)]
pub struct AsyncCmListener {
    ctx: Context,
    service_id: u64,
    ch: AsyncCmChannel,
    /// Events that came while another connection was being accepted.
    pending: std::collections::VecDeque<CmEvent>,
}

#[cfg(feature = "tokio")]
impl Context {
    /// [`Context::cm_connect`] as a future (no timeout of its own: the
    /// CM gives up after its retries; wrap it in `tokio::time::timeout`
    /// for less).
    ///
    /// # Errors
    /// As [`Context::cm_connect`].
    pub async fn cm_connect_async(
        &self,
        qp: &Qp,
        peer: IpAddr,
        port: u16,
        private_data: &[u8],
    ) -> Result<CmConnection> {
        let (args, my_psn) = self.request_args(qp, peer, port, private_data)?;
        let ch = AsyncCmChannel::new(CmChannel::new()?).map_err(Error::Io)?;
        let id = self.cm_request(&args, ch.channel());
        let rep = loop {
            let CmChannelEvent::Cm { event, .. } = ch.next().await? else { continue };
            match event {
                CmEvent::ConnectReply { id: i, rep, .. } if i == id => break rep,
                CmEvent::Rejected { id: i, reason, private_data } if i == id => {
                    return Err(Error::Rejected { reason, private_data: private_data.to_vec() });
                }
                CmEvent::Unreachable { id: i } if i == id => {
                    return Err(Error::TimedOut("the peer's CM did not answer"));
                }
                _ => {}
            }
        };
        self.cm_unroute(id);
        self.complete_connect(qp, id, peer, my_psn, &rep)
    }

    /// [`Context::cm_listen`] whose requests are awaited. Must be called
    /// within a tokio runtime with I/O enabled.
    ///
    /// # Errors
    /// As [`Context::cm_listen`], or registering the descriptor.
    pub fn cm_listen_async(&self, port: u16) -> Result<AsyncCmListener> {
        let ch = AsyncCmChannel::new(CmChannel::new()?).map_err(Error::Io)?;
        let service_id = rdma_cm_service_id(port_space::TCP, port);
        self.cm_listen_on(service_id, ch.channel())?;
        Ok(AsyncCmListener {
            ctx: self.clone(),
            service_id,
            ch,
            pending: std::collections::VecDeque::new(),
        })
    }
}

#[cfg(feature = "tokio")]
impl AsyncCmListener {
    /// The next event: one kept aside first.
    async fn next(&mut self) -> Result<CmEvent> {
        if let Some(e) = self.pending.pop_front() {
            return Ok(e);
        }
        loop {
            if let CmChannelEvent::Cm { event, .. } = self.ch.next().await? {
                return Ok(event);
            }
        }
    }

    /// [`CmListener::accept`] as a future: the next request is answered
    /// with `qp` (RC, in RESET) and `private_data`; returns once the
    /// requester's RTU came. Requests that arrive meanwhile wait for the
    /// next call.
    ///
    /// # Errors
    /// As [`CmListener::accept`].
    pub async fn accept(&mut self, qp: &Qp, private_data: &[u8]) -> Result<CmConnection> {
        check_qp(qp)?;
        if private_data.len() > 196 {
            return Err(Error::InvalidArgument("REP private data is at most 196 bytes"));
        }
        // Events of connections already handed out go to the context's
        // queue: only requests (and the handshakes below) come here.
        let (id, from, req) = loop {
            if let CmEvent::ConnectRequest { id, from, req, .. } = self.next().await? {
                break (id, from, req);
            }
        };
        answer_request(&self.ctx, qp, id, from, &req, private_data)?;
        let mut aside = Vec::new();
        let outcome = loop {
            match self.next().await {
                Ok(CmEvent::Established { id: i }) if i == id => break Ok(()),
                Ok(CmEvent::Unreachable { id: i } | CmEvent::Rejected { id: i, .. }) if i == id => {
                    break Err(Error::TimedOut("waiting for the requester's RTU"));
                }
                Ok(other) => aside.push(other),
                Err(e) => break Err(e),
            }
        };
        self.pending.extend(aside);
        outcome?;
        self.ctx.cm_unroute(id);
        Ok(CmConnection {
            ctx: self.ctx.clone(),
            id,
            peer: from,
            remote_qpn: req.local_qpn,
            private_data: req.private_data[CmaHeader::LEN..].to_vec(),
        })
    }
}

#[cfg(feature = "tokio")]
impl Drop for AsyncCmListener {
    fn drop(&mut self) {
        self.ctx.cm_unlisten(self.service_id);
    }
}
