//! `rdma_set_option` and the port table behind `rdma_bind_addr`, with the
//! kernel's rules (`drivers/infiniband/core/cma.c`): a port of a port space
//! is owned by the ids bound to it; a second bind conflicts unless both ids
//! set REUSEADDR, with EADDRNOTAVAIL when either address is the wildcard
//! and EADDRINUSE when both name the same address; `rdma_listen` checks a
//! REUSEADDR id again as if it had not, so two listeners never share a
//! port. The table is this process's (ids of other processes live on other
//! devices until one device is shared, issue 15).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::net::IpAddr;

use super::abi::rdma_cm_id;
use super::{IdState, lock, on_id};
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

/// An id bound to a port.
#[derive(Debug, Clone, Copy)]
struct Owner {
    id: usize,
    ip: IpAddr,
    reuseaddr: bool,
    afonly: bool,
}

/// Which ids own which ports, per port space.
#[derive(Debug, Default)]
pub(super) struct Ports {
    owners: HashMap<(u16, u16), Vec<Owner>>,
}

impl Ports {
    /// The errno binding `id` to `ip`:`port` would fail with, if any;
    /// `reuseaddr`: the id's option (false: the listen-time check).
    fn conflict(
        &self,
        id: usize,
        space: u16,
        ip: IpAddr,
        port: u16,
        st: &Options,
        reuseaddr: bool,
    ) -> Option<c_int> {
        for o in self.owners.get(&(space, port))?.iter().filter(|o| o.id != id) {
            if reuseaddr && o.reuseaddr {
                continue;
            }
            if st.afonly && o.afonly && ip.is_ipv4() != o.ip.is_ipv4() {
                continue;
            }
            if ip.is_unspecified() || o.ip.is_unspecified() {
                return Some(libc::EADDRNOTAVAIL);
            }
            if ip == o.ip {
                return Some(libc::EADDRINUSE);
            }
        }
        None
    }

    /// Binds `id` to `ip`:`port` in `space`, or says why not.
    pub(super) fn claim(
        &mut self,
        id: usize,
        space: u16,
        ip: IpAddr,
        port: u16,
        o: &Options,
    ) -> Result<(), c_int> {
        if let Some(e) = self.conflict(id, space, ip, port, o, o.reuseaddr) {
            return Err(e);
        }
        self.release(id);
        self.owners.entry((space, port)).or_default().push(Owner {
            id,
            ip,
            reuseaddr: o.reuseaddr,
            afonly: o.afonly,
        });
        Ok(())
    }

    /// A port of `space` that no id owns, for an id bound without one.
    pub(super) fn ephemeral(&self, space: u16) -> u16 {
        let start = super::ephemeral_port();
        (0..28000u16)
            .map(|i| 32768 + (start - 32768 + i) % 28000)
            .find(|p| !self.owners.contains_key(&(space, *p)))
            .unwrap_or(start)
    }

    /// The listen-time check: a REUSEADDR id may share its port with
    /// others until it listens, never after (its REUSEADDR ends here).
    pub(super) fn listen(
        &mut self,
        id: usize,
        space: u16,
        ip: IpAddr,
        port: u16,
        o: &mut Options,
    ) -> Result<(), c_int> {
        if !o.reuseaddr {
            return Ok(());
        }
        if self.conflict(id, space, ip, port, o, false).is_some() {
            return Err(libc::EADDRINUSE);
        }
        o.reuseaddr = false;
        if let Some(me) =
            self.owners.get_mut(&(space, port)).and_then(|v| v.iter_mut().find(|w| w.id == id))
        {
            me.reuseaddr = false;
        }
        Ok(())
    }

    /// Forgets `id`'s port (the id is destroyed or rebound).
    pub(super) fn release(&mut self, id: usize) {
        self.owners.retain(|_, v| {
            v.retain(|o| o.id != id);
            !v.is_empty()
        });
    }
}

/// Whether an id with these options and local address listens on a
/// device of address `dev`: a wildcard listens on the devices of its
/// family, an IPv6 wildcard on IPv4 devices too unless AFONLY is set.
pub(super) fn listens_on(st: &IdState, local: IpAddr, dev: IpAddr) -> bool {
    match local {
        IpAddr::V4(_) => dev.is_ipv4(),
        IpAddr::V6(_) => dev.is_ipv6() || !st.opts.afonly,
    }
}
