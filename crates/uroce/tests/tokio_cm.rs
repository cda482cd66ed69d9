//! The CM's listener and connect calls as futures (feature `tokio`): two
//! clients connect to one listener concurrently on one runtime, each
//! SENDs over its connection, and a refused port comes back as an error.
#![cfg(feature = "tokio")]

use std::future::Future;
use std::net::IpAddr;
use std::task::Poll;
use std::time::Duration;

use uroce::{Access, Error, QpCaps, RecvWr, SendWr, WcOpcode};

const CAP: QpCaps =
    QpCaps { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };

/// Both futures to completion, polled together (`tokio::join!` without
/// the macros feature).
async fn join2<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none()
            && let Poll::Ready(v) = a.as_mut().poll(cx)
        {
            ra = Some(v);
        }
        if rb.is_none()
            && let Poll::Ready(v) = b.as_mut().poll(cx)
        {
            rb = Some(v);
        }
        match (ra.take(), rb.take()) {
            (Some(x), Some(y)) => Poll::Ready((x, y)),
            (x, y) => {
                (ra, rb) = (x, y);
                Poll::Pending
            }
        }
    })
    .await
}

/// A current-thread runtime; a hang fails the test instead of the suite.
fn runtime() -> tokio::runtime::Runtime {
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        eprintln!("tokio_cm: no progress in 60 s");
        std::process::exit(1);
    });
    tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap()
}

#[test]
fn listen_and_connect_are_awaited() {
    let port = uroce::testing::free_port();
    let rt = runtime();
    rt.block_on(async {
        let server = uroce::testing::open("127.0.0.2", port);
        let client = uroce::testing::open("127.0.0.1", port);
        let mut listener = server.cm_listen_async(7490).unwrap();
        let (ps, pc) = (server.alloc_pd().unwrap(), client.alloc_pd().unwrap());
        let (cq_s, cq_c) = (server.create_cq(64).unwrap(), client.create_cq(64).unwrap());
        let peer: IpAddr = "127.0.0.2".parse().unwrap();
        let qcs: Vec<_> = (0..2).map(|_| uroce::testing::rc_qp(&pc, &cq_c, CAP, false)).collect();
        let qss: Vec<_> = (0..2).map(|_| uroce::testing::rc_qp(&ps, &cq_s, CAP, false)).collect();
        // Both requests go out before either is accepted.
        let connects = async {
            let a = client.cm_connect_async(&qcs[0], peer, 7490, b"one");
            let b = client.cm_connect_async(&qcs[1], peer, 7490, b"two");
            join2(a, b).await
        };
        let accepts = async {
            let a = listener.accept(&qss[0], b"first").await.unwrap();
            let b = listener.accept(&qss[1], b"second").await.unwrap();
            (a, b)
        };
        let ((ca, cb), (sa, sb)) = join2(connects, accepts).await;
        let (ca, cb) = (ca.unwrap(), cb.unwrap());
        // Each client got the reply of the server QP it was paired with.
        let mut pairs = vec![
            (ca.remote_qpn(), ca.private_data()[..5].to_vec()),
            (cb.remote_qpn(), cb.private_data()[..5].to_vec()),
        ];
        pairs.sort();
        let mut want = vec![(qss[0].qpn(), b"first".to_vec()), (qss[1].qpn(), b"secon".to_vec())];
        want.sort();
        assert_eq!(pairs, want);
        assert_eq!(sa.peer(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert!([&sa, &sb].iter().any(|c| c.private_data().starts_with(b"one")));

        // A SEND over each connection.
        let mr_s = ps.alloc_mr(64, Access(1)).unwrap();
        let mr_c = pc.alloc_mr(64, Access(1)).unwrap();
        for q in &qss {
            q.post_recv(&[RecvWr { wr_id: 1, sgl: &[mr_s.sge(0, 64).unwrap()] }]).unwrap();
        }
        for q in &qcs {
            let sge = [mr_c.sge(0, 8).unwrap()];
            q.post_send(&[SendWr { wr_id: 2, sgl: &sge, ..SendWr::default() }]).unwrap();
        }
        let mut got = 0;
        let mut wc =
            [uroce::Completion::new(0, uroce::WcStatus::Success, WcOpcode::Send, 0, false)];
        let start = std::time::Instant::now();
        while got < 2 {
            if cq_s.poll(&mut wc).unwrap() == 1 {
                assert_eq!(
                    (wc[0].status, wc[0].opcode),
                    (uroce::WcStatus::Success, WcOpcode::Recv)
                );
                got += 1;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no receive");
            tokio::task::yield_now().await;
        }

        // A port nobody listens on.
        let q = uroce::testing::rc_qp(&pc, &cq_c, CAP, false);
        match client.cm_connect_async(&q, peer, 7491, &[]).await {
            Err(Error::Rejected { reason: 8, .. }) => {}
            other => panic!("{other:?}"),
        }
    });
}

/// CM ids on awaited event channels: a server and a client on one
/// current-thread runtime, each step's event awaited, a connection set
/// up and taken down.
#[test]
fn cm_id_events_are_awaited() {
    use uroce::cm::{AsyncEventChannel, ConnParam, EventChannel, EventType, PortSpace};
    let port = uroce::testing::free_port();
    let rt = runtime();
    rt.block_on(async {
        let server = uroce::testing::open("127.0.0.2", port);
        let client = uroce::testing::open("127.0.0.1", port);
        let on = |c: &uroce::Context| {
            AsyncEventChannel::new(EventChannel::with_contexts(std::slice::from_ref(c)).unwrap())
                .unwrap()
        };
        let (sch, cch) = (on(&server), on(&client));
        let listener = sch.channel().create_id(PortSpace::Tcp);
        listener.bind_addr("127.0.0.2:7492".parse().unwrap()).unwrap();
        listener.listen().unwrap();
        let (ps, pc) = (server.alloc_pd().unwrap(), client.alloc_pd().unwrap());
        let (cq_s, cq_c) = (server.create_cq(8).unwrap(), client.create_cq(8).unwrap());
        let attr = |cq| uroce::QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            cap: CAP,
            qp_type: uroce::QpType::Rc,
            sq_sig_all: true,
            srq: None,
        };
        let serve = async {
            let e = sch.get_event().await.unwrap();
            assert_eq!(e.event, EventType::ConnectRequest);
            e.id.create_qp(&ps, &attr(&cq_s)).unwrap();
            e.id.accept(&ConnParam::default(), b"hi").unwrap();
            assert_eq!(sch.get_event().await.unwrap().event, EventType::Established);
            assert_eq!(sch.get_event().await.unwrap().event, EventType::Disconnected);
        };
        let connect = async {
            let id = cch.channel().create_id(PortSpace::Tcp);
            id.resolve_addr(None, "127.0.0.2:7492".parse().unwrap()).unwrap();
            assert_eq!(cch.get_event().await.unwrap().event, EventType::AddrResolved);
            id.resolve_route().unwrap();
            assert_eq!(cch.get_event().await.unwrap().event, EventType::RouteResolved);
            id.create_qp(&pc, &attr(&cq_c)).unwrap();
            id.connect(&ConnParam::default(), &[]).unwrap();
            let e = cch.get_event().await.unwrap();
            assert_eq!((e.event, &e.private_data[..2]), (EventType::Established, &b"hi"[..]));
            id.disconnect().unwrap();
            assert_eq!(cch.get_event().await.unwrap().event, EventType::Disconnected);
        };
        join2(serve, connect).await;
    });
}
