//! UD and SRQ in the deterministic simulation: UD datagrams arrive intact
//! or not at all (with their GRH and source QPN); an RC QP receiving from an
//! SRQ under loss still gets every message exactly once, in order, each in
//! its own SRQ WQE.

use std::time::Duration;

use uroce_sim::pair::{PD, PairConfig};
use uroce_sim::{LinkConfig, RcPair, SplitMix64};
use uroce_transport::{Access, QpType, RecvWr, SendWr, Sge, UdDest, WcFlags, WcStatus};
use uroce_wire::Mtu;

const ALL: Access = Access(1 | 2 | 4 | 8);

fn faulty() -> LinkConfig {
    LinkConfig {
        loss: 0.05,
        duplicate: 0.02,
        reorder: 0.05,
        corrupt: 0.01,
        ..LinkConfig::default()
    }
}

#[test]
fn ud_datagrams_arrive_intact_or_not_at_all() {
    for seed in 0..30u64 {
        let mut rng = SplitMix64::new(seed);
        let mtu = Mtu::ALL[rng.below(5) as usize];
        let cfg =
            PairConfig { qp_type: QpType::Ud, mtu, sq_sig_all: true, ..PairConfig::default() };
        let mut p = RcPair::new(seed, faulty(), cfg);
        let (src, lk, _) = p.a.mem.register(PD, 1 << 20, ALL);
        let (dst, dk, _) = p.b.mem.register(PD, 1 << 20, ALL);
        let slot = 40 + mtu.bytes() as u64;
        for i in 0..64u64 {
            p.b.qp_mut()
                .post_recv(&[RecvWr {
                    wr_id: i,
                    sgl: &[Sge { addr: dst + i * slot, length: slot as u32, lkey: dk }],
                }])
                .unwrap();
        }
        let mut msgs = vec![];
        for i in 0..60u32 {
            let len = 4 + rng.below(mtu.bytes() as u64 - 3) as usize;
            let mut m: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            m[..4].copy_from_slice(&i.to_le_bytes());
            let at = src + u64::from(i) * 4096;
            p.a.mem.fill(at, &m);
            // Every tenth datagram carries a wrong Q_Key: dropped silently.
            let qkey = if i % 10 == 9 { 0xbad } else { 0x1111_1111 };
            let ud = UdDest {
                dst: p.b.addr,
                dst_port: 4791,
                remote_qpn: p.b.qp().qpn(),
                remote_qkey: qkey,
                sgid_index: 0,
                traffic_class: 0,
            };
            let sge = [Sge { addr: at, length: len as u32, lkey: lk }];
            p.a.qp_mut()
                .post_send(
                    p.now,
                    &[SendWr { wr_id: u64::from(i), sgl: &sge, ud: Some(ud), ..SendWr::default() }],
                )
                .unwrap();
            msgs.push(m);
        }
        p.run_until_idle(Duration::from_secs(5));
        assert_eq!(p.a.completions.len(), 60, "UD completes when sent");
        assert!(p.b.qp().stats().drop_qkey_violation > 0);
        for c in &p.b.completions {
            assert_eq!(c.status, WcStatus::Success);
            assert!(c.flags.contains(WcFlags::GRH));
            assert_eq!(c.src_qp, p.a.qp().qpn());
            let buf = p.b.mem.snapshot(dst + c.wr_id * slot, c.byte_len as usize);
            let id = u32::from_le_bytes(buf[40..44].try_into().unwrap()) as usize;
            assert!(id % 10 != 9, "a foreign Q_Key got through");
            assert_eq!(&buf[40..], &msgs[id][..], "seed {seed}: datagram {id} corrupted");
        }
        assert!(p.a.mem.guards_intact() && p.b.mem.guards_intact());
    }
}

#[test]
fn rc_over_an_srq_under_loss_is_exactly_once() {
    for seed in 0..40u64 {
        let mut rng = SplitMix64::new(seed);
        let cfg = PairConfig {
            srq_b: true,
            mtu: Mtu::ALL[rng.below(5) as usize],
            sq_sig_all: true,
            ..PairConfig::default()
        };
        let mut p = RcPair::new(seed, faulty(), cfg);
        let (src, lk, _) = p.a.mem.register(PD, 1 << 20, ALL);
        let (dst, dk, _) = p.b.mem.register(PD, 4 << 20, ALL);
        assert!(
            p.b.qp_mut().post_recv(&[RecvWr { wr_id: 0, sgl: &[] }]).is_err(),
            "receives go to the SRQ"
        );
        let n = 40u64;
        for i in 0..n {
            let sge = [Sge { addr: dst + i * 65536, length: 65536, lkey: dk }];
            p.b.srq_mut().unwrap().post_recv(&[RecvWr { wr_id: 1000 + i, sgl: &sge }]).unwrap();
        }
        let mut msgs = vec![];
        for i in 0..n {
            let len = 4 + rng.below(20_000) as usize;
            let mut m: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            m[..4].copy_from_slice(&(i as u32).to_le_bytes());
            p.a.mem.fill(src + i * 20_480, &m);
            let sge = [Sge { addr: src + i * 20_480, length: len as u32, lkey: lk }];
            p.a.qp_mut()
                .post_send(p.now, &[SendWr { wr_id: i, sgl: &sge, ..SendWr::default() }])
                .unwrap();
            msgs.push(m);
        }
        assert!(
            p.run_until(Duration::from_secs(60), |p| p.b.completions.len() == n as usize
                && p.a.completions.len() == n as usize),
            "seed {seed}"
        );
        for (k, c) in p.b.completions.iter().enumerate() {
            assert_eq!(
                (c.wr_id, c.status),
                (1000 + k as u64, WcStatus::Success),
                "seed {seed}: SRQ WQEs in order"
            );
            let buf = p.b.mem.snapshot(dst + k as u64 * 65536, c.byte_len as usize);
            assert_eq!(buf, msgs[k], "seed {seed}: message {k}");
        }
        assert!(p.b.srq().unwrap().is_empty());
        assert!(p.a.mem.guards_intact() && p.b.mem.guards_intact());
    }
}
