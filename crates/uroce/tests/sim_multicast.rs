//! UD multicast on the virtual clock: three contexts on a seeded, lossy,
//! duplicating, corrupting `sim` network, one sending to a group that
//! QPs of all three are attached to (the sender's own too: a member hears
//! its own group's datagrams, as with `IP_MULTICAST_LOOP`). Every QP
//! attached receives the same datagrams (faults are drawn once per
//! datagram, before it is copied to the members), each intact with the
//! group in its GRH; a detached QP, and a context that left the group,
//! receive nothing more; the same seed gives the same run bit for bit.

use std::net::IpAddr;
use std::time::Duration;

use uroce::testing::poll_all;
use uroce::{
    Access, Completion, Cq, LinkConfig, QpCaps, QpInitAttr, QpType, RecvWr, SendWr, SimNetwork,
    WcStatus,
};

const ALL: Access = Access(1 | 2 | 4 | 8);
const QKEY: u32 = 0x0123_4567;
const GRH: usize = 40;
const LEN: usize = 300;

/// The datagram number `i` sent (its bytes say which it is).
fn datagram(i: usize) -> Vec<u8> {
    (0..LEN).map(|k| (i * 31 + k * 7) as u8).collect()
}

/// One seeded run; returns its trace (what must repeat bit for bit).
fn run(seed: u64) -> String {
    let link = LinkConfig {
        loss: 0.1,
        duplicate: 0.05,
        corrupt: 0.02,
        delay: Duration::from_micros(10),
        jitter: Duration::from_micros(5),
        ..LinkConfig::default()
    };
    let net = SimNetwork::new_virtual(seed, link);
    let group: IpAddr = "239.9.9.9".parse().unwrap();
    let addrs: [IpAddr; 3] =
        ["10.9.1.1", "10.9.1.2", "10.9.1.3"].map(|a| a.parse::<IpAddr>().unwrap());
    let ctxs: Vec<uroce::Context> = addrs
        .iter()
        .enumerate()
        .map(|(i, &a)| net.device(&format!("m{i}"), a, 4791).open().unwrap())
        .collect();
    let pds: Vec<uroce::Pd> = ctxs.iter().map(|c| c.alloc_pd().unwrap()).collect();
    let mrs: Vec<uroce::Mr> = pds.iter().map(|p| p.alloc_mr(1 << 20, ALL).unwrap()).collect();
    let cqs: Vec<Cq> = ctxs.iter().map(|c| c.create_cq(512).unwrap()).collect();
    let cap = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 128,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let ud = |i: usize| {
        let attr = QpInitAttr {
            send_cq: &cqs[i],
            recv_cq: &cqs[i],
            cap,
            qp_type: QpType::Ud,
            sq_sig_all: true,
            srq: None,
        };
        let qp = pds[i].create_qp(&attr).unwrap();
        uroce::activate_ud(&qp, QKEY, 1).unwrap();
        qp
    };
    // Members: the sender's own QP (context 0), two QPs of context 1, one
    // of context 2. Each has its own 64 KiB of its context's region.
    let sender = ud(0);
    let members = [(0, ud(0)), (1, ud(1)), (1, ud(1)), (2, ud(2))];
    for (m, (ctx, qp)) in members.iter().enumerate() {
        qp.attach_mcast(group).unwrap();
        let base = 65_536 * (m + 1);
        for k in 0..100 {
            let sge = mrs[*ctx].sge(base + 640 * k, (GRH + LEN) as u32).unwrap();
            qp.post_recv(&[RecvWr { wr_id: (m * 1000 + k) as u64, sgl: &[sge] }]).unwrap();
        }
    }
    let refs: Vec<&uroce::Context> = ctxs.iter().collect();
    let mut done: Vec<Vec<Completion>> = vec![Vec::new(); 3];
    let mut ah_attr = uroce::AhAttr::new(group);
    ah_attr.port = 4791;
    let ah = pds[0].create_ah(&ah_attr).unwrap();
    let send = |from: usize, count: usize, done: &mut Vec<Vec<Completion>>| {
        for i in from..from + count {
            mrs[0].write(640 * i, &datagram(i)).unwrap();
        }
        let sges: Vec<[uroce::Sge; 1]> =
            (from..from + count).map(|i| [mrs[0].sge(640 * i, LEN as u32).unwrap()]).collect();
        let wrs: Vec<SendWr> = sges
            .iter()
            .enumerate()
            .map(|(k, s)| SendWr {
                wr_id: (from + k) as u64,
                sgl: s,
                ud: Some(ah.dest(0xff_ffff, QKEY)),
                ..SendWr::default()
            })
            .collect();
        sender.post_send(&wrs).unwrap();
        // Long enough for every datagram and its duplicates to land.
        net.run_until(&refs, Duration::from_millis(20), || {
            for (c, d) in cqs.iter().zip(done.iter_mut()) {
                poll_all(c, d);
            }
            false
        });
    };
    send(0, 40, &mut done);
    // Then one QP of context 1 detaches and context 2's only QP leaves the
    // group (so its context leaves it): 20 more.
    members[2].1.detach_mcast(group).unwrap();
    members[3].1.detach_mcast(group).unwrap();
    assert!(members[3].1.detach_mcast(group).is_err(), "detached already");
    send(40, 20, &mut done);

    // What each member received: the datagram numbers, in order.
    let sends: Vec<&Completion> = done[0].iter().filter(|c| !c.is_recv).collect();
    assert_eq!(sends.len(), 60, "seed {seed}: every send completes");
    assert!(sends.iter().all(|c| c.status == WcStatus::Success), "seed {seed}");
    let mut heard: Vec<Vec<usize>> = vec![Vec::new(); members.len()];
    for (m, (ctx, qp)) in members.iter().enumerate() {
        let base = 65_536 * (m + 1);
        for c in done[*ctx].iter().filter(|c| c.is_recv && c.qp_num == qp.qpn()) {
            assert_eq!((c.status, c.byte_len), (WcStatus::Success, (GRH + LEN) as u32));
            assert_eq!(c.src_qp, sender.qpn(), "seed {seed}");
            let k = c.wr_id as usize - m * 1000;
            let mut got = vec![0u8; GRH + LEN];
            mrs[*ctx].read(base + 640 * k, &mut got).unwrap();
            let IpAddr::V4(g) = group else { unreachable!() };
            assert_eq!(&got[36..40], &g.octets(), "seed {seed}: the GRH names the group");
            let i = (0..60).find(|&i| got[GRH..] == datagram(i)[..]);
            let Some(i) = i else { panic!("seed {seed}: member {m} got bytes nobody sent") };
            heard[m].push(i);
        }
    }
    // Everyone attached heard the same; the detached heard only the first 40.
    assert!(heard[0].iter().any(|&i| i >= 40), "seed {seed}: nothing after the detach");
    assert_eq!(heard[0], heard[1], "seed {seed}: members of one group hear the same");
    let first: Vec<usize> = heard[0].iter().copied().filter(|&i| i < 40).collect();
    assert_eq!(heard[2], first, "seed {seed}: a detached QP hears nothing more");
    assert_eq!(heard[3], first, "seed {seed}: a context that left hears nothing more");
    let lost = (0..60).filter(|i| !heard[0].contains(i)).count();

    let mut t = format!("heard {:?}\nlost {lost}\n", heard);
    for d in &done {
        for c in d {
            t += &format!("{} {:?} {} {}\n", c.wr_id, c.status, c.byte_len, c.qp_num);
        }
    }
    t += &format!("{:?}\nnow {:?}\n", net.stats(), net.now());
    t
}

#[test]
fn multicast_on_the_virtual_clock_repeats_bit_for_bit() {
    let first = run(77);
    if std::env::var_os("UROCE_SIM_TRACE").is_some() {
        eprintln!("{first}");
    }
    assert_eq!(first, run(77), "two runs of seed 77 differ");
    assert!(first != run(78), "another seed, another run");
    let lost: usize = first.lines().nth(1).unwrap()[5..].parse().unwrap();
    assert!(lost > 0, "the network lost nothing:\n{first}");
}

#[test]
fn every_seed_delivers_the_same_datagrams_to_every_member() {
    for seed in 0..20 {
        run(seed);
    }
}
