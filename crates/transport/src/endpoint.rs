//! The device's protocol state, sans-IO: every QP, SRQ and CQ of one
//! opened device, demux of received packets by destination QPN, the CQ
//! rings with their arming rules, and the asynchronous events. The I/O
//! layer (a driver) feeds it datagrams and the time, and takes packets,
//! deadlines and events out, as quinn-proto's `Endpoint` does for QUIC.
//!
//! Scheduling is by work, not by scanning: a QP enters the active queue when
//! something happens to it (a packet for it, a post, a modify, a timer) and
//! leaves once it has nothing left to send and its completions are on
//! their CQs. A QP with no traffic, no timer and no completion costs
//! nothing per progress pass, however many there are.

use crate::wqe::PostError;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::fastmap::FastMap;
use crate::memory::Memory;
use crate::qp::{AsyncEvent as QpEvent, Qp, Transmit};
use crate::srq::{SharedDomain, Srq};
use crate::stats::Stats;
use crate::time::Instant;
use crate::wire::{Position, RocePacket};
use crate::wqe::{Completion, WcStatus};
use crate::xrc_relay::{Held, RelayMemory, Relays};

/// The destination QPN of multicast datagrams (IBTA §10.5.2.1).
pub const MULTICAST_QPN: u32 = 0xff_ffff;
/// The General Services QP (the connection manager's MADs).
pub const GSI_QPN: u32 = 1;
/// The first QPN handed to applications (rxe starts at 17 too).
pub const FIRST_QPN: u32 = 0x11;

/// An asynchronous event of the device (`ibv_async_event`): something that
/// happened to a QP, CQ, SRQ or the port outside any work request's
/// completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    /// `IBV_EVENT_QP_FATAL`: the QP went to the error state.
    QpFatal {
        /// QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_QP_REQ_ERR`: its responder saw an invalid request.
    QpRequestError {
        /// QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_QP_ACCESS_ERR`: its responder saw an access violation.
    QpAccessError {
        /// QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_SQ_DRAINED`.
    SqDrained {
        /// QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_PORT_ACTIVE`: the device's interface is up again.
    PortActive,
    /// `IBV_EVENT_PORT_ERR`: the device's interface went down or lost the
    /// device's address.
    PortError,
    /// `IBV_EVENT_CQ_ERR`: the CQ overflowed and lost completions.
    CqError {
        /// CQ handle.
        cq: u32,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP on an SRQ went to the error
    /// state and takes no more WQEs from it.
    QpLastWqeReached {
        /// QP number.
        qpn: u32,
    },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: fewer WQEs than the armed limit are
    /// left (the limit is disarmed).
    SrqLimitReached {
        /// SRQ handle.
        srq: u32,
    },
}

/// A completion queue as the endpoint and its pollers share it: the
/// endpoint pushes completions while holding it for a moment, and an
/// application polls, arms and acknowledges it without the endpoint (so a
/// poll never waits for a progress pass, and polls of two CQs never wait
/// for each other), as a hardware CQ sits between the device and the
/// consumer.
#[derive(Debug, Clone)]
pub struct SharedCq(Arc<Mutex<CqRing>>);

impl SharedCq {
    fn new(cap: usize) -> Self {
        Self(Arc::new(Mutex::new(CqRing::new(cap))))
    }

    /// The ring, locked. A poisoned lock (a panic while holding it) is
    /// recovered: each push and pop leaves the ring consistent.
    pub fn lock(&self) -> MutexGuard<'_, CqRing> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A completion queue: its ring and its arming state.
#[derive(Debug)]
pub struct CqRing {
    ring: VecDeque<Completion>,
    cap: usize,
    /// Set when a completion found the ring full (IBV_EVENT_CQ_ERR).
    overflowed: bool,
    /// Armed by `req_notify`: `Some(solicited_only)`.
    armed: Option<bool>,
    /// Notifications raised and not yet acknowledged (`ibv_ack_cq_events`).
    unacked_events: u64,
    /// Event moderation (`ibv_modify_cq`): the notification waits for
    /// `count` completions or `period` after the first, whichever comes
    /// first.
    moderation: Option<Moderation>,
}

/// A CQ's event moderation and where it stands.
#[derive(Debug, Clone, Copy)]
struct Moderation {
    count: u16,
    period: core::time::Duration,
    /// Completions that would have notified since arming.
    seen: u16,
    /// When the first of them came.
    since: Option<Instant>,
}

impl CqRing {
    fn new(cap: usize) -> Self {
        Self {
            ring: VecDeque::with_capacity(cap),
            cap,
            overflowed: false,
            armed: None,
            unacked_events: 0,
            moderation: None,
        }
    }

    /// Sets event moderation (`ibv_modify_cq` with `IBV_CQ_ATTR_MODERATE`):
    /// an armed CQ notifies after `count` completions, or `period` after
    /// the first of them. `count` 1 and no period: every completion (the
    /// default).
    pub fn moderate(&mut self, count: u16, period: core::time::Duration) {
        self.moderation = (count > 1 || !period.is_zero()).then_some(Moderation {
            count: count.max(1),
            period,
            seen: 0,
            since: None,
        });
    }

    /// When a moderated, armed CQ's period ends (it notifies then).
    fn moderation_deadline(&self) -> Option<Instant> {
        let m = self.moderation?;
        if self.armed.is_none() || m.period.is_zero() {
            return None;
        }
        m.since.map(|t| t.saturating_add(m.period))
    }

    /// Notifies a moderated CQ whose period has ended; whether it did.
    fn moderation_due(&mut self, now: Instant) -> bool {
        if self.moderation_deadline().is_none_or(|d| d > now) {
            return false;
        }
        self.notify();
        true
    }

    /// Raises the one notification an arming allows, and disarms.
    fn notify(&mut self) {
        self.armed = None;
        self.unacked_events += 1;
        if let Some(m) = &mut self.moderation {
            (m.seen, m.since) = (0, None);
        }
    }

    /// Whether a completion was lost to a full ring.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Arms the CQ: the next completion (solicited-only: the next
    /// solicited receive or error) raises one notification.
    pub fn arm(&mut self, solicited_only: bool) {
        self.armed = Some(solicited_only);
    }

    /// Removes the completions of QP `qpn`.
    fn remove_qp(&mut self, qpn: u32) {
        self.ring.retain(|c| c.qp_num != qpn);
    }

    /// Takes the oldest completion.
    pub fn pop(&mut self) -> Option<Completion> {
        self.ring.pop_front()
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Room for completions.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Resizes the ring to `cap` entries (`ibv_resize_cq`), keeping the
    /// completions waiting. Returns false, changing nothing, when more
    /// than `cap` wait.
    pub fn resize(&mut self, cap: usize) -> bool {
        if cap < self.ring.len() {
            return false;
        }
        self.cap = cap;
        self.ring.reserve(cap.saturating_sub(self.ring.len()));
        if self.ring.capacity() > 2 * cap.max(16) {
            self.ring.shrink_to(cap);
        }
        true
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Notifications raised and not yet acknowledged.
    pub fn unacked_events(&self) -> u64 {
        self.unacked_events
    }

    /// Acknowledges `n` notifications.
    pub fn ack_events(&mut self, n: u64) {
        self.unacked_events = self.unacked_events.saturating_sub(n);
    }

    /// Queues `c`; returns `Err(())` if the ring was full (the CQ is then
    /// in error) and whether the CQ's arming asks for a notification.
    fn push(&mut self, mut c: Completion, now: Instant) -> Result<bool, ()> {
        if self.ring.len() >= self.cap {
            self.overflowed = true;
            return Err(());
        }
        c.timestamp = now.as_nanos();
        self.ring.push_back(c);
        // An armed CQ raises one event for the next completion
        // (solicited-only: a solicited receive or any error), then
        // disarms (IBTA C11-…).
        let wanted = match self.armed {
            Some(true) => (c.is_recv && c.solicited) || c.status != WcStatus::Success,
            Some(false) => true,
            None => false,
        };
        if !wanted {
            return Ok(false);
        }
        if let Some(m) = &mut self.moderation {
            m.seen = m.seen.saturating_add(1);
            m.since.get_or_insert(now);
            if m.seen < m.count {
                return Ok(false);
            }
        }
        self.notify();
        Ok(true)
    }
}

/// A QP and where its completions go.
#[derive(Debug)]
struct Slot {
    qp: Qp,
    send_cq: u32,
    recv_cq: u32,
    srq: Option<u32>,
    /// An XRC target's domain: requests name SRQs of it.
    xrcd: Option<u32>,
    /// An XRC target's SRQ for the message in progress (named by its
    /// first packet; the rest must name the same).
    xrc_msg_srq: Option<u32>,
    /// In the active queue.
    active: bool,
    /// The deadline this QP has in the timer heap (later entries for it are
    /// stale and skipped).
    armed: Option<Instant>,
}

/// A datagram for the General Services QP, kept for the connection
/// manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GsiDatagram {
    /// Sender's address.
    pub from: IpAddr,
    /// The local address it came to.
    pub to: IpAddr,
    /// The RoCE packet, BTH to ICRC.
    pub bytes: Vec<u8>,
}

/// A control datagram between the processes of a device (see
/// [`Endpoint::enable_control`]): what the driver above makes of it is its
/// own business (`ibv_open_qp` across processes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlDatagram {
    /// The QP number it was sent to (a target QP, or a number the driver
    /// listens on).
    pub dest_qpn: u32,
    /// The sender's QP number.
    pub src_qpn: u32,
    /// The device's address it came to (and came from).
    pub to: IpAddr,
    /// What it carries.
    pub body: Vec<u8>,
}

/// The protocol state of one device.
#[derive(Debug)]
pub struct Endpoint {
    qps: FastMap<u32, Slot>,
    cqs: FastMap<u32, SharedCq>,
    /// Ordered, so that limit events come out in one order every run.
    srqs: BTreeMap<u32, Srq>,
    /// Multicast groups and the UD QPs attached to each.
    mcast: FastMap<IpAddr, Vec<u32>>,
    /// QPs that may have packets to send or completions to move.
    active: VecDeque<u32>,
    /// QP deadlines, earliest first; entries that no longer match their
    /// QP's `armed` are stale.
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    events: VecDeque<DeviceEvent>,
    /// CQs to notify on their channels.
    notify: VecDeque<u32>,
    /// Completions or events moved since [`Endpoint::take_moved`].
    moved: bool,
    /// An SRQ was used since its limit was last looked at.
    srq_dirty: bool,
    /// CQs with event moderation (their periods are timers too).
    moderated: Vec<u32>,
    gsi: Option<(VecDeque<GsiDatagram>, usize)>,
    /// MADs to send from QPN 1: (destination, its UDP port, source GID
    /// index, MAD).
    gsi_out: VecDeque<(IpAddr, u16, u8, [u8; 256])>,
    /// Control datagrams kept for the driver, and how many at most.
    control: Option<(VecDeque<ControlDatagram>, usize)>,
    /// QPNs the driver holds (not to be handed out).
    held: FastMap<u32, ()>,
    /// The next PSN of QPN 1's sends.
    gsi_psn: u32,
    next_qpn: u32,
    /// QPNs handed out: `first .. end`.
    qpn_range: (u32, u32),
    next_cq: u32,
    /// XRC domains shared with other processes, and the relays to their
    /// SRQs.
    shared_xrc: SharedXrc,
    /// Messages relayed to and from other processes' SRQs.
    relays: Relays,
    /// Device-wide counters: drops before a QP is found, and the counts of
    /// destroyed QPs.
    pub stats: Stats,
}

impl Default for Endpoint {
    fn default() -> Self {
        Self::new()
    }
}

impl Endpoint {
    /// An endpoint with no objects.
    pub fn new() -> Self {
        Self {
            qps: FastMap::default(),
            cqs: FastMap::default(),
            srqs: BTreeMap::new(),
            mcast: FastMap::default(),
            active: VecDeque::new(),
            timers: BinaryHeap::new(),
            events: VecDeque::new(),
            notify: VecDeque::new(),
            moved: false,
            srq_dirty: false,
            moderated: Vec::new(),
            gsi: None,
            gsi_out: VecDeque::new(),
            control: None,
            held: FastMap::default(),
            gsi_psn: 0,
            next_qpn: FIRST_QPN,
            qpn_range: (FIRST_QPN, MULTICAST_QPN),
            next_cq: 1,
            shared_xrc: SharedXrc::default(),
            relays: Relays::default(),
            stats: Stats::default(),
        }
    }

    // ---- objects ----

    /// A QPN no live QP or SRQ has (QPNs count up and wrap, as on rxe, so
    /// a destroyed QP's number is not reused at once).
    ///
    /// Within the range [`Endpoint::set_qpn_range`] gave (the whole QPN
    /// space by default).
    pub fn alloc_qpn(&mut self) -> u32 {
        let (first, end) = self.qpn_range;
        loop {
            let q = self.next_qpn;
            self.next_qpn = if q + 1 >= end { first } else { q + 1 };
            if !self.qps.contains_key(&q)
                && !self.srqs.contains_key(&q)
                && !self.held.contains_key(&q)
            {
                return q;
            }
        }
    }

    /// Keeps QPN `qpn` (from [`Endpoint::alloc_qpn`]) from being handed
    /// out while the driver uses it for something else (the number a proxy
    /// of another process's QP is answered at).
    pub fn hold_qpn(&mut self, qpn: u32) {
        self.held.insert(qpn, ());
    }

    /// Gives back a number [`Endpoint::hold_qpn`] kept.
    pub fn release_qpn(&mut self, qpn: u32) {
        self.held.remove(&qpn);
    }

    /// Hands out QPNs from `base .. base + len` only (past QPNs 0 and 1
    /// and below the multicast QPN), the first at `base + start` (or the
    /// range's first): contexts that share one device address own
    /// disjoint ranges, so a QPN names one owner, and a context that
    /// takes over a dead one's range starts elsewhere in it, so a peer
    /// still sending to the dead one's QPs does not find new ones.
    pub fn set_qpn_range(&mut self, base: u32, len: u32, start: u32) {
        let first = base.max(FIRST_QPN);
        let end = base.saturating_add(len).min(MULTICAST_QPN);
        if first < end {
            self.qpn_range = (first, end);
            let at = base.saturating_add(start);
            self.next_qpn = if (first..end).contains(&at) { at } else { first };
        }
    }

    /// Adds a QP (numbered by [`Endpoint::alloc_qpn`]) whose completions
    /// go to `send_cq` and `recv_cq` and whose receives come from `srq`.
    pub fn add_qp(&mut self, mut qp: Qp, send_cq: u32, recv_cq: u32, srq: Option<u32>) {
        let qpn = qp.qpn();
        if srq.and_then(|id| self.srqs.get(&id)).is_some_and(|s| s.tm().is_some()) {
            qp.reserve_rendezvous();
        }
        let slot = Slot {
            qp,
            send_cq,
            recv_cq,
            srq,
            xrcd: None,
            xrc_msg_srq: None,
            active: false,
            armed: None,
        };
        self.qps.insert(qpn, slot);
        self.touch(qpn);
    }

    /// Adds an XRC target QP of domain `xrcd`: its requests' receives,
    /// PD and completions are those of the SRQ each names (of `xrcd`).
    pub fn add_xrc_target(&mut self, qp: Qp, xrcd: u32) {
        let qpn = qp.qpn();
        let none = u32::MAX;
        let slot = Slot {
            qp,
            send_cq: none,
            recv_cq: none,
            srq: None,
            xrcd: Some(xrcd),
            xrc_msg_srq: None,
            active: false,
            armed: None,
        };
        self.qps.insert(qpn, slot);
        self.touch(qpn);
    }

    /// Removes a QP (and its multicast attachments); its counters join the
    /// device's. Returns it, and the groups left with no QP attached.
    pub fn remove_qp(&mut self, qpn: u32) -> Option<(Qp, Vec<IpAddr>)> {
        let groups: Vec<IpAddr> =
            self.mcast.iter().filter(|(_, v)| v.contains(&qpn)).map(|(g, _)| *g).collect();
        let mut left = Vec::new();
        for g in groups {
            if self.detach(qpn, g) == (true, true) {
                left.push(g);
            }
        }
        let mut slot = self.qps.remove(&qpn)?;
        self.stats.accumulate(slot.qp.stats());
        self.end_xrc_message(qpn, &mut slot);
        Some((slot.qp, left))
    }

    /// An XRC target QP moved to RESET or ERR (a modify): what it had in
    /// flight for other processes' SRQs ends, so that a new connection
    /// starts clean.
    pub fn xrc_target_reset(&mut self, qpn: u32) {
        let Some(mut slot) = self.qps.remove(&qpn) else { return };
        if slot.xrcd.is_some()
            && matches!(slot.qp.attr().state, crate::QpState::Reset | crate::QpState::Error)
        {
            self.end_xrc_message(qpn, &mut slot);
        }
        self.qps.insert(qpn, slot);
    }

    /// Target QP `qpn` (`slot`) stops: a message for another process's
    /// SRQ that was coming in gives back the WQE its owner reserved
    /// (`forget_target`), or the claim made here, which kept one of the
    /// owner's WQEs; what it held for owners' answers is dropped.
    fn end_xrc_message(&mut self, qpn: u32, slot: &mut Slot) {
        let Some(xrcd) = slot.xrcd else { return };
        if !self.relays.forget_target(qpn)
            && let Some(srqn) = slot.xrc_msg_srq
            && let Some(srq) = self.shared_xrc.srqs.get(&SharedXrc::key(xrcd, srqn))
            && let Some(claims) = srq.shared()
        {
            claims.release();
        }
        slot.xrc_msg_srq = None;
    }

    /// The QP numbered `qpn`.
    pub fn qp(&self, qpn: u32) -> Option<&Qp> {
        self.qps.get(&qpn).map(|s| &s.qp)
    }

    /// The QP numbered `qpn`, to change (post, modify): it becomes active,
    /// so whatever the change gives it to send leaves on the next pass.
    pub fn qp_mut(&mut self, qpn: u32) -> Option<&mut Qp> {
        self.touch(qpn);
        self.qps.get_mut(&qpn).map(|s| &mut s.qp)
    }

    /// Puts a completion made outside the endpoint (a raw packet QP's) on
    /// CQ `cq`, with the notification or CQ error that follows.
    pub fn complete(&mut self, cq: u32, c: Completion, now: Instant) {
        self.moved = true;
        Self::push_completion(&self.cqs, &mut self.notify, &mut self.events, cq, c, now);
    }

    /// Takes the completions of QP `qpn` (not the endpoint's: a raw
    /// packet QP's) out of CQs `cqs`.
    pub fn purge_cq_completions(&mut self, cqs: [u32; 2], qpn: u32) {
        for id in cqs {
            if let Some(cq) = self.cqs.get(&id) {
                cq.lock().remove_qp(qpn);
            }
        }
    }

    /// Takes QP `qpn`'s completions out of its CQs, when it is reset: a
    /// QP that works again after a reset must not have its old
    /// completions (flushed WRs of the error that preceded the reset)
    /// polled as its new ones (mlx5 clears them likewise; rdma-core's
    /// tests reset QPs and run traffic again).
    pub fn purge_completions(&mut self, qpn: u32) {
        let Some(slot) = self.qps.get(&qpn) else { return };
        for id in [slot.send_cq, slot.recv_cq] {
            if let Some(cq) = self.cqs.get(&id) {
                cq.lock().remove_qp(qpn);
            }
        }
    }

    /// Every live QP, in no particular order.
    pub fn qps(&self) -> impl Iterator<Item = &Qp> {
        self.qps.values().map(|s| &s.qp)
    }

    /// Live QPs.
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    /// Creates a CQ of `cap` entries; returns its handle.
    pub fn create_cq(&mut self, cap: usize) -> u32 {
        let id = self.next_cq;
        self.next_cq += 1;
        self.cqs.insert(id, SharedCq::new(cap));
        id
    }

    /// Destroys a CQ (its completions are dropped).
    pub fn destroy_cq(&mut self, id: u32) -> bool {
        self.cqs.remove(&id).is_some()
    }

    /// CQ `id`, to poll, arm or acknowledge (clone it to do so without
    /// the endpoint).
    pub fn cq(&self, id: u32) -> Option<&SharedCq> {
        self.cqs.get(&id)
    }

    /// Each QP's number, send and receive CQ (`u32::MAX` for an XRC
    /// target's) and SRQ.
    pub fn qp_links(&self) -> impl Iterator<Item = (u32, u32, u32, Option<u32>)> + '_ {
        self.qps.iter().map(|(qpn, s)| (*qpn, s.send_cq, s.recv_cq, s.srq))
    }

    /// The live SRQs with their handles.
    pub fn srqs(&self) -> impl Iterator<Item = (u32, &Srq)> + '_ {
        self.srqs.iter().map(|(id, s)| (*id, s))
    }

    /// The live CQs' handles.
    pub fn cq_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.cqs.keys().copied()
    }

    /// Live CQs.
    pub fn cq_count(&self) -> usize {
        self.cqs.len()
    }

    /// Adds an SRQ; returns its handle, which is also its SRQ number
    /// (`ibv_get_srq_num`, what an XRCETH names). It comes from the QPN
    /// range, so that it is unique on a device that several contexts
    /// share, as their QPNs are: an initiator naming another context's
    /// XRC SRQ can never reach this one's by a coincidence of numbers.
    pub fn add_srq(&mut self, srq: Srq) -> u32 {
        let id = self.alloc_qpn();
        self.srqs.insert(id, srq);
        id
    }

    /// Shares XRC domain `xrcd` with other processes of the device: its
    /// target QPs here take messages for the other members' SRQs that
    /// `domain` finds, and relay them (see [`crate::xrc_relay`]); its
    /// SRQs here should be made [`Srq::set_shared`].
    pub fn share_xrcd(&mut self, xrcd: u32, domain: Arc<dyn SharedDomain>) {
        self.shared_xrc.domains.insert(xrcd, domain);
    }

    /// The UDP port the device receives on (RoCEv2's 4791 unless told):
    /// where relays to the other processes of the device go.
    pub fn set_local_port(&mut self, port: u16) {
        self.relays.port = port;
    }

    /// Sets the secret that the relay datagrams between the processes of
    /// this device end with (see [`crate::xrc_relay`]): one that only
    /// those processes can read, so that no other sender can forge them.
    pub fn set_relay_secret(&mut self, secret: u64) {
        self.relays.set_secret(secret);
    }

    /// Stops sharing XRC domain `xrcd` (its last handle here closed).
    pub fn unshare_xrcd(&mut self, xrcd: u32) {
        self.shared_xrc.domains.remove(&xrcd);
        self.shared_xrc.srqs.retain(|k, _| (k >> 32) as u32 != xrcd);
    }

    /// Removes an SRQ.
    pub fn remove_srq(&mut self, id: u32) -> Option<Srq> {
        self.srqs.remove(&id)
    }

    /// SRQ `id`.
    pub fn srq(&self, id: u32) -> Option<&Srq> {
        self.srqs.get(&id)
    }

    /// SRQ `id`, to post to or modify. Its limit event is looked at on the
    /// next pass.
    pub fn srq_mut(&mut self, id: u32) -> Option<&mut Srq> {
        self.srq_dirty = true;
        self.srqs.get_mut(&id)
    }

    /// Runs tag matching list operations on SRQ `id` (`ibv_post_srq_ops`),
    /// in order, writing each ADD's handle to `handles` (same index); their
    /// completions go to the SRQ's CQ.
    ///
    /// # Errors
    /// The index of the first operation not run and why:
    /// [`PostError::InvalidOpcode`] (EINVAL) if the SRQ is no tag matching
    /// one, [`PostError::TooManySge`] for an ADD of more than one SGE,
    /// [`PostError::QueueFull`] (ENOMEM) for an ADD to a full list.
    pub fn post_srq_ops(
        &mut self,
        now: Instant,
        id: u32,
        ops: &[crate::tm::OpsWr],
        handles: &mut [Option<u32>],
    ) -> Result<(), (usize, PostError)> {
        let Some(list) = self.srqs.get_mut(&id).and_then(Srq::tm_mut) else {
            return Err((0, PostError::InvalidOpcode));
        };
        let cq = list.cq();
        for (i, op) in ops.iter().enumerate() {
            let (h, c) = list.post(op).map_err(|e| (i, e))?;
            if let Some(slot) = handles.get_mut(i) {
                *slot = h;
            }
            if let Some(c) = c {
                Self::push_completion(&self.cqs, &mut self.notify, &mut self.events, cq, c, now);
                self.moved = true;
            }
        }
        Ok(())
    }

    /// Live SRQs.
    pub fn srq_count(&self) -> usize {
        self.srqs.len()
    }

    // ---- multicast ----

    /// Attaches UD QP `qpn` to `group`. Returns whether the group is new
    /// (the driver joins it then).
    pub fn attach(&mut self, qpn: u32, group: IpAddr) -> bool {
        let first = !self.mcast.contains_key(&group);
        let v = self.mcast.entry(group).or_default();
        if !v.contains(&qpn) {
            v.push(qpn);
        }
        first
    }

    /// Detaches `qpn` from `group`: `(was attached, group now empty)` (the
    /// driver leaves an empty group).
    pub fn detach(&mut self, qpn: u32, group: IpAddr) -> (bool, bool) {
        let Some(v) = self.mcast.get_mut(&group) else { return (false, false) };
        let before = v.len();
        v.retain(|&q| q != qpn);
        let found = v.len() != before;
        let empty = v.is_empty();
        if empty {
            self.mcast.remove(&group);
        }
        (found, empty)
    }

    /// Groups joined, and attachments of `group`.
    pub fn mcast_counts(&self, group: IpAddr) -> (usize, usize) {
        (self.mcast.len(), self.mcast.get(&group).map_or(0, Vec::len))
    }

    // ---- the General Services QP ----

    /// Keeps up to `depth` datagrams to QPN 1 for [`Endpoint::poll_gsi`]
    /// (the connection manager); without this they are dropped as for an
    /// unknown QPN.
    pub fn enable_gsi(&mut self, depth: usize) {
        self.gsi = Some((VecDeque::new(), depth));
    }

    /// The oldest datagram to QPN 1 not yet taken.
    pub fn poll_gsi(&mut self) -> Option<GsiDatagram> {
        self.gsi.as_mut()?.0.pop_front()
    }

    /// Queues a MAD to send from QPN 1 to the GSI of `dst` at UDP port
    /// `dst_port` (4791 but in tests: a UD SEND Only with Q_Key
    /// 0x80010000, as every CM implementation expects), from local GID
    /// `sgid_index`; it leaves with the next [`Endpoint::poll_transmit`].
    pub fn send_gsi(&mut self, dst: IpAddr, dst_port: u16, sgid_index: u8, mad: &[u8; 256]) {
        self.gsi_out.push_back((dst, dst_port, sgid_index, *mad));
    }

    /// Keeps up to `depth` control datagrams for [`Endpoint::poll_control`]:
    /// relay datagrams of the control kind, from the device's own address
    /// to itself, to an XRC target QP here or to a number no QP or SRQ
    /// here has. Without this they are dropped.
    pub fn enable_control(&mut self, depth: usize) {
        if self.control.is_none() {
            self.control = Some((VecDeque::new(), depth));
        }
    }

    /// The oldest control datagram not yet taken.
    pub fn poll_control(&mut self) -> Option<ControlDatagram> {
        self.control.as_mut()?.0.pop_front()
    }

    /// Sends `body` as a control datagram from QPN `src_qpn` to QPN
    /// `dest_qpn` of the device at `to` (its own address), from GID
    /// `sgid_index`.
    pub fn send_control(
        &mut self,
        (dest_qpn, src_qpn): (u32, u32),
        to: IpAddr,
        sgid_index: u8,
        body: &[u8],
    ) {
        self.relays.control(dest_qpn, src_qpn, to, sgid_index, body);
    }

    /// Keeps a control datagram (`pkt`, to QPN `qpn`); false if it is none.
    fn control_in(&mut self, qpn: u32, to: IpAddr, pkt: &RocePacket<&[u8]>, body: &[u8]) -> bool {
        let Some(body) = Relays::control_body(body) else { return false };
        let Some((q, depth)) = &mut self.control else { return false };
        let src_qpn = pkt.deth().map_or(0, |d| d.src_qpn());
        if q.len() < *depth {
            q.push_back(ControlDatagram { dest_qpn: qpn, src_qpn, to, body: body.to_vec() });
            self.moved = true;
        } else {
            self.stats.drop(crate::stats::DropReason::Malformed);
        }
        true
    }

    /// Builds the next queued MAD into `buf`.
    fn poll_gsi_transmit(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        use crate::wire::{BthRepr, DethRepr, Opcode, RocePacketRepr};
        let &(dst, dst_port, sgid_index, mad) = self.gsi_out.front()?;
        let repr = RocePacketRepr {
            bth: BthRepr {
                opcode: Opcode::UD_SEND_ONLY,
                ack_req: true,
                pkey: 0xffff,
                dest_qpn: GSI_QPN,
                psn: crate::wire::Psn::new(self.gsi_psn),
                ..BthRepr::default()
            },
            deth: Some(DethRepr { qkey: crate::wire::cm::CM_QKEY, src_qpn: GSI_QPN }),
            ..RocePacketRepr::default()
        };
        let total = repr.packet_len(mad.len());
        if buf.len() < total {
            return None;
        }
        let hl = repr.emit_headers(buf).ok()?;
        buf[hl..hl + mad.len()].copy_from_slice(&mad);
        self.gsi_out.pop_front();
        self.gsi_psn = (self.gsi_psn + 1) & 0xff_ffff;
        self.stats.sent_pkts += 1;
        Some(Transmit {
            len: total,
            dst,
            dst_port,
            src_port: crate::wire::udp::rxe_ud_sport(GSI_QPN),
            sgid_index,
            traffic_class: 0,
        })
    }

    // ---- driving ----

    /// Handles a received packet whose ICRC the driver has checked: to
    /// every QP attached to a multicast group, to QPN 1's agent, or to the
    /// QP it names.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        from: IpAddr,
        to: IpAddr,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
    ) {
        let qpn = pkt.bth().dest_qpn();
        if qpn == MULTICAST_QPN && to.is_multicast() {
            let n = self.mcast.get(&to).map_or(0, Vec::len);
            for i in 0..n {
                let q = self.mcast[&to][i];
                self.deliver(now, q, from, to, pkt, mem);
            }
            return;
        }
        if qpn == GSI_QPN
            && let Some((q, depth)) = &mut self.gsi
        {
            if q.len() < *depth {
                q.push_back(GsiDatagram { from, to, bytes: pkt.as_bytes().to_vec() });
            } else {
                self.stats.drop_unknown_qpn += 1;
            }
            return;
        }
        self.deliver(now, qpn, from, to, pkt, mem);
    }

    fn deliver(
        &mut self,
        now: Instant,
        qpn: u32,
        from: IpAddr,
        to: IpAddr,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
    ) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            if let Some(body) = self.relays.body(pkt, from, to)
                && self.control_in(qpn, to, pkt, body)
            {
                return;
            }
            if !self.relayed_in(now, qpn, from, to, pkt, mem) {
                self.stats.drop_unknown_qpn += 1;
            }
            return;
        };
        if let Some(xrcd) = slot.xrcd {
            if Relays::is_relay(pkt, from, to) {
                let Some(body) = self.relays.body(pkt, from, to) else {
                    // Not from a process of this device.
                    self.stats.drop(crate::stats::DropReason::Malformed);
                    return;
                };
                if self.control_in(qpn, to, pkt, body) {
                    return;
                }
                // An owner's answer to this target's request: the packets
                // held for it run now, in order.
                if let Some(held) = self.relays.answered(now, qpn, body) {
                    self.run_held(now, qpn, held, mem);
                }
                return;
            }
            if self.relays.is_waiting(qpn) {
                let psn = pkt.bth().psn().value();
                let held = Held { psn, from, to, bytes: pkt.as_bytes().to_vec() };
                if !self.relays.hold(qpn, psn, held) {
                    self.stats.drop(crate::stats::DropReason::OutOfSequence);
                }
                return;
            }
            // An XRC target: the SRQ the request names, of its domain.
            let srqn = pkt.xrceth().map(|x| x.xrc_srqn());
            // A message keeps the SRQ its first packet named. Only packets
            // the responder takes in sequence count: a duplicate or one
            // that ran ahead of a loss names another message's SRQ.
            let position = pkt.info().position;
            let psn = pkt.bth().psn();
            let in_sequence = psn == slot.qp.expected_psn();
            let continues = matches!(position, Position::Middle | Position::Last);
            if in_sequence && continues && slot.xrc_msg_srq.is_some_and(|s| Some(s) != srqn) {
                self.stats.drop(crate::stats::DropReason::Malformed);
                return;
            }
            let srq = srqn.and_then(|n| self.srqs.get_mut(&n));
            let Some((srq, xrc)) =
                srq.and_then(|s| s.xrc().filter(|x| x.xrcd == xrcd).map(|x| (s, x)))
            else {
                let relay = (&mut self.shared_xrc, &mut self.relays);
                if let Some(n) = srqn
                    && let Some(relayed) =
                        SharedXrc::relay_out(relay, slot, (now, from, to), (xrcd, n), pkt, mem)
                {
                    match relayed {
                        Relayed::Messages(n) => self.stats.xrc_relayed_out += n,
                        Relayed::Asked => self.stats.xrc_accesses_asked += 1,
                    }
                    self.touch(qpn);
                    return;
                }
                // No such SRQ in its domain (or no XRCETH): dropped, as
                // rxe's XRC patches do; the requester retries and fails.
                self.stats.drop(crate::stats::DropReason::Malformed);
                return;
            };
            self.srq_dirty = true;
            slot.qp.set_xrc_pd(xrc.pd);
            slot.qp.handle_datagram_srq(now, from, to, pkt, mem, srq);
            if in_sequence && slot.qp.expected_psn() != psn {
                // Taken: the message now in progress is this one's.
                match position {
                    Position::First => slot.xrc_msg_srq = srqn,
                    Position::Last | Position::Only => slot.xrc_msg_srq = None,
                    Position::Middle => {}
                }
            }
            // Its receive completions are the SRQ's, for the SRQ's CQ.
            slot.qp.publish_gauge();
            while let Some(c) = slot.qp.poll_completion() {
                Self::push_completion(
                    &self.cqs,
                    &mut self.notify,
                    &mut self.events,
                    xrc.cq,
                    c,
                    now,
                );
                self.moved = true;
            }
            self.touch(qpn);
            return;
        }
        match slot.srq.and_then(|id| self.srqs.get_mut(&id)) {
            Some(srq) => {
                self.srq_dirty = true;
                slot.qp.handle_datagram_srq(now, from, to, pkt, mem, srq);
            }
            None => slot.qp.handle_datagram(now, from, to, pkt, mem),
        }
        self.touch(qpn);
    }

    /// The next packet to send, written into `buf` (BTH to ICRC, the ICRC
    /// left for the driver). Packets of one QP come one after the other,
    /// so runs to one peer can leave as one GSO send. `None` when no
    /// active QP has anything to send; by then every completion is on its
    /// CQ.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        if !self.gsi_out.is_empty()
            && let Some(t) = self.poll_gsi_transmit(buf)
        {
            return Some(t);
        }
        if self.relays.has_output()
            && let Some(t) = self.relays.poll_transmit(buf)
        {
            self.stats.sent_pkts += 1;
            return Some(t);
        }
        while let Some(&qpn) = self.active.front() {
            if let Some(slot) = self.qps.get_mut(&qpn) {
                // An XRC target's READ responses may carry data another
                // process's memory answered with.
                let t = if slot.xrcd.is_some() {
                    let through = RelayMemory { inner: mem, relays: &self.relays };
                    slot.qp.poll_transmit(now, &through, buf)
                } else {
                    slot.qp.poll_transmit(now, mem, buf)
                };
                if t.is_some() {
                    return t;
                }
                self.settle(qpn, now);
            }
            self.active.pop_front();
        }
        self.collect_srq_events();
        None
    }

    /// The earliest deadline at which [`Endpoint::handle_timeout`] must run.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let cq = match (self.moderated_deadline(), self.relays.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        while let Some(&Reverse((t, qpn))) = self.timers.peek() {
            if self.qps.get(&qpn).is_some_and(|s| s.armed == Some(t)) {
                return Some(cq.map_or(t, |c| c.min(t)));
            }
            self.timers.pop();
        }
        cq
    }

    /// Sets CQ `id`'s event moderation (see [`CqRing::moderate`]).
    pub fn moderate_cq(&mut self, id: u32, count: u16, period: core::time::Duration) -> bool {
        let Some(cq) = self.cqs.get(&id) else { return false };
        cq.lock().moderate(count, period);
        if !self.moderated.contains(&id) {
            self.moderated.push(id);
        }
        true
    }

    /// The earliest end of a moderated CQ's period.
    fn moderated_deadline(&self) -> Option<Instant> {
        let live = self.moderated.iter().filter_map(|id| self.cqs.get(id));
        live.filter_map(|c| c.lock().moderation_deadline()).min()
    }

    /// [`Endpoint::poll_timeout`] without dropping stale heap entries (a
    /// scan of the heap: for tests and diagnostics, not a hot path).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers
            .iter()
            .filter(|Reverse((t, q))| self.qps.get(q).is_some_and(|s| s.armed == Some(*t)))
            .map(|Reverse((t, _))| *t)
            .chain(self.relays.next_deadline())
            .min()
    }

    /// Runs the timers due at `now`. Returns how many QPs had one.
    pub fn handle_timeout(&mut self, now: Instant) -> usize {
        let mut fired = 0;
        if self.relays.next_deadline().is_some_and(|d| d <= now) {
            // Requests to other processes unanswered: asked again, or,
            // their owners gone, the connections that wait for them end.
            let mut gave_up = Vec::new();
            self.relays.ask_again(now, &mut gave_up);
            for qpn in gave_up {
                if let Some(slot) = self.qps.get_mut(&qpn) {
                    slot.qp.responder_abort();
                    fired += 1;
                }
                self.touch(qpn);
            }
        }
        self.moderated.retain(|id| self.cqs.contains_key(id));
        for &id in &self.moderated {
            if self.cqs.get(&id).is_some_and(|c| c.lock().moderation_due(now)) {
                self.notify.push_back(id);
                self.moved = true;
            }
        }
        while let Some(&Reverse((t, qpn))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(slot) = self.qps.get_mut(&qpn) else { continue };
            if slot.armed != Some(t) {
                continue;
            }
            slot.armed = None;
            match slot.qp.poll_timeout() {
                Some(d) if d <= now => {
                    slot.qp.handle_timeout(now);
                    fired += 1;
                    self.touch(qpn);
                }
                Some(d) => {
                    slot.armed = Some(d);
                    self.timers.push(Reverse((d, qpn)));
                }
                None => {}
            }
        }
        fired
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<DeviceEvent> {
        self.events.pop_front()
    }

    /// Raises a device event (the port's state, which the driver watches).
    pub fn push_event(&mut self, e: DeviceEvent) {
        self.events.push_back(e);
        self.moved = true;
    }

    /// The next CQ whose arming asked for a notification on its channel.
    pub fn poll_cq_notify(&mut self) -> Option<u32> {
        self.notify.pop_front()
    }

    /// QPs on the active queue (those the next pass looks at).
    pub fn active_len(&self) -> usize {
        self.active.len()
    }

    /// Whether completions or events moved since the last call.
    pub fn take_moved(&mut self) -> bool {
        std::mem::take(&mut self.moved)
    }

    // ---- internals ----

    /// Puts `qpn` on the active queue.
    fn touch(&mut self, qpn: u32) {
        if let Some(slot) = self.qps.get_mut(&qpn)
            && !slot.active
        {
            slot.active = true;
            self.active.push_back(qpn);
        }
    }

    /// A QP with nothing more to send: its completions and events go out,
    /// its timer into the heap, and it leaves the active queue.
    fn settle(&mut self, qpn: u32, now: Instant) {
        let Some(slot) = self.qps.get_mut(&qpn) else { return };
        slot.active = false;
        // Slots freed before their completions can be seen.
        slot.qp.publish_gauge();
        // A tag matching SRQ's receives complete on its own CQ.
        let tm_cq = slot.srq.and_then(|s| self.srqs.get(&s)).and_then(|s| s.tm()).map(|l| l.cq());
        let recv_cq = tm_cq.unwrap_or(slot.recv_cq);
        while let Some(c) = slot.qp.poll_completion() {
            self.moved = true;
            let id = if c.is_recv { recv_cq } else { slot.send_cq };
            Self::push_completion(&self.cqs, &mut self.notify, &mut self.events, id, c, now);
        }
        while let Some(e) = slot.qp.poll_event() {
            self.moved = true;
            self.events.push_back(match e {
                QpEvent::QpFatal => DeviceEvent::QpFatal { qpn },
                QpEvent::QpRequestError => DeviceEvent::QpRequestError { qpn },
                QpEvent::QpAccessError => DeviceEvent::QpAccessError { qpn },
                QpEvent::SqDrained => DeviceEvent::SqDrained { qpn },
                QpEvent::LastWqeReached => DeviceEvent::QpLastWqeReached { qpn },
            });
        }
        match slot.qp.poll_timeout() {
            // A later deadline than the armed one: that entry fires first
            // and re-arms at this one.
            Some(d) if slot.armed.is_none_or(|a| d < a) => {
                slot.armed = Some(d);
                self.timers.push(Reverse((d, qpn)));
            }
            Some(_) => {}
            // No timer any more: the heap's entry is stale.
            None => slot.armed = None,
        }
    }

    /// Puts `c` on CQ `id` (if it is one), with the notification or the
    /// CQ error event that follows.
    fn push_completion(
        cqs: &FastMap<u32, SharedCq>,
        notify: &mut VecDeque<u32>,
        events: &mut VecDeque<DeviceEvent>,
        id: u32,
        c: Completion,
        now: Instant,
    ) {
        let Some(cq) = cqs.get(&id) else { return };
        let mut cq = cq.lock();
        let was = cq.overflowed;
        match cq.push(c, now) {
            Ok(true) => notify.push_back(id),
            Ok(false) => {}
            Err(()) if !was => events.push_back(DeviceEvent::CqError { cq: id }),
            Err(()) => {}
        }
    }

    /// Runs the packets target `qpn` held for an owner's answer, in
    /// order (from the first that needs another answer, they are held
    /// again behind its request).
    fn run_held(&mut self, now: Instant, qpn: u32, held: VecDeque<Held>, mem: &dyn Memory) {
        for h in held {
            if let Ok(pkt) = RocePacket::new_checked(&h.bytes[..]) {
                self.deliver(now, qpn, h.from, h.to, &pkt, mem);
            }
        }
    }

    /// A relay datagram from another process's target QP for SRQ `srqn`
    /// here (see [`crate::xrc_relay`]): a message's chunk, written into
    /// the WQE its claim kept and completed on the SRQ's CQ, or a request
    /// to run a memory access, answered. False if `pkt` is no relay
    /// datagram to a shared-domain SRQ here.
    fn relayed_in(
        &mut self,
        now: Instant,
        srqn: u32,
        from: IpAddr,
        to: IpAddr,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
    ) -> bool {
        if !Relays::is_relay(pkt, from, to) {
            return false;
        }
        let Some(srq) = self.srqs.get_mut(&srqn) else { return false };
        let (Some(xrc), Some(_)) = (srq.xrc(), srq.shared()) else { return false };
        let Some(body) = self.relays.body(pkt, from, to) else {
            // Not from a process of this device: forged.
            self.stats.drop(crate::stats::DropReason::Malformed);
            return true;
        };
        if Relays::is_request(body) {
            match self.relays.serve(now, (srqn, srq), xrc.pd, to, body, mem) {
                Ok(()) => self.stats.xrc_accesses_served += 1,
                Err(()) => self.stats.drop(crate::stats::DropReason::Malformed),
            }
        } else if self.relays.arrived(srqn, srq, xrc.pd, body, mem).is_err() {
            self.stats.drop(crate::stats::DropReason::Malformed);
        }
        self.srq_dirty = true;
        self.give_back(now);
        // Relayed messages completed (or ended in error by a reservation
        // that found them open) go to their SRQs' CQs.
        while let Some((n, c)) = self.relays.finished.pop_front() {
            let Some(cq) = self.srqs.get(&n).and_then(Srq::xrc).map(|x| x.cq) else { continue };
            Self::push_completion(&self.cqs, &mut self.notify, &mut self.events, cq, c, now);
            self.stats.xrc_relayed_in += 1;
            self.moved = true;
        }
        true
    }

    /// Puts back into their SRQs the WQEs reserved for messages that
    /// never came (with their claims); one that no longer fits (the queue
    /// filled meanwhile) completes flushed.
    fn give_back(&mut self, now: Instant) {
        for (srqn, cur) in std::mem::take(&mut self.relays.give_back) {
            let Some(srq) = self.srqs.get_mut(&srqn) else { continue };
            if srq.put_back(&cur) {
                if let Some(claims) = srq.shared() {
                    claims.release();
                }
                continue;
            }
            let Some(cq) = srq.xrc().map(|x| x.cq) else { continue };
            let c =
                Completion::new(cur.wr_id, WcStatus::WrFlushErr, crate::WcOpcode::Recv, 0, true);
            Self::push_completion(&self.cqs, &mut self.notify, &mut self.events, cq, c, now);
            self.moved = true;
        }
    }

    fn collect_srq_events(&mut self) {
        if !std::mem::take(&mut self.srq_dirty) {
            return;
        }
        for (&id, srq) in &mut self.srqs {
            if srq.take_limit_event() {
                self.moved = true;
                self.events.push_back(DeviceEvent::SrqLimitReached { srq: id });
            }
        }
    }
}

/// What an endpoint keeps for the XRC domains it shares with other
/// processes (see [`crate::xrc_relay`]).
#[derive(Debug, Default)]
struct SharedXrc {
    /// The shared domains, by domain.
    domains: FastMap<u32, Arc<dyn SharedDomain>>,
    /// Other processes' SRQs that target QPs here named, by
    /// [`SharedXrc::key`].
    srqs: FastMap<u64, Srq>,
}

impl SharedXrc {
    /// The key of SRQ `srqn` of domain `xrcd`.
    fn key(xrcd: u32, srqn: u32) -> u64 {
        u64::from(xrcd) << 32 | u64::from(srqn)
    }

    /// A request to target QP `slot` (of domain `xrcd`) naming SRQ `srqn`
    /// that no SRQ here has: if another process of a shared domain has
    /// it, the request is taken for a relay (`Some`: what became of it);
    /// else `None`.
    fn relay_out(
        (this, relays): (&mut Self, &mut Relays),
        slot: &mut Slot,
        (now, from, to): (Instant, IpAddr, IpAddr),
        (xrcd, srqn): (u32, u32),
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
    ) -> Option<Relayed> {
        let domain = this.domains.get(&xrcd)?;
        let key = Self::key(xrcd, srqn);
        if this.srqs.get(&key).is_some_and(|s| !s.shared().is_some_and(|c| c.alive())) {
            // Destroyed (or its owner gone) since: looked up afresh.
            this.srqs.remove(&key);
        }
        let srq = match this.srqs.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let found = domain.find(srqn)?;
                let xrc = crate::srq::XrcSrq { xrcd, pd: crate::srq::RELAY_PD, cq: 0 };
                e.insert(Srq::new_relay(xrc, found))
            }
        };
        let position = pkt.info().position;
        let psn = pkt.bth().psn();
        let in_sequence = psn == slot.qp.expected_psn();
        let qpn = slot.qp.qpn();
        let sgid_index = slot.qp.attr().path.map_or(0, |p| p.sgid_index);
        // An access to the owner's memory, or a WQE of its SRQ: the owner
        // takes it first, and the packet waits for its answer.
        let granted = relays.grant(qpn, psn.value());
        if let Some(acc) = slot.qp.foreign_access(pkt, granted.flatten())
            && !relays.can_answer(qpn, psn.value(), &acc)
            && let Some(owner) = srq.shared().filter(|o| o.alive())
        {
            let held = Held { psn: psn.value(), from, to, bytes: pkt.as_bytes().to_vec() };
            let at = (qpn, psn.value(), srqn);
            relays.ask(now, owner.clone(), at, (to, sgid_index), (acc, pkt.payload()), held);
            return Some(Relayed::Asked);
        }
        slot.qp.set_xrc_pd(crate::srq::RELAY_PD);
        srq.set_grant(granted);
        let through = RelayMemory { inner: mem, relays };
        slot.qp.handle_datagram_srq(now, from, to, pkt, &through, srq);
        // The grant taken (set, and no longer there): the message has the
        // owner's WQE.
        if srq.set_grant(None).is_none() && matches!(granted, Some(Some(_))) {
            relays.took_reserved(qpn, srqn, to, sgid_index);
        }
        relays.answer_used(qpn);
        relays.prune_reads(qpn, |psn, len| slot.qp.read_still_needed(psn, len));
        if in_sequence && slot.qp.expected_psn() != psn {
            match position {
                Position::First => slot.xrc_msg_srq = Some(srqn),
                Position::Last | Position::Only => slot.xrc_msg_srq = None,
                Position::Middle => {}
            }
        }
        slot.qp.publish_gauge();
        let mut relayed = 0;
        while let Some(c) = slot.qp.poll_completion() {
            relays.completed(srqn, to, sgid_index, c);
            relayed += 1;
        }
        Some(Relayed::Messages(relayed))
    }
}

/// What became of a request a target QP took for another process's SRQ.
enum Relayed {
    /// It ran; this many messages completed, now on their way to the
    /// owner.
    Messages(u64),
    /// It waits for the owner to run its memory access.
    Asked,
}
