//! The WRs an extended QP collects between `ibv_wr_start` and
//! `ibv_wr_complete` (see `crate::qp_ex`, which fills and posts them). A
//! leaf of its own because every QP's box holds one.

use std::ffi::c_int;

use uroce::transport::UdDest;
use uroce::{MwBind, SendFlags, Sge, WrOpcode};

use crate::abi::ibv_qp_cap;

/// One WR being built.
#[derive(Clone, Copy)]
pub(crate) struct Pending {
    pub(crate) wr_id: u64,
    pub(crate) flags: SendFlags,
    pub(crate) opcode: WrOpcode,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) imm: u32,
    pub(crate) ud: Option<UdDest>,
    pub(crate) bind: Option<MwBind>,
    /// XRC: the target SRQ (`ibv_wr_set_xrc_srqn`).
    pub(crate) xrc_srqn: u32,
    /// Range in `Builder::sges`.
    pub(crate) sge: (usize, usize),
    /// Range in `Builder::bytes` when the data is inline.
    pub(crate) inline: Option<(usize, usize)>,
}

/// The WRs between `ibv_wr_start` and `ibv_wr_complete`.
pub(crate) struct Builder {
    pub(crate) wrs: Vec<Pending>,
    pub(crate) sges: Vec<Sge>,
    pub(crate) bytes: Vec<u8>,
    /// The first error of the batch, reported by `ibv_wr_complete`.
    pub(crate) err: c_int,
}

impl Builder {
    pub(crate) fn new(cap: &ibv_qp_cap) -> Self {
        let n = (cap.max_send_wr as usize).clamp(1, 1024);
        Self {
            wrs: Vec::with_capacity(n),
            sges: Vec::with_capacity(n),
            bytes: Vec::with_capacity(cap.max_inline_data as usize),
            err: 0,
        }
    }

    pub(crate) fn clear(&mut self) {
        self.wrs.clear();
        self.sges.clear();
        self.bytes.clear();
        self.err = 0;
    }
}
