//! The CM agent against ground truth (kernel rxe's REQ, RTU and DREQ from
//! `rping_cm.pcap` replayed to our passive side, our REP and DREP checked
//! field by field against rxe's) and against itself over a link that
//! loses MADs.

use std::net::IpAddr;
use std::time::Duration;

use uroce_transport::Instant;
use uroce_transport::cm::{
    CmAgent, CmEvent, ConnectArgs, Ece, GONE_RETRY, ORPHAN_WAIT, QpOffer, cm_timeout,
};
use uroce_wire::cm::{
    CmMad, CmMessage, CmPath, MAD_LEN, attr, port_space, rdma_cm_service_id, rej_reason,
};
use uroce_wire::{RocePacket, UdpDatagram};

/// The CM MADs of `rping_cm.pcap`, in order.
fn captured() -> Vec<CmMad> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../wire/tests/vectors/rxe/rping_cm.pcap");
    let data = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    for rec in uroce_pcap::Reader::new(&data).unwrap() {
        let rec = rec.unwrap();
        let ip = &rec.data[14..];
        let d = UdpDatagram::parse(ip).unwrap();
        let pkt: RocePacket<&[u8]> = d.roce().unwrap();
        if pkt.bth().dest_qpn() == 1 {
            out.push(CmMad::parse(pkt.payload()).unwrap());
        }
    }
    assert_eq!(out.len(), 5);
    out
}

fn bytes(m: &CmMad) -> [u8; MAD_LEN] {
    let mut b = [0u8; MAD_LEN];
    m.emit(&mut b);
    b
}

fn events(a: &mut CmAgent) -> Vec<CmEvent> {
    std::iter::from_fn(|| a.poll_event()).collect()
}

const CLIENT: &str = "10.50.0.2";

#[test]
fn rxe_requests_get_the_reply_rxe_gives() {
    let m = captured();
    let CmMessage::Req(req) = m[0].message else { panic!() };
    let CmMessage::Rep(their_rep) = m[1].message else { panic!() };
    let client: IpAddr = CLIENT.parse().unwrap();
    let t0 = Instant::ZERO;

    let mut a = CmAgent::new(their_rep.local_ca_guid, 7);
    a.listen(rdma_cm_service_id(port_space::TCP, 7174)).unwrap();
    a.handle(t0, client, &m[0]);
    let ev = events(&mut a);
    let [CmEvent::ConnectRequest { id, from, req: got, ece }] = &ev[..] else { panic!("{ev:?}") };
    assert_eq!((*from, **got, *ece), (client, req, Ece::default()));
    let id = *id;

    // The values each side picks (QPN, PSN) are ours; the READ depths and
    // RNR retry are what rping asked for.
    let qp = QpOffer {
        qpn: 0x4242,
        starting_psn: 0x123456,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        ece: Ece::default(),
    };
    a.accept(t0, id, &qp, &[]).unwrap();
    let (to, ours) = a.poll_transmit().unwrap();
    assert_eq!(to, client);
    let CmMessage::Rep(our_rep) = ours.message else { panic!() };
    assert_eq!(ours.header, m[1].header, "same transaction, class and method");
    assert_eq!(
        (our_rep.local_comm_id, our_rep.local_qpn, our_rep.starting_psn),
        (id, 0x4242, 0x123456)
    );
    // Field by field: rxe's REP with our picks written in is ours.
    let mut expected = their_rep;
    expected.local_comm_id = id;
    expected.local_qpn = 0x4242;
    expected.starting_psn = 0x123456;
    assert_eq!(our_rep, expected);
    let expected_mad = CmMad { header: m[1].header, message: CmMessage::Rep(expected) };
    assert_eq!(bytes(&ours), bytes(&expected_mad));

    // rxe's RTU (addressed to our ID) establishes; its DREQ draws the DREP
    // rxe's server sent, then TimeWait runs out.
    let retarget = |mad: &CmMad| {
        let mut mad = *mad;
        match &mut mad.message {
            CmMessage::Rtu(m) => m.remote_comm_id = id,
            CmMessage::Dreq(m) => m.remote_comm_id = id,
            _ => unreachable!(),
        }
        mad
    };
    a.handle(t0, client, &retarget(&m[2]));
    assert_eq!(events(&mut a), [CmEvent::Established { id }]);
    assert_eq!(a.poll_timeout(), None, "nothing waits for an answer");
    a.handle(t0, client, &retarget(&m[3]));
    assert_eq!(events(&mut a), [CmEvent::DisconnectRequest { id }]);
    let (_, drep) = a.poll_transmit().unwrap();
    let CmMessage::Drep(mut their_drep) = m[4].message else { panic!() };
    their_drep.local_comm_id = id;
    assert_eq!(drep, CmMad { header: m[4].header, message: CmMessage::Drep(their_drep) });
    let end = a.poll_timeout().unwrap();
    a.handle_timeout(end);
    assert_eq!(events(&mut a), [CmEvent::TimeWaitExit { id }]);
}

/// Two agents and a link between them that drops the MADs `drop` says to.
struct Pair {
    a: CmAgent,
    b: CmAgent,
    now: Instant,
    sent: usize,
    drop: fn(usize, &CmMad) -> bool,
}

const A: &str = "10.0.0.1";
const B: &str = "10.0.0.2";

impl Pair {
    fn new(drop: fn(usize, &CmMad) -> bool) -> Self {
        let mut a = CmAgent::new(0xa, 1);
        let mut b = CmAgent::new(0xb, 2);
        a.set_reply_wait(Duration::from_millis(10));
        b.set_reply_wait(Duration::from_millis(10));
        Self { a, b, now: Instant::ZERO, sent: 0, drop }
    }

    /// Delivers everything in flight (both ways) until quiet.
    fn flush(&mut self) {
        loop {
            let mut moved = false;
            while let Some((to, mad)) = self.a.poll_transmit() {
                assert_eq!(to, B.parse::<IpAddr>().unwrap());
                self.sent += 1;
                if !(self.drop)(self.sent, &mad) {
                    self.b.handle(self.now, A.parse().unwrap(), &mad);
                }
                moved = true;
            }
            while let Some((to, mad)) = self.b.poll_transmit() {
                assert_eq!(to, A.parse::<IpAddr>().unwrap());
                self.sent += 1;
                if !(self.drop)(self.sent, &mad) {
                    self.a.handle(self.now, B.parse().unwrap(), &mad);
                }
                moved = true;
            }
            if !moved {
                return;
            }
        }
    }

    /// Advances to the next timer of either agent.
    fn tick(&mut self) {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()].into_iter().flatten().min();
        let next = next.expect("a timer");
        self.now = next;
        self.a.handle_timeout(next);
        self.b.handle_timeout(next);
        self.flush();
    }
}

fn offer(qpn: u32) -> QpOffer {
    QpOffer {
        qpn,
        starting_psn: qpn * 3,
        responder_resources: 4,
        initiator_depth: 4,
        rnr_retry_count: 7,
        srq: false,
        ece: Ece::default(),
    }
}

fn connect_args(service_id: u64) -> ConnectArgs {
    ConnectArgs {
        peer: B.parse().unwrap(),
        service_id,
        qp: offer(0x11),
        transport_service_type: 0,
        retry_count: 7,
        path_mtu: 3,
        path: CmPath { local_lid: 0xffff, remote_lid: 0xffff, hop_limit: 64, ..CmPath::default() },
        response_timeout: 12, // 16.8 ms
        max_cm_retries: 3,
        private_data: [9; 92],
    }
}

const SVC: u64 = rdma_cm_service_id(port_space::TCP, 5000);

/// Connects A to B over `p`, retrying through whatever the link drops;
/// returns both sides' IDs.
fn establish(p: &mut Pair) -> (u32, u32) {
    p.b.listen(SVC).unwrap();
    let ida = p.a.connect(p.now, &connect_args(SVC));
    p.flush();
    let idb = loop {
        if let Some(ev) = p.b.poll_event() {
            let CmEvent::ConnectRequest { id, req, .. } = ev else { panic!("{ev:?}") };
            assert_eq!((req.local_qpn, req.private_data), (0x11, [9; 92]));
            break id;
        }
        p.tick();
    };
    p.b.accept(p.now, idb, &offer(0x22), b"welcome").unwrap();
    p.flush();
    loop {
        if let Some(ev) = p.a.poll_event() {
            let CmEvent::ConnectReply { id, rep, .. } = ev else { panic!("{ev:?}") };
            assert_eq!((id, rep.local_qpn, &rep.private_data[..7]), (ida, 0x22, &b"welcome"[..]));
            break;
        }
        p.tick();
    }
    p.a.establish(ida).unwrap();
    assert_eq!(p.a.poll_event(), None, "the active side knows it established");
    p.flush();
    loop {
        if let Some(ev) = p.b.poll_event() {
            assert_eq!(ev, CmEvent::Established { id: idb });
            break;
        }
        p.tick();
    }
    (ida, idb)
}

#[test]
fn connect_and_disconnect_over_a_clean_link() {
    let mut p = Pair::new(|_, _| false);
    let (ida, idb) = establish(&mut p);
    assert_eq!((p.a.poll_timeout(), p.b.poll_timeout()), (None, None));
    assert_eq!(p.sent, 3, "REQ, REP, RTU");
    p.a.disconnect(p.now, ida).unwrap();
    p.flush();
    assert_eq!(events(&mut p.b), [CmEvent::DisconnectRequest { id: idb }]);
    assert_eq!(events(&mut p.a), [CmEvent::Disconnected { id: ida }]);
    p.tick();
    assert_eq!(events(&mut p.a), [CmEvent::TimeWaitExit { id: ida }]);
    assert_eq!(events(&mut p.b), [CmEvent::TimeWaitExit { id: idb }]);
}

/// A LAP (load an alternate path) on an established connection is
/// dropped, as Linux's CM drops it on RoCE: no answer (no APR), no event,
/// and the connection goes on to end normally.
#[test]
fn a_lap_is_dropped_and_the_connection_goes_on() {
    let mut p = Pair::new(|_, _| false);
    let (ida, idb) = establish(&mut p);
    let mut data = [0u8; uroce_wire::cm::CM_DATA_LEN];
    data[..4].copy_from_slice(&ida.to_be_bytes());
    data[4..8].copy_from_slice(&idb.to_be_bytes());
    let lap = CmMad {
        header: uroce_wire::cm::MadHeader::cm(attr::LAP, 0x77),
        message: CmMessage::Other { attr_id: attr::LAP, data },
    };
    p.b.handle(p.now, A.parse().unwrap(), &lap);
    assert!(p.b.poll_transmit().is_none(), "no APR or anything else");
    assert!(events(&mut p.b).is_empty());
    p.a.disconnect(p.now, ida).unwrap();
    p.flush();
    assert_eq!(events(&mut p.b), [CmEvent::DisconnectRequest { id: idb }]);
    assert_eq!(events(&mut p.a), [CmEvent::Disconnected { id: ida }]);
}

#[test]
fn lost_req_rep_rtu_and_dreq_are_recovered_by_retries() {
    // Drop the first REQ, the first REP, the first RTU and the first DREQ.
    fn drop_firsts(_: usize, m: &CmMad) -> bool {
        use std::sync::atomic::{AtomicU32, Ordering};
        static SEEN: AtomicU32 = AtomicU32::new(0);
        let bit = 1 << m.message.attr_id();
        SEEN.fetch_or(bit, Ordering::Relaxed) & bit == 0
    }
    let mut p = Pair::new(drop_firsts);
    let (ida, idb) = establish(&mut p);
    p.a.disconnect(p.now, ida).unwrap();
    p.flush();
    while p.a.poll_event().is_none() {
        p.tick();
    }
    assert_eq!(events(&mut p.b), [CmEvent::DisconnectRequest { id: idb }]);
}

#[test]
fn nobody_listening_is_an_invalid_service_reject() {
    let mut p = Pair::new(|_, _| false);
    let id = p.a.connect(p.now, &connect_args(SVC));
    p.flush();
    assert!(events(&mut p.a).is_empty(), "held a moment for a listener");
    p.tick();
    let ev = events(&mut p.a);
    let [CmEvent::Rejected { id: rid, reason, .. }] = &ev[..] else { panic!("{ev:?}") };
    assert_eq!((*rid, *reason), (id, rej_reason::INVALID_SERVICE_ID));
    // Half the requester's 16.8 ms response timeout: before its resend.
    let wait = cm_timeout(12) / 2;
    assert_eq!(p.now, Instant::ZERO.saturating_add(wait), "refused at the deadline");
    assert!(wait < ORPHAN_WAIT);
    assert_eq!(p.a.poll_timeout(), None, "the REQ is no longer resent");
}

/// A request for a port that another context sharing the address
/// listens on, steered here before the address's group knew where that
/// listener is, is dropped rather than refused: the requester resends,
/// and the resend reaches the listener.
#[test]
fn a_request_for_a_port_listened_on_elsewhere_is_dropped_not_refused() {
    let mut p = Pair::new(|_, _| false);
    p.b.set_listened_elsewhere(&[SVC as u16]);
    let id = p.a.connect(p.now, &connect_args(SVC));
    p.flush();
    p.tick();
    assert!(p.b.poll_transmit().is_none() && events(&mut p.a).is_empty(), "no REJ");
    assert!(!p.b.orphan_due(p.now));
    // The requester resends; by then the request reaches the listener
    // (here: the same agent, listening now).
    p.b.listen(SVC).unwrap();
    let ev = loop {
        let ev = events(&mut p.b);
        if !ev.is_empty() {
            break ev;
        }
        p.tick();
    };
    assert!(matches!(ev[..], [CmEvent::ConnectRequest { .. }]), "{ev:?}");
    assert!(p.now < Instant::ZERO.saturating_add(cm_timeout(12) * 2), "one resend");
    assert!(events(&mut p.a).is_empty(), "{id}: not refused");
}

#[test]
fn a_listener_that_comes_a_moment_late_gets_the_request() {
    let mut p = Pair::new(|_, _| false);
    let id = p.a.connect(p.now, &connect_args(SVC));
    p.flush();
    p.now = p.now.saturating_add(cm_timeout(12) / 4);
    p.b.listen(SVC).unwrap();
    let Some(CmEvent::ConnectRequest { id: idb, req, .. }) = p.b.poll_event() else { panic!() };
    assert_eq!(req.service_id, SVC);
    p.b.accept(p.now, idb, &offer(1), &[]).unwrap();
    p.flush();
    assert!(matches!(p.a.poll_event(), Some(CmEvent::ConnectReply { id: i, .. }) if i == id));
}

#[test]
fn a_consumer_reject_carries_its_private_data() {
    let mut p = Pair::new(|_, _| false);
    p.b.listen(SVC).unwrap();
    let id = p.a.connect(p.now, &connect_args(SVC));
    p.flush();
    let Some(CmEvent::ConnectRequest { id: idb, .. }) = p.b.poll_event() else { panic!() };
    p.b.reject(idb, b"go away").unwrap();
    p.flush();
    let ev = events(&mut p.a);
    let [CmEvent::Rejected { id: rid, reason, private_data }] = &ev[..] else { panic!("{ev:?}") };
    assert_eq!((*rid, *reason), (id, rej_reason::CONSUMER_DEFINED));
    assert_eq!(&private_data[..7], b"go away");
    assert!(p.b.accept(p.now, idb, &offer(1), &[]).is_err(), "the request is gone");
}

/// ECE rides in the REQ and the REP (vendor ID in the message, options
/// in the MAD header's attribute modifier, as Linux puts them), resent
/// copies included; a request whose options cannot be met is refused
/// with reason 35.
#[test]
fn ece_is_carried_both_ways_and_refused_with_its_own_reason() {
    let mellanox = Ece { vendor_id: 0x02c9, options: 0x5 };
    let mut p = Pair::new(|_, _| false);
    p.b.listen(SVC).unwrap();
    let mut args = connect_args(SVC);
    args.qp.ece = mellanox;
    let id = p.a.connect(p.now, &args);
    let (_, req) = p.a.poll_transmit().unwrap();
    assert_eq!(req.header.attr_mod, 5);
    let CmMessage::Req(r) = req.message else { panic!() };
    assert_eq!(r.vendor_id, 0x02c9);
    // (that copy is lost: the resent one must carry it too)
    p.tick();
    let Some(CmEvent::ConnectRequest { id: idb, ece, .. }) = p.b.poll_event() else { panic!() };
    assert_eq!(ece, mellanox, "the resent REQ carries it too");
    let answer = Ece { vendor_id: 0x02c9, options: 0x1 };
    p.b.accept(p.now, idb, &QpOffer { ece: answer, ..offer(0x21) }, &[]).unwrap();
    p.flush();
    let Some(CmEvent::ConnectReply { id: ida, ece, .. }) = p.a.poll_event() else { panic!() };
    assert_eq!((ida, ece), (id, answer));

    args.qp.qpn = 0x12; // another QP (0x11's connection still stands)
    let id = p.a.connect(p.now, &args);
    p.flush();
    let Some(CmEvent::ConnectRequest { id: idb, .. }) = p.b.poll_event() else { panic!() };
    p.b.reject_for(idb, rej_reason::VENDOR_OPTION_NOT_SUPPORTED, b"no").unwrap();
    p.flush();
    let ev = events(&mut p.a);
    let [CmEvent::Rejected { id: rid, reason, .. }] = &ev[..] else { panic!("{ev:?}") };
    assert_eq!((*rid, *reason), (id, 35));
}

#[test]
fn a_silent_peer_is_unreachable_after_the_retries() {
    let mut p = Pair::new(|_, m| m.message.attr_id() == attr::REQ);
    p.b.listen(SVC).unwrap();
    let id = p.a.connect(p.now, &connect_args(SVC));
    p.flush();
    let mut ticks = 0;
    while p.a.poll_event().is_none_or(|e| {
        assert_eq!(e, CmEvent::Unreachable { id });
        false
    }) {
        p.tick();
        ticks += 1;
        assert!(ticks <= 4, "3 retries, then give up");
    }
    // The REQ went out 1 + 3 times, each wait the response timeout.
    assert_eq!(p.now, Instant::ZERO.saturating_add(cm_timeout(12) * 4));
}

/// The requester gives up on a silent peer with a REJ of reason 4
/// (timeout) for its REQ: a peer that saw the REQ late does not go on
/// waiting for an RTU.
#[test]
fn a_request_given_up_is_rejected_for_timeout() {
    let mut a = CmAgent::new(0xa, 1);
    a.set_reply_wait(Duration::from_millis(10));
    let id = a.connect(Instant::ZERO, &connect_args(SVC));
    let mut sent = Vec::new();
    while let Some(now) = a.poll_timeout() {
        while let Some((_, m)) = a.poll_transmit() {
            sent.push(m);
        }
        a.handle_timeout(now);
        assert!(now < Instant::ZERO.saturating_add(Duration::from_secs(10)), "gives up");
    }
    while let Some((_, m)) = a.poll_transmit() {
        sent.push(m);
    }
    assert_eq!(a.poll_event(), Some(CmEvent::Unreachable { id }));
    let reqs = sent.iter().filter(|m| m.message.attr_id() == attr::REQ).count();
    assert_eq!(reqs, 4, "the REQ and 3 retries: {sent:?}");
    let Some(CmMessage::Rej(rej)) = sent.last().map(|m| m.message) else {
        panic!("a REJ last: {sent:?}");
    };
    assert_eq!((rej.reason, rej.message_rejected, rej.local_comm_id), (4, 0, id));
}

#[test]
fn duplicate_requests_are_answered_not_doubled() {
    let mut p = Pair::new(|_, _| false);
    p.b.listen(SVC).unwrap();
    p.a.connect(p.now, &connect_args(SVC));
    let (_, req) = p.a.poll_transmit().unwrap();
    let from: IpAddr = A.parse().unwrap();
    p.b.handle(p.now, from, &req);
    p.b.handle(p.now, from, &req);
    let ev = events(&mut p.b);
    let [CmEvent::ConnectRequest { id, .. }] = &ev[..] else { panic!("one request: {ev:?}") };
    // Before the application's answer, only an MRA: "wait longer".
    let (_, mra) = p.b.poll_transmit().unwrap();
    assert!(matches!(mra.message, CmMessage::Mra(m) if m.message_mraed == 0), "{mra:?}");
    assert!(p.b.poll_transmit().is_none(), "one MRA per duplicate");
    p.b.accept(p.now, *id, &offer(0x33), &[]).unwrap();
    let (_, rep) = p.b.poll_transmit().unwrap();
    // The REQ again (our REP was lost, say): the same REP goes back.
    p.b.handle(p.now, from, &req);
    assert_eq!(p.b.poll_transmit().map(|(_, m)| m), Some(rep));
    assert!(events(&mut p.b).is_empty());
}

#[test]
fn sidr_names_the_serving_ud_qp_or_says_why_not() {
    let mut p = Pair::new(|_, _| false);
    // Nobody listens: status 1 (service ID not supported), once the
    // request has waited its moment for a listener.
    let id = p.a.sidr_request(p.now, B.parse().unwrap(), SVC, b"who", 30, 3);
    p.flush();
    assert!(events(&mut p.a).is_empty());
    p.tick();
    assert_eq!(p.now, Instant::ZERO.saturating_add(ORPHAN_WAIT));
    let ev = events(&mut p.a);
    let [CmEvent::SidrReply { id: rid, rep }] = &ev[..] else { panic!("{ev:?}") };
    assert_eq!((*rid, rep.status, rep.service_id), (id, 1, SVC));
    // Listened on: the request reaches the application, which names its QP.
    p.b.listen(SVC).unwrap();
    let id = p.a.sidr_request(p.now, B.parse().unwrap(), SVC, b"who", 12, 3);
    p.flush();
    let Some(CmEvent::SidrRequest { id: idb, req, .. }) = p.b.poll_event() else { panic!() };
    assert_eq!((req.service_id, &req.private_data[..3]), (SVC, &b"who"[..]));
    p.b.sidr_reply(idb, 0, 0x77, 0x0123_4567, b"ok").unwrap();
    assert!(p.b.sidr_reply(idb, 0, 0x77, 0, &[]).is_err(), "answered once");
    p.flush();
    let ev = events(&mut p.a);
    let [CmEvent::SidrReply { id: rid, rep }] = &ev[..] else { panic!("{ev:?}") };
    assert_eq!((*rid, rep.status, rep.qpn, rep.qkey), (id, 0, 0x77, 0x0123_4567));
    assert_eq!(&rep.private_data[..2], b"ok");
    // A peer that never answers: Unreachable after the retries.
    let mut q = Pair::new(|_, m| m.message.attr_id() == attr::SIDR_REQ);
    let id = q.a.sidr_request(q.now, B.parse().unwrap(), SVC, &[], 12, 2);
    q.flush();
    while q.a.poll_timeout().is_some() {
        q.tick();
    }
    assert_eq!(events(&mut q.a), [CmEvent::Unreachable { id }]);
}

#[test]
fn a_slow_acceptor_asks_for_time_with_an_mra() {
    let mut p = Pair::new(|_, _| false);
    p.b.listen(SVC).unwrap();
    // A waits 16.8 ms per try, 3 tries: 67 ms in all without an MRA.
    let id = p.a.connect(p.now, &connect_args(SVC));
    p.flush();
    let Some(CmEvent::ConnectRequest { id: idb, .. }) = p.b.poll_event() else { panic!() };
    // B's application takes 500 ms; A's resent REQ draws an MRA each time.
    let answer_at = Instant::ZERO.saturating_add(Duration::from_millis(500));
    while p.a.poll_timeout().is_some_and(|t| t < answer_at) {
        p.tick();
        assert!(events(&mut p.a).is_empty(), "A gave up");
    }
    p.now = answer_at;
    p.b.accept(p.now, idb, &offer(1), &[]).unwrap();
    p.flush();
    assert!(matches!(p.a.poll_event(), Some(CmEvent::ConnectReply { id: i, .. }) if i == id));
}

#[test]
fn a_request_from_a_qp_still_connected_is_stale() {
    let mut p = Pair::new(|_, _| false);
    let (_, idb) = establish(&mut p);
    // A restarts (a fresh agent, same CA GUID) and asks again from the same
    // QP number: B refuses it as stale and ends the old connection.
    p.a = CmAgent::new(0xa, 99);
    p.a.set_reply_wait(Duration::from_millis(10));
    let id = p.a.connect(p.now, &connect_args(SVC));
    p.flush();
    let ev = events(&mut p.a);
    let [CmEvent::Rejected { id: rid, reason, .. }, ..] = &ev[..] else { panic!("{ev:?}") };
    assert_eq!((*rid, *reason), (id, rej_reason::STALE_CONN));
    // B's DREQ for the old connection was answered (A knows no such
    // connection and says DREP anyway): B's side is over.
    assert!(events(&mut p.b).contains(&CmEvent::Disconnected { id: idb }));
    // The retry goes through.
    let id = p.a.connect(p.now, &connect_args(SVC));
    p.flush();
    let Some(CmEvent::ConnectRequest { id: idb2, .. }) = p.b.poll_event() else { panic!() };
    p.b.accept(p.now, idb2, &offer(1), &[]).unwrap();
    p.flush();
    assert!(matches!(p.a.poll_event(), Some(CmEvent::ConnectReply { id: i, .. }) if i == id));
}

/// A peer whose port answered "unreachable" (its process is gone): a
/// pending REQ is sent again every `GONE_RETRY` and, its retries spent,
/// ends as unreachable (no CM refused it); a DREQ ends at once; an
/// established connection is left alone.
#[test]
fn a_gone_peer_ends_what_waits_on_it() {
    let mut p = Pair::new(|_, _| false);
    let (ida, _) = establish(&mut p);
    let b: IpAddr = B.parse().unwrap();
    p.a.peer_gone(p.now, b);
    assert_eq!(events(&mut p.a), [], "an established connection is left alone");
    // A second connection whose every REQ meets a closed port.
    let start = p.now;
    let id2 = p.a.connect(p.now, &connect_args(SVC));
    let mut sent = 0;
    let ev = loop {
        while p.a.poll_transmit().is_some() {
            sent += 1;
            p.a.peer_gone(p.now, b);
        }
        if let Some(e) = p.a.poll_event() {
            break e;
        }
        p.now = p.a.poll_timeout().expect("a resend is due");
        p.a.handle_timeout(p.now);
    };
    assert_eq!(ev, CmEvent::Unreachable { id: id2 });
    assert_eq!(sent, 4, "the REQ and its 3 retries");
    // At most one GONE_RETRY apart (sooner when the response timeout,
    // 16.8 ms here, is shorter).
    assert!(p.now.saturating_since(start) <= GONE_RETRY * 3);
    // A DREQ to a gone peer ends at once.
    p.a.disconnect(p.now, ida).unwrap();
    while p.a.poll_transmit().is_some() {}
    p.a.peer_gone(p.now, b);
    assert_eq!(events(&mut p.a), [CmEvent::Disconnected { id: ida }]);
}

/// XRC as Linux's CM carries it: the initiator's REQ has transport
/// service type 3 with extended type 1 and no responder resources, retry
/// counts or SRQ; the target's REP puts its QPN in the EECN field with SRQ
/// set; the initiator's event gives that QPN as `local_qpn`. A transport
/// type 3 with another extended type is refused (REJ 23, invalid transport).
#[test]
fn xrc_connections_carry_the_target_qpn_in_the_eecn() {
    let mut p = Pair::new(|_, _| false);
    p.b.listen(SVC).unwrap();
    let args = ConnectArgs {
        transport_service_type: uroce_transport::cm::XRC_TRANSPORT,
        ..connect_args(SVC)
    };
    let ida = p.a.connect(p.now, &args);
    let (_, mad) = p.a.poll_transmit().unwrap();
    let CmMessage::Req(req) = mad.message else { panic!() };
    assert_eq!(
        (req.transport_service_type, req.extended_transport_type, req.local_qpn),
        (3, 1, 0x11)
    );
    assert_eq!(
        (req.responder_resources, req.retry_count, req.rnr_retry_count, req.srq),
        (0, 0, 0, false)
    );
    p.b.handle(p.now, A.parse().unwrap(), &mad);
    let ev = events(&mut p.b);
    let [CmEvent::ConnectRequest { id: idb, .. }] = ev[..] else { panic!("{ev:?}") };
    p.b.accept(p.now, idb, &offer(0x22), b"srqn").unwrap();
    let (_, mad) = p.b.poll_transmit().unwrap();
    let CmMessage::Rep(rep) = mad.message else { panic!() };
    assert_eq!((rep.local_qpn, rep.local_eecn, rep.srq, rep.initiator_depth), (0, 0x22, true, 0));
    p.a.handle(p.now, B.parse().unwrap(), &mad);
    let ev = events(&mut p.a);
    let [CmEvent::ConnectReply { id, ref rep, .. }] = ev[..] else { panic!("{ev:?}") };
    assert_eq!((id, rep.local_qpn), (ida, 0x22));
    p.a.establish(ida).unwrap();
    p.flush();
    assert_eq!(events(&mut p.b), [CmEvent::Established { id: idb }]);

    // Type 3 with extended type 2: not a transport Linux knows.
    let mut odd = req;
    odd.extended_transport_type = 2;
    odd.local_comm_id ^= 0x55;
    odd.local_qpn = 0x99;
    let mad = CmMad { header: mad.header, message: CmMessage::Req(odd) };
    p.b.handle(
        p.now,
        A.parse().unwrap(),
        &CmMad { header: uroce_wire::cm::MadHeader::cm(attr::REQ, 77), ..mad },
    );
    assert!(events(&mut p.b).is_empty());
    let (_, rej) = p.b.poll_transmit().unwrap();
    let CmMessage::Rej(rej) = rej.message else { panic!() };
    assert_eq!(rej.reason, rej_reason::INVALID_TRANSPORT_TYPE);
}
