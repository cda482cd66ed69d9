//! The communication manager's protocol (IBTA vol. 1 chapter 12), sans-IO:
//! connection establishment (REQ, REP, RTU, MRA for a slow application),
//! refusal (REJ, the stale-connection check) and teardown (DREQ, DREP,
//! TimeWait) for RC and UC QPs, service ID resolution for UD (SIDR_REQ,
//! SIDR_REP), with response timeouts, MAD retries and duplicate MADs
//! answered as §12.9 asks. MADs come in through
//! [`CmAgent::handle`] and leave through [`CmAgent::poll_transmit`] (the
//! caller carries them as UD SENDs on QP1); what the application must act
//! on comes out of [`CmAgent::poll_event`]; time is passed in.
//!
//! The QP itself is the caller's: the agent says when to move it (a
//! connect request arrived, a reply arrived, the connection is established
//! or gone) and carries the numbers both sides need (QPN, starting PSN,
//! READ/atomic depths, retry counts, MTU, path).
//!
//! Not yet: LAP/APR (Linux refuses them on RoCE; they are ignored here),
//! MRA for a REP (ours are answered at once by the RTU's sender). The
//! RDMA CM's address resolution is the layer above.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use uroce_wire::cm::{
    CmMad, CmMessage, CmPath, Dreq, IdsOnly, MadHeader, Mra, Rej, Rep, Req, SidrRep, SidrReq, attr,
    rej_reason,
};

use crate::Instant;

/// How long a REQ's sender waits for the answer: 4.096 µs × 2^`timeout`
/// (IBTA's encoding of CM response timeouts and packet lifetimes).
pub fn cm_timeout(timeout: u8) -> Duration {
    Duration::from_nanos(4096 << timeout.min(31))
}

/// Enhanced connection establishment (IBTA 1.4's ECE, rdma-core's
/// `struct ibv_ece`): a vendor ID (24 bits on the wire; 0 = none) and
/// vendor options, carried in the REQ and the REP (the options in the MAD
/// header's attribute modifier), as Linux's CM carries them. The CM only
/// carries them; what they mean is the two QPs' business.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ece {
    /// The vendor (an IEEE OUI); 0 when ECE is not offered.
    pub vendor_id: u32,
    /// The vendor's options.
    pub options: u32,
}

/// What a QP brings to a connection (both sides fill one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpOffer {
    /// The QP's number.
    pub qpn: u32,
    /// Its first send PSN.
    pub starting_psn: u32,
    /// READs/atomics it accepts at once (`max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// READs/atomics it issues at once (`max_rd_atomic`).
    pub initiator_depth: u8,
    /// RNR retries the peer should use toward it (3 bits; 7 = forever).
    pub rnr_retry_count: u8,
    /// It takes receives from an SRQ.
    pub srq: bool,
    /// ECE offered (REQ) or answered (REP).
    pub ece: Ece,
}

/// A connection request to send ([`CmAgent::connect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectArgs {
    /// The peer's address (where the REQ goes).
    pub peer: IpAddr,
    /// The service asked for.
    pub service_id: u64,
    /// The local QP.
    pub qp: QpOffer,
    /// 0 RC, 1 UC, [`XRC_TRANSPORT`] (an XRC initiator's request).
    pub transport_service_type: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// Path MTU (`ibv_mtu` encoding).
    pub path_mtu: u8,
    /// The path: GIDs, flow label, hop limit, traffic class, ACK timeout.
    pub path: CmPath,
    /// How long the peer's CM may take to answer (IBTA encoding).
    pub response_timeout: u8,
    /// REQ retransmissions before giving up (4 bits).
    pub max_cm_retries: u8,
    /// Private data (at most 92 bytes; more is cut).
    pub private_data: [u8; 92],
}

/// What the application must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service being listened on: answer with
    /// [`CmAgent::accept`] or [`CmAgent::reject`].
    ConnectRequest {
        /// The new connection's local ID.
        id: u32,
        /// Who asked.
        from: IpAddr,
        /// The request (its QP, PSN, path, private data).
        req: Box<Req>,
        /// The requester's ECE.
        ece: Ece,
    },
    /// The peer accepted our REQ: move the QP to RTR and RTS with the
    /// reply's numbers, then call [`CmAgent::establish`].
    ConnectReply {
        /// The connection.
        id: u32,
        /// The reply.
        rep: Box<Rep>,
        /// The ECE the peer answered with.
        ece: Ece,
    },
    /// The passive side is ready (it got the RTU, or any message that
    /// proves the peer is established). The active side, which sends the
    /// RTU in [`CmAgent::establish`], gets none.
    Established {
        /// The connection.
        id: u32,
    },
    /// The peer refused (or nobody listens: reason 8).
    Rejected {
        /// The connection.
        id: u32,
        /// The REJ reason.
        reason: u16,
        /// The REJ's private data.
        private_data: Box<[u8; 148]>,
    },
    /// The peer did not answer within the retries.
    Unreachable {
        /// The connection.
        id: u32,
    },
    /// The peer asked to disconnect (a DREP went back): move the QP to
    /// the error state.
    DisconnectRequest {
        /// The connection.
        id: u32,
    },
    /// The connection is gone (our DREQ answered or timed out); its ID
    /// stays reserved through TimeWait.
    Disconnected {
        /// The connection.
        id: u32,
    },
    /// TimeWait ended: the ID and the QP may be reused.
    TimeWaitExit {
        /// The connection.
        id: u32,
    },
    /// A SIDR_REQ for a service being listened on: answer with
    /// [`CmAgent::sidr_reply`].
    SidrRequest {
        /// The request's local ID.
        id: u32,
        /// Who asked.
        from: IpAddr,
        /// The request.
        req: Box<SidrReq>,
    },
    /// The answer to our SIDR_REQ (its status says whether it names a QP).
    SidrReply {
        /// The request.
        id: u32,
        /// The reply.
        rep: Box<SidrRep>,
    },
}

impl CmEvent {
    /// The connection the event is about.
    pub fn id(&self) -> u32 {
        match self {
            Self::ConnectRequest { id, .. }
            | Self::ConnectReply { id, .. }
            | Self::Established { id }
            | Self::Rejected { id, .. }
            | Self::Unreachable { id }
            | Self::DisconnectRequest { id }
            | Self::Disconnected { id }
            | Self::TimeWaitExit { id }
            | Self::SidrRequest { id, .. }
            | Self::SidrReply { id, .. } => *id,
        }
    }
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmError {
    /// No such connection.
    UnknownId,
    /// The connection is not in a state that allows this call.
    InvalidState,
    /// The service is already listened on.
    ServiceInUse,
}

impl core::fmt::Display for CmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::UnknownId => "no such CM connection",
            Self::InvalidState => "the CM connection's state does not allow this",
            Self::ServiceInUse => "the service ID is already listened on",
        })
    }
}

impl std::error::Error for CmError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Passive: REQ received, the application deciding.
    ReqRcvd,
    /// Active: REP received, the application readying its QP.
    RepRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    TimeWait,
    /// Active: SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// Passive: SIDR_REQ received, the application deciding.
    SidrReqRcvd,
}

#[derive(Debug)]
struct Conn {
    state: State,
    peer: IpAddr,
    remote_id: u32,
    remote_qpn: u32,
    local_qpn: u32,
    tid: u64,
    /// The MAD to resend when `deadline` passes without an answer.
    retry: Option<CmMad>,
    /// When to resend `retry`, give up, or (in TimeWait) forget the
    /// connection.
    deadline: Option<Instant>,
    retries_left: u8,
    wait: Duration,
    /// The last answer sent, for duplicates of what it answered.
    last_sent: Option<CmMad>,
    /// The service a SIDR request asked for (echoed in the reply).
    service_id: u64,
    /// The peer's CA GUID (with `remote_qpn`, what a stale REQ repeats).
    remote_guid: u64,
    /// An XRC connection (transport service type 3, extended type 1): an
    /// initiator QP here and a target QP there, or the reverse.
    xrc: bool,
}

impl Conn {
    fn new(state: State, peer: IpAddr, remote_id: u32, tid: u64, wait: Duration) -> Self {
        Self {
            state,
            peer,
            remote_id,
            remote_qpn: 0,
            local_qpn: 0,
            tid,
            retry: None,
            deadline: None,
            retries_left: 0,
            wait,
            last_sent: None,
            service_id: 0,
            remote_guid: 0,
            xrc: false,
        }
    }
}

/// How long TimeWait lasts (IBTA: at least the packet lifetime plus the
/// remote ACK delay; Linux waits about a second on RoCE).
const TIME_WAIT: Duration = Duration::from_secs(1);
/// MAD retransmissions of a DREQ or REP.
const DEFAULT_RETRIES: u8 = 15;

/// The REQ's transport service type of XRC (with extended transport
/// type 1), as Linux's CM sends it for an XRC initiator.
pub const XRC_TRANSPORT: u8 = 3;
/// Response timeout (IBTA encoding) the agent asks peers for, and waits
/// for replies to its REP and DREQ: 2^20 × 4.096 µs ≈ 4.3 s, as Linux's
/// RDMA CM asks (`CMA_CM_RESPONSE_TIMEOUT`).
pub const RESPONSE_TIMEOUT: u8 = 20;

/// A connection of a context that ended without disconnecting it (a
/// SIGKILLed process): what another context of the device needs to send
/// its peer the DREQ the kernel CM would have sent when the process's
/// cm_ids were destroyed, so that the peer sees DISCONNECTED instead of
/// waiting on an idle QP forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leftover {
    /// The peer's address.
    pub peer: IpAddr,
    /// The connection's communication ID on this side.
    pub local_id: u32,
    /// The peer's communication ID.
    pub remote_id: u32,
    /// The peer's QP.
    pub remote_qpn: u32,
    /// The transaction ID of the connection's MADs.
    pub tid: u64,
}

impl Leftover {
    /// The DREQ that ends it. Sent by a context that does not know the
    /// connection, so nobody resends it or waits for the DREP (which the
    /// device drops as an answer to an unknown ID).
    pub fn dreq(&self) -> CmMad {
        let dreq = Dreq {
            local_comm_id: self.local_id,
            remote_comm_id: self.remote_id,
            remote_qpn: self.remote_qpn,
            private_data: [0; 220],
        };
        CmMad { header: MadHeader::cm(attr::DREQ, self.tid), message: CmMessage::Dreq(dreq) }
    }
}

/// One port's connection manager.
#[derive(Debug)]
pub struct CmAgent {
    ca_guid: u64,
    /// Target ACK delay put in REPs (5 bits).
    target_ack_delay: u8,
    /// Our side's wait for answers to REPs and DREQs.
    reply_wait: Duration,
    conns: BTreeMap<u32, Conn>,
    listening: Vec<u64>,
    next_id: u32,
    /// Communication IDs are `id_prefix | (counter & id_mask)`.
    id_prefix: u32,
    id_mask: u32,
    next_tid: u64,
    out: VecDeque<(IpAddr, CmMad)>,
    events: VecDeque<CmEvent>,
    /// REQs for services nobody listens on yet, refused at their deadline
    /// (see [`ORPHAN_WAIT`]).
    orphans: VecDeque<Orphan>,
    /// Ports that other contexts sharing this address listen on (see
    /// [`CmAgent::set_listened_elsewhere`]).
    listened_elsewhere: Vec<u16>,
    /// The latest time any call brought (for work a call without one,
    /// `listen`, starts).
    last_now: Instant,
}

/// How long a REQ for a service nobody listens on waits for a listener
/// before it is refused (REJ, invalid service ID), at most (and at most
/// half the requester's response timeout). A server that closes
/// one listening id and opens the next (perftest's control connection,
/// then its test connections) is a few microseconds without a listener on
/// the kernel too, but there address resolution gives it a head start;
/// here resolution completes at once, so a client's REQ can fall into the
/// gap, and perftest's retry path then fails. Refusing after a short wait
/// costs only a connect to a closed port its prompt answer.
pub const ORPHAN_WAIT: Duration = Duration::from_millis(100);

/// How soon a request is sent again after its peer's port answered
/// "unreachable" (see `CmAgent::peer_gone`).
pub const GONE_RETRY: Duration = Duration::from_millis(100);

/// The service timeout our MRAs name (4.096 µs × 2^22 ≈ 17 s): how long
/// a requester should wait for an application that has not answered.
const MRA_SERVICE_TIMEOUT: u8 = 22;

/// The most REQs held for a listener.
const MAX_ORPHANS: usize = 64;

#[derive(Debug)]
struct Orphan {
    until: Instant,
    from: IpAddr,
    tid: u64,
    req: OrphanReq,
}

/// A request waiting for a listener: a connection's or a SIDR one.
#[derive(Debug)]
enum OrphanReq {
    /// With the ECE options of its MAD header.
    Req(Req, u32),
    Sidr(SidrReq),
}

impl OrphanReq {
    fn service_id(&self) -> u64 {
        match self {
            Self::Req(r, _) => r.service_id,
            Self::Sidr(r) => r.service_id,
        }
    }

    /// The requester's ID for it (to tell a resend from a new request).
    fn request_id(&self) -> u32 {
        match self {
            Self::Req(r, _) => r.local_comm_id,
            Self::Sidr(r) => r.request_id,
        }
    }
}

impl CmAgent {
    /// An agent for the port of CA `ca_guid`; `seed` picks the first
    /// communication ID and transaction ID (distinct per agent, so that a
    /// restarted peer is not mistaken for its old self).
    pub fn new(ca_guid: u64, seed: u64) -> Self {
        let mix = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ca_guid;
        Self {
            ca_guid,
            target_ack_delay: 15,
            reply_wait: cm_timeout(RESPONSE_TIMEOUT),
            conns: BTreeMap::new(),
            listening: Vec::new(),
            next_id: (mix as u32).max(1),
            id_prefix: 0,
            id_mask: u32::MAX,
            next_tid: mix >> 32 << 32,
            out: VecDeque::new(),
            events: VecDeque::new(),
            orphans: VecDeque::new(),
            listened_elsewhere: Vec::new(),
            last_now: Instant::ZERO,
        }
    }

    /// Whether a request that waits for a listener is due to be refused
    /// at `now` (the driver then brings [`CmAgent::set_listened_elsewhere`]
    /// up to date first).
    pub fn orphan_due(&self, now: Instant) -> bool {
        self.orphans.iter().any(|o| o.until <= now)
    }

    /// The ports that other contexts sharing this device's address listen
    /// on. A request for one of them that came here was steered before
    /// the address's group knew where its listener is (its members'
    /// places are measured, not assumed): it is dropped, not refused, and
    /// the requester's resend finds the listener.
    pub fn set_listened_elsewhere(&mut self, ports: &[u16]) {
        self.listened_elsewhere.clear();
        self.listened_elsewhere.extend_from_slice(ports);
    }

    /// Sets how long the agent waits for answers to its REPs and DREQs
    /// before resending (tests shorten it).
    pub fn set_reply_wait(&mut self, wait: Duration) {
        self.reply_wait = wait;
    }

    /// Accepts REQs for `service_id`.
    ///
    /// # Errors
    /// [`CmError::ServiceInUse`].
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listening.contains(&service_id) {
            return Err(CmError::ServiceInUse);
        }
        self.listening.push(service_id);
        // REQs that came a moment too early.
        let (held, rest): (VecDeque<Orphan>, VecDeque<Orphan>) =
            self.orphans.drain(..).partition(|o| o.req.service_id() == service_id);
        self.orphans = rest;
        for o in held {
            match &o.req {
                OrphanReq::Req(r, options) => self.admit(self.last_now, o.from, o.tid, r, *options),
                OrphanReq::Sidr(r) => self.on_sidr_req(self.last_now, o.from, o.tid, r),
            }
        }
        Ok(())
    }

    /// Stops accepting REQs for `service_id`.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listening.retain(|s| *s != service_id);
    }

    /// Makes every communication ID this agent hands out start with the
    /// `bits`-bit `prefix`: agents of contexts sharing one device address
    /// take their slot as prefix, so that a peer's answers (which carry
    /// our ID) can be steered to the agent that sent the request.
    pub fn set_id_prefix(&mut self, prefix: u32, bits: u32) {
        if (1..32).contains(&bits) {
            self.id_mask = u32::MAX >> bits;
            self.id_prefix = prefix << (32 - bits);
        }
    }

    /// The service IDs listened on.
    pub fn listened(&self) -> &[u64] {
        &self.listening
    }

    fn new_id(&mut self) -> u32 {
        loop {
            let id = self.id_prefix | (self.next_id & self.id_mask);
            self.next_id = self.next_id.wrapping_add(1);
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn new_tid(&mut self) -> u64 {
        let tid = self.next_tid;
        self.next_tid = self.next_tid.wrapping_add(1);
        tid
    }

    fn send(&mut self, to: IpAddr, mad: CmMad) {
        self.out.push_back((to, mad));
    }

    /// Sends `mad` and keeps it for resending after `wait`.
    fn send_reliably(&mut self, id: u32, now: Instant, mad: CmMad) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        c.retry = Some(mad);
        c.deadline = Some(now.saturating_add(c.wait));
        let peer = c.peer;
        self.send(peer, mad);
    }

    /// Sends a REQ; the answer arrives as [`CmEvent::ConnectReply`],
    /// [`CmEvent::Rejected`] or [`CmEvent::Unreachable`]. Returns the
    /// connection's local ID.
    pub fn connect(&mut self, now: Instant, a: &ConnectArgs) -> u32 {
        let id = self.new_id();
        let tid = self.next_tid;
        self.next_tid = self.next_tid.wrapping_add(1);
        // An XRC initiator's REQ, as Linux formats it: extended transport
        // type 1, and no responder resources, retry counts or SRQ (the
        // target's QP has no send queue to retry from).
        let xrc = a.transport_service_type == XRC_TRANSPORT;
        let (resp, retry, rnr) = if xrc {
            (0, 0, 0)
        } else {
            (a.qp.responder_resources, a.retry_count, a.qp.rnr_retry_count)
        };
        let req = Req {
            local_comm_id: id,
            vendor_id: a.qp.ece.vendor_id,
            service_id: a.service_id,
            local_ca_guid: self.ca_guid,
            local_qkey: 0,
            local_qpn: a.qp.qpn,
            responder_resources: resp,
            local_eecn: 0,
            initiator_depth: a.qp.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: a.response_timeout,
            transport_service_type: a.transport_service_type,
            end_to_end_flow_control: false,
            starting_psn: a.qp.starting_psn,
            local_cm_response_timeout: RESPONSE_TIMEOUT,
            retry_count: retry,
            pkey: 0xffff,
            path_mtu: a.path_mtu,
            rdc_exists: false,
            rnr_retry_count: rnr,
            max_cm_retries: a.max_cm_retries,
            srq: a.qp.srq && !xrc,
            extended_transport_type: u8::from(xrc),
            primary: a.path,
            alternate: CmPath::default(),
            sap_supported: false,
            private_data: a.private_data,
        };
        let wait = cm_timeout(a.response_timeout);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                peer: a.peer,
                remote_id: 0,
                remote_qpn: 0,
                local_qpn: a.qp.qpn,
                tid,
                retry: None,
                deadline: None,
                retries_left: a.max_cm_retries,
                wait,
                last_sent: None,
                service_id: 0,
                remote_guid: 0,
                xrc,
            },
        );
        let header = MadHeader { attr_mod: a.qp.ece.options, ..MadHeader::cm(attr::REQ, tid) };
        let mad = CmMad { header, message: CmMessage::Req(req) };
        self.send_reliably(id, now, mad);
        id
    }

    /// Accepts a [`CmEvent::ConnectRequest`] with the local QP (already
    /// moved to RTR with the request's numbers): sends the REP.
    ///
    /// # Errors
    /// [`CmError::UnknownId`], [`CmError::InvalidState`].
    pub fn accept(
        &mut self,
        now: Instant,
        id: u32,
        qp: &QpOffer,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id).ok_or(CmError::UnknownId)?;
        if c.state != State::ReqRcvd {
            return Err(CmError::InvalidState);
        }
        c.state = State::RepSent;
        c.local_qpn = qp.qpn;
        c.retries_left = DEFAULT_RETRIES;
        c.wait = self.reply_wait;
        let mut pd = [0u8; 196];
        let n = private_data.len().min(pd.len());
        pd[..n].copy_from_slice(&private_data[..n]);
        // An XRC target answers as Linux does: its QPN in the EECN field,
        // SRQ set, no initiator depth (it sends no requests).
        let (qpn, eecn, init_depth, srq) =
            if c.xrc { (0, qp.qpn, 0, true) } else { (qp.qpn, 0, qp.initiator_depth, qp.srq) };
        let rep = Rep {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: qpn,
            vendor_id: qp.ece.vendor_id,
            local_eecn: eecn,
            starting_psn: qp.starting_psn,
            responder_resources: qp.responder_resources,
            initiator_depth: init_depth,
            target_ack_delay: self.target_ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: qp.rnr_retry_count,
            srq,
            local_ca_guid: self.ca_guid,
            private_data: pd,
        };
        let header = MadHeader { attr_mod: qp.ece.options, ..MadHeader::cm(attr::REP, c.tid) };
        let mad = CmMad { header, message: CmMessage::Rep(rep) };
        c.last_sent = Some(mad);
        self.send_reliably(id, now, mad);
        Ok(())
    }

    /// Refuses a [`CmEvent::ConnectRequest`] (or a reply) with a consumer
    /// REJ carrying `private_data`; the connection is forgotten.
    ///
    /// # Errors
    /// [`CmError::UnknownId`], [`CmError::InvalidState`].
    pub fn reject(&mut self, id: u32, private_data: &[u8]) -> Result<(), CmError> {
        self.reject_for(id, rej_reason::CONSUMER_DEFINED, private_data)
    }

    /// [`CmAgent::reject`] with another reason: the consumer's (28) or
    /// "vendor option not supported" (35, `rdma_reject_ece`), the two an
    /// application may give (Linux refuses others).
    ///
    /// # Errors
    /// As [`CmAgent::reject`].
    pub fn reject_for(&mut self, id: u32, reason: u16, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conns.get(&id).ok_or(CmError::UnknownId)?;
        let message_rejected = match c.state {
            State::ReqRcvd => 0,
            State::RepRcvd => 1,
            _ => return Err(CmError::InvalidState),
        };
        let mut pd = [0u8; 148];
        let n = private_data.len().min(pd.len());
        pd[..n].copy_from_slice(&private_data[..n]);
        let rej = Rej {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            message_rejected,
            rejected_info_length: 0,
            reason,
            ari: [0; 72],
            private_data: pd,
        };
        let (peer, tid) = (c.peer, c.tid);
        self.conns.remove(&id);
        self.send(
            peer,
            CmMad { header: MadHeader::cm(attr::REJ, tid), message: CmMessage::Rej(rej) },
        );
        Ok(())
    }

    /// After a [`CmEvent::ConnectReply`], with the QP in RTS: sends the RTU
    /// and the connection is established.
    ///
    /// # Errors
    /// [`CmError::UnknownId`], [`CmError::InvalidState`].
    pub fn establish(&mut self, id: u32) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id).ok_or(CmError::UnknownId)?;
        if c.state != State::RepRcvd {
            return Err(CmError::InvalidState);
        }
        c.state = State::Established;
        let rtu =
            IdsOnly { local_comm_id: id, remote_comm_id: c.remote_id, private_data: [0; 224] };
        let mad = CmMad { header: MadHeader::cm(attr::RTU, c.tid), message: CmMessage::Rtu(rtu) };
        c.last_sent = Some(mad);
        let peer = c.peer;
        self.send(peer, mad);
        // No Established event: the caller is the one who established.
        Ok(())
    }

    /// Disconnects an established connection: sends a DREQ; the end comes
    /// as [`CmEvent::Disconnected`] (when the DREP arrives or the retries
    /// run out).
    ///
    /// # Errors
    /// [`CmError::UnknownId`], [`CmError::InvalidState`].
    pub fn disconnect(&mut self, now: Instant, id: u32) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id).ok_or(CmError::UnknownId)?;
        if !matches!(c.state, State::Established | State::RepSent) {
            return Err(CmError::InvalidState);
        }
        c.state = State::DreqSent;
        c.retries_left = DEFAULT_RETRIES;
        c.wait = self.reply_wait;
        let dreq = Dreq {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            remote_qpn: c.remote_qpn,
            private_data: [0; 220],
        };
        let mad =
            CmMad { header: MadHeader::cm(attr::DREQ, c.tid), message: CmMessage::Dreq(dreq) };
        self.send_reliably(id, now, mad);
        Ok(())
    }

    /// Disconnects every established connection (a DREQ each), as the
    /// kernel does for a process's ids when it exits. Returns how many.
    pub fn disconnect_all(&mut self, now: Instant) -> usize {
        let ids: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.state, State::Established | State::RepSent))
            .map(|(id, _)| *id)
            .collect();
        for &id in &ids {
            let _ = self.disconnect(now, id);
        }
        ids.len()
    }

    /// The connections a DREQ would end now (those
    /// [`CmAgent::disconnect_all`] ends), as another context can end them
    /// for this one (see [`Leftover`]).
    pub fn connected(&self) -> impl Iterator<Item = Leftover> + '_ {
        self.conns
            .iter()
            .filter(|(_, c)| matches!(c.state, State::Established | State::RepSent))
            .map(|(&id, c)| Leftover {
                peer: c.peer,
                local_id: id,
                remote_id: c.remote_id,
                remote_qpn: c.remote_qpn,
                tid: c.tid,
            })
    }

    /// Asks `peer` which UD QP serves `service_id` (SIDR_REQ), resending
    /// every `cm_timeout(response_timeout)` up to `retries` times. The
    /// answer comes as [`CmEvent::SidrReply`], or [`CmEvent::Unreachable`].
    pub fn sidr_request(
        &mut self,
        now: Instant,
        peer: IpAddr,
        service_id: u64,
        private_data: &[u8],
        response_timeout: u8,
        retries: u8,
    ) -> u32 {
        let id = self.new_id();
        let tid = self.new_tid();
        let mut pd = [0u8; 216];
        let n = private_data.len().min(pd.len());
        pd[..n].copy_from_slice(&private_data[..n]);
        let req = SidrReq { request_id: id, pkey: 0xffff, service_id, private_data: pd };
        let mut c = Conn::new(State::SidrReqSent, peer, 0, tid, cm_timeout(response_timeout));
        c.retries_left = retries;
        self.conns.insert(id, c);
        let mad =
            CmMad { header: MadHeader::cm(attr::SIDR_REQ, tid), message: CmMessage::SidrReq(req) };
        self.send_reliably(id, now, mad);
        id
    }

    /// Answers SIDR request `id`: `status` 0 with the serving QP and its
    /// Q_Key, or a refusal (IBTA: 1 service not supported, 2 rejected, 3
    /// no QP).
    ///
    /// # Errors
    /// [`CmError::UnknownId`], [`CmError::InvalidState`].
    pub fn sidr_reply(
        &mut self,
        id: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conns.get(&id).ok_or(CmError::UnknownId)?;
        if c.state != State::SidrReqRcvd {
            return Err(CmError::InvalidState);
        }
        let (peer, tid, request_id, service_id) = (c.peer, c.tid, c.remote_id, c.service_id);
        self.conns.remove(&id);
        let mut pd = [0u8; 136];
        let n = private_data.len().min(pd.len());
        pd[..n].copy_from_slice(&private_data[..n]);
        self.send(peer, sidr_rep_mad(tid, request_id, status, qpn, qkey, service_id, pd));
        Ok(())
    }

    /// Keeps a request for a service nobody listens on for `wait` (a
    /// listener may come), refusing it at once when too many wait.
    fn hold_orphan(
        &mut self,
        now: Instant,
        wait: Duration,
        from: IpAddr,
        tid: u64,
        req: OrphanReq,
    ) {
        let held = self
            .orphans
            .iter()
            .any(|o| o.from == from && o.tid == tid && o.req.request_id() == req.request_id());
        if held {
            return;
        }
        if self.orphans.len() < MAX_ORPHANS {
            let until = now.saturating_add(wait);
            self.orphans.push_back(Orphan { until, from, tid, req });
        } else {
            self.refuse(from, tid, &req);
        }
    }

    /// Nobody listens: REJ (invalid service ID), or SIDR_REP status 1;
    /// nothing when another context on the address listens (see
    /// [`CmAgent::set_listened_elsewhere`]).
    fn refuse(&mut self, from: IpAddr, tid: u64, req: &OrphanReq) {
        if self.listened_elsewhere.contains(&(req.service_id() as u16)) {
            return;
        }
        let mad = match req {
            OrphanReq::Req(r, _) => {
                rej_mad(tid, 0, r.local_comm_id, rej_reason::INVALID_SERVICE_ID, State::ReqRcvd)
            }
            OrphanReq::Sidr(r) => sidr_rep_mad(tid, r.request_id, 1, 0, 0, r.service_id, [0; 136]),
        };
        self.send(from, mad);
    }

    fn on_sidr_req(&mut self, now: Instant, from: IpAddr, tid: u64, req: &SidrReq) {
        let dup = self.conns.values().any(|c| {
            c.state == State::SidrReqRcvd
                && c.peer == from
                && c.tid == tid
                && c.remote_id == req.request_id
        });
        if dup {
            return;
        }
        if !self.listening.contains(&req.service_id) {
            self.hold_orphan(now, ORPHAN_WAIT, from, tid, OrphanReq::Sidr(*req));
            return;
        }
        let id = self.new_id();
        let mut c = Conn::new(State::SidrReqRcvd, from, req.request_id, tid, self.reply_wait);
        c.service_id = req.service_id;
        self.conns.insert(id, c);
        self.events.push_back(CmEvent::SidrRequest { id, from, req: Box::new(*req) });
    }

    fn on_sidr_rep(&mut self, from: IpAddr, rep: &SidrRep) {
        let Some(id) = self.by_local(rep.request_id, from) else { return };
        if self.conns[&id].state != State::SidrReqSent {
            return;
        }
        self.conns.remove(&id);
        self.events.push_back(CmEvent::SidrReply { id, rep: Box::new(*rep) });
    }

    /// The next MAD to send, and to whom.
    pub fn poll_transmit(&mut self) -> Option<(IpAddr, CmMad)> {
        self.out.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`CmAgent::handle_timeout`] must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let orphan = self.orphans.iter().map(|o| o.until).min();
        self.conns.values().filter_map(|c| c.deadline).chain(orphan).min()
    }

    /// Resends what went unanswered, gives up after the retries, and ends
    /// TimeWaits.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
        while let Some(i) = self.orphans.iter().position(|o| o.until <= now) {
            let Some(o) = self.orphans.remove(i) else { break };
            self.refuse(o.from, o.tid, &o.req);
        }
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|at| at <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else { continue };
            if c.state == State::TimeWait {
                self.conns.remove(&id);
                self.events.push_back(CmEvent::TimeWaitExit { id });
                continue;
            }
            let Some(mad) = c.retry else {
                c.deadline = None;
                continue;
            };
            if c.retries_left == 0 {
                let state = c.state;
                match state {
                    State::DreqSent => {
                        self.enter_time_wait(id, now);
                        self.events.push_back(CmEvent::Disconnected { id });
                    }
                    State::SidrReqSent => {
                        // No connection to refuse: SIDR has no REJ.
                        self.conns.remove(&id);
                        self.events.push_back(CmEvent::Unreachable { id });
                    }
                    _ => {
                        // REQ or REP unanswered: tell the peer, forget it.
                        let (peer, tid, remote) = (c.peer, c.tid, c.remote_id);
                        self.conns.remove(&id);
                        self.send(peer, rej_mad(tid, id, remote, rej_reason::TIMEOUT, state));
                        self.events.push_back(CmEvent::Unreachable { id });
                    }
                }
                continue;
            }
            c.retries_left -= 1;
            c.deadline = Some(now.saturating_add(c.wait));
            let peer = c.peer;
            self.send(peer, mad);
        }
    }

    /// `peer` answered that nothing listens on its RoCE port (an ICMP
    /// port unreachable): no CM agent is there right now. A REQ or SIDR
    /// request is sent again soon (`GONE_RETRY`, not its response
    /// timeout: a server process may be about to open the port, as
    /// qperf's server does for each test) and, once its retries are
    /// spent, ends as unreachable in a few seconds instead of about a
    /// minute (what a REQ to a host without a CM ends in, sooner: no CM
    /// refused it, so it is not a REJ). An unanswered REP ends as
    /// unreachable too, and a DREQ as done at once.
    pub fn peer_gone(&mut self, now: Instant, peer: IpAddr) {
        self.last_now = self.last_now.max(now);
        let ids: Vec<u32> =
            self.conns.iter().filter(|(_, c)| c.peer == peer).map(|(id, _)| *id).collect();
        for id in ids {
            let Some(c) = self.conns.get_mut(&id) else { continue };
            let state = c.state;
            if matches!(state, State::ReqSent | State::SidrReqSent) && c.retries_left > 0 {
                let soon = now.saturating_add(GONE_RETRY);
                c.deadline = Some(c.deadline.map_or(soon, |d| d.min(soon)));
                continue;
            }
            match state {
                State::ReqSent | State::SidrReqSent | State::RepSent => {
                    self.conns.remove(&id);
                    self.events.push_back(CmEvent::Unreachable { id });
                }
                State::DreqSent => {
                    self.enter_time_wait(id, now);
                    self.events.push_back(CmEvent::Disconnected { id });
                }
                _ => {}
            }
        }
    }

    fn enter_time_wait(&mut self, id: u32, now: Instant) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.retry = None;
            c.deadline = Some(now.saturating_add(TIME_WAIT));
        }
    }

    /// The connection a message names by our ID.
    fn by_local(&self, id: u32, peer: IpAddr) -> Option<u32> {
        self.conns.get(&id).filter(|c| c.peer == peer).map(|_| id)
    }

    /// Takes in one CM MAD from `from`.
    pub fn handle(&mut self, now: Instant, from: IpAddr, mad: &CmMad) {
        self.last_now = self.last_now.max(now);
        match &mad.message {
            CmMessage::Req(req) => self.on_req(now, from, mad.header, req),
            CmMessage::Rep(rep) => {
                self.on_rep(
                    from,
                    rep,
                    Ece { vendor_id: rep.vendor_id, options: mad.header.attr_mod },
                );
            }
            CmMessage::Rtu(rtu) => {
                if let Some(id) = self.by_local(rtu.remote_comm_id, from) {
                    self.established_by_peer(id);
                }
            }
            CmMessage::Rej(rej) => self.on_rej(from, rej),
            CmMessage::Dreq(dreq) => self.on_dreq(now, from, mad.header.tid, dreq),
            CmMessage::Drep(drep) => {
                if let Some(id) = self.by_local(drep.remote_comm_id, from)
                    && self.conns[&id].state == State::DreqSent
                {
                    self.enter_time_wait(id, now);
                    self.events.push_back(CmEvent::Disconnected { id });
                }
            }
            CmMessage::Mra(mra) => self.on_mra(now, from, mra),
            CmMessage::SidrReq(req) => self.on_sidr_req(now, from, mad.header.tid, req),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(from, rep),
            // LAP, APR: ignored (see the module doc).
            _ => {}
        }
    }

    fn on_req(&mut self, now: Instant, from: IpAddr, header: MadHeader, req: &Req) {
        let tid = header.tid;
        // A duplicate (the peer resent it): answer as before, or, while
        // the application has not answered yet, tell the peer to wait
        // longer (MRA) rather than give up after its retries.
        if let Some((&id, c)) = self
            .conns
            .iter()
            .find(|(_, c)| c.peer == from && c.remote_id == req.local_comm_id && c.tid == tid)
        {
            match c.state {
                State::RepSent => {
                    if let Some(rep) = c.last_sent {
                        self.send(from, rep);
                    }
                }
                State::ReqRcvd => {
                    let mra = Mra {
                        local_comm_id: id,
                        remote_comm_id: req.local_comm_id,
                        message_mraed: 0,
                        service_timeout: MRA_SERVICE_TIMEOUT,
                        private_data: [0; 222],
                    };
                    let mad = CmMad {
                        header: MadHeader::cm(attr::MRA, tid),
                        message: CmMessage::Mra(mra),
                    };
                    self.send(from, mad);
                }
                _ => {}
            }
            return;
        }
        if !self.listening.contains(&req.service_id) {
            // Answered before the requester's first resend.
            let wait = ORPHAN_WAIT.min(cm_timeout(req.remote_cm_response_timeout) / 2);
            self.hold_orphan(now, wait, from, tid, OrphanReq::Req(*req, header.attr_mod));
            return;
        }
        self.admit(now, from, tid, req, header.attr_mod);
    }

    /// A REQ for a service listened on: checked, and handed to the
    /// application.
    fn admit(&mut self, now: Instant, from: IpAddr, tid: u64, req: &Req, ece_options: u32) {
        // A REQ from a QP we are still connected to (the peer restarted
        // and reused the QPN): refuse it as stale and end the old
        // connection, as IBTA §12.9.8.3.1 and Linux do; the requester's
        // retry finds the way clear.
        let stale = self.conns.iter().find_map(|(&id, c)| {
            (c.peer == from
                && c.remote_qpn == req.local_qpn
                && c.remote_guid == req.local_ca_guid
                && !matches!(c.state, State::TimeWait | State::SidrReqRcvd | State::SidrReqSent))
            .then_some((id, c.state))
        });
        if let Some((old, state)) = stale {
            self.send(
                from,
                rej_mad(tid, 0, req.local_comm_id, rej_reason::STALE_CONN, State::ReqRcvd),
            );
            // Its owner hears of it as Disconnected (DREP or retries).
            if matches!(state, State::Established | State::RepSent) {
                let _ = self.disconnect(now, old);
            }
            return;
        }
        let xrc = (req.transport_service_type, req.extended_transport_type) == (XRC_TRANSPORT, 1);
        if req.transport_service_type > 1 && !xrc {
            self.send(
                from,
                rej_mad(
                    tid,
                    0,
                    req.local_comm_id,
                    rej_reason::INVALID_TRANSPORT_TYPE,
                    State::ReqRcvd,
                ),
            );
            return;
        }
        let id = self.new_id();
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                peer: from,
                remote_id: req.local_comm_id,
                remote_qpn: req.local_qpn,
                local_qpn: 0,
                tid,
                retry: None,
                deadline: None,
                retries_left: 0,
                wait: self.reply_wait,
                last_sent: None,
                service_id: 0,
                remote_guid: req.local_ca_guid,
                xrc,
            },
        );
        let ece = Ece { vendor_id: req.vendor_id, options: ece_options };
        self.events.push_back(CmEvent::ConnectRequest { id, from, req: Box::new(*req), ece });
    }

    /// The peer needs more time for our REQ (or REP): wait the service
    /// timeout it names before resending, without spending a retry.
    fn on_mra(&mut self, now: Instant, from: IpAddr, mra: &Mra) {
        let Some(id) = self.by_local(mra.remote_comm_id, from) else { return };
        let c = self.conns.get_mut(&id).expect("looked up");
        let waiting =
            matches!((c.state, mra.message_mraed), (State::ReqSent, 0) | (State::RepSent, 1));
        if waiting && c.deadline.is_some() {
            c.deadline = Some(now.saturating_add(cm_timeout(mra.service_timeout) + c.wait));
        }
    }

    fn on_rep(&mut self, from: IpAddr, rep: &Rep, ece: Ece) {
        let Some(id) = self.by_local(rep.remote_comm_id, from) else { return };
        let c = self.conns.get_mut(&id).expect("looked up");
        match c.state {
            State::ReqSent => {
                // An XRC target's QPN comes in the EECN field; the event
                // gives it as `local_qpn`, where every other reply has it.
                let mut rep = *rep;
                if c.xrc {
                    rep.local_qpn = rep.local_eecn;
                }
                c.state = State::RepRcvd;
                c.retry = None;
                c.deadline = None;
                c.remote_id = rep.local_comm_id;
                c.remote_qpn = rep.local_qpn;
                c.remote_guid = rep.local_ca_guid;
                self.events.push_back(CmEvent::ConnectReply { id, rep: Box::new(rep), ece });
            }
            // Our RTU was lost: send it again.
            State::Established => {
                if let Some(rtu) = c.last_sent {
                    let peer = c.peer;
                    self.send(peer, rtu);
                }
            }
            _ => {}
        }
    }

    fn on_rej(&mut self, from: IpAddr, rej: &Rej) {
        let Some(id) = self.by_local(rej.remote_comm_id, from) else { return };
        if matches!(self.conns[&id].state, State::ReqSent | State::RepSent | State::RepRcvd) {
            self.conns.remove(&id);
            self.events.push_back(CmEvent::Rejected {
                id,
                reason: rej.reason,
                private_data: Box::new(rej.private_data),
            });
        }
    }

    fn on_dreq(&mut self, now: Instant, from: IpAddr, tid: u64, dreq: &Dreq) {
        let Some(id) = self.by_local(dreq.remote_comm_id, from) else {
            // A DREQ for a connection we no longer know: answer anyway, so
            // the peer's side can close (IBTA §12.9.8.5).
            let drep = IdsOnly {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: [0; 224],
            };
            self.send(
                from,
                CmMad { header: MadHeader::cm(attr::DREP, tid), message: CmMessage::Drep(drep) },
            );
            return;
        };
        let c = self.conns.get_mut(&id).expect("looked up");
        let drep =
            IdsOnly { local_comm_id: id, remote_comm_id: c.remote_id, private_data: [0; 224] };
        let mad =
            CmMad { header: MadHeader::cm(attr::DREP, c.tid), message: CmMessage::Drep(drep) };
        let state = c.state;
        c.last_sent = Some(mad);
        self.send(from, mad);
        match state {
            State::Established | State::RepSent | State::DreqSent => {
                if state == State::RepSent {
                    self.events.push_back(CmEvent::Established { id });
                }
                self.enter_time_wait(id, now);
                self.events.push_back(if state == State::DreqSent {
                    CmEvent::Disconnected { id }
                } else {
                    CmEvent::DisconnectRequest { id }
                });
            }
            // Already in TimeWait: the DREP above answers the duplicate.
            _ => {}
        }
    }

    /// The passive side learns the peer is established: from the RTU, or
    /// from anything the established peer sends (a DREQ).
    fn established_by_peer(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id)
            && c.state == State::RepSent
        {
            c.state = State::Established;
            c.retry = None;
            c.deadline = None;
            self.events.push_back(CmEvent::Established { id });
        }
    }
}

/// A REJ from connection `local` (0: none) to the peer's `remote`.
fn sidr_rep_mad(
    tid: u64,
    request_id: u32,
    status: u8,
    qpn: u32,
    qkey: u32,
    service_id: u64,
    private_data: [u8; 136],
) -> CmMad {
    let rep = SidrRep {
        request_id,
        status,
        additional_info_length: 0,
        qpn,
        service_id,
        qkey,
        additional_info: [0; 72],
        private_data,
    };
    CmMad { header: MadHeader::cm(attr::SIDR_REP, tid), message: CmMessage::SidrRep(rep) }
}

fn rej_mad(tid: u64, local: u32, remote: u32, reason: u16, state: State) -> CmMad {
    let rej = Rej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: match state {
            State::ReqRcvd | State::ReqSent => 0,
            State::RepSent | State::RepRcvd => 1,
            _ => 2,
        },
        rejected_info_length: 0,
        reason,
        ari: [0; 72],
        private_data: [0; 148],
    };
    CmMad { header: MadHeader::cm(attr::REJ, tid), message: CmMessage::Rej(rej) }
}
