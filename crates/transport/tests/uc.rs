//! UC: no ACKs, no retries. Every message is delivered whole or not at
//! all; a loss drops that message silently and the responder resynchronises
//! on the next FIRST/ONLY.

use std::time::Duration;

use uroce_sim::pair::{PD, PairConfig};
use uroce_sim::{LinkConfig, RcPair, SplitMix64};
use uroce_transport::{Access, QpType, RecvWr, SendWr, Sge, WcFlags, WcOpcode, WcStatus, WrOpcode};
use uroce_wire::Mtu;

const ALL: Access = Access(1 | 2 | 4 | 8);

fn uc(seed: u64, link: LinkConfig, mtu: Mtu) -> RcPair {
    RcPair::new(
        seed,
        link,
        PairConfig { qp_type: QpType::Uc, mtu, sq_sig_all: true, ..PairConfig::default() },
    )
}

#[test]
fn uc_delivers_sends_and_writes_on_a_clean_link() {
    let mut p = uc(1, LinkConfig::default(), Mtu::Mtu1024);
    let (src, lk, _) = p.a.mem.register(PD, 10_000, ALL);
    let (dst, dk, rk) = p.b.mem.register(PD, 40_000, ALL);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    p.a.mem.fill(src, &data);
    p.b.qp_mut()
        .post_recv(&[RecvWr { wr_id: 1, sgl: &[Sge { addr: dst, length: 20_000, lkey: dk }] }])
        .unwrap();
    p.b.qp_mut().post_recv(&[RecvWr { wr_id: 2, sgl: &[] }]).unwrap();
    let sge = [Sge { addr: src, length: 10_000, lkey: lk }];
    p.a.qp_mut()
        .post_send(
            p.now,
            &[
                SendWr {
                    wr_id: 10,
                    opcode: WrOpcode::SendWithImm,
                    sgl: &sge,
                    imm_or_inv: 5,
                    ..SendWr::default()
                },
                SendWr {
                    wr_id: 11,
                    opcode: WrOpcode::RdmaWriteWithImm,
                    sgl: &sge,
                    remote_addr: dst + 20_000,
                    rkey: rk,
                    imm_or_inv: 6,
                    ..SendWr::default()
                },
            ],
        )
        .unwrap();
    assert!(p.run_until(Duration::from_secs(1), |p| p.b.completions.len() == 2
        && p.a.completions.len() == 2));
    assert!(p.a.completions.iter().all(|c| c.status == WcStatus::Success));
    let (c1, c2) = (p.b.completions[0], p.b.completions[1]);
    assert_eq!((c1.wr_id, c1.opcode, c1.byte_len, c1.imm_or_inv), (1, WcOpcode::Recv, 10_000, 5));
    assert_eq!(
        (c2.wr_id, c2.opcode, c2.byte_len, c2.imm_or_inv),
        (2, WcOpcode::RecvRdmaWithImm, 10_000, 6)
    );
    assert!(c2.flags.contains(WcFlags::WITH_IMM));
    assert_eq!(p.b.mem.snapshot(dst, 10_000), data);
    assert_eq!(p.b.mem.snapshot(dst + 20_000, 10_000), data);
    // No ACKs exist on UC.
    assert_eq!(p.b.qp().stats().acks_sent, 0);
    assert_eq!(p.b.qp().stats().sent_pkts, 0);
}

#[test]
fn uc_under_loss_delivers_whole_messages_or_nothing() {
    for seed in 0..60u64 {
        let mut rng = SplitMix64::new(seed);
        let link = LinkConfig {
            loss: 0.05,
            duplicate: 0.02,
            reorder: 0.05,
            corrupt: 0.01,
            ..LinkConfig::default()
        };
        let mut p = uc(seed, link, Mtu::ALL[rng.below(5) as usize]);
        let (src, lk, _) = p.a.mem.register(PD, 1 << 20, ALL);
        let (dst, dk, _) = p.b.mem.register(PD, 4 << 20, ALL);
        let n = 30;
        let mut msgs = vec![];
        let mut off = 0u64;
        for i in 0..n {
            let len = 8 + rng.below(12_000) as usize;
            let mut m: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            m[..4].copy_from_slice(&(i as u32).to_le_bytes());
            p.a.mem.fill(src + off, &m);
            msgs.push((src + off, m));
            off += len as u64;
        }
        for i in 0..n {
            let sge = [Sge { addr: dst + i as u64 * 20_000, length: 20_000, lkey: dk }];
            p.b.qp_mut().post_recv(&[RecvWr { wr_id: i as u64, sgl: &sge }]).unwrap();
        }
        for (i, (addr, m)) in msgs.iter().enumerate() {
            let sge = [Sge { addr: *addr, length: m.len() as u32, lkey: lk }];
            p.a.qp_mut()
                .post_send(p.now, &[SendWr { wr_id: i as u64, sgl: &sge, ..SendWr::default() }])
                .unwrap();
        }
        p.run_until_idle(Duration::from_secs(5));
        // The sender completes everything: UC reports "sent", not "delivered".
        assert_eq!(p.a.completions.len(), n);
        assert!(p.a.completions.iter().all(|c| c.status == WcStatus::Success));
        // Each receive completion holds exactly one whole message, in order.
        let mut last = -1i64;
        for (k, c) in p.b.completions.iter().enumerate() {
            assert_eq!((c.wr_id, c.status), (k as u64, WcStatus::Success), "seed {seed}");
            let buf = p.b.mem.snapshot(dst + k as u64 * 20_000, c.byte_len as usize);
            let id = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
            assert!(id < n && (id as i64) > last, "seed {seed}: message {id} out of order");
            assert_eq!(buf, msgs[id].1, "seed {seed}: message {id} corrupted or partial");
            last = id as i64;
        }
        assert!(p.a.mem.guards_intact() && p.b.mem.guards_intact());
    }
}
