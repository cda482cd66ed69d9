//! The real data path under loss: two network namespaces joined by a veth
//! pair, nftables dropping a share of the RoCE datagrams at each side's
//! input (`numgen random`) and duplicating some at egress (`dup to`), and
//! two processes (this test binary, run again in each namespace) talking
//! RC over the `udp` backend. The kernel injects the faults, not uroce.
//!
//! At 0, 0.1, 1 and 5 % loss each way the client WRITEs, READs back and
//! SENDs messages of 1 B to 4 MiB, every byte checked (SENDs by the
//! server), runs FETCH_ADD and CMP_SWAP checking every returned value one
//! by one, then streams 64 KiB and 1 MiB WRITEs and READs for throughput.
//! Every operation must complete successfully; at 0.1 % loss the streams
//! keep ≥ 70 % of the loss-free throughput, at 1 % ≥ 30 %. The loss-free
//! streams are measured right before the lossy ones, each pair up to three
//! times, so that another job on the machine does not pass for loss.
//!
//! Needs root (network namespaces) and `nft`; the test command installs
//! nftables. Without them it is skipped, except under CI, where it fails.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use uroce::{Access, Completion, Cq, DeviceConfig, Mr, Qp, QpCaps, SendWr, WcStatus, WrOpcode};
use uroce_transport::SendFlags;

const ROLE: &str = "UROCE_LOSS_ROLE";
const ALL: Access = Access(1 | 2 | 4 | 8);
const REGION: usize = 8 << 20;
/// Where the atomics work, past every data message.
const ATOMIC_AT: usize = REGION - 4096;
const SIZES: [usize; 8] = [1, 4, 64, 1024, 4096, 65536, 1 << 20, 4 << 20];
const STREAMS: [(WrOpcode, usize); 4] = [
    (WrOpcode::RdmaWrite, 64 << 10),
    (WrOpcode::RdmaWrite, 1 << 20),
    (WrOpcode::RdmaRead, 64 << 10),
    (WrOpcode::RdmaRead, 1 << 20),
];

fn pattern(size: usize, seq: u32) -> Vec<u8> {
    (0..size)
        .map(|i| {
            (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seq * 97) as u8 ^ (i >> 8) as u8
        })
        .collect()
}

struct Side {
    ctx: uroce::Context,
    qp: Qp,
    cq: Cq,
    mr: Mr,
}

/// Runs the command after it as root without any capability (none
/// effective, permitted or inheritable, none to gain by exec).
const NO_CAPABILITIES: [&str; 3] = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"];

/// The calling process's effective capabilities (`CapEff`).
fn effective_capabilities() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap();
    u64::from_str_radix(hex.trim(), 16).unwrap()
}

fn side(addr: IpAddr) -> Side {
    if std::env::var_os("UROCE_LOSS_NOCAP").is_some() {
        assert_eq!(effective_capabilities(), 0, "a role meant to run without capabilities");
    }
    let ctx = uroce::Device::from_config(DeviceConfig { name: "loss".into(), addr, port: 4791 })
        .open()
        .expect("open device");
    // As perftest does, wait for the port to be active: a DPDK memif
    // port's link comes up once its peer has connected.
    let up = Instant::now();
    while !ctx.query_port(1).is_ok_and(|p| p.active) {
        assert!(up.elapsed() < Duration::from_secs(20), "the port never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(REGION, ALL).unwrap();
    let cq = ctx.create_cq(1024).unwrap();
    let cap = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = uroce::testing::rc_qp(&pd, &cq, cap, false);
    Side { ctx, qp, cq, mr }
}

fn line(out: &mut impl Write, s: &str) {
    writeln!(out, "{s}").unwrap();
    out.flush().unwrap();
}

/// A line from stdin, through std's own buffer (a second BufReader would
/// swallow lines that arrive together).
fn stdin_line() -> String {
    let mut s = String::new();
    std::io::stdin().read_line(&mut s).unwrap();
    s.trim().to_string()
}

/// Connects `s` with the peer whose line comes on stdin, after printing
/// ours ("qpn addr rkey").
fn handshake(s: &Side, peer: IpAddr, my_psn: u32, peer_psn: u32) -> (u64, u32) {
    let mut out = std::io::stdout();
    line(&mut out, &format!("INFO {} {} {}", s.qp.qpn(), s.mr.addr(), s.mr.rkey()));
    let l = stdin_line();
    let f: Vec<&str> = l.split_whitespace().collect();
    assert_eq!(f.first(), Some(&"INFO"), "{l}");
    let (qpn, addr, rkey) = (f[1].parse().unwrap(), f[2].parse().unwrap(), f[3].parse().unwrap());
    // The path MTU the parent asks for (`Net::path_mtu`), else 1024.
    let mtu = match std::env::var("UROCE_LOSS_MTU").as_deref() {
        Ok("4096") => uroce::Mtu::Mtu4096,
        _ => uroce::Mtu::Mtu1024,
    };
    uroce::connect_with_mtu(&s.qp, peer, 4791, qpn, my_psn, peer_psn, ALL, mtu).unwrap();
    (addr, rkey)
}

/// Waits for `n` completions, each successful; returns them.
fn wait(cq: &Cq, n: usize, what: &str) -> Vec<Completion> {
    let mut got = Vec::with_capacity(n);
    let mut wc = [Completion::new(0, WcStatus::Success, uroce::WcOpcode::Send, 0, false); 32];
    let deadline = Instant::now() + Duration::from_secs(120);
    while got.len() < n {
        let k = cq.poll(&mut wc).unwrap();
        for c in &wc[..k] {
            assert_eq!(c.status, WcStatus::Success, "{what}: {c:?}");
            got.push(*c);
        }
        assert!(Instant::now() < deadline, "{what}: {} of {n} completions", got.len());
        if k == 0 {
            std::thread::yield_now();
        }
    }
    got
}

fn server(addr: IpAddr, peer: IpAddr) {
    let s = side(addr);
    handshake(&s, peer, 0x2000, 0x1000);
    // Receives take the upper half; every SEND is checked here.
    let post = |i: u64| {
        let sge = [s.mr.sge(REGION / 2, (4 << 20) as u32).unwrap()];
        s.qp.post_recv(&[uroce::RecvWr { wr_id: i, sgl: &sge }]).unwrap();
    };
    post(0);
    line(&mut std::io::stdout(), "READY");
    let mut checked = 0;
    loop {
        // The client says how many SENDs to expect, or DONE.
        let l = stdin_line();
        if l == "DONE" || l.is_empty() {
            break;
        }
        if !l.starts_with("SEND ") {
            continue; // the client's throughput lines, passed along
        }
        let (size, seq): (usize, u32) = {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].parse().unwrap(), f[2].parse().unwrap())
        };
        let c = wait(&s.cq, 1, "server receive");
        assert_eq!((c[0].byte_len as usize, c[0].imm_or_inv), (size, seq), "{c:?}");
        let mut got = vec![0u8; size];
        s.mr.read(REGION / 2, &mut got).unwrap();
        assert!(got == pattern(size, seq), "SEND of {size} bytes (seq {seq}) corrupted");
        checked += 1;
        post(0);
        line(&mut std::io::stdout(), "ACK");
    }
    // What the device dropped before any QP saw it (the AF_XDP test's
    // noise).
    let st = s.ctx.stats();
    let dropped = st.drop_malformed + st.icrc_errors + st.drop_unknown_qpn;
    let xdp = format!(
        "xdp {} {} {} {}",
        st.xdp_rcvd_frames, st.xdp_rx_bad_checksum, st.xdp_rx_malformed, st.xdp_rx_multi_chunk
    );
    let dpdk = format!(
        "dpdk {} {} {} {}",
        st.dpdk_rcvd_frames, st.dpdk_sent_frames, st.dpdk_arp_replies, st.dpdk_arp_requests
    );
    line(&mut std::io::stdout(), &format!("SERVER OK {checked} {xdp} {dpdk} dropped {dropped}"));
}

struct Client {
    s: Side,
    raddr: u64,
    rkey: u32,
}

impl Client {
    fn post(&self, wr: SendWr<'_>) {
        self.s.qp.post_send(&[SendWr { flags: SendFlags::SIGNALED, ..wr }]).unwrap();
    }

    fn rdma(&self, op: WrOpcode, local: usize, remote: usize, len: usize, id: u64) {
        let sge = [self.s.mr.sge(local, len as u32).unwrap()];
        self.post(SendWr {
            wr_id: id,
            opcode: op,
            sgl: &sge,
            remote_addr: self.raddr + remote as u64,
            rkey: self.rkey,
            ..SendWr::default()
        });
    }

    fn atomic(&self, op: WrOpcode, compare_add: u64, swap: u64) -> u64 {
        let sge = [self.s.mr.sge(ATOMIC_AT, 8).unwrap()];
        self.post(SendWr {
            wr_id: 7,
            opcode: op,
            sgl: &sge,
            remote_addr: self.raddr + ATOMIC_AT as u64,
            rkey: self.rkey,
            compare_add,
            swap,
            ..SendWr::default()
        });
        wait(&self.s.cq, 1, "atomic");
        let mut v = [0u8; 8];
        self.s.mr.read(ATOMIC_AT, &mut v).unwrap();
        u64::from_ne_bytes(v)
    }

    /// WRITE, READ back and SEND every size, checking every byte.
    fn data(&self) {
        let half = REGION / 2;
        for (seq, &size) in SIZES.iter().enumerate() {
            let seq = seq as u32 + 1;
            let p = pattern(size, seq);
            self.s.mr.write(0, &p).unwrap();
            self.rdma(WrOpcode::RdmaWrite, 0, 0, size, 1);
            wait(&self.s.cq, 1, "WRITE");
            self.s.mr.write(half, &vec![0u8; size]).unwrap();
            self.rdma(WrOpcode::RdmaRead, half, 0, size, 2);
            wait(&self.s.cq, 1, "READ");
            let mut back = vec![0u8; size];
            self.s.mr.read(half, &mut back).unwrap();
            assert!(back == p, "{size} bytes WRITTEN then READ back differ");
            line(&mut std::io::stdout(), &format!("SEND {size} {seq}"));
            let sge = [self.s.mr.sge(0, size as u32).unwrap()];
            self.post(SendWr {
                wr_id: 3,
                opcode: WrOpcode::SendWithImm,
                sgl: &sge,
                imm_or_inv: seq,
                ..SendWr::default()
            });
            wait(&self.s.cq, 1, "SEND");
            assert_eq!(stdin_line(), "ACK");
        }
    }

    /// FETCH_ADD and CMP_SWAP, every returned value checked.
    fn atomics(&self) {
        self.s.mr.write(0, &0u64.to_ne_bytes()).unwrap();
        self.rdma(WrOpcode::RdmaWrite, 0, ATOMIC_AT, 8, 1);
        wait(&self.s.cq, 1, "WRITE of the atomic word");
        for i in 0..300u64 {
            let v = self.atomic(WrOpcode::AtomicFetchAndAdd, 3, 0);
            assert_eq!(v, 3 * i, "FETCH_ADD #{i} returned {v}");
        }
        for i in 0..200u64 {
            let v = self.atomic(WrOpcode::AtomicCmpAndSwp, 900 + i, 901 + i);
            assert_eq!(v, 900 + i, "CMP_SWAP #{i} returned {v}");
        }
        let v = self.atomic(WrOpcode::AtomicCmpAndSwp, 0, 0);
        assert_eq!(v, 1100, "final value");
    }

    /// Streams `total` bytes of `op` in `size` messages, 8 in flight;
    /// returns MB/s.
    fn stream(&self, op: WrOpcode, size: usize, total: usize) -> f64 {
        let depth = 8;
        let n = total / size;
        let t = Instant::now();
        let (mut posted, mut done) = (0, 0);
        while done < n {
            while posted < n && posted - done < depth {
                let slot = (posted % depth) * size % (REGION / 2);
                self.rdma(op, slot, slot, size, posted as u64);
                posted += 1;
            }
            done += wait(&self.s.cq, 1, "stream").len();
        }
        total as f64 / t.elapsed().as_secs_f64() / 1e6
    }
}

fn client(addr: IpAddr, peer: IpAddr) {
    let s = side(addr);
    let (raddr, rkey) = handshake(&s, peer, 0x1000, 0x2000);
    let c = Client { s, raddr, rkey };
    assert_eq!(stdin_line(), "READY");
    c.data();
    c.atomics();
    for (op, size) in STREAMS {
        // The best of three runs: the machine may be busy with something else.
        let best = (0..3).map(|_| c.stream(op, size, 64 << 20)).fold(0.0, f64::max);
        line(&mut std::io::stdout(), &format!("TPUT {op:?} {size} {best:.1}"));
    }
    line(&mut std::io::stdout(), "DONE");
}

/// Two namespaces and a veth pair, removed on drop.
struct Net {
    a: String,
    b: String,
    tag: char,
    /// The path MTU the roles connect with (0: 1024, `handshake`).
    path_mtu: std::cell::Cell<u32>,
    /// Where the RC roles run.
    roles: std::cell::Cell<Roles>,
}

/// Where the RC roles run (the DPDK tests place them otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(not(feature = "dpdk"), allow(dead_code))]
enum Roles {
    /// The server in `b`, the client in `a`.
    #[default]
    Apart,
    /// Both in `b`, on one device (its address).
    OneDevice,
}

fn sh(args: &[&str]) -> bool {
    Command::new(args[0]).args(&args[1..]).status().is_ok_and(|s| s.success())
}

impl Net {
    /// `tag`: one letter, so that the tests of one process make distinct
    /// namespaces and interfaces.
    fn new(tag: char) -> Option<Self> {
        let id = std::process::id() % 100_000;
        let (a, b) = (format!("uroce-{tag}a{id}"), format!("uroce-{tag}b{id}"));
        let net = Self { a, b, tag, path_mtu: Default::default(), roles: Default::default() };
        let (va, vb) = net.ifaces();
        let ok = sh(&["ip", "netns", "add", &net.a])
            && sh(&["ip", "netns", "add", &net.b])
            && sh(&["ip", "link", "add", &va, "type", "veth", "peer", "name", &vb])
            && sh(&["ip", "link", "set", &va, "netns", &net.a])
            && sh(&["ip", "link", "set", &vb, "netns", &net.b])
            && sh(&["ip", "-n", &net.a, "addr", "add", "10.231.0.1/24", "dev", &va])
            && sh(&["ip", "-n", &net.b, "addr", "add", "10.231.0.2/24", "dev", &vb])
            && sh(&["ip", "-n", &net.a, "addr", "add", "fd31::1/64", "dev", &va, "nodad"])
            && sh(&["ip", "-n", &net.b, "addr", "add", "fd31::2/64", "dev", &vb, "nodad"])
            && sh(&["ip", "-n", &net.a, "link", "set", &va, "up"])
            && sh(&["ip", "-n", &net.b, "link", "set", &vb, "up"])
            && sh(&["ip", "-n", &net.a, "link", "set", "lo", "up"])
            && sh(&["ip", "-n", &net.b, "link", "set", "lo", "up"]);
        ok.then_some(net)
    }

    /// One namespace (no veth), both roles in it: for ports that need no
    /// second host (a tap, shared memory).
    #[cfg(feature = "dpdk")]
    fn single(tag: char) -> Option<Self> {
        let id = std::process::id() % 100_000;
        let ns = format!("uroce-{tag}s{id}");
        let net = Self {
            a: ns.clone(),
            b: ns,
            tag,
            path_mtu: Default::default(),
            roles: Default::default(),
        };
        let ok = sh(&["ip", "netns", "add", &net.a])
            && sh(&["ip", "-n", &net.a, "link", "set", "lo", "up"]);
        ok.then_some(net)
    }

    /// Sets both veth ends' MTU to `link`, and the roles' path MTU to
    /// `path` from now on.
    fn set_mtu(&self, link: u32, path: u32) {
        let (va, vb) = self.ifaces();
        let link = link.to_string();
        for (ns, dev) in [(&self.a, va), (&self.b, vb)] {
            assert!(sh(&["ip", "-n", ns, "link", "set", &dev, "mtu", &link]), "MTU {link}");
        }
        self.path_mtu.set(path);
    }

    /// The veth ends in `a` and `b`.
    fn ifaces(&self) -> (String, String) {
        let id = std::process::id() % 100_000;
        (format!("u{}a{id}", self.tag), format!("u{}b{id}", self.tag))
    }

    /// Drops `permille` of the RoCE datagrams each namespace receives and
    /// duplicates `dup_permille` of those it sends.
    fn faults(&self, permille: u32, dup_permille: u32) {
        let (va, vb) = self.ifaces();
        for (ns, dev) in [(&self.a, va), (&self.b, vb)] {
            let rules = format!(
                "flush ruleset\n\
                 table inet uroce_loss {{\n\
                 chain input {{\n\
                 type filter hook input priority 0;\n\
                 udp dport 4791 numgen random mod 1000 < {permille} counter drop\n\
                 }}\n\
                 }}\n\
                 table netdev uroce_dup {{\n\
                 chain egress {{\n\
                 type filter hook egress device {dev} priority 0;\n\
                 udp dport 4791 numgen random mod 1000 < {dup_permille} counter dup to {dev}\n\
                 }}\n\
                 }}\n"
            );
            nft_load(ns, &rules);
        }
    }
}

/// Loads nftables `rules` in namespace `ns`.
fn nft_load(ns: &str, rules: &str) {
    let mut nft = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    nft.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
    assert!(nft.wait().unwrap().success(), "nft rules in {ns}");
}

/// The packets a `counter` in a line of `nft list` output counted (0 for
/// a line without one).
fn counter_packets(line: &str) -> u64 {
    line.split("counter packets ")
        .nth(1)
        .and_then(|r| r.split(' ').next()?.parse().ok())
        .unwrap_or(0)
}

impl Net {
    /// Counts, in `ns`, the RoCE datagrams received from rxe's range of
    /// UDP source ports (`0xC000` and up, one per QP pair) and from port
    /// 4791 (a kernel socket's), until [`Net::source_ports`] reads them.
    fn count_source_ports(&self, ns: &str) {
        let rules = "table inet uroce_sport {\n\
                     chain input {\n\
                     type filter hook input priority 0;\n\
                     udp dport 4791 udp sport 49152-65535 counter comment \"qp\"\n\
                     udp dport 4791 udp sport 4791 counter comment \"own\"\n\
                     }\n\
                     }\n";
        nft_load(ns, rules);
    }

    /// What [`Net::count_source_ports`] counted: (from QP ports, from
    /// 4791); the counters go.
    fn source_ports(&self, ns: &str) -> (u64, u64) {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "nft", "list", "table", "inet", "uroce_sport"])
            .output()
            .unwrap();
        let (mut qp, mut own) = (0, 0);
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let n = counter_packets(l);
            if l.contains("\"qp\"") {
                qp += n;
            } else if l.contains("\"own\"") {
                own += n;
            }
        }
        sh(&["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "uroce_sport"]);
        (qp, own)
    }

    /// Packets the rules dropped and duplicated so far, both sides.
    fn counted(&self) -> (u64, u64) {
        let (mut drops, mut dups) = (0, 0);
        for ns in [&self.a, &self.b] {
            let out = Command::new("ip")
                .args(["netns", "exec", ns, "nft", "list", "ruleset"])
                .output()
                .unwrap();
            for l in String::from_utf8_lossy(&out.stdout).lines() {
                let n = counter_packets(l);
                if l.contains(" drop") {
                    drops += n;
                } else if l.contains(" dup to ") {
                    dups += n;
                }
            }
        }
        (drops, dups)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        sh(&["ip", "netns", "del", &self.a]);
        if self.b != self.a {
            sh(&["ip", "netns", "del", &self.b]);
        }
    }
}

/// Runs this binary's role `role` in namespace `ns`, on `backend`
/// (`UROCE_BACKEND`; the default when `None`).
fn spawn(ns: &str, role: &str, backend: Option<&str>) -> Child {
    spawn_v(ns, role, backend, false, 0)
}

/// [`spawn`], the role on IPv6 addresses if `v6` (UD echo only).
/// `path_mtu`: the RC roles' (`handshake`; 0: 1024).
fn spawn_v(ns: &str, role: &str, backend: Option<&str>, v6: bool, path_mtu: u32) -> Child {
    let mut c = Command::new("ip");
    c.env("UROCE_LOSS_MTU", path_mtu.to_string());
    if v6 {
        c.env("UROCE_LOSS_IPV6", "1");
    } else {
        c.env_remove("UROCE_LOSS_IPV6");
    }
    let mut nocap = false;
    if let Some(b) = backend {
        // "xdp-nocap": AF_XDP in a process without any capability.
        let b = if b == "xdp-nocap" {
            nocap = true;
            "xdp"
        } else {
            b
        };
        // "dpdk" (af_packet on the namespace's veth end) or "dpdk:PORT"
        // (see `dpdk_eal_for`).
        let (b, port) = b.split_once(':').unwrap_or((b, ""));
        c.env("UROCE_BACKEND", b);
        if b == "dpdk" {
            let eal = if port.is_empty() { dpdk_eal(ns, path_mtu) } else { dpdk_eal_for(ns, port) };
            c.env("UROCE_DPDK_EAL", eal);
            if path_mtu == 4096 {
                c.env("UROCE_DPDK_MTU", "9000");
            } else {
                c.env_remove("UROCE_DPDK_MTU");
            }
        }
    } else {
        c.env_remove("UROCE_BACKEND");
    }
    c.args(["netns", "exec", ns]);
    if nocap {
        c.args(NO_CAPABILITIES).env("UROCE_LOSS_NOCAP", "1");
    } else {
        c.env_remove("UROCE_LOSS_NOCAP");
    }
    c.arg(std::env::current_exe().unwrap())
        .args(["loss_suite_over_veth", "--exact", "--nocapture", "--test-threads", "1"])
        .env(ROLE, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// A server role in namespace `b` and a client role in `a` (each with its
/// backend), with their pipes.
fn start_roles(
    net: &Net,
    server: (&str, Option<&str>),
    client: (&str, Option<&str>),
    v6: bool,
) -> (Child, Child, ChildStdin, ChildStdin, BufReader<ChildStdout>, BufReader<ChildStdout>) {
    let rc = client.0 == "client";
    let beside = rc && net.roles.get() == Roles::OneDevice;
    let srv_role = if beside { "server-beside" } else { server.0 };
    let mut srv = spawn_v(&net.b, srv_role, server.1, v6, net.path_mtu.get());
    if client.1 == Some("dpdk:memif-client") {
        // A memif client connects once, when its port starts: the
        // server's socket must be there by then.
        let sock = memif_socket(&net.b);
        let t = Instant::now();
        while !std::path::Path::new(&sock).exists() {
            assert!(t.elapsed() < Duration::from_secs(30), "no memif socket {sock}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let (cli_ns, cli_role) = if beside { (&net.b, "client-beside") } else { (&net.a, client.0) };
    let mut cli = spawn_v(cli_ns, cli_role, client.1, v6, net.path_mtu.get());
    let (s_in, c_in) = (srv.stdin.take().unwrap(), cli.stdin.take().unwrap());
    let s_out = BufReader::new(srv.stdout.take().unwrap());
    let c_out = BufReader::new(cli.stdout.take().unwrap());
    (srv, cli, s_in, c_in, s_out, c_out)
}

/// The next line of `r` that holds one of `markers`, from the first one
/// on ("" at the end): the test harness prints its own text too, and
/// "test NAME ... " without a newline before the role's first line.
fn next_marked(r: &mut BufReader<ChildStdout>, markers: &[&str]) -> String {
    let mut s = String::new();
    loop {
        s.clear();
        if r.read_line(&mut s).unwrap() == 0 {
            return String::new();
        }
        if let Some(at) = markers.iter().filter_map(|m| s.find(m)).min() {
            return s[at..].trim().to_string();
        }
    }
}

/// One throughput line of the client: operation, message size, MB/s.
type Tput = (String, usize, f64);

/// Runs one client/server pair at the current faults; returns the
/// client's throughput lines.
fn run_pair(net: &Net) -> Vec<Tput> {
    run_pair_on(net, None, None)
}

/// [`run_pair`] with the server's and the client's backends.
fn run_pair_on(net: &Net, server: Option<&str>, client: Option<&str>) -> Vec<Tput> {
    run_pair_with_end(net, server, client, None).0
}

/// [`run_pair_on`], also returning the server's last line ("SERVER OK
/// <SENDs checked> dropped <datagrams its device dropped>"); `go` is told
/// "GO" once the server is ready (its device open).
fn run_pair_with_end(
    net: &Net,
    server: Option<&str>,
    client: Option<&str>,
    go: Option<&mut ChildStdin>,
) -> (Vec<Tput>, String) {
    let (mut srv, mut cli, mut s_in, mut c_in, mut s_out, mut c_out) =
        start_roles(net, ("server", server), ("client", client), false);
    let next = |r: &mut BufReader<ChildStdout>| {
        next_marked(r, &["INFO ", "READY", "ACK", "SEND ", "TPUT ", "DONE", "SERVER OK"])
    };
    let si = next(&mut s_out);
    let ci = next(&mut c_out);
    line(&mut c_in, &si);
    line(&mut s_in, &ci);
    let ready = next(&mut s_out);
    line(&mut c_in, &ready);
    if let Some(g) = go {
        line(g, "GO");
    }
    let mut tput = vec![];
    loop {
        let l = next(&mut c_out);
        if l.is_empty() {
            break;
        }
        line(&mut s_in, &l);
        if l.starts_with("SEND ") {
            let ack = next(&mut s_out);
            line(&mut c_in, &ack);
        } else if let Some(t) = l.strip_prefix("TPUT ") {
            let f: Vec<&str> = t.split_whitespace().collect();
            tput.push((f[0].to_string(), f[1].parse().unwrap(), f[2].parse().unwrap()));
        } else if l == "DONE" {
            break;
        }
    }
    let done = next(&mut s_out);
    let (cs, ss) = (cli.wait().unwrap(), srv.wait().unwrap());
    assert!(cs.success() && ss.success(), "client {cs}, server {ss}");
    assert!(done.starts_with("SERVER OK"), "{done}");
    (tput, done)
}

#[test]
fn loss_suite_over_veth() {
    match std::env::var(ROLE).as_deref() {
        Ok("noise") => return noise(),
        Ok("big-noise") => {
            assert_eq!(stdin_line(), "GO");
            send_raw_frames(&big_frames());
            return line(&mut std::io::stdout(), "NOISE DONE");
        }
        Ok(r) if r.starts_with("refused:") => return refused(r[8..].parse().unwrap()),
        Ok("ud-server") => return ud_echo(true),
        Ok("ud-client") => return ud_echo(false),
        Ok("hold") => {
            // Open a device (on the backend the environment names), say
            // so, and wait to be killed.
            let s = side("10.231.0.2".parse().unwrap());
            line(&mut std::io::stdout(), "HOLDING");
            // Until killed or told to stop (stdin closed); "STATS" asks
            // for the DPDK backend's counters.
            while stdin_line() == "STATS" {
                let st = s.ctx.stats();
                let said = format!(
                    "HELD {} {} {} {}",
                    st.dpdk_rcvd_frames,
                    st.dpdk_rx_for_others,
                    st.dpdk_arp_replies,
                    st.dpdk_echo_replies
                );
                line(&mut std::io::stdout(), &said);
            }
            return;
        }
        Ok("broker") => {
            let iface = std::env::var("UROCE_LOSS_IFACE").unwrap();
            // Its sockets busy-poll: the suite runs through that path too.
            let opts = uroce::xdp_broker::Options { busy_poll: Some(20), ..Default::default() };
            uroce::xdp_broker::serve(&iface, &opts, || {
                line(&mut std::io::stdout(), "BROKER READY")
            })
            .unwrap();
            return;
        }
        Ok("server") => {
            return server("10.231.0.2".parse().unwrap(), "10.231.0.1".parse().unwrap());
        }
        Ok("client") => {
            return client("10.231.0.1".parse().unwrap(), "10.231.0.2".parse().unwrap());
        }
        // Client and server on one device (`Roles::OneDevice`).
        Ok("client-beside") => {
            return client("10.231.0.2".parse().unwrap(), "10.231.0.2".parse().unwrap());
        }
        Ok("server-beside") => {
            return server("10.231.0.2".parse().unwrap(), "10.231.0.2".parse().unwrap());
        }
        // Opens the device (twice: a second context of this process) and
        // says whether it could (and why not).
        Ok(r @ ("try-open" | "try-open-twice")) => {
            let open = || {
                let addr = "10.231.0.2".parse().unwrap();
                uroce::Device::from_config(DeviceConfig { name: "loss".into(), addr, port: 4791 })
                    .open()
            };
            let first = (r == "try-open-twice").then(|| open().expect("the first context"));
            let said = match open() {
                Ok(_) => "OPENED".to_string(),
                Err(e) => format!("REFUSED {e:?}"),
            };
            drop(first);
            return line(&mut std::io::stdout(), &said);
        }
        _ => {}
    }
    let can = is_root() && sh(&["nft", "--version"]);
    if !can {
        assert!(std::env::var_os("CI").is_none(), "the loss suite needs root and nft under CI");
        eprintln!("not root or no nft: skipped");
        return;
    }
    let net = Net::new('l').expect("namespaces and veth");
    eprintln!("loss each way | {}", STREAMS.map(|(o, s)| format!("{o:?} {s}")).join(" | "));
    let mut failures = vec![];
    for (permille, floor) in [(1u32, 0.7), (10, 0.3), (50, 0.0)] {
        // Each attempt measures loss-free and lossy streams back to back,
        // so that a busy machine slows both alike; a cell keeps its best
        // ratio, and a rate is measured again (up to five times: the
        // file's other tests run beside this one, and under a busy CI one
        // cell stayed at 65 % through three) while a cell is below its
        // floor. Every attempt checks every byte and every atomic result.
        let mut best = [0.0f64; STREAMS.len()];
        let mut last = (vec![], vec![]);
        for _ in 0..5 {
            net.faults(0, 0);
            let base = run_pair(&net);
            net.faults(permille, 5);
            let lossy = run_pair(&net);
            let (drops, dups) = net.counted();
            assert!(drops > 0 && dups > 0, "no fault was injected at {permille}‰");
            for (b, (l, base)) in best.iter_mut().zip(lossy.iter().zip(&base)) {
                *b = b.max(l.2 / base.2);
            }
            last = (base, lossy);
            if best.iter().all(|r| *r >= floor) {
                break;
            }
        }
        let cells: Vec<String> = last
            .1
            .iter()
            .zip(&last.0)
            .zip(&best)
            .map(|((l, b), r)| format!("{:.0} of {:.0} MB/s ({:.0}%)", l.2, b.2, r * 100.0))
            .collect();
        eprintln!("{:>5.1} % | {}", f64::from(permille) / 10.0, cells.join(" | "));
        for ((op, size, _), r) in last.1.iter().zip(best) {
            if r < floor {
                failures.push(format!(
                    "{op} {size} at {}% loss kept {:.0}% (< {:.0}%)",
                    f64::from(permille) / 10.0,
                    r * 100.0,
                    floor * 100.0
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Whether a test that needs root runs: not in a role's process (this
/// binary run again by a test), and not without root (skipped; under CI,
/// a failure).
fn may_run_as_root(what: &str) -> bool {
    if std::env::var(ROLE).is_ok() {
        return false;
    }
    if !is_root() {
        assert!(std::env::var_os("CI").is_none(), "{what} needs root under CI");
        eprintln!("not root: skipped");
        return false;
    }
    true
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Hostile datagrams to the server's RoCE port while the suite runs: 3000
/// of 0 to 1400 random bytes, every third with a BTH-like start (a
/// version-0 header, pad bits, a QPN near the server's), from a port
/// other than 4791, once the parent says the server's device is open.
/// Each must be dropped and counted, nothing else.
fn noise() {
    let sock = std::net::UdpSocket::bind("10.231.0.1:0").unwrap();
    assert_eq!(stdin_line(), "GO");
    send_raw_frames(&bad_frames());
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut buf = [0u8; 1400];
    // Those an AF_XDP server's program passes to its kernel: no whole
    // BTH, or a QPN of no slot but the server's (0), or QPN 1.
    let mut to_kernel = 0;
    for i in 0..3000 {
        let len = (next() % 1401) as usize;
        for b in &mut buf[..len] {
            *b = next() as u8;
        }
        if i % 3 == 0 && len >= 12 {
            buf[1] &= 0x3f; // SE/M/pad random, version 0
            buf[4..8].copy_from_slice(&(0x11 + (next() % 4) as u32).to_be_bytes());
        }
        let qpn = (len >= 8).then(|| u32::from_be_bytes([0, buf[5], buf[6], buf[7]]));
        if qpn.is_none_or(|q| q >> 18 != 0 || q == 1) {
            to_kernel += 1;
        }
        let _ = sock.send_to(&buf[..len], "10.231.0.2:4791");
        if i % 16 == 0 {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    line(&mut std::io::stdout(), &format!("NOISE DONE {to_kernel}"));
}

/// Sends to a closed port of `to` until an ICMP port unreachable makes the
/// socket report ECONNREFUSED, as a kernel's does (30 s at most; meanwhile
/// the address may not be resolved yet); says REFUSED.
fn refused(to: IpAddr) {
    let any: SocketAddr = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().unwrap();
    let s = std::net::UdpSocket::bind(any).unwrap();
    s.connect(SocketAddr::new(to, 9)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        let r = s.send(b"probe").and_then(|_| s.recv(&mut [0u8; 16]).map(|_| ()));
        if r.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused) {
            return line(&mut std::io::stdout(), "REFUSED");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no port unreachable from {to}");
}

/// Frames of each kind the noise sends raw (`bad_frames`).
const BAD_EACH: usize = 40;

/// IPv4/UDP frames to the server's RoCE port that no kernel socket would
/// send, `BAD_EACH` of each: a wrong UDP checksum (neither a full sum nor
/// the pseudo-header sum an offload would complete), a wrong IPv4 header
/// checksum, and an IP length longer than the frame. The AF_XDP side
/// counts the first two as `xdp_rx_bad_checksum` and the third as
/// `xdp_rx_malformed`, and drops them. Their payload starts as a BTH to
/// [`NO_QPN`], of the server's slot, so the program gives them to its
/// sockets.
fn bad_frames() -> Vec<Vec<u8>> {
    use uroce_transport::wire::checksum::{finish, sum};
    // The folded sum (not inverted).
    let csum = |data: &[u8], acc: u32| !finish(sum(data, acc));
    let (src, dst) = ([10u8, 231, 0, 1], [10u8, 231, 0, 2]);
    let frame = |kind: usize, i: usize| {
        let mut payload: Vec<u8> = (0..64).map(|k| (k * 7 + i) as u8).collect();
        payload[5..8].copy_from_slice(&NO_QPN.to_be_bytes()[1..]);
        let udp_len = 8 + payload.len();
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x00]);
        let ip_len = 20 + udp_len + if kind == 2 { 100 } else { 0 };
        let mut ip = vec![0x45, 0, (ip_len >> 8) as u8, ip_len as u8, 0, i as u8, 0x40, 0, 64, 17];
        ip.extend_from_slice(&[0, 0]);
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        let ip_sum = !csum(&ip, 0) ^ if kind == 1 { 0x0101 } else { 0 };
        ip[10..12].copy_from_slice(&ip_sum.to_be_bytes());
        let mut udp = vec![0x9c, 0x40, 0x12, 0xb7, (udp_len >> 8) as u8, udp_len as u8, 0, 0];
        udp.extend_from_slice(&payload);
        let pseudo = u32::from(csum(&dst, u32::from(csum(&src, 0)))) + udp_len as u32 + 17;
        let offload = csum(&[], pseudo);
        let full = !csum(&udp, pseudo);
        // Wrong for kind 0; right (a full sum) for the others.
        let mut check = if kind == 0 { full ^ 0x0f0f } else { full };
        if kind == 0 && (check == offload || check == 0) {
            check ^= 0x1010;
        }
        udp[6..8].copy_from_slice(&check.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&udp);
        f
    };
    (0..3).flat_map(|kind| (0..BAD_EACH).map(move |i| frame(kind, i))).collect()
}

/// Frames longer than the AF_XDP backend takes in (`BIG_EACH`).
const BIG_EACH: usize = 20;

/// A QPN of slot 0 (a context alone on its address) that no QP has: the
/// XDP program of such a context gives datagrams to it to the context's
/// sockets, a shared device's steering being by QPN.
const NO_QPN: u32 = 0x3_ffff;

/// Well-formed IPv4/UDP frames to the server's RoCE port, 12,000 bytes
/// each (four receive chunks, more than the backend puts together): a
/// link of MTU 16000 carries them, and the AF_XDP side drops and counts
/// each as `xdp_rx_malformed`.
fn big_frames() -> Vec<Vec<u8>> {
    use uroce_transport::wire::checksum::{finish, sum};
    (0..BIG_EACH)
        .map(|i| {
            let udp_len = 12_000 - 14 - 20;
            let ip_len = 20 + udp_len;
            let mut f = vec![0xff; 6];
            f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x00]);
            let mut ip = vec![0x45, 0, (ip_len >> 8) as u8, ip_len as u8, 0, i as u8, 0x40, 0];
            ip.extend_from_slice(&[64, 17, 0, 0, 10, 231, 0, 1, 10, 231, 0, 2]);
            let check = finish(sum(&ip, 0));
            ip[10..12].copy_from_slice(&check.to_be_bytes());
            f.extend_from_slice(&ip);
            // UDP checksum 0: none, as RoCEv2 over IPv4 may send.
            f.extend_from_slice(&[
                0x9c,
                0x40,
                0x12,
                0xb7,
                (udp_len >> 8) as u8,
                udp_len as u8,
                0,
                0,
            ]);
            f.resize(12_000, i as u8);
            f[42 + 5..42 + 8].copy_from_slice(&NO_QPN.to_be_bytes()[1..]);
            f
        })
        .collect()
}

/// Sends `frames` as they are on the namespace's one interface (AF_PACKET).
#[allow(unsafe_code)]
fn send_raw_frames(frames: &[Vec<u8>]) {
    let iface = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n != "lo")
        .expect("the veth end");
    let ifindex: i32 = std::fs::read_to_string(format!("/sys/class/net/{iface}/ifindex"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: socket calls on a descriptor this function owns and closes;
    // `addr` and each frame are live buffers of the lengths passed.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        assert!(fd >= 0, "AF_PACKET socket");
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = ifindex;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&[0xff; 6]);
        for f in frames {
            let n = libc::sendto(
                fd,
                f.as_ptr().cast(),
                f.len(),
                0,
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(n, f.len() as isize, "raw frame sent");
        }
        libc::close(fd);
    }
}

/// UD datagrams between the namespaces: the client sends `UD_ROUNDS`
/// datagrams of 1 to 1024 bytes through an address handle, the server
/// echoes each back to the QP its completion names, and the client checks
/// every byte of every echo. Loss-free links only (UD does not resend).
const UD_ROUNDS: usize = 300;
const UD_QKEY: u32 = 0x5151_0000;
const GRH: usize = 40;

fn ud_echo(server: bool) {
    // IPv4, or IPv6 when the parent says so.
    let v6 = std::env::var_os("UROCE_LOSS_IPV6").is_some();
    let (srv, cli) = if v6 { ("fd31::2", "fd31::1") } else { ("10.231.0.2", "10.231.0.1") };
    let (me, peer) = if server { (srv, cli) } else { (cli, srv) };
    let ctx = uroce::Device::from_config(DeviceConfig {
        name: "loss".into(),
        addr: me.parse().unwrap(),
        port: 4791,
    })
    .open()
    .expect("open device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let mr = pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    let cap = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&uroce::QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type: uroce::QpType::Ud,
            sq_sig_all: true,
            srq: None,
        })
        .unwrap();
    uroce::activate_ud(&qp, UD_QKEY, 1).unwrap();
    let ah = pd.create_ah(&uroce::AhAttr::new(peer.parse().unwrap())).unwrap();
    // Receives in slots 0..8 of 2 KiB (GRH + payload); sends from 32 KiB.
    let recv = |slot: usize| {
        let sge = [mr.sge(slot * 2048, (GRH + 1024) as u32).unwrap()];
        qp.post_recv(&[uroce::RecvWr { wr_id: slot as u64, sgl: &sge }]).unwrap();
    };
    // Send buffers: 16 of 1 KiB from 32 KiB (as many as sends in flight).
    let send_at = |k: usize| (32 << 10) + (k % 16) * 1024;
    let send = |len: usize, to: u32, k: usize| {
        let sge = [mr.sge(send_at(k), len as u32).unwrap()];
        qp.post_send(&[SendWr {
            wr_id: 100,
            sgl: &sge,
            ud: Some(ah.dest(to, UD_QKEY)),
            ..SendWr::default()
        }])
        .unwrap();
    };
    for slot in 0..8 {
        recv(slot);
    }
    line(&mut std::io::stdout(), &format!("UDQP {}", qp.qpn()));
    let l = stdin_line();
    let peer_qpn: u32 = l.strip_prefix("UDQP ").expect("the peer's UD QPN").parse().unwrap();
    let mut payload = vec![0u8; 1024];
    let mut pending = std::collections::VecDeque::new();
    if server {
        // Echo every datagram, in whatever order receives and send
        // completions come; an empty one ends the exchange.
        let (mut echoed, mut in_flight) = (0, 0);
        loop {
            let c = next_wc(&cq, &mut pending, "UD datagram");
            if c.opcode == uroce::WcOpcode::Send {
                in_flight -= 1;
                continue;
            }
            assert_eq!((c.opcode, c.src_qp), (uroce::WcOpcode::Recv, peer_qpn), "{c:?}");
            let len = c.byte_len as usize - GRH;
            recv_back(&mr, &qp, c.wr_id as usize, len, &mut payload);
            if len == 0 {
                break;
            }
            while in_flight == 16 {
                let s = next_wc(&cq, &mut pending, "UD echo sent");
                assert_eq!(s.opcode, uroce::WcOpcode::Send, "{s:?}");
                in_flight -= 1;
            }
            mr.write(send_at(echoed), &payload[..len]).unwrap();
            send(len, c.src_qp, echoed);
            echoed += 1;
            in_flight += 1;
        }
        line(&mut std::io::stdout(), &format!("SERVER OK UD {echoed}"));
    } else {
        // The first datagram may meet a peer still settling into its
        // address's sharing group, and UD does not resend: say hello until
        // an echo comes. After that the link loses nothing.
        let hello = pattern(1, 0);
        let mut answered = false;
        for k in 0..50 {
            mr.write(send_at(k), &hello).unwrap();
            send(1, peer_qpn, k);
            let t = Instant::now();
            let mut wc =
                [Completion::new(0, WcStatus::Success, uroce::WcOpcode::Send, 0, false); 4];
            while !answered && t.elapsed() < Duration::from_millis(100) {
                let k = cq.poll(&mut wc).unwrap();
                for c in &wc[..k] {
                    assert_eq!(c.status, WcStatus::Success, "{c:?}");
                    if c.opcode == uroce::WcOpcode::Recv {
                        recv_back(&mr, &qp, c.wr_id as usize, 1, &mut payload);
                        answered = true;
                    }
                }
            }
            if answered {
                break;
            }
        }
        assert!(answered, "no UD echo in 50 tries");
        // Late echoes of the hellos are skipped by their length.
        for i in 0..UD_ROUNDS {
            let len = 2 + i * 37 % 1023;
            let p = pattern(len, i as u32);
            mr.write(send_at(i), &p).unwrap();
            send(len, peer_qpn, i);
            let c = loop {
                let c = next_wc(&cq, &mut pending, "UD");
                if c.opcode == uroce::WcOpcode::Recv && c.byte_len as usize - GRH == 1 {
                    recv_back(&mr, &qp, c.wr_id as usize, 1, &mut payload);
                    continue;
                }
                if c.opcode == uroce::WcOpcode::Recv {
                    break c;
                }
            };
            assert_eq!(c.byte_len as usize - GRH, len, "echo {i} length");
            recv_back(&mr, &qp, c.wr_id as usize, len, &mut payload);
            assert!(payload[..len] == p[..], "echo {i} differs");
        }
        send(0, peer_qpn, 0);
        while next_wc(&cq, &mut pending, "the last UD datagram").opcode != uroce::WcOpcode::Send {}
        line(&mut std::io::stdout(), "DONE");
    }
}

/// The next completion of `cq`, one at a time (`wait` hands back every
/// completion one poll finds).
fn next_wc(
    cq: &Cq,
    pending: &mut std::collections::VecDeque<Completion>,
    what: &str,
) -> Completion {
    if pending.is_empty() {
        pending.extend(wait(cq, 1, what));
    }
    pending.pop_front().unwrap()
}

/// Copies slot `slot`'s payload of `len` bytes out and posts the slot
/// again.
fn recv_back(mr: &Mr, qp: &Qp, slot: usize, len: usize, out: &mut [u8]) {
    mr.read(slot * 2048 + GRH, &mut out[..len]).unwrap();
    let sge = [mr.sge(slot * 2048, (GRH + 1024) as u32).unwrap()];
    qp.post_recv(&[uroce::RecvWr { wr_id: slot as u64, sgl: &sge }]).unwrap();
}

/// Runs the UD echo with the server on `server` and the client on
/// `client` (backends).
fn run_ud(net: &Net, server: Option<&str>, client: Option<&str>, v6: bool) {
    let (mut srv, mut cli, mut s_in, mut c_in, mut s_out, mut c_out) =
        start_roles(net, ("ud-server", server), ("ud-client", client), v6);
    let next = |r: &mut BufReader<ChildStdout>| next_marked(r, &["UDQP ", "DONE", "SERVER OK"]);
    let (sq, cq) = (next(&mut s_out), next(&mut c_out));
    line(&mut c_in, &sq);
    line(&mut s_in, &cq);
    let (cd, sd) = (next(&mut c_out), next(&mut s_out));
    let (cs, ss) = (cli.wait().unwrap(), srv.wait().unwrap());
    assert!(cs.success() && ss.success(), "UD client {cs}, server {ss}");
    assert_eq!(cd, "DONE");
    assert!(sd.starts_with("SERVER OK UD"), "{sd}");
}

/// `ip -n ns ...`'s output.
fn ip_out(ns: &str, args: &[&str]) -> String {
    let out = Command::new("ip").args(["-n", ns]).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// UDP datagrams the kernel of `ns` delivered to its sockets so far.
fn kernel_udp_in(ns: &str) -> u64 {
    let out =
        Command::new("ip").args(["netns", "exec", ns, "cat", "/proc/net/snmp"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next().unwrap_or(""), udp.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "InDatagrams")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// The AF_XDP backend against the `udp` one between two namespaces (veth,
/// native XDP in copy mode): the whole client suite (WRITE, READ, SEND of
/// 1 B to 4 MiB with every byte checked, every atomic's result, streams)
/// with the AF_XDP side as server, then as client, then as server with
/// 1 % loss and duplicates injected on the `udp` side's kernel path. The
/// RoCE datagrams must go through the AF_XDP socket (the kernel of its
/// namespace delivers next to none to sockets), the kernel must keep
/// answering ping meanwhile, and the XDP program must be gone once the
/// process has exited, also by SIGKILL.
#[test]
fn af_xdp_backend_talks_to_the_udp_backend_over_veth() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    if !is_root() || !sh(&["nft", "--version"]) {
        assert!(std::env::var_os("CI").is_none(), "the AF_XDP test needs root and nft under CI");
        eprintln!("not root or no nft: skipped");
        return;
    }
    let net = Net::new('x').expect("namespaces and veth");
    let (_, vb) = net.ifaces();
    // The kernel keeps answering ping while the program is attached.
    let mut ping = Command::new("ip")
        .args(["netns", "exec", &net.a, "ping", "-q", "-c", "40", "-i", "0.05", "10.231.0.2"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let before = kernel_udp_in(&net.b);
    net.count_source_ports(&net.a);
    let mut noise = spawn(&net.a, "noise", None);
    let mut go = noise.stdin.take().unwrap();
    let (t, done) = run_pair_with_end(&net, Some("xdp"), None, Some(&mut go));
    // The AF_XDP side builds its frames: each QP's leave from rxe's port
    // for it, all but those sent through its kernel's socket while a MAC
    // was unknown (its ICRCs over the port each went out from, or the
    // client would have dropped them).
    let (qp_ports, own_port) = net.source_ports(&net.a);
    assert!(qp_ports > 1000 && own_port < 100, "source ports: {qp_ports} QP, {own_port} 4791");
    let mut said = String::new();
    BufReader::new(noise.stdout.take().unwrap()).read_to_string(&mut said).unwrap();
    assert!(noise.wait().unwrap().success(), "the noise sender");
    let noise_via_kernel: u64 = said
        .lines()
        .find_map(|l| l.split_once("NOISE DONE ").map(|(_, n)| n))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the noise sender said {said:?}"));
    let dropped: u64 = done.rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(dropped > 100, "the noise was not seen dropped: {done}");
    // "SERVER OK <checked> xdp <frames> <bad checksum> <malformed> <multi-chunk> dropped …"
    let xdp: Vec<u64> = done.split(' ').skip(4).take(3).map(|n| n.parse().unwrap()).collect();
    assert!(xdp[0] > 1000, "frames through the XSKs: {done}");
    // The raw frames, and not one of the kernel's: its UDP sockets' frames
    // on veth carry the sum left for offload, and the noise's too.
    assert_eq!((xdp[1], xdp[2]), (2 * BAD_EACH as u64, BAD_EACH as u64), "{done}");
    assert_eq!(t.len(), STREAMS.len(), "{t:?}");
    // Of the noise's datagrams, those that name the server's slot go
    // through the socket too; the others (no BTH, another slot's QPN)
    // through the kernel, as on a device that several processes share.
    let through_kernel = (kernel_udp_in(&net.b) - before).saturating_sub(noise_via_kernel);
    assert!(
        through_kernel < 100,
        "{through_kernel} RoCE datagrams reached the AF_XDP side through its kernel"
    );
    assert!(ping.wait().unwrap().success(), "ping through the XDP program's interface");
    assert!(!ip_out(&net.b, &["link", "show", "dev", &vb]).contains("xdp"), "program detached");
    eprintln!("AF_XDP server: {t:?}; {done}; from QP ports {qp_ports}, from 4791 {own_port}");
    run_ud(&net, Some("xdp"), None, false);
    run_ud(&net, None, Some("xdp"), false);
    // IPv6: neighbours from the kernel's table by netlink, a UDP checksum
    // on every frame.
    run_ud(&net, Some("xdp"), None, true);
    run_ud(&net, None, Some("xdp"), true);
    // The other way round, and with faults on the kernel side's path.
    let (va, _) = net.ifaces();
    let t = run_pair_on(&net, None, Some("xdp"));
    assert!(!ip_out(&net.a, &["link", "show", "dev", &va]).contains("xdp"), "program detached");
    eprintln!("AF_XDP client: {t:?}");
    // RoCE MTU 4096 on a jumbo link: frames span two chunks (multi-buffer
    // sockets and a frags-aware program), each way; frames of four chunks
    // come in meanwhile, each dropped and counted.
    net.set_mtu(16000, 4096);
    let mut big = spawn(&net.a, "big-noise", None);
    let mut go = big.stdin.take().unwrap();
    let (t, done) = run_pair_with_end(&net, Some("xdp"), None, Some(&mut go));
    assert!(big.wait().unwrap().success(), "the big frames' sender");
    let xdp: Vec<u64> = done.split(' ').skip(4).take(4).map(|n| n.parse().unwrap()).collect();
    assert!(xdp[3] > 1000, "frames in several chunks: {done}");
    assert_eq!((xdp[1], xdp[2]), (0, BIG_EACH as u64), "the big frames dropped: {done}");
    eprintln!("AF_XDP server, MTU 4096: {t:?}; {done}");
    let t = run_pair_on(&net, None, Some("xdp"));
    eprintln!("AF_XDP client, MTU 4096: {t:?}");
    net.set_mtu(1500, 0);
    net.faults(10, 5);
    let t = run_pair_on(&net, Some("xdp"), None);
    let (drops, dups) = net.counted();
    assert!(drops > 0 && dups > 0, "faults were injected ({drops} drops, {dups} duplicates)");
    eprintln!("AF_XDP server, 1 % loss: {t:?}");
    // SIGKILL leaves nothing behind: the program goes with the process's
    // last descriptor of its link, and the next start attaches again.
    for _ in 0..2 {
        let mut held = hold(&net.b, Some("xdp"));
        assert!(ip_out(&net.b, &["link", "show", "dev", &vb]).contains("xdp"), "attached");
        held.kill().unwrap();
        held.wait().unwrap();
        assert!(
            !ip_out(&net.b, &["link", "show", "dev", &vb]).contains("xdp"),
            "gone after SIGKILL"
        );
    }
}

/// One device, two processes, on the AF_XDP backend: the interface's
/// program belongs to the first that attached it and takes only its slot's
/// QPNs; the other finds it there and goes through the kernel (its QPNs
/// passed on, steered to it by the device's socket group). The whole
/// suite runs on the second process each way round: first with a plain
/// member holding slot 0 (the AF_XDP server owns the program for slot 1,
/// its frames through the sockets), then with an AF_XDP holder owning it
/// (the server's frames through the kernel, none through a socket).
#[test]
fn two_processes_share_an_af_xdp_device() {
    if !may_run_as_root("the AF_XDP test") {
        return;
    }
    let net = Net::new('s').expect("namespaces and veth");
    let (_, vb) = net.ifaces();
    let attached = || ip_out(&net.b, &["link", "show", "dev", &vb]).contains("xdp");
    // "SERVER OK <checked> xdp <frames> …"
    let frames = |done: &str| -> u64 { done.split(' ').nth(4).unwrap().parse().unwrap() };

    let mut member = hold(&net.b, None);
    assert!(!attached());
    let (t, done) = run_pair_with_end(&net, Some("xdp"), None, None);
    assert_eq!(t.len(), STREAMS.len(), "{t:?}");
    assert!(frames(&done) > 1000, "the owner's frames through its sockets: {done}");
    member.kill().unwrap();
    member.wait().unwrap();
    eprintln!("AF_XDP owner beside a member: {t:?}; {done}");

    let mut owner = hold(&net.b, Some("xdp"));
    assert!(attached());
    let (t, done) = run_pair_with_end(&net, Some("xdp"), None, None);
    assert_eq!(t.len(), STREAMS.len(), "{t:?}");
    assert_eq!(frames(&done), 0, "the member's frames through the kernel: {done}");
    assert!(attached(), "the owner's program stays");
    owner.kill().unwrap();
    owner.wait().unwrap();
    assert!(!attached(), "and goes with its owner");
    eprintln!("AF_XDP member beside the owner: {t:?}; {done}");
}

/// AF_XDP without privilege: a process without any capability is refused
/// the backend (and told of `uroce setup xdp`) until the interface's broker
/// runs (`uroce::xdp_broker::serve`, what `uroce setup xdp` starts); then
/// the whole suite runs on it through sockets and a program the broker
/// made, the program going when the process ends, and going with the
/// broker when the broker is killed.
#[test]
fn af_xdp_without_privilege_through_the_broker() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    if !is_root() || !sh(&["setpriv", "--version"]) {
        assert!(std::env::var_os("CI").is_none(), "the AF_XDP test needs root under CI");
        eprintln!("not root or no setpriv: skipped");
        return;
    }
    let net = Net::new('p').expect("namespaces and veth");
    let (_, vb) = net.ifaces();
    let attached = || ip_out(&net.b, &["link", "show", "dev", &vb]).contains("xdp");
    let gone = || {
        let t = Instant::now();
        while attached() {
            assert!(t.elapsed() < Duration::from_secs(5), "the program stayed attached");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let out = Command::new("ip")
        .args(["netns", "exec", &net.b])
        .args(NO_CAPABILITIES)
        .arg(std::env::current_exe().unwrap())
        .args(["loss_suite_over_veth", "--exact", "--nocapture", "--test-threads", "1"])
        .env(ROLE, "hold")
        .env("UROCE_BACKEND", "xdp")
        .env("UROCE_LOSS_NOCAP", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a process without capabilities opened AF_XDP alone");
    assert!(err.contains(&format!("uroce setup xdp {vb}")), "not told of the broker: {err}");
    assert!(!attached());

    let mut broker = Command::new("ip")
        .args(["netns", "exec", &net.b])
        .arg(std::env::current_exe().unwrap())
        .args(["loss_suite_over_veth", "--exact", "--nocapture", "--test-threads", "1"])
        .env(ROLE, "broker")
        .env("UROCE_LOSS_IFACE", &vb)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = BufReader::new(broker.stdout.take().unwrap());
    assert_eq!(next_marked(&mut said, &["BROKER READY"]), "BROKER READY");
    // "SERVER OK <checked> xdp <frames> …"
    let frames = |done: &str| -> u64 { done.split(' ').nth(4).unwrap().parse().unwrap() };
    // Twice: the second takes the interface again once the first let go.
    for _ in 0..2 {
        let (t, done) = run_pair_with_end(&net, Some("xdp-nocap"), None, None);
        assert_eq!(t.len(), STREAMS.len(), "{t:?}");
        assert!(frames(&done) > 1000, "frames through the broker's sockets: {done}");
        gone();
        eprintln!("AF_XDP without capabilities: {t:?}; {done}");
    }
    let mut held = hold(&net.b, Some("xdp-nocap"));
    assert!(attached());
    broker.kill().unwrap();
    broker.wait().unwrap();
    gone();
    held.kill().unwrap();
    held.wait().unwrap();
}

/// Starts the `hold` role (a device open on `backend`) in namespace `ns`
/// and waits until it holds the device.
fn hold(ns: &str, backend: Option<&str>) -> Child {
    hold_with_output(ns, backend).0
}

/// [`hold`], keeping the holder's output (its answers to "STATS").
fn hold_with_output(ns: &str, backend: Option<&str>) -> (Child, BufReader<ChildStdout>) {
    let mut held = spawn(ns, "hold", backend);
    let mut out = BufReader::new(held.stdout.take().unwrap());
    assert_eq!(next_marked(&mut out, &["HOLDING"]), "HOLDING", "the holder ended early");
    (held, out)
}

/// Turns the kernel's UDP segmentation offload off on both veth ends:
/// a GSO run is then cut into datagrams before it crosses the pair, as on
/// an interface without the offload, and each arrives alone.
fn segment_in_software(net: &Net) {
    let (va, vb) = net.ifaces();
    for (ns, dev) in [(&net.a, &va), (&net.b, &vb)] {
        assert!(
            sh(&["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx-udp-segmentation", "off"]),
            "ethtool -K {dev} tx-udp-segmentation off"
        );
    }
}

/// Two `udp` backends whose GSO runs arrive as separate datagrams (no
/// segmentation offload, no GRO run at the receiver): segment i carries
/// IP ID i, which the receiver cannot see and must recover from the ICRC.
/// Every packet must pass (the device drops none), where before a run's
/// segments after the first failed the ICRC and waited for resends
/// (8 B ping-pong 525 µs instead of 20).
#[test]
fn gso_runs_cut_apart_on_the_way_pass_the_icrc() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    if !is_root() || !sh(&["ethtool", "--version"]) {
        assert!(std::env::var_os("CI").is_none(), "the test needs root and ethtool under CI");
        eprintln!("not root or no ethtool: skipped");
        return;
    }
    let net = Net::new('g').expect("namespaces and veth");
    segment_in_software(&net);
    let (t, done) = run_pair_with_end(&net, None, None, None);
    assert_eq!(t.len(), STREAMS.len(), "{t:?}");
    assert!(done.ends_with(" dropped 0"), "the device dropped packets: {done}");
}

/// The EAL arguments of a DPDK role in namespace `ns`: no hugepages, an
/// af_packet port on the namespace's veth end (`Net::ifaces`: namespace
/// `uroce-<tag><a|b><id>` holds `u<tag><a|b><id>`), its ring's frames
/// as large as the port's mbufs (the PMD refuses larger ones): 2 KiB, or
/// 8 KiB on the jumbo link of path MTU 4096.
fn dpdk_eal(ns: &str, path_mtu: u32) -> String {
    let iface = format!("u{}", ns.trim_start_matches("uroce-"));
    let frame = if path_mtu == 4096 { 8192 } else { 2048 };
    format!(
        "--no-huge -m 256 --no-pci --file-prefix={ns} --log-level=4 \
         --vdev=net_af_packet0,iface={iface},qpairs=1,blocksz=8192,framesz={frame},framecnt=512"
    )
}

/// EAL arguments for DPDK ports other than af_packet, in namespace `ns`:
/// `tap` (a tap interface `dt<ns id>` the test made, `multi_queue` as the
/// tap driver asks) or `memif-server`/`memif-client` (shared memory
/// through a socket file, [`memif_socket`]; the client connects only when
/// its port starts, so it is started once the server made the socket), or
/// `null` (a port that sees nothing).
/// Each its own file prefix: both roles may run in one namespace.
fn dpdk_eal_for(ns: &str, port: &str) -> String {
    let vdev = match port {
        "tap" => format!("net_tap0,iface={}", tap_name(ns)),
        // A port that sees nothing (the sharing test's refusal).
        "null" => "net_null0".to_string(),
        "memif-server" | "memif-client" => {
            let role = port.trim_start_matches("memif-");
            let sock = memif_socket(ns);
            format!("net_memif0,role={role},id=0,socket={sock},socket-abstract=no")
        }
        _ => panic!("no DPDK port kind {port}"),
    };
    format!("--no-huge -m 256 --no-pci --file-prefix={ns}-{port} --log-level=4 --vdev={vdev}")
}

/// The memif socket of namespace `ns` (a file: the client waits for it).
fn memif_socket(ns: &str) -> String {
    format!("/run/uroce-memif-{ns}.sock")
}

fn tap_name(ns: &str) -> String {
    format!("dt{}", ns.trim_start_matches("uroce-"))
}

/// The DPDK backend (feature `dpdk`) against the `udp` backend over the
/// veth pair, each way: the DPDK side's kernel has no IPv4 address, so
/// the backend answers ARP (and ping) for its address itself and resolves
/// its peer by ARP; the suite (every size, atomics, streams) runs clean, with 1 %
/// loss and duplicates on the kernel side's path, and at RoCE MTU 4096;
/// the UD echo too, over IPv4 and over IPv6 (neighbour discovery ours).
#[cfg(feature = "dpdk")]
#[test]
fn dpdk_backend_talks_to_the_udp_backend_over_veth() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    if !is_root() || !sh(&["nft", "--version"]) {
        assert!(std::env::var_os("CI").is_none(), "the DPDK test needs root and nft under CI");
        eprintln!("not root or no nft: skipped");
        return;
    }
    let net = Net::new('d').expect("namespaces and veth");
    let (va, vb) = net.ifaces();
    // The kernel side's UDP GSO runs cross a veth pair whole, and a
    // packet socket (af_packet) sees them so, where a NIC would have put
    // separate frames on the wire: segment them in the kernel instead.
    segment_in_software(&net);
    let kernel_off = |ns: &str, dev: &str, ip: &str, on: bool| {
        let verb = if on { "add" } else { "del" };
        assert!(sh(&["ip", "-n", ns, "addr", verb, ip, "dev", dev]), "{verb} {ip}");
    };
    // The server on DPDK in b: its kernel gives the address up.
    kernel_off(&net.b, &vb, "10.231.0.2/24", false);
    // The backend answers ping for its address (once its port is up).
    let mut ping = Command::new("ip")
        .args(["netns", "exec", &net.a, "ping", "-q", "-c", "60", "-i", "0.05", "10.231.0.2"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // And says "port unreachable" for a port nothing listens on.
    let probe = spawn(&net.a, "refused:10.231.0.2", None);
    net.count_source_ports(&net.a);
    let (t, done) = run_pair_with_end(&net, Some("dpdk"), None, None);
    // Every RoCE frame of the DPDK side leaves from rxe's port for its QP.
    let (qp_ports, own_port) = net.source_ports(&net.a);
    assert!(qp_ports > 1000 && own_port == 0, "source ports: {qp_ports} QP, {own_port} 4791");
    assert!(ping.wait().unwrap().success(), "ping answered by the DPDK backend");
    let said = probe.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&said.stdout).contains("REFUSED"),
        "port unreachable from the DPDK side"
    );
    let dpdk = dpdk_counts(&done);
    assert!(dpdk[0] > 1000 && dpdk[1] > 1000, "frames through the DPDK port: {done}");
    // (The peer's kernel learns our MAC from an ARP reply, or from the
    // announcement at start when ping had made it ask already: the count
    // of replies is not asserted.)
    assert_eq!(t.len(), STREAMS.len(), "{t:?}");
    eprintln!("DPDK server: {t:?}; {done}");
    kernel_off(&net.b, &vb, "10.231.0.2/24", true);
    // The client on DPDK in a, with loss and duplicates on the server's
    // path (the DPDK side's frames bypass its kernel's rules).
    kernel_off(&net.a, &va, "10.231.0.1/24", false);
    let t = run_pair_on(&net, None, Some("dpdk"));
    eprintln!("DPDK client: {t:?}");
    net.faults(10, 5);
    let t = run_pair_on(&net, None, Some("dpdk"));
    let (drops, dups) = net.counted();
    assert!(drops > 0 && dups > 0, "faults were injected ({drops} drops, {dups} duplicates)");
    eprintln!("DPDK client, 1 % loss: {t:?}");
    net.faults(0, 0);
    // RoCE MTU 4096 on a jumbo link: the port's mbufs take whole frames.
    net.set_mtu(9000, 4096);
    let t = run_pair_on(&net, None, Some("dpdk"));
    eprintln!("DPDK client, MTU 4096: {t:?}");
    net.set_mtu(1500, 0);
    run_ud(&net, None, Some("dpdk"), false);
    // IPv6: the DPDK side's kernel gives its address up too; the peer's
    // kernel resolves it by our neighbour advertisements, and we resolve
    // the peer by solicitation; ping6 is answered.
    kernel_off(&net.a, &va, "fd31::1/64", false);
    let mut ping6 = Command::new("ip")
        .args(["netns", "exec", &net.b, "ping", "-6", "-q", "-c", "60", "-i", "0.05", "fd31::1"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let probe = spawn(&net.b, "refused:fd31::1", None);
    run_ud(&net, None, Some("dpdk"), true);
    assert!(ping6.wait().unwrap().success(), "ping6 answered by the DPDK backend");
    let said = probe.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&said.stdout).contains("REFUSED"),
        "ICMPv6 port unreachable from DPDK"
    );
    // Each process ran its own EAL primary (the file prefix and its
    // process ID) and removed its run-time directory at exit.
    for ns in [&net.a, &net.b] {
        assert_eq!(eal_dirs(ns), Vec::<String>::new(), "EAL run-time directories left");
    }
}

/// The DPDK counters of a server's last line ("SERVER OK <checked> xdp
/// <4 counts> dpdk <rcvd> <sent> <arp replies> <arp requests> dropped
/// <n>"): received, sent, ARP replies, ARP requests.
#[cfg(feature = "dpdk")]
fn dpdk_counts(done: &str) -> Vec<u64> {
    done.split(' ').skip(9).take(4).map(|n| n.parse().unwrap()).collect()
}

/// The EAL run-time directories of file prefix `base` (DPDK's own, and
/// those with a process ID that uroce gives each process).
#[cfg(feature = "dpdk")]
fn eal_dirs(base: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/var/run/dpdk") else { return vec![] };
    dir.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n == base
                || n.strip_prefix(base)
                    .and_then(|r| r.strip_prefix('-'))
                    .is_some_and(|r| r.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect()
}

/// Removes what [`eal_dirs`] finds (processes killed leave theirs).
#[cfg(feature = "dpdk")]
fn remove_eal_dirs(base: &str) {
    for d in eal_dirs(base) {
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{d}"));
    }
}

/// Several processes on one DPDK device (one interface, each process its
/// own af_packet port on it): each takes the frames of its own QPNs and
/// leaves the others'; the first member answers ARP and ping alone (no
/// duplicate replies), and when it dies the next one does; two members
/// talk to each other through memory (frames to the device's own address
/// cannot leave the port and come back); a port of another kind, and a
/// second context of one process, are refused.
#[cfg(feature = "dpdk")]
#[test]
fn processes_share_a_dpdk_device() {
    if !may_run_as_root("the DPDK test") {
        return;
    }
    let net = Net::new('m').expect("namespaces and veth");
    let (va, vb) = net.ifaces();
    segment_in_software(&net);
    assert!(sh(&["ip", "-n", &net.b, "addr", "del", "10.231.0.2/24", "dev", &vb]));
    let ping = |count: &str| {
        Command::new("ip")
            .args(["netns", "exec", &net.a, "ping", "-c", count, "-i", "0.05", "-W", "2"])
            .arg("10.231.0.2")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let replies = |p: Child| {
        let out = p.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "ping answered: {text}");
        assert!(!text.contains("DUP!") && !text.contains("duplicates"), "one reply each: {text}");
    };
    // The first member (slot 0) answers for the device; the server takes
    // slot 1 and the frames of its QPs, and answers nothing.
    let (mut first, mut first_out) = hold_with_output(&net.b, Some("dpdk"));
    let pinging = ping("40");
    let (t, done) = run_pair_with_end(&net, Some("dpdk"), None, None);
    assert_eq!(t.len(), STREAMS.len(), "{t:?}");
    let dpdk = dpdk_counts(&done);
    assert!(dpdk[0] > 1000, "the server's frames: {done}");
    assert_eq!(dpdk[2], 0, "the server answered ARP beside the first member: {done}");
    replies(pinging);
    // The first member saw the server's frames and left them; it answered
    // ARP and ping.
    line(first.stdin.as_mut().unwrap(), "STATS");
    let held = next_marked(&mut first_out, &["HELD "]);
    let c: Vec<u64> = held.split(' ').skip(1).map(|n| n.parse().unwrap()).collect();
    assert_eq!(c[0], 0, "frames the first member took: {held}");
    // (Not all of them: an idle member's packet ring may overflow.)
    assert!(c[1] > 1000, "frames the first member left to the server: {held}, {done}");
    assert!(c[2] > 0 && c[3] > 0, "ARP and ping answered by the first member: {held}");
    eprintln!("first member: {held}");
    // A port of another kind cannot share the device (it would not see
    // every frame), nor can a second context of one process (its
    // af_packet socket would split the frames with the first's).
    for (role, port, why) in [
        ("try-open", "dpdk:null", "a net_null port cannot be shared"),
        ("try-open-twice", "dpdk", "a process has one context per DPDK device"),
    ] {
        let mut other = spawn(&net.b, role, Some(port));
        let mut out = BufReader::new(other.stdout.take().unwrap());
        let said = next_marked(&mut out, &["OPENED", "REFUSED"]);
        std::io::copy(&mut out, &mut std::io::sink()).unwrap();
        assert!(other.wait().unwrap().success());
        assert!(said.contains(why), "{role} on {port}: {said}");
    }
    eprintln!("DPDK server beside a member: {t:?}; {done}");
    // The first member dies: the next one answers within its next check.
    let mut second = hold(&net.b, Some("dpdk"));
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(sh(&["ip", "-n", &net.a, "neigh", "flush", "dev", &va]));
    std::thread::sleep(Duration::from_millis(300));
    replies(ping("10"));
    second.kill().unwrap();
    second.wait().unwrap();
    // Client and server on the device, both DPDK: through memory, none of
    // it through the port.
    net.roles.set(Roles::OneDevice);
    let (t, done) = run_pair_with_end(&net, Some("dpdk"), Some("dpdk"), None);
    net.roles.set(Roles::Apart);
    assert_eq!(t.len(), STREAMS.len(), "{t:?}");
    let dpdk = dpdk_counts(&done);
    assert_eq!(dpdk[0], 0, "frames between members through the port: {done}");
    eprintln!("DPDK client and server on one device: {t:?}; {done}");
    remove_eal_dirs(&net.b);
}

/// Other DPDK ports than af_packet, each with the whole suite: `net_tap`
/// (the test's tap interface, whose kernel side holds the `udp` client's
/// address: the kernel resolves the DPDK server through our ARP), and
/// `net_memif` (two DPDK uroces joined by shared memory, no kernel on the
/// path at all: each resolves the other by our ARP).
#[cfg(feature = "dpdk")]
#[test]
fn dpdk_backend_on_tap_and_memif_ports() {
    if !may_run_as_root("the DPDK test") {
        return;
    }
    let net = Net::single('t').expect("a namespace");
    let tap = tap_name(&net.a);
    let ns = |args: &[&str]| {
        let mut v = vec!["ip", "-n", &net.a];
        v.extend_from_slice(args);
        assert!(sh(&v), "{v:?}");
    };
    ns(&["tuntap", "add", "dev", &tap, "mode", "tap", "multi_queue"]);
    ns(&["addr", "add", "10.231.0.1/24", "dev", &tap]);
    ns(&["link", "set", &tap, "up"]);
    let t = run_pair_on(&net, Some("dpdk:tap"), None);
    assert_eq!(t.len(), STREAMS.len(), "{t:?}");
    eprintln!("DPDK server on net_tap: {t:?}");
    let t = run_pair_on(&net, Some("dpdk:memif-server"), Some("dpdk:memif-client"));
    assert_eq!(t.len(), STREAMS.len(), "{t:?}");
    eprintln!("DPDK on net_memif, both ends: {t:?}");
    for port in ["tap", "memif-server", "memif-client"] {
        remove_eal_dirs(&format!("{}-{port}", net.a));
    }
    let _ = std::fs::remove_file(memif_socket(&net.a));
}
