//! Engines that find RDMA devices where the kernel puts them, run
//! unmodified under `uroce run` between two "hosts": network namespaces
//! joined by a veth pair, each with its own IPC and PID namespaces so that
//! UCX sees two machines (its shared-memory transports are reachable only
//! within one IPC and PID namespace) and must use the uroce device.
//! UCX 1.13 (`ucx-utils`, installed by `scripts/test`): `ucx_info -d`
//! lists the device's transports; `ucx_perftest` runs UCP and UCT tests on
//! it with `UCX_NET_DEVICES` as its only setting, one pair at a time and
//! two pairs sharing each host's device. Open MPI 4.1 (`openmpi-bin`,
//! `libopenmpi-dev`): 8 ranks, 4 per host, with `--mca pml ucx`.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{env, finish, have, text};

/// Two namespaces and a veth pair, removed on drop. One set at a time:
/// UCX busy-polls, and two tests at once on two cores would measure the
/// scheduler.
struct Hosts {
    a: String,
    b: String,
    _serial: std::sync::MutexGuard<'static, ()>,
}

const ADDR_A: &str = "10.232.0.1";
/// Inside a network namespace, what makes a host of it: its own UTS, IPC,
/// PID namespaces and `/proc`, and a host name (the argument after).
const HOST_PREFIX: [&str; 9] = [
    "unshare",
    "--uts",
    "--ipc",
    "--pid",
    "--fork",
    "--mount-proc",
    "sh",
    "-c",
    "hostname \"$0\" && exec \"$@\"",
];
const ADDR_B: &str = "10.232.0.2";

fn sh(args: &[&str]) -> bool {
    Command::new(args[0]).args(&args[1..]).status().is_ok_and(|s| s.success())
}

impl Hosts {
    fn new() -> Self {
        static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let id = std::process::id() % 100_000;
        let hosts =
            Self { a: format!("uroce-ea{id}"), b: format!("uroce-eb{id}"), _serial: serial };
        let (va, vb) = (format!("uea{id}"), format!("ueb{id}"));
        let ok = sh(&["ip", "netns", "add", &hosts.a])
            && sh(&["ip", "netns", "add", &hosts.b])
            && sh(&["ip", "link", "add", &va, "type", "veth", "peer", "name", &vb])
            && sh(&["ip", "link", "set", &va, "netns", &hosts.a])
            && sh(&["ip", "link", "set", &vb, "netns", &hosts.b])
            && sh(&["ip", "-n", &hosts.a, "addr", "add", &format!("{ADDR_A}/24"), "dev", &va])
            && sh(&["ip", "-n", &hosts.b, "addr", "add", &format!("{ADDR_B}/24"), "dev", &vb])
            && sh(&["ip", "-n", &hosts.a, "link", "set", &va, "up"])
            && sh(&["ip", "-n", &hosts.b, "link", "set", &vb, "up"])
            && sh(&["ip", "-n", &hosts.a, "link", "set", "lo", "up"])
            && sh(&["ip", "-n", &hosts.b, "link", "set", "lo", "up"]);
        assert!(ok, "creating namespaces and a veth pair failed");
        hosts
    }

    /// `args` under `uroce run` on host `a` (or `b`), device uroce0 on its
    /// veth address; its own process group, so a deadline kills it whole.
    fn cmd(&self, on_a: bool, args: &[&str]) -> Command {
        let (ns, addr) = if on_a { (&self.a, ADDR_A) } else { (&self.b, ADDR_B) };
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .args(HOST_PREFIX)
            .arg(ns)
            .arg(&env().uroce)
            .args(["run", "--"])
            .args(args)
            .env("UROCE_DEVICES", format!("uroce0={addr}"))
            .env("UCX_NET_DEVICES", "uroce0:1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        c
    }

    /// Runs `args` on host a to the end (within a minute); its output.
    fn output_on_a(&self, args: &[&str]) -> String {
        self.output_on(true, args)
    }

    /// Runs `args` on host a (or b) to the end (within a minute); its
    /// output.
    fn output_on(&self, on_a: bool, args: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let (out, timed_out) = finish(self.cmd(on_a, args).spawn().unwrap(), deadline);
        let t = text(&out);
        assert!(!timed_out && out.status.success(), "{} failed:\n{t}", args.join(" "));
        t
    }

    /// Makes `localhost` name host a's veth address inside host a (`ip
    /// netns exec` mounts `/etc/netns/NS/hosts` over `/etc/hosts`), for
    /// programs that bind "localhost" as their RDMA address.
    fn localhost_on_a_is_its_device(&self) {
        let dir = format!("/etc/netns/{}", self.a);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(format!("{dir}/hosts"), format!("{ADDR_A} localhost\n")).unwrap();
    }

    /// Waits until something listens on TCP `port` in host a.
    fn wait_listening(&self, port: u16, deadline: Instant) {
        while Instant::now() < deadline {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.a, "ss", "-Hltn", &format!("sport = :{port}")])
                .output()
                .unwrap();
            if !out.stdout.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // (the veth pair goes with its namespaces)
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.a));
        sh(&["ip", "netns", "del", &self.a]);
        sh(&["ip", "netns", "del", &self.b]);
    }
}

/// Builds C program `src` into `exe` with `args` (flags and libraries,
/// which follow the source).
fn compile(src: &std::path::Path, exe: &std::path::Path, args: &[&str]) {
    let cc = Command::new("cc").arg("-o").arg(exe).arg(src).args(args).output().unwrap();
    assert!(cc.status.success(), "cc {}: {}", src.display(), text(&cc));
}

fn can_run() -> bool {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    let ok = root && have("ucx_perftest") && have("unshare");
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "the engine tests need root and ucx-utils in CI");
        eprintln!("not root or no ucx_perftest: skipped");
    }
    ok
}

/// A started `ucx_perftest` pair: server on host a, client on host b.
struct Run {
    label: String,
    server: Child,
    client: Child,
}

fn start(hosts: &Hosts, args: &[&str], extra_client_env: &[(&str, &str)]) -> Run {
    let port = uroce::testing::free_tcp_port().to_string();
    let mut sargs = vec!["ucx_perftest", "-p", &port];
    sargs.extend(args);
    let server = hosts.cmd(true, &sargs).spawn().unwrap();
    hosts.wait_listening(port.parse().unwrap(), Instant::now() + Duration::from_secs(20));
    let mut cargs = vec!["ucx_perftest", ADDR_A, "-p", &port];
    cargs.extend(args);
    let mut c = hosts.cmd(false, &cargs);
    for (k, v) in extra_client_env {
        c.env(k, v);
    }
    Run { label: args.join(" "), server, client: c.spawn().unwrap() }
}

/// Waits for both sides; both must exit 0 with a `Final:` line. Returns
/// the client's output.
fn complete(run: Run, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    let (co, ct) = finish(run.client, deadline);
    let (so, st) = finish(run.server, deadline + Duration::from_secs(5));
    let (c, s) = (text(&co), text(&so));
    let all = format!("{}\n--- server ---\n{s}\n--- client ---\n{c}", run.label);
    assert!(!ct && !st, "timed out after {limit:?}: {all}");
    assert!(co.status.success() && so.status.success(), "failed: {all}");
    assert!(c.contains("Final:"), "no result: {all}");
    let fin = c.lines().find(|l| l.starts_with("Final:")).unwrap_or_default();
    eprintln!("{:<45} {fin}", run.label);
    c
}

#[test]
fn ucx_lists_the_uroce_transports() {
    if !can_run() {
        return;
    }
    let hosts = Hosts::new();
    let t = hosts.output_on_a(&["ucx_info", "-d"]);
    let domain =
        t.split("# Memory domain: ").find(|d| d.starts_with("uroce0")).unwrap_or_else(|| {
            panic!("no uroce0 memory domain in ucx_info -d:\n{t}");
        });
    for tl in ["rc_verbs", "ud_verbs"] {
        assert!(domain.contains(&format!("Transport: {tl}")), "no {tl} on uroce0:\n{domain}");
    }
    assert!(domain.contains("Device: uroce0:1"), "{domain}");
    assert!(domain.contains("atomic_fadd: 64 bit"), "rc_verbs without device atomics:\n{domain}");
}

#[test]
fn ucx_perftest_runs_over_the_uroce_device() {
    if !can_run() {
        return;
    }
    let hosts = Hosts::new();
    let limit = Duration::from_secs(90);
    // UCP picks its transports; the client's log shows which.
    let out = complete(
        start(&hosts, &["-t", "tag_lat", "-s", "8", "-n", "2000"], &[("UCX_LOG_LEVEL", "info")]),
        limit,
    );
    let cfg = out.lines().find(|l| l.contains("ep_cfg[")).unwrap_or_default();
    assert!(cfg.contains("rc_verbs/uroce0:1"), "UCP did not pick rc_verbs on uroce0: {out}");
    for args in [
        &["-t", "tag_bw", "-s", "1048576", "-n", "200"][..],
        &["-t", "ucp_put_bw", "-s", "1048576", "-n", "200"],
        &["-t", "ucp_get", "-s", "65536", "-n", "500"],
        &["-t", "ucp_fadd", "-n", "1000"],
        &[
            "-t", "put_bw", "-x", "rc_verbs", "-d", "uroce0:1", "-D", "zcopy", "-s", "65536", "-n",
            "500",
        ],
        &["-t", "put_bw", "-x", "rc_verbs", "-d", "uroce0:1", "-s", "8", "-n", "5000"],
        &["-t", "fadd", "-x", "rc_verbs", "-d", "uroce0:1", "-n", "1000"],
        &["-t", "am_lat", "-x", "ud_verbs", "-d", "uroce0:1", "-n", "1000"],
    ] {
        complete(start(&hosts, args, &[]), limit);
    }
}

#[test]
fn two_ucx_pairs_share_each_hosts_device() {
    if !can_run() {
        return;
    }
    let hosts = Hosts::new();
    let limit = Duration::from_secs(120);
    let lat = start(&hosts, &["-t", "tag_lat", "-s", "8", "-n", "500"], &[]);
    let bw = start(&hosts, &["-t", "ucp_put_bw", "-s", "65536", "-n", "500"], &[]);
    complete(lat, limit);
    complete(bw, limit);
}

/// What a program under `uroce run` sees, as root and as an unprivileged
/// user (a user namespace then), and that the host sees none of it: the
/// device files, and the RDMA netlink family that iproute2's `rdma` asks
/// (served by `uroce run`, the kernel has none without `ib_core`).
#[test]
fn uroce_run_shows_device_files_to_root_and_to_users() {
    use std::os::unix::fs::PermissionsExt;
    if !can_run() {
        return;
    }
    // `rdma res show`: two pingpong servers' objects while they wait (ports
    // of their own each time), one of them with an SRQ and two QPs on it;
    // listed once all three QPs show as INIT (contexts publish their
    // objects ten times a second: a first listing may show a QP just made,
    // still in RESET).
    let listing = || {
        format!(
            "ibv_rc_pingpong -g 0 -p {} >/dev/null 2>&1 & rc=$!; \
             ibv_srq_pingpong -g 0 -q 2 -p {} >/dev/null 2>&1 & srq=$!; \
             for i in $(seq 100); do [ \"$(rdma res show qp | grep -c 'state INIT')\" = 3 ] \
             && break; sleep 0.1; done; \
             rdma res show qp; rdma res show cq; rdma res show mr; rdma res show pd; \
             rdma res show srq; rdma res show ctx; rdma res; kill $rc $srq",
            uroce::testing::free_port(),
            uroce::testing::free_port()
        )
    };
    let probe = "test -c /dev/infiniband/uverbs0 && test -w /dev/infiniband/uverbs0 \
                 && test -c /dev/null && test -d /dev/shm && test -e /sys/class/net/lo \
                 && cat /sys/class/infiniband_verbs/uverbs0/ibdev \
                 /sys/class/infiniband/uroce0/ports/1/gids/0 \
                 /sys/class/infiniband/uroce0/ports/1/gid_attrs/types/0 \
                 /sys/class/infiniband/uroce0/ports/1/state \
                 /sys/class/infiniband/uroce0/ports/1/hw_counters/sent_pkts \
                 && ls /sys/class/infiniband/uroce0/device/net && ibv_devices \
                 && rdma link && rdma -d dev && rdma stat && rdma sys \
                 && ! rdma link add rxe0 type rxe netdev lo";
    let expect = [
        "uroce0\n0000:0000:0000:0000:0000:ffff:7f00:0001\nRoCE v2\n4: ACTIVE\n",
        "\nlo\n",
        "0275ffff7f000001",
        "link uroce0/1 state ACTIVE physical_state LINK_UP netdev lo \n",
        "0: uroce0: node_type ca fw uroce ",
        "node_guid 0275:ffff:7f00:0001 sys_image_guid 0275:ffff:7f00:0001 \n    caps: <",
        "link uroce0/1 sent_pkts 0 rcvd_pkts 0 duplicate_request 0 ",
        "netns shared copy-on-fork on\n",
        "Error: uroce devices are configured with UROCE_DEVICES or devices.conf, not by \
         netlink.\nerror: Operation not supported",
        "link uroce0/1 lqpn ",
        " type RC state INIT rq-psn 0 sq-psn 0 path-mig-state MIGRATED pdn ",
        " comm ibv_rc_pingpong \ndev uroce0 cqn ",
        " cqe 501 users 1 pid ",
        " mrlen 4096 pdn ",
        "dev uroce0 pdn 1 users 2 pid ",
        " type BASIC lqpn ",
        "dev uroce0 ctxn 1 pid ",
        "0: uroce0: pd 2 cq 2 qp 3 mr 2 ctx 2 srq 1 \n",
    ];
    // A copy anyone may read and run: the build tree may sit where an
    // unprivileged user cannot reach.
    let dir = std::env::temp_dir().join(format!("uroce-run-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("uroce-lib")).unwrap();
    std::fs::copy(&env().uroce, dir.join("uroce")).unwrap();
    for e in std::fs::read_dir(&env().lib_dir).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join("uroce-lib").join(e.file_name())).unwrap();
    }
    for p in [&dir, &dir.join("uroce-lib")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let uroce = dir.join("uroce").to_string_lossy().into_owned();
    for as_user in [false, true] {
        let mut c = Command::new("setpriv");
        if as_user {
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
        }
        // A run directory each may write (its own, as `/tmp/uroce-<uid>`).
        let run_dir = dir.join(if as_user { "run-nobody" } else { "run-root" });
        std::fs::create_dir_all(&run_dir).unwrap();
        std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let out = c
            .args([&uroce, "run", "--", "sh", "-c", &format!("{probe} && {}", listing())])
            // A port of its own: the device is opened, and a port that a
            // root process of another test holds is not nobody's to join.
            .env("UROCE_DEVICES", format!("uroce0=127.0.0.1:{}", uroce::testing::free_port()))
            .env("UROCE_RUN_DIR", &run_dir)
            .current_dir(&dir)
            .output()
            .unwrap();
        let t = text(&out);
        assert!(out.status.success(), "as {}: {t}", if as_user { "nobody" } else { "root" });
        for e in expect {
            assert!(
                t.contains(e),
                "as {}: no {e:?} in:\n{t}",
                if as_user { "nobody" } else { "root" }
            );
        }
    }
    // The program's status comes back, signals included.
    let out = Command::new(&uroce).args(["run", "--", "sh", "-c", "exit 7"]).output().unwrap();
    assert_eq!(out.status.code(), Some(7));
    let out =
        Command::new(&uroce).args(["run", "--", "sh", "-c", "kill -TERM $$"]).output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 15));
    // A SIGTERM to `uroce run` reaches the program.
    let started = Instant::now();
    let child = Command::new(&uroce).args(["run", "--", "sleep", "30"]).spawn().unwrap();
    // Once the program runs, `uroce run` has its signals blocked for
    // forwarding (a SIGTERM before that would end it by default).
    let children = format!("/proc/{0}/task/{0}/children", child.id());
    while std::fs::read_to_string(&children).unwrap_or_default().trim().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(10), "uroce run started nothing");
        std::thread::sleep(Duration::from_millis(10));
    }
    sh(&["sh", "-c", &format!("kill -TERM {}", child.id())]);
    let (out, timed_out) = finish(child, started + Duration::from_secs(10));
    assert!(!timed_out, "SIGTERM was not passed on");
    assert_eq!(out.status.code(), Some(128 + 15));
    assert!(
        !std::path::Path::new("/sys/class/infiniband_verbs/uverbs0/ibdev").exists()
            || std::fs::read_to_string("/sys/class/infiniband_verbs/uverbs0/ibdev")
                .is_ok_and(|s| !s.starts_with("uroce")),
        "the host got device files"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Open MPI 4.1 with `--mca pml ucx`: 8 ranks, 4 per host, ping-pong
/// across the hosts, `MPI_Allreduce` and `MPI_Alltoall`, every result
/// checked by the program; the remote daemons start through an rsh agent
/// that enters the other host's namespaces.
#[test]
fn open_mpi_runs_eight_ranks_across_two_hosts() {
    use std::os::unix::fs::PermissionsExt;
    if !can_run() {
        return;
    }
    if !(have("mpirun") && have("mpicc")) {
        assert!(
            std::env::var_os("CI").is_none(),
            "Open MPI missing in CI (scripts/test installs it)"
        );
        eprintln!("no mpirun/mpicc: skipped");
        return;
    }
    let hosts = Hosts::new();
    let dir = std::env::temp_dir().join(format!("uroce-mpi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let prog = dir.join("mpi_check");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_check.c");
    let cc = Command::new("mpicc").arg("-O2").arg("-o").arg(&prog).arg(&src).output().unwrap();
    assert!(cc.status.success(), "mpicc: {}", text(&cc));
    // ssh's stand-in: `agent HOST CMD…` runs CMD on the host that owns
    // address HOST, under `uroce run`.
    let agent = dir.join("agent");
    let prefix: Vec<String> = HOST_PREFIX.iter().map(|w| format!("'{w}'")).collect();
    let script = format!(
        "#!/bin/sh\nhost=$1; shift\ncase $host in {ADDR_A}) ns={a};; {ADDR_B}) ns={b};; *) exit 1;; esac\n\
         UROCE_DEVICES=uroce0=$host exec ip netns exec $ns {prefix} $ns '{uroce}' run -- sh -c \"$*\"\n",
        a = hosts.a,
        b = hosts.b,
        prefix = prefix.join(" "),
        uroce = env().uroce.display(),
    );
    std::fs::write(&agent, script).unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hostfile = dir.join("hosts");
    std::fs::write(&hostfile, format!("{ADDR_A} slots=4\n{ADDR_B} slots=4\n")).unwrap();
    let (a, h, p) = (agent.to_string_lossy(), hostfile.to_string_lossy(), prog.to_string_lossy());
    let mut c = hosts.cmd(
        true,
        &[
            "mpirun",
            "--allow-run-as-root",
            "--hostfile",
            &h,
            "-np",
            "8",
            "--mca",
            "plm_rsh_agent",
            &a,
            "--mca",
            "pml",
            "ucx",
            "-x",
            "UCX_NET_DEVICES",
            "-x",
            "UCX_LOG_LEVEL=info",
            &p,
        ],
    );
    let (out, timed_out) = finish(c.spawn().unwrap(), Instant::now() + Duration::from_secs(240));
    let t = text(&out);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!timed_out && out.status.success(), "mpirun failed:\n{t}");
    for want in [
        "pingpong 8 B",
        "pingpong 1048576 B",
        "allreduce 131072 longs on 8 ranks: ok",
        "alltoall 4096 ints per pair on 8 ranks: ok (8 ranks checked)",
    ] {
        assert!(t.contains(want), "no {want:?} in:\n{t}");
    }
    // Ranks on different hosts reach each other over uroce only.
    let cfgs: Vec<&str> = t.lines().filter(|l| l.contains("ep_cfg[")).collect();
    assert!(
        cfgs.iter().any(|l| l.ends_with("tag(rc_verbs/uroce0:1)")),
        "no rank pair on uroce alone:\n{t}"
    );
    assert!(!cfgs.iter().any(|l| l.contains("tcp")), "tcp in use:\n{t}");
    for l in t.lines().filter(|l| l.starts_with("pingpong")) {
        eprintln!("{l} (8 busy-polling ranks on this machine's cores)");
    }
}

/// libfabric 1.17's verbs provider (`libfabric-bin`): `fi_info -p verbs`
/// lists the device's MSG and DGRAM domains, and `fi_pingpong` runs over
/// its DGRAM endpoints (UD), which need no connection manager.
#[test]
fn libfabric_verbs_lists_the_device_and_runs_dgram() {
    if !can_run() {
        return;
    }
    let hosts = Hosts::new();
    let t = hosts.output_on_a(&["fi_info", "-p", "verbs"]);
    for want in ["domain: uroce0\n", "type: FI_EP_MSG", "domain: uroce0-dgram", "type: FI_EP_DGRAM"]
    {
        assert!(t.contains(want), "no {want:?} in fi_info -p verbs:\n{t}");
    }
    let args = ["-p", "verbs", "-e", "dgram", "-I", "1000", "-S", "64"];
    let (client, all) = fi_pingpong(&hosts, &args);
    assert!(client.contains("Mxfers/sec"), "no result: {all}");
}

/// `fi_pingpong ARGS`: the server on host a, the client on host b, both
/// ending well within a minute; the client's output and both outputs.
fn fi_pingpong(hosts: &Hosts, args: &[&str]) -> (String, String) {
    let port = uroce::testing::free_tcp_port().to_string();
    let args = [&["fi_pingpong"], args].concat();
    let server = hosts.cmd(true, &[&args[..], &["-B", &port]].concat()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    hosts.wait_listening(port.parse().unwrap(), deadline);
    let cargs = [&args[..], &["-P", &port, ADDR_A]].concat();
    let (co, ct) = finish(hosts.cmd(false, &cargs).spawn().unwrap(), deadline);
    let (so, st) = finish(server, deadline + Duration::from_secs(5));
    let all = format!("--- server ---\n{}\n--- client ---\n{}", text(&so), text(&co));
    let ok = !ct && !st && co.status.success() && so.status.success();
    assert!(ok, "{}: {all}", args.join(" "));
    (text(&co), all)
}

/// libfabric-bin's `fi_pingpong` over the verbs provider's connected
/// endpoints: MSG (one RC QP, connected through the RDMA CM) and RDM
/// through `ofi_rxm` (rxm connects RC QPs on demand, by the CM), data
/// checked (`-c`), 64 B to 1 MiB. fi_pingpong 1.17 names no server
/// address: the provider binds "localhost" and the server hands that
/// name to its client, so `localhost` must name the server's RDMA address
/// (on kernel rxe too, where binding 127.0.0.1 is ENODEV); host a's
/// `/etc/hosts` says so.
#[test]
fn libfabric_pingpong_runs_over_msg_and_rxm_endpoints() {
    if !can_run() {
        return;
    }
    let hosts = Hosts::new();
    hosts.localhost_on_a_is_its_device();
    for (prov, ep) in [("verbs", "msg"), ("verbs;ofi_rxm", "rdm")] {
        let (_, all) = fi_pingpong(&hosts, &["-p", prov, "-e", ep, "-I", "100", "-c"]);
        // Each side prints a row per size, 64 B to 1 MiB.
        let rows = all.lines().filter(|l| l.contains("=100")).count();
        assert_eq!(rows, 12, "fi_pingpong -p {prov} -e {ep}: not every size ran: {all}");
    }
}

/// libfabric's verbs provider over MSG endpoints, which connect through
/// the RDMA CM (`tests/c/fi_msg_check.c`, built against `libfabric-dev`):
/// a passive endpoint on host a, a client on host b, messages from 1 byte
/// to 64 KiB each way, every byte checked, then a shutdown the server sees.
#[test]
fn libfabric_verbs_msg_endpoints_connect_through_the_cm() {
    if !can_run() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uroce-fimsg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("fi_msg_check");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/fi_msg_check.c");
    compile(&src, &exe, &["-std=gnu11", "-O1", "-Wall", "-Werror", "-lfabric"]);
    let hosts = Hosts::new();
    let exe = exe.to_string_lossy().into_owned();
    let port = uroce::testing::free_tcp_port().to_string();
    let mut server = hosts.cmd(true, &[&exe, "server", ADDR_A, &port]).spawn().unwrap();
    // The client connects once the server says it listens.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.as_mut().unwrap()),
        &mut first,
    )
    .unwrap();
    assert_eq!(first, "listening\n", "the server did not listen");
    let (co, ct) =
        finish(hosts.cmd(false, &[&exe, "client", ADDR_A, &port]).spawn().unwrap(), deadline);
    let (so, st) = finish(server, deadline + Duration::from_secs(5));
    let all = format!("--- server ---\n{}\n--- client ---\n{}", text(&so), text(&co));
    assert!(!ct && !st && co.status.success() && so.status.success(), "{all}");
    assert!(
        text(&co).contains("all checks passed") && text(&so).contains("all checks passed"),
        "{all}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// UCX's client/server connection establishment through the RDMA CM
/// (`ucp_listener` and `ucp_ep` by socket address, UCX's `rdmacm`
/// component only): UCX's own example `ucp_client_server.c` (from
/// libucx-dev, built here) between the two hosts, three tag messages,
/// each checked by the server.
#[test]
fn ucx_client_server_connects_through_the_rdma_cm() {
    if !can_run() {
        return;
    }
    let examples = std::path::Path::new("/usr/share/doc/libucx-dev/examples");
    if !examples.join("ucp_client_server.c").exists() {
        assert!(std::env::var_os("CI").is_none(), "no UCX examples (libucx-dev) in CI");
        eprintln!("no libucx-dev examples: skipped");
        return;
    }
    let dir = std::env::temp_dir().join(format!("uroce-ucpcs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("ucp_client_server");
    compile(&examples.join("ucp_client_server.c"), &exe, &["-O1", "-lucp", "-lucs"]);
    let hosts = Hosts::new();
    let exe = exe.to_string_lossy().into_owned();
    let port = uroce::testing::free_tcp_port().to_string();
    let only_rdmacm = ("UCX_SOCKADDR_TLS_PRIORITY", "rdmacm");
    // The server serves one client after another until stopped; its lines
    // are read after the stop, so they must not wait in a buffer.
    let sargs = ["stdbuf", "-oL", &exe, "-l", ADDR_A, "-p", &port, "-c", "tag", "-i", "3"];
    let mut server = hosts.cmd(true, &sargs).env(only_rdmacm.0, only_rdmacm.1).spawn().unwrap();
    // It listens through the CM (no TCP socket to look for): its word.
    let mut out = std::io::BufReader::new(server.stdout.take().unwrap());
    let mut said = String::new();
    while !said.contains("Waiting for connection")
        && std::io::BufRead::read_line(&mut out, &mut said).unwrap() > 0
    {}
    assert!(said.contains("Waiting for connection"), "the server did not listen: {said}");
    let cargs = [exe.as_str(), "-a", ADDR_A, "-p", &port, "-c", "tag", "-i", "3"];
    let client = hosts.cmd(false, &cargs).env(only_rdmacm.0, only_rdmacm.1).spawn().unwrap();
    let (co, ct) = finish(client, Instant::now() + Duration::from_secs(60));
    // SAFETY: signals the server's process group (its own, see `cmd`).
    unsafe { libc::kill(-(server.id() as i32), libc::SIGTERM) };
    let (so, st) = finish(server, Instant::now() + Duration::from_secs(20));
    let _ = std::io::Read::read_to_string(&mut out, &mut said);
    let all = format!("--- server ---\n{said}{}\n--- client ---\n{}", text(&so), text(&co));
    assert!(!ct && !st && co.status.success(), "{all}");
    assert_eq!(said.matches("UCX data message was received").count(), 2, "{all}");
    assert!(said.contains("ABCDEFGHIJKLMNO"), "{all}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tests/c/more_names.c` under `uroce run`: `ibv_read_ibdev_sysfs_file`
/// reads the device's files, and imports find their context by its open
/// command file although every context's is the same file.
#[test]
fn sysfs_reads_and_imports_through_the_drop_in() {
    if !can_run() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uroce-names-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("more_names");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/more_names.c");
    compile(&src, &exe, &["-libverbs"]);
    let out = Command::new(&env().uroce)
        .args(["run", "--"])
        .arg(&exe)
        .env("UROCE_DEVICES", "uroce0=127.0.0.1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success() && text(&out).contains("all checks passed"), "{}", text(&out));
}

/// A 10 Gb/s veth is a 1X FDR10 port, as the kernel maps it for rxe: in
/// `ibv_query_port` (Debian's `ibv_devinfo`), in sysfs, in `uroce devinfo`.
#[test]
fn the_port_rate_follows_the_interface_speed() {
    if !can_run() {
        return;
    }
    let hosts = Hosts::new();
    let uroce = env().uroce.to_string_lossy().into_owned();
    let t = hosts.output_on_a(&[
        "sh",
        "-c",
        "cat /sys/class/infiniband/uroce0/ports/1/rate && ibv_devinfo -v && \"$0\" devinfo -v",
        &uroce,
    ]);
    assert!(t.starts_with("10 Gb/sec (1X FDR10)\n"), "{t}");
    for line in ["active_width:\t\t1X (1)\n", "active_speed:\t\t10.0 Gbps (8)\n"] {
        assert_eq!(t.matches(line).count(), 2, "{line:?} from both devinfos:\n{t}");
    }
}

/// perftest with each GID index of the device (`-x`): 0 is the veth's IPv4
/// address, 1 its IPv6 link-local one (between two hosts: on loopback both
/// "hosts" would have ::1). WRITE bandwidth, READ latency and SEND
/// bandwidth on each, and perftest shows the GID it used.
#[test]
fn perftest_runs_on_each_gid_index() {
    if !can_run() || !have("ib_write_bw") {
        assert!(std::env::var_os("CI").is_none(), "perftest is installed in CI");
        return;
    }
    let hosts = Hosts::new();
    // A link-local address is usable once duplicate address detection
    // ends (about a second). Until then the device's table already lists
    // it (as the kernel's GID table does) but no socket can bind it, so
    // a QP naming it fails to reach RTR: wait on both hosts (CI runs of
    // this test failed so before the wait).
    let deadline = Instant::now() + Duration::from_secs(20);
    for ns in [&hosts.a, &hosts.b] {
        loop {
            let out = Command::new("ip")
                .args(["-n", ns, "-6", "addr", "show", "scope", "link"])
                .output()
                .unwrap();
            let t = text(&out);
            if t.contains("fe80::") && !t.contains("tentative") {
                break;
            }
            assert!(Instant::now() < deadline, "no usable link-local address in {ns}:\n{t}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let gids = hosts.output_on(true, &["ibv_devinfo", "-v"]);
    assert!(gids.contains("GID[  1]:\t\tfe80::"), "GID 1 is the link-local address:\n{gids}");
    for (tool, gid) in
        [("ib_write_bw", "1"), ("ib_read_lat", "1"), ("ib_send_bw", "1"), ("ib_write_bw", "0")]
    {
        let port = uroce::testing::free_tcp_port().to_string();
        let args = [tool, "-x", gid, "-n", "200", "-p", &port];
        let server = hosts.cmd(true, &args).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        hosts.wait_listening(port.parse().unwrap(), deadline);
        let cargs = [&args[..], &[ADDR_A]].concat();
        let (co, ct) = finish(hosts.cmd(false, &cargs).spawn().unwrap(), deadline);
        let (so, st) = finish(server, deadline + Duration::from_secs(5));
        let (c, s) = (text(&co), text(&so));
        let all = format!("{tool} -x {gid}\n--- server ---\n{s}\n--- client ---\n{c}");
        assert!(!ct && !st && co.status.success() && so.status.success(), "failed: {all}");
        // perftest prints an IPv6 GID as decimal bytes, IPv4-mapped ones
        // as dotted hex: link-local starts 254:128.
        let want = if gid == "1" {
            "GID: 254:128:"
        } else {
            "GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:232"
        };
        assert_eq!(c.matches(want).count(), 2, "local and remote GID: {all}");
        let row = c.lines().filter(|l| l.trim_start().starts_with(char::is_numeric)).count();
        assert!(row >= 1, "no result row: {all}");
    }
}

/// One XRC domain, two client processes on host b (one device), the
/// server on host a, host b's link losing 2 % of the RoCE datagrams it
/// receives and duplicating 1 % of those it sends (nftables): Debian's
/// `ibv_xsrq_pingpong -c 2` sends to each client's SRQ through both
/// clients' target QPs in turn, so half the messages cross from one
/// client process to the other through the domain's table and relay,
/// while RC recovers what the link loses.
#[test]
fn xsrq_pingpong_serves_two_clients_of_one_device_over_a_lossy_link() {
    if !can_run() {
        return;
    }
    let hosts = Hosts::new();
    // Host b's end of the veth pair (as `Hosts::new` names it).
    let dev = format!("ueb{}", std::process::id() % 100_000);
    let rules = format!(
        "table inet uroce_loss {{\n\
         chain input {{\n\
         type filter hook input priority 0;\n\
         udp dport 4791 numgen random mod 1000 < 20 counter drop\n\
         }}\n\
         }}\n\
         table netdev uroce_dup {{\n\
         chain egress {{\n\
         type filter hook egress device {dev} priority 0;\n\
         udp dport 4791 numgen random mod 1000 < 10 counter dup to {dev}\n\
         }}\n\
         }}\n"
    );
    let mut nft = Command::new("ip")
        .args(["netns", "exec", &hosts.b, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut nft.stdin.take().unwrap(), rules.as_bytes()).unwrap();
    assert!(nft.wait().unwrap().success(), "nft rules on host b");
    let port = uroce::testing::free_tcp_port().to_string();
    let args = ["ibv_xsrq_pingpong", "-g", "0", "-n", "300", "-p", &port];
    let server = hosts.cmd(true, &[&args[..], &["-c", "2"]].concat()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    hosts.wait_listening(port.parse().unwrap(), deadline);
    let clients: Vec<_> = (0..2)
        .map(|_| hosts.cmd(false, &[&args[..], &[ADDR_A]].concat()).spawn().unwrap())
        .collect();
    let outs: Vec<_> = clients.into_iter().map(|c| finish(c, deadline)).collect();
    let (so, st) = finish(server, deadline + Duration::from_secs(5));
    let mut all = format!("--- server ---\n{}", text(&so));
    for (o, _) in &outs {
        all += &format!("\n--- client ---\n{}", text(o));
    }
    assert!(!st && outs.iter().all(|(_, t)| !t), "timed out: {all}");
    assert!(so.status.success() && outs.iter().all(|(o, _)| o.status.success()), "failed: {all}");
    assert_eq!(all.matches("success").count(), 3, "{all}");
    let counters = Command::new("ip")
        .args(["netns", "exec", &hosts.b, "nft", "list", "ruleset"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&counters.stdout);
    let packets: Vec<u64> = listed
        .split("packets ")
        .skip(1)
        .filter_map(|s| s.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(packets.len() == 2 && packets.iter().all(|&n| n > 0), "faults injected: {listed}");
    eprintln!("xsrq -c 2 over a lossy link: drops, duplicates {packets:?}");
}
