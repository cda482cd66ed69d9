//! QP types, states and attributes, and the `ibv_modify_qp` transition rules
//! (IBTA §10.3.1 / C10-..., as Linux's `qp_state_table` and rdma-core apply
//! them): per (current, next) state and QP type, the attributes that must be
//! given and those that may be.

use core::net::IpAddr;

use uroce_wire::{LocalAckTimeout, Mtu, Psn, RnrTimer};

/// Queue pair transport type. Discriminants are `ibv_qp_type`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc = 2,
    /// Unreliable connected.
    Uc = 3,
    /// Unreliable datagram.
    Ud = 4,
    /// XRC initiator (`IBV_QPT_XRC_SEND`): sends to SRQs of the peer's XRC
    /// domain, named per WR; no receive queue.
    XrcSend = 9,
    /// XRC target (`IBV_QPT_XRC_RECV`): receives into the SRQ each request
    /// names (of its own XRC domain); no send queue, PD or CQs of its own.
    XrcRecv = 10,
    /// Raw packet (`IBV_QPT_RAW_PACKET`): whole Ethernet frames, sent as
    /// posted and received as flow rules steer them; no transport. The
    /// endpoint never runs one (the verbs layer's raw module does); only
    /// its modify rules are here.
    RawPacket = 8,
}

impl QpType {
    /// Reliable and connected: RC and both XRC sides (acknowledged,
    /// retried, in PSN order).
    pub const fn is_reliable(self) -> bool {
        matches!(self, Self::Rc | Self::XrcSend | Self::XrcRecv)
    }

    /// Either XRC side.
    pub const fn is_xrc(self) -> bool {
        matches!(self, Self::XrcSend | Self::XrcRecv)
    }
}

/// QP state. Discriminants are `ibv_qp_state`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QpState {
    /// Just created or reset: no packets in or out.
    Reset = 0,
    /// Initialised: receive WRs may be posted; nothing processed.
    Init = 1,
    /// Ready to receive.
    ReadyToReceive = 2,
    /// Ready to send.
    ReadyToSend = 3,
    /// Send queue drain: finish in-flight messages, start none.
    SendQueueDrain = 4,
    /// Send queue error (UD/UC): the send queue stopped after an error.
    SendQueueError = 5,
    /// Error: every WR is flushed.
    Error = 6,
}

impl QpState {
    /// From the `ibv_qp_state` value.
    pub const fn from_ibv(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Reset,
            1 => Self::Init,
            2 => Self::ReadyToReceive,
            3 => Self::ReadyToSend,
            4 => Self::SendQueueDrain,
            5 => Self::SendQueueError,
            6 => Self::Error,
            _ => return None,
        })
    }
}

/// `ibv_qp_attr_mask` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(pub u32);

#[allow(missing_docs)]
impl AttrMask {
    pub const STATE: Self = Self(1 << 0);
    pub const CUR_STATE: Self = Self(1 << 1);
    pub const EN_SQD_ASYNC_NOTIFY: Self = Self(1 << 2);
    pub const ACCESS_FLAGS: Self = Self(1 << 3);
    pub const PKEY_INDEX: Self = Self(1 << 4);
    pub const PORT: Self = Self(1 << 5);
    pub const QKEY: Self = Self(1 << 6);
    pub const AV: Self = Self(1 << 7);
    pub const PATH_MTU: Self = Self(1 << 8);
    pub const TIMEOUT: Self = Self(1 << 9);
    pub const RETRY_CNT: Self = Self(1 << 10);
    pub const RNR_RETRY: Self = Self(1 << 11);
    pub const RQ_PSN: Self = Self(1 << 12);
    pub const MAX_QP_RD_ATOMIC: Self = Self(1 << 13);
    pub const ALT_PATH: Self = Self(1 << 14);
    pub const MIN_RNR_TIMER: Self = Self(1 << 15);
    pub const SQ_PSN: Self = Self(1 << 16);
    pub const MAX_DEST_RD_ATOMIC: Self = Self(1 << 17);
    pub const PATH_MIG_STATE: Self = Self(1 << 18);
    pub const CAP: Self = Self(1 << 19);
    pub const DEST_QPN: Self = Self(1 << 20);
    pub const RATE_LIMIT: Self = Self(1 << 25);

    /// No attribute.
    pub const NONE: Self = Self(0);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    /// Whether any bit of `other` is set.
    pub const fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }
    /// Union.
    pub const fn or(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

impl core::ops::BitOr for AttrMask {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.or(rhs)
    }
}

/// Access rights (`ibv_access_flags`), for QPs and memory regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u32);

#[allow(missing_docs)]
impl Access {
    pub const LOCAL_WRITE: Self = Self(1 << 0);
    pub const REMOTE_WRITE: Self = Self(1 << 1);
    pub const REMOTE_READ: Self = Self(1 << 2);
    pub const REMOTE_ATOMIC: Self = Self(1 << 3);
    pub const MW_BIND: Self = Self(1 << 4);
    pub const ZERO_BASED: Self = Self(1 << 5);
    /// FLUSH with global visibility may reach it (IBA 1.5).
    pub const FLUSH_GLOBAL: Self = Self(1 << 8);
    /// FLUSH to persistence may reach it (IBA 1.5).
    pub const FLUSH_PERSISTENT: Self = Self(1 << 9);
    pub const NONE: Self = Self(0);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for Access {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// Where a connected QP's packets go: the RoCEv2 address vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Path {
    /// Destination IP (from the destination GID).
    pub dst: IpAddr,
    /// Destination UDP port (4791 unless overridden for tests).
    pub dst_port: u16,
    /// Source GID index on the local port.
    pub sgid_index: u8,
    /// Flow label (0: derive the UDP source port from the QPNs, as rxe).
    pub flow_label: u32,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// Traffic class / TOS.
    pub traffic_class: u8,
}

/// The attributes of a QP (`ibv_qp_attr`, the parts a RoCE software
/// transport uses). Which fields are meaningful depends on the mask given to
/// [`Qp::modify`](crate::Qp::modify).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub state: QpState,
    /// The caller's belief about the current state (`IBV_QP_CUR_STATE`).
    pub cur_state: QpState,
    /// Allowed remote operations on this QP's responder.
    pub access: Access,
    /// P_Key table index.
    pub pkey_index: u16,
    /// Port number (1-based).
    pub port: u8,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Primary path.
    pub path: Option<Path>,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Local ACK timeout exponent.
    pub timeout: LocalAckTimeout,
    /// Transport retries (0–7).
    pub retry_cnt: u8,
    /// RNR retries (0–7, 7 = infinite).
    pub rnr_retry: u8,
    /// First PSN expected from the peer.
    pub rq_psn: Psn,
    /// Outstanding RDMA READ / atomic requests this QP may initiate.
    pub max_rd_atomic: u8,
    /// RNR NAK timer this QP's responder sends.
    pub min_rnr_timer: RnrTimer,
    /// First PSN this QP sends.
    pub sq_psn: Psn,
    /// Incoming RDMA READ / atomic requests this QP can have in progress.
    pub max_dest_rd_atomic: u8,
    /// Peer QPN.
    pub dest_qpn: u32,
    /// Ask for an async event when the SQ has drained (`EN_SQD_ASYNC_NOTIFY`).
    pub sq_draining_notify: bool,
}

impl Default for QpAttr {
    fn default() -> Self {
        Self {
            state: QpState::Reset,
            cur_state: QpState::Reset,
            access: Access::NONE,
            pkey_index: 0,
            port: 1,
            qkey: 0,
            path: None,
            path_mtu: Mtu::Mtu1024,
            timeout: LocalAckTimeout::saturating(14),
            retry_cnt: 7,
            rnr_retry: 7,
            rq_psn: Psn::new(0),
            max_rd_atomic: 1,
            min_rnr_timer: RnrTimer::from_code(12),
            sq_psn: Psn::new(0),
            max_dest_rd_atomic: 1,
            dest_qpn: 0,
            sq_draining_notify: false,
        }
    }
}

/// The attribute masks allowed for one transition, per QP type.
#[derive(Clone, Copy)]
struct Rule {
    /// Per type: RC, UC, UD, XRC initiator, XRC target, raw packet.
    required: [u32; 6],
    optional: [u32; 6],
}

const fn idx(t: QpType) -> usize {
    match t {
        QpType::Rc => 0,
        QpType::Uc => 1,
        QpType::Ud => 2,
        QpType::XrcSend => 3,
        QpType::XrcRecv => 4,
        QpType::RawPacket => 5,
    }
}

/// The transition table. `None`: the transition is not allowed.
const fn rule(cur: QpState, next: QpState) -> Option<Rule> {
    use QpState::*;
    const PKEY: u32 = AttrMask::PKEY_INDEX.0;
    const PORT: u32 = AttrMask::PORT.0;
    const QKEY: u32 = AttrMask::QKEY.0;
    const ACC: u32 = AttrMask::ACCESS_FLAGS.0;
    const AV: u32 = AttrMask::AV.0;
    const MTU: u32 = AttrMask::PATH_MTU.0;
    const DQPN: u32 = AttrMask::DEST_QPN.0;
    const RQPSN: u32 = AttrMask::RQ_PSN.0;
    const SQPSN: u32 = AttrMask::SQ_PSN.0;
    const MDRA: u32 = AttrMask::MAX_DEST_RD_ATOMIC.0;
    const MRA: u32 = AttrMask::MAX_QP_RD_ATOMIC.0;
    const RNRT: u32 = AttrMask::MIN_RNR_TIMER.0;
    const TMO: u32 = AttrMask::TIMEOUT.0;
    const RETRY: u32 = AttrMask::RETRY_CNT.0;
    const RNRR: u32 = AttrMask::RNR_RETRY.0;
    const ALT: u32 = AttrMask::ALT_PATH.0;
    const MIG: u32 = AttrMask::PATH_MIG_STATE.0;
    const CUR: u32 = AttrMask::CUR_STATE.0;
    const SQDN: u32 = AttrMask::EN_SQD_ASYNC_NOTIFY.0;
    const fn r(required: [u32; 6], optional: [u32; 6]) -> Option<Rule> {
        Some(Rule { required, optional })
    }
    const NONE: [u32; 6] = [0; 6];
    // RC's, UC's and UD's rules, then the XRC initiator's and target's as
    // Linux's qp_state_table has them (the initiator receives no requests,
    // the target sends none), then a raw packet QP's (a port, nothing
    // else).
    const RC_RTS_OPT: u32 = CUR | ALT | ACC | RNRT | MIG;
    match (cur, next) {
        (_, Reset) => r(NONE, NONE),
        (Reset, Error) => None,
        (_, Error) => r(NONE, NONE),
        (Reset, Init) => {
            let rc = PKEY | PORT | ACC;
            r([rc, rc, PKEY | PORT | QKEY, rc, rc, PORT], NONE)
        }
        (Init, Init) => {
            let rc = PKEY | PORT | ACC;
            r(NONE, [rc, rc, PKEY | PORT | QKEY, rc, rc, PORT])
        }
        (Init, ReadyToReceive) => {
            let rc = AV | MTU | DQPN | RQPSN | MDRA | RNRT;
            let uc = AV | MTU | DQPN | RQPSN;
            let opt = ALT | ACC | PKEY;
            r([rc, uc, 0, uc, rc, 0], [opt, opt, PKEY | QKEY, opt, opt, 0])
        }
        (ReadyToReceive, ReadyToSend) => r(
            [
                TMO | RETRY | RNRR | SQPSN | MRA,
                SQPSN,
                SQPSN,
                TMO | RETRY | RNRR | SQPSN | MRA,
                TMO | SQPSN,
                0,
            ],
            [RC_RTS_OPT, CUR | ALT | ACC | MIG, CUR | QKEY, RC_RTS_OPT, RC_RTS_OPT, 0],
        ),
        (ReadyToSend, ReadyToSend) => {
            let rc = CUR | ACC | ALT | MIG | RNRT;
            r(NONE, [rc, CUR | ACC | ALT | MIG, CUR | QKEY, rc, rc, 0])
        }
        (ReadyToSend, SendQueueDrain) => r(NONE, [SQDN, SQDN, SQDN, SQDN, SQDN, 0]),
        (SendQueueDrain, ReadyToSend) => {
            r(NONE, [RC_RTS_OPT, CUR | ALT | ACC | MIG, CUR | QKEY, RC_RTS_OPT, RC_RTS_OPT, 0])
        }
        (SendQueueDrain, SendQueueDrain) => {
            let rc = PORT | AV | TMO | RETRY | RNRR | MRA | MDRA | ALT | ACC | PKEY | RNRT | MIG;
            r(NONE, [rc, AV | ALT | ACC | PKEY | MIG, PKEY | QKEY, rc, rc, 0])
        }
        // RC has no SQE state: its send errors move the QP to ERR.
        (SendQueueError, ReadyToSend) => {
            Some(Rule { required: NONE, optional: [0, CUR | ACC, CUR | QKEY, 0, 0, 0] })
        }
        _ => None,
    }
}

/// Why `modify` refused (all map to `EINVAL`, as rdma-core reports them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModifyError {
    /// The state transition is not allowed from the current state.
    BadTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A required attribute is missing from the mask.
    MissingAttr(AttrMask),
    /// The mask carries attributes the transition does not accept.
    ExtraAttr(AttrMask),
    /// `IBV_QP_CUR_STATE` disagrees with the QP's state, or is given where
    /// not allowed.
    CurState,
    /// An attribute value is out of range (named).
    BadValue(&'static str),
}

impl ModifyError {
    /// The errno rdma-core returns: always `EINVAL`.
    pub const fn errno(self) -> i32 {
        22
    }
}

impl core::fmt::Display for ModifyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::BadTransition { from, to } => {
                write!(f, "invalid QP transition {from:?} -> {to:?}")
            }
            Self::MissingAttr(m) => write!(f, "required QP attributes missing (mask {:#x})", m.0),
            Self::ExtraAttr(m) => write!(f, "QP attributes not allowed here (mask {:#x})", m.0),
            Self::CurState => f.write_str("IBV_QP_CUR_STATE does not match"),
            Self::BadValue(what) => write!(f, "invalid QP attribute value: {what}"),
        }
    }
}

impl core::error::Error for ModifyError {}

/// Checks a modify request's mask against the transition table (Linux
/// `ib_modify_qp_is_ok`). `next` is `cur` when the mask has no `STATE`.
///
/// # Errors
/// The reason the request is invalid.
pub fn check_transition(
    qp_type: QpType,
    cur: QpState,
    next: QpState,
    mask: AttrMask,
) -> Result<(), ModifyError> {
    if mask.contains(AttrMask::CUR_STATE)
        && !matches!(
            cur,
            QpState::ReadyToReceive
                | QpState::ReadyToSend
                | QpState::SendQueueDrain
                | QpState::SendQueueError
        )
    {
        return Err(ModifyError::CurState);
    }
    let Some(rule) = rule(cur, next) else {
        return Err(ModifyError::BadTransition { from: cur, to: next });
    };
    let required = AttrMask(rule.required[idx(qp_type)]);
    let optional = AttrMask(rule.optional[idx(qp_type)]);
    if !mask.contains(required) {
        return Err(ModifyError::MissingAttr(AttrMask(required.0 & !mask.0)));
    }
    let extra = mask.0 & !(required.0 | optional.0 | AttrMask::STATE.0);
    if extra != 0 {
        return Err(ModifyError::ExtraAttr(AttrMask(extra)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttrMask as M;
    use QpState::*;

    const RC_INIT: AttrMask =
        AttrMask(M::STATE.0 | M::PKEY_INDEX.0 | M::PORT.0 | M::ACCESS_FLAGS.0);
    const RC_RTR: AttrMask = AttrMask(
        M::STATE.0
            | M::AV.0
            | M::PATH_MTU.0
            | M::DEST_QPN.0
            | M::RQ_PSN.0
            | M::MAX_DEST_RD_ATOMIC.0
            | M::MIN_RNR_TIMER.0,
    );
    const RC_RTS: AttrMask = AttrMask(
        M::STATE.0
            | M::TIMEOUT.0
            | M::RETRY_CNT.0
            | M::RNR_RETRY.0
            | M::SQ_PSN.0
            | M::MAX_QP_RD_ATOMIC.0,
    );

    #[test]
    fn rc_pingpong_sequence() {
        // The masks ibv_rc_pingpong passes.
        assert_eq!(check_transition(QpType::Rc, Reset, Init, RC_INIT), Ok(()));
        assert_eq!(check_transition(QpType::Rc, Init, ReadyToReceive, RC_RTR), Ok(()));
        assert_eq!(check_transition(QpType::Rc, ReadyToReceive, ReadyToSend, RC_RTS), Ok(()));
    }

    #[test]
    fn wrong_masks_and_transitions() {
        assert_eq!(
            check_transition(QpType::Rc, Reset, ReadyToReceive, RC_RTR),
            Err(ModifyError::BadTransition { from: Reset, to: ReadyToReceive })
        );
        assert_eq!(
            check_transition(QpType::Rc, Reset, Init, AttrMask(RC_INIT.0 & !M::PORT.0)),
            Err(ModifyError::MissingAttr(M::PORT))
        );
        assert_eq!(
            check_transition(QpType::Rc, Reset, Init, RC_INIT | M::QKEY),
            Err(ModifyError::ExtraAttr(M::QKEY))
        );
        // UC needs no MAX_DEST_RD_ATOMIC and may not take it.
        assert!(check_transition(QpType::Uc, Init, ReadyToReceive, RC_RTR).is_err());
        // CUR_STATE is only valid from RTR/RTS/SQD/SQE.
        assert_eq!(
            check_transition(QpType::Rc, Init, Init, M::CUR_STATE),
            Err(ModifyError::CurState)
        );
        assert!(check_transition(QpType::Rc, Reset, Error, M::STATE).is_err());
        assert_eq!(check_transition(QpType::Rc, ReadyToSend, Error, M::STATE), Ok(()));
        assert_eq!(check_transition(QpType::Rc, Error, Reset, M::STATE), Ok(()));
        assert!(check_transition(QpType::Rc, SendQueueError, ReadyToSend, M::STATE).is_ok());
        assert!(
            check_transition(QpType::Rc, SendQueueError, ReadyToSend, M::STATE | M::ACCESS_FLAGS)
                .is_err()
        );
        assert!(
            check_transition(QpType::Ud, Reset, Init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
                .is_ok()
        );
        assert!(
            check_transition(QpType::Ud, ReadyToReceive, ReadyToSend, M::STATE | M::SQ_PSN).is_ok()
        );
    }
}
