//! IPv6 fixed header (RFC 8200). Extension headers are not followed: RoCEv2
//! packets carry UDP directly after the fixed header.

use core::net::Ipv6Addr;

use crate::field::{be16, be32, set_be16, set_be32};
use crate::{Result, WireError};

/// Length of the IPv6 fixed header.
pub const IPV6_HEADER_LEN: usize = 40;

/// A checked view over an IPv6 packet.
#[derive(Debug, Clone, Copy)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps an IPv6 packet after checking version and payload length.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::BadVersion`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < IPV6_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if b[0] >> 4 != 6 {
            return Err(WireError::BadVersion);
        }
        if b.len() < IPV6_HEADER_LEN + usize::from(be16(b, 4)) {
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
    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        ((be32(self.b(), 0) >> 20) & 0xff) as u8
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        be32(self.b(), 0) & 0xf_ffff
    }
    /// Payload length.
    pub fn payload_len(&self) -> usize {
        usize::from(be16(self.b(), 4))
    }
    /// Next header.
    pub fn next_header(&self) -> u8 {
        self.b()[6]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.b()[7]
    }
    /// Source address.
    pub fn src(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[8..24]);
        Ipv6Addr::from(a)
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[24..40]);
        Ipv6Addr::from(a)
    }
    /// The fixed header.
    pub fn header(&self) -> &[u8] {
        &self.b()[..IPV6_HEADER_LEN]
    }
    /// The payload, as bounded by the payload length.
    pub fn payload(&self) -> &[u8] {
        &self.b()[IPV6_HEADER_LEN..IPV6_HEADER_LEN + self.payload_len()]
    }
}

/// IPv6 fixed header fields, for emission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload length.
    pub payload_len: usize,
}

impl Ipv6Repr {
    /// Writes the 40-byte header.
    ///
    /// # Errors
    /// [`WireError::BufferTooSmall`], or [`WireError::BadLength`] if the
    /// payload exceeds 65535 bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if buf.len() < IPV6_HEADER_LEN {
            return Err(WireError::BufferTooSmall);
        }
        let len = u16::try_from(self.payload_len).map_err(|_| WireError::BadLength)?;
        let h = &mut buf[..IPV6_HEADER_LEN];
        set_be32(
            h,
            0,
            (6 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0xf_ffff),
        );
        set_be16(h, 4, len);
        h[6] = self.next_header;
        h[7] = self.hop_limit;
        h[8..24].copy_from_slice(&self.src.octets());
        h[24..40].copy_from_slice(&self.dst.octets());
        Ok(IPV6_HEADER_LEN)
    }

    /// The header as an array.
    ///
    /// # Errors
    /// As `emit`: [`WireError::BadLength`] for an oversize payload length.
    pub fn to_bytes(&self) -> Result<[u8; IPV6_HEADER_LEN]> {
        let mut h = [0u8; IPV6_HEADER_LEN];
        self.emit(&mut h)?;
        Ok(h)
    }
}
