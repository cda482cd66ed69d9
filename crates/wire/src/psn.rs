//! 24-bit packet sequence numbers (IBTA §9.7.1).
//!
//! PSNs wrap at 2^24. Ordering is only meaningful within half the space: `a`
//! is before `b` when `b - a (mod 2^24)` is in `1..2^23`, which is how rxe's
//! `psn_compare` and the spec's valid/invalid regions (§9.7.5.1.1) treat it.

use core::cmp::Ordering;
use core::fmt;

/// A packet sequence number: always in `0..2^24`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    /// Mask of the 24 significant bits.
    pub const MASK: u32 = Self::MODULUS - 1;
    /// Half the space: the widest window in which ordering is defined.
    pub const HALF: u32 = 1 << 23;

    /// A PSN from the low 24 bits of `v` (the high bits are dropped).
    #[inline]
    pub const fn new(v: u32) -> Self {
        Self(v & Self::MASK)
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[inline]
    #[allow(clippy::should_implement_trait)]
    pub const fn add(self, n: u32) -> Self {
        Self::new(self.0.wrapping_add(n))
    }

    /// `self - n` modulo 2^24.
    #[inline]
    #[allow(clippy::should_implement_trait)]
    pub const fn sub(self, n: u32) -> Self {
        Self::new(self.0.wrapping_sub(n))
    }

    /// The next PSN.
    #[inline]
    pub const fn next(self) -> Self {
        self.add(1)
    }

    /// Forward distance from `from` to `self`, modulo 2^24 (0..2^24).
    #[inline]
    pub const fn distance_from(self, from: Self) -> u32 {
        self.0.wrapping_sub(from.0) & Self::MASK
    }

    /// Signed difference `self - other` in `-2^23..2^23` (rxe `psn_compare`).
    #[inline]
    pub const fn diff(self, other: Self) -> i32 {
        // Shift the 24-bit difference into the top of an i32 so that its sign
        // bit is bit 23 of the difference, then shift back arithmetically.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Whether `self` comes before `other` (within half the space).
    #[inline]
    pub const fn is_before(self, other: Self) -> bool {
        self.diff(other) < 0
    }

    /// Whether `self` comes after `other` (within half the space).
    #[inline]
    pub const fn is_after(self, other: Self) -> bool {
        self.diff(other) > 0
    }

    /// Whether `self` lies in the window of `len` PSNs starting at `start`,
    /// i.e. in `start, start+1, …, start+len-1` modulo 2^24.
    #[inline]
    pub const fn in_window(self, start: Self, len: u32) -> bool {
        self.distance_from(start) < len
    }

    /// Ordering within half the space; use instead of `Ord`, which PSNs
    /// cannot implement consistently.
    #[inline]
    pub const fn compare(self, other: Self) -> Ordering {
        let d = self.diff(other);
        if d < 0 {
            Ordering::Less
        } else if d > 0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> Self {
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        let p = Psn::new(0xff_ffff);
        assert_eq!(p.next(), Psn::new(0));
        assert!(p.is_before(Psn::new(0)));
        assert!(Psn::new(3).is_after(p));
        assert_eq!(Psn::new(2).distance_from(p), 3);
        assert_eq!(Psn::new(2).diff(p), 3);
        assert_eq!(p.diff(Psn::new(2)), -3);
        assert!(Psn::new(1).in_window(p, 3));
        assert!(!Psn::new(2).in_window(p, 3));
        assert_eq!(Psn::new(0x1_000_005).value(), 5);
    }

    #[test]
    fn half_space_boundary() {
        let a = Psn::new(0);
        assert!(Psn::new(Psn::HALF - 1).is_after(a));
        // Exactly half way is "before" (negative), as in rxe.
        assert!(Psn::new(Psn::HALF).is_before(a));
    }
}
