//! Holding an ACK for the reply it can travel with.
//!
//! When the application answers each request that reaches this QP with a
//! request of its own (a ping-pong: `ib_write_lat`, `ib_send_lat`, RPCs),
//! the ACK for the peer's request waits, up to [`HOLD`], for our next
//! request and leaves behind it in the same send. A software device gains
//! twice: one system call per message less, and, when each application
//! polls only its own CQ or spins on memory, the peer's poll loop receives
//! the ACK and our request together instead of needing its progress thread
//! woken for each (on a busy two-core machine that wake-up is the latency).
//!
//! IBTA allows it: a responder may coalesce ACKs, and the requester's
//! Local ACK Timeout (4.096 µs × 2^timeout, milliseconds in practice) is
//! far above [`HOLD`]; a QP configured with a short one holds for at most
//! a quarter of it. Only plain ACKs for new requests are held: NAKs, READ
//! responses, atomic ACKs and answers to duplicates go at once. A QP whose
//! application does not answer quickly never holds: holding starts after
//! [`STREAK`] posts in a row each followed a request by less than [`HOLD`],
//! and one hold that runs out ends it.

use core::time::Duration;

use crate::Instant;

/// The longest an ACK waits for a request to ride behind.
pub(crate) const HOLD: Duration = Duration::from_micros(200);

/// Replies in a row, each posted within [`HOLD`] of a request's arrival,
/// that make the QP hold its ACKs.
const STREAK: u8 = 2;

/// Per-QP state of the ACK hold.
#[derive(Debug, Default)]
pub(crate) struct AckHold {
    /// When the last new request that drew an ACK arrived.
    last_request: Option<Instant>,
    /// Replies in a row that followed a request within `HOLD`.
    streak: u8,
    /// The held ACK's deadline.
    until: Option<Instant>,
    /// A request left since the ACK was held: the ACK follows it.
    released: bool,
}

impl AckHold {
    /// A new request packet was accepted. One that arrives while an ACK
    /// is held means a stream, not a ping-pong (a ping-pong's peer waits
    /// for our reply): the ACK goes now, and holding stops until replies
    /// show the pattern again, so a window-limited sender never waits.
    pub(crate) fn on_request(&mut self) {
        if self.until.take().is_some() {
            self.released = false;
            self.streak = 0;
        }
    }

    /// A new request was accepted and its ACK queued, alone, at `now`:
    /// whether to hold that ACK (the QP is in a ping-pong).
    /// `ack_timeout`: the QP's Local ACK Timeout, if any; a hold stays
    /// under a quarter of it (the peer's is not known, ours is the hint).
    pub(crate) fn on_ack_queued(&mut self, now: Instant, ack_timeout: Option<Duration>) {
        self.last_request = Some(now);
        if self.streak >= STREAK && self.until.is_none() {
            let hold = ack_timeout.map_or(HOLD, |t| HOLD.min(t / 4));
            self.until = Some(now.saturating_add(hold));
            self.released = false;
        }
    }

    /// The application posted a send WR at `now`.
    pub(crate) fn on_post(&mut self, now: Instant) {
        let answered = self.last_request.is_some_and(|t| now.saturating_since(t) <= HOLD);
        self.streak = if answered { self.streak.saturating_add(1).min(STREAK) } else { 0 };
    }

    /// Whether an ACK is held at `now` (nothing has released it yet).
    pub(crate) fn holding(&self, now: Instant) -> bool {
        self.until.is_some_and(|t| now < t)
    }

    /// Whether a request went out since the hold began: the ACK leaves
    /// once the requester has nothing more to send.
    pub(crate) fn released(&self) -> bool {
        self.until.is_some() && self.released
    }

    /// A request packet left while an ACK was held.
    pub(crate) fn on_request_sent(&mut self) {
        if self.until.is_some() {
            self.released = true;
        }
    }

    /// The held ACK leaves (or was dropped). A hold that ran out without a
    /// reply to carry it ends the ping-pong.
    pub(crate) fn end(&mut self, now: Instant) {
        if let Some(t) = self.until.take()
            && !self.released
            && now >= t
        {
            self.streak = 0;
        }
        self.released = false;
    }

    /// Something other than a lone ACK must go (a NAK, a READ response, a
    /// duplicate's answer): stop holding, keep the streak.
    pub(crate) fn cancel(&mut self) {
        self.until = None;
        self.released = false;
    }

    /// The deadline to wake for, while an ACK is held.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Instant {
        Instant::from_nanos(n * 1000)
    }

    #[test]
    fn holds_only_after_a_streak_of_quick_replies() {
        let mut h = AckHold::default();
        h.on_ack_queued(us(0), None);
        assert!(!h.holding(us(1)), "no streak yet");
        h.on_post(us(5));
        h.on_ack_queued(us(20), None);
        assert!(!h.holding(us(21)), "one reply is not a streak");
        h.on_post(us(25));
        h.on_ack_queued(us(40), None);
        assert!(h.holding(us(41)));
        assert_eq!(h.deadline(), Some(us(40).saturating_add(HOLD)));
    }

    #[test]
    fn a_short_ack_timeout_shortens_the_hold() {
        let mut h = AckHold::default();
        for t in [0, 20] {
            h.on_ack_queued(us(t), None);
            h.on_post(us(t + 5));
        }
        // Local ACK Timeout 5: 4.096 µs × 2^5 ≈ 131 µs.
        h.on_ack_queued(us(40), Some(Duration::from_nanos(131_072)));
        assert_eq!(h.deadline(), Some(us(40).saturating_add(Duration::from_nanos(32_768))));
    }

    #[test]
    fn a_slow_reply_breaks_the_streak() {
        let mut h = AckHold::default();
        h.on_ack_queued(us(0), None);
        h.on_post(us(5));
        h.on_ack_queued(us(100), None);
        h.on_post(us(100).saturating_add(HOLD + Duration::from_micros(1)));
        h.on_ack_queued(us(300), None);
        h.on_post(us(305));
        h.on_ack_queued(us(400), None);
        assert!(!h.holding(us(401)), "quick, slow, quick: no streak of two");
        h.on_post(us(405));
        h.on_ack_queued(us(500), None);
        assert!(h.holding(us(501)));
    }

    #[test]
    fn a_second_request_during_a_hold_is_a_stream() {
        let mut h = AckHold::default();
        for t in [0, 20] {
            h.on_ack_queued(us(t), None);
            h.on_post(us(t + 5));
        }
        h.on_request();
        h.on_ack_queued(us(40), None);
        assert!(h.holding(us(41)));
        h.on_request();
        assert!(!h.holding(us(42)), "released at once");
        h.on_ack_queued(us(42), None);
        assert!(!h.holding(us(43)), "and no more holding");
    }

    #[test]
    fn a_hold_that_runs_out_ends_the_ping_pong_and_a_released_one_does_not() {
        let mut h = AckHold::default();
        for t in [0, 20] {
            h.on_ack_queued(us(t), None);
            h.on_post(us(t + 5));
        }
        h.on_ack_queued(us(40), None);
        h.on_post(us(42));
        h.on_request_sent();
        assert!(h.released());
        h.end(us(43));
        h.on_request();
        h.on_ack_queued(us(60), None);
        assert!(h.holding(us(61)), "released by a reply: still a ping-pong");
        h.end(us(60).saturating_add(HOLD));
        h.on_ack_queued(us(200), None);
        assert!(!h.holding(us(201)), "ran out: no more holding");
    }
}
