//! Tag matching (`IBV_SRQT_TM`): an SRQ that, besides plain receive WQEs,
//! keeps a list of tagged buffers. A SEND whose payload starts with a tag
//! matching header (TMH: opcode, application context, 64-bit tag) lands in
//! the oldest buffer whose tag it matches, header stripped; one that matches
//! none is *unexpected* and lands whole in a plain WQE, for software to
//! match. A rendezvous request (TMH and RVH: the sender's address, key and
//! length) that matches is fetched by an RDMA READ into the tagged buffer,
//! after which the responder tells the sender with a FIN message (a SEND
//! carrying a TMH). This is the semantics of rdma-core's verbs (man
//! `ibv_post_srq_ops`, `ibv_create_srq_ex`) as mlx5 implements them.
//!
//! Phase synchronisation: software and the device both count unexpected
//! messages. A tagged buffer added while software had not yet seen every
//! unexpected message (the count it passed differs from the device's) could
//! be matched to a later message that software should match to one of those
//! unexpected ones, so it is held back (not matched, its ADD completion
//! flagged `SYNC_REQ`) until an operation reports the device's count.

use std::collections::VecDeque;

use crate::wqe::{Completion, PostError, Sge, WcFlags, WcOpcode, WcStatus};

/// Bytes of the tag matching header at the start of a TM message.
pub const TMH_LEN: usize = 16;
/// Bytes of the rendezvous header after the TMH of a rendezvous request.
pub const RVH_LEN: usize = 16;
/// The longest rendezvous request a sender may send (TMH, RVH and its own
/// header): `max_rndv_hdr_size`, as mlx5 reports it.
pub const MAX_RNDV_HDR: u32 = 64;
/// Tagged buffers an SRQ may hold at most (`max_num_tags`).
pub const MAX_TAGS: u32 = 255;
/// List operations outstanding at most (`max_ops`): ours complete as they
/// are posted, so this only bounds one call's chain.
pub const MAX_OPS: u32 = 1 << 15;
/// Rendezvous transfers one QP runs at a time (send queue slots it keeps
/// for their READs and FINs); a request beyond them is unexpected.
pub const RNDV_SLOTS: u32 = 16;

/// The TMH opcodes (`enum ibv_tmh_op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmhOp {
    /// Not tagged: a plain receive.
    NoTag = 0,
    /// Rendezvous request: TMH, then RVH.
    Rndv = 1,
    /// The end of a rendezvous, sent back to its requester.
    Fin = 2,
    /// Eager: the data follows the TMH.
    Eager = 3,
}

/// A tag matching header (`struct ibv_tmh`, big-endian on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tmh {
    /// Its opcode byte (a [`TmhOp`] value, or anything a sender wrote).
    pub op: u8,
    /// Opaque application context.
    pub app_ctx: u32,
    /// The tag.
    pub tag: u64,
}

impl Tmh {
    /// The header at the start of `payload`, if it is long enough.
    pub fn parse(payload: &[u8]) -> Option<Self> {
        let h: &[u8; TMH_LEN] = payload.get(..TMH_LEN)?.try_into().ok()?;
        Some(Self {
            op: h[0],
            app_ctx: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
            tag: u64::from_be_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]),
        })
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; TMH_LEN] {
        let mut h = [0u8; TMH_LEN];
        h[0] = self.op;
        h[4..8].copy_from_slice(&self.app_ctx.to_be_bytes());
        h[8..16].copy_from_slice(&self.tag.to_be_bytes());
        h
    }
}

/// A rendezvous header (`struct ibv_rvh`): where the data waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rvh {
    /// The sender's virtual address.
    pub va: u64,
    /// Its R_Key.
    pub rkey: u32,
    /// Bytes to fetch.
    pub len: u32,
}

impl Rvh {
    /// The header after the TMH of `payload`, if it is long enough.
    pub fn parse(payload: &[u8]) -> Option<Self> {
        let h = payload.get(TMH_LEN..TMH_LEN + RVH_LEN)?;
        let be64 = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap_or([0; 8]));
        let be32 = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap_or([0; 4]));
        Some(Self { va: be64(&h[0..8]), rkey: be32(&h[8..12]), len: be32(&h[12..16]) })
    }
}

/// A list operation (`struct ibv_ops_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpsWr {
    /// The operation's id, reported by its completion.
    pub wr_id: u64,
    /// What to do.
    pub op: TmOp,
    /// Generate a completion (`IBV_OPS_SIGNALED`).
    pub signaled: bool,
    /// Report `unexpected_cnt` (`IBV_OPS_TM_SYNC`).
    pub sync: bool,
    /// Unexpected messages software has handled.
    pub unexpected_cnt: u32,
}

/// `IBV_WR_TAG_ADD`, `_DEL` and `_SYNC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmOp {
    /// Adds a tagged buffer.
    Add {
        /// Reported by the buffer's receive completions.
        recv_wr_id: u64,
        /// The buffer (none: a zero-length one).
        sge: Option<Sge>,
        /// A message matches when `tmh.tag & mask == tag`.
        tag: u64,
        /// See `tag`.
        mask: u64,
    },
    /// Removes the buffer an ADD returned `handle` for.
    Del {
        /// The ADD's handle.
        handle: u32,
    },
    /// Only reports the count (with `sync`).
    Sync,
}

/// A tagged buffer.
#[derive(Debug, Clone, Copy)]
struct Entry {
    tag: u64,
    mask: u64,
    recv_wr_id: u64,
    sge: Option<Sge>,
    /// Order of addition: the oldest match wins.
    seq: u64,
    /// Added out of sync: not matched until software catches up.
    held: bool,
}

/// A tagged buffer a message matched (taken off the list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matched {
    /// The ADD's `recv_wr_id`.
    pub recv_wr_id: u64,
    /// The buffer.
    pub sge: Option<Sge>,
}

/// A TM SRQ's list of tagged buffers and its counters.
#[derive(Debug)]
pub struct TagList {
    /// By handle; `None` for a free handle.
    entries: Vec<Option<Entry>>,
    /// Free handles, reused oldest first (as mlx5).
    free: VecDeque<u32>,
    next_seq: u64,
    /// Unexpected messages the device saw.
    unexpected: u32,
    /// The count software last reported.
    reported: u32,
    /// The CQ that list operations and the SRQ's receives complete on.
    cq: u32,
}

impl TagList {
    /// A list of up to `max_tags` buffers whose completions go to `cq`.
    pub fn new(max_tags: u32, cq: u32) -> Self {
        let n = max_tags.clamp(1, MAX_TAGS);
        Self {
            entries: vec![None; n as usize],
            free: (0..n).collect(),
            next_seq: 0,
            unexpected: 0,
            reported: 0,
            cq,
        }
    }

    /// The CQ of the SRQ's completions.
    pub fn cq(&self) -> u32 {
        self.cq
    }

    /// Unexpected messages counted so far.
    pub fn unexpected_count(&self) -> u32 {
        self.unexpected
    }

    /// Whether software has reported every unexpected message.
    fn in_sync(&self) -> bool {
        self.reported == self.unexpected
    }

    /// Runs one list operation: the handle an ADD got, and the completion
    /// it asked for (on [`TagList::cq`]).
    ///
    /// # Errors
    /// [`PostError::QueueFull`] (ENOMEM) for an ADD to a full list,
    /// [`PostError::TooManySge`] for more than one SGE (checked by the
    /// caller, which sees the list).
    pub fn post(&mut self, wr: &OpsWr) -> Result<(Option<u32>, Option<Completion>), PostError> {
        if wr.sync {
            self.reported = wr.unexpected_cnt;
            if self.in_sync() {
                for e in self.entries.iter_mut().flatten() {
                    e.held = false;
                }
            }
        }
        let (handle, opcode, status, flags) = match wr.op {
            TmOp::Add { recv_wr_id, sge, tag, mask } => {
                let h = self.free.pop_front().ok_or(PostError::QueueFull)?;
                let held = !self.in_sync();
                let seq = self.next_seq;
                self.next_seq += 1;
                self.entries[h as usize] = Some(Entry { tag, mask, recv_wr_id, sge, seq, held });
                let flags = if held { WcFlags::TM_SYNC_REQ } else { WcFlags::NONE };
                (Some(h), WcOpcode::TmAdd, WcStatus::Success, flags)
            }
            TmOp::Del { handle } => {
                let slot = self.entries.get_mut(handle as usize);
                let status = match slot {
                    Some(s @ Some(_)) => {
                        *s = None;
                        self.free.push_back(handle);
                        WcStatus::Success
                    }
                    // Consumed by a message meanwhile, or never added.
                    _ => WcStatus::TmErr,
                };
                let flags = if self.in_sync() { WcFlags::NONE } else { WcFlags::TM_SYNC_REQ };
                (None, WcOpcode::TmDel, status, flags)
            }
            TmOp::Sync => (None, WcOpcode::TmSync, WcStatus::Success, WcFlags::NONE),
        };
        let c = wr.signaled.then(|| {
            let mut c = Completion::new(wr.wr_id, status, opcode, 0, true);
            c.flags = flags;
            c
        });
        Ok((handle, c))
    }

    /// The oldest buffer (not held back) whose tag `tag` matches, taken off
    /// the list.
    pub fn take_match(&mut self, tag: u64) -> Option<Matched> {
        let (h, _) = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(h, e)| e.map(|e| (h, e)))
            .filter(|(_, e)| !e.held && tag & e.mask == e.tag)
            .min_by_key(|(_, e)| e.seq)?;
        let e = self.entries[h].take()?;
        self.free.push_back(h as u32);
        Some(Matched { recv_wr_id: e.recv_wr_id, sge: e.sge })
    }

    /// Counts an unexpected message: whether its completion asks software
    /// to report its count (it fell far behind, as mlx5 flags it).
    pub fn unexpected(&mut self) -> bool {
        self.unexpected = self.unexpected.wrapping_add(1);
        self.unexpected.wrapping_sub(self.reported) > 0x3fff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(tag: u64, mask: u64, id: u64) -> OpsWr {
        OpsWr {
            wr_id: id,
            op: TmOp::Add { recv_wr_id: id, sge: None, tag, mask },
            signaled: true,
            sync: false,
            unexpected_cnt: 0,
        }
    }

    #[test]
    fn headers_round_trip_big_endian() {
        let t = Tmh { op: 3, app_ctx: 0x0102_0304, tag: 0x1122_3344_5566_7788 };
        let b = t.encode();
        assert_eq!(&b[4..8], &[1, 2, 3, 4]);
        assert_eq!(b[8], 0x11);
        assert_eq!(Tmh::parse(&b), Some(t));
        assert_eq!(Tmh::parse(&b[..15]), None);
        let mut r = b.to_vec();
        r.extend_from_slice(&0xaabbu64.to_be_bytes());
        r.extend_from_slice(&7u32.to_be_bytes());
        r.extend_from_slice(&4096u32.to_be_bytes());
        assert_eq!(Rvh::parse(&r), Some(Rvh { va: 0xaabb, rkey: 7, len: 4096 }));
        assert_eq!(Rvh::parse(&r[..31]), None);
    }

    #[test]
    fn the_oldest_match_wins_and_handles_come_back_oldest_first() {
        let mut l = TagList::new(3, 9);
        let (h0, c) = l.post(&add(0x10, 0xf0, 1)).unwrap();
        assert_eq!(h0, Some(0));
        let c = c.unwrap();
        assert_eq!((c.opcode, c.wr_id, c.flags), (WcOpcode::TmAdd, 1, WcFlags::NONE));
        l.post(&add(0x12, 0xff, 2)).unwrap();
        assert_eq!(l.post(&add(0x13, 0xff, 3)).unwrap().0, Some(2));
        assert_eq!(l.post(&add(0, 0, 4)), Err(PostError::QueueFull));
        // 0x12 matches entry 1 (masked) and entry 2 (exact): the oldest.
        assert_eq!(l.take_match(0x12).map(|m| m.recv_wr_id), Some(1));
        assert_eq!(l.take_match(0x12).map(|m| m.recv_wr_id), Some(2));
        assert_eq!(l.take_match(0x12), None);
        // Handle 0 freed first, then 1: reused in that order.
        assert_eq!(l.post(&add(1, !0, 5)).unwrap().0, Some(0));
        let del = |h| OpsWr {
            wr_id: 7,
            op: TmOp::Del { handle: h },
            signaled: true,
            sync: false,
            unexpected_cnt: 0,
        };
        assert_eq!(l.post(&del(2)).unwrap().1.unwrap().status, WcStatus::Success);
        // Gone already.
        assert_eq!(l.post(&del(2)).unwrap().1.unwrap().status, WcStatus::TmErr);
        assert_eq!(l.post(&del(99)).unwrap().1.unwrap().status, WcStatus::TmErr);
        assert_eq!(l.take_match(0x13), None);
    }

    #[test]
    fn a_buffer_added_out_of_sync_waits_for_the_count() {
        let mut l = TagList::new(8, 0);
        l.post(&add(1, !0, 1)).unwrap();
        assert!(!l.unexpected());
        // Added before software saw the unexpected message: held.
        let (_, c) = l.post(&add(2, !0, 2)).unwrap();
        assert_eq!(c.unwrap().flags, WcFlags::TM_SYNC_REQ);
        assert_eq!(l.take_match(2), None);
        // Added in sync before it: still matched.
        assert_eq!(l.take_match(1).map(|m| m.recv_wr_id), Some(1));
        let sync =
            OpsWr { wr_id: 27, op: TmOp::Sync, signaled: true, sync: true, unexpected_cnt: 1 };
        let c = l.post(&sync).unwrap().1.unwrap();
        assert_eq!((c.opcode, c.wr_id, c.flags), (WcOpcode::TmSync, 27, WcFlags::NONE));
        assert_eq!(l.take_match(2).map(|m| m.recv_wr_id), Some(2));
        let unsignaled = OpsWr { signaled: false, ..add(3, !0, 3) };
        assert_eq!(l.post(&unsignaled).unwrap().1, None);
    }
}
