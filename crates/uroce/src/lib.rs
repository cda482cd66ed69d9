//! uroce: the RDMA verbs model (devices, PDs, MRs, CQs, QPs) implemented in
//! user space over RoCEv2/UDP, with no RDMA hardware or kernel module.
//!
//! Status: this crate re-exports the wire and transport layers; the verbs
//! API lands with issue 3 (see the README's status table).

#![deny(unsafe_code)]

pub use uroce_transport as transport;
pub use uroce_wire as wire;
