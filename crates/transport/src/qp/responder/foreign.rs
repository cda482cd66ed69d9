//! What a request would do to memory, worked out before it runs. An XRC
//! target whose request names another process's SRQ reaches that
//! process's memory, which only it can touch: the endpoint asks the owner
//! to run the access (see `crate::xrc_relay`) and runs the request here
//! only once the answer is in. So this must name exactly the access the
//! responder would make, and nothing for a request the responder refuses
//! before any access (the owner's memory is never touched for those).
//! XRC has no ATOMIC WRITE or FLUSH opcodes (IBA 1.5 defines them for RC
//! only), so those never reach a target.

use uroce_wire::{NakCode, Operation, RocePacket, Syndrome};

use super::check::PsnCheck;
use super::{MAX_QUEUED_RD_ATOMIC, RdAtomicRes};
use crate::qp::attr::QpState;
use crate::qp::{AsyncEvent, Qp};

/// A memory access a request makes, for the memory's owner to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ForeignAccess {
    /// An RDMA WRITE packet's data at `va`; on a message's first packet
    /// `check` is the message's length, checked whole before a byte moves.
    Write { rkey: u32, va: u64, check: Option<u32> },
    /// An RDMA READ (`resent`: a duplicate, which the data a first answer
    /// brought may serve).
    Read { rkey: u32, va: u64, len: u32, resent: bool },
    /// A compare and swap.
    CmpSwap { rkey: u32, va: u64, compare: u64, swap: u64 },
    /// A fetch and add.
    FetchAdd { rkey: u32, va: u64, add: u64 },
    /// The invalidation a SEND with invalidate ends with.
    Invalidate { rkey: u32 },
    /// The receive WQE a SEND (or a WRITE with immediate) starting now
    /// takes: the owner takes it, and says how long it is, so that a
    /// message too long for it is refused here, before it is acknowledged.
    Reserve,
}

impl Qp {
    /// The memory access the responder would make for `pkt` if it ran it
    /// now (`None`: it would touch no memory, or refuse it first).
    /// `granted`: the length of the WQE the owner reserved for the message
    /// `pkt` starts, once it has.
    pub(crate) fn foreign_access(
        &self,
        pkt: &RocePacket<&[u8]>,
        granted: Option<u64>,
    ) -> Option<ForeignAccess> {
        if !matches!(
            self.state,
            QpState::ReadyToReceive | QpState::ReadyToSend | QpState::SendQueueDrain
        ) || !self.init.qp_type.is_reliable()
        {
            return None;
        }
        let info = pkt.info();
        match self.check_psn(pkt) {
            PsnCheck::Expected => {}
            PsnCheck::Ahead => return None,
            // A resent READ is read again (see `duplicate`), if remembered.
            PsnCheck::Duplicate => {
                if info.operation != Operation::RdmaReadRequest {
                    return None;
                }
                let psn = pkt.bth().psn();
                let found = self.resp.res.iter().any(|r| {
                    matches!(*r, RdAtomicRes::Read { first_psn, last_psn }
                        if !psn.is_before(first_psn) && !psn.is_after(last_psn))
                });
                let reth = pkt.reth().filter(|r| found && r.dma_len() > 0)?;
                return Some(ForeignAccess::Read {
                    rkey: reth.rkey(),
                    va: reth.va(),
                    len: reth.dma_len(),
                    resent: true,
                });
            }
        }
        self.check_request(pkt).ok()?;
        let queued_ok = self.rd_atomic_queued() < MAX_QUEUED_RD_ATOMIC;
        match info.operation {
            Operation::RdmaWrite => {
                let plen = pkt.payload().len() as u32;
                let (rkey, va, remaining, first) = match self.resp.in_msg {
                    super::InMsg::Write { va, rkey, remaining, .. } => (rkey, va, remaining, false),
                    _ => {
                        let reth = pkt.reth()?;
                        (reth.rkey(), reth.va(), reth.dma_len(), true)
                    }
                };
                if plen > remaining || (info.ends_message() && plen != remaining) {
                    return None;
                }
                // A WRITE with immediate takes a WQE first.
                if pkt.immdt().is_some() && !self.recv_cur.active && granted.is_none() {
                    return Some(ForeignAccess::Reserve);
                }
                let check = (first && remaining > 0).then_some(remaining);
                (plen > 0 || check.is_some()).then_some(ForeignAccess::Write { rkey, va, check })
            }
            Operation::RdmaReadRequest => {
                let reth = pkt.reth()?;
                let len = reth.dma_len();
                (queued_ok && len > 0 && len <= 1 << 31).then_some(ForeignAccess::Read {
                    rkey: reth.rkey(),
                    va: reth.va(),
                    len,
                    resent: false,
                })
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let a = pkt.atomic_eth().filter(|_| queued_ok)?;
                let (rkey, va) = (a.rkey(), a.va());
                Some(if info.operation == Operation::CompareSwap {
                    ForeignAccess::CmpSwap { rkey, va, compare: a.compare(), swap: a.swap_add() }
                } else {
                    ForeignAccess::FetchAdd { rkey, va, add: a.swap_add() }
                })
            }
            Operation::Send => {
                let plen = pkt.payload().len() as u64;
                let (offset, length) = match self.resp.in_msg {
                    super::InMsg::Send { offset } => (offset, self.recv_cur.length),
                    _ if self.recv_cur.active => (0, self.recv_cur.length),
                    _ => match granted {
                        Some(len) => (0, len),
                        None => return Some(ForeignAccess::Reserve),
                    },
                };
                // The invalidation comes after the data is placed: only
                // for a message that fits.
                let ieth = pkt.ieth().filter(|_| info.ends_message() && offset + plen <= length)?;
                Some(ForeignAccess::Invalidate { rkey: ieth.rkey() })
            }
            _ => None,
        }
    }

    /// Whether the responder still needs the data of the READ whose first
    /// PSN is `first` (`len` bytes): responses of it still to send, or the
    /// READ remembered for a resend.
    pub(crate) fn read_still_needed(&self, first: u32, len: u32) -> bool {
        let first = uroce_wire::Psn::new(first);
        let last = first.add(crate::qp::requester::packets(len, self.mtu()) - 1);
        let within = |p: uroce_wire::Psn| !p.is_before(first) && !p.is_after(last);
        self.resp
            .res
            .iter()
            .any(|r| matches!(*r, RdAtomicRes::Read { first_psn, .. } if first_psn == first))
            || self
                .resp
                .out
                .iter()
                .any(|i| matches!(*i, super::RespItem::Read { psn, .. } if within(psn)))
    }

    /// The owner of the memory a request reaches never answered (it is
    /// gone): the request is NAKed (remote operational error) and the QP
    /// fails, as after any fatal NAK.
    pub(crate) fn responder_abort(&mut self) {
        if !matches!(
            self.state,
            QpState::ReadyToReceive | QpState::ReadyToSend | QpState::SendQueueDrain
        ) {
            return;
        }
        let code = NakCode::RemoteOperationalError;
        self.resp.final_nak = Some((self.resp.epsn, Syndrome::Nak(code), self.resp.msn));
        self.fail(AsyncEvent::QpRequestError);
    }
}
