//! `cq.next().await` on a tokio runtime (feature `tokio`).
#![cfg(feature = "tokio")]

use std::net::IpAddr;

use uroce::{Access, AsyncCq, QpCaps, RecvWr, SendFlags, SendWr, WcOpcode};

const ALL: Access = Access(1 | 2 | 4 | 8);

#[test]
fn completions_are_awaited() {
    let port = uroce::testing::free_port();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    rt.block_on(async {
        let open = |a: &str| uroce::testing::open(a, port);
        let (a, b) = (open("127.0.0.1"), open("127.0.0.2"));
        let ch = b.create_comp_channel().unwrap();
        let cq_b = b.create_cq_with(64, Some(&ch)).unwrap();
        let cq_a = a.create_cq(64).unwrap();
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let mb = pb.alloc_mr(4096, ALL).unwrap();
        let cap = QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let qa = uroce::testing::rc_qp(&pa, &cq_a, cap, false);
        let qb = uroce::testing::rc_qp(&pb, &cq_b, cap, false);
        let (ia, ib): (IpAddr, IpAddr) =
            ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        uroce::connect(&qa, ib, port, qb.qpn(), 1, 2, ALL).unwrap();
        uroce::connect(&qb, ia, port, qa.qpn(), 2, 1, ALL).unwrap();
        for i in 0..10 {
            qb.post_recv(&[RecvWr { wr_id: i, sgl: &[mb.sge(0, 64).unwrap()] }]).unwrap();
        }
        let mut acq = AsyncCq::new(cq_b, ch).unwrap();
        let sender = std::thread::spawn(move || {
            for i in 0..10u64 {
                std::thread::sleep(std::time::Duration::from_millis(5));
                qa.post_send(&[SendWr {
                    wr_id: i,
                    flags: SendFlags::INLINE,
                    inline_data: Some(b"async"),
                    ..SendWr::default()
                }])
                .unwrap();
            }
            qa
        });
        for i in 0..10 {
            let c = acq.next().await.unwrap();
            assert_eq!((c.wr_id, c.opcode, c.byte_len), (i, WcOpcode::Recv, 5));
        }
        sender.join().unwrap();
    });
}
