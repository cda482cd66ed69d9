//! `uroce pingpong rc|uc|ud|srq`: rdma-core's ibv_rc_pingpong,
//! ibv_uc_pingpong, ibv_ud_pingpong and ibv_srq_pingpong: the same options,
//! the same TCP exchange (`LID:QPN:PSN:GID`, 52 bytes per QP, then "done")
//! and the same report, so either side can be rdma-core's tool once the
//! drop-in library exists.
//!
//! Both sides post `rx_depth` receives; the client sends first; each side
//! sends its next message once its previous send completed and the peer's
//! message arrived, `iters` times.

use std::net::{IpAddr, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use uroce::{
    Access, AttrMask, CompChannel, Cq, Mr, Mtu, Path, Pd, Psn, Qp, QpAttr, QpCaps, QpInitAttr,
    QpState, QpType, RecvWr, RnrTimer, SendFlags, SendWr, Srq, SrqAttr, limits,
};

use crate::common::{self, Waiter};

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Unreliable Datagram.
    Ud,
    /// RC QPs sharing a shared receive queue.
    Srq,
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Transport: rc, uc, ud or srq.
    #[arg(value_enum)]
    kind: Kind,
    /// Connect to this server (omit to be the server).
    server: Option<String>,
    /// Listen on / connect to TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Use this device (default: the first).
    #[arg(short = 'd', long = "ib-dev")]
    dev: Option<String>,
    /// Use this port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Size of message to exchange (default 4096; 1024 for ud).
    #[arg(short = 's', long = "size")]
    size: Option<u32>,
    /// Path MTU (rc, uc, srq).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Service level (accepted; RoCEv2 carries no SL).
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Sleep on CQ events (a completion channel) instead of busy polling.
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Local GID index (uroce uses 0 when absent: RoCE needs a GID).
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<i32>,
    /// Validate the received buffers.
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    /// Number of QPs (srq).
    #[arg(short = 'q', long = "num-qp", default_value_t = 16)]
    num_qp: u32,
    /// Give up when nothing completes for this many seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// ibv_srq_pingpong's `MAX_QP`: it always exchanges that many records.
const SRQ_MAX_QP: usize = 256;
/// `sizeof "0000:000000:000000:00000000000000000000000000000000"`.
const MSG_LEN: usize = 52;
/// The Q_Key ibv_ud_pingpong uses.
const UD_QKEY: u32 = 0x1111_1111;
const GRH: usize = 40;

/// One QP's connection details.
#[derive(Clone, Copy)]
struct Dest {
    lid: u16,
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
}

impl Dest {
    fn encode(&self) -> [u8; MSG_LEN] {
        let s = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn,
            self.psn,
            common::wire_gid(self.gid)
        );
        let mut m = [0u8; MSG_LEN];
        m[..s.len()].copy_from_slice(s.as_bytes());
        m
    }

    fn decode(m: &[u8]) -> Result<Self> {
        let text = std::str::from_utf8(m).unwrap_or("").trim_end_matches('\0');
        let f: Vec<&str> = text.split(':').collect();
        let bad = || {
            anyhow::anyhow!(
                "bad remote address {text:?} (is the peer a pingpong of the same kind?)"
            )
        };
        if f.len() != 4 {
            return Err(bad());
        }
        Ok(Self {
            lid: u16::from_str_radix(f[0], 16).map_err(|_| bad())?,
            qpn: u32::from_str_radix(f[1], 16).map_err(|_| bad())?,
            psn: u32::from_str_radix(f[2], 16).map_err(|_| bad())?,
            gid: common::parse_wire_gid(f[3])?,
        })
    }

    fn print(&self, who: &str) {
        println!(
            "  {who} address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid,
            self.qpn,
            self.psn,
            common::gid_str(self.gid)
        );
    }
}

struct Ctx {
    ctx: uroce::Context,
    pd: Pd,
    mr: Mr,
    cq: Cq,
    channel: Option<CompChannel>,
    srq: Option<Srq>,
    qps: Vec<Qp>,
    size: usize,
    /// Where messages start in a receive slot (after the GRH for UD).
    data_off: usize,
    /// Receive slots: one shared by every receive (as rdma-core), or with
    /// `-c` one per posted receive so that each arrival can be checked.
    slot_len: usize,
    /// The send area follows the receive slots.
    send_off: usize,
    inline: bool,
    chk: bool,
    /// The byte rdma-core fills its buffer with (see [`chk_byte`]).
    fill: u8,
}

/// What changes as receives complete (kept apart from [`Ctx`], which the
/// completion waiter borrows).
struct RecvState {
    free_slots: Vec<u32>,
}

pub(crate) fn run(a: &Args) -> Result<ExitCode> {
    // ibv_ud_pingpong's default is 1024 (its help text says 2048).
    let size = a.size.unwrap_or(if a.kind == Kind::Ud { 1024 } else { 4096 }) as usize;
    if a.iters == 0 || a.rx_depth == 0 {
        bail!("iters and rx-depth must be positive");
    }
    let num_qp = if a.kind == Kind::Srq { a.num_qp } else { 1 };
    if num_qp == 0 {
        bail!("num-qp must be positive");
    }
    if num_qp as usize >= SRQ_MAX_QP {
        bail!("num_qp {num_qp} must be less than {SRQ_MAX_QP}");
    }
    if a.kind == Kind::Srq && a.rx_depth < num_qp {
        bail!("rx-depth ({}) must be at least num-qp ({num_qp})", a.rx_depth);
    }
    let mut mtu = common::parse_mtu(a.mtu)?;
    let timeout = Duration::from_secs_f64(a.timeout.max(0.1));

    let ctx = common::open_device(a.dev.as_deref())?;
    let port = ctx.query_port(a.ib_port).map_err(|_| {
        anyhow::anyhow!("Couldn't get port info: port {} does not exist (ports: 1)", a.ib_port)
    })?;
    if !port.active {
        bail!("port {} of {} is down (its address is not up)", a.ib_port, ctx.device().name());
    }
    if mtu > port.active_mtu {
        mtu = port.active_mtu;
    }
    if a.kind == Kind::Ud && size > port.active_mtu.bytes() {
        bail!("Requested size larger than port MTU ({})", port.active_mtu.bytes());
    }
    let gid = common::local_gid(&ctx, a.ib_port, a.gid_idx)?;
    let c = init_ctx(ctx, a, size, num_qp)?;
    let mut st = recv_state(a);

    // Receives first, as rdma-core does, then the exchange.
    let mut routs = post_recvs(&c, &mut st, a.rx_depth)?;
    let waiter = Waiter::new(&c.cq, c.channel.as_ref(), timeout)?;
    let mine: Vec<Dest> = c
        .qps
        .iter()
        .map(|qp| Dest { lid: 0, qpn: qp.qpn(), psn: common::random_psn(qp.qpn()), gid })
        .collect();
    for d in &mine {
        d.print("local");
    }
    let records = if a.kind == Kind::Srq { SRQ_MAX_QP } else { mine.len() };
    let (rem, stream) = match &a.server {
        Some(host) => {
            let mut s = common::connect(host, a.port)?;
            let rem = client_exchange(&mut s, &mine, records)?;
            (rem, s)
        }
        None => {
            let l = common::listen(a.port)?;
            let mut s = common::accept(&l)?;
            let mut buf = vec![0u8; MSG_LEN * records];
            common::read_record(&mut s, &mut buf)?;
            let rem = decode_records(&buf, mine.len())?;
            connect_qps(&c, a, mtu, &mine, &rem)?;
            common::write_record(&mut s, &encode_records(&mine, records))?;
            // "done" (5 bytes), or the client hanging up.
            let mut done = [0u8; 5];
            common::read_record(&mut s, &mut done)?;
            (rem, s)
        }
    };
    for d in &rem {
        d.print("remote");
    }
    if a.server.is_some() {
        connect_qps(&c, a, mtu, &mine, &rem)?;
    }
    drop(stream);
    let ah = if a.kind == Kind::Ud {
        let mut attr = uroce::AhAttr::from_gid(rem[0].gid);
        common::ip_of_gid(rem[0].gid)?;
        attr.port = c.ctx.device().socket_addr().port();
        Some(c.pd.create_ah(&attr).context("Failed to create AH")?)
    } else {
        None
    };

    let mut pending = vec![RECV_WRID; c.qps.len()];
    let (mut sent, mut rcnt, mut scnt) = (0u32, 0u32, 0u32);
    let start = Instant::now();
    if a.server.is_some() {
        for (i, p) in pending.iter_mut().enumerate() {
            post_send(&c, i, ah.as_ref(), rem[i].qpn, sent)?;
            sent += 1;
            *p = RECV_WRID | SEND_WRID;
        }
    }
    let mut waiter = waiter;
    let mut wc = common::wc_array::<16>();
    while rcnt < a.iters || scnt < a.iters {
        let n = waiter.wait(&mut wc)?;
        for w in &wc[..n] {
            let Some(qi) = c.qps.iter().position(|q| q.qpn() == w.qp_num) else {
                bail!("Couldn't find QPN {:06x}", w.qp_num);
            };
            let kind = w.wr_id & 0xff;
            match kind {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if a.chk {
                        check_recv(&c, &mut st, (w.wr_id >> 8) as u32, w.byte_len, rcnt)?;
                    }
                    routs -= 1;
                    if routs <= num_qp {
                        routs += post_recvs(&c, &mut st, a.rx_depth - routs)?;
                    }
                    rcnt += 1;
                }
                other => bail!("Completion for unknown wr_id {other}"),
            }
            pending[qi] &= !kind;
            if scnt < a.iters && sent < a.iters && pending[qi] == 0 {
                post_send(&c, qi, ah.as_ref(), rem[qi].qpn, sent)?;
                sent += 1;
                pending[qi] = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = size as u64 * u64::from(a.iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        a.iters,
        usec / 1e6,
        usec / f64::from(a.iters)
    );
    let _ = waiter.events();
    Ok(ExitCode::SUCCESS)
}

fn recv_state(a: &Args) -> RecvState {
    let nslots = if a.chk { a.rx_depth } else { 1 };
    RecvState { free_slots: (0..nslots).rev().collect() }
}

fn init_ctx(ctx: uroce::Context, a: &Args, size: usize, num_qp: u32) -> Result<Ctx> {
    let pd = ctx.alloc_pd().context("Couldn't allocate PD")?;
    let data_off = if a.kind == Kind::Ud { GRH } else { 0 };
    let slot_len = size + data_off;
    let nslots = if a.chk { a.rx_depth } else { 1 };
    let send_off = slot_len * nslots as usize;
    let total = (send_off + size).max(1);
    // Filled with 0x7b, as rdma-core's tools fill theirs.
    let mr = pd.alloc_mr(total, Access::LOCAL_WRITE).context("Couldn't register MR")?;
    mr.write(0, &vec![0x7b; total])?;

    let channel = if a.events {
        Some(ctx.create_comp_channel().context("Couldn't create completion channel")?)
    } else {
        None
    };
    let cqe = a.rx_depth + num_qp;
    let cq = ctx.create_cq_with(cqe, channel.as_ref()).context("Couldn't create CQ")?;
    let srq = if a.kind == Kind::Srq {
        Some(
            ctx.create_srq(&SrqAttr { max_wr: a.rx_depth, max_sge: 1, srq_limit: 0 })
                .context("Couldn't create SRQ")?,
        )
    } else {
        None
    };
    let inline = size <= limits::MAX_INLINE as usize;
    let qp_type = match a.kind {
        Kind::Rc | Kind::Srq => QpType::Rc,
        Kind::Uc => QpType::Uc,
        Kind::Ud => QpType::Ud,
    };
    let mut qps = Vec::new();
    for _ in 0..num_qp {
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCaps {
                    max_send_wr: 1,
                    max_recv_wr: if srq.is_some() { 0 } else { a.rx_depth },
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: if inline { size as u32 } else { 0 },
                },
                qp_type,
                sq_sig_all: false,
                srq: srq.as_ref(),
            })
            .context("Couldn't create QP")?;
        let attr = QpAttr {
            state: QpState::Init,
            access: Access::NONE,
            qkey: UD_QKEY,
            ..QpAttr::default()
        };
        let mut mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
        mask = mask | if qp_type == QpType::Ud { AttrMask::QKEY } else { AttrMask::ACCESS_FLAGS };
        qp.modify(&QpAttr { port: a.ib_port, ..attr }, mask)
            .context("Failed to modify QP to INIT")?;
        qps.push(qp);
    }
    Ok(Ctx {
        ctx,
        pd,
        mr,
        cq,
        channel,
        srq,
        qps,
        size,
        data_off,
        slot_len,
        send_off,
        inline,
        chk: a.chk,
        fill: if a.kind == Kind::Srq { 0 } else { 0x7b },
    })
}

/// Posts `n` receives; with `-c` each takes a free slot, named in the
/// upper bits of its wr_id.
fn post_recvs(c: &Ctx, st: &mut RecvState, n: u32) -> Result<u32> {
    let mut sges = Vec::with_capacity(n as usize);
    let mut ids = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let slot = if c.chk {
            st.free_slots.pop().ok_or_else(|| anyhow::anyhow!("no free receive slot"))?
        } else {
            0
        };
        sges.push([c.mr.sge(slot as usize * c.slot_len, c.slot_len as u32)?]);
        ids.push(RECV_WRID | u64::from(slot) << 8);
    }
    let wrs: Vec<RecvWr> =
        sges.iter().zip(&ids).map(|(s, &id)| RecvWr { wr_id: id, sgl: s }).collect();
    match &c.srq {
        Some(srq) => srq.post_recv(&wrs),
        None => c.qps[0].post_recv(&wrs),
    }
    .with_context(|| format!("Couldn't post receive ({n})"))?;
    Ok(n)
}

/// The page size rdma-core's examples use for `-c` (`sysconf(_SC_PAGESIZE)`
/// on x86-64 Linux).
const CHK_PAGE: usize = 4096;

/// Byte `i` of every message under `-c`, as rdma-core's pingpongs make it:
/// the buffer is filled with `fill` (0x7b; ibv_srq_pingpong: 0) and the
/// client zeroes the first byte of each page (`i / page_size %
/// sizeof(char)`, always 0). Messages carry this both ways, since both
/// sides send from the buffer they receive into; rdma-core's server checks
/// the page bytes once at the end, uroce checks every byte of every message.
fn chk_byte(fill: u8, i: usize) -> u8 {
    if i.is_multiple_of(CHK_PAGE) { 0 } else { fill }
}

fn post_send(c: &Ctx, qi: usize, ah: Option<&uroce::Ah>, rqpn: u32, k: u32) -> Result<()> {
    if c.chk && k == 0 {
        let data: Vec<u8> = (0..c.size).map(|i| chk_byte(c.fill, i)).collect();
        c.mr.write(c.send_off, &data)?;
    }
    let sge = [c.mr.sge(c.send_off, c.size as u32)?];
    let mut flags = SendFlags::SIGNALED;
    if c.inline {
        flags = flags | SendFlags::INLINE;
    }
    let wr = SendWr {
        wr_id: SEND_WRID,
        flags,
        sgl: &sge,
        ud: ah.map(|ah| ah.dest(rqpn, UD_QKEY)),
        ..SendWr::default()
    };
    c.qps[qi].post_send(&[wr]).context("Couldn't post send")
}

/// Checks the message in `slot`: its length and every byte of rdma-core's
/// `-c` pattern.
fn check_recv(c: &Ctx, st: &mut RecvState, slot: u32, byte_len: u32, rcnt: u32) -> Result<()> {
    if byte_len as usize != c.size + c.data_off {
        bail!("message {rcnt}: {byte_len} bytes received, expected {}", c.size + c.data_off);
    }
    let mut got = vec![0u8; c.size];
    c.mr.read(slot as usize * c.slot_len + c.data_off, &mut got)?;
    if let Some(i) = (0..c.size).find(|&i| got[i] != chk_byte(c.fill, i)) {
        bail!(
            "message {rcnt}: byte {i} is {:#04x}, expected {:#04x} (invalid data in page {}; \
             does the peer run with -c too?)",
            got[i],
            chk_byte(c.fill, i),
            i / CHK_PAGE
        );
    }
    st.free_slots.push(slot);
    Ok(())
}

/// The records one side sends: one per QP, except that ibv_srq_pingpong
/// always exchanges `MAX_QP` (256) of them, the unused ones zero.
fn encode_records(mine: &[Dest], records: usize) -> Vec<u8> {
    let zero = Dest { lid: 0, qpn: 0, psn: 0, gid: [0; 16] };
    let pad = std::iter::repeat_n(&zero, records.saturating_sub(mine.len()));
    mine.iter().chain(pad).flat_map(|d| d.encode()).collect()
}

/// The peer's records for our `n` QPs, out of the `records` it sent.
fn decode_records(buf: &[u8], n: usize) -> Result<Vec<Dest>> {
    buf.chunks(MSG_LEN).take(n).map(Dest::decode).collect()
}

fn client_exchange(s: &mut TcpStream, mine: &[Dest], records: usize) -> Result<Vec<Dest>> {
    common::write_record(s, &encode_records(mine, records))?;
    let mut buf = vec![0u8; MSG_LEN * records];
    common::read_record(s, &mut buf)?;
    let rem = decode_records(&buf, mine.len())?;
    // Best effort: the server only waits for it.
    let _ = std::io::Write::write_all(s, b"done\0");
    Ok(rem)
}

fn connect_qps(c: &Ctx, a: &Args, mtu: Mtu, mine: &[Dest], rem: &[Dest]) -> Result<()> {
    if rem.len() != c.qps.len() {
        bail!("the peer has {} QPs, this side {}", rem.len(), c.qps.len());
    }
    for ((qp, me), r) in c.qps.iter().zip(mine).zip(rem) {
        let dst: IpAddr = common::ip_of_gid(r.gid)?;
        let attr = QpAttr {
            state: QpState::ReadyToReceive,
            path: Some(Path {
                dst,
                dst_port: c.ctx.device().socket_addr().port(),
                sgid_index: a.gid_idx.unwrap_or(0) as u8,
                flow_label: 0,
                hop_limit: 64,
                traffic_class: 0,
            }),
            path_mtu: mtu,
            dest_qpn: r.qpn,
            rq_psn: Psn::new(r.psn),
            max_dest_rd_atomic: 1,
            min_rnr_timer: RnrTimer::from_code(12),
            sq_psn: Psn::new(me.psn),
            timeout: uroce::LocalAckTimeout::saturating(14),
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..QpAttr::default()
        };
        let (rtr, rts) = match qp.qp_type() {
            QpType::Rc => (common::rc_rtr_mask(), common::rc_rts_mask()),
            QpType::Uc => (
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN,
                AttrMask::STATE | AttrMask::SQ_PSN,
            ),
            QpType::Ud => (AttrMask::STATE, AttrMask::STATE | AttrMask::SQ_PSN),
            QpType::XrcSend | QpType::XrcRecv => anyhow::bail!("uroce pingpong has no XRC mode"),
            QpType::RawPacket => anyhow::bail!("uroce pingpong has no raw packet mode"),
        };
        qp.modify(&attr, rtr).context("Failed to modify QP to RTR")?;
        qp.modify(&QpAttr { state: QpState::ReadyToSend, ..attr }, rts)
            .context("Failed to modify QP to RTS")?;
    }
    Ok(())
}
