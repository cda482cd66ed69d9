//! Debian's unmodified perftest on the drop-in libibverbs over the DPDK
//! backend (feature `dpdk`): two network namespaces joined by a veth
//! pair; one side's device is a DPDK af_packet port on its veth end (its
//! kernel holds only the address perftest's TCP exchange uses), the other
//! side's the `udp` backend. Each tool runs with the DPDK side as client,
//! and `ib_write_bw` also as server; rdmacm-utils' `mckey` sends to a
//! multicast group each way. Needs root; skipped without it, except
//! under CI.

#![cfg(feature = "dpdk")]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{finish, text};

fn sh(args: &[&str]) -> bool {
    Command::new(args[0]).args(&args[1..]).status().is_ok_and(|s| s.success())
}

/// Two namespaces and the veth pair between them, removed on drop.
struct Net {
    a: String,
    b: String,
}

impl Net {
    fn new() -> Self {
        let id = std::process::id() % 100_000;
        let net = Self { a: format!("uroce-pa{id}"), b: format!("uroce-pb{id}") };
        let (va, vb) = (format!("upa{id}"), format!("upb{id}"));
        let ns = |n: &str, args: &[&str]| {
            let mut v = vec!["ip", "-n", n];
            v.extend_from_slice(args);
            assert!(sh(&v), "{v:?}");
        };
        assert!(sh(&["ip", "netns", "add", &net.a]) && sh(&["ip", "netns", "add", &net.b]));
        assert!(sh(&["ip", "link", "add", &va, "type", "veth", "peer", "name", &vb]));
        assert!(sh(&["ip", "link", "set", &va, "netns", &net.a]));
        assert!(sh(&["ip", "link", "set", &vb, "netns", &net.b]));
        // RoCE on 10.233.0.0/24 (the DPDK side's 10.233.0.1 is no kernel's),
        // perftest's TCP exchange on 10.233.1.0/24.
        ns(&net.a, &["addr", "add", "10.233.1.1/24", "dev", &va]);
        ns(&net.b, &["addr", "add", "10.233.1.2/24", "dev", &vb]);
        ns(&net.b, &["addr", "add", "10.233.0.2/24", "dev", &vb]);
        for (n, v) in [(&net.a, &va), (&net.b, &vb)] {
            ns(n, &["link", "set", v, "up"]);
            ns(n, &["link", "set", "lo", "up"]);
            // A kernel UDP GSO run crosses veth whole and a packet socket
            // sees it so; a NIC would put separate frames on the wire.
            assert!(sh(&[
                "ip",
                "netns",
                "exec",
                n,
                "ethtool",
                "-K",
                v,
                "tx-udp-segmentation",
                "off"
            ]));
        }
        net
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        sh(&["ip", "netns", "del", &self.a]);
        sh(&["ip", "netns", "del", &self.b]);
        // The EAL run-time directories of the namespaces' file prefixes
        // (uroce appends each process's ID; a killed process leaves its).
        let dirs = std::fs::read_dir("/var/run/dpdk").into_iter().flatten().flatten();
        for d in dirs {
            let name = d.file_name().to_string_lossy().into_owned();
            if [&self.a, &self.b].iter().any(|ns| {
                name == **ns || name.strip_prefix(ns.as_str()).is_some_and(|r| r.starts_with('-'))
            }) {
                let _ = std::fs::remove_dir_all(d.path());
            }
        }
    }
}

/// `tool` with `args` in namespace `ns`, its device on DPDK (at `dev`,
/// through the namespace's veth end) or on the `udp` backend.
fn perftest(ns: &str, dpdk: bool, dev: &str, tool: &str, args: &[&str]) -> Command {
    let e = common::env_with(&["dpdk"]);
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, tool])
        .args(args)
        .env("LD_LIBRARY_PATH", &e.lib_dir)
        .env("UROCE_DEVICES", format!("uroce0={dev}:4791"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if dpdk {
        let iface = format!("u{}", ns.trim_start_matches("uroce-"));
        c.env("UROCE_BACKEND", "dpdk").env(
            "UROCE_DPDK_EAL",
            format!(
                "--no-huge -m 256 --no-pci --file-prefix={ns} --log-level=4 \
                 --vdev=net_af_packet0,iface={iface},qpairs=1"
            ),
        );
    } else {
        c.env_remove("UROCE_BACKEND");
    }
    c
}

/// Runs `tool` as server in one namespace and client in the other, the
/// DPDK side as `dpdk_client` says; both must succeed and the client
/// print a result row.
fn pair(net: &Net, tool: &str, args: &[&str], dpdk_client: bool) -> String {
    let (srv_ns, cli_ns) = if dpdk_client { (&net.b, &net.a) } else { (&net.a, &net.b) };
    let (srv_dev, cli_dev) =
        if dpdk_client { ("10.233.0.2", "10.233.0.1") } else { ("10.233.0.1", "10.233.0.2") };
    let srv_tcp = if dpdk_client { "10.233.1.2" } else { "10.233.1.1" };
    let deadline = Instant::now() + Duration::from_secs(90);
    let srv = perftest(srv_ns, !dpdk_client, srv_dev, tool, args).spawn().unwrap();
    // The server listens on TCP (perftest's port 18515) once its device
    // is open: wait for that, not for a fixed time.
    let listening = || {
        Command::new("ip")
            .args(["netns", "exec", srv_ns, "ss", "-ltnH", "sport", "= :18515"])
            .output()
            .is_ok_and(|o| !o.stdout.is_empty())
    };
    while !listening() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut cargs = args.to_vec();
    cargs.push(srv_tcp);
    let cli = perftest(cli_ns, dpdk_client, cli_dev, tool, &cargs).spawn().unwrap();
    let (co, ct) = finish(cli, deadline);
    let (so, st) = finish(srv, deadline + Duration::from_secs(5));
    let (s, c) = (text(&so), text(&co));
    let what = format!(
        "{tool} {args:?} (DPDK {}):\n--- server ---\n{s}\n--- client ---\n{c}",
        if dpdk_client { "client" } else { "server" }
    );
    assert!(!ct && !st, "timed out: {what}");
    assert!(so.status.success() && co.status.success(), "failed: {what}");
    // The row after the header: numbers, the first the message size.
    c.lines()
        .skip_while(|l| !l.contains("#bytes"))
        .nth(1)
        .filter(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<u64>().is_ok()))
        .unwrap_or_else(|| panic!("no result row: {what}"))
        .to_string()
}

/// rdmacm-utils' `mckey` between the namespaces: the receiver joins the
/// group through the CM, and once it has, the sender joins and sends its
/// datagrams to the group (on the DPDK side: the group's Ethernet address,
/// or the group's frames taken from the port); every one must arrive.
fn mckey(net: &Net, dpdk_receiver: bool) {
    let (dpdk, udp) = ((&net.a, true, "10.233.0.1"), (&net.b, false, "10.233.0.2"));
    let (rx, tx) = if dpdk_receiver { (dpdk, udp) } else { (udp, dpdk) };
    mckey_between(rx, tx, if dpdk_receiver { "receiver" } else { "sender" });
}

/// `mckey` from the sender `tx` to the receiver `rx`, each `(namespace,
/// DPDK?, device address)`; `what` names the DPDK side in messages.
fn mckey_between(rx: (&String, bool, &str), tx: (&String, bool, &str), what: &str) {
    const GROUP: &str = "239.255.77.1";
    let ((rx_ns, rx_dpdk, rx_dev), (tx_ns, tx_dpdk, tx_dev)) = (rx, tx);
    let deadline = Instant::now() + Duration::from_secs(60);
    // Line-buffered: its "joined" line is what the sender waits for.
    let rx_args = ["-oL", "mckey", "-m", GROUP, "-b", rx_dev];
    let mut rx = perftest(rx_ns, rx_dpdk, rx_dev, "stdbuf", &rx_args).spawn().unwrap();
    let out = rx.stdout.take().unwrap();
    let (tx_lines, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx_lines.send(l);
        }
    });
    let mut said = String::new();
    let mut next = |until: Instant| {
        let l = lines.recv_timeout(until.saturating_duration_since(Instant::now())).ok()?;
        said.push_str(&l);
        said.push('\n');
        Some(l)
    };
    while !next(deadline).is_some_and(|l| l.contains("joined dgid")) {
        if Instant::now() >= deadline {
            let (o, _) = finish(rx, Instant::now());
            panic!("the receiver never joined: {said}{}", String::from_utf8_lossy(&o.stderr));
        }
    }
    let tx = perftest(tx_ns, tx_dpdk, tx_dev, "mckey", &["-m", GROUP, "-b", tx_dev, "-s"])
        .spawn()
        .unwrap();
    let (to, tt) = finish(tx, deadline);
    let (ro, rt) = finish(rx, deadline + Duration::from_secs(5));
    while next(Instant::now() + Duration::from_secs(1)).is_some() {}
    let what = format!(
        "mckey (DPDK {what}):\n--- receiver ---\n{said}{}\n--- sender ---\n{}{}",
        String::from_utf8_lossy(&ro.stderr),
        String::from_utf8_lossy(&to.stdout),
        String::from_utf8_lossy(&to.stderr),
    );
    assert!(!tt && !rt, "timed out: {what}");
    assert!(ro.status.success() && to.status.success(), "failed: {what}");
    assert!(said.contains("data transfers complete"), "{what}");
}

#[test]
fn perftest_over_the_dpdk_backend() {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !root || !common::have("ib_write_bw") || !common::have("ethtool") {
        assert!(
            std::env::var_os("CI").is_none(),
            "the DPDK test needs root, perftest and ethtool under CI"
        );
        eprintln!("not root, or no perftest or ethtool: skipped");
        return;
    }
    // Built before any deadline starts.
    common::env_with(&["dpdk"]);
    let net = Net::new();
    for (tool, args) in [
        ("ib_write_bw", &["-n", "2000"][..]),
        ("ib_read_lat", &["-n", "1000"][..]),
        ("ib_send_lat", &["-n", "1000"][..]),
        ("ib_atomic_bw", &["-n", "1000"][..]),
        ("ib_send_bw", &["-n", "1000", "-c", "UD"][..]),
    ] {
        let row = pair(&net, tool, args, true);
        eprintln!("{tool} (DPDK client): {row}");
    }
    let row = pair(&net, "ib_write_bw", &["-n", "2000", "-s", "4096"], false);
    eprintln!("ib_write_bw -s 4096 (DPDK server): {row}");
    if common::have("mckey") {
        mckey(&net, true);
        mckey(&net, false);
        // No uroce at the peer's address: its kernel's ICMP port
        // unreachable (read by the DPDK backend) ends each REQ's wait,
        // and the connect fails in seconds, not after a minute of REQ
        // retries.
        let started = Instant::now();
        let args = ["-c", "-a", "10.233.0.2", "-p", "7471", "-C", "1", "-v"];
        let cli = perftest(&net.a, true, "10.233.0.1", "rping", &args).spawn().unwrap();
        let (o, timed_out) = finish(cli, started + Duration::from_secs(40));
        let said = text(&o);
        assert!(!timed_out && !o.status.success(), "{said}");
        assert!(said.contains("RDMA_CM_EVENT_UNREACHABLE, error -110"), "{said}");
        assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
        rping_servers_share_a_dpdk_device(&net);
        // Sender and receiver on one DPDK device: the group's datagrams
        // reach the other member through memory (the port does not bring
        // back what it sent).
        let dpdk = (&net.a, true, "10.233.0.1");
        mckey_between(dpdk, dpdk, "sender and receiver");
    } else {
        assert!(std::env::var_os("CI").is_none(), "rdmacm-utils missing under CI");
    }
}

/// Three unmodified rdmacm programs on one DPDK device (three processes,
/// each its own af_packet port on the veth end): two `rping` servers
/// listening on ports of their own, a client from the other namespace's
/// `udp` device connecting to the second (its REQ kept by the member
/// that listens on the port, the others leaving it), and a client on the
/// device itself connecting to the first (the CM's MADs and the data
/// between two members of one device, through shared memory). Every
/// ping's data validated.
fn rping_servers_share_a_dpdk_device(net: &Net) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let dev = "10.233.0.1";
    let server = |port: &str| {
        let args = ["-s", "-a", dev, "-p", port, "-C", "20", "-V"];
        perftest(&net.a, true, dev, "rping", &args).spawn().unwrap()
    };
    let (first, second) = (server("7472"), server("7473"));
    // A client of `(ns, DPDK?, device)` for `port`, again until a server
    // listens there (the one before it is refused: nobody listens yet).
    let client = |(ns, dpdk, at): (&String, bool, &str), port: &str| loop {
        let args = ["-c", "-a", dev, "-p", port, "-C", "20", "-V"];
        let c = perftest(ns, dpdk, at, "rping", &args).spawn().unwrap();
        let (o, timed_out) = finish(c, deadline);
        let said = text(&o);
        if o.status.success() {
            return said;
        }
        assert!(!timed_out && Instant::now() < deadline, "rping client to {port}: {said}");
        std::thread::sleep(Duration::from_millis(100));
    };
    client((&net.b, false, "10.233.0.2"), "7473");
    client((&net.a, true, dev), "7472");
    for (s, port) in [(first, "7472"), (second, "7473")] {
        let (o, timed_out) = finish(s, deadline + Duration::from_secs(5));
        let said = text(&o);
        assert!(!timed_out && o.status.success(), "rping server on {port}: {said}");
    }
}
