//! IPv4 header (RFC 791), for the raw backends, for captures, and to rebuild
//! the header the ICRC covers when only a UDP socket's view is available.

use core::net::Ipv4Addr;

use crate::checksum;
use crate::field::{be16, set_be16};
use crate::{Result, WireError};

/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;

/// A checked view over an IPv4 packet.
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps an IPv4 packet after checking version, IHL and total length
    /// against the buffer (trailing bytes such as Ethernet padding are
    /// allowed and excluded from [`Ipv4Packet::payload`]).
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::BadVersion`],
    /// [`WireError::BadLength`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < IPV4_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if b[0] >> 4 != 4 {
            return Err(WireError::BadVersion);
        }
        let ihl = usize::from(b[0] & 0xf) * 4;
        let total = usize::from(be16(b, 2));
        if ihl < IPV4_HEADER_LEN || total < ihl {
            return Err(WireError::BadLength);
        }
        if b.len() < total {
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
    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[0] & 0xf) * 4
    }
    /// DSCP and ECN byte.
    pub fn tos(&self) -> u8 {
        self.b()[1]
    }
    /// Total length.
    pub fn total_len(&self) -> usize {
        usize::from(be16(self.b(), 2))
    }
    /// Identification.
    pub fn ident(&self) -> u16 {
        be16(self.b(), 4)
    }
    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        self.b()[6] & 0x40 != 0
    }
    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        self.b()[6] & 0x20 != 0
    }
    /// Fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        be16(self.b(), 6) & 0x1fff
    }
    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.b()[8]
    }
    /// Protocol.
    pub fn protocol(&self) -> u8 {
        self.b()[9]
    }
    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.b(), 10)
    }
    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        let b = self.b();
        Ipv4Addr::new(b[12], b[13], b[14], b[15])
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        let b = self.b();
        Ipv4Addr::new(b[16], b[17], b[18], b[19])
    }
    /// Whether the header checksum verifies.
    pub fn checksum_ok(&self) -> bool {
        checksum::checksum(&self.b()[..self.header_len()]) == 0
    }
    /// The fixed 20-byte header (what the RoCEv2 ICRC covers; options are
    /// not covered, as in rxe).
    pub fn fixed_header(&self) -> &[u8] {
        &self.b()[..IPV4_HEADER_LEN]
    }
    /// The payload, as bounded by the total length.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..self.total_len()]
    }
}

/// IPv4 header fields (no options), for emission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// DSCP/ECN.
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't fragment (RoCEv2 senders set it).
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// Protocol.
    pub protocol: u8,
    /// Payload length.
    pub payload_len: usize,
}

impl Ipv4Repr {
    /// Writes the 20-byte header with a correct checksum.
    ///
    /// # Errors
    /// [`WireError::BufferTooSmall`], or [`WireError::BadLength`] if the
    /// total length exceeds 65535.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if buf.len() < IPV4_HEADER_LEN {
            return Err(WireError::BufferTooSmall);
        }
        let total =
            u16::try_from(IPV4_HEADER_LEN + self.payload_len).map_err(|_| WireError::BadLength)?;
        let h = &mut buf[..IPV4_HEADER_LEN];
        h[0] = 0x45;
        h[1] = self.tos;
        set_be16(h, 2, total);
        set_be16(h, 4, self.ident);
        set_be16(h, 6, if self.dont_frag { 0x4000 } else { 0 });
        h[8] = self.ttl;
        h[9] = self.protocol;
        set_be16(h, 10, 0);
        h[12..16].copy_from_slice(&self.src.octets());
        h[16..20].copy_from_slice(&self.dst.octets());
        let c = checksum::checksum(h);
        set_be16(h, 10, c);
        Ok(IPV4_HEADER_LEN)
    }

    /// The header as an array.
    ///
    /// # Errors
    /// As `emit`: [`WireError::BadLength`] for an oversize payload length.
    pub fn to_bytes(&self) -> Result<[u8; IPV4_HEADER_LEN]> {
        let mut h = [0u8; IPV4_HEADER_LEN];
        self.emit(&mut h)?;
        Ok(h)
    }
}
