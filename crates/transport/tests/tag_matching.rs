//! Tag matching SRQs through the endpoint: an EAGER message lands in the
//! oldest tagged buffer it matches, header stripped; an unmatched one in a
//! plain WQE, whole and counted; NO_TAG in a plain WQE; a matched
//! rendezvous is READ into its buffer by the responder's own send queue
//! (a QP with no send queue of its own) and answered with a FIN; list
//! operations complete on the SRQ's CQ.

use std::net::{IpAddr, Ipv4Addr};

use uroce_sim::TestMemory;
use uroce_sim::pair::PairConfig;
use uroce_transport::tm::{OpsWr, TmOp, Tmh, TmhOp};
use uroce_transport::wire::{Mtu, Psn, RocePacket};
use uroce_transport::{
    Access, Completion, Endpoint, Instant, Qp, QpCaps, QpInit, QpState, QpType, RecvWr, SendFlags,
    SendWr, Sge, Srq, WcFlags, WcOpcode, WcStatus, WrOpcode,
};

const PD: u32 = 1;
const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const ALL: Access = Access(1 | 2 | 4 | 8);
const MSG: usize = 3000;

struct Side {
    ep: Endpoint,
    mem: TestMemory,
    cq: u32,
    addr: IpAddr,
    qpn: u32,
    buf: (u64, u32),
    rkey: u32,
}

fn side(addr: IpAddr, tm: bool) -> (Side, Option<u32>) {
    let mut ep = Endpoint::new();
    let cq = ep.create_cq(256);
    let srq = tm.then(|| ep.add_srq(Srq::new_tm(64, 1, 8, cq)));
    let mut mem = TestMemory::new();
    let (addr_, lkey, rkey) = mem.register(PD, 4 * MSG, ALL);
    let qpn = ep.alloc_qpn();
    let caps = QpCaps {
        max_send_wr: if tm { 0 } else { 16 },
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = QpInit {
        qpn,
        qp_type: QpType::Rc,
        pd: PD,
        caps,
        sq_sig_all: false,
        max_unacked_psns: 128,
        port_mtu: Mtu::Mtu1024,
        uses_srq: tm,
    };
    ep.add_qp(Qp::new(init), cq, cq, srq);
    (Side { ep, mem, cq, addr, qpn, buf: (addr_, lkey), rkey }, srq)
}

/// `s`'s QP to RTS, connected to `peer`'s.
fn connect(s: &mut Side, peer: &Side, _now: Instant) {
    let qp = s.ep.qp_mut(s.qpn).unwrap();
    let (psn, cfg) = (Psn::new(100), PairConfig::default());
    uroce_sim::pair::connect(qp, peer.addr, peer.qpn, psn, psn, &cfg);
}

/// A client and a server whose QP takes its receives from a tag matching
/// SRQ, connected; the time, and the SRQ's handle.
fn pair() -> (Instant, Side, Side, u32) {
    let now = Instant::from_nanos(1);
    let (mut a, _) = side(A, false);
    let (mut b, srq) = side(B, true);
    connect(&mut a, &b, now);
    connect(&mut b, &a, now);
    (now, a, b, srq.expect("a TM SRQ"))
}

/// Moves every packet `from` has ready to `to`; how many.
fn flow(from: &mut Side, to: &mut Side, now: Instant) -> usize {
    let mut buf = vec![0u8; 8192];
    let mut n = 0;
    while let Some(t) = from.ep.poll_transmit(now, &from.mem, &mut buf) {
        let pkt = RocePacket::new_checked(&buf[..t.len]).expect("a well-formed packet");
        to.ep.handle_datagram(now, from.addr, to.addr, &pkt, &to.mem);
        n += 1;
    }
    n
}

/// Moves packets both ways until neither side has any.
fn settle(a: &mut Side, b: &mut Side, now: Instant) {
    while flow(a, b, now) + flow(b, a, now) > 0 {}
}

fn drain(s: &mut Side) -> Vec<Completion> {
    let mut cq = s.ep.cq(s.cq).unwrap().lock();
    std::iter::from_fn(|| cq.pop()).collect()
}

fn op(wr_id: u64, op: TmOp, sync: Option<u32>) -> OpsWr {
    OpsWr { wr_id, op, signaled: true, sync: sync.is_some(), unexpected_cnt: sync.unwrap_or(0) }
}

/// Client `a` sends `len` bytes of its buffer, starting with `tmh`.
fn send(a: &mut Side, tmh: Tmh, rest: &[u8], len: usize, now: Instant) {
    let mut msg = tmh.encode().to_vec();
    msg.extend_from_slice(rest);
    msg.resize(len, 0xcc);
    a.mem.fill(a.buf.0, &msg);
    let sge = [Sge { addr: a.buf.0, length: len as u32, lkey: a.buf.1 }];
    let wr = SendWr {
        wr_id: 1,
        opcode: WrOpcode::Send,
        flags: SendFlags::SIGNALED,
        sgl: &sge,
        ..SendWr::default()
    };
    a.ep.qp_mut(a.qpn).unwrap().post_send(now, &[wr]).unwrap();
}

#[test]
fn eager_unexpected_no_tag_and_rendezvous() {
    let (now, mut a, mut b, srq) = pair();
    let (bbuf, blkey) = b.buf;
    // Two plain WQEs at the buffer's second half, tagged buffers in its
    // first: tag 5 (exact) and tag 0x10 under mask 0xf0.
    let plain = [Sge { addr: bbuf + 2 * MSG as u64, length: MSG as u32, lkey: blkey }];
    let recv = RecvWr { wr_id: 77, sgl: &plain };
    b.ep.srq_mut(srq).unwrap().post_recv(&[recv, recv]).unwrap();
    let tagged = |at: u64| Some(Sge { addr: bbuf + at, length: MSG as u32, lkey: blkey });
    let ops = [
        op(1, TmOp::Add { recv_wr_id: 501, sge: tagged(0), tag: 5, mask: !0 }, None),
        op(2, TmOp::Add { recv_wr_id: 502, sge: tagged(MSG as u64), tag: 0x10, mask: 0xf0 }, None),
    ];
    let mut handles = [None; 2];
    b.ep.post_srq_ops(now, srq, &ops, &mut handles).unwrap();
    assert_eq!(handles, [Some(0), Some(1)]);
    let c = drain(&mut b);
    assert!(c.iter().all(|c| c.opcode == WcOpcode::TmAdd && c.status == WcStatus::Success));
    assert_eq!(c.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1, 2]);

    // EAGER, three packets, tag 0x1f matches the masked entry: the match
    // reported at once, the data at the end, without its header.
    let eager = Tmh { op: TmhOp::Eager as u8, app_ctx: 9, tag: 0x1f };
    send(&mut a, eager, b"payload", MSG, now);
    settle(&mut a, &mut b, now);
    let c = drain(&mut b);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!((c[0].opcode, c[0].wr_id, c[0].flags), (WcOpcode::TmRecv, 502, WcFlags::TM_MATCH));
    assert_eq!((c[0].tm_tag, c[0].imm_or_inv), (0x1f, 9));
    assert_eq!((c[1].wr_id, c[1].flags, c[1].byte_len), (502, WcFlags::TM_DATA_VALID, 2984));
    assert_eq!(b.mem.snapshot(bbuf + MSG as u64, 7), b"payload");
    assert_eq!(drain(&mut a)[0].status, WcStatus::Success);

    // Unexpected (tag 6 matches nothing): whole, into a plain WQE.
    let other = Tmh { op: TmhOp::Eager as u8, app_ctx: 0, tag: 6 };
    send(&mut a, other, b"x", 100, now);
    settle(&mut a, &mut b, now);
    let c = drain(&mut b);
    assert_eq!((c[0].opcode, c[0].wr_id, c[0].flags), (WcOpcode::TmRecv, 77, WcFlags::NONE));
    assert_eq!((c[0].byte_len, c[0].tm_tag), (100, 0));
    assert_eq!(b.mem.snapshot(bbuf + 2 * MSG as u64, 16), other.encode());
    assert_eq!(b.ep.srq(srq).unwrap().tm().unwrap().unexpected_count(), 1);
    // Added before software saw it: held back, flagged; the SYNC frees it.
    let add = op(3, TmOp::Add { recv_wr_id: 503, sge: tagged(MSG as u64), tag: 6, mask: !0 }, None);
    b.ep.post_srq_ops(now, srq, &[add], &mut handles).unwrap();
    assert_eq!(drain(&mut b)[0].flags, WcFlags::TM_SYNC_REQ);
    b.ep.post_srq_ops(now, srq, &[op(27, TmOp::Sync, Some(1))], &mut handles).unwrap();
    let c = drain(&mut b);
    assert_eq!((c[0].opcode, c[0].wr_id, c[0].flags), (WcOpcode::TmSync, 27, WcFlags::NONE));

    // NO_TAG: into the other plain WQE, not counted.
    let no_tag = Tmh { op: TmhOp::NoTag as u8, app_ctx: 0, tag: 5 };
    send(&mut a, no_tag, b"", 40, now);
    settle(&mut a, &mut b, now);
    let c = drain(&mut b);
    assert_eq!((c[0].opcode, c[0].wr_id, c[0].byte_len), (WcOpcode::TmNoTag, 77, 40));
    assert_eq!(b.ep.srq(srq).unwrap().tm().unwrap().unexpected_count(), 1);

    // Rendezvous for tag 5: the server READs 2000 bytes at the client's
    // offset 2 * MSG into the tagged buffer, then sends the FIN, which the
    // client takes in a receive of its own.
    let data: Vec<u8> = (0..2000u32).map(|i| (i * 7) as u8).collect();
    a.mem.fill(a.buf.0 + 2 * MSG as u64, &data);
    let fin_buf = [Sge { addr: a.buf.0 + 3 * MSG as u64, length: 64, lkey: a.buf.1 }];
    a.ep.qp_mut(a.qpn).unwrap().post_recv(&[RecvWr { wr_id: 90, sgl: &fin_buf }]).unwrap();
    let rndv = Tmh { op: TmhOp::Rndv as u8, app_ctx: 3, tag: 5 };
    let mut rvh = (a.buf.0 + 2 * MSG as u64).to_be_bytes().to_vec();
    rvh.extend_from_slice(&a.rkey.to_be_bytes());
    rvh.extend_from_slice(&2000u32.to_be_bytes());
    send(&mut a, rndv, &rvh, 64, now);
    settle(&mut a, &mut b, now);
    let c = drain(&mut b);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!((c[0].opcode, c[0].wr_id, c[0].flags), (WcOpcode::TmRecv, 501, WcFlags::TM_MATCH));
    assert_eq!((c[0].tm_tag, c[0].imm_or_inv), (5, 3));
    let done = (c[1].opcode, c[1].wr_id, c[1].flags, c[1].byte_len, c[1].status);
    assert_eq!(done, (WcOpcode::TmRecv, 501, WcFlags::TM_DATA_VALID, 2000, WcStatus::Success));
    assert_eq!(b.mem.snapshot(bbuf, 2000), data);
    let c = drain(&mut a);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    let fin = c.iter().find(|c| c.opcode == WcOpcode::Recv).unwrap();
    assert_eq!((fin.wr_id, fin.byte_len, fin.status), (90, 16, WcStatus::Success));
    let fin_tmh = Tmh::parse(&a.mem.snapshot(a.buf.0 + 3 * MSG as u64, 16)).unwrap();
    assert_eq!(fin_tmh, Tmh { op: TmhOp::Fin as u8, app_ctx: 3, tag: 5 });
    // The tag is gone: a DEL of its handle fails.
    b.ep.post_srq_ops(now, srq, &[op(8, TmOp::Del { handle: 0 }, None)], &mut handles).unwrap();
    assert_eq!(drain(&mut b)[0].status, WcStatus::TmErr);
}

/// What a hostile or careless sender can do to a tag matching SRQ: a
/// message shorter than a header (a plain receive), a rendezvous longer
/// than the tagged buffer (the request placed, software finishes it), and
/// one with a bad key (its READ fails: the buffer completes in error and
/// no byte of it changes).
#[test]
fn short_messages_long_rendezvous_and_bad_keys() {
    let (now, mut a, mut b, srq) = pair();
    let (bbuf, blkey) = b.buf;
    let plain = [Sge { addr: bbuf + 3 * MSG as u64, length: MSG as u32, lkey: blkey }];
    b.ep.srq_mut(srq).unwrap().post_recv(&[RecvWr { wr_id: 77, sgl: &plain }]).unwrap();
    let small = Some(Sge { addr: bbuf, length: 100, lkey: blkey });
    let big = Some(Sge { addr: bbuf + MSG as u64, length: MSG as u32, lkey: blkey });
    let ops = [
        op(1, TmOp::Add { recv_wr_id: 501, sge: small, tag: 1, mask: !0 }, None),
        op(2, TmOp::Add { recv_wr_id: 502, sge: big, tag: 2, mask: !0 }, None),
    ];
    b.ep.post_srq_ops(now, srq, &ops, &mut [None; 2]).unwrap();
    drain(&mut b);

    // Ten bytes: no header; a plain receive, not counted.
    let sge = [Sge { addr: a.buf.0, length: 10, lkey: a.buf.1 }];
    let wr = SendWr { opcode: WrOpcode::Send, sgl: &sge, ..SendWr::default() };
    a.ep.qp_mut(a.qpn).unwrap().post_send(now, &[wr]).unwrap();
    settle(&mut a, &mut b, now);
    let c = drain(&mut b);
    assert_eq!((c[0].opcode, c[0].wr_id, c[0].byte_len), (WcOpcode::TmNoTag, 77, 10));
    assert_eq!(b.ep.srq(srq).unwrap().tm().unwrap().unexpected_count(), 0);

    // 5000 bytes for a 100-byte buffer: the request itself lands there.
    let at = a.buf.0 + MSG as u64;
    let rvh = |len: u32, rkey: u32| {
        let mut r = at.to_be_bytes().to_vec();
        r.extend_from_slice(&rkey.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r
    };
    let rndv = |tag| Tmh { op: TmhOp::Rndv as u8, app_ctx: 4, tag };
    let r = rvh(5000, a.rkey);
    send(&mut a, rndv(1), &r, 48, now);
    settle(&mut a, &mut b, now);
    let c = drain(&mut b);
    assert_eq!(c.len(), 1, "{c:?}");
    let got = (c[0].wr_id, c[0].status, c[0].flags, c[0].byte_len);
    assert_eq!(got, (501, WcStatus::TmRndvIncomplete, WcFlags::TM_MATCH, 48));
    assert_eq!(&b.mem.snapshot(bbuf + 16, 16), &r[..]);

    // A bad R_Key: the READ is NAKed, the buffer completes in error and
    // keeps its bytes; the QP is in error, as after any failed READ.
    let before = b.mem.snapshot(bbuf + MSG as u64, MSG);
    let bad = rvh(2000, a.rkey ^ 0x5a5a_0000);
    send(&mut a, rndv(2), &bad, 48, now);
    settle(&mut a, &mut b, now);
    let c = drain(&mut b);
    assert_eq!((c[0].wr_id, c[0].flags), (502, WcFlags::TM_MATCH));
    let failed = c.iter().find(|c| c.flags == WcFlags::TM_DATA_VALID).expect("the READ's end");
    assert_eq!((failed.wr_id, failed.status), (502, WcStatus::RemAccessErr));
    assert_eq!(b.mem.snapshot(bbuf + MSG as u64, MSG), before);
    assert_eq!(b.ep.qp(b.qpn).unwrap().attr().state, QpState::Error);
    assert!(b.mem.guards_intact() && a.mem.guards_intact());
}

/// Random traffic at a tag matching SRQ, list operations between the
/// messages: every opcode byte (the four TMH ones and others), tags that
/// match and do not, masks, messages shorter than a header, rendezvous of
/// several lengths, DELs of handles that are and are not there. Nothing panics, every completion is one the semantics
/// allow, no byte lands outside a region, and the connection stays up.
#[test]
fn random_tag_matching_traffic_keeps_the_rules() {
    let (now, mut a, mut b, srq) = pair();
    let (bbuf, blkey) = b.buf;
    let mut rng = uroce_sim::SplitMix64::new(7);
    let mut pick = |n: u64| rng.next_u64() % n;
    let plain = [Sge { addr: bbuf + 3 * MSG as u64, length: MSG as u32, lkey: blkey }];
    let fin = [Sge { addr: a.buf.0 + 3 * MSG as u64, length: 64, lkey: a.buf.1 }];
    let (mut tagged, mut plain_left, mut fins_left) = (0u32, 0u32, 0u32);
    // Matched, unexpected, not tagged, rendezvous ended (FINs).
    let mut seen = [0u32; 4];
    for i in 0..400u64 {
        while plain_left < 4 {
            b.ep.srq_mut(srq).unwrap().post_recv(&[RecvWr { wr_id: 77, sgl: &plain }]).unwrap();
            plain_left += 1;
        }
        while fins_left < 4 {
            a.ep.qp_mut(a.qpn).unwrap().post_recv(&[RecvWr { wr_id: 90, sgl: &fin }]).unwrap();
            fins_left += 1;
        }
        let o = match pick(4) {
            0 | 1 => {
                // Each long enough for any message sent (a longer one is a
                // local length error that ends the connection, as for any
                // SEND; `short_messages_long_rendezvous_and_bad_keys` has
                // rendezvous longer than their buffers).
                let len = [2600, MSG as u32][pick(2) as usize];
                let sge = Some(Sge { addr: bbuf, length: len, lkey: blkey });
                let mask = [!0, 0xf0, 0][pick(3) as usize];
                TmOp::Add { recv_wr_id: 500 + i, sge, tag: pick(8), mask }
            }
            2 => TmOp::Del { handle: pick(10) as u32 },
            _ => TmOp::Sync,
        };
        let sync = pick(2) == 0;
        let unexpected = b.ep.srq(srq).unwrap().tm().unwrap().unexpected_count();
        let mut h = [None];
        match b.ep.post_srq_ops(now, srq, &[op(i, o, sync.then_some(unexpected))], &mut h) {
            Ok(()) => tagged += u32::from(h[0].is_some()),
            Err((_, e)) => assert_eq!(e, uroce_transport::PostError::QueueFull, "{o:?}"),
        }
        // A message: any opcode byte, any tag, any length.
        let op_byte = [0, 1, 2, 3, 4, 0xff][pick(6) as usize];
        let tmh = Tmh { op: op_byte, app_ctx: i as u32, tag: pick(8) };
        let len = [4, 16, 31, 48, 64, 1024, 2500][pick(7) as usize];
        let mut rest = (a.buf.0 + MSG as u64).to_be_bytes().to_vec();
        rest.extend_from_slice(&a.rkey.to_be_bytes());
        rest.extend_from_slice(&([0u32, 50, 200, 2000][pick(4) as usize]).to_be_bytes());
        send(&mut a, tmh, &rest, len, now);
        settle(&mut a, &mut b, now);
        for c in drain(&mut b) {
            let ok = match c.opcode {
                WcOpcode::TmAdd | WcOpcode::TmSync => c.status == WcStatus::Success,
                WcOpcode::TmDel => matches!(c.status, WcStatus::Success | WcStatus::TmErr),
                WcOpcode::TmRecv | WcOpcode::TmNoTag => {
                    if c.wr_id == 77 {
                        plain_left -= 1;
                    }
                    let k = match (c.opcode, c.wr_id) {
                        (WcOpcode::TmNoTag, _) => 2,
                        (_, 77) => 1,
                        _ => 0,
                    };
                    seen[k] += 1;
                    matches!(c.status, WcStatus::Success | WcStatus::TmRndvIncomplete)
                }
                _ => false,
            };
            assert!(ok, "message {i}: {c:?}");
        }
        for c in drain(&mut a) {
            assert_eq!(c.status, WcStatus::Success, "message {i}: {c:?}");
            if c.opcode == WcOpcode::Recv {
                fins_left -= 1;
                seen[3] += 1;
            }
        }
    }
    assert!(tagged > 50, "{tagged} buffers added");
    assert!(seen.iter().all(|&n| n > 5), "matched, unexpected, untagged, FINs: {seen:?}");
    assert_eq!(b.ep.qp(b.qpn).unwrap().attr().state, QpState::ReadyToSend);
    assert!(a.mem.guards_intact() && b.mem.guards_intact());
}
