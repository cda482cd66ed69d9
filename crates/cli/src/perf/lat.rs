//! The latency tests.

use super::report::*;
use super::*;

/// Spins until the byte at `off` equals `want`, driving progress.
pub(super) fn await_byte(res: &Res, off: usize, want: u8) -> Result<()> {
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
pub(super) struct Poller {
    pub(super) recvs: std::collections::VecDeque<Completion>,
    pub(super) sends: u64,
}

impl Poller {
    /// The next completion of the wanted kind (send or receive).
    pub(super) fn next(&mut self, res: &Res, recv: bool) -> Result<Completion> {
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
pub(super) fn send_lat(su: &Setup, a: &Args, res: &Res, oob: &mut Oob, me: &[Dest]) -> Result<()> {
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
