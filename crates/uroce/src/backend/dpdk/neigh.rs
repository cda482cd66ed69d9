//! The DPDK backend's neighbour table: peers' MACs (learnt from ARP,
//! neighbour discovery and the frames that come), the questions asked and
//! not answered yet, and the frames that wait for an answer.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use uroce_wire::ndp::multicast_mac;

/// Frames waiting for their destination's MAC, all destinations together.
pub(super) const PENDING_MAX: usize = 256;
/// How often an unanswered question is repeated (while frames come).
pub(super) const ASK_RETRY: Duration = Duration::from_millis(100);
/// How long frames wait for an answer before they are dropped (the
/// kernel's neighbour entry fails after about as long).
pub(super) const GIVE_UP: Duration = Duration::from_secs(3);

#[derive(Debug, Default)]
pub(super) struct Neighbours {
    /// Known MACs (few: a linear search is fastest).
    known: Vec<(IpAddr, [u8; 6])>,
    /// Questions sent and not answered: when first and when last.
    asked: Vec<(IpAddr, Instant, Instant)>,
    /// Frames waiting for their destination's MAC (zero in the frame).
    pending: Vec<(IpAddr, Vec<u8>)>,
}

impl Neighbours {
    /// The MAC frames to `ip` go to: a group's Ethernet address, or a
    /// neighbour's if known.
    pub(super) fn lookup(&self, ip: IpAddr) -> Option<[u8; 6]> {
        if ip.is_multicast() {
            return Some(multicast_mac(ip));
        }
        self.known.iter().find(|(a, _)| *a == ip).map(|&(_, m)| m)
    }

    /// Records `ip` at `mac` and hands the frames that waited for it to
    /// `send` (their destination MAC filled in); how many.
    pub(super) fn learn(&mut self, ip: IpAddr, mac: [u8; 6], mut send: impl FnMut(&[u8])) -> usize {
        if ip.is_unspecified() || ip.is_multicast() || mac[0] & 1 != 0 || mac == [0; 6] {
            return 0;
        }
        match self.known.iter_mut().find(|(a, _)| *a == ip) {
            Some(e) if e.1 == mac => return 0,
            Some(e) => e.1 = mac,
            None => self.known.push((ip, mac)),
        }
        self.asked.retain(|(a, ..)| *a != ip);
        let mut sent = 0;
        self.pending.retain_mut(|(a, f)| {
            if *a != ip {
                return true;
            }
            f[..6].copy_from_slice(&mac);
            send(f);
            sent += 1;
            false
        });
        sent
    }

    /// Keeps `frame` until `ip` is resolved; false when too many wait.
    pub(super) fn wait(&mut self, ip: IpAddr, frame: &[u8]) -> bool {
        if self.pending.len() >= PENDING_MAX {
            return false;
        }
        self.pending.push((ip, frame.to_vec()));
        true
    }

    /// Whether to ask for `ip` now (not asked within [`ASK_RETRY`]).
    pub(super) fn due(&mut self, ip: IpAddr, now: Instant) -> bool {
        match self.asked.iter_mut().find(|(a, ..)| *a == ip) {
            Some((_, _, last)) if now.duration_since(*last) < ASK_RETRY => false,
            Some((_, _, last)) => {
                *last = now;
                true
            }
            None => {
                self.asked.push((ip, now, now));
                true
            }
        }
    }

    /// Drops the frames of destinations asked for [`GIVE_UP`] without an
    /// answer (and forgets the question); how many frames.
    pub(super) fn expire(&mut self, now: Instant) -> usize {
        let before = self.pending.len();
        let mut failed = Vec::new();
        self.asked.retain(|&(a, first, _)| {
            let keep = now.duration_since(first) < GIVE_UP;
            if !keep {
                failed.push(a);
            }
            keep
        });
        if !failed.is_empty() {
            self.pending.retain(|(a, _)| !failed.contains(a));
        }
        before - self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_wait_for_their_neighbour_and_give_up_in_time() {
        let mut n = Neighbours::default();
        let (a, b): (IpAddr, IpAddr) = ("fd31::1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        assert_eq!(n.lookup(a), None);
        assert_eq!(n.lookup("ff02::1:ff00:1".parse().unwrap()), Some([0x33, 0x33, 0xff, 0, 0, 1]));
        assert!(n.due(a, t0));
        assert!(!n.due(a, t0 + ASK_RETRY / 2), "asked just now");
        assert!(n.due(a, t0 + ASK_RETRY), "asked again");
        assert!(n.wait(a, &[0u8; 20]) && n.wait(b, &[0u8; 20]) && n.wait(a, &[1u8; 20]));
        let mut got = Vec::new();
        assert_eq!(n.learn(a, [2, 0, 0, 0, 0, 9], |f| got.push(f.to_vec())), 2);
        assert_eq!(got[0][..6], [2, 0, 0, 0, 0, 9]);
        assert_eq!(got[1][6], 1, "in order");
        assert_eq!(n.lookup(a), Some([2, 0, 0, 0, 0, 9]));
        assert_eq!(n.learn(a, [2, 0, 0, 0, 0, 9], |_| panic!("none wait")), 0);
        // No broadcast, group or zero MAC is learnt.
        n.learn(b, [0xff; 6], |_| {});
        n.learn(b, [0; 6], |_| {});
        assert_eq!(n.lookup(b), None);
        // b never answers: its frame goes after `GIVE_UP`.
        assert!(n.due(b, t0));
        assert_eq!(n.expire(t0 + GIVE_UP / 2), 0);
        assert_eq!(n.expire(t0 + GIVE_UP), 1);
        assert!(n.due(b, t0 + GIVE_UP), "asked anew later");
        for _ in 0..PENDING_MAX {
            assert!(n.wait(b, &[0u8; 14]));
        }
        assert!(!n.wait(b, &[0u8; 14]), "full");
    }
}
