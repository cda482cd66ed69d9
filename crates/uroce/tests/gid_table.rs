//! The GID table lists the addresses of the device's interface, and every
//! GID carries traffic: on loopback (`127.0.0.1` pairs with `::1`), and on a
//! veth interface in a network namespace of the test's own, where GID 1 is
//! the IPv6 link-local address and the table follows addresses added and
//! removed while the context is open.

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use uroce::{
    Access, AhAttr, Completion, Context, Cq, Mr, Qp, QpCaps, QpInitAttr, QpType, RecvWr, SendWr,
    WcStatus, WrOpcode,
};

const ALL: Access = Access(1 | 2 | 4 | 8);
const ROLE: &str = "UROCE_GID_ROLE";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn wait(cq: &Cq, what: &str) -> Completion {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut wc = [Completion::new(0, WcStatus::Success, uroce::WcOpcode::Send, 0, false)];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            let c = wc[0];
            assert_eq!(c.status, WcStatus::Success, "{what}: {c:?}");
            return c;
        }
        assert!(Instant::now() < deadline, "{what}: no completion");
        std::thread::yield_now();
    }
}

struct End {
    ctx: Context,
    qp: Qp,
    cq: Cq,
    mr: Mr,
}

fn end(addr: &str, port: u16) -> End {
    let ctx =
        if port == 0 { uroce::testing::open_any(addr) } else { uroce::testing::open(addr, port) };
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(1 << 20, ALL).unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let cap = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = uroce::testing::rc_qp(&pd, &cq, cap, true);
    End { ctx, qp, cq, mr }
}

/// Connects `a` and `b` over their GIDs `ga` and `gb`, WRITEs 256 KiB and
/// SENDs 3000 bytes, every byte checked; returns the GID indices the QPs
/// chose as sources.
fn rc_over(a: &End, b: &End, ga: IpAddr, gb: IpAddr) -> (u8, u8) {
    let (pa, pb) = (a.ctx.device().socket_addr().port(), b.ctx.device().socket_addr().port());
    uroce::connect(&a.qp, gb, pb, b.qp.qpn(), 7, 9, ALL).unwrap();
    uroce::connect(&b.qp, ga, pa, a.qp.qpn(), 9, 7, ALL).unwrap();
    let (sa, sb) = (a.qp.query().path.unwrap(), b.qp.query().path.unwrap());
    let data: Vec<u8> = (0..256 << 10).map(|i: u32| (i * 7 + i / 251) as u8).collect();
    a.mr.write(0, &data).unwrap();
    a.qp.post_send(&[SendWr {
        opcode: WrOpcode::RdmaWrite,
        sgl: &[a.mr.sge(0, data.len() as u32).unwrap()],
        remote_addr: b.mr.addr() + 4096,
        rkey: b.mr.rkey(),
        ..SendWr::default()
    }])
    .unwrap();
    wait(&a.cq, "WRITE");
    let mut got = vec![0; data.len()];
    b.mr.read(4096, &mut got).unwrap();
    assert!(got == data, "WRITE over {ga} -> {gb}: bytes differ");
    b.qp.post_recv(&[RecvWr { wr_id: 5, sgl: &[b.mr.sge(512 << 10, 4096).unwrap()] }]).unwrap();
    a.qp.post_send(&[SendWr { sgl: &[a.mr.sge(100, 3000).unwrap()], ..SendWr::default() }])
        .unwrap();
    wait(&a.cq, "SEND");
    let c = wait(&b.cq, "RECV");
    assert_eq!(c.byte_len, 3000);
    let mut got = vec![0; 3000];
    b.mr.read(512 << 10, &mut got).unwrap();
    assert!(got == data[100..3100], "SEND over {ga} -> {gb}: bytes differ");
    (sa.sgid_index, sb.sgid_index)
}

/// The tests that bind `::1` on their ports run one at a time (a port
/// free when chosen may be taken on `::1` by another test's GID meanwhile).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn loopback_lists_both_families_and_rc_runs_over_gid_1() {
    let _serial = one_at_a_time();
    let a = end("127.0.0.1", 0);
    let b = end("127.0.0.1", 0);
    assert_eq!(a.ctx.gid_table(), [(0, ip("127.0.0.1")), (1, ip("::1"))]);
    assert_eq!(a.ctx.query_port(1).unwrap().gid_tbl_len, 2);
    assert_eq!(a.ctx.query_gid(1, 1).unwrap(), std::net::Ipv6Addr::LOCALHOST.octets());
    assert!(a.ctx.query_gid(1, 2).is_err(), "past the table");
    let (sa, sb) = rc_over(&a, &b, ip("::1"), ip("::1"));
    assert_eq!((sa, sb), (1, 1), "::1 is reached from GID 1");
}

#[test]
fn a_source_gid_must_exist_and_match_the_destination_family() {
    let a = end("127.0.0.2", 0);
    let port = a.ctx.device().socket_addr().port();
    let t = a.ctx.gid_table();
    assert_eq!(t, [(0, ip("127.0.0.2")), (1, ip("::1"))], "other 127/8 addresses are not ours");
    let pd = a.ctx.alloc_pd().unwrap();
    let mut ah = AhAttr::new(ip("127.0.0.1"));
    ah.sgid_index = 1;
    assert!(pd.create_ah(&ah).is_err(), "IPv4 destination from an IPv6 GID");
    ah.sgid_index = 2;
    assert!(pd.create_ah(&ah).is_err(), "GID index past the table");
    ah.sgid_index = 0;
    pd.create_ah(&ah).unwrap();
    let mut attr = uroce::QpAttr { state: uroce::QpState::Init, access: ALL, ..Default::default() };
    use uroce::AttrMask as M;
    a.qp.modify(&attr, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS).unwrap();
    attr.state = uroce::QpState::ReadyToReceive;
    attr.path = Some(uroce::Path {
        dst: ip("127.0.0.1"),
        dst_port: port,
        sgid_index: 1,
        flow_label: 0,
        hop_limit: 64,
        traffic_class: 0,
    });
    attr.dest_qpn = 0x11;
    let mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    let mask = mask | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    let e = a.qp.modify(&attr, mask).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
}

#[test]
fn ud_datagrams_leave_from_the_ahs_source_gid() {
    let _serial = one_at_a_time();
    let ctx = uroce::testing::open_any("127.0.0.1");
    let port = ctx.device().socket_addr().port();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(1 << 16, ALL).unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let cap = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type: QpType::Ud,
            sq_sig_all: true,
            srq: None,
        })
        .unwrap();
    uroce::activate_ud(&qp, 0x1234, 0).unwrap();
    let mut attr = AhAttr::new(ip("::1"));
    attr.port = port;
    attr.sgid_index = 1;
    let ah = pd.create_ah(&attr).unwrap();
    qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[mr.sge(0, 40 + 256).unwrap()] }]).unwrap();
    mr.write(8192, b"over ::1").unwrap();
    qp.post_send(&[SendWr {
        sgl: &[mr.sge(8192, 8).unwrap()],
        ud: Some(ah.dest(qp.qpn(), 0x1234)),
        ..SendWr::default()
    }])
    .unwrap();
    let mut seen = vec![];
    while seen.len() < 2 {
        seen.push(wait(&cq, "UD"));
    }
    let recv = seen.iter().find(|c| c.is_recv).expect("the datagram arrived");
    let mut grh = [0u8; 40];
    mr.read(0, &mut grh).unwrap();
    let back = AhAttr::from_wc(recv, &grh).unwrap();
    assert_eq!(back.dst, ip("::1"), "the GRH holds an IPv6 header from ::1");
    assert_eq!(grh[0] >> 4, 6, "IPv6 GRH");
    assert_eq!(ctx.gid_index_of(ip("::1")), Some(1));
}

// ---- veth in a namespace of the test's own ----

fn sh(args: &[&str]) -> bool {
    Command::new(args[0]).args(&args[1..]).status().is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        sh(&["ip", "netns", "del", &self.0]);
    }
}

/// Inside the namespace: `ga0` on 10.232.0.1 and `gb0` on 10.232.0.2, the
/// two ends of one veth pair, link-local addresses without DAD.
fn inside() {
    let a = end("10.232.0.1", 4791);
    let b = end("10.232.0.2", 4791);
    let ta = a.ctx.gid_table();
    assert_eq!(ta[0], (0, ip("10.232.0.1")), "{ta:?}");
    let ll_a = ta[1].1;
    assert!(
        matches!(ll_a, IpAddr::V6(v) if v.segments()[0] == 0xfe80),
        "GID 1 is link-local: {ta:?}"
    );
    let ll_b = b.ctx.gid_table()[1].1;
    assert_ne!(ll_a, ll_b);
    let (sa, sb) = rc_over(&a, &b, ll_a, ll_b);
    assert_eq!((sa, sb), (1, 1), "link-local peers are reached from the link-local GID");

    // Addresses come and go while the context is open.
    let until = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "{what}: {:?}", a.ctx.gid_table());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert!(sh(&["ip", "addr", "add", "fd99::1/64", "dev", "ga0", "nodad"]));
    assert!(sh(&["ip", "addr", "add", "10.232.1.1/24", "dev", "ga0"]));
    until("both new addresses listed", &|| {
        let t = a.ctx.gid_table();
        t.contains(&(2, ip("10.232.1.1"))) && t.contains(&(3, ip("fd99::1")))
    });
    assert!(sh(&["ip", "addr", "del", "10.232.1.1/24", "dev", "ga0"]));
    until("the removed address leaves an empty slot", &|| a.ctx.gid_entry(1, 2).unwrap().is_none());
    assert_eq!(a.ctx.query_gid(1, 2).unwrap(), [0; 16], "an empty slot reads as zeros");
    assert_eq!(a.ctx.gid_index_of(ip("fd99::1")), Some(3), "indices stay put");
    assert_eq!(a.ctx.query_port(1).unwrap().gid_tbl_len, 4);
    println!("inside: ok");
}

#[test]
fn a_veth_device_lists_its_link_local_address_and_follows_changes() {
    if std::env::var(ROLE).as_deref() == Ok("inside") {
        return inside();
    }
    if !is_root() || !Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success()) {
        assert!(std::env::var_os("CI").is_none(), "needs root and iproute2 under CI");
        eprintln!("not root: skipped");
        return;
    }
    let ns = Ns(format!("uroce-gid{}", std::process::id() % 100_000));
    let n = ns.0.as_str();
    let ok = sh(&["ip", "netns", "add", n])
        && sh(&["ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"])
        && sh(&["ip", "-n", n, "link", "add", "ga0", "type", "veth", "peer", "name", "gb0"])
        && sh(&["ip", "-n", n, "addr", "add", "10.232.0.1/24", "dev", "ga0"])
        && sh(&["ip", "-n", n, "addr", "add", "10.232.0.2/24", "dev", "gb0"])
        && sh(&["ip", "-n", n, "link", "set", "ga0", "up"])
        && sh(&["ip", "-n", n, "link", "set", "gb0", "up"])
        && sh(&["ip", "-n", n, "link", "set", "lo", "up"]);
    assert!(ok, "namespace and veth");
    // The link-local addresses appear once the links are up.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !String::from_utf8_lossy(
        &Command::new("ip")
            .args(["-n", n, "-6", "addr", "show", "dev", "gb0"])
            .output()
            .unwrap()
            .stdout,
    )
    .contains("fe80")
    {
        assert!(Instant::now() < deadline, "no link-local address on gb0");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = Command::new("ip")
        .args(["netns", "exec", n])
        .arg(std::env::current_exe().unwrap())
        .args([
            "a_veth_device_lists_its_link_local_address_and_follows_changes",
            "--exact",
            "--nocapture",
        ])
        .env(ROLE, "inside")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("inside: ok"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
