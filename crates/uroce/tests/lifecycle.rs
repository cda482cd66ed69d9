//! Resizing and re-registering with work in flight (issue 16's
//! lifecycles), over UDP between two contexts: a CQ resized with
//! completions waiting, an SRQ resized with receives posted, a region
//! re-registered with new rights and new memory while a peer writes it.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use uroce::{
    Access, Context, Cq, Pd, Qp, QpCaps, QpInitAttr, QpType, RecvWr, SendWr, Srq, SrqAttr,
    WcStatus, WrOpcode,
};

const ALL: Access = Access(1 | 2 | 4 | 8);

struct Side {
    ctx: Context,
    pd: Pd,
    cq: Cq,
}

fn side(addr: &str, port: u16) -> Side {
    let ctx = uroce::testing::open(addr, port);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    Side { ctx, pd, cq }
}

fn qp(s: &Side, srq: Option<&Srq>) -> Qp {
    let cap = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    s.pd.create_qp(&QpInitAttr {
        send_cq: &s.cq,
        recv_cq: &s.cq,
        cap,
        qp_type: QpType::Rc,
        sq_sig_all: true,
        srq,
    })
    .unwrap()
}

/// Two sides with one connected QP each (B's on `srq` if given).
fn pair(srq_b: impl FnOnce(&Side) -> Option<Srq>) -> (Side, Side, Qp, Qp, Option<Srq>) {
    let port = uroce::testing::free_port();
    let (a, b) = (side("127.0.0.1", port), side("127.0.0.2", port));
    let srq = srq_b(&b);
    let (qa, qb) = (qp(&a, None), qp(&b, srq.as_ref()));
    let (ia, ib): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&qa, ib, port, qb.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&qb, ia, port, qa.qpn(), 2, 1, ALL).unwrap();
    (a, b, qa, qb, srq)
}

fn poll_n(cq: &Cq, n: usize) -> Vec<uroce::Completion> {
    uroce::testing::wait_completions(cq, n)
}

fn wait_pending(cq: &Cq, n: usize) {
    let t = Instant::now();
    while cq.pending() < n {
        assert!(t.elapsed() < Duration::from_secs(10), "{} of {n} completions", cq.pending());
        std::thread::yield_now();
    }
}

#[test]
fn a_cq_resized_with_completions_waiting_keeps_them() {
    let (a, b, qa, _qb, _) = pair(|_| None);
    let dst = b.pd.alloc_mr(64, ALL).unwrap();
    let src = a.pd.alloc_mr(64, ALL).unwrap();
    let sge = [src.sge(0, 8).unwrap()];
    let write = |id| SendWr {
        wr_id: id,
        opcode: WrOpcode::RdmaWrite,
        sgl: &sge,
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
        ..SendWr::default()
    };
    let wrs: Vec<_> = (0..10).map(write).collect();
    qa.post_send(&wrs).unwrap();
    wait_pending(&a.cq, 10);
    assert!(a.cq.resize(9).is_err(), "fewer entries than completions wait");
    assert!(a.cq.resize(0).is_err());
    assert_eq!(a.cq.cqe(), 16, "a refused resize changes nothing");
    a.cq.resize(10).unwrap();
    assert_eq!(a.cq.cqe(), 10);
    // Full: a further completion would overflow. Grow, then add more.
    a.cq.resize(64).unwrap();
    let wrs: Vec<_> = (10..40).map(write).collect();
    qa.post_send(&wrs).unwrap();
    let got = poll_n(&a.cq, 40);
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..40).collect::<Vec<_>>(), "in order, none lost");
    assert!(a.ctx.poll_async_event().is_none(), "no CQ error");
}

#[test]
fn an_srq_resized_with_receives_posted_keeps_them_in_order() {
    let (a, b, qa, _qb, srq) =
        pair(|b| Some(b.ctx.create_srq(&SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 }).unwrap()));
    let srq = srq.unwrap();
    let buf = b.pd.alloc_mr(4096, ALL).unwrap();
    let post = |ids: std::ops::Range<u64>| {
        for id in ids {
            let sge = [buf.sge(id as usize * 64, 64).unwrap()];
            srq.post_recv(&[RecvWr { wr_id: id, sgl: &sge }]).unwrap();
        }
    };
    post(0..4);
    assert!(srq.post_recv(&[RecvWr { wr_id: 99, sgl: &[] }]).is_err(), "full at 4");
    assert!(srq.resize(3).is_err(), "fewer than are posted");
    assert!(srq.resize(0).is_err());
    srq.resize(16).unwrap();
    assert_eq!(srq.query().max_wr, 16);
    post(4..12);
    srq.arm_limit(10).unwrap();
    assert!(srq.resize(9).is_err(), "below the armed limit");
    let src = a.pd.alloc_mr(64, ALL).unwrap();
    for i in 0..12u8 {
        src.write(0, &[i]).unwrap();
        let sge = [src.sge(0, 1).unwrap()];
        qa.post_send(&[SendWr { wr_id: u64::from(i), sgl: &sge, ..SendWr::default() }]).unwrap();
        poll_n(&a.cq, 1);
    }
    let got = poll_n(&b.cq, 12);
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..12).collect::<Vec<_>>());
    for i in 0..12u8 {
        let mut x = [0u8];
        buf.read(usize::from(i) * 64, &mut x).unwrap();
        assert_eq!(x[0], i, "SEND {i} landed in receive {i}'s buffer");
    }
}

#[test]
fn a_reregistered_region_has_new_rights_and_memory_and_then_new_keys() {
    let (a, b, qa, _qb, _) = pair(|_| None);
    let mut dst = b.pd.alloc_mr(4096, ALL).unwrap();
    let old_key = dst.rkey();
    dst.rereg(None, Some(Access::LOCAL_WRITE | Access::REMOTE_WRITE)).unwrap();
    assert_eq!(dst.rkey(), old_key, "new rights alone keep the keys (as rxe and mlx5)");
    assert_eq!(dst.access(), Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    assert!(dst.rereg(None, Some(Access::REMOTE_WRITE)).is_err(), "remote write needs local");
    let other = a.pd.clone();
    assert!(dst.rereg(Some(&other), None).is_err(), "a PD of another context");
    // New memory, at a new IOVA: the peer's WRITE lands there.
    let mut fresh = vec![0u8; 8192].into_boxed_slice();
    // SAFETY: `dst` is dropped (its keys revoked) before `fresh`, below.
    #[allow(unsafe_code)]
    unsafe {
        dst.rereg_translation(None, fresh.as_mut_ptr(), 8192, 0x7000_0000, None).unwrap();
    }
    assert_eq!((dst.addr(), dst.len()), (0x7000_0000, 8192));
    let src = a.pd.alloc_mr(64, ALL).unwrap();
    src.write(0, b"rereg'd!").unwrap();
    let sge = [src.sge(0, 8).unwrap()];
    let write = |addr, rkey, id| SendWr {
        wr_id: id,
        opcode: WrOpcode::RdmaWrite,
        sgl: &sge,
        remote_addr: addr,
        rkey,
        ..SendWr::default()
    };
    qa.post_send(&[write(0x7000_0000 + 5000, dst.rkey(), 1)]).unwrap();
    assert_eq!(poll_n(&a.cq, 1)[0].status, WcStatus::Success);
    let mut got = [0u8; 8];
    dst.read(5000, &mut got).unwrap();
    assert_eq!(&got, b"rereg'd!");
    // The key the region had before its new memory is dead.
    qa.post_send(&[write(0x7000_0000, old_key, 2)]).unwrap();
    assert_eq!(poll_n(&a.cq, 1)[0].status, WcStatus::RemAccessErr);
    drop(dst);
    assert_eq!(&fresh[5000..5008], b"rereg'd!");
}

#[test]
fn completions_carry_the_time_they_reached_their_cq() {
    let (a, b, qa, _qb, _) = pair(|_| None);
    let dst = b.pd.alloc_mr(64, ALL).unwrap();
    let src = a.pd.alloc_mr(64, ALL).unwrap();
    let sge = [src.sge(0, 8).unwrap()];
    let attr = a.ctx.query_device();
    assert_eq!((attr.hca_core_clock_khz, attr.completion_timestamp_mask), (1_000_000, u64::MAX));
    let before = a.ctx.clock_ns();
    let mut stamps = vec![];
    for id in 0..5 {
        let wr = SendWr {
            wr_id: id,
            opcode: WrOpcode::RdmaWrite,
            sgl: &sge,
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
            ..SendWr::default()
        };
        qa.post_send(&[wr]).unwrap();
        stamps.push(poll_n(&a.cq, 1)[0].timestamp);
        std::thread::sleep(Duration::from_millis(2));
    }
    let after = a.ctx.clock_ns();
    assert!(stamps.windows(2).all(|w| w[1] >= w[0] + 2_000_000), "2 ms apart: {stamps:?}");
    assert!(before <= stamps[0] && stamps[4] <= after, "{before} {stamps:?} {after}");
    let wall =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64;
    let stamped = a.cq.wallclock_ns(stamps[4]);
    assert!(stamped <= wall && wall - stamped < 1_000_000_000, "{stamped} vs {wall}");
}

#[test]
fn device_memory_is_reached_by_copies_and_a_zero_based_region() {
    let (a, b, qa, _qb, _) = pair(|_| None);
    assert!(b.ctx.alloc_dm(0).is_err());
    assert!(b.ctx.alloc_dm(usize::MAX).is_err(), "above max_dm_size");
    let dm = b.ctx.alloc_dm(4096).unwrap();
    dm.write(4000, b"tail").unwrap();
    assert!(dm.write(4096, b"past").is_err(), "bounds");
    assert!(dm.write(4001, b"odd!").is_err() && dm.write(0, b"odd").is_err(), "4-byte words");
    let mut word = [0u8; 4];
    assert!(dm.read(2, &mut word).is_err(), "4-byte words");
    let empty = b.pd.reg_dm_mr(&dm, 64, 0, ALL).unwrap();
    assert_eq!(empty.len(), 0, "an empty region, as the kernel allows");
    drop(empty);
    assert!(b.pd.reg_dm_mr(&dm, 3000, 2000, ALL).is_err(), "a range past its end");
    assert!(a.pd.reg_dm_mr(&dm, 0, 16, ALL).is_err(), "device memory of another context");
    // A region on the second half: zero-based, so address 0 is byte 2048.
    let mr = b.pd.reg_dm_mr(&dm, 2048, 2048, ALL).unwrap();
    assert_eq!((mr.addr(), mr.len()), (0, 2048));
    drop(dm);
    let src = a.pd.alloc_mr(64, ALL).unwrap();
    src.write(0, b"on chip").unwrap();
    let sge = [src.sge(0, 7).unwrap()];
    qa.post_send(&[SendWr {
        wr_id: 1,
        opcode: WrOpcode::RdmaWrite,
        sgl: &sge,
        remote_addr: 100,
        rkey: mr.rkey(),
        ..SendWr::default()
    }])
    .unwrap();
    assert_eq!(poll_n(&a.cq, 1)[0].status, WcStatus::Success);
    // Read back through the region (which kept the memory alive) and
    // through a READ of the tail written before.
    let mut got = [0u8; 7];
    mr.read(100, &mut got).unwrap();
    assert_eq!(&got, b"on chip");
    let sge = [src.sge(8, 4).unwrap()];
    qa.post_send(&[SendWr {
        wr_id: 2,
        opcode: WrOpcode::RdmaRead,
        sgl: &sge,
        remote_addr: 4000 - 2048,
        rkey: mr.rkey(),
        ..SendWr::default()
    }])
    .unwrap();
    assert_eq!(poll_n(&a.cq, 1)[0].status, WcStatus::Success);
    let mut tail = [0u8; 4];
    src.read(8, &mut tail).unwrap();
    assert_eq!(&tail, b"tail");
}

#[test]
fn moderated_cq_events_wait_for_a_count_or_a_period() {
    let (port, a, b) = uroce::testing::two_sides();
    let ch = a.ctx.create_comp_channel().unwrap();
    let cq = a.ctx.create_cq_with(64, Some(&ch)).unwrap();
    let qa = uroce::testing::rc_qp(
        &a.pd,
        &cq,
        QpCaps {
            max_send_wr: 16,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        true,
    );
    let qb = uroce::testing::rc_qp(
        &b.pd,
        &b.cq,
        QpCaps {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        true,
    );
    let (ia, ib) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&qa, ib, port, qb.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&qb, ia, port, qa.qpn(), 2, 1, ALL).unwrap();
    let dst = b.pd.alloc_mr(64, ALL).unwrap();
    let src = a.pd.alloc_mr(64, ALL).unwrap();
    let sge = [src.sge(0, 8).unwrap()];
    let write = || SendWr {
        opcode: WrOpcode::RdmaWrite,
        sgl: &sge,
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
        ..SendWr::default()
    };
    assert!(cq.moderate(4, 5000).is_err(), "above max_cq_period");
    // Four completions per event, no period: three stay silent.
    cq.moderate(4, 0).unwrap();
    cq.req_notify(false).unwrap();
    qa.post_send(&[write(), write(), write()]).unwrap();
    wait_pending(&cq, 3);
    assert_eq!(ch.get_event_timeout(Duration::from_millis(100)).unwrap(), None, "3 of 4");
    qa.post_send(&[write()]).unwrap();
    assert_eq!(ch.get_event_timeout(Duration::from_secs(5)).unwrap(), Some(cq.handle()));
    cq.ack_events(1);
    uroce::testing::wait_completions(&cq, 4);
    // A count that never comes: the period (4 ms) ends the wait.
    cq.moderate(100, 4000).unwrap();
    cq.req_notify(false).unwrap();
    let posted = Instant::now();
    qa.post_send(&[write()]).unwrap();
    assert_eq!(ch.get_event_timeout(Duration::from_secs(5)).unwrap(), Some(cq.handle()));
    assert!(posted.elapsed() >= Duration::from_micros(3900), "{:?}", posted.elapsed());
    cq.ack_events(1);
    uroce::testing::wait_completions(&cq, 1);
}

/// PDs count while they live: a program that allocates and frees more
/// PDs over its life than `max_pd` may be alive at once is not refused
/// (before, every PD ever allocated counted), while `max_pd` live ones
/// are the limit; a freed PD's number is not handed out again at once.
#[test]
fn pds_count_while_they_live() {
    let ctx = uroce::testing::open("127.0.0.1", uroce::testing::free_port());
    let max = ctx.query_device().max_pd;
    let first = ctx.alloc_pd().unwrap();
    for _ in 0..max + 10 {
        let pd = ctx.alloc_pd().unwrap();
        assert_ne!(pd.handle(), first.handle());
    }
    let live: Vec<Pd> = (1..max).map(|_| ctx.alloc_pd().unwrap()).collect();
    assert!(matches!(ctx.alloc_pd(), Err(uroce::Error::Limit(_))), "max_pd live PDs");
    drop(live);
    let again = ctx.alloc_pd().unwrap();
    assert_ne!(again.handle(), first.handle());
}
