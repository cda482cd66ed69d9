//! `uroce bench`: a responder process and a requester process on loopback
//! (127.0.0.2 and 127.0.0.1, one RC connection over UDP), a sweep of
//! message sizes over the chosen operations measuring bandwidth, message
//! rate and latency, a summary table, and CSV + SVG (+ PNG when
//! `rsvg-convert` exists) in the output directory.
//!
//! The parent is the requester and starts the responder itself; the two
//! talk over the child's stdin/stdout, one line per step. With `--pairs N`
//! the parent runs N such pairs at once on the two shared device addresses
//! instead (`pairs`).

mod pairs;

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};

use anyhow::{Context as _, Result, bail};
use uroce::{Device, DeviceConfig};

use crate::measure::{BwResult, Conn, LatStats, Op, RECV_DEPTH, Remote};
use crate::peers::{self, PeerRun};
use crate::plot;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Operations, comma-separated: write, read, send, atomic.
    #[arg(long, value_delimiter = ',', default_value = "write,read,send,atomic")]
    ops: Vec<Op>,
    /// Smallest message size (bytes; a power of two; K and M suffixes).
    #[arg(long, default_value = "2", value_parser = parse_size)]
    min_size: usize,
    /// Largest message size.
    #[arg(long, default_value = "8M", value_parser = parse_size)]
    max_size: usize,
    /// Multiplies every iteration count (0.1 for a quick look).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Directory for bench.csv, bench.svg and bench.png.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// UDP port of the two devices.
    #[arg(long, default_value_t = 4791)]
    port: u16,
    /// Also measure a plain UDP ping-pong between the same two addresses
    /// (the floor), and the tools users would pick instead, when
    /// installed: ucx_perftest (tcp, shm), fi_pingpong (tcp, udp), qperf,
    /// sockperf.
    #[arg(long)]
    peers: bool,
    /// With --peers: install the missing ones with apt-get first.
    #[arg(long, requires = "peers")]
    install: bool,
    /// Open this many more connected RC QPs on each side that carry no
    /// traffic (what idle connections cost the measured one).
    #[arg(long, default_value_t = 0)]
    idle_qps: u32,
    /// Run this many requester/responder pairs at once, every requester
    /// sharing 127.0.0.1's device and every responder 127.0.0.2's (what
    /// sharing a device costs), and report their sum and spread.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pairs: u32,
    /// With --pairs: give each pair a device (UDP port) of its own instead,
    /// the comparison without sharing.
    #[arg(long, requires = "pairs")]
    own_ports: bool,
    /// Requester and responder on one device (127.0.0.1), the way two
    /// processes on one host reach each other through one NIC.
    #[arg(long)]
    one_device: bool,
    /// Internal: run as the responder.
    #[arg(long, hide = true)]
    serve: bool,
    /// Internal: run as one pair of `--pairs`, measuring each point when
    /// told to on stdin and printing the rows.
    #[arg(long, hide = true)]
    worker: bool,
    /// Internal: polls that find nothing give the CPU away.
    #[arg(long, hide = true)]
    yield_when_idle: bool,
    /// Internal: run as the UDP echo of the `udp ping-pong` peer.
    #[arg(long, hide = true)]
    udp_echo: Option<u16>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let v = crate::common::parse_size(s)?;
    if !v.is_power_of_two() || !(2..=(8 << 20)).contains(&v) {
        return Err(format!("{s}: sizes are powers of two from 2 to 8M"));
    }
    Ok(v)
}

const SERVER_IP: &str = "127.0.0.2";
const CLIENT_IP: &str = "127.0.0.1";

impl Args {
    /// The responder's device address: 127.0.0.2, or with `--one-device`
    /// the requester's own.
    fn server_ip(&self) -> &'static str {
        if self.one_device { CLIENT_IP } else { SERVER_IP }
    }
}

fn open(ip: &str, port: u16, max: usize) -> Result<Conn> {
    let ctx = Device::from_config(DeviceConfig { name: "uroce0".into(), addr: ip.parse()?, port })
        .open()
        .with_context(|| format!("opening a device on {ip}:{port} (is another bench running?)"))?;
    Conn::new(ctx, 2 * max)
}

fn line(r: &Remote) -> String {
    format!("{:x} {:x} {:x} {:x}", r.qpn, r.psn, r.addr, r.rkey)
}

fn parse_line(s: &str) -> Result<Remote> {
    let f: Vec<u64> = s
        .split_whitespace()
        .map(|x| u64::from_str_radix(x, 16))
        .collect::<Result<_, _>>()
        .with_context(|| format!("bad connection line {s:?}"))?;
    if f.len() != 4 {
        bail!("bad connection line {s:?}");
    }
    Ok(Remote { qpn: f[0] as u32, psn: f[1] as u32, addr: f[2], rkey: f[3] as u32 })
}

pub(crate) fn run(a: &Args) -> Result<ExitCode> {
    if let Some(port) = a.udp_echo {
        return crate::udp_floor::echo(port);
    }
    if a.serve {
        serve(a)
    } else if a.worker {
        pairs::worker(a)
    } else if a.pairs > 1 {
        pairs::run(a)
    } else {
        client(a)
    }
}

/// The responder: connects, then obeys one command per line.
fn serve(a: &Args) -> Result<ExitCode> {
    let mut c = open(a.server_ip(), a.port, a.max_size)?;
    c.yield_when_idle = a.yield_when_idle;
    c.add_idle_qps(a.idle_qps, CLIENT_IP.parse()?)?;
    println!("{}", line(&c.me()));
    std::io::stdout().flush()?;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let peer = parse_line(&lines.next().context("no peer line")??)?;
    c.connect(CLIENT_IP.parse::<IpAddr>()?, &peer)?;
    c.post_recvs(RECV_DEPTH)?;
    println!("connected");
    std::io::stdout().flush()?;
    for l in lines {
        let l = l?;
        let f: Vec<&str> = l.split_whitespace().collect();
        let reply = match f.as_slice() {
            ["quit"] => return Ok(ExitCode::SUCCESS),
            ["sends", iters] => {
                println!("ready");
                std::io::stdout().flush()?;
                c.serve_sends(iters.parse()?)
            }
            ["pong", op, size, iters] => {
                println!("ready");
                std::io::stdout().flush()?;
                let op = Op::parse(op).context("bad op")?;
                c.pong(op, size.parse()?, iters.parse()?, &peer)
            }
            _ => bail!("unknown command {l:?}"),
        };
        match reply {
            Ok(()) => println!("done"),
            Err(e) => println!("error {e:#}"),
        }
        std::io::stdout().flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A child process spoken to one line at a time over its stdin and
/// stdout (the responder, or a `--pairs` worker); its stderr is ours.
struct Piped {
    child: Child,
    tx: ChildStdin,
    rx: BufReader<ChildStdout>,
}

impl Piped {
    fn spawn(c: &mut Command) -> Result<Self> {
        let mut child =
            c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn()?;
        let tx = child.stdin.take().context("stdin")?;
        let rx = BufReader::new(child.stdout.take().context("stdout")?);
        Ok(Self { child, tx, rx })
    }

    fn send(&mut self, l: &str) -> Result<()> {
        writeln!(self.tx, "{l}").context("the process exited")?;
        self.tx.flush()?;
        Ok(())
    }

    /// The next line, trimmed; empty when the process has exited.
    fn line(&mut self) -> Result<String> {
        let mut l = String::new();
        self.rx.read_line(&mut l)?;
        Ok(l.trim().to_string())
    }
}

struct Responder(Piped);

impl Responder {
    fn send(&mut self, l: &str) -> Result<()> {
        self.0.send(l)
    }

    fn expect(&mut self, want: &str) -> Result<()> {
        let l = self.0.line()?;
        if l != want {
            bail!("responder: {}", if l.is_empty() { "exited" } else { &l });
        }
        Ok(())
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        let _ = self.0.send("quit");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

/// One row of results.
struct Row {
    op: Op,
    size: usize,
    bw: Option<BwResult>,
    lat: Option<LatStats>,
}

/// Iterations for bandwidth: about 128 MiB per point, within bounds.
fn bw_iters(size: usize, scale: f64) -> u32 {
    // At least tens of milliseconds at a few million messages a second.
    let base = ((128usize << 20) / size).clamp(40, 100_000) as f64;
    ((base * scale) as u32).max(8)
}

/// Iterations for latency: about 32 MiB per point, within bounds.
fn lat_iters(size: usize, scale: f64) -> u32 {
    let base = ((32usize << 20) / size).clamp(20, 2_000) as f64;
    ((base * scale) as u32).max(5)
}

fn sizes(a: &Args, op: Op) -> Vec<usize> {
    if op == Op::Atomic {
        return vec![8];
    }
    let mut v = Vec::new();
    let mut s = a.min_size;
    while s <= a.max_size {
        v.push(s);
        s *= 2;
    }
    v
}

/// A connected pair: the responder process, our connection, its end.
struct Pair {
    r: Responder,
    c: Conn,
    peer: Remote,
}

/// Starts the responder process and connects to it.
fn connect(a: &Args) -> Result<Pair> {
    if a.min_size > a.max_size {
        bail!("--min-size is larger than --max-size");
    }
    let mut r = Responder(
        Piped::spawn(
            Command::new(std::env::current_exe()?)
                .args(["bench", "--serve", "--port", &a.port.to_string()])
                .args(["--max-size", &a.max_size.to_string()])
                .args(["--idle-qps", &a.idle_qps.to_string()])
                .args(a.yield_when_idle.then_some("--yield-when-idle"))
                .args(a.one_device.then_some("--one-device")),
        )
        .context("starting the responder process")?,
    );
    let first = r.0.line()?;
    if first.is_empty() {
        bail!("the responder exited before connecting (see its error above)");
    }
    let peer = parse_line(&first)?;
    let mut c = open(CLIENT_IP, a.port, a.max_size)?;
    c.yield_when_idle = a.yield_when_idle;
    c.add_idle_qps(a.idle_qps, a.server_ip().parse()?)?;
    r.send(&line(&c.me()))?;
    r.expect("connected")?;
    c.connect(a.server_ip().parse::<IpAddr>()?, &peer)?;
    c.post_recvs(RECV_DEPTH)?;
    Ok(Pair { r, c, peer })
}

/// The points of the sweep, in order.
fn plan(a: &Args) -> Vec<(Op, usize)> {
    a.ops.iter().flat_map(|&op| sizes(a, op).into_iter().map(move |s| (op, s))).collect()
}

/// The two runs of each point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Bandwidth,
    Latency,
}

/// Measures every point of the plan; `before(i, op, size, phase)` runs
/// before each of its two runs (a progress line, or `--pairs`' barrier).
fn measure(
    a: &Args,
    p: &mut Pair,
    before: &mut dyn FnMut(usize, Op, usize, Phase) -> Result<()>,
) -> Result<Vec<Row>> {
    let Pair { r, c, peer } = p;
    let mut rows = Vec::new();
    for (i, (op, size)) in plan(a).into_iter().enumerate() {
        before(i, op, size, Phase::Bandwidth)?;
        let iters = bw_iters(size, a.scale);
        let mut run = |iters: u32| -> Result<crate::measure::BwResult> {
            if op != Op::Send {
                return c.bw(op, size, iters, peer);
            }
            r.send(&format!("sends {iters}"))?;
            r.expect("ready")?;
            let b = c.bw(op, size, iters, peer)?;
            r.expect("done")?;
            Ok(b)
        };
        // A warm-up run first, not measured (as ucx_perftest and OSU's
        // benchmarks do): the first point of a sweep would otherwise pay
        // for the pair's start, the queues' first touches and the threads
        // finding their CPUs.
        run((iters / 10).max(8))?;
        let bw = run(iters)?;
        before(i, op, size, Phase::Latency)?;
        let iters = lat_iters(size, a.scale);
        let samples = if matches!(op, Op::Write | Op::Send) {
            r.send(&format!("pong {} {size} {iters}", op.name()))?;
            r.expect("ready")?;
            let s = c.lat(op, size, iters, peer)?;
            r.expect("done")?;
            s
        } else {
            c.lat(op, size, iters, peer)?
        };
        rows.push(Row { op, size, bw: Some(bw), lat: Some(LatStats::from_samples(samples)) });
    }
    Ok(rows)
}

fn client(a: &Args) -> Result<ExitCode> {
    let mut pair = connect(a)?;
    let n = plan(a).len();
    let tty = std::io::stderr().is_terminal();
    let rows = measure(a, &mut pair, &mut |i, op, size, phase| {
        if phase == Phase::Bandwidth {
            progress(tty, i, n, op, size);
        }
        Ok(())
    })?;
    if tty {
        eprint!("\r{:72}\r", "");
    }
    drop(pair);
    print_table(&rows);
    let peer_runs = if a.peers {
        if a.install {
            peers::install();
        }
        let sizes = sizes(a, Op::Send);
        let mut tick = |name: &str, size: usize| {
            if tty {
                eprint!("\r{:72}\r  peers: {name:<14} {size:>8} B", "");
            }
        };
        let runs = peers::run(&sizes, a.scale, &mut tick);
        if tty {
            eprint!("\r{:72}\r", "");
        }
        if runs.is_empty() {
            println!(
                "\n(no peer tool installed: add --install, or apt-get install ucx-utils libfabric-bin qperf sockperf)"
            );
        }
        print_peers(&rows, &runs);
        runs
    } else {
        Vec::new()
    };
    write_outputs(a, &rows, &peer_runs)?;
    Ok(ExitCode::SUCCESS)
}

fn progress(tty: bool, i: usize, n: usize, op: Op, size: usize) {
    let width = 30;
    let done = i * width / n.max(1);
    let bar: String = "#".repeat(done) + &".".repeat(width - done);
    if tty {
        eprint!("\r[{bar}] {:>3}%  {:<6} {:>8} B ", i * 100 / n.max(1), op.name(), size);
    } else if i == 0 {
        eprintln!("measuring {n} points…");
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<7} {:>9} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10}",
        "op", "bytes", "BW avg MB/s", "BW peak", "Mmsg/s", "lat typ us", "lat avg", "lat p99"
    );
    for r in rows {
        let (bw, peak, rate) =
            r.bw.map_or((0.0, 0.0, 0.0), |b| (b.avg_bps / 1e6, b.peak_bps / 1e6, b.msg_rate / 1e6));
        let (typ, avg, p99) = r.lat.map_or((0.0, 0.0, 0.0), |l| (l.typical, l.avg, l.p99));
        println!(
            "{:<7} {:>9} {:>12.2} {:>12.2} {:>10.3} {:>10.2} {:>10.2} {:>10.2}",
            r.op.name(),
            r.size,
            bw,
            peak,
            rate,
            typ,
            avg,
            p99
        );
    }
}

/// The uroce operation peers are compared with: SEND (two-sided, as the
/// peers' messaging is) when measured.
fn reference(rows: &[Row]) -> Option<Op> {
    if rows.iter().any(|r| r.op == Op::Send) { Some(Op::Send) } else { rows.first().map(|r| r.op) }
}

fn print_peers(rows: &[Row], runs: &[PeerRun]) {
    let Some(op) = reference(rows) else { return };
    for (title, bw) in
        [("bandwidth, 10^6 bytes/s", true), ("latency (one way), microseconds", false)]
    {
        println!();
        println!(
            "{title}: uroce {} and the peers (uroce's ratio to each in brackets; higher is better for bandwidth, lower for latency)",
            op.name()
        );
        let mut head = format!("{:>9} {:>12}", "bytes", format!("uroce {}", op.name()));
        for p in runs {
            let _ = write!(head, " {:>22}", p.name);
        }
        println!("{head}");
        for r in rows.iter().filter(|r| r.op == op) {
            let mine = if bw { r.bw.map(|b| b.avg_bps / 1e6) } else { r.lat.map(|l| l.typical) };
            let mut line =
                format!("{:>9} {:>12}", r.size, mine.map_or("-".into(), |v| format!("{v:.2}")));
            for p in runs {
                let theirs = p
                    .points
                    .iter()
                    .find(|(s, _, _)| *s == r.size)
                    .and_then(|&(_, b, l)| if bw { b } else { l });
                let cell = match (mine, theirs) {
                    (Some(m), Some(t)) if t > 0.0 => format!("{t:.2} ({:.2}x)", m / t),
                    (_, Some(t)) => format!("{t:.2}"),
                    _ => "-".into(),
                };
                let _ = write!(line, " {cell:>22}");
            }
            println!("{line}");
        }
    }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs ({model}), Linux {}, loopback, udp backend", kernel.trim())
}

fn write_outputs(a: &Args, rows: &[Row], peers: &[PeerRun]) -> Result<()> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut csv = String::from(
        "tool,op,bytes,iterations,bw_avg_MBps,bw_peak_MBps,msg_rate_Mpps,lat_min_us,lat_max_us,lat_typical_us,lat_avg_us,lat_stdev_us,lat_p99_us,lat_p999_us\n",
    );
    for r in rows {
        let (iters, bw, peak, rate) = r.bw.map_or((0, 0.0, 0.0, 0.0), |b| {
            (b.iters, b.avg_bps / 1e6, b.peak_bps / 1e6, b.msg_rate / 1e6)
        });
        let l = r.lat.unwrap_or(LatStats::from_samples(Vec::new()));
        csv.push_str(&format!(
            "uroce,{},{},{iters},{bw:.3},{peak:.3},{rate:.4},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3}\n",
            r.op.name(),
            r.size,
            l.min,
            l.max,
            l.typical,
            l.avg,
            l.stdev,
            l.p99,
            l.p999
        ));
    }
    for p in peers {
        for &(size, bw, lat) in &p.points {
            let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
            csv.push_str(&format!("{},msg,{size},,{},,,,,{},,,,\n", p.name, f(bw), f(lat)));
        }
    }
    let csv_path = a.out.join("bench.csv");
    std::fs::write(&csv_path, csv)?;
    let mut bw = Vec::new();
    let mut lat = Vec::new();
    for (i, op) in a.ops.iter().enumerate() {
        let pts = |f: &dyn Fn(&Row) -> Option<f64>| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|r| r.op == *op)
                .filter_map(|r| f(r).map(|y| (r.size as f64, y)))
                .collect()
        };
        let color = plot::COLORS[i % plot::COLORS.len()];
        let name = format!("uroce {}", op.name());
        bw.push(plot::Series {
            name: name.clone(),
            color,
            dashed: false,
            points: pts(&|r| r.bw.map(|b| b.avg_bps / 1e6)),
        });
        lat.push(plot::Series {
            name,
            color,
            dashed: false,
            points: pts(&|r| r.lat.map(|l| l.typical)),
        });
    }
    for (i, p) in peers.iter().enumerate() {
        let color = plot::COLORS[(a.ops.len() + i) % plot::COLORS.len()];
        let pts = |f: &dyn Fn(&peers::Point) -> Option<f64>| -> Vec<(f64, f64)> {
            p.points.iter().filter_map(|pt| f(pt).map(|y| (pt.0 as f64, y))).collect()
        };
        bw.push(plot::Series { name: p.name.into(), color, dashed: true, points: pts(&|pt| pt.1) });
        lat.push(plot::Series {
            name: p.name.into(),
            color,
            dashed: true,
            points: pts(&|pt| pt.2),
        });
    }
    let svg = plot::svg(
        &[
            plot::Panel {
                title: "Bandwidth".into(),
                y_label: "MB/s (10^6 bytes)".into(),
                series: bw,
            },
            plot::Panel {
                title: "Latency (typical)".into(),
                y_label: "microseconds".into(),
                series: lat,
            },
        ],
        &format!("uroce bench — {}", machine()),
    );
    let svg_path = a.out.join("bench.svg");
    std::fs::write(&svg_path, svg)?;
    let png_path = a.out.join("bench.png");
    let png = Command::new("rsvg-convert")
        .arg("-o")
        .arg(&png_path)
        .arg(&svg_path)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    println!();
    println!("wrote {} and {}", csv_path.display(), svg_path.display());
    if png {
        println!("wrote {}", png_path.display());
    } else {
        println!("(no PNG: rsvg-convert not found; apt-get install librsvg2-bin)");
    }
    Ok(())
}
