//! The RoCEv2 invariant CRC (IBTA Annex A17.3.3), exactly as Linux rxe
//! computes it (`rxe_icrc.c`).
//!
//! CRC-32 (IEEE 802.3, reflected) over, in order:
//! 1. 8 bytes of 0xff standing for the InfiniBand LRH that RoCEv2 lacks;
//! 2. the IP header with its variant fields set to ones: IPv4 TOS, TTL and
//!    header checksum; IPv6 traffic class, flow label and hop limit;
//! 3. the UDP header with its checksum set to 0xffff;
//! 4. the BTH with byte 4 (FECN, BECN, reserved) set to 0xff;
//! 5. the remaining headers, the payload and the pad.
//!
//! The result is stored in the packet's last 4 bytes in little-endian order
//! (rxe writes the CPU-order `u32` on a little-endian host). Everything else
//! in the IPv4 header is covered, the identification field included, which is
//! why a receiver that sees only UDP payloads must know or recover the IP ID.

use crc32fast::Hasher;

use crate::ipv4::IPV4_HEADER_LEN;
use crate::ipv6::IPV6_HEADER_LEN;
use crate::udp::UDP_HEADER_LEN;
use crate::{BTH_LEN, Result, RocePacket, WireError};

/// CRC state after the 8 masked LRH bytes: `crc32(ff × 8)`. Starting from it
/// saves hashing them for every packet (checked in the tests).
const AFTER_LRH: u32 = 0x2144_df1c;

/// The IP header as the ICRC sees it.
#[derive(Debug, Clone, Copy)]
pub enum IcrcIp<'a> {
    /// The 20-byte IPv4 fixed header (options are not covered, as in rxe).
    V4(&'a [u8; IPV4_HEADER_LEN]),
    /// The 40-byte IPv6 fixed header.
    V6(&'a [u8; IPV6_HEADER_LEN]),
}

impl<'a> IcrcIp<'a> {
    /// From the first bytes of an IP header, by its version nibble.
    ///
    /// # Errors
    /// [`WireError::Truncated`] or [`WireError::BadVersion`].
    pub fn from_header(ip: &'a [u8]) -> Result<Self> {
        match ip.first().map(|b| b >> 4) {
            Some(4) => ip
                .get(..IPV4_HEADER_LEN)
                .and_then(|s| s.try_into().ok())
                .map(IcrcIp::V4)
                .ok_or(WireError::Truncated),
            Some(6) => ip
                .get(..IPV6_HEADER_LEN)
                .and_then(|s| s.try_into().ok())
                .map(IcrcIp::V6)
                .ok_or(WireError::Truncated),
            Some(_) => Err(WireError::BadVersion),
            None => Err(WireError::Truncated),
        }
    }
}

/// An incremental ICRC computation, for callers that assemble a packet from
/// pieces (a header template and a payload in registered memory).
#[derive(Clone)]
pub struct IcrcHasher(Hasher);

impl Default for IcrcHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl IcrcHasher {
    /// A hasher that has consumed the masked LRH.
    pub fn new() -> Self {
        Self(Hasher::new_with_initial(AFTER_LRH))
    }

    /// Consumes an IP header, masking its variant fields.
    pub fn ip(&mut self, ip: IcrcIp<'_>) {
        match ip {
            IcrcIp::V4(h) => {
                let mut m = *h;
                m[1] = 0xff; // TOS
                m[8] = 0xff; // TTL
                m[10] = 0xff; // header checksum
                m[11] = 0xff;
                self.0.update(&m);
            }
            IcrcIp::V6(h) => {
                let mut m = *h;
                m[0] |= 0x0f; // traffic class, low nibble of byte 0 …
                m[1] = 0xff; // … the rest of it, and the flow label
                m[2] = 0xff;
                m[3] = 0xff;
                m[7] = 0xff; // hop limit
                self.0.update(&m);
            }
        }
    }

    /// Consumes the UDP header with its checksum masked.
    pub fn udp(&mut self, udp: &[u8; UDP_HEADER_LEN]) {
        let mut m = *udp;
        m[6] = 0xff;
        m[7] = 0xff;
        self.0.update(&m);
    }

    /// Consumes the start of the transport packet: the BTH (byte 4 masked)
    /// and whatever follows it in `bytes`. `bytes` must begin with the BTH.
    pub fn bth_and_rest(&mut self, bytes: &[u8]) {
        if bytes.len() < BTH_LEN {
            self.0.update(bytes);
            return;
        }
        let mut bth = [0u8; BTH_LEN];
        bth.copy_from_slice(&bytes[..BTH_LEN]);
        bth[4] = 0xff;
        self.0.update(&bth);
        self.0.update(&bytes[BTH_LEN..]);
    }

    /// Consumes further bytes (headers after the BTH, payload, pad).
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The ICRC value (store with `to_le_bytes`).
    pub fn finish(self) -> u32 {
        self.0.finalize()
    }
}

/// The ICRC of a packet given its IP header, UDP header and the transport
/// bytes it covers (BTH through pad, no ICRC).
pub fn compute(ip: IcrcIp<'_>, udp: &[u8; UDP_HEADER_LEN], covered: &[u8]) -> u32 {
    if covered.len() >= BTH_LEN && covered.len() <= SMALL {
        return compute_small(ip, udp, covered);
    }
    let mut h = IcrcHasher::new();
    h.ip(ip);
    h.udp(udp);
    h.bth_and_rest(covered);
    h.finish()
}

/// Transport bytes up to which [`compute`] hashes one contiguous copy.
const SMALL: usize = 192;

/// [`compute`] for a small packet: the masked headers and the packet are
/// copied into one buffer and hashed in one call. The CRC's folding path
/// wants 64-byte blocks; five short updates (20, 8, 12 bytes, …) each took
/// its slow byte-wise tail, which cost more than the copy.
fn compute_small(ip: IcrcIp<'_>, udp: &[u8; UDP_HEADER_LEN], covered: &[u8]) -> u32 {
    let mut buf = [0u8; IPV6_HEADER_LEN + UDP_HEADER_LEN + SMALL];
    let ip_len = match ip {
        IcrcIp::V4(h) => {
            buf[..IPV4_HEADER_LEN].copy_from_slice(h);
            buf[1] = 0xff;
            buf[8] = 0xff;
            buf[10] = 0xff;
            buf[11] = 0xff;
            IPV4_HEADER_LEN
        }
        IcrcIp::V6(h) => {
            buf[..IPV6_HEADER_LEN].copy_from_slice(h);
            buf[0] |= 0x0f;
            buf[1] = 0xff;
            buf[2] = 0xff;
            buf[3] = 0xff;
            buf[7] = 0xff;
            IPV6_HEADER_LEN
        }
    };
    let u = ip_len;
    buf[u..u + UDP_HEADER_LEN].copy_from_slice(udp);
    buf[u + 6] = 0xff;
    buf[u + 7] = 0xff;
    let b = u + UDP_HEADER_LEN;
    let end = b + covered.len();
    buf[b..end].copy_from_slice(covered);
    buf[b + 4] = 0xff;
    let mut h = Hasher::new_with_initial(AFTER_LRH);
    h.update(&buf[..end]);
    h.finalize()
}

/// Checks a packet's ICRC.
///
/// # Errors
/// [`WireError::IcrcMismatch`].
pub fn verify<T: AsRef<[u8]>>(
    ip: IcrcIp<'_>,
    udp: &[u8; UDP_HEADER_LEN],
    packet: &RocePacket<T>,
) -> Result<()> {
    if compute(ip, udp, packet.covered()) == packet.icrc() {
        Ok(())
    } else {
        Err(WireError::IcrcMismatch)
    }
}

/// Computes and stores a packet's ICRC.
pub fn fill<T: AsRef<[u8]> + AsMut<[u8]>>(
    ip: IcrcIp<'_>,
    udp: &[u8; UDP_HEADER_LEN],
    packet: &mut RocePacket<T>,
) {
    let c = compute(ip, udp, packet.covered());
    packet.set_icrc(c);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_copy_path_matches_the_incremental_one() {
        let v4: [u8; IPV4_HEADER_LEN] = core::array::from_fn(|i| (i * 37 + 5) as u8);
        let v6: [u8; IPV6_HEADER_LEN] = core::array::from_fn(|i| (i * 11 + 3) as u8);
        let udp = [0x12, 0x34, 0x12, 0xb7, 0, 60, 0xab, 0xcd];
        let bytes: [u8; SMALL + 40] = core::array::from_fn(|i| (i * 73 + 1) as u8);
        for ip in [IcrcIp::V4(&v4), IcrcIp::V6(&v6)] {
            for len in 0..bytes.len() {
                let mut h = IcrcHasher::new();
                h.ip(ip);
                h.udp(&udp);
                h.bth_and_rest(&bytes[..len]);
                assert_eq!(compute(ip, &udp, &bytes[..len]), h.finish(), "length {len}");
            }
        }
    }

    #[test]
    fn lrh_constant() {
        let mut h = Hasher::new();
        h.update(&[0xff; 8]);
        assert_eq!(h.finalize(), AFTER_LRH);
        // Continuing from the constant equals hashing the bytes.
        let mut a = Hasher::new();
        a.update(&[0xff; 8]);
        a.update(b"roce");
        let mut b = Hasher::new_with_initial(AFTER_LRH);
        b.update(b"roce");
        assert_eq!(a.finalize(), b.finalize());
    }
}

/// Recovering an unknown IPv4 identification from a packet's ICRC.
///
/// A UDP socket does not see the IP header, and Linux rxe sends a non-zero,
/// per-packet IP ID that the ICRC covers. CRC is linear over equal-length
/// messages, so `icrc(ID = x) ⊕ icrc(ID = 0)` is a linear function `L(x)`
/// of the 16 ID bits alone (for a given packet length). A receiver computes
/// the ICRC with ID 0, XORs it with the wire value and solves `L(x) = δ`:
/// an intact packet always has exactly one solution (L is injective:
/// CRC-32 detects every error burst of up to 32 bits); a corrupted packet
/// has one only by chance, with probability 2^-16. Receivers that also
/// require the solved ID to be close to the previous one from that peer
/// (rxe increments it per packet) cut that further; see the udp backend.
pub mod ipv4_id {
    use super::{IcrcHasher, IcrcIp};
    use crate::ipv4::IPV4_HEADER_LEN;
    use crate::udp::UDP_HEADER_LEN;

    /// The linear map `L` for one packet length, in echelon form.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct IdSolver {
        /// Reduced basis vectors (CRC differences) with their pivot bit.
        rows: [(u32, u16); 16],
        len: usize,
    }

    impl IdSolver {
        /// Builds the solver for RoCE packets whose ICRC-covered part (BTH
        /// through pad) is `covered_len` bytes. Costs 17 CRCs of the packet
        /// length: cache it per length.
        pub fn new(covered_len: usize) -> Self {
            let ip = |id: u16| {
                let mut h = [0u8; IPV4_HEADER_LEN];
                h[0] = 0x45;
                h[4..6].copy_from_slice(&id.to_be_bytes());
                h
            };
            let zeros = [0u8; 256];
            let crc_with = |id: u16| {
                let mut hs = IcrcHasher::new();
                hs.ip(IcrcIp::V4(&ip(id)));
                hs.udp(&[0u8; UDP_HEADER_LEN]);
                let mut left = covered_len;
                while left > 0 {
                    let n = left.min(zeros.len());
                    hs.update(&zeros[..n]);
                    left -= n;
                }
                hs.finish()
            };
            let base = crc_with(0);
            let mut vecs = [(0u32, 0u16); 16];
            for (b, v) in vecs.iter_mut().enumerate() {
                *v = (crc_with(1 << b) ^ base, 1 << b);
            }
            // Gaussian elimination over GF(2) on the 32-bit vectors.
            let mut rows = [(0u32, 0u16); 16];
            let mut n = 0;
            for (mut v, mut combo) in vecs {
                for &(r, c) in &rows[..n] {
                    let pivot = 1u32 << (31 - r.leading_zeros());
                    if v & pivot != 0 {
                        v ^= r;
                        combo ^= c;
                    }
                }
                if v != 0 {
                    rows[n] = (v, combo);
                    n += 1;
                    // Keep rows sorted by pivot, highest first.
                    rows[..n].sort_unstable_by(|a, b| {
                        b.0.leading_zeros().cmp(&a.0.leading_zeros()).reverse()
                    });
                }
            }
            Self { rows, len: covered_len }
        }

        /// The covered length this solver is for.
        pub fn covered_len(&self) -> usize {
            self.len
        }

        /// The ID `x` with `L(x) = delta`, if any (`delta` = wire ICRC ⊕
        /// ICRC computed with ID 0).
        pub fn solve(&self, mut delta: u32) -> Option<u16> {
            let mut x = 0u16;
            for &(r, c) in &self.rows {
                if r == 0 {
                    continue;
                }
                let pivot = 1u32 << (31 - r.leading_zeros());
                if delta & pivot != 0 {
                    delta ^= r;
                    x ^= c;
                }
            }
            (delta == 0).then_some(x)
        }
    }
}
