//! Unreliable datagrams: one UD QP sends to another through an address
//! handle (the peer's address, QP number and Q_Key), no connection.
//! Each receive buffer starts with 40 bytes the device fills with the
//! packet's global route header; the payload follows. A datagram with no
//! receive posted is dropped, as UDP drops one with a full socket buffer.
//! Run: `cargo run --release -p uroce --example ud_datagrams`.

mod common;

use uroce::{Access, AhAttr, QpType, RecvWr, SendWr, WcOpcode};

const QKEY: u32 = 0x1111_2222;
const GRH: usize = 40;

fn main() {
    let (a, b) = (common::open("127.0.0.1"), common::open("127.0.0.2"));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(32).unwrap(), b.create_cq(32).unwrap());
    let (qa, qb) = (common::qp(&pa, &ca, QpType::Ud, 16), common::qp(&pb, &cb, QpType::Ud, 16));
    // A UD QP is ready to send and receive once it has a Q_Key.
    uroce::activate_ud(&qa, QKEY, 1).unwrap();
    uroce::activate_ud(&qb, QKEY, 2).unwrap();

    let (ma, mb) = (
        pa.alloc_mr(8192, Access::LOCAL_WRITE).unwrap(),
        pb.alloc_mr(8192, Access::LOCAL_WRITE).unwrap(),
    );
    for i in 0..4 {
        let sge = [mb.sge(2048 * i, (GRH + 1024) as u32).unwrap()];
        qb.post_recv(&[RecvWr { wr_id: i as u64, sgl: &sge }]).unwrap();
    }
    // The address handle: where datagrams go (B's address and port).
    let ah = pa
        .create_ah(&AhAttr { port: common::port(), ..AhAttr::new("127.0.0.2".parse().unwrap()) })
        .unwrap();
    let msgs: Vec<String> =
        (0..4).map(|i| format!("datagram {i} for QP {:#x}", qb.qpn())).collect();
    for (i, m) in msgs.iter().enumerate() {
        ma.write(256 * i, m.as_bytes()).unwrap();
    }
    let sges: Vec<[uroce::Sge; 1]> =
        msgs.iter().enumerate().map(|(i, m)| [ma.sge(256 * i, m.len() as u32).unwrap()]).collect();
    let wrs: Vec<SendWr> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| SendWr {
            wr_id: i as u64,
            sgl: s,
            ud: Some(ah.dest(qb.qpn(), QKEY)),
            ..SendWr::default()
        })
        .collect();
    qa.post_send(&wrs).unwrap();
    common::wait(&ca, 4);
    // Loopback loses nothing, so all four arrive, in order; each receive
    // names the sender's QP and holds its payload after the GRH.
    for (k, c) in common::wait(&cb, 4).iter().enumerate() {
        assert_eq!((c.opcode, c.wr_id, c.src_qp), (WcOpcode::Recv, k as u64, qa.qpn()));
        let len = c.byte_len as usize - GRH;
        let mut got = vec![0u8; len];
        mb.read(2048 * k + GRH, &mut got).unwrap();
        assert_eq!(got, msgs[k].as_bytes());
        println!("received {:?} from QP {:#x}", String::from_utf8(got).unwrap(), c.src_qp);
    }
}
