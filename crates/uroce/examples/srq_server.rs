//! A server of many clients with one shared receive queue: every client
//! has an RC connection of its own, but all their SENDs land in one pool
//! of receive buffers, so the server posts buffers for the traffic it
//! expects, not per client. Each completion names the QP (the client) it
//! came through. Run: `cargo run --release -p uroce --example srq_server`.

mod common;

use uroce::{Access, QpCaps, QpInitAttr, QpType, RecvWr, SendWr, SrqAttr, WcOpcode};

const CLIENTS: usize = 4;
const MSGS: usize = 8;

fn main() {
    let server = common::open("127.0.0.2");
    let pd = server.alloc_pd().unwrap();
    let cq = server.create_cq(64).unwrap();
    let srq = server.create_srq(&SrqAttr { max_wr: 64, max_sge: 1, srq_limit: 0 }).unwrap();
    let pool = pd.alloc_mr(CLIENTS * MSGS * 256, Access::LOCAL_WRITE).unwrap();
    for i in 0..CLIENTS * MSGS {
        let sge = [pool.sge(256 * i, 256).unwrap()];
        srq.post_recv(&[RecvWr { wr_id: i as u64, sgl: &sge }]).unwrap();
    }
    let cap = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: 64,
    };
    let port = common::port();
    // Clients on 127.0.0.3.. (any loopback address is a host of its own).
    let clients: Vec<_> = (0..CLIENTS)
        .map(|k| {
            let ctx = common::open(&format!("127.0.0.{}", 3 + k));
            let cpd = ctx.alloc_pd().unwrap();
            let ccq = ctx.create_cq(16).unwrap();
            let cqp = common::qp(&cpd, &ccq, QpType::Rc, 16);
            let attr = QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap,
                qp_type: QpType::Rc,
                sq_sig_all: true,
                srq: Some(&srq),
            };
            let sqp = pd.create_qp(&attr).unwrap();
            let rw = Access::LOCAL_WRITE;
            uroce::connect(&cqp, "127.0.0.2".parse().unwrap(), port, sqp.qpn(), 1, 2, rw).unwrap();
            uroce::connect(
                &sqp,
                format!("127.0.0.{}", 3 + k).parse().unwrap(),
                port,
                cqp.qpn(),
                2,
                1,
                rw,
            )
            .unwrap();
            (ctx, ccq, cqp, sqp)
        })
        .collect();
    // Every client sends its messages (inline: no registered buffer).
    for (k, (_, ccq, cqp, _)) in clients.iter().enumerate() {
        for m in 0..MSGS {
            let text = format!("client {k} message {m}");
            let wr = SendWr {
                wr_id: m as u64,
                flags: uroce::SendFlags::INLINE,
                inline_data: Some(text.as_bytes()),
                ..SendWr::default()
            };
            cqp.post_send(&[wr]).unwrap();
            common::wait(ccq, 1);
        }
    }
    // The server reads them all from the one SRQ; its CQ says which QP.
    let mut per_client = [0usize; CLIENTS];
    for c in common::wait(&cq, CLIENTS * MSGS) {
        assert_eq!(c.opcode, WcOpcode::Recv);
        let k = clients.iter().position(|cl| cl.3.qpn() == c.qp_num).expect("one of ours");
        let mut text = vec![0u8; c.byte_len as usize];
        pool.read(256 * c.wr_id as usize, &mut text).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            format!("client {k} message {}", per_client[k])
        );
        per_client[k] += 1;
    }
    assert_eq!(per_client, [MSGS; CLIENTS]);
    println!("{} messages from {CLIENTS} clients through one SRQ, each in order", CLIENTS * MSGS);
}
