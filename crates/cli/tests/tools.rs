//! The user tools run as two processes over the `udp` backend (server on
//! 127.0.0.1, client on 127.0.0.2), checking the report's shape, the data
//! (`-c`), and that a newcomer's mistakes fail fast with one clear line.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_uroce");

use uroce::testing::free_tcp_port;

/// Starts a server that listens on TCP `tcp` and waits until it does, so
/// that its client never races its start on a busy machine.
fn spawn_server(mut cmd: Command, tcp: &str) -> Child {
    let child = cmd.spawn().unwrap();
    let port: u16 = tcp.parse().unwrap();
    assert!(
        uroce::testing::wait_tcp_listening(port, Duration::from_secs(60)),
        "the server never listened on TCP {port}"
    );
    child
}

/// A server that connects through the RDMA CM: ready once its device is
/// open (its UDP port bound; a request a moment early waits for the
/// listener).
fn spawn_cm_server(mut cmd: Command, udp: u16) -> Child {
    let child = cmd.spawn().unwrap();
    assert!(
        uroce::testing::wait_udp_bound(udp, Duration::from_secs(60)),
        "the server never opened its device on UDP {udp}"
    );
    child
}

fn uroce(addr: &str, udp: u16, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("UROCE_DEVICES", format!("uroce0={addr}:{udp}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Waits for a child with a deadline, killing it when it overstays.
fn finish(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Runs a server and a client with the same tool arguments; returns both
/// outputs after checking both succeeded.
fn pair(tool: &[&str], extra: &[&str]) -> (String, String) {
    let udp = uroce::testing::free_port();
    let tcp = free_tcp_port().to_string();
    let mut sargs: Vec<&str> = tool.to_vec();
    sargs.extend_from_slice(&["-p", &tcp]);
    sargs.extend_from_slice(extra);
    let server = spawn_server(uroce("127.0.0.1", udp, &sargs), &tcp);
    let mut cargs: Vec<&str> = tool.to_vec();
    cargs.push("127.0.0.1");
    cargs.extend_from_slice(&["-p", &tcp]);
    cargs.extend_from_slice(extra);
    let client = uroce("127.0.0.2", udp, &cargs).spawn().unwrap();
    let c = finish(client, Duration::from_secs(30));
    let s = finish(server, Duration::from_secs(30));
    let (st, ct) = (text(&s), text(&c));
    assert!(s.status.success() && c.status.success(), "server:\n{st}\nclient:\n{ct}");
    (st, ct)
}

/// The two report lines of rdma-core's pingpong tools.
fn assert_pingpong_report(out: &str, bytes: u64, iters: u32) {
    let bw = out.lines().find(|l| l.contains("Mbit/sec")).unwrap_or_else(|| panic!("{out}"));
    assert!(bw.starts_with(&format!("{bytes} bytes in ")), "{bw}");
    assert!(bw.contains(" seconds = "), "{bw}");
    let it = out.lines().find(|l| l.contains("usec/iter")).unwrap_or_else(|| panic!("{out}"));
    assert!(it.starts_with(&format!("{iters} iters in ")), "{it}");
    let usec: f64 = it.split(" = ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(usec > 0.0, "{it}");
    assert!(out.contains("  local address:  LID 0x0000, QPN 0x"), "{out}");
    assert!(out.contains("  remote address:  LID 0x0000, QPN 0x"), "{out}");
}

#[test]
fn pingpong_rc_uc_ud_srq_exchange_and_verify_data() {
    for (kind, size, extra) in [
        ("rc", 4096u64, &[][..]),
        ("rc", 100, &["-e", "-s", "100"][..]),
        ("uc", 4096, &["-m", "2048"][..]),
        ("ud", 1024, &["-s", "1024"][..]),
        ("srq", 4096, &["-q", "4"][..]),
    ] {
        let mut args = vec!["-n", "50", "-c"];
        args.extend_from_slice(extra);
        let (s, c) = pair(&["pingpong", kind], &args);
        assert_pingpong_report(&s, size * 100, 50);
        assert_pingpong_report(&c, size * 100, 50);
        assert!(s.contains("GID ::ffff:127.0.0.2"), "{kind}: {s}");
        assert!(c.contains("GID ::ffff:127.0.0.1"), "{kind}: {c}");
    }
}

/// A failure within `limit`, non-zero, with a line containing `needle`.
fn fails_fast(mut cmd: Command, needle: &str, limit: Duration) {
    let start = Instant::now();
    let out = finish(cmd.spawn().unwrap(), limit + Duration::from_secs(5));
    let t = text(&out);
    assert!(!out.status.success(), "succeeded: {t}");
    assert!(start.elapsed() < limit, "took {:?}: {t}", start.elapsed());
    assert!(t.contains(needle), "expected {needle:?} in: {t}");
}

#[test]
fn newcomer_mistakes_fail_fast_with_one_clear_line() {
    let udp = uroce::testing::free_port();
    let tcp = free_tcp_port().to_string();
    // Well below the 10 s a hang would take, with room for a busy machine.
    let secs = Duration::from_secs(8);
    // Nobody listening.
    fails_fast(
        uroce("127.0.0.2", udp, &["pingpong", "rc", "127.0.0.1", "-p", &tcp]),
        "Couldn't connect to 127.0.0.1",
        secs,
    );
    // Unknown device, wrong GID index, wrong port, bad MTU.
    fails_fast(
        uroce("127.0.0.2", udp, &["pingpong", "rc", "-d", "mlx5_0"]),
        "mlx5_0 not found",
        secs,
    );
    fails_fast(uroce("127.0.0.2", udp, &["pingpong", "rc", "-g", "3"]), "gid index 3", secs);
    fails_fast(uroce("127.0.0.2", udp, &["pingpong", "rc", "-i", "2"]), "port 2", secs);
    fails_fast(uroce("127.0.0.2", udp, &["pingpong", "rc", "-m", "1500"]), "Invalid MTU", secs);
    fails_fast(uroce("127.0.0.2", udp, &["devinfo", "-d", "nope"]), "wasn't found", secs);
    // TCP port in use.
    let busy = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port().to_string();
    fails_fast(
        uroce("127.0.0.2", udp, &["pingpong", "rc", "-p", &busy_port]),
        "Couldn't listen to port",
        secs,
    );
    // UDP port (the device) in use by another process's device.
    let _held = std::net::UdpSocket::bind(("127.0.0.2", udp)).unwrap();
    fails_fast(uroce("127.0.0.2", udp, &["pingpong", "rc"]), "Couldn't open device", secs);
}

#[test]
fn mismatched_sizes_fail_on_both_sides_instead_of_hanging() {
    let udp = uroce::testing::free_port();
    let tcp = free_tcp_port().to_string();
    let server = spawn_server(
        uroce("127.0.0.1", udp, &["pingpong", "rc", "-p", &tcp, "-s", "1024", "-n", "5"]),
        &tcp,
    );
    let client = uroce(
        "127.0.0.2",
        udp,
        &["pingpong", "rc", "127.0.0.1", "-p", &tcp, "-s", "4096", "-n", "5"],
    )
    .spawn()
    .unwrap();
    let c = finish(client, Duration::from_secs(15));
    let s = finish(server, Duration::from_secs(15));
    assert!(!s.status.success() && !c.status.success(), "{}\n{}", text(&s), text(&c));
    assert!(text(&s).contains("Failed status"), "{}", text(&s));
    assert!(text(&c).contains("Failed status"), "{}", text(&c));
}

#[test]
fn devices_and_devinfo_print_what_rdma_core_prints() {
    let o = uroce("127.0.0.1", 4791, &["devices"]).output().unwrap();
    let t = text(&o);
    assert!(t.starts_with("    device          \t   node GUID\n"), "{t}");
    assert!(t.contains("    uroce0          \t0275ffff7f000001"), "{t}");
    let o = uroce("127.0.0.1", 4791, &["devinfo", "-v"]).output().unwrap();
    let t = text(&o);
    for needle in [
        "hca_id:\turoce0\n",
        "\ttransport:\t\t\tInfiniBand (0)\n",
        "\tnode_guid:\t\t\t0275:ffff:7f00:0001\n",
        "\tphys_port_cnt:\t\t\t1\n",
        "\t\tport:\t1\n",
        "\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n",
        "\t\t\tmax_mtu:\t\t4096 (5)\n",
        "\t\t\tlink_layer:\t\tEthernet\n",
        "\t\t\tGID[  0]:\t\t::ffff:127.0.0.1, RoCE v2\n",
        "\tmax_qp_rd_atom:\t\t\t128\n",
    ] {
        assert!(t.contains(needle), "{needle:?} missing from:\n{t}");
    }
    let o = uroce("127.0.0.1", 4791, &["devinfo", "-l"]).output().unwrap();
    assert_eq!(text(&o), "1 HCA found:\n\turoce0\n\n");
}

/// `uroce bench ARGS --scale 0.02` on a free port, its output in a fresh
/// directory: the program's text (it must succeed) and that directory.
fn bench(tag: &str, args: &[&str]) -> (String, std::path::PathBuf) {
    let udp = uroce::testing::free_port();
    let out = std::env::temp_dir().join(format!("uroce-bench-{tag}-{}", std::process::id()));
    let o = Command::new(BIN)
        .arg("bench")
        .args(args)
        .args(["--scale", "0.02", "--port", &udp.to_string(), "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    (t, out)
}

#[test]
fn bench_with_idle_qps_measures_among_them() {
    let (t, out) = bench(
        "idle",
        &["--ops", "write", "--min-size", "8", "--max-size", "8", "--idle-qps", "300"],
    );
    let row = t.lines().find(|l| l.starts_with("write ")).unwrap_or_else(|| panic!("{t}"));
    let v: Vec<f64> = row.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
    assert!(v[0] == 8.0 && v[1] > 0.0 && v[4] > 0.0, "{row}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Requester and responder on one device: two processes of one host
/// reach each other through it.
#[test]
fn bench_on_one_device() {
    let (t, out) = bench(
        "one",
        &[
            "--one-device",
            "--ops",
            "write,read,send,atomic",
            "--min-size",
            "8",
            "--max-size",
            "64K",
        ],
    );
    let rows = t.lines().filter(|l| l.split_whitespace().nth(1).is_some_and(|b| b == "65536"));
    assert_eq!(rows.count(), 3, "write, read and send at 64 KiB:\n{t}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Three pairs at once on two shared devices: every point measured by
/// every pair, the sum and spread printed, a row per pair in the CSV.
#[test]
fn bench_pairs_share_the_two_devices() {
    let (t, out) = bench(
        "pairs",
        &["--pairs", "3", "--ops", "write,read,send,atomic", "--min-size", "8", "--max-size", "4K"],
    );
    assert!(t.contains("3 pairs at once on shared devices"), "{t}");
    let rows: Vec<&str> = t
        .lines()
        .filter(|l| ["write ", "read ", "send ", "atomic "].iter().any(|p| l.starts_with(p)))
        .collect();
    assert_eq!(rows.len(), 3 * 10 + 1, "{t}");
    for row in &rows {
        let f: Vec<&str> = row.split_whitespace().collect();
        let bw: f64 = f[2].parse().unwrap();
        let lat: f64 = f[5].parse().unwrap();
        assert!(bw > 0.0 && lat > 0.0, "{row}");
    }
    let csv = std::fs::read_to_string(out.join("bench-pairs-3.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 3 * rows.len(), "{csv}");
    for pair in 0..3 {
        assert!(csv.lines().any(|l| l.starts_with(&format!("{pair},atomic,8,"))), "{csv}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bench_peers_include_the_udp_ping_pong_floor() {
    let (t, out) =
        bench("floor", &["--ops", "send", "--min-size", "8", "--max-size", "16", "--peers"]);
    // The latency table has the floor's column, with uroce's ratio to it.
    let lat = t.split("latency (one way)").nth(1).unwrap_or_else(|| panic!("{t}"));
    assert!(lat.lines().nth(1).is_some_and(|h| h.contains("udp ping-pong")), "{t}");
    let csv = std::fs::read_to_string(out.join("bench.csv")).unwrap();
    for size in [8, 16] {
        let row = csv
            .lines()
            .find(|l| l.starts_with(&format!("udp ping-pong,msg,{size},")))
            .unwrap_or_else(|| panic!("{csv}"));
        let us: f64 = row.split(',').nth(9).unwrap().parse().unwrap();
        assert!(us > 0.0 && us < 10_000.0, "{row}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bench_sweeps_sizes_and_writes_table_csv_and_svg() {
    let (t, out) = bench(
        "sweep",
        &["--ops", "write,read,send,atomic", "--min-size", "64", "--max-size", "64K"],
    );
    // The table: its header, then one row per (op, size) up to a blank
    // line; 11 sizes for write, read and send, one atomic row.
    let mut lines = t.lines().skip_while(|l| !(l.starts_with("op ") && l.contains("BW avg MB/s")));
    assert!(lines.next().is_some(), "no table in:\n{t}");
    let rows: Vec<Vec<&str>> = lines
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    let count = |op: &str| rows.iter().filter(|r| r[0] == op).count();
    assert_eq!(
        (count("write"), count("read"), count("send"), count("atomic")),
        (11, 11, 11, 1),
        "{t}"
    );
    assert_eq!(rows.len(), 3 * 11 + 1, "{t}");
    for r in &rows {
        assert_eq!(r.len(), 8, "{r:?}");
        let v: Vec<f64> =
            r[1..].iter().map(|v| v.parse().unwrap_or_else(|_| panic!("{r:?}"))).collect();
        let min = if r[0] == "atomic" { 8.0 } else { 64.0 };
        assert!(v.iter().all(|x| *x >= 0.0) && v[0] >= min && v[1] > 0.0, "{r:?}");
    }
    let csv = std::fs::read_to_string(out.join("bench.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 3 * 11 + 1, "{csv}");
    for l in csv.lines().skip(1) {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f.len(), 14, "{l}");
        let bw: f64 = f[4].parse().unwrap();
        let lat: f64 = f[9].parse().unwrap();
        assert!(bw > 0.0 && lat > 0.0, "{l}");
    }
    let svg = std::fs::read_to_string(out.join("bench.svg")).unwrap();
    assert!(svg.contains("uroce write") && svg.contains("uroce atomic"));
    // The PNG is optional: made when rsvg-convert is installed (the test
    // command does not install it), and its absence is said in one line.
    let rsvg =
        Command::new("rsvg-convert").arg("--version").output().is_ok_and(|o| o.status.success());
    if rsvg {
        let png = std::fs::read(out.join("bench.png")).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "bench.png is not a PNG");
    } else {
        assert!(!out.join("bench.png").exists());
        assert!(t.contains("(no PNG: rsvg-convert not found"), "{t}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// The perftest table row after `header`, split into fields.
fn table_rows(out: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = out.lines().skip_while(|l| !l.starts_with(header));
    assert!(lines.next().is_some(), "no {header:?} in:\n{out}");
    lines
        .take_while(|l| !l.starts_with("----"))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[test]
fn perf_tools_run_every_test_with_perftest_tables() {
    let bw_head = " #bytes     #iterations    BW peak[MB/sec]";
    let lat_head = " #bytes #iterations    t_min[usec]";
    for (test, extra, rows_client, rows_server) in [
        ("write-bw", &["-n", "200"][..], 1, 1),
        ("write-bw", &["-n", "20", "-a"][..], 23, 1),
        ("read-bw", &["-n", "100", "-q", "2", "-s", "4K"][..], 1, 1),
        ("atomic-bw", &["-n", "100", "-A", "CMP_AND_SWAP"][..], 1, 1),
        ("send-bw", &["-n", "100", "-s", "1000"][..], 1, 1),
        ("write-lat", &["-n", "100", "-s", "100"][..], 1, 1),
        ("read-lat", &["-n", "100"][..], 1, 0),
        ("atomic-lat", &["-n", "100"][..], 1, 0),
        ("send-lat", &["-n", "100", "-s", "64"][..], 1, 1),
    ] {
        let mut args = vec![test];
        args.extend_from_slice(extra);
        let mut tool = vec!["perf"];
        tool.extend_from_slice(&args[..1]);
        let (s, c) = pair(&tool, &args[1..]);
        let head = if test.ends_with("bw") { bw_head } else { lat_head };
        let cr = table_rows(&c, head);
        assert_eq!(cr.len(), rows_client, "{test} client:\n{c}");
        let fields = if test.ends_with("bw") { 5 } else { 9 };
        for r in &cr {
            assert_eq!(r.len(), fields, "{test}: {r:?}");
            let vals: Vec<f64> = r.iter().map(|v| v.parse().unwrap()).collect();
            // Something was measured: a bandwidth, or (a few tiny messages on
            // a loaded machine print "0.00" MB/s) a message rate.
            let measured = vals[2] > 0.0 || (fields == 5 && vals[4] > 0.0);
            assert!(vals.iter().all(|v| *v >= 0.0) && measured, "{test}: {r:?}");
        }
        if rows_server > 0 {
            let sr = table_rows(&s, head);
            assert_eq!(sr.len(), rows_server, "{test} server:\n{s}");
        }
        for out in [&s, &c] {
            assert!(out.contains(" Link type       : Ethernet"), "{test}:\n{out}");
            assert!(out.contains(" local address: LID 0000 QPN 0x"), "{test}:\n{out}");
            assert!(
                out.contains(" GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:00:00:0"),
                "{test}:\n{out}"
            );
        }
    }
}

#[test]
fn perf_output_option_prints_one_number() {
    let (s, c) =
        pair(&["perf", "write-bw"], &["-n", "100", "--output", "bandwidth", "--report_gbits"]);
    let v: f64 = c.trim().parse().unwrap_or_else(|_| panic!("{c}"));
    assert!(v > 0.0);
    assert!(s.trim().parse::<f64>().is_ok(), "{s}");
    let (_, c) = pair(&["perf", "send-lat"], &["-n", "50", "--output", "latency"]);
    assert!(c.trim().parse::<f64>().unwrap() > 0.0, "{c}");
}

#[test]
fn rping_reads_the_pattern_writes_it_back_and_verifies() {
    let udp = uroce::testing::free_port();
    // The rdma_cm port: a service of the device, any number will do.
    let tcp = free_tcp_port().to_string();
    let server = spawn_cm_server(
        uroce("127.0.0.1", udp, &["rping", "-s", "-a", "127.0.0.1", "-p", &tcp, "-v", "-S", "100"]),
        udp,
    );
    let client = uroce(
        "127.0.0.2",
        udp,
        &["rping", "-c", "-a", "127.0.0.1", "-p", &tcp, "-C", "20", "-v", "-S", "100"],
    )
    .spawn()
    .unwrap();
    let c = finish(client, Duration::from_secs(20));
    let s = finish(server, Duration::from_secs(20));
    let (ct, st) = (text(&c), text(&s));
    assert!(c.status.success() && s.status.success(), "{ct}\n{st}");
    let pings: Vec<&str> = ct.lines().filter(|l| l.starts_with("ping data: rdma-ping-")).collect();
    assert_eq!(pings.len(), 20, "{ct}");
    assert!(
        pings[0].starts_with(
            "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyzABC"
        ),
        "{}",
        pings[0]
    );
    assert!(pings[1].starts_with("ping data: rdma-ping-1: BCD"), "{}", pings[1]);
    // 99 bytes of text (the last is the NUL).
    assert_eq!(pings[5].len() - "ping data: ".len(), 99, "{}", pings[5]);
    assert_eq!(
        st.lines().filter(|l| l.starts_with("server ping data: rdma-ping-")).count(),
        20,
        "{st}"
    );

    // Different -S on the two sides: both end at once with a clear line.
    let udp = uroce::testing::free_port();
    let tcp = free_tcp_port().to_string();
    let server = spawn_cm_server(
        uroce("127.0.0.1", udp, &["rping", "-s", "-a", "127.0.0.1", "-p", &tcp]),
        udp,
    );
    let start = Instant::now();
    let client = uroce(
        "127.0.0.2",
        udp,
        &["rping", "-c", "-a", "127.0.0.1", "-p", &tcp, "-S", "4096", "-C", "3"],
    )
    .spawn()
    .unwrap();
    let c = finish(client, Duration::from_secs(10));
    let s = finish(server, Duration::from_secs(10));
    // At once: well below the 10 s wait a hang would end in.
    assert!(start.elapsed() < Duration::from_secs(8), "{:?}", start.elapsed());
    assert!(!c.status.success() && !s.status.success());
    assert!(text(&s).contains("use the same -S"), "{}", text(&s));
}

#[test]
fn perf_duration_mode_counts_iterations_in_the_sample_window() {
    let (s, c) = pair(&["perf", "write-bw"], &["-D", "3"]);
    let rows = table_rows(&c, " #bytes     #iterations    BW peak[MB/sec]");
    assert_eq!(rows.len(), 1, "{c}");
    assert!(rows[0][1].parse::<u64>().unwrap() > 100, "{c}");
    assert_eq!(table_rows(&s, " #bytes     #iterations    BW peak[MB/sec]").len(), 1, "{s}");
    let (s, c) = pair(&["perf", "send-lat"], &["-D", "3"]);
    for out in [&s, &c] {
        let rows = table_rows(out, " #bytes        #iterations       t_avg[usec]    tps average");
        assert_eq!(rows.len(), 1, "{out}");
        let iters: u64 = rows[0][1].parse().unwrap();
        let avg: f64 = rows[0][2].parse().unwrap();
        let tps: f64 = rows[0][3].parse().unwrap();
        assert!(iters > 100 && avg > 0.0 && tps > 0.0, "{out}");
        // t_avg is half the round trip: tps * 2 * t_avg ≈ 1 s.
        assert!((tps * 2.0 * avg / 1e6 - 1.0).abs() < 0.05, "{out}");
    }
}

/// `uroce stat` reads the counters of the processes using a device while
/// they run (rxe's names first), and forgets them once they exit.
#[test]
fn stat_reads_counters_of_running_processes() {
    let run_dir = std::env::temp_dir().join(format!("uroce-stat-{}", std::process::id()));
    let udp = uroce::testing::free_port();
    let tcp = free_tcp_port().to_string();
    let with_dir = |mut c: Command| {
        c.env("UROCE_RUN_DIR", &run_dir);
        c
    };
    let server = spawn_server(
        with_dir(uroce("127.0.0.1", udp, &["perf", "write-bw", "-p", &tcp, "-D", "4"])),
        &tcp,
    );
    let client = with_dir(uroce(
        "127.0.0.2",
        udp,
        &["perf", "write-bw", "127.0.0.1", "-p", &tcp, "-D", "4"],
    ))
    .spawn()
    .unwrap();
    // While the test runs: both processes, packets counted, per-QP lines.
    let deadline = Instant::now() + Duration::from_secs(30);
    let seen = loop {
        let o = with_dir(uroce("127.0.0.1", udp, &["stat", "--qp"])).output().unwrap();
        let t = text(&o);
        assert!(o.status.success(), "{t}");
        let sent = t
            .lines()
            .find_map(|l| l.trim().strip_prefix("sent_pkts"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if t.contains("uroce0: 2 context(s)") && sent > 1000 && t.contains(" qp 0x") {
            break t;
        }
        assert!(Instant::now() < deadline, "never saw both processes counting:\n{t}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(seen.contains("  rcvd_pkts"), "{seen}");
    let c = finish(client, Duration::from_secs(60));
    let s = finish(server, Duration::from_secs(60));
    assert!(c.status.success() && s.status.success(), "{}\n{}", text(&c), text(&s));
    // Gone with the processes.
    let o = with_dir(uroce("127.0.0.1", udp, &["stat"])).output().unwrap();
    assert!(text(&o).starts_with("no process has"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&run_dir);
}
