//! A queue pair: its state machine, work queues, and the three engines
//! that drive it (requester, responder, completer), after rxe's split.
//!
//! The QP is sans-IO: [`Qp::handle_packet`] takes a received packet,
//! [`Qp::poll_transmit`] writes the next packet to send into a caller's
//! buffer, [`Qp::poll_timeout`] / [`Qp::handle_timeout`] run the timers, and
//! [`Qp::poll_completion`] hands out completions in order.

mod ack_hold;
pub mod attr;
mod completer;
mod recovery;
mod requester;
mod responder;
mod tag_matching;
mod ud;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use core::net::IpAddr;

use uroce_wire::udp::{ROCE_V2_PORT, rxe_connected_sport};
use uroce_wire::{Psn, RocePacket, Transport};

use crate::memory::Memory;
use crate::queue::{Internal, RecvCur, RecvQueue, SendQueue, SendWqe};
use crate::srq::Srq;
use crate::stats::{DropReason, Stats};
pub use crate::wqe::PostError;
use crate::wqe::{Completion, FlushOp, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus, WrOpcode};
use crate::{Instant, RC_MAX_RD_ATOMIC};
use attr::{AttrMask, ModifyError, QpAttr, QpState, QpType, check_transition};

pub(crate) use responder::{ForeignAccess, RespState};

/// The partition key every uroce port has at index 0 (full membership
/// default P_Key, as rxe).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// NAK-driven go-backs without progress that cost one transport retry.
pub(crate) const NAK_RETRIES_PER_RETRY: u32 = 8;

/// How many packets a requester sends without asking for an ACK (rxe's
/// `RXE_MAX_PKT_PER_ACK`).
const MAX_PKTS_PER_ACK: u32 = 64;

/// Queue sizes fixed at creation (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

/// Everything fixed when a QP is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    /// QP number (24 bits).
    pub qpn: u32,
    /// Transport type.
    pub qp_type: QpType,
    /// Protection domain handle, passed back to [`Memory`].
    pub pd: u32,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Every send WR generates a completion (`sq_sig_all`).
    pub sq_sig_all: bool,
    /// The largest number of PSNs in flight before the requester waits for
    /// ACKs (a send window; rxe uses 128).
    pub max_unacked_psns: u32,
    /// The port's active MTU: the largest UD message.
    pub port_mtu: uroce_wire::Mtu,
    /// Receives come from a shared receive queue (passed to
    /// [`Qp::handle_datagram_srq`]); the QP's own queue is not used.
    pub uses_srq: bool,
}

/// What a send WR is, once checked against its QP ([`QpInit::check_send`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendShape {
    /// Message length.
    pub length: u64,
    /// Gather entries the WQE keeps (0 for inline and local operations).
    pub num_sge: usize,
    /// The payload is copied at post time.
    pub inline: bool,
    /// ... from the gather list (no [`SendWr::inline_data`]).
    pub from_sgl: bool,
}

impl QpInit {
    /// The checks of `ibv_post_send` that depend only on the QP's type and
    /// sizes (not its state or how full its queue is): the opcode for the
    /// QP type, the gather list against `max_send_sge`, inline data
    /// against `max_inline_data`, an atomic's 8 bytes, a UD message within
    /// the MTU. `gather`: an inline WR without `inline_data` takes its
    /// bytes from its gather list.
    ///
    /// # Errors
    /// The [`PostError`] the post fails with.
    pub fn check_send(&self, wr: &SendWr<'_>, gather: bool) -> Result<SendShape, PostError> {
        let max_sge = self.caps.max_send_sge.max(1) as usize;
        let max_inline = self.caps.max_inline_data as u64;
        let supported = match self.qp_type {
            QpType::Rc => match wr.opcode {
                WrOpcode::BindMw => wr.bind.is_some(),
                WrOpcode::Flush => wr.flush.is_some_and(|f| {
                    f.placement != 0
                        && f.placement & !(FlushOp::GLOBAL | FlushOp::PERSISTENT) == 0
                        && f.selectivity <= FlushOp::REGION
                }),
                _ => true,
            },
            QpType::Uc => match wr.opcode {
                WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::RdmaWrite
                | WrOpcode::RdmaWriteWithImm
                | WrOpcode::LocalInv => true,
                WrOpcode::BindMw => wr.bind.is_some(),
                _ => false,
            },
            QpType::Ud => {
                matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm) && wr.ud.is_some()
            }
            // An initiator sends what RC sends, but binds no windows (they
            // need a local PD of the responder's); a target sends nothing.
            // (IBA 1.5's ATOMIC WRITE and FLUSH have no XRC opcodes.)
            QpType::XrcSend => {
                !matches!(wr.opcode, WrOpcode::BindMw | WrOpcode::Flush | WrOpcode::AtomicWrite)
            }
            QpType::XrcRecv | QpType::RawPacket => false,
        };
        if !supported {
            return Err(PostError::InvalidOpcode);
        }
        // ATOMIC WRITE carries its 8 bytes in the WR, FLUSH none: neither
        // has a gather list.
        match (wr.opcode, wr.flush) {
            (WrOpcode::AtomicWrite, _) => {
                return Ok(SendShape { length: 8, num_sge: 0, inline: false, from_sgl: false });
            }
            (WrOpcode::Flush, Some(f)) => {
                let length = u64::from(f.len);
                return Ok(SendShape { length, num_sge: 0, inline: false, from_sgl: false });
            }
            _ => {}
        }
        let local_op = matches!(wr.opcode, WrOpcode::BindMw | WrOpcode::LocalInv);
        let inline =
            wr.flags.contains(SendFlags::INLINE) && !wr.opcode.is_read_or_atomic() && !local_op;
        let from_sgl = inline && wr.inline_data.is_none() && gather;
        let (length, num_sge) = if from_sgl {
            if wr.sgl.len() > max_sge {
                return Err(PostError::TooManySge);
            }
            let len: u64 = wr.sgl.iter().map(|s| u64::from(s.length)).sum();
            if len > max_inline {
                return Err(PostError::InlineTooLong);
            }
            (len, 0)
        } else if inline {
            let len = wr.inline_data.map_or(0, <[u8]>::len) as u64;
            if len > max_inline {
                return Err(PostError::InlineTooLong);
            }
            (len, 0)
        } else {
            if wr.sgl.len() > max_sge {
                return Err(PostError::TooManySge);
            }
            if local_op {
                (0, 0)
            } else {
                (wr.sgl.iter().map(|s| u64::from(s.length)).sum::<u64>(), wr.sgl.len())
            }
        };
        if length > 1 << 31 || (wr.opcode.is_atomic() && length != 8) {
            return Err(PostError::InvalidLength);
        }
        // A UD message is one packet (IBTA §9.8.2).
        if self.qp_type == QpType::Ud && length > self.port_mtu.bytes() as u64 {
            return Err(PostError::InvalidLength);
        }
        Ok(SendShape { length, num_sge, inline, from_sgl })
    }

    /// The checks of `ibv_post_recv` that depend only on the QP's type and
    /// sizes: the QP has a receive queue of its own, the scatter list fits.
    ///
    /// # Errors
    /// The [`PostError`] the post fails with.
    pub fn check_recv(&self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        if self.uses_srq {
            return Err(PostError::UsesSrq);
        }
        if wr.sgl.len() > self.caps.max_recv_sge.max(1) as usize {
            return Err(PostError::TooManySge);
        }
        Ok(())
    }
}

/// A packet [`Qp::poll_transmit`] produced: `len` bytes at the start of the
/// caller's buffer, from BTH to ICRC. The ICRC field is zero: the I/O layer
/// fills it once the IP and UDP headers are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Packet length.
    pub len: usize,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination UDP port.
    pub dst_port: u16,
    /// UDP source port (rxe's rule, so that ECMP hashes per QP pair).
    pub src_port: u16,
    /// Source GID index: the local address the packet leaves from (the
    /// I/O layer resolves it in its GID table).
    pub sgid_index: u8,
    /// The IP header's TOS (IPv4) or traffic class (IPv6): the address
    /// vector's GRH traffic class, as rxe writes it.
    pub traffic_class: u8,
}

/// Asynchronous events a QP raises (`ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The QP moved to the error state on a local or transport error.
    QpFatal,
    /// The responder detected an invalid request.
    QpRequestError,
    /// The responder detected an access violation.
    QpAccessError,
    /// The send queue drained (SQD with notification asked).
    SqDrained,
    /// A QP attached to an SRQ went to the error state and will take no
    /// more WQEs from it (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached,
}

/// Requester state (rxe `qp->req`).
#[derive(Debug)]
pub(crate) struct ReqState {
    /// Next PSN to assign to a new WQE.
    pub(crate) next_psn: Psn,
    /// One past the highest PSN ever sent (to count retransmissions).
    pub(crate) sent_high: Psn,
    /// READ/atomic WQEs started and not completed.
    pub(crate) rd_atomic_inflight: u32,
    /// Packets sent since the last AckReq.
    pub(crate) noack_pkts: u32,
    /// Send nothing before this (RNR NAK timer).
    pub(crate) rnr_wait_until: Option<Instant>,
    /// Retransmission deadline, armed while packets are unacknowledged:
    /// the earlier of the probe timeout and `retry_at`.
    pub(crate) timer: Option<Instant>,
    /// When the next transport retry is spent: the QP's Local ACK Timeout
    /// after the last progress (or the last retry).
    pub(crate) retry_at: Option<Instant>,
    /// Transport retries left.
    pub(crate) retry_left: u8,
    /// RNR retries left (ignored when `rnr_retry` is 7).
    pub(crate) rnr_left: u8,
    /// The send window and round-trip estimate: a go-back-N restart over a
    /// slow or congested path must not resend more than the path drains.
    pub(crate) rec: recovery::Recovery,
    /// `comp.psn` when the window last grew (to count acknowledged PSNs).
    pub(crate) acked_psn: Psn,
    /// Go-backs caused by NAKs or response gaps since the last progress.
    pub(crate) nak_streak: u32,
    /// The PSN a tail probe resends: it may leave past the window.
    pub(crate) probe: Option<Psn>,
    /// The I/O layer says this QP's packets travel a path that loses none
    /// (memory between processes of one host): a probe timeout then means
    /// a late peer, and the first probe of a run resends one packet, not
    /// the window (see `Qp::tail_probe`).
    pub(crate) lossless: bool,
    /// Ask for an ACK on the next packet (the first one after a go-back), so
    /// that recovery does not wait for the end of a long message.
    pub(crate) ack_next: bool,
    /// Unsignaled WRs posted since the last signaled one.
    pub(crate) unsignaled_run: u32,
    /// A signaled WR ended a run of at least [`AWAITED_RUN`] unsignaled
    /// ones since [`Qp::take_awaited_post`] last asked.
    pub(crate) awaited_post: bool,
    /// Send queue slots kept for tag matching rendezvous (see
    /// `Qp::reserve_rendezvous`), and how many internal WQEs use them.
    pub(crate) tm_reserved: u32,
    pub(crate) tm_inflight: u32,
}

/// Unsignaled WRs in a row after which a signaled one is taken as awaited:
/// an application that signals one WR in N (perftest's `-Q`, default 100;
/// UCX's TX moderation) reposts only when that completion comes, so the WR
/// should leave at once rather than wait for the rest of a burst of posts.
/// A QP that signals every WR keeps batching.
pub const AWAITED_RUN: u32 = 8;

/// Completer state (rxe `qp->comp`).
#[derive(Debug)]
pub(crate) struct CompState {
    /// The oldest PSN not yet acknowledged.
    pub(crate) psn: Psn,
    /// A go-back-N restart was asked for by an out-of-order response and
    /// has not made progress yet (ask only once).
    pub(crate) gap_retry_pending: bool,
}

/// What a poster that does not hold the QP needs to know of its queues,
/// kept current by the QP (see [`Qp::gauge`]): how many WQEs each holds,
/// as of the last time its completions moved to their CQs (so never fewer
/// than it holds: a slot is free once its completion can be seen), and
/// whether its state takes posts. The way a NIC's driver tracks its queues
/// from the completions it polls.
#[derive(Debug, Default)]
pub struct QueueGauge {
    send_used: AtomicU32,
    send_open: AtomicBool,
    recv_used: AtomicU32,
    recv_open: AtomicBool,
}

impl QueueGauge {
    /// WQEs in the send queue (posted and not seen completed).
    pub fn send_used(&self) -> u32 {
        self.send_used.load(Ordering::Acquire)
    }

    /// Whether the QP's state takes send WRs (RTS, SQD, SQE, ERR: the
    /// last two complete them flushed).
    pub fn send_open(&self) -> bool {
        self.send_open.load(Ordering::Acquire)
    }

    /// WQEs in the receive queue (posted and not yet taken by a message).
    pub fn recv_used(&self) -> u32 {
        self.recv_used.load(Ordering::Acquire)
    }

    /// Whether the QP's state takes receive WRs (any but RESET).
    pub fn recv_open(&self) -> bool {
        self.recv_open.load(Ordering::Acquire)
    }
}

/// A queue pair.
#[derive(Debug)]
pub struct Qp {
    pub(crate) init: QpInit,
    pub(crate) attr: QpAttr,
    pub(crate) state: QpState,
    pub(crate) sq: SendQueue,
    pub(crate) rq: RecvQueue,
    /// The receive WQE being filled.
    pub(crate) recv_cur: RecvCur,
    pub(crate) req: ReqState,
    pub(crate) comp: CompState,
    pub(crate) resp: RespState,
    /// An ACK waiting for the application's reply (ping-pongs).
    hold: ack_hold::AckHold,
    completions: VecDeque<Completion>,
    events: VecDeque<AsyncEvent>,
    pub(crate) stats: Stats,
    pub(crate) src_port: u16,
    gauge: Arc<QueueGauge>,
}

impl Qp {
    /// A QP in the RESET state.
    pub fn new(init: QpInit) -> Self {
        let c = init.caps;
        let sq_depth = c.max_send_wr.max(1) as usize;
        let rq_depth = c.max_recv_wr.max(1) as usize;
        Self {
            init,
            attr: QpAttr::default(),
            state: QpState::Reset,
            sq: SendQueue::new(
                sq_depth,
                c.max_send_sge.max(1) as usize,
                c.max_inline_data as usize,
            ),
            rq: RecvQueue::new(rq_depth, c.max_recv_sge.max(1) as usize),
            recv_cur: RecvCur::new(crate::MAX_SGE),
            req: ReqState {
                next_psn: Psn::new(0),
                sent_high: Psn::new(0),
                rd_atomic_inflight: 0,
                noack_pkts: 0,
                rnr_wait_until: None,
                timer: None,
                retry_at: None,
                retry_left: 0,
                rnr_left: 0,
                probe: None,
                lossless: false,
                ack_next: false,
                unsignaled_run: 0,
                awaited_post: false,
                nak_streak: 0,
                rec: recovery::Recovery::new(init.max_unacked_psns),
                acked_psn: Psn::new(0),
                tm_reserved: 0,
                tm_inflight: 0,
            },
            comp: CompState { psn: Psn::new(0), gap_retry_pending: false },
            resp: RespState::new(RC_MAX_RD_ATOMIC as usize),
            hold: ack_hold::AckHold::default(),
            completions: VecDeque::with_capacity(sq_depth + rq_depth + 4),
            events: VecDeque::with_capacity(4),
            stats: Stats::default(),
            src_port: 0,
            gauge: Arc::default(),
        }
    }

    /// The QP's [`QueueGauge`], to read without the QP.
    pub fn gauge(&self) -> Arc<QueueGauge> {
        self.gauge.clone()
    }

    /// Brings the [`QueueGauge`] up to date: after posts and state
    /// changes, and before completions move to their CQs (the endpoint
    /// calls it then).
    pub fn publish_gauge(&self) {
        let g = &self.gauge;
        g.send_used.store(self.sq.len() as u32, Ordering::Release);
        g.recv_used.store(self.rq.len() as u32, Ordering::Release);
        let send = !matches!(self.state, QpState::Reset | QpState::Init | QpState::ReadyToReceive);
        g.send_open.store(send, Ordering::Release);
        g.recv_open.store(self.state != QpState::Reset, Ordering::Release);
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.init.qpn
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Tells the requester whether its packets now travel a path that
    /// loses none (the I/O layer knows: memory between processes of one
    /// host). A wrong "true" costs one probe timeout per loss, no more:
    /// a tail probe that draws no answer is followed by a go-back.
    pub fn set_lossless_path(&mut self, lossless: bool) {
        self.req.lossless = lossless;
    }

    /// Current attributes (`ibv_query_qp`).
    pub fn attr(&self) -> QpAttr {
        let mut a = self.attr;
        a.state = self.state;
        a.cur_state = self.state;
        a
    }

    /// The PSN the responder expects next.
    pub fn expected_psn(&self) -> Psn {
        self.resp.epsn
    }

    /// The PSN the requester sends next.
    pub fn next_psn(&self) -> Psn {
        self.req.next_psn
    }

    /// Creation parameters.
    pub fn init(&self) -> &QpInit {
        &self.init
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The smoothed round trip the requester measured, once it has.
    pub fn rtt(&self) -> Option<core::time::Duration> {
        self.req.rec.srtt()
    }

    /// The requester's current send window in PSNs.
    pub fn send_window(&self) -> u32 {
        self.req.rec.cwnd()
    }

    /// The peer's address, once the QP has a path.
    pub fn peer(&self) -> Option<IpAddr> {
        self.attr.path.map(|p| p.dst)
    }

    /// Posted send WRs not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }

    /// Posted receive WRs not yet completed.
    pub fn recv_queue_len(&self) -> usize {
        self.rq.len()
    }

    /// Modifies attributes and state (`ibv_modify_qp`).
    ///
    /// # Errors
    /// [`ModifyError`] when the mask or a value is not allowed; the QP is
    /// then unchanged.
    pub fn modify(
        &mut self,
        now: Instant,
        attr: &QpAttr,
        mask: AttrMask,
    ) -> Result<(), ModifyError> {
        let r = self.apply_modify(now, attr, mask);
        self.publish_gauge();
        r
    }

    fn apply_modify(
        &mut self,
        now: Instant,
        attr: &QpAttr,
        mask: AttrMask,
    ) -> Result<(), ModifyError> {
        let cur = self.state;
        let next = if mask.contains(AttrMask::STATE) { attr.state } else { cur };
        if mask.contains(AttrMask::CUR_STATE) && attr.cur_state != cur {
            return Err(ModifyError::CurState);
        }
        check_transition(self.init.qp_type, cur, next, mask)?;
        validate_values(attr, mask)?;

        let a = &mut self.attr;
        if mask.contains(AttrMask::ACCESS_FLAGS) {
            a.access = attr.access;
        }
        if mask.contains(AttrMask::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(AttrMask::PORT) {
            a.port = attr.port;
        }
        if mask.contains(AttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(AttrMask::AV) {
            a.path = attr.path;
        }
        if mask.contains(AttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(AttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(AttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
        }
        if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(AttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(AttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
        }
        if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(AttrMask::DEST_QPN) {
            a.dest_qpn = attr.dest_qpn;
        }
        if mask.contains(AttrMask::EN_SQD_ASYNC_NOTIFY) {
            a.sq_draining_notify = attr.sq_draining_notify;
        }
        if mask.intersects(AttrMask::AV | AttrMask::DEST_QPN) {
            let fl = a.path.map_or(0, |p| p.flow_label);
            self.src_port = rxe_connected_sport(fl, self.init.qpn, a.dest_qpn);
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            self.req.retry_left = a.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            self.req.rnr_left = a.rnr_retry;
        }
        if mask.contains(AttrMask::RQ_PSN) {
            self.resp.reset(a.rq_psn);
        }
        if mask.contains(AttrMask::SQ_PSN) {
            self.req.next_psn = a.sq_psn;
            self.req.sent_high = a.sq_psn;
            self.comp.psn = a.sq_psn;
            self.req.acked_psn = a.sq_psn;
        }
        if next != cur {
            self.enter_state(now, next);
        }
        Ok(())
    }

    fn enter_state(&mut self, now: Instant, next: QpState) {
        match next {
            QpState::Reset => self.reset(),
            QpState::Error => {
                self.state = QpState::Error;
                if self.init.uses_srq {
                    self.push_event(AsyncEvent::LastWqeReached);
                }
                self.flush_all();
            }
            QpState::SendQueueDrain => {
                self.state = next;
                self.check_drained();
            }
            _ => self.state = next,
        }
        let _ = now;
    }

    /// Back to RESET: queues emptied without completions, as the verbs
    /// spec says.
    fn reset(&mut self) {
        let init = self.init;
        let rendezvous = self.req.tm_reserved > 0;
        *self = Self::new(init);
        if rendezvous {
            self.reserve_rendezvous();
        }
    }

    /// Posts send WRs, stopping at the first bad one (`ibv_post_send`).
    ///
    /// # Errors
    /// The index of the WR that failed and why; earlier WRs were posted.
    pub fn post_send(
        &mut self,
        now: Instant,
        wrs: &[SendWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        let r = wrs
            .iter()
            .enumerate()
            .try_for_each(|(i, wr)| self.post_one_send(now, wr, None).map_err(|e| (i, e)));
        self.publish_gauge();
        r
    }

    /// [`Qp::post_send`] where an `INLINE` WR without
    /// [`SendWr::inline_data`] takes its bytes from its gather list, read
    /// now through `mem` with the SGEs' L_Keys, as `ibv_post_send` copies
    /// inline data at post time.
    ///
    /// # Errors
    /// As [`Qp::post_send`], and [`PostError::BadInlineAddress`].
    pub fn post_send_gather(
        &mut self,
        now: Instant,
        wrs: &[SendWr<'_>],
        mem: &dyn Memory,
    ) -> Result<(), (usize, PostError)> {
        let r = wrs
            .iter()
            .enumerate()
            .try_for_each(|(i, wr)| self.post_one_send(now, wr, Some(mem)).map_err(|e| (i, e)));
        self.publish_gauge();
        r
    }

    /// Copies an inline WR's gather list into the inline storage of the
    /// WQE about to be pushed.
    fn gather_inline(&mut self, wr: &SendWr<'_>, mem: &dyn Memory) -> Result<(), PostError> {
        let who = self.me();
        let dst = self.sq.inline_storage_mut(self.sq.head);
        let mut off = 0;
        for sge in wr.sgl {
            let n = sge.length as usize;
            let out = dst.get_mut(off..off + n).ok_or(PostError::InlineTooLong)?;
            mem.read(crate::memory::Key::Local(sge.lkey), who, sge.addr, out)
                .map_err(|_| PostError::BadInlineAddress)?;
            off += n;
        }
        Ok(())
    }

    fn post_one_send(
        &mut self,
        now: Instant,
        wr: &SendWr<'_>,
        mem: Option<&dyn Memory>,
    ) -> Result<(), PostError> {
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::ReadyToReceive) {
            return Err(PostError::InvalidState);
        }
        if !self.sq_room() {
            return Err(PostError::QueueFull);
        }
        let shape = self.init.check_send(wr, mem.is_some())?;
        let SendShape { length, num_sge, inline, from_sgl } = shape;
        let data = if inline && !from_sgl { Some(wr.inline_data.unwrap_or(&[])) } else { None };
        let wqe = SendWqe {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            flags: wr.flags,
            // A FLUSH keeps its FETH bits where the immediate would be.
            imm_or_inv: wr.flush.map_or(wr.imm_or_inv, |f| {
                u32::from(f.placement) | (u32::from(f.selectivity) << 4)
            }),
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            compare_add: wr.compare_add,
            swap: wr.swap,
            length: length as u32,
            num_sge: num_sge as u32,
            inline,
            signaled: self.init.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
            ud: wr.ud,
            bind: wr.bind,
            xrc_srqn: wr.xrc_srqn,
            ..SendWqe::EMPTY
        };
        if from_sgl && let Some(mem) = mem {
            self.gather_inline(wr, mem)?;
        }
        let sgl = if inline || num_sge == 0 { &[][..] } else { wr.sgl };
        self.sq.push(wqe, sgl, data);
        if wqe.signaled {
            self.req.awaited_post |= self.req.unsignaled_run >= AWAITED_RUN;
            self.req.unsignaled_run = 0;
        } else {
            self.req.unsignaled_run = self.req.unsignaled_run.saturating_add(1);
        }
        if self.state == QpState::Error {
            self.flush_all();
        } else if self.init.qp_type.is_reliable() {
            self.hold.on_post(now);
        }
        Ok(())
    }

    /// Whether a WR posted since the last call is one the application
    /// waits for (a signaled WR after at least [`AWAITED_RUN`] unsignaled
    /// ones): the I/O layer sends it now instead of batching it.
    pub fn take_awaited_post(&mut self) -> bool {
        std::mem::take(&mut self.req.awaited_post)
    }

    /// Posts receive WRs (`ibv_post_recv`).
    ///
    /// # Errors
    /// The index of the WR that failed and why; earlier WRs were posted.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        let r = wrs.iter().enumerate().try_for_each(|(i, wr)| {
            self.init.check_recv(wr).map_err(|e| (i, e))?;
            if self.state == QpState::Reset {
                return Err((i, PostError::InvalidState));
            }
            if self.rq.len() >= self.rq.capacity() {
                return Err((i, PostError::QueueFull));
            }
            self.rq.push(wr.wr_id, wr.sgl);
            if self.state == QpState::Error {
                self.flush_all();
            }
            Ok(())
        });
        self.publish_gauge();
        r
    }

    /// The next completion, in the order the spec requires (per queue, WR
    /// order).
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Completions waiting.
    pub fn pending_completions(&self) -> usize {
        self.completions.len()
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    pub(crate) fn push_completion(&mut self, c: Completion) {
        self.completions.push_back(c);
    }

    pub(crate) fn push_event(&mut self, e: AsyncEvent) {
        if !self.events.contains(&e) {
            self.events.push_back(e);
        }
    }

    /// Handles a received packet addressed to this QP. The ICRC has been
    /// checked by the caller.
    pub fn handle_packet(
        &mut self,
        now: Instant,
        src: IpAddr,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
    ) {
        let dst = match src {
            IpAddr::V4(_) => IpAddr::V4(core::net::Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(core::net::Ipv6Addr::UNSPECIFIED),
        };
        self.handle_datagram(now, src, dst, pkt, mem);
    }

    /// [`Qp::handle_packet`] with the packet's destination address too,
    /// which UD receives need for the GRH they place before the payload.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        src: IpAddr,
        dst: IpAddr,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
    ) {
        self.handle_inner(now, src, dst, pkt, mem, None);
    }

    /// [`Qp::handle_datagram`] for a QP whose receives come from `srq`.
    pub fn handle_datagram_srq(
        &mut self,
        now: Instant,
        src: IpAddr,
        dst: IpAddr,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
        srq: &mut Srq,
    ) {
        self.handle_inner(now, src, dst, pkt, mem, Some(srq));
    }

    fn handle_inner(
        &mut self,
        now: Instant,
        src: IpAddr,
        dst: IpAddr,
        pkt: &RocePacket<&[u8]>,
        mem: &dyn Memory,
        srq: Option<&mut Srq>,
    ) {
        self.stats.rcvd_pkts += 1;
        let info = pkt.info();
        let ours = match self.init.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud => Transport::Ud,
            QpType::XrcSend | QpType::XrcRecv => Transport::Xrc,
            // Never in the endpoint (see QpType::RawPacket): takes nothing.
            QpType::RawPacket => return,
        };
        // An XRC initiator takes only responses, a target only requests.
        let one_way_wrong = match self.init.qp_type {
            QpType::XrcSend => info.is_request,
            QpType::XrcRecv => !info.is_request,
            _ => false,
        };
        if info.transport != ours || one_way_wrong {
            self.stats.drop(DropReason::WrongTransport);
            return;
        }
        if ours == Transport::Ud {
            if pkt.bth().pkey() != DEFAULT_PKEY {
                self.stats.drop(DropReason::BadPkey);
                return;
            }
            self.ud_receive(src, dst, pkt, mem, srq);
            return;
        }
        if pkt.bth().pkey() != DEFAULT_PKEY {
            self.stats.drop(DropReason::BadPkey);
            return;
        }
        if self.attr.path.is_some_and(|p| p.dst != src) {
            self.stats.drop(DropReason::WrongPeer);
            return;
        }
        if info.is_request {
            self.responder_handle(now, pkt, mem, srq);
        } else {
            self.completer_handle(now, pkt, mem);
        }
    }

    /// Writes the next packet to send into `buf` (at least path MTU + 64
    /// bytes), or returns `None` when nothing is due. Responses go first, so
    /// a peer's requests are never starved by our own.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        if self.init.qp_type == QpType::Ud {
            let t = self.ud_poll(mem, buf)?;
            self.stats.sent_pkts += 1;
            return Some(t);
        }
        let path = self.attr.path?;
        let len = if self.hold.deadline().is_some() && self.resp.lone_ack() {
            self.poll_holding_ack(now, mem, buf)
        } else {
            self.hold.cancel();
            match self.responder_poll(mem, buf) {
                Some(n) => Some(n),
                None => self.requester_poll(now, mem, buf),
            }
        }?;
        self.stats.sent_pkts += 1;
        Some(Transmit {
            len,
            dst: path.dst,
            dst_port: path.dst_port,
            src_port: self.src_port,
            sgid_index: path.sgid_index,
            traffic_class: path.traffic_class,
        })
    }

    /// [`Qp::poll_transmit`] while the one queued response is an ACK held
    /// for the application's reply (`ack_hold`): our requests go first and
    /// the ACK behind them (the short tail of one GSO send); with no
    /// request, the ACK waits until its deadline.
    fn poll_holding_ack(
        &mut self,
        now: Instant,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<usize> {
        let waiting = self.hold.holding(now) || self.hold.released();
        if waiting && let Some(n) = self.requester_poll(now, mem, buf) {
            self.hold.on_request_sent();
            return Some(n);
        }
        if self.hold.holding(now) && !self.hold.released() {
            return None;
        }
        if self.hold.released() {
            self.stats.acks_behind_request += 1;
        } else {
            self.stats.ack_hold_expired += 1;
        }
        self.hold.end(now);
        self.responder_poll(mem, buf)
    }

    /// Lets an ACK held for the application's reply go on the next
    /// transmit. The application is about to change or destroy the QP, or
    /// the process to exit: the peer's request completed here, so its ACK
    /// must leave first (with an immediate ACK it would have). Returns
    /// whether one was held.
    pub fn release_held_ack(&mut self) -> bool {
        let held = self.holds_ack();
        self.hold.cancel();
        held
    }

    /// Whether an ACK waits for the application's reply.
    pub fn holds_ack(&self) -> bool {
        self.hold.deadline().is_some() && self.resp.lone_ack()
    }

    /// The earliest deadline at which [`Qp::handle_timeout`] must run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.req.timer, self.req.rnr_wait_until, self.hold.deadline()].into_iter().flatten().min()
    }

    /// Runs expired timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.req.rnr_wait_until.is_some_and(|t| t <= now) {
            self.req.rnr_wait_until = None;
        }
        if self.req.timer.is_some_and(|t| t <= now) {
            self.req.timer = None;
            self.retransmit_timeout(now);
        }
    }

    /// Moves the QP to ERR after a transport or protocol error.
    pub(crate) fn fail(&mut self, event: AsyncEvent) {
        if self.state != QpState::Error {
            self.state = QpState::Error;
            self.push_event(event);
            if self.init.uses_srq {
                self.push_event(AsyncEvent::LastWqeReached);
            }
        }
        self.flush_all();
    }

    /// Completes every outstanding WR with WR_FLUSH_ERR (QP in ERR).
    pub(crate) fn flush_all(&mut self) {
        while self.sq.comp < self.sq.head {
            let w = *self.sq.get(self.sq.comp);
            self.sq.comp += 1;
            if w.internal != Internal::No {
                self.internal_done(&w, WcStatus::WrFlushErr);
                continue;
            }
            let mut c = Completion::new(
                w.wr_id,
                WcStatus::WrFlushErr,
                w.opcode.wc_opcode(),
                self.init.qpn,
                false,
            );
            c.byte_len = 0;
            self.push_completion(c);
        }
        self.sq.tx = self.sq.head;
        self.sq.tx_pkt = 0;
        if self.recv_cur.active {
            self.recv_cur.active = false;
            let id = self.recv_cur.wr_id;
            self.push_completion(Completion::new(
                id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                self.init.qpn,
                true,
            ));
        }
        while self.rq.tail < self.rq.head {
            let w = *self.rq.get(self.rq.tail);
            self.push_completion(Completion::new(
                w.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                self.init.qpn,
                true,
            ));
            self.rq.tail += 1;
        }
        self.req.timer = None;
        self.req.retry_at = None;
        self.req.rnr_wait_until = None;
        self.req.rd_atomic_inflight = 0;
        self.resp.abort();
        self.hold.cancel();
    }

    pub(crate) fn check_drained(&mut self) {
        if self.state == QpState::SendQueueDrain
            && self.sq.comp == self.sq.tx
            && self.sq.tx_pkt == 0
            && self.attr.sq_draining_notify
        {
            self.attr.sq_draining_notify = false;
            self.push_event(AsyncEvent::SqDrained);
        }
    }

    /// This QP as a memory accessor.
    pub(crate) fn me(&self) -> crate::memory::Accessor {
        crate::memory::Accessor { pd: self.init.pd, qpn: self.init.qpn }
    }

    /// An XRC target's PD for the request at hand: its SRQ's (a target has
    /// none of its own). The endpoint sets it before each request.
    pub fn set_xrc_pd(&mut self, pd: u32) {
        self.init.pd = pd;
    }

    pub(crate) fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes() as u32
    }

    /// The UDP destination port of the QP's path (4791 unless overridden).
    pub fn dst_port(&self) -> u16 {
        self.attr.path.map_or(ROCE_V2_PORT, |p| p.dst_port)
    }
}

fn validate_values(a: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
    if mask.contains(AttrMask::PORT) && a.port != 1 {
        return Err(ModifyError::BadValue("port_num"));
    }
    if mask.contains(AttrMask::PKEY_INDEX) && a.pkey_index != 0 {
        return Err(ModifyError::BadValue("pkey_index"));
    }
    if mask.contains(AttrMask::RETRY_CNT) && a.retry_cnt > 7 {
        return Err(ModifyError::BadValue("retry_cnt"));
    }
    if mask.contains(AttrMask::RNR_RETRY) && a.rnr_retry > 7 {
        return Err(ModifyError::BadValue("rnr_retry"));
    }
    if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) && u32::from(a.max_rd_atomic) > RC_MAX_RD_ATOMIC {
        return Err(ModifyError::BadValue("max_rd_atomic"));
    }
    if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC)
        && u32::from(a.max_dest_rd_atomic) > RC_MAX_RD_ATOMIC
    {
        return Err(ModifyError::BadValue("max_dest_rd_atomic"));
    }
    if mask.contains(AttrMask::DEST_QPN) && a.dest_qpn > 0xff_ffff {
        return Err(ModifyError::BadValue("dest_qp_num"));
    }
    if mask.contains(AttrMask::AV) && a.path.is_none() {
        return Err(ModifyError::BadValue("ah_attr"));
    }
    Ok(())
}
