//! Loss recovery for the RC requester: the send window (Reno-style
//! congestion control in PSNs) and the round-trip estimate that sets the
//! retransmission probe timer.
//!
//! IBTA's Local ACK Timeout (4.096 µs × 2^`timeout`, 67 ms at the usual
//! 14) is the time without progress after which a *transport retry* is
//! spent; `retry_cnt` of them and the WR fails with RETRY_EXC_ERR. That
//! budget is kept exactly. Between those deadlines the requester also
//! resends after a timeout derived from the measured round trip (RFC 6298's
//! estimator, never above the QP's timeout), so that a lost tail packet or
//! ACK costs a few round trips instead of 67 ms. A probe spends no retry.

use core::time::Duration;

use uroce_wire::Psn;

use crate::Instant;

/// The congestion window after a retransmission timeout.
pub(crate) const MIN_CWND: u32 = 8;

/// PSNs the window grows by per window of PSNs acknowledged above the
/// slow-start threshold. Reno's 1 suits a WAN shared with strangers; on a
/// LAN with a 128-PSN window it leaves random loss of 1 in 1000 packets
/// (which halves the window about every 1000 PSNs) holding the window
/// near half for good. 8 gets back from half to whole in 8 windows.
const CA_STEPS: u32 = 8;

/// The shortest probe timeout: a scheduler hiccup on a busy host must not
/// look like loss.
const RTO_MIN: Duration = Duration::from_millis(1);

/// The longest probe timeout, whatever the QP's timeout (also with none,
/// `timeout` 0: wait for ever, but keep resending). A probe spends no
/// retry, so probing sooner than a long Local ACK Timeout (the kernel CM's
/// 19 is 2.1 s) costs a resend at most; waiting the whole timeout would
/// stall the QP for seconds after a peer starved of CPU, or after a first
/// packet lost before any round trip was measured.
const RTO_MAX: Duration = Duration::from_millis(100);

/// Window and round-trip state of one requester.
#[derive(Debug, Clone)]
pub(crate) struct Recovery {
    /// Congestion window in PSNs, `MIN_CWND ..= max` (or `max` if smaller).
    cwnd: u32,
    /// Slow-start threshold: below it the window grows by the PSNs each
    /// ACK covers, above it by [`CA_STEPS`] PSNs per window.
    ssthresh: u32,
    /// PSNs acknowledged towards the next one-PSN step above `ssthresh`.
    growth: u32,
    /// The send window the QP was created with (`max_unacked_psns`).
    max: u32,
    srtt: Option<Duration>,
    rttvar: Duration,
    /// The PSN being timed and when it was sent (one sample at a time;
    /// dropped on any retransmission: Karn's rule).
    sample: Option<(Psn, Instant)>,
    /// Consecutive probe timeouts without progress (doubles the timeout).
    backoff: u32,
}

impl Recovery {
    pub(crate) fn new(max_unacked_psns: u32) -> Self {
        let max = max_unacked_psns.max(1);
        Self {
            cwnd: max,
            ssthresh: max,
            growth: 0,
            max,
            srtt: None,
            rttvar: Duration::ZERO,
            sample: None,
            backoff: 0,
        }
    }

    /// PSNs the requester may have outstanding now.
    pub(crate) fn cwnd(&self) -> u32 {
        self.cwnd
    }

    fn floor(&self) -> u32 {
        MIN_CWND.min(self.max)
    }

    /// `n` more PSNs were acknowledged: the window grows.
    pub(crate) fn on_acked(&mut self, n: u32) {
        self.backoff = 0;
        if self.cwnd < self.ssthresh {
            self.cwnd = self.cwnd.saturating_add(n).min(self.ssthresh);
            return;
        }
        self.growth = self.growth.saturating_add(n);
        let step = (self.cwnd / CA_STEPS).max(1);
        while self.growth >= step && self.cwnd < self.max {
            self.growth -= step;
            self.cwnd += 1;
        }
        if self.cwnd >= self.max {
            self.growth = 0;
        }
    }

    /// A loss the peer told us of (a PSN sequence NAK or a response gap):
    /// multiplicative decrease.
    pub(crate) fn on_loss(&mut self) {
        self.ssthresh = (self.cwnd / 2).max(self.floor());
        self.cwnd = self.ssthresh;
        self.growth = 0;
        self.sample = None;
    }

    /// A retransmission timeout: restart from the minimum window. The
    /// threshold halves once per run of timeouts (later ones in the same
    /// run find the window already at the floor).
    pub(crate) fn on_timeout(&mut self) {
        if self.backoff == 0 {
            self.ssthresh = (self.cwnd / 2).max(self.floor());
        }
        self.cwnd = self.floor();
        self.growth = 0;
        self.sample = None;
        self.backoff = (self.backoff + 1).min(16);
    }

    /// A probe timeout (before the Local ACK Timeout): often a peer that
    /// was descheduled, not a lost tail, so the window halves instead of
    /// restarting from the floor; the timeout doubles.
    pub(crate) fn on_probe(&mut self) {
        if self.backoff == 0 {
            self.ssthresh = (self.cwnd / 2).max(self.floor());
        }
        self.cwnd = (self.cwnd / 2).max(self.floor());
        self.growth = 0;
        self.sample = None;
        self.backoff = (self.backoff + 1).min(16);
    }

    /// Probe timeouts in a row without progress.
    pub(crate) fn timeouts_in_run(&self) -> u32 {
        self.backoff
    }

    /// A probe resent only the newest packet (see `Qp::tail_probe`): the
    /// window stays (nothing says a packet was lost; a NAK that says so
    /// halves it), the timeout doubles, and the sample in flight can no
    /// longer be attributed.
    pub(crate) fn on_tail_probe(&mut self) {
        self.sample = None;
        self.backoff = (self.backoff + 1).min(16);
    }

    /// A go-back resends PSNs: the sample in flight can no longer be
    /// attributed (Karn's rule).
    pub(crate) fn on_retransmit(&mut self) {
        self.sample = None;
    }

    /// A new (never sent) packet that asks for an acknowledgement left at
    /// `now`: time it, unless a sample is already running.
    pub(crate) fn on_sent(&mut self, psn: Psn, now: Instant) {
        if self.sample.is_none() {
            self.sample = Some((psn, now));
        }
    }

    /// Everything before `acked` is acknowledged at `now`.
    pub(crate) fn on_ack_through(&mut self, acked: Psn, now: Instant) {
        let Some((psn, sent)) = self.sample else { return };
        if !psn.is_before(acked) {
            return;
        }
        self.sample = None;
        let r = now.saturating_since(sent);
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let dev = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + dev) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
    }

    /// The probe timeout: the estimate (with backoff), within `RTO_MIN`
    /// and the QP's own timeout (`limit`; `None` = infinite), at most
    /// `RTO_MAX`.
    pub(crate) fn rto(&self, limit: Option<Duration>) -> Duration {
        let cap = limit.unwrap_or(RTO_MAX).min(RTO_MAX);
        let Some(srtt) = self.srtt else { return cap };
        let base = (srtt + self.rttvar * 4).max(RTO_MIN);
        base.saturating_mul(1 << self.backoff.min(16)).min(cap)
    }

    /// The smoothed round trip, once measured.
    pub(crate) fn srtt(&self) -> Option<Duration> {
        self.srtt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_recovers_after_a_timeout() {
        let mut r = Recovery::new(128);
        assert_eq!(r.cwnd(), 128);
        r.on_timeout();
        assert_eq!(r.cwnd(), MIN_CWND);
        // Slow start up to half the old window, then one PSN per window.
        let mut acks = 0;
        while r.cwnd() < 64 {
            r.on_acked(r.cwnd() / 2);
            acks += 1;
        }
        assert!(acks < 10, "{acks}");
        assert_eq!(r.cwnd(), 64);
        // Then CA_STEPS PSNs per window: 64 acknowledged PSNs add 8.
        for _ in 0..64 {
            r.on_acked(1);
        }
        assert_eq!(r.cwnd(), 64 + CA_STEPS);
        for _ in 0..100_000 {
            r.on_acked(8);
        }
        assert_eq!(r.cwnd(), 128);
    }

    #[test]
    fn loss_halves_and_never_goes_below_the_floor() {
        let mut r = Recovery::new(128);
        r.on_loss();
        assert_eq!(r.cwnd(), 64);
        for _ in 0..10 {
            r.on_loss();
        }
        assert_eq!(r.cwnd(), MIN_CWND);
        let mut small = Recovery::new(4);
        small.on_timeout();
        assert_eq!(small.cwnd(), 4);
    }

    #[test]
    fn rto_follows_the_round_trip_within_the_qp_timeout() {
        let t = |us: u64| Instant::from_nanos(us * 1000);
        let limit = Some(Duration::from_millis(67));
        let mut r = Recovery::new(128);
        assert_eq!(r.rto(limit), Duration::from_millis(67));
        r.on_sent(Psn::new(10), t(0));
        r.on_ack_through(Psn::new(10), t(5_000)); // not yet past PSN 10
        assert!(r.srtt().is_none());
        r.on_ack_through(Psn::new(11), t(5_000));
        assert_eq!(r.srtt(), Some(Duration::from_millis(5)));
        assert_eq!(r.rto(limit), Duration::from_millis(15));
        // Karn: a retransmission drops the running sample.
        r.on_sent(Psn::new(20), t(10_000));
        r.on_retransmit();
        r.on_ack_through(Psn::new(30), t(90_000));
        assert_eq!(r.srtt(), Some(Duration::from_millis(5)));
        // Backoff doubles, capped by the QP's timeout.
        r.on_probe();
        assert_eq!(r.rto(limit), Duration::from_millis(30));
        assert_eq!(r.cwnd(), 64, "a probe halves the window");
        for _ in 0..20 {
            r.on_timeout();
        }
        assert_eq!(r.rto(limit), Duration::from_millis(67));
        assert_eq!(r.rto(None), RTO_MAX);
        // A long QP timeout (the kernel CM's 19) does not make probes wait
        // seconds: before any sample, and however far backoff went.
        let long = Some(Duration::from_millis(2147));
        assert_eq!(Recovery::new(128).rto(long), RTO_MAX);
        assert_eq!(r.rto(long), RTO_MAX);
        // Tiny round trips still wait RTO_MIN.
        let mut fast = Recovery::new(128);
        fast.on_sent(Psn::new(1), t(0));
        fast.on_ack_through(Psn::new(2), t(10));
        assert_eq!(fast.rto(limit), RTO_MIN);
    }
}
