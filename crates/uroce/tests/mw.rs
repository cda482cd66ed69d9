//! Memory windows over UDP: type 1 (ibv_bind_mw) and type 2 (BindMw WR),
//! access inside and outside the window, stale keys after a rebind, SEND
//! with invalidate, LOCAL_INV, and binds beyond the region.

use std::net::IpAddr;

use uroce::{
    Access, Context, Cq, Mr, MwType, Pd, Qp, QpCaps, RecvWr, SendFlags, SendWr, WcFlags, WcOpcode,
    WcStatus, WrOpcode,
};

const ALL: Access = Access(1 | 2 | 4 | 8);
const WITH_BIND: Access = Access(1 | 2 | 4 | 8 | 16);
const RW: Access = Access(2 | 4);

struct End {
    _ctx: Context,
    pd: Pd,
    qp: Qp,
    cq: Cq,
    mr: Mr,
}

fn pair(k: u16) -> (End, End) {
    let _ = k;
    let port = uroce::testing::free_port();
    let mk = |addr: &str| {
        let ctx = uroce::testing::open(addr, port);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let mr = pd.alloc_mr(64 * 1024, WITH_BIND).unwrap();
        let cap = QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let qp = uroce::testing::rc_qp(&pd, &cq, cap, true);
        End { _ctx: ctx, pd, qp, cq, mr }
    };
    let (a, b) = (mk("127.0.0.1"), mk("127.0.0.2"));
    let (ia, ib): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&a.qp, ib, port, b.qp.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&b.qp, ia, port, a.qp.qpn(), 2, 1, ALL).unwrap();
    (a, b)
}

use uroce::testing::wait_completion as wait;

fn write(a: &End, addr: u64, rkey: u32) -> WcStatus {
    let sge = [a.mr.sge(0, 64).unwrap()];
    a.qp.post_send(&[SendWr {
        wr_id: 5,
        opcode: WrOpcode::RdmaWrite,
        sgl: &sge,
        remote_addr: addr,
        rkey,
        ..SendWr::default()
    }])
    .unwrap();
    wait(&a.cq).status
}

#[test]
fn type1_window_limits_access_and_rebinds_change_the_key() {
    let (a, b) = pair(0);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let old = mw.rkey();
    let rkey = b.qp.bind_mw(&mw, &b.mr, 4096, 4096, RW, 77).unwrap();
    let c = wait(&b.cq);
    assert_eq!((c.wr_id, c.opcode, c.status), (77, WcOpcode::BindMw, WcStatus::Success));
    assert_ne!(rkey, old);
    assert_eq!(mw.rkey(), rkey);
    let base = b.mr.addr();
    a.mr.write(0, &[0xab; 64]).unwrap();
    assert_eq!(write(&a, base + 4096, rkey), WcStatus::Success);
    let mut got = [0u8; 64];
    b.mr.read(4096, &mut got).unwrap();
    assert_eq!(got, [0xab; 64]);
    // Rebind elsewhere: the old key is stale at once.
    let rkey2 = b.qp.bind_mw(&mw, &b.mr, 8192, 4096, RW, 78).unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::Success);
    assert_eq!(write(&a, base + 8192, rkey2), WcStatus::Success);
    assert_eq!(write(&a, base + 4096, rkey), WcStatus::RemAccessErr, "stale key after rebind");
}

/// `ibv_bind_mw` with no region and length 0: the window is unbound, its
/// key stale; a bind after that works again.
#[test]
fn type1_window_unbinds_without_a_region() {
    let (a, b) = pair(3);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = b.qp.bind_mw(&mw, &b.mr, 0, 4096, RW, 1).unwrap();
    wait(&b.cq);
    let unbound = b.qp.unbind_mw(&mw, 2).unwrap();
    let c = wait(&b.cq);
    assert_eq!((c.wr_id, c.opcode, c.status), (2, WcOpcode::BindMw, WcStatus::Success));
    assert!(unbound != rkey && mw.rkey() == unbound);
    assert_eq!(write(&a, b.mr.addr(), unbound), WcStatus::RemAccessErr, "covers nothing");
    let (a, b2) = pair(4);
    let mw2 = b2.pd.alloc_mw(MwType::Type1).unwrap();
    let first = b2.qp.bind_mw(&mw2, &b2.mr, 0, 4096, RW, 1).unwrap();
    wait(&b2.cq);
    b2.qp.unbind_mw(&mw2, 2).unwrap();
    wait(&b2.cq);
    let again = b2.qp.bind_mw(&mw2, &b2.mr, 0, 4096, RW, 3).unwrap();
    assert_eq!(wait(&b2.cq).status, WcStatus::Success);
    assert_eq!(write(&a, b2.mr.addr(), again), WcStatus::Success, "bound again");
    let t2 = b2.pd.alloc_mw(MwType::Type2).unwrap();
    assert!(b2.qp.unbind_mw(&t2, 4).is_err(), "type 2 windows are invalidated instead");
    assert_eq!(write(&a, b2.mr.addr(), first), WcStatus::RemAccessErr, "stale after unbind");
}

#[test]
fn type1_window_bounds() {
    let (a, b) = pair(1);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = b.qp.bind_mw(&mw, &b.mr, 4096, 4096, RW, 1).unwrap();
    wait(&b.cq);
    // Inside the region but outside the window.
    assert_eq!(write(&a, b.mr.addr() + 4096 + 4090, rkey), WcStatus::RemAccessErr);
}

#[test]
fn bind_beyond_the_region_fails() {
    let (_a, b) = pair(2);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    assert!(b.qp.bind_mw(&mw, &b.mr, 60 * 1024, 8192, RW, 1).is_err(), "checked before posting");
    // A region without MW_BIND cannot carry a window.
    let plain = b.pd.alloc_mr(4096, ALL).unwrap();
    b.qp.bind_mw(&mw, &plain, 0, 4096, RW, 2).unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::MwBindErr);
}

#[test]
fn type2_window_send_with_invalidate_and_local_inv() {
    let (a, b) = pair(3);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    assert!(b.qp.bind_mw(&mw, &b.mr, 0, 4096, RW, 1).is_err(), "type 2 binds by WR");
    let bind = mw.bind_info(&b.mr, 0, 4096, RW).unwrap();
    b.qp.post_send(&[SendWr {
        wr_id: 3,
        opcode: WrOpcode::BindMw,
        bind: Some(bind),
        ..SendWr::default()
    }])
    .unwrap();
    assert_eq!(wait(&b.cq).opcode, WcOpcode::BindMw);
    let rkey = bind.new_rkey;
    assert_eq!(write(&a, b.mr.addr(), rkey), WcStatus::Success);
    // A SEND with invalidate revokes the window at B.
    b.qp.post_recv(&[RecvWr { wr_id: 9, sgl: &[b.mr.sge(32 * 1024, 64).unwrap()] }]).unwrap();
    a.qp.post_send(&[SendWr {
        wr_id: 6,
        opcode: WrOpcode::SendWithInv,
        flags: SendFlags::INLINE | SendFlags::SIGNALED,
        inline_data: Some(b"bye"),
        imm_or_inv: rkey,
        ..SendWr::default()
    }])
    .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let r = wait(&b.cq);
    assert_eq!((r.wr_id, r.imm_or_inv), (9, rkey));
    assert!(r.flags.contains(WcFlags::WITH_INV));
    assert_eq!(write(&a, b.mr.addr(), rkey), WcStatus::RemAccessErr, "invalidated window");

    // Bind again (new key byte), then LOCAL_INV at B.
    let (a, b) = pair(4);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = mw.bind_info(&b.mr, 0, 4096, RW).unwrap();
    b.qp.post_send(&[SendWr {
        wr_id: 3,
        opcode: WrOpcode::BindMw,
        bind: Some(bind),
        ..SendWr::default()
    }])
    .unwrap();
    wait(&b.cq);
    assert_eq!(write(&a, b.mr.addr(), bind.new_rkey), WcStatus::Success);
    b.qp.post_send(&[SendWr {
        wr_id: 4,
        opcode: WrOpcode::LocalInv,
        imm_or_inv: bind.new_rkey,
        ..SendWr::default()
    }])
    .unwrap();
    let c = wait(&b.cq);
    assert_eq!((c.opcode, c.status), (WcOpcode::LocalInv, WcStatus::Success));
    assert_eq!(write(&a, b.mr.addr(), bind.new_rkey), WcStatus::RemAccessErr);
}
