//! What perftest prints: the header block, address lines, and the
//! bandwidth and latency tables with their statistics.

use super::*;

pub(super) fn verb_name(su: &Setup, a: &Args) -> String {
    match su.test.verb() {
        Verb::Send => "Send".into(),
        Verb::Write => "RDMA_Write".into(),
        Verb::Read => "RDMA_Read".into(),
        Verb::Atomic => format!("Atomic {:?}", a.atomic_type),
    }
}

pub(super) fn print_info(su: &Setup, a: &Args, res: &Res) {
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
    if su.rdma_cm {
        println!(" rdma_cm QPs\t : ON");
        println!(" Data ex. method : rdma_cm");
    } else {
        println!(" rdma_cm QPs\t : OFF");
        println!(" Data ex. method : Ethernet");
    }
    println!("{RESULT_LINE}");
}

pub(super) fn print_dest(who: &str, d: &Dest, verb: Verb) {
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

/// One bandwidth row, in the units it is printed in.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct BwRep {
    pub(super) size: u64,
    pub(super) iters: u64,
    pub(super) peak: f64,
    pub(super) avg: f64,
    pub(super) rate: f64,
}

pub(super) fn bw_header(a: &Args) {
    if a.output.is_some() {
        return;
    }
    let unit = if a.report_gbits { "Gb/sec" } else { "MB/sec" };
    println!("{RESULT_LINE}");
    println!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
}

pub(super) fn bw_row(a: &Args, r: &BwRep) {
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
pub(super) fn unit(a: &Args, bytes_per_sec: f64) -> f64 {
    bytes_per_sec / if a.report_gbits { 125_000_000.0 } else { 1_048_576.0 }
}

/// perftest's BW peak: the best per-message time over any run of messages
/// from a post to a later completion point.
pub(super) fn peak(
    tposted: &[Instant],
    tcompleted: &[(u64, Instant)],
    size: usize,
    cq_mod: u32,
) -> f64 {
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
pub(super) fn xchg_reports(oob: &mut Oob, mine: &BwRep) -> Result<BwRep> {
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

/// perftest's latency statistics over `tposted` stamps: `iters - 1`
/// deltas divided by `rtt_factor`, the two largest dropped, the deviation
/// truncated to whole microseconds before squaring (as perftest does).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LatRep {
    pub(super) size: u64,
    pub(super) iters: u64,
    pub(super) min: f64,
    pub(super) max: f64,
    pub(super) typical: f64,
    pub(super) avg: f64,
    pub(super) stdev: f64,
    pub(super) p99: f64,
    pub(super) p999: f64,
}

pub(super) fn lat_stats(size: usize, tposted: &[Instant], rtt_factor: f64) -> LatRep {
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

pub(super) fn lat_header(a: &Args) {
    if a.output.is_some() {
        return;
    }
    println!("{RESULT_LINE}");
    if a.duration.is_some() {
        println!(" #bytes        #iterations       t_avg[usec]    tps average");
        return;
    }
    println!(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
    );
}

pub(super) fn lat_row(a: &Args, r: &LatRep) {
    if a.output == Some(Output::latency) {
        println!("{:.6}", r.avg);
        return;
    }
    println!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        r.size, r.iters, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999
    );
}
