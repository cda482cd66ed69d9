//! Work requests posted while another thread holds the context's driver
//! (the progress thread in a pass, another poster): checked, copied into
//! the QP's staging rings (one for sends, one for receives) and taken into
//! the transport, in post order, by whoever holds the driver next, the way
//! a NIC's driver writes WQEs into its queues and rings a doorbell. A post therefore never waits for a
//! progress pass, which can lose its CPU while it holds the driver and
//! keep a waiting post for a whole scheduler tick.
//!
//! A staged WR is in its QP before anything that could depend on it: the
//! driver takes staged WRs in whenever it is locked (`Inner::lock`) and,
//! within a pass, after each receive system call that returned datagrams
//! and before it delivers them (`Driver::receive`). So a receive posted
//! before its peer was told to send is there for the SEND, as on a NIC,
//! where a WQE is the HCA's once `ibv_post_recv` returns: UC and UD would
//! otherwise drop the message, RC answer with an RNR NAK.
//!
//! Lock order: a thread may lock a QP's staging while it holds the driver,
//! never the driver (only `try_lock`) while it holds a staging; the
//! context's list of QPs with staged WRs is locked alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use uroce_transport::{
    Endpoint, Instant, MwBind, PostError, QpInit, QueueGauge, RecvWr, SendFlags, SendWr, Sge,
    SrqGauge, UdDest, WrOpcode,
};

/// Reads an inline WR's gather entry into the buffer (the poster's own,
/// unchecked read of its memory: see `Qp::post_send_unchecked_inline`).
pub(crate) type Gather<'a> = &'a dyn Fn(&Sge, &mut [u8]);

/// A staged WR: its fields, and its gather list or inline bytes copied.
struct Slot {
    wr_id: u64,
    opcode: WrOpcode,
    flags: SendFlags,
    imm_or_inv: u32,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
    ud: Option<UdDest>,
    bind: Option<MwBind>,
    flush: Option<uroce_transport::FlushOp>,
    xrc_srqn: u32,
    sgl: Vec<Sge>,
    inline: Vec<u8>,
    /// The payload is in `inline` (an inline WR).
    has_inline: bool,
}

impl Slot {
    fn new(max_sge: usize, max_inline: usize) -> Self {
        Self {
            wr_id: 0,
            opcode: WrOpcode::Send,
            flags: SendFlags::NONE,
            imm_or_inv: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            ud: None,
            bind: None,
            flush: None,
            xrc_srqn: 0,
            sgl: Vec::with_capacity(max_sge),
            inline: Vec::with_capacity(max_inline),
            has_inline: false,
        }
    }

    fn as_wr(&self) -> SendWr<'_> {
        SendWr {
            wr_id: self.wr_id,
            opcode: self.opcode,
            flags: self.flags,
            sgl: &self.sgl,
            inline_data: self.has_inline.then_some(&self.inline[..]),
            imm_or_inv: self.imm_or_inv,
            remote_addr: self.remote_addr,
            rkey: self.rkey,
            compare_add: self.compare_add,
            swap: self.swap,
            ud: self.ud,
            bind: self.bind,
            flush: self.flush,
            xrc_srqn: self.xrc_srqn,
        }
    }
}

/// A ring of staged WRs, as deep as the queue it feeds (a staged WR holds
/// a slot of that queue: it was counted when it was staged).
struct Ring<T> {
    slots: Vec<T>,
    head: usize,
    len: usize,
}

impl<T> Ring<T> {
    fn new(slots: Vec<T>) -> Self {
        Self { slots, head: 0, len: 0 }
    }

    /// The slot after the last staged one (the caller checked there is
    /// room).
    fn next(&mut self) -> &mut T {
        let at = (self.head + self.len) % self.slots.len();
        &mut self.slots[at]
    }

    /// The staged slots in post order, and the ring emptied.
    fn take(&mut self) -> impl Iterator<Item = &T> {
        let (head, len, n) = (self.head, self.len, self.slots.len());
        self.head = (head + len) % n.max(1);
        self.len = 0;
        let slots = &self.slots;
        (0..len).map(move |k| &slots[(head + k) % n])
    }
}

/// A staged receive WR.
struct RecvSlot {
    wr_id: u64,
    sgl: Vec<Sge>,
}

struct Rings {
    send: Ring<Slot>,
    recv: Ring<RecvSlot>,
}

/// One QP's posting state shared by its posters and the driver.
pub(crate) struct QpPost {
    pub(crate) qpn: u32,
    init: QpInit,
    gauge: Arc<QueueGauge>,
    rings: Mutex<Rings>,
    /// On the context's list of QPs with staged WRs (changed only with
    /// `rings` locked).
    listed: AtomicBool,
}

impl QpPost {
    pub(crate) fn new(init: QpInit, gauge: Arc<QueueGauge>) -> Self {
        let c = init.caps;
        let (sge, inline) = (c.max_send_sge.max(1) as usize, c.max_inline_data as usize);
        let send = (0..c.max_send_wr.max(1)).map(|_| Slot::new(sge, inline)).collect();
        // A QP on an SRQ posts no receives of its own.
        let (depth, sge) = match init.uses_srq {
            true => (0, 0),
            false => (c.max_recv_wr.max(1), c.max_recv_sge.max(1) as usize),
        };
        let recv =
            (0..depth).map(|_| RecvSlot { wr_id: 0, sgl: Vec::with_capacity(sge) }).collect();
        Self {
            qpn: init.qpn,
            init,
            gauge,
            rings: Mutex::new(Rings { send: Ring::new(send), recv: Ring::new(recv) }),
            listed: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Rings> {
        self.rings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Send WRs the queue takes now: its depth less the WQEs it holds (as
    /// of its last completions) and those staged.
    pub(crate) fn send_room(&self) -> u32 {
        let rings = self.lock();
        let used = self.gauge.send_used() as usize + rings.send.len;
        rings.send.slots.len().saturating_sub(used) as u32
    }

    /// Whether the QP must go on the context's list: it has staged WRs and
    /// was not on it.
    fn to_list(&self, rings: &Rings) -> bool {
        rings.send.len + rings.recv.len > 0 && !self.listed.swap(true, Ordering::AcqRel)
    }

    /// Checks and copies `wrs` as `ibv_post_send` would post them: the
    /// QP's state and sizes, and room in its send queue (the WQEs it holds,
    /// as of its last completions, and those staged). An inline WR
    /// without `inline_data` has its gather list copied now with `gather`
    /// (the caller's, unchecked, read of its own memory), since the caller
    /// may reuse it once the post returns. Returns the outcome (on error,
    /// the index of the first WR not staged and why; those before it are
    /// staged) and whether the QP must be put on the context's list (it
    /// has staged WRs and was not on it).
    pub(crate) fn stage(
        &self,
        wrs: &[SendWr<'_>],
        gather: Gather<'_>,
    ) -> (Result<(), (usize, PostError)>, bool) {
        let mut rings = self.lock();
        let r = self.stage_sends(&mut rings.send, wrs, gather);
        (r, self.to_list(&rings))
    }

    fn stage_sends(
        &self,
        ring: &mut Ring<Slot>,
        wrs: &[SendWr<'_>],
        gather: Gather<'_>,
    ) -> Result<(), (usize, PostError)> {
        for (i, wr) in wrs.iter().enumerate() {
            if !self.gauge.send_open() {
                return Err((i, PostError::InvalidState));
            }
            if self.gauge.send_used() as usize + ring.len >= ring.slots.len() {
                return Err((i, PostError::QueueFull));
            }
            let shape = self.init.check_send(wr, true).map_err(|e| (i, e))?;
            let s = ring.next();
            s.wr_id = wr.wr_id;
            s.opcode = wr.opcode;
            s.flags = wr.flags;
            s.imm_or_inv = wr.imm_or_inv;
            s.remote_addr = wr.remote_addr;
            s.rkey = wr.rkey;
            s.compare_add = wr.compare_add;
            s.swap = wr.swap;
            s.ud = wr.ud;
            s.bind = wr.bind;
            s.flush = wr.flush;
            s.xrc_srqn = wr.xrc_srqn;
            s.sgl.clear();
            s.inline.clear();
            s.has_inline = shape.inline;
            if !shape.inline {
                s.sgl.extend_from_slice(wr.sgl);
            } else if let Some(data) = wr.inline_data {
                s.inline.extend_from_slice(data);
            } else {
                // Within the capacity `check_send` held the length to.
                s.inline.resize(shape.length as usize, 0);
                let mut off = 0;
                for sge in wr.sgl {
                    let n = sge.length as usize;
                    gather(sge, &mut s.inline[off..off + n]);
                    off += n;
                }
            }
            ring.len += 1;
        }
        Ok(())
    }

    /// [`QpPost::stage`] for receive WRs (`ibv_post_recv`'s checks, room
    /// in the receive queue), their scatter lists copied.
    pub(crate) fn stage_recv(&self, wrs: &[RecvWr<'_>]) -> (Result<(), (usize, PostError)>, bool) {
        let mut rings = self.lock();
        let ring = &mut rings.recv;
        let r = wrs.iter().enumerate().try_for_each(|(i, wr)| {
            self.init.check_recv(wr).map_err(|e| (i, e))?;
            if !self.gauge.recv_open() {
                return Err((i, PostError::InvalidState));
            }
            if self.gauge.recv_used() as usize + ring.len >= ring.slots.len() {
                return Err((i, PostError::QueueFull));
            }
            let s = ring.next();
            s.wr_id = wr.wr_id;
            s.sgl.clear();
            s.sgl.extend_from_slice(wr.sgl);
            ring.len += 1;
            Ok(())
        });
        (r, self.to_list(&rings))
    }

    /// Takes the staged WRs into the QP in `ep`, in post order; returns
    /// how many sends. Call with the driver held, before anything else of
    /// this QP.
    pub(crate) fn drain(&self, ep: &mut Endpoint, now: Instant) -> u32 {
        let mut rings = self.lock();
        self.listed.store(false, Ordering::Release);
        self.take_into(&mut rings, ep, now)
    }

    /// Runs `post` (a direct post, the driver held) with the staging
    /// locked and drained first, so that it follows every staged WR and
    /// no stager reads the QP's gauge while it changes. Also returns how
    /// many staged sends went in.
    pub(crate) fn post_after_staged<R>(
        &self,
        ep: &mut Endpoint,
        now: Instant,
        post: impl FnOnce(&mut Endpoint) -> R,
    ) -> (R, u32) {
        let mut rings = self.lock();
        let staged = self.take_into(&mut rings, ep, now);
        (post(ep), staged)
    }

    /// Posts the staged WRs to the QP; returns how many sends. A WR the
    /// QP refuses now (it was reset meanwhile, which empties its queues)
    /// is dropped, as the reset drops what was posted.
    fn take_into(&self, rings: &mut Rings, ep: &mut Endpoint, now: Instant) -> u32 {
        let sends = rings.send.len as u32;
        if sends + rings.recv.len as u32 == 0 {
            return 0;
        }
        let qp = ep.qp_mut(self.qpn);
        if let Some(qp) = qp {
            for s in rings.recv.take() {
                let _ = qp.post_recv(&[RecvWr { wr_id: s.wr_id, sgl: &s.sgl }]);
            }
            for s in rings.send.take() {
                let _ = qp.post_send(now, &[s.as_wr()]);
            }
        } else {
            rings.recv.take().for_each(drop);
            rings.send.take().for_each(drop);
        }
        sends
    }
}

/// A staging's outcome: the index of the first WR not staged and why (on
/// error), and whether the queue must go on the context's list.
pub(crate) type Staging = (Result<(), (usize, PostError)>, bool);

/// An SRQ's posting state shared by its posters and the driver: receive
/// WRs posted while the driver was held elsewhere wait here, checked and
/// copied, as a QP's do in [`QpPost`].
pub(crate) struct SrqPost {
    id: u32,
    max_sge: usize,
    gauge: Arc<SrqGauge>,
    ring: Mutex<Ring<RecvSlot>>,
    listed: AtomicBool,
}

impl SrqPost {
    pub(crate) fn new(id: u32, max_wr: u32, max_sge: u32, gauge: Arc<SrqGauge>) -> Self {
        let sge = max_sge.max(1) as usize;
        let slots = (0..max_wr.max(1))
            .map(|_| RecvSlot { wr_id: 0, sgl: Vec::with_capacity(sge) })
            .collect();
        Self {
            id,
            max_sge: sge,
            gauge,
            ring: Mutex::new(Ring::new(slots)),
            listed: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ring<RecvSlot>> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks and copies `wrs` as `ibv_post_srq_recv` would post them
    /// (their SGE counts, room in the SRQ as of its gauge with those
    /// staged). `None` when the staging ring cannot hold what the SRQ
    /// could (it grew since): the caller posts directly, waiting for the
    /// driver. Else the outcome, as [`QpPost::stage`]'s, and whether the
    /// SRQ must go on the context's list.
    pub(crate) fn stage(&self, wrs: &[RecvWr<'_>]) -> Option<Staging> {
        let mut ring = self.lock();
        if (ring.slots.len() as u32) < self.gauge.capacity() {
            return None;
        }
        let r = wrs.iter().enumerate().try_for_each(|(i, wr)| {
            if self.gauge.posted() as usize + ring.len >= self.gauge.capacity() as usize {
                return Err((i, PostError::QueueFull));
            }
            if wr.sgl.len() > self.max_sge {
                return Err((i, PostError::TooManySge));
            }
            let s = ring.next();
            s.wr_id = wr.wr_id;
            s.sgl.clear();
            s.sgl.extend_from_slice(wr.sgl);
            ring.len += 1;
            Ok(())
        });
        let list = ring.len > 0 && !self.listed.swap(true, Ordering::AcqRel);
        Some((r, list))
    }

    /// Takes the staged WRs into the SRQ in `ep`, in post order (dropped
    /// if it is gone). Call with the driver held.
    pub(crate) fn drain(&self, ep: &mut Endpoint) {
        let mut ring = self.lock();
        self.listed.store(false, Ordering::Release);
        Self::take_into(self.id, &mut ring, ep);
    }

    /// Runs `post` (a direct post, the driver held) after the staged WRs,
    /// with the staging locked so that no stager reads the gauge while it
    /// changes.
    pub(crate) fn post_after_staged<R>(
        &self,
        ep: &mut Endpoint,
        post: impl FnOnce(&mut Endpoint) -> R,
    ) -> R {
        let mut ring = self.lock();
        Self::take_into(self.id, &mut ring, ep);
        post(ep)
    }

    fn take_into(id: u32, ring: &mut Ring<RecvSlot>, ep: &mut Endpoint) {
        if ring.len == 0 {
            return;
        }
        match ep.srq_mut(id) {
            Some(srq) => {
                for s in ring.take() {
                    let _ = srq.post_recv(&[RecvWr { wr_id: s.wr_id, sgl: &s.sgl }]);
                }
            }
            None => ring.take().for_each(drop),
        }
    }
}

/// A queue with staged WRs.
#[derive(Clone)]
pub(crate) enum Staged {
    Qp(Arc<QpPost>),
    Srq(Arc<SrqPost>),
}

/// The QPs and SRQs of one context with staged WRs, shared by the posters
/// (who add a queue when they stage its first WR) and the driver (who
/// takes the staged WRs in).
#[derive(Default)]
pub(crate) struct StagedList {
    list: Mutex<Vec<Staged>>,
    /// `list` is not empty (read without its lock, on every driver lock
    /// and after every receive system call).
    any: AtomicBool,
}

impl StagedList {
    /// Whether some queue has staged WRs.
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Adds `q` (see [`QpPost::stage`] for when).
    pub(crate) fn push(&self, q: Staged) {
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        l.push(q);
        self.any.store(true, Ordering::Release);
    }

    /// Moves every staged WR into its queue; returns how many sends (they
    /// wait for a transmit). `spare`: the driver's empty list, swapped in
    /// (so that neither list allocates once it has grown).
    pub(crate) fn take(&self, spare: &mut Vec<Staged>, ep: &mut Endpoint, now: Instant) -> u32 {
        if !self.any() {
            return 0;
        }
        {
            let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::swap(&mut *l, spare);
            self.any.store(false, Ordering::Release);
        }
        spare
            .drain(..)
            .map(|q| match q {
                Staged::Qp(q) => q.drain(ep, now),
                Staged::Srq(s) => {
                    s.drain(ep);
                    0
                }
            })
            .sum()
    }
}
