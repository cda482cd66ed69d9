//! `rdma_set_option`, with the kernel's rules for when each option may be
//! set. REUSEADDR and AFONLY act on the port table behind
//! `rdma_bind_addr` (`uroce::cm::ports`, shared with the Rust ids).

use std::ffi::{c_int, c_void};

use super::abi::rdma_cm_id;
use super::{lock, on_id};
use crate::ffi::minus_one;

/// `RDMA_OPTION_ID` and `RDMA_OPTION_IB`, and their names.
const OPTION_ID: c_int = 0;
const OPTION_IB: c_int = 1;
const ID_TOS: c_int = 0;
const ID_REUSEADDR: c_int = 1;
const ID_AFONLY: c_int = 2;
const ID_ACK_TIMEOUT: c_int = 3;
const IB_PATH: c_int = 1;
/// `sizeof(struct ibv_path_data)`: flags, reserved, then a 64-byte path.
const PATH_DATA_LEN: usize = 72;

impl Options {
    /// The options the port table checks.
    pub(super) fn bind(&self) -> uroce::cm::ports::BindOptions {
        uroce::cm::ports::BindOptions { reuseaddr: self.reuseaddr, afonly: self.afonly }
    }
}

/// The options an id carries (see `rdma_set_option`).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Options {
    /// The IP type of service: the traffic class of the connection's
    /// address vector and of its REQ's path.
    pub(super) tos: Option<u8>,
    pub(super) reuseaddr: bool,
    /// IPv6 wildcard ids: IPv6 devices only.
    pub(super) afonly: bool,
    /// The QP's Local ACK Timeout (4.096 µs × 2^n) and the REQ's.
    pub(super) ack_timeout: Option<u8>,
}

/// Reads a `c_int` option value.
fn int_value(val: *const c_void, len: usize) -> Option<c_int> {
    if val.is_null() || len != size_of::<c_int>() {
        return None;
    }
    // SAFETY: the caller's value of the stated (checked) length.
    Some(unsafe { val.cast::<c_int>().read_unaligned() })
}

/// Reads a `u8` option value.
fn u8_value(val: *const c_void, len: usize) -> Option<u8> {
    if val.is_null() || len != 1 {
        return None;
    }
    // SAFETY: as above.
    Some(unsafe { val.cast::<u8>().read() })
}

pub(crate) unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    on_id(id, |b| {
        let mut st = lock(&b.st);
        let bound = st.local.is_some();
        let r = match (level, name) {
            (OPTION_ID, ID_TOS) => u8_value(val, len).map(|v| st.opts.tos = Some(v)),
            (OPTION_ID, ID_REUSEADDR) => {
                // Before the id is bound, or (to clear it) until it listens.
                int_value(val, len).filter(|&v| !bound || (v == 0 && st.listening.is_empty())).map(
                    |v| {
                        st.opts.reuseaddr = v != 0;
                    },
                )
            }
            (OPTION_ID, ID_AFONLY) => {
                int_value(val, len).filter(|_| !bound).map(|v| st.opts.afonly = v != 0)
            }
            (OPTION_ID, ID_ACK_TIMEOUT) => {
                u8_value(val, len).map(|v| st.opts.ack_timeout = Some(v.min(31)))
            }
            // Path records: RoCE paths are the GIDs, which resolution
            // already set; a well-formed array is taken.
            (OPTION_IB, IB_PATH) => {
                (!val.is_null() && len > 0 && len.is_multiple_of(PATH_DATA_LEN)).then_some(())
            }
            (OPTION_ID | OPTION_IB, _) => return minus_one(libc::ENOSYS),
            _ => return minus_one(libc::EINVAL),
        };
        match r {
            Some(()) => 0,
            None => minus_one(libc::EINVAL),
        }
    })
}
