//! The responder's checks, in rxe's order, before any byte moves: the PSN
//! against the expected one, then the request itself (opcode sequence,
//! the QP's access rights, packet length). The R_Key, bounds and
//! resources are checked as each operation executes (`execute`).

use uroce_wire::{Operation, Position, RocePacket};

use super::{InMsg, Reject};
use crate::qp::Qp;
use crate::qp::attr::Access;

/// Where a request's PSN falls against the expected PSN.
pub(super) enum PsnCheck {
    /// The expected one: execute it.
    Expected,
    /// Ahead: packets were lost (a sequence NAK, once per gap).
    Ahead,
    /// Behind: a duplicate (answered from what was done).
    Duplicate,
}

/// The rights a FLUSH of placement type `placement` needs (QP and
/// region); `None` for no type or an unknown bit.
pub(super) fn flush_rights(placement: u8) -> Option<Access> {
    use crate::wqe::FlushOp;
    if placement == 0 || placement & !(FlushOp::GLOBAL | FlushOp::PERSISTENT) != 0 {
        return None;
    }
    let mut a = Access::NONE;
    if placement & FlushOp::GLOBAL != 0 {
        a = a | Access::FLUSH_GLOBAL;
    }
    if placement & FlushOp::PERSISTENT != 0 {
        a = a | Access::FLUSH_PERSISTENT;
    }
    Some(a)
}

impl Qp {
    /// IBTA §9.7.5.1.1: compares the request's PSN with the expected PSN.
    pub(super) fn check_psn(&self, pkt: &RocePacket<&[u8]>) -> PsnCheck {
        let d = pkt.bth().psn().diff(self.resp.epsn);
        match d {
            0 => PsnCheck::Expected,
            d if d > 0 => PsnCheck::Ahead,
            _ => PsnCheck::Duplicate,
        }
    }

    /// The request itself (IBTA §9.7.5.1.3 and C9-…): opcode sequence,
    /// opcode validity for this QP, packet length.
    pub(super) fn check_request(&self, pkt: &RocePacket<&[u8]>) -> Result<(), Reject> {
        let info = pkt.info();
        let invalid = Reject::INVALID_REQUEST;
        // Opcode sequence (IBTA §9.7.5.1.3 / C9-…): a message in progress
        // continues with MIDDLE/LAST of the same operation; otherwise only
        // FIRST/ONLY may start one.
        let continues = matches!(info.position, Position::Middle | Position::Last);
        match (self.resp.in_msg, info.operation, continues) {
            (InMsg::None, _, false) => {}
            (InMsg::Send { .. }, Operation::Send, true) => {}
            (InMsg::Write { .. }, Operation::RdmaWrite, true) => {}
            _ => return Err(invalid),
        }
        // Opcode validity: the QP must allow the remote operation.
        let qp_access = self.attr.access;
        let needed = match info.operation {
            Operation::Send => Access::NONE,
            Operation::RdmaWrite => Access::REMOTE_WRITE,
            Operation::RdmaReadRequest => Access::REMOTE_READ,
            Operation::CompareSwap | Operation::FetchAdd => Access::REMOTE_ATOMIC,
            Operation::AtomicWrite => Access::REMOTE_WRITE,
            // The placement types asked for (IBA 1.5, as rxe checks them).
            Operation::Flush => match pkt.feth() {
                Some(f) => flush_rights(f.placement()).ok_or(Reject::INVALID_REQUEST)?,
                None => return Err(invalid),
            },
            _ => return Err(invalid),
        };
        if !qp_access.contains(needed) {
            return Err(invalid);
        }
        // Length (packet level): FIRST and MIDDLE carry exactly one MTU;
        // LAST and ONLY at most one.
        let mtu = self.mtu();
        let plen = pkt.payload_len() as u32;
        let len_ok = match info.position {
            Position::First | Position::Middle => plen == mtu,
            Position::Last => plen <= mtu && plen > 0,
            Position::Only => plen <= mtu,
        };
        if !len_ok && matches!(info.operation, Operation::Send | Operation::RdmaWrite) {
            return Err(invalid);
        }
        Ok(())
    }
}
