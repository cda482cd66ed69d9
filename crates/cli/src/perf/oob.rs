//! The out-of-band channel and its key records: perftest's TCP socket
//! (text records), or with `-R` an RC connection made through the RDMA CM
//! that carries each item as one SEND (binary records; see
//! `docs/perftest-protocol.md`).

use super::*;

/// One QP's key record (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Dest {
    pub(super) lid: u16,
    pub(super) out_reads: u16,
    pub(super) qpn: u32,
    pub(super) psn: u32,
    pub(super) rkey: u32,
    pub(super) vaddr: u64,
    pub(super) gid: [u8; 16],
    pub(super) srqn: u32,
}

impl Dest {
    pub(super) fn encode(&self) -> [u8; KEY_LEN] {
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

    pub(super) fn decode(m: &[u8]) -> Result<Self> {
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

impl Dest {
    /// The binary record perftest sends over an rdma_cm channel (`struct
    /// pingpong_dest`, 56 bytes, big-endian fields).
    pub(super) fn encode_binary(&self) -> [u8; CM_KEY_LEN] {
        let mut m = [0u8; CM_KEY_LEN];
        m[0..4].copy_from_slice(&u32::from(self.lid).to_be_bytes());
        m[4..8].copy_from_slice(&u32::from(self.out_reads).to_be_bytes());
        m[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        m[12..16].copy_from_slice(&self.psn.to_be_bytes());
        m[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        m[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        m[32..48].copy_from_slice(&self.gid);
        m[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        m
    }

    pub(super) fn decode_binary(m: &[u8; CM_KEY_LEN]) -> Self {
        let u32_at = |at: usize| u32::from_be_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&m[32..48]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&m[24..32]);
        Self {
            lid: u32_at(0) as u16,
            out_reads: u32_at(4) as u16,
            qpn: u32_at(8),
            psn: u32_at(12),
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(vaddr),
            gid,
            srqn: u32_at(48),
        }
    }
}

/// `sizeof(struct pingpong_dest)`: the receive each side keeps posted.
pub(super) const CM_KEY_LEN: usize = 56;

/// The side channel: the client writes first, the server reads first,
/// one message per item.
pub(super) struct Oob {
    pub(super) link: Link,
    pub(super) client: bool,
}

pub(super) enum Link {
    Tcp(TcpStream),
    Cm(Box<CmLink>),
}

impl Oob {
    pub(super) fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<()> {
        match &mut self.link {
            Link::Tcp(s) if self.client => {
                common::write_record(s, mine)?;
                common::read_record(s, theirs)
            }
            Link::Tcp(s) => {
                common::read_record(s, theirs)?;
                common::write_record(s, mine)
            }
            Link::Cm(c) => c.xchg(self.client, mine, theirs),
        }
    }

    /// One key-record handshake (`ctx_hand_shake`).
    pub(super) fn hs(&mut self, me: &Dest) -> Result<Dest> {
        if matches!(self.link, Link::Cm(_)) {
            let mut buf = [0u8; CM_KEY_LEN];
            self.xchg(&me.encode_binary(), &mut buf)?;
            return Ok(Dest::decode_binary(&buf));
        }
        let mut buf = [0u8; KEY_LEN];
        self.xchg(&me.encode(), &mut buf)?;
        Dest::decode(&buf)
    }

    /// Waits as long as the peer's traffic takes (no timeout; a dead peer
    /// closes the socket, or fails the SEND).
    pub(super) fn untimed(&mut self, on: bool) -> Result<()> {
        let t = if on { None } else { Some(common::OOB_TIMEOUT) };
        match &mut self.link {
            Link::Tcp(s) => s.set_read_timeout(t)?,
            Link::Cm(c) => c.timeout = t,
        }
        Ok(())
    }

    /// `ctx_close_connection`: a handshake, then (over TCP) "done\0",
    /// never read.
    pub(super) fn close(&mut self, me: &Dest) -> Result<()> {
        self.untimed(true)?;
        self.hs(me)?;
        if let Link::Tcp(s) = &mut self.link {
            let _ = std::io::Write::write_all(s, b"done\0");
        }
        Ok(())
    }
}

/// perftest's rdma_cm channel: its own RC QP, PD, MR and CQ, one receive
/// of `CM_KEY_LEN` bytes always posted.
pub(super) struct CmLink {
    /// The test QPs' connections, dropped (disconnected) at the end.
    pub(super) tests: Vec<uroce::cm::CmConnection>,
    conn: Option<uroce::cm::CmConnection>,
    qp: Qp,
    cq: Cq,
    mr: Mr,
    _pd: Pd,
    timeout: Option<Duration>,
    /// Completions taken from the CQ and not yet waited for: SENDs,
    /// receives.
    ready: (u32, u32),
}

/// Where the send buffer starts in the channel's MR (the receive's is 0).
const CM_SEND_AT: usize = 64;

impl CmLink {
    /// Connects the channel: as a client to `peer`'s `port`, as a server
    /// the first request to `listener`.
    pub(super) fn open(
        ctx: &uroce::Context,
        peer: Option<std::net::IpAddr>,
        listener: Option<&uroce::cm::CmListener>,
        port: u16,
    ) -> Result<Self> {
        let pd = ctx.alloc_pd().context("Couldn't allocate PD")?;
        let mr =
            pd.alloc_mr(2 * CM_SEND_AT, Access::LOCAL_WRITE).context("Couldn't allocate MR")?;
        let cq = ctx.create_cq(8).context("Couldn't create CQ")?;
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCaps {
                    max_send_wr: 2,
                    max_recv_wr: 2,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
                srq: None,
            })
            .context("Couldn't create QP")?;
        init_qp(&qp, Access::LOCAL_WRITE, 1)?;
        let mut link = Self {
            tests: Vec::new(),
            conn: None,
            qp,
            cq,
            mr,
            _pd: pd,
            timeout: None,
            ready: (0, 0),
        };
        // The receive is posted before the connection: the peer sends at
        // once after it.
        link.post_recv()?;
        let conn = match (peer, listener) {
            (Some(ip), _) => connect_retrying(ctx, &link.qp, ip, port)?,
            (None, Some(l)) => {
                l.accept(&link.qp, &[], FOREVER).context("rdma_cm: accepting the connection")?
            }
            (None, None) => bail!("rdma_cm channel: neither a peer nor a listener"),
        };
        link.conn = Some(conn);
        link.timeout = Some(common::OOB_TIMEOUT);
        Ok(link)
    }

    fn post_recv(&self) -> Result<()> {
        let sge = [self.mr.sge(0, CM_KEY_LEN as u32)?];
        self.qp.post_recv(&[RecvWr { wr_id: 5, sgl: &sge }]).context("Couldn't post receive")
    }

    /// One item each way, in perftest's order (the client sends first).
    fn xchg(&mut self, client: bool, mine: &[u8], theirs: &mut [u8]) -> Result<()> {
        if mine.len() > CM_SEND_AT || theirs.len() > CM_KEY_LEN {
            bail!("rdma_cm channel: an item of {} bytes", mine.len().max(theirs.len()));
        }
        if client {
            self.send(mine)?;
            self.wait(true, true)?;
            self.take(theirs)
        } else {
            self.wait(false, true)?;
            self.take(theirs)?;
            self.send(mine)?;
            self.wait(true, false)
        }
    }

    fn send(&self, data: &[u8]) -> Result<()> {
        self.mr.write(CM_SEND_AT, data)?;
        let sge = [self.mr.sge(CM_SEND_AT, data.len() as u32)?];
        let wr = SendWr { wr_id: 5, flags: SendFlags::SIGNALED, sgl: &sge, ..SendWr::default() };
        self.qp.post_send(&[wr]).context("rdma_cm channel: couldn't post the SEND")
    }

    /// The received item, and the receive posted again.
    fn take(&self, theirs: &mut [u8]) -> Result<()> {
        self.mr.read(0, theirs)?;
        self.post_recv()
    }

    /// Waits for the SEND's completion (`send`) and a receive (`recv`),
    /// in whichever order they come; one that comes early (the peer's
    /// next item before this side's SEND completed) is kept for the next
    /// call.
    fn wait(&mut self, send: bool, recv: bool) -> Result<()> {
        let start = Instant::now();
        let mut wc =
            [Completion::new(0, uroce::WcStatus::Success, uroce::WcOpcode::Send, 0, false)];
        let (mut send, mut recv) = (u32::from(send), u32::from(recv));
        loop {
            let s = send.min(self.ready.0);
            let r = recv.min(self.ready.1);
            (send, recv, self.ready.0, self.ready.1) =
                (send - s, recv - r, self.ready.0 - s, self.ready.1 - r);
            if send == 0 && recv == 0 {
                return Ok(());
            }
            if self.cq.poll(&mut wc)? == 1 {
                let w = wc[0];
                if w.status != uroce::WcStatus::Success {
                    bail!("rdma_cm channel: completion with error: {}", w.status.as_str());
                }
                if w.is_recv {
                    self.ready.1 += 1;
                } else {
                    self.ready.0 += 1;
                }
                continue;
            }
            if self.timeout.is_some_and(|t| start.elapsed() > t) {
                bail!("rdma_cm channel: the peer did not answer");
            }
            std::thread::yield_now();
        }
    }
}

/// As good as for ever (perftest's server waits without a limit).
pub(super) const FOREVER: Duration = Duration::from_secs(24 * 3600);

/// Moves a QP to INIT (the RDMA CM's first step, so that receives can be
/// posted before the connection).
pub(super) fn init_qp(qp: &Qp, access: Access, port: u8) -> Result<()> {
    let attr = QpAttr { state: QpState::Init, access, port, ..QpAttr::default() };
    qp.modify(
        &attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .context("Failed to modify QP to INIT")
}

/// Connects `qp` to `peer`'s `port`, trying again for a few seconds
/// while nobody listens there yet (a perftest server opens its test
/// listener only after answering the handshake that precedes the
/// connections, later still on a loaded machine).
pub(super) fn connect_retrying(
    ctx: &uroce::Context,
    qp: &Qp,
    peer: std::net::IpAddr,
    port: u16,
) -> Result<uroce::cm::CmConnection> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match ctx.cm_connect(qp, peer, port, &[], Duration::from_secs(10)) {
            Ok(c) => return Ok(c),
            Err(uroce::Error::Rejected { reason: 8, .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(anyhow!("rdma_cm: connecting to {peer} port {port}: {e}")),
        }
    }
}
