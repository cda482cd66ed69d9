//! ACKs held for the application's reply (`qp::ack_hold`), on the virtual
//! clock: a WRITE ping-pong sends each ACK behind the reply, never late;
//! the last ACK of a ping-pong leaves by its deadline without a resend; a
//! stream is never held; a lossy ping-pong still delivers everything.

use std::time::Duration;

use uroce_sim::pair::{PD, PairConfig};
use uroce_sim::{LinkConfig, RcPair};
use uroce_transport::{Access, Instant, SendFlags, SendWr, Sge, WcStatus, WrOpcode};

const ALL: Access = Access(1 | 2 | 4 | 8);
/// `ack_hold::HOLD`.
const HOLD: Duration = Duration::from_micros(200);

struct Bufs {
    a: (u64, u32, u32),
    b: (u64, u32, u32),
}

fn setup(seed: u64, link: LinkConfig) -> (RcPair, Bufs) {
    let mut p = RcPair::new(seed, link, PairConfig::default());
    let a = p.a.mem.register(PD, 4096, ALL);
    let b = p.b.mem.register(PD, 4096, ALL);
    (p, Bufs { a, b })
}

/// One signaled 8-byte WRITE of `mark` from one side's buffer start to the
/// peer's, at offset 1024.
fn post_write(p: &mut RcPair, a_side: bool, mark: u8, wr_id: u64, bufs: &Bufs) {
    let (from, to) = if a_side { (bufs.a, bufs.b) } else { (bufs.b, bufs.a) };
    let sge = [Sge { addr: from.0, length: 8, lkey: from.1 }];
    let now = p.now;
    let node = if a_side { &mut p.a } else { &mut p.b };
    node.mem.fill(from.0, &[mark; 8]);
    let wr = SendWr {
        wr_id,
        opcode: WrOpcode::RdmaWrite,
        flags: SendFlags::SIGNALED,
        sgl: &sge,
        remote_addr: to.0 + 1024,
        rkey: to.2,
        ..SendWr::default()
    };
    node.qp_mut().post_send(now, &[wr]).unwrap();
}

/// `rounds` WRITE ping-pong rounds, as `ib_write_lat` runs them: each side
/// writes once the peer's previous WRITE has landed.
fn ping_pong(p: &mut RcPair, bufs: &Bufs, rounds: u8) {
    for r in 1..=rounds {
        post_write(p, true, r, u64::from(r), bufs);
        let at = bufs.b.0 + 1024;
        assert!(p.run_until(Duration::from_secs(1), |p| p.b.mem.snapshot(at, 1)[0] == r));
        post_write(p, false, r, u64::from(r), bufs);
        let at = bufs.a.0 + 1024;
        assert!(p.run_until(Duration::from_secs(1), |p| p.a.mem.snapshot(at, 1)[0] == r));
    }
}

#[test]
fn a_ping_pong_sends_each_ack_behind_the_reply() {
    let (mut p, bufs) = setup(1, LinkConfig::default());
    ping_pong(&mut p, &bufs, 40);
    // Let the last ACKs out (the final one by its deadline).
    assert!(p.run_until_idle(Duration::from_secs(1)));
    for n in [&p.a, &p.b] {
        let s = n.qp().stats();
        assert_eq!(n.completions.len(), 40);
        assert!(n.completions.iter().all(|c| c.status == WcStatus::Success));
        assert_eq!(s.retransmits, 0, "holding never costs a resend");
        // After the first rounds (the streak) every ACK rides a reply.
        assert!(s.acks_behind_request >= 35, "{s:?}");
    }
}

#[test]
fn the_last_ack_of_a_ping_pong_leaves_by_its_deadline() {
    let (mut p, bufs) = setup(2, LinkConfig::default());
    ping_pong(&mut p, &bufs, 10);
    // A writes once more; B receives it and does not reply.
    let t0 = p.now;
    post_write(&mut p, true, 99, 99, &bufs);
    assert!(p.run_until(Duration::from_secs(1), |p| p.a.completions.iter().any(|c| c.wr_id == 99)));
    let waited = p.now.saturating_since(t0);
    let rtt = 2 * LinkConfig::default().delay;
    assert!(waited >= HOLD, "B held the ACK for a reply ({waited:?})");
    assert!(waited <= HOLD + rtt + Duration::from_micros(10), "{waited:?}");
    assert_eq!(p.a.qp().stats().retransmits, 0);
    assert_eq!(p.b.qp().stats().ack_hold_expired, 1);
    // The ping-pong is over for B: the next WRITE is acknowledged at once.
    let t1 = p.now;
    post_write(&mut p, true, 100, 100, &bufs);
    assert!(
        p.run_until(Duration::from_secs(1), |p| p.a.completions.iter().any(|c| c.wr_id == 100))
    );
    assert!(p.now.saturating_since(t1) < HOLD, "{:?}", p.now.saturating_since(t1));
}

#[test]
fn a_released_ack_leaves_at_once() {
    let (mut p, bufs) = setup(3, LinkConfig::default());
    ping_pong(&mut p, &bufs, 10);
    post_write(&mut p, true, 99, 99, &bufs);
    let at = bufs.b.0 + 1024;
    assert!(p.run_until(Duration::from_secs(1), |p| p.b.mem.snapshot(at, 1)[0] == 99));
    // B's application is about to destroy or modify its QP: the driver
    // releases the held ACK first.
    assert!(p.b.qp().holds_ack());
    let t0 = p.now;
    assert!(p.b.qp_mut().release_held_ack());
    assert!(p.run_until(Duration::from_secs(1), |p| p.a.completions.iter().any(|c| c.wr_id == 99)));
    assert!(p.now.saturating_since(t0) <= 2 * LinkConfig::default().delay);
    assert!(!p.b.qp().holds_ack());
}

#[test]
fn a_stream_is_never_held() {
    let (mut p, bufs) = setup(4, LinkConfig::default());
    ping_pong(&mut p, &bufs, 10);
    // A now streams 64 WRITEs, signaled each, while B replies to nothing:
    // B's first ACK may wait for the second request, no longer.
    let t0 = p.now;
    for i in 0..64u64 {
        post_write(&mut p, true, 7, 1000 + i, &bufs);
    }
    assert!(p.run_until(Duration::from_secs(1), |p| p.a.completions.len() == 10 + 64));
    let took = p.now.saturating_since(t0);
    assert!(took < HOLD, "the stream waited for held ACKs: {took:?}");
    assert_eq!(p.b.qp().stats().ack_hold_expired, 0);
}

#[test]
fn a_lossy_ping_pong_completes_everything() {
    for seed in 0..8 {
        let link = LinkConfig { loss: 0.05, duplicate: 0.02, ..LinkConfig::default() };
        let (mut p, bufs) = setup(100 + seed, link);
        ping_pong(&mut p, &bufs, 60);
        assert!(p.run_until(Duration::from_secs(30), |p| p.a.completions.len() == 60
            && p.b.completions.len() == 60));
        for n in [&p.a, &p.b] {
            assert!(n.completions.iter().all(|c| c.status == WcStatus::Success), "seed {seed}");
        }
    }
}

#[test]
fn holding_starts_only_in_a_ping_pong() {
    let (mut p, bufs) = setup(5, LinkConfig::default());
    // One-way WRITEs, each waited for: B never posts, so never holds.
    for i in 0..20u8 {
        let t0: Instant = p.now;
        post_write(&mut p, true, i, u64::from(i), &bufs);
        assert!(
            p.run_until(Duration::from_secs(1), |p| p.a.completions.len() == usize::from(i) + 1)
        );
        assert!(
            p.now.saturating_since(t0)
                <= 2 * LinkConfig::default().delay + Duration::from_micros(1)
        );
    }
    assert_eq!(p.b.qp().stats().acks_behind_request, 0);
}
