//! ARP for IPv4 over Ethernet (RFC 826): what a backend that owns its
//! port outright (DPDK) needs to answer for its address and to learn its
//! peers' MACs, with no kernel to do either.

use core::net::Ipv4Addr;

use crate::field::{be16, set_be16};
use crate::{Result, WireError};

/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// Length of an Ethernet/IPv4 ARP packet.
pub const ARP_LEN: usize = 28;

/// What an ARP packet asks or tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOp {
    /// Who has `target_ip`? (1)
    Request,
    /// `sender_ip` is at `sender_mac`. (2)
    Reply,
}

/// An Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpRepr {
    /// Request or reply.
    pub op: ArpOp,
    /// The sender's MAC.
    pub sender_mac: [u8; 6],
    /// The sender's address.
    pub sender_ip: Ipv4Addr,
    /// The target's MAC (zero in a request).
    pub target_mac: [u8; 6],
    /// The address asked about (request) or answered to (reply).
    pub target_ip: Ipv4Addr,
}

fn mac_at(b: &[u8], at: usize) -> [u8; 6] {
    let mut m = [0; 6];
    m.copy_from_slice(&b[at..at + 6]);
    m
}

fn ip_at(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

impl ArpRepr {
    /// Reads the ARP packet at the start of `b` (an Ethernet frame's
    /// payload; padding after it is ignored).
    ///
    /// # Errors
    /// [`WireError::Truncated`] if shorter than 28 bytes;
    /// [`WireError::UnsupportedProtocol`] for another hardware or protocol
    /// type, or an operation other than request and reply.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < ARP_LEN {
            return Err(WireError::Truncated);
        }
        // Hardware Ethernet (1), protocol IPv4, lengths 6 and 4.
        if be16(b, 0) != 1 || be16(b, 2) != crate::eth::ETHERTYPE_IPV4 || b[4] != 6 || b[5] != 4 {
            return Err(WireError::UnsupportedProtocol);
        }
        let op = match be16(b, 6) {
            1 => ArpOp::Request,
            2 => ArpOp::Reply,
            _ => return Err(WireError::UnsupportedProtocol),
        };
        Ok(Self {
            op,
            sender_mac: mac_at(b, 8),
            sender_ip: ip_at(b, 14),
            target_mac: mac_at(b, 18),
            target_ip: ip_at(b, 24),
        })
    }

    /// Writes the packet; returns its length (28).
    ///
    /// # Errors
    /// [`WireError::BufferTooSmall`].
    pub fn emit(&self, b: &mut [u8]) -> Result<usize> {
        if b.len() < ARP_LEN {
            return Err(WireError::BufferTooSmall);
        }
        set_be16(b, 0, 1);
        set_be16(b, 2, crate::eth::ETHERTYPE_IPV4);
        b[4] = 6;
        b[5] = 4;
        set_be16(b, 6, if self.op == ArpOp::Request { 1 } else { 2 });
        b[8..14].copy_from_slice(&self.sender_mac);
        b[14..18].copy_from_slice(&self.sender_ip.octets());
        b[18..24].copy_from_slice(&self.target_mac);
        b[24..28].copy_from_slice(&self.target_ip.octets());
        Ok(ARP_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request as Linux sends it: who has 10.0.0.2? tell 10.0.0.1.
    const REQUEST: [u8; 28] =
        [0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2];

    #[test]
    fn a_request_parses_and_emits_back_the_same_bytes() {
        let r = ArpRepr::parse(&REQUEST).unwrap();
        assert_eq!(r.op, ArpOp::Request);
        assert_eq!(r.sender_mac, [2, 0, 0, 0, 0, 1]);
        assert_eq!(r.sender_ip, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(r.target_ip, Ipv4Addr::new(10, 0, 0, 2));
        let mut out = [0u8; 28];
        assert_eq!(r.emit(&mut out), Ok(28));
        assert_eq!(out, REQUEST);
    }

    #[test]
    fn short_or_foreign_packets_are_refused() {
        assert_eq!(ArpRepr::parse(&REQUEST[..27]), Err(WireError::Truncated));
        let mut other = REQUEST;
        other[1] = 6; // IEEE 802 hardware
        assert_eq!(ArpRepr::parse(&other), Err(WireError::UnsupportedProtocol));
        let mut op = REQUEST;
        op[7] = 3; // RARP
        assert_eq!(ArpRepr::parse(&op), Err(WireError::UnsupportedProtocol));
        assert_eq!(
            ArpRepr::parse(&REQUEST).unwrap().emit(&mut [0; 27]),
            Err(WireError::BufferTooSmall)
        );
    }
}
