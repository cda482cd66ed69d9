//! XRC and on-demand regions on the seeded, lossy, duplicating,
//! reordering, corrupting virtual network, the whole verbs stack driven
//! with no thread and no real time: an XRC initiator on A reaches two XRC
//! SRQs of B's domain (two PDs, two CQs) through one target QP with
//! multi-packet SENDs, a WRITE into an on-demand region of the second
//! SRQ's PD, a READ of it back into an on-demand region of A, and
//! FETCH_ADDs on it. Every byte, every atomic result and each receive's
//! SRQ are checked; the same seed gives the same run bit for bit.

#![allow(unsafe_code)]

use std::net::IpAddr;
use std::time::Duration;

use uroce::testing::poll_all;
use uroce::{
    Access, LinkConfig, Mr, Pd, QpCaps, QpInitAttr, QpType, RecvWr, SendWr, SimNetwork, SrqAttr,
    WcOpcode, WcStatus, WrOpcode,
};

const ALL: Access = Access(1 | 2 | 4 | 8);
const ODP_LEN: usize = 256 * 1024;

/// An on-demand region over fresh anonymous pages that are never
/// touched here (the mapping lives for the rest of the test process).
fn on_demand(pd: &Pd) -> Mr {
    // SAFETY: a fresh private mapping, never unmapped, that no Rust
    // reference points into.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ODP_LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: as above; only the device and `Mr::read`/`write` reach it.
    unsafe { pd.register_on_demand(p as usize, ODP_LEN, p as u64, ALL) }.unwrap()
}

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
    let (ia, ib): (IpAddr, IpAddr) = ("10.9.1.1".parse().unwrap(), "10.9.1.2".parse().unwrap());
    let a = net.device("xa", ia, 4791).open().unwrap();
    let b = net.device("xb", ib, 4791).open().unwrap();
    let pa = a.alloc_pd().unwrap();
    let (pb1, pb2) = (b.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ca = a.create_cq(256).unwrap();
    let (cb1, cb2) = (b.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let cap = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let ini = pa
        .create_qp(&QpInitAttr {
            send_cq: &ca,
            recv_cq: &ca,
            cap,
            qp_type: QpType::XrcSend,
            sq_sig_all: true,
            srq: None,
        })
        .unwrap();
    let xrcd = b.open_xrcd().unwrap();
    let attr = SrqAttr { max_wr: 16, max_sge: 1, srq_limit: 0 };
    let srq1 = xrcd.create_srq(&pb1, &cb1, &attr).unwrap();
    let srq2 = xrcd.create_srq(&pb2, &cb2, &attr).unwrap();
    let tgt = xrcd.create_target_qp().unwrap();
    uroce::connect(&ini, ib, 4791, tgt.qpn(), 11, 22, ALL).unwrap();
    uroce::connect(&tgt, ia, 4791, ini.qpn(), 22, 11, ALL).unwrap();

    let src = pa.alloc_mr(1 << 20, ALL).unwrap();
    let back = on_demand(&pa);
    let remote = on_demand(&pb2);
    let (inbox1, inbox2) =
        (pb1.alloc_mr(1 << 16, ALL).unwrap(), pb2.alloc_mr(1 << 16, ALL).unwrap());
    let data: Vec<u8> =
        (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    src.write(0, &data).unwrap();
    remote.write(200_000, &5u64.to_le_bytes()).unwrap();
    for i in 0..4u64 {
        let off = 8192 * i as usize;
        srq1.post_recv(&[RecvWr { wr_id: 100 + i, sgl: &[inbox1.sge(off, 8192).unwrap()] }])
            .unwrap();
        srq2.post_recv(&[RecvWr { wr_id: 200 + i, sgl: &[inbox2.sge(off, 8192).unwrap()] }])
            .unwrap();
    }

    // WRITE 100 kB into B's on-demand region (PD 2, named through SRQ 2),
    // READ it back into A's, 8 FETCH_ADDs on it, and 8 SENDs alternating
    // between the SRQs, 700 B to 6 kB each.
    let w = [src.sge(0, 100_000).unwrap()];
    let r = [back.sge(0, 100_000).unwrap()];
    let mut wrs = vec![
        SendWr {
            wr_id: 1,
            opcode: WrOpcode::RdmaWrite,
            sgl: &w,
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
            xrc_srqn: srq2.handle(),
            ..SendWr::default()
        },
        SendWr {
            wr_id: 2,
            opcode: WrOpcode::RdmaRead,
            sgl: &r,
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
            xrc_srqn: srq2.handle(),
            ..SendWr::default()
        },
    ];
    let olds: Vec<[uroce::Sge; 1]> =
        (0..8).map(|i| [back.sge(150_000 + 8 * i, 8).unwrap()]).collect();
    for (i, o) in olds.iter().enumerate() {
        wrs.push(SendWr {
            wr_id: 10 + i as u64,
            opcode: WrOpcode::AtomicFetchAndAdd,
            sgl: o,
            remote_addr: remote.addr() + 200_000,
            rkey: remote.rkey(),
            compare_add: 4,
            xrc_srqn: srq2.handle(),
            ..SendWr::default()
        });
    }
    let sends: Vec<[uroce::Sge; 1]> =
        (0..8).map(|i| [src.sge(120_000 + 7000 * i, 700 + 700 * i as u32).unwrap()]).collect();
    for (i, s) in sends.iter().enumerate() {
        let srqn = if i % 2 == 0 { srq1.handle() } else { srq2.handle() };
        wrs.push(SendWr { wr_id: 40 + i as u64, sgl: s, xrc_srqn: srqn, ..SendWr::default() });
    }
    ini.post_send(&wrs).unwrap();

    let both = [&a, &b];
    let (mut da, mut d1, mut d2) = (vec![], vec![], vec![]);
    let ok = net.run_until(&both, Duration::from_secs(30), || {
        poll_all(&ca, &mut da);
        poll_all(&cb1, &mut d1);
        poll_all(&cb2, &mut d2);
        da.len() >= wrs.len() && d1.len() >= 4 && d2.len() >= 4
    });
    assert!(
        ok,
        "seed {seed}: stalled at {} / {} / {}\n{d1:?}\n{d2:?}\n{:?}\n{:?}",
        da.len(),
        d1.len(),
        d2.len(),
        b.stats(),
        net.stats()
    );
    assert!(da.iter().all(|c| c.status == WcStatus::Success), "seed {seed}: {da:?}");
    let mut got = vec![0u8; 100_000];
    remote.read(0, &mut got).unwrap();
    assert!(got == data[..100_000], "seed {seed}: WRITE into the on-demand region");
    back.read(0, &mut got).unwrap();
    assert!(got == data[..100_000], "seed {seed}: READ into the on-demand region");
    // Each FETCH_ADD ran once, in order: 5, 9, 13, ...
    for i in 0..8 {
        let mut v = [0u8; 8];
        back.read(150_000 + 8 * i, &mut v).unwrap();
        assert_eq!(u64::from_le_bytes(v), 5 + 4 * i as u64, "seed {seed}: FETCH_ADD {i}");
    }
    let mut v = [0u8; 8];
    remote.read(200_000, &mut v).unwrap();
    assert_eq!(u64::from_le_bytes(v), 37, "seed {seed}: atomics applied once");
    // Even SENDs in SRQ 1's buffers, odd ones in SRQ 2's, in order, each
    // completion on its SRQ's CQ under the target QP's number.
    for (k, (c1, c2)) in d1.iter().zip(&d2).enumerate() {
        for (c, srq, inbox, i) in [(c1, 100, &inbox1, 2 * k), (c2, 200, &inbox2, 2 * k + 1)] {
            let len = 700 + 700 * i;
            assert_eq!(
                (c.status, c.opcode, c.wr_id, c.byte_len as usize, c.qp_num),
                (WcStatus::Success, WcOpcode::Recv, srq + k as u64, len, tgt.qpn()),
                "seed {seed}: SEND {i}"
            );
            let mut got = vec![0u8; len];
            inbox.read(8192 * k, &mut got).unwrap();
            assert!(got == data[120_000 + 7000 * i..][..len], "seed {seed}: SEND {i}'s bytes");
        }
    }

    let mut t = String::new();
    for c in da.iter().chain(&d1).chain(&d2) {
        t += &format!("{} {:?} {:?} {} {}\n", c.wr_id, c.status, c.opcode, c.byte_len, c.qp_num);
    }
    t += &format!("{:?}\n{:?}\n{:?}\nnow {:?}\n", a.stats(), b.stats(), net.stats(), net.now());
    t
}

#[test]
fn xrc_and_on_demand_regions_survive_a_lossy_network_bit_for_bit() {
    let first = run(77);
    assert!(first == run(77), "two runs of seed 77 differ");
    assert!(!first.contains("lost: 0,"), "the network lost nothing:\n{first}");
    let seeds: u64 =
        std::env::var("UROCE_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    for seed in 0..(seeds / 2).max(20) {
        run(seed);
    }
}
