//! Error paths: a cut link, receivers not ready, and remote errors, each
//! with the completion status and QP transitions the spec asks for.

use std::time::Duration;

use uroce_sim::pair::{PD, PairConfig};
use uroce_sim::{LinkConfig, RcPair};
use uroce_transport::{
    Access, DeviceEvent, QpState, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
};

const ALL: Access = Access(1 | 2 | 4 | 8);

fn sends(p: &RcPair) -> Vec<uroce_transport::Completion> {
    p.a.completions.iter().filter(|c| !c.is_recv).copied().collect()
}

#[test]
fn cut_link_exhausts_exactly_the_retry_budget() {
    for retry_cnt in [0u8, 1, 3, 7] {
        let cfg = PairConfig { retry_cnt, timeout: 12, ..PairConfig::default() };
        let link = LinkConfig { down: true, ..LinkConfig::default() };
        let mut p = RcPair::new(7, link, cfg);
        let (src, lk, _) = p.a.mem.register(PD, 64, ALL);
        let (_, _, rk) = p.b.mem.register(PD, 64, ALL);
        let sge = [Sge { addr: src, length: 64, lkey: lk }];
        let w = SendWr {
            wr_id: 1,
            opcode: WrOpcode::RdmaWrite,
            sgl: &sge,
            rkey: rk,
            ..SendWr::default()
        };
        p.a.qp_mut().post_send(p.now, &[w, SendWr { wr_id: 2, ..w }]).unwrap();
        let start = p.now;
        assert!(p.run_until(Duration::from_secs(60), |p| sends(p).len() == 2));
        let c = sends(&p);
        assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::RetryExcErr));
        assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::WrFlushErr));
        let st = p.a.qp().stats();
        assert_eq!(st.local_ack_timeout_err, u64::from(retry_cnt) + 1, "retry_cnt {retry_cnt}");
        assert_eq!(st.retransmits, u64::from(retry_cnt));
        assert_eq!(st.retry_exceeded_err, 1);
        assert_eq!(p.a.qp().state(), QpState::Error);
        // (retry_cnt + 1) timeouts of 4.096 µs × 2^12 ≈ 16.8 ms each.
        let waited = p.now.saturating_since(start);
        let t = Duration::from_nanos(4096 << 12);
        assert!(
            waited >= t * (u32::from(retry_cnt) + 1) && waited < t * (u32::from(retry_cnt) + 2),
            "{waited:?}"
        );
        assert_eq!(p.a.ep.poll_event(), Some(DeviceEvent::QpFatal { qpn: p.a.qpn }));
        // Later posts complete at once with WR_FLUSH_ERR.
        p.a.qp_mut().post_send(p.now, &[SendWr { wr_id: 3, ..w }]).unwrap();
        p.pump();
        assert_eq!(sends(&p)[2].status, WcStatus::WrFlushErr);
    }
}

fn rnr_pair(rnr_retry: u8) -> (RcPair, u64, u32) {
    let cfg = PairConfig { rnr_retry, min_rnr_timer: 14, ..PairConfig::default() }; // 1.28 ms
    let mut p = RcPair::new(11, LinkConfig::default(), cfg);
    let (src, lk, _) = p.a.mem.register(PD, 100, ALL);
    let sge = [Sge { addr: src, length: 100, lkey: lk }];
    p.a.qp_mut().post_send(p.now, &[SendWr { wr_id: 1, sgl: &sge, ..SendWr::default() }]).unwrap();
    let (dst, dk, _) = p.b.mem.register(PD, 100, ALL);
    (p, dst, dk)
}

#[test]
fn rnr_retries_exhaust_exactly() {
    for rnr_retry in [0u8, 2, 6] {
        let (mut p, _, _) = rnr_pair(rnr_retry);
        assert!(p.run_until(Duration::from_secs(10), |p| !sends(p).is_empty()));
        assert_eq!(sends(&p)[0].status, WcStatus::RnrRetryExcErr);
        assert_eq!(p.a.qp().stats().rcvd_rnr_err, u64::from(rnr_retry) + 1);
        assert_eq!(p.b.qp().stats().send_rnr_err, u64::from(rnr_retry) + 1);
        assert_eq!(p.a.qp().state(), QpState::Error);
        // The responder is unharmed.
        assert_eq!(p.b.qp().state(), QpState::ReadyToSend);
    }
}

#[test]
fn infinite_rnr_retry_waits_for_the_receive() {
    let (mut p, dst, dk) = rnr_pair(7);
    // 50 ms of RNR NAKs (about 1.3 ms apart), then the receive shows up.
    assert!(!p.run_until(Duration::from_millis(50), |p| !sends(p).is_empty()));
    assert!(p.b.qp().stats().send_rnr_err > 20);
    p.b.qp_mut()
        .post_recv(&[RecvWr { wr_id: 7, sgl: &[Sge { addr: dst, length: 100, lkey: dk }] }])
        .unwrap();
    assert!(p.run_until(Duration::from_secs(1), |p| !sends(p).is_empty()
        && !p.b.completions.is_empty()));
    assert_eq!(sends(&p)[0].status, WcStatus::Success);
    assert_eq!((p.b.completions[0].wr_id, p.b.completions[0].byte_len), (7, 100));
}

/// Posts one WR from A and returns A's completion and B's state after.
fn remote_error(
    w: impl Fn(u64, u32, u32, u64, u32) -> (WrOpcode, u64, u32, u32),
    b_access: Access,
    len: u32,
) -> (WcStatus, QpState, Option<DeviceEvent>, bool) {
    let mut p = RcPair::new(3, LinkConfig::default(), PairConfig::default());
    let (la, lk, _) = p.a.mem.register(PD, 4096, ALL);
    let (rb, _, rk) = p.b.mem.register(PD, 4096, b_access);
    let (op, addr, rkey, sge_len) = w(rb, rk, lk, la, len);
    let sge = [Sge { addr: la, length: sge_len, lkey: lk }];
    let wr =
        SendWr { wr_id: 1, opcode: op, sgl: &sge, remote_addr: addr, rkey, ..SendWr::default() };
    p.a.qp_mut().post_send(p.now, &[wr]).unwrap();
    assert!(p.run_until(Duration::from_secs(1), |p| !sends(p).is_empty()));
    let guards = p.a.mem.guards_intact() && p.b.mem.guards_intact();
    (sends(&p)[0].status, p.b.qp().state(), p.b.ep.poll_event(), guards)
}

#[test]
fn remote_access_errors() {
    let write = |rb, rk, _lk, _la, len| (WrOpcode::RdmaWrite, rb, rk, len);
    // Wrong rkey.
    let r = remote_error(|rb, rk, _, _, len| (WrOpcode::RdmaWrite, rb, rk ^ 0x100, len), ALL, 64);
    assert_eq!(
        r,
        (
            WcStatus::RemAccessErr,
            QpState::Error,
            Some(DeviceEvent::QpAccessError { qpn: 0x22 }),
            true
        )
    );
    // Out of bounds by one byte.
    let r = remote_error(|rb, rk, _, _, _| (WrOpcode::RdmaWrite, rb + 4096 - 63, rk, 64), ALL, 64);
    assert_eq!(r.0, WcStatus::RemAccessErr);
    assert!(r.3, "guard bytes must be intact");
    // Missing REMOTE_WRITE on the MR.
    let r = remote_error(write, Access(1 | 4 | 8), 64);
    assert_eq!(r.0, WcStatus::RemAccessErr);
    // READ without REMOTE_READ.
    let r =
        remote_error(|rb, rk, _, _, len| (WrOpcode::RdmaRead, rb, rk, len), Access(1 | 2 | 8), 64);
    assert_eq!(r.0, WcStatus::RemAccessErr);
    // Misaligned atomic: an invalid request.
    let r = remote_error(|rb, rk, _, _, _| (WrOpcode::AtomicFetchAndAdd, rb + 4, rk, 8), ALL, 8);
    assert_eq!((r.0, r.1), (WcStatus::RemInvReqErr, QpState::Error));
    // Zero-length WRITE with a bogus rkey: no memory is touched, no check.
    let r = remote_error(|_, _, _, _, _| (WrOpcode::RdmaWrite, 0xdead_0000, 0x4242, 0), ALL, 0);
    assert_eq!((r.0, r.1), (WcStatus::Success, QpState::ReadyToSend));
}

#[test]
fn region_of_another_pd_is_an_access_error() {
    let mut p = RcPair::new(4, LinkConfig::default(), PairConfig::default());
    let (la, lk, _) = p.a.mem.register(PD, 4096, ALL);
    let (rb, _, rk) = p.b.mem.register(PD + 1, 4096, ALL);
    let sge = [Sge { addr: la, length: 16, lkey: lk }];
    let wr = SendWr {
        wr_id: 1,
        opcode: WrOpcode::RdmaWrite,
        sgl: &sge,
        remote_addr: rb,
        rkey: rk,
        ..SendWr::default()
    };
    p.a.qp_mut().post_send(p.now, &[wr]).unwrap();
    assert!(p.run_until(Duration::from_secs(1), |p| !sends(p).is_empty()));
    assert_eq!(sends(&p)[0].status, WcStatus::RemAccessErr);
    assert_eq!(p.b.mem.snapshot(rb, 16), vec![0; 16]);
}

#[test]
fn send_longer_than_receive_is_loc_len_err() {
    let mut p = RcPair::new(5, LinkConfig::default(), PairConfig::default());
    let (la, lk, _) = p.a.mem.register(PD, 4096, ALL);
    let (rb, rlk, _) = p.b.mem.register(PD, 4096, ALL);
    p.b.qp_mut()
        .post_recv(&[RecvWr { wr_id: 9, sgl: &[Sge { addr: rb, length: 100, lkey: rlk }] }])
        .unwrap();
    let sge = [Sge { addr: la, length: 2000, lkey: lk }];
    p.a.qp_mut().post_send(p.now, &[SendWr { wr_id: 1, sgl: &sge, ..SendWr::default() }]).unwrap();
    assert!(p.run_until(Duration::from_secs(1), |p| !sends(p).is_empty()
        && !p.b.completions.is_empty()));
    assert_eq!(sends(&p)[0].status, WcStatus::RemInvReqErr);
    let c = p.b.completions[0];
    assert_eq!((c.wr_id, c.status, c.opcode), (9, WcStatus::LocLenErr, WcOpcode::Recv));
    assert!(p.b.mem.guards_intact());
}

#[test]
fn bad_local_key_is_loc_prot_err() {
    let mut p = RcPair::new(5, LinkConfig::default(), PairConfig::default());
    let (la, lk, _) = p.a.mem.register(PD, 4096, ALL);
    let sge = [Sge { addr: la, length: 64, lkey: lk + 7 }];
    p.a.qp_mut().post_send(p.now, &[SendWr { wr_id: 1, sgl: &sge, ..SendWr::default() }]).unwrap();
    assert!(p.run_until(Duration::from_secs(1), |p| !sends(p).is_empty()));
    assert_eq!(sends(&p)[0].status, WcStatus::LocProtErr);
    assert_eq!(p.a.qp().stats().sent_pkts, 0, "nothing may be sent");
    // A READ into a region without LOCAL_WRITE is a protection error too.
    let mut p = RcPair::new(6, LinkConfig::default(), PairConfig::default());
    let (la, lk, _) = p.a.mem.register(PD, 4096, Access(2 | 4 | 8));
    let (rb, _, rk) = p.b.mem.register(PD, 4096, ALL);
    let sge = [Sge { addr: la, length: 64, lkey: lk }];
    let wr = SendWr {
        wr_id: 1,
        opcode: WrOpcode::RdmaRead,
        sgl: &sge,
        remote_addr: rb,
        rkey: rk,
        ..SendWr::default()
    };
    p.a.qp_mut().post_send(p.now, &[wr]).unwrap();
    assert!(p.run_until(Duration::from_secs(1), |p| !sends(p).is_empty()));
    assert_eq!(sends(&p)[0].status, WcStatus::LocProtErr);
}
