//! The shortest program that moves data: two devices on two loopback
//! addresses, an RC connection, one RDMA WRITE.
//! Run: `cargo run --release -p uroce --example hello_write`.

use uroce::{Access, Completion, Device, DeviceConfig, QpCaps, QpInitAttr, QpType, SendWr};
use uroce::{WcOpcode, WcStatus, WrOpcode};

fn main() -> uroce::Result<()> {
    let port = 18515;
    let open = |addr: &str| {
        let addr = addr.parse().unwrap();
        Device::from_config(DeviceConfig { name: "uroce0".into(), addr, port }).open()
    };
    let (a, b) = (open("127.0.0.1")?, open("127.0.0.2")?);
    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (src, dst) = (pa.alloc_mr(4096, rights)?, pb.alloc_mr(4096, rights)?);
    src.write(0, b"hello, RDMA")?;

    let (cqa, cqb) = (a.create_cq(16)?, b.create_cq(16)?);
    let cap = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let rc = |pd: &uroce::Pd, cq| {
        pd.create_qp(&QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            cap,
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: None,
        })
    };
    let (qa, qb) = (rc(&pa, &cqa)?, rc(&pb, &cqb)?);
    // QP numbers and first PSNs go to the peer out of band (here: by hand).
    uroce::connect(&qa, "127.0.0.2".parse().unwrap(), port, qb.qpn(), 100, 200, rights)?;
    uroce::connect(&qb, "127.0.0.1".parse().unwrap(), port, qa.qpn(), 200, 100, rights)?;

    // The WRITE lands in B's region; B's application is not involved.
    let sge = [src.sge(0, 11)?];
    let write = SendWr {
        wr_id: 1,
        opcode: WrOpcode::RdmaWrite,
        sgl: &sge,
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
        ..SendWr::default()
    };
    qa.post_send(&[write])?;
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false)];
    while cqa.poll(&mut wc)? == 0 {}
    assert_eq!(wc[0].status, WcStatus::Success);

    let mut got = [0u8; 11];
    dst.read(0, &mut got)?;
    assert_eq!(&got, b"hello, RDMA");
    println!("B's memory now says {:?}", std::str::from_utf8(&got).unwrap());
    Ok(())
}
