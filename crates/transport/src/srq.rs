//! Shared receive queues (IBTA §10.2.9): one pool of receive WQEs that
//! several QPs of a PD consume from, with a low-water mark (`srq_limit`)
//! that raises an event once when the pool runs low.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::queue::{RecvCur, RecvQueue};
use crate::tm::TagList;
use crate::wqe::PostError;
use crate::wqe::{RecvWr, Sge};

/// The local key of relay buffers, good only in [`RELAY_PD`] (so no
/// registration's key, whatever its number, reaches them).
pub const RELAY_LKEY: u32 = u32::MAX;
/// The protection domain of relay SRQs: no real PD has it, so a WRITE,
/// READ or atomic through a target QP that names another process's SRQ
/// finds no region and is NAKed (remote access error).
pub const RELAY_PD: u32 = u32::MAX;
/// The longest message a relay buffer takes (IBTA's 2^31).
pub(crate) const RELAY_MAX: u64 = 1 << 31;

/// An SRQ's fill, readable without the SRQ (by posters that find the
/// endpoint busy and stage their WRs): WQEs posted and not yet taken, and
/// the queue's capacity, as of the SRQ's last change.
#[derive(Debug, Default)]
pub struct SrqGauge {
    posted: AtomicU32,
    capacity: AtomicU32,
}

impl SrqGauge {
    /// WQEs posted and not yet taken by a message.
    pub fn posted(&self) -> u32 {
        self.posted.load(Ordering::Acquire)
    }

    /// The queue's capacity (`max_wr`).
    pub fn capacity(&self) -> u32 {
        self.capacity.load(Ordering::Acquire)
    }
}

/// An XRC SRQ of a domain that several processes share, as every one of
/// them sees it: target QPs of any member may name it, so a WQE is taken
/// only against a claim on this count, which every member's targets make
/// alike (the owner's own included). A claim granted to another process
/// is a WQE kept for the message that process relays here.
pub trait SharedSrq: Send + Sync + std::fmt::Debug {
    /// Reserves one WQE posted and not yet reserved; false if none is.
    fn claim(&self) -> bool;
    /// Gives back a claim whose message will never come (the target QP
    /// that made it went in the middle of the message): the WQE it kept
    /// is free for another.
    fn release(&self);
    /// The owner posted `n` more WQEs.
    fn posted(&self, n: u32);
    /// The owner's largest WQE posted and not yet taken, in bytes: what a
    /// message relayed to it may hold at most (0: none posted, or not
    /// known).
    fn max_len(&self) -> u64;
    /// The owner's largest WQE changed to `len`: published before
    /// [`SharedSrq::posted`] counts a new one, so that a claim on it never
    /// reads a length that leaves it out.
    fn set_max_len(&self, len: u64);
    /// Whether the SRQ still exists (not destroyed, its owner alive).
    fn alive(&self) -> bool;
}

/// A domain that several processes share: the SRQs of other members that
/// its target QPs here may name.
pub trait SharedDomain: Send + Sync + std::fmt::Debug {
    /// SRQ `srqn` of the domain, if another member has it.
    fn find(&self, srqn: u32) -> Option<Arc<dyn SharedSrq>>;
}

/// A shared receive queue.
#[derive(Debug)]
pub struct Srq {
    rq: RecvQueue,
    /// Armed low-water mark; 0 when disarmed.
    limit: u32,
    limit_reached: bool,
    /// An XRC SRQ's domain, PD and CQ.
    xrc: Option<XrcSrq>,
    gauge: Arc<SrqGauge>,
    /// The claims of a domain shared between processes.
    shared: Option<Arc<dyn SharedSrq>>,
    /// Stands for another process's SRQ (see [`Srq::new_relay`]): its
    /// messages are received whole into relay buffers, then sent on.
    relay: bool,
    /// A relay SRQ's answer from the owner for the message starting now:
    /// the length of the WQE it reserved, or none to spare (`Some(None)`).
    grant: Option<Option<u64>>,
    /// In a shared domain, the longest WQE posted and not yet taken, and
    /// how many have that length (see [`SharedSrq::max_len`]).
    longest: (u64, usize),
    /// A tag matching SRQ's list of tagged buffers.
    tm: Option<TagList>,
}

/// What makes an SRQ an XRC one: requests to XRC target QPs of its domain
/// name it, their memory accesses are checked against its PD, and their
/// completions go to its CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XrcSrq {
    /// The XRC domain.
    pub xrcd: u32,
    /// Its protection domain.
    pub pd: u32,
    /// The CQ its receive completions go to.
    pub cq: u32,
}

impl Srq {
    /// An empty SRQ of `max_wr` WQEs of up to `max_sge` SGEs.
    pub fn new(max_wr: u32, max_sge: u32) -> Self {
        Self {
            rq: RecvQueue::new(max_wr.max(1) as usize, max_sge.max(1) as usize),
            limit: 0,
            limit_reached: false,
            xrc: None,
            gauge: Arc::new(SrqGauge::default()),
            shared: None,
            relay: false,
            grant: None,
            longest: (0, 0),
            tm: None,
        }
        .published()
    }

    /// Brings the gauge up to date (after every change of the queue).
    fn published(self) -> Self {
        self.publish();
        self
    }

    fn publish(&self) {
        self.gauge.posted.store(self.rq.len() as u32, Ordering::Release);
        self.gauge.capacity.store(self.rq.capacity() as u32, Ordering::Release);
    }

    /// The SRQ's gauge, shared with whoever stages posts for it.
    pub fn gauge(&self) -> Arc<SrqGauge> {
        self.gauge.clone()
    }

    /// An XRC SRQ of domain `xrc.xrcd` (`ibv_create_srq_ex` with
    /// `IBV_SRQT_XRC`).
    pub fn new_xrc(max_wr: u32, max_sge: u32, xrc: XrcSrq) -> Self {
        Self { xrc: Some(xrc), ..Self::new(max_wr, max_sge) }
    }

    /// A tag matching SRQ (`IBV_SRQT_TM`) of up to `max_tags` tagged
    /// buffers, its receives and list operations completing on `cq`.
    pub fn new_tm(max_wr: u32, max_sge: u32, max_tags: u32, cq: u32) -> Self {
        Self { tm: Some(TagList::new(max_tags, cq)), ..Self::new(max_wr, max_sge) }
    }

    /// A tag matching SRQ's list.
    pub fn tm(&self) -> Option<&TagList> {
        self.tm.as_ref()
    }

    /// A tag matching SRQ's list, to change.
    pub fn tm_mut(&mut self) -> Option<&mut TagList> {
        self.tm.as_mut()
    }

    /// Makes this XRC SRQ one of a domain that other processes share:
    /// its WQEs are taken only against claims on `shared`, and its posts
    /// counted there.
    pub fn set_shared(&mut self, shared: Arc<dyn SharedSrq>) {
        self.shared = Some(shared);
        self.recount_longest();
        if let Some(s) = &self.shared
            && self.rq.len() > 0
        {
            s.posted(self.rq.len() as u32);
        }
    }

    /// The longest WQE queued, counted anew and published (a shared
    /// domain's SRQ: see [`SharedSrq::max_len`]).
    fn recount_longest(&mut self) {
        let Some(s) = &self.shared else { return };
        let mut longest = (0, 0);
        for len in self.rq.lengths() {
            if len > longest.0 {
                longest = (len, 1);
            } else if len == longest.0 {
                longest.1 += 1;
            }
        }
        if longest.0 != self.longest.0 {
            s.set_max_len(longest.0);
        }
        self.longest = longest;
    }

    /// A WQE of `len` bytes was posted (published before it is counted).
    fn longest_posted(&mut self, len: u64) {
        let Some(s) = &self.shared else { return };
        if len > self.longest.0 {
            self.longest = (len, 1);
            s.set_max_len(len);
        } else if len == self.longest.0 {
            self.longest.1 += 1;
        }
    }

    /// A WQE of `len` bytes was taken.
    fn longest_taken(&mut self, len: u64) {
        if self.shared.is_none() || len != self.longest.0 {
            return;
        }
        self.longest.1 = self.longest.1.saturating_sub(1);
        if self.longest.1 == 0 {
            self.recount_longest();
        }
    }

    /// Another process's XRC SRQ as this one's targets see it: each
    /// message that claims one of its WQEs is received into a relay
    /// buffer (local key [`RELAY_LKEY`] in PD [`RELAY_PD`], one per
    /// target QP), to be sent on to the owner. `xrc.cq` is unused.
    pub(crate) fn new_relay(xrc: XrcSrq, shared: Arc<dyn SharedSrq>) -> Self {
        Self {
            shared: Some(shared),
            relay: true,
            ..Self::new_xrc(1, 1, XrcSrq { pd: RELAY_PD, ..xrc })
        }
    }

    /// A relay SRQ: the owner's answer for the WQE of the message that
    /// starts with the packet about to run (see [`Srq::pop_into`]); what
    /// was set and not taken is returned.
    pub(crate) fn set_grant(&mut self, grant: Option<Option<u64>>) -> Option<Option<u64>> {
        std::mem::replace(&mut self.grant, grant)
    }

    /// Puts back, as the oldest, a WQE taken for a message that never
    /// came (its target QP went before it started); false if the queue
    /// has been filled meanwhile.
    pub(crate) fn put_back(&mut self, cur: &RecvCur) -> bool {
        if !self.rq.push_front(cur.wr_id, &cur.sges) {
            return false;
        }
        if self.shared.is_some() {
            self.longest_posted(cur.length);
        }
        self.publish();
        true
    }

    /// The shared claims, for a domain shared between processes.
    pub(crate) fn shared(&self) -> Option<&Arc<dyn SharedSrq>> {
        self.shared.as_ref()
    }

    /// Takes the oldest WQE for a message whose claim another process
    /// made (and relayed here), without a claim of its own.
    pub(crate) fn pop_claimed(&mut self, cur: &mut RecvCur) -> bool {
        let ok = self.rq.pop_into(cur);
        if ok {
            self.longest_taken(cur.length);
        }
        self.after_pop();
        ok
    }

    /// Its XRC domain, PD and CQ, if it is an XRC SRQ.
    pub fn xrc(&self) -> Option<XrcSrq> {
        self.xrc
    }

    /// Capacity.
    pub fn max_wr(&self) -> u32 {
        self.rq.capacity() as u32
    }

    /// SGEs per WQE.
    pub fn max_sge(&self) -> u32 {
        self.rq.max_sge as u32
    }

    /// WQEs posted and not yet taken.
    pub fn len(&self) -> usize {
        self.rq.len()
    }

    /// Whether no WQE is waiting.
    pub fn is_empty(&self) -> bool {
        self.rq.len() == 0
    }

    /// The armed limit (0: disarmed).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Arms (or with 0 disarms) the limit event (`ibv_modify_srq` with
    /// `IBV_SRQ_LIMIT`).
    ///
    /// # Errors
    /// [`PostError::InvalidLength`] (EINVAL) for a limit above `max_wr`.
    pub fn arm(&mut self, limit: u32) -> Result<(), PostError> {
        if limit > self.max_wr() {
            return Err(PostError::InvalidLength);
        }
        self.limit = limit;
        Ok(())
    }

    /// Resizes the SRQ to `max_wr` WQEs (`ibv_modify_srq` with
    /// `IBV_SRQ_MAX_WR`), keeping the WQEs posted, in order.
    ///
    /// # Errors
    /// [`PostError::InvalidLength`] (EINVAL) for 0, fewer WQEs than are
    /// posted, or fewer than the armed limit (as rxe refuses them).
    pub fn resize(&mut self, max_wr: u32) -> Result<(), PostError> {
        if max_wr == 0 || (max_wr as usize) < self.rq.len() || max_wr < self.limit {
            return Err(PostError::InvalidLength);
        }
        self.rq = self.rq.resized(max_wr as usize);
        self.publish();
        Ok(())
    }

    /// Posts receive WRs (`ibv_post_srq_recv`).
    ///
    /// # Errors
    /// The index of the first WR not posted and why.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        for (i, wr) in wrs.iter().enumerate() {
            if self.rq.len() >= self.rq.capacity() {
                return Err((i, PostError::QueueFull));
            }
            if wr.sgl.len() > self.rq.max_sge {
                return Err((i, PostError::TooManySge));
            }
            self.rq.push(wr.wr_id, wr.sgl);
            self.publish();
            if self.shared.is_some() {
                self.longest_posted(wr.sgl.iter().map(|e| u64::from(e.length)).sum());
            }
            if let Some(s) = &self.shared {
                s.posted(1);
            }
        }
        Ok(())
    }

    /// Takes the oldest WQE for a QP; fires the limit event (once, then
    /// disarms) when fewer than `limit` WQEs remain (IBTA C10-…).
    /// In a shared domain, only against a claim (no WQE, or every one
    /// kept for other processes' messages: none, and the requester gets
    /// an RNR NAK).
    pub(crate) fn pop_into(&mut self, cur: &mut RecvCur) -> bool {
        if self.relay {
            let len = match self.grant.take() {
                // The owner took the WQE (and its claim), and said how long
                // it is: a longer message ends in a length error here.
                Some(Some(len)) => len.min(RELAY_MAX),
                Some(None) => return false,
                None => {
                    if !self.shared.as_ref().is_some_and(|s| s.claim()) {
                        return false;
                    }
                    // Not asked (an owner gone): as long as the owner's
                    // longest WQE (0 says nothing: as long as any).
                    match self.shared.as_ref().map_or(0, |s| s.max_len()) {
                        0 => RELAY_MAX,
                        n => n.min(RELAY_MAX),
                    }
                }
            };
            cur.active = true;
            cur.wr_id = 0;
            cur.length = len;
            cur.skip = 0;
            cur.tm = None;
            cur.sges.clear();
            cur.sges.push(Sge { addr: 0, length: len as u32, lkey: RELAY_LKEY });
            return true;
        }
        if self.rq.len() == 0 || self.shared.as_ref().is_some_and(|s| !s.claim()) {
            return false;
        }
        let ok = self.rq.pop_into(cur);
        if ok {
            self.longest_taken(cur.length);
        }
        self.after_pop();
        ok
    }

    fn after_pop(&mut self) {
        self.publish();
        if self.limit > 0 && (self.rq.len() as u32) < self.limit {
            self.limit = 0;
            self.limit_reached = true;
        }
    }

    /// Whether the limit event fired since the last call
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    pub fn take_limit_event(&mut self) -> bool {
        std::mem::take(&mut self.limit_reached)
    }
}
