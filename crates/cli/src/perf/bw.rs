//! The bandwidth tests.

use super::report::*;
use super::*;

/// The requester's bandwidth run over every QP.
pub(super) fn bw_client(
    su: &Setup,
    a: &Args,
    res: &Res,
    rem: &[Dest],
    size: usize,
) -> Result<BwRep> {
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

/// ib_write_bw / ib_read_bw / ib_atomic_bw.
pub(super) fn rdma_bw(su: &Setup, a: &Args, res: &Res, oob: &mut Oob, me: &[Dest]) -> Result<()> {
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

/// ib_send_bw.
pub(super) fn send_bw(su: &Setup, a: &Args, res: &Res, oob: &mut Oob, me: &[Dest]) -> Result<()> {
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
pub(super) fn send_server(su: &Setup, a: &Args, res: &Res, size: usize, rx: u64) -> Result<BwRep> {
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
