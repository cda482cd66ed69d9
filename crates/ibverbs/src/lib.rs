//! The drop-in `libibverbs.so.1`: rdma-core's C ABI over uroce.
//!
//! Status: skeleton. The exports, struct layouts and symbol versions land
//! with issue 6; the facts they must satisfy are in `shared/abi/`.

#![deny(unsafe_code)]
