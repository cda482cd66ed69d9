//! UDP header (RFC 768) and the RoCEv2 port conventions.

use crate::field::{be16, set_be16};
use crate::{Result, WireError};

/// UDP header length.
pub const UDP_HEADER_LEN: usize = 8;
/// The RoCEv2 destination port assigned by IANA.
pub const ROCE_V2_PORT: u16 = 4791;
/// The lowest source port RoCEv2 senders use (IBTA A17.5.1: 0xC000–0xFFFF).
pub const ROCE_V2_SPORT_MIN: u16 = 0xc000;

/// A checked view over a UDP datagram.
#[derive(Debug, Clone, Copy)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps a datagram after checking the length field against the buffer.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::BadLength`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < UDP_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let len = usize::from(be16(b, 4));
        if len < UDP_HEADER_LEN {
            return Err(WireError::BadLength);
        }
        if b.len() < len {
            return Err(WireError::Truncated);
        }
        Ok(Self { buffer })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.b(), 0)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.b(), 2)
    }
    /// Length field (header included).
    pub fn len(&self) -> usize {
        usize::from(be16(self.b(), 4))
    }
    /// Whether the datagram has no payload.
    pub fn is_empty(&self) -> bool {
        self.len() == UDP_HEADER_LEN
    }
    /// Checksum field (0 = none, as rxe sends).
    pub fn checksum(&self) -> u16 {
        be16(self.b(), 6)
    }
    /// The 8-byte header.
    pub fn header(&self) -> &[u8] {
        &self.b()[..UDP_HEADER_LEN]
    }
    /// The payload, as bounded by the length field.
    pub fn payload(&self) -> &[u8] {
        &self.b()[UDP_HEADER_LEN..self.len()]
    }
}

/// UDP header fields, for emission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload length.
    pub payload_len: usize,
    /// Checksum to write (rxe writes 0: "no checksum").
    pub checksum: u16,
}

impl UdpRepr {
    /// Writes the header.
    ///
    /// # Errors
    /// [`WireError::BufferTooSmall`], [`WireError::BadLength`] above 65535.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if buf.len() < UDP_HEADER_LEN {
            return Err(WireError::BufferTooSmall);
        }
        let len =
            u16::try_from(UDP_HEADER_LEN + self.payload_len).map_err(|_| WireError::BadLength)?;
        set_be16(buf, 0, self.src_port);
        set_be16(buf, 2, self.dst_port);
        set_be16(buf, 4, len);
        set_be16(buf, 6, self.checksum);
        Ok(UDP_HEADER_LEN)
    }

    /// The header as an array.
    ///
    /// # Errors
    /// As `emit`: [`WireError::BadLength`] for an oversize payload length.
    pub fn to_bytes(&self) -> Result<[u8; UDP_HEADER_LEN]> {
        let mut h = [0u8; UDP_HEADER_LEN];
        self.emit(&mut h)?;
        Ok(h)
    }
}

/// The RoCEv2 source port of a connected QP, from its flow label: the
/// 20-bit label folded into 14 bits, offset by 0xC000 (rdma-core and Linux
/// `rdma_flow_label_to_udp_sport`).
pub const fn udp_sport_from_flow_label(flow_label: u32) -> u16 {
    let fl = flow_label & 0xf_ffff;
    let low = (fl & 0x3fff) ^ (fl >> 14);
    (low as u16) | ROCE_V2_SPORT_MIN
}

/// The flow label Linux derives for a connection when none is given
/// (`rdma_calc_flow_label`): the product of the two QPNs, folded.
pub const fn flow_label_for_qps(local_qpn: u32, remote_qpn: u32) -> u32 {
    let mut v = (local_qpn as u64) * (remote_qpn as u64);
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xf_ffff) as u32
}

/// The source port rxe uses for an RC/UC QP: from the address vector's flow
/// label if it is non-zero, otherwise from the QP pair.
pub const fn rxe_connected_sport(flow_label: u32, local_qpn: u32, remote_qpn: u32) -> u16 {
    let fl = if flow_label != 0 { flow_label } else { flow_label_for_qps(local_qpn, remote_qpn) };
    udp_sport_from_flow_label(fl)
}

/// The source port rxe uses for a UD QP (and QP1): 0xC000 plus a 14-bit
/// multiplicative hash of the QPN (Linux `hash_32(qpn, 14)`).
pub const fn rxe_ud_sport(qpn: u32) -> u16 {
    const GOLDEN_RATIO_32: u32 = 0x61c8_8647;
    let h = qpn.wrapping_mul(GOLDEN_RATIO_32) >> (32 - 14);
    ROCE_V2_SPORT_MIN + (h as u16 & 0x3fff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rxe_ports_seen_in_captures() {
        // RC pingpong/perftest with equal QPNs on both sides.
        assert_eq!(rxe_connected_sport(0, 0x19, 0x19), 0xc271);
        assert_eq!(rxe_connected_sport(0, 0x11, 0x11), 0xc121);
        assert_eq!(rxe_connected_sport(0, 0x20, 0x20), 0xc400);
        // UD pingpong QPN 0x14 and the CM's QP1.
        assert_eq!(rxe_ud_sport(0x14), 0xe8ea);
        assert_eq!(rxe_ud_sport(1), 0xd872);
    }
}

/// The fixed IP header Linux puts in front of a RoCEv2 datagram sent from
/// an unconnected UDP socket with `IP_PMTUDISC_DO`: IPv4 with the given ID,
/// DF, TTL 64, TOS 0; IPv6 with class 0, flow label 0, hop limit 64. An
/// IPv4 address paired with an IPv6 one is taken in its mapped form. This
/// is what a receiver's ICRC check and a UD receive's GRH area assume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinuxIpHeader {
    /// 20 bytes.
    V4([u8; crate::ipv4::IPV4_HEADER_LEN]),
    /// 40 bytes.
    V6([u8; crate::ipv6::IPV6_HEADER_LEN]),
}

impl LinuxIpHeader {
    /// The header of a datagram from `src` to `dst` whose UDP part (header
    /// and payload) is `udp_len` bytes. A length no IP packet can carry
    /// gives an all-zero header (whose ICRC then matches nothing).
    pub fn new(src: core::net::IpAddr, dst: core::net::IpAddr, udp_len: usize, ident: u16) -> Self {
        use core::net::IpAddr;
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Self::V4(
                crate::ipv4::Ipv4Repr {
                    src: s,
                    dst: d,
                    tos: 0,
                    ident,
                    dont_frag: true,
                    ttl: 64,
                    protocol: crate::ipv4::IPPROTO_UDP,
                    payload_len: udp_len,
                }
                .to_bytes()
                .unwrap_or([0; crate::ipv4::IPV4_HEADER_LEN]),
            ),
            (s, d) => {
                let v6 = |a: IpAddr| match a {
                    IpAddr::V4(x) => x.to_ipv6_mapped(),
                    IpAddr::V6(x) => x,
                };
                Self::V6(
                    crate::ipv6::Ipv6Repr {
                        src: v6(s),
                        dst: v6(d),
                        traffic_class: 0,
                        flow_label: 0,
                        next_header: crate::ipv4::IPPROTO_UDP,
                        hop_limit: 64,
                        payload_len: udp_len,
                    }
                    .to_bytes()
                    .unwrap_or([0; crate::ipv6::IPV6_HEADER_LEN]),
                )
            }
        }
    }

    /// The header bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Self::V4(h) => h,
            Self::V6(h) => h,
        }
    }

    /// The header as the ICRC takes it.
    pub fn icrc(&self) -> crate::icrc::IcrcIp<'_> {
        match self {
            Self::V4(h) => crate::icrc::IcrcIp::V4(h),
            Self::V6(h) => crate::icrc::IcrcIp::V6(h),
        }
    }
}
