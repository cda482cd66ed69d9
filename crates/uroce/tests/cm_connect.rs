//! Connecting through the CM on QP1 over the UDP backend: a listener and a
//! connecting side in two contexts (127.0.0.2 and 127.0.0.1), private data
//! both ways, a SEND over the connected QPs, a disconnect; and the errors
//! of a port nobody listens on and of a peer that never answers.

use std::net::IpAddr;
use std::time::Duration;

use uroce::{
    Access, Completion, Context, Cq, Device, DeviceConfig, Error, QpCaps, QpInitAttr, QpType,
    RecvWr, SendWr, WcOpcode, WcStatus,
};

fn open(addr: &str, port: u16) -> Context {
    Device::from_config(DeviceConfig { name: "cm".into(), addr: addr.parse().unwrap(), port })
        .open()
        .unwrap()
}

fn rc_qp(pd: &uroce::Pd, cq: &Cq) -> uroce::Qp {
    pd.create_qp(&QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap: QpCaps {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: true,
        srq: None,
    })
    .unwrap()
}

fn poll_one(cq: &Cq) -> Completion {
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false)];
    let start = std::time::Instant::now();
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no completion");
    }
}

const T: Duration = Duration::from_secs(10);

#[test]
fn listen_connect_send_disconnect() {
    let port = uroce::testing::free_port();
    let server = open("127.0.0.2", port);
    let client = open("127.0.0.1", port);
    let listener = server.cm_listen(7471).unwrap();
    assert!(matches!(server.cm_listen(7471), Err(Error::InUse(_))), "one listener per port");

    let srv = std::thread::spawn(move || {
        let pd = server.alloc_pd().unwrap();
        let cq = server.create_cq(16).unwrap();
        let qp = rc_qp(&pd, &cq);
        let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        let conn = listener.accept(&qp, b"welcome", T).unwrap();
        assert_eq!(conn.peer(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(&conn.private_data()[..5], b"hello");
        qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[mr.sge(0, 4096).unwrap()] }]).unwrap();
        let wc = poll_one(&cq);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 11));
        let mut got = [0u8; 11];
        mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"over the CM");
        assert!(conn.wait_disconnect(T).unwrap(), "the client disconnects");
    });

    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(16).unwrap();
    let qp = rc_qp(&pd, &cq);
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let conn = client.cm_connect(&qp, "127.0.0.2".parse().unwrap(), 7471, b"hello", T).unwrap();
    assert_eq!(&conn.private_data()[..7], b"welcome");
    mr.write(0, b"over the CM").unwrap();
    // The server's receive may not be posted yet: RNR retries cover it.
    qp.post_send(&[SendWr { wr_id: 9, sgl: &[mr.sge(0, 11).unwrap()], ..SendWr::default() }])
        .unwrap();
    let wc = poll_one(&cq);
    assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, 9));
    conn.disconnect(T).unwrap();
    srv.join().unwrap();
}

#[test]
fn nobody_listening_is_refused_and_silence_times_out() {
    let port = uroce::testing::free_port();
    let server = open("127.0.0.2", port);
    let client = open("127.0.0.1", port);
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(16).unwrap();
    let qp = rc_qp(&pd, &cq);
    // The server's context runs its CM only once used.
    let _l = server.cm_listen(1).unwrap();
    match client.cm_connect(&qp, "127.0.0.2".parse().unwrap(), 2, &[], T) {
        Err(e @ Error::Rejected { reason: 8, .. }) => assert_eq!(e.errno(), libc::ECONNREFUSED),
        other => panic!("{other:?}"),
    }
    drop(server);
    let qp2 = rc_qp(&pd, &cq);
    match client.cm_connect(&qp2, "127.0.0.2".parse().unwrap(), 1, &[], Duration::from_millis(300))
    {
        Err(e @ Error::TimedOut(_)) => assert_eq!(e.errno(), libc::ETIMEDOUT),
        other => panic!("{other:?}"),
    }
    assert!(client.cm_connect(&qp2, "127.0.0.2".parse().unwrap(), 1, &[0; 57], T).is_err());
}

#[test]
fn dropping_a_connection_disconnects_it_again_and_again() {
    let port = uroce::testing::free_port();
    let server = open("127.0.0.2", port);
    let client = open("127.0.0.1", port);
    let listener = server.cm_listen(9000).unwrap();
    const ROUNDS: usize = 20;
    let srv = std::thread::spawn(move || {
        let pd = server.alloc_pd().unwrap();
        let cq = server.create_cq(16).unwrap();
        for _ in 0..ROUNDS {
            let qp = rc_qp(&pd, &cq);
            let conn = listener.accept(&qp, &[], T).unwrap();
            // The client drops its side: that is a DREQ here.
            assert!(conn.wait_disconnect(T).unwrap());
        }
    });
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(16).unwrap();
    for _ in 0..ROUNDS {
        let qp = rc_qp(&pd, &cq);
        let conn = client.cm_connect(&qp, "127.0.0.2".parse().unwrap(), 9000, &[], T).unwrap();
        drop(conn);
    }
    srv.join().unwrap();
}

/// The event-channel layer librdmacm stands on: requests and replies
/// routed to each side's channel (its descriptor readable while events
/// wait), the QP moves left to the caller; a requester that goes away
/// before the reply refuses it, so the acceptor is not left waiting.
#[test]
fn channels_carry_each_connections_events() {
    use uroce::cm::{AgentEvent, CmChannel, CmChannelEvent, Offer, RequestArgs};
    use uroce::wire::cm::{CmPath, port_space, rdma_cm_service_id};

    let port = uroce::testing::free_port();
    let server = open("127.0.0.2", port);
    let client = open("127.0.0.1", port);
    let (sch, cch) = (CmChannel::new().unwrap(), CmChannel::new().unwrap());
    let sid = rdma_cm_service_id(port_space::TCP, 7480);
    server.cm_listen_on(sid, &sch).unwrap();
    let peer: IpAddr = "127.0.0.2".parse().unwrap();
    let args = |qpn| RequestArgs {
        peer,
        service_id: sid,
        qp: Offer {
            qpn,
            starting_psn: 1,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            srq: false,
            ece: uroce::cm::Ece::default(),
        },
        transport_service_type: 0,
        retry_count: 7,
        path_mtu: 5,
        path: CmPath::default(),
        response_timeout: 16,
        max_cm_retries: 3,
        private_data: [7; 92],
    };
    let get = |ch: &CmChannel| match ch.get_timeout(T).unwrap() {
        Some(CmChannelEvent::Cm { event, .. }) => event,
        other => panic!("{other:?}"),
    };

    // A full exchange: REQ, REP (accept), RTU (establish).
    let cid = client.cm_request(&args(0x51), &cch);
    let AgentEvent::ConnectRequest { id: sid1, req, .. } = get(&sch) else { panic!() };
    assert_eq!((req.local_qpn, req.private_data[0]), (0x51, 7));
    let offer = Offer { qpn: 0x61, ..args(0).qp };
    server.cm_accept(sid1, &offer, b"hi").unwrap();
    let AgentEvent::ConnectReply { id, rep, .. } = get(&cch) else { panic!() };
    assert_eq!((id, rep.local_qpn, &rep.private_data[..2]), (cid, 0x61, &b"hi"[..]));
    client.cm_establish(cid).unwrap();
    assert!(matches!(get(&sch), AgentEvent::Established { id } if id == sid1));
    assert_eq!(cch.pending(), 0, "the active side gets no Established");
    // Disconnect: DREQ one way, DREP back, an event on each side.
    client.cm_disconnect(cid).unwrap();
    assert!(matches!(get(&sch), AgentEvent::DisconnectRequest { id } if id == sid1));
    assert!(matches!(get(&cch), AgentEvent::Disconnected { id } if id == cid));

    // A requester gone before the reply: its CM refuses the REP.
    let cid2 = client.cm_request(&args(0x52), &cch);
    let AgentEvent::ConnectRequest { id: sid2, .. } = get(&sch) else { panic!() };
    client.cm_route(cid2, None);
    server.cm_accept(sid2, &offer, &[]).unwrap();
    assert!(matches!(get(&sch), AgentEvent::Rejected { id, .. } if id == sid2));
    assert_eq!(cch.pending(), 0, "nothing for a forgotten connection");
    server.cm_unlisten(sid);
}

/// A QP the application moved to INIT and gave a receive before the
/// connection (as librdmacm's `rdma_create_qp` and perftest do) connects,
/// and the receive takes the peer's first SEND.
#[test]
fn a_qp_in_init_with_a_receive_posted_connects() {
    let port = uroce::testing::free_port();
    let server = open("127.0.0.2", port);
    let client = open("127.0.0.1", port);
    let listener = server.cm_listen(7479).unwrap();
    let srv = std::thread::spawn(move || {
        let pd = server.alloc_pd().unwrap();
        let cq = server.create_cq(16).unwrap();
        let qp = rc_qp(&pd, &cq);
        let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        let attr = uroce::QpAttr {
            state: uroce::QpState::Init,
            access: Access::LOCAL_WRITE,
            port: 1,
            ..Default::default()
        };
        let mask = uroce::AttrMask::STATE
            | uroce::AttrMask::PKEY_INDEX
            | uroce::AttrMask::PORT
            | uroce::AttrMask::ACCESS_FLAGS;
        qp.modify(&attr, mask).unwrap();
        qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[mr.sge(0, 4096).unwrap()] }]).unwrap();
        let _conn = listener.accept(&qp, b"welcome", T).unwrap();
        let wc = poll_one(&cq);
        assert_eq!((wc.status, wc.wr_id, wc.byte_len), (WcStatus::Success, 1, 11));
    });
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(16).unwrap();
    let qp = rc_qp(&pd, &cq);
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let _conn = client.cm_connect(&qp, "127.0.0.2".parse().unwrap(), 7479, b"hello", T).unwrap();
    mr.write(0, b"over the CM").unwrap();
    qp.post_send(&[SendWr { wr_id: 2, sgl: &[mr.sge(0, 11).unwrap()], ..SendWr::default() }])
        .unwrap();
    assert_eq!(poll_one(&cq).status, WcStatus::Success);
    srv.join().unwrap();
}
