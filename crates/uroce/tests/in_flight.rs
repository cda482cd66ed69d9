//! In-flight safety: a region dropped while a work request that names it
//! is posted ends that request with an error completion, never a read or
//! write of freed memory. Deterministic on the virtual clock: nothing
//! moves between the post and the drop.

use std::net::IpAddr;
use std::time::Duration;

use uroce::{
    Access, Completion, Context, Cq, LinkConfig, Mr, Pd, Qp, QpCaps, QpInitAttr, QpType, RecvWr,
    SendWr, SimNetwork, WcOpcode, WcStatus, WrOpcode,
};

const ALL: Access = Access(1 | 2 | 4 | 8);

struct End {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn pair(seed: u64) -> (SimNetwork, End, End) {
    let net = SimNetwork::new_virtual(seed, LinkConfig::default());
    let (ia, ib): (IpAddr, IpAddr) = ("10.7.0.1".parse().unwrap(), "10.7.0.2".parse().unwrap());
    let end = |name: &str, ip| {
        let ctx = net.device(name, ip, 4791).open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let cap = QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let attr = QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: None,
        };
        let qp = pd.create_qp(&attr).unwrap();
        End { ctx, pd, cq, qp }
    };
    let (a, b) = (end("ia", ia), end("ib", ib));
    uroce::connect(&a.qp, ib, 4791, b.qp.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&b.qp, ia, 4791, a.qp.qpn(), 2, 1, ALL).unwrap();
    (net, a, b)
}

fn next(net: &SimNetwork, a: &End, b: &End, cq: &Cq) -> Completion {
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false)];
    let ok = net
        .run_until(&[&a.ctx, &b.ctx], Duration::from_secs(30), || cq.poll(&mut wc).unwrap() == 1);
    assert!(ok, "no completion");
    wc[0]
}

fn write(a: &End, src: &Mr, len: u32, addr: u64, rkey: u32) {
    let sge = [src.sge(0, len).unwrap()];
    let wr = SendWr {
        wr_id: 1,
        opcode: WrOpcode::RdmaWrite,
        sgl: &sge,
        remote_addr: addr,
        rkey,
        ..SendWr::default()
    };
    a.qp.post_send(&[wr]).unwrap();
}

/// A 1 MiB WRITE is 1024 packets at this link's MTU: the post sends the
/// first window of them at once, the rest wait for ACKs, by which time
/// the region is gone.
#[test]
fn a_source_dropped_mid_write_is_a_local_protection_error() {
    const LEN: usize = 1 << 20;
    let (net, a, b) = pair(1);
    let src = a.pd.alloc_mr(LEN, ALL).unwrap();
    src.write(0, &vec![0xab; LEN]).unwrap();
    let dst = b.pd.alloc_mr(LEN, ALL).unwrap();
    write(&a, &src, LEN as u32, dst.addr(), dst.rkey());
    drop(src);
    assert_eq!(next(&net, &a, &b, &a.cq).status, WcStatus::LocProtErr);
    let got = dst.to_vec();
    let sent = got.iter().take_while(|&&x| x == 0xab).count();
    assert!(sent < LEN, "the message did not complete");
    assert!(got[sent..].iter().all(|&x| x == 0), "nothing read after the drop");
}

#[test]
fn a_target_dropped_before_the_write_lands_is_a_remote_access_error() {
    let (net, a, b) = pair(2);
    let src = a.pd.alloc_mr(1 << 16, ALL).unwrap();
    let dst = b.pd.alloc_mr(1 << 16, ALL).unwrap();
    write(&a, &src, 1 << 16, dst.addr(), dst.rkey());
    drop(dst);
    assert_eq!(next(&net, &a, &b, &a.cq).status, WcStatus::RemAccessErr);
}

#[test]
fn a_receive_buffer_dropped_before_the_send_is_a_local_protection_error() {
    let (net, a, b) = pair(3);
    let inbox = b.pd.alloc_mr(4096, ALL).unwrap();
    b.qp.post_recv(&[RecvWr { wr_id: 7, sgl: &[inbox.sge(0, 4096).unwrap()] }]).unwrap();
    drop(inbox);
    let src = a.pd.alloc_mr(64, ALL).unwrap();
    let sge = [src.sge(0, 64).unwrap()];
    a.qp.post_send(&[SendWr { wr_id: 8, sgl: &sge, ..SendWr::default() }]).unwrap();
    let c = next(&net, &a, &b, &b.cq);
    assert_eq!((c.wr_id, c.status), (7, WcStatus::LocProtErr));
    // The sender learns the message was not taken.
    assert_ne!(next(&net, &a, &b, &a.cq).status, WcStatus::Success);
}
