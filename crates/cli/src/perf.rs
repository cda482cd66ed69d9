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
    /// TCP port of the exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
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
    let (num, mul) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1024),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    let v: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let v = v.checked_mul(mul).ok_or("size too large")?;
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

/// One QP's key record (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, Default)]
struct Dest {
    lid: u16,
    out_reads: u16,
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
    gid: [u8; 16],
    srqn: u32,
}

impl Dest {
    fn encode(&self) -> [u8; KEY_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid {
            let _ = write!(s, "{b:02x}:");
        }
        let _ = write!(s, "{:08x}:", self.srqn);
        let mut m = [0u8; KEY_LEN];
        let n = s.len().min(KEY_LEN - 1);
        m[..n].copy_from_slice(&s.as_bytes()[..n]);
        m
    }

    fn decode(m: &[u8]) -> Result<Self> {
        let text = std::str::from_utf8(m).unwrap_or("").trim_end_matches('\0');
        let f: Vec<&str> = text.split(':').collect();
        let bad = || {
            anyhow!(
                "Couldn't parse the peer's key record {text:?} (is it a perftest of the same test?)"
            )
        };
        if f.len() < 23 {
            return Err(bad());
        }
        let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = hex(f[6 + i])? as u8;
        }
        Ok(Self {
            lid: hex(f[0])? as u16,
            out_reads: hex(f[1])? as u16,
            qpn: hex(f[2])? as u32,
            psn: hex(f[3])? as u32,
            rkey: hex(f[4])? as u32,
            vaddr: hex(f[5])?,
            gid,
            srqn: hex(f[22])? as u32,
        })
    }
}

/// The TCP side channel: the client writes first, the server reads first,
/// one write per message.
struct Oob {
    s: TcpStream,
    client: bool,
}

impl Oob {
    fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<()> {
        if self.client {
            common::write_record(&mut self.s, mine)?;
            common::read_record(&mut self.s, theirs)
        } else {
            common::read_record(&mut self.s, theirs)?;
            common::write_record(&mut self.s, mine)
        }
    }

    /// One key-record handshake (`ctx_hand_shake`).
    fn hs(&mut self, me: &Dest) -> Result<Dest> {
        let mut buf = [0u8; KEY_LEN];
        self.xchg(&me.encode(), &mut buf)?;
        Dest::decode(&buf)
    }

    /// Waits as long as the peer's traffic takes (no timeout; a dead peer
    /// closes the socket).
    fn untimed(&self, on: bool) -> Result<()> {
        let t = if on { None } else { Some(common::OOB_TIMEOUT) };
        self.s.set_read_timeout(t)?;
        Ok(())
    }

    /// `ctx_close_connection`: a handshake, then "done\0" (never read).
    fn close(&mut self, me: &Dest) -> Result<()> {
        self.untimed(true)?;
        self.hs(me)?;
        let _ = std::io::Write::write_all(&mut self.s, b"done\0");
        Ok(())
    }
}

struct Setup {
    test: Test,
    client: bool,
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
    if a.duration.is_some() && !t.is_bw() {
        bail!("-D is supported on the bw tests only (for now)");
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
    let port = ctx
        .query_port(a.ib_port)
        .map_err(|_| anyhow!("port {} does not exist (ports: 1)", a.ib_port))?;
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
    let stream = match &a.server {
        Some(h) => common::connect(h, a.port)?,
        None => {
            if !quiet {
                println!(
                    "\n************************************\n* Waiting for client to connect... *\n************************************"
                );
            }
            let l = common::listen(a.port)?;
            common::accept(&l)?
        }
    };
    let mut oob = Oob { s: stream, client };
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
    let me: Vec<Dest> = res
        .qps
        .iter()
        .enumerate()
        .map(|(i, q)| Dest {
            lid: 0,
            out_reads,
            qpn: q.qpn(),
            psn: psn(q.qpn()),
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
    Ok(ExitCode::SUCCESS)
}

/// perftest draws PSNs with `lrand48`; any 24-bit value does.
fn psn(salt: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (t ^ salt.wrapping_mul(2_654_435_761) ^ std::process::id().rotate_left(11)) & 0xff_ffff
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
        let attr = QpAttr {
            state: QpState::Init,
            access: access(verb),
            port: a.ib_port,
            ..QpAttr::default()
        };
        qp.modify(
            &attr,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )
        .context("Failed to modify QP to INIT")?;
        qps.push(qp);
    }
    Ok(Res { ctx, _pd: pd, mr, cq, qps })
}

/// RTR (and RTS unless this is a bw server) towards the peer's records.
fn connect(su: &Setup, res: &Res, me: &[Dest], rem: &[Dest]) -> Result<()> {
    if rem.len() != res.qps.len() {
        bail!("the peer has {} QPs, this side {} (use the same -q)", rem.len(), res.qps.len());
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
        qp.modify(
            &attr,
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER,
        )
        .context("Failed to modify QP to RTR")?;
        if rts {
            qp.modify(
                &QpAttr { state: QpState::ReadyToSend, ..attr },
                AttrMask::STATE
                    | AttrMask::TIMEOUT
                    | AttrMask::RETRY_CNT
                    | AttrMask::RNR_RETRY
                    | AttrMask::SQ_PSN
                    | AttrMask::MAX_QP_RD_ATOMIC,
            )
            .context("Failed to modify QP to RTS")?;
        }
    }
    Ok(())
}

fn verb_name(su: &Setup, a: &Args) -> String {
    match su.test.verb() {
        Verb::Send => "Send".into(),
        Verb::Write => "RDMA_Write".into(),
        Verb::Read => "RDMA_Read".into(),
        Verb::Atomic => format!("Atomic {:?}", a.atomic_type),
    }
}

fn print_info(su: &Setup, a: &Args, res: &Res) {
    let verb = su.test.verb();
    println!("{RESULT_LINE}");
    println!(
        "                    {} {}Test",
        verb_name(su, a),
        if su.test.is_bw() { "BW " } else { "Latency " }
    );
    println!(" Dual-port       : OFF\t\tDevice         : {}", res.ctx.device().name());
    println!(" Number of qps   : {}\t\tTransport type : IB", su.qps);
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    println!(" PCIe relax order: {}", if su.test == Test::WriteLat { "OFF" } else { "ON" });
    println!(" ibv_wr* API     : ON");
    if su.client {
        println!(" TX depth        : {}", su.tx_depth);
    }
    if verb == Verb::Send && !su.client {
        println!(" RX depth        : {}", RX_DEPTH.min(su.iters as u32));
    }
    if su.test.is_bw() {
        println!(" CQ Moderation   : {}", su.cq_mod);
    }
    println!(" Mtu             : {}[B]", su.mtu.bytes());
    println!(" Link type       : Ethernet");
    println!(" GID index       : {}", su.gid_index);
    if matches!(verb, Verb::Read | Verb::Atomic) {
        println!(" Outstand reads  : {}", su.out_reads);
    } else {
        println!(" Max inline data : {}[B]", a.inline);
    }
    println!(" rdma_cm QPs\t : OFF");
    println!(" Data ex. method : Ethernet");
    println!("{RESULT_LINE}");
}

fn print_dest(who: &str, d: &Dest, verb: Verb) {
    let hx = |v: u64, w: usize| {
        if v == 0 { format!("{:0w$}", 0) } else { format!("{:#0w$x}", v, w = w) }
    };
    let mut l = format!(
        " {who} address: LID {} QPN {} PSN {}",
        hx(u64::from(d.lid), 4),
        hx(u64::from(d.qpn), 6),
        hx(u64::from(d.psn), 6)
    );
    if verb == Verb::Read {
        let _ = write!(l, " OUT {}", hx(u64::from(d.out_reads), 4));
    }
    if matches!(verb, Verb::Read | Verb::Write) {
        let _ = write!(l, " RKey {} VAddr {}", hx(u64::from(d.rkey), 8), hx(d.vaddr, 16));
    }
    println!("{l}");
    let g: Vec<String> = d.gid.iter().map(|b| format!("{b:02}")).collect();
    println!(" GID: {}", g.join(":"));
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

/// One bandwidth row, in the units it is printed in.
#[derive(Debug, Clone, Copy, Default)]
struct BwRep {
    size: u64,
    iters: u64,
    peak: f64,
    avg: f64,
    rate: f64,
}

fn bw_header(a: &Args) {
    if a.output.is_some() {
        return;
    }
    let unit = if a.report_gbits { "Gb/sec" } else { "MB/sec" };
    println!("{RESULT_LINE}");
    println!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
}

fn bw_row(a: &Args, r: &BwRep) {
    match a.output {
        Some(Output::bandwidth) => println!("{:.6}", r.avg),
        Some(Output::message_rate) => println!("{:.6}", r.rate),
        Some(Output::latency) => {}
        None if a.report_gbits && r.avg < 0.1 => println!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            r.size, r.iters, r.peak, r.avg, r.rate
        ),
        None => println!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            r.size, r.iters, r.peak, r.avg, r.rate
        ),
    }
}

/// Bytes per second to the printed unit (MiB/s, or 10^9 bit/s).
fn unit(a: &Args, bytes_per_sec: f64) -> f64 {
    bytes_per_sec / if a.report_gbits { 125_000_000.0 } else { 1_048_576.0 }
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

/// The requester's bandwidth run over every QP.
fn bw_client(su: &Setup, a: &Args, res: &Res, rem: &[Dest], size: usize) -> Result<BwRep> {
    let n = res.qps.len();
    let stride = inc(su.buff, su.cache_line);
    let duration = a.duration.map(Duration::from_secs);
    let iters = if duration.is_some() { u64::MAX } else { su.iters };
    let no_peak = duration.is_some() || su.iters > 20_000;
    let cq_mod = u64::from(su.cq_mod);
    let depth = u64::from(su.tx_depth);
    let (mut posted, mut done) = (vec![0u64; n], vec![0u64; n]);
    let mut tposted: Vec<Instant> =
        Vec::with_capacity(if no_peak { 1 } else { (su.iters as usize) * n });
    let mut tcompleted: Vec<(u64, Instant)> = Vec::new();
    let mut wc = common::wc_array::<64>();
    let start = Instant::now();
    let margin = duration.map(|d| d / 4);
    let (mut win_start, mut win_count, mut win_end) = (None, 0u64, None);
    let mut total_done = 0u64;
    let mut last_progress = Instant::now();
    loop {
        let stop_posting = duration.is_some_and(|d| start.elapsed() >= d);
        let mut all_posted = true;
        for (i, qp) in res.qps.iter().enumerate() {
            // Stopping (-D): finish the current signaled batch.
            let target = if stop_posting { posted[i].div_ceil(cq_mod) * cq_mod } else { iters };
            while posted[i] < target && posted[i] - done[i] < depth {
                let k = posted[i];
                let off = slot_off(su, size, k);
                let sge = [res.mr.sge(i * stride + off as usize, size as u32)?];
                let mut w = wr_for(su, a, &sge, &rem[i], off, (i as u64) << 48 | k);
                if (k + 1) % cq_mod == 0 || k + 1 == iters {
                    w.flags = w.flags | SendFlags::SIGNALED;
                }
                if !no_peak || tposted.is_empty() {
                    tposted.push(Instant::now());
                }
                qp.post_send(&[w]).context("Couldn't post send")?;
                posted[i] += 1;
            }
            all_posted &= posted[i] >= target;
        }
        if all_posted && posted == done {
            break;
        }
        let got = res.cq.poll(&mut wc)?;
        check(&wc[..got])?;
        if got == 0 {
            if last_progress.elapsed() > STALL {
                bail!("no completion within {STALL:?}: the peer stopped or packets are lost");
            }
            continue;
        }
        last_progress = Instant::now();
        for w in &wc[..got] {
            let qi = (w.wr_id >> 48) as usize;
            let k = w.wr_id & 0xffff_ffff_ffff;
            let newly = k + 1 - done[qi];
            done[qi] = k + 1;
            total_done += newly;
            let now = Instant::now();
            if !no_peak {
                tcompleted.push((total_done, now));
            }
            if let (Some(m), Some(d)) = (margin, duration) {
                let t = now.duration_since(start);
                if t >= m && win_start.is_none() {
                    win_start = Some(now);
                    win_count = 0;
                }
                if win_start.is_some() && win_end.is_none() {
                    win_count += newly;
                    if t >= d - m {
                        win_end = Some(now);
                    }
                }
            }
        }
    }
    let end = Instant::now();
    let (iters_tot, secs) = match (win_start, win_end) {
        (Some(s), Some(e)) => (win_count, e.duration_since(s).as_secs_f64()),
        _ => (total_done, end.duration_since(start).as_secs_f64()),
    };
    let avg_bps = size as f64 * iters_tot as f64 / secs;
    let peak_bps = if no_peak { 0.0 } else { peak(&tposted, &tcompleted, size, su.cq_mod) };
    Ok(BwRep {
        size: size as u64,
        iters: iters_tot,
        peak: unit(a, peak_bps),
        avg: unit(a, avg_bps),
        rate: iters_tot as f64 / secs / 1e6,
    })
}

/// perftest's BW peak: the best per-message time over any run of messages
/// from a post to a later completion point.
fn peak(tposted: &[Instant], tcompleted: &[(u64, Instant)], size: usize, cq_mod: u32) -> f64 {
    let mut best = f64::MAX;
    for (i, tp) in tposted.iter().enumerate() {
        for &(through, tc) in tcompleted {
            let j = through as usize;
            if j <= i || (j - i) < cq_mod as usize {
                continue;
            }
            let dt = tc.saturating_duration_since(*tp).as_secs_f64() / (j - i) as f64;
            if dt > 0.0 {
                best = best.min(dt);
            }
        }
    }
    if best == f64::MAX { 0.0 } else { size as f64 / best }
}

/// The 5-value report exchange (`xchg_bw_reports`), big-endian.
fn xchg_reports(oob: &mut Oob, mine: &BwRep) -> Result<BwRep> {
    let mut b = [0u8; 8];
    oob.xchg(&mine.size.to_be_bytes(), &mut b)?;
    let size = u64::from_be_bytes(b);
    oob.xchg(&mine.iters.to_be_bytes(), &mut b)?;
    let iters = u64::from_be_bytes(b);
    let mut f = [0f64; 3];
    for (i, v) in [mine.peak, mine.avg, mine.rate].into_iter().enumerate() {
        oob.xchg(&v.to_bits().to_be_bytes(), &mut b)?;
        f[i] = f64::from_bits(u64::from_be_bytes(b));
    }
    Ok(BwRep { size, iters, peak: f[0], avg: f[1], rate: f[2] })
}

/// ib_write_bw / ib_read_bw / ib_atomic_bw.
fn rdma_bw(su: &Setup, a: &Args, res: &Res, oob: &mut Oob, me: &[Dest]) -> Result<()> {
    let quiet = a.output.is_some();
    let rem = exchange(su, res, oob, me, quiet)?;
    oob.hs(&me[0])?;
    bw_header(a);
    if su.client {
        let mut last = BwRep::default();
        for &size in &su.sizes {
            last = bw_client(su, a, res, &rem, size)?;
            bw_row(a, &last);
        }
        if !quiet {
            println!("{RESULT_LINE}");
        }
        oob.hs(&me[0])?;
        xchg_reports(oob, &last)?;
        oob.close(&me[0])?;
    } else {
        // Passive: the progress thread serves the peer's operations.
        oob.untimed(true)?;
        oob.hs(&me[0])?;
        let theirs = xchg_reports(oob, &BwRep::default())?;
        bw_row(a, &theirs);
        oob.close(&me[0])?;
        if !quiet {
            println!("{RESULT_LINE}");
        }
    }
    Ok(())
}

/// Posts `n` receives on QP `i`, each over its advertised region.
fn post_recvs(res: &Res, su: &Setup, i: usize, n: u64) -> Result<()> {
    let stride = inc(su.buff, su.cache_line);
    let sge = [res.mr.sge((su.qps + i) * stride, su.buff as u32)?];
    let wrs = vec![RecvWr { wr_id: (i as u64) << 48, sgl: &sge }; n as usize];
    res.qps[i].post_recv(&wrs).context("Couldn't post receive")
}

/// ib_send_bw.
fn send_bw(su: &Setup, a: &Args, res: &Res, oob: &mut Oob, me: &[Dest]) -> Result<()> {
    let quiet = a.output.is_some();
    let rem = exchange(su, res, oob, me, quiet)?;
    bw_header(a);
    let rx = u64::from(RX_DEPTH).min(su.iters);
    for &size in &su.sizes {
        if !su.client {
            for i in 0..res.qps.len() {
                post_recvs(res, su, i, rx)?;
            }
        }
        oob.hs(&me[0])?;
        let rep = if su.client {
            bw_client(su, a, res, &rem, size)?
        } else {
            send_server(su, a, res, size, rx)?
        };
        bw_row(a, &rep);
        if a.all {
            oob.hs(&me[0])?;
        }
    }
    if !quiet {
        println!("{RESULT_LINE}");
    }
    oob.close(&me[0])
}

/// The receiving side of ib_send_bw: exactly `iters` messages per QP,
/// timed from the first arrival to the last.
fn send_server(su: &Setup, a: &Args, res: &Res, size: usize, rx: u64) -> Result<BwRep> {
    let n = res.qps.len();
    let want = su.iters * n as u64;
    let mut posted = vec![rx; n];
    let (mut got, mut first) = (0u64, None);
    let mut wc = common::wc_array::<64>();
    let mut last = Instant::now();
    while got < want {
        let k = res.cq.poll(&mut wc)?;
        check(&wc[..k])?;
        if k == 0 {
            if last.elapsed() > STALL {
                bail!("Did not get Message for {STALL:?} ({got} of {want} arrived)");
            }
            continue;
        }
        last = Instant::now();
        first.get_or_insert(last);
        for w in wc[..k].iter().filter(|w| w.is_recv) {
            if w.byte_len as usize != size {
                bail!(
                    "a message of {} bytes arrived, {size} expected (use the same -s on both sides)",
                    w.byte_len
                );
            }
            got += 1;
            let qi = (w.wr_id >> 48) as usize;
            if posted[qi] < su.iters {
                post_recvs(res, su, qi, 1)?;
                posted[qi] += 1;
            }
        }
    }
    let secs = first.map_or(1e-9, |f| f.elapsed().as_secs_f64().max(1e-9));
    Ok(BwRep {
        size: size as u64,
        iters: want,
        peak: 0.0,
        avg: unit(a, size as f64 * want as f64 / secs),
        rate: want as f64 / secs / 1e6,
    })
}

/// perftest's latency statistics over `tposted` stamps: `iters - 1`
/// deltas divided by `rtt_factor`, the two largest dropped, the deviation
/// truncated to whole microseconds before squaring (as perftest does).
#[derive(Debug, Clone, Copy, Default)]
struct LatRep {
    size: u64,
    iters: u64,
    min: f64,
    max: f64,
    typical: f64,
    avg: f64,
    stdev: f64,
    p99: f64,
    p999: f64,
}

fn lat_stats(size: usize, tposted: &[Instant], rtt_factor: f64) -> LatRep {
    let mut d: Vec<f64> = tposted
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1e6 / rtt_factor)
        .collect();
    d.sort_by(f64::total_cmp);
    let iters = tposted.len() as u64;
    if d.len() < 3 {
        return LatRep { size: size as u64, iters, ..LatRep::default() };
    }
    let m = d.len() - 2;
    let typical = if m.is_multiple_of(2) { (d[m / 2] + d[m / 2 - 1]) / 2.0 } else { d[m / 2] };
    let avg = d[..m].iter().sum::<f64>() / m as f64;
    let var = d[..m].iter().map(|x| f64::from((avg - x) as i32).powi(2)).sum::<f64>() / m as f64;
    let at = |p: f64| d[((m as f64 * p).ceil() as usize).min(d.len() - 1)];
    LatRep {
        size: size as u64,
        iters,
        min: d[0],
        max: d[m],
        typical,
        avg,
        stdev: var.sqrt(),
        p99: at(0.99),
        p999: at(0.999),
    }
}

fn lat_header(a: &Args) {
    if a.output.is_some() {
        return;
    }
    println!("{RESULT_LINE}");
    println!(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
    );
}

fn lat_row(a: &Args, r: &LatRep) {
    if a.output == Some(Output::latency) {
        println!("{:.6}", r.avg);
        return;
    }
    println!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        r.size, r.iters, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999
    );
}

/// Spins until the byte at `off` equals `want`, driving progress.
fn await_byte(res: &Res, off: usize, want: u8) -> Result<()> {
    let start = Instant::now();
    let mut b = [0u8];
    let mut wc = common::wc_array::<4>();
    loop {
        let n = res.cq.poll(&mut wc)?;
        check(&wc[..n])?;
        res.mr.read(off, &mut b)?;
        if b[0] == want {
            return Ok(());
        }
        if start.elapsed() > STALL {
            bail!("no message from the peer within {STALL:?}: it stopped or packets are lost");
        }
    }
}

/// Completions taken off the CQ, sorted by kind, so that waiting for a
/// send completion never loses a receive that came first.
#[derive(Default)]
struct Poller {
    recvs: std::collections::VecDeque<Completion>,
    sends: u64,
}

impl Poller {
    /// The next completion of the wanted kind (send or receive).
    fn next(&mut self, res: &Res, recv: bool) -> Result<Completion> {
        let start = Instant::now();
        let mut wc = common::wc_array::<8>();
        loop {
            if recv && let Some(w) = self.recvs.pop_front() {
                return Ok(w);
            }
            if !recv && self.sends > 0 {
                self.sends -= 1;
                return Ok(Completion::new(
                    0,
                    uroce::WcStatus::Success,
                    uroce::WcOpcode::Send,
                    0,
                    false,
                ));
            }
            let n = res.cq.poll(&mut wc)?;
            check(&wc[..n])?;
            for w in &wc[..n] {
                if w.is_recv {
                    self.recvs.push_back(*w);
                } else {
                    self.sends += 1;
                }
            }
            if n == 0 && start.elapsed() > STALL {
                bail!("no completion within {STALL:?}: the peer stopped or packets are lost");
            }
        }
    }
}

/// ib_write_lat / ib_read_lat / ib_atomic_lat.
fn rdma_lat(su: &Setup, a: &Args, res: &Res, oob: &mut Oob, me: &[Dest]) -> Result<()> {
    let quiet = a.output.is_some();
    let verb = su.test.verb();
    oob.hs(&me[0])?;
    let rem = exchange(su, res, oob, me, quiet)?;
    oob.hs(&me[0])?;
    let r = &rem[0];
    let recv_off = su.qps * inc(su.buff, su.cache_line);
    if verb != Verb::Write && !su.client {
        // The target of READs and atomics only serves.
        oob.close(&me[0])?;
        if !quiet {
            println!("{RESULT_LINE}");
        }
        return Ok(());
    }
    lat_header(a);
    let iters = su.iters;
    let mut poller = Poller::default();
    for &size in &su.sizes {
        let mut tposted = Vec::with_capacity(iters as usize);
        let sge = [res.mr.sge(0, size as u32)?];
        if verb == Verb::Write {
            // Ping-pong; the server writes first. The last byte carries
            // the sequence number.
            let (mut scnt, mut rcnt) = (0u64, 0u64);
            while scnt < iters || rcnt < iters {
                // The server writes first.
                if rcnt < iters && (su.client || scnt >= 1) {
                    rcnt += 1;
                    await_byte(res, recv_off + size - 1, rcnt as u8)?;
                }
                if scnt < iters {
                    scnt += 1;
                    tposted.push(Instant::now());
                    res.mr.write(size - 1, &[scnt as u8])?;
                    let mut w = wr_for(su, a, &sge, r, 0, scnt);
                    w.flags = w.flags | SendFlags::SIGNALED;
                    res.qps[0].post_send(&[w]).context("Couldn't post send")?;
                    poller.next(res, false)?;
                }
            }
            lat_row(a, &lat_stats(size, &tposted, 2.0));
        } else {
            for k in 0..iters {
                let mut w = wr_for(su, a, &sge, r, 0, k);
                w.flags = SendFlags::SIGNALED;
                tposted.push(Instant::now());
                res.qps[0].post_send(&[w]).context("Couldn't post send")?;
                poller.next(res, false)?;
            }
            lat_row(a, &lat_stats(size, &tposted, 1.0));
        }
    }
    if !quiet {
        println!("{RESULT_LINE}");
    }
    if verb != Verb::Write {
        oob.close(&me[0])?;
    }
    Ok(())
}

/// ib_send_lat: SEND ping-pong, the client first.
fn send_lat(su: &Setup, a: &Args, res: &Res, oob: &mut Oob, me: &[Dest]) -> Result<()> {
    let quiet = a.output.is_some();
    let rem = exchange(su, res, oob, me, quiet)?;
    let r = &rem[0];
    lat_header(a);
    let iters = su.iters;
    let rx = u64::from(RX_DEPTH).min(iters);
    let mut poller = Poller::default();
    for &size in &su.sizes {
        post_recvs(res, su, 0, rx)?;
        let mut posted = rx;
        oob.hs(&me[0])?;
        let sge = [res.mr.sge(0, size as u32)?];
        let mut tposted = Vec::with_capacity(iters as usize);
        let (mut scnt, mut rcnt) = (0u64, 0u64);
        while scnt < iters || rcnt < iters {
            // The client sends first.
            if rcnt < iters && (!su.client || scnt >= 1) {
                let w = poller.next(res, true)?;
                if w.byte_len as usize != size {
                    bail!(
                        "a message of {} bytes arrived, {size} expected (use the same -s on both sides)",
                        w.byte_len
                    );
                }
                rcnt += 1;
                if posted < iters {
                    post_recvs(res, su, 0, 1)?;
                    posted += 1;
                }
            }
            if scnt < iters {
                scnt += 1;
                tposted.push(Instant::now());
                let mut w = wr_for(su, a, &sge, r, 0, scnt);
                w.flags = w.flags | SendFlags::SIGNALED;
                res.qps[0].post_send(&[w]).context("Couldn't post send")?;
                poller.next(res, false)?;
            }
        }
        lat_row(a, &lat_stats(size, &tposted, 2.0));
    }
    if !quiet {
        println!("{RESULT_LINE}");
    }
    oob.close(&me[0])
}
