//! `uroce perf {send,write,read,atomic}-{bw,lat}`: perftest's ib_*_bw and
//! ib_*_lat, speaking its default out-of-band TCP protocol (version
//! "6.06", system data, MTU, 108-byte key records and the same number of
//! handshakes per test; see `docs/perftest-protocol.md`) and printing its
//! header block and tables, so that Debian's perftest and this tool can
//! face each other once the drop-in library exists.

use std::fmt::Write as _;
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use uroce::{
    Access, AttrMask, Completion, Cq, Mr, Mtu, Path, Pd, Psn, Qp, QpAttr, QpCaps, QpInitAttr,
    QpState, QpType, RecvWr, RnrTimer, SendFlags, SendWr, WrOpcode,
};

use crate::common;

mod bw;
mod lat;
mod oob;
mod report;

use bw::{rdma_bw, send_bw};
use lat::{rdma_lat, send_lat};
use oob::{CmLink, Dest, Link, Oob};
use report::{print_dest, print_info};

/// Which test.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum, Debug)]
pub(crate) enum Test {
    SendBw,
    WriteBw,
    ReadBw,
    AtomicBw,
    SendLat,
    WriteLat,
    ReadLat,
    AtomicLat,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verb {
    Send,
    Write,
    Read,
    Atomic,
}

impl Test {
    fn verb(self) -> Verb {
        match self {
            Self::SendBw | Self::SendLat => Verb::Send,
            Self::WriteBw | Self::WriteLat => Verb::Write,
            Self::ReadBw | Self::ReadLat => Verb::Read,
            Self::AtomicBw | Self::AtomicLat => Verb::Atomic,
        }
    }

    fn is_bw(self) -> bool {
        matches!(self, Self::SendBw | Self::WriteBw | Self::ReadBw | Self::AtomicBw)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum, Debug)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub(crate) enum AtomicType {
    #[value(name = "FETCH_AND_ADD")]
    FETCH_AND_ADD,
    #[value(name = "CMP_AND_SWAP")]
    CMP_AND_SWAP,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum, Debug)]
#[allow(non_camel_case_types)]
pub(crate) enum Output {
    #[value(name = "bandwidth")]
    bandwidth,
    #[value(name = "message_rate")]
    message_rate,
    #[value(name = "latency")]
    latency,
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The test.
    #[arg(value_enum)]
    test: Test,
    /// Connect to this server (omit to be the server).
    server: Option<String>,
    /// Device (default: the first).
    #[arg(short = 'd', long = "ib-dev")]
    dev: Option<String>,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// GID index (default 0, the device's address).
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<i32>,
    /// MTU (256..4096; default: the port's active MTU).
    #[arg(short = 'm', long = "mtu")]
    mtu: Option<u32>,
    /// Message size (K and M suffixes). Defaults: bw 65536, lat 2, atomic 8.
    #[arg(short = 's', long = "size", value_parser = parse_size)]
    size: Option<usize>,
    /// Run sizes 2 to 2^23.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Iterations (default 5000 for write-bw, 1000 otherwise).
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations (bw).
    #[arg(short = 'D', long = "duration")]
    duration: Option<u64>,
    /// Number of QPs (bw tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: u32,
    /// Send queue depth (default: bw 128, lat 1).
    #[arg(short = 't', long = "tx-depth")]
    tx_depth: Option<u32>,
    /// Max inline data (write and send).
    #[arg(short = 'I', long = "inline_size", default_value_t = 0)]
    inline: u32,
    /// Accept any CPU frequency reading (timing here uses the monotonic clock).
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// TCP port of the exchange (with -R: the rdma_cm port of the channel
    /// and of every test connection).
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Connect through the RDMA CM, as perftest's -R: the side channel is
    /// an rdma_cm connection of its own, and each test QP is connected by
    /// the CM (IPv4, RC).
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
    /// Atomic operation.
    #[arg(short = 'A', long = "atomic_type", value_enum, default_value = "FETCH_AND_ADD")]
    atomic_type: AtomicType,
    /// Report bandwidth in Gb/sec (10^9 bits).
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Print only one number: bandwidth or message_rate (bw), latency (lat).
    #[arg(long = "output", value_enum)]
    output: Option<Output>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let v = common::parse_size(s)?;
    if v == 0 || v > (u32::MAX / 2) as usize {
        return Err(format!("size {s} out of range"));
    }
    Ok(v)
}

/// The version perftest 4.5-0.17 (Debian 12) sends; peers below 5.70 are
/// refused by it, and so by us.
const VERSION: &str = "6.06";
const KEY_LEN: usize = 108;
const MAX_SIZE: usize = 1 << 23;
const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";
const RX_DEPTH: u32 = 512;
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;

struct Setup {
    test: Test,
    client: bool,
    /// The QPs were connected by the RDMA CM (-R).
    rdma_cm: bool,
    qps: usize,
    sizes: Vec<usize>,
    iters: u64,
    tx_depth: u32,
    cq_mod: u32,
    mtu: Mtu,
    gid_index: u32,
    out_reads: u16,
    /// `BUFF_SIZE`: each QP's send region and receive region.
    buff: usize,
    cycle: usize,
    cache_line: usize,
}

struct Res {
    ctx: uroce::Context,
    _pd: Pd,
    mr: Mr,
    cq: Cq,
    qps: Vec<Qp>,
}

fn inc(s: usize, cl: usize) -> usize {
    if s > cl { s.div_ceil(cl) * cl } else { cl }
}

pub(crate) fn run(a: &Args) -> Result<ExitCode> {
    let t = a.test;
    let verb = t.verb();
    if !t.is_bw() && a.qps != 1 {
        bail!("Multiple QPs only available on bw tests");
    }
    if a.qps == 0 {
        bail!("-q must be at least 1");
    }
    if a.duration.is_some() && a.all {
        bail!("Duration mode currently doesn't support running on all sizes");
    }
    if a.duration.is_some_and(|d| d < 3) {
        bail!("-D needs at least 3 seconds (a quarter is kept as a margin at each end)");
    }
    if verb == Verb::Atomic && (a.all || a.size.is_some_and(|s| s != 8)) {
        bail!("Message size cannot be changed for Atomic tests");
    }
    if matches!(verb, Verb::Read | Verb::Atomic) && a.inline > 0 {
        bail!("Inline is not supported for READ and atomic tests");
    }
    if a.inline > uroce::limits::MAX_INLINE {
        bail!("inline size {} exceeds the device's {}", a.inline, uroce::limits::MAX_INLINE);
    }
    if a.output == Some(Output::latency) && t.is_bw()
        || a.output.is_some_and(|o| o != Output::latency) && !t.is_bw()
    {
        bail!("--output must be bandwidth or message_rate for bw tests, latency for lat tests");
    }
    let iters = a.iters.unwrap_or(if t == Test::WriteBw { 5000 } else { 1000 });
    if !(5..=100_000_000).contains(&iters) {
        bail!("iterations must be between 5 and 100000000");
    }
    let size =
        if verb == Verb::Atomic { 8 } else { a.size.unwrap_or(if t.is_bw() { 65536 } else { 2 }) };
    let sizes: Vec<usize> =
        if a.all { (1..=23).map(|i| 1usize << i).collect() } else { vec![size] };
    let quiet = a.output.is_some();

    let ctx = common::open_device(a.dev.as_deref())?;
    let query = || {
        ctx.query_port(a.ib_port)
            .map_err(|_| anyhow!("port {} does not exist (ports: 1)", a.ib_port))
    };
    let mut port = query()?;
    // A link may come up a moment after the device opens (a DPDK memif
    // port waits for its peer, a NIC for its autonegotiation).
    let waited = std::time::Instant::now();
    while !port.active && waited.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(50));
        port = query()?;
    }
    if !port.active {
        bail!("port {} of {} is down", a.ib_port, ctx.device().name());
    }
    let gid = common::local_gid(&ctx, a.ib_port, a.gid_index)?;
    let mut mtu = match a.mtu {
        Some(m) => common::parse_mtu(m)?,
        None => port.active_mtu,
    };
    if mtu > port.active_mtu {
        mtu = port.active_mtu;
    }

    // Connection and the opening exchange.
    let client = a.server.is_some();
    if !client && !quiet {
        println!(
            "\n************************************\n* Waiting for client to connect... *\n************************************"
        );
    }
    let link = match (&a.server, a.rdma_cm) {
        (Some(h), false) => Link::Tcp(common::connect(h, a.port)?),
        (None, false) => Link::Tcp(common::accept(&common::listen(a.port)?)?),
        (Some(h), true) => Link::Cm(Box::new(CmLink::open(&ctx, Some(ipv4_of(h)?), None, a.port)?)),
        (None, true) => {
            let l = ctx.cm_listen(a.port).context("rdma_cm: listening")?;
            // perftest's server drops its listener once the channel is up.
            Link::Cm(Box::new(CmLink::open(&ctx, None, Some(&l), a.port)?))
        }
    };
    let mut oob = Oob { link, client };
    let mut v = [0u8; 16];
    let mut mine = [0u8; 16];
    mine[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    oob.xchg(&mine, &mut v)?;
    let rem_version: f64 =
        std::str::from_utf8(&v).unwrap_or("").trim_end_matches('\0').parse().unwrap_or(0.0);
    if rem_version < 5.70 {
        bail!(
            "Current implementation is not compatible with versions older than 5.70 (peer: {rem_version})"
        );
    }
    let mut b4 = [0u8; 4];
    oob.xchg(&CYCLE_BUFFER.to_be_bytes(), &mut b4)?;
    let cycle = CYCLE_BUFFER.max(u32::from_be_bytes(b4)) as usize;
    oob.xchg(&CACHE_LINE.to_be_bytes(), &mut b4)?;
    let cache_line = CACHE_LINE.max(u32::from_be_bytes(b4)).max(1) as usize;
    let mut b2 = [0u8; 2];
    let code = mtu.to_ibv();
    oob.xchg(&[b'0' + code as u8, 0], &mut b2)?;
    if let Some(r) = Mtu::from_ibv(u32::from(b2[0].wrapping_sub(b'0')))
        && r < mtu
    {
        mtu = r;
    }

    let tx_depth =
        a.tx_depth.unwrap_or(if t.is_bw() { 128 } else { 1 }).clamp(1, iters.min(15_000) as u32);
    let cq_mod = if size > 8192 && !a.all { 1 } else { 100u32.min(tx_depth) };
    let out_reads = if matches!(verb, Verb::Read | Verb::Atomic) {
        ctx.query_device().max_qp_rd_atom as u16
    } else {
        1
    };
    let alloc = if a.all { MAX_SIZE } else { size };
    let buff = alloc.max(cycle);
    let su = Setup {
        test: t,
        client,
        rdma_cm: a.rdma_cm,
        qps: a.qps as usize,
        sizes,
        iters,
        tx_depth,
        cq_mod,
        mtu,
        gid_index: a.gid_index.unwrap_or(0) as u32,
        out_reads,
        buff,
        cycle,
        cache_line,
    };
    let res = setup(ctx, &su, a)?;
    if a.rdma_cm {
        connect_through_cm(&res, &mut oob, a)?;
    }
    let me: Vec<Dest> = res
        .qps
        .iter()
        .enumerate()
        .map(|(i, q)| Dest {
            lid: 0,
            out_reads,
            qpn: q.qpn(),
            psn: common::random_psn(q.qpn()),
            rkey: res.mr.rkey(),
            vaddr: res.mr.addr() + ((su.qps + i) * inc(buff, cache_line)) as u64,
            gid,
            srqn: 0,
        })
        .collect();
    if !quiet {
        print_info(&su, a, &res);
    }
    match verb {
        Verb::Send if t.is_bw() => send_bw(&su, a, &res, &mut oob, &me),
        Verb::Send => send_lat(&su, a, &res, &mut oob, &me),
        _ if t.is_bw() => rdma_bw(&su, a, &res, &mut oob, &me),
        _ => rdma_lat(&su, a, &res, &mut oob, &me),
    }?;
    if let Link::Cm(c) = &mut oob.link {
        // The test connections end (a DREQ each, answered: a perftest
        // client waits for every one); the channel ends with the process.
        for conn in c.tests.drain(..) {
            let _ = conn.disconnect(Duration::from_secs(2));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The server's IPv4 address (perftest's rdma_cm mode is IPv4 only).
fn ipv4_of(host: &str) -> Result<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    (host, 0)
        .to_socket_addrs()
        .with_context(|| format!("Couldn't resolve {host}"))?
        .map(|a| a.ip())
        .find(std::net::IpAddr::is_ipv4)
        .ok_or_else(|| anyhow!("{host} has no IPv4 address (rdma_cm mode is IPv4 only)"))
}

/// perftest's -R connection of the test QPs: a handshake of empty
/// records, one rdma_cm connection per QP on the same port (the server
/// listens before it answers that handshake, so no request finds the
/// port closed), another handshake of empty records.
fn connect_through_cm(res: &Res, oob: &mut Oob, a: &Args) -> Result<()> {
    let listener = if oob.client {
        None
    } else {
        Some(res.ctx.cm_listen(a.port).context("rdma_cm: listening for the test QPs")?)
    };
    oob.hs(&Dest::default())?;
    let server = a.server.as_deref().map(ipv4_of).transpose()?;
    let mut conns = Vec::new();
    for qp in &res.qps {
        let conn = match (server, &listener) {
            (Some(ip), _) => oob::connect_retrying(&res.ctx, qp, ip, a.port)?,
            (None, Some(l)) => {
                l.accept(qp, &[], oob::FOREVER).context("rdma_cm: accepting a test QP")?
            }
            (None, None) => unreachable!("a server listens"),
        };
        conns.push(conn);
    }
    drop(listener);
    oob.hs(&Dest::default())?;
    if let Link::Cm(c) = &mut oob.link {
        c.tests = conns;
    }
    Ok(())
}

fn access(verb: Verb) -> Access {
    match verb {
        Verb::Write => Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        Verb::Read => Access::LOCAL_WRITE | Access::REMOTE_READ,
        Verb::Atomic => Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
        Verb::Send => Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    }
}

/// The MR (each QP's send region, then each QP's advertised region), the
/// CQ and the QPs in INIT.
fn setup(ctx: uroce::Context, su: &Setup, a: &Args) -> Result<Res> {
    let verb = su.test.verb();
    let pd = ctx.alloc_pd().context("Couldn't allocate PD")?;
    let len = inc(su.buff, su.cache_line) * 2 * su.qps;
    let mr = pd.alloc_mr(len, access(verb)).context("Couldn't allocate MR")?;
    if su.test != Test::WriteLat {
        // perftest fills its buffer with rand(); any non-constant bytes do.
        let mut x = 0x2545_f491_u32 ^ std::process::id();
        let fill: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        mr.write(0, &fill)?;
    }
    let n = u32::try_from(su.qps).unwrap_or(u32::MAX);
    let cqe = (su.tx_depth + RX_DEPTH) * n + 16;
    let cq = ctx.create_cq(cqe).context("Couldn't create CQ")?;
    let mut qps = Vec::new();
    for _ in 0..su.qps {
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCaps {
                    max_send_wr: su.tx_depth.max(2),
                    max_recv_wr: if verb == Verb::Send { RX_DEPTH } else { 1 },
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: a.inline,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
                srq: None,
            })
            .context("Couldn't create QP")?;
        oob::init_qp(&qp, access(verb), a.ib_port)?;
        qps.push(qp);
    }
    Ok(Res { ctx, _pd: pd, mr, cq, qps })
}

/// RTR (and RTS unless this is a bw server) towards the peer's records
/// (with -R the CM did it).
fn connect(su: &Setup, res: &Res, me: &[Dest], rem: &[Dest]) -> Result<()> {
    if rem.len() != res.qps.len() {
        bail!("the peer has {} QPs, this side {} (use the same -q)", rem.len(), res.qps.len());
    }
    if su.rdma_cm {
        return Ok(());
    }
    let own = common::gid_str(me[0].gid).contains('.');
    if own != common::gid_str(rem[0].gid).contains('.') {
        bail!("Found Incompatibility issue with GID types.");
    }
    let rts = !su.test.is_bw() || su.client;
    for ((qp, m), r) in res.qps.iter().zip(me).zip(rem) {
        let attr = QpAttr {
            state: QpState::ReadyToReceive,
            path: Some(Path {
                dst: common::ip_of_gid(r.gid)?,
                dst_port: res.ctx.device().socket_addr().port(),
                sgid_index: su.gid_index as u8,
                flow_label: 0,
                hop_limit: 0xff,
                traffic_class: 0,
            }),
            path_mtu: su.mtu,
            dest_qpn: r.qpn,
            rq_psn: Psn::new(r.psn),
            max_dest_rd_atomic: m.out_reads as u8,
            min_rnr_timer: RnrTimer::from_code(12),
            sq_psn: Psn::new(m.psn),
            timeout: uroce::LocalAckTimeout::saturating(14),
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: (r.out_reads as u8).clamp(1, su.out_reads.max(1) as u8),
            ..QpAttr::default()
        };
        qp.modify(&attr, common::rc_rtr_mask()).context("Failed to modify QP to RTR")?;
        if rts {
            qp.modify(&QpAttr { state: QpState::ReadyToSend, ..attr }, common::rc_rts_mask())
                .context("Failed to modify QP to RTS")?;
        }
    }
    Ok(())
}

/// The record exchanges every test starts with: `n` handshakes per QP (the
/// second round's records are the ones printed), connecting in between.
fn exchange(su: &Setup, res: &Res, oob: &mut Oob, me: &[Dest], quiet: bool) -> Result<Vec<Dest>> {
    let verb = su.test.verb();
    let mut rem = Vec::new();
    for d in me {
        rem.push(oob.hs(d)?);
    }
    connect(su, res, me, &rem)?;
    if verb == Verb::Send {
        oob.hs(&me[0])?;
    }
    if !quiet {
        for d in me {
            print_dest("local", d, verb);
        }
    }
    let mut rem2 = Vec::new();
    for d in me {
        rem2.push(oob.hs(d)?);
    }
    if !quiet {
        for d in &rem2 {
            print_dest("remote", d, verb);
        }
    }
    Ok(rem2)
}

fn wr_for<'s>(
    su: &Setup,
    a: &Args,
    sge: &'s [uroce::Sge],
    r: &Dest,
    off: u64,
    wr_id: u64,
) -> SendWr<'s> {
    let (opcode, remote_addr, compare_add) = match su.test.verb() {
        Verb::Send => (WrOpcode::Send, 0, 0),
        Verb::Write => (WrOpcode::RdmaWrite, r.vaddr + off, 0),
        Verb::Read => (WrOpcode::RdmaRead, r.vaddr + off, 0),
        Verb::Atomic => match a.atomic_type {
            AtomicType::FETCH_AND_ADD => (WrOpcode::AtomicFetchAndAdd, r.vaddr + off, 1),
            AtomicType::CMP_AND_SWAP => (WrOpcode::AtomicCmpAndSwp, r.vaddr + off, 0),
        },
    };
    let inline = a.inline > 0 && sge.iter().map(|s| s.length).sum::<u32>() <= a.inline;
    SendWr {
        wr_id,
        opcode,
        flags: if inline { SendFlags::INLINE } else { SendFlags::NONE },
        sgl: sge,
        remote_addr,
        rkey: r.rkey,
        compare_add,
        swap: 0,
        ..SendWr::default()
    }
}

/// The cycling offset of post `k` (perftest spreads small messages over
/// cache-line slots of one page).
fn slot_off(su: &Setup, size: usize, k: u64) -> u64 {
    if size <= su.cycle / 2 {
        let slot = inc(size, su.cache_line);
        k % (su.cycle / slot) as u64 * slot as u64
    } else {
        0
    }
}

fn check(wcs: &[Completion]) -> Result<()> {
    if let Some(w) = wcs.iter().find(|w| w.status != uroce::WcStatus::Success) {
        bail!(
            "Completion with error at {} (wr_id {:#x}): {} ({})",
            if w.is_recv { "server" } else { "client" },
            w.wr_id,
            w.status.as_str(),
            w.status as u32
        );
    }
    Ok(())
}

const STALL: Duration = Duration::from_secs(10);

/// Posts `n` receives on QP `i`, each over its advertised region.
fn post_recvs(res: &Res, su: &Setup, i: usize, n: u64) -> Result<()> {
    let stride = inc(su.buff, su.cache_line);
    let sge = [res.mr.sge((su.qps + i) * stride, su.buff as u32)?];
    let wrs = vec![RecvWr { wr_id: (i as u64) << 48, sgl: &sge }; n as usize];
    res.qps[i].post_recv(&wrs).context("Couldn't post receive")
}
