//! One device address shared by several contexts (issue 15): each binds
//! the same address and port, owns its own QPN range, and receives exactly
//! the packets of its own QPs, whoever sends them: a context on another
//! address, or one sharing the address (loopback through the device).

use std::net::IpAddr;
use std::time::Duration;

use uroce::{Access, Context, Cq, Mr, Qp, QpCaps, RecvWr, SendWr, WcStatus, WrOpcode};

const ALL: Access = Access(1 | 2 | 4 | 8);
const LEN: usize = 1 << 20;

struct End {
    addr: IpAddr,
    port: u16,
    qp: Qp,
    cq: Cq,
    mr: Mr,
}

/// An RC QP of `ctx` with a CQ of its own.
fn rc_qp(ctx: &Context) -> (uroce::Pd, Cq, Qp) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let cap = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = uroce::testing::rc_qp(&pd, &cq, cap, true);
    (pd, cq, qp)
}

fn end(ctx: &Context, addr: &str, port: u16) -> End {
    let (pd, cq, qp) = rc_qp(ctx);
    let mr = pd.alloc_mr(2 * LEN, ALL).unwrap();
    End { addr: addr.parse().unwrap(), port, qp, cq, mr }
}

fn connect(a: &End, b: &End) {
    uroce::connect(&a.qp, b.addr, b.port, b.qp.qpn(), 0x100, 0x200, ALL).unwrap();
    uroce::connect(&b.qp, a.addr, a.port, a.qp.qpn(), 0x200, 0x100, ALL).unwrap();
}

use uroce::testing::wait_completion as wait;

/// A 1 MiB WRITE from `a` to `b` and a SEND back, checked byte for byte.
fn exchange(a: &End, b: &End, seed: u8) {
    let data: Vec<u8> = (0..LEN).map(|i| (i as u8).wrapping_mul(seed)).collect();
    a.mr.write(0, &data).unwrap();
    let sge = [a.mr.sge(0, LEN as u32).unwrap()];
    a.qp.post_send(&[SendWr {
        wr_id: 1,
        opcode: WrOpcode::RdmaWrite,
        sgl: &sge,
        remote_addr: b.mr.addr() + LEN as u64,
        rkey: b.mr.rkey(),
        ..SendWr::default()
    }])
    .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let mut got = vec![0u8; LEN];
    b.mr.read(LEN, &mut got).unwrap();
    assert!(got == data, "WRITE data");
    a.qp.post_recv(&[RecvWr { wr_id: 2, sgl: &[a.mr.sge(LEN, 64).unwrap()] }]).unwrap();
    b.mr.write(0, &[seed; 64]).unwrap();
    b.qp.post_send(&[SendWr {
        wr_id: 3,
        opcode: WrOpcode::Send,
        sgl: &[b.mr.sge(0, 64).unwrap()],
        ..SendWr::default()
    }])
    .unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::Success);
    let r = wait(&a.cq);
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 64));
    let mut back = [0u8; 64];
    a.mr.read(LEN, &mut back).unwrap();
    assert_eq!(back, [seed; 64]);
}

/// Waits until every context sharing an address has measured the group
/// (a probe round takes a progress pass or two on each).
fn settle() {
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn contexts_sharing_an_address_each_get_their_own_packets() {
    let port = uroce::testing::free_port();
    let a1 = uroce::testing::open("127.0.0.1", port);
    let a2 = uroce::testing::open("127.0.0.1", port);
    let a3 = uroce::testing::open("127.0.0.1", port);
    let b = uroce::testing::open("127.0.0.2", port);
    settle();
    // Three QPs on 127.0.0.1 (one per context) talking to three on
    // 127.0.0.2 (all in one context), and two on the shared address
    // talking to each other.
    let e1 = end(&a1, "127.0.0.1", port);
    let e2 = end(&a2, "127.0.0.1", port);
    let e3 = end(&a3, "127.0.0.1", port);
    let qpns = [e1.qp.qpn(), e2.qp.qpn(), e3.qp.qpn()];
    assert!(qpns[0] != qpns[1] && qpns[1] != qpns[2] && qpns[0] != qpns[2], "{qpns:x?}");
    let f1 = end(&b, "127.0.0.2", port);
    let f2 = end(&b, "127.0.0.2", port);
    let f3 = end(&b, "127.0.0.2", port);
    connect(&e1, &f1);
    connect(&e2, &f2);
    connect(&e3, &f3);
    let g1 = end(&a1, "127.0.0.1", port);
    let g2 = end(&a2, "127.0.0.1", port);
    connect(&g1, &g2);
    for round in 0..3u8 {
        exchange(&e1, &f1, 3 + round);
        exchange(&f2, &e2, 5 + round);
        exchange(&e3, &f3, 7 + round);
        exchange(&g1, &g2, 11 + round);
        exchange(&g2, &g1, 13 + round);
    }
    // One context goes: the others keep their traffic.
    drop((e2, g2));
    drop(a2);
    settle();
    for round in 0..3u8 {
        exchange(&e1, &f1, 17 + round);
        exchange(&f3, &e3, 19 + round);
    }
    // A new one comes: it takes the slot that was freed, but not the QPNs
    // the last owner handed out (a peer may still send to them).
    let a4 = uroce::testing::open("127.0.0.1", port);
    settle();
    let e4 = end(&a4, "127.0.0.1", port);
    assert_eq!(e4.qp.qpn() >> 18, qpns[1] >> 18, "the freed slot: {:x?}", (e4.qp.qpn(), qpns));
    assert!(!qpns.contains(&e4.qp.qpn()), "{:x}", e4.qp.qpn());
    let f4 = end(&b, "127.0.0.2", port);
    connect(&e4, &f4);
    exchange(&e4, &f4, 23);
    exchange(&e1, &f1, 29);
    exchange(&f3, &e3, 31);
}

/// The device's other GIDs are shared as its configured address is: two
/// contexts of the device at 127.0.0.1 both send from and receive on its
/// IPv6 GID ::1 (a group and slot table of that address, each context in
/// the slot its QPNs name), each gets its own packets there, also from the
/// other, and the first keeps its traffic when the second goes.
#[test]
fn contexts_share_the_devices_other_gids() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        eprintln!("skipped: no IPv6 loopback address");
        return;
    }
    let port = uroce::testing::free_port();
    let other = uroce::testing::free_port();
    let a1 = uroce::testing::open("127.0.0.1", port);
    let a2 = uroce::testing::open("127.0.0.1", port);
    let b = uroce::testing::open("127.0.0.1", other);
    let v6 = "::1".parse::<IpAddr>().unwrap();
    let gids: Vec<IpAddr> = (0..a1.query_port(1).unwrap().gid_tbl_len)
        .filter_map(|i| a1.query_gid(1, i).ok())
        .map(|g| std::net::Ipv6Addr::from(g).to_canonical())
        .collect();
    assert!(gids.contains(&v6), "::1 is a GID of the device at 127.0.0.1: {gids:?}");
    let e1 = end(&a1, "::1", port);
    let e2 = end(&a2, "::1", port);
    let f1 = end(&b, "::1", other);
    let f2 = end(&b, "::1", other);
    connect(&e1, &f1);
    connect(&e2, &f2);
    let g1 = end(&a1, "::1", port);
    let g2 = end(&a2, "::1", port);
    connect(&g1, &g2);
    settle();
    for round in 0..3u8 {
        exchange(&e1, &f1, 3 + round);
        exchange(&f2, &e2, 5 + round);
        exchange(&g1, &g2, 7 + round);
        exchange(&g2, &g1, 11 + round);
    }
    drop((e2, g2));
    drop(a2);
    settle();
    exchange(&e1, &f1, 13);
    exchange(&f1, &e1, 17);
}

/// A process that dies with a connection up (SIGKILL: no exit code of its
/// runs) is disconnected from its peer all the same, as a host's kernel CM
/// does when the process's cm_ids die with it: a context sharing its
/// device takes back its slot and sends the DREQ from the connection list
/// the dead one left. The peer's connection is idle, so nothing else would
/// ever tell it.
#[test]
fn a_killed_processs_connection_is_ended_by_a_context_that_shares_its_device() {
    const T: Duration = Duration::from_secs(10);
    if let Ok(arg) = std::env::var("UROCE_TEST_KILLED_CLIENT") {
        // The process to be killed: connects, says so, and waits.
        let (udp, port) = arg.split_once(':').unwrap();
        let ctx = uroce::testing::open("127.0.0.2", udp.parse().unwrap());
        let (_pd, _cq, qp) = rc_qp(&ctx);
        let peer = "127.0.0.1".parse().unwrap();
        let _conn = ctx.cm_connect(&qp, peer, port.parse().unwrap(), b"doomed", T).unwrap();
        println!("connected");
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    use std::io::BufRead as _;
    let udp = uroce::testing::free_port();
    let port = 7300 + (udp % 500);
    let server = uroce::testing::open("127.0.0.1", udp);
    let survivor = uroce::testing::open("127.0.0.2", udp);
    let listener = server.cm_listen(port).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_killed_processs_connection_is_ended_by_a_context_that_shares_its_device",
            "--nocapture",
        ])
        .env("UROCE_TEST_KILLED_CLIENT", format!("{udp}:{port}"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (_pd, _cq, qp) = rc_qp(&server);
    let conn = listener.accept(&qp, b"ok", T).unwrap();
    assert_eq!(&conn.private_data()[..6], b"doomed");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("connected") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the client ended before connecting");
    }
    // Its list is published within 100 ms of the connection (a progress
    // pass at least every 100 ms); a busy host gets some slack.
    std::thread::sleep(Duration::from_secs(1));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        conn.wait_disconnect(T).unwrap(),
        "no DREQ for the killed client's connection; counters:\n{}",
        counters(&[&server, &survivor])
    );
}

/// Every context's non-zero device counters, for a failure message.
fn counters(all: &[&Context]) -> String {
    all.iter()
        .map(|c| {
            let s = c.snapshot();
            let nz: Vec<String> = s
                .device_stats
                .iter()
                .filter(|(_, v)| *v != 0)
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            format!("{}: {}", c.device().socket_addr(), nz.join(" "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Connects from `client` to whoever listens on `port` at 127.0.0.1 and
/// returns what the listener's side saw as the private data. `all`: every
/// context, whose counters a failure shows.
fn cm_round(
    listener: uroce::cm::CmListener,
    on: Context,
    client: &Context,
    port: u16,
    all: &[&Context],
) -> Vec<u8> {
    const T: Duration = Duration::from_secs(10);
    let srv = std::thread::spawn(move || {
        let (_pd, _cq, qp) = rc_qp(&on);
        let conn = listener.accept(&qp, b"ok", T).unwrap();
        let got = conn.private_data()[..5].to_vec();
        assert!(conn.wait_disconnect(T).unwrap(), "the client disconnects");
        got
    });
    let (_pd, _cq, qp) = rc_qp(client);
    let conn = client
        .cm_connect(&qp, "127.0.0.1".parse().unwrap(), port, b"hello", T)
        .unwrap_or_else(|e| panic!("connecting: {e:?}; counters:\n{}", counters(all)));
    assert_eq!(&conn.private_data()[..2], b"ok");
    conn.disconnect(T).unwrap();
    srv.join().unwrap()
}

/// The connection manager on a shared address: a port has one listener
/// among the contexts (EADDRINUSE for a second, as on a host), a request
/// reaches the context that listens, and the answers reach the context
/// that asked, by the communication ID they carry, though every context
/// on both addresses runs a CM.
#[test]
fn the_cm_steers_requests_to_the_listener_and_answers_to_the_asker() {
    let udp = uroce::testing::free_port();
    let s1 = uroce::testing::open("127.0.0.1", udp);
    let s2 = uroce::testing::open("127.0.0.1", udp);
    let c1 = uroce::testing::open("127.0.0.2", udp);
    let c2 = uroce::testing::open("127.0.0.2", udp);
    for c in [&s1, &s2, &c1, &c2] {
        // Every context runs a CM agent (its own QP1 user).
        drop(c.cm_listen(1000 + c.device().socket_addr().port() % 1000).ok());
    }
    settle();
    let port = 7400 + (udp % 500);
    let l1 = s1.cm_listen(port).unwrap();
    assert!(
        matches!(s2.cm_listen(port), Err(uroce::Error::InUse(_))),
        "one listener per port on a shared address"
    );
    let all = [&s1, &s2, &c1, &c2];
    assert_eq!(cm_round(l1, s1.clone(), &c2, port, &all), b"hello");
    // The port is free again once its listener goes; now the other
    // context serves it, and the other client asks.
    let l2 = s2.cm_listen(port).unwrap();
    assert_eq!(cm_round(l2, s2.clone(), &c1, port, &all), b"hello");
}

/// Datagrams that look like steering probes, thousands of them and from
/// the device's own address (which a probe comes from), do not stop the
/// device: each receive call answers a bounded number and goes on.
#[test]
fn a_flood_of_probe_lookalikes_is_harmless() {
    let port = uroce::testing::free_port();
    let a1 = uroce::testing::open("127.0.0.1", port);
    let a2 = uroce::testing::open("127.0.0.1", port);
    let b = uroce::testing::open("127.0.0.2", port);
    settle();
    let e1 = end(&a1, "127.0.0.1", port);
    let f1 = end(&b, "127.0.0.2", port);
    connect(&e1, &f1);
    let flood = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..5000u32 {
        let mut p = b"uroce-pr".to_vec();
        p.extend_from_slice(&(i % 7).to_be_bytes());
        p.extend_from_slice(&(i % 100).to_be_bytes());
        let _ = flood.send_to(&p, ("127.0.0.1", port));
    }
    exchange(&e1, &f1, 37);
    exchange(&f1, &e1, 41);
    drop(a2);
}

/// Multicast on a shared address: every context with a QP attached to the
/// group gets its own copy of each datagram (the group's sockets are per
/// context, not steered), and a context that detaches stops getting them.
#[test]
fn each_sharing_context_gets_the_groups_datagrams() {
    let port = uroce::testing::free_port();
    let group: IpAddr = format!("239.78.{}.{}", port >> 8, port & 0xff).parse().unwrap();
    let ud = |ctx: &Context| {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let mr = pd.alloc_mr(8192, ALL).unwrap();
        let cap = QpCaps {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let qp = uroce::testing::ud_qp(&pd, &cq, cap, 0x5555, 1);
        (pd, cq, mr, qp)
    };
    let (r1, r2) =
        (uroce::testing::open("127.0.0.2", port), uroce::testing::open("127.0.0.2", port));
    let s = uroce::testing::open("127.0.0.1", port);
    settle();
    let (q1, q2, qs) = (ud(&r1), ud(&r2), ud(&s));
    let mut attr = uroce::AhAttr::new(group);
    attr.port = port;
    let ah = qs.0.create_ah(&attr).unwrap();
    qs.2.write(0, b"to both contexts").unwrap();
    let send = || {
        qs.3.post_send(&[SendWr {
            wr_id: 1,
            sgl: &[qs.2.sge(0, 16).unwrap()],
            ud: Some(ah.dest(0xff_ffff, 0x5555)),
            ..SendWr::default()
        }])
        .unwrap();
        assert_eq!(wait(&qs.1).status, WcStatus::Success);
    };
    for q in [&q1, &q2] {
        q.3.attach_mcast(group).unwrap();
        for i in 0..2 {
            q.3.post_recv(&[RecvWr {
                wr_id: i,
                sgl: &[q.2.sge(i as usize * 4096, 4096).unwrap()],
            }])
            .unwrap();
        }
    }
    send();
    for q in [&q1, &q2] {
        let c = wait(&q.1);
        assert_eq!((c.status, c.byte_len, c.src_qp), (WcStatus::Success, 56, qs.3.qpn()));
        let mut got = [0u8; 16];
        q.2.read(40, &mut got).unwrap();
        assert_eq!(&got, b"to both contexts");
    }
    // The second context leaves the group: the next datagram reaches only
    // the first (the second's receive stays posted and empty).
    q2.3.detach_mcast(group).unwrap();
    send();
    assert_eq!(wait(&q1.1).status, WcStatus::Success);
    std::thread::sleep(Duration::from_millis(200));
    let mut wc = [uroce::Completion::new(0, WcStatus::Success, uroce::WcOpcode::Send, 0, false)];
    assert_eq!(q2.1.poll(&mut wc).unwrap(), 0, "a detached context still gets the group");
}
