//! The encoded timers and sizes the transport negotiates: the RNR NAK timer
//! (IBTA §9.7.5.2.8, Table 45), the local ACK timeout (§11.2.4.2 / C9-140)
//! and the path MTU (§8.3, `ibv_mtu`).

use core::time::Duration;

/// The 5-bit RNR NAK timer code: how long a requester waits before retrying
/// after an RNR NAK (also the QP's `min_rnr_timer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RnrTimer(u8);

impl RnrTimer {
    /// Timer values in microseconds, by code. Code 0 is the longest (655.36 ms).
    const MICROS: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];

    /// A timer from the low 5 bits of `code`.
    pub const fn from_code(code: u8) -> Self {
        Self(code & 0x1f)
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The delay the code stands for.
    pub const fn duration(self) -> Duration {
        Duration::from_micros(Self::MICROS[self.0 as usize] as u64)
    }
}

/// The local ACK timeout exponent `n` of `ibv_qp_attr.timeout`:
/// 4.096 µs × 2^n, with 0 meaning "wait forever".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LocalAckTimeout(u8);

impl LocalAckTimeout {
    /// Largest defined exponent.
    pub const MAX: u8 = 31;

    /// A timeout from its exponent, or `None` if above 31.
    pub const fn new(exp: u8) -> Option<Self> {
        if exp > Self::MAX { None } else { Some(Self(exp)) }
    }

    /// A timeout from its exponent, clamped to 31.
    pub const fn saturating(exp: u8) -> Self {
        Self(if exp > Self::MAX { Self::MAX } else { exp })
    }

    /// The exponent.
    pub const fn exponent(self) -> u8 {
        self.0
    }

    /// The timeout, or `None` for exponent 0 (infinite).
    pub const fn duration(self) -> Option<Duration> {
        if self.0 == 0 { None } else { Some(Duration::from_nanos(4096u64 << self.0)) }
    }
}

/// Path MTU as `ibv_mtu` encodes it (1 = 256 … 5 = 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Every MTU, ascending.
    pub const ALL: [Self; 5] =
        [Self::Mtu256, Self::Mtu512, Self::Mtu1024, Self::Mtu2048, Self::Mtu4096];

    /// From the `ibv_mtu` enum value.
    pub const fn from_ibv(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Mtu256),
            2 => Some(Self::Mtu512),
            3 => Some(Self::Mtu1024),
            4 => Some(Self::Mtu2048),
            5 => Some(Self::Mtu4096),
            _ => None,
        }
    }

    /// From a size in bytes (exact powers only).
    pub const fn from_bytes(n: usize) -> Option<Self> {
        match n {
            256 => Some(Self::Mtu256),
            512 => Some(Self::Mtu512),
            1024 => Some(Self::Mtu1024),
            2048 => Some(Self::Mtu2048),
            4096 => Some(Self::Mtu4096),
            _ => None,
        }
    }

    /// The largest MTU whose packets (payload plus RoCEv2 overhead) fit in
    /// an IP link MTU of `link_mtu` bytes, as rxe's `eth_mtu_int_to_enum`
    /// does after subtracting its headers.
    pub const fn for_link_mtu(link_mtu: usize, ip_overhead: usize) -> Option<Self> {
        let avail = link_mtu.saturating_sub(ip_overhead);
        let mut i = Self::ALL.len();
        while i > 0 {
            i -= 1;
            if Self::ALL[i].bytes() <= avail {
                return Some(Self::ALL[i]);
            }
        }
        None
    }

    /// The `ibv_mtu` value.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// Payload bytes per packet.
    pub const fn bytes(self) -> usize {
        128 << (self as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rnr_table() {
        assert_eq!(RnrTimer::from_code(0).duration(), Duration::from_micros(655_360));
        assert_eq!(RnrTimer::from_code(1).duration(), Duration::from_micros(10));
        assert_eq!(RnrTimer::from_code(24).duration(), Duration::from_micros(40_960));
        assert_eq!(RnrTimer::from_code(31).duration(), Duration::from_micros(491_520));
        // Monotonic from code 1 up.
        for c in 2..32 {
            assert!(RnrTimer::from_code(c).duration() > RnrTimer::from_code(c - 1).duration());
        }
    }

    #[test]
    fn local_ack_timeout() {
        assert_eq!(LocalAckTimeout::new(0).unwrap().duration(), None);
        assert_eq!(LocalAckTimeout::new(1).unwrap().duration(), Some(Duration::from_nanos(8192)));
        // timeout 14 (perftest's default) = 4.096 µs × 16384 ≈ 67.1 ms.
        assert_eq!(
            LocalAckTimeout::new(14).unwrap().duration(),
            Some(Duration::from_nanos(67_108_864))
        );
        assert_eq!(
            LocalAckTimeout::new(31).unwrap().duration(),
            Some(Duration::from_nanos(4096 << 31))
        );
        assert!(LocalAckTimeout::new(32).is_none());
    }

    #[test]
    fn mtu() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_ibv(3), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_ibv(6), None);
        assert_eq!(Mtu::for_link_mtu(1500, 20 + 8 + 12 + 4 + 28), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_link_mtu(9000, 72), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_link_mtu(65536, 72), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_link_mtu(200, 72), None);
    }
}
