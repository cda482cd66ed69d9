//! Unmodified Debian binaries (ibverbs-utils 44, perftest 4.5) on the
//! drop-in library: each tool as server and client in two processes over
//! `udp` (127.0.0.1 ↔ 127.0.0.2), plus mixed pairs against `uroce pingpong`
//! and `uroce perf`. The test command (`scripts/test`) installs the
//! packages. Runs are serialised: perftest busy-polls, and two pairs at
//! once on two cores would measure the scheduler.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod common;
use common::{HugePages, env, finish, text};

/// The Debian tools the suite runs, checked once.
fn tools_present() {
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        for tool in ["ibv_devinfo", "ibv_rc_pingpong", "ib_write_bw"] {
            assert!(
                common::have(tool),
                "{tool} is missing: install ibverbs-utils and perftest (scripts/test does)"
            );
        }
    });
}

fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

fn tcp_port() -> u16 {
    uroce::testing::free_tcp_port()
}

/// Extra environment for the runs of the current test (see
/// `perftest_wr_api_path`).
static EXTRA_ENV: Mutex<Vec<(&'static str, &'static str)>> = Mutex::new(Vec::new());

/// A command for `prog` on the drop-in library with device uroce0 on `ip`.
fn cmd(prog: &Path, args: &[&str], ip: &str, udp: u16) -> Command {
    tools_present();
    let mut c = Command::new(prog);
    for (k, v) in EXTRA_ENV.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        c.env(k, v);
    }
    c.args(args)
        .env("LD_LIBRARY_PATH", &env().lib_dir)
        .env("UROCE_DEVICES", format!("uroce0={ip}:{udp}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn tool(name: &str) -> PathBuf {
    PathBuf::from(name)
}

/// The text of both sides of a run, for assertions and failure messages.
struct Pair {
    label: String,
    server: String,
    client: String,
}

impl Pair {
    fn client_has(&self, s: &str) -> bool {
        self.client.contains(s)
    }
}

impl std::fmt::Display for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}\n--- server ---\n{}\n--- client ---\n{}",
            self.label, self.server, self.client
        )
    }
}

/// Runs `server` and then `client` (which gets `-p PORT 127.0.0.1`) and
/// requires both to exit 0 within `limit`.
fn pair(server: (&Path, &[&str]), client: (&Path, &[&str]), limit: Duration) -> Pair {
    fan(server, client, 1, limit)
}

/// [`pair`] with `clients` clients, all on one device (127.0.0.2, one
/// UDP port: the processes share it); their outputs one after the other.
/// A run that perftest itself could not time is run again, once: it
/// calibrates its cycle counter against the clock at start and gives up
/// ("Can't produce a report") when a loaded machine preempts it meanwhile.
fn fan(
    server: (&Path, &[&str]),
    client: (&Path, &[&str]),
    clients: usize,
    limit: Duration,
) -> Pair {
    let first = fan_once(server, client, clients, limit);
    // perftest times its run by the cycle counter, calibrated against the
    // clock; a busy machine can spoil the calibration on either side.
    let untimed = |t: &str| t.contains("Can't produce a report");
    if !first.ok && (untimed(&first.pair.client) || untimed(&first.pair.server)) {
        eprintln!("perftest could not time its run; once more:\n{}", first.pair);
        return fan_once(server, client, clients, limit).checked();
    }
    first.checked()
}

/// One run of [`fan`] (its time limit and the files it must not leave
/// behind checked), and whether both sides succeeded.
fn fan_once(
    server: (&Path, &[&str]),
    client: (&Path, &[&str]),
    clients: usize,
    limit: Duration,
) -> Outcome {
    let udp = uroce::testing::free_port();
    let tcp = tcp_port().to_string();
    let label = format!(
        "{} {} <-> {} {}",
        server.0.display(),
        server.1.join(" "),
        client.0.display(),
        client.1.join(" ")
    );
    let deadline = Instant::now() + limit;
    let mut sargs: Vec<&str> = server.1.to_vec();
    sargs.extend(["-p", &tcp]);
    let srv = cmd(server.0, &sargs, "127.0.0.1", udp).spawn().unwrap();
    let port: u16 = tcp.parse().unwrap();
    uroce::testing::wait_tcp_listening(port, deadline.saturating_duration_since(Instant::now()));
    let mut cargs: Vec<&str> = client.1.to_vec();
    cargs.extend(["-p", &tcp, "127.0.0.1"]);
    let clis: Vec<_> =
        (0..clients).map(|_| cmd(client.0, &cargs, "127.0.0.2", udp).spawn().unwrap()).collect();
    let outs: Vec<_> = clis.into_iter().map(|c| finish(c, deadline)).collect();
    let (so, st) = finish(srv, deadline + Duration::from_secs(2));
    let client_text =
        outs.iter().map(|(o, _)| text(o)).collect::<Vec<_>>().join("\n--- next client ---\n");
    let p = Pair { label, server: text(&so), client: client_text };
    let ct = outs.iter().any(|(_, t)| *t);
    assert!(!ct && !st, "timed out after {limit:?}: {p}");
    let ok = outs.iter().all(|(o, _)| o.status.success()) && so.status.success();
    let left = files_of_port(udp);
    assert!(left.is_empty(), "files left behind by {}: {left:?}", p.label);
    Outcome { pair: p, ok }
}

/// A run's text and whether both sides succeeded.
struct Outcome {
    pair: Pair,
    ok: bool,
}

impl Outcome {
    /// The run, which must have succeeded.
    fn checked(self) -> Pair {
        assert!(self.ok, "failed: {}", self.pair);
        self.pair
    }
}

/// The files of the device at UDP port `udp` in the run directory and in
/// `/dev/shm`: shared addresses' tables and the local path's inboxes. A
/// program that ends normally leaves none, though the drop-in keeps its
/// devices open to the end (the exit hook removes them).
fn files_of_port(udp: u16) -> Vec<String> {
    let of_port = |n: &str| n.ends_with(&format!("-{udp}")) || n.contains(&format!("-{udp}."));
    [uroce::published::run_dir(), PathBuf::from("/dev/shm")]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|d| d.flatten())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| ["share-", "uroce-", "xrcd-"].iter().any(|p| n.starts_with(p)) && of_port(n))
        .collect()
}

/// The same tool on both sides.
fn same(tool_name: &str, args: &[&str], limit: Duration) -> Pair {
    let t = tool(tool_name);
    pair((&t, args), (&t, args), limit)
}

/// Result rows of a perftest table (lines starting with the size).
fn perftest_rows(out: &str) -> Vec<Vec<f64>> {
    out.lines()
        .map(|l| l.split_whitespace().map(str::parse::<f64>).collect::<Result<Vec<_>, _>>())
        .filter_map(Result::ok)
        .filter(|r| r.len() >= 4)
        .collect()
}

#[test]
fn devices_and_devinfo_match_uroce_tools() {
    let _g = serial();
    let e = env();
    let udp = uroce::testing::free_port();
    for (c, u) in [
        ("ibv_devices", vec!["devices"]),
        ("ibv_devinfo", vec!["devinfo"]),
        ("ibv_devinfo", vec!["devinfo", "-v"]),
    ] {
        let args = &u[1..];
        let theirs = cmd(&tool(c), args, "127.0.0.1", udp).output().unwrap();
        let ours = cmd(&e.uroce, &u, "127.0.0.1", udp).output().unwrap();
        assert!(theirs.status.success(), "{c}: {}", text(&theirs));
        assert_eq!(
            String::from_utf8_lossy(&theirs.stdout),
            String::from_utf8_lossy(&ours.stdout),
            "{c} {args:?} on the drop-in library differs from uroce {u:?}"
        );
    }
    let v = cmd(&tool("ibv_devinfo"), &["-v"], "127.0.0.1", udp).output().unwrap();
    let v = text(&v);
    assert!(v.contains("hca_id:\turoce0") && v.contains("PORT_ACTIVE (4)"), "{v}");
    assert!(v.contains("GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2"), "{v}");
}

/// How an example of the table runs.
#[derive(Clone, Copy, PartialEq)]
enum Run {
    /// Server and client with the same flags (plus `-g 0 -n 200`, and the
    /// harness's port), 200 iterations, data checked with `-c`.
    Pair,
    /// Another test runs it (named).
    Elsewhere(&'static str),
    /// Started, its first line checked, then stopped.
    Watch,
    /// Server and client with the same flags (plus `-g 0`), both printing
    /// "success" (ibv_xsrq_pingpong's own check).
    Success,
    /// [`Run::Success`] with this many clients, all on one device (a
    /// server of several clients).
    Clients(usize),
}

/// Every rdma-core 44 example in Debian's ibverbs-utils, with every flag
/// its `--help` lists that means something on RoCE (`-p` is the harness's,
/// `-g 0` is every pingpong's: RoCE has no LIDs): one row per program and
/// flag set. The README's "rdma-core examples" table is generated from
/// these rows (`UROCE_UPDATE_README=1 cargo test -p uroce-ibverbs --test
/// drop_in readme` rewrites it; the test fails while they differ).
const EXAMPLES: &[(&str, &[&str], &str, Run)] = &[
    (
        "ibv_devices",
        &[],
        "the device list",
        Run::Elsewhere("devices_and_devinfo_match_uroce_tools"),
    ),
    (
        "ibv_devinfo",
        &["-v"],
        "every attribute, as `uroce devinfo -v`",
        Run::Elsewhere("devices_and_devinfo_match_uroce_tools"),
    ),
    ("ibv_asyncwatch", &[], "the async event descriptor, then events", Run::Watch),
    ("ibv_rc_pingpong", &["-c"], "4096-byte SENDs, data checked", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-s", "1"], "1 byte", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-s", "100000"], "many packets a message", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-m", "256"], "path MTU 256", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-m", "4096"], "path MTU 4096", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-r", "16"], "16 receives posted at a time", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-l", "3"], "service level 3", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-e"], "sleeping on completion events", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-e", "-s", "100000"], "events, many packets", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-d", "uroce0", "-i", "1"], "the device and port named", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-N"], "the new post-send API (`ibv_wr_*`)", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-t"], "completion timestamps", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-j"], "device memory", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-o"], "on-demand paging", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-O"], "implicit on-demand paging", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-o", "-P"], "ODP with prefetch advice", Run::Pair),
    ("ibv_rc_pingpong", &["-c", "-O", "-P"], "implicit ODP with prefetch advice", Run::Pair),
    ("ibv_uc_pingpong", &["-c"], "UC SENDs, data checked", Run::Pair),
    ("ibv_uc_pingpong", &["-c", "-s", "1"], "1 byte", Run::Pair),
    ("ibv_uc_pingpong", &["-c", "-s", "100000"], "many packets a message", Run::Pair),
    ("ibv_uc_pingpong", &["-c", "-m", "4096"], "path MTU 4096", Run::Pair),
    ("ibv_uc_pingpong", &["-c", "-r", "16"], "16 receives at a time", Run::Pair),
    ("ibv_uc_pingpong", &["-c", "-l", "3"], "service level 3", Run::Pair),
    ("ibv_uc_pingpong", &["-c", "-e"], "completion events", Run::Pair),
    ("ibv_ud_pingpong", &["-c"], "UD datagrams, data checked", Run::Pair),
    ("ibv_ud_pingpong", &["-c", "-s", "1"], "1 byte", Run::Pair),
    ("ibv_ud_pingpong", &["-c", "-s", "4096"], "a whole MTU", Run::Pair),
    ("ibv_ud_pingpong", &["-c", "-r", "16"], "16 receives at a time", Run::Pair),
    ("ibv_ud_pingpong", &["-c", "-l", "3"], "service level 3", Run::Pair),
    ("ibv_ud_pingpong", &["-c", "-e"], "completion events", Run::Pair),
    ("ibv_srq_pingpong", &["-c"], "16 QPs on one SRQ, data checked", Run::Pair),
    ("ibv_srq_pingpong", &["-c", "-s", "1"], "1 byte", Run::Pair),
    ("ibv_srq_pingpong", &["-c", "-s", "100000"], "many packets a message", Run::Pair),
    ("ibv_srq_pingpong", &["-c", "-m", "4096"], "path MTU 4096", Run::Pair),
    ("ibv_srq_pingpong", &["-c", "-q", "4"], "4 QPs", Run::Pair),
    ("ibv_srq_pingpong", &["-c", "-r", "64"], "64 receives at a time", Run::Pair),
    ("ibv_srq_pingpong", &["-c", "-l", "3"], "service level 3", Run::Pair),
    ("ibv_srq_pingpong", &["-c", "-e"], "completion events", Run::Pair),
    ("ibv_srq_pingpong", &["-c", "-o"], "on-demand paging", Run::Pair),
    (
        "ibv_xsrq_pingpong",
        &[],
        "XRC: an initiator QP to the peer's XRC SRQ through its target QP, 4096 bytes",
        Run::Success,
    ),
    ("ibv_xsrq_pingpong", &["-s", "1", "-n", "50"], "1 byte, 50 exchanges", Run::Success),
    ("ibv_xsrq_pingpong", &["-m", "4096"], "path MTU 4096", Run::Success),
    ("ibv_xsrq_pingpong", &["-l", "3"], "service level 3", Run::Success),
    ("ibv_xsrq_pingpong", &["-e"], "completion events", Run::Success),
    ("ibv_xsrq_pingpong", &["-o"], "on-demand paging", Run::Success),
    (
        "ibv_xsrq_pingpong",
        &["-c", "2"],
        "a server of two clients: each client's target QP takes messages for the other's XRC SRQ (a domain shared across processes: relayed to its owner)",
        Run::Clients(2),
    ),
];

#[test]
fn rdma_core_examples() {
    let _g = serial();
    env();
    let limit = Duration::from_secs(60);
    for &(prog, flags, what, run) in EXAMPLES {
        match run {
            Run::Pair => {
                let mut args = vec!["-g", "0", "-n", "200"];
                args.extend(flags);
                let p = same(prog, &args, limit);
                assert!(p.client_has("200 iters in"), "{what}: {p}");
                assert!(!p.server.contains("invalid data"), "{what}: data check failed: {p}");
                assert!(!p.client.contains("Couldn't"), "{what}: {p}");
            }
            Run::Success | Run::Clients(_) => {
                let mut args = vec!["-g", "0"];
                args.extend(flags);
                let n = if let Run::Clients(n) = run { n } else { 1 };
                let t = tool(prog);
                let p = fan((&t, &args), (&t, &args), n, limit);
                assert_eq!(p.client.matches("success").count(), n, "{what}: {p}");
                assert!(p.server.contains("success"), "{what}: {p}");
            }
            Run::Watch => {
                let c = cmd(&tool(prog), flags, "127.0.0.1", uroce::testing::free_port())
                    .spawn()
                    .unwrap();
                let (out, _) = finish(c, Instant::now() + Duration::from_secs(2));
                assert!(text(&out).contains("uroce0: async event FD"), "{prog}: {}", text(&out));
            }
            Run::Elsewhere(_) => {}
        }
    }
}

/// The README's table of the examples, as generated from `EXAMPLES`.
fn examples_table() -> String {
    let mut t = String::from(
        "| program | flags (both sides; pingpongs also `-g 0`, all but xsrq `-n 200`) | what it shows | state |\n\
         |---|---|---|---|\n",
    );
    for &(prog, flags, what, run) in EXAMPLES {
        let flags =
            if flags.is_empty() { "none".to_string() } else { format!("`{}`", flags.join(" ")) };
        let state = match run {
            Run::Pair | Run::Watch | Run::Success | Run::Clients(_) => "works".to_string(),
            Run::Elsewhere(test) => format!("works (`{test}`)"),
        };
        t.push_str(&format!("| {prog} | {flags} | {what} | {state} |\n"));
    }
    t
}

#[test]
fn readme_examples_table_is_generated_from_the_rows() {
    const BEGIN: &str = "<!-- rdma-core examples: generated by drop_in.rs -->\n";
    const END: &str = "<!-- end of rdma-core examples -->";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (Some(b), Some(e)) = (readme.find(BEGIN), readme.find(END)) else {
        panic!("README.md lacks the rdma-core examples markers");
    };
    let want = examples_table();
    let have = &readme[b + BEGIN.len()..e];
    if have != want {
        if std::env::var_os("UROCE_UPDATE_README").is_some() {
            let new = format!("{}{want}{}", &readme[..b + BEGIN.len()], &readme[e..]);
            std::fs::write(&path, new).unwrap();
        } else {
            panic!("README's examples table is stale; UROCE_UPDATE_README=1 rewrites it:\n{want}");
        }
    }
}

/// Each perftest tool with `args`; checks the client printed `rows` rows
/// with positive numbers.
fn perftest(name: &str, args: &[&str], rows: usize) {
    let p = same(name, args, Duration::from_secs(120));
    let r = perftest_rows(&p.client);
    assert_eq!(r.len(), rows, "expected {rows} result rows: {p}");
    for row in &r {
        // The message rate of a bandwidth test (its MB/s of 2-byte
        // messages print as 0.00 when a loaded machine slows the run to a
        // few thousand messages a second), or t_min and t_max of a
        // latency test (a stdev may be 0.00).
        let measured = if name.ends_with("_bw") {
            row.len() >= 5 && row[4] > 0.0
        } else {
            row[2] > 0.0 && row[3] > 0.0
        };
        assert!(measured, "a zero result: {row:?} {p}");
    }
}

const PERFTEST: [&str; 8] = [
    "ib_send_bw",
    "ib_send_lat",
    "ib_write_bw",
    "ib_write_lat",
    "ib_read_bw",
    "ib_read_lat",
    "ib_atomic_bw",
    "ib_atomic_lat",
];

#[test]
fn perftest_default_and_old_post_send() {
    let _g = serial();
    env();
    for t in PERFTEST {
        perftest(t, &[], 1);
        perftest(t, &["--use_old_post_send"], 1);
    }
    // Other transports and modes of the send tests. UD and UC drop a
    // message that finds no receive posted (no RNR), so a server that
    // reposts slower than the client sends (a busy machine) could wait
    // forever: keep all receives posted up front (iterations <= rx depth).
    perftest("ib_send_bw", &["-c", "UD", "-n", "200"], 1);
    perftest("ib_send_lat", &["-c", "UD"], 1);
    perftest("ib_send_bw", &["-c", "UC", "-n", "200"], 1);
    perftest("ib_write_bw", &["-c", "UC"], 1);
    perftest("ib_send_bw", &["-e"], 1);
    perftest("ib_atomic_bw", &["-A", "CMP_AND_SWAP"], 1);
    // Buffers registered on demand (--odp); perftest refuses ODP for its
    // atomic tests ("ODP does not support ATOMICS for now").
    for t in ["ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat", "ib_send_lat"] {
        perftest(t, &["--odp", "-n", "500"], 1);
    }
    // 128 outstanding READs/atomics, what rxe offers and perftest asks of
    // a peer (it failed "to modify QP to RTS" at 16).
    for t in ["ib_read_bw", "ib_atomic_bw"] {
        let p = same(t, &["-o", "128", "-n", "500"], Duration::from_secs(120));
        // perftest exits "Failed to modify QP to RTS" when the depth is refused.
        assert!(p.client_has(" Outstand reads  : 128"), "128 outstanding not asked for: {p}");
        assert_eq!(perftest_rows(&p.client).len(), 1, "{p}");
    }
}

/// perftest's default post path, `ibv_create_qp_ex` + `ibv_wr_*`, is taken
/// only on device ids it knows: report a ConnectX-5's part id (4119) to
/// run every tool through the extended QP, inline sizes included.
#[test]
fn perftest_wr_api_path() {
    let _g = serial();
    env();
    *EXTRA_ENV.lock().unwrap() = vec![("UROCE_VENDOR_PART_ID", "4119")];
    let run = std::panic::catch_unwind(|| {
        for t in PERFTEST {
            let p = same(t, &[], Duration::from_secs(120));
            assert!(p.client_has("ibv_wr* API     : ON"), "not on the ibv_wr path: {p}");
            assert_eq!(perftest_rows(&p.client).len(), 1, "{p}");
        }
        perftest("ib_send_lat", &["-c", "UD"], 1);
        perftest("ib_send_bw", &["-c", "UD", "-n", "200"], 1);
    });
    EXTRA_ENV.lock().unwrap_or_else(|e| e.into_inner()).clear();
    if let Err(e) = run {
        std::panic::resume_unwind(e);
    }
}

/// perftest options that mean something on RoCE: 16 QPs, a small TX
/// depth, Gb/s reports, an explicit GID index, and `--run_infinitely` for
/// a bounded time (both sides killed after a few reports). Not here:
/// `--use_hugepages` (needs huge pages reserved on the host) and GID index
/// 1 (on loopback both devices' second GID is the same `::1`).
#[test]
fn perftest_options() {
    let _g = serial();
    env();
    perftest("ib_write_bw", &["-q", "16", "-n", "200"], 1);
    perftest("ib_send_bw", &["-q", "16", "-n", "200"], 1);
    perftest("ib_read_bw", &["-t", "16", "-n", "500"], 1);
    perftest("ib_write_bw", &["--report_gbits", "-n", "500"], 1);
    perftest("ib_write_lat", &["-x", "0", "-n", "500"], 1);
    // --use_hugepages: buffers from SysV shared memory on huge pages,
    // which the test reserves (and gives back) as root.
    {
        let _pages = HugePages::reserve(64);
        perftest("ib_write_bw", &["--use_hugepages", "-n", "200"], 1);
        perftest("ib_read_lat", &["--use_hugepages", "-n", "200"], 1);
        perftest("ib_send_bw", &["--use_hugepages", "-n", "200"], 1);
    }
    // --run_infinitely -D 1: a report a second until killed.
    let udp = uroce::testing::free_port();
    let tcp = tcp_port().to_string();
    let args = ["--run_infinitely", "-D", "1", "-p", &tcp];
    let srv = cmd(&tool("ib_write_bw"), &args, "127.0.0.1", udp).spawn().unwrap();
    uroce::testing::wait_tcp_listening(tcp.parse().unwrap(), Duration::from_secs(20));
    let mut cargs = args.to_vec();
    cargs.push("127.0.0.1");
    let cli = cmd(&tool("ib_write_bw"), &cargs, "127.0.0.2", udp).spawn().unwrap();
    let stop = Instant::now() + Duration::from_secs(6);
    let (co, _) = finish(cli, stop);
    let (so, _) = finish(srv, Instant::now());
    let rows = perftest_rows(&text(&co));
    assert!(
        rows.len() >= 2 && rows.iter().all(|r| r.len() >= 5 && r[4] > 0.0),
        "want reports every second: {}\n--- server ---\n{}",
        text(&co),
        text(&so)
    );
}

#[test]
fn perftest_all_sizes() {
    let _g = serial();
    env();
    // -a: 2 B .. 8 MiB (23 sizes); perftest rejects -a for atomics.
    for t in PERFTEST.iter().filter(|t| !t.starts_with("ib_atomic")) {
        let n = if t.ends_with("_lat") { "20" } else { "50" };
        perftest(t, &["-a", "-n", n], 23);
    }
    // UD sizes stop at the MTU (4096 on loopback): 2 .. 4096.
    perftest("ib_send_bw", &["-a", "-n", "50", "-c", "UD"], 12);
}

/// How a `cm_pair` run ends.
#[derive(PartialEq)]
enum End {
    /// Both exit 0.
    Both,
    /// The client fails (the server is stopped).
    ClientFails,
    /// The client exits 0; the server serves on and is stopped.
    ServerStays,
}

/// Runs a server and a client that connect through the RDMA CM (no TCP
/// exchange): `{port}` in the arguments is the rdma_cm port. The client
/// starts once the server's device is open; the run must end as `end`
/// says within `limit`.
fn cm_pair(server: (&str, &[&str]), client: (&str, &[&str]), limit: Duration, end: End) -> Pair {
    let udp = uroce::testing::free_port();
    let port = tcp_port().to_string();
    let fill =
        |a: &[&str]| -> Vec<String> { a.iter().map(|x| x.replace("{port}", &port)).collect() };
    let (sargs, cargs) = (fill(server.1), fill(client.1));
    let label = format!("{} {} <-> {} {}", server.0, sargs.join(" "), client.0, cargs.join(" "));
    let deadline = Instant::now() + limit;
    let sargs: Vec<&str> = sargs.iter().map(String::as_str).collect();
    let cargs: Vec<&str> = cargs.iter().map(String::as_str).collect();
    let srv = cmd(&tool(server.0), &sargs, "127.0.0.1", udp).spawn().unwrap();
    // Ready when the server opened its device (it does when it binds its
    // id, just before it listens; a request a moment early waits for the
    // listener) or listens on TCP (qperf, whose tests start there).
    let tcp: u16 = port.parse().unwrap();
    while !(uroce::testing::wait_udp_bound(udp, Duration::ZERO)
        || uroce::testing::tcp_listening(tcp))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let cli = cmd(&tool(client.0), &cargs, "127.0.0.2", udp).spawn().unwrap();
    let (co, ct) = finish(cli, deadline);
    let grace = if end == End::Both { deadline + Duration::from_secs(2) } else { Instant::now() };
    let (so, st) = finish(srv, grace);
    let p = Pair { label, server: text(&so), client: text(&co) };
    assert!(!ct, "timed out after {limit:?}: {p}");
    match end {
        End::ClientFails => assert!(!co.status.success(), "the client should have failed: {p}"),
        End::ServerStays => assert!(co.status.success(), "failed: {p}"),
        End::Both => {
            assert!(!st, "the server timed out: {p}");
            assert!(so.status.success() && co.status.success(), "failed: {p}");
        }
    }
    p
}

#[test]
fn rdmacm_utils_connect_through_the_cm() {
    let _g = serial();
    env();
    let limit = Duration::from_secs(60);
    // rping: the client SENDs its buffer's address, the server READs the
    // ping and WRITEs it back, the client checks (-V) each of 20.
    let p = cm_pair(
        ("rping", &["-s", "-a", "127.0.0.1", "-p", "{port}", "-C", "20", "-V", "-v"]),
        ("rping", &["-c", "-a", "127.0.0.1", "-p", "{port}", "-C", "20", "-V", "-v"]),
        limit,
        End::Both,
    );
    assert!(p.client_has("ping data: rdma-ping-19:"), "{p}");
    assert!(p.server.contains("server ping data: rdma-ping-19:"), "{p}");
    assert!(p.server.contains("DISCONNECT EVENT"), "{p}");
    // uroce's own rping against Debian's, both ways, through the CM.
    let me = env().uroce.to_str().unwrap().to_string();
    let p = cm_pair(
        (me.as_str(), &["rping", "-s", "-a", "127.0.0.1", "-p", "{port}", "-v"]),
        ("rping", &["-c", "-a", "127.0.0.1", "-p", "{port}", "-C", "10", "-V", "-v"]),
        limit,
        End::Both,
    );
    assert!(p.server.contains("server ping data: rdma-ping-9:"), "{p}");
    let p = cm_pair(
        ("rping", &["-s", "-a", "127.0.0.1", "-p", "{port}", "-v"]),
        (me.as_str(), &["rping", "-c", "-a", "127.0.0.1", "-p", "{port}", "-C", "10", "-v"]),
        limit,
        End::Both,
    );
    assert!(p.client_has("ping data: rdma-ping-9:") && p.server.contains("DISCONNECT"), "{p}");
    // rping with 65000-byte pings (-S; 65536 is refused by rping): each READ and WRITE is many packets.
    let p = cm_pair(
        ("rping", &["-s", "-a", "127.0.0.1", "-p", "{port}", "-S", "65000", "-C", "5", "-V"]),
        ("rping", &["-c", "-a", "127.0.0.1", "-p", "{port}", "-S", "65000", "-C", "5", "-V"]),
        limit,
        End::Both,
    );
    assert!(!p.client_has("data mismatch"), "{p}");
    // ucmatose: ten connections, 10 SENDs each way, then disconnects.
    let p = cm_pair(
        ("ucmatose", &["-b", "127.0.0.1", "-p", "{port}", "-c", "10", "-C", "10"]),
        ("ucmatose", &["-s", "127.0.0.1", "-p", "{port}", "-c", "10", "-C", "10"]),
        limit,
        End::Both,
    );
    assert!(p.client_has("data transfers complete") && p.server.contains("disconnected"), "{p}");
    // A port nobody listens on: the CM's reject, reason 8 (invalid
    // service ID), as the kernel's CM gives it.
    let p = cm_pair(
        ("rping", &["-s", "-a", "127.0.0.1", "-p", "1", "-C", "1"]),
        ("rping", &["-c", "-a", "127.0.0.1", "-p", "{port}", "-C", "1", "-v"]),
        limit,
        End::ClientFails,
    );
    assert!(p.client_has("RDMA_CM_EVENT_REJECTED, error 8"), "{p}");
    // No uroce device at all at the server's address (nothing bound to
    // its port: say, its process died): each REQ's ICMP port unreachable
    // brings the next try forward, and the connect ends as one to a host
    // without a CM ends (UNREACHABLE, -ETIMEDOUT), in seconds, not after
    // a minute of REQ retries.
    let udp = uroce::testing::free_port();
    let ps = tcp_port().to_string();
    let started = Instant::now();
    let cli = rping_client(&ps, udp);
    let (out, timed_out) = finish(cli, started + Duration::from_secs(30));
    assert!(!timed_out && !out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("RDMA_CM_EVENT_UNREACHABLE, error -110"), "{}", text(&out));
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    // An address no uroce device reaches (IPv6, the devices are IPv4):
    // address resolution ends in ADDR_ERROR, -ENODEV, as the kernel's CM
    // reports it, not in a hang.
    let p = cm_pair(
        ("rping", &["-s", "-a", "127.0.0.1", "-p", "{port}", "-C", "1"]),
        ("rping", &["-c", "-a", "::1", "-p", "{port}", "-C", "1", "-v"]),
        limit,
        End::ClientFails,
    );
    assert!(p.client_has("RDMA_CM_EVENT_ADDR_ERROR, error -19"), "{p}");
    // udaddy: UD ids, the server's QP found by SIDR, 10 datagrams each
    // way (its rdma_cm port is fixed, 7174: a service of this device).
    let p = cm_pair(
        ("udaddy", &["-b", "127.0.0.1", "-C", "10"]),
        ("udaddy", &["-s", "127.0.0.1", "-C", "10"]),
        limit,
        End::Both,
    );
    assert!(p.client_has("data transfers complete") && p.server.contains("sending replies"), "{p}");
    // mckey: both join a multicast group through the CM (the join event's
    // address vector, remote QPN 0xFFFFFF, the UDP port space's Q_Key);
    // the sender's 10 datagrams reach the receiver's attached QP.
    let p = cm_pair(
        ("mckey", &["-m", "239.255.77.1", "-b", "127.0.0.1"]),
        ("mckey", &["-m", "239.255.77.1", "-b", "127.0.0.2", "-s"]),
        limit,
        End::Both,
    );
    assert!(p.client_has("joined dgid: ::ffff:239.255.77.1"), "{p}");
    assert!(p.server.contains("data transfers complete"), "{p}");
    // rdma_server / rdma_client: synchronous ids through rdma_create_ep
    // and rdma_get_request, CQs and channels made by the library, one
    // SEND each way (`rdma_get_send_comp`/`_recv_comp` wait on them).
    let p = cm_pair(
        ("rdma_server", &["-p", "{port}"]),
        ("rdma_client", &["-s", "127.0.0.1", "-p", "{port}"]),
        limit,
        End::Both,
    );
    assert!(p.client_has("rdma_client: end 0") && p.server.contains("rdma_server: end 0"), "{p}");
    // rdma_xserver / rdma_xclient over RC (their default): synchronous
    // endpoints, the client's inline SEND
    // received by the server, each side's rdma_disconnect waiting for
    // DISCONNECTED.
    let p = cm_pair(
        ("rdma_xserver", &["-p", "{port}"]),
        ("rdma_xclient", &["-s", "127.0.0.1", "-p", "{port}"]),
        limit,
        End::Both,
    );
    assert!(p.client_has("rdma_xclient: end 0") && p.server.contains("rdma_xserver: end 0"), "{p}");
    // And over XRC (`-c x`, RDMA_PS_IB): the server's target QP in the
    // device's XRC domain, an XRC SRQ whose number goes to the client in
    // the REP's private data, the client's XRC SEND naming it.
    let p = cm_pair(
        ("rdma_xserver", &["-c", "x", "-p", "{port}"]),
        ("rdma_xclient", &["-c", "x", "-s", "127.0.0.1", "-p", "{port}"]),
        limit,
        End::Both,
    );
    assert!(p.client_has("rdma_xclient: end 0") && p.server.contains("rdma_xserver: end 0"), "{p}");
    // cmtime: 20 connections set up and torn down concurrently, each
    // step timed (the server serves on).
    let p = cm_pair(
        ("cmtime", &["-b", "127.0.0.1", "-p", "{port}", "-c", "20"]),
        ("cmtime", &["-s", "127.0.0.1", "-p", "{port}", "-c", "20"]),
        limit,
        End::ServerStays,
    );
    assert!(p.client_has("connect      :") && p.client_has("destroy      :"), "{p}");
}

/// libfabric's verbs provider, unmodified (libfabric-bin's fi_pingpong,
/// its control exchange on TCP `{port}`): datagram endpoints on UD QPs,
/// and reliable datagram endpoints by ofi_rxd over them, each message's
/// data checked (-c), every size up to 1 MiB for RDM.
#[test]
fn libfabric_verbs_provider_runs() {
    let _g = serial();
    env();
    let limit = Duration::from_secs(60);
    for (prov, ep) in [("verbs", "dgram"), ("verbs;ofi_rxd", "rdm")] {
        let p = cm_pair(
            ("fi_pingpong", &["-p", prov, "-e", ep, "-I", "100", "-c", "-B", "{port}"]),
            (
                "fi_pingpong",
                &["-p", prov, "-e", ep, "-I", "100", "-c", "-P", "{port}", "127.0.0.1"],
            ),
            limit,
            End::Both,
        );
        let last = if ep == "rdm" { "1m " } else { "1k " };
        assert!(p.client.lines().any(|l| l.starts_with(last) && l.contains("=100")), "{p}");
    }
}

#[test]
fn qperf_connects_through_the_cm() {
    let _g = serial();
    env();
    // qperf's server serves one test per connection; -cm1 makes each
    // test's RC connection through rdma_cm.
    let p = cm_pair(
        ("qperf", &["-lp", "{port}"]),
        (
            "qperf",
            &[
                "-lp",
                "{port}",
                "127.0.0.1",
                "-cm1",
                "-t",
                "1",
                "rc_lat",
                "rc_bw",
                "rc_rdma_read_bw",
            ],
        ),
        Duration::from_secs(60),
        End::ServerStays,
    );
    for t in ["rc_lat:", "rc_bw:", "rc_rdma_read_bw:"] {
        assert!(p.client_has(t), "{t} missing: {p}");
    }
    assert!(p.client_has("latency  =") && p.client.matches("bw  =").count() == 2, "{p}");
}

#[test]
fn perftest_over_rdma_cm() {
    let _g = serial();
    env();
    for t in PERFTEST {
        let args = ["-R", "-p", "{port}", "-n", "500"];
        let mut cargs = args.to_vec();
        cargs.push("127.0.0.1");
        let p = cm_pair((t, &args), (t, &cargs), Duration::from_secs(120), End::Both);
        assert!(p.client_has("rdma_cm QPs	 : ON"), "not over rdma_cm: {p}");
        let r = perftest_rows(&p.client);
        assert_eq!(r.len(), 1, "{p}");
        assert!(r[0][2] > 0.0 && r[0][3] > 0.0, "a zero result: {p}");
    }
    // UD through the CM (SIDR), and rdma_cm as the exchange for regular
    // QPs (-z). UD drops a datagram that finds no receive: iterations
    // within the receive depth.
    for (t, extra) in [
        ("ib_send_bw", &["-R", "-c", "UD", "-n", "200"][..]),
        ("ib_send_lat", &["-R", "-c", "UD", "-n", "200"][..]),
        ("ib_write_bw", &["-R", "-q", "4", "-n", "200"][..]),
        ("ib_send_bw", &["-z", "-n", "200"][..]),
        ("ib_write_lat", &["-z", "-n", "200"][..]),
    ] {
        let mut args = vec!["-p", "{port}"];
        args.extend(extra);
        let mut cargs = args.clone();
        cargs.push("127.0.0.1");
        let p = cm_pair((t, &args), (t, &cargs), Duration::from_secs(120), End::Both);
        assert_eq!(perftest_rows(&p.client).len(), 1, "{p}");
    }
}

#[test]
fn mixed_pairs_with_uroce_tools() {
    let _g = serial();
    let e = env();
    let limit = Duration::from_secs(60);
    for kind in ["rc", "uc", "ud", "srq"] {
        let theirs = tool(&format!("ibv_{kind}_pingpong"));
        // -c on both sides: rdma-core's pattern both ways (its server
        // prints "invalid data in page N" on a mismatch; uroce fails).
        let ours_args = ["pingpong", kind, "-g", "0", "-n", "200", "-c"];
        let their_args = ["-g", "0", "-n", "200", "-c"];
        let p = pair((&theirs, &their_args), (&e.uroce, &ours_args), limit);
        assert!(p.client_has("200 iters in"), "{p}");
        assert!(!p.server.contains("invalid data"), "{p}");
        let p = pair((&e.uroce, &ours_args), (&theirs, &their_args), limit);
        assert!(p.client_has("200 iters in"), "{p}");
    }
    for t in ["send-bw", "write-lat", "read-bw", "atomic-lat"] {
        let theirs = tool(&format!("ib_{}", t.replace('-', "_")));
        let ours = ["perf", t];
        for (s, c) in [
            ((&theirs, &[][..]), (&e.uroce, &ours[..])),
            ((&e.uroce, &ours[..]), (&theirs, &[][..])),
        ] {
            let p = pair((s.0.as_path(), s.1), (c.0.as_path(), c.1), limit);
            assert_eq!(perftest_rows(&p.client).len(), 1, "{p}");
        }
    }
}

/// `uroce perf -R` and Debian's perftest `-R` face each other both ways:
/// the side channel an rdma_cm connection of its own (binary records, one
/// SEND each), every test QP connected by the CM on the same port.
#[test]
fn uroce_perf_over_rdma_cm_against_perftest() {
    let _g = serial();
    let e = env();
    let me = e.uroce.to_str().unwrap().to_string();
    let limit = Duration::from_secs(60);
    for (t, extra) in [
        ("write-bw", &["-q", "3"][..]),
        ("send-lat", &[][..]),
        ("read-bw", &[][..]),
        ("atomic-lat", &[][..]),
        ("send-bw", &[][..]),
    ] {
        let theirs = format!("ib_{}", t.replace('-', "_"));
        let mut pt: Vec<&str> = vec!["-R", "-p", "{port}"];
        pt.extend(extra);
        let mut ours: Vec<&str> = vec!["perf", t, "-R", "-p", "{port}"];
        ours.extend(extra);
        let with_server = |v: &[&'static str]| -> Vec<&str> {
            let mut c: Vec<&str> = v.to_vec();
            c.push("127.0.0.1");
            c
        };
        let (pt_c, ours_c) = (with_server(&pt), with_server(&ours));
        for (s, c) in [
            ((theirs.as_str(), &pt[..]), (me.as_str(), &ours_c[..])),
            ((me.as_str(), &ours[..]), (theirs.as_str(), &pt_c[..])),
        ] {
            let p = cm_pair(s, c, limit, End::Both);
            assert_eq!(perftest_rows(&p.client).len(), 1, "{p}");
            assert!(p.server.contains("rdma_cm QPs\t : ON"), "{p}");
        }
    }
}

#[test]
fn c_api_through_the_headers() {
    run_c_program("api.c", &["-libverbs"]);
}

/// `fork()` with a device open (Python's multiprocessing does it): each
/// child opens its own context and runs traffic, the parent's keeps
/// working, and a child's exit leaves the parent's share of the device
/// (its slot, its files) alone.
#[test]
fn a_forked_child_opens_its_own_context() {
    run_c_program("fork.c", &["-libverbs"]);
}

/// `ibv_open_qp` across processes (`tests/c/xrc_open.c`): a child process
/// opens the parent's XRC target QP, brings it up through its handle and
/// owns the SRQ the parent's initiator sends to through it; the QP
/// outlives the parent's handle and goes with the child's.
#[test]
fn an_xrc_target_qp_is_opened_by_another_process() {
    run_c_program("xrc_open.c", &["-libverbs"]);
}

/// Raw packet QPs and flow rules through the headers (`tests/c/raw.c`).
#[test]
fn raw_packet_qps_and_flow_rules() {
    run_c_program("raw.c", &["-libverbs"]);
}

/// librdmacm through its header: `rdma_set_option`'s checks and effects
/// (TOS and ACK timeout on a connection to this device itself), the
/// kernel's port rules for `rdma_bind_addr`/`rdma_listen`, multicast joins.
#[test]
fn cm_api_through_the_headers() {
    run_c_program("cm_api.c", &["-lrdmacm", "-libverbs"]);
}

/// Compiles `tests/c/<name>` against the installed headers and runs it on
/// the drop-in library (device uroce0 on 127.0.0.1); it must end with
/// "all checks passed".
fn run_c_program(name: &str, libs: &[&str]) {
    let _g = serial();
    env();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(name);
    let exe = std::env::temp_dir().join(format!("uroce-c-{name}-{}", std::process::id()));
    let cc = Command::new("cc")
        .args(["-std=gnu11", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(libs)
        .output()
        .expect("running cc");
    assert!(cc.status.success(), "compiling {name} (needs the -dev packages): {}", text(&cc));
    let udp = uroce::testing::free_port();
    let child = cmd(&exe, &[], "127.0.0.1", udp).spawn().unwrap();
    let (out, timed_out) = finish(child, Instant::now() + Duration::from_secs(60));
    let _ = std::fs::remove_file(&exe);
    assert!(!timed_out && out.status.success(), "{name}: {}", text(&out));
    assert!(text(&out).contains("all checks passed"), "{}", text(&out));
}

#[test]
fn exports_are_exactly_the_versioned_table() {
    let e = env();
    let lib = e.lib_dir.join("libibverbs.so.1");
    let out = Command::new("readelf").args(["--dyn-syms", "-W"]).arg(&lib).output().unwrap();
    assert!(out.status.success(), "readelf: {}", text(&out));
    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() >= 8 && w[6] != "UND" && w[6] != "Ndx" && w[0].ends_with(':'))
                .then(|| w[7].to_string())
        })
        .filter(|s| !s.is_empty())
        .collect();
    got.sort();
    let table = include_str!("../src/exports.txt");
    let mut want: Vec<String> = table
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            format!("{}@@{}", w[0], w[1])
        })
        .collect();
    want.sort();
    assert_eq!(got, want, "the library must export exactly exports.txt, each name versioned");
    let soname = Command::new("readelf").args(["-d"]).arg(&lib).output().unwrap();
    assert!(text(&soname).contains("Library soname: [libibverbs.so.1]"), "{}", text(&soname));
}

/// The defined functions of a shared library with their default version
/// nodes (compat `name@NODE` entries are left out: no Debian 12 binary
/// references the 2006 ABI).
/// The functions and variables `lib` defines: (name, version node, type).
fn defined_names(lib: &Path) -> Vec<(String, String, String)> {
    let out = Command::new("readelf").args(["--dyn-syms", "-W"]).arg(lib).output().unwrap();
    assert!(out.status.success(), "readelf: {}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() < 8 || w[6] == "UND" || w[6] == "Ndx" || !["FUNC", "OBJECT"].contains(&w[3])
            {
                return None;
            }
            let (name, node) = w[7].split_once("@@")?;
            Some((name.to_string(), node.to_string(), w[3].to_string()))
        })
        .collect()
}

/// Every function and variable Debian 12's own libibverbs.so.1,
/// librdmacm.so.1, libmlx5.so.1 and libefa.so.1 export is in the drop-in
/// library or its stubs, under the same node and of the same type, so that nothing linked against them (pyverbs, provider
/// libraries, perftest, UCX, libfabric) fails to load.
#[test]
fn every_function_of_debians_libraries_is_exported() {
    for name in ["libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"] {
        let real = Path::new("/usr/lib/x86_64-linux-gnu").join(name);
        if !real.exists() {
            assert!(std::env::var_os("CI").is_none(), "no Debian {name} in CI");
            continue;
        }
        let ours = defined_names(&env().lib_dir.join(name));
        let missing: Vec<String> = defined_names(&real)
            .into_iter()
            .filter(|nv| !ours.contains(nv))
            .map(|(n, v, t)| format!("{n}@{v} ({t})"))
            .collect();
        assert!(missing.is_empty(), "{name}: not exported: {missing:?}");
    }
}

/// The layout numbers the Rust mirrors are tested against (src/abi.rs)
/// are those of the headers installed here (libibverbs-dev and
/// librdmacm-dev 44).
#[test]
fn layout_numbers_are_the_installed_headers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/layout.c");
    let exe = std::env::temp_dir().join(format!("uroce-layout-{}", std::process::id()));
    let cc = Command::new("cc").args(["-O0", "-Wall", "-o"]).arg(&exe).arg(&src).output().unwrap();
    assert!(
        cc.status.success(),
        "compiling layout.c (needs libibverbs-dev, librdmacm-dev): {}",
        text(&cc)
    );
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_file(&exe);
    assert_eq!(String::from_utf8_lossy(&out.stdout), include_str!("layout.txt"));
}

/// Debian's rping as a one-ping client of 127.0.0.1's rdma_cm port `ps`,
/// on a device at 127.0.0.2:`udp`.
fn rping_client(ps: &str, udp: u16) -> Child {
    let args = ["-c", "-a", "127.0.0.1", "-p", ps, "-C", "1", "-v"];
    cmd(&tool("rping"), &args, "127.0.0.2", udp).spawn().unwrap()
}

/// A peer process killed in the middle of a transfer, with the QPs
/// connected over TCP and through the RDMA CM (`-R`): the survivor's
/// outstanding WRITEs end in a retry-exceeded completion (status 12)
/// within its retry budget, and it exits with an error; it neither hangs
/// nor crashes.
#[test]
fn peer_killed_mid_transfer_ends_in_an_error_completion() {
    let _g = serial();
    env();
    for extra in [&[][..], &["-R"]] {
        killed_mid_transfer(extra);
    }
}

fn killed_mid_transfer(extra: &[&str]) {
    use std::io::BufRead;
    let udp = uroce::testing::free_port();
    let port = tcp_port().to_string();
    let args = [&["-p", port.as_str(), "-D", "30"][..], extra].concat();
    let mut srv = cmd(&tool("ib_write_bw"), &args, "127.0.0.1", udp).spawn().unwrap();
    // Ready when it listens on TCP, or (-R) has opened its device.
    let ready = Instant::now() + Duration::from_secs(20);
    while !(uroce::testing::tcp_listening(port.parse().unwrap())
        || uroce::testing::wait_udp_bound(udp, Duration::ZERO))
        && Instant::now() < ready
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Line-buffered (stdbuf), so the table's header shows when the run
    // starts.
    let cargs = [&["-oL", "ib_write_bw"], args.as_slice(), &["127.0.0.1"]].concat();
    let mut cli = cmd(&tool("stdbuf"), &cargs, "127.0.0.2", udp).spawn().unwrap();
    // The run has started once the client prints its table's header.
    let stdout = cli.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = String::new();
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("#bytes") {
                let _ = tx.send(());
            }
            seen.push_str(&line);
            seen.push('\n');
        }
        seen
    });
    let started = rx.recv_timeout(Duration::from_secs(30)).is_ok();
    std::thread::sleep(Duration::from_millis(500));
    let _ = srv.kill();
    let (so, _) = finish(srv, Instant::now());
    let killed = Instant::now();
    let (out, timed_out) = finish(cli, killed + Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let label = format!("ib_write_bw {}", args.join(" "));
    assert!(started, "{label}: the transfer never started: {err}\n--- server ---\n{}", text(&so));
    assert!(!timed_out, "{label}: the survivor hung after its peer died: {err}");
    assert!(!out.status.success(), "{label}: the survivor should fail: {err}");
    assert!(err.contains("Failed status 12"), "{label}: a retry-exceeded completion: {err}");
    eprintln!("{label}: the survivor ended {:?} after the kill", killed.elapsed());
}

/// Forged and malformed rdma_cm headers in a REQ to Debian's rping
/// server: each is refused with the consumer-defined REJ (28), as the
/// kernel's CM does, and never reaches the application, which then serves
/// a real client.
#[test]
fn malformed_cma_headers_are_refused() {
    use uroce::cm::{AgentEvent, CmChannel, CmChannelEvent, Offer, RequestArgs};
    use uroce::wire::cm::{CmPath, CmaHeader, port_space, rdma_cm_service_id};
    let _g = serial();
    env();
    let udp = uroce::testing::free_port();
    let port = tcp_port();
    let ps = port.to_string();
    let srv = cmd(
        &tool("rping"),
        &["-s", "-a", "127.0.0.1", "-p", &ps, "-C", "1", "-v"],
        "127.0.0.1",
        udp,
    )
    .spawn()
    .unwrap();
    assert!(uroce::testing::wait_udp_bound(udp, Duration::from_secs(20)), "rping did not start");
    std::thread::sleep(Duration::from_millis(300));
    let me = uroce::testing::open("127.0.0.2", udp);
    let ch = CmChannel::new().unwrap();
    let request = |private_data: [u8; 92]| RequestArgs {
        peer: "127.0.0.1".parse().unwrap(),
        service_id: rdma_cm_service_id(port_space::TCP, port),
        qp: Offer {
            qpn: 0x77,
            starting_psn: 1,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            srq: false,
            ece: uroce::cm::Ece::default(),
        },
        transport_service_type: 0,
        retry_count: 7,
        path_mtu: 5,
        path: CmPath::default(),
        response_timeout: 16,
        max_cm_retries: 3,
        private_data,
    };
    let header = |version: u8, dst: &str| {
        let mut pd = [0u8; 92];
        CmaHeader {
            version,
            src_port: 5000,
            src: "127.0.0.2".parse().unwrap(),
            dst: dst.parse().unwrap(),
        }
        .emit(&mut pd);
        pd
    };
    let mut bad_ip_version = header(0, "127.0.0.1");
    bad_ip_version[1] = 5 << 4;
    for (what, pd) in [
        ("garbage", [0xa5; 92]),
        ("cma version 1", header(1, "127.0.0.1")),
        ("IP version 5", bad_ip_version),
        ("an address not the device's", header(0, "10.9.8.7")),
    ] {
        // Reason 8 means rping is not listening yet (a loaded machine):
        // ask again.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let id = me.cm_request(&request(pd), &ch);
            match ch.get_timeout(Duration::from_secs(10)).unwrap() {
                Some(CmChannelEvent::Cm {
                    event: AgentEvent::Rejected { id: r, reason: 8, .. },
                    ..
                }) if r == id && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Some(CmChannelEvent::Cm {
                    event: AgentEvent::Rejected { id: r, reason, .. },
                    ..
                }) => {
                    assert_eq!((r, reason), (id, 28), "{what}");
                    break;
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }
    drop(me);
    // The server is unharmed: a real client connects and pings.
    let cli = rping_client(&ps, udp);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (co, ct) = finish(cli, deadline);
    let (so, st) = finish(srv, deadline);
    assert!(
        !ct && !st && co.status.success() && so.status.success(),
        "{}\n{}",
        text(&co),
        text(&so)
    );
    assert!(text(&so).contains("server ping data: rdma-ping-0"), "{}", text(&so));
}

/// The stub provider libraries (`libmlx5.so.1`, `libefa.so.1`) export
/// every versioned name their consumers import from them: perftest,
/// libfabric, and UCX's libuct_ib when installed (a name missing, or
/// under another version node, and the consumer does not load at all).
#[test]
fn provider_stubs_satisfy_their_consumers() {
    let e = env();
    let syms = |path: &Path| -> Vec<(String, String, bool)> {
        let out = Command::new("objdump").arg("-T").arg(path).output().expect("running objdump");
        assert!(out.status.success(), "objdump -T {}: {}", path.display(), text(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let (ver, name) = (w.get(w.len().wrapping_sub(2))?, w.last()?);
                let ver = ver.trim_matches(|c| c == '(' || c == ')');
                (ver.starts_with("MLX5_") || ver.starts_with("EFA_"))
                    .then(|| (ver.to_string(), name.to_string(), l.contains("*UND*")))
            })
            .collect()
    };
    let mut exported: Vec<(String, String)> = Vec::new();
    for stub in ["libmlx5.so.1", "libefa.so.1"] {
        exported.extend(
            syms(&e.lib_dir.join(stub)).into_iter().filter(|s| !s.2).map(|(v, n, _)| (v, n)),
        );
    }
    let perftest = String::from_utf8_lossy(
        &Command::new("sh").args(["-c", "command -v ib_write_bw"]).output().unwrap().stdout,
    )
    .trim()
    .to_string();
    let consumers = [
        perftest.as_str(),
        "/usr/lib/x86_64-linux-gnu/libfabric.so.1",
        "/usr/lib/x86_64-linux-gnu/ucx/libuct_ib.so.0",
    ];
    let mut checked = 0;
    for c in consumers.iter().map(Path::new).filter(|p| p.exists()) {
        for (ver, name, _) in syms(c).into_iter().filter(|s| s.2) {
            assert!(
                exported.contains(&(ver.clone(), name.clone())),
                "{} imports {name}@{ver}, which the stubs do not export",
                c.display()
            );
            checked += 1;
        }
    }
    assert!(
        checked > 0,
        "no consumer of the stubs found (perftest is installed by the test command)"
    );
}

/// One device address shared by many processes (issue 15): three
/// unmodified `ib_write_bw` servers on one device address and port, their
/// three clients on another; one server is SIGKILLed mid-run, its client
/// ends in a retry-exceeded completion, and the two other pairs finish
/// with every byte counted, as on a shared kernel device.
#[test]
fn processes_share_one_device() {
    let _g = serial();
    env();
    let udp = uroce::testing::free_port();
    let ports: Vec<String> = (0..3).map(|_| tcp_port().to_string()).collect();
    let args = |p: &str| vec!["-p".to_string(), p.to_string(), "-D".into(), "3".into()];
    let mut servers: Vec<Child> = ports
        .iter()
        .map(|p| {
            let a = args(p);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            cmd(&tool("ib_write_bw"), &a, "127.0.0.1", udp).spawn().unwrap()
        })
        .collect();
    for p in &ports {
        uroce::testing::wait_tcp_listening(p.parse().unwrap(), Duration::from_secs(20));
    }
    // Line-buffered, so that the first client's column header (printed
    // once its QP is connected, as its run starts) arrives at once.
    let mut clients: Vec<Child> = ports
        .iter()
        .map(|p| {
            let mut a = vec!["-oL".to_string(), "ib_write_bw".into()];
            a.extend(args(p));
            a.push("127.0.0.1".into());
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            cmd(&tool("stdbuf"), &a, "127.0.0.2", udp).spawn().unwrap()
        })
        .collect();
    // The first server is killed in the middle of its client's run: once
    // the client started it (however long that takes on a loaded
    // machine), a second into its three.
    let (started, watched) = watch_for(clients[0].stdout.take().unwrap(), "#bytes");
    let running = started.recv_timeout(Duration::from_secs(30)).is_ok();
    std::thread::sleep(Duration::from_secs(1));
    let _ = servers[0].kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut outs: Vec<(Output, bool)> = clients.into_iter().map(|c| finish(c, deadline)).collect();
    outs[0].0.stdout = watched.join().unwrap();
    assert!(running, "the first client never started:\n{}", text(&outs[0].0));
    let souts: Vec<(Output, bool)> = servers.into_iter().map(|s| finish(s, deadline)).collect();
    let all = outs
        .iter()
        .chain(&souts)
        .map(|(o, _)| text(o))
        .collect::<Vec<_>>()
        .join("\n--- next ---\n");
    assert!(outs.iter().chain(&souts).all(|(_, t)| !t), "a process hung:\n{all}");
    let (killed, _) = &outs[0];
    assert!(
        !killed.status.success() && text(killed).contains("Failed status 12"),
        "the killed server's client ends in retry exceeded:\n{all}"
    );
    for (o, _) in outs[1..].iter().chain(&souts[1..]) {
        assert!(o.status.success(), "a surviving pair failed:\n{all}");
        let rows = perftest_rows(&text(o));
        assert!(rows.iter().any(|r| r.len() >= 4 && r[3] > 0.0), "no bandwidth:\n{all}");
    }
}

/// Reads `out` to its end on a thread, which returns all of it; the
/// receiver hears once a line containing `marker` came.
fn watch_for(
    out: std::process::ChildStdout,
    marker: &'static str,
) -> (std::sync::mpsc::Receiver<()>, std::thread::JoinHandle<Vec<u8>>) {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut lines = std::io::BufReader::new(out);
        let mut line = String::new();
        while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
            if line.contains(marker) {
                let _ = tx.send(());
            }
            all.extend_from_slice(line.as_bytes());
            line.clear();
        }
        all
    });
    (rx, reader)
}

/// rping's server and client as two processes on one device address: the
/// client's REQ reaches the server's listener and every later MAD the
/// connection it belongs to (steered by port and communication ID).
#[test]
fn rping_server_and_client_on_one_device() {
    let _g = serial();
    env();
    let udp = uroce::testing::free_port();
    let ps = tcp_port().to_string();
    let sargs = ["-s", "-a", "127.0.0.1", "-p", &ps, "-C", "10", "-V", "-v"];
    let srv = cmd(&tool("rping"), &sargs, "127.0.0.1", udp).spawn().unwrap();
    assert!(uroce::testing::wait_udp_bound(udp, Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(200));
    let cargs = ["-c", "-a", "127.0.0.1", "-p", &ps, "-C", "10", "-V", "-v"];
    let cli = cmd(&tool("rping"), &cargs, "127.0.0.1", udp).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (co, ct) = finish(cli, deadline);
    let (so, st) = finish(srv, deadline + Duration::from_secs(2));
    let p = Pair { label: "rping on one device".into(), server: text(&so), client: text(&co) };
    assert!(!ct && !st, "timed out: {p}");
    assert!(so.status.success() && co.status.success(), "failed: {p}");
    assert_eq!(p.client.matches("ping data: rdma-ping-").count(), 10, "{p}");
}

/// A program SIGKILLed with a connection up, alone on its device: `uroce
/// run` ends the connection for it once it is dead (the DREQ a host's
/// kernel CM sends when a process's cm_ids die with it), so the peer sees
/// the disconnect though nothing else would tell it. Debian's `rping`
/// client connects to a listener of this test's and is killed.
#[test]
fn uroce_run_ends_the_connections_of_a_killed_program() {
    let _g = serial();
    env();
    const T: Duration = Duration::from_secs(20);
    let udp = uroce::testing::free_port();
    let port = tcp_port();
    let server = uroce::testing::open("127.0.0.1", udp);
    let listener = server.cm_listen(port).unwrap();
    let ps = port.to_string();
    let args = ["run", "--no-device-files", "--", "rping", "-c", "-a", "127.0.0.1", "-p", &ps];
    let run = cmd(&env().uroce, &args, "127.0.0.2", udp).spawn().unwrap();
    let pd = server.alloc_pd().unwrap();
    let cq = server.create_cq(16).unwrap();
    let caps = uroce::QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = uroce::testing::rc_qp(&pd, &cq, caps, true);
    // Accepted, never answered: the client waits for our reply.
    let conn = listener.accept(&qp, b"", T).unwrap();
    // The client's list is published within 100 ms of the connection (a
    // progress pass at least every 100 ms); a busy host gets some slack.
    std::thread::sleep(Duration::from_secs(1));
    let children = format!("/proc/{0}/task/{0}/children", run.id());
    let rping: i32 = std::fs::read_to_string(&children).unwrap().trim().parse().unwrap();
    // SAFETY: signals a child process of ours, by pid.
    assert_eq!(unsafe { libc::kill(rping, libc::SIGKILL) }, 0);
    let disconnected = conn.wait_disconnect(T).unwrap();
    let (out, timed_out) = finish(run, Instant::now() + T);
    assert!(disconnected, "no DREQ for the killed rping's connection:\n{}", text(&out));
    assert!(!timed_out && out.status.code() == Some(128 + 9), "{:?}:\n{}", out.status, text(&out));
}

/// Two `ib_write_bw` servers on one device address, each pid 1 of a PID
/// namespace of its own (containers on the host network): neither takes
/// the other for dead (a slot's liveness is its lock, not a pid), so both
/// pairs finish.
#[test]
fn processes_in_two_pid_namespaces_share_one_device() {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").map_or(true, |m| m.uid() != 0) || !common::have("unshare") {
        assert!(std::env::var_os("CI").is_none(), "this test needs root and unshare in CI");
        eprintln!("not root or no unshare: skipped");
        return;
    }
    let _g = serial();
    env();
    let udp = uroce::testing::free_port();
    let ports: Vec<String> = (0..2).map(|_| tcp_port().to_string()).collect();
    let mut servers = Vec::new();
    for p in &ports {
        let a = ["--pid", "--fork", "--mount-proc", "ib_write_bw", "-p", p, "-D", "2"];
        servers.push(cmd(&tool("unshare"), &a, "127.0.0.1", udp).spawn().unwrap());
        uroce::testing::wait_tcp_listening(p.parse().unwrap(), Duration::from_secs(20));
    }
    let clients: Vec<Child> = ports
        .iter()
        .map(|p| {
            let a = ["-p", p, "-D", "2", "127.0.0.1"];
            cmd(&tool("ib_write_bw"), &a, "127.0.0.2", udp).spawn().unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(40);
    let outs: Vec<(Output, bool)> =
        clients.into_iter().chain(servers).map(|c| finish(c, deadline)).collect();
    let all = outs.iter().map(|(o, _)| text(o)).collect::<Vec<_>>().join("\n--- next ---\n");
    for (o, timed_out) in &outs {
        assert!(!timed_out && o.status.success(), "a pair failed:\n{all}");
        let rows = perftest_rows(&text(o));
        assert!(rows.iter().any(|r| r.len() >= 4 && r[3] > 0.0), "no bandwidth:\n{all}");
    }
}

/// uroce's Rust CM ids (`uroce::cm::CmId`, in this test process) against
/// Debian's librdmacm examples on the drop-in library: a Rust client
/// connects to `rdma_server` and a Rust server serves `rdma_client`, a
/// 16-byte SEND each way and the server's or client's disconnect.
#[test]
fn rust_cm_ids_against_debians_rdma_server_and_client() {
    use uroce::cm::{ConnParam, EventChannel, EventType, PortSpace};
    use uroce::{Access, QpCaps, QpInitAttr, QpType, RecvWr, SendWr, WcStatus};
    let _g = serial();
    let expect = |ch: &EventChannel, want: EventType| {
        let e = ch.get_event_timeout(Duration::from_secs(10)).unwrap().expect("an event");
        assert_eq!(e.event, want, "{e:?}");
        e
    };
    for rust_serves in [false, true] {
        let udp = uroce::testing::free_port();
        let port = tcp_port();
        let ps = port.to_string();
        let debian = if rust_serves {
            None
        } else {
            let srv = cmd(&tool("rdma_server"), &["-p", &ps], "127.0.0.1", udp).spawn().unwrap();
            assert!(uroce::testing::wait_udp_bound(udp, Duration::from_secs(10)));
            Some(srv)
        };
        let me = if rust_serves { "127.0.0.1" } else { "127.0.0.2" };
        let ctx = uroce::testing::open(me, udp);
        let ch = EventChannel::with_contexts(std::slice::from_ref(&ctx)).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(8).unwrap();
        let cap = QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let init = QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: None,
        };
        let mr = pd.alloc_mr(32, Access::LOCAL_WRITE).unwrap();
        mr.write(16, b"from rust cm id!").unwrap();
        let send = [mr.sge(16, 16).unwrap()];
        let recv = [mr.sge(0, 16).unwrap()];
        let (id, debian) = if rust_serves {
            let listener = ch.create_id(PortSpace::Tcp);
            listener.bind_addr(format!("127.0.0.1:{port}").parse().unwrap()).unwrap();
            listener.listen().unwrap();
            let cli = cmd(&tool("rdma_client"), &["-s", "127.0.0.1", "-p", &ps], "127.0.0.2", udp)
                .spawn()
                .unwrap();
            let id = expect(&ch, EventType::ConnectRequest).id;
            let qp = id.create_qp(&pd, &init).unwrap();
            qp.post_recv(&[RecvWr { wr_id: 1, sgl: &recv }]).unwrap();
            id.accept(&ConnParam::default(), &[]).unwrap();
            expect(&ch, EventType::Established);
            let wc = uroce::testing::wait_completion(&cq);
            assert_eq!((wc.status, wc.wr_id, wc.byte_len), (WcStatus::Success, 1, 16));
            qp.post_send(&[SendWr { wr_id: 2, sgl: &send, ..SendWr::default() }]).unwrap();
            let wc = uroce::testing::wait_completion(&cq);
            assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, 2));
            (id, cli)
        } else {
            let id = ch.create_id(PortSpace::Tcp);
            id.resolve_addr(None, format!("127.0.0.1:{port}").parse().unwrap()).unwrap();
            expect(&ch, EventType::AddrResolved);
            id.resolve_route().unwrap();
            expect(&ch, EventType::RouteResolved);
            let qp = id.create_qp(&pd, &init).unwrap();
            qp.post_recv(&[RecvWr { wr_id: 1, sgl: &recv }]).unwrap();
            id.connect(&ConnParam::default(), &[]).unwrap();
            expect(&ch, EventType::Established);
            qp.post_send(&[SendWr { wr_id: 2, sgl: &send, ..SendWr::default() }]).unwrap();
            let mut got =
                [uroce::testing::wait_completion(&cq), uroce::testing::wait_completion(&cq)];
            got.sort_by_key(|w| w.wr_id);
            assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
            assert_eq!(got[0].byte_len, 16, "the server's reply");
            (id, debian.unwrap())
        };
        // The Debian side disconnects when its exchange is done.
        expect(&ch, EventType::Disconnected);
        id.disconnect().unwrap();
        let (out, timed_out) = finish(debian, Instant::now() + Duration::from_secs(10));
        let name = if rust_serves { "rdma_client" } else { "rdma_server" };
        assert!(!timed_out && out.status.success(), "{}", text(&out));
        assert!(text(&out).contains(&format!("{name}: end 0")), "{}", text(&out));
    }
}
