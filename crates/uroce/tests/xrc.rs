//! XRC over UDP between two contexts: an initiator QP on one side sends to
//! two XRC SRQs of the other side's domain through one target QP (each WR
//! names its SRQ); each SRQ's PD checks the accesses and its CQ gets the
//! completions; an SRQ of another domain, or none, is never reached.

use uroce::{
    Access, QpCaps, QpInitAttr, QpState, QpType, RecvWr, SendWr, SrqAttr, WcOpcode, WcStatus,
    WrOpcode,
};

const ALL: Access = Access(1 | 2 | 4 | 8);

/// An XRC initiator QP on side `a`, every WR signaled.
fn initiator(a: &uroce::testing::Side, max_send_wr: u32) -> uroce::Qp {
    let cap = QpCaps {
        max_send_wr,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let init = QpInitAttr {
        send_cq: &a.cq,
        recv_cq: &a.cq,
        cap,
        qp_type: QpType::XrcSend,
        sq_sig_all: true,
        srq: None,
    };
    a.pd.create_qp(&init).unwrap()
}

#[test]
fn an_initiator_reaches_srqs_of_the_targets_domain() {
    let (port, a, b) = uroce::testing::two_sides();
    let ini = initiator(&a, 16);
    assert!(ini.post_recv(&[RecvWr { wr_id: 0, sgl: &[] }]).is_err(), "no receive queue");
    let xrcd = b.ctx.open_xrcd().unwrap();
    let (cq1, cq2) = (b.ctx.create_cq(16).unwrap(), b.ctx.create_cq(16).unwrap());
    let pd2 = b.ctx.alloc_pd().unwrap();
    let attr = SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 };
    let srq1 = xrcd.create_srq(&b.pd, &cq1, &attr).unwrap();
    let srq2 = xrcd.create_srq(&pd2, &cq2, &attr).unwrap();
    let tgt = xrcd.create_target_qp().unwrap();
    assert_eq!((tgt.qp_type(), tgt.xrcd().is_some()), (QpType::XrcRecv, true));
    let (ia, ib) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&ini, ib, port, tgt.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&tgt, ia, port, ini.qpn(), 2, 1, ALL).unwrap();
    assert_eq!(tgt.query().state, QpState::ReadyToSend);

    let (m1, m2) = (b.pd.alloc_mr(4096, ALL).unwrap(), pd2.alloc_mr(4096, ALL).unwrap());
    srq1.post_recv(&[RecvWr { wr_id: 11, sgl: &[m1.sge(0, 4096).unwrap()] }]).unwrap();
    srq2.post_recv(&[RecvWr { wr_id: 22, sgl: &[m2.sge(0, 4096).unwrap()] }]).unwrap();
    let src = a.pd.alloc_mr(4096, ALL).unwrap();
    src.write(0, b"to srq one").unwrap();
    src.write(100, b"to srq two").unwrap();
    let s1 = [src.sge(0, 10).unwrap()];
    let s2 = [src.sge(100, 10).unwrap()];
    ini.post_send(&[
        SendWr { wr_id: 1, sgl: &s1, xrc_srqn: srq1.handle(), ..SendWr::default() },
        SendWr { wr_id: 2, sgl: &s2, xrc_srqn: srq2.handle(), ..SendWr::default() },
    ])
    .unwrap();
    let sent = uroce::testing::wait_completions(&a.cq, 2);
    assert!(sent.iter().all(|c| c.status == WcStatus::Success), "{sent:?}");
    // Each SRQ's CQ got its receive, on the target QP's number.
    let c1 = uroce::testing::wait_completion(&cq1);
    let c2 = uroce::testing::wait_completion(&cq2);
    assert_eq!((c1.wr_id, c1.opcode, c1.byte_len, c1.qp_num), (11, WcOpcode::Recv, 10, tgt.qpn()));
    assert_eq!((c2.wr_id, c2.byte_len, c2.qp_num), (22, 10, tgt.qpn()));
    let mut got = [0u8; 10];
    m1.read(0, &mut got).unwrap();
    assert_eq!(&got, b"to srq one");
    m2.read(0, &mut got).unwrap();
    assert_eq!(&got, b"to srq two");

    // A WRITE checked against SRQ 2's PD: a region of that PD is reached,
    // one of another PD is not.
    let w = |rkey, srqn| SendWr {
        wr_id: 3,
        opcode: WrOpcode::RdmaWrite,
        sgl: &s1,
        remote_addr: if rkey == m2.rkey() { m2.addr() + 512 } else { m1.addr() + 512 },
        rkey,
        xrc_srqn: srqn,
        ..SendWr::default()
    };
    ini.post_send(&[w(m2.rkey(), srq2.handle())]).unwrap();
    assert_eq!(uroce::testing::wait_completion(&a.cq).status, WcStatus::Success);
    m2.read(512, &mut got).unwrap();
    assert_eq!(&got, b"to srq one");
    ini.post_send(&[w(m1.rkey(), srq2.handle())]).unwrap();
    assert_eq!(uroce::testing::wait_completion(&a.cq).status, WcStatus::RemAccessErr);
}

#[test]
fn an_srq_of_another_domain_is_never_reached() {
    let (port, a, b) = uroce::testing::two_sides();
    let ini = initiator(&a, 4);
    let (d1, d2) = (b.ctx.open_xrcd().unwrap(), b.ctx.open_xrcd().unwrap());
    let attr = SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 };
    let foreign = d2.create_srq(&b.pd, &b.cq, &attr).unwrap();
    let m = b.pd.alloc_mr(64, ALL).unwrap();
    foreign.post_recv(&[RecvWr { wr_id: 9, sgl: &[m.sge(0, 64).unwrap()] }]).unwrap();
    let tgt = d1.create_target_qp().unwrap();
    let (ia, ib) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&ini, ib, port, tgt.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&tgt, ia, port, ini.qpn(), 2, 1, ALL).unwrap();
    let src = a.pd.alloc_mr(64, ALL).unwrap();
    let s = [src.sge(0, 8).unwrap()];
    ini.post_send(&[SendWr { wr_id: 1, sgl: &s, xrc_srqn: foreign.handle(), ..SendWr::default() }])
        .unwrap();
    // Dropped at the target: the initiator's retries run out.
    assert_eq!(uroce::testing::wait_completion(&a.cq).status, WcStatus::RetryExcErr);
    assert_eq!(b.cq.pending(), 0, "nothing reached the foreign SRQ");
}

/// `ibv_open_qp`: a second handle to a target QP keeps it alive after the
/// creator's handle is gone; it is connected and carries traffic; the QP
/// is destroyed with its last handle. Another domain cannot open it.
#[test]
fn an_opened_target_outlives_its_creator() {
    let (port, a, b) = uroce::testing::two_sides();
    let ini = initiator(&a, 4);
    let (xrcd, other) = (b.ctx.open_xrcd().unwrap(), b.ctx.open_xrcd().unwrap());
    let srq =
        xrcd.create_srq(&b.pd, &b.cq, &SrqAttr { max_wr: 4, max_sge: 1, srq_limit: 0 }).unwrap();
    let created = xrcd.create_target_qp().unwrap();
    let qpn = created.qpn();
    assert!(other.open_target_qp(qpn).is_err(), "another domain's QP");
    let opened = xrcd.open_target_qp(qpn).unwrap();
    assert_eq!((opened.qpn(), opened.qp_type()), (qpn, QpType::XrcRecv));
    drop(created);
    let (ia, ib) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&ini, ib, port, qpn, 1, 2, ALL).unwrap();
    uroce::connect(&opened, ia, port, ini.qpn(), 2, 1, ALL).unwrap();
    assert_eq!(opened.query().state, QpState::ReadyToSend);
    let m = b.pd.alloc_mr(64, ALL).unwrap();
    srq.post_recv(&[RecvWr { wr_id: 5, sgl: &[m.sge(0, 64).unwrap()] }]).unwrap();
    let src = a.pd.alloc_mr(64, ALL).unwrap();
    src.write(0, b"via an opened QP").unwrap();
    let s = [src.sge(0, 16).unwrap()];
    ini.post_send(&[SendWr { wr_id: 1, sgl: &s, xrc_srqn: srq.handle(), ..SendWr::default() }])
        .unwrap();
    assert_eq!(uroce::testing::wait_completion(&a.cq).status, WcStatus::Success);
    let c = uroce::testing::wait_completion(&b.cq);
    assert_eq!((c.wr_id, c.byte_len, c.qp_num), (5, 16, qpn));
    let again = xrcd.open_target_qp(qpn).unwrap();
    drop(opened);
    assert_eq!(again.query().state, QpState::ReadyToSend, "still alive through a third handle");
    drop(again);
    assert!(xrcd.open_target_qp(qpn).is_err(), "destroyed with its last handle");
}

/// One domain, opened through one file by two contexts of one device (as
/// two processes open it): the initiator reaches the SRQ of one through
/// the target QP of the other. The message waits (RNR) until the owner
/// posts a WQE, then is relayed to it and completes on its CQ in the
/// target QP's name; `O_EXCL` and a missing domain without `O_CREAT` fail
/// as the kernel's checks do.
#[test]
fn a_domain_shared_by_two_contexts_of_a_device_relays_to_the_srqs_owner() {
    let (port, a, b) = uroce::testing::two_sides();
    let owner = uroce::testing::open("127.0.0.2", port);
    let dir = uroce::published::run_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("test-xrc-domain-{}-{port}", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    let other = std::fs::File::create(path.with_extension("other")).unwrap();
    let errno = |r: uroce::Result<uroce::Xrcd>| r.map(|_| ()).unwrap_err().errno();
    assert_eq!(errno(b.ctx.open_shared_xrcd(&other, false, false)), libc::EAGAIN);
    let xb = b.ctx.open_shared_xrcd(&file, true, true).unwrap();
    assert_eq!(errno(owner.open_shared_xrcd(&file, true, true)), libc::EINVAL);
    let xo = owner.open_shared_xrcd(&file, false, false).unwrap();

    let (opd, ocq) = (owner.alloc_pd().unwrap(), owner.create_cq(16).unwrap());
    let srq = xo.create_srq(&opd, &ocq, &SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }).unwrap();
    let tgt = xb.create_target_qp().unwrap();
    let ini = initiator(&a, 4);
    let (ia, ib) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&ini, ib, port, tgt.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&tgt, ia, port, ini.qpn(), 2, 1, ALL).unwrap();

    let src = a.pd.alloc_mr(8192, ALL).unwrap();
    let msg: Vec<u8> = (0..6000u32).map(|i| (i % 251) as u8).collect();
    src.write(0, &msg).unwrap();
    let sgl = [src.sge(0, 6000).unwrap()];
    ini.post_send(&[SendWr { wr_id: 1, sgl: &sgl, xrc_srqn: srq.handle(), ..SendWr::default() }])
        .unwrap();
    // No WQE yet: RNR NAKs until one is posted (the requester retries).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while b.ctx.stats().send_rnr_err == 0 {
        assert!(std::time::Instant::now() < deadline, "no RNR NAK");
        let mut none = [uroce::Completion::new(0, WcStatus::Success, WcOpcode::Recv, 0, true)];
        assert_eq!(ocq.poll(&mut none).unwrap(), 0);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let dst = opd.alloc_mr(8192, ALL).unwrap();
    srq.post_recv(&[RecvWr { wr_id: 44, sgl: &[dst.sge(0, 8192).unwrap()] }]).unwrap();
    let sent = uroce::testing::wait_completion(&a.cq);
    assert_eq!(sent.status, WcStatus::Success);
    let c = uroce::testing::wait_completion(&ocq);
    assert_eq!((c.wr_id, c.status, c.byte_len, c.qp_num), (44, WcStatus::Success, 6000, tgt.qpn()));
    let mut got = vec![0u8; 6000];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, msg);
    assert_eq!((b.ctx.stats().xrc_relayed_out, owner.stats().xrc_relayed_in), (1, 1));
    drop((ini, tgt, srq, xb, xo));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(path.with_extension("other"));
}

/// RDMA WRITE, READ and atomics through one context's target QP into the
/// memory of another context that owns the SRQ they name (one domain,
/// two contexts of one device, as two processes share it): the target
/// asks the owner to run each access and answers the requester only once
/// the owner has; a key the owner's SRQ's PD does not have is refused.
#[test]
fn writes_reads_and_atomics_through_a_target_reach_the_srq_owners_memory() {
    let Shared { port, a, b, other: owner, path, xb, xo } = shared("access");
    let (opd, ocq) = (owner.alloc_pd().unwrap(), owner.create_cq(16).unwrap());
    let srq = xo.create_srq(&opd, &ocq, &SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }).unwrap();
    let tgt = xb.create_target_qp().unwrap();
    let ini = initiator(&a, 16);
    let (ia, ib) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&ini, ib, port, tgt.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&tgt, ia, port, ini.qpn(), 2, 1, ALL).unwrap();

    let mem = opd.alloc_mr(65536, ALL).unwrap();
    let src = a.pd.alloc_mr(65536, ALL).unwrap();
    let msg: Vec<u8> = (0..20000u32).map(|i| (i % 253) as u8).collect();
    src.write(0, &msg).unwrap();
    let wr = |wr_id, opcode, sge, off: u64| SendWr {
        wr_id,
        opcode,
        sgl: std::slice::from_ref(sge),
        remote_addr: mem.addr() + off,
        rkey: mem.rkey(),
        xrc_srqn: srq.handle(),
        ..SendWr::default()
    };
    let run = |w: SendWr| {
        ini.post_send(&[w]).unwrap();
        uroce::testing::wait_completion(&a.cq)
    };
    // WRITE 20000 bytes (five packets), then READ them back elsewhere.
    let s1 = src.sge(0, 20000).unwrap();
    let c = run(wr(1, WrOpcode::RdmaWrite, &s1, 100));
    assert_eq!(c.status, WcStatus::Success);
    let mut got = vec![0u8; 20000];
    mem.read(100, &mut got).unwrap();
    assert_eq!(got, msg, "placed in the owner's memory");
    let s2 = src.sge(30000, 20000).unwrap();
    let c = run(wr(2, WrOpcode::RdmaRead, &s2, 100));
    assert_eq!((c.status, c.byte_len), (WcStatus::Success, 20000));
    src.read(30000, &mut got).unwrap();
    assert_eq!(got, msg, "read from the owner's memory");
    // FETCH_ADD and CMP_SWAP.
    mem.write(40000, &5u64.to_ne_bytes()).unwrap();
    let s3 = src.sge(60000, 8).unwrap();
    let mut w = wr(3, WrOpcode::AtomicFetchAndAdd, &s3, 40000);
    w.compare_add = 10;
    assert_eq!(run(w).status, WcStatus::Success);
    let s4 = src.sge(60008, 8).unwrap();
    let mut w = wr(4, WrOpcode::AtomicCmpAndSwp, &s4, 40000);
    (w.compare_add, w.swap) = (15, 99);
    assert_eq!(run(w).status, WcStatus::Success);
    let mut v = [0u8; 24];
    src.read(60000, &mut v[..16]).unwrap();
    mem.read(40000, &mut v[16..]).unwrap();
    let words: Vec<u64> = v.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
    assert_eq!(words, [5, 15, 99], "the originals returned, the owner's word swapped");
    // WRITE with immediate: the owner's WQE completes with it.
    let dst = opd.alloc_mr(64, ALL).unwrap();
    srq.post_recv(&[RecvWr { wr_id: 77, sgl: &[dst.sge(0, 64).unwrap()] }]).unwrap();
    let s5 = src.sge(0, 300).unwrap();
    let mut w = wr(5, WrOpcode::RdmaWriteWithImm, &s5, 50000);
    w.imm_or_inv = 0x1234;
    assert_eq!(run(w).status, WcStatus::Success);
    let c = uroce::testing::wait_completion(&ocq);
    assert_eq!((c.wr_id, c.opcode, c.byte_len), (77, WcOpcode::RecvRdmaWithImm, 300));
    assert_eq!((c.imm_or_inv, c.qp_num), (0x1234, tgt.qpn()));
    assert!(b.ctx.stats().xrc_accesses_asked >= 9, "{}", b.ctx.stats().xrc_accesses_asked);
    assert_eq!(owner.stats().xrc_accesses_served, b.ctx.stats().xrc_accesses_asked);
    // A key of another PD than the SRQ's: refused by the owner.
    let elsewhere = owner.alloc_pd().unwrap().alloc_mr(64, ALL).unwrap();
    let s6 = src.sge(0, 8).unwrap();
    let mut w = wr(6, WrOpcode::RdmaWrite, &s6, 0);
    (w.remote_addr, w.rkey) = (elsewhere.addr(), elsewhere.rkey());
    assert_eq!(run(w).status, WcStatus::RemAccessErr);
    let mut none = [0u8; 8];
    elsewhere.read(0, &mut none).unwrap();
    assert_eq!(none, [0; 8]);
    drop((ini, tgt, srq, xb, xo));
    let _ = std::fs::remove_file(&path);
}

/// `ibv_open_qp` of a target QP another context of the device created
/// (as another process would): the opener's handle modifies and queries
/// it through the creator, the QP outlives the creator's handle while the
/// opener's lives, carries messages to the opener's SRQ, its async events
/// reach the opener too, and it goes with the last handle.
#[test]
fn a_target_qp_of_another_context_is_opened_modified_and_kept() {
    let Shared { port, a, b: _b, other: opener, path, xb, xo } = shared("open");
    let created = xb.create_target_qp().unwrap();
    let qpn = created.qpn();
    assert!(xo.open_target_qp(qpn + 1).is_err(), "no such target QP");
    let opened = xo.open_target_qp(qpn).unwrap();
    assert_eq!((opened.qpn(), opened.qp_type()), (qpn, QpType::XrcRecv));
    assert_eq!(opened.query().state, QpState::Reset);

    // Connected through the opener's handle: modifies run in the creator.
    let ini = initiator(&a, 4);
    let (ia, ib) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&ini, ib, port, qpn, 1, 2, ALL).unwrap();
    uroce::connect(&opened, ia, port, ini.qpn(), 2, 1, ALL).unwrap();
    assert_eq!(created.query().state, QpState::ReadyToSend);
    let q = opened.query();
    assert_eq!((q.state, q.dest_qpn, q.path.unwrap().dst), (QpState::ReadyToSend, ini.qpn(), ia));
    // A wrong transition fails there, and says so here.
    let bad = uroce::QpAttr { state: QpState::ReadyToReceive, ..uroce::QpAttr::default() };
    assert!(opened.modify(&bad, uroce::AttrMask::STATE).is_err());

    // The creator's handles go (its QP's and its domain's); the opener's
    // keeps the QP, and the domain shared for it.
    drop(created);
    assert!(xb.kept_for_others(), "kept for the opener");
    drop(xb);
    let (opd, ocq) = (opener.alloc_pd().unwrap(), opener.create_cq(16).unwrap());
    let srq = xo.create_srq(&opd, &ocq, &SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }).unwrap();
    let dst = opd.alloc_mr(64, ALL).unwrap();
    srq.post_recv(&[RecvWr { wr_id: 8, sgl: &[dst.sge(0, 64).unwrap()] }]).unwrap();
    let src = a.pd.alloc_mr(64, ALL).unwrap();
    src.write(0, b"kept by its opener").unwrap();
    let s = [src.sge(0, 18).unwrap()];
    ini.post_send(&[SendWr { wr_id: 1, sgl: &s, xrc_srqn: srq.handle(), ..SendWr::default() }])
        .unwrap();
    assert_eq!(uroce::testing::wait_completion(&a.cq).status, WcStatus::Success);
    let c = uroce::testing::wait_completion(&ocq);
    assert_eq!((c.wr_id, c.byte_len, c.qp_num), (8, 18, qpn));

    // A request the target refuses (a key nobody has): its access error
    // event reaches the opener.
    let mut w = SendWr { wr_id: 2, sgl: &s, xrc_srqn: srq.handle(), ..SendWr::default() };
    (w.opcode, w.remote_addr, w.rkey) = (WrOpcode::RdmaWrite, 0x1000, 0xdead_0000);
    ini.post_send(&[w]).unwrap();
    assert_eq!(uroce::testing::wait_completion(&a.cq).status, WcStatus::RemAccessErr);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let ev = loop {
        if let Some(e) = opener.poll_async_event() {
            break e;
        }
        assert!(std::time::Instant::now() < deadline, "no event at the opener");
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    assert_eq!(ev, uroce::AsyncEvent::QpAccessError { qpn });
    assert_eq!(opened.query().state, QpState::Error);

    // The last handle goes: so does the QP (and its listing).
    drop(opened);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while xo.open_target_qp(qpn).is_ok() {
        assert!(std::time::Instant::now() < deadline, "the QP outlived its last handle");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop((ini, srq, xo));
    let _ = std::fs::remove_file(&path);
}

/// Sides `a` and `b`, another context of `b`'s device (another process,
/// as far as the domain goes), and one XRC domain file open in `b`
/// (made there) and in the other.
struct Shared {
    port: u16,
    a: uroce::testing::Side,
    b: uroce::testing::Side,
    other: uroce::Context,
    path: std::path::PathBuf,
    xb: uroce::Xrcd,
    xo: uroce::Xrcd,
}

fn shared(name: &str) -> Shared {
    let (port, a, b) = uroce::testing::two_sides();
    let other = uroce::testing::open("127.0.0.2", port);
    let dir = uroce::published::run_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("test-xrc-{name}-{}-{port}", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    let xb = b.ctx.open_shared_xrcd(&file, true, false).unwrap();
    let xo = other.open_shared_xrcd(&file, false, false).unwrap();
    Shared { port, a, b, other, path, xb, xo }
}
