//! A signaled WR after a run of unsignaled ones is flagged as awaited
//! (`Qp::take_awaited_post`): the I/O layer sends it at once instead of
//! batching it, since an application that signals one WR in N (perftest's
//! `-Q`) reposts only when that completion comes.

use uroce_sim::RcPair;
use uroce_sim::pair::{PD, PairConfig};
use uroce_transport::{AWAITED_RUN, Access, SendFlags, SendWr, Sge, WrOpcode};

fn post(p: &mut RcPair, signaled: bool, sge: &[Sge], to: (u64, u32, u32)) {
    let now = p.now;
    let wr = SendWr {
        opcode: WrOpcode::RdmaWrite,
        flags: if signaled { SendFlags::SIGNALED } else { SendFlags(0) },
        sgl: sge,
        remote_addr: to.0,
        rkey: to.2,
        ..SendWr::default()
    };
    p.a.qp_mut().post_send(now, &[wr]).unwrap();
}

#[test]
fn a_signaled_wr_after_a_long_unsignaled_run_is_awaited_once() {
    let mut p = RcPair::new(1, Default::default(), PairConfig::default());
    let a = p.a.mem.register(PD, 4096, Access(1 | 2 | 4 | 8));
    let b = p.b.mem.register(PD, 4096, Access(1 | 2 | 4 | 8));
    let sge = [Sge { addr: a.0, length: 8, lkey: a.1 }];
    // Every WR signaled (sq_sig_all style): nothing is awaited.
    for _ in 0..3 * AWAITED_RUN {
        post(&mut p, true, &sge, b);
        assert!(!p.a.qp_mut().take_awaited_post());
        p.run_until_idle(std::time::Duration::from_millis(10));
    }
    // One short of the run: not awaited.
    for _ in 0..AWAITED_RUN - 1 {
        post(&mut p, false, &sge, b);
    }
    post(&mut p, true, &sge, b);
    assert!(!p.a.qp_mut().take_awaited_post());
    // A full run: awaited, and reported once.
    for _ in 0..AWAITED_RUN {
        post(&mut p, false, &sge, b);
        assert!(!p.a.qp_mut().take_awaited_post(), "unsignaled WRs are never awaited");
    }
    post(&mut p, true, &sge, b);
    assert!(p.a.qp_mut().take_awaited_post());
    assert!(!p.a.qp_mut().take_awaited_post(), "taken");
    assert!(p.run_until_idle(std::time::Duration::from_millis(10)));
}
