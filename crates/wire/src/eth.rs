//! Ethernet II framing with optional 802.1Q / 802.1ad tags, for the raw
//! backends (AF_XDP, DPDK) and for reading captures.

use crate::field::{be16, set_be16};
use crate::{Result, WireError};

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// EtherType of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// EtherType of an 802.1ad service tag.
pub const ETHERTYPE_QINQ: u16 = 0x88a8;
/// Ethernet header length without tags.
pub const ETH_HEADER_LEN: usize = 14;

/// A checked view over an Ethernet frame (no FCS).
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
    /// Offset of the final EtherType field (12 without tags, +4 per tag).
    type_at: usize,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a frame, skipping up to two VLAN tags.
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the header or a tag is cut short.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        let mut at = 12;
        for _ in 0..3 {
            if b.len() < at + 2 {
                return Err(WireError::Truncated);
            }
            match be16(b, at) {
                ETHERTYPE_VLAN | ETHERTYPE_QINQ => at += 4,
                _ => return Ok(Self { buffer, type_at: at }),
            }
        }
        Err(WireError::UnsupportedProtocol)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination MAC.
    pub fn dst(&self) -> [u8; 6] {
        let mut m = [0; 6];
        m.copy_from_slice(&self.buffer.as_ref()[0..6]);
        m
    }
    /// Source MAC.
    pub fn src(&self) -> [u8; 6] {
        let mut m = [0; 6];
        m.copy_from_slice(&self.buffer.as_ref()[6..12]);
        m
    }
    /// The outermost VLAN TCI, if tagged.
    pub fn vlan_tci(&self) -> Option<u16> {
        (self.type_at > 12).then(|| be16(self.buffer.as_ref(), 14))
    }
    /// The EtherType of the payload (after any tags).
    pub fn ethertype(&self) -> u16 {
        be16(self.buffer.as_ref(), self.type_at)
    }
    /// Header length including tags.
    pub fn header_len(&self) -> usize {
        self.type_at + 2
    }
    /// The payload (may include Ethernet padding after an IP packet).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.type_at + 2..]
    }
}

/// Ethernet header fields, for emission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// 802.1Q tag control information, if tagged.
    pub vlan_tci: Option<u16>,
    /// Payload EtherType.
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Header length (14, or 18 with a tag).
    pub const fn header_len(&self) -> usize {
        if self.vlan_tci.is_some() { 18 } else { 14 }
    }

    /// Writes the header; returns its length.
    ///
    /// # Errors
    /// [`WireError::BufferTooSmall`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let n = self.header_len();
        if buf.len() < n {
            return Err(WireError::BufferTooSmall);
        }
        buf[0..6].copy_from_slice(&self.dst);
        buf[6..12].copy_from_slice(&self.src);
        let mut at = 12;
        if let Some(tci) = self.vlan_tci {
            set_be16(buf, 12, ETHERTYPE_VLAN);
            set_be16(buf, 14, tci);
            at = 16;
        }
        set_be16(buf, at, self.ethertype);
        Ok(n)
    }
}
