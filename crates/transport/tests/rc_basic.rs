//! RC operations between two QPs over a clean simulated link.

use std::time::Duration;

use uroce_sim::pair::{PD, PairConfig};
use uroce_sim::{LinkConfig, RcPair};
use uroce_transport::{Access, RecvWr, SendFlags, SendWr, Sge, WcOpcode, WcStatus, WrOpcode};

const ALL: Access = Access(1 | 2 | 4 | 8);

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn send_multi_packet_with_imm() {
    let mut p = RcPair::new(1, LinkConfig::default(), PairConfig::default());
    let (src, lk, _) = p.a.mem.register(PD, 5000, ALL);
    let (dst, rlk, _) = p.b.mem.register(PD, 8192, ALL);
    let data = pattern(5000, 7);
    p.a.mem.fill(src, &data);
    p.b.qp_mut()
        .post_recv(&[RecvWr { wr_id: 9, sgl: &[Sge { addr: dst, length: 8192, lkey: rlk }] }])
        .unwrap();
    let sge = [Sge { addr: src, length: 5000, lkey: lk }];
    let wr = SendWr {
        wr_id: 1,
        opcode: WrOpcode::SendWithImm,
        sgl: &sge,
        imm_or_inv: 0x1122_3344,
        ..SendWr::default()
    };
    p.a.qp_mut().post_send(p.now, &[wr]).unwrap();
    assert!(p.run_until(Duration::from_secs(1), |p| !p.a.completions.is_empty()
        && !p.b.completions.is_empty()));
    let ca = p.a.completions[0];
    assert_eq!((ca.wr_id, ca.status, ca.opcode), (1, WcStatus::Success, WcOpcode::Send));
    let cb = p.b.completions[0];
    assert_eq!(
        (cb.wr_id, cb.status, cb.opcode, cb.byte_len),
        (9, WcStatus::Success, WcOpcode::Recv, 5000)
    );
    assert_eq!(cb.imm_or_inv, 0x1122_3344);
    assert_eq!(p.b.mem.snapshot(dst, 5000), data);
    assert!(p.a.mem.guards_intact() && p.b.mem.guards_intact());
    assert_eq!(p.a.qp().stats().retransmits, 0);
}

#[test]
fn write_read_and_atomics() {
    let mut p = RcPair::new(2, LinkConfig::default(), PairConfig::default());
    let (la, lk, _) = p.a.mem.register(PD, 1 << 20, ALL);
    let (rb, _, rk) = p.b.mem.register(PD, 1 << 20, ALL);
    let data = pattern(300_000, 3);
    p.a.mem.fill(la, &data);
    // WRITE 300000 bytes to B at offset 100.
    let sge = [Sge { addr: la, length: 300_000, lkey: lk }];
    let wr = SendWr {
        wr_id: 1,
        opcode: WrOpcode::RdmaWrite,
        sgl: &sge,
        remote_addr: rb + 100,
        rkey: rk,
        ..SendWr::default()
    };
    p.a.qp_mut().post_send(p.now, &[wr]).unwrap();
    assert!(p.run_until(Duration::from_secs(1), |p| p.a.completions.len() == 1));
    assert_eq!(p.a.completions[0].status, WcStatus::Success);
    assert_eq!(p.b.mem.snapshot(rb + 100, 300_000), data);
    // READ it back into A at offset 500000.
    let sge = [Sge { addr: la + 500_000, length: 300_000, lkey: lk }];
    let wr = SendWr {
        wr_id: 2,
        opcode: WrOpcode::RdmaRead,
        sgl: &sge,
        remote_addr: rb + 100,
        rkey: rk,
        ..SendWr::default()
    };
    p.a.qp_mut().post_send(p.now, &[wr]).unwrap();
    assert!(p.run_until(Duration::from_secs(1), |p| p.a.completions.len() == 2));
    let c = p.a.completions[1];
    assert_eq!((c.status, c.opcode, c.byte_len), (WcStatus::Success, WcOpcode::RdmaRead, 300_000));
    assert_eq!(p.a.mem.snapshot(la + 500_000, 300_000), data);
    // Atomics on B's first word: FetchAdd 5 twice, then CmpSwap 10 -> 99.
    let sge = [Sge { addr: la + 900_000, length: 8, lkey: lk }];
    let fa = SendWr {
        wr_id: 3,
        opcode: WrOpcode::AtomicFetchAndAdd,
        sgl: &sge,
        remote_addr: rb,
        rkey: rk,
        compare_add: 5,
        ..SendWr::default()
    };
    let cs =
        SendWr { wr_id: 5, opcode: WrOpcode::AtomicCmpAndSwp, compare_add: 10, swap: 99, ..fa };
    p.a.qp_mut().post_send(p.now, &[fa, SendWr { wr_id: 4, ..fa }, cs]).unwrap();
    assert!(p.run_until(Duration::from_secs(1), |p| p.a.completions.len() == 5));
    for c in &p.a.completions {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    assert_eq!(u64::from_ne_bytes(p.b.mem.snapshot(rb, 8).try_into().unwrap()), 99);
    // The last atomic returned the value before it (10).
    assert_eq!(u64::from_ne_bytes(p.a.mem.snapshot(la + 900_000, 8).try_into().unwrap()), 10);
    assert!(p.a.mem.guards_intact() && p.b.mem.guards_intact());
    let _ = SendFlags::NONE;
}
