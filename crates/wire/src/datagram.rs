//! A RoCEv2 packet together with the IP and UDP headers around it, as a raw
//! backend or a capture sees it.

use core::net::IpAddr;

use crate::icrc::{self, IcrcIp};
use crate::ipv4::{IPPROTO_UDP, Ipv4Packet};
use crate::ipv6::Ipv6Packet;
use crate::udp::{UDP_HEADER_LEN, UdpPacket};
use crate::{Result, RocePacket, WireError};

/// The IP header of a datagram.
#[derive(Debug, Clone, Copy)]
pub enum IpHeader<'a> {
    /// IPv4.
    V4(Ipv4Packet<&'a [u8]>),
    /// IPv6.
    V6(Ipv6Packet<&'a [u8]>),
}

impl<'a> IpHeader<'a> {
    /// Source address.
    pub fn src(&self) -> IpAddr {
        match self {
            Self::V4(p) => IpAddr::V4(p.src()),
            Self::V6(p) => IpAddr::V6(p.src()),
        }
    }
    /// Destination address.
    pub fn dst(&self) -> IpAddr {
        match self {
            Self::V4(p) => IpAddr::V4(p.dst()),
            Self::V6(p) => IpAddr::V6(p.dst()),
        }
    }
}

/// A UDP datagram inside IPv4 or IPv6, parsed from the IP header on.
#[derive(Debug, Clone, Copy)]
pub struct UdpDatagram<'a> {
    /// The IP header.
    pub ip: IpHeader<'a>,
    /// The UDP datagram (header and payload).
    pub udp: UdpPacket<&'a [u8]>,
    icrc_ip: IcrcIp<'a>,
    udp_header: &'a [u8; UDP_HEADER_LEN],
}

impl<'a> UdpDatagram<'a> {
    /// Parses an IP packet carrying UDP.
    ///
    /// # Errors
    /// Any framing error; [`WireError::UnsupportedProtocol`] if it is not
    /// UDP; [`WireError::Fragmented`] for an IPv4 fragment. The IPv4 header
    /// checksum is *not* required to be valid here (captures made on the
    /// sending host carry offloaded checksums): see
    /// [`Ipv4Packet::checksum_ok`].
    pub fn parse(ip: &'a [u8]) -> Result<Self> {
        match ip.first().map(|b| b >> 4) {
            Some(4) => {
                let p = Ipv4Packet::new_checked(ip)?;
                if p.protocol() != IPPROTO_UDP {
                    return Err(WireError::UnsupportedProtocol);
                }
                if p.more_frags() || p.frag_offset() != 0 {
                    return Err(WireError::Fragmented);
                }
                let hl = p.header_len();
                let udp = UdpPacket::new_checked(&ip[hl..p.total_len()])?;
                Self::assemble(IpHeader::V4(p), ip, udp)
            }
            Some(6) => {
                let p = Ipv6Packet::new_checked(ip)?;
                if p.next_header() != IPPROTO_UDP {
                    return Err(WireError::UnsupportedProtocol);
                }
                let udp = UdpPacket::new_checked(&ip[40..40 + p.payload_len()])?;
                Self::assemble(IpHeader::V6(p), ip, udp)
            }
            Some(_) => Err(WireError::BadVersion),
            None => Err(WireError::Truncated),
        }
    }

    fn assemble(ip: IpHeader<'a>, raw: &'a [u8], udp: UdpPacket<&'a [u8]>) -> Result<Self> {
        let icrc_ip = IcrcIp::from_header(raw)?;
        let udp_header = udp.into_inner().first_chunk().ok_or(WireError::Truncated)?;
        Ok(Self { ip, udp, icrc_ip, udp_header })
    }

    /// The IP header as the ICRC covers it.
    pub fn icrc_ip(&self) -> IcrcIp<'a> {
        self.icrc_ip
    }

    /// The UDP payload as a RoCEv2 packet.
    ///
    /// # Errors
    /// As [`RocePacket::new_checked`].
    pub fn roce(&self) -> Result<RocePacket<&'a [u8]>> {
        let udp = self.udp.into_inner();
        let len = self.udp.len();
        RocePacket::new_checked(&udp[UDP_HEADER_LEN..len])
    }

    /// The UDP header bytes.
    pub fn udp_header(&self) -> &'a [u8; UDP_HEADER_LEN] {
        self.udp_header
    }

    /// The ICRC this datagram's RoCE packet should carry.
    ///
    /// # Errors
    /// As [`UdpDatagram::roce`].
    pub fn expected_icrc(&self) -> Result<u32> {
        let p = self.roce()?;
        Ok(icrc::compute(self.icrc_ip, self.udp_header, p.covered()))
    }

    /// Checks the ICRC of the RoCE packet inside.
    ///
    /// # Errors
    /// As [`UdpDatagram::roce`], or [`WireError::IcrcMismatch`].
    pub fn verify_icrc(&self) -> Result<RocePacket<&'a [u8]>> {
        let p = self.roce()?;
        icrc::verify(self.icrc_ip, self.udp_header, &p)?;
        Ok(p)
    }
}
