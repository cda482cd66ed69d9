//! Work requests as the application posts them, and the completions the
//! transport reports. Values follow `ibv_wr_opcode`, `ibv_send_flags`,
//! `ibv_wc_status` and `ibv_wc_opcode`, so the C ABI maps them one-to-one.

/// A scatter/gather element: `length` bytes at `addr` in the region `lkey`.
/// Laid out as `struct ibv_sge`, so the C ABI passes SGE lists through
/// without copying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(C)]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

/// Send work request opcode (`ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WrOpcode {
    /// RDMA WRITE.
    RdmaWrite = 0,
    /// RDMA WRITE with immediate.
    RdmaWriteWithImm = 1,
    /// SEND.
    Send = 2,
    /// SEND with immediate.
    SendWithImm = 3,
    /// RDMA READ.
    RdmaRead = 4,
    /// Atomic compare and swap.
    AtomicCmpAndSwp = 5,
    /// Atomic fetch and add.
    AtomicFetchAndAdd = 6,
    /// Local invalidate.
    LocalInv = 7,
    /// Bind memory window.
    BindMw = 8,
    /// SEND with invalidate.
    SendWithInv = 9,
    /// FLUSH (IBA 1.5): makes earlier WRITEs to a range or region globally
    /// visible (or persistent) at the responder before it answers.
    Flush = 14,
    /// ATOMIC WRITE (IBA 1.5): 8 bytes written at once, the value in
    /// `compare_add`.
    AtomicWrite = 15,
}

impl WrOpcode {
    /// From the `ibv_wr_opcode` value.
    pub const fn from_ibv(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::RdmaWrite,
            1 => Self::RdmaWriteWithImm,
            2 => Self::Send,
            3 => Self::SendWithImm,
            4 => Self::RdmaRead,
            5 => Self::AtomicCmpAndSwp,
            6 => Self::AtomicFetchAndAdd,
            7 => Self::LocalInv,
            8 => Self::BindMw,
            9 => Self::SendWithInv,
            14 => Self::Flush,
            15 => Self::AtomicWrite,
            _ => return None,
        })
    }

    /// READ or atomic, ATOMIC WRITE and FLUSH too: counts against
    /// `max_rd_atomic` and is fenced. (rxe does not count FLUSH, yet its
    /// responder keeps a resource for it to answer a duplicate: counting it
    /// keeps the requester within what the responder remembers.)
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            Self::RdmaRead
                | Self::AtomicCmpAndSwp
                | Self::AtomicFetchAndAdd
                | Self::AtomicWrite
                | Self::Flush
        )
    }

    /// Completed by its response (READ response, atomic ACK; FLUSH and
    /// ATOMIC WRITE by a zero-length READ response), never by a plain ACK.
    pub const fn awaits_response(self) -> bool {
        self.is_read_or_atomic()
    }

    /// An atomic operation.
    pub const fn is_atomic(self) -> bool {
        matches!(self, Self::AtomicCmpAndSwp | Self::AtomicFetchAndAdd)
    }

    /// The completion opcode reported for it.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            Self::RdmaWrite | Self::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            Self::Send | Self::SendWithImm | Self::SendWithInv => WcOpcode::Send,
            Self::RdmaRead => WcOpcode::RdmaRead,
            Self::AtomicCmpAndSwp => WcOpcode::CompSwap,
            Self::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            Self::LocalInv => WcOpcode::LocalInv,
            Self::BindMw => WcOpcode::BindMw,
            Self::Flush => WcOpcode::Flush,
            Self::AtomicWrite => WcOpcode::AtomicWrite,
        }
    }
}

/// `ibv_send_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(pub u32);

#[allow(missing_docs)]
impl SendFlags {
    pub const FENCE: Self = Self(1 << 0);
    pub const SIGNALED: Self = Self(1 << 1);
    pub const SOLICITED: Self = Self(1 << 2);
    pub const INLINE: Self = Self(1 << 3);
    pub const NONE: Self = Self(0);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// Where a UD send goes: the address handle's destination plus the WR's
/// remote QPN and Q_Key (`ibv_send_wr.wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// Destination IP (from the AH's GID).
    pub dst: core::net::IpAddr,
    /// Destination UDP port (4791 unless overridden).
    pub dst_port: u16,
    /// Destination QP number (0xFFFFFF for multicast).
    pub remote_qpn: u32,
    /// Q_Key; a value with the high bit set means "use the QP's own Q_Key"
    /// (IBTA §10.2.4.1).
    pub remote_qkey: u32,
    /// Source GID index (the AH's `grh.sgid_index`): which local address
    /// the datagram leaves from.
    pub sgid_index: u8,
    /// The AH's traffic class (the IP header's TOS / traffic class).
    pub traffic_class: u8,
}

/// A send work request (`ibv_send_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// Flags.
    pub flags: SendFlags,
    /// Gather list (or, with `INLINE`, where to copy the inline data from;
    /// see [`SendWr::inline_data`]).
    pub sgl: &'a [Sge],
    /// Inline payload, copied at post time (overrides `sgl` when `INLINE`).
    pub inline_data: Option<&'a [u8]>,
    /// Immediate data, a value sent big-endian (IBTA's ImmDt; a C
    /// `__be32` is `u32::from_be` of it), or the R_Key to invalidate for
    /// `SendWithInv`.
    pub imm_or_inv: u32,
    /// Remote address (RDMA and atomics).
    pub remote_addr: u64,
    /// Remote key (RDMA and atomics).
    pub rkey: u32,
    /// Compare value (CmpSwap), addend (FetchAdd) or the value an ATOMIC
    /// WRITE stores (its 8 bytes in host order, as `ibv_wr_atomic_write`
    /// copies them).
    pub compare_add: u64,
    /// Swap value (CmpSwap).
    pub swap: u64,
    /// Destination of a UD send (required on UD QPs, ignored otherwise).
    pub ud: Option<UdDest>,
    /// The bind of a `BindMw` WR.
    pub bind: Option<crate::memory::MwBind>,
    /// What a `Flush` WR flushes (with `remote_addr` and `rkey`).
    pub flush: Option<FlushOp>,
    /// An XRC initiator's WR: the number of the peer's XRC SRQ it goes to
    /// (`wr.qp_type.xrc.remote_srqn`).
    pub xrc_srqn: u32,
}

/// A FLUSH's placement and selectivity (IBA 1.5 FETH), and the length of
/// the range it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushOp {
    /// Placement type: `FlushOp::GLOBAL` and/or `FlushOp::PERSISTENT`.
    pub placement: u8,
    /// `FlushOp::RANGE` (the range `remote_addr`, `len`) or
    /// `FlushOp::REGION` (the whole region of `rkey`).
    pub selectivity: u8,
    /// The range's length (`RANGE`; 0 flushes nothing but checks the key).
    pub len: u32,
}

#[allow(missing_docs)]
impl FlushOp {
    pub const GLOBAL: u8 = 1;
    pub const PERSISTENT: u8 = 2;
    pub const RANGE: u8 = 0;
    pub const REGION: u8 = 1;
}

impl Default for SendWr<'_> {
    fn default() -> Self {
        Self {
            wr_id: 0,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED,
            sgl: &[],
            inline_data: None,
            imm_or_inv: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            ud: None,
            bind: None,
            flush: None,
            xrc_srqn: 0,
        }
    }
}

/// A receive work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sgl: &'a [Sge],
}

/// Completion status (`ibv_wc_status`). Variants in the enum's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// Success.
    Success = 0,
    /// Local length error: a message longer than the receive buffer.
    LocLenErr = 1,
    /// Local QP operation error.
    LocQpOpErr = 2,
    /// Local protection error: a bad lkey or an SGE outside its region.
    LocProtErr = 4,
    /// Flushed: the QP is in the error state.
    WrFlushErr = 5,
    /// Memory window bind error.
    MwBindErr = 6,
    /// Bad response (unexpected opcode in a response).
    BadRespErr = 7,
    /// Local access error.
    LocAccessErr = 8,
    /// Remote invalid request (NAK).
    RemInvReqErr = 9,
    /// Remote access error (NAK).
    RemAccessErr = 10,
    /// Remote operational error (NAK).
    RemOpErr = 11,
    /// Transport retries exhausted.
    RetryExcErr = 12,
    /// RNR retries exhausted.
    RnrRetryExcErr = 13,
    /// Fatal error.
    FatalErr = 19,
    /// General error.
    GeneralErr = 21,
    /// A tag matching list operation failed (a DEL of a consumed tag).
    TmErr = 22,
    /// A rendezvous the device could not finish (its data longer than the
    /// tagged buffer): software completes it.
    TmRndvIncomplete = 23,
}

impl WcStatus {
    /// The name `ibv_wc_status_str` gives.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::LocLenErr => "local length error",
            Self::LocQpOpErr => "local QP operation error",
            Self::LocProtErr => "local protection error",
            Self::WrFlushErr => "Work Request Flushed Error",
            Self::MwBindErr => "memory management operation error",
            Self::BadRespErr => "bad response error",
            Self::LocAccessErr => "local access error",
            Self::RemInvReqErr => "remote invalid request error",
            Self::RemAccessErr => "remote access error",
            Self::RemOpErr => "remote operation error",
            Self::RetryExcErr => "transport retry counter exceeded",
            Self::RnrRetryExcErr => "RNR retry counter exceeded",
            Self::FatalErr => "fatal error",
            Self::GeneralErr => "general error",
            Self::TmErr => "TM error",
            Self::TmRndvIncomplete => "TM software rendezvous",
        }
    }
}

/// Completion opcode (`ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// SEND.
    Send = 0,
    /// RDMA WRITE.
    RdmaWrite = 1,
    /// RDMA READ.
    RdmaRead = 2,
    /// Compare and swap.
    CompSwap = 3,
    /// Fetch and add.
    FetchAdd = 4,
    /// Bind MW.
    BindMw = 5,
    /// Local invalidate.
    LocalInv = 6,
    /// FLUSH.
    Flush = 8,
    /// ATOMIC WRITE.
    AtomicWrite = 9,
    /// A received SEND.
    Recv = 128,
    /// A received RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
    /// A tag matching list ADD (`IBV_WC_TM_ADD`).
    TmAdd = 130,
    /// A tag matching list DEL.
    TmDel = 131,
    /// A tag matching list SYNC.
    TmSync = 132,
    /// A tagged message received (matched, or unexpected).
    TmRecv = 133,
    /// A message without a tag received on a tag matching SRQ.
    TmNoTag = 134,
}

/// `ibv_wc_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WcFlags(pub u32);

#[allow(missing_docs)]
impl WcFlags {
    pub const GRH: Self = Self(1 << 0);
    pub const WITH_IMM: Self = Self(1 << 1);
    pub const WITH_INV: Self = Self(1 << 3);
    pub const TM_SYNC_REQ: Self = Self(1 << 4);
    pub const TM_MATCH: Self = Self(1 << 5);
    pub const TM_DATA_VALID: Self = Self(1 << 6);
    pub const NONE: Self = Self(0);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The WR's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (meaningful on success; set anyway for diagnostics).
    pub opcode: WcOpcode,
    /// Vendor error (0).
    pub vendor_err: u32,
    /// Bytes received (receive completions, READ and atomic completions).
    pub byte_len: u32,
    /// Immediate data or invalidated R_Key (see `flags`).
    pub imm_or_inv: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// Source QP (UD).
    pub src_qp: u32,
    /// Flags.
    pub flags: WcFlags,
    /// Whether this is a receive completion (goes to the receive CQ).
    pub is_recv: bool,
    /// Whether the sender asked for a solicited event.
    pub solicited: bool,
    /// `wc.sl`. RoCE has no service level on the wire; for UD receives it
    /// carries the datagram's network header type as mlx5 reports it
    /// ([`Completion::SL_ROCE_IPV4`] or [`Completion::SL_ROCE_IPV6`]), which
    /// UCX reads to find the IP header in the GRH area.
    pub sl: u8,
    /// When the completion was placed on its CQ: nanoseconds on the
    /// endpoint's clock (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`; 0 before).
    pub timestamp: u64,
    /// A tag matching receive's tag (its application context is in
    /// `imm_or_inv`): `ibv_wc_read_tm_info`.
    pub tm_tag: u64,
}

impl Completion {
    /// A completion with only the identifying fields set.
    pub const fn new(
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        qp_num: u32,
        is_recv: bool,
    ) -> Self {
        Self {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_or_inv: 0,
            qp_num,
            src_qp: 0,
            flags: WcFlags::NONE,
            is_recv,
            solicited: false,
            sl: 0,
            timestamp: 0,
            tm_tag: 0,
        }
    }

    /// `wc.sl` of a UD receive over RoCEv2/IPv4 (mlx5's L3 type 2).
    pub const SL_ROCE_IPV4: u8 = 2;
    /// `wc.sl` of a UD receive over RoCEv2/IPv6 (mlx5's L3 type 1).
    pub const SL_ROCE_IPV6: u8 = 1;
}

/// Why a post was refused. `errno()` gives what rdma-core returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The QP state does not allow posting (RESET, INIT and RTR for sends;
    /// RESET for receives).
    InvalidState,
    /// The queue is full.
    QueueFull,
    /// More SGEs than the QP was created for.
    TooManySge,
    /// Inline data longer than `max_inline_data`, or inline on a READ or
    /// atomic.
    InlineTooLong,
    /// The opcode is not supported on this QP type.
    InvalidOpcode,
    /// A length the operation cannot take (an atomic not of 8 bytes, a
    /// message over 2^31).
    InvalidLength,
    /// Receives go to the QP's shared receive queue.
    UsesSrq,
    /// An inline WR's gather list names memory this QP cannot read (a bad
    /// L_Key, another PD, or out of bounds).
    BadInlineAddress,
}

impl PostError {
    /// The errno: `ENOMEM` for a full queue, `EINVAL` otherwise.
    pub const fn errno(self) -> i32 {
        match self {
            Self::QueueFull => 12,
            Self::BadInlineAddress => 14,
            _ => 22,
        }
    }
}

impl core::fmt::Display for PostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::InvalidState => "QP state does not allow posting",
            Self::QueueFull => "work queue full",
            Self::TooManySge => "too many scatter/gather elements",
            Self::InlineTooLong => "inline data too long or not allowed",
            Self::InvalidOpcode => "opcode not supported on this QP",
            Self::InvalidLength => "invalid message length",
            Self::UsesSrq => "the QP receives through a shared receive queue",
            Self::BadInlineAddress => "inline gather list names memory the QP cannot read",
        })
    }
}

impl core::error::Error for PostError {}
