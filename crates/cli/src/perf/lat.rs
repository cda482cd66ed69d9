//! The latency tests.

use super::report::*;
use super::*;

/// Spins until the byte at `off` equals `want`, driving progress; `false`
/// when `deadline` (-D) passes first.
pub(super) fn await_byte(
    res: &Res,
    off: usize,
    want: u8,
    deadline: Option<Instant>,
) -> Result<bool> {
    let start = Instant::now();
    let mut b = [0u8];
    let mut wc = common::wc_array::<4>();
    loop {
        let n = res.cq.poll(&mut wc)?;
        check(&wc[..n])?;
        res.mr.read(off, &mut b)?;
        if b[0] == want {
            return Ok(true);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
        if start.elapsed() > STALL {
            bail!("no message from the peer within {STALL:?}: it stopped or packets are lost");
        }
    }
}

/// Completions of one kind (send or receive), the others kept for later.
#[derive(Default)]
pub(super) struct Poller(common::Stash);

impl Poller {
    /// The next completion of the wanted kind (send or receive).
    pub(super) fn next(&mut self, res: &Res, recv: bool) -> Result<Completion> {
        self.next_until(res, recv, None)?.ok_or_else(|| anyhow!("no deadline, no timeout"))
    }

    /// [`Poller::next`], `None` once `deadline` (-D) passes.
    pub(super) fn next_until(
        &mut self,
        res: &Res,
        recv: bool,
        deadline: Option<Instant>,
    ) -> Result<Option<Completion>> {
        let start = Instant::now();
        let w = self.0.next(
            &res.cq,
            |w| w.is_recv == recv,
            || {
                if start.elapsed() > STALL {
                    bail!("no completion within {STALL:?}: the peer stopped or packets are lost");
                }
                Ok(deadline.is_none_or(|d| Instant::now() < d))
            },
        )?;
        if let Some(w) = &w {
            check(std::slice::from_ref(w))?;
        }
        Ok(w)
    }
}

/// ib_write_lat / ib_read_lat / ib_atomic_lat.
pub(super) fn rdma_lat(su: &Setup, a: &Args, res: &Res, oob: &mut Oob, me: &[Dest]) -> Result<()> {
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
    let duration = a.duration.map(Duration::from_secs);
    let iters = if duration.is_some() { u64::MAX } else { su.iters };
    let mut poller = Poller::default();
    for &size in &su.sizes {
        let mut tposted = Vec::with_capacity(su.iters as usize);
        let sge = [res.mr.sge(0, size as u32)?];
        let start = Instant::now();
        let deadline = duration.map(|d| start + d);
        if verb == Verb::Write {
            // Ping-pong; the server writes first. The last byte carries
            // the sequence number.
            let (mut scnt, mut rcnt) = (0u64, 0u64);
            while scnt < iters || rcnt < iters {
                // The server writes first.
                if rcnt < iters && (su.client || scnt >= 1) {
                    rcnt += 1;
                    if !await_byte(res, recv_off + size - 1, rcnt as u8, deadline)? {
                        break;
                    }
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
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
            lat_result(a, size, &tposted, 2.0, start, duration);
        } else {
            for k in 0..iters {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                let mut w = wr_for(su, a, &sge, r, 0, k);
                w.flags = SendFlags::SIGNALED;
                tposted.push(Instant::now());
                res.qps[0].post_send(&[w]).context("Couldn't post send")?;
                poller.next(res, false)?;
            }
            lat_result(a, size, &tposted, 1.0, start, duration);
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
pub(super) fn send_lat(su: &Setup, a: &Args, res: &Res, oob: &mut Oob, me: &[Dest]) -> Result<()> {
    let quiet = a.output.is_some();
    let rem = exchange(su, res, oob, me, quiet)?;
    let r = &rem[0];
    lat_header(a);
    let duration = a.duration.map(Duration::from_secs);
    let iters = if duration.is_some() { u64::MAX } else { su.iters };
    let rx = u64::from(RX_DEPTH).min(iters);
    let mut poller = Poller::default();
    for &size in &su.sizes {
        post_recvs(res, su, 0, rx)?;
        let mut posted = rx;
        oob.hs(&me[0])?;
        let sge = [res.mr.sge(0, size as u32)?];
        let mut tposted = Vec::with_capacity(su.iters as usize);
        let (mut scnt, mut rcnt) = (0u64, 0u64);
        let start = Instant::now();
        let deadline = duration.map(|d| start + d);
        while scnt < iters || rcnt < iters {
            // The client sends first.
            if rcnt < iters && (!su.client || scnt >= 1) {
                let Some(w) = poller.next_until(res, true, deadline)? else { break };
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
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
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
        lat_result(a, size, &tposted, 2.0, start, duration);
    }
    if !quiet {
        println!("{RESULT_LINE}");
    }
    oob.close(&me[0])
}

/// Prints a latency row: perftest's statistics, or with -D the average
/// over the posts inside the sample window (a quarter of the run kept as
/// a margin at each end) and the transactions per second.
fn lat_result(
    a: &Args,
    size: usize,
    tposted: &[Instant],
    rtt_factor: f64,
    start: Instant,
    d: Option<Duration>,
) {
    let Some(d) = d else {
        lat_row(a, &lat_stats(size, tposted, rtt_factor));
        return;
    };
    let m = d / 4;
    let win: Vec<&Instant> = tposted
        .iter()
        .filter(|t| t.duration_since(start) >= m && t.duration_since(start) <= d - m)
        .collect();
    let (n, secs) = match (win.first(), win.last()) {
        (Some(f), Some(l)) if win.len() > 1 => {
            ((win.len() - 1) as f64, l.duration_since(**f).as_secs_f64())
        }
        _ => (0.0, 0.0),
    };
    let (avg, tps) = if n > 0.0 { (secs * 1e6 / n / rtt_factor, n / secs) } else { (0.0, 0.0) };
    if a.output == Some(Output::latency) {
        println!("{avg:.6}");
    } else {
        println!(" {:<7}       {}            {:<7.2}        {:<7.2}", size, n as u64, avg, tps);
    }
}
