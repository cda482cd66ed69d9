//! `uroce::cm::CmId`, librdmacm's id model in Rust, over the UDP backend
//! between two contexts (server 127.0.0.2, client 127.0.0.1): every step
//! reported on an event channel, an RC connection with a library-made QP
//! and one with the application's own QP, refusals, UD ids finding the
//! serving QP by SIDR and sending to it, multicast joins, the port table.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use uroce::cm::{CmId, ConnParam, Event, EventChannel, EventType, PortSpace, UDP_QKEY};
use uroce::{
    Access, Context, Cq, Error, QpCaps, QpInitAttr, QpState, QpType, RecvWr, SendWr, WcStatus,
};

const T: Duration = Duration::from_secs(10);

fn pair() -> (Context, Context) {
    let port = uroce::testing::free_port();
    (uroce::testing::open("127.0.0.2", port), uroce::testing::open("127.0.0.1", port))
}

fn next(ch: &EventChannel) -> Event {
    ch.get_event_timeout(T).unwrap().expect("an event within 10 s")
}

fn expect(ch: &EventChannel, want: EventType) -> Event {
    let e = next(ch);
    assert_eq!(e.event, want, "{e:?}");
    e
}

fn caps() -> QpCaps {
    QpCaps { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 }
}

fn init<'a>(cq: &'a Cq, qp_type: QpType) -> QpInitAttr<'a> {
    QpInitAttr { send_cq: cq, recv_cq: cq, cap: caps(), qp_type, sq_sig_all: true, srq: None }
}

fn server_addr(port: u16) -> SocketAddr {
    SocketAddr::new("127.0.0.2".parse().unwrap(), port)
}

/// A listening id on `ctx`'s device at `port`.
fn listen(ctx: &Context, ps: PortSpace, port: u16) -> (EventChannel, CmId) {
    let ch = EventChannel::with_contexts(std::slice::from_ref(ctx)).unwrap();
    let id = ch.create_id(ps);
    id.bind_addr(server_addr(port)).unwrap();
    id.listen().unwrap();
    (ch, id)
}

/// A client id on `ctx` with its route to the server's `port` resolved.
fn resolved(ctx: &Context, ps: PortSpace, port: u16) -> (EventChannel, CmId) {
    let ch = EventChannel::with_contexts(std::slice::from_ref(ctx)).unwrap();
    let id = ch.create_id(ps);
    id.resolve_addr(None, server_addr(port)).unwrap();
    let e = expect(&ch, EventType::AddrResolved);
    assert_eq!(e.id, id);
    assert_eq!(id.local_addr().unwrap().ip(), "127.0.0.1".parse::<IpAddr>().unwrap());
    id.resolve_route().unwrap();
    expect(&ch, EventType::RouteResolved);
    (ch, id)
}

#[test]
fn rc_ids_connect_send_and_disconnect() {
    let (server, client) = pair();
    let (sch, listener) = listen(&server, PortSpace::Tcp, 7471);

    let srv = std::thread::spawn(move || {
        let e = expect(&sch, EventType::ConnectRequest);
        assert_eq!(e.listen_id.as_ref(), Some(&listener));
        assert_eq!(&e.private_data[..5], b"hello");
        assert_eq!(e.id.peer_addr().unwrap().ip(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(e.param.responder_resources, 4, "the requester's initiator depth");
        let id = e.id;
        let pd = server.alloc_pd().unwrap();
        let cq = server.create_cq(16).unwrap();
        let qp = id.create_qp(&pd, &init(&cq, QpType::Rc)).unwrap();
        assert_eq!(qp.query().state, QpState::Init);
        let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[mr.sge(0, 4096).unwrap()] }]).unwrap();
        id.accept(&ConnParam::default(), b"welcome").unwrap();
        assert_eq!(qp.query().state, QpState::ReadyToSend);
        expect(&sch, EventType::Established);
        let wc = uroce::testing::wait_completion(&cq);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 11));
        let mut got = [0u8; 11];
        mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"over the id");
        expect(&sch, EventType::Disconnected);
        // The peer's DREQ came: a disconnect here sends nothing more.
        id.disconnect().unwrap();
        assert_eq!(qp.query().state, QpState::Error);
    });

    let (ch, id) = resolved(&client, PortSpace::Tcp, 7471);
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(16).unwrap();
    let qp = id.create_qp(&pd, &init(&cq, QpType::Rc)).unwrap();
    assert!(id.create_qp(&pd, &init(&cq, QpType::Rc)).is_err(), "one QP per id");
    let param = ConnParam { initiator_depth: 4, ..ConnParam::default() };
    id.connect(&param, b"hello").unwrap();
    let e = expect(&ch, EventType::Established);
    assert_eq!(&e.private_data[..7], b"welcome");
    assert_eq!(qp.query().state, QpState::ReadyToSend);
    assert_eq!(qp.query().max_rd_atomic, 4);
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    mr.write(0, b"over the id").unwrap();
    qp.post_send(&[SendWr { wr_id: 9, sgl: &[mr.sge(0, 11).unwrap()], ..SendWr::default() }])
        .unwrap();
    let wc = uroce::testing::wait_completion(&cq);
    assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, 9));
    id.disconnect().unwrap();
    assert_eq!(qp.query().state, QpState::Error);
    expect(&ch, EventType::Disconnected);
    // TimeWait (1 s) ends: the QP may be reused.
    expect(&ch, EventType::TimewaitExit);
    srv.join().unwrap();
}

#[test]
fn the_applications_own_qp_moves_by_init_qp_attr() {
    let (server, client) = pair();
    let (sch, _listener) = listen(&server, PortSpace::Ib, 7000);
    let spd = server.alloc_pd().unwrap();
    let scq = server.create_cq(16).unwrap();
    let sqp = spd.create_qp(&init(&scq, QpType::Rc)).unwrap();

    let (ch, id) = resolved(&client, PortSpace::Ib, 7000);
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(16).unwrap();
    let qp = pd.create_qp(&init(&cq, QpType::Rc)).unwrap();
    assert!(id.init_qp_attr(QpState::ReadyToReceive).is_err(), "no peer yet");
    let (a, m) = id.init_qp_attr(QpState::Init).unwrap();
    qp.modify(&a, m).unwrap();
    id.connect(&ConnParam { qp_num: qp.qpn(), ..ConnParam::default() }, &[]).unwrap();

    let req = expect(&sch, EventType::ConnectRequest);
    assert_eq!(req.param.qp_num, qp.qpn());
    for s in [QpState::Init, QpState::ReadyToReceive, QpState::ReadyToSend] {
        let (a, m) = req.id.init_qp_attr(s).unwrap();
        sqp.modify(&a, m).unwrap();
    }
    req.id.accept(&ConnParam { qp_num: sqp.qpn(), ..ConnParam::default() }, &[]).unwrap();

    let rep = expect(&ch, EventType::ConnectResponse);
    assert_eq!(rep.param.qp_num, sqp.qpn());
    for s in [QpState::ReadyToReceive, QpState::ReadyToSend] {
        let (a, m) = id.init_qp_attr(s).unwrap();
        qp.modify(&a, m).unwrap();
    }
    assert_eq!(qp.query().dest_qpn, sqp.qpn());
    id.establish().unwrap();
    expect(&sch, EventType::Established);

    // A WRITE over the pair the application moved itself.
    let smr = spd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    mr.write(0, b"moved by hand").unwrap();
    qp.post_send(&[SendWr {
        wr_id: 3,
        opcode: uroce::WrOpcode::RdmaWrite,
        sgl: &[mr.sge(0, 13).unwrap()],
        remote_addr: smr.addr(),
        rkey: smr.rkey(),
        ..SendWr::default()
    }])
    .unwrap();
    assert_eq!(uroce::testing::wait_completion(&cq).status, WcStatus::Success);
    let mut got = [0u8; 13];
    smr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"moved by hand");
    // And back: the server moved its QP to RTS before it accepted, so
    // its first PSN is the one its REP named.
    let back = pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    sqp.post_send(&[SendWr {
        wr_id: 4,
        opcode: uroce::WrOpcode::RdmaWrite,
        sgl: &[smr.sge(0, 13).unwrap()],
        remote_addr: back.addr(),
        rkey: back.rkey(),
        ..SendWr::default()
    }])
    .unwrap();
    assert_eq!(uroce::testing::wait_completion(&scq).status, WcStatus::Success);
    back.read(0, &mut got).unwrap();
    assert_eq!(&got, b"moved by hand");
}

#[test]
fn refusals_come_as_rejected_events() {
    let (server, client) = pair();
    let (sch, _listener) = listen(&server, PortSpace::Tcp, 7100);
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(16).unwrap();

    // The application refuses, with private data.
    let (ch, id) = resolved(&client, PortSpace::Tcp, 7100);
    id.create_qp(&pd, &init(&cq, QpType::Rc)).unwrap();
    id.connect(&ConnParam::default(), b"may I").unwrap();
    let req = expect(&sch, EventType::ConnectRequest);
    req.id.reject(b"no thanks").unwrap();
    let e = expect(&ch, EventType::Rejected);
    assert_eq!(e.status, 28, "consumer-defined");
    assert_eq!(&e.private_data[..9], b"no thanks");
    drop(req);

    // Nobody listens on that port.
    let (ch, id) = resolved(&client, PortSpace::Tcp, 7101);
    id.create_qp(&pd, &init(&cq, QpType::Rc)).unwrap();
    id.connect(&ConnParam::default(), &[]).unwrap();
    assert_eq!(expect(&ch, EventType::Rejected).status, 8);

    // A dropped request id refuses its request.
    let (ch, id) = resolved(&client, PortSpace::Tcp, 7100);
    id.create_qp(&pd, &init(&cq, QpType::Rc)).unwrap();
    id.connect(&ConnParam::default(), &[]).unwrap();
    drop(expect(&sch, EventType::ConnectRequest));
    expect(&ch, EventType::Rejected);

    // Bad calls are refused at once.
    let (ch2, id2) = resolved(&client, PortSpace::Tcp, 7100);
    id2.create_qp(&pd, &init(&cq, QpType::Rc)).unwrap();
    id2.connect(&ConnParam::default(), &[]).unwrap();
    let req = expect(&sch, EventType::ConnectRequest);
    assert!(matches!(req.id.reject(&[0; 149]), Err(Error::InvalidArgument(_))));
    assert!(matches!(req.id.disconnect(), Err(Error::InvalidArgument(_))), "never connected");
    req.id.reject(&[]).unwrap();
    expect(&ch2, EventType::Rejected);
    let fresh = ch.create_id(PortSpace::Tcp);
    assert!(matches!(fresh.connect(&ConnParam::default(), &[]), Err(Error::InvalidArgument(_))));
    assert!(matches!(fresh.listen(), Err(Error::InvalidArgument(_))));
    assert!(fresh.resolve_route().is_err());
    assert!(matches!(id.connect(&ConnParam::default(), &[0; 57]), Err(Error::InvalidArgument(_))));
}

#[test]
fn ud_ids_find_the_serving_qp_by_sidr() {
    let (server, client) = pair();
    let (sch, _listener) = listen(&server, PortSpace::Udp, 7200);
    let spd = server.alloc_pd().unwrap();
    let scq = server.create_cq(16).unwrap();

    let (ch, id) = resolved(&client, PortSpace::Udp, 7200);
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(16).unwrap();
    assert!(id.create_qp(&pd, &init(&cq, QpType::Rc)).is_err(), "a UDP id's QP is UD");
    let qp = id.create_qp(&pd, &init(&cq, QpType::Ud)).unwrap();
    assert_eq!(qp.query().state, QpState::ReadyToSend);
    id.connect(&ConnParam::default(), b"which qp?").unwrap();

    let req = expect(&sch, EventType::ConnectRequest);
    assert_eq!(&req.private_data[..9], b"which qp?");
    let ud = req.ud.expect("a UD request's address vector");
    assert_eq!(ud.ah.dst, "127.0.0.1".parse::<IpAddr>().unwrap());
    let sqp = req.id.create_qp(&spd, &init(&scq, QpType::Ud)).unwrap();
    assert_eq!(sqp.query().qkey, UDP_QKEY);
    let smr = spd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    sqp.post_recv(&[RecvWr { wr_id: 5, sgl: &[smr.sge(0, 4096).unwrap()] }]).unwrap();
    req.id.accept(&ConnParam::default(), b"this one").unwrap();

    let e = expect(&ch, EventType::Established);
    let ud = e.ud.expect("the serving QP");
    assert_eq!((ud.qp_num, ud.qkey), (sqp.qpn(), UDP_QKEY));
    assert_eq!(&e.private_data[..8], b"this one");
    let ah = pd.create_ah(&ud.ah).unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    mr.write(0, b"datagram").unwrap();
    qp.post_send(&[SendWr {
        wr_id: 6,
        sgl: &[mr.sge(0, 8).unwrap()],
        ud: Some(ah.dest(ud.qp_num, ud.qkey)),
        ..SendWr::default()
    }])
    .unwrap();
    assert_eq!(uroce::testing::wait_completion(&cq).status, WcStatus::Success);
    let wc = uroce::testing::wait_completion(&scq);
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 40 + 8), "GRH + payload");
    let mut got = [0u8; 8];
    smr.read(40, &mut got).unwrap();
    assert_eq!(&got, b"datagram");

    // A refused SIDR request, and one nobody serves.
    let (ch, id) = resolved(&client, PortSpace::Udp, 7200);
    id.connect(&ConnParam::default(), &[]).unwrap();
    expect(&sch, EventType::ConnectRequest).id.reject(&[]).unwrap();
    assert_eq!(expect(&ch, EventType::Unreachable).status, 2, "rejected");
    let (ch, id) = resolved(&client, PortSpace::Udp, 7201);
    id.connect(&ConnParam::default(), &[]).unwrap();
    assert_eq!(expect(&ch, EventType::Unreachable).status, 1, "no such service");
}

#[test]
fn multicast_joins_complete_at_once_and_attach_the_qp() {
    let (_server, client) = pair();
    let ch = EventChannel::with_contexts(std::slice::from_ref(&client)).unwrap();
    let id = ch.create_id(PortSpace::Udp);
    let group: IpAddr = "239.1.2.3".parse().unwrap();
    assert!(id.join_multicast(group, false).is_err(), "not bound to a device yet");
    id.bind_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(16).unwrap();
    let qp = id.create_qp(&pd, &init(&cq, QpType::Ud)).unwrap();
    assert!(id.join_multicast("10.0.0.1".parse().unwrap(), false).is_err());
    assert!(id.join_multicast("ff02::1".parse().unwrap(), false).is_err(), "another family");
    id.join_multicast(group, false).unwrap();
    assert!(matches!(id.join_multicast(group, false), Err(Error::InUse(_))));
    let e = expect(&ch, EventType::MulticastJoin);
    let ud = e.ud.unwrap();
    assert_eq!((ud.ah.dst, ud.qp_num, ud.qkey), (group, 0xff_ffff, UDP_QKEY));
    // Reading the event attached the QP (detaching it works once).
    qp.detach_mcast(group).unwrap();
    qp.attach_mcast(group).unwrap();
    id.leave_multicast(group).unwrap();
    assert!(qp.detach_mcast(group).is_err(), "leaving detached the QP");
    assert!(matches!(id.leave_multicast(group), Err(Error::AddrNotAvailable(_))));
    // A send-only join attaches nothing.
    id.join_multicast(group, true).unwrap();
    expect(&ch, EventType::MulticastJoin);
    assert!(qp.detach_mcast(group).is_err(), "send-only");
    // Destroying the id's QP detaches what the join attached.
    id.join_multicast("239.1.2.4".parse().unwrap(), false).unwrap();
    expect(&ch, EventType::MulticastJoin);
    id.destroy_qp();
    assert!(qp.detach_mcast("239.1.2.4".parse().unwrap()).is_err(), "detached with the QP");
}

#[test]
fn ports_and_addresses_as_the_kernel_checks_them() {
    let (server, _client) = pair();
    let ch = EventChannel::with_contexts(std::slice::from_ref(&server)).unwrap();
    let a = ch.create_id(PortSpace::Tcp);
    a.bind_addr(server_addr(7300)).unwrap();
    assert!(a.bind_addr(server_addr(7301)).is_err(), "bound already");
    let b = ch.create_id(PortSpace::Tcp);
    assert_eq!(b.bind_addr(server_addr(7300)).unwrap_err().errno(), libc::EADDRINUSE);
    assert_eq!(
        b.bind_addr("0.0.0.0:7300".parse().unwrap()).unwrap_err().errno(),
        libc::EADDRNOTAVAIL
    );
    // Another port space, or the port once its owner is gone: free.
    ch.create_id(PortSpace::Udp).bind_addr(server_addr(7300)).unwrap();
    drop(a);
    b.bind_addr(server_addr(7300)).unwrap();
    // 127.0.0.1 is this host's, but no device of this channel has it.
    let c = ch.create_id(PortSpace::Tcp);
    assert_eq!(c.bind_addr("127.0.0.1:1".parse().unwrap()).unwrap_err().errno(), libc::ENODEV);
    assert_eq!(
        c.bind_addr("192.0.2.1:1".parse().unwrap()).unwrap_err().errno(),
        libc::EADDRNOTAVAIL
    );
    // REUSEADDR shares a port until one of the ids listens.
    let (r1, r2) = (ch.create_id(PortSpace::Tcp), ch.create_id(PortSpace::Tcp));
    r1.set_reuseaddr(true).unwrap();
    r2.set_reuseaddr(true).unwrap();
    r1.bind_addr(server_addr(7310)).unwrap();
    r2.bind_addr(server_addr(7310)).unwrap();
    assert!(r1.set_reuseaddr(true).is_err(), "set before binding");
    assert_eq!(r1.listen().unwrap_err().errno(), libc::EADDRINUSE);
    drop(r2);
    r1.listen().unwrap();
    // No IPv6 device: resolving an IPv6 destination ends in ADDR_ERROR.
    let v6 = ch.create_id(PortSpace::Tcp);
    v6.resolve_addr(None, "[::1]:7000".parse().unwrap()).unwrap();
    assert_eq!(expect(&ch, EventType::AddrError).status, -libc::ENODEV);
    // A wildcard listen covers the channel's IPv4 devices.
    let w = ch.create_id(PortSpace::Tcp);
    w.bind_addr("0.0.0.0:7320".parse().unwrap()).unwrap();
    w.listen().unwrap();
    assert!(w.context().is_none(), "a wildcard id has no device of its own");
}
