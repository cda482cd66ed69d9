//! Probe timeouts on a path that loses nothing (memory between processes
//! of one host, as the I/O layer tells the QP): a late peer, on the
//! virtual clock here a slow ACK path, costs one resent packet per probe
//! and no go-back; the same stall on a path not marked lossless resends
//! the window. A path marked lossless that loses packets after all still
//! delivers every message intact.

use std::time::Duration;

use uroce_sim::pair::{PD, PairConfig};
use uroce_sim::{LinkConfig, RcPair};
use uroce_transport::{Access, SendFlags, SendWr, Sge, Stats, WcStatus, WrOpcode};

const ALL: Access = Access(1 | 2 | 4 | 8);
const MSGS: usize = 64;
const SIZE: usize = 64;

/// Sends `MSGS` WRITEs (the last one signaled) after a warm-up that
/// measures the round trip, with B's ACKs taking `ack_delay` from the
/// first of them on; returns A's counters.
fn run(seed: u64, lossless: bool, loss: f64, ack_delay: Duration) -> Stats {
    run_with(seed, lossless, loss, ack_delay, 14)
}

/// [`run`] with the QP's Local ACK Timeout exponent (0: none).
fn run_with(seed: u64, lossless: bool, loss: f64, ack_delay: Duration, timeout: u8) -> Stats {
    let link = LinkConfig { loss, delay: Duration::from_micros(5), ..LinkConfig::default() };
    let cfg = PairConfig { max_unacked_psns: 128, timeout, ..PairConfig::default() };
    let mut p = RcPair::new(seed, link, cfg);
    p.a.qp_mut().set_lossless_path(lossless);
    let (abuf, lk, _) = p.a.mem.register(PD, SIZE * MSGS, ALL);
    let (bbuf, _, rk) = p.b.mem.register(PD, SIZE * MSGS, ALL);
    let data: Vec<u8> = (0..SIZE * MSGS).map(|i| (i as u64 * 13 + seed) as u8).collect();
    p.a.mem.fill(abuf, &data);
    let post = |p: &mut RcPair, k: usize, signaled: bool| {
        let off = (k * SIZE) as u64;
        let sgl = [Sge { addr: abuf + off, length: SIZE as u32, lkey: lk }];
        let w = SendWr {
            wr_id: k as u64,
            opcode: WrOpcode::RdmaWrite,
            sgl: &sgl,
            remote_addr: bbuf + off,
            rkey: rk,
            flags: if signaled { SendFlags::SIGNALED } else { SendFlags::NONE },
            ..SendWr::default()
        };
        p.a.qp_mut().post_send(p.now, &[w]).unwrap();
    };
    // Warm-up: a measured round trip of some 10 µs, so the probe timeout
    // is at its 1 ms floor.
    for k in 0..4 {
        post(&mut p, k, true);
        assert!(p.run_until(Duration::from_secs(1), |p| p.a.completions.len() > k));
    }
    let slow = LinkConfig { delay: ack_delay, ..link };
    p.net.set_link(p.b.addr, p.a.addr, slow);
    let before = *p.a.qp().stats();
    for k in 0..MSGS {
        post(&mut p, k, k + 1 == MSGS);
    }
    assert!(
        p.run_until(Duration::from_secs(30), |p| p.a.completions.len() > 4),
        "seed {seed}: the WRITEs never completed"
    );
    let c = p.a.completions[4];
    assert_eq!((c.status, c.wr_id), (WcStatus::Success, MSGS as u64 - 1), "seed {seed}");
    assert_eq!(p.b.mem.snapshot(bbuf, SIZE * MSGS), data, "seed {seed}: bytes");
    assert!(p.a.mem.guards_intact() && p.b.mem.guards_intact());
    let mut s = *p.a.qp().stats();
    s.rto_probes -= before.rto_probes;
    s.retransmitted_pkts -= before.retransmitted_pkts;
    s
}

#[test]
fn a_late_peer_on_a_lossless_path_costs_one_packet_per_probe() {
    for seed in 0..16 {
        // ACKs 20 ms late: probes at about 1, 3, 7 and 15 ms.
        let s = run(seed, true, 0.0, Duration::from_millis(20));
        assert!(s.rto_probes >= 3, "seed {seed}: {} probes", s.rto_probes);
        assert_eq!(s.retransmitted_pkts, s.rto_probes, "seed {seed}: one packet per probe");
        // Not marked lossless: each probe goes back over the window.
        let s = run(seed, false, 0.0, Duration::from_millis(20));
        assert!(s.retransmitted_pkts >= MSGS as u64, "seed {seed}: {s:?}");
        // A stall past four tail probes (15 ms): the fifth goes back.
        let s = run(seed, true, 0.0, Duration::from_millis(60));
        assert!(s.rto_probes >= 5, "seed {seed}: {} probes", s.rto_probes);
        assert!(s.retransmitted_pkts >= 4 + MSGS as u64, "seed {seed}: {s:?}");
    }
}

#[test]
fn a_lossless_path_that_loses_packets_still_delivers_everything() {
    let seeds = std::env::var("UROCE_SIM_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    for seed in 0..seeds {
        run(seed, true, 0.05, Duration::from_micros(5));
        run(seed, true, 0.05, Duration::from_millis(3));
        // No Local ACK Timeout: only probes resend, and after four tail
        // probes one goes back, so a lost NAK cannot stall the QP.
        run_with(seed, true, 0.05, Duration::from_micros(5), 0);
    }
}
