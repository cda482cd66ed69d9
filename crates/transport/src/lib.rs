//! Sans-IO RoCEv2 transport: the QP state machine and the requester,
//! responder and completer engines.
//!
//! The rules of this crate: it never reads a clock, opens a socket or spawns
//! a thread. Time is passed in as [`Instant`]; every timer is a deadline the
//! caller is told about ([`Qp::poll_timeout`]). The same inputs give the
//! same outputs, bit for bit, which is what makes seeded fault simulation
//! possible. Memory is reached only through the [`Memory`] trait, which
//! checks keys, protection domains, rights and bounds before a byte moves.
//!
//! Status: RC is implemented (SEND, SEND with immediate, RDMA WRITE with and
//! without immediate, RDMA READ, both atomics, retransmission, RNR,
//! go-back-N); UC (no ACKs, whole-message drops); UD (DETH, Q_Keys, GRH in
//! the receive buffer). SRQs and memory windows come later.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cm;
pub mod endpoint;
pub mod fastmap;
pub mod keys;
pub mod memory;
pub mod qp;
mod queue;
pub mod srq;
pub mod stats;
mod time;
pub mod tm;
pub mod wqe;
pub mod xrc_relay;

pub use endpoint::{ControlDatagram, CqRing, DeviceEvent, Endpoint, GsiDatagram, SharedCq};
pub use memory::{AccessError, Accessor, AtomicOp, Key, Memory, MwBind, MwType};
pub use qp::attr::{
    Access, AttrMask, ModifyError, Path, QpAttr, QpState, QpType, check_transition,
};
pub use qp::{
    AWAITED_RUN, AsyncEvent, PostError, Qp, QpCaps, QpInit, QueueGauge, SendShape, Transmit,
};
pub use srq::XrcSrq;
pub use srq::{SharedDomain, SharedSrq, Srq, SrqGauge};
pub use stats::{DropReason, Stats};
pub use time::Instant;
pub use uroce_wire as wire;
pub use wqe::{
    Completion, FlushOp, RecvWr, SendFlags, SendWr, Sge, UdDest, WcFlags, WcOpcode, WcStatus,
    WrOpcode,
};

/// The deepest READ/atomic queue a QP may ask for, in either direction
/// (`max_qp_rd_atom`, `max_qp_init_rd_atom`; rxe allows 128, mlx5 16;
/// perftest asks for the peer's value, so a peer of rxe must take 128).
pub const RC_MAX_RD_ATOMIC: u32 = 128;

/// The most SGEs a receive WQE may have (the storage a QP reserves for the
/// WQE it is filling).
pub const MAX_SGE: usize = 32;
