//! The measurement engine under `uroce bench` (and the perftest-style
//! tools): one connected RC QP per side, bandwidth by keeping a window of
//! WRs in flight with selective signaling, latency by timing every
//! iteration of a ping-pong or a round trip.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use uroce::{
    Access, Completion, Cq, Mr, Pd, Qp, QpCaps, QpInitAttr, QpType, RecvWr, SendFlags, SendWr,
    WcStatus, WrOpcode,
};

use crate::common;

/// The operations measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Op {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND / RECV.
    Send,
    /// ATOMIC FETCH_AND_ADD (8 bytes).
    Atomic,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Read => "read",
            Self::Send => "send",
            Self::Atomic => "atomic",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        [Self::Write, Self::Read, Self::Send, Self::Atomic].into_iter().find(|o| o.name() == s)
    }
}

pub(crate) const ALL_ACCESS: Access = Access(1 | 2 | 4 | 8);
/// Receives kept posted on a SEND target.
pub(crate) const RECV_DEPTH: u32 = 512;
/// WRs in flight for bandwidth.
pub(crate) const TX_DEPTH: u32 = 128;
/// Every `CQ_MOD`-th WR is signaled (perftest's default is 100).
const CQ_MOD: u32 = 32;
/// No completion for this long fails the measurement.
const STALL: Duration = Duration::from_secs(10);

/// One side's connection: a context, an RC QP, a registered buffer.
pub(crate) struct Conn {
    /// Where outgoing data comes from: the buffer's second half (the first
    /// half is where the peer's WRITEs and SENDs land).
    src: usize,
    pub(crate) ctx: uroce::Context,
    pub(crate) _pd: Pd,
    pub(crate) mr: Mr,
    pub(crate) cq: Cq,
    pub(crate) qp: Qp,
    pub(crate) psn: u32,
    /// QPs connected and never used (`bench --idle-qps`).
    idle: Vec<Qp>,
    /// Give the CPU away after a poll that found nothing (more processes
    /// than CPUs: `bench --pairs`).
    pub(crate) yield_when_idle: bool,
}

/// What the peer needs to reach this side.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Remote {
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) addr: u64,
    pub(crate) rkey: u32,
}

impl Conn {
    /// Opens `ctx`'s side with a buffer of `buf_len` bytes.
    pub(crate) fn new(ctx: uroce::Context, buf_len: usize) -> Result<Self> {
        let pd = ctx.alloc_pd()?;
        let mr = pd.alloc_mr(buf_len, ALL_ACCESS).context("registering the buffer")?;
        let cq = ctx.create_cq(TX_DEPTH + RECV_DEPTH + 16)?;
        let qp = pd.create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCaps {
                max_send_wr: TX_DEPTH,
                max_recv_wr: RECV_DEPTH,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
            srq: None,
        })?;
        let psn = (qp.qpn().wrapping_mul(2_654_435_761) ^ std::process::id()) & 0xff_ffff;
        Ok(Self {
            src: buf_len / 2,
            ctx,
            _pd: pd,
            mr,
            cq,
            qp,
            psn,
            idle: Vec::new(),
            yield_when_idle: false,
        })
    }

    pub(crate) fn me(&self) -> Remote {
        Remote { qpn: self.qp.qpn(), psn: self.psn, addr: self.mr.addr(), rkey: self.mr.rkey() }
    }

    /// Connects to the peer at `ip` (same UDP port as this device).
    pub(crate) fn connect(&self, ip: std::net::IpAddr, peer: &Remote) -> Result<()> {
        let port = self.ctx.device().socket_addr().port();
        uroce::connect(&self.qp, ip, port, peer.qpn, self.psn, peer.psn, ALL_ACCESS)
            .context("connecting the QP")
    }

    /// Adds `n` RC QPs connected to `ip` (QPNs the peer does not have)
    /// that carry no traffic: what an idle connection costs the active one.
    pub(crate) fn add_idle_qps(&mut self, n: u32, ip: std::net::IpAddr) -> Result<()> {
        let port = self.ctx.device().socket_addr().port();
        let cap = QpCaps {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        for i in 0..n {
            let qp = self._pd.create_qp(&QpInitAttr {
                send_cq: &self.cq,
                recv_cq: &self.cq,
                cap,
                qp_type: QpType::Rc,
                sq_sig_all: false,
                srq: None,
            })?;
            let peer_qpn = 0x80_0000 + i;
            uroce::connect(&qp, ip, port, peer_qpn, 0, 0, ALL_ACCESS)
                .context("connecting an idle QP")?;
            self.idle.push(qp);
        }
        Ok(())
    }

    /// Posts `n` receives, each able to take the largest message (they
    /// all land at the buffer's start).
    pub(crate) fn post_recvs(&self, n: u32) -> Result<()> {
        let sge = [self.mr.sge(0, self.src as u32)?];
        let wrs = vec![RecvWr { wr_id: 0, sgl: &sge }; n as usize];
        self.qp.post_recv(&wrs).context("posting receives")
    }

    /// Polls until at least one completion; error statuses are errors.
    fn poll(&self, wc: &mut [Completion]) -> Result<usize> {
        let start = Instant::now();
        loop {
            let n = self.cq.poll(wc)?;
            if n > 0 {
                self.check_ok(&wc[..n])?;
                return Ok(n);
            }
            self.idle_poll();
            if start.elapsed() > STALL {
                bail!("no completion within {STALL:?}: the peer stopped or packets are lost");
            }
        }
    }

    /// Error statuses are errors, told with the context's non-zero
    /// counters (drops, retransmissions, timeouts say why).
    fn check_ok(&self, wcs: &[Completion]) -> Result<()> {
        if let Some(w) = wcs.iter().find(|w| w.status != WcStatus::Success) {
            let s = self.ctx.snapshot();
            let counters: Vec<String> = s
                .device_stats
                .iter()
                .filter(|(_, v)| *v != 0)
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            bail!(
                "work request failed: {} (wr_id {}); counters: {}",
                w.status.as_str(),
                w.wr_id,
                counters.join(" ")
            );
        }
        Ok(())
    }

    /// After a poll that found nothing.
    fn idle_poll(&self) {
        if self.yield_when_idle {
            std::thread::yield_now();
        }
    }

    fn wr<'a>(
        &self,
        op: Op,
        sge: &'a [uroce::Sge],
        peer: &Remote,
        off: u64,
        wr_id: u64,
    ) -> SendWr<'a> {
        let (opcode, addr) = match op {
            Op::Write => (WrOpcode::RdmaWrite, peer.addr + off),
            Op::Read => (WrOpcode::RdmaRead, peer.addr + off),
            Op::Send => (WrOpcode::Send, 0),
            Op::Atomic => (WrOpcode::AtomicFetchAndAdd, peer.addr + (off & !7)),
        };
        SendWr {
            wr_id,
            opcode,
            flags: SendFlags::NONE,
            sgl: sge,
            remote_addr: addr,
            rkey: peer.rkey,
            compare_add: 1,
            ..SendWr::default()
        }
    }

    /// Bandwidth: `iters` WRs of `size` bytes with up to [`TX_DEPTH`] in
    /// flight. SEND needs receives posted by the peer ([`serve_sends`]).
    pub(crate) fn bw(&self, op: Op, size: usize, iters: u32, peer: &Remote) -> Result<BwResult> {
        let size = if op == Op::Atomic { 8 } else { size };
        let sge = [self.mr.sge(self.src, size as u32)?];
        let mut wc = common::wc_array::<64>();
        let (mut posted, mut done) = (0u32, 0u32);
        let start = Instant::now();
        // (time, messages completed) at every poll that completed some,
        // for the peak.
        let mut marks = Vec::with_capacity(iters as usize / CQ_MOD as usize + 2);
        marks.push((0f64, 0u32));
        while done < iters {
            while posted < iters && posted - done < TX_DEPTH {
                let n =
                    (iters - posted).min(TX_DEPTH - (posted - done)).min(CQ_MOD - posted % CQ_MOD);
                let mut batch = Vec::with_capacity(n as usize);
                for k in 0..n {
                    let i = posted + k;
                    let mut w = self.wr(op, &sge, peer, 0, u64::from(i));
                    if (i + 1) % CQ_MOD == 0 || i + 1 == iters {
                        w.flags = SendFlags::SIGNALED;
                    }
                    batch.push(w);
                }
                self.qp.post_send(&batch).context("posting")?;
                posted += n;
            }
            let n = self.poll(&mut wc)?;
            if let Some(w) = wc[..n].last() {
                done = w.wr_id as u32 + 1;
                marks.push((start.elapsed().as_secs_f64(), done));
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let avg = iters as f64 * size as f64 / secs;
        Ok(BwResult {
            iters,
            peak_bps: (peak_rate(&marks, iters) * size as f64).max(avg),
            avg_bps: avg,
            msg_rate: iters as f64 / secs,
        })
    }

    /// The SEND target of a bandwidth run: keeps receives posted and
    /// consumes `iters` of them.
    pub(crate) fn serve_sends(&self, iters: u32) -> Result<()> {
        let mut wc = common::wc_array::<64>();
        let mut got = 0;
        while got < iters {
            let n = self.poll(&mut wc)?;
            let recvs = wc[..n].iter().filter(|w| w.is_recv).count() as u32;
            got += recvs;
            if recvs > 0 {
                self.post_recvs(recvs)?;
            }
        }
        Ok(())
    }

    /// Latency of `iters` iterations. WRITE and SEND are ping-pongs (the
    /// peer runs [`Conn::pong`]); each sample is half the round trip, as
    /// perftest reports. READ and atomics are single round trips.
    pub(crate) fn lat(&self, op: Op, size: usize, iters: u32, peer: &Remote) -> Result<Vec<f64>> {
        let size = if op == Op::Atomic { 8 } else { size.max(1) };
        let mut samples = Vec::with_capacity(iters as usize);
        let mut wc = common::wc_array::<4>();
        let sge = [self.mr.sge(self.src, size as u32)?];
        match op {
            Op::Read | Op::Atomic => {
                for i in 0..iters {
                    let mut w = self.wr(op, &sge, peer, 0, u64::from(i));
                    w.flags = SendFlags::SIGNALED;
                    let t = Instant::now();
                    self.qp.post_send(&[w])?;
                    self.poll(&mut wc)?;
                    samples.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            Op::Write | Op::Send => {
                let mut last_done = false;
                for i in 0..iters {
                    let t = Instant::now();
                    self.ping(op, size, i, i + 1 == iters, peer, &sge)?;
                    last_done = self.await_ping(op, size, i)?;
                    samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
                self.finish_pings(iters, last_done)?;
            }
        }
        Ok(samples)
    }

    /// The other side of a WRITE or SEND latency run: waits for each
    /// message and answers it.
    pub(crate) fn pong(&self, op: Op, size: usize, iters: u32, peer: &Remote) -> Result<()> {
        let size = size.max(1);
        let sge = [self.mr.sge(self.src, size as u32)?];
        for i in 0..iters {
            self.await_ping(op, size, i)?;
            self.ping(op, size, i, i + 1 == iters, peer, &sge)?;
        }
        self.finish_pings(iters, false)
    }

    /// Waits for the last ping's completion (`done`: already seen), so
    /// that the next run starts with an empty send queue: the slots of
    /// unsignaled WRs are free only once a later signaled one completes
    /// (`man ibv_post_send`), and the peer may hold its last ACK for a
    /// while (it hopes to send it with a reply that will not come).
    fn finish_pings(&self, iters: u32, mut done: bool) -> Result<()> {
        let mut wc = common::wc_array::<8>();
        while !done && iters > 0 {
            let n = self.poll(&mut wc)?;
            done = wc[..n].iter().any(|w| !w.is_recv && w.wr_id == u64::from(iters - 1));
        }
        Ok(())
    }

    /// The mark iteration `i` leaves in the last byte (never 0, the
    /// buffer's initial value).
    fn mark(i: u32) -> u8 {
        (i % 255 + 1) as u8
    }

    fn ping(
        &self,
        op: Op,
        size: usize,
        i: u32,
        last: bool,
        peer: &Remote,
        sge: &[uroce::Sge],
    ) -> Result<()> {
        // The last byte carries the iteration, as perftest's write_lat.
        self.mr.write(self.src + size - 1, &[Self::mark(i)])?;
        let mut w = self.wr(op, sge, peer, 0, u64::from(i));
        // Signal every CQ_MOD-th so the send queue drains, and the last.
        if i % CQ_MOD == CQ_MOD - 1 || last {
            w.flags = SendFlags::SIGNALED;
        }
        self.qp.post_send(&[w])?;
        Ok(())
    }

    /// Waits for the peer's ping `i`; whether our own ping `i` completed
    /// meanwhile.
    fn await_ping(&self, op: Op, size: usize, i: u32) -> Result<bool> {
        let start = Instant::now();
        let mut wc = common::wc_array::<8>();
        let mut b = [0u8];
        let mut sent = false;
        loop {
            // Polling the CQ drives progress (and reaps sends).
            let n = self.cq.poll(&mut wc)?;
            self.check_ok(&wc[..n])?;
            sent |= wc[..n].iter().any(|w| !w.is_recv && w.wr_id == u64::from(i));
            match op {
                Op::Write => {
                    self.mr.read(size - 1, &mut b)?;
                    if b[0] == Self::mark(i) {
                        return Ok(sent);
                    }
                }
                _ => {
                    if wc[..n].iter().any(|w| w.is_recv) {
                        self.post_recvs(1)?;
                        return Ok(sent);
                    }
                }
            }
            if n == 0 {
                self.idle_poll();
            }
            if start.elapsed() > STALL {
                bail!("no answer within {STALL:?}: the peer stopped or packets are lost");
            }
        }
    }
}

/// The best message rate over any stretch of the run covering at least a
/// quarter of its messages and two send-queue depths (shorter stretches
/// measure how completions were batched, not bandwidth).
fn peak_rate(marks: &[(f64, u32)], iters: u32) -> f64 {
    let span = (iters / 4).max(2 * TX_DEPTH).min(iters).max(1);
    let mut best = 0f64;
    let mut j = 0;
    for i in 0..marks.len() {
        while j + 1 < i && marks[i].1 - marks[j + 1].1 >= span {
            j += 1;
        }
        let (dt, dn) = (marks[i].0 - marks[j].0, marks[i].1 - marks[j].1);
        if dn >= span && dt > 0.0 {
            best = best.max(f64::from(dn) / dt);
        }
    }
    best
}

/// A bandwidth measurement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BwResult {
    pub(crate) iters: u32,
    /// Bytes per second over the best signaled batch.
    pub(crate) peak_bps: f64,
    /// Bytes per second over the run.
    pub(crate) avg_bps: f64,
    /// Messages per second.
    pub(crate) msg_rate: f64,
}

/// Latency statistics in microseconds, as perftest reports them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LatStats {
    pub(crate) min: f64,
    pub(crate) max: f64,
    /// The median.
    pub(crate) typical: f64,
    pub(crate) avg: f64,
    pub(crate) stdev: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
}

impl LatStats {
    pub(crate) fn from_samples(mut s: Vec<f64>) -> Self {
        if s.is_empty() {
            return Self {
                min: 0.0,
                max: 0.0,
                typical: 0.0,
                avg: 0.0,
                stdev: 0.0,
                p99: 0.0,
                p999: 0.0,
            };
        }
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let avg = s.iter().sum::<f64>() / n as f64;
        let var = s.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
        let pct = |p: f64| s[((n as f64 * p).ceil() as usize).clamp(1, n) - 1];
        Self {
            min: s[0],
            max: s[n - 1],
            typical: s[n / 2],
            avg,
            stdev: var.sqrt(),
            p99: pct(0.99),
            p999: pct(0.999),
        }
    }
}
