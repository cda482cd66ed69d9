//! Shared receive queues over UDP: several QPs consuming one SRQ while
//! multi-packet SENDs interleave, the limit event, RNR on an empty SRQ, and
//! the last-WQE event.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uroce::{
    Access, AsyncEvent, AttrMask, Completion, Context, Cq, Mr, Pd, Qp, QpAttr, QpCaps, QpInitAttr,
    QpState, QpType, RecvWr, SendWr, Srq, SrqAttr, WcOpcode, WcStatus,
};

const ALL: Access = Access(1 | 2 | 4 | 8);

fn open(addr: &str, port: u16) -> (Context, Pd, Cq, Mr) {
    let ctx = uroce::testing::open(addr, port);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let mr = pd.alloc_mr(4 << 20, ALL).unwrap();
    (ctx, pd, cq, mr)
}

fn qp(pd: &Pd, cq: &Cq, srq: Option<&Srq>) -> Qp {
    let cap = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    pd.create_qp(&QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap,
        qp_type: QpType::Rc,
        sq_sig_all: true,
        srq,
    })
    .unwrap()
}

fn poll_n(cq: &Cq, n: usize) -> Vec<Completion> {
    let mut out = vec![];
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 16];
    let t = Instant::now();
    while out.len() < n {
        let k = cq.poll(&mut wc).unwrap();
        out.extend_from_slice(&wc[..k]);
        assert!(t.elapsed() < Duration::from_secs(10), "got {} of {n} completions", out.len());
    }
    out
}

/// Routes SRQ limit events to a queue of its own.
#[derive(Debug)]
struct SrqEvents {
    queue: uroce::AsyncEventQueue,
}

impl uroce::AsyncEventRouter for SrqEvents {
    fn route(&self, event: &AsyncEvent) -> bool {
        let ours = matches!(event, AsyncEvent::SrqLimitReached { .. });
        if ours {
            self.queue.push(*event);
        }
        ours
    }
}

fn event(ctx: &Context) -> AsyncEvent {
    let t = Instant::now();
    loop {
        if let Some(e) = ctx.poll_async_event() {
            return e;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "no async event");
    }
}

#[test]
fn two_qps_share_one_srq() {
    let port = uroce::testing::free_port();
    let (ca, pa, cqa, ma) = open("127.0.0.1", port);
    let (cb, pb, cqb, mb) = open("127.0.0.2", port);
    let srq = cb.create_srq(&SrqAttr { max_wr: 64, max_sge: 1, srq_limit: 0 }).unwrap();
    let (a1, a2) = (qp(&pa, &cqa, None), qp(&pa, &cqa, None));
    let (b1, b2) = (qp(&pb, &cqb, Some(&srq)), qp(&pb, &cqb, Some(&srq)));
    let (ia, ib): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    for (x, y) in [(&a1, &b1), (&a2, &b2)] {
        uroce::connect(x, ib, port, y.qpn(), 1, 2, ALL).unwrap();
        uroce::connect(y, ia, port, x.qpn(), 2, 1, ALL).unwrap();
    }
    assert!(
        b1.post_recv(&[RecvWr { wr_id: 0, sgl: &[] }]).is_err(),
        "a QP on an SRQ has no own receive queue"
    );
    const N: usize = 40;
    for i in 0..N {
        srq.post_recv(&[RecvWr {
            wr_id: 100 + i as u64,
            sgl: &[mb.sge(i * 65536, 65536).unwrap()],
        }])
        .unwrap();
    }
    // Distinct 20 KiB messages (several packets each) from both QPs at once.
    for i in 0..N {
        let msg: Vec<u8> = (0..20_000u32).map(|k| (k as usize * 3 + i) as u8).collect();
        ma.write(i * 20_000, &msg).unwrap();
    }
    for i in 0..N {
        let q = if i % 2 == 0 { &a1 } else { &a2 };
        let sge = [ma.sge(i * 20_000, 20_000).unwrap()];
        q.post_send(&[SendWr { wr_id: i as u64, sgl: &sge, ..SendWr::default() }]).unwrap();
    }
    let sent = poll_n(&cqa, N);
    assert!(sent.iter().all(|c| c.status == WcStatus::Success));
    let got = poll_n(&cqb, N);
    let mut used = std::collections::HashSet::new();
    for c in &got {
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 20_000));
        assert!(c.qp_num == b1.qpn() || c.qp_num == b2.qpn());
        assert!(used.insert(c.wr_id), "WQE {} used twice", c.wr_id);
        let mut buf = vec![0u8; 20_000];
        mb.read((c.wr_id as usize - 100) * 65536, &mut buf).unwrap();
        // Which message landed: its first byte is 3*0 + i.
        let i = buf[0] as usize;
        let want: Vec<u8> = (0..20_000u32).map(|k| (k as usize * 3 + i) as u8).collect();
        assert_eq!(buf, want, "WQE {} holds a mixed message", c.wr_id);
    }
    assert!(srq.is_empty());
    drop((ca, cb));
}

#[test]
fn srq_limit_rnr_and_last_wqe() {
    let port = uroce::testing::free_port();
    let (_ca, pa, cqa, ma) = open("127.0.0.1", port);
    let (cb, pb, cqb, mb) = open("127.0.0.2", port);
    let srq = cb.create_srq(&SrqAttr { max_wr: 16, max_sge: 1, srq_limit: 0 }).unwrap();
    assert!(srq.arm_limit(17).is_err());
    let a = qp(&pa, &cqa, None);
    let b = qp(&pb, &cqb, Some(&srq));
    let (ia, ib): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&a, ib, port, b.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&b, ia, port, a.qpn(), 2, 1, ALL).unwrap();
    for i in 0..10 {
        srq.post_recv(&[RecvWr { wr_id: i, sgl: &[mb.sge(i as usize * 4096, 4096).unwrap()] }])
            .unwrap();
    }
    srq.arm_limit(5).unwrap();
    assert_eq!(srq.query(), SrqAttr { max_wr: 16, max_sge: 1, srq_limit: 5 });
    let sge = [ma.sge(0, 100).unwrap()];
    let w = SendWr { wr_id: 1, sgl: &sge, ..SendWr::default() };
    a.post_send(&[w, w, w, w, w]).unwrap();
    poll_n(&cqa, 5);
    poll_n(&cqb, 5);
    assert!(cb.poll_async_event().is_none(), "5 left: not below the limit yet");
    // A router (what the drop-in libibverbs installs, one queue per
    // ibv_context) takes the SRQ's events; the others stay with the context.
    let routed = Arc::new(SrqEvents { queue: uroce::AsyncEventQueue::new().unwrap() });
    cb.set_async_event_router(Some(routed.clone()));
    a.post_send(&[w]).unwrap();
    poll_n(&cqa, 1);
    poll_n(&cqb, 1);
    let t = Instant::now();
    while routed.queue.is_empty() {
        assert!(cb.poll_async_event().is_none(), "routed events skip the context's queue");
        assert!(t.elapsed() < Duration::from_secs(5), "no routed event");
    }
    assert_eq!(routed.queue.pop().unwrap(), AsyncEvent::SrqLimitReached { srq: srq.handle() });
    assert!(routed.queue.is_empty());
    cb.set_async_event_router(None);
    assert_eq!(srq.query().srq_limit, 0, "the event disarms the limit");
    // Empty the SRQ, then one more SEND waits on RNR until a WQE arrives.
    a.post_send(&[w, w, w, w, w]).unwrap();
    poll_n(&cqa, 4);
    poll_n(&cqb, 4);
    std::thread::sleep(Duration::from_millis(30));
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 4];
    assert_eq!(cqa.poll(&mut wc).unwrap(), 0, "the fifth waits for a receive");
    assert!(b.stats().send_rnr_err > 0);
    srq.post_recv(&[RecvWr { wr_id: 99, sgl: &[mb.sge(0, 4096).unwrap()] }]).unwrap();
    assert_eq!(poll_n(&cqa, 1)[0].status, WcStatus::Success);
    assert_eq!(poll_n(&cqb, 1)[0].wr_id, 99);
    // A QP on the SRQ that goes to ERR reports its last WQE.
    b.modify(&QpAttr { state: QpState::Error, ..QpAttr::default() }, AttrMask::STATE).unwrap();
    assert_eq!(event(&cb), AsyncEvent::QpLastWqeReached { qpn: b.qpn() });
}

/// A tag matching SRQ through the Rust API, over UDP: EAGER messages of
/// several packets into the tagged buffers they match (header stripped),
/// an unexpected one whole into a plain WQE, and a rendezvous whose 64 KiB
/// the server's QP (no send queue of its own) READs, then answers with a
/// FIN.
#[test]
fn tag_matching_eager_unexpected_and_rendezvous() {
    use uroce::transport::tm::{OpsWr, TmOp, Tmh, TmhOp};
    use uroce::{SendFlags, WcFlags};
    let port = uroce::testing::free_port();
    let (ca, pa, cqa, ma) = open("127.0.0.1", port);
    let (cb, pb, cqb, mb) = open("127.0.0.2", port);
    assert_eq!(cb.query_device().tm_max_num_tags, 255);
    let attr = SrqAttr { max_wr: 16, max_sge: 1, srq_limit: 0 };
    let srq = cb.create_tm_srq(&cqb, &attr, 8).unwrap();
    let a = qp(&pa, &cqa, None);
    let b = pb
        .create_qp(&QpInitAttr {
            send_cq: &cqb,
            recv_cq: &cqb,
            cap: QpCaps {
                max_send_wr: 0,
                max_recv_wr: 0,
                max_send_sge: 0,
                max_recv_sge: 0,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
            srq: Some(&srq),
        })
        .unwrap();
    let (ia, ib): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&a, ib, port, b.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&b, ia, port, a.qpn(), 2, 1, ALL).unwrap();
    srq.post_recv(&[RecvWr { wr_id: 7, sgl: &[mb.sge(3 << 20, 65536).unwrap()] }]).unwrap();
    // Tags 1 and 2 at 0 and 1 MiB.
    let ops: Vec<OpsWr> = (1..=2u64)
        .map(|t| OpsWr {
            wr_id: t,
            op: TmOp::Add {
                recv_wr_id: 100 + t,
                sge: Some(mb.sge(((t - 1) << 20) as usize, 1 << 20).unwrap()),
                tag: t,
                mask: !0,
            },
            signaled: true,
            sync: false,
            unexpected_cnt: 0,
        })
        .collect();
    let mut handles = [None; 2];
    srq.post_ops(&ops, &mut handles).unwrap();
    assert_eq!(handles, [Some(0), Some(1)]);
    assert!(poll_n(&cqb, 2).iter().all(|c| c.opcode == WcOpcode::TmAdd));
    let send = |at: usize, tmh: Tmh, tail: &[u8], len: usize| {
        let mut msg = tmh.encode().to_vec();
        msg.extend_from_slice(tail);
        msg.resize(len, 0);
        for (k, b) in msg.iter_mut().enumerate().skip(16 + tail.len()) {
            *b = (k * 7) as u8;
        }
        ma.write(at, &msg).unwrap();
        let sge = [ma.sge(at, len as u32).unwrap()];
        a.post_send(&[SendWr { sgl: &sge, flags: SendFlags::SIGNALED, ..SendWr::default() }])
            .unwrap();
        assert_eq!(poll_n(&cqa, 1)[0].status, WcStatus::Success);
        msg
    };
    // EAGER to tag 2, 20,016 bytes: the match, then the data.
    let msg = send(0, Tmh { op: TmhOp::Eager as u8, app_ctx: 5, tag: 2 }, &[], 20_016);
    let c = poll_n(&cqb, 2);
    assert_eq!((c[0].opcode, c[0].wr_id, c[0].flags), (WcOpcode::TmRecv, 102, WcFlags::TM_MATCH));
    assert_eq!((c[0].tm_tag, c[0].imm_or_inv), (2, 5));
    assert_eq!((c[1].flags, c[1].byte_len), (WcFlags::TM_DATA_VALID, 20_000));
    let mut got = vec![0u8; 20_000];
    mb.read(1 << 20, &mut got).unwrap();
    assert_eq!(got, msg[16..]);
    // Unexpected (tag 9): whole, into the plain WQE.
    let msg = send(0, Tmh { op: TmhOp::Eager as u8, app_ctx: 0, tag: 9 }, &[], 3000);
    let c = poll_n(&cqb, 1);
    assert_eq!((c[0].opcode, c[0].wr_id, c[0].byte_len), (WcOpcode::TmRecv, 7, 3000));
    assert_eq!(c[0].flags, WcFlags::NONE);
    let mut got = vec![0u8; 3000];
    mb.read(3 << 20, &mut got).unwrap();
    assert_eq!(got, msg);
    // Rendezvous to tag 1: 64 KiB at the client's 2 MiB, READ by the
    // server; the FIN lands in the client's receive.
    let data: Vec<u8> = (0..65536u32).map(|k| (k % 251) as u8).collect();
    ma.write(2 << 20, &data).unwrap();
    a.post_recv(&[RecvWr { wr_id: 55, sgl: &[ma.sge(3 << 20, 64).unwrap()] }]).unwrap();
    let mut rvh = (ma.addr() + (2 << 20) as u64).to_be_bytes().to_vec();
    rvh.extend_from_slice(&ma.rkey().to_be_bytes());
    rvh.extend_from_slice(&65536u32.to_be_bytes());
    send(4096, Tmh { op: TmhOp::Rndv as u8, app_ctx: 8, tag: 1 }, &rvh, 48);
    let c = poll_n(&cqb, 2);
    assert_eq!((c[0].wr_id, c[0].flags, c[0].tm_tag), (101, WcFlags::TM_MATCH, 1));
    assert_eq!((c[1].wr_id, c[1].flags, c[1].byte_len), (101, WcFlags::TM_DATA_VALID, 65536));
    let mut got = vec![0u8; 65536];
    mb.read(0, &mut got).unwrap();
    assert_eq!(got, data);
    let fin = poll_n(&cqa, 1);
    assert_eq!((fin[0].opcode, fin[0].wr_id, fin[0].byte_len), (WcOpcode::Recv, 55, 16));
    let mut h = [0u8; 16];
    ma.read(3 << 20, &mut h).unwrap();
    assert_eq!(Tmh::parse(&h), Some(Tmh { op: TmhOp::Fin as u8, app_ctx: 8, tag: 1 }));
    drop((ca, cb));
}
