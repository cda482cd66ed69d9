//! Device limits: what `query_device` reports, and what every create call
//! enforces.

/// Vendor id reported: IBTA A3.3.1's "no vendor" value 0xFFFFFF, as rxe
/// (pyverbs asserts a non-zero vendor id; perftest and UCX match devices
/// by part id or PCI id, so their generic paths stay).
pub const VENDOR_ID: u32 = 0x00ff_ffff;
/// Vendor part id reported.
pub const VENDOR_PART_ID: u32 = 0;
/// QPs per context.
pub const MAX_QP: u32 = 16384;
/// WRs per send or receive queue.
pub const MAX_QP_WR: u32 = 16384;
/// SGEs per WR.
pub const MAX_SGE: u32 = 32;
/// CQs per context.
pub const MAX_CQ: u32 = 16384;
/// Entries per CQ.
pub const MAX_CQE: u32 = 1 << 20;
/// Memory regions per context (24-bit key index).
pub const MAX_MR: u32 = 1 << 20;
/// Largest memory region.
pub const MAX_MR_SIZE: u64 = 1 << 40;
/// Protection domains per context.
pub const MAX_PD: u32 = 65536;
/// Largest device memory allocation (`max_dm_size`): host memory stands in
/// for on-chip memory, so this is a sanity bound, not a hardware one.
pub const MAX_DM_SIZE: u64 = 1 << 26;
/// Outstanding READ/atomic requests per QP, each direction.
pub const MAX_QP_RD_ATOM: u32 = uroce_transport::RC_MAX_RD_ATOMIC;
/// PSNs an RC requester keeps outstanding at most (its send window before
/// congestion control narrows it). rxe's responder absorbs 128
/// (`RXE_MAX_UNACKED_PSNS`); more overruns it into timeouts.
pub const SEND_WINDOW_PSNS: u32 = 128;
/// Inline bytes per send WR.
pub const MAX_INLINE: u32 = 512;
/// Shared receive queues per context.
pub const MAX_SRQ: u32 = 4096;
/// WRs per shared receive queue.
pub const MAX_SRQ_WR: u32 = 16384;
/// Address handles per context (AHs are plain values here; the limit is
/// what `query_device` reports).
pub const MAX_AH: u32 = 1 << 20;
/// Memory windows per context.
pub const MAX_MW: u32 = 1 << 16;
/// Multicast groups per context.
pub const MAX_MCAST_GRP: u32 = 1024;
/// QPs attached to one multicast group.
pub const MAX_MCAST_QP_ATTACH: u32 = 64;

/// `ibv_device_attr.device_cap_flags`: CURR_QP_STATE_MOD, PORT_ACTIVE_EVENT,
/// SYS_IMAGE_GUID, RC_RNR_NAK_GEN, MEM_WINDOW, MEM_MGT_EXTENSIONS (local and
/// remote invalidation) and MEM_WINDOW_TYPE_2B — what the transport does.
pub const DEVICE_CAP_FLAGS: u32 =
    (1 << 7) | (1 << 10) | (1 << 11) | (1 << 12) | (1 << 17) | (1 << 21) | (1 << 24);
/// Largest message (`ibv_port_attr.max_msg_sz`), as rxe: 2 GiB.
pub const MAX_MSG_SZ: u32 = 1 << 31;
/// `local_ca_ack_delay` reported (rxe's value).
pub const LOCAL_CA_ACK_DELAY: u8 = 15;
/// `ibv_port_attr.port_cap_flags`: `IBV_PORT_IP_BASED_GIDS`, as a RoCE
/// port reports (CM_SUP will come with the RDMA CM).
pub const PORT_CAP_FLAGS: u32 = 0x0400_0000;
/// CQ event moderation's largest count, as mlx5 offers.
pub const MAX_CQ_COUNT: u16 = u16::MAX;
/// CQ event moderation's longest period (µs), as mlx5 offers.
pub const MAX_CQ_PERIOD_US: u16 = 4095;
/// The high half of `device_cap_flags_ex`: `IB_UVERBS_DEVICE_FLUSH_GLOBAL`
/// (bit 38) and `IB_UVERBS_DEVICE_ATOMIC_WRITE` (bit 40), as rxe reports
/// them. Not FLUSH_PERSISTENT: host memory is not persistent.
pub const DEVICE_CAP_FLAGS_EX_HIGH: u64 = (1 << 38) | (1 << 40);
