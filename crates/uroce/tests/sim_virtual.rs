//! The whole verbs stack on a virtual clock: two contexts on a seeded,
//! lossy, duplicating, reordering, corrupting `sim` network, driven by
//! `SimNetwork::run_until` with no thread and no real time. RC WRITE, READ
//! and FETCH_ADD, SENDs into an SRQ, a memory window, UD datagrams and a
//! completion channel, every byte and every atomic result checked. The
//! same seed gives the same run bit for bit: every completion, counter,
//! key and the virtual time it took.

use std::net::IpAddr;
use std::time::Duration;

use uroce::testing::poll_all;
use uroce::{
    Access, Completion, Cq, LinkConfig, MwType, QpCaps, QpInitAttr, QpType, RecvWr, SendWr,
    SimNetwork, SrqAttr, WcStatus, WrOpcode,
};

const ALL: Access = Access(1 | 2 | 4 | 8);
const MW_BIND: Access = Access(1 | 2 | 4 | 8 | 16);
const QKEY: u32 = 0x1111_2222;

/// One seeded run; returns its trace (what must repeat bit for bit).
fn run(seed: u64) -> String {
    let link = LinkConfig {
        loss: 0.03,
        duplicate: 0.02,
        reorder: 0.05,
        corrupt: 0.005,
        delay: Duration::from_micros(20),
        ..LinkConfig::default()
    };
    let net = SimNetwork::new_virtual(seed, link);
    let (ia, ib): (IpAddr, IpAddr) = ("10.9.0.1".parse().unwrap(), "10.9.0.2".parse().unwrap());
    let a = net.device("va", ia, 4791).open().unwrap();
    let b = net.device("vb", ib, 4791).open().unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ma, mb) = (pa.alloc_mr(1 << 20, ALL).unwrap(), pb.alloc_mr(1 << 20, ALL).unwrap());
    let ca = a.create_cq(256).unwrap();
    let channel = b.create_comp_channel().unwrap();
    channel.set_nonblocking(true).unwrap();
    let cb = b.create_cq_with(256, Some(&channel)).unwrap();
    let srq = b.create_srq(&SrqAttr { max_wr: 32, max_sge: 1, srq_limit: 0 }).unwrap();
    let cap = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    fn init<'a>(
        cq: &'a Cq,
        qp_type: QpType,
        srq: Option<&'a uroce::Srq>,
        cap: QpCaps,
    ) -> QpInitAttr<'a> {
        QpInitAttr { send_cq: cq, recv_cq: cq, cap, qp_type, sq_sig_all: true, srq }
    }
    let qa = pa.create_qp(&init(&ca, QpType::Rc, None, cap)).unwrap();
    let qb = pb.create_qp(&init(&cb, QpType::Rc, Some(&srq), cap)).unwrap();
    let ua = pa.create_qp(&init(&ca, QpType::Ud, None, cap)).unwrap();
    let ub = pb.create_qp(&init(&cb, QpType::Ud, None, cap)).unwrap();
    uroce::connect(&qa, ib, 4791, qb.qpn(), 11, 22, ALL).unwrap();
    uroce::connect(&qb, ia, 4791, qa.qpn(), 22, 11, ALL).unwrap();
    uroce::activate_ud(&ua, QKEY, 1).unwrap();
    uroce::activate_ud(&ub, QKEY, 2).unwrap();
    let (mut da, mut db) = (vec![], vec![]);
    let both = [&a, &b];
    let settle = |da: &mut Vec<Completion>, db: &mut Vec<Completion>, n_a: usize, n_b: usize| {
        let ok = net.run_until(&both, Duration::from_secs(30), || {
            poll_all(&ca, da);
            poll_all(&cb, db);
            da.len() >= n_a && db.len() >= n_b
        });
        assert!(ok, "seed {seed}: stalled at {} / {} completions", da.len(), db.len());
    };

    // A memory window on B, bound by B's QP (type 1), written through by A.
    let mw = pb.alloc_mw(MwType::Type1).unwrap();
    let mb_bind = pb.alloc_mr(8192, MW_BIND).unwrap();
    let mw_rkey = qb.bind_mw(&mw, &mb_bind, 1024, 4096, ALL, 900).unwrap();
    settle(&mut da, &mut db, 0, 1);

    // RC: WRITE 200 kB, READ it back, 10 FETCH_ADDs, a WRITE through the
    // window, 8 SENDs into the SRQ.
    let data: Vec<u8> =
        (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    ma.write(0, &data).unwrap();
    mb.write(1 << 19, &7u64.to_le_bytes()).unwrap();
    for i in 0..8 {
        srq.post_recv(&[RecvWr {
            wr_id: 500 + i,
            sgl: &[mb.sge(300_000 + 8192 * i as usize, 8192).unwrap()],
        }])
        .unwrap();
    }
    cb.req_notify(false).unwrap();
    let sge = [ma.sge(0, data.len() as u32).unwrap()];
    let back = [ma.sge(400_000, data.len() as u32).unwrap()];
    let mut wrs = vec![
        SendWr {
            wr_id: 1,
            opcode: WrOpcode::RdmaWrite,
            sgl: &sge,
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
            ..SendWr::default()
        },
        SendWr {
            wr_id: 2,
            opcode: WrOpcode::RdmaRead,
            sgl: &back,
            remote_addr: mb.addr(),
            rkey: mb.rkey(),
            ..SendWr::default()
        },
    ];
    let results: Vec<[uroce::Sge; 1]> =
        (0..10).map(|i| [ma.sge(700_000 + 8 * i, 8).unwrap()]).collect();
    for (i, r) in results.iter().enumerate() {
        wrs.push(SendWr {
            wr_id: 10 + i as u64,
            opcode: WrOpcode::AtomicFetchAndAdd,
            sgl: r,
            remote_addr: mb.addr() + (1 << 19),
            rkey: mb.rkey(),
            compare_add: 3,
            ..SendWr::default()
        });
    }
    let via_mw = [ma.sge(100, 64).unwrap()];
    wrs.push(SendWr {
        wr_id: 30,
        opcode: WrOpcode::RdmaWrite,
        sgl: &via_mw,
        remote_addr: mb_bind.addr() + 2048,
        rkey: mw_rkey,
        ..SendWr::default()
    });
    let sends: Vec<[uroce::Sge; 1]> =
        (0..8).map(|i| [ma.sge(1000 * i, 100 + 999 * i as u32).unwrap()]).collect();
    for (i, s) in sends.iter().enumerate() {
        wrs.push(SendWr {
            wr_id: 40 + i as u64,
            opcode: WrOpcode::Send,
            sgl: s,
            ..SendWr::default()
        });
    }
    qa.post_send(&wrs).unwrap();
    settle(&mut da, &mut db, wrs.len(), 1 + 8);
    assert!(da.iter().all(|c| c.status == WcStatus::Success), "seed {seed}: {da:?}");
    assert!(db.iter().all(|c| c.status == WcStatus::Success), "seed {seed}: {db:?}");
    let mut got = vec![0u8; data.len()];
    mb.read(0, &mut got).unwrap();
    assert!(got == data, "seed {seed}: WRITE");
    ma.read(400_000, &mut got).unwrap();
    assert!(got == data, "seed {seed}: READ");
    // FETCH_ADDs execute once each, in order: 7, 10, 13, ...
    for i in 0..10 {
        let mut v = [0u8; 8];
        ma.read(700_000 + 8 * i, &mut v).unwrap();
        assert_eq!(u64::from_le_bytes(v), 7 + 3 * i as u64, "seed {seed}: FETCH_ADD {i}");
    }
    let mut v = [0u8; 8];
    mb.read(1 << 19, &mut v).unwrap();
    assert_eq!(u64::from_le_bytes(v), 37, "seed {seed}: atomics applied once");
    let mut w = vec![0u8; 64];
    mb_bind.read(2048, &mut w).unwrap();
    assert_eq!(w, data[100..164], "seed {seed}: WRITE through the window");
    let recvs: Vec<&Completion> = db.iter().filter(|c| c.is_recv).collect();
    assert_eq!(recvs.len(), 8);
    for (k, c) in recvs.iter().enumerate() {
        assert_eq!((c.wr_id, c.byte_len), (500 + k as u64, 100 + 999 * k as u32), "seed {seed}");
        let mut got = vec![0u8; c.byte_len as usize];
        mb.read(300_000 + 8192 * k, &mut got).unwrap();
        assert!(got == data[1000 * k..1000 * k + got.len()], "seed {seed}: SEND {k}");
    }
    assert!(channel.pending() >= 1, "seed {seed}: the armed CQ raised an event");

    // UD: 6 datagrams, some may be lost; those that arrive are intact.
    let ah = pa.create_ah(&uroce::AhAttr::new(ib)).unwrap();
    for i in 0..6 {
        ub.post_recv(&[RecvWr {
            wr_id: 600 + i,
            sgl: &[mb.sge(800_000 + 2048 * i as usize, 40 + 1024).unwrap()],
        }])
        .unwrap();
    }
    let n_before = db.len();
    let ud: Vec<[uroce::Sge; 1]> = (0..6).map(|i| [ma.sge(5000 + 7 * i, 900).unwrap()]).collect();
    let wrs: Vec<SendWr> = ud
        .iter()
        .enumerate()
        .map(|(i, s)| SendWr {
            wr_id: 60 + i as u64,
            sgl: s,
            ud: Some(ah.dest(ub.qpn(), QKEY)),
            ..SendWr::default()
        })
        .collect();
    ua.post_send(&wrs).unwrap();
    let done_a = da.len() + 6;
    net.run_until(&both, Duration::from_millis(50), || {
        poll_all(&ca, &mut da);
        poll_all(&cb, &mut db);
        false
    });
    assert_eq!(da.len(), done_a, "seed {seed}: UD sends complete");
    // Receives are taken in order, so the k-th arrival is in buffer k;
    // which datagram it holds is in its first bytes.
    for c in &db[n_before..] {
        let k = (c.wr_id - 600) as usize;
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 40 + 900), "seed {seed}");
        let mut got = vec![0u8; 900];
        mb.read(800_000 + 2048 * k + 40, &mut got).unwrap();
        let sent = (0..6).find(|i| got == data[5000 + 7 * i..5000 + 7 * i + 900]);
        assert!(sent.is_some(), "seed {seed}: UD receive {k} holds no datagram that was sent");
    }

    // The trace: every completion, the counters, keys and virtual time.
    let mut t = String::new();
    for c in da.iter().chain(&db) {
        t += &format!("{} {:?} {:?} {} {}\n", c.wr_id, c.status, c.opcode, c.byte_len, c.qp_num);
    }
    t += &format!("{:?}\n{:?}\n{:?}\n", a.stats(), b.stats(), net.stats());
    t += &format!("keys {} {} {} now {:?}\n", ma.rkey(), mb.rkey(), mw_rkey, net.now());
    t
}

#[test]
fn the_same_seed_gives_the_same_run_bit_for_bit() {
    let first = run(1234);
    if std::env::var_os("UROCE_SIM_TRACE").is_some() {
        eprintln!("{first}");
    }
    let second = run(1234);
    assert!(first == second, "two runs of seed 1234 differ:\n{first}\n---\n{second}");
    assert!(!first.contains("lost: 0,"), "the network lost nothing:\n{first}");
    assert!(first != run(1235), "another seed, another run");
}

#[test]
fn every_seed_completes_with_the_right_bytes() {
    let seeds: u64 =
        std::env::var("UROCE_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    for seed in 0..(seeds / 20).max(20) {
        run(seed);
    }
}
