//! Loss recovery, each case built from the packet sequence that once went
//! wrong: a window cut by a timeout that never asked for an ACK again, a
//! duplicate SEND answered with a plain ACK at an atomic's PSN, duplicate
//! READ responses that let the timer resend every READ, and a window wider
//! than an rxe responder absorbs.

use std::net::IpAddr;
use std::time::Duration;

use uroce_sim::pair::{Node, PD, PairConfig};
use uroce_sim::{LinkConfig, RcPair};
use uroce_transport::{Access, Completion, SendWr, Sge, WcStatus, WrOpcode};
use uroce_wire::{Opcode, Operation, Psn, RocePacket, RocePacketRepr, Syndrome};

const ALL: Access = Access(1 | 2 | 4 | 8);

fn sends(n: &Node) -> Vec<Completion> {
    n.completions.iter().filter(|c| !c.is_recv).copied().collect()
}

/// Every packet `n` has to send now.
fn drain(n: &mut Node, now: uroce_transport::Instant) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut buf = vec![0u8; 8192];
    while let Some(t) = n.ep.qp_mut(n.qpn).unwrap().poll_transmit(now, &n.mem, &mut buf) {
        out.push(buf[..t.len].to_vec());
    }
    while let Some(c) = n.qp_mut().poll_completion() {
        n.completions.push(c);
    }
    out
}

fn deliver(n: &mut Node, now: uroce_transport::Instant, from: IpAddr, bytes: &[u8]) {
    let pkt = RocePacket::new_checked(bytes).unwrap();
    n.ep.qp_mut(n.qpn).unwrap().handle_packet(now, from, &pkt, &n.mem);
    while let Some(c) = n.qp_mut().poll_completion() {
        n.completions.push(c);
    }
}

fn repr(bytes: &[u8]) -> RocePacketRepr {
    RocePacketRepr::parse(&RocePacket::new_checked(bytes).unwrap())
}

fn write(src: u64, lkey: u32, dst: u64, rkey: u32, len: u32, wr_id: u64) -> (Sge, SendWr<'static>) {
    let sge = Sge { addr: src, length: len, lkey };
    let w = SendWr {
        wr_id,
        opcode: WrOpcode::RdmaWrite,
        remote_addr: dst,
        rkey,
        flags: uroce_transport::SendFlags::SIGNALED,
        ..SendWr::default()
    };
    (sge, w)
}

/// After a retransmission timeout the window restarts small; the packet
/// that fills it must ask for an ACK, and the window must grow back, or a
/// long message waits one Local ACK Timeout per window for ever.
#[test]
fn a_window_cut_by_a_timeout_asks_for_acks_and_grows_back() {
    let link = LinkConfig { delay: Duration::from_micros(20), ..LinkConfig::default() };
    let cfg = PairConfig { max_unacked_psns: 128, ..PairConfig::default() };
    let mut p = RcPair::new(11, link, cfg);
    let len = 1 << 20;
    let (src, lk, _) = p.a.mem.register(PD, len, ALL);
    let (dst, _, rk) = p.b.mem.register(PD, len, ALL);
    let post = |p: &mut RcPair, id| {
        let (sge, w) = write(src, lk, dst, rk, len as u32, id);
        let sgl = [sge];
        p.a.qp_mut().post_send(p.now, &[SendWr { sgl: &sgl, ..w }]).unwrap();
    };
    post(&mut p, 1);
    assert!(p.run_until(Duration::from_secs(1), |p| sends(&p.a).len() == 1));
    assert!(p.a.qp().rtt().is_some(), "the round trip is measured");

    // Cut A -> B in the middle of the next message, then restore it.
    let (a, b) = (p.a.addr, p.b.addr);
    post(&mut p, 2);
    p.run_until(Duration::from_micros(100), |_| false);
    p.net.set_link(a, b, LinkConfig { down: true, ..link });
    p.run_until(Duration::from_millis(2), |_| false);
    p.net.set_link(a, b, link);
    let restored = p.now;
    assert!(p.run_until(Duration::from_secs(10), |p| sends(&p.a).len() == 2));
    let took = p.now.saturating_since(restored);
    let c = sends(&p.a);
    assert_eq!(c[1].status, WcStatus::Success);
    // Old behaviour: one 67 ms timeout per 8 packets. Now a few probes.
    assert!(took < Duration::from_millis(20), "recovery took {took:?}");
    assert!(p.a.qp().stats().rto_probes > 0);
    assert_eq!(p.a.qp().stats().local_ack_timeout_err, 0, "no retry spent");

    // The window grows back to the whole 128 PSNs.
    for id in 3..13 {
        post(&mut p, id);
        assert!(p.run_until(Duration::from_secs(1), |p| sends(&p.a).len() == id as usize));
    }
    assert_eq!(p.a.qp().send_window(), 128);
    assert!(p.b.mem.guards_intact());
}

/// A cut link still fails after exactly `retry_cnt` retries and
/// (retry_cnt + 1) Local ACK Timeouts when the round trip is known (probes
/// before each deadline spend nothing).
#[test]
fn probes_do_not_spend_the_retry_budget() {
    for retry_cnt in [0u8, 2, 7] {
        let link = LinkConfig { delay: Duration::from_micros(5), ..LinkConfig::default() };
        let cfg = PairConfig { retry_cnt, timeout: 12, ..PairConfig::default() };
        let mut p = RcPair::new(3, link, cfg);
        let (src, lk, _) = p.a.mem.register(PD, 64, ALL);
        let (dst, _, rk) = p.b.mem.register(PD, 64, ALL);
        let (sge, w) = write(src, lk, dst, rk, 64, 1);
        let sgl = [sge];
        p.a.qp_mut().post_send(p.now, &[SendWr { sgl: &sgl, ..w }]).unwrap();
        assert!(p.run_until(Duration::from_secs(1), |p| sends(&p.a).len() == 1));
        assert!(p.a.qp().rtt().is_some());
        let (a, b) = (p.a.addr, p.b.addr);
        p.net.set_link(a, b, LinkConfig { down: true, ..link });
        p.a.qp_mut().post_send(p.now, &[SendWr { wr_id: 2, sgl: &sgl, ..w }]).unwrap();
        let start = p.now;
        assert!(p.run_until(Duration::from_secs(60), |p| sends(&p.a).len() == 2));
        assert_eq!(sends(&p.a)[1].status, WcStatus::RetryExcErr);
        let st = p.a.qp().stats();
        assert_eq!(st.completer_retry_err, u64::from(retry_cnt));
        assert_eq!(st.local_ack_timeout_err, u64::from(retry_cnt) + 1);
        assert!(st.rto_probes > 0);
        let waited = p.now.saturating_since(start);
        let t = Duration::from_nanos(4096 << 12);
        let n = u32::from(retry_cnt) + 1;
        assert!(waited >= t * n && waited < t * (n + 1), "{waited:?}");
    }
}

/// IBTA §9.7.5.1.1: a plain ACK never acknowledges an atomic. A SEND resent
/// after the atomic that followed it executed is acknowledged up to the
/// SEND only; the resent atomic is answered from the replay cache with the
/// original value and is not executed again.
#[test]
fn duplicate_send_after_an_executed_atomic_is_acked_before_the_atomic() {
    let mut p = RcPair::new(5, LinkConfig::default(), PairConfig::default());
    let (now, a, b) = (p.now, p.a.addr, p.b.addr);
    let (buf, lk, _) = p.a.mem.register(PD, 64, ALL);
    let (rbuf, rlk, _) = p.b.mem.register(PD, 64, ALL);
    let (target, _, rk) = p.b.mem.register(PD, 8, ALL);
    p.b.mem.fill(target, &100u64.to_ne_bytes());
    p.b.qp_mut()
        .post_recv(&[uroce_transport::RecvWr {
            wr_id: 9,
            sgl: &[Sge { addr: rbuf, length: 64, lkey: rlk }],
        }])
        .unwrap();
    let send_sge = [Sge { addr: buf, length: 8, lkey: lk }];
    let faa_sge = [Sge { addr: buf + 8, length: 8, lkey: lk }];
    let flags = uroce_transport::SendFlags::SIGNALED;
    p.a.qp_mut()
        .post_send(
            now,
            &[
                SendWr {
                    wr_id: 1,
                    opcode: WrOpcode::Send,
                    sgl: &send_sge,
                    flags,
                    ..SendWr::default()
                },
                SendWr {
                    wr_id: 2,
                    opcode: WrOpcode::AtomicFetchAndAdd,
                    sgl: &faa_sge,
                    remote_addr: target,
                    rkey: rk,
                    compare_add: 5,
                    flags,
                    ..SendWr::default()
                },
            ],
        )
        .unwrap();
    let reqs = drain(&mut p.a, now);
    assert_eq!(reqs.len(), 2);
    let (send_psn, faa_psn) = (repr(&reqs[0]).bth.psn, repr(&reqs[1]).bth.psn);
    assert_eq!(repr(&reqs[1]).bth.opcode, Opcode::RC_FETCH_ADD);
    for r in &reqs {
        deliver(&mut p.b, now, a, r);
    }
    // B's ACK and ATOMIC ACK are lost.
    let lost = drain(&mut p.b, now);
    assert_eq!(lost.len(), 2);
    assert_eq!(p.b.mem.snapshot(target, 8), 105u64.to_ne_bytes());

    // The SEND comes again (ACK requested, as on every resend).
    let mut dup = repr(&reqs[0]);
    dup.bth.ack_req = true;
    let mut bytes = vec![0u8; dup.packet_len(8)];
    dup.emit(&mut bytes, &RocePacket::new_checked(&reqs[0][..]).unwrap().payload()[..8]).unwrap();
    deliver(&mut p.b, now, a, &bytes);
    let out = drain(&mut p.b, now);
    assert_eq!(out.len(), 1);
    let ack = repr(&out[0]);
    assert_eq!(ack.bth.opcode, Opcode::RC_ACKNOWLEDGE);
    assert!(matches!(ack.aeth.unwrap().syndrome, Syndrome::Ack(_)));
    assert_eq!(ack.bth.psn, send_psn, "acknowledged up to the SEND, not the atomic");
    assert_ne!(ack.bth.psn, faa_psn);

    // The atomic comes again: the original value, executed once.
    deliver(&mut p.b, now, a, &reqs[1]);
    let out = drain(&mut p.b, now);
    assert_eq!(out.len(), 1);
    let aack = repr(&out[0]);
    assert_eq!(aack.bth.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
    assert_eq!(aack.bth.psn, faa_psn);
    assert_eq!(aack.atomic_ack_eth.unwrap().orig, 100);
    assert_eq!(p.b.mem.snapshot(target, 8), 105u64.to_ne_bytes());

    // Our requester, handed a plain ACK at the atomic's PSN (as a faulty
    // responder sends), completes the SEND but not the atomic.
    let mut plain = ack;
    plain.bth.psn = faa_psn;
    let mut pb = vec![0u8; plain.packet_len(0)];
    plain.emit(&mut pb, &[]).unwrap();
    deliver(&mut p.a, now, b, &pb);
    let c = sends(&p.a);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::Success));
    // It resends the atomic and completes it from the ATOMIC ACK.
    let resent = drain(&mut p.a, now);
    assert!(resent.iter().any(|r| repr(r).bth.opcode == Opcode::RC_FETCH_ADD));
    deliver(&mut p.a, now, b, &out[0]);
    let c = sends(&p.a);
    assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::Success));
    assert_eq!(p.a.mem.snapshot(buf + 8, 8), 100u64.to_ne_bytes());
}

/// Duplicate READ responses (the responder restarting a stream) prove the
/// peer alive: the requester's timer moves on and it does not resend; a
/// gap makes it resend once, from the first missing response.
#[test]
fn duplicate_read_responses_rearm_the_timer_and_a_gap_resumes_at_the_hole() {
    let mut p = RcPair::new(8, LinkConfig::default(), PairConfig::default());
    let (a, b) = (p.a.addr, p.b.addr);
    let len = 64 * 1024u32;
    let (dst, lk, _) = p.a.mem.register(PD, len as usize, ALL);
    let (src, _, rk) = p.b.mem.register(PD, len as usize, ALL);
    let pattern: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    p.b.mem.fill(src, &pattern);
    let sgl = [Sge { addr: dst, length: len, lkey: lk }];
    let w = SendWr {
        wr_id: 1,
        opcode: WrOpcode::RdmaRead,
        sgl: &sgl,
        remote_addr: src,
        rkey: rk,
        flags: uroce_transport::SendFlags::SIGNALED,
        ..SendWr::default()
    };
    let mut now = p.now;
    p.a.qp_mut().post_send(now, &[w]).unwrap();
    let req = drain(&mut p.a, now);
    assert_eq!(req.len(), 1);
    let first = repr(&req[0]).bth.psn;
    deliver(&mut p.b, now, a, &req[0]);
    let resp = drain(&mut p.b, now);
    assert_eq!(resp.len(), 64);
    for r in &resp[..10] {
        deliver(&mut p.a, now, b, r);
    }
    // Duplicates keep coming, for longer than the Local ACK Timeout, each
    // sooner than the probe timeout.
    let step = Duration::from_micros(500);
    for _ in 0..200 {
        now = now.saturating_add(step);
        let due = p.a.qp().poll_timeout().unwrap();
        assert!(due > now, "the timer would fire while the peer streams");
        deliver(&mut p.a, now, b, &resp[5]);
        assert!(drain(&mut p.a, now).is_empty(), "nothing resent");
    }
    // Response 10 is lost; 11.. arrive: one resend, from PSN first + 10.
    for r in &resp[11..] {
        deliver(&mut p.a, now, b, r);
    }
    let again = drain(&mut p.a, now);
    assert_eq!(again.len(), 1, "one READ request, resuming");
    let rr = repr(&again[0]);
    assert_eq!(rr.bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
    assert_eq!(rr.bth.psn, first.add(10));
    let reth = rr.reth.unwrap();
    assert_eq!((reth.va, reth.dma_len), (src + 10 * 1024, len - 10 * 1024));
    deliver(&mut p.b, now, a, &again[0]);
    for r in drain(&mut p.b, now) {
        deliver(&mut p.a, now, b, &r);
    }
    let c = sends(&p.a);
    assert_eq!((c.len(), c[0].status), (1, WcStatus::Success));
    assert_eq!(p.a.mem.snapshot(dst, len as usize), pattern);
}

/// A responder that takes at most 128 PSNs past what it has acknowledged
/// (an rxe peer) sees no overrun from our requester, for WRITEs and for
/// the responses of READs, and nothing times out.
#[test]
fn the_requester_stays_within_128_psns_of_what_was_acknowledged() {
    let cfg = PairConfig {
        max_unacked_psns: 128,
        rd_atomic: 16,
        caps: uroce_transport::QpCaps { max_send_wr: 64, ..PairConfig::default().caps },
        ..PairConfig::default()
    };
    let mut p = RcPair::new(9, LinkConfig::default(), cfg);
    let (a, b) = (p.a.addr, p.b.addr);
    let len = 1 << 20;
    let (abuf, lk, _) = p.a.mem.register(PD, len, ALL);
    let (bbuf, _, rk) = p.b.mem.register(PD, len, ALL);
    let sgl = [Sge { addr: abuf, length: 64 * 1024, lkey: lk }];
    let mut wrs = vec![];
    for i in 0..32u64 {
        let op = if i % 2 == 0 { WrOpcode::RdmaWrite } else { WrOpcode::RdmaRead };
        wrs.push(SendWr {
            wr_id: i,
            opcode: op,
            sgl: &sgl,
            remote_addr: bbuf + (i % 16) * 65536,
            rkey: rk,
            flags: uroce_transport::SendFlags::SIGNALED,
            ..SendWr::default()
        });
    }
    let now = p.now;
    p.a.qp_mut().post_send(now, &wrs).unwrap();
    // `acked`: one past the last PSN the responder acknowledged (ACKs and
    // responses); `reached`: one past the last response PSN that reached A.
    let mut acked = p.a.qp().attr().sq_psn;
    let mut overruns = 0;
    for _ in 0..10_000 {
        let reqs = drain(&mut p.a, now);
        let resps_before = reqs.is_empty();
        for r in &reqs {
            let rp = repr(r);
            let info = RocePacket::new_checked(&r[..]).unwrap().info();
            let end = if info.operation == Operation::RdmaReadRequest {
                rp.bth.psn.add(rp.reth.unwrap().dma_len.div_ceil(1024).max(1) - 1)
            } else {
                rp.bth.psn
            };
            if end.diff(acked) >= 128 && rp.bth.psn != acked {
                overruns += 1;
                continue; // dropped, as an overrun rxe would
            }
            deliver(&mut p.b, now, a, r);
        }
        let resps = drain(&mut p.b, now);
        for r in &resps {
            let psn = repr(r).bth.psn;
            if psn.next().is_after(acked) {
                acked = psn.next();
            }
            deliver(&mut p.a, now, b, r);
        }
        if resps_before && resps.is_empty() {
            break;
        }
    }
    let c = sends(&p.a);
    assert_eq!(c.len(), 32, "everything completed without a timeout");
    assert!(c.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(overruns, 0);
    assert_eq!(p.a.qp().stats().local_ack_timeout_err, 0);
    let _ = Psn::new(0);
}

/// An RNR wait longer than the Local ACK Timeout spends no transport retry:
/// the retry deadline starts again when the requester resends.
#[test]
fn long_rnr_waits_spend_no_transport_retry() {
    // RNR timer code 0 is 655 ms; the Local ACK Timeout 16.8 ms.
    let cfg = PairConfig { timeout: 12, retry_cnt: 1, min_rnr_timer: 0, ..PairConfig::default() };
    let mut p = RcPair::new(12, LinkConfig::default(), cfg);
    let (src, lk, _) = p.a.mem.register(PD, 64, ALL);
    let (rbuf, rlk, _) = p.b.mem.register(PD, 64, ALL);
    let sgl = [Sge { addr: src, length: 64, lkey: lk }];
    let flags = uroce_transport::SendFlags::SIGNALED;
    p.a.qp_mut()
        .post_send(
            p.now,
            &[SendWr { wr_id: 1, opcode: WrOpcode::Send, sgl: &sgl, flags, ..SendWr::default() }],
        )
        .unwrap();
    // Three RNR rounds with no receive posted.
    p.run_until(Duration::from_secs(2), |_| false);
    assert!(p.a.qp().stats().rcvd_rnr_err >= 3);
    p.b.qp_mut()
        .post_recv(&[uroce_transport::RecvWr {
            wr_id: 9,
            sgl: &[Sge { addr: rbuf, length: 64, lkey: rlk }],
        }])
        .unwrap();
    assert!(p.run_until(Duration::from_secs(2), |p| !sends(&p.a).is_empty()));
    assert_eq!(sends(&p.a)[0].status, WcStatus::Success);
    assert_eq!(p.a.qp().stats().completer_retry_err, 0);
    assert_eq!(p.a.qp().stats().local_ack_timeout_err, 0);
}
