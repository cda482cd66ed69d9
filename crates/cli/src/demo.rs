//! `uroce demo`: two processes on this host (127.0.0.1 and 127.0.0.2)
//! connect an RC QP over UDP and run every RC operation, printing what they
//! did and how long it took. The parent starts the server process itself
//! and exchanges connection details over the child's stdin/stdout.

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use uroce::{
    Access, Completion, Cq, Device, DeviceConfig, Mr, Qp, QpCaps, QpInitAttr, QpType, RecvWr,
    SendWr, WcOpcode, WcStatus, WrOpcode,
};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Iterations per latency measurement.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u32,
    /// UDP port both devices use.
    #[arg(short, long, default_value_t = 4791)]
    port: u16,
    /// Internal: run as the passive server side.
    #[arg(long, hide = true)]
    serve: bool,
}

const REGION: usize = 1 << 20;
/// The server word the atomics work on (untouched by the WRITEs).
const ATOMIC_WORD: u64 = (REGION - 4096) as u64;
const ALL: Access = Access(1 | 2 | 4 | 8);

/// Connection details exchanged out of band.
struct Info {
    qpn: u32,
    psn: u32,
    addr: u64,
    rkey: u32,
    /// The second RC QP (on the server: the one on the SRQ).
    qpn2: u32,
    /// The UD QP.
    ud_qpn: u32,
}

impl Info {
    fn line(&self) -> String {
        format!(
            "{:06x} {:06x} {:016x} {:08x} {:06x} {:06x}",
            self.qpn, self.psn, self.addr, self.rkey, self.qpn2, self.ud_qpn
        )
    }
    fn parse(s: &str) -> Result<Self> {
        let f: Vec<&str> = s.split_whitespace().collect();
        if f.len() != 6 {
            bail!("bad connection line {s:?}");
        }
        Ok(Self {
            qpn: u32::from_str_radix(f[0], 16)?,
            psn: u32::from_str_radix(f[1], 16)?,
            addr: u64::from_str_radix(f[2], 16)?,
            rkey: u32::from_str_radix(f[3], 16)?,
            qpn2: u32::from_str_radix(f[4], 16)?,
            ud_qpn: u32::from_str_radix(f[5], 16)?,
        })
    }
}

struct Side {
    ctx: uroce::Context,
    pd: uroce::Pd,
    qp: Qp,
    cq: Cq,
    mr: Mr,
    psn: u32,
}

const SRQ_MSGS: u64 = 16;
const UD_QKEY: u32 = 0x1234_5678;

/// A second RC QP (on an SRQ when given) and a UD QP, on the side's CQ.
fn extra_qps(s: &Side, srq: Option<&uroce::Srq>) -> Result<(Qp, Qp)> {
    let cap = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let attr = |qp_type, srq| QpInitAttr {
        send_cq: &s.cq,
        recv_cq: &s.cq,
        cap,
        qp_type,
        sq_sig_all: true,
        srq,
    };
    let rc2 = s.pd.create_qp(&attr(QpType::Rc, srq))?;
    let ud = s.pd.create_qp(&attr(QpType::Ud, None))?;
    uroce::activate_ud(&ud, UD_QKEY, s.psn)?;
    Ok((rc2, ud))
}

fn open(addr: &str, port: u16) -> Result<Side> {
    let ctx =
        Device::from_config(DeviceConfig { name: "uroce0".into(), addr: addr.parse()?, port })
            .open()
            .with_context(|| format!("opening a device on {addr}:{port}"))?;
    let pd = ctx.alloc_pd()?;
    let mr = pd.alloc_mr(REGION, ALL)?;
    let cq = ctx.create_cq(256)?;
    let cap = QpCaps {
        max_send_wr: 128,
        max_recv_wr: 128,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap,
        qp_type: QpType::Rc,
        sq_sig_all: true,
        srq: None,
    })?;
    let psn = (std::process::id().wrapping_mul(2_654_435_761)) & 0xff_ffff;
    Ok(Side { ctx, pd, qp, cq, mr, psn })
}

fn wait(cq: &Cq) -> Result<Completion> {
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false)];
    let start = Instant::now();
    loop {
        if cq.poll(&mut wc)? == 1 {
            if wc[0].status != WcStatus::Success {
                bail!("work request {} failed: {}", wc[0].wr_id, wc[0].status.as_str());
            }
            return Ok(wc[0]);
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("no completion within 10 s (is the peer alive?)");
        }
    }
}

pub(crate) fn run(a: &Args) -> Result<ExitCode> {
    if a.serve { serve(a) } else { client(a) }
}

fn serve(a: &Args) -> Result<ExitCode> {
    let s = open("127.0.0.2", a.port)?;
    // An SRQ-backed receiver and a UD QP beside the main RC QP.
    let srq = s.ctx.create_srq(&uroce::SrqAttr { max_wr: 64, max_sge: 1, srq_limit: 0 })?;
    let (rc2, ud) = extra_qps(&s, Some(&srq))?;
    let me = Info {
        qpn: s.qp.qpn(),
        psn: s.psn,
        addr: s.mr.addr(),
        rkey: s.mr.rkey(),
        qpn2: rc2.qpn(),
        ud_qpn: ud.qpn(),
    };
    println!("{}", me.line());
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let peer = Info::parse(&line)?;
    let client: IpAddr = "127.0.0.1".parse()?;
    uroce::connect(&s.qp, client, a.port, peer.qpn, s.psn, peer.psn, ALL)?;
    uroce::connect(&rc2, client, a.port, peer.qpn2, s.psn, peer.psn, ALL)?;
    // Receives: the closing SEND at 512 KiB, SRQ messages above it, the UD
    // datagram (GRH + payload) at 768 KiB. A SEND arriving before its
    // receive is posted is answered with RNR NAKs and retried.
    s.qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[s.mr.sge(REGION / 2, 4096)?] }])?;
    for i in 0..SRQ_MSGS {
        srq.post_recv(&[RecvWr {
            wr_id: 100 + i,
            sgl: &[s.mr.sge(REGION / 2 + 4096 * (1 + i as usize), 4096)?],
        }])?;
    }
    let ud_buf = REGION * 3 / 4;
    ud.post_recv(&[RecvWr { wr_id: 200, sgl: &[s.mr.sge(ud_buf, 40 + 4096)?] }])?;
    // Passive for RC: the progress thread serves WRITE, READ and atomics.
    let (mut srq_got, mut ud_done, mut closing) = (0, false, None);
    while srq_got < SRQ_MSGS || !ud_done || closing.is_none() {
        let wc = wait(&s.cq)?;
        if wc.qp_num == rc2.qpn() {
            srq_got += 1;
        } else if wc.qp_num == ud.qpn() && wc.is_recv {
            let mut grh = [0u8; 40];
            s.mr.read(ud_buf, &mut grh)?;
            let mut attr = uroce::AhAttr::from_wc(&wc, &grh)?;
            attr.port = a.port;
            let ah = s.pd.create_ah(&attr)?;
            let reply = b"pong from the server's UD QP";
            s.mr.write(ud_buf + 4096 + 64, reply)?;
            let sge = [s.mr.sge(ud_buf + 4096 + 64, reply.len() as u32)?];
            ud.post_send(&[SendWr {
                wr_id: 201,
                sgl: &sge,
                ud: Some(ah.dest(wc.src_qp, UD_QKEY)),
                ..SendWr::default()
            }])?;
            println!(
                "server: UD datagram of {} bytes from QP {:#x} at {} (GRH), replied through an AH made from it",
                wc.byte_len - 40,
                wc.src_qp,
                attr.dst
            );
        } else if wc.qp_num == ud.qpn() {
            ud_done = true;
        } else if wc.qp_num == s.qp.qpn() && wc.is_recv {
            closing = Some(wc);
        }
    }
    println!("server: {srq_got} SENDs on QP {:#x} landed in the shared receive queue", rc2.qpn());
    let wc = closing.context("closing SEND")?;
    let mut msg = vec![0u8; wc.byte_len as usize];
    s.mr.read(REGION / 2, &mut msg)?;
    println!("server: received SEND of {} bytes: {:?}", wc.byte_len, String::from_utf8_lossy(&msg));
    Ok(ExitCode::SUCCESS)
}

fn client(a: &Args) -> Result<ExitCode> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["demo", "--serve", "--port", &a.port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the server process")?;
    let mut out = BufReader::new(child.stdout.take().context("server stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    let peer = Info::parse(&line).context("server did not start")?;
    let c = open("127.0.0.1", a.port)?;
    let (rc2, ud) = extra_qps(&c, None)?;
    let me = Info {
        qpn: c.qp.qpn(),
        psn: c.psn,
        addr: c.mr.addr(),
        rkey: c.mr.rkey(),
        qpn2: rc2.qpn(),
        ud_qpn: ud.qpn(),
    };
    writeln!(child.stdin.as_mut().context("server stdin")?, "{}", me.line())?;
    let server: IpAddr = "127.0.0.2".parse()?;
    uroce::connect(&c.qp, server, a.port, peer.qpn, c.psn, peer.psn, ALL)?;
    uroce::connect(&rc2, server, a.port, peer.qpn2, c.psn, peer.psn, ALL)?;
    println!(
        "uroce demo: client 127.0.0.1 QP {:#x} <-> server 127.0.0.2 QP {:#x} (RC over UDP port {})",
        me.qpn, peer.qpn, a.port
    );

    let n = a.iters.max(1);
    let pattern: Vec<u8> = (0..REGION).map(|i| (i * 7 + 3) as u8).collect();
    c.mr.write(0, &pattern)?;
    let rw = |op: WrOpcode, len: u32, off: u64| -> Result<Completion> {
        let sge = [c.mr.sge(0, len)?];
        let local = if op == WrOpcode::RdmaRead { [c.mr.sge(REGION / 2, len)?] } else { sge };
        c.qp.post_send(&[SendWr {
            wr_id: 7,
            opcode: op,
            sgl: &local,
            remote_addr: peer.addr + off,
            rkey: peer.rkey,
            ..SendWr::default()
        }])?;
        wait(&c.cq)
    };
    let time = |what: &str, bytes: u64, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        f()?; // warm-up
        let t = Instant::now();
        for _ in 0..n {
            f()?;
        }
        let per = t.elapsed() / n;
        let gbps = if bytes > 0 {
            format!(", {:.2} GB/s", bytes as f64 / per.as_secs_f64() / 1e9)
        } else {
            String::new()
        };
        println!("  {what:<34} {n:>6} x  {:>9.2} us each{gbps}", per.as_secs_f64() * 1e6);
        Ok(())
    };
    println!("operation                              iters     time");
    time("RDMA WRITE 8 B (to completion)", 8, &mut || {
        rw(WrOpcode::RdmaWrite, 8, 4096).map(|_| ())
    })?;
    time("RDMA READ 8 B", 8, &mut || rw(WrOpcode::RdmaRead, 8, 4096).map(|_| ()))?;
    time("RDMA WRITE 64 KiB", 65536, &mut || rw(WrOpcode::RdmaWrite, 65536, 0).map(|_| ()))?;
    time("RDMA READ 64 KiB", 65536, &mut || rw(WrOpcode::RdmaRead, 65536, 0).map(|_| ()))?;
    // Atomics on a zeroed server word: FetchAdd 1 (n + 1 times with the
    // warm-up), then CmpSwap expecting exactly that count.
    let mut faa = || -> Result<()> {
        let sge = [c.mr.sge(REGION - 8, 8)?];
        c.qp.post_send(&[SendWr {
            wr_id: 9,
            opcode: WrOpcode::AtomicFetchAndAdd,
            sgl: &sge,
            remote_addr: peer.addr + ATOMIC_WORD,
            rkey: peer.rkey,
            compare_add: 1,
            ..SendWr::default()
        }])?;
        wait(&c.cq).map(|_| ())
    };
    time("ATOMIC FETCH_AND_ADD", 0, &mut faa)?;
    let expect = u64::from(n) + 1;
    let sge = [c.mr.sge(REGION - 8, 8)?];
    c.qp.post_send(&[SendWr {
        wr_id: 10,
        opcode: WrOpcode::AtomicCmpAndSwp,
        sgl: &sge,
        remote_addr: peer.addr + ATOMIC_WORD,
        rkey: peer.rkey,
        compare_add: expect,
        swap: 0xc0ffee,
        ..SendWr::default()
    }])?;
    let t = Instant::now();
    wait(&c.cq)?;
    let mut got = [0u8; 8];
    c.mr.read(REGION - 8, &mut got)?;
    println!(
        "  ATOMIC CMP_AND_SWP                      1 x  {:>9.2} us   ({} fetch-adds counted, then swapped to 0xc0ffee)",
        t.elapsed().as_secs_f64() * 1e6,
        u64::from_ne_bytes(got)
    );
    if u64::from_ne_bytes(got) != expect {
        bail!(
            "atomics disagree: server word was {} before the swap, expected {expect}",
            u64::from_ne_bytes(got)
        );
    }
    // Streaming bandwidth: keep 8 WRITEs of 64 KiB / 1 MiB in flight.
    for &size in &[65536u32, REGION as u32] {
        // 256 MiB per size at the default -n, less for quick runs.
        let total_ops = ((256u64 << 20) / u64::from(size)).min(u64::from(n) * 4).max(8);
        let sge = [c.mr.sge(0, size)?];
        let wr = SendWr {
            wr_id: 20,
            opcode: WrOpcode::RdmaWrite,
            sgl: &sge,
            remote_addr: peer.addr,
            rkey: peer.rkey,
            ..SendWr::default()
        };
        let t = Instant::now();
        let (mut posted, mut done) = (0u64, 0u64);
        let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 16];
        while done < total_ops {
            while posted < total_ops && posted - done < 8 {
                c.qp.post_send(&[wr])?;
                posted += 1;
            }
            let k = c.cq.poll(&mut wc)?;
            for w in &wc[..k] {
                if w.status != WcStatus::Success {
                    bail!("WRITE failed: {}", w.status.as_str());
                }
            }
            done += k as u64;
            if t.elapsed() > Duration::from_secs(60) {
                bail!("bandwidth run stalled");
            }
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "  RDMA WRITE {:<7} x8 in flight   {total_ops:>6} x  {:>9.2} us each, {:.2} GB/s",
            if size == 65536 { "64 KiB" } else { "1 MiB" },
            secs * 1e6 / total_ops as f64,
            (total_ops * u64::from(size)) as f64 / secs / 1e9
        );
    }
    // Verify WRITE and READ moved the right bytes, then say goodbye.
    let mut back = vec![0u8; 65536];
    c.mr.read(REGION / 2, &mut back)?;
    if back != pattern[..65536] {
        bail!("READ returned different bytes than WRITE stored");
    }
    // SENDs on the second RC QP: the server takes them from its SRQ.
    let sge = [c.mr.sge(0, 1024)?];
    for i in 0..SRQ_MSGS {
        rc2.post_send(&[SendWr { wr_id: 300 + i, sgl: &sge, ..SendWr::default() }])?;
    }
    for _ in 0..SRQ_MSGS {
        wait(&c.cq)?;
    }
    println!("  SEND 1 KiB to an SRQ-backed QP       {SRQ_MSGS} x  done");
    // A UD datagram to the server's UD QP; its reply comes back here.
    let ud_buf = REGION * 3 / 4;
    ud.post_recv(&[RecvWr { wr_id: 400, sgl: &[c.mr.sge(ud_buf, 40 + 4096)?] }])?;
    let mut attr = uroce::AhAttr::new(server);
    attr.port = a.port;
    let ah = c.pd.create_ah(&attr)?;
    let ping = b"ping over UD";
    c.mr.write(ud_buf + 8192, ping)?;
    let sge = [c.mr.sge(ud_buf + 8192, ping.len() as u32)?];
    let t = Instant::now();
    ud.post_send(&[SendWr {
        wr_id: 401,
        sgl: &sge,
        ud: Some(ah.dest(peer.ud_qpn, UD_QKEY)),
        ..SendWr::default()
    }])?;
    let (mut sent, mut reply) = (false, None);
    while !sent || reply.is_none() {
        let wc = wait(&c.cq)?;
        if wc.is_recv { reply = Some(wc) } else { sent = true }
    }
    let reply = reply.context("UD reply")?;
    let mut text = vec![0u8; reply.byte_len as usize - 40];
    c.mr.read(ud_buf + 40, &mut text)?;
    println!(
        "  UD SEND + reply                        1 x  {:>9.2} us   (from QP {:#x}: {:?})",
        t.elapsed().as_secs_f64() * 1e6,
        reply.src_qp,
        String::from_utf8_lossy(&text)
    );
    let msg = b"hello from uroce";
    c.mr.write(0, msg)?;
    let sge = [c.mr.sge(0, msg.len() as u32)?];
    c.qp.post_send(&[SendWr {
        wr_id: 11,
        opcode: WrOpcode::Send,
        sgl: &sge,
        ..SendWr::default()
    }])?;
    wait(&c.cq)?;
    println!("  SEND {} B                              done; data verified", msg.len());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest)?;
    print!("{rest}");
    let status = child.wait()?;
    if !status.success() {
        bail!("server exited with {status}");
    }
    let st = c.ctx.stats();
    println!(
        "client: {} packets sent, {} received, {} retransmissions, {} send errors, {} ICRC errors",
        st.sent_pkts, st.rcvd_pkts, st.retransmits, st.send_err, st.icrc_errors
    );
    Ok(ExitCode::SUCCESS)
}
