//! The simulated network: IP datagrams between addresses, each direction
//! with its own seeded faults, on a virtual clock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use std::net::IpAddr;
use std::time::Duration;
use uroce_transport::fastmap::FastMap;

use uroce_transport::Instant;
use uroce_wire::icrc;
use uroce_wire::udp::{LinuxIpHeader, UdpRepr};

use crate::SplitMix64;

/// Faults and timing of one direction of a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    /// Probability a datagram is lost.
    pub loss: f64,
    /// Probability a datagram is delivered twice.
    pub duplicate: f64,
    /// Probability a datagram is held back by `reorder_delay` (so later ones
    /// overtake it).
    pub reorder: f64,
    /// How long a reordered datagram is held back.
    pub reorder_delay: Duration,
    /// Probability one random bit of a datagram is flipped.
    pub corrupt: f64,
    /// One-way propagation delay.
    pub delay: Duration,
    /// Extra random delay, uniform in `[0, jitter)` (never reorders: the
    /// link keeps FIFO order apart from `reorder`).
    pub jitter: Duration,
    /// Link rate in bits per second (0: unlimited).
    pub bandwidth_bps: u64,
    /// The link is cut: everything is lost.
    pub down: bool,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(50),
            corrupt: 0.0,
            delay: Duration::from_micros(5),
            jitter: Duration::ZERO,
            bandwidth_bps: 0,
            down: false,
        }
    }
}

/// Delivery counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct NetStats {
    pub sent: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    pub delivered: u64,
}

struct InFlight {
    src: IpAddr,
    dst: IpAddr,
    bytes: Vec<u8>,
}

/// The network.
pub struct SimNet {
    rng: SplitMix64,
    default: LinkConfig,
    links: FastMap<(IpAddr, IpAddr), LinkConfig>,
    busy_until: FastMap<(IpAddr, IpAddr), u64>,
    /// Last scheduled arrival per direction, to keep jitter FIFO.
    last_arrival: FastMap<(IpAddr, IpAddr), u64>,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    flights: FastMap<u64, InFlight>,
    seq: u64,
    pcap: Option<uroce_pcap::Writer<Vec<u8>>>,
    /// Counters.
    pub stats: NetStats,
}

impl SimNet {
    /// A network where every direction uses `default` until configured.
    pub fn new(seed: u64, default: LinkConfig) -> Self {
        Self {
            rng: SplitMix64::new(seed),
            default,
            links: FastMap::default(),
            busy_until: FastMap::default(),
            last_arrival: FastMap::default(),
            queue: BinaryHeap::new(),
            flights: FastMap::default(),
            seq: 0,
            pcap: None,
            stats: NetStats::default(),
        }
    }

    /// Records every datagram put on the wire (after corruption) as raw IP
    /// frames; see [`SimNet::take_pcap`].
    pub fn capture(&mut self) {
        self.pcap = uroce_pcap::Writer::new(Vec::new(), uroce_pcap::linktype::RAW).ok();
    }

    /// The capture so far, as a pcap file.
    pub fn take_pcap(&mut self) -> Option<Vec<u8>> {
        self.pcap.take().and_then(|w| w.finish().ok())
    }

    /// Configures the direction `src → dst`.
    pub fn set_link(&mut self, src: IpAddr, dst: IpAddr, cfg: LinkConfig) {
        self.links.insert((src, dst), cfg);
    }

    /// The configuration of `src → dst`.
    pub fn link(&self, src: IpAddr, dst: IpAddr) -> LinkConfig {
        self.links.get(&(src, dst)).copied().unwrap_or(self.default)
    }

    /// Puts an IP datagram on the wire at `now`.
    pub fn send(&mut self, now: Instant, src: IpAddr, dst: IpAddr, mut bytes: Vec<u8>) {
        self.stats.sent += 1;
        let cfg = self.link(src, dst);
        if cfg.down || self.rng.chance(cfg.loss) {
            self.stats.lost += 1;
            return;
        }
        if self.rng.chance(cfg.corrupt) && !bytes.is_empty() {
            let bit = self.rng.below(bytes.len() as u64 * 8);
            bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
            self.stats.corrupted += 1;
        }
        if let Some(w) = self.pcap.as_mut() {
            let _ = w.write(now.as_nanos(), &bytes);
        }
        let key = (src, dst);
        let mut t = now.as_nanos();
        if let Some(ser) =
            (bytes.len() as u64 * 8).saturating_mul(1_000_000_000).checked_div(cfg.bandwidth_bps)
        {
            let start = t.max(self.busy_until.get(&key).copied().unwrap_or(0));
            t = start + ser;
            self.busy_until.insert(key, t);
        }
        t += cfg.delay.as_nanos() as u64;
        if !cfg.jitter.is_zero() {
            t += self.rng.below(cfg.jitter.as_nanos() as u64);
        }
        let last = self.last_arrival.get(&key).copied().unwrap_or(0);
        t = t.max(last);
        self.last_arrival.insert(key, t);
        let copies = if self.rng.chance(cfg.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for c in 0..copies {
            let mut at = t + c * 1000;
            if self.rng.chance(cfg.reorder) {
                self.stats.reordered += 1;
                at += cfg.reorder_delay.as_nanos() as u64;
            }
            self.seq += 1;
            self.queue.push(Reverse((at, self.seq)));
            self.flights.insert(self.seq, InFlight { src, dst, bytes: bytes.clone() });
        }
    }

    /// When the next datagram arrives.
    pub fn next_delivery(&self) -> Option<Instant> {
        self.queue.peek().map(|Reverse((t, _))| Instant::from_nanos(*t))
    }

    /// The next datagram due at or before `now`: `(src, dst, bytes)`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(IpAddr, IpAddr, Vec<u8>)> {
        let Reverse((t, seq)) = *self.queue.peek()?;
        if t > now.as_nanos() {
            return None;
        }
        self.queue.pop();
        let f = self.flights.remove(&seq)?;
        self.stats.delivered += 1;
        Some((f.src, f.dst, f.bytes))
    }

    /// Datagrams in flight.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }
}

/// Wraps a RoCEv2 packet (BTH..ICRC, ICRC field ignored) in IP and UDP as
/// a Linux sender would (IPv4 ID 0 with DF, TTL 64, UDP checksum 0) and
/// fills its ICRC.
pub fn encapsulate(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, roce: &[u8]) -> Vec<u8> {
    let udp_len = 8 + roce.len();
    let udp = UdpRepr { src_port: sport, dst_port: dport, payload_len: roce.len(), checksum: 0 };
    let ip = LinuxIpHeader::new(src, dst, udp_len, 0);
    let ip_len = ip.as_bytes().len();
    let mut out = Vec::with_capacity(ip_len + udp_len);
    out.extend_from_slice(ip.as_bytes());
    out.extend_from_slice(&udp.to_bytes().expect("datagram fits UDP"));
    out.extend_from_slice(roce);
    let n = out.len();
    let udp_hdr: [u8; 8] = out[ip_len..ip_len + 8].try_into().expect("8-byte UDP header");
    let c = icrc::compute(ip.icrc(), &udp_hdr, &out[ip_len + 8..n - 4]);
    out[n - 4..].copy_from_slice(&c.to_le_bytes());
    out
}
