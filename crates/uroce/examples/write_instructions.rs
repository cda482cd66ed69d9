//! The workload `scripts/instructions` counts with callgrind: `N` signaled
//! 8-byte RDMA WRITEs, one at a time, each waited for, between two
//! contexts on a fault-free virtual network (`SimNetwork::new_virtual`).
//! No thread, no clock and no system call: the same build and `N` execute
//! the same instructions on every run, on any machine load, so the count
//! per WRITE is the CI-stable measure of what the verbs stack costs
//! (posting, the requester, the responder's checks and placement, the ACK,
//! the completion and the poll, on both sides, plus the simulated wire).
//!
//! `cargo run --release --features sim --example write_instructions -- N`

use std::net::IpAddr;
use std::time::Duration;

use uroce::{
    Access, Completion, LinkConfig, QpCaps, QpInitAttr, QpType, SendFlags, SendWr, SimNetwork,
    WcOpcode, WcStatus, WrOpcode,
};

fn main() {
    let n: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let net = SimNetwork::new_virtual(1, LinkConfig::default());
    let (ia, ib): (IpAddr, IpAddr) = ("10.9.0.1".parse().unwrap(), "10.9.0.2".parse().unwrap());
    let a = net.device("va", ia, 4791).open().unwrap();
    let b = net.device("vb", ib, 4791).open().unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (ma, mb) = (pa.alloc_mr(4096, rw).unwrap(), pb.alloc_mr(4096, rw).unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let cap = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let attr = |cq| QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap,
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    };
    let qa = pa.create_qp(&attr(&ca)).unwrap();
    let qb = pb.create_qp(&attr(&cb)).unwrap();
    uroce::connect(&qa, ib, 4791, qb.qpn(), 11, 22, rw).unwrap();
    uroce::connect(&qb, ia, 4791, qa.qpn(), 22, 11, rw).unwrap();

    let sge = [ma.sge(0, 8).unwrap()];
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 4];
    let both = [&a, &b];
    for i in 0..n {
        ma.write(0, &u64::from(i).to_le_bytes()).unwrap();
        let wr = SendWr {
            wr_id: u64::from(i),
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED,
            sgl: &sge,
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
            ..SendWr::default()
        };
        qa.post_send(&[wr]).unwrap();
        let mut done = false;
        let ok = net.run_until(&both, Duration::from_secs(1), || {
            let k = ca.poll(&mut wc).unwrap();
            assert!(
                wc[..k].iter().all(|c| c.status == WcStatus::Success && c.wr_id == u64::from(i))
            );
            done |= k > 0;
            done
        });
        assert!(ok, "WRITE {i} did not complete");
    }
    let mut last = [0u8; 8];
    mb.read(0, &mut last).unwrap();
    assert_eq!(u64::from_le_bytes(last), u64::from(n.saturating_sub(1)));
    println!("{n} WRITEs of 8 bytes completed");
}
