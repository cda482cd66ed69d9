//! `uroce bench --pairs N`: N requester/responder pairs at once, every
//! requester a process of its own on 127.0.0.1's device and every
//! responder one on 127.0.0.2's, so that the devices are shared as
//! `mpirun` ranks share a host's (or, with `--own-ports`, each pair on
//! devices of its own, the comparison without sharing).
//!
//! The parent starts N workers (`uroce bench --worker`), each of which
//! connects a pair and then starts each run (a point's bandwidth run, then
//! its latency run) only when the parent says `go`: the parent waits until
//! every worker is `ready` for the run, so the pairs run together and each
//! figure is what a pair gets while all of them run. The bandwidth sum is
//! every pair's bytes over the wall time from the parent's `go` to the
//! last pair's end (not a sum of rates over different times).

use std::fmt::Write as _;
use std::io::{BufRead, Write};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use super::{Args, Op, Piped, connect, measure, plan};

/// One worker's end of the conversation.
fn say(l: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{l}")?;
    out.flush()?;
    Ok(())
}

/// A worker: one pair, measured point by point when told, its rows printed
/// one per line at the end.
pub(super) fn worker(a: &Args) -> Result<ExitCode> {
    let mut pair = connect(a)?;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    say("connected")?;
    let rows = measure(a, &mut pair, &mut |_, _, _, _| {
        say("ready")?;
        match lines.next() {
            Some(Ok(l)) if l.trim() == "go" => Ok(()),
            _ => bail!("the parent went away"),
        }
    })?;
    drop(pair);
    for r in rows {
        let (b, l) = (r.bw.context("no bandwidth")?, r.lat.context("no latency")?);
        say(&format!(
            "row {} {} {} {} {} {} {}",
            r.op.name(),
            r.size,
            b.iters,
            b.avg_bps,
            b.msg_rate,
            l.typical,
            l.p99
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One point as one pair measured it.
#[derive(Debug, Clone, Copy)]
struct Point {
    iters: u64,
    bps: f64,
    rate: f64,
    lat_typ: f64,
    lat_p99: f64,
}

struct Worker(Piped);

impl Worker {
    fn line(&mut self, i: usize) -> Result<String> {
        let l = self.0.line()?;
        if l.is_empty() {
            bail!("pair {i} stopped (see its error above)");
        }
        Ok(l)
    }

    fn expect(&mut self, i: usize, want: &str) -> Result<()> {
        let l = self.line(i)?;
        if l != want {
            bail!("pair {i}: {l}");
        }
        Ok(())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // A worker still running (an error elsewhere) is not left behind;
        // its responder goes when its stdin closes.
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

/// Whether the pairs' processes outnumber the CPUs: then every poll that
/// finds nothing yields, as Open MPI makes its ranks do when a host is
/// oversubscribed (`mpi_yield_when_idle`); spinning processes would
/// otherwise hold a CPU for a whole time slice while the peer they wait
/// for cannot run.
fn oversubscribed(pairs: u32) -> bool {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    2 * pairs as usize > cpus
}

fn start(a: &Args, i: u32) -> Result<Worker> {
    let port = if a.own_ports {
        u16::try_from(u32::from(a.port) + i).context("--port + --pairs passes 65535")?
    } else {
        a.port
    };
    let ops: Vec<&str> = a.ops.iter().map(|o| o.name()).collect();
    let p = Piped::spawn(
        Command::new(std::env::current_exe()?)
            .args(["bench", "--worker", "--port", &port.to_string()])
            .args(["--ops", &ops.join(",")])
            .args(["--min-size", &a.min_size.to_string(), "--max-size", &a.max_size.to_string()])
            .args(["--scale", &a.scale.to_string(), "--idle-qps", &a.idle_qps.to_string()])
            .args(oversubscribed(a.pairs).then_some("--yield-when-idle"))
            .args(a.one_device.then_some("--one-device")),
    )
    .context("starting a pair")?;
    Ok(Worker(p))
}

fn all_ready(workers: &mut [Worker]) -> Result<()> {
    for (i, w) in workers.iter_mut().enumerate() {
        w.expect(i, "ready")?;
    }
    Ok(())
}

fn go(workers: &mut [Worker]) -> Result<()> {
    for w in workers {
        w.0.send("go")?;
    }
    Ok(())
}

fn parse_row(l: &str) -> Option<(Op, usize, Point)> {
    let f: Vec<&str> = l.split_whitespace().collect();
    let ["row", op, size, iters, bps, rate, typ, p99] = f.as_slice() else { return None };
    let n = |s: &str| s.parse::<f64>().ok();
    Some((
        Op::parse(op)?,
        size.parse().ok()?,
        Point {
            iters: iters.parse().ok()?,
            bps: n(bps)?,
            rate: n(rate)?,
            lat_typ: n(typ)?,
            lat_p99: n(p99)?,
        },
    ))
}

/// The parent: starts the pairs, lets them measure each point together,
/// prints the sum and spread, and writes `bench-pairs-N.csv`.
pub(super) fn run(a: &Args) -> Result<ExitCode> {
    let n = a.pairs;
    let mut workers = (0..n).map(|i| start(a, i)).collect::<Result<Vec<_>>>()?;
    for (i, w) in workers.iter_mut().enumerate() {
        w.expect(i, "connected")?;
    }
    let plan = plan(a);
    // Wall time of each point's bandwidth run, all pairs together.
    let mut walls = Vec::with_capacity(plan.len());
    for (k, &(op, size)) in plan.iter().enumerate() {
        eprint!("\r{:60}\r{n} pairs: point {}/{} ({} {size} B)", "", k + 1, plan.len(), op.name());
        all_ready(&mut workers)?;
        let t = Instant::now();
        go(&mut workers)?;
        // Ready for the latency run: the bandwidth run is over.
        all_ready(&mut workers)?;
        walls.push(t.elapsed().as_secs_f64());
        go(&mut workers)?;
    }
    eprint!("\r{:60}\r", "");
    let mut points: Vec<Vec<Point>> = vec![Vec::new(); plan.len()];
    for (i, w) in workers.iter_mut().enumerate() {
        for (k, &(op, size)) in plan.iter().enumerate() {
            let l = w.line(i)?;
            match parse_row(&l) {
                Some((o, s, p)) if o == op && s == size => points[k].push(p),
                _ => bail!("pair {i}: unexpected {l:?}"),
            }
        }
        if !w.0.child.wait()?.success() {
            bail!("pair {i} failed");
        }
    }
    let devices = if a.own_ports { "a device pair of its own each" } else { "shared devices" };
    let ends =
        if a.one_device { "127.0.0.1 both" } else { "127.0.0.1 requesters, 127.0.0.2 responders" };
    println!("{n} pairs at once on {devices} ({ends})");
    if oversubscribed(n) {
        println!("(more processes than CPUs: polls that find nothing yield the CPU)");
    }
    println!(
        "{:<7} {:>9} {:>12} {:>21} {:>11} {:>16} {:>12}",
        "op",
        "bytes",
        "BW all MB/s",
        "BW per pair min-max",
        "Mmsg/s all",
        "lat typ us med",
        "lat typ max"
    );
    let mut csv =
        String::from("pair,op,bytes,bw_avg_MBps,msg_rate_Mpps,lat_typical_us,lat_p99_us\n");
    for (k, &(op, size)) in plan.iter().enumerate() {
        let p = &points[k];
        let bytes = p.iter().map(|x| x.iters as f64 * size as f64).sum::<f64>();
        let sum = bytes / walls[k].max(1e-9) / 1e6;
        let lo = p.iter().map(|x| x.bps).fold(f64::INFINITY, f64::min) / 1e6;
        let hi = p.iter().map(|x| x.bps).fold(0.0, f64::max) / 1e6;
        let rate = p.iter().map(|x| x.iters as f64).sum::<f64>() / walls[k].max(1e-9) / 1e6;
        let mut lat: Vec<f64> = p.iter().map(|x| x.lat_typ).collect();
        lat.sort_by(f64::total_cmp);
        let med = lat.get(lat.len() / 2).copied().unwrap_or(0.0);
        let max = lat.last().copied().unwrap_or(0.0);
        println!(
            "{:<7} {size:>9} {sum:>12.2} {:>21} {rate:>11.3} {med:>16.2} {max:>12.2}",
            op.name(),
            format!("{lo:.1}-{hi:.1}"),
        );
        for (i, x) in p.iter().enumerate() {
            let _ = writeln!(
                csv,
                "{i},{},{size},{:.3},{:.4},{:.3},{:.3}",
                op.name(),
                x.bps / 1e6,
                x.rate / 1e6,
                x.lat_typ,
                x.lat_p99
            );
        }
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let path = a.out.join(format!("bench-pairs-{n}.csv"));
    std::fs::write(&path, csv)?;
    println!("\nwrote {}", path.display());
    Ok(ExitCode::SUCCESS)
}
