//! What the examples share: a device on a loopback address, a QP, and a
//! wait for completions.

#![allow(dead_code)]

use uroce::{
    Completion, Context, Cq, Device, DeviceConfig, Pd, Qp, QpCaps, QpInitAttr, QpType, WcOpcode,
    WcStatus,
};

/// The UDP port every example's devices use (`UROCE_PORT`, default
/// 18515): one port, two loopback addresses, as two hosts would have.
pub(crate) fn port() -> u16 {
    std::env::var("UROCE_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(18515)
}

/// Opens a device on `addr` (127.0.0.1, 127.0.0.2, ...).
pub(crate) fn open(addr: &str) -> Context {
    let cfg = DeviceConfig { name: addr.into(), addr: addr.parse().unwrap(), port: port() };
    Device::from_config(cfg).open().expect("open the device")
}

/// A QP of `qp_type` on `pd` with both queues on `cq`, every send
/// signaled.
pub(crate) fn qp(pd: &Pd, cq: &Cq, qp_type: QpType, depth: u32) -> Qp {
    let cap = QpCaps {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let attr = QpInitAttr { send_cq: cq, recv_cq: cq, cap, qp_type, sq_sig_all: true, srq: None };
    pd.create_qp(&attr).expect("create a QP")
}

/// Waits for `n` completions, in whatever order they come; panics on an
/// error status.
pub(crate) fn wait(cq: &Cq, n: usize) -> Vec<Completion> {
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 16];
    let mut got = Vec::new();
    while got.len() < n {
        let k = cq.poll(&mut wc[..(n - got.len()).min(16)]).expect("poll");
        for c in &wc[..k] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            got.push(*c);
        }
    }
    got
}
