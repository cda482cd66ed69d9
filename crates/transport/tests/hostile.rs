//! Hostile input fed straight into QPs: malformed sequences, forged
//! responses, wrong peers, random packets. Each gets the NAK the spec asks
//! for or a counted drop, never a panic, never a byte outside a region.

use std::net::{IpAddr, Ipv4Addr};

use uroce_sim::pair::{PD, PairConfig};
use uroce_sim::{LinkConfig, RcPair, SplitMix64};
use uroce_transport::{Access, QpState, RecvWr, Sge};
use uroce_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, Headers, NakCode, Opcode, Psn, RethRepr,
    RocePacket, RocePacketRepr, Syndrome,
};

const ALL: Access = Access(1 | 2 | 4 | 8);

fn packet(repr: &RocePacketRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; repr.packet_len(payload.len())];
    repr.emit(&mut buf, payload).unwrap();
    buf
}

fn req(opcode: Opcode, psn: Psn) -> RocePacketRepr {
    RocePacketRepr {
        bth: BthRepr {
            opcode,
            pkey: 0xffff,
            dest_qpn: 0x22,
            psn,
            ack_req: true,
            ..BthRepr::default()
        },
        ..RocePacketRepr::default()
    }
}

/// Delivers a packet to B from A's address and returns B's responses.
fn to_b(p: &mut RcPair, bytes: &[u8]) -> Vec<RocePacketRepr> {
    let pkt = RocePacket::new_checked(bytes).unwrap();
    p.b.ep.qp_mut(p.b.qpn).unwrap().handle_packet(p.now, p.a.addr, &pkt, &p.b.mem);
    let mut out = vec![];
    let mut buf = vec![0u8; 8192];
    while let Some(t) = p.b.ep.qp_mut(p.b.qpn).unwrap().poll_transmit(p.now, &p.b.mem, &mut buf) {
        out.push(RocePacketRepr::parse(&RocePacket::new_checked(&buf[..t.len]).unwrap()));
    }
    out
}

fn epsn(p: &RcPair) -> Psn {
    // B expects A's first PSN: A's sq_psn.
    p.a.qp().attr().sq_psn
}

#[test]
fn middle_without_first_is_an_invalid_request() {
    let mut p = RcPair::new(1, LinkConfig::default(), PairConfig::default());
    let e = epsn(&p);
    let out = to_b(&mut p, &packet(&req(Opcode::RC_SEND_MIDDLE, e), &[0; 1024]));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].aeth.unwrap().syndrome, Syndrome::Nak(NakCode::InvalidRequest));
    assert_eq!(out[0].bth.psn, e);
    assert_eq!(p.b.qp().state(), QpState::Error);
}

#[test]
fn psn_gap_is_nakked_once() {
    let mut p = RcPair::new(2, LinkConfig::default(), PairConfig::default());
    let (rb, rlk, _) = p.b.mem.register(PD, 4096, ALL);
    p.b.qp_mut()
        .post_recv(&[RecvWr { wr_id: 1, sgl: &[Sge { addr: rb, length: 4096, lkey: rlk }] }])
        .unwrap();
    let e = epsn(&p);
    for far in [5u32, 6, 1 << 22] {
        let out = to_b(&mut p, &packet(&req(Opcode::RC_SEND_ONLY, e.add(far)), &[1; 8]));
        if far == 5 {
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].aeth.unwrap().syndrome, Syndrome::Nak(NakCode::PsnSequenceError));
            assert_eq!(out[0].bth.psn, e, "the NAK names the expected PSN");
        } else {
            assert!(out.is_empty(), "only one NAK per gap");
        }
    }
    // The expected PSN still works, and a duplicate of it is re-ACKed.
    let out = to_b(&mut p, &packet(&req(Opcode::RC_SEND_ONLY, e), &[1; 8]));
    assert_eq!(out[0].aeth.unwrap().syndrome, Syndrome::ACK);
    let out = to_b(&mut p, &packet(&req(Opcode::RC_SEND_ONLY, e), &[2; 8]));
    assert_eq!((out[0].bth.psn, out[0].aeth.unwrap().syndrome), (e, Syndrome::ACK));
    assert_eq!(p.b.qp().stats().duplicate_request, 1);
    assert_eq!(p.b.mem.snapshot(rb, 8), vec![1; 8], "a duplicate is never placed twice");
    // A PSN half the space away counts as old: answered as a duplicate.
    let out = to_b(&mut p, &packet(&req(Opcode::RC_SEND_ONLY, e.add(1 << 23)), &[3; 8]));
    assert_eq!(out.len(), 1);
    assert_eq!(p.b.qp().state(), QpState::ReadyToSend);
}

#[test]
fn packets_from_strangers_and_wrong_pkeys_are_dropped() {
    let mut p = RcPair::new(3, LinkConfig::default(), PairConfig::default());
    let e = epsn(&p);
    let bytes = packet(&req(Opcode::RC_SEND_ONLY, e), &[1; 8]);
    let pkt = RocePacket::new_checked(&bytes[..]).unwrap();
    let stranger = IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9));
    p.b.ep.qp_mut(p.b.qpn).unwrap().handle_packet(p.now, stranger, &pkt, &p.b.mem);
    assert_eq!(p.b.qp().stats().drop_wrong_peer, 1);
    let mut r = req(Opcode::RC_SEND_ONLY, e);
    r.bth.pkey = 0x7fff;
    let bytes = packet(&r, &[1; 8]);
    p.b.ep.qp_mut(p.b.qpn).unwrap().handle_packet(
        p.now,
        p.a.addr,
        &RocePacket::new_checked(&bytes[..]).unwrap(),
        &p.b.mem,
    );
    assert_eq!(p.b.qp().stats().drop_bad_pkey, 1);
    // A UD opcode to an RC QP.
    let mut r = req(Opcode::UD_SEND_ONLY, e);
    r.deth = Some(Default::default());
    let bytes = packet(&r, &[1; 8]);
    p.b.ep.qp_mut(p.b.qpn).unwrap().handle_packet(
        p.now,
        p.a.addr,
        &RocePacket::new_checked(&bytes[..]).unwrap(),
        &p.b.mem,
    );
    assert_eq!(p.b.qp().stats().drop_wrong_transport, 1);
    assert_eq!(p.b.qp().state(), QpState::ReadyToSend);
}

#[test]
fn forged_responses_are_dropped() {
    let mut p = RcPair::new(4, LinkConfig::default(), PairConfig::default());
    // Nothing outstanding on A: ACKs, atomic ACKs and READ responses for
    // PSNs it never sent are dropped without effect.
    let a_next = p.a.qp().attr().sq_psn;
    for (op, psn) in [
        (Opcode::RC_ACKNOWLEDGE, a_next),
        (Opcode::RC_ACKNOWLEDGE, a_next.add(1000)),
        (Opcode::RC_ATOMIC_ACKNOWLEDGE, a_next.sub(1)),
        (Opcode::RC_RDMA_READ_RESPONSE_ONLY, a_next.sub(3)),
    ] {
        let mut r = req(op, psn);
        r.bth.dest_qpn = 0x11;
        r.bth.ack_req = false;
        r.aeth = Some(AethRepr { syndrome: Syndrome::ACK, msn: 0 });
        if op == Opcode::RC_ATOMIC_ACKNOWLEDGE {
            r.atomic_ack_eth = Some(AtomicAckEthRepr { orig: 5 });
        }
        let bytes =
            packet(&r, if op == Opcode::RC_RDMA_READ_RESPONSE_ONLY { &[7; 64] } else { &[] });
        p.a.ep.qp_mut(p.a.qpn).unwrap().handle_packet(
            p.now,
            p.b.addr,
            &RocePacket::new_checked(&bytes[..]).unwrap(),
            &p.a.mem,
        );
    }
    assert_eq!(p.a.qp().state(), QpState::ReadyToSend);
    assert!(p.a.qp_mut().poll_completion().is_none());
    assert!(p.a.qp().stats().drop_unexpected_response >= 3);
}

/// Random packets of every opcode with random headers near the expected
/// PSN, thrown at both QPs: no panic, memory outside regions untouched.
#[test]
fn random_packets_never_break_anything() {
    for seed in 0..40u64 {
        let mut rng = SplitMix64::new(seed);
        let mut p = RcPair::new(seed, LinkConfig::default(), PairConfig::default());
        let (ra, _, rka) = p.a.mem.register(PD, 8192, ALL);
        let (rb, rlk, rkb) = p.b.mem.register(PD, 8192, ALL);
        for i in 0..8 {
            p.b.qp_mut()
                .post_recv(&[RecvWr {
                    wr_id: i,
                    sgl: &[Sge { addr: rb + 4096, length: 512, lkey: rlk }],
                }])
                .unwrap();
        }
        let ops: Vec<_> = Opcode::all().collect();
        let mut buf = vec![0u8; 8192];
        for _ in 0..400 {
            let info = ops[rng.below(ops.len() as u64) as usize];
            let to_a = rng.below(2) == 0;
            let (base, rkey) = if to_a { (ra, rka) } else { (rb, rkb) };
            // A's first PSN is both what A awaits responses for and what
            // B expects next.
            let qp_psn = p.a.qp().attr().sq_psn;
            let psn = qp_psn.add(rng.below(8) as u32).sub(rng.below(4) as u32);
            let h = info.headers;
            let va = base.wrapping_add(rng.below(10_000)).wrapping_sub(rng.below(2000));
            let rk = if rng.below(4) == 0 { rng.next_u64() as u32 } else { rkey };
            let repr = RocePacketRepr {
                bth: BthRepr {
                    opcode: info.opcode,
                    pkey: 0xffff,
                    dest_qpn: if to_a { 0x11 } else { 0x22 },
                    psn,
                    ack_req: rng.below(2) == 0,
                    ..BthRepr::default()
                },
                rdeth: h.contains(Headers::RDETH).then_some(1),
                deth: h.contains(Headers::DETH).then_some(Default::default()),
                xrceth: h.contains(Headers::XRCETH).then_some(1),
                feth: h.contains(Headers::FETH).then_some(Default::default()),
                reth: h.contains(Headers::RETH).then_some(RethRepr {
                    va,
                    rkey: rk,
                    dma_len: rng.below(5000) as u32,
                }),
                atomic_eth: h.contains(Headers::ATOMIC_ETH).then_some(AtomicEthRepr {
                    va,
                    rkey: rk,
                    swap_add: rng.next_u64(),
                    compare: rng.next_u64(),
                }),
                aeth: h.contains(Headers::AETH).then_some(AethRepr {
                    syndrome: Syndrome::from_byte(rng.next_u64() as u8),
                    msn: 0,
                }),
                atomic_ack_eth: h
                    .contains(Headers::ATOMIC_ACK_ETH)
                    .then_some(AtomicAckEthRepr { orig: 1 }),
                immdt: h.contains(Headers::IMMDT).then_some(9),
                ieth: h.contains(Headers::IETH).then_some(rk),
            };
            let plen = if info.has_payload { rng.below(1200) as usize } else { 0 };
            let mut r = repr;
            r.bth.pad = BthRepr::pad_for(plen);
            let payload = vec![0x5a; plen];
            let mut bytes = vec![0u8; r.packet_len(plen)];
            r.emit(&mut bytes, &payload).unwrap();
            let Ok(pkt) = RocePacket::new_checked(&bytes[..]) else { continue };
            let node = if to_a { &mut p.a } else { &mut p.b };
            let src = if to_a {
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))
            } else {
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))
            };
            node.ep.qp_mut(node.qpn).unwrap().handle_packet(p.now, src, &pkt, &node.mem);
            while node
                .ep
                .qp_mut(node.qpn)
                .unwrap()
                .poll_transmit(p.now, &node.mem, &mut buf)
                .is_some()
            {}
            while node.qp_mut().poll_completion().is_some() {}
        }
        assert!(p.a.mem.guards_intact() && p.b.mem.guards_intact(), "seed {seed}");
    }
}

/// IBA 1.5 requests that break their rules: an ATOMIC WRITE of other than
/// 8 bytes, or at an address that is not 8-aligned (invalid requests, as
/// rxe answers them); a FLUSH past its region's end (a remote access
/// error) or asking for no placement type (invalid). Nothing is written.
#[test]
fn malformed_atomic_writes_and_flushes_are_refused() {
    use uroce_wire::FethRepr;
    let flushable = Access(ALL.0 | Access::FLUSH_GLOBAL.0);
    // A payload of other than 8 bytes is not an ATOMIC WRITE packet at
    // all: malformed, dropped before any QP sees it.
    for n in [4, 16] {
        let r = RocePacketRepr {
            reth: Some(RethRepr::default()),
            ..req(Opcode::RC_ATOMIC_WRITE, Psn::new(0))
        };
        let mut buf = vec![0u8; r.packet_len(n)];
        r.emit(&mut buf, &vec![0; n]).unwrap();
        assert!(RocePacket::new_checked(&buf[..]).is_err(), "{n}-byte payload");
    }
    let cases: [(Opcode, u64, u32, usize, Option<FethRepr>, NakCode); 4] = [
        (Opcode::RC_ATOMIC_WRITE, 0, 16, 8, None, NakCode::InvalidRequest),
        (Opcode::RC_ATOMIC_WRITE, 4, 8, 8, None, NakCode::InvalidRequest),
        (
            Opcode::RC_FLUSH,
            4000,
            200,
            0,
            Some(FethRepr { placement: 1, selectivity: 0 }),
            NakCode::RemoteAccessError,
        ),
        (
            Opcode::RC_FLUSH,
            0,
            8,
            0,
            Some(FethRepr { placement: 0, selectivity: 0 }),
            NakCode::InvalidRequest,
        ),
    ];
    for (i, (op, off, len, payload, feth, nak)) in cases.into_iter().enumerate() {
        let mut p = RcPair::new(10 + i as u64, LinkConfig::default(), PairConfig::default());
        let (addr, _, rkey) = p.b.mem.register(PD, 4096, flushable);
        let e = epsn(&p);
        let mut r = req(op, e);
        r.reth = Some(RethRepr { va: addr + off, rkey, dma_len: len });
        r.feth = feth;
        let out = to_b(&mut p, &packet(&r, &vec![0xee; payload]));
        assert_eq!(out.len(), 1, "case {i}");
        assert_eq!(out[0].aeth.unwrap().syndrome, Syndrome::Nak(nak), "case {i}");
        assert_eq!(p.b.mem.snapshot(addr, 4096), vec![0; 4096], "case {i}: nothing written");
        assert!(p.b.mem.guards_intact(), "case {i}");
    }
}
