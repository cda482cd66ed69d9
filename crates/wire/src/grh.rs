//! The 40-byte Global Route Header at the start of every UD receive buffer.
//!
//! InfiniBand delivers the packet's GRH; RoCEv2 has none, so providers put
//! the IP header there instead (Linux rxe, mlx5): for IPv6 the 40-byte IPv6
//! header as is (its layout matches the IB GRH), for IPv4 20 zero bytes
//! followed by the 20-byte IPv4 header. A consumer tells the two apart as
//! rdma-core's `ibv_init_ah_from_wc` does: IP version 6 in the first nibble
//! means IPv6 unless bytes 20..40 hold an IPv4 header (IHL 5) whose checksum
//! verifies.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::field::be32;
use crate::ipv4::IPV4_HEADER_LEN;
use crate::ipv6::IPV6_HEADER_LEN;
use crate::{GRH_LEN, Result, WireError};

/// Which network header a receive buffer's GRH area holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrhKind {
    /// An IPv4 header at bytes 20..40.
    Ipv4,
    /// An IPv6 (or IB GRH) header at bytes 0..40.
    Ipv6,
}

/// Fills a UD receive buffer's GRH area from the IPv4 header of the packet.
pub fn write_ipv4(grh: &mut [u8; GRH_LEN], ipv4: &[u8; IPV4_HEADER_LEN]) {
    grh[..20].fill(0);
    grh[20..].copy_from_slice(ipv4);
}

/// Fills a UD receive buffer's GRH area from the IPv6 header of the packet.
pub fn write_ipv6(grh: &mut [u8; GRH_LEN], ipv6: &[u8; IPV6_HEADER_LEN]) {
    grh.copy_from_slice(ipv6);
}

/// Decides what a GRH area holds, as rdma-core does.
///
/// # Errors
/// [`WireError::BadVersion`] if it holds neither.
pub fn kind(grh: &[u8; GRH_LEN]) -> Result<GrhKind> {
    let v6 = grh[0] >> 4 == 6;
    let ip4 = &grh[20..];
    if !v6 {
        return if ip4[0] >> 4 == 4 { Ok(GrhKind::Ipv4) } else { Err(WireError::BadVersion) };
    }
    if ip4[0] & 0x0f != 5 {
        return Ok(GrhKind::Ipv6);
    }
    if checksum::checksum(ip4) == 0 { Ok(GrhKind::Ipv4) } else { Ok(GrhKind::Ipv6) }
}

/// The fields of a GRH area that address handles are built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrhInfo {
    /// Which header it was.
    pub kind: GrhKind,
    /// Source address (the sender's GID, IPv4-mapped for IPv4).
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Traffic class (IPv4: the TOS byte).
    pub traffic_class: u8,
    /// Flow label (IPv4: 0).
    pub flow_label: u32,
    /// Hop limit (IPv4: TTL).
    pub hop_limit: u8,
}

impl GrhInfo {
    /// Reads a GRH area.
    ///
    /// # Errors
    /// As [`kind`].
    pub fn parse(grh: &[u8; GRH_LEN]) -> Result<Self> {
        match kind(grh)? {
            GrhKind::Ipv4 => {
                let h = &grh[20..];
                Ok(Self {
                    kind: GrhKind::Ipv4,
                    src: IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15])),
                    dst: IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19])),
                    traffic_class: h[1],
                    flow_label: 0,
                    hop_limit: h[8],
                })
            }
            GrhKind::Ipv6 => {
                let w = be32(grh, 0);
                let mut s = [0u8; 16];
                let mut d = [0u8; 16];
                s.copy_from_slice(&grh[8..24]);
                d.copy_from_slice(&grh[24..40]);
                Ok(Self {
                    kind: GrhKind::Ipv6,
                    src: IpAddr::V6(Ipv6Addr::from(s)),
                    dst: IpAddr::V6(Ipv6Addr::from(d)),
                    traffic_class: ((w >> 20) & 0xff) as u8,
                    flow_label: w & 0xf_ffff,
                    hop_limit: grh[7],
                })
            }
        }
    }
}

/// A GID for an IP address, as RoCEv2 GID tables hold them: IPv6 as is,
/// IPv4 mapped (`::ffff:a.b.c.d`).
pub fn gid_of(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipv4::Ipv4Repr;
    use crate::ipv6::Ipv6Repr;

    #[test]
    fn ipv4_round_trip() {
        let h = Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            tos: 0,
            ident: 7,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            payload_len: 100,
        }
        .to_bytes()
        .unwrap();
        let mut g = [0xaau8; GRH_LEN];
        write_ipv4(&mut g, &h);
        let i = GrhInfo::parse(&g).unwrap();
        assert_eq!(i.kind, GrhKind::Ipv4);
        assert_eq!(i.src, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(i.hop_limit, 64);
        assert_eq!(gid_of(i.src)[10..12], [0xff, 0xff]);
    }

    #[test]
    fn ipv6_round_trip() {
        let h = Ipv6Repr {
            src: "fe80::1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
            traffic_class: 3,
            flow_label: 0x12345,
            next_header: 17,
            hop_limit: 64,
            payload_len: 100,
        }
        .to_bytes()
        .unwrap();
        let mut g = [0u8; GRH_LEN];
        write_ipv6(&mut g, &h);
        let i = GrhInfo::parse(&g).unwrap();
        assert_eq!(i.kind, GrhKind::Ipv6);
        assert_eq!(i.flow_label, 0x12345);
        assert_eq!(i.traffic_class, 3);
        assert_eq!(i.dst, "fe80::2".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn garbage_is_an_error() {
        assert_eq!(kind(&[0u8; GRH_LEN]), Err(WireError::BadVersion));
    }
}
