//! `uroce bench --peers`: the floor (a plain UDP ping-pong between the same
//! two addresses, `crate::udp_floor`), then the tools users would pick
//! instead of uroce, measured on the same sizes over loopback when
//! installed (`--install` installs them with apt-get): UCX's ucx_perftest
//! over TCP and shared memory, libfabric's fi_pingpong (tcp and udp
//! providers), qperf (TCP and UDP) and sockperf (TCP). Each yields a
//! bandwidth in 10^6 bytes/s and a one-way latency in microseconds per
//! size (the floor: latency only).

use std::process::{Command, Stdio};

use crate::common::KillOnDrop;
use std::time::{Duration, Instant};

/// (size, bandwidth 10^6 B/s, one-way latency µs).
pub(crate) type Point = (usize, Option<f64>, Option<f64>);

/// One peer's measurements.
pub(crate) struct PeerRun {
    pub(crate) name: &'static str,
    pub(crate) points: Vec<Point>,
}

/// The tools and the Debian packages they come in.
const PACKAGES: [(&str, &str); 4] = [
    ("ucx_perftest", "ucx-utils"),
    ("fi_pingpong", "libfabric-bin"),
    ("qperf", "qperf"),
    ("sockperf", "sockperf"),
];

fn installed(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs the missing tools with apt-get; reports what could not be.
pub(crate) fn install() {
    let missing: Vec<&str> =
        PACKAGES.iter().filter(|(t, _)| !installed(t)).map(|(_, p)| *p).collect();
    if missing.is_empty() {
        return;
    }
    eprintln!("installing {} with apt-get …", missing.join(" "));
    let ok = Command::new("apt-get")
        .args(["install", "-y", "-q"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "apt-get install failed (not root, or no package source?): peers that are missing are skipped"
        );
    }
}

fn spawn(cmd: &mut Command) -> Option<KillOnDrop> {
    let c = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().ok()?;
    // The tools give no readiness signal; they listen within this.
    std::thread::sleep(Duration::from_millis(200));
    Some(KillOnDrop(c))
}

/// Runs a client with a deadline and returns its output.
fn client(cmd: &mut Command, limit: Duration) -> Option<String> {
    let mut c =
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().ok()?;
    let start = Instant::now();
    loop {
        match c.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
        }
    }
    let o = c.wait_with_output().ok()?;
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

fn port() -> u16 {
    uroce::testing::free_port()
}

/// ucx_perftest's "Final:" line: iterations, p50, avg and overall
/// latency (µs), avg and overall bandwidth (MiB/s), message rates.
fn ucx_final(out: &str) -> Option<Vec<f64>> {
    let l = out.lines().find(|l| l.starts_with("Final:"))?;
    l.split_whitespace().skip(1).map(|v| v.parse().ok()).collect()
}

fn ucx(tls: &str, size: usize, iters: u32) -> (Option<f64>, Option<f64>) {
    let run = |test: &str, n: u32| -> Option<Vec<f64>> {
        let p = port().to_string();
        let _s = spawn(Command::new("ucx_perftest").args(["-p", &p]).env("UCX_TLS", tls))?;
        let out = client(
            Command::new("ucx_perftest")
                .args([
                    "127.0.0.1",
                    "-p",
                    &p,
                    "-t",
                    test,
                    "-s",
                    &size.to_string(),
                    "-n",
                    &n.to_string(),
                ])
                .env("UCX_TLS", tls),
            Duration::from_secs(30),
        )?;
        ucx_final(&out)
    };
    let bw = run("tag_bw", iters).and_then(|f| f.get(5).map(|mib| mib * 1.048_576));
    let lat = run("tag_lat", iters.min(2000)).and_then(|f| f.get(1).copied());
    (bw, lat)
}

/// fi_pingpong's result row: bytes, #sent, #ack, total, time, MB/sec,
/// usec/xfer, Mxfers/sec.
fn fabric(prov: &str, ep: &str, size: usize, iters: u32) -> (Option<f64>, Option<f64>) {
    let p = port().to_string();
    let Some(_s) =
        spawn(Command::new("fi_pingpong").args(["-p", prov, "-e", ep, "-B", &p]).args([
            "-I",
            &iters.to_string(),
            "-S",
            &size.to_string(),
        ]))
    else {
        return (None, None);
    };
    let out = client(
        Command::new("fi_pingpong")
            .args([
                "-p",
                prov,
                "-e",
                ep,
                "-P",
                &p,
                "-I",
                &iters.to_string(),
                "-S",
                &size.to_string(),
            ])
            .arg("127.0.0.1"),
        Duration::from_secs(30),
    );
    let Some(out) = out else { return (None, None) };
    // One size per run: the row after the header (sizes print as "1k").
    let row = out.lines().rfind(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 8 && f[5].parse::<f64>().is_ok()
    });
    let f: Vec<&str> = row.map(|r| r.split_whitespace().collect()).unwrap_or_default();
    (f.get(5).and_then(|v| v.parse().ok()), f.get(6).and_then(|v| v.parse().ok()))
}

/// qperf's `name: \n  bw = X GB/sec` / `latency = X us` lines.
fn qperf_value(out: &str, key: &str) -> Option<f64> {
    let l = out.lines().find(|l| l.trim_start().starts_with(key))?;
    let mut it = l.split('=').nth(1)?.split_whitespace();
    let v: f64 = it.next()?.parse().ok()?;
    let scale = match it.next()? {
        "bytes/sec" => 1e-6,
        "KB/sec" => 1e-3,
        "MB/sec" => 1.0,
        "GB/sec" => 1e3,
        "ns" => 1e-3,
        "us" => 1.0,
        "ms" => 1e3,
        "sec" => 1e6,
        _ => return None,
    };
    Some(v * scale)
}

fn qperf(proto: &str, server_port: u16, size: usize) -> (Option<f64>, Option<f64>) {
    let p = server_port.to_string();
    let out = client(
        Command::new("qperf")
            .args(["127.0.0.1", "-lp", &p, "-t", "1", "-m", &size.to_string()])
            .args([format!("{proto}_bw"), format!("{proto}_lat")]),
        Duration::from_secs(20),
    );
    let Some(out) = out else { return (None, None) };
    // udp_bw reports what was sent and what arrived; arrival counts.
    let bw_key = if proto == "udp" { "recv_bw" } else { "bw" };
    (qperf_value(&out, bw_key), qperf_value(&out, "latency"))
}

/// sockperf's "Summary: Latency is X usec" and "BandWidth is X MBps".
fn sockperf(size: usize) -> (Option<f64>, Option<f64>) {
    let p = port().to_string();
    let Some(_s) =
        spawn(Command::new("sockperf").args(["sr", "--tcp", "-i", "127.0.0.1", "-p", &p]))
    else {
        return (None, None);
    };
    let m = size.max(14).to_string();
    let summary = |mode: &str, key: &str| -> Option<f64> {
        let out = client(
            Command::new("sockperf").args([
                mode,
                "--tcp",
                "-i",
                "127.0.0.1",
                "-p",
                &p,
                "-m",
                &m,
                "-t",
                "1",
            ]),
            Duration::from_secs(20),
        )?;
        let l = out.lines().find(|l| l.contains(key))?;
        l.split(key).nth(1)?.split_whitespace().next()?.parse().ok()
    };
    let lat = summary("ping-pong", "Latency is ");
    // sockperf's MBps is 10^6 bytes/s.
    let bw = summary("throughput", "BandWidth is ");
    (bw, lat)
}

/// Runs every installed peer over `sizes` (qperf and sockperf, which take
/// a second or more per point, over a subset). `tick` reports progress.
pub(crate) fn run(sizes: &[usize], scale: f64, tick: &mut dyn FnMut(&str, usize)) -> Vec<PeerRun> {
    let mut out = Vec::new();
    let iters = |size: usize, base: usize| {
        (((base / size).clamp(20, 20_000) as f64 * scale) as u32).max(10)
    };
    tick("udp ping-pong", 0);
    if let Some(lat) = crate::udp_floor::measure(sizes, |s| iters(s, 64 << 20).min(20_000)) {
        let points = lat.into_iter().map(|(s, l)| (s, None, l)).collect();
        out.push(PeerRun { name: "udp ping-pong", points });
    }
    if installed("ucx_perftest") {
        for (name, tls) in [("ucx tcp", "tcp"), ("ucx shm", "sm,self")] {
            let mut points = Vec::new();
            for &s in sizes {
                tick(name, s);
                let (bw, lat) = ucx(tls, s, iters(s, 64 << 20));
                points.push((s, bw, lat));
            }
            out.push(PeerRun { name, points });
        }
    }
    if installed("fi_pingpong") {
        for (name, prov, ep, max) in
            [("libfabric tcp", "tcp", "msg", usize::MAX), ("libfabric udp", "udp", "dgram", 1024)]
        {
            let mut points = Vec::new();
            for &s in sizes.iter().filter(|&&s| s <= max) {
                tick(name, s);
                let (bw, lat) = fabric(prov, ep, s, iters(s, 16 << 20));
                points.push((s, bw, lat));
            }
            out.push(PeerRun { name, points });
        }
    }
    let sparse: Vec<usize> =
        sizes.iter().copied().filter(|s| s.trailing_zeros() % 3 == 0).collect();
    if installed("qperf") {
        let p = port();
        if let Some(_server) = spawn(Command::new("qperf").args(["-lp", &p.to_string()])) {
            for (name, proto, max) in
                [("qperf tcp", "tcp", usize::MAX), ("qperf udp", "udp", 32 << 10)]
            {
                let mut points = Vec::new();
                for &s in sparse.iter().filter(|&&s| s <= max) {
                    tick(name, s);
                    let (bw, lat) = qperf(proto, p, s);
                    points.push((s, bw, lat));
                }
                out.push(PeerRun { name, points });
            }
        }
    }
    if installed("sockperf") {
        let mut points = Vec::new();
        for &s in sparse.iter().filter(|&&s| s <= 32 << 10) {
            tick("sockperf tcp", s);
            let (bw, lat) = sockperf(s);
            points.push((s, bw, lat));
        }
        out.push(PeerRun { name: "sockperf tcp", points });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_tools_result_lines() {
        let u = "Final:                 10000      5.669     6.104     6.104        1.25       1.25      163816      163816";
        assert_eq!(ucx_final(u).unwrap()[1], 5.669);
        let q = "tcp_bw:\n    bw  =  3.64 GB/sec\ntcp_lat:\n    latency  =  7.39 us\n";
        assert_eq!(qperf_value(q, "bw"), Some(3640.0));
        assert_eq!(qperf_value(q, "latency"), Some(7.39));
        assert_eq!(qperf_value("    bw  =  512 KB/sec", "bw"), Some(0.512));
    }
}
