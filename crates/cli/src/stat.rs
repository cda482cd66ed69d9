//! `uroce stat`: the counters of every process using a device, read from
//! what their contexts publish (`uroce::published`) while they run: rxe's
//! `hw_counters` set first, uroce's own after, per device and, with
//! `--qp`, per QP.

use std::process::ExitCode;

use anyhow::Result;
use uroce::published::{RXE_COUNTERS, Snapshot, read_all};
use uroce::transport::Stats;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Only this device.
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// Per-QP counters too (non-zero ones).
    #[arg(long)]
    qp: bool,
    /// Counters that are zero too.
    #[arg(short, long)]
    all: bool,
}

pub(crate) fn run(a: &Args) -> Result<ExitCode> {
    let snaps = read_all(a.device.as_deref());
    if snaps.is_empty() {
        println!(
            "no process has {} open (counters are published from {})",
            a.device.as_deref().unwrap_or("a uroce device"),
            uroce::published::run_dir().display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut devices: Vec<&str> = snaps.iter().map(|s| s.device.as_str()).collect();
    devices.dedup();
    for dev in devices {
        let mine: Vec<&Snapshot> = snaps.iter().filter(|s| s.device == dev).collect();
        let mut total = Stats::default();
        for s in &mine {
            total.accumulate(&s.device_stats);
        }
        let pids: Vec<String> = mine.iter().map(|s| s.pid.to_string()).collect();
        println!("{dev}: {} context(s), pid {}", mine.len(), pids.join(" "));
        print_counters(&total, a.all, "  ");
        if a.qp {
            for s in &mine {
                for (qpn, st) in &s.qps {
                    println!("  pid {} qp {qpn:#08x}:", s.pid);
                    print_counters(st, a.all, "    ");
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// rxe's counters in rxe's order, then uroce's own.
fn print_counters(s: &Stats, all: bool, indent: &str) {
    let rxe = RXE_COUNTERS.iter().map(|n| (*n, uroce::published::rxe_value(s, n)));
    let ours = s.iter().filter(|(n, _)| !RXE_COUNTERS.contains(n));
    for (name, v) in rxe.chain(ours) {
        if all || v != 0 {
            println!("{indent}{name:<28} {v}");
        }
    }
}
