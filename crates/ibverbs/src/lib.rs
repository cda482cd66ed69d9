//! uroce's drop-in `libibverbs.so.1`: the libibverbs C ABI of rdma-core 44
//! over the uroce verbs API, so that unmodified verbs programs (rdma-core's
//! examples, perftest) run with `LD_LIBRARY_PATH=target/release/uroce-lib`.
//!
//! - Exports: `exports.txt` lists every C name with its version node;
//!   `build.rs` generates the version script and an assembly label per name
//!   that jumps to the Rust function of that name in the listed module.
//! - Objects: every object handed to C starts with the public rdma-core
//!   struct (`abi`), followed by uroce's handle ([`objects`]); the
//!   `ibv_context_ops` / `verbs_context` tables and the `ibv_qp_ex` /
//!   `ibv_cq_ex` function pointers are filled so that the header's static
//!   inline verbs (`ibv_post_send`, `ibv_poll_cq`, `ibv_wr_*`, ...) work.
//! - Devices come from uroce's configuration (`UROCE_DEVICES`, ...), never
//!   from sysfs or `/dev/infiniband`.
//! - No panic crosses into C ([`ffi::guard`]); errors are the errno values
//!   rdma-core returns, in its conventions (positive return, or NULL / -1
//!   with `errno`).
//!
//! `librdmacm.so.1` is the same file (one copy of the stack per process):
//! the RDMA CM's C API over `uroce::cm` (module `rdmacm`).

// `unsafe` is confined to the modules that cross the C boundary; the
// others (and any new module) are checked.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod abi;
#[allow(unsafe_code)]
mod ah;
#[allow(unsafe_code)]
mod context;
#[allow(unsafe_code)]
mod cq;
#[allow(unsafe_code)]
mod device;
#[allow(unsafe_code)]
mod dm;
#[allow(unsafe_code)]
mod ffi;
#[allow(unsafe_code)]
mod flow;
#[allow(unsafe_code)]
mod import;
#[allow(unsafe_code)]
mod misc;
#[allow(unsafe_code)]
mod mw;
#[allow(unsafe_code)]
mod objects;
#[allow(unsafe_code)]
mod pd;
#[allow(unsafe_code)]
mod provider;
#[allow(unsafe_code)]
mod qp;
#[allow(unsafe_code)]
mod qp_ex;
#[allow(unsafe_code)]
mod rdmacm;
#[allow(unsafe_code)]
mod srq;
#[allow(unsafe_code)]
mod wq;
mod wr_batch;
#[allow(unsafe_code)]
mod xrc;

/// The exported symbols, each a jump to its function (see `build.rs`).
#[allow(unsafe_code)]
mod exports {
    include!(concat!(env!("OUT_DIR"), "/exports_asm.rs"));
}
