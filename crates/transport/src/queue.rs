//! Fixed-capacity work queues. Every buffer is allocated when the QP is
//! created; posting and completing move indices only.

use crate::wqe::{SendFlags, Sge, WrOpcode};
use uroce_wire::Psn;

/// A send WQE as the requester and completer track it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) opcode: WrOpcode,
    pub(crate) flags: SendFlags,
    pub(crate) imm_or_inv: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    /// Total message length.
    pub(crate) length: u32,
    pub(crate) num_sge: u32,
    /// Payload was copied into the inline area at post time.
    pub(crate) inline: bool,
    /// Whether a completion is generated on success.
    pub(crate) signaled: bool,
    /// PSNs assigned on first transmission.
    pub(crate) assigned: bool,
    pub(crate) first_psn: Psn,
    /// Number of PSNs the WQE occupies (packets, or READ response packets).
    pub(crate) npsn: u32,
    /// READ/atomic counted in the outstanding limit.
    pub(crate) counted: bool,
    /// UD destination.
    pub(crate) ud: Option<crate::wqe::UdDest>,
    /// Memory window bind.
    pub(crate) bind: Option<crate::memory::MwBind>,
    /// XRC: the target SRQ.
    pub(crate) xrc_srqn: u32,
    /// Posted by the QP itself, not the application.
    pub(crate) internal: Internal,
}

/// Send WQEs the QP posts itself: a tag matching rendezvous's READ of the
/// requester's data (its tag and application context kept in `compare_add`
/// and `swap`, its tagged buffer's `recv_wr_id` in `wr_id`), and the FIN
/// that ends it. Their completions are receive-side ones, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Internal {
    /// The application's.
    No,
    /// A rendezvous READ.
    TmRead,
    /// A rendezvous FIN.
    TmFin,
}

impl SendWqe {
    pub(crate) const EMPTY: Self = Self {
        wr_id: 0,
        opcode: WrOpcode::Send,
        flags: SendFlags::NONE,
        imm_or_inv: 0,
        remote_addr: 0,
        rkey: 0,
        compare_add: 0,
        swap: 0,
        length: 0,
        num_sge: 0,
        inline: false,
        signaled: false,
        assigned: false,
        first_psn: Psn::new(0),
        npsn: 0,
        counted: false,
        ud: None,
        bind: None,
        xrc_srqn: 0,
        internal: Internal::No,
    };

    /// The last PSN of the WQE (valid once assigned).
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npsn.max(1) - 1)
    }
}

/// The send queue: WQEs between `comp` and `head` are posted and not yet
/// completed; `tx` is the next one the requester works on.
#[derive(Debug)]
pub(crate) struct SendQueue {
    slots: Vec<SendWqe>,
    sges: Vec<Sge>,
    inline: Vec<u8>,
    pub(crate) max_sge: usize,
    pub(crate) max_inline: usize,
    /// Count of WQEs ever posted.
    pub(crate) head: u64,
    /// Next WQE to (re)transmit.
    pub(crate) tx: u64,
    /// Next packet index within WQE `tx`.
    pub(crate) tx_pkt: u32,
    /// Oldest uncompleted WQE.
    pub(crate) comp: u64,
}

impl SendQueue {
    pub(crate) fn new(depth: usize, max_sge: usize, max_inline: usize) -> Self {
        Self {
            slots: vec![SendWqe::EMPTY; depth],
            sges: vec![Sge::default(); depth * max_sge],
            inline: vec![0; depth * max_inline],
            max_sge,
            max_inline,
            head: 0,
            tx: 0,
            tx_pkt: 0,
            comp: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn len(&self) -> usize {
        (self.head - self.comp) as usize
    }

    fn slot(&self, idx: u64) -> usize {
        (idx % self.slots.len() as u64) as usize
    }

    pub(crate) fn get(&self, idx: u64) -> &SendWqe {
        &self.slots[self.slot(idx)]
    }

    pub(crate) fn get_mut(&mut self, idx: u64) -> &mut SendWqe {
        let s = self.slot(idx);
        &mut self.slots[s]
    }

    pub(crate) fn sgl(&self, idx: u64) -> &[Sge] {
        let s = self.slot(idx);
        let n = self.slots[s].num_sge as usize;
        &self.sges[s * self.max_sge..s * self.max_sge + n]
    }

    pub(crate) fn inline_data(&self, idx: u64) -> &[u8] {
        let s = self.slot(idx);
        let n = self.slots[s].length as usize;
        &self.inline[s * self.max_inline..s * self.max_inline + n]
    }

    /// The inline storage of the WQE at `idx` (its whole capacity).
    pub(crate) fn inline_storage_mut(&mut self, idx: u64) -> &mut [u8] {
        let s = self.slot(idx);
        &mut self.inline[s * self.max_inline..(s + 1) * self.max_inline]
    }

    /// Appends a WQE; the caller has checked capacity and sizes.
    pub(crate) fn push(&mut self, wqe: SendWqe, sgl: &[Sge], inline: Option<&[u8]>) {
        let s = self.slot(self.head);
        self.slots[s] = wqe;
        self.sges[s * self.max_sge..s * self.max_sge + sgl.len()].copy_from_slice(sgl);
        if let Some(d) = inline {
            self.inline[s * self.max_inline..s * self.max_inline + d.len()].copy_from_slice(d);
        }
        self.head += 1;
    }
}

/// A receive WQE.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) num_sge: u32,
    pub(crate) length: u64,
}

/// The receive queue.
#[derive(Debug)]
pub(crate) struct RecvQueue {
    slots: Vec<RecvWqe>,
    sges: Vec<Sge>,
    pub(crate) max_sge: usize,
    pub(crate) head: u64,
    pub(crate) tail: u64,
}

impl RecvQueue {
    pub(crate) fn new(depth: usize, max_sge: usize) -> Self {
        Self {
            slots: vec![RecvWqe { wr_id: 0, num_sge: 0, length: 0 }; depth],
            sges: vec![Sge::default(); depth * max_sge],
            max_sge,
            head: 0,
            tail: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn len(&self) -> usize {
        (self.head - self.tail) as usize
    }

    fn slot(&self, idx: u64) -> usize {
        (idx % self.slots.len() as u64) as usize
    }

    pub(crate) fn get(&self, idx: u64) -> &RecvWqe {
        &self.slots[self.slot(idx)]
    }

    /// The byte lengths of the WQEs queued, oldest first.
    pub(crate) fn lengths(&self) -> impl Iterator<Item = u64> + '_ {
        (self.tail..self.head).map(|i| self.get(i).length)
    }

    pub(crate) fn sgl(&self, idx: u64) -> &[Sge] {
        let s = self.slot(idx);
        let n = self.slots[s].num_sge as usize;
        &self.sges[s * self.max_sge..s * self.max_sge + n]
    }

    /// A queue of `depth` slots holding this one's WQEs, in order (the
    /// caller checks that they fit). Allocates: a resize, not a post.
    pub(crate) fn resized(&self, depth: usize) -> Self {
        let mut q = Self::new(depth, self.max_sge);
        for idx in self.tail..self.head {
            q.push(self.get(idx).wr_id, self.sgl(idx));
        }
        q
    }

    pub(crate) fn push(&mut self, wr_id: u64, sgl: &[Sge]) {
        let s = self.slot(self.head);
        let length = sgl.iter().map(|e| u64::from(e.length)).sum();
        self.slots[s] = RecvWqe { wr_id, num_sge: sgl.len() as u32, length };
        self.sges[s * self.max_sge..s * self.max_sge + sgl.len()].copy_from_slice(sgl);
        self.head += 1;
    }

    /// Puts a WQE back at the front, to be taken next (one taken for a
    /// message that never came); false when the queue is full or the
    /// SGEs do not fit.
    pub(crate) fn push_front(&mut self, wr_id: u64, sgl: &[Sge]) -> bool {
        if self.len() == self.capacity() || sgl.len() > self.max_sge || self.tail == 0 {
            return false;
        }
        self.tail -= 1;
        let s = self.slot(self.tail);
        let length = sgl.iter().map(|e| u64::from(e.length)).sum();
        self.slots[s] = RecvWqe { wr_id, num_sge: sgl.len() as u32, length };
        self.sges[s * self.max_sge..s * self.max_sge + sgl.len()].copy_from_slice(sgl);
        true
    }
}

/// The receive WQE a responder is filling: taken off its receive queue (or
/// SRQ) when a message starts, so that QPs sharing an SRQ never fill the
/// same WQE. Its SGE storage is allocated once, at QP creation.
#[derive(Debug)]
pub(crate) struct RecvCur {
    pub(crate) active: bool,
    pub(crate) wr_id: u64,
    pub(crate) length: u64,
    pub(crate) sges: Vec<Sge>,
    /// Bytes at the message's start that are not placed (a tag matching
    /// header; `u64::MAX`: none of the message).
    pub(crate) skip: u64,
    /// What a tag matching SRQ made of the message.
    pub(crate) tm: Option<TmCur>,
}

/// A message on a tag matching SRQ, as its completion reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TmCur {
    /// `TmRecv` (tagged) or `TmNoTag`.
    pub(crate) opcode: crate::wqe::WcOpcode,
    /// Flags of the completion at its end.
    pub(crate) flags: crate::wqe::WcFlags,
    /// Status of the completion at its end.
    pub(crate) status: crate::wqe::WcStatus,
    /// The tag and application context it reports (0 unless matched).
    pub(crate) tag: u64,
    pub(crate) app_ctx: u32,
    /// A matched rendezvous: its READ follows the message's end.
    pub(crate) rndv: Option<crate::tm::Rvh>,
}

impl RecvCur {
    pub(crate) fn new(max_sge: usize) -> Self {
        Self {
            active: false,
            wr_id: 0,
            length: 0,
            sges: Vec::with_capacity(max_sge),
            skip: 0,
            tm: None,
        }
    }
}

impl RecvQueue {
    /// Moves the oldest WQE into `cur`; false if the queue is empty.
    pub(crate) fn pop_into(&mut self, cur: &mut RecvCur) -> bool {
        if self.tail == self.head {
            return false;
        }
        let w = *self.get(self.tail);
        cur.sges.clear();
        cur.sges.extend_from_slice(self.sgl(self.tail));
        cur.wr_id = w.wr_id;
        cur.length = w.length;
        cur.active = true;
        cur.skip = 0;
        cur.tm = None;
        self.tail += 1;
        true
    }
}

/// Walks a scatter/gather list from a byte offset, yielding `(sge, offset
/// within it, length)` pieces that cover `len` bytes. Stops early if the
/// list is shorter.
pub(crate) fn sgl_pieces(
    sgl: &[Sge],
    mut offset: u64,
    mut len: u64,
) -> impl Iterator<Item = (Sge, u64, u64)> + '_ {
    sgl.iter().filter_map(move |sge| {
        let l = u64::from(sge.length);
        if len == 0 {
            return None;
        }
        if offset >= l {
            offset -= l;
            return None;
        }
        let take = (l - offset).min(len);
        let piece = (*sge, offset, take);
        offset = 0;
        len -= take;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces() {
        let sgl = [
            Sge { addr: 100, length: 10, lkey: 1 },
            Sge { addr: 200, length: 5, lkey: 2 },
            Sge { addr: 300, length: 20, lkey: 3 },
        ];
        let v: Vec<_> = sgl_pieces(&sgl, 8, 10).map(|(s, o, l)| (s.lkey, o, l)).collect();
        assert_eq!(v, [(1, 8, 2), (2, 0, 5), (3, 0, 3)]);
        let v: Vec<_> = sgl_pieces(&sgl, 0, 100).map(|(s, o, l)| (s.lkey, o, l)).collect();
        assert_eq!(v, [(1, 0, 10), (2, 0, 5), (3, 0, 20)]);
        assert_eq!(sgl_pieces(&sgl, 35, 1).count(), 0);
    }
}
