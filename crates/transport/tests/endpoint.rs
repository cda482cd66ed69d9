//! The endpoint: demux by QPN into each QP, completions onto their CQs,
//! arming and notification, timers, the GSI hook, and scheduling by work:
//! a thousand idle connected QPs never enter the active queue while one QP
//! carries traffic.

use std::net::{IpAddr, Ipv4Addr};

use uroce_sim::TestMemory;
use uroce_transport::endpoint::{FIRST_QPN, GSI_QPN};
use uroce_transport::wire::{LocalAckTimeout, Mtu, Psn, RnrTimer, RocePacket};
use uroce_transport::{
    Access, AttrMask, Endpoint, Instant, Path, Qp, QpAttr, QpCaps, QpInit, QpState, QpType, RecvWr,
    SendFlags, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
};

const PD: u32 = 1;
const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const ALL: Access = Access(1 | 2 | 4 | 8);

struct Side {
    ep: Endpoint,
    mem: TestMemory,
    cq: u32,
    addr: IpAddr,
}

fn side(addr: IpAddr) -> Side {
    let mut ep = Endpoint::new();
    let cq = ep.create_cq(4096);
    Side { ep, mem: TestMemory::new(), cq, addr }
}

fn new_qp(s: &mut Side) -> u32 {
    let qpn = s.ep.alloc_qpn();
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = Qp::new(QpInit {
        qpn,
        qp_type: QpType::Rc,
        pd: PD,
        caps,
        sq_sig_all: true,
        max_unacked_psns: 128,
        port_mtu: Mtu::Mtu1024,
        uses_srq: false,
    });
    s.ep.add_qp(qp, s.cq, s.cq, None);
    qpn
}

fn connect(s: &mut Side, qpn: u32, peer: IpAddr, peer_qpn: u32, now: Instant) {
    let qp = s.ep.qp_mut(qpn).unwrap();
    let mut attr = QpAttr { state: QpState::Init, access: ALL, ..QpAttr::default() };
    qp.modify(
        now,
        &attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    attr.state = QpState::ReadyToReceive;
    attr.path = Some(Path {
        dst: peer,
        dst_port: 4791,
        sgid_index: 0,
        flow_label: 0,
        hop_limit: 64,
        traffic_class: 0,
    });
    attr.path_mtu = Mtu::Mtu1024;
    attr.dest_qpn = peer_qpn;
    attr.rq_psn = Psn::new(100);
    attr.max_dest_rd_atomic = 16;
    attr.min_rnr_timer = RnrTimer::from_code(1);
    let m = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    qp.modify(now, &attr, m).unwrap();
    attr.state = QpState::ReadyToSend;
    attr.sq_psn = Psn::new(100);
    attr.timeout = LocalAckTimeout::saturating(14);
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.max_rd_atomic = 16;
    let m = AttrMask::STATE
        | AttrMask::SQ_PSN
        | AttrMask::TIMEOUT
        | AttrMask::RETRY_CNT
        | AttrMask::RNR_RETRY
        | AttrMask::MAX_QP_RD_ATOMIC;
    qp.modify(now, &attr, m).unwrap();
}

/// Moves every packet `from` has ready to `to`; returns how many, and the
/// longest the sender's active queue was meanwhile.
fn flow(from: &mut Side, to: &mut Side, now: Instant, drop: bool) -> (usize, usize) {
    let mut buf = vec![0u8; 8192];
    let (mut n, mut busiest) = (0, from.ep.active_len());
    while let Some(t) = from.ep.poll_transmit(now, &from.mem, &mut buf) {
        busiest = busiest.max(from.ep.active_len());
        n += 1;
        if drop {
            continue;
        }
        let pkt = RocePacket::new_checked(&buf[..t.len]).expect("a well-formed packet");
        to.ep.handle_datagram(now, from.addr, to.addr, &pkt, &to.mem);
    }
    (n, busiest)
}

fn drain(s: &mut Side) -> Vec<uroce_transport::Completion> {
    let mut cq = s.ep.cq(s.cq).unwrap().lock();
    std::iter::from_fn(|| cq.pop()).collect()
}

#[test]
fn a_thousand_idle_qps_stay_out_of_the_active_queue() {
    let mut now = Instant::from_nanos(1);
    let (mut a, mut b) = (side(A), side(B));
    let (qa, qb) = (new_qp(&mut a), new_qp(&mut b));
    assert_eq!(qa, FIRST_QPN);
    connect(&mut a, qa, B, qb, now);
    connect(&mut b, qb, A, qa, now);
    for i in 0..1000 {
        let q = new_qp(&mut a);
        connect(&mut a, q, B, 0x80_0000 + i, now);
    }
    // One pass settles everything that was touched.
    assert_eq!(flow(&mut a, &mut b, now, false).0, 0);
    assert_eq!(a.ep.active_len(), 0, "idle QPs left the active queue");
    assert_eq!(a.ep.poll_timeout(), None, "no idle QP has a timer");

    let (addr, lkey, _) = a.mem.register(PD, 1 << 16, ALL);
    let (baddr, blkey, _) = b.mem.register(PD, 1 << 16, ALL);
    let msg: Vec<u8> = (0..5000u32).map(|i| (i * 13) as u8).collect();
    a.mem.fill(addr, &msg);
    for round in 0..20u64 {
        let sge = [Sge { addr: baddr, length: 8192, lkey: blkey }];
        b.ep.qp_mut(qb).unwrap().post_recv(&[RecvWr { wr_id: round, sgl: &sge }]).unwrap();
        let sge = [Sge { addr, length: msg.len() as u32, lkey }];
        let wr = SendWr { wr_id: round, opcode: WrOpcode::Send, sgl: &sge, ..SendWr::default() };
        a.ep.qp_mut(qa).unwrap().post_send(now, &[wr]).unwrap();
        let (sent, busiest) = flow(&mut a, &mut b, now, false);
        assert_eq!((sent, busiest), (5, 1), "only the posting QP is active");
        assert!(a.ep.poll_timeout().is_some(), "the retransmit timer is armed");
        flow(&mut b, &mut a, now, false);
        flow(&mut a, &mut b, now, false);
        let got = drain(&mut b);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].opcode, got[0].byte_len), (WcOpcode::Recv, 5000));
        assert_eq!(b.mem.snapshot(baddr, msg.len()), msg);
        let done = drain(&mut a);
        assert_eq!((done.len(), done[0].wr_id, done[0].status), (1, round, WcStatus::Success));
        now = Instant::from_nanos(now.as_nanos() + 1000);
    }
    assert_eq!(a.ep.active_len(), 0);
}

#[test]
fn timers_fire_through_the_heap_and_resend() {
    let now = Instant::from_nanos(1);
    let (mut a, mut b) = (side(A), side(B));
    let (qa, qb) = (new_qp(&mut a), new_qp(&mut b));
    connect(&mut a, qa, B, qb, now);
    connect(&mut b, qb, A, qa, now);
    let (addr, lkey, _) = a.mem.register(PD, 4096, ALL);
    let (baddr, _, brkey) = b.mem.register(PD, 4096, ALL);
    a.mem.fill(addr, b"lost once");
    let sge = [Sge { addr, length: 9, lkey }];
    let wr = SendWr {
        opcode: WrOpcode::RdmaWrite,
        sgl: &sge,
        remote_addr: baddr,
        rkey: brkey,
        flags: SendFlags::SIGNALED,
        ..SendWr::default()
    };
    a.ep.qp_mut(qa).unwrap().post_send(now, &[wr]).unwrap();
    assert_eq!(flow(&mut a, &mut b, now, true).0, 1, "the WRITE is lost");
    let due = a.ep.poll_timeout().expect("a deadline");
    assert!(due > now);
    let early = Instant::from_nanos(due.as_nanos() - 1);
    assert_eq!(a.ep.handle_timeout(early), 0, "not before its time");
    assert_eq!(a.ep.handle_timeout(due), 1);
    assert_eq!(flow(&mut a, &mut b, due, false).0, 1, "resent");
    flow(&mut b, &mut a, due, false);
    flow(&mut a, &mut b, due, false);
    assert_eq!(b.mem.snapshot(baddr, 9), b"lost once");
    assert_eq!(drain(&mut a)[0].status, WcStatus::Success);
    assert_eq!(a.ep.poll_timeout(), None, "nothing outstanding, no timer");
}

#[test]
fn armed_cqs_notify_once_and_events_and_gsi_reach_the_driver() {
    let now = Instant::from_nanos(1);
    let (mut a, mut b) = (side(A), side(B));
    let (qa, qb) = (new_qp(&mut a), new_qp(&mut b));
    connect(&mut a, qa, B, qb, now);
    connect(&mut b, qb, A, qa, now);
    let (baddr, blkey, _) = b.mem.register(PD, 4096, ALL);
    for i in 0..2 {
        let sge = [Sge { addr: baddr, length: 64, lkey: blkey }];
        b.ep.qp_mut(qb).unwrap().post_recv(&[RecvWr { wr_id: i, sgl: &sge }]).unwrap();
    }
    b.ep.cq(b.cq).unwrap().lock().arm(false);
    for _ in 0..2 {
        let wr = SendWr { opcode: WrOpcode::Send, ..SendWr::default() };
        a.ep.qp_mut(qa).unwrap().post_send(now, &[wr]).unwrap();
    }
    flow(&mut a, &mut b, now, false);
    flow(&mut b, &mut a, now, false);
    assert_eq!(b.ep.poll_cq_notify(), Some(b.cq));
    assert_eq!(b.ep.poll_cq_notify(), None, "one notification per arming");
    assert_eq!(b.ep.cq(b.cq).unwrap().lock().len(), 2);
    assert_eq!(b.ep.cq(b.cq).unwrap().lock().unacked_events(), 1);

    // A packet to QPN 1: dropped as unknown until the GSI hook is on.
    let mut buf = vec![0u8; 8192];
    let wr = SendWr { opcode: WrOpcode::Send, ..SendWr::default() };
    a.ep.qp_mut(qa).unwrap().post_send(now, &[wr]).unwrap();
    let t = a.ep.poll_transmit(now, &a.mem, &mut buf).unwrap();
    buf[5..8].copy_from_slice(&GSI_QPN.to_be_bytes()[1..]);
    let pkt = RocePacket::new_checked(&buf[..t.len]).unwrap();
    b.ep.handle_datagram(now, A, B, &pkt, &b.mem);
    assert_eq!(b.ep.stats.drop_unknown_qpn, 1);
    b.ep.enable_gsi(4);
    b.ep.handle_datagram(now, A, B, &pkt, &b.mem);
    let g = b.ep.poll_gsi().expect("kept for the GSI agent");
    assert_eq!((g.from, g.to, g.bytes.len()), (A, B, t.len));

    // A destroyed QP's counters join the device's.
    let before = b.ep.stats.rcvd_pkts;
    let (qp, left) = b.ep.remove_qp(qb).unwrap();
    assert_eq!((qp.qpn(), left.len()), (qb, 0));
    assert!(b.ep.qp(qb).is_none());
    assert_eq!(b.ep.stats.rcvd_pkts, before + qp.stats().rcvd_pkts);
    assert!(qp.stats().rcvd_pkts >= 2);
}
