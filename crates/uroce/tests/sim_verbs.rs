//! The verbs API over the in-process `sim` backend: a lossy, reordering,
//! corrupting network between two contexts; every operation still
//! completes with the right bytes, and the run can be captured as pcap.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use uroce::{
    Access, Completion, LinkConfig, QpCaps, QpInitAttr, QpType, RecvWr, SendWr, SimNetwork,
    WcOpcode, WcStatus, WrOpcode,
};

const ALL: Access = Access(1 | 2 | 4 | 8);

#[test]
fn rc_over_a_faulty_simulated_network() {
    let link = LinkConfig {
        loss: 0.05,
        duplicate: 0.02,
        reorder: 0.05,
        corrupt: 0.01,
        delay: Duration::from_micros(20),
        ..LinkConfig::default()
    };
    let net = SimNetwork::new(42, link);
    net.capture();
    let (ia, ib): (IpAddr, IpAddr) = ("10.1.0.1".parse().unwrap(), "10.1.0.2".parse().unwrap());
    let a = net.device("sa", ia, 4791).open().unwrap();
    let b = net.device("sb", ib, 4791).open().unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ma, mb) = (pa.alloc_mr(1 << 20, ALL).unwrap(), pb.alloc_mr(1 << 20, ALL).unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let cap = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qa = uroce::testing::rc_qp(&pa, &ca, cap, true);
    let qb = uroce::testing::rc_qp(&pb, &cb, cap, true);
    uroce::connect(&qa, ib, 4791, qb.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&qb, ia, 4791, qa.qpn(), 2, 1, ALL).unwrap();

    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13) as u8).collect();
    ma.write(0, &data).unwrap();
    qb.post_recv(&[RecvWr { wr_id: 1, sgl: &[mb.sge(600_000, 300_000).unwrap()] }]).unwrap();
    let sge = [ma.sge(0, 300_000).unwrap()];
    let rd = [ma.sge(400_000, 300_000).unwrap()];
    qa.post_send(&[
        SendWr {
            wr_id: 10,
            opcode: WrOpcode::RdmaWrite,
            sgl: &sge,
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
            ..SendWr::default()
        },
        SendWr {
            wr_id: 11,
            opcode: WrOpcode::RdmaRead,
            sgl: &rd,
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
            ..SendWr::default()
        },
        SendWr { wr_id: 12, opcode: WrOpcode::Send, sgl: &sge, ..SendWr::default() },
    ])
    .unwrap();
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 8];
    let (mut done_a, mut done_b) = (vec![], vec![]);
    let t = Instant::now();
    while done_a.len() < 3 || done_b.is_empty() {
        let n = ca.poll(&mut wc).unwrap();
        done_a.extend_from_slice(&wc[..n]);
        let n = cb.poll(&mut wc).unwrap();
        done_b.extend_from_slice(&wc[..n]);
        assert!(t.elapsed() < Duration::from_secs(30), "stalled: {done_a:?} {done_b:?}");
    }
    let ids: Vec<_> = done_a.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(ids, [(10, WcStatus::Success), (11, WcStatus::Success), (12, WcStatus::Success)]);
    assert_eq!((done_b[0].wr_id, done_b[0].byte_len), (1, 300_000));
    let mut got = vec![0u8; 300_000];
    mb.read(0, &mut got).unwrap();
    assert_eq!(got, data, "WRITE");
    ma.read(400_000, &mut got).unwrap();
    assert_eq!(got, data, "READ");
    mb.read(600_000, &mut got).unwrap();
    assert_eq!(got, data, "SEND");
    let st = net.stats();
    assert!(st.lost > 0 && st.corrupted > 0, "the network must have misbehaved: {st:?}");
    assert!(a.stats().retransmits > 0);
    // The capture is a valid pcap of RoCEv2 over raw IP, each QP's
    // packets from rxe's source port for the pair (which the ICRC covers).
    let pcap = net.take_pcap().unwrap();
    let sport = |from: &uroce::Qp, to: &uroce::Qp| {
        uroce::wire::udp::rxe_connected_sport(0, from.qpn(), to.qpn())
    };
    // rxe's flow label of a QP pair is symmetric: both ends use one port.
    let (port_a, port_b) = (sport(&qa, &qb), sport(&qb, &qa));
    assert!(port_a >= 0xc000 && port_a == port_b);
    let mut roce = 0;
    for r in uroce_pcap_reader(&pcap) {
        let Ok(d) = uroce::wire::UdpDatagram::parse(&r) else { continue };
        if d.verify_icrc().is_ok() {
            roce += 1;
            let want = if d.ip.src() == ia { port_a } else { port_b };
            assert_eq!(d.udp.src_port(), want, "from {}", d.ip.src());
        }
    }
    assert!(roce > 300);
}

fn uroce_pcap_reader(data: &[u8]) -> Vec<Vec<u8>> {
    // Classic pcap, raw IP: 24-byte header, then 16-byte record headers.
    let mut out = vec![];
    let mut at = 24;
    while at + 16 <= data.len() {
        let len = u32::from_le_bytes(data[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push(data[at + 16..at + 16 + len].to_vec());
        at += 16 + len;
    }
    out
}

/// `IBV_SEND_INLINE` with a gather list: the bytes are copied when the WR
/// is posted (the buffer may change at once), the inline limit counts the
/// whole list, and an L_Key that names no region is refused at post time.
#[test]
fn inline_sends_gather_their_bytes_at_post_time() {
    let net = SimNetwork::new(7, LinkConfig::default());
    let (ia, ib): (IpAddr, IpAddr) = ("10.2.0.1".parse().unwrap(), "10.2.0.2".parse().unwrap());
    let a = net.device("ia", ia, 4791).open().unwrap();
    let b = net.device("ib", ib, 4791).open().unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ma, mb) = (pa.alloc_mr(4096, ALL).unwrap(), pb.alloc_mr(4096, ALL).unwrap());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let cap = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 2,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let init = |cq| QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap,
        qp_type: QpType::Rc,
        sq_sig_all: true,
        srq: None,
    };
    let qa = pa.create_qp(&init(&ca)).unwrap();
    let qb = pb.create_qp(&init(&cb)).unwrap();
    uroce::connect(&qa, ib, 4791, qb.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&qb, ia, 4791, qa.qpn(), 2, 1, ALL).unwrap();
    qb.post_recv(&[RecvWr { wr_id: 1, sgl: &[mb.sge(0, 128).unwrap()] }]).unwrap();

    ma.write(0, b"hello, ").unwrap();
    ma.write(100, b"inline").unwrap();
    let sgl = [ma.sge(0, 7).unwrap(), ma.sge(100, 6).unwrap()];
    let inline = uroce::SendFlags::INLINE | uroce::SendFlags::SIGNALED;
    qa.post_send(&[SendWr { wr_id: 9, flags: inline, sgl: &sgl, ..SendWr::default() }]).unwrap();
    // Overwritten before anything was transmitted: the WR already holds
    // its copy.
    ma.write(0, b"XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX").unwrap();
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false)];
    let deadline = Instant::now() + Duration::from_secs(10);
    while cb.poll(&mut wc).unwrap() == 0 {
        assert!(Instant::now() < deadline, "no receive");
    }
    assert_eq!((wc[0].status, wc[0].byte_len), (WcStatus::Success, 13));
    let mut got = [0u8; 13];
    mb.read(0, &mut got).unwrap();
    assert_eq!(&got, b"hello, inline");

    let long = [ma.sge(0, 60).unwrap(), ma.sge(100, 5).unwrap()];
    let e = qa.post_send(&[SendWr { flags: inline, sgl: &long, ..SendWr::default() }]).unwrap_err();
    assert!(
        matches!(e, uroce::Error::Post { error: uroce::transport::PostError::InlineTooLong, .. }),
        "{e}"
    );
    let mut bad = ma.sge(0, 8).unwrap();
    bad.lkey ^= 0x100;
    let e =
        qa.post_send(&[SendWr { flags: inline, sgl: &[bad], ..SendWr::default() }]).unwrap_err();
    assert!(
        matches!(
            e,
            uroce::Error::Post { error: uroce::transport::PostError::BadInlineAddress, .. }
        ),
        "{e}"
    );
    assert_eq!(e.errno(), 14);
}
