//! Deterministic simulation under faults: random RC workloads in both
//! directions over links that lose, duplicate, reorder and corrupt packets
//! (SEND, WRITE, READ, atomics, and IBA 1.5's ATOMIC WRITE and FLUSH).
//! Every WR must complete exactly once, in order, successfully, with the
//! right bytes at the target and nothing written outside a region.
//!
//! `UROCE_SIM_SEEDS=N` sets the number of seeds (default 300; use 100000
//! for a soak), `UROCE_SIM_SEED=S` runs one seed (to replay a failure).

use std::time::Duration;

use uroce_sim::pair::{Node, PD, PairConfig};
use uroce_sim::{LinkConfig, RcPair, SplitMix64};
use uroce_transport::{
    Access, FlushOp, RecvWr, SendWr, Sge, WcFlags, WcOpcode, WcStatus, WrOpcode,
};
use uroce_wire::Mtu;

const ALL: Access = Access(1 | 2 | 4 | 8);

/// What one WR should leave behind.
#[derive(Debug, Clone)]
enum Expect {
    /// Bytes at the peer (`addr`) equal `data` (SEND lands in a receive
    /// buffer, WRITE at the target).
    Remote { addr: u64, data: Vec<u8> },
    /// Bytes locally at `addr` equal `data` (READ).
    Local { addr: u64, data: Vec<u8> },
    /// An atomic: the local result word, the final remote word.
    Atomic { local: u64, orig: u64, remote: u64, fin: u64 },
}

/// A region: (addr, lkey, rkey).
type Region = (u64, u32, u32);

struct Side {
    /// Separate regions per use, so no two WRs touch the same bytes.
    src: Region,
    wr_dst: Region,
    recv_dst: Region,
    read_src: Region,
    read_dst: Region,
    atom_tgt: Region,
    atom_res: Region,
    posted: Vec<(u64, WrOpcode, usize, Expect)>,
    recvs: Vec<(u64, usize, Option<u32>)>,
}

const REGION: usize = 4 << 20;

fn setup(n: &mut Node) -> Side {
    Side {
        src: n.mem.register(PD, REGION, ALL),
        wr_dst: n.mem.register(PD, REGION, ALL | Access::FLUSH_GLOBAL),
        recv_dst: n.mem.register(PD, REGION, ALL),
        read_src: n.mem.register(PD, REGION, ALL),
        read_dst: n.mem.register(PD, REGION, ALL),
        atom_tgt: n.mem.register(PD, 4096, ALL),
        atom_res: n.mem.register(PD, 4096, ALL),
        posted: vec![],
        recvs: vec![],
    }
}

fn size(rng: &mut SplitMix64, max: usize) -> usize {
    match rng.below(10) {
        0 => 0,
        1..=5 => rng.below(300) as usize,
        6..=8 => rng.below(20_000) as usize,
        _ => rng.below(max as u64) as usize,
    }
}

/// Posts a random workload from `me` to `peer`; returns WR count.
fn post_workload(
    rng: &mut SplitMix64,
    me: &mut Node,
    my: &mut Side,
    peer: &mut Node,
    peer_side: &mut Side,
    ops: usize,
    max_len: usize,
) {
    // Posting does not depend on the time.
    let now = uroce_transport::Instant::ZERO;
    // Disjoint slots: each op gets its own area in the destination region.
    let mut src_off = 0u64;
    let mut dst_off = 0u64;
    let mut recv_off = 0u64;
    let mut read_off = 0u64;
    for i in 0..ops {
        let kind = rng.below(9);
        // Every area is bump-allocated; shrink the message rather than wrap.
        let room =
            (REGION as u64 - 64).saturating_sub(src_off.max(dst_off).max(recv_off).max(read_off));
        let len = (size(rng, max_len) as u64).min(room) as usize;
        let wr_id = 1000 + i as u64;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let src_addr = my.src.0 + src_off;
        src_off += len as u64 + 64;
        me.mem.fill(src_addr, &data);
        let sge = [Sge { addr: src_addr, length: len as u32, lkey: my.src.1 }];
        let imm = rng.next_u64() as u32;
        let mut wr = SendWr { wr_id, sgl: &sge, ..SendWr::default() };
        let expect;
        match kind {
            0 | 1 => {
                // SEND (with or without immediate) into a fresh receive.
                wr.opcode = if kind == 0 { WrOpcode::Send } else { WrOpcode::SendWithImm };
                wr.imm_or_inv = imm;
                let raddr = peer_side.recv_dst.0 + recv_off;
                recv_off += len as u64 + 64;
                let rsge =
                    [Sge { addr: raddr, length: len as u32 + 16, lkey: peer_side.recv_dst.1 }];
                peer.qp_mut().post_recv(&[RecvWr { wr_id: 5000 + i as u64, sgl: &rsge }]).unwrap();
                peer_side.recvs.push((5000 + i as u64, len, (kind == 1).then_some(imm)));
                expect = Expect::Remote { addr: raddr, data: data.clone() };
            }
            2 | 3 => {
                wr.opcode =
                    if kind == 2 { WrOpcode::RdmaWrite } else { WrOpcode::RdmaWriteWithImm };
                wr.imm_or_inv = imm;
                wr.remote_addr = peer_side.wr_dst.0 + dst_off;
                wr.rkey = peer_side.wr_dst.2;
                dst_off += len as u64 + 64;
                if kind == 3 {
                    let rsge =
                        [Sge { addr: peer_side.recv_dst.0, length: 0, lkey: peer_side.recv_dst.1 }];
                    peer.qp_mut()
                        .post_recv(&[RecvWr { wr_id: 5000 + i as u64, sgl: &rsge }])
                        .unwrap();
                    peer_side.recvs.push((5000 + i as u64, len, Some(imm)));
                }
                expect = Expect::Remote { addr: wr.remote_addr, data: data.clone() };
            }
            7 => {
                // ATOMIC WRITE: 8 bytes at an aligned address of its own.
                let base = peer_side.wr_dst.0;
                let addr = (base + dst_off).next_multiple_of(8);
                dst_off = addr - base + 8 + 64;
                let value = rng.next_u64();
                let wr = SendWr {
                    wr_id,
                    opcode: WrOpcode::AtomicWrite,
                    remote_addr: addr,
                    rkey: peer_side.wr_dst.2,
                    compare_add: value,
                    ..SendWr::default()
                };
                me.qp_mut().post_send(now, &[wr]).unwrap();
                let expect = Expect::Remote { addr, data: value.to_ne_bytes().to_vec() };
                my.posted.push((wr_id, WrOpcode::AtomicWrite, 8, expect));
                continue;
            }
            8 => {
                // FLUSH of what was written so far (a range, or the region).
                let region = rng.below(2) as u8;
                let wr = SendWr {
                    wr_id,
                    opcode: WrOpcode::Flush,
                    remote_addr: peer_side.wr_dst.0,
                    rkey: peer_side.wr_dst.2,
                    flush: Some(FlushOp {
                        placement: FlushOp::GLOBAL,
                        selectivity: region,
                        len: dst_off as u32,
                    }),
                    ..SendWr::default()
                };
                me.qp_mut().post_send(now, &[wr]).unwrap();
                let expect = Expect::Remote { addr: peer_side.wr_dst.0, data: vec![] };
                my.posted.push((wr_id, WrOpcode::Flush, dst_off as usize, expect));
                continue;
            }
            4 => {
                // READ: fill the peer's source area, read it into ours.
                let raddr = peer_side.read_src.0 + read_off;
                let laddr = my.read_dst.0 + read_off;
                read_off += len as u64 + 64;
                let rdata: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
                peer.mem.fill(raddr, &rdata);
                let sge = [Sge { addr: laddr, length: len as u32, lkey: my.read_dst.1 }];
                let wr = SendWr {
                    wr_id,
                    opcode: WrOpcode::RdmaRead,
                    sgl: &sge,
                    remote_addr: raddr,
                    rkey: peer_side.read_src.2,
                    ..SendWr::default()
                };
                me.qp_mut().post_send(now, &[wr]).unwrap();
                my.posted.push((
                    wr_id,
                    WrOpcode::RdmaRead,
                    len,
                    Expect::Local { addr: laddr, data: rdata },
                ));
                continue;
            }
            _ => {
                let word = peer_side.atom_tgt.0 + (i as u64 % 500) * 8;
                let init = rng.next_u64();
                peer.mem.fill(word, &init.to_ne_bytes());
                let laddr = my.atom_res.0 + (i as u64 % 500) * 8;
                let sge = [Sge { addr: laddr, length: 8, lkey: my.atom_res.1 }];
                let cas = kind == 5;
                let operand = rng.next_u64();
                let compare = if rng.below(2) == 0 { init } else { operand };
                let wr = SendWr {
                    wr_id,
                    opcode: if cas {
                        WrOpcode::AtomicCmpAndSwp
                    } else {
                        WrOpcode::AtomicFetchAndAdd
                    },
                    sgl: &sge,
                    remote_addr: word,
                    rkey: peer_side.atom_tgt.2,
                    compare_add: if cas { compare } else { operand },
                    swap: operand,
                    ..SendWr::default()
                };
                let fin = if cas {
                    if compare == init { operand } else { init }
                } else {
                    init.wrapping_add(operand)
                };
                me.qp_mut().post_send(now, &[wr]).unwrap();
                my.posted.push((
                    wr_id,
                    wr.opcode,
                    8,
                    Expect::Atomic { local: laddr, orig: init, remote: word, fin },
                ));
                continue;
            }
        }
        me.qp_mut().post_send(now, &[wr]).unwrap();
        my.posted.push((wr_id, wr.opcode, len, expect));
    }
}

/// Checks one direction. With `may_exhaust`, the requester may legitimately
/// run out of retries (8 consecutive retransmission timeouts without
/// progress, which 20 % loss makes possible): then the WRs before the failed
/// one are checked, the failed one must carry RETRY_EXC_ERR, the rest
/// WR_FLUSH_ERR.
fn check_side(
    name: &str,
    me: &Node,
    my: &Side,
    peer: &Node,
    peer_side: &Side,
    may_exhaust: bool,
) -> Result<(), String> {
    let sends: Vec<_> = me.completions.iter().filter(|c| !c.is_recv).collect();
    if sends.len() != my.posted.len() {
        return Err(format!(
            "{name}: {} send completions for {} WRs: {:?}",
            sends.len(),
            my.posted.len(),
            sends.last()
        ));
    }
    let mut exhausted = false;
    for (c, (wr_id, op, len, expect)) in sends.iter().zip(&my.posted) {
        if c.wr_id != *wr_id {
            return Err(format!("{name}: completion {c:?} out of order, want WR {wr_id}"));
        }
        if exhausted {
            if c.status != WcStatus::WrFlushErr {
                return Err(format!("{name}: after RETRY_EXC_ERR got {c:?}"));
            }
            continue;
        }
        if may_exhaust
            && c.status == WcStatus::RetryExcErr
            && me.qp().stats().local_ack_timeout_err > u64::from(PairConfig::default().retry_cnt)
        {
            exhausted = true;
            continue;
        }
        if c.status != WcStatus::Success || c.opcode != op.wc_opcode() {
            return Err(format!("{name}: completion {c:?} for WR {wr_id} {op:?}"));
        }
        match expect {
            Expect::Remote { addr, data } => {
                if peer.mem.snapshot(*addr, data.len()) != *data {
                    return Err(format!(
                        "{name}: WR {wr_id} {op:?} len {len}: bytes differ at target"
                    ));
                }
            }
            Expect::Local { addr, data } => {
                if me.mem.snapshot(*addr, data.len()) != *data {
                    return Err(format!("{name}: READ {wr_id} len {len}: bytes differ"));
                }
            }
            Expect::Atomic { .. } => {}
        }
    }
    // Atomic words: with duplicates each op must have run exactly once.
    let ok: std::collections::HashSet<u64> =
        sends.iter().filter(|c| c.status == WcStatus::Success).map(|c| c.wr_id).collect();
    for (wr_id, _, _, e) in my.posted.iter().filter(|p| ok.contains(&p.0)) {
        if let Expect::Atomic { local, orig, remote, fin } = e {
            let l = u64::from_ne_bytes(me.mem.snapshot(*local, 8).try_into().unwrap());
            let r = u64::from_ne_bytes(peer.mem.snapshot(*remote, 8).try_into().unwrap());
            // Later atomics may reuse a word; only check the last user.
            let last_user = my.posted.iter().rev().find_map(|(id, _, _, x)| match x {
                Expect::Atomic { remote: rr, .. } if rr == remote => Some(*id),
                _ => None,
            });
            if last_user == Some(*wr_id) && (l != *orig || r != *fin) {
                return Err(format!(
                    "{name}: atomic {wr_id}: got orig {l:#x} final {r:#x}, want {orig:#x} {fin:#x}"
                ));
            }
        }
    }
    let recvs: Vec<_> = peer.completions.iter().filter(|c| c.is_recv).collect();
    if exhausted && recvs.len() <= peer_side.recvs.len() {
        // Receives past the failure may stay posted (or be flushed).
    } else if recvs.len() != peer_side.recvs.len() {
        return Err(format!(
            "{name}: {} receive completions for {} receives",
            recvs.len(),
            peer_side.recvs.len()
        ));
    }
    for (c, (wr_id, len, imm)) in recvs.iter().zip(&peer_side.recvs) {
        let imm_ok = match imm {
            Some(v) => c.flags.contains(WcFlags::WITH_IMM) && c.imm_or_inv == *v,
            None => !c.flags.contains(WcFlags::WITH_IMM),
        };
        if exhausted && c.status == WcStatus::WrFlushErr {
            continue;
        }
        if c.wr_id != *wr_id
            || c.status != WcStatus::Success
            || c.byte_len as usize != *len
            || !imm_ok
        {
            return Err(format!(
                "{name}: receive completion {c:?}, want wr {wr_id} len {len} imm {imm:?}"
            ));
        }
        let _ = WcOpcode::Recv;
    }
    Ok(())
}

fn run_seed(seed: u64) -> Result<String, String> {
    let mut rng = SplitMix64::new(seed);
    let link = LinkConfig {
        loss: [0.0, 0.01, 0.05, 0.2][rng.below(4) as usize],
        duplicate: [0.0, 0.01, 0.05][rng.below(3) as usize],
        reorder: [0.0, 0.02, 0.2][rng.below(3) as usize],
        corrupt: [0.0, 0.001, 0.01][rng.below(3) as usize],
        reorder_delay: Duration::from_micros(rng.below(100) + 1),
        delay: Duration::from_micros(rng.below(20) + 1),
        jitter: Duration::from_micros(rng.below(5)),
        bandwidth_bps: [0, 10_000_000_000, 1_000_000_000][rng.below(3) as usize],
        down: false,
    };
    let cfg = PairConfig {
        mtu: Mtu::ALL[rng.below(5) as usize],
        max_unacked_psns: [16, 128, 1024][rng.below(3) as usize],
        sq_sig_all: true,
        rd_atomic: [1, 4, 16][rng.below(3) as usize],
        ..PairConfig::default()
    };
    let mut p = RcPair::new(seed, link, cfg);
    let mut sa = setup(&mut p.a);
    let mut sb = setup(&mut p.b);
    let ops = 4 + rng.below(24) as usize;
    let max_len = if rng.below(8) == 0 { 1 << 20 } else { 100_000 };
    post_workload(&mut rng, &mut p.a, &mut sa, &mut p.b, &mut sb, ops, max_len);
    let ops_b = rng.below(12) as usize;
    post_workload(&mut rng, &mut p.b, &mut sb, &mut p.a, &mut sa, ops_b, max_len);
    let want_a = sa.posted.len();
    let want_b = sb.posted.len();
    let finished = p.run_until(Duration::from_secs(600), |p| {
        p.a.completions.iter().filter(|c| !c.is_recv).count() >= want_a
            && p.b.completions.iter().filter(|c| !c.is_recv).count() >= want_b
    });
    let summary = format!(
        "seed {seed}: {link:?} mtu {:?} ops {ops}+{ops_b} time {:?} retrans {}+{}",
        cfg.mtu,
        Duration::from_nanos(p.now.as_nanos()),
        p.a.qp().stats().retransmits,
        p.b.qp().stats().retransmits,
    );
    if !finished {
        if std::env::var_os("UROCE_SIM_TRACE").is_some() {
            eprintln!("net {:?} in flight {}", p.net.stats, p.net.in_flight());
        }
        return Err(format!(
            "{summary}: did not finish: A {}/{} B {}/{}, states {:?} {:?}, last {:?}",
            p.a.completions.iter().filter(|c| !c.is_recv).count(),
            want_a,
            p.b.completions.iter().filter(|c| !c.is_recv).count(),
            want_b,
            p.a.qp().state(),
            p.b.qp().state(),
            p.a.completions.last()
        ));
    }
    // Let trailing ACKs and duplicates drain, then check.
    p.run_until_idle(Duration::from_secs(10));
    // Go-back-N (the IB transport's only recovery) degrades sharply under
    // 20 % loss or 20 % reordering: long messages may then run out of
    // retries. That outcome is allowed, exactly as specified; everything
    // else about it is checked.
    let lossy = link.loss >= 0.2 || link.reorder >= 0.2;
    check_side("A->B", &p.a, &sa, &p.b, &sb, lossy).map_err(|e| format!("{summary}: {e}"))?;
    check_side("B->A", &p.b, &sb, &p.a, &sa, lossy).map_err(|e| format!("{summary}: {e}"))?;
    if !(p.a.mem.guards_intact() && p.b.mem.guards_intact()) {
        return Err(format!("{summary}: guard bytes overwritten"));
    }
    Ok(summary)
}

#[test]
fn random_workloads_survive_faults() {
    if let Ok(s) = std::env::var("UROCE_SIM_SEED") {
        let seed = s.parse().unwrap();
        match run_seed(seed) {
            Ok(sum) => eprintln!("{sum}"),
            Err(e) => panic!("{e}"),
        }
        return;
    }
    let n: u64 = std::env::var("UROCE_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    let mut failures = vec![];
    for seed in 0..n {
        if let Err(e) = run_seed(seed) {
            failures.push(e);
            if failures.len() >= 5 {
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{} failing seeds:\n{}", failures.len(), failures.join("\n"));
}
