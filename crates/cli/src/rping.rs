//! `uroce rping -s|-c -a ADDR [-p PORT] [-C N] [-S SIZE] [-v] [-V]`:
//! librdmacm's rping loop. Per ping the client SENDs the advertisement of
//! its pattern buffer (address, rkey, size: 16 bytes, network order), the
//! server RDMA READs the pattern and SENDs "go ahead", the client SENDs the
//! advertisement of its sink buffer, the server RDMA WRITEs the pattern
//! there and SENDs "go ahead", and the client checks the copy.
//!
//! The connection is made through the RDMA CM (`uroce::cm`), as rping
//! makes it, so either side can be Debian's rping on the drop-in library;
//! the client's disconnect ends the server's loop.

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use uroce::{
    Access, Completion, Cq, Mr, Qp, QpCaps, QpInitAttr, QpType, RecvWr, SendFlags, SendWr, WrOpcode,
};

use crate::common;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Be the server.
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Be the client.
    #[arg(short = 'c')]
    client: bool,
    /// The server's address (the server listens on it).
    #[arg(short = 'a')]
    addr: String,
    /// The RDMA CM port (a service of the device, not a TCP port).
    #[arg(short = 'p', default_value_t = 7174)]
    port: u16,
    /// Pings to run (0: until interrupted).
    #[arg(short = 'C', default_value_t = 0)]
    count: u64,
    /// Ping buffer size.
    #[arg(short = 'S', default_value_t = 64)]
    size: u32,
    /// Print each ping's data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate each ping's data (always done; accepted for rping's sake).
    #[arg(short = 'V')]
    validate: bool,
    /// Device (default: the one whose address is -a on the server, else
    /// the first).
    #[arg(short = 'd', long = "ib-dev")]
    dev: Option<String>,
}

/// `"rdma-ping-%d: "` with the largest ping number, plus the NUL.
const MIN_SIZE: u32 = 26;
const INFO: usize = 16;
const STALL: Duration = Duration::from_secs(10);

/// Buffer layout in the one MR: received info, info to send, the RDMA
/// buffer (server: READ target and WRITE source; client: sink), and the
/// client's pattern buffer.
struct Bufs {
    mr: Mr,
    size: usize,
}

impl Bufs {
    const RECV: usize = 0;
    const SEND: usize = INFO;
    fn rdma(&self) -> usize {
        64
    }
    fn start(&self) -> usize {
        64 + self.size
    }
}

struct Side {
    _ctx: uroce::Context,
    cq: Cq,
    qp: Qp,
    b: Bufs,
    /// Completions polled while waiting for another kind.
    early: std::cell::RefCell<common::Stash>,
    /// The connection: the peer's disconnect is how a side sees the other
    /// leave (rping's disconnect event).
    conn: uroce::cm::CmConnection,
}

pub(crate) fn run(a: &Args) -> Result<ExitCode> {
    if a.server == a.client {
        bail!("give -s (server) or -c (client)");
    }
    if a.size < MIN_SIZE {
        bail!("Invalid size {} (valid range is {MIN_SIZE} to {})", a.size, u32::MAX / 4);
    }
    let ctx = match (&a.dev, a.server) {
        (Some(d), _) => common::open_device(Some(d))?,
        (None, true) => {
            let list = uroce::devices()?;
            let want: Option<IpAddr> = a.addr.parse().ok();
            match list.iter().find(|d| Some(d.socket_addr().ip()) == want) {
                Some(d) => d.open().context("Couldn't open the device")?,
                None => common::open_device(None)?,
            }
        }
        (None, false) => common::open_device(None)?,
    };
    let size = a.size as usize;
    let pd = ctx.alloc_pd()?;
    let mr = pd.alloc_mr(
        64 + 2 * size,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
    )?;
    let cq = ctx.create_cq(16)?;
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: caps,
        qp_type: QpType::Rc,
        sq_sig_all: true,
        srq: None,
    })?;
    // The receive is posted before the connection exists, as rping does
    // (the peer may SEND as soon as it is established): the QP is moved
    // to INIT for it, which the CM's transitions start from.
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let init = uroce::QpAttr { state: uroce::QpState::Init, access: rw, ..Default::default() };
    use uroce::AttrMask as M;
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)?;
    qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[mr.sge(Bufs::RECV, INFO as u32)?] }])?;
    let conn = if a.server {
        let l = ctx
            .cm_listen(a.port)
            .with_context(|| format!("Couldn't listen on rdma_cm port {}", a.port))?;
        l.accept(&qp, &[], Duration::from_secs(3600)).context("accepting a connection")?
    } else {
        let peer: IpAddr = a.addr.parse().with_context(|| format!("bad address {}", a.addr))?;
        ctx.cm_connect(&qp, peer, a.port, &[], STALL)
            .with_context(|| format!("connecting to {peer} port {}", a.port))?
    };
    let s = Side { _ctx: ctx, cq, qp, b: Bufs { mr, size }, early: Default::default(), conn };
    if a.server { server(a, &s) } else { client(a, &s) }?;
    Ok(ExitCode::SUCCESS)
}

impl Side {
    fn post_recv(&self) -> Result<()> {
        let sge = [self.b.mr.sge(Bufs::RECV, INFO as u32)?];
        self.qp.post_recv(&[RecvWr { wr_id: 1, sgl: &sge }])?;
        Ok(())
    }

    /// Waits for the next completion that is a receive (`recv`) or a send
    /// of `op`; `None` when the peer hung up meanwhile.
    fn expect(&self, op: WrOpcode, recv: bool) -> Result<Option<Completion>> {
        let start = Instant::now();
        let mut polls = 0u32;
        let w = self.early.borrow_mut().next(
            &self.cq,
            |w| w.is_recv == recv && (recv || w.opcode == wc_of(op)),
            || {
                polls += 1;
                if polls.is_multiple_of(4096) && self.hung_up()? {
                    return Ok(false);
                }
                if start.elapsed() > STALL {
                    bail!("no completion within {STALL:?}: the peer stopped or packets are lost");
                }
                Ok(true)
            },
        )?;
        if let Some(w) = &w
            && w.status != uroce::WcStatus::Success
        {
            bail!("cq completion failed status {} ({})", w.status.as_str(), w.status as u32);
        }
        Ok(w)
    }

    /// Whether the peer disconnected.
    fn hung_up(&self) -> Result<bool> {
        Ok(self.conn.wait_disconnect(Duration::ZERO)?)
    }

    fn send_info(&self, addr: u64, rkey: u32, size: u32) -> Result<()> {
        let mut m = [0u8; INFO];
        m[..8].copy_from_slice(&addr.to_be_bytes());
        m[8..12].copy_from_slice(&rkey.to_be_bytes());
        m[12..].copy_from_slice(&size.to_be_bytes());
        self.b.mr.write(Bufs::SEND, &m)?;
        let sge = [self.b.mr.sge(Bufs::SEND, INFO as u32)?];
        self.qp.post_send(&[SendWr {
            wr_id: 2,
            sgl: &sge,
            flags: SendFlags::SIGNALED,
            ..SendWr::default()
        }])?;
        self.expect(WrOpcode::Send, false)?.ok_or_else(gone)?;
        Ok(())
    }

    fn recv_info(&self) -> Result<Option<(u64, u32, u32)>> {
        if self.expect(WrOpcode::Send, true)?.is_none() {
            return Ok(None);
        }
        let mut m = [0u8; INFO];
        self.b.mr.read(Bufs::RECV, &mut m)?;
        self.post_recv()?;
        let addr = u64::from_be_bytes(m[..8].try_into().unwrap_or_default());
        let rkey = u32::from_be_bytes(m[8..12].try_into().unwrap_or_default());
        let size = u32::from_be_bytes(m[12..].try_into().unwrap_or_default());
        Ok(Some((addr, rkey, size)))
    }

    fn rdma(&self, op: WrOpcode, addr: u64, rkey: u32, size: u32) -> Result<()> {
        let sge = [self.b.mr.sge(self.b.rdma(), size)?];
        self.qp.post_send(&[SendWr {
            wr_id: 3,
            opcode: op,
            sgl: &sge,
            remote_addr: addr,
            rkey,
            flags: SendFlags::SIGNALED,
            ..SendWr::default()
        }])?;
        self.expect(op, false)?.ok_or_else(gone)?;
        Ok(())
    }
}

fn gone() -> anyhow::Error {
    anyhow!("the peer hung up (see its error)")
}

fn wc_of(op: WrOpcode) -> uroce::WcOpcode {
    match op {
        WrOpcode::RdmaRead => uroce::WcOpcode::RdmaRead,
        WrOpcode::RdmaWrite => uroce::WcOpcode::RdmaWrite,
        _ => uroce::WcOpcode::Send,
    }
}

fn server(a: &Args, s: &Side) -> Result<()> {
    let rkey = s.b.mr.rkey();
    loop {
        // The client's pattern buffer: READ it.
        let Some((addr, key, len)) = s.recv_info()? else { break };
        if len as usize > s.b.size {
            bail!(
                "the client's buffer is {len} bytes, this server's {} (use the same -S)",
                s.b.size
            );
        }
        s.rdma(WrOpcode::RdmaRead, addr, key, len)?;
        if a.verbose {
            println!("server ping data: {}", text(s, s.b.rdma(), len as usize)?);
        }
        s.send_info(s.b.mr.addr() + s.b.rdma() as u64, rkey, len)?;
        // The client's sink: WRITE the pattern back.
        let Some((addr, key, len)) = s.recv_info()? else { break };
        s.rdma(WrOpcode::RdmaWrite, addr, key, len)?;
        s.send_info(s.b.mr.addr() + s.b.rdma() as u64, rkey, len)?;
    }
    Ok(())
}

/// rping's pattern for ping `n`: "rdma-ping-N: " then letters cycling
/// from `start` through 'A'..='z', NUL-terminated.
fn pattern(n: u64, start: u8, size: usize) -> Vec<u8> {
    let mut v = format!("rdma-ping-{n}: ").into_bytes();
    let mut c = start;
    while v.len() < size {
        v.push(c);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    v.truncate(size);
    v[size - 1] = 0;
    v
}

fn text(s: &Side, off: usize, len: usize) -> Result<String> {
    let mut b = vec![0u8; len];
    s.b.mr.read(off, &mut b)?;
    let end = b.iter().position(|&c| c == 0).unwrap_or(len);
    Ok(String::from_utf8_lossy(&b[..end]).into_owned())
}

fn client(a: &Args, s: &Side) -> Result<()> {
    let size = s.b.size;
    let rkey = s.b.mr.rkey();
    let base = s.b.mr.addr();
    let mut start = b'A';
    let mut n = 0u64;
    while a.count == 0 || n < a.count {
        let pat = pattern(n, start, size);
        start = if start >= b'z' { b'A' } else { start + 1 };
        s.b.mr.write(s.b.start(), &pat)?;
        s.b.mr.write(s.b.rdma(), &vec![0u8; size])?;
        s.send_info(base + s.b.start() as u64, rkey, size as u32)?;
        s.recv_info()?.ok_or_else(gone)?;
        s.send_info(base + s.b.rdma() as u64, rkey, size as u32)?;
        s.recv_info()?.ok_or_else(gone)?;
        let mut got = vec![0u8; size];
        s.b.mr.read(s.b.rdma(), &mut got)?;
        if got != pat {
            bail!("data mismatch! in ping {n}");
        }
        if a.verbose {
            println!("ping data: {}", text(s, s.b.rdma(), size)?);
        }
        n += 1;
    }
    Ok(())
}
